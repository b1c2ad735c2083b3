/*
 * test-chatbench.c - hp-test-tool chatbench: conversations rendered and
 * encoded per second (hp_chat_encode), the hp column of bench/chat-bench.sh
 * beside transformers' apply_chat_template (bench/chat_hf.py).
 *
 *     hp-test-tool chatbench TOKENIZER TEMPLATE CONVERSATIONS.jsonl [REPEAT]
 *
 * Every line is parsed once, outside the timing; then every conversation
 * is rendered and encoded, best of REPEAT (default 3) passes, one thread.
 * Conversations the template refuses count as errors and are timed too, as
 * chat_hf.py times them.  Prints one JSON line.
 */
#include <jansson.h>
#include <time.h>

#include "base/alloc.h"
#include "text/chat.h"
#include "text/tokenizer.h"

int cmd_chatbench(int argc, char **argv);

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int cmd_chatbench(int argc, char **argv)
{
	struct hp_tokenizer *t = NULL;
	struct hp_chat *c = NULL;
	struct hp_err e;
	FILE *f;
	char *line = NULL;
	size_t lcap = 0, n = 0, room = 0, tokens = 0, errors = 0;
	json_t **conv = NULL;
	int32_t *ids = NULL;
	uint8_t *marks = NULL;
	size_t nid = 0, cap = 0;
	double best = 1e30;
	int repeat = argc > 4 ? atoi(argv[4]) : 3;
	ssize_t len;

	if (argc < 4) {
		fprintf(stderr, "usage: hp-test-tool chatbench TOKENIZER TEMPLATE CONVERSATIONS.jsonl [REPEAT]\n");
		return 2;
	}
	hp_err_clear(&e);
	struct hp_chat_opts o = { .template_spec = argv[2], .tokenizer_path = argv[1] };
	if (hp_tok_load(&t, argv[1], &e) || hp_chat_open(&c, &o, t, &e)) {
		fprintf(stderr, "hp-test-tool: %s\n", e.msg);
		return 1;
	}
	if (!(f = fopen(argv[3], "r"))) {
		fprintf(stderr, "hp-test-tool: '%s': cannot open\n", argv[3]);
		return 1;
	}
	while ((len = getline(&line, &lcap, f)) > 0) {
		json_error_t je;

		if (n == room && !(conv = realloc(conv, (room = room ? 2 * room : 256) * sizeof(*conv))))
			return 1;
		if (!(conv[n] = json_loadb(line, (size_t)len, 0, &je))) {
			fprintf(stderr, "hp-test-tool: '%s' line %zu: %s\n", argv[3], n + 1, je.text);
			return 1;
		}
		n++;
	}
	free(line);
	fclose(f);
	for (int r = 0; r < repeat; r++) {
		double t0 = now();

		tokens = errors = 0;
		for (size_t i = 0; i < n; i++) {
			nid = 0;
			if (hp_chat_encode(c, conv[i], 0, &ids, &marks, &nid, &cap, NULL, NULL, &e))
				errors++;
			tokens += nid;
		}
		double dt = now() - t0;
		if (dt < best)
			best = dt;
	}
	printf("{\"impl\":\"hp\",\"conversations\":%zu,\"errors\":%zu,\"tokens\":%zu,\"conv_s\":%.1f,"
	       "\"tokens_s\":%.0f}\n", n, errors, tokens, n / best, tokens / best);
	for (size_t i = 0; i < n; i++)
		json_decref(conv[i]);
	free(conv);
	hp_free(ids);
	hp_free(marks);
	hp_chat_free(c);
	hp_tok_free(t);
	return 0;
}
