/*
 * chat.c - chat templates: the template found and compiled, a conversation
 * turned into jinja values with provenance tags, rendered, its assistant
 * replies located, and the text encoded with marks (see chat.h for the
 * rules).
 *
 * What this is not: a chat server (no generation, no continue_final_message),
 * a tool-call parser, or a second renderer: every template, the built-in
 * ChatML one included, goes through the one interpreter in jinja_*.c.
 */
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/fileio.h"
#include "text/chat.h"
#include "text/jinja.h"

/* The plain ChatML template (the Hugging Face chat-templating guide's). */
static const char chatml_src[] =
	"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
	"'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
	"{% endif %}";

/* the special tokens transformers passes to the template (special_tokens_map) */
static const char *const special_names[] = {
	"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
};
#define NSPECIAL (sizeof(special_names) / sizeof(special_names[0]))

struct hp_chat {
	struct hp_tokenizer *tok;
	struct hp_jinja *tpl;
	char *source;
	char *messages_key, *role_key, *content_key;
	int all_tokens;
	char *special[NSPECIAL];    /* NULL: not set */
	/* scratch */
	uint8_t *bytemask;
	size_t bytemask_cap;
};

static int read_file(const char *path, char **buf, size_t *len, struct hp_err *e)
{
	FILE *f = fopen(path, "rb");
	int rc;

	if (!f)
		return hp_err_set(e, HP_EIO, "'%s': cannot open: %s", path, strerror(errno));
	rc = hp_read_stream(f, buf, len);
	fclose(f);
	if (rc)
		return errno == ENOMEM ? hp_err_set(e, HP_ENOMEM, "out of memory reading '%s'", path) :
			hp_err_set(e, HP_EIO, "'%s': read failed: %s", path, strerror(errno));
	return 0;
}

/* The folder of a tokenizer path (a folder, or a file in one), in buf. */
static void tokenizer_dir(const char *path, char *buf, size_t n)
{
	struct stat st;
	const char *slash;

	if (!path || !*path) {
		snprintf(buf, n, ".");
		return;
	}
	if (!stat(path, &st) && S_ISDIR(st.st_mode)) {
		snprintf(buf, n, "%s", path);
		return;
	}
	slash = strrchr(path, '/');
	if (!slash)
		snprintf(buf, n, ".");
	else
		snprintf(buf, n, "%.*s", (int)(slash - path), path);
}

/* A special token's text in tokenizer_config.json: a string or {"content": s}. */
static const char *token_text(const json_t *v)
{
	if (json_is_string(v))
		return json_string_value(v);
	if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
		return json_string_value(json_object_get(v, "content"));
	return NULL;
}

/*
 * tokenizer_config.json beside the tokenizer: its special tokens, and with
 * want_template its chat_template into *src (hp_malloc'd; NULL when it has
 * none).  A missing file is not an error (*src stays NULL).
 */
static int read_config(struct hp_chat *c, const char *dir, int want_template, char **src,
		       struct hp_err *e)
{
	char path[4096];
	json_error_t jerr;
	json_t *root, *ct;
	struct stat st;

	snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
	if (stat(path, &st))
		return 0;
	if (!(root = json_load_file(path, JSON_DECODE_INT_AS_REAL, &jerr)))
		return hp_err_set(e, HP_ECONFIG, "'%s': invalid JSON at line %d: %s", path, jerr.line, jerr.text);
	if (!json_is_object(root)) {
		json_decref(root);
		return hp_err_set(e, HP_ECONFIG, "'%s': expected a JSON object", path);
	}
	for (size_t k = 0; k < NSPECIAL; k++) {
		const char *s = token_text(json_object_get(root, special_names[k]));

		if (s && !(c->special[k] = hp_strdup(s))) {
			json_decref(root);
			return hp_err_set(e, HP_ENOMEM, "out of memory");
		}
	}
	ct = json_object_get(root, "chat_template");
	if (want_template && ct && !json_is_null(ct)) {
		const char *s = NULL;

		if (json_is_string(ct)) {
			s = json_string_value(ct);
		} else if (json_is_array(ct)) {
			/* a list of {"name", "template"}: the "default" one */
			size_t i;
			json_t *it;

			json_array_foreach(ct, i, it) {
				const json_t *nm = json_object_get(it, "name");

				if (json_is_string(nm) && !strcmp(json_string_value(nm), "default") &&
				    json_is_string(json_object_get(it, "template")))
					s = json_string_value(json_object_get(it, "template"));
			}
			if (!s) {
				json_decref(root);
				return hp_err_set(e, HP_ECONFIG, "'%s': chat_template is a list of named templates "
						  "without a \"default\" one: name a .jinja file instead", path);
			}
		} else {
			json_decref(root);
			return hp_err_set(e, HP_ECONFIG, "'%s': chat_template: expected a string or a list of "
					  "named templates", path);
		}
		if (!(*src = hp_strdup(s))) {
			json_decref(root);
			return hp_err_set(e, HP_ENOMEM, "out of memory");
		}
	}
	json_decref(root);
	return 0;
}

