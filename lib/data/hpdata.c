/*
 * hpdata.c - offline tokenization: records in, ids out as JSON lines or as
 * a Megatron indexed dataset, over the ranks of an MPI communicator (see
 * hpdata.h for the input formats, how the inputs are split and the error
 * contract).
 *
 * The pieces, in the order data flows through them: a line reader over a
 * file descriptor (its own buffer, so that every allocation goes through
 * hp_malloc), the record decoder (UTF-8 check, JSON object, tokenizer),
 * and one "sink" per destination: JSON lines, the dataset writer, the
 * packer in front of it, or a rank's part file.  Rank 0 reads the part
 * files back in rank order and sends them through its own sink, so the
 * dataset depends on the records and their order only.
 *
 * What this is not: a general JSON tool (each line is parsed whole with
 * jansson, whose own allocations do not go through hp_malloc), or a
 * scheduler: the split is by bytes, so a rank whose share of the bytes is
 * slower to tokenize finishes last and the others wait for it.
 *
 * MPI calls are made on the caller's communicator with its error handler;
 * hp never installs one, so under MPI's default (errors are fatal) a call
 * that returns has succeeded, and the return values are not checked.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fileio.h"
#include "base/utf8.h"
#include "comm/comm.h"
#include "data/hpdata.h"
#include "format/indexed.h"
#include "text/chat.h"
#include "text/tokenizer.h"

/* Read size of the line reader: big enough that read(2) calls are rare,
 * small enough that P readers and a writer stay well under a gigabyte. */
#define RD_CHUNK (1u << 20)
/* Write buffer of a part file. */
#define PART_BUF (1u << 20)

/* ---- the line reader ---------------------------------------------------- */

struct rd {
	int fd;
	const char *name;       /* for messages */
	char *buf;
	size_t cap, beg, end;   /* buf[beg, end) is unread */
	uint64_t off;           /* file offset of buf[beg] */
	int eof;
};

/* Open path ("-": standard input) for reading from byte start. */
static int rd_open(struct rd *d, const char *path, const char *name, uint64_t start,
		   struct hp_err *e)
{
	memset(d, 0, sizeof(*d));
	d->name = name;
	d->fd = strcmp(path, "-") ? open(path, O_RDONLY | O_CLOEXEC) : STDIN_FILENO;
	if (d->fd < 0)
		return hp_err_set(e, HP_EIO, "'%s': cannot open: %s", name, strerror(errno));
	if (start && lseek(d->fd, (off_t)start, SEEK_SET) < 0) {
		int rc = hp_err_set(e, HP_EIO, "'%s': cannot seek: %s", name, strerror(errno));

		close(d->fd);
		d->fd = -1;
		return rc;
	}
	d->off = start;
	d->cap = RD_CHUNK;
	d->buf = hp_malloc(d->cap);
	if (!d->buf) {
		if (d->fd != STDIN_FILENO)
			close(d->fd);
		d->fd = -1;
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory for a read buffer", name);
	}
	return 0;
}

static void rd_close(struct rd *d)
{
	if (d->fd >= 0 && d->fd != STDIN_FILENO)
		close(d->fd);
	d->fd = -1;
	hp_free(d->buf);
	d->buf = NULL;
}

/* Read more: move the unread bytes to the front, grow the buffer when
 * they fill it, and read once.  Returns 0 (d->eof set at end of file) or
 * a negative code. */
static int rd_more(struct rd *d, struct hp_err *e)
{
	ssize_t n;

	if (d->beg) {
		memmove(d->buf, d->buf + d->beg, d->end - d->beg);
		d->end -= d->beg;
		d->beg = 0;
	}
	if (d->end == d->cap) {
		/* A line longer than the buffer: it must be held whole. */
		char *p = d->cap <= SIZE_MAX / 2 ? hp_realloc(d->buf, 2 * d->cap) : NULL;

		if (!p)
			return hp_err_set(e, HP_ENOMEM, "'%s': out of memory for a line of %zu bytes",
					  d->name, d->end);
		d->buf = p;
		d->cap *= 2;
	}
	do
		n = read(d->fd, d->buf + d->end, d->cap - d->end);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return hp_err_set(e, HP_EIO, "'%s': read failed: %s", d->name, strerror(errno));
	if (n == 0)
		d->eof = 1;
	d->end += (size_t)n;
	return 0;
}

/*
 * The next line, without its '\n': *p and *len, valid until the next call,
 * and *start, its offset in the file.  A last line without '\n' counts.
 * Returns 1, 0 at end of file, or a negative code.
 */
