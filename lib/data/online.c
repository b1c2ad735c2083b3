/*
 * online.c - JSONL/text documents tokenized while training and packed into
 * rows (see online.h for the packing rules and the cursor).
 *
 * Files are memory-mapped and scanned once at open: every line is checked
 * (JSON, text keys, UTF-8) so that a bad line stops the job before its
 * first step rather than hours in, and the documents' places are indexed
 * (16 bytes a document).  Tokenization happens when a document is reached.
 */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/utf8.h"
#include "data/online.h"
#include "format/indexed.h"
#include "text/chat.h"
#include "text/tokenizer.h"

struct src_file {
	char *path;
	const char *map;
	size_t size;
	int json;
};

struct doc {
	uint64_t off;        /* byte offset of the line */
	uint32_t len;        /* bytes, without the newline */
	uint32_t file;
	uint32_t line;       /* 1-based, for messages */
};

struct hp_online {
	struct src_file *files;
	size_t nfiles, capfiles;
	struct doc *docs;
	size_t ndocs, capdocs;
	char **keys;
	int nkeys;
	long T;
	int shuffle;
	uint64_t seed;
	struct hp_tokenizer *tok;
	int32_t eod;
	uint64_t empty, invalid;
	uint64_t doc0, alldocs;   /* the part's first document, and every part's */

	uint32_t *order;     /* this epoch's document order */
	uint64_t epoch, k, off;
	int32_t *toks;       /* the current document's tokens, EOD appended */
	size_t ntoks, captoks;
	/* conversations: toks' marks (room for captoks), the template */
	uint8_t *marks;
	struct hp_chat *chat;
	int all_tokens;
	uint64_t no_target, truncated;
	/* the indexed source: ids and marks, a scratch for the marks */
	int indexed;
	struct hp_indexed idx, midx;
	int32_t *mtmp;
	size_t capmtmp;
	int have_doc;
	char *text;          /* scratch for JSONL text */
	size_t captext;
	/* documents tokenized elsewhere (hp_online_give): positions [ck0,
	 * ck0 + cn) of epoch ce's order, their tokens (and marks) at coff */
	uint64_t ce, ck0;
	size_t cn, *coff;
	int32_t *ctoks;
	uint8_t *cmarks;
	size_t capc, capcoff;
	/* hp_online_encode's buffers, and the tokens tokenized here */
	int32_t *atoks;
	uint8_t *amarks;
	size_t capa;
	uint64_t encoded;
};

/* ---- files ---- */

static int has_suffix(const char *s, const char *suf)
{
	size_t n = strlen(s), m = strlen(suf);
	return n >= m && !strcmp(s + n - m, suf);
}

