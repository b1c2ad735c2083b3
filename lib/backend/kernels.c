/*
 * kernels.c - what hp-train --list-kernels prints (see kernels.h).
 *
 * "reference": plain C following HF's modeling code (HP_KERNELS=reference
 * runs only these); "default": what a run uses unless told otherwise;
 * "substitute": bound per module by plan_overrides (or training.loss_fn);
 * "built": compiled and linked, run only where the device is; "planned":
 * named by the plan, not implemented yet, and refused or replaced as said.
 */
#include "backend/kernels.h"

const struct hp_kernel_info hp_kernel_list[] = {
	{ "embedding", "cpu", "reference", "default", "always" },
	{ "linear", "cpu", "reference", "reference", "HP_KERNELS=reference" },
	{ "linear", "cpu", "blas", "default", "hp's AVX-512 SGEMM, else OpenBLAS" },
	{ "attention", "cpu", "reference", "reference", "HP_KERNELS=reference" },
	{ "attention", "cpu", "blas", "default", "HF's eager algorithm: saves P [B, heads, T, T]" },
	{ "attention", "cpu", "flash_attention", "substitute",
	  "plan_overrides: flash_attention, replace_qwen3_moe_flash_attention" },
	{ "attention", "cpu", "ulysses_attention", "substitute",
	  "plan_overrides: ulysses_attention (all-to-all CP lands with parallel training; flash at cp 1)" },
	{ "rmsnorm", "cpu", "reference", "default", "no override" },
	{ "rmsnorm", "cpu", "fused_rmsnorm", "substitute",
	  "plan_overrides: fused_rmsnorm, replace_qwen3_moe_rms_norm (residual add fused, AVX2)" },
	{ "rope", "cpu", "reference", "default", "always" },
	{ "swiglu", "cpu", "reference", "reference", "HP_KERNELS=reference" },
	{ "swiglu", "cpu", "vec", "default", "vector extensions, AVX2 clone" },
	{ "experts", "cpu", "reference", "default", "HF's loop: a GEMM per expert and projection" },
	{ "experts", "cpu", "grouped_experts", "substitute",
	  "plan_overrides: grouped_experts, replace_qwen3_moe_grouped_experts" },
	{ "router", "cpu", "reference", "default", "always" },
	{ "cross_entropy", "cpu", "reference", "reference", "HP_KERNELS=reference" },
	{ "cross_entropy", "cpu", "vec", "default", "vector extensions, AVX2 clone" },
	{ "lm_head", "cpu", "chunked_ce", "substitute",
	  "training.loss_fn: {_target_: ChunkedCausalLMLoss, chunk_size: N}" },
	{ "cross_entropy", "cpu", "vocab_parallel", "substitute",
	  "accelerator.loss_parallel at tp > 1: the logits never gathered" },
	{ "adamw", "cpu", "reference", "default", "scalar, or AVX2+FMA with the same bits" },
	/* training.device: cuda (lib/backend/backend_cuda.c over kernels/cuda; HP_CUDA_EMULATE: its host emulation) */
	{ "embedding", "cuda", "embedding", "built", "training.device: cuda" },
	{ "rmsnorm", "cuda", "rmsnorm", "built", "training.device: cuda (fused_rmsnorm: the add, then the norm)" },
	{ "rope", "cuda", "rope", "built", "training.device: cuda" },
	{ "linear", "cuda", "cublaslt", "built", "training.device: cuda (bf16 operands, fp32 out)" },
	{ "attention", "cuda", "flash_attention", "built", "training.device: cuda, every layer, head_dim 64 or 128" },
	{ "attention", "cuda", "attn_small", "built", "training.device: cuda, every layer, other head_dim up to 256" },
	{ "swiglu", "cuda", "swiglu", "built", "training.device: cuda" },
	{ "router", "cuda", "router_topk", "built", "training.device: cuda" },
	{ "experts", "cuda", "cublaslt", "built", "training.device: cuda (grouped_experts: gate|up as one product)" },
	{ "cross_entropy", "cuda", "cross_entropy", "built", "training.device: cuda (vocab_parallel with loss_parallel)" },
	{ "lm_head", "cuda", "chunked_ce", "built", "training.device: cuda, training.loss_fn: ChunkedCausalLMLoss" },
	{ "adamw", "cuda", "adamw", "built", "training.device: cuda" },
};

const int hp_nkernel_list = (int)(sizeof(hp_kernel_list) / sizeof(hp_kernel_list[0]));

void hp_kernels_print(FILE *f)
{
	fprintf(f, "%-14s %-8s %-18s %-11s %s\n", "op", "backend", "kernel", "status", "selected by");
	for (int i = 0; i < hp_nkernel_list; i++) {
		const struct hp_kernel_info *k = &hp_kernel_list[i];

		fprintf(f, "%-14s %-8s %-18s %-11s %s\n", k->op, k->backend, k->name, k->status, k->how);
	}
}
