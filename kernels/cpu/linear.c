/*
 * linear.c - y = x W^T + b, the reference loops and the OpenBLAS path.
 *
 * The reference accumulates each dot product in double, so it is a
 * higher-precision yardstick for the sgemm path rather than a copy of its
 * rounding.  The fast path is three GEMMs (hp_sgemm: hp's AVX-512 kernel
 * where the CPU has it, OpenBLAS otherwise): forward, dx, dW.
 */
#include "cpu/gemm.h"

#include "cpu/ops.h"

void hp_linear_fwd_ref(float *y, const float *x, const float *W, const float *b, long N, int K, int O)
{
	for (long n = 0; n < N; n++)
		for (int o = 0; o < O; o++) {
			double s = b ? b[o] : 0.0;
			for (int i = 0; i < K; i++)
				s += (double)x[n * K + i] * W[(long)o * K + i];
			y[n * O + o] = (float)s;
		}
}

void hp_linear_bwd_ref(float *dx, float *dW, float *db, const float *dy, const float *x,
		       const float *W, long N, int K, int O, int accumulate)
{
	for (long n = 0; n < N; n++)
		for (int i = 0; i < K; i++) {
			double s = 0;
			for (int o = 0; o < O; o++)
				s += (double)dy[n * O + o] * W[(long)o * K + i];
			dx[n * K + i] = accumulate ? dx[n * K + i] + (float)s : (float)s;
		}
	for (int o = 0; o < O; o++) {
		for (int i = 0; i < K; i++) {
			double s = 0;
			for (long n = 0; n < N; n++)
				s += (double)dy[n * O + o] * x[n * K + i];
			dW[(long)o * K + i] += (float)s;
		}
		if (db) {
			double s = 0;
			for (long n = 0; n < N; n++)
				s += dy[n * O + o];
			db[o] += (float)s;
		}
	}
}

void hp_linear_fwd_blas(float *y, const float *x, const float *W, const float *b, long N, int K, int O)
{
	hp_sgemm(0, 1, (int)N, O, K,
		    1.0f, x, K, W, K, 0.0f, y, O);
	if (b)
		for (long n = 0; n < N; n++)
			for (int o = 0; o < O; o++)
				y[n * O + o] += b[o];
}

void hp_linear_bwd_blas(float *dx, float *dW, float *db, const float *dy, const float *x,
			const float *W, long N, int K, int O, int accumulate)
{
	/* dx[N,K] = dy[N,O] W[O,K] */
	hp_sgemm(0, 0, (int)N, K, O,
		    1.0f, dy, O, W, K, accumulate ? 1.0f : 0.0f, dx, K);
	/* dW[O,K] += dy^T[O,N] x[N,K] */
	hp_sgemm(1, 0, O, K, (int)N,
		    1.0f, dy, O, x, K, 1.0f, dW, K);
	if (db)
		for (long n = 0; n < N; n++)
			for (int o = 0; o < O; o++)
				db[o] += dy[n * O + o];
}

void hp_grouped_linear_fwd(hp_linear_fwd_fn *f, float *y, const float *x, const float *W, size_t ws,
			   const int32_t *off, int nx, int K, int O)
{
	for (int i = 0; i < nx; i++) {
		long r0 = off[i], n = off[i + 1] - off[i];
		if (n > 0)
			f(y + r0 * O, x + r0 * K, W + i * ws, NULL, n, K, O);
	}
}

void hp_grouped_linear_bwd(hp_linear_bwd_fn *f, float *dx, float *dW, size_t gs, const float *dy, const float *x,
			   const float *W, size_t ws, const int32_t *off, int nx, int K, int O, int accumulate)
{
	for (int i = 0; i < nx; i++) {
		long r0 = off[i], n = off[i + 1] - off[i];
		if (n > 0)
			f(dx + r0 * K, dW + i * gs, NULL, dy + r0 * O, x + r0 * K, W + i * ws, n, K, O, accumulate);
	}
}