static int add_file(struct hp_online *o, const char *path, struct hp_err *e)
{
	struct src_file *f;
	struct stat st;
	int fd;

	if (o->nfiles == o->capfiles) {
		size_t cap = o->capfiles ? 2 * o->capfiles : 8;
		struct src_file *n = hp_realloc(o->files, cap * sizeof(*n));
		if (!n)
			return hp_err_set(e, HP_ENOMEM, "out of memory listing '%s'", path);
		o->files = n;
		o->capfiles = cap;
	}
	f = &o->files[o->nfiles];
	memset(f, 0, sizeof(*f));
	if (!(f->path = hp_strdup(path)))
		return hp_err_set(e, HP_ENOMEM, "out of memory listing '%s'", path);
	o->nfiles++;
	f->json = has_suffix(path, ".jsonl") || has_suffix(path, ".json");
	if ((fd = open(path, O_RDONLY)) < 0)
		return hp_err_set(e, HP_EIO, "'%s': cannot open: %s", path, strerror(errno));
	if (fstat(fd, &st)) {
		close(fd);
		return hp_err_set(e, HP_EIO, "'%s': cannot stat: %s", path, strerror(errno));
	}
	f->size = (size_t)st.st_size;
	if (f->size) {
		void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (m == MAP_FAILED) {
			close(fd);
			return hp_err_set(e, HP_EIO, "'%s': cannot map: %s", path, strerror(errno));
		}
		f->map = m;
	}
	close(fd);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int add_path(struct hp_online *o, const char *path, struct hp_err *e)
{
	struct stat st;
	DIR *d;
	struct dirent *de;
	char **names = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;

	if (stat(path, &st))
		return hp_err_set(e, HP_EIO, "'%s': cannot open: %s", path, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return add_file(o, path, e);
	if (!(d = opendir(path)))
		return hp_err_set(e, HP_EIO, "'%s': cannot open directory: %s", path, strerror(errno));
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.' || !(has_suffix(de->d_name, ".jsonl") || has_suffix(de->d_name, ".json") ||
					      has_suffix(de->d_name, ".txt")))
			continue;
		if (n == cap) {
			char **nn = hp_realloc(names, (cap = cap ? 2 * cap : 16) * sizeof(*nn));
			if (!nn) {
				rc = hp_err_set(e, HP_ENOMEM, "out of memory listing '%s'", path);
				break;
			}
			names = nn;
		}
		size_t len = strlen(path) + strlen(de->d_name) + 2;
		if (!(names[n] = hp_malloc(len))) {
			rc = hp_err_set(e, HP_ENOMEM, "out of memory listing '%s'", path);
			break;
		}
		snprintf(names[n++], len, "%s/%s", path, de->d_name);
	}
	closedir(d);
	if (!rc && !n)
		rc = hp_err_set(e, HP_EIO, "'%s': no .jsonl, .json or .txt files in the directory", path);
	if (!rc)
		qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n; i++) {
		if (!rc)
			rc = add_file(o, names[i], e);
		hp_free(names[i]);
	}
	hp_free(names);
	return rc;
}

/* ---- text of a line ---- */

static int grow_text(struct hp_online *o, size_t need)
{
	if (need <= o->captext)
		return 0;
	size_t cap = need + need / 2 + 64;
	char *n = hp_realloc(o->text, cap);
	if (!n)
		return -1;
	o->text = n;
	o->captext = cap;
	return 0;
}

/*
 * The text of document d into (*text, *len); for JSONL the keys' values
 * joined by '\n' in o->text.  Returns 0, or HP_EFORMAT/HP_ENOMEM with the
 * file and line named.
 */
static int doc_text(struct hp_online *o, const struct doc *d, const char **text, size_t *len,
		    struct hp_err *e)
{
	const struct src_file *f = &o->files[d->file];
	const char *line = f->map + d->off;
	json_error_t jerr;
	json_t *root;
	size_t used = 0, ok;
	int rc = 0;

	if (!f->json) {
		*text = line;
		*len = d->len;
	} else {
		root = json_loadb(line, d->len, JSON_REJECT_DUPLICATES, &jerr);
		if (!root)
			return hp_err_set(e, HP_EFORMAT, "'%s' line %u: invalid JSON: %s", f->path, d->line, jerr.text);
		if (!json_is_object(root)) {
			json_decref(root);
			return hp_err_set(e, HP_EFORMAT, "'%s' line %u: expected a JSON object", f->path, d->line);
		}
		for (int i = 0; i < o->nkeys && !rc; i++) {
			json_t *v = json_object_get(root, o->keys[i]);
			size_t n;
			if (!v || !json_is_string(v)) {
				rc = hp_err_set(e, HP_EFORMAT, "'%s' line %u: text key '%s' is %s", f->path, d->line,
						o->keys[i], v ? "not a string" : "missing");
				break;
			}
			n = json_string_length(v);
			if (grow_text(o, used + n + 2)) {
				rc = hp_err_set(e, HP_ENOMEM, "out of memory reading '%s'", f->path);
				break;
			}
			if (i)
				o->text[used++] = '\n';
			memcpy(o->text + used, json_string_value(v), n);
			used += n;
		}
		json_decref(root);
		if (rc)
			return rc;
		*text = o->text;
		*len = used;
	}
	ok = hp_utf8_valid_prefix(*text, *len);
	if (ok != *len)
		return hp_err_set(e, HP_EFORMAT, "'%s' line %u: invalid UTF-8 at byte %zu of the text",
				  f->path, d->line, ok);
	return 0;
}