static int rd_line(struct rd *d, const char **p, size_t *len, uint64_t *start, struct hp_err *e)
{
	size_t scanned = 0;
	int rc;

	for (;;) {
		char *nl = memchr(d->buf + d->beg + scanned, '\n', d->end - d->beg - scanned);

		if (nl || (d->eof && d->end > d->beg)) {
			size_t n = nl ? (size_t)(nl - (d->buf + d->beg)) : d->end - d->beg;
			size_t used = n + (nl != NULL);

			*p = d->buf + d->beg;
			*len = n;
			*start = d->off;
			d->beg += used;
			d->off += used;
			return 1;
		}
		if (d->eof)
			return 0;
		scanned = d->end - d->beg;
		if ((rc = rd_more(d, e)))
			return rc;
	}
}

/* Exactly n bytes into dst; a short file is HP_EIO (our own part files). */
static int rd_exact(struct rd *d, void *dst, size_t n, struct hp_err *e)
{
	unsigned char *out = dst;
	int rc;

	while (n) {
		size_t k = d->end - d->beg;

		if (!k) {
			if (d->eof)
				return hp_err_set(e, HP_EIO, "'%s': ends early", d->name);
			d->beg = d->end = 0;
			if ((rc = rd_more(d, e)))
				return rc;
			continue;
		}
		if (k > n)
			k = n;
		memcpy(out, d->buf + d->beg, k);
		d->beg += k;
		d->off += k;
		out += k;
		n -= k;
	}
	return 0;
}

/* Lines before byte upto of path: '\n's in [0, upto).  Only errors need
 * it (a rank that starts mid-file counts its lines from its start). */
static uint64_t count_lines(const char *path, const char *name, uint64_t upto)
{
	struct rd d;
	struct hp_err e;
	uint64_t nl = 0;

	if (rd_open(&d, path, name, 0, &e))
		return 0;
	while (d.off < upto) {
		size_t k;

		d.beg = d.end = 0;
		if (rd_more(&d, &e) || d.eof)
			break;
		k = d.end;
		if (k > upto - d.off)
			k = (size_t)(upto - d.off);
		for (const char *q = d.buf; (q = memchr(q, '\n', (size_t)(d.buf + k - q))); q++)
			nl++;
		d.off += d.end;
	}
	rd_close(&d);
	return nl;
}

/* ---- a rank's part file ------------------------------------------------- */

/*
 * A part file is the records of one rank as they come: for each, its id
 * count as a native uint32 and its ids as native int32.  It is read back
 * by the same program on the same kind of machine, so no byte order is
 * fixed.
 */
struct part {
	int fd;
	char *path;            /* set once the file exists: remove it at the end */
	int slot;              /* its place among the temporaries (fileio.h) */
	unsigned char *buf;
	size_t used;
};

static int part_flush(struct part *w, struct hp_err *e)
{
	if (hp_write_all(w->fd, w->buf, w->used))
		return hp_err_set(e, HP_EIO, "'%s': write failed: %s", w->path, strerror(errno));
	w->used = 0;
	return 0;
}

static int part_put(struct part *w, const void *src, size_t n, struct hp_err *e)
{
	if (hp_buffered_put(w->fd, w->buf, PART_BUF, &w->used, src, n))
		return hp_err_set(e, HP_EIO, "'%s': write failed: %s", w->path, strerror(errno));
	return 0;
}

/* ---- a run ------------------------------------------------------------- */

struct input {
	const char *path;       /* as given; "-" is standard input */
	const char *name;       /* for messages */
	int jsonl;
	uint64_t size;          /* bytes (0 for standard input: unknown) */
	uint64_t at;            /* offset of its first byte in the joint byte space */
};

struct run {
	const struct hp_data_opts *o;
	struct hp_tokenizer *tok;
	const char *key;
	int32_t eod;                  /* appended to every record, or -1 */
	struct input *in;
	int nin;
	uint64_t total;               /* bytes of all inputs */
	int rank, size;

	/* ids of the record at hand, and with chat their marks (room for cap) */
	int32_t *ids;
	size_t nids, cap;
	struct hp_chat *chat;
	uint8_t *marks;
	struct hp_indexed_writer *mw; /* build, rank 0: PREFIX.mask */
	int32_t *mtmp;                /* the marks as ids for the writer */
	size_t mtmp_cap;

