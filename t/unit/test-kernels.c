/*
 * test-kernels.c - every CPU kernel's backward against finite differences
 * of its forward, and every row of the kernel registry
 * (lib/backend/kernels.c): a CPU row's functions against its op's reference
 * row's by the form of their signatures (test_registry), so that a new row
 * of a known form is tested without a new case here.
 *
 * The finite-difference check works on the scalar L = sum(out * R) for a
 * fixed random R: the analytic gradient is the backward fed with dout = R;
 * the numeric one is (L(x+h) - L(x-h)) / 2h per element, with h = 1e-2 and
 * float forward passes.  Its error is the truncation h^2/6 |L'''| =
 * 1.7e-5 |L'''| (L''' is of order 1 for these inputs: uniform in [-1, 1],
 * gates in [-4, 4]), the rounding of x + h to float (u |x| / h = 6e-6
 * relative, u = 2^-24 the fp32 unit roundoff), and the forward's rounding:
 * each output carries c u of the magnitudes summed into it (c = 1 to 3:
 * the references sum in double and round once, P or a norm once more), and
 * only the outputs that depend on the perturbed input differ between the
 * two passes - at most 40 here (a key feeds the D outputs of every later
 * query of its group), each |out R| <= 1 - so the difference carries at
 * most 2 x 40 c u and the quotient 40 c u / h = 2.4e-4 c.  Against
 * gradients of rms 0.05 to 1.4 (a key's, fed by 40 outputs, 0.1 and more)
 * that is at most 2.4e-3 c in the worst case; FD_TOL = 1e-2 (relative L2,
 * against the numeric gradient's norm: with random inputs no gradient here
 * is small by cancellation) stays above it, while a wrong formula (a sign,
 * a missing term, a transposed index) is an error of order 1.  The errors
 * printed are about 1e-5, the truncation.  The accuracy of the kernels is
 * pinned by the comparisons against PyTorch in t/t0200 (1e-4).
 *
 * A fast kernel against its reference is bounded from fp32 rounding and
 * the magnitudes summed (t/tap.h): element-wise, |fast - ref| <= k u mag,
 * where the test computes mag (the sum of |terms|) in double and k counts
 * the roundings of both paths, or, for attention, by relative L2 against a
 * scale that cannot cancel.  Each bound's count is beside it.
 */
#include <math.h>
#include <sys/mman.h>

#include "backend/kernels.h"
#include "cpu/gemm.h"
#include "cpu/ops.h"
#include "config/hfconfig.h"
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

/* the finite-difference error: relative L2 against the numeric gradient */
static double fd_err(const float *analytic, const float *numeric, size_t n)
{
	return tap_rel_l2(analytic, numeric, n, 0);
}

/* mag[i*N + j] = sum_k |A[i,k]| |B[k,j]| (+ |C0[i*N + j]|), A[i,k] at
 * A[i*ai + k*ak], B[k,j] at B[k*bk + j*bj]: the magnitudes a product's
 * element sums, for tap_bound_err */
static double *abs_gemm(const float *A, long ai, long ak, const float *B, long bk, long bj, const float *C0,
			int M, int N, int K)
{
	double *mag = malloc(sizeof(double) * (size_t)M * N);

	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double s = C0 ? fabs(C0[(long)i * N + j]) : 0;
			for (int k = 0; k < K; k++)
				s += fabs(A[i * ai + k * ak]) * fabs(B[k * bk + j * bj]);
			mag[(long)i * N + j] = s;
		}
	return mag;
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
	ok(fd_err(dx, nx, N * C) < FD_TOL, "rmsnorm dx matches finite differences (%.2e)", fd_err(dx, nx, N * C));
	ok(fd_err(dw, nw, C) < FD_TOL, "rmsnorm dw matches finite differences (%.2e)", fd_err(dw, nw, C));
	/* accumulate flag adds: the second call computes the same bits v = dx
	 * (same inputs, same order) and adds them to dx, and dx + dx = 2 dx
	 * exactly in binary floating point, so the check is exact */
	float *dx2 = malloc(N * C * 4);
	memcpy(dx2, dx, N * C * 4);
	memset(dw, 0, C * 4);
	hp_rmsnorm_bwd(dx2, dw, c.R, c.x, c.w, c.rstd, N, C, 1);
	int okacc = 1;
	for (int i = 0; i < N * C; i++)
		okacc &= dx2[i] == 2 * dx[i];
	ok(okacc, "rmsnorm backward accumulates into dx when asked (exactly 2 dx)");
	free(c.x); free(c.w); free(c.y); free(c.rstd); free(c.R); free(dx); free(dw); free(nx); free(nw); free(dx2);
}

/* The RMSNorm of rmsnorm.c written one row at a time, each row's double
 * sums in element order, dw summed row after row: the kernels interleave
 * rows (several sum chains at once) and must give exactly these bits. */
static void rms_one_row(float *y, float *rstd, float *dx, float *dw, const float *x, const float *w,
			const float *dy, long N, int C, float eps)
{
	for (long n = 0; n < N; n++) {
		const float *xr = x + n * C, *dyr = dy + n * C;
		double ss = 0, d = 0;

		for (int c = 0; c < C; c++)
			ss += (double)xr[c] * xr[c];
		float r = (float)(1.0 / sqrt(ss / C + eps));
		rstd[n] = r;
		for (int c = 0; c < C; c++)
			y[n * C + c] = w[c] * (xr[c] * r);
		for (int c = 0; c < C; c++) {
			float xh = xr[c] * r;
			d += (double)dyr[c] * w[c] * xh;
			dw[c] += dyr[c] * xh;
		}
		float mean = (float)(d / C);
		for (int c = 0; c < C; c++)
			dx[n * C + c] = r * (dyr[c] * w[c] - xr[c] * r * mean);
	}
}

static void test_rmsnorm_rows_bits(void)
{
	/* 7 rows: a block of four and three alone.  The backward's dx sees a
	 * dot summed in another order (changing its multiply order made this
	 * fail); the forward's float results almost never see the double
	 * sum's last bits, so its check catches rows or lanes crossed and the
	 * rstd of the wrong row, not the order of the sum. */
	enum { N = 7, C = 37 };
	float *x = rnd(N * C), *w = rnd(C), *dy = rnd(N * C);
	float y[N * C], rs[N], dx[N * C], dw[C] = { 0 };
	float y1[N * C], rs1[N], dx1[N * C], dw1[C] = { 0 };

	for (int i = 0; i < N * C; i++)
		x[i] *= (float)(1 + i % 11) * (i % 3 ? 1e3f : 1e-3f);
	hp_rmsnorm_fwd(y, rs, x, w, N, C, 1e-6f);
	hp_rmsnorm_bwd(dx, dw, dy, x, w, rs, N, C, 0);
	rms_one_row(y1, rs1, dx1, dw1, x, w, dy, N, C, 1e-6f);
	ok(!memcmp(y, y1, sizeof(y)) && !memcmp(rs, rs1, sizeof(rs)),
	   "rmsnorm forward: rows taken together give the bits of one row at a time");
	ok(!memcmp(dx, dx1, sizeof(dx)) && !memcmp(dw, dw1, sizeof(dw)),
	   "rmsnorm backward: rows taken together give the bits of one row at a time (dx, dw)");
	free(x); free(w); free(dy);
}

