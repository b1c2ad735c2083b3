#!/bin/sh
test_description='training.device: cuda: the CUDA backend on its host emulation equals the CPU (exact) or stays within bf16 bounds, with evaluation and activation checkpointing; it refuses cleanly where it cannot run; on a GPU, 20 bf16 steps of Qwen3-MoE follow the fp32 CPU run and repeat bit for bit'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

# rel_losses A B TOL: every step's loss of A within TOL relative of B's
rel_losses () {
	jq -r .loss "$1" >la && jq -r .loss "$2" >lb &&
	test $(wc -l <la) = $(wc -l <lb) && test -s la &&
	paste la lb | awk -v t="$3" '{ d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > m) m = d
		if (d > t) { printf "step %d: %s vs %s (%.3g)\n", NR, $1, $2, d; bad = 1 } }
		END { printf "# largest relative difference %.3g over %d steps\n", m, NR; exit bad }'
}

test_expect_success 'setup: the Qwen3-MoE fixture on TinyStories, 20 steps' '
	make_tinystories ts 64 &&
	write_config c.yaml "$DATA/ref/qwen3-moe-a" ts 64 2 8 20 </dev/null
'

test_expect_success NOGPU 'device: cuda without a GPU is one line naming the key, exit 4, no metrics left' '
	test_must_fail_with 4 hp-train c.yaml --training.device=cuda --metrics m.jsonl >out 2>err &&
	cat err &&
	test $(wc -l <err) = 1 &&
	grep -q "c.yaml.*training.device: cuda" err &&
	! test -e m.jsonl && ! ls m.jsonl.* 2>/dev/null
'

test_expect_success NOGPU 'device: auto without a GPU trains on the CPU, the same losses as device: cpu' '
	hp-train -q c.yaml --training.device=auto --training.train_iters=3 --metrics auto.jsonl &&
	hp-train c.yaml --training.device=cpu --training.train_iters=3 --metrics cpu.jsonl >out &&
	! grep -q "^run.device" out &&
	jq -c "[.loss, .grad_norm]" cpu.jsonl >a && jq -c "[.loss, .grad_norm]" auto.jsonl >b && cmp a b
'

# The emulation (HP_CUDA_EMULATE, hp-train(1)) runs the CUDA backend's own
# code on any machine.  In exact mode bf16 values keep their fp32 bits, so
# where the CPU runs the kernels a GPU has (flash attention, grouped
# experts: fl.yaml) one process computes the CPU's bits exactly.
test_expect_success 'emulated, exact: one process on the CUDA backend is the CPU bit for bit' '
	write_config fl.yaml "$DATA/ref/qwen3-moe-a" ts 64 2 8 6 <<-YAML &&
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: flash_attention}}
	  - {match: "*.mlp.experts", replace_module: {_target_: grouped_experts}}
	YAML
	hp-train -q fl.yaml --metrics c.jsonl --dump-grads cg.st --dump-params cp.st &&
	HP_CUDA_EMULATE=exact hp-train fl.yaml --training.device=cuda --metrics g.jsonl --dump-grads gg.st \
		--dump-params gp.st >out &&
	grep -q "^run.device  *cuda (emulated on the host, exact)" out &&
	grep -q "^run.module_kernels  *flash_attention 3/3 layers (the GPU.s attention)" out &&
	jq -c "[.loss, .grad_norm]" c.jsonl >a && jq -c "[.loss, .grad_norm]" g.jsonl >b && cmp a b &&
	cmp cg.st gg.st && cmp cp.st gp.st
'

# bf16 mode rounds every operand a GPU's tensor cores read (GEMMs,
# attention) to bf16: 2^-9 relative per element.  Over 6 steps the losses
# stay within 1e-2 relative of the fp32 run (the bound the GPU run is held
# to below), and two runs give the same bits.
test_expect_success 'emulated, bf16: within bf16 bounds of the CPU, the same bits twice' '
	HP_CUDA_EMULATE=bf16 hp-train -q fl.yaml --training.device=cuda --metrics b1.jsonl &&
	HP_CUDA_EMULATE=bf16 hp-train -q fl.yaml --training.device=cuda --metrics b2.jsonl &&
	jq -c "[.loss, .grad_norm]" b1.jsonl >x && jq -c "[.loss, .grad_norm]" b2.jsonl >y && cmp x y &&
	rel_losses b1.jsonl c.jsonl 1e-2 &&
	! cmp x a
