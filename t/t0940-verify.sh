#!/bin/sh
test_description='hp-verify and validation mode: every layout is the one-process model, and each injected fault is named where it happens'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

A=--accelerator
F=--fsdp_config
SEED8="$A.tp_size=2 $A.cp_size=2 $A.ep_size=2 $A.sequence_parallel=true $F.dp_shard_size=2 $F.edp_shard_size=2"

test_expect_success MPI 'setup: TinyStories records and a config per model' '
	make_tinystories ts 64 &&
	for m in stories260K/hf ref/qwen3-dense ref/qwen3-moe-a ref/qwen3-moe-b; do
		write_config $(basename $m).yaml "$DATA/$m" ts 64 2 16 10 </dev/null || return 1
	done &&
	write_config ul.yaml "$DATA/stories260K/hf" ts 64 2 16 10 <<-YAML
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: ulysses_attention}}
	YAML
'

# verify N CONFIG OVERRIDES...: hp-verify passes, and says how many checks
verify () {
	n=$1 cfg=$2; shift 2
	mpiexec -n $n hp-verify "$cfg" ${DEVICE_ARGS:-} "$@" >out &&
	tail -n 1 out &&
	grep -q "^verdict: all [0-9]* checks of 2 steps match" out &&
	! grep -q DIFFERS out
}

test_expect_success MPI 'hp-verify passes for every layout of the parallel training test' '
	verify 2 hf.yaml $F.dp_shard_size=2 &&
	verify 4 hf.yaml $F.dp_shard_size=2 &&
	verify 2 hf.yaml $A.tp_size=2 &&
	verify 4 hf.yaml $A.tp_size=4 $A.sequence_parallel=true $A.loss_parallel=true &&
	verify 2 qwen3-dense.yaml $A.tp_size=2 $A.loss_parallel=true &&
	verify 4 hf.yaml $A.cp_size=4 &&
	verify 4 ul.yaml $A.cp_size=4 &&
	verify 2 qwen3-moe-a.yaml $A.tp_size=2 $A.sequence_parallel=true &&
	verify 4 qwen3-moe-a.yaml $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=4 &&
	verify 8 qwen3-moe-b.yaml $A.ep_size=4 $F.edp_shard_size=2 $F.dp_shard_size=8 &&
	verify 8 qwen3-moe-b.yaml $SEED8 &&
	verify 8 hf.yaml $A.tp_size=2 $A.cp_size=2 $F.dp_shard_size=4
'

test_expect_success MPI 'hp-verify on GPT-OSS (sinks, expert biases, clamped SwiGLU, a window of 8): EP with expert FSDP, TP+SP, CP' '
	d=$DATA/hf/tf5/gpt_oss-window &&
	hf_records oss "$d" &&
	write_config oss.yaml "$d" oss 32 1 4 2 </dev/null &&
	verify 4 oss.yaml $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=4 &&
	grep -q "model.layers.1.mlp.experts.3.up_proj.bias" out &&
	grep -q "model.layers.0.self_attn.sinks" out &&
	verify 2 oss.yaml $A.tp_size=2 $A.sequence_parallel=true &&
	verify 2 oss.yaml $A.cp_size=2
'

test_expect_success MPI 'hp-verify on DeepSeek-V3 (latent attention, shared experts, the group router): EP with expert FSDP, TP+SP, CP' '
	d=$DATA/hf/tf5/deepseek_v3-yarn &&
	hf_records dsk "$d" &&
	write_config dsk.yaml "$d" dsk 32 1 4 2 </dev/null &&
	verify 4 dsk.yaml $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=4 &&
	grep -q "model.layers.1.self_attn.kv_b_proj.weight" out &&
	grep -q "model.layers.2.mlp.shared_experts.down_proj.weight" out &&
	verify 4 dsk.yaml $A.tp_size=4 $A.sequence_parallel=true &&
	grep -q "model.layers.0.self_attn.q_a_layernorm.weight" out &&
	verify 2 dsk.yaml $A.cp_size=2
'

# TP+SP on hp's random init of the folder's config: the golden weights
# make a steep model (t/t0930), where tp's partial sums alone move step 1's
# gradients by 1.5e-5, past hp-verify's 1e-5
test_expect_success MPI 'hp-verify on Qwen3-Next (Gated DeltaNet, gated attention, the gated shared expert): EP with expert FSDP, TP+SP, CP; a stale shard and a skipped out_proj reduction named' '
	d=$DATA/hf/tf5/qwen3_next-default &&
	hf_records qn "$d" &&
	write_config qn.yaml "$d" qn 32 1 4 2 </dev/null &&
	verify 4 qn.yaml $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=4 &&
	grep -q "^output  *model.layers.0.linear_attn " out &&
	cp qn.yaml qnc.yaml && as_from_config qnc.yaml "$d/config.json" &&
	verify 2 qnc.yaml $A.tp_size=2 $A.sequence_parallel=true &&
	cat >>qnc.yaml <<-YAML &&
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: ulysses_attention}}
	YAML
	verify 2 qnc.yaml $A.cp_size=2 &&
	grep -q "model.layers.0.linear_attn.in_proj_qkvz.weight" out &&
	grep -q "model.layers.2.linear_attn.A_log" out &&
	grep -q "model.layers.1.mlp.shared_expert_gate.weight" out &&
	test_must_fail_with 1 mpiexec -n 2 hp-verify qn.yaml ${DEVICE_ARGS:-} $F.dp_shard_size=2 \
		--debug.inject_fault=fsdp_stale_shard >out 2>err &&
	grep -q "first divergence: step 2, the output of model.layers.0.input_layernorm" out &&
	test_must_fail_with 1 mpiexec -n 2 hp-verify qnc.yaml ${DEVICE_ARGS:-} $A.tp_size=2 $A.sequence_parallel=true \
		--debug.inject_fault=tp_skip_reduce >out 2>err &&
	grep -q "first divergence: step 1, the output of model.layers.0.linear_attn (" out
