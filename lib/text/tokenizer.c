/*
 * tokenizer.c - HF tokenizer.json: loading, the encode pipeline in front of
 * the BPE model (added tokens, normalizers, pre-tokenizers) and decoding.
 *
 * The pipeline follows HF tokenizers 0.23 (tokenizer/added_vocabulary.rs,
 * normalizers/, pre_tokenizers/, decoders/) step by step, including its
 * odd corners (a Prepend normalizer skips empty pieces; the ByteFallback
 * decoder writes one U+FFFD per byte of an invalid run; added-token ids
 * come from the vocabulary, not from the file), because the goal is the
 * same ids as HF on any text, not a tokenizer that is merely plausible.
 * The BPE model itself is in tokbpe.c.
 *
 * Why libraries and not hand tables: PCRE2 runs the Split regexes (with
 * \p{L}, \p{N}, case-insensitive groups and lookahead, which a hand-written
 * matcher would only approximate) and utf8proc does NFC/NFKC.  Both carry
 * the Unicode character database and track new Unicode versions with their
 * distribution; a table copied into hp would silently age, and a
 * normalizer is easy to get subtly wrong (canonical ordering, Hangul,
 * composition exclusions).  Every PCRE2 allocation goes through hp_malloc
 * via a general context; utf8proc is only asked to write into our buffers.
 *
 * What this is not: HF's offsets, truncation, padding, post-processing or
 * pair encoding; a trainer; a general regex translator (Oniguruma and PCRE2
 * agree on the syntax these files use; \s is the one rewrite, see below).
 */
#include <errno.h>
#include <inttypes.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include "base/alloc.h"
#include "base/utf8.h"
#include "text/tokenizer.h"
#include "text/tokint.h"

/* ------------------------------------------------------------------ */
/* types                                                               */

/* A pattern: a String one is matched with memmem, a Regex one by PCRE2. */
struct tok_re {
	char *lit;
	size_t lit_len;
	pcre2_code *code;
	pcre2_match_data *md;   /* encode's; decode makes its own (it is const) */
	int jit;
};

enum tok_norm_kind { TN_NFC, TN_NFD, TN_NFKC, TN_NFKD, TN_PREPEND, TN_REPLACE };

struct tok_norm {
	enum tok_norm_kind kind;
	char *s;                /* Prepend's text, Replace's content */
	size_t len;
	struct tok_re re;       /* Replace's pattern */
};

enum tok_pre_kind { TP_SPLIT, TP_BYTELEVEL, TP_METASPACE };
enum tok_behavior { TB_REMOVED, TB_ISOLATED, TB_MERGED_PREV, TB_MERGED_NEXT, TB_CONTIGUOUS };
enum tok_prepend { TS_NEVER, TS_FIRST, TS_ALWAYS };

struct tok_pre {
	enum tok_pre_kind kind;
	struct tok_re re;       /* Split's pattern; ByteLevel's GPT-2 regex */
	enum tok_behavior behavior;
	int invert;
	int add_prefix_space, use_regex;   /* ByteLevel */
	uint8_t rep[4];                    /* Metaspace's replacement, UTF-8 */
	size_t rep_len;
	enum tok_prepend prepend;
	int split;
	char *buf;              /* this step's rewritten piece */
	size_t cap;
};

enum tok_dec_kind { TD_BYTELEVEL, TD_REPLACE, TD_BYTEFALLBACK, TD_FUSE, TD_STRIP, TD_METASPACE };

struct tok_dec {
	enum tok_dec_kind kind;
	struct tok_re re;       /* Replace */
	char *content;
	size_t content_len;
	uint32_t strip_cp;      /* Strip */
	size_t start, stop;
	uint8_t rep[4];         /* Metaspace */
	size_t rep_len;
	uint32_t rep_cp;
	enum tok_prepend prepend;
};

/* An added token, one per id (HF's added_tokens_map_r). */
struct tok_added {
	char *content;
	size_t len;
	char *norm;             /* the normalized content when it differs */
	size_t norm_len;
	int32_t id;
	int single_word, lstrip, rstrip, normalized, special;
};

/* A byte trie of added-token patterns for leftmost-longest matching. */
struct tok_trie_node {
	int32_t child, sibling, tok;
	uint8_t byte;
};

struct tok_trie {
	struct tok_trie_node *node;
	size_t n, cap, count;
	int32_t root[256];
	int only_first;         /* the one byte every pattern starts with, or -1 */
};

struct hp_tokenizer {
	char *file;
	pcre2_general_context *gctx;
	pcre2_compile_context *cctx;
	pcre2_match_context *mctx;
	struct tok_norm *norm;
	size_t nnorm;
	struct tok_pre *pre;
	size_t npre;
	struct tok_dec *dec;
	size_t ndec;
	int has_decoder;
	struct tok_bpe bpe;
	struct tok_added *added;
	size_t nadded;
	struct tok_dict added_map;      /* content -> id */
	struct tok_trie trie_raw, trie_norm;
	const char **tok_str;           /* id -> token for decode; NULL for a hole */
	uint32_t *tok_len;
	uint8_t *is_added;              /* id -> 1 for an added token */
	int64_t vocab_size;
	int32_t eod;
	uint32_t byte_char[256];
	int16_t char_byte[324];
	/* encode scratch and per-call state */
	struct tok_out out;
	char *nbuf[2];
	size_t ncap[2];
	int32_t *cps;
	size_t cps_cap;
	int text_max;                   /* the largest byte of the text being encoded */
	/* hp_tok_encode_marked: the text's marks, the tokens' (grown with
	 * out.ids), and a scratch vector for prefix encodes */
	const uint8_t *mark;
	uint8_t **tmark;
	size_t tmark_cap;
	int32_t *pre_ids;
	size_t pre_cap;
};

#define FERR(code, ...) hp_err_set(e, code, "'%s': " __VA_ARGS__)

static int grow(void *pp, size_t *cap, size_t need, size_t size)
{
	void **p = pp;
	size_t c = *cap ? *cap : 16;
	void *q;

	if (need <= *cap)
		return 0;
	while (c < need)
		c *= 2;
	q = hp_realloc(*p, c * size);
	if (!q)
		return HP_ENOMEM;
	*p = q;
	*cap = c;
	return 0;
}

static char *dupn(const char *s, size_t n)
{
	char *p = hp_malloc(n + 1);

	if (p) {
		if (n)
			memcpy(p, s, n);
		p[n] = '\0';
	}
	return p;
}

/* ------------------------------------------------------------------ */
/* patterns                                                            */

static void *pc_malloc(PCRE2_SIZE n, void *data)
{
	(void)data;
	return hp_malloc(n);
}

static void pc_free(void *p, void *data)
{
	(void)data;
	hp_free(p);
}

/*
 * HF compiles with Oniguruma, whose \s is Unicode White_Space; PCRE2's \s
 * under UCP also matches U+180E (no longer White_Space since Unicode 6.3).
 * Spell both as the property, which PCRE2 10.40+ knows; the rest of the
 * syntax these files use means the same in both engines.  \Q..\E quotes
 * are copied untouched.  out has room for 16 * len + 1 bytes.
 */
static size_t rewrite_space(const char *p, size_t len, char *out)
{
	static const char ws[] = "\\p{White_Space}", nws[] = "\\P{White_Space}";
	size_t i = 0, k = 0;

	while (i < len) {
		if (p[i] != '\\' || i + 1 == len) {
			out[k++] = p[i++];
			continue;
		}
		if (p[i + 1] == 's' || p[i + 1] == 'S') {
			memcpy(out + k, p[i + 1] == 's' ? ws : nws, sizeof(ws) - 1);
			k += sizeof(ws) - 1;
			i += 2;
		} else if (p[i + 1] == 'Q') {
			const char *end = NULL;

			for (size_t j = i + 2; j + 1 < len; j++)
				if (p[j] == '\\' && p[j + 1] == 'E') {
					end = p + j + 2;
					break;
				}
			if (!end)
				end = p + len;
			memcpy(out + k, p + i, (size_t)(end - (p + i)));
			k += (size_t)(end - (p + i));
			i = (size_t)(end - p);
		} else {
			out[k++] = p[i++];
			out[k++] = p[i++];
		}
	}
	return k;
}

static int re_compile(struct hp_tokenizer *t, struct tok_re *re, const char *pat, size_t len,
		      int literal, const char *where, struct hp_err *e)
{
	PCRE2_UCHAR msg[256];
	PCRE2_SIZE off;
	char *buf;
	size_t n;
	int err;

	if (literal) {
		if (!len)
			return FERR(HP_EUNSUP, "%s: an empty String pattern is not supported", t->file, where);
		re->lit = dupn(pat, len);
		re->lit_len = len;
		return re->lit ? 0 : HP_ENOMEM;
	}
	if (len > SIZE_MAX / 16 - 1 || !(buf = hp_malloc(16 * len + 1)))
		return HP_ENOMEM;
	n = rewrite_space(pat, len, buf);
	re->code = pcre2_compile((PCRE2_SPTR)buf, n, PCRE2_UTF | PCRE2_UCP, &err, &off, t->cctx);
	hp_free(buf);
	if (!re->code) {
		if (err == PCRE2_ERROR_HEAP_FAILED)
			return HP_ENOMEM;
		pcre2_get_error_message(err, msg, sizeof(msg));
		return FERR(HP_EFORMAT, "%s: regex '%.*s' does not compile: %s", t->file, where,
			    (int)len, pat, (const char *)msg);
	}
	/* no JIT (or no memory for it) only costs speed */
	re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
	re->md = pcre2_match_data_create_from_pattern(re->code, t->gctx);
	return re->md ? 0 : HP_ENOMEM;
}

