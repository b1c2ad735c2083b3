#!/bin/sh
test_description='activation checkpointing: full and selective recomputation give the bits of keeping everything, in every layout'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

A=--accelerator
F=--fsdp_config
SEED8="$A.tp_size=2 $A.cp_size=2 $A.ep_size=2 $A.sequence_parallel=true $F.dp_shard_size=2 $F.edp_shard_size=2"

# act FILE: the activation bytes hp-train reports
act () {
	sed -n 's/^activations: \([0-9]*\) bytes.*/\1/p' "$1"
}

# train N ARGS...: hp-train on N ranks
train () {
	n=$1; shift
	if test $n = 1; then hp-train "$@"; else mpiexec -n $n hp-train "$@"; fi
}

# ck N CONFIG ARGS...: train with activation_checkpoint off, full and
# selective (on the layers $sel selects) on N ranks; recomputation runs the same operations on the same
# inputs in the same order, so every step's loss and gradient norm, step
# 1's gradients and the final weights are the same bits as off's.  Every
# rank's activation arena is the plan's estimate, full's smaller than off's,
# and under mpiexec every rank moved what the plan estimates (the
# recomputed forward's collectives included).
ck () {
	n=$1 cfg=$2; shift 2
	echo "# $cfg on $n rank(s): $*"
	for mode in off full selective; do
		train $n "$cfg" "$@" --activation_checkpoint.mode=$mode $(test $mode = off || echo $sel) --metrics $mode.jsonl --dump-grads $mode-g.st \
			--dump-params $mode-p.st >$mode.out || return 1
		grep -q "the plan's estimate on every rank; activation_checkpoint $mode on" $mode.out &&
		! grep -q "not the plan's estimate" $mode.out || { cat $mode.out; return 1; }
		if test $n != 1; then
			grep -q "^comm: every rank's bytes per collective and mesh dim equal the plan's estimate" \
				$mode.out || { cat $mode.out; return 1; }
		fi
	done
	for mode in full selective; do
		test "$(jq -c "[.loss, .grad_norm]" off.jsonl)" = "$(jq -c "[.loss, .grad_norm]" $mode.jsonl)" &&
		cmp off-g.st $mode-g.st && cmp off-p.st $mode-p.st || { echo "# $mode: not the bits of off"; return 1; }
	done
	echo "# activations: off $(act off.out), full $(act full.out), selective $(act selective.out) bytes" &&
	test $(act full.out) -lt $(act off.out) && test $(act selective.out) -le $(act off.out)
}

sel=
test_expect_success 'setup: TinyStories records and a 4-step config per model' '
	make_tinystories ts 64 &&
	for m in stories260K/hf ref/qwen3-dense ref/qwen3-moe-a ref/qwen3-moe-b; do
		write_config $(basename $m).yaml "$DATA/$m" ts 64 2 8 4 </dev/null || return 1
	done &&
	awk "/^plan_overrides:/ { on = 1; print; next } on && /^[^ ]/ { exit } on" \
		"$TEST_DIR/config/seed-8rank.yaml" | write_config k.yaml "$DATA/ref/qwen3-moe-b" ts 64 2 16 4 &&
	grep -q grouped_experts k.yaml &&
	write_config hf-ul.yaml "$DATA/stories260K/hf" ts 64 2 8 4 <<-YAML
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: ulysses_attention}}
	YAML
'

test_expect_success 'one rank: Llama, Qwen3 dense and both Qwen3-MoE' '
	ck 1 hf.yaml && ck 1 qwen3-dense.yaml && ck 1 qwen3-moe-a.yaml && ck 1 qwen3-moe-b.yaml
'

test_expect_success 'one rank: the seed kernels, and HF reference kernels (HP_KERNELS=reference)' '
	ck 1 k.yaml &&
	HP_KERNELS=reference hp-train k.yaml --activation_checkpoint.mode=full >out &&
	grep "^activations" out && grep -q "activation_checkpoint full on 2 of 2 layers" out
'

test_expect_success 'selection: layer_count, layer_indices' '
	sel=--activation_checkpoint.selection.layer_count=3 && ck 1 hf.yaml &&
	grep -q "full on 3 of 5 layers" full.out &&
	sel=--activation_checkpoint.selection.layer_indices=[4,0,2] && ck 1 hf.yaml &&
	grep -q "full on 3 of 5 layers" full.out &&
	sel=--activation_checkpoint.selection.layer_indices=[1,0] && ck 2 qwen3-moe-a.yaml $A.ep_size=2 &&
	sel= &&
	grep -q "full on 2 of 3 layers" full.out &&
	hp-plan hf.yaml --world 1 --activation_checkpoint.mode=full --activation_checkpoint.selection.layer_indices=[4,0,2] >plan.json &&
	test "$(jq -c .estimates.step.checkpointed_layers plan.json)" = "[0,2,4]"
'

