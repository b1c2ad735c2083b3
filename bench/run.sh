#!/bin/sh
# bench/run.sh - `make bench`: training tokens/s of hp-train against PyTorch.
#
# For each model and thread count, trains the same model (same weights, same
# token batches, same batch/seq, same optimizer settings) once with hp-train
# and once with bench/torch_llama.py under Debian's python3-torch (1.13,
# /usr/bin/python3), both at world size 1 with OPENBLAS_NUM_THREADS and
# OMP_NUM_THREADS set to the thread count, and prints a table of tokens/s and
# the ratio hp/torch against the 1.5x target.  Both sides skip their first
# two steps and report sum(tokens) / sum(step time) over the rest.  The
# first-step losses are printed side by side: same weights and same tokens
# must give the same loss, which shows that the two did the same work.
#
# Models: stories260K (data/stories260K/hf, 0.26M params, tied embeddings)
# and "wide", a random 8-layer Llama (hidden 512, 8 heads / 4 kv heads,
# intermediate 1376, vocab 512, untied lm_head, 23.7M params) written by
# bench/mkmodel.py.  Tokens: records of seq+1 real TinyStories ids from
# data/tokenizers, in a Megatron indexed dataset, read in file order.
#
# This is a throughput benchmark, not a test: it checks nothing but prints
# everything, and exits non-zero only when a run fails.
#
# Environment:
#   HP_BUILD_DIR          build directory holding bin/hp-train (set by make)
#   HP_BENCH_THREADS      thread counts to measure (default "1 2")
#   HP_BENCH_STEPS        training steps per run, the first 2 untimed (default 10)
#   HP_BENCH_MODELS       subset of "stories260K wide" (default both)
#   HP_BENCH_TORCH_ONLY=1 measure PyTorch alone (no hp-train needed)
#   HP_BENCH_PYTHON       python with torch (default /usr/bin/python3)
#   OMP_WAIT_POLICY       passed to both (default PASSIVE, see below)
#
# OMP_WAIT_POLICY=PASSIVE: Debian's torch runs its own ops on OpenMP threads
# and its GEMMs on OpenBLAS's pthreads; with GNU OpenMP's default spinning the
# two pools fight over the cores, and at 2 threads the wide model ran 4x
# slower (7.9 s/step against 1.9 s/step).  A baseline must not lose to a
# setting, so both sides get the passive policy unless the caller sets one.

set -u

die() {
	printf 'bench: %s\n' "$*" >&2
	exit 1
}

src=$(cd "$(dirname "$0")/.." && pwd) || die "cannot find the source tree"
build=${HP_BUILD_DIR:-$src/build}
py=${HP_BENCH_PYTHON:-/usr/bin/python3}
threads=${HP_BENCH_THREADS:-"1 2"}
steps=${HP_BENCH_STEPS:-10}
models=${HP_BENCH_MODELS:-"stories260K wide"}
torch_only=${HP_BENCH_TORCH_ONLY:-0}
warmup=2
batch=8
seq=256
# |hp - torch| first-step loss: both are fp32 sums over 2048 tokens of a
# loss near 6; 1e-4 allows a different summation order, not a different model.
loss_tol=1e-4
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export OMP_WAIT_POLICY

hp=$build/bin/hp-train
if [ "$torch_only" != 1 ] && ! [ -x "$hp" ]; then
	die "'$hp': not built (run make first, or HP_BENCH_TORCH_ONLY=1 to measure PyTorch alone)"
fi
case $steps in
''|*[!0-9]*) die "HP_BENCH_STEPS='$steps': expected an integer above $warmup" ;;
esac
[ "$steps" -gt "$warmup" ] || die "HP_BENCH_STEPS='$steps': expected an integer above $warmup"
"$py" -c 'import torch, numpy' 2>/dev/null ||
	die "'$py': cannot import torch and numpy (apt-get install python3-torch)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hp-bench.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- token data: records of seq+1 tokens --------------------------------------