static void re_release(struct tok_re *re)
{
	hp_free(re->lit);
	pcre2_match_data_free(re->md);
	pcre2_code_free(re->code);
	memset(re, 0, sizeof(*re));
}

static int re_error(int rc, struct hp_err *e)
{
	PCRE2_UCHAR msg[256];

	if (rc == PCRE2_ERROR_NOMEMORY)
		return HP_ENOMEM;
	pcre2_get_error_message(rc, msg, sizeof(msg));
	return hp_err_set(e, HP_EUNSUP, "regex match failed: %s", (const char *)msg);
}

/*
 * The next match of re in s[0..len) at or after *pos, with the rule of
 * Oniguruma's find_iter (the onig crate, which HF uses): an empty match
 * right where the previous match ended is skipped by moving one character
 * on.  *last is that end (SIZE_MAX before the first match).  Returns 1 with
 * [*ms, *me), 0 when there are no more, or a negative HP_E* code.
 */
static int re_next(const struct hp_tokenizer *t, const struct tok_re *re, pcre2_match_data *md,
		   const char *s, size_t len, size_t *pos, size_t *last, size_t *ms, size_t *me,
		   struct hp_err *e)
{
	for (;;) {
		size_t a, b;

		if (*pos > len)
			return 0;
		if (re->lit) {
			const char *p = memmem(s + *pos, len - *pos, re->lit, re->lit_len);

			if (!p)
				return 0;
			a = (size_t)(p - s);
			b = a + re->lit_len;
		} else {
			int rc = PCRE2_ERROR_JIT_STACKLIMIT;
			PCRE2_SIZE *ov;

			if (re->jit)
				rc = pcre2_jit_match(re->code, (PCRE2_SPTR)s, len, *pos, 0, md, t->mctx);
			/* the interpreter keeps its backtracking on the heap: no
			 * stack limit, only PCRE2's match and heap limits */
			if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
				rc = pcre2_match(re->code, (PCRE2_SPTR)s, len, *pos,
						 PCRE2_NO_JIT | PCRE2_NO_UTF_CHECK, md, t->mctx);
			if (rc == PCRE2_ERROR_NOMATCH)
				return 0;
			if (rc < 0)
				return re_error(rc, e);
			ov = pcre2_get_ovector_pointer(md);
			a = ov[0];
			b = ov[1];
			if (a > b)   /* \K in a lookahead; PCRE2 forbids it by default */
				a = b;
		}
		if (a == b && *last == b) {
			*pos += *pos < len ? tok_u8len((uint8_t)s[*pos]) : 1;
			continue;
		}
		*pos = b;
		*last = b;
		*ms = a;
		*me = b;
		return 1;
	}
}

/* ------------------------------------------------------------------ */
/* Unicode helpers                                                     */

/* Offset of the first byte that is not valid UTF-8, or len. */
static size_t utf8_check(const uint8_t *s, size_t len, int *max)
{
	size_t i = 0;
	uint8_t hi = 0;

	while (i < len) {
		uint8_t c = s[i];
		unsigned lo, top;
		size_t need;
		uint64_t w;

		/* ASCII eight bytes at a time: most text is mostly ASCII */
		if (i + 8 <= len && (memcpy(&w, s + i, 8), !(w & 0x8080808080808080ull))) {
			i += 8;
			continue;
		}
		if (c < 0x80) {
			i++;
			continue;
		}
		if (c > hi)
			hi = c;
		if (!(need = hp_utf8_lead(c, &lo, &top)))
			return i;
		if (i + need >= len)   /* truncated at the end */
			return i;
		if (s[i + 1] < lo || s[i + 1] > top)
			return i;
		for (size_t k = 2; k <= need; k++)
			if ((s[i + k] & 0xC0) != 0x80)
				return i;
		i += need + 1;
	}
	*max = hi;
	return len;
}

/* Rust's String::from_utf8_lossy: each maximal invalid subpart becomes
 * one U+FFFD.  Appends to out (grown) at *olen. */
static int utf8_lossy(const uint8_t *s, size_t n, char **out, size_t *olen, size_t *ocap)
{
	size_t i = 0;
	int rc = grow(out, ocap, *olen + 3 * n + 1, 1);

	if (rc)
		return rc;
	while (i < n) {
		uint8_t c = s[i];
		unsigned lo, top;
		size_t need, got = 1;

		if (c < 0x80) {
			(*out)[(*olen)++] = (char)c;
			i++;
			continue;
		}
		need = hp_utf8_lead(c, &lo, &top);
		if (need && i + 1 < n && s[i + 1] >= lo && s[i + 1] <= top) {
			got = 2;
			while (got <= need && i + got < n && (s[i + got] & 0xC0) == 0x80)
				got++;
		}
		if (need && got == need + 1) {
			memcpy(*out + *olen, s + i, got);
			*olen += got;
		} else {
			memcpy(*out + *olen, "\xEF\xBF\xBD", 3);
			*olen += 3;
		}
		i += got;
	}
	return 0;
}

/* Rust's char::is_whitespace: the White_Space property. */
static int is_space_cp(uint32_t cp)
{
	utf8proc_category_t c;

	if ((cp >= 9 && cp <= 13) || cp == 0x85)
		return 1;
	c = utf8proc_category((utf8proc_int32_t)cp);
	return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

/* The regex crate's Unicode \w (Alphabetic, marks, Nd, Pc, joiners), from
 * general categories: Other_Alphabetic symbols such as circled letters are
 * the one gap, and only single_word added tokens look at this. */
static int is_word_cp(uint32_t cp)
{
	switch (utf8proc_category((utf8proc_int32_t)cp)) {
	case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
	case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
	case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
	case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
		return 1;
	default:
		return cp == 0x200C || cp == 0x200D;
	}
}

/* The code point that ends s[0..n), n > 0. */
static uint32_t last_cp(const char *s, size_t n, size_t *start)
{
	size_t i = n - 1, cl;

	while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80)
		i--;
	*start = i;
	return tok_u8dec((const uint8_t *)s + i, &cl);
}

/* ------------------------------------------------------------------ */
/* the encode pipeline                                                 */

static int pretok(struct hp_tokenizer *t, size_t k, const char *s, size_t len, int first,
		  struct hp_err *e);

/*
 * HF's split behaviors over a stream of (start, end, is_match) elements,
 * streamed rather than collected: only MergedWithPrevious, MergedWithNext
 * and Contiguous hold one piece back, to see whether the next extends it.
 */
struct tok_emit {
	struct hp_tokenizer *t;
	size_t next;            /* the pre-tokenizer step pieces go to */
	const char *s;
	int first;              /* s starts the original text */
	enum tok_behavior how;
	int have, prev_m;       /* a held piece [ps, pe); the last element's flag */
	size_t ps, pe;
};

static int emit_piece(struct tok_emit *em, size_t a, size_t b, struct hp_err *e)
{
	if (a == b)
		return 0;   /* HF drops empty splits */
	return pretok(em->t, em->next, em->s + a, b - a, em->first && a == 0, e);
}

static int emit_flush(struct tok_emit *em, struct hp_err *e)
{
	if (!em->have)
		return 0;
	em->have = 0;
	return emit_piece(em, em->ps, em->pe, e);
}

static int emit_elem(struct tok_emit *em, size_t a, size_t b, int m, struct hp_err *e)
{
	int rc = 0;

	switch (em->how) {
	case TB_ISOLATED:
		return emit_piece(em, a, b, e);
	case TB_REMOVED:
		return m ? 0 : emit_piece(em, a, b, e);
	case TB_CONTIGUOUS:
	case TB_MERGED_PREV:
		/* Contiguous joins runs of equal flags; MergedWithPrevious
		 * joins a match onto the non-match before it */
		if (em->have && (em->how == TB_CONTIGUOUS ? m == em->prev_m : m && !em->prev_m)) {
			em->pe = b;
		} else {
			rc = emit_flush(em, e);
			em->have = 1;
			em->ps = a;
			em->pe = b;
		}
		em->prev_m = m;
		return rc;
	case TB_MERGED_NEXT:
		/* a match joins the non-match after it; held while unknown */
		if (em->have && !m) {
			em->have = 0;
			return emit_piece(em, em->ps, b, e);
		}
		if ((rc = emit_flush(em, e)))
			return rc;
		if (!m)
			return emit_piece(em, a, b, e);
		em->have = 1;
		em->ps = a;
		em->pe = b;
		return 0;
	}
	return 0;
}

/* HF's NormalizedString::split(pattern, behavior) (Pattern::find_matches
 * and the behavior fold), each piece sent on to step next. */
static int split_step(struct hp_tokenizer *t, size_t next, const struct tok_re *re,
		      enum tok_behavior how, int invert, const char *s, size_t len, int first,
		      struct hp_err *e)
{
	struct tok_emit em = { t, next, s, first, how, 0, 0, 0, 0 };
	size_t pos = 0, last = SIZE_MAX, prev = 0, a, b;
	int rc;

	while ((rc = re_next(t, re, re->md, s, len, &pos, &last, &a, &b, e)) == 1) {
		if (prev != a && (rc = emit_elem(&em, prev, a, invert, e)))
			return rc;
		if ((rc = emit_elem(&em, a, b, !invert, e)))
			return rc;
		prev = b;
	}
	if (rc < 0)
		return rc;
	if (prev != len && (rc = emit_elem(&em, prev, len, invert, e)))
		return rc;
	return emit_flush(&em, e);
}

/* Metaspace: ' ' -> replacement, the prefix, then a split before every
 * replacement character (MergedWithNext on a char pattern). */
static int metaspace_step(struct hp_tokenizer *t, size_t k, const char *s, size_t len, int first,
			  struct hp_err *e)
{
	struct tok_pre *p = &t->pre[k];
	struct tok_emit em = { t, k + 1, NULL, first, TB_MERGED_NEXT, 0, 0, 0, 0 };
	size_t n = 0, prev = 0, i;
	int rc = grow(&p->buf, &p->cap, len * p->rep_len + p->rep_len + 1, 1);

