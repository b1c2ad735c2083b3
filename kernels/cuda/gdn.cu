/*
 * gdn.cu - Qwen3-Next's and Qwen3.5's kernels on the GPU: the causal
 * depthwise conv1d with SiLU, the L2 norm of q and k, the delta rule's
 * gates, the chunked gated delta rule forward and backward, the gated
 * RMSNorm and the sigmoid gates of gated attention and the shared expert.
 *
 * The arithmetic is the CPU's (kernels/cpu/gdn.c and deltanet.c, whose
 * opening comments give every formula and where transformers computes
 * it): the same float operations in the same order wherever one thread
 * computes an element, products and sums rounded apart (__fmul_rn,
 * __fadd_rn: no fused multiply-adds), sums over tokens in double.  What
 * differs from the CPU: the device's expf, exp and log1pf, and the order
 * of a few sums that many threads share (over tokens for dw, dA_log,
 * dt_bias; over a chunk's pairs for the delta rule's dgamma), which are
 * fixed here, so every run gives the same bits.
 *
 * The delta rule: one block of GDR_THREADS threads per (batch row, value
 * head) in the forward, and per (batch row, key head) in the backward,
 * whose value heads run one after another adding into dq and dk, as the
 * CPU's threads do.  A block walks its row's chunks of 64 tokens (cut at
 * document starts) with the state S [Dk, Dv] and its chunk's matrices in
 * global memory, its own part of the caller's scratch (gws_floats floats
 * of the unit it is given), and the small vectors in shared memory.  Each
 * step is a loop of the block's threads over a matrix's elements, each
 * element one thread's chain of adds, then a barrier.  Parallelism is B
 * Hv (forward) and B Hk (backward) blocks; a faster kernel would split the
 * state's Dv columns over blocks (they are independent given k, g and
 * beta) and keep tiles in shared memory.
 *
 * t/unit/test-cuda.c holds each kernel to the CPU's, on a GPU and under
 * the emulation of t/cuemu.
 */
#include "cuda/common.cuh"

#define GDN_THREADS 256
#define gdn_blocks(n) hp_cu_blocks((n), GDN_THREADS)

/* acc += a b, rounded apart (the CPU's -ffp-contract=off); DMAC in double,
 * where a float times a double is not exact and nvcc would fuse them */
#define MAC(acc, a, b) ((acc) = __fadd_rn((acc), __fmul_rn((a), (b))))
#define DMAC(acc, a, b) ((acc) = __dadd_rn((acc), __dmul_rn((a), (b))))

/* sigmoid(x), and with sigmoid(-x) from the same exp (common.cuh) */
#define sig2 hp_cu_sig2
#define sigm hp_cu_sigmoid

/* torch's softplus, beta 1, threshold 20 */
static __device__ __forceinline__ float softplus_f(float u)
{
	return u > 20.0f ? u : log1pf(expf(u));
}

/* x.y in double as deltanet.c's dotd: four lanes (element i in lane i % 4)
 * added as (0 + 2) + (1 + 3), then the tail */
static __device__ double dotd4(const float *x, const float *y, long n)
{
	double a0 = 0, a1 = 0, a2 = 0, a3 = 0, s = 0;
	long i = 0;

	for (; i + 4 <= n; i += 4) {
		a0 += (double)x[i] * y[i];
		a1 += (double)x[i + 1] * y[i + 1];
		a2 += (double)x[i + 2] * y[i + 2];
		a3 += (double)x[i + 3] * y[i + 3];
	}
	for (; i < n; i++)
		s += (double)x[i] * y[i];
	return (a0 + a2) + (a1 + a3) + s;
}

/* x.y in float, n ascending from 0 (the CPU's mm for one element) */
static __device__ float fdot(const float *x, const float *y, long n)
{
	float acc = 0.0f;

	for (long i = 0; i < n; i++)
		MAC(acc, x[i], y[i]);
	return acc;
}

/* ---- causal depthwise conv1d + SiLU ---------------------------------- */

/* the first tap of token i (position p in its row) inside its row and document */
static __device__ int conv_j0(const int32_t *seg, long i, long p, int K)
{
	long lo = seg && seg[i] > 0 ? seg[i] : 0;
	long j0 = lo - (p - (K - 1));

	if (j0 < 0)
		j0 = 0;
	return j0 > K ? K : (int)j0;
}

/* token i's pre-activation in channel c (taps j0 .. K-1, ascending) */
static __device__ float conv_pre(const float *x, const float *w, long i, int c, int C, int j0, int K)
{
	float acc = 0.0f;

	for (int j = j0; j < K; j++)
		MAC(acc, w[(long)c * K + j], x[(i - (K - 1) + j) * C + c]);
	return acc;
}

/* silu'(pre) dy */
static __device__ float conv_dpre(float dy, float pre)
{
	float s, sm;

	sig2(pre, &s, &sm);
	return __fmul_rn(dy, __fadd_rn(s, __fmul_rn(pre, __fmul_rn(s, sm))));
}

static __global__ void k_conv_fwd(float *y, const float *x, const float *w, const int32_t *seg, int T, int C, int K,
				  size_t total)
{
	HP_CU_GRID_STRIDE(idx, total) {
		long i = (long)(idx / C);
		int c = (int)(idx % C);
		float pre = conv_pre(x, w, i, c, C, conv_j0(seg, i, i % T, K), K);

		y[idx] = __fmul_rn(pre, sigm(pre));
	}
}

/* dx[s, c]: the terms of tokens s, s+1, .. s+K-1 of its row whose window
 * holds s, in that order (the CPU's scatter adds them so) */
