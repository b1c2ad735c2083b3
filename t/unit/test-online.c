/*
 * test-online.c - the online data mode: packing rules, order, cursor,
 * and bad lines, with the real stories260K tokenizer.
 *
 * The packing is checked against the documents' own token streams (each
 * tokenized here with hp_tok_encode and the EOD appended): walking the rows'
 * segments in order must reproduce every document's (input, label) pairs
 * exactly once per epoch, split only where a document is longer than what
 * the row has left, with padding (label -100) nowhere else.
 */
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "data/online.h"
#include "tap.h"
#include "text/tokenizer.h"

static char dir[256];
static const char *model_dir;

static void write_file(const char *name, const char *text)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	fputs(text, f);
	fclose(f);
}

static char *path_of(const char *name)
{
	static char buf[4][512];
	static int k;
	k = (k + 1) % 4;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
	return buf[k];
}

static const char *texts[] = {
	"Once upon a time, there was a little girl named Lily.",
	"The cat sat on the mat.",
	/* longer than a row of 24 pairs */
	"One day, a big red ball rolled into the park. Lily ran after it and laughed. "
	"Her mom said, \"Be careful!\" Lily smiled and kicked the ball back to her friend Tom.",
	"A dog.",
	"Tom and Sue like to play in the sand. They make a big castle with a flag.",
};
#define NTEXTS 5

static int open_src(struct hp_online **o, const char *file, long T, int shuffle, uint64_t seed,
		    int skip, struct hp_err *e)
{
	char *paths[1] = { path_of(file) };
	struct hp_online_opts oo = { .paths = paths, .npaths = 1, .tokenizer = model_dir, .seq_length = T,
				     .shuffle = shuffle, .seed = seed, .skip_invalid = skip };
	return hp_online_open(o, &oo, e);
}

/* The documents' token streams, EOD appended. */
static int32_t *streams[NTEXTS];
static size_t lens[NTEXTS];

static void tokenize_all(int32_t eod)
{
	struct hp_tokenizer *t;
	struct hp_err e;

	hp_tok_load(&t, model_dir, &e);
	for (int i = 0; i < NTEXTS; i++) {
		size_t cap = 0;
		lens[i] = 0;
		hp_tok_encode(t, texts[i], strlen(texts[i]), &streams[i], &lens[i], &cap, &e);
		streams[i] = hp_realloc(streams[i], (lens[i] + 1) * sizeof(int32_t));
		streams[i][lens[i]++] = eod;
	}
	hp_tok_free(t);
}

/*
 * Walk `rows` rows of T and check them against the documents in `order`
 * (indices into texts, repeated cyclically).  Returns 1 when every rule
 * holds.
 */
static int check_rows(const int32_t *in, const int32_t *lb, const int32_t *sg, int rows, long T,
		      const int *order, int norder, int32_t eod, int stop_after)
{
	int d = 0;          /* position in order */
	size_t off = 0;     /* pairs of the current document consumed */

	for (int r = 0; r < rows; r++) {
		const int32_t *I = in + r * T, *L = lb + r * T, *S = sg + r * T;
		long pos = 0;
		while (pos < T) {
			if (S[pos] != pos) {
				tap_diag("row %d pos %ld: segment starts at %d", r, pos, S[pos]);
				return 0;
			}
			long end = pos + 1;
			while (end < T && S[end] == pos)
				end++;
			if (L[pos] == -100) {          /* padding: one position each, rest of the row */
				for (long i = pos; i < T; i++)
					if (L[i] != -100 || I[i] != eod || S[i] != i) {
						tap_diag("row %d: padding at %ld then data at %ld", r, pos, i);
						return 0;
					}
				/* only when the next document fits a row but not this rest */
				int doc = order[d % norder];
				long pairs = (long)lens[doc] - 1;
				if (!(off == 0 && pairs <= T && pairs > T - pos)) {
					tap_diag("row %d: needless padding at %ld", r, pos);
					return 0;
				}
				break;
			}
			int doc = order[d % norder];
			for (long i = pos; i < end; i++, off++) {
				if (off + 1 >= lens[doc] || I[i] != streams[doc][off] || L[i] != streams[doc][off + 1]) {
					tap_diag("row %d pos %ld: doc %d pair %zu differs", r, i, doc, off);
					return 0;
				}
			}
			if (off == lens[doc] - 1) {
				d++;
				off = 0;
				if (stop_after && d == stop_after)
					return 1;
			} else if (end != T) {
				tap_diag("row %d: doc %d split at %ld, not at the row's end", r, doc, end);
				return 0;
			}
			pos = end;
		}
	}
	return d >= norder;
}

