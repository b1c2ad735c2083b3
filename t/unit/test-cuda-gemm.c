/*
 * test-cuda-gemm.c - the CUDA GEMMs (dense and grouped), cross-entropy and
 * AdamW (kernels/cuda/{gemm,ce,adamw}.cu) against the CPU reference kernels,
 * on awkward shapes (N = 1, odd O, sizes off every tile) and realistic ones,
 * plus bit-for-bit determinism of the weight-gradient GEMMs.  Inputs are
 * rounded to bf16 on the host first, so the reference sees what the GPU
 * sees.  Skips without a CUDA build or a GPU.
 */
#include <math.h>

#include "cpu/ops.h"
#include "tap.h"

#define WHAT "cuda GEMM, cross-entropy and AdamW against the CPU reference"

#ifdef HP_HAVE_CUDA
#include "cudatest.h"

/* fp32 outputs: products of bf16 inputs are exact in fp32 and only the fp32
 * sums round (~1e-6 normalised); a layout or accumulate bug gives >= 1e-2 */
#define TOL_F32 2e-5
/* bf16 outputs: one rounding to bf16 (<= 2^-9 relative, ~1e-3 normalised)
 * after fp32 accumulation; a bias or accumulate pass adds one more at most */
#define TOL_BF16 5e-3

static struct hp_err err;

static float *vec(size_t n, unsigned seed, float a, int round)
{
	return ct_hfill(n, seed, a, round);
}

static float *dup(const float *x, size_t n)
{
	float *y = malloc(n * sizeof(float) + 4);

	memcpy(y, x, n * sizeof(float));
	return y;
}

