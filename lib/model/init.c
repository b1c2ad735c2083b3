/*
 * init.c - counter-based random initialization: Philox4x32-10 keyed by
 * (seed, tensor name), Box-Muller to normals (and ln of a uniform for the
 * Gated DeltaNet's A_log), per element index.
 *
 * The exact definition is in init.h.  This file is written so that the
 * definition is the code: every floating-point step is a single IEEE double
 * operation rounded to nearest, in a fixed order, with no libm call except
 * sqrt (correctly rounded by IEEE 754) and frexp (exact).  ln and sin/cos
 * are our own short polynomials rather than libm's, whose last bit differs
 * between glibc releases, CUDA and Python builds; with them a rank on any
 * machine, or a GPU kernel, draws the same bits.  That also needs no FMA
 * contraction: the Makefile builds with -ffp-contract=off, which matters on
 * targets with FMA (aarch64, -march=native); without it the results would
 * still be good normals but no longer bit-identical to the reference.
 *
 * What it is not: fast.  About 50 ns an element on one core; a rank
 * initializes only its own slice, once.
 */
#include <math.h>

#include "model/init.h"
#include "model/params.h"

enum hp_init_kind hp_init_kind_of(const char *hf_name)
{
	static const char norm_w[] = "norm.weight";
	static const char bias[] = "bias";
	size_t len = strlen(hf_name);

	/* Gated DeltaNet (Qwen3-Next, Qwen3.5): ones_(dt_bias) and A_log from
	 * ln(uniform(lo, 16)); no other family has these names */
	if (hp_param_ends(hf_name, ".linear_attn.dt_bias"))
		return HP_INIT_ONES;
	if (hp_param_ends(hf_name, ".linear_attn.A_log"))
		return HP_INIT_LOG_UNIFORM;
	/* Every RMSNorm in these models is a module whose name ends in "norm"
	 * (input_layernorm, post_attention_layernorm, norm, q_norm, k_norm) and
	 * whose only parameter is "weight"; no Linear or Embedding is so named. */
	if (len >= sizeof(norm_w) - 1 && !strcmp(hf_name + len - (sizeof(norm_w) - 1), norm_w))
		return HP_INIT_ONES;
	/* GPT-OSS's router bias is drawn like its weight (GptOssTopKRouter) */
	if (len >= 16 && !strcmp(hf_name + len - 16, ".mlp.router.bias"))
		return HP_INIT_NORMAL;
	/* a frozen buffer (DeepSeek's e_score_correction_bias) starts at zero,
	 * as its _init_weights has it */
	if (hp_param_frozen(hf_name))
		return HP_INIT_ZEROS;
	/* A parameter called exactly "bias" (not e.g. a "..._bias" buffer). */
	if (len >= sizeof(bias) - 1 && !strcmp(hf_name + len - (sizeof(bias) - 1), bias) &&
	    (len == sizeof(bias) - 1 || hf_name[len - sizeof(bias)] == '.'))
		return HP_INIT_ZEROS;
	return HP_INIT_NORMAL;
}

enum hp_init_kind hp_init_kind_for(const struct hp_model_spec *s, const char *hf_name)
{
	enum hp_init_kind k = hp_init_kind_of(hf_name);

	/* Qwen3NextRMSNorm / Qwen3_5RMSNorm compute x_hat * (1 + weight) and
	 * start at zero; the Gated DeltaNet's gated norm (Qwen3NextRMSNormGated)
	 * is x_hat * weight and keeps its ones. */
	if (s && s->norm_zc && k == HP_INIT_ONES && !hp_param_ends(hf_name, ".linear_attn.dt_bias") &&
	    !hp_param_ends(hf_name, ".linear_attn.norm.weight"))
		return HP_INIT_ZEROS;
	return k;
}

double hp_init_log_uniform_lo(const struct hp_model_spec *s)
{
	/* transformers 4.57's Qwen3NextPreTrainedModel: A_log.uniform_(0, 16);
	 * 5.x (Qwen3-Next and Qwen3.5 alike): uniform_(0.01, 16) */
	if (s && !strcmp(s->model_type, "qwen3_next") && !strncmp(s->transformers_version, "4.", 2))
		return 0.0;
	return 0.01;
}

