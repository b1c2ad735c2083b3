#!/bin/sh
# bench/family-bench.sh - training tokens/s of the families hp computes as
# transformers' own model does, at world size 1: hp-train against
# transformers' GptOssForCausalLM, DeepseekV3ForCausalLM and
# Qwen3NextForCausalLM (5.24.0 on
# torch 2.15.0 from PyPI, build/ref-venv; eager attention and the eager
# experts loop, HF's training path on the CPU), same weights (the folder
# transformers saved), same token batches, same threads, in one run.
# GPT-OSS: hidden 256, 4 layers (sliding window 128 on the even ones, full
# on the odd), 8 heads / 2 KV heads of head_dim 32, 8 experts top-2 of
# intermediate 256 with biases, the clamped SwiGLU, vocab 512.
# DeepSeek-V3: hidden 256, 4 layers (the first dense, intermediate 512),
# 8 heads of latent attention (q_lora_rank 128, kv_lora_rank 64, qk 32 +
# 16 RoPE'd, v 32, YaRN), 16 experts top-2 in 4 groups of which 2 are kept,
# intermediate 128, one shared expert, vocab 512.  Qwen3-Next: hidden
# 256, 4 layers (Gated DeltaNet on the first 3, 2 key / 4 value heads of
# 64, conv 4; gated attention on the last, 8 heads / 2 KV heads of 32, RoPE
# on a quarter), 16 experts top-2 of intermediate 128 with a gated shared
# expert of 256, vocab 512.  All: batch 4 x seq 256; 10 steps, the first 2 untimed.  Not a test: each ratio is printed
# against the 1.5x target, and only a failed run makes the exit status
# non-zero.  The venv is made by scripts/ref-venv.sh (about 5.6 GB from
# PyPI); without it the script says so and exits 0.
#
# Smoke mode (HP_BENCH_SMOKE=1; t/t1300 runs it): hidden 64, 2 layers
# (GPT-OSS: a window of 16; Qwen3-Next: one linear, one full), 4 experts
# (DeepSeek-V3: 8 in 2 groups; Qwen3-Next: 8),
# batch 1 x seq 32, 2 steps (the first untimed), 1 thread: the same tables
# in seconds, their numbers not worth reading, no target judged.  Without
# the venv it still runs hp-train (on hp's own random init of the same
# config) and prints "-" for transformers with the reason.
#
# Environment: HP_BUILD_DIR (set by make), HP_BENCH_SMOKE=1, HP_BENCH_STEPS
# (default 10; smoke 2), HP_BENCH_THREADS (default "1 2"; smoke "1"),
# HP_REF_VENV (default build/ref-venv of the source tree).
set -u

die() {
	printf 'family-bench: %s\n' "$*" >&2
	exit 1
}

src=$(cd "$(dirname "$0")/.." && pwd)
. "$src/bench/lib.sh"
build=${HP_BUILD_DIR:-$src/build}
venv=${HP_REF_VENV:-$src/build/ref-venv}
smoke=${HP_BENCH_SMOKE:-0}
if [ "$smoke" = 1 ]; then
	steps=${HP_BENCH_STEPS:-2} threads=${HP_BENCH_THREADS:-1} warmup=1 batch=1 seq=32
	hidden=64 layers=2 heads=4 kv=2 hd=16 experts=4 inter=64 window=16
	q_lora=32 kv_lora=16 nope=8 rope=8 v=8 dexperts=8 groups=2 kept=1 moe=32 dinter=128   # DeepSeek-V3
	lkd=16 shared=64   # Qwen3-Next
else
	steps=${HP_BENCH_STEPS:-10} threads=${HP_BENCH_THREADS:-"1 2"} warmup=2 batch=4 seq=256
	hidden=256 layers=4 heads=8 kv=2 hd=32 experts=8 inter=256 window=128
	q_lora=128 kv_lora=64 nope=32 rope=16 v=32 dexperts=16 groups=4 kept=2 moe=128 dinter=512   # DeepSeek-V3
	lkd=64 shared=256   # Qwen3-Next
fi
for b in hp-train hp-test-tool; do
	[ -x "$build/bin/$b" ] || die "'$build/bin/$b': not built; run make"
