/*
 * jinja_value.c - the values of the Jinja2 interpreter (jinja_int.h says
 * what the whole is and is not): the arena every value lives in, the value
 * constructors, UTF-8 and Python's character classes, strings and the
 * growing byte+tag buffer, Python's float repr, the public hp_jv_* API, and
 * what Python defines on every value during a render: the render's errors
 * and allocators, truth, ==, ordering, str(), repr() and json.dumps.
 */
#include <math.h>

#include <utf8proc.h>

#include "base/alloc.h"
#include "base/utf8.h"
#include "text/jinja_int.h"

/* --- arena ----------------------------------------------------------------- */
struct achunk {
	struct achunk *next;
	size_t cap, used;
	max_align_t data[];
};

void *jj_aalloc(struct jarena *a, size_t n)
{
	struct achunk *c = a->head;
	size_t need = (n + 15) & ~(size_t)15;

	if (need < n)
		return NULL;
	if (!c || c->cap - c->used < need) {
		size_t cap = c ? c->cap * 2 : 16384;

		if (cap > ((size_t)4 << 20))
			cap = (size_t)4 << 20;
		if (cap < need)
			cap = need;
		if (a->limit && a->total + cap > a->limit) {
			a->over = 1;
			return NULL;
		}
		c = hp_malloc(sizeof(*c) + cap);
		if (!c)
			return NULL;
		c->cap = cap;
		c->used = 0;
		c->next = a->head;
		a->head = c;
		a->total += cap;
	}
	{
		void *p = (char *)c->data + c->used;

		c->used += need;
		return p;
	}
}

void *jj_acalloc(struct jarena *a, size_t n)
{
	void *p = jj_aalloc(a, n);

	if (p)
		memset(p, 0, n);
	return p;
}

void jj_arena_free(struct jarena *a)
{
	struct achunk *c = a->head;

	while (c) {
		struct achunk *n = c->next;

		hp_free(c);
		c = n;
	}
	a->head = NULL;
	a->total = 0;
}

struct hp_jval *jj_mkval(struct jarena *a, int type)
{
	struct hp_jval *v = jj_aalloc(a, sizeof(*v));

	if (v) {
		memset(v, 0, sizeof(*v));
		v->type = (uint8_t)type;
	}
	return v;
}

/* a JV_BOOL or JV_INT holding i, a JV_FLOAT holding f */
static struct hp_jval *mkival(struct jarena *a, int type, int64_t i)
{
	struct hp_jval *v = jj_mkval(a, type);

	if (v)
		v->i = i;
	return v;
}

static struct hp_jval *mkfval(struct jarena *a, double f)
{
	struct hp_jval *v = jj_mkval(a, JV_FLOAT);

	if (v)
		v->f = f;
	return v;
}

struct hp_jval jj_v_none = { .type = JV_NONE };
struct hp_jval jj_v_true = { .type = JV_BOOL, .i = 1 };
struct hp_jval jj_v_false = { .type = JV_BOOL, .i = 0 };
struct hp_jval jj_v_empty = { .type = JV_STR, .flags = JF_ASCII, .s = { "", NULL, 0, 0 } };
struct hp_jval jj_v_space = { .type = JV_STR, .flags = JF_ASCII, .s = { " ", NULL, 1, 1 } };

/* --- UTF-8 ------------------------------------------------------------------ */

/*
 * Decode the code point at s[*i] and advance *i past it.  Invalid bytes are
 * one code point each (their byte value), so that no input can make the
 * string functions fail; the caller's strings are normally valid already.
 */
uint32_t jj_u8dec(const char *s, size_t n, size_t *i)
{
	unsigned c = (unsigned char)s[*i], lo, hi, k;
	uint32_t cp;

	if (c < 0x80) {
		(*i)++;
		return c;
	}
	k = hp_utf8_lead(c, &lo, &hi);
	if (!k || *i + k >= n || (unsigned char)s[*i + 1] < lo || (unsigned char)s[*i + 1] > hi) {
		(*i)++;
		return c;
	}
	cp = c & (0x3F >> k);
	for (unsigned j = 1; j <= k; j++) {
		unsigned cj = (unsigned char)s[*i + j];

		if ((cj & 0xC0) != 0x80) {
			(*i)++;
			return c;
		}
		cp = cp << 6 | (cj & 0x3F);
	}
	*i += k + 1;
	return cp;
}

static size_t u8count(const char *s, size_t n, int *ascii)
{
	size_t k = 0, i = 0;

	while (i < n && (unsigned char)s[i] < 0x80)
		i++;
	*ascii = i == n;
	k = i;
	while (i < n) {
		jj_u8dec(s, n, &i);
		k++;
	}
	return k;
}

/* Python's str.isspace */
int jj_py_isspace(uint32_t c)
{
	return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
	       c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
	       c == 0x202F || c == 0x205F || c == 0x3000;
}

int jj_cat_of(uint32_t c)
{
	return c > 0x10FFFF ? UTF8PROC_CATEGORY_CN : utf8proc_category((utf8proc_int32_t)c);
}