	/* where ids go */
	int (*sink)(struct run *r, const int32_t *ids, size_t n, struct hp_err *e);
	FILE *out;                    /* encode */
	char *line;                   /* encode: one output line */
	size_t line_cap;
	struct hp_indexed_writer *w;  /* build, rank 0 */
	int32_t *pack;                /* build with packing: the record being filled */
	size_t npack, packlen;
	struct part part;             /* build, ranks > 0 */

	/* progress of this rank through its range */
	uint64_t done, range;
	struct hp_data_stats st;
};

static void progress(struct run *r, int final)
{
	uint64_t done = r->done;

	if (r->rank || !r->o->progress)
		return;
	/* Rank 0 sees its own share only; the others read at about its pace. */
	if (r->size > 1 && r->range)
		done = (uint64_t)((double)r->done * (double)r->total / (double)r->range);
	if (done > r->total && r->total)
		done = r->total;
	r->o->progress(r->o->progress_arg, final && r->total ? r->total : done, r->total, final);
}

/* Append one id to r->ids. */
static int push_id(struct run *r, int32_t id, struct hp_err *e)
{
	if (r->nids == r->cap) {
		size_t c = r->cap ? 2 * r->cap : 1024;
		int32_t *p = hp_realloc(r->ids, c * sizeof(*p));

		if (!p)
			return hp_err_set(e, HP_ENOMEM, "out of memory for a record's ids");
		r->ids = p;
		r->cap = c;
	}
	r->ids[r->nids++] = id;
	return 0;
}

static const char *json_type_name(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: case JSON_REAL: return "a number";
	case JSON_TRUE: case JSON_FALSE: return "a boolean";
	default: return "null";
	}
}

/*
 * One input line to ids in r->ids.  Returns 1 for a record, 0 for a line
 * that is no record (a blank JSONL line), or a negative code whose message
 * the caller prefixes with the file and line.
 */
static int line_ids(struct run *r, const struct input *in, const char *s, size_t n,
		    struct hp_err *e)
{
	const char *text = s;
	size_t tlen = n, bad;
	json_t *root = NULL, *v;
	json_error_t jerr;
	int rc;

	bad = hp_utf8_valid_prefix(s, n);
	if (bad < n)
		return hp_err_set(e, HP_EFORMAT, "invalid UTF-8 at column %zu", bad + 1);
	if (in->jsonl) {
		size_t k = 0;

		/* s is not NUL-terminated: no strspn. */
		while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r'))
			k++;
		if (k == n)
			return 0;
		/* JSON_ALLOW_NUL: "\u0000" is a character like any other. */
		root = json_loadb(s, n, JSON_ALLOW_NUL, &jerr);
		if (!root)
			return json_error_code(&jerr) == json_error_out_of_memory ?
				hp_err_set(e, HP_ENOMEM, "out of memory parsing JSON") :
				hp_err_set(e, HP_EFORMAT, "invalid JSON: %s", jerr.text);
		if (!json_is_object(root)) {
			rc = hp_err_set(e, HP_EFORMAT, "expected a JSON object, got %s",
					json_type_name(root));
			goto out;
		}
		v = json_object_get(root, r->key);
		if (r->chat) {
			/* chat.h checks the conversation and names what is wrong */
		} else if (!v) {
			rc = hp_err_set(e, HP_EFORMAT, "no key \"%s\" (see --text-key)", r->key);
			goto out;
		} else if (!json_is_string(v)) {
			rc = hp_err_set(e, HP_EFORMAT, "\"%s\" is %s, not a string", r->key,
					json_type_name(v));
			goto out;
		}
		text = json_string_value(v);
		tlen = json_string_length(v);
	}
	if (r->chat) {
		r->nids = 0;
		rc = hp_chat_encode(r->chat, root, 0, &r->ids, &r->marks, &r->nids, &r->cap, NULL, NULL, e);
		if (!rc)
			rc = 1;
		goto out;
	}
	r->nids = 0;
	rc = hp_tok_encode(r->tok, text, tlen, &r->ids, &r->nids, &r->cap, e);
	if (rc < 0 && (e->code != rc || !e->msg[0]))
		/* A code without its message: never report an empty one. */
		hp_err_set(e, rc, "cannot encode the record: %s", hp_err_name(rc));
	if (!rc && r->eod >= 0)
		rc = push_id(r, r->eod, e);
	if (!rc)
		rc = 1;
out:
	json_decref(root);
	return rc;
}

/*
 * The records of one input whose first byte lies in [start, limit) of the
 * file (limit UINT64_MAX: to the end), in order, into r->sink.
 */
