/*
 * test-indexed.c - unit tests of lib/format/indexed.c (Megatron MMIDIDX reader and
 * writer) and lib/data/batch.c (training rows cut from it).
 *
 * The format is pinned by comparing the writer's output with bytes spelled
 * out by hand from Megatron's _IndexWriter, not only by reading back what
 * we wrote; each corruption is made by patching one field of that reference
 * pair.  Failure paths: every allocation of open/writer/batcher is failed in
 * turn (run under ASan to see that none leaks).  Everything happens in a
 * fresh directory under $TMPDIR, removed at the end.
 */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "data/batch.h"
#include "format/indexed.h"
#include "../tap.h"

static char dir[4096];

/* dir/name in a static buffer (one at a time is all the tests need) */
static const char *at(const char *name)
{
	static char buf[2][4200];
	static int k;

	k ^= 1;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
	return buf[k];
}

static int write_bytes(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	int ok = f && fwrite(p, 1, n, f) == n;

	if (f && fclose(f))
		ok = 0;
	return ok ? 0 : -1;
}

/* Whole file into a malloc'd buffer; NULL if missing. */
static unsigned char *read_bytes(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	unsigned char *p = NULL;
	long len;

	*n = 0;
	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
		p = malloc((size_t)len + 1);
		if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
			free(p);
			p = NULL;
		}
		*n = (size_t)len;
	}
	fclose(f);
	return p;
}

static int copy_file(const char *from, const char *to)
{
	size_t n;
	unsigned char *p = read_bytes(from, &n);
	int rc = p ? write_bytes(to, p, n) : -1;

	free(p);
	return rc;
}

static int file_exists(const char *path)
{
	return access(path, F_OK) == 0;
}

