/*
 * attnsmall.cu - causal GQA attention for the head dims the tensor-core
 * flash kernels (flashattn.cu: 64 and 128) do not cover, up to 256: the
 * small models the tests train.  Same semantics as hp_cuda_flash_fwd/bwd
 * (kernels/cuda/ops.h), one thread per query row (forward, dQ) or key row
 * (dK, dV) with an online softmax in fp32, no atomics: correct and
 * deterministic, not fast.  A query row whose lse is +inf (one a caller
 * pads) is skipped outright in the backward, not multiplied by a zero
 * probability, so that nothing its q, out or dout hold can make a NaN.
 */
#include "cuda/common.cuh"
#include "cuda/attn.cuh"

#define AS_MAXD HP_CUDA_ATTN_MAX_HEAD_DIM

/* the first key query i of row b may see (its document's start) */
static __device__ __forceinline__ int as_lo(const int32_t *seg, int b, int T, int i)
{
	return seg ? seg[(long)b * T + i] : 0;
}

/* one thread per (b, h, i) */
static __global__ void as_fwd(hp_bf16 *out, float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
			      const int32_t *seg, int B, int T, int Hq, int Hkv, int D, float scale)
{
	long rows = (long)B * Hq * T;

	for (long r = blockIdx.x * (long)blockDim.x + threadIdx.x; r < rows; r += (long)gridDim.x * blockDim.x) {
		int i = (int)(r % T), h = (int)(r / T % Hq), b = (int)(r / ((long)T * Hq));
		int kh = h / (Hq / Hkv);
		const hp_bf16 *qi = q + ((long)b * T + i) * Hq * D + (long)h * D;
		float acc[AS_MAXD], m = -INFINITY, l = 0;

		for (int d = 0; d < D; d++)
			acc[d] = 0;
		for (int j = as_lo(seg, b, T, i); j <= i; j++) {
			const hp_bf16 *kj = k + ((long)b * T + j) * Hkv * D + (long)kh * D;
			const hp_bf16 *vj = v + ((long)b * T + j) * Hkv * D + (long)kh * D;
			float s = 0;
			for (int d = 0; d < D; d++)
				s += bf2f(qi[d]) * bf2f(kj[d]);
			s *= scale;
			float mn = fmaxf(m, s), c = expf(m - mn), p = expf(s - mn);
			l = l * c + p;
			for (int d = 0; d < D; d++)
				acc[d] = acc[d] * c + p * bf2f(vj[d]);
			m = mn;
		}
		hp_bf16 *o = out + ((long)b * T + i) * Hq * D + (long)h * D;
		for (int d = 0; d < D; d++)
			o[d] = f2bf(l > 0 ? acc[d] / l : 0.0f);
		lse[r] = l > 0 ? m + logf(l) : -INFINITY;
	}
}

/* Di = rowsum(dout * out) into scratch [B, Hq, T]; then dQ, one thread per query row */
static __global__ void as_bwd_dq(hp_bf16 *dq, float *Di, const hp_bf16 *dout, const hp_bf16 *out,
				 const float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
				 const int32_t *seg, int B, int T, int Hq, int Hkv, int D, float scale)
{
	long rows = (long)B * Hq * T;

	for (long r = blockIdx.x * (long)blockDim.x + threadIdx.x; r < rows; r += (long)gridDim.x * blockDim.x) {
		int i = (int)(r % T), h = (int)(r / T % Hq), b = (int)(r / ((long)T * Hq));
		int kh = h / (Hq / Hkv);
		long at = ((long)b * T + i) * Hq * D + (long)h * D;
		float acc[AS_MAXD], di = 0;

		for (int d = 0; d < D; d++) {
			di += bf2f(dout[at + d]) * bf2f(out[at + d]);
			acc[d] = 0;
		}
		Di[r] = di;
		for (int j = as_lo(seg, b, T, i); j <= i && lse[r] != INFINITY; j++) {
			long kj = ((long)b * T + j) * Hkv * D + (long)kh * D;
			float s = 0, dp = 0;
			for (int d = 0; d < D; d++) {
				s += bf2f(q[at + d]) * bf2f(k[kj + d]);
				dp += bf2f(dout[at + d]) * bf2f(v[kj + d]);
			}
			float ds = expf(s * scale - lse[r]) * (dp - di) * scale;
			for (int d = 0; d < D; d++)
				acc[d] += ds * bf2f(k[kj + d]);
		}
		for (int d = 0; d < D; d++)
			dq[at + d] = f2bf(acc[d]);
	}
}

