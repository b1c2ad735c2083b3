/*
 * elementwise.cu - the CUDA backend's memory-bound ops on fp32 activations:
 * bf16 conversions (the tensor cores' operands), adds, bias, column sums,
 * maxima, scaling, the sum of squares, the embedding, RMSNorm, RoPE and
 * SwiGLU (element-wise and on [gate | up] rows).  What it is not: any
 * GEMM (gemm.cu), routing (moe.cu) or loss (ce.cu).
 *
 * Arithmetic follows kernels/cpu (rows.c, rmsnorm.c, rope.c, swiglu.c,
 * embedding.c) operation for operation where that is cheap: RMSNorm's sums
 * of squares and dot products run in double like the CPU's, the products
 * the CPU rounds separately are kept unfused (__fmul_rn), so an output is
 * the CPU's to an ulp or two, and exactly the CPU's where no reduction or
 * transcendental function enters (conversions, adds, bias, maxima, the
 * embedding, RoPE).
 *
 * Determinism: no atomics.  Reductions over a row are block sums in a fixed
 * shape; reductions over rows (hp_cuda_sumsq, RMSNorm's dw, colsum) are
 * two-stage: per-block partial sums into a scratch buffer in a fixed row
 * order, then one pass that adds the partials in order.  The partition
 * depends only on the sizes, never on timing.  The column sums are
 * therefore not the CPU's row-by-row order (hp_bias_grad): a sequential
 * walk down each column would be that, but at a few thousand columns it
 * leaves the GPU mostly idle, and these sums feed weight gradients whose
 * bf16 operands already differ from the CPU's.
 *
 * Scratch: two device buffers, the only cudaMalloc calls here: the sum of
 * squares' SS_BLOCKS + 1 doubles, and the column reductions' partials,
 * COL_PARTS * C floats for max(C, 8192) columns (8 MiB), shared by
 * RMSNorm's dw and colsum (they run in stream order, never together).
 * hp_cuda_reserve makes both before the step loop; a caller that did not
 * is served lazily, and a wider row grows the partials (after a stream
 * sync).  A failed allocation leaves the output untouched and its error
 * pending for hp_cuda_check / hp_cuda_sync.
 */
#include <math.h>

#include "cuda/common.cuh"

#define EW_THREADS 256
/* Column reductions (RMSNorm's dw, colsum): blocks of COL_W columns x
 * COL_LANES row lanes, at most COL_PARTS row partitions of at least
 * COL_MIN_ROWS rows */
#define COL_W 32
#define COL_LANES 8
#define COL_PARTS 256
#define COL_MIN_ROWS 16

/* one block per row: threads a multiple of 32, one element each up to 512 */
static inline unsigned row_threads(int C)
{
	return hp_cu_row_threads(C, 512u);
}

static inline unsigned ew_blocks(size_t n)
{
	return hp_cu_blocks(n, EW_THREADS);
}

/* ---- conversions and element-wise ---- */

static __global__ void k_f32_to_bf16(hp_bf16 *y, const float *x, size_t n)
{
	HP_CU_GRID_STRIDE(i, n)
		y[i] = f2bf(x[i]);
}

static __global__ void k_bf16_to_f32(float *y, const hp_bf16 *x, size_t n)
{
	HP_CU_GRID_STRIDE(i, n)
		y[i] = bf2f(x[i]);
}

static __global__ void k_add_bf16(float *h, const hp_bf16 *o, size_t n)
{
	HP_CU_GRID_STRIDE(i, n)
		h[i] = __fadd_rn(h[i], bf2f(o[i]));
}

/* one thread an element: its k values in rank order, one rounding */
static __global__ void k_bf16_sum_ranks(hp_bf16 *out, const hp_bf16 *in, int k, size_t n, size_t s)
{
	HP_CU_GRID_STRIDE(i, n) {
		float a = bf2f(in[i]);

		for (int r = 1; r < k; r++)
			a = __fadd_rn(a, bf2f(in[(size_t)r * s + i]));
		out[i] = f2bf(a);
	}
}

/* x may alias a or b: each element is read and written by one thread */
static __global__ void k_add(float *x, const float *a, const float *b, size_t n)
{
	HP_CU_GRID_STRIDE(i, n)
		x[i] = __fadd_rn(a[i], b[i]);
}

static __global__ void k_acc(float *x, const float *y, size_t n)
{
	HP_CU_GRID_STRIDE(i, n)
		x[i] = __fadd_rn(x[i], y[i]);
}

