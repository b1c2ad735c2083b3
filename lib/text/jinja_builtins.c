/*
 * jinja_builtins.c - what a template can call: jinja2's filters and tests,
 * the methods of str, dict, list and loop (and so which attributes those
 * have), the string operations behind them, % formatting, and the globals
 * range, dict, namespace, raise_exception and strftime_now.
 */
#include <math.h>
#include <time.h>

#include <utf8proc.h>

#include "base/alloc.h"
#include "base/utf8.h"
#include "text/jinja_int.h"

/* --- argument checks -------------------------------------------------------- */
static int need_int(struct rs *r, const struct hp_jval *v, const char *what, int64_t *out)
{
	if (v->type == JV_UNDEF) {
		jj_undef_err(r, v);
		return -1;
	}
	if (v->type != JV_INT && v->type != JV_BOOL) {
		jj_rerr(r, "%s: '%s' object cannot be interpreted as an integer", what, jj_type_name(v));
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
		return jj_undef_err(r, v);
	return jj_rerr(r, "%s: must be str, not %s", what, jj_type_name(v));
}

/* a required argument v of what(): when not given (NULL), the error "what() <missing>" */
static struct hp_jval *arg_str(struct rs *r, struct hp_jval *v, const char *what, const char *missing)
{
	return v ? need_str(r, v, what) : jj_rerr(r, "%s() %s", what, missing);
}

static int arg_int(struct rs *r, struct hp_jval *v, const char *what, const char *missing, int64_t *out)
{
	if (v)
		return need_int(r, v, what, out);
	jj_rerr(r, "%s() %s", what, missing);
	return -1;
}

/* --- string operations ------------------------------------------------------ */
static int in_chars(const struct hp_jval *chars, uint32_t c)
{
	size_t i = 0;

	if (!chars)
		return jj_py_isspace(c);
	while (i < chars->s.len)
		if (jj_u8dec(chars->s.s, chars->s.len, &i) == c)
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

			if (!in_chars(chars, jj_u8dec(v->s.s, b, &j)))
				break;
			a = j;
		}
	if (right)
		while (b > a) {
			size_t i = jj_u8prev(v->s.s, b), j = i;

			if (i < a || !in_chars(chars, jj_u8dec(v->s.s, b, &j)))
				break;
			b = i;
		}
	return jj_sub(r, v, a, b - a);
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
	struct hp_jval *x = jj_sub(r, v, off, len);

	return !x || jj_push(r, l, x) ? -1 : 0;
}

/* str.split/rsplit: rsplit collects its parts from the right, then reverses them */
static struct hp_jval *s_split(struct rs *r, struct hp_jval *v, struct hp_jval *sep, int64_t max, int rev)
{
	struct hp_jval *l = jj_mklist(r, 0, 0);
	const char *s = v->s.s;
	size_t n = v->s.len;

