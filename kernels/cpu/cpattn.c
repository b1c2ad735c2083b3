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
 * Forward, per (batch, head, query): the scores of the visible keys
 * (dot products summed in double, as hp_attention_fwd_ref) go through an
 * online softmax CP_BLOCK keys at a time - running max m and sum l,
 * rescaling the output row when m grows - so that it needs no row of S
 * floats; lse = m + log(l), as the flash kernel's.  When P is given its row
 * also keeps the scores, turned into exp(score - m) / l at the end; out and
 * lse are the same bits with or without P.
 * Backward, per (batch, head, query), with p the probability row (P's, or
 * exp(score - lse) recomputed into scratch):
 *   dP_j = dout . v_j                 dS_j = p_j (dP_j - D)
 *   dq   = scale * sum_j dS_j k_j     dk_j += scale * dS_j q,  dv_j += p_j dout
 * with D = rowsum(dP * p) when P is given, else rowsum(dout * out) (the
 * flash identity: the two agree to rounding).  dk and dv are this chunk's
 * contributions to every key of the rows (zero for the keys no query of the
 * chunk sees); the caller sums them over the ranks of the row.
 */
#include <math.h>

#include "cpu/ops.h"

/* Keys per block of the online softmax when there is no P row to hold the scores. */
#define CP_BLOCK 64

size_t hp_cp_attention_scratch(int S)
{
	return 2 * (size_t)(S > 0 ? S : 0);   /* a probability row and a dS row */
}

/* scale * (q . k) summed in double, rounded as hp_attention_fwd_ref rounds it. */
static float cp_score(const float *qi, const float *kj, int D, float scale)
{
	double s = 0;

	for (int d = 0; d < D; d++)
		s += (double)qi[d] * kj[d];
	return (float)s * scale;
}

void hp_cp_attention_fwd(float *out, float *P, float *lse, const float *q, const float *k, const float *v,
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

void hp_cp_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
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
