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
 * pieces with the stored ones (lib/dist/shard.c), so a checkpoint restores into
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

#include "base/err.h"
#include "plan/plan.h"

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
	int finite;                  /* refuse non-finite values (HP_ENUM): debug.check_nan_inf */
};

/*
 * checkpoint_dir belongs to one run at a time: rank 0 of a run that saves
 * there makes the folder and holds an flock(2) on CHECKPOINT_DIR/hp.lock
 * (its content: "HOST PID") from before its first step to its end, so a
 * second run is refused before it trains, naming the holder, instead of
 * deleting the first one's temporaries and flipping LATEST between them.
 * The kernel drops the lock of a process that dies however it dies; a lock
 * file that still names a holder then was left by a run that ended without
 * unlocking: it is taken over, and *note says so (else note is "").
 * Works on local file systems and on NFS (Linux maps flock to its locks).
 */
struct hp_ckpt_lock {
	int fd;                      /* valid while held */
	int held;
	int slot;                    /* fileio.h: the note is emptied if the process is stopped */
};
/* 0; HP_EIO when the folder cannot be made or written (the run would fail
 * at its first save), HP_ECONFIG when another run holds it. */
int hp_ckpt_lock(struct hp_ckpt_lock *l, const char *root, char *note, size_t n, struct hp_err *e);
/* Let go (the file stays, empty); safe on a lock not held. */
void hp_ckpt_unlock(struct hp_ckpt_lock *l);

/* Save step st->step of plan p; every rank of comm calls it. */
int hp_ckpt_save(const struct hp_ckpt_save_opts *o, const struct hp_plan *p, MPI_Comm comm,
		 hp_ckpt_piece_fn piece, void *ctx, const struct hp_ckpt_state *st, struct hp_err *e);

/* The checkpoint folder restore_from names: "LATEST" (the newest complete
 * one under root), a global_step_N folder, or a checkpoint_dir.  Returns
 * HP_CKPT_NONE_YET (positive, not an error) for LATEST when root holds no
 * checkpoint yet: a job's first start. */
#define HP_CKPT_NONE_YET 1
int hp_ckpt_find(const char *root, const char *restore_from, char *dir, size_t n, struct hp_err *e);

/*
 * The metadata files, parsed and checked for shape (also the fuzzers'
 * entry points): checkpoint.json's step, world size, plan hash, optimizer
 * flag and file list (each path relative and inside the checkpoint, its
 * bytes and CRC-32C); train_state.json's step, seed and data cursor.
 * name is what messages call the text.  0 or HP_EFORMAT; a parsed meta is
 * released with hp_ckpt_meta_release.
 */
struct hp_ckpt_meta {
	long step, world;
	int optimizer;
	char plan[65];
	struct json_t *files;        /* borrowed from json */
	struct json_t *json;         /* owned */
};
int hp_ckpt_meta_parse(const char *name, const char *text, size_t len, struct hp_ckpt_meta *m,
		       struct hp_err *e);
void hp_ckpt_meta_release(struct hp_ckpt_meta *m);
int hp_ckpt_state_parse(const char *name, const char *text, size_t len, struct hp_ckpt_state *st,
			struct hp_err *e);

/* Restore plan p's pieces (weights, and the moments when the checkpoint
 * has them and moments is set) and the state from dir; every rank calls. */
int hp_ckpt_restore(const char *dir, const struct hp_plan *p, MPI_Comm comm, int moments,
		    hp_ckpt_piece_fn piece, void *ctx, struct hp_ckpt_state *st, struct hp_err *e);

#endif
