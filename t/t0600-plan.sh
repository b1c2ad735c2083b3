#!/bin/sh
test_description='hp-plan: meshes, placements, overrides and checks of a resolved plan'
. "$(dirname "$0")/test-lib.sh"

PLANS=$TEST_DIR/plan

# The seed's 8-rank example on the small Qwen3-MoE fixture (4 heads, 2 KV heads).
seed_config () {
	sed -e "s|^  pretrained_model_name_or_path: .*|  pretrained_model_name_or_path: $DATA/ref/qwen3-moe-a|" \
		"$TEST_DIR/config/seed-8rank.yaml" >"$1"
}

# jq_is EXPR FILE WANT: jq -c EXPR FILE prints exactly WANT
jq_is () {
	got=$(jq -c "$1" "$2") &&
	if [ "$got" != "$3" ]; then echo "$1: got $got, want $3" >&2; return 1; fi
}

test_expect_success 'the 8-rank example gives the groups of DESIGN.md §3' '
	seed_config s8.yaml &&
	hp-plan s8.yaml --world 8 >p8.json &&
	jq_is .meshes.dense.groups.tp p8.json "[[0,1],[2,3],[4,5],[6,7]]" &&
	jq_is .meshes.dense.groups.cp p8.json "[[0,2],[1,3],[4,6],[5,7]]" &&
	jq_is .meshes.dense.groups.dp p8.json "[[0,4],[1,5],[2,6],[3,7]]" &&
	jq_is .meshes.fsdp.groups.dp_shard p8.json "[[0,2],[1,3],[4,6],[5,7]]" &&
	jq_is .meshes.fsdp.groups.dp_replicate p8.json "[[0,4],[1,5],[2,6],[3,7]]" &&
	jq_is .meshes.expert.groups.ep p8.json "[[0,1],[2,3],[4,5],[6,7]]" &&
	jq_is .meshes.expert.groups.edp_shard p8.json "[[0,2],[1,3],[4,6],[5,7]]" &&
	jq_is .meshes.expert.groups.edp_replicate p8.json "[[0,4],[1,5],[2,6],[3,7]]" &&
	jq_is ".parallel | [.dp, .dp_shard, .dp_replicate, .edp, .edp_shard, .edp_replicate]" p8.json "[2,2,2,4,2,2]"
'

# placement NAME: the placements of parameter NAME in p8.json
pl () {
	jq -c --arg n "$1" ".params[] | select(.name == \$n) | .placements" p8.json
}

test_expect_success 'the 8-rank example gives the placements of DESIGN.md §4' '
	d="\"dp\":\"replicate\",\"cp\":\"replicate\"" &&
	f="\"dp_replicate\":\"replicate\",\"dp_shard\":\"shard(0)\"" &&
	test "$(pl model.embed_tokens.weight)" = "{$d,\"tp\":\"shard(0)\",$f}" &&
	test "$(pl model.layers.1.self_attn.q_proj.weight)" = "{$d,\"tp\":\"shard(0)\",$f}" &&
	test "$(pl model.layers.1.self_attn.k_proj.weight)" = "{$d,\"tp\":\"shard(0)\",$f}" &&
	test "$(pl model.layers.1.self_attn.o_proj.weight)" = "{$d,\"tp\":\"shard(1)\",$f}" &&
	test "$(pl model.layers.0.mlp.gate_proj.weight)" = "{$d,\"tp\":\"shard(0)\",$f}" &&
	test "$(pl model.layers.0.mlp.down_proj.weight)" = "{$d,\"tp\":\"shard(1)\",$f}" &&
	test "$(pl model.layers.1.self_attn.q_norm.weight)" = "{$d,\"tp\":\"replicate\",$f}" &&
	test "$(pl model.layers.1.input_layernorm.weight)" = "{$d,\"tp\":\"replicate\",$f}" &&
	test "$(pl model.layers.1.mlp.gate.weight)" = "{$d,\"tp\":\"replicate\",$f}" &&
	test "$(pl model.norm.weight)" = "{$d,\"tp\":\"replicate\",$f}" &&
	test "$(pl model.layers.2.mlp.experts.5.up_proj.weight)" = \
		"{\"edp_replicate\":\"replicate\",\"edp_shard\":\"shard(0)\",\"ep\":\"shard(0)\"}" &&
	jq_is "[.params[] | select(.name | test(\"layers.1.mlp.experts.[0-9]+.gate_proj\")) | .ep_owner]" \
		p8.json "[0,0,0,0,1,1,1,1]" &&
	jq_is "[.params[] | select(.name | test(\"experts\")) | .mesh] | unique" p8.json "[\"expert\"]"
