/*
 * safetensors.h - read and write HuggingFace safetensors files and folders.
 *
 * The format (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian u64 N, then N bytes of UTF-8 JSON, then the data section.
 * The JSON is an object mapping tensor name to
 *   {"dtype": "F32", "shape": [512, 64], "data_offsets": [begin, end]}
 * with offsets relative to the first byte of the data section, plus an
 * optional "__metadata__" object of string -> string.  The header may be
 * padded with trailing spaces.
 *
 * This is a reader that trusts nothing in the file: every header is checked
 * before any tensor is handed out, and a file that passes hp_st_open can be
 * indexed without further bounds checks.  It is not a general JSON or tensor
 * library: tensors are views into a read-only mapping, and the only
 * conversion offered is to F32 (hp_st_read_f32).  Like the HF library it
 * accepts a data section only when the tensors cover it exactly: no gap
 * between two tensors, no overlap, no bytes after the last one (HF's
 * InvalidOffset and MetadataIncompleteBuffer), so that every file hp
 * accepts is one transformers loads.
 *
 * Invariants of an open struct hp_st_file (after hp_st_open or
 * hp_st_parse_header returned 0):
 *  - tensors[] is sorted by name (strcmp) and names are unique;
 *  - for every tensor, begin <= end <= data section length,
 *    end - begin == nbytes == numel * hp_dtype_size(dtype), numel is the
 *    product of shape[0..ndim) (1 for ndim 0) and dtype is a known dtype;
 *  - sorted by (begin, end), the tensors' [begin, end) ranges tile the
 *    data section: the first begins at 0, each begins where the one
 *    before ends, the last ends at the data section's length (an empty
 *    tensor is an empty range at such a boundary);
 *  - data is non-NULL only for files opened with hp_st_open, and then
 *    points at nbytes readable bytes inside the mapping (not aligned: the
 *    format does not promise alignment, so read through memcpy or
 *    hp_st_read_f32).
 *
 * Ownership: struct hp_st_file and struct hp_st_model are caller-owned
 * structs; everything they point to is owned by them and released by
 * hp_st_close / hp_st_model_close.  Tensor pointers returned by the find
 * functions are borrowed and live until the close.  The writer borrows its
 * arguments.
 *
 * Errors: HP_EIO for a file that cannot be opened, read or written (a
 * missing file included), HP_EFORMAT for malformed contents, HP_EUNSUP for
 * a well-formed header with a dtype hp does not know (or more than
 * HP_ST_MAX_DIMS dimensions), HP_ENOMEM, and HP_EINVAL for a caller bug.
 * Messages name the file in quotes.
 *
 * Sizes assume a 64-bit size_t, as does the rest of hp.
 */
#ifndef HP_SAFETENSORS_H
#define HP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"
#include "base/fileio.h"

/* More dimensions than any model weight or activation hp handles. */
#define HP_ST_MAX_DIMS 8
/* The HF library's limit (MAX_HEADER_SIZE); a longer header is corrupt. */
#define HP_ST_MAX_HEADER 100000000u

struct hp_st_tensor {
	char *name;                 /* owned */
	enum hp_dtype dtype;
	int ndim;
	int64_t shape[HP_ST_MAX_DIMS];
	uint64_t begin, end;        /* offsets within the data section */
	const void *data;           /* points into the mapping; NULL when parsed from a buffer
				       only or opened with HP_ST_PREAD */
	size_t nbytes;
	int64_t numel;
	int fd;                     /* the open file (hp_st_pread), -1 or 0 when none */
	uint64_t file_off;          /* where the data starts in the file */
	const char *path;           /* borrowed from the file, for messages */
};

struct hp_st_file {
	char *path;                 /* owned copy; NULL for a header parsed from a buffer */
	int fd;                     /* open exactly while map is non-NULL */
	void *map;                  /* read-only mmap of the whole file, or NULL */
	size_t size;                /* bytes mapped */
	size_t ntensors;
	struct hp_st_tensor *tensors;   /* sorted by name */
	size_t nmeta;               /* __metadata__, in file order */
	char **meta_keys;
	char **meta_vals;
};

