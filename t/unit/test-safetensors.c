/*
 * test-safetensors.c - unit tests for lib/format/safetensors.c, printing TAP.
 *
 * Covers the real stories260K checkpoints (F32 single file, BF16 in two
 * shards behind an index), a write -> open -> compare round trip, one
 * hand-made file per header check, every allocation failure of the reader,
 * the folder loader and the writer, index cross-checks and writer I/O
 * failures.  The allocation-failure walks run twice for the reader: once as
 * the library is normally used, and once with jansson routed through
 * hp_malloc so that failures inside the JSON parser are injected too.
 *
 * And a parameter's shape in HF files (lib/model/params.c,
 * hp_param_hf_shape): Gated DeltaNet's conv, [C, K] in hp, is written as
 * transformers' [C, 1, K] (hp_model_save_grads) and read back through the
 * readers' one shape check (hp_param_hf_check_shape), which accepts exactly
 * [C, 1, K] and refuses [C, K] and [C, 2, K / 2] by name.
 *
 * What this is not: a fuzzer (fuzz/fuzz-safetensors.c is) or a test of the
 * dtype conversions themselves (those are exact by construction in
 * lib/base/dtype.c; here they only serve as the expected values).
 *
 * Runs from any directory: data is found under $HP_SRC_DIR (default "."),
 * scratch files go under $TMPDIR (default /tmp) and are removed at the end.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "base/alloc.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "model/params.h"
#include "tap.h"

static const char *src_dir;
static const char *tmp_root;
static char scratch[4096];

/* ---- helpers ------------------------------------------------------------- */

/* Paths here are short; one that does not fit is a broken test setup. */
static void path_fmt(char *buf, size_t n, const char *a, const char *b)
{
	if (snprintf(buf, n, "%s/%s", a, b) >= (int)n)
		abort();
}

static int write_bytes(const char *path, const void *p, size_t n)
{
	FILE *fp = fopen(path, "wb");
	int rc;

	if (!fp)
		return -1;
	rc = fwrite(p, 1, n, fp) == n ? 0 : -1;
	if (fclose(fp))
		rc = -1;
	return rc;
}

static int write_text(const char *path, const char *s)
{
	return write_bytes(path, s, strlen(s));
}

/* A file image: 8-byte length, header, data_len zero bytes.  Caller frees. */
static unsigned char *make_image(uint64_t n, const char *hdr, size_t hdr_len,
				 size_t data_len, size_t *size)
{
	unsigned char *p;

	*size = 8 + hdr_len + data_len;
	p = calloc(1, *size);
	if (!p)
		abort();
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(n >> (8 * i));
	memcpy(p + 8, hdr, hdr_len);
	return p;
}

/* A fresh temporary file holding the bytes; its name goes into path. */
static int temp_file(char *path, size_t n, const void *p, size_t len)
{
	int fd;

	snprintf(path, n, "%s/hp-st-XXXXXX", tmp_root);
	fd = mkstemp(path);
	if (fd < 0)
		return -1;
	if (write(fd, p, len) != (ssize_t)len) {
		close(fd);
		unlink(path);
		return -1;
	}
	close(fd);
	return 0;
}

/* Entries in dir whose name starts with prefix (to catch left-over temps). */
static int count_prefix(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, prefix, strlen(prefix)))
			n++;
	closedir(d);
	return n;
}

static int is_closed(const struct hp_st_file *f)
{
	return !f->map && !f->path && !f->tensors && !f->ntensors && !f->nmeta && f->fd == -1;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		abort();
	return p;
}

/* ---- the real checkpoints ------------------------------------------------ */

static void test_real_f32(void)
{
	char path[4096];
	struct hp_st_file f;
	struct hp_err e;
	const struct hp_st_tensor *t;
	int64_t total = 0;
	int sorted = 1, rc;
	uint64_t n;

	path_fmt(path, sizeof(path), src_dir, "data/stories260K/hf/model.safetensors");
	rc = hp_st_open(&f, path, &e);
	if (!is_int(rc, 0, "open stories260K model.safetensors"))
		tap_diag("%s", e.msg);
	if (rc)
		return;
	is_int(f.ntensors, 47, "it has 47 tensors");
	for (size_t i = 0; i < f.ntensors; i++) {
		total += f.tensors[i].numel;
		if (i && strcmp(f.tensors[i - 1].name, f.tensors[i].name) >= 0)
			sorted = 0;
	}
	is_int(total, 260032, "holding 260032 parameters");
	ok(sorted, "tensors are sorted by name");
	t = hp_st_find(&f, "model.embed_tokens.weight");
	ok(t && t->dtype == HP_DTYPE_F32 && t->ndim == 2 && t->shape[0] == 512 &&
	   t->shape[1] == 64 && t->numel == 32768 && t->nbytes == 131072,
	   "model.embed_tokens.weight is F32 [512, 64]");
	n = 0;
	for (int i = 7; i >= 0; i--)
		n = (n << 8) | ((const unsigned char *)f.map)[i];
	ok(t && t->data == (const unsigned char *)f.map + 8 + n + t->begin,
	   "its data points into the mapping after the header");
	ok(!hp_st_find(&f, "lm_head.weight") && !hp_st_find(&f, "") &&
	   !hp_st_find(&f, "zzz"), "absent names are not found");
	ok(hp_st_meta(&f, "format") && !strcmp(hp_st_meta(&f, "format"), "pt"),
	   "__metadata__ format is pt");
	ok(!hp_st_meta(&f, "nope"), "absent metadata key is NULL");
	if (t) {
		float *v = xmalloc(t->nbytes);
		int nonzero = 0;

		rc = hp_st_read_f32(t, v, &e);
		for (int64_t i = 0; i < t->numel; i++)
			nonzero += v[i] != 0;
		ok(!rc && !memcmp(v, t->data, t->nbytes) && nonzero > 0,
		   "hp_st_read_f32 of an F32 tensor copies it");
		free(v);
	}
	hp_st_close(&f);
	ok(is_closed(&f), "close leaves the struct zeroed with fd -1");
	hp_st_close(&f);
	ok(is_closed(&f), "closing twice is safe");
}