	if (!l)
		return NULL;
	if (sep && sep->type != JV_NONE) {
		if (sep->type != JV_STR)
			return jj_rerr(r, "must be str or None, not %s", jj_type_name(sep));
		if (!sep->s.len)
			return jj_rerr(r, "empty separator");
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

			while (i < n && (j = jj_ws_at(s, n, i)))
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
			while (i < n && !jj_ws_at(s, n, i))
				jj_u8dec(s, n, &i);
			if (push_sub(r, l, v, a, i - a))
				return NULL;
		}
	} else {
		size_t b = n;

		for (;;) {
			size_t e;

			b = jj_rstrip_ws_len(s, b);
			if (!b)
				break;
			if (max >= 0 && (int64_t)l->l.n >= max) {
				if (push_sub(r, l, v, 0, b))
					return NULL;
				break;
			}
			e = b;
			while (b > 0) {
				size_t p = jj_u8prev(s, b);

				if (jj_ws_at(s, e, p))
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
	struct sbuf b = jj_sb_new(r);
	size_t a = 0, n = v->s.len;
	int64_t done = 0;

	if (old->type != JV_STR || nw->type != JV_STR)
		return jj_rerr(r, "replace() arguments must be str");
	if (!old->s.len) {
		size_t i = 0;

		/* Python inserts the new text around every character */
		while (count < 0 || done < count) {
			jj_sb_val(&b, nw);
			done++;
			if (i >= n)
				break;
			a = i;
			jj_u8dec(v->s.s, n, &i);
			jj_sb_span(&b, v, a, i - a);
		}
		if (i < n)
			jj_sb_span(&b, v, i, n - i);
		return jj_sb_fin(r, &b);
	}
	for (;;) {
		const char *p = count >= 0 && done >= count ? NULL
				: mem_find(v->s.s + a, n - a, old->s.s, old->s.len);

		if (!p)
			break;
		jj_sb_span(&b, v, a, (size_t)(p - v->s.s) - a);
		jj_sb_val(&b, nw);
		a = (size_t)(p - v->s.s) + old->s.len;
		done++;
	}
	if (!done)
		return v;
	jj_sb_span(&b, v, a, n - a);
	return jj_sb_fin(r, &b);
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
		jj_sb_put(b, o, ol, v->s.tag ? v->s.tag + st : NULL, 0);
	else
		jj_sb_put(b, o, ol, NULL, v->s.tag ? v->s.tag[st] : 0);
}

static int final_sigma(const struct hp_jval *v, size_t st, size_t end)
{
	size_t i = 0, j = end;
	int before = 0, after = 0;

	/* a cased letter before (skipping case-ignorables is approximated by none) */
	if (st > 0) {
		i = jj_u8prev(v->s.s, st);
		j = i;
		before = jj_py_iscased(jj_u8dec(v->s.s, v->s.len, &j));
	}
	if (end < v->s.len) {
		j = end;
		after = jj_py_iscased(jj_u8dec(v->s.s, v->s.len, &j));
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
	b = jj_sb_new(r);
	while (i < v->s.len) {
		size_t st = i;
		uint32_t c = jj_u8dec(v->s.s, v->s.len, &i), m[3];
		int mode, k;

		switch (how) {
		case HOW_UPPER: mode = CASE_UPPER; break;
		case HOW_LOWER: mode = CASE_LOWER; break;
		case HOW_CAPITALIZE: mode = first ? CASE_TITLE : CASE_LOWER; break;
		case HOW_TITLE: mode = prev_cased ? CASE_LOWER : CASE_TITLE; break;
		default: {
			int cat = jj_cat_of(c);

			mode = cat == UTF8PROC_CATEGORY_LU ? CASE_LOWER : cat == UTF8PROC_CATEGORY_LL ? CASE_UPPER : -1;
		}
		}
		first = 0;
		if (how == HOW_TITLE)
			prev_cased = jj_py_iscased(c);
		if (mode < 0 || (i - st == 1 && c >= 0x80)) {
			jj_sb_span(&b, v, st, i - st);
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
	return jj_sb_fin(r, &b);
}

/* jinja's title filter: each run after [-\s({\[<]+ gets item[0].upper() + item[1:].lower() */
static struct hp_jval *f_title(struct rs *r, struct hp_jval *v)
{
	struct sbuf b = jj_sb_new(r);
	size_t i = 0;
	int start = 1;

	while (i < v->s.len) {
		size_t st = i;
		uint32_t c = jj_u8dec(v->s.s, v->s.len, &i), m[3];
		int k;

		if (jj_py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
			jj_sb_span(&b, v, st, i - st);
			start = 1;
			continue;
		}
		if (i - st == 1 && c >= 0x80) {
			jj_sb_span(&b, v, st, 1);
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
	return jj_sb_fin(r, &b);
}

/* code point index of byte offset off */
static int64_t cp_index(const struct hp_jval *v, size_t off)
{
	size_t i = 0;
	int64_t k = 0;

	if (v->flags & JF_ASCII)
		return (int64_t)off;
	while (i < off) {
		jj_u8dec(v->s.s, v->s.len, &i);
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
		if (!pred(jj_u8dec(v->s.s, v->s.len, &i)))
			return 0;
	return 1;
}

static int is_lower_cp(uint32_t c)
{
	return jj_cat_of(c) == UTF8PROC_CATEGORY_LL;
}

static int is_upper_cp(uint32_t c)
{
	int k = jj_cat_of(c);

	return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT;
}

/* str.islower / isupper: some cased character, none of the other case */
static int s_iscase(const struct hp_jval *v, int upper)
{
	size_t i = 0;
	int cased = 0;

	while (i < v->s.len) {
		uint32_t c = jj_u8dec(v->s.s, v->s.len, &i);

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
		return jj_rerr(r, "a string longer than %zu MiB (limit)", r->lim_output >> 20);
	if (fill) {
		if (fill->type != JV_STR || fill->s.ncp != 1)
			return jj_rerr(r, "the fill character must be exactly one character long");
		fc = fill->s.s;
		fl = fill->s.len;
	}
	left = where == 0 ? marg / 2 + (marg & width & 1) : where < 0 ? 0 : marg;
	b = jj_sb_new(r);
	for (int64_t i = 0; i < left; i++)
		jj_sb_put(&b, fc, fl, NULL, 0);
	jj_sb_val(&b, v);
	for (int64_t i = left; i < marg; i++)
		jj_sb_put(&b, fc, fl, NULL, 0);
	return jj_sb_fin(r, &b);
}

/* match a's arguments from position skip on to the parameter names */
static int bind(struct rs *r, const char *what, const struct args *a, int skip, const char *const *names,
		int nn, struct hp_jval **out)
{
	for (int i = 0; i < nn; i++)
		out[i] = NULL;
	if (a->np - skip > nn) {
		jj_rerr(r, "%s() takes at most %d argument%s (%d given)", what, nn, nn == 1 ? "" : "s",
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
			jj_rerr(r, "%s() got an unexpected keyword argument '%s'", what, a->kn[k]);
			return -1;
		}
		if (out[j]) {
			jj_rerr(r, "%s() got multiple values for argument '%s'", what, a->kn[k]);
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
		jj_sb_put(b, out, (size_t)k < sizeof(out) ? (size_t)k : sizeof(out) - 1, NULL, 0);
}

struct hp_jval *jj_str_format(struct rs *r, struct hp_jval *fmt, struct hp_jval *args)
{
	struct sbuf b = jj_sb_new(r);
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
			jj_sb_span(&b, fmt, i, n - i);
			break;
		}
		jj_sb_span(&b, fmt, i, (size_t)(p - s) - i);
		i = (size_t)(p - s) + 1;
		if (i < n && s[i] == '%') {
			jj_sb_ch(&b, '%', fmt->s.tag ? fmt->s.tag[i] : 0);
			i++;
			continue;
		}
		arg = NULL;
		if (i < n && s[i] == '(') {
			const char *e = memchr(s + i, ')', n - i);
			struct jent *en;

			if (!e)
				return jj_rerr(r, "incomplete format key");
			if (!mapping)
				return jj_rerr(r, "format requires a mapping");
			en = jj_dict_find_str(args, s + i + 1, (size_t)(e - s) - i - 1);
			if (!en)
				return jj_rerr(r, "format key '%.*s' not found", (int)((size_t)(e - s) - i - 1),
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
			return jj_rerr(r, "incomplete format");
		conv = s[i++];
		if (!arg) {
			if (mapping && na == 1 && av == single)
				return jj_rerr(r, "format requires a mapping");
			if (argi >= na)
				return jj_rerr(r, "not enough arguments for format string");
			arg = av[argi++];
		}
		if (width > 4096 || prec > 4096)
			return jj_rerr(r, "format width or precision above 4096 is not supported");
		switch (conv) {
		case 's':
		case 'r': {
			struct hp_jval *x;
			size_t len, ncp;
			int left = strchr(flags, '-') != NULL;

			if (conv == 's') {
				x = jj_to_str(r, arg);
			} else {
				struct sbuf t = jj_sb_new(r);

				if (jj_put_repr(r, &t, arg, 0))
					return t.oom ? jj_room(r) : NULL;
				x = jj_sb_fin(r, &t);
			}
			if (!x)
				return NULL;
			len = x->s.len;
			ncp = x->s.ncp;
			if (prec >= 0 && (size_t)prec < ncp) {
				len = jj_cp_off(x, (size_t)prec);
				ncp = (size_t)prec;
			}
			if (!left)
				for (size_t k = ncp; (int)k < width; k++)
					jj_sb_ch(&b, ' ', 0);
			jj_sb_put(&b, x->s.s, len, x->s.tag, 0);
			if (left)
				for (size_t k = ncp; (int)k < width; k++)
					jj_sb_ch(&b, ' ', 0);
			break;
		}
		case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': case 'c': {
			long long v;

			if (arg->type == JV_FLOAT && conv != 'c' && conv != 'x' && conv != 'X' && conv != 'o') {
				if (!isfinite(arg->f))
					return jj_rerr(r, "cannot convert float infinity or NaN to integer");
				/* Python's ints are unbounded, hp's int64 (see jinja.h) */
				if (!(arg->f > -9223372036854775808.0 && arg->f < 9223372036854775808.0))
					return jj_rerr(r, "%%%c of %g: outside the 64-bit integers", conv, arg->f);
				v = (long long)arg->f;
			} else if (arg->type == JV_INT || arg->type == JV_BOOL) {
				v = arg->i;
			} else if (conv == 'c' && arg->type == JV_STR && arg->s.ncp == 1) {
				jj_sb_val(&b, arg);
				break;
			} else {
				return jj_rerr(r, "%%%c format: a real number is required, not %s", conv,
					       jj_type_name(arg));
			}
			if (conv == 'c') {
				char o[4];

				if (v < 0 || v > 0x10FFFF)
					return jj_rerr(r, "%%c arg not in range(0x110000)");
				jj_sb_put(&b, o, hp_utf8_encode((uint32_t)v, (unsigned char *)o), NULL, 0);
				break;
			}
			if (conv == 'u' || conv == 'i')
				conv = 'd';
			sb_conv(&b, flags, width, prec, (char[]){ 'l', 'l', conv, '\0' }, v);
			break;
		}
		case 'f': case 'F': case 'e': case 'E': case 'g': case 'G':
			if (!jj_isnum(arg))
				return jj_rerr(r, "must be real number, not %s", jj_type_name(arg));
			sb_conv(&b, flags, width, prec, (char[]){ conv, '\0' }, jj_numf(arg));
			break;
		default:
			return jj_rerr(r, "unsupported format character '%c'", conv);
		}
	}
	if (!mapping && argi < na && !(av == single && args->type == JV_LIST && !(args->flags & JF_TUPLE) && 0))
		return jj_rerr(r, "not all arguments converted during string formatting");
	return jj_sb_fin(r, &b);
}

/* --- tests ----------------------------------------------------------------- */
int jj_contains(struct rs *r, struct hp_jval *seq, struct hp_jval *x)
{
	switch (seq->type) {
	case JV_STR:
		if (x->type != JV_STR) {
			jj_rerr(r, "'in <string>' requires string as left operand, not %s", jj_type_name(x));
			return -1;
		}
		return mem_find(seq->s.s, seq->s.len, x->s.s, x->s.len) != NULL;
	case JV_LIST:
		for (size_t i = 0; i < seq->l.n; i++)
			if (jj_py_eq(seq->l.v[i], x))
				return 1;
		return 0;
	case JV_DICT:
		if (x->type == JV_LIST && !(x->flags & JF_TUPLE)) {
			jj_rerr(r, "unhashable type: 'list'");
			return -1;
		}
		if (x->type == JV_DICT) {
			jj_rerr(r, "unhashable type: 'dict'");
			return -1;
		}
		for (size_t i = 0; i < seq->d.n; i++)
			if (jj_py_eq(seq->d.e[i].k, x))
				return 1;
		return 0;
	case JV_UNDEF:
		return 0;
	}
	jj_rerr(r, "argument of type '%s' is not iterable", jj_type_name(seq));
	return -1;
}

/*
 * The tests.  Each is one function of the value tested v and the test's
 * first argument a: NULL when none was given, never NULL in a row with
 * TS_ARG.  It returns 1 or 0, or -1 with r's error set.  Adding a test is
 * one function and one row of tests[].
 */
#define TEST(fn) static int fn(struct rs *r, struct hp_jval *v, struct hp_jval *a)

TEST(t_defined)
{
	return v->type != JV_UNDEF;
}

TEST(t_undefined)
{
	return v->type == JV_UNDEF;
}

TEST(t_none)
{
	return v->type == JV_NONE;
}

TEST(t_boolean)
{
	return v->type == JV_BOOL;
}

TEST(t_false)
{
	return v->type == JV_BOOL && !v->i;
}

TEST(t_true)
{
	return v->type == JV_BOOL && v->i;
}

TEST(t_integer)
{
	return v->type == JV_INT;
}

TEST(t_float)
{
	return v->type == JV_FLOAT;
}

TEST(t_number)
{
	return jj_isnum(v);
}

TEST(t_string)
{
	return v->type == JV_STR;
}

TEST(t_mapping)
{
	return v->type == JV_DICT;
}

/* iterable and sequence: jinja's Undefined iterates as empty */
TEST(t_iterable)
{
	return v->type == JV_STR || v->type == JV_LIST || v->type == JV_DICT || v->type == JV_UNDEF;
}

TEST(t_callable)
{
	return v->type == JV_FUNC || v->type == JV_METHOD || v->type == JV_MACRO || v->type == JV_UNDEF;
}

/* there is no markup here, so nothing is escaped */
TEST(t_escaped)
{
	return 0;
}

static int odd_even(struct rs *r, struct hp_jval *v, int odd)
{
	struct hp_jval two = { .type = JV_INT, .i = 2 }, *m = jj_binop(r, OP_MOD, v, &two);

	if (!m)
		return -1;
	return jj_py_eq(m, VBOOL(odd));
}

TEST(t_odd)
{
	return odd_even(r, v, 1);
}

TEST(t_even)
{
	return odd_even(r, v, 0);
}

/* lower and upper: str(value).islower(), .isupper() */
TEST(t_lower)
{
	struct hp_jval *sv = jj_to_str(r, v);

	return sv ? s_iscase(sv, 0) : -1;
}

TEST(t_upper)
{
	struct hp_jval *sv = jj_to_str(r, v);

	return sv ? s_iscase(sv, 1) : -1;
}

/* a string without NUL bytes naming a filter (one refused included) or a test */
TEST(t_filter)
{
	if (v->type != JV_STR || strlen(v->s.s) != v->s.len)
		return 0;
	return jj_filter_index(v->s.s) >= 0 || jj_filter_unsupported(v->s.s);
}

TEST(t_test)
{
	if (v->type != JV_STR || strlen(v->s.s) != v->s.len)
		return 0;
	return jj_test_index(v->s.s) >= 0;
}

TEST(t_divisibleby)
{
	struct hp_jval *m = jj_binop(r, OP_MOD, v, a);

	return m ? jj_py_eq(m, VBOOL(0)) : -1;
}

TEST(t_eq)
{
	return jj_py_eq(v, a);
}

TEST(t_ne)
{
	return !jj_py_eq(v, a);
}

TEST(t_lt)
{
	int c;

	return jj_py_cmp(r, v, a, &c) ? -1 : c < 0;
}

TEST(t_le)
{
	int c;

	return jj_py_cmp(r, v, a, &c) ? -1 : c <= 0;
}

TEST(t_gt)
{
	int c;

	return jj_py_cmp(r, v, a, &c) ? -1 : c > 0;
}

TEST(t_ge)
{
	int c;

	return jj_py_cmp(r, v, a, &c) ? -1 : c >= 0;
}

TEST(t_in)
{
	return jj_contains(r, a, v);
}

/* Python's "is": None is None, and the small ints and bools are shared */
TEST(t_sameas)
{
	if (v->type != a->type)
		return 0;
	if (v->type == JV_NONE || v->type == JV_UNDEF)
		return v == a || v->type == JV_NONE;
	if (v->type == JV_BOOL || v->type == JV_INT)
		return v->i == a->i;
	return v == a;
}

#undef TEST

#define TS_UNDEF 1   /* given an Undefined as it is; for the others it raises its error */
#define TS_ARG 2     /* needs an argument: "test 'x' needs an argument" without one */

/* jinja2 3.1's builtin tests, in name order, then the operator aliases */
static const struct {
	const char *name;
	int (*fn)(struct rs *r, struct hp_jval *v, struct hp_jval *a);
	int flags;
} tests[] = {
	{ "boolean", t_boolean, TS_UNDEF },
	{ "callable", t_callable, TS_UNDEF },
	{ "defined", t_defined, TS_UNDEF },
	{ "divisibleby", t_divisibleby, TS_ARG },
	{ "eq", t_eq, TS_UNDEF | TS_ARG },
	{ "equalto", t_eq, TS_UNDEF | TS_ARG },
	{ "escaped", t_escaped, TS_UNDEF },
	{ "even", t_even, 0 },
	{ "false", t_false, TS_UNDEF },
	{ "filter", t_filter, TS_UNDEF },
	{ "float", t_float, TS_UNDEF },
	{ "ge", t_ge, TS_ARG },
	{ "gt", t_gt, TS_ARG },
	{ "greaterthan", t_gt, TS_ARG },
	{ "in", t_in, TS_UNDEF | TS_ARG },
	{ "integer", t_integer, TS_UNDEF },
	{ "iterable", t_iterable, TS_UNDEF },
	{ "le", t_le, TS_ARG },
	{ "lessthan", t_lt, TS_ARG },
	{ "lower", t_lower, 0 },
	{ "lt", t_lt, TS_ARG },
	{ "mapping", t_mapping, TS_UNDEF },
	{ "ne", t_ne, TS_UNDEF | TS_ARG },
	{ "none", t_none, TS_UNDEF },
	{ "number", t_number, TS_UNDEF },
	{ "odd", t_odd, 0 },
	{ "sameas", t_sameas, TS_UNDEF | TS_ARG },
	{ "sequence", t_iterable, TS_UNDEF },
	{ "string", t_string, TS_UNDEF },
	{ "test", t_test, TS_UNDEF },
	{ "true", t_true, TS_UNDEF },
	{ "undefined", t_undefined, TS_UNDEF },
	{ "upper", t_upper, 0 },
	{ "==", t_eq, TS_UNDEF | TS_ARG },
	{ "!=", t_ne, TS_UNDEF | TS_ARG },
	{ "<", t_lt, TS_ARG },
	{ "<=", t_le, TS_ARG },
	{ ">", t_gt, TS_ARG },
	{ ">=", t_ge, TS_ARG },
};

int jj_test_index(const char *name)
{
	for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++)
		if (!strcmp(tests[i].name, name))
			return (int)i;
	return -1;
}

int jj_test_takes_undefined(int id)
{
	return tests[id].flags & TS_UNDEF;
}

/* test id (jj_test_index's) of v with args[0, nargs); what an Undefined v gets is the caller's */
int jj_do_test(struct rs *r, int id, struct hp_jval *v, struct hp_jval **args, int nargs)
{
	struct hp_jval *a = nargs ? args[0] : NULL;

	if ((tests[id].flags & TS_ARG) && !a) {
		jj_rerr(r, "test '%s' needs an argument", tests[id].name);
		return -1;
	}
	return tests[id].fn(r, v, a);
}

/* a test named by a string argument (select, reject, ...) */
static int test_by_name(struct rs *r, struct hp_jval *name)
{
	int id;

	if (name->type != JV_STR)
		return (jj_rerr(r, "a test name must be a string"), -1);
	id = jj_test_index(name->s.s);
	if (id < 0 || strlen(name->s.s) != name->s.len)
		return (jj_rerr(r, "no test named '%.*s'", (int)(name->s.len > 100 ? 100 : name->s.len),
				name->s.s), -1);
	return id;
}

/* --- filters ---------------------------------------------------------------- */

/* jinja's make_attrgetter: "a.b.0" as item lookups, digits as integers */
static struct hp_jval *attr_path(struct rs *r, struct hp_jval *x, struct hp_jval *path)
{
	size_t i = 0;

	if (path->type == JV_INT) {
		return jj_get_item(r, x, path);
	}
	if (path->type != JV_STR)
		return jj_rerr(r, "an attribute must be a string or an integer");
	while (i <= path->s.len) {
		const char *p = memchr(path->s.s + i, '.', path->s.len - i);
		size_t e = p ? (size_t)(p - path->s.s) : path->s.len, k;
		int digits = e > i;

		for (k = i; k < e; k++)
			digits &= isdig(path->s.s[k]);
		if (digits && e - i < 18) {
			struct hp_jval key = { .type = JV_INT, .i = strtoll(path->s.s + i, NULL, 10) };

			x = jj_get_item(r, x, &key);
		} else {
			struct hp_jval *key = jj_sub(r, path, i, e - i);

			x = key ? jj_get_item(r, x, key) : NULL;
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

		if (jj_py_cmp(r, k[j], k[i], &c))
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
	struct hp_jval *l = jj_mklist(r, n, 0), **tv, **tk;

	if (!l)
		return NULL;
	tv = jj_ral(r, (n + 1) * sizeof(*tv));
	tk = jj_ral(r, (n + 1) * sizeof(*tk));
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
	struct hp_jval *t = jj_mklist(r, 2, JF_TUPLE);

	if (!t)
		return NULL;
	t->l.v[0] = a;
	t->l.v[1] = b;
	t->l.n = 2;
	return t;
}

static struct hp_jval *dict_items(struct rs *r, struct hp_jval *d, int flags)
{
	struct hp_jval *l = jj_mklist(r, d->d.n, flags);

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
	struct sbuf b = jj_sb_new(r);
	static struct hp_jval comma_sp = { .type = JV_STR, .flags = JF_ASCII, .s = { ", ", NULL, 2, 2 } };
	static struct hp_jval comma = { .type = JV_STR, .flags = JF_ASCII, .s = { ",", NULL, 1, 1 } };
	static struct hp_jval colon_sp = { .type = JV_STR, .flags = JF_ASCII, .s = { ": ", NULL, 2, 2 } };

	o.ascii = p[0] && jj_truthy(p[0]);
	if (p[1] && p[1]->type != JV_NONE) {
		if (p[1]->type == JV_STR) {
			o.indent = p[1];
		} else if (p[1]->type == JV_INT || p[1]->type == JV_BOOL) {
			int64_t k = p[1]->i < 0 ? 0 : p[1]->i;

			if (k > 1024)
				return jj_rerr(r, "tojson indent above 1024 is not supported");
			o.indent = jj_repeat(r, &jj_v_space, k);
			if (!o.indent)
				return NULL;
		} else {
			return jj_rerr(r, "tojson: indent must be an int or a string");
		}
	}
	o.isep = o.indent ? &comma : &comma_sp;
	o.ksep = &colon_sp;
	if (p[2] && p[2]->type != JV_NONE) {
		if (p[2]->type != JV_LIST || p[2]->l.n != 2 || p[2]->l.v[0]->type != JV_STR ||
		    p[2]->l.v[1]->type != JV_STR)
			return jj_rerr(r, "tojson: separators must be a pair of strings");
		o.isep = p[2]->l.v[0];
		o.ksep = p[2]->l.v[1];
	}
	o.sort = p[3] && jj_truthy(p[3]);
	if (jj_put_json(r, &b, v, &o, 0))
		return b.oom ? jj_room(r) : NULL;
	return jj_sb_fin(r, &b);
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
		c = jj_u8dec(s->s.s, n, i);
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
	struct sbuf b = jj_sb_new(r);
	int first = p[1] && jj_truthy(p[1]), blank = p[2] && jj_truthy(p[2]);
	size_t i = 0;

	if (p[0] && p[0]->type == JV_STR) {
		ind = p[0];
	} else {
		int64_t w = 4;

		if (p[0] && need_int(r, p[0], "indent", &w))
			return NULL;
		if (w > 4096)
			return jj_rerr(r, "indent width above 4096 is not supported");
		ind = jj_repeat(r, &jj_v_space, w);
		if (!ind)
			return NULL;
	}
	/* s += "\n"; s.splitlines() (the line breaks of str.splitlines) */
	nl = jj_mkstrc(r, "\n", 1);
	s = nl ? jj_concat2(r, s, nl) : NULL;
	lines = s ? jj_mklist(r, 0, 0) : NULL;
	if (!lines)
		return NULL;
	while (i < s->s.len) {
		size_t a = i, e = line_end(s, &i);

		if (jj_push(r, lines, jj_sub(r, s, a, e - a)))
			return NULL;
	}
	if (first)
		jj_sb_val(&b, ind);
	for (size_t k = 0; k < lines->l.n; k++) {
		struct hp_jval *ln = lines->l.v[k];

		if (k)
			jj_sb_ch(&b, '\n', 0);
		if (k && (blank || ln->s.len))
			jj_sb_val(&b, ind);
		jj_sb_val(&b, ln);
	}
	return jj_sb_fin(r, &b);
}

static struct hp_jval *f_escape(struct rs *r, struct hp_jval *s)
{
	struct sbuf b = jj_sb_new(r);

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
			jj_sb_str(&b, e, tg);
		else
			jj_sb_put(&b, s->s.s + i, 1, NULL, tg);
	}
	return jj_sb_fin(r, &b);
}

/*
 * The text of a number as Python's int() and float() read it: s without its
 * surrounding whitespace and without the underscores between digits, into
 * buf[80]; 0 when that leaves nothing or more than fits.
 */
static size_t py_numtext(const struct hp_jval *s, char *buf)
{
	size_t k = 0, i = 0, n = s->s.len;

	while (i < n && jj_py_isspace((unsigned char)s->s.s[i]))
		i++;
	while (n > i && jj_py_isspace((unsigned char)s->s.s[n - 1]))
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
			return jj_rerr(r, "method must be a string");
		method = p[1]->s.s;
	}
	if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
		return jj_rerr(r, "method must be 'common', 'ceil' or 'floor'");
	if (!jj_isnum(v))
		return jj_rerr(r, "type %s doesn't define __round__ method", jj_type_name(v));
	if (!strcmp(method, "common")) {
		if (v->type != JV_FLOAT)
			return prec >= 0 ? jj_mkint(r, v->i) : jj_rerr(r, "round() of an int to negative digits is not supported");
		if (prec < 0 || prec > 300 || !isfinite(v->f)) {
			if (!isfinite(v->f) || prec > 300)
				return jj_mkfloat(r, v->f);
			m = pow(10.0, (double)-prec);
			return jj_mkfloat(r, nearbyint(v->f / m) * m);
		}
		snprintf(buf, sizeof(buf), "%.*f", (int)prec, v->f);
		return jj_mkfloat(r, strtod(buf, NULL));
	}
	if (prec > 300 || prec < -300)
		return jj_rerr(r, "round precision out of range");
	m = pow(10.0, (double)prec);
	x = jj_numf(v) * m;
	x = !strcmp(method, "ceil") ? ceil(x) : floor(x);
	return jj_mkfloat(r, x / m);
}

static struct hp_jval *f_join(struct rs *r, struct hp_jval *v, struct hp_jval *d, struct hp_jval *attr,
			      int strict)
{
	struct hp_jval *items = jj_iter_list(r, v);
	struct sbuf b = jj_sb_new(r);

	if (!items)
		return NULL;
	if (d && d->type != JV_STR) {
		if (strict)
			return jj_rerr(r, "join() argument must be str, not %s", jj_type_name(d));
		d = jj_to_str(r, d);
		if (!d)
			return NULL;
	}
	for (size_t i = 0; i < items->l.n; i++) {
		struct hp_jval *x = items->l.v[i];

		if (i && d)
			jj_sb_val(&b, d);
		if (attr && attr->type != JV_NONE && !(x = attr_path(r, x, attr)))
			return NULL;
		if (strict && x->type != JV_STR)
			return jj_rerr(r, "sequence item %zu: expected str instance, %s found", i, jj_type_name(x));
		if (jj_put_str(r, &b, x))
			return b.oom ? jj_room(r) : NULL;
	}
	return jj_sb_fin(r, &b);
}

/* select and reject (want 1, 0), of the items or (attr) of an attribute of them */
static struct hp_jval *f_select(struct rs *r, const char *name, struct args *a, int attr, int want)
{
	struct hp_jval *items = jj_iter_list(r, a->pos[0]), *out;
	int base = attr ? 2 : 1, tid = -1;

	if (!items || !(out = jj_mklist(r, 0, 0)))
		return NULL;
	if (a->nk)
		return jj_rerr(r, "%s takes no keyword arguments", name);
	if (attr && a->np < 2)
		return jj_rerr(r, "%s needs an attribute", name);
	if (a->np > base && (tid = test_by_name(r, a->pos[base])) < 0)
		return NULL;
	for (size_t i = 0; i < items->l.n; i++) {
		struct hp_jval *x = items->l.v[i], *y = x;
		int t;

		if (attr && !(y = attr_path(r, x, a->pos[1])))
			return NULL;
		t = tid < 0 ? jj_truthy(y) : jj_do_test(r, tid, y, a->pos + base + 1, a->np - base - 1);
		if (t < 0)
			return NULL;
		if (t == want && jj_push(r, out, x))
			return NULL;
	}
	return out;
}

static struct hp_jval *f_map(struct rs *r, struct args *a)
{
	struct hp_jval *items = jj_iter_list(r, a->pos[0]), *out, *attr = NULL, *dflt = NULL;
	int fid = -1;

	if (!items || !(out = jj_mklist(r, items->l.n, 0)))
		return NULL;
	for (int k = 0; k < a->nk; k++) {
		if (!strcmp(a->kn[k], "attribute"))
			attr = a->kv[k];
		else if (!strcmp(a->kn[k], "default"))
			dflt = a->kv[k];
	}
	if (!attr) {
		if (a->np < 2 || a->pos[1]->type != JV_STR)
			return jj_rerr(r, "map requires a filter argument");
		fid = jj_filter_index(a->pos[1]->s.s);
		if (fid < 0)
			return jj_rerr(r, "no filter named '%.*s'", (int)(a->pos[1]->s.len > 100 ? 100 : a->pos[1]->s.len),
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
			fa.pos = jj_ral(r, (size_t)a->np * sizeof(*fa.pos));
			if (!fa.pos)
				return NULL;
			fa.pos[0] = items->l.v[i];
			for (int k = 2; k < a->np; k++)
				fa.pos[k - 1] = a->pos[k];
			fa.np = a->np - 1;
			y = jj_apply_filter(r, fid, &fa);
		}
		if (!y)
			return NULL;
		out->l.v[out->l.n++] = y;
	}
	return out;
}

static struct hp_jval *f_minmax(struct rs *r, struct hp_jval *v, struct hp_jval **p, int max)
{
	struct hp_jval *items = jj_iter_list(r, v), *best = NULL, *bk = NULL;
	int cs = p[0] && jj_truthy(p[0]);

	if (!items)
		return NULL;
	for (size_t i = 0; i < items->l.n; i++) {
		struct hp_jval *k = sort_key(r, items->l.v[i], p[1], cs);
		int c;

		if (!k)
			return NULL;
		if (best) {
			if (jj_py_cmp(r, k, bk, &c))
				return NULL;
			if (max ? c <= 0 : c >= 0)
				continue;
		}
		best = items->l.v[i];
		bk = k;
	}
	if (best && p[1] && p[1]->type != JV_NONE)
		return best;
	return best ? best : jj_mkundef(r, UN_MSG, "No aggregated item, sequence was empty.", 39, NULL);
}

static int64_t length_of(struct rs *r, struct hp_jval *v)
{
	switch (v->type) {
	case JV_STR: return (int64_t)v->s.ncp;
	case JV_LIST: return (int64_t)v->l.n;
	case JV_DICT: return (int64_t)v->d.n;
	case JV_UNDEF: return 0;
	}
	jj_rerr(r, "object of type '%s' has no len()", jj_type_name(v));
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
		return jj_rerr(r, "%s() takes no arguments", what); \
} while (0)
#define BIND(...) BIND_AT(name, 1, __VA_ARGS__)
#define NOARGS() NOARGS_AT(name, 1)
#define MBIND(what, ...) BIND_AT(what, 0, __VA_ARGS__)
#define MNOARGS(what) NOARGS_AT(what, 0)

/* --- methods ---------------------------------------------------------------- */
/*
 * The methods of str, dict, list and loop.  Each is one function of the
 * receiver (named by the second argument of METHOD), the method's name m
 * (for its errors; one function may serve several names and tell them
 * apart by it) and the call's arguments a.  A receiver type's table
 * lists the methods it has: jj_get_attr finds a method there and
 * jj_call_method calls it, so adding a method is one function and one row.
 */
#define METHOD(fn, self) \
	static struct hp_jval *fn(struct rs *r, struct hp_jval *self, const char *m, struct args *a)

struct method {
	const char *name;
	struct hp_jval *(*fn)(struct rs *r, struct hp_jval *self, const char *m, struct args *a);
};

/* the row of tab (ended by a NULL name) named by the n bytes at name, or NULL */
static const struct method *find_method(const struct method *tab, const char *name, size_t n)
{
	for (; tab->name; tab++)
		if (strlen(tab->name) == n && !memcmp(tab->name, name, n))
			return tab;
	return NULL;
}

/* methods a template may look up but that are not implemented */
METHOD(sm_unsupported, s)
{
	return jj_rerr(r, "str.%s() is not supported", m);
}

/* startswith and endswith */
METHOD(sm_affix, s)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL }, *x, **cands;
	int end = m[0] == 'e';
	size_t nc;

	MBIND(m, "prefix");
	if (!p[0])
		return jj_rerr(r, "%s() takes at least 1 argument", m);
	x = p[0];
	if (x->type == JV_STR) {
		cands = &x;
		nc = 1;
	} else if (x->type == JV_LIST && (x->flags & JF_TUPLE)) {
		cands = x->l.v;
		nc = x->l.n;
	} else {
		return jj_rerr(r, "%s first arg must be str or a tuple of str, not %s",
			       end ? "endswith" : "startswith", jj_type_name(x));
	}
	for (size_t i = 0; i < nc; i++) {
		struct hp_jval *c = cands[i];

		if (c->type != JV_STR)
			return jj_rerr(r, "tuple for %s must only contain str", end ? "endswith" : "startswith");
		if (c->s.len <= s->s.len &&
		    !memcmp(s->s.s + (end ? s->s.len - c->s.len : 0), c->s.s, c->s.len))
			return &jj_v_true;
	}
	return &jj_v_false;
}

/* split and rsplit */
METHOD(sm_split, s)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL };
	int64_t k = -1;

	MBIND(m, "sep", "maxsplit");
	if (p[1] && need_int(r, p[1], m, &k))
		return NULL;
	return s_split(r, s, p[0], k, m[0] == 'r');
}

/* strip, lstrip and rstrip */
METHOD(sm_strip, s)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL };

	MBIND(m, "chars");
	return s_strip(r, s, p[0], m, m[0] != 'r', m[0] != 'l');
}

/* upper, lower, title, capitalize, swapcase and casefold (as lower) */
METHOD(sm_case, s)
{
	MNOARGS(m);
	return s_case(r, s, m[0] == 'u' ? HOW_UPPER : (m[0] == 'l' || (m[1] == 'a' && m[2] == 's')) ? HOW_LOWER
			 : m[0] == 't' ? HOW_TITLE : m[0] == 'c' ? HOW_CAPITALIZE : HOW_SWAP);
}

METHOD(sm_replace, s)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL };
	int64_t k = -1;

	MBIND(m, "old", "new", "count");
	if (!p[0] || !p[1])
		return jj_rerr(r, "replace() takes at least 2 arguments");
	if (p[2] && need_int(r, p[2], m, &k))
		return NULL;
	return s_replace(r, s, p[0], p[1], k);
}

/* find, rfind, index, rindex and count */
METHOD(sm_find, s)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL };
	const char *hit;

	MBIND(m, "sub");
	if (!arg_str(r, p[0], m, "takes at least 1 argument"))
		return NULL;
	if (!strcmp(m, "count")) {
		size_t a0 = 0;
		int64_t cnt = 0;

		if (!p[0]->s.len)
			return jj_mkint(r, (int64_t)s->s.ncp + 1);
		while ((hit = mem_find(s->s.s + a0, s->s.len - a0, p[0]->s.s, p[0]->s.len))) {
			cnt++;
			a0 = (size_t)(hit - s->s.s) + p[0]->s.len;
		}
		return jj_mkint(r, cnt);
	}
	hit = m[0] == 'r' ? mem_rfind(s->s.s, s->s.len, p[0]->s.s, p[0]->s.len)
			  : mem_find(s->s.s, s->s.len, p[0]->s.s, p[0]->s.len);
	if (!hit)
		return !strcmp(m, "index") || !strcmp(m, "rindex") ? jj_rerr(r, "substring not found") : jj_mkint(r, -1);
	return jj_mkint(r, cp_index(s, (size_t)(hit - s->s.s)));
}

