/*
 * ckpt.h - training checkpoints: save, find, verify, restore (DESIGN.md §5).
 *
 * A checkpoint is a folder CHECKPOINT_DIR/global_step_N holding
 *   model/       the weights: an hp-convert shard folder (plan.json and one
 *                rank-RRRRR-of-WWWWW.safetensors per rank, hp-shard/1), so
 *                that hp-convert --export and --shards read it as it is
 *   exp_avg/     AdamW's first moments, the same layout   (save_optimizer)
 *   exp_avg_sq/  its second moments                       (save_optimizer)
 *   hf/          the weights as an HF folder               (save_consolidated)
 *   train_state.json  step, data cursor, seed
 *   checkpoint.json   written last: "format": "hp-checkpoint/1", the step,
 *                the plan's hash and world size, and every file with its
 *                size in bytes and the CRC-32C of its content
 * and CHECKPOINT_DIR/latest_checkpoint_iteration.txt holds the step of the
 * newest complete one.
 *
 * Saving is all or nothing: every rank writes its files into
 * global_step_N.tmp.PID (each fsynced), rank 0 writes the metadata last,
 * renames the folder into place and then rewrites the LATEST file through a
 * temporary and a rename, fsyncing the parent each time.  A job that dies
 * part-way leaves the previous checkpoint and LATEST as they were, and a
 * stray .tmp folder that the next save removes.  keep_last > 0 then removes
 * the oldest complete checkpoints beyond that many.
 *
 * Restoring reads checkpoint.json, checks every file it lists (present and
 * of its size: each rank a share) and that the shard folders are of the
 * plan it names, verifies the shard files it reads (hp-shard/1: metadata
 * and every tensor's CRC-32C), then each rank reads only the overlap of its
 * pieces with the stored ones (lib/shard.c), so a checkpoint restores into
 * any layout of the same model.  The whole-file CRC-32Cs of
 * checkpoint.json are for tools that check a checkpoint without loading it.
 *
 * Errors: HP_EFORMAT naming the file for a damaged or foreign checkpoint,
 * HP_EIO for missing files or failed writes; every rank agrees on the
 * outcome before anything is used or renamed.
 */
#ifndef HP_CKPT_H
#define HP_CKPT_H

#include <mpi.h>
#include <stdint.h>

#include "err.h"
#include "plan.h"

#define HP_CKPT_FORMAT "hp-checkpoint/1"
#define HP_CKPT_LATEST "latest_checkpoint_iteration.txt"

enum { HP_CKPT_WEIGHTS = 0, HP_CKPT_EXP_AVG, HP_CKPT_EXP_AVG_SQ, HP_CKPT_NKIND };

/* What resumes the run besides the tensors. */
struct hp_ckpt_state {
	long step;                   /* optimizer steps taken */
	int online;                  /* data cursor of the online loader, else of the indexed one */
	uint64_t pos, epoch, doc, off;
	uint64_t seed;
};

/* Where this rank's piece of plan param i of one kind lives (its rows x
 * cols floats, row-major), or NULL when the rank holds none of it. */
typedef float *(*hp_ckpt_piece_fn)(void *ctx, int kind, int i);

struct hp_ckpt_save_opts {
	const char *root;            /* checkpoint_dir */
	int optimizer;               /* save the moments */
	int consolidated;            /* also an HF folder */
	long keep_last;              /* 0: keep all */
	enum hp_dtype hf_dtype;      /* the HF folder's dtype */
};

/* Save step st->step of plan p; every rank of comm calls it. */
int hp_ckpt_save(const struct hp_ckpt_save_opts *o, const struct hp_plan *p, MPI_Comm comm,
		 hp_ckpt_piece_fn piece, void *ctx, const struct hp_ckpt_state *st, struct hp_err *e);

/* The checkpoint folder restore_from names: "LATEST" (the newest complete
 * one under root), a global_step_N folder, or a checkpoint_dir.  Returns
 * HP_CKPT_NONE_YET (positive, not an error) for LATEST when root holds no
 * checkpoint yet: a job's first start. */
#define HP_CKPT_NONE_YET 1
int hp_ckpt_find(const char *root, const char *restore_from, char *dir, size_t n, struct hp_err *e);

/* Restore plan p's pieces (weights, and the moments when the checkpoint
 * has them and moments is set) and the state from dir; every rank calls. */
int hp_ckpt_restore(const char *dir, const struct hp_plan *p, MPI_Comm comm, int moments,
		    hp_ckpt_piece_fn piece, void *ctx, struct hp_ckpt_state *st, struct hp_err *e);

#endif
