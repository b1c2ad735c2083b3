#!/bin/sh
# bench/actckpt-bench.sh - activation checkpointing's memory and step time:
# off, selective and full, in one run, on the same weights and tokens.
#
# The model has Qwen3-30B-A3B's proportions at 1/4 width (hidden 512,
# 8 heads of 128 over 1 KV head, 128 experts top-8, moe_intermediate 192,
# vocab 37,984), seq 2048, micro-batch 1, with the seed's kernels (fused
# residual norms, grouped experts, chunked cross-entropy of 1024 rows)
# and reference attention (selective recomputation re-makes its
# probabilities; flash attention keeps none to begin with).  It trains
# $HP_BENCH_LAYERS layers (default 4: a 48-layer step here takes minutes;
# a layer's recomputation costs the same at any depth) for
# $HP_BENCH_STEPS steps, the first untimed, one process, HP_NUM_THREADS
# threads (default 2).
#
# Columns: the activation arena hp-train measured (equal to the plan's
# estimate, which hp-train checks and t0935 tests), the plan's estimate
# for all 48 layers (hp-plan), peak RSS (/usr/bin/time, where present),
# mean step seconds, and both as ratios to off.  The targets (#19): full
# at least 3x less activation memory than off at 48 layers, and at most
# 1.4x its step time.  Not a test: it prints the targets beside the
# numbers, and only a failed run exits non-zero.
#
# Smoke mode (HP_BENCH_SMOKE=1; t/t1300 runs it): 2 layers of hidden 64,
# 8 experts, seq 64, 2 steps: the same table in seconds, the numbers not
# worth reading, no target judged.
set -u

die() {
	printf 'actckpt-bench: %s\n' "$*" >&2
	exit 1
}

src=$(cd "$(dirname "$0")/.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
smoke=${HP_BENCH_SMOKE:-0}
threads=${HP_NUM_THREADS:-2}
if [ "$smoke" = 1 ]; then
	layers=${HP_BENCH_LAYERS:-2} steps=${HP_BENCH_STEPS:-2} seq=64 chunk=32 full=4
	hidden=64 heads=4 hd=16 experts=8 topk=2 moe=32 vocab=512
else
	layers=${HP_BENCH_LAYERS:-4} steps=${HP_BENCH_STEPS:-4} seq=2048 chunk=1024 full=48
	hidden=512 heads=8 hd=128 experts=128 topk=8 moe=192 vocab=37984
fi
for b in hp-train hp-plan hp-test-tool; do
	[ -x "$build/bin/$b" ] || die "'$build/bin/$b': not built; run make"
done
command -v jq >/dev/null || die "jq not found"
for v in "layers=$layers" "steps=$steps"; do
	case ${v#*=} in ''|*[!0-9]*|0) die "HP_BENCH_${v%%=*}: '${v#*=}': expected a positive integer" ;; esac
done
[ "$steps" -ge 2 ] || die "HP_BENCH_STEPS: '$steps': expected at least 2 (the first is untimed)"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hp-actckpt-bench.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 HP_NUM_THREADS="$threads"

# model NAME LAYERS: a config.json of the bench's proportions
model () {
	mkdir -p "$tmp/$1" || die "cannot create '$tmp/$1'"
	cat >"$tmp/$1/config.json" <<-JSON
	{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
	 "hidden_size": $hidden, "intermediate_size": $((hidden * 3)), "num_hidden_layers": $2,
	 "num_attention_heads": $heads, "num_key_value_heads": 1, "head_dim": $hd,
	 "vocab_size": $vocab, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
	 "rope_theta": 1000000.0, "tie_word_embeddings": false, "attention_bias": false,
	 "num_experts": $experts, "num_experts_per_tok": $topk, "moe_intermediate_size": $moe,
	 "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": true,
	 "output_router_logits": false, "router_aux_loss_coef": 0.001,
	 "hidden_act": "silu", "initializer_range": 0.02, "torch_dtype": "float32"}
	JSON
}
model run "$layers"
model all "$full"
# random ids, one record per step
awk -v V="$vocab" -v n="$steps" -v T="$((seq + 1))" 'BEGIN { srand(11); for (d = 0; d < n; d++) {
	printf "{\"ids\":["; for (i = 0; i < T; i++) printf "%s%d", i ? "," : "", int(rand() * V); print "]}" } }' \
	>"$tmp/ids.jsonl"