METHOD(sm_join, s)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL };

	MBIND(m, "iterable");
	if (!p[0])
		return jj_rerr(r, "join() takes exactly one argument");
	return f_join(r, p[0], s, NULL, 1);
}

/* the isX() methods that hold when every character is in a class */
static struct hp_jval *s_all(struct rs *r, struct hp_jval *s, const char *m, struct args *a,
			     int (*pred)(uint32_t))
{
	MNOARGS(m);
	return VBOOL(all_chars(s, pred));
}

METHOD(sm_isdigit, s)
{
	return s_all(r, s, m, a, jj_py_isdigit);
}

METHOD(sm_isalpha, s)
{
	return s_all(r, s, m, a, jj_py_isalpha);
}

METHOD(sm_isalnum, s)
{
	return s_all(r, s, m, a, jj_py_isalnum);
}

METHOD(sm_isspace, s)
{
	return s_all(r, s, m, a, jj_py_isspace);
}

/* islower and isupper */
METHOD(sm_iscase, s)
{
	MNOARGS(m);
	return VBOOL(s_iscase(s, m[2] == 'u'));
}

/* center, ljust and rjust */
METHOD(sm_pad, s)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL };
	int64_t k;

	MBIND(m, "width", "fillchar");
	if (arg_int(r, p[0], m, "takes at least 1 argument", &k))
		return NULL;
	return s_pad(r, s, k, p[1], m[0] == 'c' ? 0 : m[0] == 'l' ? -1 : 1);
}

