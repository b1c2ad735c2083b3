/*
 * test-kernels.c - every CPU kernel's backward against finite differences
 * of its forward, and every fast kernel against its reference.
 *
 * The finite-difference check works on the scalar L = sum(out * R) for a
 * fixed random R: the analytic gradient is the backward fed with dout = R;
 * the numeric one is (L(x+h) - L(x-h)) / 2h per element, in float, so the
 * tolerance (relative L2 error 1e-2 with h = 1e-2) reflects float forward
 * passes, not the accuracy of the kernels, which the comparisons against
 * PyTorch in t/t0200 pin to 1e-4.
 */
#include <math.h>

#include "cpu/ops.h"
#include "hfconfig.h"
#include "tap.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
	/* xorshift64*: deterministic, good enough for test data */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (float)((rng_state * 0x2545f4914f6cdd1dull) >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}

static float *rnd(size_t n)
{
	float *p = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		p[i] = frand();
	return p;
}

static double rel_l2(const float *a, const float *b, size_t n)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		den += (double)b[i] * b[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double dot(const float *a, const float *b, size_t n)
{
	double s = 0;

	for (size_t i = 0; i < n; i++)
		s += (double)a[i] * b[i];
	return s;
}

/* numeric gradient of L(x) = dot(f(x), R) w.r.t. the n floats at x */
typedef double (*lossfn)(void *ctx);
static void numgrad(float *grad, float *x, size_t n, lossfn L, void *ctx)
{
	const float h = 1e-2f;

	for (size_t i = 0; i < n; i++) {
		float keep = x[i];
		x[i] = keep + h;
		double lp = L(ctx);
		x[i] = keep - h;
		double lm = L(ctx);
		x[i] = keep;
		grad[i] = (float)((lp - lm) / (2 * h));
	}
}

#define FD_TOL 1e-2

/* ---- RMSNorm ---- */
struct rms_ctx { float *x, *w, *y, *rstd, *R; int N, C; };
static double rms_loss(void *p)
{
	struct rms_ctx *c = p;
	hp_rmsnorm_fwd(c->y, c->rstd, c->x, c->w, c->N, c->C, 1e-5f);
	return dot(c->y, c->R, (size_t)c->N * c->C);
}

static void test_rmsnorm(void)
{
	int N = 3, C = 16;
	struct rms_ctx c = { rnd(N * C), rnd(C), rnd(N * C), rnd(N), rnd(N * C), N, C };
	float *dx = calloc(N * C, 4), *dw = calloc(C, 4), *nx = malloc(N * C * 4), *nw = malloc(C * 4);

	rms_loss(&c);
	hp_rmsnorm_bwd(dx, dw, c.R, c.x, c.w, c.rstd, N, C, 0);
	numgrad(nx, c.x, N * C, rms_loss, &c);
	numgrad(nw, c.w, C, rms_loss, &c);
	ok(rel_l2(dx, nx, N * C) < FD_TOL, "rmsnorm dx matches finite differences (%.2e)", rel_l2(dx, nx, N * C));
	ok(rel_l2(dw, nw, C) < FD_TOL, "rmsnorm dw matches finite differences (%.2e)", rel_l2(dw, nw, C));
	/* accumulate flag adds */
	float *dx2 = malloc(N * C * 4);
	memcpy(dx2, dx, N * C * 4);
	memset(dw, 0, C * 4);
	hp_rmsnorm_bwd(dx2, dw, c.R, c.x, c.w, c.rstd, N, C, 1);
	int okacc = 1;
	for (int i = 0; i < N * C; i++)
		okacc &= fabsf(dx2[i] - 2 * dx[i]) <= 1e-6f * (1 + fabsf(dx[i]));
	ok(okacc, "rmsnorm backward accumulates into dx when asked");
	free(c.x); free(c.w); free(c.y); free(c.rstd); free(c.R); free(dx); free(dw); free(nx); free(nw); free(dx2);
}

/* ---- RoPE ---- */
struct rope_ctx { float *x, *y, *R, *cs, *sn; int32_t *pos; int N, H, D; };
static double rope_loss(void *p)
{
	struct rope_ctx *c = p;
	memcpy(c->y, c->x, sizeof(float) * c->N * c->H * c->D);
	hp_rope_fwd(c->y, c->pos, c->cs, c->sn, c->N, c->H, c->D);
	return dot(c->y, c->R, (size_t)c->N * c->H * c->D);
}

static void test_rope(void)
{
	int N = 5, H = 2, D = 8, T = 5;
	size_t n = (size_t)N * H * D;
	struct rope_ctx c = { rnd(n), rnd(n), rnd(n), malloc(T * D / 2 * 4), malloc(T * D / 2 * 4),
			      malloc(N * 4), N, H, D };
	float *dx = malloc(n * 4), *nx = malloc(n * 4);

	struct hp_model_spec rs = { .head_dim = D, .max_pos = T };

	rs.rope = (struct hp_rope_spec){ .type = HP_ROPE_DEFAULT, .theta = 10000.0 };
	hp_model_spec_rope_table(&rs, c.cs, c.sn, T);
	for (int i = 0; i < N; i++)
		c.pos[i] = i;
	memcpy(dx, c.R, n * 4);
	hp_rope_bwd(dx, c.pos, c.cs, c.sn, N, H, D);
	numgrad(nx, c.x, n, rope_loss, &c);
	ok(rel_l2(dx, nx, n) < FD_TOL, "rope backward matches finite differences (%.2e)", rel_l2(dx, nx, n));
	/* position 0 is the identity; position 1, pair 0 rotates by exactly 1 radian */
	float v[8] = { 1, 0, 0, 0, 0, 0, 0, 0 };
	int32_t p1 = 1;
	hp_rope_fwd(v, &p1, c.cs, c.sn, 1, 1, 8);
	ok(fabsf(v[0] - cosf(1.0f)) < 1e-6f && fabsf(v[4] - sinf(1.0f)) < 1e-6f,
	   "rope rotates the (i, i+D/2) pair by pos*theta^(-2i/D) (rotate_half layout)");
	/* yarn scales cos and sin: the rotation is no longer orthogonal, and
	 * the backward must still be its adjoint */
	rs.rope = (struct hp_rope_spec){ .type = HP_ROPE_YARN, .theta = 10000.0, .factor = 4.0,
					 .orig_max_pos = 2, .attention_factor = 1.1386, .beta_fast = 32,
					 .beta_slow = 1, .truncate = 1 };
	hp_model_spec_rope_table(&rs, c.cs, c.sn, T);
	memcpy(dx, c.R, n * 4);
	hp_rope_bwd(dx, c.pos, c.cs, c.sn, N, H, D);
	numgrad(nx, c.x, n, rope_loss, &c);
	ok(rel_l2(dx, nx, n) < FD_TOL, "yarn rope (attention factor 1.1386) backward matches finite "
	   "differences (%.2e)", rel_l2(dx, nx, n));
	v[0] = 1;
	memset(v + 1, 0, 7 * sizeof(float));
	p1 = 0;
	hp_rope_fwd(v, &p1, c.cs, c.sn, 1, 1, 8);
	ok(fabsf(v[0] - 1.1386f) < 1e-6f, "yarn's position 0 scales by the attention factor (%.7g)", v[0]);
	free(c.x); free(c.y); free(c.R); free(c.cs); free(c.sn); free(c.pos); free(dx); free(nx);
}

/* ---- SwiGLU ---- */
struct sw_ctx { float *g, *u, *h, *R; int n; };
static double sw_loss(void *p)
{
	struct sw_ctx *c = p;
	hp_swiglu_fwd(c->h, c->g, c->u, c->n);
	return dot(c->h, c->R, (size_t)c->n);
}

static void test_swiglu(void)
{
	int n = 40;
	struct sw_ctx c = { rnd(n), rnd(n), rnd(n), rnd(n), n };
	float *dg = malloc(n * 4), *du = malloc(n * 4), *ng = malloc(n * 4), *nu = malloc(n * 4);

	for (int i = 0; i < n; i++)
		c.g[i] *= 4;
	hp_swiglu_bwd(dg, du, c.R, c.g, c.u, n);
	numgrad(ng, c.g, n, sw_loss, &c);
	numgrad(nu, c.u, n, sw_loss, &c);
	ok(rel_l2(dg, ng, n) < FD_TOL && rel_l2(du, nu, n) < FD_TOL,
	   "swiglu backward matches finite differences (%.2e, %.2e)", rel_l2(dg, ng, n), rel_l2(du, nu, n));
	free(c.g); free(c.u); free(c.h); free(c.R); free(dg); free(du); free(ng); free(nu);
}

/* ---- cross-entropy ---- */
struct ce_ctx { float *l; int32_t *t; int N, V; };
static double ce_loss(void *p)
{
	struct ce_ctx *c = p;
	double s;
	long n;
	hp_cross_entropy_fwd(&s, &n, c->l, c->t, c->N, c->V);
	return s / n;
}

static void test_ce(void)
{
	int N = 4, V = 11;
	int32_t t[4] = { 3, HP_IGNORE_INDEX, 0, 10 };
	struct ce_ctx c = { rnd(N * V), t, N, V };
	float *d = malloc(N * V * 4), *nd = malloc(N * V * 4);
	double s;
	long cnt;

	ok(hp_cross_entropy_fwd(&s, &cnt, c.l, t, N, V) == 0 && cnt == 3, "cross-entropy skips ignore_index -100");
	hp_cross_entropy_bwd(d, c.l, t, N, V, 1.0f / 3);
	numgrad(nd, c.l, N * V, ce_loss, &c);
	ok(rel_l2(d, nd, N * V) < FD_TOL, "cross-entropy backward matches finite differences (%.2e)",
	   rel_l2(d, nd, N * V));
	int zero = 1;
	for (int v = 0; v < V; v++)
		zero &= d[V + v] == 0;
	ok(zero, "ignored rows get zero gradient");
	int32_t bad[1] = { 11 };
	ok(hp_cross_entropy_fwd(&s, &cnt, c.l, bad, 1, V) == -1, "a target outside the vocabulary is refused");
	/* uniform logits: loss = log V exactly */
	float uni[11] = { 0 };
	int32_t t0[1] = { 5 };
	hp_cross_entropy_fwd(&s, &cnt, uni, t0, 1, V);
	ok(fabs(s - log(11.0)) < 1e-12, "uniform logits give log(V)");
	free(c.l); free(d); free(nd);
}

/* ---- linear ---- */
struct lin_ctx { float *x, *W, *b, *y, *R; int N, K, O; };
static double lin_loss(void *p)
{
	struct lin_ctx *c = p;
	hp_linear_fwd_ref(c->y, c->x, c->W, c->b, c->N, c->K, c->O);
	return dot(c->y, c->R, (size_t)c->N * c->O);
}

static void test_linear(void)
{
	int N = 6, K = 7, O = 5;
	struct lin_ctx c = { rnd(N * K), rnd(O * K), rnd(O), rnd(N * O), rnd(N * O), N, K, O };
	float *dx = malloc(N * K * 4), *dW = calloc(O * K, 4), *db = calloc(O, 4);
	float *nx = malloc(N * K * 4), *nW = malloc(O * K * 4), *nb = malloc(O * 4);

	hp_linear_bwd_ref(dx, dW, db, c.R, c.x, c.W, N, K, O, 0);
	numgrad(nx, c.x, N * K, lin_loss, &c);
	numgrad(nW, c.W, O * K, lin_loss, &c);
	numgrad(nb, c.b, O, lin_loss, &c);
	ok(rel_l2(dx, nx, N * K) < FD_TOL && rel_l2(dW, nW, O * K) < FD_TOL && rel_l2(db, nb, O) < FD_TOL,
	   "linear reference backward matches finite differences");

	/* the BLAS table against the reference, forward and backward */
	int N2 = 33, K2 = 40, O2 = 29;
	float *x = rnd(N2 * K2), *W = rnd(O2 * K2), *b = rnd(O2), *dy = rnd(N2 * O2);
	float *y1 = malloc(N2 * O2 * 4), *y2 = malloc(N2 * O2 * 4);
	float *dx1 = rnd(N2 * K2), *dx2 = malloc(N2 * K2 * 4), *dW1 = rnd(O2 * K2), *dW2 = malloc(O2 * K2 * 4);
	float *db1 = rnd(O2), *db2 = malloc(O2 * 4);
	memcpy(dx2, dx1, N2 * K2 * 4);
	memcpy(dW2, dW1, O2 * K2 * 4);
	memcpy(db2, db1, O2 * 4);
	hp_cpu_ops_reference.linear_fwd(y1, x, W, b, N2, K2, O2);
	hp_cpu_ops_blas.linear_fwd(y2, x, W, b, N2, K2, O2);
	ok(rel_l2(y2, y1, N2 * O2) < 1e-6, "blas linear forward equals the reference (%.2e)", rel_l2(y2, y1, N2 * O2));
	hp_cpu_ops_reference.linear_bwd(dx1, dW1, db1, dy, x, W, N2, K2, O2, 1);
	hp_cpu_ops_blas.linear_bwd(dx2, dW2, db2, dy, x, W, N2, K2, O2, 1);
	ok(rel_l2(dx2, dx1, N2 * K2) < 1e-6 && rel_l2(dW2, dW1, O2 * K2) < 1e-6 && rel_l2(db2, db1, O2) < 1e-6,
	   "blas linear backward (accumulating) equals the reference");
	free(c.x); free(c.W); free(c.b); free(c.y); free(c.R); free(dx); free(dW); free(db);
	free(nx); free(nW); free(nb); free(x); free(W); free(b); free(dy); free(y1); free(y2);
	free(dx1); free(dx2); free(dW1); free(dW2); free(db1); free(db2);
}

/* ---- attention ---- */
struct att_ctx { float *q, *k, *v, *o, *P, *R; int B, T, H, KV, D; const int32_t *seg; };
static double att_loss(void *p)
{
	struct att_ctx *c = p;
	hp_attention_fwd_ref(c->o, c->P, c->q, c->k, c->v, c->seg, c->B, c->T, c->H, c->KV, c->D);
	return dot(c->o, c->R, (size_t)c->B * c->T * c->H * c->D);
}

static void test_attention(void)
{
	int B = 2, T = 5, H = 4, KV = 2, D = 4;
	size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D, nP = (size_t)B * H * T * T;
	struct att_ctx c = { rnd(nq), rnd(nk), rnd(nk), rnd(nq), rnd(nP), rnd(nq), B, T, H, KV, D, NULL };
	float *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4), *scr = malloc(T * T * 4);
	float *nq_ = malloc(nq * 4), *nk_ = malloc(nk * 4), *nv_ = malloc(nk * 4);

	att_loss(&c);
	hp_attention_bwd_ref(dq, dk, dv, c.R, c.P, c.q, c.k, c.v, c.seg, scr, B, T, H, KV, D);
	numgrad(nq_, c.q, nq, att_loss, &c);
	numgrad(nk_, c.k, nk, att_loss, &c);
	numgrad(nv_, c.v, nk, att_loss, &c);
	ok(rel_l2(dq, nq_, nq) < FD_TOL, "attention dq matches finite differences (%.2e)", rel_l2(dq, nq_, nq));
	ok(rel_l2(dk, nk_, nk) < FD_TOL, "attention dk (GQA, summed over the group) matches (%.2e)",
	   rel_l2(dk, nk_, nk));
	ok(rel_l2(dv, nv_, nk) < FD_TOL, "attention dv matches finite differences (%.2e)", rel_l2(dv, nv_, nk));
	/* causality: the first token's output depends on token 0 only */
	float keep = c.k[(size_t)(T - 1) * KV * D];
	att_loss(&c);
	float o0 = c.o[0];
	c.k[(size_t)(T - 1) * KV * D] = keep + 5;
	att_loss(&c);
	ok(c.o[0] == o0, "a later key does not change an earlier output (causal mask)");
	c.k[(size_t)(T - 1) * KV * D] = keep;

	/* BLAS path against the reference */
	int T2 = 37, H2 = 4, KV2 = 2, D2 = 16, B2 = 2;
	size_t mq = (size_t)B2 * T2 * H2 * D2, mk = (size_t)B2 * T2 * KV2 * D2, mP = (size_t)B2 * H2 * T2 * T2;
	float *q = rnd(mq), *k = rnd(mk), *v = rnd(mk), *dout = rnd(mq);
	float *o1 = malloc(mq * 4), *o2 = malloc(mq * 4), *P1 = malloc(mP * 4), *P2 = malloc(mP * 4);
	float *a1 = malloc(mq * 4), *a2 = malloc(mq * 4), *k1 = malloc(mk * 4), *k2 = malloc(mk * 4);
	float *v1 = malloc(mk * 4), *v2 = malloc(mk * 4), *s2 = malloc((size_t)T2 * T2 * 4);
	hp_cpu_ops_reference.attention_fwd(o1, P1, q, k, v, NULL, B2, T2, H2, KV2, D2);
	hp_cpu_ops_blas.attention_fwd(o2, P2, q, k, v, NULL, B2, T2, H2, KV2, D2);
	ok(rel_l2(o2, o1, mq) < 1e-5 && rel_l2(P2, P1, mP) < 1e-5, "blas attention forward equals the reference");
	hp_cpu_ops_reference.attention_bwd(a1, k1, v1, dout, P1, q, k, v, NULL, s2, B2, T2, H2, KV2, D2);
	hp_cpu_ops_blas.attention_bwd(a2, k2, v2, dout, P2, q, k, v, NULL, s2, B2, T2, H2, KV2, D2);
	ok(rel_l2(a2, a1, mq) < 1e-5 && rel_l2(k2, k1, mk) < 1e-5 && rel_l2(v2, v1, mk) < 1e-5,
	   "blas attention backward equals the reference (%.2e %.2e %.2e)",
	   rel_l2(a2, a1, mq), rel_l2(k2, k1, mk), rel_l2(v2, v1, mk));
	free(c.q); free(c.k); free(c.v); free(c.o); free(c.P); free(c.R); free(dq); free(dk); free(dv);
	free(scr); free(nq_); free(nk_); free(nv_); free(q); free(k); free(v); free(dout); free(o1);
	free(o2); free(P1); free(P2); free(a1); free(a2); free(k1); free(k2); free(v1); free(v2); free(s2);
}

