/*
 * test-tokenizer.c - hp_tok_* against HF tokenizers 0.23.2 and llama.cpp.
 *
 * The goldens are data/tokenizers/vectors/: for Qwen3, Llama-3, Mistral and
 * stories260K, 564 texts each with the ids HF tokenizers 0.23.2 gives
 * (add_special_tokens=false), and llama.cpp's own vectors for Qwen2 (the
 * Qwen3 tokenizer.json) and Llama-3 BPE.  Every text must give exactly
 * those ids and decode back to itself.  Small inline tokenizers, loaded
 * from memory, cover what the four files do not use (Metaspace, the other
 * Split behaviors, lstrip/rstrip/single_word, normalized added tokens, unk
 * without byte fallback, ByteLevel's own regex); their ids and decodes come
 * from HF tokenizers 0.23.2 on the same JSON (pip install tokenizers==0.23.2;
 * t = Tokenizer.from_str(json); ids = t.encode(text,
 * add_special_tokens=False).ids; t.decode(ids, skip_special_tokens=False)).
 *
 * Then the error paths: a missing file, not JSON, an unsupported model,
 * invalid UTF-8, bad ids, and every allocation of a load, an encode and a
 * decode failing in turn.  Data is found through HP_SRC_DIR ("." if unset).
 */
#include <inttypes.h>
#include <limits.h>
#include <unistd.h>

#include <jansson.h>

#include "base/alloc.h"
#include "text/tokenizer.h"
#include "../tap.h"

static char src_dir[PATH_MAX];
static char scratch[PATH_MAX];

static void path_of(char *out, size_t n, const char *rel)
{
	snprintf(out, n, "%s/%s", src_dir, rel);
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
		buf[n] = '\0';
		*len = (size_t)n;
	} else {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	return buf;
}

static void diag_ids(const char *what, const int32_t *ids, size_t n)
{
	char line[600];
	size_t k = 0;

	for (size_t i = 0; i < n && k < sizeof(line) - 16; i++)
		k += (size_t)snprintf(line + k, sizeof(line) - k, "%s%d", i ? "," : "", ids[i]);
	tap_diag("    %s [%s%s]", what, line, k >= sizeof(line) - 16 ? ",..." : "");
}

/* Encode text and compare with want; on a mismatch print the first few. */
struct tally {
	size_t total, same, decoded;
	int shown;
};

static void check_one(struct hp_tokenizer *t, const char *text, size_t len, const int32_t *want,
		      size_t nwant, struct tally *ty)
{
	int32_t *ids = NULL;
	size_t n = 0, cap = 0, ol = 0;
	char *out = NULL;
	struct hp_err e;
	int rc;

	hp_err_clear(&e);
	ty->total++;
	rc = hp_tok_encode(t, text, len, &ids, &n, &cap, &e);
	if (!rc && n == nwant && (!n || !memcmp(ids, want, n * sizeof(*ids))))
		ty->same++;
	else if (ty->shown++ < 3) {
		tap_diag("  text %.*s%s (%zu bytes)", len > 200 ? 200 : (int)len, text,
			 len > 200 ? "..." : "", len);
		if (rc)
			tap_diag("    encode failed: %s", e.msg);
		diag_ids("got ", ids, n);
		diag_ids("want", want, nwant);
	}
	hp_err_clear(&e);
	rc = hp_tok_decode(t, want, nwant, &out, &ol, &e);
	if (!rc && ol == len && !memcmp(out, text, len) && out[ol] == '\0')
		ty->decoded++;
	else if (ty->shown++ < 3)
		tap_diag("  decode of '%.*s' gave '%s'%s%s", len > 200 ? 200 : (int)len, text,
			 out ? out : "", rc ? ": " : "", rc ? e.msg : "");
	hp_free(out);
	hp_free(ids);
}

static struct hp_tokenizer *load(const char *rel)
{
	char path[PATH_MAX];
	struct hp_tokenizer *t = NULL;
	struct hp_err e;

	path_of(path, sizeof(path), rel);
	hp_err_clear(&e);
	if (hp_tok_load(&t, path, &e))
		tap_diag("load '%s': %s", path, e.msg);
	return t;
}