/* removeprefix and removesuffix */
METHOD(sm_remove, s)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL };
	int end = m[6] == 's';

	MBIND(m, "affix");
	if (!arg_str(r, p[0], m, "takes exactly one argument"))
		return NULL;
	if (p[0]->s.len <= s->s.len &&
	    !memcmp(s->s.s + (end ? s->s.len - p[0]->s.len : 0), p[0]->s.s, p[0]->s.len))
		return jj_sub(r, s, end ? 0 : p[0]->s.len, s->s.len - p[0]->s.len);
	return s;
}

/* partition and rpartition */
METHOD(sm_partition, s)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL };
	const char *hit;
	struct hp_jval *t;

	MBIND(m, "sep");
	if (!arg_str(r, p[0], m, "takes exactly one argument"))
		return NULL;
	if (!p[0]->s.len)
		return jj_rerr(r, "empty separator");
	hit = m[0] == 'r' ? mem_rfind(s->s.s, s->s.len, p[0]->s.s, p[0]->s.len)
			  : mem_find(s->s.s, s->s.len, p[0]->s.s, p[0]->s.len);
	t = jj_mklist(r, 3, JF_TUPLE);
	if (!t)
		return NULL;
	if (!hit) {
		t->l.v[0] = m[0] == 'r' ? &jj_v_empty : s;
		t->l.v[1] = &jj_v_empty;
		t->l.v[2] = m[0] == 'r' ? s : &jj_v_empty;
	} else {
		size_t o = (size_t)(hit - s->s.s);

		t->l.v[0] = jj_sub(r, s, 0, o);
		t->l.v[1] = jj_sub(r, s, o, p[0]->s.len);
		t->l.v[2] = jj_sub(r, s, o + p[0]->s.len, s->s.len - o - p[0]->s.len);
		if (!t->l.v[0] || !t->l.v[1] || !t->l.v[2])
			return NULL;
	}
	t->l.n = 3;
	return t;
}

