/*
 * test-cuda.c - the CUDA kernels' memory calls, element-wise ops, RMSNorm,
 * RoPE, SwiGLU, embedding, MoE routing, GPT-OSS's and Qwen3-Next's kernels
 * (kernels/cuda/context.cu, elementwise.cu, moe.cu, oss.cu, gdn.cu) against
 * the CPU: the kernels of kernels/cpu
 * (ops.h) that the CPU backend runs for the same op - rows.c's bookkeeping,
 * router.c, rmsnorm.c, rope.c, swiglu.c, embedding.c - called with the same
 * arguments.  Not tested here: the GEMMs, cross-entropy and AdamW
 * (test-cuda-gemm.c) and attention (test-cuda-attn.c).
 *
 * Every activation is fp32 now, so the inputs are not rounded to bf16 but
 * where the GPU reads bf16 (add_bf16).  Sizes: single rows and single
 * columns, widths that are no multiple of 32 or 256 (1000, 1001, 4100),
 * rows wider than the column sums' first scratch (9000), realistic shapes
 * (N=4096 x C=2048, 32 heads of 128, E=128 k=8) and small routers (E=8
 * k=2, k=E) with tied logits; DeepSeek-V3's grouped router (one group,
 * every group kept, more groups than a warp's lanes, both masks, negative
 * biases); routing tables (moe.cu's, against
 * hp_moe_route) with experts left without rows, choices outside [0, E),
 * nothing routed, E = 512 and an E too wide for the one-block table's
 * shared counts, and the load-balancing loss's sums over two layers.
 * Every output the GPU overwrites starts as NaN (or -7 for integers), so
 * an element left unwritten fails.  Every op that reduces runs twice from
 * the same state and must give the same bits.
 *
 * Verdicts, by how the GPU's arithmetic relates to the CPU's:
 *  - the same fp32 operations in the same order (conversions, adds, bias,
 *    maxima, the embedding and its backward, RoPE, the MoE combine and
 *    scatter-add in the tok_rows order, the combine backward's dye, row
 *    gathers and scatters, the doubles' add; the routing table, integers,
 *    and the aux loss's double sums, in the CPU's order): the same bits,
 *    required;
 *  - TOL_F32 1e-5 for fp32 outputs of fp32 arithmetic on identical inputs
 *    whose sums run in another order (fp32 sums over N rows, the CPU's
 *    row by row against the GPU's partials: both about sqrt(N) u from the
 *    exact sum, 1.2e-6 normalised at N = 4096 with these inputs and 6.9e-6
 *    at the per-head norms' 131072 rows, measured under t/cuemu, which
 *    runs the GPU's own additions in its own order; double
 *    dot products rounded once: ~1e-8) or through another expf (the GPU's
 *    is within 2 ulp of glibc's, swiglu.c's vector exp within a few);
 *  - TOL_PROB 2e-6 for the router's probabilities: the GPU's expf is within
 *    2 ulp (2.4e-7 relative) of glibc's, the sum is in double on both;
 *  - TOL_DOT 2.4e-7 (4 u) for a double dot product of fp32 values rounded
 *    to fp32 once (the combine backward's dwsel): the products are exact in
 *    double, so the two orders of the double sum differ far below an fp32
 *    ulp and the fp32 results by at most one rounding step.
 * Measured values are printed with each verdict.
 */
#include <math.h>

#include "cpu/ops.h"
#include "config/hfconfig.h"
#include "tap.h"

#ifdef HP_HAVE_CUDA
#include "cudatest.h"

#define TOL_F32 1e-5
#define TOL_PROB 2e-6
#define TOL_DOT 2.4e-7

static struct hp_err err;

/* n floats in [-a, a), rounded to bf16 when rnd */
static float *hfill(size_t n, unsigned seed, float a, int rnd)
{
	return ct_hfill(n, seed, a, rnd);
}

static float *hcopy(const float *x, size_t n)
{
	float *y = malloc(n * sizeof(float) + 4);

	memcpy(y, x, n * sizeof(float));
	return y;
}

/* synchronise and report a pending CUDA error; 1 when there is none */
static int gpu_ok(void)
{
	if (hp_cuda_sync(&err)) {
		tap_diag("cuda: %s", err.msg);
		return 0;
	}
	return 1;
}

/* n ids in [0, V) */
static int32_t *hids(size_t n, unsigned seed, int V)
{
	int32_t *id = malloc(n * sizeof(int32_t) + 4);
	float *r = hfill(n, seed, 1.0f, 0);

	for (size_t i = 0; i < n; i++) {
		id[i] = (int32_t)((r[i] + 1.0f) * 0.5f * V);
		if (id[i] >= V)
			id[i] = V - 1;
		if (id[i] < 0)
			id[i] = 0;
	}
	free(r);
	return id;
}

/* "yes"/"no" */
static const char *yesno(int b)
{
	return b ? "yes" : "no";
}

/* ---- device, stream, memory ---- */

static void test_memory(size_t n)
{
	size_t bytes = n * sizeof(float);
	float *x = hfill(n, 31, 5.0f, 0), *want = malloc(bytes + 4), *z = calloc(n + 1, sizeof(float));
	float *d = ct_alloc(bytes + 64);
	size_t fb = 0, tb = 0;

	/* fresh memory is zeroed */
	float *got = ct_host(d, n, 0);
	ok(gpu_ok() && !memcmp(got, z, bytes), "alloc n=%zu: zeroed", n);
	free(got);

	/* upload, download */
	hp_cuda_upload(d, x, bytes, &err);
	got = ct_host(d, n, 0);
	ok(gpu_ok() && !memcmp(got, x, bytes), "upload, download n=%zu: the same bytes", n);
	free(got);

	/* copy onto itself shifted down, then up (the areas overlap): memmove's result */
	size_t sh = n / 2, k = sh / 2 + 1;
	memcpy(want, x, bytes);
	if (k + sh <= n) {
		memmove(want, want + k, sh * sizeof(float));
		memmove(want + k, want, sh * sizeof(float));
		hp_cuda_copy(d, d + k, sh * sizeof(float));
		hp_cuda_copy(d + k, d, sh * sizeof(float));
	}
	got = ct_host(d, n, 0);
	ok(gpu_ok() && !memcmp(got, want, bytes), "copy %zu floats by %zu both ways: overlapping areas as memmove",
	   sh, k);
	free(got);

	/* zero a middle span */
	memset(want + n / 4, 0, (n / 2) * sizeof(float));
	hp_cuda_zero(d + n / 4, (n / 2) * sizeof(float));
	got = ct_host(d, n, 0);
	ok(gpu_ok() && !memcmp(got, want, bytes), "zero n=%zu: exactly the span", n / 2);
	free(got);

	int rc = hp_cuda_mem_info(&fb, &tb, &err);
	ok(rc == 0 && tb > 0 && fb <= tb && hp_cuda_check(&err) == 0 && hp_cuda_stream() != NULL,
	   "mem_info: %.1f of %.1f GiB free; check 0, a stream", fb / 1073741824.0, tb / 1073741824.0);

	hp_cuda_free(d);
	free(x);
	free(want);
	free(z);
}

#ifndef HP_CUDA_EMULATED
/* Virtual memory (vmem.cu, the driver's cuMem* API, which t/cuemu does not
 * emulate; the backend's host emulation of it, lib/backend/cuda_emu.c,
 * runs under every t0931 layout): a reserved range, granules mapped
 * zeroed, written, one unmapped and mapped again (zero again, its
 * neighbour kept). */
static void test_vm(void)
{
	size_t G = 0, n;
	char *base = hp_cuda_vm_reserve(5 << 20, &G, &err);
	float *x, *got, *z;

	ok(base && G >= 4096 && (G & (G - 1)) == 0, "vm_reserve 5 MiB: a range, granule %zu KiB", G >> 10);
	if (!base)
		return;
	n = G / sizeof(float);
	x = hfill(2 * n, 7, 3.0f, 0);
	z = calloc(n, sizeof(float));
	ok(hp_cuda_vm_map(base, 2 * G, &err) == 0, "vm_map two granules");
	got = ct_host(base, 2 * n, 0);
	ok(gpu_ok() && !memcmp(got, z, G) && !memcmp(got + n, z, G), "mapped memory is zero");
	free(got);
	hp_cuda_upload(base, x, 2 * G, &err);
	hp_cuda_vm_unmap(base, G);
	ok(hp_cuda_vm_map(base, G, &err) == 0, "the first unmapped, mapped again");
	got = ct_host(base, 2 * n, 0);
	ok(gpu_ok() && !memcmp(got, z, G) && !memcmp(got + n, x + n, G),
	   "it is zero again, the second granule keeps its bytes");
	free(got);
	hp_cuda_vm_unmap(base, 2 * G);
	hp_cuda_vm_free(base, 5 << 20);
	ok(gpu_ok(), "unmapped and freed, no error");
	free(x);
	free(z);
}
#endif

/* copy2d: rows of width bytes between pitched buffers, the rest untouched;
 * as the backend takes lse [B, Hq, Tq] out of [B, Hq, L] and puts it back */
static void test_copy2d(size_t rows, size_t L, size_t Tq)
{
	size_t q0 = L - Tq, nb = rows * L, ns = rows * Tq;
	float *big = hfill(nb, 32, 3.0f, 0), *small = hfill(ns, 33, 3.0f, 0);
	float *wbig = hcopy(big, nb), *wsmall = malloc(ns * 4 + 4);
	float *db = ct_dev(big, nb, 0), *ds = ct_dev(small, ns, 0), *dsn = ct_dnan(ns, 0);

	for (size_t r = 0; r < rows; r++) {
		memcpy(wsmall + r * Tq, big + r * L + q0, Tq * 4);
		memcpy(wbig + r * L + q0, small + r * Tq, Tq * 4);
	}
	hp_cuda_copy2d(dsn, Tq * 4, db + q0, L * 4, Tq * 4, rows);     /* out of the wide rows */
	hp_cuda_copy2d(db + q0, L * 4, ds, Tq * 4, Tq * 4, rows);      /* into them */
	int g = gpu_ok();
	float *gs = ct_host(dsn, ns, 0), *gb = ct_host(db, nb, 0);
	ok(g && !memcmp(gs, wsmall, ns * 4) && !memcmp(gb, wbig, nb * 4),
	   "copy2d %zu rows of %zu floats, pitch %zu: out and back in, the rest untouched", rows, Tq, L);
	hp_cuda_free(db);
	hp_cuda_free(ds);
	hp_cuda_free(dsn);
	free(big);
	free(small);
	free(wbig);
	free(wsmall);
	free(gs);
	free(gb);
}

/* ---- conversions and element-wise ---- */

/* bf16 sums over ranks: the rule's bits (hp_bf16_sum_ranks), in place and
 * out of place; blocks s apart with values whose fp32 sum depends on the
 * order, so that another order or a second rounding shows */
static void test_sum_ranks(size_t n, int k)
{
	size_t s = n + 3, tot = (size_t)k * s, bad = 0;
	uint16_t *in = malloc(tot * 2 + 2), *want = malloc(n * 2 + 2), *got = malloc(tot * 2 + 2);
	hp_bf16 *d = ct_alloc(tot * 2 + 2), *o = ct_alloc(n * 2 + 2);
	uint64_t x = 88172645463325252ull + (uint64_t)k;

	for (size_t i = 0; i < tot; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		/* magnitudes 2^-8 .. 2^24, either sign: partial sums lose bits */
		in[i] = hp_f32_to_bf16(ldexpf((float)(x % 255) / 128.0f - 1.0f, (int)(x >> 40) % 33 - 8));
	}
	if (n >= 3 && k >= 3)   /* 2^25 + 1 - 2^25 is 0 in rank order, 1 in others */
		in[0] = hp_f32_to_bf16(33554432.0f), in[s] = hp_f32_to_bf16(1.0f),
		in[2 * s] = hp_f32_to_bf16(-33554432.0f);
	for (int r = 3; n >= 3 && r < k; r++)
		in[(size_t)r * s] = 0;
	hp_bf16_sum_ranks(want, in, k, n, s);
	if (n >= 3 && k >= 3)
		ok(want[0] == 0, "sum_ranks reference: 2^25 + 1 - 2^25 is %g in rank order",
		   (double)hp_bf16_to_f32(want[0]));
	hp_cuda_upload(d, in, tot * 2, &err);
	hp_cuda_bf16_sum_ranks(o, d, k, n, s);
	hp_cuda_bf16_sum_ranks(d, d, k, n, s);
	int g = gpu_ok();
	hp_cuda_download(got, o, n * 2, &err);
	for (size_t i = 0; i < n; i++)
		bad += got[i] != want[i];
	hp_cuda_download(got, d, n * 2, &err);
	for (size_t i = 0; i < n; i++)
		bad += got[i] != want[i];
	ok(g && bad == 0, "bf16_sum_ranks n=%zu k=%d: %zu of %zu differ from hp_bf16_sum_ranks", n, k, bad, 2 * n);
	hp_cuda_free(d);
	hp_cuda_free(o);
	free(in);
	free(want);
	free(got);
}