static __global__ void k_conv_bwd_dx(float *dx, const float *dy, const float *x, const float *w, const int32_t *seg,
				     int T, int C, int K, size_t total)
{
	HP_CU_GRID_STRIDE(idx, total) {
		long s = (long)(idx / C);
		int c = (int)(idx % C);
		long end = s - s % T + T;
		float acc = 0.0f;

		for (long t = s; t < s + K && t < end; t++) {
			int j = (int)(s - t + K - 1), j0 = conv_j0(seg, t, t % T, K);

			if (j < j0)
				continue;
			float pre = conv_pre(x, w, t, c, C, j0, K);
			MAC(acc, w[(long)c * K + j], conv_dpre(dy[t * C + c], pre));
		}
		dx[idx] = acc;
	}
}

/* dw[c, j] += the sum over every token, in order, in double */
static __global__ void k_conv_bwd_dw(float *dw, const float *dy, const float *x, const float *w, const int32_t *seg,
				     long N, int T, int C, int K)
{
	HP_CU_GRID_STRIDE(idx, (size_t)C * K) {
		int c = (int)(idx / K), j = (int)(idx % K);
		double acc = 0;

		for (long i = 0; i < N; i++) {
			int j0 = conv_j0(seg, i, i % T, K);

			if (j < j0)
				continue;
			float pre = conv_pre(x, w, i, c, C, j0, K);
			acc += (double)conv_dpre(dy[i * C + c], pre) * x[(i - (K - 1) + j) * C + c];
		}
		dw[idx] += (float)acc;
	}
}

extern "C" void hp_cuda_conv1d_silu_fwd(float *y, const float *x, const float *w, const int32_t *seg, int B, int T,
					int C, int K)
{
	size_t n = (size_t)(B > 0 ? B : 0) * (T > 0 ? T : 0) * (C > 0 ? C : 0);

	if (n && K > 0)
		k_conv_fwd<<<gdn_blocks(n), GDN_THREADS, 0, hp_cu_stream>>>(y, x, w, seg, T, C, K, n);
}

extern "C" void hp_cuda_conv1d_silu_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
					const int32_t *seg, int B, int T, int C, int K)
{
	size_t n = (size_t)(B > 0 ? B : 0) * (T > 0 ? T : 0) * (C > 0 ? C : 0);

	if (!n || K < 1)
		return;
	k_conv_bwd_dx<<<gdn_blocks(n), GDN_THREADS, 0, hp_cu_stream>>>(dx, dy, x, w, seg, T, C, K, n);
	k_conv_bwd_dw<<<gdn_blocks((size_t)C * K), GDN_THREADS, 0, hp_cu_stream>>>(dw, dy, x, w, seg, (long)B * T,
										      T, C, K);
}

/* ---- l2norm: one thread per row ------------------------------------- */

static __global__ void k_l2_fwd(float *y, float *rinv, const float *x, long N, int D)
{
	HP_CU_GRID_STRIDE(n, (size_t)N) {
		const float *xr = x + n * D;
		float r = (float)(1.0 / sqrt(dotd4(xr, xr, D) + 1e-6));

		rinv[n] = r;
		for (int i = 0; i < D; i++)
			y[n * D + i] = __fmul_rn(xr[i], r);
	}
}

static __global__ void k_l2_bwd(float *dx, const float *dy, const float *y, const float *rinv, long N, int D)
{
	HP_CU_GRID_STRIDE(n, (size_t)N) {
		const float *yr = y + n * D, *dr = dy + n * D;
		float yd = (float)dotd4(yr, dr, D), r = rinv[n];

		for (int i = 0; i < D; i++)
			dx[n * D + i] = __fmul_rn(r, __fsub_rn(dr[i], __fmul_rn(yr[i], yd)));
	}
}

extern "C" void hp_cuda_l2norm_fwd(float *y, float *rinv, const float *x, long N, int D)
{
	if (N > 0 && D > 0)
		k_l2_fwd<<<gdn_blocks((size_t)N), GDN_THREADS, 0, hp_cu_stream>>>(y, rinv, x, N, D);
}

extern "C" void hp_cuda_l2norm_bwd(float *dx, const float *dy, const float *y, const float *rinv, long N, int D)
{
	if (N > 0 && D > 0)
		k_l2_bwd<<<gdn_blocks((size_t)N), GDN_THREADS, 0, hp_cu_stream>>>(dx, dy, y, rinv, N, D);
}

/* ---- the delta rule's gates ----------------------------------------- */

static __global__ void k_gates_fwd(float *beta, float *g, const float *b, const float *a, const float *A_log,
				   const float *dt_bias, int H, size_t total)
{
	HP_CU_GRID_STRIDE(i, total) {
		int h = (int)(i % H);

		beta[i] = sigm(b[i]);
		g[i] = __fmul_rn(-expf(A_log[h]), softplus_f(__fadd_rn(a[i], dt_bias[h])));
	}
}

static __global__ void k_gates_bwd(float *db, float *da, const float *dbeta, const float *dg, const float *b,
				   const float *a, const float *A_log, const float *dt_bias, int H, size_t total)
{
	HP_CU_GRID_STRIDE(i, total) {
		int h = (int)(i % H);
		float s, sm, u = __fadd_rn(a[i], dt_bias[h]);

		sig2(b[i], &s, &sm);
		db[i] = __fmul_rn(dbeta[i], __fmul_rn(s, sm));
		da[i] = __fmul_rn(__fmul_rn(dg[i], -expf(A_log[h])), u > 20.0f ? 1.0f : sigm(u));
	}
}

/* one block per head: dA_log += sum dg g, ddt_bias += sum da over the
 * tokens, each thread a strided run of them, then a fixed tree */
