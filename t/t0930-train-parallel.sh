#!/bin/sh
test_description='hp-train under mpiexec: tensor, sequence, context and expert parallelism equal one process'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

A=--accelerator
F=--fsdp_config

test_expect_success MPI 'setup: TinyStories records and a 10-step config per model' '
	make_tinystories ts 64 &&
	for m in stories260K/hf ref/qwen3-dense ref/qwen3-moe-a ref/qwen3-moe-b; do
		n=$(basename $m) &&
		write_config $n.yaml "$DATA/$m" ts 64 2 16 10 </dev/null &&
		single $n $n.yaml || return 1
	done
'

test_expect_success MPI 'llama: TP 2 and 4, with and without sequence parallel and loss_parallel' '
	layout hf hf.yaml 2 $A.tp_size=2 &&
	layout hf hf.yaml 2 $A.tp_size=2 $A.sequence_parallel=true &&
	layout hf hf.yaml 2 $A.tp_size=2 $A.loss_parallel=true &&
	layout hf hf.yaml 4 $A.tp_size=4 &&
	layout hf hf.yaml 4 $A.tp_size=4 $A.sequence_parallel=true $A.loss_parallel=true
'

test_expect_success MPI 'qwen3: TP 2 with and without sequence parallel and loss_parallel' '
	layout qwen3-dense qwen3-dense.yaml 2 $A.tp_size=2 &&
	layout qwen3-dense qwen3-dense.yaml 2 $A.tp_size=2 $A.sequence_parallel=true $A.loss_parallel=true
'

test_expect_success MPI 'CP 2 and 4, K/V all-gather and Ulysses' '
	layout hf hf.yaml 2 $A.cp_size=2 &&
	layout hf hf.yaml 4 $A.cp_size=4 &&
	layout qwen3-dense qwen3-dense.yaml 4 $A.cp_size=4 &&
	write_config hf-ul.yaml "$DATA/stories260K/hf" ts 64 2 16 10 <<-YAML &&
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: ulysses_attention}}
	YAML
	layout hf hf-ul.yaml 2 $A.cp_size=2 &&
	layout hf hf-ul.yaml 4 $A.cp_size=4
'

test_expect_success MPI 'MoE: TP with sequence parallel, EP 2 and 4 with expert FSDP' '
	layout qwen3-moe-a qwen3-moe-a.yaml 2 $A.tp_size=2 $A.sequence_parallel=true &&
	layout qwen3-moe-a qwen3-moe-a.yaml 2 $A.ep_size=2 &&
	layout qwen3-moe-a qwen3-moe-a.yaml 4 $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=4 &&
	layout qwen3-moe-b qwen3-moe-b.yaml 4 $A.ep_size=4 &&
	layout qwen3-moe-b qwen3-moe-b.yaml 8 $A.ep_size=4 $F.edp_shard_size=2 $F.dp_shard_size=8 &&
	layout qwen3-moe-b qwen3-moe-b.yaml 4 $A.tp_size=4 $A.sequence_parallel=true $A.loss_parallel=true
'

SEED8="$A.tp_size=2 $A.cp_size=2 $A.ep_size=2 $A.sequence_parallel=true $F.dp_shard_size=2 $F.edp_shard_size=2"

test_expect_success MPI 'the seed'\''s 8 ranks, TP2 x CP2 x EP2 with dp_shard 2 and edp_shard 2' '
	layout qwen3-moe-b qwen3-moe-b.yaml 8 $SEED8 &&
	layout qwen3-moe-a qwen3-moe-a.yaml 8 $SEED8 &&
	layout qwen3-dense qwen3-dense.yaml 8 $A.tp_size=2 $A.cp_size=2 $A.sequence_parallel=true $F.dp_shard_size=2 &&
	layout hf hf.yaml 8 $A.tp_size=2 $A.cp_size=2 $F.dp_shard_size=4
'

# The seed's plan_overrides, from the seed's config.
overrides () {
	awk '/^plan_overrides:/ { on = 1; print; next } on && /^[^ ]/ { exit } on' "$TEST_DIR/config/seed-8rank.yaml"
}

test_expect_success MPI 'the seed'\''s 8 ranks with its kernels (fused norms, flash attention, grouped experts)' '
	overrides | write_config k.yaml "$DATA/ref/qwen3-moe-b" ts 64 2 16 10 &&
	grep -q grouped_experts k.yaml &&
	single k k.yaml &&
	same_losses s-k.jsonl s-qwen3-moe-b.jsonl &&
	layout k k.yaml 8 $SEED8 >log &&
	cat log && same_losses p.jsonl s-qwen3-moe-b.jsonl
'

