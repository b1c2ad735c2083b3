/*
 * optim.h - what happens between backward and the next forward: gradient
 * norm and clipping, the learning-rate schedule, AdamW over a model.
 *
 * Semantics are torch's: clip_grad_norm_ (global L2 norm over all
 * parameters, scale by max_norm / (norm + 1e-6) when that is below 1) and
 * torch.optim.AdamW with decoupled weight decay, applied to the parameters
 * whose HF name contains none of no_decay_params (case-insensitive).
 */
#ifndef HP_OPTIM_H
#define HP_OPTIM_H

#include "config/config.h"
#include "model/model.h"

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
};

/* Set up moments (on m's backend) and decay flags for m from the
 * config's optimizer, lr_scheduler and training sections. */
int hp_optim_init(struct hp_optim *o, struct hp_model *m, const struct hp_config *c, struct hp_err *e);
/* Device backends: the moments to their host copies (to_host 1), or
 * back (0).  Nothing on the CPU. */
int hp_optim_move(struct hp_optim *o, size_t numel, int to_host, struct hp_err *e);
void hp_optim_release(struct hp_optim *o);
/* Free the model-sized moments: under FSDP they live with the shards
 * (lib/dist/fsdp.c) and hp_optim_step is not used. */
void hp_optim_drop_moments(struct hp_optim *o);

/*
 * Learning rate for optimizer step s (1-based): linear warmup from 0 to
 * lr_max over `warmup` steps (lr = lr_max * s / warmup), then constant,
 * linear or cosine decay from lr_max to lr_min reached at step `total`.
 */
double hp_lr_at(const struct hp_optim *o, long s);

/* Global L2 norm of the gradients (accumulated in double, in index
 * order); NaN when the backend failed. */
double hp_grad_norm(const struct hp_model *m);

/* Scale gradients as clip_grad_norm_ does; returns the factor applied (1 if none). */
double hp_clip_grads(struct hp_model *m, double norm, double max_norm);

/* One AdamW step with learning rate lr, on the model's backend (its
 * weights' working copy follows); increments o->step. */
void hp_optim_step(struct hp_optim *o, struct hp_model *m, double lr);

#endif