test_expect_success 'selection: bad values are refused by name' '
	for bad in "selection.layer_count=3" \
		"mode=full --activation_checkpoint.selection.layer_count=6" \
		"mode=full --activation_checkpoint.selection.layer_count=0" \
		"mode=full --activation_checkpoint.selection.layer_indices=[5]" \
		"mode=full --activation_checkpoint.selection.layer_indices=[1,1]" \
		"mode=full --activation_checkpoint.selection.layer_indices=[]" \
		"mode=full --activation_checkpoint.selection.layer_indices=[a]" \
		"mode=full --activation_checkpoint.selection.layer_count=2 --activation_checkpoint.selection.layer_indices=[1]"; do
		rm -f m.jsonl &&
		test_must_fail_with 3 hp-train -q hf.yaml --activation_checkpoint.$bad --metrics m.jsonl 2>err &&
		cat err && test $(wc -l <err) = 1 && grep -q "activation_checkpoint" err && ! test -e m.jsonl ||
		return 1
	done
'

# The CUDA backend checkpoints through the same model code: on its host
# emulation (HP_CUDA_EMULATE, hp-train(1)), full and selective give off's bits.
# ck_dev CONFIG PREFIX: one process there, off, full and selective; the
# same losses, gradient norms and final weights
ck_dev () {
	for m in off full selective; do
		HP_CUDA_EMULATE=exact hp-train -q "$1" --training.device=cuda --activation_checkpoint.mode=$m \
			--metrics $2-$m.jsonl --dump-params $2-$m.st || return 1
	done &&
	jq -c "[.loss, .grad_norm]" $2-off.jsonl >a &&
	for m in full selective; do
		jq -c "[.loss, .grad_norm]" $2-$m.jsonl >b && cmp a b && cmp $2-off.st $2-$m.st || return 1
	done
}

test_expect_success 'the config table shows the selection; on the CUDA backend checkpointing keeps the bits' '
	hp-train hf.yaml --max-steps 1 --activation_checkpoint.mode=selective \
		--activation_checkpoint.selection.layer_indices=[4,0,2] >out &&
	grep -q "activation_checkpoint.mode  *selective" out &&
	grep -q "activation_checkpoint.selection.layer_indices  *\[4, 0, 2\]" out &&
	ck_dev hf.yaml d
'

test_expect_success MPI 'TP 2 with sequence parallel, TP 2 with loss_parallel' '
	ck 2 hf.yaml $A.tp_size=2 $A.sequence_parallel=true &&
	ck 2 qwen3-dense.yaml $A.tp_size=2 $A.loss_parallel=true
'

test_expect_success MPI 'CP 2, K/V all-gather and Ulysses' '
	ck 2 qwen3-dense.yaml $A.cp_size=2 &&
	ck 2 hf-ul.yaml $A.cp_size=2
'

test_expect_success MPI 'EP 2 with expert FSDP, and FSDP with prefetch' '
	ck 4 qwen3-moe-a.yaml $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=4 &&
	ck 2 hf.yaml $F.dp_shard_size=2 $F.forward_prefetch_depth=1 $F.backward_prefetch_depth=1
'

test_expect_success MPI 'the seed'\''s 8 ranks, TP2 x CP2 x EP2 with FSDP, with and without its kernels' '
	ck 8 qwen3-moe-b.yaml $SEED8 &&
	ck 8 k.yaml $SEED8 &&
	mpiexec -n 8 hp-verify k.yaml $SEED8 --activation_checkpoint.mode=full >out &&
	grep "^verdict: all" out
'

# DeepSeek-V3 (data/hf/tf5/deepseek_v3-yarn): the latent attention's kept
# values, the shared experts' SwiGLU and the router loads (counted once,
# not again in the recomputed forward) under full and selective
test_expect_success MPI 'DeepSeek-V3: one rank and the seed'\''s 8, with the bias update on' '
	hf_records dsk "$DATA/hf/tf5/deepseek_v3-yarn" &&
	write_config dsk.yaml "$DATA/hf/tf5/deepseek_v3-yarn" dsk 32 1 4 4 </dev/null &&
	ck 1 dsk.yaml --training.moe_router_bias_update_rate=0.01 &&
	test "$(jq -c .router_loads off.jsonl)" = "$(jq -c .router_loads full.jsonl)" &&
	ck 8 dsk.yaml $SEED8 --training.moe_router_bias_update_rate=0.01
'

# Qwen3-Next (data/hf/tf5/qwen3_next-long, rows of 96): the Gated DeltaNet
# layers' kept values (the conv's input, q, k, v, the gates, the delta
# rule's chunk states) recomputed under full, and the gated attention's
# and shared expert's; on the CUDA backend (emulated) too, full and
# selective keeping off's bits
test_expect_success MPI 'Qwen3-Next: one rank, EP 2 with expert FSDP on 4, and on the CUDA backend' '
	hf_records qn "$DATA/hf/tf5/qwen3_next-long" &&
	write_config qn.yaml "$DATA/hf/tf5/qwen3_next-long" qn 96 1 4 4 </dev/null &&
	ck 1 qn.yaml &&
	ck 4 qn.yaml --accelerator.ep_size=2 --fsdp_config.edp_shard_size=2 --fsdp_config.dp_shard_size=4 &&
	ck_dev qn.yaml qd
'

test_done
