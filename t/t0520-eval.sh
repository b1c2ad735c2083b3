#!/bin/sh
test_description='validation and test splits: Megatron'\''s split, evaluation that changes nothing, the same loss in every layout'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

A=--accelerator
F=--fsdp_config
SEED8="$A.tp_size=2 $A.cp_size=2 $A.ep_size=2 $A.sequence_parallel=true $F.dp_shard_size=2 $F.edp_shard_size=2"
# weights that do not move: AdamW with lr 0 changes nothing (its decay is scaled by lr too)
STILL="--lr_scheduler.lr_decay_style=constant --lr_scheduler.lr_config.lr=0 --lr_scheduler.lr_config.min_lr=0"

# records PREFIX FIRST N OUT LO HI: N records of PREFIX from FIRST, as
# JSONL ids, one per line, for hp-test-tool mkidx, wrapping within the
# part [LO, HI) as the evaluation does
records () {
	hp-test-tool dumpidx "$1" | sed -n '6,$p' >all.ids &&
	awk -v f="$2" -v n="$3" -v lo="$5" -v hi="$6" 'BEGIN { k = 0 } { r[NR - 1] = $0 }
		END { for (i = 0; i < n; i++) { j = lo + (f - lo + i) % (hi - lo); gsub(/ /, ",", r[j]);
		      print "{\"ids\":[" r[j] "]}" } }' all.ids >"$4"
}

test_expect_success 'setup: 884 TinyStories records, one document each' '
	make_tinystories ts 64 &&
	test "$(hp-test-tool dumpidx ts | sed -n 3p)" = "documents 884" &&
	write_config hf.yaml "$MODEL" ts 64 2 8 4 </dev/null &&
	awk "/^plan_overrides:/ { on = 1; print; next } on && /^[^ ]/ { exit } on" \
		"$TEST_DIR/config/seed-8rank.yaml" | write_config k.yaml "$DATA/ref/qwen3-moe-b" ts 64 2 16 4
'

# Megatron's _get_split_indices under Python 3.11 (t/unit/test-indexed.c holds more)
test_expect_success 'split: the documents of each part are Megatron'\''s ranges' '
	for c in "98,1,1 866 875" "969,30,1 856 883" "949/50/1 839 883"; do
		set -- $c &&
		hp-train hf.yaml --max-steps 1 --training.eval_iters=1 --dataset.data_config.split=$1 >out &&
		grep "^data.split" out &&
		grep -q "^data.split  *$1: train documents \[0, $2) of 884, validation \[$2, $3), test \[$3, 884)$" out ||
		return 1
	done &&
	hp-train hf.yaml --max-steps 1 --training.eval_iters=1 --dataset.data_config.split=1,1 >out &&
	grep -q "^data.split  *1,1: train documents \[0, 442) of 884, validation \[442, 884), test none$" out &&
	hp-train hf.yaml --max-steps 1 --training.eval_iters=1 --dataset.data_config.split=5,1 >out &&
	grep -q "^data.split  *5,1: train documents \[0, 737) of 884, validation \[737, 884), test none$" out
'

# the direct computation: the held-out records trained on for one step
# of weights that do not move, as one global batch in the same order
test_expect_success 'the validation and test losses are those of the held-out records, wrapping within the part' '
	hp-train -q hf.yaml $STILL --training.train_iters=1 --training.eval_iters=2 --metrics m.jsonl &&
	records ts 866 16 valid.jsonl 866 875 &&
	records ts 875 16 test.jsonl 875 884 &&
	hp-test-tool mkidx --vocab 512 -o valid valid.jsonl &&
	hp-test-tool mkidx --vocab 512 -o test test.jsonl &&
	for p in valid test; do
		write_config $p.yaml "$MODEL" $p 64 2 16 1 </dev/null &&
		hp-train -q $p.yaml $STILL --dataset.data_config.split=1,0,0 --metrics $p.m.jsonl || return 1
	done &&
	echo "# eval $(jq .eval_loss m.jsonl) = $(jq .loss valid.m.jsonl); test $(jq .test_loss m.jsonl) = $(jq .loss test.m.jsonl)" &&
	test "$(jq .eval_loss m.jsonl)" = "$(jq .loss valid.m.jsonl)" &&
	test "$(jq .test_loss m.jsonl)" = "$(jq .loss test.m.jsonl)" &&
	test "$(jq .eval_tokens m.jsonl)" = 1024 && test "$(jq .test_tokens m.jsonl)" = 1024
'

test_expect_success 'evaluation changes nothing: the same bits as a run without it' '
	hp-train -q hf.yaml --metrics no.jsonl --dump-params no.st &&
	hp-train hf.yaml --training.eval_iters=2 --training.eval_steps=1 --metrics ev.jsonl --dump-params ev.st >out &&
	test "$(jq -c "[.loss, .grad_norm]" no.jsonl)" = "$(jq -c "[.loss, .grad_norm]" ev.jsonl)" &&
	cmp no.st ev.st &&
	test "$(jq -c "[.step, (.eval_loss != null), (.test_loss != null)]" ev.jsonl | tr -d "\n")" = \
		"[1,true,false][2,true,false][3,true,false][4,true,true]" &&
	test $(grep -c "^eval step [1-4]/4 | validation loss [0-9.]* | ppl" out) = 4 &&
	grep -q "^test step 4/4 | test loss" out &&
	# the same after each evaluation: it starts the part afresh
	hp-train -q hf.yaml $STILL --training.eval_iters=1 --training.eval_steps=1 --metrics st.jsonl &&
	test $(jq .eval_loss st.jsonl | sort -u | wc -l) = 1
'

