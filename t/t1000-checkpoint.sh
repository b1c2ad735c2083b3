#!/bin/sh
test_description='checkpoints: save, resume bit-exactly, reshard on resume, survive a dead rank, refuse damage, export to HF'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

A=--accelerator
F=--fsdp_config
SEED8="$A.tp_size=2 $A.cp_size=2 $A.ep_size=2 $A.sequence_parallel=true $F.dp_shard_size=2 $F.edp_shard_size=2"

# steps FILE: "step loss" per line, exactly as written
steps () {
	jq -r "[.step, .loss] | @tsv" "$@"
}

# tree DIR: every file under DIR with its checksum, to show nothing changed
# the files under $1 with their hashes; hp.lock, the run's lock on the
# folder (empty when no run holds it), is not a checkpoint's
tree () {
	(cd "$1" && find . -type f ! -name hp.lock | sort | xargs sha256sum)
}

test_expect_success MPI 'setup: TinyStories records, a MoE config and an online config' '
	make_tinystories ts 64 &&
	write_config moe.yaml "$DATA/ref/qwen3-moe-b" ts 64 2 16 20 </dev/null &&
	jq -c "{text: .text}" "$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" |
		sed -n "47,346p" >stories.jsonl &&
	cat >on.yaml <<-YAML
	model:
	  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained
	  pretrained_model_name_or_path: $DATA/stories260K/hf
	training: {train_iters: 20, global_batch_size: 4, micro_batch_size: 2, seed: 1234}
	dataset:
	  _target_: hyper_parallel.data.build_online_text_dataset
	  data_path: stories.jsonl
	  data_transform: {data_type: plaintext, text_keys: [text], max_seq_len: 64}
	  data_config: {shuffle: true}
	optimizer:
	  _target_: hyper_parallel.components.optim.AdamW
	  adamw_config: {adamw_lr: 1.0e-3}
	lr_scheduler:
	  _target_: hyper_parallel.components.optim.MultiLRScheduler
	  lr_decay_style: cosine
	  lr_config: {lr: 1.0e-3, lr_warmup_steps: 5, min_lr: 1.0e-4}
	YAML
'

# resume NAME CONFIG N OVERRIDES...: 20 steps straight, and 10 + 10 through a
# checkpoint; the losses of every step and the final weights are the same bits
resume () {
	name=$1 cfg=$2 n=$3; shift 3
	mpiexec -n $n hp-train -q "$cfg" "$@" --checkpoint.checkpoint_dir=$name-a \
		--metrics $name-a.jsonl --dump-params $name-a.safetensors &&
	mpiexec -n $n hp-train -q "$cfg" "$@" --checkpoint.checkpoint_dir=$name-b --max-steps 10 \
		--metrics $name-b1.jsonl &&
	test "$(cat $name-b/latest_checkpoint_iteration.txt)" = 10 &&
	test -s $name-b/global_step_10/checkpoint.json &&
	mpiexec -n $n hp-train "$cfg" "$@" --checkpoint.checkpoint_dir=$name-b \
		--checkpoint.restore_from=LATEST --metrics $name-b2.jsonl --dump-params $name-b.safetensors >out &&
	grep -q "^checkpoint: resumed from .$name-b/global_step_10. at step 10 ([0-9.]* s)$" out &&
	steps $name-a.jsonl >a && steps $name-b1.jsonl $name-b2.jsonl >b &&
	test $(wc -l <a) = 20 && cmp a b &&
	cmp $name-a.safetensors $name-b.safetensors
}

test_expect_success MPI 'resume is bit-exact: the seed'\''s 8 ranks and one process, indexed data' '
	resume moe8 moe.yaml 8 $SEED8 &&
	resume moe1 moe.yaml 1
'

test_expect_success MPI 'resume is bit-exact with online data (shuffled, packed), on 4 ranks and one' '
	resume on4 on.yaml 4 $A.tp_size=2 $A.cp_size=2 $A.sequence_parallel=true &&
	resume on1 on.yaml 1
'

# restored CONFIG CKPT N OVERRIDES...: step 11 on N ranks from checkpoint
# CKPT, its one metrics row in r.jsonl, its loss within 1e-5 relative of
# the one in the file want (another layout sums in another order)
restored () {
	cfg=$1 ck=$2 n=$3; shift 3
	mpiexec -n $n hp-train -q "$cfg" "$@" --checkpoint.restore_from=$ck --checkpoint.save_ckpt=false \
		--max-steps 11 --metrics r.jsonl &&
	test $(wc -l <r.jsonl) = 1 &&
	jq .loss r.jsonl >got &&
	awk -v a="$(cat got)" -v b="$(cat want)" "BEGIN { d = (a - b) / b; if (d < 0) d = -d;
		printf \"# %s ranks: %s against %s\\n\", \"$n\", a, b; exit d > 1e-5 }"
}

