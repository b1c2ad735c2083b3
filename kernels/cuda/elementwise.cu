/*
 * elementwise.cu - the CUDA backend's memory-bound ops: bf16 conversions,
 * the residual add, scaling, the sum of squares, the embedding, RMSNorm
 * (fp32 and per-head bf16 rows), RoPE and the SwiGLU of [gate | up] rows.
 *
 * Arithmetic follows kernels/cpu (rmsnorm.c, rope.c, swiglu.c,
 * embedding.c) operation for operation where that is cheap: RMSNorm's sums
 * of squares and dot products run in double like the CPU's, the products
 * the CPU rounds separately are kept unfused (__fmul_rn), so the fp32
 * values before the final bf16 rounding are the CPU's to an ulp or two.
 *
 * Determinism: no atomics.  Reductions over a row are block sums in a fixed
 * shape; reductions over rows (hp_cuda_sumsq, RMSNorm's dw) are two-stage:
 * per-block partial sums into a scratch buffer in a fixed row order, then
 * one pass that adds the partials in order.  The partition depends only on
 * the sizes, never on timing.
 *
 * Scratch: two device buffers, the only cudaMalloc calls here: the sum of
 * squares' SS_BLOCKS + 1 doubles, and RMSNorm's dw partials, DW_PARTS * C
 * floats for max(C, 8192) columns (8 MiB).  hp_cuda_reserve makes both
 * before the step loop (lib/gmodel.c); a caller that did not is served
 * lazily, and a wider row grows the partials (after a stream sync).  A failed allocation leaves dw untouched and its
 * error pending for hp_cuda_check / hp_cuda_sync.
 */
#include <math.h>

#include "cuda/common.cuh"

static float *dw_get(size_t need);

#define EW_THREADS 256
/* RMSNorm's dw: blocks of DW_COLS columns x DW_LANES row lanes, at most
 * DW_PARTS row partitions of at least DW_MIN_ROWS rows */
#define DW_COLS 32
#define DW_LANES 8
#define DW_PARTS 256
#define DW_MIN_ROWS 16
/* one block per row: threads a multiple of 32, one element each up to 512 */
static inline unsigned row_threads(int C)
{
	return hp_cu_row_threads(C, 512u);
}

/* ---- conversions and element-wise ---- */

static __global__ void k_f32_to_bf16(hp_bf16 *y, const float *x, size_t n)
{
	HP_CU_GRID_STRIDE(i, n)
		y[i] = f2bf(x[i]);
}

static __global__ void k_add_bf16(float *h, const hp_bf16 *o, size_t n)
{
	HP_CU_GRID_STRIDE(i, n)
		h[i] += bf2f(o[i]);
}

static __global__ void k_scale(float *x, float s, size_t n)
{
	HP_CU_GRID_STRIDE(i, n)
		x[i] *= s;
}

extern "C" void hp_cuda_f32_to_bf16(hp_bf16 *y, const float *x, size_t n)
{
	if (n)
		k_f32_to_bf16<<<hp_cu_blocks(n, EW_THREADS), EW_THREADS, 0, hp_cu_stream>>>(y, x, n);
}

extern "C" void hp_cuda_add_bf16(float *h, const hp_bf16 *o, size_t n)
{
	if (n)
		k_add_bf16<<<hp_cu_blocks(n, EW_THREADS), EW_THREADS, 0, hp_cu_stream>>>(h, o, n);
}

extern "C" void hp_cuda_scale(float *x, float s, size_t n)
{
	if (n)
		k_scale<<<hp_cu_blocks(n, EW_THREADS), EW_THREADS, 0, hp_cu_stream>>>(x, s, n);
}

/* ---- sum of squares: SS_BLOCKS partials in double, then one block ---- */

#define SS_BLOCKS 1024
static double *ss_buf;   /* SS_BLOCKS partial sums, then the total */

