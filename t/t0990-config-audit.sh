#!/bin/sh
test_description='every config key is honored or refused: the audit walks the schema itself'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

# The keys come from the schema (hp-test-tool configkeys: lib/config/config.c's
# table), so a key added there without a row below fails this test.  Each
# row says what the key does, and the test checks it:
#
#   computes   the run's numbers (every step's loss and gradient norm, the
#              final weights) differ from the base run's
#   writes     what it prints or writes differs (stdout and the metrics,
#              without the timings; the files it leaves)
#   same       hp computes the same bits for these values, for the reason
#              hp-config(5) gives beside the key
#   refused C  the run stops with exit status C and one line naming the key
#              (the same line from every rank), before it writes metrics
#   rescues    the base run fails (exit 1: a NaN it catches), with it it trains
#
# A row is KEY | CLASS | BASE | BASE ARGS | ARGS: BASE is a config made
# below (hf: stories260K on records, st: on a token stream of documents
# ending in EOD, fc: a random init from config.json, on: online JSONL, moe:
# the Qwen3-MoE fixture, cv: online conversations whose messages have a
# second role and content under from and value), a trailing 2 runs it on two ranks (the class is
# then checked at world size 2), and the run is BASE with BASE ARGS, then
# also with ARGS.  The runs are 2 steps.

