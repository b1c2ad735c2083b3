/*
 * adamw.cu - one AdamW step on fp32 weights, then, when the caller keeps
 * one (wb not NULL), their bf16 working copy.  The arithmetic is
 * kernels/cpu/adamw.c's line for line (torch's rounding: two fmas, a
 * correctly rounded sqrt and divisions); the explicit _rn intrinsics keep
 * nvcc from contracting or approximating any of it, so the GPU's weights
 * are the CPU's bit for bit.
 */
#include <math.h>

#include "cuda/common.cuh"

static __global__ void adamw_kernel(float *w, hp_bf16 *wb, const float *g, float *m, float *v, size_t n,
				    float keep, int decay, float b1, float b2, float ob1, float ob2,
				    float bc2_sqrt, float eps, float neg_step, const float *cg)
{
	if (cg && cg[1] == 0.0f)   /* a non-finite step: the weights stay the last good step's */
		return;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		float gi = g[i], wi = w[i];
		if (decay)
			wi = __fmul_rn(wi, keep);
		float mi = __fmaf_rn(gi, ob1, __fmul_rn(m[i], b1));
		float vi = __fmaf_rn(__fmul_rn(ob2, gi), gi, __fmul_rn(v[i], b2));
		float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
		wi = __fadd_rn(wi, __fdiv_rn(__fmul_rn(neg_step, mi), denom));
		m[i] = mi;
		v[i] = vi;
		w[i] = wi;
		if (wb)
			wb[i] = f2bf(wi);
	}
}

extern "C" void hp_cuda_adamw(float *w, hp_bf16 *wb, const float *g, float *m, float *v, size_t n,
			      double lr, double beta1, double beta2, double eps, double weight_decay,
			      long step, int decay, const float *cg)
{
	/* the scalars exactly as hp_adamw_step computes them */
	double bc1 = 1.0 - pow(beta1, (double)step);
	double bc2 = 1.0 - pow(beta2, (double)step);
	float neg_step = (float)-(lr / bc1);
	float bc2_sqrt = (float)sqrt(bc2);
	float keep = decay ? (float)(1.0 - lr * weight_decay) : 1.0f;

	if (n == 0)
		return;
	adamw_kernel<<<hp_cu_blocks(n, 256), 256, 0, hp_cu_stream>>>(w, wb, g, m, v, n, keep, decay,
		(float)beta1, (float)beta2, (float)(1.0 - beta1), (float)(1.0 - beta2), bc2_sqrt, (float)eps, neg_step,
		cg);
}

/* hp_clip_factor and hp_clip_gate (kernels/cpu/adamw.c), every operation
 * correctly rounded as the host's */
static __device__ float clip_factor(double ss, double max_norm)
{
	float coef = 1.0f;

	if (max_norm > 0) {
		coef = __double2float_rn(__ddiv_rn(max_norm, __dadd_rn(__dsqrt_rn(ss), 1e-6)));
		if (coef >= 1.0f)
			coef = 1.0f;
	}
	return coef;
}

/* Every block works the factor out for itself (a few operations on one
 * double), scales its part of g, and block 0 writes cg for AdamW, which
 * runs after it on the stream: one launch for both. */
static __global__ void clip_gate_kernel(float *g, size_t n, float *cg, const double *ss, const double *loss,
					const double *aux, const int32_t *bad, double max_norm, int check)
{
	float coef = clip_factor(*ss, max_norm);

	if (blockIdx.x == 0 && threadIdx.x == 0) {
		double norm = __dsqrt_rn(*ss);

		cg[0] = coef;
		cg[1] = *bad || (check && !(isfinite(*loss) && isfinite(*aux) && isfinite(norm))) ? 0.0f : 1.0f;
	}
	if (coef == 1.0f)
		return;
	HP_CU_GRID_STRIDE(i, n)
		g[i] = __fmul_rn(g[i], coef);
}

extern "C" void hp_cuda_clip_gate(float *g, size_t n, float *cg, const double *ss, const double *loss,
				  const double *aux, const int32_t *bad, double max_norm, int check)
{
	clip_gate_kernel<<<n ? hp_cu_blocks(n, 256) : 1, 256, 0, hp_cu_stream>>>(g, n, cg, ss, loss, aux, bad, max_norm,
										   check);
}