static void test_convert(size_t n)
{
	float *x = hfill(n, 1, 100.0f, 0), *h = hfill(n, 2, 10.0f, 0);
	static const uint32_t special[] = {
		0x7fc00000u, 0x7f800000u, 0xff800000u, 0x80000000u,   /* NaN, inf, -inf, -0 */
		0x00000001u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu,   /* denormal, ties to even down / up, max */
		0xff7f8000u, 0x7fa00001u,                             /* rounds to -inf, signalling NaN */
	};
	size_t bad = 0, ns = sizeof(special) / sizeof(special[0]);

	for (size_t i = 0; i < ns && i < n; i++)
		memcpy(&x[i], &special[i], 4);
	float *dx = ct_dev(x, n, 0), *dh = ct_dev(h, n, 0), *df = ct_dnan(n, 0);
	hp_bf16 *dy = ct_alloc(n * 2 + 2), *hy = malloc(n * 2 + 2);
	float *want = malloc(n * 4 + 4);

	hp_cuda_f32_to_bf16(dy, dx, n);
	int g = gpu_ok();
	hp_cuda_download(hy, dy, n * 2, &err);
	for (size_t i = 0; i < n; i++)
		bad += hy[i] != hp_f32_to_bf16(x[i]);
	ok(g && bad == 0, "f32_to_bf16 n=%zu: %zu of %zu differ from round-to-nearest-even", n, bad, n);

	hp_cuda_bf16_to_f32(df, dy, n);
	g = gpu_ok();
	float *gf = ct_host(df, n, 0);
	for (size_t i = 0; i < n; i++)
		want[i] = hp_bf16_to_f32(hy[i]);
	ok(g && ct_ndiff(gf, want, n) == 0, "bf16_to_f32 n=%zu: %zu differ from the widened bits", n,
	   ct_ndiff(gf, want, n));
	free(gf);

	hp_cuda_add_bf16(dh, dy, n);
	g = gpu_ok();
	float *gh = ct_host(dh, n, 0);
	for (size_t i = 0; i < n; i++)
		want[i] = h[i] + hp_bf16_to_f32(hy[i]);
	ok(g && ct_ndiff(gh, want, n) == 0, "add_bf16 n=%zu: %zu differ from h + (float)o", n, ct_ndiff(gh, want, n));

	hp_cuda_scale(dh, 0.37f, n);
	g = gpu_ok();
	float *gz = ct_host(dh, n, 0);
	for (size_t i = 0; i < n; i++)
		want[i] = gh[i] * 0.37f;
	ok(g && ct_ndiff(gz, want, n) == 0, "scale n=%zu: %zu differ from x * s", n, ct_ndiff(gz, want, n));

	hp_cuda_free(dx);
	hp_cuda_free(dh);
	hp_cuda_free(dy);
	hp_cuda_free(df);
	free(x);
	free(h);
	free(hy);
	free(want);
	free(gh);
	free(gz);
}

/* add (also in place on either operand), acc, add_bias, max, add_f64:
 * rows.c's loops, bit for bit */
static void test_adds(long N, int C)
{
	size_t n = (size_t)N * C;
	float *a = hfill(n, 40, 3.0f, 0), *b = hfill(n, 41, 3.0f, 0), *bias = hfill((size_t)C, 42, 1.0f, 0);
	float *want = malloc(n * 4 + 4), *got;
	float *da = ct_dev(a, n, 0), *dbb = ct_dev(b, n, 0), *dx = ct_dnan(n, 0), *dbias = ct_dev(bias, (size_t)C, 0);
	int g, good = 1;

	hp_residual_add(want, a, b, (long)n);
	hp_cuda_add(dx, da, dbb, n);
	g = gpu_ok();
	got = ct_host(dx, n, 0);
	good &= g && ct_ndiff(got, want, n) == 0;
	free(got);
	/* x aliasing a, then b */
	float *da2 = ct_dev(a, n, 0), *db2 = ct_dev(b, n, 0);
	hp_cuda_add(da2, da2, dbb, n);
	hp_cuda_add(db2, da, db2, n);
	g = gpu_ok();
	float *g1 = ct_host(da2, n, 0), *g2 = ct_host(db2, n, 0);
	good &= g && ct_ndiff(g1, want, n) == 0 && ct_ndiff(g2, want, n) == 0;
	ok(good, "add N*C=%zu: a + b bit for bit, also into a and into b", n);
	free(g1);
	free(g2);

	/* acc: x += y */
	float *acc = hcopy(a, n);
	for (size_t i = 0; i < n; i++)
		acc[i] += b[i];
	float *dacc = ct_dev(a, n, 0);
	hp_cuda_acc(dacc, dbb, n);
	g = gpu_ok();
	got = ct_host(dacc, n, 0);
	ok(g && ct_ndiff(got, acc, n) == 0, "acc N*C=%zu: x += y bit for bit", n);
	free(got);

	/* add_bias over rows */
	float *xb = hcopy(a, n);
	hp_bias_add(xb, bias, N, C);
	float *dxb = ct_dev(a, n, 0);
	hp_cuda_add_bias(dxb, dbias, N, C);
	g = gpu_ok();
	got = ct_host(dxb, n, 0);
	ok(g && ct_ndiff(got, xb, n) == 0, "add_bias N=%ld C=%d: bit for bit", N, C);
	free(got);

	/* max: equal values, -0 against 0, infinities and NaN on either side */
	float *mx = hcopy(a, n), *my = hcopy(b, n);
	for (size_t i = 0; i + 8 <= n && i < 64; i += 8) {
		my[i] = mx[i];
		mx[i + 1] = -0.0f;
		my[i + 1] = 0.0f;
		mx[i + 2] = NAN;
		my[i + 3] = NAN;
		my[i + 4] = INFINITY;
		mx[i + 5] = -INFINITY;
	}
	float *dmx = ct_dev(mx, n, 0), *dmy = ct_dev(my, n, 0);
	hp_max_into(mx, my, (long)n);
	hp_cuda_max(dmx, dmy, n);
	g = gpu_ok();
	got = ct_host(dmx, n, 0);
	ok(g && ct_ndiff(got, mx, n) == 0, "max n=%zu: y where y > x, bit for bit (NaN, -0, inf included)", n);
	free(got);

	/* add_f64 */
	double *xd = malloc(n * 8 + 8), *yd = malloc(n * 8 + 8);
	for (size_t i = 0; i < n; i++) {
		xd[i] = (double)a[i] * 1e-3 + 1.0 / (double)(i + 3);
		yd[i] = (double)b[i] * 1e5;
	}
	double *dxd = ct_dev_f64(xd, n), *dyd = ct_dev_f64(yd, n);
	hp_add_into_f64(xd, yd, (long)n);
	hp_cuda_add_f64(dxd, dyd, n);
	g = gpu_ok();
	double *gd = ct_host_f64(dxd, n);
	ok(g && !memcmp(gd, xd, n * 8), "add_f64 n=%zu: bit for bit", n);
	free(gd);

	void *dev[] = { da, dbb, dx, dbias, da2, db2, dacc, dxb, dmx, dmy, dxd, dyd };
	for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
		hp_cuda_free(dev[i]);
	free(a); free(b); free(bias); free(want); free(acc); free(xb); free(mx); free(my); free(xd); free(yd);
}

/* colsum: db += sums over rows, against hp_bias_grad (row order); the GPU's
 * two-stage order gives other roundings (TOL_F32), the same bits twice */
static void test_colsum(long N, int C)
{
	size_t n = (size_t)N * C;
	float *x = hfill(n, 43, 2.0f, 0), *db0 = hfill((size_t)C, 44, 1.0f, 0), *want = hcopy(db0, (size_t)C);
	float *dx = ct_dev(x, n, 0), *d1 = ct_dev(db0, (size_t)C, 0), *d2 = ct_dev(db0, (size_t)C, 0);

	hp_bias_grad(want, x, N, C);
	hp_cuda_colsum(d1, dx, N, C);
	hp_cuda_colsum(d2, dx, N, C);
	int g = gpu_ok();
	float *got = ct_host(d1, (size_t)C, 0);
	double e = ct_nerr(got, want, (size_t)C);
	int det = ct_dev_same(d1, d2, (size_t)C * 4);
	ok(g && e <= TOL_F32 && det, "colsum N=%ld C=%d: nerr %.2e (%zu of %d not the CPU's bits), deterministic: %s",
	   N, C, e, ct_ndiff(got, want, (size_t)C), C, yesno(det));
	hp_cuda_free(dx);
	hp_cuda_free(d1);
	hp_cuda_free(d2);
	free(x);
	free(db0);
	free(want);
	free(got);
}

static void test_sumsq(size_t n)
{
	float *x = hfill(n + 1, 3, 3.0f, 0);
	float *dx = ct_dev(x, n + 1, 0);
	double want = 0, zero = 0, got, again, twice;
	/* device accumulators: two from 0, then the first added to again
	 * (the same sum twice: exactly double the first) */
	double *d1 = ct_dev_f64(&zero, 1), *d2 = ct_dev_f64(&zero, 1);

	for (size_t i = 0; i < n; i++)
		want += (double)x[i] * x[i];
	int rc = hp_cuda_sumsq(d1, dx, n, &err);
	int rc2 = hp_cuda_sumsq(d2, dx, n, &err);
	rc |= hp_cuda_sync(&err);
	hp_cuda_download(&got, d1, sizeof(double), &err);
	hp_cuda_download(&again, d2, sizeof(double), &err);
	rc2 |= hp_cuda_sumsq(d1, dx, n, &err) | hp_cuda_sync(&err);
	hp_cuda_download(&twice, d1, sizeof(double), &err);
	double rel = fabs(got - want) / (want > 0 ? want : 1);
	int same = !memcmp(&got, &again, sizeof(double)) && twice == 2 * got;
	/* double sums of non-negative terms in another order: n * 2^-53 at worst */
	ok(rc == 0 && rc2 == 0 && rel <= 1e-10 && same,
	   "sumsq n=%zu: relative error %.2e, same bits twice and added onto the accumulator: %s", n, rel,
	   yesno(same));
	hp_cuda_free(dx);
	hp_cuda_free(d1);
	hp_cuda_free(d2);
	free(x);
}

/* ---- embedding: the vocabulary range [v0, v0 + V) of a table of Vall rows ---- */

/* order and starts as lib/backend/backend_cuda.c builds them: the tokens whose id
 * is in range and not pad, sorted by (id, index) (insertion sort: a test's
 * N), and where each id's group starts; returns the number of groups */
static int groups(int32_t *order, int32_t *starts, const int32_t *ids, long N, int v0, int V, int pad)
{
	long kept = 0;
	int nu = 0;

	for (long i = 0; i < N; i++) {
		if (ids[i] - v0 < 0 || ids[i] - v0 >= V || ids[i] == pad)
			continue;
		long j = kept++;
		while (j > 0 && ids[order[j - 1]] > ids[i]) {
			order[j] = order[j - 1];
			j--;
		}
		order[j] = (int32_t)i;
	}
	for (long i = 0; i < kept; i++)
		if (i == 0 || ids[order[i]] != ids[order[i - 1]])
			starts[nu++] = (int32_t)i;
	starts[nu] = (int32_t)kept;
	return nu;
}

static void test_embedding(long N, int C, int Vall, int v0, int V)
{
	size_t nt = (size_t)V * C, no = (size_t)N * C;
	int pad = v0 + V / 2;   /* nn.Embedding's padding_idx, inside the range */
	float *table = hfill(nt, 4, 1.0f, 0), *dout = hfill(no, 5, 1.0f, 0);
	float *dtab0 = hfill(nt, 6, 1.0f, 0), *want = malloc(no * 4 + 4), *dwant = hcopy(dtab0, nt);
	int32_t *ids = hids((size_t)N, 7, Vall), *order = malloc((size_t)N * 4 + 4), *starts = malloc((size_t)N * 4 + 8);
	float *dtable = ct_dev(table, nt, 0), *dd = ct_dev(dout, no, 0), *dout_gpu = ct_dnan(no, 0);
	float *dt1 = ct_dev(dtab0, nt, 0), *dt2 = ct_dev(dtab0, nt, 0);
	int32_t *dids = ct_dev_i32(ids, (size_t)N);

	/* forward: exact copies of the rows in range, zero rows for the others */
	hp_embedding_fwd_range(want, ids, table, N, C, v0, V);
	hp_cuda_embedding_fwd(dout_gpu, dids, dtable, N, C, v0, V);
	int g = gpu_ok();
	float *got = ct_host(dout_gpu, no, 0);
	ok(g && !memcmp(got, want, no * 4), "embedding_fwd N=%ld C=%d rows [%d, %d) of %d: exact", N, C, v0, v0 + V,
	   Vall);

	/* backward: dtable += rows, per id in token order (the CPU's order) */
	int nu = groups(order, starts, ids, N, v0, V, pad);
	int32_t *dorder = ct_dev_i32(order, (size_t)N), *dstarts = ct_dev_i32(starts, (size_t)nu + 1);
	hp_embedding_bwd_range(dwant, dout, ids, N, C, v0, V, pad);
	hp_cuda_embedding_bwd(dt1, dd, dids, dorder, dstarts, nu, C, v0);
	hp_cuda_embedding_bwd(dt2, dd, dids, dorder, dstarts, nu, C, v0);
	g = gpu_ok();
	float *dgot = ct_host(dt1, nt, 0);
	ok(g && ct_ndiff(dgot, dwant, nt) == 0 && ct_dev_same(dt1, dt2, nt * 4),
	   "embedding_bwd N=%ld C=%d rows [%d, %d), pad %d, %d ids: bit for bit, deterministic", N, C, v0, v0 + V, pad,
	   nu);

	hp_cuda_free(dtable);
	hp_cuda_free(dd);
	hp_cuda_free(dout_gpu);
	hp_cuda_free(dt1);
	hp_cuda_free(dt2);
	hp_cuda_free(dids);
	hp_cuda_free(dorder);
	hp_cuda_free(dstarts);
	free(table); free(dout); free(dtab0); free(want); free(dwant); free(ids); free(order); free(starts);
	free(got); free(dgot);
}

