/*
 * fuzz-tokenizer.c - libFuzzer target for hp_tok_encode/hp_tok_decode and
 * the tokenizer.json loader.
 *
 * An input that starts with '{' is a tokenizer.json: it goes through
 * hp_tok_load_buf and, when it loads, encodes and decodes a fixed text.
 * Any other input is text, encoded (then decoded) by two tokenizers loaded
 * once: stories260K's (SentencePiece-style BPE with byte fallback; from
 * $HP_SRC_DIR/data/stories260K/hf/, else that path relative to the current
 * directory) and a small byte-level BPE built here with Qwen's Split regex
 * and added tokens, whose decode must give the input back byte for byte.
 *
 * Findings are crashes, sanitizer reports, leaks and broken promises of
 * tokenizer.h: invalid UTF-8 refused with HP_EFORMAT and nothing appended,
 * valid text always encoded, every id inside the vocabulary, every decode
 * valid UTF-8, one-line error messages.  What this is not: a comparison
 * with HF (t/unit/test-tokenizer.c does that on fixed vectors).  Build with
 * `make fuzz`; the seed corpus is fuzz/corpus/tokenizer/.
 */
#include <stddef.h>
#include <stdint.h>

#include "base/alloc.h"
#include "text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reference UTF-8 check, written independently of the library's. */
static int valid_utf8(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		size_t k;

		if (s[i] < 0x80) {
			i++;
			continue;
		}
		k = s[i] >= 0xF0 ? 3 : s[i] >= 0xE0 ? 2 : s[i] >= 0xC0 ? 1 : 0;
		if (!k || s[i] > 0xF4 || i + k >= n)
			return 0;
		cp = s[i] & (0x3F >> k);
		for (size_t j = 1; j <= k; j++) {
			if ((s[i + j] & 0xC0) != 0x80)
				return 0;
			cp = cp << 6 | (s[i + j] & 0x3F);
		}
		if (cp < (k == 1 ? 0x80u : k == 2 ? 0x800u : 0x10000u) || cp > 0x10FFFF ||
		    (cp >= 0xD800 && cp <= 0xDFFF))
			return 0;
		i += k + 1;
	}
	return 1;
}

/* Encode then decode; returns the decoded text (hp_free) or NULL. */
static char *round_trip(struct hp_tokenizer *t, const char *text, size_t len, size_t *out_len)
{
	int32_t *ids = NULL;
	size_t n = 1, cap = 1;
	struct hp_err e;
	char *out = NULL;
	int valid = valid_utf8((const uint8_t *)text, len), rc;

	/* one id already there: a failed encode must leave it alone */
	ids = hp_malloc(sizeof(*ids));
	if (!ids)
		__builtin_trap();
	ids[0] = 7;
	hp_err_clear(&e);
	rc = hp_tok_encode(t, text, len, &ids, &n, &cap, &e);
	if (rc != (valid ? 0 : HP_EFORMAT) || strchr(e.msg, '\n'))
		__builtin_trap();
	if (rc) {
		if (n != 1 || ids[0] != 7 || strncmp(e.msg, "invalid UTF-8 at byte ", 22))
			__builtin_trap();
		hp_free(ids);
		return NULL;
	}
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= hp_tok_vocab_size(t))
			__builtin_trap();
	if (hp_tok_decode(t, ids + 1, n - 1, &out, out_len, &e) || out[*out_len] != '\0' ||
	    !valid_utf8((const uint8_t *)out, *out_len))
		__builtin_trap();
	hp_free(ids);
	return out;
}

/* HF's byte-level alphabet: printable Latin-1 as itself, the rest from U+0100. */
static size_t bytelevel_char(int b, char *out)
{
	static int map[256];
	uint32_t cp;

	if (!map['!']) {
		int n = 0;

		for (int i = 0; i < 256; i++) {
			int printable = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE;

			map[i] = printable ? i : 256 + n++;
		}
	}
	cp = (uint32_t)map[b];
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	out[0] = (char)(0xC0 | cp >> 6);
	out[1] = (char)(0x80 | (cp & 0x3F));
	return 2;
}

