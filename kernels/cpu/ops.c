/*
 * ops.c - the CPU op tables and the choice between them.
 *
 * "reference": plain C loops that follow HF transformers' modeling code.
 * "blas": OpenBLAS sgemm for the matrix products, causal-staircase
 * attention, and vector-extension element-wise kernels cloned for x86-64
 * and x86-64-v3.  HP_KERNELS=reference selects the first at start-up.
 */
#include "cpu/ops.h"

const struct hp_cpu_ops hp_cpu_ops_reference = {
	.name = "reference",
	.linear_fwd = hp_linear_fwd_ref,
	.linear_bwd = hp_linear_bwd_ref,
	.attention_fwd = hp_attention_fwd_ref,
	.attention_bwd = hp_attention_bwd_ref,
	.swiglu_fwd = hp_swiglu_fwd,
	.swiglu_bwd = hp_swiglu_bwd,
	.cross_entropy_fwd = hp_cross_entropy_fwd,
	.cross_entropy_bwd = hp_cross_entropy_bwd,
};

const struct hp_cpu_ops hp_cpu_ops_blas = {
	.name = "blas",   /* hp_sgemm (AVX-512 or OpenBLAS) + vector kernels */
	.linear_fwd = hp_linear_fwd_blas,
	.linear_bwd = hp_linear_bwd_blas,
	.attention_fwd = hp_attention_fwd_blas,
	.attention_bwd = hp_attention_bwd_blas,
	.swiglu_fwd = hp_swiglu_fwd_vec,
	.swiglu_bwd = hp_swiglu_bwd_vec,
	.cross_entropy_fwd = hp_cross_entropy_fwd_vec,
	.cross_entropy_bwd = hp_cross_entropy_bwd_vec,
};

const struct hp_cpu_ops *hp_cpu_ops_get(void)
{
	const char *s = getenv("HP_KERNELS");

	if (s && !strcmp(s, "reference"))
		return &hp_cpu_ops_reference;
	return &hp_cpu_ops_blas;
}