static void test_packing(void)
{
	struct hp_online *o;
	struct hp_online_stats st;
	struct hp_err e;
	long T = 24;
	int rows = 12;
	int32_t *in = malloc(rows * T * 4), *lb = malloc(rows * T * 4), *sg = malloc(rows * T * 4);
	char buf[4096];
	size_t n = 0;

	for (int i = 0; i < NTEXTS; i++) {
		n += (size_t)snprintf(buf + n, sizeof(buf) - n, "{\"text\": \"");
		for (const char *p = texts[i]; *p; p++) {
			if (*p == '"')
				buf[n++] = '\\';
			buf[n++] = *p;
		}
		n += (size_t)snprintf(buf + n, sizeof(buf) - n, "\", \"id\": %d}\n%s", i, i == 1 ? "\n  \n" : "");
	}
	buf[n] = '\0';
	write_file("docs.jsonl", buf);
	if (!ok(open_src(&o, "docs.jsonl", T, 0, 0, 0, &e) == 0, "opens a JSONL file %s", e.msg))
		return;
	hp_online_stats(o, &st);
	ok(st.documents == NTEXTS && st.empty_lines == 2 && st.invalid_lines == 0,
	   "5 documents, 2 blank lines counted (%llu, %llu)", (unsigned long long)st.documents,
	   (unsigned long long)st.empty_lines);
	tokenize_all(st.eod_id);
	ok(lens[2] - 1 > (size_t)T, "the third document (%zu pairs) is longer than a row of %ld", lens[2] - 1, T);
	int order[NTEXTS] = { 0, 1, 2, 3, 4 };
	hp_online_next(o, rows, in, lb, sg, &e);
	ok(check_rows(in, lb, sg, rows, T, order, NTEXTS, st.eod_id, 0),
	   "rows reproduce every document's pairs in file order; only long ones split; padding only where needed");

	/* cursor: remember, read, seek back, read again */
	uint64_t ep, k, off;
	int32_t *in2 = malloc(rows * T * 4), *lb2 = malloc(rows * T * 4), *sg2 = malloc(rows * T * 4);
	hp_online_cursor(o, &ep, &k, &off);
	hp_online_next(o, 5, in, lb, sg, &e);
	ok(hp_online_seek(o, ep, k, off, &e) == 0, "seek to a saved cursor");
	hp_online_next(o, 5, in2, lb2, sg2, &e);
	ok(!memcmp(in, in2, 5 * T * 4) && !memcmp(lb, lb2, 5 * T * 4) && !memcmp(sg, sg2, 5 * T * 4),
	   "reading after the seek repeats the same rows (epoch %llu, doc %llu, offset %llu)",
	   (unsigned long long)ep, (unsigned long long)k, (unsigned long long)off);
	hp_online_free(o);

	/* shuffle: a permutation per epoch, fixed by the seed */
	struct hp_online *a, *b, *c;
	int32_t *ia = malloc(40 * T * 4), *ib = malloc(40 * T * 4), *ic = malloc(40 * T * 4);
	int32_t *lx = malloc(40 * T * 4), *sx = malloc(40 * T * 4);
	open_src(&a, "docs.jsonl", T, 1, 7, 0, &e);
	open_src(&b, "docs.jsonl", T, 1, 7, 0, &e);
	open_src(&c, "docs.jsonl", T, 1, 8, 0, &e);
	hp_online_next(a, 40, ia, lx, sx, &e);
	hp_online_next(b, 40, ib, lx, sx, &e);
	hp_online_next(c, 40, ic, lx, sx, &e);
	ok(!memcmp(ia, ib, 40 * T * 4), "the same seed gives the same shuffled rows");
	ok(memcmp(ia, ic, 40 * T * 4) != 0, "another seed gives other rows");
	/* the first epoch of a: recover its order from the first token of each document */
	int seen = 0, perm[NTEXTS], np = 0;
	hp_online_free(a);
	open_src(&a, "docs.jsonl", T, 1, 7, 0, &e);
	hp_online_next(a, rows, ia, lb, sg, &e);
	for (long i = 0; i < rows * T && np < NTEXTS; i++)
		if (sg[i] == i % T && lb[i] != -100)
			for (int dd = 0; dd < NTEXTS; dd++)
				if (ia[i] == streams[dd][0] && lb[i] == streams[dd][1] && !(seen & (1 << dd))) {
					seen |= 1 << dd;
					perm[np++] = dd;
					break;
				}
	ok(np == NTEXTS && check_rows(ia, lb, sg, rows, T, perm, NTEXTS, st.eod_id, NTEXTS),
	   "a shuffled epoch holds every document once, packed by the same rules (order %d %d %d %d %d)",
	   perm[0], perm[1], perm[2], perm[3], perm[4]);
	hp_online_free(a);
	hp_online_free(b);
	hp_online_free(c);
	free(in); free(lb); free(sg); free(in2); free(lb2); free(sg2); free(ia); free(ib); free(ic); free(lx); free(sx);
}

