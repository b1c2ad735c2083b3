/*
 * jinja.c - the Jinja2 subset of HF chat templates: lexer, parser to a tree
 * compiled once, and a tree-walking evaluator whose strings carry per-byte
 * provenance tags (see jinja.h for the contract).
 *
 * The lexer follows jinja2 3.1's lexer.py rule for rule (the whitespace
 * control of trim_blocks, lstrip_blocks, '-' and '+', the drop of one
 * trailing newline, newline normalisation), the parser follows parser.py's
 * precedence climbing (so `-x|abs` and `2**3**2` group as jinja groups them),
 * and the evaluator follows Python's semantics for the types a chat template
 * sees: str (code-point indexed UTF-8), int (int64), float (printed with
 * Python's shortest repr), bool, None, list, tuple, dict (insertion-ordered),
 * jinja's namespace, loop and Undefined.  Scoping is jinja's: a for body
 * gets a fresh scope every iteration, if does not scope, macros close over
 * the scope they are defined in.
 *
 * What it is not: a compiler to bytecode or a general Python.  Values are
 * never freed one by one: a render allocates from its own arena, dropped at
 * the end, so there is no reference counting and no mutation of the
 * caller's values (jinja's ImmutableSandbox refuses mutating methods anyway;
 * the only mutable objects are the render's own namespaces).
 */
#include <math.h>
#include <time.h>

#include <utf8proc.h>

#include "base/alloc.h"
#include "text/jinja.h"

/* --- limits (see jinja.h) ------------------------------------------------ */
#define LIM_MACRO_DEPTH 100        /* Python's recursion limit hits jinja near here */
#define LIM_NEST 200               /* parser nesting: bounds the C stack of eval */
#define LIM_RANGE 100000           /* jinja2.sandbox.MAX_RANGE */
#define LIM_ITERS 2000000L         /* loop iterations and range() items: far above
				    * any chat template's needs, a second of work */
#define LIM_OUTPUT ((size_t)256 << 20)
#define LIM_MEMORY ((size_t)1 << 30)

/* --- arena ----------------------------------------------------------------- */
struct achunk {
	struct achunk *next;
	size_t cap, used;
	max_align_t data[];
};

struct jarena {
	struct achunk *head;
	size_t total;      /* bytes of all chunks */
	size_t limit;      /* 0: none */
	int over;          /* set when the limit refused an allocation */
};

static void *aalloc(struct jarena *a, size_t n)
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

static void *acalloc(struct jarena *a, size_t n)
{
	void *p = aalloc(a, n);

	if (p)
		memset(p, 0, n);
	return p;
}

static void arena_free(struct jarena *a)
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

/* --- values ---------------------------------------------------------------- */
enum {
	JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
	JV_NS, JV_MACRO, JV_FUNC, JV_METHOD, JV_LOOP,
};

#define JF_TUPLE 1     /* a list that is a Python tuple */
#define JF_ASCII 2     /* a string of bytes < 0x80 only */
#define JF_ITEMS 4     /* a list made by dict.items(): repr dict_items([...]) */
#define JF_KEYS 8
#define JF_VALUES 16

/* why an Undefined is undefined, for its error message */
enum { UN_NAME, UN_ATTR, UN_ITEM, UN_UNSAFE, UN_MSG };

struct jent {
	struct hp_jval *k, *v;
};

struct node;
struct frame;
struct jloop;

struct hp_jval {
	uint8_t type, flags;
	uint16_t btag;    /* strings: the tag of the quotes around an empty string */
	uint32_t aux;     /* FUNC/METHOD: which; UNDEF: UN_* */
	union {
		int64_t i;
		double f;
		struct {
			const char *s;
			const uint16_t *tag;   /* NULL: all 0 */
			size_t len, ncp;       /* bytes, code points */
		} s;
		struct {
			struct hp_jval **v;
			size_t n, cap;
		} l;
		struct {
			struct jent *e;
			size_t n, cap;
		} d;
		struct {
			const struct node *def;
			struct frame *closure;
		} m;
		struct {
			struct hp_jval *self;
			const char *name;
		} meth;
		struct jloop *loop;
		struct {
			const char *name;   /* the missing name or attribute */
			size_t nlen;
			const char *what;   /* the object's type name (UN_ATTR/ITEM/UNSAFE) */
		} u;
	};
};

struct hp_jctx {
	struct jarena ar;
};

static struct hp_jval *mkval(struct jarena *a, int type)
{
	struct hp_jval *v = aalloc(a, sizeof(*v));

	if (v) {
		memset(v, 0, sizeof(*v));
		v->type = (uint8_t)type;
	}
	return v;
}

/* a JV_BOOL or JV_INT holding i, a JV_FLOAT holding f */
static struct hp_jval *mkival(struct jarena *a, int type, int64_t i)
{
	struct hp_jval *v = mkval(a, type);

	if (v)
		v->i = i;
	return v;
}

static struct hp_jval *mkfval(struct jarena *a, double f)
{
	struct hp_jval *v = mkval(a, JV_FLOAT);

	if (v)
		v->f = f;
	return v;
}

/* shared immutable singletons: never written after initialisation */
static struct hp_jval v_none = { .type = JV_NONE };
static struct hp_jval v_true = { .type = JV_BOOL, .i = 1 };
static struct hp_jval v_false = { .type = JV_BOOL, .i = 0 };
static struct hp_jval v_empty = { .type = JV_STR, .flags = JF_ASCII, .s = { "", NULL, 0, 0 } };
static struct hp_jval v_space = { .type = JV_STR, .flags = JF_ASCII, .s = { " ", NULL, 1, 1 } };

#define VBOOL(b) ((b) ? &v_true : &v_false)

/* --- UTF-8 ------------------------------------------------------------------ */
#include "base/utf8.h"

/*
 * Decode the code point at s[*i] and advance *i past it.  Invalid bytes are
 * one code point each (their byte value), so that no input can make the
 * string functions fail; the caller's strings are normally valid already.
 */
static uint32_t u8dec(const char *s, size_t n, size_t *i)
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
		u8dec(s, n, &i);
		k++;
	}
	return k;
}

/* Python's str.isspace */
static int py_isspace(uint32_t c)
{
	return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
	       c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
	       c == 0x202F || c == 0x205F || c == 0x3000;
}

static int cat_of(uint32_t c)
{
	return c > 0x10FFFF ? UTF8PROC_CATEGORY_CN : utf8proc_category((utf8proc_int32_t)c);
}

