/*
 * router.c - the MoE routers and their backwards: Qwen3-MoE's softmax
 * top-k, as HF's Qwen3MoeSparseMoeBlock computes it, and DeepSeek-V3's
 * grouped sigmoid router, as DeepseekV3TopkRouter does (see ops.h); the
 * routing table and the load-balancing loss's sums.  lib/model/model.c
 * runs them; the CUDA routers (kernels/cuda/moe.cu) are tested against
 * them.  Not here: the routers' projections (the linear op) and the
 * experts.
 */
#include <math.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/pool.h"

void hp_router_topk(float *probs, int32_t *sel_all, float *wsel, long N, int E, int K, int norm)
{
	for (long t = 0; t < N; t++) {
		float *p = probs + t * E;
		int32_t *sel = sel_all + t * K;
		float *ws = wsel + t * K, mx = p[0];
		double sum = 0;

		for (int x = 1; x < E; x++)
			if (p[x] > mx)
				mx = p[x];
		for (int x = 0; x < E; x++)
			sum += p[x] = expf(p[x] - mx);
		for (int x = 0; x < E; x++)
			p[x] = (float)(p[x] / sum);
		for (int k = 0; k < K; k++) {
			int best = -1;
			for (int x = 0; x < E; x++) {
				int taken = 0;
				for (int j = 0; j < k; j++)
					taken |= sel[j] == x;
				if (!taken && (best < 0 || p[x] > p[best]))
					best = x;
			}
			sel[k] = best;
			ws[k] = p[best];
		}
		if (norm) {
			float tot = 0;
			for (int k = 0; k < K; k++)
				tot += ws[k];
			for (int k = 0; k < K; k++)
				ws[k] /= tot;
		}
	}
}

void hp_router_bwd(float *dprob, const float *probs, const int32_t *sel_all, const float *wsel,
		   const float *dwsel, const double *aux, double aux_grad, long N, int E, int K, int norm)
{
	memset(dprob, 0, sizeof(float) * (size_t)N * E);
	for (long t = 0; t < N; t++) {
		const float *ws = wsel + t * K, *dw = dwsel + t * K, *p = probs + t * E;
		const int32_t *sel = sel_all + t * K;
		float *dp = dprob + t * E;
		double sdp = 0;

		if (norm) {
			/* w_j = p_j / S:  dL/dp_j = (dw_j - sum_i dw_i w_i) / S */
			double S = 0, c = 0;
			for (int k = 0; k < K; k++) {
				S += p[sel[k]];
				c += (double)dw[k] * ws[k];
			}
			for (int k = 0; k < K; k++)
				dp[sel[k]] += (float)((dw[k] - c) / S);
		} else {
			for (int k = 0; k < K; k++)
				dp[sel[k]] += dw[k];
		}
		/* the aux loss: d/dP_e of E * sum F_e P_e, P_e a mean over all MoE tokens */
		if (aux_grad != 0)
			for (int x = 0; x < E; x++)
				dp[x] += (float)(aux_grad * aux[x]);
		/* softmax: dlogit = p * (dp - sum p dp), in place */
		for (int x = 0; x < E; x++)
			sdp += (double)p[x] * dp[x];
		for (int x = 0; x < E; x++)
			dp[x] = p[x] * (float)(dp[x] - sdp);
	}
}