static __global__ void k_gates_bwd_heads(float *dA_log, float *ddt_bias, const float *da, const float *dg,
					 const float *a, const float *A_log, const float *dt_bias, long N, int H)
{
	__shared__ double sh[32];
	int h = blockIdx.x;
	float nA = -expf(A_log[h]);
	double sA = 0, sdt = 0;

	for (long n = threadIdx.x; n < N; n += blockDim.x) {
		long i = n * H + h;

		sdt += da[i];
		sA += (double)dg[i] * __fmul_rn(nA, softplus_f(__fadd_rn(a[i], dt_bias[h])));
	}
	sA = block_sum(sA, sh);
	sdt = block_sum(sdt, sh);
	if (threadIdx.x == 0) {
		dA_log[h] += (float)sA;
		ddt_bias[h] += (float)sdt;
	}
}

extern "C" void hp_cuda_gdn_gates_fwd(float *beta, float *g, const float *b, const float *a, const float *A_log,
				      const float *dt_bias, long N, int H)
{
	size_t n = (size_t)(N > 0 ? N : 0) * (H > 0 ? H : 0);

	if (n)
		k_gates_fwd<<<gdn_blocks(n), GDN_THREADS, 0, hp_cu_stream>>>(beta, g, b, a, A_log, dt_bias, H, n);
}

extern "C" void hp_cuda_gdn_gates_bwd(float *db, float *da, float *dA_log, float *ddt_bias, const float *dbeta,
				      const float *dg, const float *b, const float *a, const float *A_log,
				      const float *dt_bias, long N, int H)
{
	size_t n = (size_t)(N > 0 ? N : 0) * (H > 0 ? H : 0);

	if (!n)
		return;
	k_gates_bwd<<<gdn_blocks(n), GDN_THREADS, 0, hp_cu_stream>>>(db, da, dbeta, dg, b, a, A_log, dt_bias, H, n);
	k_gates_bwd_heads<<<H, GDN_THREADS, 0, hp_cu_stream>>>(dA_log, ddt_bias, da, dg, a, A_log, dt_bias, N, H);
}

/* ---- Qwen3NextRMSNormGated: one thread per row, a block per dw column ---- */

static __global__ void k_rmsg_fwd(float *y, float *rstd, const float *x, const float *z, const float *w, long N,
				  int D, float eps)
{
	HP_CU_GRID_STRIDE(n, (size_t)N) {
		const float *xr = x + n * D, *zr = z + n * D;
		double ss = 0;

		for (int c = 0; c < D; c++)
			ss += (double)xr[c] * xr[c];
		float r = (float)(1.0 / sqrt(ss / D + eps));

		rstd[n] = r;
		for (int c = 0; c < D; c++)
			y[n * D + c] = __fmul_rn(__fmul_rn(w[c], __fmul_rn(xr[c], r)), __fmul_rn(zr[c], sigm(zr[c])));
	}
}

static __global__ void k_rmsg_bwd_rows(float *dx, float *dz, const float *dy, const float *x, const float *z,
				       const float *w, const float *rstd, long N, int D)
{
	HP_CU_GRID_STRIDE(n, (size_t)N) {
		const float *xr = x + n * D, *zr = z + n * D, *dyr = dy + n * D;
		float r = rstd[n];
		double dot = 0;

		for (int c = 0; c < D; c++) {
			float s, sm, xh = __fmul_rn(xr[c], r);

			sig2(zr[c], &s, &sm);
			float dn = __fmul_rn(__fmul_rn(dyr[c], __fmul_rn(zr[c], s)), w[c]);

			dot += (double)dn * xh;
			dz[n * D + c] = __fmul_rn(__fmul_rn(dyr[c], __fmul_rn(w[c], xh)),
						  __fadd_rn(s, __fmul_rn(zr[c], __fmul_rn(s, sm))));
		}
		float mean = (float)(dot / D);

		for (int c = 0; c < D; c++) {
			float xh = __fmul_rn(xr[c], r);
			float dn = __fmul_rn(__fmul_rn(dyr[c], __fmul_rn(zr[c], sigm(zr[c]))), w[c]);

			dx[n * D + c] = __fmul_rn(r, __fsub_rn(dn, __fmul_rn(xh, mean)));
		}
	}
}

static __global__ void k_rmsg_bwd_dw(float *dw, const float *dy, const float *x, const float *z, const float *rstd,
				     long N, int D)
{
	__shared__ double sh[32];
	int c = blockIdx.x;
	double s = 0;

	for (long n = threadIdx.x; n < N; n += blockDim.x) {
		float zc = z[n * D + c];

		s += (double)__fmul_rn(dy[n * D + c], __fmul_rn(zc, sigm(zc))) * __fmul_rn(x[n * D + c], rstd[n]);
	}
	s = block_sum(s, sh);
	if (threadIdx.x == 0)
		dw[c] += (float)s;
}

extern "C" void hp_cuda_rmsnorm_gated_fwd(float *y, float *rstd, const float *x, const float *z, const float *w,
					  long N, int D, float eps)
{
	if (N > 0 && D > 0)
		k_rmsg_fwd<<<gdn_blocks((size_t)N), GDN_THREADS, 0, hp_cu_stream>>>(y, rstd, x, z, w, N, D, eps);
}

extern "C" void hp_cuda_rmsnorm_gated_bwd(float *dx, float *dz, float *dw, const float *dy, const float *x,
					  const float *z, const float *w, const float *rstd, long N, int D)
{
	if (N <= 0 || D <= 0)
		return;
	k_rmsg_bwd_rows<<<gdn_blocks((size_t)N), GDN_THREADS, 0, hp_cu_stream>>>(dx, dz, dy, x, z, w, rstd, N, D);
	k_rmsg_bwd_dw<<<D, GDN_THREADS, 0, hp_cu_stream>>>(dw, dy, x, z, rstd, N, D);
}

