#!/bin/sh
test_description='supervised fine-tuning: conversations, the chat template, loss on the assistant'\''s tokens'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

# The ids and masks themselves are held to transformers by t/unit/test-chat.c;
# here they go through hp-data and hp-train.  The model is stories260K (and
# the Qwen3-MoE fixture for the seed's layout, same vocabulary) with its own
# tokenizer and the Mistral-Instruct template, whose <s> and </s> it has:
# tokc/ is the tokenizer folder with that template as chat_template.jinja,
# so "auto" finds it.

A=--accelerator
F=--fsdp_config
SEED8="$A.tp_size=2 $A.cp_size=2 $A.ep_size=2 $A.sequence_parallel=true $F.dp_shard_size=2 $F.edp_shard_size=2"

# conv_config FILE DATA SEQ ITERS [model] [extra yaml on stdin]: online_config's
# run on conversations with tokc's template, global 4 of micro 2
conv_config () {
	online_config "$1" "$2" "$3" "$4" &&
	sed -i -e "s|data_type: plaintext, text_keys: \[text\]|data_type: conversation|" \
		-e "s|^  data_path: .*|&\n  model_assets: {tokenizer: {pretrained_model_name_or_path: $PWD/tokc}}|" \
		-e "s|^  pretrained_model_name_or_path: .*|  pretrained_model_name_or_path: ${5:-$MODEL}|" "$1"
}

test_expect_success 'setup: a tokenizer folder with a chat template, conversations' '
	mkdir tokc && cp "$MODEL/tokenizer.json" "$MODEL/tokenizer_config.json" tokc/ &&
	cp "$DATA/chat/templates/mistral-instruct.jinja" tokc/chat_template.jinja &&
	head -n 80 "$HP_SRC_DIR/examples/stories260K/sft.jsonl" >conv.jsonl &&
	sed -n 3,5p conv.jsonl >three.jsonl
'

test_expect_success 'hp-data encode: labels are the ids of the replies and their </s>, -100 elsewhere' '
	hp-data encode --tokenizer tokc --chat-template auto three.jsonl >enc.jsonl &&
	test $(wc -l <enc.jsonl) = 3 &&
	jq -e "(.ids | length) == (.labels | length)" enc.jsonl >/dev/null &&
	jq -e "[.ids, .labels] | transpose | all(.[1] == -100 or .[1] == .[0])" enc.jsonl >/dev/null &&
	# <s>[INST] ... [/INST] is not a target; the reply and the closing </s> are
	jq -e ".ids[0] == 1 and .labels[0] == -100 and .ids[-1] == 2 and .labels[-1] == 2" enc.jsonl >/dev/null &&
	jq -e "(.labels | map(select(. != -100)) | length) > 10" enc.jsonl >/dev/null &&
	# the targets are one run: the reply, then the end of the conversation
	jq -e ".labels | (map(. != -100) | index(true)) as \$a | .[\$a:] | all(. != -100)" enc.jsonl >/dev/null &&
	hp-data encode --tokenizer tokc --chat-template auto --all-tokens three.jsonl >all.jsonl &&
	jq -e ".ids == .labels" all.jsonl >/dev/null
'

test_expect_success 'the loss of a packed row is the sum of its conversations run alone' '
	# two conversations of 212 and 205 tokens fill one row of 512 pairs
	head -n 2 three.jsonl >two.jsonl &&
	conv_config one.yaml two.jsonl 512 1 &&
	O1="--training.global_batch_size=1 --training.micro_batch_size=1 --optimizer.adamw_config.adamw_lr=0" &&
	hp-train -q one.yaml $O1 --metrics packed.jsonl >out &&
	test "$(jq .loss packed.jsonl)" != null &&
	: > sum &&
	for i in 1 2; do
		sed -n ${i}p two.jsonl >c$i.jsonl &&
		hp-train -q one.yaml $O1 --dataset.data_path=$PWD/c$i.jsonl --metrics m$i.jsonl &&
		n=$(sed -n ${i}p enc.jsonl | jq "[.labels[1:][] | select(. != -100)] | length") &&
		echo "$(jq .loss m$i.jsonl) $n" >>sum || return 1
	done &&
	total=$(awk "{ s += \$2 } END { print s }" sum) &&
	want=$(awk "{ s += \$1 * \$2 } END { printf \"%.9g\", s }" sum) &&
	got=$(awk -v l="$(jq .loss packed.jsonl)" -v n=$total "BEGIN { printf \"%.9g\", l * n }") &&
	echo "# packed: $got, alone: $want ($total targets)" &&
	# float sums of the same terms in another order: a few ulps of the total
	float_close "$got" "$want" $(awk -v w="$want" "BEGIN { print w * 1e-6 }")
'

