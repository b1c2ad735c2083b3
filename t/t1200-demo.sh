#!/bin/sh
test_description='examples/training_demo: the seed'\''s 8-rank demo, offline and online, end to end'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

DEMO=$HP_SRC_DIR/examples/training_demo

# demo MODE [ARGS...]: the script runs, the loss goes down, hp-verify's
# verdict is clean, the validation loss comes every 10 steps and after
# the last (the test loss after the last), and the results are where it says
demo () {
	mode=$1; shift
	HP_DEMO_DIR=$PWD/$mode sh $DEMO/run_parallel_$mode.sh "$@" >out 2>err || { cat out err; return 1; }
	cat out | grep "^==\|verdict\|mean loss\|results" &&
	grep -q "^   verdict: all [0-9]* checks of 2 steps match" out &&
	grep -q "^   comm: every rank" out &&
	n=$(jq -s length $mode/metrics.jsonl) &&
	test "$(jq -c "select(.eval_loss != null) | .step" $mode/metrics.jsonl | awk "{ printf \"%s \", \$0 }")" = \
		"$(awk -v n=$n "BEGIN { for (s = 10; s <= n; s += 10) printf \"%d \", s; if (n % 10) printf \"%d \", n }")" &&
	test "$(jq -c "select(.test_loss != null) | .step" $mode/metrics.jsonl)" = $n &&
	grep -q "^   validation loss after step [0-9]*: " out &&
	test -s $mode/metrics.jsonl && test -s $mode/hf/model.safetensors && test -s $mode/hf/config.json &&
	test -s $mode/checkpoints/global_step_$(jq -s length $mode/metrics.jsonl)/checkpoint.json &&
	grep -q "^results in $PWD/$mode: " out &&
	{ ! command -v gnuplot >/dev/null || test -s $mode/loss.png; }
}

test_expect_success MPI 'run_parallel_offline.sh: hp-data, hp-plan, hp-convert, hp-verify, hp-train on 8 ranks, export' '
	demo offline --training.train_iters=20
'

test_expect_success MPI 'train_pipeline.yaml: the demo model as 4 pipeline stages x FSDP 2 on 8 ranks, end to end' '
	HP_DEMO_DIR=$PWD/pipe sh $DEMO/run_parallel_offline.sh "$DEMO/train_pipeline.yaml" --training.train_iters=10 \
		>out 2>err || { cat out err; false; } &&
	grep -q "^   verdict: all [0-9]* checks of 2 steps match" out &&
	grep -q "^   comm: every rank" out && grep -q "^   step 10/10 " out &&
	test "$(jq -c ".pipeline.schedule, [.pipeline.stages[].layers]" pipe/plan.json | paste -sd " " -)" = \
		"\"1f1b\" [[0,1],[1,2],[2,3],[3,4]]" &&
	test -s pipe/hf/model.safetensors
'

test_expect_success MPI 'run_parallel_online.sh: the same, tokenizing while training' '
	demo online --training.train_iters=12
'

test_expect_success MPI 'a model folder in place of the demo model, with overrides' '
	demo offline "$DATA/ref/qwen3-moe-b" --training.train_iters=6 &&
	grep -q "pretrained_model_name_or_path: $DATA/ref/qwen3-moe-b" offline/train.yaml
'

test_expect_success MPI 'scripts/hp-launch plans, shards and trains in one go, and keeps shards that still fit' '
	make_tinystories ts 64 &&
	write_config hf.yaml "$DATA/stories260K/hf" ts 64 2 8 2 <<-YAML &&
	checkpoint: {save_ckpt: false}
	YAML
	sh "$HP_SRC_DIR/scripts/hp-launch" -n 2 -o run hf.yaml --fsdp_config.dp_shard_size=2 >out &&
	grep -q "^run.world_size  *2$" out && grep -q "^comm: every rank" out &&
	test -s run/shards/rank-00001-of-00002.safetensors &&
	touch -d "2000-01-01" run/shards/plan.json &&
	sh "$HP_SRC_DIR/scripts/hp-launch" -n 2 -o run hf.yaml --fsdp_config.dp_shard_size=2 >out &&
	test "$(stat -c %Y run/shards/plan.json)" = "$(date -d 2000-01-01 +%s)" &&
	test_must_fail_with 2 sh "$HP_SRC_DIR/scripts/hp-launch" -n x hf.yaml 2>err &&
	grep -q "^usage: hp-launch" err
'

test_done
