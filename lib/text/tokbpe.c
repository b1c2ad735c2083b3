/*
 * tokbpe.c - the BPE model of a HuggingFace tokenizer.json: vocabulary and
 * merge tables, and the encoding of one pre-token into ids exactly as HF
 * tokenizers' BPE::tokenize (models/bpe/model.rs and word.rs, 0.23).
 *
 * The merge loop is HF's: repeatedly apply the adjacent pair of lowest
 * merge rank, the leftmost one on ties.  Short words (almost all of them)
 * use a scan over a small array, long ones HF's heap over a linked list;
 * both pick the same pair at every step, so the ids are identical.  A
 * direct-mapped cache of recent words in front of it takes most of the
 * work on real text.  What this is not: a trainer, or BPE dropout (a
 * random process that a load with dropout > 0 refuses).
 *
 * SentencePiece-style files have no pre-tokenizer, so a whole line (or
 * document) is one word.  When no merge joins a token that does not end in
 * U+2581 to one that starts with it (checked at load; true of Llama-2,
 * Mistral and stories260K), no merge can ever cross the point before a
 * U+2581 that follows another character, so the word is cut there and the
 * pieces, ordinary words again, go through the cache: the same ids, found
 * an order of magnitude faster.
 */
#include <string.h>

#include "base/alloc.h"
#include "base/utf8.h"
#include "text/tokenizer.h"
#include "text/tokint.h"

/* ------------------------------------------------------------------ */
/* hashing and the string dictionary                                   */

/* A multiply-xorshift hash over 8-byte chunks: short keys (tokens, words)
 * dominate, and lengths are mixed in first so that the overlapping tail
 * reads cannot make two lengths collide systematically. */
uint64_t tok_hash(const void *p, size_t n)
{
	const uint8_t *s = p;
	uint64_t h = 0x9E3779B97F4A7C15ull * (n + 1), v;

	while (n >= 8) {
		memcpy(&v, s, 8);
		h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
		h ^= h >> 29;
		s += 8;
		n -= 8;
	}
	if (n >= 4) {
		uint32_t a, b;

		memcpy(&a, s, 4);
		memcpy(&b, s + n - 4, 4);
		v = (uint64_t)a << 32 | b;
	} else if (n > 0) {
		v = (uint64_t)s[0] << 16 | (uint64_t)s[n >> 1] << 8 | s[n - 1];
	} else {
		v = 0;
	}
	h = (h ^ v) * 0x94D049BB133111EBull;
	h ^= h >> 32;
	h *= 0xBF58476D1CE4E5B9ull;
	h ^= h >> 29;
	return h;
}

static int dict_rehash(struct tok_dict *d, size_t nslots)
{
	struct tok_slot *s = hp_malloc(nslots * sizeof(*s));

	if (!s)
		return HP_ENOMEM;
	for (size_t i = 0; i < nslots; i++)
		s[i].id = -1;
	for (size_t i = 0; d->slots && i <= d->mask; i++) {
		struct tok_slot *o = &d->slots[i];
		uint64_t h;
		size_t j;

		if (o->id < 0)
			continue;
		h = tok_hash(d->pool + o->off, o->len);
		for (j = h & (nslots - 1); s[j].id >= 0; j = (j + 1) & (nslots - 1))
			;
		s[j] = *o;
	}
	hp_free(d->slots);
	d->slots = s;
	d->mask = nslots - 1;
	return 0;
}

int tok_dict_put(struct tok_dict *d, const void *key, size_t len, int32_t id)
{
	uint64_t h = tok_hash(key, len);
	uint32_t tag = (uint32_t)(h >> 32);
	size_t i;

	/* keep the load under 5/8: linear probing stays short */
	if (!d->slots || (d->n + 1) * 8 > (d->mask + 1) * 5) {
		int rc = dict_rehash(d, d->slots ? (d->mask + 1) * 2 : 64);

		if (rc)
			return rc;
	}
	for (i = h & d->mask; d->slots[i].id >= 0; i = (i + 1) & d->mask) {
		struct tok_slot *s = &d->slots[i];

		if (s->tag == tag && s->len == len && !memcmp(d->pool + s->off, key, len)) {
			s->id = id;
			return 0;
		}
	}
	if (len > UINT32_MAX || d->pool_len + len > UINT32_MAX)
		return HP_ENOMEM;   /* offsets are 32-bit; 4 GiB of tokens is not a vocabulary */
	if (d->pool_len + len > d->pool_cap) {
		size_t cap = d->pool_cap ? d->pool_cap * 2 : 4096;
		char *p;

		while (cap < d->pool_len + len)
			cap *= 2;
		p = hp_realloc(d->pool, cap);
		if (!p)
			return HP_ENOMEM;
		d->pool = p;
		d->pool_cap = cap;
	}
	if (len)
		memcpy(d->pool + d->pool_len, key, len);
	d->slots[i] = (struct tok_slot){ (uint32_t)d->pool_len, (uint32_t)len, id, tag };
	d->pool_len += len;
	d->n++;
	return 0;
}