test_expect_success 'offline (hp-data build --chat-template) trains the bits of online' '
	conv_config on.yaml conv.jsonl 128 6 &&
	hp-train on.yaml --metrics on.jsonl >out &&
	grep -q "^data.conversations  *rendered by the chat template; loss on the assistant" out &&
	grep -q "^data: [0-9]* conversations served cut to seq_length + 1 tokens" out &&
	hp-data build --tokenizer tokc --chat-template auto -o cv conv.jsonl 2>err &&
	grep -q "loss mask in cv.mask.bin/.idx" err &&
	test -s cv.mask.bin && test -s cv.mask.idx &&
	hp-test-tool dumpidx cv.mask | grep -q "^sequences 80$" &&
	sed -e "s|build_online_text_dataset|build_indexed_text_dataset|" -e "s|data_path: conv.jsonl|data_path: $PWD/cv|" \
		-e "s|data_transform: {data_type: conversation, max_seq_len: 128}|data_config: {seq_length: 128}|" \
		-e "/model_assets/d" on.yaml >off.yaml &&
	hp-train off.yaml --metrics off.jsonl >out &&
	grep -q "^data.conversations  *hp-data.s, with their loss mask" out &&
	jq -c "[.step, .loss, .grad_norm]" on.jsonl >a && jq -c "[.step, .loss, .grad_norm]" off.jsonl >b &&
	test $(wc -l <a) = 6 && cmp a b
'

test_expect_success MPI 'conversations over 2 ranks: each renders a share; the one process'"'"'s losses' '
	mpiexec -n 2 hp-train -q on.yaml --fsdp_config.dp_shard_size=2 --metrics on2.jsonl &&
	same_losses on2.jsonl on.jsonl &&
	one=$(jq -s "map(.data_tokens_read) | add" on.jsonl) && two=$(jq -s "map(.data_tokens_read) | add" on2.jsonl) &&
	echo "# tokens rendered: one process $one, the busier of 2 ranks $two" &&
	test $((two * 4)) -lt $((one * 3)) &&
	mpiexec -n 2 hp-train -q off.yaml --fsdp_config.dp_shard_size=2 --metrics off2.jsonl &&
	same_losses off2.jsonl on.jsonl
'

test_expect_success 'a plain build removes the mask of an earlier conversation build' '
	cp cv.bin cvp.bin && cp cv.idx cvp.idx && cp cv.mask.bin cvp.mask.bin && cp cv.mask.idx cvp.mask.idx &&
	hp-data build --tokenizer tokc -o cvp "$HP_SRC_DIR/examples/data/stories.jsonl" 2>/dev/null &&
	test -s cvp.bin && ! test -e cvp.mask.bin && ! test -e cvp.mask.idx
'

test_expect_success 'a mask that is not the dataset'\''s is refused' '
	hp-data build --tokenizer tokc --chat-template auto -o cv3 three.jsonl 2>/dev/null &&
	cp cv3.mask.bin cv.mask.bin && cp cv3.mask.idx cv.mask.idx &&
	test_must_fail_with 4 hp-train -q off.yaml 2>err &&
	test_one_line err && grep -q "cv.mask.idx.: 3 sequences, but .*cv.idx. has 80: not its mask" err &&
	# as many sequences, other lengths: the ChatML rendering of the same conversations
	hp-data build --tokenizer tokc --chat-template chatml -o cvc conv.jsonl 2>/dev/null &&
	cp cvc.mask.bin cv.mask.bin && cp cvc.mask.idx cv.mask.idx &&
	test_must_fail_with 4 hp-train -q off.yaml 2>err &&
	test_one_line err && grep -q "cv.mask.idx.: sequence 0 has [0-9]* marks for [0-9]* ids in .*cv.idx.: not its mask" err
'

test_expect_success MPI 'a conversation build on two ranks writes the bytes of one' '
	hp-data build --tokenizer tokc --chat-template auto -o one conv.jsonl 2>/dev/null &&
	timeout 120 mpiexec -n 2 hp-data build --tokenizer tokc --chat-template auto -o two conv.jsonl 2>/dev/null &&
	for x in bin idx mask.bin mask.idx; do cmp one.$x two.$x || return 1; done &&
	! ls | grep -q "part-"
'

test_expect_success 'shuffled conversations resume from a checkpoint where they left off' '
	conv_config rs.yaml conv.jsonl 128 6 <<-YAML &&
	checkpoint: {save_ckpt: true, save_steps: 3, checkpoint_dir: $PWD/ck}
	YAML
	S=--dataset.data_config.shuffle=true &&
	hp-train -q rs.yaml $S --metrics full.jsonl &&
	rm -rf ck2 && hp-train -q rs.yaml $S --training.train_iters=3 --checkpoint.checkpoint_dir=$PWD/ck2 &&
	hp-train -q rs.yaml $S --checkpoint.checkpoint_dir=$PWD/ck2 --checkpoint.restore_from=$PWD/ck2/global_step_3 \
		--metrics rest.jsonl &&
	jq -c "select(.step > 3) | [.step, .loss]" full.jsonl >a && jq -c "[.step, .loss]" rest.jsonl >b &&
	test $(wc -l <a) = 3 && cmp a b
