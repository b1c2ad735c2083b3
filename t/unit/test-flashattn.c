/*
 * test-flashattn.c - the tiled flash attention (kernels/cpu/flashattn.c)
 * against the eager reference (kernels/cpu/attention.c), forward and
 * backward, causal and packed, over GQA ratios 1, 2, 4, 8, head_dims 8 to
 * 128 and lengths around the 64-row tile; then a timing and memory
 * comparison with the BLAS eager kernels (a diagnostic, not a verdict;
 * HP_FLASH_BENCH_T=N changes its length, 0 skips it).
 *
 * Tolerance: relative L2 error 1e-5 for out, lse, dq, dk and dv
 * (tap_rel_l2, t/tap.h).  Both sides round to float: the reference sums
 * dot products in double but stores P, dS and the dk/dv accumulators in
 * float (T x group terms each); the flash kernel sums its tile products in
 * float (head_dim terms for a score, 64 for a tile of P V), rescales
 * running sums and uses a 2-ulp exp.  Independent roundings add like a
 * random walk, sqrt(n) u for n terms summed (u = 2^-24): the longest sums
 * here, dk and dv over 257 queries times a group of 8, give 45 u = 2.7e-6,
 * the others less, so 1e-5 bounds them (printed in each line) while an
 * indexing, mask or rescaling bug (an error of order 1) cannot pass.  Each
 * error is normalized by the scale its rounding follows, never by a norm
 * that can cancel: out by max(||out||, rms(v) sqrt(n)), since out is a
 * convex combination of rows of v (its rounding is relative to |v|) while
 * its own norm shrinks as 1/sqrt(keys) by averaging; dq, dk and dv by
 * max(own norm, rms of the whole gradient (dq, dk, dv together) x
 * sqrt(n)), since where every query sees a single key (T = 1) dq and dk
 * are exactly 0 in exact arithmetic (the softmax of one score is constant)
 * and both kernels return rounding noise of order 1e-7, which the floor
 * measures against the gradient's scale rather than against itself; lse
 * by its own norm (the N(0, 1) score itself for one key, about log(keys)
 * above the scores for more: never small by cancellation).  The lse
 * check is against a double-precision log-sum-exp over the scores the mask
 * keeps.  Outputs are filled with NaN before each call, so an element left
 * unwritten fails the comparison.
 */
#include <math.h>
#include <time.h>

#include "cpu/gemm.h"
#include "cpu/ops.h"
#include "tap.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double urand(void)
{
	/* xorshift64*: deterministic, good enough for test data; in (0, 1) */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return ((double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) + 0.5) / 9007199254740992.0;
}

/* N(0, 1) by Box-Muller: q . k / sqrt(D) is then N(0, 1), scores are O(1). */
static float *randn(size_t n)
{
	float *p = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		p[i] = (float)(sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand()));
	return p;
}

static float *nans(size_t n)
{
	float *p = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		p[i] = NAN;
	return p;
}

/* lse[b, h, i] in double, straight from the definition. */
static void lse_direct(double *lse, const float *q, const float *k, const int32_t *seg,
		       int B, int T, int H, int KV, int D)
{
	double scale = 1.0 / sqrt((double)D), *s = malloc(sizeof(double) * T);

	for (int b = 0; b < B; b++)
		for (int h = 0; h < H; h++)
			for (int i = 0; i < T; i++) {
				const float *qi = q + ((long)b * T + i) * H * D + h * D;
				int j0 = seg ? seg[(long)b * T + i] : 0;
				double mx = -INFINITY, sum = 0;
				for (int j = j0; j <= i; j++) {
					const float *kj = k + ((long)b * T + j) * KV * D + h / (H / KV) * D;
					double d = 0;
					for (int x = 0; x < D; x++)
						d += (double)qi[x] * kj[x];
					s[j] = d * scale;
					mx = s[j] > mx ? s[j] : mx;
				}
				for (int j = j0; j <= i; j++)
					sum += exp(s[j] - mx);
				lse[((long)b * H + h) * T + i] = mx + log(sum);
			}
	free(s);
}

/* Packed rows, cut at T: even rows hold documents of lengths 1, 5, 70, 1
 * and the rest (one-token documents, boundaries inside and across tiles);
 * odd rows 2 and the rest, so that the key tiles of every later query tile
 * start 2 past a tile boundary and the diagonal tile straddles two query
 * tiles. */
