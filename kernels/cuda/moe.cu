/*
 * moe.cu - the CUDA backend's MoE routing: the router's softmax and top-k,
 * its backward, and the row movements around the grouped expert GEMMs
 * (gather, weighted combine and its backward, scatter-add of the experts'
 * input gradients).
 *
 * The arithmetic is lib/model.c's moe_forward / moe_backward, one warp per
 * token for the router (softmax sums and dot products in double, top-k by
 * repeated argmax with ties to the lower index, the renormalisation and
 * the backward's scalars computed sequentially as the CPU does) and one
 * block per token for the rows.  Deterministic: every sum has a fixed
 * order (a token's k slots in slot order, warp and block sums in a fixed
 * shape), no atomics; a row of dye belongs to exactly one (token, slot).
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

/* dL/dprob[x] before the softmax backward, as moe_backward builds dprob:
 * the slot's term (through the renormalisation when norm), then aux */
static __device__ __forceinline__ float router_dp(int x, const int32_t *st, const float *dw, int k, int norm,
						  double S, double c, const float *aux, double aux_grad)
{
	float d = 0;

	for (int j = 0; j < k; j++)
		if (st[j] == x)
			d += norm ? (float)((dw[j] - c) / S) : dw[j];
	if (aux && aux_grad != 0)
		d += (float)(aux_grad * aux[x]);
	return d;
}

static __global__ void k_router_bwd(hp_bf16 *dlogits, const float *probs, const int32_t *sel, const float *wsel,
				    const float *dwsel, const float *aux, double aux_grad, long N, int E, int k,
				    int norm)
{
	int lane = threadIdx.x & 31;
	long nw = (long)gridDim.x * (blockDim.x >> 5);

	for (long t = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < N; t += nw) {
		const float *p = probs + t * E, *ws = wsel + t * k, *dw = dwsel + t * k;
		const int32_t *st = sel + t * k;
		hp_bf16 *dl = dlogits + t * E;
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
			dl[x] = f2bf(__fmul_rn(p[x], (float)(d - sdp)));
		}
	}
}

extern "C" void hp_cuda_router_bwd(hp_bf16 *dlogits, const float *probs, const int32_t *sel, const float *wsel,
				   const float *dwsel, const float *aux, double aux_grad, long N, int E, int k,
				   int norm)
{
	if (N > 0 && E > 0)
		k_router_bwd<<<hp_cu_blocks((size_t)N, RT_WARPS), 32 * RT_WARPS, 0, hp_cu_stream>>>(dlogits, probs, sel, wsel,
											 dwsel, aux, aux_grad,
											 N, E, k, norm);
}

/* ---- rows: gather, combine, combine backward, scatter-add ---- */

/* xs[r] = x[row_tok[r]] in words of W (16, 4 or 2 bytes), Cw words a row */
template <typename W>
static __global__ void k_gather(W *xs, const W *x, const int32_t *row_tok, long R, int Cw)
{
	for (long r = blockIdx.x; r < R; r += gridDim.x) {
		const W *src = x + (long)row_tok[r] * Cw;
		W *dst = xs + r * Cw;
		for (int c = threadIdx.x; c < Cw; c += blockDim.x)
			dst[c] = src[c];
	}
}

extern "C" void hp_cuda_gather_rows(hp_bf16 *xs, const hp_bf16 *x, const int32_t *row_tok, long R, int C)
{
	uintptr_t a = (uintptr_t)xs | (uintptr_t)x;

	if (R <= 0 || C <= 0)
		return;
	if (C % 8 == 0 && a % 16 == 0)
		k_gather<uint4><<<hp_cu_rows(R), row_threads(C / 8), 0, hp_cu_stream>>>((uint4 *)xs, (const uint4 *)x,
											 row_tok, R, C / 8);
	else if (C % 2 == 0 && a % 4 == 0)
		k_gather<uint32_t><<<hp_cu_rows(R), row_threads(C / 2), 0, hp_cu_stream>>>((uint32_t *)xs,
											    (const uint32_t *)x,
											    row_tok, R, C / 2);
	else
		k_gather<hp_bf16><<<hp_cu_rows(R), row_threads(C), 0, hp_cu_stream>>>(xs, x, row_tok, R, C);
}

