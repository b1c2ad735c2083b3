/*
 * fileio.c - see fileio.h.
 */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fileio.h"
#include "base/log.h"

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

/* --- temporaries removed when the process stops ------------------------------ */

/* A slot is claimed by its path, then published by used = 1; a handler
 * reads only published slots.  PATH_MAX-sized slots: no allocation in a
 * handler, and none while registering. */
static struct {
	volatile sig_atomic_t used;
	int dir;
	int fd;                 /* >= 0: a note to empty (hp_tmp_track_note), no path */
	char path[PATH_MAX];
} tmps[HP_TMP_SLOTS];

int hp_tmp_track_note(int fd)
{
	for (int i = 0; i < HP_TMP_SLOTS; i++)
		if (!tmps[i].used) {
			tmps[i].fd = fd;
			tmps[i].path[0] = '\0';
			tmps[i].used = 1;
			return i;
		}
	return -1;
}

int hp_tmp_track(const char *path, int dir)
{
	size_t n = strlen(path);

	if (n >= PATH_MAX)
		return -1;
	for (int i = 0; i < HP_TMP_SLOTS; i++)
		if (!tmps[i].used) {
			memcpy(tmps[i].path, path, n + 1);
			tmps[i].dir = dir;
			tmps[i].fd = -1;
			tmps[i].used = 1;
			return i;
		}
	return -1;
}

void hp_tmp_forget(int slot)
{
	if (slot >= 0 && slot < HP_TMP_SLOTS)
		tmps[slot].used = 0;
}

/* Remove what the folder open as fd holds, depth levels deep at most (a
 * checkpoint's temporary holds folders of files), with getdents64:
 * opendir allocates, which a signal handler must not. */
static void clear_dir(int fd, int depth)
{
	char buf[4096];
	long n;
	int removed;

	/* entries removed from a folder being read may or may not show up
	 * again: read it from its start until a pass removes nothing */
	do {
		removed = 0;
		lseek(fd, 0, SEEK_SET);
		while ((n = syscall(SYS_getdents64, fd, buf, sizeof(buf))) > 0) {
			for (long at = 0; at < n;) {
				struct {
					uint64_t ino;
					int64_t off;
					unsigned short reclen;
					unsigned char type;
					char name[];
				} *d = (void *)(buf + at);

				at += d->reclen;
				if (!strcmp(d->name, ".") || !strcmp(d->name, ".."))
					continue;
				if (d->type == DT_DIR && depth > 0) {
					int sub = openat(fd, d->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

					if (sub >= 0) {
						clear_dir(sub, depth - 1);
						close(sub);
					}
					removed += unlinkat(fd, d->name, AT_REMOVEDIR) == 0;
				} else {
					removed += unlinkat(fd, d->name, 0) == 0;
				}
			}
		}
	} while (removed);
}

int hp_tmp_remove_all(void)
{
	int n = 0;

	for (int i = 0; i < HP_TMP_SLOTS; i++) {
		if (!tmps[i].used)
			continue;
		if (tmps[i].fd >= 0) {
			if (ftruncate(tmps[i].fd, 0)) {
				/* a note left is read as a run that is gone: harmless */
			}
		} else if (tmps[i].dir) {
			int fd = open(tmps[i].path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (fd >= 0) {
				clear_dir(fd, 4);
				close(fd);
			}
			n += rmdir(tmps[i].path) == 0;
		} else {
			n += unlink(tmps[i].path) == 0;
		}
		tmps[i].used = 0;
	}
	return n;
}

static void (*last_words_fn)(int sig);

size_t hp_sig_put_str(char *b, size_t at, size_t cap, const char *s)
{
	while (*s && at < cap)
		b[at++] = *s++;
	return at;
}

size_t hp_sig_put_num(char *b, size_t at, size_t cap, long v)
{
	char d[24];
	int n = 0;

	do
		d[n++] = (char)('0' + v % 10);
	while ((v /= 10) && n < 23);
	while (n && at < cap)
		b[at++] = d[--n];
	return at;
}

/* The thread that set the handler up (the tool's main thread): the one
 * that writes the temporaries, and so the one that must remove them. */
static long main_tid;

static void on_stop(int sig)
{
	int saved = errno, n;
	char b[256];
	size_t at = 0;

	/* a signal for the process may land on a library's thread (MPI's
	 * progress threads): handled there, the main thread would go on
	 * writing while the temporaries are removed, and leave some behind.
	 * It is handed to the main thread, which stops where it is. */
	if (main_tid && syscall(SYS_gettid) != main_tid) {
		syscall(SYS_tgkill, (long)getpid(), main_tid, sig);
		errno = saved;
		return;
	}
	/* the temporaries before the last words, which may wait on a pipe
	 * while the launcher gets ready to kill this process */
	n = hp_tmp_remove_all();
	if (last_words_fn)
		last_words_fn(sig);
	if (sig != SIGPIPE && hp_log_rank() == 0) {
		size_t cap = sizeof(b) - 1;

		at = hp_sig_put_str(b, at, cap, hp_log_tool());
		at = hp_sig_put_str(b, at, cap, ": stopped by ");
		at = hp_sig_put_str(b, at, cap, sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" :
				    sig == SIGHUP ? "SIGHUP" : "SIGABRT");
		if (n) {
			at = hp_sig_put_str(b, at, cap, "; ");
			at = hp_sig_put_num(b, at, cap, n);
			at = hp_sig_put_str(b, at, cap, n == 1 ? " temporary file removed" : " temporary files removed");
		}
		b[at++] = '\n';
		if (write(STDERR_FILENO, b, at) < 0) {
			/* nothing more to say it with */
		}
	}
	errno = saved;
	signal(sig, SIG_DFL);
	raise(sig);
}

void hp_stop_on_signals(void (*last_words)(int sig))
{
	static const int sigs[] = { SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGABRT };
	struct sigaction sa;

	last_words_fn = last_words;
	main_tid = syscall(SYS_gettid);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		sigaddset(&sa.sa_mask, sigs[i]);
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		struct sigaction old;

		/* a signal the parent made us ignore (nohup, a shell's background
		 * job) stays ignored */
		if (!sigaction(sigs[i], NULL, &old) && old.sa_handler == SIG_IGN)
			continue;
		sigaction(sigs[i], &sa, NULL);
	}
}

/* --- outputs written whole, or in place when they are streams --------------- */

static int is_stream(mode_t m)
{
	return S_ISFIFO(m) || S_ISCHR(m) || S_ISSOCK(m);
}

void hp_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
}