static void test_real_sharded(void)
{
	char dir32[4096], dir16[4096], path[4096];
	struct hp_st_model m32, m16, m;
	struct hp_err e;
	long bad_meta = 0, bad_vals = 0, bad_read = 0, nvals = 0;
	int rc;

	path_fmt(dir32, sizeof(dir32), src_dir, "data/stories260K/hf");
	path_fmt(dir16, sizeof(dir16), src_dir, "data/stories260K/hf-bf16-sharded");
	rc = hp_st_model_open(&m32, dir32, &e);
	if (!is_int(rc, 0, "model_open on the F32 folder"))
		tap_diag("%s", e.msg);
	ok(!rc && m32.nfiles == 1 && m32.ntensors == 47, "one file, 47 tensors");
	rc = hp_st_model_open(&m16, dir16, &e);
	if (!is_int(rc, 0, "model_open on the BF16 sharded folder via its index"))
		tap_diag("%s", e.msg);
	ok(!rc && m16.nfiles == 2 && m16.ntensors == 47, "two shards, 47 tensors");
	if (rc || m32.ntensors != 47) {
		hp_st_model_close(&m32);
		hp_st_model_close(&m16);
		return;
	}
	for (size_t i = 0; i < m32.ntensors; i++) {
		const struct hp_st_tensor *a = m32.tensors[i];
		const struct hp_st_tensor *b = hp_st_model_find(&m16, a->name);
		float *va, *vb;

		if (!b || b->dtype != HP_DTYPE_BF16 || b->ndim != a->ndim || b->numel != a->numel ||
		    memcmp(a->shape, b->shape, sizeof(a->shape)) || 2 * b->nbytes != a->nbytes) {
			if (!bad_meta++)
				tap_diag("  first mismatch: '%s'", a->name);
			continue;
		}
		va = xmalloc(a->nbytes);
		vb = xmalloc(a->nbytes);
		if (hp_st_read_f32(a, va, &e) || hp_st_read_f32(b, vb, &e))
			bad_read++;
		for (int64_t j = 0; j < a->numel; j++) {
			uint16_t h;

			memcpy(&h, (const unsigned char *)b->data + 2 * j, 2);
			if (h != hp_f32_to_bf16(va[j]) || vb[j] != hp_bf16_to_f32(h)) {
				if (!bad_vals++)
					tap_diag("  '%s'[%lld]: bf16 0x%04x, f32 %g", a->name,
						 (long long)j, h, va[j]);
			}
			nvals++;
		}
		free(va);
		free(vb);
	}
	is_int(bad_meta, 0, "every F32 tensor has a BF16 twin of the same shape");
	is_int(bad_read, 0, "hp_st_read_f32 reads both");
	ok(!bad_vals && nvals == 260032, "all %ld BF16 values are bf16(F32 value)", nvals);

	path_fmt(path, sizeof(path), dir16, "model.safetensors.index.json");
	rc = hp_st_model_open(&m, path, &e);
	ok(!rc && m.ntensors == 47 && m.nfiles == 2, "model_open on the index file path");
	hp_st_model_close(&m);
	path_fmt(path, sizeof(path), dir32, "model.safetensors");
	rc = hp_st_model_open(&m, path, &e);
	ok(!rc && m.ntensors == 47 && m.nfiles == 1, "model_open on a .safetensors file path");
	hp_st_model_close(&m);
	path_fmt(path, sizeof(path), dir16, "/");
	rc = hp_st_model_open(&m, path, &e);
	ok(!rc && m.ntensors == 47 && !strcmp(m.dir, dir16), "trailing slashes are dropped from dir");
	hp_st_model_close(&m);
	hp_st_model_close(&m);
	ok(!m.files && !m.tensors && !m.dir, "model_close twice is safe");

	hp_st_model_close(&m32);
	hp_st_model_close(&m16);
}

/* ---- round trip -------------------------------------------------------- */

