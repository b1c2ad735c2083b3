#!/bin/sh
test_description='hp-train under mpiexec: FSDP and HSDP equal the single-process run, and move what the plan says'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

REFS=$DATA/ref

# layout N OVERRIDES...: train under mpiexec -n N; losses (lib-train.sh's
# same_losses) and step-1 grads equal the single-process run's, and every
# rank's traffic equals the plan's
layout () {
	n=$1; shift
	mpiexec -n $n hp-train c.yaml "$@" --metrics p.jsonl --dump-grads pg.safetensors >out &&
	grep -q "^comm: every rank's bytes per collective and mesh dim equal the plan's estimate" out &&
	grep -q "^run.world_size  *$n$" out &&
	same_losses p.jsonl s.jsonl &&
	hp-test-tool cmpst --max-rel-l2 1e-5 sg.safetensors pg.safetensors >cmp &&
	! grep -q FAIL cmp
}

for m in stories260K/hf ref/qwen3-dense ref/qwen3-moe-a; do
	test_expect_success MPI "$m: FSDP over 2 and 4, HSDP 2x2, 8 ranks equal one process" '
		make_tinystories ts 64 &&
		write_config c.yaml "$DATA/'$m'" ts 64 2 16 4 </dev/null &&
		hp-train -q c.yaml --metrics s.jsonl --dump-grads sg.safetensors &&
		layout 2 --fsdp_config.dp_shard_size=2 &&
		layout 4 --fsdp_config.dp_shard_size=4 &&
		layout 4 --fsdp_config.dp_shard_size=2 --fsdp_config.edp_shard_size=2 &&
		layout 8 --fsdp_config.dp_shard_size=4 --fsdp_config.edp_shard_size=8 \
			--fsdp_config.reshard_after_forward=false --fsdp_config.reshard_after_backward=false
	'
done

test_expect_success MPI 'the metrics carry each step'\''s bytes, equal to hp-plan'\''s estimate for rank 0' '
	mpiexec -n 4 hp-train -q c.yaml --fsdp_config.dp_shard_size=2 --metrics p.jsonl &&
	hp-plan c.yaml --world 4 --fsdp_config.dp_shard_size=2 >plan.json &&
	jq -c "[.estimates.per_rank[] | select(.ranks | index(0)) | .comm[] | {(.dim): {(.op): .bytes}}] |
		reduce .[] as \$x ({}; . * \$x)" plan.json >want &&
	jq -c ".comm" p.jsonl | sort -u >got &&
	test $(wc -l <got) = 1 &&
	test "$(jq -S -c . want)" = "$(jq -S -c . got)"
'

test_expect_success MPI 'requires_grad_sync false: one reduce-scatter per unit a step, not one per micro-batch; equal to one process' '
	layout 4 --fsdp_config.dp_shard_size=4 --fsdp_config.requires_grad_sync=false &&
	layout 4 --fsdp_config.dp_shard_size=2 --fsdp_config.requires_grad_sync=false &&
	rs_off=$(jq -s ".[0].comm.dp_shard.reduce_scatter" p.jsonl) &&
	layout 4 --fsdp_config.dp_shard_size=2 &&
	rs_on=$(jq -s ".[0].comm.dp_shard.reduce_scatter" p.jsonl) &&
	G=$(jq -s ".[0] | .tokens / (2 * 64 * 4)" p.jsonl) &&
	test "$rs_on" = $((rs_off * G)) &&
	hp-plan c.yaml --world 4 --fsdp_config.dp_shard_size=2 --fsdp_config.requires_grad_sync=false >off.json &&
	hp-plan c.yaml --world 4 --fsdp_config.dp_shard_size=2 >on.json &&
	jq -e -n --slurpfile a off.json --slurpfile b on.json \
		"\$a[0].estimates.per_rank[0].gathered_bytes > \$b[0].estimates.per_rank[0].gathered_bytes"
'

