/*
 * test-tokbench.c - hp-test-tool tokbench TOKENIZER FILE [REPEAT]
 *
 * Encoding throughput of lib/tokenizer on one thread, for bench/tok-bench.sh:
 * the file encoded as one text and line by line, best of REPEAT (default 3)
 * runs each, tokenizer loading excluded.  Prints one JSON line:
 *   {"impl":"hp","whole_mb_s":..,"lines_mb_s":..,"tokens":..,"bytes":..}
 */
#include <time.h>

#include "base/alloc.h"
#include "text/tokenizer.h"

int cmd_tokbench(int argc, char **argv);

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int cmd_tokbench(int argc, char **argv)
{
	struct hp_tokenizer *t;
	struct hp_err e;
	FILE *f;
	char *buf;
	long size;
	int32_t *ids = NULL;
	size_t n = 0, cap = 0, whole_tokens = 0;
	double best_whole = 1e30, best_lines = 1e30;
	int repeat = argc > 3 ? atoi(argv[3]) : 3;

	if (argc < 3) {
		fprintf(stderr, "usage: hp-test-tool tokbench TOKENIZER FILE [REPEAT]\n");
		return 2;
	}
	hp_err_clear(&e);
	if (hp_tok_load(&t, argv[1], &e)) {
		fprintf(stderr, "hp-test-tool: %s\n", e.msg);
		return 1;
	}
	if (!(f = fopen(argv[2], "rb")) || fseek(f, 0, SEEK_END) || (size = ftell(f)) < 0 ||
	    fseek(f, 0, SEEK_SET) || !(buf = hp_malloc((size_t)size + 1)) ||
	    fread(buf, 1, (size_t)size, f) != (size_t)size) {
		fprintf(stderr, "hp-test-tool: '%s': cannot read\n", argv[2]);
		return 1;
	}
	fclose(f);
	for (int r = 0; r < repeat; r++) {
		double t0 = now();
		n = 0;
		if (hp_tok_encode(t, buf, (size_t)size, &ids, &n, &cap, &e)) {
			fprintf(stderr, "hp-test-tool: %s\n", e.msg);
			return 1;
		}
		double dt = now() - t0;
		whole_tokens = n;
		if (dt < best_whole)
			best_whole = dt;
		t0 = now();
		for (long i = 0; i < size;) {
			const char *nl = memchr(buf + i, '\n', (size_t)(size - i));
			long len = nl ? nl - (buf + i) : size - i;
			n = 0;
			if (hp_tok_encode(t, buf + i, (size_t)len, &ids, &n, &cap, &e)) {
				fprintf(stderr, "hp-test-tool: %s\n", e.msg);
				return 1;
			}
			i += len + 1;
		}
		dt = now() - t0;
		if (dt < best_lines)
			best_lines = dt;
	}
	printf("{\"impl\":\"hp\",\"whole_mb_s\":%.2f,\"lines_mb_s\":%.2f,\"tokens\":%zu,\"bytes\":%ld}\n",
	       size / best_whole / 1e6, size / best_lines / 1e6, whole_tokens, size);
	hp_free(ids);
	hp_free(buf);
	hp_tok_free(t);
	return 0;
}