static void test_round_trip(void)
{
	float a[12], s = 3.25f, w = -1.0f, u = 7.5f;
	uint16_t b[5], c[6];
	int32_t ids[3] = { 1, -2, 3 };
	double d[3] = { 0.1, -2.5, 1e30 };
	struct hp_st_entry en[] = {
		{ "z.f32", HP_DTYPE_F32, 2, { 3, 4 }, a },
		{ "a.bf16", HP_DTYPE_BF16, 1, { 5 }, b },
		{ "m.f16", HP_DTYPE_F16, 3, { 2, 3, 1 }, c },
		{ "scalar", HP_DTYPE_F32, 0, { 0 }, &s },
		{ "empty", HP_DTYPE_F32, 2, { 0, 4 }, NULL },
		{ "we\"ird\\na\nme\t", HP_DTYPE_F32, 1, { 1 }, &w },
		{ "\xc3\xbcnic\xc3\xb8" "de", HP_DTYPE_F32, 1, { 1 }, &u },
		{ "ids", HP_DTYPE_I32, 1, { 3 }, ids },
		{ "dbl", HP_DTYPE_F64, 1, { 3 }, d },
	};
	const size_t n = sizeof(en) / sizeof(en[0]);
	const char *keys[] = { "format", "note" };
	const char *vals[] = { "pt", "say \"hi\"\n" };
	char path[4096];
	struct hp_st_file f;
	struct hp_err e;
	int rc, good = 1, packed = 1;
	uint64_t hlen = 0;

	for (int i = 0; i < 12; i++)
		a[i] = (float)i * 0.37f - 1.0f;
	for (int i = 0; i < 5; i++)
		b[i] = hp_f32_to_bf16((float)i / 3.0f);
	for (int i = 0; i < 6; i++)
		c[i] = hp_f32_to_f16(65504.0f / (float)(i + 1));
	path_fmt(path, sizeof(path), scratch, "rt.safetensors");

	rc = hp_st_write(path, n, en, 2, keys, vals, &e);
	if (!is_int(rc, 0, "write F32/BF16/F16/F64/I32 tensors with metadata"))
		tap_diag("%s", e.msg);
	is_int(count_prefix(scratch, "rt.safetensors.tmp"), 0, "no temporary is left behind");
	rc = hp_st_open(&f, path, &e);
	if (!is_int(rc, 0, "the written file opens"))
		tap_diag("%s", e.msg);
	if (rc)
		return;
	is_int(f.ntensors, n, "with every tensor");
	for (int i = 7; i >= 0; i--)
		hlen = (hlen << 8) | ((const unsigned char *)f.map)[i];
	is_int(hlen % 8, 0, "header is padded to a multiple of 8");
	ok(((const char *)f.map)[8] == '{' && ((const char *)f.map)[8 + hlen - 1] != '\0',
	   "header starts with '{'");
	ok(!memcmp((const char *)f.map + 8, "{\"__metadata__\":{\"format\":\"pt\"", 30),
	   "__metadata__ comes first, as the HF library writes it");
	/* Name order and data order agree, back to back, to the end of file. */
	for (size_t i = 0; i < f.ntensors; i++)
		if (f.tensors[i].begin != (i ? f.tensors[i - 1].end : 0))
			packed = 0;
	ok(packed && f.tensors[f.ntensors - 1].end == f.size - 8 - hlen,
	   "data is laid out in name order without gaps");
	for (size_t i = 0; i < n; i++) {
		const struct hp_st_tensor *t = hp_st_find(&f, en[i].name);
		size_t nb = 1;

		for (int k = 0; k < en[i].ndim; k++)
			nb *= (size_t)en[i].shape[k];
		nb *= hp_dtype_size(en[i].dtype);
		if (!t || t->dtype != en[i].dtype || t->ndim != en[i].ndim || t->nbytes != nb ||
		    memcmp(t->shape, en[i].shape, sizeof(int64_t) * (size_t)en[i].ndim) ||
		    (nb && memcmp(t->data, en[i].data, nb))) {
			tap_diag("  tensor %zu ('%s') differs", i, en[i].name);
			good = 0;
		}
	}
	ok(good, "every tensor reads back with its dtype, shape and bytes");
	ok(f.nmeta == 2 && hp_st_meta(&f, "format") && !strcmp(hp_st_meta(&f, "format"), "pt") &&
	   hp_st_meta(&f, "note") && !strcmp(hp_st_meta(&f, "note"), vals[1]),
	   "metadata reads back, escapes included");
	{
		const struct hp_st_tensor *t = hp_st_find(&f, "scalar");
		ok(t && t->ndim == 0 && t->numel == 1 && t->nbytes == 4, "a scalar has ndim 0, numel 1");
		t = hp_st_find(&f, "empty");
		ok(t && t->numel == 0 && t->nbytes == 0 && t->begin == t->end, "an empty tensor has no bytes");
	}
	{
		float v[12];
		const struct hp_st_tensor *t;
		int eq = 1;

		t = hp_st_find(&f, "a.bf16");
		rc = t ? hp_st_read_f32(t, v, &e) : -1;
		for (int i = 0; i < 5 && !rc; i++)
			eq &= v[i] == hp_bf16_to_f32(b[i]);
		ok(!rc && eq, "hp_st_read_f32 widens BF16");
		t = hp_st_find(&f, "m.f16");
		rc = t ? hp_st_read_f32(t, v, &e) : -1;
		for (int i = 0; i < 6 && !rc; i++)
			eq &= v[i] == hp_f16_to_f32(c[i]);
		ok(!rc && eq, "hp_st_read_f32 widens F16");
		t = hp_st_find(&f, "dbl");
		rc = t ? hp_st_read_f32(t, v, &e) : -1;
		for (int i = 0; i < 3 && !rc; i++)
			eq &= v[i] == (float)d[i];
		ok(!rc && eq, "hp_st_read_f32 rounds F64");
		t = hp_st_find(&f, "ids");
		rc = t ? hp_st_read_f32(t, v, &e) : 0;
		ok(rc == HP_EUNSUP && strstr(e.msg, "'ids'") && strstr(e.msg, "I32"),
		   "hp_st_read_f32 of I32 is HP_EUNSUP");
		t = hp_st_find(&f, "empty");
		ok(t && !hp_st_read_f32(t, v, &e), "hp_st_read_f32 of an empty tensor is a no-op");
	}
	hp_st_close(&f);

	/* Overwrite in place: the new file replaces the old one whole. */
	rc = hp_st_write(path, 1, en, 0, NULL, NULL, &e);
	ok(!rc && !hp_st_open(&f, path, &e) && f.ntensors == 1 && f.nmeta == 0 &&
	   hp_st_find(&f, "z.f32"), "writing over an existing file replaces it");
	hp_st_close(&f);
	rc = hp_st_write(path, 0, NULL, 0, NULL, NULL, &e);
	ok(!rc && !hp_st_open(&f, path, &e) && f.ntensors == 0, "a file with no tensors round-trips");
	hp_st_close(&f);
	unlink(path);
}

/* ---- hand-made bad files ----------------------------------------------- */

struct bad_header {
	const char *what;
	const char *hdr;
	size_t data_len;
	int code;
	const char *msg;
};

#define T1 "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]"