int jj_py_isalpha(uint32_t c)
{
	int k;

	if (c < 0x80)
		return (c | 32) >= 'a' && (c | 32) <= 'z';
	k = jj_cat_of(c);
	return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

int jj_py_isdigit(uint32_t c)
{
	if (c < 0x80)
		return c >= '0' && c <= '9';
	return jj_cat_of(c) == UTF8PROC_CATEGORY_ND;
}

int jj_py_isalnum(uint32_t c)
{
	int k;

	if (c < 0x80)
		return jj_py_isalpha(c) || (c >= '0' && c <= '9');
	k = jj_cat_of(c);
	return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
	       (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

int jj_py_iscased(uint32_t c)
{
	int k = jj_cat_of(c);

	return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
	       utf8proc_toupper((utf8proc_int32_t)c) != (utf8proc_int32_t)c ||
	       utf8proc_tolower((utf8proc_int32_t)c) != (utf8proc_int32_t)c;
}

/* Python's str.isprintable, for repr() */
static int py_isprintable(uint32_t c)
{
	int k;

	if (c < 0x80)
		return c >= 0x20 && c < 0x7F;
	k = jj_cat_of(c);
	return !(k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
		 k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CN || k == UTF8PROC_CATEGORY_ZL ||
		 k == UTF8PROC_CATEGORY_ZP || k == UTF8PROC_CATEGORY_ZS);
}

/* length of the Unicode whitespace character at s[i], 0 if none */
size_t jj_ws_at(const char *s, size_t n, size_t i)
{
	size_t j = i;

	if (i >= n)
		return 0;
	if ((unsigned char)s[i] < 0x80)
		return jj_py_isspace((unsigned char)s[i]) ? 1 : 0;
	return jj_py_isspace(jj_u8dec(s, n, &j)) ? j - i : 0;
}

/* start of the code point that ends at s[end] */
size_t jj_u8prev(const char *s, size_t end)
{
	size_t i = end - 1;

	while (i > 0 && end - i < 4 && ((unsigned char)s[i] & 0xC0) == 0x80)
		i--;
	/* only a real sequence counts as one character */
	{
		size_t j = i;

		jj_u8dec(s, end, &j);
		if (j != end)
			i = end - 1;
	}
	return i;
}

size_t jj_rstrip_ws_len(const char *s, size_t n)
{
	while (n) {
		size_t i = jj_u8prev(s, n), j = i;

		if (!jj_py_isspace(jj_u8dec(s, n, &j)))
			break;
		n = i;
	}
	return n;
}

/* --- strings ---------------------------------------------------------------- */
struct hp_jval *jj_mkstr_raw(struct jarena *a, const char *s, size_t len, const uint16_t *tag,
			     uint16_t btag)
{
	struct hp_jval *v = jj_mkval(a, JV_STR);
	int ascii;

	if (!v)
		return NULL;
	v->s.s = s;
	v->s.len = len;
	v->s.tag = tag;
	v->s.ncp = u8count(s, len, &ascii);
	v->flags = ascii ? JF_ASCII : 0;
	v->btag = len && tag ? tag[0] : btag;
	return v;
}

/* a string of copied bytes and tags (tags NULL: all tag) */
static struct hp_jval *mkstr_copy(struct jarena *a, const char *s, size_t len, const uint16_t *tags,
				  uint16_t tag)
{
	char *b = jj_aalloc(a, len + 1);
	uint16_t *t = NULL;

	if (!b)
		return NULL;
	memcpy(b, s, len);
	b[len] = '\0';
	if (tags) {
		for (size_t i = 0; i < len && !t; i++)
			if (tags[i]) {
				t = jj_aalloc(a, len * sizeof(*t) + 1);
				if (!t)
					return NULL;
				memcpy(t, tags, len * sizeof(*t));
			}
	} else if (tag && len) {
		t = jj_aalloc(a, len * sizeof(*t));
		if (!t)
			return NULL;
		for (size_t i = 0; i < len; i++)
			t[i] = tag;
	}
	return jj_mkstr_raw(a, b, len, t, tag);
}

/* byte offset of code point k of v (k <= ncp) */
size_t jj_cp_off(const struct hp_jval *v, size_t k)
{
	size_t i = 0;

	if (v->flags & JF_ASCII)
		return k;
	while (k-- && i < v->s.len)
		jj_u8dec(v->s.s, v->s.len, &i);
	return i;
}

/* a substring sharing v's bytes and tags */
static struct hp_jval *substr(struct jarena *a, const struct hp_jval *v, size_t off, size_t len)
{
	struct hp_jval *r = jj_mkval(a, JV_STR);

	if (!r)
		return NULL;
	r->s.s = v->s.s + off;
	r->s.len = len;
	r->s.tag = v->s.tag ? v->s.tag + off : NULL;
	if (v->flags & JF_ASCII) {
		r->flags = JF_ASCII;
		r->s.ncp = len;
	} else {
		int ascii;

		r->s.ncp = u8count(r->s.s, len, &ascii);
		r->flags = ascii ? JF_ASCII : 0;
	}
	r->btag = len && r->s.tag ? r->s.tag[0] : v->btag;
	return r;
}

/* --- a growing byte+tag buffer in an arena (or on the heap for the output) - */
int jj_sb_grow(struct sbuf *b, size_t add)
{
	size_t cap;

	if (b->oom)
		return -1;
	if (b->len + add <= b->cap)
		return 0;
	cap = b->cap ? b->cap : 64;
	while (cap < b->len + add) {
		if (cap > ((size_t)1 << 40)) {
			b->oom = 1;
			return -1;
		}
		cap *= 2;
	}
	if (b->a) {
		char *s = jj_aalloc(b->a, cap + 1);
		uint16_t *t = NULL;

		if (!s)
			goto oom;
		if (b->t) {
			t = jj_aalloc(b->a, cap * sizeof(*t));
			if (!t)
				goto oom;
			memcpy(t, b->t, b->len * sizeof(*t));
		}
		if (b->len)
			memcpy(s, b->s, b->len);
		b->s = s;
		b->t = t;
	} else {
		char *s = hp_realloc(b->s, cap + 1);
		uint16_t *t;

		if (!s)
			goto oom;
		b->s = s;
		t = hp_realloc(b->t, cap * sizeof(*t));
		if (!t)
			goto oom;
		b->t = t;
		if (b->want_g) {
			uint8_t *g = hp_realloc(b->g, cap);

			if (!g)
				goto oom;
			b->g = g;
		}
	}
	b->cap = cap;
	return 0;
oom:
	b->oom = 1;
	return -1;
}

/* make the tag array exist (arena buffers start without one) */
static int sb_need_tags(struct sbuf *b)
{
	if (b->t)
		return 0;
	if (!b->cap && jj_sb_grow(b, 1))
		return -1;
	b->t = jj_aalloc(b->a, b->cap * sizeof(*b->t));
	if (!b->t) {
		b->oom = 1;
		return -1;
	}
	memset(b->t, 0, b->len * sizeof(*b->t));
	return 0;
}

/* append n bytes; tags NULL: all get tag */
int jj_sb_put(struct sbuf *b, const char *s, size_t n, const uint16_t *tags, uint16_t tag)
{
	if (!n)
		return b->oom ? -1 : 0;
	if (jj_sb_grow(b, n))
		return -1;
	if (!b->t && (tags || tag)) {
		int nz = tag != 0;

		for (size_t i = 0; tags && i < n && !nz; i++)
			nz = tags[i] != 0;
		if (nz && sb_need_tags(b))
			return -1;
	}
	memcpy(b->s + b->len, s, n);
	if (b->t) {
		if (tags)
			memcpy(b->t + b->len, tags, n * sizeof(*tags));
		else
			for (size_t i = 0; i < n; i++)
				b->t[b->len + i] = tag;
	}
	b->len += n;
	return 0;
}

int jj_sb_str(struct sbuf *b, const char *s, uint16_t tag)
{
	return jj_sb_put(b, s, strlen(s), NULL, tag);
}

int jj_sb_ch(struct sbuf *b, char c, uint16_t tag)
{
	return jj_sb_put(b, &c, 1, NULL, tag);
}

int jj_sb_val(struct sbuf *b, const struct hp_jval *v)
{
	return jj_sb_put(b, v->s.s, v->s.len, v->s.tag, 0);
}

/* append v's bytes [off, off + n) with their tags */
int jj_sb_span(struct sbuf *b, const struct hp_jval *v, size_t off, size_t n)
{
	return jj_sb_put(b, v->s.s + off, n, v->s.tag ? v->s.tag + off : NULL, 0);
}

static int sb_printf(struct sbuf *b, uint16_t tag, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int sb_printf(struct sbuf *b, uint16_t tag, const char *fmt, ...)
{
	char buf[128];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(buf))
		n = (int)sizeof(buf) - 1;
	return jj_sb_put(b, buf, (size_t)n, NULL, tag);
}

/* the buffer as a string value (arena buffers only) */
static struct hp_jval *sb_done(struct sbuf *b)
{
	if (b->oom)
		return NULL;
	if (!b->len)
		return &jj_v_empty;
	b->s[b->len] = '\0';
	return jj_mkstr_raw(b->a, b->s, b->len, b->t, 0);
}

/* --- Python float repr -------------------------------------------------- */
static void fmt_float(char *out, size_t cap, double x)
{
	char tmp[40], dig[24];
	int p, nd = 0, e10, decpt;
	size_t o = 0;
	const char *q;

	if (isnan(x)) {
		snprintf(out, cap, "nan");
		return;
	}
	if (isinf(x)) {
		snprintf(out, cap, x < 0 ? "-inf" : "inf");
		return;
	}
	/* the shortest decimal that reads back as x: Python's repr */
	for (p = 1; p <= 17; p++) {
		snprintf(tmp, sizeof(tmp), "%.*e", p - 1, x);
		if (strtod(tmp, NULL) == x)
			break;
	}
	q = tmp;
	if (*q == '-')
		q++;
	for (; *q && *q != 'e'; q++)
		if (*q >= '0' && *q <= '9')
			dig[nd++] = *q;
	e10 = atoi(q + 1);
	while (nd > 1 && dig[nd - 1] == '0')
		nd--;
	dig[nd] = '\0';
	if (signbit(x))
		out[o++] = '-';
	decpt = e10 + 1;
	if (x == 0)
		decpt = 1;
	if (decpt > 16 || decpt < -3) {
		out[o++] = dig[0];
		if (nd > 1) {
			out[o++] = '.';
			memcpy(out + o, dig + 1, (size_t)nd - 1);
			o += (size_t)nd - 1;
		}
		snprintf(out + o, cap - o, "e%c%02d", e10 < 0 ? '-' : '+', e10 < 0 ? -e10 : e10);
		return;
	}
	if (decpt <= 0) {
		out[o++] = '0';
		out[o++] = '.';
		for (int i = 0; i < -decpt; i++)
			out[o++] = '0';
		memcpy(out + o, dig, (size_t)nd);
		o += (size_t)nd;
	} else if (decpt >= nd) {
		memcpy(out + o, dig, (size_t)nd);
		o += (size_t)nd;
		for (int i = nd; i < decpt; i++)
			out[o++] = '0';
		out[o++] = '.';
		out[o++] = '0';
	} else {
		memcpy(out + o, dig, (size_t)decpt);
		o += (size_t)decpt;
		out[o++] = '.';
		memcpy(out + o, dig + decpt, (size_t)(nd - decpt));
		o += (size_t)(nd - decpt);
	}
	out[o] = '\0';
}

/* --- public value constructors -------------------------------------------- */
struct hp_jctx *hp_jctx_new(void)
{
	return hp_calloc(1, sizeof(struct hp_jctx));
}

void hp_jctx_free(struct hp_jctx *c)
{
	if (!c)
		return;
	jj_arena_free(&c->ar);
	hp_free(c);
}

struct hp_jval *hp_jv_none(struct hp_jctx *c)
{
	return jj_mkval(&c->ar, JV_NONE);
}

struct hp_jval *hp_jv_bool(struct hp_jctx *c, int b)
{
	return mkival(&c->ar, JV_BOOL, !!b);
}

struct hp_jval *hp_jv_int(struct hp_jctx *c, int64_t i)
{
	return mkival(&c->ar, JV_INT, i);
}

struct hp_jval *hp_jv_float(struct hp_jctx *c, double f)
{
	return mkfval(&c->ar, f);
}

struct hp_jval *hp_jv_str(struct hp_jctx *c, const char *s, size_t len, uint16_t tag)
{
	return mkstr_copy(&c->ar, s, len, NULL, tag);
}

struct hp_jval *hp_jv_str_tagged(struct hp_jctx *c, const char *s, size_t len, const uint16_t *tags)
{
	return mkstr_copy(&c->ar, s, len, tags, 0);
}

struct hp_jval *hp_jv_list(struct hp_jctx *c)
{
	return jj_mkval(&c->ar, JV_LIST);
}

struct hp_jval *hp_jv_dict(struct hp_jctx *c)
{
	return jj_mkval(&c->ar, JV_DICT);
}

/* room for one more after the n elements of size sz at v: v itself, or a
 * copy twice as large (*cap updated); NULL when out of memory */
static void *arr_room(struct jarena *a, void *v, size_t n, size_t *cap, size_t sz)
{
	size_t nc;
	void *nv;

	if (n < *cap)
		return v;
	nc = *cap ? *cap * 2 : 4;
	nv = jj_aalloc(a, nc * sz);
	if (!nv)
		return NULL;
	if (n)
		memcpy(nv, v, n * sz);
	*cap = nc;
	return nv;
}

static int list_push(struct jarena *a, struct hp_jval *l, struct hp_jval *v)
{
	struct hp_jval **nv = arr_room(a, l->l.v, l->l.n, &l->l.cap, sizeof(*nv));

	if (!nv)
		return HP_ENOMEM;
	l->l.v = nv;
	l->l.v[l->l.n++] = v;
	return 0;
}

int hp_jv_append(struct hp_jctx *c, struct hp_jval *list, struct hp_jval *v)
{
	if (!list || list->type != JV_LIST || !v)
		return HP_EINVAL;
	return list_push(&c->ar, list, v);
}

/* the entry of string key k in dict d, or NULL */
struct jent *jj_dict_find_str(const struct hp_jval *d, const char *k, size_t n)
{
	for (size_t i = 0; i < d->d.n; i++) {
		const struct hp_jval *key = d->d.e[i].k;

		if (key->type == JV_STR && key->s.len == n && !memcmp(key->s.s, k, n))
			return &d->d.e[i];
	}
	return NULL;
}

int jj_dict_put(struct jarena *a, struct hp_jval *d, struct hp_jval *k, struct hp_jval *v)
{
	struct jent *ne = arr_room(a, d->d.e, d->d.n, &d->d.cap, sizeof(*ne));

	if (!ne)
		return HP_ENOMEM;
	d->d.e = ne;
	d->d.e[d->d.n].k = k;
	d->d.e[d->d.n].v = v;
	d->d.n++;
	return 0;
}

int hp_jv_set(struct hp_jctx *c, struct hp_jval *dict, const char *key, struct hp_jval *v)
{
	struct jent *e;
	struct hp_jval *k;

	if (!dict || dict->type != JV_DICT || !key || !v)
		return HP_EINVAL;
	e = jj_dict_find_str(dict, key, strlen(key));
	if (e) {
		e->v = v;
		return 0;
	}
	k = mkstr_copy(&c->ar, key, strlen(key), NULL, 0);
	if (!k)
		return HP_ENOMEM;
	return jj_dict_put(&c->ar, dict, k, v);
}

static struct hp_jval *from_json(struct jarena *a, const json_t *j, uint16_t tag, int depth)
{
	struct hp_jval *v = NULL;

	if (!j || depth > 1000)
		return NULL;
	switch (json_typeof(j)) {
	case JSON_OBJECT: {
		const char *k;
		json_t *x;

		v = jj_mkval(a, JV_DICT);
		if (!v)
			return NULL;
		json_object_foreach((json_t *)j, k, x) {
			struct hp_jval *kv = mkstr_copy(a, k, strlen(k), NULL, tag);
			struct hp_jval *xv = from_json(a, x, tag, depth + 1);

			if (!kv || !xv || jj_dict_put(a, v, kv, xv))
				return NULL;
		}
		return v;
	}
	case JSON_ARRAY: {
		size_t i;
		json_t *x;

		v = jj_mkval(a, JV_LIST);
		if (!v)
			return NULL;
		json_array_foreach(j, i, x) {
			struct hp_jval *xv = from_json(a, x, tag, depth + 1);

			if (!xv || list_push(a, v, xv))
				return NULL;
		}
		return v;
	}
	case JSON_STRING:
		return mkstr_copy(a, json_string_value(j), json_string_length(j), NULL, tag);
	case JSON_INTEGER:
		return mkival(a, JV_INT, json_integer_value(j));
	case JSON_REAL:
		return mkfval(a, json_real_value(j));
	case JSON_TRUE:
	case JSON_FALSE:
		return mkival(a, JV_BOOL, json_is_true(j));
	case JSON_NULL:
		return jj_mkval(a, JV_NONE);
	}
	return NULL;
}

struct hp_jval *hp_jv_from_json(struct hp_jctx *c, const json_t *j, uint16_t tag)
{
	return from_json(&c->ar, j, tag, 0);
}

/* --- render state: errors and allocation ------------------------------------ */
void *jj_rerr(struct rs *r, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (r->rc)
		return NULL;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* one line: a raise_exception message may hold newlines */
	for (char *p = msg; *p; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	r->rc = HP_EFORMAT;
	hp_err_set(r->e, HP_EFORMAT, "'%s' line %d: %s", r->t->name, r->line, msg);
	return NULL;
}

void *jj_room(struct rs *r)
{
	if (r->rc)
		return NULL;
	if (r->ar.over)
		return jj_rerr(r, "the render needs more than %zu MiB of memory (limit)", r->ar.limit >> 20);
	r->rc = HP_ENOMEM;
	hp_err_set(r->e, HP_ENOMEM, "'%s' line %d: out of memory rendering the template",
		   r->t->name, r->line);
	return NULL;
}

/* count n more loop iterations or range() items: -1 with the error past the limit */
int jj_count_iters(struct rs *r, long n)
{
	r->iters += n;
	if (r->iters <= r->lim_iters)
		return 0;
	jj_rerr(r, "more than %ld loop iterations and range() items (limit)", r->lim_iters);
	return -1;
}

/* the render-state allocators: the arena's, with the error when they fail (p NULL) */
static void *got(struct rs *r, void *p)
{
	return p ? p : jj_room(r);
}

void *jj_ral(struct rs *r, size_t n)
{
	return got(r, jj_aalloc(&r->ar, n));
}

struct hp_jval *jj_mk(struct rs *r, int type)
{
	return got(r, jj_mkval(&r->ar, type));
}

struct hp_jval *jj_mkint(struct rs *r, int64_t i)
{
	return got(r, mkival(&r->ar, JV_INT, i));
}

struct hp_jval *jj_mkfloat(struct rs *r, double f)
{
	return got(r, mkfval(&r->ar, f));
}

struct hp_jval *jj_mkstrc(struct rs *r, const char *s, size_t n)
{
	return got(r, mkstr_copy(&r->ar, s, n, NULL, 0));
}

struct hp_jval *jj_sub(struct rs *r, const struct hp_jval *v, size_t off, size_t len)
{
	if (off == 0 && len == v->s.len)
		return (struct hp_jval *)v;
	return got(r, substr(&r->ar, v, off, len));
}

struct hp_jval *jj_mklist(struct rs *r, size_t cap, int flags)
{
	struct hp_jval *l = jj_mk(r, JV_LIST);

	if (!l)
		return NULL;
	l->flags = (uint8_t)flags;
	if (cap) {
		l->l.v = jj_ral(r, cap * sizeof(*l->l.v));
		if (!l->l.v)
			return NULL;
		l->l.cap = cap;
	}
	return l;
}

int jj_push(struct rs *r, struct hp_jval *l, struct hp_jval *v)
{
	if (list_push(&r->ar, l, v)) {
		jj_room(r);
		return -1;
	}
	return 0;
}

struct hp_jval *jj_mkundef(struct rs *r, int why, const char *name, size_t nlen, const char *what)
{
	struct hp_jval *u = jj_mk(r, JV_UNDEF);

	if (u) {
		u->aux = (uint32_t)why;
		u->u.name = name;
		u->u.nlen = nlen;
		u->u.what = what;
	}
	return u;
}

struct sbuf jj_sb_new(struct rs *r)
{
	struct sbuf b;

	memset(&b, 0, sizeof(b));
	b.a = &r->ar;
	return b;
}

struct hp_jval *jj_sb_fin(struct rs *r, struct sbuf *b)
{
	return got(r, sb_done(b));
}

const char *jj_type_name(const struct hp_jval *v)
{
	switch (v->type) {
	case JV_UNDEF: return "Undefined";
	case JV_NONE: return "NoneType";
	case JV_BOOL: return "bool";
	case JV_INT: return "int";
	case JV_FLOAT: return "float";
	case JV_STR: return "str";
	case JV_LIST: return v->flags & JF_TUPLE ? "tuple" : "list";
	case JV_DICT: return "dict";
	case JV_NS: return "Namespace";
	case JV_MACRO: return "Macro";
	case JV_LOOP: return "LoopContext";
	}
	return "builtin_function_or_method";
}

/* the error an Undefined raises when used */
void *jj_undef_err(struct rs *r, const struct hp_jval *u)
{
	int n = (int)(u->u.nlen > 200 ? 200 : u->u.nlen);

	switch (u->aux) {
	case UN_NAME:
		return jj_rerr(r, "'%.*s' is undefined", n, u->u.name);
	case UN_ATTR:
		return jj_rerr(r, "'%s object' has no attribute '%.*s'", u->u.what, n, u->u.name);
	case UN_ITEM:
		return jj_rerr(r, "'%s object' has no element %.*s", u->u.what, n, u->u.name);
	case UN_UNSAFE:
		return jj_rerr(r, "access to attribute '%.*s' of '%s' object is unsafe", n, u->u.name,
			       u->u.what);
	}
	return jj_rerr(r, "%s", n ? u->u.name : "undefined value");
}

int jj_truthy(const struct hp_jval *v)
{
	switch (v->type) {
	case JV_UNDEF:
	case JV_NONE:
		return 0;
	case JV_BOOL:
	case JV_INT:
		return v->i != 0;
	case JV_FLOAT:
		return v->f != 0;
	case JV_STR:
		return v->s.len != 0;
	case JV_LIST:
		return v->l.n != 0;
	case JV_DICT:
		return v->d.n != 0;
	}
	return 1;
}

int jj_isnum(const struct hp_jval *v)
{
	return v->type == JV_BOOL || v->type == JV_INT || v->type == JV_FLOAT;
}

double jj_numf(const struct hp_jval *v)
{
	return v->type == JV_FLOAT ? v->f : (double)v->i;
}

/* Python ==, for every pair of types */
int jj_py_eq(const struct hp_jval *a, const struct hp_jval *b)
{
	if (jj_isnum(a) && jj_isnum(b)) {
		if (a->type == JV_FLOAT || b->type == JV_FLOAT)
			return jj_numf(a) == jj_numf(b);
		return a->i == b->i;
	}
	if (a->type != b->type)
		return 0;
	switch (a->type) {
	case JV_UNDEF:
	case JV_NONE:
		return 1;
	case JV_STR:
		return a->s.len == b->s.len && !memcmp(a->s.s, b->s.s, a->s.len);
	case JV_LIST:
		if ((a->flags & JF_TUPLE) != (b->flags & JF_TUPLE) || a->l.n != b->l.n)
			return 0;
		for (size_t i = 0; i < a->l.n; i++)
			if (!jj_py_eq(a->l.v[i], b->l.v[i]))
				return 0;
		return 1;
	case JV_DICT:
		if (a->d.n != b->d.n)
			return 0;
		for (size_t i = 0; i < a->d.n; i++) {
			size_t j;

			for (j = 0; j < b->d.n; j++)
				if (jj_py_eq(a->d.e[i].k, b->d.e[j].k))
					break;
			if (j == b->d.n || !jj_py_eq(a->d.e[i].v, b->d.e[j].v))
				return 0;
		}
		return 1;
	case JV_FUNC:
	case JV_METHOD:
		return a->aux == b->aux && a->meth.self == b->meth.self;
	}
	return a == b;
}

/* Python ordering: 0 and *res in {-1, 0, 1}, or -1 with the error set */
int jj_py_cmp(struct rs *r, const struct hp_jval *a, const struct hp_jval *b, int *res)
{
	if (a->type == JV_UNDEF || b->type == JV_UNDEF) {
		jj_undef_err(r, a->type == JV_UNDEF ? a : b);
		return -1;
	}
	if (jj_isnum(a) && jj_isnum(b)) {
		if (a->type == JV_FLOAT || b->type == JV_FLOAT) {
			double x = jj_numf(a), y = jj_numf(b);

			*res = x < y ? -1 : x > y ? 1 : 0;   /* NaN compares as equal-ish: Python gives False */
		} else {
			*res = a->i < b->i ? -1 : a->i > b->i;
		}
		return 0;
	}
	if (a->type == JV_STR && b->type == JV_STR) {
		size_t n = a->s.len < b->s.len ? a->s.len : b->s.len;
		int c = memcmp(a->s.s, b->s.s, n);

		*res = c < 0 ? -1 : c > 0 ? 1 : a->s.len < b->s.len ? -1 : a->s.len > b->s.len;
		return 0;
	}
	if (a->type == JV_LIST && b->type == JV_LIST && (a->flags & JF_TUPLE) == (b->flags & JF_TUPLE)) {
		for (size_t i = 0; i < a->l.n && i < b->l.n; i++) {
			if (jj_py_eq(a->l.v[i], b->l.v[i]))
				continue;
			return jj_py_cmp(r, a->l.v[i], b->l.v[i], res);
		}
		*res = a->l.n < b->l.n ? -1 : a->l.n > b->l.n;
		return 0;
	}
	jj_rerr(r, "'<' not supported between instances of '%s' and '%s'", jj_type_name(a), jj_type_name(b));
	return -1;
}

/* --- str() and repr() ------------------------------------------------------ */

static int put_str_repr(struct sbuf *b, const struct hp_jval *v)
{
	const char *s = v->s.s;
	size_t n = v->s.len, i = 0;
	int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
	char q = has_sq && !has_dq ? '"' : '\'';
	uint16_t t0 = n && v->s.tag ? v->s.tag[0] : v->btag;
	uint16_t t1 = n && v->s.tag ? v->s.tag[n - 1] : v->btag;

	jj_sb_ch(b, q, t0);
	while (i < n) {
		size_t st = i;
		uint32_t c = jj_u8dec(s, n, &i);
		uint16_t tg = v->s.tag ? v->s.tag[st] : 0;
		char esc[16];

		if (c == (uint32_t)q || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			jj_sb_put(b, esc, 2, NULL, tg);
		} else if (c == '\n') {
			jj_sb_put(b, "\\n", 2, NULL, tg);
		} else if (c == '\r') {
			jj_sb_put(b, "\\r", 2, NULL, tg);
		} else if (c == '\t') {
			jj_sb_put(b, "\\t", 2, NULL, tg);
		} else if (i - st == 1 && c >= 0x80) {
			/* an invalid byte: Python would hold a surrogate escape */
			snprintf(esc, sizeof(esc), "\\udc%02x", c);
			jj_sb_put(b, esc, 6, NULL, tg);
		} else if (!py_isprintable(c)) {
			int k = c < 0x100 ? snprintf(esc, sizeof(esc), "\\x%02x", c)
				: c < 0x10000 ? snprintf(esc, sizeof(esc), "\\u%04x", c)
				: snprintf(esc, sizeof(esc), "\\U%08x", c);
			jj_sb_put(b, esc, (size_t)k, NULL, tg);
		} else {
			jj_sb_span(b, v, st, i - st);
		}
	}
	return jj_sb_ch(b, q, t1);
}

/* str(v) appended to b, with the tags of the strings in it */
int jj_put_str(struct rs *r, struct sbuf *b, const struct hp_jval *v)
{
	char buf[64];

	switch (v->type) {
	case JV_UNDEF:
		return 0;
	case JV_STR:
		return jj_sb_val(b, v);
	case JV_INT:
		return sb_printf(b, 0, "%lld", (long long)v->i);
	case JV_FLOAT:
		fmt_float(buf, sizeof(buf), v->f);
		return jj_sb_str(b, buf, 0);
	}
	return jj_put_repr(r, b, v, 0);
}

/* -1 with the error when a value nests deeper than LIM_NEST (a list holding itself) */
static int too_deep(struct rs *r, int depth)
{
	if (depth <= LIM_NEST)
		return 0;
	jj_rerr(r, "values nested deeper than %d", LIM_NEST);
	return -1;
}

int jj_put_repr(struct rs *r, struct sbuf *b, const struct hp_jval *v, int depth)
{
	char buf[64];

	if (too_deep(r, depth))
		return -1;
	switch (v->type) {
	case JV_UNDEF:
		return jj_sb_str(b, "Undefined", 0);
	case JV_NONE:
		return jj_sb_str(b, "None", 0);
	case JV_BOOL:
		return jj_sb_str(b, v->i ? "True" : "False", 0);
	case JV_INT:
	case JV_FLOAT:
		return jj_put_str(r, b, v);
	case JV_STR:
		return put_str_repr(b, v);
	case JV_LIST: {
		const char *open = v->flags & JF_TUPLE ? "(" : "[", *close = v->flags & JF_TUPLE ? ")" : "]";

		if (v->flags & JF_ITEMS)
			jj_sb_str(b, "dict_items(", 0);
		else if (v->flags & JF_KEYS)
			jj_sb_str(b, "dict_keys(", 0);
		else if (v->flags & JF_VALUES)
			jj_sb_str(b, "dict_values(", 0);
		jj_sb_str(b, open, 0);
		for (size_t i = 0; i < v->l.n; i++) {
			if (i)
				jj_sb_str(b, ", ", 0);
			if (jj_put_repr(r, b, v->l.v[i], depth + 1))
				return -1;
		}
		if ((v->flags & JF_TUPLE) && v->l.n == 1)
			jj_sb_ch(b, ',', 0);
		jj_sb_str(b, close, 0);
		if (v->flags & (JF_ITEMS | JF_KEYS | JF_VALUES))
			jj_sb_ch(b, ')', 0);
		return b->oom ? -1 : 0;
	}
	case JV_DICT:
	case JV_NS:
		if (v->type == JV_NS)
			jj_sb_str(b, "<Namespace ", 0);
		jj_sb_ch(b, '{', 0);
		for (size_t i = 0; i < v->d.n; i++) {
			if (i)
				jj_sb_str(b, ", ", 0);
			if (jj_put_repr(r, b, v->d.e[i].k, depth + 1))
				return -1;
			jj_sb_str(b, ": ", 0);
			if (jj_put_repr(r, b, v->d.e[i].v, depth + 1))
				return -1;
		}
		jj_sb_ch(b, '}', 0);
		if (v->type == JV_NS)
			jj_sb_ch(b, '>', 0);
		return b->oom ? -1 : 0;
	case JV_MACRO:
		return sb_printf(b, 0, "<Macro '%s'>", v->m.def->name);
	case JV_LOOP:
		return sb_printf(b, 0, "<LoopContext %zu/%zu>", v->loop->i + 1, v->loop->n);
	case JV_METHOD:
		snprintf(buf, sizeof(buf), "<built-in method %s>", v->meth.name);
		return jj_sb_str(b, buf, 0);
	}
	return jj_sb_str(b, "<built-in function>", 0);
}

/* str(v) as a string value */
struct hp_jval *jj_to_str(struct rs *r, struct hp_jval *v)
{
	struct sbuf b;

	if (v->type == JV_STR)
		return v;
	if (v->type == JV_UNDEF)
		return &jj_v_empty;
	b = jj_sb_new(r);
	if (jj_put_str(r, &b, v))
		return b.oom ? jj_room(r) : NULL;
	return jj_sb_fin(r, &b);
}

/* --- json.dumps ------------------------------------------------------------ */
static int put_json_str(struct sbuf *b, const struct hp_jval *v, int ascii)
{
	const char *s = v->s.s;
	size_t n = v->s.len, i = 0;
	uint16_t t0 = n && v->s.tag ? v->s.tag[0] : v->btag;
	uint16_t t1 = n && v->s.tag ? v->s.tag[n - 1] : v->btag;

	jj_sb_ch(b, '"', t0);
	while (i < n) {
		size_t st = i, run;
		uint32_t c;
		uint16_t tg;
		char esc[16];

		/* copy runs of plain bytes at once */
		for (run = i; run < n; run++) {
			unsigned char ch = (unsigned char)s[run];

			if (ch < 0x20 || ch == '"' || ch == '\\' || (ascii && ch >= 0x7F))
				break;
		}
		if (run > i) {
			jj_sb_span(b, v, i, run - i);
			i = run;
			continue;
		}
		c = jj_u8dec(s, n, &i);
		tg = v->s.tag ? v->s.tag[st] : 0;
		switch (c) {
		case '"': jj_sb_put(b, "\\\"", 2, NULL, tg); continue;
		case '\\': jj_sb_put(b, "\\\\", 2, NULL, tg); continue;
		case '\n': jj_sb_put(b, "\\n", 2, NULL, tg); continue;
		case '\r': jj_sb_put(b, "\\r", 2, NULL, tg); continue;
		case '\t': jj_sb_put(b, "\\t", 2, NULL, tg); continue;
		case '\b': jj_sb_put(b, "\\b", 2, NULL, tg); continue;
		case '\f': jj_sb_put(b, "\\f", 2, NULL, tg); continue;
		}
		if (c < 0x20 || (ascii && c < 0x10000) || (i - st == 1 && c >= 0x80)) {
			snprintf(esc, sizeof(esc), "\\u%04x", i - st == 1 && c >= 0x80 ? 0xDC00 + c : c);
			jj_sb_put(b, esc, 6, NULL, tg);
		} else if (ascii) {
			uint32_t x = c - 0x10000;

			snprintf(esc, sizeof(esc), "\\u%04x\\u%04x", 0xD800 + (x >> 10), 0xDC00 + (x & 0x3FF));
			jj_sb_put(b, esc, 12, NULL, tg);
		} else {
			jj_sb_span(b, v, st, i - st);
		}
	}
	return jj_sb_ch(b, '"', t1);
}

static int json_nl(struct sbuf *b, const struct jopt *o, int level)
{
	jj_sb_ch(b, '\n', 0);
	for (int i = 0; i < level; i++)
		jj_sb_val(b, o->indent);
	return b->oom ? -1 : 0;
}

/* what goes before item i of a list or dict at level, and after its last */
static void json_item(struct sbuf *b, const struct jopt *o, int level, size_t i)
{
	if (i)
		jj_sb_val(b, o->isep);
	if (o->indent)
		json_nl(b, o, level + 1);
}

static int json_close(struct sbuf *b, const struct jopt *o, int level, char close)
{
	if (o->indent)
		json_nl(b, o, level);
	return jj_sb_ch(b, close, 0);
}

int jj_put_json(struct rs *r, struct sbuf *b, const struct hp_jval *v, const struct jopt *o,
		int level)
{
	char buf[64];

	if (too_deep(r, level))
		return -1;
	switch (v->type) {
	case JV_NONE:
		return jj_sb_str(b, "null", 0);
	case JV_BOOL:
		return jj_sb_str(b, v->i ? "true" : "false", 0);
	case JV_INT:
		return sb_printf(b, 0, "%lld", (long long)v->i);
	case JV_FLOAT:
		if (isnan(v->f))
			return jj_sb_str(b, "NaN", 0);
		if (isinf(v->f))
			return jj_sb_str(b, v->f < 0 ? "-Infinity" : "Infinity", 0);
		fmt_float(buf, sizeof(buf), v->f);
		return jj_sb_str(b, buf, 0);
	case JV_STR:
		return put_json_str(b, v, o->ascii);
	case JV_LIST:
		if (v->flags & (JF_ITEMS | JF_KEYS | JF_VALUES))
			break;
		if (!v->l.n)
			return jj_sb_str(b, "[]", 0);
		jj_sb_ch(b, '[', 0);
		for (size_t i = 0; i < v->l.n; i++) {
			json_item(b, o, level, i);
			if (jj_put_json(r, b, v->l.v[i], o, level + 1))
				return -1;
		}
		return json_close(b, o, level, ']');
	case JV_DICT: {
		size_t n = v->d.n;
		const struct jent **ord;

		if (!n)
			return jj_sb_str(b, "{}", 0);
		ord = jj_ral(r, n * sizeof(*ord));
		if (!ord)
			return -1;
		for (size_t i = 0; i < n; i++) {
			const struct hp_jval *k = v->d.e[i].k;

			if (k->type != JV_STR && !jj_isnum(k) && k->type != JV_NONE) {
				jj_rerr(r, "keys must be str, int, float, bool or None, not %s", jj_type_name(k));
				return -1;
			}
			ord[i] = &v->d.e[i];
		}
		if (o->sort) {
			/* insertion sort keeps it stable; dicts in templates are small */
			for (size_t i = 1; i < n; i++) {
				const struct jent *x = ord[i];
				size_t j = i;

				while (j > 0) {
					int c;

					if (jj_py_cmp(r, ord[j - 1]->k, x->k, &c))
						return -1;
					if (c <= 0)
						break;
					ord[j] = ord[j - 1];
					j--;
				}
				ord[j] = x;
			}
		}
		jj_sb_ch(b, '{', 0);
		for (size_t i = 0; i < n; i++) {
			const struct hp_jval *k = ord[i]->k;

			json_item(b, o, level, i);
			if (k->type == JV_STR) {
				put_json_str(b, k, o->ascii);
			} else {
				/* a number or None, quoted */
				jj_sb_ch(b, '"', 0);
				if (jj_put_json(r, b, k, o, level + 1))
					return -1;
				jj_sb_ch(b, '"', 0);
			}
			jj_sb_val(b, o->ksep);
			if (jj_put_json(r, b, ord[i]->v, o, level + 1))
				return -1;
		}
		return json_close(b, o, level, '}');
	}
	}
	if (v->type == JV_UNDEF && v->aux != UN_MSG)
		jj_rerr(r, "Object of type Undefined is not JSON serializable");
	else
		jj_rerr(r, "Object of type %s is not JSON serializable", jj_type_name(v));
	return -1;
}