test_expect_success 'a run resumed from a checkpoint evaluates as the uninterrupted run' '
	hp-train -q hf.yaml --training.eval_iters=1 --training.eval_steps=2 \
		--checkpoint.checkpoint_dir=ck --checkpoint.save_steps=2 --metrics a.jsonl &&
	hp-train -q hf.yaml --training.eval_iters=1 --training.eval_steps=2 \
		--checkpoint.checkpoint_dir=ck --checkpoint.restore_from=ck/global_step_2 --metrics b.jsonl &&
	test "$(jq "select(.step == 4) | .eval_loss" a.jsonl)" = "$(jq "select(.step == 4) | .eval_loss" b.jsonl)"
'

# evals EXTRA...: 4 steps of the seed model with an evaluation every 2
evals () {
	hp-train -q k.yaml --training.eval_iters=1 --training.eval_steps=2 --metrics one.jsonl &&
	mpiexec -n 8 hp-train k.yaml $SEED8 --training.eval_iters=1 --training.eval_steps=2 \
		--metrics par.jsonl >par.out &&
	grep -q "^comm: every rank.s bytes per collective and mesh dim equal the plan.s estimate" par.out &&
	for s in 2 4; do
		a=$(metric one.jsonl $s eval_loss) b=$(metric par.jsonl $s eval_loss) &&
		echo "# step $s: one process $a, 8 ranks $b" &&
		awk -v a="$a" -v b="$b" "BEGIN { d = (a - b) / a; exit !(d < 1e-5 && d > -1e-5) }" || return 1
	done
}

# the losses of 8 ranks and one agree to 1e-5 relative (t0930's bound,
# the reassociated sums of the parallel forward); the weights after
# step 2 differ by as little, and the evaluation sees them
test_expect_success MPI 'the seed'\''s 8 ranks evaluate as one process does' '
	evals
'

# over ranks each reads its dp share of the evaluation batch: a bad id in
# rank 1's share stops every rank (none waits in a collective for it)
test_expect_success MPI 'a bad id in one rank'"'"'s share of the evaluation stops every rank, by name' '
	hp-test-tool dumpidx ts | sed -n "6,21p" | awk "{ gsub(/ /, \",\"); print \"{\\\"ids\\\":[\" \$0 \"]}\" }" >v.jsonl &&
	sed -i "6 s/\[\([0-9]*\),/[600,/" v.jsonl &&
	hp-test-tool mkidx --vocab 1024 -o vbad v.jsonl &&
	E="--training.eval_iters=1 --training.eval_steps=1 --dataset.valid_data_path=$PWD/vbad --checkpoint.save_ckpt=false" &&
	test_must_fail_with 4 timeout 120 mpiexec -n 2 hp-train -q hf.yaml $E --fsdp_config.dp_shard_size=2 2>err &&
	grep -q "rank 1 on .*vbad.: token id 600 in the validation after step 1 is outside the model.s vocabulary" err &&
	grep -q "evaluation after step 1: another rank could not read its share of the data" err &&
	! grep -q ": : " err
'

test_expect_success 'online data: split shares of the documents, and valid_data_path' '
	jq -c "{text: .text}" "$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" |
		sed -n "47,346p" >stories.jsonl &&
	sed -n "295,297p" stories.jsonl >held.jsonl &&
	online_config on.yaml stories.jsonl 64 1 </dev/null &&
	sed -i "s/adamw_lr: 1.0e-3/adamw_lr: 0/" on.yaml &&
	hp-train on.yaml --training.eval_iters=2 --metrics on.jsonl >out &&
	grep -q "^data.split  *98,1,1: train documents \[0, 294) of 300, validation \[294, 297), test \[297, 300)$" out &&
	grep -q "^data.documents  *294 of 300 in 1 file (the train split)$" out &&
	hp-train -q on.yaml --dataset.data_path=held.jsonl --dataset.data_config.split=1,0,0 \
		--training.global_batch_size=8 --metrics held.m.jsonl &&
	test "$(jq .eval_loss on.jsonl)" = "$(jq .loss held.m.jsonl)" &&
	hp-train on.yaml --training.eval_iters=2 --dataset.valid_data_path=held.jsonl --metrics v.jsonl >out &&
	grep -q "^data.split  *100,0,0: train documents \[0, 300) of 300; validation: 3 documents of .*held.jsonl, test none$" out &&
	test "$(jq .eval_loss v.jsonl)" = "$(jq .loss held.m.jsonl)"
'

test_expect_success 'bad settings are refused by name, before anything is written' '
	awk "BEGIN { printf \"{\\\"ids\\\":[\"; for (i = 0; i < 65; i++) printf \"%s%d\", i ? \",\" : \"\", 600 + i; print \"]}\" }" >big.jsonl &&
	hp-test-tool mkidx --vocab 1000 --records-of 65 -o big big.jsonl &&
	for bad in "4 --training.eval_iters=1 --dataset.valid_data_path=$PWD/big" \
		"3 --dataset.data_config.split=1,2,3,4" "3 --dataset.data_config.split=a" \
		"3 --dataset.data_config.split=0,0,0" "3 --training.eval_steps=2" "3 --training.eval_iters=-1" \
		"3 --dataset.valid_data_path=valid" \
		"3 --training.eval_iters=1 --dataset.valid_data_path=valid --dataset.data_config.split=98,1,1" \
		"3 --training.eval_iters=1 --dataset.data_config.split=100,0,0" \
		"4 --dataset.data_config.split=0,1,0"; do
		set -- $bad && code=$1 && shift &&
		rm -f x.jsonl &&
		test_must_fail_with $code hp-train -q hf.yaml "$@" --metrics x.jsonl 2>err &&
		cat err && test $(wc -l <err) = 1 && grep -q "split\|eval\|valid" err && ! test -e x.jsonl ||
		return 1
	done
'

test_done