jsonl=$src/data/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl
data=$tmp/tokens
if [ -x "$build/bin/hp-test-tool" ] &&
   "$build/bin/hp-test-tool" mkidx --vocab 512 --records-of $((seq + 1)) \
	-o "$data" "$jsonl" >"$tmp/mkidx.log" 2>&1; then
	data_by="hp-test-tool mkidx"
else
	"$py" "$src/bench/mkidx.py" --vocab 512 --records-of $((seq + 1)) \
		-o "$data" "$jsonl" 2>"$tmp/mkidx.log" ||
		die "bench/mkidx.py failed: $(tail -n 1 "$tmp/mkidx.log")"
	data_by="bench/mkidx.py (hp-test-tool mkidx not available)"
fi

# --- helpers -------------------------------------------------------------------

# model_dir NAME: the HF folder of a model, created on first use.
model_dir() {
	case $1 in
	stories260K) echo "$src/data/stories260K/hf" ;;
	wide)
		if ! [ -f "$tmp/wide/model.safetensors" ]; then
			"$py" "$src/bench/mkmodel.py" -o "$tmp/wide" --hidden 512 --layers 8 \
				--heads 8 --kv-heads 4 --intermediate 1376 --vocab 512 \
				--max-pos 512 --seed 1234 >&2 || return 1
		fi
		echo "$tmp/wide" ;;
	*) return 1 ;;
	esac
}

# write_config MODEL_DIR FILE: hp-train's YAML for this benchmark.
write_config() {
	cat >"$2" <<EOF
model:
  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained
  pretrained_model_name_or_path: $1
  torch_dtype: float32
training: {train_iters: $steps, global_batch_size: $batch, micro_batch_size: $batch, max_grad_norm: 1.0, seed: 1234, logging_steps: 1}
checkpoint: {save_ckpt: false}
dataset:
  _target_: hyper_parallel.data.build_indexed_text_dataset
  data_path: $data
  data_config: {seq_length: $seq, is_dataset_from_mr: true}
optimizer:
  _target_: hyper_parallel.components.optim.AdamW
  adamw_config: {adamw_lr: 1.0e-3, adamw_weight_decay: 0.1, adamw_betas: [0.9, 0.95], adamw_eps: 1.0e-8}
lr_scheduler:
  _target_: hyper_parallel.components.optim.MultiLRScheduler
  lr_decay_style: constant
  lr_config: {lr: 1.0e-3, lr_warmup_steps: 0}
checkpoint: {save_ckpt: false}
EOF
}

# hp_summary METRICS: "tokens_per_s first_loss" from hp-train's --metrics
# file, skipping the first $warmup steps like torch_llama.py does.
hp_summary() {
	"$py" - "$1" "$warmup" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows.sort(key=lambda r: r["step"])
timed = rows[int(sys.argv[2]):]
if not timed:
    sys.exit("no timed steps in '%s'" % sys.argv[1])
print("%.6g %.9g" % (sum(r["tokens"] for r in timed) / sum(r["step_time_s"] for r in timed),
                     rows[0]["loss"]))
EOF
}

# torch_summary JSON: "tokens_per_s first_loss params version".
torch_summary() {
	"$py" -c 'import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("%.6g %.9g %d %s" % (r["tokens_per_s"], r["first_loss"], r["params"], r["torch_version"]))' "$1"
}

