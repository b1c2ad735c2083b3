#!/bin/sh
test_description='hp-train online mode: JSONL/text tokenized while training, packed rows'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

test_expect_success 'setup: the TinyStories texts of the tokenizer vectors as JSONL' '
	jq -c "{text: .text}" "$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" |
		sed -n "47,346p" >stories.jsonl &&
	test $(wc -l <stories.jsonl) = 300 &&
	jq -c "{text: .text}" "$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" |
		sed -n "347,546p" >austen.jsonl &&
	test $(wc -l <austen.jsonl) = 200
'

test_expect_success 'online training on text new to the model (Austen) lowers the loss' '
	online_config on.yaml austen.jsonl 128 30 &&
	hp-train on.yaml --metrics m.jsonl >out &&
	grep -q "^data.documents  *196 of 200 in 1 file (the train split)$" out &&
	grep -q "^data.eod_id  *2$" out &&
	first=$(head -n 5 m.jsonl | jq -s "map(.loss) | add / length") &&
	last=$(tail -n 5 m.jsonl | jq -s "map(.loss) | add / length") &&
	echo "loss $first -> $last" &&
	awk -v a="$first" -v b="$last" "BEGIN { exit !(b < a - 0.2) }"
'

test_expect_success 'a packed row gives each document the loss it has alone' '
	hp-test-tool packcheck "$MODEL" stories.jsonl 512 >pc &&
	cat pc &&
	test $(grep -c "^document" pc) -ge 3
'

# Qwen3-Next (random init, the stories tokenizer): in a packed row the
# causal conv and the delta rule start afresh at each document, which
# crosses the rule's chunks of 64 (a document from 84 to 169).
test_expect_success 'Qwen3-Next: a packed row gives each document the loss it has alone' '
	mkdir -p qn && cp "$MODEL"/tokenizer*.json qn/ &&
	jq ".vocab_size = 512 | .max_position_embeddings = 256" "$DATA/hf/tf5/qwen3_next-default/config.json" \
		>qn/config.json &&
	cat >qn.yaml <<-YAML &&
	model:
	  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_config
	  config_path: $PWD/qn/config.json
	training: {train_iters: 1, global_batch_size: 1, micro_batch_size: 1, seed: 7}
	dataset:
	  _target_: hyper_parallel.data.build_indexed_text_dataset
	  data_path: none
	  data_config: {seq_length: 256, is_dataset_from_mr: true}
	YAML
	hp-plan qn.yaml --world 1 -o qn.json &&
	hp-convert -q --plan qn.json -o qns &&
	hp-convert -q --export qns -o qnx && cp qn/tokenizer*.json qnx/ &&
	hp-test-tool packcheck qnx stories.jsonl 256 >pc &&
	cat pc &&
	grep -q "^document at 84, 85 tokens" pc
'

test_expect_success 'documents longer than a row are split, not dropped' '
	online_config short.yaml stories.jsonl 16 3 &&
	hp-train -q short.yaml --metrics s.jsonl &&
	test $(wc -l <s.jsonl) = 3
'

test_expect_success 'shuffle: a seed fixes the order; another seed changes it' '
	online_config sh.yaml stories.jsonl 64 6 &&
	hp-train -q sh.yaml --dataset.data_config.shuffle=true --metrics a.jsonl &&
	hp-train -q sh.yaml --dataset.data_config.shuffle=true --metrics b.jsonl &&
	hp-train -q sh.yaml --dataset.data_config.shuffle=true --training.seed=99 --metrics c.jsonl &&
	jq .loss a.jsonl >la && jq .loss b.jsonl >lb && jq .loss c.jsonl >lc &&
	cmp la lb && ! cmp -s la lc
'

