/*
 * safetensors.c - the safetensors reader, model-folder loader and writer
 * (see safetensors.h for the format, the invariants and the contracts).
 *
 * The reader maps the whole file read-only and hands out views into it: no
 * tensor bytes are copied until someone asks for F32 (hp_st_read_f32).  The
 * header is untrusted input, so every number in it is checked for type,
 * sign and overflow before it is used, and the fuzzer in
 * fuzz/fuzz-safetensors.c drives hp_st_parse_header directly.
 *
 * What this is not: a streaming reader (files are mapped whole), a
 * converter between arbitrary dtypes, or a general JSON writer (the writer
 * emits exactly the header shape the HF library emits).  jansson parses;
 * its own allocations do not go through hp_malloc unless a program routes
 * them there with json_set_alloc_funcs (the unit test does), and its
 * out-of-memory reports are mapped to HP_ENOMEM either way.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "base/alloc.h"
#include "base/fileio.h"
#include "base/utf8.h"
#include "format/safetensors.h"

/* Messages quote tensor names and jansson's excerpts of the header, which
 * may hold newlines; hp_err_set keeps every message on one line. */
#define st_err(e, code, ...) hp_err_set((e), (code), __VA_ARGS__)

/* Room for "[d0, d1, ...]" with HP_ST_MAX_DIMS 20-digit dims. */
#define SHAPE_BUF 256

static const char *fmt_shape(char *buf, size_t cap, const int64_t *shape, int ndim)
{
	size_t n = 0;

	buf[0] = '\0';
	for (int i = 0; i <= ndim && n < cap; i++) {
		int w;

		if (i == ndim)
			w = snprintf(buf + n, cap - n, "]");
		else
			w = snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "[",
				     (long long)shape[i]);
		if (w < 0)
			break;
		n += (size_t)w;
	}
	return buf;
}

/*
 * Turn a jansson load failure into an hp error.  jansson reports running
 * out of memory either with json_error_out_of_memory or, when it fails
 * before it has a lexer, with no message at all.
 */
static int json_fail(struct hp_err *e, const char *name, const char *what,
		     const json_error_t *je)
{
	enum json_error_code c = json_error_code(je);

	if (c == json_error_out_of_memory || !je->text[0])
		return st_err(e, HP_ENOMEM, "'%s': out of memory parsing the %s", name, what);
	if (c == json_error_cannot_open_file)
		return st_err(e, HP_EIO, "'%s': cannot read the %s: %s", name, what, je->text);
	if (c == json_error_duplicate_key)
		return st_err(e, HP_EFORMAT,
				  "'%s': %s has a duplicate key (%s at line %d, column %d)",
				  name, what, je->text, je->line, je->column);
	return st_err(e, HP_EFORMAT, "'%s': %s is not valid json: %s (line %d, column %d)",
			  name, what, je->text, je->line, je->column);
}

/* Free what hp_st_parse_header filled and empty those fields. */
static void release_parsed(struct hp_st_file *f)
{
	for (size_t i = 0; i < f->ntensors; i++)
		hp_free(f->tensors[i].name);
	hp_free(f->tensors);
	f->tensors = NULL;
	f->ntensors = 0;
	for (size_t i = 0; i < f->nmeta; i++) {
		hp_free(f->meta_keys[i]);
		hp_free(f->meta_vals[i]);
	}
	hp_free(f->meta_keys);
	hp_free(f->meta_vals);
	f->meta_keys = f->meta_vals = NULL;
	f->nmeta = 0;
}

/*
 * Check one header entry and fill t (name last, so that a failure leaves
 * nothing to free).  Problems that make the file unsupported rather than
 * malformed (unknown dtype, too many dimensions) go into *unsup, first one
 * only, and parsing continues so that a malformed file is reported as such.
 */
static int parse_tensor(const char *file, const char *key, json_t *v, uint64_t data_len,
			struct hp_st_tensor *t, struct hp_err *unsup, struct hp_err *e)
{
	json_t *jd, *js, *jo, *jb, *je;
	char sbuf[SHAPE_BUF];
	size_t ndim;
	int64_t numel = 1;
	uint64_t nbytes;

	if (!json_is_object(v))
		return st_err(e, HP_EFORMAT, "'%s': tensor '%s' is not a json object", file, key);
	jd = json_object_get(v, "dtype");
	js = json_object_get(v, "shape");
	jo = json_object_get(v, "data_offsets");
	if (!jd)
		return st_err(e, HP_EFORMAT, "'%s': tensor '%s' has no dtype", file, key);
	if (!json_is_string(jd))
		return st_err(e, HP_EFORMAT, "'%s': tensor '%s' dtype is not a string", file, key);
	if (!js)
		return st_err(e, HP_EFORMAT, "'%s': tensor '%s' has no shape", file, key);
	if (!json_is_array(js))
		return st_err(e, HP_EFORMAT, "'%s': tensor '%s' shape is not an array", file, key);
	if (!jo)
		return st_err(e, HP_EFORMAT, "'%s': tensor '%s' has no data_offsets", file, key);
	jb = json_array_get(jo, 0);
	je = json_array_get(jo, 1);
	if (!json_is_array(jo) || json_array_size(jo) != 2 ||
	    !json_is_integer(jb) || !json_is_integer(je))
		return st_err(e, HP_EFORMAT,
				  "'%s': tensor '%s' data_offsets is not a pair of integers",
				  file, key);

	t->dtype = hp_dtype_parse(json_string_value(jd));
	if (t->dtype == HP_DTYPE_INVALID && !unsup->code)
		st_err(unsup, HP_EUNSUP, "'%s': tensor '%s' has unknown dtype '%s'",
			   file, key, json_string_value(jd));

