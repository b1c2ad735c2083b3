#!/bin/sh
test_description='pipeline parallelism: GPipe, 1F1B and interleaved 1F1B stages with FSDP, HSDP, TP+SP, CP and EP equal one process'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

# qwen3-dense (2 layers), qwen3-moe-b (2 layers, no load-balancing loss),
# qwen3-moe-a (3 layers, the first dense, tied, with the load-balancing
# loss, whose router statistics travel with the activations),
# a 5-layer Qwen3 made from qwen3-dense's config.json by random init, the
# same weights in every layout (from_config), a 4-layer qwen3-moe-a and an
# 8-layer Qwen3 made the same way (for interleaving: 2 stages of 2 chunks
# need 4 layers), and
# stories260K (5 layers, tied embeddings: the first stage's embedding is
# the last stage's LM head).
A=--accelerator
F=--fsdp_config

test_expect_success MPI 'setup: the one-process runs' '
	make_tinystories ts 64 &&
	write_config qd.yaml "$DATA/ref/qwen3-dense" ts 64 2 16 4 </dev/null &&
	write_config mb.yaml "$DATA/ref/qwen3-moe-b" ts 64 2 16 3 </dev/null &&
	mkdir -p m5 && jq ".num_hidden_layers = 5" "$DATA/ref/qwen3-dense/config.json" >m5/config.json &&
	write_config m5.yaml "$PWD/m5" ts 64 2 16 3 </dev/null &&
	sed -i "s/from_pretrained/from_config/" m5.yaml &&
	write_config st.yaml "$DATA/stories260K/hf" ts 64 2 16 3 </dev/null &&
	write_config ma.yaml "$DATA/ref/qwen3-moe-a" ts 64 2 16 3 </dev/null &&
	mkdir -p a4 && jq ".num_hidden_layers = 4" "$DATA/ref/qwen3-moe-a/config.json" >a4/config.json &&
	mkdir -p m8 && jq ".num_hidden_layers = 8" "$DATA/ref/qwen3-dense/config.json" >m8/config.json &&
	write_config m8.yaml "$PWD/m8" ts 64 2 24 3 </dev/null &&
	sed -i "s/from_pretrained/from_config/" m8.yaml &&
	write_config a4.yaml "$PWD/a4" ts 64 2 16 3 </dev/null &&
	sed -i "s/from_pretrained/from_config/" a4.yaml &&
	write_config ul.yaml "$DATA/ref/qwen3-dense" ts 64 2 16 4 <<-YAML &&
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: ulysses_attention}}
	YAML
	single qd qd.yaml && single ul ul.yaml && single mb mb.yaml && single m5 m5.yaml && single st st.yaml && single ma ma.yaml &&
	single a4 a4.yaml && single m8 m8.yaml
'

test_expect_success MPI 'dense, 2 stages: 1F1B and GPipe, alone and with FSDP, HSDP, TP+SP, loss_parallel, CP (both modes)' '
	layout qd qd.yaml 2 $A.pp_size=2 &&
	layout qd qd.yaml 2 $A.pp_size=2 $A.pp_schedule=gpipe &&
	layout qd qd.yaml 4 $A.pp_size=2 $F.dp_shard_size=2 &&
	layout qd qd.yaml 4 $A.pp_size=2 $A.pp_schedule=gpipe &&
	layout qd qd.yaml 4 $A.pp_size=2 $A.tp_size=2 $A.sequence_parallel=true &&
	layout qd qd.yaml 4 $A.pp_size=2 $A.tp_size=2 $A.loss_parallel=true &&
	layout qd qd.yaml 4 $A.pp_size=2 $A.cp_size=2 &&
	layout ul ul.yaml 4 $A.pp_size=2 $A.cp_size=2 &&
	layout qd qd.yaml 8 $A.pp_size=2 $A.tp_size=2 $A.cp_size=2 $A.sequence_parallel=true
'