static void make_seg(int32_t *seg, int B, int T)
{
	static const int even[] = { 1, 5, 70, 1, 1 << 30 }, odd[] = { 2, 1 << 30 };

	for (int b = 0; b < B; b++) {
		const int *lens = b % 2 ? odd : even;
		int start = 0, u = 0, end = lens[0];
		for (int i = 0; i < T; i++) {
			while (i >= end) {
				start = end;
				end += lens[++u];
			}
			seg[(long)b * T + i] = start;
		}
	}
}

#define TOL 1e-5

static void check_shape(int B, int T, int H, int KV, int D, int packed)
{
	size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D, nl = (size_t)B * H * T;
	size_t nP = (size_t)B * H * T * T;
	float *q = randn(nq), *k = randn(nk), *v = randn(nk), *dout = randn(nq);
	float *o_ref = malloc(nq * 4), *P = malloc(nP * 4), *scr = malloc((size_t)T * T * 4);
	float *dq_ref = malloc(nq * 4), *dk_ref = malloc(nk * 4), *dv_ref = malloc(nk * 4);
	float *o = nans(nq), *lse = nans(nl), *dq = nans(nq), *dk = nans(nk), *dv = nans(nk);
	float *lse_ref = malloc(nl * 4), *fscr = nans(hp_flash_attention_scratch(T, H, D) + 1);
	double *lse_d = malloc(nl * sizeof(double));
	int32_t *seg = packed ? malloc((size_t)B * T * sizeof(int32_t)) : NULL;
	char what[96];

	if (seg)
		make_seg(seg, B, T);
	snprintf(what, sizeof(what), "B=%d T=%d H=%d KV=%d D=%d%s", B, T, H, KV, D, packed ? " packed" : "");
	hp_attention_fwd_ref(o_ref, P, q, k, v, seg, B, T, H, KV, D);
	hp_attention_bwd_ref(dq_ref, dk_ref, dv_ref, dout, P, q, k, v, seg, scr, B, T, H, KV, D);
	lse_direct(lse_d, q, k, seg, B, T, H, KV, D);
	for (size_t i = 0; i < nl; i++)
		lse_ref[i] = (float)lse_d[i];

	hp_flash_attention_fwd(o, lse, q, k, v, seg, B, T, H, KV, D);
	hp_flash_attention_bwd(dq, dk, dv, dout, o, lse, q, k, v, seg, fscr, B, T, H, KV, D);
	/* the floors (top of the file): v's rms for out, the whole gradient's for dq, dk, dv */
	const float *vv[1] = { v }, *gr[3] = { dq_ref, dk_ref, dv_ref };
	size_t nv[1] = { nk }, ng[3] = { nq, nk, nk };
	double rv = tap_rms(1, vv, nv), rg = tap_rms(3, gr, ng);
	double eo = tap_rel_l2(o, o_ref, nq, tap_floor(rv, nq)), el = tap_rel_l2(lse, lse_ref, nl, 0);
	double eq = tap_rel_l2(dq, dq_ref, nq, tap_floor(rg, nq)), ek = tap_rel_l2(dk, dk_ref, nk, tap_floor(rg, nk));
	double ev = tap_rel_l2(dv, dv_ref, nk, tap_floor(rg, nk));
	ok(eo < TOL && el < TOL, "forward %s: out and lse match (%.1e %.1e)", what, eo, el);
	ok(eq < TOL && ek < TOL && ev < TOL, "backward %s: dq dk dv match (%.1e %.1e %.1e)",
	   what, eq, ek, ev);

	free(q); free(k); free(v); free(dout); free(o_ref); free(P); free(scr); free(dq_ref);
	free(dk_ref); free(dv_ref); free(o); free(lse); free(dq); free(dk); free(dv); free(lse_ref);
	free(fscr); free(lse_d); free(seg);
}

/* Run forward and backward of one shape into res[0..4] (out, lse, dq, dk, dv). */
static void run_flash(float *res[5], const float *q, const float *k, const float *v, const float *dout,
		      const int32_t *seg, int B, int T, int H, int KV, int D)
{
	size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D, nl = (size_t)B * H * T;

	res[0] = nans(nq), res[1] = nans(nl), res[2] = nans(nq), res[3] = nans(nk), res[4] = nans(nk);
	hp_flash_attention_fwd(res[0], res[1], q, k, v, seg, B, T, H, KV, D);
	hp_flash_attention_bwd(res[2], res[3], res[4], dout, res[0], res[1], q, k, v, seg, NULL,
			       B, T, H, KV, D);
}

