#!/bin/sh
test_description='the config.json of real hub checkpoints: each parses, plans at a realistic world size, and counts the published parameters'
. "$(dirname "$0")/test-lib.sh"

HUB=$DATA/hub-configs

# hub_yaml FILE NAME [DIR]: a from_config run of the hub config NAME (in
# DIR, default $HUB), seq 4096
hub_yaml () {
	cat >"$1" <<-YAML
	model:
	  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_config
	  config_path: ${3:-$HUB}/$2.json
	training: {train_iters: 10, global_batch_size: 64, micro_batch_size: 1}
	dataset:
	  _target_: hyper_parallel.data.build_indexed_text_dataset
	  data_path: none
	  data_config: {seq_length: 4096, is_dataset_from_mr: true}
	YAML
}

while IFS='	' read name world ovr count; do
	case $name in '#'*) continue ;; esac
	test_expect_success "$name: hp-plan --world $world, $count parameters" '
		hub_yaml c.yaml $name &&
		hp-plan c.yaml --world $world $ovr -o plan.json 2>err &&
		hp-plan --explain plan.json >ex 2>>err &&
		cat err &&
		grep "^  parameters  *$count$" ex &&
		jq -e ".world_size == $world" plan.json >/dev/null
	'
done <"$HUB/plans.tsv"

# the released gpt-oss shapes (data/hf/published: their values, not the
# hub's bytes): their config.json parses with no unknown key, MXFP4 and
# all, and hp counts transformers' parameters
test_expect_success 'gpt-oss-20b and gpt-oss-120b as published: plans at 8 and 64 ranks, transformers'\'' parameter counts' '
	for n in "gpt-oss-20b 8 20914757184" "gpt-oss-120b 64 116829156672"; do
		set -- $n &&
		hub_yaml pub.yaml $1 "$DATA/hf/published" &&
		hp-plan pub.yaml --world $2 --accelerator.ep_size=8 --fsdp_config.dp_shard_size=$2 \
			--fsdp_config.edp_shard_size=$(($2 / 8)) -o pub.json 2>err &&
		test ! -s err &&
		hp-plan --explain pub.json >ex &&
		grep "^  parameters  *$3$" ex &&
		grep "^  sliding_window  *128 on $(($(jq .num_hidden_layers "$DATA/hf/published/$1.json") / 2)) of" ex ||
		return 1
	done
'

# DeepSeek-V3 as published (data/hf/published/deepseek-v3.json: its
# values, FP8 quantization_config and DeepSeek's own keys included): the FP8
# checkpoint is refused by name; its bf16 form (without the key) plans at
# 256 ranks with transformers' 671,026,404,352 parameters plus the 58 MoE
# layers' 256-expert correction-bias buffers (in the checkpoint, hence in
# hp's count), latent attention and the group router explained.
test_expect_success 'DeepSeek-V3 as published: FP8 refused by name; its bf16 form plans at 256 ranks, transformers'\'' count' '
	hub_yaml ds.yaml deepseek-v3 "$DATA/hf/published" &&
	test_must_fail_with 4 hp-plan ds.yaml --world 1 2>err && test_one_line err &&
	grep -q "quantization_config (quant_method fp8) is not supported" err &&
	jq "del(.quantization_config)" "$DATA/hf/published/deepseek-v3.json" >deepseek-v3-bf16.json &&
	hub_yaml ds.yaml deepseek-v3-bf16 "$PWD" &&
	hp-plan ds.yaml --world 256 --accelerator.tp_size=8 --accelerator.sequence_parallel=true \
		--accelerator.ep_size=64 --fsdp_config.dp_shard_size=32 --fsdp_config.edp_shard_size=4 -o ds.json 2>err &&
	test ! -s err &&
	hp-plan --explain ds.json >ex &&
	grep "^  parameters  *$((671026404352 + 58 * 256))$" ex &&
	grep "^  latent attention  *q latent, kv latent 512, per head qk 128 + 64 RoPE.d (interleaved), v 128, softmax x 1.87" ex &&
	grep "^  router  *sigmoid, correction bias, top-4 of 8 groups, x 2.5; 1 shared (intermediate 2048)$" ex
'

