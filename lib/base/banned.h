/*
 * banned.h - functions that are easy to misuse; using one is a compile error.
 * Included by every .c file in lib/, kernels/ and tools/ through
 * lib/base/compat.h, which the Makefile force-includes.  Use snprintf, memcpy with explicit lengths, and
 * strtok_r-free parsing instead.
 */
#ifndef HP_BANNED_H
#define HP_BANNED_H

#define HP_BANNED(func) sorry_##func##_is_a_banned_function

#undef strcpy
#define strcpy(x, y) HP_BANNED(strcpy)
#undef strcat
#define strcat(x, y) HP_BANNED(strcat)
#undef strncpy
#define strncpy(x, y, n) HP_BANNED(strncpy)
#undef sprintf
#define sprintf(...) HP_BANNED(sprintf)
#undef vsprintf
#define vsprintf(...) HP_BANNED(vsprintf)
#undef strtok
#define strtok(x, y) HP_BANNED(strtok)
#undef gets
#define gets(x) HP_BANNED(gets)

#endif
