/*
 * fileio.h - small POSIX file helpers shared by the writers in lib/.
 */
#ifndef HP_FILEIO_H
#define HP_FILEIO_H

#include <stddef.h>
#include <stdio.h>

#include "base/err.h"

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

/*
 * An output written whole or not at all.  A regular file, or a path that
 * does not exist yet, is written to "PATH.tmp.PID" (registered below, so
 * that a stopped process leaves no temporary) and renamed over PATH by the
 * commit, after an fsync: a reader never sees part of it, and a failed run
 * leaves PATH as it was.  A FIFO, a character device or a socket
 * (/dev/stdout, /dev/null, a pipe made by mkfifo) is written in place and
 * never replaced: a stream has no "whole", and renaming over a device node
 * would destroy it.  /dev/stdout, /dev/stderr, /dev/fd/N and
 * /proc/self/fd/N are this process's own descriptors, written through a
 * duplicate (whatever they are open on).  A symbolic link stays one: the
 * file it points to is replaced.  A directory is refused at the open.
 */
struct hp_outfile {
	int fd;             /* -1 once closed */
	int stream;         /* written in place: no temporary, rename or fsync */
	int slot;           /* the temporary's registry slot, or -1 */
	char *path, *tmp;   /* owned; path is a link's target; tmp is NULL for a stream */
};

/* Open path for writing as above.  0, or HP_EIO naming path (a directory,
 * a folder that does not exist or cannot be written), HP_ENOMEM. */
int hp_outfile_open(struct hp_outfile *f, const char *path, struct hp_err *e);
/* Close it: a regular file is fsynced, renamed over its path and its
 * folder fsynced.  0, or HP_EIO (the temporary is removed); f is closed
 * either way. */
int hp_outfile_commit(struct hp_outfile *f, struct hp_err *e);
/* Close it and remove the temporary; safe on a closed or zeroed f. */
void hp_outfile_abort(struct hp_outfile *f);
/* A stdio stream over f (its own descriptor, a duplicate): fclose it
 * before the commit.  A stream output is line-buffered, so that a reader
 * at the other end sees each line as it is written.  NULL with HP_EIO in
 * e when it cannot be made. */
FILE *hp_outfile_stdio(struct hp_outfile *f, struct hp_err *e);
/* Close s (hp_outfile_stdio's), then, ok, commit f: 0 or the first error
 * (the file is removed then); not ok, abort f (a stream keeps what it was
 * sent) and return 0. */
int hp_outfile_close_stdio(struct hp_outfile *f, FILE *s, int ok, struct hp_err *e);
/* Write n bytes of buf as path, whole or not at all (hp_outfile_*). */
int hp_write_file(const char *path, const void *buf, size_t n, struct hp_err *e);
/* Whether path can take an output later: open it as above and abort at
 * once (a stream is only looked at, not opened: opening a FIFO would wait
 * for its reader).  For outputs written late in a run, checked before the
 * work starts.  0 or hp_outfile_open's error. */
int hp_outfile_probe(const char *path, struct hp_err *e);

/* fsync a folder, after a rename into it (best effort: what it makes
 * durable has happened already). */
void hp_fsync_dir(const char *dir);

/*
 * Temporaries removed when the process stops: a process-wide registry of
 * paths (files, or folders removed with what they hold) that
 * hp_tmp_remove_all() deletes from a signal handler, before an MPI_Abort,
 * or on any other way out.  Writers register a temporary when they create
 * it and forget it once it is renamed into place or removed.
 */
#define HP_TMP_SLOTS 64
/* Register path (a folder when dir); returns its slot, or -1 when the
 * registry is full (the temporary then works, but is not removed). */
int hp_tmp_track(const char *path, int dir);
/* Register a descriptor whose file is emptied, not removed, when the
 * process stops: a lock's note of its holder (lib/dist/ckpt.h).  The slot, or
 * -1 when the registry is full. */
int hp_tmp_track_note(int fd);
/* Forget slot (< 0: nothing). */
void hp_tmp_forget(int slot);
/* Remove every registered temporary; returns how many were removed.
 * Async-signal-safe. */
int hp_tmp_remove_all(void);

/*
 * On SIGTERM, SIGINT, SIGHUP, SIGPIPE and SIGABRT: run last_words (may be
 * NULL; async-signal-safe only, e.g. lib/comm/comm.c naming a dead peer), remove
 * the temporaries, print "TOOL: stopped by SIGTERM; N temporary files
 * removed" on stderr (from rank 0 of lib/base/log.h; not for SIGPIPE, the
 * normal end of a pipeline's reader), then end as the signal would.  A
 * later call replaces last_words.
 */
void hp_stop_on_signals(void (*last_words)(int sig));

/* For a message built in a signal handler: s, or v in decimal, copied to
 * b from at, up to cap bytes; returns where it ends.  Async-signal-safe. */
size_t hp_sig_put_str(char *b, size_t at, size_t cap, const char *s);
size_t hp_sig_put_num(char *b, size_t at, size_t cap, long v);

#endif
