/*
 * verify.h - a parallel run held to the one-process model, module by
 * module (validation mode and hp-verify, DESIGN.md §8).
 *
 * Rank 0 keeps a second, whole model - the gathered single-process
 * reference - with the same weights, kernels and data, and runs each step
 * on it first, recording every module's output (lib/model/model.h, probes).  The
 * parallel ranks then run the same step; at each module boundary the
 * rank's piece is placed into the whole tensor (its dp micro-batch, cp
 * chunk, sequence-parallel rows or vocabulary slice) and the pieces are
 * summed over the world, one holder per piece, so rank 0 compares the
 * whole tensor with the reference's.  After the backward the gradients of
 * every parameter are compared the same way, and after the update the
 * parameters; then the reference takes the parallel run's weights and
 * AdamW moments, so that each step is replayed from the same state and
 * float noise does not pile up into a difference over the steps.  With placement checks on, every tensor declared replicated
 * over tp must hold the same bytes on the ranks of its tp group (a hash,
 * all-reduced MIN and MAX).
 *
 * Its collectives go over duplicates of the world and tp communicators, so
 * the production counters (and their check against the plan) see nothing
 * of them.
 *
 * Ownership: struct hp_verify is the caller's; hp_verify_free releases it.
 */
#ifndef HP_VERIFY_H
#define HP_VERIFY_H

#include <stdio.h>

#include "comm/comm.h"
#include "config/config.h"
#include "dist/fsdp.h"
#include "dist/optim.h"
#include "model/model.h"
#include "plan/plan.h"

/* One row of the table: the worst of one check over the steps. */
struct hp_vrow {
	char kind[8];            /* "output", "grad", "param" */
	char name[112];          /* module or parameter */
	char placement[96];      /* as the plan declares it */
	double max_abs, rel;     /* worst max |a - b| and ||a - b|| / ||b|| */
	int bad;                 /* exceeded the tolerances at some step */
	int first_bad_step;
};

struct hp_verify {
	const struct hp_plan *p;
	struct hp_fsdp *f;
	struct hp_model *m;          /* this rank's part */
	struct hp_model ref;         /* rank 0: the whole model */
	struct hp_optim opt;         /* rank 0: its optimizer */
	int rank, have_ref;
	MPI_Comm world, tp;          /* duplicates: uncounted */
	/* pipeline stages: a stage's module outputs are assembled over its
	 * own ranks and judged by its first (its leader), which holds the
	 * reference's records too; the leaders' rows come to rank 0 each
	 * step.  Without stages stage is world and rank 0 the one leader. */
	MPI_Comm stage;
	int leader;
	/* a tensor passes when its relative L2 error is at most rtol (prtol for
	 * the weights after the update) or its largest absolute error at most
	 * atol.  AdamW divides each gradient by the root of its square, so an
	 * element whose gradient is float noise moves by up to the learning rate
	 * either way: the updated weights get a looser bound than the module
	 * outputs and gradients, which nothing divides. */
	double rtol, prtol, atol;
	int stop;                    /* validation mode: stop at the first difference */
	int placement;               /* check declared replication */
	/* the reference's outputs of this step: [accum micro-batches][nrec] */
	struct hp_vrec { char name[96]; float *x; long n; int cols; } *rec;
	int nrec, caprec, rec_micro;
	int micro;                   /* the parallel side's micro-batch within the rank's share
					(hp_verify_micro) */
	int step;
	float *buf;                  /* assembly of one tensor over dp */
	size_t cap;
	struct hp_vrow *rows;
	int nrows, caprows;
	long checks;
	char first[640];             /* the first difference, or "" */
	long first_at;               /* where it is in the step's forward (forward_at) */
};

/* Pipeline stages: after hp_verify_reference, every stage's leader takes
 * rank 0's records of the step (every rank calls it; nothing without
 * stages). */
int hp_verify_share(struct hp_verify *v, struct hp_err *e);
/* Set up after the parallel model's weights are in the shards: rank 0
 * builds the reference model with kernels k and takes the same weights. */
int hp_verify_init(struct hp_verify *v, const struct hp_plan *p, struct hp_fsdp *f, struct hp_model *m,
		   const struct hp_model_kernels *k, const struct hp_config *cfg, MPI_Comm world,
		   struct hp_comms *cs, struct hp_err *e);
void hp_verify_free(struct hp_verify *v);

/* Rank 0: the reference's forward and backward of the step's accum
 * micro-batches (ids, labels, seg: accum x B x S), recording outputs. */
int hp_verify_reference(struct hp_verify *v, long step, const int32_t *ids, const int32_t *labels,
			const int32_t *seg, long accum, double total, struct hp_err *e);
/* The parallel side's micro-batch micro of its share begins. */
void hp_verify_micro(struct hp_verify *v, int micro);
/* The parallel model's probe (lib/model/model.h): compare one module output. */
int hp_verify_probe(void *ctx, const struct hp_probe *pr, struct hp_err *e);
/* Compare every parameter's gradient (grads 1, before clipping) or value
 * (0, after the update). */
int hp_verify_params(struct hp_verify *v, int grads, struct hp_err *e);
/* Rank 0: clip and step the reference as the run does. */
void hp_verify_update(struct hp_verify *v, double lr);

/* The table (rank 0), as text or JSON. */
void hp_verify_print(const struct hp_verify *v, FILE *out, int json);

#endif
