/*
 * moe.cu - the CUDA backend's MoE routing: the router's softmax and top-k,
 * its backward, and the row movements around the experts' GEMMs (gather
 * and scatter of rows by an index, the weighted combine and its backward,
 * the scatter-add of the experts' input gradients), on fp32 rows.  The
 * experts' GEMMs themselves are gemm.cu's, one call per expert.
 *
 * The arithmetic is kernels/cpu/router.c's and rows.c's, one warp per
 * token for the router (softmax sums and dot products in double, top-k by
 * repeated argmax with ties to the lower index, the renormalisation and
 * the backward's scalars computed sequentially as the CPU does).  The rows
 * run one block per token (combine, scatter-add: a token's rows in the
 * ascending order tok_rows gives, which is the order the CPU's row loop
 * adds them, so their sums are the CPU's bits) or per row (the combine's
 * backward, whose dot product is a double block sum in another order than
 * the CPU's).  Deterministic: every sum has a fixed order, no atomics;
 * every output element is written by one thread.
 */
#include <limits.h>
#include <math.h>

#include "cuda/common.cuh"

#define RT_WARPS 4          /* router: tokens (warps) per block */
#define ROW_THREADS 256
#define FULL 0xffffffffu

static inline unsigned row_threads(int C)
{
	return hp_cu_row_threads(C, ROW_THREADS);
}

static __device__ __forceinline__ double warp_sum_d(double v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(FULL, v, o);
	return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
	return v;
}

/* ---- router: softmax, top-k, renormalisation; one warp per token ---- */

static __global__ void k_router_topk(float *probs, int32_t *sel, float *wsel, const float *logits,
				     long N, int E, int k, int norm)
{
	int lane = threadIdx.x & 31;
	long nw = (long)gridDim.x * (blockDim.x >> 5);

	for (long t = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < N; t += nw) {
		const float *lg = logits + t * E;
		float *p = probs + t * E;     /* may be lg: each lane reads and writes only its own x */
		int32_t *st = sel + t * k;
		float *ws = wsel + t * k;
		float mx = -INFINITY;
		double sum = 0;

		for (int x = lane; x < E; x += 32)
			mx = fmaxf(mx, lg[x]);
		mx = warp_max(mx);
		for (int x = lane; x < E; x += 32) {
			float v = expf(lg[x] - mx);
			p[x] = v;
			sum += v;
		}
		sum = warp_sum_d(sum);
		for (int x = lane; x < E; x += 32)
			p[x] = (float)(p[x] / sum);
		/* top-k: k rounds of argmax over the experts not taken yet */
		for (int j = 0; j < k; j++) {
			float bv = -INFINITY;
			int bi = INT_MAX;
			for (int x = lane; x < E; x += 32) {
				int taken = 0;
				for (int q = 0; q < j; q++)
					taken |= st[q] == x;
				float v = p[x];
				if (!taken && (bi == INT_MAX || v > bv)) {
					bv = v;
					bi = x;
				}
			}
			/* a total order (value down, index up): every lane ends with the same winner */
			for (int o = 16; o > 0; o >>= 1) {
				float ov = __shfl_xor_sync(FULL, bv, o);
				int oi = __shfl_xor_sync(FULL, bi, o);
				if (oi != INT_MAX && (bi == INT_MAX || ov > bv || (ov == bv && oi < bi))) {
					bv = ov;
					bi = oi;
				}
			}
			if (lane == 0) {
				st[j] = bi == INT_MAX ? 0 : bi;   /* INT_MAX only when k > E */
				ws[j] = bv;
			}
			__syncwarp();   /* st[j] visible to every lane's next round */
		}
		if (norm && lane == 0) {
			float tot = 0;
			for (int j = 0; j < k; j++)
				tot += ws[j];
			for (int j = 0; j < k; j++)
				ws[j] /= tot;
		}
		__syncwarp();
	}
}

extern "C" void hp_cuda_router_topk(float *probs, int32_t *sel, float *wsel, const float *logits,
				    long N, int E, int k, int norm)
{
	if (N > 0 && E > 0)
		k_router_topk<<<hp_cu_blocks((size_t)N, RT_WARPS), 32 * RT_WARPS, 0, hp_cu_stream>>>(probs, sel, wsel, logits,
											  N, E, k, norm);
}

