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
void hp_free_aligned(void *p);
char *hp_strdup(const char *s);
char *hp_strndup(const char *s, size_t n);
void hp_free(void *p);

/* Make the nth allocation from now fail (1 = the next one); 0 turns it off. */
void hp_alloc_fail_at(long n);
/* Number of allocations made so far (for tests that walk every failure). */
long hp_alloc_count(void);

#endif
