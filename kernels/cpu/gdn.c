/*
 * gdn.c - the element-wise and small kernels around Qwen3-Next's and
 * Qwen3.5's Gated DeltaNet layers and gated attention, forward and
 * backward, in plain fp32 C.  What each computes, and where transformers
 * computes it (models/qwen3_next/modeling_qwen3_next.py; qwen3_5's file
 * has the same definitions):
 *
 * 1. causal_conv1d_fn, the torch fallback that training runs: a
 *    depthwise nn.Conv1d (groups = channels, no bias, padding K-1, the
 *    first T outputs kept) over the concatenated q, k, v, then SiLU:
 *        pre[t,c] = sum_{j=0..K-1} w[c,j] * x[t-(K-1)+j, c]
 *        y[t,c]   = silu(pre[t,c])
 *    with x before the window's start taken as 0.  The start is the row's
 *    first token, or with seg the token's document start: the packed
 *    documents of one row do not see each other (what the CUDA
 *    causal-conv1d kernel does with seq_idx; transformers' fallback
 *    ignores the documents, as it does for a single document per row).
 *    Backward, with dpre = dy * silu'(pre):
 *        dx[s,c] = sum over the t whose window holds s of w[c, s-t+K-1] * dpre[t,c]
 *        dw[c,j] += sum_t dpre[t,c] * x[t-(K-1)+j, c]
 *    pre is recomputed in the backward (K multiply-adds a value, the same
 *    operations in the same order as the forward, so the same bits): the
 *    forward keeps nothing, a kept buffer of 0 floats.
 *
 * 2. Qwen3NextRMSNormGated (the GDN output norm, over each head's D
 *    values), multiplied in transformers' order:
 *        r = rsqrt(mean(x^2) + eps),  n = x * r,  y = (w * n) * silu(z)
 *    Backward, with dn = dy * silu(z) * w:
 *        dx = r * (dn - n * mean(dn * n)),  dz = dy * (w * n) * silu'(z),
 *        dw += sum over rows of dy * silu(z) * n.
 *    rstd [N] is kept by the forward for the backward.
 *
 * 3. Gated attention's output gate, Qwen3NextAttention.forward:
 *        attn_output * torch.sigmoid(gate)    (element-wise over n values)
 *    and the shared expert's gate, Qwen3NextSparseMoeBlock.forward:
 *        F.sigmoid(shared_expert_gate(h)) * shared_expert_output
 *    one logit per token broadcast over its row: y[t,:] = x[t,:] * s(gate[t]).
 *    Backward: dx = dy * s, dgate = dy * x * s(1-s) (the row variant sums
 *    dy * x over the row first).
 *
 * 4. The delta rule's gates, Qwen3NextGatedDeltaNet.forward, per token and
 *    value head h:
 *        beta = b.sigmoid()
 *        g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
 *    softplus as torch's: u > 20 ? u : log1p(exp(u)) (threshold 20, beta 1).
 *    Backward: db = dbeta * s(b)(1-s(b)), and with u = a + dt_bias[h]:
 *        da = dg * -exp(A_log[h]) * softplus'(u),   softplus'(u) = u > 20 ? 1 : sigmoid(u)
 *        ddt_bias[h] += sum over tokens of da,  dA_log[h] += sum of dg * g.
 *
 * Sigmoid everywhere is the numerically safe form: with e = exp(-|x|), which
 * never overflows, sigmoid(x) = 1/(1+e) for x >= 0 and e/(1+e) below, and
 * s(1-s) = sigmoid(x) sigmoid(-x), each factor from the same e, so neither
 * tail cancels to 0 before it must (silu(-100) is -100 e^-100, not 0).
 *
 * Threads (pool.h): every output element is computed alone, or, for a sum
 * over tokens (dw, dA_log, ddt_bias, the conv's dx), by one part in token
 * order; sums over tokens go through a double and are added to the float
 * gradient once.  So the bits do not depend on the thread count.
 *
 * Not here: the delta rule itself (kernels/cpu/deltanet.c), the
 * projections (the linear op), backend ops and their registry rows.  No
 * vector path: these are the references a faster path would be held to.
 */
