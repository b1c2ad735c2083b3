/*
 * test-cuda-gemm.c - the CUDA linear layers (kernels/cuda/linear.cu over
 * gemm.cu's cuBLASLt GEMM), cross-entropy, its vocabulary-parallel form and
 * AdamW (ce.cu, adamw.cu) against the CPU kernels of kernels/cpu/ops.h, on
 * awkward shapes (N = 1, odd O, sizes off every tile) and realistic ones,
 * plus bit-for-bit determinism; and the MoE experts' grouped GEMMs
 * (grouped.cu, wmma) against the same CPU reference expert by expert.  The
 * GEMMs' inputs are rounded to bf16 on the host first, so the reference
 * sees what the tensor cores see.  Skips
 * without a CUDA build or a GPU; under t/cuemu (HP_CUDA_EMULATED) a host
 * GEMM stands in for cuBLASLt, so there the linear tests check linear.cu's
 * own code (which GEMM, accumulate, the skipped dx, bias, db), not
 * cuBLASLt; the grouped GEMMs run their own kernels there, over
 * t/cuemu/include/mma.h's wmma (k-order fp32 sums, not the tensor cores').
 */
#include <math.h>

#include "cpu/ops.h"
#include "tap.h"

#define WHAT "cuda linear layers, grouped expert GEMMs, cross-entropy, AdamW and the step gate against the CPU kernels"

#ifdef HP_HAVE_CUDA
#include "cudatest.h"

/* fp32 outputs of the GEMMs: products of bf16 inputs are exact in fp32 and
 * only the fp32 sums round (~1e-6 normalised against the double
 * reference); a layout or accumulate bug gives >= 1e-2 */
#define TOL_GEMM 2e-5
/* the cross-entropy gradient: each element an expf (within 2 ulp of
 * glibc's) times the row's scale / sum, a few ulps from the reference's
 * (~1e-7 normalised); the target's element cancels (p - scale) and may
 * lose a few more bits of its own, which the row's norm absorbs */
#define TOL_CE 1e-5
/* a loss sum (and the vocabulary-parallel exponential sums): terms whose
 * expf differs by at most 2 ulp (2.4e-7 relative), summed in double in
 * another order; the log of a sum shifts by the same 2.4e-7 absolute,
 * against per-row losses of order log(V) > 1 */
#define TOL_LOSS 1e-6

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

/* rc, or the stream's pending error: a bad launch shows in the test line */
static int done(int rc)
{
	return rc ? rc : hp_cuda_sync(&err);
}