int hp_chat_spec_is_file(const char *spec)
{
	size_t n = strlen(spec);

	return strchr(spec, '/') || (n > 6 && !strcmp(spec + n - 6, ".jinja"));
}

void hp_chat_free(struct hp_chat *c)
{
	if (!c)
		return;
	hp_jinja_free(c->tpl);
	hp_free(c->source);
	hp_free(c->messages_key);
	hp_free(c->role_key);
	hp_free(c->content_key);
	for (size_t k = 0; k < NSPECIAL; k++)
		hp_free(c->special[k]);
	hp_free(c->bytemask);
	hp_free(c);
}

int hp_chat_open(struct hp_chat **out, const struct hp_chat_opts *o, struct hp_tokenizer *tok,
		 struct hp_err *e)
{
	const char *spec = o->template_spec && *o->template_spec ? o->template_spec : "auto";
	struct hp_chat *c = hp_calloc(1, sizeof(*c));
	char dir[4096], where[4200];
	char *src = NULL;
	size_t len = 0;
	int rc = 0;

	*out = NULL;
	if (!c)
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	c->tok = tok;
	c->all_tokens = o->all_tokens;
	if (!(c->messages_key = hp_strdup(o->messages_key ? o->messages_key : "messages")) ||
	    !(c->role_key = hp_strdup(o->role_key ? o->role_key : "role")) ||
	    !(c->content_key = hp_strdup(o->content_key ? o->content_key : "content"))) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory");
		goto fail;
	}
	tokenizer_dir(o->tokenizer_path, dir, sizeof(dir));
	if (!strcmp(spec, "auto")) {
		struct stat st;

		snprintf(where, sizeof(where), "%s/chat_template.jinja", dir);
		if (!stat(where, &st)) {
			if ((rc = read_file(where, &src, &len, e)) || (rc = read_config(c, dir, 0, NULL, e)))
				goto fail;
		} else {
			if ((rc = read_config(c, dir, 1, &src, e)))
				goto fail;
			snprintf(where, sizeof(where), "%s/tokenizer_config.json", dir);
			if (!src) {
				rc = hp_err_set(e, HP_ECONFIG, "'%s': no chat template (no chat_template.jinja, and no "
						"chat_template in tokenizer_config.json): name one (chatml, or a .jinja "
						"file)", dir);
				goto fail;
			}
			len = strlen(src);
		}
	} else if (!strcmp(spec, "chatml")) {
		if ((rc = read_config(c, dir, 0, NULL, e)))
			goto fail;
		if (!(src = hp_strdup(chatml_src))) {
			rc = hp_err_set(e, HP_ENOMEM, "out of memory");
			goto fail;
		}
		len = strlen(src);
		snprintf(where, sizeof(where), "chatml");
	} else if (hp_chat_spec_is_file(spec)) {
		if ((rc = read_file(spec, &src, &len, e)) || (rc = read_config(c, dir, 0, NULL, e)))
			goto fail;
		snprintf(where, sizeof(where), "%s", spec);
	} else {
		rc = hp_err_set(e, HP_ECONFIG, "chat template '%s' is not known: auto (the model's own), chatml, "
				"or a .jinja file", spec);
		goto fail;
	}
	if (!(c->source = hp_strdup(where))) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory");
		goto fail;
	}
	if ((rc = hp_jinja_compile(&c->tpl, src, len, c->source, e)))
		goto fail;
	hp_free(src);
	*out = c;
	return 0;