/* ---- RoPE ---- */
/* heads of ld floats, the Dr at off rotated (whole heads: ld = Dr, off 0) */
struct rope_ctx { float *x, *y, *R, *cs, *sn; int32_t *pos; int N, H, D; int ld, off, inter; };
static double rope_loss(void *p)
{
	struct rope_ctx *c = p;
	size_t n = (size_t)c->N * c->H * c->ld;

	memcpy(c->y, c->x, sizeof(float) * n);
	hp_rope_fwd(c->y + c->off, c->pos, c->cs, c->sn, c->N, c->H, c->ld, c->D, c->inter);
	return dot(c->y, c->R, n);
}

static void test_rope(void)
{
	int N = 5, H = 2, D = 8, T = 5;
	size_t n = (size_t)N * H * D;
	struct rope_ctx c = { rnd(n), rnd(n), rnd(n), malloc(T * D / 2 * 4), malloc(T * D / 2 * 4),
			      malloc(N * 4), N, H, D, D, 0, 0 };
	float *dx = malloc(n * 4), *nx = malloc(n * 4);

	struct hp_model_spec rs = { .head_dim = D, .max_pos = T };

	rs.rope = (struct hp_rope_spec){ .type = HP_ROPE_DEFAULT, .theta = 10000.0 };
	hp_model_spec_rope_table(&rs, c.cs, c.sn, T);
	for (int i = 0; i < N; i++)
		c.pos[i] = i;
	memcpy(dx, c.R, n * 4);
	hp_rope_bwd(dx, c.pos, c.cs, c.sn, N, H, D, D, 0);
	numgrad(nx, c.x, n, rope_loss, &c);
	ok(fd_err(dx, nx, n) < FD_TOL, "rope backward matches finite differences (%.2e)", fd_err(dx, nx, n));
	/* position 0 is the identity; position 1, pair 0 rotates by exactly 1
	 * radian, exactly: inv_freq[0] = theta^0 = 1, the table holds cos(1.0)
	 * and sin(1.0) rounded once to float, and 1 * c - 0 * s = c, 0 * c +
	 * 1 * s = s round nothing */
	float v[8] = { 1, 0, 0, 0, 0, 0, 0, 0 };
	int32_t p1 = 1;
	hp_rope_fwd(v, &p1, c.cs, c.sn, 1, 1, 8, 8, 0);
	ok(v[0] == (float)cos(1.0) && v[4] == (float)sin(1.0) && v[1] == 0 && v[5] == 0,
	   "rope rotates the (i, i+D/2) pair by pos*theta^(-2i/D) (rotate_half layout)");
	/* yarn scales cos and sin: the rotation is no longer orthogonal, and
	 * the backward must still be its adjoint */
	rs.rope = (struct hp_rope_spec){ .type = HP_ROPE_YARN, .theta = 10000.0, .factor = 4.0,
					 .orig_max_pos = 2, .attention_factor = 1.1386, .beta_fast = 32,
					 .beta_slow = 1, .truncate = 1 };
	hp_model_spec_rope_table(&rs, c.cs, c.sn, T);
	memcpy(dx, c.R, n * 4);
	hp_rope_bwd(dx, c.pos, c.cs, c.sn, N, H, D, D, 0);
	numgrad(nx, c.x, n, rope_loss, &c);
	ok(fd_err(dx, nx, n) < FD_TOL, "yarn rope (attention factor 1.1386) backward matches finite "
	   "differences (%.2e)", fd_err(dx, nx, n));
	v[0] = 1;
	memset(v + 1, 0, 7 * sizeof(float));
	p1 = 0;
	hp_rope_fwd(v, &p1, c.cs, c.sn, 1, 1, 8, 8, 0);
	/* cos(0) * 1.1386 is 1.1386 in double, rounded once to float: exact */
	ok(v[0] == (float)1.1386, "yarn's position 0 scales by the attention factor (%.7g)", v[0]);
	free(c.x); free(c.y); free(c.R); free(c.cs); free(c.sn); free(c.pos); free(dx); free(nx);
}

/*
 * RoPE on a slice of each head (DeepSeek's qk_rope_head_dim after the
 * qk_nope_head_dim floats) and in DeepSeek's interleaved pairs: the slice
 * gives the bits of the same rotation on compact heads and leaves the other
 * floats alone; the interleaved rotation is transformers' (4.57: view as
 * pairs, transpose, rotate_half) on the de-interleaved head, its outputs
 * permuted back - the same bits, since the arithmetic per pair is the same;
 * its backward is the adjoint (finite differences, through the slice).
 */
