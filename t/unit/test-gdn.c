/*
 * test-gdn.c - kernels/cpu/gdn.c, the small kernels of Qwen3-Next's and
 * Qwen3.5's Gated DeltaNet layers and gated attention, against the
 * formulas of transformers' modeling_qwen3_next.py written here plainly
 * in double: the causal depthwise conv1d + SiLU (with documents), the
 * gated RMSNorm, the two sigmoid gates, and the delta rule's beta and g.
 *
 * Forward: element-wise bounds (tap.h, tap_bound_err) against the double
 * reference computed from the kernels' float inputs; each bound's count of
 * roundings is written where it is set.
 *
 * Backward: against central differences of the double reference's loss
 * L = sum R * y (R the kernel's dy), step 1e-5 (times |v| above 1): the
 * truncation, h^2 f''' / 6, and the cancellation, 1e-16 L / h, are both
 * near 1e-11 relative, far below the float kernels' own error.  That error
 * is a few roundings per element (a chain of products, and sums of at most
 * D = 64 terms in double or of K = 4 in float), each within u = 6e-8 of
 * the element's terms: a few u of relative L2 unless a sum cancels (seen:
 * at most 1.03e-7, under 2 u).  So each gradient must be within FD_TOL =
 * 1e-6 (17 u) relative L2 of the differences, while a wrong term (one tap,
 * one factor) is off by 1e-2 or more.
 *
 * Each comparison also runs once with one parameter of the kernel
 * perturbed (by 1e-3 in the forward, 1e-2 in the backward, far above the
 * bounds) and must then fail: the test can see an error of that size.
 * Then: two documents in a row give the bits of the two alone, the
 * accumulated gradients accumulate (two calls give exactly twice one),
 * saturated inputs stay finite and reach their limits, and 1 and 4 threads
 * give the same bits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cpu/ops.h"
#include "cpu/pool.h"
#include "tap.h"

#define FD_TOL 1e-6

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double urand(void)
{
	return tap_urand(&rng);
}

/* uniform in [lo, hi) */
static float *ufill(size_t n, double lo, double hi)
{
	float *x = malloc(n * sizeof(float) + 4);

	for (size_t i = 0; i < n; i++)
		x[i] = (float)(lo + (hi - lo) * urand());
	return x;
}

static double *todbl(const float *x, size_t n)
{
	double *d = malloc(n * sizeof(double) + 8);

	for (size_t i = 0; i < n; i++)
		d[i] = x[i];
	return d;
}

static float *tofloat(const double *x, size_t n)
{
	float *f = malloc(n * sizeof(float) + 4);

	for (size_t i = 0; i < n; i++)
		f[i] = (float)x[i];
	return f;
}

static float *fcopy(const float *x, size_t n)
{
	float *f = malloc(n * sizeof(float) + 4);

	memcpy(f, x, n * sizeof(float));
	return f;
}

static double dsig(double x)
{
	return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}

static double dsilu(double x)
{
	return x * dsig(x);
}

static double dsoftplus(double u)
{
	return u > 20 ? u : log1p(exp(u));
}

/* central differences of f at every v[i] */
static void fd_grad(double *grad, double *v, size_t n, double (*f)(void *), void *ctx)
{
	for (size_t i = 0; i < n; i++) {
		double save = v[i], h = 1e-5 * (fabs(save) > 1 ? fabs(save) : 1);

		v[i] = save + h;
		double lp = f(ctx);
		v[i] = save - h;
		double lm = f(ctx);
		v[i] = save;
		grad[i] = (lp - lm) / (2 * h);
	}
}

/* relative L2 of a float gradient against double differences */
static double grad_err(const float *got, const double *fd, size_t n)
{
	float *w = tofloat(fd, n);
	double e = tap_rel_l2(got, w, n, 0);

	free(w);
	return e;
}

/* the verdict on one comparison: err <= bound normally; > bound when the
 * kernel ran on a perturbed input */
static void verdict(double err, double bound, int perturb, const char *what)
{
	if (!perturb)
		ok(err <= bound, "%s (error %.3g, bound %.3g)", what, err, bound);
	else
		ok(err > bound, "%s, one parameter perturbed: the check fails (error %.3g > %.3g)", what, err, bound);
}

/* ---- 1. conv1d + SiLU ------------------------------------------------ */

struct conv_ctx {
	double *x, *w, *R;
	const int32_t *seg;
	int B, T, C, K;
};