done
command -v jq >/dev/null || die "jq not found"
case $steps in ''|*[!0-9]*) die "HP_BENCH_STEPS='$steps': expected an integer above $warmup" ;; esac
[ "$steps" -gt "$warmup" ] || die "HP_BENCH_STEPS='$steps': expected an integer above $warmup"
py= note=
if py=$(sh "$src/scripts/ref-venv.sh" --check "$venv" 2>/dev/null); then :; else
	py=
	[ "$smoke" = 1 ] || { echo "family-bench: no venv at '$venv' (scripts/ref-venv.sh makes it); skipped" >&2; exit 0; }
	note="transformers column skipped: no venv at '$venv' (smoke mode installs nothing; scripts/ref-venv.sh makes it)"
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hp-family-bench.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export PYTHONDONTWRITEBYTECODE=1

# an empty $tmp/model for the next family's config.json
fresh_model () {
	rm -rf "$tmp/model" && mkdir -p "$tmp/model" || die "cannot create '$tmp/model'"
}

# family NAME TITLE: $tmp/model/config.json's model made (and NAME.yaml), then
# its table against transformers under TITLE
family () {
	bench_model "$py" "$src/bench/hf_torch.py" "$tmp/$1.yaml"
	printf '\n%s\n' "$2, batch $batch x seq $seq, $steps steps (first $warmup untimed)"
	bench_against "$py" "$src/bench/hf_torch.py" "$tmp/$1.yaml" "hf tok/s" "transformers"
}

fresh_model
cat >"$tmp/model/config.json" <<JSON
{"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
 "hidden_size": $hidden, "intermediate_size": $inter, "num_hidden_layers": $layers,
 "num_attention_heads": $heads, "num_key_value_heads": $kv, "head_dim": $hd,
 "vocab_size": 512, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
 "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
   "truncate": false, "original_max_position_embeddings": 4096, "rope_theta": 150000.0},
 "sliding_window": $window, "tie_word_embeddings": false, "attention_bias": true,
 "num_local_experts": $experts, "num_experts_per_tok": 2, "swiglu_limit": 7.0,
 "output_router_logits": false, "router_aux_loss_coef": 0.001, "hidden_act": "silu",
 "initializer_range": 0.02, "dtype": "float32", "transformers_version": "5.24.0"}
JSON
family oss "GPT-OSS (hidden $hidden, $layers layers, window $window on even layers, $experts experts top-2, intermediate $inter)"

fresh_model
cat >"$tmp/model/config.json" <<JSON
{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
 "hidden_size": $hidden, "intermediate_size": $dinter, "moe_intermediate_size": $moe,
 "num_hidden_layers": $layers, "first_k_dense_replace": 1, "num_attention_heads": $heads,
 "num_key_value_heads": $heads, "q_lora_rank": $q_lora, "kv_lora_rank": $kv_lora,
 "qk_nope_head_dim": $nope, "qk_rope_head_dim": $rope, "v_head_dim": $v, "head_dim": $rope,
 "rope_interleave": true, "vocab_size": 512, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
 "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
   "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 1024, "rope_theta": 10000.0},
 "n_routed_experts": $dexperts, "num_experts_per_tok": 2, "n_group": $groups, "topk_group": $kept,
 "n_shared_experts": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
 "tie_word_embeddings": false, "attention_bias": false, "output_router_logits": false, "hidden_act": "silu",
 "initializer_range": 0.02, "dtype": "float32", "transformers_version": "5.24.0"}
JSON
family dsk "DeepSeek-V3 (hidden $hidden, $layers layers (1 dense), $heads heads of latent attention q $q_lora / kv $kv_lora, $dexperts experts top-2 in $groups groups ($kept kept), intermediate $moe, 1 shared)"

fresh_model
cat >"$tmp/model/config.json" <<JSON
{"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
 "hidden_size": $hidden, "intermediate_size": $dinter, "num_hidden_layers": $layers,
 "num_attention_heads": $heads, "num_key_value_heads": $kv, "head_dim": $hd,
 "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": $lkd,
 "linear_value_head_dim": $lkd, "linear_conv_kernel_dim": 4, "full_attention_interval": $((layers < 4 ? 2 : 4)),
 "use_cache": false,
 "vocab_size": 512, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
 "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
 "num_experts": $dexperts, "num_experts_per_tok": 2, "moe_intermediate_size": $moe,
 "shared_expert_intermediate_size": $shared, "norm_topk_prob": true, "decoder_sparse_step": 1,
 "tie_word_embeddings": false, "attention_bias": false, "output_router_logits": false, "hidden_act": "silu",
 "initializer_range": 0.02, "dtype": "float32", "transformers_version": "5.24.0"}
JSON
family qn "Qwen3-Next (hidden $hidden, $layers layers ($((layers < 4 ? layers / 2 : layers - layers / 4)) Gated DeltaNet of 2 key / 4 value heads of $lkd), $dexperts experts top-2, intermediate $moe, shared $shared)"
exit 0
