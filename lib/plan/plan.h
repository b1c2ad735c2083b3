/*
 * plan.h - a config and a model spec resolved into a placement plan.
 *
 * hp_plan_resolve() is the only producer of plans: it checks the parallel
 * degrees against the world size and the model, lays out the meshes of
 * DESIGN.md §3 (identical to HyperParallel's), gives every parameter its
 * placement per mesh dim (§4), groups parameters into FSDP units and binds
 * every module to a kernel (plan_overrides); planest.c estimates what each
 * rank holds and sends per step, by the rules of hp-plan(5), ESTIMATES.
 *
 * Meshes: comm/mesh.h (the plan's `size` is its layout).
 *
 * The plan file, format "hp-plan/1": one JSON object, pretty-printed with a
 * two-space indent, keys always in this order (so that plans diff well):
 *   "format"      "hp-plan/1"
 *   "hash"        SHA-256 (64 lowercase hex digits) of the JSON text of this
 *                 same plan with "hash" set to "": the exact bytes
 *                 hp_plan_write_json writes, less the final newline
 *   "world_size"  int
 *   "model"       the spec as a config.json (hp_model_spec_json)
 *   "config"      the resolved config (hp_config_json)
 *   "parallel"    tp, cp, ep, pp, dp, sequence_parallel, loss_parallel (bools),
 *                 dp_shard, dp_replicate, edp, edp_shard, edp_replicate
 *   "meshes"      {"dense", "fsdp", "expert"}, each {"dims": [names],
 *                 "sizes": [ints], "groups": {dim: [[ranks], ...]}}
 *   "fsdp_units"  [{"name", "mesh", "params": [names]}]: "model" (embedding,
 *                 final norm, lm_head) on "fsdp", then per layer
 *                 "model.layers.L" on "fsdp" and, for a MoE layer,
 *                 "model.layers.L.mlp.experts" on "expert"
 *   "params"      one per parameter in lib/model/model.c's order: {"name",
 *                 "shape" (global), "dtype" ("F32"), "mesh" ("dense" |
 *                 "expert"), "placements" {dim: "replicate" | "shard(D)" |
 *                 "partial"} over the dims of that mesh and of its FSDP
 *                 mesh, ["ep_owner": the ep rank holding this expert,]
 *                 "fsdp_unit"}
 *   "modules"     [{"name", "class" (HF class), "kernel", "override" (index
 *                 into plan_overrides of the entry that bound the kernel,
 *                 or null)}], in forward order
 *   "estimates"   {"step": {...}, "per_rank": [{"ranks", "param_bytes",
 *                 "grad_bytes", "optimizer_bytes", "activation_bytes",
 *                 "gathered_bytes", "comm": [{"dim", "op", "calls", "bytes"
 *                 [, "routed_bytes"]}]}]}, ranks with equal figures merged
 * Reals are written with the fewest digits (15 to 17) that give every one
 * of them back exactly.
 *
 * Ownership: a struct hp_plan and everything it points to belong to the
 * plan (hp_plan_free).  Accessors return borrowed pointers.
 */
#ifndef HP_PLAN_H
#define HP_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "base/err.h"
#include "comm/mesh.h"
#include "config/config.h"
#include "config/hfconfig.h"
#include "model/model.h"

#define HP_PLAN_FORMAT "hp-plan/1"

enum hp_placement_kind { HP_PL_NONE = 0, HP_PL_REPLICATE, HP_PL_SHARD, HP_PL_PARTIAL };

struct hp_placement {
	enum hp_placement_kind kind;   /* HP_PL_NONE: the dim does not apply */
	int dim;                       /* tensor dim for HP_PL_SHARD */
};