/* ---- RMSNorm ---- */

static void test_rmsnorm(long N, int C, int acc)
{
	size_t n = (size_t)N * C;
	float eps = 1e-6f;
	float *x = hfill(n, 8, 2.0f, 0), *w = hfill((size_t)C, 9, 0.5f, 0);
	float *dy = hfill(n, 10, 1.0f, 0), *dx0 = hfill(n, 11, 1.0f, 0), *dw0 = hfill((size_t)C, 12, 1.0f, 0);
	float *y = malloc(n * 4 + 4), *rstd = malloc((size_t)N * 4 + 4);

	for (int c = 0; c < C; c++)
		w[c] += 1.0f;   /* weights around 1 as trained norms have */
	hp_rmsnorm_fwd(y, rstd, x, w, N, C, eps);

	float *dxv = ct_dev(x, n, 0), *dw = ct_dev(w, (size_t)C, 0), *dys = ct_dev(dy, n, 0);
	float *drstd = ct_dnan((size_t)N, 0), *dyout = ct_dnan(n, 0);

	hp_cuda_rmsnorm_fwd(dyout, drstd, dxv, dw, N, C, eps);
	int g = gpu_ok();
	float *gy = ct_host(dyout, n, 0), *gr = ct_host(drstd, (size_t)N, 0);
	double ey = ct_nerr(gy, y, n), er = ct_nerr(gr, rstd, (size_t)N);
	/* rstd: the same double sum in another order, rounded once to float;
	 * y: the CPU's two unfused products from it */
	ok(g && ey <= TOL_F32 && er <= TOL_F32, "rmsnorm_fwd N=%ld C=%d: y nerr %.2e (%zu of %zu not the CPU's bits), "
	   "rstd nerr %.2e", N, C, ey, ct_ndiff(gy, y, n), n, er);

	/* backward from the CPU's rstd, so both sides use the same one */
	float *dxr = hcopy(dx0, n), *dwr = hcopy(dw0, (size_t)C);
	hp_rmsnorm_bwd(dxr, dwr, dy, x, w, rstd, N, C, acc);
	hp_cuda_upload(drstd, rstd, (size_t)N * 4, &err);
	float *ddx1 = acc ? ct_dev(dx0, n, 0) : ct_dnan(n, 0), *ddx2 = acc ? ct_dev(dx0, n, 0) : ct_dnan(n, 0);
	float *ddw1 = ct_dev(dw0, (size_t)C, 0), *ddw2 = ct_dev(dw0, (size_t)C, 0);
	for (int run = 0; run < 2; run++)
		hp_cuda_rmsnorm_bwd(run ? ddx2 : ddx1, run ? ddw2 : ddw1, dys, dxv, dw, drstd, N, C, acc);
	g = gpu_ok();
	float *gdx = ct_host(ddx1, n, 0), *gdw = ct_host(ddw1, (size_t)C, 0);
	double ex = ct_nerr(gdx, dxr, n), ew = ct_nerr(gdw, dwr, (size_t)C);
	int det = ct_dev_same(ddx1, ddx2, n * 4) && ct_dev_same(ddw1, ddw2, (size_t)C * 4);
	/* dx: the row's dot product in double (another order), the rest the
	 * CPU's fp32 operations; dw: fp32 sums over N rows in another order */
	ok(g && ex <= TOL_F32 && ew <= TOL_F32 && det,
	   "rmsnorm_bwd N=%ld C=%d acc=%d: dx nerr %.2e, dw nerr %.2e, deterministic: %s", N, C, acc, ex, ew, yesno(det));

	hp_cuda_free(dxv); hp_cuda_free(dw); hp_cuda_free(dys); hp_cuda_free(drstd); hp_cuda_free(dyout);
	hp_cuda_free(ddx1); hp_cuda_free(ddx2); hp_cuda_free(ddw1); hp_cuda_free(ddw2);
	free(x); free(w); free(dy); free(dx0); free(dw0); free(y); free(rstd); free(gy); free(gr);
	free(dxr); free(dwr); free(gdx); free(gdw);
}

/* ---- RoPE: every type's table, the kernels read it ---- */

static struct hp_model_spec rope_spec(enum hp_rope_type type, int D, int T)
{
	struct hp_model_spec s = { .head_dim = D, .max_pos = T };

	s.rope = (struct hp_rope_spec){ .type = type, .theta = 10000.0, .factor = 4.0,
					.low_freq_factor = 1.0, .high_freq_factor = 4.0,
					.orig_max_pos = T / 4 > 1 ? T / 4 : 1, .attention_factor = 1.1386,
					.beta_fast = 32, .beta_slow = 1, .truncate = 1 };
	return s;
}

/* heads of ld floats, the Dr at off rotated, in rotate_half (inter 0) or
 * interleaved pairs (inter 1); the whole buffer compared, so a float
 * outside the slice that the GPU touches fails too */
static void test_rope_at(long N, int H, int ld, int off, int Dr, int inter, int T, enum hp_rope_type type)
{
	size_t n = (size_t)N * H * ld, nt = (size_t)T * (Dr / 2);
	float *cs = malloc(nt * 4 + 4), *sn = malloc(nt * 4 + 4);
	float *x = hfill(n, 13, 2.0f, 0), *dx = hfill(n, 14, 1.0f, 0);
	int32_t *pos = hids((size_t)N, 15, T);
	struct hp_model_spec rs = rope_spec(type, Dr, T);

	hp_model_spec_rope_table(&rs, cs, sn, T);
	if (N > 1)
		pos[N - 1] = T - 1;   /* the table's last row */
	float *dcs = ct_dev(cs, nt, 0), *dsn = ct_dev(sn, nt, 0), *dxq = ct_dev(x, n, 0), *ddx = ct_dev(dx, n, 0);
	int32_t *dpos = ct_dev_i32(pos, (size_t)N);

	hp_cuda_rope_fwd(dxq + off, dpos, dcs, dsn, N, H, ld, Dr, inter);
	hp_cuda_rope_bwd(ddx + off, dpos, dcs, dsn, N, H, ld, Dr, inter);
	int g = gpu_ok();
	float *gx = ct_host(dxq, n, 0), *gdx = ct_host(ddx, n, 0);
	hp_rope_fwd(x + off, pos, cs, sn, N, H, ld, Dr, inter);
	hp_rope_bwd(dx + off, pos, cs, sn, N, H, ld, Dr, inter);
	/* the CPU's fp32 products and sums, unfused: the same bits */
	ok(g && ct_ndiff(gx, x, n) == 0 && ct_ndiff(gdx, dx, n) == 0,
	   "rope %s N=%ld H=%d ld=%d off=%d Dr=%d inter=%d: fwd %zu, bwd %zu of %zu not the CPU's bits",
	   hp_rope_type_name(type), N, H, ld, off, Dr, inter, ct_ndiff(gx, x, n), ct_ndiff(gdx, dx, n), n);

	hp_cuda_free(dcs); hp_cuda_free(dsn); hp_cuda_free(dxq); hp_cuda_free(ddx); hp_cuda_free(dpos);
	free(cs); free(sn); free(x); free(dx); free(pos); free(gx); free(gdx);
}

/* MLA's shared key part: the copy to every head and the sum over heads,
 * in strided rows as the model passes them; the whole buffers compared */
static void test_heads(long N, int H, int w, int ldh, int ldr)
{
	size_t nh = (size_t)N * H * ldh, nr = (size_t)N * ldr;
	float *k = hfill(nh, 31, 1.0f, 0), *src = hfill(nr, 32, 1.0f, 0), *dk = hfill(nh, 33, 1.0f, 0);
	float *sum = hfill(nr, 34, 1.0f, 0);
	float *dkk = ct_dev(k, nh, 0), *dsrc = ct_dev(src, nr, 0), *ddk = ct_dev(dk, nh, 0), *dsum = ct_dev(sum, nr, 0);

	hp_cuda_heads_bcast(dkk + 1, ldh, dsrc + 2, ldr, N, H, w);
	hp_cuda_heads_sum(dsum + 2, ldr, ddk + 1, ldh, N, H, w);
	int g = gpu_ok();
	float *gk = ct_host(dkk, nh, 0), *gs = ct_host(dsum, nr, 0);
	hp_heads_bcast(k + 1, ldh, src + 2, ldr, N, H, w);
	hp_heads_sum(sum + 2, ldr, dk + 1, ldh, N, H, w);
	ok(g && ct_ndiff(gk, k, nh) == 0 && ct_ndiff(gs, sum, nr) == 0,
	   "heads_bcast / heads_sum N=%ld H=%d w=%d: %zu of %zu, %zu of %zu not the CPU's bits", N, H, w,
	   ct_ndiff(gk, k, nh), nh, ct_ndiff(gs, sum, nr), nr);
	hp_cuda_free(dkk); hp_cuda_free(dsrc); hp_cuda_free(ddk); hp_cuda_free(dsum);
	free(k); free(src); free(dk); free(sum); free(gk); free(gs);
}

/* whole heads, HF's layout: what every family but DeepSeek runs */
static void test_rope(long N, int H, int D, int T, enum hp_rope_type type)
{
	test_rope_at(N, H, D, 0, D, 0, T, type);
}

/* ---- SwiGLU: element-wise (the op table's) and on [gate | up] rows ---- */

/* saturated gates: exp overflows on one side, silu must stay finite */
static void saturate(float *g, size_t n, size_t stride)
{
	for (size_t i = 0; i + 4 <= n; i += stride) {
		g[i] = 100.0f;
		g[i + 1] = -100.0f;
		g[i + 2] = -88.5f;
		g[i + 3] = 0.0f;
	}
}

static void test_swiglu(long rows, int I)
{
	const struct hp_cpu_ops *ops = hp_cpu_ops_get();   /* the CPU backend's table */
	size_t n = (size_t)rows * I;
	float *gu = hfill(2 * n, 16, 8.0f, 0), *dh = hfill(n, 17, 1.0f, 0);
	float *h = malloc(n * 4 + 4), *dgu = malloc(2 * n * 4 + 4);
	float *g = hfill(n, 18, 8.0f, 0), *u = hfill(n, 19, 2.0f, 0);
	float *he = malloc(n * 4 + 4), *dg = malloc(n * 4 + 4), *du = malloc(n * 4 + 4);

	for (long r = 0; r < rows && I >= 4; r += 3)
		saturate(gu + r * 2 * I, 4, 4);
	saturate(g, n, 97);

	/* rows */
	float *dgu_in = ct_dev(gu, 2 * n, 0), *ddh = ct_dev(dh, n, 0), *dhout = ct_dnan(n, 0), *ddgu = ct_dnan(2 * n, 0);
	hp_cuda_swiglu_rows_fwd(dhout, dgu_in, rows, I);
	hp_cuda_swiglu_rows_bwd(ddgu, ddh, dgu_in, rows, I);
	int ok1 = gpu_ok();
	float *gh = ct_host(dhout, n, 0), *gdgu = ct_host(ddgu, 2 * n, 0);
	hp_swiglu_rows_fwd(h, gu, rows, I);
	hp_swiglu_rows_bwd(dgu, dh, gu, rows, I);
	double ef = ct_nerr(gh, h, n), eb = ct_nerr(gdgu, dgu, 2 * n);
	/* sigmoid within a few ulps of the CPU's vector exp, the products the CPU's */
	ok(ok1 && ef <= TOL_F32 && eb <= TOL_F32, "swiglu_rows rows=%ld I=%d: fwd nerr %.2e, bwd nerr %.2e "
	   "(%zu and %zu not the CPU's bits)", rows, I, ef, eb, ct_ndiff(gh, h, n), ct_ndiff(gdgu, dgu, 2 * n));

	/* element-wise: against the op table the CPU backend runs */
	float *dg_in = ct_dev(g, n, 0), *du_in = ct_dev(u, n, 0), *dhe = ct_dnan(n, 0);
	float *ddg = ct_dnan(n, 0), *ddu = ct_dnan(n, 0);
	hp_cuda_swiglu_fwd(dhe, dg_in, du_in, n);
	hp_cuda_swiglu_bwd(ddg, ddu, ddh, dg_in, du_in, n);
	ok1 = gpu_ok();
	float *ghe = ct_host(dhe, n, 0), *gdg = ct_host(ddg, n, 0), *gdu = ct_host(ddu, n, 0);
	ops->swiglu_fwd(he, g, u, (long)n);
	ops->swiglu_bwd(dg, du, dh, g, u, (long)n);
	double e1 = ct_nerr(ghe, he, n), e2 = ct_nerr(gdg, dg, n), e3 = ct_nerr(gdu, du, n);
	ok(ok1 && e1 <= TOL_F32 && e2 <= TOL_F32 && e3 <= TOL_F32,
	   "swiglu n=%zu against the %s table: h nerr %.2e, dg %.2e, du %.2e", n, ops->name, e1, e2, e3);

	hp_cuda_free(dgu_in); hp_cuda_free(ddh); hp_cuda_free(dhout); hp_cuda_free(ddgu);
	hp_cuda_free(dg_in); hp_cuda_free(du_in); hp_cuda_free(dhe); hp_cuda_free(ddg); hp_cuda_free(ddu);
	free(gu); free(dh); free(h); free(dgu); free(gh); free(gdgu); free(g); free(u); free(he); free(dg);
	free(du); free(ghe); free(gdg); free(gdu);
}

