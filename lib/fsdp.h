/*
 * fsdp.h - FSDP and HSDP over a plan's dp_shard / dp_replicate (and, for
 * routed experts, edp_shard / edp_replicate) dims.
 *
 * Every rank keeps its shard of each parameter as hp_plan_piece cuts it
 * (torch.chunk of dim 0, padded to the chunk), the gradient accumulators
 * and AdamW moments of that shard, and runs the optimizer on it.  Before a
 * unit is used its shards are all-gathered into the model's buffers; after
 * each micro-batch's backward its gradients are reduce-scattered into the
 * shard accumulators; after the last, the accumulated shards are
 * all-reduced across replicas.  The collectives and their counts follow
 * hp-plan(5), ESTIMATES, so the byte counters of lib/comm equal the plan's
 * estimate.
 *
 * What this stage does not do yet: free the gathered buffers between units
 * (the model keeps full-size weight and gradient buffers, so parameter
 * memory per rank is not yet 1/N; the optimizer state is), tensor, context
 * and expert parallelism (refused by the caller).
 */
#ifndef HP_FSDP_H
#define HP_FSDP_H

#include "comm.h"
#include "model.h"
#include "plan.h"

struct hp_fsdp_unit {
	int shard_dim, rep_dim;      /* enum hp_dim */
	int root;                    /* the unit that stays gathered through the backward */
	int first, n;                /* its params: plan indices first .. first+n-1 in unit order */
	size_t off, padded;          /* its range in the shard arrays; padded elements */
};

struct hp_fsdp {
	const struct hp_plan *p;
	struct hp_comms *cs;
	struct hp_model *m;
	int rank;
	int nunits;
	struct hp_fsdp_unit *units;
	int *order;                  /* plan param indices, grouped unit by unit */
	size_t *poff;                /* [nparams]: offset of each param's padded chunk */
	size_t total;                /* elements of every shard array */
	float *w, *g, *m1, *m2;      /* shards: weights, gradient sums, AdamW moments */
	float *buf;                  /* pack/unpack: the largest unit's shard_size * padded */
};

/* Shards of m's current weights (identical on every rank) for rank. */
int hp_fsdp_init(struct hp_fsdp *f, const struct hp_plan *p, struct hp_comms *cs, struct hp_model *m,
		 struct hp_err *e);
void hp_fsdp_release(struct hp_fsdp *f);

/* All-gather every unit's shards into the model's weights.  backward: the
 * gather before a backward (layer units only, with reshard_after_forward). */
int hp_fsdp_gather(struct hp_fsdp *f, int backward, struct hp_err *e);
/* Zero the shard gradient sums (a step begins). */
void hp_fsdp_zero_grad(struct hp_fsdp *f);
/* Reduce-scatter the model's gradients into the shard sums, then zero them. */
int hp_fsdp_reduce_scatter(struct hp_fsdp *f, struct hp_err *e);
/* All-reduce the shard sums across replicas (HSDP; once per step). */
int hp_fsdp_sync_replicas(struct hp_fsdp *f, struct hp_err *e);
/* The global gradient norm (all-reduced over the world); replicas count once. */
double hp_fsdp_grad_norm(struct hp_fsdp *f, struct hp_err *e);
void hp_fsdp_clip(struct hp_fsdp *f, double norm, double max_norm);
/* AdamW on the shards with the model's decay flags, as hp_optim_step. */
void hp_fsdp_adamw(struct hp_fsdp *f, struct hp_adamw_hparams *h);
/* All-gather the shard gradient sums into the model's gradients (to dump them). */
int hp_fsdp_gather_grads(struct hp_fsdp *f, struct hp_err *e);

#endif
