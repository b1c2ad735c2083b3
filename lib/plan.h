/*
 * plan.h - a config and a model spec resolved into a placement plan.
 *
 * hp_plan_resolve() is the only producer of plans: it checks the parallel
 * degrees against the world size and the model, lays out the meshes of
 * DESIGN.md §3 (identical to HyperParallel's), gives every parameter its
 * placement per mesh dim (§4), groups parameters into FSDP units and binds
 * every module to a kernel (plan_overrides).  It does not estimate memory
 * or traffic yet, and it does not copy the resolved config into the plan.
 *
 * Meshes.  Every mesh is a row-major reshape of the ranks 0..world-1 into
 * three axes, the last innermost:
 *   dense  (dp, cp, tp)                          rank = (dp*cp + c)*tp + t
 *   fsdp   (dp_replicate, dp_shard, [tp])        the flattened (dp, cp) index
 *          f = dp*cp + c split as f = rep*dp_shard + shard, per tp coordinate
 *   expert (edp_replicate, edp_shard, ep)        an EP group = ep consecutive ranks
 * The group of rank r along dim X is the ranks that differ from r only in
 * X, sorted; groups are listed by their smallest rank.
 *
 * The plan file, format "hp-plan/1": one JSON object, pretty-printed with a
 * two-space indent, keys always in this order (so that plans diff well):
 *   "format"      "hp-plan/1"
 *   "hash"        SHA-256 (64 lowercase hex digits) of the JSON text of this
 *                 same plan with "hash" set to "": the exact bytes
 *                 hp_plan_write_json writes, less the final newline
 *   "world_size"  int
 *   "model"       model_type, architecture, hidden_size, intermediate_size,
 *                 num_hidden_layers (after any crop), num_attention_heads,
 *                 num_key_value_heads, head_dim, vocab_size,
 *                 tie_word_embeddings, attention_bias, qk_norm; for MoE
 *                 models also num_experts, num_experts_per_tok,
 *                 moe_intermediate_size, decoder_sparse_step, moe_layers
 *                 (the indices of the sparse layers)
 *   "parallel"    tp, cp, ep, pp, dp, sequence_parallel, loss_parallel (bools),
 *                 dp_shard, dp_replicate, edp, edp_shard, edp_replicate
 *   "meshes"      {"dense", "fsdp", "expert"}, each {"dims": [names],
 *                 "sizes": [ints], "groups": {dim: [[ranks], ...]}}
 *   "fsdp_units"  [{"name", "mesh", "params": [names]}]: "model" (embedding,
 *                 final norm, lm_head) on "fsdp", then per layer
 *                 "model.layers.L" on "fsdp" and, for a MoE layer,
 *                 "model.layers.L.mlp.experts" on "expert"
 *   "params"      one per parameter in lib/model.c's order: {"name",
 *                 "shape" (global), "dtype" ("F32"), "mesh" ("dense" |
 *                 "expert"), "placements" {dim: "replicate" | "shard(D)" |
 *                 "partial"} over the dims of that mesh and of its FSDP
 *                 mesh, ["ep_owner": the ep rank holding this expert,]
 *                 "fsdp_unit"}
 *   "modules"     [{"name", "class" (HF class), "kernel", "override" (index
 *                 into plan_overrides of the entry that bound the kernel,
 *                 or null)}], in forward order
 *
 * Ownership: a struct hp_plan and everything it points to belong to the
 * plan (hp_plan_free).  Accessors return borrowed pointers.
 */
#ifndef HP_PLAN_H
#define HP_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "err.h"
#include "hfconfig.h"

#define HP_PLAN_FORMAT "hp-plan/1"

enum hp_mesh { HP_MESH_DENSE = 0, HP_MESH_FSDP, HP_MESH_EXPERT, HP_NMESH };

/* Every named mesh dim; each belongs to one mesh (hp_dim_mesh). */
enum hp_dim {
	HP_DIM_DP = 0, HP_DIM_CP, HP_DIM_TP,                  /* dense */
	HP_DIM_DP_REPLICATE, HP_DIM_DP_SHARD,                 /* fsdp */
	HP_DIM_EDP_REPLICATE, HP_DIM_EDP_SHARD, HP_DIM_EP,    /* expert */
	HP_NDIM
};

enum hp_placement_kind { HP_PL_NONE = 0, HP_PL_REPLICATE, HP_PL_SHARD, HP_PL_PARTIAL };

struct hp_placement {
	enum hp_placement_kind kind;   /* HP_PL_NONE: the dim does not apply */
	int dim;                       /* tensor dim for HP_PL_SHARD */
};

struct hp_plan_param {
	char *name;                    /* HF name, as lib/model.c */
	int ndim;
	int64_t shape[2];              /* global shape */
	enum hp_mesh mesh;             /* HP_MESH_DENSE or HP_MESH_EXPERT */
	struct hp_placement pl[HP_NDIM];
	int ep_owner;                  /* the ep rank that owns this expert; -1 */
	int unit;                      /* index into units */
};

struct hp_plan_unit {
	char *name;
	enum hp_mesh mesh;             /* HP_MESH_FSDP or HP_MESH_EXPERT */
};

struct hp_plan_module {
	char *name;                    /* "model.layers.3.self_attn" */
	char *cls;                     /* "Qwen3MoeAttention" */
	char *kernel;                  /* "reference.attention", "flash_attention" */
	int override;                  /* plan_overrides index, or -1 */
};

struct hp_plan {
	int world;
	struct hp_model_spec spec;     /* a copy, after any crop */
	long tp, cp, ep, pp, dp, dp_shard, dp_replicate, edp, edp_shard, edp_replicate;
	int sequence_parallel, loss_parallel;
	int size[HP_NDIM];             /* each dim's size */

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

/* The plan's hash (64 hex digits and a NUL), as in its JSON. */
int hp_plan_hash(const struct hp_plan *p, char out[65], struct hp_err *e);

void hp_plan_free(struct hp_plan *p);

/* "dp", "edp_shard", ...; "dense", "fsdp", "expert". */
const char *hp_dim_name(enum hp_dim d);
const char *hp_mesh_name(enum hp_mesh m);
enum hp_mesh hp_dim_mesh(enum hp_dim d);

/* Rank r's coordinate along d. */
int hp_plan_coord(const struct hp_plan *p, enum hp_dim d, int rank);
/* Fill ranks[0..size[d]-1] with rank r's group along d (sorted); returns its size. */
int hp_plan_group(const struct hp_plan *p, enum hp_dim d, int rank, int *ranks);

/* The parameter or module of that name, or NULL. */
const struct hp_plan_param *hp_plan_find_param(const struct hp_plan *p, const char *name);
const struct hp_plan_module *hp_plan_find_module(const struct hp_plan *p, const char *name);

/* "replicate", "shard(0)", "partial" into buf; returns buf. */
const char *hp_placement_str(struct hp_placement pl, char *buf, size_t n);

#endif