static int run_input(struct run *r, const struct input *in, uint64_t start, uint64_t limit,
		     struct hp_err *e)
{
	struct rd d;
	const char *s = NULL;
	size_t n = 0;
	uint64_t at = 0, line = 0;
	int rc;

	if ((rc = rd_open(&d, in->path, in->name, start, e)))
		return rc;
	while ((rc = rd_line(&d, &s, &n, &at, e)) == 1 && at < limit) {
		line++;
		rc = line_ids(r, in, s, n, e);
		if (rc < 0) {
			/* Line numbers count from the file's start, whoever reads it. */
			uint64_t before = start ? count_lines(in->path, in->name, start) : 0;

			hp_err_prefix(e, "'%s' line %llu", in->name,
				      (unsigned long long)(before + line));
			break;
		}
		r->done += d.off - at;
		if (rc == 1) {
			r->st.records++;
			if ((rc = r->sink(r, r->ids, r->nids, e)))
				break;
		}
		progress(r, 0);
		rc = 0;
	}
	if (rc == 1)
		rc = 0;   /* the line past the limit belongs to the next rank */
	rd_close(&d);
	return rc;
}

/* The records whose first byte lies in [beg, end) of the joint byte space. */
static int run_range(struct run *r, uint64_t beg, uint64_t end, struct hp_err *e)
{
	int rc = 0;

	for (int i = 0; !rc && i < r->nin; i++) {
		const struct input *in = &r->in[i];

		if (r->size == 1) {
			/* One rank reads everything, to the end of each file. */
			rc = run_input(r, in, 0, UINT64_MAX, e);
			continue;
		}
		if (in->at + in->size <= beg || !in->size)
			continue;
		if (in->at >= end)
			break;
		rc = run_input(r, in, beg > in->at ? beg - in->at : 0,
			       (end < in->at + in->size ? end : in->at + in->size) - in->at, e);
	}
	return rc;
}

/* ---- sinks -------------------------------------------------------------- */

