/*
 * ce.cu - cross-entropy on fp32 logits with its gradient in the same call:
 * one block per row, two passes over the row (an online max and sum of
 * exponentials, then the bf16 gradient), the same algebra as
 * kernels/cpu/crossentropy.c with fp32 sums.
 */
#include "cuda/common.cuh"

static __global__ void ce_kernel(float *loss, hp_bf16 *dl, const float *logits, const int32_t *targets,
				 long n, int V, float scale)
{
	__shared__ float sh[32];

	for (long r = blockIdx.x; r < n; r += gridDim.x) {
		const float *l = logits + r * V;
		hp_bf16 *d = dl + r * V;
		int t = targets[r];

		/* t is the same for the whole block: no divergent __syncthreads */
		if (t < 0 || t >= V) {
			for (int v = threadIdx.x; v < V; v += blockDim.x)
				d[v] = 0;
			if (threadIdx.x == 0)
				loss[r] = t == -100 ? 0.0f : NAN;   /* -100 ignored; NaN: a bad target, the caller checks */
			continue;
		}
		/* this thread's running max m and sum s of exp(x - m) */
		float m = -INFINITY, s = 0.0f;
		for (int v = threadIdx.x; v < V; v += blockDim.x) {
			float x = l[v];
			if (x > m) {
				s = s * expf(m - x) + 1.0f;
				m = x;
			} else if (x != -INFINITY) {   /* -inf adds 0, and -inf - -inf is NaN */
				s += expf(x - m);
			}
		}
		float mx = block_max(m, sh);
		float se = block_sum(m == -INFINITY ? 0.0f : s * expf(m - mx), sh);
		float k = scale / se;
		for (int v = threadIdx.x; v < V; v += blockDim.x) {
			float p = expf(l[v] - mx) * k;
			d[v] = f2bf(v == t ? p - scale : p);
		}
		if (threadIdx.x == 0)
			loss[r] = logf(se) + mx - l[t];
	}
}

extern "C" void hp_cuda_ce_fwd_bwd(float *loss, hp_bf16 *dlogits, const float *logits, const int32_t *targets,
				   long n, int V, float scale)
{
	unsigned threads = V >= 8192 ? 1024 : V >= 1024 ? 256 : 64;

	if (n <= 0)
		return;
	ce_kernel<<<(unsigned)(n < (1L << 20) ? n : (1L << 20)), threads, 0, hp_cu_stream>>>(
		loss, dlogits, logits, targets, n, V, scale);
}