/* ---- attention over packed rows (block-diagonal causal mask) ---- */
static void test_attention_segments(void)
{
	int B = 2, T = 5, H = 4, KV = 2, D = 4;
	size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D, nP = (size_t)B * H * T * T;
	int32_t seg[10] = { 0, 0, 2, 2, 2,   0, 1, 1, 3, 4 };
	struct att_ctx c = { rnd(nq), rnd(nk), rnd(nk), rnd(nq), rnd(nP), rnd(nq), B, T, H, KV, D, seg };
	float *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4), *scr = malloc(T * T * 4);
	float *nq_ = malloc(nq * 4), *nk_ = malloc(nk * 4), *nv_ = malloc(nk * 4);

	att_loss(&c);
	hp_attention_bwd_ref(dq, dk, dv, c.R, c.P, c.q, c.k, c.v, seg, scr, B, T, H, KV, D);
	numgrad(nq_, c.q, nq, att_loss, &c);
	numgrad(nk_, c.k, nk, att_loss, &c);
	numgrad(nv_, c.v, nk, att_loss, &c);
	ok(rel_l2(dq, nq_, nq) < FD_TOL && rel_l2(dk, nk_, nk) < FD_TOL && rel_l2(dv, nv_, nk) < FD_TOL,
	   "packed attention backward matches finite differences (%.2e %.2e %.2e)",
	   rel_l2(dq, nq_, nq), rel_l2(dk, nk_, nk), rel_l2(dv, nv_, nk));

	/* a document packed at offset a computes what it computes alone */
	int T2 = 150, a = 61, L = T2 - a, H2 = 2, KV2 = 1, D2 = 16;
	size_t mq = (size_t)T2 * H2 * D2, mk = (size_t)T2 * KV2 * D2;
	float *q = rnd(mq), *k = rnd(mk), *v = rnd(mk), *dout = rnd(mq);
	float *o = malloc(mq * 4), *P = malloc((size_t)H2 * T2 * T2 * 4), *oa = malloc(mq * 4);
	float *Pa = malloc((size_t)H2 * T2 * T2 * 4), *s2 = malloc((size_t)T2 * T2 * 4);
	int32_t *sg = malloc(T2 * sizeof(int32_t));
	for (int i = 0; i < T2; i++)
		sg[i] = i < a ? 0 : a;
	const struct hp_cpu_ops *tabs[2] = { &hp_cpu_ops_reference, &hp_cpu_ops_blas };
	for (int t = 0; t < 2; t++) {
		tabs[t]->attention_fwd(o, P, q, k, v, sg, 1, T2, H2, KV2, D2);
		tabs[t]->attention_fwd(oa, Pa, q + (size_t)a * H2 * D2, k + (size_t)a * KV2 * D2,
				       v + (size_t)a * KV2 * D2, NULL, 1, L, H2, KV2, D2);
		ok(rel_l2(o + (size_t)a * H2 * D2, oa, (size_t)L * H2 * D2) < 1e-6,
		   "%s: a packed document's attention equals the document alone (%.2e)", tabs[t]->name,
		   rel_l2(o + (size_t)a * H2 * D2, oa, (size_t)L * H2 * D2));
	}
	/* blas against reference with segments crossing 64-row blocks, forward and backward */
	int32_t *sg3 = malloc(2 * T2 * sizeof(int32_t));
	int starts[] = { 0, 7, 70, 71, 129 };
	for (int b = 0; b < 2; b++)
		for (int i = 0; i < T2; i++) {
			int st = 0;
			for (int u = 0; u < 5; u++)
				if (starts[u] + b * 3 <= i)
					st = starts[u] + b * 3;
			sg3[b * T2 + i] = st;
		}
	size_t bq = 2 * mq, bk = 2 * mk, bP = (size_t)2 * H2 * T2 * T2;
	float *q3 = rnd(bq), *k3 = rnd(bk), *v3 = rnd(bk), *do3 = rnd(bq);
	float *o1 = malloc(bq * 4), *o2 = malloc(bq * 4), *P1 = malloc(bP * 4), *P2 = malloc(bP * 4);
	float *a1 = malloc(bq * 4), *a2 = malloc(bq * 4), *k1 = malloc(bk * 4), *k2 = malloc(bk * 4);
	float *v1 = malloc(bk * 4), *v2 = malloc(bk * 4);
	hp_cpu_ops_reference.attention_fwd(o1, P1, q3, k3, v3, sg3, 2, T2, H2, KV2, D2);
	hp_cpu_ops_blas.attention_fwd(o2, P2, q3, k3, v3, sg3, 2, T2, H2, KV2, D2);
	ok(rel_l2(o2, o1, bq) < 1e-5 && rel_l2(P2, P1, bP) < 1e-5,
	   "blas packed attention forward equals the reference (%.2e)", rel_l2(o2, o1, bq));
	hp_cpu_ops_reference.attention_bwd(a1, k1, v1, do3, P1, q3, k3, v3, sg3, s2, 2, T2, H2, KV2, D2);
	hp_cpu_ops_blas.attention_bwd(a2, k2, v2, do3, P2, q3, k3, v3, sg3, s2, 2, T2, H2, KV2, D2);
	ok(rel_l2(a2, a1, bq) < 1e-5 && rel_l2(k2, k1, bk) < 1e-5 && rel_l2(v2, v1, bk) < 1e-5,
	   "blas packed attention backward equals the reference (%.2e %.2e %.2e)",
	   rel_l2(a2, a1, bq), rel_l2(k2, k1, bk), rel_l2(v2, v1, bk));
	free(c.q); free(c.k); free(c.v); free(c.o); free(c.P); free(c.R); free(dq); free(dk); free(dv);
	free(scr); free(nq_); free(nk_); free(nv_); free(q); free(k); free(v); free(dout); free(o); free(P);
	free(oa); free(Pa); free(s2); free(sg); free(sg3); free(q3); free(k3); free(v3); free(do3);
	free(o1); free(o2); free(P1); free(P2); free(a1); free(a2); free(k1); free(k2); free(v1); free(v2);
}

