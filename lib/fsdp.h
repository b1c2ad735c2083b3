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
 * Through the model's layer hook a layer's units are gathered before its
 * forward and backward and released after (their pages given back), so a
 * rank holds its shards, the root unit and the layer in hand; the
 * all-gathers of the next forward_prefetch_depth layers (backward:
 * backward_prefetch_depth) are started as a layer begins, and waited for
 * when their layer's turn comes.  With
 * tensor and expert parallelism the pieces are of the rank's tp-local
 * tensors and of its own experts only.
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

/* An all-gather in flight (FSDP prefetch): its unit (-1: free) and buffer. */
struct hp_fsdp_slot {
	int unit;
	MPI_Request req;
	float *buf;
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
	struct hp_param **mp;        /* [nparams]: the model's tensor, NULL for another rank's expert */
	struct hp_piece *pc;         /* [nparams]: this rank's piece (hp_plan_piece) */
	size_t total;                /* elements of every shard array */
	float *w, *g, *m1, *m2;      /* shards: weights, gradient sums, AdamW moments */
	float *buf;                  /* pack/unpack: the largest unit's shard_size * padded */
	int *layer_unit, *expert_unit;   /* [n_layers]: each layer's units (-1: none) */
	struct hp_fsdp_slot *slots;  /* the prefetch ring */
	int nslots;
	size_t slot_floats;          /* each slot's buffer: the largest unit's gathered size */
	long gathers, prefetched;    /* layer units gathered, and how many of them were started ahead */
	int stale_unit;              /* the fault fsdp_stale_shard: this unit is gathered from */
	float *stale;                /* its shard of the step before (-1: no fault) */
	/* the hook's state for the micro-batch in flight */
	int first_micro;             /* the step's first micro-batch on this rank */
	int rc;                      /* the first error in a hook; e holds its message */
	struct hp_err *e;
};

/* The shards of rank's pieces for the model m (this rank's tp-local
 * tensors and experts), zero until loaded. */
int hp_fsdp_init(struct hp_fsdp *f, const struct hp_plan *p, struct hp_comms *cs, struct hp_model *m,
		 struct hp_err *e);
/* Load the shards from a source (an HF folder, hp-convert's shards, the
 * random init), reading only this rank's pieces; or from the model's own
 * tensors when every rank filled them alike. */
struct hp_src;
int hp_fsdp_load(struct hp_fsdp *f, struct hp_src *src, struct hp_err *e);
int hp_fsdp_load_model(struct hp_fsdp *f);
void hp_fsdp_free(struct hp_fsdp *f);

/* One unit (0 is the root: embedding, final norm, LM head): gather its
 * weights into the model; reduce-scatter its gradients into the shard sums
 * (and release them); release its gathered weights (grads 0) or gradients
 * (grads 1), giving their pages back until the next gather. */
int hp_fsdp_gather_unit(struct hp_fsdp *f, int u, struct hp_err *e);
int hp_fsdp_reduce_scatter_unit(struct hp_fsdp *f, int u, struct hp_err *e);
void hp_fsdp_release(struct hp_fsdp *f, int u, int grads);
/* The model's layer hook (lib/model.h): gathers a layer's units before its
 * forward and backward and releases them after, as hp-plan(5) says. */
int hp_fsdp_hook(void *ctx, int layer, int phase);

/* Zero the shard gradient sums (a step begins). */
void hp_fsdp_zero_grad(struct hp_fsdp *f);
/* All-reduce the shard sums across replicas (HSDP; once per step). */
int hp_fsdp_sync_replicas(struct hp_fsdp *f, struct hp_err *e);
/* All-reduce over tp the gradients that are partial sums there
 * (hp_plan_tp_partial; once per step, after the replicas'). */
int hp_fsdp_sync_tp(struct hp_fsdp *f, struct hp_err *e);
/* Which of the shards' arrays a whole tensor is made of. */
enum hp_fsdp_which { HP_FSDP_WEIGHTS = 0, HP_FSDP_GRADS, HP_FSDP_EXP_AVG, HP_FSDP_EXP_AVG_SQ };
/* Plan param i's whole tensor (of the array which) on every rank, into dst
 * (its global numel): each piece from one holder, all-reduced over the
 * world.  For dumps; not part of a step's traffic. */
int hp_fsdp_global(struct hp_fsdp *f, int i, enum hp_fsdp_which which, float *dst, struct hp_err *e);
/* This rank's share of that sum: its piece of param i written into dst
 * (the whole tensor, zeroed by the caller) when it is the piece's holder. */
void hp_fsdp_piece_into(struct hp_fsdp *f, int i, enum hp_fsdp_which which, float *dst);
/* The global gradient norm (all-reduced over the world); replicas count once. */
double hp_fsdp_grad_norm(struct hp_fsdp *f, struct hp_err *e);
void hp_fsdp_clip(struct hp_fsdp *f, double norm, double max_norm);
/* AdamW on the shards with the model's decay flags, as hp_optim_step. */
void hp_fsdp_adamw(struct hp_fsdp *f, struct hp_adamw_hparams *h);
#endif
