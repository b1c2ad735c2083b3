/*
 * kernels.c - the kernel registry (see kernels.h): one row per (op,
 * backend, variant), in the order hp-train --list-kernels prints them and
 * hp-kernels(7) describes them.
 *
 * status: "reference": plain C following HF's modeling code
 * (HP_KERNELS=reference runs only these); "default": what a run uses unless
 * told otherwise; "substitute": bound per module by plan_overrides (or
 * training.loss_fn); "built": compiled and linked, run only where the
 * device is; "planned": named by the plan, not implemented yet, and refused
 * or replaced as said.
 *
 * A new variant is its kernel file, its row here (with its functions, so
 * that t/unit/test-kernels.c compares it with the reference) and its entry
 * in man/hp-kernels.7; a row that plan_overrides binds also needs the
 * model to run it (struct hp_model_kernels).
 */
#include <string.h>

#include "backend/kernels.h"

/* HyperParallel's factory of a Qwen3-MoE replacement, both spellings of its
 * module path (newer HyperParallel files use the second) */
#define HYPER_ALIASES(f) { "hyper_parallel.models.qwen3_moe.adapter.replacements." f, \
			   "hyper_parallel.models.qwen3_moe.adapter.conversion.module_replacement." f }
/* ... and HyperParallel's DeepSeek-V3 adapter's factory of the same job */
#define HYPER_ALIASES_DSV3(f, g) { "hyper_parallel.models.qwen3_moe.adapter.replacements." f, \
			   "hyper_parallel.models.qwen3_moe.adapter.conversion.module_replacement." f, \
			   "hyper_parallel.models.deepseek_v3.adapter.replacements." g }

/* flash attention keeps its tiles on the stack: head_dim up to
 * HP_FLASH_ATTENTION_MAX_HEAD_DIM (kernels/cpu/flashattn.c) */
static int flash_supports(const struct hp_kernel_site *s, char *why, size_t n)
{
	if (hp_flash_attention_supports(s->head_dim))
		return 1;
	snprintf(why, n, "flash_attention takes head_dim up to %d, the model has %d; leave its attention "
		 "on the reference", HP_FLASH_ATTENTION_MAX_HEAD_DIM, s->head_dim);
	return 0;
}

/* the grouped GEMMs run a layer's routed experts, so only an MoE layer's */
static int moe_supports(const struct hp_kernel_site *s, char *why, size_t n)
{
	if (s->moe)
		return 1;
	snprintf(why, n, "it is not in an MoE layer");
	return 0;
}

/* the columns of --list-kernels */
#define ROW(o, b, n, s, h) .op = o, .backend = b, .name = n, .status = s, .how = h
#define EMBEDDING(f, b) .cpu = { .embedding_fwd = f, .embedding_bwd = b }
#define LINEAR(f, b) .cpu = { .linear_fwd = f, .linear_bwd = b }
#define ATTENTION(f, b) .cpu = { .attention_fwd = f, .attention_bwd = b }
#define FLASH(f, b) .cpu = { .flash_fwd = f, .flash_bwd = b }
#define SWIGLU(f, b) .cpu = { .swiglu_fwd = f, .swiglu_bwd = b }
#define CROSS_ENTROPY(f, b) .cpu = { .cross_entropy_fwd = f, .cross_entropy_bwd = b }

