/*
 * tokint.h - internals of the tokenizer shared by tokenizer.c (loading, the
 * text pipeline, decoding) and tokbpe.c (the BPE model, its hash tables and
 * word cache).  Not a public header: only those two files include it, and
 * nothing here is stable.
 */
#ifndef HP_TOKINT_H
#define HP_TOKINT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/err.h"

/*
 * A set of (string, id) pairs with a hash index: the vocabulary, its raw
 * byte form, the added tokens.  Strings live in one pool; the index is
 * open addressing with the key's place and length in each slot, so a hit
 * costs one slot read and one memcmp.  Adding a string that is already
 * there replaces its id (JSON's and HF's "the later one wins").
 */
struct tok_slot {
	uint32_t off, len;   /* the key in pool */
	int32_t id;          /* -1: empty slot */
	uint32_t tag;        /* high bits of the hash, to skip most memcmps */
};

struct tok_dict {
	char *pool;
	size_t pool_len, pool_cap;
	struct tok_slot *slots;
	size_t mask;         /* slots - 1; slots is a power of two */
	size_t n;            /* distinct keys */
};

uint64_t tok_hash(const void *p, size_t n);
/* Set key -> id (replacing an earlier id for the same key).  0 or HP_ENOMEM. */
int tok_dict_put(struct tok_dict *d, const void *key, size_t len, int32_t id);
/* The id of key, or -1; h is tok_hash(key, len). */
int32_t tok_dict_get_h(const struct tok_dict *d, const void *key, size_t len, uint64_t h);
int32_t tok_dict_get(const struct tok_dict *d, const void *key, size_t len);
void tok_dict_release(struct tok_dict *d);

/* Where hp_tok_encode appends ids: the caller's vector. */
struct tok_out {
	int32_t **ids;
	size_t *n, *cap;
};

int tok_out_push(struct tok_out *o, int32_t id);

/*
 * The BPE model.  In byte mode (a ByteLevel pre-tokenizer maps every byte
 * of a word to one character before the model sees it) the model works on
 * the raw bytes instead: every vocabulary string is mapped back to bytes at
 * load, so words skip the mapping and one byte is one initial symbol.
 * Tokens holding a character outside the byte alphabet can never match a
 * byte-level word, so they are left out of that index (they still decode).
 */
struct tok_merge {
	uint64_t key;        /* (uint64)left << 32 | right; TOK_MERGE_EMPTY when free */
	uint32_t rank;       /* index in the merges list: lower merges first */
	int32_t id;          /* the merged token */
};
#define TOK_MERGE_EMPTY UINT64_MAX

/* The word cache: direct-mapped, fixed-size slots of one cache line. */
#define TOK_CACHE_SLOTS (1u << 15)
#define TOK_CACHE_WORD 22
#define TOK_CACHE_IDS 8
struct tok_cache_slot {
	uint64_t h;
	uint8_t wlen, nids;  /* wlen 0: empty */
	uint8_t word[TOK_CACHE_WORD];
	int32_t ids[TOK_CACHE_IDS];
};

struct tok_bpe {
	struct tok_dict vocab;     /* the file's strings -> id (HF's vocab) */
	struct tok_dict raw;       /* byte mode: the same tokens as raw bytes */
	int byte_mode;
	int ignore_merges, byte_fallback, fuse_unk;
	int cut_meta;              /* words may be cut before U+2581, see tokbpe.c */
	char *unk;                 /* unk_token or NULL */
	size_t unk_len;
	int32_t unk_id;            /* -1 when unk is NULL or not in the vocabulary */
	/* continuing_subword_prefix / end_of_word_suffix; an empty one is the
	 * same as none.  *_m is the form words are looked up in (raw bytes in
	 * byte mode), the plain one the file's (for byte fallback). */
	char *prefix, *suffix, *prefix_m, *suffix_m;
	size_t prefix_len, suffix_len, prefix_m_len, suffix_m_len;
	struct tok_merge *merges;
	size_t merge_mask;
	int merge_shift;
	int32_t single[256];       /* byte mode: id of each byte alone, -1 */
	int32_t *bmp;              /* char mode: id of each BMP character alone, -1 */
	int32_t fallback[256];     /* id of "<0xXX>", -1 */
	uint8_t bl[256][2];        /* byte-level character of each byte, UTF-8 */
	uint8_t bl_len[256];
	/* encode scratch */
	int32_t *sym, *nid, *prev, *next;
	uint32_t *rank;
	size_t sym_cap;
	struct tok_heap_item *heap;
	size_t heap_cap;
	char *sbuf;
	size_t sbuf_cap;
	struct tok_cache_slot *cache;
};

/* The byte-level alphabet as HF's bytes_char(): printable Latin-1 bytes map
 * to themselves, the other 68 to U+0100.. in byte order.  char_byte[cp] is
 * the byte of code point cp < 324, or -1. */
void tok_bytelevel_tables(uint32_t byte_char[256], int16_t char_byte[324]);

/* Load model (a JSON object whose type is BPE) into b.  file names the
 * tokenizer.json in messages.  byte_mode as above. */
int tok_bpe_load(struct tok_bpe *b, json_t *model, int byte_mode, const char *file,
		 struct hp_err *e);
void tok_bpe_release(struct tok_bpe *b);
/* Encode one pre-token of n > 0 bytes (raw bytes in byte mode). */
int tok_bpe_word(struct tok_bpe *b, const uint8_t *w, size_t n, struct tok_out *o,
		 struct hp_err *e);
/* The vocabulary id of a string in the file's alphabet, or -1. */
int32_t tok_bpe_token_id(const struct tok_bpe *b, const char *s, size_t len);

/* Length of the UTF-8 sequence led by byte c (1 for a stray byte). */
static inline size_t tok_u8len(uint8_t c)
{
	return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* Decode one code point of valid UTF-8 at s. */
static inline uint32_t tok_u8dec(const uint8_t *s, size_t *len)
{
	uint8_t c = s[0];

	if (c < 0x80) {
		*len = 1;
		return c;
	}
	if (c < 0xE0) {
		*len = 2;
		return (uint32_t)(c & 0x1F) << 6 | (s[1] & 0x3F);
	}
	if (c < 0xF0) {
		*len = 3;
		return (uint32_t)(c & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
	}
	*len = 4;
	return (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 |
	       (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
}


#endif
