#!/bin/sh
# same-numbers.sh OLD_BIN NEW_BIN [WORK_DIR]: train the same layouts with two
# builds of hp-train and compare what they compute, byte for byte.
#
# OLD_BIN and NEW_BIN are folders holding hp-train (O/bin of two builds; copy
# one aside before rebuilding).  For every layout below both builds write
# --metrics, --dump-grads and --dump-params; the metrics are compared with
# their measured fields (tokens_per_s, step_time_s, checkpoint_s, comm_wait_s,
# host_bytes_peak, device_bytes_peak, host_syncs, kernel_launches) removed, the tensor
# files with cmp.  A restructuring that must not change any number (#34)
# prints "same" on every line.  Exit 0 when all are the same, 1 otherwise.
#
# HP_SAME_TIMING=N also times N steps of stories260K in one process and of
# the training demo (examples/training_demo/train_parallel.yaml) on 8 ranks,
# alternating the two binaries (old, new, old, new) HP_SAME_ROUNDS times
# each (default 7), and prints the ratios new/old of the medians and of the
# fastest runs (on a noisy machine the fastest run is the steadier figure);
# HP_SAME_TIMING_ONLY=1 skips the comparison of the numbers.
set -eu
old=$(cd "$1" && pwd) new=$(cd "$2" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
work=${3:-$(mktemp -d)}
mkdir -p "$work" && cd "$work"
DATA=$src/data
# one BLAS thread per process, as the tests run (8 ranks share 2 cores)
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export OPENBLAS_NUM_THREADS OMP_NUM_THREADS
A=--accelerator F=--fsdp_config

"$new/hp-test-tool" mkidx --vocab 512 --records-of 65 -o ts \
	"$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" >/dev/null

# cfg FILE MODEL ITERS [extra yaml on stdin]
cfg () {
	{
		cat <<-YAML
		model:
		  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained
		  pretrained_model_name_or_path: $2
		  torch_dtype: float32
		training: {train_iters: $3, global_batch_size: 16, micro_batch_size: 2, max_grad_norm: 1.0, seed: 1234, logging_steps: 1}
		dataset:
		  _target_: hyper_parallel.data.build_indexed_text_dataset
		  data_path: ts
		  data_config: {seq_length: 64, is_dataset_from_mr: true}
		optimizer:
		  _target_: hyper_parallel.components.optim.AdamW
		  adamw_config: {adamw_lr: 1.0e-3, adamw_weight_decay: 0.1, adamw_betas: [0.9, 0.95], adamw_eps: 1.0e-8}
		  no_decay_params: [bias, norm]
		lr_scheduler:
		  _target_: hyper_parallel.components.optim.MultiLRScheduler
		  lr_decay_style: cosine
		  lr_config: {lr: 1.0e-3, lr_warmup_steps: 10, min_lr: 1.0e-4}
		YAML
		if [ ! -t 0 ]; then cat; fi
	} >"$1"
}

kernels () {
	awk '/^plan_overrides:/ { on = 1; print; next } on && /^[^ ]/ { exit } on' \
		"$src/t/config/seed-8rank.yaml"
}

cfg llama.yaml "$DATA/stories260K/hf" 6 </dev/null
cfg dense.yaml "$DATA/ref/qwen3-dense" 4 </dev/null
cfg moea.yaml "$DATA/ref/qwen3-moe-a" 4 </dev/null
cfg moeb.yaml "$DATA/ref/qwen3-moe-b" 4 </dev/null
kernels | cfg moek.yaml "$DATA/ref/qwen3-moe-b" 4
cfg llama-ul.yaml "$DATA/stories260K/hf" 4 <<-YAML
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: ulysses_attention}}
	YAML
cfg llama-ac.yaml "$DATA/stories260K/hf" 4 <<-YAML
	activation_checkpoint: {mode: full}
	YAML
cfg moe-ac.yaml "$DATA/ref/qwen3-moe-b" 4 <<-YAML
	activation_checkpoint: {mode: full}
	YAML

SEED8="$A.tp_size=2 $A.cp_size=2 $A.ep_size=2 $A.sequence_parallel=true $F.dp_shard_size=2 $F.edp_shard_size=2"
bad=0
# run NAME RANKS CONFIG ARGS...: both builds, then the comparison
run () {
	name=$1 n=$2 c=$3; shift 3
	launch=; [ "$n" = 1 ] || launch="mpiexec -n $n"
	for b in old new; do
		eval "bin=\$$b"
		$launch "$bin/hp-train" -q "$c" "$@" --metrics "$b-$name.jsonl" --dump-grads "$b-$name-g.st" \
			--dump-params "$b-$name-p.st" >"$b-$name.out" 2>&1 ||
			{ echo "$name: $b failed"; cat "$b-$name.out"; bad=1; return 0; }
	done
	for b in old new; do
		jq -c 'del(.tokens_per_s, .step_time_s, .checkpoint_s, .comm_wait_s, .pp_wait_s, .data_tokens_read, .host_bytes_peak,
			.device_bytes_peak, .host_syncs, .kernel_launches)' "$b-$name.jsonl" >"$b-$name.m"
	done
	if cmp -s old-$name.m new-$name.m && cmp -s old-$name-g.st new-$name-g.st &&
		cmp -s old-$name-p.st new-$name-p.st; then
		printf '%-28s same (%d steps, %s bytes of gradients, %s of weights)\n' "$name/$n" \
			"$(wc -l <new-$name.m)" "$(wc -c <new-$name-g.st)" "$(wc -c <new-$name-p.st)"
	else
		printf '%-28s DIFFERENT\n' "$name/$n"; bad=1
	fi
}

