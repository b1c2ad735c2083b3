#!/bin/sh
test_description='the indexed dataset: documents inside rows (eod_mask_loss, reset_position_ids, reset_attention_mask) and shuffle'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

A=--accelerator
F=--fsdp_config
SEED8="$A.tp_size=2 $A.cp_size=2 $A.ep_size=2 $A.sequence_parallel=true $F.dp_shard_size=2 $F.edp_shard_size=2"
DOCS="--dataset.data_config.eod_mask_loss=true --dataset.data_config.reset_position_ids=true --dataset.data_config.reset_attention_mask=true"

# build/t/test-docs holds the semantics: a record of two documents gives
# the losses and gradients of the two run apart.  Here: hp-train acts on
# each setting, in every layout, and shuffles resumably.
test_expect_success 'setup: TinyStories texts, each ending in the EOD (2), as one token stream' '
	jq -c "{ids: (.ids + [2])}" "$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" >docs.jsonl &&
	hp-test-tool mkidx --vocab 512 -o docs docs.jsonl &&
	write_config st.yaml "$MODEL" docs 64 2 8 4 </dev/null &&
	sed -i "s/is_dataset_from_mr: true/is_dataset_from_mr: false/" st.yaml &&
	awk "/^plan_overrides:/ { on = 1; print; next } on && /^[^ ]/ { exit } on" \
		"$TEST_DIR/config/seed-8rank.yaml" | write_config k.yaml "$DATA/ref/qwen3-moe-b" docs 64 2 16 4 &&
	sed -i "s/is_dataset_from_mr: true/is_dataset_from_mr: false/" k.yaml
'

test_expect_success 'each setting changes the step; the table says where the EOD id came from' '
	hp-train st.yaml --max-steps 2 --metrics off.jsonl >out &&
	! grep -q "^data.documents_in_rows" out &&
	hp-train st.yaml --max-steps 2 --dataset.data_config.eod_mask_loss=true --metrics mask.jsonl >out &&
	grep -q "^data.documents_in_rows  *EOD id 2 (config.json.s eos_token_id); no loss where the input is EOD$" out &&
	hp-train st.yaml --max-steps 2 --dataset.data_config.reset_position_ids=true \
		--dataset.data_config.reset_attention_mask=true --metrics reset.jsonl >out &&
	grep -q "^data.documents_in_rows  *EOD id 2 .*; positions and attention restart after each EOD$" out &&
	hp-train -q st.yaml --max-steps 2 $DOCS --metrics both.jsonl &&
	hp-train -q st.yaml --max-steps 2 $DOCS --dataset.model_assets.tokenizer.eod_token_id=2 --metrics id.jsonl &&
	hp-train -q st.yaml --max-steps 2 $DOCS --dataset.model_assets.tokenizer.pretrained_model_name_or_path="$MODEL" \
		--metrics tok.jsonl &&
	for f in off mask reset both; do jq -c "[.loss, .grad_norm]" $f.jsonl | paste -sd " " -; done >all &&
	cat all && test $(sort -u all | wc -l) = 4 &&
	test "$(jq -c .loss both.jsonl)" = "$(jq -c .loss id.jsonl)" &&
	test "$(jq -c .loss both.jsonl)" = "$(jq -c .loss tok.jsonl)"
'

# t0930's bound: the parallel sums reassociate
test_expect_success MPI 'the seed'\''s 8 ranks with documents inside rows equal one process' '
	hp-train -q k.yaml $DOCS --dataset.model_assets.tokenizer.eod_token_id=2 --metrics one.jsonl &&
	mpiexec -n 8 hp-train -q k.yaml $SEED8 $DOCS --dataset.model_assets.tokenizer.eod_token_id=2 --metrics par.jsonl &&
	for s in 1 2 3 4; do
		a=$(metric one.jsonl $s loss) b=$(metric par.jsonl $s loss) &&
		awk -v a="$a" -v b="$b" "BEGIN { d = (a - b) / a; exit !(d < 1e-5 && d > -1e-5) }" ||
		{ echo "# step $s: $a against $b"; return 1; }
	done
'

test_expect_success 'shuffle: a permutation per epoch from the seed; a resumed run continues it' '
	hp-train -q st.yaml --training.train_iters=6 --checkpoint.save_ckpt=false --metrics plain.jsonl &&
	hp-train -q st.yaml --training.train_iters=6 --dataset.data_config.shuffle=true --checkpoint.checkpoint_dir=ck \
		--checkpoint.save_steps=3 --metrics a.jsonl --dump-params a.st &&
	hp-train -q st.yaml --training.train_iters=6 --dataset.data_config.shuffle=true --checkpoint.checkpoint_dir=ck \
		--checkpoint.restore_from=ck/global_step_3 --metrics b.jsonl --dump-params b.st &&
	cmp a.st b.st &&
	test "$(jq -c "select(.step > 3) | .loss" a.jsonl)" = "$(jq -c .loss b.jsonl)" &&
	hp-train -q st.yaml --training.train_iters=6 --dataset.data_config.shuffle=true --training.seed=7 \
		--checkpoint.save_ckpt=false --metrics c.jsonl &&
	test "$(jq -c .loss plain.jsonl)" != "$(jq -c .loss a.jsonl)" &&
	test "$(jq -c .loss a.jsonl)" != "$(jq -c .loss c.jsonl)" &&
	hp-train st.yaml --max-steps 1 --dataset.data_config.shuffle=true --checkpoint.save_ckpt=false >out &&
	grep -q "^data.shuffle  *the rows of each epoch in a permutation of (training.seed, epoch)$" out
'

test_expect_success 'refused by name: one reset without the other, online data, an EOD outside the vocabulary' '
	for bad in "4 --dataset.data_config.reset_position_ids=true" \
		"4 --dataset.data_config.reset_attention_mask=true" \
		"3 --dataset.data_config.eod_mask_loss=true --dataset.model_assets.tokenizer.eod_token_id=512"; do
		set -- $bad && code=$1 && shift &&
		rm -f x.jsonl &&
		test_must_fail_with $code hp-train -q st.yaml "$@" --metrics x.jsonl 2>err &&
		cat err && test $(wc -l <err) = 1 && ! test -e x.jsonl || return 1
	done &&
	grep -q "outside the model.s vocabulary" err &&
	jq -c "{text: .text}" "$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" | head -20 >t.jsonl &&
	cat >on.yaml <<-YAML &&
	model:
	  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained
	  pretrained_model_name_or_path: $MODEL
	training: {train_iters: 1, global_batch_size: 2, micro_batch_size: 1}
	dataset:
	  _target_: hyper_parallel.data.build_online_text_dataset
	  data_path: t.jsonl
	  data_transform: {max_seq_len: 32}
	  data_config: {eod_mask_loss: true}
	YAML
	test_must_fail_with 3 hp-train -q on.yaml 2>err &&
	cat err && grep -q "eod_mask_loss: for the indexed dataset" err
'

test_done