/* splitmix64's output function: a bijection of 64-bit words with full
 * avalanche, so nearby seeds and similar names give unrelated keys. */
static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t hp_init_key(uint64_t seed, const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a 64 offset basis */

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 0x100000001b3ull;      /* FNV-1a 64 prime */
	return mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ h);
}

void hp_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
	uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
	uint32_t k0 = key[0], k1 = key[1];

	/* Constants from Salmon et al., "Parallel random numbers: as easy as
	 * 1, 2, 3" (SC11), as in Random123's philox.h: the multipliers, and the
	 * Weyl key increments (golden ratio, sqrt(3) - 1). */
	for (int r = 0; r < 10; r++) {
		if (r) {
			k0 += 0x9e3779b9u;
			k1 += 0xbb67ae85u;
		}
		uint64_t p0 = (uint64_t)0xd2511f53u * c0;
		uint64_t p1 = (uint64_t)0xcd9e8d57u * c2;
		uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
		uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
		c1 = (uint32_t)p1;
		c3 = (uint32_t)p0;
		c0 = n0;
		c2 = n2;
	}
	out[0] = c0;
	out[1] = c1;
	out[2] = c2;
	out[3] = c3;
}

/*
 * ln(x) for x > 0 finite: x = m 2^e with m in [sqrt(1/2), sqrt(2)), then
 * ln m = 2 atanh(s) = 2 (s + s^3/3 + ... + s^21/21) with s = (m-1)/(m+1),
 * |s| <= 0.1716; the first dropped term is below 3e-17 of the sum.
 * Relative error a few 1e-16, far below the float the result ends in.
 */
static double hp_init_ln(double x)
{
	int e;
	double m = frexp(x, &e);   /* exact: m in [0.5, 1) */

	if (m < 0.7071067811865476) {   /* sqrt(1/2) rounded: exact scaling either side */
		m = m * 2.0;
		e = e - 1;
	}
	double s = (m - 1.0) / (m + 1.0);
	double s2 = s * s;
	double p = 1.0 / 21.0;
	for (int k = 9; k >= 0; k--)
		p = p * s2 + 1.0 / (double)(2 * k + 1);
	return (double)e * 0.6931471805599453 + 2.0 * s * p;   /* ln 2 rounded */
}

/*
 * sin and cos of 2 pi u for u in [0, 1) with 53-bit resolution.  4u splits
 * exactly into a quadrant q and a remainder x in [-1/2, 1/2], so the angle
 * reduction is exact and the polynomials only see |a| <= pi/4, where Taylor
 * through a^17 (sin) and a^16 (cos) leaves errors under 1e-17.
 */
static void hp_init_sincos2pi(double u, double *sn, double *cs)
{
	/* (-1)^k / (2k+1)! and (-1)^k / (2k)!; the factorials are exact doubles. */
	static const double S[9] = {
		1.0, -1.0 / 6.0, 1.0 / 120.0, -1.0 / 5040.0, 1.0 / 362880.0,
		-1.0 / 39916800.0, 1.0 / 6227020800.0, -1.0 / 1307674368000.0,
		1.0 / 355687428096000.0,
	};
	static const double C[9] = {
		1.0, -1.0 / 2.0, 1.0 / 24.0, -1.0 / 720.0, 1.0 / 40320.0,
		-1.0 / 3628800.0, 1.0 / 479001600.0, -1.0 / 87178291200.0,
		1.0 / 20922789888000.0,
	};
	double t = 4.0 * u;
	int q = (int)t;
	double x = t - (double)q;

	if (x > 0.5) {
		x = x - 1.0;
		q = q + 1;
	}
	double a = x * 1.5707963267948966;   /* pi/2 rounded */
	double a2 = a * a;
	double ps = S[8], pc = C[8];
	for (int k = 7; k >= 0; k--) {
		ps = ps * a2 + S[k];
		pc = pc * a2 + C[k];
	}
	double s = a * ps, c = pc;

	/* sin and cos of q pi/2 + a */
	switch (q & 3) {
	case 0:
		*sn = s;
		*cs = c;
		break;
	case 1:
		*sn = c;
		*cs = -s;
		break;
	case 2:
		*sn = -s;
		*cs = -c;
		break;
	default:
		*sn = -c;
		*cs = s;
		break;
	}
}