test_expect_success MPI 'prefetch: the next layer'\''s all-gather starts while a layer computes, and changes nothing' '
	mpiexec -n 4 hp-train c.yaml --fsdp_config.dp_shard_size=4 --metrics p0.jsonl \
		--fsdp_config.forward_prefetch_depth=0 --fsdp_config.backward_prefetch_depth=0 >out &&
	grep -q "^fsdp: [1-9][0-9]* layer all-gathers over all ranks, 0 of them started" out &&
	mpiexec -n 4 hp-train c.yaml --fsdp_config.dp_shard_size=4 --metrics p2.jsonl \
		--fsdp_config.forward_prefetch_depth=2 --fsdp_config.backward_prefetch_depth=2 >out &&
	grep "^fsdp: " out &&
	grep -q "^fsdp: [1-9][0-9]* layer all-gathers over all ranks, [1-9][0-9]* of them started" out &&
	grep -q "^comm: every rank" out &&
	jq .loss p0.jsonl >l0 && jq .loss p2.jsonl >l2 && test -s l0 && cmp l0 l2
'

# memory_ok N: the "memory:" line says the largest rank keeps at most 1/N + 5% of one process's
memory_ok () {
	sed -n "s/^memory: weights, gradients and AdamW moments \([0-9]*\) bytes on the largest rank (the plan estimated \([0-9]*\)), .*: \([0-9.]*\) of it .*/\1 \2 \3/p" out |
	awk -v n=$1 '{ a = $1; est = $2; r = $3 }
		END {
			if (r == "" || r > 1.05 / n || r < 0.5 / n) { print "memory ratio " r " over " n " ranks"; exit 1 }
			# what hp-train allocates is the plan estimate within 1% (the chunks are padded)
			d = (a - est) / est; if (d < 0) d = -d
			if (d > 0.01) { print "allocated " a ", estimated " est; exit 1 } }'
}

test_expect_success MPI 'weights, gradients and AdamW moments per rank are 1/N of one process'\''s, plus at most 5%' '
	for n in 2 4 8; do
		mpiexec -n $n hp-train c.yaml --fsdp_config.dp_shard_size=$n --fsdp_config.edp_shard_size=$n >out &&
		grep "^memory: " out && memory_ok $n || return 1
	done
'

# host_ok PLAN METRICS: the metrics' host_bytes_peak on every step, never
# falling, at least the largest rank's shards (a measurement that is not one
# fails), within the plan's bound: 1.25 x its buffers + its fixed overhead
host_ok () {
	jq -s -e "length > 1 and all(.host_bytes_peak > 0) and
		([.[].host_bytes_peak] == ([.[].host_bytes_peak] | sort))" "$2" >/dev/null &&
	peak=$(jq -s "map(.host_bytes_peak) | max" "$2") &&
	jq -e --argjson p "$peak" "[.estimates.per_rank[] | \$p >= .param_bytes + .grad_bytes + .optimizer_bytes and
		\$p <= 1.25 * (.host_bytes - .host_overhead_bytes) + .host_overhead_bytes] | any" "$1" >/dev/null ||
	{ echo "peak $peak against the plan:"; jq -c ".estimates.per_rank[] | del(.comm)" "$1"; return 1; }
}

test_expect_success MPI 'each rank peak resident memory, as the system counts it, is within the plan bound' '
	for n in 1 4; do
		mpiexec -n $n hp-train c.yaml --fsdp_config.dp_shard_size=$n --fsdp_config.edp_shard_size=$n \
			--metrics hm.jsonl >out &&
		hp-plan c.yaml --world $n --fsdp_config.dp_shard_size=$n --fsdp_config.edp_shard_size=$n >hp.json &&
		grep "^host memory: " out &&
		grep -q "^host memory: peak resident [0-9.]* MiB on the largest rank, the plan.s host bytes [0-9.]* MiB: every rank within 1.25 x its buffers + 256 MiB$" out &&
		host_ok hp.json hm.jsonl || return 1
	done
'

test_expect_success 'a CPU run does not load cuBLASLt (about 200 MB resident in every process)' '
	! readelf -d "$(command -v hp-train)" | grep -i "NEEDED.*cublas" &&
	make_tinystories ts1 64 &&
	write_config c1.yaml "$DATA/stories260K/hf" ts1 64 2 4 2 </dev/null &&
	hp-train -q c1.yaml --metrics m1.jsonl &&
	jq -s -e "map(.host_bytes_peak) | max < 100 * 1048576" m1.jsonl
'

