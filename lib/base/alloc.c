/*
 * alloc.c - counted allocation with failure injection for tests.
 *
 * Not thread-safe counting: hp runs one thread per rank in the library; the
 * counter only matters under tests.
 */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

static long alloc_count;
static long fail_at = -1;   /* -1: read HP_FAIL_ALLOC on first use */

static int should_fail(void)
{
	if (fail_at < 0) {
		const char *s = getenv("HP_FAIL_ALLOC");
		fail_at = s ? strtol(s, NULL, 10) : 0;
		if (fail_at < 0)
			fail_at = 0;
	}
	alloc_count++;
	return fail_at > 0 && alloc_count == fail_at;
}

void hp_alloc_fail_at(long n)
{
	alloc_count = 0;
	fail_at = n > 0 ? n : 0;
}

long hp_alloc_count(void)
{
	return alloc_count;
}

void *hp_malloc(size_t n)
{
	if (should_fail())
		return NULL;
	return malloc(n ? n : 1);
}

void *hp_calloc(size_t count, size_t size)
{
	if (should_fail())
		return NULL;
	return calloc(count ? count : 1, size ? size : 1);
}

void *hp_realloc(void *p, size_t n)
{
	if (should_fail())
		return NULL;
	return realloc(p, n ? n : 1);
}

void *hp_malloc_aligned(size_t n)
{
	void *p = NULL;

	if (should_fail())
		return NULL;
	n = (n + 63) & ~(size_t)63;
	if (posix_memalign(&p, 64, n ? n : 64))
		return NULL;
	return p;
}

void hp_free_aligned(void *p)
{
	free(p);
}

char *hp_strndup(const char *s, size_t n)
{
	char *d = hp_malloc(n + 1);

	if (!d)
		return NULL;
	memcpy(d, s, n);
	d[n] = '\0';
	return d;
}

char *hp_strdup(const char *s)
{
	return hp_strndup(s, strlen(s));
}

void hp_free(void *p)
{
	free(p);
}
