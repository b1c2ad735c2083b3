/*
 * err.c - the error record.  Formatting only; nothing here prints.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "err.h"

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

int hp_err_set_at(struct hp_err *e, int code, const char *file, int line,
		  const char *fmt, ...)
{
	va_list ap;

	if (!e)
		return code;
	e->code = code;
	e->src_file = file;
	e->src_line = line;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	one_line(e->msg);
	return code;
}

int hp_err_prefix(struct hp_err *e, const char *fmt, ...)
{
	char head[HP_ERR_MSG_MAX], old[HP_ERR_MSG_MAX];
	va_list ap;

	if (!e)
		return HP_EINVAL;
	va_start(ap, fmt);
	vsnprintf(head, sizeof(head), fmt, ap);
	va_end(ap);
	memcpy(old, e->msg, sizeof(old));
	/* both halves are bounded: truncation of an over-long message is fine */
	size_t n = strnlen(head, sizeof(e->msg) - 3);
	memcpy(e->msg, head, n);
	memcpy(e->msg + n, ": ", 2);
	size_t m = strnlen(old, sizeof(e->msg) - n - 3);
	memcpy(e->msg + n + 2, old, m);
	e->msg[n + 2 + m] = '\0';
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
