/*
 * grouped.cu - the MoE experts' GEMMs, every expert in one launch: the
 * forward y = x W_x^T and the backward's dx = dy W_x and dW_x += dy_x^T x_x,
 * with each expert's rows [off[x], off[x+1]) read from device memory (the
 * routing table the GPU made; the host never waits for it).  bf16 operands,
 * fp32 sums on tensor cores (nvcuda::wmma, 16x16x16 bf16 fragments, sm_80+).
 *
 * What it is: a plain tiled GEMM, one 64x64 output tile per block of four
 * warps (each 32x32, four fragments), the operands staged through shared
 * memory 32 deep along the sum, two stages (the next tile is read into
 * registers while this one multiplies).  Tiles are loaded with bounds
 * checks, zero padding what lies outside the matrix, so any R, K and O
 * work; 16-byte loads where the rows allow them (a multiple of 8 bf16 and
 * aligned), element loads otherwise.  What it is not: cuBLASLt (gemm.cu,
 * which linear.cu still uses) nor a tuned kernel (no cp.async pipeline, no
 * swizzle, no split along the sum): it keeps an MoE step at one launch
 * per GEMM kind instead of one per expert.
 *
 * The forward and dx run blocks over (row tile, output column tile): the
 * row tiles of every expert in turn, at most ceil(R/64) + nx of them, each
 * block finding its expert and tile by a prefix sum of the experts' tile
 * counts (warp 0, from off); blocks past the last tile return.  dW runs
 * blocks over (K tile, O tile, expert), each looping over its expert's rows.
 *
 * Deterministic: every output element is one block's, summed over the
 * reduction in one fixed order (tile by tile, the tensor cores' order
 * within a tile), no atomics, no split; the same inputs give the same bits.
 * dx and y are written, dW added to, only once per element.
 */
#include <mma.h>
#include <type_traits>

#include "cuda/common.cuh"

using namespace nvcuda;

#define GM 64            /* output tile rows */
#define GN 64            /* output tile columns */
#define GK 32            /* the sum's tile depth */
#define GT 128           /* threads: four warps, 2 x 2 of 32x32 (the layout g_tile assumes) */
#define GPAD 8           /* bf16 of padding per staged row: 16 bytes, keeps wmma's alignment, spreads banks */
/* a staged tile, either way round: GM (= GN) rows of GK, or GK rows of GM */
#define GTILE (GM * (GK + GPAD) > GK * (GM + GPAD) ? GM * (GK + GPAD) : GK * (GM + GPAD))
#define GLDC (GN + 4)    /* the fp32 output tile's row, a multiple of 4 as store_matrix_sync needs */

/* the staged operand tiles, two stages; reused for the output tile once
 * the sum is done (20 KiB in all) */
union alignas(32) g_smem {
	struct {
		hp_bf16 a[2][GTILE];
		hp_bf16 b[2][GTILE];
	} t;
	float c[GM][GLDC];
};

/*
 * A TI x TJ tile of a row-major bf16 matrix, in storage order (TI rows, TJ
 * contiguous): p its first element, ld its row length, ni x nj the part of
 * it inside the matrix (zeros beyond; either may be <= 0).  Read as chunks
 * of 8, two per thread, into registers, then stored to shared memory rows
 * of TJ + GPAD.  vec: p and ld allow 16-byte loads.
 */
template <int TI, int TJ>
struct g_chunks {
	enum { N = TI * TJ / 8 / GT };
	uint4 v[N];

	__device__ __forceinline__ void fetch(const hp_bf16 *p, long ld, long ni, long nj, int vec)
	{
		for (int c = 0; c < N; c++) {
			int q = threadIdx.x + c * GT, i = q / (TJ / 8), j = q % (TJ / 8) * 8;
			if (i < ni && j + 8 <= nj && vec) {
				v[c] = *(const uint4 *)(p + i * ld + j);
			} else {
				unsigned w[4] = { 0, 0, 0, 0 };
				for (int u = 0; u < 8; u++)
					if (i < ni && j + u < nj)
						w[u >> 1] |= (unsigned)p[i * ld + j + u] << (16 * (u & 1));
				v[c].x = w[0];
				v[c].y = w[1];
				v[c].z = w[2];
				v[c].w = w[3];
			}
		}
	}