/* Decimal digits of v at p; returns the count. */
static size_t put_u32(char *p, uint32_t v)
{
	char tmp[10];
	size_t k = 0, n;

	do {
		tmp[k++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	for (n = 0; n < k; n++)
		p[n] = tmp[k - 1 - n];
	return k;
}

static int sink_json(struct run *r, const int32_t *ids, size_t n, struct hp_err *e)
{
	/* 10 digits and a comma per id (twice with labels), and the braces. */
	size_t need = 22 * n + 32, k = 0;

	if (need > r->line_cap) {
		char *p = hp_realloc(r->line, need);

		if (!p)
			return hp_err_set(e, HP_ENOMEM, "out of memory for an output line");
		r->line = p;
		r->line_cap = need;
	}
	memcpy(r->line, "{\"ids\":[", 8);
	k = 8;
	for (size_t i = 0; i < n; i++) {
		if (i)
			r->line[k++] = ',';
		k += put_u32(r->line + k, (uint32_t)ids[i]);
	}
	if (r->chat) {
		/* labels: the id where it is a target, else -100 */
		memcpy(r->line + k, "],\"labels\":[", 12);
		k += 12;
		for (size_t i = 0; i < n; i++) {
			if (i)
				r->line[k++] = ',';
			if (r->marks[i]) {
				k += put_u32(r->line + k, (uint32_t)ids[i]);
			} else {
				memcpy(r->line + k, "-100", 4);
				k += 4;
			}
		}
	}
	memcpy(r->line + k, "]}\n", 3);
	k += 3;
	if (fwrite(r->line, 1, k, r->out) != k)
		return hp_err_set(e, HP_EIO, "cannot write the output: %s", strerror(errno));
	r->st.tokens += n;
	return 0;
}

static int add_sequence(struct run *r, const int32_t *ids, size_t n, struct hp_err *e)
{
	int rc = hp_indexed_writer_add(r->w, ids, n, e);

	if (!rc && r->mw) {
		if (n > r->mtmp_cap) {
			int32_t *p = hp_realloc(r->mtmp, n * sizeof(*p));

			if (!p)
				return hp_err_set(e, HP_ENOMEM, "out of memory for a record's marks");
			r->mtmp = p;
			r->mtmp_cap = n;
		}
		for (size_t i = 0; i < n; i++)
			r->mtmp[i] = r->marks[i];
		rc = hp_indexed_writer_add(r->mw, r->mtmp, n, e);
		if (!rc)
			rc = hp_indexed_writer_end_document(r->mw, e);
	}
	if (!rc)
		rc = hp_indexed_writer_end_document(r->w, e);
	if (!rc) {
		r->st.sequences++;
		r->st.tokens += n;
	}
	return rc;
}

static int sink_dataset(struct run *r, const int32_t *ids, size_t n, struct hp_err *e)
{
	return add_sequence(r, ids, n, e);
}

static int sink_pack(struct run *r, const int32_t *ids, size_t n, struct hp_err *e)
{
	int rc;

	while (n) {
		size_t k = r->packlen - r->npack;

		if (k > n)
			k = n;
		memcpy(r->pack + r->npack, ids, k * sizeof(*ids));
		r->npack += k;
		ids += k;
		n -= k;
		if (r->npack == r->packlen) {
			if ((rc = add_sequence(r, r->pack, r->npack, e)))
				return rc;
			r->npack = 0;
		}
	}
	return 0;
}

static int sink_part(struct run *r, const int32_t *ids, size_t n, struct hp_err *e)
{
	uint32_t n32 = (uint32_t)n;
	int rc;

	if (n > UINT32_MAX)
		return hp_err_set(e, HP_EFORMAT, "a record of %zu ids: at most %u are supported",
				  n, UINT32_MAX);
	rc = part_put(&r->part, &n32, sizeof(n32), e);
	if (!rc)
		rc = part_put(&r->part, ids, n * sizeof(*ids), e);
	if (!rc && r->chat)
		rc = part_put(&r->part, r->marks, n, e);
	r->st.tokens += n;
	return rc;
}

/* ---- set-up shared by encode and build ----------------------------------- */

static int is_jsonl_name(const char *path)
{
	size_t n = strlen(path);

	return !strcmp(path, "-") || (n >= 6 && !strcmp(path + n - 6, ".jsonl")) ||
	       (n >= 5 && !strcmp(path + n - 5, ".json"));
}

/* Load the tokenizer: a tokenizer.json that is there but wrong is a
 * malformed or unsupported input file (exit 4), as in hp-train. */
static int setup_tokenizer(struct run *r, struct hp_err *e)
{
	int rc = hp_tok_load(&r->tok, r->o->tokenizer, e);

	if (rc)
		return rc;
	if (r->o->chat_template) {
		struct hp_chat_opts co = {
			.template_spec = r->o->chat_template, .tokenizer_path = r->o->tokenizer,
			.messages_key = r->o->text_key, .role_key = r->o->role_key,
			.content_key = r->o->content_key, .all_tokens = r->o->all_tokens,
		};

		if (r->o->append_eod || r->o->pack_to_seq_len)
			return hp_err_set(e, HP_ECONFIG, "%s with a chat template: the template ends each "
					  "conversation, and hp-train packs conversations whole",
					  r->o->append_eod ? "--append-eod" : "--pack-to-seq-len");
		if ((rc = hp_chat_open(&r->chat, &co, r->tok, e)))
			return rc;
	}
	r->eod = -1;
	if (r->o->append_eod) {
		r->eod = hp_tok_eod_id(r->tok);
		if (r->eod < 0)
			return hp_err_set(e, HP_ECONFIG,
					  "'%s': no end-of-document token for --append-eod "
					  "(no eos_token in tokenizer_config.json, no <|endoftext|>, </s> "
					  "or <|end_of_text|>)", r->o->tokenizer);
	}
	return 0;
}

/* The input list, with sizes when stat_them (rank 0 of a build). */
static int setup_inputs(struct run *r, int stat_them, struct hp_err *e)
{
	const struct hp_data_opts *o = r->o;

	r->key = o->text_key ? o->text_key : o->chat_template ? "messages" : "text";
	r->nin = o->ninputs;
	r->in = hp_calloc((size_t)(o->ninputs ? o->ninputs : 1), sizeof(*r->in));
	if (!r->in)
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	for (int i = 0; i < o->ninputs; i++) {
		struct input *in = &r->in[i];
		struct stat sb;

		in->path = o->inputs[i];
		in->name = strcmp(in->path, "-") ? in->path : "<stdin>";
		in->jsonl = o->format == HP_DATA_AUTO ? is_jsonl_name(in->path) :
			    o->format == HP_DATA_JSONL;
		if (o->chat_template && !in->jsonl)
			return hp_err_set(e, HP_EFORMAT, "'%s': conversations are read from JSONL, one a line "
					  "(--format jsonl, or a .jsonl name)", in->name);
		if (!stat_them || !strcmp(in->path, "-"))
			continue;
		if (stat(in->path, &sb) < 0)
			return hp_err_set(e, HP_EIO, "'%s': cannot open: %s", in->name,
					  strerror(errno));
		if (S_ISDIR(sb.st_mode))
			return hp_err_set(e, HP_EIO, "'%s': is a directory", in->name);
		in->size = (uint64_t)sb.st_size;
	}
	return 0;
}

static void run_release(struct run *r)
{
	hp_chat_free(r->chat);
	hp_free(r->marks);
	hp_free(r->mtmp);
	hp_indexed_writer_abort(r->mw);
	hp_tok_free(r->tok);
	hp_free(r->in);
	hp_free(r->ids);
	hp_free(r->line);
	hp_free(r->pack);
	hp_free(r->part.buf);
	if (r->part.fd >= 0)
		close(r->part.fd);
	if (r->part.path)
		unlink(r->part.path);
	hp_tmp_forget(r->part.slot);
	hp_free(r->part.path);
	hp_indexed_writer_abort(r->w);
}

/*
 * The collective decision: every rank brings its status; if any failed,
 * every rank leaves with the code and message of the lowest failing rank
 * (the first error in input order).
 */
static int agree(MPI_Comm comm, int rank, int size, int rc, struct hp_err *e)
{
	int mine = rc ? rank : size, first, code = rc;
	MPI_Request req;

	if (size == 1)
		return rc;
	MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm, &req);
	hp_comm_wait_op(&req, comm, HP_COLL_ALL_REDUCE);
	if (first == size)
		return 0;
	hp_comm_bcast_raw(comm, &code, 1, MPI_INT, first);
	hp_comm_bcast_raw(comm, e->msg, HP_ERR_MSG_MAX, MPI_CHAR, first);
	e->msg[HP_ERR_MSG_MAX - 1] = '\0';
	e->code = code;
	if (rank != first) {
		e->src_file = NULL;
		e->src_line = 0;
	}
	return code;
}

/* ---- encode -------------------------------------------------------------- */

int hp_data_encode_run(const struct hp_data_opts *o, MPI_Comm comm, FILE *out,
		       struct hp_data_stats *st, struct hp_err *e)
{
	struct run r = { .o = o, .out = out, .sink = sink_json, .size = 1, .part = { .fd = -1, .slot = -1 } };
	double t0 = MPI_Wtime();
	int rank, size, rc = 0;

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &size);
	memset(st, 0, sizeof(*st));
	/* One process does the work: "size = 1" for the reader's sake. */
	if (rank == 0) {
		rc = setup_tokenizer(&r, e);
		r.st.load_seconds = MPI_Wtime() - t0;
		if (!rc)
			rc = setup_inputs(&r, 0, e);
		if (!rc)
			rc = run_range(&r, 0, UINT64_MAX, e);
		if (!rc && fflush(out))
			rc = hp_err_set(e, HP_EIO, "cannot write the output: %s", strerror(errno));
		r.st.bytes = r.done;
		r.st.seconds = MPI_Wtime() - t0;
		if (!rc)
			progress(&r, 1);
	}
	rc = agree(comm, rank, size, rc, e);
	if (!rc && rank == 0)
		*st = r.st;
	run_release(&r);
	return rc;
}

