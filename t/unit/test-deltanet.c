/*
 * test-deltanet.c - the gated delta rule and l2norm of kernels/cpu/deltanet.c.
 *
 * The chain of trust: a double recurrence written here from transformers'
 * torch_recurrent_gated_delta_rule (gdr_dbl) is differentiated by central
 * differences; the reference kernels (hp_gdr_ref_fwd/bwd) must match it;
 * the chunked kernels (hp_gdr_fwd/bwd) must match the reference on shapes
 * that reach every edge: T below, at and past 64 and not a multiple of it,
 * GQA (Hv = 2 Hk), head sizes that are not multiples of the 16-wide vector
 * blocks, documents (seg) starting inside a chunk, at its first and at its
 * last token, and one-token documents.  Then: a row of two documents is the
 * two run alone, the bits do not depend on the thread count (1 and 4),
 * and a wrong beta, g or seg is caught by the same comparisons.
 *
 * Tolerances, relative L2 (tap.h): the chunked kernels are float against
 * the reference's double state.  Each output is a sum over the chunk's
 * tokens and the state's Dk rows (a few hundred terms) through a unit
 * triangular solve whose entries are below 1 in size (|beta k_i.k_j| < 1
 * for unit k), and the state passes from chunk to chunk shrinking (decay
 * <= 1, and I - beta k k^T is a contraction): errors measured about 1e-7
 * to 5e-7, so 1e-5 is 20x what is seen and ~100x below what a wrong term
 * gives (the beta/g mutations below are >= 1e-3).  The gradients get 2e-5:
 * they run through both the solve and its transpose.
 *
 * `test-deltanet --bench [B T Hv Hk Dk Dv]`: no tests; GFLOP/s of the
 * chunked forward + backward, by default at B=1, T=4096, Hv=Hk=16,
 * Dk=Dv=128, on HP_NUM_THREADS threads (flops counted as the products the
 * chunked kernels execute, below; T a multiple of 64).
 */
#include <math.h>
#include <sys/mman.h>
#include <time.h>

#include "cpu/ops.h"
#include "cpu/pool.h"
#include "tap.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double urand(void)
{
	return tap_urand(&rng);
}

static float randn(void)
{
	return (float)(sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand()));
}

struct gdr_case {
	int B, T, Hv, Hk, Dk, Dv;
	float scale;
	float *q, *k, *v, *g, *beta, *dout;
	int32_t *seg;
};

static float *fnew(size_t n)
{
	return calloc(n ? n : 1, sizeof(float));
}

/* unit-norm q and k, v and dO normal, g in [-1, 0) (decays e^-1 .. 1),
 * beta in (0.05, 0.95) */
static void case_init(struct gdr_case *c, int B, int T, int Hv, int Hk, int Dk, int Dv)
{
	size_t nk = (size_t)B * T * Hk * Dk, nv = (size_t)B * T * Hv * Dv, nh = (size_t)B * T * Hv;

	*c = (struct gdr_case){ .B = B, .T = T, .Hv = Hv, .Hk = Hk, .Dk = Dk, .Dv = Dv, .scale = (float)(1 / sqrt(Dk)) };
	c->q = fnew(nk), c->k = fnew(nk), c->v = fnew(nv), c->dout = fnew(nv);
	c->g = fnew(nh), c->beta = fnew(nh);
	for (size_t i = 0; i < nk; i++)
		c->q[i] = randn(), c->k[i] = randn();
	float *rinv = fnew(nk / Dk);
	hp_l2norm_fwd(c->q, rinv, c->q, (long)(nk / Dk), Dk);
	hp_l2norm_fwd(c->k, rinv, c->k, (long)(nk / Dk), Dk);
	free(rinv);
	for (size_t i = 0; i < nv; i++)
		c->v[i] = randn(), c->dout[i] = randn();
	for (size_t i = 0; i < nh; i++)
		c->g[i] = (float)-urand(), c->beta[i] = (float)(0.05 + 0.9 * urand());
}

static void case_free(struct gdr_case *c)
{
	free(c->q), free(c->k), free(c->v), free(c->dout), free(c->g), free(c->beta), free(c->seg);
}

/* seg from a list of document starts per row (the same for every row,
 * shifted by the row index so rows differ) */