/* The two standard normals of pair c (elements 2c and 2c+1) of key. */
static void hp_init_pair(uint64_t key, uint64_t c, double z[2])
{
	const uint32_t k[2] = { (uint32_t)key, (uint32_t)(key >> 32) };
	const uint32_t ctr[4] = { (uint32_t)c, (uint32_t)(c >> 32), 0, 0 };
	uint32_t x[4];

	hp_philox4x32_10(ctr, k, x);
	uint64_t a = (((uint64_t)x[1] << 32) | x[0]) >> 11;
	uint64_t b = (((uint64_t)x[3] << 32) | x[2]) >> 11;
	/* u1 in (0, 1] keeps ln finite; both are exact in double (53 bits). */
	double u1 = (double)(a + 1) * 0x1p-53;
	double u2 = (double)b * 0x1p-53;
	double r = sqrt(-2.0 * hp_init_ln(u1));
	double sn, cs;

	hp_init_sincos2pi(u2, &sn, &cs);
	z[0] = r * cs;
	z[1] = r * sn;
}

double hp_init_normal_at(uint64_t key, uint64_t i)
{
	double z[2];

	hp_init_pair(key, i >> 1, z);
	return z[i & 1];
}

double hp_init_uniform_at(uint64_t key, uint64_t i)
{
	const uint32_t k[2] = { (uint32_t)key, (uint32_t)(key >> 32) };
	/* the third word 1: a counter the normal stream (third word 0) never uses */
	const uint32_t ctr[4] = { (uint32_t)i, (uint32_t)(i >> 32), 1, 0 };
	uint32_t x[4];

	hp_philox4x32_10(ctr, k, x);
	uint64_t a = (((uint64_t)x[1] << 32) | x[0]) >> 11;
	return (double)(a + 1) * 0x1p-53;   /* (0, 1], exact */
}

double hp_init_log_uniform_at(uint64_t key, uint64_t i, double lo)
{
	double w = 16.0 - lo;
	double y = lo + w * hp_init_uniform_at(key, i);

	return hp_init_ln(y);
}

void hp_init_normal_slice(float *dst, uint64_t seed, const char *name, uint64_t first,
			  size_t n, float std)
{
	uint64_t key = hp_init_key(seed, name);
	uint64_t i = first, end = first + n;
	double sd = std;

	/* One Philox call per pair; a slice may begin or end mid-pair. */
	while (i < end) {
		double z[2];

		hp_init_pair(key, i >> 1, z);
		for (unsigned lane = i & 1; lane < 2 && i < end; lane++, i++)
			dst[i - first] = (float)(sd * z[lane]);
	}
}

void hp_init_slice(float *dst, const struct hp_model_spec *s, uint64_t seed, const char *name,
		   uint64_t first, size_t n, float std)
{
	switch (hp_init_kind_for(s, name)) {
	case HP_INIT_ONES:
		for (size_t j = 0; j < n; j++)
			dst[j] = 1.0f;
		break;
	case HP_INIT_ZEROS:
		memset(dst, 0, n * sizeof(*dst));
		break;
	case HP_INIT_NORMAL:
		hp_init_normal_slice(dst, seed, name, first, n, std);
		break;
	case HP_INIT_LOG_UNIFORM: {
		uint64_t key = hp_init_key(seed, name);
		double lo = hp_init_log_uniform_lo(s);

		for (size_t j = 0; j < n; j++)
			dst[j] = (float)hp_init_log_uniform_at(key, first + j, lo);
		break;
	}
	}
}

void hp_init_tensor(float *dst, const struct hp_model_spec *s, uint64_t seed, const char *name,
		    size_t numel, float std)
{
	hp_init_slice(dst, s, seed, name, 0, numel, std);
}

void hp_init_zero_row_slice(float *dst, uint64_t first, size_t n, int64_t row, int64_t cols)
{
	if (row < 0 || cols <= 0)
		return;
	uint64_t lo = (uint64_t)row * (uint64_t)cols, hi = lo + (uint64_t)cols;
	uint64_t end = first + n;

	if (lo < first)
		lo = first;
	if (hi > end)
		hi = end;
	for (uint64_t i = lo; i < hi; i++)
		dst[i - first] = 0.0f;
}