/* ---- build --------------------------------------------------------------- */

/* Where the range of this rank (> 0) begins: past the first '\n' at or
 * after its nominal start, or at the end of the file that holds it. */
static int range_start(struct run *r, uint64_t nominal, uint64_t *start, struct hp_err *e)
{
	const struct input *in = NULL;
	struct rd d;
	int rc;

	*start = r->total;
	for (int i = 0; i < r->nin; i++)
		if (nominal >= r->in[i].at && nominal < r->in[i].at + r->in[i].size)
			in = &r->in[i];
	if (!in)
		return 0;
	if ((rc = rd_open(&d, in->path, in->name, nominal - in->at, e)))
		return rc;
	*start = in->at + in->size;
	for (;;) {
		const char *nl = memchr(d.buf + d.beg, '\n', d.end - d.beg);

		if (nl) {
			*start = d.off + (uint64_t)(nl - (d.buf + d.beg)) + 1 + in->at;
			break;
		}
		if (d.eof)
			break;
		d.off += d.end - d.beg;
		d.beg = d.end = 0;
		if ((rc = rd_more(&d, e)))
			break;
	}
	rd_close(&d);
	if (*start > in->at + in->size)
		*start = in->at + in->size;   /* the file grew: keep to its size */
	return rc;
}

/* Rank 0: the part file of rank q, record by record, into rank 0's sink. */
static int append_part(struct run *r, const char *path, struct hp_err *e)
{
	struct rd d;
	uint32_t n;
	int rc;

	if ((rc = rd_open(&d, path, path, 0, e)))
		return rc;
	for (;;) {
		if (d.beg == d.end && !d.eof) {
			d.beg = d.end = 0;
			if ((rc = rd_more(&d, e)))
				break;
		}
		if (d.beg == d.end && d.eof)
			break;
		if ((rc = rd_exact(&d, &n, sizeof(n), e)))
			break;
		if (n > r->cap) {
			int32_t *p = hp_realloc(r->ids, (size_t)n * sizeof(*p));
			uint8_t *m = r->chat ? hp_realloc(r->marks, n) : NULL;

			if (p)
				r->ids = p;
			if (m)
				r->marks = m;
			if (!p || (r->chat && !m)) {
				rc = hp_err_set(e, HP_ENOMEM, "out of memory for a record of %u ids", n);
				break;
			}
			r->cap = n;
		}
		if ((rc = rd_exact(&d, r->ids, (size_t)n * sizeof(*r->ids), e)))
			break;
		if (r->chat && (rc = rd_exact(&d, r->marks, n, e)))
			break;
		r->st.records++;
		if ((rc = r->sink(r, r->ids, n, e)))
			break;
	}
	rd_close(&d);
	return rc;
}