struct hp_plan_param {
	char *name;                    /* HF name, as lib/model/model.c */
	int ndim;
	int64_t shape[2];              /* global shape */
	enum hp_mesh mesh;             /* HP_MESH_DENSE or HP_MESH_EXPERT */
	struct hp_placement pl[HP_NDIM];
	int ep_owner;                  /* the ep rank that owns this expert; -1 */
	int unit;                      /* index into units */
	int stage;                     /* the pipeline stage that holds it (0 without one) */
	int stage2;                    /* a second stage that holds a copy: the last, for a tied
					  embedding (its LM head); -1 none */
};

struct hp_plan_unit {
	char *name;
	enum hp_mesh mesh;             /* HP_MESH_FSDP or HP_MESH_EXPERT */
};

/* The modules whose kernel the model chooses per layer (struct hp_model_kernels) */
enum hp_plan_slot {
	HP_SLOT_OTHER = 0,
	HP_SLOT_ATTN,                  /* model.layers.L.self_attn */
	HP_SLOT_NORM_IN,               /* model.layers.L.input_layernorm */
	HP_SLOT_NORM_POST,             /* model.layers.L.post_attention_layernorm */
	HP_SLOT_EXPERTS,               /* model.layers.L.mlp.experts */
	HP_SLOT_NORM_FINAL,            /* model.norm */
	HP_SLOT_LM_HEAD,               /* lm_head */
};

struct hp_kernel;
struct hp_plan_module {
	char *name;                    /* "model.layers.3.self_attn" */
	char *cls;                     /* "Qwen3MoeAttention" */
	char *kernel;                  /* "reference.attention", "flash_attention" */
	int override;                  /* plan_overrides index, or -1 */
	int layer;                     /* its decoder layer, or -1 */
	enum hp_plan_slot slot;
	const struct hp_kernel *impl;  /* the registry row bound (lib/backend/kernels.h);
					  NULL: the op's reference */
};

enum hp_cp_mode { HP_CP_ALLGATHER = 0, HP_CP_ULYSSES };

struct hp_plan {
	int world;
	struct hp_model_spec spec;     /* a copy, after any crop */
	long tp, cp, ep, pp, dp, dp_shard, dp_replicate, edp, edp_shard, edp_replicate;
	int sequence_parallel, loss_parallel;
	int size[HP_NDIM];             /* each dim's size: the layout (comm/mesh.h) */
	/* pipeline: the schedule, its chunks per stage (vpp; virtual stage
	 * v = c pp + s is stage s's chunk c), and virtual stage v's decoder
	 * layers [stage_l0[v], stage_l0[v + 1]) */
	enum hp_pp_schedule pp_schedule;
	int vpp;
	int stage_l0[HP_MAX_LAYERS + 1];

	/* what the estimates need from the config */
	long micro, seq, accum;        /* micro-batch rows, tokens per row (0: unknown),
					  micro-batches per step on each rank */
	enum hp_device device;         /* training.device: cuda and auto have device estimates */
	int reshard_after_forward, reshard_after_backward;
	int grad_sync;                 /* fsdp_config.requires_grad_sync: reduce every micro-batch (1)
					  or after the step's last (0) */
	long forward_prefetch, backward_prefetch;
	char param_dtype[16], reduce_dtype[16];   /* mix_precision; "" = float32 */
	enum hp_act_ckpt act_ckpt;
	unsigned char ckpt_layer[HP_MAX_LAYERS];   /* 1: act_ckpt applies to layer l (selection) */
	enum hp_cp_mode cp_mode;       /* from the kernel bound to attention */
	double max_grad_norm;
	long ce_chunk;                 /* lm_head bound to chunked_ce: tokens per chunk */
	int64_t act_bytes;             /* hp_plan_act_bytes, measured once by hp_plan_resolve
					  (the largest over the pipeline's stages) */
	struct json_t *config;         /* the resolved config (hp_config_json) */

	struct hp_plan_param *params;
	int nparams;
	struct hp_plan_unit *units;
	int nunits;
	struct hp_plan_module *modules;
	int nmodules;
	char **warnings;               /* one line each, for the tool to print */
	int nwarnings;
};