if [ -z "${HP_SAME_TIMING_ONLY:-}" ]; then
	run llama 1 llama.yaml
	run llama-fsdp4 4 llama.yaml $F.dp_shard_size=4
	run llama-hsdp 4 llama.yaml $F.dp_shard_size=2
	run llama-tp2 2 llama.yaml $A.tp_size=2
	run llama-tp2-sp 2 llama.yaml $A.tp_size=2 $A.sequence_parallel=true
	run llama-tp2-lp 2 llama.yaml $A.tp_size=2 $A.loss_parallel=true
	run llama-tp4-sp-lp 4 llama.yaml $A.tp_size=4 $A.sequence_parallel=true $A.loss_parallel=true
	run llama-cp2-kv 2 llama.yaml $A.cp_size=2
	run llama-cp4-kv 4 llama.yaml $A.cp_size=4
	run llama-cp2-ulysses 2 llama-ul.yaml $A.cp_size=2
	run llama-ac 1 llama-ac.yaml
	run llama-ac-tp2 2 llama-ac.yaml $A.tp_size=2
	run dense 1 dense.yaml
	run dense-tp2-sp-lp 2 dense.yaml $A.tp_size=2 $A.sequence_parallel=true $A.loss_parallel=true
	run moea 1 moea.yaml
	run moea-ep2-edp2 4 moea.yaml $A.ep_size=2 $F.edp_shard_size=2 $F.dp_shard_size=4
	run moeb 1 moeb.yaml
	run moeb-ep4 4 moeb.yaml $A.ep_size=4
	run moe-ac 1 moe-ac.yaml
	run moe-ac-ep2 2 moe-ac.yaml $A.ep_size=2
	run moek 1 moek.yaml
	run seed8 8 moeb.yaml $SEED8
	run seed8-kernels 8 moek.yaml $SEED8
	# pipeline stages (each build's own schedules: GPipe, 1F1B)
	run llama-pp2 2 llama.yaml $A.pp_size=2
	run llama-pp4-fsdp2-nosync 8 llama.yaml $A.pp_size=4 $F.dp_shard_size=2 $F.requires_grad_sync=false
	run dense-pp2-gpipe-tp2 4 dense.yaml $A.pp_size=2 $A.pp_schedule=gpipe $A.tp_size=2 $A.sequence_parallel=true
	run moea-pp3 3 moea.yaml $A.pp_size=3
	run moea-pp2-ep2 4 moea.yaml $A.pp_size=2 $A.ep_size=2
	export HP_CUDA_EMULATE=exact
	run cuda-emu 1 llama.yaml --training.device=cuda
	run cuda-emu-tp2 2 llama.yaml --training.device=cuda $A.tp_size=2
	run cuda-emu-seed8 8 moek.yaml --training.device=cuda $SEED8
	run cuda-emu-pp2-fsdp2 4 llama.yaml --training.device=cuda $A.pp_size=2 $F.dp_shard_size=2
fi

# each run's median step time (steps after the first), then the median
# over HP_SAME_ROUNDS (default 7) alternating runs of each binary
if [ -n "${HP_SAME_TIMING:-}" ]; then
	cfg t1.yaml "$DATA/stories260K/hf" "$HP_SAME_TIMING" </dev/null
	# the training demo's config and model as they are, without its
	# evaluation and checkpoints, on TinyStories records of 257 tokens
	"$new/hp-test-tool" mkidx --vocab 512 --records-of 257 -o ts256 \
		"$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" >/dev/null
	demo=$src/examples/training_demo
	sed -e "s|config_path: qwen3_moe_demo|config_path: $demo/qwen3_moe_demo|" \
	    -e "s|data_path: data/tinystories|data_path: ts256|" \
	    -e "s|train_iters: 40|train_iters: $HP_SAME_TIMING|" \
	    -e '/^  eval_iters:/d' -e '/^  eval_steps:/d' -e '/^checkpoint:/d' \
	    "$demo/train_parallel.yaml" >t8.yaml
	rounds=${HP_SAME_ROUNDS:-7}
	for t in t1 t8; do
		: >old-$t.times; : >new-$t.times
		i=0
		while [ $i -lt "$rounds" ]; do
			for b in old new; do
				eval "bin=\$$b"
				if [ $t = t1 ]; then "$bin/hp-train" -q t1.yaml --metrics m.jsonl
				else mpiexec -n 8 "$bin/hp-train" -q t8.yaml --metrics m.jsonl; fi
				jq -s '[.[1:][].step_time_s] | sort | .[length / 2 | floor]' m.jsonl >>$b-$t.times
			done
			i=$((i + 1))
		done
		mid=$(((rounds + 1) / 2))
		o=$(sort -g old-$t.times | sed -n ${mid}p) n=$(sort -g new-$t.times | sed -n ${mid}p)
		o1=$(sort -g old-$t.times | sed -n 1p) n1=$(sort -g new-$t.times | sed -n 1p)
		awk -v o="$o" -v n="$n" -v o1="$o1" -v n1="$n1" -v t=$t -v r="$rounds" 'BEGIN {
			printf "%s step time over %d runs each (a run: its median step): median old %.5f s, new %.5f s, new/old %.3f; fastest old %.5f s, new %.5f s, new/old %.3f\n",
				t, r, o, n, n / o, o1, n1, n1 / o1 }'
	done
fi
exit $bad
