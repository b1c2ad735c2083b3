/*
 * test-docs.c - documents inside the indexed dataset's rows and its
 * shuffle (lib/data/batch.c), through the whole model: a record that packs two
 * documents with eod_mask_loss and reset_position_ids/reset_attention_mask
 * gives the loss and the gradients of the two documents run apart, and
 * each setting changes what is computed.
 *
 * Tolerances.  The packed row and the two runs compute the same terms,
 * but sum them in other groupings (the row's weight gradients add the
 * documents' tokens in one GEMM; apart, two GEMMs and then one add), so
 * they differ by rounding alone: a few units of 2^-24 per term, far below
 * 1e-6 relative L2 (stories260K, 64 tokens: a gradient element sums at
 * most 64 tokens times the hidden width 64).  The loss sums add
 * non-negative terms, each from float logits that may round apart (a
 * GEMM's row tiles differ with the rows it is given): as test-modelk's
 * loss, 1e-6 relative (seen: 4e-9).  A boundary crossed (an
 * EOD's prediction kept, a position not restarted, attention leaking into
 * the previous document) moves the loss and the gradients by percents.
 */
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/batch.h"
#include "config/hfconfig.h"
#include "format/indexed.h"
#include "model/model.h"
#include "tap.h"

#define EOD 2

static char dir[4096], model_dir[4200];

static uint32_t rng = 777;
static int32_t rnd_id(int V)
{
	int32_t t;

	do {
		rng = rng * 1664525u + 1013904223u;
		t = (int32_t)((rng >> 8) % (uint32_t)V);
	} while (t == EOD);
	return t;
}

struct run {
	double loss;
	long count;
	float *g;
	size_t n;
};

/* One forward and backward of rows [B=1, T] into r (gradients scaled by
 * 1/scale_count); 0 or -1. */
static int run(const int32_t *in, const int32_t *lab, const int32_t *seg, int T, double scale_count,
	       struct run *r)
{
	struct hp_model_spec s;
	struct hp_model m;
	struct hp_err e;

	hp_err_clear(&e);
	if (hp_hfconfig_load(&s, model_dir, &e) || hp_model_init(&m, &s, 1, T, &e) ||
	    hp_model_load_hf(&m, model_dir, &e)) {
		tap_diag("  %s", e.msg);
		return -1;
	}
	hp_model_zero_grad(&m);
	if (hp_model_forward(&m, in, lab, seg, 1.0 / scale_count, &r->loss, &r->count, &e) ||
	    hp_model_backward(&m, in, lab, scale_count, 1.0, &e)) {
		tap_diag("  %s", e.msg);
		hp_model_release(&m);
		return -1;
	}
	r->n = m.w.numel;
	r->g = malloc(m.w.numel * sizeof(float));
	if (r->g)
		memcpy(r->g, m.w.flat_g, m.w.numel * sizeof(float));
	hp_model_release(&m);
	return r->g ? 0 : -1;
}

/* The record [A (a ids), EOD, B (b ids), EOD] as the dataset PREFIX. */
static int write_record(const char *prefix, const int32_t *rec, int n)
{
	struct hp_indexed_writer *w;
	struct hp_err e;
	int rc = hp_indexed_writer_open(&w, prefix, 512, &e);

	if (!rc && (rc = hp_indexed_writer_add(w, rec, (size_t)n, &e)))
		hp_indexed_writer_abort(w);
	else if (!rc)
		rc = hp_indexed_writer_finish(w, &e);
	if (rc)
		tap_diag("  %s", e.msg);
	return rc;
}