/* Entries in dir other than . and .. */
static int count_entries(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

/* rc is want and the message contains sub; print both when not. */
static void is_err(int rc, int want, const struct hp_err *e, const char *sub, const char *what)
{
	int good = rc == want && strstr(e->msg, sub) != NULL;

	ok(good, "%s: %s", what, hp_err_name(want));
	if (!good)
		tap_diag("  got %d '%s', want %d with '%s'", rc, e->msg, want, sub);
}

/* ---- the reference dataset ---------------------------------------------
 *
 * Sequences [1 2 3] [4 5] in document 0 and [6] in document 1, vocab 100:
 * uint16.  These bytes are Megatron's layout written out by hand.
 */
static const int32_t ref_s0[] = { 1, 2, 3 }, ref_s1[] = { 4, 5 }, ref_s2[] = { 6 };

static const unsigned char ref_idx[] = {
	'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,   /* magic */
	1, 0, 0, 0, 0, 0, 0, 0,                    /* version 1, u64 */
	8,                                         /* dtype code: uint16 */
	3, 0, 0, 0, 0, 0, 0, 0,                    /* sequence count */
	3, 0, 0, 0, 0, 0, 0, 0,                    /* document count (2 docs + 1) */
	3, 0, 0, 0,  2, 0, 0, 0,  1, 0, 0, 0,      /* lengths, int32 */
	0, 0, 0, 0, 0, 0, 0, 0,                    /* pointers, int64 bytes */
	6, 0, 0, 0, 0, 0, 0, 0,
	10, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0,                    /* document indices, int64 */
	2, 0, 0, 0, 0, 0, 0, 0,
	3, 0, 0, 0, 0, 0, 0, 0,
};
static const unsigned char ref_bin[] = { 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0 };

/* Offsets of the fields in ref_idx. */
enum { OFF_VERSION = 9, OFF_DTYPE = 17, OFF_NSEQ = 18, OFF_NDOC = 26, OFF_LEN = 34,
       OFF_PTR = 34 + 12, OFF_DOC = 34 + 36 };

static int write_ref(const char *prefix, int close_last_doc)
{
	struct hp_indexed_writer *w;
	struct hp_err e;
	int rc;

	rc = hp_indexed_writer_open(&w, prefix, 100, &e);
	if (!rc)
		rc = hp_indexed_writer_add(w, ref_s0, 3, &e);
	if (!rc)
		rc = hp_indexed_writer_add(w, ref_s1, 2, &e);
	if (!rc)
		rc = hp_indexed_writer_end_document(w, &e);
	if (!rc)
		rc = hp_indexed_writer_add(w, ref_s2, 1, &e);
	if (!rc && close_last_doc)
		rc = hp_indexed_writer_end_document(w, &e);
	if (!rc)
		return hp_indexed_writer_finish(w, &e);
	if (w)
		hp_indexed_writer_abort(w);
	return rc;
}

static void test_reference_bytes(void)
{
	unsigned char *idx, *bin;
	size_t ni, nb;

	is_int(write_ref(at("ref"), 1), 0, "write the reference dataset");
	idx = read_bytes(at("ref.idx"), &ni);
	bin = read_bytes(at("ref.bin"), &nb);
	ok(idx && ni == sizeof(ref_idx) && !memcmp(idx, ref_idx, ni),
	   ".idx matches the hand-made Megatron bytes (%zu bytes)", ni);
	ok(bin && nb == sizeof(ref_bin) && !memcmp(bin, ref_bin, nb),
	   ".bin matches the hand-made uint16 payload (%zu bytes)", nb);
	free(idx);
	free(bin);

	/* A last document left open is closed by finish: same bytes. */
	is_int(write_ref(at("ref2"), 0), 0, "write without the last end_document");
	idx = read_bytes(at("ref2.idx"), &ni);
	ok(idx && ni == sizeof(ref_idx) && !memcmp(idx, ref_idx, ni),
	   "finish closes the open document");
	free(idx);
	is_int(count_entries(dir), 4, "only the four final files, no temporaries");
}

/* int32 payload: ids 70000 and 0 with vocab 100000, pinned byte for byte. */
static void test_reference_int32(void)
{
	static const unsigned char want_idx[] = {
		'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,  1, 0, 0, 0, 0, 0, 0, 0,
		4,                                      /* int32 */
		1, 0, 0, 0, 0, 0, 0, 0,  2, 0, 0, 0, 0, 0, 0, 0,
		2, 0, 0, 0,                             /* one sequence of 2 */
		0, 0, 0, 0, 0, 0, 0, 0,                 /* at byte 0 */
		0, 0, 0, 0, 0, 0, 0, 0,  1, 0, 0, 0, 0, 0, 0, 0,
	};
	/* 70000 = 0x00011170 */
	static const unsigned char want_bin[] = { 0x70, 0x11, 0x01, 0x00, 0, 0, 0, 0 };
	const int32_t ids[] = { 70000, 0 };
	struct hp_indexed_writer *w;
	struct hp_err e;
	unsigned char *idx, *bin;
	size_t ni, nb;
	int rc;

	rc = hp_indexed_writer_open(&w, at("ref32"), 100000, &e);
	if (!rc)
		rc = hp_indexed_writer_add(w, ids, 2, &e);
	if (!rc)
		rc = hp_indexed_writer_finish(w, &e);
	is_int(rc, 0, "write an int32 dataset");
	idx = read_bytes(at("ref32.idx"), &ni);
	bin = read_bytes(at("ref32.bin"), &nb);
	ok(idx && ni == sizeof(want_idx) && !memcmp(idx, want_idx, ni), "int32 .idx bytes");
	ok(bin && nb == sizeof(want_bin) && !memcmp(bin, want_bin, nb), "int32 .bin bytes");
	free(idx);
	free(bin);
}

static void test_best_dtype(void)
{
	is_int(hp_indexed_best_dtype(512), 8, "vocab 512 -> uint16");
	is_int(hp_indexed_best_dtype(65499), 8, "vocab 65499 -> uint16 (Megatron's < 65500)");
	is_int(hp_indexed_best_dtype(65500), 4, "vocab 65500 -> int32");
	is_int(hp_indexed_best_dtype(151936), 4, "vocab 151936 -> int32");
	is_str(hp_indexed_dtype_name(8), "uint16", "code 8 is uint16");
}

/* Write nseq pseudo-random sequences, one document each, and read them back. */
static void round_trip(int64_t vocab, int want_code, size_t want_elem)
{
	enum { NSEQ = 300 };
	static int32_t seqs[NSEQ][70];
	int lens[NSEQ];
	struct hp_indexed_writer *w;
	struct hp_indexed d;
	struct hp_err e;
	uint64_t x = 12345, ntok = 0;
	int32_t got[70];
	char prefix[64];
	int rc, same = 1;

	snprintf(prefix, sizeof(prefix), "rt%lld", (long long)vocab);
	for (int i = 0; i < NSEQ; i++) {
		lens[i] = i % 70;    /* includes empty sequences */
		for (int k = 0; k < lens[i]; k++) {
			x = x * 6364136223846793005ULL + 1442695040888963407ULL;
			seqs[i][k] = (int32_t)((x >> 33) % (uint64_t)vocab);
		}
		if (lens[i])
			seqs[i][0] = (int32_t)(vocab - 1);   /* the largest id survives */
		ntok += (uint64_t)lens[i];
	}
	rc = hp_indexed_writer_open(&w, at(prefix), vocab, &e);
	for (int i = 0; !rc && i < NSEQ; i++) {
		rc = hp_indexed_writer_add(w, seqs[i], (size_t)lens[i], &e);
		if (!rc)
			rc = hp_indexed_writer_end_document(w, &e);
	}
	if (!rc)
		rc = hp_indexed_writer_finish(w, &e);
	is_int(rc, 0, "vocab %lld: write %d sequences", (long long)vocab, NSEQ);
	rc = hp_indexed_open(&d, at(prefix), &e);
	is_int(rc, 0, "vocab %lld: open", (long long)vocab);
	if (rc) {
		tap_diag("  %s", e.msg);
		return;
	}
	is_int(d.dtype_code, want_code, "vocab %lld: dtype code", (long long)vocab);
	is_int(d.elem_size, want_elem, "vocab %lld: element size", (long long)vocab);
	is_int(d.nseq, NSEQ, "vocab %lld: sequence count", (long long)vocab);
	is_int(d.ndoc, NSEQ + 1, "vocab %lld: document count", (long long)vocab);
	is_int(d.ntok, ntok, "vocab %lld: token count", (long long)vocab);
	for (int i = 0; i < NSEQ; i++) {
		long n = hp_indexed_read(&d, (uint64_t)i, got, 70, &e);

		if (n != lens[i] || memcmp(got, seqs[i], (size_t)lens[i] * sizeof(*got)) ||
		    hp_indexed_doc_idx(&d, (uint64_t)i + 1) != i + 1) {
			tap_diag("  sequence %d differs (n %ld, want %d)", i, n, lens[i]);
			same = 0;
			break;
		}
	}
	ok(same, "vocab %lld: every sequence and document reads back", (long long)vocab);
	/* The stream view: tokens 0..2 are the start of sequence 1 (seq 0 is empty). */
	rc = hp_indexed_read_tokens(&d, 0, 3, got, &e);
	ok(!rc && got[0] == seqs[1][0] && got[1] == seqs[2][0] && got[2] == seqs[2][1],
	   "vocab %lld: read_tokens crosses sequence boundaries", (long long)vocab);
	is_err(hp_indexed_read_tokens(&d, ntok - 1, 2, got, &e), HP_EINVAL, &e, "out of range",
	       "read_tokens past the end");
	is_err((int)hp_indexed_read(&d, NSEQ, got, 70, &e), HP_EINVAL, &e, "out of range",
	       "read past the last sequence");
	is_err((int)hp_indexed_read(&d, 69, got, 68, &e), HP_EINVAL, &e, "buffer holds 68",
	       "read into a small buffer");
	hp_indexed_close(&d);
}

/* More payload than the writer's 64 KiB buffer, in odd-sized pieces, so
 * that flushes land in the middle of sequences. */
static void test_large(void)
{
	enum { N = 997, NSEQ = 101 };   /* 100697 int32 tokens, ~400 KiB */
	static int32_t buf[N];
	struct hp_indexed_writer *w;
	struct hp_indexed d;
	struct hp_err e;
	int rc, same = 1;

	rc = hp_indexed_writer_open(&w, at("large"), 1 << 20, &e);
	for (int i = 0; !rc && i < NSEQ; i++) {
		for (int k = 0; k < N; k++)
			buf[k] = i * N + k;
		rc = hp_indexed_writer_add(w, buf, N, &e);
	}
	if (!rc)
		rc = hp_indexed_writer_finish(w, &e);
	is_int(rc, 0, "large: write %d tokens", N * NSEQ);
	rc = hp_indexed_open(&d, at("large"), &e);
	is_int(rc, 0, "large: open");
	if (rc)
		return;
	for (uint64_t t = 0; same && t < d.ntok; t += N)
		if (hp_indexed_read_tokens(&d, t, N, buf, &e))
			same = 0;
		else
			for (int k = 0; k < N; k++)
				same &= buf[k] == (int32_t)t + k;
	ok(same && d.ntok == (uint64_t)N * NSEQ && d.ndoc == 2, "large: every token reads back");
	hp_indexed_close(&d);
}

/* ---- corruption --------------------------------------------------------- */

static void put_le(unsigned char *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/*
 * Write the reference pair as "bad", with the .idx patched at off (n bytes
 * of value v; n = 0 for none) and both files cut or extended to the sizes
 * given (0 keeps the size).  Then open it and check the error.
 */
static void corrupt(const char *what, size_t off, uint64_t v, int n, size_t idx_len,
		    size_t bin_len, int want, const char *sub)
{
	unsigned char idx[sizeof(ref_idx) + 16] = { 0 }, bin[sizeof(ref_bin) + 16] = { 0 };
	struct hp_indexed d;
	struct hp_err e;

	memcpy(idx, ref_idx, sizeof(ref_idx));
	memcpy(bin, ref_bin, sizeof(ref_bin));
	if (n)
		put_le(idx + off, v, n);
	if (write_bytes(at("bad.idx"), idx, idx_len ? idx_len : sizeof(ref_idx)) ||
	    write_bytes(at("bad.bin"), bin, bin_len ? bin_len : sizeof(ref_bin))) {
		ok(0, "%s: cannot write the test files", what);
		return;
	}
	hp_err_clear(&e);
	is_err(hp_indexed_open(&d, at("bad"), &e), want, &e, sub, what);
	if (want)
		ok(d.idx_map == NULL && d.prefix == NULL, "%s: d is left closed", what);
	hp_indexed_close(&d);
}

static void test_corruption(void)
{
	struct hp_indexed d;
	struct hp_err e;
	char want[4200];

	/* The unpatched pair opens: the patches below are the only problem. */
	corrupt("ref", 0, 0, 0, 0, 0, 0, "");
	corrupt("flipped magic", 0, 'N', 1, 0, 0, HP_EFORMAT,
		"bad.idx': bad magic (not a Megatron MMIDIDX index)");
	corrupt("version 2", OFF_VERSION, 2, 8, 0, 0, HP_EFORMAT, "version 2, only version 1");
	corrupt("dtype code 9", OFF_DTYPE, 9, 1, 0, 0, HP_EFORMAT, "unknown dtype code 9");
	corrupt("dtype code 0", OFF_DTYPE, 0, 1, 0, 0, HP_EFORMAT, "unknown dtype code 0");
	corrupt("float32 tokens", OFF_DTYPE, 7, 1, 0, 0, HP_EUNSUP, "float32 (code 7) is not supported");
	corrupt("uint8 reinterpretation", OFF_DTYPE, 1, 1, 0, 0, HP_EFORMAT,
		"sequence 1 starts at byte 6, expected 3");
	corrupt("idx shorter than the header", 0, 0, 0, 20, 0, HP_EFORMAT,
		"20 bytes, too short for the 34-byte header");
	corrupt("idx truncated by one byte", 0, 0, 0, sizeof(ref_idx) - 1, 0, HP_EFORMAT,
		"3 sequences and 3 document indices run past end of file (93 bytes)");
	corrupt("huge sequence count", OFF_NSEQ, UINT64_MAX, 8, 0, 0, HP_EFORMAT,
		"run past end of file");
	corrupt("huge document count", OFF_NDOC, UINT64_MAX / 4, 8, 0, 0, HP_EFORMAT,
		"run past end of file");
	corrupt("idx with a trailing byte", 0, 0, 0, sizeof(ref_idx) + 1, 0, HP_EFORMAT,
		"1 trailing bytes after the document indices");
	corrupt("bin truncated", 0, 0, 0, 0, sizeof(ref_bin) - 2, HP_EFORMAT,
		"bad.bin': sequence 2 ends at byte 12, past end of file (10 bytes)");
	corrupt("bin with extra bytes", 0, 0, 0, 0, sizeof(ref_bin) + 2, HP_EFORMAT,
		"bad.bin': 14 bytes, but the index describes 12");
	corrupt("negative length", OFF_LEN + 8, (uint32_t)-1, 4, 0, 0, HP_EFORMAT,
		"sequence 2 has negative length -1");
	corrupt("length too long", OFF_LEN + 8, 5, 4, 0, 0, HP_EFORMAT,
		"sequence 2 ends at byte 20, past end of file (12 bytes)");
	corrupt("bad pointer", OFF_PTR + 8, 4, 8, 0, 0, HP_EFORMAT,
		"sequence 1 starts at byte 4, expected 6 (sequences must be contiguous)");
	corrupt("first pointer not 0", OFF_PTR, 2, 8, 0, 0, HP_EFORMAT,
		"sequence 0 starts at byte 2, expected 0");
	corrupt("doc indices not starting at 0", OFF_DOC, 1, 8, 0, 0, HP_EFORMAT,
		"document indices start at 1, not 0");
	corrupt("doc index out of range", OFF_DOC + 8, 4, 8, 0, 0, HP_EFORMAT,
		"document index 1 is 4, outside the 3 sequences");
	corrupt("negative doc index", OFF_DOC + 8, (uint64_t)-1, 8, 0, 0, HP_EFORMAT,
		"document index 1 is -1");
	corrupt("decreasing doc indices", OFF_DOC + 16, 1, 8, 0, 0, HP_EFORMAT,
		"document index 2 is 1, less than the 2 before it");
	corrupt("last doc index short", OFF_DOC + 16, 2, 8, 0, 0, HP_EFORMAT,
		"last document index is 2, not the sequence count 3");
	/* No document indices at all: count 0 and the file cut to match. */
	corrupt("no doc indices", OFF_NDOC, 0, 8, OFF_DOC, 0, HP_EFORMAT, "no document indices");

	/* Missing files. */
	is_int(copy_file(at("ref.idx"), at("nobin.idx")), 0, "copy an .idx without its .bin");
	snprintf(want, sizeof(want), "'%s': cannot open: No such file or directory", at("nobin.bin"));
	is_err(hp_indexed_open(&d, at("nobin"), &e), HP_EIO, &e, want, "missing .bin");
	snprintf(want, sizeof(want), "'%s': cannot open: No such file or directory", at("none.idx"));
	is_err(hp_indexed_open(&d, at("none"), &e), HP_EIO, &e, want, "missing .idx");
	hp_indexed_close(&d);   /* harmless on a closed d */
}

/* A negative id in an int32 payload passes open and fails the read. */
static void test_bad_token(void)
{
	struct hp_indexed d;
	struct hp_err e;
	int32_t got[2];
	size_t nb;
	unsigned char *bin = read_bytes(at("ref32.bin"), &nb);
	int rc;

	if (!bin || nb != 8) {
		ok(0, "read ref32.bin");
		free(bin);
		return;
	}
	memset(bin + 4, 0xff, 4);   /* second id: -1 */
	write_bytes(at("neg.bin"), bin, nb);
	copy_file(at("ref32.idx"), at("neg.idx"));
	free(bin);
	rc = hp_indexed_open(&d, at("neg"), &e);
	is_int(rc, 0, "negative id: open succeeds (ids are not scanned)");
	if (rc)
		return;
	is_err((int)hp_indexed_read(&d, 0, got, 2, &e), HP_EFORMAT, &e, "token 1 is -1, not a token id",
	       "negative id: read fails");
	hp_indexed_close(&d);

	/* The batcher passes the error on and does not move its cursor. */
	{
		struct hp_batcher *b;
		uint64_t pos = 9, epoch = 9;
		int32_t in[1], lab[1];

		rc = hp_batcher_open(&b, at("neg"), 1, 0, &e);
		is_int(rc, 0, "negative id: batcher opens");
		if (rc)
			return;
		is_err(hp_batcher_next(b, 1, in, lab, NULL, &e), HP_EFORMAT, &e, "token 1 is -1",
		       "negative id: batcher_next fails");
		hp_batcher_cursor(b, &pos, &epoch);
		ok(pos == 0 && epoch == 0, "a failed batcher_next leaves the cursor at (0, 0)");
		hp_batcher_free(b);
	}
}

/* ---- writer failures ------------------------------------------------------ */

static void test_writer_failures(void)
{
	const int32_t ids[] = { 1, 2, 3 }, bad[] = { 1, 100, 2 }, neg[] = { -1 };
	struct hp_indexed_writer *w = (void *)1;
	struct hp_indexed d;
	struct hp_err e;
	char sub[64];
	int rc, before;

	mkdir(at("w"), 0777);
	rc = hp_indexed_writer_open(&w, at("w/x"), 100, &e);
	is_int(rc, 0, "abort: open");
	if (!rc) {
		hp_indexed_writer_add(w, ids, 3, &e);
		hp_indexed_writer_end_document(w, &e);
		is_int(count_entries(at("w")), 1, "abort: one temporary while writing");
		hp_indexed_writer_abort(w);
	}
	is_int(count_entries(at("w")), 0, "abort leaves no files");
	ok(!file_exists(at("w/x.bin")) && !file_exists(at("w/x.idx")), "abort: no final names either");
	hp_indexed_writer_abort(NULL);

	w = (void *)1;
	snprintf(sub, sizeof(sub), "cannot create: %s", strerror(ENOENT));
	before = count_entries(dir);
	is_err(hp_indexed_writer_open(&w, at("missing/x"), 100, &e), HP_EIO, &e, sub,
	       "writing into a missing directory");
	ok(w == NULL, "missing directory: *w is NULL");
	is_int(count_entries(dir), before, "missing directory: nothing created");
	is_err(hp_indexed_writer_open(&w, at("w/x"), 0, &e), HP_EINVAL, &e, "vocab_size 0",
	       "vocab_size 0 is rejected");

	rc = hp_indexed_writer_open(&w, at("w/y"), 100, &e);
	if (rc) {
		ok(0, "open w/y: %s", e.msg);
		return;
	}
	is_err(hp_indexed_writer_add(w, bad, 3, &e), HP_EINVAL, &e,
	       "token id 100 (position 1) out of range for vocab_size 100", "id == vocab rejected");
	is_err(hp_indexed_writer_add(w, neg, 1, &e), HP_EINVAL, &e, "token id -1",
	       "negative id rejected");
	is_int(hp_indexed_writer_add(w, ids, 3, &e), 0, "writer usable after a rejected sequence");
	is_int(hp_indexed_writer_finish(w, &e), 0, "finish after a rejected sequence");
	rc = hp_indexed_open(&d, at("w/y"), &e);
	ok(!rc && d.nseq == 1 && d.ntok == 3, "rejected sequences left no trace");
	if (!rc)
		hp_indexed_close(&d);
	is_int(count_entries(at("w")), 2, "finish leaves exactly .bin and .idx");
}

/* ---- batcher -------------------------------------------------------------- */

/* Sequences of the given lengths holding 0, 1, 2, ... in order (mod vocab). */
static int write_counting(const char *prefix, const int *lens, int nseq, int64_t vocab)
{
	struct hp_indexed_writer *w;
	struct hp_err e;
	int32_t buf[64];
	int32_t next = 0;
	int rc = hp_indexed_writer_open(&w, prefix, vocab, &e);

	for (int i = 0; !rc && i < nseq; i++) {
		for (int k = 0; k < lens[i]; k++)
			buf[k] = (int32_t)(next++ % vocab);
		rc = hp_indexed_writer_add(w, buf, (size_t)lens[i], &e);
		if (!rc && i % 2)
			rc = hp_indexed_writer_end_document(w, &e);
	}
	if (!rc)
		return hp_indexed_writer_finish(w, &e);
	hp_indexed_writer_abort(w);
	return rc;
}

/* Row r of a batch holds want[0..T) as inputs and want[1..T] as labels. */
static int row_is(const int32_t *in, const int32_t *lab, int T, int32_t first)
{
	for (int t = 0; t < T; t++)
		if (in[t] != first + t || lab[t] != first + t + 1)
			return 0;
	return 1;
}

static void test_batcher_mr(void)
{
	enum { T = 4 };
	const int lens[] = { 5, 5, 5, 5, 5 };
	struct hp_batcher *b;
	struct hp_err e;
	int32_t in[3 * T], lab[3 * T];
	uint64_t pos, epoch;
	int rc;

	is_int(write_counting(at("mr"), lens, 5, 1000), 0, "mr: write 5 records of T+1 = 5");
	rc = hp_batcher_open(&b, at("mr"), T, 1, &e);
	is_int(rc, 0, "mr: open");
	if (rc) {
		tap_diag("  %s", e.msg);
		return;
	}
	is_int(hp_batcher_rows_per_epoch(b), 5, "mr: 5 rows per epoch");
	rc = hp_batcher_next(b, 2, in, lab, NULL, &e);
	ok(!rc && row_is(in, lab, T, 0) && row_is(in + T, lab + T, T, 5),
	   "mr: rows 0, 1 are records 0, 1 (inputs rec[:-1], labels rec[1:])");
	rc = hp_batcher_next(b, 2, in, lab, NULL, &e);
	ok(!rc && row_is(in, lab, T, 10) && row_is(in + T, lab + T, T, 15), "mr: records 2, 3");
	hp_batcher_cursor(b, &pos, &epoch);
	ok(pos == 4 && epoch == 0, "mr: cursor (4, 0)");
	rc = hp_batcher_next(b, 3, in, lab, NULL, &e);
	ok(!rc && row_is(in, lab, T, 20) && row_is(in + T, lab + T, T, 0) &&
	   row_is(in + 2 * T, lab + 2 * T, T, 5), "mr: wraps around: records 4, 0, 1");
	hp_batcher_cursor(b, &pos, &epoch);
	ok(pos == 2 && epoch == 1, "mr: cursor (2, 1) after the wrap");
	is_err(hp_batcher_next(b, 0, in, lab, NULL, &e), HP_EINVAL, &e, "batch size 0", "mr: B = 0");
	hp_batcher_free(b);

	/* Same records, wrong seq_length. */
	is_err(hp_batcher_open(&b, at("mr"), 5, 1, &e), HP_EFORMAT, &e,
	       "mr.idx': record 0 has 5 tokens, expected seq_length+1 = 6", "mr: seq_length mismatch");
	ok(b == NULL, "mr: *b is NULL on failure");
}

static void test_batcher_bad_record(void)
{
	const int lens[] = { 5, 5, 3, 5 };

	is_int(write_counting(at("mrbad"), lens, 4, 1000), 0, "write records with a short one");
	{
		struct hp_batcher *b;
		struct hp_err e;

		is_err(hp_batcher_open(&b, at("mrbad"), 4, 1, &e), HP_EFORMAT, &e,
		       "mrbad.idx': record 2 has 3 tokens, expected seq_length+1 = 5 (is_dataset_from_mr)",
		       "wrong-length record names record, file and lengths");
		/* The same file is fine as a stream. */
		is_int(hp_batcher_open(&b, at("mrbad"), 4, 0, &e), 0, "stream mode takes any lengths");
		hp_batcher_free(b);
	}
}

static void test_batcher_stream(void)
{
	enum { T = 4 };
	/* 3 + 0 + 7 + 1 + 6 = 17 tokens: (17 - 1) / 4 = 4 windows. */
	const int lens[] = { 3, 0, 7, 1, 6 };
	struct hp_batcher *b;
	struct hp_err e;
	int32_t in[5 * T], lab[5 * T], in2[5 * T], lab2[5 * T];
	uint64_t pos, epoch;
	int rc, good = 1;

	is_int(write_counting(at("st"), lens, 5, 1000), 0, "stream: write 17 tokens");
	rc = hp_batcher_open(&b, at("st"), T, 0, &e);
	is_int(rc, 0, "stream: open");
	if (rc) {
		tap_diag("  %s", e.msg);
		return;
	}
	is_int(hp_batcher_rows_per_epoch(b), 4, "stream: (17 - 1) / 4 = 4 windows");
	rc = hp_batcher_next(b, 3, in, lab, NULL, &e);
	for (int r = 0; r < 3; r++)
		good &= row_is(in + r * T, lab + r * T, T, r * T);
	ok(!rc && good, "stream: window r is tokens [rT, rT+T], across sequence boundaries");
	hp_batcher_cursor(b, &pos, &epoch);
	rc = hp_batcher_next(b, 5, in, lab, NULL, &e);
	good = row_is(in, lab, T, 12);
	for (int r = 1; r < 5; r++)
		good &= row_is(in + r * T, lab + r * T, T, (r - 1) * T);
	ok(!rc && good, "stream: last window then wrap to window 0 (tail token 16 unused as input)");
	hp_batcher_cursor(b, &pos, &epoch);
	ok(pos == 0 && epoch == 2, "stream: cursor (0, 2) after two passes");

	/* Seek round trip: remember, read, go back, read again. */
	is_int(hp_batcher_seek(b, 3, 7, &e), 0, "seek to (3, 7)");
	hp_batcher_cursor(b, &pos, &epoch);
	ok(pos == 3 && epoch == 7, "cursor reads back (3, 7)");
	rc = hp_batcher_next(b, 5, in, lab, NULL, &e);
	is_int(hp_batcher_seek(b, pos, epoch, &e), 0, "seek back");
	rc |= hp_batcher_next(b, 5, in2, lab2, NULL, &e);
	ok(!rc && !memcmp(in, in2, sizeof(in)) && !memcmp(lab, lab2, sizeof(lab)),
	   "the same rows after seeking back");
	hp_batcher_cursor(b, &pos, &epoch);
	ok(pos == 0 && epoch == 9, "cursor (0, 9): 3 + 5 rows = two wraps");
	is_err(hp_batcher_seek(b, 4, 0, &e), HP_EFORMAT, &e, "cursor position 4 past the 4 rows",
	       "seek past an epoch");
	hp_batcher_cursor(b, &pos, &epoch);
	ok(pos == 0 && epoch == 9, "a failed seek leaves the cursor");
	hp_batcher_free(b);
	hp_batcher_free(NULL);

	is_err(hp_batcher_open(&b, at("st"), 17, 0, &e), HP_EFORMAT, &e,
	       "st.bin': 17 tokens, fewer than seq_length+1 = 18", "stream: too few tokens for one row");
	is_err(hp_batcher_open(&b, at("st"), 0, 0, &e), HP_EINVAL, &e, "seq_length 0",
	       "seq_length 0 is rejected");
	is_int(hp_batcher_open(&b, at("st"), 16, 0, &e), 0, "stream: exactly seq_length+1 tokens");
	if (b)
		is_int(hp_batcher_rows_per_epoch(b), 1, "stream: one row");
	hp_batcher_free(b);
}

/* ---- splits ----------------------------------------------------------------- */

/*
 * data_config.split.  The bounds are what Megatron's _get_split_indices
 * gives under Python 3.11 (its round is half to even: "1,0,1" of 5
 * documents rounds 2.5 down twice, and the train share takes up the 1).
 */
static void test_split(void)
{
	static const struct { const char *s; uint64_t n, b[4]; } cases[] = {
		{ "98,1,1", 884, { 0, 866, 875, 884 } },   { "969,30,1", 884, { 0, 856, 883, 884 } },
		{ "949/50/1", 884, { 0, 839, 883, 884 } }, { "1,1", 884, { 0, 442, 884, 884 } },
		{ "1,1,2", 10, { 0, 3, 5, 10 } },          { "98,1,1", 300, { 0, 294, 297, 300 } },
		{ "98,1,1", 3, { 0, 3, 3, 3 } },           { "5", 884, { 0, 884, 884, 884 } },
		{ "0,1,0", 884, { 0, 0, 884, 884 } },      { "1,0,1", 5, { 0, 3, 3, 5 } },
	};
	static const char *const bad[] = { "1,2,3,4", "a", "0,0,0", "-1,2", "1,,2", "1,", "", "nan" };
	struct hp_split sp;
	struct hp_err e;
	struct hp_batcher *b;
	int32_t in[4 * 4], lab[4 * 4];
	uint64_t bd[4], d0, nd, all;
	const int lens[] = { 5, 5, 5, 5, 5, 5, 5, 5, 5, 5 };

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc = hp_split_parse(&sp, cases[i].s, &e);

		if (!rc)
			hp_split_bounds(&sp, cases[i].n, bd);
		ok(!rc && !memcmp(bd, cases[i].b, sizeof(bd)), "split '%s' of %llu documents: [%llu, %llu, %llu, %llu]",
		   cases[i].s, (unsigned long long)cases[i].n, (unsigned long long)cases[i].b[0],
		   (unsigned long long)cases[i].b[1], (unsigned long long)cases[i].b[2],
		   (unsigned long long)cases[i].b[3]);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char what[64];

		snprintf(what, sizeof(what), "split '%s' is refused", bad[i]);
		is_err(hp_split_parse(&sp, bad[i], &e), HP_ECONFIG, &e, "split '", what);
	}

	/* 10 records of 5 in documents of two: split "1,0,1" of 5 documents
	 * gives train documents [0, 3) (records 0-5), no validation, test
	 * [3, 5) (records 6-9, tokens 30-49) */
	is_int(write_counting(at("sp"), lens, 10, 1000), 0, "split: write 10 records in 5 documents");
	if (hp_split_parse(&sp, "1,0,1", &e))
		return;
	is_int(hp_batcher_open_split(&b, at("sp"), 4, 1, &sp, HP_SPLIT_TRAIN, &e), 0, "split: train part opens");
	if (b) {
		hp_batcher_docs(b, &d0, &nd, &all);
		ok(hp_batcher_rows_per_epoch(b) == 6 && d0 == 0 && nd == 3 && all == 5,
		   "split: the train part is records 0-5 of documents [0, 3) of 5");
		is_int(hp_batcher_next(b, 4, in, lab, NULL, &e), 0, "split: train rows");
		is_int(hp_batcher_next(b, 4, in, lab, NULL, &e), 0, "split: train rows again");
		ok(row_is(in, lab, 4, 20) && row_is(in + 4, lab + 4, 4, 25) && row_is(in + 8, lab + 8, 4, 0),
		   "split: the train part wraps after record 5, not into record 6");
		hp_batcher_free(b);
	}
	is_int(hp_batcher_open_split(&b, at("sp"), 4, 1, &sp, HP_SPLIT_VALID, &e), 0, "split: an empty part opens");
	if (b) {
		is_int(hp_batcher_rows_per_epoch(b), 0, "split: with no rows");
		is_err(hp_batcher_next(b, 1, in, lab, NULL, &e), HP_EINVAL, &e, "the split has no rows",
		       "split: and serves none");
		hp_batcher_free(b);
	}
	is_int(hp_batcher_open_split(&b, at("sp"), 4, 1, &sp, HP_SPLIT_TEST, &e), 0, "split: test part opens");
	if (b) {
		ok(hp_batcher_rows_per_epoch(b) == 4 && !hp_batcher_next(b, 2, in, lab, NULL, &e) &&
		   row_is(in, lab, 4, 30) && row_is(in + 4, lab + 4, 4, 35), "split: the test part is records 6-9");
		hp_batcher_free(b);
	}
	/* the stream of the test part: tokens 30-49, windows from 30 */
	is_int(hp_batcher_open_split(&b, at("sp"), 4, 0, &sp, HP_SPLIT_TEST, &e), 0, "split: test stream opens");
	if (b) {
		ok(hp_batcher_rows_per_epoch(b) == 4 && !hp_batcher_next(b, 4, in, lab, NULL, &e) &&
		   row_is(in, lab, 4, 30) && row_is(in + 12, lab + 12, 4, 42),
		   "split: the test stream is windows of tokens 30-49: (20 - 1) / 4 = 4");
		hp_batcher_free(b);
	}
	if (!hp_split_parse(&sp, "0,1,0", &e))
		is_err(hp_batcher_open_split(&b, at("sp"), 4, 1, &sp, HP_SPLIT_TRAIN, &e), HP_EFORMAT, &e,
		       "no records in the train split (documents 0 to 0 of 5)", "split: an empty train part is an error");
}

/* ---- allocation failures -------------------------------------------------- */

static void test_alloc_failures(void)
{
	struct hp_indexed d;
	struct hp_batcher *b;
	struct hp_err e;
	int rc = HP_ENOMEM, all = 1;
	long k;

	for (k = 1; k < 100; k++) {
		hp_alloc_fail_at(k);
		rc = hp_indexed_open(&d, at("ref"), &e);
		if (rc != HP_ENOMEM)
			break;
	}
	hp_alloc_fail_at(0);
	ok(rc == 0 && k > 1, "indexed_open: allocations 1..%ld fail with HP_ENOMEM, then it opens", k - 1);
	hp_indexed_close(&d);

	for (k = 1; k < 100; k++) {
		hp_alloc_fail_at(k);
		rc = hp_batcher_open(&b, at("st"), 4, 0, &e);
		if (rc != HP_ENOMEM)
			break;
		all &= b == NULL;
	}
	hp_alloc_fail_at(0);
	ok(rc == 0 && k > 1 && all, "batcher_open: allocations 1..%ld fail with HP_ENOMEM", k - 1);
	hp_batcher_free(b);

	/* The writer: each failure leaves no file behind, and the success
	 * needs a sequence count past the first growth of the arrays. */
	mkdir(at("fa"), 0777);
	for (k = 1; k < 100; k++) {
		struct hp_indexed_writer *w;
		int32_t ids[2] = { 7, 8 };

		hp_alloc_fail_at(k);
		rc = hp_indexed_writer_open(&w, at("fa/x"), 100, &e);
		for (int i = 0; !rc && i < 1500; i++)
			rc = hp_indexed_writer_add(w, ids, 2, &e);
		if (!rc)
			rc = hp_indexed_writer_finish(w, &e);
		else if (w)
			hp_indexed_writer_abort(w);
		if (rc != HP_ENOMEM)
			break;
		all &= count_entries(at("fa")) == 0;
	}
	hp_alloc_fail_at(0);
	ok(rc == 0 && k > 1 && all, "writer: allocations 1..%ld fail with HP_ENOMEM, leaving no files",
	   k - 1);
	rc = hp_indexed_open(&d, at("fa/x"), &e);
	ok(!rc && d.nseq == 1500 && d.ndoc == 2, "writer: the successful run is complete");
	hp_indexed_close(&d);
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");

	snprintf(dir, sizeof(dir), "%s/hp-test-indexed.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir)) {
		printf("Bail out! mkdtemp '%s': %s\n", dir, strerror(errno));
		return 1;
	}
	test_reference_bytes();
	test_reference_int32();
	test_best_dtype();
	round_trip(512, 8, 2);
	round_trip(100000, 4, 4);
	test_large();
	test_corruption();
	test_bad_token();
	test_writer_failures();
	test_batcher_mr();
	test_batcher_bad_record();
	test_batcher_stream();
	test_split();
	test_alloc_failures();
	nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return tap_done();
}