const struct hp_kernel hp_kernels[] = {
	{ ROW("embedding", "cpu", "reference", "default", "always"),
	  EMBEDDING(hp_embedding_fwd, hp_embedding_bwd) },
	{ ROW("linear", "cpu", "reference", "reference", "HP_KERNELS=reference"),
	  LINEAR(hp_linear_fwd_ref, hp_linear_bwd_ref) },
	{ ROW("linear", "cpu", "blas", "default", "hp's AVX-512 SGEMM, else OpenBLAS"),
	  LINEAR(hp_linear_fwd_blas, hp_linear_bwd_blas) },
	{ ROW("rmsnorm", "cpu", "reference", "default", "no override"),
	  .cpu = { .rmsnorm_fwd = hp_rmsnorm_fwd, .rmsnorm_bwd = hp_rmsnorm_bwd } },
	{ ROW("rmsnorm", "cpu", "fused_rmsnorm", "substitute",
	  "plan_overrides: fused_rmsnorm, replace_qwen3_moe_rms_norm (residual add fused, AVX2)"),
	  .overridable = 1, .alias = HYPER_ALIASES("replace_qwen3_moe_rms_norm"),
	  .cpu = { .rmsnorm_res_fwd = hp_rmsnorm_res_fwd, .rmsnorm_bwd = hp_rmsnorm_bwd_vec } },
	{ ROW("attention", "cpu", "reference", "reference", "HP_KERNELS=reference"),
	  ATTENTION(hp_attention_fwd_ref, hp_attention_bwd_ref) },
	{ ROW("attention", "cpu", "blas", "default", "HF's eager algorithm: saves P [B, heads, T, T]"),
	  ATTENTION(hp_attention_fwd_blas, hp_attention_bwd_blas) },
	{ ROW("attention", "cpu", "flash_attention", "substitute",
	  "plan_overrides: flash_attention, replace_qwen3_moe_flash_attention"),
	  .overridable = 1, .alias = HYPER_ALIASES("replace_qwen3_moe_flash_attention"),
	  .supports = flash_supports, FLASH(hp_flash_attention_fwd, hp_flash_attention_bwd) },
	/* hp's own: context parallel by all-to-all of heads (DeepSpeed-Ulysses);
	 * each rank's heads then run the flash kernel */
	{ ROW("attention", "cpu", "ulysses_attention", "substitute",
	  "plan_overrides: ulysses_attention (CP by all-to-all of heads; flash at cp 1)"),
	  .overridable = 1, .supports = flash_supports, FLASH(hp_flash_attention_fwd, hp_flash_attention_bwd) },
	{ ROW("rope", "cpu", "reference", "default", "always"),
	  .cpu = { .rope_fwd = hp_rope_fwd, .rope_bwd = hp_rope_bwd } },
	{ ROW("swiglu", "cpu", "reference", "reference", "HP_KERNELS=reference"),
	  SWIGLU(hp_swiglu_fwd, hp_swiglu_bwd) },
	{ ROW("swiglu", "cpu", "vec", "default", "vector extensions, AVX2 clone"),
	  SWIGLU(hp_swiglu_fwd_vec, hp_swiglu_bwd_vec) },
	/* the experts are the model's composition of linears and SwiGLU: no
	 * function of their own (t/t0800 trains both against each other) */
	{ ROW("experts", "cpu", "reference", "default", "HF's loop: a GEMM per expert and projection") },
	{ ROW("experts", "cpu", "grouped_experts", "substitute",
	  "plan_overrides: grouped_experts, replace_qwen3_moe_grouped_experts, replace_grouped_experts"),
	  .overridable = 1, .alias = HYPER_ALIASES_DSV3("replace_qwen3_moe_grouped_experts", "replace_grouped_experts"),
	  .supports = moe_supports },
	{ ROW("router", "cpu", "reference", "default", "always"),
	  .cpu = { .router_fwd = hp_router_topk, .router_bwd = hp_router_bwd } },
	/* DeepSeek-V3's latent attention: the RoPE'd key part every head
	 * shares, copied to each and its gradient summed back (the rest of
	 * MLA is the op table's linear, rmsnorm, rope and attention; t0230
	 * holds it to transformers) */
	{ ROW("latent_key", "cpu", "reference", "default",
	  "DeepSeek-V3 MLA: k_rope to every head (bcast_heads), its gradient summed (sum_heads)") },
	/* DeepSeek-V3's: the only implementation, held to DeepseekV3TopkRouter
	 * by t/unit/test-router-group.c */
	{ ROW("router_group", "cpu", "reference", "default",
	  "DeepSeek-V3 gate: sigmoid, groups, top-k, e_score_correction_bias") },
	/* GPT-OSS's: the only implementation of each, held to HF's definition
	 * by t/unit/test-oss.c (the sinks through the flash kernel) */
	{ ROW("attention_sinks", "cpu", "reference", "default", "GPT-OSS self_attn.sinks: on flash attention's out and lse") },
	{ ROW("clamped_swiglu", "cpu", "reference", "default", "GPT-OSS experts: (clamp(up) + 1) * glu(min(gate, limit))") },
	{ ROW("expert_bias", "cpu", "reference", "default", "GPT-OSS experts' biases, on rows grouped by expert") },
	/* Qwen3-Next's and Qwen3.5's: the only implementation of each, held
	 * to a token-by-token reference by t/unit/test-deltanet.c and
	 * test-gdn.c, and to transformers by t/t0230 */
	{ ROW("gated_deltanet", "cpu", "chunked", "default",
	  "Qwen3-Next/Qwen3.5 linear_attn: the gated delta rule in chunks of 64, documents apart") },
	{ ROW("causal_conv1d", "cpu", "reference", "default", "linear_attn.conv1d: causal depthwise conv and SiLU") },
	{ ROW("rmsnorm_gated", "cpu", "reference", "default", "linear_attn.norm: RMSNorm times SiLU(z)") },
	{ ROW("sigmoid_gate", "cpu", "reference", "default",
	  "gated attention's output gate; the shared expert's shared_expert_gate") },
	{ ROW("cross_entropy", "cpu", "reference", "reference", "HP_KERNELS=reference"),
	  CROSS_ENTROPY(hp_cross_entropy_fwd, hp_cross_entropy_bwd) },
	{ ROW("cross_entropy", "cpu", "vec", "default", "vector extensions, AVX2 clone"),
	  CROSS_ENTROPY(hp_cross_entropy_fwd_vec, hp_cross_entropy_bwd_vec) },
	/* bound by the config's loss settings, not plan_overrides; both are the
	 * model's composition (t/unit/test-kernels.c and t/t0800 test them) */
	{ ROW("lm_head", "cpu", "chunked_ce", "substitute",
	  "training.loss_fn: {_target_: ChunkedCausalLMLoss, chunk_size: N}") },
	{ ROW("cross_entropy", "cpu", "vocab_parallel", "substitute",
	  "accelerator.loss_parallel at tp > 1: the logits never gathered") },
	{ ROW("adamw", "cpu", "reference", "default", "scalar, or AVX2+FMA with the same bits"),
	  .cpu = { .adamw = hp_adamw_step } },
	/* training.device: cuda (lib/backend/backend_cuda.c over kernels/cuda;
	 * HP_CUDA_EMULATE: its host emulation) */
	{ ROW("embedding", "cuda", "embedding", "built", "training.device: cuda"),
	  .cuda = "hp_cuda_embedding_fwd hp_cuda_embedding_bwd" },
	{ ROW("rmsnorm", "cuda", "rmsnorm", "built", "training.device: cuda (fused_rmsnorm: the add, then the norm)"),
	  .cuda = "hp_cuda_rmsnorm_fwd hp_cuda_rmsnorm_bwd hp_cuda_add" },
	{ ROW("rope", "cuda", "rope", "built", "training.device: cuda"),
	  .cuda = "hp_cuda_rope_fwd hp_cuda_rope_bwd" },
	{ ROW("linear", "cuda", "cublaslt", "built", "training.device: cuda (bf16 operands, fp32 out)"),
	  .cuda = "hp_cuda_linear_fwd hp_cuda_linear_bwd" },
	{ ROW("attention", "cuda", "flash_attention", "built", "training.device: cuda, every layer, head_dim 64 or 128"),
	  .cuda = "hp_cuda_flash_supports hp_cuda_flash_fwd hp_cuda_flash_bwd hp_cuda_flash_scratch" },
	{ ROW("attention", "cuda", "attn_small", "built", "training.device: cuda, every layer, other head_dim up to 256"),
	  .cuda = "hp_cuda_flash_supports hp_cuda_flash_fwd hp_cuda_flash_bwd hp_cuda_flash_scratch" },
	{ ROW("swiglu", "cuda", "swiglu", "built", "training.device: cuda"),
	  .cuda = "hp_cuda_swiglu_fwd hp_cuda_swiglu_bwd hp_cuda_swiglu_rows_fwd hp_cuda_swiglu_rows_bwd" },
	{ ROW("router", "cuda", "router_topk", "built", "training.device: cuda"),
	  .cuda = "hp_cuda_router_topk hp_cuda_router_bwd" },
	{ ROW("latent_key", "cuda", "latent_key", "built", "training.device: cuda, DeepSeek-V3"),
	  .cuda = "hp_cuda_heads_bcast hp_cuda_heads_sum" },
	{ ROW("router_group", "cuda", "router_group", "built", "training.device: cuda, DeepSeek-V3"),
	  .cuda = "hp_cuda_router_group_fwd hp_cuda_router_group_bwd" },
	{ ROW("experts", "cuda", "cublaslt", "built", "training.device: cuda (grouped_experts: gate|up as one product)"),
	  .cuda = "hp_cuda_linear_fwd hp_cuda_linear_bwd hp_cuda_gather_rows hp_cuda_combine hp_cuda_combine_bwd" },
	{ ROW("attention_sinks", "cuda", "attention_sinks", "built", "training.device: cuda, GPT-OSS"),
	  .cuda = "hp_cuda_sinks_fwd hp_cuda_sinks_bwd" },
	{ ROW("clamped_swiglu", "cuda", "clamped_swiglu", "built", "training.device: cuda, GPT-OSS"),
	  .cuda = "hp_cuda_glu_clamp_fwd hp_cuda_glu_clamp_bwd" },
	{ ROW("expert_bias", "cuda", "expert_bias", "built", "training.device: cuda, GPT-OSS"),
	  .cuda = "hp_cuda_bias_grouped_fwd hp_cuda_bias_grouped_bwd" },
	{ ROW("gated_deltanet", "cuda", "chunked", "built", "training.device: cuda, Qwen3-Next/Qwen3.5"),
	  .cuda = "hp_cuda_gdr_fwd hp_cuda_gdr_bwd hp_cuda_l2norm_fwd hp_cuda_l2norm_bwd hp_cuda_gdn_gates_fwd "
		  "hp_cuda_gdn_gates_bwd" },
	{ ROW("causal_conv1d", "cuda", "causal_conv1d", "built", "training.device: cuda, Qwen3-Next/Qwen3.5"),
	  .cuda = "hp_cuda_conv1d_silu_fwd hp_cuda_conv1d_silu_bwd" },
	{ ROW("rmsnorm_gated", "cuda", "rmsnorm_gated", "built", "training.device: cuda, Qwen3-Next/Qwen3.5"),
	  .cuda = "hp_cuda_rmsnorm_gated_fwd hp_cuda_rmsnorm_gated_bwd" },
	{ ROW("sigmoid_gate", "cuda", "sigmoid_gate", "built", "training.device: cuda, Qwen3-Next/Qwen3.5"),
	  .cuda = "hp_cuda_sigmoid_gate_fwd hp_cuda_sigmoid_gate_bwd hp_cuda_sigmoid_gate_rows_fwd "
		  "hp_cuda_sigmoid_gate_rows_bwd" },
	{ ROW("cross_entropy", "cuda", "cross_entropy", "built",
	  "training.device: cuda (vocab_parallel with loss_parallel)"),
	  .cuda = "hp_cuda_ce_loss hp_cuda_ce_bwd hp_cuda_vp_ce_max hp_cuda_vp_ce_sums hp_cuda_vp_ce_bwd" },
	{ ROW("lm_head", "cuda", "chunked_ce", "built", "training.device: cuda, training.loss_fn: ChunkedCausalLMLoss"),
	  .cuda = "hp_cuda_linear_fwd hp_cuda_linear_bwd hp_cuda_ce_loss hp_cuda_ce_bwd" },
	{ ROW("adamw", "cuda", "adamw", "built", "training.device: cuda"),
	  .cuda = "hp_cuda_adamw" },
};