# GPT-OSS, as transformers 5.24 saved it (data/hf/tf5/gpt_oss-yarn): sinks
# (sharded by head over tp; Ulysses gives each cp rank its heads' sinks),
# biases on q/k/v/o, the router and every expert, the clamped SwiGLU,
# experts stacked and interleaved in the checkpoint.  The final weights
# within 1e-3 (PTOL), losses and step-1 gradients within 1e-5: the clamp
# (swiglu_limit 0.5 clamps a fifth of the gate and up values) makes the
# gradient jump where a value crosses the limit, so a value within rounding
# of it passes its gradient in one layout and blocks it in another, and
# the six AdamW steps carry that on (one such element moves by at most the
# sum of the steps' learning rates, 2e-3 here); measured 5e-5 with the
# window below, under 1e-5 here, on this machine (AVX-512).
test_expect_success MPI 'GPT-OSS: FSDP, TP+SP, EP with expert FSDP, CP both modes, the seed layout with its kernels' '
	d=$DATA/hf/tf5/gpt_oss-yarn && PTOL=1e-3 &&
	hf_records oss "$d" &&
	write_config oss.yaml "$d" oss 32 1 4 6 </dev/null &&
	single oss oss.yaml &&
	layout oss oss.yaml 2 $F.dp_shard_size=2 &&
	layout oss oss.yaml 2 $A.tp_size=2 $A.sequence_parallel=true $A.loss_parallel=true &&
	layout oss oss.yaml 4 $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=4 &&
	layout oss oss.yaml 2 $A.cp_size=2 &&
	write_config oss-k.yaml "$d" oss 32 1 4 6 <<-YAML &&
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: ulysses_attention}}
	  - {match: "*.mlp.experts", replace_module: {_target_: grouped_experts}}
	  - {match: ["*norm"], replace_module: {_target_: fused_rmsnorm}}
	YAML
	layout oss oss-k.yaml 2 $A.cp_size=2 &&
	sed "s/ulysses_attention/flash_attention/" oss-k.yaml >oss-f.yaml &&
	layout oss oss-f.yaml 8 $SEED8 &&
	layout oss oss.yaml 2 $A.pp_size=2 --activation_checkpoint.mode=full &&
	layout oss oss.yaml 4 $A.pp_size=2 $A.ep_size=2 && PTOL=
'

# The same with a sliding window of 8 on layer 0 (data/hf/tf5/gpt_oss-window):
# each CP rank's queries see the window across the chunk boundary.
test_expect_success MPI 'GPT-OSS with a window shorter than the rows: CP both modes, TP+SP, the seed layout' '
	d=$DATA/hf/tf5/gpt_oss-window && PTOL=1e-3 &&
	write_config ossw.yaml "$d" oss 32 1 4 6 </dev/null &&
	single ossw ossw.yaml &&
	layout ossw ossw.yaml 4 $A.cp_size=4 &&
	layout ossw ossw.yaml 2 $A.tp_size=2 $A.sequence_parallel=true &&
	sed "s|gpt_oss-yarn|gpt_oss-window|" oss-k.yaml >ossw-k.yaml &&
	layout ossw ossw-k.yaml 2 $A.cp_size=2 &&
	layout ossw ossw.yaml 8 $SEED8 && PTOL=
'

# DeepSeek-V3, as transformers saved it (data/hf/tf5/deepseek_v3-yarn and
# -nolora): latent attention (its latent projections and norms on every tp
# rank, their gradients summed over tp; the heads split), the shared RoPE'd
# key, v_head_dim apart, a dense layer 0, MoE layers with shared experts and
# the group-limited sigmoid router with its frozen correction bias.
test_expect_success MPI 'DeepSeek-V3: FSDP, TP+SP, EP with expert FSDP, CP both modes, the seed layout, pipeline stages' '
	d=$DATA/hf/tf5/deepseek_v3-yarn &&
	hf_records dsk "$d" &&
	write_config dsk.yaml "$d" dsk 32 1 4 6 </dev/null &&
	single dsk dsk.yaml &&
	layout dsk dsk.yaml 2 $F.dp_shard_size=2 &&
	layout dsk dsk.yaml 4 $A.tp_size=4 $A.sequence_parallel=true $A.loss_parallel=true &&
	layout dsk dsk.yaml 4 $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=4 &&
	layout dsk dsk.yaml 2 $A.cp_size=2 &&
	write_config dsk-k.yaml "$d" dsk 32 1 4 6 <<-YAML &&
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: ulysses_attention}}
	  - {match: "*.mlp.experts", replace_module: {_target_: hyper_parallel.models.deepseek_v3.adapter.replacements.replace_grouped_experts}}
	  - {match: ["*norm"], replace_module: {_target_: fused_rmsnorm}}
	YAML
	hp-plan --explain dsk-k.yaml --world 4 $A.cp_size=4 >ex &&
	grep -q "model.layers.1.mlp.experts .*grouped_experts" ex &&
	layout dsk dsk-k.yaml 4 $A.cp_size=4 &&
	sed "s/ulysses_attention/flash_attention/" dsk-k.yaml >dsk-f.yaml &&
	layout dsk dsk-f.yaml 8 $SEED8 &&
	layout dsk dsk.yaml 2 $A.pp_size=2 --activation_checkpoint.mode=full &&
	layout dsk dsk.yaml 4 $A.pp_size=2 $A.ep_size=2 &&
	d=$DATA/hf/tf5/deepseek_v3-nolora &&
	write_config dskn.yaml "$d" dsk 32 1 4 6 </dev/null &&
	single dskn dskn.yaml &&
	layout dskn dskn.yaml 2 $A.tp_size=2 $A.sequence_parallel=true &&
	layout dskn dskn.yaml 8 $SEED8 --activation_checkpoint.mode=selective
'

