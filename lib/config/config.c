/*
 * config.c - HyperParallel's YAML training config, read into struct hp_config.
 *
 * Three steps, each simple on its own.  libyaml's event parser builds a small
 * generic tree (mapping, sequence, scalar; each node with its line).  The
 * "--a.b=c" overrides are checked against the schema, their values parsed by
 * the same code, and grafted onto that tree.  Then one walk checks the tree
 * against a schema table (every section and key of hp-config(5) with its type,
 * default and whether it is required) and stores the values.  Because the
 * overrides land on the tree before the walk, they are type-checked by exactly
 * the code that checks the file.
 *
 * Scalars stay text in the tree; they are typed by the YAML 1.1 rules that
 * PyYAML uses (plus "1e-4" as a float, as OmegaConf does) only when a key asks
 * for a type, so a quoted "5" stays a string and `mode: off` can still be the
 * string "off" where "off" is an allowed value.
 *
 * What this is not: a general YAML library.  Aliases, complex keys, several
 * documents and tags beyond the YAML core schema are refused with a message.
 * Nor does it check that paths exist or that numbers make sense together
 * (batch divisibility, world size): the trainer knows the world size.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <unistd.h>
#include <jansson.h>
#include <yaml.h>

#include "base/alloc.h"
#include "base/fileio.h"
#include "config/config.h"
#include "text/chat.h"

/* ---- the generic tree --------------------------------------------------- */

enum node_kind { NODE_SCALAR, NODE_SEQ, NODE_MAP };

struct node {
	enum node_kind kind;
	int line;                /* 1-based line in its source */
	int plain;               /* scalar: unquoted and untagged, so typed by YAML 1.1 */
	char *text;              /* scalar value */
	char *key;               /* set when this node is a mapping value */
	const char *origin;      /* the override argument it came from; NULL: the file */
	struct node **kid;       /* sequence items or mapping values, in order */
	int n, cap;
};

/*
 * Nesting limit of the parser: a config is four levels deep; the limit only
 * stops hostile input from making the recursive walk and free deep.
 */
#define MAX_DEPTH 64

static struct node *node_new(enum node_kind kind, int line, const char *origin)
{
	struct node *n = hp_calloc(1, sizeof(*n));

	if (n) {
		n->kind = kind;
		n->line = line;
		n->origin = origin;
	}
	return n;
}

static void node_free(struct node *n)
{
	if (!n)
		return;
	for (int i = 0; i < n->n; i++)
		node_free(n->kid[i]);
	hp_free(n->kid);
	hp_free(n->text);
	hp_free(n->key);
	hp_free(n);
}

/* Append kid to parent; on failure the caller still owns kid. */
static int node_push(struct node *parent, struct node *kid)
{
	if (parent->n == parent->cap) {
		int cap = parent->cap ? 2 * parent->cap : 8;
		struct node **k = hp_realloc(parent->kid, (size_t)cap * sizeof(*k));

		if (!k)
			return HP_ENOMEM;
		parent->kid = k;
		parent->cap = cap;
	}
	parent->kid[parent->n++] = kid;
	return 0;
}

static struct node *node_getn(const struct node *m, const char *key, size_t len)
{
	if (!m || m->kind != NODE_MAP)
		return NULL;
	for (int i = 0; i < m->n; i++)
		if (strlen(m->kid[i]->key) == len && !memcmp(m->kid[i]->key, key, len))
			return m->kid[i];
	return NULL;
}

static struct node *node_get(const struct node *m, const char *key)
{
	return node_getn(m, key, strlen(key));
}

/* The mapping itself when it is a mapping; NULL when absent or null. */
static const struct node *node_map(const struct node *m, const char *key)
{
	const struct node *n = node_get(m, key);

	return n && n->kind == NODE_MAP ? n : NULL;
}

/* ---- YAML text to tree -------------------------------------------------- */

/* Prefix of every message about one source: "'train.yaml'" or "--a.b=c". */
static void src_name(char *buf, size_t n, const char *file, const char *origin)
{
	if (origin)
		snprintf(buf, n, "%s", origin);
	else
		snprintf(buf, n, "'%s'", file);
}