test_expect_success MPI 'tied embeddings: the two copies'"'"' gradients summed over the stages (2, 4 and 5 stages; with FSDP, TP+SP)' '
	layout st st.yaml 2 $A.pp_size=2 &&
	layout st st.yaml 4 $A.pp_size=4 &&
	layout st st.yaml 5 $A.pp_size=5 $A.pp_schedule=gpipe &&
	layout st st.yaml 4 $A.pp_size=2 $F.dp_shard_size=2 &&
	layout st st.yaml 4 $A.pp_size=2 $F.dp_shard_size=2 $F.requires_grad_sync=false &&
	layout st st.yaml 4 $A.pp_size=2 $A.tp_size=2 $A.sequence_parallel=true &&
	mpiexec -n 2 hp-train -q st.yaml ${DEVICE_ARGS:-} $A.pp_size=2 --max-steps 2 --checkpoint.checkpoint_dir=ckt \
		--checkpoint.save_steps=2 &&
	hp-train -q st.yaml --checkpoint.checkpoint_dir=ckt1 --checkpoint.restore_from=ckt --metrics rt.jsonl &&
	sed -n "3,\$p" s-st.jsonl >s3.jsonl && same_losses rt.jsonl s3.jsonl &&
	# in the layout that saved it, the bits of the run that went on
	mpiexec -n 2 hp-train -q st.yaml ${DEVICE_ARGS:-} $A.pp_size=2 --checkpoint.save_ckpt=false --metrics c3.jsonl &&
	mpiexec -n 2 hp-train -q st.yaml ${DEVICE_ARGS:-} $A.pp_size=2 --checkpoint.checkpoint_dir=ckt2 \
		--checkpoint.restore_from=ckt --metrics rt2.jsonl &&
	jq -c "select(.step > 2) | [.step, .loss, .grad_norm]" c3.jsonl >want-t &&
	jq -c "[.step, .loss, .grad_norm]" rt2.jsonl >got-t && cmp want-t got-t
'

test_expect_success MPI 'the forward is bit-identical to one process (the same sums in the same order)' '
	mpiexec -n 2 hp-train -q qd.yaml ${DEVICE_ARGS:-} $A.pp_size=2 --metrics p.jsonl &&
	jq -c "[.step, .loss]" p.jsonl >got && jq -c "[.step, .loss]" s-qd.jsonl >want &&
	cmp want got
'

test_expect_success MPI 'MoE, 2 stages: alone, with EP and expert FSDP, with TP+SP' '
	layout mb mb.yaml 2 $A.pp_size=2 &&
	layout mb mb.yaml 4 $A.pp_size=2 $A.ep_size=2 &&
	layout mb mb.yaml 8 $A.pp_size=2 $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=2 &&
	layout mb mb.yaml 4 $A.pp_size=2 $A.tp_size=2 $A.sequence_parallel=true $A.pp_schedule=gpipe &&
	layout mb mb.yaml 2 $A.pp_size=2 $A.pp_schedule=gpipe
'

test_expect_success MPI 'MoE with the load-balancing loss over the stages'"'"' routers: 2 and 3 stages, with EP, CP, TP+SP' '
	layout ma ma.yaml 2 $A.pp_size=2 &&
	layout ma ma.yaml 3 $A.pp_size=3 $A.pp_schedule=gpipe &&
	layout ma ma.yaml 4 $A.pp_size=2 $A.cp_size=2 &&
	layout ma ma.yaml 4 $A.pp_size=2 $A.tp_size=2 $A.sequence_parallel=true &&
	layout ma ma.yaml 8 $A.pp_size=2 $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=2
'

test_expect_success MPI '4 stages of 5 layers: both schedules, a given split, with FSDP, with activation checkpointing' '
	layout m5 m5.yaml 4 $A.pp_size=4 &&
	layout m5 m5.yaml 4 $A.pp_size=4 $A.pp_schedule=gpipe &&
	layout m5 m5.yaml 4 $A.pp_size=4 "$A.pp_layer_split=[1,1,1,2]" &&
	layout m5 m5.yaml 8 $A.pp_size=4 $F.dp_shard_size=2 &&
	layout m5 m5.yaml 4 $A.pp_size=4 --activation_checkpoint.mode=full
'

# Interleaved 1F1B: 2 stages of 2 chunks each (virtual stages 0..3, stage
# 0 holding 0 and 2), G = 8 micro-batches.
I="$A.pp_size=2 $A.pp_vpp=2"
test_expect_success MPI 'interleaved 1F1B: dense, tied and MoE with the load-balancing loss; with FSDP, TP+SP, CP, EP' '
	layout m5 m5.yaml 2 $I &&
	layout m5 m5.yaml 4 $I $F.dp_shard_size=2 &&
	layout m5 m5.yaml 4 $I $A.tp_size=2 $A.sequence_parallel=true &&
	layout m5 m5.yaml 4 $I $A.cp_size=2 &&
	layout m5 m5.yaml 2 $I "$A.pp_layer_split=[1,2,1,1]" --activation_checkpoint.mode=full &&
	layout st st.yaml 4 $I $F.dp_shard_size=2 $F.requires_grad_sync=false &&
	layout a4 a4.yaml 2 $I &&
	layout a4 a4.yaml 4 $I $A.ep_size=2 &&
	layout a4 a4.yaml 4 $I $A.tp_size=2 $A.sequence_parallel=true