	__device__ __forceinline__ void store(hp_bf16 *s) const
	{
		for (int c = 0; c < N; c++) {
			int q = threadIdx.x + c * GT, i = q / (TJ / 8), j = q % (TJ / 8) * 8;
			*(uint4 *)(s + i * (TJ + GPAD) + j) = v[c];
		}
	}
};

/*
 * The block's 64x64 tile of C = A B over a sum of kred, into sm.c (row
 * major, GLDC).  A(m, k) is a[m*lda + k] (AT false) or a[k*lda + m] (AT
 * true), B(k, n) is b[k*ldb + n] (BT false) or b[n*ldb + k] (BT true), the
 * pointers at the tile's origin; mrows x ncols of the tile lie inside C.
 * Every thread of the block calls it (it has barriers).
 */
template <bool AT, bool BT>
static __device__ __forceinline__ void g_tile(g_smem &sm, const hp_bf16 *a, long lda, int va, const hp_bf16 *b,
					      long ldb, int vb, long mrows, long ncols, long kred)
{
	/* storage shapes: rows x contiguous, and the staged row lengths */
	enum { AI = AT ? GK : GM, AJ = AT ? GM : GK, BI = BT ? GN : GK, BJ = BT ? GK : GN };
	enum { ALD = AJ + GPAD, BLD = BJ + GPAD };
	typedef typename std::conditional<AT, wmma::col_major, wmma::row_major>::type a_lay;
	typedef typename std::conditional<BT, wmma::col_major, wmma::row_major>::type b_lay;
	wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, a_lay> fa[2];
	wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, b_lay> fb[2];
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
	g_chunks<AI, AJ> ra;
	g_chunks<BI, BJ> rb;
	int warp = threadIdx.x >> 5, wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
	long nk = (kred + GK - 1) / GK;

	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 2; j++)
			wmma::fill_fragment(acc[i][j], 0.0f);
	/* tile kt of A and B: where it starts, how much of it is inside */
	auto fetch = [&](long kt) {
		long k0 = kt * GK, kn = kred - k0;
		if (AT)
			ra.fetch(a + k0 * lda, lda, kn, mrows, va);
		else
			ra.fetch(a + k0, lda, mrows, kn, va);
		if (BT)
			rb.fetch(b + k0, ldb, ncols, kn, vb);
		else
			rb.fetch(b + k0 * ldb, ldb, kn, ncols, vb);
	};
	if (nk > 0) {
		fetch(0);
		ra.store(sm.t.a[0]);
		rb.store(sm.t.b[0]);
	}
	__syncthreads();
	for (long kt = 0; kt < nk; kt++) {
		const hp_bf16 *sa = sm.t.a[kt & 1], *sb = sm.t.b[kt & 1];
		if (kt + 1 < nk)
			fetch(kt + 1);   /* global loads in flight during the products */
		for (int ks = 0; ks < GK; ks += 16) {
			for (int i = 0; i < 2; i++) {
				int m = wm + 16 * i, n = wn + 16 * i;
				const hp_bf16 *pa = AT ? sa + ks * ALD + m : sa + m * ALD + ks;
				const hp_bf16 *pb = BT ? sb + n * BLD + ks : sb + ks * BLD + n;
				wmma::load_matrix_sync(fa[i], (const __nv_bfloat16 *)pa, ALD);
				wmma::load_matrix_sync(fb[i], (const __nv_bfloat16 *)pb, BLD);
			}
			for (int i = 0; i < 2; i++)
				for (int j = 0; j < 2; j++)
					wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
		}
		/* the other stage was last read before the previous barrier */
		if (kt + 1 < nk) {
			ra.store(sm.t.a[(kt + 1) & 1]);
			rb.store(sm.t.b[(kt + 1) & 1]);
		}
		__syncthreads();
	}
	/* the staged tiles are dead (the barrier above): the output tile reuses them */
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 2; j++)
			wmma::store_matrix_sync(&sm.c[wm + 16 * i][wn + 16 * j], acc[i][j], GLDC, wmma::mem_row_major);
	__syncthreads();
}

