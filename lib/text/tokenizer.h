/*
 * tokenizer.h - load a HuggingFace tokenizer.json and encode/decode text
 * exactly as HF tokenizers 0.23 does with add_special_tokens=false.
 *
 * What is implemented is what byte-level BPE (GPT-2, Llama-3, Qwen2/3) and
 * SentencePiece-style BPE (Llama-2, Mistral, stories260K) files use:
 *  - added tokens, matched first on the raw text, leftmost-longest, with
 *    their single_word/lstrip/rstrip/normalized flags; their ids are
 *    assigned the way HF assigns them (the model's id when the content is
 *    in the vocabulary, else the next free id), whatever the file says;
 *  - normalizers NFC, NFD, NFKC, NFKD (utf8proc), Prepend, Replace and a
 *    Sequence of them;
 *  - pre-tokenizers Split (String or Regex pattern, every behavior,
 *    invert), ByteLevel (add_prefix_space, use_regex; trim_offsets only
 *    affects offsets), Metaspace, and a Sequence of them in which
 *    ByteLevel, if present, comes last;
 *  - model BPE: merges as "a b" strings or ["a", "b"] pairs, ignore_merges,
 *    byte_fallback, unk_token, fuse_unk, continuing_subword_prefix,
 *    end_of_word_suffix; dropout must be null or 0;
 *  - decoders ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace and a
 *    Sequence of them.
 * Anything else in a tokenizer.json (another model type, a Lowercase or
 * Bert normalizer, a Whitespace pre-tokenizer, a WordPiece decoder) is
 * refused at load with HP_EUNSUP naming the field and what is supported, so
 * a file that loads tokenizes as HF does (up to the Unicode versions
 * below) rather than approximately.  The
 * post_processor, truncation and padding are ignored: hp encodes without
 * special tokens and frames documents itself (hp_tok_eod_id).
 *
 * Regexes go through PCRE2 (with its JIT), Unicode normalization through
 * utf8proc.  HF uses Oniguruma; the patterns in these files mean the same
 * in both once \s is read as Unicode White_Space (PCRE2's \s with UCP also
 * takes U+180E, so the loader rewrites \s and \S to \p{White_Space}).
 * Character data follows the libraries' Unicode versions, and so can differ
 * from HF's for recently assigned characters only: HF's NFC tables are
 * Unicode 9.0 (a combining mark assigned later, e.g. U+0C3C, is not
 * reordered by HF but is by utf8proc), and Oniguruma knows letters newer
 * than Debian 12's PCRE2 (Unicode 14; e.g. U+134CC is \p{L} for HF only).
 * On 100,000 random texts built from characters of Unicode <= 9.0, all four
 * tokenizers tested give HF's ids.
 *
 * Invariants: a loaded tokenizer is immutable except for the scratch
 * buffers and word cache that hp_tok_encode uses, so one tokenizer may be
 * used by one thread at a time (distinct tokenizers by any threads); there
 * is no global state.  hp_tok_decode does not touch the scratch state.
 *
 * Ownership: hp_tok_load returns a new tokenizer that the caller releases
 * with hp_tok_free (which accepts NULL).  Strings passed in are borrowed
 * for the call only.  Output arrays and strings are the caller's, allocated
 * with hp_malloc/hp_realloc (release with hp_free).
 *
 * Errors: HP_EIO (missing or unreadable file), HP_EFORMAT (not JSON, a
 * field of the wrong type, a merge naming an unknown token, invalid UTF-8
 * text, an id that is not in the vocabulary), HP_EUNSUP (a component hp
 * does not implement), HP_ENOMEM.  Load messages name the file in quotes;
 * every message is one line (control characters quoted from the file are
 * written as \xNN).
 */
#ifndef HP_TOKENIZER_H
#define HP_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* Ids at or above this are refused at load: no real vocabulary comes near,
 * and it bounds the id -> token table a hostile file can make hp allocate. */
#define HP_TOK_MAX_ID (1 << 24)

struct hp_tokenizer;   /* opaque */

/*
 * Load path, a tokenizer.json or a folder holding one.  tokenizer_config.json
 * beside it, when present and readable, is consulted for the end-of-document
 * token only (a malformed one is ignored: it is optional metadata).  Returns
 * 0 and sets *t, or a negative HP_E* code with *t set to NULL.
 */
int hp_tok_load(struct hp_tokenizer **t, const char *path, struct hp_err *e);

