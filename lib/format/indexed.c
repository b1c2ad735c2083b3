/*
 * indexed.c - Megatron MMIDIDX v1 reader and writer (see indexed.h for the
 * format and its invariants).
 *
 * The reader maps both files and validates the whole index once, at open,
 * so that reads later are plain bounds-free copies out of the mapping; the
 * only check left for read time is the value of each id, which open would
 * have to touch every page of the .bin to do.  Everything is decoded byte by
 * byte as little-endian, which is both what numpy writes on every machine
 * Megatron runs on and safe for the unaligned arrays of the .idx.
 *
 * The writer does its own buffering over a file descriptor instead of stdio
 * so that its only allocations go through hp_malloc (stdio's buffers would
 * escape the failure-injection tests).  It is not a general Megatron
 * builder: no add_index (merging datasets), no multimodal modes.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fileio.h"
#include "format/indexed.h"

static const unsigned char magic[9] = { 'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0 };

static const struct {
	int code;
	const char *name;
	enum hp_dtype dtype;
} codes[] = {
	{ 1, "uint8", HP_DTYPE_U8 },     { 2, "int8", HP_DTYPE_I8 },
	{ 3, "int16", HP_DTYPE_I16 },    { 4, "int32", HP_DTYPE_I32 },
	{ 5, "int64", HP_DTYPE_I64 },    { 6, "float64", HP_DTYPE_F64 },
	{ 7, "float32", HP_DTYPE_F32 },  { 8, "uint16", HP_DTYPE_U16 },
};

/* Megatron's DType.optimal_dtype threshold (see hp_indexed_best_dtype). */
#define MEGATRON_U16_LIMIT 65500

/* Write buffer of the writer: big enough that write(2) calls are rare. */
#define WBUF_SIZE (64 * 1024)

const char *hp_indexed_dtype_name(int code)
{
	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
		if (codes[i].code == code)
			return codes[i].name;
	return "unknown";
}

int hp_indexed_best_dtype(int64_t vocab_size)
{
	return vocab_size < MEGATRON_U16_LIMIT ? 8 : 4;
}

/* "prefix" + "suffix" in a new hp_malloc'd string. */
static char *path_cat(const char *prefix, const char *suffix)
{
	size_t a = strlen(prefix), b = strlen(suffix);
	char *s = hp_malloc(a + b + 1);

	if (!s)
		return NULL;
	memcpy(s, prefix, a);
	memcpy(s + a, suffix, b + 1);
	return s;
}

/* ---- reader ---------------------------------------------------------- */

/*
 * Map path read-only.  An empty file gets no mapping (mmap rejects length
 * 0); callers treat *map == NULL with *size == 0 as empty.
 */
static int map_file(const char *path, void **map, size_t *size, struct hp_err *e)
{
	struct stat st;
	int fd, err;

	*map = NULL;
	*size = 0;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return hp_err_set(e, HP_EIO, "'%s': cannot open: %s", path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		err = errno;
		close(fd);
		return hp_err_set(e, HP_EIO, "'%s': cannot stat: %s", path, strerror(err));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return hp_err_set(e, HP_EIO, "'%s': not a regular file", path);
	}
	if (st.st_size > 0) {
		void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);

		if (p == MAP_FAILED) {
			err = errno;
			close(fd);
			return hp_err_set(e, HP_EIO, "'%s': cannot map: %s", path, strerror(err));
		}
		*map = p;
		*size = (size_t)st.st_size;
	}
	close(fd);
	return 0;
}