static int py_isalpha(uint32_t c)
{
	int k;

	if (c < 0x80)
		return (c | 32) >= 'a' && (c | 32) <= 'z';
	k = cat_of(c);
	return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

static int py_isdigit(uint32_t c)
{
	if (c < 0x80)
		return c >= '0' && c <= '9';
	return cat_of(c) == UTF8PROC_CATEGORY_ND;
}

static int py_isalnum(uint32_t c)
{
	int k;

	if (c < 0x80)
		return py_isalpha(c) || (c >= '0' && c <= '9');
	k = cat_of(c);
	return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
	       (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

static int py_iscased(uint32_t c)
{
	int k = cat_of(c);

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
	k = cat_of(c);
	return !(k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
		 k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CN || k == UTF8PROC_CATEGORY_ZL ||
		 k == UTF8PROC_CATEGORY_ZP || k == UTF8PROC_CATEGORY_ZS);
}

/* --- strings ---------------------------------------------------------------- */
static struct hp_jval *mkstr_raw(struct jarena *a, const char *s, size_t len, const uint16_t *tag,
				 uint16_t btag)
{
	struct hp_jval *v = mkval(a, JV_STR);
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
	char *b = aalloc(a, len + 1);
	uint16_t *t = NULL;

	if (!b)
		return NULL;
	memcpy(b, s, len);
	b[len] = '\0';
	if (tags) {
		for (size_t i = 0; i < len && !t; i++)
			if (tags[i]) {
				t = aalloc(a, len * sizeof(*t) + 1);
				if (!t)
					return NULL;
				memcpy(t, tags, len * sizeof(*t));
			}
	} else if (tag && len) {
		t = aalloc(a, len * sizeof(*t));
		if (!t)
			return NULL;
		for (size_t i = 0; i < len; i++)
			t[i] = tag;
	}
	return mkstr_raw(a, b, len, t, tag);
}

/* byte offset of code point k of v (k <= ncp) */
static size_t cp_off(const struct hp_jval *v, size_t k)
{
	size_t i = 0;

	if (v->flags & JF_ASCII)
		return k;
	while (k-- && i < v->s.len)
		u8dec(v->s.s, v->s.len, &i);
	return i;
}

/* a substring sharing v's bytes and tags */
static struct hp_jval *substr(struct jarena *a, const struct hp_jval *v, size_t off, size_t len)
{
	struct hp_jval *r = mkval(a, JV_STR);

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
struct sbuf {
	struct jarena *a;    /* NULL: heap (hp_realloc), for the render output */
	char *s;
	uint16_t *t;         /* NULL until a non-zero tag arrives (heap: always) */
	uint8_t *g;          /* heap only, when generation marks are wanted */
	size_t len, cap;
	int want_g;
	int oom;
};

static int sb_grow(struct sbuf *b, size_t add)
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
		char *s = aalloc(b->a, cap + 1);
		uint16_t *t = NULL;

		if (!s)
			goto oom;
		if (b->t) {
			t = aalloc(b->a, cap * sizeof(*t));
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
	if (!b->cap && sb_grow(b, 1))
		return -1;
	b->t = aalloc(b->a, b->cap * sizeof(*b->t));
	if (!b->t) {
		b->oom = 1;
		return -1;
	}
	memset(b->t, 0, b->len * sizeof(*b->t));
	return 0;
}

/* append n bytes; tags NULL: all get tag */
static int sb_put(struct sbuf *b, const char *s, size_t n, const uint16_t *tags, uint16_t tag)
{
	if (!n)
		return b->oom ? -1 : 0;
	if (sb_grow(b, n))
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

static int sb_str(struct sbuf *b, const char *s, uint16_t tag)
{
	return sb_put(b, s, strlen(s), NULL, tag);
}

static int sb_ch(struct sbuf *b, char c, uint16_t tag)
{
	return sb_put(b, &c, 1, NULL, tag);
}

static int sb_val(struct sbuf *b, const struct hp_jval *v)
{
	return sb_put(b, v->s.s, v->s.len, v->s.tag, 0);
}

/* append v's bytes [off, off + n) with their tags */
static int sb_span(struct sbuf *b, const struct hp_jval *v, size_t off, size_t n)
{
	return sb_put(b, v->s.s + off, n, v->s.tag ? v->s.tag + off : NULL, 0);
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
	return sb_put(b, buf, (size_t)n, NULL, tag);
}

/* the buffer as a string value (arena buffers only) */
static struct hp_jval *sb_done(struct sbuf *b)
{
	if (b->oom)
		return NULL;
	if (!b->len)
		return &v_empty;
	b->s[b->len] = '\0';
	return mkstr_raw(b->a, b->s, b->len, b->t, 0);
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
	arena_free(&c->ar);
	hp_free(c);
}

struct hp_jval *hp_jv_none(struct hp_jctx *c)
{
	return mkval(&c->ar, JV_NONE);
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
	return mkval(&c->ar, JV_LIST);
}

struct hp_jval *hp_jv_dict(struct hp_jctx *c)
{
	return mkval(&c->ar, JV_DICT);
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
	nv = aalloc(a, nc * sz);
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
static struct jent *dict_find_str(const struct hp_jval *d, const char *k, size_t n)
{
	for (size_t i = 0; i < d->d.n; i++) {
		const struct hp_jval *key = d->d.e[i].k;

		if (key->type == JV_STR && key->s.len == n && !memcmp(key->s.s, k, n))
			return &d->d.e[i];
	}
	return NULL;
}

static int dict_put(struct jarena *a, struct hp_jval *d, struct hp_jval *k, struct hp_jval *v)
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
	e = dict_find_str(dict, key, strlen(key));
	if (e) {
		e->v = v;
		return 0;
	}
	k = mkstr_copy(&c->ar, key, strlen(key), NULL, 0);
	if (!k)
		return HP_ENOMEM;
	return dict_put(&c->ar, dict, k, v);
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

		v = mkval(a, JV_DICT);
		if (!v)
			return NULL;
		json_object_foreach((json_t *)j, k, x) {
			struct hp_jval *kv = mkstr_copy(a, k, strlen(k), NULL, tag);
			struct hp_jval *xv = from_json(a, x, tag, depth + 1);

			if (!kv || !xv || dict_put(a, v, kv, xv))
				return NULL;
		}
		return v;
	}
	case JSON_ARRAY: {
		size_t i;
		json_t *x;

		v = mkval(a, JV_LIST);
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
		return mkval(a, JV_NONE);
	}
	return NULL;
}

struct hp_jval *hp_jv_from_json(struct hp_jctx *c, const json_t *j, uint16_t tag)
{
	return from_json(&c->ar, j, tag, 0);
}

/* --- templates and the syntax tree ----------------------------------------- */
enum {
	/* expressions */
	N_CONST, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_BIN, N_NEG, N_POS,
	N_NOT, N_AND, N_OR, N_CMP, N_COND, N_LIST, N_TUPLE, N_DICT, N_CONCAT, N_BODYVAL,
	/* statements */
	S_BODY, S_DATA, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_BREAK, S_CONT, S_GEN,
	S_FILTER,
};

/* binary and comparison operators (token codes double as these) */
enum {
	OP_NONE, OP_ADD, OP_SUB, OP_DIV, OP_FLOORDIV, OP_MUL, OP_MOD, OP_POW, OP_TILDE,
	OP_LBRACKET, OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE, OP_EQ, OP_NE,
	OP_GT, OP_GE, OP_LT, OP_LE, OP_ASSIGN, OP_DOT, OP_COLON, OP_PIPE, OP_COMMA,
	OP_SEMICOLON, OP_IN, OP_NOTIN,
};

struct kwarg {
	const char *name;
	struct node *v;
};

struct node {
	uint8_t kind, op;
	uint16_t fl;
	int line;
	struct node *a, *b, *c, *d, *e;
	struct node **v;      /* items, positional args, statements, comparands, params */
	struct node **v2;     /* macro defaults (NULL entries for none) */
	int nv;
	struct kwarg *kw;
	int nkw;
	uint8_t *ops;         /* N_CMP: nv - 1 operators */
	struct hp_jval *val;  /* N_CONST, S_DATA */
	const char *name;     /* interned: names, attributes, filters, tests, macros */
	int id;               /* filter or test */
};

/* node flags */
#define NF_NSREF 1        /* set target ns.attr */
#define NF_VARARGS 2      /* macro body uses varargs */
#define NF_KWARGS 4       /* macro body uses kwargs */
#define NF_NOTRIM 8

struct hp_jinja {
	struct jarena ar;
	char *name;
	struct node *root;
	int has_gen;
};

/* --- lexer ------------------------------------------------------------------ */
enum { T_EOF, T_DATA, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP };

struct tok {
	uint8_t type, op;
	int line;
	const char *s;    /* DATA, NAME, STRING (decoded), interned for NAME */
	size_t n;
	int64_t i;
	double f;
};

struct comp {
	struct hp_jinja *t;
	struct hp_err *e;
	const char *src;
	size_t n;
	struct tok *tk;
	size_t ntk, captk, p;
	int rc;
	int depth;
	const char **names;   /* intern table */
	size_t nnames, capnames;
	int macro_depth;
	int uses_varargs, uses_kwargs;
};

static int cerr(struct comp *c, int code, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int cerr(struct comp *c, int code, int line, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (c->rc)
		return c->rc;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	c->rc = code;
	if (code == HP_ENOMEM)
		hp_err_set(c->e, code, "'%s': out of memory compiling the template", c->t->name);
	else
		hp_err_set(c->e, code, "'%s' line %d: %s", c->t->name, line, msg);
	return code;
}

static const char *intern(struct comp *c, const char *s, size_t n)
{
	char *d;

	for (size_t i = 0; i < c->nnames; i++)
		if (!strncmp(c->names[i], s, n) && !c->names[i][n])
			return c->names[i];
	if (c->nnames == c->capnames) {
		size_t cap = c->capnames ? c->capnames * 2 : 64;
		const char **nn = aalloc(&c->t->ar, cap * sizeof(*nn));

		if (!nn)
			return NULL;
		if (c->nnames)
			memcpy(nn, c->names, c->nnames * sizeof(*nn));
		c->names = nn;
		c->capnames = cap;
	}
	d = aalloc(&c->t->ar, n + 1);
	if (!d)
		return NULL;
	memcpy(d, s, n);
	d[n] = '\0';
	c->names[c->nnames++] = d;
	return d;
}

static struct tok *tk_add(struct comp *c, int type, int line)
{
	struct tok *t;

	if (c->ntk == c->captk) {
		size_t cap = c->captk ? c->captk * 2 : 256;
		struct tok *nt = aalloc(&c->t->ar, cap * sizeof(*nt));

		if (!nt) {
			cerr(c, HP_ENOMEM, 0, "no memory");
			return NULL;
		}
		if (c->ntk)
			memcpy(nt, c->tk, c->ntk * sizeof(*nt));
		c->tk = nt;
		c->captk = cap;
	}
	t = &c->tk[c->ntk++];
	memset(t, 0, sizeof(*t));
	t->type = (uint8_t)type;
	t->line = line;
	return t;
}

/* length of the Unicode whitespace character at s[i], 0 if none */
static size_t ws_at(const char *s, size_t n, size_t i)
{
	size_t j = i;

	if (i >= n)
		return 0;
	if ((unsigned char)s[i] < 0x80)
		return py_isspace((unsigned char)s[i]) ? 1 : 0;
	return py_isspace(u8dec(s, n, &j)) ? j - i : 0;
}

static size_t skip_ws(const char *s, size_t n, size_t i)
{
	size_t k;

	while ((k = ws_at(s, n, i)))
		i += k;
	return i;
}

/* start of the code point that ends at s[end] */
static size_t u8prev(const char *s, size_t end)
{
	size_t i = end - 1;

	while (i > 0 && end - i < 4 && ((unsigned char)s[i] & 0xC0) == 0x80)
		i--;
	/* only a real sequence counts as one character */
	{
		size_t j = i;

		u8dec(s, end, &j);
		if (j != end)
			i = end - 1;
	}
	return i;
}

static size_t rstrip_ws_len(const char *s, size_t n)
{
	while (n) {
		size_t i = u8prev(s, n), j = i;

		if (!py_isspace(u8dec(s, n, &j)))
			break;
		n = i;
	}
	return n;
}

static int count_nl(const char *s, size_t n)
{
	int k = 0;

	for (size_t i = 0; i < n; i++)
		k += s[i] == '\n';
	return k;
}

/* skip_ws, counting the newlines skipped into *line */
static size_t skip_ws_lines(const char *s, size_t n, size_t i, int *line)
{
	size_t j = skip_ws(s, n, i);

	*line += count_nl(s + i, j - i);
	return j;
}

/* emit a data token for s[0, n) after whitespace control */
static int lex_data(struct comp *c, const char *s, size_t n, int sign, int is_var, int line_starting,
		    int line)
{
	struct tok *t;

	if (sign == '-') {
		n = rstrip_ws_len(s, n);
	} else if (sign != '+' && !is_var) {
		/* lstrip_blocks: spaces before a block tag at the start of a line */
		size_t l = n;

		while (l && s[l - 1] != '\n')
			l--;
		if ((l > 0 || line_starting) && l < n && skip_ws(s, n, l) == n)
			n = l;
	}
	if (!n)
		return 0;
	t = tk_add(c, T_DATA, line);
	if (!t)
		return c->rc;
	t->s = s;
	t->n = n;
	return 0;
}

static int hexval(int ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if ((ch | 32) >= 'a' && (ch | 32) <= 'f')
		return (ch | 32) - 'a' + 10;
	return -1;
}

/* decode a string literal body like Python's unicode-escape */
static int lex_string(struct comp *c, struct tok *t, const char *s, size_t n)
{
	char *o = aalloc(&c->t->ar, n + 1);
	size_t k = 0;

	if (!o)
		return cerr(c, HP_ENOMEM, 0, "no memory");
	for (size_t i = 0; i < n; i++) {
		uint32_t cp;
		int nd;

		if (s[i] != '\\') {
			o[k++] = s[i];
			continue;
		}
		if (++i >= n)
			return cerr(c, HP_EFORMAT, t->line, "bad escape at end of string");
		switch (s[i]) {
		case '\n': continue;
		case '\\': o[k++] = '\\'; continue;
		case '\'': o[k++] = '\''; continue;
		case '"': o[k++] = '"'; continue;
		case 'a': o[k++] = 7; continue;
		case 'b': o[k++] = 8; continue;
		case 'f': o[k++] = 12; continue;
		case 'n': o[k++] = 10; continue;
		case 'r': o[k++] = 13; continue;
		case 't': o[k++] = 9; continue;
		case 'v': o[k++] = 11; continue;
		case 'x': nd = 2; break;
		case 'u': nd = 4; break;
		case 'U': nd = 8; break;
		case 'N':
			return cerr(c, HP_EUNSUP, t->line, "the \\N{...} escape is not supported");
		default:
			if (s[i] >= '0' && s[i] <= '7') {
				cp = 0;
				for (int j = 0; j < 3 && i < n && s[i] >= '0' && s[i] <= '7'; j++, i++)
					cp = cp * 8 + (uint32_t)(s[i] - '0');
				i--;
				k += hp_utf8_encode(cp, (unsigned char *)o + k);
				continue;
			}
			/* an unknown escape stays as written */
			o[k++] = '\\';
			o[k++] = s[i];
			continue;
		}
		cp = 0;
		for (int j = 0; j < nd; j++) {
			int h = i + 1 + (size_t)j < n ? hexval((unsigned char)s[i + 1 + (size_t)j]) : -1;

			if (h < 0)
				return cerr(c, HP_EFORMAT, t->line, "truncated \\%c escape in a string", s[i]);
			cp = cp << 4 | (uint32_t)h;
		}
		i += (size_t)nd;
		if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
			return cerr(c, HP_EFORMAT, t->line, "escape out of range or a surrogate in a string");
		k += hp_utf8_encode(cp, (unsigned char *)o + k);
	}
	o[k] = '\0';
	t->s = o;
	t->n = k;
	return 0;
}

static const struct {
	const char *s;
	int op;
} ops[] = {
	{ "**", OP_POW }, { "//", OP_FLOORDIV }, { "==", OP_EQ }, { "!=", OP_NE },
	{ ">=", OP_GE }, { "<=", OP_LE }, { "+", OP_ADD }, { "-", OP_SUB }, { "/", OP_DIV },
	{ "*", OP_MUL }, { "%", OP_MOD }, { "~", OP_TILDE }, { "[", OP_LBRACKET },
	{ "]", OP_RBRACKET }, { "(", OP_LPAREN }, { ")", OP_RPAREN }, { "{", OP_LBRACE },
	{ "}", OP_RBRACE }, { ">", OP_GT }, { "<", OP_LT }, { "=", OP_ASSIGN }, { ".", OP_DOT },
	{ ":", OP_COLON }, { "|", OP_PIPE }, { ",", OP_COMMA }, { ";", OP_SEMICOLON },
};

static int isdig(int ch)
{
	return ch >= '0' && ch <= '9';
}

/* digits with single underscores between them (the "(\d+_)*\d+" of lexer.py) */
static size_t scan_digits(const char *s, size_t n, size_t i)
{
	size_t j = i;

	if (j >= n || !isdig(s[j]))
		return i;
	while (j < n && isdig(s[j])) {
		j++;
		if (j + 1 < n && s[j] == '_' && isdig(s[j + 1]))
			j++;
	}
	return j;
}

/* a float literal at s[i] (lexer.py float_re): its end, or i */
static size_t scan_float(const char *s, size_t n, size_t i)
{
	size_t j = scan_digits(s, n, i), k;

	if (j == i || (i > 0 && s[i - 1] == '.'))
		return i;
	k = j;
	if (k < n && s[k] == '.') {
		size_t f = scan_digits(s, n, k + 1);

		if (f == k + 1)
			return i;
		k = f;
	}
	if (k < n && (s[k] | 32) == 'e') {
		size_t e = k + 1, x;

		if (e < n && (s[e] == '+' || s[e] == '-'))
			e++;
		x = scan_digits(s, n, e);
		if (x > e)
			return x;
	}
	return k > j ? k : i;
}

static int lex_number(struct comp *c, const char *s, size_t n, size_t *pos, int line)
{
	size_t i = *pos, j = scan_float(s, n, i);
	char buf[128];
	size_t k = 0;
	struct tok *t;

	if (j > i) {
		for (size_t x = i; x < j && k < sizeof(buf) - 1; x++)
			if (s[x] != '_')
				buf[k++] = s[x];
		buf[k] = '\0';
		t = tk_add(c, T_FLOAT, line);
		if (!t)
			return c->rc;
		t->f = strtod(buf, NULL);
		*pos = j;
		return 0;
	}
	{
		int base = 10;
		uint64_t v = 0;
		size_t x = i;

		if (s[i] == '0' && i + 1 < n && strchr("bBoOxX", s[i + 1]) && s[i + 1]) {
			int b = (s[i + 1] | 32) == 'b' ? 2 : (s[i + 1] | 32) == 'o' ? 8 : 16;
			size_t y = i + 2;
			int nd = 0;

			while (y < n) {
				int h = s[y] == '_' ? -2 : hexval((unsigned char)s[y]);

				if (h == -2 && y + 1 < n && hexval((unsigned char)s[y + 1]) >= 0 &&
				    hexval((unsigned char)s[y + 1]) < b) {
					y++;
					continue;
				}
				if (h < 0 || h >= b)
					break;
				y++;
				nd++;
			}
			if (nd) {
				base = b;
				x = i + 2;
				j = y;
			}
		}
		if (base == 10) {
			if (s[i] == '0') {
				j = i + 1;
				while (j < n && (s[j] == '0' || (s[j] == '_' && j + 1 < n && s[j + 1] == '0')))
					j++;
			} else {
				j = scan_digits(s, n, i);
			}
		}
		for (; x < j; x++) {
			int h = hexval((unsigned char)s[x]);

			if (s[x] == '_')
				continue;
			if (v > (UINT64_MAX - (uint64_t)h) / (uint64_t)base || v * (uint64_t)base + (uint64_t)h > INT64_MAX)
				return cerr(c, HP_EUNSUP, line, "integer literal beyond 64 bits is not supported");
			v = v * (uint64_t)base + (uint64_t)h;
		}
		t = tk_add(c, T_INT, line);
		if (!t)
			return c->rc;
		t->i = (int64_t)v;
		*pos = j;
		return 0;
	}
}

/*
 * The tokens inside a {{ }} or {% %} tag from s[*pos]; on return *pos is past
 * the end delimiter (and what trim_blocks / '-' removed after it).
 */
static int lex_tag(struct comp *c, size_t *pos, int is_var, int *line, int *line_starting)
{
	const char *s = c->src;
	size_t n = c->n, i = *pos;
	char stack[LIM_NEST];
	int ns = 0;

	for (;;) {
		struct tok *t;

		i = skip_ws_lines(s, n, i, line);
		if (i >= n)
			return cerr(c, HP_EFORMAT, *line, "unexpected end of template inside a %s tag",
				    is_var ? "{{ }}" : "{% %}");
		if (!ns) {
			const char *end = is_var ? "}}" : "%}";

			if (!is_var && s[i] == '+' && i + 2 < n && !strncmp(s + i + 1, end, 2)) {
				t = tk_add(c, T_BEND, *line);
				if (!t)
					return c->rc;
				*pos = i + 3;
				*line_starting = 0;
				return 0;
			}
			if (s[i] == '-' && i + 2 < n && !strncmp(s + i + 1, end, 2)) {
				size_t k = i + 3, m;

				t = tk_add(c, is_var ? T_VEND : T_BEND, *line);
				if (!t)
					return c->rc;
				m = skip_ws_lines(s, n, k, line);
				*line_starting = m > k && s[m - 1] == '\n';
				*pos = m;
				return 0;
			}
			if (i + 1 < n && !strncmp(s + i, end, 2)) {
				t = tk_add(c, is_var ? T_VEND : T_BEND, *line);
				if (!t)
					return c->rc;
				i += 2;
				*line_starting = 0;
				if (!is_var && i < n && s[i] == '\n') {   /* trim_blocks */
					i++;
					(*line)++;
					*line_starting = 1;
				}
				*pos = i;
				return 0;
			}
		}
		if (isdig(s[i])) {
			if (lex_number(c, s, n, &i, *line))
				return c->rc;
			continue;
		}
		if (s[i] == '_' || ((s[i] | 32) >= 'a' && (s[i] | 32) <= 'z')) {
			size_t j2 = i;

			while (j2 < n && (s[j2] == '_' || isdig(s[j2]) || ((s[j2] | 32) >= 'a' && (s[j2] | 32) <= 'z')))
				j2++;
			t = tk_add(c, T_NAME, *line);
			if (!t)
				return c->rc;
			t->s = intern(c, s + i, j2 - i);
			if (!t->s)
				return cerr(c, HP_ENOMEM, 0, "no memory");
			t->n = j2 - i;
			i = j2;
			continue;
		}
		if (s[i] == '\'' || s[i] == '"') {
			char q = s[i];
			size_t j2 = i + 1;

			while (j2 < n && s[j2] != q) {
				if (s[j2] == '\\')
					j2++;
				j2++;
			}
			if (j2 >= n)
				return cerr(c, HP_EFORMAT, *line, "unterminated string");
			t = tk_add(c, T_STRING, *line);
			if (!t)
				return c->rc;
			if (lex_string(c, t, s + i + 1, j2 - i - 1))
				return c->rc;
			*line += count_nl(s + i, j2 - i);
			i = j2 + 1;
			continue;
		}
		{
			size_t k;

			for (k = 0; k < sizeof(ops) / sizeof(ops[0]); k++)
				if (!strncmp(s + i, ops[k].s, strlen(ops[k].s)) && i + strlen(ops[k].s) <= n)
					break;
			if (k == sizeof(ops) / sizeof(ops[0])) {
				if ((unsigned char)s[i] >= 0x80)
					return cerr(c, HP_EUNSUP, *line, "non-ASCII names are not supported");
				return cerr(c, HP_EFORMAT, *line, "unexpected char '%c'", s[i]);
			}
			t = tk_add(c, T_OP, *line);
			if (!t)
				return c->rc;
			t->op = (uint8_t)ops[k].op;
			if (t->op == OP_LPAREN || t->op == OP_LBRACKET || t->op == OP_LBRACE) {
				if (ns == LIM_NEST)
					return cerr(c, HP_EFORMAT, *line, "brackets nested deeper than %d", LIM_NEST);
				stack[ns++] = t->op == OP_LPAREN ? ')' : t->op == OP_LBRACKET ? ']' : '}';
			} else if (t->op == OP_RPAREN || t->op == OP_RBRACKET || t->op == OP_RBRACE) {
				char want = s[i];

				if (!ns)
					return cerr(c, HP_EFORMAT, *line, "unexpected '%c'", want);
				if (stack[--ns] != want)
					return cerr(c, HP_EFORMAT, *line, "unexpected '%c', expected '%c'", want,
						    stack[ns]);
			}
			i += strlen(ops[k].s);
		}
	}
}

/* "{%" sign? \s* NAME \s* then an end: the end of the tag, or 0 */
static size_t match_word_tag(const char *s, size_t n, size_t i, const char *word, int *esign)
{
	size_t wl = strlen(word);

	i = skip_ws(s, n, i);
	if (i + wl > n || strncmp(s + i, word, wl))
		return 0;
	i = skip_ws(s, n, i + wl);
	*esign = 0;
	if (i + 3 <= n && s[i] == '-' && !strncmp(s + i + 1, "%}", 2)) {
		*esign = '-';
		return i + 3;
	}
	if (i + 3 <= n && s[i] == '+' && !strncmp(s + i + 1, "%}", 2)) {
		*esign = '+';
		return i + 3;
	}
	if (i + 2 <= n && !strncmp(s + i, "%}", 2))
		return i + 2;
	return 0;
}

static int lex(struct comp *c)
{
	const char *s = c->src;
	size_t n = c->n, pos = 0;
	int line = 1, line_starting = 1;

	while (pos < n) {
		size_t p = pos, q;
		int kind, sign = 0;

		while (p + 1 < n && !(s[p] == '{' && (s[p + 1] == '{' || s[p + 1] == '%' || s[p + 1] == '#')))
			p++;
		if (p + 1 >= n) {
			struct tok *t = tk_add(c, T_DATA, line);

			if (!t)
				return c->rc;
			t->s = s + pos;
			t->n = n - pos;
			break;
		}
		kind = s[p + 1];
		q = p + 2;
		if (q < n && (s[q] == '-' || s[q] == '+'))
			sign = s[q++];
		if (kind == '%') {
			int esign;
			size_t r = match_word_tag(s, n, q, "raw", &esign);

			/* {% raw %}: no trim_blocks after its end (lexer.py root_raw_re) */
			if (r && esign != '+') {
				size_t body, k;
				int rs = 0, es2 = 0;
				size_t ee = 0;

				if (lex_data(c, s + pos, p - pos, sign, 0, line_starting, line))
					return c->rc;
				line += count_nl(s + pos, r - pos);
				if (esign == '-')
					r = skip_ws_lines(s, n, r, &line);
				line_starting = r > 0 && s[r - 1] == '\n';
				body = r;
				for (k = r; k + 1 < n; k++) {
					if (s[k] == '{' && s[k + 1] == '%') {
						size_t z = k + 2;

						rs = 0;
						if (z < n && (s[z] == '-' || s[z] == '+'))
							rs = s[z++];
						ee = match_word_tag(s, n, z, "endraw", &es2);
						if (ee)
							break;
					}
				}
				if (!ee)
					return cerr(c, HP_EFORMAT, line, "missing end of raw directive");
				if (lex_data(c, s + body, k - body, rs, 0, line_starting, line))
					return c->rc;
				line += count_nl(s + body, ee - body);
				if (es2 == '-') {
					ee = skip_ws_lines(s, n, ee, &line);
				} else if (es2 != '+' && ee < n && s[ee] == '\n') {
					ee++;
					line++;
				}
				line_starting = s[ee - 1] == '\n';
				pos = ee;
				continue;
			}
		}
		if (lex_data(c, s + pos, p - pos, sign, kind == '{', line_starting, line))
			return c->rc;
		line += count_nl(s + pos, p - pos);
		line_starting = 0;
		if (kind == '#') {
			size_t k;

			for (k = q; k + 1 < n; k++) {
				if (s[k] == '+' && k + 2 < n && s[k + 1] == '#' && s[k + 2] == '}') {
					line += count_nl(s + q, k - q);
					pos = k + 3;
					break;
				}
				if (s[k] == '-' && k + 2 < n && s[k + 1] == '#' && s[k + 2] == '}') {
					size_t m = skip_ws(s, n, k + 3);

					line += count_nl(s + q, m - q);
					line_starting = m > k + 3 && s[m - 1] == '\n';
					pos = m;
					break;
				}
				if (s[k] == '#' && s[k + 1] == '}') {
					line += count_nl(s + q, k - q);
					pos = k + 2;
					if (pos < n && s[pos] == '\n') {
						pos++;
						line++;
						line_starting = 1;
					}
					break;
				}
			}
			if (k + 1 >= n)
				return cerr(c, HP_EFORMAT, line, "missing end of comment tag");
			continue;
		}
		{
			struct tok *t = tk_add(c, kind == '{' ? T_VBEGIN : T_BBEGIN, line);

			if (!t)
				return c->rc;
			pos = q;
			if (lex_tag(c, &pos, kind == '{', &line, &line_starting))
				return c->rc;
		}
	}
	return tk_add(c, T_EOF, line) ? 0 : c->rc;
}

/* --- parser ----------------------------------------------------------------- */
enum {
	F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_CENTER, F_COUNT, F_D, F_DEFAULT, F_DICTSORT, F_E,
	F_ESCAPE, F_FIRST, F_FLOAT, F_FORCEESCAPE, F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN,
	F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE,
	F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE,
	F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT, F_N
};
static const char *const filter_names[F_N] = {
	"abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e",
	"escape", "first", "float", "forceescape", "format", "indent", "int", "items", "join",
	"last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace",
	"reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title",
	"tojson", "trim", "unique", "upper", "wordcount",
};
/* jinja2 3.1 has these too; a template using one is refused, not misrendered */
static const char *const filter_unsup[] = {
	"filesizeformat", "groupby", "pprint", "random", "slice", "striptags", "truncate",
	"urlencode", "urlize", "wordwrap", "xmlattr", NULL,
};

enum {
	X_BOOLEAN, X_CALLABLE, X_DEFINED, X_DIVISIBLEBY, X_EQ, X_EQUALTO, X_ESCAPED, X_EVEN,
	X_FALSE, X_FILTER, X_FLOAT, X_GE, X_GT, X_GREATERTHAN, X_IN, X_INTEGER, X_ITERABLE, X_LE,
	X_LESSTHAN, X_LOWER, X_LT, X_MAPPING, X_NE, X_NONE, X_NUMBER, X_ODD, X_SAMEAS, X_SEQUENCE,
	X_STRING, X_TEST, X_TRUE, X_UNDEFINED, X_UPPER, X_OPEQ, X_OPNE, X_OPLT, X_OPLE, X_OPGT,
	X_OPGE, X_N
};
static const char *const test_names[X_N] = {
	"boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
	"false", "filter", "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le",
	"lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas", "sequence",
	"string", "test", "true", "undefined", "upper", "==", "!=", "<", "<=", ">", ">=",
};

static int name_index(const char *const *tab, int n, const char *s)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(tab[i], s))
			return i;
	return -1;
}

static struct tok *cur(struct comp *c)
{
	return &c->tk[c->p];
}

static struct tok *peek(struct comp *c, size_t k)
{
	return c->p + k < c->ntk ? &c->tk[c->p + k] : &c->tk[c->ntk - 1];
}

static void adv(struct comp *c)
{
	if (c->p + 1 < c->ntk)
		c->p++;
}

static int is_name(const struct tok *t, const char *s)
{
	return t->type == T_NAME && !strcmp(t->s, s);
}

static int is_op(const struct tok *t, int op)
{
	return t->type == T_OP && t->op == op;
}

static const char *describe(const struct tok *t)
{
	switch (t->type) {
	case T_EOF: return "end of template";
	case T_DATA: return "template data";
	case T_VBEGIN: return "begin of print statement";
	case T_VEND: return "end of print statement";
	case T_BBEGIN: return "begin of statement block";
	case T_BEND: return "end of statement block";
	case T_NAME: return t->s;
	case T_STRING: return "string";
	case T_INT: return "integer";
	case T_FLOAT: return "float";
	}
	for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++)
		if (ops[k].op == t->op)
			return ops[k].s;
	return "token";
}

static struct node *nnew(struct comp *c, int kind, int line)
{
	struct node *n = acalloc(&c->t->ar, sizeof(*n));

	if (!n) {
		cerr(c, HP_ENOMEM, 0, "no memory");
		return NULL;
	}
	n->kind = (uint8_t)kind;
	n->line = line;
	return n;
}

/* a growing node list, copied into the arena when done */
struct nlist {
	struct node **v;
	int n, cap;
};

static int nl_add(struct comp *c, struct nlist *l, struct node *x)
{
	if (l->n == l->cap) {
		int cap = l->cap ? l->cap * 2 : 8;
		struct node **nv = aalloc(&c->t->ar, (size_t)cap * sizeof(*nv));

		if (!nv)
			return cerr(c, HP_ENOMEM, 0, "no memory");
		if (l->n)
			memcpy(nv, l->v, (size_t)l->n * sizeof(*nv));
		l->v = nv;
		l->cap = cap;
	}
	l->v[l->n++] = x;
	return 0;
}

static int expect_op(struct comp *c, int op, const char *what)
{
	if (!is_op(cur(c), op))
		return cerr(c, HP_EFORMAT, cur(c)->line, "expected '%s', got '%s'", what, describe(cur(c)));
	adv(c);
	return 0;
}

static int expect_type(struct comp *c, int type, const char *what)
{
	if (cur(c)->type != type)
		return cerr(c, HP_EFORMAT, cur(c)->line, "expected %s, got '%s'", what, describe(cur(c)));
	adv(c);
	return 0;
}

static struct node *p_expr(struct comp *c, int with_condexpr);
static struct node *p_unary(struct comp *c, int with_filter);
static struct node *p_tuple(struct comp *c, int simplified, int with_condexpr, const char *extra_end,
			    int explicit_paren);
static struct node *p_filter(struct comp *c, struct node *n, int start_inline);
static struct node *p_primary(struct comp *c);

static int enter(struct comp *c)
{
	if (++c->depth > LIM_NEST)
		return cerr(c, HP_EFORMAT, cur(c)->line, "expressions nested deeper than %d", LIM_NEST);
	return 0;
}

static struct node *mkconst(struct comp *c, struct hp_jval *v, int line)
{
	struct node *n = nnew(c, N_CONST, line);

	if (n)
		n->val = v;
	return n;
}

static int p_call_args(struct comp *c, struct node *call)
{
	struct nlist args = { 0 };
	int nkw = 0, capkw = 0, require_comma = 0, line = cur(c)->line;
	struct kwarg *kw = NULL;

	if (expect_op(c, OP_LPAREN, "("))
		return c->rc;
	while (!is_op(cur(c), OP_RPAREN)) {
		if (require_comma) {
			if (expect_op(c, OP_COMMA, ","))
				return c->rc;
			if (is_op(cur(c), OP_RPAREN))
				break;
		}
		if (is_op(cur(c), OP_MUL) || is_op(cur(c), OP_POW))
			return cerr(c, HP_EUNSUP, cur(c)->line, "*args and **kwargs in calls are not supported");
		if (cur(c)->type == T_NAME && is_op(peek(c, 1), OP_ASSIGN)) {
			const char *k = cur(c)->s;
			struct node *v;

			adv(c);
			adv(c);
			v = p_expr(c, 1);
			if (!v)
				return c->rc;
			if (nkw == capkw) {
				int cap = capkw ? capkw * 2 : 4;
				struct kwarg *nk = aalloc(&c->t->ar, (size_t)cap * sizeof(*nk));

				if (!nk)
					return cerr(c, HP_ENOMEM, 0, "no memory");
				if (nkw)
					memcpy(nk, kw, (size_t)nkw * sizeof(*nk));
				kw = nk;
				capkw = cap;
			}
			kw[nkw].name = k;
			kw[nkw++].v = v;
		} else {
			struct node *v;

			if (nkw)
				return cerr(c, HP_EFORMAT, line, "invalid syntax for function call expression");
			v = p_expr(c, 1);
			if (!v || nl_add(c, &args, v))
				return c->rc;
		}
		require_comma = 1;
	}
	adv(c);
	call->v = args.v;
	call->nv = args.n;
	call->kw = kw;
	call->nkw = nkw;
	return 0;
}

static struct node *p_subscribed(struct comp *c)
{
	int line = cur(c)->line;
	struct node *a = NULL, *b = NULL, *d = NULL, *s;

	if (is_op(cur(c), OP_COLON)) {
		adv(c);
	} else {
		a = p_expr(c, 1);
		if (!a || !is_op(cur(c), OP_COLON))
			return a;
		adv(c);
	}
	if (!is_op(cur(c), OP_COLON) && !is_op(cur(c), OP_RBRACKET) && !is_op(cur(c), OP_COMMA)) {
		b = p_expr(c, 1);
		if (!b)
			return NULL;
	}
	if (is_op(cur(c), OP_COLON)) {
		adv(c);
		if (!is_op(cur(c), OP_RBRACKET) && !is_op(cur(c), OP_COMMA)) {
			d = p_expr(c, 1);
			if (!d)
				return NULL;
		}
	}
	s = nnew(c, N_SLICE, line);
	if (s) {
		s->b = a;
		s->c = b;
		s->d = d;
	}
	return s;
}

static struct node *p_subscript(struct comp *c, struct node *x)
{
	struct tok *t = cur(c);
	struct node *n;

	adv(c);
	if (t->op == OP_DOT) {
		struct tok *a = cur(c);

		adv(c);
		if (a->type == T_NAME) {
			n = nnew(c, N_ATTR, t->line);
			if (n) {
				n->a = x;
				n->name = a->s;
			}
			return n;
		}
		if (a->type != T_INT) {
			cerr(c, HP_EFORMAT, a->line, "expected name or number");
			return NULL;
		}
		{
			struct hp_jval *v = mkval(&c->t->ar, JV_INT);

			if (!v) {
				cerr(c, HP_ENOMEM, 0, "no memory");
				return NULL;
			}
			v->i = a->i;
			n = nnew(c, N_ITEM, t->line);
			if (n) {
				n->a = x;
				n->b = mkconst(c, v, t->line);
				if (!n->b)
					return NULL;
			}
			return n;
		}
	}
	{
		struct nlist args = { 0 };

		while (!is_op(cur(c), OP_RBRACKET)) {
			struct node *s;

			if (args.n && expect_op(c, OP_COMMA, ","))
				return NULL;
			s = p_subscribed(c);
			if (!s || nl_add(c, &args, s))
				return NULL;
		}
		adv(c);
		if (!args.n) {
			cerr(c, HP_EFORMAT, t->line, "expected an expression in []");
			return NULL;
		}
		n = nnew(c, N_ITEM, t->line);
		if (!n)
			return NULL;
		n->a = x;
		if (args.n == 1) {
			n->b = args.v[0];
		} else {
			struct node *tu = nnew(c, N_TUPLE, t->line);

			/* x[a:b, c]: a tuple holding a slice object, which no chat
			 * template needs (Python indexes no str, list or dict by it) */
			for (int k = 0; k < args.n; k++)
				if (args.v[k]->kind == N_SLICE) {
					cerr(c, HP_EUNSUP, t->line, "a slice inside a subscript tuple is not supported");
					return NULL;
				}
			if (!tu)
				return NULL;
			tu->v = args.v;
			tu->nv = args.n;
			n->b = tu;
		}
		if (n->b->kind == N_SLICE) {
			n->kind = N_SLICE;
			n->b->a = x;
			return n->b;
		}
		return n;
	}
}

/* fn(args...) */
static struct node *p_call(struct comp *c, struct node *fn)
{
	struct node *call = nnew(c, N_CALL, cur(c)->line);

	if (!call)
		return NULL;
	call->a = fn;
	return p_call_args(c, call) ? NULL : call;
}

static struct node *p_test(struct comp *c, struct node *x);

/*
 * What follows an operand n: subscripts and calls (jinja2's parse_postfix),
 * or with filters, filters, tests and calls (parse_filter_expr).
 */
static struct node *p_postfix(struct comp *c, struct node *n, int filters)
{
	while (n) {
		if (!filters && (is_op(cur(c), OP_DOT) || is_op(cur(c), OP_LBRACKET)))
			n = p_subscript(c, n);
		else if (filters && is_op(cur(c), OP_PIPE))
			n = p_filter(c, n, 0);
		else if (filters && is_name(cur(c), "is"))
			n = p_test(c, n);
		else if (is_op(cur(c), OP_LPAREN))
			n = p_call(c, n);
		else
			break;
	}
	return n;
}

/*
 * The name after `is` or `|`: a node of kind N_TEST or N_FILTER applying it
 * to x, its id -1 when unknown (check_soft decides); a filter jinja2 has and
 * this interpreter lacks is refused here.
 */
static struct node *p_named(struct comp *c, int kind, int line, struct node *x)
{
	const char *what = kind == N_TEST ? "test" : "filter", *name;
	struct node *n;
	int id;

	if (cur(c)->type != T_NAME) {
		cerr(c, HP_EFORMAT, cur(c)->line, "expected a %s name, got '%s'", what, describe(cur(c)));
		return NULL;
	}
	name = cur(c)->s;
	adv(c);
	if (is_op(cur(c), OP_DOT)) {
		cerr(c, HP_EUNSUP, line, "dotted %s names are not supported", what);
		return NULL;
	}
	id = kind == N_TEST ? name_index(test_names, X_N, name) : name_index(filter_names, F_N, name);
	for (int i = 0; kind == N_FILTER && id < 0 && filter_unsup[i]; i++)
		if (!strcmp(filter_unsup[i], name)) {
			cerr(c, HP_EUNSUP, line, "filter '%s' is not supported", name);
			return NULL;
		}
	n = nnew(c, kind, line);
	if (!n)
		return NULL;
	n->a = x;
	n->name = name;
	n->id = id;
	return n;
}

static struct node *p_test(struct comp *c, struct node *x)
{
	int line = cur(c)->line, neg = 0;
	struct node *n;

	adv(c);   /* is */
	if (is_name(cur(c), "not")) {
		neg = 1;
		adv(c);
	}
	n = p_named(c, N_TEST, line, x);
	if (!n)
		return NULL;
	if (is_op(cur(c), OP_LPAREN)) {
		if (p_call_args(c, n))
			return NULL;
	} else {
		struct tok *t = cur(c);

		if ((t->type == T_NAME || t->type == T_STRING || t->type == T_INT || t->type == T_FLOAT ||
		     is_op(t, OP_LPAREN) || is_op(t, OP_LBRACKET) || is_op(t, OP_LBRACE)) &&
		    !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
			struct node *arg;

			if (is_name(t, "is")) {
				cerr(c, HP_EFORMAT, line, "you cannot chain multiple tests with is");
				return NULL;
			}
			arg = p_postfix(c, p_primary(c), 0);
			if (!arg)
				return NULL;
			n->v = aalloc(&c->t->ar, sizeof(*n->v));
			if (!n->v) {
				cerr(c, HP_ENOMEM, 0, "no memory");
				return NULL;
			}
			n->v[0] = arg;
			n->nv = 1;
		}
	}
	if (neg) {
		struct node *m = nnew(c, N_NOT, line);

		if (m)
			m->a = n;
		return m;
	}
	return n;
}

static struct node *p_filter(struct comp *c, struct node *x, int start_inline)
{
	while (is_op(cur(c), OP_PIPE) || start_inline) {
		struct node *n;

		if (!start_inline)
			adv(c);
		start_inline = 0;
		n = p_named(c, N_FILTER, cur(c)->line, x);
		if (!n || (is_op(cur(c), OP_LPAREN) && p_call_args(c, n)))
			return NULL;
		x = n;
	}
	return x;
}

static struct node *p_primary(struct comp *c)
{
	struct tok *t = cur(c);
	struct node *n = NULL;

	if (enter(c))
		return NULL;
	if (t->type == T_NAME) {
		if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) {
			n = mkconst(c, &v_true, t->line);
		} else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) {
			n = mkconst(c, &v_false, t->line);
		} else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
			n = mkconst(c, &v_none, t->line);
		} else {
			n = nnew(c, N_NAME, t->line);
			if (n)
				n->name = t->s;
			if (c->macro_depth && !strcmp(t->s, "varargs"))
				c->uses_varargs = 1;
			if (c->macro_depth && !strcmp(t->s, "kwargs"))
				c->uses_kwargs = 1;
			if (c->macro_depth && !strcmp(t->s, "caller")) {
				cerr(c, HP_EUNSUP, t->line, "'caller' ({%% call %%} blocks) is not supported");
				return NULL;
			}
		}
		adv(c);
	} else if (t->type == T_STRING) {
		size_t len = 0, k = 0;
		char *s;
		struct hp_jval *v;

		for (size_t i = c->p; c->tk[i].type == T_STRING; i++)
			len += c->tk[i].n;
		s = aalloc(&c->t->ar, len + 1);
		if (!s) {
			cerr(c, HP_ENOMEM, 0, "no memory");
			return NULL;
		}
		while (cur(c)->type == T_STRING) {
			memcpy(s + k, cur(c)->s, cur(c)->n);
			k += cur(c)->n;
			adv(c);
		}
		s[k] = '\0';
		v = mkstr_raw(&c->t->ar, s, k, NULL, 0);
		if (!v) {
			cerr(c, HP_ENOMEM, 0, "no memory");
			return NULL;
		}
		n = mkconst(c, v, t->line);
	} else if (t->type == T_INT || t->type == T_FLOAT) {
		struct hp_jval *v = mkval(&c->t->ar, t->type == T_INT ? JV_INT : JV_FLOAT);

		if (!v) {
			cerr(c, HP_ENOMEM, 0, "no memory");
			return NULL;
		}
		if (t->type == T_INT)
			v->i = t->i;
		else
			v->f = t->f;
		adv(c);
		n = mkconst(c, v, t->line);
	} else if (is_op(t, OP_LPAREN)) {
		adv(c);
		n = p_tuple(c, 0, 1, NULL, 1);
		if (n && expect_op(c, OP_RPAREN, ")"))
			n = NULL;
	} else if (is_op(t, OP_LBRACKET) || is_op(t, OP_LBRACE)) {
		int dict = is_op(t, OP_LBRACE);
		struct nlist items = { 0 };

		adv(c);
		while (!is_op(cur(c), dict ? OP_RBRACE : OP_RBRACKET)) {
			struct node *x;

			if (items.n && expect_op(c, OP_COMMA, ","))
				return NULL;
			if (is_op(cur(c), dict ? OP_RBRACE : OP_RBRACKET))
				break;
			x = p_expr(c, 1);
			if (!x || nl_add(c, &items, x))
				return NULL;
			if (dict) {
				if (expect_op(c, OP_COLON, ":"))
					return NULL;
				x = p_expr(c, 1);
				if (!x || nl_add(c, &items, x))
					return NULL;
			}
		}
		adv(c);
		n = nnew(c, dict ? N_DICT : N_LIST, t->line);
		if (n) {
			n->v = items.v;
			n->nv = items.n;
		}
	} else {
		cerr(c, HP_EFORMAT, t->line, "unexpected '%s'", describe(t));
	}
	c->depth--;
	return n;
}

