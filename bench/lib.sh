# bench/lib.sh - what the benchmarks share: sourced after they set $src
# (the source tree) and $build (the build folder); the model's shape is set
# before bench_llama, and $tmp, $steps, $batch, $seq, $warmup, $threads and
# a die function before bench_model_yaml and bench_against.

# bench_begin NAME: one BLAS thread per process (ranks share the cores, as
# the tests run), a scratch folder $tmp removed at exit; without mpiexec,
# "NAME: no mpiexec; skipped" and exit 0
bench_begin () {
	export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/hp-$1.XXXXXX") || exit 1
	trap 'rm -rf "$tmp"' EXIT INT TERM
	command -v mpiexec >/dev/null || { echo "$1: no mpiexec; skipped"; exit 0; }
}

# bench_yaml ITERS GLOBAL MICRO SEQ: to standard output, the config of a
# from_config run (random weights, seed 1) of $tmp/model on the records of
# $tmp/ids; the caller adds its checkpoint and other keys
bench_yaml () {
	cat <<YAML
model: {_target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_config, config_path: $tmp/model}
training: {train_iters: $1, global_batch_size: $2, micro_batch_size: $3, seed: 1}
dataset:
  _target_: hyper_parallel.data.build_indexed_text_dataset
  data_path: $tmp/ids
  data_config: {seq_length: $4, is_dataset_from_mr: true}
YAML
}

# bench_llama DIR: DIR/config.json of an untied float32 Llama shaped by
# $hidden, $inter, $layers, $heads (as many key/value heads) and $vocab, for
# from_config runs (random initialisation, no weights file)
bench_llama () {
	mkdir -p "$1" && cat >"$1/config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": $hidden,
 "intermediate_size": $inter, "num_hidden_layers": $layers, "num_attention_heads": $heads,
 "num_key_value_heads": $heads, "vocab_size": $vocab, "max_position_embeddings": 1024,
 "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "torch_dtype": "float32"}
JSON
}

# bench_ids PREFIX DOCS LEN: DOCS records of LEN random ids below $vocab
# (a fixed seed: the same ids every run), as the indexed dataset
# PREFIX.bin/PREFIX.idx (and their source, PREFIX.jsonl)
bench_ids () {
	awk -v V="$vocab" -v D="$2" -v n="$3" 'BEGIN { srand(7); for (d = 0; d < D; d++) { printf "{\"ids\":["
		for (i = 0; i < n; i++) printf "%s%d", i ? "," : "", int(rand() * V); print "]}" } }' >"$1.jsonl" &&
	"$build/bin/hp-test-tool" mkidx --vocab "$vocab" --records-of "$3" -o "$1" "$1.jsonl" >/dev/null
}

# bench_model PY SCRIPT YAML: the run of moe-bench.sh and family-bench.sh.
# $tmp/model/config.json written, PY SCRIPT make $tmp/model saves its
# weights when PY is not empty (hp-train loads them), else hp-train draws
# its own from the config; $tmp/ts holds the records of seq + 1 tokens;
# YAML the config (bench_model_yaml).  die on a failure.
bench_model () {
	if [ -n "$1" ]; then
		"$1" "$2" make "$tmp/model" 2>"$tmp/make.err" ||
			{ cat "$tmp/make.err" >&2; die "$(basename "$2") make failed"; }
		load="from_pretrained
  pretrained_model_name_or_path: $tmp/model"
	else
		load="from_config
  config_path: $tmp/model"
	fi
	"$build/bin/hp-test-tool" mkidx --vocab 512 --records-of $((seq + 1)) -o "$tmp/ts" \
		"$src/data/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" >/dev/null || die "mkidx failed"
	bench_model_yaml "$load" >"$3" || die "cannot write the config"
}

# bench_model_yaml LOAD: to standard output, the config of moe-bench.sh's
# and family-bench.sh's runs: the model by LOAD (from_pretrained or
# from_config and its path key), $steps steps of $batch x $seq records of
# $tmp/ts, AdamW as torch_llama.py's time_adamw, no checkpoint
bench_model_yaml () {
	cat <<YAML
model:
  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.$1
training: {train_iters: $steps, global_batch_size: $batch, micro_batch_size: $batch, max_grad_norm: 1.0, seed: 1}
checkpoint: {save_ckpt: false}
dataset:
  _target_: hyper_parallel.data.build_indexed_text_dataset
  data_path: $tmp/ts
  data_config: {seq_length: $seq, is_dataset_from_mr: true}
optimizer:
  _target_: hyper_parallel.components.optim.AdamW
  adamw_config: {adamw_lr: 1.0e-3, adamw_weight_decay: 0.1, adamw_betas: [0.9, 0.95]}
  no_decay_params: [norm, bias]
YAML
}

# bench_against PY SCRIPT YAML COLUMN NAME: the table of moe-bench.sh and
# family-bench.sh.  For each of $threads, hp-train on YAML and, when PY is not
# empty, PY SCRIPT train $tmp/model $tmp/ts THREADS $steps $batch $seq
# $warmup (one JSON line, torch_llama.py's time_adamw); one row each of
# threads, both tokens/s of the steps after $warmup (COLUMN heads the
# other's), their ratio and both first losses (NAME's second; "-" for a
# missing side); then the 1.5x target (not judged with $smoke 1) and $note;
# die on a failed run
bench_against () {
	[ "$smoke" = 1 ] && echo "smoke mode: tiny sizes, the numbers are not worth reading and no target is judged"
	printf '%-8s %12s %12s %8s  %s\n' threads "hp tok/s" "$4" ratio "first loss hp / $5"
	for t in $threads; do
		OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t HP_NUM_THREADS=$t "$build/bin/hp-train" -q "$3" \
			--metrics "$tmp/m$t.jsonl" || die "hp-train failed with $t thread(s)"
		hp=$(jq -s -r --argjson w "$warmup" 'sort_by(.step) | .[0].loss as $l | .[$w:] |
			"\((map(.tokens) | add) / (map(.step_time_s) | add)) \($l)"' "$tmp/m$t.jsonl") ||
			die "no timed steps in hp-train's metrics"
		th="- -"
		if [ -n "$1" ]; then
			OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t "$1" "$2" train "$tmp/model" "$tmp/ts" \
				"$t" "$steps" "$batch" "$seq" "$warmup" >"$tmp/t$t.json" 2>"$tmp/t$t.err" ||
				{ cat "$tmp/t$t.err" >&2; die "$(basename "$2") failed with $t thread(s)"; }
			th=$(jq -r '"\(.tokens_per_s) \(.first_loss)"' "$tmp/t$t.json") ||
				die "$(basename "$2") printed no result"
		fi
		# shellcheck disable=SC2086 # the four numbers
		echo $hp $th | awk -v t="$t" '{
			r = $3 == "-" ? "-" : sprintf("%.2fx", $1 / $3)
			printf "%-8s %12.0f %12s %8s  %.6f / %s\n", t, $1, $3 == "-" ? "-" : sprintf("%.0f", $3), r,
				$2, $4 == "-" ? "-" : sprintf("%.6f", $4) }'
	done
	if [ "$smoke" = 1 ]; then
		echo "target: >= 1.5x (not judged in smoke mode)"
	else
		echo "target: >= 1.5x"
	fi
	[ -z "$note" ] || echo "$note"
}