const int hp_nkernels = (int)(sizeof(hp_kernels) / sizeof(hp_kernels[0]));

const struct hp_kernel *hp_kernel_find_target(const char *target)
{
	for (int i = 0; i < hp_nkernels; i++) {
		const struct hp_kernel *k = &hp_kernels[i];

		if (!k->overridable)
			continue;
		if (!strcmp(target, k->name))
			return k;
		for (int a = 0; a < HP_KERNEL_ALIASES; a++)
			if (k->alias[a] && !strcmp(target, k->alias[a]))
				return k;
	}
	return NULL;
}

const struct hp_kernel *hp_kernel_find(const char *op, const char *backend, const char *name)
{
	for (int i = 0; i < hp_nkernels; i++)
		if (!strcmp(hp_kernels[i].op, op) && !strcmp(hp_kernels[i].backend, backend) &&
		    !strcmp(hp_kernels[i].name, name))
			return &hp_kernels[i];
	return NULL;
}

void hp_kernel_targets(char *buf, size_t n)
{
	size_t at = 0;

	if (n)
		buf[0] = '\0';
	for (int i = 0; i < hp_nkernels; i++) {
		const struct hp_kernel *k = &hp_kernels[i];

		for (int a = -1; k->overridable && a < HP_KERNEL_ALIASES; a++)
			if (a < 0 || k->alias[a])
				at += (size_t)snprintf(at < n ? buf + at : NULL, at < n ? n - at : 0, "%s%s",
						       at ? ", " : "",
						       a < 0 ? k->name : k->alias[a]);
	}
}

void hp_kernels_print(FILE *f)
{
	fprintf(f, "%-14s %-8s %-18s %-11s %s\n", "op", "backend", "kernel", "status", "selected by");
	for (int i = 0; i < hp_nkernels; i++) {
		const struct hp_kernel *k = &hp_kernels[i];

		fprintf(f, "%-14s %-8s %-18s %-11s %s\n", k->op, k->backend, k->name, k->status, k->how);
	}
}