static int same_bits(float *x[5], float *y[5], int B, int T, int H, int KV, int D)
{
	size_t n[5] = { (size_t)B * T * H * D, (size_t)B * H * T, (size_t)B * T * H * D,
			(size_t)B * T * KV * D, (size_t)B * T * KV * D };
	int same = 1;

	for (int i = 0; i < 5; i++) {
		same &= !memcmp(x[i], y[i], n[i] * sizeof(float));
		free(y[i]);
	}
	return same;
}

/*
 * The result must not depend on the thread count (1 against 3, a count that
 * does not divide the work, on the first shape) nor on the compiled version the CPU picks:
 * HP_CPU=avx2 and =baseline cap it (on a CPU without AVX-512 or AVX2 the
 * capped runs repeat the one available, and the check is vacuous).  Head
 * dims 48 and 8 reach the 16-column edge of the AVX-512 product and the
 * one-vector rows; T = 150 and 97 the partial tiles.
 */
static void test_bits(void)
{
	static const int shapes[][5] = { { 2, 150, 8, 2, 48 }, { 1, 97, 4, 1, 8 } };
	const char *caps[] = { "avx2", "baseline" };

	for (int s = 0; s < 2; s++) {
		int B = shapes[s][0], T = shapes[s][1], H = shapes[s][2], KV = shapes[s][3], D = shapes[s][4];
		size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D;
		float *q = randn(nq), *k = randn(nk), *v = randn(nk), *dout = randn(nq), *ref[5], *x[5];
		int32_t *seg = malloc((size_t)B * T * sizeof(int32_t));

		make_seg(seg, B, T);
		hp_attention_set_threads(1);
		run_flash(ref, q, k, v, dout, seg, B, T, H, KV, D);
		if (s == 0) {
			/* 17M and 87M multiply-adds: above the threading threshold (8M) */
			hp_attention_set_threads(3);
			run_flash(x, q, k, v, dout, seg, B, T, H, KV, D);
			ok(same_bits(ref, x, B, T, H, KV, D),
			   "D=%d: 1 and 3 threads give bit-identical out, lse, dq, dk, dv", D);
		}
		hp_attention_set_threads(0);
		for (int c = 0; c < 2; c++) {
			setenv("HP_CPU", caps[c], 1);
			run_flash(x, q, k, v, dout, seg, B, T, H, KV, D);
			unsetenv("HP_CPU");
			ok(same_bits(ref, x, B, T, H, KV, D), "D=%d: HP_CPU=%s gives the same bits as the default", D, caps[c]);
		}
		for (int i = 0; i < 5; i++)
			free(ref[i]);
		free(q); free(k); free(v); free(dout); free(seg);
	}
}

