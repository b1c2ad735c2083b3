#!/bin/sh
# bench/mem-bench.sh - each rank's peak resident memory, as the system
# measures it, against the plan's host bytes and against one process.
#
# The 125M-parameter Llama of issue #35 (hidden 768, 16 layers, 12 heads,
# intermediate 2048, vocabulary 8000, untied), micro-batches of 1 x 256
# tokens, a global batch of 4 rows, 2 steps: hp-train as one process, then
# under mpiexec -n 2 and 4 with dp_shard_size = the world.  For each: the
# largest peak resident set over ranks (the metrics' host_bytes_peak, read
# from VmHWM), the plan's host bytes for its largest rank (hp-plan's
# estimates.per_rank[].host_bytes: buffers + a fixed overhead), the bound a
# run is held to (1.25 x the buffers + the overhead), and the peak against
# one process's.  Targets (#35): every run within its bound; FSDP over 4
# ranks at most 0.45 of one process.  Not a test: it prints, and only a
# failed run exits non-zero (no mpiexec: skipped).
#
# Then the same for the device (see below), and the MoE layers of
# Qwen3-30B-A3B's shapes on the device: launches and host syncs a step.
#
# Smoke mode (HP_BENCH_SMOKE=1; t/t1300 runs it): a Llama of hidden 64
# (2 layers, vocab 512), rows of 32 tokens: the same table in seconds, its
# numbers dominated by the fixed overhead.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
if [ "${HP_BENCH_SMOKE:-0}" = 1 ]; then
	smoke=1 hidden=64 inter=172 layers=2 heads=4 vocab=512 seq=32
else
	smoke=0 hidden=768 inter=2048 layers=16 heads=12 vocab=8000 seq=256
fi
. "$src/bench/lib.sh"
bench_begin mem-bench

bench_llama "$tmp/model" || exit 1
bench_ids "$tmp/ids" 16 $((seq + 1)) || exit 1
{
	bench_yaml 2 4 1 $seq
	echo "checkpoint: {save_ckpt: false}"
} >"$tmp/c.yaml"

# run N TAG ARGS...: hp-train on N ranks (dp_shard_size N), its metrics in
# $tmp/TAGN.jsonl, and its plan in $tmp/TAGN.json
run () {
	n=$1 tag=$2 launch=
	shift 2
	[ $n = 1 ] || { launch="mpiexec -n $n"; set -- --fsdp_config.dp_shard_size=$n "$@"; }
	$launch "$build/bin/hp-train" -q "$tmp/c.yaml" "$@" --metrics "$tmp/$tag$n.jsonl" &&
	"$build/bin/hp-plan" "$tmp/c.yaml" --world $n "$@" -o "$tmp/$tag$n.json"
}

# largest FIELD over ranks and steps in the metrics $tmp/TAGN.jsonl
peak () {
	v=$(jq -s "map(.$3) | max" "$tmp/$1$2.jsonl")
	case $v in ''|null) echo "mem-bench: $2 ranks: no $3 in the metrics" >&2; exit 1 ;; esac
	echo "$v"
}

echo "hp-train host memory: Llama (hidden $hidden, $layers layers, vocab $vocab), 4 x $seq tokens per step"
[ "$smoke" = 0 ] || echo "smoke mode: tiny sizes, the numbers are not worth reading"
printf '%-6s %12s %12s %12s %8s %10s\n' ranks "peak MiB" "plan MiB" "bound MiB" within "vs 1"
one=
for n in 1 2 4; do
	run $n m || exit 1
	p=$(peak m $n host_bytes_peak) || exit 1
	plan=$(jq '[.estimates.per_rank[].host_bytes] | max' "$tmp/m$n.json")
	bound=$(jq '[.estimates.per_rank[] | 1.25 * (.host_bytes - .host_overhead_bytes) + .host_overhead_bytes] | max' "$tmp/m$n.json")
	[ -n "$one" ] || one=$p
	awk -v n=$n -v p="$p" -v q="$plan" -v b="$bound" -v o="$one" 'BEGIN { m = 1048576
		printf "%-6s %12.1f %12.1f %12.1f %8s %9.3fx\n", n, p / m, q / m, b / m, p <= b ? "yes" : "NO", p / o }'
done
echo "targets (#35): within on every row; 4 ranks at most 0.450x of one process"