/* ---- embedding ---- */
static void test_embedding(void)
{
	float table[12] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 }, out[6], dt[12] = { 0 };
	float dout[6] = { 1, 1, 1, 2, 2, 2 };
	int32_t ids[2] = { 3, 3 };

	hp_embedding_fwd(out, ids, table, 2, 3);
	ok(out[0] == 9 && out[5] == 11, "embedding gathers rows");
	hp_embedding_bwd(dt, dout, ids, 2, 3, -1);
	ok(dt[9] == 3 && dt[11] == 3 && dt[0] == 0, "embedding backward scatter-adds repeated ids");
	memset(dt, 0, sizeof(dt));
	ids[1] = 1;
	hp_embedding_bwd(dt, dout, ids, 2, 3, 3);
	ok(dt[9] == 0 && dt[3] == 2, "the padding_idx row gets no gradient, the others do");
}

/* ---- the vector element-wise kernels against their references ---- */
static void test_vec_paths(void)
{
	long n = 1001;   /* not a multiple of 8: exercises the tails */
	float *g = rnd(n), *u = rnd(n), *dh = rnd(n);
	float *h1 = malloc(n * 4), *h2 = malloc(n * 4), *dg1 = malloc(n * 4), *dg2 = malloc(n * 4);
	float *du1 = malloc(n * 4), *du2 = malloc(n * 4);

	for (long i = 0; i < n; i++)
		g[i] *= 30;   /* saturated sigmoids both ways */
	hp_cpu_ops_reference.swiglu_fwd(h1, g, u, n);
	hp_cpu_ops_blas.swiglu_fwd(h2, g, u, n);
	ok(rel_l2(h2, h1, n) < 1e-6, "vector swiglu forward equals the reference (%.2e)", rel_l2(h2, h1, n));
	hp_cpu_ops_reference.swiglu_bwd(dg1, du1, dh, g, u, n);
	hp_cpu_ops_blas.swiglu_bwd(dg2, du2, dh, g, u, n);
	ok(rel_l2(dg2, dg1, n) < 1e-6 && rel_l2(du2, du1, n) < 1e-6,
	   "vector swiglu backward equals the reference (%.2e %.2e)", rel_l2(dg2, dg1, n), rel_l2(du2, du1, n));

	int N = 7, V = 1003;
	float *l = rnd((size_t)N * V), *d1 = malloc((size_t)N * V * 4), *d2 = malloc((size_t)N * V * 4);
	int32_t t[7] = { 0, 1002, HP_IGNORE_INDEX, 500, 7, 8, 9 };
	double s1, s2;
	long c1, c2;
	for (long i = 0; i < (long)N * V; i++)
		l[i] *= 20;
	hp_cpu_ops_reference.cross_entropy_fwd(&s1, &c1, l, t, N, V);
	hp_cpu_ops_blas.cross_entropy_fwd(&s2, &c2, l, t, N, V);
	ok(c1 == c2 && fabs(s2 - s1) <= 1e-6 * fabs(s1), "vector cross-entropy loss equals the reference (%.3e)",
	   fabs(s2 - s1));
	hp_cpu_ops_reference.cross_entropy_bwd(d1, l, t, N, V, 0.25f);
	memcpy(d2, l, (size_t)N * V * 4);
	hp_cpu_ops_blas.cross_entropy_bwd(d2, d2, t, N, V, 0.25f);   /* in place, as the model calls it */
	ok(rel_l2(d2, d1, (size_t)N * V) < 1e-6, "vector cross-entropy gradient (in place) equals the reference (%.2e)",
	   rel_l2(d2, d1, (size_t)N * V));
	free(g); free(u); free(dh); free(h1); free(h2); free(dg1); free(dg2); free(du1); free(du2);
	free(l); free(d1); free(d2);
}

