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

#include "cpu/isa.h"
#include "cpu/ops.h"
#include "cpu/pool.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/*
 * The same arithmetic 8 lanes at a time: fma, sqrt, division and
 * multiplication are correctly rounded in AVX2 as in scalar C, so every lane
 * gets exactly the scalar loop's bits (test-optim checks the result against
 * torch either way).
 */
__attribute__((target("avx2,fma")))
static size_t adamw_avx2(float *w, const float *g, float *m, float *v, size_t n, float keep, int decay,
			 float b1, float b2, float ob1, float ob2, float bc2_sqrt, float eps, float neg_step)
{
	const __m256 vk = _mm256_set1_ps(keep), vb1 = _mm256_set1_ps(b1), vb2 = _mm256_set1_ps(b2);
	const __m256 vob1 = _mm256_set1_ps(ob1), vob2 = _mm256_set1_ps(ob2), vbc = _mm256_set1_ps(bc2_sqrt);
	const __m256 veps = _mm256_set1_ps(eps), vns = _mm256_set1_ps(neg_step);
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256 gi = _mm256_loadu_ps(g + i), wi = _mm256_loadu_ps(w + i);
		__m256 mi = _mm256_loadu_ps(m + i), vi = _mm256_loadu_ps(v + i);
		if (decay)
			wi = _mm256_mul_ps(wi, vk);
		mi = _mm256_fmadd_ps(gi, vob1, _mm256_mul_ps(mi, vb1));
		vi = _mm256_fmadd_ps(_mm256_mul_ps(vob2, gi), gi, _mm256_mul_ps(vi, vb2));
		__m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), vbc), veps);
		wi = _mm256_add_ps(wi, _mm256_div_ps(_mm256_mul_ps(vns, mi), denom));
		_mm256_storeu_ps(w + i, wi);
		_mm256_storeu_ps(m + i, mi);
		_mm256_storeu_ps(v + i, vi);
	}
	return i;
}
#endif

/* One step's scalars, and the arrays, for a range of elements; each
 * element is updated alone, so any split over threads gives the same bits
 * (ranges start at multiples of 8: the same lanes go to the vector loop). */
struct adamw_args {
	float *w, *m, *v;
	const float *g;
	float keep, b1, b2, ob1, ob2, bc2_sqrt, eps, neg_step;
	int decay;
};

static void adamw_range(void *p, long i0, long i1)
{
	const struct adamw_args *a = p;
	float *w = a->w + i0, *m = a->m + i0, *v = a->v + i0;
	const float *g = a->g + i0;
	float keep = a->keep, b1 = a->b1, b2 = a->b2, ob1 = a->ob1, ob2 = a->ob2;
	float bc2_sqrt = a->bc2_sqrt, eps = a->eps, neg_step = a->neg_step;
	int decay = a->decay;
	size_t n = (size_t)(i1 - i0), i = 0;

#if defined(__x86_64__) && defined(__GNUC__)
	if (hp_cpu_level() >= HP_CPU_AVX2)
		i = adamw_avx2(w, g, m, v, n, keep, decay, b1, b2, ob1, ob2, bc2_sqrt, eps, neg_step);
#endif
	for (; i < n; i++) {
		float gi = g[i];
		if (decay)
			w[i] *= keep;
		m[i] = fmaf(gi, ob1, m[i] * b1);
		v[i] = fmaf(ob2 * gi, gi, v[i] * b2);
		float denom = sqrtf(v[i]) / bc2_sqrt + eps;
		w[i] = w[i] + (neg_step * m[i]) / denom;
	}
}

float hp_clip_factor(double norm, double max_norm)
{
	float coef;

	if (max_norm <= 0)
		return 1.0f;
	coef = (float)(max_norm / (norm + 1e-6));
	return coef >= 1.0f ? 1.0f : coef;   /* a NaN norm's NaN stays: it scales, as torch's would */
}

void hp_clip_gate(float *cg, const double *ss, const double *loss, const double *aux, const int32_t *bad,
		  double max_norm, int check)
{
	double norm = sqrt(*ss);

	cg[0] = hp_clip_factor(norm, max_norm);
	cg[1] = *bad || (check && !(isfinite(*loss) && isfinite(*aux) && isfinite(norm))) ? 0.0f : 1.0f;
}

void hp_clip_grads(float *g, size_t n, float *cg, const double *ss, const double *loss, const double *aux,
		   const int32_t *bad, double max_norm, int check)
{
	hp_clip_gate(cg, ss, loss, aux, bad, max_norm, check);
	if (cg[0] != 1.0f)
		hp_scale(g, cg[0], (long)n);
}

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
	struct adamw_args a = { w, m, v, g, keep, b1, b2, ob1, ob2, bc2_sqrt, eps, neg_step, decay };

	hp_parallel_for((long)n, HP_POOL_GRAIN / 2, 8, adamw_range, &a);
}