/* A byte-level BPE over all 256 bytes: every text round-trips exactly. */
static struct hp_tokenizer *bytelevel_tokenizer(void)
{
	static const char head[] =
		"{\"version\": \"1.0\", \"added_tokens\": ["
		"{\"id\": 300, \"content\": \"<|endoftext|>\", \"single_word\": false, \"lstrip\": false, "
		"\"rstrip\": false, \"normalized\": false, \"special\": true}, "
		"{\"id\": 301, \"content\": \"<x>\", \"single_word\": true, \"lstrip\": false, "
		"\"rstrip\": false, \"normalized\": false, \"special\": false}], "
		"\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
		"{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?i:'s|'t|'re|'ve|'m|'ll|'d)|"
		"[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
		"\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
		"{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, "
		"\"use_regex\": false}]}, \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
		"\"trim_offsets\": false, \"use_regex\": false}, \"model\": {\"type\": \"BPE\", "
		"\"ignore_merges\": true, \"vocab\": {";
	static const char tail[] =
		"\"\\u0120t\": 256, \"he\": 257, \"\\u0120the\": 258, \"in\": 259, \"\\u0120\\u0120\": 260}, "
		"\"merges\": [\"\\u0120 t\", \"h e\", \"\\u0120t he\", [\"i\", \"n\"], "
		"[\"\\u0120\", \"\\u0120\"]]}}";
	char json[sizeof(head) + sizeof(tail) + 256 * 24];
	size_t k = sizeof(head) - 1;
	struct hp_tokenizer *t = NULL;
	struct hp_err e;

	memcpy(json, head, k);
	for (int b = 0; b < 256; b++) {
		char c[2];
		size_t cl = bytelevel_char(b, c);

		json[k++] = '"';
		if (c[0] == '"' || c[0] == '\\')
			json[k++] = '\\';
		memcpy(json + k, c, cl);
		k += cl;
		k += (size_t)snprintf(json + k, sizeof(json) - k, "\": %d, ", b);
	}
	memcpy(json + k, tail, sizeof(tail));
	k += sizeof(tail) - 1;
	if (hp_tok_load_buf(&t, "bytelevel.json", json, k, &e)) {
		fprintf(stderr, "fuzz-tokenizer: built-in tokenizer: %s\n", e.msg);
		abort();
	}
	return t;
}

static struct hp_tokenizer *stories_tokenizer(void)
{
	const char *dir = getenv("HP_SRC_DIR");
	char path[4096];
	struct hp_tokenizer *t = NULL;
	struct hp_err e;

	snprintf(path, sizeof(path), "%s%sdata/stories260K/hf/tokenizer.json",
		 dir && *dir ? dir : "", dir && *dir ? "/" : "");
	if (hp_tok_load(&t, path, &e)) {
		fprintf(stderr, "fuzz-tokenizer: %s (set HP_SRC_DIR to the source tree)\n", e.msg);
		abort();
	}
	return t;
}

static void fuzz_json(const uint8_t *data, size_t size)
{
	static const char text[] = "Once upon a time <s> there was\n\t a  caf\xc3\xa9 \xe2\x96\x81 "
				   "<|endoftext|> 123 \xf0\x9f\x90\x88 don't";
	struct hp_tokenizer *t = NULL;
	struct hp_err e;
	size_t ol;
	char *out;

	hp_err_clear(&e);
	if (hp_tok_load_buf(&t, "fuzz", (const char *)data, size, &e)) {
		if (t || strncmp(e.msg, "'fuzz'", 6) || strchr(e.msg, '\n'))
			__builtin_trap();   /* a message must name the input, on one line */
		return;
	}
	if (hp_tok_vocab_size(t) < 0 || hp_tok_eod_id(t) >= hp_tok_vocab_size(t))
		__builtin_trap();
	/* a loaded tokenizer may still fail on text: a regex over PCRE2's
	 * limits, an unk_token missing from the vocabulary */
	hp_err_clear(&e);
	{
		int32_t *ids = NULL;
		size_t n = 0, cap = 0;
		int rc = hp_tok_encode(t, text, sizeof(text) - 1, &ids, &n, &cap, &e);

		if (rc && (rc != HP_EFORMAT && rc != HP_EUNSUP))
			__builtin_trap();
		for (size_t i = 0; !rc && i < n; i++)
			if (ids[i] < 0 || ids[i] >= hp_tok_vocab_size(t))
				__builtin_trap();
		if (!rc) {
			if (hp_tok_decode(t, ids, n, &out, &ol, &e) ||
			    !valid_utf8((const uint8_t *)out, ol))
				__builtin_trap();
			hp_free(out);
		}
		hp_free(ids);
	}
	hp_tok_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct hp_tokenizer *stories, *bytelevel;
	size_t ol;
	char *out;

	if (size && data[0] == '{') {
		fuzz_json(data, size);
		return 0;
	}
	if (!stories) {
		stories = stories_tokenizer();
		bytelevel = bytelevel_tokenizer();
	}
	out = round_trip(stories, (const char *)data, size, &ol);
	hp_free(out);
	out = round_trip(bytelevel, (const char *)data, size, &ol);
	if (out && (ol != size || memcmp(out, data, size)))
		__builtin_trap();   /* byte-level BPE loses nothing */
	hp_free(out);
	return 0;
}
