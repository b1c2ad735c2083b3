#!/bin/sh
test_description='hostile inputs: an index that leaves its folder, bytes outside every tensor, token ids and dimensions out of range, an over-long path, a bad tokenizer in two tools'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

# st_names FILE: the tensor names in a safetensors header, one a line
st_names () {
	n=$(od -An -tu8 -N8 "$1" | tr -d " ") &&
	tail -c +9 "$1" | head -c "$n" | jq -r "del(.__metadata__) | keys[]"
}

# model_cfg NAME JQ: m-NAME, the model folder with config.json passed through JQ
model_cfg () {
	rm -rf "m-$1" && mkdir "m-$1" &&
	ln -s "$MODEL/model.safetensors" "m-$1/model.safetensors" &&
	jq "$2" "$MODEL/config.json" >"m-$1/config.json" &&
	write_config "c-$1.yaml" "$PWD/m-$1" ref 128 2 2 1 </dev/null
}

# plan_cfg NAME SRC JQ: c-NAME.yaml, a from_config run of SRC passed through JQ
plan_cfg () {
	jq "$3" "$2" >"cfg-$1.json" &&
	cat >"c-$1.yaml" <<-YAML
	model:
	  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_config
	  config_path: $PWD/cfg-$1.json
	training: {train_iters: 1, global_batch_size: 1, micro_batch_size: 1}
	dataset:
	  _target_: hyper_parallel.data.build_indexed_text_dataset
	  data_path: none
	  data_config: {seq_length: 64, is_dataset_from_mr: true}
	YAML
}

test_expect_success 'setup' '
	make_refbatch ref &&
	write_config good.yaml "$MODEL" ref 128 2 2 1 </dev/null &&
	st_names "$MODEL/model.safetensors" >names &&
	test $(wc -l <names) -gt 10
'

# index NAME ENTRY: m-NAME holds config.json and an index that puts every
# tensor of the model in the shard ENTRY
index () {
	rm -rf "m-$1" && mkdir "m-$1" && cp "$MODEL/config.json" "m-$1/" &&
	jq -R --arg f "$2" "{(.): \$f}" names | jq -s "{weight_map: add}" \
		>"m-$1/model.safetensors.index.json" &&
	write_config "c-$1.yaml" "$PWD/m-$1" ref 128 2 2 1 </dev/null
}

test_expect_success 'a weight_map entry outside the model folder is refused, not followed' '
	cp "$MODEL/model.safetensors" outside.safetensors &&
	index up ../outside.safetensors &&
	expect_fail 4 "m-up/model.safetensors.index.json.: weight_map entry .\.\./outside.safetensors. for tensor .*outside the model folder" \
		hp-train c-up.yaml &&
	index abs "$PWD/outside.safetensors" &&
	expect_fail 4 "m-abs/model.safetensors.index.json.: weight_map entry ./.*/outside.safetensors. .*outside the model folder" \
		hp-train c-abs.yaml &&
	index deep x/../../outside.safetensors &&
	expect_fail 4 "weight_map entry .x/\.\./\.\./outside.safetensors. .*outside the model folder" \
		hp-train c-deep.yaml &&
	index dotdot .. &&
	expect_fail 4 "weight_map entry .\.\.. .*outside the model folder" hp-train c-dotdot.yaml &&
	# a subfolder stays inside, and ".." inside a name is no ".." component
	index sub sub/w..safetensors &&
	mkdir m-sub/sub && cp "$MODEL/model.safetensors" m-sub/sub/w..safetensors &&
	hp-train -q c-sub.yaml
'