/*
 * Conversation d parsed and checked by chat.h, at open; *keep is 0 when it
 * has nothing to learn from (no assistant message, unless every token is a
 * target).  Errors name file and line.
 */
static int doc_conv(struct hp_online *o, const struct doc *d, int *keep, struct hp_err *e)
{
	const struct src_file *f = &o->files[d->file];
	json_error_t jerr;
	json_t *j = json_loadb(f->map + d->off, d->len, JSON_REJECT_DUPLICATES, &jerr);
	int assistants = 0, rc;

	if (!j)
		return hp_err_set(e, HP_EFORMAT, "'%s' line %u: invalid JSON: %s", f->path, d->line, jerr.text);
	if ((rc = hp_chat_check(o->chat, j, &assistants, e))) {
		json_decref(j);
		return hp_err_prefix(e, "'%s' line %u", f->path, d->line);
	}
	*keep = assistants > 0 || o->all_tokens;
	json_decref(j);
	return 0;
}

/* ---- scanning ---- */

static int is_blank(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
			return 0;
	return 1;
}

static int scan_file(struct hp_online *o, uint32_t fi, int skip_invalid, struct hp_err *e)
{
	const struct src_file *f = &o->files[fi];
	size_t pos = 0;
	uint32_t line = 0;

	while (pos < f->size) {
		const char *s = f->map + pos, *nl = memchr(s, '\n', f->size - pos);
		size_t len = nl ? (size_t)(nl - s) : f->size - pos;
		struct doc d;
		const char *text;
		size_t tlen;
		int rc;

		line++;
		d.off = pos;
		d.file = fi;
		d.line = line;
		pos += len + (nl != NULL);
		if (len && s[len - 1] == '\r')
			len--;
		if (is_blank(s, len)) {
			o->empty++;
			continue;
		}
		if (len > UINT32_MAX)
			return hp_err_set(e, HP_EFORMAT, "'%s' line %u: line longer than 4 GiB", f->path, line);
		d.len = (uint32_t)len;
		if (o->chat) {
			int keep = 0;

			if ((rc = doc_conv(o, &d, &keep, e))) {
				if (rc == HP_EFORMAT && skip_invalid) {
					o->invalid++;
					continue;
				}
				return rc;
			}
			if (!keep) {
				o->no_target++;
				continue;
			}
		} else if ((rc = doc_text(o, &d, &text, &tlen, e))) {
			if (rc == HP_EFORMAT && skip_invalid) {
				o->invalid++;
				continue;
			}
			return rc;
		}
		if (o->ndocs == o->capdocs) {
			size_t cap = o->capdocs ? 2 * o->capdocs : 1024;
			struct doc *n = hp_realloc(o->docs, cap * sizeof(*n));
			if (!n)
				return hp_err_set(e, HP_ENOMEM, "out of memory indexing '%s'", f->path);
			o->docs = n;
			o->capdocs = cap;
		}
		o->docs[o->ndocs++] = d;
	}
	if (o->ndocs > UINT32_MAX)
		return hp_err_set(e, HP_EUNSUP, "more than 2^32 documents");
	return 0;
}

/* ---- order ---- */

static void make_order(struct hp_online *o)
{
	hp_order(o->order, o->ndocs, o->seed, o->epoch, o->shuffle);
}

static int grow_toks(struct hp_online *o, size_t need)
{
	if (need <= o->captoks)
		return 0;
	int32_t *n = hp_realloc(o->toks, need * sizeof(int32_t));
	if (!n)
		return -1;
	o->toks = n;
	if (o->chat || o->indexed) {
		uint8_t *m = hp_realloc(o->marks, need);
		if (!m)
			return -1;
		o->marks = m;
	}
	o->captoks = need;
	return 0;
}

/* Conversation d (checked when the source was opened) rendered and
 * encoded into o->toks and o->marks; hp_chat_encode checks it again. */