	if (rc)
		return rc;
	for (i = 0; i < len; i++) {
		if (s[i] == ' ') {
			memcpy(p->buf + n, p->rep, p->rep_len);
			n += p->rep_len;
		} else {
			p->buf[n++] = s[i];
		}
	}
	if ((p->prepend == TS_ALWAYS || (p->prepend == TS_FIRST && first)) &&
	    !(n >= p->rep_len && !memcmp(p->buf, p->rep, p->rep_len))) {
		memmove(p->buf + p->rep_len, p->buf, n);
		memcpy(p->buf, p->rep, p->rep_len);
		n += p->rep_len;
	}
	if (!p->split)
		return pretok(t, k + 1, p->buf, n, first, e);
	em.s = p->buf;
	for (i = 0; i + p->rep_len <= n;) {
		if (memcmp(p->buf + i, p->rep, p->rep_len)) {
			i += tok_u8len((uint8_t)p->buf[i]);
			continue;
		}
		if (prev != i && (rc = emit_elem(&em, prev, i, 0, e)))
			return rc;
		if ((rc = emit_elem(&em, i, i + p->rep_len, 1, e)))
			return rc;
		i += p->rep_len;
		prev = i;
	}
	if (prev != n && (rc = emit_elem(&em, prev, n, 0, e)))
		return rc;
	return emit_flush(&em, e);
}

/* Pre-tokenizer step k on one piece; past the last step, the model. */
static int pretok(struct hp_tokenizer *t, size_t k, const char *s, size_t len, int first,
		  struct hp_err *e)
{
	struct tok_pre *p;
	int rc;

	if (!len)
		return 0;
	if (k == t->npre)
		return tok_bpe_word(&t->bpe, (const uint8_t *)s, len, &t->out, e);
	p = &t->pre[k];
	switch (p->kind) {
	case TP_SPLIT:
		return split_step(t, k + 1, &p->re, p->behavior, p->invert, s, len, first, e);
	case TP_BYTELEVEL:
		/* the byte-to-character mapping itself is folded into the
		 * model's byte mode: ByteLevel is always the last step */
		if (p->add_prefix_space && s[0] != ' ') {
			if ((rc = grow(&p->buf, &p->cap, len + 1, 1)))
				return rc;
			p->buf[0] = ' ';
			memcpy(p->buf + 1, s, len);
			s = p->buf;
			len++;
		}
		if (p->use_regex)
			return split_step(t, k + 1, &p->re, TB_ISOLATED, 0, s, len, first, e);
		return pretok(t, k + 1, s, len, first, e);
	case TP_METASPACE:
		return metaspace_step(t, k, s, len, first, e);
	}
	return 0;
}

/* One Unicode normalization of s[0..len) appended to nbuf[dst] at *olen. */
static int unicode_run(struct hp_tokenizer *t, utf8proc_option_t opt, const char *s, size_t len,
		       int dst, size_t *olen, struct hp_err *e)
{
	utf8proc_ssize_t n;
	int rc;

	for (;;) {
		n = utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, t->cps,
				       (utf8proc_ssize_t)t->cps_cap, opt);
		if (n < 0)
			return hp_err_set(e, HP_EFORMAT, "normalization failed: %s", utf8proc_errmsg(n));
		if ((size_t)n <= t->cps_cap)
			break;
		if ((rc = grow(&t->cps, &t->cps_cap, (size_t)n, sizeof(*t->cps))))
			return rc;
	}
	n = utf8proc_normalize_utf32(t->cps, n, opt);
	if (n < 0)
		return hp_err_set(e, HP_EFORMAT, "normalization failed: %s", utf8proc_errmsg(n));
	if ((rc = grow(&t->nbuf[dst], &t->ncap[dst], *olen + 4 * (size_t)n + 1, 1)))
		return rc;
	for (utf8proc_ssize_t i = 0; i < n; i++)
		*olen += hp_utf8_encode((uint32_t)t->cps[i], (unsigned char *)t->nbuf[dst] + *olen);
	return 0;
}

/*
 * NFC, NFD, NFKC or NFKD of s into nbuf[dst].  ASCII is left alone by all
 * four, and no composition has an ASCII second half, so an ASCII character
 * only ever changes with the non-ASCII run right after it: each maximal
 * non-ASCII run is normalized together with the one character before it,
 * and the rest is copied.  For NFC a run without a byte >= 0xCC (nothing
 * from U+0300 up, where the first character NFC changes lives) is copied
 * too.  Text that is mostly ASCII then costs a copy, not a utf8proc pass.
 */
static int unicode_norm(struct hp_tokenizer *t, enum tok_norm_kind kind, const char *s, size_t len,
			int dst, size_t *olen, struct hp_err *e)
{
	utf8proc_option_t opt = UTF8PROC_STABLE;
	size_t i = 0, k = 0;
	int rc;

	opt |= kind == TN_NFC || kind == TN_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
	if (kind == TN_NFKC || kind == TN_NFKD)
		opt |= UTF8PROC_COMPAT;
	if ((rc = grow(&t->nbuf[dst], &t->ncap[dst], len + 1, 1)))
		return rc;
	while (i < len) {
		size_t a = i, r;
		int work = kind != TN_NFC;

		while (i < len && (uint8_t)s[i] < 0x80)
			i++;
		memcpy(t->nbuf[dst] + k, s + a, i - a);
		k += i - a;
		for (r = i; i < len && (uint8_t)s[i] >= 0x80; i++)
			work |= (uint8_t)s[i] >= 0xCC;
		if (r == i)
			continue;
		if (!work) {
			if ((rc = grow(&t->nbuf[dst], &t->ncap[dst], k + (i - r) + 1, 1)))
				return rc;
			memcpy(t->nbuf[dst] + k, s + r, i - r);
			k += i - r;
			continue;
		}
		if (r > 0) {   /* take back the ASCII base, normalize it with the run */
			r--;
			k--;
		}
		if ((rc = unicode_run(t, opt, s + r, i - r, dst, &k, e)))
			return rc;
	}
	*olen = k;
	return 0;
}

/* The normalizer chain on one piece; *out is s itself or a scratch buffer. */
static int normalize(struct hp_tokenizer *t, const char *s, size_t len, const char **out,
		     size_t *olen, struct hp_err *e)
{
	int cur = -1, rc;

	for (size_t k = 0; k < t->nnorm; k++) {
		const struct tok_norm *nm = &t->norm[k];
		int dst = cur == 0 ? 1 : 0;
		size_t n = 0;

		switch (nm->kind) {
		case TN_NFC: case TN_NFD: case TN_NFKC: case TN_NFKD: {
			/* below U+0300 every character is already NFC (the first
			 * one NFC changes is U+0340), and ASCII is fixed by all
			 * four forms: skip the work for such text */
			int limit = nm->kind == TN_NFC ? 0xCC : 0x80, any = 0;

			if (t->text_max < limit)
				continue;
			for (size_t i = 0; i < len && !any; i++)
				any = (uint8_t)s[i] >= limit;
			if (!any)
				continue;
			if ((rc = unicode_norm(t, nm->kind, s, len, dst, &n, e)))
				return rc;
			break;
		}
		case TN_PREPEND:
			if (!len)
				continue;   /* HF prepends only to a non-empty string */
			if ((rc = grow(&t->nbuf[dst], &t->ncap[dst], len + nm->len + 1, 1)))
				return rc;
			memcpy(t->nbuf[dst], nm->s, nm->len);
			memcpy(t->nbuf[dst] + nm->len, s, len);
			n = len + nm->len;
			break;
		case TN_REPLACE: {
			size_t pos = 0, last = SIZE_MAX, prev = 0, a, b;

			while ((rc = re_next(t, &nm->re, nm->re.md, s, len, &pos, &last, &a, &b, e)) == 1) {
				if ((rc = grow(&t->nbuf[dst], &t->ncap[dst], n + (a - prev) + nm->len + 1, 1)))
					return rc;
				memcpy(t->nbuf[dst] + n, s + prev, a - prev);
				n += a - prev;
				memcpy(t->nbuf[dst] + n, nm->s, nm->len);
				n += nm->len;
				prev = b;
			}
			if (rc < 0)
				return rc;
			if ((rc = grow(&t->nbuf[dst], &t->ncap[dst], n + (len - prev) + 1, 1)))
				return rc;
			memcpy(t->nbuf[dst] + n, s + prev, len - prev);
			n += len - prev;
			break;
		}
		}
		s = t->nbuf[dst];
		len = n;
		cur = dst;
	}
	*out = s;
	*olen = len;
	return 0;
}

/* Leftmost-longest match of the trie in s[from..len). */
static int trie_find(const struct tok_trie *tr, const char *s, size_t len, size_t from, size_t *ms,
		     size_t *me, int32_t *tok)
{
	const uint8_t *u = (const uint8_t *)s;

	for (size_t i = from; i < len; i++) {
		size_t best = 0, j;
		int32_t nd;

		if (tr->only_first >= 0) {
			const uint8_t *p = memchr(u + i, tr->only_first, len - i);

			if (!p)
				return 0;
			i = (size_t)(p - u);
		}
		for (nd = tr->root[u[i]], j = i + 1; nd >= 0;) {
			if (tr->node[nd].tok >= 0) {
				best = j;
				*tok = tr->node[nd].tok;
			}
			if (j == len)
				break;
			for (nd = tr->node[nd].child; nd >= 0 && tr->node[nd].byte != u[j];)
				nd = tr->node[nd].sibling;
			j++;
		}
		if (best) {
			*ms = i;
			*me = best;
			return 1;
		}
	}
	return 0;
}

