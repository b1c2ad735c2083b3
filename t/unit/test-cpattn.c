/*
 * test-cpattn.c - the context-parallel attention kernel (kernels/cpu/cpattn.c)
 * against the eager reference over whole rows (kernels/cpu/attention.c).
 *
 * For each shape the rows of S tokens are cut into nch chunks of Tq = S/nch
 * queries, as context parallelism deals them to ranks: chunk c holds the
 * queries at positions c*Tq .. (c+1)*Tq-1 and every key and value of the
 * rows.  hp_cp_attention_fwd/bwd run on each chunk; the chunks' out, P, lse
 * and dq rows, put back in place, must equal the reference's over the whole
 * rows (hp_attention_fwd_ref/bwd_ref with T = S, lse from a double-precision
 * log-sum-exp), and the SUM over chunks of their dk and dv the reference's
 * dk and dv.  Both forward modes (P saved, lse only) and both backward
 * modes (from P, P recomputed from lse) are checked, and against each
 * other: out and lse must be the same bits whether P is saved or not.  Shapes cover GQA ratios 1, 2, 4, lengths 1 to 256 that are
 * multiples of nothing in particular, 1 to 13 chunks (one-token chunks
 * too), B = 2, one document per row (seg NULL) and packed rows (documents
 * of several lengths crossing chunk boundaries and the forward's 64-key
 * blocks).
 *
 * Each chunk gets copies of k and v whose keys no query of the chunk can
 * see (after its last position, before its first query's document) are NaN:
 * reading one would poison the results.  Its dk and dv must be exactly zero
 * there, and P exactly zero outside the mask.  Outputs and scratch are
 * filled with NaN before each call, so an element left unwritten fails.
 *
 * Tolerance: relative L2 error 1e-5, normalized as in test-flashattn.c (by
 * max(||ref||, 0.1 sqrt(n))); both sides round to float (the reference
 * stores P, dS and the dk/dv accumulators in float, the kernel rescales a
 * float output row between key blocks and the test sums the chunks' dk, dv
 * in float as the ranks' reduction would), so errors are a few 1e-7 while
 * a mask, offset or head-indexing bug is of order 1.  Errors are printed in
 * each line and their maxima at the end.
 */
#include <math.h>

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
	float *p = malloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		p[i] = NAN;
	return p;
}

static float *zeros(size_t n)
{
	return calloc(n ? n : 1, sizeof(float));
}

/* ||a - b|| / max(||b||, 0.1 sqrt(n)) (see test-flashattn.c); NaN gives NaN */
static double rel_l2(const float *a, const float *b, size_t n)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		den += (double)b[i] * b[i];
	}
	if (den < 1e-2 * (double)n)
		den = 1e-2 * (double)n;
	return sqrt(num / den);
}

/* lse[b, h, i] over whole rows in double, straight from the definition. */
static void lse_direct(float *lse, const float *q, const float *k, const int32_t *seg,
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
				lse[((long)b * H + h) * T + i] = (float)(mx + log(sum));
			}
	free(s);
}

/* Packed rows: documents of the lengths below, repeated, cut at S - short
 * ones, ones that cross chunk boundaries, and 70 and 40 tokens long ones
 * that cross the forward's 64-key blocks. */
static void make_seg(int32_t *seg, int B, int S)
{
	static const int even[] = { 3, 1, 5, 2, 9, 70 }, odd[] = { 6, 4, 11, 1, 40 };

	for (int b = 0; b < B; b++) {
		const int *lens = b % 2 ? odd : even;
		int n = b % 2 ? 5 : 6, start = 0, u = 0, end = lens[0];
		for (int i = 0; i < S; i++) {
			while (i >= end) {
				start = end;
				end += lens[++u % n];
			}
			seg[(long)b * S + i] = start;
		}
	}
}

#define TOL 1e-5

static double max_fwd, max_bwd, max_modes;

static double maxd(double a, double b)
{
	return isnan(a) || a > b ? a : b;
}