# Qwen3-Next and Qwen3.5, as transformers saved them (data/hf/tf5/qwen3_next-long:
# rows of 96 across the delta rule's chunk of 64; qwen3_5_moe-default):
# Gated DeltaNet layers 0 and 2 beside gated full attention, the MoE with
# its gated shared expert.  Tensor parallelism splits the delta rule's
# heads (its weights whole on every tp rank, their gradients summed over
# tp).  On the device (t0931) every layout runs the CUDA backend with
# gdn.cu's kernels emulated, its device bytes within 2% of the plan's; its
# exact mode is not the CPU's bits (its flash attention, its sums' order:
# 1e-8 in step 1's loss, 2.6e-6 in step 1's gradients in one process on
# these steep weights), and with tp's regrouped partial sums on top step
# 1's gradients are 1.0e-5 from the CPU's (the device's one process and
# its tp layout agree within 1e-5), so on the device the gradients are
# held to 3e-5 and the weights after 6 steps to 1e-4.
# The golden Qwen3.5 folders' weights make steep models (qwen3_5_moe's
# gradient norm goes 41 -> 175 in one step; torch in float32 is 4e-5 from
# float64 on them): the order of float32 sums a layout changes (1.6e-7 in
# step 1's gradients under FSDP) grows to 1e-5 by step 6, and regrouped
# rows (ep's experts, tp's partial sums) give 1.4e-5 to 5e-5 in step 1's
# gradients.  So qwen3_5_moe-default runs 3 steps and no ep, and Qwen3.5's
# tensor parallelism runs on hp's random init of qwen3_5-default's config
# (a from_config model as transformers initialises it), where the layouts
# agree to 3e-9.  Context parallelism splits the linear layers' heads over
# cp as ulysses splits attention's (an all-to-all to every token of the
# rank's heads and back), so it needs ulysses_attention bound and cp
# dividing the key heads per tp rank: tp 2 x cp 2 runs on that config
# with twice the heads.
test_expect_success MPI 'Qwen3-Next, Qwen3.5: FSDP, TP+SP, EP with expert FSDP, pipeline stages with checkpointing, fused norms and grouped experts' '
	d=$DATA/hf/tf5/qwen3_next-long && PTOL=${DEVICE_ARGS:+1e-4} GTOL=${DEVICE_ARGS:+3e-5} &&
	hf_records qn "$d" &&
	write_config qn.yaml "$d" qn 96 1 4 6 </dev/null &&
	single qn qn.yaml &&
	layout qn qn.yaml 2 $F.dp_shard_size=2 &&
	layout qn qn.yaml 4 $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=4 &&
	layout qn qn.yaml 2 $A.pp_size=2 --activation_checkpoint.mode=full &&
	layout qn qn.yaml 2 $A.tp_size=2 $A.sequence_parallel=true &&
	layout qn qn.yaml 4 $A.tp_size=2 $A.sequence_parallel=true $A.ep_size=2 $F.dp_shard_size=2 &&
	write_config qn-k.yaml "$d" qn 96 1 4 6 <<-YAML &&
	plan_overrides:
	  - {match: "*.mlp.experts", replace_module: {_target_: grouped_experts}}
	  - {match: ["*layernorm", "model.norm"], replace_module: {_target_: fused_rmsnorm}}
	YAML
	layout qn qn-k.yaml 4 $A.ep_size=4 &&
	write_config qn-u.yaml "$d" qn 96 1 4 6 <<-YAML &&
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: ulysses_attention}}
	YAML
	layout qn qn-u.yaml 2 $A.cp_size=2 &&
	layout qn qn-u.yaml 4 $A.cp_size=2 $F.dp_shard_size=2 --activation_checkpoint.mode=full &&
	sed "s/\[\"\*layernorm\", \"model.norm\"\]/[\"*norm\"]/" qn-k.yaml >qn-bad.yaml &&
	test_must_fail_with 3 hp-train -q qn-bad.yaml 2>err &&
	grep -q "kernel .fused_rmsnorm. computes rmsnorm, but .model.layers.0.linear_attn.norm. is a Qwen3NextRMSNormGated" err &&
	d=$DATA/hf/tf5/qwen3_5_moe-default &&
	hf_records q5r "$d" &&
	write_config q5.yaml "$d" q5r 32 1 4 3 </dev/null &&
	single q5 q5.yaml &&
	layout q5 q5.yaml 4 $F.dp_shard_size=4 --activation_checkpoint.mode=selective &&
	layout q5 q5.yaml 2 $A.pp_size=2 &&
	d=$DATA/hf/tf5/qwen3_5-default &&
	write_config q5d.yaml "$d" q5r 32 1 4 6 </dev/null &&
	as_from_config q5d.yaml "$d/config.json" &&
	single q5d q5d.yaml &&
	layout q5d q5d.yaml 2 $A.tp_size=2 &&
	layout q5d q5d.yaml 2 $A.tp_size=2 $A.sequence_parallel=true $A.loss_parallel=true &&
	layout q5d q5d.yaml 4 $A.tp_size=2 $F.dp_shard_size=2 --activation_checkpoint.mode=full &&
	test_must_fail_with 4 mpiexec -n 2 hp-train -q q5.yaml $A.cp_size=2 2>err &&
	grep -q "context parallelism over the Gated DeltaNet layers (layer_types linear_attention) splits their heads (ulysses): bind ulysses_attention" err &&
	test_must_fail_with 4 hp-plan q5.yaml --world 2 $A.cp_size=2 2>err && test_one_line err &&
	grep -q "splits their heads (ulysses)" err &&
	test_must_fail_with 3 mpiexec -n 4 hp-train -q q5d.yaml $A.tp_size=4 2>err &&
	grep -q "tp_size: 4 does not divide linear_num_key_heads 2" err &&
	d=$DATA/hf/tf5/qwen3_5-default &&
	jq ".linear_num_key_heads = 4 | .linear_num_value_heads = 8 | .num_attention_heads = 8 | .num_key_value_heads = 4" \
		"$d/config.json" >c4.json &&
	write_config q5w.yaml "$d" q5r 32 1 4 4 <<-YAML &&
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: ulysses_attention}}
	YAML
	as_from_config q5w.yaml "$PWD/c4.json" &&
	single q5w q5w.yaml &&
	layout q5w q5w.yaml 4 $A.cp_size=2 $A.tp_size=2 $A.sequence_parallel=true &&
	layout q5w q5w.yaml 2 $A.cp_size=2 --activation_checkpoint.mode=selective &&
	layout q5w q5w.yaml 4 $A.cp_size=4 &&
	jq ".num_attention_heads = 8 | .num_key_value_heads = 4" "$d/config.json" >c2.json &&
	sed "s|c4.json|c2.json|" q5w.yaml >q5x.yaml &&
	test_must_fail_with 3 hp-plan q5x.yaml --world 4 $A.cp_size=4 2>err && test_one_line err &&
	grep -q "cp_size: 4 does not divide the Gated DeltaNet key heads per tp rank (2; cp splits them again)" err