/* ---- MoE routing: kernels/cpu/router.c and rows.c ---- */

static void ref_router(float *probs, int32_t *sel, float *wsel, const float *logits, long N, int E, int K, int norm)
{
	memcpy(probs, logits, sizeof(float) * (size_t)N * E);
	hp_router_topk(probs, sel, wsel, N, E, K, norm);
}

/* router logits [N, E]: bf16-valued (distinct values then differ by far more
 * than expf's ulps, so the top-k cannot flip between CPU and GPU), or with
 * ties: small integers, every row of a few all equal */
static float *router_logits(long N, int E, int ties, unsigned seed)
{
	float *lg = hfill((size_t)N * E, seed, 4.0f, 1);

	if (ties) {
		for (size_t i = 0; i < (size_t)N * E; i++)
			lg[i] = floorf(lg[i]);
		for (long t = 0; t < N; t += 5)
			for (int x = 0; x < E; x++)
				lg[t * E + x] = 0.5f;
	}
	return lg;
}

static void test_router(long N, int E, int K, int norm, int ties)
{
	size_t ne = (size_t)N * E, nk = (size_t)N * K;
	float *lg = router_logits(N, E, ties, 18 + (unsigned)E);
	float *probs = malloc(ne * 4 + 4), *wsel = malloc(nk * 4 + 4);
	int32_t *sel = malloc(nk * 4 + 4), *gsel = malloc(nk * 4 + 4), *gsel2 = malloc(nk * 4 + 4);

	ref_router(probs, sel, wsel, lg, N, E, K, norm);
	float *dlg = ct_dev(lg, ne, 0), *dprobs = ct_dnan(ne, 0), *dwsel = ct_dnan(nk, 0), *dws2 = ct_dnan(nk, 0);
	int32_t *dsel = ct_alloc(nk * 4 + 4), *dsel2 = ct_alloc(nk * 4 + 4);

	hp_cuda_router_topk(dprobs, dsel, dwsel, dlg, N, E, K, norm);
	hp_cuda_router_topk(dlg, dsel2, dws2, dlg, N, E, K, norm);    /* in place */
	int g = gpu_ok();
	float *gp = ct_host(dprobs, ne, 0), *gw = ct_host(dwsel, nk, 0);
	hp_cuda_download(gsel, dsel, nk * 4, &err);
	hp_cuda_download(gsel2, dsel2, nk * 4, &err);
	size_t bad = 0;
	for (size_t i = 0; i < nk; i++)
		bad += gsel[i] != sel[i];
	double ep = ct_nerr(gp, probs, ne), ew = ct_nerr(gw, wsel, nk);
	int inplace = ct_dev_same(dlg, dprobs, ne * 4) && ct_dev_same(dws2, dwsel, nk * 4) &&
		      !memcmp(gsel, gsel2, nk * 4);
	ok(g && bad == 0 && ep <= TOL_PROB && ew <= TOL_PROB && inplace,
	   "router_topk N=%ld E=%d k=%d norm=%d%s: %zu of %zu experts differ, probs nerr %.2e, "
	   "wsel nerr %.2e, in place the same: %s", N, E, K, norm, ties ? " ties" : "", bad, nk, ep, ew, yesno(inplace));

	/* backward, from the CPU's forward; aux in [0.25, 0.5) with aux_grad 1:
	 * large enough that dropping it fails */
	float *dws = hfill(nk, 19, 1.0f, 0), *want = malloc(ne * 4 + 4);
	double *aux = malloc((size_t)E * 8 + 8), aux_grad = ties ? 0 : 1.0;
	for (int x = 0; x < E; x++)
		aux[x] = 0.375 + 0.125 * sin(x + 1.0);
	hp_router_bwd(want, probs, sel, wsel, dws, aux, aux_grad, N, E, K, norm);
	hp_cuda_upload(dprobs, probs, ne * 4, &err);
	hp_cuda_upload(dsel, sel, nk * 4, &err);
	hp_cuda_upload(dwsel, wsel, nk * 4, &err);
	float *ddws = ct_dev(dws, nk, 0), *dl1 = ct_dnan(ne, 0), *dl2 = ct_dnan(ne, 0);
	double *daux = ct_dev_f64(aux, (size_t)E);
	for (int run = 0; run < 2; run++)
		hp_cuda_router_bwd(run ? dl2 : dl1, dprobs, dsel, dwsel, ddws, aux_grad != 0 ? daux : NULL, aux_grad,
				   N, E, K, norm);
	g = gpu_ok();
	float *gl = ct_host(dl1, ne, 0);
	double el = ct_nerr(gl, want, ne);
	int det = ct_dev_same(dl1, dl2, ne * 4);
	/* the CPU's fp32 operations around double sums in another order */
	ok(g && el <= TOL_F32 && det, "router_bwd N=%ld E=%d k=%d norm=%d aux=%g: dlogits nerr %.2e (%zu of %zu "
	   "not the CPU's bits), deterministic: %s", N, E, K, norm, aux_grad, el, ct_ndiff(gl, want, ne), ne, yesno(det));

	hp_cuda_free(dlg); hp_cuda_free(dprobs); hp_cuda_free(dwsel); hp_cuda_free(dws2); hp_cuda_free(dsel);
	hp_cuda_free(dsel2); hp_cuda_free(ddws); hp_cuda_free(daux); hp_cuda_free(dl1); hp_cuda_free(dl2);
	free(lg); free(probs); free(wsel); free(sel); free(gsel); free(gsel2); free(gp); free(gw); free(dws);
	free(aux); free(want); free(gl);
}

/* DeepSeek-V3's grouped router against router.c: bias 0 none, 1 in
 * [-0.3, 0.3), 2 in [-1, 0.2) (kept experts' c below 0, where the masks
 * differ).  The choices must be the CPU's; s and the weights its bits but
 * where the GPU's double exp differs from glibc's in its last bit next to
 * a float's rounding boundary (TOL_PROB covers an ulp); the backward, on
 * the CPU's forward, the same IEEE double operations in the same order:
 * its bits. */
static void test_router_group(long N, int E, int K, int G, int TG, int norm, float scale, int mask_zero, int ties,
			      int bias)
{
	size_t ne = (size_t)N * E, nk = (size_t)N * K;
	float *lg = router_logits(N, E, ties, 40 + (unsigned)E), *b = hfill((size_t)E, 41, 0.6f, 0);
	float *probs = hcopy(lg, ne), *wsel = malloc(nk * 4 + 4);
	int32_t *sel = malloc(nk * 4 + 4), *gsel = malloc(nk * 4 + 4);

	for (int e = 0; e < E; e++)
		b[e] = bias == 2 ? b[e] - 0.4f : b[e] * 0.5f;
	const float *hb = bias ? b : NULL;
	hp_router_group_fwd(probs, sel, wsel, hb, N, E, K, G, TG, norm, scale, mask_zero);
	float *dp = ct_dev(lg, ne, 0), *dp2 = ct_dev(lg, ne, 0), *dw = ct_dnan(nk, 0), *dw2 = ct_dnan(nk, 0);
	float *db = bias ? ct_dev(b, (size_t)E, 0) : NULL;
	int32_t *ds = ct_alloc(nk * 4 + 4), *ds2 = ct_alloc(nk * 4 + 4);

	hp_cuda_router_group_fwd(dp, ds, dw, db, N, E, K, G, TG, norm, scale, mask_zero);
	hp_cuda_router_group_fwd(dp2, ds2, dw2, db, N, E, K, G, TG, norm, scale, mask_zero);
	int g = gpu_ok();
	float *gp = ct_host(dp, ne, 0), *gw = ct_host(dw, nk, 0);
	hp_cuda_download(gsel, ds, nk * 4, &err);
	size_t bad = 0;
	for (size_t i = 0; i < nk; i++)
		bad += gsel[i] != sel[i];
	double ep = ct_nerr(gp, probs, ne), ew = ct_nerr(gw, wsel, nk);
	int det = ct_dev_same(dp, dp2, ne * 4) && ct_dev_same(dw, dw2, nk * 4) && ct_dev_same(ds, ds2, nk * 4);
	ok(g && bad == 0 && ep <= TOL_PROB && ew <= TOL_PROB && det,
	   "router_group_fwd N=%ld E=%d K=%d G=%d TG=%d norm=%d scale=%g mask_zero=%d%s bias %d: %zu of %zu "
	   "experts differ, s nerr %.2e (%zu not the CPU's bits), wsel nerr %.2e (%zu), deterministic: %s", N, E, K,
	   G, TG, norm, scale, mask_zero, ties ? " ties" : "", bias, bad, nk, ep, ct_ndiff(gp, probs, ne), ew,
	   ct_ndiff(gw, wsel, nk), yesno(det));

	float *dws = hfill(nk, 42, 1.0f, 0), *want = malloc(ne * 4 + 4);
	hp_router_group_bwd(want, probs, sel, dws, N, E, K, norm, scale);
	hp_cuda_upload(dp, probs, ne * 4, &err);
	hp_cuda_upload(ds, sel, nk * 4, &err);
	float *ddws = ct_dev(dws, nk, 0), *dl = ct_dnan(ne, 0);
	hp_cuda_router_group_bwd(dl, dp, ds, ddws, N, E, K, norm, scale);
	g = gpu_ok();
	float *gl = ct_host(dl, ne, 0);
	ok(g && ct_ndiff(gl, want, ne) == 0, "router_group_bwd N=%ld E=%d K=%d norm=%d: %zu of %zu dlogits not the "
	   "CPU's bits (nerr %.2e)", N, E, K, norm, ct_ndiff(gl, want, ne), ne, ct_nerr(gl, want, ne));

	hp_cuda_free(dp); hp_cuda_free(dp2); hp_cuda_free(dw); hp_cuda_free(dw2); hp_cuda_free(db); hp_cuda_free(ds);
	hp_cuda_free(ds2); hp_cuda_free(ddws); hp_cuda_free(dl);
	free(lg); free(b); free(probs); free(wsel); free(sel); free(gsel); free(gp); free(gw); free(dws); free(want);
	free(gl);
}

/* lib/model/model.c's expert-major rows: row r holds (row_tok[r], row_slot[r]),
 * rows grouped by expert, tokens in order within an expert; tok_rows[t*K +
 * j] are token t's K rows in ascending order (not slot order: the CPU's
 * row loop adds a token's rows in that order) */
static void ref_route(int32_t *row_tok, int32_t *row_slot, int32_t *tok_rows, const int32_t *sel, long N, int E, int K)
{
	int32_t *off = calloc((size_t)E + 1, 4), *fill = malloc((size_t)E * 4 + 4), *cnt = calloc((size_t)N + 1, 4);

	for (long i = 0; i < N * K; i++)
		off[sel[i] + 1]++;
	for (int x = 0; x < E; x++)
		off[x + 1] += off[x];
	memcpy(fill, off, sizeof(int32_t) * (size_t)E);
	for (long t = 0; t < N; t++)
		for (int k = 0; k < K; k++) {
			int32_t r = fill[sel[t * K + k]]++;
			row_tok[r] = (int32_t)t;
			row_slot[r] = k;
		}
	/* walking the rows in order puts each token's rows in ascending order */
	for (long r = 0; r < N * K; r++) {
		long t = row_tok[r];
		tok_rows[t * K + cnt[t]++] = (int32_t)r;
	}
	free(off);
	free(fill);
	free(cnt);
}