static __global__ void k_add_bias(float *x, const float *b, size_t n, int C)
{
	HP_CU_GRID_STRIDE(i, n)
		x[i] = __fadd_rn(x[i], b[i % (size_t)C]);
}

/* y taken where y > x (hp_max_into: a NaN in y never replaces x) */
static __global__ void k_max(float *x, const float *y, size_t n)
{
	HP_CU_GRID_STRIDE(i, n) {
		float a = x[i], b = y[i];
		x[i] = b > a ? b : a;
	}
}

static __global__ void k_add_f64(double *x, const double *y, size_t n)
{
	HP_CU_GRID_STRIDE(i, n)
		x[i] = __dadd_rn(x[i], y[i]);
}

static __global__ void k_scale(float *x, float s, size_t n)
{
	HP_CU_GRID_STRIDE(i, n)
		x[i] = __fmul_rn(x[i], s);
}

extern "C" void hp_cuda_f32_to_bf16(hp_bf16 *y, const float *x, size_t n)
{
	if (n)
		k_f32_to_bf16<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(y, x, n);
}

extern "C" void hp_cuda_bf16_to_f32(float *y, const hp_bf16 *x, size_t n)
{
	if (n)
		k_bf16_to_f32<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(y, x, n);
}

extern "C" void hp_cuda_add_bf16(float *h, const hp_bf16 *o, size_t n)
{
	if (n)
		k_add_bf16<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(h, o, n);
}

extern "C" void hp_cuda_add(float *x, const float *a, const float *b, size_t n)
{
	if (n)
		k_add<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(x, a, b, n);
}

extern "C" void hp_cuda_bf16_sum_ranks(hp_bf16 *out, const hp_bf16 *in, int k, size_t n, size_t s)
{
	if (n)
		k_bf16_sum_ranks<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(out, in, k, n, s);
}

extern "C" void hp_cuda_acc(float *x, const float *y, size_t n)
{
	if (n)
		k_acc<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(x, y, n);
}

extern "C" void hp_cuda_add_bias(float *x, const float *b, long N, int C)
{
	size_t n = (size_t)(N > 0 ? N : 0) * (size_t)(C > 0 ? C : 0);

	if (n)
		k_add_bias<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(x, b, n, C);
}

extern "C" void hp_cuda_max(float *x, const float *y, size_t n)
{
	if (n)
		k_max<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(x, y, n);
}

extern "C" void hp_cuda_add_f64(double *x, const double *y, size_t n)
{
	if (n)
		k_add_f64<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(x, y, n);
}

extern "C" void hp_cuda_scale(float *x, float s, size_t n)
{
	if (n)
		k_scale<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(x, s, n);
}

/* ---- sum of squares: SS_BLOCKS partials in double, then one block ---- */

#define SS_BLOCKS 1024
static double *ss_buf;   /* SS_BLOCKS partial sums */

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
		*out += s;
}

static float *col_get(size_t need);

extern "C" int hp_cuda_reserve(int max_cols, struct hp_err *e)
{
	if (!ss_buf)
		CK(cudaMalloc(&ss_buf, (SS_BLOCKS + 1) * sizeof(double)));
	if (max_cols > 0 && !col_get((size_t)COL_PARTS * (size_t)max_cols))
		return hp_err_set(e, HP_ECUDA, "cuda: cannot allocate the column sums' scratch for rows of %d",
				  max_cols);
	return 0;
}

extern "C" int hp_cuda_sumsq(double *acc, const float *x, size_t n, struct hp_err *e)
{
	/* the grid depends on n only: the same n sums in the same order */
	unsigned nb = ew_blocks(n);

	if (nb > SS_BLOCKS)
		nb = SS_BLOCKS;
	if (!ss_buf)
		CK(cudaMalloc(&ss_buf, (SS_BLOCKS + 1) * sizeof(double)));
	k_sumsq_part<<<nb, EW_THREADS, 0, hp_cu_stream>>>(ss_buf, x, n);
	k_sumsq_final<<<1, 1024, 0, hp_cu_stream>>>(acc, ss_buf, (int)nb);
	CK(cudaGetLastError());
	return 0;
}

/* ---- column sums over rows: RMSNorm's dw and colsum ----
 *
 * The rows are cut into P <= COL_PARTS chunks of rows_per rows; block
 * (column tile, chunk) sums a term over its rows for COL_W columns, its
 * COL_LANES row lanes (row n0+l, n0+l+COL_LANES, ...) added in lane order,
 * into part[chunk, c]; then k_col_final adds part[0..P, c] in order onto
 * dst[c].  The term is a functor of (row, element index).
 */

