/*
 * vec.h - small vector helpers for the fast CPU paths, written with GCC
 * vector extensions so that one source serves every x86-64 level.
 *
 * Why vector extensions and not intrinsics: the lane-wise semantics are
 * fixed by the source, so a function compiled twice through
 * HP_TARGET_CLONES (a plain x86-64 clone and an x86-64-v3 AVX2 clone, picked
 * at load time by glibc's ifunc) computes bit-identical results on every
 * machine; only the speed differs.  The build also passes
 * -ffp-contract=off, so no clone fuses a*b+c on its own.
 *
 * hp_vexp is Cephes' expf (range reduction by ln 2 in two parts, degree-5
 * polynomial): relative error below 2 ulp over [-87, 88], exp(x) = 0 below
 * -87.3 — used only where the argument is <= 0 (softmax, sigmoid).  The
 * reference kernels keep libm's expf.
 */
#ifndef HP_KERNELS_CPU_VEC_H
#define HP_KERNELS_CPU_VEC_H

#include <stdint.h>

typedef float hp_v8 __attribute__((vector_size(32)));
typedef int32_t hp_v8i __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(HP_NO_CLONES)
#define HP_TARGET_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define HP_TARGET_CLONES
#endif

static inline hp_v8 hp_v8_set1(float x)
{
	return (hp_v8){ x, x, x, x, x, x, x, x };
}

static inline hp_v8 hp_v8_load(const float *p)
{
	hp_v8 v;
	__builtin_memcpy(&v, p, sizeof(v));
	return v;
}

static inline void hp_v8_store(float *p, hp_v8 v)
{
	__builtin_memcpy(p, &v, sizeof(v));
}

static inline float hp_v8_hsum(hp_v8 v)
{
	/* fixed pairwise order: the same on every ISA */
	float a = (v[0] + v[4]) + (v[2] + v[6]);
	float b = (v[1] + v[5]) + (v[3] + v[7]);
	return a + b;
}

/* mask ? a : b, lane-wise (mask lanes are 0 or -1, as comparisons give) */
static inline hp_v8 hp_v8_select(hp_v8i mask, hp_v8 a, hp_v8 b)
{
	hp_v8i ai, bi, r;
	hp_v8 out;
	__builtin_memcpy(&ai, &a, sizeof(a));
	__builtin_memcpy(&bi, &b, sizeof(b));
	r = (ai & mask) | (bi & ~mask);
	__builtin_memcpy(&out, &r, sizeof(out));
	return out;
}

static inline hp_v8 hp_v8_max(hp_v8 a, hp_v8 b)
{
	return hp_v8_select(a > b, a, b);
}

static inline hp_v8 hp_vexp(hp_v8 x)
{
	const hp_v8 hi = hp_v8_set1(88.3762626647949f), lo = hp_v8_set1(-87.3365478515625f);
	hp_v8i under = x < lo;
	x = hp_v8_select(x > hi, hi, x);
	x = hp_v8_select(under, lo, x);
	hp_v8 fx = x * hp_v8_set1(1.44269504088896341f) + hp_v8_set1(0.5f);
	hp_v8i n = __builtin_convertvector(fx, hp_v8i);           /* truncates */
	hp_v8 fn = __builtin_convertvector(n, hp_v8);
	hp_v8i adj = fn > fx;                                       /* floor for negatives */
	n = n + adj;                                                /* adj is -1 where true */
	fn = __builtin_convertvector(n, hp_v8);
	hp_v8 r = x - fn * hp_v8_set1(0.693359375f) - fn * hp_v8_set1(-2.12194440e-4f);
	hp_v8 z = r * r;
	hp_v8 y = hp_v8_set1(1.9875691500e-4f);
	y = y * r + hp_v8_set1(1.3981999507e-3f);
	y = y * r + hp_v8_set1(8.3334519073e-3f);
	y = y * r + hp_v8_set1(4.1665795894e-2f);
	y = y * r + hp_v8_set1(1.6666665459e-1f);
	y = y * r + hp_v8_set1(5.0000001201e-1f);
	y = y * z + r + hp_v8_set1(1.0f);
	hp_v8i bits = (n + 127) << 23;
	hp_v8 scale;
	__builtin_memcpy(&scale, &bits, sizeof(scale));
	y = y * scale;
	return hp_v8_select(under, hp_v8_set1(0.0f), y);
}

/* Load up to 8 floats, filling the missing lanes with pad. */
static inline hp_v8 hp_v8_load_part(const float *p, int n, float pad)
{
	hp_v8 v = hp_v8_set1(pad);
	for (int i = 0; i < n; i++)
		v[i] = p[i];
	return v;
}

static inline void hp_v8_store_part(float *p, hp_v8 v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = v[i];
}

static inline float hp_row_max(const float *r, int n)
{
	hp_v8 m = hp_v8_set1(-__builtin_inff());
	int j = 0;

	for (; j + 8 <= n; j += 8)
		m = hp_v8_max(m, hp_v8_load(r + j));
	if (j < n)
		m = hp_v8_max(m, hp_v8_load_part(r + j, n - j, -__builtin_inff()));
	float a = m[0] > m[4] ? m[0] : m[4], b = m[1] > m[5] ? m[1] : m[5];
	float c = m[2] > m[6] ? m[2] : m[6], d = m[3] > m[7] ? m[3] : m[7];
	a = a > c ? a : c;
	b = b > d ? b : d;
	return a > b ? a : b;
}

/* r[j] = exp(r[j] - mx) for j < n; returns the sum (float lanes, fixed order). */
static inline float hp_row_exp_sum(float *r, int n, float mx)
{
	hp_v8 s = hp_v8_set1(0.0f), m = hp_v8_set1(mx);
	int j = 0;

	for (; j + 8 <= n; j += 8) {
		hp_v8 e = hp_vexp(hp_v8_load(r + j) - m);
		hp_v8_store(r + j, e);
		s += e;
	}
	if (j < n) {
		hp_v8 e = hp_vexp(hp_v8_load_part(r + j, n - j, -__builtin_inff()) - m);
		hp_v8_store_part(r + j, e, n - j);
		s += e;
	}
	return hp_v8_hsum(s);
}

/* sum_j exp(r[j] - mx) for j < n, r untouched. */
static inline float hp_row_expsum(const float *r, int n, float mx)
{
	hp_v8 s = hp_v8_set1(0.0f), m = hp_v8_set1(mx);
	int j = 0;

	for (; j + 8 <= n; j += 8)
		s += hp_vexp(hp_v8_load(r + j) - m);
	if (j < n)
		s += hp_vexp(hp_v8_load_part(r + j, n - j, -__builtin_inff()) - m);
	return hp_v8_hsum(s);
}

static inline void hp_row_scale(float *r, int n, float k)
{
	hp_v8 kv = hp_v8_set1(k);
	int j = 0;

	for (; j + 8 <= n; j += 8)
		hp_v8_store(r + j, hp_v8_load(r + j) * kv);
	for (; j < n; j++)
		r[j] *= k;
}

/* sum_j a[j] * b[j] */
static inline float hp_row_dot(const float *a, const float *b, int n)
{
	hp_v8 s = hp_v8_set1(0.0f);
	int j = 0;

	for (; j + 8 <= n; j += 8)
		s += hp_v8_load(a + j) * hp_v8_load(b + j);
	if (j < n)
		s += hp_v8_load_part(a + j, n - j, 0.0f) * hp_v8_load_part(b + j, n - j, 0.0f);
	return hp_v8_hsum(s);
}

#endif