#include <math.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/pool.h"

/* sigmoid(x) and sigmoid(-x) from one e = exp(-|x|), each one division */
static inline void sig2(float x, float *s, float *sm)
{
	float e = expf(-fabsf(x)), d = 1.0f + e;

	*s = (x >= 0 ? 1.0f : e) / d;
	*sm = (x >= 0 ? e : 1.0f) / d;
}

static inline float sigmoidf_safe(float x)
{
	float s, sm;

	sig2(x, &s, &sm);
	return s;
}

/* torch.nn.functional.softplus with beta 1, threshold 20 */
static inline float softplusf(float u)
{
	return u > 20.0f ? u : log1pf(expf(u));
}

/* ---- 1. causal depthwise conv1d + SiLU ------------------------------ */

struct conv_args {
	float *y, *dx, *dw;
	const float *x, *w, *dy;
	const int32_t *seg;
	long N, T;
	int C, K;
};

/* The first tap j0 of token p (position in its row) whose input is inside
 * the row and the token's document: x[p-(K-1)+j] for j >= j0.  K when the
 * window is empty (a seg past the token itself). */
static inline int conv_j0(const struct conv_args *a, long i, long p)
{
	long lo = a->seg && a->seg[i] > 0 ? a->seg[i] : 0;
	long j0 = lo - (p - (a->K - 1));

	if (j0 < 0)
		j0 = 0;
	return j0 > a->K ? a->K : (int)j0;
}

/* pre of the value at x[xi + j*C] for tap j (xi the index of tap 0, before
 * the row when the token is near its start: only taps j >= j0 are read).
 * Forward and backward both call this, so both see the same bits. */
static inline float conv_pre(const float *x, long xi, const float *wc, long C, int j0, int K)
{
	float acc = 0.0f;

	for (int j = j0; j < K; j++)
		acc += wc[j] * x[xi + j * C];
	return acc;
}

static void conv_fwd_range(void *p_, long i0, long i1)
{
	const struct conv_args *a = p_;
	long C = a->C;
	int K = a->K;

	for (long i = i0; i < i1; i++) {
		long p = i % a->T;
		int j0 = conv_j0(a, i, p);
		long x0 = (i - (K - 1)) * C;

		for (long c = 0; c < C; c++) {
			float pre = conv_pre(a->x, x0 + c, a->w + c * K, C, j0, K);

			a->y[i * C + c] = pre * sigmoidf_safe(pre);
		}
	}
}

void hp_conv1d_silu_fwd(float *y, const float *x, const float *w, const int32_t *seg, int B, int T, int C, int K)
{
	struct conv_args a = { .y = y, .x = x, .w = w, .seg = seg, .T = T, .C = C, .K = K };

	hp_parallel_for((long)B * T, HP_POOL_GRAIN / ((long)C * K + 1) + 1, 1, conv_fwd_range, &a);
}

/* dw's double sums of one block of channels, CONV_ACC / K channels at a
 * time: 8 KiB of the stack */
#define CONV_ACC HP_CONV1D_SILU_MAX_K

/*
 * The backward over channels [c0, c1), every token of every row in order.
 * Token p's dpre goes at once to the K inputs of its window (a scatter):
 * dx[p] is zeroed first, at p's own step, the first to write it, and then
 * gets its terms from tokens p, p+1, ... p+K-1 in that order.
 */
