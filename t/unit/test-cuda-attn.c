/*
 * test-cuda-attn.c - the CUDA flash attention (kernels/cuda/attn.cu,
 * flashattn.cu at head_dims 64 and 128, attnsmall.cu at the others)
 * against the CPU flash kernel (kernels/cpu/flashattn.c, fp32), forward
 * (out, lse) and backward (dq, dk, dv), causal and with packed documents,
 * over GQA ratios 1, 2, 4, 8 and lengths off the 64-row tile (T = 1, 77,
 * 300) as well as on it (T = 1024); then the backward's determinism (two
 * runs, the same bits) and a timing of both directions at T = 4096 (a
 * diagnostic, never a verdict).  Inputs are rounded to bf16 on the host
 * first, so the reference sees what the GPU sees.  Skips without a CUDA
 * build or a GPU; under t/cuemu only the small head dims run.
 *
 * The backward is tested on its own: both sides get the reference's out
 * (rounded to bf16, the GPU's storage) and lse, so a forward error does not
 * show up again in dq, dk, dv.  Outputs are filled with NaN before each
 * call, so an element left unwritten fails its comparison.
 *
 * Padded queries: the CUDA backend runs a context-parallel chunk of Tq
 * queries at q0 as flash attention over the row prefix of q0 + Tq tokens,
 * the q0 queries before the chunk padded and marked with lse +inf
 * (hp_cuda_fill_inf, the chunk's lse put in with hp_cuda_copy2d).  Those
 * rows must add exactly nothing to dK and dV: the test gives them random
 * q, zero dout (as the backend) and NaN out (so their Di is NaN, which a
 * product with a zero probability would spread), and compares with the
 * CPU's context-parallel backward (kernels/cpu/cpattn.c) of the chunk
 * alone.
 */
#include <math.h>

#include "cpu/ops.h"
#include "tap.h"

#define WHAT "cuda flash attention against the CPU flash kernel"

#ifdef HP_HAVE_CUDA
#include <cuda_runtime.h>

#include "cudatest.h"

/* out (bf16): P is rounded to bf16 to enter the tensor cores (2^-9
 * relative per weight, random signs) and out once more when stored, ~2e-3
 * normalised together; a mask, rescaling or indexing bug gives O(1). */
#define TOL_OUT 8e-3
/* lse (fp32): the same bf16 inputs with exact products, only the order of
 * the fp32 sums and the exp2/log approximations differ (~1e-7 expected) */
#define TOL_LSE 1e-4
/* dq, dk, dv (bf16): fp32 sums over up to T * Hq/Hkv terms of products
 * whose P and dS factors were rounded to bf16 for the tensor cores, then
 * one bf16 rounding of the result: 2e-3 to 5e-3 expected. */
#define TOL_GRAD 1e-2
/* Gradient errors are normalised by max(||ref||, GRAD_FLOOR sqrt(n)): at
 * T = 1 (and for one-token documents) dq and dk are 0 in exact arithmetic
 * and both sides return fp32 rounding noise (~1e-8), which is measured
 * against an rms of 1e-3 rather than against itself; every other case has
 * gradient rms above 1e-2, where the floor plays no part. */
#define GRAD_FLOOR 1e-3

static struct hp_err err;

struct acase {
	int B, T, Hq, Hkv, D;
};

static float *vec(size_t n, unsigned seed, float a)
{
	float *x = malloc(n * sizeof(float) + 4);

	ct_fill(x, n, seed, a);
	ct_round(x, n);
	return x;
}

/* ||got - want|| / max(||want||, GRAD_FLOOR sqrt(n)) (see GRAD_FLOOR) */
static double grad_err(const float *got, const float *want, size_t n)
{
	return ct_nerr_floor(got, want, n, GRAD_FLOOR * sqrt((double)n));
}

/* Packed documents: each row cut into documents of lengths cycling through
 * a list that puts starts on and off the 64-row tiles, one-token documents
 * and documents longer than a tile; rows start at different places in the
 * list. */
