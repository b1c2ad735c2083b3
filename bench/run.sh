#!/bin/sh
# bench/run.sh - `make bench`: training tokens/s of hp-train against PyTorch,
# Debian's 1.13 and PyPI's current 2.x, in one run.
#
# For each model and thread count, trains the same model (same weights, same
# token batches, same batch/seq, same optimizer settings) with hp-train and
# with bench/torch_llama.py twice: under Debian's python3-torch (1.13,
# /usr/bin/python3) and under torch 2.15.0 from PyPI in the venv that
# scripts/ref-venv.sh makes (build/ref-venv, the one t/ref/make-hf-goldens.sh
# uses; `make bench` creates it when it is missing: about 5.6 GB, four
# minutes here).  Each at world size 1 with OPENBLAS_NUM_THREADS,
# OMP_NUM_THREADS and HP_NUM_THREADS set to the thread count.  The table
# prints tokens/s of the three, the ratios hp/1.13 and hp/2.x, and each
# against its target (1.5x torch 1.13, 1.3x torch 2.x).  To see an AVX2
# machine on an AVX-512 one, cap both sides: HP_CPU=avx2 for hp, and
# ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
# ONEDNN_MAX_CPU_ISA=AVX2 for torch 2.x.  All three skip their first two steps and report
# sum(tokens) / sum(step time) over the rest.  The first-step losses of the
# three are printed side by side: same weights and same tokens must give
# the same loss, which shows that they did the same work.  A round runs
# hp-train once per model and thread count, then each PyTorch once per
# thread count, training the models in turn in one process (torch takes
# seconds to import, torch 2.x with its CUDA libraries about five).
#
# Rounds (HP_BENCH_ROUNDS, default 1): this machine's speed drifts by 5-10%
# over minutes, torch's and hp's alike, so one run of each can land a ratio
# on either side of a target.  With R rounds, run one after the other
# (hp, torch 1.13, torch 2.x, then again), each ratio is taken within a
# round, where both sides met the same machine; the table shows the median
# tokens/s of each side and the median of the R ratios, the ratios of every
# round are listed below it, and a target reads "met" only when every round
# met it ("met in k of R rounds" otherwise).
#
# FLOP/s: 6 x the multiply-adds per token of the model (the matmuls, the LM
# head, and causal attention's two products over the (T+1)/2 keys a token
# sees on average), the count MFU uses; it is the model's work, not what
# either implementation spends on it.  Compare with the single-core FMA
# peak that gemm-bench prints.
#
# Attention on the PyTorch side is what transformers would run there (see
# bench/torch_llama.py): scaled_dot_product_attention on torch 2.x (HF's
# default "sdpa"), explicit matmul + softmax on 1.13, which has no SDPA.
#
# Models: stories260K (data/stories260K/hf, 0.26M params, tied embeddings)
# and "wide", a random 8-layer Llama (hidden 512, 8 heads / 4 kv heads,
# intermediate 1376, vocab 512, untied lm_head, 23.7M params) written by
# bench/mkmodel.py.  Tokens: records of seq+1 real TinyStories ids from
# data/tokenizers, in a Megatron indexed dataset, read in file order.
#
# This is a throughput benchmark, not a test: it checks nothing but prints
# everything, and exits non-zero only when a run fails (or, outside smoke
# mode, when a PyTorch it was asked for is not there).
#
# Smoke mode (HP_BENCH_SMOKE=1; t/t1300 runs it): batch 2 x seq 64, 2 steps
# (the first untimed), 1 thread, and "wide" shrunk to 2 layers of hidden 64:
# the same table in a few seconds, its numbers not worth reading and no
# target judged; the two PyTorches run at the same time.  A PyTorch that is
# missing is a column of "-" and a printed reason, not a failure: smoke
# mode never installs anything (without any python that has numpy, "wide"
# is skipped too, with its reason).
#
# Environment:
#   HP_BUILD_DIR          build directory holding bin/hp-train (set by make)
#   HP_BENCH_SMOKE=1      smoke mode (above)
#   HP_BENCH_THREADS      thread counts to measure (default "1 2"; smoke "1")
#   HP_BENCH_STEPS        training steps per run, the first 2 untimed (default 10)
#   HP_BENCH_ROUNDS       rounds of every run (above; default 1)
#   HP_BENCH_MODELS       subset of "stories260K wide" (default both)
#   HP_BENCH_TORCH_ONLY=1 measure PyTorch alone (no hp-train needed)
#   HP_BENCH_PYTHON       python with torch 1.13 (default /usr/bin/python3)
#   HP_BENCH_TORCH2=0     leave out the torch 2.x column (and its venv)
#   HP_REF_VENV           the torch 2.x venv (default build/ref-venv of the
#                         source tree, as scripts/ref-venv.sh makes it)
#   OMP_WAIT_POLICY       passed to all (default PASSIVE, see below)
#
# OMP_WAIT_POLICY=PASSIVE: Debian's torch runs its own ops on OpenMP threads
# and its GEMMs on OpenBLAS's pthreads; with GNU OpenMP's default spinning the
# two pools fight over the cores, and at 2 threads the wide model ran 4x
# slower (7.9 s/step against 1.9 s/step).  A baseline must not lose to a
# setting, so every side gets the passive policy unless the caller sets one.

