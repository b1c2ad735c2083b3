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
# Not a test: it prints, and only a failed run exits non-zero (no mpiexec:
# skipped).
#
# Smoke mode (HP_BENCH_SMOKE=1; t/t1300 runs it): the same ranks on a Llama
# of hidden 64 (2 layers, 4 heads, intermediate 172, vocab 512), a global
# batch of 8 rows of 32 tokens, 2 steps: the same table in seconds, its
# numbers not worth reading.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
if [ "${HP_BENCH_SMOKE:-0}" = 1 ]; then
	smoke=1 hidden=64 inter=172 layers=2 heads=4 vocab=512 seq=32 gbs=8 mbs=1 steps=2
else
	smoke=0 hidden=512 inter=1536 layers=4 heads=8 vocab=8192 seq=256 gbs=16 mbs=2 steps=6
fi
. "$src/bench/lib.sh"
bench_begin fsdp-bench

bench_llama "$tmp/model" || exit 1
bench_ids "$tmp/ids" 64 $((seq + 1)) || exit 1
{
	bench_yaml $steps $gbs $mbs $seq
	echo "checkpoint: {save_ckpt: false}"
} >"$tmp/c.yaml"

# median of steps 2..$steps of FIELD in FILE
med () {
	jq -r "select(.step > 1) | .$2 // 0" "$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

echo "hp-train FSDP: Llama (hidden $hidden, $layers layers, vocab $vocab), $gbs x $seq tokens per step, $steps steps, $(getconf _NPROCESSORS_ONLN) cores"
[ "$smoke" = 0 ] || echo "smoke mode: tiny sizes, the numbers are not worth reading"
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
	[ -n "$t" ] || { echo "fsdp-bench: $n ranks: no step times in the metrics" >&2; exit 1; }
	[ -n "$base" ] || base=$t
	# a tiny step can round to 0 s: no ratio then, not a division by zero
	awk -v n=$n -v t="$t" -v w="$w" -v b="$base" -v tok=$((gbs * seq)) 'BEGIN {
		if (t <= 0) { printf "%-10s %12.4f %10s %10s %14s\n", n, t, "-", "-", "-"; exit }
		printf "%-10s %12.4f %10.0f %9.2fx %13.0f%%\n", n, t, tok / t, b / t, 100 * w / t }'
done