static __global__ void k_sumsq_part(double *part, const float *x, size_t n)
{
	__shared__ double sh[32];
	double s = 0;

	HP_CU_GRID_STRIDE(i, n) {
		double v = x[i];
		s += v * v;
	}
	s = block_sum(s, sh);
	if (threadIdx.x == 0)
		part[blockIdx.x] = s;
}

static __global__ void k_sumsq_final(double *out, const double *part, int nb)
{
	__shared__ double sh[32];
	double s = 0;

	for (int i = threadIdx.x; i < nb; i += blockDim.x)
		s += part[i];
	s = block_sum(s, sh);
	if (threadIdx.x == 0)
		*out = s;
}

extern "C" int hp_cuda_reserve(int max_cols, struct hp_err *e)
{
	if (!ss_buf)
		CK(cudaMalloc(&ss_buf, (SS_BLOCKS + 1) * sizeof(double)));
	if (max_cols > 0 && !dw_get((size_t)DW_PARTS * (size_t)max_cols))
		return hp_err_set(e, HP_ECUDA, "cuda: cannot allocate RMSNorm's scratch for rows of %d", max_cols);
	return 0;
}

extern "C" int hp_cuda_sumsq(double *host_out, const float *x, size_t n, struct hp_err *e)
{
	/* the grid depends on n only: the same n sums in the same order */
	unsigned nb = hp_cu_blocks(n, EW_THREADS);

	if (nb > SS_BLOCKS)
		nb = SS_BLOCKS;
	if (!ss_buf)
		CK(cudaMalloc(&ss_buf, (SS_BLOCKS + 1) * sizeof(double)));
	k_sumsq_part<<<nb, EW_THREADS, 0, hp_cu_stream>>>(ss_buf, x, n);
	k_sumsq_final<<<1, 1024, 0, hp_cu_stream>>>(ss_buf + SS_BLOCKS, ss_buf, (int)nb);
	CK(cudaGetLastError());
	CK(cudaMemcpyAsync(host_out, ss_buf + SS_BLOCKS, sizeof(double), cudaMemcpyDeviceToHost, hp_cu_stream));
	CK(cudaStreamSynchronize(hp_cu_stream));
	return 0;
}

/* ---- embedding ---- */

static __global__ void k_embedding_fwd(float *out, const int32_t *ids, const hp_bf16 *table, long N, int C)
{
	for (long n = blockIdx.x; n < N; n += gridDim.x) {
		const hp_bf16 *row = table + (long)ids[n] * C;
		float *o = out + n * C;
		for (int c = threadIdx.x; c < C; c += blockDim.x)
			o[c] = bf2f(row[c]);
	}
}

/* One block per id: its rows added in token order onto dtable's row, the
 * CPU's order exactly (hp_embedding_bwd adds token by token). */
static __global__ void k_embedding_bwd(float *dtable, const float *dout, const int32_t *ids,
				       const int32_t *order, const int32_t *starts, int nu, int C)
{
	for (int u = blockIdx.x; u < nu; u += gridDim.x) {
		int s0 = starts[u], s1 = starts[u + 1];
		if (s0 >= s1)
			continue;
		float *row = dtable + (long)ids[order[s0]] * C;
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			float acc = row[c];
			for (int i = s0; i < s1; i++)
				acc += dout[(long)order[i] * C + c];
			row[c] = acc;
		}
	}
}

extern "C" void hp_cuda_embedding_fwd(float *out, const int32_t *ids, const hp_bf16 *table, long N, int C)
{
	if (N > 0 && C > 0)
		k_embedding_fwd<<<hp_cu_rows(N), row_threads(C), 0, hp_cu_stream>>>(out, ids, table, N, C);
}

extern "C" void hp_cuda_embedding_bwd(float *dtable, const float *dout, const int32_t *ids,
				      const int32_t *order, const int32_t *starts, int nu, long N, int C)
{
	if (nu > 0 && C > 0)
		k_embedding_bwd<<<hp_cu_rows(nu), row_threads(C), 0, hp_cu_stream>>>(dtable, dout, ids,
										    order, starts, nu, C);
}

/* ---- RMSNorm ---- */