fail:
	hp_free(src);
	hp_chat_free(c);
	return rc;
}

const char *hp_chat_source(const struct hp_chat *c)
{
	return c->source;
}

/* ---- conversations ---- */

/* A message's role as the template sees it (ShareGPT's names read as
 * OpenAI's), or NULL when it is not one of the known roles. */
static const char *role_name(const char *r)
{
	static const char *const known[] = { "system", "user", "assistant", "tool" };

	for (size_t i = 0; i < 4; i++)
		if (!strcmp(r, known[i]))
			return known[i];
	if (!strcmp(r, "human"))
		return "user";
	if (!strcmp(r, "gpt"))
		return "assistant";
	return NULL;
}

int hp_chat_check(const struct hp_chat *c, const json_t *conv, int *assistants, struct hp_err *e)
{
	const json_t *msgs = json_is_object(conv) ? json_object_get(conv, c->messages_key) : NULL;
	size_t i;
	json_t *m;

	*assistants = 0;
	if (!json_is_object(conv))
		return hp_err_set(e, HP_EFORMAT, "expected a JSON object");
	if (!msgs)
		return hp_err_set(e, HP_EFORMAT, "no '%s' key (the list of messages)", c->messages_key);
	if (!json_is_array(msgs))
		return hp_err_set(e, HP_EFORMAT, "'%s' is not a list of messages", c->messages_key);
	json_array_foreach(msgs, i, m) {
		const json_t *r = json_object_get(m, c->role_key), *t = json_object_get(m, c->content_key);
		const char *rn;

		if (!json_is_object(m))
			return hp_err_set(e, HP_EFORMAT, "message %zu is not an object", i + 1);
		if (!json_is_string(r))
			return hp_err_set(e, HP_EFORMAT, "message %zu: role key '%s' is %s", i + 1, c->role_key,
					  r ? "not a string" : "missing");
		if (!(rn = role_name(json_string_value(r))))
			return hp_err_set(e, HP_EFORMAT, "message %zu: unknown role '%.64s' (system, user, "
					  "assistant, tool; ShareGPT's human, gpt)", i + 1, json_string_value(r));
		if (!json_is_string(t))
			return hp_err_set(e, HP_EFORMAT, "message %zu: content key '%s' is %s", i + 1,
					  c->content_key, t ? "not a string" : "missing");
		*assistants += !strcmp(rn, "assistant");
	}
	return 0;
}

/* The messages as jinja values; message i's strings but its role carry tag i + 1. */
static int build_messages(struct hp_chat *c, struct hp_jctx *jc, const json_t *msgs,
			  struct hp_jval ***vals, const char ***roles, struct hp_err *e)
{
	size_t n = json_array_size(msgs);
	struct hp_jval **v = hp_calloc(n ? n : 1, sizeof(*v));
	const char **rl = hp_calloc(n ? n : 1, sizeof(*rl));

	if (!v || !rl)
		goto nomem;
	if (n > 65534) {
		hp_free(v);
		hp_free(rl);
		return hp_err_set(e, HP_EFORMAT, "%zu messages: at most 65534", n);
	}
	for (size_t i = 0; i < n; i++) {
		const json_t *m = json_array_get(msgs, i);
		const char *key;
		json_t *val;
		uint16_t tag = (uint16_t)(i + 1);

		rl[i] = role_name(json_string_value(json_object_get(m, c->role_key)));
		if (!(v[i] = hp_jv_dict(jc)) || hp_jv_set(jc, v[i], "role", hp_jv_str(jc, rl[i], strlen(rl[i]), 0)))
			goto nomem;
		json_object_foreach((json_t *)m, key, val) {
			struct hp_jval *x;

			if (!strcmp(key, c->role_key))
				continue;
			x = hp_jv_from_json(jc, val, tag);
			if (!x || hp_jv_set(jc, v[i], !strcmp(key, c->content_key) ? "content" : key, x))
				goto nomem;
		}
	}
	*vals = v;
	*roles = rl;
	return 0;
nomem:
	hp_free(v);
	hp_free(rl);
	return hp_err_set(e, HP_ENOMEM, "out of memory");
}

