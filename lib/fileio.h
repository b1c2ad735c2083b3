/*
 * fileio.h - small POSIX file helpers shared by the writers in lib/.
 */
#ifndef HP_FILEIO_H
#define HP_FILEIO_H

#include <stddef.h>

/* Write all n bytes of buf to fd, retrying short writes and EINTR.
 * Returns 0, or -1 with errno set (EIO when write makes no progress). */
int hp_write_all(int fd, const void *buf, size_t n);

#endif