/*
 * Handed-over tokens (what hp-train's ranks trade): a source given, before
 * each read, the tokens of some documents ahead (tokenized by a second
 * source of the same file in the same place, as another rank would)
 * serves the rows of the second, which tokenizes everything, shuffled, over epoch ends, in reads of 1 to 3
 * rows; it tokenizes only what it was not given; a give that does not
 * start where the held ones end is refused.
 */
static void test_give(void)
{
	struct hp_online *ref, *o;
	struct hp_err e;
	long T = 24;
	int same = 1, reads = 0;
	int32_t *ia = malloc(3 * T * 4), *la = malloc(3 * T * 4), *sa = malloc(3 * T * 4);
	int32_t *ib = malloc(3 * T * 4), *lb = malloc(3 * T * 4), *sb = malloc(3 * T * 4);

	if (open_src(&ref, "docs.jsonl", T, 1, 3, 0, &e) || open_src(&o, "docs.jsonl", T, 1, 3, 0, &e)) {
		ok(0, "open: %s", e.msg);
		return;
	}
	for (int r = 0; r < 30 && same; r++) {
		int rows = 1 + r % 3;
		size_t have = hp_online_cached(o), n = hp_online_ahead(o, have + (size_t)(r % 4));
		const int32_t *tp[8];
		const uint8_t *mp[8] = { NULL };
		size_t ln[8];
		int32_t *keep[8] = { NULL };

		/* ref, where o is, tokenizes documents have..n-1 ahead */
		for (size_t j = have; j < n && j - have < 8; j++) {
			const int32_t *t;
			const uint8_t *mk;

			if (hp_online_encode(ref, j, &t, &mk, &ln[j - have], &e))
				break;
			keep[j - have] = malloc(ln[j - have] * 4 + 4);
			memcpy(keep[j - have], t, ln[j - have] * 4);
			tp[j - have] = keep[j - have];
		}
		if (n > have && hp_online_give(o, have, n - have, tp, mp, ln, &e)) {
			same = 0;
			tap_diag("give: %s", e.msg);
		}
		for (size_t j = 0; j < 8; j++)
			free(keep[j]);
		hp_online_next(ref, rows, ia, la, sa, &e);
		hp_online_next(o, rows, ib, lb, sb, &e);
		same &= !memcmp(ia, ib, rows * T * 4) && !memcmp(la, lb, rows * T * 4) && !memcmp(sa, sb, rows * T * 4);
		reads++;
	}
	ok(same, "%d reads of given tokens give the rows of tokenizing them (shuffled, over epoch ends)", reads);
	ok(hp_online_encoded(o) * 2 < hp_online_encoded(ref),
	   "the given source tokenized %llu tokens itself, the other (and the given ones) %llu", (unsigned long long)hp_online_encoded(o),
	   (unsigned long long)hp_online_encoded(ref));
	const int32_t *t0[1] = { ia };
	size_t l0[1] = { 1 };
	ok(hp_online_give(o, hp_online_cached(o) + 1, 1, t0, NULL, l0, &e) == HP_EINVAL &&
	   strstr(e.msg, "handed over"), "a give past the held documents is refused: %s", e.msg);
	hp_online_free(ref);
	hp_online_free(o);
	free(ia); free(la); free(sa); free(ib); free(lb); free(sb);
}