set -u

die() {
	printf 'bench: %s\n' "$*" >&2
	exit 1
}
say() {
	printf 'bench: %s\n' "$*" >&2
}

src=$(cd "$(dirname "$0")/.." && pwd) || die "cannot find the source tree"
build=${HP_BUILD_DIR:-$src/build}
smoke=${HP_BENCH_SMOKE:-0}
py=${HP_BENCH_PYTHON:-/usr/bin/python3}
models=${HP_BENCH_MODELS:-"stories260K wide"}
torch_only=${HP_BENCH_TORCH_ONLY:-0}
torch2=${HP_BENCH_TORCH2:-1}
venv=${HP_REF_VENV:-$src/build/ref-venv}
if [ "$smoke" = 1 ]; then
	threads=${HP_BENCH_THREADS:-1}
	steps=${HP_BENCH_STEPS:-2}
	warmup=1 batch=2 seq=64
else
	threads=${HP_BENCH_THREADS:-"1 2"}
	steps=${HP_BENCH_STEPS:-10}
	warmup=2 batch=8 seq=256
fi
# |hp - torch| first-step loss: fp32 sums over batch x seq tokens of a loss
# near 6; 1e-4 allows a different summation order, not a different model.
loss_tol=1e-4
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# no __pycache__ folders written into the source tree
PYTHONDONTWRITEBYTECODE=1
export OMP_WAIT_POLICY PYTHONDONTWRITEBYTECODE

hp=$build/bin/hp-train
if [ "$torch_only" != 1 ] && ! [ -x "$hp" ]; then
	die "'$hp': not built (run make first, or HP_BENCH_TORCH_ONLY=1 to measure PyTorch alone)"
fi
rounds=${HP_BENCH_ROUNDS:-1}
case $steps in
''|*[!0-9]*) die "HP_BENCH_STEPS='$steps': expected an integer above $warmup" ;;
esac
case $rounds in
''|*[!0-9]*|0*) die "HP_BENCH_ROUNDS='$rounds': expected an integer of 1 or more" ;;
esac
[ "$steps" -gt "$warmup" ] || die "HP_BENCH_STEPS='$steps': expected an integer above $warmup"
command -v jq >/dev/null || die "jq not found (sh scripts/install-deps.sh installs it)"

# --- the PyTorches: py1 Debian's, py2 the venv's; empty when left out --------
notes=
note() {
	notes="$notes$*
"
}
py1=$py
if ! "$py1" -c 'import torch, numpy' 2>/dev/null; then
	[ "$smoke" = 1 ] || die "'$py1': cannot import torch and numpy (sh scripts/install-deps.sh --bench installs python3-torch)"
	note "torch 1.13 column skipped: '$py1' cannot import torch and numpy (sh scripts/install-deps.sh --bench installs python3-torch)"
	py1=
fi
py2=
if [ "$torch2" = 0 ]; then
	note "torch 2.x column left out (HP_BENCH_TORCH2=0)"
elif [ "$smoke" = 1 ]; then
	if py2=$(sh "$src/scripts/ref-venv.sh" --check "$venv"); then :; else
		note "torch 2.x column skipped: no venv at '$venv' (smoke mode installs nothing; scripts/ref-venv.sh makes it)"
		py2=
	fi