static void test_rows(long N, int C, int E, int K)
{
	long R = N * K;
	size_t nx = (size_t)N * C, nr = (size_t)R * C;
	float *lg = router_logits(N, E, 0, 21), *probs = malloc((size_t)N * E * 4 + 4), *wsel = malloc((size_t)R * 4 + 4);
	int32_t *sel = malloc((size_t)R * 4 + 4), *row_tok = malloc((size_t)R * 4 + 4);
	int32_t *row_slot = malloc((size_t)R * 4 + 4), *tok_rows = malloc((size_t)R * 4 + 4);

	ref_router(probs, sel, wsel, lg, N, E, K, 1);
	ref_route(row_tok, row_slot, tok_rows, sel, N, E, K);
	int32_t *drow_tok = ct_dev_i32(row_tok, (size_t)R), *drow_slot = ct_dev_i32(row_slot, (size_t)R);
	int32_t *dtok_rows = ct_dev_i32(tok_rows, (size_t)R);
	float *dwsel = ct_dev(wsel, (size_t)R, 0);

	/* gather: exact row copies, aligned (the vector path when C % 4 == 0)
	 * and one element off (a narrower path) */
	float *x = hfill(nx + 1, 22, 2.0f, 0), *xs = malloc(nr * 4 + 4);
	float *dx = ct_dev(x, nx + 1, 0), *dxs = ct_dnan(nr + 1, 0), *dxs_off = ct_dnan(nr + 1, 0);
	hp_rows_gather(xs, x, row_tok, R, C);
	hp_cuda_gather_rows(dxs, dx, drow_tok, R, C);
	hp_cuda_gather_rows(dxs_off + 1, dx + 1, drow_tok, R, C);
	int g = gpu_ok();
	float *gxs = ct_host(dxs, nr, 0), *gxo = ct_host(dxs_off, nr + 1, 0);
	float *xs1 = malloc(nr * 4 + 4);
	hp_rows_gather(xs1, x + 1, row_tok, R, C);
	ok(g && ct_ndiff(gxs, xs, nr) == 0 && ct_ndiff(gxo + 1, xs1, nr) == 0,
	   "gather_rows R=%ld C=%d: exact (aligned and misaligned)", R, C);

	/* scatter: the inverse, rows back to the token-major [R, C] of a
	 * permutation (expert parallelism's regrouping) */
	int32_t *perm = malloc((size_t)R * 4 + 4);
	for (long r = 0; r < R; r++)
		perm[r] = (int32_t)((r * 7 + 3) % R);   /* 7 is prime to R unless R % 7 == 0 */
	if (R % 7 == 0)
		for (long r = 0; r < R; r++)
			perm[r] = (int32_t)(R - 1 - r);
	float *sc = malloc(nr * 4 + 4), *dsrc = ct_dev(xs, nr, 0), *dsc = ct_dnan(nr, 0);
	int32_t *dperm = ct_dev_i32(perm, (size_t)R);
	hp_rows_scatter(sc, xs, perm, R, C);
	hp_cuda_scatter_rows(dsc, dsrc, dperm, R, C);
	g = gpu_ok();
	float *gsc = ct_host(dsc, nr, 0);
	ok(g && ct_ndiff(gsc, sc, nr) == 0, "scatter_rows R=%ld C=%d: exact, every row written", R, C);

	/* combine: a token's rows in tok_rows (ascending) order, hp_moe_combine's
	 * additions; the slot order would round differently, which the count
	 * shows the order matters for */
	float *ye = hfill(nr, 23, 2.0f, 0), *out = malloc(nx * 4 + 4), *slot = calloc(nx + 1, 4);
	hp_moe_combine(out, ye, wsel, row_tok, row_slot, N, K, C);
	for (long t = 0; t < N; t++)
		for (int k = 0; k < K; k++) {
			long r = -1;
			for (int j = 0; j < K; j++)
				if (row_slot[tok_rows[t * K + j]] == k)
					r = tok_rows[t * K + j];
			for (int c = 0; c < C; c++)
				slot[t * C + c] += ye[r * C + c] * wsel[t * K + k];
		}
	float *dye = ct_dev(ye, nr, 0), *dout = ct_dnan(nx, 0);
	hp_cuda_combine(dout, dye, dwsel, dtok_rows, drow_slot, N, K, C);
	g = gpu_ok();
	float *gout = ct_host(dout, nx, 0);
	ok(g && ct_ndiff(gout, out, nx) == 0, "combine N=%ld C=%d E=%d k=%d: the CPU's bits (slot order would differ "
	   "in %zu of %zu)", N, C, E, K, ct_ndiff(slot, out, nx), nx);

	/* combine backward, row by row: dye the CPU's products, dwsel a double
	 * dot product in another order */
	float *dd = hfill(nx, 24, 1.0f, 0), *dyr = malloc(nr * 4 + 4), *dwr = malloc((size_t)R * 4 + 4);
	hp_moe_combine_bwd(dyr, dwr, dd, ye, wsel, row_tok, row_slot, R, K, C);
	float *ddout = ct_dev(dd, nx, 0), *ddye1 = ct_dnan(nr, 0), *ddye2 = ct_dnan(nr, 0);
	float *ddw1 = ct_dnan((size_t)R, 0), *ddw2 = ct_dnan((size_t)R, 0);
	for (int run = 0; run < 2; run++)
		hp_cuda_combine_bwd(run ? ddye2 : ddye1, run ? ddw2 : ddw1, ddout, dye, dwsel, drow_tok, drow_slot, R, K,
				    C);
	g = gpu_ok();
	float *gdye = ct_host(ddye1, nr, 0), *gdw = ct_host(ddw1, (size_t)R, 0);
	double edw = ct_nerr(gdw, dwr, (size_t)R);
	int det = ct_dev_same(ddye1, ddye2, nr * 4) && ct_dev_same(ddw1, ddw2, (size_t)R * 4);
	ok(g && ct_ndiff(gdye, dyr, nr) == 0 && edw <= TOL_DOT && det,
	   "combine_bwd R=%ld C=%d E=%d k=%d: dye exact, dwsel nerr %.2e (%zu of %ld not the CPU's bits), "
	   "deterministic: %s", R, C, E, K, edw, ct_ndiff(gdw, dwr, (size_t)R), R, yesno(det));

	/* scatter-add: dx[t] += its rows, in ascending order: hp_moe_scatter_add's bits */
	float *dx0 = hfill(nx, 25, 1.0f, 0), *dxe = hfill(nr, 26, 1.0f, 0), *dxr = hcopy(dx0, nx);
	hp_moe_scatter_add(dxr, dxe, row_tok, R, C);
	float *ddx1 = ct_dev(dx0, nx, 0), *ddxe = ct_dev(dxe, nr, 0);
	hp_cuda_scatter_add_rows(ddx1, ddxe, dtok_rows, N, K, C);
	g = gpu_ok();
	float *gdx = ct_host(ddx1, nx, 0);
	ok(g && ct_ndiff(gdx, dxr, nx) == 0, "scatter_add_rows N=%ld C=%d k=%d: the CPU's bits", N, C, K);

	void *dev[] = { drow_tok, drow_slot, dtok_rows, dwsel, dx, dxs, dxs_off, dsrc, dsc, dperm, dye, dout, ddout,
			ddye1, ddye2, ddw1, ddw2, ddx1, ddxe };
	for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
		hp_cuda_free(dev[i]);
	void *host[] = { lg, probs, wsel, sel, row_tok, row_slot, tok_rows, x, xs, gxs, gxo, xs1, perm, sc, gsc, ye, out,
			 slot, gout, dd, dyr, dwr, gdye, gdw, dx0, dxe, dxr, gdx };
	for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
		free(host[i]);
}

/* N*K choices in [0, E), expert 1 never chosen (an expert without rows)
 * when E > 2, every 7th choice (with nbad) outside [0, E): -1, E, INT32_MIN,
 * INT32_MAX in turn, as a top-k of NaN logits might leave */
static int32_t *route_sel(long N, int E, int K, int nbad, unsigned seed)
{
	static const int32_t odd[] = { -1, 0, INT32_MIN, INT32_MAX };
	size_t nk = (size_t)N * K;
	int32_t *sel = hids(nk, seed, E);

	for (size_t i = 0; i < nk; i++) {
		if (E > 2 && sel[i] == 1)
			sel[i] = 2;
		if (nbad && i % 7 == 3)
			sel[i] = i / 7 % 4 == 1 ? E : odd[i / 7 % 4];
	}
	return sel;
}

/* a device int32 buffer of n copies of v (an element left unwritten shows) */
static int32_t *dfill_i32(size_t n, int32_t v)
{
	int32_t *h = malloc(n * 4 + 4), *d;

	for (size_t i = 0; i < n; i++)
		h[i] = v;
	d = ct_dev_i32(h, n);
	free(h);
	return d;
}

/* device int32 [n] against host want: 1 when the same */
static int same_i32(const int32_t *d, const int32_t *want, size_t n)
{
	int32_t *h = malloc(n * 4 + 4);
	int same;

	hp_cuda_download(h, d, n * 4, &err);
	same = !memcmp(h, want, n * 4);
	free(h);
	return same;
}

/*
 * The routing table against hp_moe_route: integers, so every output must
 * be the CPU's exactly - off, row_tok, row_slot, tok_rows, sel rewritten,
 * bad added to (it starts at 5); twice from the same choices (the same
 * bits: no run-to-run order), and again without tok_rows.
 */
static void test_route(long N, int E, int K, int nbad)
{
	size_t nk = (size_t)N * K;
	int32_t *sel = route_sel(N, E, K, nbad, 40 + (unsigned)E), *want_sel = malloc(nk * 4 + 4);
	int32_t *off = malloc((size_t)(E + 1) * 4), *row_tok = malloc(nk * 4 + 4), *row_slot = malloc(nk * 4 + 4);
	int32_t *tok_rows = malloc(nk * 4 + 4), bad = 5, empty = 0;

	memcpy(want_sel, sel, nk * 4);
	hp_moe_route(off, row_tok, row_slot, tok_rows, &bad, want_sel, N, E, K);
	for (int x = 0; x < E; x++)
		empty += off[x + 1] == off[x];

	int good[2], same = 1;
	int32_t *d[2][6];
	for (int run = 0; run < 2; run++) {
		int32_t five = 5;
		d[run][0] = ct_dev_i32(sel, nk);
		d[run][1] = dfill_i32((size_t)E + 1, -7);
		d[run][2] = dfill_i32(nk, -7);
		d[run][3] = dfill_i32(nk, -7);
		d[run][4] = dfill_i32(nk, -7);
		d[run][5] = ct_dev_i32(&five, 1);
		hp_cuda_moe_route(d[run][1], d[run][2], d[run][3], d[run][4], d[run][5], d[run][0], N, E, K);
		good[run] = gpu_ok();
	}
	int ok_sel = same_i32(d[0][0], want_sel, nk), ok_off = same_i32(d[0][1], off, (size_t)E + 1);
	int ok_rows = same_i32(d[0][2], row_tok, nk) && same_i32(d[0][3], row_slot, nk);
	int ok_tr = same_i32(d[0][4], tok_rows, nk), ok_bad = same_i32(d[0][5], &bad, 1);
	for (int b = 0; b < 6; b++)
		same &= ct_dev_same(d[0][b], d[1][b], b == 1 ? ((size_t)E + 1) * 4 : b == 5 ? 4 : nk * 4);
	ok(good[0] && good[1] && ok_sel && ok_off && ok_rows && ok_tr && ok_bad && same,
	   "moe_route N=%ld E=%d k=%d (%d experts without rows, bad %d): the CPU's off %s, rows %s, tok_rows %s, "
	   "sel %s, bad %s; twice the same: %s", N, E, K, empty, bad - 5, yesno(ok_off), yesno(ok_rows), yesno(ok_tr),
	   yesno(ok_sel), yesno(ok_bad), yesno(same));

	/* without tok_rows: the rest the same */
	hp_cuda_upload(d[1][0], sel, nk * 4, &err);
	hp_cuda_upload(d[1][2], tok_rows, nk * 4, &err);   /* garbage for a row table: must be overwritten */
	hp_cuda_moe_route(d[1][1], d[1][2], d[1][3], NULL, d[1][5], d[1][0], N, E, K);
	int g = gpu_ok();
	int32_t bad2 = bad + (bad - 5);
	ok(g && same_i32(d[1][0], want_sel, nk) && same_i32(d[1][1], off, (size_t)E + 1) &&
	   same_i32(d[1][2], row_tok, nk) && same_i32(d[1][3], row_slot, nk) && same_i32(d[1][5], &bad2, 1),
	   "moe_route N=%ld E=%d k=%d without tok_rows: the same table, bad added again", N, E, K);

	for (int run = 0; run < 2; run++)
		for (int b = 0; b < 6; b++)
			hp_cuda_free(d[run][b]);
	free(sel); free(want_sel); free(off); free(row_tok); free(row_slot); free(tok_rows);
}

/*
 * The load-balancing loss's sums against hp_moe_aux_acc and _fin: two
 * layers accumulated onto non-zero sums, then the finish, its aux added
 * (divided) onto a step's sum; the same double operations in the same
 * order, so the same bits (probabilities of mixed magnitudes: another
 * order of the sum would round differently).  The finish again without
 * the step's sum: aux alone, the same.
 */