static void case_docs(struct gdr_case *c, const int *starts, int n)
{
	c->seg = malloc(sizeof(int32_t) * c->B * c->T);
	for (int b = 0; b < c->B; b++)
		for (int t = 0; t < c->T; t++) {
			int s = 0;
			for (int i = 0; i < n; i++) {
				int p = starts[i] + b;
				if (p < c->T && p <= t && p > s)
					s = p;
			}
			c->seg[b * c->T + t] = s;
		}
}

struct gdr_out {
	float *o, *dq, *dk, *dv, *dg, *dbeta;
};

static void out_alloc(struct gdr_out *r, const struct gdr_case *c)
{
	size_t nk = (size_t)c->B * c->T * c->Hk * c->Dk, nv = (size_t)c->B * c->T * c->Hv * c->Dv;
	size_t nh = (size_t)c->B * c->T * c->Hv;
	r->o = fnew(nv), r->dq = fnew(nk), r->dk = fnew(nk), r->dv = fnew(nv), r->dg = fnew(nh), r->dbeta = fnew(nh);
}

static void out_free(struct gdr_out *r)
{
	free(r->o), free(r->dq), free(r->dk), free(r->dv), free(r->dg), free(r->dbeta);
}

static int run_ref(struct gdr_out *r, const struct gdr_case *c)
{
	return hp_gdr_ref_fwd(r->o, c->q, c->k, c->v, c->g, c->beta, c->seg, c->B, c->T, c->Hv, c->Hk, c->Dk, c->Dv,
			      c->scale) |
	       hp_gdr_ref_bwd(r->dq, r->dk, r->dv, r->dg, r->dbeta, c->dout, c->q, c->k, c->v, c->g, c->beta,
			      c->seg, c->B, c->T, c->Hv, c->Hk, c->Dk, c->Dv, c->scale);
}

static void run_fast(struct gdr_out *r, const struct gdr_case *c, int bwd)
{
	float *saved = fnew(hp_gdr_saved_floats(c->B, c->T, c->Hv, c->Dk, c->Dv));
	float *scratch = fnew(hp_gdr_scratch_floats(c->B, c->Hv, c->Dk, c->Dv));

	hp_gdr_fwd(r->o, saved, c->q, c->k, c->v, c->g, c->beta, c->seg, scratch, c->B, c->T, c->Hv, c->Hk, c->Dk,
		   c->Dv, c->scale);
	if (bwd)
		hp_gdr_bwd(r->dq, r->dk, r->dv, r->dg, r->dbeta, c->dout, saved, c->q, c->k, c->v, c->g, c->beta,
			   c->seg, scratch, c->B, c->T, c->Hv, c->Hk, c->Dk, c->Dv, c->scale);
	free(saved);
	free(scratch);
}

/* the worst relative L2 error over the six tensors; *which names it */
static double out_err(const struct gdr_out *got, const struct gdr_out *want, const struct gdr_case *c, int bwd,
		      const char **which)
{
	size_t nk = (size_t)c->B * c->T * c->Hk * c->Dk, nv = (size_t)c->B * c->T * c->Hv * c->Dv;
	size_t nh = (size_t)c->B * c->T * c->Hv;
	const float *g[] = { got->o, got->dq, got->dk, got->dv, got->dg, got->dbeta };
	const float *w[] = { want->o, want->dq, want->dk, want->dv, want->dg, want->dbeta };
	size_t n[] = { nv, nk, nk, nv, nh, nh };
	const char *name[] = { "out", "dq", "dk", "dv", "dg", "dbeta" };
	double worst = 0;

	for (int i = 0; i < (bwd ? 6 : 1); i++) {
		double e = tap_rel_l2(g[i], w[i], n[i], 0);
		if (!(e <= worst)) {
			worst = e;
			*which = name[i];
		}
	}
	return worst;
}

static int out_same(const struct gdr_out *x, const struct gdr_out *y, const struct gdr_case *c)
{
	size_t nk = (size_t)c->B * c->T * c->Hk * c->Dk, nv = (size_t)c->B * c->T * c->Hv * c->Dv;
	size_t nh = (size_t)c->B * c->T * c->Hv;

	return !memcmp(x->o, y->o, nv * 4) && !memcmp(x->dq, y->dq, nk * 4) && !memcmp(x->dk, y->dk, nk * 4) &&
	       !memcmp(x->dv, y->dv, nv * 4) && !memcmp(x->dg, y->dg, nh * 4) && !memcmp(x->dbeta, y->dbeta, nh * 4);
}

/* ---- the definition in double, and finite differences of it ---- */

