# lib-train.sh - helpers shared by the hp-train test scripts.
# Source after test-lib.sh.

MODEL=$DATA/stories260K/hf
MODEL_BF16=$DATA/stories260K/hf-bf16-sharded
REF=$DATA/stories260K/reference

# write_config FILE MODEL_DIR DATA_PREFIX SEQ MICRO GLOBAL ITERS [extra yaml lines on stdin]
write_config () {
	{
		cat <<-YAML
		model:
		  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained
		  pretrained_model_name_or_path: $2
		  torch_dtype: float32
		training:
		  train_iters: $7
		  global_batch_size: $6
		  micro_batch_size: $5
		  max_grad_norm: 1.0
		  seed: 1234
		  logging_steps: 1
		dataset:
		  _target_: hyper_parallel.data.build_indexed_text_dataset
		  data_path: $3
		  data_config: {seq_length: $4, is_dataset_from_mr: true}
		optimizer:
		  _target_: hyper_parallel.components.optim.AdamW
		  adamw_config: {adamw_lr: 1.0e-3, adamw_weight_decay: 0.1, adamw_betas: [0.9, 0.95], adamw_eps: 1.0e-8}
		  no_decay_params: [bias, norm]
		lr_scheduler:
		  _target_: hyper_parallel.components.optim.MultiLRScheduler
		  lr_decay_style: cosine
		  lr_config: {lr: 1.0e-3, lr_warmup_steps: 10, min_lr: 1.0e-4}
		debug: {check_nan_inf: true}
		YAML
		if [ ! -t 0 ]; then cat; fi
	} >"$1"
}

# random_config FILE CONFIG_DIR DATA_PREFIX SEQ MICRO GLOBAL ITERS [model
# keys on stdin]: write_config's arguments for a from_config run (random
# weights, seed 1) of CONFIG_DIR/config.json, the keys on stdin ("key:
# value" lines) overriding it, saving no checkpoint
random_config () {
	{
		cat <<-YAML
		model:
		  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_config
		  config_path: $2
		YAML
		if [ ! -t 0 ]; then sed 's/^/  /'; fi
		cat <<-YAML
		training: {train_iters: $7, global_batch_size: $6, micro_batch_size: $5, seed: 1}
		checkpoint: {save_ckpt: false}
		dataset:
		  _target_: hyper_parallel.data.build_indexed_text_dataset
		  data_path: $3
		  data_config: {seq_length: $4, is_dataset_from_mr: true}
		YAML
	} >"$1"
}

# online_config FILE DATA SEQ ITERS [extra yaml on stdin]: stories260K on
# online JSONL or text, global batch 4 of micro 2
online_config () {
	{
		cat <<-YAML
		model:
		  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained
		  pretrained_model_name_or_path: $MODEL
		training: {train_iters: $4, global_batch_size: 4, micro_batch_size: 2, seed: 1234}
		dataset:
		  _target_: hyper_parallel.data.build_online_text_dataset
		  data_path: $2
		  data_transform: {data_type: plaintext, text_keys: [text], max_seq_len: $3}
		optimizer:
		  _target_: hyper_parallel.components.optim.AdamW
		  adamw_config: {adamw_lr: 1.0e-3}
		YAML
		if [ ! -t 0 ]; then cat; fi
	} >"$1"
}

# make_refbatch PREFIX: the reference 2x128 batch as two records of 129 ids
make_refbatch () {
	jq -c '.loss_and_grads as $l | range(0; 2) as $b |
		{ids: ($l.input_ids[$b] + [$l.target_ids[$b][-1]])}' "$REF/reference.json" >"$1.jsonl" &&
	hp-test-tool mkidx --vocab 512 -o "$1" "$1.jsonl"
}

# make_tinystories PREFIX SEQ: TinyStories ids packed into records of SEQ+1
make_tinystories () {
	hp-test-tool mkidx --vocab 512 --records-of $(($2 + 1)) -o "$1" \
		"$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl"
}

# u64le N: 8 little-endian bytes
u64le () {
	n=$1 i=0
	while [ $i -lt 8 ]; do
		printf "\\$(printf %03o $((n & 255)))"
		n=$((n >> 8)) i=$((i + 1))
	done
}