static void test_jsonl(const char *name, const char *tok_rel, const char *vec_rel)
{
	char path[PATH_MAX];
	struct hp_tokenizer *t = load(tok_rel);
	struct tally ty = { 0 };
	size_t len, bad = 0;
	char *buf, *line, *end;

	path_of(path, sizeof(path), vec_rel);
	buf = slurp(path, &len);
	if (!t || !buf) {
		ok(0, "%s: load tokenizer and vectors", name);
		ok(0, "%s: decode", name);
		free(buf);
		hp_tok_free(t);
		return;
	}
	for (line = buf; line < buf + len; line = end + 1) {
		json_error_t jerr;
		json_t *j, *jids;
		int32_t *want;
		size_t n;

		end = memchr(line, '\n', (size_t)(buf + len - line));
		if (!end)
			end = buf + len;
		if (end == line)
			continue;
		j = json_loadb(line, (size_t)(end - line), JSON_ALLOW_NUL, &jerr);
		jids = json_object_get(j, "ids");
		if (!json_is_string(json_object_get(j, "text")) || !json_is_array(jids)) {
			bad++;
			json_decref(j);
			continue;
		}
		n = json_array_size(jids);
		want = malloc((n + 1) * sizeof(*want));
		for (size_t i = 0; i < n; i++)
			want[i] = (int32_t)json_integer_value(json_array_get(jids, i));
		check_one(t, json_string_value(json_object_get(j, "text")),
			  json_string_length(json_object_get(j, "text")), want, n, &ty);
		free(want);
		json_decref(j);
	}
	ok(ty.same == ty.total && ty.total == 564 && !bad, "%s: %zu/%zu texts give HF's ids",
	   name, ty.same, ty.total);
	ok(ty.decoded == ty.total && ty.total == 564, "%s: %zu/%zu decode back to the text",
	   name, ty.decoded, ty.total);
	free(buf);
	hp_tok_free(t);
}

/* llama.cpp's .inp: each string followed by "\n__ggml_vocab_test__\n";
 * .out: one line of space-separated ids per string. */
static void test_llamacpp(const char *name, const char *tok_rel, const char *base)
{
	static const char sep[] = "\n__ggml_vocab_test__\n";
	char ip[PATH_MAX], op[PATH_MAX], rel[PATH_MAX];
	struct hp_tokenizer *t = load(tok_rel);
	struct tally ty = { 0 };
	size_t il, ol;
	char *in, *out, *p, *q;

	snprintf(rel, sizeof(rel), "%s.inp", base);
	path_of(ip, sizeof(ip), rel);
	snprintf(rel, sizeof(rel), "%s.out", base);
	path_of(op, sizeof(op), rel);
	in = slurp(ip, &il);
	out = slurp(op, &ol);
	if (!t || !in || !out) {
		ok(0, "%s: load tokenizer and vectors", name);
		ok(0, "%s: decode", name);
		goto done;
	}
	for (p = in, q = out; p < in + il && q < out + ol;) {
		char *s = memmem(p, (size_t)(in + il - p), sep, sizeof(sep) - 1);
		char *nl = memchr(q, '\n', (size_t)(out + ol - q));
		int32_t want[512];
		size_t n = 0;

		if (!s || !nl)
			break;
		for (char *c = q; c < nl && n < 512;) {
			char *ep;
			long v = strtol(c, &ep, 10);

			if (ep == c)
				break;
			want[n++] = (int32_t)v;
			c = ep;
		}
		check_one(t, p, (size_t)(s - p), want, n, &ty);
		p = s + sizeof(sep) - 1;
		q = nl + 1;
	}
	ok(ty.same == ty.total && ty.total == 46 && p == in + il && q == out + ol,
	   "%s: %zu/%zu llama.cpp vectors give the same ids", name, ty.same, ty.total);
	ok(ty.decoded == ty.total && ty.total == 46, "%s: %zu/%zu decode back to the text",
	   name, ty.decoded, ty.total);
done:
	free(in);
	free(out);
	hp_tok_free(t);
}