static void make_seg(int32_t *seg, int B, int T)
{
	static const int lens[] = { 64, 1, 37, 129, 3, 250, 66, 17, 1, 190 };
	int nl = (int)(sizeof(lens) / sizeof(lens[0]));

	for (int b = 0; b < B; b++) {
		int start = 0, li = b % nl;
		while (start < T) {
			int end = start + lens[li] < T ? start + lens[li] : T;
			for (int i = start; i < end; i++)
				seg[(long)b * T + i] = start;
			start = end;
			li = (li + 1) % nl;
		}
	}
}

/* raw bf16 bits of a device buffer (synchronises) */
static hp_bf16 *bits(const void *d, size_t n)
{
	hp_bf16 *h = malloc(n * 2 + 2);

	hp_cuda_download(h, d, n * 2, &err);
	return h;
}

static void test_case(struct acase c, int packed)
{
	int B = c.B, T = c.T, H = c.Hq, KV = c.Hkv, D = c.D;
	size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D, nl = (size_t)B * H * T;
	/* q, k of amplitude 2: scores of rms ~1.3, a softmax far from flat */
	float *q = vec(nq, 1, 2.0f), *k = vec(nk, 2, 2.0f), *v = vec(nk, 3, 1.0f), *dout = vec(nq, 4, 1.0f);
	float *out = malloc(nq * 4 + 4), *lse = malloc(nl * 4 + 4);
	float *dq = malloc(nq * 4 + 4), *dk = malloc(nk * 4 + 4), *dv = malloc(nk * 4 + 4);
	size_t ncs = hp_flash_attention_scratch(T, H, D);
	float *cs = ncs ? malloc(ncs * 4) : NULL;
	int32_t *seg = NULL, *segd = NULL;
	char what[128];

	snprintf(what, sizeof(what), "B=%d T=%d Hq=%d Hkv=%d D=%d %s", B, T, H, KV, D,
		 packed == 2 ? "packed, sliding window 48" : packed ? "packed" : "causal");
	if (packed) {
		seg = malloc((size_t)B * T * sizeof(int32_t));
		make_seg(seg, B, T);
		/* a sliding window is a later first key, still non-decreasing
		 * (lib/model/model.c, window_lows): across the 64-row tiles */
		for (long i = 0; packed == 2 && i < (long)B * T; i++)
			if (seg[i] < i % T - 47)
				seg[i] = (int32_t)(i % T - 47);
		segd = ct_dev_i32(seg, (size_t)B * T);
	}

	/* forward */
	hp_flash_attention_fwd(out, lse, q, k, v, seg, B, T, H, KV, D);
	void *qd = ct_dev(q, nq, 1), *kd = ct_dev(k, nk, 1), *vd = ct_dev(v, nk, 1), *dod = ct_dev(dout, nq, 1);
	void *od = ct_dnan(nq, 1), *ld = ct_dnan(nl, 0);
	hp_cuda_flash_fwd(od, ld, qd, kd, vd, segd, B, T, H, KV, D);
	int rc = hp_cuda_sync(&err);
	float *og = ct_host(od, nq, 1), *lg = ct_host(ld, nl, 0);
	double eo = ct_nerr(og, out, nq), el = ct_nerr(lg, lse, nl);
	ok(!rc && eo <= TOL_OUT && el <= TOL_LSE, "fwd %s: err out %.2e lse %.2e%s%s", what, eo, el,
	   rc ? ": " : "", rc ? err.msg : "");

	/* backward, both sides from the reference's out (as bf16) and lse */
	ct_round(out, nq);
	hp_flash_attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, seg, cs, B, T, H, KV, D);
	hp_cuda_free(od);
	hp_cuda_free(ld);
	od = ct_dev(out, nq, 1);
	ld = ct_dev(lse, nl, 0);
	void *dqd = ct_dnan(nq, 1), *dkd = ct_dnan(nk, 1), *dvd = ct_dnan(nk, 1);
	float *scr = hp_cuda_alloc(hp_cuda_flash_scratch(B, T, H) * sizeof(float) + 4, &err);
	hp_cuda_flash_bwd(dqd, dkd, dvd, dod, od, ld, qd, kd, vd, segd, scr, B, T, H, KV, D);
	rc = hp_cuda_sync(&err);
	float *dqg = ct_host(dqd, nq, 1), *dkg = ct_host(dkd, nk, 1), *dvg = ct_host(dvd, nk, 1);
	double eq = grad_err(dqg, dq, nq), ek = grad_err(dkg, dk, nk), ev = grad_err(dvg, dv, nk);
	ok(!rc && eq <= TOL_GRAD && ek <= TOL_GRAD && ev <= TOL_GRAD,
	   "bwd %s: err dq %.2e dk %.2e dv %.2e%s%s", what, eq, ek, ev, rc ? ": " : "", rc ? err.msg : "");

	/* determinism: a second backward, into fresh NaN buffers, gives the
	 * same bits */
	hp_bf16 *b1q = bits(dqd, nq), *b1k = bits(dkd, nk), *b1v = bits(dvd, nk);
	hp_cuda_free(dqd);
	hp_cuda_free(dkd);
	hp_cuda_free(dvd);
	dqd = ct_dnan(nq, 1);
	dkd = ct_dnan(nk, 1);
	dvd = ct_dnan(nk, 1);
	hp_cuda_flash_bwd(dqd, dkd, dvd, dod, od, ld, qd, kd, vd, segd, scr, B, T, H, KV, D);
	rc = hp_cuda_sync(&err);
	hp_bf16 *b2q = bits(dqd, nq), *b2k = bits(dkd, nk), *b2v = bits(dvd, nk);
	ok(!rc && !memcmp(b1q, b2q, nq * 2) && !memcmp(b1k, b2k, nk * 2) && !memcmp(b1v, b2v, nk * 2),
	   "bwd %s: two runs give the same bits", what);

	free(b1q); free(b1k); free(b1v); free(b2q); free(b2k); free(b2v);
	free(og); free(lg); free(dqg); free(dkg); free(dvg);
	hp_cuda_free(qd); hp_cuda_free(kd); hp_cuda_free(vd); hp_cuda_free(dod); hp_cuda_free(od);
	hp_cuda_free(ld); hp_cuda_free(dqd); hp_cuda_free(dkd); hp_cuda_free(dvd); hp_cuda_free(scr);
	hp_cuda_free(segd);
	free(q); free(k); free(v); free(dout); free(out); free(lse); free(dq); free(dk); free(dv);
	free(cs); free(seg);
}