/* y = silu(pre), and mag = sum |w x| over the window, in double */
static void ref_conv(double *y, double *mag, const struct conv_ctx *c)
{
	int T = c->T, C = c->C, K = c->K;

	for (int b = 0; b < c->B; b++)
		for (int p = 0; p < T; p++) {
			long i = (long)b * T + p;
			int lo = c->seg && c->seg[i] > 0 ? c->seg[i] : 0;

			for (int ch = 0; ch < C; ch++) {
				double acc = 0, m = 0;

				for (int j = 0; j < K; j++) {
					int q = p - (K - 1) + j;

					if (q < lo)
						continue;
					double t = c->w[ch * K + j] * c->x[((long)b * T + q) * C + ch];
					acc += t;
					m += fabs(t);
				}
				y[i * C + ch] = dsilu(acc);
				if (mag)
					mag[i * C + ch] = m;
			}
		}
}

static double conv_loss(void *p)
{
	const struct conv_ctx *c = p;
	size_t n = (size_t)c->B * c->T * c->C;
	double *y = malloc(n * sizeof(double)), L = 0;

	ref_conv(y, NULL, c);
	for (size_t i = 0; i < n; i++)
		L += c->R[i] * y[i];
	free(y);
	return L;
}

static void check_conv(const char *name, int B, int T, int C, int K, const int32_t *seg, int perturb)
{
	size_t n = (size_t)B * T * C, nw = (size_t)C * K;
	float *x = ufill(n, -2, 2), *w = ufill(nw, -1, 1), *R = ufill(n, -1, 1);
	float *y = malloc(n * sizeof(float)), *dx = malloc(n * sizeof(float)), *dw = calloc(nw, sizeof(float));
	struct conv_ctx c = { todbl(x, n), todbl(w, nw), todbl(R, n), seg, B, T, C, K };
	double *yr = malloc(n * sizeof(double)), *mag = malloc(n * sizeof(double));
	double *gx = malloc(n * sizeof(double)), *gw = malloc(nw * sizeof(double));
	float *wk = fcopy(w, nw);
	char what[200];

	if (perturb)
		wk[nw / 2] += 1e-3f;
	hp_conv1d_silu_fwd(y, x, wk, seg, B, T, C, K);
	ref_conv(yr, mag, &c);
	float *yrf = tofloat(yr, n);
	/* pre: K products and K adds, a float sum of K terms: (K + 1) u mag;
	 * silu's slope is at most 1.1, and silu itself (exp, add, divide,
	 * multiply) adds 4 u |y| <= 4 u mag: 2K + 6 is above both with room */
	snprintf(what, sizeof(what), "conv1d_silu fwd %s (B=%d T=%d C=%d K=%d) within (2K+6) u sum|w x|", name, B,
		 T, C, K);
	verdict(tap_bound_err(y, yrf, mag, n, 2 * K + 6), 1, perturb, what);

	if (perturb)
		wk[nw / 2] = w[nw / 2] + 1e-2f;
	hp_conv1d_silu_bwd(dx, dw, R, x, wk, seg, B, T, C, K);
	fd_grad(gx, c.x, n, conv_loss, &c);
	fd_grad(gw, c.w, nw, conv_loss, &c);
	double e = fmax(grad_err(dx, gx, n), grad_err(dw, gw, nw));
	snprintf(what, sizeof(what), "conv1d_silu bwd %s: dx, dw against differences", name);
	verdict(e, FD_TOL, perturb, what);

	free(x); free(w); free(R); free(y); free(dx); free(dw); free(c.x); free(c.w); free(c.R);
	free(yr); free(mag); free(gx); free(gw); free(wk); free(yrf);
}

/* A row of two documents gives the bits of each alone (y, dx); dw sums
 * the two documents in one double, against two floats added: within
 * 3 u (|dw_a| + |dw_b|), the three roundings of the second. */
