/*
 * test-chat.c - conversations rendered and tokenized against transformers.
 *
 * data/chat/golden-T.jsonl (t/ref/make-chat-goldens.sh: transformers 4.57.6
 * and 5.24.0, which agree byte for byte) holds, for each conversation of
 * data/chat/conversations.jsonl, apply_chat_template's ids (or the error it
 * raised), its text for the shorter ones, the ids with the generation
 * prompt where the conversation ends with a user, and the assistant mask
 * that return_assistant_tokens_mask gives with data/chat/templates/
 * T-generation.jinja: the same template with {% generation %} around each
 * reply.  hp must give those ids from the plain template, the same mask
 * from the plain template by its own rule (chat.h), and the same mask from
 * the generation variant by transformers' rule.
 *
 * Also: hp_tok_encode_marked on its own (a mark boundary inside a word),
 * ShareGPT keys, every bad conversation the loader names, the template
 * lookup errors.
 */
#include <jansson.h>

#include "base/alloc.h"
#include "text/chat.h"
#include "tap.h"
#include "text/tokenizer.h"

static char src_dir[4096];

static const char *src(const char *rel)
{
	static char buf[4][4600];
	static int k;

	k = (k + 1) % 4;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", src_dir, rel);
	return buf[k];
}

struct vec {
	int32_t *ids;
	uint8_t *marks;
	size_t n, cap;
};

static void vec_free(struct vec *v)
{
	hp_free(v->ids);
	hp_free(v->marks);
	memset(v, 0, sizeof(*v));
}

static json_t **load_lines(const char *path, size_t *n)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0, k = 0, room = 0;
	json_t **v = NULL;
	ssize_t len;

	*n = 0;
	if (!f)
		return NULL;
	while ((len = getline(&line, &cap, f)) > 0) {
		json_error_t je;

		if (k == room) {
			room = room ? 2 * room : 256;
			v = realloc(v, room * sizeof(*v));
		}
		v[k] = json_loadb(line, (size_t)len, 0, &je);
		if (!v[k])
			break;
		k++;
	}
	free(line);
	fclose(f);
	*n = k;
	return v;
}

static void free_lines(json_t **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		json_decref(v[i]);
	free(v);
}

/* ids (or marks when marks) equal to the JSON array a; the first difference in *at */
static int same(const struct vec *v, const json_t *a, int marks, size_t *at)
{
	size_t n = json_array_size(a);

	for (size_t i = 0; i < n && i < v->n; i++) {
		long long want = json_integer_value(json_array_get(a, i));
		long long got = marks ? v->marks[i] : v->ids[i];

		if (got != want) {
			*at = i;
			return 0;
		}
	}
	*at = n < v->n ? n : v->n;
	return n == v->n;
}

/* A role other than system, user, assistant, tool (which hp refuses). */
static int odd_role(const json_t *conv)
{
	const json_t *m;
	size_t i;

	json_array_foreach(json_object_get(conv, "messages"), i, m) {
		const char *r = json_string_value(json_object_get(m, "role"));

		if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")))
			return 1;
	}
	return 0;
}

