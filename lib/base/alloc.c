/*
 * alloc.c - counted allocation with failure injection for tests.
 *
 * Not thread-safe counting: hp runs one thread per rank in the library; the
 * counter only matters under tests.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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

/*
 * An aligned block is handed out 64 bytes past a header that says how it
 * was made: from the heap (mapped 0), or as a mapping of `mapped` bytes
 * whose first page holds the header (the block itself starts on the next
 * page, so releasing its pages never touches the header).
 */
struct ablock {
	size_t mapped;
};

#define AHDR 64

static void *aligned(size_t n, int zero)
{
	if (should_fail())
		return NULL;
	n = (n + 63) & ~(size_t)63;
	if (!n)
		n = 64;
	if (n >= HP_ALLOC_MAP_MIN) {
		size_t page = (size_t)sysconf(_SC_PAGESIZE), len;
		char *m;

		if (n > SIZE_MAX - 2 * page)
			return NULL;
		len = (n + 2 * page - 1) & ~(page - 1);
		m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED)
			return NULL;
		((struct ablock *)(m + page - AHDR))->mapped = len;
		return m + page;
	}
	void *p = NULL;

	if (posix_memalign(&p, 64, n + AHDR))
		return NULL;
	((struct ablock *)p)->mapped = 0;
	if (zero)
		memset((char *)p + AHDR, 0, n);
	return (char *)p + AHDR;
}

void *hp_malloc_aligned(size_t n)
{
	return aligned(n, 0);
}

void *hp_zalloc_aligned(size_t n)
{
	return aligned(n, 1);
}

void hp_free_aligned(void *p)
{
	const struct ablock *h;

	if (!p)
		return;
	h = (const struct ablock *)((char *)p - AHDR);
	if (h->mapped) {
		size_t page = (size_t)sysconf(_SC_PAGESIZE);

		munmap((char *)p - page, h->mapped);
	} else {
		free((void *)h);
	}
}

long long hp_host_peak_bytes(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long long kb = -1;

	if (!f)
		return -1;
	while (kb < 0 && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmHWM:", 6))
			kb = strtoll(line + 6, NULL, 10);
	fclose(f);
	return kb < 0 ? -1 : kb * 1024;
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