static int parse_err(struct hp_err *e, const char *file, const char *origin, int line,
		     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static int parse_err(struct hp_err *e, const char *file, const char *origin, int line,
		     const char *fmt, ...)
{
	char src[HP_ERR_MSG_MAX / 2], msg[HP_ERR_MSG_MAX / 2];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	src_name(src, sizeof(src), file, origin);
	/* an override is one line: its line number says nothing */
	if (origin)
		return hp_err_set(e, HP_ECONFIG, "%s: %s", src, msg);
	return hp_err_set(e, HP_ECONFIG, "%s line %d: %s", src, line, msg);
}

static int nomem(struct hp_err *e, const char *file)
{
	return hp_err_set(e, HP_ENOMEM, "'%s': out of memory", file);
}

static int yaml_failure(yaml_parser_t *p, const char *buf, size_t len, struct hp_err *e,
			const char *file, const char *origin)
{
	size_t line = p->problem_mark.line;

	if (p->error == YAML_MEMORY_ERROR)
		return nomem(e, file);
	if (p->error == YAML_READER_ERROR) {
		/* the reader knows only the byte offset of a bad encoding */
		line = 0;
		for (size_t i = 0; i < p->problem_offset && i < len; i++)
			line += buf[i] == '\n';
	} else if (p->error == YAML_SCANNER_ERROR && p->context) {
		/*
		 * A scanner notices a missing ':' or quote only on a later
		 * line; the context mark is where the bad token started.
		 */
		line = p->context_mark.line;
	}
	return parse_err(e, file, origin, (int)line + 1, "yaml parse error: %s%s%s",
			 p->problem ? p->problem : "unknown problem",
			 p->context ? " " : "", p->context ? p->context : "");
}

/* The YAML core schema tags; anything else (!!python/...) has no meaning here. */
static int tag_ok(const unsigned char *tag, int *forced_str)
{
	static const char *const core[] = { "null", "bool", "int", "float", "map", "seq", NULL };
	const char *t = (const char *)tag;
	const char *pfx = "tag:yaml.org,2002:";

	*forced_str = 0;
	if (!t)
		return 1;
	if (!strcmp(t, "!") || !strcmp(t, "tag:yaml.org,2002:str")) {
		*forced_str = 1;
		return 1;
	}
	if (strncmp(t, pfx, strlen(pfx)))
		return 0;
	for (int i = 0; core[i]; i++)
		if (!strcmp(t + strlen(pfx), core[i]))
			return 1;
	return 0;
}

struct level {
	struct node *n;
	char *key;               /* a mapping's key waiting for its value */
};

/* Hang n under the open container on top of st (or make it the root). */
static int attach(struct level *st, int depth, struct node **root, struct node *n,
		  struct hp_err *e, const char *file, const char *origin)
{
	struct level *top;

	if (depth == 0) {
		*root = n;
		return 0;
	}
	top = &st[depth - 1];
	if (top->n->kind == NODE_MAP && !top->key) {
		if (n->kind != NODE_SCALAR) {
			int line = n->line;

			node_free(n);
			return parse_err(e, file, origin, line,
					 "yaml mapping keys must be scalars");
		}
		for (int i = 0; i < top->n->n; i++) {
			if (!strcmp(top->n->kid[i]->key, n->text)) {
				int line = n->line;

				/* PyYAML keeps the last silently: say so instead */
				parse_err(e, file, origin, line, "duplicate key '%s'", n->text);
				node_free(n);
				return HP_ECONFIG;
			}
		}
		top->key = n->text;
		n->text = NULL;
		node_free(n);
		return 0;
	}
	if (top->n->kind == NODE_MAP) {
		n->key = top->key;
		top->key = NULL;
	}
	if (node_push(top->n, n)) {
		node_free(n);
		return nomem(e, file);
	}
	return 0;
}

/*
 * Parse buf into a tree.  Every node remembers origin (NULL for the file) so
 * that later errors name the override it came from.  An empty document gives
 * *out = NULL.
 */
static int build_tree(const char *buf, size_t len, const char *file, const char *origin,
		      struct node **out, struct hp_err *e)
{
	yaml_parser_t p;
	yaml_event_t ev;
	struct level st[MAX_DEPTH];
	struct node *root = NULL;
	int depth = 0, ndoc = 0, rc = 0, done = 0;

	*out = NULL;
	if (!yaml_parser_initialize(&p))
		return nomem(e, file);
	yaml_parser_set_input_string(&p, (const unsigned char *)buf, len);
	while (!done && !rc) {
		struct node *n = NULL;
		int line, forced_str;

		if (!yaml_parser_parse(&p, &ev)) {
			rc = yaml_failure(&p, buf, len, e, file, origin);
			break;
		}
		line = (int)ev.start_mark.line + 1;
		switch (ev.type) {
		case YAML_STREAM_END_EVENT:
			done = 1;
			break;
		case YAML_DOCUMENT_START_EVENT:
			if (++ndoc > 1)
				rc = parse_err(e, file, origin, line,
					       "more than one yaml document");
			break;
		case YAML_ALIAS_EVENT:
			/* copying aliases invites exponential blow-up; configs do not need them */
			rc = parse_err(e, file, origin, line,
				       "yaml aliases are not supported (*%s)",
				       (const char *)ev.data.alias.anchor);
			break;
		case YAML_SCALAR_EVENT:
			if (!tag_ok(ev.data.scalar.tag, &forced_str)) {
				rc = parse_err(e, file, origin, line, "unsupported yaml tag '%s'",
					       (const char *)ev.data.scalar.tag);
				break;
			}
			n = node_new(NODE_SCALAR, line, origin);
			if (n)
				n->text = hp_strndup((const char *)ev.data.scalar.value,
						     ev.data.scalar.length);
			if (!n || !n->text) {
				node_free(n);
				rc = nomem(e, file);
				break;
			}
			n->plain = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE && !forced_str;
			rc = attach(st, depth, &root, n, e, file, origin);
			break;
		case YAML_SEQUENCE_START_EVENT:
		case YAML_MAPPING_START_EVENT: {
			const unsigned char *tag = ev.type == YAML_MAPPING_START_EVENT ?
				ev.data.mapping_start.tag : ev.data.sequence_start.tag;

			if (!tag_ok(tag, &forced_str) || forced_str) {
				rc = parse_err(e, file, origin, line, "unsupported yaml tag '%s'",
					       (const char *)tag);
				break;
			}
			n = node_new(ev.type == YAML_MAPPING_START_EVENT ? NODE_MAP : NODE_SEQ,
				     line, origin);
			if (!n) {
				rc = nomem(e, file);
				break;
			}
			rc = attach(st, depth, &root, n, e, file, origin);
			if (rc)
				break;
			if (depth == MAX_DEPTH) {
				rc = parse_err(e, file, origin, line, "yaml nested too deeply");
				break;
			}
			st[depth].n = n;
			st[depth].key = NULL;
			depth++;
			break;
		}
		case YAML_SEQUENCE_END_EVENT:
		case YAML_MAPPING_END_EVENT:
			depth--;
			hp_free(st[depth].key);
			break;
		default:
			break;
		}
		yaml_event_delete(&ev);
	}
	yaml_parser_delete(&p);
	while (depth > 0)
		hp_free(st[--depth].key);
	if (rc) {
		node_free(root);
		return rc;
	}
	*out = root;
	return 0;
}

/* ---- typing scalars (YAML 1.1) ------------------------------------------- */

enum vtype { V_NULL, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_MAP };

static const char *const vtype_name[] = {
	"null", "bool", "int", "float", "str", "list", "mapping",
};

struct value {
	enum vtype t;
	long i;
	int overflow;            /* an int too large for long */
	double f;
	int b;
};

static int yaml_null(const char *s)
{
	return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
	       !strcmp(s, "NULL");
}

/* YAML 1.1 booleans as PyYAML reads them (not y/n). */
static int yaml_bool(const char *s, int *b)
{
	static const char *const t[] = { "true", "True", "TRUE", "yes", "Yes", "YES",
					 "on", "On", "ON", NULL };
	static const char *const f[] = { "false", "False", "FALSE", "no", "No", "NO",
					 "off", "Off", "OFF", NULL };

	for (int i = 0; t[i]; i++) {
		if (!strcmp(s, t[i]))
			return *b = 1, 1;
		if (!strcmp(s, f[i]))
			return *b = 0, 1;
	}
	return 0;
}

static int digit_in(char ch, int base)
{
	if (base == 2)
		return ch == '0' || ch == '1';
	if (base == 8)
		return ch >= '0' && ch <= '7';
	if (base == 10)
		return ch >= '0' && ch <= '9';
	return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

/* [-+]? then 0b.., 0x.., 0 + octal, or decimal; '_' separators allowed. */
static int yaml_int(const char *s, long *out, int *overflow)
{
	char digits[72];
	size_t nd = 0;
	int base = 10, neg = 0;
	unsigned long long u;
	const char *p = s;

	*overflow = 0;
	if (*p == '-' || *p == '+')
		neg = *p++ == '-';
	if (p[0] == '0' && p[1] == 'x')
		base = 16, p += 2;
	else if (p[0] == '0' && p[1] == 'b')
		base = 2, p += 2;
	else if (p[0] == '0' && p[1])
		base = 8, p += 1;
	else if (!(*p >= '0' && *p <= '9'))
		return 0;
	for (; *p; p++) {
		if (*p == '_')
			continue;
		if (!digit_in(*p, base))
			return 0;
		if (nd + 1 < sizeof(digits))
			digits[nd++] = *p;
		else
			*overflow = 1;
	}
	if (!nd)
		return 0;
	digits[nd] = '\0';
	errno = 0;
	u = strtoull(digits, NULL, base);
	if (errno == ERANGE || u > (unsigned long long)LONG_MAX + (neg ? 1 : 0))
		*overflow = 1;
	if (*overflow)
		return 1;
	*out = neg ? (long)(0 - (u - 1)) - 1 : (long)u;
	return 1;
}

/*
 * YAML 1.1 floats ("1.5", ".5", "1.", "-1.0e+3", ".inf", ".nan") and, as
 * OmegaConf and YAML 1.2 do, an exponent without a dot ("1e-4"), which
 * HyperParallel configs use for learning rates.
 */
static int yaml_float(const char *s, double *out)
{
	char buf[128];
	size_t nb = 0;
	int ndig = 0, dot = 0, expo = 0;
	const char *p = s;

	if (*p == '-' || *p == '+')
		p++;
	if (!strcmp(p, ".inf") || !strcmp(p, ".Inf") || !strcmp(p, ".INF")) {
		*out = *s == '-' ? -INFINITY : INFINITY;
		return 1;
	}
	if (p == s && (!strcmp(p, ".nan") || !strcmp(p, ".NaN") || !strcmp(p, ".NAN"))) {
		*out = NAN;
		return 1;
	}
	if (*p == '_')
		return 0;
	for (p = s; *p; p++) {
		if (*p == '_')
			continue;
		if (*p >= '0' && *p <= '9') {
			ndig += !expo;
		} else if (*p == '.' && !dot && !expo) {
			dot = 1;
		} else if ((*p == 'e' || *p == 'E') && !expo && ndig) {
			expo = 1;
			if (p[1] == '-' || p[1] == '+') {
				if (nb + 1 < sizeof(buf))
					buf[nb++] = *p;
				p++;
			}
			if (!(p[1] >= '0' && p[1] <= '9'))
				return 0;
		} else if ((*p == '-' || *p == '+') && p == s) {
			/* the sign, already checked */
		} else {
			return 0;
		}
		if (nb + 1 >= sizeof(buf))
			return 0;
		buf[nb++] = *p;
	}
	if (!ndig || !(dot || expo))
		return 0;
	buf[nb] = '\0';
	*out = strtod(buf, NULL);
	return 1;
}

static enum vtype value_of(const struct node *n, struct value *v)
{
	memset(v, 0, sizeof(*v));
	if (n->kind == NODE_MAP)
		return v->t = V_MAP;
	if (n->kind == NODE_SEQ)
		return v->t = V_LIST;
	if (!n->plain)
		return v->t = V_STR;
	if (yaml_null(n->text))
		return v->t = V_NULL;
	if (yaml_bool(n->text, &v->b))
		return v->t = V_BOOL;
	if (yaml_int(n->text, &v->i, &v->overflow))
		return v->t = V_INT;
	if (yaml_float(n->text, &v->f))
		return v->t = V_FLOAT;
	return v->t = V_STR;
}

/* The YAML type of n, for "got ..." in messages. */
static const char *got(const struct node *n)
{
	struct value v;

	return vtype_name[value_of(n, &v)];
}

static int node_is_null(const struct node *n)
{
	struct value v;

	return value_of(n, &v) == V_NULL;
}

/* ---- the schema ------------------------------------------------------------ */

enum ktype {
	T_INT,          /* long or int field */
	T_FLOAT,        /* double; an int is accepted */
	T_BOOL,         /* int 0/1 */
	T_STR,          /* char *; vals, when set, lists the allowed values */
	T_STR_NULL,     /* char * or NULL */
	T_ENUM,         /* int: index of the value in vals */
	T_TARGET,       /* char *: a _target_ whose name ends in one of vals */
	T_STRLIST,      /* char ** at off, int count at noff */
	T_PAIR,         /* [a, b]: double at off and at noff */
	T_INTLIST,      /* int * at off (each at least min when hasmin), int count at noff */
	T_MAP,          /* nested mapping, keys in sub */
	T_LIST,         /* list of mappings: array of isz-byte items at off, count at noff */
	T_ANY,          /* accepted, not looked at */
};

#define F_REQ      0x01  /* a missing key is an error */
#define F_PATH     0x02  /* a file path from the file: see resolve_path() */
#define F_SCALAR   0x04  /* T_STRLIST: one string is a one-element list */
#define F_OPEN     0x08  /* T_MAP: other keys are builder keywords, accepted */
#define F_NONEMPTY 0x10  /* T_STRLIST, T_INTLIST: at least one entry */

struct key {
	const char *name;          /* the YAML key */
	enum ktype type;
	unsigned flags;
	const char *pname;         /* row in hp_config_print; NULL: checked, not stored */
	size_t off, size, noff;
	long idef;                 /* default of T_INT, T_BOOL, T_ENUM */
	double fdef, fdef2;        /* default of T_FLOAT, T_PAIR */
	const char *sdef;          /* default of strings; T_STRLIST: comma-separated */
	int hasmin;
	long min;
	/* T_FLOAT, T_PAIR: every value finite, at least lo when has_lo, below
	 * hi when has_hi (the ranges torch checks are of these two shapes) */
	unsigned char has_lo, has_hi;
	double lo, hi;
	const char *const *vals;
	const struct key *sub;
	size_t isz;
};

#define CF(f) .off = offsetof(struct hp_config, f), \
	.size = sizeof(((struct hp_config *)0)->f)
#define CN(f) .noff = offsetof(struct hp_config, f)
#define PF(f) .off = offsetof(struct hp_plan_override, f), \
	.size = sizeof(((struct hp_plan_override *)0)->f)
#define MIN(x) .hasmin = 1, .min = (x)
#define GE(x) .has_lo = 1, .lo = (x)
#define LT(x) .has_hi = 1, .hi = (x)

static const char *const model_targets[] = {
	"HyperAutoModelForCausalLM.from_pretrained",
	"HyperAutoModelForCausalLM.from_config",
	"AutoModelForCausalLM.from_pretrained",
	"AutoModelForCausalLM.from_config",
	NULL,
};
static const char *const dataset_targets[] = {   /* index + 1 = enum hp_dataset_kind */
	"build_indexed_text_dataset",
	"build_online_text_dataset",
	"build_online_text_mapping_dataset",
	NULL,
};
static const char *const loader_targets[] = {
	"FixedBatchDataLoader", "DynamicBatchDataLoader", NULL,
};
static const char *const optim_targets[] = { "AdamW", NULL };
static const char *const sched_targets[] = { "MultiLRScheduler", NULL };

static const char *const torch_dtypes[] = { "auto", "bfloat16", "float16", "float32", NULL };
static const char *const mp_dtypes[] = { "bfloat16", "float16", "float32", NULL };
static const char *const loss_aggs[] = { "token_weighted", "rank_average", NULL };
static const char *const devices[] = { "cpu", "cuda", "auto", NULL };
static const char *const when_vals[] = { "cp", "ep", NULL };
static const char *const data_types[] = { "plaintext", "conversation", NULL };
static const char *const loss_tokens[] = { "assistant", "all", NULL };
static const char *const samplers[] = { "single", "cyclic", NULL };
static const char *const lr_styles[] = { "constant", "linear", "cosine", NULL };
static const char *const consolidated[] = { "none", "final", "every", NULL };
/* in the order of enum hp_act_ckpt (model.h) */
static const char *const ac_modes[] = { "off", "full", "selective", NULL };

const char *hp_act_ckpt_name(int mode)
{
	return mode >= 0 && mode < 3 ? ac_modes[mode] : "?";
}

static const struct key model_keys[] = {
	{ .name = "_target_", .type = T_TARGET, .flags = F_REQ, .pname = "model.target",
	  CF(model.target), .vals = model_targets },
	/* both land in model.path, chosen by the _target_ in finish() */
	{ .name = "pretrained_model_name_or_path", .type = T_STR, .flags = F_PATH },
	{ .name = "config_path", .type = T_STR, .flags = F_PATH },
	{ .name = "torch_dtype", .type = T_STR, .pname = "model.torch_dtype",
	  CF(model.torch_dtype), .sdef = "auto", .vals = torch_dtypes },
	{ .name = "num_hidden_layers", .type = T_INT, .pname = "model.num_hidden_layers",
	  CF(model.num_hidden_layers), MIN(0) },
	{ .name = "attn_implementation", .type = T_STR_NULL, .pname = "model.attn_implementation",
	  CF(model.attn_implementation) },
	{ .name = "force_hf", .type = T_BOOL, .pname = "model.force_hf", CF(model.force_hf) },
	{ .name = "local_files_only", .type = T_BOOL, .pname = "model.local_files_only",
	  CF(model.local_files_only) },
	{ .name = "validate_placement", .type = T_BOOL, .pname = "model.validate_placement",
	  CF(model.validate_placement) },
	{ NULL },
};

static const char *const loss_targets[] = { "ChunkedCausalLMLoss", "CausalLMLoss", NULL };

/* hp's extension: the LM head and cross-entropy in chunks of tokens, never
 * the whole [tokens, vocab] logits (the chunked_ce kernel of hp-plan(1)) */
static const struct key lossfn_keys[] = {
	{ .name = "_target_", .type = T_TARGET, .flags = F_REQ, .pname = "training.loss_fn",
	  CF(training.loss_fn), .vals = loss_targets },
	{ .name = "chunk_size", .type = T_INT, .pname = "training.loss_chunk_size",
	  CF(training.loss_chunk_size), .idef = 1024, MIN(1) },
	{ NULL },
};

static const struct key training_keys[] = {
	{ .name = "train_iters", .type = T_INT, .flags = F_REQ, .pname = "training.train_iters",
	  CF(training.train_iters), MIN(0) },
	{ .name = "global_batch_size", .type = T_INT, .pname = "training.global_batch_size",
	  CF(training.global_batch_size), .idef = 8, MIN(1) },
	{ .name = "micro_batch_size", .type = T_INT, .pname = "training.micro_batch_size",
	  CF(training.micro_batch_size), .idef = 1, MIN(1) },
	{ .name = "max_grad_norm", .type = T_FLOAT, .pname = "training.max_grad_norm",
	  CF(training.max_grad_norm), .fdef = 1.0, GE(0) },
	{ .name = "seed", .type = T_INT, .pname = "training.seed", CF(training.seed), .idef = 42 },
	{ .name = "enable_full_determinism", .type = T_BOOL,
	  .pname = "training.enable_full_determinism", CF(training.enable_full_determinism) },
	{ .name = "logging_steps", .type = T_INT, .pname = "training.logging_steps",
	  CF(training.logging_steps), .idef = 1, MIN(1) },
	{ .name = "eval_iters", .type = T_INT, .pname = "training.eval_iters",
	  CF(training.eval_iters), MIN(0) },
	{ .name = "eval_steps", .type = T_INT, .pname = "training.eval_steps",
	  CF(training.eval_steps), MIN(0) },
	{ .name = "loss_aggregation", .type = T_ENUM, .pname = "training.loss_aggregation",
	  CF(training.loss_aggregation), .vals = loss_aggs },
	{ .name = "init_device", .type = T_STR_NULL, .pname = "training.init_device",
	  CF(training.init_device) },
	{ .name = "device", .type = T_ENUM, .pname = "training.device",
	  CF(training.device), .vals = devices },
	/* hp's own: as torch.distributed's and Megatron's 10 minutes */
	{ .name = "collective_timeout_s", .type = T_FLOAT, .pname = "training.collective_timeout_s",
	  CF(training.collective_timeout_s), .fdef = 600, GE(0) },
	/* Megatron's name: the auxiliary-loss-free balancing of DeepSeek-V3 */
	{ .name = "moe_router_bias_update_rate", .type = T_FLOAT, .pname = "training.moe_router_bias_update_rate",
	  CF(training.moe_router_bias_update_rate), GE(0) },
	{ .name = "loss_fn", .type = T_MAP, .sub = lossfn_keys },
	{ NULL },
};

/* enum hp_pp_schedule */
static const char *const pp_schedules[] = { "1f1b", "gpipe", NULL };

static const struct key accel_keys[] = {
	{ .name = "tp_size", .type = T_INT, .pname = "accelerator.tp_size",
	  CF(accelerator.tp_size), .idef = 1, MIN(1) },
	{ .name = "cp_size", .type = T_INT, .pname = "accelerator.cp_size",
	  CF(accelerator.cp_size), .idef = 1, MIN(1) },
	{ .name = "ep_size", .type = T_INT, .pname = "accelerator.ep_size",
	  CF(accelerator.ep_size), .idef = 1, MIN(1) },
	{ .name = "pp_size", .type = T_INT, .pname = "accelerator.pp_size",
	  CF(accelerator.pp_size), .idef = 1, MIN(1) },
	{ .name = "pp_schedule", .type = T_ENUM, .pname = "accelerator.pp_schedule",
	  CF(accelerator.pp_schedule), .vals = pp_schedules },
	{ .name = "pp_vpp", .type = T_INT, .pname = "accelerator.pp_vpp",
	  CF(accelerator.pp_vpp), .idef = 1, MIN(1) },
	{ .name = "pp_layer_split", .type = T_INTLIST, .flags = F_NONEMPTY, .pname = "accelerator.pp_layer_split",
	  CF(accelerator.pp_layer_split), CN(accelerator.npp_layer_split), MIN(1) },
	{ .name = "pp_micro_batch_num", .type = T_INT, .pname = "accelerator.pp_micro_batch_num",
	  CF(accelerator.pp_micro_batch_num), .idef = 0, MIN(1) },
	{ .name = "sequence_parallel", .type = T_BOOL, .pname = "accelerator.sequence_parallel",
	  CF(accelerator.sequence_parallel) },
	{ .name = "loss_parallel", .type = T_BOOL, .pname = "accelerator.loss_parallel",
	  CF(accelerator.loss_parallel) },
	{ NULL },
};

static const struct key mixprec_keys[] = {
	{ .name = "param_dtype", .type = T_STR_NULL, .pname = "fsdp.param_dtype",
	  CF(fsdp.param_dtype), .vals = mp_dtypes },
	{ .name = "reduce_dtype", .type = T_STR_NULL, .pname = "fsdp.reduce_dtype",
	  CF(fsdp.reduce_dtype), .vals = mp_dtypes },
	{ .name = "output_dtype", .type = T_STR_NULL, .pname = "fsdp.output_dtype",
	  CF(fsdp.output_dtype), .vals = mp_dtypes },
	{ NULL },
};

static const struct key fsdp_keys[] = {
	{ .name = "dp_shard_size", .type = T_INT, .pname = "fsdp.dp_shard_size",
	  CF(fsdp.dp_shard_size), .idef = 1, MIN(1) },
	{ .name = "edp_shard_size", .type = T_INT, .pname = "fsdp.edp_shard_size",
	  CF(fsdp.edp_shard_size), .idef = 1, MIN(1) },
	{ .name = "reshard_after_forward", .type = T_BOOL, .pname = "fsdp.reshard_after_forward",
	  CF(fsdp.reshard_after_forward), .idef = 1 },
	{ .name = "reshard_after_backward", .type = T_BOOL, .pname = "fsdp.reshard_after_backward",
	  CF(fsdp.reshard_after_backward), .idef = 1 },
	{ .name = "requires_grad_sync", .type = T_BOOL, .pname = "fsdp.requires_grad_sync",
	  CF(fsdp.requires_grad_sync), .idef = 1 },
	{ .name = "forward_prefetch_depth", .type = T_INT, .pname = "fsdp.forward_prefetch_depth",
	  CF(fsdp.forward_prefetch_depth), .idef = 1, MIN(0) },
	{ .name = "backward_prefetch_depth", .type = T_INT, .pname = "fsdp.backward_prefetch_depth",
	  CF(fsdp.backward_prefetch_depth), .idef = 1, MIN(0) },
	{ .name = "mix_precision", .type = T_MAP, .sub = mixprec_keys },
	{ .name = "replicate_params", .type = T_STRLIST, .flags = F_SCALAR,
	  .pname = "fsdp.replicate_params", CF(fsdp.replicate_params), CN(fsdp.nreplicate_params) },
	{ .name = "enable_offload", .type = T_BOOL, .pname = "fsdp.enable_offload",
	  CF(fsdp.enable_offload) },
	{ NULL },
};

/* The builders inside a plan override: free strings here, the planner checks them. */
static const struct key replace_keys[] = {
	{ .name = "_target_", .type = T_STR, .flags = F_REQ, .pname = "replace_target",
	  PF(replace_target) },
	{ NULL },
};
static const struct key lcf_keys[] = {
	{ .name = "_target_", .type = T_STR, .flags = F_REQ, .pname = "local_compute_fn_target",
	  PF(local_compute_fn_target) },
	{ NULL },
};
static const struct key wrapper_keys[] = {
	{ .name = "_target_", .type = T_STR, .flags = F_REQ, .pname = "inner_wrapper_target",
	  PF(inner_wrapper_target) },
	{ NULL },
};

static const struct key override_keys[] = {
	{ .name = "match", .type = T_STRLIST, .flags = F_REQ | F_SCALAR | F_NONEMPTY,
	  .pname = "match", PF(match), .noff = offsetof(struct hp_plan_override, nmatch) },
	{ .name = "when", .type = T_STR_NULL, .pname = "when", PF(when), .vals = when_vals },
	{ .name = "module_type", .type = T_STR_NULL, .pname = "module_type", PF(module_type) },
	{ .name = "exact_type", .type = T_STR_NULL, .pname = "exact_type", PF(exact_type) },
	{ .name = "replace_module", .type = T_MAP, .sub = replace_keys },
	{ .name = "local_compute_fn", .type = T_MAP, .flags = F_OPEN, .sub = lcf_keys },
	{ .name = "inner_target", .type = T_STR_NULL, .pname = "inner_target", PF(inner_target) },
	{ .name = "inner_wrapper", .type = T_MAP, .sub = wrapper_keys },
	{ .name = "region_dispatch", .type = T_BOOL, .pname = "region_dispatch",
	  PF(region_dispatch), .idef = -1 },
	{ NULL },
};

static const struct key tokenizer_keys[] = {
	{ .name = "pretrained_model_name_or_path", .type = T_STR, .flags = F_PATH,
	  .pname = "dataset.tokenizer_path", CF(dataset.tokenizer_path) },
	/* the indexed dataset's end-of-document id, for eod_mask_loss and reset_* */
	{ .name = "eod_token_id", .type = T_INT, .pname = "dataset.eod_token_id",
	  CF(dataset.eod_token_id), .idef = -1, MIN(0) },
	{ NULL },
};
static const struct key assets_keys[] = {
	{ .name = "tokenizer", .type = T_MAP, .sub = tokenizer_keys },
	/* conversations: auto (the model's own), chatml, or a .jinja file */
	{ .name = "chat_template", .type = T_STR_NULL, .pname = "dataset.chat_template",
	  CF(dataset.chat_template), .sdef = "auto" },
	{ NULL },
};
static const struct key transform_keys[] = {
	{ .name = "data_type", .type = T_STR, .pname = "dataset.data_type",
	  CF(dataset.data_type), .sdef = "plaintext", .vals = data_types },
	{ .name = "text_keys", .type = T_STRLIST, .flags = F_SCALAR, .pname = "dataset.text_keys",
	  CF(dataset.text_keys), CN(dataset.ntext_keys), .sdef = "text" },
	{ .name = "max_seq_len", .type = T_INT, .pname = "dataset.max_seq_len",
	  CF(dataset.max_seq_len), MIN(0) },
	/* conversations: the message keys (ShareGPT: from, value) */
	{ .name = "role_key", .type = T_STR, .pname = "dataset.role_key", CF(dataset.role_key),
	  .sdef = "role" },
	{ .name = "content_key", .type = T_STR, .pname = "dataset.content_key", CF(dataset.content_key),
	  .sdef = "content" },
	/* hp's own: which tokens of a conversation have a loss */
	{ .name = "loss_tokens", .type = T_ENUM, .pname = "dataset.loss_tokens", CF(dataset.loss_tokens),
	  .vals = loss_tokens },
	{ NULL },
};
static const struct key dataconf_keys[] = {
	{ .name = "seq_length", .type = T_INT, .pname = "dataset.seq_length",
	  CF(dataset.seq_length), MIN(1) },
	/* default set in finish(): "98,1,1", or "100,0,0" beside valid_data_path */
	{ .name = "split", .type = T_STR_NULL, .pname = "dataset.split", CF(dataset.split) },
	{ .name = "is_dataset_from_mr", .type = T_BOOL, .pname = "dataset.is_dataset_from_mr",
	  CF(dataset.is_dataset_from_mr) },
	{ .name = "labels_are_shifted", .type = T_BOOL, .pname = "dataset.labels_are_shifted",
	  CF(dataset.labels_are_shifted) },
	{ .name = "eod_mask_loss", .type = T_BOOL, .pname = "dataset.eod_mask_loss",
	  CF(dataset.eod_mask_loss) },
	{ .name = "reset_position_ids", .type = T_BOOL, .pname = "dataset.reset_position_ids",
	  CF(dataset.reset_position_ids) },
	{ .name = "reset_attention_mask", .type = T_BOOL, .pname = "dataset.reset_attention_mask",
	  CF(dataset.reset_attention_mask) },
	{ .name = "shuffle", .type = T_BOOL, .pname = "dataset.shuffle", CF(dataset.shuffle) },
	{ .name = "create_attention_mask_in_dataloader", .type = T_BOOL,
	  .pname = "dataset.create_attention_mask_in_dataloader",
	  CF(dataset.create_attention_mask_in_dataloader) },
	/* hp's own: online mode counts and skips unreadable lines instead of failing */
	{ .name = "skip_invalid_lines", .type = T_BOOL, .pname = "dataset.skip_invalid_lines",
	  CF(dataset.skip_invalid_lines) },
	{ NULL },
};
static const struct key dataset_keys[] = {
	{ .name = "_target_", .type = T_TARGET, .flags = F_REQ, .pname = "dataset.target",
	  CF(dataset.target), .vals = dataset_targets },
	{ .name = "data_path", .type = T_STRLIST, .flags = F_SCALAR | F_PATH | F_NONEMPTY,
	  .pname = "dataset.data_path", CF(dataset.data_path), CN(dataset.ndata_path) },
	/* hp's own: validation data apart from data_path, of the same kind */
	{ .name = "valid_data_path", .type = T_STRLIST, .flags = F_SCALAR | F_PATH | F_NONEMPTY,
	  .pname = "dataset.valid_data_path", CF(dataset.valid_data_path), CN(dataset.nvalid_data_path) },
	{ .name = "model_assets", .type = T_MAP, .sub = assets_keys },
	{ .name = "data_transform", .type = T_MAP, .sub = transform_keys },
	{ .name = "data_config", .type = T_MAP, .sub = dataconf_keys },
	{ NULL },
};

static const struct key loader_keys[] = {
	{ .name = "_target_", .type = T_TARGET, .pname = "dataloader.target",
	  CF(dataloader.target), .sdef = "hyper_parallel.data.FixedBatchDataLoader",
	  .vals = loader_targets },
	{ .name = "sampler_type", .type = T_STR, .pname = "dataloader.sampler_type",
	  CF(dataloader.sampler_type), .sdef = "cyclic", .vals = samplers },
	{ .name = "drop_last", .type = T_BOOL, .pname = "dataloader.drop_last",
	  CF(dataloader.drop_last), .idef = 1 },
	{ NULL },
};

static const struct key adamw_keys[] = {
	/* the bounds are torch.optim.AdamW's own checks; NAN: unset, resolved
	 * with lr_config.lr in finish() */
	{ .name = "adamw_lr", .type = T_FLOAT, .pname = "optimizer.lr", CF(optimizer.lr),
	  .fdef = NAN, GE(0) },
	{ .name = "adamw_weight_decay", .type = T_FLOAT, .pname = "optimizer.weight_decay",
	  CF(optimizer.weight_decay), .fdef = 0.01, GE(0) },
	{ .name = "adamw_betas", .type = T_PAIR, .pname = "optimizer.betas",
	  CF(optimizer.beta1), CN(optimizer.beta2), .fdef = 0.9, .fdef2 = 0.999, GE(0), LT(1) },
	{ .name = "adamw_eps", .type = T_FLOAT, .pname = "optimizer.eps", CF(optimizer.eps),
	  .fdef = 1e-8, GE(0) },
	{ NULL },
};
static const struct key optim_keys[] = {
	{ .name = "_target_", .type = T_TARGET, .pname = "optimizer.target",
	  CF(optimizer.target), .sdef = "hyper_parallel.components.optim.AdamW",
	  .vals = optim_targets },
	{ .name = "adamw_config", .type = T_MAP, .sub = adamw_keys },
	{ .name = "no_decay_params", .type = T_STRLIST, .flags = F_SCALAR,
	  .pname = "optimizer.no_decay_params", CF(optimizer.no_decay_params),
	  CN(optimizer.nno_decay_params), .sdef = "bias,norm,ln_" },
	{ .name = "fp32_main_params", .type = T_BOOL, .pname = "optimizer.fp32_main_params",
	  CF(optimizer.fp32_main_params), .idef = 1 },
	{ NULL },
};

static const struct key lrconf_keys[] = {
	/* NAN: unset, the optimizer's adamw_lr (finish()) */
	{ .name = "lr", .type = T_FLOAT, .pname = "lr_scheduler.lr", CF(lr_scheduler.lr),
	  .fdef = NAN, GE(0) },
	{ .name = "lr_warmup_steps", .type = T_INT, .pname = "lr_scheduler.warmup_steps",
	  CF(lr_scheduler.warmup_steps), MIN(0) },
	{ .name = "min_lr", .type = T_FLOAT, .pname = "lr_scheduler.min_lr",
	  CF(lr_scheduler.min_lr), GE(0) },
	{ NULL },
};
static const struct key sched_keys[] = {
	{ .name = "_target_", .type = T_TARGET, .vals = sched_targets },
	{ .name = "lr_decay_style", .type = T_ENUM, .pname = "lr_scheduler.style",
	  CF(lr_scheduler.style), .vals = lr_styles },
	{ .name = "lr_config", .type = T_MAP, .sub = lrconf_keys },
	{ NULL },
};

static const struct key ckpt_keys[] = {
	{ .name = "save_ckpt", .type = T_BOOL, .pname = "checkpoint.save_ckpt",
	  CF(checkpoint.save_ckpt), .idef = 1 },
	{ .name = "checkpoint_dir", .type = T_STR, .flags = F_PATH,
	  .pname = "checkpoint.checkpoint_dir", CF(checkpoint.checkpoint_dir),
	  .sdef = "./checkpoints" },
	{ .name = "save_steps", .type = T_INT, .pname = "checkpoint.save_steps",
	  CF(checkpoint.save_steps), MIN(0) },
	{ .name = "restore_from", .type = T_STR_NULL, .pname = "checkpoint.restore_from",
	  CF(checkpoint.restore_from) },
	{ .name = "save_optimizer", .type = T_BOOL, .pname = "checkpoint.save_optimizer",
	  CF(checkpoint.save_optimizer), .idef = 1 },
	{ .name = "save_train_state", .type = T_BOOL, .pname = "checkpoint.save_train_state",
	  CF(checkpoint.save_train_state), .idef = 1 },
	{ .name = "save_consolidated", .type = T_STR, .pname = "checkpoint.save_consolidated",
	  CF(checkpoint.save_consolidated), .sdef = "none", .vals = consolidated },
	{ .name = "keep_last", .type = T_INT, .pname = "checkpoint.keep_last",
	  CF(checkpoint.keep_last), MIN(0) },
	{ NULL },
};

static const struct key ac_selection_keys[] = {
	{ .name = "layer_count", .type = T_INT, .pname = "activation_checkpoint.selection.layer_count",
	  CF(activation_checkpoint.layer_count), MIN(1) },
	{ .name = "layer_indices", .type = T_INTLIST, .flags = F_NONEMPTY, .pname = "activation_checkpoint.selection.layer_indices",
	  CF(activation_checkpoint.layer_indices), CN(activation_checkpoint.nlayer_indices), MIN(0) },
	{ NULL },
};

static const struct key ac_keys[] = {
	{ .name = "mode", .type = T_ENUM, .pname = "activation_checkpoint.mode",
	  CF(activation_checkpoint.mode), .vals = ac_modes },
	{ .name = "selection", .type = T_MAP, .sub = ac_selection_keys },
	{ NULL },
};

static const struct key debug_keys[] = {
	/* on by default, as Megatron checks every step's gradient norm */
	{ .name = "check_nan_inf", .type = T_BOOL, .pname = "debug.check_nan_inf",
	  CF(debug.check_nan_inf), .idef = 1 },
	{ .name = "inject_fault", .type = T_STR_NULL, .pname = "debug.inject_fault",
	  CF(debug.inject_fault) },
	{ NULL },
};

static const struct key root_keys[] = {
	{ .name = "model", .type = T_MAP, .flags = F_REQ, .sub = model_keys },
	{ .name = "training", .type = T_MAP, .flags = F_REQ, .sub = training_keys },
	{ .name = "accelerator", .type = T_MAP, .sub = accel_keys },
	{ .name = "fsdp_config", .type = T_MAP, .sub = fsdp_keys },
	{ .name = "plan_overrides", .type = T_LIST, .pname = "plan_overrides",
	  CF(overrides), CN(noverrides), .sub = override_keys,
	  .isz = sizeof(struct hp_plan_override) },
	{ .name = "dataset", .type = T_MAP, .sub = dataset_keys },
	{ .name = "dataloader", .type = T_MAP, .sub = loader_keys },
	{ .name = "optimizer", .type = T_MAP, .sub = optim_keys },
	{ .name = "lr_scheduler", .type = T_MAP, .sub = sched_keys },
	{ .name = "checkpoint", .type = T_MAP, .sub = ckpt_keys },
	{ .name = "activation_checkpoint", .type = T_MAP, .sub = ac_keys },
	{ .name = "debug", .type = T_MAP, .sub = debug_keys },
	/* accepted so that HyperParallel configs load; hp reads none of their keys */
	{ .name = "profiling", .type = T_ANY },
	{ .name = "wandb", .type = T_ANY },
	{ .name = "compile", .type = T_ANY },
	{ .name = "mixed_precision", .type = T_ANY },
	{ NULL },
};

static const struct key *key_findn(const struct key *tab, const char *name, size_t len)
{
	for (; tab->name; tab++)
		if (strlen(tab->name) == len && !memcmp(tab->name, name, len))
			return tab;
	return NULL;
}

/* ---- did you mean ---------------------------------------------------------- */

/* Optimal string alignment distance (a swap of neighbours costs 1). */
static int edit_distance(const char *a, size_t na, const char *b)
{
	enum { MAXLEN = 64 };
	int r0[MAXLEN + 1], r1[MAXLEN + 1], r2[MAXLEN + 1];
	int *pp = r0, *prev = r1, *cur = r2;
	size_t nb = strlen(b);

	if (na > MAXLEN || nb > MAXLEN)
		return INT_MAX;
	for (size_t j = 0; j <= nb; j++)
		prev[j] = (int)j;
	for (size_t i = 1; i <= na; i++) {
		int *t;

		cur[0] = (int)i;
		for (size_t j = 1; j <= nb; j++) {
			int cost = a[i - 1] != b[j - 1];
			int d = prev[j] + 1;

			if (cur[j - 1] + 1 < d)
				d = cur[j - 1] + 1;
			if (prev[j - 1] + cost < d)
				d = prev[j - 1] + cost;
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
			    pp[j - 2] + 1 < d)
				d = pp[j - 2] + 1;
			cur[j] = d;
		}
		t = pp;
		pp = prev;
		prev = cur;
		cur = t;
	}
	return prev[nb];
}

/*
 * The closest name in tab, when close enough to be a typo: within 2 edits
 * and fewer edits than the word has letters (so "x" does not suggest "lr").
 */
static const char *suggest(const struct key *tab, const char *name, size_t len)
{
	const char *best = NULL;
	int bestd = 3;

	for (; tab && tab->name; tab++) {
		int d = edit_distance(name, len, tab->name);

		if (d < bestd && (size_t)d < len) {
			bestd = d;
			best = tab->name;
		}
	}
	return best;
}

/* ---- the walk -------------------------------------------------------------- */

struct walk {
	struct hp_config *c;
	const char *file;
	struct hp_err *e;
	char path[512];          /* "$.dataset.data_path[1]" of the node in hand */
	size_t plen;
	int keep_paths;          /* paths were resolved already (a plan's config) */
};

static void path_push(struct walk *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void path_push(struct walk *w, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(w->path + w->plen, sizeof(w->path) - w->plen, fmt, ap);
	va_end(ap);
	if (n > 0)
		w->plen += (size_t)n;
	if (w->plen >= sizeof(w->path))
		w->plen = sizeof(w->path) - 1;
}

static void path_pop(struct walk *w, size_t len)
{
	w->plen = len;
	w->path[len] = '\0';
}

static int werr(struct walk *w, const struct node *n, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* "'train.yaml': $.a.b: msg", or "--a.b=c: $.a.b: msg" for an override's node. */
static int werr(struct walk *w, const struct node *n, const char *fmt, ...)
{
	char src[HP_ERR_MSG_MAX / 4], msg[HP_ERR_MSG_MAX / 2];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	src_name(src, sizeof(src), w->file, n ? n->origin : NULL);
	return hp_err_set(w->e, HP_ECONFIG, "%s: %s: %s", src, w->path, msg);
}

static void *field(void *base, size_t off)
{
	return (char *)base + off;
}

static void put_int(void *base, const struct key *k, long v)
{
	if (k->size == sizeof(int)) {
		int i = (int)v;

		memcpy(field(base, k->off), &i, sizeof(i));
	} else {
		memcpy(field(base, k->off), &v, sizeof(v));
	}
}

static long get_int(const void *base, const struct key *k)
{
	int i;
	long v;

	if (k->size == sizeof(int)) {
		memcpy(&i, (const char *)base + k->off, sizeof(i));
		return i;
	}
	memcpy(&v, (const char *)base + k->off, sizeof(v));
	return v;
}

static void free_strv(char **v, int n)
{
	for (int i = 0; v && i < n; i++)
		hp_free(v[i]);
	hp_free(v);
}

static int path_exists(const char *p, const char *ext)
{
	char buf[4096];

	if ((size_t)snprintf(buf, sizeof(buf), "%s%s", p, ext) >= sizeof(buf))
		return 0;
	return access(buf, F_OK) == 0;
}

/*
 * A relative path written in the file means what it means from the working
 * directory when something is there (HyperParallel's reading); otherwise it
 * is taken relative to the YAML file, so that a config next to its data works
 * from anywhere.  A Megatron prefix counts as existing when its .bin or .idx
 * does.  Paths from overrides were typed relative to the working directory
 * and are kept as given.
 */
static char *resolve_path(const struct walk *w, const struct node *n, const char *s)
{
	const char *slash = strrchr(w->file, '/');
	size_t dlen;
	char *r;

	if (w->keep_paths || n->origin || s[0] == '/' || !s[0] || !slash ||
	    path_exists(s, "") || path_exists(s, ".bin") || path_exists(s, ".idx"))
		return hp_strdup(s);
	while (s[0] == '.' && s[1] == '/')
		s += 2;
	dlen = (size_t)(slash - w->file) + 1;   /* keep the slash: "/" stays "/" */
	r = hp_malloc(dlen + strlen(s) + 1);
	if (r) {
		memcpy(r, w->file, dlen);
		memcpy(r + dlen, s, strlen(s) + 1);
	}
	return r;
}

static int is_member(const char *s, const char *const *vals)
{
	for (int i = 0; vals && vals[i]; i++)
		if (!strcmp(s, vals[i]))
			return i;
	return -1;
}

/* "a, b, c" (each with prefix) into buf. */
static void join_vals(char *buf, size_t n, const char *const *vals, const char *prefix)
{
	size_t at = 0;

	buf[0] = '\0';
	for (int i = 0; vals[i] && at < n; i++) {
		int r = snprintf(buf + at, n - at, "%s%s%s", i ? ", " : "", prefix, vals[i]);

		if (r < 0)
			break;
		at += (size_t)r;
	}
}

/* A _target_ matches a known name when equal to it or ending in ".name". */
static int target_index(const char *s, const char *const *vals)
{
	size_t ls = strlen(s);

	for (int i = 0; vals[i]; i++) {
		size_t lv = strlen(vals[i]);

		if (ls == lv && !strcmp(s, vals[i]))
			return i;
		if (ls > lv && s[ls - lv - 1] == '.' && !strcmp(s + ls - lv, vals[i]))
			return i;
	}
	return -1;
}

/* A float value of k: finite, and within k's bounds (the message names
 * them; n is where it was written). */
static int check_float(struct walk *w, const struct node *n, const struct key *k, double d)
{
	if (!isfinite(d))
		return werr(w, n, "%s is not a finite number", n->text);
	if (k->has_lo && k->has_hi && (d < k->lo || d >= k->hi))
		return werr(w, n, "must be in [%g, %g), got %s", k->lo, k->hi, n->text);
	if (k->has_lo && d < k->lo)
		return werr(w, n, "must be at least %g, got %s", k->lo, n->text);
	if (k->has_hi && d >= k->hi)
		return werr(w, n, "must be less than %g, got %s", k->hi, n->text);
	return 0;
}

static const char *type_name(const struct key *k)
{
	switch (k->type) {
	case T_INT: return "int";
	case T_FLOAT: return "float";
	case T_BOOL: return "bool";
	case T_STR_NULL: return "str or null";
	case T_STRLIST: return k->flags & F_SCALAR ? "str or list of str" : "list of str";
	case T_PAIR: return "list of 2 floats";
	case T_INTLIST: return "list of int";
	case T_MAP: return "mapping";
	case T_LIST: return "list of mappings";
	default: return "str";
	}
}

static int type_err(struct walk *w, const struct node *n, const struct key *k, enum vtype got)
{
	return werr(w, n, "expected %s, got %s", type_name(k), vtype_name[got]);
}

/* The string a str-typed key gets from n, or NULL after an error. */
static const char *want_str(struct walk *w, const struct node *n, const struct key *k, int *rc)
{
	struct value v;

	*rc = 0;
	if (n->kind == NODE_SCALAR && n->plain && is_member(n->text, k->vals) >= 0)
		return n->text;   /* `mode: off` is the string "off" here, not false */
	if (value_of(n, &v) != V_STR) {
		*rc = type_err(w, n, k, v.t);
		return NULL;
	}
	if (k->vals && k->type != T_TARGET && is_member(n->text, k->vals) < 0) {
		char list[256];

		join_vals(list, sizeof(list), k->vals, "");
		*rc = werr(w, n, "unknown value '%s'; expected one of %s", n->text, list);
		return NULL;
	}
	if (k->type == T_TARGET && target_index(n->text, k->vals) < 0) {
		char list[512];

		join_vals(list, sizeof(list), k->vals, "...");
		*rc = werr(w, n, "unknown '%s'; known: %s", n->text, list);
		return NULL;
	}
	return n->text;
}

static int store_str(struct walk *w, const struct node *n, const struct key *k, void *base,
		     const char *s)
{
	char *v, **dst;

	if (!k->pname)
		return 0;
	v = s ? (k->flags & F_PATH ? resolve_path(w, n, s) : hp_strdup(s)) : NULL;
	if (s && !v)
		return nomem(w->e, w->file);
	dst = field(base, k->off);
	hp_free(*dst);
	*dst = v;
	return 0;
}

static int walk_map(struct walk *w, const struct node *m, const struct key *tab, void *base,
		    int open);

static int walk_intlist(struct walk *w, const struct node *n, const struct key *k, void *base)
{
	int count = n->n, rc = 0, *v = NULL, **dst = field(base, k->off), *ndst = field(base, k->noff);

	if (!count && (k->flags & F_NONEMPTY))
		return werr(w, n, "expected at least one entry");
	if (k->pname && count && !(v = hp_calloc((size_t)count, sizeof(*v))))
		return nomem(w->e, w->file);
	for (int i = 0; i < count && !rc; i++) {
		size_t plen = w->plen;
		struct value iv;

		path_push(w, "[%d]", i);
		value_of(n->kid[i], &iv);
		if (iv.t != V_INT)
			rc = werr(w, n->kid[i], "expected int, got %s", vtype_name[iv.t]);
		else if (iv.overflow || iv.i < INT_MIN || iv.i > INT_MAX)
			rc = werr(w, n->kid[i], "%s is out of range", n->kid[i]->text);
		else if (k->hasmin && iv.i < k->min)
			rc = werr(w, n->kid[i], "must be at least %ld, got %ld", k->min, iv.i);
		else if (v)
			v[i] = (int)iv.i;
		path_pop(w, plen);
	}
	if (rc) {
		hp_free(v);
		return rc;
	}
	if (k->pname) {
		hp_free(*dst);
		*dst = v;
		*ndst = count;
	}
	return 0;
}

static int walk_strlist(struct walk *w, const struct node *n, const struct key *k, void *base)
{
	const struct node *const *items = (const struct node *const *)n->kid;
	int count = n->n, rc = 0;
	char **v = NULL, ***dst = field(base, k->off);
	int *ndst = field(base, k->noff);

	if (n->kind == NODE_SCALAR) {
		items = &n;   /* F_SCALAR: one string is a list of one */
		count = 1;
	}
	if (!count && (k->flags & F_NONEMPTY))
		return werr(w, n, "expected at least one entry");
	if (k->pname && count && !(v = hp_calloc((size_t)count, sizeof(*v))))
		return nomem(w->e, w->file);
	for (int i = 0; i < count && !rc; i++) {
		size_t plen = w->plen;
		struct key item = *k;

		item.type = T_STR;
		if (n->kind == NODE_SEQ)
			path_push(w, "[%d]", i);
		if (items[i]->kind != NODE_SCALAR)
			rc = werr(w, items[i], "expected str, got %s", got(items[i]));
		else if (want_str(w, items[i], &item, &rc) && v) {
			v[i] = item.flags & F_PATH ? resolve_path(w, items[i], items[i]->text) :
						     hp_strdup(items[i]->text);
			if (!v[i])
				rc = nomem(w->e, w->file);
		}
		path_pop(w, plen);
	}
	if (rc) {
		free_strv(v, count);
		return rc;
	}
	if (k->pname) {
		free_strv(*dst, *ndst);
		*dst = v;
		*ndst = count;
	}
	return 0;
}

static int set_defaults(const struct key *tab, void *base);

static int walk_list(struct walk *w, const struct node *n, const struct key *k, void *base)
{
	void **dst = field(base, k->off);
	int *ndst = field(base, k->noff);
	char *items;
	int rc = 0;

	if (!n->n)
		return 0;
	items = hp_calloc((size_t)n->n, k->isz);
	if (!items)
		return nomem(w->e, w->file);
	/* owned by the config from here, so a failure below is released with it */
	*dst = items;
	*ndst = n->n;
	for (int i = 0; i < n->n && !rc; i++) {
		size_t plen = w->plen;
		const struct node *it = n->kid[i];

		path_push(w, "[%d]", i);
		rc = set_defaults(k->sub, items + (size_t)i * k->isz);
		if (rc)
			rc = nomem(w->e, w->file);
		else if (it->kind != NODE_MAP)
			rc = werr(w, it, "expected mapping, got %s", got(it));
		else
			rc = walk_map(w, it, k->sub, items + (size_t)i * k->isz, 0);
		path_pop(w, plen);
	}
	return rc;
}

/* Check n against k and store it into base. */
static int walk_value(struct walk *w, const struct node *n, const struct key *k, void *base)
{
	struct value v;
	const char *s;
	int rc;

	value_of(n, &v);
	if (v.t == V_NULL) {
		if (k->type == T_ANY)
			return 0;
		if (k->type == T_STR_NULL)
			return store_str(w, n, k, base, NULL);
		/* `lr_scheduler: null`, `dataset:` with nothing: as if absent */
		if ((k->type == T_MAP || k->type == T_LIST) && !(k->flags & F_REQ))
			return 0;
		return type_err(w, n, k, v.t);
	}
	switch (k->type) {
	case T_INT:
		if (v.t != V_INT)
			return type_err(w, n, k, v.t);
		if (v.overflow || (k->size == sizeof(int) && (v.i < INT_MIN || v.i > INT_MAX)))
			return werr(w, n, "%s is out of range", n->text);
		if (k->hasmin && v.i < k->min)
			return werr(w, n, "must be at least %ld, got %ld", k->min, v.i);
		put_int(base, k, v.i);
		return 0;
	case T_FLOAT:
		if (v.t == V_INT && !v.overflow)
			v.f = (double)v.i;
		else if (v.t != V_FLOAT)
			return type_err(w, n, k, v.t);
		if ((rc = check_float(w, n, k, v.f)))
			return rc;
		memcpy(field(base, k->off), &v.f, sizeof(v.f));
		return 0;
	case T_BOOL:
		if (v.t != V_BOOL)
			return type_err(w, n, k, v.t);
		put_int(base, k, v.b);
		return 0;
	case T_STR:
	case T_STR_NULL:
	case T_TARGET:
		if (!(s = want_str(w, n, k, &rc)))
			return rc;
		return store_str(w, n, k, base, s);
	case T_ENUM:
		if (!(s = want_str(w, n, k, &rc)))
			return rc;
		put_int(base, k, is_member(s, k->vals));
		return 0;
	case T_STRLIST:
		if (v.t != V_LIST && !(v.t == V_STR && (k->flags & F_SCALAR)))
			return type_err(w, n, k, v.t);
		return walk_strlist(w, n, k, base);
	case T_INTLIST:
		if (v.t != V_LIST)
			return type_err(w, n, k, v.t);
		return walk_intlist(w, n, k, base);
	case T_PAIR: {
		double pair[2];

		if (v.t != V_LIST || n->n != 2)
			return werr(w, n, "expected %s, got %s%s", type_name(k), vtype_name[v.t],
				    v.t == V_LIST ? " of another length" : "");
		for (int i = 0; i < 2; i++) {
			struct value iv;

			value_of(n->kid[i], &iv);
			if (iv.t == V_INT && !iv.overflow)
				iv.f = (double)iv.i;
			else if (iv.t != V_FLOAT) {
				size_t plen = w->plen;

				path_push(w, "[%d]", i);
				rc = werr(w, n->kid[i], "expected float, got %s", vtype_name[iv.t]);
				path_pop(w, plen);
				return rc;
			}
			{
				size_t plen = w->plen;

				path_push(w, "[%d]", i);
				rc = check_float(w, n->kid[i], k, iv.f);
				path_pop(w, plen);
				if (rc)
					return rc;
			}
			pair[i] = iv.f;
		}
		memcpy(field(base, k->off), &pair[0], sizeof(double));
		memcpy(field(base, k->noff), &pair[1], sizeof(double));
		return 0;
	}
	case T_MAP:
		if (v.t != V_MAP)
			return type_err(w, n, k, v.t);
		return walk_map(w, n, k->sub, base, !!(k->flags & F_OPEN));
	case T_LIST:
		if (v.t != V_LIST)
			return type_err(w, n, k, v.t);
		return walk_list(w, n, k, base);
	case T_ANY: {
		/* a section of HyperParallel's that hp has nothing for: loaded
		 * when it is off (null, empty, or enable: false), refused when on */
		const struct node *en = v.t == V_MAP ? node_get(n, "enable") : NULL;
		struct value ev;

		if (!en && v.t == V_MAP)
			en = node_get(n, "enabled");
		if (v.t == V_NULL || (v.t == V_MAP && !n->n) ||
		    (en && value_of(en, &ev) == V_BOOL && !ev.b))
			return 0;
		werr(w, n, "not implemented by hp (give it enable: false, or leave it out)");
		return w->e->code = HP_EUNSUP;
	}
	}
	return 0;
}

static int walk_map(struct walk *w, const struct node *m, const struct key *tab, void *base,
		    int open)
{
	size_t plen = w->plen;
	int rc = 0;

	for (int i = 0; i < m->n && !rc; i++) {
		const struct node *kid = m->kid[i];
		const struct key *k = key_findn(tab, kid->key, strlen(kid->key));

		path_push(w, ".%s", kid->key);
		if (k) {
			rc = walk_value(w, kid, k, base);
		} else if (!open) {
			const char *s = suggest(tab, kid->key, strlen(kid->key));

			rc = werr(w, kid, "unknown key%s%s", s ? "; did you mean " : "",
				  s ? s : "");
		}
		path_pop(w, plen);
	}
	for (const struct key *k = tab; !rc && k->name; k++) {
		if (!(k->flags & F_REQ) || node_get(m, k->name))
			continue;
		path_push(w, ".%s", k->name);
		rc = werr(w, m, "missing required key");
		path_pop(w, plen);
	}
	return rc;
}

/* Defaults of every stored key of tab (nested mappings share base). */
static int set_defaults(const struct key *tab, void *base)
{
	for (const struct key *k = tab; k->name; k++) {
		if (k->type == T_MAP) {
			if (set_defaults(k->sub, base))
				return HP_ENOMEM;
			continue;
		}
		if (!k->pname)
			continue;
		switch (k->type) {
		case T_INT:
		case T_BOOL:
		case T_ENUM:
			put_int(base, k, k->idef);
			break;
		case T_FLOAT:
			memcpy(field(base, k->off), &k->fdef, sizeof(double));
			break;
		case T_PAIR:
			memcpy(field(base, k->off), &k->fdef, sizeof(double));
			memcpy(field(base, k->noff), &k->fdef2, sizeof(double));
			break;
		case T_STR:
		case T_STR_NULL:
		case T_TARGET:
			if (k->sdef && !(*(char **)field(base, k->off) = hp_strdup(k->sdef)))
				return HP_ENOMEM;
			break;
		case T_STRLIST:
			if (k->sdef) {
				const char *p = k->sdef;
				int n = 1;
				char **v;

				for (const char *q = p; *q; q++)
					n += *q == ',';
				v = hp_calloc((size_t)n, sizeof(*v));
				if (!v)
					return HP_ENOMEM;
				*(char ***)field(base, k->off) = v;
				*(int *)field(base, k->noff) = n;
				for (int i = 0; i < n; i++) {
					size_t len = strcspn(p, ",");

					if (!(v[i] = hp_strndup(p, len)))
						return HP_ENOMEM;
					p += len + (p[len] == ',');
				}
			}
			break;
		default:
			break;
		}
	}
	return 0;
}

static void release_keys(const struct key *tab, void *base)
{
	for (const struct key *k = tab; k->name; k++) {
		void *f = field(base, k->off);

		if (k->type == T_MAP) {
			release_keys(k->sub, base);
			continue;
		}
		if (!k->pname)
			continue;
		switch (k->type) {
		case T_STR:
		case T_STR_NULL:
		case T_TARGET:
			hp_free(*(char **)f);
			*(char **)f = NULL;
			break;
		case T_STRLIST:
			free_strv(*(char ***)f, *(int *)field(base, k->noff));
			*(char ***)f = NULL;
			*(int *)field(base, k->noff) = 0;
			break;
		case T_INTLIST:
			hp_free(*(int **)f);
			*(int **)f = NULL;
			*(int *)field(base, k->noff) = 0;
			break;
		case T_LIST: {
			char *items = *(char **)f;
			int n = *(int *)field(base, k->noff);

			for (int i = 0; items && i < n; i++)
				release_keys(k->sub, items + (size_t)i * k->isz);
			hp_free(items);
			*(char **)f = NULL;
			*(int *)field(base, k->noff) = 0;
			break;
		}
		default:
			break;
		}
	}
}

/* Rules that span keys: the _target_-dependent required keys and model.path. */
static int finish(struct walk *w, const struct node *root)
{
	struct hp_config *c = w->c;
	const struct node *mm = node_map(root, "model");
	const struct node *dm = node_map(root, "dataset");
	const struct node *pre = node_get(mm, "pretrained_model_name_or_path");
	const struct node *cfg = node_get(mm, "config_path");
	const struct node *pick;
	int ti = target_index(c->model.target, model_targets);

	c->model.source = ti == 1 || ti == 3 ? HP_MODEL_FROM_CONFIG : HP_MODEL_FROM_PRETRAINED;
	pick = c->model.source == HP_MODEL_FROM_CONFIG ? (cfg ? cfg : pre) : pre;
	if (!pick) {
		path_push(w, "$.model.%s", c->model.source == HP_MODEL_FROM_CONFIG ?
			  "config_path" : "pretrained_model_name_or_path");
		return werr(w, mm, "missing required key");
	}
	if (!(c->model.path = resolve_path(w, pick, pick->text)))
		return nomem(w->e, w->file);

	if (c->dataset.target) {
		c->dataset.kind = (enum hp_dataset_kind)(target_index(c->dataset.target,
								       dataset_targets) + 1);
		if (!node_get(dm, "data_path")) {
			path_push(w, "$.dataset.data_path");
			return werr(w, dm, "missing required key");
		}
		if (c->dataset.kind == HP_DATASET_INDEXED &&
		    !node_get(node_map(dm, "data_config"), "seq_length")) {
			const struct node *dc = node_map(dm, "data_config");

			path_push(w, "$.dataset.data_config.seq_length");
			return werr(w, dc ? dc : dm, "missing required key");
		}
	}
	if (c->dataset.target) {
		const struct node *dc = node_map(dm, "data_config"), *sn = node_get(dc, "split");
		struct hp_split sp;

		if (c->dataset.split && hp_split_parse(&sp, c->dataset.split, w->e)) {
			char why[HP_ERR_MSG_MAX];

			snprintf(why, sizeof(why), "%s", w->e->msg);
			path_push(w, "$.dataset.data_config.split");
			return werr(w, sn, "%s", why);
		}
		if (c->dataset.split && c->dataset.nvalid_data_path && sp.w[HP_SPLIT_VALID] > 0) {
			path_push(w, "$.dataset.data_config.split");
			return werr(w, sn, "'%s' has a validation share, and dataset.valid_data_path gives the "
				    "validation data: set the share to 0 (e.g. \"99,0,1\") or drop one", c->dataset.split);
		}
	}
	if (!c->dataset.split &&
	    !(c->dataset.split = hp_strdup(c->dataset.nvalid_data_path ? "100,0,0" : "98,1,1")))
		return nomem(w->e, w->file);
	if (c->dataset.target) {
		/* conversation keys without conversations to read would be ignored */
		const struct node *dt = node_map(dm, "data_transform");
		const struct node *ct = node_get(node_map(dm, "model_assets"), "chat_template");
		static const char *const conv_keys[] = { "role_key", "content_key", "loss_tokens" };
		int conv = c->dataset.data_type && !strcmp(c->dataset.data_type, "conversation");
		int online = c->dataset.kind != HP_DATASET_INDEXED;

		/* a default value is what it would be anyway (a plan.json carries them all) */
		int set[3] = { strcmp(c->dataset.role_key, "role") != 0, strcmp(c->dataset.content_key, "content") != 0,
			       c->dataset.loss_tokens != HP_LOSS_TOKENS_ASSISTANT };

		for (size_t i = 0; i < 3; i++)
			if (set[i] && node_get(dt, conv_keys[i]) && (!conv || !online)) {
				path_push(w, "$.dataset.data_transform.%s", conv_keys[i]);
				return werr(w, node_get(dt, conv_keys[i]), "%s", !online ?
					    "for online conversations; an indexed dataset's mask was made by "
					    "hp-data build --chat-template" : "only with data_type: conversation");
			}
		if (ct && c->dataset.chat_template && strcmp(c->dataset.chat_template, "auto") && (!conv || !online)) {
			path_push(w, "$.dataset.model_assets.chat_template");
			return werr(w, ct, "%s", !online ? "for online conversations; an indexed dataset was "
				    "rendered by hp-data build --chat-template" : "only with data_type: conversation");
		}
	}
	if (c->dataset.data_type && !strcmp(c->dataset.data_type, "conversation") &&
	    c->dataset.kind != HP_DATASET_INDEXED) {
		const struct node *dt = node_map(dm, "data_transform");
		const struct node *ct = node_get(node_map(dm, "model_assets"), "chat_template");
		const char *t = c->dataset.chat_template;

		/* a conversation's messages are under "messages" unless named */
		if (!node_get(dt, "text_keys") && c->dataset.ntext_keys == 1 &&
		    !strcmp(c->dataset.text_keys[0], "text")) {
			hp_free(c->dataset.text_keys[0]);
			if (!(c->dataset.text_keys[0] = hp_strdup("messages")))
				return nomem(w->e, w->file);
		}
		if (c->dataset.ntext_keys != 1) {
			path_push(w, "$.dataset.data_transform.text_keys");
			return werr(w, node_get(dt, "text_keys"), "conversations have one list of messages: "
				    "name one key, got %d", c->dataset.ntext_keys);
		}
		/* a template file is found beside the YAML, like the data */
		if (ct && t && hp_chat_spec_is_file(t)) {
			char *r = resolve_path(w, ct, t);

			if (!r)
				return nomem(w->e, w->file);
			hp_free(c->dataset.chat_template);
			c->dataset.chat_template = r;
		}
	}
	/*
	 * One learning rate, under two names: adamw_lr (the optimizer's) and
	 * lr_config.lr (the schedule's peak).  Either gives it; a value given
	 * on the command line beats the file's under either name (so that
	 * --optimizer.adamw_config.adamw_lr=3e-4 changes the rate of a file
	 * that sets both); two different values from the same place are
	 * refused, as one of them would be ignored.
	 */
	{
		const struct node *on = node_get(node_map(node_map(root, "optimizer"), "adamw_config"), "adamw_lr");
		const struct node *ln = node_get(node_map(node_map(root, "lr_scheduler"), "lr_config"), "lr");
		const struct node *mn = node_get(node_map(node_map(root, "lr_scheduler"), "lr_config"), "min_lr");
		double ol = c->optimizer.lr, sl = c->lr_scheduler.lr;

		if (!isnan(ol) && !isnan(sl) && ol != sl) {
			if (!on || !ln || !on->origin == !ln->origin) {
				path_push(w, "$.optimizer.adamw_config.adamw_lr");
				return werr(w, on, "%s, but lr_scheduler.lr_config.lr is %s: both name the learning "
					    "rate; give one (or the same)", on ? on->text : "?", ln ? ln->text : "?");
			}
			ol = on->origin ? ol : sl;
		}
		c->optimizer.lr = c->lr_scheduler.lr = !isnan(ol) ? ol : !isnan(sl) ? sl : 1e-4;
		if (c->lr_scheduler.style != HP_LR_CONSTANT && c->lr_scheduler.min_lr > c->lr_scheduler.lr) {
			path_push(w, "$.lr_scheduler.lr_config.min_lr");
			return werr(w, mn, "%s is above the peak rate %g: the %s decay would raise the rate", mn ?
				    mn->text : "?", c->lr_scheduler.lr, c->lr_scheduler.style == HP_LR_LINEAR ?
				    "linear" : "cosine");
		}
	}
	/* interleaved 1F1B: chunks of layers per stage (lib/plan/schedule.h);
	 * HP_MAX_VPP is 8 */
	_Static_assert(HP_MAX_VPP == 8, "the message below says 8");
	if (c->accelerator.pp_vpp > 1) {
		const char *why = c->accelerator.pp_vpp > HP_MAX_VPP ? "this build takes at most 8" :
				  c->accelerator.pp_size < 2 ? "interleaving needs pp_size 2 or more" :
				  c->accelerator.pp_schedule == HP_PP_GPIPE ? "interleaving is 1F1B's (pp_schedule "
									     "1f1b); gpipe takes 1" : NULL;

		if (why) {
			path_push(w, "$.accelerator.pp_vpp");
			return werr(w, node_get(node_map(root, "accelerator"), "pp_vpp"),
				    "%ld virtual stages per rank: %s", c->accelerator.pp_vpp, why);
		}
	}
	return 0;
}

/* ---- overrides ------------------------------------------------------------- */

static int has_target(const struct node *n)
{
	if (n->key && !strcmp(n->key, "_target_"))
		return 1;
	for (int i = 0; i < n->n; i++)
		if (has_target(n->kid[i]))
			return 1;
	return 0;
}

/*
 * Check the dotted path of an override against the schema, so that a typo
 * fails here instead of creating a key the walk then calls unknown in the
 * file.  Below an accepted-anything section or a builder's open mapping any
 * key goes.
 */
static int override_path_ok(const char *arg, const char *keys, size_t klen, struct hp_err *e)
{
	const struct key *tab = root_keys, *k = NULL;
	size_t at = 0;

	for (;;) {
		size_t len = strcspn(keys + at, ".");

		if (at + len > klen)
			len = klen - at;
		if (!len)
			return hp_err_set(e, HP_ECONFIG, "%s: empty key in '%.*s'", arg,
					  (int)klen, keys);
		if (len == 8 && !memcmp(keys + at, "_target_", 8))
			return hp_err_set(e, HP_ECONFIG, "%s: _target_ cannot be overridden", arg);
		if (tab && !(k = key_findn(tab, keys + at, len))) {
			const char *s = suggest(tab, keys + at, len);

			return hp_err_set(e, HP_ECONFIG, "%s: unknown key %.*s%s%s", arg,
					  (int)(at + len), keys, s ? "; did you mean " : "",
					  s ? s : "");
		}
		at += len;
		if (at == klen)
			return 0;
		at++;   /* the dot */
		if (!tab)
			continue;
		if (k->type == T_ANY || (k->type == T_MAP && (k->flags & F_OPEN)))
			tab = NULL;
		else if (k->type == T_MAP)
			tab = k->sub;
		else
			return hp_err_set(e, HP_ECONFIG, "%s: unknown key %.*s", arg,
					  (int)klen, keys);
	}
}

/* Graft one "--a.b.c=value" onto the tree, creating mappings on the way. */
static int apply_override(struct node **root, const char *arg, const char *file,
			  struct hp_err *e)
{
	const char *s = arg, *eq, *keys;
	struct node *val = NULL, *m;
	size_t klen, at = 0;
	int rc;

	if (s[0] == '-')
		s += s[1] == '-' ? 2 : 1;
	eq = strchr(s, '=');
	if (!eq || eq == s)
		return hp_err_set(e, HP_ECONFIG, "%s: expected --key.path=value", arg);
	keys = s;
	klen = (size_t)(eq - s);
	if ((rc = override_path_ok(arg, keys, klen, e)))
		return rc;
	if ((rc = build_tree(eq + 1, strlen(eq + 1), file, arg, &val, e)))
		return rc;
	if (!val && !(val = node_new(NODE_SCALAR, 1, arg)))
		return nomem(e, file);
	if (!val->text && val->kind == NODE_SCALAR && !(val->text = hp_strdup("")))
		goto oom;
	if (has_target(val)) {
		node_free(val);
		return hp_err_set(e, HP_ECONFIG, "%s: _target_ cannot be overridden", arg);
	}
	if (!*root && !(*root = node_new(NODE_MAP, 1, NULL)))
		goto oom;
	m = *root;
	for (;;) {
		size_t len = strcspn(keys + at, ".");
		struct node *kid;

		if (at + len > klen)
			len = klen - at;
		if (m->kind != NODE_MAP) {
			node_free(val);
			return hp_err_set(e, HP_ECONFIG, "%s: $%s%.*s: expected mapping, got %s",
					  arg, at ? "." : "", at ? (int)at - 1 : 0, keys, got(m));
		}
		kid = node_getn(m, keys + at, len);
		if (at + len == klen) {
			/* the last key: the value replaces whatever was there */
			if (kid) {
				val->key = kid->key;
				kid->key = NULL;
				for (int i = 0; i < m->n; i++)
					if (m->kid[i] == kid)
						m->kid[i] = val;
				node_free(kid);
				return 0;
			}
			if (!(val->key = hp_strndup(keys + at, len)) || node_push(m, val))
				goto oom;
			return 0;
		}
		if (!kid) {
			if (!(kid = node_new(NODE_MAP, 1, NULL)))
				goto oom;
			if (!(kid->key = hp_strndup(keys + at, len)) || node_push(m, kid)) {
				node_free(kid);
				goto oom;
			}
		} else if (kid->kind == NODE_SCALAR && node_is_null(kid)) {
			/* `lr_scheduler: null` then --lr_scheduler.lr_decay_style=... */
			kid->kind = NODE_MAP;
		}
		m = kid;
		at += len + 1;
	}
oom:
	node_free(val);
	return nomem(e, file);
}

/* ---- entry points ---------------------------------------------------------- */

static int load_buf(struct hp_config *c, const char *name, const char *buf, size_t len,
		    int noverrides, char *const *overrides, int keep_paths, struct hp_err *e)
{
	struct node *root = NULL;
	struct walk w;
	int rc;

	memset(c, 0, sizeof(*c));
	if (!(c->path = hp_strdup(name)))
		return nomem(e, name);
	rc = build_tree(buf, len, name, NULL, &root, e);
	for (int i = 0; !rc && i < noverrides; i++)
		rc = apply_override(&root, overrides[i], name, e);
	if (!rc && !root && !(root = node_new(NODE_MAP, 1, NULL)))
		rc = nomem(e, name);
	if (!rc && set_defaults(root_keys, c))
		rc = nomem(e, name);
	if (!rc) {
		memset(&w, 0, sizeof(w));
		w.c = c;
		w.file = c->path;
		w.e = e;
		w.keep_paths = keep_paths;
		path_push(&w, "$");
		if (root->kind != NODE_MAP)
			rc = werr(&w, root, "expected mapping, got %s", got(root));
		else
			rc = walk_map(&w, root, root_keys, c, 0);
		if (!rc) {
			path_pop(&w, 0);
			rc = finish(&w, root);
		}
	}
	node_free(root);
	if (rc)
		hp_config_release(c);
	return rc;
}

int hp_config_load_buf(struct hp_config *c, const char *name, const char *buf, size_t len,
		       int noverrides, char *const *overrides, struct hp_err *e)
{
	return load_buf(c, name, buf, len, noverrides, overrides, 0, e);
}

int hp_config_load_resolved(struct hp_config *c, const char *name, const char *buf, size_t len,
			    struct hp_err *e)
{
	return load_buf(c, name, buf, len, 0, NULL, 1, e);
}

int hp_config_load(struct hp_config *c, const char *path,
		   int noverrides, char *const *overrides, struct hp_err *e)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t len = 0;
	int rc;

	memset(c, 0, sizeof(*c));
	if (!f)
		return hp_err_set(e, HP_EIO, "'%s': cannot open: %s", path, strerror(errno));
	if (hp_read_stream(f, &buf, &len)) {
		int err = errno;

		fclose(f);
		return err == ENOMEM ? nomem(e, path)
				     : hp_err_set(e, HP_EIO, "'%s': cannot read: %s", path, strerror(err));
	}
	fclose(f);
	rc = hp_config_load_buf(c, path, buf, len, noverrides, overrides, e);
	hp_free(buf);
	return rc;
}

void hp_config_release(struct hp_config *c)
{
	if (!c)
		return;
	release_keys(root_keys, c);
	hp_free(c->path);
	hp_free(c->model.path);
	memset(c, 0, sizeof(*c));
}

/* ---- printing -------------------------------------------------------------- */

struct printer {
	FILE *f;
	int width;
	int measure;             /* first pass: only find the widest key */
};

static void row(struct printer *p, const char *key, const char *val)
{
	if (p->measure) {
		if ((int)strlen(key) > p->width)
			p->width = (int)strlen(key);
		return;
	}
	fprintf(p->f, "%-*s  %s\n", p->width, key, val);
}

/* The shortest %g that reads back as the same double. */
static void fmt_double(char *buf, size_t n, double x)
{
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, n, "%.*g", prec, x);
		if (strtod(buf, NULL) == x)
			return;
	}
}

