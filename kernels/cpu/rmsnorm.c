/*
 * rmsnorm.c - LlamaRMSNorm forward and backward.
 *
 * Forward follows HF: variance = mean(x^2) in fp32, x * rsqrt(var + eps),
 * then weight * that.  The mean is accumulated in double so the result does
 * not depend on the summation order of a future SIMD path.
 */
#include <math.h>

#include "cpu/ops.h"
#include "cpu/pool.h"
#include "cpu/vec.h"

/*
 * Threads (pool.h): the forward and the backward's dx split the rows, each
 * row computed alone.  The backward's dw sums over the rows: one thread
 * keeps it in the row loop (one pass over x and dy), more threads split
 * the columns in a second pass, each column summed over the rows in the
 * same order with the same operations, so both give the same bits.
 */
struct rms_args {
	float *y, *rstd, *dx, *dw;
	const float *x, *w, *dy, *rstd_in;
	long N;
	int C, accumulate, with_dw;
	float eps;
};

/*
 * Each row's double sum (of squares; the backward's dot) runs in element
 * order, one add after another, so a row alone waits on the add's latency
 * at every element: RMSNorm took 1.4% of the bench's wide-model step
 * (perf, HP_CPU=avx2).  The row loops take four rows at a time, one double
 * lane each: every lane adds its own row's terms in element order with the
 * operations of the one-row loop, so each row's bits are those of the row
 * computed alone (test-kernels checks this against a one-row loop).  The
 * last rows of a range, fewer than four, run as a block whose spare lanes
 * repeat its first row and are thrown away.  dw, summed over rows, gets its
 * rows' terms in row order.  The per-element passes use 8-float vectors,
 * lane for lane the scalar expressions.
 */
typedef float rms_v4f __attribute__((vector_size(16)));
typedef double rms_v4d __attribute__((vector_size(32)));

#define RMS_ROWS 4

/* rows[r] = row n + r of base for r < R (R <= RMS_ROWS); the spare lanes
 * past R point at row n */
static void rms_rows(const float **rows, const float *base, long n, int R, long C)
{
	for (int r = 0; r < RMS_ROWS; r++)
		rows[r] = base + (n + (r < R ? r : 0)) * C;
}

/* y = w * (x * r) over one row */
static inline void rms_y_row(float *y, const float *x, const float *w, float r, int C)
{
	hp_v8 rv = hp_v8_set1(r);
	int c = 0;

	for (; c + 8 <= C; c += 8)
		hp_v8_store(y + c, hp_v8_load(w + c) * (hp_v8_load(x + c) * rv));
	for (; c < C; c++)
		y[c] = w[c] * (x[c] * r);
}

HP_TARGET_CLONES
static void rms_fwd_span(const struct rms_args *a, long n0, long n1)
{
	int C = a->C;

	for (long n = n0; n < n1; n += RMS_ROWS) {
		int R = n1 - n < RMS_ROWS ? (int)(n1 - n) : RMS_ROWS;
		const float *x[RMS_ROWS];
		rms_v4d ss = { 0, 0, 0, 0 };

		rms_rows(x, a->x, n, R, C);
		for (int c = 0; c < C; c++) {
			rms_v4f v = { x[0][c], x[1][c], x[2][c], x[3][c] };
			rms_v4d d = __builtin_convertvector(v, rms_v4d);

			ss += d * d;
		}
		for (int r = 0; r < R; r++) {
			float rs = (float)(1.0 / sqrt(ss[r] / C + a->eps));

			a->rstd[n + r] = rs;
			rms_y_row(a->y + (n + r) * C, x[r], a->w, rs, C);
		}
	}
}

/* (a target_clones function cannot be called through a pointer) */
static void rms_fwd_rows(void *p, long n0, long n1)
{
	rms_fwd_span(p, n0, n1);
}

void hp_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int C, float eps)
{
	struct rms_args a = { .y = y, .rstd = rstd, .x = x, .w = w, .C = C, .eps = eps };

	hp_parallel_for(N, HP_POOL_GRAIN / (C > 0 ? C : 1) + 1, 1, rms_fwd_rows, &a);
}

