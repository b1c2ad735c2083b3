/*
 * indexed.h - Megatron-LM's indexed dataset (MMIDIDX version 1): a reader
 * that memory-maps PREFIX.idx and PREFIX.bin, and a streaming writer.
 *
 * This is the on-disk format of megatron/core/datasets/indexed_dataset.py,
 * so files made by Megatron's preprocess_data.py open here and files written
 * here open in Megatron.  It is not Megatron's GPTDataset (no shuffling, no
 * sample index, no blending: see batch.h for how hp cuts batches), and it
 * does not read the "multimodal" variant whose .idx carries a trailing
 * sequence-mode byte per sequence, nor float token payloads.
 *
 * The format, all little-endian, no padding anywhere:
 *
 *   PREFIX.idx   offset  size
 *     magic        0      9    "MMIDIDX\0\0"
 *     version      9      8    u64, always 1
 *     dtype code  17      1    u8: 1 uint8, 2 int8, 3 int16, 4 int32,
 *                                  5 int64, 6 float64, 7 float32, 8 uint16
 *     seq count   18      8    u64 S
 *     doc count   26      8    u64 D, entries of doc_idx (documents + 1)
 *     seq_len     34    4*S    int32 tokens in each sequence
 *     seq_ptr       .   8*S    int64 byte offset of each sequence in .bin
 *     doc_idx       .   8*D    int64 first sequence of each document, then S
 *   PREFIX.bin         token ids of every sequence, back to back
 *
 * Invariants checked by hp_indexed_open (Megatron's writer always produces
 * them, so anything else is a damaged or foreign file): seq_len >= 0;
 * seq_ptr[0] = 0 and each pointer is the running sum of the lengths times
 * the element size (sequences are contiguous); the .bin holds exactly
 * those bytes; doc_idx starts at 0, never decreases and ends at S; the .idx
 * has no bytes after doc_idx.
 *
 * Because the arrays start at offset 34 they are not aligned for their
 * types, so the reader keeps byte pointers and decodes entries through
 * hp_indexed_seq_len() and friends rather than handing out int32_t * views
 * (a misaligned load is undefined behaviour, and UBSan says so).
 *
 * Ownership: struct hp_indexed is caller-owned; open fills it, close
 * releases what open acquired (the mappings and the path strings).  The
 * writer is a heap object that finish or abort consumes.
 */
#ifndef HP_INDEXED_H
#define HP_INDEXED_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"

/* Bytes before seq_len: magic, version, dtype code, two counts. */
#define HP_INDEXED_HEADER_SIZE 34

struct hp_indexed {
	char *prefix;                 /* as given to open; owned */
	char *idx_path, *bin_path;    /* PREFIX.idx, PREFIX.bin; owned */
	int dtype_code;               /* Megatron's code, see above */
	enum hp_dtype dtype;          /* the same type in hp's terms */
	size_t elem_size;             /* bytes per token in .bin */
	uint64_t nseq;                /* sequences (S) */
	uint64_t ndoc;                /* entries of doc_idx (D): documents + 1 */
	uint64_t ntok;                /* tokens in .bin: the sum of seq_len */
	/* The three arrays, inside idx_map; read them with the accessors. */
	const unsigned char *seq_len_raw, *seq_ptr_raw, *doc_idx_raw;
	void *idx_map;                /* read-only mapping of the .idx */
	size_t idx_size;
	void *bin_map;                /* read-only mapping of the .bin; NULL when empty */
	size_t bin_size;
};

