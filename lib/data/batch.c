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
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "cpu/ops.h"
#include "data/batch.h"
#include "format/indexed.h"

struct hp_batcher {
	struct hp_indexed d;
	long T;                 /* seq_length */
	int from_mr;
	uint64_t doc0, ndocs;   /* the part's documents */
	uint64_t seq0;          /* its first record (from_mr) */
	uint64_t tok0;          /* its first token (stream) */
	uint64_t rows;          /* rows per epoch */
	uint64_t pos, epoch;    /* the cursor */
	int32_t *row;           /* T+1 ids of the row being cut */
	struct hp_batch_docs docs;
	int has_docs;
	uint32_t *order;        /* with shuffle: epoch order_epoch's rows */
	uint64_t seed, order_epoch;
};

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void hp_order(uint32_t *order, size_t n, uint64_t seed, uint64_t epoch, int shuffle)
{
	uint64_t st = seed * 0x2545f4914f6cdd1dull ^ (epoch + 1) * 0x9e3779b97f4a7c15ull;

	for (size_t i = 0; i < n; i++)
		order[i] = (uint32_t)i;
	if (!shuffle)
		return;
	for (size_t i = n - 1; n && i > 0; i--) {
		/* multiply-shift: uniform enough for 2^32 entries, no division */
		size_t j = (size_t)(((unsigned __int128)splitmix64(&st) * (i + 1)) >> 64);
		uint32_t t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
}

void hp_batch_docs_row(const struct hp_batch_docs *d, const int32_t *in, int32_t *lab, int32_t *seg, long T)
{
	int32_t start = 0;

	for (long i = 0; i < T; i++) {
		if (seg)
			seg[i] = d->reset ? start : 0;
		if (in[i] != d->eod)
			continue;
		if (d->mask_loss)
			lab[i] = HP_IGNORE_INDEX;
		start = (int32_t)(i + 1);
	}
}

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
	return 0;
}

void hp_split_bounds(const struct hp_split *s, uint64_t n, uint64_t b[4])
{
	int64_t x[4] = { 0 };

	/* nearbyint in the default rounding mode: half to even, as Python's round */
	for (int i = 0; i < 3; i++)
		x[i + 1] = x[i] + (int64_t)nearbyint(s->w[i] * (double)n);
	for (int i = 1; i < 4; i++)
		x[i] -= x[3] - (int64_t)n;
	/* a share rounded below what the others took leaves nothing, not a negative range */
	for (int i = 0; i < 4; i++)
		b[i] = x[i] < 0 ? 0 : (uint64_t)x[i];
	for (int i = 1; i < 4; i++)
		if (b[i] < b[i - 1])
			b[i] = b[i - 1];
}

const char *hp_split_name(int part)
{
	return part == HP_SPLIT_TRAIN ? "train" : part == HP_SPLIT_VALID ? "validation" : "test";
}

int hp_batcher_open(struct hp_batcher **bp, const char *prefix, long seq_length,
		    int is_dataset_from_mr, struct hp_err *e)
{
	return hp_batcher_open_split(bp, prefix, seq_length, is_dataset_from_mr, NULL, HP_SPLIT_TRAIN, e);
}

/* Token offset of sequence i's first token (i <= nseq). */
static uint64_t seq_token(const struct hp_indexed *d, uint64_t i)
{
	return i == d->nseq ? d->ntok : (uint64_t)hp_indexed_seq_ptr(d, i) / d->elem_size;
}

/* The part's documents, records or tokens, and its rows. */
static int cut_part(struct hp_batcher *b, const struct hp_split *split, int part, struct hp_err *e)
{
	const struct hp_indexed *d = &b->d;
	uint64_t ndoc = d->ndoc - 1, bound[4] = { 0, ndoc, ndoc, ndoc }, s0, s1, t0, t1;
	char what[96] = "";

	if (split) {
		hp_split_bounds(split, ndoc, bound);
		snprintf(what, sizeof(what), " in the %s split (documents %llu to %llu of %llu)",
			 hp_split_name(part), (unsigned long long)bound[part],
			 (unsigned long long)bound[part + 1], (unsigned long long)ndoc);
	}
	b->doc0 = bound[part];
	b->ndocs = bound[part + 1] - bound[part];
	s0 = (uint64_t)hp_indexed_doc_idx(d, b->doc0);
	s1 = (uint64_t)hp_indexed_doc_idx(d, b->doc0 + b->ndocs);
	if (b->from_mr) {
		b->seq0 = s0;
		b->rows = s1 - s0;
		if (!b->rows && part == HP_SPLIT_TRAIN)
			return hp_err_set(e, HP_EFORMAT, "'%s': no records%s (is_dataset_from_mr)", d->idx_path,
					  what);
		return 0;
	}
	t0 = seq_token(d, s0);
	t1 = seq_token(d, s1);
	b->tok0 = t0;
	b->rows = t1 - t0 > (uint64_t)b->T ? (t1 - t0 - 1) / (uint64_t)b->T : 0;
	if (!b->rows && part == HP_SPLIT_TRAIN)
		return hp_err_set(e, HP_EFORMAT, "'%s': %llu tokens%s, fewer than seq_length+1 = %ld",
				  d->bin_path, (unsigned long long)(t1 - t0), what, b->T + 1);
	return 0;
}