static void test_conv_docs(void)
{
	const int T = 11, T1 = 5, C = 7, K = 4;
	size_t n = (size_t)T * C, nw = (size_t)C * K;
	float *x = ufill(n, -2, 2), *w = ufill(nw, -1, 1), *dy = ufill(n, -1, 1);
	float *y = malloc(n * sizeof(float)), *ys = malloc(n * sizeof(float));
	float *dx = malloc(n * sizeof(float)), *dxs = malloc(n * sizeof(float));
	float *dw = calloc(nw, sizeof(float)), *dwa = calloc(nw, sizeof(float)), *dwb = calloc(nw, sizeof(float));
	float *dwab = malloc(nw * sizeof(float));
	double *mag = malloc(nw * sizeof(double));
	int32_t seg[11];

	for (int p = 0; p < T; p++)
		seg[p] = p < T1 ? 0 : T1;
	hp_conv1d_silu_fwd(y, x, w, seg, 1, T, C, K);
	hp_conv1d_silu_fwd(ys, x, w, NULL, 1, T1, C, K);
	hp_conv1d_silu_fwd(ys + T1 * C, x + T1 * C, w, NULL, 1, T - T1, C, K);
	ok(!memcmp(y, ys, n * sizeof(float)), "conv1d_silu fwd: a row of two documents gives the bits of each alone");
	hp_conv1d_silu_bwd(dx, dw, dy, x, w, seg, 1, T, C, K);
	hp_conv1d_silu_bwd(dxs, dwa, dy, x, w, NULL, 1, T1, C, K);
	hp_conv1d_silu_bwd(dxs + T1 * C, dwb, dy + T1 * C, x + T1 * C, w, NULL, 1, T - T1, C, K);
	ok(!memcmp(dx, dxs, n * sizeof(float)), "conv1d_silu bwd: dx of two documents, the bits of each alone");
	for (size_t i = 0; i < nw; i++) {
		dwab[i] = dwa[i] + dwb[i];
		mag[i] = fabs((double)dwa[i]) + fabs((double)dwb[i]);
	}
	double e = tap_bound_err(dw, dwab, mag, nw, 3);
	ok(e <= 1, "conv1d_silu bwd: dw of two documents, the two alone summed, within 3 u (ratio %.3g)", e);
	/* without seg the second document sees the first: the test sees it */
	hp_conv1d_silu_fwd(y, x, w, NULL, 1, T, C, K);
	ok(memcmp(y, ys, n * sizeof(float)) != 0, "conv1d_silu fwd: without seg the documents mix (the check can fail)");

	free(x); free(w); free(dy); free(y); free(ys); free(dx); free(dxs); free(dw); free(dwa); free(dwb);
	free(dwab); free(mag);
}

static void test_conv(void)
{
	/* two rows; row 0: documents at 0, 3 (shorter than K), 5; row 1:
	 * documents at 0 and 1 (a one-token document) */
	static const int32_t seg[2 * 9] = { 0, 0, 0, 3, 3, 5, 5, 5, 5, 0, 1, 1, 1, 1, 1, 1, 1, 1 };

	for (int perturb = 0; perturb < 2; perturb++) {
		check_conv("one document a row", 2, 9, 5, 4, NULL, perturb);
		check_conv("with documents", 2, 9, 5, 4, seg, perturb);
	}
	check_conv("K=1", 2, 6, 3, 1, NULL, 0);
	check_conv("K=3, T < K", 3, 2, 4, 3, NULL, 0);
	test_conv_docs();
}

/* ---- 2. gated RMSNorm ------------------------------------------------- */

struct rmsg_ctx {
	double *x, *z, *w, *R;
	int N, D;
	double eps;
};

static void ref_rmsg(double *y, const struct rmsg_ctx *c)
{
	int D = c->D;

	for (int n = 0; n < c->N; n++) {
		const double *x = c->x + (long)n * D, *z = c->z + (long)n * D;
		double ss = 0;

		for (int i = 0; i < D; i++)
			ss += x[i] * x[i];
		double r = 1 / sqrt(ss / D + c->eps);
		for (int i = 0; i < D; i++)
			y[(long)n * D + i] = c->w[i] * (x[i] * r) * dsilu(z[i]);
	}
}

static double rmsg_loss(void *p)
{
	const struct rmsg_ctx *c = p;
	size_t n = (size_t)c->N * c->D;
	double *y = malloc(n * sizeof(double)), L = 0;

	ref_rmsg(y, c);
	for (size_t i = 0; i < n; i++)
		L += c->R[i] * y[i];
	free(y);
	return L;
}