static void test_aux(long N, int E, int K)
{
	size_t ne = (size_t)N * E, nk = (size_t)N * K;
	double *FP = malloc((size_t)E * 16 + 8), aux = -1, gaux = -2, acc = 0.25, div = 3.0;
	int32_t *off[2];
	float *probs[2];
	double *dFP, *daux = ct_dev_f64(&gaux, 1), *dacc = ct_dev_f64(&acc, 1);
	int32_t *doff[2];
	float *dprobs[2];

	for (int x = 0; x < 2 * E; x++)
		FP[x] = 0.1 * (x + 1) + 1.0 / 3;
	dFP = ct_dev_f64(FP, 2 * (size_t)E);
	for (int l = 0; l < 2; l++) {
		int32_t *sel = route_sel(N, E, K, 0, 50 + (unsigned)l), *rt = malloc(nk * 4 + 4), *rs = malloc(nk * 4 + 4);
		int32_t bad = 0;
		off[l] = malloc((size_t)(E + 1) * 4);
		hp_moe_route(off[l], rt, rs, NULL, &bad, sel, N, E, K);
		probs[l] = hfill(ne, 51 + (unsigned)l, 1.0f, 0);
		for (size_t i = 0; i < ne; i++)
			probs[l][i] = fabsf(probs[l][i]) * (i % 3 ? 1.0f : 1e-3f);
		doff[l] = ct_dev_i32(off[l], (size_t)E + 1);
		dprobs[l] = ct_dev(probs[l], ne, 0);
		free(sel); free(rt); free(rs);
	}
	double n = 2.0 * (double)nk;
	int good = 1, acc_same = 1;
	for (int l = 0; l < 2; l++) {
		hp_moe_aux_acc(FP, probs[l], off[l], N, E);
		hp_cuda_moe_aux_acc(dFP, dprobs[l], doff[l], N, E);
		good &= gpu_ok();
		double *g = ct_host_f64(dFP, 2 * (size_t)E);
		acc_same &= !memcmp(g, FP, (size_t)E * 16);
		free(g);
	}
	double *FP2 = malloc((size_t)E * 16 + 8), *dFP2 = ct_dev_f64(FP, 2 * (size_t)E), aux2 = -3;
	double *daux2 = ct_dev_f64(&aux2, 1);
	memcpy(FP2, FP, (size_t)E * 16);
	hp_moe_aux_fin(FP, &aux, &acc, E, n, div);
	hp_cuda_moe_aux_fin(dFP, daux, dacc, E, n, div);
	hp_moe_aux_fin(FP2, &aux2, NULL, E, n, div);
	hp_cuda_moe_aux_fin(dFP2, daux2, NULL, E, n, div);
	good &= gpu_ok();
	double *g = ct_host_f64(dFP, 2 * (size_t)E), *ga = ct_host_f64(daux, 1), *gacc = ct_host_f64(dacc, 1);
	double *g2 = ct_host_f64(dFP2, 2 * (size_t)E), *ga2 = ct_host_f64(daux2, 1);
	int fin_same = !memcmp(g, FP, (size_t)E * 16) && !memcmp(ga, &aux, 8) && !memcmp(gacc, &acc, 8) &&
		       !memcmp(g2, FP2, (size_t)E * 16) && !memcmp(ga2, &aux2, 8);
	ok(good && acc_same && fin_same, "moe_aux N=%ld E=%d k=%d: two layers' sums the CPU's bits: %s; the finish, "
	   "aux %.17g and the step's sum %.17g the CPU's bits (and without the sum): %s", N, E, K, yesno(acc_same),
	   aux, acc, yesno(fin_same));

	for (int l = 0; l < 2; l++) {
		hp_cuda_free(doff[l]);
		hp_cuda_free(dprobs[l]);
		free(off[l]);
		free(probs[l]);
	}
	hp_cuda_free(dFP); hp_cuda_free(daux); hp_cuda_free(dacc); hp_cuda_free(dFP2); hp_cuda_free(daux2);
	free(FP); free(FP2); free(g); free(ga); free(gacc); free(g2); free(ga2);
}

/* ---- GPT-OSS: oss.cu against kernels/cpu/oss.c ---- */

static void test_oss(int B, int T, int H, int D, long rows, int I)
{
	size_t no = (size_t)B * T * H * D, nl = (size_t)B * H * T;
	float *out = ct_hfill(no, 61, 1, 0), *lse = ct_hfill(nl, 62, 3, 0), *sinks = ct_hfill((size_t)H, 63, 2, 0);
	float *dout = ct_hfill(no, 64, 1, 0), *ds = calloc((size_t)H, sizeof(float));
	float *d_out = ct_dev(out, no, 0), *d_lse = ct_dev(lse, nl, 0), *d_s = ct_dev(sinks, (size_t)H, 0);
	float *d_do = ct_dev(dout, no, 0), *d_ds = ct_dev(ds, (size_t)H, 0);

	hp_cuda_sinks_fwd(d_out, d_lse, d_s, B, T, H, D);
	hp_cuda_sinks_bwd(d_ds, d_do, d_out, d_lse, d_s, B, T, H, D);
	int ok1 = gpu_ok();
	float *g_out = ct_host(d_out, no, 0), *g_lse = ct_host(d_lse, nl, 0), *g_ds = ct_host(d_ds, (size_t)H, 0);
	hp_attn_sinks_fwd(out, lse, sinks, B, T, H, D);
	hp_attn_sinks_bwd(ds, dout, out, lse, sinks, B, T, H, D);
	double e1 = ct_nerr(g_out, out, no), e2 = ct_nerr(g_lse, lse, nl), e3 = ct_nerr(g_ds, ds, (size_t)H);
	/* exp and log in double on both sides; the sinks' sums in another order */
	ok(ok1 && e1 <= TOL_F32 && e2 <= TOL_F32 && e3 <= TOL_F32, "sinks B=%d T=%d H=%d D=%d: out nerr %.2e, lse "
	   "%.2e, dsinks %.2e", B, T, H, D, e1, e2, e3);

	/* the clamped SwiGLU on [gate | up] rows, and its biases by expert */
	size_t n = (size_t)rows * I;
	float *gu = ct_hfill(2 * n, 65, 2, 0), *dh = ct_hfill(n, 66, 1, 0), *h = malloc(n * sizeof(float));
	float *dgu = malloc(2 * n * sizeof(float)), *bias = ct_hfill((size_t)4 * 2 * I, 67, 1, 0);
	float *db = calloc((size_t)4 * 2 * I, sizeof(float));
	int32_t off[5] = { 0, (int32_t)(rows / 3), (int32_t)(rows / 3), (int32_t)(rows - 2), (int32_t)rows };
	float *d_gu = ct_dev(gu, 2 * n, 0), *d_dh = ct_dev(dh, n, 0), *d_h = ct_dnan(n, 0), *d_dgu = ct_dnan(2 * n, 0);
	float *d_b = ct_dev(bias, (size_t)8 * I, 0), *d_db = ct_dev(db, (size_t)8 * I, 0);
	int32_t *d_off = ct_dev_i32(off, 5);

	hp_cuda_bias_grouped_fwd(d_gu, 2 * I, d_b, (size_t)2 * I, d_off, 4, I, rows);
	hp_cuda_glu_clamp_fwd(d_h, d_gu, d_gu + I, 2 * I, rows, I, 1.702f, 1.5f);
	hp_cuda_glu_clamp_bwd(d_dgu, d_dgu + I, d_dh, d_gu, d_gu + I, 2 * I, rows, I, 1.702f, 1.5f);
	hp_cuda_bias_grouped_bwd(d_db, (size_t)2 * I, d_dgu, 2 * I, d_off, 4, I);
	ok1 = gpu_ok();
	float *g_h = ct_host(d_h, n, 0), *g_dgu = ct_host(d_dgu, 2 * n, 0), *g_db = ct_host(d_db, (size_t)8 * I, 0);
	hp_bias_grouped_fwd(gu, 2 * I, bias, (size_t)2 * I, off, 4, I);
	hp_glu_clamp_fwd(h, gu, gu + I, 2 * I, rows, I, 1.702f, 1.5f);
	hp_glu_clamp_bwd(dgu, dgu + I, dh, gu, gu + I, 2 * I, rows, I, 1.702f, 1.5f);
	hp_bias_grouped_bwd(db, (size_t)2 * I, dgu, 2 * I, off, 4, I);
	e1 = ct_nerr(g_h, h, n), e2 = ct_nerr(g_dgu, dgu, 2 * n), e3 = ct_nerr(g_db, db, (size_t)8 * I);
	ok(ok1 && e1 <= TOL_F32 && e2 <= TOL_F32 && e3 <= TOL_F32, "clamped SwiGLU and grouped biases rows=%ld "
	   "I=%d (an empty expert): h nerr %.2e, dgu %.2e, dbias %.2e", rows, I, e1, e2, e3);

	hp_cuda_free(d_out); hp_cuda_free(d_lse); hp_cuda_free(d_s); hp_cuda_free(d_do); hp_cuda_free(d_ds);
	hp_cuda_free(d_gu); hp_cuda_free(d_dh); hp_cuda_free(d_h); hp_cuda_free(d_dgu); hp_cuda_free(d_b);
	hp_cuda_free(d_db); hp_cuda_free(d_off);
	free(out); free(lse); free(sinks); free(dout); free(ds); free(g_out); free(g_lse); free(g_ds);
	free(gu); free(dh); free(h); free(dgu); free(bias); free(db); free(g_h); free(g_dgu); free(g_db);
}

/* ---- Qwen3-Next / Qwen3.5: gdn.cu against kernels/cpu/gdn.c and deltanet.c ---- */

/* seg of B rows of T: each token's document start; row b has a second
 * document from docs[b] > 0, documents of -docs[b] tokens each for
 * docs[b] < 0, or one document (0) */
static int32_t *gdn_seg(int B, int T, const int *docs)
{
	int32_t *seg = malloc(sizeof(int32_t) * (size_t)B * T);

	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++) {
			int d = docs ? docs[b] : 0;

			seg[(size_t)b * T + t] = d < 0 ? t - t % -d : d && t >= d ? d : 0;
		}
	return seg;
}

/* The bound on the side kernels' and the delta rule's float outputs: the
 * CPU's bits under t/cuemu, which runs gdn.cu's own operations in their
 * order with glibc's exp (only the double sums some outputs come from run
 * in another order: GDN_TOL_SUM); TOL_F32 on a GPU, whose expf, exp and
 * log1pf are not glibc's. */
#define GDN_TOL (ct_emulated() ? 0.0 : TOL_F32)
/* dg and dbeta: sums in double over a chunk's pairs, in another order
 * than deltanet.c's (tri_row, tri_net), rounded to float once: ~1e-16 */
#define GDN_TOL_SUM (ct_emulated() ? 1e-12 : TOL_F32)

/* y = x with every value mapped into [lo, hi) */
static void gdn_range(float *x, size_t n, float lo, float hi)
{
	for (size_t i = 0; i < n; i++)
		x[i] = lo + (hi - lo) * (0.5f + 0.5f * x[i]);
}

/* The side kernels: the conv with documents, l2norm, the gates, the gated
 * norm and both sigmoid gates, each forward and backward. */
