/*
 * crc32c.c - CRC-32C two ways: slicing-by-8 tables, the portable reference,
 * and the SSE4.2 crc32 instruction on three interleaved streams.
 *
 * Both work on the raw register (no inversion); hp_crc32c adds the ~ on the
 * way in and out, which is what makes a result usable as the next call's crc.
 *
 * Why three streams: crc32 takes 3 cycles but a new one can start every
 * cycle, so a single dependent chain uses a third of the unit.  Three chains
 * over three adjacent stretches of a block are joined afterwards by pushing
 * the first register through the zero bytes of the next stretch ("shift"):
 * that map is linear over GF(2), so it is four lookups in a 4x256 table made
 * once per stretch length (the method of Mark Adler's crc32c.c).  Not here:
 * PCLMULQDQ folding and other ISAs, which would cost far more code.
 */
#include <pthread.h>

#include "base/crc32c.h"

#define POLY 0x82f63b78u	/* Castagnoli, bit-reflected */

/* sw_table[k][i]: the register for byte i followed by k zero bytes */
static uint32_t sw_table[8][256];

static uint32_t le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void build_sw(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int j = 0; j < 8; j++)
			c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
		sw_table[0][i] = c;
	}
	for (int k = 1; k < 8; k++)
		for (int i = 0; i < 256; i++) {
			uint32_t c = sw_table[k - 1][i];

			sw_table[k][i] = (c >> 8) ^ sw_table[0][c & 0xff];
		}
}

/* Bytes are loaded one at a time so that this is right on any endianness;
 * compilers turn le32 into one load where that is the same thing. */
static uint32_t sw_update(uint32_t c, const unsigned char *p, size_t n)
{
	const uint32_t (*t)[256] = sw_table;

	for (; n >= 8; p += 8, n -= 8) {
		uint32_t lo = c ^ le32(p), hi = le32(p + 4);

		c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^
		    t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
		    t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^
		    t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
	}
	while (n--)
		c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
	return c;
}

static uint32_t (*update)(uint32_t, const unsigned char *, size_t) = sw_update;
static const char *impl_name = "table";

#if defined(__x86_64__)
#include <nmmintrin.h>

/*
 * Stretch lengths of the two interleaved loops.  LONG is big enough that the
 * eight lookups of the two joins vanish next to 3 x 1024 crc32s; SHORT keeps
 * buffers of a few hundred bytes off the single-chain loop.  Multiples of 8.
 */
#define LONG 8192
#define SHORT 256

static uint32_t shift_long[4][256], shift_short[4][256];

/* Build a shift table for n zero bytes from the images of the 32 single bits. */
static void build_shift(uint32_t t[4][256], size_t n)
{
	uint32_t bit[32];

	for (int b = 0; b < 32; b++) {
		uint32_t c = 1u << b;

		for (size_t i = 0; i < n; i++)
			c = (c >> 8) ^ sw_table[0][c & 0xff];
		bit[b] = c;
	}
	for (int k = 0; k < 4; k++)
		for (int i = 0; i < 256; i++) {
			uint32_t v = 0;

			for (int j = 0; j < 8; j++)
				if (i >> j & 1)
					v ^= bit[8 * k + j];
			t[k][i] = v;
		}
}

static uint32_t shift(const uint32_t t[4][256], uint32_t c)
{
	return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
}

static uint64_t load64(const unsigned char *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return v;
}

/* 3*len bytes as three chains, joined: raw(c, A B) = shift(raw(c, A)) ^ raw(0, B). */
__attribute__((target("sse4.2")))
static uint32_t hw_triple(uint32_t crc, const unsigned char *p, size_t len,
			  const uint32_t t[4][256])
{
	uint64_t c0 = crc, c1 = 0, c2 = 0;

	for (const unsigned char *end = p + len; p < end; p += 8) {
		c0 = _mm_crc32_u64(c0, load64(p));
		c1 = _mm_crc32_u64(c1, load64(p + len));
		c2 = _mm_crc32_u64(c2, load64(p + 2 * len));
	}
	c0 = shift(t, (uint32_t)c0) ^ (uint32_t)c1;
	return shift(t, (uint32_t)c0) ^ (uint32_t)c2;
}

__attribute__((target("sse4.2")))
static uint32_t hw_update(uint32_t crc, const unsigned char *p, size_t n)
{
	uint64_t c = crc;

	/* align so that no 8-byte load straddles a cache line */
	for (; n && ((uintptr_t)p & 7); n--)
		c = _mm_crc32_u8((uint32_t)c, *p++);
	for (; n >= 3 * LONG; p += 3 * LONG, n -= 3 * LONG)
		c = hw_triple((uint32_t)c, p, LONG, shift_long);
	for (; n >= 3 * SHORT; p += 3 * SHORT, n -= 3 * SHORT)
		c = hw_triple((uint32_t)c, p, SHORT, shift_short);
	for (; n >= 8; p += 8, n -= 8)
		c = _mm_crc32_u64(c, load64(p));
	while (n--)
		c = _mm_crc32_u8((uint32_t)c, *p++);
	return (uint32_t)c;
}
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void)
{
	build_sw();
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("sse4.2")) {
		build_shift(shift_long, LONG);
		build_shift(shift_short, SHORT);
		update = hw_update;
		impl_name = "sse4.2";
	}
#endif
}

uint32_t hp_crc32c(uint32_t crc, const void *buf, size_t n)
{
	pthread_once(&once, init);
	return ~update(~crc, buf, n);
}

uint32_t hp_crc32c_sw(uint32_t crc, const void *buf, size_t n)
{
	pthread_once(&once, init);
	return ~sw_update(~crc, buf, n);
}

const char *hp_crc32c_impl(void)
{
	pthread_once(&once, init);
	return impl_name;
}
