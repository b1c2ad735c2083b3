/*
 * utf8.h - UTF-8 validation and encoding shared by the readers and writers
 * of lib/.
 */
#ifndef HP_UTF8_H
#define HP_UTF8_H

#include <stddef.h>
#include <stdint.h>

/*
 * Check that s[0, n) is UTF-8 as Rust's str (and so HF tokenizers) accepts
 * it: RFC 3629, no overlong forms, no surrogates, nothing above U+10FFFF.
 * Returns n when valid, else the offset of the first byte of the first bad
 * sequence.
 */
size_t hp_utf8_valid_prefix(const char *s, size_t n);

/*
 * The table of RFC 3629 section 4 for a non-ASCII lead byte c: returns the
 * number of continuation bytes (1 to 3), with the allowed range of the
 * first of them in [*lo, *hi] (narrower than 80..BF where overlongs,
 * surrogates or code points above U+10FFFF would start); 0 when c cannot
 * start a sequence.
 */
static inline unsigned hp_utf8_lead(unsigned c, unsigned *lo, unsigned *hi)
{
	*lo = 0x80;
	*hi = 0xBF;
	if (c >= 0xC2 && c <= 0xDF)
		return 1;
	if (c >= 0xE0 && c <= 0xEF) {
		if (c == 0xE0)
			*lo = 0xA0;        /* overlong */
		else if (c == 0xED)
			*hi = 0x9F;        /* surrogates */
		return 2;
	}
	if (c >= 0xF0 && c <= 0xF4) {
		if (c == 0xF0)
			*lo = 0x90;        /* overlong */
		else if (c == 0xF4)
			*hi = 0x8F;        /* above U+10FFFF */
		return 3;
	}
	return 0;
}

/* Encode code point cp (at most U+10FFFF) as UTF-8 into out (room for 4);
 * returns the length. */
static inline size_t hp_utf8_encode(uint32_t cp, unsigned char *out)
{
	if (cp < 0x80) {
		out[0] = (unsigned char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (unsigned char)(0xC0 | cp >> 6);
		out[1] = (unsigned char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (unsigned char)(0xE0 | cp >> 12);
		out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
		out[2] = (unsigned char)(0x80 | (cp & 0x3F));
		return 3;
	}
	out[0] = (unsigned char)(0xF0 | cp >> 18);
	out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
	out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
	out[3] = (unsigned char)(0x80 | (cp & 0x3F));
	return 4;
}

#endif
