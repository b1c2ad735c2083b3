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
# Not a test: it prints, and only a failed run exits non-zero (no mpiexec:
# skipped).
#
# Smoke mode (HP_BENCH_SMOKE=1; t/t1300 runs it): every layout and both
# checks of the above on a Qwen3-MoE of hidden 64 (2 layers of 4 heads / 2
# KV heads, 4 experts top-2 of 32, vocab 512), a global batch of 4 rows of
# 64 tokens, 2 steps: the same table in seconds, its numbers not worth
# reading.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
if [ "${HP_BENCH_SMOKE:-0}" = 1 ]; then
	smoke=1 hidden=64 inter=128 layers=2 heads=4 kv=2 hd=16 vocab=512 experts=4 topk=2 moe=32
	seq=64 gbs=4 steps=2 vsteps=2
else
	smoke=0 hidden=256 inter=512 layers=4 heads=8 kv=4 hd=32 vocab=8192 experts=16 topk=4 moe=128
	seq=512 gbs=16 steps=6 vsteps=3
fi
. "$src/bench/lib.sh"
bench_begin parallel-bench

mkdir -p "$tmp/model"
cat >"$tmp/model/config.json" <<JSON
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": $hidden,
 "intermediate_size": $inter, "num_hidden_layers": $layers, "num_attention_heads": $heads, "num_key_value_heads": $kv,
 "head_dim": $hd, "vocab_size": $vocab, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
 "num_experts": $experts, "num_experts_per_tok": $topk, "moe_intermediate_size": $moe, "decoder_sparse_step": 1,
 "norm_topk_prob": true, "output_router_logits": true, "router_aux_loss_coef": 0.001,
 "tie_word_embeddings": false, "torch_dtype": "float32", "rope_theta": 1000000.0}
JSON
# 128 records of seq+1 random ids: 16 rows for each of 8 steps
bench_ids "$tmp/ids" 128 $((seq + 1)) || exit 1
{
	bench_yaml $steps $gbs 1 $seq
	echo "checkpoint: {save_ckpt: false}"
	awk '/^plan_overrides:/ { on = 1; print; next } on && /^[^ ]/ { exit } on' "$src/t/config/seed-8rank.yaml"
} >"$tmp/c.yaml"

# median of steps 2..$steps of FIELD in FILE
med () {
	jq -r "select(.step > 1) | .$2 // 0" "$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

A=--accelerator F=--fsdp_config
echo "hp-train layouts: Qwen3-MoE (hidden $hidden, $layers layers, $experts experts top-$topk, vocab $vocab), $gbs x $seq tokens per step, $steps steps, $(getconf _NPROCESSORS_ONLN) cores"
[ "$smoke" = 0 ] || echo "smoke mode: tiny sizes, the numbers are not worth reading"
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
	[ -n "$t" ] || { echo "parallel-bench: $name: no step times in the metrics" >&2; exit 1; }
	[ -n "$base" ] || base=$t
	# a tiny step can round to 0 s: no ratio then, not a division by zero
	awk -v l="$name" -v n=$n -v t="$t" -v w="$w" -v b="$base" -v tok=$((gbs * seq)) 'BEGIN {
		if (t <= 0) { printf "%-34s %6s %9.4f %9s %8s %10s\n", l, n, t, "-", "-", "-"; exit }
		printf "%-34s %6s %9.4f %9.0f %7.2fx %9.0f%%\n", l, n, t, tok / t, b / t, 100 * w / t }'
}
run "one process" 1
run "TP 2, sequence parallel" 2 $A.tp_size=2 $A.sequence_parallel=true
run "CP 2 (K/V all-gather)" 2 $A.cp_size=2
run "EP 2" 2 $A.ep_size=2
SEED8="$A.tp_size=2 $A.cp_size=2 $A.ep_size=2 $A.sequence_parallel=true $F.dp_shard_size=2 $F.edp_shard_size=2"
run "TP2 x CP2 x EP2, FSDP 2 (seed)" 8 $SEED8
prod=$t
run "  the same, validation mode" 8 $SEED8 --model.validate_placement=true
awk -v a="$t" -v b="$prod" 'BEGIN { printf "validation mode: %.2fx the production step time\n", (b > 0 ? a / b : 0) }'
# hp-verify: the whole job's wall-clock time for $vsteps steps against hp-train's
t0=$(date +%s.%N)
mpiexec -n 8 "$build/bin/hp-train" -q "$tmp/c.yaml" $SEED8 --training.train_iters=$vsteps || exit 1
t1=$(date +%s.%N)
mpiexec -n 8 "$build/bin/hp-verify" "$tmp/c.yaml" $SEED8 --steps $vsteps >"$tmp/verify.out" || exit 1
t2=$(date +%s.%N)
tail -n 1 "$tmp/verify.out"
awk -v t0="$t0" -v t1="$t1" -v t2="$t2" -v n=$vsteps 'BEGIN { p = t1 - t0; v = t2 - t1
	printf "hp-verify, %d steps: %.1f s against hp-train'"'"'s %.1f s for the same job: %.2fx\n", n, v, p, (p > 0 ? v / p : 0) }'
