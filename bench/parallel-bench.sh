#!/bin/sh
# bench/parallel-bench.sh - the seed's 8-rank layout against one process,
# in one run.
#
# A random Qwen3-MoE (hidden 256, 4 layers of 8 heads / 4 KV heads, 16
# experts top-4 of 128, vocab 8192) with the seed's kernels (fused norms,
# flash attention, grouped experts), micro-batches of 1 x 512 tokens, a
# global batch of 16 rows, 6 steps: hp-train as one process, each
# dimension alone on 2 ranks (TP 2 with sequence parallel, CP 2, EP 2), and
# the seed's TP2 x CP2 x EP2 with dp_shard 2 and edp_shard 2 on 8.  For
# each: the median step time of steps 2..6, tokens/s, the ratio to one
# process, and rank 0's share of the step spent waiting in collectives
# (metrics comm_wait_s).  On a 2-core machine every layout past 2 ranks
# oversubscribes the cores: this measures the overhead of the layout, not
# speed-up.  Then the cost of checking the seed's layout: its step time in
# validation mode (--model.validate_placement=true: rank 0 runs the whole
# model alongside and every module output is compared), and hp-verify's
# wall-clock time for 3 steps against hp-train's for the same job.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hp-parallel-bench.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
command -v mpiexec >/dev/null || { echo "parallel-bench: no mpiexec; skipped"; exit 0; }

mkdir -p "$tmp/model"
cat >"$tmp/model/config.json" <<JSON
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
 "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
 "head_dim": 32, "vocab_size": 8192, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
 "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 128, "decoder_sparse_step": 1,
 "norm_topk_prob": true, "output_router_logits": true, "router_aux_loss_coef": 0.001,
 "tie_word_embeddings": false, "torch_dtype": "float32", "rope_theta": 1000000.0}
JSON
awk 'BEGIN { srand(7); for (d = 0; d < 128; d++) { printf "{\"ids\":["
	for (i = 0; i < 513; i++) printf "%s%d", i ? "," : "", int(rand() * 8192); print "]}" } }' >"$tmp/ids.jsonl"
"$build/bin/hp-test-tool" mkidx --vocab 8192 --records-of 513 -o "$tmp/ids" "$tmp/ids.jsonl" >/dev/null || exit 1
{
	cat <<-YAML
	model: {_target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_config, config_path: $tmp/model}
	training: {train_iters: 6, global_batch_size: 16, micro_batch_size: 1, seed: 1}
	checkpoint: {save_ckpt: false}
	dataset:
	  _target_: hyper_parallel.data.build_indexed_text_dataset
	  data_path: $tmp/ids
	  data_config: {seq_length: 512, is_dataset_from_mr: true}
	YAML
	awk '/^plan_overrides:/ { on = 1; print; next } on && /^[^ ]/ { exit } on' "$src/t/config/seed-8rank.yaml"
} >"$tmp/c.yaml"

# median of steps 2..6 of FIELD in FILE
med () {
	jq -r "select(.step > 1) | .$2 // 0" "$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

A=--accelerator F=--fsdp_config
echo "hp-train layouts: Qwen3-MoE (hidden 256, 4 layers, 16 experts top-4, vocab 8192), 16 x 512 tokens per step, $(getconf _NPROCESSORS_ONLN) cores"
printf '%-34s %6s %9s %9s %8s %10s\n' layout ranks "step s" "tok/s" "vs 1" "comm wait"
base=
run () {
	name=$1 n=$2; shift 2
	if [ $n = 1 ]; then
		"$build/bin/hp-train" -q "$tmp/c.yaml" --metrics "$tmp/m.jsonl" || exit 1
	else
		mpiexec -n $n "$build/bin/hp-train" -q "$tmp/c.yaml" "$@" --metrics "$tmp/m.jsonl" || exit 1
	fi
	t=$(med "$tmp/m.jsonl" step_time_s) w=$(med "$tmp/m.jsonl" comm_wait_s)
	[ -n "$base" ] || base=$t
	awk -v l="$name" -v n=$n -v t="$t" -v w="$w" -v b="$base" 'BEGIN {
		printf "%-34s %6s %9.4f %9.0f %7.2fx %9.0f%%\n", l, n, t, 16 * 512 / t, b / t, 100 * w / t }'
}
run "one process" 1
run "TP 2, sequence parallel" 2 $A.tp_size=2 $A.sequence_parallel=true
run "CP 2 (K/V all-gather)" 2 $A.cp_size=2
run "EP 2" 2 $A.ep_size=2
SEED8="$A.tp_size=2 $A.cp_size=2 $A.ep_size=2 $A.sequence_parallel=true $F.dp_shard_size=2 $F.edp_shard_size=2"
run "TP2 x CP2 x EP2, FSDP 2 (seed)" 8 $SEED8
prod=$t
run "  the same, validation mode" 8 $SEED8 --model.validate_placement=true
awk -v a="$t" -v b="$prod" 'BEGIN { printf "validation mode: %.2fx the production step time\n", a / b }'
# hp-verify: the whole job's wall-clock time for 3 steps against hp-train's
t0=$(date +%s.%N)
mpiexec -n 8 "$build/bin/hp-train" -q "$tmp/c.yaml" $SEED8 --training.train_iters=3 || exit 1
t1=$(date +%s.%N)
mpiexec -n 8 "$build/bin/hp-verify" "$tmp/c.yaml" $SEED8 --steps 3 >"$tmp/verify.out" || exit 1
t2=$(date +%s.%N)
tail -n 1 "$tmp/verify.out"
awk -v t0="$t0" -v t1="$t1" -v t2="$t2" 'BEGIN { p = t1 - t0; v = t2 - t1
	printf "hp-verify, 3 steps: %.1f s against hp-train'"'"'s %.1f s for the same job: %.2fx\n", v, p, v / p }'