/* ---- sigmoid gates -------------------------------------------------- */

/* y = x sigmoid(gate), the gate one a value (C 1: per element) or one a row of C */
static __global__ void k_sg_fwd(float *y, const float *x, const float *gate, int C, size_t total)
{
	HP_CU_GRID_STRIDE(i, total)
		y[i] = __fmul_rn(x[i], sigm(gate[i / C]));
}

static __global__ void k_sg_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate,
				size_t total)
{
	HP_CU_GRID_STRIDE(i, total) {
		float s, sm, d = dy[i];

		sig2(gate[i], &s, &sm);
		dx[i] = __fmul_rn(d, s);
		dgate[i] = __fmul_rn(__fmul_rn(d, x[i]), __fmul_rn(s, sm));
	}
}

/* one thread per row: dx = dy s, dgate = (dy . x) s (1 - s) */
static __global__ void k_sgr_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate,
				 long T, int C)
{
	HP_CU_GRID_STRIDE(t, (size_t)T) {
		float s, sm;
		double dot = 0;

		sig2(gate[t], &s, &sm);
		for (int c = 0; c < C; c++) {
			float d = dy[t * C + c];

			dot += (double)d * x[t * C + c];
			dx[t * C + c] = __fmul_rn(d, s);
		}
		dgate[t] = __fmul_rn((float)dot, __fmul_rn(s, sm));
	}
}

extern "C" void hp_cuda_sigmoid_gate_fwd(float *y, const float *x, const float *gate, long n)
{
	if (n > 0)
		k_sg_fwd<<<gdn_blocks((size_t)n), GDN_THREADS, 0, hp_cu_stream>>>(y, x, gate, 1, (size_t)n);
}

extern "C" void hp_cuda_sigmoid_gate_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate,
					 long n)
{
	if (n > 0)
		k_sg_bwd<<<gdn_blocks((size_t)n), GDN_THREADS, 0, hp_cu_stream>>>(dx, dgate, dy, x, gate, (size_t)n);
}

extern "C" void hp_cuda_sigmoid_gate_rows_fwd(float *y, const float *x, const float *gate, long T, int C)
{
	size_t n = (size_t)(T > 0 ? T : 0) * (C > 0 ? C : 0);

	if (n)
		k_sg_fwd<<<gdn_blocks(n), GDN_THREADS, 0, hp_cu_stream>>>(y, x, gate, C, n);
}

extern "C" void hp_cuda_sigmoid_gate_rows_bwd(float *dx, float *dgate, const float *dy, const float *x,
					      const float *gate, long T, int C)
{
	if (T > 0 && C > 0)
		k_sgr_bwd<<<gdn_blocks((size_t)T), GDN_THREADS, 0, hp_cu_stream>>>(dx, dgate, dy, x, gate, T, C);
}

/* ---- the chunked gated delta rule ----------------------------------- */

#define CH HP_CUDA_GDR_CHUNK
#define GDR_THREADS 256

struct gdr_args {
	float *out, *saved, *scratch, *dq, *dk, *dv, *dg, *dbeta;
	const float *q, *k, *v, *g, *beta, *dout, *saved_in;
	const int32_t *seg;
	size_t unit;
	int B, T, Hv, Hk, Dk, Dv;
	float scale;
};

/* One block's working set in global memory (the forward uses a part).
 * [CH, Dk]: Q (scale q), K, Kh, Kx, Kq, dq, dk (the chunk's), Y;
 * [CH, Dv]: V, Vt (v - e^gamma S0^T k), U, dO, dR;
 * [CH, CH]: A (-A, strictly lower), KK, E, G, P, W; [Dk, Dv]: S, dS. */
struct gdr_ws {
	float *Q, *K, *Kh, *Kx, *Kq, *dq, *dk, *Y;
	float *V, *Vt, *U, *dO, *dR;
	float *A, *KK, *E, *G, *P, *W;
	float *S, *dS;
};

static size_t gws_floats(int Dk, int Dv)
{
	return (size_t)8 * CH * Dk + (size_t)5 * CH * Dv + (size_t)6 * CH * CH + (size_t)2 * Dk * Dv;
}

static __device__ void ws_carve(struct gdr_ws *w, float *p, int Dk, int Dv)
{
	float **fk[] = { &w->Q, &w->K, &w->Kh, &w->Kx, &w->Kq, &w->dq, &w->dk, &w->Y };
	float **fv[] = { &w->V, &w->Vt, &w->U, &w->dO, &w->dR };
	float **fc[] = { &w->A, &w->KK, &w->E, &w->G, &w->P, &w->W };

	for (int i = 0; i < 8; i++, p += (size_t)CH * Dk)
		*fk[i] = p;
	for (int i = 0; i < 5; i++, p += (size_t)CH * Dv)
		*fv[i] = p;
	for (int i = 0; i < 6; i++, p += (size_t)CH * CH)
		*fc[i] = p;
	w->S = p;
	w->dS = p + (size_t)Dk * Dv;
}

/* the block's small vectors */
struct gdr_sh {
	double gam[CH], dgam[CH], dbeta[CH], xs[CH], red[32];
	float g[CH], beta[CH], eg[CH], el[CH];
	int starts[CH + 1], ns;
};

#define TID ((int)threadIdx.x)
#define NT ((int)blockDim.x)
/* x over [0, n) split over the block's threads */
#define BLOCK_LOOP(x, n) for (long x = TID; x < (long)(n); x += NT)