'

test_expect_success MPI 'interleaved 1F1B: 3 and 4 stages, 3 and 4 chunks, an uneven split, 12 micro-batches' '
	layout m8 m8.yaml 3 $A.pp_size=3 $A.pp_vpp=2 &&
	layout m8 m8.yaml 6 $A.pp_size=3 $A.pp_vpp=2 $F.dp_shard_size=2 &&
	layout m8 m8.yaml 4 $A.pp_size=4 $A.pp_vpp=2 &&
	layout m8 m8.yaml 2 $A.pp_size=2 $A.pp_vpp=4 &&
	layout m8 m8.yaml 2 $A.pp_size=2 $A.pp_vpp=3 "$A.pp_layer_split=[1,1,2,1,2,1]"
'

test_expect_success MPI 'interleaved 1F1B: the plan'"'"'s chunks, slots per chunk and a smaller bubble than 1F1B'"'"'s' '
	hp-plan m5.yaml --world 2 $I >plan-i.json &&
	hp-plan m5.yaml --world 2 $A.pp_size=2 >plan-1.json &&
	test "$(jq -c "[.pipeline.schedule, .pipeline.virtual_stages_per_rank]" plan-i.json)" = "[\"interleaved_1f1b\",2]" &&
	test "$(jq -c "[.pipeline.stages[].layers]" plan-i.json)" = "[[[0,2],[3,4]],[[2,3],[4,5]]]" &&
	test "$(jq -c "[.pipeline.stages[].in_flight_per_chunk]" plan-i.json)" = "[[4,2],[3,1]]" &&
	jq -e "(.pipeline.bubble < 0.06) and (.pipeline.bubble > 0.05)" plan-i.json &&
	jq -e "(.pipeline.bubble > 0.11) and (.pipeline.bubble < 0.12)" plan-1.json &&
	hp-plan m5.yaml --world 2 $I --explain >ex &&
	grep -q "^  stage 0  layers \[0, 2) \[3, 4)  ranks 0..0  6 micro-batch chunks in flight (4 + 2)" ex &&
	grep -q "^stage 1 |       F0.0  F1.0  F0.1  B0.1  B0.1" ex
'

test_expect_success MPI 'interleaved 1F1B: evaluation, hp-verify and the pipeline faults, checkpoints into other layouts, hp-convert' '
	E="--training.eval_iters=1 --training.eval_steps=2 --training.train_iters=2 --checkpoint.save_ckpt=false" &&
	mpiexec -n 2 hp-train -q m5.yaml ${DEVICE_ARGS:-} $A.pp_size=2 $E --metrics e1.jsonl &&
	mpiexec -n 2 hp-train -q m5.yaml ${DEVICE_ARGS:-} $I $E --metrics e2.jsonl &&
	jq -c "[.eval_loss, .test_loss]" e1.jsonl | tail -n 1 >want &&
	jq -c "[.eval_loss, .test_loss]" e2.jsonl | tail -n 1 >got &&
	cmp want got &&
	mpiexec -n 4 hp-verify a4.yaml ${DEVICE_ARGS:-} $I $A.ep_size=2 --steps 2 >v.out &&
	grep -q "^verdict: all [0-9]* checks of 2 steps match" v.out &&
	test_must_fail_with 1 mpiexec -n 2 hp-verify m5.yaml ${DEVICE_ARGS:-} $I --debug.inject_fault=pp_stale_activation \
		--steps 2 >v.out 2>v.err &&
	grep -F -q "first divergence: step 1, the output of model.layers.2.input_layernorm (pp stage 1)" v.out &&
	mpiexec -n 2 hp-train -q st.yaml ${DEVICE_ARGS:-} $I --max-steps 2 --checkpoint.checkpoint_dir=cki \
		--checkpoint.save_steps=2 &&
	mpiexec -n 2 hp-train -q st.yaml ${DEVICE_ARGS:-} $I --checkpoint.save_ckpt=false --metrics ci3.jsonl &&
	mpiexec -n 2 hp-train -q st.yaml ${DEVICE_ARGS:-} $I --checkpoint.checkpoint_dir=cki2 --checkpoint.restore_from=cki \
		--metrics ri2.jsonl &&
	jq -c "select(.step > 2) | [.step, .loss, .grad_norm]" ci3.jsonl >want-i &&
	jq -c "[.step, .loss, .grad_norm]" ri2.jsonl >got-i && cmp want-i got-i &&
	hp-train -q st.yaml --checkpoint.checkpoint_dir=cki1 --checkpoint.restore_from=cki --metrics ri1.jsonl &&
	same_losses ri2.jsonl ri1.jsonl &&
	hp-plan st.yaml --world 4 $I $F.dp_shard_size=2 -o iplan.json &&
	hp-convert --plan iplan.json -o ishards "$DATA/stories260K/hf" &&
	mpiexec -n 4 hp-train -q iplan.json --shards ishards --max-steps 2 --metrics is.jsonl &&
	mpiexec -n 4 hp-train -q st.yaml $I $F.dp_shard_size=2 --max-steps 2 --checkpoint.save_ckpt=false --metrics if.jsonl &&
	jq -c "[.step, .loss, .grad_norm]" is.jsonl >want-s && jq -c "[.step, .loss, .grad_norm]" if.jsonl >got-s &&
	cmp want-s got-s &&
	hp-convert --export -o ihf ishards &&
	hp-test-tool cmpst --max-rel-l2 0 "$DATA/stories260K/hf/model.safetensors" ihf/model.safetensors >cmp &&
	! grep -q FAIL cmp