static const struct bad_header bad_headers[] = {
	{ "not json", "{\"a\":", 8, HP_EFORMAT, "header is not valid json" },
	{ "trailing garbage", "{}x", 0, HP_EFORMAT, "header is not valid json" },
	{ "invalid utf-8", "{\"\xff\":{" T1 "}}", 8, HP_EFORMAT, "header is not valid json" },
	{ "a json array", "[1, 2]", 0, HP_EFORMAT, "header is not a json object" },
	{ "a json string", "\"x\"", 0, HP_EFORMAT, "not valid json" },
	{ "duplicate names", "{\"a\":{" T1 "},\"a\":{" T1 "}}", 8, HP_EFORMAT, "duplicate key" },
	{ "entry not an object", "{\"a\":[1]}", 0, HP_EFORMAT, "tensor 'a' is not a json object" },
	{ "name with a newline", "{\"a\\nb\":3}", 0, HP_EFORMAT, "tensor 'a?b' is not a json object" },
	{ "no dtype", "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, HP_EFORMAT,
	  "tensor 'a' has no dtype" },
	{ "dtype not a string", "{\"a\":{\"dtype\":32,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
	  HP_EFORMAT, "tensor 'a' dtype is not a string" },
	{ "no shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, HP_EFORMAT,
	  "tensor 'a' has no shape" },
	{ "shape not an array", "{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
	  HP_EFORMAT, "tensor 'a' shape is not an array" },
	{ "no data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, HP_EFORMAT,
	  "tensor 'a' has no data_offsets" },
	{ "data_offsets of one", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8]}}", 8,
	  HP_EFORMAT, "data_offsets is not a pair of integers" },
	{ "data_offsets strings", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[\"0\",\"8\"]}}",
	  8, HP_EFORMAT, "data_offsets is not a pair of integers" },
	{ "data_offsets real", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.0]}}", 8,
	  HP_EFORMAT, "data_offsets is not a pair of integers" },
	{ "non-integer dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8,
	  HP_EFORMAT, "tensor 'a' shape[0] is not an integer" },
	{ "negative dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,8]}}", 8,
	  HP_EFORMAT, "tensor 'a' shape[1] is negative (-1)" },
	{ "element count overflow",
	  "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
	  HP_EFORMAT, "more elements than fit in 64 bits" },
	{ "byte count overflow",
	  "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}", 8,
	  HP_EFORMAT, "more bytes than fit in 64 bits" },
	{ "negative offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8,
	  HP_EFORMAT, "data_offsets [-8, 0] are negative" },
	{ "end before begin", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
	  HP_EFORMAT, "data_offsets [8, 0] end before they begin" },
	{ "end past the data",
	  "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[75],\"data_offsets\":[0,300]}}", 256,
	  HP_EFORMAT,
	  "tensor 'model.norm.weight' data_offsets [0, 300] run past the data section (256 bytes)" },
	{ "size mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24,
	  HP_EFORMAT, "data_offsets [0, 20] hold 20 bytes but shape [2, 3] of F32 needs 24" },
	{ "overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
	  "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24, HP_EFORMAT,
	  "tensors 'a' [0, 16] and 'b' [8, 24] overlap" },
	{ "overlap out of order", "{\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[20,24]},"
	  "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]},"
	  "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 24, HP_EFORMAT,
	  "tensors 'b' [8, 24] and 'c' [20, 24] overlap" },
	{ "unknown dtype", "{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
	  HP_EUNSUP, "tensor 'a' has unknown dtype 'F8_E4M3'" },
	/* the HF library's InvalidOffset and MetadataIncompleteBuffer */
	{ "a gap", "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
	  "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[16,19]}}", 19, HP_EFORMAT,
	  "bytes [4, 16) of the data section belong to no tensor (a gap before 'b')" },
	{ "a gap at the start", "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}", 8,
	  HP_EFORMAT, "bytes [0, 4) of the data section belong to no tensor (a gap before 'a')" },
	{ "trailing bytes", "{\"a\":{" T1 "}}", 64, HP_EFORMAT,
	  "56 trailing bytes after the last tensor (the tensors end at byte 8 of the 64-byte data section)" },
	{ "data but no tensors", "{}", 8, HP_EFORMAT, "8 trailing bytes after the last tensor" },
	{ "an empty tensor inside another", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
	  "\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[8,8]}}", 16, HP_EFORMAT,
	  "tensors 'a' [0, 16] and 'z' [8, 8] overlap" },
	{ "unknown dtype and a malformed entry",
	  "{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,1]},"
	  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, HP_EFORMAT,
	  "tensor 'b' data_offsets [0, 8] hold 8 bytes" },
	{ "too many dims", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}",
	  8, HP_EUNSUP, "tensor 'a' has 9 dimensions, more than the 8 supported" },
	{ "metadata not an object", "{\"__metadata__\":[\"pt\"]}", 0, HP_EFORMAT,
	  "__metadata__ is not a json object" },
	{ "metadata value not a string", "{\"__metadata__\":{\"format\":\"pt\",\"step\":3}}", 0,
	  HP_EFORMAT, "__metadata__ value for 'step' is not a string" },
};

/* Well-formed headers the reader accepts even though some writers would not
 * produce them. */
static const struct bad_header good_headers[] = {
	{ "empty object", "{}", 0, 0, NULL },
	{ "padded with spaces", "{\"a\":{" T1 "}}        ", 8, 0, NULL },
	{ "tensors out of name order", "{\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
	  "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[4,7]}}", 7, 0, NULL },
	{ "empty tensors at the ends", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
	  "\"y\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
	  "\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[16,16]}}", 16, 0, NULL },
	{ "unknown fields ignored", "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":1}}",
	  4, 0, NULL },
};

static void check_open_fails(const char *what, const void *img, size_t size, int code,
			     const char *msg)
{
	char path[4096], quoted[4200];
	struct hp_st_file f;
	struct hp_err e;
	int rc;

	if (temp_file(path, sizeof(path), img, size)) {
		ok(0, "%s: cannot make a temporary file: %s", what, strerror(errno));
		return;
	}
	hp_err_clear(&e);
	rc = hp_st_open(&f, path, &e);
	is_int(rc, code, "%s: %s", what, code ? hp_err_name(code) : "accepted");
	if (code) {
		snprintf(quoted, sizeof(quoted), "'%s': ", path);
		if (!ok(strstr(e.msg, msg) && !strncmp(e.msg, quoted, strlen(quoted)) &&
			!strchr(e.msg, '\n') && is_closed(&f), "%s: message and state", what))
			tap_diag("  message: %s", e.msg);
	}
	hp_st_close(&f);
	unlink(path);
}

static void test_bad_files(void)
{
	unsigned char *img;
	size_t size;

	for (size_t i = 0; i < sizeof(bad_headers) / sizeof(bad_headers[0]); i++) {
		const struct bad_header *b = &bad_headers[i];
		size_t hl = strlen(b->hdr);

		img = make_image(hl, b->hdr, hl, b->data_len, &size);
		check_open_fails(b->what, img, size, b->code, b->msg);
		free(img);
	}
	for (size_t i = 0; i < sizeof(good_headers) / sizeof(good_headers[0]); i++) {
		const struct bad_header *b = &good_headers[i];
		size_t hl = strlen(b->hdr);

		img = make_image(hl, b->hdr, hl, b->data_len, &size);
		check_open_fails(b->what, img, size, 0, NULL);
		free(img);
	}

	check_open_fails("empty file", "", 0, HP_EFORMAT,
			 "file is 0 bytes, shorter than the 8-byte header length");
	check_open_fails("5-byte file", "\x02\0\0\0\0", 5, HP_EFORMAT,
			 "file is 5 bytes, shorter than the 8-byte header length");
	img = make_image(100, "{}", 2, 8, &size);
	check_open_fails("header length past the end", img, size, HP_EFORMAT,
			 "header length 100 runs past the end of the file (18 bytes)");
	free(img);
	img = make_image(200000000, "{}", 2, 0, &size);
	check_open_fails("absurd header length", img, size, HP_EFORMAT,
			 "header length 200000000 is absurd (over 100000000 bytes)");
	free(img);
	img = make_image(UINT64_MAX, "{}", 2, 0, &size);
	check_open_fails("header length 2^64-1", img, size, HP_EFORMAT, "is absurd");
	free(img);
	img = make_image(0, "", 0, 0, &size);
	check_open_fails("header length 0", img, size, HP_EFORMAT, "header is not valid json");
	free(img);
	img = make_image(4, "{}\0\0", 4, 0, &size);
	check_open_fails("NUL padding", img, size, HP_EFORMAT, "header is not valid json");
	free(img);

	{
		char path[4096];
		struct hp_st_file f;
		struct hp_err e;
		int rc;

		path_fmt(path, sizeof(path), scratch, "does-not-exist.safetensors");
		rc = hp_st_open(&f, path, &e);
		ok(rc == HP_EIO && strstr(e.msg, "cannot open") && strstr(e.msg, path) && is_closed(&f),
		   "a missing file is HP_EIO");
		hp_st_close(&f);
		rc = hp_st_open(&f, scratch, &e);
		ok(rc == HP_EIO && strstr(e.msg, "not a regular file") && is_closed(&f),
		   "a folder is HP_EIO");
		hp_st_close(&f);
	}
	{
		/* The buffer-only parser: no path, no data. */
		static const char hdr[] = "{\"a\":{" T1 "}}";
		struct hp_st_file f;
		struct hp_err e;
		float v[2];
		int rc;

		memset(&f, 0, sizeof(f));
		rc = hp_st_parse_header(&f, "buf", hdr, strlen(hdr), 8, &e);
		ok(!rc && f.ntensors == 1 && !f.tensors[0].data && !f.path,
		   "hp_st_parse_header fills tensors without data");
		rc = rc ? 0 : hp_st_read_f32(&f.tensors[0], v, &e);
		ok(rc == HP_EINVAL && strstr(e.msg, "no data"), "hp_st_read_f32 without data is HP_EINVAL");
		hp_st_close(&f);
		rc = hp_st_parse_header(&f, "buf", hdr, strlen(hdr), 7, &e);
		ok(rc == HP_EFORMAT && !strncmp(e.msg, "'buf': ", 7) && !f.tensors && !f.ntensors,
		   "hp_st_parse_header names the buffer and leaves nothing on failure");
		hp_st_close(&f);
	}
}

