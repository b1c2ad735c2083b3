/*
 * train.h - the training loop behind hp-train.
 *
 * hp_train_run() resolves the config into a plan for the job's world size,
 * loads the model and data, and runs train_iters optimizer steps of
 * global_batch_size sequences each (gradient accumulation over
 * micro-batches), printing the resolved-parameter table and one line per
 * logged step to `out` on rank 0.  One step serves every world size (one
 * process is the world of size one): FSDP/HSDP, tensor, sequence, context
 * and expert parallelism as the plan lays them out, each step's traffic
 * checked against the plan's estimate and added to the metrics.
 *
 * Output files (--metrics, --dump-grads) are written under temporary names
 * and renamed when complete; on failure they are removed.
 */
#ifndef HP_TRAIN_H
#define HP_TRAIN_H

#include <mpi.h>
#include <stdio.h>

#include "base/err.h"

struct hp_train_opts {
	const char *config;          /* YAML path */
	int noverrides;
	char *const *overrides;      /* "--a.b=c" strings, borrowed */
	const char *metrics;         /* JSONL path or NULL */
	const char *dump_grads;      /* safetensors path or NULL */
	const char *dump_params;     /* safetensors path for the final weights, or NULL */
	const char *shards;          /* hp-convert's shard directory, or NULL: the model's folder */
	long max_steps;              /* stop after this many steps (0: training.train_iters) */
	/* hp-verify: hold every step to the gathered one-process reference and
	 * print the table (rank 0) instead of the step lines */
	int verify, verify_json;
	double rtol, prtol, atol;    /* 0: 1e-5, 1e-3 and 1e-7 */
	int quiet;                   /* no table, no step lines */
};

int hp_train_run(const struct hp_train_opts *o, MPI_Comm comm, FILE *out, struct hp_err *e);

#endif