'

test_expect_success MPI 'a stage keeps the activations its schedule holds: 1F1B min(pp - s, G) micro-batches, GPipe G' '
	for s in 1f1b gpipe; do
		hp-plan m5.yaml --world 4 $A.pp_size=4 $A.pp_schedule=$s >plan-$s.json || return 1
	done &&
	test "$(jq -c "[.pipeline.stages[].in_flight]" plan-1f1b.json)" = "[4,3,2,1]" &&
	test "$(jq -c "[.pipeline.stages[].in_flight]" plan-gpipe.json)" = "[8,8,8,8]" &&
	# the last stage: 1, 4 and 8 slots of its activations beside one
	# pass'"'"'s scratch, which its slots share: linear in the slots
	hp-plan m5.yaml --world 4 $A.pp_size=4 $A.pp_schedule=gpipe --training.global_batch_size=8 >plan-g4.json &&
	a1=$(jq "[.estimates.per_rank[] | select(.ranks | index(3)) | .activation_bytes][0]" plan-1f1b.json) &&
	a4=$(jq "[.estimates.per_rank[] | select(.ranks | index(3)) | .activation_bytes][0]" plan-g4.json) &&
	a8=$(jq "[.estimates.per_rank[] | select(.ranks | index(3)) | .activation_bytes][0]" plan-gpipe.json) &&
	test $((3 * (a8 - a1))) = $((7 * (a4 - a1))) && test $((a4 - a1)) -gt 0 &&
	mpiexec -n 4 hp-train m5.yaml ${DEVICE_ARGS:-} $A.pp_size=4 $A.pp_schedule=gpipe --max-steps 1 >out &&
	{ test -n "${DEVICE_ARGS:-}" || grep -q "^activations: .* as the plan.s estimate on every rank" out; }
'

test_expect_success MPI 'a rank reads only its data-parallel share of the step (data_tokens_read)' '
	mpiexec -n 8 hp-train -q m5.yaml ${DEVICE_ARGS:-} $A.pp_size=4 $F.dp_shard_size=2 --checkpoint.save_ckpt=false \
		--metrics d.jsonl &&
	test "$(jq -c "[.data_tokens_read, .tokens]" d.jsonl | sort -u)" = "[512,1024]"
'

test_expect_success MPI 'evaluation runs through the stages and gives the one-process loss' '
	E="--training.eval_iters=1 --training.eval_steps=2 --training.train_iters=2 --checkpoint.save_ckpt=false" &&
	hp-train -q qd.yaml $E --metrics e1.jsonl &&
	mpiexec -n 2 hp-train -q qd.yaml ${DEVICE_ARGS:-} $A.pp_size=2 $E --metrics e2.jsonl &&
	jq -c "[.eval_loss, .test_loss]" e1.jsonl | tail -n 1 >want &&
	jq -c "[.eval_loss, .test_loss]" e2.jsonl | tail -n 1 >got &&
	cmp want got
'