"$build/bin/hp-test-tool" mkidx --vocab "$vocab" --records-of $((seq + 1)) -o "$tmp/ids" "$tmp/ids.jsonl" \
	>/dev/null || die "mkidx failed"
# config NAME: the training config on model NAME
config () {
	cat >"$tmp/$1.yaml" <<-YAML
	model: {_target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_config, config_path: $tmp/$1}
	training:
	  train_iters: $steps
	  global_batch_size: 1
	  micro_batch_size: 1
	  seed: 1
	  loss_fn: {_target_: hyper_parallel.ops.ChunkedCausalLMLoss, chunk_size: $chunk}
	checkpoint: {save_ckpt: false}
	dataset:
	  _target_: hyper_parallel.data.build_indexed_text_dataset
	  data_path: $tmp/ids
	  data_config: {seq_length: $seq, is_dataset_from_mr: true}
	plan_overrides:
	  - {match: ["*.input_layernorm", "*.post_attention_layernorm", "model.norm"],
	     replace_module: {_target_: fused_rmsnorm}}
	  - {match: "*.mlp.experts", replace_module: {_target_: grouped_experts}}
	YAML
}
config run
config all
rss=
[ -x /usr/bin/time ] && rss=1

printf '\n%s\n' "Qwen3-30B-A3B proportions at 1/4 width (hidden $hidden, $heads heads of $hd, 1 KV head, $experts experts top-$topk, moe_intermediate $moe, vocab $vocab), seq $seq"
echo "$layers layers trained, $steps steps (the first untimed), $threads thread(s); plan column: all $full layers"
[ "$smoke" = 1 ] && echo "smoke mode: tiny sizes, the numbers are not worth reading and no target is judged"
printf '%-10s %14s %14s %10s %10s %8s %10s %8s\n' mode "act bytes" "plan@$full B" "plan/off" "RSS MB" \
	"step s" "step/off" "loss"
for mode in off selective full; do
	set -- "$build/bin/hp-train" "$tmp/run.yaml" --activation_checkpoint.mode=$mode --metrics "$tmp/$mode.jsonl"
	if [ -n "$rss" ]; then
		/usr/bin/time -f '%M' -o "$tmp/$mode.rss" "$@" >"$tmp/$mode.out" 2>"$tmp/$mode.err" ||
			{ cat "$tmp/$mode.err" >&2; die "hp-train failed with mode $mode"; }
	else
		"$@" >"$tmp/$mode.out" 2>"$tmp/$mode.err" || { cat "$tmp/$mode.err" >&2; die "hp-train failed with mode $mode"; }
	fi
	act=$(sed -n 's/^activations: \([0-9]*\) bytes on the largest rank, as the plan.*/\1/p' "$tmp/$mode.out")
	[ -n "$act" ] || { cat "$tmp/$mode.out" >&2; die "$mode: hp-train's activation bytes are not the plan's estimate"; }
	plan=$("$build/bin/hp-plan" "$tmp/all.yaml" --world 1 --activation_checkpoint.mode=$mode |
		jq '.estimates.per_rank[0].activation_bytes') || die "hp-plan failed for mode $mode"
	step=$(jq -s 'sort_by(.step) | .[1:] | (map(.step_time_s) | add) / length' "$tmp/$mode.jsonl") ||
		die "no timed steps in $mode's metrics"
	loss=$(jq -s -r 'sort_by(.step) | .[-1].loss' "$tmp/$mode.jsonl")
	r=-
	[ -n "$rss" ] && r=$(awk '{ printf "%.0f", $1 / 1024 }' "$tmp/$mode.rss")
	[ "$mode" = off ] && offact=$plan offstep=$step offloss=$loss
	[ "$loss" = "$offloss" ] || die "$mode: final loss $loss, not off's $offloss (recomputation is bit-exact)"
	awk -v m=$mode -v a="$act" -v p="$plan" -v oa="$offact" -v rs="$r" -v s="$step" -v os="$offstep" -v l="$loss" \
		'BEGIN { printf "%-10s %14.0f %14.0f %9.2fx %10s %8.3f %9.2fx %8.4f\n", m, a, p, p / oa, rs, s, s / os, l }'
done
if [ "$smoke" = 1 ]; then
	echo "targets: full >= 3x less activation memory than off, <= 1.4x its step time (not judged in smoke mode)"
else
	echo "targets: full >= 3x less activation memory than off, <= 1.4x its step time"
fi
exit 0