static int load_conv(struct hp_online *o, const struct doc *d, struct hp_err *e)
{
	const struct src_file *f = &o->files[d->file];
	json_error_t jerr;
	json_t *root = json_loadb(f->map + d->off, d->len, JSON_REJECT_DUPLICATES, &jerr);
	int rc;

	o->ntoks = 0;
	if (!root)
		return hp_err_set(e, HP_EFORMAT, "'%s' line %u: invalid JSON: %s", f->path, d->line, jerr.text);
	rc = hp_chat_encode(o->chat, root, 0, &o->toks, &o->marks, &o->ntoks, &o->captoks, NULL, NULL, e);
	json_decref(root);
	if (rc)
		return hp_err_prefix(e, "'%s' line %u", f->path, d->line);
	return 0;
}

/* Sequence d->off of the indexed source with its marks. */
static int load_indexed(struct hp_online *o, const struct doc *d, struct hp_err *e)
{
	uint64_t i = d->off;
	size_t n = (size_t)hp_indexed_seq_len(&o->idx, i);
	long got;

	if (grow_toks(o, n + 1))
		return hp_err_set(e, HP_ENOMEM, "out of memory reading '%s'", o->idx.bin_path);
	if (n > o->capmtmp) {
		int32_t *m = hp_realloc(o->mtmp, n * sizeof(int32_t));
		if (!m)
			return hp_err_set(e, HP_ENOMEM, "out of memory reading '%s'", o->midx.bin_path);
		o->mtmp = m;
		o->capmtmp = n;
	}
	if ((got = hp_indexed_read(&o->idx, i, o->toks, o->captoks, e)) < 0 ||
	    hp_indexed_read(&o->midx, i, o->mtmp, o->capmtmp, e) < 0)
		return got < 0 ? (int)got : e->code;
	for (size_t k = 0; k < n; k++)
		o->marks[k] = o->mtmp[k] != 0;
	o->ntoks = n;
	return 0;
}

/* Document d's tokens into o->toks (its marks into o->marks), as the
 * tokenizer gives them: a text's with the EOD appended. */
static int raw_doc(struct hp_online *o, const struct doc *d, struct hp_err *e)
{
	const char *text;
	size_t len;
	int rc;

	if (o->chat || o->indexed)
		rc = o->chat ? load_conv(o, d, e) : load_indexed(o, d, e);
	else if ((rc = doc_text(o, d, &text, &len, e)))
		return rc;
	else {
		o->ntoks = 0;
		if ((rc = hp_tok_encode(o->tok, text, len, &o->toks, &o->ntoks, &o->captoks, e)))
			return hp_err_prefix(e, "'%s' line %u", o->files[d->file].path, d->line);
		if (o->ntoks == o->captoks && grow_toks(o, o->captoks + 16))
			return hp_err_set(e, HP_ENOMEM, "out of memory tokenizing");
		o->toks[o->ntoks++] = o->eod;
	}
	if (!rc)
		o->encoded += o->ntoks;
	return rc;
}

/* The document at o->k of the current order into o->toks: handed over
 * (hp_online_give), or tokenized here. */
static int load_doc(struct hp_online *o, struct hp_err *e)
{
	int rc;

	if (o->cn && o->epoch == o->ce && o->k >= o->ck0 && o->k < o->ck0 + o->cn) {
		size_t i = o->k - o->ck0, n = o->coff[i + 1] - o->coff[i];

		if (grow_toks(o, n + 1))
			return hp_err_set(e, HP_ENOMEM, "out of memory for the tokens");
		memcpy(o->toks, o->ctoks + o->coff[i], n * sizeof(int32_t));
		if (o->cmarks)
			memcpy(o->marks, o->cmarks + o->coff[i], n);
		o->ntoks = n;
	} else if ((rc = raw_doc(o, &o->docs[o->order[o->k]], e))) {
		return rc;
	}
	if (o->chat || o->indexed) {
		size_t any = 0;

		/* a conversation is never split: cut to one row */
		if (o->ntoks > (size_t)o->T + 1) {
			o->ntoks = (size_t)o->T + 1;
			if (!o->off)
				o->truncated++;
		}
		for (size_t k = 1; k < o->ntoks && !any; k++)
			any = o->marks[k];
		if (!any) {
			/* nothing to learn from: served as empty (skipped) */
			if (!o->off)
				o->no_target++;
			o->ntoks = o->ntoks ? 1 : 0;
		}
	}
	o->have_doc = 1;
	return 0;
}