/* fill_inf: n floats of +inf, nothing past them */
static void test_fill_inf(size_t n)
{
	float *d = ct_dnan(n + 1, 0), *h;
	int good;

	hp_cuda_fill_inf(d, n);
	h = ct_host(d, n + 1, 0);
	good = !hp_cuda_sync(&err) && isnan(h[n]);
	for (size_t i = 0; i < n; i++)
		good &= h[i] == INFINITY;
	ok(good, "fill_inf n=%zu: +inf, the next float untouched", n);
	free(h);
	hp_cuda_free(d);
}

struct pcase {
	int B, Tq, q0, Hq, Hkv, D;
};

/* rows [B, Tq, w] at offset q0 of rows [B, L, w], the q0 before them fill */
static float *pad_rows(const float *x, int B, int Tq, int q0, size_t w, float fill)
{
	size_t L = (size_t)q0 + Tq;
	float *y = malloc((size_t)B * L * w * 4 + 4);

	for (int b = 0; b < B; b++) {
		for (size_t i = 0; i < (size_t)q0 * w; i++)
			y[(size_t)b * L * w + i] = fill;
		memcpy(y + ((size_t)b * L + q0) * w, x + (size_t)b * Tq * w, (size_t)Tq * w * 4);
	}
	return y;
}

static void test_padded(struct pcase c, int packed)
{
	int B = c.B, Tq = c.Tq, q0 = c.q0, H = c.Hq, KV = c.Hkv, D = c.D, L = q0 + Tq;
	size_t QD = (size_t)H * D, KD = (size_t)KV * D;
	size_t nq = (size_t)B * Tq * QD, nk = (size_t)B * L * KD, nl = (size_t)B * H * Tq;
	size_t nqL = (size_t)B * L * QD, nlL = (size_t)B * H * L;
	float *q = vec(nq, 11, 2.0f), *k = vec(nk, 12, 2.0f), *v = vec(nk, 13, 1.0f), *dout = vec(nq, 14, 1.0f);
	float *qpad = vec(nqL, 15, 2.0f);   /* the padded queries: random, finite */
	float *out = malloc(nq * 4 + 4), *lse = malloc(nl * 4 + 4);
	float *dq = malloc(nq * 4 + 4), *dk = malloc(nk * 4 + 4), *dv = malloc(nk * 4 + 4);
	float *cs = malloc(hp_cp_attention_scratch(L) * 4 + 4);
	int32_t *seg = NULL, *segc = NULL, *segd = NULL;
	char what[128];

	snprintf(what, sizeof(what), "B=%d chunk of %d at %d Hq=%d Hkv=%d D=%d %s", B, Tq, q0, H, KV, D,
		 packed ? "packed" : "causal");
	/* seg: the chunk's document starts (positions in the row), the padded
	 * queries' 0, as the backend sets them */
	if (packed) {
		seg = malloc((size_t)B * L * sizeof(int32_t));
		segc = malloc((size_t)B * Tq * sizeof(int32_t));
		make_seg(seg, B, L);
		for (int b = 0; b < B; b++) {
			memcpy(segc + (size_t)b * Tq, seg + (size_t)b * L + q0, (size_t)Tq * sizeof(int32_t));
			memset(seg + (size_t)b * L, 0, (size_t)q0 * sizeof(int32_t));
		}
		segd = ct_dev_i32(seg, (size_t)B * L);
	}
	/* the reference: the chunk alone against its rows' L keys */
	hp_cp_attention_fwd(out, NULL, lse, q, k, v, segc, B, Tq, L, q0, H, KV, D);
	ct_round(out, nq);
	hp_cp_attention_bwd(dq, dk, dv, dout, out, NULL, lse, q, k, v, segc, cs, B, Tq, L, q0, H, KV, D);

	/* the prefix layout: q the chunk after random rows, out after NaN rows,
	 * dout after zero rows; lse +inf, then the chunk's in its place */
	for (int b = 0; b < B; b++)
		memcpy(qpad + ((size_t)b * L + q0) * QD, q + (size_t)b * Tq * QD, (size_t)Tq * QD * 4);
	float *opad = pad_rows(out, B, Tq, q0, QD, NAN), *dpad = pad_rows(dout, B, Tq, q0, QD, 0.0f);
	void *qd = ct_dev(qpad, nqL, 1), *kd = ct_dev(k, nk, 1), *vd = ct_dev(v, nk, 1);
	void *od = ct_dev(opad, nqL, 1), *dod = ct_dev(dpad, nqL, 1);
	float *lsed = ct_dev(lse, nl, 0), *lL = ct_dnan(nlL, 0);
	void *dqd = ct_dnan(nqL, 1), *dkd = ct_dnan(nk, 1), *dvd = ct_dnan(nk, 1);
	float *scr = ct_alloc(hp_cuda_flash_scratch(B, L, H) * sizeof(float) + 4);

	hp_cuda_fill_inf(lL, nlL);
	hp_cuda_copy2d(lL + q0, (size_t)L * 4, lsed, (size_t)Tq * 4, (size_t)Tq * 4, (size_t)B * H);
	hp_cuda_flash_bwd(dqd, dkd, dvd, dod, od, lL, qd, kd, vd, segd, scr, B, L, H, KV, D);
	int rc = hp_cuda_sync(&err);
	float *dqg = ct_host(dqd, nqL, 1), *dkg = ct_host(dkd, nk, 1), *dvg = ct_host(dvd, nk, 1);
	float *dqc = calloc(nq + 1, 4);
	int padzero = 1;
	for (int b = 0; b < B; b++) {
		memcpy(dqc + (size_t)b * Tq * QD, dqg + ((size_t)b * L + q0) * QD, (size_t)Tq * QD * 4);
		for (size_t i = 0; i < (size_t)q0 * QD; i++)
			padzero &= dqg[(size_t)b * L * QD + i] == 0.0f;
	}
	double eq = grad_err(dqc, dq, nq), ek = grad_err(dkg, dk, nk), ev = grad_err(dvg, dv, nk);
	ok(!rc && eq <= TOL_GRAD && ek <= TOL_GRAD && ev <= TOL_GRAD && padzero,
	   "bwd %s, padded queries lse +inf: err dq %.2e dk %.2e dv %.2e, padded dq rows zero: %s%s%s", what, eq, ek,
	   ev, padzero ? "yes" : "no", rc ? ": " : "", rc ? err.msg : "");

	hp_cuda_free(qd); hp_cuda_free(kd); hp_cuda_free(vd); hp_cuda_free(od); hp_cuda_free(dod);
	hp_cuda_free(lsed); hp_cuda_free(lL); hp_cuda_free(dqd); hp_cuda_free(dkd); hp_cuda_free(dvd);
	hp_cuda_free(scr); hp_cuda_free(segd);
	free(q); free(k); free(v); free(dout); free(qpad); free(out); free(lse); free(dq); free(dk); free(dv);
	free(cs); free(seg); free(segc); free(opad); free(dpad); free(dqg); free(dkg); free(dvg); free(dqc);
}

