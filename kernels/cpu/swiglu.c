/*
 * swiglu.c - the gated MLP activation h = silu(g) * u and its gradient.
 */
#include <math.h>

#include "cpu/ops.h"
#include "cpu/pool.h"
#include "cpu/vec.h"

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

/*
 * The vector path: sigmoid(g) = 1 / (1 + exp(-g)) with hp_vexp on -|g| so
 * the exponential never overflows: for g < 0, sigmoid = e / (1 + e) with
 * e = exp(g).  The numerator is chosen before the one division (each lane
 * divides what it divided when both quotients were computed and one was
 * kept, so the bits are the same, at half the divisions).
 */
static inline hp_v8 sigmoid8(hp_v8 g)
{
	hp_v8i neg = g < hp_v8_set1(0.0f);
	hp_v8 a = hp_v8_select(neg, g, -g);             /* -|g| */
	hp_v8 e = hp_vexp(a);
	hp_v8 one = hp_v8_set1(1.0f);
	return hp_v8_select(neg, e, one) / (one + e);
}

HP_TARGET_CLONES
static void swiglu_fwd_span(float *h, const float *g, const float *u, long n)
{
	long i = 0;

	for (; i + 8 <= n; i += 8) {
		hp_v8 gv = hp_v8_load(g + i);
		hp_v8_store(h + i, gv * sigmoid8(gv) * hp_v8_load(u + i));
	}
	hp_swiglu_fwd(h + i, g + i, u + i, n - i);
}

HP_TARGET_CLONES
static void swiglu_bwd_span(float *dg, float *du, const float *dh, const float *g, const float *u, long n)
{
	long i = 0;
	hp_v8 one = hp_v8_set1(1.0f);

	for (; i + 8 <= n; i += 8) {
		hp_v8 gv = hp_v8_load(g + i), uv = hp_v8_load(u + i), d = hp_v8_load(dh + i);
		hp_v8 s = sigmoid8(gv);
		hp_v8_store(du + i, d * (gv * s));
		hp_v8_store(dg + i, d * uv * s * (one + gv * (one - s)));
	}
	hp_swiglu_bwd(dg + i, du + i, dh + i, g + i, u + i, n - i);
}

/* The vector kernels over threads (pool.h): each element is computed alone,
 * so any split gives the same bits; spans start at multiples of 8, so the
 * vector and scalar lanes fall where they fall on one thread. */
struct swiglu_args { float *h, *dg, *du; const float *dh, *g, *u; };

static void swiglu_fwd_range(void *p, long i0, long i1)
{
	const struct swiglu_args *a = p;

	swiglu_fwd_span(a->h + i0, a->g + i0, a->u + i0, i1 - i0);
}

static void swiglu_bwd_range(void *p, long i0, long i1)
{
	const struct swiglu_args *a = p;

	swiglu_bwd_span(a->dg + i0, a->du + i0, a->dh + i0, a->g + i0, a->u + i0, i1 - i0);
}

void hp_swiglu_fwd_vec(float *h, const float *g, const float *u, long n)
{
	struct swiglu_args a = { .h = h, .g = g, .u = u };

	hp_parallel_for(n, HP_POOL_GRAIN, 8, swiglu_fwd_range, &a);
}

void hp_swiglu_bwd_vec(float *dg, float *du, const float *dh, const float *g, const float *u, long n)
{
	struct swiglu_args a = { .dg = dg, .du = du, .dh = dh, .g = g, .u = u };

	hp_parallel_for(n, HP_POOL_GRAIN, 8, swiglu_bwd_range, &a);
}

void hp_swiglu_rows_fwd(float *h, const float *gu, long rows, int I)
{
	for (long r = 0; r < rows; r++)
		hp_swiglu_fwd_vec(h + r * I, gu + r * 2 * I, gu + r * 2 * I + I, I);
}

void hp_swiglu_rows_bwd(float *dgu, const float *dh, const float *gu, long rows, int I)
{
	for (long r = 0; r < rows; r++)
		hp_swiglu_bwd_vec(dgu + r * 2 * I, dgu + r * 2 * I + I, dh + r * I, gu + r * 2 * I,
				  gu + r * 2 * I + I, I);
}