/* The folder that holds path, fsynced (after a rename into it). */
static void sync_parent(const char *path)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');

	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else
		snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
	hp_fsync_dir(dir);
}

/* The descriptor a path names when it is one of this process's own:
 * /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N; else -1.  Such an
 * output is written through a duplicate, sharing the descriptor's offset
 * (reopening /proc/self/fd/1 would start a regular file over at 0). */
static int own_fd(const char *path)
{
	const char *n = NULL;
	char *end;
	long fd;

	if (!strcmp(path, "/dev/stdout"))
		return STDOUT_FILENO;
	if (!strcmp(path, "/dev/stderr"))
		return STDERR_FILENO;
	if (!strncmp(path, "/dev/fd/", 8))
		n = path + 8;
	else if (!strncmp(path, "/proc/self/fd/", 14))
		n = path + 14;
	if (!n || !*n)
		return -1;
	fd = strtol(n, &end, 10);
	return *end || fd < 0 || fd > INT_MAX ? -1 : (int)fd;
}

/* The file a symbolic link names, as an absolute path (malloc'd), whether
 * it exists yet or not (its folder must); NULL with errno set. */
static char *link_target(const char *path)
{
	char t[PATH_MAX], full[2 * PATH_MAX + 2], *dir, *out;
	const char *slash, *base;
	ssize_t n;

	if ((out = realpath(path, NULL)) || errno != ENOENT)
		return out;
	if ((n = readlink(path, t, sizeof(t) - 1)) < 0)
		return NULL;
	t[n] = '\0';
	slash = strrchr(path, '/');
	if (t[0] == '/' || !slash)
		snprintf(full, sizeof(full), "%s", t);
	else
		snprintf(full, sizeof(full), "%.*s/%s", (int)(slash - path), path, t);
	slash = strrchr(full, '/');
	base = slash ? slash + 1 : full;
	if (slash)
		full[slash == full ? 1 : slash - full] = '\0';
	if (!(dir = realpath(slash ? full : ".", NULL)))
		return NULL;
	n = (ssize_t)(strlen(dir) + strlen(base) + 2);
	if ((out = malloc((size_t)n)))
		snprintf(out, (size_t)n, "%s/%s", strcmp(dir, "/") ? dir : "", base);
	free(dir);
	return out;
}

