/*
 * fileio.h - small POSIX file helpers shared by the writers in lib/.
 */
#ifndef HP_FILEIO_H
#define HP_FILEIO_H

#include <stddef.h>
#include <stdio.h>

/* Write all n bytes of buf to fd, retrying short writes and EINTR.
 * Returns 0, or -1 with errno set (EIO when write makes no progress). */
int hp_write_all(int fd, const void *buf, size_t n);

/* The same at file offset off (pwrite), leaving the file offset alone. */
int hp_pwrite_all(int fd, const void *buf, size_t n, long long off);

/* Read all of f into a new NUL-terminated buffer (*buf, hp_free it) of
 * *len bytes.  Returns 0, or -1 with errno set (ENOMEM, or the read
 * error); *buf is NULL then. */
int hp_read_stream(FILE *f, char **buf, size_t *len);

/* Stage n bytes of src in buf (cap bytes, *used of them filled), writing
 * buf to fd each time it fills.  Returns 0, or -1 with errno set by the
 * failed write (the bytes staged so far stay in buf). */
int hp_buffered_put(int fd, unsigned char *buf, size_t cap, size_t *used, const void *src, size_t n);

#endif
