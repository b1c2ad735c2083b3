/*
 * jinja.h - a Jinja2 interpreter for Hugging Face chat templates, whose
 * values carry per-byte provenance tags.
 *
 * transformers renders a conversation with jinja2 3.1 configured as
 *   ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 *       extensions=[AssistantTracker ({% generation %}), loopcontrols])
 * with keep_trailing_newline=False, the default Undefined, `tojson` replaced
 * by json.dumps(x, ensure_ascii=False, indent, separators, sort_keys) and the
 * globals raise_exception(msg), strftime_now(fmt), dict(**kw) and a
 * namespace() that refuses underscore-prefixed names.  This interpreter
 * reproduces that environment byte for byte for the subset of the language
 * chat templates use (t/unit/test-jinja.c checks it against jinja2 itself),
 * and adds what jinja2 cannot give: every string byte carries a 16-bit tag
 * (0 = text of the template; the caller tags its inputs, e.g. with a message
 * index or role), and the tags follow the bytes through concatenation,
 * slicing, strip, split, replace, join, tojson, repr and output.  The output
 * also marks the bytes emitted inside {% generation %} blocks, as
 * transformers' return_assistant_tokens_mask does.
 *
 * What it is not: a general Jinja2.  No template inheritance, includes,
 * imports, {% call %}, {% with %}, autoescape or custom extensions; those,
 * and the filters and tests jinja2 has but this subset lacks, are refused at
 * compile time with HP_EUNSUP naming the construct and its line.  Integers
 * are int64 (Python's are unbounded: overflow is an error here), and
 * upper/lower know the common special casings (sharp s, ligatures, final
 * sigma) but not all of SpecialCasing.txt.
 *
 * Ownership and threads.  A compiled template (struct hp_jinja) is
 * immutable and owns its syntax tree; it may be rendered by many threads at
 * once.  A context (struct hp_jctx) is an arena owning the values made with
 * hp_jv_*; freeing it frees them all at once.  Rendering reads the context
 * and never modifies it (the temporaries of a render live in an arena of the
 * render, freed on return), so one context may also feed concurrent renders
 * once it is no longer being built.  Values are borrowed everywhere: a value
 * appended to a list or set in a dict is referenced, not copied, and must
 * belong to the same context.
 *
 * Errors.  Compile: HP_EFORMAT for syntax errors, HP_EUNSUP for constructs
 * outside the subset, HP_ENOMEM.  Render: HP_EFORMAT for every template
 * runtime error (raise_exception's message, undefined values used, type
 * errors, the sandbox refusing a mutating method, a limit reached), HP_ENOMEM.
 * Messages are one line: "'NAME' line L: what".
 *
 * Limits against hostile templates (each failure names the limit): macro
 * recursion 100 deep, expression nesting 200 deep, range() of at most 100000
 * items (jinja's sandbox limit), 2 * 10^6 loop iterations and range() items per render, 256 MiB of
 * output per render and 1 GiB of temporaries per render.
 */
#ifndef HP_JINJA_H
#define HP_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/err.h"

struct hp_jinja;   /* a compiled template */
struct hp_jctx;    /* an arena of values */
struct hp_jval;    /* a value owned by its hp_jctx */

/*
 * Compile len bytes of src (UTF-8; need not be NUL-terminated) into *t.
 * name is used in messages (e.g. "qwen3/tokenizer_config.json") and copied.
 * Returns 0, or HP_EFORMAT / HP_EUNSUP / HP_ENOMEM with *t = NULL.
 */
int hp_jinja_compile(struct hp_jinja **t, const char *src, size_t len, const char *name,
		     struct hp_err *e);
void hp_jinja_free(struct hp_jinja *t);
/* 1 if the template has a {% generation %} block, else 0. */
int hp_jinja_has_generation(const struct hp_jinja *t);

/* A new empty context; NULL on no memory. */
struct hp_jctx *hp_jctx_new(void);
/* Free c and every value made in it; NULL ok. */
void hp_jctx_free(struct hp_jctx *c);

/*
 * Values.  Each returns a new value owned by c, or NULL on no memory.
 * hp_jv_str copies len bytes of s (UTF-8, need not be NUL-terminated) and
 * gives every byte the tag; an invalid byte counts as one character.
 */
struct hp_jval *hp_jv_none(struct hp_jctx *c);
struct hp_jval *hp_jv_bool(struct hp_jctx *c, int b);
struct hp_jval *hp_jv_int(struct hp_jctx *c, int64_t v);
struct hp_jval *hp_jv_float(struct hp_jctx *c, double v);
struct hp_jval *hp_jv_str(struct hp_jctx *c, const char *s, size_t len, uint16_t tag);
/* Like hp_jv_str with one tag per byte (tags may be NULL: all 0). */
struct hp_jval *hp_jv_str_tagged(struct hp_jctx *c, const char *s, size_t len,
				 const uint16_t *tags);
struct hp_jval *hp_jv_list(struct hp_jctx *c);
/* An insertion-ordered dict. */
struct hp_jval *hp_jv_dict(struct hp_jctx *c);
/* Append v to list.  0, HP_EINVAL (not a list), HP_ENOMEM. */
int hp_jv_append(struct hp_jctx *c, struct hp_jval *list, struct hp_jval *v);
/* dict[key] = v (key copied, tag 0; replaces an existing key in place).
 * 0, HP_EINVAL (not a dict), HP_ENOMEM. */
int hp_jv_set(struct hp_jctx *c, struct hp_jval *dict, const char *key, struct hp_jval *v);
/* A jansson value (object/array/string/number/bool/null) as a jinja value;
 * every string inside, object keys included, gets tag.  NULL on no memory. */
struct hp_jval *hp_jv_from_json(struct hp_jctx *c, const json_t *j, uint16_t tag);

/* The result of a render.  Owned by the caller: release with hp_jout_release. */
struct hp_jout {
	char *text;        /* hp_malloc'd, NUL-terminated, len bytes */
	size_t len;
	uint16_t *tag;     /* per byte, hp_malloc'd (always non-NULL when len > 0) */
	uint8_t *gen;      /* per byte: 1 if emitted inside {% generation %} at the top
			    * level of the output; NULL if the template has none */
};

/*
 * Render t with the top-level variables of the dict vars (borrowed; a NULL
 * vars renders with none).  Returns 0 and fills *out, or a negative HP_E*
 * code with *out zeroed (see Errors above).  e may be NULL.
 */
int hp_jinja_render(const struct hp_jinja *t, struct hp_jctx *c, struct hp_jval *vars,
		    struct hp_jout *out, struct hp_err *e);
/*
 * The limits of one render (see above); a zero field keeps its default.
 * hp_jinja_render uses the defaults; fuzzers and tests lower them.
 */
struct hp_jlimits {
	size_t max_output;     /* bytes written, captures included (default 256 MiB) */
	size_t max_memory;     /* bytes of temporaries (default 1 GiB) */
	long max_iters;        /* loop iterations plus range() items (default 2 * 10^6) */
};
int hp_jinja_render_lim(const struct hp_jinja *t, struct hp_jctx *c, struct hp_jval *vars,
			const struct hp_jlimits *lim, struct hp_jout *out, struct hp_err *e);
/* Free and zero o's buffers; NULL ok. */
void hp_jout_release(struct hp_jout *o);

#endif