void hp_moe_route(int32_t *off, int32_t *row_tok, int32_t *row_slot, int32_t *tok_rows, int32_t *bad,
		  int32_t *sel, long N, int E, int K)
{
	size_t NK = (size_t)N * K;
	int32_t nbad = 0;

	memset(off, 0, sizeof(int32_t) * (size_t)(E + 1));
	for (size_t i = 0; i < NK; i++) {
		if (sel[i] < 0 || sel[i] >= E) {
			sel[i] = 0;
			nbad++;
		}
		off[sel[i] + 1]++;
	}
	for (int x = 0; x < E; x++)
		off[x + 1] += off[x];
	/* each expert's rows in token order: off[x] runs ahead as its cursor,
	 * then falls back one expert (off[x] ends at the old off[x+1]) */
	for (long t = 0; t < N; t++)
		for (int k = 0; k < K; k++) {
			int32_t r = off[sel[t * K + k]]++;
			row_tok[r] = (int32_t)t;
			row_slot[r] = k;
		}
	for (int x = E; x > 0; x--)
		off[x] = off[x - 1];
	off[0] = 0;
	*bad += nbad;
	if (!tok_rows)
		return;
	/* each token's rows in ascending order, the order of a loop over rows
	 * (its slots' rows, sorted: K is small) */
	for (size_t r = 0; r < NK; r++)
		tok_rows[(size_t)row_tok[r] * K + (size_t)row_slot[r]] = (int32_t)r;
	for (long t = 0; t < N; t++)
		for (int k = 1; k < K; k++)
			for (int j = k; j > 0 && tok_rows[t * K + j - 1] > tok_rows[t * K + j]; j--) {
				int32_t v = tok_rows[t * K + j];
				tok_rows[t * K + j] = tok_rows[t * K + j - 1];
				tok_rows[t * K + j - 1] = v;
			}
}

void hp_moe_aux_acc(double *FP, const float *probs, const int32_t *off, long N, int E)
{
	for (int x = 0; x < E; x++)
		FP[x] += off[x + 1] - off[x];
	for (long t = 0; t < N; t++)
		for (int x = 0; x < E; x++)
			FP[E + x] += probs[t * E + x];
}

void hp_moe_aux_fin(double *FP, double *aux, double *acc, int E, double n, double div)
{
	double s = 0;

	for (int x = 0; x < E; x++) {
		FP[x] /= n;
		s += FP[x] * (FP[E + x] / n);
	}
	*aux = s * E;
	if (acc)
		*acc += *aux / div;
}

/* ---- DeepSeek-V3's router: sigmoid scores, groups, top-k (see ops.h) ----
 *
 * Every choice is a repeated argmax in one total order - larger value
 * first, then lower index, a NaN counted as -inf - so ties go to the lower
 * index, a round needs no record of earlier picks but the last one (the
 * next is the first that comes after it), and K distinct experts in range
 * come out whatever the logits.  Nothing is stored but the outputs: a
 * group's score is recomputed where it is needed (2E/G adds), which costs
 * (TG + 2K) E per token, no more than the scores' E sigmoids times a few.
 * kernels/cuda/moe.cu makes the same fp32 operations in the same order.
 */

static float rg_key(float v)
{
	return isnan(v) ? -INFINITY : v;
}

/* (v, i) comes before (w, j) */
static int rg_before(float v, int i, float w, int j)
{
	return v > w || (v == w && i < j);
}

/* the choice score of expert e: its sigmoid plus its correction bias */
static float rg_choice(const float *s, const float *bias, int e)
{
	return rg_key(bias ? s[e] + bias[e] : s[e]);
}

/* group g's score: the sum of its two largest choice scores (torch's
 * topk(2) then sum: the largest plus the second) */
static float rg_group(const float *s, const float *bias, int g, int S)
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
	return rg_key(t1 + t2);
}

struct rg_args {
	float *probs, *wsel;
	int32_t *sel;
	const float *bias;
	int E, K, G, TG, norm, mask_zero;
	float scale;
};