static void test_rope_slice(void)
{
	enum { N = 5, H = 3, NOPE = 4, DR = 8, LD = NOPE + DR + 2, T = 6 };
	size_t n = (size_t)N * H * LD, nc = (size_t)N * H * DR;
	float *cs = malloc(T * DR / 2 * 4), *sn = malloc(T * DR / 2 * 4);
	float *x = rnd(n), *y = malloc(n * 4), *z = malloc(nc * 4), *d = malloc(nc * 4);
	int32_t pos[N] = { 3, 0, 5, 1, 5 };
	struct hp_model_spec rs = { .head_dim = DR, .max_pos = T };

	rs.rope = (struct hp_rope_spec){ .type = HP_ROPE_DEFAULT, .theta = 10000.0 };
	hp_model_spec_rope_table(&rs, cs, sn, T);
	for (int inter = 0; inter < 2; inter++)
		for (int bwd = 0; bwd < 2; bwd++) {
			void (*f)(float *, const int32_t *, const float *, const float *, long, int, int, int, int) =
				bwd ? hp_rope_bwd : hp_rope_fwd;
			size_t other = 0, rot = 0;

			memcpy(y, x, n * 4);
			for (size_t h = 0; h < (size_t)N * H; h++)
				memcpy(z + h * DR, x + h * LD + NOPE, DR * 4);
			f(y + NOPE, pos, cs, sn, N, H, LD, DR, inter);
			f(z, pos, cs, sn, N, H, DR, DR, inter);
			for (size_t h = 0; h < (size_t)N * H; h++)
				for (int i = 0; i < LD; i++)
					if (i >= NOPE && i < NOPE + DR)
						rot += memcmp(&y[h * LD + i], &z[h * DR + i - NOPE], 4) != 0;
					else
						other += memcmp(&y[h * LD + i], &x[h * LD + i], 4) != 0;
			ok(rot == 0 && other == 0, "rope %s inter=%d on heads of %d, the %d at %d: the compact heads' "
			   "bits (%zu differ), the other floats untouched (%zu changed)", bwd ? "bwd" : "fwd", inter,
			   LD, DR, NOPE, rot, other);
		}

	/* interleaved = de-interleave, rotate_half, permute back */
	for (int bwd = 0; bwd < 2; bwd++) {
		void (*f)(float *, const int32_t *, const float *, const float *, long, int, int, int, int) =
			bwd ? hp_rope_bwd : hp_rope_fwd;
		size_t bad = 0;

		memcpy(z, x, nc * 4);
		for (size_t h = 0; h < (size_t)N * H; h++)
			for (int i = 0; i < DR / 2; i++) {
				d[h * DR + i] = z[h * DR + 2 * i];
				d[h * DR + DR / 2 + i] = z[h * DR + 2 * i + 1];
			}
		f(z, pos, cs, sn, N, H, DR, DR, 1);
		f(d, pos, cs, sn, N, H, DR, DR, 0);
		for (size_t h = 0; h < (size_t)N * H; h++)
			for (int i = 0; i < DR / 2; i++)
				bad += memcmp(&z[h * DR + 2 * i], &d[h * DR + i], 4) != 0 ||
				       memcmp(&z[h * DR + 2 * i + 1], &d[h * DR + DR / 2 + i], 4) != 0;
		ok(bad == 0, "rope %s inter=1: transformers' de-interleaved rotate_half, permuted back, bit for bit "
		   "(%zu of %zu pairs differ)", bwd ? "bwd" : "fwd", bad, nc / 2);
	}
	float v[8] = { 1, 0, 0, 0, 0, 0, 0, 0 };
	int32_t p1 = 1;
	hp_rope_fwd(v, &p1, cs, sn, 1, 1, 8, 8, 1);
	ok(v[0] == (float)cos(1.0) && v[1] == (float)sin(1.0) && v[2] == 0 && v[4] == 0,
	   "rope inter=1 rotates the (2i, 2i+1) pair by pos*theta^(-2i/Dr)");

	/* the backward through the slice, interleaved: the adjoint */
	struct rope_ctx c = { x, y, rnd(n), cs, sn, pos, N, H, DR, LD, NOPE, 1 };
	float *dx = malloc(n * 4), *nx = malloc(n * 4);
	memcpy(dx, c.R, n * 4);
	hp_rope_bwd(dx + NOPE, pos, cs, sn, N, H, LD, DR, 1);
	numgrad(nx, x, n, rope_loss, &c);
	ok(fd_err(dx, nx, n) < FD_TOL, "rope inter=1 on a slice: backward matches finite differences (%.2e)",
	   fd_err(dx, nx, n));
	free(cs); free(sn); free(x); free(y); free(z); free(d); free(c.R); free(dx); free(nx);
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
	ok(fd_err(dg, ng, n) < FD_TOL && fd_err(du, nu, n) < FD_TOL,
	   "swiglu backward matches finite differences (%.2e, %.2e)", fd_err(dg, ng, n), fd_err(du, nu, n));
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
	ok(fd_err(d, nd, N * V) < FD_TOL, "cross-entropy backward matches finite differences (%.2e)",
	   fd_err(d, nd, N * V));
	int zero = 1;
	for (int v = 0; v < V; v++)
		zero &= d[V + v] == 0;
	ok(zero, "ignored rows get zero gradient");
	int32_t bad[1] = { 11 };
	ok(hp_cross_entropy_fwd(&s, &cnt, c.l, bad, 1, V) == -1, "a target outside the vocabulary is refused");
	/* uniform logits: loss = log V exactly - each expf(0) is 1, their
	 * double sum 11, and log(11) + 0 - 0 rounds nothing more */
	float uni[11] = { 0 };
	int32_t t0[1] = { 5 };
	hp_cross_entropy_fwd(&s, &cnt, uni, t0, 1, V);
	ok(s == log(11.0), "uniform logits give log(V), exactly");
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
	ok(fd_err(dx, nx, N * K) < FD_TOL && fd_err(dW, nW, O * K) < FD_TOL && fd_err(db, nb, O) < FD_TOL,
	   "linear reference backward matches finite differences");
	free(c.x); free(c.W); free(c.b); free(c.y); free(c.R); free(dx); free(dW); free(db);
	free(nx); free(nW); free(nb);
}

/* A linear row against the reference row (the registry walk, below). */
static void cmp_linear(const struct hp_kernel *ref, const struct hp_kernel *kr)
{
	/*
	 * The BLAS table against the reference, forward and backward, element
	 * by element from the magnitudes summed: the reference sums in double
	 * and rounds once to float (u of the magnitudes; its double sum's own
	 * error, n 2^-53, is far below one more u), the BLAS path is a float
	 * dot product of length n (within gamma_n of the magnitudes in any
	 * order and blocking, with FMA or without: at every CPU level), and
	 * each add of a bias or of the accumulated gradient rounds once on each
	 * side.  So k = n + 3 roundings (n + 4 where the gradient accumulates),
	 * against which one wrong term (about mag / n) fails.
	 */
	int N2 = 33, K2 = 40, O2 = 29;
	float *x = rnd(N2 * K2), *W = rnd(O2 * K2), *b = rnd(O2), *dy = rnd(N2 * O2);
	float *y1 = malloc(N2 * O2 * 4), *y2 = malloc(N2 * O2 * 4);
	float *dx1 = rnd(N2 * K2), *dx2 = malloc(N2 * K2 * 4), *dW1 = rnd(O2 * K2), *dW2 = malloc(O2 * K2 * 4);
	float *db1 = rnd(O2), *db2 = malloc(O2 * 4);
	/* y = x W^T + b; dx += dy W; dW += dy^T x; db += sum_n dy */
	double *my = abs_gemm(x, K2, 1, W, 1, K2, NULL, N2, O2, K2);
	double *mdx = abs_gemm(dy, O2, 1, W, K2, 1, dx1, N2, K2, O2);
	double *mdW = abs_gemm(dy, 1, O2, x, K2, 1, dW1, O2, K2, N2);
	double mdb[29];
	for (int o = 0; o < O2; o++) {
		mdb[o] = fabs(db1[o]);
		for (int n = 0; n < N2; n++) {
			my[n * O2 + o] += fabs(b[o]);
			mdb[o] += fabs(dy[n * O2 + o]);
		}
	}
	memcpy(dx2, dx1, N2 * K2 * 4);
	memcpy(dW2, dW1, O2 * K2 * 4);
	memcpy(db2, db1, O2 * 4);
	ref->cpu.linear_fwd(y1, x, W, b, N2, K2, O2);
	kr->cpu.linear_fwd(y2, x, W, b, N2, K2, O2);
	double ey = tap_bound_err(y2, y1, my, N2 * O2, K2 + 3);
	ok(ey <= 1, "%s linear forward equals the reference (worst %.2f of (K+3) u sum|x||W|)", kr->name, ey);
	ref->cpu.linear_bwd(dx1, dW1, db1, dy, x, W, N2, K2, O2, 1);
	kr->cpu.linear_bwd(dx2, dW2, db2, dy, x, W, N2, K2, O2, 1);
	double edx = tap_bound_err(dx2, dx1, mdx, N2 * K2, O2 + 4), edW = tap_bound_err(dW2, dW1, mdW, O2 * K2, N2 + 4);
	double edb = tap_bound_err(db2, db1, mdb, O2, N2 + 3);
	ok(edx <= 1 && edW <= 1 && edb <= 1,
	   "%s linear backward (accumulating) equals the reference (worst %.2f %.2f %.2f of the bound)", kr->name,
	   edx, edW, edb);
	free(my); free(mdx); free(mdW);
	free(x); free(W); free(b); free(dy); free(y1); free(y2);
	free(dx1); free(dx2); free(dW1); free(dW2); free(db1); free(db2);
}