static inline uint64_t hp_indexed_le64_(const unsigned char *p)
{
	return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 |
	       (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 |
	       (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

/* Tokens in sequence i (i < nseq; not checked). */
static inline int32_t hp_indexed_seq_len(const struct hp_indexed *d, uint64_t i)
{
	const unsigned char *p = d->seq_len_raw + 4 * i;

	return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 |
			 (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* Byte offset of sequence i in the .bin (i < nseq; not checked). */
static inline int64_t hp_indexed_seq_ptr(const struct hp_indexed *d, uint64_t i)
{
	return (int64_t)hp_indexed_le64_(d->seq_ptr_raw + 8 * i);
}

/* Entry i of doc_idx (i < ndoc; not checked): document i spans sequences
 * [doc_idx(i), doc_idx(i + 1)). */
static inline int64_t hp_indexed_doc_idx(const struct hp_indexed *d, uint64_t i)
{
	return (int64_t)hp_indexed_le64_(d->doc_idx_raw + 8 * i);
}

/*
 * Open PREFIX.idx and PREFIX.bin (prefix without the extension), map both
 * read-only and check every invariant listed above.  Returns 0, HP_EIO (a
 * file is missing or cannot be mapped), HP_EFORMAT (a one-line message
 * naming the file in quotes), HP_EUNSUP (a float token dtype) or HP_ENOMEM.
 * On failure *d is left closed (safe to pass to hp_indexed_close).  The file
 * descriptors are closed before returning: the mappings are all it keeps.
 */
int hp_indexed_open(struct hp_indexed *d, const char *prefix, struct hp_err *e);

/* Unmap and free; d is left zeroed.  Safe on a zeroed or failed-open d. */
void hp_indexed_close(struct hp_indexed *d);

/*
 * Read sequence i as int32 token ids into dst (room for cap ids), converting
 * from the stored dtype.  Returns the length (>= 0), HP_EINVAL when i is out
 * of range or cap is too small, or HP_EFORMAT when a stored id is negative
 * or does not fit in int32 (possible only for signed or int64 payloads).
 */
long hp_indexed_read(const struct hp_indexed *d, uint64_t i, int32_t *dst, size_t cap,
		     struct hp_err *e);

/*
 * Read n ids starting at token first of the whole payload, i.e. of all
 * sequences concatenated in file order, ignoring sequence and document
 * boundaries (valid because open checked that sequences are contiguous).
 * Returns 0, HP_EINVAL (first + n > ntok) or HP_EFORMAT as hp_indexed_read.
 */
int hp_indexed_read_tokens(const struct hp_indexed *d, uint64_t first, size_t n, int32_t *dst,
			   struct hp_err *e);

/* Megatron's numpy name for a dtype code ("uint16"); "unknown" otherwise. */
const char *hp_indexed_dtype_name(int code);

/*
 * The dtype code Megatron's preprocess_data.py picks for a vocabulary
 * (DType.optimal_dtype): uint16 (8) when vocab_size < 65500, else int32 (4).
 * 65500 rather than 65536 is Megatron's own margin; hp keeps it so that the
 * same vocabulary gives byte-identical files in both.
 */
int hp_indexed_best_dtype(int64_t vocab_size);

/*
 * Writer.  Sequences are streamed into a temporary beside PREFIX.bin
 * (PREFIX.bin.tmp.PID) as they are added; finish writes the index to
 * PREFIX.idx.tmp.PID, fsyncs both and renames them into place (.bin first,
 * so that a crash between the renames leaves a pair that fails validation
 * rather than one that silently mismatches).  Until finish returns 0 no
 * file named PREFIX.bin or PREFIX.idx is created or replaced.
 */
struct hp_indexed_writer;

/*
 * Start a dataset at prefix for ids in [0, vocab_size), stored with
 * hp_indexed_best_dtype(vocab_size).  Returns 0 and *w, or HP_EINVAL
 * (vocab_size < 1), HP_EIO (the temporary cannot be created: missing
 * directory, permissions) or HP_ENOMEM, with *w = NULL.
 */
int hp_indexed_writer_open(struct hp_indexed_writer **w, const char *prefix, int64_t vocab_size,
			   struct hp_err *e);

/*
 * Append one sequence of n ids (n may be 0).  Every id is checked to lie in
 * [0, vocab_size) before anything is written, so a rejected sequence
 * (HP_EINVAL) leaves the writer usable.  HP_EIO or HP_ENOMEM leave it
 * failed: later calls return the same code and only finish/abort remain.
 */
int hp_indexed_writer_add(struct hp_indexed_writer *w, const int32_t *ids, size_t n,
			  struct hp_err *e);

/* End the current document after the sequences added since the last end
 * (Megatron's end_document; an empty document is recorded as such). */
int hp_indexed_writer_end_document(struct hp_indexed_writer *w, struct hp_err *e);

/*
 * Write the index and rename both files into place.  Sequences added after
 * the last end_document form one final document.  Always consumes w; on
 * failure (HP_EIO, HP_ENOMEM, or the error a failed writer already had) the
 * temporaries are removed.
 */
int hp_indexed_writer_finish(struct hp_indexed_writer *w, struct hp_err *e);

/* Remove the temporaries and free w; NULL is accepted. */
void hp_indexed_writer_abort(struct hp_indexed_writer *w);

#endif