# The device: the CUDA backend's own count (device_bytes_peak: every
# allocation and mapped granule, the same code on a GPU as in its host
# emulation, which runs here) against the plan's device_bytes, one step.
# Target (#35): FSDP over 4 ranks at most 0.40 of one process.
echo
echo "hp-train device memory, CUDA backend (emulated on the host, exact): the same model, 1 step"
printf '%-6s %12s %12s %8s %10s\n' ranks "peak MiB" "plan MiB" "within" "vs 1"
export HP_CUDA_EMULATE=exact
one=
for n in 1 4; do
	run $n d --training.device=cuda --training.train_iters=1 || exit 1
	p=$(peak d $n device_bytes_peak) || exit 1
	plan=$(jq '[.estimates.per_rank[].device_bytes] | max' "$tmp/d$n.json")
	[ -n "$one" ] || one=$p
	awk -v n=$n -v p="$p" -v q="$plan" -v o="$one" 'BEGIN { m = 1048576; d = p / q
		printf "%-6s %12.1f %12.1f %8s %9.3fx\n", n, p / m, q / m, (d >= 0.98 && d <= 1.02) ? "2%" : "NO", p / o }'
done
echo "targets (#35): within 2% of the plan on every row; 4 ranks at most 0.400x of one process"

# MoE layers of Qwen3-30B-A3B's shapes (hidden 2048, 32 query and 4
# key/value heads of 128, experts of 768 with top-8; a vocabulary of 8000
# and 16 or 32 experts so that the emulation fits a small machine: the
# launches do not depend on the experts), 1 x 256 tokens, on the emulated
# device, 2 steps: launches and host syncs a step, and from one MoE layer
# to two the launches a layer adds; device bytes against the plan.
# Targets (#35): launches the same for 16 and 32 experts (at most 1.15x);
# 1 host sync a step (one process); device within 2% of the plan.
if [ "$smoke" = 1 ]; then
	mh=64 mheads=4 mkv=2 mhd=16 mim=32 mk=2 mexp="4 8" mseq=32
else
	mh=2048 mheads=32 mkv=4 mhd=128 mim=768 mk=8 mexp="16 32" mseq=256
fi
echo
echo "MoE layers on the device (CUDA backend emulated, exact): hidden $mh, $mheads/$mkv heads of $mhd, experts of $mim, top-$mk, 1 x $mseq tokens"
printf '%-8s %-7s %14s %12s %12s %12s %8s\n' experts layers "launches/step" "syncs/step" "peak MiB" "plan MiB" within
bench_ids "$tmp/mids" 8 $((mseq + 1)) || exit 1
for e in $mexp; do
	for l in 1 2; do
		d=$tmp/moe$e-$l
		mkdir -p "$d" && cat >"$d/config.json" <<JSON
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": $mh,
 "intermediate_size": $((3 * mim)), "num_hidden_layers": $l, "num_attention_heads": $mheads,
 "num_key_value_heads": $mkv, "head_dim": $mhd, "moe_intermediate_size": $mim, "num_experts": $e,
 "num_experts_per_tok": $mk, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
 "output_router_logits": true, "router_aux_loss_coef": 0.001, "vocab_size": $vocab,
 "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
 "tie_word_embeddings": false, "torch_dtype": "float32"}
JSON
		cat >"$d.yaml" <<YAML
model: {_target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_config, config_path: $d}
training: {train_iters: 2, global_batch_size: 1, micro_batch_size: 1, seed: 1}
checkpoint: {save_ckpt: false}
dataset:
  _target_: hyper_parallel.data.build_indexed_text_dataset
  data_path: $tmp/mids
  data_config: {seq_length: $mseq, is_dataset_from_mr: true}
YAML
		"$build/bin/hp-train" -q "$d.yaml" --training.device=cuda --metrics "$d.jsonl" &&
			"$build/bin/hp-plan" "$d.yaml" --world 1 --training.device=cuda -o "$d.json" || exit 1
		jq -s -r --slurpfile p "$d.json" --arg e $e --arg l $l '.[-1] as $s | ($p[0].estimates.per_rank[0].device_bytes) as $q |
			"\($e)\t\($l)\t\($s.kernel_launches)\t\($s.host_syncs)\t\($s.device_bytes_peak / 1048576)\t\($q / 1048576)\t\(if ($s.device_bytes_peak / $q - 1) | fabs <= 0.02 then "2%" else "NO" end)"' \
			"$d.jsonl" | awk -F'\t' '{ printf "%-8s %-7s %14d %12d %12.1f %12.1f %8s\n", $1, $2, $3, $4, $5, $6, $7 }'
	done
done | tee "$tmp/moe.tab"
awk 'NR == 1 { a1 = $3 } NR == 2 { a2 = $3 } NR == 3 { b1 = $3 } NR == 4 { b2 = $3 }
	END { printf "a MoE layer adds %d launches a step; more experts: %.3fx the launches (target at most 1.150x)\n",
		a2 - a1, b2 / a2 }' "$tmp/moe.tab"