'

# training.moe_router_bias_update_rate (Megatron's name): after each step
# every layer's correction bias moves by the rate towards balance, b_x +=
# rate * sign(mean load - load_x), the loads the step's whole global batch's.
# The metrics carry the loads; the bias after 6 steps is the folder's plus
# the sum of those moves (float32 additions of +-rate: within 1e-6), the
# same in one process and over 8 ranks; at rate 0 it is the folder's, bit
# for bit; a model without the bias refuses the setting by name.
test_expect_success MPI 'DeepSeek-V3: the auxiliary-loss-free bias update, as its rule says, in one process and over 8 ranks' '
	d=$DATA/hf/tf5/deepseek_v3-yarn &&
	hp-train -q dsk.yaml ${DEVICE_ARGS:-} --training.moe_router_bias_update_rate=0.01 --metrics bu1.jsonl \
		--dump-params bu1.safetensors &&
	mpiexec -n 8 hp-train -q dsk.yaml ${DEVICE_ARGS:-} $SEED8 --training.moe_router_bias_update_rate=0.01 \
		--metrics bu8.jsonl \
		--dump-params bu8.safetensors &&
	test "$(jq -c .router_loads bu1.jsonl)" = "$(jq -c .router_loads bu8.jsonl)" &&
	test $(jq -c ".router_loads | length" bu1.jsonl | sort -u) = 2 &&
	jq -e ".router_loads | map(add) == [256, 256]" bu1.jsonl >/dev/null &&
	for l in 1 2; do
		b=model.layers.$l.mlp.gate.e_score_correction_bias &&
		hp-test-tool stget "$d/model.safetensors" $b >b0 &&
		hp-test-tool stget bu1.safetensors $b >b1 &&
		hp-test-tool stget bu8.safetensors $b >b8 &&
		cmp b1 b8 &&
		jq -s -r "[.[].router_loads[$l - 1] | (add / length) as \$m | map(if \$m > . then 1 elif \$m < . then -1 else 0 end)] |
			transpose | map(add * 0.01) | .[]" bu1.jsonl >moves &&
		paste b0 moves b1 | awk "{ d = \$1 + \$2 - \$3; if (d < 0) d = -d; if (d > 1e-6) { print; bad = 1 } }
			END { exit bad }" &&
		! cmp -s b0 b1 || return 1
	done &&
	hp-test-tool stget sp-dsk.safetensors model.layers.2.mlp.gate.e_score_correction_bias >z1 &&
	hp-test-tool stget "$d/model.safetensors" model.layers.2.mlp.gate.e_score_correction_bias >z0 &&
	cmp z0 z1 &&
	test_must_fail_with 4 hp-train -q qwen3-moe-a.yaml --training.moe_router_bias_update_rate=0.01 2>err &&
	test_one_line err && grep -q "model_type qwen3_moe has no expert bias to move" err &&
	# the one-process replay would not move the bias: refused, not left to diverge
	test_must_fail_with 4 mpiexec -n 2 hp-verify dsk.yaml ${DEVICE_ARGS:-} $F.dp_shard_size=2 \
		--training.moe_router_bias_update_rate=0.01 2>err &&
	grep -q "moe_router_bias_update_rate with hp-verify or validate_placement" err &&
	rm -f bv.jsonl &&
	test_must_fail_with 4 mpiexec -n 2 hp-train -q dsk.yaml ${DEVICE_ARGS:-} $F.dp_shard_size=2 \
		--model.validate_placement=true --training.moe_router_bias_update_rate=0.01 --metrics bv.jsonl 2>err &&
	grep -q "moe_router_bias_update_rate with hp-verify or validate_placement" err && test ! -e bv.jsonl
'

