/*
 * attention.c - causal grouped-query attention, forward and backward.
 *
 * HF eager attention: scores = q k^T / sqrt(head_dim) + causal mask,
 * P = softmax(scores) in fp32, out = P v; query head h reads key/value head
 * h / (n_heads / n_kv_heads) (repeat_kv without the copy).  With packed
 * rows, seg[b*T + i] is the row index where token i's document starts and
 * token i attends to keys seg..i only (the block-diagonal causal mask of
 * cu_seq_lens); seg == NULL is one document per row.  P is saved for
 * the backward:
 *   dv  += P^T dout               dP = dout v^T
 *   dS   = P * (dP - rowsum(dP * P))
 *   dq   = scale * dS k           dk += scale * dS^T q
 * The reference is plain loops; the BLAS variant does the same algebra with
 * sgemm per (batch, head) on strided views, computing only what the causal
 * mask keeps where that is cheap.  Neither is the tiled flash kernel: that
 * arrives with kernel substitution.
 */
#include <math.h>

#include "cpu/gemm.h"
#include "cpu/ops.h"
#include "cpu/vec.h"

void hp_attention_fwd_ref(float *out, float *P, const float *q, const float *k, const float *v,
			  const int32_t *seg, int B, int T, int n_heads, int n_kv_heads, int head_dim)
{
	int group = n_heads / n_kv_heads, D = head_dim;
	long qs = (long)n_heads * D, ks = (long)n_kv_heads * D;
	float scale = 1.0f / sqrtf((float)D);

	for (int b = 0; b < B; b++)
		for (int h = 0; h < n_heads; h++) {
			int kh = h / group;
			for (int i = 0; i < T; i++) {
				const float *qi = q + ((long)b * T + i) * qs + h * D;
				float *p = P + (((long)b * n_heads + h) * T + i) * T;
				int j0 = seg ? seg[(long)b * T + i] : 0;
				float mx = -INFINITY;
				for (int j = 0; j < j0; j++)
					p[j] = 0;
				for (int j = j0; j <= i; j++) {
					const float *kj = k + ((long)b * T + j) * ks + kh * D;
					double s = 0;
					for (int d = 0; d < D; d++)
						s += (double)qi[d] * kj[d];
					p[j] = (float)s * scale;
					if (p[j] > mx)
						mx = p[j];
				}
				double sum = 0;
				for (int j = j0; j <= i; j++) {
					p[j] = expf(p[j] - mx);
					sum += p[j];
				}
				for (int j = j0; j <= i; j++)
					p[j] = (float)(p[j] / sum);
				for (int j = i + 1; j < T; j++)
					p[j] = 0;
				float *oi = out + ((long)b * T + i) * qs + h * D;
				for (int d = 0; d < D; d++) {
					double s = 0;
					for (int j = j0; j <= i; j++)
						s += (double)p[j] * v[((long)b * T + j) * ks + kh * D + d];
					oi[d] = (float)s;
				}
			}
		}
}

void hp_attention_bwd_ref(float *dq, float *dk, float *dv, const float *dout, const float *P,
			  const float *q, const float *k, const float *v, const int32_t *seg, float *scratch,
			  int B, int T, int n_heads, int n_kv_heads, int head_dim)
{
	int group = n_heads / n_kv_heads, D = head_dim;
	long qs = (long)n_heads * D, ks = (long)n_kv_heads * D;
	float scale = 1.0f / sqrtf((float)D);
	float *dS = scratch;   /* one row of T */

	memset(dk, 0, sizeof(float) * (size_t)B * T * ks);
	memset(dv, 0, sizeof(float) * (size_t)B * T * ks);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < n_heads; h++) {
			int kh = h / group;
			for (int i = 0; i < T; i++) {
				const float *p = P + (((long)b * n_heads + h) * T + i) * T;
				const float *doi = dout + ((long)b * T + i) * qs + h * D;
				int j0 = seg ? seg[(long)b * T + i] : 0;
				double rs = 0;
				for (int j = j0; j <= i; j++) {
					const float *vj = v + ((long)b * T + j) * ks + kh * D;
					double s = 0;
					for (int d = 0; d < D; d++)
						s += (double)doi[d] * vj[d];
					dS[j] = (float)s;     /* dP for now */
					rs += s * p[j];
				}
				for (int j = j0; j <= i; j++)
					dS[j] = p[j] * (float)(dS[j] - rs);
				float *dqi = dq + ((long)b * T + i) * qs + h * D;
				const float *qi = q + ((long)b * T + i) * qs + h * D;
				for (int d = 0; d < D; d++) {
					double s = 0;
					for (int j = j0; j <= i; j++)
						s += (double)dS[j] * k[((long)b * T + j) * ks + kh * D + d];
					dqi[d] = (float)s * scale;
				}
				for (int j = j0; j <= i; j++) {
					float *dkj = dk + ((long)b * T + j) * ks + kh * D;
					float *dvj = dv + ((long)b * T + j) * ks + kh * D;
					for (int d = 0; d < D; d++) {
						dkj[d] += scale * dS[j] * qi[d];
						dvj[d] += p[j] * doi[d];
					}
				}
			}
		}
}

/*
 * The BLAS variant walks query rows in blocks of ATT_BLOCK: block r only
 * needs keys 0 .. end of block r, so the square products shrink to the
 * causal staircase (about half the flops of a full T x T product).
 */
#define ATT_BLOCK 64

