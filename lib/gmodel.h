/*
 * gmodel.h - the model's training step on one GPU (training.device: cuda).
 *
 * A struct hp_gmodel mirrors a host struct hp_model (lib/model.h) on the
 * device: the same flat parameter layout (offsets are the host's), held as
 * fp32 master weights, a bf16 working copy the GEMMs read, fp32 gradients
 * and fp32 AdamW moments; activations for one micro-batch of B x T tokens,
 * bf16 except the fp32 residual stream, norms' rstd, attention's
 * log-sum-exp, router probabilities and logits.  Everything is allocated
 * at hp_gmodel_init, in one arena: the step loop allocates nothing.
 *
 * The maths is lib/model.c's (HF's), op for op, with the kernels of
 * kernels/cuda/ops.h: flash attention always, the LM head and
 * cross-entropy chunk by chunk, the experts as grouped GEMMs over
 * expert-major rows with the SwiGLU output kept.  Routing decisions are
 * made on the device and grouped on the host (one small download per MoE
 * layer), as are the per-step loss sums, so every reduction has a fixed
 * order and two runs give the same bits.
 *
 * The host model lends its parameter table and spec and receives the
 * weights back (hp_gmodel_download) for checkpoints and exports; its own
 * activations may be sized for a single token.
 *
 * Without a CUDA build every function returns HP_EUNSUP.
 */
#ifndef HP_GMODEL_H
#define HP_GMODEL_H

#include "model.h"
#include "optim.h"

struct hp_gmodel;

/* Tokens per chunk of the LM head and cross-entropy when the config names
 * none (training.loss_fn.chunk_size). */
#define HP_GMODEL_CE_CHUNK 1024

/* Upload m's weights (and o's moments when o holds them) to device dev and
 * size activations for B x T tokens; ce_chunk tokens per chunk of the LM
 * head (0: HP_GMODEL_CE_CHUNK). */
int hp_gmodel_init(struct hp_gmodel **gp, struct hp_model *m, const struct hp_optim *o, int dev,
		   int B, int T, long ce_chunk, struct hp_err *e);
void hp_gmodel_free(struct hp_gmodel *g);

void hp_gmodel_zero_grad(struct hp_gmodel *g);
/* Forward and backward of one micro-batch (ids, targets, seg as
 * hp_model_forward; ids and targets already checked against the
 * vocabulary): gradients of sum(CE) * ce_scale + aux_weight *
 * router_aux_loss_coef * aux are added to the gradient buffer.  Returns the
 * cross-entropy sum, the count of targets and the aux loss (unscaled). */
int hp_gmodel_micro(struct hp_gmodel *g, const int32_t *ids, const int32_t *targets, const int32_t *seg,
		    double ce_scale, double aux_weight, double *loss_sum, long *count, double *aux,
		    struct hp_err *e);
/* Global gradient norm (fp64 sum of squares on the device). */
int hp_gmodel_grad_norm(struct hp_gmodel *g, double *norm, struct hp_err *e);
/* Clip as hp_clip_grads, then one AdamW step with o's hyper-parameters
 * (o->step already advanced, o->hp.lr set) on every parameter. */
int hp_gmodel_step(struct hp_gmodel *g, const struct hp_optim *o, double norm, struct hp_err *e);
/* Copy the master weights (and the moments into o when it has them) back
 * to the host model; grads too when with_grads. */
int hp_gmodel_download(struct hp_gmodel *g, struct hp_model *m, struct hp_optim *o, int with_grads,
		       struct hp_err *e);
/* Bytes of device memory this model holds (one arena). */
size_t hp_gmodel_bytes(const struct hp_gmodel *g);
/* The bytes hp_gmodel_init would take on the device for spec at B x T
 * (without the kernels' own few MiB of scratch and workspace); 0 without
 * CUDA. */
size_t hp_gmodel_bytes_for(const struct hp_model_spec *s, int B, int T, long ce_chunk);
/* Tokens per chunk of the LM head and cross-entropy, as run. */
long hp_gmodel_ce_chunk(const struct hp_gmodel *g);

#endif