# --- the runs ------------------------------------------------------------------
failed=0
: >"$tmp/results"
for m in $models; do
	dir=$(model_dir "$m") || die "cannot create model '$m' (known: stories260K wide)"
	for t in $threads; do
		hp_tps=- hp_loss=-
		if [ "$torch_only" != 1 ]; then
			printf 'bench: %s, %s thread(s): hp-train...\n' "$m" "$t" >&2
			write_config "$dir" "$tmp/$m.yaml"
			if (cd "$tmp" && OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t \
				"$hp" "$tmp/$m.yaml" --metrics "$tmp/$m-$t.jsonl") \
				>"$tmp/$m-$t.hp.log" 2>&1 &&
			   out=$(hp_summary "$tmp/$m-$t.jsonl" 2>&1); then
				# shellcheck disable=SC2086 # split the two numbers
				set -- $out
				hp_tps=$1 hp_loss=$2
			else
				tail -n 5 "$tmp/$m-$t.hp.log" >&2
				printf 'bench: hp-train failed on %s with %s thread(s)\n' "$m" "$t" >&2
				hp_tps=failed
				failed=1
			fi
		fi
		printf 'bench: %s, %s thread(s): torch...\n' "$m" "$t" >&2
		if OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t "$py" "$src/bench/torch_llama.py" \
			--model "$dir" --threads "$t" --steps "$steps" --warmup "$warmup" \
			--batch "$batch" --seq "$seq" --data "$data" \
			>"$tmp/$m-$t.torch.json" 2>"$tmp/$m-$t.torch.log" &&
		   out=$(torch_summary "$tmp/$m-$t.torch.json"); then
			# shellcheck disable=SC2086 # split the four fields
			set -- $out
			echo "$m $1 $t $hp_tps $2 $hp_loss $3 $4" >>"$tmp/results"
		else
			tail -n 5 "$tmp/$m-$t.torch.log" >&2
			printf 'bench: torch_llama.py failed on %s with %s thread(s)\n' "$m" "$t" >&2
			failed=1
		fi
	done
done

# --- the table -------------------------------------------------------------------
awk -v steps="$steps" -v warmup="$warmup" -v batch="$batch" -v seq="$seq" \
    -v data_by="$data_by" -v tol="$loss_tol" -v coretype="${OPENBLAS_CORETYPE:-unset}" \
    -v wait="$OMP_WAIT_POLICY" '
function human(n) {
	if (n >= 1e6) return sprintf("%.1fM", n / 1e6)
	if (n >= 1e3) return sprintf("%.0fK", n / 1e3)
	return n
}
function abs(x) { return x < 0 ? -x : x }
{
	model[NR] = $1; torch[NR] = $2; thr[NR] = $3; hp[NR] = $4
	tloss[NR] = $5; hloss[NR] = $6; params[NR] = $7; version = $8
}
END {
	printf "\nhp-train vs PyTorch %s, CPU fp32, world size 1: batch %d x seq %d, %d steps (first %d untimed)\n",
		version, batch, seq, steps, warmup
	printf "tokens: %s; OPENBLAS_CORETYPE=%s OMP_WAIT_POLICY=%s\n\n", data_by, coretype, wait
	printf "%-12s %7s %7s %10s %12s %7s  %s\n", "model", "params", "threads", "hp tok/s",
		"torch tok/s", "ratio", "target 1.5x"
	for (i = 1; i <= NR; i++) {
		if (hp[i] == "-" || hp[i] == "failed") {
			ratio = "-"; verdict = (hp[i] == "-") ? "-" : "not met (hp-train failed)"
			hps = hp[i]
		} else {
			r = hp[i] / torch[i]; ratio = sprintf("%.2fx", r)
			verdict = r >= 1.5 ? "met" : "not met"
			hps = sprintf("%.0f", hp[i])
		}
		printf "%-12s %7s %7s %10s %12.0f %7s  %s\n", model[i], human(params[i]), thr[i],
			hps, torch[i], ratio, verdict
	}
	printf "\nfirst-step loss (same weights, same tokens):\n"
	for (i = 1; i <= NR; i++) {
		if (hloss[i] == "-") {
			printf "  %-12s threads %s: hp %s, torch %.6f\n", model[i], thr[i],
				hp[i] == "failed" ? "failed" : "-", tloss[i]
			continue
		}
		d = abs(hloss[i] - tloss[i])
		printf "  %-12s threads %s: hp %.6f, torch %.6f -- losses agree: %s (|diff|=%.2g)\n",
			model[i], thr[i], hloss[i], tloss[i], d <= tol ? "yes" : "no", d
	}
}' "$tmp/results"

[ "$failed" = 0 ] || die "some runs failed (see above)"