static __device__ int doc_start(const int32_t *seg, int b, int T, int t)
{
	return t == 0 || (seg && seg[(long)b * T + t] == t);
}

static __device__ int next_start(const int32_t *seg, int b, int T, int s, int e)
{
	if (seg)
		for (int t = s + 1; t < e; t++)
			if (seg[(long)b * T + t] == t)
				return t;
	return e;
}

/* x . S[:, j] for a row x of Dk and S [Dk, Dv], d ascending from 0 */
static __device__ float row_by_col(const float *x, const float *S, int Dk, int Dv, long j)
{
	float acc = 0.0f;

	for (int d = 0; d < Dk; d++)
		MAC(acc, x[d], S[(long)d * Dv + j]);
	return acc;
}

static __device__ void fill(float *p, long n, float v)
{
	BLOCK_LOOP(x, n)
		p[x] = v;
}

/* Chunk [s, s + L) of (b, value head h): its inputs, gamma and the decays,
 * E, KK and -A (strictly lower), G = Q K^T and P = E G (lower), Vt and U
 * solved from (I + A) U = beta Vt (S0 = w->S).  Ends at a barrier. */
static __device__ void chunk_prep(const struct gdr_args *a, struct gdr_ws *w, struct gdr_sh *sh, int b, int h, int s,
				  int L)
{
	int Dk = a->Dk, Dv = a->Dv, hk = h / (a->Hv / a->Hk);

	BLOCK_LOOP(x, (long)L * Dk) {
		long i = x / Dk, d = x % Dk, n = (long)b * a->T + s + i;

		w->Q[i * Dk + d] = __fmul_rn(a->scale, a->q[(n * a->Hk + hk) * Dk + d]);
		w->K[i * Dk + d] = a->k[(n * a->Hk + hk) * Dk + d];
	}
	BLOCK_LOOP(x, (long)L * Dv) {
		long i = x / Dv, j = x % Dv, n = (long)b * a->T + s + i;

		w->V[i * Dv + j] = a->v[(n * a->Hv + h) * Dv + j];
	}
	BLOCK_LOOP(i, L) {
		long n = (long)b * a->T + s + i;

		sh->g[i] = a->g[n * a->Hv + h];
		sh->beta[i] = a->beta[n * a->Hv + h];
	}
	__syncthreads();
	if (TID == 0) {
		double gm = 0;

		for (int i = 0; i < L; i++) {
			gm += sh->g[i];
			sh->gam[i] = gm;
			sh->eg[i] = (float)exp(gm);
		}
	}
	__syncthreads();
	BLOCK_LOOP(i, L)
		sh->el[i] = (float)exp(sh->gam[L - 1] - sh->gam[i]);
	BLOCK_LOOP(x, (long)L * L) {
		int i = (int)(x / L), j = (int)(x % L);
		float kk = 0.0f, gq = 0.0f, e = 0.0f;

		if (j <= i) {
			e = (float)exp(sh->gam[i] - sh->gam[j]);
			kk = fdot(w->K + (long)i * Dk, w->K + (long)j * Dk, Dk);
			gq = fdot(w->Q + (long)i * Dk, w->K + (long)j * Dk, Dk);
		}
		w->E[i * CH + j] = e;
		w->KK[i * CH + j] = kk;
		w->G[i * CH + j] = gq;
		w->A[i * CH + j] = j < i ? -__fmul_rn(__fmul_rn(sh->beta[i], e), kk) : 0.0f;
		w->P[i * CH + j] = j <= i ? __fmul_rn(e, gq) : 0.0f;
	}
	/* Vt = V - e^gamma (K S0), U = beta Vt */
	BLOCK_LOOP(x, (long)L * Dv) {
		long i = x / Dv, j = x % Dv;
		float vt = __fsub_rn(w->V[x], __fmul_rn(sh->eg[i], row_by_col(w->K + i * Dk, w->S, Dk, Dv, j)));

		w->Vt[x] = vt;
		w->U[x] = __fmul_rn(sh->beta[i], vt);
	}
	__syncthreads();
	/* (I + A) U = R by forward substitution, a thread a column */
	for (int j = TID; j < Dv; j += NT)
		for (int i = 1; i < L; i++) {
			float u = w->U[(long)i * Dv + j];

			for (int m = 0; m < i; m++)
				MAC(u, w->A[i * CH + m], w->U[(long)m * Dv + j]);
			w->U[(long)i * Dv + j] = u;
		}
	__syncthreads();
}

/* One chunk's outputs, and w->S from S0 to S_end. */
static __device__ void chunk_fwd(const struct gdr_args *a, struct gdr_ws *w, struct gdr_sh *sh, int b, int h, int s,
				 int L)
{
	int Dk = a->Dk, Dv = a->Dv;

	chunk_prep(a, w, sh, b, h, s, L);
	/* O = diag(e^gamma) Q S0 + P U; Kh_j = e^(gamma_L - gamma_j) k_j */
	BLOCK_LOOP(x, (long)L * Dv) {
		long i = x / Dv, j = x % Dv;
		float o = __fmul_rn(row_by_col(w->Q + i * Dk, w->S, Dk, Dv, j), sh->eg[i]);

		for (long m = 0; m <= i; m++)
			MAC(o, w->P[i * CH + m], w->U[m * Dv + j]);
		a->out[(((long)b * a->T + s + i) * a->Hv + h) * Dv + j] = o;
	}
	BLOCK_LOOP(x, (long)L * Dk)
		w->Kh[x] = __fmul_rn(sh->el[x / Dk], w->K[x]);
	__syncthreads();
	/* S_end = e^gamma_L S0 + Kh^T U */
	BLOCK_LOOP(x, (long)Dk * Dv) {
		long d = x / Dv, j = x % Dv;
		float acc = __fmul_rn(w->S[x], sh->eg[L - 1]);

		for (int m = 0; m < L; m++)
			MAC(acc, w->Kh[(long)m * Dk + d], w->U[(long)m * Dv + j]);
		w->S[x] = acc;
	}
	__syncthreads();
}