else
	py2=$(sh "$src/scripts/ref-venv.sh" "$venv") ||
		die "cannot make the torch 2.x venv '$venv' (see above; HP_BENCH_TORCH2=0 leaves that column out)"
fi
[ "$torch_only" != 1 ] || [ -n "$py1$py2" ] || die "HP_BENCH_TORCH_ONLY=1 but no PyTorch to measure"
# the python that writes the "wide" model (bench/mkmodel.py needs numpy)
mkpy=
for p in "$py1" "$py2" "$py" python3; do
	if [ -n "$p" ] && "$p" -c 'import numpy' 2>/dev/null; then
		mkpy=$p
		break
	fi
done

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
elif [ -n "$mkpy" ]; then
	"$mkpy" "$src/bench/mkidx.py" --vocab 512 --records-of $((seq + 1)) \
		-o "$data" "$jsonl" 2>"$tmp/mkidx.log" ||
		die "bench/mkidx.py failed: $(tail -n 1 "$tmp/mkidx.log")"
	data_by="bench/mkidx.py (hp-test-tool mkidx not available)"
else
	die "cannot write the tokens: hp-test-tool mkidx failed: $(tail -n 1 "$tmp/mkidx.log")"
fi

# --- helpers -------------------------------------------------------------------

# model_dir NAME: the HF folder of a model, created on first use.
model_dir() {
	case $1 in
	stories260K) echo "$src/data/stories260K/hf" ;;
	wide)
		if ! [ -f "$tmp/wide/model.safetensors" ]; then
			if [ "$smoke" = 1 ]; then
				set -- --hidden 64 --layers 2 --heads 4 --kv-heads 2 --intermediate 172
			else
				set -- --hidden 512 --layers 8 --heads 8 --kv-heads 4 --intermediate 1376
			fi
			"$mkpy" "$src/bench/mkmodel.py" -o "$tmp/wide" "$@" --vocab 512 \
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
EOF
}

# hp_summary METRICS: "tokens_per_s first_loss" from hp-train's --metrics
# file, skipping the first $warmup steps like torch_llama.py does.
hp_summary() {
	jq -s -r --argjson w "$warmup" 'sort_by(.step) as $r | $r[$w:] as $t |
		if ($t | length) == 0 then error("no timed steps")
		else "\(($t | map(.tokens) | add) / ($t | map(.step_time_s) | add)) \($r[0].loss)" end' "$1"
}

# model_flops MODEL_DIR: training FLOPs per token of a Llama config.json at
# sequence length $seq: 6 x (per layer: q and o, k and v, the gated MLP's
# three matmuls, causal attention's QK^T and PV; then the LM head).
model_flops() {
	jq -r --argjson T "$seq" '.hidden_size as $H | .num_attention_heads as $nh |
		(.num_key_value_heads // $nh) as $nkv | (.head_dim // ($H / $nh)) as $hd |
		6 * (.num_hidden_layers * (2 * $H * $nh * $hd + 2 * $H * $nkv * $hd +
		     3 * $H * .intermediate_size + $nh * $hd * ($T + 1)) + $H * .vocab_size)' "$1/config.json"
}

# torch_run PYTHON THREADS OUT: one torch_llama.py process training every
# model of $dirs in turn (one import of torch for all: seconds each, most
# of a smoke run), its JSON lines, one a model, to OUT.json; nothing for a
# left-out PyTorch; OUT.failed and its log's tail on a failure
torch_run() {
	[ -n "$1" ] || return 0
	say "$2 thread(s): torch_llama.py under $1..."
	set -- "$1" "$2" "$3"
	for d in $dirs; do
		set -- "$@" --model "$d"
	done
	py_=$1 t_=$2 out_=$3
	shift 3
	if ! OPENBLAS_NUM_THREADS=$t_ OMP_NUM_THREADS=$t_ "$py_" "$src/bench/torch_llama.py" "$@" \
		--threads "$t_" --steps "$steps" --warmup "$warmup" --batch "$batch" --seq "$seq" \
		--data "$data" >"$out_.json" 2>"$out_.log"; then
		tail -n 5 "$out_.log" >&2
		say "torch_llama.py ($py_) failed with $t_ thread(s)"
		: >"$out_.failed"
	fi
}

# torch_row OUT I: "tokens_per_s first_loss params version attention" of
# model I (from 1) in OUT.json; "- - - - -" for a left-out PyTorch, "failed ..." on a failure
torch_row() {
	if [ -f "$1.failed" ]; then
		echo "failed - - - -"
	elif [ -f "$1.json" ] && r_=$(sed -n "$2p" "$1.json" |
		jq -r '"\(.tokens_per_s) \(.first_loss) \(.params) \(.torch_version) \(.attention)"') && [ -n "$r_" ]; then
		echo "$r_"
	elif [ -f "$1.json" ]; then
		echo "failed - - - -"
	else
		echo "- - - - -"
	fi
}

# --- the runs ------------------------------------------------------------------
failed=0
: >"$tmp/results"
v1=- a1=- v2=- a2=-
# the models that run, their folders (made once, before anything is timed)
# and their FLOPs per token
run_models='' dirs='' flops=''
for m in $models; do
	case $m in
	stories260K|wide) ;;
	*) die "unknown model '$m' (known: stories260K wide)" ;;
	esac
	if [ "$m" = wide ] && [ -z "$mkpy" ]; then
		note "model wide skipped: bench/mkmodel.py needs a python with numpy, and none here has it"
		continue
	fi
	dir=$(model_dir "$m") || die "cannot create model '$m'"
	case $dir in *[[:space:]]*) die "'$dir': a model folder with a space is not supported" ;; esac
	f=$(model_flops "$dir") || die "'$dir/config.json': cannot count the model's FLOPs"
	run_models="${run_models:+$run_models }$m" dirs="${dirs:+$dirs }$dir" flops="${flops:+$flops }$f"