test_expect_success MPI 'an 8-rank TP2 x CP2 x EP2 checkpoint resumes on 1, 2 and 4 ranks in other layouts' '
	sed -n 11p moe8-a.jsonl | jq .loss >want &&
	for lay in "1" "2 $F.dp_shard_size=2" "4 $A.ep_size=4" \
		"4 $A.tp_size=2 $A.sequence_parallel=true $A.loss_parallel=true $F.dp_shard_size=2"; do
		restored moe.yaml moe8-b/global_step_10 $lay || return 1
	done
'

# DeepSeek-V3 with the auxiliary-loss-free bias update on: the correction
# bias is a parameter of the checkpoint (never an optimizer's), so a resume
# moves it on from where it was, and its loads are recounted each step
test_expect_success MPI 'DeepSeek-V3 with the bias update resumes bit-exactly (8 ranks and one), and in other layouts' '
	hf_records dsk "$DATA/hf/tf5/deepseek_v3-yarn" &&
	write_config dsk.yaml "$DATA/hf/tf5/deepseek_v3-yarn" dsk 32 1 4 20 </dev/null &&
	resume dsk8 dsk.yaml 8 $SEED8 --training.moe_router_bias_update_rate=0.01 &&
	resume dsk1 dsk.yaml 1 --training.moe_router_bias_update_rate=0.01 &&
	sed -n 11p dsk8-a.jsonl | jq .loss >want &&
	for lay in "1" "4 $A.tp_size=4 $A.sequence_parallel=true" "4 $A.ep_size=4"; do
		restored dsk.yaml dsk8-b/global_step_10 $lay --training.moe_router_bias_update_rate=0.01 &&
		test "$(jq -c .router_loads r.jsonl)" = "$(sed -n 11p dsk8-a.jsonl | jq -c .router_loads)" || return 1
	done
'

# Qwen3-Next (its Gated DeltaNet tensors, the [C, K] conv among them, the
# gated shared expert): resume bit-exact on 4 ranks (EP 2, expert FSDP),
# and that checkpoint restored on 1 rank, on EP 4 and on TP 2 + SP.
test_expect_success MPI 'Qwen3-Next resumes bit-exactly on 4 ranks, and on 1, EP 4 and TP 2 from that checkpoint' '
	hf_records qn "$DATA/hf/tf5/qwen3_next-default" &&
	write_config qn.yaml "$DATA/hf/tf5/qwen3_next-default" qn 32 1 4 20 </dev/null &&
	resume qn4 qn.yaml 4 $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=4 &&
	sed -n 11p qn4-a.jsonl | jq .loss >want &&
	for lay in "1" "4 $A.ep_size=4" "2 $A.tp_size=2 $A.sequence_parallel=true"; do
		restored qn.yaml qn4-b/global_step_10 $lay || return 1
	done
'

# cross NAME N FROM TO OVERRIDES...: 20 steps straight on training.device
# FROM; 10 on FROM, then 10 on TO from FROM's checkpoint: the same bits.
# The device is the CUDA backend on its host emulation in exact mode, which
# computes the CPU's bits wherever the CPU runs the kernels a GPU has
# (flash attention and grouped experts bound: mfl.yaml), so a checkpoint
# crossing backends must change nothing at all.
cross () {
	name=$1 n=$2 from=$3 to=$4; shift 4
	HP_CUDA_EMULATE=exact mpiexec -n $n hp-train -q mfl.yaml "$@" --training.device=$from \
		--checkpoint.checkpoint_dir=$name-a --metrics $name-a.jsonl --dump-params $name-a.safetensors &&
	HP_CUDA_EMULATE=exact mpiexec -n $n hp-train -q mfl.yaml "$@" --training.device=$from \
		--checkpoint.checkpoint_dir=$name-b --max-steps 10 --metrics $name-b1.jsonl &&
	HP_CUDA_EMULATE=exact mpiexec -n $n hp-train mfl.yaml "$@" --training.device=$to \
		--checkpoint.checkpoint_dir=$name-b --checkpoint.restore_from=LATEST --metrics $name-b2.jsonl \
		--dump-params $name-b.safetensors >out &&
	grep -q "^checkpoint: resumed from .$name-b/global_step_10. at step 10" out &&
	steps $name-a.jsonl >a && steps $name-b1.jsonl $name-b2.jsonl >b &&
	test $(wc -l <a) = 20 && cmp a b &&
	cmp $name-a.safetensors $name-b.safetensors
}