/* sum over outputs of dout * o for the rule in double (seg as the kernels') */
static double gdr_dbl(const double *q, const double *k, const double *v, const double *g, const double *beta,
		      const struct gdr_case *c)
{
	int Dk = c->Dk, Dv = c->Dv, grp = c->Hv / c->Hk;
	double *S = calloc((size_t)Dk * Dv, sizeof(double)), *u = calloc(Dv, sizeof(double)), L = 0;

	for (int b = 0; b < c->B; b++)
		for (int h = 0; h < c->Hv; h++)
			for (int t = 0; t < c->T; t++) {
				long n = (long)b * c->T + t, kh = (n * c->Hk + h / grp) * Dk, vh = (n * c->Hv + h) * Dv;
				if (t == 0 || (c->seg && c->seg[n] == t))
					memset(S, 0, sizeof(double) * Dk * Dv);
				for (int i = 0; i < Dk * Dv; i++)
					S[i] *= exp(g[n * c->Hv + h]);
				for (int j = 0; j < Dv; j++) {
					double p = 0;
					for (int d = 0; d < Dk; d++)
						p += S[d * Dv + j] * k[kh + d];
					u[j] = beta[n * c->Hv + h] * (v[vh + j] - p);
				}
				for (int d = 0; d < Dk; d++)
					for (int j = 0; j < Dv; j++)
						S[d * Dv + j] += k[kh + d] * u[j];
				for (int j = 0; j < Dv; j++) {
					double o = 0;
					for (int d = 0; d < Dk; d++)
						o += S[d * Dv + j] * c->scale * q[kh + d];
					L += o * c->dout[vh + j];
				}
			}
	free(S), free(u);
	return L;
}

static double *to_dbl(const float *x, size_t n)
{
	double *d = malloc(sizeof(double) * n);
	for (size_t i = 0; i < n; i++)
		d[i] = x[i];
	return d;
}

/* central differences, step 1e-5: truncation ~1e-10 relative, the
 * rounding of a double loss of O(1) over 2e-5 ~1e-11: the reference's
 * float outputs (1e-7) dominate, so 1e-6 */
static void test_ref_fd(void)
{
	struct gdr_case c;
	struct gdr_out r;
	static const int starts[] = { 3 };

	case_init(&c, 2, 7, 2, 1, 3, 4);
	case_docs(&c, starts, 1);
	out_alloc(&r, &c);
	ok(!run_ref(&r, &c), "reference runs");
	size_t n[5] = { (size_t)c.B * c.T * c.Hk * c.Dk, (size_t)c.B * c.T * c.Hk * c.Dk,
			(size_t)c.B * c.T * c.Hv * c.Dv, (size_t)c.B * c.T * c.Hv, (size_t)c.B * c.T * c.Hv };
	const float *src[5] = { c.q, c.k, c.v, c.g, c.beta }, *grad[5] = { r.dq, r.dk, r.dv, r.dg, r.dbeta };
	const char *name[5] = { "q", "k", "v", "g", "beta" };
	double *x[5];

	for (int i = 0; i < 5; i++)
		x[i] = to_dbl(src[i], n[i]);
	/* the reference forward against the double definition: its loss */
	double L = gdr_dbl(x[0], x[1], x[2], x[3], x[4], &c), Lr = 0;
	for (size_t i = 0; i < (size_t)c.B * c.T * c.Hv * c.Dv; i++)
		Lr += (double)r.o[i] * c.dout[i];
	ok(fabs(L - Lr) <= 1e-6 * (fabs(L) + 1), "reference forward = the definition in double (%.3g vs %.3g)", Lr, L);
	for (int i = 0; i < 5; i++) {
		float *fd = fnew(n[i]);
		for (size_t j = 0; j < n[i]; j++) {
			double x0 = x[i][j], h = 1e-5;
			x[i][j] = x0 + h;
			double lp = gdr_dbl(x[0], x[1], x[2], x[3], x[4], &c);
			x[i][j] = x0 - h;
			double lm = gdr_dbl(x[0], x[1], x[2], x[3], x[4], &c);
			x[i][j] = x0;
			fd[j] = (float)((lp - lm) / (2 * h));
		}
		double e = tap_rel_l2(grad[i], fd, n[i], 0);
		ok(e <= 1e-6, "reference d%s = central differences (rel L2 %.2g)", name[i], e);
		free(fd);
	}
	for (int i = 0; i < 5; i++)
		free(x[i]);
	out_free(&r);
	case_free(&c);
}