static int piece_stage(struct hp_tokenizer *t, int stage, const char *s, size_t len, int first,
		       struct hp_err *e);

/* ---- marks (hp_tok_encode_marked) ---- */

static int hexval(char c);

/*
 * The bytes token id stands for once its text is normalized and
 * pre-tokenized: the model's pieces of a word concatenate to the word, so
 * these lengths add up to the position in that text.  Byte mode: one byte
 * per byte-level character; a byte-fallback token <0xNN>: one byte; an
 * added token: its (normalized) content.
 */
static size_t final_len(const struct hp_tokenizer *t, int32_t id)
{
	const char *s;
	size_t n, k = 0;

	if (id < 0 || id >= t->vocab_size || !(s = t->tok_str[id]))
		return 0;
	n = t->tok_len[id];
	if (t->is_added[id])
		return n;
	if (t->bpe.byte_mode) {
		for (size_t i = 0; i < n; i++)
			k += ((uint8_t)s[i] & 0xC0) != 0x80;
		return k;
	}
	if (n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hexval(s[3]) >= 0 && hexval(s[4]) >= 0 &&
	    t->bpe.fallback[hexval(s[3]) * 16 + hexval(s[4])] == id)
		return 1;
	return n;
}

/* The tokens' marks grown to the ids' capacity, then [from, n) set to m. */
static int mark_fill(struct hp_tokenizer *t, size_t from, uint8_t m)
{
	if (t->tmark_cap < *t->out.cap) {
		uint8_t *p = hp_realloc(*t->tmark, *t->out.cap);

		if (!p)
			return HP_ENOMEM;
		*t->tmark = p;
		t->tmark_cap = *t->out.cap;
	}
	if (*t->out.n > from)
		memset(*t->tmark + from, m, *t->out.n - from);
	return 0;
}

/*
 * Marks for the tokens [n0, n) of piece s[0..len) whose bytes' marks m
 * are not all equal.  The tokens' final lengths place them in the
 * normalized, pre-tokenized text; a mark boundary at byte b of the piece
 * is placed there by encoding s[0..b) alone and adding up its tokens'
 * final lengths.  That is exact when the pipeline is prefix-consistent
 * (the text of a prefix is a prefix of the text), which Prepend, Replace,
 * the Split and ByteLevel pre-tokenizers and Metaspace are; NFC can move a
 * boundary that falls inside a combining sequence by that sequence, and an
 * unk token stands for its own length, not its text's.  A token is marked
 * when any byte of it is.
 */
static int mark_split(struct hp_tokenizer *t, const char *s, size_t len, const uint8_t *m, int first,
		      size_t n0, struct hp_err *e)
{
	struct seg {
		size_t start;   /* in the final text */
		uint8_t m;
	} *sg;
	struct tok_out saved = t->out;
	const uint8_t *saved_mark = t->mark;
	size_t nseg = 1, n1 = *t->out.n, pos = 0, k = 0;
	int rc = mark_fill(t, n0, 0);

	if (rc)
		return rc;
	for (size_t b = 1; b < len; b++)
		nseg += m[b] != m[b - 1];
	if (!(sg = hp_malloc(nseg * sizeof(*sg))))
		return HP_ENOMEM;
	sg[0] = (struct seg){ 0, m[0] };
	for (size_t b = 1, q = 1; b < len && !rc; b++) {
		size_t pre_n = 0, at = 0;

		if (m[b] == m[b - 1])
			continue;
		/* where byte b lands in the final text: encode s[0..b) alone */
		t->out = (struct tok_out){ &t->pre_ids, &pre_n, &t->pre_cap };
		t->mark = NULL;
		rc = piece_stage(t, 0, s, b, first, e);
		t->out = saved;
		t->mark = saved_mark;
		for (size_t i = 0; i < pre_n; i++)
			at += final_len(t, t->pre_ids[i]);
		sg[q++] = (struct seg){ at, m[b] };
	}
	for (size_t j = n0; j < n1 && !rc; j++) {
		size_t f = final_len(t, (*t->out.ids)[j]), z = pos + (f ? f : 1);
		uint8_t mk;

		while (k + 1 < nseg && sg[k + 1].start <= pos)
			k++;
		mk = sg[k].m;
		for (size_t q = k + 1; q < nseg && sg[q].start < z; q++)
			mk |= sg[q].m;
		(*t->tmark)[j] = mk;
		pos += f;
	}
	hp_free(sg);
	return rc;
}

/* A stage-0 piece text[off..off+len): encoded, and marked when asked. */
static int piece0(struct hp_tokenizer *t, const char *text, size_t off, size_t len, int first,
		  struct hp_err *e)
{
	size_t n0 = *t->out.n, i = 1;
	const uint8_t *m;
	int rc = piece_stage(t, 0, text + off, len, first, e);

	if (rc || !t->mark || !len)
		return rc;
	m = t->mark + off;
	while (i < len && m[i] == m[0])
		i++;
	if (i == len)
		return mark_fill(t, n0, m[0]);
	return mark_split(t, text + off, len, m, first, n0, e);
}

/*
 * HF's AddedVocabulary::find_matches: split s on the added tokens of one
 * trie (stage 0: the ones matched on raw text, stage 1: the normalized
 * ones, on normalized text), honouring single_word, lstrip and rstrip.
 */
static int split_added(struct hp_tokenizer *t, int stage, const char *s, size_t len, int first,
		       struct hp_err *e)
{
	const struct tok_trie *tr = stage == 0 ? &t->trie_raw : &t->trie_norm;
	size_t start_off = 0, from = 0, a, b;
	int32_t tok;
	int rc;

	if (!len)
		return 0;
	if (!tr->count)
		return stage ? piece_stage(t, stage, s, len, first, e) : piece0(t, s, 0, len, first, e);
	while (trie_find(tr, s, len, from, &a, &b, &tok)) {
		const struct tok_added *at = &t->added[tok];

		from = b;   /* the matcher resumes after the match as found */
		if (at->single_word) {
			size_t st;
			int start_space = a == 0 || !is_word_cp(last_cp(s, a, &st));
			int stop_space = b == len;

			if (!stop_space) {
				size_t cl;

				stop_space = !is_word_cp(tok_u8dec((const uint8_t *)s + b, &cl));
			}
			if (!start_space || !stop_space)
				continue;
		}
		if (at->lstrip) {
			size_t ns = a, st;

			while (ns > 0 && is_space_cp(last_cp(s, ns, &st)))
				ns = st;
			a = ns > start_off ? ns : start_off;
		}
		if (at->rstrip) {
			size_t cl;

			while (b < len && is_space_cp(tok_u8dec((const uint8_t *)s + b, &cl)))
				b += cl;
		}
		if (start_off < a) {
			rc = stage ? piece_stage(t, stage, s + start_off, a - start_off, first && start_off == 0, e)
				   : piece0(t, s, start_off, a - start_off, first && start_off == 0, e);
			if (rc)
				return rc;
		}
		if ((rc = tok_out_push(&t->out, at->id)))
			return rc;
		if (!stage && t->mark) {
			uint8_t mk = 0;

			for (size_t i = a; i < b; i++)
				mk |= t->mark[i];
			if ((rc = mark_fill(t, *t->out.n - 1, mk)))
				return rc;
		}
		start_off = b;
	}
	if (start_off != len)
		return stage ? piece_stage(t, stage, s + start_off, len - start_off, first && start_off == 0, e)
			     : piece0(t, s, start_off, len - start_off, first && start_off == 0, e);
	return 0;
}

/* A piece between added tokens: stage 0 normalizes it and looks for the
 * normalized added tokens; stage 1 pre-tokenizes it. */
static int piece_stage(struct hp_tokenizer *t, int stage, const char *s, size_t len, int first,
		       struct hp_err *e)
{
	const char *ns;
	size_t nl;
	int rc;

	if (stage == 1)
		return pretok(t, 0, s, len, first, e);
	if ((rc = normalize(t, s, len, &ns, &nl, e)))
		return rc;
	return split_added(t, 1, ns, nl, first, e);
}

static int encode(struct hp_tokenizer *t, const char *text, size_t len, const uint8_t *mark,
		  int32_t **ids, uint8_t **marks, size_t *n, size_t *cap, struct hp_err *e)
{
	size_t n0, bad;
	int rc;

	if (!t || !ids || !n || !cap || (!text && len) || (mark && (!marks || (!*marks && *cap))))
		return hp_err_set(e, HP_EINVAL, "hp_tok_encode: NULL argument");
	n0 = *n;
	t->text_max = 0;
	bad = utf8_check((const uint8_t *)text, len, &t->text_max);
	if (bad != len)
		return hp_err_set(e, HP_EFORMAT, "invalid UTF-8 at byte %zu", bad);
	t->out = (struct tok_out){ ids, n, cap };
	t->mark = mark;
	t->tmark = marks;
	t->tmark_cap = *cap;
	rc = split_added(t, 0, text, len, 1, e);
	t->mark = NULL;
	t->tmark = NULL;
	if (!rc && mark && *cap > t->tmark_cap) {
		/* keep the promise that *marks has room for *cap entries */
		uint8_t *p = hp_realloc(*marks, *cap);

		if (p)
			*marks = p;
		rc = p ? 0 : HP_ENOMEM;
	}
	if (rc)
		*n = n0;
	if (rc == HP_ENOMEM)   /* raised deep down without a message */
		hp_err_set(e, HP_ENOMEM, "out of memory encoding %zu bytes", len);
	return rc;
}

int hp_tok_encode(struct hp_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n,
		  size_t *cap, struct hp_err *e)
{
	return encode(t, text, len, NULL, ids, NULL, n, cap, e);
}