/* ---- attention ---- */

/*
 * BLAS attention against the reference: relative L2 error ATT_TOL, each
 * tensor against a scale its rounding follows (as test-flashattn.c): out by
 * max(||out||, rms(v) sqrt(n)), a convex combination of rows of v whose own
 * norm shrinks by averaging; P by its own norm (its rows sum to 1); dq, dk,
 * dv by max(own norm, rms of the whole reference gradient x sqrt(n)).  The
 * BLAS path sums in float (scores over D, P V over the keys, dk and dv over
 * the queries times the GQA group) and uses the 2-ulp vector exp, the
 * reference sums its dots in double but accumulates dk and dv in float.
 * Independent roundings add like a random walk, sqrt(n) u for n terms; the
 * longest sums here, dk and dv over 150 queries times a group of 2, give
 * 17 u = 1e-6 (the worst case of one element, 300 u, is not a tensor's
 * rms), so 1e-5, while a mask or indexing bug is of order 1.
 */
#define ATT_TOL 1e-5

static double att_out_err(const float *got, const float *want, size_t n, const float *v, size_t nv)
{
	const float *x[1] = { v };

	return tap_rel_l2(got, want, n, tap_floor(tap_rms(1, x, &nv), n));
}

/* e[0..2]: dq, dk, dv against the reference's, with the gradient's floor */
static void att_grad_err(double e[3], const float *dq, const float *dq_ref, size_t nq, const float *dk,
			 const float *dk_ref, const float *dv, const float *dv_ref, size_t nk)
{
	const float *x[3] = { dq_ref, dk_ref, dv_ref };
	size_t n[3] = { nq, nk, nk };
	double g = tap_rms(3, x, n);

	e[0] = tap_rel_l2(dq, dq_ref, nq, tap_floor(g, nq));
	e[1] = tap_rel_l2(dk, dk_ref, nk, tap_floor(g, nk));
	e[2] = tap_rel_l2(dv, dv_ref, nk, tap_floor(g, nk));
}

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
	ok(fd_err(dq, nq_, nq) < FD_TOL, "attention dq matches finite differences (%.2e)", fd_err(dq, nq_, nq));
	ok(fd_err(dk, nk_, nk) < FD_TOL, "attention dk (GQA, summed over the group) matches (%.2e)",
	   fd_err(dk, nk_, nk));
	ok(fd_err(dv, nv_, nk) < FD_TOL, "attention dv matches finite differences (%.2e)", fd_err(dv, nv_, nk));
	/* causality: the first token's output depends on token 0 only */
	float keep = c.k[(size_t)(T - 1) * KV * D];
	att_loss(&c);
	float o0 = c.o[0];
	c.k[(size_t)(T - 1) * KV * D] = keep + 5;
	att_loss(&c);
	ok(c.o[0] == o0, "a later key does not change an earlier output (causal mask)");
	c.k[(size_t)(T - 1) * KV * D] = keep;
	free(c.q); free(c.k); free(c.v); free(c.o); free(c.P); free(c.R); free(dq); free(dk); free(dv);
	free(scr); free(nq_); free(nk_); free(nv_);
}

/* An attention row that saves P against the reference row, on 37 tokens
 * (the registry walk, below) */
static void cmp_attention(const struct hp_kernel *ref, const struct hp_kernel *kr)
{
	int T2 = 37, H2 = 4, KV2 = 2, D2 = 16, B2 = 2;
	size_t mq = (size_t)B2 * T2 * H2 * D2, mk = (size_t)B2 * T2 * KV2 * D2, mP = (size_t)B2 * H2 * T2 * T2;
	float *q = rnd(mq), *k = rnd(mk), *v = rnd(mk), *dout = rnd(mq);
	float *o1 = malloc(mq * 4), *o2 = malloc(mq * 4), *P1 = malloc(mP * 4), *P2 = malloc(mP * 4);
	float *a1 = malloc(mq * 4), *a2 = malloc(mq * 4), *k1 = malloc(mk * 4), *k2 = malloc(mk * 4);
	float *v1 = malloc(mk * 4), *v2 = malloc(mk * 4), *s2 = malloc((size_t)T2 * T2 * 4);
	ref->cpu.attention_fwd(o1, P1, q, k, v, NULL, B2, T2, H2, KV2, D2);
	kr->cpu.attention_fwd(o2, P2, q, k, v, NULL, B2, T2, H2, KV2, D2);
	double eo = att_out_err(o2, o1, mq, v, mk), eP = tap_rel_l2(P2, P1, mP, 0), eg[3];
	ok(eo < ATT_TOL && eP < ATT_TOL, "%s attention forward equals the reference (%.2e %.2e)", kr->name, eo, eP);
	ref->cpu.attention_bwd(a1, k1, v1, dout, P1, q, k, v, NULL, s2, B2, T2, H2, KV2, D2);
	kr->cpu.attention_bwd(a2, k2, v2, dout, P2, q, k, v, NULL, s2, B2, T2, H2, KV2, D2);
	att_grad_err(eg, a2, a1, mq, k2, k1, v2, v1, mk);
	ok(eg[0] < ATT_TOL && eg[1] < ATT_TOL && eg[2] < ATT_TOL,
	   "%s attention backward equals the reference (%.2e %.2e %.2e)", kr->name,
	   eg[0], eg[1], eg[2]);
	free(q); free(k); free(v); free(dout); free(o1);
	free(o2); free(P1); free(P2); free(a1); free(a2); free(k1); free(k2); free(v1); free(v2); free(s2);
}

/*
 * A flash row (the log-sum-exp saved, not P) against the reference row
 * that saves P, under the same ATT_TOL and scales: the tiles' float sums
 * are no longer than the BLAS path's (t/unit/test-flashattn.c holds the
 * flash kernel to more shapes and to its own lse).
 */
