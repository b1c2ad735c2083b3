/*
 * rmsnorm.c - LlamaRMSNorm forward and backward.
 *
 * Forward follows HF: variance = mean(x^2) in fp32, x * rsqrt(var + eps),
 * then weight * that.  The mean is accumulated in double so the result does
 * not depend on the summation order of a future SIMD path.
 */
#include <math.h>

#include "cpu/ops.h"

void hp_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int C, float eps)
{
	for (long n = 0; n < N; n++) {
		const float *xr = x + n * C;
		float *yr = y + n * C;
		double ss = 0;
		for (int c = 0; c < C; c++)
			ss += (double)xr[c] * xr[c];
		float r = (float)(1.0 / sqrt(ss / C + eps));
		rstd[n] = r;
		for (int c = 0; c < C; c++)
			yr[c] = w[c] * (xr[c] * r);
	}
}

/*
 * With xhat = x * r and y = w * xhat:
 *   dw += sum_n dy * xhat
 *   dx  = r * (dy*w - xhat * mean(dy*w*xhat))
 */
void hp_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
		    const float *rstd, long N, int C, int accumulate)
{
	for (long n = 0; n < N; n++) {
		const float *xr = x + n * C, *dyr = dy + n * C;
		float *dxr = dx + n * C;
		float r = rstd[n];
		double dot = 0;
		for (int c = 0; c < C; c++) {
			float xh = xr[c] * r;
			dot += (double)dyr[c] * w[c] * xh;
			dw[c] += dyr[c] * xh;
		}
		float mean = (float)(dot / C);
		for (int c = 0; c < C; c++) {
			float xh = xr[c] * r;
			float v = r * (dyr[c] * w[c] - xh * mean);
			dxr[c] = accumulate ? dxr[c] + v : v;
		}
	}
}