static int advance(struct hp_online *o)
{
	o->have_doc = 0;
	o->off = 0;
	if (++o->k == o->ndocs) {
		o->k = 0;
		o->epoch++;
		make_order(o);
	}
	return 0;
}

/* ---- API ---- */

/*
 * The indexed source: PREFIX and PREFIX.mask, the same sequences; each
 * sequence is one document (a conversation).  The padding id is the
 * tokenizer's EOD when one is given, else 0.
 */
static int open_indexed(struct hp_online *o, const struct hp_online_opts *opts, struct hp_err *e)
{
	char mprefix[4096];
	int rc;

	snprintf(mprefix, sizeof(mprefix), "%s.mask", opts->indexed);
	if ((rc = hp_indexed_open(&o->idx, opts->indexed, e)) || (rc = hp_indexed_open(&o->midx, mprefix, e)))
		return rc;
	if (o->midx.nseq != o->idx.nseq)
		return hp_err_set(e, HP_EFORMAT, "'%s': %llu sequences, but '%s' has %llu: not its mask",
				  o->midx.idx_path, (unsigned long long)o->midx.nseq, o->idx.idx_path,
				  (unsigned long long)o->idx.nseq);
	if (o->idx.nseq > UINT32_MAX)
		return hp_err_set(e, HP_EUNSUP, "'%s': more than 2^32 sequences", o->idx.idx_path);
	if (!(o->docs = hp_malloc((o->idx.nseq ? o->idx.nseq : 1) * sizeof(*o->docs))))
		return hp_err_set(e, HP_ENOMEM, "out of memory for %llu sequences",
				  (unsigned long long)o->idx.nseq);
	for (uint64_t i = 0; i < o->idx.nseq; i++) {
		int32_t n = hp_indexed_seq_len(&o->idx, i);

		if (n != hp_indexed_seq_len(&o->midx, i))
			return hp_err_set(e, HP_EFORMAT, "'%s': sequence %llu has %d marks for %d ids in '%s': "
					  "not its mask", o->midx.idx_path, (unsigned long long)i,
					  hp_indexed_seq_len(&o->midx, i), n, o->idx.idx_path);
		o->docs[i] = (struct doc){ .off = i, .len = (uint32_t)n, .file = 0, .line = (uint32_t)(i + 1) };
	}
	o->ndocs = o->capdocs = o->idx.nseq;
	o->indexed = 1;
	o->eod = 0;
	if (opts->tokenizer) {
		if ((rc = hp_tok_load(&o->tok, opts->tokenizer, e)))
			return rc;
		if ((o->eod = hp_tok_eod_id(o->tok)) < 0)
			o->eod = 0;
	}
	return 0;
}

void hp_online_free(struct hp_online *o)
{
	if (!o)
		return;
	for (size_t i = 0; i < o->nfiles; i++) {
		if (o->files[i].map)
			munmap((void *)o->files[i].map, o->files[i].size);
		hp_free(o->files[i].path);
	}
	hp_free(o->files);
	hp_free(o->docs);
	for (int i = 0; i < o->nkeys; i++)
		hp_free(o->keys[i]);
	hp_free(o->keys);
	hp_tok_free(o->tok);
	hp_chat_free(o->chat);
	hp_indexed_close(&o->idx);
	hp_indexed_close(&o->midx);
	hp_free(o->mtmp);
	hp_free(o->marks);
	hp_free(o->order);
	hp_free(o->toks);
	hp_free(o->text);
	hp_free(o->coff);
	hp_free(o->ctoks);
	hp_free(o->cmarks);
	hp_free(o->atoks);
	hp_free(o->amarks);
	hp_free(o);
}