static float *col_scratch;
static size_t col_cap;    /* floats */

/* dw's term: dy * xhat, xhat = x * rstd (rmsnorm.c's rounding) */
struct dw_term {
	const float *dy, *x, *rstd;
	__device__ float operator()(long n, size_t i) const
	{
		return __fmul_rn(dy[i], __fmul_rn(x[i], rstd[n]));
	}
};

struct col_term {
	const float *x;
	__device__ float operator()(long n, size_t i) const
	{
		return x[i];
	}
};

template <typename F>
static __global__ void k_col_part(float *part, F f, long N, int C, long rows_per)
{
	__shared__ float sh[COL_LANES][COL_W];
	int c = blockIdx.x * COL_W + threadIdx.x;
	long n0 = (long)blockIdx.y * rows_per, n1 = n0 + rows_per < N ? n0 + rows_per : N;
	float acc = 0;

	if (c < C)
		for (long n = n0 + threadIdx.y; n < n1; n += COL_LANES)
			acc = __fadd_rn(acc, f(n, (size_t)n * C + c));
	sh[threadIdx.y][threadIdx.x] = acc;
	__syncthreads();
	if (threadIdx.y == 0 && c < C) {
		float s = 0;
		for (int l = 0; l < COL_LANES; l++)
			s = __fadd_rn(s, sh[l][threadIdx.x]);
		part[(long)blockIdx.y * C + c] = s;
	}
}

static __global__ void k_col_final(float *dst, const float *part, int P, int C)
{
	for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
		float s = 0;
		for (int p = 0; p < P; p++)
			s = __fadd_rn(s, part[(long)p * C + c]);
		dst[c] = __fadd_rn(dst[c], s);
	}
}

/* the partials' scratch for need floats; NULL (error left pending) on failure */
static float *col_get(size_t need)
{
	if (need > col_cap) {
		size_t cap = need > (size_t)COL_PARTS * 8192 ? need : (size_t)COL_PARTS * 8192;
		hp_cu_retire(col_scratch);   /* earlier kernels may still read it */
		col_scratch = NULL;
		col_cap = 0;
		if (cudaMalloc(&col_scratch, cap * sizeof(float)) != cudaSuccess) {
			col_scratch = NULL;
			return NULL;
		}
		col_cap = cap;
	}
	return col_scratch;
}

/* dst[c] += sum over rows n < N of f(n, n*C + c), the partition fixed by N */
template <typename F>
static void col_reduce(float *dst, F f, long N, int C)
{
	long rows_per = (N + COL_PARTS - 1) / COL_PARTS;
	if (rows_per < COL_MIN_ROWS)
		rows_per = COL_MIN_ROWS;
	int P = (int)((N + rows_per - 1) / rows_per);
	float *part = col_get((size_t)P * C);

	if (!part)
		return;
	dim3 grid((unsigned)((C + COL_W - 1) / COL_W), (unsigned)P), block(COL_W, COL_LANES);
	k_col_part<F><<<grid, block, 0, hp_cu_stream>>>(part, f, N, C, rows_per);
	k_col_final<<<hp_cu_blocks((size_t)C, EW_THREADS), EW_THREADS, 0, hp_cu_stream>>>(dst, part, P, C);
}

extern "C" void hp_cuda_colsum(float *db, const float *x, long N, int C)
{
	if (N > 0 && C > 0)
		col_reduce(db, col_term{ x }, N, C);
}

/* ---- embedding ---- */

/* out[n] = table[ids[n] - v0] for ids in range, else zeros */
static __global__ void k_embedding_fwd(float *out, const int32_t *ids, const float *table, long N, int C,
				       int v0, int V)
{
	for (long n = blockIdx.x; n < N; n += gridDim.x) {
		long t = (long)ids[n] - v0;
		float *o = out + n * C;
		if (t >= 0 && t < V) {
			const float *row = table + t * C;
			for (int c = threadIdx.x; c < C; c += blockDim.x)
				o[c] = row[c];
		} else {
			for (int c = threadIdx.x; c < C; c += blockDim.x)
				o[c] = 0.0f;
		}
	}
}

/* One block per id: its rows added in token order onto dtable's row, the
 * CPU's order exactly (hp_embedding_bwd_range adds token by token). */
static __global__ void k_embedding_bwd(float *dtable, const float *dout, const int32_t *ids,
				       const int32_t *order, const int32_t *starts, int nu, int C, int v0)
{
	for (int u = blockIdx.x; u < nu; u += gridDim.x) {
		int s0 = starts[u], s1 = starts[u + 1];
		if (s0 >= s1)
			continue;
		float *row = dtable + ((long)ids[order[s0]] - v0) * C;
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			float acc = row[c];
			for (int i = s0; i < s1; i++)
				acc = __fadd_rn(acc, dout[(long)order[i] * C + c]);
			row[c] = acc;
		}
	}
}

