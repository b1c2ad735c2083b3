/*
 * utf8.h - UTF-8 validation shared by the readers and writers of lib/.
 */
#ifndef HP_UTF8_H
#define HP_UTF8_H

#include <stddef.h>

/*
 * Check that s[0, n) is UTF-8 as Rust's str (and so HF tokenizers) accepts
 * it: RFC 3629, no overlong forms, no surrogates, nothing above U+10FFFF.
 * Returns n when valid, else the offset of the first byte of the first bad
 * sequence.
 */
size_t hp_utf8_valid_prefix(const char *s, size_t n);

#endif