'

test_expect_success 'the parameter list is the model'\''s, and the units cover it once' '
	jq -r ".params[].name" p8.json >names &&
	test $(wc -l <names) = $(jq "[.fsdp_units[].params[]] | length" p8.json) &&
	jq -r ".fsdp_units[].params[]" p8.json | sort >unit-names &&
	sort names | cmp - unit-names &&
	jq_is "[.fsdp_units[] | [.name, .mesh]]" p8.json \
		"[[\"model\",\"fsdp\"],[\"model.layers.0\",\"fsdp\"],[\"model.layers.1\",\"fsdp\"],[\"model.layers.1.mlp.experts\",\"expert\"],[\"model.layers.2\",\"fsdp\"],[\"model.layers.2.mlp.experts\",\"expert\"]]"
'

test_expect_success 'plan_overrides bind the three kernels; the rest stay on the reference' '
	jq_is "[.modules[] | select(.name == \"model.norm\" or .name == \"model.layers.2.self_attn\" or .name == \"model.layers.2.mlp.experts\" or .name == \"model.layers.2.self_attn.q_norm\") | [.kernel, .override]]" \
		p8.json "[[\"flash_attention\",1],[\"reference.rmsnorm\",null],[\"grouped_experts\",2],[\"fused_rmsnorm\",0]]" &&
	jq_is "[.modules[] | select(.name == \"model.layers.0.mlp\") | .class]" p8.json "[\"Qwen3MoeMLP\"]"
'

test_expect_success 'the newer module_replacement spelling of the targets binds the same kernels' '
	sed -e "s|adapter.replacements|adapter.conversion.module_replacement|" s8.yaml >new.yaml &&
	hp-plan new.yaml --world 8 >pn.json &&
	jq "del(.hash, .config)" p8.json >a &&
	jq "del(.hash, .config)" pn.json >b &&
	cmp a b
'

test_expect_success 'a plan is byte-identical from run to run, and its hash checks out' '
	hp-plan s8.yaml --world 8 >again.json &&
	cmp p8.json again.json &&
	sed -e "3s/\"hash\": \"[0-9a-f]*\"/\"hash\": \"\"/" p8.json | head -c -1 | sha256sum >sum &&
	test "$(cut -d" " -f1 sum)" = "$(jq -r .hash p8.json)"
'

test_expect_success 'the world size comes from SLURM_NTASKS, and is required' '
	SLURM_NTASKS=8 hp-plan s8.yaml >slurm.json &&
	cmp p8.json slurm.json &&
	(unset SLURM_NTASKS; test_must_fail_with 2 hp-plan s8.yaml >/dev/null 2>err) &&
	grep -q "no world size" err
'

# bad_plan CODE SUBSTRING ARGS...: hp-plan fails with CODE, one line naming SUBSTRING
bad_plan () {
	code=$1; msg=$2; shift 2
	test_must_fail_with "$code" hp-plan "$@" >out 2>err &&
	test_one_line err && grep -F -q -e "$msg" err && ! test -s out
}

test_expect_success 'checks: tp*cp must divide the world' '
	bad_plan 3 "world size 6 is not divisible by pp_size*tp_size*cp_size = 4" s8.yaml --world 6
'
test_expect_success 'checks: dp_shard_size must divide dp*cp' '
	bad_plan 3 "\$.fsdp_config.dp_shard_size: 3 does not divide dp*cp = 4" s8.yaml --world 8 --fsdp_config.dp_shard_size=3
'
test_expect_success 'checks: ep_size must divide the world' '
	bad_plan 3 "\$.accelerator.ep_size: 3 does not divide the 8 ranks of a pipeline stage" s8.yaml --world 8 --accelerator.ep_size=3