/* A call that breaks the preconditions (head_dim 300; Hq not a multiple of
 * Hkv) fills its outputs with NaN, as the CPU kernel does. */
static void test_invalid(void)
{
	int T = 5, n = T * 3 * 300;         /* the largest tensor here: [T, 3 * 300] */
	float *x = calloc((size_t)n, 4), *og, *lg;
	void *d = ct_dev(x, (size_t)n, 1), *o = hp_cuda_alloc((size_t)n * 2, &err);
	void *l = hp_cuda_alloc((size_t)n * 4, &err), *g = hp_cuda_alloc((size_t)n * 2, &err);
	int nan = 1;

	hp_cuda_flash_fwd(o, l, d, d, d, NULL, 1, T, 3, 1, 300);
	og = ct_host(o, (size_t)T * 3 * 300, 1);
	lg = ct_host(l, (size_t)3 * T, 0);
	for (int i = 0; i < T * 3 * 300; i++)
		nan &= og[i] != og[i];
	for (int i = 0; i < 3 * T; i++)
		nan &= lg[i] != lg[i];
	free(og);
	/* dq [T, 3 * 64], then dk and dv [T, 2 * 64] */
	hp_cuda_flash_bwd(o, g, g, d, d, l, d, d, d, NULL, NULL, 1, T, 3, 2, 64);
	og = ct_host(o, (size_t)T * 3 * 64, 1);
	for (int i = 0; i < T * 3 * 64; i++)
		nan &= og[i] != og[i];
	ok(nan && !hp_cuda_sync(&err), "flash fwd at head_dim 300, bwd at Hq 3 Hkv 2: NaN outputs");
	free(og);
	free(lg);
	free(x);
	hp_cuda_free(d);
	hp_cuda_free(o);
	hp_cuda_free(l);
	hp_cuda_free(g);
}