int hp_online_open(struct hp_online **out, const struct hp_online_opts *opts, struct hp_err *e)
{
	struct hp_online *o = hp_calloc(1, sizeof(*o));
	static char *const default_key[] = { "text" };
	char *const *keys = opts->ntext_keys ? opts->text_keys : default_key;
	int nkeys = opts->ntext_keys ? opts->ntext_keys : 1, rc = 0;

	*out = NULL;
	if (!o)
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	o->T = opts->seq_length;
	o->shuffle = opts->shuffle;
	o->seed = opts->seed;
	if (o->T <= 0) {
		rc = hp_err_set(e, HP_ECONFIG, "online data: seq_length %ld must be positive", o->T);
		goto fail;
	}
	if (!(o->keys = hp_calloc((size_t)nkeys, sizeof(char *)))) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory");
		goto fail;
	}
	for (int i = 0; i < nkeys; i++, o->nkeys++)
		if (!(o->keys[i] = hp_strdup(keys[i]))) {
			rc = hp_err_set(e, HP_ENOMEM, "out of memory");
			goto fail;
		}
	if (opts->indexed) {
		if ((rc = open_indexed(o, opts, e)))
			goto fail;
	} else {
		if ((rc = hp_tok_load(&o->tok, opts->tokenizer, e)))
			goto fail;
		if ((o->eod = hp_tok_eod_id(o->tok)) < 0 && !opts->chat) {
			rc = hp_err_set(e, HP_ECONFIG, "'%s': the tokenizer has no end-of-document token "
					"(eos_token in tokenizer_config.json)", opts->tokenizer);
			goto fail;
		}
		if (o->eod < 0)
			o->eod = 0;   /* conversations: only the padding's input */
		if (opts->chat) {
			struct hp_chat_opts co = *opts->chat;

			if (!co.tokenizer_path)
				co.tokenizer_path = opts->tokenizer;
			if ((rc = hp_chat_open(&o->chat, &co, o->tok, e)))
				goto fail;
			o->all_tokens = co.all_tokens;
		}
		for (int i = 0; i < opts->npaths && !rc; i++)
			rc = add_path(o, opts->paths[i], e);
		for (size_t i = 0; i < o->nfiles && !rc; i++) {
			if (o->chat && !o->files[i].json)
				rc = hp_err_set(e, HP_EFORMAT, "'%s': conversations are read from JSONL (.jsonl or "
						".json), one conversation a line", o->files[i].path);
			else
				rc = scan_file(o, (uint32_t)i, opts->skip_invalid, e);
		}
	}
	if (rc)
		goto fail;
	if (!o->ndocs) {
		rc = o->chat ? hp_err_set(e, HP_EFORMAT, "'%s': no conversations to learn from (%llu empty and "
					  "%llu invalid lines, %llu without an assistant message)",
					  opts->npaths ? opts->paths[0] : "", (unsigned long long)o->empty,
					  (unsigned long long)o->invalid, (unsigned long long)o->no_target) :
			hp_err_set(e, HP_EFORMAT, "'%s': no documents (%llu empty and %llu invalid lines)",
				   opts->indexed ? opts->indexed : opts->npaths ? opts->paths[0] : "",
				   (unsigned long long)o->empty, (unsigned long long)o->invalid);
		goto fail;
	}
	o->alldocs = o->ndocs;
	if (opts->split) {
		uint64_t b[4];

		hp_split_bounds(opts->split, o->ndocs, b);
		o->doc0 = b[opts->part];
		o->ndocs = b[opts->part + 1] - b[opts->part];
		memmove(o->docs, o->docs + o->doc0, o->ndocs * sizeof(*o->docs));
		if (!o->ndocs && opts->part != HP_SPLIT_TRAIN) {
			hp_online_free(o);
			return 0;
		}
		if (!o->ndocs) {
			rc = hp_err_set(e, HP_EFORMAT, "'%s': the train split has no documents (%llu in all)",
					opts->paths[0], (unsigned long long)o->alldocs);
			goto fail;
		}
	}
	if (!(o->order = hp_malloc(o->ndocs * sizeof(uint32_t)))) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory for %zu documents", o->ndocs);
		goto fail;
	}
	make_order(o);
	*out = o;
	return 0;
fail:
	hp_online_free(o);
	return rc;
}

int hp_online_next(struct hp_online *o, int B, int32_t *inputs, int32_t *labels, int32_t *seg,
		   struct hp_err *e)
{
	long T = o->T;
	uint64_t guard = 0;
	int rc;