static void test_metadata(void)
{
	static const struct {
		const char *rel;
		int64_t vocab;
		int32_t eod;
		const char *tok;
		int32_t tok_id;
	} c[] = {
		{ "data/tokenizers/qwen3/tokenizer.json", 151669, 151645, "<|endoftext|>", 151643 },
		{ "data/tokenizers/llama3/tokenizer.json", 128256, 128001, "Ġthe", 279 },
		{ "data/tokenizers/mistral/tokenizer.json", 32000, 2, "\xe2\x96\x81", 28705 },
		{ "data/stories260K/hf", 512, 2, "<0x0A>", 13 },
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct hp_tokenizer *t = load(c[i].rel);

		ok(t && hp_tok_vocab_size(t) == c[i].vocab && hp_tok_eod_id(t) == c[i].eod &&
		   hp_tok_token_id(t, c[i].tok) == c[i].tok_id &&
		   hp_tok_token_id(t, "no such token, surely") == -1,
		   "%s: vocab size %" PRId64 ", eod %d, token ids", c[i].rel, c[i].vocab, c[i].eod);
		if (t)
			tap_diag("  vocab %" PRId64 " eod %d id(%s) %d", hp_tok_vocab_size(t),
				 hp_tok_eod_id(t), c[i].tok, hp_tok_token_id(t, c[i].tok));
		hp_tok_free(t);
	}
}

/* ------------------------------------------------------------------ */
/* inline tokenizers for features the real files do not use           */

static int write_file(const char *name, const char *text, char *path, size_t n)
{
	FILE *f;

	snprintf(path, n, "%s/%s", scratch, name);
	f = fopen(path, "w");
	if (!f || fputs(text, f) < 0 || fclose(f))
		return -1;
	return 0;
}

/* Inline tokenizers load from memory under the name "inline.json". */
static struct hp_tokenizer *load_text(const char *json, struct hp_err *e)
{
	struct hp_tokenizer *t = NULL;

	hp_err_clear(e);
	if (hp_tok_load_buf(&t, "inline.json", json, strlen(json), e))
		return NULL;
	return t;
}

/* A tiny vocabulary shared by the inline cases: letters, U+2581, some
 * merges, byte tokens for 'x' only. */
#define TINY_MODEL(extra) \
	"\"model\": {\"type\": \"BPE\", " extra "\"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2, " \
	"\"c\": 3, \"\\u2581\": 4, \"ab\": 5, \"\\u2581a\": 6, \"abc\": 7, \"\\u2581ab\": 8, " \
	"\"-\": 9, \" \": 10, \"<0x78>\": 11, \"<s>\": 12, \"X\": 13}, " \
	"\"merges\": [\"a b\", \"\\u2581 a\", \"ab c\", \"\\u2581a b\"]}"