static void check_rmsg(int N, int D, int perturb)
{
	size_t n = (size_t)N * D;
	const float eps = 1e-6f;
	float *x = ufill(n, -2, 2), *z = ufill(n, -4, 4), *w = ufill(D, 0.5, 1.5), *R = ufill(n, -1, 1);
	float *y = malloc(n * sizeof(float)), *rstd = malloc(N * sizeof(float));
	float *dx = malloc(n * sizeof(float)), *dz = malloc(n * sizeof(float)), *dw = calloc(D, sizeof(float));
	struct rmsg_ctx c = { todbl(x, n), todbl(z, n), todbl(w, D), todbl(R, n), N, D, eps };
	double *yr = malloc(n * sizeof(double)), *mag = malloc(n * sizeof(double));
	double *gx = malloc(n * sizeof(double)), *gz = malloc(n * sizeof(double)), *gw = malloc(D * sizeof(double));
	float *wk = fcopy(w, D);
	char what[200];

	if (perturb)
		wk[D / 2] += 1e-3f;
	hp_rmsnorm_gated_fwd(y, rstd, x, z, wk, N, D, eps);
	ref_rmsg(yr, &c);
	for (size_t i = 0; i < n; i++)
		mag[i] = fabs(yr[i]);
	float *yrf = tofloat(yr, n);
	/* a product of rounded factors: rstd (1), x r (1), w (1), silu (exp,
	 * add, divide, multiply: 4), the last product (1): 8; 12 with room */
	snprintf(what, sizeof(what), "rmsnorm_gated fwd (N=%d D=%d) within 12 u |y|", N, D);
	verdict(tap_bound_err(y, yrf, mag, n, 12), 1, perturb, what);

	if (perturb)
		wk[D / 2] = w[D / 2] + 1e-2f;
	hp_rmsnorm_gated_fwd(y, rstd, x, z, wk, N, D, eps);
	hp_rmsnorm_gated_bwd(dx, dz, dw, R, x, z, wk, rstd, N, D);
	fd_grad(gx, c.x, n, rmsg_loss, &c);
	fd_grad(gz, c.z, n, rmsg_loss, &c);
	fd_grad(gw, c.w, D, rmsg_loss, &c);
	double e = fmax(fmax(grad_err(dx, gx, n), grad_err(dz, gz, n)), grad_err(dw, gw, D));
	snprintf(what, sizeof(what), "rmsnorm_gated bwd (N=%d D=%d): dx, dz, dw against differences", N, D);
	verdict(e, FD_TOL, perturb, what);

	free(x); free(z); free(w); free(R); free(y); free(rstd); free(dx); free(dz); free(dw);
	free(c.x); free(c.z); free(c.w); free(c.R); free(yr); free(mag); free(gx); free(gz); free(gw);
	free(wk); free(yrf);
}

/* ---- 3. sigmoid gates ------------------------------------------------ */

struct sg_ctx {
	double *x, *gate, *R;
	long T;
	int C; /* 0: element-wise over T values */
};

static double sg_loss(void *p)
{
	const struct sg_ctx *c = p;
	double L = 0;

	for (long t = 0; t < c->T; t++)
		for (int i = 0; i < (c->C ? c->C : 1); i++) {
			long k = c->C ? t * c->C + i : t;

			L += c->R[k] * c->x[k] * dsig(c->gate[t]);
		}
	return L;
}

static void check_sg(long T, int C, int perturb)
{
	size_t n = (size_t)T * (C ? C : 1), ng = (size_t)T;
	float *x = ufill(n, -3, 3), *gate = ufill(ng, -6, 6), *R = ufill(n, -1, 1);
	float *y = malloc(n * sizeof(float)), *dx = malloc(n * sizeof(float)), *dg = malloc(ng * sizeof(float));
	struct sg_ctx c = { todbl(x, n), todbl(gate, ng), todbl(R, n), T, C };
	double *mag = malloc(n * sizeof(double)), *gx = malloc(n * sizeof(double)), *gg = malloc(ng * sizeof(double));
	float *yr = malloc(n * sizeof(float)), *gk = fcopy(gate, ng);
	const char *name = C ? "sigmoid_gate_rows" : "sigmoid_gate";
	char what[200];

	if (perturb)
		gk[ng / 2] += 1e-3f;
	if (C)
		hp_sigmoid_gate_rows_fwd(y, x, gk, T, C);
	else
		hp_sigmoid_gate_fwd(y, x, gk, (long)n);
	for (size_t k = 0; k < n; k++) {
		double v = x[k] * dsig(gate[C ? k / C : k]);
		yr[k] = (float)v;
		mag[k] = fabs(v);
	}
	/* sigmoid (exp, add, divide) and the product: 4; 6 with room */
	snprintf(what, sizeof(what), "%s fwd (n=%zu) within 6 u |y|", name, n);
	verdict(tap_bound_err(y, yr, mag, n, 6), 1, perturb, what);

	if (perturb)
		gk[ng / 2] = gate[ng / 2] + 1e-2f;
	if (C)
		hp_sigmoid_gate_rows_bwd(dx, dg, R, x, gk, T, C);
	else
		hp_sigmoid_gate_bwd(dx, dg, R, x, gk, (long)n);
	fd_grad(gx, c.x, n, sg_loss, &c);
	fd_grad(gg, c.gate, ng, sg_loss, &c);
	double e = fmax(grad_err(dx, gx, n), grad_err(dg, gg, ng));
	snprintf(what, sizeof(what), "%s bwd: dx, dgate against differences", name);
	verdict(e, FD_TOL, perturb, what);

	free(x); free(gate); free(R); free(y); free(dx); free(dg); free(c.x); free(c.gate); free(c.R);
	free(mag); free(gx); free(gg); free(yr); free(gk);
}