/* ---- allocation failures ----------------------------------------------- */

/*
 * Each op runs one library call, records in op_allocs how many allocations
 * that call made and returns the call's code, except: 1 when the call
 * failed but left its struct open, 2 when it succeeded with wrong contents.
 */
typedef int (*op_fn)(const char *arg, struct hp_err *e);
static long op_allocs;

/* Set when an allocation made by jansson failed (see json_alloc). */
static int jansson_oom;

static void *json_alloc(size_t n)
{
	void *p = hp_malloc(n);

	if (!p)
		jansson_oom = 1;
	return p;
}

static int op_open(const char *path, struct hp_err *e)
{
	struct hp_st_file f;
	int rc = hp_st_open(&f, path, e);

	op_allocs = hp_alloc_count();
	if (rc && !is_closed(&f))
		rc = 1;
	if (!rc && (f.ntensors != 47 || f.nmeta != 1 || !hp_st_find(&f, "model.norm.weight")))
		rc = 2;
	hp_st_close(&f);
	return rc;
}

static int op_model(const char *dir, struct hp_err *e)
{
	struct hp_st_model m;
	int rc = hp_st_model_open(&m, dir, e);

	op_allocs = hp_alloc_count();
	if (rc && (m.files || m.tensors || m.dir || m.nfiles))
		rc = 1;
	if (!rc && (m.nfiles != 2 || m.ntensors != 47 || !hp_st_model_find(&m, "model.norm.weight")))
		rc = 2;
	hp_st_model_close(&m);
	return rc;
}

static int op_write(const char *path, struct hp_err *e)
{
	static const float v[4] = { 1, 2, 3, 4 };
	struct hp_st_entry en[3] = {
		{ "b", HP_DTYPE_F32, 1, { 4 }, v },
		{ "a", HP_DTYPE_BF16, 2, { 2, 2 }, v },
		{ "c\"", HP_DTYPE_F32, 0, { 0 }, v },
	};
	const char *k[] = { "format" }, *val[] = { "pt" };
	struct hp_st_file f;
	int rc = hp_st_write(path, 3, en, 1, k, val, e);

	op_allocs = hp_alloc_count();
	if (count_prefix(scratch, "oom.safetensors.tmp"))
		return 1;
	if (rc)
		return rc;
	/* Check what was written with failures off. */
	hp_alloc_fail_at(0);
	rc = hp_st_open(&f, path, e) || f.ntensors != 3 || !hp_st_find(&f, "c\"") ? 2 : 0;
	hp_st_close(&f);
	unlink(path);
	return rc;
}

/*
 * Fail allocation 1, 2, ..., N of op in turn, N counted on a clean run, and
 * check that every failure is a clean HP_ENOMEM; LeakSanitizer checks that
 * nothing leaks in the sanitizer build.  At most max_ok failures may be
 * harmless (op succeeded and its result checked out).
 *
 * With jansson routed through hp_malloc (via_jansson), a failure inside
 * jansson is held only to "no crash, no leak, struct closed": jansson 2.14
 * reports some of its out-of-memory conditions as syntax errors, and when
 * growing a string fails it silently drops the byte (a shard name came back
 * as "model-00001-of-00002.safetensos"), so the library cannot report those
 * as HP_ENOMEM.  This is why lib/ leaves jansson on the system allocator.
 */
static void walk_failures(const char *what, op_fn op, const char *arg, int via_jansson,
			  long max_ok)
{
	struct hp_err e;
	long n, k, bad = 0, masked = 0, harmless = 0;
	int rc;

	if (via_jansson)
		json_set_alloc_funcs(json_alloc, hp_free);
	else
		json_set_alloc_funcs(malloc, free);
	hp_alloc_fail_at(0);
	rc = op(arg, &e);
	n = op_allocs;
	if (!ok(!rc && n > 0, "%s: runs clean (%ld allocations)", what, n)) {
		tap_diag("  rc %d: %s", rc, e.msg);
		return;
	}
	for (k = 1; k <= n; k++) {
		hp_alloc_fail_at(k);
		hp_err_clear(&e);
		jansson_oom = 0;
		rc = op(arg, &e);
		hp_alloc_fail_at(0);
		if (rc == HP_ENOMEM && strstr(e.msg, "out of memory"))
			continue;
		if (jansson_oom && rc != 1) {
			masked++;
			continue;
		}
		if (rc == 0 && ++harmless <= max_ok)
			continue;
		if (!bad++)
			tap_diag("  allocation %ld of %ld: rc %d, '%s'", k, n, rc, e.msg);
	}
	hp_alloc_fail_at(n + 1);
	rc = op(arg, &e);
	hp_alloc_fail_at(0);
	ok(!bad && !rc, "%s: each of %ld allocation failures fails cleanly "
	   "(HP_ENOMEM but %ld harmless, %ld inside jansson)", what, n, harmless, masked);
	json_set_alloc_funcs(malloc, free);
}