	ndim = json_array_size(js);
	for (size_t i = 0; i < ndim; i++) {
		json_t *d = json_array_get(js, i);
		long long x;

		if (!json_is_integer(d))
			return st_err(e, HP_EFORMAT, "'%s': tensor '%s' shape[%zu] is not an integer",
					  file, key, i);
		x = json_integer_value(d);
		if (x < 0)
			return st_err(e, HP_EFORMAT, "'%s': tensor '%s' shape[%zu] is negative (%lld)",
					  file, key, i, x);
		if (__builtin_mul_overflow(numel, (int64_t)x, &numel))
			return st_err(e, HP_EFORMAT,
					  "'%s': tensor '%s' shape has more elements than fit in 64 bits",
					  file, key);
		if (i < HP_ST_MAX_DIMS)
			t->shape[i] = x;
	}
	if (ndim > HP_ST_MAX_DIMS && !unsup->code)
		st_err(unsup, HP_EUNSUP, "'%s': tensor '%s' has %zu dimensions, more than the %d supported",
			   file, key, ndim, HP_ST_MAX_DIMS);
	t->ndim = ndim > HP_ST_MAX_DIMS ? HP_ST_MAX_DIMS : (int)ndim;
	t->numel = numel;

	if (json_integer_value(jb) < 0 || json_integer_value(je) < 0)
		return st_err(e, HP_EFORMAT, "'%s': tensor '%s' data_offsets [%lld, %lld] are negative",
				  file, key, json_integer_value(jb), json_integer_value(je));
	t->begin = (uint64_t)json_integer_value(jb);
	t->end = (uint64_t)json_integer_value(je);
	if (t->begin > t->end)
		return st_err(e, HP_EFORMAT, "'%s': tensor '%s' data_offsets [%llu, %llu] end before they begin",
				  file, key, (unsigned long long)t->begin, (unsigned long long)t->end);
	if (t->end > data_len)
		return st_err(e, HP_EFORMAT,
				  "'%s': tensor '%s' data_offsets [%llu, %llu] run past the data section (%llu bytes)",
				  file, key, (unsigned long long)t->begin, (unsigned long long)t->end,
				  (unsigned long long)data_len);
	/* With an unknown dtype the size cannot be checked; HP_EUNSUP follows. */
	if (t->dtype != HP_DTYPE_INVALID) {
		if (__builtin_mul_overflow((uint64_t)numel, (uint64_t)hp_dtype_size(t->dtype), &nbytes))
			return st_err(e, HP_EFORMAT,
					  "'%s': tensor '%s' shape %s of %s has more bytes than fit in 64 bits",
					  file, key, fmt_shape(sbuf, sizeof(sbuf), t->shape, t->ndim),
					  hp_dtype_name(t->dtype));
		if (nbytes != t->end - t->begin)
			return st_err(e, HP_EFORMAT,
					  "'%s': tensor '%s' data_offsets [%llu, %llu] hold %llu bytes but shape %s of %s needs %llu",
					  file, key, (unsigned long long)t->begin, (unsigned long long)t->end,
					  (unsigned long long)(t->end - t->begin),
					  fmt_shape(sbuf, sizeof(sbuf), t->shape, t->ndim),
					  hp_dtype_name(t->dtype), (unsigned long long)nbytes);
	}
	t->nbytes = (size_t)(t->end - t->begin);
	t->name = hp_strdup(key);
	if (!t->name)
		return st_err(e, HP_ENOMEM, "'%s': out of memory", file);
	return 0;
}

static int parse_meta(struct hp_st_file *f, const char *file, json_t *meta, struct hp_err *e)
{
	const char *key;
	json_t *v;
	size_t n;

	if (!json_is_object(meta))
		return st_err(e, HP_EFORMAT, "'%s': __metadata__ is not a json object", file);
	n = json_object_size(meta);
	f->meta_keys = hp_calloc(n, sizeof(*f->meta_keys));
	f->meta_vals = hp_calloc(n, sizeof(*f->meta_vals));
	if (!f->meta_keys || !f->meta_vals)
		return st_err(e, HP_ENOMEM, "'%s': out of memory", file);
	json_object_foreach(meta, key, v) {
		char *k, *s;

		if (!json_is_string(v))
			return st_err(e, HP_EFORMAT, "'%s': __metadata__ value for '%s' is not a string",
					  file, key);
		k = hp_strdup(key);
		s = hp_strdup(json_string_value(v));
		if (!k || !s) {
			hp_free(k);
			hp_free(s);
			return st_err(e, HP_ENOMEM, "'%s': out of memory", file);
		}
		f->meta_keys[f->nmeta] = k;
		f->meta_vals[f->nmeta] = s;
		f->nmeta++;
	}
	return 0;
}

static int cmp_tensor_name(const void *a, const void *b)
{
	return strcmp(((const struct hp_st_tensor *)a)->name, ((const struct hp_st_tensor *)b)->name);
}

static int cmp_tensor_ptr_name(const void *a, const void *b)
{
	const struct hp_st_tensor *x = *(const struct hp_st_tensor *const *)a;
	const struct hp_st_tensor *y = *(const struct hp_st_tensor *const *)b;

	return strcmp(x->name, y->name);
}

/* By begin, then end, then name, so that messages do not depend on qsort. */
static int cmp_tensor_ptr_offset(const void *a, const void *b)
{
	const struct hp_st_tensor *x = *(const struct hp_st_tensor *const *)a;
	const struct hp_st_tensor *y = *(const struct hp_st_tensor *const *)b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->name, y->name);
}