static void print_keys(struct printer *p, const struct key *tab, const void *base,
		       const char *prefix)
{
	for (const struct key *k = tab; k->name; k++) {
		char name[128], val[1024], a[64], b[64];
		const void *f = (const char *)base + k->off;

		if (k->type == T_MAP) {
			print_keys(p, k->sub, base, prefix);
			continue;
		}
		if (!k->pname)
			continue;
		snprintf(name, sizeof(name), "%s%s", prefix, k->pname);
		switch (k->type) {
		case T_INT:
			snprintf(val, sizeof(val), "%ld", get_int(base, k));
			break;
		case T_BOOL: {
			long v = get_int(base, k);

			snprintf(val, sizeof(val), "%s", v < 0 ? "unset" : v ? "true" : "false");
			break;
		}
		case T_ENUM:
			snprintf(val, sizeof(val), "%s", k->vals[get_int(base, k)]);
			break;
		case T_FLOAT: {
			double d;

			memcpy(&d, f, sizeof(d));
			fmt_double(a, sizeof(a), d);
			snprintf(val, sizeof(val), "%s", a);
			break;
		}
		case T_PAIR: {
			double d0, d1;

			memcpy(&d0, f, sizeof(d0));
			memcpy(&d1, (const char *)base + k->noff, sizeof(d1));
			fmt_double(a, sizeof(a), d0);
			fmt_double(b, sizeof(b), d1);
			snprintf(val, sizeof(val), "[%s, %s]", a, b);
			break;
		}
		case T_STR:
		case T_STR_NULL:
		case T_TARGET: {
			const char *s = *(char *const *)f;

			snprintf(val, sizeof(val), "%s", s ? s : "null");
			break;
		}
		case T_INTLIST:
		case T_STRLIST: {
			int n = *(const int *)((const char *)base + k->noff);
			size_t at = 1;

			val[0] = '[';
			val[1] = '\0';
			for (int i = 0; i < n && at < sizeof(val); i++) {
				int r = k->type == T_INTLIST ?
					snprintf(val + at, sizeof(val) - at, "%s%d", i ? ", " : "",
						 (*(int *const *)f)[i]) :
					snprintf(val + at, sizeof(val) - at, "%s%s", i ? ", " : "",
						 (*(char **const *)f)[i]);

				at += r > 0 ? (size_t)r : 0;
			}
			if (at < sizeof(val) - 1)
				snprintf(val + at, sizeof(val) - at, "]");
			break;
		}
		case T_LIST: {
			const char *items = *(char *const *)f;
			int n = *(const int *)((const char *)base + k->noff);

			snprintf(val, sizeof(val), "%d", n);
			row(p, name, val);
			for (int i = 0; i < n; i++) {
				char pfx[64];

				snprintf(pfx, sizeof(pfx), "%s[%d].", k->pname, i);
				print_keys(p, k->sub, items + (size_t)i * k->isz, pfx);
			}
			continue;
		}
		default:
			continue;
		}
		row(p, name, val);
		/* the rows finish() derives, next to the key they come from */
		if (!strcmp(name, "model.target")) {
			const struct hp_config *c = base;

			row(p, "model.source", c->model.source == HP_MODEL_FROM_CONFIG ?
			    "from_config" : "from_pretrained");
			row(p, "model.path", c->model.path ? c->model.path : "null");
		} else if (!strcmp(name, "dataset.target")) {
			static const char *const kinds[] = { "none", "indexed", "online",
							     "online_mapping" };
			const struct hp_config *c = base;

			row(p, "dataset.kind", kinds[c->dataset.kind]);
		}
	}
}