int32_t tok_dict_get_h(const struct tok_dict *d, const void *key, size_t len, uint64_t h)
{
	uint32_t tag = (uint32_t)(h >> 32);

	if (!d->slots)
		return -1;
	for (size_t i = h & d->mask;; i = (i + 1) & d->mask) {
		const struct tok_slot *s = &d->slots[i];

		if (s->id < 0)
			return -1;
		if (s->tag == tag && s->len == len && !memcmp(d->pool + s->off, key, len))
			return s->id;
	}
}

int32_t tok_dict_get(const struct tok_dict *d, const void *key, size_t len)
{
	return tok_dict_get_h(d, key, len, tok_hash(key, len));
}

void tok_dict_release(struct tok_dict *d)
{
	hp_free(d->pool);
	hp_free(d->slots);
	memset(d, 0, sizeof(*d));
}

int tok_out_push(struct tok_out *o, int32_t id)
{
	if (*o->n == *o->cap) {
		size_t cap = *o->cap ? *o->cap * 2 : 256;
		int32_t *p = hp_realloc(*o->ids, cap * sizeof(*p));

		if (!p)
			return HP_ENOMEM;
		*o->ids = p;
		*o->cap = cap;
	}
	(*o->ids)[(*o->n)++] = id;
	return 0;
}

void tok_bytelevel_tables(uint32_t byte_char[256], int16_t char_byte[324])
{
	uint32_t n = 0;

	for (int c = 0; c < 324; c++)
		char_byte[c] = -1;
	for (int b = 0; b < 256; b++) {
		int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;

		byte_char[b] = printable ? (uint32_t)b : 256 + n++;
		char_byte[byte_char[b]] = (int16_t)b;
	}
}

/* ------------------------------------------------------------------ */
/* loading                                                             */

#define FERR(code, ...) hp_err_set(e, code, "'%s': " __VA_ARGS__)

/* An optional string member: NULL when absent or null. */
static int opt_str(json_t *m, const char *key, const char **s, size_t *len, const char *file,
		   struct hp_err *e)
{
	json_t *v = json_object_get(m, key);

	*s = NULL;
	*len = 0;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v))
		return FERR(HP_EFORMAT, "model.%s is not a string", file, key);
	*s = json_string_value(v);
	*len = json_string_length(v);
	return 0;
}

static int opt_bool(json_t *m, const char *key, int *out, const char *file, struct hp_err *e)
{
	json_t *v = json_object_get(m, key);

	*out = 0;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_boolean(v))
		return FERR(HP_EFORMAT, "model.%s is not a boolean", file, key);
	*out = json_is_true(v);
	return 0;
}

/* Map a byte-level string back to bytes in out (room for len bytes).
 * Returns the byte count, or -1 if a character is outside the alphabet. */
static long bytelevel_to_raw(const int16_t char_byte[324], const char *s, size_t len, char *out)
{
	size_t i = 0, k = 0, cl;

	while (i < len) {
		uint32_t cp = tok_u8dec((const uint8_t *)s + i, &cl);

		if (cp >= 324 || char_byte[cp] < 0)
			return -1;
		out[k++] = (char)char_byte[cp];
		i += cl;
	}
	return (long)k;
}

static char *dup_n(const char *s, size_t n)
{
	char *p = hp_malloc(n + 1);

	if (p) {
		memcpy(p, s, n);
		p[n] = '\0';
	}
	return p;
}

static int merges_alloc(struct tok_bpe *b, size_t n)
{
	size_t slots = 16;
	int shift = 60;

	while (slots < n * 2) {   /* load under 1/2 */
		slots *= 2;
		shift--;
	}
	b->merges = hp_malloc(slots * sizeof(*b->merges));
	if (!b->merges)
		return HP_ENOMEM;
	for (size_t i = 0; i < slots; i++)
		b->merges[i].key = TOK_MERGE_EMPTY;
	b->merge_mask = slots - 1;
	b->merge_shift = shift;
	return 0;
}

