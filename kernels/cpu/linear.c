/*
 * linear.c - y = x W^T + b, the reference loops and the OpenBLAS path.
 *
 * The reference accumulates each dot product in double, so it is a
 * higher-precision yardstick for the sgemm path rather than a copy of its
 * rounding.  The BLAS path is three sgemm calls: forward, dx, dW.
 */
#include <cblas.h>

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

static void linear_fwd_blas(float *y, const float *x, const float *W, const float *b, long N, int K, int O)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, O, K,
		    1.0f, x, K, W, K, 0.0f, y, O);
	if (b)
		for (long n = 0; n < N; n++)
			for (int o = 0; o < O; o++)
				y[n * O + o] += b[o];
}

static void linear_bwd_blas(float *dx, float *dW, float *db, const float *dy, const float *x,
			    const float *W, long N, int K, int O, int accumulate)
{
	/* dx[N,K] = dy[N,O] W[O,K] */
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, K, O,
		    1.0f, dy, O, W, K, accumulate ? 1.0f : 0.0f, dx, K);
	/* dW[O,K] += dy^T[O,N] x[N,K] */
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, K, (int)N,
		    1.0f, dy, O, x, K, 1.0f, dW, K);
	if (db)
		for (long n = 0; n < N; n++)
			for (int o = 0; o < O; o++)
				db[o] += dy[n * O + o];
}

void hp_attention_fwd_blas(float *out, float *P, const float *q, const float *k, const float *v,
			   int B, int T, int n_heads, int n_kv_heads, int head_dim);
void hp_attention_bwd_blas(float *dq, float *dk, float *dv, const float *dout, const float *P,
			   const float *q, const float *k, const float *v, float *scratch,
			   int B, int T, int n_heads, int n_kv_heads, int head_dim);

const struct hp_cpu_ops hp_cpu_ops_reference = {
	.name = "reference",
	.linear_fwd = hp_linear_fwd_ref,
	.linear_bwd = hp_linear_bwd_ref,
	.attention_fwd = hp_attention_fwd_ref,
	.attention_bwd = hp_attention_bwd_ref,
};

const struct hp_cpu_ops hp_cpu_ops_blas = {
	.name = "blas",
	.linear_fwd = linear_fwd_blas,
	.linear_bwd = linear_bwd_blas,
	.attention_fwd = hp_attention_fwd_blas,
	.attention_bwd = hp_attention_bwd_blas,
};

const struct hp_cpu_ops *hp_cpu_ops_get(void)
{
	const char *s = getenv("HP_KERNELS");

	if (s && !strcmp(s, "reference"))
		return &hp_cpu_ops_reference;
	return &hp_cpu_ops_blas;
}
