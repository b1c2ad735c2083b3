/*
 * cpattn.c - causal GQA attention of one context-parallel chunk of queries
 * against every key of their rows, forward and backward, F32.
 *
 * Under context parallelism a rank holds the queries at positions
 * q0 .. q0+Tq-1 of rows of S tokens and, after an all-gather, all S keys
 * and values.  The function is attention_fwd/attention_bwd's (HF eager
 * semantics, query head h reads kv head h / (Hq/Hkv) by index, the seg
 * block-diagonal causal mask of packed rows) restricted to the chunk's
 * query rows: the query at position p sees keys seg..p, where seg is the
 * position in the row where its document starts.  Only those keys are
 * read, so a chunk late in the row costs more than an early one.
 *
 * The computation is the flash kernel's (kernels/cpu/flashattn.c; read its
 * header first), with the query tiles offset by q0 in the row.  The tile
 * machinery the two share lives in attntile.h and attntile.c: the tile
 * sizes, products and copies, the query lanes and mask, the whole forward
 * of a query tile (at_fwd_tile, here with q0 and the scores into P), the
 * compiled versions and the threads.  What stays here: the chunk offset q0
 * and the keys of the whole row, P (its probabilities in the forward, its
 * use in the backward), the backward, and the scalar fallback.
 *
 * Forward, per (batch, head, query tile of TB rows): key tiles from the
 * tile's earliest document start to its last position, scores computed
 * transposed (S^T = K Q^T, one vector lane per query), online softmax in
 * float with a running max m and a double sum l per query, the output
 * rescaled when m grows; lse = m + log(l), out = O / l.  When P is given,
 * its rows receive the scaled, masked scores of each key tile (-inf where
 * masked) and at the end P = exp(score - m) / l (so exactly 0 outside the
 * mask); P is written beside the computation, never read back by it, so
 * out and lse are the same bits with or without P.
 *
 * Backward, per (batch, kv head) - dk, dv of that head and dq of the query
 * heads of its group, so that work items write disjoint outputs - query
 * tiles outer and key tiles inner: Q, Q^T, dO, dO^T are built once per
 * query tile, K and V rows copied per key tile, and with the transposed
 * tiles (key rows, query lanes)
 *   P^T  = exp(scale K Q^T - lse)  (or P's entries, masked)
 *   dP^T = V dO^T                  dS^T = P^T * (dP^T - Di)
 *   dV  += P^T dO                  dK  += dS^T Q      dQ += dS K
 * with Di = rowsum(dO * O) when recomputing from lse (the flash identity)
 * and Di = rowsum(dP * P) when P is given (then out may be NULL): one more
 * pass over the query tile's key tiles, dP^T = V dO^T against P^T, before
 * the main one.  dQ accumulates on the stack for the query tile and is
 * scaled when written; dK and dV accumulate in dk and dv themselves, a
 * tile product at a time (dk scaled at the end), in a fixed order.  dk and
 * dv are this chunk's contributions to every key of the rows (zero for the
 * keys no query of the chunk sees); the caller sums them over the ranks.
 *
 * Exactness and determinism: the tile products are the flash kernel's
 * (each element one float sum in k order), compiled for AVX-512, AVX2 and
 * baseline x86-64 and picked per call (HP_CPU=avx2 or baseline caps the
 * version, HP_NO_CLONES builds only the baseline one, as for the flash
 * kernel); every output element is computed by one thread in a fixed
 * order, so the results are bit-identical for any thread count and
 * version.  They match the eager kernels to float rounding
 * (t/unit/test-cpattn.c pins 1e-5 relative L2).
 *
 * Threads: the items - (batch, head, query tile) in the forward, heaviest
 * first, (batch, kv head) in the backward - go through an atomic counter
 * (hp_attntile_run) to hp_attntile_threads() threads (hp_sgemm_threads(),
 * or what hp_attention_set_threads fixed), when the call is large enough
 * to pay for starting them.  The backward has only B * Hkv items.
 *
 * Head dims above AT_MAX_HEAD_DIM, or Hq not a multiple of Hkv, go to the
 * plain scalar loops at the end of the file (double-precision dot
 * products per (query, key); they need hp_cp_attention_scratch(S) floats
 * of scratch, the tiled kernel none).
 */
#include <math.h>
#include <stdlib.h>

#include "cpu/attntile.h"
#include "cpu/ops.h"
#include "cpu/vec.h"

/* Keys per block of the scalar fallback's online softmax. */
#define CP_BLOCK 64

