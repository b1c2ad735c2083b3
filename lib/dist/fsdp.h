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
 *
 * Memory: the shard arrays (w, g, m1, m2), the pack buffer and the
 * prefetch ring live in the model's backend's memory (lib/backend/backend.h), and
 * every copy, sum and collective goes through it.  The parameters gather
 * in fsdp_config.mix_precision.param_dtype and the gradients
 * reduce-scatter and all-reduce over replicas in its reduce_dtype (bf16
 * or fp32; the shards and the moments stay fp32).  On a device the host
 * copies hw, hg, hm1, hm2 are what loading, checkpoints, dumps and
 * hp-verify read and write: hp_fsdp_download and hp_fsdp_upload move
 * them; on the CPU they are the shard arrays themselves.
 */
#ifndef HP_FSDP_H
#define HP_FSDP_H

#include "backend/backend.h"
#include "comm/comm.h"
#include "dist/optim.h"
#include "model/model.h"
#include "plan/plan.h"

struct hp_fsdp_unit {
	int shard_dim, rep_dim;      /* enum hp_dim */
	int root;                    /* the unit that stays gathered through the backward */
	int first, n;                /* its params: plan indices first .. first+n-1 in unit order */
	size_t off, padded;          /* its range in the shard arrays; padded elements */
	int held[2];                 /* its weights [0], gradients [1] in the model: committed */
};

/* An all-gather in flight (FSDP prefetch): its unit (-1: free), buffer
 * and, in a param dtype other than fp32, the converted shard it sends. */
struct hp_fsdp_slot {
	int unit;
	struct hp_breq req;
	void *buf, *send;
};

/* A reduce-scatter in flight: its unit (-1: none), request and buffer
 * (the k blocks it sends, then what it receives: hp_plan_fsdp_bytes). */
struct hp_fsdp_rs {
	int unit;
	struct hp_breq req;
	void *buf;
};
#define HP_FSDP_RS_RING 2

struct hp_fsdp {
	const struct hp_plan *p;
	struct hp_comms *cs;
	struct hp_model *m;
	struct hp_backend *bk;       /* the model's */
	enum hp_dtype pdt, rdt;      /* param_dtype and reduce_dtype: F32 or BF16 */
	int rank;
	int nunits;
	struct hp_fsdp_unit *units;
	int *order;                  /* plan param indices, grouped unit by unit */
	size_t *poff;                /* [nparams]: offset of each param's padded chunk */
	struct hp_param **mp;        /* [nparams]: the model's tensor, NULL for another rank's expert */
	struct hp_piece *pc;         /* [nparams]: this rank's piece (hp_plan_piece) */
	/* [nparams]: 1 for a weight only GEMMs read, on a device: gathered
	 * into the backend's working copy alone (hp_backend.copy_only), its
	 * fp32 copy in the model never held */
	unsigned char *conly;
	size_t total;                /* elements of every shard array */
	float *w, *g, *m1, *m2;      /* shards: weights, gradient sums, AdamW moments (backend) */
	float *hw, *hg, *hm1, *hm2;  /* their host copies (the same arrays on the CPU) */
	/* the reduce-scatter's packing, (shard_size + 1) * padded of the largest
	 * unit, and the root's all-gather (the root is gathered when no
	 * reduce-scatter is in flight: at a micro-batch's start) */
	void *buf;
	int *layer_unit, *expert_unit;   /* [n_layers]: each layer's units (-1: none) */
	struct hp_fsdp_slot *slots;  /* the prefetch ring, for the layers' units */
	int nslots;
	struct hp_fsdp_slot root_slot;   /* the root's gather, in buf */
	/* the buffers' bytes (hp_plan_fsdp_bytes): as the backend holds them,
	 * and as a GPU does (counted so) */
	struct hp_fsdp_bytes bytes, gpu_bytes;
	/* what the layers' units use of buf: the pages the root (embedding and
	 * head, often larger) touches beyond them go back to the system after
	 * it (bytes) */
	size_t steady_rs;
	/* the reduce-scatters: on a device a ring of two (rs[0] in buf, rs[1]
	 * its own buffer for a layer's units), so that unit i's runs on the
	 * communication stream while unit i-1's backward computes, finished
	 * (waited for, added to the shard sums) when its buffer comes round
	 * again or the micro-batch ends; on the CPU one, finished at once */
	struct hp_fsdp_rs rs[HP_FSDP_RS_RING];
	int nrs, rsi;
	long gathers, prefetched;    /* layer units gathered, and how many of them were started ahead */
	int stale_unit;              /* the fault fsdp_stale_shard: this unit is gathered from */
	float *stale;                /* its shard of the step before (backend) */
	int first_micro;             /* the micro-batch in flight is the step's first (micro_begin) */
	int sync;                    /* its backward reduces (hp_fsdp_set_sync) */
};

/* The shards of rank's pieces for the model m (this rank's tp-local
 * tensors and experts), zero until loaded, on m's backend.  The plan's
 * param_dtype and reduce_dtype other than float32 and bfloat16 are
 * HP_EUNSUP. */