	for (int b = 0; b < B; b++) {
		int32_t *in = inputs + (long)b * T, *lb = labels + (long)b * T, *sg = seg + (long)b * T;
		long pos = 0;

		while (pos < T) {
			if (!o->have_doc && (rc = load_doc(o, e)))
				return rc;
			long pairs = (long)o->ntoks - 1 - (long)o->off;
			if (pairs <= 0) {
				/* an empty text gives only the EOD: nothing to learn from */
				advance(o);
				if (++guard > 2 * o->ndocs)
					return hp_err_set(e, HP_EFORMAT, o->chat || o->indexed ?
							  "conversations: none has a target token within seq_length" :
							  "online data: no document has a token besides the "
							  "end-of-document id");
				continue;
			}
			guard = 0;
			if (o->off == 0 && pairs <= T && pairs > T - pos)
				break;              /* fits a row but not this one: pad */
			long take = pairs < T - pos ? pairs : T - pos;
			for (long i = 0; i < take; i++) {
				in[pos + i] = o->toks[o->off + i];
				lb[pos + i] = o->toks[o->off + i + 1];
				sg[pos + i] = (int32_t)pos;
			}
			if (o->marks)
				for (long i = 0; i < take; i++)
					if (!o->marks[o->off + i + 1])
						lb[pos + i] = -100;
			pos += take;
			o->off += take;
			if ((long)o->off == (long)o->ntoks - 1)
				advance(o);
		}
		for (; pos < T; pos++) {
			in[pos] = o->eod;
			lb[pos] = -100;
			sg[pos] = (int32_t)pos;
		}
	}
	return 0;
}

void hp_online_stats(const struct hp_online *o, struct hp_online_stats *s)
{
	s->documents = o->ndocs;
	s->first_document = o->doc0;
	s->all_documents = o->alldocs;
	s->empty_lines = o->empty;
	s->invalid_lines = o->invalid;
	s->files = o->indexed ? 1 : o->nfiles;
	s->vocab_size = o->tok ? hp_tok_vocab_size(o->tok) : -1;
	s->eod_id = o->eod;
	s->no_target = o->no_target;
	s->truncated = o->truncated;
}

/* The position the next document loaded comes from. */
static uint64_t next_k(const struct hp_online *o)
{
	return o->k + (o->have_doc ? 1 : 0);
}

size_t hp_online_ahead(const struct hp_online *o, size_t n)
{
	uint64_t k0 = next_k(o);

	return k0 >= o->ndocs ? 0 : n < o->ndocs - k0 ? n : (size_t)(o->ndocs - k0);
}

int hp_online_encode(struct hp_online *o, size_t j, const int32_t **toks, const uint8_t **marks, size_t *n,
		     struct hp_err *e)
{
	int32_t *t = o->toks;
	uint8_t *m = o->marks;
	size_t nt = o->ntoks, ct = o->captoks;
	int rc;

	if (j >= hp_online_ahead(o, j + 1))
		return hp_err_set(e, HP_EINVAL, "online data: no document %zu ahead in this epoch", j);
	/* the loaders fill o->toks: lend them the encoder's buffers */
	o->toks = o->atoks;
	o->marks = o->amarks;
	o->captoks = o->capa;
	rc = raw_doc(o, &o->docs[o->order[next_k(o) + j]], e);
	o->atoks = o->toks;
	o->amarks = o->marks;
	o->capa = o->captoks;
	*toks = o->atoks;
	*marks = o->amarks;
	*n = rc ? 0 : o->ntoks;
	o->toks = t;
	o->marks = m;
	o->ntoks = nt;
	o->captoks = ct;
	return rc;
}

size_t hp_online_cached(const struct hp_online *o)
{
	uint64_t k0 = next_k(o);

	return o->cn && o->ce == o->epoch && k0 >= o->ck0 && k0 <= o->ck0 + o->cn ? (size_t)(o->ck0 + o->cn - k0) : 0;
}