size_t hp_cp_attention_scratch(int S)
{
	return 2 * (size_t)(S > 0 ? S : 0);   /* the scalar fallback's probability and dS rows */
}

/* ---- rows of dk, dv, dq ---- */

/* dst[d] += src[d] for d < D (dst a row of dk or dv, D floats). */
AT_INLINE void cp_add_row(float *dst, const float *src, int D)
{
	int d = 0;

	for (; d + 8 <= D; d += 8)
		hp_v8_store(dst + d, hp_v8_load(dst + d) + hp_v8_load(src + d));
	for (; d < D; d++)
		dst[d] += src[d];
}

/* dst[d] = k * src[d] for d < D. */
AT_INLINE void cp_scale_row(float *dst, const float *src, float k, int D)
{
	int d = 0;

	for (; d + 8 <= D; d += 8)
		hp_v8_store(dst + d, hp_v8_set1(k) * hp_v8_load(src + d));
	for (; d < D; d++)
		dst[d] = k * src[d];
}

/* In a transposed tile t[c][r] (kc rows of rp lanes, key c0 + c), replace
 * the entries of (key, query) pairs the mask hides by `fill`. */
AT_INLINE void cp_mask(float *t, int kc, int rp, int c0, const int32_t *first, const int32_t *last, float fill)
{
	for (int c = 0; c < kc; c++) {
		float *s = t + (long)c * rp;
		hp_v8i jv = { c0 + c, c0 + c, c0 + c, c0 + c, c0 + c, c0 + c, c0 + c, c0 + c };
		for (int r = 0; r < rp; r += 8)
			hp_v8_store(s + r, at_mask8(hp_v8_load(s + r), jv, first + r, last + r, fill));
	}
}

/* ---- work items ---- */

struct cp_args {
	/* forward */
	float *out, *P_out, *lse_out;
	/* backward */
	float *dq, *dk, *dv;
	const float *dout, *o, *P, *lse;
	/* both */
	const float *q, *k, *v;
	const int32_t *seg;
	int B, Tq, S, q0, H, KV, D;
};

/* Forward of (batch b, head h, query tile qt), the last tile of a row
 * (the most keys) first: at_fwd_tile with the query rows at positions
 * q0 + r0 + r and, when P is given, the scores written to it, then turned
 * into probabilities here. */
AT_INLINE void cp_fwd_body(const struct cp_args *a, long item, int isa)
{
	int Tq = a->Tq, S = a->S, q0 = a->q0, H = a->H, D = a->D, TB = at_tile(D);
	int nqt = (Tq + TB - 1) / TB, qt = nqt - 1 - (int)(item % nqt);
	int h = (int)(item / nqt % H), b = (int)(item / nqt / H), kh = h / (H / a->KV);
	long qs = (long)H * D, ks = (long)a->KV * D, row = ((long)b * Tq + qt * TB) * qs + h * D;
	long lrow = ((long)b * H + h) * Tq + qt * TB;
	struct at_fwd t = {
		.q = a->q + row, .k = a->k + (long)b * S * ks + kh * D, .v = a->v + (long)b * S * ks + kh * D,
		.sg = a->seg ? a->seg + (long)b * Tq : NULL, .out = a->out + row,
		.lse = a->lse_out ? a->lse_out + lrow : NULL, .P = a->P_out ? a->P_out + lrow * S : NULL,
		.qs = qs, .ks = ks, .ldp = S, .r0 = qt * TB, .rows = Tq - qt * TB < TB ? Tq - qt * TB : TB,
		.q0 = q0, .D = D,
	};
	/* the keys the tile sees: see at_fwd_tile */
	int klo = t.sg ? t.sg[t.r0] : 0, khi = q0 + t.r0 + t.rows - 1;
	float m[AT_MAX_TB];
	double l[AT_MAX_TB];

	at_fwd_tile(&t, m, l, isa);
	for (int r = 0; t.P && r < t.rows; r++) {
		/* P = exp(score - m) / l on klo..khi (0 where masked), 0 elsewhere */
		float *pr = t.P + (long)r * S;
		double inv = 1.0 / l[r];
		hp_v8 mv = hp_v8_set1(m[r]), iv = hp_v8_set1((float)inv);
		int j = klo;
		memset(pr, 0, sizeof(float) * (size_t)klo);
		for (; j + 8 <= khi + 1; j += 8)
			hp_v8_store(pr + j, hp_vexp(hp_v8_load(pr + j) - mv) * iv);
		if (j <= khi)
			hp_v8_store_part(pr + j, hp_vexp(hp_v8_load_part(pr + j, khi + 1 - j, -INFINITY) - mv) * iv,
					 khi + 1 - j);
		memset(pr + khi + 1, 0, sizeof(float) * (size_t)(S - 1 - khi));
	}
}