done
ti=0
for t in $threads; do
	ti=$((ti + 1))
	r=0
	while [ "$r" -lt "$rounds" ]; do
		r=$((r + 1))
		[ "$rounds" = 1 ] || say "round $r of $rounds"
		mi=0
		for m in $run_models; do
			mi=$((mi + 1))
			dir=$(echo "$dirs" | cut -d' ' -f"$mi")
			res=$tmp/$m-$t-$r.hp.r
			echo "- - -" >"$res"
			[ "$torch_only" != 1 ] || continue
			say "$m, $t thread(s): hp-train..."
			write_config "$dir" "$tmp/$m.yaml"
			out=
			if (cd "$tmp" && OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t HP_NUM_THREADS=$t \
				"$hp" "$tmp/$m.yaml" --metrics "$tmp/$m-$t-$r.jsonl") \
				>"$tmp/$m-$t-$r.hp.log" 2>&1 &&
			   out=$(hp_summary "$tmp/$m-$t-$r.jsonl" 2>&1); then
				echo "$out $(sed -n 's/^run\.parameters  *//p' "$tmp/$m-$t-$r.hp.log")" >"$res"
			else
				tail -n 5 "$tmp/$m-$t-$r.hp.log" >&2
				say "hp-train failed on $m with $t thread(s)${out:+: $out}"
				echo "failed - -" >"$res"
				failed=1
			fi
		done
		# in smoke mode the two PyTorches run at once: nothing there is
		# timed worth reading, and each spends seconds importing torch
		if [ "$smoke" = 1 ]; then
			torch_run "$py1" "$t" "$tmp/t1-$t-$r" &
			torch_run "$py2" "$t" "$tmp/t2-$t-$r" &
			wait
		else
			torch_run "$py1" "$t" "$tmp/t1-$t-$r"
			torch_run "$py2" "$t" "$tmp/t2-$t-$r"
		fi
		mi=0
		for m in $run_models; do
			mi=$((mi + 1))
			# shellcheck disable=SC2046 # split the fields
			set -- $(cat "$tmp/$m-$t-$r.hp.r") $(torch_row "$tmp/t1-$t-$r" $mi) \
				$(torch_row "$tmp/t2-$t-$r" $mi)
			# hp: tps loss params; torch 1.13 and 2.x: tps loss params version attention
			params=$3
			[ "$params" != - ] && [ -n "$params" ] || params=$6
			[ "$params" != - ] || params=${11}
			[ "$4" = - ] || [ "$4" = failed ] || v1=$7 a1=$8
			[ "$9" = - ] || [ "$9" = failed ] || v2=${12} a2=${13}
			case "$4 $9" in *failed*) failed=1 ;; esac
			echo "$mi $ti $r $m $t $params $(echo "$flops" | cut -d' ' -f"$mi") $1 $2 $4 $5 $9 ${10}" \
				>>"$tmp/results"
		done
	done