/* ---- chunked against the reference ---- */

static void check_case(const char *what, int B, int T, int Hv, int Hk, int Dk, int Dv, const int *starts, int ns)
{
	struct gdr_case c;
	struct gdr_out r, f;
	const char *which = "";

	case_init(&c, B, T, Hv, Hk, Dk, Dv);
	if (ns)
		case_docs(&c, starts, ns);
	out_alloc(&r, &c);
	out_alloc(&f, &c);
	run_ref(&r, &c);
	run_fast(&f, &c, 1);
	double eo = out_err(&f, &r, &c, 0, &which);
	ok(eo <= 1e-5, "%s: chunked forward = reference (rel L2 %.2g)", what, eo);
	double eb = out_err(&f, &r, &c, 1, &which);
	ok(eb <= 2e-5, "%s: chunked backward = reference (worst rel L2 %.2g, %s)", what, eb, which);
	out_free(&r);
	out_free(&f);
	case_free(&c);
}

static void test_chunked(void)
{
	static const int docs[] = { 5, 63, 64, 100, 101, 150, 191 };
	static const int docs2[] = { 1, 2, 40, 128 };

	check_case("T=40 < 64, Dk=Dv=32", 1, 40, 2, 2, 32, 32, NULL, 0);
	check_case("T=64", 1, 64, 1, 1, 16, 16, NULL, 0);
	check_case("T=150, GQA Hv=4 Hk=2, Dk=20 Dv=24", 2, 150, 4, 2, 20, 24, NULL, 0);
	check_case("T=200, documents in, at and across chunk edges", 2, 200, 2, 1, 16, 32, docs, 7);
	check_case("T=130, one-token documents, GQA", 1, 130, 4, 2, 8, 8, docs2, 4);
	check_case("T=130, Dk=Dv=128", 1, 130, 2, 2, 128, 128, NULL, 0);
	check_case("T=70, Dk=64 Dv=128, Hv=3 Hk=1", 1, 70, 3, 1, 64, 128, NULL, 0);
}

/* A wrong beta, g or seg is seen by the comparison the tests above make. */
static void test_mutations(void)
{
	struct gdr_case c;
	struct gdr_out r, f;
	const char *which = "";
	static const int starts[] = { 50 };

	case_init(&c, 1, 100, 2, 1, 16, 16);
	out_alloc(&r, &c);
	out_alloc(&f, &c);
	run_fast(&f, &c, 0);
	c.beta[37] *= 0.99f;
	run_ref(&r, &c);
	double e1 = out_err(&f, &r, &c, 0, &which);
	c.beta[37] /= 0.99f;
	c.g[21 * 2 + 1] -= 0.05f;
	run_ref(&r, &c);
	double e2 = out_err(&f, &r, &c, 0, &which);
	c.g[21 * 2 + 1] += 0.05f;
	case_docs(&c, starts, 1);
	run_ref(&r, &c);
	double e3 = out_err(&f, &r, &c, 0, &which);
	ok(e1 > 1e-4 && e2 > 1e-4 && e3 > 1e-2,
	   "one beta 1%% off, one g 0.05 off, a document start: seen (rel L2 %.2g %.2g %.2g)", e1, e2, e3);
	out_free(&r);
	out_free(&f);
	case_free(&c);
}

/* Row 0: two documents [0, p) and [p, T); it must equal each run alone
 * (the second as its own row 0): the reference's bits, the chunked
 * kernels' bits when p is a multiple of 64 (the same chunks), within the
 * tolerance otherwise. */