static void test_inline(void)
{
	static const struct {
		const char *title, *json, *text;
		int32_t ids[24];
		int n;
		const char *decoded;   /* HF's decode(ids) */
	} c[] = {
		{ "Metaspace pre-tokenizer, unk fused, no byte fallback",
		  "{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", "
		  "\"prepend_scheme\": \"always\", \"split\": true}, "
		  "\"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", "
		  "\"prepend_scheme\": \"always\", \"split\": true}, "
		  TINY_MODEL("\"unk_token\": \"<unk>\", \"fuse_unk\": true, ") "}",
		  "abc ab  zzq c", { 4, 7, 4, 5, 4, 4, 0, 4, 3 }, 9, "abc ab  <unk> c" },
		{ "Split MergedWithNext, no fuse_unk",
		  "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, "
		  "\"behavior\": \"MergedWithNext\", \"invert\": false}, "
		  TINY_MODEL("\"unk_token\": \"<unk>\", ") "}",
		  "ab-c--abzz", { 5, 9, 3, 9, 9, 5, 0, 0 }, 8, "ab - c - - ab <unk> <unk>" },
		{ "Split Contiguous with a regex",
		  "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"-+|b\"}, "
		  "\"behavior\": \"Contiguous\", \"invert\": false}, " TINY_MODEL("") "}",
		  "ab--bc-", { 1, 2, 9, 9, 2, 3, 9 }, 7, "a b - - b c -" },
		{ "Split MergedWithPrevious, inverted",
		  "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, "
		  "\"behavior\": \"MergedWithPrevious\", \"invert\": true}, " TINY_MODEL("") "}",
		  "ab-c--abc", { 5, 9, 3, 9, 9, 7 }, 6, "ab - c - - abc" },
		{ "Split Removed",
		  "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, "
		  "\"behavior\": \"Removed\", \"invert\": false}, " TINY_MODEL("") "}",
		  "ab-c--abc", { 5, 3, 7 }, 3, "ab c abc" },
		{ "added tokens with lstrip, rstrip and single_word",
		  "{\"added_tokens\": [{\"id\": 13, \"content\": \"X\", \"single_word\": true, "
		  "\"lstrip\": true, \"rstrip\": true, \"normalized\": false, \"special\": true}], "
		  TINY_MODEL("") "}",
		  "a  X  b aXb X", { 1, 13, 2, 10, 1, 13, 2, 13 }, 8, "a X b   a X b X" },
		{ "a normalized added token after Prepend and Replace",
		  "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
		  "{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"}, {\"type\": \"Replace\", "
		  "\"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]}, "
		  "\"added_tokens\": [{\"id\": 12, \"content\": \"<s>\", \"single_word\": false, "
		  "\"lstrip\": false, \"rstrip\": false, \"normalized\": true, \"special\": false}], "
		  TINY_MODEL("\"byte_fallback\": true, \"unk_token\": \"<unk>\", ") "}",
		  "ab <s>x", { 4, 5, 12, 11 }, 4, "\xe2\x96\x81 ab \xe2\x96\x81<s> <0x78>" },
		{ "ByteLevel with add_prefix_space and its own regex",
		  "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
		  "\"trim_offsets\": true, \"use_regex\": true}, \"decoder\": {\"type\": \"ByteLevel\", "
		  "\"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true}, "
		  "\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\u0120\": 0, \"a\": 1, \"b\": 2, "
		  "\"\\u0120a\": 3, \"\\u0120ab\": 4, \"!\": 5}, \"merges\": [[\"\\u0120\", \"a\"], "
		  "[\"\\u0120a\", \"b\"]]}}",
		  "ab ab!  a", { 4, 4, 5, 0, 3 }, 5, " ab ab!  a" },
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct hp_err e;
		struct hp_tokenizer *t = load_text(c[i].json, &e);
		int32_t *ids = NULL;
		size_t n = 0, cap = 0;
		int same;

		if (!t) {
			ok(0, "%s (load: %s)", c[i].title, e.msg);
			continue;
		}
		same = !hp_tok_encode(t, c[i].text, strlen(c[i].text), &ids, &n, &cap, &e) &&
		       n == (size_t)c[i].n && !memcmp(ids, c[i].ids, n * sizeof(*ids));
		if (!same) {
			diag_ids("got ", ids, n);
			diag_ids("want", c[i].ids, (size_t)c[i].n);
		}
		if (same) {
			char *out = NULL;
			size_t ol;

			same = !hp_tok_decode(t, ids, n, &out, &ol, &e) && !strcmp(out, c[i].decoded);
			if (!same)
				tap_diag("  decoded '%s', want '%s'", out ? out : "", c[i].decoded);
			hp_free(out);
		}
		ok(same, "%s", c[i].title);
		hp_free(ids);
		hp_tok_free(t);
	}
}

/* ------------------------------------------------------------------ */
/* errors                                                              */

static void expect_load_err(const char *json, int code, const char *msg_part, const char *title)
{
	struct hp_err e;
	struct hp_tokenizer *t = load_text(json, &e);

	if (!(t == NULL && e.code == code && strstr(e.msg, msg_part)))
		tap_diag("  code %d, message '%s'", e.code, e.msg);
	ok(t == NULL && e.code == code && strstr(e.msg, msg_part), "%s", title);
	hp_tok_free(t);
}