/* dK, dV: one thread per (b, kv head, key j), over the query heads of its
 * group and the queries that see j, in a fixed order */
static __global__ void as_bwd_dkdv(hp_bf16 *dk, hp_bf16 *dv, const float *Di, const hp_bf16 *dout,
				   const float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
				   const int32_t *seg, int B, int T, int Hq, int Hkv, int D, float scale)
{
	long rows = (long)B * Hkv * T;
	int G = Hq / Hkv;

	for (long r = blockIdx.x * (long)blockDim.x + threadIdx.x; r < rows; r += (long)gridDim.x * blockDim.x) {
		int j = (int)(r % T), kh = (int)(r / T % Hkv), b = (int)(r / ((long)T * Hkv));
		long kj = ((long)b * T + j) * Hkv * D + (long)kh * D;
		float ak[AS_MAXD], av[AS_MAXD];

		for (int d = 0; d < D; d++)
			ak[d] = av[d] = 0;
		for (int h = kh * G; h < (kh + 1) * G; h++)
			for (int i = j; i < T; i++) {
				long at = ((long)b * T + i) * Hq * D + (long)h * D, ri = ((long)b * Hq + h) * T + i;
				if (as_lo(seg, b, T, i) > j || lse[ri] == INFINITY)
					continue;
				float s = 0, dp = 0;
				for (int d = 0; d < D; d++) {
					s += bf2f(q[at + d]) * bf2f(k[kj + d]);
					dp += bf2f(dout[at + d]) * bf2f(v[kj + d]);
				}
				float p = expf(s * scale - lse[ri]), ds = p * (dp - Di[ri]) * scale;
				for (int d = 0; d < D; d++) {
					ak[d] += ds * bf2f(q[at + d]);
					av[d] += p * bf2f(dout[at + d]);
				}
			}
		for (int d = 0; d < D; d++) {
			dk[kj + d] = f2bf(ak[d]);
			dv[kj + d] = f2bf(av[d]);
		}
	}
}

extern "C" int hp_cu_attn_small_supports(int D)
{
	return D >= 1 && D <= AS_MAXD;
}

extern "C" void hp_cu_attn_small_fwd(hp_bf16 *out, float *lse, const hp_bf16 *q, const hp_bf16 *k,
				     const hp_bf16 *v, const int32_t *seg, int B, int T, int Hq, int Hkv, int D)
{
	long rows = (long)B * Hq * T;

	as_fwd<<<hp_cu_blocks((size_t)rows, 128), 128, 0, hp_cu_stream>>>(out, lse, q, k, v, seg, B, T, Hq, Hkv, D,
									   1.0f / sqrtf((float)D));
}

extern "C" void hp_cu_attn_small_bwd(hp_bf16 *dq, hp_bf16 *dk, hp_bf16 *dv, const hp_bf16 *dout,
				     const hp_bf16 *out, const float *lse, const hp_bf16 *q, const hp_bf16 *k,
				     const hp_bf16 *v, const int32_t *seg, float *scratch, int B, int T, int Hq,
				     int Hkv, int D)
{
	long rq = (long)B * Hq * T, rk = (long)B * Hkv * T;
	float scale = 1.0f / sqrtf((float)D);

	/* dQ's kernel writes Di, which dK/dV's reads: the stream orders them */
	as_bwd_dq<<<hp_cu_blocks((size_t)rq, 128), 128, 0, hp_cu_stream>>>(dq, scratch, dout, out, lse, q, k, v,
									    seg, B, T, Hq, Hkv, D, scale);
	as_bwd_dkdv<<<hp_cu_blocks((size_t)rk, 128), 128, 0, hp_cu_stream>>>(dk, dv, scratch, dout, lse, q, k, v,
									      seg, B, T, Hq, Hkv, D, scale);
}