/*
 * Resolve c (its accelerator, fsdp_config, plan_overrides and
 * dataset.seq_length) for the model s on world ranks.  The checks named in
 * hp-plan(1) fail with HP_ECONFIG and a one-line message naming the key
 * path.  *p is NULL on failure.
 */
int hp_plan_resolve(struct hp_plan **p, const struct hp_config *c, const struct hp_model_spec *s,
		    int world, struct hp_err *e);

/* Write the plan as "hp-plan/1" JSON plus a newline to f (HP_EIO, HP_ENOMEM). */
int hp_plan_write_json(const struct hp_plan *p, FILE *f, struct hp_err *e);
/* The same into the file path: a temporary beside it, fsynced, renamed, so
 * that a reader never sees half a plan and a failure leaves nothing. */
int hp_plan_save(const struct hp_plan *p, const char *path, struct hp_err *e);

/*
 * Read a plan file: the format and the hash must hold, and the plan is made
 * again from the config and model it carries (so every tool works from what
 * hp_plan_resolve makes, and a plan from another hp version is refused
 * rather than misread).  HP_EFORMAT for a file that is not a plan or fails
 * those checks, HP_EIO when it cannot be read.  When cfg is not NULL it
 * receives the plan's config (hp_config_release it).
 */
int hp_plan_load(struct hp_plan **p, struct hp_config *cfg, const char *path, struct hp_err *e);
/* The same from len bytes of text (stdin, a broadcast); name for messages. */
int hp_plan_load_text(struct hp_plan **p, struct hp_config *cfg, const char *name, const char *text,
		      size_t len, struct hp_err *e);

/* The plan's hash (64 hex digits and a NUL), as in its JSON. */
int hp_plan_hash(const struct hp_plan *p, char out[65], struct hp_err *e);

void hp_plan_free(struct hp_plan *p);

/* The parameter or module of that name, or NULL. */
const struct hp_plan_param *hp_plan_find_param(const struct hp_plan *p, const char *name);
const struct hp_plan_module *hp_plan_find_module(const struct hp_plan *p, const char *name);

/*
 * A rank's piece of a parameter.  Tensor parallelism cuts dim 0 or 1 of the
 * global tensor evenly; FSDP then cuts dim 0 of that as torch.chunk does:
 * chunks of ceil(rows / k) rows, the last ones short or empty, and the
 * collectives move whole chunks (padded).
 */
struct hp_piece {
	int64_t rows, cols;     /* the tp-local tensor (cols 1 for a vector) */
	int64_t row0, col0;     /* where this rank's rows start in the global tensor */
	int64_t chunk;          /* FSDP chunk rows (the padded piece) */
	int64_t first, nrows;   /* this rank's rows of the tp-local tensor */
};
void hp_plan_piece(const struct hp_plan *p, const struct hp_plan_param *q, int rank,
		   struct hp_piece *pc);
/* Whether q's gradient on a rank is a partial sum over tp, all-reduced
 * once per step: a tp-replicated weight that sees only the rank's heads
 * (q_norm, k_norm) or, with sequence parallelism, only its tokens. */
int hp_plan_tp_partial(const struct hp_plan *p, const struct hp_plan_param *q);
/* The decoder layer unit u belongs to (the layer's own unit, or its
 * experts', mesh HP_MESH_EXPERT); -1 for the root (embedding, final norm,
 * LM head). */
int hp_plan_unit_layer(const struct hp_plan *p, int u);
/*
 * The bytes of FSDP's buffers on rank (lib/dist/fsdp.c allocates them,
 * hp-plan's device estimate counts them), for elements of ep bytes in
 * param_dtype and er in reduce_dtype (a GPU's sizes, or a backend's own
 * where it holds bf16 wider: the emulation):
 *   buf   the root unit's all-gather (k + 1 blocks of its shard, the last
 *         the shard to send), and any unit's reduce-scatter: k blocks sent
 *         and, for an fp32 sum, one received; for a bf16 sum the k blocks
 *         received, summed where they land (backend.h, reduce_scatter);
 *         the bf16 all-reduces over replicas and tp (2 k ceil(n / k)
 *         elements) and the tp partial gradients' packing;
 *   rs1   with ring, the reduce-scatter ring's second buffer, for the
 *         largest layer unit;
 *   slot  a prefetch slot: the k blocks of the largest layer unit;
 *   send  its shard converted to param_dtype (0 when that is fp32).
 */
