/*
 * optim.h - what happens between backward and the next forward, for every
 * world size alike: zeroing the gradients, their global norm and clipping,
 * the learning-rate schedule, AdamW, all over one parameter store.
 *
 * A store is the arrays the optimizer steps: in one process the model's
 * flat weights and gradients with model-sized moments; over ranks the
 * FSDP shards (hp_fsdp_store).  Its runs say which spans the norm sums
 * (each element once over the world) and which spans AdamW steps with
 * which decay flag, so that the same code serves both.
 *
 * Semantics are torch's: clip_grad_norm_ (global L2 norm over all
 * parameters, scale by max_norm / (norm + 1e-6) when that is below 1) and
 * torch.optim.AdamW with decoupled weight decay, applied to the parameters
 * whose HF name contains none of no_decay_params (case-insensitive).
 */
#ifndef HP_OPTIM_H
#define HP_OPTIM_H

#include "comm/comm.h"
#include "config/config.h"
#include "model/model.h"

/* A span of a store's arrays; decay: AdamW's weight decay applies. */
struct hp_store_run {
	size_t off, n;
	int decay;
};

struct hp_store {
	struct hp_backend *bk;
	float *w, *g, *m1, *m2;     /* weights, gradient sums, AdamW moments (backend) */
	size_t total;               /* elements of each array */
	struct hp_store_run *norm;  /* the spans the gradient norm sums, in order */
	int nnorm;
	struct hp_store_run *upd;   /* the spans AdamW steps, one decay flag each */
	int nupd;
	struct hp_comm *world;      /* the norm's sum is all-reduced here; NULL: one process */
};

/* Append a run to *runs (grown by doubling); HP_ENOMEM. */
int hp_store_add_run(struct hp_store_run **runs, int *n, size_t off, size_t len, int decay, struct hp_err *e);
void hp_store_free(struct hp_store *s);

struct hp_optim {
	float *m, *v;               /* AdamW moments, model->numel each, in the model's
				       backend's memory (owned) */
	float *hm, *hv;             /* their host copies (checkpoints): == m, v on the CPU */
	struct hp_backend *bk;      /* the model's (borrowed) */
	long step;                  /* optimizer steps taken */
	struct hp_adamw_hparams hp;
	/* schedule */
	enum hp_lr_style style;
	double lr_max, lr_min;
	long warmup, total;
	double max_grad_norm;       /* 0: no clipping */
	struct hp_store s;          /* what it steps (owned) */
};

/* Set up the schedule and m's decay flags from the config's optimizer,
 * lr_scheduler and training sections and, with moments, model-sized
 * moments (on m's backend) and the store of the model's flat arrays.
 * Without (FSDP), nothing model-sized is allocated: the store comes from
 * hp_optim_use. */
int hp_optim_init(struct hp_optim *o, struct hp_model *m, const struct hp_config *c, int moments,
		  struct hp_err *e);
/* Step the store s instead (FSDP's shards, hp_fsdp_store; taken over):
 * any model-sized moments are freed. */
void hp_optim_use(struct hp_optim *o, struct hp_store *s);
/* Device backends: the moments to their host copies (to_host 1), or
 * back (0).  Nothing on the CPU, nor for a store of shards. */
int hp_optim_move(struct hp_optim *o, int to_host, struct hp_err *e);
void hp_optim_release(struct hp_optim *o);

/*
 * Learning rate for optimizer step s (1-based): linear warmup from 0 to
 * lr_max over `warmup` steps (lr = lr_max * s / warmup), then constant,
 * linear or cosine decay from lr_max to lr_min reached at step `total`.
 */
double hp_lr_at(const struct hp_optim *o, long s);

/* Zero the store's gradient sums (a step begins). */
void hp_optim_zero_grad(struct hp_optim *o);
/* The squared L2 norm of the store's gradients (accumulated in double in
 * the runs' order, summed over the world) added to *acc: a double in the
 * backend's memory, where it stays (no wait for a device); its root is
 * clip_grad_norm_'s norm.  A rank whose backend failed still joins the
 * all-reduce. */
int hp_optim_grad_sumsq(struct hp_optim *o, double *acc, struct hp_err *e);
/* Scale the gradients as clip_grad_norm_ does with max_grad_norm; returns
 * the factor applied (1 if none). */
double hp_optim_clip(struct hp_optim *o, double norm);
/* The same without the host: from the world's squared norm *ss, the
 * step's loss and aux sums and the router's out-of-range count (the
 * backend's), the factor and the gate into cg[2] (the backend's floats,
 * hp_clip_gate), the gradients scaled. */
void hp_optim_clip_gate(struct hp_optim *o, float *cg, const double *ss, const double *loss, const double *aux,
			const int32_t *bad, int check);
/* One AdamW step with learning rate lr over the store, on its backend (a
 * model's working copy of its weights follows), none where cg (from
 * hp_optim_clip_gate; NULL: none) gates it off; increments o->step. */
void hp_optim_step(struct hp_optim *o, double lr, const float *cg);

#endif