static void test_gdn_side(int B, int T, int C, int K, int H, int D, const int *docs)
{
	long N = (long)B * T;
	size_t nx = (size_t)N * C, nw = (size_t)C * K;
	int32_t *seg = gdn_seg(B, T, docs), *d_seg = ct_dev_i32(seg, (size_t)N);
	float *x = ct_hfill(nx, 71, 2, 0), *w = ct_hfill(nw, 72, 0.7f, 0), *dy = ct_hfill(nx, 73, 1, 0);
	float *dw = ct_hfill(nw, 74, 1, 0), *y = malloc(nx * 4), *dx = malloc(nx * 4);
	float *d_x = ct_dev(x, nx, 0), *d_w = ct_dev(w, nw, 0), *d_dy = ct_dev(dy, nx, 0), *d_dw = ct_dev(dw, nw, 0);
	float *d_y = ct_dnan(nx, 0), *d_dx = ct_dnan(nx, 0);

	hp_cuda_conv1d_silu_fwd(d_y, d_x, d_w, docs ? d_seg : NULL, B, T, C, K);
	hp_cuda_conv1d_silu_bwd(d_dx, d_dw, d_dy, d_x, d_w, docs ? d_seg : NULL, B, T, C, K);
	int ok1 = gpu_ok();
	float *g_y = ct_host(d_y, nx, 0), *g_dx = ct_host(d_dx, nx, 0), *g_dw = ct_host(d_dw, nw, 0);
	hp_conv1d_silu_fwd(y, x, w, docs ? seg : NULL, B, T, C, K);
	hp_conv1d_silu_bwd(dx, dw, dy, x, w, docs ? seg : NULL, B, T, C, K);
	double e1 = ct_nerr(g_y, y, nx), e2 = ct_nerr(g_dx, dx, nx), e3 = ct_nerr(g_dw, dw, nw);
	ok(ok1 && e1 <= GDN_TOL && e2 <= GDN_TOL && e3 <= GDN_TOL, "conv1d+SiLU B=%d T=%d C=%d K=%d%s: y nerr %.2e, "
	   "dx %.2e, dw %.2e", B, T, C, K, docs ? " (documents)" : "", e1, e2, e3);
	free(g_y); free(g_dx); free(g_dw);

	/* l2norm over rows of D, and the gated norm (the same rows) */
	size_t nr = (size_t)N * H, nd = nr * D;
	float *q = ct_hfill(nd, 75, 2, 0), *z = ct_hfill(nd, 76, 3, 0), *dq = ct_hfill(nd, 77, 1, 0);
	float *nw2 = ct_hfill((size_t)D, 78, 1, 0), *dnw = ct_hfill((size_t)D, 79, 1, 0);
	float *qn = malloc(nd * 4), *ri = malloc(nr * 4), *dqx = malloc(nd * 4), *dz = malloc(nd * 4);
	float *d_q = ct_dev(q, nd, 0), *d_z = ct_dev(z, nd, 0), *d_dq = ct_dev(dq, nd, 0);
	float *d_nw = ct_dev(nw2, (size_t)D, 0), *d_dnw = ct_dev(dnw, (size_t)D, 0);
	float *d_qn = ct_dnan(nd, 0), *d_ri = ct_dnan(nr, 0), *d_dqx = ct_dnan(nd, 0), *d_dz = ct_dnan(nd, 0);

	hp_cuda_l2norm_fwd(d_qn, d_ri, d_q, (long)nr, D);
	hp_cuda_l2norm_bwd(d_dqx, d_dq, d_qn, d_ri, (long)nr, D);
	ok1 = gpu_ok();
	float *g_qn = ct_host(d_qn, nd, 0), *g_ri = ct_host(d_ri, nr, 0), *g_dqx = ct_host(d_dqx, nd, 0);
	hp_l2norm_fwd(qn, ri, q, (long)nr, D);
	hp_l2norm_bwd(dqx, dq, qn, ri, (long)nr, D);
	/* the same operations in the same order: the same bits */
	ok(ok1 && !ct_ndiff(g_qn, qn, nd) && !ct_ndiff(g_ri, ri, nr) && !ct_ndiff(g_dqx, dqx, nd),
	   "l2norm rows=%zu D=%d: y, rinv and dx the same bits (%zu, %zu, %zu differ)", nr, D, ct_ndiff(g_qn, qn, nd),
	   ct_ndiff(g_ri, ri, nr), ct_ndiff(g_dqx, dqx, nd));
	free(g_qn); free(g_ri); free(g_dqx);

	hp_cuda_rmsnorm_gated_fwd(d_qn, d_ri, d_q, d_z, d_nw, (long)nr, D, 1e-6f);
	hp_cuda_rmsnorm_gated_bwd(d_dqx, d_dz, d_dnw, d_dq, d_q, d_z, d_nw, d_ri, (long)nr, D);
	ok1 = gpu_ok();
	g_qn = ct_host(d_qn, nd, 0), g_ri = ct_host(d_ri, nr, 0), g_dqx = ct_host(d_dqx, nd, 0);
	float *g_dz = ct_host(d_dz, nd, 0), *g_dnw = ct_host(d_dnw, (size_t)D, 0);
	hp_rmsnorm_gated_fwd(qn, ri, q, z, nw2, (long)nr, D, 1e-6f);
	hp_rmsnorm_gated_bwd(dqx, dz, dnw, dq, q, z, nw2, ri, (long)nr, D);
	e1 = ct_nerr(g_qn, qn, nd), e2 = ct_nerr(g_dqx, dqx, nd), e3 = ct_nerr(g_dnw, dnw, (size_t)D);
	double e4 = ct_nerr(g_dz, dz, nd);
	ok(ok1 && e1 <= GDN_TOL && e2 <= GDN_TOL && e3 <= GDN_TOL && e4 <= GDN_TOL && !ct_ndiff(g_ri, ri, nr),
	   "gated RMSNorm rows=%zu D=%d: y nerr %.2e, dx %.2e, dz %.2e, dw %.2e, rstd the same bits", nr, D, e1, e2,
	   e4, e3);
	free(g_qn); free(g_ri); free(g_dqx); free(g_dz); free(g_dnw);

	/* the gates over N x H value heads */
	size_t ng = (size_t)N * H;
	float *bb = ct_hfill(ng, 81, 4, 0), *aa = ct_hfill(ng, 82, 12, 0), *Al = ct_hfill((size_t)H, 83, 2, 0);
	float *dt = ct_hfill((size_t)H, 84, 12, 0), *dbe = ct_hfill(ng, 85, 1, 0), *dg = ct_hfill(ng, 86, 1, 0);
	float *dAl = ct_hfill((size_t)H, 87, 1, 0), *ddt = ct_hfill((size_t)H, 88, 1, 0);
	float *be = malloc(ng * 4), *gg = malloc(ng * 4), *db = malloc(ng * 4), *da = malloc(ng * 4);
	float *d_bb = ct_dev(bb, ng, 0), *d_aa = ct_dev(aa, ng, 0), *d_Al = ct_dev(Al, (size_t)H, 0);
	float *d_dt = ct_dev(dt, (size_t)H, 0), *d_dbe = ct_dev(dbe, ng, 0), *d_dg = ct_dev(dg, ng, 0);
	float *d_dAl = ct_dev(dAl, (size_t)H, 0), *d_ddt = ct_dev(ddt, (size_t)H, 0);
	float *d_be = ct_dnan(ng, 0), *d_gg = ct_dnan(ng, 0), *d_db = ct_dnan(ng, 0), *d_da = ct_dnan(ng, 0);

	hp_cuda_gdn_gates_fwd(d_be, d_gg, d_bb, d_aa, d_Al, d_dt, N, H);
	hp_cuda_gdn_gates_bwd(d_db, d_da, d_dAl, d_ddt, d_dbe, d_dg, d_bb, d_aa, d_Al, d_dt, N, H);
	ok1 = gpu_ok();
	float *g_be = ct_host(d_be, ng, 0), *g_gg = ct_host(d_gg, ng, 0), *g_db = ct_host(d_db, ng, 0);
	float *g_da = ct_host(d_da, ng, 0), *g_dAl = ct_host(d_dAl, (size_t)H, 0), *g_ddt = ct_host(d_ddt, (size_t)H, 0);
	hp_gdn_gates_fwd(be, gg, bb, aa, Al, dt, N, H);
	hp_gdn_gates_bwd(db, da, dAl, ddt, dbe, dg, bb, aa, Al, dt, N, H);
	double eg[6] = { ct_nerr(g_be, be, ng), ct_nerr(g_gg, gg, ng), ct_nerr(g_db, db, ng), ct_nerr(g_da, da, ng),
			 ct_nerr(g_dAl, dAl, (size_t)H), ct_nerr(g_ddt, ddt, (size_t)H) };
	int gok = ok1;
	for (int i = 0; i < 6; i++)
		gok &= eg[i] <= GDN_TOL;
	ok(gok, "delta rule gates N=%ld H=%d (softplus both sides of 20): beta nerr %.2e, g %.2e, db %.2e, da %.2e, "
	   "dA_log %.2e, ddt_bias %.2e", N, H, eg[0], eg[1], eg[2], eg[3], eg[4], eg[5]);
	free(g_be); free(g_gg); free(g_db); free(g_da); free(g_dAl); free(g_ddt);

	/* sigmoid gates: element-wise over nd, and one logit a row of D */
	hp_cuda_sigmoid_gate_fwd(d_qn, d_q, d_z, (long)nd);
	hp_cuda_sigmoid_gate_bwd(d_dqx, d_dz, d_dq, d_q, d_z, (long)nd);
	ok1 = gpu_ok();
	g_qn = ct_host(d_qn, nd, 0), g_dqx = ct_host(d_dqx, nd, 0), g_dz = ct_host(d_dz, nd, 0);
	hp_sigmoid_gate_fwd(qn, q, z, (long)nd);
	hp_sigmoid_gate_bwd(dqx, dz, dq, q, z, (long)nd);
	e1 = ct_nerr(g_qn, qn, nd), e2 = ct_nerr(g_dqx, dqx, nd), e3 = ct_nerr(g_dz, dz, nd);
	ok(ok1 && e1 <= GDN_TOL && e2 <= GDN_TOL && e3 <= GDN_TOL, "sigmoid gate n=%zu: y nerr %.2e, dx %.2e, "
	   "dgate %.2e", nd, e1, e2, e3);
	free(g_qn); free(g_dqx); free(g_dz);
	hp_cuda_sigmoid_gate_rows_fwd(d_qn, d_q, d_z, (long)nr, D);
	hp_cuda_sigmoid_gate_rows_bwd(d_dqx, d_dz, d_dq, d_q, d_z, (long)nr, D);
	ok1 = gpu_ok();
	g_qn = ct_host(d_qn, nd, 0), g_dqx = ct_host(d_dqx, nd, 0), g_dz = ct_host(d_dz, nr, 0);
	hp_sigmoid_gate_rows_fwd(qn, q, z, (long)nr, D);
	hp_sigmoid_gate_rows_bwd(dqx, dz, dq, q, z, (long)nr, D);
	e1 = ct_nerr(g_qn, qn, nd), e2 = ct_nerr(g_dqx, dqx, nd), e3 = ct_nerr(g_dz, dz, nr);
	ok(ok1 && e1 <= GDN_TOL && e2 <= GDN_TOL && e3 <= GDN_TOL, "sigmoid gate by rows T=%zu C=%d: y nerr %.2e, "
	   "dx %.2e, dgate %.2e", nr, D, e1, e2, e3);
	free(g_qn); free(g_dqx); free(g_dz);

	void *dev[] = { d_seg, d_x, d_w, d_dy, d_dw, d_y, d_dx, d_q, d_z, d_dq, d_nw, d_dnw, d_qn, d_ri, d_dqx, d_dz,
			d_bb, d_aa, d_Al, d_dt, d_dbe, d_dg, d_dAl, d_ddt, d_be, d_gg, d_db, d_da };
	void *host[] = { seg, x, w, dy, dw, y, dx, q, z, dq, nw2, dnw, qn, ri, dqx, dz, bb, aa, Al, dt, dbe, dg, dAl,
			 ddt, be, gg, db, da };
	for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
		hp_cuda_free(dev[i]);
	for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
		free(host[i]);
}

/*
 * The chunked delta rule, forward and backward, against deltanet.c's
 * chunked kernel (the same float operations in the same order but for
 * the device's exp and the order of the double sums behind dg and dbeta):
 * out, the saved states and every gradient; the backward run twice gives
 * the same bits.
 */
