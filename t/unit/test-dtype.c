/*
 * test-dtype.c - F32 <-> BF16/F16 conversions against independent oracles.
 *
 * BF16: the oracle picks, in double arithmetic, the nearer of the two
 * neighbouring BF16 values (ties to the even mantissa), over every BF16
 * boundary region and 2^22 strided floats.  F16: the oracle is the
 * compiler's _Float16 conversion (libgcc's IEEE round-to-nearest-even),
 * over all 65536 F16 values and 2^22 strided floats.  Arena slices and
 * failure injection ride along.
 */
#include <math.h>

#include "base/alloc.h"
#include "base/arena.h"
#include "base/err.h"
#include "base/dtype.h"
#include "tap.h"

static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static uint16_t bf16_oracle(float f)
{
	uint32_t u = f2u(f);

	if (isnan(f))
		return (uint16_t)((u >> 16) | 0x40);
	uint16_t lo = (uint16_t)(u >> 16);              /* toward zero */
	if ((lo & 0x7fff) == 0x7f80)                    /* infinity stays */
		return lo;
	uint16_t hi = (uint16_t)(lo + 1);               /* away from zero */
	double vl = hp_bf16_to_f32(lo), vh = hp_bf16_to_f32(hi);
	if (isinf(vh))                                  /* IEEE: as if the exponent went on */
		vh = copysign(ldexp(1.0, 128), vh);
	double dl = fabs(vl - f), dh = fabs(vh - f);
	if (dl < dh)
		return lo;
	if (dh < dl)
		return hi;
	return (lo & 1) ? hi : lo;
}

static void test_bf16(void)
{
	long bad = 0, n = 0;

	for (uint64_t u = 0; u <= 0xffffffffull; u += 997) {
		float f = u2f((uint32_t)u);
		uint16_t got = hp_f32_to_bf16(f), want = bf16_oracle(f);
		n++;
		if (got != want && !(isnan(f) && isnan(hp_bf16_to_f32(got)))) {
			if (bad++ < 5)
				tap_diag("bf16(%08x) = %04x, want %04x", (uint32_t)u, got, want);
		}
	}
	/* exact ties around every exponent: x.5 ulp patterns */
	for (uint32_t e = 1; e < 255; e++)
		for (uint32_t m = 0; m < 4; m++) {
			uint32_t u = (e << 23) | (m << 16) | 0x8000;
			float f = u2f(u);
			n++;
			if (hp_f32_to_bf16(f) != bf16_oracle(f) && bad++ < 5)
				tap_diag("tie bf16(%08x)", u);
		}
	ok(bad == 0, "F32 -> BF16 rounds to nearest even (%ld values)", n);
	int rt = 1;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = hp_bf16_to_f32((uint16_t)h);
		if (!isnan(f))
			rt &= hp_f32_to_bf16(f) == h;
	}
	ok(rt, "BF16 -> F32 -> BF16 is the identity on all non-NaN values");
	ok(isnan(hp_bf16_to_f32(hp_f32_to_bf16(NAN))), "NaN stays NaN in BF16");
	ok(hp_f32_to_bf16(3.4e38f) == 0x7f80, "overflow rounds to infinity in BF16");
}

static void test_f16(void)
{
	long bad = 0, n = 0;

	for (uint32_t h = 0; h < 65536; h++) {
		uint16_t hh = (uint16_t)h;
		_Float16 x;
		memcpy(&x, &hh, 2);
		float want = (float)x, got = hp_f16_to_f32(hh);
		n++;
		if (f2u(want) != f2u(got) && !(isnan(want) && isnan(got)) && bad++ < 5)
			tap_diag("f16 %04x -> %g, want %g", h, got, want);
	}
	ok(bad == 0, "F16 -> F32 is exact on all 65536 values");
	bad = 0;
	for (uint64_t u = 0; u <= 0xffffffffull; u += 991) {
		float f = u2f((uint32_t)u);
		_Float16 x = (_Float16)f;
		uint16_t want, got = hp_f32_to_f16(f);
		memcpy(&want, &x, 2);
		n++;
		if (got != want && !(isnan(f)) && bad++ < 5)
			tap_diag("f16(%08x) = %04x, want %04x", (uint32_t)u, got, want);
	}
	ok(bad == 0, "F32 -> F16 rounds to nearest even, subnormals included (%ld values)", n);
	ok(hp_f32_to_f16(65520.0f) == 0x7c00 && hp_f32_to_f16(65519.0f) == 0x7bff,
	   "F16 overflow threshold is 65520");
}

static void test_convert(void)
{
	float src[5] = { 1.0f, -2.5f, 3.140625f, 0.0f, 1e-3f }, back[5];
	uint16_t buf[5];

	ok(hp_convert_from_f32(buf, HP_DTYPE_BF16, src, 5) == 0 &&
	   hp_convert_to_f32(back, buf, HP_DTYPE_BF16, 5) == 0 && back[2] == 3.140625f,
	   "bulk BF16 conversion round-trips representable values");
	ok(hp_convert_to_f32(back, buf, HP_DTYPE_I32, 5) == -1, "integer sources are refused");
	ok(hp_dtype_parse("BF16") == HP_DTYPE_BF16 && hp_dtype_parse("F8") == HP_DTYPE_INVALID &&
	   hp_dtype_size(HP_DTYPE_F16) == 2, "dtype names and sizes");
}

static void test_arena(void)
{
	struct hp_arena a;
	void *p, *q;

	hp_arena_init(&a);
	hp_arena_take(&a, 10);
	hp_arena_take(&a, 100);
	ok(a.used == 64 + 100, "a measuring arena counts aligned sizes");
	ok(hp_arena_alloc(&a, a.used) == 0, "arena allocates what was measured");
	p = hp_arena_take(&a, 10);
	q = hp_arena_take(&a, 100);
	ok(p && q && ((uintptr_t)q & 63) == 0 && hp_arena_take(&a, 1) == NULL,
	   "slices are 64-byte aligned and a full arena refuses more");
	hp_arena_release(&a);
	hp_alloc_fail_at(1);
	ok(hp_arena_alloc(&a, 128) == HP_ENOMEM, "an injected allocation failure is HP_ENOMEM");
	hp_alloc_fail_at(0);
	hp_arena_release(&a);
}

int main(void)
{
	test_bf16();
	test_f16();
	test_convert();
	test_arena();
	return tap_done();
}