/* ---- 4. beta and g ---------------------------------------------------- */

struct gates_ctx {
	double *b, *a, *A_log, *dt, *Rb, *Rg;
	int N, H, round_u;
};

/* round_u: u = a + dt_bias rounded to float, as torch adds them (the
 * forward's reference); off for the differences */
static void ref_gates(double *beta, double *g, const struct gates_ctx *c)
{
	for (int n = 0; n < c->N; n++)
		for (int h = 0; h < c->H; h++) {
			long i = (long)n * c->H + h;
			double u = c->a[i] + c->dt[h];

			if (c->round_u)
				u = (float)u;
			beta[i] = dsig(c->b[i]);
			g[i] = -exp(c->A_log[h]) * dsoftplus(u);
		}
}

static double gates_loss(void *p)
{
	const struct gates_ctx *c = p;
	size_t n = (size_t)c->N * c->H;
	double *beta = malloc(n * sizeof(double)), *g = malloc(n * sizeof(double)), L = 0;

	ref_gates(beta, g, c);
	for (size_t i = 0; i < n; i++)
		L += c->Rb[i] * beta[i] + c->Rg[i] * g[i];
	free(beta);
	free(g);
	return L;
}

static void check_gates(int N, int H, int perturb)
{
	size_t n = (size_t)N * H;
	float *b = ufill(n, -6, 6), *a = ufill(n, -8, 8), *A_log = ufill(H, -1, 2.7), *dt = ufill(H, -2, 2);
	float *Rb = ufill(n, -1, 1), *Rg = ufill(n, -1, 1);
	float *beta = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
	float *db = malloc(n * sizeof(float)), *da = malloc(n * sizeof(float));
	float *dA = calloc(H, sizeof(float)), *ddt = calloc(H, sizeof(float));
	double *br = malloc(n * sizeof(double)), *gr = malloc(n * sizeof(double)), *mag = malloc(2 * n * sizeof(double));
	double *gb = malloc(n * sizeof(double)), *ga = malloc(n * sizeof(double));
	double *gA = malloc(H * sizeof(double)), *gdt = malloc(H * sizeof(double));
	float *Ak = fcopy(A_log, H), *both = malloc(2 * n * sizeof(float)), *bothr = malloc(2 * n * sizeof(float));
	char what[200];

	/* one head past torch's threshold: u = a + dt_bias above 20 throughout */
	dt[H - 1] = 30;
	struct gates_ctx c = { todbl(b, n), todbl(a, n), todbl(A_log, H), todbl(dt, H), todbl(Rb, n), todbl(Rg, n),
			       N, H, 1 };
	if (perturb)
		Ak[H / 2] += 1e-3f;
	hp_gdn_gates_fwd(beta, g, b, a, Ak, dt, N, H);
	ref_gates(br, gr, &c);
	for (size_t i = 0; i < n; i++) {
		both[i] = beta[i], both[n + i] = g[i];
		bothr[i] = (float)br[i], bothr[n + i] = (float)gr[i];
		mag[i] = fabs(br[i]), mag[n + i] = fabs(gr[i]);
	}
	/* beta: exp, add, divide (3); g from the float u: exp, log1p (each
	 * within an ulp or two of glibc's), exp of A_log, the product: 6; 8
	 * with room */
	snprintf(what, sizeof(what), "gdn_gates fwd (N=%d H=%d): beta and g within 8 u", N, H);
	verdict(tap_bound_err(both, bothr, mag, 2 * n, 8), 1, perturb, what);

	if (perturb)
		Ak[H / 2] = A_log[H / 2] + 1e-2f;
	hp_gdn_gates_bwd(db, da, dA, ddt, Rb, Rg, b, a, Ak, dt, N, H);
	c.round_u = 0;
	fd_grad(gb, c.b, n, gates_loss, &c);
	fd_grad(ga, c.a, n, gates_loss, &c);
	fd_grad(gA, c.A_log, H, gates_loss, &c);
	fd_grad(gdt, c.dt, H, gates_loss, &c);
	double e = fmax(fmax(grad_err(db, gb, n), grad_err(da, ga, n)), fmax(grad_err(dA, gA, H), grad_err(ddt, gdt, H)));
	snprintf(what, sizeof(what), "gdn_gates bwd (N=%d H=%d): db, da, dA_log, ddt_bias against differences", N, H);
	verdict(e, FD_TOL, perturb, what);

	free(b); free(a); free(A_log); free(dt); free(Rb); free(Rg); free(beta); free(g); free(db); free(da);
	free(dA); free(ddt); free(br); free(gr); free(mag); free(gb); free(ga); free(gA); free(gdt); free(Ak);
	free(both); free(bothr); free(c.b); free(c.a); free(c.A_log); free(c.dt); free(c.Rb); free(c.Rg);
}