/*
 * Load a tokenizer.json held in memory: json is len bytes (no NUL needed),
 * name stands for the file in messages.  No tokenizer_config.json is
 * consulted, so hp_tok_eod_id falls back to the common names.  Used by the
 * fuzzer and tests; same results and errors as hp_tok_load otherwise.
 */
int hp_tok_load_buf(struct hp_tokenizer **t, const char *name, const char *json, size_t len,
		    struct hp_err *e);

/* Release everything; accepts NULL. */
void hp_tok_free(struct hp_tokenizer *t);

/*
 * Encode len bytes of UTF-8 text (no terminating NUL needed; NUL bytes are
 * ordinary characters) without adding special tokens, appending the ids to
 * *ids, which holds *n ids in room for *cap; *ids is grown with hp_realloc
 * as needed (it may start NULL with *n == *cap == 0).  Text that is not
 * valid UTF-8 is refused with HP_EFORMAT "invalid UTF-8 at byte N" before
 * anything is appended: HF's Rust API takes &str, so its callers validate.
 * On any failure *n is restored to its value on entry (*ids and *cap may
 * have grown).  Errors: HP_EFORMAT (invalid UTF-8, the unk_token is needed
 * but not in the vocabulary), HP_EUNSUP (PCRE2 gave up on a pattern: match
 * or JIT stack limit), HP_ENOMEM, HP_EINVAL (NULL argument).
 */
int hp_tok_encode(struct hp_tokenizer *t, const char *text, size_t len,
		  int32_t **ids, size_t *n, size_t *cap, struct hp_err *e);

/*
 * hp_tok_encode, and a mark for every token: marks[i] is the OR of the
 * marks of the text's bytes that token i stands for (mark[0..len), one per
 * byte), so a token that straddles a change of mark takes both.  Used for
 * loss masks: the bytes of a rendered conversation that the model must
 * learn to produce are marked, and the tokens overlapping them are its
 * targets, as transformers' return_assistant_tokens_mask maps character
 * spans to tokens.  An added token stands for its match (with what lstrip
 * and rstrip absorb); inside a piece between added tokens the tokens are
 * placed by their lengths in the normalized text and a change of mark by
 * normalizing the piece up to it, which is exact unless the change falls
 * inside a combining sequence that NFC recomposes or next to an unk token
 * (see tokenizer.c).  *marks is grown with *ids: it must have room for
 * *cap entries on entry (NULL when *cap is 0) and has on return.  Same
 * errors as hp_tok_encode.
 */
int hp_tok_encode_marked(struct hp_tokenizer *t, const char *text, size_t len, const uint8_t *mark,
			 int32_t **ids, uint8_t **marks, size_t *n, size_t *cap, struct hp_err *e);

/*
 * The first special added token (tokenizer.json's "special": true) whose
 * match in text[0..len) starts at or after byte from, matched on the raw
 * text leftmost-longest as encoding matches them: 1 with its bytes [*start,
 * *end) and *id, or 0 when there is none.
 */
int hp_tok_find_special(const struct hp_tokenizer *t, const char *text, size_t len, size_t from,
			size_t *start, size_t *end, int32_t *id);

/*
 * Decode n ids into *out (hp_malloc'd, NUL-terminated, *out_len bytes not
 * counting the NUL) exactly as HF's decode(ids, skip_special_tokens=false):
 * each id's token (an added token's content, else the model's), then the
 * decoder chain.  An id that is negative, at least hp_tok_vocab_size(), or
 * a hole in the id space is HP_EFORMAT "id N is not in the vocabulary"
 * (HF silently drops such ids).  The output is valid UTF-8: byte sequences
 * that are not are replaced as HF does (U+FFFD).
 */
int hp_tok_decode(const struct hp_tokenizer *t, const int32_t *ids, size_t n,
		  char **out, size_t *out_len, struct hp_err *e);

/* Max id + 1 over the vocabulary and the added tokens. */
int64_t hp_tok_vocab_size(const struct hp_tokenizer *t);

/* The id of token (an added token's content first, then the model's
 * vocabulary, as HF's token_to_id), or -1 if absent. */
int32_t hp_tok_token_id(const struct hp_tokenizer *t, const char *token);

/*
 * The id of the end-of-document token: tokenizer_config.json's eos_token
 * (a string or an object with "content") when that file is beside the
 * tokenizer.json and names a known token, else the first known of
 * <|endoftext|>, </s>, <|end_of_text|>; -1 if none.  Note that chat models
 * name their end-of-turn token here (Qwen3: <|im_end|>).
 */
int32_t hp_tok_eod_id(const struct hp_tokenizer *t);

#endif