static struct node *p_unary(struct comp *c, int with_filter)
{
	struct tok *t = cur(c);
	struct node *n;

	if (enter(c))
		return NULL;
	if (is_op(t, OP_SUB) || is_op(t, OP_ADD)) {
		adv(c);
		n = nnew(c, is_op(t, OP_SUB) ? N_NEG : N_POS, t->line);
		if (!n)
			return NULL;
		n->a = p_unary(c, 0);
		if (!n->a)
			return NULL;
	} else {
		n = p_primary(c);
	}
	n = p_postfix(c, n, 0);
	if (with_filter)
		n = p_postfix(c, n, 1);
	c->depth--;
	return n;
}

/*
 * A level of left-associative binary operators, `a op b op c` parsed as
 * `(a op b) op c`: its operator is a keyword (and, or: nodes N_AND, N_OR) or
 * one of a few operator tokens (N_BIN), and its operands are parsed by the
 * next tighter level, or by operand where there is none.
 */
struct binlevel {
	uint8_t kind;
	const char *word;
	uint8_t ops[4];   /* 0 ends the list */
	const struct binlevel *next;
	struct node *(*operand)(struct comp *c);
};

static struct node *p_unary_filtered(struct comp *c)
{
	return p_unary(c, 1);
}

static struct node *p_concat(struct comp *c);
static struct node *p_not(struct comp *c);

/* tightest first: **; * / // %; then ~ (p_concat); + -; then comparisons and not (p_compare, p_not); and; or */
static const struct binlevel lv_pow = { N_BIN, NULL, { OP_POW }, NULL, p_unary_filtered };
static const struct binlevel lv_mul = { N_BIN, NULL, { OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD }, &lv_pow, NULL };
static const struct binlevel lv_add = { N_BIN, NULL, { OP_ADD, OP_SUB }, NULL, p_concat };
static const struct binlevel lv_and = { N_AND, "and", { 0 }, NULL, p_not };
static const struct binlevel lv_or = { N_OR, "or", { 0 }, &lv_and, NULL };

static int at_binop(struct comp *c, const struct binlevel *lv)
{
	if (lv->word)
		return is_name(cur(c), lv->word);
	for (int k = 0; k < (int)sizeof(lv->ops) && lv->ops[k]; k++)
		if (is_op(cur(c), lv->ops[k]))
			return 1;
	return 0;
}

static struct node *p_binary(struct comp *c, const struct binlevel *lv)
{
	struct node *l = lv->next ? p_binary(c, lv->next) : lv->operand(c);

	while (l && at_binop(c, lv)) {
		struct node *n = nnew(c, lv->kind, cur(c)->line);

		if (!n)
			return NULL;
		if (!lv->word)
			n->op = (uint8_t)cur(c)->op;
		adv(c);
		n->a = l;
		n->b = lv->next ? p_binary(c, lv->next) : lv->operand(c);
		l = n->b ? n : NULL;
	}
	return l;
}

static struct node *p_concat(struct comp *c)
{
	struct node *first = p_binary(c, &lv_mul), *n;
	struct nlist args = { 0 };

	if (!first || !is_op(cur(c), OP_TILDE))
		return first;
	n = nnew(c, N_CONCAT, cur(c)->line);
	if (!n || nl_add(c, &args, first))
		return NULL;
	while (is_op(cur(c), OP_TILDE)) {
		struct node *x;

		adv(c);
		x = p_binary(c, &lv_mul);
		if (!x || nl_add(c, &args, x))
			return NULL;
	}
	n->v = args.v;
	n->nv = args.n;
	return n;
}

static struct node *p_compare(struct comp *c)
{
	int line = cur(c)->line;
	struct node *x = p_binary(c, &lv_add), *n;
	struct nlist args = { 0 };
	uint8_t opsbuf[64];
	int nops = 0;

	if (!x)
		return NULL;
	for (;;) {
		struct tok *t = cur(c);
		int op;
		struct node *y;

		if (t->type == T_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == OP_LT ||
					t->op == OP_LE || t->op == OP_GT || t->op == OP_GE)) {
			op = t->op;
			adv(c);
		} else if (is_name(t, "in")) {
			op = OP_IN;
			adv(c);
		} else if (is_name(t, "not") && is_name(peek(c, 1), "in")) {
			op = OP_NOTIN;
			adv(c);
			adv(c);
		} else {
			break;
		}
		if (nops == (int)sizeof(opsbuf)) {
			cerr(c, HP_EUNSUP, line, "more than %d chained comparisons", (int)sizeof(opsbuf));
			return NULL;
		}
		y = p_binary(c, &lv_add);
		if (!y)
			return NULL;
		if (!nops && nl_add(c, &args, x))
			return NULL;
		if (nl_add(c, &args, y))
			return NULL;
		opsbuf[nops++] = (uint8_t)op;
	}
	if (!nops)
		return x;
	n = nnew(c, N_CMP, line);
	if (!n)
		return NULL;
	n->v = args.v;
	n->nv = args.n;
	n->ops = aalloc(&c->t->ar, (size_t)nops);
	if (!n->ops) {
		cerr(c, HP_ENOMEM, 0, "no memory");
		return NULL;
	}
	memcpy(n->ops, opsbuf, (size_t)nops);
	return n;
}

static struct node *p_not(struct comp *c)
{
	if (is_name(cur(c), "not")) {
		struct node *n = nnew(c, N_NOT, cur(c)->line);

		adv(c);
		if (!n || enter(c))
			return NULL;
		n->a = p_not(c);
		c->depth--;
		return n->a ? n : NULL;
	}
	return p_compare(c);
}

static struct node *p_condexpr(struct comp *c)
{
	struct node *x = p_binary(c, &lv_or);

	while (x && is_name(cur(c), "if")) {
		struct node *n = nnew(c, N_COND, cur(c)->line);

		adv(c);
		if (!n || enter(c))
			return NULL;
		n->b = x;
		n->a = p_binary(c, &lv_or);
		if (!n->a)
			return NULL;
		if (is_name(cur(c), "else")) {
			adv(c);
			n->c = p_condexpr(c);
			if (!n->c)
				return NULL;
		}
		c->depth--;
		x = n;
	}
	return x;
}

static struct node *p_expr(struct comp *c, int with_condexpr)
{
	struct node *n;

	if (enter(c))
		return NULL;
	n = with_condexpr ? p_condexpr(c) : p_binary(c, &lv_or);
	c->depth--;
	return n;
}

static int tuple_end(struct comp *c, const char *extra_end)
{
	struct tok *t = cur(c);

	return t->type == T_VEND || t->type == T_BEND || is_op(t, OP_RPAREN) ||
	       (extra_end && is_name(t, extra_end));
}

static struct node *p_tuple(struct comp *c, int simplified, int with_condexpr, const char *extra_end,
			    int explicit_paren)
{
	int line = cur(c)->line, is_tuple = 0;
	struct nlist args = { 0 };
	struct node *n;

	for (;;) {
		struct node *x;

		if (args.n && expect_op(c, OP_COMMA, ","))
			return NULL;
		if (tuple_end(c, extra_end))
			break;
		x = simplified ? p_primary(c) : p_expr(c, with_condexpr);
		if (!x || nl_add(c, &args, x))
			return NULL;
		if (is_op(cur(c), OP_COMMA))
			is_tuple = 1;
		else
			break;
	}
	if (!is_tuple) {
		if (args.n)
			return args.v[0];
		if (!explicit_paren) {
			cerr(c, HP_EFORMAT, cur(c)->line, "expected an expression, got '%s'", describe(cur(c)));
			return NULL;
		}
	}
	n = nnew(c, N_TUPLE, line);
	if (n) {
		n->v = args.v;
		n->nv = args.n;
	}
	return n;
}

/* --- statements ------------------------------------------------------------- */
static struct node *p_body(struct comp *c, const char *const *ends, int loop, const char **which);

static int check_target(struct comp *c, struct node *t)
{
	if (t->kind == N_NAME) {
		if (!strcmp(t->name, "true") || !strcmp(t->name, "false") || !strcmp(t->name, "none"))
			return cerr(c, HP_EFORMAT, t->line, "can't assign to '%s'", t->name);
		return 0;
	}
	if (t->kind == N_TUPLE) {
		for (int i = 0; i < t->nv; i++)
			if (check_target(c, t->v[i]))
				return c->rc;
		return 0;
	}
	return cerr(c, HP_EFORMAT, t->line, "can't assign to this expression");
}

static struct node *p_target(struct comp *c, const char *extra_end, int with_ns)
{
	struct node *t;

	if (with_ns && cur(c)->type == T_NAME && is_op(peek(c, 1), OP_DOT)) {
		struct node *base = nnew(c, N_NAME, cur(c)->line);

		if (!base)
			return NULL;
		base->name = cur(c)->s;
		adv(c);
		adv(c);
		if (cur(c)->type != T_NAME) {
			cerr(c, HP_EFORMAT, cur(c)->line, "expected a name after '.'");
			return NULL;
		}
		t = nnew(c, N_ATTR, cur(c)->line);
		if (!t)
			return NULL;
		t->a = base;
		t->name = cur(c)->s;
		t->fl = NF_NSREF;
		adv(c);
		return t;
	}
	t = p_tuple(c, 1, 1, extra_end, 0);
	if (!t || check_target(c, t))
		return NULL;
	return t;
}

static int end_block(struct comp *c)
{
	return expect_type(c, T_BEND, "end of statement block");
}

static struct node *p_statement(struct comp *c, int loop)
{
	struct tok *t = cur(c);
	int line = t->line;
	struct node *n;
	const char *which;

	if (t->type != T_NAME) {
		cerr(c, HP_EFORMAT, line, "tag name expected");
		return NULL;
	}
	adv(c);
	if (!strcmp(t->s, "if")) {
		static const char *const ends[] = { "elif", "else", "endif", NULL };
		struct node *top = nnew(c, S_IF, line), *x = top;

		if (!top)
			return NULL;
		for (;;) {
			x->a = p_tuple(c, 0, 0, NULL, 0);
			if (!x->a || end_block(c))
				return NULL;
			x->d = p_body(c, ends, loop, &which);
			if (!x->d)
				return NULL;
			if (!strcmp(which, "elif")) {
				struct node *y = nnew(c, S_IF, cur(c)->line);

				if (!y)
					return NULL;
				x->e = y;
				x = y;
				continue;
			}
			if (!strcmp(which, "else")) {
				static const char *const ends2[] = { "endif", NULL };

				if (end_block(c))
					return NULL;
				x->e = p_body(c, ends2, loop, &which);
				if (!x->e)
					return NULL;
			}
			break;
		}
		return end_block(c) ? NULL : top;
	}
	if (!strcmp(t->s, "for")) {
		static const char *const ends[] = { "endfor", "else", NULL };
		static const char *const ends2[] = { "endfor", NULL };

		n = nnew(c, S_FOR, line);
		if (!n)
			return NULL;
		n->a = p_target(c, "in", 0);
		if (!n->a)
			return NULL;
		if (!is_name(cur(c), "in")) {
			cerr(c, HP_EFORMAT, cur(c)->line, "expected 'in', got '%s'", describe(cur(c)));
			return NULL;
		}
		adv(c);
		n->b = p_tuple(c, 0, 0, "recursive", 0);
		if (!n->b)
			return NULL;
		if (is_name(cur(c), "if")) {
			adv(c);
			n->c = p_expr(c, 1);
			if (!n->c)
				return NULL;
		}
		if (is_name(cur(c), "recursive")) {
			cerr(c, HP_EUNSUP, cur(c)->line, "recursive for loops are not supported");
			return NULL;
		}
		if (end_block(c))
			return NULL;
		n->d = p_body(c, ends, 1, &which);
		if (!n->d)
			return NULL;
		if (!strcmp(which, "else")) {
			if (end_block(c))
				return NULL;
			n->e = p_body(c, ends2, loop, &which);
			if (!n->e)
				return NULL;
		}
		return end_block(c) ? NULL : n;
	}
	if (!strcmp(t->s, "set")) {
		struct node *target = p_target(c, NULL, 1);

		if (!target)
			return NULL;
		if (is_op(cur(c), OP_ASSIGN)) {
			adv(c);
			n = nnew(c, S_SET, line);
			if (!n)
				return NULL;
			n->a = target;
			n->b = p_tuple(c, 0, 1, NULL, 0);
			if (!n->b || end_block(c))
				return NULL;
			return n;
		}
		{
			static const char *const ends[] = { "endset", NULL };
			struct node *ph = nnew(c, N_BODYVAL, line);

			n = nnew(c, S_SETBLOCK, line);
			if (!n || !ph)
				return NULL;
			if (target->kind != N_NAME && !(target->fl & NF_NSREF)) {
				cerr(c, HP_EFORMAT, line, "a block set needs a single name");
				return NULL;
			}
			n->a = target;
			n->b = p_filter(c, ph, 0);
			if (!n->b || end_block(c))
				return NULL;
			n->d = p_body(c, ends, loop, &which);
			if (!n->d || end_block(c))
				return NULL;
			return n;
		}
	}
	if (!strcmp(t->s, "macro")) {
		static const char *const ends[] = { "endmacro", NULL };
		struct nlist params = { 0 }, defs = { 0 };
		int sv = c->uses_varargs, sk = c->uses_kwargs;

		n = nnew(c, S_MACRO, line);
		if (!n)
			return NULL;
		if (cur(c)->type != T_NAME) {
			cerr(c, HP_EFORMAT, cur(c)->line, "expected a macro name");
			return NULL;
		}
		n->name = cur(c)->s;
		adv(c);
		if (expect_op(c, OP_LPAREN, "("))
			return NULL;
		while (!is_op(cur(c), OP_RPAREN)) {
			struct node *p, *d = NULL;

			if (params.n && expect_op(c, OP_COMMA, ","))
				return NULL;
			if (cur(c)->type != T_NAME) {
				cerr(c, HP_EFORMAT, cur(c)->line, "expected a parameter name, got '%s'",
				     describe(cur(c)));
				return NULL;
			}
			p = nnew(c, N_NAME, cur(c)->line);
			if (!p)
				return NULL;
			p->name = cur(c)->s;
			adv(c);
			if (is_op(cur(c), OP_ASSIGN)) {
				adv(c);
				d = p_expr(c, 1);
				if (!d)
					return NULL;
			} else if (defs.n && defs.v[defs.n - 1]) {
				cerr(c, HP_EFORMAT, p->line, "non-default argument follows default argument");
				return NULL;
			}
			if (nl_add(c, &params, p) || nl_add(c, &defs, d))
				return NULL;
		}
		adv(c);
		if (end_block(c))
			return NULL;
		c->macro_depth++;
		c->uses_varargs = c->uses_kwargs = 0;
		n->d = p_body(c, ends, 0, &which);
		c->macro_depth--;
		if (!n->d)
			return NULL;
		if (c->uses_varargs)
			n->fl |= NF_VARARGS;
		if (c->uses_kwargs)
			n->fl |= NF_KWARGS;
		c->uses_varargs = sv;
		c->uses_kwargs = sk;
		n->v = params.v;
		n->v2 = defs.v;
		n->nv = params.n;
		return end_block(c) ? NULL : n;
	}
	if (!strcmp(t->s, "generation")) {
		static const char *const ends[] = { "endgeneration", NULL };

		n = nnew(c, S_GEN, line);
		if (!n || end_block(c))
			return NULL;
		c->t->has_gen = 1;
		n->d = p_body(c, ends, loop, &which);
		return !n->d || end_block(c) ? NULL : n;
	}
	if (!strcmp(t->s, "filter")) {
		static const char *const ends[] = { "endfilter", NULL };
		struct node *ph = nnew(c, N_BODYVAL, line);

		n = nnew(c, S_FILTER, line);
		if (!n || !ph)
			return NULL;
		n->b = p_filter(c, ph, 1);
		if (!n->b || end_block(c))
			return NULL;
		n->d = p_body(c, ends, loop, &which);
		return !n->d || end_block(c) ? NULL : n;
	}
	if (!strcmp(t->s, "break") || !strcmp(t->s, "continue")) {
		if (!loop) {
			cerr(c, HP_EFORMAT, line, "'%s' outside of a loop", t->s);
			return NULL;
		}
		n = nnew(c, t->s[0] == 'b' ? S_BREAK : S_CONT, line);
		return !n || end_block(c) ? NULL : n;
	}
	{
		static const char *const unsup[] = { "block", "extends", "include", "import", "from",
						      "call", "with", "autoescape", "print", NULL };

		for (int i = 0; unsup[i]; i++)
			if (!strcmp(t->s, unsup[i])) {
				cerr(c, HP_EUNSUP, line, "the '%s' tag is not supported", t->s);
				return NULL;
			}
	}
	cerr(c, HP_EFORMAT, line, "encountered unknown tag '%s'", t->s);
	return NULL;
}

/*
 * Statements up to a {% NAME %} with NAME in ends (NULL: up to the end of
 * the template).  On return the current token is what follows NAME, and
 * *which is NAME.
 */
static struct node *p_body(struct comp *c, const char *const *ends, int loop, const char **which)
{
	struct nlist st = { 0 };
	struct node *body = nnew(c, S_BODY, cur(c)->line);

	if (!body || enter(c))
		return NULL;
	for (;;) {
		struct tok *t = cur(c);
		struct node *n = NULL;

		if (t->type == T_EOF) {
			if (ends) {
				cerr(c, HP_EFORMAT, t->line, "unexpected end of template, expected '%s'",
				     ends[0]);
				return NULL;
			}
			break;
		}
		if (t->type == T_DATA) {
			struct hp_jval *v = mkstr_raw(&c->t->ar, t->s, t->n, NULL, 0);

			adv(c);
			if (!v) {
				cerr(c, HP_ENOMEM, 0, "no memory");
				return NULL;
			}
			n = nnew(c, S_DATA, t->line);
			if (n)
				n->val = v;
		} else if (t->type == T_VBEGIN) {
			adv(c);
			n = nnew(c, S_OUT, t->line);
			if (!n)
				return NULL;
			n->a = p_tuple(c, 0, 1, NULL, 0);
			if (!n->a || expect_type(c, T_VEND, "end of print statement"))
				return NULL;
		} else if (t->type == T_BBEGIN) {
			struct tok *nm = peek(c, 1);
			int e = -1;

			for (int i = 0; nm->type == T_NAME && ends && ends[i] && e < 0; i++)
				if (!strcmp(nm->s, ends[i]))
					e = i;
			adv(c);
			if (e >= 0) {
				adv(c);
				*which = ends[e];
				break;
			}
			n = p_statement(c, loop);
		} else {
			cerr(c, HP_EFORMAT, t->line, "unexpected '%s'", describe(t));
			return NULL;
		}
		if (!n || nl_add(c, &st, n))
			return NULL;
	}
	body->v = st.v;
	body->nv = st.n;
	c->depth--;
	return body;
}

/*
 * jinja2 reports an unknown filter or test at compile time, except inside an
 * if statement or a conditional expression (a "soft frame"), where it fails
 * only when reached; loops, macros and block sets start a frame of their own.
 */
static int check_soft(struct comp *c, const struct node *n, int soft)
{
	int in = 0, body = 0;

	if (!n)
		return 0;
	if ((n->kind == N_FILTER || n->kind == N_TEST) && n->id < 0 && !soft)
		return cerr(c, HP_EFORMAT, n->line, "no %s named '%s'", n->kind == N_FILTER ? "filter" : "test",
			    n->name);
	switch (n->kind) {
	case S_IF:
	case N_COND:
		in = body = 1;
		break;
	case S_FOR:
		in = soft;
		if (check_soft(c, n->b, soft))
			return c->rc;
		return check_soft(c, n->a, 0) || check_soft(c, n->c, 0) || check_soft(c, n->d, 0) ||
		       check_soft(c, n->e, 0) ? c->rc : 0;
	case S_MACRO:
	case S_SETBLOCK:
	case S_FILTER:
	case S_GEN:
		in = soft;
		body = 0;
		break;
	default:
		in = body = soft;
	}
	if (check_soft(c, n->a, in) || check_soft(c, n->b, in) || check_soft(c, n->c, in) ||
	    check_soft(c, n->d, body) || check_soft(c, n->e, body))
		return c->rc;
	for (int i = 0; i < n->nv; i++)
		if ((n->v && check_soft(c, n->v[i], in)) || (n->v2 && check_soft(c, n->v2[i], in)))
			return c->rc;
	for (int i = 0; i < n->nkw; i++)
		if (check_soft(c, n->kw[i].v, in))
			return c->rc;
	return 0;
}

int hp_jinja_compile(struct hp_jinja **tp, const char *src, size_t len, const char *name,
		     struct hp_err *e)
{
	struct hp_jinja *t;
	struct comp c;
	char *s;
	size_t k = 0;
	const char *which;

	*tp = NULL;
	t = hp_calloc(1, sizeof(*t));
	if (!t)
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory compiling the template",
				  name ? name : "template");
	t->name = hp_strdup(name ? name : "template");
	if (!t->name) {
		hp_free(t);
		return hp_err_set(e, HP_ENOMEM, "'%s': out of memory compiling the template",
				  name ? name : "template");
	}
	memset(&c, 0, sizeof(c));
	c.t = t;
	c.e = e;
	s = aalloc(&t->ar, len + 1);
	if (!s) {
		cerr(&c, HP_ENOMEM, 0, "no memory");
		goto fail;
	}
	/* lexer.py: \r\n, \r and \n all become \n; one trailing newline goes */
	for (size_t i = 0; i < len; i++) {
		if (src[i] == '\r') {
			s[k++] = '\n';
			if (i + 1 < len && src[i + 1] == '\n')
				i++;
		} else {
			s[k++] = src[i];
		}
	}
	if (k && s[k - 1] == '\n')
		k--;
	s[k] = '\0';
	c.src = s;
	c.n = k;
	if (hp_utf8_valid_prefix(s, k) != k) {
		cerr(&c, HP_EFORMAT, 1 + count_nl(s, hp_utf8_valid_prefix(s, k)), "invalid UTF-8 in the template");
		goto fail;
	}
	if (lex(&c))
		goto fail;
	t->root = p_body(&c, NULL, 0, &which);
	if (!t->root || check_soft(&c, t->root, 0))
		goto fail;
	*tp = t;
	return 0;
fail:
	if (!c.rc)
		cerr(&c, HP_ENOMEM, 0, "no memory");
	hp_jinja_free(t);
	return c.rc;
}

void hp_jinja_free(struct hp_jinja *t)
{
	if (!t)
		return;
	arena_free(&t->ar);
	hp_free(t->name);
	hp_free(t);
}

int hp_jinja_has_generation(const struct hp_jinja *t)
{
	return t && t->has_gen;
}

/* --- render state ------------------------------------------------------------ */
struct frame {
	struct frame *up;
	const char **names;
	struct hp_jval **vals;
	int n, cap;
	int captured;   /* a macro closes over it: a loop may not reuse it */
};

struct jloop {
	size_t i, n;
	struct hp_jval *items;   /* the list iterated */
	struct hp_jval *changed; /* the last value given to loop.changed(), NULL before */
};

struct rs {
	const struct hp_jinja *t;
	struct jarena ar;
	struct hp_jval *vars;
	struct hp_err *e;
	int line;
	int rc;
	int mdepth;
	long iters;
	size_t outbytes;
	struct sbuf top;
	struct sbuf *out;
	int gen;
	size_t lim_output;
	long lim_iters;
};

