/*
 * kernels.h - the list of every op x backend hp has, with its status, for
 * hp-train --list-kernels and man/hp-kernels.7 (a test keeps the two the
 * same).
 */
#ifndef HP_KERNELS_H
#define HP_KERNELS_H

#include <stdio.h>

struct hp_kernel_info {
	const char *op;        /* "attention" */
	const char *backend;   /* "cpu", "cuda" */
	const char *name;      /* the kernel; plan_overrides names for substitutes */
	const char *status;    /* "reference", "default", "substitute", "built", "planned" */
	const char *how;       /* how a run gets it */
};

extern const struct hp_kernel_info hp_kernel_list[];
extern const int hp_nkernel_list;

/* The table as hp-train --list-kernels prints it. */
void hp_kernels_print(FILE *f);

#endif