/* one test line: passes when the call returned 0 and ne <= tol */
static void check(int rc, double ne, double tol, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void check(int rc, double ne, double tol, const char *fmt, ...)
{
	char name[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	ok(!rc && ne <= tol, "%s: nerr %.2e (tol %.0e)%s%s", name, ne, tol, rc ? " - " : "", rc ? err.msg : "");
}

/* rc, or the stream's pending error: a bad launch shows in the test line */
static int done(int rc)
{
	return rc ? rc : hp_cuda_sync(&err);
}

/* nerr of device d (n values, bf16 when bf) against host want */
static double dev_nerr(const void *d, const float *want, size_t n, int bf)
{
	float *got = ct_host(d, n, bf);
	double ne = ct_nerr(got, want, n);

	free(got);
	return ne;
}

/* device d's bytes, downloaded (synchronises) */
static void *dev_bytes(const void *d, size_t bytes)
{
	void *h = malloc(bytes + 4);

	hp_cuda_download(h, d, bytes, &err);
	return h;
}

typedef void (*fwd_fn)(float *, const float *, const float *, const float *, long, int, int);
typedef void (*bwd_fn)(float *, float *, float *, const float *, const float *, const float *,
		       long, int, int, int);

/*
 * y = x W^T (+ b) as bf16 and fp32, dx with accumulate 0 and 1, dW and db
 * accumulating onto non-zero values, and dW/db twice for identical bits.
 * fast: the reference is the OpenBLAS path (fp32 sums, far inside the
 * tolerances) where the double loops would take minutes.
 */
static void test_linear(long N, int K, int O, int fast)
{
	fwd_fn fwd = fast ? hp_linear_fwd_blas : hp_linear_fwd_ref;
	bwd_fn bwd = fast ? hp_linear_bwd_blas : hp_linear_bwd_ref;
	size_t nx = (size_t)N * K, ny = (size_t)N * O, nw = (size_t)O * K;
	float *x = vec(nx, 1, 1.0f, 1), *W = vec(nw, 2, 1.0f, 1), *dy = vec(ny, 3, 1.0f, 1);
	float *b = vec(O, 4, 1.0f, 0), *dx0 = vec(nx, 5, 1.0f, 1), *dW0 = vec(nw, 6, 1.0f, 0);
	float *db0 = vec(O, 7, 1.0f, 0);
	float *y = malloc(ny * 4), *yb = malloc(ny * 4), *dx = malloc(nx * 4), *dxa = dup(dx0, nx);
	float *dWs = dup(dW0, nw), *dW = dup(dW0, nw), *db = dup(db0, O);
	int rc;

	fwd(y, x, W, NULL, N, K, O);
	fwd(yb, x, W, b, N, K, O);
	bwd(dx, dWs, NULL, dy, x, W, N, K, O, 0);
	bwd(dxa, dW, db, dy, x, W, N, K, O, 1);

	hp_bf16 *xd = ct_dev(x, nx, 1), *Wd = ct_dev(W, nw, 1), *dyd = ct_dev(dy, ny, 1);
	hp_bf16 *dxd = ct_dev(dx0, nx, 1);
	float *bd = ct_dev(b, O, 0), *dWd = ct_dev(dW0, nw, 0), *dbd = ct_dev(db0, O, 0);
	void *yd = hp_cuda_alloc(ny * 4, &err);

	for (int bias = 0; bias < 2; bias++)
		for (int f32 = 0; f32 < 2; f32++) {
			rc = done(hp_cuda_linear_fwd(yd, f32, xd, Wd, bias ? bd : NULL, N, K, O, &err));
			check(rc, dev_nerr(yd, bias ? yb : y, ny, !f32), f32 ? TOL_F32 : TOL_BF16,
			      "linear fwd N=%ld K=%d O=%d %s%s", N, K, O, f32 ? "fp32" : "bf16", bias ? " +bias" : "");
		}
	rc = done(hp_cuda_linear_bwd_dx(dxd, dyd, Wd, N, K, O, 1, &err));
	check(rc, dev_nerr(dxd, dxa, nx, 1), TOL_BF16, "linear dx += N=%ld K=%d O=%d", N, K, O);
	rc = done(hp_cuda_linear_bwd_dx(dxd, dyd, Wd, N, K, O, 0, &err));
	check(rc, dev_nerr(dxd, dx, nx, 1), TOL_BF16, "linear dx = N=%ld K=%d O=%d", N, K, O);

	rc = done(hp_cuda_linear_bwd_dw(dWd, dbd, dyd, xd, N, K, O, &err));
	check(rc, dev_nerr(dWd, dW, nw, 0), TOL_F32, "linear dW += N=%ld K=%d O=%d", N, K, O);
	check(rc, dev_nerr(dbd, db, O, 0), TOL_F32, "linear db += N=%ld K=%d O=%d", N, K, O);
	/* the same call again from the same start: the same bits */
	void *w1 = dev_bytes(dWd, nw * 4), *b1 = dev_bytes(dbd, O * 4);
	hp_cuda_upload(dWd, dW0, nw * 4, &err);
	hp_cuda_upload(dbd, db0, O * 4, &err);
	rc = done(hp_cuda_linear_bwd_dw(dWd, dbd, dyd, xd, N, K, O, &err));
	void *w2 = dev_bytes(dWd, nw * 4), *b2 = dev_bytes(dbd, O * 4);
	ok(!rc && !memcmp(w1, w2, nw * 4) && !memcmp(b1, b2, O * 4),
	   "linear dW, db deterministic N=%ld K=%d O=%d", N, K, O);

	free(w1); free(w2); free(b1); free(b2);
	hp_cuda_free(xd); hp_cuda_free(Wd); hp_cuda_free(dyd); hp_cuda_free(dxd);
	hp_cuda_free(bd); hp_cuda_free(dWd); hp_cuda_free(dbd); hp_cuda_free(yd);
	free(x); free(W); free(dy); free(b); free(dx0); free(dW0); free(db0);
	free(y); free(yb); free(dx); free(dxa); free(dWs); free(dW); free(db);
}

/* grouped experts vs one reference call per group; empty groups included */
static void test_grouped(int K, int O, const int *counts, int ng)
{
	int32_t off[16];
	float *W[16], *dW0[16], *dW[16];
	hp_bf16 *Wd[16];
	float *dWd[16];
	int rc, empty_ok = 1, same = 1;

	off[0] = 0;
	for (int g = 0; g < ng; g++)
		off[g + 1] = off[g] + counts[g];
	long R = off[ng];
	size_t nx = (size_t)R * K, ny = (size_t)R * O, nw = (size_t)O * K;
	float *x = vec(nx, 11, 1.0f, 1), *dy = vec(ny, 12, 1.0f, 1);
	float *y = malloc(ny * 4), *dx = malloc(nx * 4);
	float *dWall = calloc(ng * nw, 4), *dWref = calloc(ng * nw, 4);

	for (int g = 0; g < ng; g++) {
		long r0 = off[g], rows = counts[g];
		W[g] = vec(nw, 20 + g, 1.0f, 1);
		dW0[g] = vec(nw, 40 + g, 1.0f, 0);
		dW[g] = dup(dW0[g], nw);
		hp_linear_fwd_ref(y + r0 * O, x + r0 * K, W[g], NULL, rows, K, O);
		hp_linear_bwd_ref(dx + r0 * K, dW[g], NULL, dy + r0 * O, x + r0 * K, W[g], rows, K, O, 0);
		memcpy(dWref + g * nw, dW[g], nw * 4);
		Wd[g] = ct_dev(W[g], nw, 1);
		dWd[g] = ct_dev(dW0[g], nw, 0);
	}
	hp_bf16 *xd = ct_dev(x, nx, 1), *dyd = ct_dev(dy, ny, 1);
	hp_bf16 *yd = hp_cuda_alloc(ny * 2, &err), *dxd = hp_cuda_alloc(nx * 2, &err);

	rc = done(hp_cuda_grouped_fwd(yd, xd, (const hp_bf16 *const *)Wd, off, ng, K, O, &err));
	check(rc, dev_nerr(yd, y, ny, 1), TOL_BF16, "grouped fwd %d groups, %ld rows, K=%d O=%d", ng, R, K, O);
	rc = done(hp_cuda_grouped_bwd_dx(dxd, dyd, (const hp_bf16 *const *)Wd, off, ng, K, O, &err));
	check(rc, dev_nerr(dxd, dx, nx, 1), TOL_BF16, "grouped dx %d groups, %ld rows, K=%d O=%d", ng, R, K, O);
	rc = done(hp_cuda_grouped_bwd_dw(dWd, dyd, xd, off, ng, K, O, &err));
	for (int g = 0; g < ng; g++) {
		float *h = ct_host(dWd[g], nw, 0);
		memcpy(dWall + g * nw, h, nw * 4);
		if (!counts[g] && memcmp(h, dW0[g], nw * 4))
			empty_ok = 0;
		free(h);
	}
	check(rc, ct_nerr(dWall, dWref, ng * nw), TOL_F32, "grouped dW += %d groups, %ld rows, K=%d O=%d",
	      ng, R, K, O);
	ok(empty_ok, "grouped dW: empty groups' gradients untouched");
	/* again from the same start: the same bits */
	for (int g = 0; g < ng; g++)
		hp_cuda_upload(dWd[g], dW0[g], nw * 4, &err);
	rc = done(hp_cuda_grouped_bwd_dw(dWd, dyd, xd, off, ng, K, O, &err));
	for (int g = 0; g < ng; g++) {
		void *h = dev_bytes(dWd[g], nw * 4);
		if (memcmp(h, dWall + g * nw, nw * 4))
			same = 0;
		free(h);
	}
	ok(!rc && same, "grouped dW deterministic K=%d O=%d", K, O);

	for (int g = 0; g < ng; g++) {
		hp_cuda_free(Wd[g]); hp_cuda_free(dWd[g]);
		free(W[g]); free(dW0[g]); free(dW[g]);
	}
	hp_cuda_free(xd); hp_cuda_free(dyd); hp_cuda_free(yd); hp_cuda_free(dxd);
	free(x); free(dy); free(y); free(dx); free(dWall); free(dWref);
}

/*
 * Cross-entropy: per-row loss against hp_cross_entropy_fwd on that row
 * alone (fp32 sums against double: ~1e-6 relative), dlogits against
 * hp_cross_entropy_bwd (one bf16 rounding); -100 rows give loss 0 and a
 * zero gradient row, an out-of-range target a NaN loss.
 */
static void test_ce(long n, int V, const int32_t *tg)
{
	size_t nl = (size_t)n * V;
	float *logits = vec(nl, 30, 4.0f, 0), *want = malloc(nl * 4), *lref = calloc(n, 4);
	int32_t *tref = malloc(n * 4);
	float scale = 1.0f / 3;
	int special_ok = 1;

	for (long r = 0; r < n; r++) {
		double ls;
		long cnt;
		/* the reference's backward writes out of bounds on a bad target */
		tref[r] = tg[r] >= 0 && tg[r] < V ? tg[r] : HP_IGNORE_INDEX;
		if (tref[r] != HP_IGNORE_INDEX && hp_cross_entropy_fwd(&ls, &cnt, logits + r * V, tg + r, 1, V) == 0)
			lref[r] = (float)ls;
	}
	hp_cross_entropy_bwd(want, logits, tref, n, V, scale);

	float *ld = ct_dev(logits, nl, 0), *lossd = hp_cuda_alloc(n * 4, &err);
	int32_t *td = ct_dev_i32(tg, n);
	hp_bf16 *dd = hp_cuda_alloc(nl * 2, &err);

	hp_cuda_ce_fwd_bwd(lossd, dd, ld, td, n, V, scale);
	int rc = hp_cuda_sync(&err);
	float *loss = ct_host(lossd, n, 0), *d = ct_host(dd, nl, 1);
	for (long r = 0; r < n; r++) {
		if (tg[r] == HP_IGNORE_INDEX || tref[r] != tg[r]) {
			special_ok &= tg[r] == HP_IGNORE_INDEX ? loss[r] == 0.0f : isnan(loss[r]);
			for (int v = 0; v < V; v++)
				special_ok &= d[r * V + v] == 0.0f;
			loss[r] = 0.0f;   /* out of the nerr below */
		}
	}
	check(rc, ct_nerr(loss, lref, n), 1e-5, "cross-entropy loss n=%ld V=%d", n, V);
	check(rc, ct_nerr(d, want, nl), TOL_BF16, "cross-entropy dlogits n=%ld V=%d", n, V);
	ok(special_ok, "cross-entropy n=%ld V=%d: -100 rows give 0 and zero gradients, bad targets NaN", n, V);

	hp_cuda_free(ld); hp_cuda_free(lossd); hp_cuda_free(td); hp_cuda_free(dd);
	free(logits); free(want); free(lref); free(tref); free(loss); free(d);
}

/* largest |got - want| / |want| over n values (0 where bit-identical) */
static double max_rel(const float *got, const float *want, size_t n, size_t *ndiff)
{
	double m = 0;

	*ndiff = 0;
	for (size_t i = 0; i < n; i++) {
		if (memcmp(got + i, want + i, 4))
			++*ndiff;
		double d = fabs((double)got[i] - want[i]) / fmax(fabs((double)want[i]), 1e-30);
		if (d > m || d != d)
			m = d;   /* a NaN sticks */
	}
	return m;
}

/* AdamW: several steps against hp_adamw_step; the same fp32 arithmetic, so
 * bit-identical is expected and 1e-6 relative is the bar; wb = bf16(w) */
static void test_adamw(size_t n, int decay)
{
	struct hp_adamw_hparams h = { .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1 };
	float *w = vec(n, 50, 0.1f, 0), *m = calloc(n, 4), *v = calloc(n, 4), *g = malloc(n * 4);
	float *wd = ct_dev(w, n, 0), *md = ct_dev(m, n, 0), *vd = ct_dev(v, n, 0);
	float *gd = hp_cuda_alloc(n * 4, &err);
	hp_bf16 *wbd = hp_cuda_alloc(n * 2, &err);
	int rc = 0, wb_ok = 1;
	size_t dw, dm, dv;

	for (h.step = 1; h.step <= 5; h.step++) {
		ct_fill(g, n, 60 + (unsigned)h.step, h.step == 3 ? 1.0f : 0.01f);
		hp_adamw_step(w, g, m, v, n, &h, decay);
		rc |= hp_cuda_upload(gd, g, n * 4, &err);
		hp_cuda_adamw(wd, wbd, gd, md, vd, n, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step, decay);
		rc |= hp_cuda_sync(&err);   /* g is refilled next step */
	}
	float *wg = ct_host(wd, n, 0), *mg = ct_host(md, n, 0), *vg = ct_host(vd, n, 0);
	hp_bf16 *wb = dev_bytes(wbd, n * 2);
	double ew = max_rel(wg, w, n, &dw), em = max_rel(mg, m, n, &dm), ev = max_rel(vg, v, n, &dv);
	for (size_t i = 0; i < n; i++)
		wb_ok &= wb[i] == hp_f32_to_bf16(wg[i]);
	ok(!rc && ew <= 1e-6 && em <= 1e-6 && ev <= 1e-6,
	   "adamw n=%zu decay=%d, 5 steps: max rel err w %.1e m %.1e v %.1e (%zu, %zu, %zu values not bit-identical)",
	   n, decay, ew, em, ev, dw, dm, dv);
	ok(wb_ok, "adamw n=%zu decay=%d: wb == bf16(w) exactly", n, decay);

	hp_cuda_free(wd); hp_cuda_free(md); hp_cuda_free(vd); hp_cuda_free(gd); hp_cuda_free(wbd);
	free(w); free(m); free(v); free(g); free(wg); free(mg); free(vg); free(wb);
}
#endif

int main(void)
{
#ifndef HP_HAVE_CUDA
	tap_skip("built without CUDA (no nvcc)", WHAT);
#else
	static const int c1[] = { 5, 0, 37, 0, 1, 90, 0 }, c2[] = { 0, 300, 17, 0, 129, 64 };
	static const int32_t t1[] = { 0, 49, -100, 7, 50, 23, -100, 1 }, t2[] = { 151935, -100, 0, 77777 };

	if (!ct_start(WHAT))
		return tap_done();
	hp_err_clear(&err);
	if (!getenv("HP_CUDA_EMULATED")) {   /* t/cuemu: no cuBLASLt */
		test_linear(1, 64, 7, 0);
		test_linear(333, 1000, 515, 0);
		test_linear(4096, 2048, 768, 1);
		test_grouped(200, 72, c1, 7);
		test_grouped(768, 512, c2, 6);
	}
	test_ce(8, 50, t1);
	test_ce(4, 151936, t2);
	test_adamw(100003, 0);
	test_adamw(100003, 1);
	hp_cuda_fini();
#endif
	return tap_done();
}