# Qwen3-Next-80B-A3B as published (data/hf/published/qwen3-next-80b-a3b.json:
# its values, the mtp_* keys of its multi-token-prediction module, which
# transformers never loads, included): plans at 64 ranks with EP 64 and
# FSDP, transformers' 79,674,391,296 parameters (4.57.6 and 5.24.0 on the
# meta device), and with TP 2 + SP (the delta rule's heads split); its 36
# Gated DeltaNet layers take cp as a head split (ulysses_attention bound),
# and refuse the K/V all-gather mode by name.
test_expect_success 'Qwen3-Next-80B-A3B as published: plans at 64 ranks with transformers'\'' count, with TP, with CP; cp without ulysses refused by name' '
	hub_yaml qn.yaml qwen3-next-80b-a3b "$DATA/hf/published" &&
	hp-plan qn.yaml --world 64 --accelerator.ep_size=64 --fsdp_config.dp_shard_size=64 -o qn.json 2>err &&
	test ! -s err &&
	hp-plan --explain qn.json >ex &&
	grep "^  parameters  *79674391296$" ex &&
	grep "^  linear attention  *Gated DeltaNet on 36 of 48 layers: 16 key heads of 128, 32 value heads of 128, conv 4 (fused projections)$" ex &&
	grep "^  full attention  *gated (sigmoid), RoPE on 64 of head_dim 256, zero-centred norms$" ex &&
	grep "^  shared expert  *intermediate 512, times sigmoid(shared_expert_gate)$" ex &&
	grep -q "model.layers.0.linear_attn  *Qwen3NextGatedDeltaNet  *reference.gated_deltanet" ex &&
	hp-plan qn.yaml --world 64 --accelerator.tp_size=2 --accelerator.sequence_parallel=true \
		--accelerator.ep_size=32 --fsdp_config.dp_shard_size=32 -o qt.json 2>err &&
	test ! -s err &&
	test_must_fail_with 4 hp-plan qn.yaml --world 64 --accelerator.cp_size=2 2>err &&
	test_one_line err && grep -q "cp_size: context parallelism over the Gated DeltaNet layers" err &&
	cat qn.yaml - >qu.yaml <<-YAML &&
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: ulysses_attention}}
	YAML
	hp-plan qu.yaml --world 64 --accelerator.cp_size=2 --accelerator.ep_size=32 \
		--fsdp_config.dp_shard_size=32 -o qc.json 2>err &&
	test ! -s err && jq -e ".estimates.step.cp_mode == \"ulysses\"" qc.json
'

# #35: HyperParallel's demo model on 64 GPUs (TP2 with SP, CP2, EP8, full
# activation checkpointing, 4096 tokens) fits an 80 GB GPU, as hp-plan
# counts the CUDA backend's bytes; one process of it does not.
test_expect_success 'Qwen3-30B-A3B on 64 GPUs: every rank under 80 GB of device memory; one GPU: refused by size' '
	hub_yaml q30.yaml Qwen3-30B-A3B &&
	hp-plan q30.yaml --world 64 --training.device=cuda --accelerator.tp_size=2 --accelerator.cp_size=2 \
		--accelerator.ep_size=8 --accelerator.sequence_parallel=true --fsdp_config.dp_shard_size=16 \
		--fsdp_config.edp_shard_size=4 --activation_checkpoint.mode=full -o q30.json &&
	jq -r ".estimates.per_rank[] | \"# ranks \(.ranks | length): \(.device_bytes) device bytes\"" q30.json &&
	jq -e "[.estimates.per_rank[].device_bytes] | (length > 0) and all(. > 20e9 and . < 80e9)" q30.json &&
	hp-plan q30.yaml --world 1 --training.device=cuda -o q1.json &&
	jq -e ".estimates.per_rank[0].device_bytes > 400e9" q1.json
'

test_expect_success 'the Llama-3 RoPE is llama3 with factor 32 (3.2) and 8 (3.1); Qwen3 theta 1e6; Mistral no window' '
	hub_yaml l.yaml Llama-3.2-1B && hp-plan --explain l.yaml --world 1 | grep "^  rope  *llama3, theta 500000, factor 32$" &&
	hub_yaml l8.yaml Llama-3.1-8B && hp-plan --explain l8.yaml --world 1 | grep "^  rope  *llama3, theta 500000, factor 8$" &&
	hub_yaml q.yaml Qwen3-8B && hp-plan --explain q.yaml --world 1 | grep "^  rope  *default, theta 1e+06$" &&
	hub_yaml m.yaml Mistral-7B-v0.3 && hp-plan --explain m.yaml --world 1 >ex && ! grep -q sliding_window ex
'

test_done