static void check_shape(int B, int S, int H, int KV, int D, int nch, int packed)
{
	int Tq = S / nch;
	long qs = (long)H * D, ks = (long)KV * D;
	size_t nq = (size_t)B * S * qs, nk = (size_t)B * S * ks, nl = (size_t)B * H * S, nP = nl * S;
	size_t cq = (size_t)B * Tq * qs, cl = (size_t)B * H * Tq, cP = cl * S, nscr = hp_cp_attention_scratch(S);
	float *q = randn(nq), *k = randn(nk), *v = randn(nk), *dout = randn(nq);
	/* the reference over whole rows */
	float *o_ref = malloc(nq * 4), *P_ref = malloc(nP * 4), *lse_ref = malloc(nl * 4);
	float *dq_ref = malloc(nq * 4), *dk_ref = malloc(nk * 4), *dv_ref = malloc(nk * 4);
	float *rscr = malloc((size_t)S * S * 4);
	/* the chunks' results put back in place; dk, dv summed over chunks */
	float *oP = nans(nq), *oL = nans(nq), *Pf = nans(nP), *lf = nans(nl), *dqP = nans(nq), *dqL = nans(nq);
	float *dkP = zeros(nk), *dvP = zeros(nk), *dkL = zeros(nk), *dvL = zeros(nk);
	/* one chunk's inputs and outputs */
	float *qc = malloc(cq * 4), *doc = malloc(cq * 4), *kc = malloc(nk * 4), *vc = malloc(nk * 4);
	float *o1 = nans(cq), *o2 = nans(cq), *o3 = nans(cq), *P1 = nans(cP), *P3 = nans(cP);
	float *l2 = nans(cl), *l3 = nans(cl), *scr = nans(nscr);
	float *dq1 = nans(cq), *dk1 = nans(nk), *dv1 = nans(nk), *dq2 = nans(cq), *dk2 = nans(nk), *dv2 = nans(nk);
	int32_t *seg = packed ? malloc((size_t)B * S * sizeof(int32_t)) : NULL;
	int32_t *segc = packed ? malloc((size_t)B * Tq * sizeof(int32_t)) : NULL;
	int same = 1, unread = 1, pmask = 1;
	char what[96];

	if (seg)
		make_seg(seg, B, S);
	snprintf(what, sizeof(what), "B=%d S=%d H=%d KV=%d D=%d %d chunk%s of %d%s", B, S, H, KV, D,
		 nch, nch > 1 ? "s" : "", Tq, packed ? " packed" : "");
	hp_attention_fwd_ref(o_ref, P_ref, q, k, v, seg, B, S, H, KV, D);
	hp_attention_bwd_ref(dq_ref, dk_ref, dv_ref, dout, P_ref, q, k, v, seg, rscr, B, S, H, KV, D);
	lse_direct(lse_ref, q, k, seg, B, S, H, KV, D);

	for (int c = 0; c < nch; c++) {
		int q0 = c * Tq;
		for (int b = 0; b < B; b++) {
			/* keys this chunk's queries can see in row b: lo .. q0+Tq-1 */
			int lo = seg ? seg[(long)b * S + q0] : 0;
			memcpy(qc + (long)b * Tq * qs, q + ((long)b * S + q0) * qs, sizeof(float) * Tq * qs);
			memcpy(doc + (long)b * Tq * qs, dout + ((long)b * S + q0) * qs, sizeof(float) * Tq * qs);
			if (segc)
				memcpy(segc + (long)b * Tq, seg + (long)b * S + q0, sizeof(int32_t) * Tq);
			for (int j = 0; j < S; j++)
				for (long x = 0; x < ks; x++) {
					long at = ((long)b * S + j) * ks + x;
					kc[at] = j < lo || j >= q0 + Tq ? NAN : k[at];
					vc[at] = j < lo || j >= q0 + Tq ? NAN : v[at];
				}
		}
		hp_cp_attention_fwd(o1, P1, NULL, qc, kc, vc, segc, B, Tq, S, q0, H, KV, D);
		hp_cp_attention_fwd(o2, NULL, l2, qc, kc, vc, segc, B, Tq, S, q0, H, KV, D);
		hp_cp_attention_fwd(o3, P3, l3, qc, kc, vc, segc, B, Tq, S, q0, H, KV, D);
		same &= !memcmp(o1, o3, cq * 4) && !memcmp(o2, o3, cq * 4) && !memcmp(P1, P3, cP * 4) && !memcmp(l2, l3, cl * 4);
		hp_cp_attention_bwd(dq1, dk1, dv1, doc, NULL, P1, NULL, qc, kc, vc, segc, scr,
				    B, Tq, S, q0, H, KV, D);
		hp_cp_attention_bwd(dq2, dk2, dv2, doc, o2, NULL, l2, qc, kc, vc, segc, scr,
				    B, Tq, S, q0, H, KV, D);

		for (int b = 0; b < B; b++) {
			int lo = seg ? seg[(long)b * S + q0] : 0;
			memcpy(oP + ((long)b * S + q0) * qs, o1 + (long)b * Tq * qs, sizeof(float) * Tq * qs);
			memcpy(oL + ((long)b * S + q0) * qs, o2 + (long)b * Tq * qs, sizeof(float) * Tq * qs);
			memcpy(dqP + ((long)b * S + q0) * qs, dq1 + (long)b * Tq * qs, sizeof(float) * Tq * qs);
			memcpy(dqL + ((long)b * S + q0) * qs, dq2 + (long)b * Tq * qs, sizeof(float) * Tq * qs);
			for (int h = 0; h < H; h++) {
				long f = ((long)b * H + h) * S + q0, r = ((long)b * H + h) * Tq;
				memcpy(Pf + f * S, P1 + r * S, sizeof(float) * Tq * S);
				memcpy(lf + f, l2 + r, sizeof(float) * Tq);
			}
			for (int j = 0; j < S; j++)
				for (long x = 0; x < ks; x++) {
					long at = ((long)b * S + j) * ks + x;
					if (j < lo || j >= q0 + Tq)
						unread &= dk1[at] == 0 && dv1[at] == 0 && dk2[at] == 0 && dv2[at] == 0;
					dkP[at] += dk1[at], dvP[at] += dv1[at];
					dkL[at] += dk2[at], dvL[at] += dv2[at];
				}
		}
	}
	for (int b = 0; b < B; b++)
		for (int h = 0; h < H; h++)
			for (int i = 0; i < S; i++) {
				const float *pr = Pf + (((long)b * H + h) * S + i) * S;
				int j0 = seg ? seg[(long)b * S + i] : 0;
				for (int j = 0; j < S; j++)
					if (j < j0 || j > i)
						pmask &= pr[j] == 0;
			}

	double eo1 = rel_l2(oP, o_ref, nq), eP = rel_l2(Pf, P_ref, nP);
	double eo2 = rel_l2(oL, o_ref, nq), el = rel_l2(lf, lse_ref, nl);
	double eq1 = rel_l2(dqP, dq_ref, nq), ek1 = rel_l2(dkP, dk_ref, nk), ev1 = rel_l2(dvP, dv_ref, nk);
	double eq2 = rel_l2(dqL, dq_ref, nq), ek2 = rel_l2(dkL, dk_ref, nk), ev2 = rel_l2(dvL, dv_ref, nk);
	double mq = rel_l2(dqL, dqP, nq), mk = rel_l2(dkL, dkP, nk), mv = rel_l2(dvL, dvP, nk);
	double mo = rel_l2(oL, oP, nq);
	ok(eo1 < TOL && eP < TOL && pmask, "forward with P, %s: out and P match (%.1e %.1e), P is 0 outside the mask",
	   what, eo1, eP);
	ok(eo2 < TOL && el < TOL, "forward with lse only, %s: out and lse match (%.1e %.1e)", what, eo2, el);
	ok(same, "forward with P and lse at once, %s: the same out, P and lse bits as with one of them", what);
	ok(eq1 < TOL && ek1 < TOL && ev1 < TOL,
	   "backward from P, %s: dq and the chunks' summed dk dv match (%.1e %.1e %.1e)", what, eq1, ek1, ev1);
	ok(eq2 < TOL && ek2 < TOL && ev2 < TOL,
	   "backward from lse, %s: dq and the chunks' summed dk dv match (%.1e %.1e %.1e)", what, eq2, ek2, ev2);
	ok(mo < TOL && mq < TOL && mk < TOL && mv < TOL,
	   "%s: lse mode equals P mode, out dq dk dv (%.1e %.1e %.1e %.1e)", what, mo, mq, mk, mv);
	ok(unread, "%s: keys no query of a chunk sees are not read (NaN there) and get dk = dv = 0", what);
	max_fwd = maxd(max_fwd, maxd(maxd(eo1, eP), maxd(eo2, el)));
	max_bwd = maxd(max_bwd, maxd(maxd(maxd(eq1, ek1), maxd(ev1, eq2)), maxd(ek2, ev2)));
	max_modes = maxd(max_modes, maxd(maxd(mo, mq), maxd(mk, mv)));

	free(q); free(k); free(v); free(dout); free(o_ref); free(P_ref); free(lse_ref); free(dq_ref);
	free(dk_ref); free(dv_ref); free(rscr); free(oP); free(oL); free(Pf); free(lf); free(dqP);
	free(dqL); free(dkP); free(dvP); free(dkL); free(dvL); free(qc); free(doc); free(kc); free(vc);
	free(o1); free(o2); free(o3); free(P1); free(P3); free(l2); free(l3); free(scr); free(dq1);
	free(dk1); free(dv1); free(dq2); free(dk2); free(dv2); free(seg); free(segc);
}

int main(void)
{
	static const int shapes[][6] = {        /* B, S, H, KV, D, chunks */
		{ 1, 1, 2, 2, 8, 1 },           /* one token */
		{ 1, 13, 4, 4, 8, 1 },
		{ 2, 13, 4, 2, 8, 13 },         /* one-token chunks */
		{ 2, 12, 4, 1, 16, 3 },
		{ 1, 12, 2, 2, 5, 2 },
		{ 2, 37, 8, 2, 16, 1 },
		{ 2, 64, 8, 8, 32, 2 },
		{ 1, 64, 4, 1, 64, 4 },
		{ 1, 150, 4, 2, 24, 3 },        /* visible ranges over 64 keys: several forward blocks */
		{ 2, 256, 8, 2, 64, 4 },
	};

	tap_diag("scratch for S = 256: %zu floats", hp_cp_attention_scratch(256));
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
		for (int packed = 0; packed < 2; packed++)
			check_shape(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4],
				    shapes[s][5], packed);
	tap_diag("largest relative L2 errors: forward %.1e, backward %.1e, lse mode vs P mode %.1e",
		 max_fwd, max_bwd, max_modes);
	return tap_done();
}