static void schema(const struct key *tab, const char *prefix, FILE *f)
{
	for (; tab->name; tab++) {
		char path[256];

		snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "." : "", tab->name);
		if (tab->type == T_MAP || tab->type == T_LIST) {
			if (tab->type == T_LIST)
				snprintf(path + strlen(path), sizeof(path) - strlen(path), "[]");
			schema(tab->sub, path, f);
			continue;
		}
		fprintf(f, "%s\t%s\t", path, tab->type == T_ANY ? "any section" : type_name(tab));
		for (int i = 0; tab->vals && tab->vals[i]; i++)
			fprintf(f, "%s%s", i ? "|" : "", tab->vals[i]);
		fputc('\n', f);
	}
}

void hp_config_schema(FILE *f)
{
	schema(root_keys, "", f);
}

void hp_config_print(const struct hp_config *c, FILE *f)
{
	struct printer p = { .f = f, .measure = 1, .width = (int)strlen("config") };

	for (int pass = 0; pass < 2; pass++) {
		row(&p, "config", c->path ? c->path : "null");
		print_keys(&p, root_keys, c, "");
		p.measure = 0;
	}
}

/* ---- the resolved config as JSON ------------------------------------------- */

static void jput(json_t *o, const char *k, json_t *v, int *bad)
{
	if (!v || json_object_set_new(o, k, v))
		*bad = 1;
}

