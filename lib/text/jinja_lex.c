/*
 * jinja_lex.c - the lexer of the Jinja2 interpreter: a template's source to
 * tokens, following jinja2 3.1's lexer.py rule for rule (the whitespace
 * control of trim_blocks, lstrip_blocks, '-' and '+', {% raw %}, comments),
 * and the compile errors the lexer and the parser raise.
 */
#include "base/alloc.h"
#include "base/utf8.h"
#include "text/jinja_int.h"

/* --- lexer ------------------------------------------------------------------ */
int jj_cerr(struct comp *c, int code, int line, const char *fmt, ...)
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
		const char **nn = jj_aalloc(&c->t->ar, cap * sizeof(*nn));

		if (!nn)
			return NULL;
		if (c->nnames)
			memcpy(nn, c->names, c->nnames * sizeof(*nn));
		c->names = nn;
		c->capnames = cap;
	}
	d = jj_aalloc(&c->t->ar, n + 1);
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
		struct tok *nt = jj_aalloc(&c->t->ar, cap * sizeof(*nt));

		if (!nt) {
			jj_cerr(c, HP_ENOMEM, 0, "no memory");
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

static size_t skip_ws(const char *s, size_t n, size_t i)
{
	size_t k;

	while ((k = jj_ws_at(s, n, i)))
		i += k;
	return i;
}

int jj_count_nl(const char *s, size_t n)
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

	*line += jj_count_nl(s + i, j - i);
	return j;
}

/* emit a data token for s[0, n) after whitespace control */
static int lex_data(struct comp *c, const char *s, size_t n, int sign, int is_var, int line_starting,
		    int line)
{
	struct tok *t;

	if (sign == '-') {
		n = jj_rstrip_ws_len(s, n);
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
	char *o = jj_aalloc(&c->t->ar, n + 1);
	size_t k = 0;

	if (!o)
		return jj_cerr(c, HP_ENOMEM, 0, "no memory");
	for (size_t i = 0; i < n; i++) {
		uint32_t cp;
		int nd;

		if (s[i] != '\\') {
			o[k++] = s[i];
			continue;
		}
		if (++i >= n)
			return jj_cerr(c, HP_EFORMAT, t->line, "bad escape at end of string");
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
			return jj_cerr(c, HP_EUNSUP, t->line, "the \\N{...} escape is not supported");
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
				return jj_cerr(c, HP_EFORMAT, t->line, "truncated \\%c escape in a string", s[i]);
			cp = cp << 4 | (uint32_t)h;
		}
		i += (size_t)nd;
		if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
			return jj_cerr(c, HP_EFORMAT, t->line, "escape out of range or a surrogate in a string");
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
				return jj_cerr(c, HP_EUNSUP, line, "integer literal beyond 64 bits is not supported");
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
			return jj_cerr(c, HP_EFORMAT, *line, "unexpected end of template inside a %s tag",
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
				return jj_cerr(c, HP_ENOMEM, 0, "no memory");
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
				return jj_cerr(c, HP_EFORMAT, *line, "unterminated string");
			t = tk_add(c, T_STRING, *line);
			if (!t)
				return c->rc;
			if (lex_string(c, t, s + i + 1, j2 - i - 1))
				return c->rc;
			*line += jj_count_nl(s + i, j2 - i);
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
					return jj_cerr(c, HP_EUNSUP, *line, "non-ASCII names are not supported");
				return jj_cerr(c, HP_EFORMAT, *line, "unexpected char '%c'", s[i]);
			}
			t = tk_add(c, T_OP, *line);
			if (!t)
				return c->rc;
			t->op = (uint8_t)ops[k].op;
			if (t->op == OP_LPAREN || t->op == OP_LBRACKET || t->op == OP_LBRACE) {
				if (ns == LIM_NEST)
					return jj_cerr(c, HP_EFORMAT, *line, "brackets nested deeper than %d", LIM_NEST);
				stack[ns++] = t->op == OP_LPAREN ? ')' : t->op == OP_LBRACKET ? ']' : '}';
			} else if (t->op == OP_RPAREN || t->op == OP_RBRACKET || t->op == OP_RBRACE) {
				char want = s[i];

				if (!ns)
					return jj_cerr(c, HP_EFORMAT, *line, "unexpected '%c'", want);
				if (stack[--ns] != want)
					return jj_cerr(c, HP_EFORMAT, *line, "unexpected '%c', expected '%c'", want,
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

int jj_lex(struct comp *c)
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
				line += jj_count_nl(s + pos, r - pos);
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
					return jj_cerr(c, HP_EFORMAT, line, "missing end of raw directive");
				if (lex_data(c, s + body, k - body, rs, 0, line_starting, line))
					return c->rc;
				line += jj_count_nl(s + body, ee - body);
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
		line += jj_count_nl(s + pos, p - pos);
		line_starting = 0;
		if (kind == '#') {
			size_t k;

			for (k = q; k + 1 < n; k++) {
				if (s[k] == '+' && k + 2 < n && s[k + 1] == '#' && s[k + 2] == '}') {
					line += jj_count_nl(s + q, k - q);
					pos = k + 3;
					break;
				}
				if (s[k] == '-' && k + 2 < n && s[k + 1] == '#' && s[k + 2] == '}') {
					size_t m = skip_ws(s, n, k + 3);

					line += jj_count_nl(s + q, m - q);
					line_starting = m > k + 3 && s[m - 1] == '\n';
					pos = m;
					break;
				}
				if (s[k] == '#' && s[k + 1] == '}') {
					line += jj_count_nl(s + q, k - q);
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
				return jj_cerr(c, HP_EFORMAT, line, "missing end of comment tag");
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

const char *jj_describe(const struct tok *t)
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

