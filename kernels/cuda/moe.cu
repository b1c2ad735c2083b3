/*
 * moe.cu - the CUDA backend's MoE routing: the router's softmax and top-k,
 * its backward, and the row movements around the experts' GEMMs (gather
 * and scatter of rows by an index, the weighted combine and its backward,
 * the scatter-add of the experts' input gradients), on fp32 rows; the
 * routing table (which rows each expert owns) and the load-balancing
 * loss's sums.  The experts' GEMMs themselves are grouped.cu's (or
 * gemm.cu's, one call per expert).
 *
 * The arithmetic is kernels/cpu/router.c's and rows.c's, one warp per
 * token for the router (softmax sums and dot products in double, top-k by
 * repeated argmax with ties to the lower index, the renormalisation and
 * the backward's scalars computed sequentially as the CPU does).  The rows
 * run one block per token (combine, scatter-add: a token's rows in the
 * ascending order tok_rows gives, which is the order the CPU's row loop
 * adds them, so their sums are the CPU's bits) or per row (the combine's
 * backward, whose dot product is a double block sum in another order than
 * the CPU's).  The routing table is one block of integer counts (the
 * CPU's table exactly), the aux loss's sums one thread per expert in the
 * CPU's order (its bits).  DeepSeek-V3's grouped sigmoid router runs one
 * warp per token as well, with router.c's choices and arithmetic.
 * Deterministic: every sum has a fixed order, no atomics; every output
 * element is written by one thread.
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

/* ---- DeepSeek-V3's grouped sigmoid router; one warp per token ----
 *
 * kernels/cpu/router.c's choices and arithmetic: the sigmoid in double
 * rounded once, c = s + bias and a group's two largest c added in fp32,
 * every choice a repeated argmax in the total order (value down, index up,
 * NaN as -inf), the weights' sum in double then fp32 as the CPU's, lane 0
 * in the CPU's order; so the same bits.  The lanes share the sigmoids
 * (each its own experts), the groups' scores and the experts' scans; each
 * warp keeps its token's kept-group flags in shared memory (G bytes). */

#define RG_SHARED 49152     /* the shared memory a block may have without opting in */

static __device__ __forceinline__ float rg_key(float v)
{
	return isnan(v) ? -INFINITY : v;
}

static __device__ __forceinline__ int rg_before(float v, int i, float w, int j)
{
	return v > w || (v == w && i < j);
}

static __device__ __forceinline__ float rg_choice(const float *s, const float *bias, int e)
{
	return rg_key(bias ? __fadd_rn(s[e], bias[e]) : s[e]);
}

static __device__ float rg_group(const float *s, const float *bias, int g, int S)
{
	float t1 = -INFINITY, t2 = -INFINITY;

	for (int e = g * S; e < (g + 1) * S; e++) {
		float c = rg_choice(s, bias, e);
		if (c > t1) {
			t2 = t1;
			t1 = c;
		} else if (c > t2) {
			t2 = c;
		}
	}
	return rg_key(__fadd_rn(t1, t2));
}

/* the first in the order of the lanes' (v, i), i -1 for none: every lane
 * ends with it */
static __device__ __forceinline__ void rg_warp_first(float &v, int &i)
{
	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(FULL, v, o);
		int oi = __shfl_xor_sync(FULL, i, o);
		if (oi >= 0 && (i < 0 || rg_before(ov, oi, v, i))) {
			v = ov;
			i = oi;
		}
	}
}