int hp_tok_encode_marked(struct hp_tokenizer *t, const char *text, size_t len, const uint8_t *mark,
			 int32_t **ids, uint8_t **marks, size_t *n, size_t *cap, struct hp_err *e)
{
	if (!mark && len)
		return hp_err_set(e, HP_EINVAL, "hp_tok_encode_marked: NULL argument");
	return encode(t, text, len, mark ? mark : (const uint8_t *)"", ids, marks, n, cap, e);
}

int hp_tok_find_special(const struct hp_tokenizer *t, const char *text, size_t len, size_t from,
			size_t *start, size_t *end, int32_t *id)
{
	const struct tok_trie *tr = &t->trie_raw;
	size_t a, b;
	int32_t tok;

	while (tr->count && from < len && trie_find(tr, text, len, from, &a, &b, &tok)) {
		if (t->added[tok].special) {
			*start = a;
			*end = b;
			*id = t->added[tok].id;
			return 1;
		}
		from = a + 1;
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* decoding                                                            */

/* A list of strings in one buffer: item i is buf[end[i-1] .. end[i]). */
struct tok_sl {
	char *buf;
	size_t len, cap;
	size_t *end;
	size_t n, ncap;
};

static int sl_add(struct tok_sl *l, const void *p, size_t n)
{
	int rc = grow(&l->buf, &l->cap, l->len + n + 1, 1);

	if (rc)
		return rc;
	if (n)
		memcpy(l->buf + l->len, p, n);
	l->len += n;
	return 0;
}

static int sl_close(struct tok_sl *l)
{
	int rc = grow(&l->end, &l->ncap, l->n + 1, sizeof(*l->end));

	if (rc)
		return rc;
	l->end[l->n++] = l->len;
	return 0;
}

static int sl_push(struct tok_sl *l, const void *p, size_t n)
{
	int rc = sl_add(l, p, n);

	return rc ? rc : sl_close(l);
}

static const char *sl_item(const struct tok_sl *l, size_t i, size_t *n)
{
	size_t a = i ? l->end[i - 1] : 0;

	*n = l->end[i] - a;
	return l->buf + a;
}

static void sl_reset(struct tok_sl *l)
{
	l->len = 0;
	l->n = 0;
}

static void sl_release(struct tok_sl *l)
{
	hp_free(l->buf);
	hp_free(l->end);
	memset(l, 0, sizeof(*l));
}

/* ByteLevel: every token whose characters are all in the byte alphabet
 * becomes those bytes, others stay as they are; all of it joined and made
 * UTF-8 lossily, as one string. */
static int dec_bytelevel(const struct hp_tokenizer *t, const struct tok_sl *in, struct tok_sl *out)
{
	char *raw = NULL;
	size_t rl = 0, rcap = 0;
	int rc = 0;

	for (size_t i = 0; !rc && i < in->n; i++) {
		size_t n, j = 0, cl, k0 = rl;
		const char *s = sl_item(in, i, &n);

		if ((rc = grow(&raw, &rcap, rl + n + 1, 1)))
			break;
		while (j < n) {
			uint32_t cp = tok_u8dec((const uint8_t *)s + j, &cl);

			if (cp >= 324 || t->char_byte[cp] < 0)
				break;
			raw[rl++] = (char)t->char_byte[cp];
			j += cl;
		}
		if (j < n) {
			rl = k0;
			memcpy(raw + rl, s, n);
			rl += n;
		}
	}
	if (!rc) {
		rc = utf8_lossy((const uint8_t *)raw, rl, &out->buf, &out->len, &out->cap);
		if (!rc)
			rc = sl_close(out);
	}
	hp_free(raw);
	return rc;
}

static int flush_bytes(struct tok_sl *out, const uint8_t *b, size_t n)
{
	int rc, max;

	if (!n)
		return 0;
	if (utf8_check(b, n, &max) == n)
		return sl_push(out, b, n);
	/* HF: String::from_utf8 failed, one U+FFFD per byte */
	for (size_t i = 0; i < n; i++)
		if ((rc = sl_push(out, "\xEF\xBF\xBD", 3)))
			return rc;
	return 0;
}

static int hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
	       c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int dec_bytefallback(const struct tok_sl *in, struct tok_sl *out)
{
	uint8_t *bytes = NULL;
	size_t nb = 0, bcap = 0;
	int rc = 0;

	for (size_t i = 0; !rc && i < in->n; i++) {
		size_t n;
		const char *s = sl_item(in, i, &n);
		int v = -1;

		/* "<0xXX>": Rust's u8::from_str_radix also takes "+X" */
		if (n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>') {
			int h = hexval(s[3]), l = hexval(s[4]);

			if (h >= 0 && l >= 0)
				v = h * 16 + l;
			else if (s[3] == '+' && l >= 0)
				v = l;
		}
		if (v >= 0) {
			if (!(rc = grow(&bytes, &bcap, nb + 1, 1)))
				bytes[nb++] = (uint8_t)v;
			continue;
		}
		if (!(rc = flush_bytes(out, bytes, nb)))
			rc = sl_push(out, s, n);
		nb = 0;
	}
	if (!rc)
		rc = flush_bytes(out, bytes, nb);
	hp_free(bytes);
	return rc;
}

static int dec_replace(const struct hp_tokenizer *t, const struct tok_dec *d, const struct tok_sl *in,
		       struct tok_sl *out, struct hp_err *e)
{
	pcre2_match_data *md = NULL;
	int rc = 0;

	if (d->re.code && !(md = pcre2_match_data_create_from_pattern(d->re.code, t->gctx)))
		return HP_ENOMEM;
	for (size_t i = 0; !rc && i < in->n; i++) {
		size_t n, pos = 0, last = SIZE_MAX, prev = 0, a, b;
		const char *s = sl_item(in, i, &n);

		while ((rc = re_next(t, &d->re, md, s, n, &pos, &last, &a, &b, e)) == 1) {
			if ((rc = sl_add(out, s + prev, a - prev)) ||
			    (rc = sl_add(out, d->content, d->content_len)))
				break;
			prev = b;
		}
		if (rc < 0)
			break;
		if (!(rc = sl_add(out, s + prev, n - prev)))
			rc = sl_close(out);
	}
	pcre2_match_data_free(md);
	return rc;
}

static int dec_strip(const struct tok_dec *d, const struct tok_sl *in, struct tok_sl *out)
{
	int rc = 0;

	for (size_t i = 0; !rc && i < in->n; i++) {
		size_t n, a = 0, b, cl, st;
		const char *s = sl_item(in, i, &n);

		b = n;
		for (size_t c = 0; c < d->start && a < n; c++) {
			if (tok_u8dec((const uint8_t *)s + a, &cl) != d->strip_cp)
				break;
			a += cl;
		}
		for (size_t c = 0; c < d->stop && b > a; c++) {
			if (last_cp(s, b, &st) != d->strip_cp)
				break;
			b = st;
		}
		rc = sl_push(out, s + a, b - a);
	}
	return rc;
}

static int dec_metaspace(const struct tok_dec *d, const struct tok_sl *in, struct tok_sl *out)
{
	int rc = 0;

	for (size_t i = 0; !rc && i < in->n; i++) {
		size_t n, j = 0, cl;
		const char *s = sl_item(in, i, &n);

		while (!rc && j < n) {
			uint32_t cp = tok_u8dec((const uint8_t *)s + j, &cl);

			/* HF drops every replacement of the first token */
			if (cp != d->rep_cp)
				rc = sl_add(out, s + j, cl);
			else if (i > 0 || d->prepend == TS_NEVER)
				rc = sl_add(out, " ", 1);
			j += cl;
		}
		if (!rc)
			rc = sl_close(out);
	}
	return rc;
}

int hp_tok_decode(const struct hp_tokenizer *t, const int32_t *ids, size_t n, char **out,
		  size_t *out_len, struct hp_err *e)
{
	struct tok_sl l[2] = { { 0 }, { 0 } };
	int cur = 0, rc = 0;
	char *s;

	if (!t || !out || !out_len || (!ids && n))
		return hp_err_set(e, HP_EINVAL, "hp_tok_decode: NULL argument");
	*out = NULL;
	*out_len = 0;
	for (size_t i = 0; !rc && i < n; i++) {
		int32_t id = ids[i];

		if (id < 0 || id >= t->vocab_size || !t->tok_str[id]) {
			rc = hp_err_set(e, HP_EFORMAT, "id %" PRId32 " is not in the vocabulary", id);
			break;
		}
		rc = sl_push(&l[0], t->tok_str[id], t->tok_len[id]);
	}
	for (size_t k = 0; !rc && k < t->ndec; k++) {
		const struct tok_dec *d = &t->dec[k];
		struct tok_sl *in = &l[cur], *o = &l[!cur];

		sl_reset(o);
		switch (d->kind) {
		case TD_BYTELEVEL:
			rc = dec_bytelevel(t, in, o);
			break;
		case TD_REPLACE:
			rc = dec_replace(t, d, in, o, e);
			break;
		case TD_BYTEFALLBACK:
			rc = dec_bytefallback(in, o);
			break;
		case TD_FUSE:
			rc = sl_push(o, in->buf, in->len);
			break;
		case TD_STRIP:
			rc = dec_strip(d, in, o);
			break;
		case TD_METASPACE:
			rc = dec_metaspace(d, in, o);
			break;
		}
		cur = !cur;
	}
	if (!rc) {
		/* a decoder's strings are joined with "", no decoder's with " " */
		struct tok_sl *in = &l[cur];
		size_t k = 0, sep = t->has_decoder ? 0 : 1;

		s = hp_malloc(in->len + (in->n ? (in->n - 1) * sep : 0) + 1);
		if (!s) {
			rc = HP_ENOMEM;
		} else {
			for (size_t i = 0; i < in->n; i++) {
				size_t il;
				const char *p = sl_item(in, i, &il);

				if (i && sep)
					s[k++] = ' ';
				memcpy(s + k, p, il);
				k += il;
			}
			s[k] = '\0';
			*out = s;
			*out_len = k;
		}
	}
	sl_release(&l[0]);
	sl_release(&l[1]);
	if (rc == HP_ENOMEM)
		hp_err_set(e, HP_ENOMEM, "out of memory decoding %zu ids", n);
	return rc;
}

/* ------------------------------------------------------------------ */
/* loading                                                             */

static const char *jstr(json_t *o, const char *key)
{
	return json_string_value(json_object_get(o, key));
}

/* An optional boolean member with a default. */
static int jbool(struct hp_tokenizer *t, json_t *o, const char *key, int def, int *out,
		 const char *where, struct hp_err *e)
{
	json_t *v = json_object_get(o, key);

	*out = def;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_boolean(v))
		return FERR(HP_EFORMAT, "%s.%s is not a boolean", t->file, where, key);
	*out = json_is_true(v);
	return 0;
}

/* A {"String": s} or {"Regex": r} pattern. */
static int jpattern(struct hp_tokenizer *t, json_t *o, struct tok_re *re, const char *where,
		    struct hp_err *e)
{
	json_t *p = json_object_get(o, "pattern"), *v;
	int literal;

	if (!json_is_object(p))
		return FERR(HP_EFORMAT, "%s.pattern is missing or not an object", t->file, where);
	if ((v = json_object_get(p, "String")))
		literal = 1;
	else if ((v = json_object_get(p, "Regex")))
		literal = 0;
	if (!v || !json_is_string(v))
		return FERR(HP_EFORMAT, "%s.pattern is neither {\"String\": ...} nor {\"Regex\": ...}",
			    t->file, where);
	return re_compile(t, re, json_string_value(v), json_string_length(v), literal, where, e);
}

/* A string member holding exactly one character. */
static int jchar(struct hp_tokenizer *t, json_t *o, const char *key, uint8_t out[4], size_t *len,
		 uint32_t *cp, const char *where, struct hp_err *e)
{
	const char *s = jstr(o, key);
	size_t n = s ? json_string_length(json_object_get(o, key)) : 0;

	if (!s || !n || tok_u8len((uint8_t)s[0]) != n)
		return FERR(HP_EFORMAT, "%s.%s is not a string of one character", t->file, where, key);
	memcpy(out, s, n);
	*len = n;
	*cp = tok_u8dec((const uint8_t *)s, &n);
	return 0;
}

static int jprepend(struct hp_tokenizer *t, json_t *o, enum tok_prepend *out, const char *where,
		    struct hp_err *e)
{
	const char *s = jstr(o, "prepend_scheme");
	json_t *aps = json_object_get(o, "add_prefix_space");

	*out = TS_ALWAYS;
	if (s && !strcmp(s, "first"))
		*out = TS_FIRST;
	else if (s && !strcmp(s, "never"))
		*out = TS_NEVER;
	else if (s && strcmp(s, "always"))
		return FERR(HP_EFORMAT, "%s.prepend_scheme '%s' is not first, never or always",
			    t->file, where, s);
	/* HF's legacy field: false is only accepted with "never" */
	if (json_is_false(aps)) {
		if (*out != TS_NEVER)
			return FERR(HP_EFORMAT, "%s.add_prefix_space does not match prepend_scheme",
				    t->file, where);
	}
	return 0;
}

static int check_object(struct hp_tokenizer *t, json_t *j, const char *where, const char **type,
			struct hp_err *e)
{
	if (!json_is_object(j))
		return FERR(HP_EFORMAT, "%s is not an object", t->file, where);
	*type = jstr(j, "type");
	if (!*type)
		return FERR(HP_EFORMAT, "%s.type is missing", t->file, where);
	return 0;
}

typedef int (*parse_fn)(struct hp_tokenizer *t, json_t *j, const char *where, struct hp_err *e);

/* A "Sequence" normalizer, pre-tokenizer or decoder: each element of
 * j[key] parsed by fn, with its path for messages. */
static int parse_sequence(struct hp_tokenizer *t, json_t *j, const char *key, const char *where,
			  parse_fn fn, struct hp_err *e)
{
	json_t *a = json_object_get(j, key);
	int rc;

	if (!json_is_array(a))
		return FERR(HP_EFORMAT, "%s.%s is not an array", t->file, where, key);
	for (size_t i = 0; i < json_array_size(a); i++) {
		char w[256];

		snprintf(w, sizeof(w), "%s.%s[%zu]", where, key, i);
		if ((rc = fn(t, json_array_get(a, i), w, e)))
			return rc;
	}
	return 0;
}

static int parse_norm(struct hp_tokenizer *t, json_t *j, const char *where, struct hp_err *e)
{
	struct tok_norm *nm;
	const char *type, *s;
	int rc;

	if (!j || json_is_null(j))
		return 0;
	if ((rc = check_object(t, j, where, &type, e)))
		return rc;
	if (!strcmp(type, "Sequence"))
		return parse_sequence(t, j, "normalizers", where, parse_norm, e);
	{
		size_t cap = t->nnorm;   /* grown one by one: a handful at most */
		struct tok_norm *p = hp_realloc(t->norm, (cap + 1) * sizeof(*p));

		if (!p)
			return HP_ENOMEM;
		t->norm = p;
		nm = &t->norm[t->nnorm];
		memset(nm, 0, sizeof(*nm));
	}
	if (!strcmp(type, "NFC"))
		nm->kind = TN_NFC;
	else if (!strcmp(type, "NFD"))
		nm->kind = TN_NFD;
	else if (!strcmp(type, "NFKC"))
		nm->kind = TN_NFKC;
	else if (!strcmp(type, "NFKD"))
		nm->kind = TN_NFKD;
	else if (!strcmp(type, "Prepend") || !strcmp(type, "Replace")) {
		const char *key = type[0] == 'P' ? "prepend" : "content";

		nm->kind = type[0] == 'P' ? TN_PREPEND : TN_REPLACE;
		if (!(s = jstr(j, key)))
			return FERR(HP_EFORMAT, "%s.%s is not a string", t->file, where, key);
		nm->len = json_string_length(json_object_get(j, key));
		if (!(nm->s = dupn(s, nm->len)))
			return HP_ENOMEM;
		t->nnorm++;
		return nm->kind == TN_REPLACE ? jpattern(t, j, &nm->re, where, e) : 0;
	} else {
		return FERR(HP_EUNSUP, "%s.type '%s' is not supported; supported: NFC, NFD, NFKC, NFKD, "
			    "Prepend, Replace, Sequence", t->file, where, type);
	}
	t->nnorm++;
	return 0;
}

/* The split of ByteLevel's use_regex: GPT-2's pattern, as HF spells it in
 * pre_tokenizers/byte_level.rs. */
static const char gpt2_regex[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_pre(struct hp_tokenizer *t, json_t *j, const char *where, struct hp_err *e)
{
	struct tok_pre *p;
	const char *type;
	int rc;

	if (!j || json_is_null(j))
		return 0;
	if ((rc = check_object(t, j, where, &type, e)))
		return rc;
	if (!strcmp(type, "Sequence"))
		return parse_sequence(t, j, "pretokenizers", where, parse_pre, e);
	if (strcmp(type, "Split") && strcmp(type, "ByteLevel") && strcmp(type, "Metaspace"))
		return FERR(HP_EUNSUP, "%s.type '%s' is not supported; supported: Split, ByteLevel, "
			    "Metaspace, Sequence", t->file, where, type);
	{
		struct tok_pre *q = hp_realloc(t->pre, (t->npre + 1) * sizeof(*q));

		if (!q)
			return HP_ENOMEM;
		t->pre = q;
		p = &t->pre[t->npre++];
		memset(p, 0, sizeof(*p));
	}
	if (!strcmp(type, "Split")) {
		static const char *const names[] = {
			[TB_REMOVED] = "Removed", [TB_ISOLATED] = "Isolated",
			[TB_MERGED_PREV] = "MergedWithPrevious", [TB_MERGED_NEXT] = "MergedWithNext",
			[TB_CONTIGUOUS] = "Contiguous",
		};
		const char *b = jstr(j, "behavior");
		size_t i;

		p->kind = TP_SPLIT;
		for (i = 0; b && i < sizeof(names) / sizeof(names[0]); i++)
			if (!strcmp(b, names[i]))
				break;
		if (!b || i == sizeof(names) / sizeof(names[0]))
			return FERR(HP_EFORMAT, "%s.behavior is not one of Removed, Isolated, "
				    "MergedWithPrevious, MergedWithNext, Contiguous", t->file, where);
		p->behavior = (enum tok_behavior)i;
		if ((rc = jbool(t, j, "invert", 0, &p->invert, where, e)))
			return rc;
		return jpattern(t, j, &p->re, where, e);
	}
	if (!strcmp(type, "ByteLevel")) {
		p->kind = TP_BYTELEVEL;
		if ((rc = jbool(t, j, "add_prefix_space", 1, &p->add_prefix_space, where, e)) ||
		    (rc = jbool(t, j, "use_regex", 1, &p->use_regex, where, e)))
			return rc;
		if (p->use_regex)
			return re_compile(t, &p->re, gpt2_regex, sizeof(gpt2_regex) - 1, 0, where, e);
		return 0;
	}
	p->kind = TP_METASPACE;
	{
		uint32_t cp;

		if ((rc = jchar(t, j, "replacement", p->rep, &p->rep_len, &cp, where, e)) ||
		    (rc = jprepend(t, j, &p->prepend, where, e)) ||
		    (rc = jbool(t, j, "split", 1, &p->split, where, e)))
			return rc;
	}
	return 0;
}

static int parse_dec(struct hp_tokenizer *t, json_t *j, const char *where, struct hp_err *e)
{
	struct tok_dec *d;
	const char *type;
	int rc;

	if ((rc = check_object(t, j, where, &type, e)))
		return rc;
	if (!strcmp(type, "Sequence"))
		return parse_sequence(t, j, "decoders", where, parse_dec, e);
	if (strcmp(type, "ByteLevel") && strcmp(type, "Replace") && strcmp(type, "ByteFallback") &&
	    strcmp(type, "Fuse") && strcmp(type, "Strip") && strcmp(type, "Metaspace"))
		return FERR(HP_EUNSUP, "%s.type '%s' is not supported; supported: ByteLevel, Replace, "
			    "ByteFallback, Fuse, Strip, Metaspace, Sequence", t->file, where, type);
	{
		struct tok_dec *q = hp_realloc(t->dec, (t->ndec + 1) * sizeof(*q));

		if (!q)
			return HP_ENOMEM;
		t->dec = q;
		d = &t->dec[t->ndec++];
		memset(d, 0, sizeof(*d));
	}
	if (!strcmp(type, "ByteLevel")) {
		d->kind = TD_BYTELEVEL;
	} else if (!strcmp(type, "ByteFallback")) {
		d->kind = TD_BYTEFALLBACK;
	} else if (!strcmp(type, "Fuse")) {
		d->kind = TD_FUSE;
	} else if (!strcmp(type, "Replace")) {
		const char *s = jstr(j, "content");

		d->kind = TD_REPLACE;
		if (!s)
			return FERR(HP_EFORMAT, "%s.content is not a string", t->file, where);
		d->content_len = json_string_length(json_object_get(j, "content"));
		if (!(d->content = dupn(s, d->content_len)))
			return HP_ENOMEM;
		return jpattern(t, j, &d->re, where, e);
	} else if (!strcmp(type, "Strip")) {
		json_t *a = json_object_get(j, "start"), *b = json_object_get(j, "stop");
		uint8_t c[4];
		size_t cl;

		d->kind = TD_STRIP;
		if ((rc = jchar(t, j, "content", c, &cl, &d->strip_cp, where, e)))
			return rc;
		if (!json_is_integer(a) || json_integer_value(a) < 0 || !json_is_integer(b) ||
		    json_integer_value(b) < 0)
			return FERR(HP_EFORMAT, "%s.start and .stop must be integers >= 0", t->file, where);
		d->start = (size_t)json_integer_value(a);
		d->stop = (size_t)json_integer_value(b);
	} else {
		d->kind = TD_METASPACE;
		if ((rc = jchar(t, j, "replacement", d->rep, &d->rep_len, &d->rep_cp, where, e)) ||
		    (rc = jprepend(t, j, &d->prepend, where, e)))
			return rc;
	}
	return 0;
}

static int trie_add(struct tok_trie *tr, const char *s, size_t len, int32_t tok)
{
	int32_t *link;
	size_t i;
	int rc;

	if (!len)
		return 0;   /* an empty pattern never matches in HF either */
	link = &tr->root[(uint8_t)s[0]];
	for (i = 0;; i++) {
		int32_t nd = *link;

		/* find the child for s[i] among the siblings at link */
		while (nd >= 0 && tr->node[nd].byte != (uint8_t)s[i]) {
			link = &tr->node[nd].sibling;
			nd = *link;
		}
		if (nd < 0) {
			ptrdiff_t at = (char *)link - (char *)tr->node;
			int in_nodes = tr->node && at >= 0 && (size_t)at < tr->n * sizeof(*tr->node);

			if ((rc = grow(&tr->node, &tr->cap, tr->n + 1, sizeof(*tr->node))))
				return rc;
			if (in_nodes)   /* the array may have moved */
				link = (int32_t *)((char *)tr->node + at);
			nd = (int32_t)tr->n++;
			tr->node[nd] = (struct tok_trie_node){ -1, -1, -1, (uint8_t)s[i] };
			*link = nd;
		}
		if (i + 1 == len) {
			tr->node[nd].tok = tok;
			break;
		}
		link = &tr->node[nd].child;
	}
	if (tr->count++ == 0)
		tr->only_first = (uint8_t)s[0];
	else if (tr->only_first != (uint8_t)s[0])
		tr->only_first = -1;
	return 0;
}

/*
 * The added tokens as HF's AddedVocabulary::add_tokens assigns them: an id
 * from the vocabulary when the content is there (or was added already),
 * else the next id past the model's vocabulary; the "id" in the file is
 * only checked by HF with a warning.  A normalized token is matched by its
 * normalized form, and decodes to it.
 */
static int parse_added(struct hp_tokenizer *t, json_t *a, struct hp_err *e)
{
	int64_t next_id = (int64_t)t->bpe.vocab.n;
	int rc;

	if (!a || json_is_null(a))
		return 0;
	if (!json_is_array(a))
		return FERR(HP_EFORMAT, "added_tokens is not an array", t->file);
	for (size_t i = 0; i < json_array_size(a); i++) {
		json_t *j = json_array_get(a, i);
		struct tok_added tmp = { 0 }, *at;
		const char *s = jstr(j, "content");
		char w[64];
		int32_t id;
		size_t k;

		snprintf(w, sizeof(w), "added_tokens[%zu]", i);
		if (!json_is_object(j) || !s)
			return FERR(HP_EFORMAT, "%s has no string content", t->file, w);
		tmp.len = json_string_length(json_object_get(j, "content"));
		if (!tmp.len)
			continue;   /* HF ignores empty tokens */
		if ((rc = jbool(t, j, "single_word", 0, &tmp.single_word, w, e)) ||
		    (rc = jbool(t, j, "lstrip", 0, &tmp.lstrip, w, e)) ||
		    (rc = jbool(t, j, "rstrip", 0, &tmp.rstrip, w, e)) ||
		    (rc = jbool(t, j, "normalized", 1, &tmp.normalized, w, e)) ||
		    (rc = jbool(t, j, "special", 0, &tmp.special, w, e)))
			return rc;
		id = tok_dict_get(&t->added_map, s, tmp.len);
		if (id < 0)
			id = tok_bpe_token_id(&t->bpe, s, tmp.len);
		if (id < 0) {
			if (next_id >= HP_TOK_MAX_ID)
				return FERR(HP_EUNSUP, "%s: too many ids", t->file, w);
			id = (int32_t)next_id++;
		}
		for (k = 0; k < t->nadded && t->added[k].id != id; k++)
			;
		if (k == t->nadded) {
			struct tok_added *q = hp_realloc(t->added, (t->nadded + 1) * sizeof(*q));

			if (!q)
				return HP_ENOMEM;
			t->added = q;
			memset(&t->added[t->nadded++], 0, sizeof(*q));
		}
		at = &t->added[k];
		hp_free(at->content);
		at->content = dupn(s, tmp.len);
		if (!at->content)
			return HP_ENOMEM;
		at->len = tmp.len;
		at->id = id;
		at->single_word = tmp.single_word;
		at->lstrip = tmp.lstrip;
		at->rstrip = tmp.rstrip;
		at->normalized = tmp.normalized;
		at->special = tmp.special;
		if (tmp.normalized && t->nnorm) {
			const char *ns;
			size_t nl;

			t->text_max = 0xFF;   /* no fast path: this is not encode's text */
			if ((rc = normalize(t, s, tmp.len, &ns, &nl, e)))
				return rc;
			if (nl != tmp.len || memcmp(ns, s, nl)) {
				hp_free(at->norm);
				if (!(at->norm = dupn(ns, nl)))
					return HP_ENOMEM;
				at->norm_len = nl;
			}
		}
		if ((rc = tok_dict_put(&t->added_map, s, tmp.len, id)))
			return rc;
	}
	for (size_t k = 0; k < t->nadded; k++) {
		struct tok_added *at = &t->added[k];

		rc = at->normalized ? trie_add(&t->trie_norm, at->norm ? at->norm : at->content,
					       at->norm ? at->norm_len : at->len, (int32_t)k)
				    : trie_add(&t->trie_raw, at->content, at->len, (int32_t)k);
		if (rc)
			return rc;
	}
	return 0;
}

/* id -> token for decode: the model's, then the added tokens over it. */
static int build_id_table(struct hp_tokenizer *t)
{
	const struct tok_dict *v = &t->bpe.vocab;
	int64_t max = -1;

	for (size_t i = 0; i <= v->mask && v->slots; i++)
		if (v->slots[i].id > max)
			max = v->slots[i].id;
	for (size_t k = 0; k < t->nadded; k++)
		if (t->added[k].id > max)
			max = t->added[k].id;
	t->vocab_size = max + 1;
	t->tok_str = hp_calloc((size_t)t->vocab_size + 1, sizeof(*t->tok_str));
	t->tok_len = hp_calloc((size_t)t->vocab_size + 1, sizeof(*t->tok_len));
	t->is_added = hp_calloc((size_t)t->vocab_size + 1, 1);
	if (!t->tok_str || !t->tok_len || !t->is_added)
		return HP_ENOMEM;
	for (size_t i = 0; i <= v->mask && v->slots; i++) {
		const struct tok_slot *s = &v->slots[i];

		if (s->id >= 0) {
			t->tok_str[s->id] = v->pool + s->off;
			t->tok_len[s->id] = s->len;
		}
	}
	for (size_t k = 0; k < t->nadded; k++) {
		const struct tok_added *at = &t->added[k];

		t->tok_str[at->id] = at->norm ? at->norm : at->content;
		t->tok_len[at->id] = (uint32_t)(at->norm ? at->norm_len : at->len);
		t->is_added[at->id] = 1;
	}
	return 0;
}

static int read_all(const char *path, char **buf, size_t *len, struct hp_err *e)
{
	struct stat st;
	size_t n = 0;
	char *b;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	*buf = NULL;
	if (fd < 0)
		return hp_err_set(e, HP_EIO, "'%s': cannot open: %s", path, strerror(errno));
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		int err = errno;

		close(fd);
		return hp_err_set(e, HP_EIO, "'%s': not a regular file%s%s", path,
				  S_ISREG(st.st_mode) ? ": " : "", S_ISREG(st.st_mode) ? strerror(err) : "");
	}
	if (!(b = hp_malloc((size_t)st.st_size + 1))) {
		close(fd);
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory", path);
	}
	while (n < (size_t)st.st_size) {
		ssize_t r = read(fd, b + n, (size_t)st.st_size - n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			int err = r < 0 ? errno : 0;

			hp_free(b);
			close(fd);
			return hp_err_set(e, HP_EIO, "'%s': read failed: %s", path,
					  err ? strerror(err) : "file shrank");
		}
		n += (size_t)r;
	}
	close(fd);
	b[n] = '\0';
	*buf = b;
	*len = n;
	return 0;
}

/* The first known of the names that end documents in common vocabularies. */
static void find_eod_common(struct hp_tokenizer *t)
{
	static const char *const common[] = { "<|endoftext|>", "</s>", "<|end_of_text|>" };

	for (size_t i = 0; t->eod < 0 && i < sizeof(common) / sizeof(common[0]); i++)
		t->eod = hp_tok_token_id(t, common[i]);
}

/* The end-of-document token; tokenizer_config.json is optional metadata,
 * so anything wrong with it only means falling back to the common names. */
static void find_eod(struct hp_tokenizer *t)
{
	const char *slash = strrchr(t->file, '/');
	size_t dl = slash ? (size_t)(slash - t->file) + 1 : 0;
	char *cfg = hp_malloc(dl + sizeof("tokenizer_config.json"));
	json_t *root = NULL, *eos;

	t->eod = -1;
	if (cfg) {
		memcpy(cfg, t->file, dl);
		memcpy(cfg + dl, "tokenizer_config.json", sizeof("tokenizer_config.json"));
		root = json_load_file(cfg, 0, NULL);
		hp_free(cfg);
	}
	eos = json_object_get(root, "eos_token");
	if (json_is_object(eos))
		eos = json_object_get(eos, "content");
	if (json_is_string(eos))
		t->eod = hp_tok_token_id(t, json_string_value(eos));
	json_decref(root);
	find_eod_common(t);
}

static int load_json(struct hp_tokenizer *t, json_t *root, struct hp_err *e)
{
	json_t *model = json_object_get(root, "model"), *v = json_object_get(root, "version");
	const char *type;
	int byte_mode = 0, rc;

	if (!json_is_object(root))
		return FERR(HP_EFORMAT, "not a tokenizer (the top level is not an object)", t->file);
	if (v && (!json_is_string(v) || strcmp(json_string_value(v), "1.0")))
		return FERR(HP_EUNSUP, "version is not \"1.0\"", t->file);
	if (!json_is_object(model))
		return FERR(HP_EFORMAT, "model is missing or not an object", t->file);
	type = jstr(model, "type");
	if (type && strcmp(type, "BPE"))
		return FERR(HP_EUNSUP, "model.type '%s' is not supported; supported: BPE", t->file, type);
	if ((rc = parse_norm(t, json_object_get(root, "normalizer"), "normalizer", e)) ||
	    (rc = parse_pre(t, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", e)))
		return rc;
	for (size_t k = 0; k < t->npre; k++) {
		if (t->pre[k].kind != TP_BYTELEVEL)
			continue;
		if (k + 1 != t->npre)
			return FERR(HP_EUNSUP, "pre_tokenizer: ByteLevel must be the last step", t->file);
		byte_mode = 1;
	}
	v = json_object_get(root, "decoder");
	if (v && !json_is_null(v)) {
		t->has_decoder = 1;
		if ((rc = parse_dec(t, v, "decoder", e)))
			return rc;
	}
	if ((rc = tok_bpe_load(&t->bpe, model, byte_mode, t->file, e)) ||
	    (rc = parse_added(t, json_object_get(root, "added_tokens"), e)) ||
	    (rc = build_id_table(t)))
		return rc;
	return 0;
}

/* A new, empty tokenizer for file (copied). */
static struct hp_tokenizer *tok_new(const char *file, size_t len)
{
	struct hp_tokenizer *t = hp_calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->trie_raw.only_first = t->trie_norm.only_first = -1;
	for (int i = 0; i < 256; i++)
		t->trie_raw.root[i] = t->trie_norm.root[i] = -1;
	tok_bytelevel_tables(t->byte_char, t->char_byte);
	t->eod = -1;
	if (!(t->file = dupn(file, len))) {
		hp_free(t);
		return NULL;
	}
	return t;
}

/* Parse json into t; with_config: look for tokenizer_config.json. */
static int tok_parse(struct hp_tokenizer *t, const char *json, size_t len, int with_config,
		     struct hp_err *e)
{
	json_error_t jerr;
	json_t *root;
	int rc;

	/* JSON_ALLOW_NUL: a token may hold U+0000 (jansson still refuses it in keys) */
	root = json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
	if (!root)
		return FERR(HP_EFORMAT, "not JSON: %s (line %d, column %d)", t->file, jerr.text,
			    jerr.line, jerr.column);
	t->gctx = pcre2_general_context_create(pc_malloc, pc_free, NULL);
	if (t->gctx) {
		t->cctx = pcre2_compile_context_create(t->gctx);
		t->mctx = pcre2_match_context_create(t->gctx);
	}
	rc = t->gctx && t->cctx && t->mctx ? load_json(t, root, e) : HP_ENOMEM;
	json_decref(root);
	if (!rc && with_config)
		find_eod(t);
	else if (!rc)
		find_eod_common(t);
	if (rc == HP_ENOMEM)
		hp_err_set(e, HP_ENOMEM, "'%s': out of memory", t->file);
	return rc;
}

int hp_tok_load(struct hp_tokenizer **tp, const char *path, struct hp_err *e)
{
	static const char name[] = "/tokenizer.json";
	struct hp_tokenizer *t;
	struct stat st;
	size_t len = 0, pl;
	char *buf;
	int rc;

	if (!tp || !path)
		return hp_err_set(e, HP_EINVAL, "hp_tok_load: NULL argument");
	*tp = NULL;
	pl = strlen(path);
	if (!stat(path, &st) && S_ISDIR(st.st_mode)) {
		char *file = hp_malloc(pl + sizeof(name));

		if (!file)
			return hp_err_set(e, HP_ENOMEM, "'%s': out of memory", path);
		memcpy(file, path, pl);
		memcpy(file + pl, name, sizeof(name));
		t = tok_new(file, pl + sizeof(name) - 1);
		hp_free(file);
	} else {
		t = tok_new(path, pl);
	}
	if (!t)
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory", path);
	if (!(rc = read_all(t->file, &buf, &len, e))) {
		rc = tok_parse(t, buf, len, 1, e);
		hp_free(buf);
	}
	if (rc) {
		hp_tok_free(t);
		return rc;
	}
	*tp = t;
	return 0;
}

int hp_tok_load_buf(struct hp_tokenizer **tp, const char *name, const char *json, size_t len,
		    struct hp_err *e)
{
	struct hp_tokenizer *t;
	int rc;

	if (!tp || !name || (!json && len))
		return hp_err_set(e, HP_EINVAL, "hp_tok_load_buf: NULL argument");
	*tp = NULL;
	if (!(t = tok_new(name, strlen(name))))
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory", name);
	if ((rc = tok_parse(t, json ? json : "", len, 0, e))) {
		hp_tok_free(t);
		return rc;
	}
	*tp = t;
	return 0;
}

void hp_tok_free(struct hp_tokenizer *t)
{
	if (!t)
		return;
	for (size_t k = 0; k < t->nnorm; k++) {
		hp_free(t->norm[k].s);
		re_release(&t->norm[k].re);
	}
	for (size_t k = 0; k < t->npre; k++) {
		re_release(&t->pre[k].re);
		hp_free(t->pre[k].buf);
	}
	for (size_t k = 0; k < t->ndec; k++) {
		hp_free(t->dec[k].content);
		re_release(&t->dec[k].re);
	}
	for (size_t k = 0; k < t->nadded; k++) {
		hp_free(t->added[k].content);
		hp_free(t->added[k].norm);
	}
	hp_free(t->norm);
	hp_free(t->pre);
	hp_free(t->dec);
	hp_free(t->added);
	tok_dict_release(&t->added_map);
	hp_free(t->trie_raw.node);
	hp_free(t->trie_norm.node);
	tok_bpe_release(&t->bpe);
	hp_free(t->tok_str);
	hp_free(t->tok_len);
	hp_free(t->is_added);
	hp_free(t->pre_ids);
	hp_free(t->nbuf[0]);
	hp_free(t->nbuf[1]);
	hp_free(t->cps);
	pcre2_match_context_free(t->mctx);
	pcre2_compile_context_free(t->cctx);
	pcre2_general_context_free(t->gctx);
	hp_free(t->file);
	hp_free(t);
}

int64_t hp_tok_vocab_size(const struct hp_tokenizer *t)
{
	return t ? t->vocab_size : 0;
}

int32_t hp_tok_token_id(const struct hp_tokenizer *t, const char *token)
{
	int32_t id;

	if (!t || !token)
		return -1;
	id = tok_dict_get(&t->added_map, token, strlen(token));
	return id >= 0 ? id : tok_bpe_token_id(&t->bpe, token, strlen(token));
}

int32_t hp_tok_eod_id(const struct hp_tokenizer *t)
{
	return t ? t->eod : -1;
}