int hp_outfile_open(struct hp_outfile *f, const char *path, struct hp_err *e)
{
	struct stat st, lst;
	char *final = NULL;
	int fd = own_fd(path), rc, exists;
	size_t n;

	memset(f, 0, sizeof(*f));
	f->fd = -1;
	f->slot = -1;
	if (!(f->path = hp_strdup(path)))
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory", path);
	if (fd >= 0) {
		f->stream = 1;
		if ((f->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0) {
			rc = hp_err_set(e, HP_EIO, "'%s': cannot write: %s", path, strerror(errno));
			hp_outfile_abort(f);
			return rc;
		}
		return 0;
	}
	exists = !stat(path, &st);
	if (exists && S_ISDIR(st.st_mode)) {
		hp_outfile_abort(f);
		return hp_err_set(e, HP_EIO, "'%s': is a directory (an output file was expected)", path);
	}
	if (exists && is_stream(st.st_mode)) {
		f->stream = 1;
		if ((f->fd = open(path, O_WRONLY | O_CLOEXEC)) < 0) {
			rc = hp_err_set(e, HP_EIO, "'%s': cannot open for writing: %s", path, strerror(errno));
			hp_outfile_abort(f);
			return rc;
		}
		return 0;
	}
	/* a symbolic link stays one: its target is what gets replaced */
	if (!lstat(path, &lst) && S_ISLNK(lst.st_mode)) {
		if (!(final = link_target(path))) {
			rc = hp_err_set(e, HP_EIO, "'%s': a symbolic link to nothing writable: %s", path,
					strerror(errno));
			hp_outfile_abort(f);
			return rc;
		}
	}
	n = strlen(final ? final : path) + 32;
	if (!(f->tmp = hp_malloc(n))) {
		free(final);
		hp_outfile_abort(f);
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory", path);
	}
	snprintf(f->tmp, n, "%s.tmp.%ld", final ? final : path, (long)getpid());
	if (final) {
		char *t = hp_strdup(final);

		free(final);
		hp_free(f->path);
		if (!(f->path = t)) {
			hp_outfile_abort(f);
			return hp_err_set(e, HP_ENOMEM, "'%s': out of memory", path);
		}
	}
	if ((f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
		rc = hp_err_set(e, HP_EIO, "'%s': cannot create: %s", path, strerror(errno));
		hp_free(f->tmp);
		f->tmp = NULL;
		hp_outfile_abort(f);
		return rc;
	}
	f->slot = hp_tmp_track(f->tmp, 0);
	return 0;
}

int hp_outfile_commit(struct hp_outfile *f, struct hp_err *e)
{
	int rc = 0;

	if (f->fd < 0)
		return hp_err_set(e, HP_EINVAL, "'%s': committed twice", f->path ? f->path : "?");
	if (f->stream) {
		if (close(f->fd))
			rc = hp_err_set(e, HP_EIO, "'%s': write failed: %s", f->path, strerror(errno));
		f->fd = -1;
		hp_outfile_abort(f);
		return rc;
	}
	if (fsync(f->fd))
		rc = hp_err_set(e, HP_EIO, "'%s': cannot sync: %s", f->path, strerror(errno));
	if (close(f->fd) && !rc)
		rc = hp_err_set(e, HP_EIO, "'%s': write failed: %s", f->path, strerror(errno));
	f->fd = -1;
	if (!rc && rename(f->tmp, f->path))
		rc = hp_err_set(e, HP_EIO, "'%s': cannot rename into place: %s", f->path, strerror(errno));
	if (!rc) {
		sync_parent(f->path);
		hp_tmp_forget(f->slot);
		f->slot = -1;
		hp_free(f->tmp);   /* renamed: nothing left to remove */
		f->tmp = NULL;
	}
	hp_outfile_abort(f);
	return rc;
}

void hp_outfile_abort(struct hp_outfile *f)
{
	if (f->path) {   /* opened: a zeroed f holds no descriptor or slot */
		if (f->fd >= 0)
			close(f->fd);
		if (f->tmp)
			unlink(f->tmp);
		hp_tmp_forget(f->slot);
	}
	hp_free(f->tmp);
	hp_free(f->path);
	memset(f, 0, sizeof(*f));
	f->fd = -1;
	f->slot = -1;
}

FILE *hp_outfile_stdio(struct hp_outfile *f, struct hp_err *e)
{
	int fd = fcntl(f->fd, F_DUPFD_CLOEXEC, 3);
	FILE *s = fd >= 0 ? fdopen(fd, "w") : NULL;

	if (!s) {
		hp_err_set(e, HP_EIO, "'%s': cannot write: %s", f->path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	if (f->stream)
		setvbuf(s, NULL, _IOLBF, 0);
	return s;
}

int hp_outfile_close_stdio(struct hp_outfile *f, FILE *s, int ok, struct hp_err *e)
{
	int bad = ferror(s) | fflush(s);

	bad |= fclose(s);
	if (ok && bad) {
		int rc = hp_err_set(e, HP_EIO, "'%s': write failed: %s", f->path, strerror(errno));

		hp_outfile_abort(f);
		return rc;
	}
	if (!ok) {
		hp_outfile_abort(f);
		return 0;
	}
	return hp_outfile_commit(f, e);
}

int hp_write_file(const char *path, const void *buf, size_t n, struct hp_err *e)
{
	struct hp_outfile o;
	int rc;

	if ((rc = hp_outfile_open(&o, path, e)))
		return rc;
	if (hp_write_all(o.fd, buf, n)) {
		rc = hp_err_set(e, HP_EIO, "'%s': cannot write: %s", path, strerror(errno));
		hp_outfile_abort(&o);
		return rc;
	}
	return hp_outfile_commit(&o, e);
}

int hp_outfile_probe(const char *path, struct hp_err *e)
{
	struct hp_outfile f;
	struct stat st;
	int rc, fd = own_fd(path);

	if (fd >= 0) {
		if (fcntl(fd, F_GETFL) < 0)
			return hp_err_set(e, HP_EIO, "'%s': cannot write: %s", path, strerror(errno));
		return 0;
	}
	if (!stat(path, &st) && is_stream(st.st_mode)) {
		if (access(path, W_OK))
			return hp_err_set(e, HP_EIO, "'%s': cannot open for writing: %s", path, strerror(errno));
		return 0;
	}
	if ((rc = hp_outfile_open(&f, path, e)))
		return rc;
	hp_outfile_abort(&f);
	return 0;
}
