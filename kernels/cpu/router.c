/*
 * router.c - the Qwen3-MoE router's top-k and its backward, as HF's
 * Qwen3MoeSparseMoeBlock computes them (see ops.h).  lib/model/model.c runs them;
 * the CUDA router (kernels/cuda/moe.cu) is tested against them.
 */
#include <math.h>
#include <string.h>

#include "cpu/ops.h"

void hp_router_topk(float *probs, int32_t *sel_all, float *wsel, long N, int E, int K, int norm)
{
	for (long t = 0; t < N; t++) {
		float *p = probs + t * E;
		int32_t *sel = sel_all + t * K;
		float *ws = wsel + t * K, mx = p[0];
		double sum = 0;

		for (int x = 1; x < E; x++)
			if (p[x] > mx)
				mx = p[x];
		for (int x = 0; x < E; x++)
			sum += p[x] = expf(p[x] - mx);
		for (int x = 0; x < E; x++)
			p[x] = (float)(p[x] / sum);
		for (int k = 0; k < K; k++) {
			int best = -1;
			for (int x = 0; x < E; x++) {
				int taken = 0;
				for (int j = 0; j < k; j++)
					taken |= sel[j] == x;
				if (!taken && (best < 0 || p[x] > p[best]))
					best = x;
			}
			sel[k] = best;
			ws[k] = p[best];
		}
		if (norm) {
			float tot = 0;
			for (int k = 0; k < K; k++)
				tot += ws[k];
			for (int k = 0; k < K; k++)
				ws[k] /= tot;
		}
	}
}

void hp_router_bwd(float *dprob, const float *probs, const int32_t *sel_all, const float *wsel,
		   const float *dwsel, const double *aux, double aux_grad, long N, int E, int K, int norm)
{
	memset(dprob, 0, sizeof(float) * (size_t)N * E);
	for (long t = 0; t < N; t++) {
		const float *ws = wsel + t * K, *dw = dwsel + t * K, *p = probs + t * E;
		const int32_t *sel = sel_all + t * K;
		float *dp = dprob + t * E;
		double sdp = 0;

		if (norm) {
			/* w_j = p_j / S:  dL/dp_j = (dw_j - sum_i dw_i w_i) / S */
			double S = 0, c = 0;
			for (int k = 0; k < K; k++) {
				S += p[sel[k]];
				c += (double)dw[k] * ws[k];
			}
			for (int k = 0; k < K; k++)
				dp[sel[k]] += (float)((dw[k] - c) / S);
		} else {
			for (int k = 0; k < K; k++)
				dp[sel[k]] += dw[k];
		}
		/* the aux loss: d/dP_e of E * sum F_e P_e, P_e a mean over all MoE tokens */
		if (aux_grad != 0)
			for (int x = 0; x < E; x++)
				dp[x] += (float)(aux_grad * aux[x]);
		/* softmax: dlogit = p * (dp - sum p dp), in place */
		for (int x = 0; x < E; x++)
			sdp += (double)p[x] * dp[x];
		for (int x = 0; x < E; x++)
			dp[x] = p[x] * (float)(dp[x] - sdp);
	}
}

void hp_moe_route(int32_t *off, int32_t *row_tok, int32_t *row_slot, int32_t *tok_rows, int32_t *bad,
		  int32_t *sel, long N, int E, int K)
{
	size_t NK = (size_t)N * K;
	int32_t nbad = 0;

	memset(off, 0, sizeof(int32_t) * (size_t)(E + 1));
	for (size_t i = 0; i < NK; i++) {
		if (sel[i] < 0 || sel[i] >= E) {
			sel[i] = 0;
			nbad++;
		}
		off[sel[i] + 1]++;
	}
	for (int x = 0; x < E; x++)
		off[x + 1] += off[x];
	/* each expert's rows in token order: off[x] runs ahead as its cursor,
	 * then falls back one expert (off[x] ends at the old off[x+1]) */
	for (long t = 0; t < N; t++)
		for (int k = 0; k < K; k++) {
			int32_t r = off[sel[t * K + k]]++;
			row_tok[r] = (int32_t)t;
			row_slot[r] = k;
		}
	for (int x = E; x > 0; x--)
		off[x] = off[x - 1];
	off[0] = 0;
	*bad += nbad;
	if (!tok_rows)
		return;
	/* each token's rows in ascending order, the order of a loop over rows
	 * (its slots' rows, sorted: K is small) */
	for (size_t r = 0; r < NK; r++)
		tok_rows[(size_t)row_tok[r] * K + (size_t)row_slot[r]] = (int32_t)r;
	for (long t = 0; t < N; t++)
		for (int k = 1; k < K; k++)
			for (int j = k; j > 0 && tok_rows[t * K + j - 1] > tok_rows[t * K + j]; j--) {
				int32_t v = tok_rows[t * K + j];
				tok_rows[t * K + j] = tok_rows[t * K + j - 1];
				tok_rows[t * K + j - 1] = v;
			}
}

void hp_moe_aux_acc(double *FP, const float *probs, const int32_t *off, long N, int E)
{
	for (int x = 0; x < E; x++)
		FP[x] += off[x + 1] - off[x];
	for (long t = 0; t < N; t++)
		for (int x = 0; x < E; x++)
			FP[E + x] += probs[t * E + x];
}

void hp_moe_aux_fin(double *FP, double *aux, double *acc, int E, double n, double div)
{
	double s = 0;

	for (int x = 0; x < E; x++) {
		FP[x] /= n;
		s += FP[x] * (FP[E + x] / n);
	}
	*aux = s * E;
	if (acc)
		*acc += *aux / div;
}