'

test_expect_success 'emulated: evaluation and activation checkpointing run on the device as on the CPU' '
	hp-train -q fl.yaml --training.eval_iters=1 --training.eval_steps=3 \
		--activation_checkpoint.mode=full --metrics ce.jsonl &&
	HP_CUDA_EMULATE=exact hp-train -q fl.yaml --training.device=cuda --training.eval_iters=1 \
		--training.eval_steps=3 --activation_checkpoint.mode=full --metrics ge.jsonl &&
	jq -c "[.loss, .eval_loss, .test_loss]" ce.jsonl >a && jq -c "[.loss, .eval_loss, .test_loss]" ge.jsonl >b &&
	cmp a b && test $(grep -c eval_loss ge.jsonl) = 2 &&
	jq -c "[.loss]" c.jsonl >a && jq -c "[.loss]" ge.jsonl >b && cmp a b &&
	HP_CUDA_EMULATE=exact hp-train -q fl.yaml --training.device=cuda --activation_checkpoint.mode=selective \
		--metrics gs.jsonl &&
	jq -c "[.loss]" gs.jsonl >b && cmp a b
'

test_expect_success 'HP_CUDA_EMULATE and HP_CUDA_COMM take only their values' '
	HP_CUDA_EMULATE=fast test_must_fail_with 3 hp-train -q fl.yaml --training.device=cuda 2>err &&
	test_one_line err &&
	grep -q "HP_CUDA_EMULATE=fast: expected exact or bf16" err &&
	HP_CUDA_EMULATE=exact HP_CUDA_COMM=tcp test_must_fail_with 3 mpiexec -n 2 hp-train -q fl.yaml \
		--training.device=cuda --fsdp_config.dp_shard_size=2 2>err &&
	grep -q "HP_CUDA_COMM=tcp: expected nccl or staged" err &&
	HP_CUDA_EMULATE=exact HP_CUDA_COMM=nccl test_must_fail_with 4 mpiexec -n 2 hp-train -q fl.yaml \
		--training.device=cuda --fsdp_config.dp_shard_size=2 2>err &&
	grep -q "HP_CUDA_COMM=nccl: the emulation carries device buffers host-staged" err &&
	HP_CUDA_EMULATE=exact HP_CUDA_COMM=tcp test_must_fail_with 3 hp-train -q fl.yaml --training.device=cuda \
		2>err &&
	test_one_line err && grep -q "HP_CUDA_COMM=tcp: expected nccl or staged" err
'

# The device's attention is flash only (no eager to fall back on), up to
# head_dim 256; the CPU's flash kernel takes up to 512 and leaves the rest
# to the reference.  A random model of each size shows both refusals.
test_expect_success 'a head_dim no attention kernel takes is refused by name, nothing written' '
	for D in 320 520; do
		mkdir -p hd$D &&
		jq ".head_dim = $D" "$DATA/ref/qwen3-moe-a/config.json" >hd$D/config.json &&
		sed -e "s|from_pretrained|from_config|" -e "s|pretrained_model_name_or_path: .*|config_path: $PWD/hd$D|" \
			fl.yaml >hd$D.yaml || return 1
	done &&
	HP_CUDA_EMULATE=exact test_must_fail_with 4 hp-train -q hd320.yaml --training.device=cuda \
		--metrics hd.jsonl 2>err &&
	test_one_line err && grep -q "cuda (emulated.*): no attention kernel takes head_dim 320" err &&
	test_must_fail_with 3 hp-train -q hd520.yaml --metrics hd.jsonl 2>err &&
	test_one_line err && grep -q "flash_attention takes head_dim up to 512, the model has 520" err &&
	! test -e hd.jsonl
'