/*
 * Row tile b of the experts' row tiles taken in turn (expert x has
 * ceil(n_x / GM)): its expert, returned (-1: b is past the last tile), and
 * its rows [*m0, *m1) (*m1 the expert's end; the tile is the first GM of
 * them).  Warp 0 sums the experts' tile counts 32 at a time with
 * shuffles, stopping at the chunk that holds b; every thread of the block
 * calls it (a barrier) and gets the same answer.
 */
static __device__ __forceinline__ int g_find(const int32_t *off, int nx, long R, long b, long *m0, long *m1)
{
	__shared__ long s_m0, s_m1;
	__shared__ int s_x;

	if (threadIdx.x < 32) {
		int lane = threadIdx.x;
		long base = 0;
		if (lane == 0)
			s_x = -1;
		__syncwarp();
		for (int c = 0; c < nx; c += 32) {
			int x = c + lane;
			long r0 = 0, r1 = 0, n, inc;
			if (x < nx) {
				r0 = off[x] < R ? off[x] : R;
				r1 = off[x + 1] < R ? off[x + 1] : R;
			}
			n = r1 > r0 ? (r1 - r0 + GM - 1) / GM : 0;
			inc = n;
			for (int o = 1; o < 32; o <<= 1) {
				long v = __shfl_up_sync(0xffffffffu, inc, o);
				if (lane >= o)
					inc += v;
			}
			long ex = base + inc - n;   /* x's first tile */
			if (b >= ex && b < ex + n) {
				s_x = x;
				s_m0 = r0 + (b - ex) * GM;
				s_m1 = r1;
			}
			base += __shfl_sync(0xffffffffu, inc, 31);
			if (base > b)
				break;   /* the same for every lane */
		}
	}
	__syncthreads();
	*m0 = s_m0;
	*m1 = s_m1;
	return s_x;
}

/* y = x W_x^T (DX false) or dx = (accumulate ? dx : 0) + dy W_x (DX true),
 * the block's tile of one expert's rows: grid (row tiles, output tiles) */
template <bool DX>
static __global__ void __launch_bounds__(GT) k_grouped_rows(float *out, const hp_bf16 *a, const hp_bf16 *W, size_t ws,
							    const int32_t *off, int nx, long R, int K, int O,
							    int accumulate, int va, int vb)
{
	__shared__ g_smem sm;
	long m0, m1, n0 = (long)blockIdx.y * GN, nout = DX ? K : O;
	int x = g_find(off, nx, R, blockIdx.x, &m0, &m1);

	if (x < 0)
		return;
	const hp_bf16 *w = W + x * ws;
	if (DX)   /* A = dy [rows, O], B(o, k) = W[o, k] */
		g_tile<false, false>(sm, a + m0 * O, O, va, w + n0, K, vb, m1 - m0, K - n0, O);
	else      /* A = x [rows, K], B(k, o) = W[o, k] */
		g_tile<false, true>(sm, a + m0 * K, K, va, w + n0 * K, K, vb, m1 - m0, O - n0, K);
	float *o = out + m0 * nout + n0;
	for (int q = threadIdx.x; q < GM * GN; q += GT) {
		int i = q / GN, j = q % GN;
		if (i < m1 - m0 && n0 + j < nout) {
			float *d = o + i * nout + j;
			*d = DX && accumulate ? __fadd_rn(*d, sm.c[i][j]) : sm.c[i][j];
		}
	}
}