static void cmp_flash(const struct hp_kernel *ref, const struct hp_kernel *kr)
{
	int T = 37, H = 4, KV = 2, D = 16, B = 2;
	size_t mq = (size_t)B * T * H * D, mk = (size_t)B * T * KV * D, mP = (size_t)B * H * T * T;
	size_t ml = (size_t)B * H * T, sc = hp_flash_attention_scratch(T, H, D);
	float *q = rnd(mq), *k = rnd(mk), *v = rnd(mk), *dout = rnd(mq);
	float *o1 = malloc(mq * 4), *o2 = malloc(mq * 4), *P1 = malloc(mP * 4), *lse = malloc(ml * 4);
	float *a1 = malloc(mq * 4), *a2 = malloc(mq * 4), *k1 = malloc(mk * 4), *k2 = malloc(mk * 4);
	float *v1 = malloc(mk * 4), *v2 = malloc(mk * 4), *s1 = malloc((size_t)T * T * 4);
	float *s2 = sc ? malloc(sc * 4) : NULL;
	double eo, eg[3];

	ref->cpu.attention_fwd(o1, P1, q, k, v, NULL, B, T, H, KV, D);
	kr->cpu.flash_fwd(o2, lse, q, k, v, NULL, B, T, H, KV, D);
	eo = att_out_err(o2, o1, mq, v, mk);
	ok(eo < ATT_TOL, "%s attention forward equals the reference (%.2e)", kr->name, eo);
	ref->cpu.attention_bwd(a1, k1, v1, dout, P1, q, k, v, NULL, s1, B, T, H, KV, D);
	kr->cpu.flash_bwd(a2, k2, v2, dout, o2, lse, q, k, v, NULL, s2, B, T, H, KV, D);
	att_grad_err(eg, a2, a1, mq, k2, k1, v2, v1, mk);
	ok(eg[0] < ATT_TOL && eg[1] < ATT_TOL && eg[2] < ATT_TOL,
	   "%s attention backward equals the reference (%.2e %.2e %.2e)", kr->name, eg[0], eg[1], eg[2]);
	free(q); free(k); free(v); free(dout); free(o1); free(o2); free(P1); free(lse);
	free(a1); free(a2); free(k1); free(k2); free(v1); free(v2); free(s1); free(s2);
}

/*
 * The BLAS attention runs (row, kv head) pairs on threads: 1 and 3 threads
 * must give the same bits, with and without packed rows.  82M multiply-adds
 * a call (above the threading threshold, 8M); T = 200 leaves the backward
 * 3 blocks of scratch, and 8 pairs split over 3 threads unevenly.  (With
 * B = 2 the threads seldom overlap: three threads sharing one dS block
 * passed; at this size that race fails the test.)
 */
static void test_attention_threads(void)
{
	int B = 4, T = 200, H = 8, KV = 2, D = 64;
	size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D, nP = (size_t)B * H * T * T;
	size_t len[5] = { nq, nP, nq, nk, nk };
	float *q = rnd(nq), *k = rnd(nk), *v = rnd(nk), *dout = rnd(nq), *scr = malloc((size_t)T * T * 4);
	float *x[2][5];
	int32_t *seg = malloc((size_t)B * T * sizeof(int32_t));

	for (int i = 0; i < B * T; i++)     /* row 0: documents of 70 tokens; row 1: one */
		seg[i] = i < T ? i / 70 * 70 : 0;
	for (int r = 0; r < 2; r++)
		for (int t = 0; t < 5; t++)
			x[r][t] = malloc(len[t] * 4);
	for (int packed = 0; packed < 2; packed++) {
		for (int r = 0; r < 2; r++) {
			hp_attention_set_threads(r ? 3 : 1);
			hp_attention_fwd_blas(x[r][0], x[r][1], q, k, v, packed ? seg : NULL, B, T, H, KV, D);
			hp_attention_bwd_blas(x[r][2], x[r][3], x[r][4], dout, x[r][1], q, k, v, packed ? seg : NULL,
					      scr, B, T, H, KV, D);
		}
		hp_attention_set_threads(0);
		int same = 1;
		for (int t = 0; t < 5; t++)
			same &= !memcmp(x[0][t], x[1][t], len[t] * 4);
		ok(same, "blas attention%s: 1 and 3 threads give bit-identical out, P, dq, dk, dv",
		   packed ? " (packed rows)" : "");
	}
	for (int r = 0; r < 2; r++)
		for (int t = 0; t < 5; t++)
			free(x[r][t]);
	free(q); free(k); free(v); free(dout); free(scr); free(seg);
}

/*
 * The streaming kernels split their work over pool.h's threads when it is
 * large (HP_POOL_GRAIN floats a part): swiglu, rmsnorm (rows, and dw by
 * columns), rope, AdamW, the residual add and the scale must give the
 * same bits at 1 and 3 threads.  The pool's size is read once per
 * process, so each count runs in a child that writes every output into
 * shared memory.  Sizes are above the grains
 * and not multiples of 8 (the vector loops' tails move between threads).
 */
#define ST_N 301
#define ST_C 1001
#define ST_E 300001L
#define ST_H 8
#define ST_D 64
#define ST_FLOATS (6 * ST_E + 2L * ST_N * ST_C + ST_N + ST_C + 2L * ST_N * ST_H * ST_D)

struct st_run { int threads; float *out; };

static int st_child(void *p)
{
	const struct st_run *r = p;
	float *out = r->out;

	rng_state = 0x9e3779b97f4a7c15ull;
	float *g = rnd(ST_E), *u = rnd(ST_E), *dh = rnd(ST_E), *x = rnd((size_t)ST_N * ST_C);
	float *w = rnd(ST_C), *dy = rnd((size_t)ST_N * ST_C), *o = out;
	long nr = (long)ST_N * ST_H * ST_D;
	int32_t pos[ST_N];
	float *ct = malloc(sizeof(float) * ST_N * ST_D / 2), *sn = malloc(sizeof(float) * ST_N * ST_D / 2);
	double inv[ST_D / 2];

	hp_swiglu_fwd_vec(o, g, u, ST_E);
	hp_swiglu_bwd_vec(o + ST_E, o + 2 * ST_E, dh, g, u, ST_E);
	o += 3 * ST_E;
	float *y = o, *dx = o + (long)ST_N * ST_C, *rs = dx + (long)ST_N * ST_C, *dw = rs + ST_N;
	hp_rmsnorm_fwd(y, rs, x, w, ST_N, ST_C, 1e-6f);
	memcpy(dx, dy, sizeof(float) * ST_N * ST_C);      /* accumulate onto a residual gradient */
	memcpy(dw, w, sizeof(float) * ST_C);              /* and onto an earlier dw */
	hp_rmsnorm_bwd(dx, dw, dy, x, w, rs, ST_N, ST_C, 1);
	o = dw + ST_C;
	for (int i = 0; i < ST_D / 2; i++)
		inv[i] = pow(10000.0, -2.0 * i / ST_D);
	hp_rope_table(ct, sn, ST_N, ST_D, inv, 1.0);
	for (int i = 0; i < ST_N; i++)
		pos[i] = (i * 7) % ST_N;
	memcpy(o, dy, sizeof(float) * nr);
	memcpy(o + nr, x, sizeof(float) * nr);
	hp_rope_fwd(o, pos, ct, sn, ST_N, ST_H, ST_D, ST_D, 0);
	hp_rope_bwd(o + nr, pos, ct, sn, ST_N, ST_H, ST_D, ST_D, 0);
	o += 2 * nr;
	struct hp_adamw_hparams hp = { 1e-3, 0.9, 0.95, 1e-8, 0.1, 3 };
	float *m = rnd(ST_E), *v = rnd(ST_E);
	for (long i = 0; i < ST_E; i++)
		v[i] *= v[i];
	memcpy(o, g, sizeof(float) * ST_E);
	hp_adamw_step(o, dh, m, v, ST_E, &hp, 1);
	o += ST_E;
	hp_residual_add(o, g, u, ST_E);
	memcpy(o + ST_E, dh, sizeof(float) * ST_E);
	hp_scale(o + ST_E, 0.37f, ST_E);
	return !(hp_sgemm_threads() == r->threads && o + 2 * ST_E == out + ST_FLOATS);
}