test_expect_success MPI 'the 8-rank metrics carry each step'\''s bytes: hp-plan'\''s estimate for rank 0' '
	mpiexec -n 8 hp-train -q qwen3-moe-b.yaml ${DEVICE_ARGS:-} $SEED8 --metrics p.jsonl &&
	hp-plan qwen3-moe-b.yaml --world 8 $SEED8 >plan.json &&
	# the expert rows that come back depend on the routing: not in the comparison
	jq -c "[.estimates.per_rank[] | select(.ranks | index(0)) | .comm[] | select(.op != \"all_to_allv\") |
		{(.dim): {(.op): .bytes}}] | reduce .[] as \$x ({}; . * \$x)" plan.json >want &&
	jq -c ".comm | del(.ep.all_to_allv)" p.jsonl | sort -u >got &&
	test $(wc -l <got) = 1 &&
	test "$(jq -S -c . want)" = "$(jq -S -c . got)" &&
	jq -e ".comm.ep.all_to_allv > 0" p.jsonl >/dev/null
'

# The trained model on its own stories predicts sharply (loss 1.6): after six
# AdamW steps, whose update divides by the root of the squared gradients,
# float rounding of the attention sums reaches 1.6e-5 in one weight.
test_expect_success MPI 'packed online rows (block-diagonal masks) over CP in both modes and TP' '
	PTOL=5e-5 &&
	jq -c "{text: .text}" "$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" |
		sed -n "47,346p" >stories.jsonl &&
	for u in "" ulysses; do
		{
			cat <<-YAML
			model:
			  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained
			  pretrained_model_name_or_path: $DATA/stories260K/hf
			training: {train_iters: 6, global_batch_size: 4, micro_batch_size: 2, seed: 1234}
			dataset:
			  _target_: hyper_parallel.data.build_online_text_dataset
			  data_path: stories.jsonl
			  data_transform: {data_type: plaintext, text_keys: [text], max_seq_len: 96}
			optimizer:
			  _target_: hyper_parallel.components.optim.AdamW
			  adamw_config: {adamw_lr: 1.0e-3}
			YAML
			test -z "$u" || printf "plan_overrides:\n  - {match: \"*.self_attn\", replace_module: {_target_: ulysses_attention}}\n"
		} >on$u.yaml &&
		single on$u on$u.yaml &&
		layout on$u on$u.yaml 2 $A.cp_size=2 &&
		layout on$u on$u.yaml 4 $A.cp_size=4 &&
		layout on$u on$u.yaml 4 $A.cp_size=2 $A.tp_size=2 $A.sequence_parallel=true || return 1
	done &&
	PTOL=
'

test_expect_success MPI 'hp-plan | hp-convert shards start the run where the HF folder does' '
	hp-plan qwen3-moe-b.yaml --world 8 $SEED8 ${DEVICE_ARGS:-} | hp-convert --plan - "$DATA/ref/qwen3-moe-b" -o shards &&
	layout qwen3-moe-b qwen3-moe-b.yaml 8 $SEED8 --shards shards &&
	# the plan itself in place of the YAML
	layout qwen3-moe-b shards/plan.json 8 --shards shards
'

test_expect_success CPUDEV 'a plan runs on the world it was made for, and takes no overrides' '
	test_must_fail_with 3 mpiexec -n 4 hp-train -q shards/plan.json 2>err &&
	grep -q "^hp-train: .shards/plan.json.: the plan is for 8 ranks, this job has 4; make the plan with hp-plan --world 4 or start 8 ranks$" err &&
	test_must_fail_with 3 mpiexec -n 8 hp-train -q shards/plan.json --training.train_iters=3 2>err &&
	grep -q "a plan is resolved already; give overrides such as .--training.train_iters=3. to hp-plan" err
'

test_expect_success MPI 'shards made for another layout are resharded as they load' '
	hp-plan qwen3-moe-b.yaml --world 4 $A.ep_size=4 | hp-convert --plan - "$DATA/ref/qwen3-moe-b" -o other &&
	layout qwen3-moe-b qwen3-moe-b.yaml 8 $SEED8 --shards other
'

test_expect_success CPUDEV 'a damaged shard is refused naming its file; one process takes no shards' '
	cp -r shards bad && f=bad/rank-00003-of-00008.safetensors &&
	sz=$(stat -c %s $f) && printf "\\377" | dd of=$f bs=1 seek=$((sz - 5)) conv=notrunc 2>/dev/null &&
	test_must_fail_with 4 mpiexec -n 8 hp-train -q qwen3-moe-b.yaml $SEED8 --shards bad 2>err &&
	cat err &&
	grep -q "rank-00003-of-00008.safetensors" err &&
	test_must_fail_with 3 hp-train -q qwen3-moe-b.yaml --shards shards 2>err &&
	grep -q "^hp-train: --shards: " err
'

test_expect_success CPUDEV 'mixed precision is refused on the CPU backend, not ignored' '
	test_must_fail_with 4 mpiexec -n 2 hp-train -q hf.yaml $F.dp_shard_size=2 \
		$F.mix_precision.param_dtype=bfloat16 2>err &&
	grep -q "^hp-train: .hf.yaml.: \$.fsdp_config.mix_precision.param_dtype: bfloat16 is not implemented on the CPU, which trains in float32" err
'