static __global__ void __launch_bounds__(GDR_THREADS) k_gdr_fwd(struct gdr_args a)
{
	__shared__ struct gdr_sh sh;
	struct gdr_ws w;
	int b = blockIdx.x / a.Hv, h = blockIdx.x % a.Hv, T = a.T, nblk = (T + CH - 1) / CH;
	long DD = (long)a.Dk * a.Dv;

	ws_carve(&w, a.scratch + (size_t)blockIdx.x * a.unit, a.Dk, a.Dv);
	for (int c = 0; c < nblk; c++) {   /* token 0 starts a document: S is zeroed there */
		int t0 = c * CH, t1 = t0 + CH < T ? t0 + CH : T;

		for (int s = t0, e; s < t1; s = e) {
			e = next_start(a.seg, b, T, s, t1);
			if (doc_start(a.seg, b, T, s))
				fill(w.S, DD, 0.0f);
			__syncthreads();
			if (s == t0 && a.saved)
				BLOCK_LOOP(x, DD)
					a.saved[(((size_t)b * a.Hv + h) * nblk + c) * DD + x] = w.S[x];
			chunk_fwd(&a, &w, &sh, b, h, s, e - s);
		}
	}
}

/* out [L, Dk] = X [L, Dv] M^T (M [Dk, Dv]): out_id = X_i . M_d, v ascending */
static __device__ void rows_by_t(float *out, const float *X, const float *M, int L, int Dk, int Dv)
{
	BLOCK_LOOP(x, (long)L * Dk)
		out[x] = fdot(X + x / Dk * Dv, M + x % Dk * Dv, Dv);
}

/* sum_{j<i} W_ij X_ij in double, j ascending (W, X [CH, CH]) */
static __device__ double tri_row(const float *W, const float *X, int i)
{
	double r = 0;

	for (int j = 0; j < i; j++)
		r += (double)W[i * CH + j] * X[i * CH + j];
	return r;
}

/* gamma_i's share of sum_{j<i} W_ij X_ij (added at i, taken at j): the
 * row's sum less the column's, in that order */
static __device__ double tri_net(const float *W, const float *X, int i, int L)
{
	double r = tri_row(W, X, i);

	for (int m = i + 1; m < L; m++)
		r -= (double)W[m * CH + i] * X[m * CH + i];
	return r;
}

/*
 * The backward of one chunk (deltanet.c's chunk_bwd, term by term): w->S
 * holds S0, w->dS dL/dS_end on entry and dL/dS0 on return; dq, dk of the
 * chunk added into the outputs, dv, dg, dbeta written.  Each of dgamma
 * and dbeta's entries is added to by one thread.
 */