OV='{match: "*.self_attn", replace_module: {_target_: flash_attention}}'
OV0='{match: model.layers.0.self_attn, replace_module: {_target_: flash_attention}}'
OVW='{match: "*.self_attn", when: cp, replace_module: {_target_: flash_attention}}'
OVT='{match: "*.self_attn", module_type: transformers.models.llama.modeling_llama.LlamaMLP, replace_module: {_target_: flash_attention}}'
OVE='{match: "*.self_attn", exact_type: transformers.models.llama.modeling_llama.LlamaAttention, replace_module: {_target_: flash_attention}}'
LCF='{match: "*.mlp", local_compute_fn: {_target_: any.factory}}'
INT='{match: "*.mlp", inner_target: any.module}'
INW='{match: "*.mlp", inner_wrapper: {_target_: any.wrapper}}'
RD='{match: "*.mlp", region_dispatch: true}'
ROWS='
model._target_ | computes | fc | | @hf
model.pretrained_model_name_or_path | computes | hf | | --model.pretrained_model_name_or_path=$MODEL_BF16
model.config_path | computes | fc | | --model.config_path=$DATA/ref/qwen3-dense
model.torch_dtype | same | hf | | --model.torch_dtype=float32
model.torch_dtype | refused 4 | hf | | --model.torch_dtype=bfloat16
model.num_hidden_layers | computes | fc | | --model.num_hidden_layers=3
model.attn_implementation | same | hf | | --model.attn_implementation=flash_attention_2
model.force_hf | same | hf | | --model.force_hf=true
model.local_files_only | same | hf | | --model.local_files_only=true
model.validate_placement | writes | hf2 | --fsdp_config.dp_shard_size=2 | --model.validate_placement=true
training.train_iters | computes | hf | | --training.train_iters=3
training.global_batch_size | computes | hf | | --training.global_batch_size=8
training.micro_batch_size | computes | hf | | --training.micro_batch_size=1
training.max_grad_norm | computes | hf | | --training.max_grad_norm=0.01
training.seed | computes | fc | | --training.seed=5
training.enable_full_determinism | same | hf | | --training.enable_full_determinism=true
training.logging_steps | writes | hf | --training.train_iters=4 | --training.logging_steps=2
training.eval_iters | writes | hf | | --training.eval_iters=1
training.eval_steps | writes | hf | --training.eval_iters=1 | --training.eval_steps=1
training.loss_aggregation | same | hf | | --training.loss_aggregation=rank_average
training.loss_aggregation | refused 4 | hf2 | --fsdp_config.dp_shard_size=2 | --training.loss_aggregation=rank_average
training.init_device | same | hf | | --training.init_device=meta
training.device | refused 4 | hf | | --training.device=cuda
training.loss_fn._target_ | computes | hf | | @chunk
training.loss_fn.chunk_size | computes | chunk | | --training.loss_fn.chunk_size=80
training.collective_timeout_s | same | hf2 | --fsdp_config.dp_shard_size=2 | --training.collective_timeout_s=0
training.moe_router_bias_update_rate | refused 4 | moe | | --training.moe_router_bias_update_rate=0.01
accelerator.tp_size | computes | hf2 | | --accelerator.tp_size=2
accelerator.cp_size | computes | hf2 | | --accelerator.cp_size=2
accelerator.ep_size | writes | moe2 | | --accelerator.ep_size=2
accelerator.pp_size | writes | moe2 | | --accelerator.pp_size=2
accelerator.pp_size | writes | hf2 | | --accelerator.pp_size=2
accelerator.pp_schedule | writes | moe2 | --accelerator.pp_size=2 | --accelerator.pp_schedule=gpipe
accelerator.pp_vpp | refused 3 | moe2 | --accelerator.pp_size=2 | --accelerator.pp_vpp=2
accelerator.pp_vpp | writes | fc2 | --accelerator.pp_size=2 | --accelerator.pp_vpp=2
accelerator.pp_layer_split | writes | moe2 | --accelerator.pp_size=2 | --accelerator.pp_layer_split=[1,1]
accelerator.pp_layer_split | refused 3 | moe2 | --accelerator.pp_size=2 | --accelerator.pp_layer_split=[2,1]
accelerator.pp_micro_batch_num | writes | moe2 | --accelerator.pp_size=2 | --accelerator.pp_micro_batch_num=2
accelerator.pp_micro_batch_num | refused 3 | moe2 | --accelerator.pp_size=2 | --accelerator.pp_micro_batch_num=3
accelerator.sequence_parallel | writes | hf2 | --accelerator.tp_size=2 | --accelerator.sequence_parallel=true
accelerator.loss_parallel | writes | hf2 | --accelerator.tp_size=2 | --accelerator.loss_parallel=true
fsdp_config.dp_shard_size | writes | hf2 | | --fsdp_config.dp_shard_size=2
fsdp_config.edp_shard_size | writes | moe2 | | --fsdp_config.edp_shard_size=2
fsdp_config.reshard_after_forward | writes | hf2 | --fsdp_config.dp_shard_size=2 --training.global_batch_size=8 | --fsdp_config.reshard_after_forward=false
fsdp_config.reshard_after_backward | writes | hf2 | --fsdp_config.dp_shard_size=2 --training.global_batch_size=8 | --fsdp_config.reshard_after_backward=false
fsdp_config.requires_grad_sync | writes | hf2 | --fsdp_config.dp_shard_size=2 --training.global_batch_size=8 | --fsdp_config.requires_grad_sync=false
fsdp_config.forward_prefetch_depth | writes | hf2 | --fsdp_config.dp_shard_size=2 | --fsdp_config.forward_prefetch_depth=0
fsdp_config.backward_prefetch_depth | writes | hf2 | --fsdp_config.dp_shard_size=2 | --fsdp_config.backward_prefetch_depth=0
fsdp_config.mix_precision.param_dtype | refused 4 | hf | | --fsdp_config.mix_precision.param_dtype=bfloat16
fsdp_config.mix_precision.reduce_dtype | refused 4 | hf | | --fsdp_config.mix_precision.reduce_dtype=bfloat16
fsdp_config.mix_precision.output_dtype | refused 4 | hf | | --fsdp_config.mix_precision.output_dtype=bfloat16
fsdp_config.replicate_params | refused 4 | hf | | --fsdp_config.replicate_params=[model.norm.weight]
fsdp_config.enable_offload | same | hf | | --fsdp_config.enable_offload=true
plan_overrides[].match | computes | ov | | @ov0
plan_overrides[].when | computes | ov | | @ovw
plan_overrides[].module_type | refused 3 | hf | | @ovt
plan_overrides[].exact_type | same | ov | | @ove
plan_overrides[].replace_module._target_ | computes | hf | | @ov
plan_overrides[].local_compute_fn._target_ | same | ov | | @ovlcf
plan_overrides[].inner_target | same | ov | | @ovint
plan_overrides[].inner_wrapper._target_ | same | ov | | @ovinw
plan_overrides[].region_dispatch | same | ov | | @ovrd
dataset._target_ | computes | on | | @onidx
dataset.data_path | computes | hf | | --dataset.data_path=$PWD/ts2
dataset.valid_data_path | writes | hf | --training.eval_iters=1 | --dataset.valid_data_path=$PWD/ts2 --dataset.data_config.split=99,0,1
dataset.model_assets.tokenizer.pretrained_model_name_or_path | computes | on | | --dataset.model_assets.tokenizer.pretrained_model_name_or_path=$PWD/tok
dataset.model_assets.tokenizer.eod_token_id | computes | st | --dataset.data_config.eod_mask_loss=true | --dataset.model_assets.tokenizer.eod_token_id=13
dataset.model_assets.chat_template | computes | cv | | --dataset.model_assets.chat_template=chatml
dataset.model_assets.chat_template | refused 3 | on | | --dataset.model_assets.chat_template=chatml
dataset.data_transform.data_type | computes | cv | --dataset.data_transform.data_type=plaintext --dataset.data_transform.text_keys=[text] | --dataset.data_transform.data_type=conversation --dataset.data_transform.text_keys=[messages]
dataset.data_transform.role_key | computes | cv | | --dataset.data_transform.role_key=from
dataset.data_transform.role_key | refused 3 | on | | --dataset.data_transform.role_key=from
dataset.data_transform.content_key | computes | cv | | --dataset.data_transform.content_key=value
dataset.data_transform.loss_tokens | computes | cv | | --dataset.data_transform.loss_tokens=all
dataset.data_transform.text_keys | computes | on | | --dataset.data_transform.text_keys=[title]
dataset.data_transform.max_seq_len | computes | on | | --dataset.data_transform.max_seq_len=32
dataset.data_config.seq_length | computes | st | | --dataset.data_config.seq_length=32
dataset.data_config.split | computes | hf | --dataset.data_config.shuffle=true | --dataset.data_config.split=50,25,25
dataset.data_config.is_dataset_from_mr | computes | hf | | --dataset.data_config.is_dataset_from_mr=false
dataset.data_config.labels_are_shifted | refused 4 | hf | | --dataset.data_config.labels_are_shifted=true
dataset.data_config.eod_mask_loss | computes | st | | --dataset.data_config.eod_mask_loss=true
dataset.data_config.reset_position_ids | computes | st | | --dataset.data_config.reset_position_ids=true --dataset.data_config.reset_attention_mask=true
dataset.data_config.reset_position_ids | refused 4 | st | | --dataset.data_config.reset_position_ids=true
dataset.data_config.reset_attention_mask | computes | st | | --dataset.data_config.reset_attention_mask=true --dataset.data_config.reset_position_ids=true
dataset.data_config.reset_attention_mask | refused 4 | st | | --dataset.data_config.reset_attention_mask=true
dataset.data_config.shuffle | computes | hf | | --dataset.data_config.shuffle=true
dataset.data_config.create_attention_mask_in_dataloader | same | hf | | --dataset.data_config.create_attention_mask_in_dataloader=true
dataset.data_config.skip_invalid_lines | rescues | onbad | | --dataset.data_config.skip_invalid_lines=true
dataloader._target_ | same | on | | @ondyn
dataloader.sampler_type | refused 3 | hf | --training.train_iters=300 | --dataloader.sampler_type=single
dataloader.sampler_type | refused 4 | on | --training.train_iters=150 | --dataloader.sampler_type=single
dataloader.drop_last | refused 4 | hf | | --dataloader.drop_last=false
optimizer._target_ | refused 3 | hf | | @sgd
optimizer.adamw_config.adamw_lr | computes | hf | --lr_scheduler=null | --optimizer.adamw_config.adamw_lr=1e-2
optimizer.adamw_config.adamw_weight_decay | computes | hf | | --optimizer.adamw_config.adamw_weight_decay=0.5
optimizer.adamw_config.adamw_betas | computes | hf | | --optimizer.adamw_config.adamw_betas=[0.5,0.6]
optimizer.adamw_config.adamw_eps | computes | hf | | --optimizer.adamw_config.adamw_eps=0.1
optimizer.no_decay_params | computes | hf | | --optimizer.no_decay_params=[bias]
optimizer.fp32_main_params | refused 4 | hf | | --optimizer.fp32_main_params=false
lr_scheduler._target_ | refused 3 | hf | | @steplr
lr_scheduler.lr_decay_style | computes | hf | --lr_scheduler.lr_config.lr_warmup_steps=0 --training.train_iters=3 | --lr_scheduler.lr_decay_style=linear
lr_scheduler.lr_config.lr | computes | hf | | --lr_scheduler.lr_config.lr=1e-2
lr_scheduler.lr_config.lr_warmup_steps | computes | hf | | --lr_scheduler.lr_config.lr_warmup_steps=1
lr_scheduler.lr_config.min_lr | computes | hf | --lr_scheduler.lr_config.lr_warmup_steps=0 | --lr_scheduler.lr_config.min_lr=5e-4
checkpoint.save_ckpt | writes | hf | | --checkpoint.save_ckpt=true
checkpoint.checkpoint_dir | writes | hf | --checkpoint.save_ckpt=true | --checkpoint.checkpoint_dir=elsewhere
checkpoint.save_steps | writes | hf | --checkpoint.save_ckpt=true | --checkpoint.save_steps=1
checkpoint.restore_from | computes | hf | | --checkpoint.restore_from=$PWD/pre/global_step_1
checkpoint.save_optimizer | writes | hf | --checkpoint.save_ckpt=true | --checkpoint.save_optimizer=false
checkpoint.save_train_state | refused 4 | hf | | --checkpoint.save_train_state=false
checkpoint.save_consolidated | writes | hf | --checkpoint.save_ckpt=true | --checkpoint.save_consolidated=final
checkpoint.keep_last | writes | hf | --checkpoint.save_ckpt=true --checkpoint.save_steps=1 | --checkpoint.keep_last=1
activation_checkpoint.mode | writes | hf | | --activation_checkpoint.mode=full
activation_checkpoint.selection.layer_count | writes | hf | --activation_checkpoint.mode=full | --activation_checkpoint.selection.layer_count=2
activation_checkpoint.selection.layer_indices | writes | hf | --activation_checkpoint.mode=full | --activation_checkpoint.selection.layer_indices=[1]
debug.check_nan_inf | rescues | hf | --lr_scheduler=null --optimizer.adamw_config.adamw_lr=1e30 --training.max_grad_norm=0 --training.train_iters=3 | --debug.check_nan_inf=false
debug.inject_fault | computes | hf2 | --fsdp_config.dp_shard_size=2 | --debug.inject_fault=grad_scale
profiling | refused 4 | hf | | --profiling.enable=true
wandb | refused 4 | hf | | --wandb.project=hp
compile | refused 4 | hf | | --compile.enable=true
mixed_precision | refused 4 | hf | | --mixed_precision.param_dtype=bf16
'