/* one block per row; rstd = 1/sqrt(mean(x^2) + eps) with the sum in double */
template <typename T>
static __global__ void k_rmsnorm_fwd(hp_bf16 *y, float *rstd, const T *x, const float *w,
				     long N, int C, float eps)
{
	__shared__ double sh[32];

	for (long n = blockIdx.x; n < N; n += gridDim.x) {
		const T *xr = x + n * C;
		double ss = 0;
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			double v = hp_ld(xr + c);
			ss += v * v;
		}
		ss = block_sum(ss, sh);
		float r = (float)(1.0 / sqrt(ss / C + eps));
		if (threadIdx.x == 0)
			rstd[n] = r;
		for (int c = threadIdx.x; c < C; c += blockDim.x)
			y[n * C + c] = f2bf(__fmul_rn(w[c], __fmul_rn(hp_ld(xr + c), r)));
	}
}

/* dx = r * (dy*w - xhat * mean(dy*w*xhat)), xhat = x*r: one block per row */
template <typename T, typename TO>
static __global__ void k_rmsnorm_bwd_dx(TO *dx, const hp_bf16 *dy, const T *x, const float *w,
					const float *rstd, long N, int C, int accumulate)
{
	__shared__ double sh[32];

	for (long n = blockIdx.x; n < N; n += gridDim.x) {
		const T *xr = x + n * C;
		const hp_bf16 *dyr = dy + n * C;
		float r = rstd[n];
		double dot = 0;
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			float xh = __fmul_rn(hp_ld(xr + c), r);
			dot += (double)bf2f(dyr[c]) * w[c] * xh;
		}
		dot = block_sum(dot, sh);
		float mean = (float)(dot / C);
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			float xh = __fmul_rn(hp_ld(xr + c), r);
			float v = __fmul_rn(r, __fsub_rn(__fmul_rn(bf2f(dyr[c]), w[c]), __fmul_rn(xh, mean)));
			hp_st(dx + n * C + c, accumulate ? hp_ld(dx + n * C + c) + v : v);
		}
	}
}

/*
 * dw: the rows are cut into P <= DW_PARTS chunks of rows_per rows; block
 * (column tile, chunk) sums dy*xhat over its rows for DW_COLS columns, its
 * DW_LANES row lanes (row n0+l, n0+l+DW_LANES, ...) added in lane order, into
 * part[chunk, c]; then k_dw_final adds part[0..P, c] in order onto dw[c].
 */

static float *dw_scratch;
static size_t dw_cap;    /* floats */

template <typename T>
static __global__ void k_rmsnorm_dw_part(float *part, const hp_bf16 *dy, const T *x, const float *rstd,
					 long N, int C, long rows_per)
{
	__shared__ float sh[DW_LANES][DW_COLS];
	int c = blockIdx.x * DW_COLS + threadIdx.x;
	long n0 = (long)blockIdx.y * rows_per, n1 = n0 + rows_per < N ? n0 + rows_per : N;
	float acc = 0;

	if (c < C)
		for (long n = n0 + threadIdx.y; n < n1; n += DW_LANES)
			acc += __fmul_rn(bf2f(dy[n * C + c]), __fmul_rn(hp_ld(x + n * C + c), rstd[n]));
	sh[threadIdx.y][threadIdx.x] = acc;
	__syncthreads();
	if (threadIdx.y == 0 && c < C) {
		float s = 0;
		for (int l = 0; l < DW_LANES; l++)
			s += sh[l][threadIdx.x];
		part[(long)blockIdx.y * C + c] = s;
	}
}

static __global__ void k_dw_final(float *dw, const float *part, int P, int C)
{
	for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
		float s = 0;
		for (int p = 0; p < P; p++)
			s += part[(long)p * C + c];
		dw[c] += s;
	}
}