static __global__ void k_router_group_fwd(float *probs, int32_t *sel, float *wsel, const float *bias, long N, int E,
					  int K, int G, int TG, int norm, float scale, int mask_zero, int Gp)
{
	extern __shared__ unsigned char rg_sh[];
	unsigned char *kept = rg_sh + (size_t)(threadIdx.x >> 5) * Gp;
	int lane = threadIdx.x & 31, S = E / G;
	long nw = (long)gridDim.x * (blockDim.x >> 5);
	float masked = mask_zero ? 0.0f : -INFINITY;

	for (long t = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < N; t += nw) {
		float *s = probs + t * E, *ws = wsel + t * K;
		int32_t *st = sel + t * K;
		float pv = 0;
		int pi = -1;

		for (int x = lane; x < E; x += 32)
			s[x] = (float)__ddiv_rn(1.0, __dadd_rn(1.0, exp(-(double)s[x])));
		for (int g = lane; g < G; g += 32)
			kept[g] = TG >= G;
		__syncwarp();   /* every s and flag seen by every lane */
		for (int r = 0; r < TG && TG < G; r++) {
			float bv = 0;
			int bi = -1;
			for (int g = lane; g < G; g += 32) {
				float v = rg_group(s, bias, g, S);
				if ((r == 0 || rg_before(pv, pi, v, g)) && (bi < 0 || rg_before(v, g, bv, bi))) {
					bv = v;
					bi = g;
				}
			}
			rg_warp_first(bv, bi);
			if (lane == 0)
				kept[bi] = 1;
			pv = bv;
			pi = bi;
		}
		__syncwarp();
		for (int k = 0; k < K; k++) {
			float bv = 0;
			int bi = -1;
			for (int x = lane; x < E; x += 32) {
				float v = kept[x / S] ? rg_choice(s, bias, x) : masked;
				if ((k == 0 || rg_before(pv, pi, v, x)) && (bi < 0 || rg_before(v, x, bv, bi))) {
					bv = v;
					bi = x;
				}
			}
			rg_warp_first(bv, bi);
			if (lane == 0)
				st[k] = bi < 0 ? 0 : bi;   /* -1 only when K > E */
			pv = bv;
			pi = bi;
		}
		__syncwarp();   /* st seen by lane 0's loops below */
		if (lane == 0) {
			double sum = 0;
			for (int k = 0; k < K; k++) {
				ws[k] = s[st[k]];
				sum += ws[k];
			}
			if (norm) {
				float den = __fadd_rn((float)sum, 1e-20f);
				for (int k = 0; k < K; k++)
					ws[k] = __fdiv_rn(ws[k], den);
			}
			for (int k = 0; k < K; k++)
				ws[k] = __fmul_rn(ws[k], scale);
		}
		__syncwarp();   /* the flags free for the next token */
	}
}

extern "C" void hp_cuda_router_group_fwd(float *probs, int32_t *sel, float *wsel, const float *bias, long N, int E,
					 int K, int G, int TG, int norm, float scale, int mask_zero)
{
	int Gp = (G + 15) / 16 * 16;
	unsigned warps = (size_t)RT_WARPS * Gp <= RG_SHARED ? RT_WARPS : 1;

	if (N > 0 && E > 0 && K > 0 && G > 0)
		k_router_group_fwd<<<hp_cu_blocks((size_t)N, warps), 32 * warps, (size_t)warps * Gp, hp_cu_stream>>>(
			probs, sel, wsel, bias, N, E, K, G, TG, norm, scale, mask_zero, Gp);
}

/* one lane per expert; D and sum_j u_j s_j, in double, by every lane in
 * the CPU's order */