test_expect_success 'bytes after the last tensor are refused, as the HF library does' '
	mkdir -p m-trail && cp "$MODEL/config.json" m-trail/ &&
	{ cat "$MODEL/model.safetensors" && printf "12345678"; } >m-trail/model.safetensors &&
	write_config c-trail.yaml "$PWD/m-trail" ref 128 2 2 1 </dev/null &&
	expect_fail 4 "m-trail/model.safetensors.: 8 trailing bytes after the last tensor" hp-train c-trail.yaml &&
	{ cat "$MODEL/model.safetensors" && printf "x"; } >m-trail/model.safetensors &&
	expect_fail 4 "m-trail/model.safetensors.: 1 trailing bytes after the last tensor" hp-train c-trail.yaml &&
	# what hp writes has none: a checkpoint resumes, its export trains
	write_config two.yaml "$MODEL" ref 128 2 2 2 </dev/null &&
	hp-train -q two.yaml --checkpoint.checkpoint_dir=ck --max-steps 1 &&
	hp-train -q two.yaml --checkpoint.checkpoint_dir=ck --checkpoint.restore_from=LATEST &&
	hp-convert -q --export ck/global_step_1/model -o ex &&
	write_config ex.yaml "$PWD/ex" ref 128 2 2 1 </dev/null &&
	hp-train -q ex.yaml
'

test_expect_success 'bytes between two tensors are refused, as the HF library does' '
	mkdir -p m-gap && cp "$MODEL/config.json" m-gap/ &&
	mkst m-gap/model.safetensors "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[24,40]}}" 40 &&
	write_config c-gap.yaml "$PWD/m-gap" ref 128 2 2 1 </dev/null &&
	expect_fail 4 "m-gap/model.safetensors.: bytes \[16, 24) of the data section belong to no tensor (a gap before .b.)" hp-train c-gap.yaml &&
	# what hp writes has none: the shards of hp-convert load on their ranks
	{ ! test_have_prereq MPI || {
		write_config four.yaml "$MODEL" ref 128 2 4 1 </dev/null &&
		hp-plan four.yaml --world 2 -o plan.json &&
		hp-convert -q --plan plan.json -o shards "$MODEL" &&
		mpiexec -n 2 hp-train -q plan.json --shards shards
	}; }
'

test_expect_success 'token ids in config.json outside the vocabulary are refused by name' '
	model_cfg bos ".bos_token_id = 512" &&
	expect_fail 3 "m-bos/config.json.: bos_token_id 512 is not below vocab_size 512$" hp-train c-bos.yaml &&
	model_cfg eos ".eos_token_id = 4096" &&
	expect_fail 3 "m-eos/config.json.: eos_token_id 4096 is not below vocab_size 512$" hp-train c-eos.yaml &&
	model_cfg eosl ".eos_token_id = [2, 600]" &&
	expect_fail 3 "m-eosl/config.json.: eos_token_id\[1\] 600 is not below vocab_size 512$" hp-train c-eosl.yaml &&
	model_cfg eosn ".eos_token_id = [2, -5]" &&
	expect_fail 3 "m-eosn/config.json.: eos_token_id\[1\] -5 is negative (null means none)$" hp-train c-eosn.yaml &&
	model_cfg bosn ".bos_token_id = -1" &&
	expect_fail 3 "m-bosn/config.json.: bos_token_id -1 is negative (null means none)$" hp-train c-bosn.yaml &&
	model_cfg pad ".pad_token_id = 9999" &&
	expect_fail 3 "m-pad/config.json.: pad_token_id 9999 is not below vocab_size 512$" hp-train c-pad.yaml &&
	model_cfg padn ".pad_token_id = -1" &&
	expect_fail 3 "m-padn/config.json.: pad_token_id -1 is negative (null means none)$" hp-train c-padn.yaml &&
	# null, absent, in range or an empty list still load
	plan_cfg ids "$MODEL/config.json" ".bos_token_id = null | del(.pad_token_id) | .eos_token_id = [2, 511]" &&
	hp-plan c-ids.yaml --world 1 -o p.json &&
	jq -e ".model.eos_token_id == 2 and .model.bos_token_id == null" p.json &&
	plan_cfg ids "$MODEL/config.json" ".eos_token_id = [] | .pad_token_id = 0" &&
	hp-plan c-ids.yaml --world 1 -o p.json
'