static inline size_t merge_slot(const struct tok_bpe *b, uint64_t key)
{
	return (size_t)((key * 0x9E3779B97F4A7C15ull) >> b->merge_shift);
}

/* A later merge of the same pair replaces the earlier one, as HF's
 * collect() into a HashMap does. */
static void merge_put(struct tok_bpe *b, int32_t l, int32_t r, uint32_t rank, int32_t id)
{
	uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
	size_t i;

	for (i = merge_slot(b, key); b->merges[i].key != TOK_MERGE_EMPTY; i = (i + 1) & b->merge_mask)
		if (b->merges[i].key == key)
			break;
	b->merges[i] = (struct tok_merge){ key, rank, id };
}

static inline const struct tok_merge *merge_get(const struct tok_bpe *b, int32_t l, int32_t r)
{
	uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;

	for (size_t i = merge_slot(b, key);; i = (i + 1) & b->merge_mask) {
		const struct tok_merge *m = &b->merges[i];

		if (m->key == key)
			return m;
		if (m->key == TOK_MERGE_EMPTY)
			return NULL;
	}
}

/* One merge: its two halves as strings of the file's alphabet. */
static int merge_parts(json_t *v, size_t i, const char **a, size_t *al, const char **c, size_t *cl,
		       int *skip, const char *file, struct hp_err *e)
{
	*skip = 0;
	if (json_is_string(v)) {
		const char *s = json_string_value(v), *sp;
		size_t n = json_string_length(v);

		/* HF: lines starting with "#version" are a merges.txt header */
		if (n >= 8 && !memcmp(s, "#version", 8)) {
			*skip = 1;
			return 0;
		}
		sp = memchr(s, ' ', n);
		if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
			return FERR(HP_EFORMAT, "model.merges[%zu] is not two tokens separated by one space",
				    file, i);
		*a = s;
		*al = (size_t)(sp - s);
		*c = sp + 1;
		*cl = n - *al - 1;
		return 0;
	}
	if (json_is_array(v) && json_array_size(v) == 2 && json_is_string(json_array_get(v, 0)) &&
	    json_is_string(json_array_get(v, 1))) {
		*a = json_string_value(json_array_get(v, 0));
		*al = json_string_length(json_array_get(v, 0));
		*c = json_string_value(json_array_get(v, 1));
		*cl = json_string_length(json_array_get(v, 1));
		return 0;
	}
	return FERR(HP_EFORMAT, "model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", file, i);
}

/* SentencePiece's word-boundary mark U+2581, in UTF-8 */
#define META "\xE2\x96\x81"

static int load_merges(struct tok_bpe *b, json_t *merges, const char *file, struct hp_err *e)
{
	size_t n = json_array_size(merges), rank = 0, maxlen = 0;
	char *buf = NULL;
	int rc = merges_alloc(b, n);

	for (size_t i = 0; !rc && i < n; i++) {
		const char *a = NULL, *c = NULL;
		size_t al = 0, cl = 0, nl;
		int32_t ia, ic, in;
		int skip;

		rc = merge_parts(json_array_get(merges, i), i, &a, &al, &c, &cl, &skip, file, e);
		if (rc || skip)
			continue;
		ia = tok_dict_get(&b->vocab, a, al);
		ic = tok_dict_get(&b->vocab, c, cl);
		if (ia < 0 || ic < 0) {
			rc = FERR(HP_EFORMAT, "model.merges[%zu]: token '%.*s' is not in the vocabulary",
				  file, i, (int)(ia < 0 ? al : cl), ia < 0 ? a : c);
			break;
		}
		/* HF joins a with b less the continuing_subword_prefix */
		if (cl < b->prefix_len) {
			rc = FERR(HP_EFORMAT, "model.merges[%zu]: '%.*s' is shorter than the continuing_subword_prefix",
				  file, i, (int)cl, c);
			break;
		}
		nl = al + cl - b->prefix_len;
		if (nl > maxlen) {
			char *p = hp_realloc(buf, nl * 2 + 16);

			if (!p) {
				rc = HP_ENOMEM;
				break;
			}
			buf = p;
			maxlen = nl * 2 + 16;
		}
		memcpy(buf, a, al);
		memcpy(buf + al, c + b->prefix_len, cl - b->prefix_len);
		in = tok_dict_get(&b->vocab, buf, nl);
		if (in < 0) {
			rc = FERR(HP_EFORMAT, "model.merges[%zu]: merged token '%.*s' is not in the vocabulary",
				  file, i, (int)nl, buf);
			break;
		}
		merge_put(b, ia, ic, (uint32_t)rank++, in);
		if (cl >= 3 && !memcmp(c, META, 3) && !(al >= 3 && !memcmp(a + al - 3, META, 3)))
			b->cut_meta = 0;
	}
	hp_free(buf);
	return rc;
}

