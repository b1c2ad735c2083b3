/*
 * swiglu.c - the gated MLP activation h = silu(g) * u and its gradient.
 */
#include <math.h>

#include "cpu/ops.h"

void hp_swiglu_fwd(float *h, const float *g, const float *u, long n)
{
	for (long i = 0; i < n; i++) {
		float s = 1.0f / (1.0f + expf(-g[i]));
		h[i] = g[i] * s * u[i];
	}
}

/* d silu(g)/dg = s * (1 + g * (1 - s)), s = sigmoid(g). */
void hp_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, long n)
{
	for (long i = 0; i < n; i++) {
		float s = 1.0f / (1.0f + expf(-g[i]));
		float silu = g[i] * s;
		du[i] = dh[i] * silu;
		dg[i] = dh[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
	}
}
