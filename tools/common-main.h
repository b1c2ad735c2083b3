/*
 * common-main.h - what every hp tool's main provides and may call.
 *
 * tools/common-main.c owns main(): it starts MPI (singleton or under
 * mpiexec/srun), sets up rank-aware logging under the tool's name, calls
 * the tool's cmd_main(), finalizes MPI and returns the exit status.  Tools
 * report failures through die_err()/usage_error(), which print one line and
 * return the documented exit status for cmd_main to return.
 */
#ifndef HP_COMMON_MAIN_H
#define HP_COMMON_MAIN_H

#include <mpi.h>

#include "base/err.h"

/* Defined by each tool. */
extern const char hp_tool_name[];
int cmd_main(int argc, char **argv, MPI_Comm comm);

#define HP_VERSION "0.1.0"

/* Print "tool: message" (rank 0, or every rank for errors) and return the
 * exit status for e->code. */
int die_err(const struct hp_err *e);
/* Print "tool: message" and the one-line usage hint; return HP_EXIT_USAGE. */
int usage_error(const char *usage, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Split argv into the tool's own arguments (*rest, argv[0] first) and
 * config overrides (*ovr): "--key=value" where key is not one of opts'
 * long option names (so --a.b=c and --lr_scheduler=null both are).  Both
 * arrays are NULL-terminated, borrow argv's strings, and are freed with
 * hp_free.  Returns 0, or HP_ENOMEM.
 */
struct option;
int hp_split_overrides(int argc, char **argv, const struct option *opts,
		       char ***rest, int *nrest, char ***ovr, int *novr);

/*
 * Collective failure decision at a phase boundary: all ranks of comm
 * all-reduce their exit status (max); returns it.  Keeps one rank's error
 * from leaving the others waiting forever.
 */
int hp_agree_status(MPI_Comm comm, int status);

#endif