/* Byte mode: the raw-byte index of every vocabulary string in the alphabet. */
static int load_raw(struct tok_bpe *b, const int16_t char_byte[324])
{
	char *buf = NULL;
	size_t cap = 0;
	int rc = 0;

	for (size_t i = 0; !rc && i <= b->vocab.mask; i++) {
		const struct tok_slot *s = &b->vocab.slots[i];
		long k;

		if (s->id < 0)
			continue;
		if (s->len > cap) {
			char *p = hp_realloc(buf, s->len * 2);

			if (!p) {
				rc = HP_ENOMEM;
				break;
			}
			buf = p;
			cap = s->len * 2;
		}
		k = bytelevel_to_raw(char_byte, b->vocab.pool + s->off, s->len, buf);
		if (k >= 0)
			rc = tok_dict_put(&b->raw, buf, (size_t)k, s->id);
	}
	hp_free(buf);
	return rc;
}

/* The prefix or suffix as words are looked up: raw bytes in byte mode. */
static int affix(struct tok_bpe *b, const char *s, size_t len, const int16_t char_byte[324],
		 char **out, size_t *out_len, char **out_m, size_t *out_m_len, const char *what,
		 const char *file, struct hp_err *e)
{
	long k;

	if (!s || !len)
		return 0;   /* "" joins as nothing: the same as none */
	*out = dup_n(s, len);
	*out_m = hp_malloc(len + 1);
	if (!*out || !*out_m)
		return HP_ENOMEM;
	*out_len = len;
	if (!b->byte_mode) {
		memcpy(*out_m, s, len);
		*out_m_len = len;
		return 0;
	}
	k = bytelevel_to_raw(char_byte, s, len, *out_m);
	if (k < 0)
		return FERR(HP_EUNSUP, "model.%s '%s' is not byte-level text, which a ByteLevel pre-tokenizer needs",
			    file, what, *out);
	*out_m_len = (size_t)k;
	return 0;
}

