/*
 * err.c - the error record.  Formatting only; nothing here prints.
 *
 * A message is at most HP_ERR_MSG_MAX - 1 bytes.  One that comes out longer
 * (an over-long path quoted in it, say) keeps its start and its end and
 * loses its middle to "...": messages name their subject first and give the
 * reason last, and the reason is the part a user cannot do without.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"

void hp_err_clear(struct hp_err *e)
{
	if (!e)
		return;
	e->code = 0;
	e->msg[0] = '\0';
	e->src_file = NULL;
	e->src_line = 0;
}

/* Messages are one line by contract, even when they quote input that holds
 * newlines or other control characters: those become '?'. */
static void one_line(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}

/* A UTF-8 continuation byte: a cut before it would split a character. */
static int utf8_cont(char c)
{
	return ((unsigned char)c & 0xc0) == 0x80;
}

/* A message in pieces (the prefix, ": ", the old message), so that joining
 * them needs no buffer of their whole length. */
struct piece {
	const char *p;
	size_t n;
};

static char piece_at(const struct piece *pc, int np, size_t i)
{
	for (int k = 0; k < np; i -= pc[k].n, k++)
		if (i < pc[k].n)
			return pc[k].p[i];
	return '\0';
}

static void piece_copy(char *dst, const struct piece *pc, int np, size_t from, size_t len)
{
	for (int k = 0; k < np && len; k++) {
		if (from >= pc[k].n) {
			from -= pc[k].n;
			continue;
		}
		size_t m = pc[k].n - from < len ? pc[k].n - from : len;
		memcpy(dst, pc[k].p + from, m);
		dst += m;
		len -= m;
		from = 0;
	}
}

/*
 * Join the pieces into dst (HP_ERR_MSG_MAX bytes).  When they do not fit,
 * keep the first and the last (HP_ERR_MSG_MAX - 4) / 2 bytes, moved to
 * character boundaries, around "...".  Halves, because the start names the
 * subject and the end gives the reason, and either may be the long part.
 * No piece may point into dst.
 */
static void fit(char *dst, const struct piece *pc, int np)
{
	const size_t room = HP_ERR_MSG_MAX - 1;
	size_t n = 0, head, tail;

	for (int k = 0; k < np; k++)
		n += pc[k].n;
	if (n <= room) {
		piece_copy(dst, pc, np, 0, n);
		dst[n] = '\0';
		return;
	}
	head = (room - 3) / 2;
	tail = room - 3 - head;
	while (head && utf8_cont(piece_at(pc, np, head)))
		head--;
	while (tail && utf8_cont(piece_at(pc, np, n - tail)))
		tail--;
	piece_copy(dst, pc, np, 0, head);
	memcpy(dst + head, "...", 3);
	piece_copy(dst + head + 3, pc, np, n - tail, tail);
	dst[head + 3 + tail] = '\0';
}

/*
 * Format into buf (HP_ERR_MSG_MAX bytes) or, when the text is longer, into
 * a new buffer (*heap, for the caller to free) so that its end survives.
 * Without memory for that, the start stays in buf, ending in "..." to show
 * the cut.  Returns the text; *n is its length.
 */
static const char *format(char *buf, char **heap, size_t *n, const char *fmt, va_list ap)
{
	va_list ap2;
	int len;

	*heap = NULL;
	va_copy(ap2, ap);
	len = vsnprintf(buf, HP_ERR_MSG_MAX, fmt, ap2);
	va_end(ap2);
	if (len < 0) {
		buf[0] = '\0';
		len = 0;
	}
	*n = (size_t)len;
	if (*n < HP_ERR_MSG_MAX)
		return buf;
	if ((*heap = hp_malloc(*n + 1))) {
		vsnprintf(*heap, *n + 1, fmt, ap);
		return *heap;
	}
	*n = HP_ERR_MSG_MAX - 4;
	while (*n && utf8_cont(buf[*n]))
		(*n)--;
	memcpy(buf + *n, "...", 4);
	*n += 3;
	return buf;
}

int hp_err_set_at(struct hp_err *e, int code, const char *file, int line,
		  const char *fmt, ...)
{
	char buf[HP_ERR_MSG_MAX], *heap;
	struct piece pc;
	va_list ap;

	if (!e)
		return code;
	/* formatted before e->msg is written: an argument may point into it */
	va_start(ap, fmt);
	pc.p = format(buf, &heap, &pc.n, fmt, ap);
	va_end(ap);
	fit(e->msg, &pc, 1);
	hp_free(heap);
	one_line(e->msg);
	e->code = code;
	e->src_file = file;
	e->src_line = line;
	return code;
}

int hp_err_prefix(struct hp_err *e, const char *fmt, ...)
{
	char buf[HP_ERR_MSG_MAX], old[HP_ERR_MSG_MAX], *heap;
	struct piece pc[3];
	va_list ap;

	if (!e)
		return HP_EINVAL;
	va_start(ap, fmt);
	pc[0].p = format(buf, &heap, &pc[0].n, fmt, ap);
	va_end(ap);
	memcpy(old, e->msg, sizeof(old));
	old[sizeof(old) - 1] = '\0';
	pc[1].p = ": ";
	pc[1].n = 2;
	pc[2].p = old;
	pc[2].n = strlen(old);
	fit(e->msg, pc, 3);
	hp_free(heap);
	one_line(e->msg);
	return e->code;
}

int hp_err_exit_code(int code)
{
	switch (code) {
	case HP_OK: return HP_EXIT_OK;
	case HP_ECONFIG: return HP_EXIT_CONFIG;
	case HP_EFORMAT: case HP_EUNSUP: return HP_EXIT_DATA;
	case HP_EIO: case HP_ENOMEM: return HP_EXIT_IO;
	case HP_EINVAL: return HP_EXIT_BUG;
	default: return HP_EXIT_FAILURE;
	}
}

const char *hp_err_name(int code)
{
	switch (code) {
	case HP_OK: return "ok";
	case HP_EINVAL: return "invalid argument";
	case HP_ENOMEM: return "out of memory";
	case HP_EIO: return "i/o error";
	case HP_EFORMAT: return "format error";
	case HP_ECONFIG: return "config error";
	case HP_EUNSUP: return "unsupported";
	case HP_ENUM: return "numerical error";
	case HP_EMPI: return "mpi error";
	case HP_ECUDA: return "cuda error";
	default: return "unknown error";
	}
}