# mkst FILE JSON DATA_BYTES: a safetensors file with that header and zeroed data
mkst () {
	{ u64le ${#2}; printf "%s" "$2"; head -c "$3" /dev/zero; } >"$1"
}

# expect_fail CODE PATTERN PROGRAM ARGS...: exit CODE, exactly one stderr
# line matching PATTERN, no metrics or gradient file left behind (hp-train)
expect_fail () {
	code=$1 pat=$2 prog=$3; shift 3
	rm -f m.jsonl g.safetensors
	if [ "$prog" = hp-train ]; then set -- -q "$@" --metrics m.jsonl --dump-grads g.safetensors; fi
	test_must_fail_with "$code" "$prog" "$@" 2>err &&
	cat err &&
	test_one_line err &&
	grep -q -e "$pat" err &&
	test_no_sanitizer_report err &&
	test ! -e m.jsonl && test ! -e g.safetensors &&
	test -z "$(ls | grep -e "\.tmp\.")"
}

# metric FILE STEP KEY
metric () {
	jq -r "select(.step == $2) | .$3" "$1"
}

# float_close A B TOL : |A - B| <= TOL
float_close () {
	awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d;
		if (d <= t) exit 0; printf "|%s - %s| = %g > %g\n", a, b, d, t; exit 1 }'
}

# same_losses A B: every step's loss within 1e-5 relative
same_losses () {
	test $(wc -l <"$1") = $(wc -l <"$2") &&
	paste "$1" "$2" | awk -F'\t' '{
		split($1, a, "\"loss\": "); split(a[2], x, ","); split($2, b, "\"loss\": "); split(b[2], y, ",")
		d = (x[1] - y[1]) / y[1]; if (d < 0) d = -d
		if (d > m) m = d
		if (d > 1e-5) { printf "step %d: %s vs %s\n", NR, x[1], y[1]; bad = 1 } }
		END { printf "# %d steps, largest relative loss difference %.2g\n", NR, m; exit bad }'
}

# single NAME CONFIG: the one-process run every layout is held to
single () {
	hp-train -q "$2" --metrics "s-$1.jsonl" --dump-grads "sg-$1.safetensors" --dump-params "sp-$1.safetensors"
}

# A device for the layouts: DEVICE_ARGS, what hp-train and hp-verify
# take after the config to run there (t/t0931 and t/t0941 set it to
# training.device: cuda, with HP_CUDA_EMULATE in the environment); empty,
# the CPU.  The one-process references (single) stay on the CPU either way.
# Prerequisite DEVICE: the layouts run on a device; CPUDEV: on the CPU.
if [ -n "${DEVICE_ARGS:-}" ]; then test_set_prereq DEVICE; else test_set_prereq CPUDEV; fi

# layout NAME CONFIG N OVERRIDES...: train under mpiexec -n N; the losses
# of every step, step 1's gradients and the final weights equal the
# one-process run's within 1e-5 (relative L2 for tensors; the gradients
# within $GTOL and the weights within $PTOL when set), and every rank moved exactly what the plan estimates
# (and on a device held within 2% of the plan's device bytes)
layout () {
	name=$1 cfg=$2 n=$3; shift 3
	echo "# $name on $n ranks: $*"
	# a plan carries its device (and takes no overrides)
	case $cfg in *.json) dev= ;; *) dev=${DEVICE_ARGS:-} ;; esac
	mpiexec -n $n hp-train "$cfg" $dev "$@" --metrics p.jsonl --dump-grads pg.safetensors \
		--dump-params pp.safetensors >out &&
	grep -q "^comm: every rank's bytes per collective and mesh dim equal the plan's estimate" out &&
	{ [ -z "$dev" ] || grep -q "device memory: peak .*: every rank.* within 2%" out ||
		{ grep "memory" out; false; }; } &&
	same_losses p.jsonl "s-$name.jsonl" &&
	hp-test-tool cmpst --max-rel-l2 ${GTOL:-1e-5} "sg-$name.safetensors" pg.safetensors >cmp &&
	! grep -q FAIL cmp &&
	hp-test-tool cmpst --max-rel-l2 ${PTOL:-1e-5} "sp-$name.safetensors" pp.safetensors >cmp &&
	! grep -q FAIL cmp
}

# as_from_config YAML CONFIG: YAML (write_config's) made a from_config run of
# CONFIG (a config.json): hp's random init of that model
as_from_config () {
	sed -i "s|from_pretrained|from_config|; s|pretrained_model_name_or_path: .*|config_path: $2|" "$1"
}

# hf_records PREFIX DIR: four records of 33 ids (vocabulary 64) from the
# golden batch of a data/hf folder DIR, as the indexed dataset PREFIX
hf_records () {
	jq -c ".batch.input_ids[] as \$r | ({ids: (\$r + [\$r[0]])}, {ids: ([\$r[0]] + \$r)})" \
		"$2/reference.json" >"$1.jsonl" &&
	hp-test-tool mkidx --vocab 64 -o "$1" "$1.jsonl"
}
