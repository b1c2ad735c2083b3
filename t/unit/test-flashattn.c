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
	return tap_urand(&rng_state);
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

/* x to float, then to bf16 (nearest even) and back */
static float bf16r(double x)
{
	float f = (float)x;
	uint32_t u;

	memcpy(&u, &f, 4);
	u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
	memcpy(&f, &u, 4);
	return f;
}

/*
 * The GPU's roundings (hp_flash_attention_*_round, the CUDA emulation's
 * bf16 mode): against an eager reference that rounds the same values - P
 * before P V, P and dS before the backward's products - in one key tile
 * (T <= 64, so the forward's running max is the row's max and P is
 * rounded against it, as the tile kernel does).  The rounded kernel must
 * sit far closer to the rounded reference than to the unrounded kernel:
 * rounding P moves the outputs by about 2^-9 / sqrt(keys) relative, the
 * two sides' other roundings (float sums, a 2-ulp exp that can flip a rare
 * bf16 tie) by 1e-6; a ratio of 0.1 leaves room for both and fails if the
 * rounding is missing or in the wrong place.
 */
static void test_round(void)
{
	int T = 48, H = 4, KV = 2, D = 16, G = H / KV;
	size_t nq = (size_t)T * H * D, nk = (size_t)T * KV * D;
	float *q = randn(nq), *k = randn(nk), *v = randn(nk), *dout = randn(nq), *lse = malloc(T * H * 4);
	float *o[2], *dq[2], *dk[2], *dv[2], *ro = calloc(nq, 4), *rdq = calloc(nq, 4), *rdk = calloc(nk, 4),
	      *rdv = calloc(nk, 4);
	float scale = 1.0f / sqrtf((float)D);

	for (int r = 0; r < 2; r++) {
		o[r] = malloc(nq * 4), dq[r] = malloc(nq * 4), dk[r] = malloc(nk * 4), dv[r] = malloc(nk * 4);
		(r ? hp_flash_attention_fwd_round : hp_flash_attention_fwd)(o[r], lse, q, k, v, NULL, 1, T, H, KV, D);
		(r ? hp_flash_attention_bwd_round : hp_flash_attention_bwd)(dq[r], dk[r], dv[r], dout, o[r], lse, q, k,
									  v, NULL, NULL, 1, T, H, KV, D);
	}
	for (int h = 0; h < H; h++) {
		int kh = h / G;
		for (int i = 0; i < T; i++) {
			double S[64], P[64], m = -INFINITY, l = 0, Di = 0;
			const float *qi = q + ((size_t)i * H + h) * D, *doi = dout + ((size_t)i * H + h) * D;
			float *oi = ro + ((size_t)i * H + h) * D;
			for (int j = 0; j <= i; j++) {
				const float *kj = k + ((size_t)j * KV + kh) * D;
				S[j] = 0;
				for (int d = 0; d < D; d++)
					S[j] += (double)qi[d] * kj[d];
				S[j] = (float)(S[j] * scale);
				m = fmax(m, S[j]);
			}
			for (int j = 0; j <= i; j++)
				l += P[j] = exp(S[j] - m);
			for (int j = 0; j <= i; j++)
				for (int d = 0; d < D; d++)
					oi[d] += (float)(bf16r(P[j]) * (double)v[((size_t)j * KV + kh) * D + d] / l);
			for (int d = 0; d < D; d++)
				Di += (double)doi[d] * oi[d];
			for (int j = 0; j <= i; j++) {
				const float *kj = k + ((size_t)j * KV + kh) * D, *vj = v + ((size_t)j * KV + kh) * D;
				double p = P[j] / l, dp = 0;
				for (int d = 0; d < D; d++)
					dp += (double)doi[d] * vj[d];
				float pr = bf16r(p), dsr = bf16r((float)p * (float)(dp - Di));
				for (int d = 0; d < D; d++) {
					rdv[((size_t)j * KV + kh) * D + d] += pr * doi[d];
					rdq[((size_t)i * H + h) * D + d] += scale * dsr * kj[d];
					rdk[((size_t)j * KV + kh) * D + d] += scale * dsr * qi[d];
				}
			}
		}
	}
	const char *names[] = { "out", "dq", "dk", "dv" };
	float *got[] = { o[1], dq[1], dk[1], dv[1] }, *unr[] = { o[0], dq[0], dk[0], dv[0] },
	      *ref[] = { ro, rdq, rdk, rdv };
	size_t ns[] = { nq, nq, nk, nk };
	for (int t = 0; t < 4; t++) {
		double near = tap_rel_l2(got[t], ref[t], ns[t], 0), far = tap_rel_l2(got[t], unr[t], ns[t], 0);
		ok(far > 1e-4 && near < 0.1 * far, "rounded flash %s: %.2e from the rounded eager reference, %.2e "
		   "from the unrounded kernel", names[t], near, far);
	}
	for (int r = 0; r < 2; r++)
		free(o[r]), free(dq[r]), free(dk[r]), free(dv[r]);
	free(q); free(k); free(v); free(dout); free(lse); free(ro); free(rdq); free(rdk); free(rdv);
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
	test_round();
	test_supports();
	bench();
	return tap_done();
}