/*
 * With xhat = x * r and y = w * xhat:
 *   dw += sum_n dy * xhat
 *   dx  = r * (dy*w - xhat * mean(dy*w*xhat))
 * rms_dx_row is the second line over one row, given its mean.
 */
static inline void rms_dx_row(float *dx, const float *x, const float *dy, const float *w, float r, float mean,
			      int C, int accumulate)
{
	hp_v8 rv = hp_v8_set1(r), mv = hp_v8_set1(mean);
	int c = 0;

	for (; c + 8 <= C; c += 8) {
		hp_v8 xh = hp_v8_load(x + c) * rv;
		hp_v8 v = rv * (hp_v8_load(dy + c) * hp_v8_load(w + c) - xh * mv);

		hp_v8_store(dx + c, accumulate ? hp_v8_load(dx + c) + v : v);
	}
	for (; c < C; c++) {
		float xh = x[c] * r;
		float v = r * (dy[c] * w[c] - xh * mean);

		dx[c] = accumulate ? dx[c] + v : v;
	}
}

HP_TARGET_CLONES
static void rms_bwd_span(const struct rms_args *a, long n0, long n1)
{
	const float *w = a->w;
	float *dw = a->dw;
	int C = a->C;

	for (long n = n0; n < n1; n += RMS_ROWS) {
		int R = n1 - n < RMS_ROWS ? (int)(n1 - n) : RMS_ROWS;
		const float *x[RMS_ROWS], *dy[RMS_ROWS];
		rms_v4d dot = { 0, 0, 0, 0 };
		rms_v4f rv;

		rms_rows(x, a->x, n, R, C);
		rms_rows(dy, a->dy, n, R, C);
		for (int r = 0; r < RMS_ROWS; r++)
			rv[r] = a->rstd_in[n + (r < R ? r : 0)];
		for (int c = 0; c < C; c++) {
			rms_v4f xv = { x[0][c], x[1][c], x[2][c], x[3][c] };
			rms_v4f dv = { dy[0][c], dy[1][c], dy[2][c], dy[3][c] };
			rms_v4f xh = xv * rv;

			dot += __builtin_convertvector(dv, rms_v4d) * (double)w[c] *
			       __builtin_convertvector(xh, rms_v4d);
			if (a->with_dw) {
				rms_v4f t = dv * xh;
				float s = dw[c];

				for (int r = 0; r < R; r++)
					s += t[r];
				dw[c] = s;
			}
		}
		for (int r = 0; r < R; r++)
			rms_dx_row(a->dx + (n + r) * C, x[r], dy[r], w, rv[r], (float)(dot[r] / C), C,
				   a->accumulate);
	}
}

/* (a target_clones function cannot be called through a pointer) */
static void rms_bwd_rows(void *p, long n0, long n1)
{
	rms_bwd_span(p, n0, n1);
}

/* dw[c0..c1) += sum over the rows, in row order, of dy * xhat. */
static void rms_bwd_dw_cols(void *p, long c0, long c1)
{
	const struct rms_args *a = p;
	const float *x = a->x, *dy = a->dy, *rstd = a->rstd_in;
	float *dw = a->dw;
	long C = a->C;

	for (long n = 0; n < a->N; n++) {
		const float *xr = x + n * C, *dyr = dy + n * C;
		float r = rstd[n];

		for (long c = c0; c < c1; c++)
			dw[c] += dyr[c] * (xr[c] * r);
	}
}

void hp_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
		    const float *rstd, long N, int C, int accumulate)
{
	struct rms_args a = { .dx = dx, .dw = dw, .x = x, .w = w, .dy = dy, .rstd_in = rstd, .N = N, .C = C,
			      .accumulate = accumulate };

	if (N * C < 2 * HP_POOL_GRAIN || hp_pool_threads() < 2) {
		a.with_dw = 1;
		rms_bwd_rows(&a, 0, N);
		return;
	}
	hp_parallel_for(N, HP_POOL_GRAIN / (C > 0 ? C : 1) + 1, 1, rms_bwd_rows, &a);
	hp_parallel_for(C, 1, 8, rms_bwd_dw_cols, &a);
}