static void rg_fwd_range(void *p, long n0, long n1)
{
	const struct rg_args *a = p;
	int E = a->E, K = a->K, G = a->G, TG = a->TG, S = a->E / a->G;
	const float *bias = a->bias;
	float masked = a->mask_zero ? 0.0f : -INFINITY;

	for (long n = n0; n < n1; n++) {
		float *s = a->probs + n * E, *ws = a->wsel + n * K;
		int32_t *sel = a->sel + n * K;
		/* the TG groups kept, the last of them (tv, ti); ti -1: all */
		float tv = 0;
		int ti = -1;

		for (int e = 0; e < E; e++)
			s[e] = (float)(1.0 / (1.0 + exp(-(double)s[e])));
		for (int r = 0; r < TG && TG < G; r++) {
			float bv = 0;
			int bi = -1;
			for (int g = 0; g < G; g++) {
				float v = rg_group(s, bias, g, S);
				if ((r == 0 || rg_before(tv, ti, v, g)) && (bi < 0 || rg_before(v, g, bv, bi))) {
					bv = v;
					bi = g;
				}
			}
			tv = bv;
			ti = bi;
		}
		/* the experts, the masked groups' at the masked value */
		for (int k = 0; k < K; k++) {
			float bv = 0;
			int bi = -1;
			for (int g = 0; g < G; g++) {
				int kept = ti < 0 || g == ti || rg_before(rg_group(s, bias, g, S), g, tv, ti);
				for (int e = g * S; e < (g + 1) * S; e++) {
					float v = kept ? rg_choice(s, bias, e) : masked;
					if ((k == 0 || rg_before(ws[k - 1], sel[k - 1], v, e)) &&
					    (bi < 0 || rg_before(v, e, bv, bi))) {
						bv = v;
						bi = e;
					}
				}
			}
			sel[k] = bi;
			ws[k] = bv;   /* the masked score, while the next round needs it */
		}
		double sum = 0;
		for (int k = 0; k < K; k++) {
			ws[k] = s[sel[k]];
			sum += ws[k];
		}
		if (a->norm) {
			float den = (float)sum + 1e-20f;
			for (int k = 0; k < K; k++)
				ws[k] /= den;
		}
		for (int k = 0; k < K; k++)
			ws[k] *= a->scale;
	}
}

void hp_router_group_fwd(float *probs, int32_t *sel, float *wsel, const float *bias, long N, int E, int K, int G,
			 int TG, int norm, float scale, int mask_zero)
{
	struct rg_args a = { .probs = probs, .wsel = wsel, .sel = sel, .bias = bias, .E = E, .K = K, .G = G,
			     .TG = TG, .norm = norm, .mask_zero = mask_zero, .scale = scale };
	long per_token = (long)E * (TG + 2 * K + 4);

	if (N > 0 && E > 0 && K > 0)
		hp_parallel_for(N, HP_POOL_GRAIN / per_token + 1, 1, rg_fwd_range, &a);
}

struct rg_bwd_args {
	float *dlogits;
	const float *probs, *dwsel;
	const int32_t *sel;
	int E, K, norm;
	float scale;
};

/* with D = sum_k s_k + 1e-20 and u_k = dwsel_k * scale, in double:
 * ds_k = u_k / D - (sum_j u_j s_j) / D^2 (norm) or u_k, and through the
 * sigmoid dlogit = ds s (1 - s), rounded once */
static void rg_bwd_range(void *p, long n0, long n1)
{
	const struct rg_bwd_args *a = p;
	int E = a->E, K = a->K;

	for (long n = n0; n < n1; n++) {
		const float *s = a->probs + n * E, *dw = a->dwsel + n * K;
		const int32_t *sel = a->sel + n * K;
		float *dl = a->dlogits + n * E;
		double D = 0, c = 0;

		memset(dl, 0, sizeof(float) * (size_t)E);
		if (a->norm) {
			for (int k = 0; k < K; k++) {
				D += s[sel[k]];
				c += (double)dw[k] * a->scale * s[sel[k]];
			}
			D += 1e-20;
		}
		for (int k = 0; k < K; k++) {
			double u = (double)dw[k] * a->scale, sx = s[sel[k]];
			double ds = a->norm ? u / D - c / (D * D) : u;
			dl[sel[k]] += (float)(ds * sx * (1.0 - sx));
		}
	}
}

void hp_router_group_bwd(float *dlogits, const float *probs, const int32_t *sel, const float *dwsel, long N, int E,
			 int K, int norm, float scale)
{
	struct rg_bwd_args a = { dlogits, probs, dwsel, sel, E, K, norm, scale };

	if (N > 0 && E > 0)
		hp_parallel_for(N, HP_POOL_GRAIN / ((long)E + 4 * K) + 1, 1, rg_bwd_range, &a);
}