static void test_supports(void)
{
	float o[4], l[1], x[4] = { 1, 2, 3, 4 }, big[600], lb[1];

	ok(hp_flash_attention_supports(1) && hp_flash_attention_supports(HP_FLASH_ATTENTION_MAX_HEAD_DIM) &&
	   !hp_flash_attention_supports(0) && !hp_flash_attention_supports(HP_FLASH_ATTENTION_MAX_HEAD_DIM + 1),
	   "head_dim 1..%d is supported, 0 and above are not", HP_FLASH_ATTENTION_MAX_HEAD_DIM);
	/* head_dim 4 with one token: out = v, lse = q.k / 2, exactly: q.k = 30
	 * and the scale 1/2 are exact in float, the one exp is exp(0) = 1 and
	 * its log 0, and 1 * v is v, so no operation rounds */
	hp_flash_attention_fwd(o, l, x, x, x, NULL, 1, 1, 1, 1, 4);
	ok(o[0] == 1 && o[3] == 4 && l[0] == 15.0f, "one token: out = v, lse = q.k/sqrt(D), exactly");
	/* an unsupported head_dim is the caller's bug: NaN out, no overrun */
	for (int i = 0; i < 600; i++)
		big[i] = 1;
	hp_flash_attention_fwd(big, lb, big, big, big, NULL, 1, 1, 1, 1, 600);
	ok(isnan(big[0]) && isnan(big[599]) && isnan(lb[0]), "head_dim 600: the outputs are NaN");
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Timing and memory against the BLAS eager kernels at a training-like size. */
static void bench(void)
{
	int B = 1, T = 2048, H = 16, KV = 4, D = 64;
	const char *env = getenv("HP_FLASH_BENCH_T");

	if (env && *env)
		T = atoi(env);
	if (T <= 0) {
		tap_diag("timing skipped (HP_FLASH_BENCH_T=%s)", env);
		return;
	}
	size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D, nl = (size_t)B * H * T;
	size_t nP = (size_t)B * H * T * T, nscr = (size_t)T * T, nfs = hp_flash_attention_scratch(T, H, D);
	float *q = randn(nq), *k = randn(nk), *v = randn(nk), *dout = randn(nq);
	float *o1 = malloc(nq * 4), *o2 = malloc(nq * 4), *P = malloc(nP * 4), *scr = malloc(nscr * 4);
	float *lse = malloc(nl * 4), *fscr = malloc(nfs * 4 + 4);
	float *dq1 = malloc(nq * 4), *dk1 = malloc(nk * 4), *dv1 = malloc(nk * 4);
	float *dq2 = malloc(nq * 4), *dk2 = malloc(nk * 4), *dv2 = malloc(nk * 4);
	double t0, tbf = 1e30, tbb = 1e30, tff = 1e30, tfb = 1e30;

	/* best of two: the first BLAS forward also pays for faulting in P */
	for (int rep = 0; rep < 2; rep++) {
		t0 = now();
		hp_cpu_ops_blas.attention_fwd(o1, P, q, k, v, NULL, B, T, H, KV, D);
		tbf = fmin(tbf, now() - t0);
		t0 = now();
		hp_cpu_ops_blas.attention_bwd(dq1, dk1, dv1, dout, P, q, k, v, NULL, scr, B, T, H, KV, D);
		tbb = fmin(tbb, now() - t0);
		t0 = now();
		hp_flash_attention_fwd(o2, lse, q, k, v, NULL, B, T, H, KV, D);
		tff = fmin(tff, now() - t0);
		t0 = now();
		hp_flash_attention_bwd(dq2, dk2, dv2, dout, o2, lse, q, k, v, NULL, fscr, B, T, H, KV, D);
		tfb = fmin(tfb, now() - t0);
	}
	tap_diag("B=%d T=%d H=%d KV=%d D=%d, %d threads, best of 2:", B, T, H, KV, D, hp_sgemm_threads());
	tap_diag("  blas  fwd %.3f s  bwd %.3f s  total %.3f s  saved P %.1f MiB + bwd scratch %.1f MiB",
		 tbf, tbb, tbf + tbb, nP * 4 / 1048576.0, nscr * 4 / 1048576.0);
	tap_diag("  flash fwd %.3f s  bwd %.3f s  total %.3f s  saved lse %.3f MiB + bwd scratch %.3f MiB",
		 tff, tfb, tff + tfb, nl * 4 / 1048576.0, nfs * 4 / 1048576.0);
	tap_diag("  flash/blas time %.2f (fwd %.2f, bwd %.2f); flash vs blas rel L2: out %.1e dq %.1e dk %.1e dv %.1e",
		 (tff + tfb) / (tbf + tbb), tff / tbf, tfb / tbb, tap_rel_l2(o2, o1, nq, 0),
		 tap_rel_l2(dq2, dq1, nq, 0), tap_rel_l2(dk2, dk1, nk, 0), tap_rel_l2(dv2, dv1, nk, 0));
	free(q); free(k); free(v); free(dout); free(o1); free(o2); free(P); free(scr); free(lse);
	free(fscr); free(dq1); free(dk1); free(dv1); free(dq2); free(dk2); free(dv2);
}

int main(void)
{
	static const int shapes[][5] = {        /* B, T, H, KV, D */
		{ 1, 1, 4, 4, 8 }, { 2, 7, 4, 2, 8 }, { 1, 63, 8, 8, 16 }, { 1, 64, 8, 4, 16 },
		{ 1, 65, 8, 1, 24 }, { 2, 130, 8, 2, 64 }, { 1, 257, 16, 2, 128 },
	};

	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
		for (int packed = 0; packed < 2; packed++)
			check_shape(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4], packed);
	/* head_dims off the 16-float padding, and a tile of 32 rows (D > 128) */
	check_shape(1, 70, 2, 1, 5, 1);
	check_shape(2, 100, 4, 2, 200, 1);
	test_bits();
	test_supports();
	bench();
	return tap_done();
}
