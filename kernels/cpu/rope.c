/*
 * rope.c - rotary position embedding on a slice of each head, in HF's
 * rotate_half layout or DeepSeek's interleaved one.
 *
 * HF (LlamaRotaryEmbedding + apply_rotary_pos_emb): with half = Dr/2,
 *   out[i]        = x[i]*cos[i] - x[i+half]*sin[i]
 *   out[i+half]   = x[i+half]*cos[i] + x[i]*sin[i]
 * where angle[i] = pos * inv_freq[i] and cos, sin are multiplied by the
 * RoPE type's attention factor (1 but for yarn).  DeepSeek's
 * rope_interleave rotates adjacent pairs (2i, 2i+1) by the same angle[i],
 * with the same arithmetic: its output is a fixed permutation of the one
 * transformers computes after de-interleaving, the same for q and k, so
 * their dot products are unchanged.  The rotated part may be a slice of
 * each head (DeepSeek's qk_rope_head_dim of q_head_dim): the caller points
 * x at it and gives the heads' stride; the floats outside it are not
 * touched.
 *
 * The caller computes inv_freq for the model's RoPE type
 * (lib/config/hfconfig.c, hp_model_spec_rope).  The angles are computed in
 * double and rounded once; transformers' table is float32 (inv_freq, the
 * angle and cos/sin), so it differs from this one by a few ulps at large
 * positions.
 */
#include <math.h>

#include "cpu/ops.h"
#include "cpu/pool.h"

void hp_rope_table(float *cos_t, float *sin_t, int T, int head_dim, const double *inv_freq,
		   double attention_factor)
{
	int half = head_dim / 2;

	for (int t = 0; t < T; t++)
		for (int i = 0; i < half; i++) {
			double a = (double)t * inv_freq[i];
			cos_t[t * half + i] = (float)(cos(a) * attention_factor);
			sin_t[t * half + i] = (float)(sin(a) * attention_factor);
		}
}

struct rope_args {
	float *x;
	const int32_t *pos;
	const float *cos_t, *sin_t;
	int n_heads, ld, Dr, inter;
	float sign;
};

/* Tokens [n0, n1); each token's values are rotated alone, so any split
 * over threads gives the same bits. */
static void rotate_range(void *p, long n0, long n1)
{
	const struct rope_args *ra = p;
	float *x = ra->x, sign = ra->sign;
	const int32_t *pos = ra->pos;
	const float *cos_t = ra->cos_t, *sin_t = ra->sin_t;
	int n_heads = ra->n_heads, ld = ra->ld, half = ra->Dr / 2;
	/* pair i is (lo, lo + gap): (i, i + half) or (2i, 2i + 1) */
	int step = ra->inter ? 2 : 1, gap = ra->inter ? 1 : half;

	for (long n = n0; n < n1; n++) {
		const float *c = cos_t + (long)pos[n] * half;
		const float *s = sin_t + (long)pos[n] * half;
		for (int h = 0; h < n_heads; h++) {
			float *v = x + (n * n_heads + h) * ld;
			for (int i = 0; i < half; i++) {
				float *lo = v + i * step, *hi = lo + gap;
				float a = *lo, b = *hi;
				float si = sign * s[i];
				*lo = a * c[i] - b * si;
				*hi = b * c[i] + a * si;
			}
		}
	}
}

static void rotate(float *x, const int32_t *pos, const float *cos_t, const float *sin_t,
		   long N, int n_heads, int ld, int Dr, int inter, float sign)
{
	struct rope_args a = { x, pos, cos_t, sin_t, n_heads, ld, Dr, inter, sign };
	long per_token = (long)n_heads * Dr;

	hp_parallel_for(N, HP_POOL_GRAIN / (per_token > 0 ? per_token : 1) + 1, 1, rotate_range, &a);
}

void hp_rope_fwd(float *x, const int32_t *pos, const float *cos_t, const float *sin_t,
		 long N, int n_heads, int ld, int Dr, int inter)
{
	rotate(x, pos, cos_t, sin_t, N, n_heads, ld, Dr, inter, 1.0f);
}

/* The rotation is orthogonal, so its adjoint is the rotation by -angle. */
void hp_rope_bwd(float *dx, const int32_t *pos, const float *cos_t, const float *sin_t,
		 long N, int n_heads, int ld, int Dr, int inter)
{
	rotate(dx, pos, cos_t, sin_t, N, n_heads, ld, Dr, inter, -1.0f);
}