static void *rerr(struct rs *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void *rerr(struct rs *r, const char *fmt, ...)
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

static void *room(struct rs *r)
{
	if (r->rc)
		return NULL;
	if (r->ar.over)
		return rerr(r, "the render needs more than %zu MiB of memory (limit)", r->ar.limit >> 20);
	r->rc = HP_ENOMEM;
	hp_err_set(r->e, HP_ENOMEM, "'%s' line %d: out of memory rendering the template",
		   r->t->name, r->line);
	return NULL;
}

/* count n more loop iterations or range() items: -1 with the error past the limit */
static int count_iters(struct rs *r, long n)
{
	r->iters += n;
	if (r->iters <= r->lim_iters)
		return 0;
	rerr(r, "more than %ld loop iterations and range() items (limit)", r->lim_iters);
	return -1;
}

/* the render-state allocators: the arena's, with the error when they fail (p NULL) */
static void *got(struct rs *r, void *p)
{
	return p ? p : room(r);
}

static void *ral(struct rs *r, size_t n)
{
	return got(r, aalloc(&r->ar, n));
}

static struct hp_jval *mk(struct rs *r, int type)
{
	return got(r, mkval(&r->ar, type));
}

static struct hp_jval *mkint(struct rs *r, int64_t i)
{
	return got(r, mkival(&r->ar, JV_INT, i));
}

static struct hp_jval *mkfloat(struct rs *r, double f)
{
	return got(r, mkfval(&r->ar, f));
}

static struct hp_jval *mkstrc(struct rs *r, const char *s, size_t n)
{
	return got(r, mkstr_copy(&r->ar, s, n, NULL, 0));
}

static struct hp_jval *sub(struct rs *r, const struct hp_jval *v, size_t off, size_t len)
{
	if (off == 0 && len == v->s.len)
		return (struct hp_jval *)v;
	return got(r, substr(&r->ar, v, off, len));
}

static struct hp_jval *mklist(struct rs *r, size_t cap, int flags)
{
	struct hp_jval *l = mk(r, JV_LIST);

	if (!l)
		return NULL;
	l->flags = (uint8_t)flags;
	if (cap) {
		l->l.v = ral(r, cap * sizeof(*l->l.v));
		if (!l->l.v)
			return NULL;
		l->l.cap = cap;
	}
	return l;
}

static int push(struct rs *r, struct hp_jval *l, struct hp_jval *v)
{
	if (list_push(&r->ar, l, v)) {
		room(r);
		return -1;
	}
	return 0;
}

static struct hp_jval *mkundef(struct rs *r, int why, const char *name, size_t nlen, const char *what)
{
	struct hp_jval *u = mk(r, JV_UNDEF);

	if (u) {
		u->aux = (uint32_t)why;
		u->u.name = name;
		u->u.nlen = nlen;
		u->u.what = what;
	}
	return u;
}

static struct sbuf sb_new(struct rs *r)
{
	struct sbuf b;

	memset(&b, 0, sizeof(b));
	b.a = &r->ar;
	return b;
}

static struct hp_jval *sb_fin(struct rs *r, struct sbuf *b)
{
	return got(r, sb_done(b));
}

static const char *type_name(const struct hp_jval *v)
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
static void *undef_err(struct rs *r, const struct hp_jval *u)
{
	int n = (int)(u->u.nlen > 200 ? 200 : u->u.nlen);

	switch (u->aux) {
	case UN_NAME:
		return rerr(r, "'%.*s' is undefined", n, u->u.name);
	case UN_ATTR:
		return rerr(r, "'%s object' has no attribute '%.*s'", u->u.what, n, u->u.name);
	case UN_ITEM:
		return rerr(r, "'%s object' has no element %.*s", u->u.what, n, u->u.name);
	case UN_UNSAFE:
		return rerr(r, "access to attribute '%.*s' of '%s' object is unsafe", n, u->u.name,
			    u->u.what);
	}
	return rerr(r, "%s", n ? u->u.name : "undefined value");
}

static int truthy(const struct hp_jval *v)
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

static int isnum(const struct hp_jval *v)
{
	return v->type == JV_BOOL || v->type == JV_INT || v->type == JV_FLOAT;
}

static double numf(const struct hp_jval *v)
{
	return v->type == JV_FLOAT ? v->f : (double)v->i;
}

/* Python ==, for every pair of types */
static int py_eq(const struct hp_jval *a, const struct hp_jval *b)
{
	if (isnum(a) && isnum(b)) {
		if (a->type == JV_FLOAT || b->type == JV_FLOAT)
			return numf(a) == numf(b);
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
			if (!py_eq(a->l.v[i], b->l.v[i]))
				return 0;
		return 1;
	case JV_DICT:
		if (a->d.n != b->d.n)
			return 0;
		for (size_t i = 0; i < a->d.n; i++) {
			size_t j;

			for (j = 0; j < b->d.n; j++)
				if (py_eq(a->d.e[i].k, b->d.e[j].k))
					break;
			if (j == b->d.n || !py_eq(a->d.e[i].v, b->d.e[j].v))
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
static int py_cmp(struct rs *r, const struct hp_jval *a, const struct hp_jval *b, int *res)
{
	if (a->type == JV_UNDEF || b->type == JV_UNDEF) {
		undef_err(r, a->type == JV_UNDEF ? a : b);
		return -1;
	}
	if (isnum(a) && isnum(b)) {
		if (a->type == JV_FLOAT || b->type == JV_FLOAT) {
			double x = numf(a), y = numf(b);

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
			if (py_eq(a->l.v[i], b->l.v[i]))
				continue;
			return py_cmp(r, a->l.v[i], b->l.v[i], res);
		}
		*res = a->l.n < b->l.n ? -1 : a->l.n > b->l.n;
		return 0;
	}
	rerr(r, "'<' not supported between instances of '%s' and '%s'", type_name(a), type_name(b));
	return -1;
}

/* --- str() and repr() ------------------------------------------------------ */
static int put_repr(struct rs *r, struct sbuf *b, const struct hp_jval *v, int depth);

static int put_str_repr(struct sbuf *b, const struct hp_jval *v)
{
	const char *s = v->s.s;
	size_t n = v->s.len, i = 0;
	int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
	char q = has_sq && !has_dq ? '"' : '\'';
	uint16_t t0 = n && v->s.tag ? v->s.tag[0] : v->btag;
	uint16_t t1 = n && v->s.tag ? v->s.tag[n - 1] : v->btag;

	sb_ch(b, q, t0);
	while (i < n) {
		size_t st = i;
		uint32_t c = u8dec(s, n, &i);
		uint16_t tg = v->s.tag ? v->s.tag[st] : 0;
		char esc[16];

		if (c == (uint32_t)q || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			sb_put(b, esc, 2, NULL, tg);
		} else if (c == '\n') {
			sb_put(b, "\\n", 2, NULL, tg);
		} else if (c == '\r') {
			sb_put(b, "\\r", 2, NULL, tg);
		} else if (c == '\t') {
			sb_put(b, "\\t", 2, NULL, tg);
		} else if (i - st == 1 && c >= 0x80) {
			/* an invalid byte: Python would hold a surrogate escape */
			snprintf(esc, sizeof(esc), "\\udc%02x", c);
			sb_put(b, esc, 6, NULL, tg);
		} else if (!py_isprintable(c)) {
			int k = c < 0x100 ? snprintf(esc, sizeof(esc), "\\x%02x", c)
				: c < 0x10000 ? snprintf(esc, sizeof(esc), "\\u%04x", c)
				: snprintf(esc, sizeof(esc), "\\U%08x", c);
			sb_put(b, esc, (size_t)k, NULL, tg);
		} else {
			sb_span(b, v, st, i - st);
		}
	}
	return sb_ch(b, q, t1);
}

/* str(v) appended to b, with the tags of the strings in it */
static int put_str(struct rs *r, struct sbuf *b, const struct hp_jval *v)
{
	char buf[64];

	switch (v->type) {
	case JV_UNDEF:
		return 0;
	case JV_STR:
		return sb_val(b, v);
	case JV_INT:
		return sb_printf(b, 0, "%lld", (long long)v->i);
	case JV_FLOAT:
		fmt_float(buf, sizeof(buf), v->f);
		return sb_str(b, buf, 0);
	}
	return put_repr(r, b, v, 0);
}

/* -1 with the error when a value nests deeper than LIM_NEST (a list holding itself) */
static int too_deep(struct rs *r, int depth)
{
	if (depth <= LIM_NEST)
		return 0;
	rerr(r, "values nested deeper than %d", LIM_NEST);
	return -1;
}

static int put_repr(struct rs *r, struct sbuf *b, const struct hp_jval *v, int depth)
{
	char buf[64];

	if (too_deep(r, depth))
		return -1;
	switch (v->type) {
	case JV_UNDEF:
		return sb_str(b, "Undefined", 0);
	case JV_NONE:
		return sb_str(b, "None", 0);
	case JV_BOOL:
		return sb_str(b, v->i ? "True" : "False", 0);
	case JV_INT:
	case JV_FLOAT:
		return put_str(r, b, v);
	case JV_STR:
		return put_str_repr(b, v);
	case JV_LIST: {
		const char *open = v->flags & JF_TUPLE ? "(" : "[", *close = v->flags & JF_TUPLE ? ")" : "]";

		if (v->flags & JF_ITEMS)
			sb_str(b, "dict_items(", 0);
		else if (v->flags & JF_KEYS)
			sb_str(b, "dict_keys(", 0);
		else if (v->flags & JF_VALUES)
			sb_str(b, "dict_values(", 0);
		sb_str(b, open, 0);
		for (size_t i = 0; i < v->l.n; i++) {
			if (i)
				sb_str(b, ", ", 0);
			if (put_repr(r, b, v->l.v[i], depth + 1))
				return -1;
		}
		if ((v->flags & JF_TUPLE) && v->l.n == 1)
			sb_ch(b, ',', 0);
		sb_str(b, close, 0);
		if (v->flags & (JF_ITEMS | JF_KEYS | JF_VALUES))
			sb_ch(b, ')', 0);
		return b->oom ? -1 : 0;
	}
	case JV_DICT:
	case JV_NS:
		if (v->type == JV_NS)
			sb_str(b, "<Namespace ", 0);
		sb_ch(b, '{', 0);
		for (size_t i = 0; i < v->d.n; i++) {
			if (i)
				sb_str(b, ", ", 0);
			if (put_repr(r, b, v->d.e[i].k, depth + 1))
				return -1;
			sb_str(b, ": ", 0);
			if (put_repr(r, b, v->d.e[i].v, depth + 1))
				return -1;
		}
		sb_ch(b, '}', 0);
		if (v->type == JV_NS)
			sb_ch(b, '>', 0);
		return b->oom ? -1 : 0;
	case JV_MACRO:
		return sb_printf(b, 0, "<Macro '%s'>", v->m.def->name);
	case JV_LOOP:
		return sb_printf(b, 0, "<LoopContext %zu/%zu>", v->loop->i + 1, v->loop->n);
	case JV_METHOD:
		snprintf(buf, sizeof(buf), "<built-in method %s>", v->meth.name);
		return sb_str(b, buf, 0);
	}
	return sb_str(b, "<built-in function>", 0);
}

/* str(v) as a string value */
static struct hp_jval *to_str(struct rs *r, struct hp_jval *v)
{
	struct sbuf b;

	if (v->type == JV_STR)
		return v;
	if (v->type == JV_UNDEF)
		return &v_empty;
	b = sb_new(r);
	if (put_str(r, &b, v))
		return b.oom ? room(r) : NULL;
	return sb_fin(r, &b);
}

/* --- json.dumps ------------------------------------------------------------ */
struct jopt {
	int ascii;
	const struct hp_jval *indent;   /* NULL: none; else a string of the indent */
	const struct hp_jval *isep, *ksep;
	int sort;
};

static int put_json_str(struct sbuf *b, const struct hp_jval *v, int ascii)
{
	const char *s = v->s.s;
	size_t n = v->s.len, i = 0;
	uint16_t t0 = n && v->s.tag ? v->s.tag[0] : v->btag;
	uint16_t t1 = n && v->s.tag ? v->s.tag[n - 1] : v->btag;

	sb_ch(b, '"', t0);
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
			sb_span(b, v, i, run - i);
			i = run;
			continue;
		}
		c = u8dec(s, n, &i);
		tg = v->s.tag ? v->s.tag[st] : 0;
		switch (c) {
		case '"': sb_put(b, "\\\"", 2, NULL, tg); continue;
		case '\\': sb_put(b, "\\\\", 2, NULL, tg); continue;
		case '\n': sb_put(b, "\\n", 2, NULL, tg); continue;
		case '\r': sb_put(b, "\\r", 2, NULL, tg); continue;
		case '\t': sb_put(b, "\\t", 2, NULL, tg); continue;
		case '\b': sb_put(b, "\\b", 2, NULL, tg); continue;
		case '\f': sb_put(b, "\\f", 2, NULL, tg); continue;
		}
		if (c < 0x20 || (ascii && c < 0x10000) || (i - st == 1 && c >= 0x80)) {
			snprintf(esc, sizeof(esc), "\\u%04x", i - st == 1 && c >= 0x80 ? 0xDC00 + c : c);
			sb_put(b, esc, 6, NULL, tg);
		} else if (ascii) {
			uint32_t x = c - 0x10000;

			snprintf(esc, sizeof(esc), "\\u%04x\\u%04x", 0xD800 + (x >> 10), 0xDC00 + (x & 0x3FF));
			sb_put(b, esc, 12, NULL, tg);
		} else {
			sb_span(b, v, st, i - st);
		}
	}
	return sb_ch(b, '"', t1);
}

static int json_nl(struct sbuf *b, const struct jopt *o, int level)
{
	sb_ch(b, '\n', 0);
	for (int i = 0; i < level; i++)
		sb_val(b, o->indent);
	return b->oom ? -1 : 0;
}

/* what goes before item i of a list or dict at level, and after its last */
static void json_item(struct sbuf *b, const struct jopt *o, int level, size_t i)
{
	if (i)
		sb_val(b, o->isep);
	if (o->indent)
		json_nl(b, o, level + 1);
}

static int json_close(struct sbuf *b, const struct jopt *o, int level, char close)
{
	if (o->indent)
		json_nl(b, o, level);
	return sb_ch(b, close, 0);
}

static int put_json(struct rs *r, struct sbuf *b, const struct hp_jval *v, const struct jopt *o,
		    int level)
{
	char buf[64];

	if (too_deep(r, level))
		return -1;
	switch (v->type) {
	case JV_NONE:
		return sb_str(b, "null", 0);
	case JV_BOOL:
		return sb_str(b, v->i ? "true" : "false", 0);
	case JV_INT:
		return sb_printf(b, 0, "%lld", (long long)v->i);
	case JV_FLOAT:
		if (isnan(v->f))
			return sb_str(b, "NaN", 0);
		if (isinf(v->f))
			return sb_str(b, v->f < 0 ? "-Infinity" : "Infinity", 0);
		fmt_float(buf, sizeof(buf), v->f);
		return sb_str(b, buf, 0);
	case JV_STR:
		return put_json_str(b, v, o->ascii);
	case JV_LIST:
		if (v->flags & (JF_ITEMS | JF_KEYS | JF_VALUES))
			break;
		if (!v->l.n)
			return sb_str(b, "[]", 0);
		sb_ch(b, '[', 0);
		for (size_t i = 0; i < v->l.n; i++) {
			json_item(b, o, level, i);
			if (put_json(r, b, v->l.v[i], o, level + 1))
				return -1;
		}
		return json_close(b, o, level, ']');
	case JV_DICT: {
		size_t n = v->d.n;
		const struct jent **ord;

		if (!n)
			return sb_str(b, "{}", 0);
		ord = ral(r, n * sizeof(*ord));
		if (!ord)
			return -1;
		for (size_t i = 0; i < n; i++) {
			const struct hp_jval *k = v->d.e[i].k;

			if (k->type != JV_STR && !isnum(k) && k->type != JV_NONE) {
				rerr(r, "keys must be str, int, float, bool or None, not %s", type_name(k));
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

					if (py_cmp(r, ord[j - 1]->k, x->k, &c))
						return -1;
					if (c <= 0)
						break;
					ord[j] = ord[j - 1];
					j--;
				}
				ord[j] = x;
			}
		}
		sb_ch(b, '{', 0);
		for (size_t i = 0; i < n; i++) {
			const struct hp_jval *k = ord[i]->k;

			json_item(b, o, level, i);
			if (k->type == JV_STR) {
				put_json_str(b, k, o->ascii);
			} else {
				/* a number or None, quoted */
				sb_ch(b, '"', 0);
				if (put_json(r, b, k, o, level + 1))
					return -1;
				sb_ch(b, '"', 0);
			}
			sb_val(b, o->ksep);
			if (put_json(r, b, ord[i]->v, o, level + 1))
				return -1;
		}
		return json_close(b, o, level, '}');
	}
	}
	if (v->type == JV_UNDEF && v->aux != UN_MSG)
		rerr(r, "Object of type Undefined is not JSON serializable");
	else
		rerr(r, "Object of type %s is not JSON serializable", type_name(v));
	return -1;
}

/* --- arithmetic ------------------------------------------------------------- */
static struct hp_jval *concat2(struct rs *r, const struct hp_jval *a, const struct hp_jval *b)
{
	size_t n = a->s.len + b->s.len;
	char *s;
	uint16_t *t = NULL;
	struct hp_jval *v;

	if (!a->s.len)
		return (struct hp_jval *)b;
	if (!b->s.len)
		return (struct hp_jval *)a;
	if (n > r->lim_output)
		return rerr(r, "a string longer than %zu MiB (limit)", r->lim_output >> 20);
	s = ral(r, n + 1);
	if (!s)
		return NULL;
	memcpy(s, a->s.s, a->s.len);
	memcpy(s + a->s.len, b->s.s, b->s.len);
	s[n] = '\0';
	if (a->s.tag || b->s.tag) {
		t = ral(r, n * sizeof(*t));
		if (!t)
			return NULL;
		if (a->s.tag)
			memcpy(t, a->s.tag, a->s.len * sizeof(*t));
		else
			memset(t, 0, a->s.len * sizeof(*t));
		if (b->s.tag)
			memcpy(t + a->s.len, b->s.tag, b->s.len * sizeof(*t));
		else
			memset(t + a->s.len, 0, b->s.len * sizeof(*t));
	}
	v = mk(r, JV_STR);
	if (!v)
		return NULL;
	v->s.s = s;
	v->s.len = n;
	v->s.tag = t;
	v->s.ncp = a->s.ncp + b->s.ncp;
	v->flags = a->flags & b->flags & JF_ASCII;
	v->btag = t ? t[0] : 0;
	return v;
}

static struct hp_jval *repeat(struct rs *r, const struct hp_jval *x, int64_t k)
{
	if (k <= 0)
		return x->type == JV_STR ? &v_empty : mklist(r, 0, x->flags & JF_TUPLE);
	if (x->type == JV_STR) {
		struct sbuf b = sb_new(r);

		if ((double)x->s.len * (double)k > (double)r->lim_output)
			return rerr(r, "a string longer than %zu MiB (limit)", r->lim_output >> 20);
		for (int64_t i = 0; i < k; i++)
			sb_val(&b, x);
		return sb_fin(r, &b);
	} else {
		struct hp_jval *l;

		if ((double)x->l.n * (double)k > (double)r->lim_iters)
			return rerr(r, "a list longer than %ld items (limit)", r->lim_iters);
		l = mklist(r, x->l.n * (size_t)k, x->flags & JF_TUPLE);
		if (!l)
			return NULL;
		for (int64_t i = 0; i < k; i++)
			for (size_t j = 0; j < x->l.n; j++)
				l->l.v[l->l.n++] = x->l.v[j];
		return l;
	}
}

static const char *opname(int op)
{
	switch (op) {
	case OP_ADD: return "+";
	case OP_SUB: return "-";
	case OP_MUL: return "*";
	case OP_DIV: return "/";
	case OP_FLOORDIV: return "//";
	case OP_MOD: return "%";
	case OP_POW: return "**";
	}
	return "?";
}

static struct hp_jval *str_format(struct rs *r, struct hp_jval *fmt, struct hp_jval *args);

static struct hp_jval *binop(struct rs *r, int op, struct hp_jval *a, struct hp_jval *b)
{
	if (a->type == JV_UNDEF)
		return undef_err(r, a);
	if (b->type == JV_UNDEF)
		return undef_err(r, b);
	if (isnum(a) && isnum(b)) {
		if (a->type != JV_FLOAT && b->type != JV_FLOAT && op != OP_DIV) {
			int64_t x = a->i, y = b->i, z;

			switch (op) {
			case OP_ADD:
				if (__builtin_add_overflow(x, y, &z))
					goto ovf;
				return mkint(r, z);
			case OP_SUB:
				if (__builtin_sub_overflow(x, y, &z))
					goto ovf;
				return mkint(r, z);
			case OP_MUL:
				if (__builtin_mul_overflow(x, y, &z))
					goto ovf;
				return mkint(r, z);
			case OP_FLOORDIV:
			case OP_MOD:
				if (!y)
					return rerr(r, "integer division or modulo by zero");
				if (x == INT64_MIN && y == -1)
					goto ovf;
				{
					int64_t q = x / y, m = x % y;

					if (m && ((m < 0) != (y < 0))) {
						q--;
						m += y;
					}
					return mkint(r, op == OP_MOD ? m : q);
				}
			case OP_POW:
				if (y < 0) {
					if (!x)
						return rerr(r, "0.0 cannot be raised to a negative power");
					return mkfloat(r, pow((double)x, (double)y));
				}
				z = 1;
				while (y) {
					if (y & 1 && __builtin_mul_overflow(z, x, &z))
						goto ovf;
					y >>= 1;
					if (y && __builtin_mul_overflow(x, x, &x))
						goto ovf;
				}
				return mkint(r, z);
			}
		} else {
			double x = numf(a), y = numf(b);

			switch (op) {
			case OP_ADD: return mkfloat(r, x + y);
			case OP_SUB: return mkfloat(r, x - y);
			case OP_MUL: return mkfloat(r, x * y);
			case OP_DIV:
				if (y == 0)
					return rerr(r, "division by zero");
				return mkfloat(r, x / y);
			case OP_FLOORDIV:
			case OP_MOD: {
				/* CPython float_divmod */
				double m, d, fd;

				if (y == 0)
					return rerr(r, "float modulo or division by zero");
				m = fmod(x, y);
				d = (x - m) / y;
				if (m) {
					if ((y < 0) != (m < 0)) {
						m += y;
						d -= 1.0;
					}
				} else {
					m = copysign(0.0, y);
				}
				if (d) {
					fd = floor(d);
					if (d - fd > 0.5)
						fd += 1.0;
				} else {
					fd = copysign(0.0, x / y);
				}
				return mkfloat(r, op == OP_MOD ? m : fd);
			}
			case OP_POW:
				if (x == 0 && y < 0)
					return rerr(r, "0.0 cannot be raised to a negative power");
				if (x < 0 && y != floor(y))
					return rerr(r, "a negative number to a fractional power is complex (not supported)");
				return mkfloat(r, pow(x, y));
			}
		}
	}
	if (op == OP_ADD) {
		if (a->type == JV_STR && b->type == JV_STR)
			return concat2(r, a, b);
		if (a->type == JV_LIST && b->type == JV_LIST &&
		    (a->flags & JF_TUPLE) == (b->flags & JF_TUPLE) &&
		    !((a->flags | b->flags) & (JF_ITEMS | JF_KEYS | JF_VALUES))) {
			struct hp_jval *l = mklist(r, a->l.n + b->l.n, a->flags & JF_TUPLE);

			if (!l)
				return NULL;
			for (size_t i = 0; i < a->l.n; i++)
				l->l.v[l->l.n++] = a->l.v[i];
			for (size_t i = 0; i < b->l.n; i++)
				l->l.v[l->l.n++] = b->l.v[i];
			return l;
		}
		if (a->type == JV_STR || b->type == JV_STR)
			return rerr(r, "can only concatenate str (not \"%s\") to str",
				    type_name(a->type == JV_STR ? b : a));
	}
	if (op == OP_MUL) {
		if ((a->type == JV_STR || a->type == JV_LIST) && (b->type == JV_INT || b->type == JV_BOOL))
			return repeat(r, a, b->i);
		if ((b->type == JV_STR || b->type == JV_LIST) && (a->type == JV_INT || a->type == JV_BOOL))
			return repeat(r, b, a->i);
	}
	if (op == OP_MOD && a->type == JV_STR)
		return str_format(r, a, b);
	return rerr(r, "unsupported operand type(s) for %s: '%s' and '%s'", opname(op), type_name(a),
		    type_name(b));
ovf:
	return rerr(r, "integer overflow (integers are 64-bit here)");
}

/* --- attributes and items ------------------------------------------------- */
static const char *const str_methods[] = {
	"startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "upper", "lower",
	"title", "capitalize", "replace", "find", "rfind", "count", "join", "isdigit", "isalpha",
	"isspace", "isalnum", "islower", "isupper", "splitlines", "format", "index", "rindex",
	"swapcase", "center", "ljust", "rjust", "zfill", "casefold", "isnumeric", "isdecimal",
	"istitle", "partition", "rpartition", "removeprefix", "removesuffix", "expandtabs", NULL,
};
static const char *const dict_methods[] = { "items", "keys", "values", "get", "copy", NULL };
static const char *const dict_unsafe[] = { "clear", "pop", "popitem", "setdefault", "update", NULL };
static const char *const list_methods[] = { "index", "count", "copy", NULL };
static const char *const list_unsafe[] = { "append", "reverse", "insert", "sort", "extend", "remove",
					   "pop", "clear", NULL };

static int in_list(const char *const *l, const char *s, size_t n)
{
	for (; *l; l++)
		if (strlen(*l) == n && !memcmp(*l, s, n))
			return 1;
	return 0;
}

static struct hp_jval *mkmethod(struct rs *r, struct hp_jval *self, const char *name)
{
	struct hp_jval *m = mk(r, JV_METHOD);

	if (m) {
		m->meth.self = self;
		m->meth.name = name;
	}
	return m;
}

static struct hp_jval *loop_attr(struct rs *r, struct hp_jval *lv, const char *a, size_t n)
{
	struct jloop *l = lv->loop;

#define IS(s) (n == sizeof(s) - 1 && !memcmp(a, s, n))
	if (IS("index"))
		return mkint(r, (int64_t)l->i + 1);
	if (IS("index0"))
		return mkint(r, (int64_t)l->i);
	if (IS("revindex"))
		return mkint(r, (int64_t)(l->n - l->i));
	if (IS("revindex0"))
		return mkint(r, (int64_t)(l->n - l->i - 1));
	if (IS("first"))
		return VBOOL(l->i == 0);
	if (IS("last"))
		return VBOOL(l->i + 1 == l->n);
	if (IS("length"))
		return mkint(r, (int64_t)l->n);
	if (IS("depth"))
		return mkint(r, 1);
	if (IS("depth0"))
		return mkint(r, 0);
	if (IS("previtem"))
		return l->i ? l->items->l.v[l->i - 1]
			    : mkundef(r, UN_MSG, "there is no previous item", 25, NULL);
	if (IS("nextitem"))
		return l->i + 1 < l->n ? l->items->l.v[l->i + 1]
				       : mkundef(r, UN_MSG, "there is no next item", 21, NULL);
	if (IS("cycle"))
		return mkmethod(r, lv, "cycle");
	if (IS("changed"))
		return mkmethod(r, lv, "changed");
#undef IS
	return mkundef(r, UN_ATTR, a, n, "LoopContext");
}

/* jinja's getattr: the attribute (a method), else the item */
static struct hp_jval *get_attr(struct rs *r, struct hp_jval *x, const char *a, size_t n)
{
	const char *tn = type_name(x);

	if (x->type == JV_UNDEF)
		return undef_err(r, x);
	if (n && a[0] == '_')
		return mkundef(r, UN_UNSAFE, a, n, tn);
	switch (x->type) {
	case JV_STR:
		if (in_list(str_methods, a, n))
			return mkmethod(r, x, a);
		break;
	case JV_DICT:
		if (in_list(dict_methods, a, n))
			return mkmethod(r, x, a);
		if (in_list(dict_unsafe, a, n))
			return mkundef(r, UN_UNSAFE, a, n, tn);
		{
			struct jent *e = dict_find_str(x, a, n);

			if (e)
				return e->v;
		}
		break;
	case JV_NS: {
		struct jent *e = dict_find_str(x, a, n);

		if (e)
			return e->v;
		break;
	}
	case JV_LIST:
		if (in_list(list_methods, a, n) && !(x->flags & (JF_ITEMS | JF_KEYS | JF_VALUES)))
			return mkmethod(r, x, a);
		if (in_list(list_unsafe, a, n) && !(x->flags & JF_TUPLE))
			return mkundef(r, UN_UNSAFE, a, n, tn);
		break;
	case JV_LOOP:
		return loop_attr(r, x, a, n);
	}
	return mkundef(r, UN_ATTR, a, n, tn);
}

static int norm_index(int64_t i, size_t n, size_t *out)
{
	if (i < 0)
		i += (int64_t)n;
	if (i < 0 || (uint64_t)i >= n)
		return 0;
	*out = (size_t)i;
	return 1;
}

static struct hp_jval *get_item(struct rs *r, struct hp_jval *x, struct hp_jval *k)
{
	size_t i;

	if (x->type == JV_UNDEF)
		return undef_err(r, x);
	if (x->type == JV_DICT) {
		for (size_t j = 0; j < x->d.n; j++)
			if (py_eq(x->d.e[j].k, k))
				return x->d.e[j].v;
	} else if ((x->type == JV_LIST || x->type == JV_STR) && (k->type == JV_INT || k->type == JV_BOOL)) {
		if (x->type == JV_LIST) {
			if (norm_index(k->i, x->l.n, &i) && !(x->flags & (JF_ITEMS | JF_KEYS | JF_VALUES)))
				return x->l.v[i];
		} else if (norm_index(k->i, x->s.ncp, &i)) {
			size_t off = cp_off(x, i), end = off;

			u8dec(x->s.s, x->s.len, &end);
			return sub(r, x, off, end - off);
		}
	}
	if (k->type == JV_STR)
		return get_attr(r, x, k->s.s, k->s.len);
	if (k->type == JV_INT || k->type == JV_BOOL) {
		char *num = ral(r, 24);

		if (!num)
			return NULL;
		snprintf(num, 24, "%lld", (long long)k->i);
		return mkundef(r, UN_ITEM, num, strlen(num), type_name(x));
	}
	return mkundef(r, UN_ITEM, "?", 1, type_name(x));
}

/* a slice index given (not absent or None), and one given that is no integer */
static int slice_given(const struct hp_jval *v)
{
	return v && v->type != JV_NONE;
}

static int slice_bad(const struct hp_jval *v)
{
	return slice_given(v) && v->type != JV_INT && v->type != JV_BOOL;
}

/* one slice bound v into a sequence of len with step st; dflt where v is not given */
static int64_t slice_bound(const struct hp_jval *v, int64_t len, int64_t st, int64_t dflt)
{
	int64_t a;

	if (!slice_given(v))
		return dflt;
	a = v->i;
	if (a < 0) {
		a += len;
		if (a < 0)
			a = st < 0 ? -1 : 0;
	} else if (a >= len) {
		a = st < 0 ? len - 1 : len;
	}
	return a;
}

/* Python slice indices for a sequence of n: PySlice_AdjustIndices */
static int slice_idx(struct rs *r, struct hp_jval *sv, struct hp_jval *ev, struct hp_jval *tv, size_t n,
		     int64_t *start, int64_t *stop, int64_t *step, int64_t *count)
{
	int64_t st = 1, len = (int64_t)n, a, b;

	/* Python checks the step first */
	if (!slice_bad(tv) && slice_given(tv) && !(st = tv->i)) {
		rerr(r, "slice step cannot be zero");
		return -1;
	}
	if (slice_bad(tv) || slice_bad(sv) || slice_bad(ev)) {
		rerr(r, "slice indices must be integers or None");
		return -1;
	}
	a = slice_bound(sv, len, st, st < 0 ? len - 1 : 0);
	b = slice_bound(ev, len, st, st < 0 ? -1 : len);
	*count = 0;
	if (st < 0) {
		if (b < a)
			*count = (a - b - 1) / (-st) + 1;
	} else if (a < b) {
		*count = (b - a - 1) / st + 1;
	}
	*start = a;
	*stop = b;
	*step = st;
	return 0;
}

static struct hp_jval *get_slice(struct rs *r, struct hp_jval *x, struct hp_jval *sv, struct hp_jval *ev,
				 struct hp_jval *tv)
{
	int64_t a, b, st, cnt;

	if (x->type == JV_UNDEF)
		return undef_err(r, x);
	if (x->type == JV_LIST && !(x->flags & (JF_ITEMS | JF_KEYS | JF_VALUES))) {
		struct hp_jval *l;

		if (slice_idx(r, sv, ev, tv, x->l.n, &a, &b, &st, &cnt))
			return NULL;
		l = mklist(r, (size_t)cnt, x->flags & JF_TUPLE);
		if (!l)
			return NULL;
		for (int64_t i = 0, j = a; i < cnt; i++, j += st)
			l->l.v[l->l.n++] = x->l.v[j];
		return l;
	}
	if (x->type == JV_STR) {
		size_t *offs = NULL;
		struct sbuf bb;

		if (slice_idx(r, sv, ev, tv, x->s.ncp, &a, &b, &st, &cnt))
			return NULL;
		if (!cnt)
			return &v_empty;
		if (st == 1) {
			size_t o1 = cp_off(x, (size_t)a), o2 = o1;

			if (x->flags & JF_ASCII) {
				o2 = (size_t)(a + cnt);
			} else {
				for (int64_t i = 0; i < cnt; i++)
					u8dec(x->s.s, x->s.len, &o2);
			}
			return sub(r, x, o1, o2 - o1);
		}
		if (!(x->flags & JF_ASCII)) {
			size_t i = 0, k = 0;

			offs = ral(r, (x->s.ncp + 1) * sizeof(*offs));
			if (!offs)
				return NULL;
			while (i < x->s.len) {
				offs[k++] = i;
				u8dec(x->s.s, x->s.len, &i);
			}
			offs[k] = i;
		}
		bb = sb_new(r);
		for (int64_t i = 0, j = a; i < cnt; i++, j += st) {
			size_t o1 = offs ? offs[j] : (size_t)j, o2 = offs ? offs[j + 1] : (size_t)j + 1;

			sb_span(&bb, x, o1, o2 - o1);
		}
		return sb_fin(r, &bb);
	}
	return rerr(r, "'%s' object is not subscriptable", type_name(x));
}

/* the items of an iterable: lists as they are, dict keys, string characters */
static struct hp_jval *iter_list(struct rs *r, struct hp_jval *x)
{
	struct hp_jval *l;

	switch (x->type) {
	case JV_UNDEF:
		return mklist(r, 0, 0);
	case JV_LIST:
		return x;
	case JV_DICT:
		l = mklist(r, x->d.n, 0);
		if (!l)
			return NULL;
		for (size_t i = 0; i < x->d.n; i++)
			l->l.v[l->l.n++] = x->d.e[i].k;
		return l;
	case JV_STR: {
		size_t i = 0;

		l = mklist(r, x->s.ncp, 0);
		if (!l)
			return NULL;
		while (i < x->s.len) {
			size_t st = i;

			u8dec(x->s.s, x->s.len, &i);
			l->l.v[l->l.n] = sub(r, x, st, i - st);
			if (!l->l.v[l->l.n++])
				return NULL;
		}
		return l;
	}
	}
	return rerr(r, "'%s' object is not iterable", type_name(x));
}

/* --- argument checks -------------------------------------------------------- */
static int need_int(struct rs *r, const struct hp_jval *v, const char *what, int64_t *out)
{
	if (v->type == JV_UNDEF) {
		undef_err(r, v);
		return -1;
	}
	if (v->type != JV_INT && v->type != JV_BOOL) {
		rerr(r, "%s: '%s' object cannot be interpreted as an integer", what, type_name(v));
		return -1;
	}
	*out = v->i;
	return 0;
}

static struct hp_jval *need_str(struct rs *r, struct hp_jval *v, const char *what)
{
	if (v->type == JV_STR)
		return v;
	if (v->type == JV_UNDEF)
		return undef_err(r, v);
	return rerr(r, "%s: must be str, not %s", what, type_name(v));
}

/* a required argument v of what(): when not given (NULL), the error "what() <missing>" */
static struct hp_jval *arg_str(struct rs *r, struct hp_jval *v, const char *what, const char *missing)
{
	return v ? need_str(r, v, what) : rerr(r, "%s() %s", what, missing);
}

static int arg_int(struct rs *r, struct hp_jval *v, const char *what, const char *missing, int64_t *out)
{
	if (v)
		return need_int(r, v, what, out);
	rerr(r, "%s() %s", what, missing);
	return -1;
}

/* --- string operations ------------------------------------------------------ */
static int in_chars(const struct hp_jval *chars, uint32_t c)
{
	size_t i = 0;

	if (!chars)
		return py_isspace(c);
	while (i < chars->s.len)
		if (u8dec(chars->s.s, chars->s.len, &i) == c)
			return 1;
	return 0;
}

/* str.strip/lstrip/rstrip and the trim filter, named what: chars absent or None for whitespace */
static struct hp_jval *s_strip(struct rs *r, struct hp_jval *v, struct hp_jval *chars, const char *what,
			       int left, int right)
{
	size_t a = 0, b = v->s.len;

	if (chars && chars->type == JV_NONE)
		chars = NULL;
	if (chars && !need_str(r, chars, what))
		return NULL;

	if (left)
		while (a < b) {
			size_t j = a;

			if (!in_chars(chars, u8dec(v->s.s, b, &j)))
				break;
			a = j;
		}
	if (right)
		while (b > a) {
			size_t i = u8prev(v->s.s, b), j = i;

			if (i < a || !in_chars(chars, u8dec(v->s.s, b, &j)))
				break;
			b = i;
		}
	return sub(r, v, a, b - a);
}

static const char *mem_find(const char *h, size_t hn, const char *nd, size_t nn)
{
	if (!nn)
		return h;
	if (nn > hn)
		return NULL;
	return memmem(h, hn, nd, nn);
}

static const char *mem_rfind(const char *h, size_t hn, const char *nd, size_t nn)
{
	if (nn > hn)
		return NULL;
	for (size_t i = hn - nn + 1; i-- > 0;)
		if (!memcmp(h + i, nd, nn))
			return h + i;
	return NULL;
}

/* push v's bytes [off, off + len) onto l */
static int push_sub(struct rs *r, struct hp_jval *l, struct hp_jval *v, size_t off, size_t len)
{
	struct hp_jval *x = sub(r, v, off, len);

	return !x || push(r, l, x) ? -1 : 0;
}

/* str.split/rsplit: rsplit collects its parts from the right, then reverses them */
static struct hp_jval *s_split(struct rs *r, struct hp_jval *v, struct hp_jval *sep, int64_t max, int rev)
{
	struct hp_jval *l = mklist(r, 0, 0);
	const char *s = v->s.s;
	size_t n = v->s.len;

	if (!l)
		return NULL;
	if (sep && sep->type != JV_NONE) {
		if (sep->type != JV_STR)
			return rerr(r, "must be str or None, not %s", type_name(sep));
		if (!sep->s.len)
			return rerr(r, "empty separator");
		if (!rev) {
			size_t a = 0;
			const char *p;

			while ((max < 0 || (int64_t)l->l.n < max) &&
			       (p = mem_find(s + a, n - a, sep->s.s, sep->s.len))) {
				if (push_sub(r, l, v, a, (size_t)(p - s) - a))
					return NULL;
				a = (size_t)(p - s) + sep->s.len;
			}
			if (push_sub(r, l, v, a, n - a))
				return NULL;
		} else {
			size_t b = n;
			const char *p;

			while ((max < 0 || (int64_t)l->l.n < max) && (p = mem_rfind(s, b, sep->s.s, sep->s.len))) {
				size_t e = (size_t)(p - s) + sep->s.len;

				if (push_sub(r, l, v, e, b - e))
					return NULL;
				b = (size_t)(p - s);
			}
			if (push_sub(r, l, v, 0, b))
				return NULL;
		}
	} else if (!rev) {
		/* whitespace runs, no empty parts */
		size_t i = 0;

		for (;;) {
			size_t a, j;

			while (i < n && (j = ws_at(s, n, i)))
				i += j;
			if (i >= n)
				break;
			a = i;
			if (max >= 0 && (int64_t)l->l.n >= max) {
				/* the rest, its trailing whitespace kept as Python keeps it */
				if (push_sub(r, l, v, a, n - a))
					return NULL;
				break;
			}
			while (i < n && !ws_at(s, n, i))
				u8dec(s, n, &i);
			if (push_sub(r, l, v, a, i - a))
				return NULL;
		}
	} else {
		size_t b = n;

		for (;;) {
			size_t e;

			b = rstrip_ws_len(s, b);
			if (!b)
				break;
			if (max >= 0 && (int64_t)l->l.n >= max) {
				if (push_sub(r, l, v, 0, b))
					return NULL;
				break;
			}
			e = b;
			while (b > 0) {
				size_t p = u8prev(s, b);

				if (ws_at(s, e, p))
					break;
				b = p;
			}
			if (push_sub(r, l, v, b, e - b))
				return NULL;
		}
	}
	for (size_t i = 0; rev && i < l->l.n / 2; i++) {
		struct hp_jval *t = l->l.v[i];

		l->l.v[i] = l->l.v[l->l.n - 1 - i];
		l->l.v[l->l.n - 1 - i] = t;
	}
	return l;
}

static struct hp_jval *s_replace(struct rs *r, struct hp_jval *v, struct hp_jval *old, struct hp_jval *nw,
				 int64_t count)
{
	struct sbuf b = sb_new(r);
	size_t a = 0, n = v->s.len;
	int64_t done = 0;

	if (old->type != JV_STR || nw->type != JV_STR)
		return rerr(r, "replace() arguments must be str");
	if (!old->s.len) {
		size_t i = 0;

		/* Python inserts the new text around every character */
		while (count < 0 || done < count) {
			sb_val(&b, nw);
			done++;
			if (i >= n)
				break;
			a = i;
			u8dec(v->s.s, n, &i);
			sb_span(&b, v, a, i - a);
		}
		if (i < n)
			sb_span(&b, v, i, n - i);
		return sb_fin(r, &b);
	}
	for (;;) {
		const char *p = count >= 0 && done >= count ? NULL
				: mem_find(v->s.s + a, n - a, old->s.s, old->s.len);

		if (!p)
			break;
		sb_span(&b, v, a, (size_t)(p - v->s.s) - a);
		sb_val(&b, nw);
		a = (size_t)(p - v->s.s) + old->s.len;
		done++;
	}
	if (!done)
		return v;
	sb_span(&b, v, a, n - a);
	return sb_fin(r, &b);
}

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE };

/* full case mapping of one code point: the common SpecialCasing.txt entries */
static int case_map(uint32_t c, int mode, uint32_t out[3])
{
	static const struct {
		uint32_t c;
		uint32_t up[3], ti[3];
	} sp[] = {
		{ 0x00DF, { 'S', 'S', 0 }, { 'S', 's', 0 } },
		{ 0xFB00, { 'F', 'F', 0 }, { 'F', 'f', 0 } },
		{ 0xFB01, { 'F', 'I', 0 }, { 'F', 'i', 0 } },
		{ 0xFB02, { 'F', 'L', 0 }, { 'F', 'l', 0 } },
		{ 0xFB03, { 'F', 'F', 'I' }, { 'F', 'f', 'i' } },
		{ 0xFB04, { 'F', 'F', 'L' }, { 'F', 'f', 'l' } },
		{ 0xFB05, { 'S', 'T', 0 }, { 'S', 't', 0 } },
		{ 0xFB06, { 'S', 'T', 0 }, { 'S', 't', 0 } },
		{ 0x0149, { 0x02BC, 'N', 0 }, { 0x02BC, 'N', 0 } },
	};

	if (c < 0x80) {
		if (mode == CASE_LOWER)
			out[0] = c >= 'A' && c <= 'Z' ? c + 32 : c;
		else
			out[0] = c >= 'a' && c <= 'z' ? c - 32 : c;
		return 1;
	}
	if (mode == CASE_LOWER) {
		if (c == 0x0130) {
			out[0] = 'i';
			out[1] = 0x0307;
			return 2;
		}
		out[0] = (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
		return 1;
	}
	for (size_t i = 0; i < sizeof(sp) / sizeof(sp[0]); i++)
		if (sp[i].c == c) {
			const uint32_t *m = mode == CASE_UPPER ? sp[i].up : sp[i].ti;
			int k = 0;

			while (k < 3 && m[k])
				out[k] = m[k], k++;
			return k;
		}
	out[0] = (uint32_t)(mode == CASE_UPPER ? utf8proc_toupper((utf8proc_int32_t)c)
				: utf8proc_totitle((utf8proc_int32_t)c));
	return 1;
}

/* append the mapped character; tags per byte when the length holds, else the first's */
static void put_mapped(struct sbuf *b, const struct hp_jval *v, size_t st, size_t end, const uint32_t *m,
		       int k)
{
	char o[16];
	size_t ol = 0;

	for (int j = 0; j < k; j++)
		ol += hp_utf8_encode(m[j], (unsigned char *)o + ol);
	if (ol == end - st)
		sb_put(b, o, ol, v->s.tag ? v->s.tag + st : NULL, 0);
	else
		sb_put(b, o, ol, NULL, v->s.tag ? v->s.tag[st] : 0);
}

static int final_sigma(const struct hp_jval *v, size_t st, size_t end)
{
	size_t i = 0, j = end;
	int before = 0, after = 0;

	/* a cased letter before (skipping case-ignorables is approximated by none) */
	if (st > 0) {
		i = u8prev(v->s.s, st);
		j = i;
		before = py_iscased(u8dec(v->s.s, v->s.len, &j));
	}
	if (end < v->s.len) {
		j = end;
		after = py_iscased(u8dec(v->s.s, v->s.len, &j));
	}
	return before && !after;
}

/* mode per character: 0 upper, 1 lower, 2 title; how picks the mode */
enum { HOW_UPPER, HOW_LOWER, HOW_CAPITALIZE, HOW_TITLE, HOW_SWAP };

static struct hp_jval *s_case(struct rs *r, struct hp_jval *v, int how)
{
	struct sbuf b;
	size_t i = 0;
	int prev_cased = 0, first = 1;

	if (v->flags & JF_ASCII) {
		int change = 0;

		for (size_t k = 0; k < v->s.len && !change; k++) {
			char ch = v->s.s[k];

			change = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
		}
		if (!change)
			return v;
	}
	b = sb_new(r);
	while (i < v->s.len) {
		size_t st = i;
		uint32_t c = u8dec(v->s.s, v->s.len, &i), m[3];
		int mode, k;

		switch (how) {
		case HOW_UPPER: mode = CASE_UPPER; break;
		case HOW_LOWER: mode = CASE_LOWER; break;
		case HOW_CAPITALIZE: mode = first ? CASE_TITLE : CASE_LOWER; break;
		case HOW_TITLE: mode = prev_cased ? CASE_LOWER : CASE_TITLE; break;
		default: {
			int cat = cat_of(c);

			mode = cat == UTF8PROC_CATEGORY_LU ? CASE_LOWER : cat == UTF8PROC_CATEGORY_LL ? CASE_UPPER : -1;
		}
		}
		first = 0;
		if (how == HOW_TITLE)
			prev_cased = py_iscased(c);
		if (mode < 0 || (i - st == 1 && c >= 0x80)) {
			sb_span(&b, v, st, i - st);
			continue;
		}
		if (mode == CASE_LOWER && c == 0x03A3 && final_sigma(v, st, i)) {
			m[0] = 0x03C2;
			k = 1;
		} else {
			k = case_map(c, mode, m);
		}
		put_mapped(&b, v, st, i, m, k);
	}
	return sb_fin(r, &b);
}

/* jinja's title filter: each run after [-\s({\[<]+ gets item[0].upper() + item[1:].lower() */
static struct hp_jval *f_title(struct rs *r, struct hp_jval *v)
{
	struct sbuf b = sb_new(r);
	size_t i = 0;
	int start = 1;

	while (i < v->s.len) {
		size_t st = i;
		uint32_t c = u8dec(v->s.s, v->s.len, &i), m[3];
		int k;

		if (py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
			sb_span(&b, v, st, i - st);
			start = 1;
			continue;
		}
		if (i - st == 1 && c >= 0x80) {
			sb_span(&b, v, st, 1);
			start = 0;
			continue;
		}
		if (!start && c == 0x03A3 && final_sigma(v, st, i)) {
			m[0] = 0x03C2;
			k = 1;
		} else {
			k = case_map(c, start ? CASE_UPPER : CASE_LOWER, m);
		}
		put_mapped(&b, v, st, i, m, k);
		start = 0;
	}
	return sb_fin(r, &b);
}

/* code point index of byte offset off */
static int64_t cp_index(const struct hp_jval *v, size_t off)
{
	size_t i = 0;
	int64_t k = 0;

	if (v->flags & JF_ASCII)
		return (int64_t)off;
	while (i < off) {
		u8dec(v->s.s, v->s.len, &i);
		k++;
	}
	return k;
}

static int all_chars(const struct hp_jval *v, int (*pred)(uint32_t))
{
	size_t i = 0;

	if (!v->s.len)
		return 0;
	while (i < v->s.len)
		if (!pred(u8dec(v->s.s, v->s.len, &i)))
			return 0;
	return 1;
}

static int is_lower_cp(uint32_t c)
{
	return cat_of(c) == UTF8PROC_CATEGORY_LL;
}

static int is_upper_cp(uint32_t c)
{
	int k = cat_of(c);

	return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT;
}

/* str.islower / isupper: some cased character, none of the other case */
static int s_iscase(const struct hp_jval *v, int upper)
{
	size_t i = 0;
	int cased = 0;

	while (i < v->s.len) {
		uint32_t c = u8dec(v->s.s, v->s.len, &i);

		if (upper ? is_lower_cp(c) : is_upper_cp(c))
			return 0;
		if (upper ? is_upper_cp(c) : is_lower_cp(c))
			cased = 1;
	}
	return cased;
}

/* padding with a fill character (center/ljust/rjust), tags 0 for the fill */
static struct hp_jval *s_pad(struct rs *r, struct hp_jval *v, int64_t width, const struct hp_jval *fill,
			     int where)
{
	int64_t marg = width - (int64_t)v->s.ncp, left;
	struct sbuf b;
	const char *fc = " ";
	size_t fl = 1;

	if (marg <= 0)
		return v;
	if (marg > (int64_t)r->lim_output)
		return rerr(r, "a string longer than %zu MiB (limit)", r->lim_output >> 20);
	if (fill) {
		if (fill->type != JV_STR || fill->s.ncp != 1)
			return rerr(r, "the fill character must be exactly one character long");
		fc = fill->s.s;
		fl = fill->s.len;
	}
	left = where == 0 ? marg / 2 + (marg & width & 1) : where < 0 ? 0 : marg;
	b = sb_new(r);
	for (int64_t i = 0; i < left; i++)
		sb_put(&b, fc, fl, NULL, 0);
	sb_val(&b, v);
	for (int64_t i = left; i < marg; i++)
		sb_put(&b, fc, fl, NULL, 0);
	return sb_fin(r, &b);
}

/* --- calls: arguments ----------------------------------------------------- */
struct args {
	struct hp_jval **pos;
	int np;
	const char **kn;
	struct hp_jval **kv;
	int nk;
};

static struct hp_jval *eval(struct rs *r, struct frame *f, const struct node *n);

/* evaluate n's arguments, with first (a filter's or test's value) in front */
static int eval_args(struct rs *r, struct frame *f, const struct node *n, struct hp_jval *first,
		     struct args *a)
{
	int off = first ? 1 : 0;

	a->np = n->nv + off;
	a->nk = n->nkw;
	a->pos = ral(r, (size_t)(a->np + 1) * sizeof(*a->pos));
	a->kn = ral(r, (size_t)(a->nk + 1) * sizeof(*a->kn));
	a->kv = ral(r, (size_t)(a->nk + 1) * sizeof(*a->kv));
	if (!a->pos || !a->kn || !a->kv)
		return -1;
	if (first)
		a->pos[0] = first;
	for (int i = 0; i < n->nv; i++)
		if (!(a->pos[i + off] = eval(r, f, n->v[i])))
			return -1;
	for (int i = 0; i < n->nkw; i++) {
		a->kn[i] = n->kw[i].name;
		if (!(a->kv[i] = eval(r, f, n->kw[i].v)))
			return -1;
	}
	return 0;
}

/* match a's arguments from position skip on to the parameter names */
static int bind(struct rs *r, const char *what, const struct args *a, int skip, const char *const *names,
		int nn, struct hp_jval **out)
{
	for (int i = 0; i < nn; i++)
		out[i] = NULL;
	if (a->np - skip > nn) {
		rerr(r, "%s() takes at most %d argument%s (%d given)", what, nn, nn == 1 ? "" : "s",
		     a->np - skip);
		return -1;
	}
	for (int i = skip; i < a->np; i++)
		out[i - skip] = a->pos[i];
	for (int k = 0; k < a->nk; k++) {
		int j;

		for (j = 0; j < nn; j++)
			if (!strcmp(names[j], a->kn[k]))
				break;
		if (j == nn) {
			rerr(r, "%s() got an unexpected keyword argument '%s'", what, a->kn[k]);
			return -1;
		}
		if (out[j]) {
			rerr(r, "%s() got multiple values for argument '%s'", what, a->kn[k]);
			return -1;
		}
		out[j] = a->kv[k];
	}
	return 0;
}

/* --- % formatting ----------------------------------------------------------- */
/*
 * Append one printf conversion of the number that follows conv: "%" flags,
 * the width and precision where given (>= 0), then conv ("lld", "f", ...).
 * Both are at most 4096, so 8400 bytes hold any result, a double's 309
 * integer digits included.
 */
static void sb_conv(struct sbuf *b, const char *flags, int width, int prec, const char *conv, ...)
{
	char spec[48], w[16] = "", p[16] = "", out[8400];
	va_list ap;
	int k;

	if (width >= 0)
		snprintf(w, sizeof(w), "%d", width);
	if (prec >= 0)
		snprintf(p, sizeof(p), ".%d", prec);
	snprintf(spec, sizeof(spec), "%%%s%s%s%s", flags, w, p, conv);
	va_start(ap, conv);
	k = vsnprintf(out, sizeof(out), spec, ap);
	va_end(ap);
	if (k > 0)
		sb_put(b, out, (size_t)k < sizeof(out) ? (size_t)k : sizeof(out) - 1, NULL, 0);
}

static struct hp_jval *str_format(struct rs *r, struct hp_jval *fmt, struct hp_jval *args)
{
	struct sbuf b = sb_new(r);
	const char *s = fmt->s.s;
	size_t n = fmt->s.len, i = 0, argi = 0;
	struct hp_jval *single[1] = { args }, **av = single;
	size_t na = 1;
	int mapping = args->type == JV_DICT;

	if (args->type == JV_LIST && (args->flags & JF_TUPLE)) {
		av = args->l.v;
		na = args->l.n;
	}
	while (i < n) {
		const char *p = memchr(s + i, '%', n - i);
		char flags[8];
		int nf = 0, width = -1, prec = -1;
		struct hp_jval *arg;
		char conv;

		if (!p) {
			sb_span(&b, fmt, i, n - i);
			break;
		}
		sb_span(&b, fmt, i, (size_t)(p - s) - i);
		i = (size_t)(p - s) + 1;
		if (i < n && s[i] == '%') {
			sb_ch(&b, '%', fmt->s.tag ? fmt->s.tag[i] : 0);
			i++;
			continue;
		}
		arg = NULL;
		if (i < n && s[i] == '(') {
			const char *e = memchr(s + i, ')', n - i);
			struct jent *en;

			if (!e)
				return rerr(r, "incomplete format key");
			if (!mapping)
				return rerr(r, "format requires a mapping");
			en = dict_find_str(args, s + i + 1, (size_t)(e - s) - i - 1);
			if (!en)
				return rerr(r, "format key '%.*s' not found", (int)((size_t)(e - s) - i - 1),
					    s + i + 1);
			arg = en->v;
			i = (size_t)(e - s) + 1;
		}
		while (i < n && strchr("-+ #0", s[i]) && s[i] && nf < 6)
			flags[nf++] = s[i++];
		flags[nf] = '\0';
		if (i < n && isdig(s[i])) {
			width = 0;
			while (i < n && isdig(s[i]) && width < 100000)
				width = width * 10 + (s[i++] - '0');
		}
		if (i < n && s[i] == '.') {
			i++;
			prec = 0;
			while (i < n && isdig(s[i]) && prec < 100000)
				prec = prec * 10 + (s[i++] - '0');
		}
		while (i < n && strchr("hlL", s[i]) && s[i])
			i++;
		if (i >= n)
			return rerr(r, "incomplete format");
		conv = s[i++];
		if (!arg) {
			if (mapping && na == 1 && av == single)
				return rerr(r, "format requires a mapping");
			if (argi >= na)
				return rerr(r, "not enough arguments for format string");
			arg = av[argi++];
		}
		if (width > 4096 || prec > 4096)
			return rerr(r, "format width or precision above 4096 is not supported");
		switch (conv) {
		case 's':
		case 'r': {
			struct hp_jval *x;
			size_t len, ncp;
			int left = strchr(flags, '-') != NULL;

			if (conv == 's') {
				x = to_str(r, arg);
			} else {
				struct sbuf t = sb_new(r);

				if (put_repr(r, &t, arg, 0))
					return t.oom ? room(r) : NULL;
				x = sb_fin(r, &t);
			}
			if (!x)
				return NULL;
			len = x->s.len;
			ncp = x->s.ncp;
			if (prec >= 0 && (size_t)prec < ncp) {
				len = cp_off(x, (size_t)prec);
				ncp = (size_t)prec;
			}
			if (!left)
				for (size_t k = ncp; (int)k < width; k++)
					sb_ch(&b, ' ', 0);
			sb_put(&b, x->s.s, len, x->s.tag, 0);
			if (left)
				for (size_t k = ncp; (int)k < width; k++)
					sb_ch(&b, ' ', 0);
			break;
		}
		case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': case 'c': {
			long long v;

			if (arg->type == JV_FLOAT && conv != 'c' && conv != 'x' && conv != 'X' && conv != 'o') {
				if (!isfinite(arg->f))
					return rerr(r, "cannot convert float infinity or NaN to integer");
				/* Python's ints are unbounded, hp's int64 (see jinja.h) */
				if (!(arg->f > -9223372036854775808.0 && arg->f < 9223372036854775808.0))
					return rerr(r, "%%%c of %g: outside the 64-bit integers", conv, arg->f);
				v = (long long)arg->f;
			} else if (arg->type == JV_INT || arg->type == JV_BOOL) {
				v = arg->i;
			} else if (conv == 'c' && arg->type == JV_STR && arg->s.ncp == 1) {
				sb_val(&b, arg);
				break;
			} else {
				return rerr(r, "%%%c format: a real number is required, not %s", conv,
					    type_name(arg));
			}
			if (conv == 'c') {
				char o[4];

				if (v < 0 || v > 0x10FFFF)
					return rerr(r, "%%c arg not in range(0x110000)");
				sb_put(&b, o, hp_utf8_encode((uint32_t)v, (unsigned char *)o), NULL, 0);
				break;
			}
			if (conv == 'u' || conv == 'i')
				conv = 'd';
			sb_conv(&b, flags, width, prec, (char[]){ 'l', 'l', conv, '\0' }, v);
			break;
		}
		case 'f': case 'F': case 'e': case 'E': case 'g': case 'G':
			if (!isnum(arg))
				return rerr(r, "must be real number, not %s", type_name(arg));
			sb_conv(&b, flags, width, prec, (char[]){ conv, '\0' }, numf(arg));
			break;
		default:
			return rerr(r, "unsupported format character '%c'", conv);
		}
	}
	if (!mapping && argi < na && !(av == single && args->type == JV_LIST && !(args->flags & JF_TUPLE) && 0))
		return rerr(r, "not all arguments converted during string formatting");
	return sb_fin(r, &b);
}

