/*
 * test-crc32c.c - lib/base/crc32c.c: the RFC 3720 (iSCSI) known answers on both
 * paths, the table path against a bit-at-a-time reference, incremental use
 * at every split point, and the SSE4.2 path against the table path at every
 * length up to 5000 and every alignment, plus lengths that reach its
 * 3 x 8 KiB interleaved loop.  Ends with a throughput line per path (a
 * diagnostic, never a failure: timings depend on the machine and its load).
 */
#include <time.h>

#include "base/crc32c.h"
#include "tap.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static unsigned char rnd8(void)
{
	/* xorshift64*: deterministic, good enough for test data */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (unsigned char)((rng_state * 0x2545f4914f6cdd1dull) >> 56);
}

static unsigned char *rnd_buf(size_t n)
{
	unsigned char *p = malloc(n);

	for (size_t i = 0; i < n; i++)
		p[i] = rnd8();
	return p;
}

/* The definition, one bit at a time: what the table path must agree with. */
static uint32_t crc_bitwise(const unsigned char *p, size_t n)
{
	uint32_t c = ~0u;

	while (n--) {
		c ^= *p++;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
	}
	return ~c;
}

static void known_answers(void)
{
	unsigned char zero[32], ones[32], inc[32];
	static const struct { const char *name; const void *p; size_t n; uint32_t want; } v[] = {
		{ "empty", "", 0, 0 },
		{ "\"123456789\"", "123456789", 9, 0xe3069283 },
	};

	memset(zero, 0, sizeof(zero));
	memset(ones, 0xff, sizeof(ones));
	for (int i = 0; i < 32; i++)
		inc[i] = (unsigned char)i;
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		is_int(hp_crc32c(0, v[i].p, v[i].n), v[i].want, "%s", v[i].name);
		is_int(hp_crc32c_sw(0, v[i].p, v[i].n), v[i].want, "%s, table", v[i].name);
	}
	/* RFC 3720 B.4 */
	is_int(hp_crc32c(0, zero, 32), 0x8a9136aa, "32 zero bytes");
	is_int(hp_crc32c_sw(0, zero, 32), 0x8a9136aa, "32 zero bytes, table");
	is_int(hp_crc32c(0, ones, 32), 0x62a8ab43, "32 0xff bytes");
	is_int(hp_crc32c_sw(0, ones, 32), 0x62a8ab43, "32 0xff bytes, table");
	is_int(hp_crc32c(0, inc, 32), 0x46dd794e, "32 ascending bytes");
	is_int(hp_crc32c_sw(0, inc, 32), 0x46dd794e, "32 ascending bytes, table");
}

static void against_bitwise(void)
{
	size_t n = 100003, bad = 0;
	unsigned char *b = rnd_buf(n + 8);

	for (size_t off = 0; off < 8; off++)
		for (size_t len = 0; len <= 300; len++)
			bad += hp_crc32c_sw(0, b + off, len) != crc_bitwise(b + off, len);
	bad += hp_crc32c_sw(0, b + 3, n) != crc_bitwise(b + 3, n);
	is_int(bad, 0, "table path equals the bit-at-a-time definition");
	free(b);
}

static void incremental(uint32_t (*f)(uint32_t, const void *, size_t), const char *name)
{
	enum { N = 1000 };
	unsigned char *b = rnd_buf(N);
	uint32_t whole = f(0, b, N);
	size_t bad = 0;

	for (size_t k = 0; k <= N; k++)
		bad += f(f(0, b, k), b + k, N - k) != whole;
	is_int(bad, 0, "%s: two pieces equal one call at all %d split points", name, N + 1);
	free(b);
}

/* Compare the paths for every length up to max at every alignment; also a
 * few lengths around the interleaved loops' block sizes (768, 24576). */
static void hw_vs_sw(void)
{
	static const size_t big[] = {
		767, 768, 769, 1543, 24575, 24576, 24577, 24576 + 768 + 7, 3 * 24576 + 5, 1 << 20,
	};
	size_t max = 5000, bad = 0, first_off = 0, first_len = 0;
	unsigned char *b = rnd_buf((1 << 20) + 8);

	if (strcmp(hp_crc32c_impl(), "sse4.2")) {
		tap_skip("no SSE4.2 on this CPU", "sse4.2 path equals table path");
		tap_skip("no SSE4.2 on this CPU", "sse4.2 path equals table path, large");
		free(b);
		return;
	}
	for (size_t off = 0; off < 8; off++)
		for (size_t len = 0; len <= max; len++)
			if (hp_crc32c(0, b + off, len) != hp_crc32c_sw(0, b + off, len) && !bad++) {
				first_off = off;
				first_len = len;
			}
	if (!is_int(bad, 0, "sse4.2 path equals table path, lengths 0..%zu, offsets 0..7", max))
		tap_diag("  first mismatch: offset %zu, length %zu", first_off, first_len);
	bad = 0;
	for (size_t off = 0; off < 8; off++)
		for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++)
			bad += hp_crc32c(0x12345678, b + off, big[i]) !=
			       hp_crc32c_sw(0x12345678, b + off, big[i]);
	is_int(bad, 0, "sse4.2 path equals table path, large lengths, running crc");
	free(b);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void throughput(void)
{
	size_t n = (size_t)64 << 20;
	unsigned char *b = malloc(n);
	double t0, t1, t2;
	uint32_t a, s;

	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 131 + (i >> 13));
	t0 = now();
	a = hp_crc32c(0, b, n);
	t1 = now();
	s = hp_crc32c_sw(0, b, n);
	t2 = now();
	ok(a == s, "64 MiB: both paths agree");
	tap_diag("crc32c %s: %.0f MB/s; table: %.0f MB/s (64 MiB)", hp_crc32c_impl(),
		 n / 1e6 / (t1 - t0), n / 1e6 / (t2 - t1));
	free(b);
}

int main(void)
{
	tap_diag("implementation: %s", hp_crc32c_impl());
	known_answers();
	against_bitwise();
	incremental(hp_crc32c, "hp_crc32c");
	incremental(hp_crc32c_sw, "hp_crc32c_sw");
	hw_vs_sw();
	throughput();
	return tap_done();
}