static char *mask_prefix(const char *prefix)
{
	size_t n = strlen(prefix) + 6;
	char *s = hp_malloc(n);

	if (s)
		snprintf(s, n, "%s.mask", prefix);
	return s;
}

/* PREFIX.mask.{bin,idx}, if there: a mask must not outlive its ids. */
static void remove_mask(const char *prefix)
{
	size_t n = strlen(prefix) + 16;
	char *s = hp_malloc(n);

	if (!s)
		return;
	snprintf(s, n, "%s.mask.idx", prefix);
	unlink(s);
	snprintf(s, n, "%s.mask.bin", prefix);
	unlink(s);
	hp_free(s);
}

static char *part_name(const char *prefix, int rank, long pid)
{
	size_t n = strlen(prefix) + 64;
	char *s = hp_malloc(n);

	if (s)
		snprintf(s, n, "%s.part-%d.tmp.%ld", prefix, rank, pid);
	return s;
}

int hp_data_build_run(const struct hp_data_opts *o, MPI_Comm comm, struct hp_data_stats *st,
		      struct hp_err *e)
{
	struct run r = { .o = o, .part = { .fd = -1, .slot = -1 } };
	double t0 = MPI_Wtime();
	uint64_t *sizes = NULL, *starts = NULL, start = 0, end;
	long pid0 = (long)getpid();
	int rc = 0;

	MPI_Comm_rank(comm, &r.rank);
	MPI_Comm_size(comm, &r.size);
	memset(st, 0, sizeof(*st));

	/* Phase 1: tokenizer, inputs and their sizes, on every rank. */
	if (!o->prefix || (o->pack_to_seq_len && (o->pack_to_seq_len < 1 ||
						  o->pack_to_seq_len >= INT32_MAX)))
		rc = hp_err_set(e, HP_EINVAL, "build: no prefix, or a bad pack length");
	for (int i = 0; !rc && r.size > 1 && i < o->ninputs; i++)
		if (!strcmp(o->inputs[i], "-"))
			rc = hp_err_set(e, HP_EINVAL, "standard input cannot be split over %d ranks",
					r.size);
	if (!rc)
		rc = setup_tokenizer(&r, e);
	if (!rc)
		rc = setup_inputs(&r, r.rank == 0, e);
	sizes = hp_calloc((size_t)o->ninputs + 1, sizeof(*sizes));
	starts = hp_calloc((size_t)r.size + 1, sizeof(*starts));
	if (!rc && (!sizes || !starts))
		rc = hp_err_set(e, HP_ENOMEM, "out of memory");
	if ((rc = agree(comm, r.rank, r.size, rc, e)))
		goto out;
	r.st.load_seconds = MPI_Wtime() - t0;