static void test_alloc_failures(void)
{
	char path[4096], dir[4096];

	path_fmt(path, sizeof(path), src_dir, "data/stories260K/hf/model.safetensors");
	path_fmt(dir, sizeof(dir), src_dir, "data/stories260K/hf-bf16-sharded");
	walk_failures("hp_st_open", op_open, path, 0, 0);
	walk_failures("hp_st_model_open (index)", op_model, dir, 0, 0);
	walk_failures("hp_st_open, jansson failing too", op_open, path, 1, 0);
	walk_failures("hp_st_model_open, jansson failing too", op_model, dir, 1, 0);
	path_fmt(path, sizeof(path), scratch, "oom.safetensors");
	/* The one harmless failure: the best-effort sync of the folder. */
	walk_failures("hp_st_write", op_write, path, 0, 1);
	ok(count_prefix(scratch, "oom.safetensors") == 0, "no file left by failed writes");
}

/* ---- index checks ------------------------------------------------------ */

static void index_case(const char *what, const char *dir, const char *json, int code,
		       const char *msg1, const char *msg2)
{
	char path[4096];
	struct hp_st_model m;
	struct hp_err e;
	int rc;

	path_fmt(path, sizeof(path), dir, "model.safetensors.index.json");
	if (json && write_text(path, json)) {
		ok(0, "%s: cannot write the index", what);
		return;
	}
	hp_err_clear(&e);
	rc = hp_st_model_open(&m, dir, &e);
	is_int(rc, code, "index %s: %s", what, code ? hp_err_name(code) : "accepted");
	if (code && !ok(strstr(e.msg, msg1) && (!msg2 || strstr(e.msg, msg2)) && !m.files &&
			!m.dir && !m.tensors, "index %s: message", what))
		tap_diag("  message: %s", e.msg);
	if (!code)
		ok(m.nfiles == 2 && m.ntensors == 3 && hp_st_model_find(&m, "t3") &&
		   hp_st_model_find(&m, "t3")->dtype == HP_DTYPE_BF16 && !hp_st_model_find(&m, "t4"),
		   "index %s: two shards, three tensors", what);
	hp_st_model_close(&m);
}

#define WM_GOOD "\"t1\":\"a.safetensors\",\"t2\":\"a.safetensors\",\"t3\":\"b.safetensors\""

static void test_index(void)
{
	static const float v[4] = { 1, 2, 3, 4 };
	struct hp_st_entry a[] = {
		{ "t1", HP_DTYPE_F32, 1, { 2 }, v },
		{ "t2", HP_DTYPE_F32, 1, { 3 }, v },
	};
	struct hp_st_entry b[] = { { "t3", HP_DTYPE_BF16, 1, { 4 }, v } };
	char dir[4096], path[4096];
	struct hp_st_model m;
	struct hp_err e;
	int rc;

	path_fmt(dir, sizeof(dir), scratch, "sharded");
	if (mkdir(dir, 0755)) {
		ok(0, "mkdir %s: %s", dir, strerror(errno));
		return;
	}
	path_fmt(path, sizeof(path), dir, "a.safetensors");
	rc = hp_st_write(path, 2, a, 0, NULL, NULL, &e);
	path_fmt(path, sizeof(path), dir, "b.safetensors");
	rc = rc ? rc : hp_st_write(path, 1, b, 0, NULL, NULL, &e);
	if (!is_int(rc, 0, "write two shards"))
		tap_diag("%s", e.msg);

	rc = hp_st_model_open(&m, dir, &e);
	ok(rc == HP_EIO && strstr(e.msg, "neither model.safetensors nor"),
	   "a folder with no model file is HP_EIO");
	hp_st_model_close(&m);

	index_case("good", dir, "{\"metadata\":{\"total_size\":28},\"weight_map\":{" WM_GOOD "}}",
		   0, NULL, NULL);
	index_case("without metadata", dir, "{\"weight_map\":{" WM_GOOD "}}", 0, NULL, NULL);
	index_case("missing shard", dir, "{\"weight_map\":{\"t1\":\"a.safetensors\","
		   "\"t2\":\"a.safetensors\",\"t3\":\"c.safetensors\"}}", HP_EIO,
		   "shard 'c.safetensors' named in weight_map is missing", "model.safetensors.index.json': ");
	index_case("tensor missing from weight_map", dir,
		   "{\"weight_map\":{\"t1\":\"a.safetensors\",\"t3\":\"b.safetensors\"}}", HP_EFORMAT,
		   "tensor 't2' of shard 'a.safetensors' is missing from weight_map", NULL);
	index_case("tensor missing from its shard", dir,
		   "{\"weight_map\":{" WM_GOOD ",\"t4\":\"b.safetensors\"}}", HP_EFORMAT,
		   "weight_map puts tensor 't4' in 'b.safetensors' but that shard does not have it", NULL);
	index_case("tensor in the wrong shard", dir,
		   "{\"weight_map\":{\"t1\":\"a.safetensors\",\"t2\":\"b.safetensors\","
		   "\"t3\":\"b.safetensors\"}}", HP_EFORMAT,
		   "weight_map puts tensor 't2' in 'b.safetensors'", NULL);
	index_case("wrong total_size", dir,
		   "{\"metadata\":{\"total_size\":29},\"weight_map\":{" WM_GOOD "}}", HP_EFORMAT,
		   "metadata.total_size 29 does not match the 28 bytes", NULL);
	index_case("total_size a string", dir,
		   "{\"metadata\":{\"total_size\":\"28\"},\"weight_map\":{" WM_GOOD "}}", HP_EFORMAT,
		   "total_size is not an integer", NULL);
	index_case("no weight_map", dir, "{\"metadata\":{}}", HP_EFORMAT, "has no weight_map", NULL);
	index_case("weight_map an array", dir, "{\"weight_map\":[]}", HP_EFORMAT,
		   "weight_map is not a json object", NULL);
	index_case("file name not a string", dir, "{\"weight_map\":{\"t1\":1}}", HP_EFORMAT,
		   "weight_map entry for tensor 't1' is not a file name", NULL);
	index_case("not json", dir, "{\"weight_map\":", HP_EFORMAT, "index is not valid json", NULL);
	index_case("duplicate key", dir, "{\"weight_map\":{" WM_GOOD ",\"t1\":\"a.safetensors\"}}",
		   HP_EFORMAT, "index has a duplicate key", NULL);
	index_case("not an object", dir, "[]", HP_EFORMAT, "index is not a json object", NULL);

	/* A malformed shard is reported by its own name. */
	path_fmt(path, sizeof(path), dir, "c.safetensors");
	write_bytes(path, "\x04\0\0\0\0\0\0\0{]  ", 12);
	index_case("malformed shard", dir, "{\"weight_map\":{" WM_GOOD ",\"t9\":\"c.safetensors\"}}",
		   HP_EFORMAT, "c.safetensors': header is not valid json", NULL);
	unlink(path);

	path_fmt(path, sizeof(path), dir, "model.safetensors.index.json");
	unlink(path);
	path_fmt(path, sizeof(path), dir, "a.safetensors");
	unlink(path);
	path_fmt(path, sizeof(path), dir, "b.safetensors");
	unlink(path);
	rmdir(dir);

	path_fmt(path, sizeof(path), scratch, "nothing-here");
	rc = hp_st_model_open(&m, path, &e);
	ok(rc == HP_EIO && strstr(e.msg, "nothing-here': cannot open"), "a missing model path is HP_EIO");
	hp_st_model_close(&m);
}