static void test_template(const char *name, const char *tokdir, const char *spec, const char *genspec,
			  json_t **convs, size_t nconv)
{
	char path[256];
	size_t ngold, bad_ids = 0, bad_mask = 0, bad_text = 0, bad_gen = 0, bad_err = 0, errors = 0, texts = 0,
	       gens = 0, bad_gmask = 0, tokens = 0, targets = 0, refused = 0;
	json_t **gold;
	struct hp_tokenizer *tok = NULL;
	struct hp_chat *c = NULL, *g = NULL;
	struct hp_chat_opts o = { .template_spec = spec, .tokenizer_path = tokdir };
	struct hp_chat_opts go = { .template_spec = genspec, .tokenizer_path = tokdir };
	struct hp_err e;
	char first[512] = "";

	snprintf(path, sizeof(path), "data/chat/golden-%s.jsonl", name);
	gold = load_lines(src(path), &ngold);
	if (!ok(gold && ngold == nconv, "%s: %zu golden lines for %zu conversations", name, ngold, nconv) ||
	    !ok(!hp_tok_load(&tok, tokdir, &e), "%s: tokenizer loads", name) ||
	    !ok(!hp_chat_open(&c, &o, tok, &e), "%s: template '%s' compiles", name, spec ? spec : "auto") ||
	    !ok(!hp_chat_open(&g, &go, tok, &e), "%s: generation variant compiles", name)) {
		tap_diag("  %s", e.msg);
		goto out;
	}
	for (size_t i = 0; i < nconv && i < ngold; i++) {
		const json_t *gl = gold[i], *want_err = json_object_get(gl, "error");
		struct vec v = { 0 }, w = { 0 }, q = { 0 };
		char *text = NULL;
		size_t tlen = 0, at;
		int rc = hp_chat_encode(c, convs[i], 0, &v.ids, &v.marks, &v.n, &v.cap, &text, &tlen, &e);

		if (odd_role(convs[i])) {
			/* transformers renders (or, Qwen3, drops) a role hp refuses by name */
			refused++;
			if (rc != HP_EFORMAT || !strstr(e.msg, "unknown role")) {
				bad_err++;
				if (!*first)
					snprintf(first, sizeof(first), "conversation %zu: an unknown role not refused", i);
			}
			goto next;
		}
		if (want_err) {
			errors++;
			if (rc != HP_EFORMAT) {
				bad_err++;
				if (!*first)
					snprintf(first, sizeof(first), "conversation %zu: transformers raised '%s', hp "
						 "gave %d", i, json_string_value(want_err), rc);
			}
			goto next;
		}
		if (rc) {
			bad_ids++;
			if (!*first)
				snprintf(first, sizeof(first), "conversation %zu: %s", i, e.msg);
			goto next;
		}
		tokens += v.n;
		for (size_t k = 0; k < v.n; k++)
			targets += v.marks[k];
		if (json_object_get(gl, "text")) {
			texts++;
			if (tlen != json_string_length(json_object_get(gl, "text")) ||
			    memcmp(text, json_string_value(json_object_get(gl, "text")), tlen)) {
				bad_text++;
				if (!*first)
					snprintf(first, sizeof(first), "conversation %zu: text differs", i);
			}
		}
		if (!same(&v, json_object_get(gl, "ids"), 0, &at)) {
			bad_ids++;
			if (!*first)
				snprintf(first, sizeof(first), "conversation %zu: ids differ at %zu", i, at);
		} else if (!same(&v, json_object_get(gl, "mask"), 1, &at)) {
			bad_mask++;
			if (!*first)
				snprintf(first, sizeof(first), "conversation %zu: mask differs at token %zu", i, at);
		}
		if (hp_chat_encode(g, convs[i], 0, &w.ids, &w.marks, &w.n, &w.cap, NULL, NULL, &e) ||
		    !same(&w, json_object_get(gl, "ids"), 0, &at) || !same(&w, json_object_get(gl, "mask"), 1, &at)) {
			bad_gmask++;
			if (!*first)
				snprintf(first, sizeof(first), "conversation %zu: generation variant differs at %zu", i, at);
		}
		if (json_object_get(gl, "gen_ids")) {
			gens++;
			if (hp_chat_encode(c, convs[i], 1, &q.ids, &q.marks, &q.n, &q.cap, NULL, NULL, &e) ||
			    !same(&q, json_object_get(gl, "gen_ids"), 0, &at)) {
				bad_gen++;
				if (!*first)
					snprintf(first, sizeof(first), "conversation %zu: generation prompt ids differ", i);
			}
		}
next:
		hp_free(text);
		vec_free(&v);
		vec_free(&w);
		vec_free(&q);
	}
	ok(!bad_ids && !bad_err, "%s: ids of %zu conversations equal transformers' (%zu tokens); its %zu "
	   "errors refused too, and %zu with a role hp does not know", name, nconv - errors - refused, tokens,
	   errors, refused);
	ok(!bad_text, "%s: rendered text of %zu conversations equal", name, texts);
	ok(!bad_mask, "%s: hp's own rule marks what {%% generation %%} marks (%zu targets)", name, targets);
	ok(!bad_gmask, "%s: the generation variant's mask equals return_assistant_tokens_mask", name);
	ok(!bad_gen, "%s: %zu generation prompts equal", name, gens);
	if (*first)
		tap_diag("  first: %s", first);
out:
	hp_chat_free(c);
	hp_chat_free(g);
	hp_tok_free(tok);
	if (gold)
		free_lines(gold, ngold);
}