static void test_errors(void)
{
	char path[PATH_MAX], want[PATH_MAX + 64];
	struct hp_tokenizer *t = NULL;
	struct hp_err e;
	int32_t *ids = NULL, one = 5;
	size_t n = 0, cap = 0, ol;
	char *out = NULL;
	int rc;

	path_of(path, sizeof(path), "data/no/such/tokenizer.json");
	hp_err_clear(&e);
	rc = hp_tok_load(&t, path, &e);
	ok(rc == HP_EIO && !t && strstr(e.msg, "cannot open"), "a missing file is HP_EIO (%s)", e.msg);

	/* through a file, so that the message names it */
	hp_err_clear(&e);
	rc = write_file("tokenizer.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}",
			path, sizeof(path));
	snprintf(want, sizeof(want), "'%s': model.type 'WordPiece' is not supported; supported: BPE",
		 path);
	if (!rc)
		rc = hp_tok_load(&t, scratch, &e);   /* the folder holding it */
	ok(rc == HP_EUNSUP && !t && !strcmp(e.msg, want), "a WordPiece model is HP_EUNSUP naming the file");
	if (strcmp(e.msg, want))
		tap_diag("  got '%s'", e.msg);
	hp_err_clear(&e);
	rc = write_file("tokenizer.json", "{\"model\": ", path, sizeof(path));
	if (!rc)
		rc = hp_tok_load(&t, path, &e);
	ok(rc == HP_EFORMAT && !t && strstr(e.msg, "not JSON"), "a truncated file is HP_EFORMAT (%s)", e.msg);
	expect_load_err("[1, 2]", HP_EFORMAT, "'inline.json': not a tokenizer", "a JSON array is HP_EFORMAT");
	expect_load_err("", HP_EFORMAT, "'inline.json': not JSON", "an empty buffer is HP_EFORMAT");
	expect_load_err("{\"normalizer\": {\"type\": \"Lowercase\"}, \"model\": {\"type\": \"BPE\", "
			"\"vocab\": {}, \"merges\": []}}", HP_EUNSUP,
			"normalizer.type 'Lowercase' is not supported", "a Lowercase normalizer is HP_EUNSUP");
	expect_load_err("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}",
			HP_EFORMAT, "model.merges[0]: token 'b' is not in the vocabulary",
			"a merge of an unknown token is HP_EFORMAT");
	expect_load_err("{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {}, \"merges\": []}}",
			HP_EUNSUP, "model.dropout", "BPE dropout is HP_EUNSUP");

	t = load("data/stories260K/hf/tokenizer.json");
	if (!t) {
		ok(0, "stories260K loads for the error cases");
		return;
	}
	n = 1;   /* one id already there: a failed encode must keep it */
	cap = 4;
	ids = hp_malloc(cap * sizeof(*ids));
	ids[0] = 42;
	hp_err_clear(&e);
	rc = hp_tok_encode(t, "ok \xC3\x28 bad", 8, &ids, &n, &cap, &e);
	ok(rc == HP_EFORMAT && !strcmp(e.msg, "invalid UTF-8 at byte 3") && n == 1 && ids[0] == 42,
	   "invalid UTF-8 is HP_EFORMAT at its offset (%s)", e.msg);
	hp_err_clear(&e);
	rc = hp_tok_encode(t, "\xED\xA0\x80", 3, &ids, &n, &cap, &e);
	ok(rc == HP_EFORMAT && !strcmp(e.msg, "invalid UTF-8 at byte 0"), "a UTF-16 surrogate is refused");
	rc = hp_tok_encode(t, "ab\xF0\x9F\x98", 5, &ids, &n, &cap, &e);
	ok(rc == HP_EFORMAT && !strcmp(e.msg, "invalid UTF-8 at byte 2"), "a truncated character is refused");
	rc = hp_tok_encode(t, "", 0, &ids, &n, &cap, &e);
	ok(rc == 0 && n == 1, "empty text adds no id");

	hp_err_clear(&e);
	one = 512;
	rc = hp_tok_decode(t, &one, 1, &out, &ol, &e);
	ok(rc == HP_EFORMAT && !out && !strcmp(e.msg, "id 512 is not in the vocabulary"),
	   "decoding an id past the vocabulary is HP_EFORMAT (%s)", e.msg);
	one = -1;
	rc = hp_tok_decode(t, &one, 1, &out, &ol, &e);
	ok(rc == HP_EFORMAT && !out, "decoding a negative id is HP_EFORMAT");
	rc = hp_tok_decode(t, NULL, 0, &out, &ol, &e);
	ok(rc == 0 && out && ol == 0 && out[0] == '\0', "decoding nothing gives \"\"");
	hp_free(out);
	hp_free(ids);
	hp_tok_free(t);
}

