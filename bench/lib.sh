# bench/lib.sh - what the benchmarks that train a random model share:
# sourced after they set $src (the source tree) and $build (the build
# folder); the model's shape is set before bench_llama.

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