int hp_online_give(struct hp_online *o, size_t j0, size_t n, const int32_t *const *toks,
		   const uint8_t *const *marks, const size_t *lens, struct hp_err *e)
{
	size_t keep = hp_online_cached(o), skip, total = 0;
	int mk = hp_online_marked(o);

	if (j0 != keep || j0 + n > hp_online_ahead(o, j0 + n))
		return hp_err_set(e, HP_EINVAL, "online data: documents %zu..%zu handed over, %zu held and %zu "
				  "left in the epoch", j0, j0 + n, keep, hp_online_ahead(o, j0 + n));
	/* what is still ahead stays, to the front; the new ones after it */
	skip = (size_t)(next_k(o) - (keep ? o->ck0 : next_k(o)));
	if (keep) {
		size_t t0 = o->coff[skip], tn = o->coff[skip + keep] - t0;

		memmove(o->ctoks, o->ctoks + t0, tn * sizeof(int32_t));
		if (mk)
			memmove(o->cmarks, o->cmarks + t0, tn);
		for (size_t i = 0; i <= keep; i++)
			o->coff[i] = o->coff[skip + i] - t0;
	}
	total = keep ? o->coff[keep] : 0;
	for (size_t i = 0; i < n; i++)
		total += lens[i];
	if (keep + n + 1 > o->capcoff) {
		size_t *c = hp_realloc(o->coff, (keep + n + 1) * sizeof(size_t));
		if (!c)
			return hp_err_set(e, HP_ENOMEM, "out of memory for the handed-over tokens");
		o->coff = c;
		o->capcoff = keep + n + 1;
	}
	if (total + 1 > o->capc) {
		int32_t *t = hp_realloc(o->ctoks, (total + 1) * sizeof(int32_t));
		uint8_t *m = t && mk ? hp_realloc(o->cmarks, total + 1) : o->cmarks;
		if (t)
			o->ctoks = t;
		if (m)
			o->cmarks = m;
		if (!t || (mk && !m))
			return hp_err_set(e, HP_ENOMEM, "out of memory for the handed-over tokens");
		o->capc = total + 1;
	}
	o->coff[0] = 0;
	for (size_t i = keep; i < keep + n; i++) {
		memcpy(o->ctoks + o->coff[i], toks[i - keep], lens[i - keep] * sizeof(int32_t));
		if (mk)
			memcpy(o->cmarks + o->coff[i], marks[i - keep], lens[i - keep]);
		o->coff[i + 1] = o->coff[i] + lens[i - keep];
	}
	o->ce = o->epoch;
	o->ck0 = next_k(o);
	o->cn = keep + n;
	return 0;
}

uint64_t hp_online_doc_bytes(const struct hp_online *o, size_t j)
{
	const struct doc *d;

	if (j >= hp_online_ahead(o, j + 1))
		return 0;
	d = &o->docs[o->order[next_k(o) + j]];
	/* an indexed sequence: its tokens, at 4 bytes each */
	return o->indexed ? 4 * (uint64_t)hp_indexed_seq_len(&o->idx, d->off) : d->len;
}

int hp_online_marked(const struct hp_online *o)
{
	return o->chat || o->indexed;
}

uint64_t hp_online_encoded(const struct hp_online *o)
{
	return o->encoded;
}

uint64_t hp_online_position(const struct hp_online *o)
{
	return o->epoch * o->ndocs + o->k;
}

void hp_online_cursor(const struct hp_online *o, uint64_t *epoch, uint64_t *doc, uint64_t *off)
{
	*epoch = o->epoch;
	*doc = o->k;
	*off = o->off;
}

int hp_online_seek(struct hp_online *o, uint64_t epoch, uint64_t doc, uint64_t off, struct hp_err *e)
{
	int rc;

	if (doc >= o->ndocs)
		return hp_err_set(e, HP_EFORMAT, "data cursor: document %llu, but the data has %zu",
				  (unsigned long long)doc, o->ndocs);
	o->epoch = epoch;
	make_order(o);
	o->k = doc;
	o->off = 0;
	o->have_doc = 0;
	if (off) {
		if ((rc = load_doc(o, e)))
			return rc;
		if (off >= o->ntoks)
			return hp_err_set(e, HP_EFORMAT, "data cursor: offset %llu past the document's %zu tokens",
					  (unsigned long long)off, o->ntoks);
		o->off = off;
	}
	return 0;
}