/* P^T of a (key tile, query tile) pair into Pt[kc][rp]: recomputed from
 * lse (Qt the query tile transposed, Kp the key rows, L the lanes' lse),
 * or gathered from P's rows (Prow the tile's first row); 0 where masked
 * and in padding lanes. */
AT_INLINE void cp_probs(float *Pt, const struct cp_args *a, const float *Prow, const float *Qt, const float *Kp,
			const float *L, int rows, int rp, int c0, int kc, int full, const int32_t *first,
			const int32_t *last, int isa)
{
	int D = a->D, Dp = at_dpad(D);

	if (Prow) {
		for (int r = 0; r < rows; r++) {
			const float *pr = Prow + (long)r * a->S + c0;
			for (int c = 0; c < kc; c++)
				Pt[(long)c * rp + r] = pr[c];
		}
		for (int c = 0; c < kc; c++)
			for (int r = rows; r < rp; r++)
				Pt[(long)c * rp + r] = 0;
		if (!full)
			cp_mask(Pt, kc, rp, c0, first, last, 0.0f);
		return;
	}
	at_mm(isa, kc, rp, D, Kp, Dp, 1, Qt, rp, Pt, rp, 0);
	at_scores(Pt, kc, rp, c0, 1.0f / sqrtf((float)D), full, first, last, NULL);
	for (int c = 0; c < kc; c++) {
		float *s = Pt + (long)c * rp;
		for (int r = 0; r < rp; r += 8)
			hp_v8_store(s + r, hp_vexp(hp_v8_load(s + r) - hp_v8_load(L + r)));
	}
}

/* Backward of (batch b, kv head kh): dk, dv of that head over all S keys,
 * dq of the query heads of its group. */