METHOD(sm_splitlines, s)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL };
	struct hp_jval *l = jj_mklist(r, 0, 0);
	size_t i = 0;

	MBIND(m, "keepends");
	if (!l)
		return NULL;
	while (i < s->s.len) {
		size_t st = i, e = line_end(s, &i), nx;

		nx = p[0] && jj_truthy(p[0]) ? i : e;
		if (jj_push(r, l, jj_sub(r, s, st, nx - st)))
			return NULL;
		if (e == s->s.len)
			break;
	}
	return l;
}

METHOD(sm_zfill, s)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL };
	struct sbuf b;
	size_t o = 0;
	int64_t k;

	MBIND(m, "width");
	if (arg_int(r, p[0], m, "takes exactly one argument", &k))
		return NULL;
	if (k <= (int64_t)s->s.ncp)
		return s;
	if (k > 4096)
		return jj_rerr(r, "zfill width above 4096 is not supported");
	b = jj_sb_new(r);
	if (s->s.len && (s->s.s[0] == '-' || s->s.s[0] == '+')) {
		jj_sb_put(&b, s->s.s, 1, s->s.tag, 0);
		o = 1;
	}
	for (int64_t i = (int64_t)s->s.ncp; i < k; i++)
		jj_sb_ch(&b, '0', 0);
	jj_sb_span(&b, s, o, s->s.len - o);
	return jj_sb_fin(r, &b);
}

static const struct method str_methods[] = {
	{ "startswith", sm_affix }, { "endswith", sm_affix },
	{ "split", sm_split }, { "rsplit", sm_split },
	{ "strip", sm_strip }, { "lstrip", sm_strip }, { "rstrip", sm_strip },
	{ "upper", sm_case }, { "lower", sm_case }, { "title", sm_case }, { "capitalize", sm_case },
	{ "replace", sm_replace },
	{ "find", sm_find }, { "rfind", sm_find }, { "count", sm_find },
	{ "join", sm_join },
	{ "isdigit", sm_isdigit }, { "isalpha", sm_isalpha }, { "isspace", sm_isspace },
	{ "isalnum", sm_isalnum }, { "islower", sm_iscase }, { "isupper", sm_iscase },
	{ "splitlines", sm_splitlines },
	{ "format", sm_unsupported },
	{ "index", sm_find }, { "rindex", sm_find },
	{ "swapcase", sm_case },
	{ "center", sm_pad }, { "ljust", sm_pad }, { "rjust", sm_pad },
	{ "zfill", sm_zfill },
	{ "casefold", sm_case },
	/* Python tells these from isdigit at the edges (superscripts, fractions) */
	{ "isnumeric", sm_isdigit }, { "isdecimal", sm_isdigit },
	{ "istitle", sm_unsupported },
	{ "partition", sm_partition }, { "rpartition", sm_partition },
	{ "removeprefix", sm_remove }, { "removesuffix", sm_remove },
	{ "expandtabs", sm_unsupported },
	{ NULL, NULL },
};

/* dict.copy and list.copy: values are never mutated, so the value itself */
METHOD(m_copy, self)
{
	MNOARGS(m);
	return self;
}

/* items, keys and values */
METHOD(dm_view, d)
{
	MNOARGS(m);
	return dict_items(r, d, m[0] == 'i' ? JF_ITEMS : m[0] == 'k' ? JF_KEYS : JF_VALUES);
}

METHOD(dm_get, d)
{
	struct hp_jval *p[2] = { NULL, NULL };

	MBIND("get", "key", "default");
	if (!p[0])
		return jj_rerr(r, "get expected at least 1 argument, got 0");
	for (size_t i = 0; i < d->d.n; i++)
		if (jj_py_eq(d->d.e[i].k, p[0]))
			return d->d.e[i].v;
	return p[1] ? p[1] : &jj_v_none;
}

static const struct method dict_methods[] = {
	{ "items", dm_view }, { "keys", dm_view }, { "values", dm_view },
	{ "get", dm_get },
	{ "copy", m_copy },
	{ NULL, NULL },
};

/* index and count: their one argument, the value */
static struct hp_jval *list_value_arg(struct rs *r, const char *m, struct args *a)
{
	struct hp_jval *p[2] = { NULL, NULL };

	MBIND(m, "value");
	if (!p[0])
		return jj_rerr(r, "%s() takes exactly one argument (0 given)", m);
	return p[0];
}