static __global__ void k_router_group_bwd(float *dlogits, const float *probs, const int32_t *sel, const float *dwsel,
					  long N, int E, int K, int norm, float scale)
{
	int lane = threadIdx.x & 31;
	long nw = (long)gridDim.x * (blockDim.x >> 5);

	for (long t = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < N; t += nw) {
		const float *s = probs + t * E, *dw = dwsel + t * K;
		const int32_t *st = sel + t * K;
		float *dl = dlogits + t * E;
		double D = 0, c = 0;

		if (norm) {
			for (int k = 0; k < K; k++) {
				D = __dadd_rn(D, (double)s[st[k]]);
				c = __dadd_rn(c, __dmul_rn(__dmul_rn((double)dw[k], (double)scale), (double)s[st[k]]));
			}
			D = __dadd_rn(D, 1e-20);
		}
		for (int x = lane; x < E; x += 32) {
			float d = 0;
			for (int k = 0; k < K; k++)
				if (st[k] == x) {
					double u = __dmul_rn((double)dw[k], (double)scale), sx = s[x], ds = u;
					if (norm)
						ds = __dsub_rn(__ddiv_rn(u, D), __ddiv_rn(c, __dmul_rn(D, D)));
					d = __fadd_rn(d, (float)__dmul_rn(__dmul_rn(ds, sx), __dsub_rn(1.0, sx)));
				}
			dl[x] = d;
		}
	}
}

