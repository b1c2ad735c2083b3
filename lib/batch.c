/*
 * batch.c - fixed-length training rows from an indexed dataset (batch.h).
 *
 * Both modes read straight out of the dataset's mapping through one scratch
 * row of T+1 ids allocated at open, so the step loop never allocates.  The
 * stream mode leans on hp_indexed_open having checked that sequences are
 * contiguous: the concatenated stream is simply the .bin payload, and
 * window r starts at token r*T, with no search over sequence boundaries.
 * Record lengths for is_dataset_from_mr are checked once at open (a pass
 * over the .idx only), so a bad record fails the job before step 1 rather
 * than hours in.
 */
#include "alloc.h"
#include "batch.h"
#include "indexed.h"

struct hp_batcher {
	struct hp_indexed d;
	long T;                 /* seq_length */
	int from_mr;
	uint64_t rows;          /* rows per epoch */
	uint64_t pos, epoch;    /* the cursor */
	int32_t *row;           /* T+1 ids of the row being cut */
};

static int check_records(struct hp_batcher *b, struct hp_err *e)
{
	const struct hp_indexed *d = &b->d;

	if (d->nseq == 0)
		return hp_err_set(e, HP_EFORMAT, "'%s': no records (is_dataset_from_mr)", d->idx_path);
	for (uint64_t i = 0; i < d->nseq; i++) {
		int32_t len = hp_indexed_seq_len(d, i);

		if (len != b->T + 1)
			return hp_err_set(e, HP_EFORMAT,
					  "'%s': record %llu has %d tokens, expected seq_length+1 = %ld (is_dataset_from_mr)",
					  d->idx_path, (unsigned long long)i, len, b->T + 1);
	}
	b->rows = d->nseq;
	return 0;
}

int hp_batcher_open(struct hp_batcher **bp, const char *prefix, long seq_length,
		    int is_dataset_from_mr, struct hp_err *e)
{
	struct hp_batcher *b;
	int rc;

	*bp = NULL;
	/* A record length is an int32 in the index, so T+1 must fit one. */
	if (seq_length < 1 || seq_length >= INT32_MAX)
		return hp_err_set(e, HP_EINVAL, "'%s': seq_length %ld out of range", prefix,
				  seq_length);
	b = hp_calloc(1, sizeof(*b));
	if (!b)
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory opening batches", prefix);
	b->T = seq_length;
	b->from_mr = !!is_dataset_from_mr;
	rc = hp_indexed_open(&b->d, prefix, e);
	if (rc)
		goto fail;
	if (b->from_mr) {
		rc = check_records(b, e);
	} else if (b->d.ntok < (uint64_t)seq_length + 1) {
		rc = hp_err_set(e, HP_EFORMAT, "'%s': %llu tokens, fewer than seq_length+1 = %ld",
				b->d.bin_path, (unsigned long long)b->d.ntok, seq_length + 1);
	} else {
		b->rows = (b->d.ntok - 1) / (uint64_t)seq_length;
	}
	if (rc)
		goto fail;
	b->row = hp_malloc(((size_t)seq_length + 1) * sizeof(*b->row));
	if (!b->row) {
		rc = hp_err_set(e, HP_ENOMEM, "'%s': out of memory opening batches", prefix);
		goto fail;
	}
	*bp = b;
	return 0;
fail:
	hp_batcher_free(b);
	return rc;
}

int hp_batcher_next(struct hp_batcher *b, int B, int32_t *inputs, int32_t *labels,
		    struct hp_err *e)
{
	size_t T = (size_t)b->T;
	uint64_t pos = b->pos, epoch = b->epoch;
	long n;

	if (B < 1)
		return hp_err_set(e, HP_EINVAL, "'%s': batch size %d must be positive", b->d.prefix, B);
	for (int r = 0; r < B; r++) {
		if (b->from_mr)
			n = hp_indexed_read(&b->d, pos, b->row, T + 1, e);
		else
			n = hp_indexed_read_tokens(&b->d, pos * T, T + 1, b->row, e);
		if (n < 0)
			return (int)n;
		memcpy(inputs + (size_t)r * T, b->row, T * sizeof(*b->row));
		memcpy(labels + (size_t)r * T, b->row + 1, T * sizeof(*b->row));
		if (++pos == b->rows) {
			pos = 0;
			epoch++;
		}
	}
	b->pos = pos;
	b->epoch = epoch;
	return 0;
}

void hp_batcher_cursor(const struct hp_batcher *b, uint64_t *pos, uint64_t *epoch)
{
	*pos = b->pos;
	*epoch = b->epoch;
}

int hp_batcher_seek(struct hp_batcher *b, uint64_t pos, uint64_t epoch, struct hp_err *e)
{
	if (pos >= b->rows)
		return hp_err_set(e, HP_EINVAL,
				  "'%s': cursor position %llu past the %llu rows of an epoch (another dataset or seq_length?)",
				  b->d.prefix, (unsigned long long)pos, (unsigned long long)b->rows);
	b->pos = pos;
	b->epoch = epoch;
	return 0;
}

uint64_t hp_batcher_rows_per_epoch(const struct hp_batcher *b)
{
	return b->rows;
}

void hp_batcher_free(struct hp_batcher *b)
{
	if (!b)
		return;
	hp_indexed_close(&b->d);
	hp_free(b->row);
	hp_free(b);
}