int tok_bpe_load(struct tok_bpe *b, json_t *m, int byte_mode, const char *file, struct hp_err *e)
{
	json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
	json_t *dropout = json_object_get(m, "dropout");
	const char *unk, *pre, *suf, *key;
	size_t unk_len, pre_len, suf_len, nsb;
	uint32_t byte_char[256];
	int16_t char_byte[324];
	json_t *v;
	int rc;

	memset(b, 0, sizeof(*b));
	b->byte_mode = byte_mode;
	b->unk_id = -1;
	tok_bytelevel_tables(byte_char, char_byte);
	for (int i = 0; i < 256; i++) {
		b->bl_len[i] = (uint8_t)hp_utf8_encode(byte_char[i], b->bl[i]);
		b->single[i] = b->fallback[i] = -1;
	}
	if (dropout && !json_is_null(dropout)) {
		if (!json_is_number(dropout))
			return FERR(HP_EFORMAT, "model.dropout is not a number", file);
		if (json_number_value(dropout) != 0.0)
			return FERR(HP_EUNSUP, "model.dropout %g is not supported (it samples); supported: null or 0",
				    file, json_number_value(dropout));
	}
	if ((rc = opt_str(m, "unk_token", &unk, &unk_len, file, e)) ||
	    (rc = opt_str(m, "continuing_subword_prefix", &pre, &pre_len, file, e)) ||
	    (rc = opt_str(m, "end_of_word_suffix", &suf, &suf_len, file, e)) ||
	    (rc = opt_bool(m, "fuse_unk", &b->fuse_unk, file, e)) ||
	    (rc = opt_bool(m, "byte_fallback", &b->byte_fallback, file, e)) ||
	    (rc = opt_bool(m, "ignore_merges", &b->ignore_merges, file, e)))
		return rc;
	if (!json_is_object(vocab))
		return FERR(HP_EFORMAT, "model.vocab is missing or not an object", file);
	if (!json_is_array(merges))
		return FERR(HP_EFORMAT, "model.merges is missing or not an array", file);
	if (unk && !(b->unk = dup_n(unk, unk_len)))
		return HP_ENOMEM;
	b->unk_len = unk_len;

	json_object_foreach(vocab, key, v) {
		json_int_t id;

		if (!json_is_integer(v) || (id = json_integer_value(v)) < 0 || id >= HP_TOK_MAX_ID) {
			if (json_is_integer(v) && json_integer_value(v) >= HP_TOK_MAX_ID)
				return FERR(HP_EUNSUP, "model.vocab['%s'] = %" JSON_INTEGER_FORMAT
					    " is past the largest id hp accepts (%d)", file, key,
					    json_integer_value(v), HP_TOK_MAX_ID - 1);
			return FERR(HP_EFORMAT, "model.vocab['%s'] is not an id (an integer >= 0)", file, key);
		}
		if ((rc = tok_dict_put(&b->vocab, key, strlen(key), (int32_t)id)))
			return rc;
	}
	if ((rc = affix(b, pre, pre_len, char_byte, &b->prefix, &b->prefix_len, &b->prefix_m,
			&b->prefix_m_len, "continuing_subword_prefix", file, e)) ||
	    (rc = affix(b, suf, suf_len, char_byte, &b->suffix, &b->suffix_len, &b->suffix_m,
			&b->suffix_m_len, "end_of_word_suffix", file, e)))
		return rc;
	/* cutting needs the mark itself as the first symbol after the cut,
	 * and an unk that cannot pass for a token ending in it */
	b->cut_meta = !byte_mode && !b->prefix && !b->suffix && tok_dict_get(&b->vocab, META, 3) >= 0 &&
		      !(unk && unk_len >= 3 && !memcmp(unk + unk_len - 3, META, 3));
	if ((rc = load_merges(b, merges, file, e)))
		return rc;
	if (byte_mode && (rc = load_raw(b, char_byte)))
		return rc;
	if (unk)
		b->unk_id = tok_dict_get(&b->vocab, unk, unk_len);
	for (int i = 0; i < 256; i++) {
		char code[8];
		uint8_t c = (uint8_t)i;

		/* HF's format!("<{b:#04X}>"): "<0x" and two upper-case digits */
		snprintf(code, sizeof(code), "<0x%02X>", (unsigned)i);
		b->fallback[i] = tok_dict_get(&b->vocab, code, 6);
		if (byte_mode)
			b->single[i] = tok_dict_get(&b->raw, &c, 1);
	}
	if (!byte_mode && !b->prefix && !b->suffix) {
		b->bmp = hp_malloc(65536 * sizeof(*b->bmp));
		if (!b->bmp)
			return HP_ENOMEM;
		for (size_t i = 0; i < 65536; i++)
			b->bmp[i] = -1;
		for (size_t i = 0; i <= b->vocab.mask; i++) {
			const struct tok_slot *s = &b->vocab.slots[i];
			size_t cl;
			uint32_t cp;

			if (s->id < 0 || !s->len)
				continue;
			cp = tok_u8dec((const uint8_t *)b->vocab.pool + s->off, &cl);
			if (cl == s->len && cp < 65536)
				b->bmp[cp] = s->id;
		}
	}
	/* room for one initial symbol's string, in either alphabet */
	nsb = b->prefix_len + b->suffix_len + b->prefix_m_len + b->suffix_m_len + 8;
	b->sbuf = hp_malloc(nsb);
	b->sbuf_cap = nsb;
	b->cache = hp_calloc(TOK_CACHE_SLOTS, sizeof(*b->cache));
	if (!b->sbuf || !b->cache)
		return HP_ENOMEM;
	return 0;
}

void tok_bpe_release(struct tok_bpe *b)
{
	if (!b)
		return;
	tok_dict_release(&b->vocab);
	tok_dict_release(&b->raw);
	hp_free(b->unk);
	hp_free(b->prefix);
	hp_free(b->suffix);
	hp_free(b->prefix_m);
	hp_free(b->suffix_m);
	hp_free(b->merges);
	hp_free(b->bmp);
	hp_free(b->sym);
	hp_free(b->nid);
	hp_free(b->prev);
	hp_free(b->next);
	hp_free(b->rank);
	hp_free(b->heap);
	hp_free(b->sbuf);
	hp_free(b->cache);
	memset(b, 0, sizeof(*b));
}