static json_t *strv_json(char *const *v, int n, int *bad)
{
	json_t *a = json_array();

	for (int i = 0; a && i < n; i++)
		if (json_array_append_new(a, json_string(v[i])))
			*bad = 1;
	return a;
}

/* A mapping with a required key left unset (an absent dataset, a plan
 * override without replace_module) is left out, as it was in the file. */
static int map_absent(const struct key *tab, const void *base)
{
	for (const struct key *k = tab; k->name; k++)
		if ((k->flags & F_REQ) && k->pname &&
		    (k->type == T_STR || k->type == T_TARGET) &&
		    !*(char *const *)((const char *)base + k->off))
			return 1;
	return 0;
}

static json_t *keys_json(const struct key *tab, const void *base, int *bad)
{
	json_t *o = json_object();

	if (!o) {
		*bad = 1;
		return NULL;
	}
	for (const struct key *k = tab; k->name; k++) {
		const void *f = (const char *)base + k->off;
		const struct hp_config *c = base;

		/* the model's path lands in one field under either key */
		if (tab == model_keys && !strcmp(k->name, "pretrained_model_name_or_path")) {
			if (c->model.path && c->model.source == HP_MODEL_FROM_PRETRAINED)
				jput(o, k->name, json_string(c->model.path), bad);
			continue;
		}
		if (tab == model_keys && !strcmp(k->name, "config_path")) {
			if (c->model.path && c->model.source == HP_MODEL_FROM_CONFIG)
				jput(o, k->name, json_string(c->model.path), bad);
			continue;
		}
		if (k->type == T_MAP) {
			if (!map_absent(k->sub, base))
				jput(o, k->name, keys_json(k->sub, base, bad), bad);
			continue;
		}
		if (!k->pname)
			continue;
		switch (k->type) {
		case T_INT:
			/* below its minimum with no default: the key was not given */
			if (!(k->hasmin && get_int(base, k) < k->min && k->idef < k->min))
				jput(o, k->name, json_integer(get_int(base, k)), bad);
			break;
		case T_BOOL:
			if (get_int(base, k) >= 0)
				jput(o, k->name, json_boolean(get_int(base, k)), bad);
			break;
		case T_ENUM:
			jput(o, k->name, json_string(k->vals[get_int(base, k)]), bad);
			break;
		case T_FLOAT: {
			double d;

			memcpy(&d, f, sizeof(d));
			jput(o, k->name, json_real(d), bad);
			break;
		}
		case T_PAIR: {
			double d0, d1;

			memcpy(&d0, f, sizeof(d0));
			memcpy(&d1, (const char *)base + k->noff, sizeof(d1));
			jput(o, k->name, json_pack("[ff]", d0, d1), bad);
			break;
		}
		case T_STR:
		case T_STR_NULL:
		case T_TARGET: {
			const char *v = *(char *const *)f;

			if (v)
				jput(o, k->name, json_string(v), bad);
			else if (k->type == T_STR_NULL)
				jput(o, k->name, json_null(), bad);
			break;
		}
		case T_INTLIST: {
			const int *v = *(int *const *)f;
			int n = *(const int *)((const char *)base + k->noff);
			json_t *a;

			if (!n)   /* not given (an empty list is refused) */
				break;
			a = json_array();
			jput(o, k->name, a, bad);
			for (int i = 0; a && i < n; i++)
				if (json_array_append_new(a, json_integer(v[i])))
					*bad = 1;
			break;
		}
		case T_STRLIST:
			/* a list that must not be empty was not given */
			if (!*(const int *)((const char *)base + k->noff) && (k->flags & F_NONEMPTY))
				break;
			jput(o, k->name, strv_json(*(char **const *)f,
						  *(const int *)((const char *)base + k->noff), bad), bad);
			break;
		case T_LIST: {
			const char *items = *(char *const *)f;
			int n = *(const int *)((const char *)base + k->noff);
			json_t *a = json_array();

			jput(o, k->name, a, bad);
			for (int i = 0; a && i < n; i++)
				if (json_array_append_new(a, keys_json(k->sub, items + (size_t)i * k->isz, bad)))
					*bad = 1;
			break;
		}
		default:
			break;
		}
	}
	return o;
}