test_expect_success MPI 'a checkpoint of 2 stages resumes on 4 stages, and one of 4 on 2 stages x FSDP 2' '
	I=--training.train_iters=4 &&
	mpiexec -n 2 hp-train -q m5.yaml ${DEVICE_ARGS:-} $I $A.pp_size=2 --max-steps 2 --checkpoint.checkpoint_dir=c52 \
		--checkpoint.save_steps=2 &&
	mpiexec -n 4 hp-train -q m5.yaml ${DEVICE_ARGS:-} $I $A.pp_size=4 --checkpoint.save_ckpt=false \
		--checkpoint.restore_from=c52 --metrics r543.jsonl &&
	mpiexec -n 4 hp-train -q m5.yaml ${DEVICE_ARGS:-} $I $A.pp_size=4 --checkpoint.checkpoint_dir=c54 \
		--checkpoint.restore_from=c52 --checkpoint.save_steps=1 --max-steps 3 --metrics r54.jsonl &&
	jq -c "[.step, .loss, .grad_norm]" r54.jsonl >got54 &&
	jq -c "select(.step == 3) | [.step, .loss, .grad_norm]" r543.jsonl >want54 && cmp want54 got54 &&
	mpiexec -n 4 hp-train -q m5.yaml ${DEVICE_ARGS:-} $I $A.pp_size=2 $F.dp_shard_size=2 --checkpoint.save_ckpt=false \
		--checkpoint.restore_from=c54 --metrics r42.jsonl &&
	grep "\"step\": 4," r543.jsonl >r5434.jsonl && same_losses r42.jsonl r5434.jsonl
'

test_expect_success MPI 'a checkpoint saved by 2 stages resumes in one process and in 2 stages x FSDP 2' '
	mpiexec -n 2 hp-train -q qd.yaml ${DEVICE_ARGS:-} $A.pp_size=2 --max-steps 2 --checkpoint.checkpoint_dir=ck2 \
		--checkpoint.save_steps=2 &&
	hp-train -q qd.yaml --checkpoint.checkpoint_dir=ck1 --checkpoint.restore_from=ck2 --metrics r1.jsonl &&
	mpiexec -n 4 hp-train -q qd.yaml ${DEVICE_ARGS:-} $A.pp_size=2 $F.dp_shard_size=2 --checkpoint.checkpoint_dir=ck4 \
		--checkpoint.restore_from=ck2 --metrics r4.jsonl &&
	sed -n "3,\$p" s-qd.jsonl >s3.jsonl && same_losses r1.jsonl s3.jsonl &&
	jq -c "[.step, .loss]" r4.jsonl >got4 && same_losses r4.jsonl r1.jsonl
'

test_expect_success MPI 'hp-convert: shards for a pipelined plan train as the model'"'"'s folder does, export back bit for bit, reshard to FSDP 2 without stages' '
	hp-plan st.yaml --world 4 $A.pp_size=2 $F.dp_shard_size=2 -o pplan.json &&
	hp-convert --plan pplan.json -o ppshards "$DATA/stories260K/hf" &&
	test $(ls ppshards/rank-*.safetensors | wc -l) = 4 &&
	mpiexec -n 4 hp-train -q pplan.json --shards ppshards --max-steps 2 --metrics ps.jsonl &&
	mpiexec -n 4 hp-train -q st.yaml $A.pp_size=2 $F.dp_shard_size=2 --max-steps 2 --checkpoint.save_ckpt=false \
		--metrics pf.jsonl &&
	jq -c "[.step, .loss, .grad_norm]" ps.jsonl >want-s && jq -c "[.step, .loss, .grad_norm]" pf.jsonl >got-s &&
	cmp want-s got-s &&
	hp-convert --export -o pphf ppshards &&
	hp-test-tool cmpst --max-rel-l2 0 "$DATA/stories260K/hf/model.safetensors" pphf/model.safetensors >cmp &&
	! grep -q FAIL cmp &&
	hp-plan st.yaml --world 2 $F.dp_shard_size=2 -o p2.json && hp-convert --plan p2.json -o p2shards ppshards &&
	mpiexec -n 2 hp-train -q p2.json --shards p2shards --max-steps 2 --metrics p2.jsonl &&
	mpiexec -n 2 hp-train -q st.yaml $F.dp_shard_size=2 --max-steps 2 --checkpoint.save_ckpt=false --metrics f2.jsonl &&
	jq -c "[.step, .loss, .grad_norm]" p2.jsonl >got2 && jq -c "[.step, .loss, .grad_norm]" f2.jsonl >want2 &&
	cmp want2 got2
'