int32_t tok_bpe_token_id(const struct tok_bpe *b, const char *s, size_t len)
{
	return tok_dict_get(&b->vocab, s, len);
}

/* ------------------------------------------------------------------ */
/* encoding one word                                                   */

struct tok_heap_item {
	uint32_t rank, pos;
	int32_t id;
};

static int reserve(struct tok_bpe *b, size_t n)
{
	if (n <= b->sym_cap)
		return 0;
	n = n < 64 ? 64 : n + n / 2;
	hp_free(b->sym);
	hp_free(b->nid);
	hp_free(b->prev);
	hp_free(b->next);
	hp_free(b->rank);
	b->sym = hp_malloc(n * sizeof(*b->sym));
	b->nid = hp_malloc(n * sizeof(*b->nid));
	b->prev = hp_malloc(n * sizeof(*b->prev));
	b->next = hp_malloc(n * sizeof(*b->next));
	b->rank = hp_malloc(n * sizeof(*b->rank));
	if (!b->sym || !b->nid || !b->prev || !b->next || !b->rank) {
		b->sym_cap = 0;
		return HP_ENOMEM;
	}
	b->sym_cap = n;
	return 0;
}

/*
 * HF's merge_word() before merge_all(): one symbol per character (per byte
 * in byte mode) with the prefix on all but the first and the suffix on the
 * last; a character that is not a token becomes its <0xXX> byte tokens
 * when all exist (byte_fallback), else the unk token, consecutive unks
 * fused into one when fuse_unk.  Like HF, a pending unk is flushed only by
 * the next known character, so byte-fallback tokens can come before it.
 */
static int initial_symbols(struct tok_bpe *b, const uint8_t *w, size_t n, size_t *nsym,
			   struct hp_err *e)
{
	int32_t *sym = b->sym;
	int fast = !b->prefix && !b->suffix, unk = 0;
	size_t k = 0, i = 0, cl;

	while (i < n) {
		int32_t id;
		uint32_t cp = 0;

		if (b->byte_mode) {
			cl = 1;
			id = fast ? b->single[w[i]] : -1;
		} else {
			cp = tok_u8dec(w + i, &cl);
			id = fast && cp < 65536 ? b->bmp[cp] : -1;
		}
		if (id < 0 && !(fast && (b->byte_mode || cp < 65536))) {
			/* the symbol string in the lookup alphabet */
			char *s = b->sbuf;
			size_t sl = 0;

			if (i > 0 && b->prefix) {
				memcpy(s, b->prefix_m, b->prefix_m_len);
				sl = b->prefix_m_len;
			}
			memcpy(s + sl, w + i, cl);
			sl += cl;
			if (i + cl == n && b->suffix) {
				memcpy(s + sl, b->suffix_m, b->suffix_m_len);
				sl += b->suffix_m_len;
			}
			id = tok_dict_get(b->byte_mode ? &b->raw : &b->vocab, s, sl);
		}
		if (id >= 0) {
			if (unk) {
				sym[k++] = b->unk_id;
				unk = 0;
			}
			sym[k++] = id;
			i += cl;
			continue;
		}
		if (b->byte_fallback) {
			/* the bytes of the symbol string as the file writes it */
			uint8_t fb[64];
			size_t fl = 0, j;
			const uint8_t *src;

			if (i > 0 && b->prefix)
				fl += b->prefix_len;
			fl += b->byte_mode ? b->bl_len[w[i]] : cl;
			if (i + cl == n && b->suffix)
				fl += b->suffix_len;
			if (fl <= sizeof(fb)) {
				size_t at = 0;

				if (i > 0 && b->prefix) {
					memcpy(fb, b->prefix, b->prefix_len);
					at = b->prefix_len;
				}
				src = b->byte_mode ? b->bl[w[i]] : w + i;
				memcpy(fb + at, src, b->byte_mode ? b->bl_len[w[i]] : cl);
				at += b->byte_mode ? b->bl_len[w[i]] : cl;
				if (i + cl == n && b->suffix)
					memcpy(fb + at, b->suffix, b->suffix_len);
				for (j = 0; j < fl && b->fallback[fb[j]] >= 0; j++)
					;
				if (j == fl) {
					for (j = 0; j < fl; j++)
						sym[k++] = b->fallback[fb[j]];
					i += cl;
					continue;
				}
			}
			/* a longer affix cannot have all its bytes as single
			 * tokens in any real vocabulary; treat it as unknown */
		}
		if (b->unk) {
			if (b->unk_id < 0)
				return hp_err_set(e, HP_EFORMAT, "unk_token '%s' is not in the vocabulary", b->unk);
			if (unk && !b->fuse_unk)
				sym[k++] = b->unk_id;
			unk = 1;
		}
		/* no unk_token: HF drops the character */
		i += cl;
	}
	if (unk)
		sym[k++] = b->unk_id;
	*nsym = k;
	return 0;
}