/* Vocab-parallel cross-entropy: the logits cut into tp ranges, the two
 * reductions done here by hand, against the CE of whole rows. */
static void test_vocab_parallel_ce(void)
{
	enum { N = 9, V = 103 };
	float *l = rnd((size_t)N * V), dref[N * V], dvp[N * V], mx[N], part[4][N];
	double st[N * 2], pst[4][N * 2], ref, got;
	int32_t tg[N] = { 0, 102, 51, -100, 7, 25, 26, 77, 101 };
	long cr, cg;

	for (int i = 0; i < N * V; i++)
		l[i] *= 4;
	hp_cross_entropy_fwd(&ref, &cr, l, tg, N, V);
	hp_cross_entropy_bwd(dref, l, tg, N, V, 1.0f / (float)cr);
	for (int tp = 1; tp <= 4; tp++) {
		int w = (V + tp - 1) / tp, bad = 0;
		float sl[N * V];

		/* pass 1 and the MAX all-reduce */
		for (int r = 0; r < tp; r++) {
			int v0 = r * w, vl = v0 + w > V ? V - v0 : w;
			for (int n = 0; n < N; n++)
				memcpy(sl + n * vl, l + n * V + v0, sizeof(float) * (size_t)vl);
			hp_vp_ce_max(part[r], sl, N, vl);
		}
		for (int n = 0; n < N; n++) {
			mx[n] = part[0][n];
			for (int r = 1; r < tp; r++)
				mx[n] = part[r][n] > mx[n] ? part[r][n] : mx[n];
		}
		/* pass 2 and the SUM all-reduce */
		memset(st, 0, sizeof(st));
		for (int r = 0; r < tp; r++) {
			int v0 = r * w, vl = v0 + w > V ? V - v0 : w;
			for (int n = 0; n < N; n++)
				memcpy(sl + n * vl, l + n * V + v0, sizeof(float) * (size_t)vl);
			hp_vp_ce_sums(pst[r], sl, mx, tg, N, vl, v0);
			for (int i = 0; i < 2 * N; i++)
				st[i] += pst[r][i];
		}
		bad |= hp_vp_ce_loss(&got, &cg, st, mx, tg, N, V);
		for (int r = 0; r < tp; r++) {
			int v0 = r * w, vl = v0 + w > V ? V - v0 : w;
			for (int n = 0; n < N; n++)
				memcpy(sl + n * vl, l + n * V + v0, sizeof(float) * (size_t)vl);
			hp_vp_ce_bwd(sl, sl, st, mx, tg, N, vl, v0, 1.0f / (float)cg);
			for (int n = 0; n < N; n++)
				memcpy(dvp + n * V + v0, sl + n * vl, sizeof(float) * (size_t)vl);
		}
		ok(!bad && cg == cr && fabs(got - ref) < 1e-9 * fabs(ref) && rel_l2(dvp, dref, N * V) < 1e-6,
		   "vocab-parallel cross-entropy over %d ranks equals the whole rows' (loss %.3e, grad %.1e)",
		   tp, fabs(got - ref) / fabs(ref), rel_l2(dvp, dref, N * V));
	}
	free(l);
}

int main(void)
{
	test_embedding();
	test_rmsnorm();
	test_rope();
	test_swiglu();
	test_ce();
	test_linear();
	test_attention();
	test_attention_segments();
	test_vec_paths();
	test_vocab_parallel_ce();
	return tap_done();
}