AT_INLINE void cp_bwd_body(const struct cp_args *a, long item, int isa)
{
	int Tq = a->Tq, S = a->S, q0 = a->q0, H = a->H, D = a->D, Dp = at_dpad(D), TB = at_tile(D);
	int group = H / a->KV, kh = (int)(item % a->KV), b = (int)(item / a->KV);
	long qs = (long)H * D, ks = (long)a->KV * D;
	float scale = 1.0f / sqrtf((float)D);
	const int32_t *sg = a->seg ? a->seg + (long)b * Tq : NULL;
	const float *kb = a->k + (long)b * S * ks + kh * D, *vb = a->v + (long)b * S * ks + kh * D;
	float *dkb = a->dk + (long)b * S * ks + kh * D, *dvb = a->dv + (long)b * S * ks + kh * D;
	at_tile_buf Qt, Qp, dOt, dOp, Kp, Vp, dQa, tmp;
	at_score_buf Pt, dSt;
	float Di[AT_MAX_TB] __attribute__((aligned(64))), L[AT_MAX_TB] __attribute__((aligned(64)));
	int32_t first[AT_MAX_TB], last[AT_MAX_TB];

	for (int j = 0; j < S; j++) {
		memset(dkb + (long)j * ks, 0, sizeof(float) * (size_t)D);
		memset(dvb + (long)j * ks, 0, sizeof(float) * (size_t)D);
	}
	for (int hh = 0; hh < group; hh++) {
		int h = kh * group + hh;
		for (int r0 = 0; r0 < Tq; r0 += TB) {
			int rows = Tq - r0 < TB ? Tq - r0 : TB, rp = (rows + 15) & ~15;
			int klo = sg ? sg[r0] : 0, khi = q0 + r0 + rows - 1;
			long base = ((long)b * Tq + r0) * qs + h * D, lrow = ((long)b * H + h) * Tq + r0;
			const float *Prow = a->P ? a->P + lrow * S : NULL;

			/* contiguous copies: see at_load_rows */
			at_load_rows(Qp, a->q + base, qs, rows, D, Dp);
			at_load_rows(dOp, a->dout + base, qs, rows, D, Dp);
			at_load_cols(Qt, a->q + base, qs, rows, rp, D);
			at_load_cols(dOt, a->dout + base, qs, rows, rp, D);
			at_lanes(first, last, sg, r0, rows, rp, q0);
			for (int r = 0; r < rp; r++) {
				L[r] = r < rows && !Prow ? a->lse[lrow + r] : 0;
				Di[r] = r < rows && !Prow ? hp_row_dot(a->dout + base + r * qs, a->o + base + r * qs, D) : 0;
			}
			if (Prow) {
				/* Di = rowsum(dP * P): a pass over the key tiles first,
				 * each tile's sum in float, the tiles' in double */
				double dd[AT_MAX_TB] = { 0 };
				for (int c0 = klo; c0 <= khi; c0 += TB) {
					int kc = khi + 1 - c0 < TB ? khi + 1 - c0 : TB;
					int full = at_all_visible(c0, kc, q0 + r0, sg, r0 + rows - 1) && rows == rp;
					at_load_rows(Vp, vb + (long)c0 * ks, ks, kc, D, Dp);
					cp_probs(Pt, a, Prow, NULL, NULL, NULL, rows, rp, c0, kc, full, first, last, isa);
					at_mm(isa, kc, rp, D, Vp, Dp, 1, dOt, rp, dSt, rp, 0);
					for (int r = 0; r < rp; r += 8) {
						hp_v8 s = hp_v8_set1(0.0f);
						for (int c = 0; c < kc; c++)
							s += hp_v8_load(Pt + (long)c * rp + r) * hp_v8_load(dSt + (long)c * rp + r);
						for (int x = 0; x < 8; x++)
							dd[r + x] += s[x];
					}
				}
				for (int r = 0; r < rp; r++)
					Di[r] = (float)dd[r];
			}
			memset(dQa, 0, sizeof(float) * (size_t)rows * Dp);
			for (int c0 = klo; c0 <= khi; c0 += TB) {
				int kc = khi + 1 - c0 < TB ? khi + 1 - c0 : TB;
				int full = at_all_visible(c0, kc, q0 + r0, sg, r0 + rows - 1) && rows == rp;

				at_load_rows(Kp, kb + (long)c0 * ks, ks, kc, D, Dp);
				at_load_rows(Vp, vb + (long)c0 * ks, ks, kc, D, Dp);
				cp_probs(Pt, a, Prow, Qt, Kp, L, rows, rp, c0, kc, full, first, last, isa);
				/* dS^T = P^T * (V dO^T - Di) */
				at_mm(isa, kc, rp, D, Vp, Dp, 1, dOt, rp, dSt, rp, 0);
				for (int c = 0; c < kc; c++) {
					float *ds = dSt + (long)c * rp;
					const float *p = Pt + (long)c * rp;
					for (int r = 0; r < rp; r += 8)
						hp_v8_store(ds + r, hp_v8_load(p + r) * (hp_v8_load(ds + r) - hp_v8_load(Di + r)));
				}
				/* dV += P^T dO, dK += dS^T Q (scaled at the end): each
				 * tile's product summed apart, then added */
				at_mm(isa, kc, Dp, rows, Pt, rp, 1, dOp, Dp, tmp, Dp, 0);
				for (int c = 0; c < kc; c++)
					cp_add_row(dvb + (long)(c0 + c) * ks, tmp + (long)c * Dp, D);
				at_mm(isa, kc, Dp, rows, dSt, rp, 1, Qp, Dp, tmp, Dp, 0);
				for (int c = 0; c < kc; c++)
					cp_add_row(dkb + (long)(c0 + c) * ks, tmp + (long)c * Dp, D);
				/* dQ += dS K (scaled when written) */
				at_mm(isa, rows, Dp, kc, dSt, 1, rp, Kp, Dp, tmp, Dp, 0);
				for (int r = 0; r < rows; r++)
					at_axpy_row(dQa + (long)r * Dp, 1.0f, tmp + (long)r * Dp, Dp);
			}
			for (int r = 0; r < rows; r++)
				cp_scale_row(a->dq + base + r * qs, dQa + (long)r * Dp, scale, D);
		}
	}
	for (int j = 0; j < S; j++)
		cp_scale_row(dkb + (long)j * ks, dkb + (long)j * ks, scale, D);
}

/* The compiled versions of the work items (same bits, see at_mm8). */
AT_VERSIONS(cp_fwd_items, cp_fwd_body);
AT_VERSIONS(cp_bwd_items, cp_bwd_body);

/* Run n items of the version for this call (hp_attntile_isa: HP_CPU, as
 * the flash kernel) on hp_attntile_threads(). */
static void cp_run(const at_item_fn *items, const struct cp_args *a, long n, double macs)
{
	struct at_job j = { items[hp_attntile_isa()], a, n, 0 };

	hp_attntile_run(&j, 0, macs);
}