/* Fail every allocation of a load in turn, then of an encode and a decode. */
static void test_alloc_failures(void)
{
	static const char text[] = "Once upon a time, \xe2\x80\x9cthere\xe2\x80\x9d was <s> a \xf0\x9f\x90\x88!";
	/* HF's ids and decode: the piece after <s> gets its own U+2581, so
	 * the space before "a" comes back doubled */
	static const int32_t want[] = { 403, 407, 261, 378, 432, 410, 465, 413, 260, 276, 466,
					286, 410, 1, 410, 261, 410, 243, 162, 147, 139, 443 };
	static const char back[] = "Once upon a time, \xe2\x80\x9cthere\xe2\x80\x9d was <s>  a \xf0\x9f\x90\x88!";
	char path[PATH_MAX];
	struct hp_tokenizer *t = NULL;
	struct hp_err e;
	int32_t *ids = NULL;
	size_t n = 0, cap = 0, ol;
	char *out = NULL;
	long k, clean = 1;
	int rc;

	path_of(path, sizeof(path), "data/stories260K/hf/tokenizer.json");
	for (k = 1; k < 100000; k++) {
		hp_err_clear(&e);
		hp_alloc_fail_at(k);
		rc = hp_tok_load(&t, path, &e);
		hp_alloc_fail_at(0);
		if (!rc)
			break;
		if (rc != HP_ENOMEM || t || !strstr(e.msg, "out of memory")) {
			tap_diag("  allocation %ld: rc %d, '%s'", k, rc, e.msg);
			clean = 0;
		}
	}
	ok(t && clean, "load: each of %ld allocations failing is a clean HP_ENOMEM", k - 1);
	if (!t)
		return;
	clean = 1;
	for (k = 1; k < 100000; k++) {
		hp_tok_free(t);   /* a fresh tokenizer: no scratch buffer is warm */
		t = NULL;
		if (hp_tok_load(&t, path, &e))
			break;
		n = 0;
		hp_err_clear(&e);
		hp_alloc_fail_at(k);
		rc = hp_tok_encode(t, text, sizeof(text) - 1, &ids, &n, &cap, &e);
		hp_alloc_fail_at(0);
		if (!rc)
			break;
		if (rc != HP_ENOMEM || n != 0 || !strstr(e.msg, "out of memory"))
			clean = 0;
	}
	ok(t && clean && n == sizeof(want) / sizeof(want[0]) && !memcmp(ids, want, sizeof(want)),
	   "encode: each of %ld allocations failing is a clean HP_ENOMEM", k - 1);
	clean = 1;
	for (k = 1; t && k < 100000; k++) {
		hp_err_clear(&e);
		hp_alloc_fail_at(k);
		rc = hp_tok_decode(t, ids, n, &out, &ol, &e);
		hp_alloc_fail_at(0);
		if (!rc)
			break;
		if (rc != HP_ENOMEM || out || !strstr(e.msg, "out of memory")) {
			tap_diag("  allocation %ld: rc %d, '%s'", k, rc, e.msg);
			clean = 0;
		}
	}
	if (out && strcmp(out, back))
		tap_diag("  decoded '%s'", out);
	ok(clean && out && !strcmp(out, back), "decode: each of %ld allocations failing is a clean HP_ENOMEM",
	   k - 1);
	hp_free(out);
	hp_free(ids);
	hp_tok_free(t);
}

int main(void)
{
	const char *s = getenv("HP_SRC_DIR");
	char tmpl[] = "/tmp/hp-test-tokenizer-XXXXXX";

	snprintf(src_dir, sizeof(src_dir), "%s", s && *s ? s : ".");
	if (!mkdtemp(tmpl)) {
		ok(0, "make a scratch directory");
		return tap_done();
	}
	snprintf(scratch, sizeof(scratch), "%s", tmpl);

	test_jsonl("qwen3", "data/tokenizers/qwen3/tokenizer.json",
		   "data/tokenizers/vectors/qwen3_hf_tokenizers_0.23.2.jsonl");
	test_jsonl("llama3", "data/tokenizers/llama3/tokenizer.json",
		   "data/tokenizers/vectors/llama3_hf_tokenizers_0.23.2.jsonl");
	test_jsonl("mistral", "data/tokenizers/mistral/tokenizer.json",
		   "data/tokenizers/vectors/mistral_hf_tokenizers_0.23.2.jsonl");
	test_jsonl("stories260K", "data/stories260K/hf/tokenizer.json",
		   "data/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl");
	test_llamacpp("qwen2 (Qwen3 tokenizer.json)", "data/tokenizers/qwen3/tokenizer.json",
		      "data/tokenizers/vectors/llamacpp/ggml-vocab-qwen2.gguf");
	test_llamacpp("llama-bpe (Llama-3 tokenizer.json)", "data/tokenizers/llama3/tokenizer.json",
		      "data/tokenizers/vectors/llamacpp/ggml-vocab-llama-bpe.gguf");
	test_metadata();
	test_inline();
	test_errors();
	test_alloc_failures();

	{
		char p[PATH_MAX];

		snprintf(p, sizeof(p), "%s/tokenizer.json", scratch);
		unlink(p);
		rmdir(scratch);
	}
	return tap_done();
}
