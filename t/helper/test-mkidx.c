/*
 * test-mkidx.c - hp-test-tool mkidx and dumpidx: make Megatron indexed
 * datasets from JSONL token ids, and print them back, for shell tests.
 *
 *   mkidx --vocab V [--records-of N] [--max-records K] -o PREFIX IN.jsonl
 *     Each line of IN is a JSON object with an "ids" array (other keys are
 *     ignored; blank lines are skipped).  Without --records-of, each line
 *     becomes one sequence and one document.  With --records-of N, all ids
 *     are concatenated in file order and cut into records of exactly N ids,
 *     each its own document, the remainder dropped: the is_dataset_from_mr
 *     layout (N = seq_length+1).  --max-records stops after K sequences.
 *   dumpidx PREFIX
 *     The header as "key value" lines, then one line per sequence with its
 *     ids separated by spaces (an empty sequence is an empty line).
 *
 * This is not a tokenizer or a preprocessing tool: the ids must already be
 * there, and the writer's dtype choice is Megatron's (indexed.h).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>

#include "base/err.h"
#include "format/indexed.h"

int cmd_mkidx(int argc, char **argv);
int cmd_dumpidx(int argc, char **argv);

#define MKIDX_USAGE "usage: hp-test-tool mkidx --vocab V [--records-of N] [--max-records K] -o PREFIX INPUT.jsonl\n"

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
	va_list ap;

	fputs("hp-test-tool: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

static int parse_count(const char *opt, const char *s, long long min, long long *out)
{
	char *end;

	errno = 0;
	*out = strtoll(s, &end, 10);
	if (errno || end == s || *end || *out < min) {
		fprintf(stderr, "hp-test-tool: %s '%s': expected an integer >= %lld\n", opt, s, min);
		fputs(MKIDX_USAGE, stderr);
		return -1;
	}
	return 0;
}

struct mkidx {
	const char *in;
	struct hp_indexed_writer *w;
	long long records_of, max_records, nwritten;
	int32_t *rec;          /* the record being filled (records_of ids) */
	long long nrec;
	int32_t *ids;          /* one line's ids */
	size_t cap_ids;
};

/* One sequence and document; lineno is where its last id came from. */
static int emit(struct mkidx *m, const int32_t *ids, size_t n, long lineno)
{
	struct hp_err e;

	hp_err_clear(&e);
	if (hp_indexed_writer_add(m->w, ids, n, &e) || hp_indexed_writer_end_document(m->w, &e))
		return fail("'%s':%ld: %s", m->in, lineno, e.msg);
	m->nwritten++;
	return 0;
}

/* One JSONL line: its ids into m->ids; returns the count or -1. */
static long line_ids(struct mkidx *m, const char *line, long lineno)
{
	json_error_t jerr;
	json_t *root = json_loads(line, JSON_DECODE_ANY, &jerr), *ids, *v;
	size_t i;
	long rc = -1;

	if (!root) {
		fail("'%s':%ld: %s", m->in, lineno, jerr.text);
		return -1;
	}
	ids = json_is_object(root) ? json_object_get(root, "ids") : NULL;
	if (!json_is_array(ids)) {
		fail("'%s':%ld: no \"ids\" array", m->in, lineno);
		goto out;
	}
	if (json_array_size(ids) > m->cap_ids) {
		int32_t *p = realloc(m->ids, json_array_size(ids) * sizeof(*p));

		if (!p) {
			fail("out of memory");
			goto out;
		}
		m->ids = p;
		m->cap_ids = json_array_size(ids);
	}
	json_array_foreach(ids, i, v) {
		json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;

		if (x < 0 || x > INT32_MAX) {
			fail("'%s':%ld: ids[%zu] is not a token id", m->in, lineno, i);
			goto out;
		}
		m->ids[i] = (int32_t)x;
	}
	rc = (long)json_array_size(ids);
out:
	json_decref(root);
	return rc;
}

static int mkidx_file(struct mkidx *m, FILE *f)
{
	char *line = NULL;
	size_t cap = 0;
	long lineno = 0, n;
	int rc = 0;

	while (!rc && (m->max_records < 0 || m->nwritten < m->max_records) &&
	       getline(&line, &cap, f) >= 0) {
		lineno++;
		if (!line[strspn(line, " \t\r\n")])
			continue;
		n = line_ids(m, line, lineno);
		if (n < 0) {
			rc = 1;
			break;
		}
		if (!m->records_of) {
			rc = emit(m, m->ids, (size_t)n, lineno);
			continue;
		}
		for (long i = 0; !rc && i < n; i++) {
			m->rec[m->nrec++] = m->ids[i];
			if (m->nrec == m->records_of) {
				rc = emit(m, m->rec, (size_t)m->nrec, lineno);
				m->nrec = 0;
				if (m->max_records >= 0 && m->nwritten == m->max_records)
					break;
			}
		}
	}
	if (!rc && ferror(f))
		rc = fail("'%s': read failed: %s", m->in, strerror(errno));
	free(line);
	return rc;
}

