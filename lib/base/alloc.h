/*
 * alloc.h - the only way lib/ and kernels/ allocate.
 *
 * Every allocation goes through hp_malloc and friends so that tests can make
 * the Nth one fail (HP_FAIL_ALLOC=N in the environment, read once, or
 * hp_alloc_fail_at(N) in-process) and check that each failure path reports
 * HP_ENOMEM cleanly.  These functions return NULL on failure and never abort.
 * hp_free accepts NULL.
 */
#ifndef HP_ALLOC_H
#define HP_ALLOC_H

#include <stddef.h>

void *hp_malloc(size_t n);
void *hp_calloc(size_t count, size_t size);
void *hp_realloc(void *p, size_t n);
/* 64-byte aligned; release with hp_free_aligned. */
void *hp_malloc_aligned(size_t n);
/* The same, zeroed.  A block of HP_ALLOC_MAP_MIN bytes or more is a fresh
 * mapping of the system's zero pages: it costs resident memory only where
 * it is written, so a buffer sized for the worst case costs what is used. */
void *hp_zalloc_aligned(size_t n);
void hp_free_aligned(void *p);
#define HP_ALLOC_MAP_MIN ((size_t)1 << 20)
char *hp_strdup(const char *s);
char *hp_strndup(const char *s, size_t n);
void hp_free(void *p);

/* The process's peak resident set in bytes, as the system counts it
 * (VmHWM of /proc/self/status: every page it ever held at once, its code
 * and libraries included); -1 where the system does not say. */
long long hp_host_peak_bytes(void);

/* Make the nth allocation from now fail (1 = the next one); 0 turns it off. */
void hp_alloc_fail_at(long n);
/* Number of allocations made so far (for tests that walk every failure). */
long hp_alloc_count(void);

#endif