static void test_two_documents(void)
{
	enum { A = 23, Bn = 40, T = A + 1 + Bn };   /* the record holds T + 1 ids */
	int32_t rec[T + 1], in[T], lab[T], seg[T], ain[A + 1], alab[A + 1];
	struct hp_batch_docs d = { .eod = EOD, .mask_loss = 1, .reset = 1 };
	struct hp_batcher *b;
	struct hp_err e;
	struct run p = { 0 }, ra = { 0 }, rb = { 0 }, q = { 0 };
	char prefix[4200];
	int good = 1;

	for (int i = 0; i < A; i++)
		rec[i] = rnd_id(512);
	rec[A] = EOD;
	for (int i = 0; i < Bn; i++)
		rec[A + 1 + i] = rnd_id(512);
	rec[T] = EOD;
	snprintf(prefix, sizeof(prefix), "%s/two", dir);
	if (write_record(prefix, rec, T + 1) || hp_batcher_open(&b, prefix, T, 1, &e)) {
		ok(0, "two documents: the record");
		return;
	}
	hp_batcher_set_docs(b, &d);
	is_int(hp_batcher_next(b, 1, in, lab, seg, &e), 0, "two documents: the row");
	hp_batcher_free(b);
	for (int i = 0; i < T; i++)
		good &= seg[i] == (i <= A ? 0 : A + 1) && lab[i] == (i == A ? -100 : rec[i + 1]);
	ok(good, "the row: no loss where the input is the EOD (position %d), documents [0, %d] and [%d, %d)",
	   A, A, A + 1, T);

	/* apart: [A, EOD] with nothing to predict after the EOD, then [B] -> B's EOD */
	memcpy(ain, rec, sizeof(ain));
	memcpy(alab, rec + 1, sizeof(alab));
	alab[A] = -100;
	if (run(in, lab, seg, T, T - 1, &p) || run(ain, alab, NULL, A + 1, T - 1, &ra) ||
	    run(rec + A + 1, rec + A + 2, NULL, Bn, T - 1, &rb)) {
		ok(0, "two documents: the runs");
		goto out;
	}
	for (size_t i = 0; i < ra.n; i++)
		ra.g[i] += rb.g[i];
	double dl = fabs(p.loss - (ra.loss + rb.loss)) / (ra.loss + rb.loss);
	double dg = tap_rel_l2(p.g, ra.g, p.n, 0);
	ok(p.count == ra.count + rb.count && p.count == T - 1 && dl < 1e-6 && dg < 1e-6,
	   "the packed record is its two documents run apart: %ld = %ld + %ld targets, loss sum within %.1e, "
	   "gradients within %.1e (rel L2)", p.count, ra.count, rb.count, dl, dg);

	/* each setting matters: without the reset the second document sees the first */
	d.reset = 0;
	if (!hp_batcher_open(&b, prefix, T, 1, &e)) {
		hp_batcher_set_docs(b, &d);
		hp_batcher_next(b, 1, in, lab, seg, &e);
		hp_batcher_free(b);
	}
	good = 1;
	for (int i = 0; i < T; i++)
		good &= seg[i] == 0;
	if (good && !run(in, lab, seg, T, T - 1, &q))
		ok(fabs(q.loss - p.loss) / p.loss > 1e-4 && tap_rel_l2(q.g, p.g, p.n, 0) > 1e-3,
		   "without reset: one document of %d positions, loss sum %.6f, not %.6f", T, q.loss, p.loss);
	else
		ok(0, "without reset: seg all 0");
	free(q.g);
	q.g = NULL;
	/* and without eod_mask_loss the EOD predicts the second document's first token */
	d.reset = 1;
	d.mask_loss = 0;
	memcpy(lab, rec + 1, sizeof(lab));
	hp_batch_docs_row(&d, rec, lab, seg, T);
	if (!run(rec, lab, seg, T, T, &q))
		ok(q.count == T && q.loss > p.loss, "without eod_mask_loss: %ld targets (the EOD's too), loss sum %.6f",
		   q.count, q.loss);
	else
		ok(0, "without eod_mask_loss: runs");
out:
	free(p.g);
	free(ra.g);
	free(rb.g);
	free(q.g);
}

/* Shuffle: every row once per epoch, another order per epoch and seed, the
 * same after a seek. */
static void test_shuffle(void)
{
	enum { N = 37, T = 4 };
	struct hp_indexed_writer *w;
	struct hp_batcher *b, *b2;
	struct hp_err e;
	char prefix[4200];
	int32_t ids[T + 1], in[N * T], lab[N * T], in2[N * T], lab2[N * T];
	int seen[N] = { 0 }, good = 1, differs = 0;

	snprintf(prefix, sizeof(prefix), "%s/sh", dir);
	if (hp_indexed_writer_open(&w, prefix, 1000, &e)) {
		ok(0, "shuffle: writer");
		return;
	}
	for (int r = 0; r < N; r++) {
		for (int k = 0; k <= T; k++)
			ids[k] = r * 10 + k;   /* row r starts with 10 r */
		hp_indexed_writer_add(w, ids, T + 1, &e);
		hp_indexed_writer_end_document(w, &e);
	}
	if (hp_indexed_writer_finish(w, &e) || hp_batcher_open(&b, prefix, T, 1, &e) ||
	    hp_batcher_set_shuffle(b, 42, &e)) {
		ok(0, "shuffle: open: %s", e.msg);
		return;
	}
	is_int(hp_batcher_next(b, N, in, lab, NULL, &e), 0, "shuffle: one epoch");
	for (int r = 0; r < N; r++) {
		int row = in[r * T] / 10;

		good &= row >= 0 && row < N && !seen[row]++;
		differs |= row != r;
	}
	ok(good && differs, "shuffle: each of %d rows once in the epoch, not in file order", N);
	is_int(hp_batcher_next(b, N, in2, lab2, NULL, &e), 0, "shuffle: a second epoch");
	ok(memcmp(in, in2, sizeof(in)) != 0, "shuffle: the second epoch has another order");
	/* a seek to (5, 1) gives what the run gives there */
	if (!hp_batcher_open(&b2, prefix, T, 1, &e) && !hp_batcher_set_shuffle(b2, 42, &e)) {
		is_int(hp_batcher_seek(b2, 5, 1, &e), 0, "shuffle: seek to (5, 1)");
		hp_batcher_next(b2, N - 5, in, lab, NULL, &e);
		ok(!memcmp(in, in2 + 5 * T, (N - 5) * T * sizeof(int32_t)), "shuffle: resumes the same rows");
		hp_batcher_free(b2);
	}
	if (!hp_batcher_open(&b2, prefix, T, 1, &e) && !hp_batcher_set_shuffle(b2, 43, &e)) {
		hp_batcher_next(b2, N, in, lab, NULL, &e);
		hp_batcher_free(b2);
		hp_batcher_seek(b, 0, 0, &e);
		hp_batcher_next(b, N, in2, lab2, NULL, &e);
		ok(memcmp(in, in2, sizeof(in)) != 0, "shuffle: another seed, another order");
	}
	hp_batcher_free(b);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

int main(void)
{
	const char *s = getenv("HP_SRC_DIR"), *tmp = getenv("TMPDIR");

	snprintf(model_dir, sizeof(model_dir), "%s/data/stories260K/hf", s && *s ? s : ".");
	snprintf(dir, sizeof(dir), "%s/hp-test-docs.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir)) {
		printf("Bail out! mkdtemp '%s'\n", dir);
		return 1;
	}
	test_two_documents();
	test_shuffle();
	nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return tap_done();
}