# run NAME BASE ARGS...: hp-train in a fresh folder NAME, its stdout and
# metrics (timings dropped), final weights and files into NAME.fp; the
# numbers alone into NAME.num; exit status into NAME.rc
run () {
	name=$1 cf=$2; shift 2
	n=1
	case $cf in *2) n=2 cf=${cf%2} ;; esac
	rm -rf "$name" && mkdir "$name" &&
	(
		cd "$name" &&
		if test $n = 1; then
			hp-train ../$cf.yaml "$@" --metrics m.jsonl --dump-params p.st </dev/null >out 2>err
		else
			mpiexec -n 2 hp-train ../$cf.yaml "$@" --metrics m.jsonl --dump-params p.st </dev/null >out 2>err
		fi
		echo $? >rc
	) &&
	if test -s $name/m.jsonl; then
		jq -c "[.step, .loss, .grad_norm]" $name/m.jsonl >$name.num &&
		sha256sum <$name/p.st >>$name.num
	else
		: >$name.num
	fi &&
	{
		cat $name.num
		sed -e "s/tok\/s [0-9]*/tok\/s/; s/[0-9.]* ms$/ms/; s/([0-9.]* s)/(s)/" \
			-e "/^run.gemm\|^config /d" $name/out
		test -s $name/m.jsonl && jq -c "del(.tokens_per_s, .step_time_s, .comm_wait_s, .eval_time_s,
			.test_time_s, .checkpoint_s)" $name/m.jsonl
		(cd $name && find . -type f ! -name out ! -name err ! -name rc ! -name m.jsonl | sort)
	} >$name.fp
}