int hp_fsdp_init(struct hp_fsdp *f, const struct hp_plan *p, struct hp_comms *cs, struct hp_model *m,
		 struct hp_err *e);
/* Load the shards from a source (an HF folder, hp-convert's shards, the
 * random init), reading only this rank's pieces, onto the backend. */
struct hp_src;
int hp_fsdp_load(struct hp_fsdp *f, struct hp_src *src, struct hp_err *e);
/* Device backends: the host copies to the shards (after a restore), and
 * the shards to their host copies (grads: the gradient sums too; moments:
 * the AdamW moments too).  Nothing on the CPU. */
int hp_fsdp_upload(struct hp_fsdp *f, struct hp_err *e);
int hp_fsdp_download(struct hp_fsdp *f, int grads, int moments, struct hp_err *e);
void hp_fsdp_free(struct hp_fsdp *f);

/* One unit (0 is the root: embedding, final norm, LM head): gather its
 * weights into the model; reduce-scatter its gradients into the shard sums
 * (and release them); release its gathered weights (grads 0) or gradients
 * (grads 1), giving their memory back until the next gather.  A unit's
 * weights and gradients in the model have memory behind them only from
 * its gather (weights) or its backward (gradients; the root's: its
 * micro-batch) to their release (backend.h, reserve; lib/model/model.h,
 * hp_model_par.sharded); releasing what is not held does nothing. */
int hp_fsdp_gather_unit(struct hp_fsdp *f, int u, struct hp_err *e);
int hp_fsdp_reduce_scatter_unit(struct hp_fsdp *f, int u, struct hp_err *e);
void hp_fsdp_release(struct hp_fsdp *f, int u, int grads);
/* A micro-batch's forward and backward begin: the root unit gathered
 * (for the step's first, and every one with reshard_after_backward), and
 * end: the layers' reduce-scatters in flight finished, and with root the
 * root unit's gradients reduce-scattered and, with
 * reshard_after_backward, its weights released (root 0: the backward of
 * a pipeline chunk without the embedding or the head, which neither
 * begins with the root unit nor adds to its gradients). */
int hp_fsdp_micro_begin(struct hp_fsdp *f, int first, struct hp_err *e);
int hp_fsdp_micro_end(struct hp_fsdp *f, int root, struct hp_err *e);
/* Whether the backward that follows reduce-scatters its gradients: with
 * fsdp_config.requires_grad_sync false only the step's last micro-batch's
 * does, the earlier ones adding into the unsharded gradients the model
 * holds (as HyperParallel's set_requires_gradient_sync(False)).  1 until
 * set. */
void hp_fsdp_set_sync(struct hp_fsdp *f, int last_micro);
/* The model's layer hook (lib/model/model.h): gathers a layer's units before its
 * forward and backward and releases them after, as hp-plan(5) says. */
int hp_fsdp_hook(void *ctx, int layer, int phase, struct hp_err *e);

/* A tied embedding over pipeline stages (the first stage's embedding,
 * the last's LM head): its shard's gradient sums all-reduced over pp, as
 * Megatron-LM sums the two copies' gradients, so that both take the same
 * update (once per step, after the replicas' and tp's sums).  The norm
 * counts the first stage's copy alone.  Nothing without one. */
int hp_fsdp_sync_tied(struct hp_fsdp *f, struct hp_err *e);
/* All-reduce the shard sums across replicas (HSDP; once per step). */
int hp_fsdp_sync_replicas(struct hp_fsdp *f, struct hp_err *e);
/* All-reduce over tp the gradients that are partial sums there
 * (hp_plan_tp_partial; once per step, after the replicas'). */
int hp_fsdp_sync_tp(struct hp_fsdp *f, struct hp_err *e);
/* Which of the shards' arrays a whole tensor is made of. */
enum hp_fsdp_which { HP_FSDP_WEIGHTS = 0, HP_FSDP_GRADS, HP_FSDP_EXP_AVG, HP_FSDP_EXP_AVG_SQ };
/* Plan param i's whole tensor (of the array which) on every rank, into dst
 * (its global numel, host): each piece from one holder, all-reduced over
 * the world.  For dumps; not part of a step's traffic.  Reads the host
 * copies (hp_fsdp_download first on a device). */
int hp_fsdp_global(struct hp_fsdp *f, int i, enum hp_fsdp_which which, float *dst, struct hp_err *e);
/* This rank's share of that sum: its piece of param i written into dst
 * (the whole tensor, zeroed by the caller) when it is the piece's holder. */
void hp_fsdp_piece_into(struct hp_fsdp *f, int i, enum hp_fsdp_which which, float *dst);
/* The shards as the optimizer's store (lib/dist/optim.h): their arrays,
 * the norm's runs (each distinct piece once over the world: replicas
 * count once) and AdamW's. */
int hp_fsdp_store(struct hp_fsdp *f, struct hp_store *s, struct hp_err *e);
/* Before each update: the fault fsdp_stale_shard keeps its unit's shard. */
void hp_fsdp_before_update(struct hp_fsdp *f);
#endif