'

test_expect_success MPI 'the table has every module output, gradient and updated parameter; --json says the same' '
	mpiexec -n 8 hp-verify qwen3-moe-b.yaml ${DEVICE_ARGS:-} $SEED8 --json >v.json &&
	jq -e ".ok == true and .first_divergence == null and .steps == 2" v.json &&
	jq -r ".rows[] | select(.kind == \"output\") | .name" v.json >outputs &&
	test "$(head -n 1 outputs)" = model.embed_tokens &&
	test "$(tail -n 1 outputs)" = lm_head &&
	test $(wc -l <outputs) = $((1 + 2 * 4 + 2)) &&
	test $(jq "[.rows[] | select(.kind == \"grad\")] | length" v.json) = \
		$(hp-plan qwen3-moe-b.yaml --world 8 $SEED8 | jq ".params | length") &&
	test $(jq "[.rows[] | select(.kind == \"param\")] | length" v.json) = \
		$(jq "[.rows[] | select(.kind == \"grad\")] | length" v.json)
'

# fault NAME WHAT: hp-verify and validation mode both stop at WHAT (a
# regular expression for the start of the first-divergence text)
fault () {
	echo "# $1"
	test_must_fail_with 1 mpiexec -n 8 hp-verify qwen3-moe-b.yaml ${DEVICE_ARGS:-} $SEED8 --debug.inject_fault=$1 \
		>out 2>err &&
	grep "^first divergence: " out &&
	grep -q "^first divergence: $2" out &&
	grep -q "^hp-verify: the parallel run differs from one process: $2" err &&
	test_must_fail_with 1 mpiexec -n 8 hp-train -q qwen3-moe-b.yaml ${DEVICE_ARGS:-} $SEED8 --debug.inject_fault=$1 \
		--model.validate_placement=true 2>err &&
	test $(grep -c "validation: $2" err) = 8
}

test_expect_success MPI 'each injected fault is named at its module and step, by hp-verify and by validation mode' '
	fault tp_skip_reduce "step 1, the output of model.layers.0.self_attn (" &&
	fault sp_skip_gather "step 1, the output of model.layers.0.input_layernorm: declared tp replicate, but" &&
	fault cp_wrong_offset "step 1, the output of model.layers.0.self_attn (" &&
	fault cp_skip_kv_grad_reduce "step 1, the gradient of model.layers.0.self_attn\." &&
	fault ep_wrong_route "step 1, the output of model.layers.0.mlp (" &&
	fault ep_drop_token "step 1, the output of model.layers.0.mlp (" &&
	fault fsdp_stale_shard "step 2, the output of model.layers.0.input_layernorm (" &&
	fault grad_scale "step 1, the gradient of lm_head.weight ("
'

test_expect_success CPUDEV 'validation costs production nothing: the same bytes as the plan, the same losses' '
	mpiexec -n 8 hp-train qwen3-moe-b.yaml $SEED8 --training.train_iters=3 --metrics p.jsonl >out &&
	grep -q "^comm: every rank" out &&
	mpiexec -n 8 hp-train qwen3-moe-b.yaml $SEED8 --training.train_iters=3 --metrics v.jsonl \
		--model.validate_placement=true >out &&
	grep -q "^comm: every rank" out &&
	jq -c "[.loss, .comm]" p.jsonl >a && jq -c "[.loss, .comm]" v.jsonl >b && cmp a b
'

test_expect_success CPUDEV 'bad uses are one line and a documented status' '
	test_must_fail_with 3 hp-verify hf.yaml 2>err &&
	grep -q "^hp-verify: hp-verify holds a layout over ranks to one process; run it under mpiexec" err &&
	test_must_fail_with 3 mpiexec -n 2 hp-verify hf.yaml $A.tp_size=2 --debug.inject_fault=nope 2>err &&
	grep -q "unknown fault .nope. (known: tp_skip_reduce, sp_skip_gather," err &&
	test_must_fail_with 3 mpiexec -n 2 hp-verify hf.yaml $A.tp_size=2 --debug.inject_fault=ep_drop_token 2>err &&
	grep -q "ep_drop_token breaks a collective this layout does not have" err &&
	test_must_fail_with 2 hp-verify hf.yaml --steps 0 2>err &&
	grep -q "^hp-verify: --steps: .0. is not a positive whole number" err &&
	test_must_fail_with 2 hp-verify 2>err &&
	hp-verify -h >help && grep -q "^usage: mpiexec -n N hp-verify CONFIG.yaml|PLAN.json" help
'

test_done