extern "C" void hp_cuda_embedding_fwd(float *out, const int32_t *ids, const float *table, long N, int C, int v0,
				      int V)
{
	if (N > 0 && C > 0)
		k_embedding_fwd<<<hp_cu_rows(N), row_threads(C), 0, hp_cu_stream>>>(out, ids, table, N, C, v0, V);
}

extern "C" void hp_cuda_embedding_bwd(float *dtable, const float *dout, const int32_t *ids, const int32_t *order,
				      const int32_t *starts, int nu, int C, int v0)
{
	if (nu > 0 && C > 0)
		k_embedding_bwd<<<hp_cu_rows(nu), row_threads(C), 0, hp_cu_stream>>>(dtable, dout, ids, order,
										    starts, nu, C, v0);
}

/* ---- RMSNorm ---- */

/* one block per row; rstd = 1/sqrt(mean(x^2) + eps) with the sum in double */
static __global__ void k_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int C,
				     float eps)
{
	__shared__ double sh[32];

	for (long n = blockIdx.x; n < N; n += gridDim.x) {
		const float *xr = x + n * C;
		double ss = 0;
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			double v = xr[c];
			ss += v * v;
		}
		ss = block_sum(ss, sh);
		float r = (float)(1.0 / sqrt(ss / C + eps));
		if (threadIdx.x == 0)
			rstd[n] = r;
		for (int c = threadIdx.x; c < C; c += blockDim.x)
			y[n * C + c] = __fmul_rn(w[c], __fmul_rn(xr[c], r));
	}
}

/* dx = r * (dy*w - xhat * mean(dy*w*xhat)), xhat = x*r: one block per row */
static __global__ void k_rmsnorm_bwd_dx(float *dx, const float *dy, const float *x, const float *w,
					const float *rstd, long N, int C, int accumulate)
{
	__shared__ double sh[32];

	for (long n = blockIdx.x; n < N; n += gridDim.x) {
		const float *xr = x + n * C, *dyr = dy + n * C;
		float *dxr = dx + n * C;
		float r = rstd[n];
		double dot = 0;
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			float xh = __fmul_rn(xr[c], r);
			/* unfused: dy * w is exact in double, its product with xh is not */
			dot = __dadd_rn(dot, __dmul_rn(__dmul_rn(dyr[c], w[c]), xh));
		}
		dot = block_sum(dot, sh);
		float mean = (float)(dot / C);
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			float xh = __fmul_rn(xr[c], r);
			float v = __fmul_rn(r, __fsub_rn(__fmul_rn(dyr[c], w[c]), __fmul_rn(xh, mean)));
			dxr[c] = accumulate ? __fadd_rn(dxr[c], v) : v;
		}
	}
}

extern "C" void hp_cuda_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int C, float eps)
{
	if (N > 0 && C > 0)
		k_rmsnorm_fwd<<<hp_cu_rows(N), row_threads(C), 0, hp_cu_stream>>>(y, rstd, x, w, N, C, eps);
}

extern "C" void hp_cuda_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
				    const float *rstd, long N, int C, int accumulate)
{
	if (N <= 0 || C <= 0)
		return;
	/* dw first: dx may be dy's buffer, as the CPU kernel allows */
	col_reduce(dw, dw_term{ dy, x, rstd }, N, C);
	k_rmsnorm_bwd_dx<<<hp_cu_rows(N), row_threads(C), 0, hp_cu_stream>>>(dx, dy, x, w, rstd, N, C, accumulate);
}

/* ---- RoPE: one thread per (token, head, i < Dr/2) pair, rope.c's arithmetic ---- */

static __global__ void k_rope(float *x, const int32_t *pos, const float *cos_t, const float *sin_t, long N, int H,
			      int ld, int Dr, int inter, float sign)
{
	int half = Dr / 2;
	size_t total = (size_t)N * H * half;
	/* pair i is (lo, lo + gap): (i, i + half) or (2i, 2i + 1) */
	int step = inter ? 2 : 1, gap = inter ? 1 : half;

	HP_CU_GRID_STRIDE(idx, total) {
		int i = (int)(idx % half);
		size_t nh = idx / half;
		long tb = (long)pos[nh / H] * half + i;
		float c = cos_t[tb], s = sign * sin_t[tb];
		float *lo = x + nh * ld + (size_t)i * step, *hi = lo + gap;
		float a = *lo, b = *hi;
		*lo = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
		*hi = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
	}
}