static void conv_bwd_range(void *p_, long c0, long c1)
{
	const struct conv_args *a = p_;
	long C = a->C, T = a->T;
	int K = a->K;
	long cb = CONV_ACC / K;
	double acc[CONV_ACC];

	for (long cs = c0; cs < c1; cs += cb) {
		long ce = cs + cb < c1 ? cs + cb : c1;

		memset(acc, 0, sizeof(acc));
		for (long i = 0; i < a->N; i++) {
			long p = i % T;
			int j0 = conv_j0(a, i, p);
			long x0 = (i - (K - 1)) * C;

			for (long c = cs; c < ce; c++) {
				const float *wc = a->w + c * K;
				double *ac = acc + (c - cs) * K;
				float pre = conv_pre(a->x, x0 + c, wc, C, j0, K), s, sm;

				sig2(pre, &s, &sm);
				/* silu'(pre) = s + pre * s (1 - s) */
				float dpre = a->dy[i * C + c] * (s + pre * (s * sm));

				a->dx[i * C + c] = 0.0f;
				for (int j = j0; j < K; j++) {
					a->dx[x0 + j * C + c] += wc[j] * dpre;
					ac[j] += (double)dpre * a->x[x0 + j * C + c];
				}
			}
		}
		for (long c = cs; c < ce; c++)
			for (int j = 0; j < K; j++)
				a->dw[c * K + j] += (float)acc[(c - cs) * K + j];
	}
}

void hp_conv1d_silu_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, const int32_t *seg,
			int B, int T, int C, int K)
{
	struct conv_args a = { .dx = dx, .dw = dw, .dy = dy, .x = x, .w = w, .seg = seg, .N = (long)B * T,
			       .T = T, .C = C, .K = K };

	if (K < 1 || K > CONV_ACC)
		return;
	hp_parallel_for(C, HP_POOL_GRAIN / ((long)B * T * K + 1) + 1, 16, conv_bwd_range, &a);
}

/* ---- 2. Qwen3NextRMSNormGated --------------------------------------- */

struct rmsg_args {
	float *y, *rstd, *dx, *dz, *dw;
	const float *x, *z, *w, *dy, *rstd_in;
	long N;
	int D;
	float eps;
};

static void rmsg_fwd_rows(void *p_, long n0, long n1)
{
	const struct rmsg_args *a = p_;
	long D = a->D;

	for (long n = n0; n < n1; n++) {
		const float *x = a->x + n * D, *z = a->z + n * D;
		float *y = a->y + n * D;
		double ss = 0;

		for (long c = 0; c < D; c++)
			ss += (double)x[c] * x[c];
		float r = (float)(1.0 / sqrt(ss / D + a->eps));

		a->rstd[n] = r;
		for (long c = 0; c < D; c++)
			y[c] = (a->w[c] * (x[c] * r)) * (z[c] * sigmoidf_safe(z[c]));
	}
}

void hp_rmsnorm_gated_fwd(float *y, float *rstd, const float *x, const float *z, const float *w, long N, int D,
			  float eps)
{
	struct rmsg_args a = { .y = y, .rstd = rstd, .x = x, .z = z, .w = w, .N = N, .D = D, .eps = eps };

	hp_parallel_for(N, HP_POOL_GRAIN / (D > 0 ? D : 1) + 1, 1, rmsg_fwd_rows, &a);
}

/* dx and dz, one row alone */
static void rmsg_bwd_rows(void *p_, long n0, long n1)
{
	const struct rmsg_args *a = p_;
	const float *w = a->w;
	long D = a->D;

	for (long n = n0; n < n1; n++) {
		const float *x = a->x + n * D, *z = a->z + n * D, *dy = a->dy + n * D;
		float *dx = a->dx + n * D, *dz = a->dz + n * D;
		float r = a->rstd_in[n];
		double dot = 0;

		for (long c = 0; c < D; c++) {
			float s, sm, xh = x[c] * r;

			sig2(z[c], &s, &sm);
			float dn = (dy[c] * (z[c] * s)) * w[c];

			dot += (double)dn * xh;
			/* silu'(z) = s + z * s (1 - s) */
			dz[c] = dy[c] * (w[c] * xh) * (s + z[c] * (s * sm));
		}
		float mean = (float)(dot / D);

		for (long c = 0; c < D; c++) {
			float xh = x[c] * r;
			float dn = (dy[c] * (z[c] * sigmoidf_safe(z[c]))) * w[c];

			dx[c] = r * (dn - xh * mean);
		}
	}
}