/*
 * The HF library accepts a data section only when its tensors, sorted by
 * data_offsets, tile it exactly: the first begins at 0, each begins where
 * the one before ends, and the last ends where the file does (safetensors'
 * Metadata::validate, InvalidOffset, and the MetadataIncompleteBuffer check
 * after it).  hp holds files to the same rule, so that a file hp trains on
 * is one transformers loads, and bytes no tensor owns (where a damaged or
 * hand-made file hides its mistakes) are refused.  Empty tensors take part,
 * as there: one placed inside another tensor's bytes is refused too.
 */
static int check_layout(const struct hp_st_file *f, const char *file, uint64_t data_len,
			struct hp_err *e)
{
	const struct hp_st_tensor **by = hp_calloc(f->ntensors, sizeof(*by));
	const struct hp_st_tensor *prev = NULL;
	uint64_t at = 0;
	int rc = 0;

	if (!by)
		return st_err(e, HP_ENOMEM, "'%s': out of memory", file);
	for (size_t i = 0; i < f->ntensors; i++)
		by[i] = &f->tensors[i];
	qsort(by, f->ntensors, sizeof(*by), cmp_tensor_ptr_offset);
	for (size_t i = 0; i < f->ntensors && !rc; i++) {
		const struct hp_st_tensor *t = by[i];

		/* at > 0 here means a tensor came before */
		if (t->begin < at)
			rc = st_err(e, HP_EFORMAT,
				    "'%s': tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap",
				    file, prev->name, (unsigned long long)prev->begin,
				    (unsigned long long)prev->end, t->name,
				    (unsigned long long)t->begin, (unsigned long long)t->end);
		else if (t->begin > at)
			rc = st_err(e, HP_EFORMAT,
				    "'%s': bytes [%llu, %llu) of the data section belong to no tensor "
				    "(a gap before '%s')", file, (unsigned long long)at,
				    (unsigned long long)t->begin, t->name);
		at = t->end;
		prev = t;
	}
	if (!rc && at != data_len)
		rc = st_err(e, HP_EFORMAT,
			    "'%s': %llu trailing bytes after the last tensor (the tensors end at "
			    "byte %llu of the %llu-byte data section)", file,
			    (unsigned long long)(data_len - at), (unsigned long long)at,
			    (unsigned long long)data_len);
	hp_free(by);
	return rc;
}

int hp_st_parse_header(struct hp_st_file *f, const char *name, const char *json,
		       size_t len, uint64_t data_len, struct hp_err *e)
{
	struct hp_err unsup;
	json_error_t je;
	json_t *root, *v, *meta;
	const char *key;
	size_t cap;
	int rc = 0;

	hp_err_clear(&unsup);
	/* jansson leaves the code byte unset on some failures: start from zero. */
	memset(&je, 0, sizeof(je));
	/* jansson would otherwise keep the last of two equal keys silently. */
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return json_fail(e, name, "header", &je);
	if (!json_is_object(root)) {
		rc = st_err(e, HP_EFORMAT, "'%s': header is not a json object", name);
		goto out;
	}
	meta = json_object_get(root, "__metadata__");
	cap = json_object_size(root) - (meta ? 1 : 0);
	f->tensors = hp_calloc(cap, sizeof(*f->tensors));
	if (!f->tensors) {
		rc = st_err(e, HP_ENOMEM, "'%s': out of memory", name);
		goto out;
	}
	json_object_foreach(root, key, v) {
		if (!strcmp(key, "__metadata__"))
			continue;
		rc = parse_tensor(name, key, v, data_len, &f->tensors[f->ntensors], &unsup, e);
		if (rc)
			goto out;
		f->ntensors++;
	}
	if (meta && (rc = parse_meta(f, name, meta, e)))
		goto out;
	qsort(f->tensors, f->ntensors, sizeof(*f->tensors), cmp_tensor_name);
	if ((rc = check_layout(f, name, data_len, e)))
		goto out;
	if (unsup.code) {
		rc = unsup.code;
		if (e)
			*e = unsup;
	}
out:
	json_decref(root);
	if (rc)
		release_parsed(f);
	return rc;
}

static uint64_t get_le64(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

/* Read exactly n bytes at off, or fail: a short file is malformed. */
static int pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path, struct hp_err *e)
{
	unsigned char *p = buf;

	while (n) {
		ssize_t got = pread(fd, p, n, (off_t)off);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return st_err(e, HP_EIO, "'%s': cannot read: %s", path, strerror(errno));
		if (got == 0)
			return st_err(e, HP_EFORMAT, "'%s': truncated: ends before byte %llu", path,
				      (unsigned long long)off);
		p += got;
		n -= (size_t)got;
		off += (uint64_t)got;
	}
	return 0;
}