METHOD(lm_index, l)
{
	struct hp_jval *x = list_value_arg(r, m, a);

	if (!x)
		return NULL;
	for (size_t i = 0; i < l->l.n; i++)
		if (jj_py_eq(l->l.v[i], x))
			return jj_mkint(r, (int64_t)i);
	return jj_rerr(r, "value is not in list");
}

METHOD(lm_count, l)
{
	struct hp_jval *x = list_value_arg(r, m, a);
	int64_t c = 0;

	if (!x)
		return NULL;
	for (size_t i = 0; i < l->l.n; i++)
		c += jj_py_eq(l->l.v[i], x);
	return jj_mkint(r, c);
}

/* a dict's items(), keys() and values() have none of these (see jj_get_attr) */
static const struct method list_methods[] = {
	{ "index", lm_index }, { "count", lm_count }, { "copy", m_copy },
	{ NULL, NULL },
};

/* loop.cycle(*items): the item at this iteration's index */
METHOD(loopm_cycle, lv)
{
	if (a->nk)
		return jj_rerr(r, "%s() takes no keyword arguments", m);
	if (!a->np)
		return jj_rerr(r, "no items for cycling given");
	return a->pos[lv->loop->i % (size_t)a->np];
}

/* loop.changed(*values): the values as a tuple against the last call's */
METHOD(loopm_changed, lv)
{
	struct hp_jval *t;
	int ch;

	if (a->nk)
		return jj_rerr(r, "%s() takes no keyword arguments", m);
	t = jj_mklist(r, (size_t)a->np, JF_TUPLE);
	if (!t)
		return NULL;
	memcpy(t->l.v, a->pos, (size_t)a->np * sizeof(*t->l.v));
	t->l.n = (size_t)a->np;
	ch = !lv->loop->changed || !jj_py_eq(lv->loop->changed, t);
	lv->loop->changed = t;
	return VBOOL(ch);
}

static const struct method loop_methods[] = {
	{ "cycle", loopm_cycle }, { "changed", loopm_changed },
	{ NULL, NULL },
};

#undef METHOD

/* the methods of x's type, NULL for a type that has none */
static const struct method *methods_of(const struct hp_jval *x)
{
	switch (x->type) {
	case JV_STR: return str_methods;
	case JV_DICT: return dict_methods;
	case JV_LIST: return list_methods;
	case JV_LOOP: return loop_methods;
	}
	return NULL;
}

/* --- attributes ------------------------------------------------------------- */
/* what jinja's ImmutableSandbox refuses: the mutating methods */
static const char *const dict_unsafe[] = { "clear", "pop", "popitem", "setdefault", "update", NULL };
static const char *const list_unsafe[] = { "append", "reverse", "insert", "sort", "extend", "remove",
					   "pop", "clear", NULL };

static int in_list(const char *const *l, const char *s, size_t n)
{
	for (; *l; l++)
		if (strlen(*l) == n && !memcmp(*l, s, n))
			return 1;
	return 0;
}

/* the method value of row e of self's table: called later by jj_call_method */
static struct hp_jval *mkmethod(struct rs *r, struct hp_jval *self, const struct method *e)
{
	struct hp_jval *m = jj_mk(r, JV_METHOD);

	if (m) {
		m->meth.self = self;
		m->meth.name = e->name;
	}
	return m;
}

static struct hp_jval *loop_attr(struct rs *r, struct hp_jval *lv, const char *a, size_t n)
{
	struct jloop *l = lv->loop;
	const struct method *e;

#define IS(s) (n == sizeof(s) - 1 && !memcmp(a, s, n))
	if (IS("index"))
		return jj_mkint(r, (int64_t)l->i + 1);
	if (IS("index0"))
		return jj_mkint(r, (int64_t)l->i);
	if (IS("revindex"))
		return jj_mkint(r, (int64_t)(l->n - l->i));
	if (IS("revindex0"))
		return jj_mkint(r, (int64_t)(l->n - l->i - 1));
	if (IS("first"))
		return VBOOL(l->i == 0);
	if (IS("last"))
		return VBOOL(l->i + 1 == l->n);
	if (IS("length"))
		return jj_mkint(r, (int64_t)l->n);
	if (IS("depth"))
		return jj_mkint(r, 1);
	if (IS("depth0"))
		return jj_mkint(r, 0);
	if (IS("previtem"))
		return l->i ? l->items->l.v[l->i - 1]
			    : jj_mkundef(r, UN_MSG, "there is no previous item", 25, NULL);
	if (IS("nextitem"))
		return l->i + 1 < l->n ? l->items->l.v[l->i + 1]
				       : jj_mkundef(r, UN_MSG, "there is no next item", 21, NULL);
#undef IS
	if ((e = find_method(loop_methods, a, n)))
		return mkmethod(r, lv, e);
	return jj_mkundef(r, UN_ATTR, a, n, "LoopContext");
}

/* jinja's getattr: the attribute (a method), else the item */
struct hp_jval *jj_get_attr(struct rs *r, struct hp_jval *x, const char *a, size_t n)
{
	const char *tn = jj_type_name(x);
	const struct method *e;

	if (x->type == JV_UNDEF)
		return jj_undef_err(r, x);
	if (n && a[0] == '_')
		return jj_mkundef(r, UN_UNSAFE, a, n, tn);
	switch (x->type) {
	case JV_STR:
		if ((e = find_method(str_methods, a, n)))
			return mkmethod(r, x, e);
		break;
	case JV_DICT:
		if ((e = find_method(dict_methods, a, n)))
			return mkmethod(r, x, e);
		if (in_list(dict_unsafe, a, n))
			return jj_mkundef(r, UN_UNSAFE, a, n, tn);
		{
			struct jent *d = jj_dict_find_str(x, a, n);

			if (d)
				return d->v;
		}
		break;
	case JV_NS: {
		struct jent *d = jj_dict_find_str(x, a, n);

		if (d)
			return d->v;
		break;
	}
	case JV_LIST:
		if ((e = find_method(list_methods, a, n)) && !(x->flags & (JF_ITEMS | JF_KEYS | JF_VALUES)))
			return mkmethod(r, x, e);
		if (in_list(list_unsafe, a, n) && !(x->flags & JF_TUPLE))
			return jj_mkundef(r, UN_UNSAFE, a, n, tn);
		break;
	case JV_LOOP:
		return loop_attr(r, x, a, n);
	}
	return jj_mkundef(r, UN_ATTR, a, n, tn);
}

/* call the method value mv (jj_get_attr's) with a */
struct hp_jval *jj_call_method(struct rs *r, struct hp_jval *mv, struct args *a)
{
	struct hp_jval *self = mv->meth.self;
	const char *m = mv->meth.name;
	const struct method *tab = methods_of(self), *e;

	if (tab && (e = find_method(tab, m, strlen(m))))
		return e->fn(r, self, m, a);
	return jj_rerr(r, "'%s' object has no method %s", jj_type_name(self), m);
}

/*
 * The filters.  Each is one function of the value filtered v and all the
 * arguments a (a->pos[0] is the value as given), named name in its errors;
 * a string filter (FL_STR in its row) gets str(value) as v, Undefined
 * giving "", as jinja's soft_str does.  Adding a filter is one function
 * and one row of filters[].
 */
#define FILTER(fn) static struct hp_jval *fn(struct rs *r, const char *name, struct hp_jval *v, struct args *a)

FILTER(f_default)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };

	BIND("default_value", "boolean");
	if (v->type == JV_UNDEF || (p[1] && jj_truthy(p[1]) && !jj_truthy(v)))
		return p[0] ? p[0] : &jj_v_empty;
	return v;
}

FILTER(f_length)
{
	int64_t k;

	NOARGS();
	k = length_of(r, v);
	return k < 0 ? NULL : jj_mkint(r, k);
}

/* string and safe: there is no markup here, so both are str() */
FILTER(f_string)
{
	NOARGS();
	return jj_to_str(r, v);
}

FILTER(f_tojson_filter)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };

	BIND("ensure_ascii", "indent", "separators", "sort_keys");
	return f_tojson(r, v, p);
}

FILTER(f_list)
{
	struct hp_jval *s;

	NOARGS();
	s = jj_iter_list(r, v);
	if (s && s == v && (v->flags & (JF_TUPLE | JF_ITEMS | JF_KEYS | JF_VALUES))) {
		struct hp_jval *l = jj_mklist(r, v->l.n, 0);

		if (!l)
			return NULL;
		memcpy(l->l.v, v->l.v, v->l.n * sizeof(*l->l.v));
		l->l.n = v->l.n;
		return l;
	}
	return s;
}

FILTER(f_join_filter)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };

	BIND("d", "attribute");
	return f_join(r, v, p[0], p[1], 0);
}

FILTER(f_select_filter)
{
	return f_select(r, name, a, 0, 1);
}

FILTER(f_reject)
{
	return f_select(r, name, a, 0, 0);
}

FILTER(f_selectattr)
{
	return f_select(r, name, a, 1, 1);
}

FILTER(f_rejectattr)
{
	return f_select(r, name, a, 1, 0);
}

FILTER(f_map_filter)
{
	return f_map(r, a);
}

FILTER(f_items)
{
	NOARGS();
	if (v->type == JV_UNDEF)
		return jj_mklist(r, 0, 0);
	if (v->type != JV_DICT)
		return jj_rerr(r, "can only get item pairs from a mapping");
	return dict_items(r, v, 0);
}

static struct hp_jval *first_last(struct rs *r, const char *name, struct hp_jval *v, struct args *a,
				  int last)
{
	struct hp_jval *s;

	NOARGS();
	if (v->type == JV_UNDEF && last)
		return jj_undef_err(r, v);
	s = jj_iter_list(r, v);
	if (!s)
		return NULL;
	if (!s->l.n)
		return jj_mkundef(r, UN_MSG, !last ? "No first item, sequence was empty."
						: "No last item, sequence was empty.", 34, NULL);
	return s->l.v[!last ? 0 : s->l.n - 1];
}

