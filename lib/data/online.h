/*
 * online.h - the online data mode: JSONL or text read and tokenized while
 * training, packed into rows with a block-diagonal causal mask.
 *
 * Documents: every non-empty line of the inputs (files, or directories whose
 * *.jsonl, *.json and *.txt files are taken in name order).  A JSONL line is
 * one object; its text is the values of text_keys, in order, joined by a
 * newline.  A text file's line is its own text.  Each document is tokenized
 * with the model's HF tokenizer (no special tokens) and the end-of-document
 * id is appended, so a document of n tokens gives n-1 (input, label) pairs.
 *
 * Packing, row by row (T pairs a row):
 *   - a document that fits in a row is never split: if it does not fit in
 *     what is left of the current row, the rest of the row is padding and
 *     the document starts the next row;
 *   - a document longer than a row fills what is left of the current row,
 *     then whole rows, then the start of another: each piece is its own
 *     segment (it cannot attend across rows);
 *   - padding positions have input = the EOD id, label = -100 and a
 *     segment of their own.
 * seg[i] is the index in its row where position i's segment starts, the
 * form hp_model_forward takes (equivalent to cu_seq_lens).
 *
 * Order: file order, or with shuffle a permutation of the documents per
 * epoch drawn from (seed, epoch) by a counter-based generator, so it is
 * the same on every run and every machine.  The cursor (epoch, document,
 * pair offset) restores the exact position.
 *
 * Splits: with opts.split, the usable documents in file order are cut as
 * the indexed dataset's (hp_split_bounds) and the source serves those of
 * opts.part only; a validation or test part may have none, and then open
 * gives *o = NULL and 0.
 *
 * Conversations (opts.chat): a line is one conversation, rendered with the
 * chat template and encoded with its marks (chat.h); no EOD is appended
 * (the template closes the conversation).  Labels are -100 where the
 * target token is not marked.  A conversation is never split: one longer
 * than a row (seq_length + 1 tokens) is cut to its first seq_length + 1
 * tokens, as transformers' truncation to max_length does, and counted;
 * one with no marked token left is not served (counted).  The indexed
 * source (opts.indexed) serves hp-data's conversations the same way.
 *
 * Bad lines are found when the source is opened, before training starts:
 * invalid JSON, a missing or non-string text key, invalid UTF-8.  They are
 * an HP_EFORMAT error naming the file and line, or, with skip_invalid,
 * counted and left out.
 *
 * Ownership: hp_online_open returns a new source; hp_online_free frees it.
 * The options' strings are copied.
 */
#ifndef HP_ONLINE_H
#define HP_ONLINE_H

#include <stdint.h>

#include "base/err.h"
#include "data/batch.h"

struct hp_chat_opts;

struct hp_online_opts {
	char *const *paths;         /* files or directories */
	int npaths;
	const char *tokenizer;      /* tokenizer.json or a folder holding one */
	char *const *text_keys;     /* JSONL keys; NULL/0 means {"text"} */
	int ntext_keys;
	long seq_length;            /* T: pairs per row */
	int shuffle;
	uint64_t seed;
	int skip_invalid;
	const struct hp_split *split;   /* NULL: every document */
	int part;                       /* HP_SPLIT_*, with split */
	/* conversations: each JSONL line rendered and marked by chat.h (its
	 * messages under chat->messages_key; text_keys unused); NULL: text */
	const struct hp_chat_opts *chat;
	/* instead of paths: the conversations of an indexed dataset made by
	 * hp-data build --chat-template, PREFIX with its PREFIX.mask; the
	 * tokenizer is then optional (the padding id is its EOD, else 0) */
	const char *indexed;
};

struct hp_online_stats {
	uint64_t documents;         /* usable documents (of the part) */
	uint64_t first_document;    /* the part's first, in file order */
	uint64_t all_documents;     /* usable documents of every part */
	uint64_t empty_lines;       /* blank lines, not documents */
	uint64_t invalid_lines;     /* skipped (skip_invalid) */
	uint64_t files;
	int64_t vocab_size;         /* -1 without a tokenizer (indexed) */
	int32_t eod_id;
	/* conversations */
	uint64_t no_target;         /* left out: no assistant message (scan) or
				     * no target token left in the row (served) */
	uint64_t truncated;         /* served cut to seq_length + 1 tokens */
};

struct hp_online;

int hp_online_open(struct hp_online **o, const struct hp_online_opts *opts, struct hp_err *e);
void hp_online_free(struct hp_online *o);

/* Fill B rows of T: inputs, labels (-100 on padding) and seg, each [B*T]. */
int hp_online_next(struct hp_online *o, int B, int32_t *inputs, int32_t *labels, int32_t *seg,
		   struct hp_err *e);

void hp_online_stats(const struct hp_online *o, struct hp_online_stats *s);

/*
 * Tokenizing once over many readers.  Every rank of a data-parallel run
 * packs the same stream (the one process's rows); left alone each would
 * tokenize every document of the global batch.  Instead the ranks split
 * the documents ahead between them, each tokenizing its share with
 * hp_online_encode, trade the tokens, and hand every rank all of them
 * with hp_online_give; hp_online_next then serves those as if it had
 * tokenized them (the same tokens: the same rows), and tokenizes itself
 * only what it was not given.
 *
 * ahead: how many of the next n documents to be loaded lie in the current
 * epoch (the window never crosses it).  cached: how many of them, from
 * the first, the source holds (given earlier, not yet served).  encode:
 * the tokens (and a conversation's marks) of the j-th of them, before
 * truncation, in the source's buffers until the next call; doc_bytes:
 * the size of its text (what tokenizing it costs, about).  give: the
 * tokens of documents j0..j0+n-1 of them (j0 = cached), doc j0+i's lens[i]
 * at toks[i] (marks[i]), kept with those held.  encoded: the tokens this
 * source has tokenized so far.  position: documents passed so far over
 * every epoch (epoch * documents + index).  marked: whether documents
 * come with marks (conversations), which give then takes.
 */
size_t hp_online_ahead(const struct hp_online *o, size_t n);
size_t hp_online_cached(const struct hp_online *o);
int hp_online_encode(struct hp_online *o, size_t j, const int32_t **toks, const uint8_t **marks, size_t *n,
		     struct hp_err *e);
int hp_online_give(struct hp_online *o, size_t j0, size_t n, const int32_t *const *toks,
		   const uint8_t *const *marks, const size_t *lens, struct hp_err *e);
uint64_t hp_online_doc_bytes(const struct hp_online *o, size_t j);
int hp_online_marked(const struct hp_online *o);
uint64_t hp_online_encoded(const struct hp_online *o);
uint64_t hp_online_position(const struct hp_online *o);

/* The position: epoch, index in the epoch's order, pairs already taken
 * from that document.  seek restores one taken earlier. */
void hp_online_cursor(const struct hp_online *o, uint64_t *epoch, uint64_t *doc, uint64_t *off);
int hp_online_seek(struct hp_online *o, uint64_t epoch, uint64_t doc, uint64_t off, struct hp_err *e);

#endif