/* Header and counts: everything that needs only the .idx bytes up to doc_idx. */
static int check_header(struct hp_indexed *d, struct hp_err *e)
{
	const unsigned char *p = d->idx_map;
	const char *path = d->idx_path;
	uint64_t version, room, need;
	size_t i;

	if (d->idx_size < HP_INDEXED_HEADER_SIZE)
		return hp_err_set(e, HP_EFORMAT,
				  "'%s': %zu bytes, too short for the %d-byte header (not a Megatron MMIDIDX index)",
				  path, d->idx_size, HP_INDEXED_HEADER_SIZE);
	if (memcmp(p, magic, sizeof(magic)))
		return hp_err_set(e, HP_EFORMAT, "'%s': bad magic (not a Megatron MMIDIDX index)", path);
	version = hp_indexed_le64_(p + 9);
	if (version != 1)
		return hp_err_set(e, HP_EFORMAT, "'%s': version %llu, only version 1 is known",
				  path, (unsigned long long)version);
	d->dtype_code = p[17];
	for (i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
		if (codes[i].code == d->dtype_code)
			break;
	if (i == sizeof(codes) / sizeof(codes[0]))
		return hp_err_set(e, HP_EFORMAT, "'%s': unknown dtype code %d", path, d->dtype_code);
	if (hp_dtype_is_float(codes[i].dtype) || codes[i].dtype == HP_DTYPE_F64)
		return hp_err_set(e, HP_EUNSUP, "'%s': token dtype %s (code %d) is not supported",
				  path, codes[i].name, d->dtype_code);
	d->dtype = codes[i].dtype;
	d->elem_size = hp_dtype_size(d->dtype);

	d->nseq = hp_indexed_le64_(p + 18);
	d->ndoc = hp_indexed_le64_(p + 26);
	/* Compare by division so that absurd counts cannot overflow. */
	room = d->idx_size - HP_INDEXED_HEADER_SIZE;
	if (d->nseq > room / 12 || d->ndoc > (room - 12 * d->nseq) / 8)
		return hp_err_set(e, HP_EFORMAT,
				  "'%s': %llu sequences and %llu document indices run past end of file (%zu bytes)",
				  path, (unsigned long long)d->nseq, (unsigned long long)d->ndoc,
				  d->idx_size);
	need = 12 * d->nseq + 8 * d->ndoc;
	if (room > need)
		return hp_err_set(e, HP_EFORMAT,
				  "'%s': %llu trailing bytes after the document indices (a multimodal index?)",
				  path, (unsigned long long)(room - need));
	d->seq_len_raw = p + HP_INDEXED_HEADER_SIZE;
	d->seq_ptr_raw = d->seq_len_raw + 4 * d->nseq;
	d->doc_idx_raw = d->seq_ptr_raw + 8 * d->nseq;
	return 0;
}

/* Lengths and pointers against each other and the .bin. */
static int check_sequences(struct hp_indexed *d, struct hp_err *e)
{
	uint64_t bin_size = d->bin_size, pos = 0;   /* running sum, in bytes */

	for (uint64_t i = 0; i < d->nseq; i++) {
		int32_t len = hp_indexed_seq_len(d, i);
		int64_t ptr = hp_indexed_seq_ptr(d, i);
		uint64_t bytes;

		if (len < 0)
			return hp_err_set(e, HP_EFORMAT, "'%s': sequence %llu has negative length %d",
					  d->idx_path, (unsigned long long)i, len);
		if (ptr < 0 || (uint64_t)ptr != pos)
			return hp_err_set(e, HP_EFORMAT,
					  "'%s': sequence %llu starts at byte %lld, expected %llu (sequences must be contiguous)",
					  d->idx_path, (unsigned long long)i, (long long)ptr,
					  (unsigned long long)pos);
		/* pos <= bin_size holds here, and len * elem_size < 2^34. */
		bytes = (uint64_t)len * d->elem_size;
		if (bytes > bin_size - pos)
			return hp_err_set(e, HP_EFORMAT,
					  "'%s': sequence %llu ends at byte %llu, past end of file (%llu bytes)",
					  d->bin_path, (unsigned long long)i,
					  (unsigned long long)(pos + bytes), (unsigned long long)bin_size);
		pos += bytes;
	}
	if (pos != bin_size)
		return hp_err_set(e, HP_EFORMAT,
				  "'%s': %llu bytes, but the index describes %llu (mismatched .idx and .bin?)",
				  d->bin_path, (unsigned long long)bin_size, (unsigned long long)pos);
	d->ntok = pos / d->elem_size;
	return 0;
}

static int check_documents(struct hp_indexed *d, struct hp_err *e)
{
	int64_t prev = 0, last;

	if (d->ndoc == 0)
		return hp_err_set(e, HP_EFORMAT, "'%s': no document indices (at least [0] is required)",
				  d->idx_path);
	if (hp_indexed_doc_idx(d, 0) != 0)
		return hp_err_set(e, HP_EFORMAT, "'%s': document indices start at %lld, not 0",
				  d->idx_path, (long long)hp_indexed_doc_idx(d, 0));
	for (uint64_t i = 1; i < d->ndoc; i++) {
		int64_t v = hp_indexed_doc_idx(d, i);

		if (v < 0 || (uint64_t)v > d->nseq)
			return hp_err_set(e, HP_EFORMAT,
					  "'%s': document index %llu is %lld, outside the %llu sequences",
					  d->idx_path, (unsigned long long)i, (long long)v,
					  (unsigned long long)d->nseq);
		if (v < prev)
			return hp_err_set(e, HP_EFORMAT,
					  "'%s': document index %llu is %lld, less than the %lld before it",
					  d->idx_path, (unsigned long long)i, (long long)v, (long long)prev);
		prev = v;
	}
	last = hp_indexed_doc_idx(d, d->ndoc - 1);
	if ((uint64_t)last != d->nseq)
		return hp_err_set(e, HP_EFORMAT,
				  "'%s': last document index is %lld, not the sequence count %llu",
				  d->idx_path, (long long)last, (unsigned long long)d->nseq);
	return 0;
}

int hp_indexed_open(struct hp_indexed *d, const char *prefix, struct hp_err *e)
{
	int rc;

	memset(d, 0, sizeof(*d));
	d->prefix = hp_strdup(prefix);
	d->idx_path = path_cat(prefix, ".idx");
	d->bin_path = path_cat(prefix, ".bin");
	if (!d->prefix || !d->idx_path || !d->bin_path) {
		rc = hp_err_set(e, HP_ENOMEM, "'%s': out of memory opening indexed dataset", prefix);
		goto fail;
	}
	rc = map_file(d->idx_path, &d->idx_map, &d->idx_size, e);
	if (!rc)
		rc = check_header(d, e);
	if (!rc)
		rc = check_documents(d, e);
	if (!rc)
		rc = map_file(d->bin_path, &d->bin_map, &d->bin_size, e);
	if (!rc)
		rc = check_sequences(d, e);
	if (!rc)
		return 0;
fail:
	hp_indexed_close(d);
	return rc;
}

void hp_indexed_close(struct hp_indexed *d)
{
	if (!d)
		return;
	if (d->idx_map)
		munmap(d->idx_map, d->idx_size);
	if (d->bin_map)
		munmap(d->bin_map, d->bin_size);
	hp_free(d->prefix);
	hp_free(d->idx_path);
	hp_free(d->bin_path);
	memset(d, 0, sizeof(*d));
}

/*
 * Convert n stored ids starting at token first into dst.  Unsigned payloads
 * always fit; signed ones are checked for negative ids (never a token) and
 * int64 for values past INT32_MAX, which hp's int32 ids cannot hold.
 */
static int convert(const struct hp_indexed *d, uint64_t first, size_t n, int32_t *dst,
		   struct hp_err *e)
{
	/* an empty sequence reads nothing: an empty .bin is never mapped
	 * (bin_map NULL), and NULL + 0 is still undefined in C */
	if (!n)
		return 0;
	const unsigned char *p = (const unsigned char *)d->bin_map + first * d->elem_size;
	int64_t v = 0;

	for (size_t k = 0; k < n; k++, p += d->elem_size) {
		switch (d->dtype) {
		case HP_DTYPE_U8:  v = p[0]; break;
		case HP_DTYPE_I8:  v = (int8_t)p[0]; break;
		case HP_DTYPE_U16: v = (uint16_t)(p[0] | p[1] << 8); break;
		case HP_DTYPE_I16: v = (int16_t)(uint16_t)(p[0] | p[1] << 8); break;
		case HP_DTYPE_I32:
			v = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 |
				      (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
			break;
		case HP_DTYPE_I64: v = (int64_t)hp_indexed_le64_(p); break;
		default:
			return hp_err_set(e, HP_EINVAL, "'%s': dataset is not open", d->bin_path);
		}
		if (v < 0 || v > INT32_MAX)
			return hp_err_set(e, HP_EFORMAT, "'%s': token %llu is %lld, not a token id",
					  d->bin_path, (unsigned long long)(first + k), (long long)v);
		dst[k] = (int32_t)v;
	}
	return 0;
}

long hp_indexed_read(const struct hp_indexed *d, uint64_t i, int32_t *dst, size_t cap,
		     struct hp_err *e)
{
	int32_t len;
	int rc;

	if (i >= d->nseq)
		return hp_err_set(e, HP_EINVAL, "'%s': sequence %llu out of range (%llu sequences)",
				  d->idx_path, (unsigned long long)i, (unsigned long long)d->nseq);
	len = hp_indexed_seq_len(d, i);
	if ((size_t)len > cap)
		return hp_err_set(e, HP_EINVAL, "'%s': sequence %llu has %d tokens, buffer holds %zu",
				  d->idx_path, (unsigned long long)i, len, cap);
	rc = convert(d, (uint64_t)hp_indexed_seq_ptr(d, i) / d->elem_size, (size_t)len, dst, e);
	return rc ? rc : len;
}

int hp_indexed_read_tokens(const struct hp_indexed *d, uint64_t first, size_t n, int32_t *dst,
			   struct hp_err *e)
{
	if (first > d->ntok || n > d->ntok - first)
		return hp_err_set(e, HP_EINVAL, "'%s': tokens %llu..+%zu out of range (%llu tokens)",
				  d->bin_path, (unsigned long long)first, n,
				  (unsigned long long)d->ntok);
	return convert(d, first, n, dst, e);
}

/* ---- writer ---------------------------------------------------------- */

struct hp_indexed_writer {
	char *bin_path, *idx_path;    /* final names */
	struct hp_outfile bin, idx;   /* fileio.h: through temporaries, or streams in place */
	struct hp_outfile *cur;       /* the one being written, NULL when none */
	int failed;                   /* HP_E* of an earlier I/O failure, or 0 */
	int64_t vocab;
	int dtype_code;
	size_t elem_size;
	unsigned char *buf;           /* WBUF_SIZE bytes staged for cur */
	size_t used;
	uint64_t bytes;               /* payload bytes written to .bin so far */
	int32_t *len;                 /* seq_len so far */
	size_t nlen, cap_len;
	int64_t *doc;                 /* doc_idx so far, starting with 0 */
	size_t ndoc, cap_doc;
};

static int flush(struct hp_indexed_writer *w, struct hp_err *e)
{
	if (hp_write_all(w->cur->fd, w->buf, w->used))
		return hp_err_set(e, HP_EIO, "'%s': write failed: %s", w->cur->path, strerror(errno));
	w->used = 0;
	return 0;
}

static int put(struct hp_indexed_writer *w, const void *src, size_t n, struct hp_err *e)
{
	if (hp_buffered_put(w->cur->fd, w->buf, WBUF_SIZE, &w->used, src, n))
		return hp_err_set(e, HP_EIO, "'%s': write failed: %s", w->cur->path, strerror(errno));
	return 0;
}

static int put_le(struct hp_indexed_writer *w, uint64_t v, size_t size, struct hp_err *e)
{
	unsigned char b[8];

	for (size_t i = 0; i < size; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	return put(w, b, size, e);
}

/* Make room for one more element in a growing array. */
static int grow(void **arr, size_t *cap, size_t n, size_t elem)
{
	size_t c;
	void *p;

	if (n < *cap)
		return 0;
	c = *cap ? 2 * *cap : 1024;
	p = hp_realloc(*arr, c * elem);
	if (!p)
		return HP_ENOMEM;
	*arr = p;
	*cap = c;
	return 0;
}

static void writer_free(struct hp_indexed_writer *w)
{
	hp_outfile_abort(&w->bin);
	hp_outfile_abort(&w->idx);
	hp_free(w->bin_path);
	hp_free(w->idx_path);
	hp_free(w->buf);
	hp_free(w->len);
	hp_free(w->doc);
	hp_free(w);
}

int hp_indexed_writer_open(struct hp_indexed_writer **wp, const char *prefix, int64_t vocab_size,
			   struct hp_err *e)
{
	struct hp_indexed_writer *w;
	int rc;

	*wp = NULL;
	if (vocab_size < 1)
		return hp_err_set(e, HP_EINVAL, "'%s': vocab_size %lld must be positive", prefix,
				  (long long)vocab_size);
	w = hp_calloc(1, sizeof(*w));
	if (!w)
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory starting indexed dataset", prefix);
	w->bin.fd = w->idx.fd = -1;
	w->bin.slot = w->idx.slot = -1;
	w->vocab = vocab_size;
	w->dtype_code = hp_indexed_best_dtype(vocab_size);
	w->elem_size = w->dtype_code == 8 ? 2 : 4;
	w->bin_path = path_cat(prefix, ".bin");
	w->idx_path = path_cat(prefix, ".idx");
	w->buf = hp_malloc(WBUF_SIZE);
	if (!w->bin_path || !w->idx_path || !w->buf ||
	    grow((void **)&w->doc, &w->cap_doc, 0, sizeof(*w->doc))) {
		writer_free(w);
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory starting indexed dataset", prefix);
	}
	w->doc[w->ndoc++] = 0;
	if ((rc = hp_outfile_open(&w->bin, w->bin_path, e))) {
		writer_free(w);
		return rc;
	}
	w->cur = &w->bin;
	*wp = w;
	return 0;
}

int hp_indexed_writer_add(struct hp_indexed_writer *w, const int32_t *ids, size_t n,
			  struct hp_err *e)
{
	int rc;

	if (w->failed)
		return hp_err_set(e, w->failed, "'%s': writer failed earlier", w->bin_path);
	if (n > INT32_MAX)
		return hp_err_set(e, HP_EINVAL, "'%s': sequence of %zu tokens, the format's limit is %d",
				  w->bin_path, n, INT32_MAX);
	/* Pointers are int64 byte offsets. */
	if (n * w->elem_size > (uint64_t)INT64_MAX - w->bytes)
		return hp_err_set(e, HP_EINVAL, "'%s': dataset would exceed 2^63 bytes", w->bin_path);
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= w->vocab)
			return hp_err_set(e, HP_EINVAL,
					  "'%s': token id %d (position %zu) out of range for vocab_size %lld",
					  w->bin_path, ids[i], i, (long long)w->vocab);
	if (grow((void **)&w->len, &w->cap_len, w->nlen, sizeof(*w->len))) {
		w->failed = HP_ENOMEM;
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory adding a sequence", w->bin_path);
	}
	/* Encode straight into the buffer: this is the per-token hot loop. */
	for (size_t i = 0; i < n; i++) {
		uint32_t v = (uint32_t)ids[i];
		unsigned char *p;

		if (w->used + 4 > WBUF_SIZE && (rc = flush(w, e))) {
			w->failed = rc;
			return rc;
		}
		p = w->buf + w->used;
		p[0] = (unsigned char)v;
		p[1] = (unsigned char)(v >> 8);
		if (w->elem_size == 4) {
			p[2] = (unsigned char)(v >> 16);
			p[3] = (unsigned char)(v >> 24);
		}
		w->used += w->elem_size;
	}
	w->len[w->nlen++] = (int32_t)n;
	w->bytes += n * w->elem_size;
	return 0;
}

int hp_indexed_writer_end_document(struct hp_indexed_writer *w, struct hp_err *e)
{
	if (w->failed)
		return hp_err_set(e, w->failed, "'%s': writer failed earlier", w->bin_path);
	if (grow((void **)&w->doc, &w->cap_doc, w->ndoc, sizeof(*w->doc))) {
		w->failed = HP_ENOMEM;
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory ending a document", w->bin_path);
	}
	w->doc[w->ndoc++] = (int64_t)w->nlen;
	return 0;
}

static int write_index(struct hp_indexed_writer *w, struct hp_err *e)
{
	uint64_t ptr = 0;
	int rc;

	rc = put(w, magic, sizeof(magic), e);
	if (!rc)
		rc = put_le(w, 1, 8, e);
	if (!rc)
		rc = put_le(w, (uint64_t)w->dtype_code, 1, e);
	if (!rc)
		rc = put_le(w, w->nlen, 8, e);
	if (!rc)
		rc = put_le(w, w->ndoc, 8, e);
	for (size_t i = 0; !rc && i < w->nlen; i++)
		rc = put_le(w, (uint32_t)w->len[i], 4, e);
	for (size_t i = 0; !rc && i < w->nlen; i++) {
		rc = put_le(w, ptr, 8, e);
		ptr += (uint64_t)w->len[i] * w->elem_size;
	}
	for (size_t i = 0; !rc && i < w->ndoc; i++)
		rc = put_le(w, (uint64_t)w->doc[i], 8, e);
	return rc;
}

/* The index after the payload, then both into place (or, streams, closed):
 * the payload first, so that a new index never names an old payload. */
int hp_indexed_writer_finish(struct hp_indexed_writer *w, struct hp_err *e)
{
	int rc = 0;

	if (w->failed)
		rc = hp_err_set(e, w->failed, "'%s': writer failed earlier", w->bin_path);
	if (!rc && w->doc[w->ndoc - 1] != (int64_t)w->nlen)
		rc = hp_indexed_writer_end_document(w, e);
	if (!rc)
		rc = flush(w, e);
	if (!rc && !(rc = hp_outfile_open(&w->idx, w->idx_path, e))) {
		w->cur = &w->idx;
		rc = write_index(w, e);
	}
	if (!rc)
		rc = flush(w, e);
	if (!rc)
		rc = hp_outfile_commit(&w->bin, e);
	if (!rc)
		rc = hp_outfile_commit(&w->idx, e);
	writer_free(w);
	return rc;
}

void hp_indexed_writer_abort(struct hp_indexed_writer *w)
{
	if (w)
		writer_free(w);
}