/* dL/dprob[x] before the softmax backward, as hp_router_bwd builds dprob:
 * the slot's term (through the renormalisation when norm), then aux */
static __device__ __forceinline__ float router_dp(int x, const int32_t *st, const float *dw, int k, int norm,
						  double S, double c, const double *aux, double aux_grad)
{
	float d = 0;

	for (int j = 0; j < k; j++)
		if (st[j] == x)
			d = __fadd_rn(d, norm ? (float)((dw[j] - c) / S) : dw[j]);
	if (aux && aux_grad != 0)
		d = __fadd_rn(d, (float)(aux_grad * aux[x]));
	return d;
}

static __global__ void k_router_bwd(float *dlogits, const float *probs, const int32_t *sel, const float *wsel,
				    const float *dwsel, const double *aux, double aux_grad, long N, int E, int k,
				    int norm)
{
	int lane = threadIdx.x & 31;
	long nw = (long)gridDim.x * (blockDim.x >> 5);

	for (long t = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < N; t += nw) {
		const float *p = probs + t * E, *ws = wsel + t * k, *dw = dwsel + t * k;
		const int32_t *st = sel + t * k;
		float *dl = dlogits + t * E;
		/* w_j = p_j / S:  dL/dp_j = (dw_j - sum_i dw_i w_i) / S (every lane, in slot order) */
		double S = 0, c = 0, sdp = 0;

		if (norm)
			for (int j = 0; j < k; j++) {
				S += p[st[j]];
				c += (double)dw[j] * ws[j];
			}
		for (int x = lane; x < E; x += 32)
			sdp += (double)p[x] * router_dp(x, st, dw, k, norm, S, c, aux, aux_grad);
		sdp = warp_sum_d(sdp);
		/* softmax: dlogit = p * (dp - sum p dp) */
		for (int x = lane; x < E; x += 32) {
			float d = router_dp(x, st, dw, k, norm, S, c, aux, aux_grad);
			dl[x] = __fmul_rn(p[x], (float)(d - sdp));
		}
	}
}

extern "C" void hp_cuda_router_bwd(float *dlogits, const float *probs, const int32_t *sel, const float *wsel,
				   const float *dwsel, const double *aux, double aux_grad, long N, int E, int k,
				   int norm)
{
	if (N > 0 && E > 0)
		k_router_bwd<<<hp_cu_blocks((size_t)N, RT_WARPS), 32 * RT_WARPS, 0, hp_cu_stream>>>(
			dlogits, probs, sel, wsel, dwsel, aux, aux_grad, N, E, k, norm);
}

/* ---- rows: gather, scatter, combine, combine backward, scatter-add ---- */

/* Row r < R of Cw words of W (16, 8 or 4 bytes): gather copies src row
 * idx[r] to dst row r, scatter src row r to dst row idx[r]. */
template <typename W>
static __global__ void k_rows(W *dst, const W *src, const int32_t *idx, long R, int Cw, int scatter)
{
	for (long r = blockIdx.x; r < R; r += gridDim.x) {
		const W *s = src + (scatter ? r : (long)idx[r]) * Cw;
		W *d = dst + (scatter ? (long)idx[r] : r) * Cw;
		for (int c = threadIdx.x; c < Cw; c += blockDim.x)
			d[c] = s[c];
	}
}

/* the widest word both rows' alignment and C allow */
static void rows(float *dst, const float *src, const int32_t *idx, long R, int C, int scatter)
{
	uintptr_t a = (uintptr_t)dst | (uintptr_t)src;

	if (R <= 0 || C <= 0)
		return;
	if (C % 4 == 0 && a % 16 == 0)
		k_rows<uint4><<<hp_cu_rows(R), row_threads(C / 4), 0, hp_cu_stream>>>((uint4 *)dst, (const uint4 *)src,
										       idx, R, C / 4, scatter);
	else if (C % 2 == 0 && a % 8 == 0)
		k_rows<uint2><<<hp_cu_rows(R), row_threads(C / 2), 0, hp_cu_stream>>>((uint2 *)dst, (const uint2 *)src,
										       idx, R, C / 2, scatter);
	else
		k_rows<float><<<hp_cu_rows(R), row_threads(C), 0, hp_cu_stream>>>(dst, src, idx, R, C, scatter);
}