/* dW_x[o, k] += sum over x's rows r of dy[r, o] x[r, k]: grid (K tiles, O
 * tiles, experts), the sum over all of the expert's rows in one block */
static __global__ void __launch_bounds__(GT) k_grouped_dw(float *dW, size_t gs, const hp_bf16 *dy, const hp_bf16 *X,
							  const int32_t *off, long R, int K, int O, int va, int vb)
{
	__shared__ g_smem sm;
	int x = blockIdx.z;
	long r0 = off[x] < R ? off[x] : R, r1 = off[x + 1] < R ? off[x + 1] : R;
	long m0 = (long)blockIdx.y * GM, n0 = (long)blockIdx.x * GN;

	if (r1 <= r0)
		return;   /* no rows: nothing added */
	/* A(o, r) = dy[r, o] (stored along o), B(r, k) = x[r, k] */
	g_tile<true, false>(sm, dy + r0 * O + m0, O, va, X + r0 * K + n0, K, vb, O - m0, K - n0, r1 - r0);
	float *d = dW + x * gs + m0 * K + n0;
	for (int q = threadIdx.x; q < GM * GN; q += GT) {
		int i = q / GN, j = q % GN;
		if (m0 + i < O && n0 + j < K)
			d[i * K + j] = __fadd_rn(d[i * K + j], sm.c[i][j]);
	}
}

/* 16-byte loads of rows of ld bf16 from p, each expert ws further on */
static int g_vec(const void *p, long ld, size_t ws)
{
	return (uintptr_t)p % 16 == 0 && ld % 8 == 0 && ws % 8 == 0;
}

/* the row tiles' grid: at most one partial tile per expert beyond R's */
static unsigned g_row_tiles(long R, int nx)
{
	return (unsigned)((R + GM - 1) / GM + nx);
}

extern "C" int hp_cuda_grouped_fwd(float *y, const hp_bf16 *x, const hp_bf16 *W, size_t ws, const int32_t *off, int nx,
				   long R, int K, int O, struct hp_err *e)
{
	if (R <= 0 || nx <= 0 || O <= 0)
		return 0;
	if (K < 0)
		K = 0;   /* an empty sum: y = 0 on the experts' rows */
	dim3 grid(g_row_tiles(R, nx), (unsigned)((O + GN - 1) / GN));
	k_grouped_rows<false><<<grid, GT, 0, hp_cu_stream>>>(y, x, W, ws, off, nx, R, K, O, 0, g_vec(x, K, 0),
							     g_vec(W, K, ws));
	CK(cudaGetLastError());
	return 0;
}

extern "C" int hp_cuda_grouped_bwd(float *dx, float *dW, size_t gs, const hp_bf16 *dy, const hp_bf16 *x,
				   const hp_bf16 *W, size_t ws, const int32_t *off, int nx, long R, int K, int O,
				   int accumulate, struct hp_err *e)
{
	if (R <= 0 || nx <= 0 || K <= 0)
		return 0;
	/* dx = dy W (+ dx); no O is an empty sum: dx = 0 on the experts' rows, or as it was */
	if (dx && (O > 0 || !accumulate)) {
		int Os = O > 0 ? O : 0;
		dim3 grid(g_row_tiles(R, nx), (unsigned)((K + GN - 1) / GN));
		k_grouped_rows<true><<<grid, GT, 0, hp_cu_stream>>>(dx, dy, W, ws, off, nx, R, K, Os, accumulate,
								    g_vec(dy, Os, 0), g_vec(W, K, ws));
	}
	if (dW && O > 0) {
		dim3 grid((unsigned)((K + GN - 1) / GN), (unsigned)((O + GM - 1) / GM), (unsigned)nx);
		k_grouped_dw<<<grid, GT, 0, hp_cu_stream>>>(dW, gs, dy, x, off, R, K, O, g_vec(dy, O, 0), g_vec(x, K, 0));
	}
	CK(cudaGetLastError());
	return 0;
}
