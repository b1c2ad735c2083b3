/*
 * oss.cu - GPT-OSS's kernels on the GPU: attention sinks on a flash
 * kernel's out and lse, the clamped SwiGLU of its experts, and the
 * experts' biases on rows grouped by expert.  The same arithmetic as
 * kernels/cpu/oss.c (its header says what each computes and why), one
 * thread per output element or row; t/unit/test-cuda.c holds each to the
 * CPU kernel (on a GPU, and under the emulation of t/cuemu).
 */
#include "cuda/common.cuh"

#define OSS_THREADS 256
#define oss_blocks(n) hp_cu_blocks((n), OSS_THREADS)

/* one thread per (b, h, t) row: lse' = log(exp(lse) + exp(s)), out *= exp(lse - lse') */
static __global__ void k_sinks_fwd(float *out, float *lse, const float *sinks, int B, int T, int H, int D)
{
	size_t total = (size_t)B * H * T;

	HP_CU_GRID_STRIDE(idx, total) {
		int t = (int)(idx % T), h = (int)((idx / T) % H);
		size_t b = idx / ((size_t)T * H);
		double l = lse[idx], s = sinks[h], m = l > s ? l : s;
		double l2 = m + log(exp(l - m) + exp(s - m));
		float f = (float)exp(l - l2);
		float *o = out + ((b * T + t) * H + h) * D;

		for (int d = 0; d < D; d++)
			o[d] *= f;
		lse[idx] = (float)l2;
	}
}

/* one block per head: the rows' -p_sink * rowsum(dout * out), summed in a
 * fixed order (each thread a strided run of rows, then a tree) */
#define SK_THREADS 256
static __global__ void k_sinks_bwd(float *dsinks, const float *dout, const float *out, const float *lse,
				   const float *sinks, int B, int T, int H, int D)
{
	__shared__ double part[SK_THREADS];
	int h = blockIdx.x;
	size_t rows = (size_t)B * T;
	double acc = 0;

	for (size_t r = threadIdx.x; r < rows; r += blockDim.x) {
		size_t b = r / T, t = r % T;
		const float *o = out + (r * H + h) * D, *g = dout + (r * H + h) * D;
		double di = 0;

		for (int d = 0; d < D; d++)
			di += (double)g[d] * o[d];
		acc -= exp((double)sinks[h] - lse[(b * H + h) * T + t]) * di;
	}
	part[threadIdx.x] = acc;
	__syncthreads();
	for (int w = SK_THREADS / 2; w > 0; w /= 2) {
		if ((int)threadIdx.x < w)
			part[threadIdx.x] += part[threadIdx.x + w];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		dsinks[h] += (float)part[0];
}

extern "C" void hp_cuda_sinks_fwd(float *out, float *lse, const float *sinks, int B, int T, int H, int D)
{
	size_t n = (size_t)B * H * T;

	if (n)
		k_sinks_fwd<<<oss_blocks(n), OSS_THREADS, 0, hp_cu_stream>>>(out, lse, sinks, B, T, H, D);
}

extern "C" void hp_cuda_sinks_bwd(float *dsinks, const float *dout, const float *out, const float *lse,
				  const float *sinks, int B, int T, int H, int D)
{
	if (H > 0 && B > 0 && T > 0)
		k_sinks_bwd<<<H, SK_THREADS, 0, hp_cu_stream>>>(dsinks, dout, out, lse, sinks, B, T, H, D);
}

static __device__ void glu_clamp_f(float g, float u, float alpha, float limit, float *h)
{
	float gc = fminf(g, limit), uc = fmaxf(fminf(u, limit), -limit);
	float sg = 1.0f / (1.0f + expf(-alpha * gc));

	*h = (uc + 1.0f) * (gc * sg);
}

static __global__ void k_glu_clamp_fwd(float *h, const float *g, const float *u, long ld, long rows, int I,
				       float alpha, float limit)
{
	size_t total = (size_t)rows * I;

	HP_CU_GRID_STRIDE(idx, total) {
		size_t r = idx / I;
		int i = (int)(idx - r * I);

		glu_clamp_f(g[r * ld + i], u[r * ld + i], alpha, limit, &h[idx]);
	}
}

static __global__ void k_glu_clamp_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
				       long ld, long rows, int I, float alpha, float limit)
{
	size_t total = (size_t)rows * I;

	HP_CU_GRID_STRIDE(idx, total) {
		size_t r = idx / I;
		int i = (int)(idx - r * I);
		float gv = g[r * ld + i], uv = u[r * ld + i], d = dh[idx];
		float gc = fminf(gv, limit), uc = fmaxf(fminf(uv, limit), -limit);
		float sg = 1.0f / (1.0f + expf(-alpha * gc));

		dg[r * ld + i] = gv <= limit ? d * (uc + 1.0f) * (sg + gc * alpha * sg * (1.0f - sg)) : 0.0f;
		du[r * ld + i] = uv >= -limit && uv <= limit ? d * (gc * sg) : 0.0f;
	}
}