/* ---- accumulation, saturation ---------------------------------------- */

/* weight gradients accumulate: a second call onto the first's result gives
 * exactly twice it (each call adds one float, the same float) */
static void test_accumulate(void)
{
	const int B = 2, T = 6, C = 4, K = 4, N = 5, D = 8, H = 3;
	float *x = ufill(B * T * C, -2, 2), *w = ufill(C * K, -1, 1), *dy = ufill(B * T * C, -1, 1);
	float *dx = malloc(B * T * C * sizeof(float)), *dw1 = calloc(C * K, sizeof(float)), *dw2 = calloc(C * K, sizeof(float));
	int good = 1;

	hp_conv1d_silu_bwd(dx, dw1, dy, x, w, NULL, B, T, C, K);
	hp_conv1d_silu_bwd(dx, dw2, dy, x, w, NULL, B, T, C, K);
	hp_conv1d_silu_bwd(dx, dw2, dy, x, w, NULL, B, T, C, K);
	for (int i = 0; i < C * K; i++)
		good &= dw2[i] == 2 * dw1[i] && dw1[i] != 0;
	ok(good, "conv1d_silu bwd: dw accumulates");

	float *xr = ufill(N * D, -2, 2), *z = ufill(N * D, -3, 3), *wr = ufill(D, 0.5, 1.5), *rstd = malloc(N * sizeof(float));
	float *y = malloc(N * D * sizeof(float)), *dyr = ufill(N * D, -1, 1), *dz = malloc(N * D * sizeof(float));
	float *g1 = calloc(D, sizeof(float)), *g2 = calloc(D, sizeof(float)), *dxr = malloc(N * D * sizeof(float));
	hp_rmsnorm_gated_fwd(y, rstd, xr, z, wr, N, D, 1e-6f);
	hp_rmsnorm_gated_bwd(dxr, dz, g1, dyr, xr, z, wr, rstd, N, D);
	hp_rmsnorm_gated_bwd(dxr, dz, g2, dyr, xr, z, wr, rstd, N, D);
	hp_rmsnorm_gated_bwd(dxr, dz, g2, dyr, xr, z, wr, rstd, N, D);
	good = 1;
	for (int i = 0; i < D; i++)
		good &= g2[i] == 2 * g1[i] && g1[i] != 0;
	ok(good, "rmsnorm_gated bwd: dw accumulates");

	float *b = ufill(N * H, -3, 3), *a = ufill(N * H, -3, 3), *Al = ufill(H, 0, 1), *dt = ufill(H, -1, 1);
	float *db = malloc(N * H * sizeof(float)), *da = malloc(N * H * sizeof(float));
	float *A1 = calloc(H, sizeof(float)), *A2 = calloc(H, sizeof(float)), *t1 = calloc(H, sizeof(float)), *t2 = calloc(H, sizeof(float));
	hp_gdn_gates_bwd(db, da, A1, t1, dyr, dz, b, a, Al, dt, N, H);
	hp_gdn_gates_bwd(db, da, A2, t2, dyr, dz, b, a, Al, dt, N, H);
	hp_gdn_gates_bwd(db, da, A2, t2, dyr, dz, b, a, Al, dt, N, H);
	good = 1;
	for (int h = 0; h < H; h++)
		good &= A2[h] == 2 * A1[h] && t2[h] == 2 * t1[h] && A1[h] != 0 && t1[h] != 0;
	ok(good, "gdn_gates bwd: dA_log and ddt_bias accumulate");

	free(x); free(w); free(dy); free(dx); free(dw1); free(dw2); free(xr); free(z); free(wr); free(rstd);
	free(y); free(dyr); free(dz); free(g1); free(g2); free(dxr); free(b); free(a); free(Al); free(dt);
	free(db); free(da); free(A1); free(A2); free(t1); free(t2);
}