static void test_gdr(int B, int T, int Hv, int Hk, int Dk, int Dv, const int *docs)
{
	long N = (long)B * T;
	size_t nq = (size_t)N * Hk * Dk, nv = (size_t)N * Hv * Dv, ng = (size_t)N * Hv;
	size_t ns = hp_gdr_saved_floats(B, T, Hv, Dk, Dv), unit = hp_gdr_unit_floats(Dk, Dv);
	size_t nws = (size_t)B * Hv * unit;
	float scale = (float)(1.0 / sqrt((double)Dk));
	int32_t *seg = gdn_seg(B, T, docs), *d_seg = ct_dev_i32(seg, (size_t)N);
	float *q = ct_hfill(nq, 91, 1, 0), *k = ct_hfill(nq, 92, 1, 0), *v = ct_hfill(nv, 93, 1, 0);
	float *g = ct_hfill(ng, 94, 1, 0), *beta = ct_hfill(ng, 95, 1, 0), *dout = ct_hfill(nv, 96, 1, 0);
	float *rq = malloc(N * Hk * 4);

	/* q and k L2-normalised, as the layer feeds them; g in [-1.5, -0.01), beta in (0.05, 0.95) */
	hp_l2norm_fwd(q, rq, q, N * Hk, Dk);
	hp_l2norm_fwd(k, rq, k, N * Hk, Dk);
	gdn_range(g, ng, -1.5f, -0.01f);
	gdn_range(beta, ng, 0.05f, 0.95f);

	float *out = malloc(nv * 4), *saved = malloc(ns * 4), *dq = malloc(nq * 4), *dk = malloc(nq * 4);
	float *dv = malloc(nv * 4), *dg = malloc(ng * 4), *dbeta = malloc(ng * 4);
	float *ws = malloc(hp_gdr_scratch_floats(B, Hv, Dk, Dv) * 4 + 64);
	float *d_q = ct_dev(q, nq, 0), *d_k = ct_dev(k, nq, 0), *d_v = ct_dev(v, nv, 0), *d_g = ct_dev(g, ng, 0);
	float *d_beta = ct_dev(beta, ng, 0), *d_do = ct_dev(dout, nv, 0), *d_ws = ct_dnan(nws, 0);
	float *d_out = ct_dnan(nv, 0), *d_saved = ct_dnan(ns, 0), *d_dq = ct_dnan(nq, 0), *d_dk = ct_dnan(nq, 0);
	float *d_dv = ct_dnan(nv, 0), *d_dg = ct_dnan(ng, 0), *d_dbeta = ct_dnan(ng, 0);
	const int32_t *sg = docs ? d_seg : NULL;

	hp_cuda_gdr_fwd(d_out, d_saved, d_q, d_k, d_v, d_g, d_beta, sg, d_ws, unit, B, T, Hv, Hk, Dk, Dv, scale);
	hp_cuda_gdr_bwd(d_dq, d_dk, d_dv, d_dg, d_dbeta, d_do, d_saved, d_q, d_k, d_v, d_g, d_beta, sg, d_ws, unit, B, T,
			Hv, Hk, Dk, Dv, scale);
	int ok1 = gpu_ok();
	float *g_out = ct_host(d_out, nv, 0), *g_saved = ct_host(d_saved, ns, 0), *g_dq = ct_host(d_dq, nq, 0);
	float *g_dk = ct_host(d_dk, nq, 0), *g_dv = ct_host(d_dv, nv, 0), *g_dg = ct_host(d_dg, ng, 0);
	float *g_dbeta = ct_host(d_dbeta, ng, 0);
	/* again from the same state: the same bits */
	hp_cuda_gdr_bwd(d_dq, d_dk, d_dv, d_dg, d_dbeta, d_do, d_saved, d_q, d_k, d_v, d_g, d_beta, sg, d_ws, unit, B, T,
			Hv, Hk, Dk, Dv, scale);
	float *h_dq = ct_host(d_dq, nq, 0), *h_dk = ct_host(d_dk, nq, 0), *h_dv = ct_host(d_dv, nv, 0);
	float *h_dg = ct_host(d_dg, ng, 0), *h_dbeta = ct_host(d_dbeta, ng, 0);
	int again = gpu_ok() && !ct_ndiff(h_dq, g_dq, nq) && !ct_ndiff(h_dk, g_dk, nq) && !ct_ndiff(h_dv, g_dv, nv) &&
		    !ct_ndiff(h_dg, g_dg, ng) && !ct_ndiff(h_dbeta, g_dbeta, ng);

	const int32_t *hs = docs ? seg : NULL;
	hp_gdr_fwd(out, saved, q, k, v, g, beta, hs, ws, B, T, Hv, Hk, Dk, Dv, scale);
	hp_gdr_bwd(dq, dk, dv, dg, dbeta, dout, saved, q, k, v, g, beta, hs, ws, B, T, Hv, Hk, Dk, Dv, scale);
	double e[7] = { ct_nerr(g_out, out, nv), ct_nerr(g_saved, saved, ns), ct_nerr(g_dq, dq, nq),
			ct_nerr(g_dk, dk, nq), ct_nerr(g_dv, dv, nv), ct_nerr(g_dg, dg, ng), ct_nerr(g_dbeta, dbeta, ng) };
	int good = ok1 && again;
	for (int i = 0; i < 7; i++)
		good &= e[i] <= (i < 5 ? GDN_TOL : GDN_TOL_SUM);
	ok(good, "gated delta rule B=%d T=%d Hv=%d Hk=%d Dk=%d Dv=%d%s: out nerr %.2e, saved %.2e, dq %.2e, dk %.2e, "
	   "dv %.2e, dg %.2e, dbeta %.2e; again the same bits: %s", B, T, Hv, Hk, Dk, Dv,
	   docs ? " (documents)" : "", e[0], e[1], e[2], e[3], e[4], e[5], e[6], yesno(again));

	/* a unit too small for a block's working set: NaN, not a wrong answer */
	hp_cuda_gdr_fwd(d_out, NULL, d_q, d_k, d_v, d_g, d_beta, sg, d_ws, 16, B, T, Hv, Hk, Dk, Dv, scale);
	float *n_out = ct_host(d_out, nv, 0);
	ok(gpu_ok() && isnan(n_out[0]) && isnan(n_out[nv - 1]), "gated delta rule: a scratch unit too small gives NaN");
	hp_cuda_gdr_bwd(d_dq, d_dk, d_dv, d_dg, d_dbeta, d_do, d_saved, d_q, d_k, d_v, d_g, d_beta, sg, d_ws, 16, B, T,
			Hv, Hk, Dk, Dv, scale);
	float *n_dq = ct_host(d_dq, nq, 0), *n_dv = ct_host(d_dv, nv, 0), *n_db = ct_host(d_dbeta, ng, 0);
	ok(gpu_ok() && isnan(n_dq[nq - 1]) && isnan(n_dv[0]) && isnan(n_db[ng - 1]),
	   "gated delta rule backward: a scratch unit too small gives NaN in every gradient");

	void *dev[] = { d_seg, d_q, d_k, d_v, d_g, d_beta, d_do, d_ws, d_out, d_saved, d_dq, d_dk, d_dv, d_dg, d_dbeta };
	void *host[] = { seg, q, k, v, g, beta, dout, rq, out, saved, dq, dk, dv, dg, dbeta, ws, g_out, g_saved, g_dq,
			 g_dk, g_dv, g_dg, g_dbeta, h_dq, h_dk, h_dv, h_dg, h_dbeta, n_out, n_dq, n_dv, n_db };
	for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
		hp_cuda_free(dev[i]);
	for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
		free(host[i]);
}

static void run_all(void)
{
	int big = !ct_small();

	ok(hp_cuda_reserve(1000, &err) == 0, "reserve: the reductions' scratch for rows of 1000");
	test_memory(5);
	test_memory(1001);
	test_memory(65536);
#ifndef HP_CUDA_EMULATED
	test_vm();
#endif
	test_copy2d(1, 5, 5);
	test_copy2d(6, 77, 37);
	if (big)
		test_copy2d(2 * 32, 4096, 1024);

	test_convert(1);
	test_convert(1000);
	test_sum_ranks(1, 1);
	test_sum_ranks(1000, 3);
	test_sum_ranks(70001, 8);
	if (big)
		test_convert((size_t)4096 * 2048 + 5);
	test_adds(1, 1);
	test_adds(7, 1001);
	if (big)
		test_adds(4096, 2048);
	test_oss(2, 33, 4, 16, 37, 29);
	if (big)
		test_oss(2, 2048, 8, 64, 8192, 720);
	{
		int docs[2] = { 10, 70 };

		test_gdn_side(2, 100, 37, 4, 3, 20, docs);
		test_gdn_side(1, 9, 5, 1, 1, 1, NULL);
		test_gdr(2, 100, 4, 2, 16, 8, docs);   /* chunks cut at documents, 2 value heads a key head */
		test_gdr(1, 64, 2, 2, 8, 12, NULL);    /* one whole chunk */
		test_gdr(1, 7, 3, 1, 5, 3, NULL);
		int edges[2] = { 64, -20 };   /* a document from a chunk's start; several in each chunk */

		test_gdr(2, 150, 2, 1, 8, 8, edges);
		test_gdn_side(2, 150, 9, 4, 2, 8, edges);
		if (big) {
			test_gdn_side(2, 2048, 4096, 4, 32, 128, docs);
			test_gdr(1, 1024, 32, 16, 128, 128, NULL);   /* Qwen3-Next's heads */
			test_gdr(2, 2048, 16, 16, 128, 128, docs);   /* Qwen3.5's */
		}
	}
	test_colsum(1, 1);
	test_colsum(5, 1000);
	test_colsum(333, 37);
	test_colsum(3, 9000);    /* wider than the scratch reserved: it grows */
	if (big)
		test_colsum(4096, 4100);
	test_sumsq(0);
	test_sumsq(1);
	test_sumsq(1000);
	if (big)
		test_sumsq((size_t)4096 * 2048 + 5);

	test_embedding(1, 1, 1, 0, 1);
	test_embedding(1000, 1000, 50, 0, 50);
	test_embedding(500, 65, 97, 40, 33);       /* a vocabulary-parallel slice */
	if (big)
		test_embedding(4096, 2048, 3000, 1500, 1500);

	test_rmsnorm(1, 1, 0);
	test_rmsnorm(1, 1000, 1);
	test_rmsnorm(7, 1000, 0);
	test_rmsnorm(33, 64, 0);     /* per-head rows (qk norm) */
	if (big) {
		test_rmsnorm(300, 4100, 1);
		test_rmsnorm(4096, 2048, 1);
		test_rmsnorm(4096, 2048, 0);
		test_rmsnorm(4096L * 32, 128, 0);
	}

	test_rope(1, 1, 2, 1, HP_ROPE_DEFAULT);
	test_rope(5, 3, 64, 16, HP_ROPE_DEFAULT);
	test_rope(100, 7, 96, 300, HP_ROPE_DEFAULT);
	/* every RoPE type: the kernels read the table, so one shape each */
	for (int t = HP_ROPE_LINEAR; t <= HP_ROPE_LLAMA3; t++)
		test_rope(100, 7, 96, 300, (enum hp_rope_type)t);
	if (big)
		test_rope(4096, 32, 128, 4096, HP_ROPE_DEFAULT);
	/* a slice of each head: DeepSeek-V3's q heads (128 + 64, interleaved,
	 * yarn), its one shared k_pe head after the latent (512 + 64), and
	 * rotate_half on an odd slice */
	test_rope_at(100, 7, 192, 128, 64, 1, 300, HP_ROPE_YARN);
	test_rope_at(33, 1, 576, 512, 64, 1, 40, HP_ROPE_DEFAULT);
	test_rope_at(5, 3, 70, 3, 64, 0, 16, HP_ROPE_DEFAULT);
	test_rope_at(1, 1, 2, 0, 2, 1, 1, HP_ROPE_DEFAULT);
	test_heads(37, 4, 8, 20, 28);
	test_heads(300, 128, 64, 192, 576);   /* DeepSeek-V3's: 128 heads of 192, k_rope 64 of 576 */
	if (big)
		test_rope_at(4096, 128, 192, 128, 64, 1, 4096, HP_ROPE_YARN);

	test_swiglu(1, 1);
	test_swiglu(37, 1000);
	if (big) {
		test_swiglu(4096, 768);
		test_swiglu(1024, 5632);
	}

	test_router(1, 8, 2, 1, 0);
	test_router(1000, 8, 2, 0, 0);
	test_router(3, 8, 8, 1, 0);
	if (big) {
		test_router(4096, 128, 8, 1, 0);
		test_router(4096, 128, 8, 0, 0);
	}
	test_router(333, 64, 6, 1, 1);
	test_router(333, 60, 4, 0, 1);
	test_router(50, 200, 8, 1, 1);

	test_router_group(1, 8, 2, 4, 2, 1, 1.0f, 0, 0, 1);
	test_router_group(333, 64, 6, 8, 3, 1, 2.5f, 0, 1, 1);      /* ties, both masks */
	test_router_group(333, 64, 6, 8, 3, 1, 2.5f, 1, 1, 0);
	test_router_group(300, 16, 6, 4, 2, 1, 2.5f, 0, 0, 2);      /* kept c < 0 */
	test_router_group(300, 16, 6, 4, 2, 1, 2.5f, 1, 0, 2);
	test_router_group(100, 64, 6, 1, 1, 1, 1.0f, 0, 0, 1);      /* one group */
	test_router_group(100, 64, 4, 8, 8, 0, 1.5f, 1, 0, 0);      /* every group kept, no norm, no bias */
	test_router_group(50, 200, 8, 100, 40, 1, 1.0f, 0, 0, 1);   /* more groups than lanes */
	test_router_group(9, 7000, 3, 3500, 100, 1, 1.0f, 1, 0, 2);
	test_router_group(20, 8, 8, 4, 2, 1, 1.0f, 0, 0, 1);        /* K = E: masked experts chosen too */
	test_router_group(1000, 256, 8, 8, 4, 1, 2.5f, 0, 0, 1);    /* DeepSeek-V3 */
	if (big) {
		test_router_group(4096, 256, 8, 8, 4, 1, 2.5f, 0, 0, 1);
		test_router_group(4096, 256, 8, 8, 4, 1, 2.5f, 1, 0, 2);
	}

	test_rows(1, 1000, 8, 2);
	test_rows(1000, 1000, 8, 2);
	test_rows(77, 1001, 60, 4);
	test_rows(50, 1002, 8, 2);
	if (big)
		test_rows(2048, 2048, 128, 8);

	test_route(1, 8, 2, 0);
	test_route(0, 8, 2, 0);           /* nothing routed: off all 0 */
	test_route(1000, 8, 2, 1);        /* 1024 chunks of 2 choices */
	test_route(333, 60, 4, 1);
	test_route(50, 200, 8, 0);
	test_route(40, 512, 8, 1);        /* 23 chunks */
	test_route(9, 7000, 3, 1);        /* too wide for the chunks' counts: one thread per expert */
	if (big) {
		test_route(4096, 128, 8, 1);
		test_route(8192, 8, 8, 0);    /* 65536 choices */
		test_route(8192, 512, 8, 1);
	}
	test_aux(1, 8, 2);
	test_aux(333, 60, 4);
	if (big)
		test_aux(4096, 128, 8);
}
#endif

int main(void)
{
#ifdef HP_HAVE_CUDA
	if (!ct_start("cuda memory, element-wise, norm, RoPE, SwiGLU, embedding and MoE routing kernels against the "
		      "CPU kernels"))
		return tap_done();
	hp_err_clear(&err);
	run_all();
	hp_cuda_fini();
#else
	tap_skip("built without CUDA (no nvcc)", "cuda memory, element-wise, norm, RoPE, SwiGLU, embedding and MoE "
		 "routing kernels against the CPU kernels");
#endif
	return tap_done();
}