'
test_expect_success 'checks: edp_shard_size must divide edp' '
	bad_plan 3 "\$.fsdp_config.edp_shard_size: 3 does not divide edp" s8.yaml --world 8 --fsdp_config.edp_shard_size=3
'
test_expect_success 'checks: tp_size must divide the attention and KV heads' '
	bad_plan 3 "does not divide num_attention_heads 4" s8.yaml --world 8 --accelerator.tp_size=8 --accelerator.cp_size=1 --fsdp_config.dp_shard_size=1 &&
	bad_plan 3 "does not divide num_key_value_heads 2" s8.yaml --world 8 --accelerator.tp_size=4 --accelerator.cp_size=1 --fsdp_config.dp_shard_size=1
'
test_expect_success 'checks: ep_size must divide num_experts' '
	bad_plan 3 "\$.accelerator.ep_size: 16 does not divide num_experts 8" s8.yaml --world 16 --accelerator.ep_size=16 --fsdp_config.edp_shard_size=1
'
test_expect_success 'checks: seq_length must be divisible by cp (times tp with sequence parallel)' '
	bad_plan 3 "seq_length: 4094 is not divisible by cp_size*tp_size (sequence_parallel) = 4" s8.yaml --world 8 --dataset.data_config.seq_length=4094 &&
	hp-plan s8.yaml --world 8 --dataset.data_config.seq_length=4094 --accelerator.tp_size=1 \
		--accelerator.sequence_parallel=false >/dev/null
'
# The config loader refuses pp_size > 1 already; hp_plan_resolve checks again
# for callers that fill struct hp_config themselves.
# qwen3-moe-b: 2 layers, untied, no load-balancing loss; 16 rows of 1 per step
P2="$PLANS/fsdp-2.yaml"
test_expect_success 'checks: pipeline stages, each refused by key with the numbers' '
	bad_plan 3 "world size 8 is not divisible by pp_size*tp_size*cp_size = 12" s8.yaml --world 8 --accelerator.pp_size=3 &&
	bad_plan 3 "\$.accelerator.pp_size: 4 stages for 2 layers" "$P2" --world 4 --accelerator.pp_size=4 &&
	bad_plan 3 "\$.accelerator.pp_layer_split: the stages'"'"' layers add up to 3, the model has 2" "$P2" --world 2 --accelerator.pp_size=2 "--accelerator.pp_layer_split=[1,2]" &&
	bad_plan 3 "\$.accelerator.pp_layer_split: 1 entries for pp_size 2" "$P2" --world 2 --accelerator.pp_size=2 "--accelerator.pp_layer_split=[2]" &&
	bad_plan 3 "\$.accelerator.pp_micro_batch_num: 3, but a step has" "$P2" --world 2 --accelerator.pp_size=2 --accelerator.pp_micro_batch_num=3 &&
	bad_plan 3 "\$.accelerator.pp_vpp: pp_size 2 x pp_vpp 2 = 4 virtual stages for 2 layers" "$P2" --world 2 --accelerator.pp_size=2 --accelerator.pp_vpp=2 &&
	bad_plan 3 "\$.accelerator.pp_vpp: 9 virtual stages per rank: this build takes at most 8" "$P2" --world 2 --accelerator.pp_size=2 --accelerator.pp_vpp=9 &&
	bad_plan 3 "reshard_after_backward: false with pp_size 2" "$P2" --world 4 --accelerator.pp_size=2 --fsdp_config.reshard_after_backward=false
'