static int all_finite(const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!isfinite(x[i]))
			return 0;
	return 1;
}

/* Inputs far into the tails: the exponentials of exp(-|x|) underflow
 * (to subnormals, then 0), never overflow; the outputs reach the limits. */
static void test_saturated(void)
{
	static const float big[8] = { -1e30f, -1000, -100, -88.8f, 88.8f, 100, 1000, 1e30f };
	float one[8], y[8], dx[8], dg[8], R[8];
	int good;

	for (int i = 0; i < 8; i++)
		one[i] = 1.5f, R[i] = 1;
	hp_sigmoid_gate_fwd(y, one, big, 8);
	hp_sigmoid_gate_bwd(dx, dg, R, one, big, 8);
	ok(all_finite(y, 8) && all_finite(dx, 8) && all_finite(dg, 8) && y[0] == 0 && y[7] == 1.5f && dg[0] == 0 &&
	   dg[7] == 0 && y[2] > 0 && dg[2] > 0,
	   "sigmoid_gate at |gate| up to 1e30: finite, 0 and x at the ends, e^-100 kept at -100");
	hp_sigmoid_gate_rows_fwd(y, big, big, 8, 1);
	hp_sigmoid_gate_rows_bwd(dx, dg, R, big, big, 8, 1);
	ok(all_finite(y, 8) && all_finite(dx, 8) && all_finite(dg, 8) && y[7] == 1e30f && y[0] == 0,
	   "sigmoid_gate_rows at |x|, |gate| up to 1e30: finite");

	/* conv: pre = 4 x (all weights 1) up to 4e30; silu and its slope */
	float cx[8], cw[4] = { 1, 1, 1, 1 }, cy[8], cdx[8], cdw[4] = { 0 };
	for (int i = 0; i < 8; i++)
		cx[i] = i < 4 ? -1e30f : 1e30f;
	hp_conv1d_silu_fwd(cy, cx, cw, NULL, 1, 8, 1, 4);
	hp_conv1d_silu_bwd(cdx, cdw, R, cx, cw, NULL, 1, 8, 1, 4);
	ok(all_finite(cy, 8) && all_finite(cdx, 8) && all_finite(cdw, 4) && cy[3] == 0 && fabsf(cy[7] / 4e30f - 1) < 1e-6f,
	   "conv1d_silu at |pre| up to 4e30: finite, silu -> 0 and pre");

	/* gated norm with z far out: silu(z) -> 0 or z */
	float nx[8], nw[8], ny[8], nr[1], ndx[8], ndz[8], ndw[8] = { 0 };
	for (int i = 0; i < 8; i++)
		nx[i] = (float)(i - 3), nw[i] = 1;
	hp_rmsnorm_gated_fwd(ny, nr, nx, big, nw, 1, 8, 1e-6f);
	hp_rmsnorm_gated_bwd(ndx, ndz, ndw, R, nx, big, nw, nr, 1, 8);
	ok(all_finite(ny, 8) && all_finite(ndx, 8) && all_finite(ndz, 8) && all_finite(ndw, 8),
	   "rmsnorm_gated at |z| up to 1e30: finite");

	/* gates: b and a across the range; dt_bias 0, A_log 0.5 */
	float Al = 0.5f, dtb = 0, beta[8], g[8], db[8], da[8], dA = 0, ddt = 0;
	hp_gdn_gates_fwd(beta, g, big, big, &Al, &dtb, 8, 1);
	hp_gdn_gates_bwd(db, da, &dA, &ddt, R, R, big, big, &Al, &dtb, 8, 1);
	good = all_finite(beta, 8) && all_finite(g, 8) && all_finite(db, 8) && all_finite(da, 8) && isfinite(dA) &&
	       isfinite(ddt);
	ok(good && beta[0] == 0 && beta[7] == 1 && g[0] == 0 && g[6] == -expf(0.5f) * 1000 && da[0] == 0 &&
	   da[7] == -expf(0.5f),
	   "gdn_gates at |b|, |a| up to 1e30: finite, beta 0 and 1, softplus 0 and identity");
}

/* ---- threads ----------------------------------------------------------- */

#define TH_FLOATS (6u << 20)

struct th_run {
	float *out;
	int threads;
};