test_expect_success MPI 'a checkpoint crosses backends bit-exactly: GPU to CPU and back (HP_CUDA_EMULATE=exact)' '
	write_config mfl.yaml "$DATA/ref/qwen3-moe-b" ts 64 2 16 20 <<-YAML &&
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: flash_attention}}
	  - {match: "*.mlp.experts", replace_module: {_target_: grouped_experts}}
	YAML
	cross gc8 8 cuda cpu $SEED8 &&
	cross cg8 8 cpu cuda $SEED8 &&
	cross gc1 1 cuda cpu &&
	cross cg1 1 cpu cuda &&
	cmp gc8-a.safetensors cg8-a.safetensors
'

# rank_pid TAG R: the pid of rank R of the job started with HP_KILL_TAG=TAG
rank_pid () {
	for d in /proc/[0-9]*; do
		[ "$(cat "$d/comm" 2>/dev/null)" = hp-train ] || continue
		env=$( (tr "\0" "\n" <"$d/environ") 2>/dev/null) || continue
		echo "$env" | grep -q "^HP_KILL_TAG=$1$" || continue
		echo "$env" | grep -q "^PMI_RANK=$2$" && echo "${d#/proc/}"
	done
}

test_expect_success MPI 'a rank killed while writing a checkpoint leaves the previous one, and LATEST on it' '
	rm -rf kill-ck &&
	mpiexec -n 8 hp-train -q moe.yaml $SEED8 --checkpoint.checkpoint_dir=kill-ck --max-steps 10 &&
	tree kill-ck/global_step_10 >before &&
	tag=hp-ckpt-kill-$$ &&
	{ (HP_KILL_TAG=$tag HP_CKPT_PAUSE=30 timeout 120 mpiexec -n 8 hp-train -q moe.yaml $SEED8 \
		--checkpoint.checkpoint_dir=kill-ck --checkpoint.restore_from=LATEST --max-steps 12 >kout 2>kerr;
		echo $? >krc) & } &&
	i=0 &&
	while ! ls kill-ck/global_step_12.tmp.*/model/rank-00005-of-00008.safetensors >/dev/null 2>&1; do
		sleep 0.2; i=$((i + 1)); [ $i -lt 600 ] || { echo "the save did not start"; return 1; }
	done &&
	pid=$(rank_pid $tag 5) && test -n "$pid" &&
	kill -9 $pid && t0=$(date +%s) &&
	while [ ! -s krc ]; do
		sleep 0.2; [ $(($(date +%s) - t0)) -lt 60 ] || { echo "still running 60 s after the kill"; return 1; }
	done &&
	test "$(cat krc)" != 0 &&
	test "$(cat kill-ck/latest_checkpoint_iteration.txt)" = 10 &&
	test ! -e kill-ck/global_step_12 &&
	tree kill-ck/global_step_10 >after && cmp before after &&
	# resuming from it reproduces the uninterrupted run, and clears the leftover
	mpiexec -n 8 hp-train -q moe.yaml $SEED8 --checkpoint.checkpoint_dir=kill-ck \
		--checkpoint.restore_from=LATEST --max-steps 12 --metrics k.jsonl &&
	! ls -d kill-ck/global_step_12.tmp.* 2>/dev/null &&
	steps k.jsonl >got && steps moe8-a.jsonl | sed -n "11,12p" >want &&
	cmp got want
'

# refused FROM WHAT: restoring from FROM in bad/ fails with exit 4 or 5
# naming WHAT, and changes nothing there
refused () {
	tree bad >before &&
	! mpiexec -n 8 hp-train -q moe.yaml $SEED8 --checkpoint.checkpoint_dir=bad \
		--checkpoint.restore_from=$1 --max-steps 12 2>err &&
	sort -u err | head -n 3 &&
	grep -q "$2" err &&
	tree bad >after && cmp before after
}

