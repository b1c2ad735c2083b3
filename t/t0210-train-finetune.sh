#!/bin/sh
test_description='stories260K fine-tune: the loss goes down, runs are bit-reproducible'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

test_expect_success 'pack the TinyStories vector ids into records of 129 tokens' '
	make_tinystories ts 128 &&
	hp-test-tool dumpidx ts >dump &&
	test -s ts.bin && test -s ts.idx
'

test_expect_success '200 steps of fine-tuning lower the loss' '
	write_config train.yaml "$MODEL" ts 128 4 8 200 &&
	hp-train train.yaml --metrics m1.jsonl >out &&
	test $(wc -l <m1.jsonl) = 200 &&
	jq -r .loss m1.jsonl >loss1 &&
	first=$(head -n 10 loss1 | awk "{ s += \$1 } END { print s / NR }") &&
	last=$(tail -n 10 loss1 | awk "{ s += \$1 } END { print s / NR }") &&
	echo "mean loss, steps 1-10: $first; steps 191-200: $last" &&
	awk -v a="$first" -v b="$last" "BEGIN { exit !(b < a - 0.1) }"
'

test_expect_success 'the step lines and the table go to stdout' '
	grep -q "^step 200/200 | loss " out &&
	grep -q "^spec.num_hidden_layers  *5$" out &&
	grep -q "^run.grad_accumulation_steps  *2$" out
'

test_expect_success 'a second identical run gives a bit-identical loss sequence' '
	hp-train -q train.yaml --metrics m2.jsonl &&
	jq -r "[.step, .loss, .grad_norm, .lr] | @tsv" m1.jsonl >a &&
	jq -r "[.step, .loss, .grad_norm, .lr] | @tsv" m2.jsonl >b &&
	cmp a b
'

test_expect_success 'the thread count does not change a single bit of the losses' '
	write_config thr.yaml "$MODEL" ts 128 8 8 4 &&
	OPENBLAS_NUM_THREADS=1 hp-train -q thr.yaml --metrics t1.jsonl &&
	OPENBLAS_NUM_THREADS=3 hp-train -q thr.yaml --metrics t3.jsonl &&
	jq -r "[.loss, .grad_norm] | @tsv" t1.jsonl >a && jq -r "[.loss, .grad_norm] | @tsv" t3.jsonl >b &&
	cmp a b
'

# At each CPU level this machine has (HP_CPU caps it; the lm_head product,
# 1024 x 512 x 64, is large enough for hp_sgemm to split it over threads):
# 1, 2 and 3 threads give the same losses and the same step-1 gradients,
# bit for bit.  avx2 and avx512 also equal each other (same operations in
# the same order); baseline (no FMA) has its own bits.
test_expect_success 'at every CPU level, 1, 2 and 3 threads give the same bits' '
	levels=$(hp-test-tool cpulevels) &&
	echo "# levels: $levels" &&
	for l in $levels; do
		for t in 1 2 3; do
			HP_CPU=$l HP_NUM_THREADS=$t hp-train -q thr.yaml --metrics l$l-$t.jsonl \
				--dump-grads g$l-$t.safetensors &&
			jq -r "[.loss, .grad_norm] | @tsv" l$l-$t.jsonl >a$l-$t || return 1
		done &&
		cmp a$l-1 a$l-2 && cmp a$l-1 a$l-3 &&
		cmp g$l-1.safetensors g$l-2.safetensors && cmp g$l-1.safetensors g$l-3.safetensors || return 1
	done &&
	if test -f aavx512-1; then cmp aavx2-1 aavx512-1 && cmp gavx2-1.safetensors gavx512-1.safetensors; fi
'

test_expect_success 'HP_CPU with another value is a usage error' '
	{ HP_CPU=sse9 hp-train -q thr.yaml 2>err; test $? = 2; } &&
	grep -q "HP_CPU=.sse9.: expected baseline, avx2 or avx512" err
'

test_expect_success 'metrics lines carry the documented keys' '
	jq -e "has(\"step\") and has(\"loss\") and has(\"grad_norm\") and has(\"lr\") and has(\"tokens\") and has(\"step_time_s\") and has(\"tokens_per_s\")" m1.jsonl >/dev/null &&
	test "$(metric m1.jsonl 1 tokens)" = 1024
'

test_expect_success 'the cosine schedule with warmup is what the metrics report' '
	float_close "$(metric m1.jsonl 1 lr)" 1e-4 1e-12 &&
	float_close "$(metric m1.jsonl 10 lr)" 1e-3 1e-12 &&
	float_close "$(metric m1.jsonl 200 lr)" 1e-4 1e-12
'

test_expect_success MPI 'mpiexec -n 1 gives the same losses as a plain run' '
	write_config short.yaml "$MODEL" ts 128 4 8 5 &&
	hp-train -q short.yaml --metrics s1.jsonl &&
	mpiexec -n 1 hp-train -q short.yaml --metrics s2.jsonl &&
	jq -r .loss s1.jsonl >a && jq -r .loss s2.jsonl >b && cmp a b
'

test_expect_success MPI 'a world the config cannot split is refused with the key and exit 3' '
	test_must_fail_with 3 mpiexec -n 3 hp-train -q short.yaml --metrics w.jsonl 2>err &&
	grep -q "global_batch_size: 8 is not a multiple of micro_batch_size\*dp = 4\*3" err &&
	test ! -e w.jsonl
'

test_expect_success 'overrides change the run: --training.train_iters=3' '
	hp-train -q short.yaml --training.train_iters=3 --metrics o.jsonl &&
	test $(wc -l <o.jsonl) = 3
'

test_done