static int th_child(void *p)
{
	const struct th_run *r = p;
	float *o = r->out;

	if (hp_pool_threads() != r->threads)
		return -1;
	rng = 0x1234567ull;
	{	/* conv: 1024 tokens by 320 channels, documents every 100 tokens */
		const int B = 2, T = 512, C = 320, K = 4;
		size_t n = (size_t)B * T * C;
		float *x = ufill(n, -2, 2), *w = ufill(C * K, -1, 1), *dy = ufill(n, -1, 1);
		int32_t *seg = malloc(sizeof(int32_t) * B * T);

		for (int i = 0; i < B * T; i++)
			seg[i] = (i % T) / 100 * 100;
		hp_conv1d_silu_fwd(o, x, w, seg, B, T, C, K);
		o += n;
		for (int i = 0; i < C * K; i++)
			o[n + i] = 0.25f;
		hp_conv1d_silu_bwd(o, o + n, dy, x, w, seg, B, T, C, K);
		o += n + C * K;
		free(x); free(w); free(dy); free(seg);
	}
	{	/* gated norm: 4096 rows of 64 */
		const long N = 4096;
		const int D = 64;
		float *x = ufill(N * D, -2, 2), *z = ufill(N * D, -4, 4), *w = ufill(D, 0.5, 1.5), *dy = ufill(N * D, -1, 1);
		float *y = o, *rstd = o + N * D;

		hp_rmsnorm_gated_fwd(y, rstd, x, z, w, N, D, 1e-6f);
		o += N * D + N;
		for (int i = 0; i < D; i++)
			o[2 * N * D + i] = 0.25f;
		hp_rmsnorm_gated_bwd(o, o + N * D, o + 2 * N * D, dy, x, z, w, rstd, N, D);
		o += 2 * N * D + D;
		free(x); free(z); free(w); free(dy);
	}
	{	/* the two gates */
		const long n = 300000, T = 2048;
		const int C = 128;
		float *x = ufill(n, -3, 3), *gate = ufill(n, -6, 6), *dy = ufill(n, -1, 1);

		hp_sigmoid_gate_fwd(o, x, gate, n);
		hp_sigmoid_gate_bwd(o + n, o + 2 * n, dy, x, gate, n);
		o += 3 * n;
		hp_sigmoid_gate_rows_fwd(o, x, gate, T, C);
		hp_sigmoid_gate_rows_bwd(o + T * C, o + 2 * T * C, dy, x, gate, T, C);
		o += 2 * T * C + T;
		free(x); free(gate); free(dy);
	}
	{	/* beta and g: 8192 tokens by 32 heads */
		const long N = 8192;
		const int H = 32;
		float *b = ufill(N * H, -6, 6), *a = ufill(N * H, -8, 8), *Al = ufill(H, -1, 2.7), *dt = ufill(H, -2, 2);
		float *dbeta = ufill(N * H, -1, 1), *dg = ufill(N * H, -1, 1);

		hp_gdn_gates_fwd(o, o + N * H, b, a, Al, dt, N, H);
		o += 2 * N * H;
		for (int h = 0; h < 2 * H; h++)
			o[2 * N * H + h] = 0.25f;
		hp_gdn_gates_bwd(o, o + N * H, o + 2 * N * H, o + 2 * N * H + H, dbeta, dg, b, a, Al, dt, N, H);
		o += 2 * N * H + 2 * H;
		free(b); free(a); free(Al); free(dt); free(dbeta); free(dg);
	}
	return (size_t)(o - r->out) <= TH_FLOATS ? 0 : -1;
}

static void test_threads(void)
{
	size_t n = TH_FLOATS;
	float *sh = mmap(NULL, 2 * n * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (sh == MAP_FAILED) {
		ok(0, "mmap for the thread test");
		return;
	}
	struct th_run r1 = { sh, 1 }, r4 = { sh + n, 4 };
	int ran = !tap_child(1, NULL, th_child, &r1) && !tap_child(4, NULL, th_child, &r4);
	ok(ran && !memcmp(sh, sh + n, n * sizeof(float)),
	   "every kernel forward and backward, sizes past the pool's grain: 1 and 4 threads give the same bits");
	munmap(sh, 2 * n * sizeof(float));
}

int main(void)
{
	test_conv();
	for (int perturb = 0; perturb < 2; perturb++) {
		check_rmsg(6, 16, perturb);
		check_sg(40, 0, perturb);
		check_sg(7, 12, perturb);
		check_gates(9, 4, perturb);
	}
	check_rmsg(3, 64, 0);
	test_accumulate();
	test_saturated();
	test_threads();
	return tap_done();
}
