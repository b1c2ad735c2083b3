/*
 * enospc.c - an LD_PRELOAD shim that makes the disk "fill up", so tests can
 * check that a tool reports ENOSPC and leaves no half-written output.
 *
 *   HP_ENOSPC_AFTER=N LD_PRELOAD=$HP_BUILD_DIR/t/libenospc.so hp-data ...
 *
 * After N bytes in all have gone to regular files through write, pwrite,
 * pwrite64 and writev, the write that crosses N is cut short to what fits,
 * and every later one to a regular file fails with ENOSPC.  Pipes, ttys,
 * sockets, fd 2 and files in /dev/shm (MPI's shared memory) always pass
 * through.  The count is per process (each
 * program a test runs starts from zero).  Without HP_ENOSPC_AFTER, or with
 * one that is not a decimal number, nothing fails.
 *
 * What it does not see: writes glibc makes internally (stdio's fwrite and
 * fflush call the kernel directly, not through these symbols), pwritev,
 * sendfile, copy_file_range and mmap.  The library writes through
 * hp_write_all, i.e. write(2), which is covered.  It is built on its own,
 * without compat.h, sanitizers or libhp, so it can be preloaded into any
 * program; a program built with ASan needs ASAN_OPTIONS=verify_asan_link_order=0.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off64_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);

static uint64_t limit = UINT64_MAX;  /* HP_ENOSPC_AFTER; UINT64_MAX: never fail */
static uint64_t used;                /* bytes granted to regular files so far */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void)
{
	const char *s = getenv("HP_ENOSPC_AFTER");
	char *end;

	real_write = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
	real_pwrite = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
	real_pwrite64 = (ssize_t (*)(int, const void *, size_t, off64_t))dlsym(RTLD_NEXT, "pwrite64");
	real_writev = (ssize_t (*)(int, const struct iovec *, int))dlsym(RTLD_NEXT, "writev");
	if (s && *s) {
		unsigned long long v = strtoull(s, &end, 10);

		if (!*end)
			limit = v;
	}
}

/*
 * How many of n bytes to fd may be written: all of them for anything but a
 * regular file (*charged = 0), else what is left of the limit, taken from
 * it at once so that threads writing together never exceed it.  Standard
 * error always passes, even into a file: tests redirect it to one to check
 * the very message that reports the ENOSPC.
 */
/* MPI's shared-memory transport writes files in /dev/shm: that is memory,
 * not the disk being filled, so it passes. */
static int in_shm(int fd)
{
	char link[64], path[PATH_MAX];
	ssize_t len;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	len = readlink(link, path, sizeof(path) - 1);
	if (len < 0)
		return 0;
	path[len] = '\0';
	return !strncmp(path, "/dev/shm/", 9);
}

static size_t grant(int fd, size_t n, int *charged)
{
	struct stat st;
	uint64_t have, take;

	pthread_once(&once, init);
	*charged = 0;
	if (limit == UINT64_MAX || n == 0 || fd == STDERR_FILENO || fstat(fd, &st) ||
	    !S_ISREG(st.st_mode) || in_shm(fd))
		return n;
	*charged = 1;
	have = __atomic_load_n(&used, __ATOMIC_RELAXED);
	do {
		take = have >= limit ? 0 : limit - have < n ? limit - have : n;
	} while (take && !__atomic_compare_exchange_n(&used, &have, have + take, 0,
						      __ATOMIC_RELAXED, __ATOMIC_RELAXED));
	return take;
}

/* Give back what the real call did not write (it failed or was short). */
static ssize_t settle(int charged, size_t granted, ssize_t r)
{
	size_t wrote = r > 0 ? (size_t)r : 0;

	if (charged && wrote < granted)
		__atomic_fetch_sub(&used, granted - wrote, __ATOMIC_RELAXED);
	return r;
}

static ssize_t full(void)
{
	errno = ENOSPC;
	return -1;
}

ssize_t write(int fd, const void *buf, size_t n)
{
	int charged;
	size_t k = grant(fd, n, &charged);

	if (n && !k)
		return full();
	return settle(charged, k, real_write(fd, buf, k));
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	int charged;
	size_t k = grant(fd, n, &charged);

	if (n && !k)
		return full();
	return settle(charged, k, real_pwrite(fd, buf, k, off));
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
	int charged;
	size_t k = grant(fd, n, &charged);

	if (n && !k)
		return full();
	return settle(charged, k, real_pwrite64(fd, buf, k, off));
}

ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	struct iovec cut[IOV_MAX];
	size_t n = 0, k, left;
	int charged, i;

	for (i = 0; i < cnt; i++)
		n += iov[i].iov_len;
	k = grant(fd, n, &charged);
	if (n && !k)
		return full();
	/* whole, or a vector the kernel rejects anyway (EINVAL gives k back) */
	if (k == n || cnt > IOV_MAX)
		return settle(charged, k, real_writev(fd, iov, cnt));
	/* a short write: the same vector, cut off after k bytes */
	for (i = 0, left = k; left; i++) {
		cut[i] = iov[i];
		if (cut[i].iov_len > left)
			cut[i].iov_len = left;
		left -= cut[i].iov_len;
	}
	return settle(charged, k, real_writev(fd, cut, i));
}