/*
 * Parse a header buffer of len bytes (the JSON only, without the 8-byte
 * length) for a file whose data section is data_len bytes, filling
 * f->ntensors, f->tensors and the metadata fields; data pointers stay NULL.
 * The other fields of f are left alone; the parsed ones must be empty
 * (zeroed) on entry.  name is used in messages only.  Used by hp_st_open
 * and by the fuzzer.  Returns 0, HP_EFORMAT, HP_EUNSUP or HP_ENOMEM; on
 * failure the parsed fields are empty again.  An unknown dtype is reported
 * only when nothing else is wrong with the header.
 */
int hp_st_parse_header(struct hp_st_file *f, const char *name, const char *json,
		       size_t len, uint64_t data_len, struct hp_err *e);

/*
 * Open path: mmap it read-only, parse and check the header and point every
 * tensor's data into the mapping.  f is overwritten (need not be
 * initialised).  Returns 0, HP_EIO (cannot open, stat or map; not a regular
 * file), HP_EFORMAT (shorter than 8 bytes, header length past the end of
 * the file or over HP_ST_MAX_HEADER, any header check, bytes of the data
 * section outside every tensor), HP_EUNSUP or
 * HP_ENOMEM.  On failure f is left closed.  The file must not be truncated
 * while open (the mapping would fault).
 */
int hp_st_open(struct hp_st_file *f, const char *path, struct hp_err *e);

/*
 * The same with flags.  HP_ST_PREAD: do not map the file; read the header
 * with pread, keep the descriptor, and leave every tensor's data NULL: read
 * tensors with hp_st_pread, so that a process touching a slice of a 60 GB
 * checkpoint keeps only that slice resident.
 */
#define HP_ST_PREAD 1u
int hp_st_open_flags(struct hp_st_file *f, const char *path, unsigned flags, struct hp_err *e);

/* n bytes of tensor t from byte off of its data (a mapped or a pread file);
 * HP_EFORMAT if the file was truncated since it was opened. */
int hp_st_pread(const struct hp_st_tensor *t, uint64_t off, void *buf, size_t n, struct hp_err *e);

/* Release everything and leave f zeroed with fd -1.  Safe on a zeroed,
 * failed or already closed struct. */
void hp_st_close(struct hp_st_file *f);

/* The tensor called name (binary search), or NULL if absent. */
const struct hp_st_tensor *hp_st_find(const struct hp_st_file *f, const char *name);

/* The __metadata__ value for key, or NULL if absent.  Borrowed. */
const char *hp_st_meta(const struct hp_st_file *f, const char *key);

/*
 * A model folder as HF writes it: either model.safetensors, or
 * model.safetensors.index.json ({"weight_map": {name: file}, "metadata":
 * {"total_size": n}}) with the shards it names.  When a folder has both,
 * model.safetensors wins, as in transformers.
 */
struct hp_st_model {
	char *dir;                  /* owned: the folder the files are in */
	size_t nfiles;
	struct hp_st_file *files;   /* owned; shards sorted by file name */
	size_t ntensors;
	const struct hp_st_tensor **tensors;  /* owned array of borrowed pointers into
					       * files[], sorted by name, unique */
};

/*
 * Open a model from a folder, a single .safetensors file, or a path to a
 * model.safetensors.index.json.  m is overwritten.  For an index, checks
 * that every shard it names is inside the index's folder (no absolute path,
 * no ".." component: HP_EFORMAT naming the index and the entry), that every
 * shard it names exists (HP_EIO naming the shard and the index),
 * that every tensor in weight_map is in the shard it names and every tensor
 * of every shard is in weight_map under that shard (HP_EFORMAT), and that
 * metadata.total_size, when present, equals the sum of tensor bytes
 * (HP_EFORMAT).  A folder with neither file is HP_EIO.  Errors from a shard
 * name the shard.  On failure m is left closed.
 */