# The device's rounding: HP_CUDA_EMULATE=bf16 rounds, where a GPU's tensor
# cores read them, the operands of every GEMM and of attention to bf16
# (relative error up to 2^-9), and the all-gathered parameters and
# reduced gradients with mix_precision bfloat16.  Against the fp32 CPU
# run, 10 steps' losses move by up to 1.1e-3 relative (stories260K; the
# Qwen3 fixtures 2e-5) and step 1's gradients by up to 3.2e-2 relative L2
# (attention's k_proj, whose gradient is a difference of products of
# rounded q, k and dout): within 1e-2 and 1e-1.  The layouts agree with
# the device's own one-process run far closer than that, since they
# round the same operands.
bf16_layout () {
	name=$1 cfg=$2 n=$3; shift 3
	echo "# $name on $n ranks, bf16: $*"
	HP_CUDA_EMULATE=bf16 mpiexec -n $n hp-train "$cfg" $DEVICE_ARGS "$@" --metrics b.jsonl \
		--dump-grads bg.safetensors >out &&
	grep -q "^comm: every rank's bytes per collective and mesh dim equal the plan's estimate" out &&
	jq -r .loss b.jsonl >la && jq -r .loss "s-$name.jsonl" >lb &&
	paste la lb | awk '{ d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > m) m = d }
		END { printf "# largest relative loss difference %.3g\n", m; exit m > 1e-2 }' &&
	hp-test-tool cmpst --max-rel-l2 1e-1 "sg-$name.safetensors" bg.safetensors >cmp &&
	! grep -q FAIL cmp
}

test_expect_success DEVICE 'on the device, bf16: every kind of layout within bf16 bounds of the fp32 CPU run' '
	bf16_layout hf hf.yaml 2 $A.tp_size=2 $A.sequence_parallel=true $A.loss_parallel=true &&
	bf16_layout hf hf.yaml 4 $A.cp_size=4 &&
	bf16_layout hf hf-ul.yaml 2 $A.cp_size=2 &&
	bf16_layout qwen3-moe-a qwen3-moe-a.yaml 4 $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=4 &&
	bf16_layout qwen3-moe-b qwen3-moe-b.yaml 8 $SEED8
'

# The device rounding where a GPU rounds (bf16 GEMM and attention
# operands) against the fp32 CPU run, on hp's random init of the Qwen3-Next
# and Qwen3.5 configs: the golden folders' steep weights turn bf16's
# rounding into 30% to 50% of step 1's gradients (torch's float32 is 4e-5
# from float64 on them), these into 5.5e-3.
test_expect_success DEVICE 'Qwen3-Next, Qwen3.5 on the device, bf16: within bf16 bounds of the fp32 CPU run' '
	d=$DATA/hf/tf5/qwen3_next-long &&
	hf_records qn "$d" &&
	write_config qnd.yaml "$d" qn 96 1 4 6 </dev/null &&
	as_from_config qnd.yaml "$d/config.json" &&
	single qnd qnd.yaml &&
	d=$DATA/hf/tf5/qwen3_5-default &&
	hf_records q5r "$d" &&
	write_config q5d.yaml "$d" q5r 32 1 4 6 </dev/null &&
	as_from_config q5d.yaml "$d/config.json" &&
	single q5d q5d.yaml &&
	bf16_layout qnd qnd.yaml 2 $F.dp_shard_size=2 &&
	bf16_layout qnd qnd.yaml 2 $A.tp_size=2 $A.sequence_parallel=true &&
	bf16_layout q5d q5d.yaml 2 $A.tp_size=2
'

# mix_precision on the device: FSDP gathers the parameters and reduces the
# gradients in bf16; the plan counts them at 2 bytes.  In exact mode the
# bf16 values keep their fp32 bits (the emulation's shadows), so the run is
# the CPU's to 1e-5 while the counters count what a GPU would send.
test_expect_success DEVICE 'on the device, mix_precision bfloat16 over ranks: bf16 bytes as the plan says' '
	MP="$F.mix_precision.param_dtype=bfloat16 $F.mix_precision.reduce_dtype=bfloat16" &&
	layout qwen3-moe-b qwen3-moe-b.yaml 8 $SEED8 $MP >log && cat log &&
	grep -q "^run.device_comm .*params gather in bfloat16, gradients reduce in bfloat16" out &&
	hp-plan qwen3-moe-b.yaml --world 8 $SEED8 $DEVICE_ARGS $MP >mp.json &&
	hp-plan qwen3-moe-b.yaml --world 8 $SEED8 $DEVICE_ARGS >fp.json &&
	jq "[.estimates.per_rank[] | select(.ranks | index(0)) | .comm[] | select(.dim == \"dp_shard\" and .op == \"all_gather\") | .bytes][0]" mp.json >a &&
	jq "[.estimates.per_rank[] | select(.ranks | index(0)) | .comm[] | select(.dim == \"dp_shard\" and .op == \"all_gather\") | .bytes][0]" fp.json >b &&
	test $(($(cat b) / 2)) = $(cat a) &&
	bf16_layout qwen3-moe-b qwen3-moe-b.yaml 8 $SEED8 $MP &&
	test_must_fail_with 4 hp-train -q hf.yaml $DEVICE_ARGS $F.mix_precision.param_dtype=bfloat16 2>err &&
	grep -q "one rank has no FSDP gathers or reductions for it to apply to" err &&
	test_must_fail_with 4 hp-train -q hf.yaml $DEVICE_ARGS $F.mix_precision.reduce_dtype=float16 2>err &&
	grep -q "reduce_dtype: float16 is not implemented (bfloat16 or float32)" err &&
	test_must_fail_with 4 mpiexec -n 2 hp-train -q hf.yaml $DEVICE_ARGS $F.dp_shard_size=2 \
		$F.mix_precision.output_dtype=bfloat16 2>err &&
	grep -q "output_dtype: bfloat16 is not implemented: the modules. outputs are float32" err