static void test_docs_split(int p, int chunked)
{
	int T = 150, Hv = 2, Hk = 1, Dk = 16, Dv = 16, ok_all = 1;
	struct gdr_case c, part[2];
	struct gdr_out r, pr[2];
	const int starts[] = { p };
	double worst = 0;

	case_init(&c, 1, T, Hv, Hk, Dk, Dv);
	case_docs(&c, starts, 1);
	out_alloc(&r, &c);
	chunked ? run_fast(&r, &c, 1) : (void)run_ref(&r, &c);
	for (int d = 0; d < 2; d++) {
		int t0 = d ? p : 0, L = d ? T - p : p;
		struct gdr_case *s = &part[d];

		*s = c;
		s->T = L;
		s->seg = NULL;
		s->q = c.q + (size_t)t0 * Hk * Dk, s->k = c.k + (size_t)t0 * Hk * Dk;
		s->v = c.v + (size_t)t0 * Hv * Dv, s->dout = c.dout + (size_t)t0 * Hv * Dv;
		s->g = c.g + (size_t)t0 * Hv, s->beta = c.beta + (size_t)t0 * Hv;
		out_alloc(&pr[d], s);
		chunked ? run_fast(&pr[d], s, 1) : (void)run_ref(&pr[d], s);
		struct gdr_out view = { r.o + (size_t)t0 * Hv * Dv, r.dq + (size_t)t0 * Hk * Dk,
					r.dk + (size_t)t0 * Hk * Dk, r.dv + (size_t)t0 * Hv * Dv, r.dg + (size_t)t0 * Hv,
					r.dbeta + (size_t)t0 * Hv };
		const char *which;
		ok_all &= out_same(&view, &pr[d], s);
		double e = out_err(&view, &pr[d], s, 1, &which);
		worst = e > worst ? e : worst;
		out_free(&pr[d]);
	}
	if (!chunked || p % 64 == 0)
		ok(ok_all, "%s, documents [0,%d) [%d,%d): the bits of each run alone", chunked ? "chunked" : "reference",
		   p, p, T);
	else
		ok(worst <= 2e-5, "chunked, documents [0,%d) [%d,%d): each run alone (rel L2 %.2g)", p, p, T, worst);
	out_free(&r);
	case_free(&c);
}

/* ---- thread counts ---- */

struct th_run {
	int threads;
	float *out;
};

#define TH_B 2
#define TH_T 150
#define TH_HV 4
#define TH_HK 2
#define TH_D 24

static int th_child(void *arg)
{
	struct th_run *t = arg;
	struct gdr_case c;
	struct gdr_out r;
	static const int starts[] = { 30, 64, 97 };
	size_t nk = (size_t)TH_B * TH_T * TH_HK * TH_D, nv = (size_t)TH_B * TH_T * TH_HV * TH_D;
	size_t nh = (size_t)TH_B * TH_T * TH_HV;

	rng = 0x1234567ull;
	case_init(&c, TH_B, TH_T, TH_HV, TH_HK, TH_D, TH_D);
	case_docs(&c, starts, 3);
	r.o = t->out, r.dq = r.o + nv, r.dk = r.dq + nk, r.dv = r.dk + nk, r.dg = r.dv + nv, r.dbeta = r.dg + nh;
	run_fast(&r, &c, 1);
	case_free(&c);
	return hp_pool_threads() != t->threads;
}

