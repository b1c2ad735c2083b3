/*
 * utf8.c - the one UTF-8 validator of lib/ (see utf8.h).
 */
#include "utf8.h"

size_t hp_utf8_valid_prefix(const char *str, size_t n)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0;

	while (i < n) {
		unsigned c = s[i], need, lo = 0x80, hi = 0xBF;

		/* Most text is ASCII: skip eight bytes at a time while it is. */
		if (c < 0x80) {
			uint64_t v;

			while (i + 8 <= n) {
				memcpy(&v, s + i, 8);
				if (v & 0x8080808080808080ull)
					break;
				i += 8;
			}
			while (i < n && s[i] < 0x80)
				i++;
			continue;
		}
		/* The table of RFC 3629 section 4, which Rust's str follows. */
		if (c >= 0xC2 && c <= 0xDF) {
			need = 1;
		} else if (c >= 0xE0 && c <= 0xEF) {
			need = 2;
			if (c == 0xE0)
				lo = 0xA0;        /* overlong */
			else if (c == 0xED)
				hi = 0x9F;        /* surrogates */
		} else if (c >= 0xF0 && c <= 0xF4) {
			need = 3;
			if (c == 0xF0)
				lo = 0x90;        /* overlong */
			else if (c == 0xF4)
				hi = 0x8F;        /* above U+10FFFF */
		} else {
			return i;
		}
		if (n - i <= need || s[i + 1] < lo || s[i + 1] > hi)
			return i;
		for (unsigned k = 2; k <= need; k++)
			if ((s[i + k] & 0xC0) != 0x80)
				return i;
		i += need + 1;
	}
	return n;
}
