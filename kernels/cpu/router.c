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
