/*
 * batch.h - the offline batch source for training: fixed-length rows of
 * (inputs, labels) cut from a Megatron indexed dataset (indexed.h), in file
 * order, wrapping around at the end of the data.
 *
 * It is deliberately not Megatron's GPTDataset: no shuffling, no blending of
 * several datasets, no sample index cached on disk, no document masks.  Two
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
 * Ownership: hp_batcher_open makes a heap object, hp_batcher_free releases
 * it (NULL accepted).  Caller buffers are borrowed for the call only.
 * hp_batcher_next does not allocate.
 */
#ifndef HP_BATCH_H
#define HP_BATCH_H

#include <stdint.h>

#include "err.h"

struct hp_batcher;

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
 * Fill B rows: inputs[B*T] and labels[B*T], row-major, T = seq_length.
 * Returns 0, HP_EINVAL (B < 1), or HP_EFORMAT when a stored id is invalid
 * (see hp_indexed_read); on failure the cursor does not move.
 */
int hp_batcher_next(struct hp_batcher *b, int B, int32_t *inputs, int32_t *labels,
		    struct hp_err *e);

/* The cursor: the next row and the number of completed epochs. */
void hp_batcher_cursor(const struct hp_batcher *b, uint64_t *pos, uint64_t *epoch);

/* Restore a cursor from hp_batcher_cursor.  HP_EINVAL when pos is not below
 * rows_per_epoch (a cursor from another dataset or seq_length). */
int hp_batcher_seek(struct hp_batcher *b, uint64_t pos, uint64_t epoch, struct hp_err *e);

/* Rows in one pass over the data (records, or windows; see above). */
uint64_t hp_batcher_rows_per_epoch(const struct hp_batcher *b);

void hp_batcher_free(struct hp_batcher *b);

#endif
