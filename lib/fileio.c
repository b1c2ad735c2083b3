/*
 * fileio.c - see fileio.h.
 */
#include <unistd.h>

#include "alloc.h"
#include "fileio.h"

/* write(2) or, with off >= 0, pwrite(2) of all n bytes, retrying short
 * writes and EINTR. */
static int put_all(int fd, const void *buf, size_t n, long long off)
{
	const unsigned char *p = buf;

	while (n) {
		ssize_t w = off < 0 ? write(fd, p, n) : pwrite(fd, p, n, (off_t)off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			if (w == 0)
				errno = EIO;
			return -1;
		}
		p += w;
		n -= (size_t)w;
		if (off >= 0)
			off += w;
	}
	return 0;
}

int hp_write_all(int fd, const void *buf, size_t n)
{
	return put_all(fd, buf, n, -1);
}

int hp_pwrite_all(int fd, const void *buf, size_t n, long long off)
{
	return put_all(fd, buf, n, off < 0 ? 0 : off);
}

int hp_read_stream(FILE *f, char **buf, size_t *len)
{
	size_t cap = 0, got;
	char *b = NULL;

	*buf = NULL;
	*len = 0;
	do {
		if (cap - *len < 65536) {
			char *nb = hp_realloc(b, cap ? 2 * cap : 65536);

			if (!nb) {
				hp_free(b);
				errno = ENOMEM;
				return -1;
			}
			b = nb;
			cap = cap ? 2 * cap : 65536;
		}
		got = fread(b + *len, 1, cap - *len - 1, f);
		*len += got;
	} while (got);
	if (ferror(f)) {
		int err = errno ? errno : EIO;

		hp_free(b);
		*len = 0;
		errno = err;
		return -1;
	}
	b[*len] = '\0';
	*buf = b;
	return 0;
}

int hp_buffered_put(int fd, unsigned char *buf, size_t cap, size_t *used, const void *src, size_t n)
{
	const unsigned char *s = src;

	while (n) {
		size_t k = cap - *used;

		if (k > n)
			k = n;
		memcpy(buf + *used, s, k);
		*used += k;
		s += k;
		n -= k;
		if (*used == cap) {
			if (hp_write_all(fd, buf, cap))
				return -1;
			*used = 0;
		}
	}
	return 0;
}