int hp_st_open_flags(struct hp_st_file *f, const char *path, unsigned flags, struct hp_err *e)
{
	struct stat st;
	unsigned char len8[8];
	uint64_t n;
	size_t size;
	void *map;
	char *hdr = NULL;
	int fd = -1, rc;

	memset(f, 0, sizeof(*f));
	f->fd = -1;
	f->path = hp_strdup(path);
	if (!f->path)
		return st_err(e, HP_ENOMEM, "'%s': out of memory", path);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = st_err(e, HP_EIO, "'%s': cannot open: %s", path, strerror(errno));
		goto fail;
	}
	if (fstat(fd, &st)) {
		rc = st_err(e, HP_EIO, "'%s': cannot stat: %s", path, strerror(errno));
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = st_err(e, HP_EIO, "'%s': not a regular file", path);
		goto fail;
	}
	if (st.st_size < 8) {
		rc = st_err(e, HP_EFORMAT,
				"'%s': file is %lld bytes, shorter than the 8-byte header length",
				path, (long long)st.st_size);
		goto fail;
	}
	size = (size_t)st.st_size;
	if (flags & HP_ST_PREAD) {
		if ((rc = pread_full(fd, len8, 8, 0, path, e)))
			goto fail;
		f->fd = fd;
	} else {
		map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (map == MAP_FAILED) {
			rc = st_err(e, HP_EIO, "'%s': cannot map %zu bytes: %s", path, size, strerror(errno));
			goto fail;
		}
		f->map = map;
		f->fd = fd;
		memcpy(len8, map, 8);
	}
	f->size = size;

	n = get_le64(len8);
	if (n > HP_ST_MAX_HEADER) {
		rc = st_err(e, HP_EFORMAT, "'%s': header length %llu is absurd (over %u bytes)",
				path, (unsigned long long)n, HP_ST_MAX_HEADER);
		goto fail;
	}
	if (n > size - 8) {
		rc = st_err(e, HP_EFORMAT,
				"'%s': header length %llu runs past the end of the file (%zu bytes)",
				path, (unsigned long long)n, size);
		goto fail;
	}
	if (f->map) {
		rc = hp_st_parse_header(f, path, (const char *)f->map + 8, (size_t)n, size - 8 - n, e);
	} else if (!(hdr = hp_malloc((size_t)n + 1))) {
		rc = st_err(e, HP_ENOMEM, "'%s': out of memory", path);
	} else if (!(rc = pread_full(fd, hdr, (size_t)n, 8, path, e))) {
		rc = hp_st_parse_header(f, path, hdr, (size_t)n, size - 8 - n, e);
	}
	hp_free(hdr);
	if (rc)
		goto fail;
	for (size_t i = 0; i < f->ntensors; i++) {
		struct hp_st_tensor *t = &f->tensors[i];

		t->fd = fd;
		t->file_off = 8 + n + t->begin;
		t->path = f->path;
		if (f->map)
			t->data = (const unsigned char *)f->map + t->file_off;
	}
	return 0;
fail:
	if (fd >= 0 && f->fd < 0)
		close(fd);
	hp_st_close(f);
	return rc;
}

int hp_st_open(struct hp_st_file *f, const char *path, struct hp_err *e)
{
	return hp_st_open_flags(f, path, 0, e);
}

int hp_st_pread(const struct hp_st_tensor *t, uint64_t off, void *buf, size_t n, struct hp_err *e)
{
	if (t->fd < 0 || off > t->nbytes || n > t->nbytes - off)
		return st_err(e, HP_EINVAL, "'%s': bytes %llu+%zu of tensor '%s' (%zu bytes)",
			      t->path ? t->path : "?", (unsigned long long)off, n, t->name, t->nbytes);
	if (t->data) {
		memcpy(buf, (const unsigned char *)t->data + off, n);
		return 0;
	}
	return pread_full(t->fd, buf, n, t->file_off + off, t->path, e);
}

void hp_st_close(struct hp_st_file *f)
{
	if (!f)
		return;
	release_parsed(f);
	if (f->map)
		munmap(f->map, f->size);
	if (f->fd >= 0 && (f->map || f->path))
		close(f->fd);
	hp_free(f->path);
	memset(f, 0, sizeof(*f));
	f->fd = -1;
}

const struct hp_st_tensor *hp_st_find(const struct hp_st_file *f, const char *name)
{
	size_t lo = 0, hi = f->ntensors;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, f->tensors[mid].name);

		if (!c)
			return &f->tensors[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

const char *hp_st_meta(const struct hp_st_file *f, const char *key)
{
	for (size_t i = 0; i < f->nmeta; i++)
		if (!strcmp(f->meta_keys[i], key))
			return f->meta_vals[i];
	return NULL;
}

/* --- model folders ------------------------------------------------------- */

static char *path_join(const char *dir, const char *name)
{
	size_t n = strlen(dir) + 1 + strlen(name) + 1;
	char *p = hp_malloc(n);

	if (p)
		snprintf(p, n, "%s/%s", dir, name);
	return p;
}

/* The folder part of a file path: "." when there is none. */
static char *path_dir(const char *path)
{
	const char *slash = strrchr(path, '/');

	if (!slash)
		return hp_strdup(".");
	if (slash == path)
		return hp_strdup("/");
	return hp_strndup(path, (size_t)(slash - path));
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);

	return n >= k && !strcmp(s + n - k, suffix);
}

static int is_file(const char *path)
{
	struct stat st;

	return !stat(path, &st) && S_ISREG(st.st_mode);
}

/* Point m->tensors at every tensor of every file, sorted by name. */
static int model_index_tensors(struct hp_st_model *m, const char *what, struct hp_err *e)
{
	size_t n = 0;

	for (size_t i = 0; i < m->nfiles; i++)
		n += m->files[i].ntensors;
	m->tensors = hp_calloc(n, sizeof(*m->tensors));
	if (!m->tensors)
		return st_err(e, HP_ENOMEM, "'%s': out of memory", what);
	for (size_t i = 0; i < m->nfiles; i++)
		for (size_t j = 0; j < m->files[i].ntensors; j++)
			m->tensors[m->ntensors++] = &m->files[i].tensors[j];
	qsort(m->tensors, m->ntensors, sizeof(*m->tensors), cmp_tensor_ptr_name);
	return 0;
}

static int model_open_single(struct hp_st_model *m, const char *path, unsigned flags,
			     struct hp_err *e)
{
	int rc;