/* the dw scratch for P*C floats; NULL (error left pending) on failure */
static float *dw_get(size_t need)
{
	if (need > dw_cap) {
		size_t cap = need > (size_t)DW_PARTS * 8192 ? need : (size_t)DW_PARTS * 8192;
		if (dw_scratch) {
			cudaStreamSynchronize(hp_cu_stream);   /* earlier kernels may still read it */
			cudaFree(dw_scratch);
			dw_scratch = NULL;
			dw_cap = 0;
		}
		if (cudaMalloc(&dw_scratch, cap * sizeof(float)) != cudaSuccess) {
			dw_scratch = NULL;
			return NULL;
		}
		dw_cap = cap;
	}
	return dw_scratch;
}

template <typename T>
static void rmsnorm_dw(float *dw, const hp_bf16 *dy, const T *x, const float *rstd, long N, int C)
{
	long rows_per = (N + DW_PARTS - 1) / DW_PARTS;
	if (rows_per < DW_MIN_ROWS)
		rows_per = DW_MIN_ROWS;
	int P = (int)((N + rows_per - 1) / rows_per);
	float *part = dw_get((size_t)P * C);

	if (!part)
		return;
	dim3 grid((unsigned)((C + DW_COLS - 1) / DW_COLS), (unsigned)P), block(DW_COLS, DW_LANES);
	k_rmsnorm_dw_part<T><<<grid, block, 0, hp_cu_stream>>>(part, dy, x, rstd, N, C, rows_per);
	k_dw_final<<<hp_cu_blocks((size_t)C, EW_THREADS), EW_THREADS, 0, hp_cu_stream>>>(dw, part, P, C);
}

extern "C" void hp_cuda_rmsnorm_fwd(hp_bf16 *y, float *rstd, const float *x, const float *w,
				    long N, int C, float eps)
{
	if (N > 0 && C > 0)
		k_rmsnorm_fwd<float><<<hp_cu_rows(N), row_threads(C), 0, hp_cu_stream>>>(y, rstd, x, w, N, C, eps);
}

extern "C" void hp_cuda_rmsnorm_bwd(float *dx, float *dw, const hp_bf16 *dy, const float *x, const float *w,
				    const float *rstd, long N, int C, int accumulate)
{
	if (N <= 0 || C <= 0)
		return;
	k_rmsnorm_bwd_dx<float, float><<<hp_cu_rows(N), row_threads(C), 0, hp_cu_stream>>>(dx, dy, x, w, rstd,
											     N, C, accumulate);
	rmsnorm_dw<float>(dw, dy, x, rstd, N, C);
}

extern "C" void hp_cuda_rmsnorm_fwd_bf16(hp_bf16 *y, float *rstd, const hp_bf16 *x, const float *w,
					 long N, int C, float eps)
{
	if (N > 0 && C > 0)
		k_rmsnorm_fwd<hp_bf16><<<hp_cu_rows(N), row_threads(C), 0, hp_cu_stream>>>(y, rstd, x, w, N, C, eps);
}

extern "C" void hp_cuda_rmsnorm_bwd_bf16(hp_bf16 *dx, float *dw, const hp_bf16 *dy, const hp_bf16 *x,
					 const float *w, const float *rstd, long N, int C)
{
	if (N <= 0 || C <= 0)
		return;
	k_rmsnorm_bwd_dx<hp_bf16, hp_bf16><<<hp_cu_rows(N), row_threads(C), 0, hp_cu_stream>>>(dx, dy, x, w, rstd,
												 N, C, 0);
	rmsnorm_dw<hp_bf16>(dw, dy, x, rstd, N, C);
}

/* ---- RoPE: one thread per (token, head, i < D/2) pair ---- */

