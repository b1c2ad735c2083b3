/*
 * jinja_int.h - internals of the Jinja2 interpreter shared by its parts:
 * jinja_value.c (the arena, values, strings, str/repr/json), jinja_lex.c
 * (source to tokens), jinja_parse.c (tokens to the syntax tree),
 * jinja_eval.c (the tree walk) and jinja_builtins.c (filters, tests,
 * methods, globals).  Not a public header (that is jinja.h): only those
 * files include it, and nothing here is stable.  What it declares is
 * global for the linker all the same, so every function and object here
 * is jj_-prefixed (as tokint.h's are tok_): a short name such as sub or
 * push would clash with another library linked into the same program.
 * What one file alone uses stays static there.
 *
 * The interpreter as a whole: a Jinja2 subset of HF chat templates, lexed
 * and parsed to a tree compiled once, and a tree-walking evaluator whose
 * strings carry per-byte provenance tags (see jinja.h for the contract).
 * The evaluator follows Python's semantics for the types a chat template
 * sees: str (code-point indexed UTF-8), int (int64), float (printed with
 * Python's shortest repr), bool, None, list, tuple, dict (insertion-ordered),
 * jinja's namespace, loop and Undefined.
 *
 * What it is not: a compiler to bytecode or a general Python.  Values are
 * never freed one by one: a render allocates from its own arena, dropped at
 * the end, so there is no reference counting and no mutation of the
 * caller's values (jinja's ImmutableSandbox refuses mutating methods anyway;
 * the only mutable objects are the render's own namespaces).
 */
#ifndef HP_JINJA_INT_H
#define HP_JINJA_INT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
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
struct achunk;

struct jarena {
	struct achunk *head;
	size_t total;      /* bytes of all chunks */
	size_t limit;      /* 0: none */
	int over;          /* set when the limit refused an allocation */
};

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

/* --- render state ------------------------------------------------------------ */
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

/* --- json.dumps ------------------------------------------------------------ */
struct jopt {
	int ascii;
	const struct hp_jval *indent;   /* NULL: none; else a string of the indent */
	const struct hp_jval *isep, *ksep;
	int sort;
};

/* --- calls: arguments ----------------------------------------------------- */
struct args {
	struct hp_jval **pos;
	int np;
	const char **kn;
	struct hp_jval **kv;
	int nk;
};

/* --- jinja_value.c ------------------------------------------------------------ */
/* shared immutable singletons: never written after initialisation */
extern struct hp_jval jj_v_none, jj_v_true, jj_v_false, jj_v_empty, jj_v_space;

#define VBOOL(b) ((b) ? &jj_v_true : &jj_v_false)

void *jj_aalloc(struct jarena *a, size_t n);
void *jj_acalloc(struct jarena *a, size_t n);
void jj_arena_free(struct jarena *a);
struct hp_jval *jj_mkval(struct jarena *a, int type);

/* UTF-8 (invalid bytes are one code point each) and Python's str.isX classes */
uint32_t jj_u8dec(const char *s, size_t n, size_t *i);
size_t jj_u8prev(const char *s, size_t end);
int jj_py_isspace(uint32_t c);
int jj_cat_of(uint32_t c);
int jj_py_isalpha(uint32_t c);
int jj_py_isdigit(uint32_t c);
int jj_py_isalnum(uint32_t c);
int jj_py_iscased(uint32_t c);
size_t jj_ws_at(const char *s, size_t n, size_t i);
size_t jj_rstrip_ws_len(const char *s, size_t n);

static inline int isdig(int ch)
{
	return ch >= '0' && ch <= '9';
}

struct hp_jval *jj_mkstr_raw(struct jarena *a, const char *s, size_t len, const uint16_t *tag,
			     uint16_t btag);
size_t jj_cp_off(const struct hp_jval *v, size_t k);
int jj_sb_grow(struct sbuf *b, size_t add);
int jj_sb_put(struct sbuf *b, const char *s, size_t n, const uint16_t *tags, uint16_t tag);
int jj_sb_str(struct sbuf *b, const char *s, uint16_t tag);
int jj_sb_ch(struct sbuf *b, char c, uint16_t tag);
int jj_sb_val(struct sbuf *b, const struct hp_jval *v);
int jj_sb_span(struct sbuf *b, const struct hp_jval *v, size_t off, size_t n);
struct jent *jj_dict_find_str(const struct hp_jval *d, const char *k, size_t n);
int jj_dict_put(struct jarena *a, struct hp_jval *d, struct hp_jval *k, struct hp_jval *v);