static __device__ void chunk_bwd(const struct gdr_args *a, struct gdr_ws *w, struct gdr_sh *sh, int b, int h, int s,
				 int L)
{
	int Dk = a->Dk, Dv = a->Dv, hk = h / (a->Hv / a->Hk);
	long DD = (long)Dk * Dv;

	chunk_prep(a, w, sh, b, h, s, L);
	BLOCK_LOOP(x, (long)L * Dv) {
		long i = x / Dv, n = (long)b * a->T + s + i;

		w->dO[x] = a->dout[(n * a->Hv + h) * Dv + x % Dv];
	}
	BLOCK_LOOP(i, L)
		sh->dgam[i] = sh->dbeta[i] = 0;
	BLOCK_LOOP(x, (long)L * Dk)
		w->Kh[x] = __fmul_rn(sh->el[x / Dk], w->K[x]);
	__syncthreads();

	/* dU = P^T dO + Kh dS, into dR */
	BLOCK_LOOP(x, (long)L * Dv) {
		long i = x / Dv, j = x % Dv;
		float acc = 0.0f;

		for (long m = i; m < L; m++)
			MAC(acc, w->P[m * CH + i], w->dO[m * Dv + j]);
		for (int d = 0; d < Dk; d++)
			MAC(acc, w->Kh[i * Dk + d], w->dS[(long)d * Dv + j]);
		w->dR[x] = acc;
	}
	/* Z_j = dS u_j (in Y); <S0, dS> for gamma_L */
	rows_by_t(w->Y, w->U, w->dS, L, Dk, Dv);
	double sd = 0;
	BLOCK_LOOP(x, DD)
		sd += (double)w->S[x] * w->dS[x];
	sd = block_sum(sd, sh->red);   /* has barriers: the writes above are done */
	/* the transposed solve (I + A)^T dR = dU, a thread a column, in
	 * deltanet.c's order: the rows past i's block of four, then those in it */
	for (int j = TID; j < Dv; j += NT)
		for (int i = L - 1; i >= 0; i--) {
			int i0 = i / 4 * 4, e0 = i0 + 4 < L ? i0 + 4 : L;
			float r = w->dR[(long)i * Dv + j];

			for (int m = e0; m < L; m++)
				MAC(r, w->A[m * CH + i], w->dR[(long)m * Dv + j]);
			for (int m = i + 1; m < e0; m++)
				MAC(r, w->A[m * CH + i], w->dR[(long)m * Dv + j]);
			w->dR[(long)i * Dv + j] = r;
		}
	BLOCK_LOOP(j, L)
		sh->xs[j] = sh->el[j] * dotd4(w->K + j * Dk, w->Y + j * Dk, Dk);
	BLOCK_LOOP(x, (long)L * Dk)
		w->dk[x] = __fmul_rn(sh->el[x / Dk], w->Y[x]);
	__syncthreads();
	if (TID == 0) {
		DMAC(sh->dgam[L - 1], sh->eg[L - 1], sd);
		for (int j = 0; j < L; j++) {
			sh->dgam[L - 1] += sh->xs[j];
			sh->dgam[j] -= sh->xs[j];
		}
	}
	/* W = Pd: e^(gamma_i - gamma_j) dO_i . u_j (j <= i) */
	BLOCK_LOOP(x, (long)L * L) {
		int i = (int)(x / L), j = (int)(x % L);

		w->W[i * CH + j] = j <= i ? __fmul_rn(w->E[i * CH + j], fdot(w->dO + (long)i * Dv, w->U + (long)j * Dv, Dv))
				   : 0.0f;
	}
	/* Y = dO S0^T */
	rows_by_t(w->Y, w->dO, w->S, L, Dk, Dv);
	__syncthreads();
	/* gamma: Pd_ij q~_i.k_j at i, minus at j; e^gamma_i q~_i.(S0 dO_i) at i */
	BLOCK_LOOP(i, L) {
		double r = tri_net(w->W, w->G, (int)i, L);

		sh->dgam[i] += DMAC(r, sh->eg[i], dotd4(w->Q + i * Dk, w->Y + i * Dk, Dk));
	}
	/* dq~_i = e^gamma_i Y_i + sum_{j<=i} Pd_ij k_j; dk_j += sum_{i>=j} Pd_ij q~_i */
	BLOCK_LOOP(x, (long)L * Dk) {
		long i = x / Dk, d = x % Dk;
		float q = __fmul_rn(sh->eg[i], w->Y[x]), k = w->dk[x];

		for (long j = 0; j <= i; j++)
			MAC(q, w->W[i * CH + j], w->K[j * Dk + d]);
		for (long m = i; m < L; m++)
			MAC(k, w->W[m * CH + i], w->Q[m * Dk + d]);
		w->dq[x] = q;
		w->dk[x] = k;
	}
	__syncthreads();
	/* Y = dR S0^T */
	rows_by_t(w->Y, w->dR, w->S, L, Dk, Dv);
	/* dv_i = beta_i dR_i */
	BLOCK_LOOP(x, (long)L * Dv) {
		long i = x / Dv, n = (long)b * a->T + s + i;

		a->dv[(n * a->Hv + h) * Dv + x % Dv] = __fmul_rn(sh->beta[i], w->dR[x]);
	}
	__syncthreads();
	/* through Vt: dbeta_i += dR_i.Vt_i, gamma_i -= c_i k_i.Y_i, dk_i -= c_i Y_i,
	 * c_i = beta_i e^gamma_i; Kx = -c k and Kq = e^gamma q~ for dS0 */
	BLOCK_LOOP(i, L) {
		float c = __fmul_rn(sh->beta[i], sh->eg[i]);

		sh->dbeta[i] += dotd4(w->dR + i * Dv, w->Vt + i * Dv, Dv);
		sh->dgam[i] = __dsub_rn(sh->dgam[i], __dmul_rn(c, dotd4(w->K + i * Dk, w->Y + i * Dk, Dk)));
	}
	BLOCK_LOOP(x, (long)L * Dk) {
		long i = x / Dk;
		float c = __fmul_rn(sh->beta[i], sh->eg[i]);

		MAC(w->dk[x], -c, w->Y[x]);
		w->Kx[x] = __fmul_rn(-c, w->K[x]);
		w->Kq[x] = __fmul_rn(sh->eg[i], w->Q[x]);
	}
	/* F_ij = -e^(gamma_i - gamma_j) dR_i.u_j (j < i, in P) and W = H = beta_i F_ij */
	BLOCK_LOOP(x, (long)L * L) {
		int i = (int)(x / L), j = (int)(x % L);
		float f = j < i ? -__fmul_rn(w->E[i * CH + j], fdot(w->dR + (long)i * Dv, w->U + (long)j * Dv, Dv)) : 0.0f;

		w->P[i * CH + j] = f;
		w->W[i * CH + j] = __fmul_rn(sh->beta[i], f);
	}
	__syncthreads();
	/* dbeta_i += F_ij KK_ij; gamma gets H_ij KK_ij at i, minus at j */
	BLOCK_LOOP(i, L) {
		sh->dbeta[i] += tri_row(w->P, w->KK, (int)i);
		sh->dgam[i] += tri_net(w->W, w->KK, (int)i, L);
	}
	/* dk_i += sum_{j<i} H_ij k_j, then dk_j += sum_{i>j} H_ij k_i */
	BLOCK_LOOP(x, (long)L * Dk) {
		long i = x / Dk, d = x % Dk;
		float k = w->dk[x];

		for (long j = 0; j < i; j++)
			MAC(k, w->W[i * CH + j], w->K[j * Dk + d]);
		for (long m = i + 1; m < L; m++)
			MAC(k, w->W[m * CH + i], w->K[m * Dk + d]);
		w->dk[x] = k;
	}
	__syncthreads();
	/* dS0 = e^gamma_L dS + Kq^T dO + Kx^T dR */
	BLOCK_LOOP(x, DD) {
		long d = x / Dv, v = x % Dv;
		float acc = __fmul_rn(w->dS[x], sh->eg[L - 1]);

		for (int i = 0; i < L; i++)
			MAC(acc, w->Kq[(long)i * Dk + d], w->dO[(long)i * Dv + v]);
		for (int i = 0; i < L; i++)
			MAC(acc, w->Kx[(long)i * Dk + d], w->dR[(long)i * Dv + v]);
		w->dS[x] = acc;
	}
	/* out: dg_m = sum_{i>=m} dgamma_i; dq += scale dq~, dk += dk */
	if (TID == 0) {
		double acc = 0;

		for (int i = L - 1; i >= 0; i--) {
			long n = (long)b * a->T + s + i;

			acc += sh->dgam[i];
			a->dg[n * a->Hv + h] = (float)acc;
			a->dbeta[n * a->Hv + h] = (float)sh->dbeta[i];
		}
	}
	BLOCK_LOOP(x, (long)L * Dk) {
		long i = x / Dk, d = x % Dk, n = (long)b * a->T + s + i;
		size_t o = (size_t)(n * a->Hk + hk) * Dk + d;

		MAC(a->dq[o], a->scale, w->dq[x]);
		MAC(a->dk[o], 1.0f, w->dk[x]);
	}
	__syncthreads();
}