FILTER(f_first)
{
	return first_last(r, name, v, a, 0);
}

FILTER(f_last)
{
	return first_last(r, name, v, a, 1);
}

FILTER(f_reverse)
{
	struct hp_jval *s;

	NOARGS();
	if (v->type == JV_STR) {
		struct hp_jval m1 = { .type = JV_INT, .i = -1 };

		return jj_get_slice(r, v, NULL, NULL, &m1);
	}
	s = jj_iter_list(r, v);
	if (!s)
		return NULL;
	{
		struct hp_jval *l = jj_mklist(r, s->l.n, 0);

		if (!l)
			return NULL;
		for (size_t i = s->l.n; i-- > 0;)
			l->l.v[l->l.n++] = s->l.v[i];
		return l;
	}
}

enum { SORT_SORT, SORT_UNIQUE, SORT_DICT };

/* sort, unique and dictsort: the items with their keys, then sorted or deduplicated */
static struct hp_jval *sort_like(struct rs *r, const char *name, struct hp_jval *v, struct args *a, int how)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };
	struct hp_jval *items, **keys;
	int cs, rev = 0;

	if (how == SORT_SORT) {
		BIND("reverse", "case_sensitive", "attribute");
		rev = p[0] && jj_truthy(p[0]);
		cs = p[1] && jj_truthy(p[1]);
		items = jj_iter_list(r, v);
	} else if (how == SORT_UNIQUE) {
		BIND("case_sensitive", "attribute");
		cs = p[0] && jj_truthy(p[0]);
		p[2] = p[1];
		items = jj_iter_list(r, v);
	} else {
		BIND("case_sensitive", "by", "reverse");
		cs = p[0] && jj_truthy(p[0]);
		rev = p[2] && jj_truthy(p[2]);
		if (v->type != JV_DICT)
			return jj_rerr(r, "dictsort needs a mapping");
		items = dict_items(r, v, 0);
		if (p[1] && (p[1]->type != JV_STR || (strcmp(p[1]->s.s, "key") && strcmp(p[1]->s.s, "value"))))
			return jj_rerr(r, "You can only sort by either \"key\" or \"value\"");
	}
	if (!items)
		return NULL;
	keys = jj_ral(r, (items->l.n + 1) * sizeof(*keys));
	if (!keys)
		return NULL;
	for (size_t i = 0; i < items->l.n; i++) {
		struct hp_jval *x = items->l.v[i];

		if (how == SORT_DICT)
			x = x->l.v[p[1] && !strcmp(p[1]->s.s, "value") ? 1 : 0];
		keys[i] = sort_key(r, x, how == SORT_DICT ? NULL : p[2], cs);
		if (!keys[i])
			return NULL;
	}
	if (how != SORT_UNIQUE)
		return sorted(r, items, keys, rev);
	{
		struct hp_jval *out = jj_mklist(r, 0, 0);

		if (!out)
			return NULL;
		for (size_t i = 0; i < items->l.n; i++) {
			size_t j;

			if (keys[i]->type == JV_DICT || (keys[i]->type == JV_LIST && !(keys[i]->flags & JF_TUPLE)))
				return jj_rerr(r, "unhashable type: '%s'", jj_type_name(keys[i]));
			for (j = 0; j < i; j++)
				if (jj_py_eq(keys[j], keys[i]))
					break;
			if (j == i && jj_push(r, out, items->l.v[i]))
				return NULL;
		}
		return out;
	}
}

FILTER(f_sort)
{
	return sort_like(r, name, v, a, SORT_SORT);
}

FILTER(f_unique)
{
	return sort_like(r, name, v, a, SORT_UNIQUE);
}

FILTER(f_dictsort)
{
	return sort_like(r, name, v, a, SORT_DICT);
}

FILTER(f_sum)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };
	struct hp_jval *items, *acc;

	BIND("attribute", "start");
	items = jj_iter_list(r, v);
	acc = p[1] ? p[1] : jj_mkint(r, 0);
	if (!items || !acc)
		return NULL;
	for (size_t i = 0; i < items->l.n; i++) {
		struct hp_jval *x = items->l.v[i];

		if (p[0] && !(x = attr_path(r, x, p[0])))
			return NULL;
		if (acc->type == JV_STR || x->type == JV_STR)
			return jj_rerr(r, "unsupported operand type(s) for +: '%s' and '%s'",
				       jj_type_name(acc), jj_type_name(x));
		if (!(acc = jj_binop(r, OP_ADD, acc, x)))
			return NULL;
	}
	return acc;
}

FILTER(f_max)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };

	BIND("case_sensitive", "attribute");
	return f_minmax(r, v, p, 1);
}

FILTER(f_min)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };

	BIND("case_sensitive", "attribute");
	return f_minmax(r, v, p, 0);
}

FILTER(f_attr)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };

	BIND("name");
	if (!p[0] || p[0]->type != JV_STR)
		return jj_rerr(r, "attr() needs a name");
	if (v->type == JV_DICT && !find_method(dict_methods, p[0]->s.s, p[0]->s.len))
		return jj_mkundef(r, UN_ATTR, p[0]->s.s, p[0]->s.len, "dict");
	return jj_get_attr(r, v, p[0]->s.s, p[0]->s.len);
}

FILTER(f_batch)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };
	struct hp_jval *items, *out, *cur = NULL;
	int64_t k;

	BIND("linecount", "fill_with");
	if (arg_int(r, p[0], "batch", "needs a line count", &k))
		return NULL;
	if (k <= 0)
		return jj_rerr(r, "batch() needs a positive line count");
	items = jj_iter_list(r, v);
	if (!items || !(out = jj_mklist(r, 0, 0)))
		return NULL;
	for (size_t i = 0; i < items->l.n; i++) {
		if (!cur || (int64_t)cur->l.n == k) {
			if (!(cur = jj_mklist(r, 0, 0)) || jj_push(r, out, cur))
				return NULL;
		}
		if (jj_push(r, cur, items->l.v[i]))
			return NULL;
	}
	if (cur && p[1] && p[1]->type != JV_NONE)
		while ((int64_t)cur->l.n < k)
			if (jj_push(r, cur, p[1]))
				return NULL;
	return out;
}

FILTER(f_int)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };
	int64_t base = 10, x;

	BIND("default", "base");
	if (p[1] && need_int(r, p[1], "int", &base))
		return NULL;
	if (v->type == JV_INT)
		return v;
	if (v->type == JV_BOOL)
		return jj_mkint(r, v->i);
	if (v->type == JV_FLOAT && isfinite(v->f) && fabs(v->f) < 9.2e18)
		return jj_mkint(r, (int64_t)v->f);
	if (v->type == JV_STR) {
		double d;

		if ((base == 10 || base == 2 || base == 8 || base == 16) && !parse_pyint(v, (int)base, &x))
			return jj_mkint(r, x);
		if (!parse_pyfloat(v, &d) && isfinite(d) && fabs(d) < 9.2e18)
			return jj_mkint(r, (int64_t)d);
	}
	return p[0] ? p[0] : jj_mkint(r, 0);
}

FILTER(f_float)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };
	double d;

	BIND("default");
	if (v->type == JV_FLOAT)
		return v;
	if (v->type == JV_INT || v->type == JV_BOOL)
		return jj_mkfloat(r, (double)v->i);
	if (v->type == JV_STR && !parse_pyfloat(v, &d))
		return jj_mkfloat(r, d);
	return p[0] ? p[0] : jj_mkfloat(r, 0.0);
}

FILTER(f_abs)
{
	NOARGS();
	if (v->type == JV_FLOAT)
		return jj_mkfloat(r, fabs(v->f));
	if (v->type == JV_INT || v->type == JV_BOOL) {
		if (v->i == INT64_MIN)
			return jj_rerr(r, "integer overflow (integers are 64-bit here)");
		return jj_mkint(r, v->i < 0 ? -v->i : v->i);
	}
	if (v->type == JV_UNDEF)
		return jj_undef_err(r, v);
	return jj_rerr(r, "bad operand type for abs(): '%s'", jj_type_name(v));
}

FILTER(f_round_filter)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };

	BIND("precision", "method");
	return f_round(r, v, p);
}

FILTER(f_format)
{
	struct hp_jval *args, *s;

	if (!(s = jj_to_str(r, v)))
		return NULL;
	if (a->np > 1 && a->nk)
		return jj_rerr(r, "can't handle positional and keyword arguments at the same time");
	if (a->nk) {
		args = jj_mk(r, JV_DICT);
		if (!args)
			return NULL;
		for (int i = 0; i < a->nk; i++) {
			struct hp_jval *kk = jj_mkstrc(r, a->kn[i], strlen(a->kn[i]));

			if (!kk || jj_dict_put(&r->ar, args, kk, a->kv[i]))
				return jj_room(r);
		}
	} else {
		args = jj_mklist(r, (size_t)a->np, JF_TUPLE);
		if (!args)
			return NULL;
		for (int i = 1; i < a->np; i++)
			args->l.v[args->l.n++] = a->pos[i];
	}
	return jj_str_format(r, s, args);
}

/* the string filters (FL_STR): v is str(value) */
FILTER(f_trim)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };

	BIND("chars");
	return s_strip(r, v, p[0], "trim", 1, 1);
}

FILTER(f_upper)
{
	NOARGS();
	return s_case(r, v, HOW_UPPER);
}

FILTER(f_lower)
{
	NOARGS();
	return s_case(r, v, HOW_LOWER);
}

FILTER(f_capitalize)
{
	NOARGS();
	return s_case(r, v, HOW_CAPITALIZE);
}

FILTER(f_title_filter)
{
	NOARGS();
	return f_title(r, v);
}