/* Multiply-adds of one (query, key) product over the visible pairs (an
 * upper bound with packed rows): enough to decide whether threads pay. */
static double cp_macs(int B, int Tq, int q0, int H, int D)
{
	return (double)B * H * Tq * (q0 + (Tq + 1) / 2.0) * D;
}

static int cp_tiled(int Hq, int Hkv, int D)
{
	return D >= 1 && D <= AT_MAX_HEAD_DIM && Hkv > 0 && Hq % Hkv == 0;
}

static void cp_fwd_scalar(float *out, float *P, float *lse, const float *q, const float *k, const float *v,
			  const int32_t *seg, int B, int Tq, int S, int q0, int Hq, int Hkv, int D);
static void cp_bwd_scalar(float *dq, float *dk, float *dv, const float *dout, const float *out,
			  const float *P, const float *lse, const float *q, const float *k, const float *v,
			  const int32_t *seg, float *scratch, int B, int Tq, int S, int q0, int Hq, int Hkv, int D);

void hp_cp_attention_fwd(float *out, float *P, float *lse, const float *q, const float *k, const float *v,
			 const int32_t *seg, int B, int Tq, int S, int q0, int Hq, int Hkv, int D)
{
	struct cp_args a = { .out = out, .P_out = P, .lse_out = lse, .q = q, .k = k, .v = v, .seg = seg,
			     .B = B, .Tq = Tq, .S = S, .q0 = q0, .H = Hq, .KV = Hkv, .D = D };

	if (B <= 0 || Tq <= 0 || Hq <= 0)
		return;
	if (!cp_tiled(Hq, Hkv, D)) {
		cp_fwd_scalar(out, P, lse, q, k, v, seg, B, Tq, S, q0, Hq, Hkv, D);
		return;
	}
	int TB = at_tile(D);
	cp_run(cp_fwd_items, &a, (long)B * Hq * ((Tq + TB - 1) / TB), 2 * cp_macs(B, Tq, q0, Hq, D));
}

void hp_cp_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
			 const float *P, const float *lse, const float *q, const float *k, const float *v,
			 const int32_t *seg, float *scratch, int B, int Tq, int S, int q0, int Hq, int Hkv, int D)
{
	struct cp_args a = { .dq = dq, .dk = dk, .dv = dv, .dout = dout, .o = out, .P = P, .lse = lse,
			     .q = q, .k = k, .v = v, .seg = seg,
			     .B = B, .Tq = Tq, .S = S, .q0 = q0, .H = Hq, .KV = Hkv, .D = D };

	if (B <= 0 || Hq <= 0)
		return;
	if (!cp_tiled(Hq, Hkv, D) || Tq <= 0) {
		cp_bwd_scalar(dq, dk, dv, dout, out, P, lse, q, k, v, seg, scratch, B, Tq, S, q0, Hq, Hkv, D);
		return;
	}
	cp_run(cp_bwd_items, &a, (long)B * Hkv, 5 * cp_macs(B, Tq, q0, Hq, D));
}

/* ---- the scalar fallback (head dims above AT_MAX_HEAD_DIM, Hq not a
 * multiple of Hkv): per (batch, head, query), dot products in double ---- */
/* scale * (q . k) summed in double, rounded as hp_attention_fwd_ref rounds it. */
static float cp_score(const float *qi, const float *kj, int D, float scale)
{
	double s = 0;

	for (int d = 0; d < D; d++)
		s += (double)qi[d] * kj[d];
	return (float)s * scale;
}