/* Render the first n messages. */
static int render(struct hp_chat *c, struct hp_jctx *jc, struct hp_jval **msgs, size_t n, int gen,
		  struct hp_jval *tools, struct hp_jout *out, struct hp_err *e)
{
	struct hp_jval *vars = hp_jv_dict(jc), *list = hp_jv_list(jc);

	if (!vars || !list)
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		if (hp_jv_append(jc, list, msgs[i]))
			return hp_err_set(e, HP_ENOMEM, "out of memory");
	for (size_t k = 0; k < NSPECIAL; k++)
		if (c->special[k] && hp_jv_set(jc, vars, special_names[k],
					       hp_jv_str(jc, c->special[k], strlen(c->special[k]), 0)))
			return hp_err_set(e, HP_ENOMEM, "out of memory");
	if (hp_jv_set(jc, vars, "messages", list) ||
	    hp_jv_set(jc, vars, "tools", tools) ||
	    hp_jv_set(jc, vars, "documents", hp_jv_none(jc)) ||
	    hp_jv_set(jc, vars, "add_generation_prompt", hp_jv_bool(jc, gen)))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	return hp_jinja_render(c->tpl, jc, vars, out, e);
}

/* How far back the prompt and the rendering are compared (see below). */
#define SUFFIX_CAP 4096

/*
 * Where reply i starts in F, in [lo, hi]: lo is the end of the earlier
 * messages' bytes, hi the reply's own first byte (or the next message's,
 * when it has none).  The prompt for it, P (the messages before it with
 * add_generation_prompt true), ends with the role header that the model
 * must not learn to write; the reply starts at the place k in [lo, hi]
 * where F[0..k) ends with the longest tail of P (compared up to
 * SUFFIX_CAP bytes back, the earlier k on a tie: the
 * first place the prompt fits, when replies are empty).  When P is a prefix of F
 * that is len(P) itself; it also finds the header when the earlier turns
 * render differently once this one follows (Qwen3 gives only the last turn
 * its <think> block) or when the template writes the header whatever
 * add_generation_prompt says (Llama 3's).  A prompt that does not render
 * (a template that raises on it) leaves hi.
 */
static int reply_start(struct hp_chat *c, struct hp_jctx *jc, struct hp_jval **msgs, size_t i,
		       struct hp_jval *tools, const struct hp_jout *F, size_t lo, size_t hi, size_t *start,
		       struct hp_err *e)
{
	struct hp_jout P = { 0 };
	struct hp_err pe = { 0 };
	size_t best = 0;

	*start = hi;
	if (render(c, jc, msgs, i, 1, tools, &P, &pe))
		return pe.code == HP_ENOMEM ? hp_err_set(e, HP_ENOMEM, "out of memory") : 0;
	for (size_t k = hi + 1; k-- > lo;) {
		size_t m = 0;

		while (m < P.len && m < k && m < SUFFIX_CAP && P.text[P.len - 1 - m] == F->text[k - 1 - m])
			m++;
		if (m >= best && m) {
			best = m;
			*start = k;
		}
	}
	hp_jout_release(&P);
	return 0;
}

/*
 * The bytes of each assistant reply in F (see chat.h), marked in mask.
 */
static int mark_replies(struct hp_chat *c, struct hp_jctx *jc, struct hp_jval **msgs, const char **roles,
			size_t n, struct hp_jval *tools, const struct hp_jout *F, uint8_t *mask,
			struct hp_err *e)
{
	/* each message's first and last byte in F: tag t is message t - 1 */
	size_t *first = hp_malloc((n + 2) * sizeof(size_t)), *last = hp_malloc((n + 2) * sizeof(size_t));
	size_t prev_end = 0;
	int rc = 0;

