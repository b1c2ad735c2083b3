/*
 * adamw.c - one AdamW step on a flat tensor, matching torch.optim.AdamW's
 * single-tensor path (torch 1.13 to 2.x) operation by operation:
 *
 *   w *= 1 - lr*wd                      (decoupled decay, only if decay)
 *   m  = beta1*m + (1-beta1)*g
 *   v  = beta2*v + (1-beta2)*g*g
 *   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
 *   w -= (lr / (1 - beta1^t)) * m / denom
 *
 * The bias corrections are computed in double and rounded to float once, as
 * torch does with its Python-float scalars.  The rounding of each line is
 * torch's too: its vectorised CPU kernels compute add(alpha) and addcmul as
 * fused multiply-adds and addcdiv as (value * m) / denom, so
 *   m = fma(g, 1-beta1, m*beta1)
 *   v = fma((1-beta2)*g, g, v*beta2)
 *   w = w + ((-step_size) * m) / denom
 * which t/unit/test-optim.c checks bit for bit against torch.optim.AdamW.
 */
#include <math.h>

#include "cpu/ops.h"

void hp_adamw_step(float *w, const float *g, float *m, float *v, size_t n,
		   const struct hp_adamw_hparams *h, int decay)
{
	double bc1 = 1.0 - pow(h->beta1, (double)h->step);
	double bc2 = 1.0 - pow(h->beta2, (double)h->step);
	float neg_step = (float)-(h->lr / bc1);
	float bc2_sqrt = (float)sqrt(bc2);
	float keep = decay ? (float)(1.0 - (double)h->lr * h->weight_decay) : 1.0f;
	float b1 = (float)h->beta1, b2 = (float)h->beta2;
	float ob1 = (float)(1.0 - h->beta1), ob2 = (float)(1.0 - h->beta2), eps = (float)h->eps;

	for (size_t i = 0; i < n; i++) {
		float gi = g[i];
		if (decay)
			w[i] *= keep;
		m[i] = fmaf(gi, ob1, m[i] * b1);
		v[i] = fmaf(ob2 * gi, gi, v[i] * b2);
		float denom = sqrtf(v[i]) / bc2_sqrt + eps;
		w[i] = w[i] + (neg_step * m[i]) / denom;
	}
}
