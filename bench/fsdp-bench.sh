#!/bin/sh
# bench/fsdp-bench.sh - FSDP step time against one process, in one run.
#
# A random Llama (hidden 512, 4 layers, 8 heads, intermediate 1536, vocab
# 8192), micro-batches of 2 x 256 tokens, a global batch of 16 rows, 6
# steps: hp-train as one process, then under mpiexec -n 2, 4 and 8 with
# dp_shard_size = the world.  For each: the median step time of steps 2..6,
# tokens/s, the ratio to one process, and rank 0's share of the step spent
# waiting in collectives (metrics comm_wait_s).  On a 2-core machine 4 and 8
# ranks oversubscribe the cores: this measures overhead, not speed-up.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hp-fsdp-bench.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
command -v mpiexec >/dev/null || { echo "fsdp-bench: no mpiexec; skipped"; exit 0; }

mkdir -p "$tmp/model"
cat >"$tmp/model/config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
 "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
 "num_key_value_heads": 8, "vocab_size": 8192, "max_position_embeddings": 1024,
 "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "torch_dtype": "float32"}
JSON
awk 'BEGIN { srand(7); for (d = 0; d < 64; d++) { printf "{\"ids\":["
	for (i = 0; i < 257; i++) printf "%s%d", i ? "," : "", int(rand() * 8192); print "]}" } }' >"$tmp/ids.jsonl"
"$build/bin/hp-test-tool" mkidx --vocab 8192 --records-of 257 -o "$tmp/ids" "$tmp/ids.jsonl" >/dev/null || exit 1
cat >"$tmp/c.yaml" <<YAML
model: {_target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_config, config_path: $tmp/model}
training: {train_iters: 6, global_batch_size: 16, micro_batch_size: 2, seed: 1}
checkpoint: {save_ckpt: false}
dataset:
  _target_: hyper_parallel.data.build_indexed_text_dataset
  data_path: $tmp/ids
  data_config: {seq_length: 256, is_dataset_from_mr: true}
YAML

# median of steps 2..6 of FIELD in FILE
med () {
	jq -r "select(.step > 1) | .$2 // 0" "$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

echo "hp-train FSDP: Llama (hidden 512, 4 layers, vocab 8192), 16 x 256 tokens per step, $(getconf _NPROCESSORS_ONLN) cores"
printf '%-10s %12s %10s %10s %14s\n' ranks "step s" "tok/s" "vs 1" "comm wait"
base=
for n in 1 2 4 8; do
	if [ $n = 1 ]; then
		"$build/bin/hp-train" -q "$tmp/c.yaml" --metrics "$tmp/m$n.jsonl" || exit 1
	else
		mpiexec -n $n "$build/bin/hp-train" -q "$tmp/c.yaml" --fsdp_config.dp_shard_size=$n \
			--metrics "$tmp/m$n.jsonl" || exit 1
	fi
	t=$(med "$tmp/m$n.jsonl" step_time_s) w=$(med "$tmp/m$n.jsonl" comm_wait_s)
	[ -n "$base" ] || base=$t
	awk -v n=$n -v t="$t" -v w="$w" -v b="$base" 'BEGIN {
		printf "%-10s %12.4f %10.0f %9.2fx %13.0f%%\n", n, t, 16 * 256 / t, b / t, 100 * w / t }'
done
