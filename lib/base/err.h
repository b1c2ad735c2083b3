/*
 * err.h - error codes and the error record every library call fills.
 *
 * Library functions return 0 on success or a negative HP_E* code, and on
 * failure write a one-line, lowercase message into a caller-owned struct
 * hp_err.  The library never prints, never exits: tools map the code to an
 * exit status (see hp_err_exit_code) and print the message once.
 *
 * Message style: what failed first, the subject in quotes, no final period,
 * e.g. "'model.safetensors': header length 812 runs past end of file (400 bytes)".
 */
#ifndef HP_ERR_H
#define HP_ERR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum hp_errcode {
	HP_OK = 0,
	HP_EINVAL = -1,   /* bad argument to a library call (a bug in the caller) */
	HP_ENOMEM = -2,   /* allocation failed */
	HP_EIO = -3,      /* open/read/write/rename failed, missing file */
	HP_EFORMAT = -4,  /* a file exists but its contents are malformed */
	HP_ECONFIG = -5,  /* YAML, config.json or override is wrong */
	HP_EUNSUP = -6,   /* well-formed but not supported (dtype, model type) */
	HP_ENUM = -7,     /* numerical failure: NaN/Inf loss or gradient */
	HP_EMPI = -8,     /* an MPI call failed */
	HP_ECUDA = -9,    /* a CUDA/cuBLAS/NCCL call failed */
};

/* Exit statuses shared by every tool and documented in each man page. */
enum hp_exit {
	HP_EXIT_OK = 0,
	HP_EXIT_FAILURE = 1,  /* runtime failure: numerical, MPI, CUDA */
	HP_EXIT_USAGE = 2,    /* bad command line */
	HP_EXIT_CONFIG = 3,   /* bad YAML, config.json or --a.b=c override */
	HP_EXIT_DATA = 4,     /* malformed or unsupported input file */
	HP_EXIT_IO = 5,       /* missing file, read or write failure, no memory */
	HP_EXIT_BUG = 70,     /* broken internal invariant (BUG()) */
};

/* A longer message keeps its first and last (HP_ERR_MSG_MAX - 4) / 2 bytes
 * around "...", so that the reason at its end survives an over-long path. */
#define HP_ERR_MSG_MAX 1024

struct hp_err {
	int code;                  /* last HP_E* code, 0 when clear */
	char msg[HP_ERR_MSG_MAX];  /* one line, no trailing newline */
	const char *src_file;      /* where it was raised (for BUG reports) */
	int src_line;
};

/* Clear an error record. */
void hp_err_clear(struct hp_err *e);

/*
 * Record an error and return code, so that callers can write
 *   return hp_err_set(e, HP_EFORMAT, "'%s': bad magic", path);
 * e may be NULL (the message is then dropped).
 */
int hp_err_set_at(struct hp_err *e, int code, const char *file, int line,
		  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define hp_err_set(e, code, ...) hp_err_set_at((e), (code), __FILE__, __LINE__, __VA_ARGS__)

/* Prefix the existing message with more context: "ctx: old message"
 * (shortened in the middle, as hp_err_set, when that is too long). */
int hp_err_prefix(struct hp_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The exit status a tool uses for a library error code. */
int hp_err_exit_code(int code);

/* A short name for a code ("format error"); never NULL. */
const char *hp_err_name(int code);

#ifdef __cplusplus
}
#endif

#endif