int hp_st_model_open(struct hp_st_model *m, const char *dir_or_file, struct hp_err *e);
/* The same with hp_st_open_flags' flags for every file. */
int hp_st_model_open_flags(struct hp_st_model *m, const char *dir_or_file, unsigned flags,
			   struct hp_err *e);

/* Close every shard and leave m zeroed.  Safe on a zeroed or closed struct. */
void hp_st_model_close(struct hp_st_model *m);

/* The tensor called name in any shard (binary search), or NULL. */
const struct hp_st_tensor *hp_st_model_find(const struct hp_st_model *m, const char *name);

/*
 * Read a tensor as F32 into dst (room for t->numel floats), converting from
 * F32, BF16, F16 or F64 (exact except F64, which rounds to nearest).
 * HP_EUNSUP for any other dtype, HP_EINVAL for a tensor without data (one
 * parsed from a buffer).
 */
int hp_st_read_f32(const struct hp_st_tensor *t, float *dst, struct hp_err *e);

/* One tensor to write; nbytes = numel * hp_dtype_size(dtype).  data may be
 * NULL only when that is 0. */
struct hp_st_entry {
	const char *name;
	enum hp_dtype dtype;
	int ndim;
	int64_t shape[HP_ST_MAX_DIMS];
	const void *data;
};

/*
 * Write a safetensors file atomically: entries sorted by name in the header
 * (as the HF library does), their data in that order with no gaps, the
 * header padded with spaces to a multiple of 8 bytes, and a __metadata__
 * object when nmeta > 0 (meta_keys/meta_vals may be NULL when nmeta is 0).
 * Written as fileio.h's hp_outfile writes: "path.tmp.PID", fsynced,
 * renamed over path, the folder fsynced; a FIFO or device (or
 * /dev/stdout) in place, never replaced.
 *
 * Returns 0; HP_EIO when creating, writing, syncing or renaming fails, in
 * which case the temporary is removed and path is unchanged; HP_ENOMEM;
 * HP_EINVAL, before anything is created, for a caller bug: a duplicate or
 * reserved ("__metadata__") name, a name or metadata string that is not
 * UTF-8, an unknown dtype, ndim outside 0..HP_ST_MAX_DIMS, a negative
 * dimension or a size that overflows.
 */
int hp_st_write(const char *path, size_t n, const struct hp_st_entry *entries,
		size_t nmeta, const char *const *meta_keys, const char *const *meta_vals,
		struct hp_err *e);

/*
 * The same, streamed: the header is written from the entries' names,
 * dtypes and shapes (data is not used), then the data section arrives in
 * any number of hp_st_writer_put calls, tensor after tensor in name order
 * (hp_st_writer_index(w, i) is the entries[] index of the i-th), so a
 * shard of any size is written with a bounded buffer.  Metadata can be
 * replaced before the commit by values that keep the header's length
 * (checksums written as fixed-width placeholders first).  Commit checks
 * that every byte came, fsyncs and renames; any failure removes the
 * temporary and leaves w closed.  entries is borrowed until the commit.
 */
struct hp_st_writer {
	char *path;                  /* as given, for messages */
	struct hp_outfile out;       /* fileio.h: a temporary renamed by the commit, or a stream */
	size_t n, hdr_len;
	const struct hp_st_entry *entries;
	const struct hp_st_entry **ord;
	uint64_t total, done;
};
int hp_st_writer_open(struct hp_st_writer *w, const char *path, size_t n,
		      const struct hp_st_entry *entries, size_t nmeta, const char *const *meta_keys,
		      const char *const *meta_vals, struct hp_err *e);
size_t hp_st_writer_index(const struct hp_st_writer *w, size_t i);
int hp_st_writer_put(struct hp_st_writer *w, const void *buf, size_t n, struct hp_err *e);
int hp_st_writer_set_meta(struct hp_st_writer *w, size_t nmeta, const char *const *meta_keys,
			  const char *const *meta_vals, struct hp_err *e);
int hp_st_writer_commit(struct hp_st_writer *w, struct hp_err *e);
/* Close and remove the temporary; safe on a closed writer. */
void hp_st_writer_abort(struct hp_st_writer *w);

#endif
