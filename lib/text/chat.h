/*
 * chat.h - conversations rendered with the model's chat template and
 * tokenized exactly as transformers' tokenizer.apply_chat_template(messages,
 * tokenize=True) gives them, with the loss mask of supervised fine-tuning.
 *
 * A conversation is a JSON object whose messages_key ("messages") is a list
 * of message objects, each with a role under role_key ("role") and a string
 * content under content_key ("content"); ShareGPT's {"from": "human" |
 * "gpt" | "system", "value": ...} is the same with role_key "from" and
 * content_key "value", its roles read as user and assistant.  The roles are
 * system, user, assistant and tool; any other is refused.  A message's other
 * keys (reasoning_content, tool_calls, name) reach the template as they are,
 * and so does the conversation's "tools" list.
 *
 * Rendering: the template is interpreted (jinja.h), as transformers does,
 * with messages, add_generation_prompt false, and the tokenizer's special
 * tokens (bos_token, eos_token, unk_token, pad_token, when
 * tokenizer_config.json names them); the text is then encoded with
 * add_special_tokens false.  Templates: "auto" is the model's own
 * (chat_template.jinja beside the tokenizer, else tokenizer_config.json's
 * chat_template, the "default" one of a named list); "chatml" is the plain
 * ChatML template; anything else containing '/' or ending in .jinja is a
 * template file.  No other name is known, and "auto" without a template is
 * refused: nothing is rendered approximately.
 *
 * The loss mask (marks, 1 = a target token).  With all_tokens every token.
 * A template with {% generation %} blocks marks what they emit, as
 * return_assistant_tokens_mask does.  Otherwise, for each assistant
 * message, the bytes from where its reply starts to the end of the special
 * token that closes its turn, where:
 *   - the reply starts where the rendering of the messages before it with
 *     add_generation_prompt true stops agreeing with the whole rendering
 *     (so the role header is not a target, and Qwen3's <think> block is),
 *     or at the message's own first byte if that comes earlier;
 *   - the turn is closed by the first special token (tokenizer.json's
 *     "special": true) after the message's last byte in the rendering
 *     (<|im_end|>, <|eot_id|>, </s>), if one comes before the next
 *     message's bytes; the text after it (a newline) is not a target.
 * The message's bytes are found by provenance: every string of message i
 * carries tag i + 1 through the template's operations (split, strip,
 * concatenation), so content the template trims or splits is still found.
 * Tokens are marked when they overlap a marked byte (hp_tok_encode_marked).
 *
 * Ownership: hp_chat_open borrows the tokenizer for the chat's lifetime and
 * copies the options' strings.  A chat is used by one thread at a time.
 */
#ifndef HP_CHAT_H
#define HP_CHAT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "text/tokenizer.h"

struct hp_chat;

struct hp_chat_opts {
	const char *template_spec;  /* "auto", "chatml", or a .jinja file; NULL: "auto" */
	const char *tokenizer_path; /* tokenizer.json or its folder: where "auto" looks */
	const char *messages_key;   /* NULL: "messages" */
	const char *role_key;       /* NULL: "role" */
	const char *content_key;    /* NULL: "content" */
	int all_tokens;             /* loss on every token, not the assistant's only */
};

/*
 * Load the template and compile it.  Errors: HP_EIO (a template file that
 * cannot be read), HP_ECONFIG (an unknown name; "auto" and no template;
 * a malformed tokenizer_config.json), HP_EFORMAT / HP_EUNSUP (the template
 * does not compile: jinja.h), HP_ENOMEM.
 */
int hp_chat_open(struct hp_chat **c, const struct hp_chat_opts *o, struct hp_tokenizer *tok,
		 struct hp_err *e);
void hp_chat_free(struct hp_chat *c);

/* 1 when spec names a template file (a slash in it, or a name ending in
 * .jinja) rather than a template by name; the YAML resolves such a path
 * beside itself. */
int hp_chat_spec_is_file(const char *spec);

/* What the template is, for logs: "chatml", the file, or "FOLDER/tokenizer_config.json". */
const char *hp_chat_source(const struct hp_chat *c);

/*
 * Check a conversation's shape without rendering: the messages list, each
 * message an object with a known role and a string content.  0 or
 * HP_EFORMAT naming the message ("message 3: unknown role 'bot' ...").
 * *assistants is set to the number of assistant messages.
 */
int hp_chat_check(const struct hp_chat *c, const json_t *conv, int *assistants, struct hp_err *e);

/*
 * Render conv (checked as above) and encode it, appending its ids to *ids
 * and their marks to *marks as hp_tok_encode_marked does (*marks has room
 * for *cap entries).  With gen_prompt the rendering ends with the
 * generation prompt (add_generation_prompt true) and nothing is marked.
 * If text is not NULL the rendered text is returned in *text (hp_malloc'd,
 * NUL-terminated, *text_len bytes).  Errors: HP_EFORMAT (a bad
 * conversation; the template failed: raise_exception's message, an
 * undefined value), HP_ENOMEM; *n is unchanged on failure.
 */
int hp_chat_encode(struct hp_chat *c, const json_t *conv, int gen_prompt, int32_t **ids,
		   uint8_t **marks, size_t *n, size_t *cap, char **text, size_t *text_len,
		   struct hp_err *e);

#endif