extern "C" void hp_cuda_router_group_bwd(float *dlogits, const float *probs, const int32_t *sel, const float *dwsel,
					 long N, int E, int K, int norm, float scale)
{
	if (N > 0 && E > 0)
		k_router_group_bwd<<<hp_cu_blocks((size_t)N, RT_WARPS), 32 * RT_WARPS, 0, hp_cu_stream>>>(
			dlogits, probs, sel, dwsel, N, E, K, norm, scale);
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

/* MLA's shared key part: one thread per (token, value); the sum over the
 * heads in rows.c's order (ascending h, from the first head's value) */
static __global__ void k_heads(float *dst, int ldd, const float *src, int lds, long N, int H, int w, int sum)
{
	HP_CU_GRID_STRIDE(idx, (size_t)N * w) {
		size_t n = idx / w;
		int i = (int)(idx % w);

		if (sum) {
			float acc = src[n * H * lds + i];
			for (int h = 1; h < H; h++)
				acc = __fadd_rn(acc, src[(n * H + h) * lds + i]);
			dst[n * ldd + i] = acc;
		} else {
			float v = src[n * lds + i];
			for (int h = 0; h < H; h++)
				dst[(n * H + h) * ldd + i] = v;
		}
	}
}

static void heads(float *dst, int ldd, const float *src, int lds, long N, int H, int w, int sum)
{
	size_t n = (size_t)(N > 0 ? N : 0) * (w > 0 ? w : 0);

	if (n && H > 0)
		k_heads<<<(unsigned)((n + 255) / 256 < 65535 ? (n + 255) / 256 : 65535), 256, 0, hp_cu_stream>>>(
			dst, ldd, src, lds, N, H, w, sum);
}

extern "C" void hp_cuda_heads_bcast(float *dst, int ldd, const float *src, int lds, long N, int H, int w)
{
	heads(dst, ldd, src, lds, N, H, w, 0);
}

extern "C" void hp_cuda_heads_sum(float *dst, int ldd, const float *src, int lds, long N, int H, int w)
{
	heads(dst, ldd, src, lds, N, H, w, 1);
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

/* ---- the routing table: hp_moe_route's, one block ----
 *
 * The choices sel[N*k] split into P contiguous chunks, one thread each;
 * cnt[p][x] counts chunk p's choices of expert x.  A column's exclusive
 * prefix over p is where chunk p's rows of x start among x's, and the
 * prefix of the column sums over x is off: the placement pass, every chunk
 * in order, then puts each expert's rows in token order (stable) as the
 * CPU's loop does, with no atomics.  Integers only: the CPU's table
 * exactly.  One launch whatever N and E; the chunks' sequential walks are
 * the cost, N*k / P choices each.  P is as many chunks as 48 KiB of
 * shared memory holds counts for beside the experts' first rows (E = 8:
 * the block's 1024 threads; E = 128: 94; E = 512: 23); an E too wide for
 * even one chunk takes k_route_wide, one thread per expert scanning every
 * choice (slow, but no memory).
 */
#define ROUTE_THREADS 1024
#define ROUTE_SMEM_INTS (48 * 1024 / 4)

/* token t's k rows, sorted ascending (insertion sort: k is small) */
static __device__ __forceinline__ void sort_tok_rows(int32_t *tok_rows, long N, int k)
{
	for (long t = threadIdx.x; t < N; t += blockDim.x) {
		int32_t *tr = tok_rows + t * k;
		for (int a = 1; a < k; a++)
			for (int j = a; j > 0 && tr[j - 1] > tr[j]; j--) {
				int32_t v = tr[j];
				tr[j] = tr[j - 1];
				tr[j - 1] = v;
			}
	}
}

static __global__ void __launch_bounds__(ROUTE_THREADS) k_route(int32_t *off, int32_t *row_tok, int32_t *row_slot,
								 int32_t *tok_rows, int32_t *bad, int32_t *sel,
								 long N, int E, int k, int P)
{
	extern __shared__ int32_t rsh[];
	int32_t *cnt = rsh;                     /* [P][E]: counts, then each chunk's cursors */
	int32_t *nbad = cnt + (size_t)P * E;    /* [P] */
	int32_t *first = nbad + P;              /* [E]: the totals, then each expert's first row */
	long NK = N * k, cs = (NK + P - 1) / P;
	int p = threadIdx.x;
	long i0 = p * cs, i1 = i0 + cs < NK ? i0 + cs : NK;

	for (long i = threadIdx.x; i < (long)P * E; i += blockDim.x)
		cnt[i] = 0;
	__syncthreads();
	if (p < P) {
		int32_t *c = cnt + (size_t)p * E, nb = 0;
		for (long i = i0; i < i1; i++) {
			int32_t s = sel[i];
			if (s < 0 || s >= E) {
				sel[i] = s = 0;
				nb++;
			}
			c[s]++;
		}
		nbad[p] = nb;
	}
	__syncthreads();
	for (int x = threadIdx.x; x < E; x += blockDim.x) {
		int32_t s = 0;
		for (int q = 0; q < P; q++) {
			int32_t c = cnt[(size_t)q * E + x];
			cnt[(size_t)q * E + x] = s;
			s += c;
		}
		first[x] = s;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		int32_t s = 0, nb = 0;
		for (int x = 0; x < E; x++) {
			int32_t c = first[x];
			off[x] = first[x] = s;
			s += c;
		}
		off[E] = s;
		for (int q = 0; q < P; q++)
			nb += nbad[q];
		*bad += nb;
	}
	__syncthreads();
	/* each chunk reads back only the sel entries it rewrote itself */
	if (p < P) {
		int32_t *c = cnt + (size_t)p * E;
		for (long i = i0; i < i1; i++) {
			int32_t s = sel[i], r = first[s] + c[s]++;
			row_tok[r] = (int32_t)(i / k);
			row_slot[r] = (int32_t)(i % k);
			if (tok_rows)
				tok_rows[i] = r;
		}
	}
	if (!tok_rows)
		return;
	__syncthreads();   /* a token's slots may lie in two chunks */
	sort_tok_rows(tok_rows, N, k);
}

/* thread x counts and places expert x's choices itself, scanning them all
 * (a choice outside [0, E) counts as expert 0's until sel is rewritten,
 * once every thread has counted) */
static __global__ void __launch_bounds__(ROUTE_THREADS) k_route_wide(int32_t *off, int32_t *row_tok,
								      int32_t *row_slot, int32_t *tok_rows,
								      int32_t *bad, int32_t *sel, long N, int E, int k)
{
	long NK = N * k;

	for (int x = threadIdx.x; x < E; x += blockDim.x) {
		int32_t c = 0;
		for (long i = 0; i < NK; i++) {
			int32_t s = sel[i];
			c += s == x || (x == 0 && (s < 0 || s >= E));
		}
		off[x + 1] = c;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		int32_t nb = 0;
		off[0] = 0;
		for (int x = 0; x < E; x++)
			off[x + 1] += off[x];
		for (long i = 0; i < NK; i++)
			nb += sel[i] < 0 || sel[i] >= E;
		*bad += nb;
	}
	__syncthreads();
	for (long i = threadIdx.x; i < NK; i += blockDim.x)
		if (sel[i] < 0 || sel[i] >= E)
			sel[i] = 0;
	__syncthreads();
	for (int x = threadIdx.x; x < E; x += blockDim.x) {
		int32_t r = off[x];
		for (long i = 0; i < NK; i++)
			if (sel[i] == x) {
				row_tok[r] = (int32_t)(i / k);
				row_slot[r] = (int32_t)(i % k);
				if (tok_rows)
					tok_rows[i] = r;
				r++;
			}
	}
	if (!tok_rows)
		return;
	__syncthreads();
	sort_tok_rows(tok_rows, N, k);
}

extern "C" void hp_cuda_moe_route(int32_t *off, int32_t *row_tok, int32_t *row_slot, int32_t *tok_rows, int32_t *bad,
				  int32_t *sel, long N, int E, int k)
{
	long NK = N > 0 && k > 0 ? N * k : 0;
	/* P chunks: P * E counts, P bad counts and E first rows */
	long P = (ROUTE_SMEM_INTS - (long)E) / ((long)E + 1);

	if (E <= 0)
		return;
	if (P > ROUTE_THREADS)
		P = ROUTE_THREADS;
	if (P > NK)
		P = NK > 0 ? NK : 1;   /* no empty chunks; one to write off when nothing is routed */
	if (P >= 1)
		k_route<<<1, ROUTE_THREADS, (size_t)(P * E + P + E) * sizeof(int32_t), hp_cu_stream>>>(
			off, row_tok, row_slot, tok_rows, bad, sel, NK ? N : 0, E, k, (int)P);
	else
		k_route_wide<<<1, ROUTE_THREADS, 0, hp_cu_stream>>>(off, row_tok, row_slot, tok_rows, bad, sel,
								     NK ? N : 0, E, k);
}

/* ---- the load-balancing loss: hp_moe_aux_acc's and hp_moe_aux_fin's bits ---- */

/* one thread per expert, its sum over t in the CPU's order; the _rn
 * intrinsics keep the compiler from contracting or reordering */
static __global__ void k_aux_acc(double *FP, const float *probs, const int32_t *off, long N, int E)
{
	HP_CU_GRID_STRIDE(x, (size_t)E) {
		double s = FP[E + x];
		for (long t = 0; t < N; t++)
			s = __dadd_rn(s, (double)probs[t * E + x]);
		FP[x] = __dadd_rn(FP[x], (double)(off[x + 1] - off[x]));
		FP[E + x] = s;
	}
}

extern "C" void hp_cuda_moe_aux_acc(double *FP, const float *probs, const int32_t *off, long N, int E)
{
	if (E > 0)
		k_aux_acc<<<hp_cu_blocks((size_t)E, 128), 128, 0, hp_cu_stream>>>(FP, probs, off, N > 0 ? N : 0, E);
}

/* one thread: the CPU's divisions, products and sums in its order (no FMA) */
static __global__ void k_aux_fin(double *FP, double *aux, double *acc, int E, double n, double div)
{
	double s = 0, a;

	for (int x = 0; x < E; x++) {
		double f = FP[x] / n;
		FP[x] = f;
		s = __dadd_rn(s, __dmul_rn(f, FP[E + x] / n));
	}
	*aux = a = __dmul_rn(s, (double)E);
	if (acc)
		*acc = __dadd_rn(*acc, a / div);
}

extern "C" void hp_cuda_moe_aux_fin(double *FP, double *aux, double *acc, int E, double n, double div)
{
	k_aux_fin<<<1, 1, 0, hp_cu_stream>>>(FP, aux, acc, E > 0 ? E : 0, n, div);
}