test_expect_success 'setup: the base configs and their data' '
	make_tinystories ts 64 &&
	jq -c "{ids: .ids}" "$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" | tail -n 200 |
		jq -c "{ids: (.ids | reverse)}" >rev.jsonl &&
	hp-test-tool mkidx --vocab 512 --records-of 65 -o ts2 rev.jsonl &&
	jq -c "{ids: (.ids + [2])}" "$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" >docs.jsonl &&
	hp-test-tool mkidx --vocab 512 -o docs docs.jsonl &&
	write_config hf.yaml "$MODEL" ts 64 2 4 2 <<-YAML &&
	checkpoint: {save_ckpt: false}
	YAML
	sed "s/is_dataset_from_mr: true/is_dataset_from_mr: false/; s|data_path: ts|data_path: $PWD/docs|" hf.yaml >st.yaml &&
	sed "s|^  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained|  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_config|; s|^  pretrained_model_name_or_path: .*|  config_path: $MODEL|" hf.yaml >fc.yaml &&
	sed "s|pretrained_model_name_or_path: .*|pretrained_model_name_or_path: $DATA/ref/qwen3-moe-b|" hf.yaml >moe.yaml &&
	jq -c "{text: .text, title: (.text | .[0:40])}" "$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" |
		sed -n "47,246p" >on.jsonl &&
	{ head -n 3 on.jsonl; echo "{\"text\": broken"; tail -n 20 on.jsonl; } >bad.jsonl &&
	online_config on.yaml $PWD/on.jsonl 64 2 <<-YAML &&
	checkpoint: {save_ckpt: false}
	YAML
	sed "s|data_path: $PWD/on.jsonl|data_path: $PWD/bad.jsonl|" on.yaml >onbad.yaml &&
	jq -c "{text: .text, messages: [{role: \"user\", from: \"assistant\", content: .text[0:40], value: .text[40:90]},
		{role: \"assistant\", from: \"user\", content: .text[40:], value: .text[0:40]}]}" on.jsonl >cv.jsonl &&
	mkdir tokc && cp "$MODEL/tokenizer.json" "$MODEL/tokenizer_config.json" tokc/ &&
	printf "%s" "{% for m in messages %}{{ \"<s>\" + m.role + \": \" + m.content + \"</s>\" }}{% endfor %}{% if add_generation_prompt %}<s>assistant: {% endif %}" >tokc/chat_template.jinja &&
	sed -e "s|data_path: $PWD/on.jsonl|data_path: $PWD/cv.jsonl\n  model_assets: {tokenizer: {pretrained_model_name_or_path: $PWD/tokc}}|" \
		-e "s|data_type: plaintext, text_keys: \[text\]|data_type: conversation|" on.yaml >cv.yaml &&
	sed "s|^  _target_: hyper_parallel.data.build_online_text_dataset|  _target_: hyper_parallel.data.build_indexed_text_dataset|; s|data_path: $PWD/on.jsonl|data_path: $PWD/ts\n  data_config: {seq_length: 64, is_dataset_from_mr: true}|; /data_transform/d" on.yaml >onidx.yaml &&
	sed "s|_target_: hyper_parallel.components.optim.AdamW|_target_: torch.optim.SGD|" hf.yaml >sgd.yaml &&
	sed "s|^  logging_steps: 1|  logging_steps: 1\n  loss_fn: {_target_: hyper_parallel.ops.ChunkedCausalLMLoss, chunk_size: 48}|" hf.yaml >chunk.yaml &&
	{ cat on.yaml; echo "dataloader: {_target_: hyper_parallel.data.DynamicBatchDataLoader}"; } >ondyn.yaml &&
	for v in "ov $OV" "ov0 $OV0" "ovw $OVW" "ovt $OVT" "ove $OVE" "ovlcf $OV, $LCF" "ovint $OV, $INT" \
		"ovinw $OV, $INW" "ovrd $OV, $RD"; do
		{ cat hf.yaml; echo "plan_overrides: [${v#* }]"; } >${v%% *}.yaml || return 1
	done &&
	sed "s|_target_: hyper_parallel.components.optim.MultiLRScheduler|_target_: torch.optim.lr_scheduler.StepLR|" hf.yaml >steplr.yaml &&
	mkdir tok && cp "$MODEL/tokenizer.json" tok/ &&
	jq ".eos_token = \"<s>\"" "$MODEL/tokenizer_config.json" >tok/tokenizer_config.json &&
	hp-train -q hf.yaml --training.train_iters=1 --checkpoint.save_ckpt=true --checkpoint.checkpoint_dir=$PWD/pre
'

test_expect_success 'every key of the schema has a row, and every row a key of the schema' '
	hp-test-tool configkeys | cut -f1 | sort -u >keys &&
	test $(wc -l <keys) -ge 99 &&
	echo "$ROWS" | sed -n "s/^\([^ |]*\) |.*/\1/p" | sort -u >rows &&
	comm -23 keys rows >missing && comm -13 keys rows >stale &&
	{ test ! -s missing || { echo "# keys without a row:"; sed "s/^/#   /" missing; false; }; } &&
	{ test ! -s stale || { echo "# rows without a key:"; sed "s/^/#   /" stale; false; }; }
'

test_expect_success 'every key is documented in hp-config(5)' '
	while read -r k; do
		leaf=${k##*.} && leaf=${leaf%\[\]} &&
		grep -q "$leaf" "$HP_SRC_DIR/man/hp-config.5" || { echo "# $k: not in hp-config(5)"; return 1; }
	done <keys
'

test_expect_success 'every key does what its row says' '
	i=0 bad=0 &&
	echo "$ROWS" | grep " | " >table &&
	while IFS="|" read -r key class base bargs args; do
		i=$((i + 1)) &&
		key=$(echo $key) class=$(echo $class) base=$(echo $base) &&
		# ARGS "@OTHER": the run is config OTHER instead (no override may
		# hold a _target_, so those keys are changed in a file)
		eval "set -- $bargs" && run b$i $base "$@" &&
		case $args in
		*@*) other=$(echo ${args#*@}) && run r$i $other ;;
		*) eval "set -- $bargs $args" && run r$i $base "$@" ;;
		esac &&
		case $class in
		computes)
			test "$(cat b$i/rc)" = 0 && test "$(cat r$i/rc)" = 0 && test -s b$i.num && ! cmp -s b$i.num r$i.num ;;
		writes)
			test "$(cat b$i/rc)" = 0 && test "$(cat r$i/rc)" = 0 && ! cmp -s b$i.fp r$i.fp ;;
		same)
			test "$(cat b$i/rc)" = 0 && test "$(cat r$i/rc)" = 0 && test -s b$i.num && cmp -s b$i.num r$i.num ;;
		refused*)
			test "$(cat b$i/rc)" = 0 && test "$(cat r$i/rc)" = "${class#refused }" &&
			test $(sed "s/^hp-train: rank [0-9]* on [^:]*: /hp-train: /" r$i/err | sort -u | wc -l) = 1 &&
			grep -q "${key##*.}" r$i/err && ! test -e r$i/m.jsonl ;;
		rescues)
			test "$(cat b$i/rc)" != 0 && test "$(cat r$i/rc)" = 0 ;;
		*) false ;;
		esac || { bad=$((bad + 1)); echo "# row $i, $key: not $class (exit $(cat b$i/rc), $(cat r$i/rc)): $(head -c 300 r$i/err)"; }
	done <table &&
	echo "# $i rows" &&
	test $bad = 0
'

test_done