static void test_marked(void)
{
	struct hp_tokenizer *t = NULL;
	struct hp_err e;
	const char *text = "<|im_start|>assistant\nHello world<|im_end|>\n";
	size_t len = strlen(text), hello = strlen("<|im_start|>assistant\n");
	uint8_t mark[128] = { 0 };
	struct vec v = { 0 };
	int32_t *plain = NULL;
	size_t np = 0, cp = 0;
	char desc[256] = "";

	if (!ok(!hp_tok_load(&t, src("data/tokenizers/qwen3"), &e), "qwen3 tokenizer loads"))
		return;
	/* marks from "Hello" through <|im_end|> */
	memset(mark + hello, 1, len - hello - 1);
	hp_tok_encode(t, text, len, &plain, &np, &cp, &e);
	ok(!hp_tok_encode_marked(t, text, len, mark, &v.ids, &v.marks, &v.n, &v.cap, &e) && v.n == np &&
	   !memcmp(v.ids, plain, np * sizeof(*plain)), "marked encode gives hp_tok_encode's ids");
	for (size_t i = 0; i < v.n && strlen(desc) < 200; i++)
		snprintf(desc + strlen(desc), sizeof(desc) - strlen(desc), "%d:%d ", v.ids[i], v.marks[i]);
	/* <|im_start|> assistant \n Hello ␣world <|im_end|> \n */
	ok(v.n == 7 && !v.marks[0] && !v.marks[1] && !v.marks[2] && v.marks[3] && v.marks[4] && v.marks[5] &&
	   !v.marks[6], "marks follow the bytes inside a piece: %s", desc);
	/* a boundary inside a token: only "wor" marked; " world" takes the mark */
	memset(mark, 0, sizeof(mark));
	memset(mark + hello + 6, 1, 3);
	v.n = 0;
	ok(!hp_tok_encode_marked(t, text, len, mark, &v.ids, &v.marks, &v.n, &v.cap, &e) && v.n == 7 &&
	   !v.marks[3] && v.marks[4] && !v.marks[5], "a token overlapping a marked byte is marked");
	{
		size_t a, b;
		int32_t id;

		ok(hp_tok_find_special(t, text, len, 1, &a, &b, &id) && a == len - 11 && b == len - 1 &&
		   id == hp_tok_token_id(t, "<|im_end|>"), "the first special token after a position");
	}
	hp_free(plain);
	vec_free(&v);
	hp_tok_free(t);
}

static int encode_str(struct hp_chat *c, const char *json, struct vec *v, struct hp_err *e)
{
	json_error_t je;
	json_t *j = json_loads(json, 0, &je);
	int rc;

	if (!j)
		return -100;
	v->n = 0;
	rc = hp_chat_encode(c, j, 0, &v->ids, &v->marks, &v->n, &v->cap, NULL, NULL, e);
	json_decref(j);
	return rc;
}