/* ms = milliseconds per call of `call` over reps calls on the backend's
 * stream, after one warm-up call (cudaEvent timing) */
#define TIME_MS(ms, reps, call) do { \
	cudaEvent_t e0_, e1_; \
	cudaStream_t st_ = (cudaStream_t)hp_cuda_stream(); \
	float t_ = 0; \
	call; \
	cudaEventCreate(&e0_); \
	cudaEventCreate(&e1_); \
	cudaEventRecord(e0_, st_); \
	for (int r_ = 0; r_ < (reps); r_++) \
		call; \
	cudaEventRecord(e1_, st_); \
	cudaEventSynchronize(e1_); \
	cudaEventElapsedTime(&t_, e0_, e1_); \
	cudaEventDestroy(e0_); \
	cudaEventDestroy(e1_); \
	(ms) = t_ / (reps); \
} while (0)

/* Achieved TFLOP/s at a training-sized shape: a diagnostic line only. */
static void bench(int B, int T, int H, int KV, int D)
{
	size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D, nl = (size_t)B * H * T;
	float *q = vec(nq, 5, 2.0f), *k = vec(nk, 6, 2.0f), *v = vec(nk, 7, 1.0f), *dout = vec(nq, 8, 1.0f);
	void *qd = ct_dev(q, nq, 1), *kd = ct_dev(k, nk, 1), *vd = ct_dev(v, nk, 1), *dod = ct_dev(dout, nq, 1);
	void *od = hp_cuda_alloc(nq * 2, &err), *ld = hp_cuda_alloc(nl * 4, &err);
	void *dqd = hp_cuda_alloc(nq * 2, &err), *dkd = hp_cuda_alloc(nk * 2, &err), *dvd = hp_cuda_alloc(nk * 2, &err);
	float *scr = hp_cuda_alloc(hp_cuda_flash_scratch(B, T, H) * sizeof(float) + 4, &err);
	/* causal: half of the T x T scores, 2 GEMMs of 2 flops per multiply-add */
	double flops = 4.0 * B * T * (double)T * H * D / 2, fms = 0, bms = 0;

	if (!od || !ld || !dqd || !dkd || !dvd || !scr) {
		tap_diag("bench: %s", err.msg);
	} else {
		TIME_MS(fms, 5, hp_cuda_flash_fwd(od, ld, qd, kd, vd, NULL, B, T, H, KV, D));
		TIME_MS(bms, 5, hp_cuda_flash_bwd(dqd, dkd, dvd, dod, od, ld, qd, kd, vd, NULL, scr,
						  B, T, H, KV, D));
		int rc = hp_cuda_sync(&err);
		tap_diag("flash B=%d T=%d Hq=%d Hkv=%d D=%d causal: fwd %.3f ms %.1f TFLOP/s, "
			 "bwd %.3f ms %.1f TFLOP/s%s%s", B, T, H, KV, D, fms, flops / (fms * 1e9),
			 bms, 2.5 * flops / (bms * 1e9), rc ? ": " : "", rc ? err.msg : "");
	}
	hp_cuda_free(qd); hp_cuda_free(kd); hp_cuda_free(vd); hp_cuda_free(dod); hp_cuda_free(od);
	hp_cuda_free(ld); hp_cuda_free(dqd); hp_cuda_free(dkd); hp_cuda_free(dvd); hp_cuda_free(scr);
	free(q); free(k); free(v); free(dout);
}
#endif

