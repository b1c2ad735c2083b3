/*
 * utf8.c - the one UTF-8 validator of lib/ (see utf8.h).
 */
#include "base/utf8.h"

size_t hp_utf8_valid_prefix(const char *str, size_t n)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0;

	while (i < n) {
		unsigned c = s[i], need, lo, hi;

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
		if (!(need = hp_utf8_lead(c, &lo, &hi)))
			return i;
		if (n - i <= need || s[i + 1] < lo || s[i + 1] > hi)
			return i;
		for (unsigned k = 2; k <= need; k++)
			if ((s[i + k] & 0xC0) != 0x80)
				return i;
		i += need + 1;
	}
	return n;
}
