#!/bin/sh
# bench/ckpt-bench.sh - checkpoint write and read throughput against dd, in
# one run.
#
# A random Llama (hidden 1024, 8 layers, intermediate 2816, vocab 32000:
# 165M parameters, 1.98 GB of weights and AdamW moments), one training
# step, then a checkpoint: as one process, and over 4 ranks with FSDP (each
# rank writes its quarter).  For each: the seconds the training loop was
# held by the save (metrics checkpoint_s), the bytes on disk, write GB/s per
# rank; then a resume of the same checkpoint: read GB/s per rank.  The
# baseline writes the same bytes with dd (conv=fsync, as the checkpoint
# fsyncs every file) and reads them back with dd, in the same run.  Reads
# come from the page cache on both sides.  Not a test: it prints, and only
# a failed run exits non-zero (no mpiexec: skipped).
#
# Smoke mode (HP_BENCH_SMOKE=1; t/t1300 runs it): the same runs on a Llama
# of hidden 64 (2 layers, 4 heads, intermediate 172, vocab 512: 0.2M
# parameters): the same table in seconds, its numbers not worth reading.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
if [ "${HP_BENCH_SMOKE:-0}" = 1 ]; then
	smoke=1 hidden=64 inter=172 layers=2 heads=4 vocab=512 what="0.2M"
else
	smoke=0 hidden=1024 inter=2816 layers=8 heads=16 vocab=32000 what="165M"
fi
. "$src/bench/lib.sh"
bench_begin ckpt-bench

bench_llama "$tmp/model" || exit 1
bench_ids "$tmp/ids" 8 65 || exit 1
{
	bench_yaml 2 4 1 64
	echo "checkpoint: {checkpoint_dir: $tmp/ck, save_steps: 1}"
} >"$tmp/c.yaml"

now () { date +%s.%N; }

echo "checkpoints: Llama $what parameters (weights + AdamW moments), $(getconf _NPROCESSORS_ONLN) cores"
[ "$smoke" = 0 ] || echo "smoke mode: a tiny model, the numbers are not worth reading"
printf '%-8s %10s %10s %12s %12s %12s %12s\n' ranks "GB" "held s" "write GB/s" "dd GB/s" "read GB/s" "dd GB/s"
for n in 1 4; do
	rm -rf "$tmp/ck"
	mpiexec -n $n "$build/bin/hp-train" -q "$tmp/c.yaml" --fsdp_config.dp_shard_size=$n --max-steps 1 \
		--metrics "$tmp/m.jsonl" || exit 1
	held=$(jq -r .checkpoint_s "$tmp/m.jsonl")
	case $held in ''|null) echo "ckpt-bench: $n rank(s): no checkpoint_s in the metrics" >&2; exit 1 ;; esac
	bytes=$(du -sb "$tmp/ck/global_step_1" | cut -f1)
	# read: a resume that loads it and trains the last step (its time less a step's)
	t0=$(now)
	mpiexec -n $n "$build/bin/hp-train" "$tmp/c.yaml" --fsdp_config.dp_shard_size=$n \
		--checkpoint.restore_from=LATEST --checkpoint.save_ckpt=false >"$tmp/out" || exit 1
	rs=$(sed -n "s/^checkpoint: resumed from .* (\([0-9.]*\) s)$/\1/p" "$tmp/out")
	[ -n "$rs" ] || { echo "ckpt-bench: $n rank(s): the resume printed no time" >&2; exit 1; }
	# dd: the same bytes in n files of bytes/n, written with fsync, then read
	per=$((bytes / n / 1048576 + 1))
	t0=$(now)
	for r in $(seq 1 $n); do
		dd if=/dev/zero of="$tmp/dd$r" bs=1M count=$per conv=fsync 2>/dev/null &
	done
	wait
	t1=$(now)
	for r in $(seq 1 $n); do dd if="$tmp/dd$r" of=/dev/null bs=1M 2>/dev/null & done
	wait
	t2=$(now)
	rm -f "$tmp"/dd*
	# a tiny checkpoint can take "0.00" s: "-" then, not a division by zero
	awk -v n=$n -v b=$bytes -v h="$held" -v r="$rs" -v t0=$t0 -v t1=$t1 -v t2=$t2 '
	function rate(s) { return s > 0 ? sprintf("%12.2f", g / n / s) : sprintf("%12s", "-") }
	BEGIN {
		g = b / 1e9
		printf "%-8s %10.2f %10.2f %s %s %s %s\n", n, g, h, rate(h), rate(t1 - t0), rate(r), rate(t2 - t1) }'
done
echo "(held: the save's wall time inside the training loop; per rank: GB / ranks / seconds)"