test_expect_success MPI 'a truncated, flipped, missing or foreign file is refused by name, nothing overwritten' '
	c=bad/global_step_10 f=model/rank-00003-of-00008.safetensors &&
	rm -rf bad && cp -r moe8-b bad && truncate -s -100 $c/$f &&
	refused $c "$c/$f.: [0-9]* bytes, checkpoint.json says [0-9]* (truncated" &&
	rm -rf bad && cp -r moe8-b bad &&
	printf "\\377" | dd of=$c/$f bs=1 seek=$(($(stat -c %s $c/$f) - 100)) conv=notrunc 2>/dev/null &&
	refused $c "$c/$f.: tensor .* fails its checksum" &&
	rm -rf bad && cp -r moe8-b bad && rm $c/exp_avg_sq/rank-00006-of-00008.safetensors &&
	refused $c "rank-00006-of-00008.safetensors.: missing" &&
	rm -rf bad && cp -r moe8-b bad && mpiexec -n 4 hp-train -q moe.yaml $A.ep_size=4 \
		--checkpoint.checkpoint_dir=other --max-steps 2 &&
	cp other/global_step_2/checkpoint.json $c/checkpoint.json &&
	refused $c "checkpoint.json.: names plan [0-9a-f]*, but .*model/plan.json. is plan [0-9a-f]*: the metadata is from another checkpoint" &&
	rm -rf bad && mkdir bad &&
	refused bad/global_step_10 "bad/global_step_10.: not a checkpoint (no checkpoint.json)" &&
	# LATEST with no checkpoint yet starts from the model (a first start)
	mpiexec -n 2 hp-train moe.yaml $F.dp_shard_size=2 --checkpoint.checkpoint_dir=fresh \
		--checkpoint.restore_from=LATEST --max-steps 1 >out &&
	grep -q "^checkpoint: none in .fresh. yet; starting from the model$" out &&
	test "$(cat fresh/latest_checkpoint_iteration.txt)" = 1
'

test_expect_success MPI 'a checkpoint that cannot be written stops the run naming the folder, leaving no temporary' '
	: >afile &&
	test_must_fail_with 5 mpiexec -n 2 hp-train -q moe.yaml $F.dp_shard_size=2 \
		--checkpoint.checkpoint_dir=afile/ck --max-steps 1 2>err &&
	grep -q "afile/ck.: cannot create" err &&
	# a folder this user cannot write (root writes anywhere: then only the first case)
	mkdir ro && chmod 500 ro &&
	{ [ "$(id -u)" = 0 ] || {
		test_must_fail_with 5 mpiexec -n 2 hp-train -q moe.yaml $F.dp_shard_size=2 \
			--checkpoint.checkpoint_dir=ro --max-steps 1 2>err &&
		grep -q "ro.: checkpoint_dir cannot be written" err &&
		! ls -d ro/global_step_* 2>/dev/null
	}; }
'

test_expect_success MPI 'keep_last keeps the newest complete checkpoints' '
	mpiexec -n 2 hp-train -q moe.yaml $F.dp_shard_size=2 --checkpoint.checkpoint_dir=keep \
		--checkpoint.save_steps=2 --checkpoint.keep_last=2 --max-steps 9 &&
	(cd keep && ls -d global_step_*) >got &&
	printf "global_step_8\nglobal_step_9\n" >want && cmp got want &&
	test "$(cat keep/latest_checkpoint_iteration.txt)" = 9
'

test_expect_success MPI 'save_consolidated writes an HF folder: it round trips through hp-convert to the same logits' '
	mpiexec -n 8 hp-train -q moe.yaml $SEED8 --checkpoint.checkpoint_dir=hf-ck --max-steps 3 \
		--checkpoint.save_consolidated=final &&
	d=hf-ck/global_step_3 &&
	test -s $d/hf/config.json && test -s $d/hf/model.safetensors &&
	grep -q "\"hf/model.safetensors\"" $d/checkpoint.json &&
	hp-convert --export $d/model -o hf2 &&
	hp-plan moe.yaml --world 1 --model.pretrained_model_name_or_path=$d/hf | hp-convert --plan - $d/hf -o rt &&
	hp-convert --export rt -o hf3 &&
	ids="1 5 9 33 7 2 100 401 17 3" &&
	hp-test-tool logits -o l1.safetensors $d/hf $ids &&
	hp-test-tool logits -o l2.safetensors hf2 $ids &&
	hp-test-tool logits -o l3.safetensors hf3 $ids &&
	cmp l1.safetensors l2.safetensors && cmp l1.safetensors l3.safetensors &&
	# and it starts a run: the HF folder is the checkpoint
	if python3 -c "import transformers" 2>/dev/null; then
		python3 -c "
import sys, torch, transformers
from safetensors.torch import load_file
m = transformers.AutoModelForCausalLM.from_pretrained(\"$d/hf\", torch_dtype=torch.float32)
ids = torch.tensor([[int(x) for x in \"$ids\".split()]])
want = load_file(\"l1.safetensors\")[\"logits\"]
got = m(ids).logits[0].detach()
err = float((got - want).abs().max())
print(\"# transformers logits: max abs difference\", err)
sys.exit(err > 1e-4)"
	else
		echo "# transformers not installed: the hp-convert round trip stands for it"
	fi
'

test_done