done
sort -n -k1,1 -k2,2 -k3,3 "$tmp/results" >"$tmp/table"

# --- the table -------------------------------------------------------------------
awk -v steps="$steps" -v warmup="$warmup" -v batch="$batch" -v seq="$seq" -v rounds="$rounds" \
    -v data_by="$data_by" -v tol="$loss_tol" -v coretype="${OPENBLAS_CORETYPE:-unset}" \
    -v wait="$OMP_WAIT_POLICY" -v smoke="$smoke" -v v1="$v1" -v a1="$a1" -v v2="$v2" -v a2="$a2" \
    -v py1="${py1:-}" -v venv="$venv" -v notes="$notes" -v hpcpu="${HP_CPU:-unset}" '
function human(n) {
	if (n == "-") return n
	if (n >= 1e6) return sprintf("%.1fM", n / 1e6)
	if (n >= 1e3) return sprintf("%.0fK", n / 1e3)
	return n
}
function abs(x) { return x < 0 ? -x : x }
# major.minor of a torch version, or DEF when it did not run
function short(v, def,   p) {
	if (v == "-") return def
	split(v, p, /[.+]/)
	return p[1] "." p[2]
}
function num(x) { return x != "-" && x != "failed" }
function tps(x) { return num(x) ? sprintf("%.0f", x) : x }
function ratio(h, t) { return num(h) && num(t) ? sprintf("%.2fx", h / t) : "-" }
function gflops(x, f) { return num(x) ? sprintf("%.1f", x * f / 1e9) : x }
# the median of v[1..n] (sorts v)
function med(v, n,   j, k, t) {
	for (j = 2; j <= n; j++)
		for (k = j; k > 1 && v[k - 1] > v[k]; k--) { t = v[k]; v[k] = v[k - 1]; v[k - 1] = t }
	return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
# the median of row i'\''s rounds of column c ("failed" if any failed, "-"
# if none ran)
function median(c, i,   r, n, v) {
	n = 0
	for (r = 1; r <= nr[i]; r++) {
		if (val[i, r, c] == "failed") return "failed"
		if (num(val[i, r, c])) v[++n] = val[i, r, c] + 0
	}
	return n ? med(v, n) : "-"
}
# the median of row i'\''s per-round ratios hp / column c, as a cell
function mratio(c, i,   r, n, v) {
	n = 0
	for (r = 1; r <= nr[i]; r++)
		if (num(val[i, r, "hp"]) && num(val[i, r, c])) v[++n] = val[i, r, "hp"] / val[i, r, c]
	return n ? sprintf("%.2fx", med(v, n)) : "-"
}
# the targets: 1.5x torch 1.13 (the first goal of hp-train), 1.3x torch 2.x
# (set by issue #18 for the GEMM-bound wide model on AVX2 machines), judged
# round by round
function verdict(c, i, goal,   r, n, k) {
	if (smoke) return "-"
	n = k = 0
	for (r = 1; r <= nr[i]; r++) {
		if (val[i, r, "hp"] == "failed") return "not met (hp failed)"
		if (!num(val[i, r, "hp"]) || !num(val[i, r, c])) continue
		n++
		if (val[i, r, "hp"] / val[i, r, c] >= goal) k++
	}
	if (!n) return "-"
	if (n == 1) return k ? "met" : "not met"
	return k == n ? "met" : !k ? "not met" : sprintf("met in %d of %d rounds", k, n)
}
{
	key = $1 " " $2
	if (key != last) {
		NI++; last = key
		model[NI] = $4; thr[NI] = $5; params[NI] = $6; flop[NI] = $7
	}
	r = ++nr[NI]
	val[NI, r, "hp"] = $8; val[NI, r, "t1"] = $10; val[NI, r, "t2"] = $12
	# the first round with a loss gives it
	if (hloss[NI] == "" || hloss[NI] == "-") hloss[NI] = $9
	if (l1[NI] == "" || l1[NI] == "-") l1[NI] = $11
	if (l2[NI] == "" || l2[NI] == "-") l2[NI] = $13
}
END {
	s1 = short(v1, "1.13"); s2 = short(v2, "2.x")
	printf "\nhp-train vs PyTorch %s and %s, CPU fp32, world size 1: batch %d x seq %d, %d steps (first %d untimed)%s%s\n",
		s1, s2, batch, seq, steps, warmup,
		(rounds > 1 ? sprintf("; %d rounds: medians, ratios taken within a round", rounds) : ""),
		smoke ? "\nsmoke mode: tiny sizes, the numbers are not worth reading and no target is judged" : ""
	printf "torch %s: %s; torch %s: %s\n", s1, v1 == "-" ? "not run" : sprintf("%s (%s, %s attention)", v1, py1, a1),
		s2, v2 == "-" ? "not run" : sprintf("%s (%s, %s attention)", v2, venv, a2)
	printf "tokens: %s; OPENBLAS_CORETYPE=%s OMP_WAIT_POLICY=%s HP_CPU=%s\n\n", data_by, coretype, wait, hpcpu
	h1 = s1 " tok/s"; h2 = s2 " tok/s"
	printf "%-12s %7s %7s %10s %11s %11s %8s %8s  %s\n", "model", "params", "threads", "hp tok/s",
		h1, h2, "hp/" s1, "hp/" s2, "targets 1.5x " s1 " / 1.3x " s2
	for (i = 1; i <= NI; i++) {
		hp[i] = median("hp", i); t1[i] = median("t1", i); t2[i] = median("t2", i)
		printf "%-12s %7s %7s %10s %11s %11s %8s %8s  %s / %s\n", model[i], human(params[i]), thr[i],
			tps(hp[i]), tps(t1[i]), tps(t2[i]), mratio("t1", i), mratio("t2", i),
			verdict("t1", i, 1.5), verdict("t2", i, 1.3)
	}
	if (rounds > 1) {
		printf "\nthe ratios of each round (hp/%s, hp/%s):\n", s1, s2
		for (i = 1; i <= NI; i++) {
			line = ""
			for (r = 1; r <= nr[i]; r++)
				line = line sprintf("%s%s/%s", r > 1 ? ", " : "", ratio(val[i, r, "hp"], val[i, r, "t1"]),
						    ratio(val[i, r, "hp"], val[i, r, "t2"]))
			printf "  %-12s threads %s: %s\n", model[i], thr[i], line
		}
	}
	printf "\nGFLOP/s (6 x multiply-adds per token, causal attention; compare gemm-bench'\''s FMA peak):\n"
	for (i = 1; i <= NI; i++)
		printf "  %-12s threads %s: %.1f MFLOP/token; hp %s, torch %s %s, torch %s %s\n", model[i], thr[i],
			flop[i] / 1e6, gflops(hp[i], flop[i]), s1, gflops(t1[i], flop[i]), s2, gflops(t2[i], flop[i])
	printf "\nfirst-step loss (same weights, same tokens):\n"
	for (i = 1; i <= NI; i++) {
		line = ""; n = 0; lo = 0; hi = 0
		split(hloss[i] " " l1[i] " " l2[i], L, " ")
		split("hp|torch " s1 "|torch " s2, W, "|")
		for (j = 1; j <= 3; j++) {
			if (L[j] == "-") {
				w = (j == 1 && hp[i] == "failed") || (j == 2 && t1[i] == "failed") || (j == 3 && t2[i] == "failed")
				line = line sprintf("%s%s %s", j > 1 ? ", " : "", W[j], w ? "failed" : "-")
				continue
			}
			line = line sprintf("%s%s %.6f", j > 1 ? ", " : "", W[j], L[j])
			if (!n || L[j] + 0 < lo) lo = L[j] + 0
			if (!n || L[j] + 0 > hi) hi = L[j] + 0
			n++
		}
		if (n >= 2)
			line = line sprintf(" -- losses agree: %s (max |diff|=%.2g)", hi - lo <= tol ? "yes" : "no", hi - lo)
		printf "  %-12s threads %s: %s\n", model[i], thr[i], line
	}
	if (notes != "")
		printf "\n%s", notes
}' "$tmp/table"

[ "$failed" = 0 ] || die "some runs failed (see above)"
