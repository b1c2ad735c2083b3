/*
 * test-sha256.c - lib/base/sha256.c against the FIPS 180-4 example vectors
 * ("abc", the 448-bit two-block message, one million 'a') and the empty
 * message, fed whole and in odd-sized pieces so the buffering is covered.
 */
#include "base/sha256.h"
#include "tap.h"

static void hex(const unsigned char d[32], char out[65])
{
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", d[i]);
}

int main(void)
{
	static const struct { const char *msg, *want; } v[] = {
		{ "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
		{ "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
		{ "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
		  "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1" },
	};
	char got[65];

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		struct hp_sha256 c;
		unsigned char d[32];
		size_t n = strlen(v[i].msg);

		hp_sha256_hex(v[i].msg, n, got);
		is_str(got, v[i].want, "one call: \"%.10s\" (%zu bytes)", v[i].msg, n);
		hp_sha256_init(&c);
		for (size_t j = 0; j < n; j += 3)
			hp_sha256_update(&c, v[i].msg + j, n - j < 3 ? n - j : 3);
		hp_sha256_final(&c, d);
		hex(d, got);
		is_str(got, v[i].want, "3-byte pieces: \"%.10s\"", v[i].msg);
	}

	/* one million 'a', in 1000 pieces of 1000 */
	{
		struct hp_sha256 c;
		unsigned char d[32];
		char a[1000];

		memset(a, 'a', sizeof(a));
		hp_sha256_init(&c);
		for (int i = 0; i < 1000; i++)
			hp_sha256_update(&c, a, sizeof(a));
		hp_sha256_final(&c, d);
		hex(d, got);
		is_str(got, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
		       "one million 'a'");
	}
	/* the padding boundaries (values from coreutils sha256sum) */
	{
		static const struct { size_t n; const char *want; } b[] = {
			{ 55, "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072" },
			{ 56, "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e" },
			{ 64, "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c" },
		};
		char m[64];

		memset(m, 'x', sizeof(m));
		for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++) {
			hp_sha256_hex(m, b[i].n, got);
			is_str(got, b[i].want, "%zu bytes of 'x'", b[i].n);
		}
	}
	return tap_done();
}