	/* Phase 2: the ranges.  Rank 0's sizes are the truth for everyone. */
	for (int i = 0; i < r.nin; i++)
		sizes[i] = r.in[i].size;
	if (r.size > 1)
		hp_comm_bcast_raw(comm, sizes, o->ninputs, MPI_UINT64_T, 0);
	for (int i = 0; i < r.nin; i++) {
		r.in[i].size = sizes[i];
		r.in[i].at = r.total;
		r.total += sizes[i];
	}
	if (r.rank > 0) {
		/* T / P * r + (T % P) * r / P: r * T / P without overflow. */
		uint64_t p = (uint64_t)r.size, q = (uint64_t)r.rank;

		rc = range_start(&r, r.total / p * q + r.total % p * q / p, &start, e);
	}
	if (r.size > 1) {
		MPI_Request req;

		MPI_Iallgather(&start, 1, MPI_UINT64_T, starts, 1, MPI_UINT64_T, comm, &req);
		hp_comm_wait_op(&req, comm, HP_COLL_ALL_GATHER);
		hp_comm_bcast_raw(comm, &pid0, 1, MPI_LONG, 0);
	}
	end = r.rank + 1 < r.size ? starts[r.rank + 1] : r.total;
	r.range = end > start ? end - start : 0;

	/* Phase 3: the outputs: the dataset on rank 0, a part file elsewhere. */
	if (!rc && r.rank == 0) {
		rc = hp_indexed_writer_open(&r.w, o->prefix, hp_tok_vocab_size(r.tok), e);
		if (!rc && r.chat) {
			char *mp = mask_prefix(o->prefix);

			rc = mp ? hp_indexed_writer_open(&r.mw, mp, 2, e) : hp_err_set(e, HP_ENOMEM, "out of memory");
			hp_free(mp);
		}
		r.sink = sink_dataset;
		if (!rc && o->pack_to_seq_len) {
			r.packlen = (size_t)o->pack_to_seq_len + 1;
			r.pack = hp_malloc(r.packlen * sizeof(*r.pack));
			r.sink = sink_pack;
			if (!r.pack)
				rc = hp_err_set(e, HP_ENOMEM, "out of memory for a packed record of %zu ids",
						r.packlen);
		}
		if (!rc)
			r.st.dtype_code = hp_indexed_best_dtype(hp_tok_vocab_size(r.tok));
	} else if (!rc) {
		char *path = part_name(o->prefix, r.rank, pid0);

		r.sink = sink_part;
		r.part.buf = hp_malloc(PART_BUF);
		if (!path || !r.part.buf) {
			hp_free(path);
			rc = hp_err_set(e, HP_ENOMEM, "out of memory");
		} else if ((r.part.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
					     0666)) < 0) {
			rc = hp_err_set(e, HP_EIO, "'%s': cannot create: %s", path, strerror(errno));
			hp_free(path);
		} else {
			r.part.path = path;
			r.part.slot = hp_tmp_track(path, 0);
		}
	}
	if ((rc = agree(comm, r.rank, r.size, rc, e)))
		goto out;

	/* Phase 4: every rank its range. */
	rc = run_range(&r, start, end, e);
	if (!rc && r.part.fd >= 0) {
		rc = part_flush(&r.part, e);
		if (close(r.part.fd) < 0 && !rc)
			rc = hp_err_set(e, HP_EIO, "'%s': close failed: %s", r.part.path,
					strerror(errno));
		r.part.fd = -1;
	}
	if ((rc = agree(comm, r.rank, r.size, rc, e)))
		goto out;

	/* Phase 5: rank 0 appends the parts in rank order and finishes. */
	if (r.rank == 0) {
		for (int q = 1; !rc && q < r.size; q++) {
			char *path = part_name(o->prefix, q, pid0);

			rc = path ? append_part(&r, path, e) : hp_err_set(e, HP_ENOMEM, "out of memory");
			hp_free(path);
		}
		r.st.dropped = r.npack;
		/* the mask first: ids that land are never without theirs */
		if (!rc && r.mw) {
			rc = hp_indexed_writer_finish(r.mw, e);
			r.mw = NULL;
		}
		if (!rc) {
			rc = hp_indexed_writer_finish(r.w, e);
			r.w = NULL;
			if (rc && r.chat)
				remove_mask(o->prefix);
		}
		if (!rc && !r.chat)
			remove_mask(o->prefix);
		r.st.bytes = r.size > 1 ? r.total : r.done;
		r.st.seconds = MPI_Wtime() - t0;
		if (!rc)
			progress(&r, 1);
	}
	rc = agree(comm, r.rank, r.size, rc, e);
	if (!rc && r.rank == 0)
		*st = r.st;
out:
	run_release(&r);
	hp_free(sizes);
	hp_free(starts);
	return rc;
}