/*
 * The fused kernel (fused_rmsnorm): h = a + b, the residual add that makes
 * the norm's input, and y = w * h * rstd in one pass over each row, with
 * eight-lane vectors (GCC vector extensions, cloned for AVX2).  The sum of
 * squares runs in eight double lanes, so it may differ from the sequential
 * double sum of hp_rmsnorm_fwd in the last bits of a double, which the
 * float result almost never sees.  h may alias a or b.
 */
typedef double hp_v4d __attribute__((vector_size(32)));

HP_TARGET_CLONES
void hp_rmsnorm_res_fwd(float *h, float *y, float *rstd, const float *a, const float *b,
			const float *w, long N, int C, float eps)
{
	for (long n = 0; n < N; n++) {
		const float *ar = a + n * C, *br = b ? b + n * C : NULL;
		float *hr = h + n * C, *yr = y + n * C;
		hp_v4d s0 = { 0, 0, 0, 0 }, s1 = { 0, 0, 0, 0 };
		double ss;
		int c = 0;

		for (; c + 8 <= C; c += 8) {
			hp_v8 x = hp_v8_load(ar + c);
			hp_v4d lo, hi;

			if (br)
				x += hp_v8_load(br + c);
			hp_v8_store(hr + c, x);
			lo = (hp_v4d){ x[0], x[1], x[2], x[3] };
			hi = (hp_v4d){ x[4], x[5], x[6], x[7] };
			s0 += lo * lo;
			s1 += hi * hi;
		}
		ss = ((s0[0] + s1[0]) + (s0[2] + s1[2])) + ((s0[1] + s1[1]) + (s0[3] + s1[3]));
		for (; c < C; c++) {
			float x = br ? ar[c] + br[c] : ar[c];

			hr[c] = x;
			ss += (double)x * x;
		}
		float r = (float)(1.0 / sqrt(ss / C + eps));

		rstd[n] = r;
		rms_y_row(yr, hr, w, r, C);
	}
}

/* The backward of both, vectorized the same way: dx (+)= r * (dy*w - xhat *
 * mean(dy*w*xhat)), dw += dy * xhat.  With accumulate, dx already holds the
 * residual's gradient, which is what makes the residual add free. */
HP_TARGET_CLONES
void hp_rmsnorm_bwd_vec(float *dx, float *dw, const float *dy, const float *x, const float *w,
			const float *rstd, long N, int C, int accumulate)
{
	for (long n = 0; n < N; n++) {
		const float *xr = x + n * C, *dyr = dy + n * C;
		float r = rstd[n];
		hp_v8 rv = hp_v8_set1(r);
		hp_v4d s0 = { 0, 0, 0, 0 }, s1 = { 0, 0, 0, 0 };
		double dot;
		int c = 0;

		for (; c + 8 <= C; c += 8) {
			hp_v8 xh = hp_v8_load(xr + c) * rv, d = hp_v8_load(dyr + c);
			hp_v8 p = d * hp_v8_load(w + c);
			hp_v4d lo = { p[0], p[1], p[2], p[3] }, hi = { p[4], p[5], p[6], p[7] };
			hp_v4d xl = { xh[0], xh[1], xh[2], xh[3] }, xhh = { xh[4], xh[5], xh[6], xh[7] };

			s0 += lo * xl;
			s1 += hi * xhh;
			hp_v8_store(dw + c, hp_v8_load(dw + c) + d * xh);
		}
		dot = ((s0[0] + s1[0]) + (s0[2] + s1[2])) + ((s0[1] + s1[1]) + (s0[3] + s1[3]));
		for (; c < C; c++) {
			float xh = xr[c] * r;

			dot += (double)dyr[c] * w[c] * xh;
			dw[c] += dyr[c] * xh;
		}
		rms_dx_row(dx + n * C, xr, dyr, w, r, (float)(dot / C), C, accumulate);
	}
}