FILTER(f_replace)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };
	int64_t k;

	BIND("old", "new", "count");
	k = -1;
	if (!p[0] || !p[1])
		return jj_rerr(r, "replace() needs old and new");
	if (p[2] && p[2]->type != JV_NONE && need_int(r, p[2], "replace", &k))
		return NULL;
	{
		struct hp_jval *o = jj_to_str(r, p[0]), *nw = o ? jj_to_str(r, p[1]) : NULL;

		return nw ? s_replace(r, v, o, nw, k) : NULL;
	}
}

FILTER(f_indent_filter)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };

	BIND("width", "first", "blank");
	return f_indent(r, v, p);
}

FILTER(f_wordcount)
{
	size_t i = 0;
	int64_t words = 0;
	int in = 0;

	NOARGS();
	while (i < v->s.len) {
		uint32_t c = jj_u8dec(v->s.s, v->s.len, &i);
		int w = c == '_' || jj_py_isalnum(c);

		words += w && !in;
		in = w;
	}
	return jj_mkint(r, words);
}

/* e, escape and forceescape: there is no markup here, so all three escape */
FILTER(f_escape_filter)
{
	NOARGS();
	return f_escape(r, v);
}

FILTER(f_center)
{
	struct hp_jval *p[4] = { NULL, NULL, NULL, NULL };
	int64_t k;

	BIND("width");
	k = 80;
	if (p[0] && need_int(r, p[0], "center", &k))
		return NULL;
	return s_pad(r, v, k, NULL, 0);
}

#undef FILTER

#define FL_STR 1   /* a string filter: it gets str(value) */

/* jinja2 3.1's builtin filters that this interpreter has, in name order */
static const struct {
	const char *name;
	struct hp_jval *(*fn)(struct rs *r, const char *name, struct hp_jval *v, struct args *a);
	int flags;
} filters[] = {
	{ "abs", f_abs, 0 },
	{ "attr", f_attr, 0 },
	{ "batch", f_batch, 0 },
	{ "capitalize", f_capitalize, FL_STR },
	{ "center", f_center, FL_STR },
	{ "count", f_length, 0 },
	{ "d", f_default, 0 },
	{ "default", f_default, 0 },
	{ "dictsort", f_dictsort, 0 },
	{ "e", f_escape_filter, FL_STR },
	{ "escape", f_escape_filter, FL_STR },
	{ "first", f_first, 0 },
	{ "float", f_float, 0 },
	{ "forceescape", f_escape_filter, FL_STR },
	{ "format", f_format, 0 },
	{ "indent", f_indent_filter, FL_STR },
	{ "int", f_int, 0 },
	{ "items", f_items, 0 },
	{ "join", f_join_filter, 0 },
	{ "last", f_last, 0 },
	{ "length", f_length, 0 },
	{ "list", f_list, 0 },
	{ "lower", f_lower, FL_STR },
	{ "map", f_map_filter, 0 },
	{ "max", f_max, 0 },
	{ "min", f_min, 0 },
	{ "reject", f_reject, 0 },
	{ "rejectattr", f_rejectattr, 0 },
	{ "replace", f_replace, FL_STR },
	{ "reverse", f_reverse, 0 },
	{ "round", f_round_filter, 0 },
	{ "safe", f_string, 0 },
	{ "select", f_select_filter, 0 },
	{ "selectattr", f_selectattr, 0 },
	{ "sort", f_sort, 0 },
	{ "string", f_string, 0 },
	{ "sum", f_sum, 0 },
	{ "title", f_title_filter, FL_STR },
	{ "tojson", f_tojson_filter, 0 },
	{ "trim", f_trim, FL_STR },
	{ "unique", f_unique, 0 },
	{ "upper", f_upper, FL_STR },
	{ "wordcount", f_wordcount, FL_STR },
};

/* jinja2 3.1 has these too; a template using one is refused, not misrendered */
static const char *const filter_unsup[] = {
	"filesizeformat", "groupby", "pprint", "random", "slice", "striptags", "truncate",
	"urlencode", "urlize", "wordwrap", "xmlattr", NULL,
};

int jj_filter_index(const char *name)
{
	for (size_t i = 0; i < sizeof(filters) / sizeof(filters[0]); i++)
		if (!strcmp(filters[i].name, name))
			return (int)i;
	return -1;
}

int jj_filter_unsupported(const char *name)
{
	for (int i = 0; filter_unsup[i]; i++)
		if (!strcmp(filter_unsup[i], name))
			return 1;
	return 0;
}

/* filter id (jj_filter_index's) applied to a->pos[0] with the rest of a */
struct hp_jval *jj_apply_filter(struct rs *r, int id, struct args *a)
{
	struct hp_jval *v = a->pos[0];

	if ((filters[id].flags & FL_STR) && !(v = jj_to_str(r, v)))
		return NULL;
	return filters[id].fn(r, filters[id].name, v, a);
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

/* the global function called name, or NULL */
struct hp_jval *jj_find_global(const char *name)
{
	for (size_t i = 0; i < sizeof(g_names) / sizeof(g_names[0]); i++)
		if (!strcmp(g_names[i], name))
			return &g_funcs[i];
	return NULL;
}

struct hp_jval *jj_call_global(struct rs *r, int g, struct args *a)
{
	struct hp_jval *p[3] = { NULL, NULL, NULL };

	switch (g) {
	case G_RANGE: {
		int64_t v[3] = { 0, 0, 1 }, cnt;
		struct hp_jval *l;

		if (a->nk)
			return jj_rerr(r, "range() takes no keyword arguments");
		if (a->np < 1 || a->np > 3)
			return jj_rerr(r, "range expected 1 to 3 arguments, got %d", a->np);
		for (int i = 0; i < a->np; i++)
			if (need_int(r, a->pos[i], "range", &v[a->np == 1 ? 1 : i]))
				return NULL;
		if (!v[2])
			return jj_rerr(r, "range() arg 3 must not be zero");
		if (v[2] > 0)
			cnt = v[1] > v[0] ? (v[1] - v[0] - 1) / v[2] + 1 : 0;
		else
			cnt = v[0] > v[1] ? (v[0] - v[1] - 1) / (-v[2]) + 1 : 0;
		if (cnt > LIM_RANGE)
			return jj_rerr(r, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).",
				       LIM_RANGE);
		if (jj_count_iters(r, (long)cnt))
			return NULL;
		l = jj_mklist(r, (size_t)cnt, 0);
		if (!l)
			return NULL;
		{
			struct hp_jval *ints = cnt ? jj_ral(r, (size_t)cnt * sizeof(*ints)) : NULL;

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
		struct hp_jval *d = jj_mk(r, g == G_DICT ? JV_DICT : JV_NS);

		if (!d)
			return NULL;
		if (a->np > 1)
			return jj_rerr(r, "%s expected at most 1 argument, got %d", g_names[g], a->np);
		if (a->np) {
			struct hp_jval *src = a->pos[0];

			if (src->type == JV_DICT) {
				for (size_t i = 0; i < src->d.n; i++)
					if (jj_dict_put(&r->ar, d, src->d.e[i].k, src->d.e[i].v))
						return jj_room(r);
			} else if (src->type == JV_LIST) {
				for (size_t i = 0; i < src->l.n; i++) {
					struct hp_jval *pr = src->l.v[i];

					if (pr->type != JV_LIST || pr->l.n != 2)
						return jj_rerr(r, "dictionary update sequence element #%zu has the wrong length", i);
					if (jj_dict_put(&r->ar, d, pr->l.v[0], pr->l.v[1]))
						return jj_room(r);
				}
			} else {
				return jj_rerr(r, "'%s' object is not iterable", jj_type_name(src));
			}
		}
		for (int i = 0; i < a->nk; i++) {
			struct jent *e = jj_dict_find_str(d, a->kn[i], strlen(a->kn[i]));
			struct hp_jval *k;

			if (g == G_NAMESPACE && a->kn[i][0] == '_')
				return jj_rerr(r, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'. Please rename the attribute.", a->kn[i]);
			if (e) {
				e->v = a->kv[i];
				continue;
			}
			k = jj_mkstrc(r, a->kn[i], strlen(a->kn[i]));
			if (!k || jj_dict_put(&r->ar, d, k, a->kv[i]))
				return jj_room(r);
		}
		if (g == G_NAMESPACE)
			for (size_t i = 0; i < d->d.n; i++)
				if (d->d.e[i].k->type == JV_STR && d->d.e[i].k->s.len && d->d.e[i].k->s.s[0] == '_')
					return jj_rerr(r, "Chat templates cannot store underscore-prefixed attributes on a namespace");
		return d;
	}
	case G_RAISE: {
		struct hp_jval *msg;

		MBIND("raise_exception", "message");
		if (!p[0])
			return jj_rerr(r, "raise_exception() missing 1 required positional argument: 'message'");
		msg = jj_to_str(r, p[0]);
		if (!msg)
			return NULL;
		return jj_rerr(r, "%.*s", (int)(msg->s.len > 400 ? 400 : msg->s.len), msg->s.s);
	}
	case G_STRFTIME: {
		char fmt[256], out[1024];
		time_t now = time(NULL);
		struct tm tm;
		size_t n;

		MBIND("strftime_now", "format");
		if (!p[0] || p[0]->type != JV_STR)
			return jj_rerr(r, "strftime_now() needs a format string");
		if (p[0]->s.len >= sizeof(fmt))
			return jj_rerr(r, "strftime_now() format longer than %zu bytes", sizeof(fmt) - 1);
		memcpy(fmt, p[0]->s.s, p[0]->s.len);
		fmt[p[0]->s.len] = '\0';
		if (!localtime_r(&now, &tm))
			return jj_rerr(r, "strftime_now(): no local time");
		n = strftime(out, sizeof(out), fmt, &tm);
		if (!n && fmt[0])
			return jj_rerr(r, "strftime_now(): the result is too long");
		return jj_mkstrc(r, out, n);
	}
	}
	return jj_rerr(r, "unknown function");
}