HP_TARGET_CLONES
void hp_attention_fwd_blas(float *out, float *P, const float *q, const float *k, const float *v,
			   const int32_t *seg, int B, int T, int n_heads, int n_kv_heads, int head_dim)
{
	int group = n_heads / n_kv_heads, D = head_dim;
	int qs = n_heads * D, ks = n_kv_heads * D;
	float scale = 1.0f / sqrtf((float)D);

	for (int b = 0; b < B; b++)
		for (int h = 0; h < n_heads; h++) {
			int kh = h / group;
			const float *qb = q + (long)b * T * qs + h * D;
			const float *kb = k + (long)b * T * ks + kh * D;
			const float *vb = v + (long)b * T * ks + kh * D;
			float *p = P + ((long)b * n_heads + h) * T * T;
			float *ob = out + (long)b * T * qs + h * D;
			const int32_t *sb = seg ? seg + (long)b * T : NULL;
			for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
				int rows = T - r0 < ATT_BLOCK ? T - r0 : ATT_BLOCK, cols = r0 + rows;
				int c0 = sb ? sb[r0] : 0;    /* documents are contiguous: the block's first row starts earliest */
				float *pr = p + (long)r0 * T;
				/* S = scale * Q_r K_{c0..cols}^T */
				hp_sgemm(0, 1, rows, cols - c0, D,
					 scale, qb + (long)r0 * qs, qs, kb + (long)c0 * ks, ks, 0.0f, pr + c0, T);
				for (int i = r0; i < r0 + rows; i++) {
					float *r = p + (long)i * T;
					int j0 = sb ? sb[i] : 0;
					float mx = hp_row_max(r + j0, i + 1 - j0);
					float sum = hp_row_exp_sum(r + j0, i + 1 - j0, mx);
					hp_row_scale(r + j0, i + 1 - j0, 1.0f / sum);
					memset(r, 0, sizeof(float) * (size_t)j0);
					memset(r + i + 1, 0, sizeof(float) * (size_t)(T - i - 1));
				}
				/* O_r = P_r V_{c0..cols} */
				hp_sgemm(0, 0, rows, D, cols - c0,
					 1.0f, pr + c0, T, vb + (long)c0 * ks, ks, 0.0f, ob + (long)r0 * qs, qs);
			}
		}
}

HP_TARGET_CLONES
void hp_attention_bwd_blas(float *dq, float *dk, float *dv, const float *dout, const float *P,
			   const float *q, const float *k, const float *v, const int32_t *seg, float *scratch,
			   int B, int T, int n_heads, int n_kv_heads, int head_dim)
{
	int group = n_heads / n_kv_heads, D = head_dim;
	int qs = n_heads * D, ks = n_kv_heads * D;
	float scale = 1.0f / sqrtf((float)D);
	float *dS = scratch;   /* ATT_BLOCK x T used, T*T available */

	memset(dk, 0, sizeof(float) * (size_t)B * T * ks);
	memset(dv, 0, sizeof(float) * (size_t)B * T * ks);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < n_heads; h++) {
			int kh = h / group;
			const float *p = P + ((long)b * n_heads + h) * T * T;
			const float *dob = dout + (long)b * T * qs + h * D;
			const float *qb = q + (long)b * T * qs + h * D;
			const float *kb = k + (long)b * T * ks + kh * D;
			const float *vb = v + (long)b * T * ks + kh * D;
			float *dkb = dk + (long)b * T * ks + kh * D;
			float *dvb = dv + (long)b * T * ks + kh * D;
			const int32_t *sb = seg ? seg + (long)b * T : NULL;
			for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
				int rows = T - r0 < ATT_BLOCK ? T - r0 : ATT_BLOCK, cols = r0 + rows;
				int c0 = sb ? sb[r0] : 0, w = cols - c0;
				const float *pr = p + (long)r0 * T + c0;
				const float *dor = dob + (long)r0 * qs;
				/* dV_{c0..cols} += P_r^T dO_r */
				hp_sgemm(1, 0, w, D, rows,
					 1.0f, pr, T, dor, qs, 1.0f, dvb + (long)c0 * ks, ks);
				/* dP_r = dO_r V_{c0..cols}^T, columns relative to c0 */
				hp_sgemm(0, 1, rows, w, D,
					 1.0f, dor, qs, vb + (long)c0 * ks, ks, 0.0f, dS, T);
				for (int i = 0; i < rows; i++) {
					float *r = dS + (long)i * T;
					const float *prow = pr + (long)i * T;
					int first = (sb ? sb[r0 + i] : 0) - c0, n = r0 + i - c0 + 1 - first;
					float rs = hp_row_dot(r + first, prow + first, n);
					hp_v8 rsv = hp_v8_set1(rs);
					int j = first;
					for (; j + 8 <= first + n; j += 8)
						hp_v8_store(r + j, hp_v8_load(prow + j) * (hp_v8_load(r + j) - rsv));
					for (; j < first + n; j++)
						r[j] = prow[j] * (r[j] - rs);
					for (j = 0; j < first; j++)
						r[j] = 0;
					for (j = first + n; j < w; j++)
						r[j] = 0;
				}
				/* dQ_r = scale * dS_r K_{c0..cols};  dK_{c0..cols} += scale * dS_r^T Q_r */
				hp_sgemm(0, 0, rows, D, w,
					 scale, dS, T, kb + (long)c0 * ks, ks, 0.0f, dq + (long)b * T * qs + h * D + (long)r0 * qs, qs);
				hp_sgemm(1, 0, w, D, rows,
					 scale, dS, T, qb + (long)r0 * qs, qs, 1.0f, dkb + (long)c0 * ks, ks);
			}
		}
}