	m->files = hp_calloc(1, sizeof(*m->files));
	if (!m->files)
		return st_err(e, HP_ENOMEM, "'%s': out of memory", path);
	rc = hp_st_open_flags(&m->files[0], path, flags, e);
	if (rc)
		return rc;
	m->nfiles = 1;
	return model_index_tensors(m, path, e);
}

static int cmp_str_ptr(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Index of name in the sorted shard names, or -1. */
static long shard_index(const char **names, size_t n, const char *name)
{
	const char **p = bsearch(&name, names, n, sizeof(*names), cmp_str_ptr);

	return p ? (long)(p - names) : -1;
}

/*
 * A weight_map value names a shard in the index's folder: HF writes bare
 * file names, which transformers joins to the folder.  An absolute path or
 * a ".." component would have hp open a file anywhere the user can read,
 * named by a downloaded index: refused.  A subfolder (no "..") stays in.
 */
static int in_folder(const char *name)
{
	if (name[0] == '/')
		return 0;
	for (const char *p = name; *p;) {
		size_t n = strcspn(p, "/");

		if (n == 2 && p[0] == '.' && p[1] == '.')
			return 0;
		p += n;
		p += *p == '/';
	}
	return 1;
}

/*
 * The shards are opened in the loop that checks each exists; the two
 * cross-checks between weight_map and the shards follow once all are open,
 * so that a missing shard is reported before any mismatch it causes.
 */
static int model_open_index(struct hp_st_model *m, const char *index, unsigned flags,
			    struct hp_err *e)
{
	const char **names = NULL;
	json_error_t je;
	json_t *root, *wm, *meta, *ts = NULL, *v;
	const char *key;
	size_t nnames = 0;
	uint64_t total = 0;
	int rc = 0;

	memset(&je, 0, sizeof(je));
	root = json_load_file(index, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return json_fail(e, index, "index", &je);
	if (!json_is_object(root)) {
		rc = st_err(e, HP_EFORMAT, "'%s': index is not a json object", index);
		goto out;
	}
	wm = json_object_get(root, "weight_map");
	if (!json_is_object(wm)) {
		rc = st_err(e, HP_EFORMAT, "'%s': index %s", index,
				wm ? "weight_map is not a json object" : "has no weight_map");
		goto out;
	}
	meta = json_object_get(root, "metadata");
	if (meta && !json_is_object(meta)) {
		rc = st_err(e, HP_EFORMAT, "'%s': index metadata is not a json object", index);
		goto out;
	}
	if (meta)
		ts = json_object_get(meta, "total_size");
	if (ts && !json_is_integer(ts)) {
		rc = st_err(e, HP_EFORMAT, "'%s': index metadata.total_size is not an integer", index);
		goto out;
	}

	names = hp_calloc(json_object_size(wm), sizeof(*names));
	if (!names) {
		rc = st_err(e, HP_ENOMEM, "'%s': out of memory", index);
		goto out;
	}
	json_object_foreach(wm, key, v) {
		const char *s = json_string_value(v);
		size_t i;

		if (!json_is_string(v) || !*s) {
			rc = st_err(e, HP_EFORMAT,
					"'%s': weight_map entry for tensor '%s' is not a file name",
					index, key);
			goto out;
		}
		if (!in_folder(s)) {
			rc = st_err(e, HP_EFORMAT,
				    "'%s': weight_map entry '%s' for tensor '%s' is outside the model "
				    "folder (an absolute path or a '..')", index, s, key);
			goto out;
		}
		/* Shards are few (tens); a linear scan keeps this simple. */
		for (i = 0; i < nnames && strcmp(names[i], s); i++)
			;
		if (i == nnames)
			names[nnames++] = s;
	}
	qsort(names, nnames, sizeof(*names), cmp_str_ptr);

	m->files = hp_calloc(nnames, sizeof(*m->files));
	if (!m->files) {
		rc = st_err(e, HP_ENOMEM, "'%s': out of memory", index);
		goto out;
	}
	for (size_t i = 0; i < nnames; i++) {
		char *path = path_join(m->dir, names[i]);
		struct stat st;

		if (!path) {
			rc = st_err(e, HP_ENOMEM, "'%s': out of memory", index);
			goto out;
		}
		if (stat(path, &st)) {
			rc = st_err(e, HP_EIO, "'%s': shard '%s' named in weight_map is missing (%s)",
					index, names[i], strerror(errno));
			hp_free(path);
			goto out;
		}
		rc = hp_st_open_flags(&m->files[i], path, flags, e);
		hp_free(path);
		if (rc)
			goto out;
		m->nfiles = i + 1;
	}

	json_object_foreach(wm, key, v) {
		long k = shard_index(names, nnames, json_string_value(v));

		if (k < 0 || !hp_st_find(&m->files[k], key)) {
			rc = st_err(e, HP_EFORMAT,
					"'%s': weight_map puts tensor '%s' in '%s' but that shard does not have it",
					index, key, json_string_value(v));
			goto out;
		}
	}
	for (size_t i = 0; i < m->nfiles; i++) {
		for (size_t j = 0; j < m->files[i].ntensors; j++) {
			const struct hp_st_tensor *t = &m->files[i].tensors[j];
			const char *where = json_string_value(json_object_get(wm, t->name));

			if (!where) {
				rc = st_err(e, HP_EFORMAT,
						"'%s': tensor '%s' of shard '%s' is missing from weight_map",
						index, t->name, names[i]);
				goto out;
			}
			if (strcmp(where, names[i])) {
				rc = st_err(e, HP_EFORMAT,
						"'%s': tensor '%s' is in shard '%s' but weight_map puts it in '%s'",
						index, t->name, names[i], where);
				goto out;
			}
			total += t->nbytes;
		}
	}
	if (ts && (json_integer_value(ts) < 0 || (uint64_t)json_integer_value(ts) != total)) {
		rc = st_err(e, HP_EFORMAT,
				"'%s': metadata.total_size %lld does not match the %llu bytes of tensors in the shards",
				index, json_integer_value(ts), (unsigned long long)total);
		goto out;
	}
	rc = model_index_tensors(m, index, e);
out:
	hp_free(names);
	json_decref(root);
	return rc;
}

int hp_st_model_open(struct hp_st_model *m, const char *dir_or_file, struct hp_err *e)
{
	return hp_st_model_open_flags(m, dir_or_file, 0, e);
}

int hp_st_model_open_flags(struct hp_st_model *m, const char *dir_or_file, unsigned flags,
			   struct hp_err *e)
{
	static const char single[] = "model.safetensors";
	static const char index[] = "model.safetensors.index.json";
	struct stat st;
	char *path = NULL;
	int rc;

	memset(m, 0, sizeof(*m));
	if (stat(dir_or_file, &st))
		return st_err(e, HP_EIO, "'%s': cannot open: %s", dir_or_file, strerror(errno));
	if (S_ISDIR(st.st_mode)) {
		size_t n = strlen(dir_or_file);

		/* "dir/" and "dir" are the same folder; keep messages tidy. */
		while (n > 1 && dir_or_file[n - 1] == '/')
			n--;
		m->dir = hp_strndup(dir_or_file, n);
		if (!m->dir)
			return st_err(e, HP_ENOMEM, "'%s': out of memory", dir_or_file);
		if (!(path = path_join(m->dir, single))) {
			rc = st_err(e, HP_ENOMEM, "'%s': out of memory", dir_or_file);
			goto out;
		}
		if (is_file(path)) {
			rc = model_open_single(m, path, flags, e);
			goto out;
		}
		hp_free(path);
		if (!(path = path_join(m->dir, index))) {
			rc = st_err(e, HP_ENOMEM, "'%s': out of memory", dir_or_file);
			goto out;
		}
		if (is_file(path)) {
			rc = model_open_index(m, path, flags, e);
			goto out;
		}
		rc = st_err(e, HP_EIO, "'%s': folder has neither %s nor %s",
				m->dir, single, index);
		goto out;
	}
	if (!S_ISREG(st.st_mode))
		return st_err(e, HP_EIO, "'%s': neither a file nor a folder", dir_or_file);
	m->dir = path_dir(dir_or_file);
	if (!m->dir)
		return st_err(e, HP_ENOMEM, "'%s': out of memory", dir_or_file);
	if (ends_with(dir_or_file, ".index.json"))
		rc = model_open_index(m, dir_or_file, flags, e);
	else
		rc = model_open_single(m, dir_or_file, flags, e);
out:
	hp_free(path);
	if (rc)
		hp_st_model_close(m);
	return rc;
}

void hp_st_model_close(struct hp_st_model *m)
{
	if (!m)
		return;
	/* files[] is calloc'd, so shards past nfiles are zeroed or closed. */
	for (size_t i = 0; i < m->nfiles; i++)
		hp_st_close(&m->files[i]);
	hp_free(m->files);
	hp_free(m->tensors);
	hp_free(m->dir);
	memset(m, 0, sizeof(*m));
}

const struct hp_st_tensor *hp_st_model_find(const struct hp_st_model *m, const char *name)
{
	size_t lo = 0, hi = m->ntensors;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, m->tensors[mid]->name);

		if (!c)
			return m->tensors[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

int hp_st_read_f32(const struct hp_st_tensor *t, float *dst, struct hp_err *e)
{
	switch (t->dtype) {
	case HP_DTYPE_F32:
	case HP_DTYPE_BF16:
	case HP_DTYPE_F16:
	case HP_DTYPE_F64:
		break;
	default:
		return st_err(e, HP_EUNSUP, "tensor '%s' has dtype %s, which hp does not read as f32",
				  t->name, hp_dtype_name(t->dtype));
	}
	/* memmove with a NULL source is undefined even for 0 bytes. */
	if (!t->numel)
		return 0;
	if (!t->data)
		return st_err(e, HP_EINVAL, "tensor '%s' has no data (header parsed from a buffer)",
				  t->name);
	hp_convert_to_f32(dst, t->data, t->dtype, (size_t)t->numel);
	return 0;
}

/* --- writer ------------------------------------------------------------- */

/* A growable byte buffer that remembers running out of memory, so that the
 * header can be built without checking every append. */
struct sbuf {
	char *p;
	size_t len, cap;
	int oom;
};

static void sb_add(struct sbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		char *p;

		while (cap < b->len + n)
			cap *= 2;
		p = hp_realloc(b->p, cap);
		if (!p) {
			b->oom = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
}

static void sb_str(struct sbuf *b, const char *s)
{
	sb_add(b, s, strlen(s));
}

static void sb_u64(struct sbuf *b, unsigned long long v)
{
	char num[24];
	int n = snprintf(num, sizeof(num), "%llu", v);

	sb_add(b, num, (size_t)n);
}

/* A JSON string literal; s is known to be UTF-8, which passes through. */
static void sb_json_str(struct sbuf *b, const char *s)
{
	sb_add(b, "\"", 1);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\') {
			char esc[2] = { '\\', (char)c };
			sb_add(b, esc, 2);
		} else if (c < 0x20) {
			char esc[8];
			int n = snprintf(esc, sizeof(esc), "\\u%04x", c);
			sb_add(b, esc, (size_t)n);
		} else {
			sb_add(b, s, 1);
		}
	}
	sb_add(b, "\"", 1);
}

/* Well-formed UTF-8: jansson rejects anything else when the file is read back. */
static int utf8_valid(const char *s)
{
	size_t n = strlen(s);

	return hp_utf8_valid_prefix(s, n) == n;
}

static int cmp_entry_ptr_name(const void *a, const void *b)
{
	const struct hp_st_entry *x = *(const struct hp_st_entry *const *)a;
	const struct hp_st_entry *y = *(const struct hp_st_entry *const *)b;

	return strcmp(x->name, y->name);
}

/* Bytes of one entry, or -1 with a message for a caller bug. */
static int entry_nbytes(const char *path, const struct hp_st_entry *en, uint64_t *nbytes,
			int need_data, struct hp_err *e)
{
	int64_t numel = 1;

	if (!en->name || !utf8_valid(en->name) || !strcmp(en->name, "__metadata__"))
		return st_err(e, HP_EINVAL, "'%s': tensor name '%s' cannot be written",
				  path, en->name ? en->name : "(null)");
	if (!hp_dtype_size(en->dtype))
		return st_err(e, HP_EINVAL, "'%s': tensor '%s' has no dtype", path, en->name);
	if (en->ndim < 0 || en->ndim > HP_ST_MAX_DIMS)
		return st_err(e, HP_EINVAL, "'%s': tensor '%s' has %d dimensions", path,
				  en->name, en->ndim);
	for (int i = 0; i < en->ndim; i++)
		if (en->shape[i] < 0 || __builtin_mul_overflow(numel, en->shape[i], &numel))
			return st_err(e, HP_EINVAL, "'%s': tensor '%s' has a bad shape", path,
					  en->name);
	if (__builtin_mul_overflow((uint64_t)numel, (uint64_t)hp_dtype_size(en->dtype), nbytes))
		return st_err(e, HP_EINVAL, "'%s': tensor '%s' is too large", path, en->name);
	if (need_data && *nbytes && !en->data)
		return st_err(e, HP_EINVAL, "'%s': tensor '%s' has no data", path, en->name);
	return 0;
}

/*
 * The header as the HF library writes it: compact, __metadata__ first,
 * tensors in name order with back-to-back offsets, padded with spaces so
 * that the data section starts 8-byte aligned within the file.
 */
static int build_header(struct sbuf *b, const char *path, size_t n,
			const struct hp_st_entry *const *ord, size_t nmeta,
			const char *const *meta_keys, const char *const *meta_vals,
			int need_data, struct hp_err *e)
{
	uint64_t off = 0;
	int first = 1;

	sb_str(b, "{");
	if (nmeta) {
		sb_str(b, "\"__metadata__\":{");
		for (size_t i = 0; i < nmeta; i++) {
			sb_str(b, i ? "," : "");
			sb_json_str(b, meta_keys[i]);
			sb_str(b, ":");
			sb_json_str(b, meta_vals[i]);
		}
		sb_str(b, "}");
		first = 0;
	}
	for (size_t i = 0; i < n; i++) {
		const struct hp_st_entry *en = ord[i];
		uint64_t nbytes;
		int rc = entry_nbytes(path, en, &nbytes, need_data, e);

		if (rc)
			return rc;
		sb_str(b, first ? "" : ",");
		first = 0;
		sb_json_str(b, en->name);
		sb_str(b, ":{\"dtype\":\"");
		sb_str(b, hp_dtype_name(en->dtype));
		sb_str(b, "\",\"shape\":[");
		for (int d = 0; d < en->ndim; d++) {
			sb_str(b, d ? "," : "");
			sb_u64(b, (unsigned long long)en->shape[d]);
		}
		sb_str(b, "],\"data_offsets\":[");
		sb_u64(b, off);
		sb_str(b, ",");
		if (__builtin_add_overflow(off, nbytes, &off))
			return st_err(e, HP_EINVAL, "'%s': tensors are too large", path);
		sb_u64(b, off);
		sb_str(b, "]}");
	}
	sb_str(b, "}");
	while (b->len % 8)
		sb_str(b, " ");
	if (b->oom)
		return st_err(e, HP_ENOMEM, "'%s': out of memory", path);
	return 0;
}

static int check_meta(const char *path, size_t nmeta, const char *const *keys,
		      const char *const *vals, struct hp_err *e)
{
	for (size_t i = 0; i < nmeta; i++) {
		if (!keys || !vals || !keys[i] || !vals[i] || !utf8_valid(keys[i]) || !utf8_valid(vals[i]))
			return st_err(e, HP_EINVAL, "'%s': metadata entry %zu cannot be written", path, i);
		for (size_t j = 0; j < i; j++)
			if (!strcmp(keys[i], keys[j]))
				return st_err(e, HP_EINVAL, "'%s': metadata key '%s' given twice",
					      path, keys[i]);
	}
	return 0;
}

static int writer_fail(struct hp_st_writer *w, struct hp_err *e, const char *what)
{
	int rc = st_err(e, HP_EIO, "'%s': cannot %s: %s", w->path, what, strerror(errno));

	hp_st_writer_abort(w);
	return rc;
}

int hp_st_writer_open(struct hp_st_writer *w, const char *path, size_t n,
		      const struct hp_st_entry *entries, size_t nmeta, const char *const *meta_keys,
		      const char *const *meta_vals, struct hp_err *e)
{
	struct sbuf hdr = { 0 };
	unsigned char len8[8];
	int rc;

	memset(w, 0, sizeof(*w));
	if ((rc = check_meta(path, nmeta, meta_keys, meta_vals, e)))
		return rc;
	for (size_t i = 0; i < n; i++)
		if (!entries[i].name)
			return st_err(e, HP_EINVAL, "'%s': tensor %zu has no name", path, i);
	w->n = n;
	w->entries = entries;
	w->ord = hp_calloc(n ? n : 1, sizeof(*w->ord));
	w->path = hp_strdup(path);
	if (!w->ord || !w->path) {
		hp_st_writer_abort(w);
		return st_err(e, HP_ENOMEM, "'%s': out of memory", path);
	}
	for (size_t i = 0; i < n; i++)
		w->ord[i] = &entries[i];
	qsort(w->ord, n, sizeof(*w->ord), cmp_entry_ptr_name);
	for (size_t i = 1; i < n; i++)
		if (!strcmp(w->ord[i]->name, w->ord[i - 1]->name)) {
			rc = st_err(e, HP_EINVAL, "'%s': tensor '%s' given twice", path, w->ord[i]->name);
			hp_st_writer_abort(w);
			return rc;
		}
	if ((rc = build_header(&hdr, path, n, w->ord, nmeta, meta_keys, meta_vals, 0, e))) {
		hp_free(hdr.p);
		hp_st_writer_abort(w);
		return rc;
	}
	w->hdr_len = hdr.len;
	for (size_t i = 0; i < n; i++) {
		uint64_t nb;

		entry_nbytes(path, w->ord[i], &nb, 0, NULL);
		w->total += nb;
	}
	if ((rc = hp_outfile_open(&w->out, path, e))) {
		hp_free(hdr.p);
		hp_st_writer_abort(w);
		return rc;
	}
	for (int i = 0; i < 8; i++)
		len8[i] = (unsigned char)((uint64_t)hdr.len >> (8 * i));
	rc = hp_write_all(w->out.fd, len8, 8) || hp_write_all(w->out.fd, hdr.p, hdr.len);
	hp_free(hdr.p);
	return rc ? writer_fail(w, e, "write") : 0;
}

size_t hp_st_writer_index(const struct hp_st_writer *w, size_t i)
{
	return (size_t)(w->ord[i] - w->entries);
}

int hp_st_writer_put(struct hp_st_writer *w, const void *buf, size_t n, struct hp_err *e)
{
	if (n > w->total - w->done) {
		int rc = st_err(e, HP_EINVAL, "'%s': %zu bytes more than the header's tensors hold",
				w->path, n);

		hp_st_writer_abort(w);
		return rc;
	}
	if (n && hp_write_all(w->out.fd, buf, n))
		return writer_fail(w, e, "write");
#ifdef SYNC_FILE_RANGE_WRITE
	/* start writeback now, so that the commit's fsync finds little left to
	 * write: it halves the time of writing a shard (bench/convert-bench.sh) */
	if (n >= (1u << 20) && !w->out.stream)
		sync_file_range(w->out.fd, (off_t)(8 + w->hdr_len + w->done), (off_t)n, SYNC_FILE_RANGE_WRITE);
#endif
	w->done += n;
	return 0;
}

int hp_st_writer_set_meta(struct hp_st_writer *w, size_t nmeta, const char *const *meta_keys,
			  const char *const *meta_vals, struct hp_err *e)
{
	struct sbuf hdr = { 0 };
	int rc;

	if ((rc = check_meta(w->path, nmeta, meta_keys, meta_vals, e)) ||
	    (rc = build_header(&hdr, w->path, w->n, w->ord, nmeta, meta_keys, meta_vals, 0, e))) {
		hp_free(hdr.p);
		hp_st_writer_abort(w);
		return rc;
	}
	if (hdr.len != w->hdr_len) {
		hp_free(hdr.p);
		rc = st_err(e, HP_EINVAL, "'%s': new metadata changes the header's length", w->path);
		hp_st_writer_abort(w);
		return rc;
	}
	rc = hp_pwrite_all(w->out.fd, hdr.p, hdr.len, 8);
	hp_free(hdr.p);
	return rc ? writer_fail(w, e, "write") : 0;
}

int hp_st_writer_commit(struct hp_st_writer *w, struct hp_err *e)
{
	int rc;

	if (w->done != w->total) {
		rc = st_err(e, HP_EINVAL, "'%s': %llu of %llu data bytes written", w->path,
			    (unsigned long long)w->done, (unsigned long long)w->total);
		hp_st_writer_abort(w);
		return rc;
	}
	rc = hp_outfile_commit(&w->out, e);
	hp_st_writer_abort(w);
	return rc;
}

void hp_st_writer_abort(struct hp_st_writer *w)
{
	hp_outfile_abort(&w->out);
	hp_free(w->ord);
	hp_free(w->path);
	memset(w, 0, sizeof(*w));
}

int hp_st_write(const char *path, size_t n, const struct hp_st_entry *entries,
		size_t nmeta, const char *const *meta_keys, const char *const *meta_vals,
		struct hp_err *e)
{
	struct hp_st_writer w;
	int rc;

	for (size_t i = 0; i < n; i++) {
		uint64_t nb;

		if (entries[i].name && (rc = entry_nbytes(path, &entries[i], &nb, 1, e)))
			return rc;
	}
	if ((rc = hp_st_writer_open(&w, path, n, entries, nmeta, meta_keys, meta_vals, e)))
		return rc;
	for (size_t i = 0; i < n; i++) {
		const struct hp_st_entry *en = &entries[hp_st_writer_index(&w, i)];
		uint64_t nb;

		entry_nbytes(path, en, &nb, 1, NULL);
		if ((rc = hp_st_writer_put(&w, en->data, (size_t)nb, e)))
			return rc;
	}
	return hp_st_writer_commit(&w, e);
}
