#!/bin/sh
test_description='hp-train: a rank that waits in a collective past training.collective_timeout_s ends the job and names who has not arrived'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

# Every job here carries HP_TMO_TAG=$TAG.N in its ranks' environment, so
# that the test finds its own ranks (and MPICH's hydra gives each its
# PMI_RANK there); whatever happens, none is left behind, least of all a
# stopped one.
TAG=hp-tmo-$$
leftovers () {
	for d in /proc/[0-9]*; do
		[ "$(cat "$d/comm" 2>/dev/null)" = hp-train ] || continue
		(tr "\0" "\n" <"$d/environ") 2>/dev/null | grep -q "^HP_TMO_TAG=$TAG\." && echo "${d#/proc/}"
	done
}
clean_up () {
	for p in $(leftovers); do kill -CONT "$p"; kill -KILL "$p"; done 2>/dev/null
	return 0
}
trap clean_up EXIT
trap "clean_up; exit 1" INT TERM HUP

# start_job N OVERRIDES...: train c.yaml on 4 ranks in the background (at
# most 120 s; checkpoints in ckN), the status in rcN once it ends; wait
# until step 1 is done; pidsN: "RANK PID" per rank.  An earlier test's
# job, should it have failed to end, is ended first.
start_job () {
	n=$1; shift
	clean_up &&
	rm -f rc$n out$n err$n &&
	{ (HP_TMO_TAG=$TAG.$n timeout 120 mpiexec -n 4 hp-train c.yaml --fsdp_config.dp_shard_size=4 \
		--checkpoint.checkpoint_dir=ck$n "$@" >out$n 2>err$n; echo $? >rc$n) & } &&
	i=0 &&
	while ! grep -q "^step 1/" out$n 2>/dev/null; do
		sleep 0.1; i=$((i + 1)); [ $i -lt 600 ] || { echo "job $n did not start"; cat err$n; return 1; }
	done &&
	: >pids$n &&
	for d in /proc/[0-9]*; do
		[ "$(cat "$d/comm" 2>/dev/null)" = hp-train ] || continue
		env=$( (tr "\0" "\n" <"$d/environ") 2>/dev/null) || continue
		echo "$env" | grep -q "^HP_TMO_TAG=$TAG\.$n$" || continue
		echo "$(echo "$env" | sed -n "s/^PMI_RANK=//p") ${d#/proc/}" >>pids$n
	done &&
	test $(wc -l <pids$n) = 4
}

# pid_of N RANK
pid_of () {
	awk -v r=$2 '$1 == r { print $2 }' pids$1
}

# ended N SECONDS EVENT: job N ends within SECONDS of EVENT; says after how long
ended () {
	t0=$(($(date +%s%N) / 1000000)) &&
	while [ ! -s rc$1 ]; do
		sleep 0.1
		[ $(($(date +%s%N) / 1000000 - t0)) -lt $(($2 * 1000)) ] ||
			{ echo "job $1 still running after $2 s"; return 1; }
	done &&
	say "job $1 ended $(($(date +%s%N) / 1000000 - t0)) ms after $3, status $(cat rc$1)"
}

test_expect_success MPI 'set up' '
	make_tinystories ts 64 &&
	write_config c.yaml "$MODEL" ts 64 2 16 1000000 </dev/null
'

test_expect_success MPI 'a stopped rank: the job ends within 60 s, one line names the collective and the rank' '
	start_job 1 --training.collective_timeout_s=2 &&
	kill -STOP $(pid_of 1 2) &&
	ended 1 60 "the stop" &&
	sed "s/^/# /" err1 &&
	test "$(cat rc1)" != 0 && test "$(cat rc1)" != 124 &&
	grep "collective_timeout_s" err1 >lines &&
	test $(wc -l <lines) = 1 &&
	# rank 2 is named stopped; a rank that waits, held by it, in an earlier
	# collective of the group may be named too (it has not arrived either)
	grep -E "^hp-train: rank [013]: (all-gather|reduce-scatter|all-reduce) on (dp_shard|dp|world) waited [0-9.]+ s \(training\.collective_timeout_s\): " lines &&
	grep -E ": (rank 2 has not arrived \(stopped\)|ranks ([013] \([a-z_ -]*\), )*2 \(stopped\)(, [013] \([a-z_ -]*\))* have not arrived)$" lines &&
	! grep "is gone" err1 &&
	sleep 1 && test -z "$(leftovers)"
'

test_expect_success MPI 'with collective_timeout_s 0 a stopped rank is waited for, and the run goes on' '
	start_job 2 --training.collective_timeout_s=0 --training.train_iters=40 &&
	kill -STOP $(pid_of 2 1) &&
	sleep 5 &&
	test ! -s rc2 &&
	test $(leftovers | wc -l) = 4 &&
	kill -CONT $(pid_of 2 1) &&
	ended 2 60 "the CONT" &&
	test "$(cat rc2)" = 0 &&
	grep -q "^step 40/40 " out2 &&
	! grep "collective_timeout_s" err2
'

test_done