/* Up to this many symbols the O(n^2) scan beats a heap. */
#define TOK_SMALL_WORD 48

static void merge_small(const struct tok_bpe *b, int32_t *sym, size_t *np)
{
	uint32_t *rank = b->rank;
	int32_t *nid = b->nid;
	size_t n = *np;

	for (size_t i = 0; i + 1 < n; i++) {
		const struct tok_merge *m = merge_get(b, sym[i], sym[i + 1]);

		rank[i] = m ? m->rank : UINT32_MAX;
		nid[i] = m ? m->id : -1;
	}
	while (n > 1) {
		uint32_t best = UINT32_MAX;
		size_t bi = 0;
		const struct tok_merge *m;

		for (size_t i = 0; i + 1 < n; i++)
			if (rank[i] < best) {
				best = rank[i];
				bi = i;
			}
		if (best == UINT32_MAX)
			break;
		sym[bi] = nid[bi];
		memmove(sym + bi + 1, sym + bi + 2, (n - bi - 2) * sizeof(*sym));
		if (n >= bi + 3) {
			memmove(rank + bi + 1, rank + bi + 2, (n - bi - 3) * sizeof(*rank));
			memmove(nid + bi + 1, nid + bi + 2, (n - bi - 3) * sizeof(*nid));
		}
		n--;
		if (bi > 0) {
			m = merge_get(b, sym[bi - 1], sym[bi]);
			rank[bi - 1] = m ? m->rank : UINT32_MAX;
			nid[bi - 1] = m ? m->id : -1;
		}
		if (bi + 1 < n) {
			m = merge_get(b, sym[bi], sym[bi + 1]);
			rank[bi] = m ? m->rank : UINT32_MAX;
			nid[bi] = m ? m->id : -1;
		}
	}
	*np = n;
}

static inline int heap_less(const struct tok_heap_item *a, const struct tok_heap_item *c)
{
	return a->rank < c->rank || (a->rank == c->rank && a->pos < c->pos);
}

static void heap_push(struct tok_heap_item *h, size_t *n, struct tok_heap_item it)
{
	size_t i = (*n)++;

	while (i > 0) {
		size_t p = (i - 1) / 2;

		if (!heap_less(&it, &h[p]))
			break;
		h[i] = h[p];
		i = p;
	}
	h[i] = it;
}

static struct tok_heap_item heap_pop(struct tok_heap_item *h, size_t *n)
{
	struct tok_heap_item top = h[0], last = h[--(*n)];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= *n)
			break;
		if (c + 1 < *n && heap_less(&h[c + 1], &h[c]))
			c++;
		if (!heap_less(&h[c], &last))
			break;
		h[i] = h[c];
		i = c;
	}
	if (*n)
		h[i] = last;
	return top;
}

/* HF's Word::merge_all without dropout: a heap of (rank, position) over a
 * linked list; stale entries are skipped when popped. */