/* --- tests ----------------------------------------------------------------- */
static int contains(struct rs *r, struct hp_jval *seq, struct hp_jval *x)
{
	switch (seq->type) {
	case JV_STR:
		if (x->type != JV_STR) {
			rerr(r, "'in <string>' requires string as left operand, not %s", type_name(x));
			return -1;
		}
		return mem_find(seq->s.s, seq->s.len, x->s.s, x->s.len) != NULL;
	case JV_LIST:
		for (size_t i = 0; i < seq->l.n; i++)
			if (py_eq(seq->l.v[i], x))
				return 1;
		return 0;
	case JV_DICT:
		if (x->type == JV_LIST && !(x->flags & JF_TUPLE)) {
			rerr(r, "unhashable type: 'list'");
			return -1;
		}
		if (x->type == JV_DICT) {
			rerr(r, "unhashable type: 'dict'");
			return -1;
		}
		for (size_t i = 0; i < seq->d.n; i++)
			if (py_eq(seq->d.e[i].k, x))
				return 1;
		return 0;
	case JV_UNDEF:
		return 0;
	}
	rerr(r, "argument of type '%s' is not iterable", type_name(seq));
	return -1;
}

static int do_test(struct rs *r, int id, struct hp_jval *v, struct hp_jval **args, int nargs)
{
	struct hp_jval *a = nargs ? args[0] : NULL;
	int c;

	switch (id) {
	case X_DEFINED: return v->type != JV_UNDEF;
	case X_UNDEFINED: return v->type == JV_UNDEF;
	case X_NONE: return v->type == JV_NONE;
	case X_BOOLEAN: return v->type == JV_BOOL;
	case X_FALSE: return v->type == JV_BOOL && !v->i;
	case X_TRUE: return v->type == JV_BOOL && v->i;
	case X_INTEGER: return v->type == JV_INT;
	case X_FLOAT: return v->type == JV_FLOAT;
	case X_NUMBER: return isnum(v);
	case X_STRING: return v->type == JV_STR;
	case X_MAPPING: return v->type == JV_DICT;
	case X_ITERABLE:
	case X_SEQUENCE:
		return v->type == JV_STR || v->type == JV_LIST || v->type == JV_DICT || v->type == JV_UNDEF;
	case X_CALLABLE:
		return v->type == JV_FUNC || v->type == JV_METHOD || v->type == JV_MACRO || v->type == JV_UNDEF;
	case X_ESCAPED:
		return 0;
	}
	if (id == X_ODD || id == X_EVEN) {
		struct hp_jval two = { .type = JV_INT, .i = 2 }, *m = binop(r, OP_MOD, v, &two);

		if (!m)
			return -1;
		return id == X_ODD ? py_eq(m, VBOOL(1)) : py_eq(m, VBOOL(0));
	}
	if (id == X_LOWER || id == X_UPPER) {
		/* str(value).islower() */
		struct hp_jval *sv = to_str(r, v);

		return sv ? s_iscase(sv, id == X_UPPER) : -1;
	}
	if (id == X_FILTER || id == X_TEST) {
		if (v->type != JV_STR || strlen(v->s.s) != v->s.len)
			return 0;
		if (id == X_TEST)
			return name_index(test_names, X_N, v->s.s) >= 0;
		if (name_index(filter_names, F_N, v->s.s) >= 0)
			return 1;
		for (int i = 0; filter_unsup[i]; i++)
			if (!strcmp(filter_unsup[i], v->s.s))
				return 1;
		return 0;
	}
	if (!a) {
		rerr(r, "test '%s' needs an argument", test_names[id]);
		return -1;
	}
	switch (id) {
	case X_DIVISIBLEBY: {
		struct hp_jval *m = binop(r, OP_MOD, v, a);

		return m ? py_eq(m, VBOOL(0)) : -1;
	}
	case X_EQ: case X_EQUALTO: case X_OPEQ: return py_eq(v, a);
	case X_NE: case X_OPNE: return !py_eq(v, a);
	case X_LT: case X_LESSTHAN: case X_OPLT: return py_cmp(r, v, a, &c) ? -1 : c < 0;
	case X_LE: case X_OPLE: return py_cmp(r, v, a, &c) ? -1 : c <= 0;
	case X_GT: case X_GREATERTHAN: case X_OPGT: return py_cmp(r, v, a, &c) ? -1 : c > 0;
	case X_GE: case X_OPGE: return py_cmp(r, v, a, &c) ? -1 : c >= 0;
	case X_IN: return contains(r, a, v);
	case X_SAMEAS:
		if (v->type != a->type)
			return 0;
		if (v->type == JV_NONE || v->type == JV_UNDEF)
			return v == a || v->type == JV_NONE;
		if (v->type == JV_BOOL || v->type == JV_INT)
			return v->i == a->i;
		return v == a;
	}
	rerr(r, "unknown test");
	return -1;
}

/* a test named by a string argument (select, reject, ...) */
static int test_by_name(struct rs *r, struct hp_jval *name)
{
	int id;

	if (name->type != JV_STR)
		return (rerr(r, "a test name must be a string"), -1);
	id = name_index(test_names, X_N, name->s.s);
	if (id < 0 || strlen(name->s.s) != name->s.len)
		return (rerr(r, "no test named '%.*s'", (int)(name->s.len > 100 ? 100 : name->s.len),
			     name->s.s), -1);
	return id;
}

/* --- filters ---------------------------------------------------------------- */
static struct hp_jval *apply_filter(struct rs *r, int id, struct args *a);

/* jinja's make_attrgetter: "a.b.0" as item lookups, digits as integers */
static struct hp_jval *attr_path(struct rs *r, struct hp_jval *x, struct hp_jval *path)
{
	size_t i = 0;

	if (path->type == JV_INT) {
		return get_item(r, x, path);
	}
	if (path->type != JV_STR)
		return rerr(r, "an attribute must be a string or an integer");
	while (i <= path->s.len) {
		const char *p = memchr(path->s.s + i, '.', path->s.len - i);
		size_t e = p ? (size_t)(p - path->s.s) : path->s.len, k;
		int digits = e > i;

		for (k = i; k < e; k++)
			digits &= isdig(path->s.s[k]);
		if (digits && e - i < 18) {
			struct hp_jval key = { .type = JV_INT, .i = strtoll(path->s.s + i, NULL, 10) };

			x = get_item(r, x, &key);
		} else {
			struct hp_jval *key = sub(r, path, i, e - i);

			x = key ? get_item(r, x, key) : NULL;
		}
		if (!x)
			return NULL;
		i = e + 1;
		if (!p)
			break;
	}
	return x;
}

/* the sort key: lower-cased when a string and not case sensitive */
static struct hp_jval *sort_key(struct rs *r, struct hp_jval *x, struct hp_jval *attr, int cs)
{
	if (attr && attr->type != JV_NONE) {
		x = attr_path(r, x, attr);
		if (!x)
			return NULL;
	}
	if (!cs && x->type == JV_STR)
		return s_case(r, x, HOW_LOWER);
	return x;
}

/* stable merge sort of v[0, n) by keys k (same permutation); -1 on a failed comparison */
static int msort(struct rs *r, struct hp_jval **v, struct hp_jval **k, size_t n, int rev,
		 struct hp_jval **tv, struct hp_jval **tk)
{
	size_t h = n / 2, i = 0, j = h, o = 0;

	if (n < 2)
		return 0;
	if (msort(r, v, k, h, rev, tv, tk) || msort(r, v + h, k + h, n - h, rev, tv, tk))
		return -1;
	while (i < h && j < n) {
		int c;

		if (py_cmp(r, k[j], k[i], &c))
			return -1;
		/* take from the right only when strictly before (stable either way) */
		if (rev ? c > 0 : c < 0) {
			tv[o] = v[j];
			tk[o++] = k[j++];
		} else {
			tv[o] = v[i];
			tk[o++] = k[i++];
		}
	}
	while (i < h) {
		tv[o] = v[i];
		tk[o++] = k[i++];
	}
	while (j < n) {
		tv[o] = v[j];
		tk[o++] = k[j++];
	}
	memcpy(v, tv, n * sizeof(*v));
	memcpy(k, tk, n * sizeof(*k));
	return 0;
}

static struct hp_jval *sorted(struct rs *r, struct hp_jval *items, struct hp_jval **keys, int rev)
{
	size_t n = items->l.n;
	struct hp_jval *l = mklist(r, n, 0), **tv, **tk;

	if (!l)
		return NULL;
	tv = ral(r, (n + 1) * sizeof(*tv));
	tk = ral(r, (n + 1) * sizeof(*tk));
	if (!tv || !tk)
		return NULL;
	if (n)
		memcpy(l->l.v, items->l.v, n * sizeof(*l->l.v));
	l->l.n = n;
	if (msort(r, l->l.v, keys, n, rev, tv, tk))
		return NULL;
	return l;
}

static struct hp_jval *mktuple2(struct rs *r, struct hp_jval *a, struct hp_jval *b)
{
	struct hp_jval *t = mklist(r, 2, JF_TUPLE);

	if (!t)
		return NULL;
	t->l.v[0] = a;
	t->l.v[1] = b;
	t->l.n = 2;
	return t;
}

static struct hp_jval *dict_items(struct rs *r, struct hp_jval *d, int flags)
{
	struct hp_jval *l = mklist(r, d->d.n, flags);

	if (!l)
		return NULL;
	for (size_t i = 0; i < d->d.n; i++) {
		struct hp_jval *x = flags == JF_KEYS ? d->d.e[i].k : flags == JF_VALUES ? d->d.e[i].v
				    : mktuple2(r, d->d.e[i].k, d->d.e[i].v);

		if (!x)
			return NULL;
		l->l.v[l->l.n++] = x;
	}
	return l;
}

static struct hp_jval *f_tojson(struct rs *r, struct hp_jval *v, struct hp_jval **p)
{
	struct jopt o = { 0 };
	struct sbuf b = sb_new(r);
	static struct hp_jval comma_sp = { .type = JV_STR, .flags = JF_ASCII, .s = { ", ", NULL, 2, 2 } };
	static struct hp_jval comma = { .type = JV_STR, .flags = JF_ASCII, .s = { ",", NULL, 1, 1 } };
	static struct hp_jval colon_sp = { .type = JV_STR, .flags = JF_ASCII, .s = { ": ", NULL, 2, 2 } };

	o.ascii = p[0] && truthy(p[0]);
	if (p[1] && p[1]->type != JV_NONE) {
		if (p[1]->type == JV_STR) {
			o.indent = p[1];
		} else if (p[1]->type == JV_INT || p[1]->type == JV_BOOL) {
			int64_t k = p[1]->i < 0 ? 0 : p[1]->i;

			if (k > 1024)
				return rerr(r, "tojson indent above 1024 is not supported");
			o.indent = repeat(r, &v_space, k);
			if (!o.indent)
				return NULL;
		} else {
			return rerr(r, "tojson: indent must be an int or a string");
		}
	}
	o.isep = o.indent ? &comma : &comma_sp;
	o.ksep = &colon_sp;
	if (p[2] && p[2]->type != JV_NONE) {
		if (p[2]->type != JV_LIST || p[2]->l.n != 2 || p[2]->l.v[0]->type != JV_STR ||
		    p[2]->l.v[1]->type != JV_STR)
			return rerr(r, "tojson: separators must be a pair of strings");
		o.isep = p[2]->l.v[0];
		o.ksep = p[2]->l.v[1];
	}
	o.sort = p[3] && truthy(p[3]);
	if (put_json(r, &b, v, &o, 0))
		return b.oom ? room(r) : NULL;
	return sb_fin(r, &b);
}

/*
 * The line of s that starts at *i, as str.splitlines() breaks lines: its end
 * before the line break, with *i moved past the break ("\r\n" is one).
 */
static size_t line_end(const struct hp_jval *s, size_t *i)
{
	size_t n = s->s.len, e;
	uint32_t c = 0;

	for (;;) {
		e = *i;
		if (*i >= n)
			break;
		c = u8dec(s->s.s, n, i);
		if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
		    c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029)
			break;
	}
	if (c == '\r' && *i < n && s->s.s[*i] == '\n')
		(*i)++;
	return e;
}

static struct hp_jval *f_indent(struct rs *r, struct hp_jval *s, struct hp_jval **p)
{
	struct hp_jval *ind, *lines, *nl;
	struct sbuf b = sb_new(r);
	int first = p[1] && truthy(p[1]), blank = p[2] && truthy(p[2]);
	size_t i = 0;

	if (p[0] && p[0]->type == JV_STR) {
		ind = p[0];
	} else {
		int64_t w = 4;

		if (p[0] && need_int(r, p[0], "indent", &w))
			return NULL;
		if (w > 4096)
			return rerr(r, "indent width above 4096 is not supported");
		ind = repeat(r, &v_space, w);
		if (!ind)
			return NULL;
	}
	/* s += "\n"; s.splitlines() (the line breaks of str.splitlines) */
	nl = mkstrc(r, "\n", 1);
	s = nl ? concat2(r, s, nl) : NULL;
	lines = s ? mklist(r, 0, 0) : NULL;
	if (!lines)
		return NULL;
	while (i < s->s.len) {
		size_t a = i, e = line_end(s, &i);

		if (push(r, lines, sub(r, s, a, e - a)))
			return NULL;
	}
	if (first)
		sb_val(&b, ind);
	for (size_t k = 0; k < lines->l.n; k++) {
		struct hp_jval *ln = lines->l.v[k];

		if (k)
			sb_ch(&b, '\n', 0);
		if (k && (blank || ln->s.len))
			sb_val(&b, ind);
		sb_val(&b, ln);
	}
	return sb_fin(r, &b);
}

static struct hp_jval *f_escape(struct rs *r, struct hp_jval *s)
{
	struct sbuf b = sb_new(r);

	for (size_t i = 0; i < s->s.len; i++) {
		const char *e = NULL;
		uint16_t tg = s->s.tag ? s->s.tag[i] : 0;

		switch (s->s.s[i]) {
		case '&': e = "&amp;"; break;
		case '<': e = "&lt;"; break;
		case '>': e = "&gt;"; break;
		case '"': e = "&#34;"; break;
		case '\'': e = "&#39;"; break;
		}
		if (e)
			sb_str(&b, e, tg);
		else
			sb_put(&b, s->s.s + i, 1, NULL, tg);
	}
	return sb_fin(r, &b);
}

/*
 * The text of a number as Python's int() and float() read it: s without its
 * surrounding whitespace and without the underscores between digits, into
 * buf[80]; 0 when that leaves nothing or more than fits.
 */
static size_t py_numtext(const struct hp_jval *s, char *buf)
{
	size_t k = 0, i = 0, n = s->s.len;

	while (i < n && py_isspace((unsigned char)s->s.s[i]))
		i++;
	while (n > i && py_isspace((unsigned char)s->s.s[n - 1]))
		n--;
	for (; i < n && k < 79; i++) {
		if (s->s.s[i] == '_' && k && isdig(buf[k - 1]) && i + 1 < n && isdig(s->s.s[i + 1]))
			continue;
		buf[k++] = s->s.s[i];
	}
	buf[k] = '\0';
	return i < n ? 0 : k;
}

/* Python int(str, base) for base 10 and float(str), as jinja's int/float filters use */
static int parse_pyint(const struct hp_jval *s, int base, int64_t *out)
{
	char buf[80];
	char *end;

	if (!py_numtext(s, buf))
		return -1;
	errno = 0;
	*out = strtoll(buf, &end, base);
	if (*end || errno || buf[0] == ' ')
		return -1;
	return 0;
}

static int parse_pyfloat(const struct hp_jval *s, double *out)
{
	char buf[80];
	char *end;

	if (!py_numtext(s, buf) || (buf[0] == '0' && (buf[1] | 32) == 'x') ||
	    ((buf[0] == '-' || buf[0] == '+') && buf[1] == '0' && (buf[2] | 32) == 'x'))
		return -1;
	*out = strtod(buf, &end);
	return *end ? -1 : 0;
}

static struct hp_jval *f_round(struct rs *r, struct hp_jval *v, struct hp_jval **p)
{
	int64_t prec = 0;
	const char *method = "common";
	double x, m;
	char buf[400];

	if (p[0] && need_int(r, p[0], "round", &prec))
		return NULL;
	if (p[1]) {
		if (p[1]->type != JV_STR)
			return rerr(r, "method must be a string");
		method = p[1]->s.s;
	}
	if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
		return rerr(r, "method must be 'common', 'ceil' or 'floor'");
	if (!isnum(v))
		return rerr(r, "type %s doesn't define __round__ method", type_name(v));
	if (!strcmp(method, "common")) {
		if (v->type != JV_FLOAT)
			return prec >= 0 ? mkint(r, v->i) : rerr(r, "round() of an int to negative digits is not supported");
		if (prec < 0 || prec > 300 || !isfinite(v->f)) {
			if (!isfinite(v->f) || prec > 300)
				return mkfloat(r, v->f);
			m = pow(10.0, (double)-prec);
			return mkfloat(r, nearbyint(v->f / m) * m);
		}
		snprintf(buf, sizeof(buf), "%.*f", (int)prec, v->f);
		return mkfloat(r, strtod(buf, NULL));
	}
	if (prec > 300 || prec < -300)
		return rerr(r, "round precision out of range");
	m = pow(10.0, (double)prec);
	x = numf(v) * m;
	x = !strcmp(method, "ceil") ? ceil(x) : floor(x);
	return mkfloat(r, x / m);
}

static struct hp_jval *f_join(struct rs *r, struct hp_jval *v, struct hp_jval *d, struct hp_jval *attr,
			      int strict)
{
	struct hp_jval *items = iter_list(r, v);
	struct sbuf b = sb_new(r);

	if (!items)
		return NULL;
	if (d && d->type != JV_STR) {
		if (strict)
			return rerr(r, "join() argument must be str, not %s", type_name(d));
		d = to_str(r, d);
		if (!d)
			return NULL;
	}
	for (size_t i = 0; i < items->l.n; i++) {
		struct hp_jval *x = items->l.v[i];

		if (i && d)
			sb_val(&b, d);
		if (attr && attr->type != JV_NONE && !(x = attr_path(r, x, attr)))
			return NULL;
		if (strict && x->type != JV_STR)
			return rerr(r, "sequence item %zu: expected str instance, %s found", i, type_name(x));
		if (put_str(r, &b, x))
			return b.oom ? room(r) : NULL;
	}
	return sb_fin(r, &b);
}

static struct hp_jval *f_select(struct rs *r, int id, struct args *a)
{
	struct hp_jval *items = iter_list(r, a->pos[0]), *out;
	int attr = id == F_SELECTATTR || id == F_REJECTATTR, want = id == F_SELECT || id == F_SELECTATTR;
	int base = attr ? 2 : 1, tid = -1;

	if (!items || !(out = mklist(r, 0, 0)))
		return NULL;
	if (a->nk)
		return rerr(r, "%s takes no keyword arguments", filter_names[id]);
	if (attr && a->np < 2)
		return rerr(r, "%s needs an attribute", filter_names[id]);
	if (a->np > base && (tid = test_by_name(r, a->pos[base])) < 0)
		return NULL;
	for (size_t i = 0; i < items->l.n; i++) {
		struct hp_jval *x = items->l.v[i], *y = x;
		int t;

		if (attr && !(y = attr_path(r, x, a->pos[1])))
			return NULL;
		t = tid < 0 ? truthy(y) : do_test(r, tid, y, a->pos + base + 1, a->np - base - 1);
		if (t < 0)
			return NULL;
		if (t == want && push(r, out, x))
			return NULL;
	}
	return out;
}

static struct hp_jval *f_map(struct rs *r, struct args *a)
{
	struct hp_jval *items = iter_list(r, a->pos[0]), *out, *attr = NULL, *dflt = NULL;
	int fid = -1;

	if (!items || !(out = mklist(r, items->l.n, 0)))
		return NULL;
	for (int k = 0; k < a->nk; k++) {
		if (!strcmp(a->kn[k], "attribute"))
			attr = a->kv[k];
		else if (!strcmp(a->kn[k], "default"))
			dflt = a->kv[k];
	}
	if (!attr) {
		if (a->np < 2 || a->pos[1]->type != JV_STR)
			return rerr(r, "map requires a filter argument");
		fid = name_index(filter_names, F_N, a->pos[1]->s.s);
		if (fid < 0)
			return rerr(r, "no filter named '%.*s'", (int)(a->pos[1]->s.len > 100 ? 100 : a->pos[1]->s.len),
				    a->pos[1]->s.s);
	}
	for (size_t i = 0; i < items->l.n; i++) {
		struct hp_jval *y;

		if (attr) {
			y = attr_path(r, items->l.v[i], attr);
			if (y && y->type == JV_UNDEF && dflt)
				y = dflt;
		} else {
			struct args fa = *a;

			/* the filter's own arguments follow its name */
			fa.pos = ral(r, (size_t)a->np * sizeof(*fa.pos));
			if (!fa.pos)
				return NULL;
			fa.pos[0] = items->l.v[i];
			for (int k = 2; k < a->np; k++)
				fa.pos[k - 1] = a->pos[k];
			fa.np = a->np - 1;
			y = apply_filter(r, fid, &fa);
		}
		if (!y)
			return NULL;
		out->l.v[out->l.n++] = y;
	}
	return out;
}

static struct hp_jval *f_minmax(struct rs *r, struct hp_jval *v, struct hp_jval **p, int max)
{
	struct hp_jval *items = iter_list(r, v), *best = NULL, *bk = NULL;
	int cs = p[0] && truthy(p[0]);