/* a render's errors and allocators: NULL (or -1) with r's error set */
void *jj_rerr(struct rs *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void *jj_room(struct rs *r);
int jj_count_iters(struct rs *r, long n);
void *jj_ral(struct rs *r, size_t n);
struct hp_jval *jj_mk(struct rs *r, int type);
struct hp_jval *jj_mkint(struct rs *r, int64_t i);
struct hp_jval *jj_mkfloat(struct rs *r, double f);
struct hp_jval *jj_mkstrc(struct rs *r, const char *s, size_t n);
struct hp_jval *jj_sub(struct rs *r, const struct hp_jval *v, size_t off, size_t len);
struct hp_jval *jj_mklist(struct rs *r, size_t cap, int flags);
int jj_push(struct rs *r, struct hp_jval *l, struct hp_jval *v);
struct hp_jval *jj_mkundef(struct rs *r, int why, const char *name, size_t nlen, const char *what);
struct sbuf jj_sb_new(struct rs *r);
struct hp_jval *jj_sb_fin(struct rs *r, struct sbuf *b);

/* Python's semantics of every value */
const char *jj_type_name(const struct hp_jval *v);
void *jj_undef_err(struct rs *r, const struct hp_jval *u);
int jj_truthy(const struct hp_jval *v);
int jj_isnum(const struct hp_jval *v);
double jj_numf(const struct hp_jval *v);
int jj_py_eq(const struct hp_jval *a, const struct hp_jval *b);
int jj_py_cmp(struct rs *r, const struct hp_jval *a, const struct hp_jval *b, int *res);
int jj_put_str(struct rs *r, struct sbuf *b, const struct hp_jval *v);
int jj_put_repr(struct rs *r, struct sbuf *b, const struct hp_jval *v, int depth);
struct hp_jval *jj_to_str(struct rs *r, struct hp_jval *v);
int jj_put_json(struct rs *r, struct sbuf *b, const struct hp_jval *v, const struct jopt *o,
		int level);

/* --- jinja_lex.c -------------------------------------------------------------- */
int jj_cerr(struct comp *c, int code, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
int jj_count_nl(const char *s, size_t n);
int jj_lex(struct comp *c);
const char *jj_describe(const struct tok *t);

/* --- jinja_eval.c ------------------------------------------------------------- */
struct hp_jval *jj_concat2(struct rs *r, const struct hp_jval *a, const struct hp_jval *b);
struct hp_jval *jj_repeat(struct rs *r, const struct hp_jval *x, int64_t k);
struct hp_jval *jj_binop(struct rs *r, int op, struct hp_jval *a, struct hp_jval *b);
struct hp_jval *jj_get_item(struct rs *r, struct hp_jval *x, struct hp_jval *k);
struct hp_jval *jj_get_slice(struct rs *r, struct hp_jval *x, struct hp_jval *sv, struct hp_jval *ev,
			     struct hp_jval *tv);
struct hp_jval *jj_iter_list(struct rs *r, struct hp_jval *x);

/* --- jinja_builtins.c --------------------------------------------------------- */
/* a filter's or test's index by name, -1 when there is none */
int jj_filter_index(const char *name);
int jj_filter_unsupported(const char *name);
int jj_test_index(const char *name);
int jj_test_takes_undefined(int id);
int jj_do_test(struct rs *r, int id, struct hp_jval *v, struct hp_jval **args, int nargs);
struct hp_jval *jj_apply_filter(struct rs *r, int id, struct args *a);
int jj_contains(struct rs *r, struct hp_jval *seq, struct hp_jval *x);
struct hp_jval *jj_get_attr(struct rs *r, struct hp_jval *x, const char *a, size_t n);
struct hp_jval *jj_call_method(struct rs *r, struct hp_jval *mv, struct args *a);
struct hp_jval *jj_find_global(const char *name);
struct hp_jval *jj_call_global(struct rs *r, int g, struct args *a);
struct hp_jval *jj_str_format(struct rs *r, struct hp_jval *fmt, struct hp_jval *args);

#endif
