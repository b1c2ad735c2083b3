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

#include "cpu/attntile.h"
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
 *
 * Threads: the (row, kv head) pairs are independent - a pair's query heads
 * write their own rows of P, out and dq, and only they add into the pair's
 * rows of dk and dv - so they run on hp_attntile_run's threads, each pair
 * computing exactly what the single-threaded loop did, in the same order
 * (its query heads in turn): the bits do not depend on the thread count.
 * The products inside are too small for hp_sgemm's own threads, and single-
 * threaded attention was 8% of the bench's wide model's step and the largest
 * share of a second thread's idle time.  The backward's dS block comes from
 * the caller's T*T scratch, ATT_BLOCK*T floats per thread, so it runs on
 * at most T / ATT_BLOCK threads, as contiguous runs of pairs.
 */
#define ATT_BLOCK 64

struct att_args {
	float *out, *P, *dq, *dk, *dv, *scratch;
	const float *q, *k, *v, *dout, *Pc;
	const int32_t *seg;
	int B, T, n_heads, n_kv_heads, D;
	long parts;     /* the backward: pairs in this many contiguous runs */
};

/* The query heads of pair (b, kv head kh), forward. */
HP_TARGET_CLONES
static void att_fwd_pair(const void *va, long pair)
{
	const struct att_args *a = va;
	int T = a->T, D = a->D, group = a->n_heads / a->n_kv_heads;
	int b = (int)(pair / a->n_kv_heads), kh = (int)(pair % a->n_kv_heads);
	int qs = a->n_heads * D, ks = a->n_kv_heads * D;
	float scale = 1.0f / sqrtf((float)D);

	for (int h = kh * group; h < (kh + 1) * group; h++) {
		const float *qb = a->q + (long)b * T * qs + h * D;
		const float *kb = a->k + (long)b * T * ks + kh * D;
		const float *vb = a->v + (long)b * T * ks + kh * D;
		float *p = a->P + ((long)b * a->n_heads + h) * T * T;
		float *ob = a->out + (long)b * T * qs + h * D;
		const int32_t *sb = a->seg ? a->seg + (long)b * T : NULL;
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

/* The query heads of pair (b, kv head kh), backward, with dS the block
 * dS (ATT_BLOCK x T floats) of the thread running it. */
HP_TARGET_CLONES
static void att_bwd_pair(const struct att_args *a, long pair, float *dS)
{
	int T = a->T, D = a->D, group = a->n_heads / a->n_kv_heads;
	int b = (int)(pair / a->n_kv_heads), kh = (int)(pair % a->n_kv_heads);
	int qs = a->n_heads * D, ks = a->n_kv_heads * D;
	float scale = 1.0f / sqrtf((float)D);

	for (int h = kh * group; h < (kh + 1) * group; h++) {
		const float *p = a->Pc + ((long)b * a->n_heads + h) * T * T;
		const float *dob = a->dout + (long)b * T * qs + h * D;
		const float *qb = a->q + (long)b * T * qs + h * D;
		const float *kb = a->k + (long)b * T * ks + kh * D;
		const float *vb = a->v + (long)b * T * ks + kh * D;
		float *dkb = a->dk + (long)b * T * ks + kh * D;
		float *dvb = a->dv + (long)b * T * ks + kh * D;
		const int32_t *sb = a->seg ? a->seg + (long)b * T : NULL;
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
				 scale, dS, T, kb + (long)c0 * ks, ks, 0.0f, a->dq + (long)b * T * qs + h * D + (long)r0 * qs, qs);
			hp_sgemm(1, 0, w, D, rows,
				 scale, dS, T, qb + (long)r0 * qs, qs, 1.0f, dkb + (long)c0 * ks, ks);
		}
	}
}

/* Run `part` of a->parts: a contiguous run of pairs, in order. */
static void att_bwd_part(const void *va, long part)
{
	const struct att_args *a = va;
	long pairs = (long)a->B * a->n_kv_heads;

	for (long i = part * pairs / a->parts; i < (part + 1) * pairs / a->parts; i++)
		att_bwd_pair(a, i, a->scratch + part * ATT_BLOCK * (long)a->T);
}

/* Multiply-adds of the call's products (for hp_attntile_run's choice of
 * threads): two T x T x D products per head over the causal half. */
static double att_macs(int B, int T, int n_heads, int D)
{
	return (double)B * n_heads * T * (T + 1) / 2.0 * D * 2;
}

void hp_attention_fwd_blas(float *out, float *P, const float *q, const float *k, const float *v,
			   const int32_t *seg, int B, int T, int n_heads, int n_kv_heads, int head_dim)
{
	struct att_args a = { .out = out, .P = P, .q = q, .k = k, .v = v, .seg = seg, .B = B, .T = T,
			      .n_heads = n_heads, .n_kv_heads = n_kv_heads, .D = head_dim };
	struct at_job j = { att_fwd_pair, &a, (long)B * n_kv_heads, 0 };

	hp_attntile_run(&j, 0, att_macs(B, T, n_heads, head_dim));
}

void hp_attention_bwd_blas(float *dq, float *dk, float *dv, const float *dout, const float *P,
			   const float *q, const float *k, const float *v, const int32_t *seg, float *scratch,
			   int B, int T, int n_heads, int n_kv_heads, int head_dim)
{
	long ks = (long)n_kv_heads * head_dim, pairs = (long)B * n_kv_heads;
	long parts = hp_attntile_threads(), blocks = T / ATT_BLOCK;
	struct att_args a = { .dq = dq, .dk = dk, .dv = dv, .scratch = scratch, .q = q, .k = k, .v = v,
			      .dout = dout, .Pc = P, .seg = seg, .B = B, .T = T, .n_heads = n_heads,
			      .n_kv_heads = n_kv_heads, .D = head_dim };

	/* each part's dS block must fit the T*T scratch */
	if (parts > blocks)
		parts = blocks;
	if (parts > pairs)
		parts = pairs;
	if (parts < 1)
		parts = 1;
	a.parts = parts;
	memset(dk, 0, sizeof(float) * (size_t)B * T * ks);
	memset(dv, 0, sizeof(float) * (size_t)B * T * ks);
	struct at_job j = { att_bwd_part, &a, parts, 0 };
	hp_attntile_run(&j, (int)parts, 2 * att_macs(B, T, n_heads, head_dim));
}