/* ---- writer failures --------------------------------------------------- */

static void test_write_failures(void)
{
	static const float v[4] = { 1, 2, 3, 4 };
	struct hp_st_entry en[2] = {
		{ "a", HP_DTYPE_F32, 1, { 4 }, v },
		{ "a", HP_DTYPE_F32, 1, { 4 }, v },
	};
	char dir[4096], path[4096];
	struct hp_err e;
	int rc, status;
	pid_t pid;

	path_fmt(dir, sizeof(dir), scratch, "no-such-dir");
	path_fmt(path, sizeof(path), dir, "x.safetensors");
	rc = hp_st_write(path, 1, en, 0, NULL, NULL, &e);
	ok(rc == HP_EIO && strstr(e.msg, "cannot create") && strstr(e.msg, path),
	   "writing into a missing folder is HP_EIO");
	ok(access(dir, F_OK) && access(path, F_OK), "and leaves nothing behind");

	path_fmt(path, sizeof(path), scratch, "inval.safetensors");
	rc = hp_st_write(path, 2, en, 0, NULL, NULL, &e);
	ok(rc == HP_EINVAL && strstr(e.msg, "'a' given twice"), "duplicate names are HP_EINVAL");
	en[1].name = "__metadata__";
	rc = hp_st_write(path, 2, en, 0, NULL, NULL, &e);
	ok(rc == HP_EINVAL, "the name __metadata__ is HP_EINVAL");
	en[1].name = "\xc0\xaf";
	rc = hp_st_write(path, 2, en, 0, NULL, NULL, &e);
	ok(rc == HP_EINVAL, "a name that is not UTF-8 is HP_EINVAL");
	en[1].name = "b";
	en[1].dtype = HP_DTYPE_INVALID;
	rc = hp_st_write(path, 2, en, 0, NULL, NULL, &e);
	ok(rc == HP_EINVAL, "an invalid dtype is HP_EINVAL");
	en[1].dtype = HP_DTYPE_F32;
	en[1].shape[0] = -1;
	rc = hp_st_write(path, 2, en, 0, NULL, NULL, &e);
	ok(rc == HP_EINVAL, "a negative dimension is HP_EINVAL");
	en[1].shape[0] = 4;
	{
		const char *k[] = { "x", "x" }, *val[] = { "1", "2" };

		rc = hp_st_write(path, 2, en, 2, k, val, &e);
		ok(rc == HP_EINVAL && strstr(e.msg, "'x' given twice"), "a repeated metadata key is HP_EINVAL");
	}
	ok(access(path, F_OK) && !count_prefix(scratch, "inval.safetensors"),
	   "invalid arguments create nothing");

	/*
	 * A write that fails half way (file size limit, in a child so the limit
	 * does not outlive it): HP_EIO, no temporary, the old file untouched.
	 */
	path_fmt(path, sizeof(path), scratch, "full.safetensors");
	write_text(path, "old contents");
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct rlimit rl = { 65536, 65536 };
		size_t n = 1 << 20;
		float *big = calloc(n, sizeof(float));
		struct hp_st_entry one = { "big", HP_DTYPE_F32, 1, { (int64_t)n }, big };
		char buf[64] = { 0 };
		FILE *fp;

		signal(SIGXFSZ, SIG_IGN);
		if (!big || setrlimit(RLIMIT_FSIZE, &rl))
			_exit(2);
		rc = hp_st_write(path, 1, &one, 0, NULL, NULL, &e);
		free(big);
		if (rc != HP_EIO || !strstr(e.msg, "cannot write"))
			_exit(3);
		if (count_prefix(scratch, "full.safetensors.tmp"))
			_exit(4);
		fp = fopen(path, "r");
		if (!fp || !fgets(buf, sizeof(buf), fp) || strcmp(buf, "old contents"))
			_exit(5);
		fclose(fp);
		_exit(0);
	}
	status = -1;
	if (pid > 0)
		waitpid(pid, &status, 0);
	if (!ok(pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
		"a write that fails half way is HP_EIO, removes its temporary, keeps the old file"))
		tap_diag("  child status %d", status);
	unlink(path);
}

/* ---- a parameter's shape in HF files ------------------------------------- */

#define CONV "model.layers.0.linear_attn.conv1d.weight"

/* The shape check of the HF readers on a one-tensor file holding CONV as
 * ndim dims: 0 or its error, message in e. */
static int conv_check(const char *what, int ndim, const int64_t *shape, const float *data, struct hp_err *e)
{
	struct hp_st_entry en = { CONV, HP_DTYPE_F32, ndim, { 0 }, data };
	const int64_t hp[2] = { 6, 4 };
	struct hp_st_model st;
	char path[4096];
	int rc;

	memcpy(en.shape, shape, (size_t)ndim * sizeof(*shape));
	path_fmt(path, sizeof(path), scratch, what);
	if ((rc = hp_st_write(path, 1, &en, 0, NULL, NULL, e)) || (rc = hp_st_model_open(&st, path, e)))
		return rc;
	rc = hp_param_hf_check_shape(hp_st_model_find(&st, CONV), CONV, 2, hp, "conv", "config.json implies", e);
	hp_st_model_close(&st);
	unlink(path);
	return rc;
}

