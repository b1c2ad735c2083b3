#!/bin/sh
test_description='hp-train under mpiexec: FSDP and HSDP equal the single-process run, and move what the plan says'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

REFS=$DATA/ref

# same_losses A B: every step's loss within 1e-5 relative
same_losses () {
	paste "$1" "$2" | awk -F'\t' '{
		split($1, a, "\"loss\": "); split(a[2], x, ","); split($2, b, "\"loss\": "); split(b[2], y, ",")
		d = (x[1] - y[1]) / y[1]; if (d < 0) d = -d
		if (d > 1e-5) { printf "step %d: %s vs %s\n", NR, x[1], y[1]; bad = 1 } }
		END { exit bad }'
}

# layout N OVERRIDES...: train under mpiexec -n N; losses and step-1 grads
# equal the single-process run's, and every rank's traffic equals the plan's
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

test_expect_success MPI 'tensor, context and expert parallelism are refused, not ignored' '
	test_must_fail_with 4 mpiexec -n 2 hp-train -q c.yaml --accelerator.ep_size=2 2>err &&
	grep -q "expert parallelism are not implemented in hp-train yet" err
'

test_done