json_t *hp_config_json(const struct hp_config *c)
{
	int bad = 0;
	json_t *o = keys_json(root_keys, c, &bad);

	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

int hp_split_parse(struct hp_split *s, const char *str, struct hp_err *e)
{
	const char *p = str;
	double sum = 0;
	int n = 0;

	memset(s, 0, sizeof(*s));
	while (*p) {
		char *end;
		double v;

		if (n == 3)
			return hp_err_set(e, HP_ECONFIG, "split '%s': more than three shares (train, "
					  "validation, test)", str);
		errno = 0;
		v = strtod(p, &end);
		if (end == p || errno || !isfinite(v) || v < 0 || (*end && *end != ',' && *end != '/') ||
		    (*end && !end[1]))
			return hp_err_set(e, HP_ECONFIG, "split '%s': expected up to three non-negative numbers "
					  "separated by ',' or '/', as \"98,1,1\"", str);
		s->w[n++] = v;
		sum += v;
		p = *end ? end + 1 : end;
	}
	if (!(sum > 0))
		return hp_err_set(e, HP_ECONFIG, "split '%s': the shares add up to 0", str);
	for (int i = 0; i < 3; i++)
		s->w[i] /= sum;
	return 0;
}

long hp_config_seq_length(const struct hp_config *c)
{
	return c->dataset.seq_length > 0 ? c->dataset.seq_length : c->dataset.max_seq_len;
}