/* nerr of device d (n fp32 values) against host want */
static double dev_nerr(const void *d, const float *want, size_t n)
{
	float *got = ct_host(d, n, 0);
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
 * y = x W^T (+ b); the backward three ways: dx overwritten with dW and db
 * accumulating onto non-zero values, dx accumulating without db, and no dx
 * at all; then the first again from the same start for identical bits.
 * fast: the reference is the OpenBLAS path (fp32 sums, far inside the
 * tolerance) where the double loops would take minutes.
 */
static void test_linear(long N, int K, int O, int fast)
{
	fwd_fn fwd = fast ? hp_linear_fwd_blas : hp_linear_fwd_ref;
	bwd_fn bwd = fast ? hp_linear_bwd_blas : hp_linear_bwd_ref;
	size_t nx = (size_t)N * K, ny = (size_t)N * O, nw = (size_t)O * K;
	float *x = vec(nx, 1, 1.0f, 1), *W = vec(nw, 2, 1.0f, 1), *dy = vec(ny, 3, 1.0f, 1);
	float *b = vec(O, 4, 1.0f, 0), *dx0 = vec(nx, 5, 1.0f, 0), *dW0 = vec(nw, 6, 1.0f, 0);
	float *db0 = vec(O, 7, 1.0f, 0);
	float *y = malloc(ny * 4 + 4), *yb = malloc(ny * 4 + 4), *dx = malloc(nx * 4 + 4), *dxa = dup(dx0, nx);
	float *dW = dup(dW0, nw), *db = dup(db0, O), *dWs = dup(dW0, nw);
	int rc;

	fwd(y, x, W, NULL, N, K, O);
	fwd(yb, x, W, b, N, K, O);
	bwd(dx, dW, db, dy, x, W, N, K, O, 0);
	bwd(dxa, dWs, NULL, dy, x, W, N, K, O, 1);

	hp_bf16 *xd = ct_dev(x, nx, 1), *Wd = ct_dev(W, nw, 1), *dyd = ct_dev(dy, ny, 1);
	float *bd = ct_dev(b, O, 0), *yd = ct_dnan(ny, 0), *dxd = ct_dnan(nx, 0);
	float *dWd = ct_dev(dW0, nw, 0), *dbd = ct_dev(db0, O, 0);

	for (int bias = 0; bias < 2; bias++) {
		rc = done(hp_cuda_linear_fwd(yd, xd, Wd, bias ? bd : NULL, N, K, O, &err));
		double e = dev_nerr(yd, bias ? yb : y, ny);
		ok(!rc && e <= TOL_GEMM, "linear fwd N=%ld K=%d O=%d%s: nerr %.2e%s%s", N, K, O, bias ? " +bias" : "", e,
		   rc ? " - " : "", rc ? err.msg : "");
	}

	/* dx = dy W, dW += dy^T x, db += colsum(dy) */
	rc = done(hp_cuda_linear_bwd(dxd, dWd, dbd, dyd, xd, Wd, N, K, O, 0, &err));
	double ex = dev_nerr(dxd, dx, nx), ew = dev_nerr(dWd, dW, nw), eb = dev_nerr(dbd, db, O);
	ok(!rc && ex <= TOL_GEMM && ew <= TOL_GEMM && eb <= TOL_GEMM,
	   "linear bwd N=%ld K=%d O=%d: dx = nerr %.2e, dW += %.2e, db += %.2e", N, K, O, ex, ew, eb);
	void *x1 = dev_bytes(dxd, nx * 4), *w1 = dev_bytes(dWd, nw * 4), *b1 = dev_bytes(dbd, O * 4);

	/* dx += dy W, no db */
	float *dxd2 = ct_dev(dx0, nx, 0), *dWd2 = ct_dev(dW0, nw, 0);
	rc = done(hp_cuda_linear_bwd(dxd2, dWd2, NULL, dyd, xd, Wd, N, K, O, 1, &err));
	ex = dev_nerr(dxd2, dxa, nx);
	ew = dev_nerr(dWd2, dWs, nw);
	ok(!rc && ex <= TOL_GEMM && ew <= TOL_GEMM, "linear bwd N=%ld K=%d O=%d accumulate: dx += nerr %.2e, dW += %.2e",
	   N, K, O, ex, ew);

	/* no dx: dW and db alone, the same as with it */
	hp_cuda_upload(dWd2, dW0, nw * 4, &err);
	float *dbd2 = ct_dev(db0, O, 0);
	rc = done(hp_cuda_linear_bwd(NULL, dWd2, dbd2, dyd, xd, Wd, N, K, O, 0, &err));
	int same = ct_dev_same(dWd, dWd2, nw * 4) && ct_dev_same(dbd, dbd2, O * 4);
	ok(!rc && same, "linear bwd N=%ld K=%d O=%d without dx: dW, db the same bits as with it", N, K, O);

	/* the same call again from the same start: the same bits */
	hp_cuda_upload(dWd, dW0, nw * 4, &err);
	hp_cuda_upload(dbd, db0, O * 4, &err);
	hp_cuda_zero(dxd, nx * 4);
	rc = done(hp_cuda_linear_bwd(dxd, dWd, dbd, dyd, xd, Wd, N, K, O, 0, &err));
	void *x2 = dev_bytes(dxd, nx * 4), *w2 = dev_bytes(dWd, nw * 4), *b2 = dev_bytes(dbd, O * 4);
	ok(!rc && !memcmp(x1, x2, nx * 4) && !memcmp(w1, w2, nw * 4) && !memcmp(b1, b2, O * 4),
	   "linear bwd N=%ld K=%d O=%d: deterministic", N, K, O);

	free(x1); free(x2); free(w1); free(w2); free(b1); free(b2);
	hp_cuda_free(xd); hp_cuda_free(Wd); hp_cuda_free(dyd); hp_cuda_free(bd); hp_cuda_free(yd); hp_cuda_free(dxd);
	hp_cuda_free(dWd); hp_cuda_free(dbd); hp_cuda_free(dxd2); hp_cuda_free(dWd2); hp_cuda_free(dbd2);
	free(x); free(W); free(dy); free(b); free(dx0); free(dW0); free(db0);
	free(y); free(yb); free(dx); free(dxa); free(dW); free(db); free(dWs);
}

/* bits of device fp32 d[0, n) against host want: the number that differ */
static size_t dev_ndiff(const void *d, const float *want, size_t n)
{
	float *got = ct_host(d, n, 0);
	size_t nd = ct_ndiff(got, want, n);

	free(got);
	return nd;
}

/*
 * The grouped experts' GEMMs (grouped.cu) against hp_linear_*_ref (or the
 * OpenBLAS path, fast) expert by expert: nx experts of cnt[x] rows (zeros
 * among them), R rows of which those past off[nx] must stay untouched,
 * weights ws apart and gradients gs apart (more than O*K: padding the
 * kernels must skip; odd pads take the element loads).  y and dx start as
 * NaN or dx0 where the kernels must not write, so a stray write shows;
 * the experts without rows must keep dW0's bits.  Forward twice and the
 * backward twice from the same start: the same bits.  TOL_GEMM as for the
 * linear layers: bf16 products exact in fp32, the fp32 sums in the tensor
 * cores' order (or the host's k order under t/cuemu) against the double
 * reference.
 */
static void test_grouped(int nx, const int *cnt, long R, int K, int O, size_t wpad, int fast)
{
	fwd_fn fwd = fast ? hp_linear_fwd_blas : hp_linear_fwd_ref;
	bwd_fn bwd = fast ? hp_linear_bwd_blas : hp_linear_bwd_ref;
	size_t ws = (size_t)O * K + wpad, gs = (size_t)O * K + 2 * wpad;
	size_t nxk = (size_t)R * K, ny = (size_t)R * O, nw = (size_t)nx * ws, ng = (size_t)nx * gs;
	int32_t *off = malloc((size_t)(nx + 1) * 4);
	long used;
	int rc, empty = 0;

	off[0] = 0;
	for (int e = 0; e < nx; e++) {
		off[e + 1] = off[e] + cnt[e];
		empty += cnt[e] == 0;
	}
	used = off[nx];
	float *x = vec(nxk, 11, 1.0f, 1), *W = vec(nw, 12, 1.0f, 1), *dy = vec(ny, 13, 1.0f, 1);
	float *dx0 = vec(nxk, 14, 1.0f, 0), *dW0 = vec(ng, 15, 1.0f, 0);
	float *y = malloc(ny * 4 + 4), *dx = dup(dx0, nxk), *dxa = dup(dx0, nxk), *dW = dup(dW0, ng), *dWa = dup(dW0, ng);

	for (size_t i = (size_t)used * O; i < ny; i++)
		y[i] = NAN;
	for (int e = 0; e < nx; e++) {
		long r0 = off[e], n = cnt[e];
		if (!n)
			continue;   /* nothing to compute, nothing to add */
		fwd(y + r0 * O, x + r0 * K, W + e * ws, NULL, n, K, O);
		bwd(dx + r0 * K, dW + e * gs, NULL, dy + r0 * O, x + r0 * K, W + e * ws, n, K, O, 0);
		bwd(dxa + r0 * K, dWa + e * gs, NULL, dy + r0 * O, x + r0 * K, W + e * ws, n, K, O, 1);
	}

	hp_bf16 *xd = ct_dev(x, nxk, 1), *Wd = ct_dev(W, nw, 1), *dyd = ct_dev(dy, ny, 1);
	int32_t *offd = ct_dev_i32(off, (size_t)nx + 1);
	float *yd = ct_dnan(ny, 0), *yd2 = ct_dnan(ny, 0);

	/* y = x W^T per expert; the rows past off[nx] stay NaN (the ndiff of the whole) */
	rc = done(hp_cuda_grouped_fwd(yd, xd, Wd, ws, offd, nx, R, K, O, &err));
	rc |= done(hp_cuda_grouped_fwd(yd2, xd, Wd, ws, offd, nx, R, K, O, &err));
	float *gy = ct_host(yd, ny, 0);
	double e = ct_nerr(gy, y, (size_t)used * O);
	size_t tail = ct_ndiff(gy + used * O, y + used * O, ny - (size_t)used * O);
	int det = ct_dev_same(yd, yd2, ny * 4);
	ok(!rc && e <= TOL_GEMM && tail == 0 && det, "grouped fwd nx=%d (%d without rows) R=%ld (%ld used) K=%d O=%d: "
	   "nerr %.2e, %zu values past the experts' rows written, deterministic: %s%s%s", nx, empty, R, used, K,
	   O, e, tail, det ? "yes" : "no", rc ? " - " : "", rc ? err.msg : "");

	/* dx = dy W, dW += dy^T x; twice from the same start */
	float *dxd = ct_dev(dx0, nxk, 0), *dWd = ct_dev(dW0, ng, 0), *dxd2 = ct_dev(dx0, nxk, 0);
	float *dWd2 = ct_dev(dW0, ng, 0);
	rc = done(hp_cuda_grouped_bwd(dxd, dWd, gs, dyd, xd, Wd, ws, offd, nx, R, K, O, 0, &err));
	rc |= done(hp_cuda_grouped_bwd(dxd2, dWd2, gs, dyd, xd, Wd, ws, offd, nx, R, K, O, 0, &err));
	double ex = dev_nerr(dxd, dx, (size_t)used * K), ew = dev_nerr(dWd, dW, ng);
	size_t xt = dev_ndiff(dxd, dx, nxk) - dev_ndiff(dxd, dx, (size_t)used * K), wz = 0;
	float *gw = ct_host(dWd, ng, 0);
	for (int xe = 0; xe < nx; xe++)
		if (!cnt[xe])
			wz += ct_ndiff(gw + xe * gs, dW0 + xe * gs, (size_t)O * K);
	det = ct_dev_same(dxd, dxd2, nxk * 4) && ct_dev_same(dWd, dWd2, ng * 4);
	ok(!rc && ex <= TOL_GEMM && ew <= TOL_GEMM && xt == 0 && wz == 0 && det,
	   "grouped bwd nx=%d R=%ld K=%d O=%d: dx = nerr %.2e, dW += %.2e; untouched: %zu dx past the experts, %zu dW "
	   "of experts without rows changed; deterministic: %s", nx, R, K, O, ex, ew, xt, wz, det ? "yes" : "no");

	/* dx += dy W */
	hp_cuda_upload(dWd2, dW0, ng * 4, &err);
	hp_cuda_upload(dxd2, dx0, nxk * 4, &err);
	rc = done(hp_cuda_grouped_bwd(dxd2, dWd2, gs, dyd, xd, Wd, ws, offd, nx, R, K, O, 1, &err));
	ex = dev_nerr(dxd2, dxa, (size_t)used * K);
	xt = dev_ndiff(dxd2, dxa, nxk) - dev_ndiff(dxd2, dxa, (size_t)used * K);
	ok(!rc && ex <= TOL_GEMM && xt == 0 && ct_dev_same(dWd, dWd2, ng * 4),
	   "grouped bwd nx=%d R=%ld K=%d O=%d accumulate: dx += nerr %.2e, dW the same bits", nx, R, K, O, ex);

	/* no dx: dW alone, the same bits as with it */
	hp_cuda_upload(dWd2, dW0, ng * 4, &err);
	rc = done(hp_cuda_grouped_bwd(NULL, dWd2, gs, dyd, xd, Wd, ws, offd, nx, R, K, O, 0, &err));
	ok(!rc && ct_dev_same(dWd, dWd2, ng * 4), "grouped bwd nx=%d R=%ld K=%d O=%d without dx: dW the same bits",
	   nx, R, K, O);

	hp_cuda_free(xd); hp_cuda_free(Wd); hp_cuda_free(dyd); hp_cuda_free(offd); hp_cuda_free(yd);
	hp_cuda_free(yd2); hp_cuda_free(dxd); hp_cuda_free(dWd); hp_cuda_free(dxd2); hp_cuda_free(dWd2);
	free(off); free(x); free(W); free(dy); free(dx0); free(dW0); free(y); free(dx); free(dxa); free(dW);
	free(dWa); free(gy); free(gw);
}

/* the empty sums: K = 0 makes y = 0 on the experts' rows, O = 0 makes dx =
 * 0 there (or leaves it, accumulating) and dW untouched, as the linear
 * layers do; rows past off[nx] keep their bits */
static void test_grouped_empty(void)
{
	static const int32_t off[] = { 0, 3, 3, 5 };
	long R = 7;
	int K = 5, O = 4, rc;
	float *y0 = vec((size_t)R * O, 16, 1.0f, 0), *dx0 = vec((size_t)R * K, 17, 1.0f, 0), *w = dup(y0, (size_t)R * O);
	float *wx = dup(dx0, (size_t)R * K), *wx1 = dup(dx0, (size_t)R * K);
	int32_t *offd = ct_dev_i32(off, 4);
	float *yd = ct_dev(y0, (size_t)R * O, 0), *dxd = ct_dev(dx0, (size_t)R * K, 0), *dWd = ct_dnan(3, 0);
	hp_bf16 *bd = ct_dev(y0, (size_t)R * O, 1);

	for (long i = 0; i < 5 * O; i++)
		w[i] = 0;
	for (long i = 0; i < 5 * K; i++)
		wx[i] = 0;
	rc = done(hp_cuda_grouped_fwd(yd, bd, bd, 0, offd, 3, R, 0, O, &err));
	float *gy = ct_host(yd, (size_t)R * O, 0);
	rc |= done(hp_cuda_grouped_bwd(dxd, dWd, 0, bd, bd, bd, 0, offd, 3, R, K, 0, 1, &err));
	float *gx1 = ct_host(dxd, (size_t)R * K, 0);
	rc |= done(hp_cuda_grouped_bwd(dxd, dWd, 0, bd, bd, bd, 0, offd, 3, R, K, 0, 0, &err));
	float *gx = ct_host(dxd, (size_t)R * K, 0), *gw = ct_host(dWd, 3, 0);
	ok(!rc && ct_ndiff(gy, w, (size_t)R * O) == 0 && ct_ndiff(gx1, wx1, (size_t)R * K) == 0 &&
	   ct_ndiff(gx, wx, (size_t)R * K) == 0 && isnan(gw[0]) && isnan(gw[2]),
	   "grouped K=0: y = 0 on the experts' rows; O=0: dx kept accumulating, else 0 there; dW untouched");
	hp_cuda_free(offd); hp_cuda_free(yd); hp_cuda_free(dxd); hp_cuda_free(dWd); hp_cuda_free(bd);
	free(y0); free(dx0); free(w); free(wx); free(wx1); free(gy); free(gx1); free(gx); free(gw);
}

/* logits [n, V] of amplitude 4: a softmax far from flat */
static float *logits_of(long n, int V, unsigned seed)
{
	return vec((size_t)n * V, seed, 4.0f, 0);
}

/* |got - want| / |want| (0 / 0 = 0) */
static double rel(double got, double want)
{
	return got == want ? 0 : fabs(got - want) / fmax(fabs(want), 1e-300);
}

/*
 * Cross-entropy: the loss sum against hp_cross_entropy_fwd, the gradient
 * against the reference hp_cross_entropy_bwd, out of place and in place
 * (the same bits), zero rows for -100.
 */
static void test_ce(long n, int V, const int32_t *tg)
{
	size_t nl = (size_t)n * V;
	float *logits = logits_of(n, V, 30), *want = malloc(nl * 4 + 4);
	float scale = 1.0f / 3;
	double lref = 0, lgot = -1;
	long cnt;
	int zero = 1;

	hp_cross_entropy_fwd(&lref, &cnt, logits, tg, n, V);
	hp_cross_entropy_bwd(want, logits, tg, n, V, scale);

	float *ld = ct_dev(logits, nl, 0), *dd = ct_dnan(nl, 0);
	int32_t *td = ct_dev_i32(tg, n);

	/* onto a device accumulator from 0, then again onto the same: exactly double */
	double d0 = 0, l2 = -1, *dacc = ct_dev_f64(&d0, 1);
	int rc = hp_cuda_ce_loss(dacc, ld, td, n, V, &err) || hp_cuda_sync(&err);
	hp_cuda_download(&lgot, dacc, sizeof(double), &err);
	rc |= hp_cuda_ce_loss(dacc, ld, td, n, V, &err) || hp_cuda_sync(&err);
	hp_cuda_download(&l2, dacc, sizeof(double), &err);
	hp_cuda_free(dacc);
	ok(!rc && rel(lgot, lref) <= TOL_LOSS && l2 == 2 * lgot, "cross-entropy loss n=%ld V=%d (%ld counted): %.9g, "
	   "relative error %.2e, added onto the accumulator: %s", n, V, cnt, lgot, rel(lgot, lref),
	   l2 == 2 * lgot ? "yes" : "no");

	hp_cuda_ce_bwd(dd, ld, td, n, V, scale);
	hp_cuda_ce_bwd(ld, ld, td, n, V, scale);    /* in place */
	rc = hp_cuda_sync(&err);
	float *d = ct_host(dd, nl, 0);
	double e = ct_nerr(d, want, nl);
	int inplace = ct_dev_same(dd, ld, nl * 4);
	for (long r = 0; r < n; r++)
		for (int v = 0; tg[r] == HP_IGNORE_INDEX && v < V; v++)
			zero &= d[r * V + v] == 0.0f;
	ok(!rc && e <= TOL_CE && inplace && zero, "cross-entropy dlogits n=%ld V=%d: nerr %.2e, in place the same bits: "
	   "%s, -100 rows zero: %s", n, V, e, inplace ? "yes" : "no", zero ? "yes" : "no");

	hp_cuda_free(ld); hp_cuda_free(td); hp_cuda_free(dd);
	free(logits); free(want); free(d);
}

/* rows [n, V] -> columns [c0, c0 + w) as their own [n, w] array */
static float *cols(const float *x, long n, int V, int c0, int w)
{
	float *y = malloc((size_t)n * w * 4 + 4);

	for (long r = 0; r < n; r++)
		memcpy(y + r * w, x + r * V + c0, (size_t)w * 4);
	return y;
}

/*
 * Vocabulary-parallel cross-entropy over two slices [0, V1), [V1, V) of one
 * device, the reductions between the passes done with hp_cuda_max and
 * hp_cuda_add_f64 as the backend's collectives would: each pass against
 * hp_vp_ce_* on the host, and the loss against the whole rows'.
 */
static void test_vp_ce(long n, int V, int V1, const int32_t *tg)
{
	int w[2] = { V1, V - V1 }, v0[2] = { 0, V1 };
	float *logits = logits_of(n, V, 31), *l[2], *mx = malloc(n * 4 + 4), *mx1 = malloc(n * 4 + 4);
	double *st = malloc(n * 16 + 8), *st1 = malloc(n * 16 + 8), lwhole, lsum;
	float scale = 0.25f, *dl[2], *dd[2], *ld[2];
	long cnt, cnt2;
	int32_t *td = ct_dev_i32(tg, n);
	float *dmx = ct_dnan(n, 0), *dmx1 = ct_dnan(n, 0);
	double *dst = ct_alloc(n * 16 + 8), *dst1 = ct_alloc(n * 16 + 8);

	for (int s = 0; s < 2; s++) {
		l[s] = cols(logits, n, V, v0[s], w[s]);
		ld[s] = ct_dev(l[s], (size_t)n * w[s], 0);
	}
	/* the maxima: per slice, then the max of the two (bit for bit) */
	hp_vp_ce_max(mx, l[0], n, w[0]);
	hp_vp_ce_max(mx1, l[1], n, w[1]);
	hp_max_into(mx, mx1, n);
	hp_cuda_vp_ce_max(dmx, ld[0], n, w[0]);
	hp_cuda_vp_ce_max(dmx1, ld[1], n, w[1]);
	hp_cuda_max(dmx, dmx1, n);
	int rc = hp_cuda_sync(&err);
	float *gmx = ct_host(dmx, n, 0);
	ok(!rc && ct_ndiff(gmx, mx, n) == 0, "vp_ce_max n=%ld V=%d split at %d, max of the slices: the CPU's bits",
	   n, V, V1);

	/* the sums from the same maxima, then their sum */
	hp_vp_ce_sums(st, l[0], mx, tg, n, w[0], v0[0]);
	hp_vp_ce_sums(st1, l[1], mx, tg, n, w[1], v0[1]);
	hp_add_into_f64(st, st1, 2 * n);
	hp_cuda_vp_ce_sums(dst, ld[0], dmx, td, n, w[0], v0[0]);
	hp_cuda_vp_ce_sums(dst1, ld[1], dmx, td, n, w[1], v0[1]);
	hp_cuda_add_f64(dst, dst1, 2 * (size_t)n);
	rc = hp_cuda_sync(&err);
	double *gst = ct_host_f64(dst, 2 * (size_t)n), es = 0;
	int tgt_exact = 1;
	for (long r = 0; r < n; r++) {
		es = fmax(es, rel(gst[2 * r], st[2 * r]));
		tgt_exact &= gst[2 * r + 1] == st[2 * r + 1];
	}
	ok(!rc && es <= TOL_LOSS && tgt_exact, "vp_ce_sums n=%ld V=%d: exp sums max relative error %.2e, target logits "
	   "exact: %s", n, V, es, tgt_exact ? "yes" : "no");

	/* the loss from the device's statistics, against the whole rows' */
	hp_cross_entropy_fwd(&lwhole, &cnt, logits, tg, n, V);
	hp_vp_ce_loss(&lsum, &cnt2, gst, gmx, tg, n, V);
	ok(cnt == cnt2 && rel(lsum, lwhole) <= TOL_LOSS, "vp_ce loss n=%ld V=%d: relative error %.2e against the "
	   "gathered rows'", n, V, rel(lsum, lwhole));
	/* the same on the device, added onto a device double holding 0.5 */
	double *dacc = ct_alloc(16), half = 0.5, gacc = 0;
	hp_cuda_upload(dacc, &half, 8, &err);
	rc = hp_cuda_vp_ce_loss(dacc, dst, dmx, td, n, &err) || hp_cuda_sync(&err);
	hp_cuda_download(&gacc, dacc, 8, &err);
	ok(!rc && rel(gacc - 0.5, lsum) <= 1e-15, "vp_ce_loss on the device n=%ld V=%d: relative error %.2e against "
	   "hp_vp_ce_loss on the same statistics", n, V, rel(gacc - 0.5, lsum));
	hp_cuda_free(dacc);

	/* the gradient, slice by slice, from the CPU's statistics */
	double e = 0;
	hp_cuda_upload(dst, st, n * 16, &err);
	for (int s = 0; s < 2; s++) {
		size_t ns = (size_t)n * w[s];
		dl[s] = malloc(ns * 4 + 4);
		hp_vp_ce_bwd(dl[s], l[s], st, mx, tg, n, w[s], v0[s], scale);
		dd[s] = ct_dnan(ns, 0);
		hp_cuda_vp_ce_bwd(dd[s], ld[s], dst, dmx, td, n, w[s], v0[s], scale);
		float *g = ct_host(dd[s], ns, 0);
		e = fmax(e, ct_nerr(g, dl[s], ns));
		free(g);
	}
	rc = hp_cuda_sync(&err);
	ok(!rc && e <= TOL_CE, "vp_ce_bwd n=%ld V=%d, both slices: nerr %.2e", n, V, e);

	for (int s = 0; s < 2; s++) {
		hp_cuda_free(ld[s]);
		hp_cuda_free(dd[s]);
		free(l[s]);
		free(dl[s]);
	}
	hp_cuda_free(td); hp_cuda_free(dmx); hp_cuda_free(dmx1); hp_cuda_free(dst); hp_cuda_free(dst1);
	free(logits); free(mx); free(mx1); free(st); free(st1); free(gmx); free(gst);
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
 * bit-identical is expected and 1e-6 relative is the bar; wb = bf16(w),
 * or no working copy at all (wb NULL) */
static void test_adamw(size_t n, int decay, int with_wb)
{
	struct hp_adamw_hparams h = { .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1 };
	float *w = vec(n, 50, 0.1f, 0), *m = calloc(n, 4), *v = calloc(n, 4), *g = malloc(n * 4);
	float *wd = ct_dev(w, n, 0), *md = ct_dev(m, n, 0), *vd = ct_dev(v, n, 0);
	float *gd = ct_alloc(n * 4);
	hp_bf16 *wbd = with_wb ? ct_alloc(n * 2) : NULL;
	int rc = 0, wb_ok = 1;
	size_t dw, dm, dv;

	for (h.step = 1; h.step <= 5; h.step++) {
		ct_fill(g, n, 60 + (unsigned)h.step, h.step == 3 ? 1.0f : 0.01f);
		hp_adamw_step(w, g, m, v, n, &h, decay);
		rc |= hp_cuda_upload(gd, g, n * 4, &err);
		hp_cuda_adamw(wd, wbd, gd, md, vd, n, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step, decay,
			      NULL);
		rc |= hp_cuda_sync(&err);   /* g is refilled next step */
	}
	float *wg = ct_host(wd, n, 0), *mg = ct_host(md, n, 0), *vg = ct_host(vd, n, 0);
	double ew = max_rel(wg, w, n, &dw), em = max_rel(mg, m, n, &dm), ev = max_rel(vg, v, n, &dv);
	if (with_wb) {
		hp_bf16 *wb = dev_bytes(wbd, n * 2);
		for (size_t i = 0; i < n; i++)
			wb_ok &= wb[i] == hp_f32_to_bf16(wg[i]);
		free(wb);
	}
	ok(!rc && ew <= 1e-6 && em <= 1e-6 && ev <= 1e-6 && wb_ok,
	   "adamw n=%zu decay=%d %s, 5 steps: max rel err w %.1e m %.1e v %.1e (%zu, %zu, %zu values not "
	   "bit-identical)%s", n, decay, with_wb ? "wb" : "no wb", ew, em, ev, dw, dm, dv,
	   with_wb ? (wb_ok ? ", wb == bf16(w) exactly" : ", wb != bf16(w)") : "");

	hp_cuda_free(wd); hp_cuda_free(md); hp_cuda_free(vd); hp_cuda_free(gd); hp_cuda_free(wbd);
	free(w); free(m); free(v); free(g); free(wg); free(mg); free(vg);
}

/*
 * The step's gate on the device: hp_cuda_clip_gate's factor and gate from
 * device sums against hp_clip_gate's (bit for bit: the same correctly
 * rounded double arithmetic), the gradients it scales, then a gated
 * hp_cuda_adamw: a gate of 0 leaves the weights and moments untouched.
 */
static void test_clip_gate(double ss, double loss, double aux, int32_t bad, double max_norm, int check)
{
	double sums[3] = { ss, loss, aux }, *sd = hp_cuda_alloc(sizeof(sums), &err);
	int32_t *bd = hp_cuda_alloc(sizeof(bad), &err);
	float want[2], got[2] = { -1, -1 }, *cgd = hp_cuda_alloc(sizeof(got), &err);
	size_t n = 1000;
	float *x = vec(n, 71, 1.0f, 0), *xd = ct_dev(x, n, 0), *m0 = vec(n, 72, 0.1f, 0), *md = ct_dev(m0, n, 0);
	float *v0 = calloc(n, 4), *vd = ct_dev(v0, n, 0), *wd = ct_dev(x, n, 0);
	int rc = hp_cuda_upload(sd, sums, sizeof(sums), &err) | hp_cuda_upload(bd, &bad, sizeof(bad), &err);

	hp_clip_gate(want, &sums[0], &sums[1], &sums[2], &bad, max_norm, check);
	hp_cuda_clip_gate(xd, n, cgd, sd, sd + 1, sd + 2, bd, max_norm, check);
	rc |= hp_cuda_download(got, cgd, sizeof(got), &err);
	hp_cuda_adamw(wd, NULL, xd, md, vd, n, 1e-3, 0.9, 0.999, 1e-8, 0.1, 1, 1, cgd);
	float *xs = ct_host(xd, n, 0), *ws = ct_host(wd, n, 0), *ms = ct_host(md, n, 0);
	int scaled = 1, kept = 1;
	for (size_t i = 0; i < n; i++) {
		float e = want[0] == 1.0f ? x[i] : x[i] * want[0];
		scaled &= memcmp(&xs[i], &e, 4) == 0;
		kept &= ws[i] == x[i] && ms[i] == m0[i];
	}
	ok(!rc && !memcmp(got, want, sizeof(got)) && scaled && (want[1] == 0.0f) == kept,
	   "clip_gate ss=%g loss=%g aux=%g bad=%d max_norm=%g check=%d: factor %.9g gate %g (want %.9g %g), "
	   "gradients %s, update %s", ss, loss, aux, bad, max_norm, check, got[0], got[1], want[0], want[1],
	   scaled ? "scaled as the host" : "differ", kept ? "skipped" : "applied");
	hp_cuda_free(sd); hp_cuda_free(bd); hp_cuda_free(cgd); hp_cuda_free(xd); hp_cuda_free(md);
	hp_cuda_free(vd); hp_cuda_free(wd);
	free(x); free(m0); free(v0); free(xs); free(ws); free(ms);
}
#endif

int main(void)
{
#ifndef HP_HAVE_CUDA
	tap_skip("built without CUDA (no nvcc)", WHAT);
#else
	static const int32_t t1[] = { 0, 49, -100, 7, 23, 50 - 1, -100, 1 }, t2[] = { 151935, -100, 0, 77777 };
	static const int32_t t3[] = { 3, 40, -100, 41, 99, 0, 57, -100, 12, 64, 65, 1 };

	/* cuBLASLt is opened when a CUDA backend starts: every function the
	 * GEMM calls must resolve, GPU or not */
	hp_err_clear(&err);
	if (ct_emulated())
		tap_skip("t/cuemu: a host GEMM stands in for cuBLASLt", "cuBLASLt opened at run time");
	else if (hp_cu_lt_open(&err))
		tap_ok(0, "cuBLASLt opened at run time: %s", err.msg);
	else
		tap_ok(1, "cuBLASLt opened at run time, every function resolved");
	if (!ct_start(WHAT))
		return tap_done();
	hp_err_clear(&err);
	test_linear(1, 64, 7, 0);
	test_linear(77, 200, 131, 0);
	if (!ct_small()) {
		test_linear(333, 1000, 515, 0);
		test_linear(4096, 2048, 768, 1);
	}
	{
		static const int c1[] = { 5, 0, 17, 1 }, c2[] = { 70, 0, 130 }, c3[] = { 64 };
		static const int c4[] = { 0, 0, 1, 2, 33, 0, 64, 65, 3, 0 };
		test_grouped(4, c1, 30, 40, 24, 0, 0);     /* 7 rows past the experts; 16-byte loads */
		test_grouped(4, c1, 23, 37, 19, 3, 0);     /* odd dims and pads: element loads */
		test_grouped(3, c2, 211, 100, 70, 8, 0);   /* several row tiles, partial ones */
		test_grouped(1, c3, 64, 16, 16, 0, 0);     /* one whole tile */
		test_grouped(10, c4, 200, 33, 65, 1, 0);   /* many small experts, every other empty */
		test_grouped_empty();
		if (!ct_small()) {
			static const int c5[] = { 300, 0, 1, 511, 700, 64, 129, 343 };
			test_grouped(8, c5, 2100, 1024, 768, 0, 1);
			test_grouped(8, c5, 2048, 700, 333, 5, 1);
		}
	}
	test_ce(8, 50, t1);
	test_ce(4, 151936, t2);
	test_vp_ce(12, 100, 41, t3);
	test_vp_ce(4, 151936, 75968, t2);
	test_adamw(100003, 0, 1);
	test_adamw(100003, 1, 1);
	test_adamw(4099, 1, 0);
	test_clip_gate(25.0, 3.0, 0.5, 0, 1.0, 1);      /* norm 5: clipped by 1/(5 + 1e-6) */
	test_clip_gate(0.25, 3.0, 0.5, 0, 1.0, 1);      /* norm 0.5: not clipped */
	test_clip_gate(25.0, 3.0, 0.5, 0, 0.0, 1);      /* max_grad_norm 0: no clipping */
	test_clip_gate(25.0, NAN, 0.5, 0, 1.0, 1);      /* a NaN loss: gated off */
	test_clip_gate(25.0, NAN, 0.5, 0, 1.0, 0);      /* ... unless check_nan_inf is off */
	test_clip_gate(INFINITY, 3.0, 0.5, 0, 1.0, 1);  /* an infinite norm: gated off */
	test_clip_gate(NAN, 3.0, 0.5, 0, 1.0, 0);       /* a NaN norm, unchecked: NaN scales, as torch's */
	test_clip_gate(25.0, 3.0, 0.5, 2, 1.0, 0);      /* the router out of range: gated off always */
	hp_cuda_fini();
#endif
	return tap_done();
}