	if (!items)
		return NULL;
	for (size_t i = 0; i < items->l.n; i++) {
		struct hp_jval *k = sort_key(r, items->l.v[i], p[1], cs);
		int c;

		if (!k)
			return NULL;
		if (best) {
			if (py_cmp(r, k, bk, &c))
				return NULL;
			if (max ? c <= 0 : c >= 0)
				continue;
		}
		best = items->l.v[i];
		bk = k;
	}
	if (best && p[1] && p[1]->type != JV_NONE)
		return best;
	return best ? best : mkundef(r, UN_MSG, "No aggregated item, sequence was empty.", 39, NULL);
}

static int64_t length_of(struct rs *r, struct hp_jval *v)
{
	switch (v->type) {
	case JV_STR: return (int64_t)v->s.ncp;
	case JV_LIST: return (int64_t)v->l.n;
	case JV_DICT: return (int64_t)v->d.n;
	case JV_UNDEF: return 0;
	}
	rerr(r, "object of type '%s' has no len()", type_name(v));
	return -1;
}

/*
 * Inside a filter, method or global with arguments a and room p[] for them:
 * bind the arguments after the first skip to the names given, in order, or
 * refuse any; on a mismatch return NULL with the error.  A filter's value is
 * its argument 0 (skip 1); methods and globals bind from 0.
 */
#define BIND_AT(what, skip, ...) do { \
	static const char *const nm_[] = { __VA_ARGS__ }; \
	if (bind(r, what, a, skip, nm_, (int)(sizeof(nm_) / sizeof(nm_[0])), p)) \
		return NULL; \
} while (0)
#define NOARGS_AT(what, skip) do { \
	if (a->np > (skip) || a->nk) \
		return rerr(r, "%s() takes no arguments", what); \
} while (0)
#define BIND(...) BIND_AT(filter_names[id], 1, __VA_ARGS__)
#define NOARGS() NOARGS_AT(filter_names[id], 1)
#define MBIND(what, ...) BIND_AT(what, 0, __VA_ARGS__)
#define MNOARGS(what) NOARGS_AT(what, 0)

static struct hp_jval *apply_filter(struct rs *r, int id, struct args *a)
{
	struct hp_jval *v = a->pos[0], *p[4] = { NULL, NULL, NULL, NULL }, *s;
	int64_t k;

	/* filters that take anything, Undefined included */
	switch (id) {
	case F_D:
	case F_DEFAULT:
		BIND("default_value", "boolean");
		if (v->type == JV_UNDEF || (p[1] && truthy(p[1]) && !truthy(v)))
			return p[0] ? p[0] : &v_empty;
		return v;
	case F_LENGTH:
	case F_COUNT:
		NOARGS();
		k = length_of(r, v);
		return k < 0 ? NULL : mkint(r, k);
	case F_STRING:
		NOARGS();
		return to_str(r, v);
	case F_SAFE:
		NOARGS();
		return to_str(r, v);
	case F_TOJSON:
		BIND("ensure_ascii", "indent", "separators", "sort_keys");
		return f_tojson(r, v, p);
	case F_LIST:
		NOARGS();
		s = iter_list(r, v);
		if (s && s == v && (v->flags & (JF_TUPLE | JF_ITEMS | JF_KEYS | JF_VALUES))) {
			struct hp_jval *l = mklist(r, v->l.n, 0);

			if (!l)
				return NULL;
			memcpy(l->l.v, v->l.v, v->l.n * sizeof(*l->l.v));
			l->l.n = v->l.n;
			return l;
		}
		return s;
	case F_JOIN:
		BIND("d", "attribute");
		return f_join(r, v, p[0], p[1], 0);
	case F_SELECT:
	case F_REJECT:
	case F_SELECTATTR:
	case F_REJECTATTR:
		return f_select(r, id, a);
	case F_MAP:
		return f_map(r, a);
	case F_ITEMS:
		NOARGS();
		if (v->type == JV_UNDEF)
			return mklist(r, 0, 0);
		if (v->type != JV_DICT)
			return rerr(r, "can only get item pairs from a mapping");
		return dict_items(r, v, 0);
	case F_FIRST:
	case F_LAST:
		NOARGS();
		if (v->type == JV_UNDEF && id == F_LAST)
			return undef_err(r, v);
		s = iter_list(r, v);
		if (!s)
			return NULL;
		if (!s->l.n)
			return mkundef(r, UN_MSG, id == F_FIRST ? "No first item, sequence was empty."
							       : "No last item, sequence was empty.", 34, NULL);
		return s->l.v[id == F_FIRST ? 0 : s->l.n - 1];
	case F_REVERSE:
		NOARGS();
		if (v->type == JV_STR) {
			struct hp_jval m1 = { .type = JV_INT, .i = -1 };

			return get_slice(r, v, NULL, NULL, &m1);
		}
		s = iter_list(r, v);
		if (!s)
			return NULL;
		{
			struct hp_jval *l = mklist(r, s->l.n, 0);

			if (!l)
				return NULL;
			for (size_t i = s->l.n; i-- > 0;)
				l->l.v[l->l.n++] = s->l.v[i];
			return l;
		}
	case F_SORT:
	case F_UNIQUE:
	case F_DICTSORT: {
		struct hp_jval *items, **keys;
		int cs, rev = 0;

		if (id == F_SORT) {
			BIND("reverse", "case_sensitive", "attribute");
			rev = p[0] && truthy(p[0]);
			cs = p[1] && truthy(p[1]);
			items = iter_list(r, v);
		} else if (id == F_UNIQUE) {
			BIND("case_sensitive", "attribute");
			cs = p[0] && truthy(p[0]);
			p[2] = p[1];
			items = iter_list(r, v);
		} else {
			BIND("case_sensitive", "by", "reverse");
			cs = p[0] && truthy(p[0]);
			rev = p[2] && truthy(p[2]);
			if (v->type != JV_DICT)
				return rerr(r, "dictsort needs a mapping");
			items = dict_items(r, v, 0);
			if (p[1] && (p[1]->type != JV_STR || (strcmp(p[1]->s.s, "key") && strcmp(p[1]->s.s, "value"))))
				return rerr(r, "You can only sort by either \"key\" or \"value\"");
		}
		if (!items)
			return NULL;
		keys = ral(r, (items->l.n + 1) * sizeof(*keys));
		if (!keys)
			return NULL;
		for (size_t i = 0; i < items->l.n; i++) {
			struct hp_jval *x = items->l.v[i];

			if (id == F_DICTSORT)
				x = x->l.v[p[1] && !strcmp(p[1]->s.s, "value") ? 1 : 0];
			keys[i] = sort_key(r, x, id == F_DICTSORT ? NULL : p[2], cs);
			if (!keys[i])
				return NULL;
		}
		if (id != F_UNIQUE)
			return sorted(r, items, keys, rev);
		{
			struct hp_jval *out = mklist(r, 0, 0);

			if (!out)
				return NULL;
			for (size_t i = 0; i < items->l.n; i++) {
				size_t j;

				if (keys[i]->type == JV_DICT || (keys[i]->type == JV_LIST && !(keys[i]->flags & JF_TUPLE)))
					return rerr(r, "unhashable type: '%s'", type_name(keys[i]));
				for (j = 0; j < i; j++)
					if (py_eq(keys[j], keys[i]))
						break;
				if (j == i && push(r, out, items->l.v[i]))
					return NULL;
			}
			return out;
		}
	}
	case F_SUM: {
		struct hp_jval *items, *acc;

		BIND("attribute", "start");
		items = iter_list(r, v);
		acc = p[1] ? p[1] : mkint(r, 0);
		if (!items || !acc)
			return NULL;
		for (size_t i = 0; i < items->l.n; i++) {
			struct hp_jval *x = items->l.v[i];

			if (p[0] && !(x = attr_path(r, x, p[0])))
				return NULL;
			if (acc->type == JV_STR || x->type == JV_STR)
				return rerr(r, "unsupported operand type(s) for +: '%s' and '%s'",
					    type_name(acc), type_name(x));
			if (!(acc = binop(r, OP_ADD, acc, x)))
				return NULL;
		}
		return acc;
	}
	case F_MAX:
	case F_MIN:
		BIND("case_sensitive", "attribute");
		return f_minmax(r, v, p, id == F_MAX);
	case F_ATTR:
		BIND("name");
		if (!p[0] || p[0]->type != JV_STR)
			return rerr(r, "attr() needs a name");
		if (v->type == JV_DICT && !in_list(dict_methods, p[0]->s.s, p[0]->s.len))
			return mkundef(r, UN_ATTR, p[0]->s.s, p[0]->s.len, "dict");
		return get_attr(r, v, p[0]->s.s, p[0]->s.len);
	case F_BATCH: {
		struct hp_jval *items, *out, *cur = NULL;

		BIND("linecount", "fill_with");
		if (arg_int(r, p[0], "batch", "needs a line count", &k))
			return NULL;
		if (k <= 0)
			return rerr(r, "batch() needs a positive line count");
		items = iter_list(r, v);
		if (!items || !(out = mklist(r, 0, 0)))
			return NULL;
		for (size_t i = 0; i < items->l.n; i++) {
			if (!cur || (int64_t)cur->l.n == k) {
				if (!(cur = mklist(r, 0, 0)) || push(r, out, cur))
					return NULL;
			}
			if (push(r, cur, items->l.v[i]))
				return NULL;
		}
		if (cur && p[1] && p[1]->type != JV_NONE)
			while ((int64_t)cur->l.n < k)
				if (push(r, cur, p[1]))
					return NULL;
		return out;
	}
	case F_INT: {
		int64_t base = 10, x;

		BIND("default", "base");
		if (p[1] && need_int(r, p[1], "int", &base))
			return NULL;
		if (v->type == JV_INT)
			return v;
		if (v->type == JV_BOOL)
			return mkint(r, v->i);
		if (v->type == JV_FLOAT && isfinite(v->f) && fabs(v->f) < 9.2e18)
			return mkint(r, (int64_t)v->f);
		if (v->type == JV_STR) {
			double d;

			if ((base == 10 || base == 2 || base == 8 || base == 16) && !parse_pyint(v, (int)base, &x))
				return mkint(r, x);
			if (!parse_pyfloat(v, &d) && isfinite(d) && fabs(d) < 9.2e18)
				return mkint(r, (int64_t)d);
		}
		return p[0] ? p[0] : mkint(r, 0);
	}
	case F_FLOAT: {
		double d;

		BIND("default");
		if (v->type == JV_FLOAT)
			return v;
		if (v->type == JV_INT || v->type == JV_BOOL)
			return mkfloat(r, (double)v->i);
		if (v->type == JV_STR && !parse_pyfloat(v, &d))
			return mkfloat(r, d);
		return p[0] ? p[0] : mkfloat(r, 0.0);
	}
	case F_ABS:
		NOARGS();
		if (v->type == JV_FLOAT)
			return mkfloat(r, fabs(v->f));
		if (v->type == JV_INT || v->type == JV_BOOL) {
			if (v->i == INT64_MIN)
				return rerr(r, "integer overflow (integers are 64-bit here)");
			return mkint(r, v->i < 0 ? -v->i : v->i);
		}
		if (v->type == JV_UNDEF)
			return undef_err(r, v);
		return rerr(r, "bad operand type for abs(): '%s'", type_name(v));
	case F_ROUND:
		BIND("precision", "method");
		return f_round(r, v, p);
	case F_FORMAT: {
		struct hp_jval *args;

		if (!(s = to_str(r, v)))
			return NULL;
		if (a->np > 1 && a->nk)
			return rerr(r, "can't handle positional and keyword arguments at the same time");
		if (a->nk) {
			args = mk(r, JV_DICT);
			if (!args)
				return NULL;
			for (int i = 0; i < a->nk; i++) {
				struct hp_jval *kk = mkstrc(r, a->kn[i], strlen(a->kn[i]));

				if (!kk || dict_put(&r->ar, args, kk, a->kv[i]))
					return room(r);
			}
		} else {
			args = mklist(r, (size_t)a->np, JF_TUPLE);
			if (!args)
				return NULL;
			for (int i = 1; i < a->np; i++)
				args->l.v[args->l.n++] = a->pos[i];
		}
		return str_format(r, s, args);
	}
	}
	/* string filters: soft_str of the value */
	if (v->type == JV_UNDEF && id != F_TRIM && id != F_UPPER && id != F_LOWER && id != F_CAPITALIZE &&
	    id != F_TITLE && id != F_REPLACE && id != F_INDENT && id != F_WORDCOUNT && id != F_ESCAPE &&
	    id != F_E && id != F_FORCEESCAPE && id != F_CENTER)
		return undef_err(r, v);
	if (!(s = to_str(r, v)))
		return NULL;
	switch (id) {
	case F_TRIM:
		BIND("chars");
		return s_strip(r, s, p[0], "trim", 1, 1);
	case F_UPPER:
		NOARGS();
		return s_case(r, s, HOW_UPPER);
	case F_LOWER:
		NOARGS();
		return s_case(r, s, HOW_LOWER);
	case F_CAPITALIZE:
		NOARGS();
		return s_case(r, s, HOW_CAPITALIZE);
	case F_TITLE:
		NOARGS();
		return f_title(r, s);
	case F_REPLACE:
		BIND("old", "new", "count");
		k = -1;
		if (!p[0] || !p[1])
			return rerr(r, "replace() needs old and new");
		if (p[2] && p[2]->type != JV_NONE && need_int(r, p[2], "replace", &k))
			return NULL;
		{
			struct hp_jval *o = to_str(r, p[0]), *nw = o ? to_str(r, p[1]) : NULL;

			return nw ? s_replace(r, s, o, nw, k) : NULL;
		}
	case F_INDENT:
		BIND("width", "first", "blank");
		return f_indent(r, s, p);
	case F_WORDCOUNT: {
		size_t i = 0;
		int64_t words = 0;
		int in = 0;

		NOARGS();
		while (i < s->s.len) {
			uint32_t c = u8dec(s->s.s, s->s.len, &i);
			int w = c == '_' || py_isalnum(c);

			words += w && !in;
			in = w;
		}
		return mkint(r, words);
	}
	case F_E:
	case F_ESCAPE:
	case F_FORCEESCAPE:
		NOARGS();
		return f_escape(r, s);
	case F_CENTER:
		BIND("width");
		k = 80;
		if (p[0] && need_int(r, p[0], "center", &k))
			return NULL;
		return s_pad(r, s, k, NULL, 0);
	}
	return rerr(r, "filter '%s' is not supported", filter_names[id]);
}

/* --- methods and globals ---------------------------------------------------- */
enum { G_RANGE, G_DICT, G_NAMESPACE, G_RAISE, G_STRFTIME };
static struct hp_jval g_funcs[] = {
	{ .type = JV_FUNC, .aux = G_RANGE },
	{ .type = JV_FUNC, .aux = G_DICT },
	{ .type = JV_FUNC, .aux = G_NAMESPACE },
	{ .type = JV_FUNC, .aux = G_RAISE },
	{ .type = JV_FUNC, .aux = G_STRFTIME },
};
static const char *const g_names[] = { "range", "dict", "namespace", "raise_exception", "strftime_now" };

static struct hp_jval *s_affix(struct rs *r, struct hp_jval *s, struct hp_jval *x, int end)
{
	struct hp_jval one[1] = { 0 }, **cands;
	size_t nc;

	(void)one;
	if (x->type == JV_STR) {
		cands = &x;
		nc = 1;
	} else if (x->type == JV_LIST && (x->flags & JF_TUPLE)) {
		cands = x->l.v;
		nc = x->l.n;
	} else {
		return rerr(r, "%s first arg must be str or a tuple of str, not %s",
			    end ? "endswith" : "startswith", type_name(x));
	}
	for (size_t i = 0; i < nc; i++) {
		struct hp_jval *c = cands[i];

		if (c->type != JV_STR)
			return rerr(r, "tuple for %s must only contain str", end ? "endswith" : "startswith");
		if (c->s.len <= s->s.len &&
		    !memcmp(s->s.s + (end ? s->s.len - c->s.len : 0), c->s.s, c->s.len))
			return &v_true;
	}
	return &v_false;
}

/* the str.isX() methods that hold when every character is in a class */
static const struct {
	const char *name;
	int (*pred)(uint32_t);
} char_classes[] = {
	{ "isdigit", py_isdigit }, { "isdecimal", py_isdigit }, { "isnumeric", py_isdigit },
	{ "isalpha", py_isalpha }, { "isalnum", py_isalnum }, { "isspace", py_isspace },
};

static struct hp_jval *str_method(struct rs *r, struct hp_jval *s, const char *m, struct args *a)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL };
	int64_t k;

	if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
		MBIND(m, "prefix");
		if (!p[0])
			return rerr(r, "%s() takes at least 1 argument", m);
		return s_affix(r, s, p[0], m[0] == 'e');
	}
	if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
		MBIND(m, "sep", "maxsplit");
		k = -1;
		if (p[1] && need_int(r, p[1], m, &k))
			return NULL;
		return s_split(r, s, p[0], k, m[0] == 'r');
	}
	if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
		MBIND(m, "chars");
		return s_strip(r, s, p[0], m, m[0] != 'r', m[0] != 'l');
	}
	if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize") ||
	    !strcmp(m, "swapcase") || !strcmp(m, "casefold")) {
		MNOARGS(m);
		return s_case(r, s, m[0] == 'u' ? HOW_UPPER : (m[0] == 'l' || (m[1] == 'a' && m[2] == 's')) ? HOW_LOWER
				 : m[0] == 't' ? HOW_TITLE : m[0] == 'c' ? HOW_CAPITALIZE : HOW_SWAP);
	}
	if (!strcmp(m, "replace")) {
		MBIND(m, "old", "new", "count");
		k = -1;
		if (!p[0] || !p[1])
			return rerr(r, "replace() takes at least 2 arguments");
		if (p[2] && need_int(r, p[2], m, &k))
			return NULL;
		return s_replace(r, s, p[0], p[1], k);
	}
	if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex") ||
	    !strcmp(m, "count")) {
		const char *hit;

		MBIND(m, "sub");
		if (!arg_str(r, p[0], m, "takes at least 1 argument"))
			return NULL;
		if (!strcmp(m, "count")) {
			size_t a0 = 0;
			int64_t cnt = 0;

			if (!p[0]->s.len)
				return mkint(r, (int64_t)s->s.ncp + 1);
			while ((hit = mem_find(s->s.s + a0, s->s.len - a0, p[0]->s.s, p[0]->s.len))) {
				cnt++;
				a0 = (size_t)(hit - s->s.s) + p[0]->s.len;
			}
			return mkint(r, cnt);
		}
		hit = m[0] == 'r' ? mem_rfind(s->s.s, s->s.len, p[0]->s.s, p[0]->s.len)
				  : mem_find(s->s.s, s->s.len, p[0]->s.s, p[0]->s.len);
		if (!hit)
			return !strcmp(m, "index") || !strcmp(m, "rindex") ? rerr(r, "substring not found") : mkint(r, -1);
		return mkint(r, cp_index(s, (size_t)(hit - s->s.s)));
	}
	if (!strcmp(m, "join")) {
		MBIND(m, "iterable");
		if (!p[0])
			return rerr(r, "join() takes exactly one argument");
		return f_join(r, p[0], s, NULL, 1);
	}
	for (size_t i = 0; i < sizeof(char_classes) / sizeof(char_classes[0]); i++)
		if (!strcmp(m, char_classes[i].name)) {
			MNOARGS(m);
			return VBOOL(all_chars(s, char_classes[i].pred));
		}
	if (!strcmp(m, "islower") || !strcmp(m, "isupper")) {
		MNOARGS(m);
		return VBOOL(s_iscase(s, m[2] == 'u'));
	}
	if (!strcmp(m, "center") || !strcmp(m, "ljust") || !strcmp(m, "rjust")) {
		MBIND(m, "width", "fillchar");
		if (arg_int(r, p[0], m, "takes at least 1 argument", &k))
			return NULL;
		return s_pad(r, s, k, p[1], m[0] == 'c' ? 0 : m[0] == 'l' ? -1 : 1);
	}
	if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
		int end = m[6] == 's';

		MBIND(m, "affix");
		if (!arg_str(r, p[0], m, "takes exactly one argument"))
			return NULL;
		if (p[0]->s.len <= s->s.len &&
		    !memcmp(s->s.s + (end ? s->s.len - p[0]->s.len : 0), p[0]->s.s, p[0]->s.len))
			return sub(r, s, end ? 0 : p[0]->s.len, s->s.len - p[0]->s.len);
		return s;
	}
	if (!strcmp(m, "partition") || !strcmp(m, "rpartition")) {
		const char *hit;
		struct hp_jval *t;

		MBIND(m, "sep");
		if (!arg_str(r, p[0], m, "takes exactly one argument"))
			return NULL;
		if (!p[0]->s.len)
			return rerr(r, "empty separator");
		hit = m[0] == 'r' ? mem_rfind(s->s.s, s->s.len, p[0]->s.s, p[0]->s.len)
				  : mem_find(s->s.s, s->s.len, p[0]->s.s, p[0]->s.len);
		t = mklist(r, 3, JF_TUPLE);
		if (!t)
			return NULL;
		if (!hit) {
			t->l.v[0] = m[0] == 'r' ? &v_empty : s;
			t->l.v[1] = &v_empty;
			t->l.v[2] = m[0] == 'r' ? s : &v_empty;
		} else {
			size_t o = (size_t)(hit - s->s.s);

			t->l.v[0] = sub(r, s, 0, o);
			t->l.v[1] = sub(r, s, o, p[0]->s.len);
			t->l.v[2] = sub(r, s, o + p[0]->s.len, s->s.len - o - p[0]->s.len);
			if (!t->l.v[0] || !t->l.v[1] || !t->l.v[2])
				return NULL;
		}
		t->l.n = 3;
		return t;
	}
	if (!strcmp(m, "splitlines")) {
		struct hp_jval *l = mklist(r, 0, 0);
		size_t i = 0;

		MBIND(m, "keepends");
		if (!l)
			return NULL;
		while (i < s->s.len) {
			size_t st = i, e = line_end(s, &i), nx;

			nx = p[0] && truthy(p[0]) ? i : e;
			if (push(r, l, sub(r, s, st, nx - st)))
				return NULL;
			if (e == s->s.len)
				break;
		}
		return l;
	}
	if (!strcmp(m, "zfill")) {
		MBIND(m, "width");
		if (arg_int(r, p[0], m, "takes exactly one argument", &k))
			return NULL;
		if (k <= (int64_t)s->s.ncp)
			return s;
		if (k > 4096)
			return rerr(r, "zfill width above 4096 is not supported");
		{
			struct sbuf b = sb_new(r);
			size_t o = 0;

			if (s->s.len && (s->s.s[0] == '-' || s->s.s[0] == '+')) {
				sb_put(&b, s->s.s, 1, s->s.tag, 0);
				o = 1;
			}
			for (int64_t i = (int64_t)s->s.ncp; i < k; i++)
				sb_ch(&b, '0', 0);
			sb_span(&b, s, o, s->s.len - o);
			return sb_fin(r, &b);
		}
	}
	return rerr(r, "str.%s() is not supported", m);
}

static struct hp_jval *call_method(struct rs *r, struct hp_jval *mv, struct args *a)
{
	struct hp_jval *self = mv->meth.self, *p[2] = { NULL, NULL };
	const char *m = mv->meth.name;

	if (self->type == JV_STR)
		return str_method(r, self, m, a);
	if (self->type == JV_LOOP) {
		if (a->nk)
			return rerr(r, "%s() takes no keyword arguments", m);
		if (!strcmp(m, "changed")) {
			/* loop.changed(*values): the values as a tuple against the last call's */
			struct hp_jval *t = mklist(r, (size_t)a->np, JF_TUPLE);
			int ch;

			if (!t)
				return NULL;
			memcpy(t->l.v, a->pos, (size_t)a->np * sizeof(*t->l.v));
			t->l.n = (size_t)a->np;
			ch = !self->loop->changed || !py_eq(self->loop->changed, t);
			self->loop->changed = t;
			return VBOOL(ch);
		}
		if (!a->np)
			return rerr(r, "no items for cycling given");
		return a->pos[self->loop->i % (size_t)a->np];
	}
	if (self->type == JV_DICT) {
		if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
			MNOARGS(m);
			return dict_items(r, self, m[0] == 'i' ? JF_ITEMS : m[0] == 'k' ? JF_KEYS : JF_VALUES);
		}
		if (!strcmp(m, "get")) {
			MBIND("get", "key", "default");
			if (!p[0])
				return rerr(r, "get expected at least 1 argument, got 0");
			for (size_t i = 0; i < self->d.n; i++)
				if (py_eq(self->d.e[i].k, p[0]))
					return self->d.e[i].v;
			return p[1] ? p[1] : &v_none;
		}
		if (!strcmp(m, "copy")) {
			MNOARGS(m);
			return self;
		}
	}
	if (self->type == JV_LIST) {
		if (!strcmp(m, "copy")) {
			MNOARGS(m);
			return self;
		}
		MBIND(m, "value");
		if (!p[0])
			return rerr(r, "%s() takes exactly one argument (0 given)", m);
		if (!strcmp(m, "count")) {
			int64_t c = 0;

			for (size_t i = 0; i < self->l.n; i++)
				c += py_eq(self->l.v[i], p[0]);
			return mkint(r, c);
		}
		for (size_t i = 0; i < self->l.n; i++)
			if (py_eq(self->l.v[i], p[0]))
				return mkint(r, (int64_t)i);
		return rerr(r, "value is not in list");
	}
	return rerr(r, "'%s' object has no method %s", type_name(self), m);
}