test_expect_success 'heads that do not divide hidden_size, and num_key_value_heads 0, report the cause' '
	model_cfg h7 "del(.head_dim) | .num_attention_heads = 7 | .num_key_value_heads = 7" &&
	expect_fail 3 "m-h7/config.json.: hidden_size 64 is not a multiple of num_attention_heads 7 (give head_dim)$" \
		hp-train c-h7.yaml &&
	model_cfg h128 "del(.head_dim) | .num_attention_heads = 128 | .num_key_value_heads = 128" &&
	expect_fail 3 "hidden_size 64 is not a multiple of num_attention_heads 128 (give head_dim)$" hp-train c-h128.yaml &&
	model_cfg kv0 ".num_key_value_heads = 0" &&
	expect_fail 3 "m-kv0/config.json.: num_key_value_heads must be positive (it is 0)$" hp-train c-kv0.yaml
'

test_expect_success 'without head_dim, what transformers computes is kept: hidden_size // heads when even' '
	plan_cfg h6 "$MODEL/config.json" "del(.head_dim) | .num_attention_heads = 6 | .num_key_value_heads = 6" &&
	hp-plan c-h6.yaml --world 1 -o p.json &&
	jq -e ".model.head_dim == 10" p.json &&
	plan_cfg h9 "$MODEL/config.json" "del(.head_dim) | .hidden_size = 63 | .num_attention_heads = 7 | .num_key_value_heads = 7" &&
	expect_fail 3 "head_dim 9 must be positive, even and at most [0-9]* (hidden_size 63 / num_attention_heads 7)$" \
		hp-plan c-h9.yaml --world 1 -o p.json
'

test_expect_success 'every dimension of config.json that is zero or negative is named' '
	for key in hidden_size intermediate_size num_hidden_layers num_attention_heads \
		num_key_value_heads head_dim vocab_size max_position_embeddings; do
		for v in 0 -3; do
			plan_cfg dim "$MODEL/config.json" ".$key = $v" &&
			expect_fail 3 "cfg-dim.json.: $key must be positive (it is $v)$" hp-plan c-dim.yaml --world 1 -o p.json ||
			return 1
		done
	done &&
	for key in num_experts num_experts_per_tok moe_intermediate_size decoder_sparse_step; do
		plan_cfg dim "$DATA/ref/qwen3-moe-a/config.json" ".$key = 0" &&
		expect_fail 3 "cfg-dim.json.: $key must be positive (it is 0)$" hp-plan c-dim.yaml --world 1 -o p.json ||
		return 1
	done &&
	plan_cfg dim "$DATA/ref/qwen3-moe-a/config.json" "del(.num_experts) | .num_local_experts = -1" &&
	expect_fail 3 "cfg-dim.json.: num_local_experts must be positive (it is -1)$" hp-plan c-dim.yaml --world 1 -o p.json
'

test_expect_success 'an over-long path loses the middle of the message, not the reason at its end' '
	long=$PWD && i=0 &&
	while [ $i -lt 20 ]; do long=$long/dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd; i=$((i + 1)); done &&
	expect_fail 5 "^hp-train: .$PWD/ddd.*d\.\.\.d.*ddd/absent.yaml.: cannot open: No such file or directory$" \
		hp-train "$long/absent.yaml" &&
	test $(wc -c <err) -lt 1100
'

test_expect_success 'a malformed tokenizer.json is a malformed input file in every tool: exit 4' '
	mkdir -p badtok badvocab &&
	echo "{\"model\": " >badtok/tokenizer.json &&
	jq ".model.vocab = [1, 2]" "$MODEL/tokenizer.json" >badvocab/tokenizer.json &&
	echo "{\"text\": \"Once upon a time\"}" >t.jsonl &&
	online_config on.yaml t.jsonl 16 1 </dev/null &&
	for t in badtok badvocab; do
		expect_fail 4 "$t/tokenizer.json" hp-data build --tokenizer $t -o out t.jsonl &&
		test -z "$(ls | grep -e "^out\.")" &&
		expect_fail 4 "$t/tokenizer.json" hp-data encode --tokenizer $t t.jsonl &&
		expect_fail 4 "$t/tokenizer.json" hp-train on.yaml \
			--dataset.model_assets.tokenizer.pretrained_model_name_or_path=$PWD/$t || return 1
	done
'

test_done