int main(void)
{
#ifndef HP_HAVE_CUDA
	tap_skip("built without CUDA (no nvcc)", WHAT);
#else
	static const struct acase cases[] = {
		{ 1, 1, 1, 1, 64 }, { 2, 77, 4, 2, 64 }, { 1, 300, 8, 1, 128 }, { 2, 1024, 16, 4, 128 },
		/* the other head dims: attnsmall.cu's one-thread-per-row kernels */
		{ 2, 77, 4, 2, 16 }, { 1, 50, 8, 2, 8 }, { 1, 129, 4, 4, 96 },
	};
	static const struct pcase pcases[] = {
		{ 2, 37, 40, 4, 2, 16 }, { 1, 50, 14, 8, 2, 8 }, { 1, 64, 65, 4, 4, 96 },
		/* the tensor cores: chunks on and off the 64-row tiles */
		{ 2, 100, 156, 8, 2, 64 }, { 1, 77, 300, 4, 1, 128 }, { 1, 64, 64, 4, 2, 128 },
	};
	int emulated = ct_emulated();

	if (!ct_start(WHAT))
		return tap_done();
	hp_err_clear(&err);
	ok(hp_cuda_flash_supports(64) && hp_cuda_flash_supports(128) && hp_cuda_flash_supports(8) &&
	   hp_cuda_flash_supports(256) && !hp_cuda_flash_supports(0) && !hp_cuda_flash_supports(257),
	   "attention supports head_dim 1 to 256 (tensor cores at 64 and 128)");
	test_invalid();
	test_fill_inf(1);
	test_fill_inf(1001);
	/* HP_CUDA_EMULATED (t/cuemu): head dims 64 and 128 (mma.sync) and the bench are not emulated */
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		for (int packed = 0; packed < 3; packed++)
			if (!emulated || (cases[i].D != 64 && cases[i].D != 128))
				test_case(cases[i], packed);
	for (size_t i = 0; i < sizeof(pcases) / sizeof(pcases[0]); i++)
		for (int packed = 0; packed < 2; packed++)
			if (!emulated || (pcases[i].D != 64 && pcases[i].D != 128))
				test_padded(pcases[i], packed);
	if (!emulated)
		bench(1, 4096, 32, 4, 128);
	hp_cuda_fini();
#endif
	return tap_done();
}