# kill_rank2 [MPIEXEC OPTIONS]: start a long run on 4 ranks, SIGKILL rank 2
# once it trains, wait (at most 60 s) for the job to end; $pid is the victim
kill_rank2 () {
	# the previous job's ranks may still be on their way out
	i=0 &&
	while grep -l "^hp-train$" /proc/[0-9]*/comm >/dev/null 2>&1; do
		sleep 0.2; i=$((i + 1)); [ $i -lt 100 ] || break
	done &&
	rm -f krc kout kerr &&
	tag=hp-kill-$$-$1 &&
	{ (HP_KILL_TAG=$tag timeout 300 mpiexec "$@" -n 4 hp-train c.yaml --fsdp_config.dp_shard_size=4 \
		--training.train_iters=1000000 >kout 2>kerr; echo $? >krc) & } &&
	i=0 &&
	while ! grep -q "^step 1/" kout 2>/dev/null; do
		sleep 0.1; i=$((i + 1)); [ $i -lt 600 ] || { echo "the job did not start"; return 1; }
	done &&
	: >pids &&
	# this job's ranks: the processes with its tag in their environment
	for d in /proc/[0-9]*; do
		[ "$(cat "$d/comm" 2>/dev/null)" = hp-train ] || continue
		p=${d#/proc/}
		env=$( (tr "\0" "\n" <"$d/environ") 2>/dev/null) || continue
		echo "$env" | grep -q "^HP_KILL_TAG=$tag$" || continue
		echo "$(echo "$env" | sed -n "s/^PMI_RANK=//p") $p" >>pids
	done &&
	pid=$(awk "\$1 == 2 { print \$2 }" pids) &&
	test -n "$pid" && test $(wc -l <pids) = 4 &&
	kill -9 "$pid" && t0=$(date +%s) &&
	while [ ! -s krc ]; do
		sleep 0.2; [ $(($(date +%s) - t0)) -lt 60 ] || { echo "still running 60 s after the kill"; return 1; }
	done &&
	echo "# ended $(($(date +%s) - t0)) s after the kill with status $(cat krc)" &&
	test "$(cat krc)" != 0 && test "$(cat krc)" != 124
}

# gone_lines_true: every "rank R (pid P) is gone" line is true to the
# rank -> pid map of the run (a neighbour the death took down may be named
# too: MPICH's shared-memory transport aborts a rank that reads from a dead one)
gone_lines_true () {
	sed -n "s/^hp-train: rank \([0-9]*\) (pid \([0-9]*\)) is gone; rank [0-9]* stops with the job$/\1 \2/p" kerr >named &&
	while read r p; do grep -q "^$r $p$" pids || { echo "named rank $r pid $p: not in the map"; return 1; }; done <named
}

# A survivor names the dead rank when it gets to: MPICH's default clean-up
# may end it first, and it never names a wrong one.
test_expect_success MPI 'a rank killed with SIGKILL ends the job non-zero within 60 s' '
	kill_rank2 &&
	gone_lines_true
'

# Without the launcher's clean-up a survivor names the dead rank, unless
# the launcher itself falls over: hydra's proxy dies when the killed rank
# was in a PMI exchange (seen once in about ten runs under load: "unable
# to forward PMI response to MPI process", exit 255), and what the
# survivors write to stderr goes down with it.
test_expect_success MPI 'with mpiexec -disable-auto-cleanup the survivors name a dead rank, unless the launcher fails' '
	kill_rank2 -disable-auto-cleanup &&
	gone_lines_true &&
	{ test -s named || grep "unable to forward PMI response" kerr; }
'

# Indexed data over dp ranks: each rank reads its own micro-batches and
# skips the others' rows (the losses above are the one process's, so every
# rank still gets its rows).  A bad id in a row of rank 1's share is seen
# by rank 1 alone, which names it; rank 0 stops with it instead of waiting.
test_expect_success MPI 'over dp ranks each rank reads only its share of the indexed data' '
	for i in 0 1 2 3 4 5 6 7; do
		v=$((i == 5 ? 700 : 7))
		printf "{\"ids\": [%s]}\n" "$(seq -s, 1 64),$v"
	done >bad.jsonl &&
	hp-test-tool mkidx --vocab 1000 --records-of 65 -o bad bad.jsonl &&
	write_config b.yaml "$DATA/stories260K/hf" bad 64 1 8 1 </dev/null &&
	test_must_fail_with 4 mpiexec -n 2 hp-train -q b.yaml --fsdp_config.dp_shard_size=2 2>err &&
	cat err &&
	grep -q "rank 1 .*token id 700 at step 1 is outside the model.s vocabulary" err &&
	grep -q "another rank could not read its share of the data" err &&
	test $(grep -c "token id 700" err) = 1
'

test_done