int hp_batcher_open_split(struct hp_batcher **bp, const char *prefix, long seq_length,
			  int is_dataset_from_mr, const struct hp_split *split, int part,
			  struct hp_err *e)
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
	if (b->from_mr)
		rc = check_records(b, e);
	if (!rc)
		rc = cut_part(b, split, part, e);
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

void hp_batcher_set_docs(struct hp_batcher *b, const struct hp_batch_docs *d)
{
	b->has_docs = d != NULL;
	if (d)
		b->docs = *d;
}

int hp_batcher_set_shuffle(struct hp_batcher *b, uint64_t seed, struct hp_err *e)
{
	if (b->rows > UINT32_MAX)
		return hp_err_set(e, HP_EUNSUP, "'%s': %llu rows: shuffle takes at most 2^32 - 1", b->d.prefix,
				  (unsigned long long)b->rows);
	if (!(b->order = hp_malloc((size_t)b->rows * sizeof(*b->order) + 1)))
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory for the order of %llu rows", b->d.prefix,
				  (unsigned long long)b->rows);
	b->seed = seed;
	b->order_epoch = b->epoch;
	hp_order(b->order, (size_t)b->rows, seed, b->epoch, 1);
	return 0;
}

int hp_batcher_next(struct hp_batcher *b, int B, int32_t *inputs, int32_t *labels, int32_t *seg,
		    struct hp_err *e)
{
	size_t T = (size_t)b->T;
	uint64_t pos = b->pos, epoch = b->epoch;
	long n;

	if (B < 1)
		return hp_err_set(e, HP_EINVAL, "'%s': batch size %d must be positive", b->d.prefix, B);
	if (!b->rows)
		return hp_err_set(e, HP_EINVAL, "'%s': the split has no rows", b->d.prefix);
	for (int r = 0; r < B; r++) {
		uint64_t row = pos;

		if (b->order) {
			if (b->order_epoch != epoch) {
				b->order_epoch = epoch;
				hp_order(b->order, (size_t)b->rows, b->seed, epoch, 1);
			}
			row = b->order[pos];
		}
		if (b->from_mr)
			n = hp_indexed_read(&b->d, b->seq0 + row, b->row, T + 1, e);
		else
			n = hp_indexed_read_tokens(&b->d, b->tok0 + row * T, T + 1, b->row, e);
		if (n < 0)
			return (int)n;
		memcpy(inputs + (size_t)r * T, b->row, T * sizeof(*b->row));
		memcpy(labels + (size_t)r * T, b->row + 1, T * sizeof(*b->row));
		if (b->has_docs)
			hp_batch_docs_row(&b->docs, inputs + (size_t)r * T, labels + (size_t)r * T,
					  seg ? seg + (size_t)r * T : NULL, (long)T);
		else if (seg)
			memset(seg + (size_t)r * T, 0, T * sizeof(*seg));
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
		return hp_err_set(e, HP_EFORMAT,
				  "'%s': cursor position %llu past the %llu rows of an epoch (another dataset or seq_length?)",
				  b->d.prefix, (unsigned long long)pos, (unsigned long long)b->rows);
	b->pos = pos;
	b->epoch = epoch;
	return 0;
}

void hp_batcher_skip(struct hp_batcher *b, uint64_t n)
{
	if (!b->rows)
		return;
	b->epoch += (b->pos + n) / b->rows;
	b->pos = (b->pos + n) % b->rows;
}

uint64_t hp_batcher_rows_per_epoch(const struct hp_batcher *b)
{
	return b->rows;
}

void hp_batcher_docs(const struct hp_batcher *b, uint64_t *first, uint64_t *n, uint64_t *all)
{
	*first = b->doc0;
	*n = b->ndocs;
	*all = b->d.ndoc - 1;
}

void hp_batcher_free(struct hp_batcher *b)
{
	if (!b)
		return;
	hp_indexed_close(&b->d);
	hp_free(b->row);
	hp_free(b->order);
	hp_free(b);
}