'

# What the device holds, counted by the backend (the same code on a GPU and
# in the emulation): the plan's device bytes within 2% on every rank (every
# layout above checks that too), the high-water mark in every metrics row,
# never falling.  FSDP holds a unit's weights and gradients in device
# memory only while it is gathered: 4 ranks of a model hold less than half
# of one process.  A layout beyond the GPU's memory is refused before it
# allocates anything, the plan's bytes and the GPU's in one line.
test_expect_success DEVICE 'on the device, every metrics row has the backend device high-water mark, as the plan says' '
	mpiexec -n 8 hp-train qwen3-moe-b.yaml $DEVICE_ARGS $SEED8 --metrics dv.jsonl >out &&
	hp-plan qwen3-moe-b.yaml --world 8 $SEED8 $DEVICE_ARGS >dp.json &&
	grep "^host memory: .*; device memory: peak [0-9.]* MiB on the largest rank, the plan.s [0-9.]* MiB: every rank within 2%$" out &&
	jq -s -e "length > 1 and all(.device_bytes_peak > 0) and
		([.[].device_bytes_peak] == ([.[].device_bytes_peak] | sort))" dv.jsonl >/dev/null &&
	peak=$(jq -s "map(.device_bytes_peak) | max" dv.jsonl) &&
	jq -e --argjson p "$peak" "([.estimates.per_rank[].device_bytes] | max) as \$d |
		\$p >= 0.98 * \$d and \$p <= 1.02 * \$d" dp.json
'

