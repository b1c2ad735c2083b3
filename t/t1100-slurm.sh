#!/bin/sh
test_description='scripts/hp-slurm.sbatch on a real local Slurm: trains on 8 tasks, resumes after a requeue, refuses a plan for another size'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

# A one-node Slurm of our own: munged, slurmctld and slurmd from Debian's
# slurm-wlm, with their sockets, ports, state and logs under the scratch
# folder, started here and stopped by PID at the end.
SL=$PWD/slurm
export SLURM_CONF=$SL/slurm.conf
have_slurm () {
	command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null &&
		command -v munged >/dev/null && command -v mpiexec >/dev/null && [ "$(id -u)" = 0 ]
}
if have_slurm; then test_set_prereq SLURM; fi

stop_slurm () {
	for d in slurmd slurmctld munged; do
		[ -s "$SL/$d.pid" ] || continue
		p=$(cat "$SL/$d.pid") && kill "$p" 2>/dev/null || continue
		i=0 && while kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
		kill -9 "$p" 2>/dev/null
	done
	return 0
}
trap stop_slurm EXIT

test_expect_success SLURM 'start munged, slurmctld and slurmd (8 task slots)' '
	mkdir -p $SL/state $SL/spool &&
	host=$(hostname -s) && port=$((17000 + $$ % 1000 * 2)) &&
	dd if=/dev/urandom of=$SL/munge.key bs=1024 count=1 2>/dev/null && chmod 600 $SL/munge.key &&
	munged --force --socket=$SL/munge.sock --key-file=$SL/munge.key --pid-file=$SL/munged.pid \
		--log-file=$SL/munged.log --seed-file=$SL/munged.seed &&
	cat >$SL/slurm.conf <<-EOF &&
	ClusterName=hptest
	SlurmctldHost=$host
	SlurmUser=root
	SlurmctldPort=$port
	SlurmdPort=$((port + 1))
	AuthType=auth/munge
	AuthInfo=socket=$SL/munge.sock
	StateSaveLocation=$SL/state
	SlurmdSpoolDir=$SL/spool
	SlurmctldPidFile=$SL/slurmctld.pid
	SlurmdPidFile=$SL/slurmd.pid
	SlurmctldLogFile=$SL/slurmctld.log
	SlurmdLogFile=$SL/slurmd.log
	ProctrackType=proctrack/linuxproc
	TaskPlugin=task/none
	SelectType=select/cons_tres
	SelectTypeParameters=CR_CPU
	MpiDefault=none
	ReturnToService=2
	KillWait=2
	MinJobAge=10
	SlurmdParameters=config_overrides
	JobAcctGatherType=jobacct_gather/none
	AccountingStorageType=accounting_storage/none
	NodeName=$host CPUs=8 RealMemory=4000 State=UNKNOWN
	PartitionName=hp Nodes=$host Default=YES MaxTime=INFINITE State=UP
	EOF
	slurmctld -f $SLURM_CONF && slurmd -f $SLURM_CONF &&
	i=0 && while ! sinfo -h -o %t 2>/dev/null | grep -q idle; do
		sleep 0.5; i=$((i + 1)); [ $i -lt 60 ] || { cat $SL/slurmctld.log $SL/slurmd.log; return 1; }
	done &&
	sinfo
'

test_expect_success SLURM 'setup: a MoE config that saves every 2 steps' '
	make_tinystories ts 64 &&
	write_config moe.yaml "$DATA/ref/qwen3-moe-b" ts 64 2 16 12 <<-YAML
	accelerator: {tp_size: 2, cp_size: 2, ep_size: 2, sequence_parallel: true}
	fsdp_config: {dp_shard_size: 2, edp_shard_size: 2}
	checkpoint: {checkpoint_dir: ck, save_steps: 2}
	YAML
'

SCRIPT=$HP_SRC_DIR/scripts/hp-slurm.sbatch

test_expect_success SLURM 'sbatch --wait: plans, shards and trains over 8 tasks with srun --mpi=pmi2' '
	HP_BIN=$HP_BUILD_DIR/bin sbatch --wait --ntasks=8 -o job1.out $SCRIPT moe.yaml --checkpoint.checkpoint_dir=ck1 &&
	cat job1.out &&
	grep -q "^run.world_size  *8$" job1.out &&
	grep -q "^step 12/12 " job1.out &&
	grep -q "^comm: every rank" job1.out &&
	test "$(cat ck1/latest_checkpoint_iteration.txt)" = 12 &&
	test -s hp-run-hp-train/shards/rank-00007-of-00008.safetensors
'

test_expect_success SLURM 'scontrol requeue: the job starts again and resumes from its newest checkpoint' '
	rm -rf hp-run-hp-train ck2 &&
	id=$(HP_BIN=$HP_BUILD_DIR/bin HP_CKPT_PAUSE=1 sbatch --parsable --ntasks=8 -o job2.out $SCRIPT moe.yaml \
		--checkpoint.checkpoint_dir=ck2) &&
	i=0 && while [ "$(cat ck2/latest_checkpoint_iteration.txt 2>/dev/null)" != 4 ]; do
		sleep 0.2; i=$((i + 1)); [ $i -lt 1500 ] || { cat job2.out; return 1; }
	done &&
	scontrol requeue $id &&
	# Slurm holds a requeued batch job back two minutes; once it is pending
	# and the node is idle again (its old credential revoked and cleaned
	# up: a start before that is killed), ask for it to start now
	i=0 && while ! grep -q "(restart 1)" job2.out; do
		if [ "$(squeue -h -j $id -o %T 2>/dev/null)" = PENDING ] && sinfo -h -o %t | grep -qx idle; then
			sleep 1 && scontrol update JobId=$id StartTime=now 2>/dev/null
		fi
		sleep 0.5; i=$((i + 1))
		[ $i -lt 400 ] || { scontrol show job $id; cat job2.out; return 1; }
	done &&
	i=0 && while squeue -h -j $id 2>/dev/null | grep -q .; do
		sleep 0.5; i=$((i + 1)); [ $i -lt 600 ] || { cat job2.out; return 1; }
	done &&
	cat job2.out &&
	grep -q "(restart 1)" job2.out &&
	grep -q "^checkpoint: resumed from .ck2/global_step_[0-9]*. at step [0-9]*" job2.out &&
	grep -q "^step 12/12 " job2.out &&
	test "$(cat ck2/latest_checkpoint_iteration.txt)" = 12
'

test_expect_success SLURM 'a job with more tasks than its plan was made for stops at once, saying so' '
	hp-plan moe.yaml --world 4 --accelerator.tp_size=1 --accelerator.cp_size=1 --accelerator.ep_size=4 \
		--fsdp_config.dp_shard_size=4 --fsdp_config.edp_shard_size=1 -o plan4.json &&
	! HP_BIN=$HP_BUILD_DIR/bin HP_RUN_DIR=run4 sbatch --wait --ntasks=8 -o job3.out $SCRIPT plan4.json &&
	cat job3.out &&
	grep -q "the plan is for 4 ranks, this job has 8" job3.out &&
	! grep -q "^step 1/" job3.out
'

test_expect_success SLURM 'stop the daemons' '
	stop_slurm
'

test_done