/* dw[c0..c1) += the sum over rows, in row order, of dy * silu(z) * xhat */
static void rmsg_bwd_dw_cols(void *p_, long c0, long c1)
{
	const struct rmsg_args *a = p_;
	long D = a->D;

	for (long c = c0; c < c1; c++) {
		double s = 0;

		for (long n = 0; n < a->N; n++) {
			float zc = a->z[n * D + c];

			s += (double)(a->dy[n * D + c] * (zc * sigmoidf_safe(zc))) * (a->x[n * D + c] * a->rstd_in[n]);
		}
		a->dw[c] += (float)s;
	}
}

void hp_rmsnorm_gated_bwd(float *dx, float *dz, float *dw, const float *dy, const float *x, const float *z,
			  const float *w, const float *rstd, long N, int D)
{
	struct rmsg_args a = { .dx = dx, .dz = dz, .dw = dw, .dy = dy, .x = x, .z = z, .w = w, .rstd_in = rstd,
			       .N = N, .D = D };

	hp_parallel_for(N, HP_POOL_GRAIN / (D > 0 ? D : 1) + 1, 1, rmsg_bwd_rows, &a);
	hp_parallel_for(D, HP_POOL_GRAIN / (N > 0 ? N : 1) + 1, 16, rmsg_bwd_dw_cols, &a);
}

/* ---- 3. sigmoid gates ----------------------------------------------- */

struct sg_args {
	float *y, *dx, *dgate;
	const float *x, *gate, *dy;
	long C;
};

static void sg_fwd_range(void *p_, long i0, long i1)
{
	const struct sg_args *a = p_;

	for (long i = i0; i < i1; i++)
		a->y[i] = a->x[i] * sigmoidf_safe(a->gate[i]);
}

static void sg_bwd_range(void *p_, long i0, long i1)
{
	const struct sg_args *a = p_;

	for (long i = i0; i < i1; i++) {
		float s, sm, d = a->dy[i], x = a->x[i];

		sig2(a->gate[i], &s, &sm);
		a->dx[i] = d * s;
		a->dgate[i] = (d * x) * (s * sm);
	}
}

void hp_sigmoid_gate_fwd(float *y, const float *x, const float *gate, long n)
{
	struct sg_args a = { .y = y, .x = x, .gate = gate };

	hp_parallel_for(n, HP_POOL_GRAIN, 16, sg_fwd_range, &a);
}

void hp_sigmoid_gate_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate, long n)
{
	struct sg_args a = { .dx = dx, .dgate = dgate, .dy = dy, .x = x, .gate = gate };

	hp_parallel_for(n, HP_POOL_GRAIN, 16, sg_bwd_range, &a);
}

static void sgr_fwd_rows(void *p_, long t0, long t1)
{
	const struct sg_args *a = p_;
	long C = a->C;

	for (long t = t0; t < t1; t++) {
		float s = sigmoidf_safe(a->gate[t]);

		for (long c = 0; c < C; c++)
			a->y[t * C + c] = a->x[t * C + c] * s;
	}
}

static void sgr_bwd_rows(void *p_, long t0, long t1)
{
	const struct sg_args *a = p_;
	long C = a->C;

	for (long t = t0; t < t1; t++) {
		float s, sm;
		double dot = 0;

		sig2(a->gate[t], &s, &sm);
		for (long c = 0; c < C; c++) {
			float d = a->dy[t * C + c];

			dot += (double)d * a->x[t * C + c];
			a->dx[t * C + c] = d * s;
		}
		a->dgate[t] = (float)dot * (s * sm);
	}
}

void hp_sigmoid_gate_rows_fwd(float *y, const float *x, const float *gate, long T, int C)
{
	struct sg_args a = { .y = y, .x = x, .gate = gate, .C = C };

	hp_parallel_for(T, HP_POOL_GRAIN / (C > 0 ? C : 1) + 1, 1, sgr_fwd_rows, &a);
}