static struct hp_jval *call_global(struct rs *r, int g, struct args *a)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL };

	switch (g) {
	case G_RANGE: {
		int64_t v[3] = { 0, 0, 1 }, cnt;
		struct hp_jval *l;

		if (a->nk)
			return rerr(r, "range() takes no keyword arguments");
		if (a->np < 1 || a->np > 3)
			return rerr(r, "range expected 1 to 3 arguments, got %d", a->np);
		for (int i = 0; i < a->np; i++)
			if (need_int(r, a->pos[i], "range", &v[a->np == 1 ? 1 : i]))
				return NULL;
		if (!v[2])
			return rerr(r, "range() arg 3 must not be zero");
		if (v[2] > 0)
			cnt = v[1] > v[0] ? (v[1] - v[0] - 1) / v[2] + 1 : 0;
		else
			cnt = v[0] > v[1] ? (v[0] - v[1] - 1) / (-v[2]) + 1 : 0;
		if (cnt > LIM_RANGE)
			return rerr(r, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).",
				    LIM_RANGE);
		if (count_iters(r, (long)cnt))
			return NULL;
		l = mklist(r, (size_t)cnt, 0);
		if (!l)
			return NULL;
		{
			struct hp_jval *ints = cnt ? ral(r, (size_t)cnt * sizeof(*ints)) : NULL;

			if (cnt && !ints)
				return NULL;
			for (int64_t i = 0; i < cnt; i++) {
				memset(&ints[i], 0, sizeof(ints[i]));
				ints[i].type = JV_INT;
				ints[i].i = v[0] + i * v[2];
				l->l.v[l->l.n++] = &ints[i];
			}
		}
		return l;
	}
	case G_DICT:
	case G_NAMESPACE: {
		struct hp_jval *d = mk(r, g == G_DICT ? JV_DICT : JV_NS);

		if (!d)
			return NULL;
		if (a->np > 1)
			return rerr(r, "%s expected at most 1 argument, got %d", g_names[g], a->np);
		if (a->np) {
			struct hp_jval *src = a->pos[0];

			if (src->type == JV_DICT) {
				for (size_t i = 0; i < src->d.n; i++)
					if (dict_put(&r->ar, d, src->d.e[i].k, src->d.e[i].v))
						return room(r);
			} else if (src->type == JV_LIST) {
				for (size_t i = 0; i < src->l.n; i++) {
					struct hp_jval *pr = src->l.v[i];

					if (pr->type != JV_LIST || pr->l.n != 2)
						return rerr(r, "dictionary update sequence element #%zu has the wrong length", i);
					if (dict_put(&r->ar, d, pr->l.v[0], pr->l.v[1]))
						return room(r);
				}
			} else {
				return rerr(r, "'%s' object is not iterable", type_name(src));
			}
		}
		for (int i = 0; i < a->nk; i++) {
			struct jent *e = dict_find_str(d, a->kn[i], strlen(a->kn[i]));
			struct hp_jval *k;

			if (g == G_NAMESPACE && a->kn[i][0] == '_')
				return rerr(r, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'. Please rename the attribute.", a->kn[i]);
			if (e) {
				e->v = a->kv[i];
				continue;
			}
			k = mkstrc(r, a->kn[i], strlen(a->kn[i]));
			if (!k || dict_put(&r->ar, d, k, a->kv[i]))
				return room(r);
		}
		if (g == G_NAMESPACE)
			for (size_t i = 0; i < d->d.n; i++)
				if (d->d.e[i].k->type == JV_STR && d->d.e[i].k->s.len && d->d.e[i].k->s.s[0] == '_')
					return rerr(r, "Chat templates cannot store underscore-prefixed attributes on a namespace");
		return d;
	}
	case G_RAISE: {
		struct hp_jval *msg;

		MBIND("raise_exception", "message");
		if (!p[0])
			return rerr(r, "raise_exception() missing 1 required positional argument: 'message'");
		msg = to_str(r, p[0]);
		if (!msg)
			return NULL;
		return rerr(r, "%.*s", (int)(msg->s.len > 400 ? 400 : msg->s.len), msg->s.s);
	}
	case G_STRFTIME: {
		char fmt[256], out[1024];
		time_t now = time(NULL);
		struct tm tm;
		size_t n;

		MBIND("strftime_now", "format");
		if (!p[0] || p[0]->type != JV_STR)
			return rerr(r, "strftime_now() needs a format string");
		if (p[0]->s.len >= sizeof(fmt))
			return rerr(r, "strftime_now() format longer than %zu bytes", sizeof(fmt) - 1);
		memcpy(fmt, p[0]->s.s, p[0]->s.len);
		fmt[p[0]->s.len] = '\0';
		if (!localtime_r(&now, &tm))
			return rerr(r, "strftime_now(): no local time");
		n = strftime(out, sizeof(out), fmt, &tm);
		if (!n && fmt[0])
			return rerr(r, "strftime_now(): the result is too long");
		return mkstrc(r, out, n);
	}
	}
	return rerr(r, "unknown function");
}

/* --- scopes ----------------------------------------------------------------- */
static struct frame *frame_new(struct rs *r, struct frame *up)
{
	struct frame *f = ral(r, sizeof(*f));

	if (f) {
		memset(f, 0, sizeof(*f));
		f->up = up;
	}
	return f;
}

static int frame_set(struct rs *r, struct frame *f, const char *name, struct hp_jval *v)
{
	for (int i = 0; i < f->n; i++)
		if (f->names[i] == name || !strcmp(f->names[i], name)) {
			f->vals[i] = v;
			return 0;
		}
	if (f->n == f->cap) {
		int cap = f->cap ? f->cap * 2 : 4;
		const char **nn = ral(r, (size_t)cap * sizeof(*nn));
		struct hp_jval **nv = ral(r, (size_t)cap * sizeof(*nv));

		if (!nn || !nv)
			return -1;
		if (f->n) {
			memcpy(nn, f->names, (size_t)f->n * sizeof(*nn));
			memcpy(nv, f->vals, (size_t)f->n * sizeof(*nv));
		}
		f->names = nn;
		f->vals = nv;
		f->cap = cap;
	}
	f->names[f->n] = name;
	f->vals[f->n++] = v;
	return 0;
}

static struct hp_jval *lookup(struct rs *r, struct frame *f, const char *name)
{
	for (; f; f = f->up)
		for (int i = 0; i < f->n; i++)
			if (f->names[i] == name || !strcmp(f->names[i], name))
				return f->vals[i];
	if (r->vars && r->vars->type == JV_DICT) {
		struct jent *e = dict_find_str(r->vars, name, strlen(name));

		if (e)
			return e->v;
	}
	for (size_t i = 0; i < sizeof(g_names) / sizeof(g_names[0]); i++)
		if (!strcmp(g_names[i], name))
			return &g_funcs[i];
	return mkundef(r, UN_NAME, name, strlen(name), NULL);
}

static int assign(struct rs *r, struct frame *f, const struct node *t, struct hp_jval *v)
{
	if (t->kind == N_NAME)
		return frame_set(r, f, t->name, v);
	{
		struct hp_jval *items;

		if (v->type == JV_UNDEF) {
			undef_err(r, v);
			return -1;
		}
		items = iter_list(r, v);
		if (!items)
			return -1;
		if (items->l.n != (size_t)t->nv) {
			if (items->l.n > (size_t)t->nv)
				rerr(r, "too many values to unpack (expected %d)", t->nv);
			else
				rerr(r, "not enough values to unpack (expected %d, got %zu)", t->nv, items->l.n);
			return -1;
		}
		for (int i = 0; i < t->nv; i++)
			if (assign(r, f, t->v[i], items->l.v[i]))
				return -1;
		return 0;
	}
}

/* --- expressions ------------------------------------------------------------ */
static int exec_body(struct rs *r, struct frame *f, const struct node *body);

/* render body into a string (a macro call, block set, filter block) */
static struct hp_jval *capture(struct rs *r, struct frame *f, const struct node *body)
{
	struct sbuf b = sb_new(r), *save = r->out;
	int rc;

	r->out = &b;
	rc = exec_body(r, f, body);
	r->out = save;
	if (rc < 0)
		return NULL;
	return sb_fin(r, &b);
}

static struct hp_jval *call_macro(struct rs *r, struct hp_jval *m, struct args *a)
{
	const struct node *def = m->m.def;
	struct frame *mf;
	struct hp_jval *varargs = NULL, *kwargs = NULL, **got, *out;

	if (r->mdepth >= LIM_MACRO_DEPTH)
		return rerr(r, "macro calls nested deeper than %d (limit)", LIM_MACRO_DEPTH);
	mf = frame_new(r, m->m.closure);
	got = ral(r, (size_t)(def->nv + 1) * sizeof(*got));
	if (!mf || !got)
		return NULL;
	memset(got, 0, (size_t)(def->nv + 1) * sizeof(*got));
	if (def->fl & NF_VARARGS && !(varargs = mklist(r, 0, JF_TUPLE)))
		return NULL;
	if (def->fl & NF_KWARGS && !(kwargs = mk(r, JV_DICT)))
		return NULL;
	for (int i = 0; i < a->np; i++) {
		if (i < def->nv)
			got[i] = a->pos[i];
		else if (varargs) {
			if (push(r, varargs, a->pos[i]))
				return NULL;
		} else
			return rerr(r, "macro '%s' takes not more than %d argument(s)", def->name, def->nv);
	}
	for (int k = 0; k < a->nk; k++) {
		int j;

		for (j = 0; j < def->nv; j++)
			if (!strcmp(def->v[j]->name, a->kn[k]))
				break;
		if (j < def->nv) {
			if (got[j])
				return rerr(r, "macro '%s' got multiple values for argument '%s'", def->name, a->kn[k]);
			got[j] = a->kv[k];
		} else if (kwargs) {
			struct hp_jval *key = mkstrc(r, a->kn[k], strlen(a->kn[k]));

			if (!key || dict_put(&r->ar, kwargs, key, a->kv[k]))
				return room(r);
		} else {
			return rerr(r, "macro '%s' takes no keyword argument '%s'", def->name, a->kn[k]);
		}
	}
	for (int i = 0; i < def->nv; i++) {
		struct hp_jval *v = got[i];

		if (!v) {
			v = def->v2[i] ? eval(r, mf, def->v2[i])
				       : mkundef(r, UN_MSG, "parameter was not provided", 0, NULL);
			if (v && !def->v2[i]) {
				v->aux = UN_NAME;
				v->u.name = def->v[i]->name;
				v->u.nlen = strlen(def->v[i]->name);
			}
		}
		if (!v || frame_set(r, mf, def->v[i]->name, v))
			return NULL;
	}
	if ((varargs && frame_set(r, mf, "varargs", varargs)) || (kwargs && frame_set(r, mf, "kwargs", kwargs)))
		return NULL;
	r->mdepth++;
	out = capture(r, mf, def->d);
	r->mdepth--;
	return out;
}

static struct hp_jval *call_value(struct rs *r, struct hp_jval *fn, struct args *a)
{
	switch (fn->type) {
	case JV_FUNC:
		return call_global(r, (int)fn->aux, a);
	case JV_METHOD:
		return call_method(r, fn, a);
	case JV_MACRO:
		return call_macro(r, fn, a);
	case JV_UNDEF:
		return undef_err(r, fn);
	}
	return rerr(r, "'%s' object is not callable", type_name(fn));
}

/*
 * What a call, filter or test node applies to (n->a: the function, or the
 * value filtered or tested), and its arguments into args, the filtered value
 * in front where first; the line back at n's for what follows.
 */
static struct hp_jval *eval_applied(struct rs *r, struct frame *f, const struct node *n, int first,
				    struct args *args)
{
	struct hp_jval *x = eval(r, f, n->a);

	if (!x || eval_args(r, f, n, first ? x : NULL, args))
		return NULL;
	r->line = n->line;
	return x;
}

static struct hp_jval *eval(struct rs *r, struct frame *f, const struct node *n)
{
	struct hp_jval *a, *b;
	struct args args;

	r->line = n->line;
	switch (n->kind) {
	case N_CONST:
		return n->val;
	case N_NAME:
		return lookup(r, f, n->name);
	case N_ATTR:
		a = eval(r, f, n->a);
		return a ? get_attr(r, a, n->name, strlen(n->name)) : NULL;
	case N_ITEM:
		a = eval(r, f, n->a);
		b = a ? eval(r, f, n->b) : NULL;
		return b ? get_item(r, a, b) : NULL;
	case N_SLICE: {
		struct hp_jval *s = NULL, *e = NULL, *t = NULL;

		a = eval(r, f, n->a);
		if (!a || (n->b && !(s = eval(r, f, n->b))) || (n->c && !(e = eval(r, f, n->c))) ||
		    (n->d && !(t = eval(r, f, n->d))))
			return NULL;
		r->line = n->line;
		return get_slice(r, a, s, e, t);
	}
	case N_CALL:
		a = eval_applied(r, f, n, 0, &args);
		return a ? call_value(r, a, &args) : NULL;
	case N_FILTER:
		if (n->id < 0)
			return rerr(r, "no filter named '%s' found", n->name);
		return eval_applied(r, f, n, 1, &args) ? apply_filter(r, n->id, &args) : NULL;
	case N_BODYVAL: {
		/* the body of a block set / filter block, bound by its statement */
		struct frame *g = f;

		while (g && !(g->n && !strcmp(g->names[g->n - 1], " body")))
			g = g->up;
		return g ? g->vals[g->n - 1] : &v_empty;
	}
	case N_TEST: {
		int t;

		if (n->id < 0)
			return rerr(r, "no test named '%s' found", n->name);
		a = eval_applied(r, f, n, 0, &args);
		if (!a)
			return NULL;
		if (args.nk)
			return rerr(r, "test '%s' takes no keyword arguments", n->name);
		if (a->type == JV_UNDEF && n->id != X_DEFINED && n->id != X_UNDEFINED && n->id != X_NONE &&
		    n->id != X_STRING && n->id != X_NUMBER && n->id != X_MAPPING && n->id != X_ITERABLE &&
		    n->id != X_SEQUENCE && n->id != X_CALLABLE && n->id != X_BOOLEAN && n->id != X_FALSE &&
		    n->id != X_TRUE && n->id != X_INTEGER && n->id != X_FLOAT && n->id != X_ESCAPED &&
		    n->id != X_EQ && n->id != X_EQUALTO && n->id != X_OPEQ && n->id != X_NE &&
		    n->id != X_OPNE && n->id != X_IN && n->id != X_SAMEAS && n->id != X_FILTER && n->id != X_TEST)
			return undef_err(r, a);
		t = do_test(r, n->id, a, args.pos, args.np);
		return t < 0 ? NULL : VBOOL(t);
	}
	case N_BIN:
		a = eval(r, f, n->a);
		b = a ? eval(r, f, n->b) : NULL;
		if (!b)
			return NULL;
		r->line = n->line;
		return binop(r, n->op, a, b);
	case N_NEG:
	case N_POS:
		a = eval(r, f, n->a);
		if (!a)
			return NULL;
		if (a->type == JV_UNDEF)
			return undef_err(r, a);
		if (a->type == JV_FLOAT)
			return n->kind == N_NEG ? mkfloat(r, -a->f) : a;
		if (a->type == JV_INT || a->type == JV_BOOL) {
			if (n->kind == N_POS)
				return a->type == JV_INT ? a : mkint(r, a->i);
			if (a->i == INT64_MIN)
				return rerr(r, "integer overflow (integers are 64-bit here)");
			return mkint(r, -a->i);
		}
		return rerr(r, "bad operand type for unary %s: '%s'", n->kind == N_NEG ? "-" : "+", type_name(a));
	case N_NOT:
		a = eval(r, f, n->a);
		return a ? VBOOL(!truthy(a)) : NULL;
	case N_AND:
	case N_OR:
		a = eval(r, f, n->a);
		if (!a)
			return NULL;
		if (truthy(a) == (n->kind == N_OR))
			return a;
		return eval(r, f, n->b);
	case N_CMP: {
		struct hp_jval *x = eval(r, f, n->v[0]);

		if (!x)
			return NULL;
		for (int i = 1; i < n->nv; i++) {
			struct hp_jval *y = eval(r, f, n->v[i]);
			int op = n->ops[i - 1], res, c;

			if (!y)
				return NULL;
			r->line = n->line;
			switch (op) {
			case OP_EQ: res = py_eq(x, y); break;
			case OP_NE: res = !py_eq(x, y); break;
			case OP_IN:
			case OP_NOTIN:
				res = contains(r, y, x);
				if (res < 0)
					return NULL;
				if (op == OP_NOTIN)
					res = !res;
				break;
			default:
				if (py_cmp(r, x, y, &c))
					return NULL;
				res = op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
			}
			if (!res)
				return &v_false;
			x = y;
		}
		return &v_true;
	}
	case N_COND:
		a = eval(r, f, n->a);
		if (!a)
			return NULL;
		if (truthy(a))
			return eval(r, f, n->b);
		if (n->c)
			return eval(r, f, n->c);
		return mkundef(r, UN_MSG, "the inline if-expression evaluated to false and no else section was defined", 0, NULL);
	case N_LIST:
	case N_TUPLE: {
		struct hp_jval *l = mklist(r, (size_t)n->nv, n->kind == N_TUPLE ? JF_TUPLE : 0);

		if (!l)
			return NULL;
		for (int i = 0; i < n->nv; i++)
			if (!(l->l.v[l->l.n++] = eval(r, f, n->v[i])))
				return NULL;
		return l;
	}
	case N_DICT: {
		struct hp_jval *d = mk(r, JV_DICT);

		if (!d)
			return NULL;
		for (int i = 0; i + 1 < n->nv; i += 2) {
			struct hp_jval *k = eval(r, f, n->v[i]), *v;
			size_t j;

			if (!k || !(v = eval(r, f, n->v[i + 1])))
				return NULL;
			if (k->type == JV_DICT || (k->type == JV_LIST && !(k->flags & JF_TUPLE)) ||
			    k->type == JV_NS || k->type == JV_UNDEF) {
				r->line = n->line;
				return rerr(r, "unhashable type: '%s'", type_name(k));
			}
			for (j = 0; j < d->d.n; j++)
				if (py_eq(d->d.e[j].k, k))
					break;
			if (j < d->d.n)
				d->d.e[j].v = v;
			else if (dict_put(&r->ar, d, k, v))
				return room(r);
		}
		return d;
	}
	case N_CONCAT: {
		struct sbuf sb = sb_new(r);

		for (int i = 0; i < n->nv; i++) {
			struct hp_jval *x = eval(r, f, n->v[i]);

			if (!x || put_str(r, &sb, x))
				return x && sb.oom ? room(r) : NULL;
		}
		return sb_fin(r, &sb);
	}
	}
	return rerr(r, "internal error: unknown node %d", n->kind);
}

/* --- statements ------------------------------------------------------------- */
enum { X_OK = 0, X_BREAK = 1, X_CONTINUE = 2 };

static int emit(struct rs *r, const char *s, size_t n, const uint16_t *tags)
{
	size_t old = r->out->len;

	if (!n)
		return 0;
	if (n > r->lim_output - r->outbytes) {
		rerr(r, "the output exceeds %zu MiB (limit)", r->lim_output >> 20);
		return r->rc;
	}
	r->outbytes += n;
	if (sb_put(r->out, s, n, tags, 0)) {
		room(r);
		return r->rc;
	}
	if (r->out->g)
		memset(r->out->g + old, r->gen > 0, n);
	return 0;
}

/* a block set's or filter block's value: its filter chain n->b applied to its rendered body n->d */
static struct hp_jval *filter_body(struct rs *r, struct frame *f, const struct node *n)
{
	struct hp_jval *body = capture(r, f, n->d);
	struct frame *bf;

	if (!body || n->b->kind == N_BODYVAL)
		return body;
	bf = frame_new(r, f);
	if (!bf || frame_set(r, bf, " body", body))
		return NULL;
	return eval(r, bf, n->b);
}

/* a fresh scope for each iteration (jinja's), reusing the last one's memory unless a macro closed over it */
static struct frame *iter_frame(struct rs *r, struct frame *f, struct frame *last)
{
	if (!last || last->captured)
		return frame_new(r, f);
	last->n = 0;
	return last;
}

static int exec_for(struct rs *r, struct frame *f, const struct node *n)
{
	struct hp_jval *it = eval(r, f, n->b), *items, *lv;
	struct jloop *lp;
	struct frame *bf;

	if (!it)
		return r->rc;
	r->line = n->line;
	items = iter_list(r, it);
	if (!items)
		return r->rc;
	if (n->c) {
		struct hp_jval *kept = mklist(r, 0, 0);

		if (!kept)
			return r->rc;
		struct frame *tf = NULL;

		for (size_t i = 0; i < items->l.n; i++) {
			struct hp_jval *c;

			if (count_iters(r, 1) || !(tf = iter_frame(r, f, tf)) ||
			    assign(r, tf, n->a, items->l.v[i]) || !(c = eval(r, tf, n->c)))
				return r->rc;
			if (truthy(c) && push(r, kept, items->l.v[i]))
				return r->rc;
		}
		items = kept;
	}
	lp = ral(r, sizeof(*lp));
	if (lp)
		memset(lp, 0, sizeof(*lp));
	lv = mk(r, JV_LOOP);
	if (!lp || !lv)
		return r->rc;
	lp->n = items->l.n;
	lp->items = items;
	lv->loop = lp;
	bf = NULL;
	for (size_t i = 0; i < items->l.n; i++) {
		int rc;

		if (r->iters >= r->lim_iters)   /* the limit error names the for tag */
			r->line = n->line;
		if (count_iters(r, 1) || !(bf = iter_frame(r, f, bf)))
			return r->rc;
		lp->i = i;
		if (assign(r, bf, n->a, items->l.v[i]) || frame_set(r, bf, "loop", lv))
			return r->rc;
		rc = exec_body(r, bf, n->d);
		if (rc < 0)
			return rc;
		if (rc == X_BREAK)
			break;
	}
	if (!items->l.n && n->e) {
		struct frame *ef = frame_new(r, f);

		if (!ef)
			return r->rc;
		return exec_body(r, ef, n->e);
	}
	return 0;
}

static int exec_set(struct rs *r, struct frame *f, const struct node *t, struct hp_jval *v)
{
	if (t->fl & NF_NSREF) {
		struct hp_jval *ns = lookup(r, f, t->a->name);
		struct jent *e;
		struct hp_jval *k;

		if (!ns)
			return r->rc;
		r->line = t->line;
		if (ns->type != JV_NS) {
			rerr(r, "cannot assign attribute on non-namespace object");
			return r->rc;
		}
		if (t->name[0] == '_') {
			rerr(r, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'. Please rename the attribute.", t->name);
			return r->rc;
		}
		e = dict_find_str(ns, t->name, strlen(t->name));
		if (e) {
			e->v = v;
			return 0;
		}
		k = mkstrc(r, t->name, strlen(t->name));
		if (!k || dict_put(&r->ar, ns, k, v)) {
			room(r);
			return r->rc;
		}
		return 0;
	}
	return assign(r, f, t, v) ? r->rc : 0;
}

static int exec_body(struct rs *r, struct frame *f, const struct node *body)
{
	for (int i = 0; i < body->nv; i++) {
		const struct node *n = body->v[i];
		struct hp_jval *v;
		int rc;

		r->line = n->line;
		switch (n->kind) {
		case S_DATA:
			if (emit(r, n->val->s.s, n->val->s.len, NULL))
				return r->rc;
			break;
		case S_OUT:
			v = eval(r, f, n->a);
			if (!v)
				return r->rc;
			if (v->type != JV_STR && !(v = to_str(r, v)))
				return r->rc;
			if (emit(r, v->s.s, v->s.len, v->s.tag))
				return r->rc;
			break;
		case S_IF: {
			const struct node *x = n;

			while (x) {
				v = eval(r, f, x->a);
				if (!v)
					return r->rc;
				if (truthy(v)) {
					rc = exec_body(r, f, x->d);
					if (rc)
						return rc;
					break;
				}
				x = x->e;
				if (x && x->kind == S_BODY) {
					rc = exec_body(r, f, x);
					if (rc)
						return rc;
					break;
				}
			}
			break;
		}
		case S_FOR:
			rc = exec_for(r, f, n);
			if (rc)
				return rc;
			break;
		case S_SET:
			v = eval(r, f, n->b);
			if (!v || exec_set(r, f, n->a, v))
				return r->rc;
			break;
		case S_SETBLOCK:
			v = filter_body(r, f, n);
			if (!v || exec_set(r, f, n->a, v))
				return r->rc;
			break;
		case S_FILTER:
			v = filter_body(r, f, n);
			if (v && v->type != JV_STR)
				v = to_str(r, v);
			if (!v || emit(r, v->s.s, v->s.len, v->s.tag))
				return r->rc;
			break;
		case S_MACRO:
			v = mk(r, JV_MACRO);
			if (!v)
				return r->rc;
			v->m.def = n;
			v->m.closure = f;
			for (struct frame *g = f; g; g = g->up)
				g->captured = 1;
			if (frame_set(r, f, n->name, v))
				return r->rc;
			break;
		case S_GEN:
			r->gen++;
			rc = exec_body(r, f, n->d);
			r->gen--;
			if (rc)
				return rc;
			break;
		case S_BREAK:
			return X_BREAK;
		case S_CONT:
			return X_CONTINUE;
		default:
			rerr(r, "internal error: unknown statement %d", n->kind);
			return r->rc;
		}
	}
	return 0;
}

int hp_jinja_render(const struct hp_jinja *t, struct hp_jctx *c, struct hp_jval *vars, struct hp_jout *out,
		    struct hp_err *e)
{
	return hp_jinja_render_lim(t, c, vars, NULL, out, e);
}

int hp_jinja_render_lim(const struct hp_jinja *t, struct hp_jctx *c, struct hp_jval *vars,
			const struct hp_jlimits *lim, struct hp_jout *out, struct hp_err *e)
{
	struct rs r;
	struct frame *top;
	int rc;

	(void)c;
	memset(out, 0, sizeof(*out));
	if (!t)
		return hp_err_set(e, HP_EINVAL, "hp_jinja_render: no template");
	if (vars && vars->type != JV_DICT)
		return hp_err_set(e, HP_EINVAL, "'%s': the variables must be a dict", t->name);
	memset(&r, 0, sizeof(r));
	r.t = t;
	r.vars = vars;
	r.e = e;
	r.ar.limit = lim && lim->max_memory ? lim->max_memory : LIM_MEMORY;
	r.lim_output = lim && lim->max_output ? lim->max_output : LIM_OUTPUT;
	r.lim_iters = lim && lim->max_iters > 0 ? lim->max_iters : LIM_ITERS;
	r.top.want_g = t->has_gen;
	r.out = &r.top;
	top = frame_new(&r, NULL);
	rc = top ? exec_body(&r, top, t->root) : r.rc;
	if (rc >= 0 && !r.top.cap && sb_grow(&r.top, 1))
		rc = (room(&r), r.rc);
	arena_free(&r.ar);
	if (rc < 0) {
		hp_free(r.top.s);
		hp_free(r.top.t);
		hp_free(r.top.g);
		return rc;
	}
	r.top.s[r.top.len] = '\0';
	out->text = r.top.s;
	out->len = r.top.len;
	out->tag = r.top.t;
	out->gen = r.top.g;
	return 0;
}

void hp_jout_release(struct hp_jout *o)
{
	if (!o)
		return;
	hp_free(o->text);
	hp_free(o->tag);
	hp_free(o->gen);
	memset(o, 0, sizeof(*o));
}
