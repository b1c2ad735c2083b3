/*
 * batch.h - the offline batch source for training: fixed-length rows of
 * (inputs, labels) cut from a Megatron indexed dataset (indexed.h), in file
 * order, wrapping around at the end of the data.
 *
 * It is deliberately not Megatron's GPTDataset: no blending of several
 * datasets, no sample index cached on disk (shuffling and document masks:
 * below).  Two
 * ways of cutting rows, chosen by is_dataset_from_mr (T = seq_length):
 *
 *   from_mr = 1   every sequence ("record") holds exactly T+1 tokens, made
 *                 by an offline packer; row r is record r: inputs =
 *                 rec[0..T), labels = rec[1..T].  Records of any other
 *                 length are rejected at open.
 *   from_mr = 0   sequences of any length are concatenated in file order,
 *                 ignoring document boundaries, into one token stream of N
 *                 tokens; row r is the window stream[r*T .. r*T+T], again
 *                 inputs = w[0..T), labels = w[1..T].  Consecutive windows
 *                 share one token (the last label of a row is the first
 *                 input of the next), as in Megatron's GPTDataset and
 *                 llm.c, so every token but the first is a label exactly
 *                 once per epoch.  An epoch has (N-1)/T rows (rounded
 *                 down); the tail that does not fill a window is skipped.
 *
 * The cursor is (pos, epoch): pos is the row served next, in [0,
 * rows_per_epoch), epoch the number of completed passes.  Serving the last
 * row of an epoch moves the cursor to (0, epoch+1) at once.  Saving the
 * cursor in a checkpoint and seeking to it gives the same rows as an
 * uninterrupted run.
 *
 * Splits (data_config.split, Megatron's semantics): the documents (doc_idx)
 * are cut into three contiguous ranges, train, validation and test, by
 * hp_split_bounds; a batcher opened on a part serves only the rows of its
 * range (its records, or the windows of its tokens), with its own epochs.
 *
 * Documents inside a row (hp_batcher_set_docs, Megatron's
 * get_ltor_masks_and_position_ids): an EOD id among a row's inputs ends a
 * document, the next begins after it.  eod_mask_loss: no loss where the
 * input is the EOD (the prediction across the boundary); reset (both of
 * reset_position_ids and reset_attention_mask): seg[] restarts at each
 * document, so that positions count from its start and attention stays in
 * it, the block-diagonal mask of the online mode.
 *
 * Shuffle (hp_batcher_set_shuffle): the rows of each epoch in a
 * permutation drawn from (seed, epoch) by hp_order, the online mode's
 * generator; the cursor stays (pos, epoch), so a seek gives the same rows.
 *
 * Ownership: hp_batcher_open makes a heap object, hp_batcher_free releases
 * it (NULL accepted).  Caller buffers are borrowed for the call only.
 * hp_batcher_next does not allocate.
 */
#ifndef HP_BATCH_H
#define HP_BATCH_H

#include <stdint.h>

#include "base/err.h"
#include "config/config.h"

struct hp_batcher;

/*
 * The document ranges of n documents: part p is [b[p], b[p+1]).  As
 * Megatron's _get_split_indices: b[p+1] = b[p] + round(w[p] * n), rounded
 * half to even as Python's round, then every bound but the first moved by
 * the same amount so that b[3] = n (the train share takes up the rounding).
 */
void hp_split_bounds(const struct hp_split *s, uint64_t n, uint64_t b[4]);
/* "train", "validation" or "test" */
const char *hp_split_name(int part);

/*
 * order[0..n) = 0..n-1, or with shuffle a permutation drawn from (seed,
 * epoch) alone (Fisher-Yates over a counter-based generator): the same on
 * every run and machine.  The order of both data modes' epochs.
 */
void hp_order(uint32_t *order, size_t n, uint64_t seed, uint64_t epoch, int shuffle);

/* documents inside rows: see above */
struct hp_batch_docs {
	int32_t eod;       /* the end-of-document id */
	int mask_loss;     /* eod_mask_loss */
	int reset;         /* reset_position_ids and reset_attention_mask */
};
/* One row's inputs in[T] -> labels lab[T] masked, seg[T] (NULL: not wanted). */
void hp_batch_docs_row(const struct hp_batch_docs *d, const int32_t *in, int32_t *lab, int32_t *seg, long T);

/*
 * Open PREFIX.idx/.bin (see hp_indexed_open) for rows of seq_length
 * inputs.  Returns 0 and *b, or with *b = NULL: HP_EINVAL (seq_length < 1
 * or too large), the codes of hp_indexed_open, HP_ENOMEM, or HP_EFORMAT
 * when the data cannot make one row: with is_dataset_from_mr, no records or
 * a record whose length is not seq_length+1 (the message names the record,
 * the file and both lengths); without it, fewer than seq_length+1 tokens.
 */
int hp_batcher_open(struct hp_batcher **b, const char *prefix, long seq_length,
		    int is_dataset_from_mr, struct hp_err *e);
/*
 * The same on part (HP_SPLIT_*) of the documents as split cuts them (NULL:
 * all of them).  The train part fails as above when its range cannot make
 * a row (the message names the split); a validation or test part may be
 * empty: it opens with no rows, and hp_batcher_next refuses it.
 */
int hp_batcher_open_split(struct hp_batcher **b, const char *prefix, long seq_length,
			  int is_dataset_from_mr, const struct hp_split *split, int part,
			  struct hp_err *e);
/* The part's first document, its document count, and the file's. */
void hp_batcher_docs(const struct hp_batcher *b, uint64_t *first, uint64_t *n, uint64_t *all);

/* Documents inside rows (d copied; NULL: off). */
void hp_batcher_set_docs(struct hp_batcher *b, const struct hp_batch_docs *d);
/* Shuffle the rows of every epoch by (seed, epoch).  HP_EUNSUP for more
 * than 2^32 - 1 rows, HP_ENOMEM. */
int hp_batcher_set_shuffle(struct hp_batcher *b, uint64_t seed, struct hp_err *e);
/*
 * Fill B rows: inputs[B*T] and labels[B*T], row-major, T = seq_length, and
 * seg[B*T] when non-NULL (each position's document start in its row: 0
 * unless documents reset).  Returns 0, HP_EINVAL (B < 1), or HP_EFORMAT
 * when a stored id is invalid (see hp_indexed_read); on failure the cursor
 * does not move.
 */
int hp_batcher_next(struct hp_batcher *b, int B, int32_t *inputs, int32_t *labels, int32_t *seg,
		    struct hp_err *e);

/* The cursor: the next row and the number of completed epochs. */
void hp_batcher_cursor(const struct hp_batcher *b, uint64_t *pos, uint64_t *epoch);

/* Restore a cursor from hp_batcher_cursor.  HP_EINVAL when pos is not below
 * rows_per_epoch (a cursor from another dataset or seq_length). */
int hp_batcher_seek(struct hp_batcher *b, uint64_t pos, uint64_t epoch, struct hp_err *e);

/* Move the cursor past n rows without reading them (epochs wrap, as
 * hp_batcher_next's): the rows other ranks read. */
void hp_batcher_skip(struct hp_batcher *b, uint64_t n);

/* Rows in one pass over the data (records, or windows; see above). */
uint64_t hp_batcher_rows_per_epoch(const struct hp_batcher *b);

void hp_batcher_free(struct hp_batcher *b);

#endif
