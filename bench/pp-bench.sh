#!/bin/sh
# bench/pp-bench.sh - pipeline schedules on 4 stages, against one process.
#
# A random untied Llama of 16 layers (hidden 128, 4 heads, vocab 4096),
# micro-batches of 1 x 256 tokens, 8 of them per step, 6 steps: hp-train as
# one process, then 4 pipeline stages of 4 layers each under GPipe and
# 1F1B, and of 2 chunks of 2 layers each under interleaved 1F1B
# (pp_vpp 2).  For each: the median step time of steps 2..6 and its ratio to one
# process; for the stages, each rank's median share of the step spent
# waiting on its neighbours (the metrics' pp_wait_s), beside the plan's
# bubble (hp-plan's pipeline.bubble: with a forward 1 unit and a backward 2,
# (pp - 1) / (G + pp - 1) for both plain schedules, about half that
# interleaved) and each stage's activation bytes as the plan holds them
# (1F1B: pp - s micro-batches; GPipe: all G; interleaved: its slots per
# chunk, each of half the layers).
# On a machine with fewer cores than ranks the stages share cores: a rank
# that waits gives its core to the one it waits for, so the waits it shows
# are upper bounds of what dedicated devices would see.
# Not a test: it prints, and only a failed run exits non-zero (no mpiexec:
# skipped).
#
# Smoke mode (HP_BENCH_SMOKE=1; t/t1300 runs it): 8 layers of hidden 64,
# 4 micro-batches of 32 tokens, 2 steps: the same table, its numbers not
# worth reading.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
if [ "${HP_BENCH_SMOKE:-0}" = 1 ]; then
	smoke=1 hidden=64 inter=128 layers=8 heads=4 vocab=512 seq=32 gbs=4 steps=2
else
	smoke=0 hidden=128 inter=512 layers=16 heads=4 vocab=4096 seq=256 gbs=8 steps=6
fi
. "$src/bench/lib.sh"
bench_begin pp-bench

bench_llama "$tmp/model"
bench_ids "$tmp/ids" $((gbs * (steps + 2))) $((seq + 1)) || exit 1
{
	bench_yaml $steps $gbs 1 $seq
	echo "checkpoint: {save_ckpt: false}"
} >"$tmp/c.yaml"

# median of steps 2..$steps of the jq expression EXPR over FILE
med () {
	jq -r "select(.step > 1) | $2" "$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

cores=$(getconf _NPROCESSORS_ONLN)
echo "hp-train pipeline schedules: Llama (hidden $hidden, $layers layers, vocab $vocab), $gbs micro-batches of 1 x $seq tokens per step, $steps steps, $cores cores"
[ "$smoke" = 0 ] || echo "smoke mode: tiny sizes, the numbers are not worth reading"
[ "$cores" -ge 4 ] || echo "$cores cores for 4 ranks: the stages share cores, so the waits below are upper bounds"
printf '%-12s %5s %9s %8s %8s  %-31s  %s\n' schedule ranks "step s" "vs 1" bubble "p2p wait / step, ranks 0..3" "activation bytes per stage"
"$build/bin/hp-train" -q "$tmp/c.yaml" --metrics "$tmp/m1.jsonl" || exit 1
base=$(med "$tmp/m1.jsonl" .step_time_s)
printf '%-12s %5s %9.4f %8s %8s  %-31s  %s\n' "one process" 1 "$base" 1.00x - - -
for sch in gpipe 1f1b interleaved; do
	A="--accelerator.pp_size=4 --accelerator.pp_schedule=$sch"
	[ "$sch" != interleaved ] || A="--accelerator.pp_size=4 --accelerator.pp_schedule=1f1b --accelerator.pp_vpp=2"
	mpiexec -n 4 "$build/bin/hp-train" -q "$tmp/c.yaml" $A --metrics "$tmp/m.jsonl" || exit 1
	"$build/bin/hp-plan" "$tmp/c.yaml" --world 4 $A >"$tmp/plan.json" || exit 1
	t=$(med "$tmp/m.jsonl" .step_time_s)
	waits=
	for r in 0 1 2 3; do
		w=$(med "$tmp/m.jsonl" "(.pp_wait_s[$r] / .step_time_s)")
		waits="$waits $(awk -v w="$w" 'BEGIN { printf "%5.1f%%", 100 * w }')"
	done
	bubble=$(jq -r '.pipeline.bubble' "$tmp/plan.json")
	acts=$(jq -r '[.estimates.per_rank[] | .activation_bytes as $a | .ranks[] | {r: ., a: $a}] | sort_by(.r) |
		map(.a) | join(" ")' "$tmp/plan.json")
	awk -v l="$sch" -v t="$t" -v b="$base" -v bub="$bubble" -v w="$waits" -v a="$acts" 'BEGIN {
		printf "%-12s %5d %9.4f %7.2fx %7.1f%%  %-31s  %s\n", l, 4, t, (t > 0 ? b / t : 0), 100 * bub, w, a }'
done