int cmd_mkidx(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "vocab", required_argument, NULL, 'v' },
		{ "records-of", required_argument, NULL, 'r' },
		{ "max-records", required_argument, NULL, 'm' },
		{ "output", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct mkidx m = { .max_records = -1 };
	const char *out = NULL;
	long long vocab = 0;
	struct hp_err e;
	FILE *f;
	int c, rc;

	optind = 1;
	while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
		switch (c) {
		case 'v':
			if (parse_count("--vocab", optarg, 1, &vocab))
				return HP_EXIT_USAGE;
			break;
		case 'r':
			if (parse_count("--records-of", optarg, 1, &m.records_of))
				return HP_EXIT_USAGE;
			break;
		case 'm':
			if (parse_count("--max-records", optarg, 0, &m.max_records))
				return HP_EXIT_USAGE;
			break;
		case 'o':
			out = optarg;
			break;
		case 'h':
			fputs(MKIDX_USAGE, stdout);
			return HP_EXIT_OK;
		default:
			fputs(MKIDX_USAGE, stderr);
			return HP_EXIT_USAGE;
		}
	}
	if (!vocab || !out || optind != argc - 1 || m.records_of > INT32_MAX) {
		fputs(MKIDX_USAGE, stderr);
		return HP_EXIT_USAGE;
	}
	m.in = argv[optind];
	f = fopen(m.in, "r");
	if (!f)
		return fail("'%s': cannot open: %s", m.in, strerror(errno));
	if (m.records_of && !(m.rec = malloc((size_t)m.records_of * sizeof(*m.rec)))) {
		fclose(f);
		return fail("out of memory");
	}
	hp_err_clear(&e);
	rc = hp_indexed_writer_open(&m.w, out, vocab, &e) ? fail("%s", e.msg) : 0;
	if (!rc)
		rc = mkidx_file(&m, f);
	fclose(f);
	if (rc)
		hp_indexed_writer_abort(m.w);
	else if (hp_indexed_writer_finish(m.w, &e))
		rc = fail("%s", e.msg);
	free(m.rec);
	free(m.ids);
	return rc;
}

int cmd_dumpidx(int argc, char **argv)
{
	struct hp_indexed d;
	struct hp_err e;
	int32_t *ids = NULL;
	size_t cap = 0;
	int rc = 0;

	if (argc != 2) {
		fputs("usage: hp-test-tool dumpidx PREFIX\n", stderr);
		return HP_EXIT_USAGE;
	}
	hp_err_clear(&e);
	if (hp_indexed_open(&d, argv[1], &e))
		return fail("%s", e.msg);
	printf("dtype %s (code %d)\n", hp_indexed_dtype_name(d.dtype_code), d.dtype_code);
	printf("sequences %llu\n", (unsigned long long)d.nseq);
	printf("documents %llu\n", (unsigned long long)(d.ndoc - 1));
	printf("tokens %llu\n", (unsigned long long)d.ntok);
	printf("doc_idx");
	for (uint64_t i = 0; i < d.ndoc; i++)
		printf(" %lld", (long long)hp_indexed_doc_idx(&d, i));
	printf("\n");
	for (uint64_t i = 0; !rc && i < d.nseq; i++) {
		size_t len = (size_t)hp_indexed_seq_len(&d, i);
		long n;

		if (len > cap) {
			int32_t *p = realloc(ids, len * sizeof(*p));

			if (!p) {
				rc = fail("out of memory");
				break;
			}
			ids = p;
			cap = len;
		}
		n = hp_indexed_read(&d, i, ids, cap, &e);
		if (n < 0) {
			rc = fail("%s", e.msg);
			break;
		}
		for (long k = 0; k < n; k++)
			printf(k ? " %d" : "%d", ids[k]);
		printf("\n");
	}
	free(ids);
	hp_indexed_close(&d);
	if (!rc && (fflush(stdout) || ferror(stdout)))
		rc = fail("write to stdout failed");
	return rc;
}