static int streaming_run(int threads, float *out)
{
	struct st_run r = { threads, out };

	return tap_child(threads, NULL, st_child, &r);
}

static void test_streaming_threads(void)
{
	size_t n = (size_t)ST_FLOATS;
	float *sh = mmap(NULL, 2 * n * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (sh == MAP_FAILED) {
		ok(0, "mmap for the streaming kernels' thread test");
		return;
	}
	int ran = !streaming_run(1, sh) && !streaming_run(3, sh + n);
	ok(ran && !memcmp(sh, sh + n, n * sizeof(float)),
	   "swiglu, rmsnorm (dw by columns), rope, AdamW, residual add and scale: 1 and 3 threads give the same bits");
	munmap(sh, 2 * n * sizeof(float));
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
	ok(fd_err(dq, nq_, nq) < FD_TOL && fd_err(dk, nk_, nk) < FD_TOL && fd_err(dv, nv_, nk) < FD_TOL,
	   "packed attention backward matches finite differences (%.2e %.2e %.2e)",
	   fd_err(dq, nq_, nq), fd_err(dk, nk_, nk), fd_err(dv, nv_, nk));

	/* a document packed at offset a computes what it computes alone */
	int T2 = 150, a = 61, L = T2 - a, H2 = 2, KV2 = 1, D2 = 16;
	size_t mq = (size_t)T2 * H2 * D2, mk = (size_t)T2 * KV2 * D2;
	float *q = rnd(mq), *k = rnd(mk), *v = rnd(mk), *dout = rnd(mq);
	float *o = malloc(mq * 4), *P = malloc((size_t)H2 * T2 * T2 * 4), *oa = malloc(mq * 4);
	float *Pa = malloc((size_t)H2 * T2 * T2 * 4), *s2 = malloc((size_t)T2 * T2 * 4);
	int32_t *sg = malloc(T2 * sizeof(int32_t));
	for (int i = 0; i < T2; i++)
		sg[i] = i < a ? 0 : a;
	/* the reference sums the same terms in the same order either way, so
	 * its outputs are the same bits; the BLAS path blocks the products
	 * differently (64-row blocks from another start), so ATT_TOL */
	const struct hp_cpu_ops *tabs[2] = { &hp_cpu_ops_reference, &hp_cpu_ops_blas };
	for (int t = 0; t < 2; t++) {
		size_t nd = (size_t)L * H2 * D2;
		tabs[t]->attention_fwd(o, P, q, k, v, sg, 1, T2, H2, KV2, D2);
		tabs[t]->attention_fwd(oa, Pa, q + (size_t)a * H2 * D2, k + (size_t)a * KV2 * D2,
				       v + (size_t)a * KV2 * D2, NULL, 1, L, H2, KV2, D2);
		double ed = att_out_err(o + (size_t)a * H2 * D2, oa, nd, v + (size_t)a * KV2 * D2, (size_t)L * KV2 * D2);
		if (t == 0)
			ok(!memcmp(o + (size_t)a * H2 * D2, oa, nd * sizeof(float)),
			   "%s: a packed document's attention is the document alone's, bit for bit", tabs[t]->name);
		else
			ok(ed < ATT_TOL, "%s: a packed document's attention equals the document alone (%.2e)",
			   tabs[t]->name, ed);
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
	double eo = att_out_err(o2, o1, bq, v3, bk), eP = tap_rel_l2(P2, P1, bP, 0), eg[3];
	ok(eo < ATT_TOL && eP < ATT_TOL, "blas packed attention forward equals the reference (%.2e %.2e)", eo, eP);
	hp_cpu_ops_reference.attention_bwd(a1, k1, v1, do3, P1, q3, k3, v3, sg3, s2, 2, T2, H2, KV2, D2);
	hp_cpu_ops_blas.attention_bwd(a2, k2, v2, do3, P2, q3, k3, v3, sg3, s2, 2, T2, H2, KV2, D2);
	att_grad_err(eg, a2, a1, bq, k2, k1, v2, v1, bk);
	ok(eg[0] < ATT_TOL && eg[1] < ATT_TOL && eg[2] < ATT_TOL,
	   "blas packed attention backward equals the reference (%.2e %.2e %.2e)", eg[0], eg[1], eg[2]);
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

/* mag = scale (softmax(l) + onehot(t)) per row, in double, 0 on ignored
 * rows: the magnitudes a cross-entropy gradient element is made of */
static double *ce_mag(const float *l, const int32_t *t, int N, int V, float scale)
{
	double *mag = malloc(sizeof(double) * (size_t)N * V);

	for (int n = 0; n < N; n++) {
		const float *r = l + (long)n * V;
		double mx = r[0], se = 0;

		for (int v = 1; v < V; v++)
			mx = r[v] > mx ? r[v] : mx;
		for (int v = 0; v < V; v++)
			se += exp(r[v] - mx);
		for (int v = 0; v < V; v++)
			mag[(long)n * V + v] = t[n] == HP_IGNORE_INDEX ? 0 :
					       scale * (exp(r[v] - mx) / se + (v == t[n]));
	}
	return mag;
}

/* A SwiGLU row against the reference row (the registry walk, below). */
static void cmp_swiglu(const struct hp_kernel *ref, const struct hp_kernel *kr)
{
	long n = 1001;   /* not a multiple of 8: exercises the tails */
	float *g = rnd(n), *u = rnd(n), *dh = rnd(n);
	float *h1 = malloc(n * 4), *h2 = malloc(n * 4), *dg1 = malloc(n * 4), *dg2 = malloc(n * 4);
	float *du1 = malloc(n * 4), *du2 = malloc(n * 4);

	double *mh = malloc(n * sizeof(double)), *mdg = malloc(n * sizeof(double));
	for (long i = 0; i < n; i++)
		g[i] *= 30;   /* saturated sigmoids both ways */
	/*
	 * Element-wise bounds (no sums, so each element is a product chain).
	 * sigmoid s: the reference's 1 / (1 + expf(-g)) is within 4 u (a 1-ulp
	 * expf, 2 u, and two roundings), the vector path's e / (1 + e) or
	 * 1 / (1 + e) with its 2-ulp exp within 6 u.  h = g s u and du = dh g s
	 * add two roundings each: 6 u + 8 u, so k = 15 against |g s u|
	 * (|dh g s|).  dg = dh u s (1 + g (1 - s)) cancels in its last factor
	 * near g = -1.28, so its magnitude is |dh u s| (1 + |g|): the factor's
	 * rounding is at most (err(s) + 1 u) (1 + |g|) and the chain adds
	 * err(s) + 3 u of |dh u s (1 + |g|)|: 11 u + 15 u, so k = 28.  (One u
	 * more in each for the second-order terms and the double s of mag.)
	 */
	for (long i = 0; i < n; i++) {
		double sg = 1 / (1 + exp(-(double)g[i]));
		mh[i] = fabs(g[i] * sg * u[i]);
		mdg[i] = fabs(dh[i] * u[i] * sg) * (1 + fabs(g[i]));
	}
	ref->cpu.swiglu_fwd(h1, g, u, n);
	kr->cpu.swiglu_fwd(h2, g, u, n);
	double eh = tap_bound_err(h2, h1, mh, n, 15);
	ok(eh <= 1, "%s swiglu forward equals the reference (worst %.2f of 15 u |h|)", kr->name, eh);
	ref->cpu.swiglu_bwd(dg1, du1, dh, g, u, n);
	kr->cpu.swiglu_bwd(dg2, du2, dh, g, u, n);
	for (long i = 0; i < n; i++)
		mh[i] = fabs(dh[i] * g[i] / (1 + exp(-(double)g[i])));
	double edg = tap_bound_err(dg2, dg1, mdg, n, 28), edu = tap_bound_err(du2, du1, mh, n, 15);
	ok(edg <= 1 && edu <= 1, "%s swiglu backward equals the reference (worst %.2f %.2f of the bound)",
	   kr->name, edg, edu);
	free(g); free(u); free(dh); free(h1); free(h2); free(dg1); free(dg2); free(du1); free(du2);
	free(mh); free(mdg);
}

/* A cross-entropy row against the reference row (the registry walk, below). */
static void cmp_cross_entropy(const struct hp_kernel *ref, const struct hp_kernel *kr)
{
	int N = 7, V = 1003;
	float *l = rnd((size_t)N * V), *d1 = malloc((size_t)N * V * 4), *d2 = malloc((size_t)N * V * 4);
	int32_t t[7] = { 0, 1002, HP_IGNORE_INDEX, 500, 7, 8, 9 };
	double s1, s2;
	long c1, c2;
	for (long i = 0; i < (long)N * V; i++)
		l[i] *= 20;
	/*
	 * The loss of a row is log(se) + max - l[t], where only se differs: the
	 * vector path sums its exps (2 ulp, 4 u) in eight float lanes of
	 * ceil(V/8) terms and 3 pairwise adds - within gamma of se, the terms
	 * being positive - the reference its 1-ulp expf (2 u) in double, so
	 * their se differ by at most (ceil(V/8) + 3 + 4 + 2) u relative, which
	 * the log turns into as much absolute: (ceil(V/8) + 10) u a row, one u
	 * for the double arithmetic after it.
	 */
	int lanes = (V + 7) / 8;
	ref->cpu.cross_entropy_fwd(&s1, &c1, l, t, N, V);
	kr->cpu.cross_entropy_fwd(&s2, &c2, l, t, N, V);
	double tl = (double)c1 * (lanes + 10) * TAP_U;
	ok(c1 == c2 && fabs(s2 - s1) <= tl, "%s cross-entropy loss equals the reference (%.3e, bound %.2e)",
	   kr->name, fabs(s2 - s1), tl);
	/*
	 * The gradient, scale (exp(l - max) / se - [v = t]), element-wise
	 * against scale (p + [v = t]): the vector path's share p carries its
	 * se (ceil(V/8) + 3 + 4 u, as above), its own exp (4 u), the division
	 * and the product (2 u); the reference's its expf (2 u) and two
	 * roundings; the target's subtraction one u on each side:
	 * k = ceil(V/8) + 20 with one u to spare.  Ignored rows are zeros on
	 * both sides (mag 0: exact).
	 */
	double *mce = ce_mag(l, t, N, V, 0.25f);
	ref->cpu.cross_entropy_bwd(d1, l, t, N, V, 0.25f);
	memcpy(d2, l, (size_t)N * V * 4);
	kr->cpu.cross_entropy_bwd(d2, d2, t, N, V, 0.25f);   /* in place, as the model calls it */
	double ece = tap_bound_err(d2, d1, mce, (size_t)N * V, lanes + 20);
	ok(ece <= 1, "%s cross-entropy gradient (in place) equals the reference (worst %.2f of the bound)",
	   kr->name, ece);
	free(l); free(d1); free(d2); free(mce);
}

/*
 * Vocab-parallel cross-entropy: the logits cut into tp ranges, the two
 * reductions done here by hand, against the CE of whole rows.  Both sides
 * take the same float expf of the same l - max (the global max is one of
 * the rank maxima, exactly) and sum them in double, in another grouping,
 * so a row's se differs by at most (V + 1) u_d relative (u_d = 2^-53, the
 * terms positive), as much absolute in its log; the row's loss
 * log(se) + max - l[t] and the running total round in double on each side
 * at most twice by u_d of |log se| + |max| + |l[t]| <= log V + 2 max|l|
 * (se lies in [1, V]) and of the total.  The gradient differs element-wise
 * only in where it rounds - (float)(e / se) * scale against e * (float)(scale
 * / se), two roundings each, and the target's subtraction once each - so
 * k = 7 against scale (p + [v = t]).
 */
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
	double *mg = ce_mag(l, tg, N, V, 1.0f / (float)cr);
	double tl = 0x1p-53 * (double)cr * ((V + 1) + 4 * (log(V) + 2 * 4.0) + 2 * fabs(ref));   /* |l| <= 4 */
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
		double eg = tap_bound_err(dvp, dref, mg, N * V, 7);
		ok(!bad && cg == cr && fabs(got - ref) <= tl && eg <= 1,
		   "vocab-parallel cross-entropy over %d ranks equals the whole rows' (loss %.3e, bound %.1e; "
		   "grad worst %.2f of the bound)", tp, fabs(got - ref), tl, eg);
	}
	free(l);
	free(mg);
}

/*
 * A fused_rmsnorm row (the residual add in front of the norm) against the
 * reference row after the same add, element-wise against the magnitudes:
 * h = a + b is one float add on both sides (exact match); rstd may differ by
 * a float ulp (the vector path sums squares in double in another order),
 * 2 u of |rstd|; y = w (x rstd) two roundings on each side plus rstd's,
 * k = 6 of |y|.  The backward, accumulating into the residual's gradient
 * g0 as the model calls it: dx = g0 + r (dy w - x r mean), mean = (sum in
 * double) / C rounded once: six roundings on each side, one u of the
 * rounded mean, k = 14 of |g0| + r (|dy w| + |x r mean|); dw += dy (x r)
 * over the N rows in float: k = 2 (N + 2) of |dw0| + sum |dy x r|.
 */
static void cmp_rmsnorm_res(const struct hp_kernel *ref, const struct hp_kernel *kr)
{
	enum { N = 7, C = 37 };   /* a block of four rows and three alone; C not a multiple of 8 */
	float *a = rnd(N * C), *b = rnd(N * C), *w = rnd(C), *dy = rnd(N * C), *g0 = rnd(N * C), *dw0 = rnd(C);
	float x[N * C], h[N * C], y1[N * C], y2[N * C], r1[N], r2[N];
	float dx1[N * C], dx2[N * C], dw1[C], dw2[C];
	double my[N * C], mr[N], mdx[N * C], mdw[C];

	for (int i = 0; i < N * C; i++)
		x[i] = a[i] + b[i];
	ref->cpu.rmsnorm_fwd(y1, r1, x, w, N, C, 1e-6f);
	kr->cpu.rmsnorm_res_fwd(h, y2, r2, a, b, w, N, C, 1e-6f);
	for (int n = 0; n < N; n++) {
		mr[n] = fabs(r1[n]);
		for (int c = 0; c < C; c++)
			my[n * C + c] = fabs((double)w[c] * x[n * C + c] * r1[n]);
	}
	double er = tap_bound_err(r2, r1, mr, N, 2), ey = tap_bound_err(y2, y1, my, N * C, 6);
	ok(!memcmp(h, x, sizeof(x)) && er <= 1 && ey <= 1,
	   "%s rmsnorm forward (residual add fused) equals the reference (h exact, worst %.2f %.2f of the bound)",
	   kr->name, er, ey);
	memcpy(dx1, g0, sizeof(dx1));
	memcpy(dx2, g0, sizeof(dx2));
	memcpy(dw1, dw0, sizeof(dw1));
	memcpy(dw2, dw0, sizeof(dw2));
	ref->cpu.rmsnorm_bwd(dx1, dw1, dy, x, w, r1, N, C, 1);
	kr->cpu.rmsnorm_bwd(dx2, dw2, dy, x, w, r1, N, C, 1);
	for (int c = 0; c < C; c++)
		mdw[c] = fabs(dw0[c]);
	for (int n = 0; n < N; n++) {
		double d = 0, r = r1[n];

		for (int c = 0; c < C; c++)
			d += (double)dy[n * C + c] * w[c] * x[n * C + c] * r;
		for (int c = 0; c < C; c++) {
			double xr = (double)x[n * C + c] * r;

			mdx[n * C + c] = fabs(g0[n * C + c]) + r * (fabs((double)dy[n * C + c] * w[c]) + fabs(xr * d / C));
			mdw[c] += fabs(dy[n * C + c] * xr);
		}
	}
	double edx = tap_bound_err(dx2, dx1, mdx, N * C, 14), edw = tap_bound_err(dw2, dw1, mdw, C, 2 * (N + 2));
	ok(edx <= 1 && edw <= 1, "%s rmsnorm backward (accumulating) equals the reference (worst %.2f %.2f of the bound)",
	   kr->name, edx, edw);
	free(a); free(b); free(w); free(dy); free(g0); free(dw0);
}

/* " name(" in kernels/cuda/ops.h and "#define name " in cuda/emu_names.h:
 * a CUDA row's functions exist on the GPU and in its host emulation */
static int cuda_declares(const char *ops, const char *emu, const char *name)
{
	char decl[96], def[128];

	snprintf(decl, sizeof(decl), " %s(", name);
	snprintf(def, sizeof(def), "#define %s ", name);
	return strstr(ops, decl) && strstr(emu, def);
}

static char *slurp(const char *dir, const char *rel)
{
	char path[4096];
	FILE *f;
	char *buf = NULL;
	long n;

	snprintf(path, sizeof(path), "%s/%s", dir, rel);
	if (!(f = fopen(path, "rb")))
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n)
		buf[n] = '\0';
	else {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	return buf;
}

/*
 * The op x backend walk over the kernel registry (lib/backend/kernels.c):
 * every CPU row with functions against its op's reference row, by the form
 * of its functions, so that a new row of a known form is tested without a
 * new test case (a new form fails here until it has a comparison); every
 * CUDA row's functions declared in kernels/cuda/ops.h and emulated
 * (t/cuemu and t/unit/test-cuda*.c run them against the CPU).  The
 * references themselves are checked by finite differences above.
 */
static void test_registry(void)
{
	const char *src = getenv("HP_SRC_DIR");
	char *ops = slurp(src && *src ? src : ".", "kernels/cuda/ops.h");
	char *emu = slurp(src && *src ? src : ".", "kernels/cuda/emu_names.h");

	for (int i = 0; i < hp_nkernels; i++) {
		const struct hp_kernel *k = &hp_kernels[i];
		const struct hp_kernel_cpu *f = &k->cpu;
		const struct hp_kernel *ref = hp_kernel_find(k->op, k->backend, "reference");
		char what[96];

		snprintf(what, sizeof(what), "%s / %s / %s", k->op, k->backend, k->name);
		ok(!hp_kernel_find(k->op, k->backend, k->name) || hp_kernel_find(k->op, k->backend, k->name) == k,
		   "%s: one row", what);
		if (!strcmp(k->backend, "cuda")) {
			const char *t = k->cuda ? k->cuda : "";
			int found = 1, n = 0;

			if (!ops || !emu) {
				tap_skip("no HP_SRC_DIR", "%s: its functions are in kernels/cuda/ops.h", what);
				continue;
			}
			for (size_t len; *(t += strspn(t, " ")); t += len, n++) {
				char name[80];

				len = strcspn(t, " ");
				snprintf(name, sizeof(name), "%.*s", (int)len, t);
				found &= cuda_declares(ops, emu, name);
			}
			ok(found && n > 0, "%s: its %d functions are in kernels/cuda/ops.h and emulated", what, n);
			continue;
		}
		ok(!k->cuda, "%s: a CPU row names no CUDA function", what);
		if (ref == k || !memcmp(f, &(struct hp_kernel_cpu){ 0 }, sizeof(*f)))
			continue;   /* the reference itself, or the model's composition */
		if (!ref)
			ok(0, "%s: the op has no reference row", what);
		else if (f->linear_fwd && ref->cpu.linear_fwd)
			cmp_linear(ref, k);
		else if (f->attention_fwd && ref->cpu.attention_fwd)
			cmp_attention(ref, k);
		else if (f->flash_fwd && ref->cpu.attention_fwd)
			cmp_flash(ref, k);
		else if (f->rmsnorm_res_fwd && ref->cpu.rmsnorm_fwd)
			cmp_rmsnorm_res(ref, k);
		else if (f->swiglu_fwd && ref->cpu.swiglu_fwd)
			cmp_swiglu(ref, k);
		else if (f->cross_entropy_fwd && ref->cpu.cross_entropy_fwd)
			cmp_cross_entropy(ref, k);
		else
			ok(0, "%s: no comparison with the reference for its functions' form", what);
	}
	free(ops);
	free(emu);
}

int main(void)
{
	test_embedding();
	test_rmsnorm();
	test_rmsnorm_rows_bits();
	test_rope();
	test_rope_slice();
	test_swiglu();
	test_ce();
	test_linear();
	test_attention();
	test_attention_segments();
	test_attention_threads();
	test_streaming_threads();
	test_vocab_parallel_ce();
	test_registry();
	return tap_done();
}