static __global__ void k_rope(hp_bf16 *x, const int32_t *pos, const float *cos_t, const float *sin_t,
			      long N, int H, int D, float sign)
{
	int half = D / 2;
	size_t total = (size_t)N * H * half;

	HP_CU_GRID_STRIDE(idx, total) {
		int i = (int)(idx % half);
		size_t nh = idx / half;
		long tb = (long)pos[nh / H] * half + i;
		float c = cos_t[tb], s = sign * sin_t[tb];
		hp_bf16 *v = x + nh * D;
		float a = bf2f(v[i]), b = bf2f(v[i + half]);
		v[i] = f2bf(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
		v[i + half] = f2bf(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
	}
}

extern "C" void hp_cuda_rope_fwd(hp_bf16 *x, const int32_t *pos, const float *cos_t, const float *sin_t,
				 long N, int H, int D)
{
	size_t n = (size_t)(N > 0 ? N : 0) * (H > 0 ? H : 0) * (D / 2 > 0 ? D / 2 : 0);

	if (n)
		k_rope<<<hp_cu_blocks(n, EW_THREADS), EW_THREADS, 0, hp_cu_stream>>>(x, pos, cos_t, sin_t,
										   N, H, D, 1.0f);
}

/* the rotation is orthogonal: its adjoint rotates by -angle */
extern "C" void hp_cuda_rope_bwd(hp_bf16 *dx, const int32_t *pos, const float *cos_t, const float *sin_t,
				 long N, int H, int D)
{
	size_t n = (size_t)(N > 0 ? N : 0) * (H > 0 ? H : 0) * (D / 2 > 0 ? D / 2 : 0);

	if (n)
		k_rope<<<hp_cu_blocks(n, EW_THREADS), EW_THREADS, 0, hp_cu_stream>>>(dx, pos, cos_t, sin_t,
										   N, H, D, -1.0f);
}

/* ---- SwiGLU on [gate | up] rows: one thread per (row, i < I) ---- */

static __device__ __forceinline__ float sigmoid(float g)
{
	return 1.0f / (1.0f + expf(-g));   /* expf(-g) = inf for g < -88: s = 0, no NaN */
}

static __global__ void k_swiglu_fwd(hp_bf16 *h, const hp_bf16 *gu, long rows, int I)
{
	size_t total = (size_t)rows * I;

	HP_CU_GRID_STRIDE(idx, total) {
		size_t r = idx / I;
		int i = (int)(idx - r * I);
		const hp_bf16 *p = gu + r * 2 * I;
		float g = bf2f(p[i]), u = bf2f(p[I + i]);
		h[idx] = f2bf(__fmul_rn(__fmul_rn(g, sigmoid(g)), u));
	}
}

/* d silu(g)/dg = s * (1 + g * (1 - s)), s = sigmoid(g), as swiglu.c */
static __global__ void k_swiglu_bwd(hp_bf16 *dgu, const hp_bf16 *dh, const hp_bf16 *gu, long rows, int I)
{
	size_t total = (size_t)rows * I;

	HP_CU_GRID_STRIDE(idx, total) {
		size_t r = idx / I;
		int i = (int)(idx - r * I);
		const hp_bf16 *p = gu + r * 2 * I;
		hp_bf16 *q = dgu + r * 2 * I;
		float g = bf2f(p[i]), u = bf2f(p[I + i]), d = bf2f(dh[idx]);
		float s = sigmoid(g);
		q[I + i] = f2bf(__fmul_rn(d, __fmul_rn(g, s)));
		q[i] = f2bf(__fmul_rn(__fmul_rn(__fmul_rn(d, u), s),
				      __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s)))));
	}
}

extern "C" void hp_cuda_swiglu_fwd(hp_bf16 *h, const hp_bf16 *gu, long rows, int I)
{
	size_t n = (size_t)(rows > 0 ? rows : 0) * (I > 0 ? I : 0);

	if (n)
		k_swiglu_fwd<<<hp_cu_blocks(n, EW_THREADS), EW_THREADS, 0, hp_cu_stream>>>(h, gu, rows, I);
}

extern "C" void hp_cuda_swiglu_bwd(hp_bf16 *dgu, const hp_bf16 *dh, const hp_bf16 *gu, long rows, int I)
{
	size_t n = (size_t)(rows > 0 ? rows : 0) * (I > 0 ? I : 0);

	if (n)
		k_swiglu_bwd<<<hp_cu_blocks(n, EW_THREADS), EW_THREADS, 0, hp_cu_stream>>>(dgu, dh, gu, rows, I);
}
