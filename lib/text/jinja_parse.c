/*
 * jinja_parse.c - the parser of the Jinja2 interpreter: tokens to the syntax
 * tree a template is compiled to once, with parser.py's precedence climbing
 * (so `-x|abs` and `2**3**2` group as jinja groups them), and
 * hp_jinja_compile itself.
 */
#include "base/alloc.h"
#include "base/utf8.h"
#include "text/jinja_int.h"

/* --- parser ----------------------------------------------------------------- */
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

static struct node *nnew(struct comp *c, int kind, int line)
{
	struct node *n = jj_acalloc(&c->t->ar, sizeof(*n));

	if (!n) {
		jj_cerr(c, HP_ENOMEM, 0, "no memory");
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
		struct node **nv = jj_aalloc(&c->t->ar, (size_t)cap * sizeof(*nv));

		if (!nv)
			return jj_cerr(c, HP_ENOMEM, 0, "no memory");
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
		return jj_cerr(c, HP_EFORMAT, cur(c)->line, "expected '%s', got '%s'", what, jj_describe(cur(c)));
	adv(c);
	return 0;
}

static int expect_type(struct comp *c, int type, const char *what)
{
	if (cur(c)->type != type)
		return jj_cerr(c, HP_EFORMAT, cur(c)->line, "expected %s, got '%s'", what, jj_describe(cur(c)));
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
		return jj_cerr(c, HP_EFORMAT, cur(c)->line, "expressions nested deeper than %d", LIM_NEST);
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
			return jj_cerr(c, HP_EUNSUP, cur(c)->line, "*args and **kwargs in calls are not supported");
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
				struct kwarg *nk = jj_aalloc(&c->t->ar, (size_t)cap * sizeof(*nk));

				if (!nk)
					return jj_cerr(c, HP_ENOMEM, 0, "no memory");
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
				return jj_cerr(c, HP_EFORMAT, line, "invalid syntax for function call expression");
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
			jj_cerr(c, HP_EFORMAT, a->line, "expected name or number");
			return NULL;
		}
		{
			struct hp_jval *v = jj_mkval(&c->t->ar, JV_INT);

			if (!v) {
				jj_cerr(c, HP_ENOMEM, 0, "no memory");
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
			jj_cerr(c, HP_EFORMAT, t->line, "expected an expression in []");
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
					jj_cerr(c, HP_EUNSUP, t->line, "a slice inside a subscript tuple is not supported");
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
		jj_cerr(c, HP_EFORMAT, cur(c)->line, "expected a %s name, got '%s'", what, jj_describe(cur(c)));
		return NULL;
	}
	name = cur(c)->s;
	adv(c);
	if (is_op(cur(c), OP_DOT)) {
		jj_cerr(c, HP_EUNSUP, line, "dotted %s names are not supported", what);
		return NULL;
	}
	id = kind == N_TEST ? jj_test_index(name) : jj_filter_index(name);
	if (kind == N_FILTER && id < 0 && jj_filter_unsupported(name)) {
		jj_cerr(c, HP_EUNSUP, line, "filter '%s' is not supported", name);
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
				jj_cerr(c, HP_EFORMAT, line, "you cannot chain multiple tests with is");
				return NULL;
			}
			arg = p_postfix(c, p_primary(c), 0);
			if (!arg)
				return NULL;
			n->v = jj_aalloc(&c->t->ar, sizeof(*n->v));
			if (!n->v) {
				jj_cerr(c, HP_ENOMEM, 0, "no memory");
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
			n = mkconst(c, &jj_v_true, t->line);
		} else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) {
			n = mkconst(c, &jj_v_false, t->line);
		} else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
			n = mkconst(c, &jj_v_none, t->line);
		} else {
			n = nnew(c, N_NAME, t->line);
			if (n)
				n->name = t->s;
			if (c->macro_depth && !strcmp(t->s, "varargs"))
				c->uses_varargs = 1;
			if (c->macro_depth && !strcmp(t->s, "kwargs"))
				c->uses_kwargs = 1;
			if (c->macro_depth && !strcmp(t->s, "caller")) {
				jj_cerr(c, HP_EUNSUP, t->line, "'caller' ({%% call %%} blocks) is not supported");
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
		s = jj_aalloc(&c->t->ar, len + 1);
		if (!s) {
			jj_cerr(c, HP_ENOMEM, 0, "no memory");
			return NULL;
		}
		while (cur(c)->type == T_STRING) {
			memcpy(s + k, cur(c)->s, cur(c)->n);
			k += cur(c)->n;
			adv(c);
		}
		s[k] = '\0';
		v = jj_mkstr_raw(&c->t->ar, s, k, NULL, 0);
		if (!v) {
			jj_cerr(c, HP_ENOMEM, 0, "no memory");
			return NULL;
		}
		n = mkconst(c, v, t->line);
	} else if (t->type == T_INT || t->type == T_FLOAT) {
		struct hp_jval *v = jj_mkval(&c->t->ar, t->type == T_INT ? JV_INT : JV_FLOAT);

		if (!v) {
			jj_cerr(c, HP_ENOMEM, 0, "no memory");
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
		jj_cerr(c, HP_EFORMAT, t->line, "unexpected '%s'", jj_describe(t));
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
			jj_cerr(c, HP_EUNSUP, line, "more than %d chained comparisons", (int)sizeof(opsbuf));
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
	n->ops = jj_aalloc(&c->t->ar, (size_t)nops);
	if (!n->ops) {
		jj_cerr(c, HP_ENOMEM, 0, "no memory");
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
			jj_cerr(c, HP_EFORMAT, cur(c)->line, "expected an expression, got '%s'", jj_describe(cur(c)));
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
			return jj_cerr(c, HP_EFORMAT, t->line, "can't assign to '%s'", t->name);
		return 0;
	}
	if (t->kind == N_TUPLE) {
		for (int i = 0; i < t->nv; i++)
			if (check_target(c, t->v[i]))
				return c->rc;
		return 0;
	}
	return jj_cerr(c, HP_EFORMAT, t->line, "can't assign to this expression");
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
			jj_cerr(c, HP_EFORMAT, cur(c)->line, "expected a name after '.'");
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
		jj_cerr(c, HP_EFORMAT, line, "tag name expected");
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
			jj_cerr(c, HP_EFORMAT, cur(c)->line, "expected 'in', got '%s'", jj_describe(cur(c)));
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
			jj_cerr(c, HP_EUNSUP, cur(c)->line, "recursive for loops are not supported");
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
				jj_cerr(c, HP_EFORMAT, line, "a block set needs a single name");
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
			jj_cerr(c, HP_EFORMAT, cur(c)->line, "expected a macro name");
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
				jj_cerr(c, HP_EFORMAT, cur(c)->line, "expected a parameter name, got '%s'",
					jj_describe(cur(c)));
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
				jj_cerr(c, HP_EFORMAT, p->line, "non-default argument follows default argument");
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
			jj_cerr(c, HP_EFORMAT, line, "'%s' outside of a loop", t->s);
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
				jj_cerr(c, HP_EUNSUP, line, "the '%s' tag is not supported", t->s);
				return NULL;
			}
	}
	jj_cerr(c, HP_EFORMAT, line, "encountered unknown tag '%s'", t->s);
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
				jj_cerr(c, HP_EFORMAT, t->line, "unexpected end of template, expected '%s'",
					ends[0]);
				return NULL;
			}
			break;
		}
		if (t->type == T_DATA) {
			struct hp_jval *v = jj_mkstr_raw(&c->t->ar, t->s, t->n, NULL, 0);

			adv(c);
			if (!v) {
				jj_cerr(c, HP_ENOMEM, 0, "no memory");
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
			jj_cerr(c, HP_EFORMAT, t->line, "unexpected '%s'", jj_describe(t));
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
		return jj_cerr(c, HP_EFORMAT, n->line, "no %s named '%s'", n->kind == N_FILTER ? "filter" : "test",
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
	s = jj_aalloc(&t->ar, len + 1);
	if (!s) {
		jj_cerr(&c, HP_ENOMEM, 0, "no memory");
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
		jj_cerr(&c, HP_EFORMAT, 1 + jj_count_nl(s, hp_utf8_valid_prefix(s, k)), "invalid UTF-8 in the template");
		goto fail;
	}
	if (jj_lex(&c))
		goto fail;
	t->root = p_body(&c, NULL, 0, &which);
	if (!t->root || check_soft(&c, t->root, 0))
		goto fail;
	*tp = t;
	return 0;
fail:
	if (!c.rc)
		jj_cerr(&c, HP_ENOMEM, 0, "no memory");
	hp_jinja_free(t);
	return c.rc;
}

void hp_jinja_free(struct hp_jinja *t)
{
	if (!t)
		return;
	jj_arena_free(&t->ar);
	hp_free(t->name);
	hp_free(t);
}

int hp_jinja_has_generation(const struct hp_jinja *t)
{
	return t && t->has_gen;
}

