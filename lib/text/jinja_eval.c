/*
 * jinja_eval.c - the evaluator of the Jinja2 interpreter: a tree walk over
 * the compiled template, with jinja's scoping (a for body gets a fresh scope
 * every iteration, if does not scope, macros close over the scope they are
 * defined in), Python's arithmetic, items and slices, calls, and
 * hp_jinja_render.  Filters, tests, methods and globals are in
 * jinja_builtins.c, the values in jinja_value.c.
 */
#include <math.h>

#include "base/alloc.h"
#include "text/jinja_int.h"

/* --- arithmetic ------------------------------------------------------------- */
struct hp_jval *jj_concat2(struct rs *r, const struct hp_jval *a, const struct hp_jval *b)
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
		return jj_rerr(r, "a string longer than %zu MiB (limit)", r->lim_output >> 20);
	s = jj_ral(r, n + 1);
	if (!s)
		return NULL;
	memcpy(s, a->s.s, a->s.len);
	memcpy(s + a->s.len, b->s.s, b->s.len);
	s[n] = '\0';
	if (a->s.tag || b->s.tag) {
		t = jj_ral(r, n * sizeof(*t));
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
	v = jj_mk(r, JV_STR);
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

struct hp_jval *jj_repeat(struct rs *r, const struct hp_jval *x, int64_t k)
{
	if (k <= 0)
		return x->type == JV_STR ? &jj_v_empty : jj_mklist(r, 0, x->flags & JF_TUPLE);
	if (x->type == JV_STR) {
		struct sbuf b = jj_sb_new(r);

		if ((double)x->s.len * (double)k > (double)r->lim_output)
			return jj_rerr(r, "a string longer than %zu MiB (limit)", r->lim_output >> 20);
		for (int64_t i = 0; i < k; i++)
			jj_sb_val(&b, x);
		return jj_sb_fin(r, &b);
	} else {
		struct hp_jval *l;

		if ((double)x->l.n * (double)k > (double)r->lim_iters)
			return jj_rerr(r, "a list longer than %ld items (limit)", r->lim_iters);
		l = jj_mklist(r, x->l.n * (size_t)k, x->flags & JF_TUPLE);
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

struct hp_jval *jj_binop(struct rs *r, int op, struct hp_jval *a, struct hp_jval *b)
{
	if (a->type == JV_UNDEF)
		return jj_undef_err(r, a);
	if (b->type == JV_UNDEF)
		return jj_undef_err(r, b);
	if (jj_isnum(a) && jj_isnum(b)) {
		if (a->type != JV_FLOAT && b->type != JV_FLOAT && op != OP_DIV) {
			int64_t x = a->i, y = b->i, z;

			switch (op) {
			case OP_ADD:
				if (__builtin_add_overflow(x, y, &z))
					goto ovf;
				return jj_mkint(r, z);
			case OP_SUB:
				if (__builtin_sub_overflow(x, y, &z))
					goto ovf;
				return jj_mkint(r, z);
			case OP_MUL:
				if (__builtin_mul_overflow(x, y, &z))
					goto ovf;
				return jj_mkint(r, z);
			case OP_FLOORDIV:
			case OP_MOD:
				if (!y)
					return jj_rerr(r, "integer division or modulo by zero");
				if (x == INT64_MIN && y == -1)
					goto ovf;
				{
					int64_t q = x / y, m = x % y;

					if (m && ((m < 0) != (y < 0))) {
						q--;
						m += y;
					}
					return jj_mkint(r, op == OP_MOD ? m : q);
				}
			case OP_POW:
				if (y < 0) {
					if (!x)
						return jj_rerr(r, "0.0 cannot be raised to a negative power");
					return jj_mkfloat(r, pow((double)x, (double)y));
				}
				z = 1;
				while (y) {
					if (y & 1 && __builtin_mul_overflow(z, x, &z))
						goto ovf;
					y >>= 1;
					if (y && __builtin_mul_overflow(x, x, &x))
						goto ovf;
				}
				return jj_mkint(r, z);
			}
		} else {
			double x = jj_numf(a), y = jj_numf(b);

			switch (op) {
			case OP_ADD: return jj_mkfloat(r, x + y);
			case OP_SUB: return jj_mkfloat(r, x - y);
			case OP_MUL: return jj_mkfloat(r, x * y);
			case OP_DIV:
				if (y == 0)
					return jj_rerr(r, "division by zero");
				return jj_mkfloat(r, x / y);
			case OP_FLOORDIV:
			case OP_MOD: {
				/* CPython float_divmod */
				double m, d, fd;

				if (y == 0)
					return jj_rerr(r, "float modulo or division by zero");
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
				return jj_mkfloat(r, op == OP_MOD ? m : fd);
			}
			case OP_POW:
				if (x == 0 && y < 0)
					return jj_rerr(r, "0.0 cannot be raised to a negative power");
				if (x < 0 && y != floor(y))
					return jj_rerr(r, "a negative number to a fractional power is complex (not supported)");
				return jj_mkfloat(r, pow(x, y));
			}
		}
	}
	if (op == OP_ADD) {
		if (a->type == JV_STR && b->type == JV_STR)
			return jj_concat2(r, a, b);
		if (a->type == JV_LIST && b->type == JV_LIST &&
		    (a->flags & JF_TUPLE) == (b->flags & JF_TUPLE) &&
		    !((a->flags | b->flags) & (JF_ITEMS | JF_KEYS | JF_VALUES))) {
			struct hp_jval *l = jj_mklist(r, a->l.n + b->l.n, a->flags & JF_TUPLE);

			if (!l)
				return NULL;
			for (size_t i = 0; i < a->l.n; i++)
				l->l.v[l->l.n++] = a->l.v[i];
			for (size_t i = 0; i < b->l.n; i++)
				l->l.v[l->l.n++] = b->l.v[i];
			return l;
		}
		if (a->type == JV_STR || b->type == JV_STR)
			return jj_rerr(r, "can only concatenate str (not \"%s\") to str",
				       jj_type_name(a->type == JV_STR ? b : a));
	}
	if (op == OP_MUL) {
		if ((a->type == JV_STR || a->type == JV_LIST) && (b->type == JV_INT || b->type == JV_BOOL))
			return jj_repeat(r, a, b->i);
		if ((b->type == JV_STR || b->type == JV_LIST) && (a->type == JV_INT || a->type == JV_BOOL))
			return jj_repeat(r, b, a->i);
	}
	if (op == OP_MOD && a->type == JV_STR)
		return jj_str_format(r, a, b);
	return jj_rerr(r, "unsupported operand type(s) for %s: '%s' and '%s'", opname(op), jj_type_name(a),
		       jj_type_name(b));
ovf:
	return jj_rerr(r, "integer overflow (integers are 64-bit here)");
}

/* --- items, slices and iteration ------------------------------------------ */
static int norm_index(int64_t i, size_t n, size_t *out)
{
	if (i < 0)
		i += (int64_t)n;
	if (i < 0 || (uint64_t)i >= n)
		return 0;
	*out = (size_t)i;
	return 1;
}

struct hp_jval *jj_get_item(struct rs *r, struct hp_jval *x, struct hp_jval *k)
{
	size_t i;

	if (x->type == JV_UNDEF)
		return jj_undef_err(r, x);
	if (x->type == JV_DICT) {
		for (size_t j = 0; j < x->d.n; j++)
			if (jj_py_eq(x->d.e[j].k, k))
				return x->d.e[j].v;
	} else if ((x->type == JV_LIST || x->type == JV_STR) && (k->type == JV_INT || k->type == JV_BOOL)) {
		if (x->type == JV_LIST) {
			if (norm_index(k->i, x->l.n, &i) && !(x->flags & (JF_ITEMS | JF_KEYS | JF_VALUES)))
				return x->l.v[i];
		} else if (norm_index(k->i, x->s.ncp, &i)) {
			size_t off = jj_cp_off(x, i), end = off;

			jj_u8dec(x->s.s, x->s.len, &end);
			return jj_sub(r, x, off, end - off);
		}
	}
	if (k->type == JV_STR)
		return jj_get_attr(r, x, k->s.s, k->s.len);
	if (k->type == JV_INT || k->type == JV_BOOL) {
		char *num = jj_ral(r, 24);

		if (!num)
			return NULL;
		snprintf(num, 24, "%lld", (long long)k->i);
		return jj_mkundef(r, UN_ITEM, num, strlen(num), jj_type_name(x));
	}
	return jj_mkundef(r, UN_ITEM, "?", 1, jj_type_name(x));
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
		jj_rerr(r, "slice step cannot be zero");
		return -1;
	}
	if (slice_bad(tv) || slice_bad(sv) || slice_bad(ev)) {
		jj_rerr(r, "slice indices must be integers or None");
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

struct hp_jval *jj_get_slice(struct rs *r, struct hp_jval *x, struct hp_jval *sv, struct hp_jval *ev,
			     struct hp_jval *tv)
{
	int64_t a, b, st, cnt;

	if (x->type == JV_UNDEF)
		return jj_undef_err(r, x);
	if (x->type == JV_LIST && !(x->flags & (JF_ITEMS | JF_KEYS | JF_VALUES))) {
		struct hp_jval *l;

		if (slice_idx(r, sv, ev, tv, x->l.n, &a, &b, &st, &cnt))
			return NULL;
		l = jj_mklist(r, (size_t)cnt, x->flags & JF_TUPLE);
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
			return &jj_v_empty;
		if (st == 1) {
			size_t o1 = jj_cp_off(x, (size_t)a), o2 = o1;

			if (x->flags & JF_ASCII) {
				o2 = (size_t)(a + cnt);
			} else {
				for (int64_t i = 0; i < cnt; i++)
					jj_u8dec(x->s.s, x->s.len, &o2);
			}
			return jj_sub(r, x, o1, o2 - o1);
		}
		if (!(x->flags & JF_ASCII)) {
			size_t i = 0, k = 0;

			offs = jj_ral(r, (x->s.ncp + 1) * sizeof(*offs));
			if (!offs)
				return NULL;
			while (i < x->s.len) {
				offs[k++] = i;
				jj_u8dec(x->s.s, x->s.len, &i);
			}
			offs[k] = i;
		}
		bb = jj_sb_new(r);
		for (int64_t i = 0, j = a; i < cnt; i++, j += st) {
			size_t o1 = offs ? offs[j] : (size_t)j, o2 = offs ? offs[j + 1] : (size_t)j + 1;

			jj_sb_span(&bb, x, o1, o2 - o1);
		}
		return jj_sb_fin(r, &bb);
	}
	return jj_rerr(r, "'%s' object is not subscriptable", jj_type_name(x));
}

/* the items of an iterable: lists as they are, dict keys, string characters */
struct hp_jval *jj_iter_list(struct rs *r, struct hp_jval *x)
{
	struct hp_jval *l;

	switch (x->type) {
	case JV_UNDEF:
		return jj_mklist(r, 0, 0);
	case JV_LIST:
		return x;
	case JV_DICT:
		l = jj_mklist(r, x->d.n, 0);
		if (!l)
			return NULL;
		for (size_t i = 0; i < x->d.n; i++)
			l->l.v[l->l.n++] = x->d.e[i].k;
		return l;
	case JV_STR: {
		size_t i = 0;

		l = jj_mklist(r, x->s.ncp, 0);
		if (!l)
			return NULL;
		while (i < x->s.len) {
			size_t st = i;

			jj_u8dec(x->s.s, x->s.len, &i);
			l->l.v[l->l.n] = jj_sub(r, x, st, i - st);
			if (!l->l.v[l->l.n++])
				return NULL;
		}
		return l;
	}
	}
	return jj_rerr(r, "'%s' object is not iterable", jj_type_name(x));
}

/* --- calls: arguments ----------------------------------------------------- */
static struct hp_jval *eval(struct rs *r, struct frame *f, const struct node *n);

/* evaluate n's arguments, with first (a filter's or test's value) in front */
static int eval_args(struct rs *r, struct frame *f, const struct node *n, struct hp_jval *first,
		     struct args *a)
{
	int off = first ? 1 : 0;

	a->np = n->nv + off;
	a->nk = n->nkw;
	a->pos = jj_ral(r, (size_t)(a->np + 1) * sizeof(*a->pos));
	a->kn = jj_ral(r, (size_t)(a->nk + 1) * sizeof(*a->kn));
	a->kv = jj_ral(r, (size_t)(a->nk + 1) * sizeof(*a->kv));
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

/* --- scopes ----------------------------------------------------------------- */
struct frame {
	struct frame *up;
	const char **names;
	struct hp_jval **vals;
	int n, cap;
	int captured;   /* a macro closes over it: a loop may not reuse it */
};

static struct frame *frame_new(struct rs *r, struct frame *up)
{
	struct frame *f = jj_ral(r, sizeof(*f));

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
		const char **nn = jj_ral(r, (size_t)cap * sizeof(*nn));
		struct hp_jval **nv = jj_ral(r, (size_t)cap * sizeof(*nv));

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
	struct hp_jval *g;

	for (; f; f = f->up)
		for (int i = 0; i < f->n; i++)
			if (f->names[i] == name || !strcmp(f->names[i], name))
				return f->vals[i];
	if (r->vars && r->vars->type == JV_DICT) {
		struct jent *e = jj_dict_find_str(r->vars, name, strlen(name));

		if (e)
			return e->v;
	}
	if ((g = jj_find_global(name)))
		return g;
	return jj_mkundef(r, UN_NAME, name, strlen(name), NULL);
}

static int assign(struct rs *r, struct frame *f, const struct node *t, struct hp_jval *v)
{
	if (t->kind == N_NAME)
		return frame_set(r, f, t->name, v);
	{
		struct hp_jval *items;

		if (v->type == JV_UNDEF) {
			jj_undef_err(r, v);
			return -1;
		}
		items = jj_iter_list(r, v);
		if (!items)
			return -1;
		if (items->l.n != (size_t)t->nv) {
			if (items->l.n > (size_t)t->nv)
				jj_rerr(r, "too many values to unpack (expected %d)", t->nv);
			else
				jj_rerr(r, "not enough values to unpack (expected %d, got %zu)", t->nv, items->l.n);
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
	struct sbuf b = jj_sb_new(r), *save = r->out;
	int rc;

	r->out = &b;
	rc = exec_body(r, f, body);
	r->out = save;
	if (rc < 0)
		return NULL;
	return jj_sb_fin(r, &b);
}

static struct hp_jval *call_macro(struct rs *r, struct hp_jval *m, struct args *a)
{
	const struct node *def = m->m.def;
	struct frame *mf;
	struct hp_jval *varargs = NULL, *kwargs = NULL, **got, *out;

	if (r->mdepth >= LIM_MACRO_DEPTH)
		return jj_rerr(r, "macro calls nested deeper than %d (limit)", LIM_MACRO_DEPTH);
	mf = frame_new(r, m->m.closure);
	got = jj_ral(r, (size_t)(def->nv + 1) * sizeof(*got));
	if (!mf || !got)
		return NULL;
	memset(got, 0, (size_t)(def->nv + 1) * sizeof(*got));
	if (def->fl & NF_VARARGS && !(varargs = jj_mklist(r, 0, JF_TUPLE)))
		return NULL;
	if (def->fl & NF_KWARGS && !(kwargs = jj_mk(r, JV_DICT)))
		return NULL;
	for (int i = 0; i < a->np; i++) {
		if (i < def->nv)
			got[i] = a->pos[i];
		else if (varargs) {
			if (jj_push(r, varargs, a->pos[i]))
				return NULL;
		} else
			return jj_rerr(r, "macro '%s' takes not more than %d argument(s)", def->name, def->nv);
	}
	for (int k = 0; k < a->nk; k++) {
		int j;

		for (j = 0; j < def->nv; j++)
			if (!strcmp(def->v[j]->name, a->kn[k]))
				break;
		if (j < def->nv) {
			if (got[j])
				return jj_rerr(r, "macro '%s' got multiple values for argument '%s'", def->name, a->kn[k]);
			got[j] = a->kv[k];
		} else if (kwargs) {
			struct hp_jval *key = jj_mkstrc(r, a->kn[k], strlen(a->kn[k]));

			if (!key || jj_dict_put(&r->ar, kwargs, key, a->kv[k]))
				return jj_room(r);
		} else {
			return jj_rerr(r, "macro '%s' takes no keyword argument '%s'", def->name, a->kn[k]);
		}
	}
	for (int i = 0; i < def->nv; i++) {
		struct hp_jval *v = got[i];

		if (!v) {
			v = def->v2[i] ? eval(r, mf, def->v2[i])
				       : jj_mkundef(r, UN_MSG, "parameter was not provided", 0, NULL);
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
		return jj_call_global(r, (int)fn->aux, a);
	case JV_METHOD:
		return jj_call_method(r, fn, a);
	case JV_MACRO:
		return call_macro(r, fn, a);
	case JV_UNDEF:
		return jj_undef_err(r, fn);
	}
	return jj_rerr(r, "'%s' object is not callable", jj_type_name(fn));
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
		return a ? jj_get_attr(r, a, n->name, strlen(n->name)) : NULL;
	case N_ITEM:
		a = eval(r, f, n->a);
		b = a ? eval(r, f, n->b) : NULL;
		return b ? jj_get_item(r, a, b) : NULL;
	case N_SLICE: {
		struct hp_jval *s = NULL, *e = NULL, *t = NULL;

		a = eval(r, f, n->a);
		if (!a || (n->b && !(s = eval(r, f, n->b))) || (n->c && !(e = eval(r, f, n->c))) ||
		    (n->d && !(t = eval(r, f, n->d))))
			return NULL;
		r->line = n->line;
		return jj_get_slice(r, a, s, e, t);
	}
	case N_CALL:
		a = eval_applied(r, f, n, 0, &args);
		return a ? call_value(r, a, &args) : NULL;
	case N_FILTER:
		if (n->id < 0)
			return jj_rerr(r, "no filter named '%s' found", n->name);
		return eval_applied(r, f, n, 1, &args) ? jj_apply_filter(r, n->id, &args) : NULL;
	case N_BODYVAL: {
		/* the body of a block set / filter block, bound by its statement */
		struct frame *g = f;

		while (g && !(g->n && !strcmp(g->names[g->n - 1], " body")))
			g = g->up;
		return g ? g->vals[g->n - 1] : &jj_v_empty;
	}
	case N_TEST: {
		int t;

		if (n->id < 0)
			return jj_rerr(r, "no test named '%s' found", n->name);
		a = eval_applied(r, f, n, 0, &args);
		if (!a)
			return NULL;
		if (args.nk)
			return jj_rerr(r, "test '%s' takes no keyword arguments", n->name);
		if (a->type == JV_UNDEF && !jj_test_takes_undefined(n->id))
			return jj_undef_err(r, a);
		t = jj_do_test(r, n->id, a, args.pos, args.np);
		return t < 0 ? NULL : VBOOL(t);
	}
	case N_BIN:
		a = eval(r, f, n->a);
		b = a ? eval(r, f, n->b) : NULL;
		if (!b)
			return NULL;
		r->line = n->line;
		return jj_binop(r, n->op, a, b);
	case N_NEG:
	case N_POS:
		a = eval(r, f, n->a);
		if (!a)
			return NULL;
		if (a->type == JV_UNDEF)
			return jj_undef_err(r, a);
		if (a->type == JV_FLOAT)
			return n->kind == N_NEG ? jj_mkfloat(r, -a->f) : a;
		if (a->type == JV_INT || a->type == JV_BOOL) {
			if (n->kind == N_POS)
				return a->type == JV_INT ? a : jj_mkint(r, a->i);
			if (a->i == INT64_MIN)
				return jj_rerr(r, "integer overflow (integers are 64-bit here)");
			return jj_mkint(r, -a->i);
		}
		return jj_rerr(r, "bad operand type for unary %s: '%s'", n->kind == N_NEG ? "-" : "+", jj_type_name(a));
	case N_NOT:
		a = eval(r, f, n->a);
		return a ? VBOOL(!jj_truthy(a)) : NULL;
	case N_AND:
	case N_OR:
		a = eval(r, f, n->a);
		if (!a)
			return NULL;
		if (jj_truthy(a) == (n->kind == N_OR))
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
			case OP_EQ: res = jj_py_eq(x, y); break;
			case OP_NE: res = !jj_py_eq(x, y); break;
			case OP_IN:
			case OP_NOTIN:
				res = jj_contains(r, y, x);
				if (res < 0)
					return NULL;
				if (op == OP_NOTIN)
					res = !res;
				break;
			default:
				if (jj_py_cmp(r, x, y, &c))
					return NULL;
				res = op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
			}
			if (!res)
				return &jj_v_false;
			x = y;
		}
		return &jj_v_true;
	}
	case N_COND:
		a = eval(r, f, n->a);
		if (!a)
			return NULL;
		if (jj_truthy(a))
			return eval(r, f, n->b);
		if (n->c)
			return eval(r, f, n->c);
		return jj_mkundef(r, UN_MSG, "the inline if-expression evaluated to false and no else section was defined", 0, NULL);
	case N_LIST:
	case N_TUPLE: {
		struct hp_jval *l = jj_mklist(r, (size_t)n->nv, n->kind == N_TUPLE ? JF_TUPLE : 0);

		if (!l)
			return NULL;
		for (int i = 0; i < n->nv; i++)
			if (!(l->l.v[l->l.n++] = eval(r, f, n->v[i])))
				return NULL;
		return l;
	}
	case N_DICT: {
		struct hp_jval *d = jj_mk(r, JV_DICT);

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
				return jj_rerr(r, "unhashable type: '%s'", jj_type_name(k));
			}
			for (j = 0; j < d->d.n; j++)
				if (jj_py_eq(d->d.e[j].k, k))
					break;
			if (j < d->d.n)
				d->d.e[j].v = v;
			else if (jj_dict_put(&r->ar, d, k, v))
				return jj_room(r);
		}
		return d;
	}
	case N_CONCAT: {
		struct sbuf sb = jj_sb_new(r);

		for (int i = 0; i < n->nv; i++) {
			struct hp_jval *x = eval(r, f, n->v[i]);

			if (!x || jj_put_str(r, &sb, x))
				return x && sb.oom ? jj_room(r) : NULL;
		}
		return jj_sb_fin(r, &sb);
	}
	}
	return jj_rerr(r, "internal error: unknown node %d", n->kind);
}

/* --- statements ------------------------------------------------------------- */
enum { X_OK = 0, X_BREAK = 1, X_CONTINUE = 2 };

static int emit(struct rs *r, const char *s, size_t n, const uint16_t *tags)
{
	size_t old = r->out->len;

	if (!n)
		return 0;
	if (n > r->lim_output - r->outbytes) {
		jj_rerr(r, "the output exceeds %zu MiB (limit)", r->lim_output >> 20);
		return r->rc;
	}
	r->outbytes += n;
	if (jj_sb_put(r->out, s, n, tags, 0)) {
		jj_room(r);
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
	items = jj_iter_list(r, it);
	if (!items)
		return r->rc;
	if (n->c) {
		struct hp_jval *kept = jj_mklist(r, 0, 0);

		if (!kept)
			return r->rc;
		struct frame *tf = NULL;

		for (size_t i = 0; i < items->l.n; i++) {
			struct hp_jval *c;

			if (jj_count_iters(r, 1) || !(tf = iter_frame(r, f, tf)) ||
			    assign(r, tf, n->a, items->l.v[i]) || !(c = eval(r, tf, n->c)))
				return r->rc;
			if (jj_truthy(c) && jj_push(r, kept, items->l.v[i]))
				return r->rc;
		}
		items = kept;
	}
	lp = jj_ral(r, sizeof(*lp));
	if (lp)
		memset(lp, 0, sizeof(*lp));
	lv = jj_mk(r, JV_LOOP);
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
		if (jj_count_iters(r, 1) || !(bf = iter_frame(r, f, bf)))
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
			jj_rerr(r, "cannot assign attribute on non-namespace object");
			return r->rc;
		}
		if (t->name[0] == '_') {
			jj_rerr(r, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'. Please rename the attribute.", t->name);
			return r->rc;
		}
		e = jj_dict_find_str(ns, t->name, strlen(t->name));
		if (e) {
			e->v = v;
			return 0;
		}
		k = jj_mkstrc(r, t->name, strlen(t->name));
		if (!k || jj_dict_put(&r->ar, ns, k, v)) {
			jj_room(r);
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
			if (v->type != JV_STR && !(v = jj_to_str(r, v)))
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
				if (jj_truthy(v)) {
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
				v = jj_to_str(r, v);
			if (!v || emit(r, v->s.s, v->s.len, v->s.tag))
				return r->rc;
			break;
		case S_MACRO:
			v = jj_mk(r, JV_MACRO);
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
			jj_rerr(r, "internal error: unknown statement %d", n->kind);
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
	if (rc >= 0 && !r.top.cap && jj_sb_grow(&r.top, 1))
		rc = (jj_room(&r), r.rc);
	jj_arena_free(&r.ar);
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