extern "C" void hp_cuda_glu_clamp_fwd(float *h, const float *g, const float *u, long ld, long rows, int I,
				      float alpha, float limit)
{
	size_t n = (size_t)(rows > 0 ? rows : 0) * (I > 0 ? I : 0);

	if (n)
		k_glu_clamp_fwd<<<oss_blocks(n), OSS_THREADS, 0, hp_cu_stream>>>(h, g, u, ld, rows, I, alpha, limit);
}

extern "C" void hp_cuda_glu_clamp_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
				      long ld, long rows, int I, float alpha, float limit)
{
	size_t n = (size_t)(rows > 0 ? rows : 0) * (I > 0 ? I : 0);

	if (n)
		k_glu_clamp_bwd<<<oss_blocks(n), OSS_THREADS, 0, hp_cu_stream>>>(dg, du, dh, g, u, ld, rows, I,
										     alpha, limit);
}

/* the expert of row r: the last e with off[e] <= r (off ascending, nx + 1 entries) */
static __device__ int row_expert(const int32_t *off, int nx, long r)
{
	int lo = 0, hi = nx - 1;

	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (off[mid] <= r)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

/* one thread per (row, column < n) of the rows off[0] .. off[nx] */
static __global__ void k_bias_grouped_fwd(float *x, long ld, const float *bias, size_t bs, const int32_t *off,
					  int nx, int n)
{
	size_t total = (size_t)(off[nx] - off[0]) * n;

	HP_CU_GRID_STRIDE(idx, total) {
		long r = off[0] + (long)(idx / n);
		int j = (int)(idx % n);

		x[r * ld + j] += bias[(size_t)row_expert(off, nx, r) * bs + j];
	}
}

/* one thread per (expert, column): its rows summed in order, in double */
static __global__ void k_bias_grouped_bwd(float *db, size_t bs, const float *dx, long ld, const int32_t *off,
					  int nx, int n)
{
	size_t total = (size_t)nx * n;

	HP_CU_GRID_STRIDE(idx, total) {
		int e = (int)(idx / n), j = (int)(idx % n);
		double s = 0;

		for (long r = off[e]; r < off[e + 1]; r++)
			s += dx[r * ld + j];
		db[(size_t)e * bs + j] += (float)s;
	}
}

/* off is the device's; the rows' count is read there, so the grid covers
 * every row any expert could hold: at most max_rows */
extern "C" void hp_cuda_bias_grouped_fwd(float *x, long ld, const float *bias, size_t bs, const int32_t *off,
					 int nx, int n, long max_rows)
{
	size_t m = (size_t)(max_rows > 0 ? max_rows : 0) * (n > 0 ? n : 0);

	if (m && nx > 0)
		k_bias_grouped_fwd<<<oss_blocks(m), OSS_THREADS, 0, hp_cu_stream>>>(x, ld, bias, bs, off, nx, n);
}

extern "C" void hp_cuda_bias_grouped_bwd(float *db, size_t bs, const float *dx, long ld, const int32_t *off,
					 int nx, int n)
{
	size_t m = (size_t)(nx > 0 ? nx : 0) * (n > 0 ? n : 0);

	if (m)
		k_bias_grouped_bwd<<<oss_blocks(m), OSS_THREADS, 0, hp_cu_stream>>>(db, bs, dx, ld, off, nx, n);
}