static void test_keys_and_errors(void)
{
	struct hp_tokenizer *t = NULL;
	struct hp_chat *c = NULL, *s = NULL, *all = NULL;
	struct hp_chat_opts o = { .tokenizer_path = src("data/tokenizers/qwen3") };
	struct hp_chat_opts so = { .tokenizer_path = src("data/tokenizers/qwen3"), .messages_key = "conversations",
				   .role_key = "from", .content_key = "value" };
	struct hp_chat_opts ao = { .tokenizer_path = src("data/tokenizers/qwen3"), .all_tokens = 1 };
	struct vec a = { 0 }, b = { 0 };
	struct hp_err e;
	int allmarked = 1;
	static const struct {
		const char *json, *msg;
	} bad[] = {
		{ "{\"text\": \"hi\"}", "no 'messages' key" },
		{ "{\"messages\": {}}", "'messages' is not a list" },
		{ "{\"messages\": [1]}", "message 1 is not an object" },
		{ "{\"messages\": [{\"content\": \"x\"}]}", "message 1: role key 'role' is missing" },
		{ "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"bot\", \"content\": \"y\"}]}",
		  "message 2: unknown role 'bot'" },
		{ "{\"messages\": [{\"role\": \"user\"}]}", "message 1: content key 'content' is missing" },
		{ "{\"messages\": [{\"role\": \"user\", \"content\": 3}]}", "message 1: content key 'content' is not a string" },
	};

	if (!ok(!hp_tok_load(&t, src("data/tokenizers/qwen3"), &e) && !hp_chat_open(&c, &o, t, &e) &&
		!hp_chat_open(&s, &so, t, &e) && !hp_chat_open(&all, &ao, t, &e), "qwen3 chats open")) {
		tap_diag("  %s", e.msg);
		goto out;
	}
	ok(!encode_str(c, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
		       "\"content\": \"Hello!\"}]}", &a, &e) &&
	   !encode_str(s, "{\"conversations\": [{\"from\": \"human\", \"value\": \"Hi\"}, {\"from\": \"gpt\", "
		       "\"value\": \"Hello!\"}]}", &b, &e) &&
	   a.n == b.n && !memcmp(a.ids, b.ids, a.n * 4) && !memcmp(a.marks, b.marks, a.n),
	   "ShareGPT's conversations/from/value/human/gpt give the messages form's ids and marks");
	ok(!encode_str(all, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
		       "\"content\": \"Hello!\"}]}", &b, &e), "all_tokens encodes");
	for (size_t i = 0; i < b.n; i++)
		allmarked &= b.marks[i];
	ok(allmarked && b.n == a.n, "all_tokens marks every token");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = encode_str(c, bad[i].json, &a, &e);

		ok(rc == HP_EFORMAT && strstr(e.msg, bad[i].msg), "bad conversation refused: %s", bad[i].msg);
		if (rc != HP_EFORMAT || !strstr(e.msg, bad[i].msg))
			tap_diag("  got %d '%s'", rc, rc ? e.msg : "");
	}
	{
		struct hp_chat *x = NULL;
		struct hp_chat_opts xo = { .template_spec = "llama2", .tokenizer_path = src("data/tokenizers/qwen3") };
		struct hp_chat_opts mo = { .tokenizer_path = src("data/tokenizers/mistral") };
		struct hp_chat_opts fo = { .template_spec = "/nonexistent/t.jinja" };
		int rc;

		rc = hp_chat_open(&x, &xo, t, &e);
		ok(rc == HP_ECONFIG && strstr(e.msg, "'llama2' is not known"), "an unknown template name is refused");
		rc = hp_chat_open(&x, &mo, t, &e);
		ok(rc == HP_ECONFIG && strstr(e.msg, "no chat template"), "auto without a template is refused: %s",
		   e.msg);
		rc = hp_chat_open(&x, &fo, t, &e);
		ok(rc == HP_EIO && strstr(e.msg, "/nonexistent/t.jinja"), "a missing template file is named");
	}
out:
	vec_free(&a);
	vec_free(&b);
	hp_chat_free(c);
	hp_chat_free(s);
	hp_chat_free(all);
	hp_tok_free(t);
}

int main(void)
{
	const char *s = getenv("HP_SRC_DIR");
	size_t nconv;
	json_t **convs;

	snprintf(src_dir, sizeof(src_dir), "%s", s && *s ? s : ".");
	test_marked();
	test_keys_and_errors();
	convs = load_lines(src("data/chat/conversations.jsonl"), &nconv);
	if (ok(convs && nconv >= 200, "%zu conversations", nconv)) {
		test_template("qwen3", src("data/tokenizers/qwen3"), NULL,
			      src("data/chat/templates/qwen3-generation.jinja"), convs, nconv);
		test_template("llama3", src("data/tokenizers/llama3"), NULL,
			      src("data/chat/templates/llama3-generation.jinja"), convs, nconv);
		test_template("mistral", src("data/tokenizers/mistral"), src("data/chat/templates/mistral-instruct.jinja"),
			      src("data/chat/templates/mistral-generation.jinja"), convs, nconv);
		test_template("chatml", src("data/tokenizers/qwen3"), "chatml",
			      src("data/chat/templates/chatml-generation.jinja"), convs, nconv);
		free_lines(convs, nconv);
	}
	return tap_done();
}