static void test_bad_lines(void)
{
	struct hp_online *o;
	struct hp_err e;
	struct hp_online_stats st;

	write_file("bad.jsonl", "{\"text\": \"good\"}\n{\"text\": \"also good\"}\n{\"text\": oops}\n"
				"{\"body\": \"no text key\"}\n{\"text\": 5}\n{\"text\": \"fine\"}\n");
	ok(open_src(&o, "bad.jsonl", 16, 0, 0, 0, &e) == HP_EFORMAT && strstr(e.msg, "line 3: invalid JSON"),
	   "invalid JSON is an error naming the line: %s", e.msg);
	ok(open_src(&o, "bad.jsonl", 16, 0, 0, 1, &e) == 0, "with skip_invalid the file opens");
	hp_online_stats(o, &st);
	ok(st.documents == 3 && st.invalid_lines == 3, "3 documents, 3 invalid lines skipped and counted");
	hp_online_free(o);
	write_file("nokey.jsonl", "{\"body\": \"x\"}\n");
	ok(open_src(&o, "nokey.jsonl", 16, 0, 0, 0, &e) == HP_EFORMAT &&
	   strstr(e.msg, "line 1: text key 'text' is missing"), "a missing text key: %s", e.msg);
	write_file("utf8.txt", "fine line\nbad \xc3\x28 byte\n");
	ok(open_src(&o, "utf8.txt", 16, 0, 0, 0, &e) == HP_EFORMAT && strstr(e.msg, "line 2: invalid UTF-8"),
	   "invalid UTF-8 in a text file: %s", e.msg);
	write_file("overlong.txt", "\xc0\xaf\n");
	ok(open_src(&o, "overlong.txt", 16, 0, 0, 0, &e) == HP_EFORMAT, "an overlong encoding is invalid UTF-8");
	write_file("empty.txt", "\n\n   \n");
	ok(open_src(&o, "empty.txt", 16, 0, 0, 0, &e) == HP_EFORMAT && strstr(e.msg, "no documents"),
	   "only blank lines: %s", e.msg);
	ok(open_src(&o, "absent.jsonl", 16, 0, 0, 0, &e) == HP_EIO && strstr(e.msg, "No such file"),
	   "a missing file: %s", e.msg);

	/* a directory: its .txt/.jsonl files in name order */
	mkdir(path_of("d"), 0755);
	write_file("d/b.txt", "second file\n");
	write_file("d/a.jsonl", "{\"text\": \"first file\"}\n");
	write_file("d/skip.bin", "not data\n");
	ok(open_src(&o, "d", 64, 0, 0, 0, &e) == 0, "a directory opens");
	hp_online_stats(o, &st);
	ok(st.documents == 2 && st.files == 2, "its two data files are read, other files ignored");
	hp_online_free(o);

	/* failure injection while opening */
	int clean = 1, k;
	for (k = 1; k < 100000; k++) {
		hp_alloc_fail_at(k);
		int rc = open_src(&o, "docs.jsonl", 16, 1, 3, 0, &e);
		hp_alloc_fail_at(0);
		if (rc == 0) {
			hp_online_free(o);
			break;
		}
		clean &= rc == HP_ENOMEM;
	}
	ok(clean, "every failed allocation while opening is HP_ENOMEM (%d walked)", k - 1);
}

int main(void)
{
	const char *src = getenv("HP_SRC_DIR");
	static char md[4096];

	snprintf(md, sizeof(md), "%s/data/stories260K/hf", src ? src : ".");
	model_dir = md;
	snprintf(dir, sizeof(dir), "%s/hp-online.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(dir))
		return 1;
	test_packing();
	test_give();
	test_bad_lines();
	for (int i = 0; i < NTEXTS; i++)
		hp_free(streams[i]);
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd))
		tap_diag("could not remove %s", dir);
	return tap_done();
}
