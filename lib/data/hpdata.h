/*
 * hpdata.h - offline tokenization behind hp-data: text or JSONL in, token
 * ids out, either as JSON lines (encode) or as a Megatron indexed dataset
 * (build), in parallel over the ranks of an MPI communicator.
 *
 * Input.  A file is JSONL (one JSON object per line, the text a string at
 * a configurable key; lines holding only whitespace are skipped) or plain
 * text (every line is a record, its final '\n' not included, a '\r' kept).
 * The format comes from the name (.jsonl and .json are JSONL, anything else
 * text; "-" is standard input, JSONL) unless the caller forces one.  Every
 * record is validated as UTF-8 and encoded with hp_tok_encode, no special
 * tokens added.
 *
 * Parallel build.  The inputs are one byte space, cut into P nominal ranges
 * of equal size; rank r > 0 moves its start past the first '\n' at or after
 * its nominal start (or to the end of that file), so every line belongs to
 * the one rank whose range holds its first byte.  Ranks > 0 stream their
 * ids into temporary part files beside the output prefix; rank 0 writes its
 * own records straight into the dataset, then appends the parts in rank
 * order.  The dataset is therefore the same bytes for any P, and packing
 * (done by rank 0 over that ordered stream) is too.  Part files need the
 * output directory to be visible to every rank (one node, or a shared file
 * system).  Memory is bounded by the longest record, not by the input.
 *
 * Errors are collective: after every phase the ranks agree, and when any
 * failed every rank returns the error of the lowest failing rank, which is
 * the first error in input order, so the message is the one P = 1 gives.
 * Nothing named PREFIX.bin or PREFIX.idx is created unless the whole run
 * succeeds, and temporaries are removed on every path.
 *
 * Conversations (chat_template set): every record is a JSON object holding
 * a conversation, rendered and encoded as chat.h says, with the marks of
 * its target tokens.  encode writes {"ids": [...], "labels": [...]} per
 * conversation, labels -100 where there is no loss (transformers' labels:
 * aligned with ids, shifted by the model).  build writes the ids as
 * PREFIX.bin/.idx, one sequence and document per conversation, and the
 * marks as the indexed dataset PREFIX.mask (uint8, 1 = target, the same
 * sequence lengths), which hp-train finds beside PREFIX; append_eod and
 * packing are refused (hp-train packs conversations whole).  A build
 * without chat_template removes a PREFIX.mask left by an earlier one, so a
 * mask never outlives its ids.
 *
 * Not here: shuffling, splitting into train/validation sets, sentence
 * splitting, Megatron's --split-sentences, or reading compressed input.
 * encode does not run in parallel (rank 0 does all of it).
 *
 * Ownership: options and their strings are borrowed for the call.  Nothing
 * is printed: output goes to the caller's FILE (encode) and progress to the
 * caller's callback; the caller prints the statistics.
 */
#ifndef HP_HPDATA_H
#define HP_HPDATA_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

#include "base/err.h"

enum hp_data_format {
	HP_DATA_AUTO = 0,    /* from the file name (see above) */
	HP_DATA_JSONL,
	HP_DATA_TEXT,
};

/*
 * Progress of rank 0: done of total input bytes.  total is 0 when unknown
 * (standard input).  Under P ranks done is estimated from rank 0's share,
 * which the others read at about the same speed.  final is 1 on the last
 * call of a run (made only on success).
 */
typedef void hp_data_progress_fn(void *arg, uint64_t done, uint64_t total, int final);

struct hp_data_opts {
	const char *tokenizer;       /* tokenizer.json or a folder holding one */
	const char *text_key;        /* JSONL key of the text; NULL: "text" */
	enum hp_data_format format;
	int ninputs;
	char *const *inputs;         /* paths; "-" is standard input */
	/* build only */
	const char *prefix;          /* PREFIX of PREFIX.bin / PREFIX.idx */
	int append_eod;              /* append hp_tok_eod_id to every record */
	int64_t pack_to_seq_len;     /* > 0: records of exactly this + 1 ids */
	/* conversations (chat.h): each JSONL record a conversation under
	 * text_key (NULL: "messages") rendered with this template ("auto",
	 * "chatml" or a .jinja file); NULL: text records */
	const char *chat_template;
	const char *role_key;        /* NULL: "role" */
	const char *content_key;     /* NULL: "content" */
	int all_tokens;              /* every token a target */
	/* optional, called on rank 0 only */
	hp_data_progress_fn *progress;
	void *progress_arg;
};

/* What a run did, valid on rank 0 after success. */
struct hp_data_stats {
	uint64_t records;            /* input records (skipped blank JSONL lines excluded) */
	uint64_t tokens;             /* ids written (build: tokens in the .bin) */
	uint64_t sequences;          /* build: sequences in the dataset */
	uint64_t dropped;            /* build with packing: ids of the final remainder */
	uint64_t bytes;              /* input bytes read */
	double seconds;              /* wall clock of the whole run */
	double load_seconds;         /* of which loading the tokenizer (all ranks) */
	int dtype_code;              /* build: Megatron dtype code of the .bin */
};

/*
 * Encode every record of the inputs, in order, writing one line
 * {"ids":[...]} per record to out (rank 0).  Other ranks only take part in
 * the collective decision.  Returns 0 or, on every rank, the same error:
 * HP_EIO (a missing input or tokenizer, a read or write failure),
 * HP_ECONFIG (a tokenizer.json that does not load: malformed or
 * unsupported), HP_EFORMAT (a malformed record: "'FILE' line N: ..."),
 * HP_EUNSUP (the tokenizer's regex engine gave up on a record), HP_ENOMEM.
 * On failure out may hold the records before the bad one.
 */
int hp_data_encode_run(const struct hp_data_opts *o, MPI_Comm comm, FILE *out,
		       struct hp_data_stats *st, struct hp_err *e);

/*
 * Build the indexed dataset o->prefix from the inputs: each record one
 * sequence and one document, or with pack_to_seq_len N the concatenation
 * of all records cut into sequences of N + 1 ids (each its own document,
 * the remainder dropped).  Collective over comm.  Returns 0 or, on every
 * rank, the same error: those of encode, plus HP_ECONFIG for append_eod
 * with a tokenizer that has no end-of-document token, HP_EIO for an output
 * that cannot be written, and HP_EINVAL for "-" with more than one rank
 * (standard input cannot be split).
 */
int hp_data_build_run(const struct hp_data_opts *o, MPI_Comm comm, struct hp_data_stats *st,
		      struct hp_err *e);

#endif