struct hp_fsdp_bytes { size_t buf, rs1, slot, send; };
/* 0, or -1 out of memory */
int hp_plan_fsdp_bytes(const struct hp_plan *p, int rank, size_t ep, size_t er, int ring,
			struct hp_fsdp_bytes *b);
/* Whether rank holds any of q (an expert lives on one ep rank, a layer on
 * one pipeline stage). */
int hp_plan_owns(const struct hp_plan *p, const struct hp_plan_param *q, int rank);
/* Rank's pipeline stage, and the model's part of the layout there: tp,
 * cp, ep, the stage and its layers, and the micro-batches whose
 * activations the schedule keeps at once (no communicators). */
int hp_plan_stage(const struct hp_plan *p, int rank);
/* The stage that holds decoder layer l (its virtual stage's, mod pp). */
int hp_plan_layer_stage(const struct hp_plan *p, int l);
void hp_plan_model_par(const struct hp_plan *p, int rank, struct hp_model_par *par);

struct hp_comm_est {
	int64_t calls, bytes;       /* per step: calls, and bytes of the send buffers */
	int64_t routed;             /* the part of bytes that depends on the routing,
				       given for even routing */
};

/* What one rank holds and sends per step (hp-plan(5), ESTIMATES). */
struct hp_rank_est {
	int size[HP_NDIM];
	int64_t param_bytes, grad_bytes, optim_bytes;   /* F32 master weights, AdamW m and v */
	int64_t act_bytes;          /* saved activations and scratch of one micro-batch */
	int64_t gathered_bytes;     /* FSDP's unsharded buffers at their peak */
	int64_t host_overhead_bytes;   /* HP_HOST_OVERHEAD_BYTES */
	int64_t host_bytes;         /* the process's resident memory on the CPU: all of the above */
	int64_t device_bytes;       /* training.device cuda (or auto): the high-water mark of what the
				       CUDA backend allocates (hp-plan(5), ESTIMATES); 0 on the CPU */
	struct hp_comm_est comm[HP_NDIM + 1][HP_NCOLL];
};
int hp_plan_estimate(const struct hp_plan *p, int rank, struct hp_rank_est *r);

/*
 * What a CPU rank holds resident beyond its plan's buffers, whatever the
 * model: code and shared libraries (cuBLASLt is opened only by a CUDA run),
 * MPI's shared-memory queues, the kernels' per-thread scratch, the data
 * reader's pages, the C library's heap.  A 2-layer toy model's whole
 * process peaks near 25 MiB (bench/mem-bench.sh, smoke); the plan states a
 * round bound, and a run's peak resident set must stay within 1.25 x the
 * plan's buffers + this (hp-train(1), Memory).
 */
#define HP_HOST_OVERHEAD_BYTES ((int64_t)256 << 20)
int64_t hp_plan_act_bytes(const struct hp_plan *p);
/* The same for rank's stage (every stage's are the same without a pipeline). */
int64_t hp_plan_rank_act_bytes(const struct hp_plan *p, int rank);

/* The kernels the plan binds, as the CPU model takes them (lib/model/model.h). */
struct hp_model_kernels;
void hp_plan_model_kernels(const struct hp_plan *p, struct hp_model_kernels *k);

/* "replicate", "shard(0)", "partial" into buf; returns buf. */
const char *hp_placement_str(struct hp_placement pl, char *buf, size_t n);

#endif