	if (!first || !last) {
		hp_free(first);
		hp_free(last);
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	}
	for (size_t t = 0; t < n + 2; t++) {
		first[t] = SIZE_MAX;
		last[t] = 0;
	}
	for (size_t k = 0; k < F->len; k++) {
		uint16_t t = F->tag[k];

		if (t && t <= n) {
			if (first[t] == SIZE_MAX)
				first[t] = k;
			last[t] = k + 1;
		}
	}
	for (size_t i = 0; i < n && !rc; i++) {
		size_t t = i + 1, lo = prev_end, hi, start, end, limit = F->len, a, b;
		int32_t id;

		if (first[t] != SIZE_MAX && last[t] > prev_end && strcmp(roles[i], "assistant")) {
			prev_end = last[t];
			continue;
		}
		if (strcmp(roles[i], "assistant"))
			continue;
		for (size_t u = t + 1; u <= n; u++)
			if (first[u] < limit && first[u] >= lo)
				limit = first[u];
		hi = first[t] != SIZE_MAX ? first[t] : limit;
		if (hi < lo)
			hi = lo;
		if ((rc = reply_start(c, jc, msgs, i, tools, F, lo, hi, &start, e)))
			break;
		end = first[t] == SIZE_MAX || last[t] < start ? start : last[t];
		/* the special token that closes the turn, if it comes before the next message */
		if (hp_tok_find_special(c->tok, F->text, F->len, end, &a, &b, &id) && b <= limit)
			end = b;
		memset(mask + start, 1, end > start ? end - start : 0);
		if (last[t] > prev_end)
			prev_end = last[t];
		if (end > prev_end)
			prev_end = end;
	}
	hp_free(first);
	hp_free(last);
	return rc;
}

int hp_chat_encode(struct hp_chat *c, const json_t *conv, int gen_prompt, int32_t **ids,
		   uint8_t **marks, size_t *n, size_t *cap, char **text, size_t *text_len,
		   struct hp_err *e)
{
	const json_t *msgs, *tj;
	struct hp_jctx *jc;
	struct hp_jval **vals = NULL, *tools;
	const char **roles = NULL;
	struct hp_jout F = { 0 };
	size_t nm, n0 = *n;
	int assistants, rc;

	if (text)
		*text = NULL;
	if ((rc = hp_chat_check(c, conv, &assistants, e)))
		return rc;
	msgs = json_object_get(conv, c->messages_key);
	tj = json_object_get(conv, "tools");
	nm = json_array_size(msgs);
	if (!(jc = hp_jctx_new()))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	/* the conversation's tools (None without), one value for every render */
	if (!(tools = tj && !json_is_null(tj) ? hp_jv_from_json(jc, tj, 0) : hp_jv_none(jc))) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = build_messages(c, jc, msgs, &vals, &roles, e)))
		goto out;
	if ((rc = render(c, jc, vals, nm, gen_prompt, tools, &F, e)))
		goto out;
	if (c->bytemask_cap < F.len + 1) {
		uint8_t *p = hp_realloc(c->bytemask, F.len + 1);

		if (!p) {
			rc = hp_err_set(e, HP_ENOMEM, "out of memory");
			goto out;
		}
		c->bytemask = p;
		c->bytemask_cap = F.len + 1;
	}
	memset(c->bytemask, 0, F.len);
	if (gen_prompt)
		;
	else if (c->all_tokens)
		memset(c->bytemask, 1, F.len);
	else if (F.gen)
		memcpy(c->bytemask, F.gen, F.len);
	else if ((rc = mark_replies(c, jc, vals, roles, nm, tools, &F, c->bytemask, e)))
		goto out;
	rc = hp_tok_encode_marked(c->tok, F.text, F.len, c->bytemask, ids, marks, n, cap, e);
	if (rc) {
		*n = n0;
		goto out;
	}
	if (text) {
		*text = F.text;
		*text_len = F.len;
		F.text = NULL;
	}
out:
	hp_jout_release(&F);
	hp_free(vals);
	hp_free(roles);
	hp_jctx_free(jc);
	return rc;
}