static void rope(float *x, const int32_t *pos, const float *cos_t, const float *sin_t, long N, int H, int ld, int Dr,
		 int inter, float sign)
{
	size_t n = (size_t)(N > 0 ? N : 0) * (H > 0 ? H : 0) * (Dr / 2 > 0 ? Dr / 2 : 0);

	if (n)
		k_rope<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(x, pos, cos_t, sin_t, N, H, ld, Dr, inter, sign);
}

extern "C" void hp_cuda_rope_fwd(float *x, const int32_t *pos, const float *cos_t, const float *sin_t, long N, int H,
				 int ld, int Dr, int inter)
{
	rope(x, pos, cos_t, sin_t, N, H, ld, Dr, inter, 1.0f);
}

/* the rotation is orthogonal: its adjoint rotates by -angle */
extern "C" void hp_cuda_rope_bwd(float *dx, const int32_t *pos, const float *cos_t, const float *sin_t, long N, int H,
				 int ld, int Dr, int inter)
{
	rope(dx, pos, cos_t, sin_t, N, H, ld, Dr, inter, -1.0f);
}

/* ---- SwiGLU ---- */

/* sigmoid(g) as swiglu.c's vector path computes it (common.cuh) */
#define sigmoid hp_cu_sigmoid

/* h = silu(g) * u = (g * s) * u */
static __device__ __forceinline__ float swiglu_f(float g, float u)
{
	return __fmul_rn(__fmul_rn(g, sigmoid(g)), u);
}

/* du = dh * (g * s); dg = dh * u * s * (1 + g * (1 - s)), swiglu.c's order */
static __device__ __forceinline__ void swiglu_b(float d, float g, float u, float *dg, float *du)
{
	float s = sigmoid(g);

	*du = __fmul_rn(d, __fmul_rn(g, s));
	*dg = __fmul_rn(__fmul_rn(__fmul_rn(d, u), s), __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s))));
}

static __global__ void k_swiglu_fwd(float *h, const float *g, const float *u, size_t n)
{
	HP_CU_GRID_STRIDE(i, n)
		h[i] = swiglu_f(g[i], u[i]);
}

static __global__ void k_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n)
{
	HP_CU_GRID_STRIDE(i, n) {
		float a, b;
		swiglu_b(dh[i], g[i], u[i], &a, &b);
		dg[i] = a;
		du[i] = b;
	}
}

/* rows of [gate | up] (2*I each): one thread per (row, i < I) */
static __global__ void k_swiglu_rows_fwd(float *h, const float *gu, long rows, int I)
{
	size_t total = (size_t)rows * I;

	HP_CU_GRID_STRIDE(idx, total) {
		size_t r = idx / I;
		int i = (int)(idx - r * I);
		const float *p = gu + r * 2 * I;
		h[idx] = swiglu_f(p[i], p[I + i]);
	}
}

static __global__ void k_swiglu_rows_bwd(float *dgu, const float *dh, const float *gu, long rows, int I)
{
	size_t total = (size_t)rows * I;

	HP_CU_GRID_STRIDE(idx, total) {
		size_t r = idx / I;
		int i = (int)(idx - r * I);
		const float *p = gu + r * 2 * I;
		float *q = dgu + r * 2 * I;
		swiglu_b(dh[idx], p[i], p[I + i], &q[i], &q[I + i]);
	}
}

extern "C" void hp_cuda_swiglu_fwd(float *h, const float *g, const float *u, size_t n)
{
	if (n)
		k_swiglu_fwd<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(h, g, u, n);
}

extern "C" void hp_cuda_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n)
{
	if (n)
		k_swiglu_bwd<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(dg, du, dh, g, u, n);
}

extern "C" void hp_cuda_swiglu_rows_fwd(float *h, const float *gu, long rows, int I)
{
	size_t n = (size_t)(rows > 0 ? rows : 0) * (I > 0 ? I : 0);

	if (n)
		k_swiglu_rows_fwd<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(h, gu, rows, I);
}

extern "C" void hp_cuda_swiglu_rows_bwd(float *dgu, const float *dh, const float *gu, long rows, int I)
{
	size_t n = (size_t)(rows > 0 ? rows : 0) * (I > 0 ? I : 0);

	if (n)
		k_swiglu_rows_bwd<<<ew_blocks(n), EW_THREADS, 0, hp_cu_stream>>>(dgu, dh, gu, rows, I);
}