static void test_hf_shapes(void)
{
	static const int64_t s64[2] = { 6, 4 }, s1[2] = { 6, 0 }, c3[3] = { 6, 1, 4 }, c2[2] = { 6, 4 },
			     c3b[3] = { 6, 2, 2 };
	int64_t out[3] = { -1, -1, -1 };
	float g[24], norm[6], back[24];
	struct hp_param ps[2] = { { .name = CONV, .ndim = 2, .shape = { 6, 4 }, .numel = 24, .g = g },
				  { .name = "model.layers.0.input_layernorm.weight", .ndim = 1, .shape = { 6, 1 },
				    .numel = 6, .g = norm } };
	struct hp_model *m = calloc(1, sizeof(*m));
	struct hp_st_file f = { .fd = -1 };
	const struct hp_st_tensor *t;
	char path[4096];
	struct hp_err e;
	int rc;

	/* the mapping: the conv's 2-D weight only */
	is_int(hp_param_hf_shape(CONV, 2, s64, out), 3, "hp_param_hf_shape: " CONV " [6, 4] is 3-D in the checkpoint");
	ok(out[0] == 6 && out[1] == 1 && out[2] == 4, "... as [6, 1, 4] (got [%lld, %lld, %lld])", (long long)out[0],
	   (long long)out[1], (long long)out[2]);
	out[0] = out[1] = out[2] = -1;
	ok(hp_param_hf_shape("model.layers.0.linear_attn.in_proj_qkvz.weight", 2, s64, out) == 2 && out[0] == 6 &&
	   out[1] == 4 && out[2] == -1, "hp_param_hf_shape: another 2-D parameter keeps its shape");
	ok(hp_param_hf_shape("model.layers.3.self_attn.conv1d.weight", 2, s64, out) == 2 &&
	   hp_param_hf_shape("model.layers.0.linear_attn.conv1d.weight.x", 2, s64, out) == 2 &&
	   hp_param_hf_shape(".linear_attn.conv1d.weight", 2, s64, out) == 2,
	   "hp_param_hf_shape: only a name ending in .linear_attn.conv1d.weight, after something, maps");
	out[0] = out[1] = -1;
	ok(hp_param_hf_shape(CONV, 1, s1, out) == 1 && out[0] == 6,
	   "hp_param_hf_shape: a 1-D tensor of that name is left alone");

	/* the writer: gradients in the checkpoint's shape, the same bytes */
	for (int i = 0; i < 24; i++)
		g[i] = (float)i * 0.25f - 2.0f;
	for (int i = 0; i < 6; i++)
		norm[i] = (float)i + 0.5f;
	if (!m)
		abort();
	m->w.nparams = 2;
	m->w.params = ps;
	path_fmt(path, sizeof(path), scratch, "grads.safetensors");
	rc = hp_model_save_grads(m, path, 0, NULL, NULL, &e);
	if (!is_int(rc, 0, "hp_model_save_grads writes a conv weight's gradient"))
		tap_diag("%s", e.msg);
	rc = rc ? rc : hp_st_open(&f, path, &e);
	t = rc ? NULL : hp_st_find(&f, CONV);
	ok(t && t->ndim == 3 && t->shape[0] == 6 && t->shape[1] == 1 && t->shape[2] == 4,
	   "... as [6, 1, 4], transformers' shape");
	ok(t && !hp_st_read_f32(t, back, &e) && !memcmp(back, g, sizeof(g)), "... holding hp's [6, 4] bytes in order");
	t = rc ? NULL : hp_st_find(&f, ps[1].name);
	ok(t && t->ndim == 1 && t->shape[0] == 6, "... and a norm's as [6]");
	if (!rc) {
		/* what was written is what the readers accept */
		struct hp_st_model st;

		if (!hp_st_model_open(&st, path, &e)) {
			is_int(hp_param_hf_check_shape(hp_st_model_find(&st, CONV), CONV, 2, ps[0].shape, path,
						       "config.json implies", &e),
			       0, "the readers' shape check accepts the dumped conv gradient");
			hp_st_model_close(&st);
		} else {
			ok(0, "the dumped file opens as a folder: %s", e.msg);
		}
	}
	hp_st_close(&f);
	unlink(path);
	free(m);

	/* the readers: exactly [6, 1, 4], refusals naming tensor and shapes */
	rc = conv_check("c3.safetensors", 3, c3, g, &e);
	if (!is_int(rc, 0, "the HF readers' shape check accepts " CONV " as [6, 1, 4] for hp's [6, 4]"))
		tap_diag("%s", e.msg);
	rc = conv_check("c2.safetensors", 2, c2, g, &e);
	ok(rc == HP_EFORMAT && strstr(e.msg, "tensor '" CONV "' has shape [6, 4], config.json implies [6, 1, 4]"),
	   "... refuses it as [6, 4], naming it and the shape expected");
	if (rc != HP_EFORMAT || !strstr(e.msg, "[6, 1, 4]"))
		tap_diag("rc %d: %s", rc, rc ? e.msg : "");
	rc = conv_check("c3b.safetensors", 3, c3b, g, &e);
	ok(rc == HP_EFORMAT && strstr(e.msg, "tensor '" CONV "' has shape [6, 2, 2], config.json implies [6, 1, 4]"),
	   "... and as [6, 2, 2]");
	if (rc != HP_EFORMAT || !strstr(e.msg, "[6, 1, 4]"))
		tap_diag("rc %d: %s", rc, rc ? e.msg : "");
	/* any other parameter: exactly hp's shape, as before */
	{
		struct hp_st_entry en = { "model.layers.0.mlp.up_proj.weight", HP_DTYPE_F32, 3, { 6, 1, 4 }, g };
		struct hp_st_model st;

		path_fmt(path, sizeof(path), scratch, "up.safetensors");
		rc = hp_st_write(path, 1, &en, 0, NULL, NULL, &e);
		if (!rc && !(rc = hp_st_model_open(&st, path, &e))) {
			rc = hp_param_hf_check_shape(hp_st_model_find(&st, en.name), en.name, 2, s64, "up",
						     "the plan's model needs", &e);
			hp_st_model_close(&st);
		}
		ok(rc == HP_EFORMAT && strstr(e.msg, "'up': tensor 'model.layers.0.mlp.up_proj.weight' has shape "
					      "[6, 1, 4], the plan's model needs [6, 4]"),
		   "another parameter as [6, 1, 4] is refused: only the conv maps");
		unlink(path);
	}
}

int main(void)
{
	src_dir = getenv("HP_SRC_DIR");
	if (!src_dir || !*src_dir)
		src_dir = ".";
	tmp_root = getenv("TMPDIR");
	if (!tmp_root || !*tmp_root)
		tmp_root = "/tmp";
	snprintf(scratch, sizeof(scratch), "%s/hp-test-safetensors.XXXXXX", tmp_root);
	if (!mkdtemp(scratch)) {
		printf("1..0 # SKIP cannot make a scratch folder under %s: %s\n", tmp_root,
		       strerror(errno));
		return 1;
	}

	test_real_f32();
	test_real_sharded();
	test_round_trip();
	test_bad_files();
	test_alloc_failures();
	test_index();
	test_write_failures();
	test_hf_shapes();

	if (rmdir(scratch))
		tap_diag("scratch folder %s not empty: %s", scratch, strerror(errno));
	return tap_done();
}