test_expect_success 'a device that is not cpu, cuda or auto is a config error' '
	test_must_fail_with 3 hp-train c.yaml --training.device=tpu 2>err &&
	grep -q "training.device" err
'

test_expect_success GPU 'on the GPU: 20 bf16 steps within 1e-2 relative of the fp32 CPU losses' '
	hp-train c.yaml --training.device=cpu --metrics cpu.jsonl >cpu.out &&
	hp-train c.yaml --training.device=cuda --metrics gpu.jsonl >gpu.out &&
	grep "^run.device" gpu.out &&
	rel_losses gpu.jsonl cpu.jsonl 1e-2
'

test_expect_success GPU 'on the GPU: a second run gives bit-identical losses and gradient norms' '
	hp-train -q c.yaml --training.device=cuda --metrics gpu2.jsonl &&
	jq -c "[.loss, .grad_norm]" gpu.jsonl >a && jq -c "[.loss, .grad_norm]" gpu2.jsonl >b &&
	cmp a b
'

A=--accelerator
F=--fsdp_config
SEED8="$A.tp_size=2 $A.cp_size=2 $A.ep_size=2 $A.sequence_parallel=true $F.dp_shard_size=2 $F.edp_shard_size=2"
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; then test_set_prereq GPU2; fi

# The seed's 8 ranks share the one GPU, so their collectives go host-staged;
# the bf16 bound is the single GPU run's (above).
test_expect_success GPU 'on the GPU: the seed'\''s 8 ranks on one GPU, host-staged, bytes as the plan' '
	mpiexec -n 8 hp-train fl.yaml $SEED8 --training.device=cuda --training.train_iters=20 \
		--metrics g8.jsonl >g8.out &&
	grep "^run.device" g8.out &&
	grep -q "^run.device_comm  *host-staged" g8.out &&
	grep -q "^comm: every rank.s bytes per collective and mesh dim equal the plan.s estimate" g8.out &&
	hp-train -q fl.yaml --training.train_iters=20 --metrics c20.jsonl &&
	rel_losses g8.jsonl c20.jsonl 1e-2 &&
	jq -s "[(map(.comm_wait_s) | add), (map(.step_time_s) | add)] | \"# collectives: \\(100 * .[0] / .[1] | floor)% of rank 0\u0027s step time\"" -r \
		g8.jsonl
'

test_expect_success GPU2 'on two GPUs: two ranks over NCCL, bytes as the plan' '
	mpiexec -n 2 hp-train fl.yaml $A.tp_size=2 $A.sequence_parallel=true \
		--training.device=cuda --training.train_iters=20 --metrics g2.jsonl >g2.out &&
	grep -q "^run.device_comm  *nccl" g2.out &&
	grep -q "^comm: every rank.s bytes per collective and mesh dim equal the plan.s estimate" g2.out &&
	rel_losses g2.jsonl c20.jsonl 1e-2
'

# AdamW steps by about lr wherever a gradient is noise, and bf16 changes the
# noise: experts that see few tokens drift furthest (the bf16 emulation,
# HP_CUDA_EMULATE=bf16, after 5 steps: 1.3e-3 for the worst tensor, the
# median 3.5e-4; a GPU adds its own reduction orders and the rounding of P
# inside flash attention, which the emulation does not round).  So every
# tensor within 0.2, and the median tensor within 2e-2.
test_expect_success GPU 'on the GPU: the final weights dumped agree with the CPU run within bf16 tolerance' '
	hp-train -q c.yaml --training.device=cuda --max-steps 5 --dump-params gp.safetensors &&
	hp-train -q c.yaml --training.device=cpu --max-steps 5 --dump-params cp.safetensors &&
	hp-test-tool cmpst --max-rel-l2 0.2 gp.safetensors cp.safetensors >cmp &&
	sort -k5 -g cmp | tail -n 3 &&
	awk "{ print \$5 }" cmp | sort -g >rels &&
	med=$(sed -n "$((($(wc -l <rels) + 1) / 2))p" rels) &&
	echo "# median tensor: $med" &&
	float_close "$med" 0 2e-2
'

test_done