/* out[t] = sum_j wsel[t,j] * ye[tok_row[t,j]], fp32, slots in order */
static __global__ void k_combine(hp_bf16 *out, const hp_bf16 *ye, const float *wsel, const int32_t *tok_row,
				 long N, int k, int C)
{
	for (long t = blockIdx.x; t < N; t += gridDim.x) {
		const int32_t *tr = tok_row + t * k;
		const float *w = wsel + t * k;
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			float acc = 0;
			for (int j = 0; j < k; j++)
				acc = __fadd_rn(acc, __fmul_rn(bf2f(ye[(long)tr[j] * C + c]), w[j]));
			out[t * C + c] = f2bf(acc);
		}
	}
}

extern "C" void hp_cuda_combine(hp_bf16 *out, const hp_bf16 *ye, const float *wsel, const int32_t *tok_row,
				long N, int k, int C)
{
	if (N > 0 && C > 0)
		k_combine<<<hp_cu_rows(N), row_threads(C), 0, hp_cu_stream>>>(out, ye, wsel, tok_row, N, k, C);
}

/* dye[row] = wsel * dout[t]; dwsel[t,j] = dout[t] . ye[row] (double, block sum) */
static __global__ void k_combine_bwd(hp_bf16 *dye, float *dwsel, const hp_bf16 *dout, const hp_bf16 *ye,
				     const float *wsel, const int32_t *tok_row, long N, int k, int C)
{
	__shared__ double sh[32];

	for (long t = blockIdx.x; t < N; t += gridDim.x) {
		const hp_bf16 *d = dout + t * C;
		for (int j = 0; j < k; j++) {
			long row = tok_row[t * k + j];
			float wt = wsel[t * k + j];
			const hp_bf16 *y = ye + row * C;
			hp_bf16 *dy = dye + row * C;
			double dot = 0;
			for (int c = threadIdx.x; c < C; c += blockDim.x) {
				float dv = bf2f(d[c]);
				dy[c] = f2bf(__fmul_rn(dv, wt));
				dot += (double)dv * bf2f(y[c]);
			}
			dot = block_sum(dot, sh);
			if (threadIdx.x == 0)
				dwsel[t * k + j] = (float)dot;
		}
	}
}

extern "C" void hp_cuda_combine_bwd(hp_bf16 *dye, float *dwsel, const hp_bf16 *dout, const hp_bf16 *ye,
				    const float *wsel, const int32_t *tok_row, long N, int k, int C)
{
	if (N > 0 && C > 0)
		k_combine_bwd<<<hp_cu_rows(N), row_threads(C), 0, hp_cu_stream>>>(dye, dwsel, dout, ye, wsel,
										    tok_row, N, k, C);
}

/* dx[t] += dxe rows of its slots, in slot order, in fp32, one rounding */
static __global__ void k_scatter_add(hp_bf16 *dx, const hp_bf16 *dxe, const int32_t *tok_row, long N, int k, int C)
{
	for (long t = blockIdx.x; t < N; t += gridDim.x) {
		const int32_t *tr = tok_row + t * k;
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			float acc = bf2f(dx[t * C + c]);
			for (int j = 0; j < k; j++)
				acc += bf2f(dxe[(long)tr[j] * C + c]);
			dx[t * C + c] = f2bf(acc);
		}
	}
}

extern "C" void hp_cuda_scatter_add_rows(hp_bf16 *dx, const hp_bf16 *dxe, const int32_t *tok_row,
					 long N, int k, int C)
{
	if (N > 0 && C > 0)
		k_scatter_add<<<hp_cu_rows(N), row_threads(C), 0, hp_cu_stream>>>(dx, dxe, tok_row, N, k, C);
}
