/*
 * dtype.c - element types and round-to-nearest-even conversions.
 *
 * Bit manipulation through memcpy, never type-punned pointers, so UBSan and
 * strict aliasing stay quiet.
 */
#include <math.h>
#include <string.h>

#include "base/dtype.h"

static const struct {
	enum hp_dtype t;
	const char *name;
	size_t size;
} dtypes[] = {
	{ HP_DTYPE_F32, "F32", 4 },  { HP_DTYPE_BF16, "BF16", 2 },
	{ HP_DTYPE_F16, "F16", 2 },  { HP_DTYPE_F64, "F64", 8 },
	{ HP_DTYPE_I64, "I64", 8 },  { HP_DTYPE_I32, "I32", 4 },
	{ HP_DTYPE_I16, "I16", 2 },  { HP_DTYPE_I8, "I8", 1 },
	{ HP_DTYPE_U8, "U8", 1 },    { HP_DTYPE_U16, "U16", 2 },
	{ HP_DTYPE_U32, "U32", 4 },  { HP_DTYPE_U64, "U64", 8 },
	{ HP_DTYPE_BOOL, "BOOL", 1 },
};

size_t hp_dtype_size(enum hp_dtype t)
{
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (dtypes[i].t == t)
			return dtypes[i].size;
	return 0;
}

const char *hp_dtype_name(enum hp_dtype t)
{
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (dtypes[i].t == t)
			return dtypes[i].name;
	return "INVALID";
}

enum hp_dtype hp_dtype_parse(const char *s)
{
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (!strcmp(dtypes[i].name, s))
			return dtypes[i].t;
	return HP_DTYPE_INVALID;
}

enum hp_dtype hp_dtype_parse_torch(const char *s)
{
	if (!strcmp(s, "float32") || !strcmp(s, "fp32"))
		return HP_DTYPE_F32;
	if (!strcmp(s, "bfloat16") || !strcmp(s, "bf16"))
		return HP_DTYPE_BF16;
	if (!strcmp(s, "float16") || !strcmp(s, "fp16") || !strcmp(s, "half"))
		return HP_DTYPE_F16;
	return HP_DTYPE_INVALID;
}

const char *hp_dtype_torch_name(enum hp_dtype t)
{
	return t == HP_DTYPE_BF16 ? "bfloat16" : t == HP_DTYPE_F16 ? "float16" : "float32";
}

int hp_dtype_is_float(enum hp_dtype t)
{
	return t == HP_DTYPE_F32 || t == HP_DTYPE_BF16 || t == HP_DTYPE_F16;
}

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float hp_bf16_to_f32(uint16_t h)
{
	return u2f((uint32_t)h << 16);
}

uint16_t hp_f32_to_bf16(float f)
{
	uint32_t u = f2u(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)        /* NaN: keep sign, force quiet */
		return (uint16_t)((u >> 16) | 0x0040u);
	/* round to nearest even on the 16 dropped bits */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

void hp_bf16_sum_ranks(uint16_t *out, const uint16_t *in, int k, size_t n, size_t s)
{
	for (size_t i = 0; i < n; i++) {
		float a = hp_bf16_to_f32(in[i]);

		for (int r = 1; r < k; r++)
			a += hp_bf16_to_f32(in[(size_t)r * s + i]);
		out[i] = hp_f32_to_bf16(a);
	}
}

float hp_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t man = h & 0x3ffu;

	if (exp == 0x1f)                             /* inf or NaN */
		return u2f(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0));
	if (exp == 0) {
		if (!man)
			return u2f(sign);
		/* subnormal: man * 2^-24, exact in f32 */
		float v = (float)man * u2f(0x33800000u);   /* 2^-24 */
		return sign ? -v : v;
	}
	return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t hp_f32_to_f16(float f)
{
	uint32_t u = f2u(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t a = u & 0x7fffffffu;

	if (a > 0x7f800000u)                          /* NaN */
		return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu);
	if (a >= 0x477ff000u)                         /* rounds to >= 65536: inf */
		return sign | 0x7c00u;
	if (a < 0x38800000u) {                        /* below 2^-14: subnormal or 0 */
		/* a value v maps to round(v * 2^24); do it exactly with integers */
		uint32_t exp = a >> 23;
		if (exp < 102)                            /* < 2^-25: rounds to 0 */
			return sign;
		uint32_t man = (a & 0x7fffffu) | 0x800000u;
		uint32_t shift = 126 - exp;               /* 14..24 */
		uint32_t q = man >> shift;
		uint32_t rem = man & ((1u << shift) - 1);
		uint32_t half = 1u << (shift - 1);
		if (rem > half || (rem == half && (q & 1)))
			q++;
		return sign | (uint16_t)q;
	}
	/* normal: rebias exponent, round 13 dropped bits to nearest even */
	a -= (112u << 23);
	a += 0xfffu + ((a >> 13) & 1u);
	return sign | (uint16_t)(a >> 13);
}

void hp_mxfp4_decode(float *dst, const uint8_t *blocks, const uint8_t *scales, size_t n)
{
	static const float lut[16] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
				       -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f };

	for (size_t i = 0; i < n; i += 2) {
		int e = (int)scales[i / 32] - 127;
		uint8_t b = blocks[i / 2];

		dst[i] = ldexpf(lut[b & 15], e);
		dst[i + 1] = ldexpf(lut[b >> 4], e);
	}
}

int hp_convert_to_f32(float *dst, const void *src, enum hp_dtype t, size_t n)
{
	const unsigned char *p = src;

	switch (t) {
	case HP_DTYPE_F32:
		memmove(dst, src, n * 4);
		return 0;
	case HP_DTYPE_BF16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, p + 2 * i, 2);
			dst[i] = hp_bf16_to_f32(h);
		}
		return 0;
	case HP_DTYPE_F16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, p + 2 * i, 2);
			dst[i] = hp_f16_to_f32(h);
		}
		return 0;
	case HP_DTYPE_F64:
		for (size_t i = 0; i < n; i++) {
			double d;
			memcpy(&d, p + 8 * i, 8);
			dst[i] = (float)d;
		}
		return 0;
	default:
		return -1;
	}
}

int hp_convert_from_f32(void *dst, enum hp_dtype t, const float *src, size_t n)
{
	unsigned char *p = dst;

	switch (t) {
	case HP_DTYPE_F32:
		memmove(dst, src, n * 4);
		return 0;
	case HP_DTYPE_BF16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h = hp_f32_to_bf16(src[i]);
			memcpy(p + 2 * i, &h, 2);
		}
		return 0;
	case HP_DTYPE_F16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h = hp_f32_to_f16(src[i]);
			memcpy(p + 2 * i, &h, 2);
		}
		return 0;
	default:
		return -1;
	}
}

size_t hp_find_nonfinite(const float *x, size_t n)
{
	size_t i = 0;

	while (i < n && isfinite(x[i]))
		i++;
	return i;
}