'

test_expect_success MPI 'the seed'\''s 8-rank layout trains conversations as one process does' '
	conv_config moe.yaml conv.jsonl 128 5 "$DATA/ref/qwen3-moe-b" &&
	single moe moe.yaml &&
	layout moe moe.yaml 8 $SEED8
'

test_expect_success 'bad conversations are named by file and line, or counted' '
	{ sed -n 1,2p conv.jsonl; echo "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"bot\", \"content\": \"x\"}]}";
	  echo "{\"messages\": [{\"role\": \"user\"}]}"; sed -n 3,20p conv.jsonl; } >bad.jsonl &&
	conv_config bad.yaml bad.jsonl 128 2 &&
	test_must_fail_with 4 hp-train -q bad.yaml 2>err &&
	test_one_line err && grep -q "bad.jsonl. line 3: message 2: unknown role .bot." err &&
	sed -i "/^dataset:/a\\  data_config: {skip_invalid_lines: true}" bad.yaml &&
	hp-train bad.yaml >out &&
	grep -q "^data.skipped_invalid_lines  *2$" out &&
	test_must_fail_with 4 hp-data encode --tokenizer tokc --chat-template auto bad.jsonl >/dev/null 2>err &&
	test_one_line err && grep -q "bad.jsonl. line 3: message 2: unknown role" err &&
	# the template refuses roles that do not alternate: its own message, with the line
	{ echo "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}, {\"role\": \"user\", \"content\": \"y\"}]}"; } >alt.jsonl &&
	test_must_fail_with 4 hp-data encode --tokenizer tokc --chat-template auto alt.jsonl >/dev/null 2>err &&
	test_one_line err && grep -q "alt.jsonl. line 1: .*Conversation roles must alternate" err &&
	printf "just text\n" >plain.txt &&
	test_must_fail_with 4 hp-data encode --tokenizer tokc --chat-template auto plain.txt 2>err &&
	test_one_line err && grep -q "conversations are read from JSONL" err
'

# Loading the tokenizer and compiling the template, then rendering,
# masking and writing the ids and their mask: every allocation can fail.
test_expect_success 'a failed allocation in a conversation build is reported and leaves nothing' '
	for n in $(seq 1 120) $(seq 130 37 1500) 3000 6000; do
		rm -f fa.*
		HP_FAIL_ALLOC=$n hp-data build --tokenizer tokc --chat-template auto -o fa three.jsonl 2>err
		rc=$?
		test $rc = 5 -o $rc = 0 || { echo "HP_FAIL_ALLOC=$n exit $rc"; cat err; return 1; }
		test_no_sanitizer_report err || return 1
		test $rc = 0 || { test_one_line err && test -z "$(ls | grep -e "^fa\.")"; } ||
			{ echo "HP_FAIL_ALLOC=$n"; cat err; return 1; }
	done &&
	hp-data build --tokenizer tokc --chat-template auto -o fa three.jsonl 2>/dev/null &&
	test -s fa.mask.bin
'

test_expect_success 'settings that would be ignored, and templates that cannot be found, are refused' '
	online_config pl.yaml conv.jsonl 64 1 &&
	test_must_fail_with 3 hp-train -q pl.yaml --dataset.data_transform.role_key=from 2>err &&
	test_one_line err && grep -q "role_key: only with data_type: conversation" err &&
	test_must_fail_with 3 hp-train -q pl.yaml --dataset.model_assets.chat_template=chatml 2>err &&
	test_one_line err && grep -q "chat_template: only with data_type: conversation" err &&
	conv_config nt.yaml conv.jsonl 64 1 &&
	test_must_fail_with 3 hp-train -q nt.yaml --dataset.model_assets.tokenizer.pretrained_model_name_or_path=$MODEL 2>err &&
	test_one_line err && grep -q "no chat template" err &&
	test_must_fail_with 3 hp-train -q nt.yaml --dataset.model_assets.chat_template=llama9 2>err &&
	test_one_line err && grep -q "chat template .llama9. is not known" err &&
	test_must_fail_with 3 hp-data build --tokenizer tokc --chat-template auto --append-eod -o x conv.jsonl 2>err &&
	test_one_line err && ! test -e x.bin &&
	test_must_fail_with 2 hp-data encode --tokenizer tokc --role-key from conv.jsonl 2>err &&
	grep -q "role-key is an option of conversations" err &&
	sed "s|data_path: .*|data_path: $PWD/cvp|" off.yaml >nomask.yaml &&
	test_must_fail_with 4 hp-train -q nomask.yaml --dataset.data_transform.data_type=conversation 2>err &&
	test_one_line err && grep -q "has no loss mask" err
'

test_done