test_expect_success 'a pipelined plan: stages, layers, the schedule'"'"'s grid and bubble, the p2p bytes' '
	hp-plan "$P2" --world 4 --accelerator.pp_size=2 >pp.json &&
	G=$(jq ".pipeline.micro_batches" pp.json) &&
	test "$(jq -c "[.pipeline.schedule, [.pipeline.stages[].layers]]" pp.json)" = "[\"1f1b\",[[0,1],[1,2]]]" &&
	test "$(jq -c "[.meshes.pipeline.groups.pp[]]" pp.json)" = "[[0,2],[1,3]]" &&
	test "$(jq -c "[.params[] | select(.name | test(\"embed|layers.0.input\")) | .stage]" pp.json)" = "[0,0]" &&
	test "$(jq -c "[.params[] | select(.name | test(\"lm_head|layers.1.input\")) | .stage]" pp.json)" = "[1,1]" &&
	# a forward 1 unit, a backward 2: with equal stages 1F1B and GPipe both idle (pp-1)/(G+pp-1)
	jq -e --argjson g "$G" ".pipeline.bubble * ($G + 1) | . - 1 | fabs < 1e-12" pp.json &&
	test "$(jq ".pipeline.step_units" pp.json)" = $((3 * (G + 1))) &&
	# each stage sends its micro-batches'"'"' residual stream (rows x hidden x 4 bytes) one way
	rows=$(jq "(.config.training.micro_batch_size * .config.dataset.data_config.seq_length)" pp.json) &&
	jq -e --argjson b "$((G * rows * 64 * 4))" "[.estimates.per_rank[] | .comm[] | select(.dim == \"pp\" and .op == \"p2p\") | .bytes == \$b] | length == 2 and all" pp.json &&
	hp-plan "$P2" --world 4 --accelerator.pp_size=2 --explain >explain &&
	grep -q "^stage 0 " explain && grep -q "^stage 1 " explain
'

test_expect_success 'checks: tp_size must divide the vocabulary and intermediate_size' '
	mkdir -p odd && jq ".vocab_size = 511" "$DATA/ref/qwen3-dense/config.json" >odd/config.json &&
	sed -e "s|pretrained_model_name_or_path: .*|pretrained_model_name_or_path: odd|" "$PLANS/tp-sp-2.yaml" >odd.yaml &&
	bad_plan 3 "\$.accelerator.tp_size: 2 does not divide vocab_size 511" odd.yaml --world 2 &&
	grep -q "pad the vocabulary" err &&
	jq ".intermediate_size = 97" "$DATA/ref/qwen3-dense/config.json" >odd/config.json &&
	bad_plan 3 "\$.accelerator.tp_size: 2 does not divide intermediate_size 97" odd.yaml --world 2
'
test_expect_success 'checks: a MoE model with tp > 1 needs sequence parallel' '
	bad_plan 3 "\$.accelerator.sequence_parallel: a MoE model with tp_size 2 needs sequence_parallel: true" \
		s8.yaml --world 8 --accelerator.sequence_parallel=false
'
test_expect_success 'checks: global_batch_size must be a multiple of micro_batch_size*dp' '
	bad_plan 3 "\$.training.global_batch_size: 16 is not a multiple of micro_batch_size*dp = 3*2" \
		s8.yaml --world 8 --training.micro_batch_size=3
'
test_expect_success 'checks: ulysses_attention needs the heads per tp rank divisible by cp' '
	(cd "$PLANS" && hp-plan ulysses-4.yaml --world 8 --accelerator.cp_size=4 --fsdp_config.dp_shard_size=1) \
		>out 2>err; test $? = 3 && test_one_line err &&
	grep -q "\$.accelerator.cp_size: 4 does not divide the heads per tp rank (4 attention, 2 KV)" err &&
	! test -s out
'
test_expect_success 'checks: ulysses_attention bound to some layers only is refused' '
	sed -e "s|\"\*.self_attn\"|\"model.layers.0.self_attn\"|" "$PLANS/ulysses-4.yaml" >u1.yaml &&
	sed -i -e "s|pretrained_model_name_or_path: ../../data|pretrained_model_name_or_path: $DATA|" u1.yaml &&
	bad_plan 3 "\$.plan_overrides[0]: ulysses_attention is bound to some attention modules only" u1.yaml --world 4 &&
	sed -i -e "s|when: cp|when: ep|" u1.yaml && hp-plan u1.yaml --world 4 >/dev/null
'

test_expect_success 'an unknown _target_ lists the known ones' '
	sed -e "s|replace_qwen3_moe_rms_norm|replace_rms_norm_typo|" s8.yaml >typo.yaml &&
	bad_plan 3 "\$.plan_overrides[0].replace_module._target_: unknown" typo.yaml --world 8 &&
	grep -q "known: fused_rmsnorm, hyper_parallel.models.qwen3_moe.adapter.replacements.replace_qwen3_moe_rms_norm" err &&
	grep -q "grouped_experts" err
'

test_expect_success 'a module_type that is not the matched module'\''s class is an error naming both' '
	sed -e "s|modeling_qwen3_moe.Qwen3MoeAttention|modeling_qwen3_moe.Qwen3MoeRMSNorm|" s8.yaml >mt.yaml &&
	bad_plan 3 "which is a Qwen3MoeAttention, not a Qwen3MoeRMSNorm" mt.yaml --world 8
'

test_expect_success 'a match that hits nothing is a warning, and the plan is still made' '
	sed -e "s|\"model.norm\"|\"model.final_norm\"|" s8.yaml >warn.yaml &&
	hp-plan warn.yaml --world 8 >pw.json 2>err &&
	grep -q "plan_overrides\[0\].match: .model.final_norm. matches no module" err &&
	jq_is "[.modules[] | select(.name == \"model.norm\") | .kernel]" pw.json "[\"reference.rmsnorm\"]"
'

test_expect_success '-o writes the plan atomically; a failure leaves no file' '
	hp-plan s8.yaml --world 8 -o out.json &&
	cmp p8.json out.json &&
	! ls | grep -q "\.tmp\." &&
	test_must_fail_with 3 hp-plan s8.yaml --world 6 -o bad.json 2>/dev/null &&
	! test -e bad.json && ! ls | grep -q "\.tmp\." &&
	test_must_fail_with 5 hp-plan s8.yaml --world 8 -o no/such/dir/p.json 2>err &&
	! test -e no
'

test_expect_success '--explain shows meshes, placements and kernels, from a plan or a config' '
	hp-plan --explain p8.json >ex1 &&
	hp-plan --explain s8.yaml --world 8 >ex2 &&
	cmp ex1 ex2 &&
	grep -q "^  ep  *{0,1} {2,3} {4,5} {6,7}$" ex1 &&
	grep -q "model.layers.1.self_attn.o_proj.weight .*tp=shard(1)" ex1 &&
	grep -q "model.layers.2.mlp.experts .*grouped_experts  *plan_overrides\[2\]" ex1
'

test_expect_success '--explain refuses a plan whose hash does not match' '
	sed -e "s/\"shard(1)\"/\"shard(0)\"/" p8.json >edited.json &&
	bad_plan 4 "hash does not match" --explain edited.json
'

test_expect_success 'hp-plan -h and bad command lines' '
	hp-plan -h >help && grep -q "^usage: hp-plan CONFIG.yaml" help &&
	test_must_fail_with 2 hp-plan 2>/dev/null &&
	test_must_fail_with 2 hp-plan s8.yaml --world zero 2>/dev/null
'

# The estimates, recomputed here from the plan's own parameter list with jq
# (an independent reading of the rules in hp-plan(5), ESTIMATES).
test_expect_success 'estimates: FSDP bytes per rank and all-gather traffic follow the parameter list' '
	p=$PLANS/fsdp-2.json &&
	G=$(jq .estimates.step.grad_accumulation $p) && test $G = 4 &&
	held=$(jq "[.params[] | (.shape[1] // 1) as \$c | ((.shape[0] + 1) / 2 | floor) * \$c * 4] | add" $p) &&
	jq_is ".estimates.per_rank[0].param_bytes" $p "$held" &&
	jq_is ".estimates.per_rank | length" $p 1 &&
	ag=$(jq "[.params[] | (.shape[1] // 1) as \$c | ((.shape[0] + 1) / 2 | floor) * \$c * 4
		* (if .fsdp_unit == \"model\" then 1 else 2 end)] | add * $G" $p) &&
	jq_is "[.estimates.per_rank[0].comm[] | select(.dim == \"dp_shard\" and .op == \"all_gather\") | .bytes]" $p "[$ag]" &&
	units=$(jq ".fsdp_units | length" $p) &&
	jq_is "[.estimates.per_rank[0].comm[] | select(.dim == \"dp_shard\" and .op == \"reduce_scatter\") | [.calls, .bytes]]" \
		$p "[[$((units * G)),$((G * 2 * held))]]"
'

# tp-2: N = 2 x 256 tokens of 64 fp32 values make A = 131072 bytes
# (activations travel in fp32 whatever mix_precision says: it is the
# parameters' and gradients' dtype); per
# micro-batch 2 all-reduces per attention and per MLP block (5 layers), 2 for
# embedding and LM head, one more per layer for full checkpointing's second
# forward of attention (it stops before the MLP's down_proj), and
# loss_parallel's max (4N: floats) and sums (16N: two doubles a row) bytes.
test_expect_success 'estimates: tensor-parallel traffic without sequence parallel, by hand' '
	p=$PLANS/tp-2.json &&
	jq_is "[.estimates.per_rank[0].comm[] | select(.dim == \"tp\") | [.op, .calls, .bytes]]" $p \
		"[[\"all_reduce\",58,$((2 * ((22 + 5) * 131072 + 20 * 512)))]]" &&
	jq_is ".estimates.step | [.grad_accumulation, .param_dtype, .activation_checkpoint]" $p "[2,\"bfloat16\",\"full\"]"
'

# all-8: rows out and back in the forward and the backward, and out and
# back once more in full checkpointing's second forward: 6 per MoE layer and
# micro-batch, half of them the rows that come back, which the routing sizes.
test_expect_success 'estimates: expert parallel names the bytes that depend on the routing' '
	p=$PLANS/all-8.json &&
	jq_is "[.estimates.per_rank[0].comm[] | select(.op == \"all_to_allv\") | [.dim, .calls, .bytes, .routed_bytes]]" $p \
		"[[\"ep\",96,50331648,25165824]]" &&
	hp-plan --explain $p >ex &&
	grep -q "^  ep  *all_to_allv  *96  *50331648  (25165824 of them for even routing)$" ex &&
	grep -q "^  0-7  *191.1 KiB  *191.1 KiB  *382.1 KiB" ex
'

test_expect_success 'a plan is made again from its own config when loaded; a doctored plan is refused' '
	for n in all-8 fsdp-1 tp-2 ulysses-4; do
		hp-plan --explain "$PLANS/$n.json" >/dev/null || return 1
	done &&
	sed -e "s/\"tp\": \"shard(1)\"/\"tp\": \"shard(0)\"/" -e "3s/\"hash\": \"[0-9a-f]*\"/\"hash\": \"\"/" \
		"$PLANS/all-8.json" >doctored &&
	h=$(head -c -1 doctored | sha256sum | cut -d" " -f1) &&
	sed -e "3s/\"hash\": \"\"/\"hash\": \"$h\"/" doctored >doctored.json &&
	bad_plan 4 "makes a different plan of the plan" --explain doctored.json
'

test_expect_success 'a failed allocation is one line and exit 5, and leaves no plan behind' '
	failed=0 &&
	for n in 1 2 3 5 8 13 21 34 55 89 144 233; do
		HP_FAIL_ALLOC=$n hp-plan s8.yaml --world 8 -o fa.json 2>err
		rc=$?
		test $rc = 5 -o $rc = 0 || { echo "HP_FAIL_ALLOC=$n exit $rc"; cat err; return 1; }
		if test $rc = 5; then
			test_one_line err && ! test -e fa.json || return 1
			failed=$((failed + 1))
		fi
		rm -f fa.json
		test_no_sanitizer_report err || return 1
	done &&
	echo "# $failed injected failures reported" &&
	test $failed -ge 8 && ! ls | grep -q "\.tmp\."
'

test_expect_success MPI 'under mpiexec the world size is the MPI world' '
	mpiexec -n 2 hp-plan "$PLANS/fsdp-2.yaml" >mpi.json &&
	jq_is .world_size mpi.json 2 &&
	(cd "$PLANS" && hp-plan fsdp-2.yaml --world 2) >want.json &&
	test "$(jq -c "del(.hash, .config)" mpi.json)" = "$(jq -c "del(.hash, .config)" want.json)"
'
# Made from inside t/plan, as t/plan/README.md says, so that the paths the
# plans record are the same on every checkout.
for y in "$PLANS"/*.yaml; do
	n=$(basename "$y" .yaml)
	test_expect_success "golden plan $n" '
		(cd "$PLANS" && hp-plan "$n.yaml" --world "${n##*-}") >"$n.json" &&
		cmp "$PLANS/$n.json" "$n.json"
	'
done

test_done