static int merge_heap(struct tok_bpe *b, int32_t *sym, size_t *np)
{
	int32_t *prev = b->prev, *next = b->next;
	size_t n = *np, hn = 0, k = 0;
	struct tok_heap_item *h;
	const struct tok_merge *m;

	/* n initial entries and at most two per merge */
	if (b->heap_cap < 3 * n) {
		hp_free(b->heap);
		b->heap = hp_malloc(3 * n * sizeof(*b->heap));
		b->heap_cap = b->heap ? 3 * n : 0;
		if (!b->heap)
			return HP_ENOMEM;
	}
	h = b->heap;
	for (size_t i = 0; i < n; i++) {
		prev[i] = (int32_t)i - 1;
		next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
		if (i + 1 < n && (m = merge_get(b, sym[i], sym[i + 1])))
			heap_push(h, &hn, (struct tok_heap_item){ m->rank, (uint32_t)i, m->id });
	}
	while (hn) {
		struct tok_heap_item top = heap_pop(h, &hn);
		int32_t p = (int32_t)top.pos, nx;

		if (sym[p] < 0 || (nx = next[p]) < 0)
			continue;
		m = merge_get(b, sym[p], sym[nx]);
		if (!m || m->id != top.id)
			continue;
		sym[p] = top.id;
		sym[nx] = -1;
		next[p] = next[nx];
		if (next[p] >= 0)
			prev[next[p]] = p;
		if (prev[p] >= 0 && (m = merge_get(b, sym[prev[p]], sym[p])))
			heap_push(h, &hn, (struct tok_heap_item){ m->rank, (uint32_t)prev[p], m->id });
		if (next[p] >= 0 && (m = merge_get(b, sym[p], sym[next[p]])))
			heap_push(h, &hn, (struct tok_heap_item){ m->rank, (uint32_t)p, m->id });
	}
	for (size_t i = 0; i < n; i++)
		if (sym[i] >= 0)
			sym[k++] = sym[i];
	*np = k;
	return 0;
}

/* BPE proper on one word or cut piece, through the cache. */
static int bpe_piece(struct tok_bpe *b, const uint8_t *w, size_t n, uint64_t h, struct tok_out *o,
		     struct hp_err *e)
{
	struct tok_cache_slot *c = NULL;
	size_t nsym = 0, per;
	int rc;

	if (n <= TOK_CACHE_WORD) {
		c = &b->cache[h & (TOK_CACHE_SLOTS - 1)];
		if (c->h == h && c->wlen == n && !memcmp(c->word, w, n)) {
			for (size_t i = 0; i < c->nids; i++)
				if ((rc = tok_out_push(o, c->ids[i])))
					return rc;
			return 0;
		}
	}
	/* symbols per input byte: a byte-fallback of the whole symbol string */
	per = 2 + b->prefix_len + b->suffix_len;
	if ((rc = reserve(b, n * per + 1)) || (rc = initial_symbols(b, w, n, &nsym, e)))
		return rc;
	if (nsym > TOK_SMALL_WORD)
		rc = merge_heap(b, b->sym, &nsym);
	else if (nsym > 1)
		merge_small(b, b->sym, &nsym);
	if (rc)
		return rc;
	if (c && nsym <= TOK_CACHE_IDS) {
		c->h = h;
		c->wlen = (uint8_t)n;
		c->nids = (uint8_t)nsym;
		memcpy(c->word, w, n);
		memcpy(c->ids, b->sym, nsym * sizeof(*b->sym));
	}
	for (size_t i = 0; i < nsym; i++)
		if ((rc = tok_out_push(o, b->sym[i])))
			return rc;
	return 0;
}

int tok_bpe_word(struct tok_bpe *b, const uint8_t *w, size_t n, struct tok_out *o,
		 struct hp_err *e)
{
	const uint8_t *p, *end = w + n, *at;
	uint64_t h;
	int32_t id;
	int rc;

	/* a lone byte cannot merge: the commonest word (space, punctuation) */
	if (n == 1 && b->byte_mode && !b->prefix && !b->suffix && b->single[w[0]] >= 0)
		return tok_out_push(o, b->single[w[0]]);
	h = tok_hash(w, n);
	if (b->ignore_merges &&
	    (id = tok_dict_get_h(b->byte_mode ? &b->raw : &b->vocab, w, n, h)) >= 0)
		return tok_out_push(o, id);
	if (!b->cut_meta)
		return bpe_piece(b, w, n, h, o, e);
	/* cut before every U+2581 that follows another character */
	for (p = w, at = w + 1; at < end; at++) {
		at = memmem(at, (size_t)(end - at), META, 3);
		if (!at)
			break;
		if (at - w >= 3 && !memcmp(at - 3, META, 3))
			continue;
		if ((rc = bpe_piece(b, p, (size_t)(at - p), tok_hash(p, (size_t)(at - p)), o, e)))
			return rc;
		p = at;
	}
	return bpe_piece(b, p, (size_t)(end - p), p == w ? h : tok_hash(p, (size_t)(end - p)), o, e);
}