static void cp_fwd_scalar(float *out, float *P, float *lse, const float *q, const float *k, const float *v,
			  const int32_t *seg, int B, int Tq, int S, int q0, int Hq, int Hkv, int D)
{
	int group = Hq / Hkv;
	long qs = (long)Hq * D, ks = (long)Hkv * D;
	float scale = 1.0f / sqrtf((float)D), buf[CP_BLOCK];

	for (int b = 0; b < B; b++)
		for (int h = 0; h < Hq; h++) {
			int kh = h / group;
			const float *kb = k + (long)b * S * ks + kh * D, *vb = v + (long)b * S * ks + kh * D;
			for (int i = 0; i < Tq; i++) {
				const float *qi = q + ((long)b * Tq + i) * qs + h * D;
				float *oi = out + ((long)b * Tq + i) * qs + h * D;
				float *prow = P ? P + (((long)b * Hq + h) * Tq + i) * S : NULL;
				int p = q0 + i, j0 = seg ? seg[(long)b * Tq + i] : 0;
				float m = -INFINITY;
				double l = 0;

				for (int d = 0; d < D; d++)
					oi[d] = 0;
				for (int a = j0; a <= p; a += CP_BLOCK) {
					int n = p + 1 - a < CP_BLOCK ? p + 1 - a : CP_BLOCK;
					float bm = -INFINITY;
					for (int j = 0; j < n; j++) {
						buf[j] = cp_score(qi, kb + (long)(a + j) * ks, D, scale);
						if (prow)
							prow[a + j] = buf[j];
						if (buf[j] > bm)
							bm = buf[j];
					}
					float mn = bm > m ? bm : m, alpha = expf(m - mn);   /* 0 on the first block */
					l *= alpha;
					for (int j = 0; j < n; j++) {
						buf[j] = expf(buf[j] - mn);
						l += buf[j];
					}
					for (int d = 0; d < D; d++) {
						double t = 0;
						for (int j = 0; j < n; j++)
							t += (double)buf[j] * vb[(long)(a + j) * ks + d];
						oi[d] = oi[d] * alpha + (float)t;
					}
					m = mn;
				}
				for (int d = 0; d < D; d++)
					oi[d] = (float)(oi[d] / l);
				if (lse)
					lse[((long)b * Hq + h) * Tq + i] = (float)(m + log(l));
				if (prow) {
					/* the row holds the scores: P = exp(score - m) / l */
					for (int j = 0; j < j0; j++)
						prow[j] = 0;
					for (int j = j0; j <= p; j++)
						prow[j] = (float)(expf(prow[j] - m) / l);
					for (int j = p + 1; j < S; j++)
						prow[j] = 0;
				}
			}
		}
}

static void cp_bwd_scalar(float *dq, float *dk, float *dv, const float *dout, const float *out,
			  const float *P, const float *lse, const float *q, const float *k, const float *v,
			  const int32_t *seg, float *scratch, int B, int Tq, int S, int q0, int Hq, int Hkv, int D)
{
	int group = Hq / Hkv;
	long qs = (long)Hq * D, ks = (long)Hkv * D;
	float scale = 1.0f / sqrtf((float)D);
	float *pbuf = scratch, *dS = scratch + S;   /* rows indexed by key position */

	memset(dk, 0, sizeof(float) * (size_t)B * S * ks);
	memset(dv, 0, sizeof(float) * (size_t)B * S * ks);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < Hq; h++) {
			int kh = h / group;
			const float *kb = k + (long)b * S * ks + kh * D, *vb = v + (long)b * S * ks + kh * D;
			float *dkb = dk + (long)b * S * ks + kh * D, *dvb = dv + (long)b * S * ks + kh * D;
			for (int i = 0; i < Tq; i++) {
				long row = ((long)b * Tq + i) * qs + h * D;
				const float *qi = q + row, *doi = dout + row;
				float *dqi = dq + row;
				int p = q0 + i, j0 = seg ? seg[(long)b * Tq + i] : 0;
				const float *pr;
				double rs = 0;

				if (P) {
					pr = P + (((long)b * Hq + h) * Tq + i) * S;
				} else {
					float li = lse[((long)b * Hq + h) * Tq + i];
					for (int j = j0; j <= p; j++)
						pbuf[j] = expf(cp_score(qi, kb + (long)j * ks, D, scale) - li);
					pr = pbuf;
					for (int d = 0; d < D; d++)
						rs += (double)doi[d] * out[row + d];
				}
				for (int j = j0; j <= p; j++) {
					const float *vj = vb + (long)j * ks;
					double s = 0;
					for (int d = 0; d < D; d++)
						s += (double)doi[d] * vj[d];
					dS[j] = (float)s;     /* dP for now */
					if (P)
						rs += s * pr[j];
				}
				for (int j = j0; j <= p; j++)
					dS[j] = pr[j] * (float)(dS[j] - rs);
				for (int d = 0; d < D; d++) {
					double s = 0;
					for (int j = j0; j <= p; j++)
						s += (double)dS[j] * kb[(long)j * ks + d];
					dqi[d] = (float)s * scale;
				}
				for (int j = j0; j <= p; j++) {
					float *dkj = dkb + (long)j * ks, *dvj = dvb + (long)j * ks;
					for (int d = 0; d < D; d++) {
						dkj[d] += scale * dS[j] * qi[d];
						dvj[d] += pr[j] * doi[d];
					}
				}
			}
		}
}