extern "C" void hp_cuda_gather_rows(float *dst, const float *src, const int32_t *idx, long R, int C)
{
	rows(dst, src, idx, R, C, 0);
}

/* idx a permutation of distinct rows (as the model's are): no row is
 * written twice */
extern "C" void hp_cuda_scatter_rows(float *dst, const float *src, const int32_t *idx, long R, int C)
{
	rows(dst, src, idx, R, C, 1);
}

/* out[t] = sum_j wsel[t, slot] * ye[r], r = tok_rows[t*k + j] in order:
 * hp_moe_combine's fp32 additions, in its order (out starts at 0) */
static __global__ void k_combine(float *out, const float *ye, const float *wsel, const int32_t *tok_rows,
				 const int32_t *row_slot, long N, int k, int C)
{
	for (long t = blockIdx.x; t < N; t += gridDim.x) {
		const int32_t *tr = tok_rows + t * k;
		const float *w = wsel + t * k;
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			float acc = 0;
			for (int j = 0; j < k; j++) {
				long r = tr[j];
				acc = __fadd_rn(acc, __fmul_rn(ye[r * C + c], w[row_slot[r]]));
			}
			out[t * C + c] = acc;
		}
	}
}

extern "C" void hp_cuda_combine(float *out, const float *ye, const float *wsel, const int32_t *tok_rows,
				const int32_t *row_slot, long N, int k, int C)
{
	if (N > 0 && C > 0)
		k_combine<<<hp_cu_rows(N), row_threads(C), 0, hp_cu_stream>>>(out, ye, wsel, tok_rows, row_slot, N, k,
									       C);
}

/* one block per row r: dye[r] = wsel[t, s] * dout[t]; dwsel[t, s] =
 * dout[t] . ye[r] (a double block sum) */
static __global__ void k_combine_bwd(float *dye, float *dwsel, const float *dout, const float *ye, const float *wsel,
				     const int32_t *row_tok, const int32_t *row_slot, long R, int k, int C)
{
	__shared__ double sh[32];

	for (long r = blockIdx.x; r < R; r += gridDim.x) {
		long t = row_tok[r];
		int s = row_slot[r];
		float wt = wsel[t * k + s];
		const float *d = dout + t * C, *y = ye + r * C;
		float *dy = dye + r * C;
		double dot = 0;
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			float dv = d[c];
			dy[c] = __fmul_rn(dv, wt);
			dot += (double)dv * y[c];
		}
		dot = block_sum(dot, sh);
		if (threadIdx.x == 0)
			dwsel[t * k + s] = (float)dot;
	}
}

extern "C" void hp_cuda_combine_bwd(float *dye, float *dwsel, const float *dout, const float *ye, const float *wsel,
				    const int32_t *row_tok, const int32_t *row_slot, long R, int k, int C)
{
	if (R > 0 && C > 0)
		k_combine_bwd<<<hp_cu_rows(R), row_threads(C), 0, hp_cu_stream>>>(dye, dwsel, dout, ye, wsel, row_tok,
										   row_slot, R, k, C);
}

/* dx[t] += its rows of dxe, one at a time in tok_rows order: hp_moe_scatter_add's additions */
static __global__ void k_scatter_add(float *dx, const float *dxe, const int32_t *tok_rows, long N, int k, int C)
{
	for (long t = blockIdx.x; t < N; t += gridDim.x) {
		const int32_t *tr = tok_rows + t * k;
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			float acc = dx[t * C + c];
			for (int j = 0; j < k; j++)
				acc = __fadd_rn(acc, dxe[(long)tr[j] * C + c]);
			dx[t * C + c] = acc;
		}
	}
}

extern "C" void hp_cuda_scatter_add_rows(float *dx, const float *dxe, const int32_t *tok_rows, long N, int k, int C)
{
	if (N > 0 && C > 0)
		k_scatter_add<<<hp_cu_rows(N), row_threads(C), 0, hp_cu_stream>>>(dx, dxe, tok_rows, N, k, C);
}