test_expect_success DEVICE 'on the device, FSDP over 4 ranks holds under 3/4 of one process, as the plan says' '
	mkdir -p l4 &&
	cat >l4/config.json <<-JSON &&
	{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
	 "intermediate_size": 1376, "num_hidden_layers": 4, "num_attention_heads": 8,
	 "num_key_value_heads": 8, "vocab_size": 512, "max_position_embeddings": 64,
	 "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "torch_dtype": "float32"}
	JSON
	random_config l4.yaml l4 ts 64 1 4 2 </dev/null &&
	hp-train l4.yaml $DEVICE_ARGS --metrics d1.jsonl >out1 &&
	mpiexec -n 4 hp-train l4.yaml $DEVICE_ARGS $F.dp_shard_size=4 --metrics d4.jsonl >out4 &&
	grep "device memory: peak .*: every rank within 2%" out1 &&
	grep "device memory: peak .*: every rank within 2%" out4 &&
	one=$(jq -s "map(.device_bytes_peak) | max" d1.jsonl) &&
	four=$(jq -s "map(.device_bytes_peak) | max" d4.jsonl) &&
	echo "# device bytes: $one in one process, $four on each of 4 ranks" &&
	test "$four" -lt "$((one * 3 / 4))"
'

test_expect_success DEVICE 'on the device, a layout beyond the GPU memory is refused before training, naming both' '
	need=$(hp-plan hf.yaml --world 1 $DEVICE_ARGS | jq ".estimates.per_rank[0].device_bytes") &&
	HP_CUDA_EMULATE_MEMORY=$((need - 1)) test_must_fail_with 3 hp-train -q hf.yaml $DEVICE_ARGS --metrics no.jsonl 2>err &&
	test "$(wc -l <err)" = 1 &&
	grep "rank 0 needs [0-9.]* GiB of device memory (hp-plan.s device_bytes), cuda (emulated on the host, exact) has [0-9.]* GiB free: shard further" err &&
	! test -s no.jsonl &&
	HP_CUDA_EMULATE_MEMORY=$need hp-train -q hf.yaml $DEVICE_ARGS --training.train_iters=1 &&
	HP_CUDA_EMULATE_MEMORY=$((need / 3)) test_must_fail_with 3 mpiexec -n 2 hp-train -q hf.yaml $DEVICE_ARGS \
		$F.dp_shard_size=2 2>err &&
	grep "needs [0-9.]* GiB of device memory" err &&
	hp-plan hf.yaml --world 2 $DEVICE_ARGS $A.cp_size=2 >cp.json &&
	m0=$(jq ".estimates.per_rank[] | select(.ranks == [0]) | .device_bytes" cp.json) &&
	HP_CUDA_EMULATE_MEMORY=$m0 test_must_fail_with 3 mpiexec -n 2 hp-train -q hf.yaml $DEVICE_ARGS \
		$A.cp_size=2 2>err &&
	grep "rank 1 needs [0-9.]* GiB of device memory" err &&
	grep "another rank.s layout needs more device memory than its GPU has (see its message)" err &&
	HP_CUDA_EMULATE_MEMORY=80Q test_must_fail_with 3 hp-train -q hf.yaml $DEVICE_ARGS 2>err &&
	grep "HP_CUDA_EMULATE_MEMORY=80Q: expected" err
'

# The host waits for the device (a stream synchronised, a download, a sum
# read back): counted per step by the backend, the same on a GPU and in the
# emulation.  In one process the count does not grow with the layers.
test_expect_success DEVICE 'on the device, each step counts its host syncs; one process: as many for 2 layers as for 5' '
	for n in 2 5; do
		echo "num_hidden_layers: $n" | random_config y$n.yaml "$DATA/stories260K/hf" ts 64 2 4 3 &&
		hp-train -q y$n.yaml $DEVICE_ARGS --metrics y$n.jsonl || return 1
	done &&
	jq -s -e "length == 3 and all(.host_syncs > 0)" y2.jsonl >/dev/null &&
	jq -s -c "[.[1:][].host_syncs]" y2.jsonl >s2 && jq -s -c "[.[1:][].host_syncs]" y5.jsonl >s5 &&
	cat s2 s5 && cmp s2 s5
'

# The calls that put work on the device (kernels, GEMMs, copies, memsets),
# counted per step by the backend on a GPU and in the emulation alike: the
# same every step of a dense model, more for more layers.
test_expect_success DEVICE 'on the device, each step counts its kernel launches, the same every step' '
	for n in 2 5; do
		jq -s -e "all(.kernel_launches > 0) and (.[1].kernel_launches == .[2].kernel_launches)" \
			y$n.jsonl >/dev/null || return 1
	done &&
	a=$(jq -s ".[2].kernel_launches" y2.jsonl) && b=$(jq -s ".[2].kernel_launches" y5.jsonl) &&
	echo "# launches per step: $a for 2 layers, $b for 5" &&
	test "$b" -gt "$a"
'

# MoE layers on the device: the routing table, the experts' GEMMs (one
# grouped call per projection for every expert) and the load-balancing
# sums stay on the backend, so a step's launches do not grow with the
# experts; the step's sums (loss, norm, the update's clip factor and gate)
# stay there too and are read once, at its end: one process waits for its
# device once a step, whatever its layers.
test_expect_success DEVICE 'MoE on the device: launches per step the same for 16 and 64 experts, 1 sync a step' '
	for e in 16 64; do
		for l in 3 5; do
			mkdir -p e$e-$l &&
			jq ".num_experts = $e | .num_hidden_layers = $l" "$DATA/ref/qwen3-moe-a/config.json" \
				>e$e-$l/config.json &&
			random_config e$e-$l.yaml "$PWD/e$e-$l" ts 64 2 8 3 </dev/null &&
			hp-train -q e$e-$l.yaml $DEVICE_ARGS --metrics e$e-$l.jsonl || return 1
		done
	done &&
	for f in e16-3 e64-3 e16-5 e64-5; do
		jq -s -e "length == 3 and .[1].kernel_launches == .[2].kernel_launches" $f.jsonl >/dev/null || return 1
	done &&
	a=$(jq -s ".[2].kernel_launches" e16-3.jsonl) && b=$(jq -s ".[2].kernel_launches" e64-3.jsonl) &&
	echo "# launches per step, 2 MoE layers: $a with 16 experts, $b with 64" &&
	test $((b * 100)) -le $((a * 115)) &&
	for f in e16-3 e64-3 e16-5 e64-5; do
		jq -s -e "all(.[].host_syncs; . == 1)" $f.jsonl >/dev/null || { jq -s -c "[.[].host_syncs]" $f.jsonl; return 1; }
	done
'

# The device decides by itself whether a step updates (the step's sums,
# clip factor and gate stay there; t/unit/test-cuda-gemm holds the gate to
# the host's): a NaN step stops the run with the CPU's message.
test_expect_success DEVICE 'on the device, a NaN step is not applied and stops the run as on the CPU' '
	test_must_fail_with 1 hp-train -q hf.yaml $DEVICE_ARGS --lr_scheduler=null \
		--optimizer.adamw_config.adamw_lr=1e30 --training.max_grad_norm=0 --training.train_iters=4 2>err &&
	test_one_line err &&
	grep -q "^hp-train: step 2: the loss is nan and the gradient norm nan: stopped before its update" err
'

# HP_CUDA_PROFILE=1: each launch timed on the compute stream, the shares
# per kernel family at the run's end (100% in all, the same losses: the
# marks time, they change no number); a bad value refused on any device.
test_expect_success DEVICE 'on the device, HP_CUDA_PROFILE=1 ends the run with each kernel family'"'"'s share' '
	HP_CUDA_PROFILE=1 hp-train e16-3.yaml $DEVICE_ARGS --metrics p.jsonl >out &&
	grep "^kernel time: rank 0.s compute stream, 3 steps" out >line &&
	for f in gemm experts attention routing loss optimizer; do
		grep -q " $f [0-9.]*%" line || { cat line; return 1; }
	done &&
	tr " " "\n" <line | grep "%$" | tr -d % | awk "{ s += \$1 } END { exit (s < 99 || s > 101) }" &&
	jq -c .loss p.jsonl >a && jq -c .loss e16-3.jsonl >b && cmp a b &&
	test_must_fail_with 3 env HP_CUDA_PROFILE=yes hp-train -q hf.yaml 2>err &&
	test_one_line err && grep -q "HP_CUDA_PROFILE=yes: expected 1 or 0" err
'

test_done
