/*
 * shard.h - per-rank shard files of a plan, the sources they are made
 * from, and the HF folder they export to (DESIGN.md §5).
 *
 * A shard directory holds plan.json (the plan, as hp-plan writes it) and
 * one safetensors file per rank, rank-RRRRR-of-WWWWW.safetensors, holding
 * under Hugging Face names the rank's piece of every parameter it owns
 * (hp_plan_piece: tp cuts, then FSDP's chunk of dim 0), F32, an empty
 * piece included.  The file's __metadata__:
 *   "format"              "pt" (as HF writes; tools that list it stay happy)
 *   "hp_format"           "hp-shard/1"
 *   "hp_plan"             the plan's hash
 *   "hp_rank", "hp_world" decimal
 *   "hp_global.NAME"      the global shape, "R,C" (or "R")
 *   "hp_offset.NAME"      where the piece starts in it, "r0,c0" (or "r0")
 *   "hp_crc32c.NAME"      CRC-32C of the piece's bytes, 8 lowercase hex digits
 * A reader checks all of it (hp_shard_verify) before using a byte.
 *
 * Sources give any block of any parameter's global tensor as F32, read
 * with pread in bounded pieces so that memory does not grow with the model:
 * an HF folder (single file or index; F32, BF16, F16; per-expert or
 * stacked experts), another plan's shard directory (resharding), or the
 * random init of lib/model/init.h (from_config plans), which is a pure function
 * of (seed, name, index) and so the same whatever the layout.
 */
#ifndef HP_SHARD_H
#define HP_SHARD_H

#include "base/err.h"
#include "base/progress.h"
#include "format/safetensors.h"
#include "plan/plan.h"

#define HP_SHARD_FORMAT "hp-shard/1"

/* "rank-00003-of-00008.safetensors" */
void hp_shard_name(char *buf, size_t n, int rank, int world);

enum hp_src_kind { HP_SRC_HF = 1, HP_SRC_SHARDS, HP_SRC_INIT, HP_SRC_FN };

/* A source that is a function (HP_SRC_FN): fill dst with rows [r0, r0+nr)
 * x cols [c0, c0+nc) of plan param i, as hp_src_read. */
typedef int (*hp_src_fn)(void *ctx, int i, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *dst,
			 struct hp_err *e);

struct hp_src_view;

struct hp_src {
	enum hp_src_kind kind;
	const struct hp_plan *plan;      /* names and shapes asked for (borrowed) */
	char *dir;
	/* HF: the folder, and for each plan parameter where its rows are */
	struct hp_st_model st;
	struct hp_src_view *views;       /* [plan->nparams] */
	/* SHARDS: the old plan and its rank files */
	struct hp_plan *old;
	struct hp_st_file *files;        /* [old->world] */
	/* INIT */
	uint64_t seed;
	/* FN */
	hp_src_fn fn;
	void *fn_ctx;
	/* scratch for conversions */
	void *buf;
	size_t cap;
};

/*
 * Open a source for plan p.  hp_src_open_hf checks that DIR/config.json is
 * the plan's model (else HP_ECONFIG naming the first differing key), that
 * every tensor p needs is there with its shape (HP_EFORMAT naming it) and
 * that nothing else is (a tied lm_head equal in shape and rotary buffers
 * aside).  hp_src_open_shards reads DIR/plan.json, requires the same model,
 * and verifies every rank file (hp_shard_verify) before anything is read.
 * hp_src_open_init draws from_config's random init with the plan's
 * training.seed.
 */
int hp_src_open_hf(struct hp_src *s, const struct hp_plan *p, const char *dir, struct hp_err *e);
int hp_src_open_shards(struct hp_src *s, const struct hp_plan *p, const char *dir,
		       struct hp_progress *pg, struct hp_err *e);
/* The same verifying only the rank files proc, proc + nproc, ... (the
 * caller's processes split the work and agree on the outcome). */
int hp_src_open_shards_part(struct hp_src *s, const struct hp_plan *p, const char *dir, int proc,
			    int nproc, struct hp_progress *pg, struct hp_err *e);
int hp_src_open_init(struct hp_src *s, const struct hp_plan *p, struct hp_err *e);
/* A process's own tensors (a checkpoint being saved): requests go to fn. */
void hp_src_open_fn(struct hp_src *s, const struct hp_plan *p, hp_src_fn fn, void *ctx);
void hp_src_close(struct hp_src *s);

/* Rows [r0, r0+nr) x cols [c0, c0+nc) of plan parameter i, as F32 into dst
 * (nr * nc floats, row-major). */
int hp_src_read(struct hp_src *s, int i, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
		float *dst, struct hp_err *e);

/* Bytes rank's shard holds (its tensors' data). */
uint64_t hp_shard_bytes(const struct hp_plan *p, int rank);

/* Write rank's shard of p into dir (atomically: a temporary, then rename). */
int hp_shard_write(const struct hp_plan *p, int rank, struct hp_src *src, const char *dir,
		   struct hp_progress *pg, struct hp_err *e);

/*
 * Check an open shard file against plan p for rank: the metadata, the
 * tensors (exactly those p gives the rank, with their piece shapes) and
 * every checksum.  HP_EFORMAT naming the file and the tensor on a mismatch.
 */
int hp_shard_verify(const struct hp_plan *p, const char *hash, int rank, const struct hp_st_file *f,
		    struct hp_progress *pg, struct hp_err *e);

/*
 * Export src (all of plan p's parameters, under HF names, experts one by
 * one) to an HF folder dir: config.json (torch_dtype set to dtype),
 * model.safetensors, or with max_shard > 0 and more than that many bytes,
 * model-0000N-of-0000M.safetensors files and model.safetensors.index.json
 * (metadata.total_size, weight_map).  Process proc of nproc writes the files
 * whose index is proc modulo nproc; process 0 also the config and index.
 * finite: a NaN or infinity in a tensor is refused (HP_EFORMAT, naming it)
 * rather than exported.
 */
int hp_export_hf(const struct hp_plan *p, struct hp_src *src, const char *dir, enum hp_dtype dtype,
		 uint64_t max_shard, int finite, int proc, int nproc, struct hp_progress *pg, struct hp_err *e);
/* Bytes proc would write (for the progress line). */
uint64_t hp_export_bytes(const struct hp_plan *p, enum hp_dtype dtype, uint64_t max_shard, int proc,
			 int nproc);

#endif
