/*
 * fileio.c - see fileio.h.
 */
#include <unistd.h>

#include "fileio.h"

int hp_write_all(int fd, const void *buf, size_t n)
{
	const unsigned char *p = buf;

	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			if (w == 0)
				errno = EIO;
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int hp_pwrite_all(int fd, const void *buf, size_t n, long long off)
{
	const unsigned char *p = buf;

	while (n) {
		ssize_t w = pwrite(fd, p, n, (off_t)off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			if (w == 0)
				errno = EIO;
			return -1;
		}
		p += w;
		n -= (size_t)w;
		off += w;
	}
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
