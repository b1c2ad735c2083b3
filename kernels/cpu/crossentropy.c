/*
 * crossentropy.c - softmax cross-entropy over the vocabulary, with
 * ignore_index -100 as torch.nn.functional.cross_entropy.
 *
 * The forward returns the sum and the count so that the caller can form the
 * token-weighted mean over micro-batches and ranks; the backward takes the
 * 1/count scale.  Each exp is a float expf of (logit - max) <= 0, accurate
 * to an ulp; the sum over the vocabulary is kept in double, since with V up
 * to 150k a float sum would lose about log2(V) bits.
 */
#include <math.h>

#include "cpu/ops.h"
#include "cpu/vec.h"

int hp_cross_entropy_fwd(double *loss_sum, long *count, const float *logits, const int32_t *targets,
			 long N, int V)
{
	double sum = 0;
	long cnt = 0;

	for (long n = 0; n < N; n++) {
		int t = targets[n];
		if (t == HP_IGNORE_INDEX)
			continue;
		if (t < 0 || t >= V)
			return -1;
		const float *l = logits + n * V;
		float mx = l[0];
		for (int v = 1; v < V; v++)
			if (l[v] > mx)
				mx = l[v];
		double se = 0;
		for (int v = 0; v < V; v++)
			se += expf(l[v] - mx);
		sum += log(se) + mx - l[t];
		cnt++;
	}
	*loss_sum = sum;
	*count = cnt;
	return 0;
}

void hp_cross_entropy_bwd(float *dlogits, const float *logits, const int32_t *targets,
			  long N, int V, float scale)
{
	for (long n = 0; n < N; n++) {
		const float *l = logits + n * V;
		float *d = dlogits + n * V;
		int t = targets[n];
		if (t == HP_IGNORE_INDEX) {
			memset(d, 0, (size_t)V * sizeof(float));
			continue;
		}
		float mx = l[0];
		for (int v = 1; v < V; v++)
			if (l[v] > mx)
				mx = l[v];
		/* d may alias l: keep the exps in d, then scale in place */
		double se = 0;
		for (int v = 0; v < V; v++) {
			float ev = expf(l[v] - mx);
			d[v] = ev;
			se += ev;
		}
		float k = (float)(scale / se);
		for (int v = 0; v < V; v++)
			d[v] = d[v] * k;
		d[t] -= scale;
	}
}

/* The vector path: same algebra, hp_vexp, sums over float lanes per row. */
HP_TARGET_CLONES
int hp_cross_entropy_fwd_vec(double *loss_sum, long *count, const float *logits, const int32_t *targets,
			     long N, int V)
{
	double sum = 0;
	long cnt = 0;

	for (long n = 0; n < N; n++) {
		int t = targets[n];
		if (t == HP_IGNORE_INDEX)
			continue;
		if (t < 0 || t >= V)
			return -1;
		const float *l = logits + n * V;
		float mx = hp_row_max(l, V);
		double se = hp_row_expsum(l, V, mx);
		sum += log(se) + mx - l[t];
		cnt++;
	}
	*loss_sum = sum;
	*count = cnt;
	return 0;
}

HP_TARGET_CLONES
void hp_cross_entropy_bwd_vec(float *dlogits, const float *logits, const int32_t *targets,
			      long N, int V, float scale)
{
	for (long n = 0; n < N; n++) {
		const float *l = logits + n * V;
		float *d = dlogits + n * V;
		int t = targets[n];
		if (t == HP_IGNORE_INDEX) {
			memset(d, 0, (size_t)V * sizeof(float));
			continue;
		}
		float mx = hp_row_max(l, V);
		if (d != l)
			memcpy(d, l, (size_t)V * sizeof(float));
		float se = hp_row_exp_sum(d, V, mx);
		hp_row_scale(d, V, scale / se);
		d[t] -= scale;
	}
}

/*
 * Vocab-parallel cross-entropy (loss_parallel): each tp rank holds the
 * logits of its vocabulary range [v0, v0 + Vl) and never the whole row.
 * Three local passes with two reductions between them, which the caller
 * performs over the tp group:
 *   1. hp_vp_ce_max: each row's local max      -> all-reduce MAX -> m
 *   2. hp_vp_ce_sums: sum_v exp(l - m) over the local range, and the
 *      target's logit when the target is local (else 0)
 *                                              -> all-reduce SUM
 *   3. hp_vp_ce_loss: loss = log(sum) + m - target logit, summed over
 *      counted rows; hp_vp_ce_bwd: the local slice of
 *      scale * (softmax - onehot), from m and the global sum.
 * stats holds 2 doubles per row (sum, target logit).  The results equal
 * hp_cross_entropy_* on the gathered row up to the order of the sum.
 */
void hp_vp_ce_max(float *mx, const float *logits, long N, int Vl)
{
	for (long n = 0; n < N; n++) {
		const float *l = logits + n * Vl;
		float m = -INFINITY;

		for (int v = 0; v < Vl; v++)
			if (l[v] > m)
				m = l[v];
		mx[n] = m;
	}
}

void hp_vp_ce_sums(double *stats, const float *logits, const float *mx, const int32_t *targets,
		   long N, int Vl, int v0)
{
	for (long n = 0; n < N; n++) {
		const float *l = logits + n * Vl;
		int t = targets[n] - v0;
		double se = 0;

		for (int v = 0; v < Vl; v++)
			se += expf(l[v] - mx[n]);
		stats[2 * n] = se;
		stats[2 * n + 1] = targets[n] != HP_IGNORE_INDEX && t >= 0 && t < Vl ? l[t] : 0;
	}
}

int hp_vp_ce_loss(double *loss_sum, long *count, const double *stats, const float *mx,
		  const int32_t *targets, long N, int V)
{
	double sum = 0;
	long cnt = 0;

	for (long n = 0; n < N; n++) {
		if (targets[n] == HP_IGNORE_INDEX)
			continue;
		if (targets[n] < 0 || targets[n] >= V)
			return -1;
		sum += log(stats[2 * n]) + mx[n] - stats[2 * n + 1];
		cnt++;
	}
	*loss_sum = sum;
	*count = cnt;
	return 0;
}

void hp_vp_ce_bwd(float *dlogits, const float *logits, const double *stats, const float *mx,
		  const int32_t *targets, long N, int Vl, int v0, float scale)
{
	for (long n = 0; n < N; n++) {
		const float *l = logits + n * Vl;
		float *d = dlogits + n * Vl;
		int t = targets[n] - v0;
		double inv;

		if (targets[n] == HP_IGNORE_INDEX) {
			memset(d, 0, (size_t)Vl * sizeof(float));
			continue;
		}
		inv = 1.0 / stats[2 * n];
		for (int v = 0; v < Vl; v++)
			d[v] = (float)(expf(l[v] - mx[n]) * inv) * scale;
		if (t >= 0 && t < Vl)
			d[t] -= scale;
	}
}
