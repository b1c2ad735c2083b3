/*
 * test-cuda.c - every CUDA op against the CPU reference, forward and
 * backward.  Skips (with the reason) when the build has no CUDA backend or
 * the machine no GPU; that is the normal case on CI.
 */
#include <math.h>

#include "cpu/ops.h"
#include "tap.h"
#ifdef HP_HAVE_CUDA
#include "cuda/ops.h"
#endif

#ifdef HP_HAVE_CUDA
static double rel_l2(const float *a, const float *b, size_t n)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		den += (double)b[i] * b[i];
	}
	return sqrt(num / (den > 0 ? den : 1));
}

static void test_rmsnorm(void)
{
	long N = 257;
	int C = 1000;
	size_t n = (size_t)N * C;
	float *x = malloc(n * 4), *w = malloc(C * 4), *y1 = malloc(n * 4), *y2 = malloc(n * 4);
	float *r1 = malloc(N * 4), *r2 = malloc(N * 4), *dy = malloc(n * 4);
	float *dx1 = malloc(n * 4), *dx2 = malloc(n * 4), *dw1 = calloc(C, 4), *dw2 = calloc(C, 4);
	struct hp_err e;

	hp_err_clear(&e);
	for (size_t i = 0; i < n; i++) {
		x[i] = sinf((float)i * 0.37f);
		dy[i] = cosf((float)i * 0.11f);
	}
	for (int c = 0; c < C; c++)
		w[c] = 1.0f + 0.001f * c;
	hp_rmsnorm_fwd(y1, r1, x, w, N, C, 1e-6f);
	ok(hp_cuda_rmsnorm_fwd(y2, r2, x, w, N, C, 1e-6f, &e) == 0 && rel_l2(y2, y1, n) < 1e-6,
	   "cuda rmsnorm forward equals the CPU reference %s", e.msg);
	hp_rmsnorm_bwd(dx1, dw1, dy, x, w, r1, N, C, 0);
	ok(hp_cuda_rmsnorm_bwd(dx2, dw2, dy, x, w, r1, N, C, &e) == 0 &&
	   rel_l2(dx2, dx1, n) < 1e-5 && rel_l2(dw2, dw1, C) < 1e-5,
	   "cuda rmsnorm backward equals the CPU reference %s", e.msg);
	free(x); free(w); free(y1); free(y2); free(r1); free(r2); free(dy);
	free(dx1); free(dx2); free(dw1); free(dw2);
}
#endif

int main(void)
{
#ifndef HP_HAVE_CUDA
	tap_skip("built without CUDA (no nvcc)", "cuda ops against the CPU reference");
#else
	int n = hp_cuda_device_count();
	if (n == 0) {
		tap_skip("no CUDA device on this machine", "cuda ops against the CPU reference");
	} else {
		char name[128];
		struct hp_err e;
		if (hp_cuda_device_name(0, name, sizeof(name), &e) == 0)
			tap_diag("device 0: %s", name);
		test_rmsnorm();
	}
#endif
	return tap_done();
}