test_expect_success MPI 'hp-verify across stages: every module of every stage, gradient and weight equal the one-process model' '
	mpiexec -n 2 hp-verify qd.yaml ${DEVICE_ARGS:-} $A.pp_size=2 --steps 2 >v.out &&
	grep -q "^verdict: all [0-9]* checks of 2 steps match" v.out &&
	grep -q "^output model.layers.1.mlp .* ok$" v.out && grep -q "^output lm_head .* ok$" v.out &&
	mpiexec -n 8 hp-verify m5.yaml ${DEVICE_ARGS:-} $A.pp_size=4 $F.dp_shard_size=2 $A.pp_schedule=gpipe --steps 2 >v.out &&
	grep -q "^verdict: all [0-9]* checks of 2 steps match" v.out &&
	mpiexec -n 4 hp-verify ma.yaml ${DEVICE_ARGS:-} $A.pp_size=2 $A.tp_size=2 $A.sequence_parallel=true --steps 2 >v.out &&
	grep -q "^verdict: all [0-9]* checks of 2 steps match" v.out
'

# pfault NAME WHAT: hp-verify and validation mode both stop at WHAT, found
# on its stage and reported by rank 0
pfault () {
	test_must_fail_with 1 mpiexec -n 2 hp-verify qd.yaml ${DEVICE_ARGS:-} $A.pp_size=2 --debug.inject_fault=$1 \
		--steps 2 >v.out 2>v.err &&
	grep -F -q "first divergence: $2" v.out &&
	test_must_fail_with 1 mpiexec -n 2 hp-train -q qd.yaml ${DEVICE_ARGS:-} $A.pp_size=2 --debug.inject_fault=$1 \
		--model.validate_placement=true --checkpoint.save_ckpt=false >v.out 2>v.err &&
	grep -F -q "validation: $2" v.err
}

test_expect_success MPI 'the pipeline faults are named at their module and stage, by hp-verify and by validation mode' '
	pfault pp_stale_activation "step 1, the output of model.layers.1.input_layernorm (pp stage 1)" &&
	pfault pp_out_of_order "step 1, the output of model.embed_tokens (pp stage 0)" &&
	test_must_fail_with 3 mpiexec -n 2 hp-train qd.yaml $F.dp_shard_size=2 --debug.inject_fault=pp_stale_activation \
		>out 2>err &&
	grep -q "pp_stale_activation breaks a collective this layout does not have" err
'

test_expect_success MPI 'what pipelines do not support yet is refused by name before any work' '
	test_must_fail_with 3 mpiexec -n 2 hp-train qd.yaml $A.pp_size=2 --fsdp_config.reshard_after_backward=false >out 2>err &&
	grep -q "reshard_after_backward: false with pp_size 2 is not supported yet" err &&
	test_must_fail_with 3 mpiexec -n 3 hp-train qd.yaml $A.pp_size=2 >out 2>err &&
	grep -q "world size 3 is not divisible by pp_size\*tp_size\*cp_size = 2" err &&
	test_must_fail_with 3 mpiexec -n 2 hp-train qd.yaml $A.pp_size=2 $A.pp_vpp=2 >out 2>err &&
	grep -q "pp_vpp: pp_size 2 x pp_vpp 2 = 4 virtual stages for 2 layers: every virtual stage needs a layer" err &&
	test_must_fail_with 3 mpiexec -n 2 hp-train m5.yaml $I $A.pp_schedule=gpipe >out 2>err &&
	grep -q "pp_vpp: 2 virtual stages per rank: interleaving is 1F1B.s (pp_schedule 1f1b); gpipe takes 1" err &&
	test_must_fail_with 3 hp-train m5.yaml $A.pp_vpp=2 >out 2>err &&
	grep -q "pp_vpp: 2 virtual stages per rank: interleaving needs pp_size 2 or more" err &&
	test_must_fail_with 3 mpiexec -n 2 hp-train m5.yaml $I --training.global_batch_size=6 >out 2>err &&
	grep -q "pp_vpp: interleaved 1F1B needs the step.s micro-batches per data-parallel rank (3: global_batch_size 6 / (micro_batch_size 2 \* dp 1)) a multiple of pp_size 2" err &&
	test_must_fail_with 3 mpiexec -n 2 hp-train m5.yaml $I "$A.pp_layer_split=[2,3]" >out 2>err &&
	grep -q "pp_layer_split: 2 entries for 4 virtual stages (pp_size x pp_vpp): give one per virtual stage" err
'
test_done