static void test_threads(void)
{
	size_t n = 2 * ((size_t)TH_B * TH_T * TH_HK * TH_D + (size_t)TH_B * TH_T * TH_HV * TH_D +
			(size_t)TH_B * TH_T * TH_HV);
	float *sh = mmap(NULL, 2 * n * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (sh == MAP_FAILED) {
		ok(0, "mmap for the thread test");
		return;
	}
	struct th_run a = { 1, sh }, b = { 4, sh + n };
	int ra = tap_child(1, NULL, th_child, &a), rb = tap_child(4, NULL, th_child, &b);
	ok(!ra && !rb && !memcmp(sh, sh + n, n * sizeof(float)),
	   "chunked forward and backward: the same bits on 1 and 4 threads");
	munmap(sh, 2 * n * sizeof(float));
}

/* ---- l2norm ---- */

static void test_l2norm(void)
{
	enum { N = 5, D = 13 };
	float x[N * D], y[N * D], r[N], dy[N * D], dx[N * D];
	double worst = 0, fdw = 0;

	for (int i = 0; i < N * D; i++)
		x[i] = randn() * (i < D ? 1e-3f : 1.0f), dy[i] = randn(); /* row 0 small: eps matters */
	hp_l2norm_fwd(y, r, x, N, D);
	hp_l2norm_bwd(dx, dy, y, r, N, D);
	for (int n = 0; n < N; n++) {
		double s = 0;
		for (int i = 0; i < D; i++)
			s += (double)x[n * D + i] * x[n * D + i];
		for (int i = 0; i < D; i++) {
			double want = x[n * D + i] / sqrt(s + 1e-6);
			worst = fmax(worst, fabs(y[n * D + i] - want) / (fabs(want) + 1e-30));
		}
		/* L = sum_i dy_i y_i in double; central differences, step 1e-6
		 * relative to the row's size */
		for (int j = 0; j < D; j++) {
			double h = 1e-6 * sqrt(s + 1e-6), l[2];
			for (int sg = 0; sg < 2; sg++) {
				double xs[D], ss = 0;
				for (int i = 0; i < D; i++)
					xs[i] = x[n * D + i] + (i == j ? (sg ? -h : h) : 0), ss += xs[i] * xs[i];
				l[sg] = 0;
				for (int i = 0; i < D; i++)
					l[sg] += dy[n * D + i] * xs[i] / sqrt(ss + 1e-6);
			}
			double fd = (l[0] - l[1]) / (2 * h);
			fdw = fmax(fdw, fabs(dx[n * D + j] - fd) / (fabs(fd) + 1 / sqrt(s + 1e-6) * 1e-3));
		}
	}
	/* float y = float x times a float factor rounded from double: 2 ulps */
	ok(worst <= 3 * TAP_U * 2, "l2norm forward = x / sqrt(sum x^2 + 1e-6) (rel %.2g)", worst);
	/* float arithmetic on O(1) terms against differences accurate to ~1e-9 */
	ok(fdw <= 1e-5, "l2norm backward = central differences (rel %.2g)", fdw);
}

/* ---- throughput ---- */

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int bench(int B, int T, int Hv, int Hk, int Dk, int Dv)
{
	struct gdr_case c;
	struct gdr_out r;

	if (B < 1 || T < 64 || T % 64 || Hv < 1 || Hk < 1 || Hv % Hk || Dk < 1 || Dv < 1) {
		fprintf(stderr, "test-deltanet --bench B T Hv Hk Dk Dv: T a multiple of 64, Hv of Hk\n");
		return 2;
	}
	case_init(&c, B, T, Hv, Hk, Dk, Dv);
	out_alloc(&r, &c);
	float *saved = fnew(hp_gdr_saved_floats(c.B, c.T, c.Hv, c.Dk, c.Dv));
	float *scratch = fnew(hp_gdr_scratch_floats(c.B, c.Hv, c.Dk, c.Dv));
	double ff, fb, flops, bf = 1e30, bb = 1e30, cf = 1e30, cb = 1e30;

	hp_gdr_flops(B, T, Hv, Dk, Dv, &ff, &fb);
	flops = ff + fb;

	/* each phase's best of 5 (the first warms the pool and the pages):
	 * wall time, and the process's CPU time, which a busy machine inflates
	 * less */
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now(), c0 = cpu_now();
		hp_gdr_fwd(r.o, saved, c.q, c.k, c.v, c.g, c.beta, NULL, scratch, B, T, Hv, Hk, Dk, Dv, c.scale);
		double t1 = now(), c1 = cpu_now();
		hp_gdr_bwd(r.dq, r.dk, r.dv, r.dg, r.dbeta, c.dout, saved, c.q, c.k, c.v, c.g, c.beta, NULL, scratch,
			   B, T, Hv, Hk, Dk, Dv, c.scale);
		double t2 = now(), c2 = cpu_now();
		bf = fmin(bf, t1 - t0), bb = fmin(bb, t2 - t1), cf = fmin(cf, c1 - c0), cb = fmin(cb, c2 - c1);
	}
	printf("gated delta rule, B=%d T=%d Hv=%d Hk=%d Dk=%d Dv=%d, %d thread(s): fwd %.2f ms, bwd %.2f ms, "
	       "%.2f GFLOP/s fwd+bwd (%.2f GFLOP); CPU time fwd %.2f ms, bwd %.2f ms, %.2f GFLOP per CPU second\n",
	       B, T, Hv, Hk, Dk, Dv, hp_pool_threads(), bf * 1e3, bb * 1e3, flops / (bf + bb) * 1e-9, flops * 1e-9, cf * 1e3, cb * 1e3,
	       flops / (cf + cb) * 1e-9);
	free(saved), free(scratch);
	out_free(&r);
	case_free(&c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "--bench")) {
		if (argc == 2)
			return bench(1, 4096, 16, 16, 128, 128);
		if (argc == 8)
			return bench(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]),
				     atoi(argv[7]));
		fprintf(stderr, "usage: test-deltanet --bench [B T Hv Hk Dk Dv]\n");
		return 2;
	}
	test_ref_fd();
	test_chunked();
	test_mutations();
	test_docs_split(70, 0);
	test_docs_split(64, 1);
	test_docs_split(70, 1);
	test_threads();
	test_l2norm();
	return tap_done();
}