static __global__ void __launch_bounds__(GDR_THREADS) k_gdr_bwd(struct gdr_args a)
{
	__shared__ struct gdr_sh sh;
	struct gdr_ws w;
	int b = blockIdx.x / a.Hk, hk = blockIdx.x % a.Hk, grp = a.Hv / a.Hk, T = a.T, nblk = (T + CH - 1) / CH;
	long DD = (long)a.Dk * a.Dv;

	ws_carve(&w, a.scratch + (size_t)blockIdx.x * a.unit, a.Dk, a.Dv);
	BLOCK_LOOP(x, (long)T * a.Dk) {
		size_t o = (((size_t)b * T + x / a.Dk) * a.Hk + hk) * a.Dk + x % a.Dk;

		a.dq[o] = a.dk[o] = 0.0f;
	}
	for (int h = hk * grp; h < (hk + 1) * grp; h++) {
		fill(w.dS, DD, 0.0f);
		__syncthreads();
		for (int c = nblk - 1; c >= 0; c--) {
			int t0 = c * CH, t1 = t0 + CH < T ? t0 + CH : T;

			if (TID == 0) {   /* the chunk's document starts, and t1 */
				int k = 0;

				for (int s = t0; s < t1; s = next_start(a.seg, b, T, s, t1))
					sh.starts[k++] = s;
				sh.starts[k] = t1;
				sh.ns = k;
			}
			__syncthreads();
			for (int m = sh.ns - 1; m >= 0; m--) {
				int s = sh.starts[m];

				BLOCK_LOOP(x, DD)
					w.S[x] = m == 0 ? a.saved_in[(((size_t)b * a.Hv + h) * nblk + c) * DD + x] : 0.0f;
				__syncthreads();
				chunk_bwd(&a, &w, &sh, b, h, s, sh.starts[m + 1] - s);
				if (doc_start(a.seg, b, T, s))
					fill(w.dS, DD, 0.0f);
				__syncthreads();
			}
		}
	}
}

/* the shapes a launch can take: Hv a multiple of Hk, the scratch's unit
 * at least a block's working set */
static int gdr_ok(int B, int T, int Hv, int Hk, int Dk, int Dv, size_t unit)
{
	return B > 0 && T > 0 && Hk > 0 && Hv > 0 && Hv % Hk == 0 && Dk > 0 && Dv > 0 && unit >= gws_floats(Dk, Dv);
}

extern "C" void hp_cuda_gdr_fwd(float *out, float *saved, const float *q, const float *k, const float *v,
				const float *g, const float *beta, const int32_t *seg, float *scratch, size_t unit,
				int B, int T, int Hv, int Hk, int Dk, int Dv, float scale)
{
	struct gdr_args a = { out, saved, scratch, NULL, NULL, NULL, NULL, NULL, q, k, v, g, beta, NULL, NULL, seg,
			      unit, B, T, Hv, Hk, Dk, Dv, scale };

	if (!gdr_ok(B, T, Hv, Hk, Dk, Dv, unit)) {
		hp_cu_fill_nan(out, (size_t)(B > 0 ? B : 0) * (T > 0 ? T : 0) * (Hv > 0 ? Hv : 0) * (Dv > 0 ? Dv : 0));
		return;
	}
	k_gdr_fwd<<<B * Hv, GDR_THREADS, 0, hp_cu_stream>>>(a);
}

extern "C" void hp_cuda_gdr_bwd(float *dq, float *dk, float *dv, float *dg, float *dbeta, const float *dout,
				const float *saved, const float *q, const float *k, const float *v, const float *g,
				const float *beta, const int32_t *seg, float *scratch, size_t unit, int B, int T, int Hv,
				int Hk, int Dk, int Dv, float scale)
{
	struct gdr_args a = { NULL, NULL, scratch, dq, dk, dv, dg, dbeta, q, k, v, g, beta, dout, saved, seg,
			      unit, B, T, Hv, Hk, Dk, Dv, scale };

	if (!gdr_ok(B, T, Hv, Hk, Dk, Dv, unit)) {
		size_t nt = (size_t)(B > 0 ? B : 0) * (T > 0 ? T : 0);
		size_t hk = Hk > 0 ? Hk : 0, hv = Hv > 0 ? Hv : 0, dk_ = Dk > 0 ? Dk : 0, dv_ = Dv > 0 ? Dv : 0;

		hp_cu_fill_nan(dq, nt * hk * dk_);
		hp_cu_fill_nan(dk, nt * hk * dk_);
		hp_cu_fill_nan(dv, nt * hv * dv_);
		hp_cu_fill_nan(dg, nt * hv);
		hp_cu_fill_nan(dbeta, nt * hv);
		return;
	}
	k_gdr_bwd<<<B * Hk, GDR_THREADS, 0, hp_cu_stream>>>(a);
}