void hp_sigmoid_gate_rows_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate, long T,
			      int C)
{
	struct sg_args a = { .dx = dx, .dgate = dgate, .dy = dy, .x = x, .gate = gate, .C = C };

	hp_parallel_for(T, HP_POOL_GRAIN / (C > 0 ? C : 1) + 1, 1, sgr_bwd_rows, &a);
}

/* ---- 4. the delta rule's gates beta and g --------------------------- */

struct gates_args {
	float *beta, *g, *db, *da, *dA_log, *ddt_bias;
	const float *b, *a, *A_log, *dt_bias, *dbeta, *dg;
	long N;
	int H;
};

/* Tokens a part: each value costs three transcendentals (exp, log1p, exp),
 * about eight times a streaming kernel's float. */
#define GATES_GRAIN(H) (HP_POOL_GRAIN / 8 / ((H) > 0 ? (H) : 1) + 1)

static void gates_fwd_range(void *p_, long n0, long n1)
{
	const struct gates_args *q = p_;
	int H = q->H;

	for (long n = n0; n < n1; n++)
		for (int h = 0; h < H; h++) {
			long i = n * H + h;

			q->beta[i] = sigmoidf_safe(q->b[i]);
			q->g[i] = -expf(q->A_log[h]) * softplusf(q->a[i] + q->dt_bias[h]);
		}
}

void hp_gdn_gates_fwd(float *beta, float *g, const float *b, const float *a, const float *A_log,
		      const float *dt_bias, long N, int H)
{
	struct gates_args q = { .beta = beta, .g = g, .b = b, .a = a, .A_log = A_log, .dt_bias = dt_bias, .N = N,
				.H = H };

	hp_parallel_for(N, GATES_GRAIN(H), 1, gates_fwd_range, &q);
}

static void gates_bwd_range(void *p_, long n0, long n1)
{
	const struct gates_args *q = p_;
	int H = q->H;

	for (long n = n0; n < n1; n++)
		for (int h = 0; h < H; h++) {
			long i = n * H + h;
			float s, sm, u = q->a[i] + q->dt_bias[h];

			sig2(q->b[i], &s, &sm);
			q->db[i] = q->dbeta[i] * (s * sm);
			q->da[i] = (q->dg[i] * -expf(q->A_log[h])) * (u > 20.0f ? 1.0f : sigmoidf_safe(u));
		}
}

/* the parameters' sums over tokens, one head at a time in token order */
static void gates_bwd_heads(void *p_, long h0, long h1)
{
	const struct gates_args *q = p_;
	long H = q->H;

	for (long h = h0; h < h1; h++) {
		float nA = -expf(q->A_log[h]);
		double sA = 0, sdt = 0;

		for (long n = 0; n < q->N; n++) {
			long i = n * H + h;
			float g = nA * softplusf(q->a[i] + q->dt_bias[h]);

			sdt += q->da[i];
			sA += (double)q->dg[i] * g;
		}
		q->dA_log[h] += (float)sA;
		q->ddt_bias[h] += (float)sdt;
	}
}

void hp_gdn_gates_bwd(float *db, float *da, float *dA_log, float *ddt_bias, const float *dbeta, const float *dg,
		      const float *b, const float *a, const float *A_log, const float *dt_bias, long N, int H)
{
	struct gates_args q = { .db = db, .da = da, .dA_log = dA_log, .ddt_bias = ddt_bias, .dbeta = dbeta,
				.dg = dg, .b = b, .a = a, .A_log = A_log, .dt_bias = dt_bias, .N = N, .H = H };

	hp_parallel_for(N, GATES_GRAIN(H), 1, gates_bwd_range, &q);
	hp_parallel_for(H, HP_POOL_GRAIN / 8 / (N > 0 ? N : 1) + 1, 1, gates_bwd_heads, &q);
}