# Over ranks every rank packs the one process's rows, but each tokenizes
# only its share of the documents ahead (the others' tokens come
# all-gathered): 20 documents, shuffled, rows of 64 over 8 steps (epochs
# wrap), 2 ranks of FSDP and 4 of 2 stages x FSDP 2; then 300 documents
# over 1, 2 and 4 ranks, where a step holds enough for the shares to show.
test_expect_success MPI 'over ranks each tokenizes a share of the documents; the rows are the one process'"'"'s' '
	head -n 20 stories.jsonl >twenty.jsonl &&
	online_config tw.yaml twenty.jsonl 64 8 <<-YAML &&
	checkpoint: {save_ckpt: false}
	YAML
	S=--dataset.data_config.shuffle=true &&
	hp-train -q tw.yaml $S --metrics t1.jsonl &&
	mpiexec -n 2 hp-train -q tw.yaml $S --fsdp_config.dp_shard_size=2 --metrics t2.jsonl &&
	same_losses t2.jsonl t1.jsonl &&
	mpiexec -n 4 hp-train -q tw.yaml $S --accelerator.pp_size=2 --fsdp_config.dp_shard_size=2 --metrics t4.jsonl &&
	same_losses t4.jsonl t1.jsonl &&
	one=$(jq -s "map(.data_tokens_read) | add" t1.jsonl) &&
	two=$(jq -s "map(.data_tokens_read) | add" t2.jsonl) &&
	four=$(jq -s "map(.data_tokens_read) | add" t4.jsonl) &&
	echo "# 20 documents, 2-3 a step: tokens tokenized by one process $one, the busiest of 2 ranks $two, of 4 $four" &&
	test $((two * 4)) -lt $((one * 3)) && test $((four * 2)) -lt $one &&
	# 300 documents, about 10 a step: the shares near 1/2 and 1/4
	sed "s/twenty.jsonl/stories.jsonl/" tw.yaml >st.yaml &&
	G=--training.global_batch_size=16 &&
	hp-train -q st.yaml $S $G --metrics u1.jsonl &&
	mpiexec -n 2 hp-train -q st.yaml $S $G --fsdp_config.dp_shard_size=2 --metrics u2.jsonl &&
	mpiexec -n 4 hp-train -q st.yaml $S $G --fsdp_config.dp_shard_size=4 --metrics u4.jsonl &&
	same_losses u4.jsonl u1.jsonl &&
	one=$(jq -s "map(.data_tokens_read) | add" u1.jsonl) &&
	two=$(jq -s "map(.data_tokens_read) | add" u2.jsonl) &&
	four=$(jq -s "map(.data_tokens_read) | add" u4.jsonl) &&
	echo "# 300 documents: one process $one, the busiest of 2 ranks $two, of 4 $four" &&
	test $((two * 100)) -lt $((one * 60)) && test $((four * 100)) -lt $((one * 36))
'

test_expect_success 'text files: one document per line, blank lines skipped' '
	printf "Once upon a time, there was a cat.\n\nThe cat liked milk.\n   \nThe end.\n" >t.txt &&
	online_config txt.yaml t.txt 32 2 &&
	hp-train txt.yaml >out &&
	grep -q "^data.documents  *3 of 3 in 1 file (the train split)$" out &&
	grep -q "^data.empty_lines  *2$" out
'

test_expect_success 'invalid JSON stops before training with the file and line' '
	{ head -n 3 stories.jsonl; echo "{\"text\": broken"; tail -n 2 stories.jsonl; } >bad.jsonl &&
	online_config bad.yaml bad.jsonl 64 2 &&
	test_must_fail_with 4 hp-train -q bad.yaml --metrics x.jsonl 2>err &&
	test_one_line err && grep -q "bad.jsonl. line 4: invalid JSON" err &&
	test ! -e x.jsonl
'

test_expect_success 'invalid UTF-8 stops with the line; skip_invalid_lines counts and skips' '
	{ head -n 2 stories.jsonl; printf "bad \\377 byte\n"; } >bad.txt &&
	online_config badu.yaml bad.txt 64 1 &&
	test_must_fail_with 4 hp-train -q badu.yaml 2>err &&
	grep -q "bad.txt. line 3: invalid UTF-8" err &&
	hp-train badu.yaml --dataset.data_config.skip_invalid_lines=true >out &&
	grep -q "^data.skipped_invalid_lines  *1$" out
'

test_expect_success 'a missing text key is an error naming it' '
	echo "{\"body\": \"x\"}" >nokey.jsonl &&
	online_config nk.yaml nokey.jsonl 64 1 &&
	test_must_fail_with 4 hp-train -q nk.yaml 2>err &&
	grep -q "text key .text. is missing" err
'

test_done
