/*
 * verify.c - the parallel run against the gathered one-process reference,
 * module by module (see verify.h).
 */
#include <limits.h>
#include <math.h>

#include "base/alloc.h"
#include "base/log.h"
#include "dist/verify.h"

static int grow(struct hp_verify *v, size_t n, struct hp_err *e)
{
	if (n <= v->cap)
		return 0;
	hp_free(v->buf);
	v->cap = 0;
	if (!(v->buf = hp_malloc(n * sizeof(float))))
		return hp_err_set(e, HP_ENOMEM, "out of memory comparing with the reference");
	v->cap = n;
	return 0;
}

/* The table row of (kind, name), made on first use. */
static struct hp_vrow *row(struct hp_verify *v, const char *kind, const char *name, const char *placement)
{
	for (int i = 0; i < v->nrows; i++)
		if (!strcmp(v->rows[i].kind, kind) && !strcmp(v->rows[i].name, name))
			return &v->rows[i];
	if (v->nrows == v->caprows) {
		int cap = v->caprows ? 2 * v->caprows : 64;
		struct hp_vrow *r = hp_realloc(v->rows, (size_t)cap * sizeof(*r));
		if (!r)
			return NULL;
		v->rows = r;
		v->caprows = cap;
	}
	struct hp_vrow *r = &v->rows[v->nrows++];
	memset(r, 0, sizeof(*r));
	snprintf(r->kind, sizeof(r->kind), "%s", kind);
	snprintf(r->name, sizeof(r->name), "%s", name);
	snprintf(r->placement, sizeof(r->placement), "%s", placement);
	return r;
}

/* Where a module's output comes in the step's forward: the step, then
 * the embedding, the layers in order, the head (LONG_MAX: not an output).
 * With stages (and more so with interleaved chunks) the outputs are
 * judged in another order than the model's; the first divergence is the
 * earliest here, which is where it began. */
static long forward_at(const struct hp_verify *v, const char *module)
{
	int l, L = v->p->spec.n_layers;

	if (!module)
		return LONG_MAX;
	if (sscanf(module, "model.layers.%d", &l) != 1 || l < 0 || l >= L)
		l = strcmp(module, "model.embed_tokens") ? L : -1;
	return (long)v->step * (L + 2) + l + 1;
}

/* The first divergence so far: the one earliest in the step's forward. */
static int earlier(struct hp_verify *v, const char *module)
{
	long at = forward_at(v, module);

	if (v->first[0] && at >= v->first_at)
		return 0;
	v->first_at = at;
	return 1;
}

/* Record one comparison of a (n floats) with the reference b. */
static void judge(struct hp_verify *v, const char *kind, const char *name, const char *placement,
		  const float *a, const float *b, size_t n)
{
	double mx = 0, d2 = 0, b2 = 0, rel;
	struct hp_vrow *r;

	for (size_t i = 0; i < n; i++) {
		double d = (double)a[i] - b[i];

		if (fabs(d) > mx || isnan(d))
			mx = isnan(d) ? INFINITY : fabs(d);
		d2 += d * d;
		b2 += (double)b[i] * b[i];
	}
	rel = b2 > 0 ? sqrt(d2 / b2) : sqrt(d2);
	v->checks++;
	if (!(r = row(v, kind, name, placement)))
		return;
	if (mx > r->max_abs || isnan(mx))
		r->max_abs = mx;
	if (rel > r->rel || isnan(rel))
		r->rel = rel;
	/* the weights after AdamW's update are held to prtol (see verify.h) */
	double rtol = strcmp(kind, "param") ? v->rtol : v->prtol;

	if (!(rel <= rtol || mx <= v->atol)) {
		if (!r->bad)
			r->first_bad_step = v->step;
		r->bad = 1;
		if (earlier(v, strcmp(kind, "output") ? NULL : name))
			snprintf(v->first, sizeof(v->first), "step %d, %s of %s (%s): max abs error %.3e, "
				 "relative %.3e; tolerances rtol %g, atol %g", v->step,
				 !strcmp(kind, "output") ? "the output" : !strcmp(kind, "grad") ? "the gradient" :
				 "the value after the update", name, placement, mx, rel, rtol, v->atol);
	}
}

/* The reference's parameter i of the plan: the whole model holds the
 * plan's parameters in the plan's order (lib/model/params.h). */
static struct hp_param *ref_param(struct hp_verify *v, int i)
{
	struct hp_param *rp = i < v->ref.w.nparams ? &v->ref.w.params[i] : NULL;

	return rp && !strcmp(rp->name, v->p->params[i].name) ? rp : NULL;
}

/* Plan param i's whole tensor of the array which (n floats), assembled
 * from every rank's pieces into v->buf on the uncounted duplicate world. */
static void assemble(struct hp_verify *v, int i, enum hp_fsdp_which which, size_t n)
{
	memset(v->buf, 0, n * sizeof(float));
	hp_fsdp_piece_into(v->f, i, which, v->buf);
	hp_comm_allreduce_raw(v->world, v->buf, (int)n, MPI_FLOAT, MPI_SUM);
}

int hp_verify_init(struct hp_verify *v, const struct hp_plan *p, struct hp_fsdp *f, struct hp_model *m,
		   const struct hp_model_kernels *k, const struct hp_config *cfg, MPI_Comm world,
		   struct hp_comms *cs, struct hp_err *e)
{
	int rc = 0;

	memset(v, 0, sizeof(*v));
	v->p = p;
	v->f = f;
	v->m = m;
	v->rtol = 1e-5;
	v->atol = 1e-7;
	v->prtol = 1e-3;
	MPI_Comm_rank(world, &v->rank);
	MPI_Comm_dup(world, &v->world);
	v->stage = MPI_COMM_NULL;
	v->leader = v->rank == 0;
	if (p->pp > 1) {
		int s = hp_plan_stage(p, v->rank);

		MPI_Comm_split(world, s, v->rank, &v->stage);
		v->leader = v->rank == s * (p->world / (int)p->pp);
	}
	v->tp = MPI_COMM_NULL;
	if (cs->dim[HP_DIM_TP].comm != MPI_COMM_NULL)
		MPI_Comm_dup(cs->dim[HP_DIM_TP].comm, &v->tp);
	if (v->rank == 0) {
		/* on the run's backend: a GPU run is held to a GPU model */
		if ((rc = hp_model_init_par(&v->ref, m->bk, &p->spec, k, NULL, (int)p->micro, (int)p->seq, e)))
			return rc;
		v->have_ref = 1;
		if ((rc = hp_optim_init(&v->opt, &v->ref, cfg, 1, e)))
			return rc;
	}
	/* the same weights: every parameter assembled from the shards */
	for (int i = 0; i < p->nparams && !rc; i++) {
		const struct hp_plan_param *q = &p->params[i];
		size_t n = (size_t)(q->shape[0] * (q->ndim > 1 ? q->shape[1] : 1));

		if ((rc = grow(v, n, e)))
			break;
		assemble(v, i, HP_FSDP_WEIGHTS, n);
		if (v->rank == 0) {
			struct hp_param *rp = ref_param(v, i);
			if (!rp || rp->numel != n)
				rc = hp_err_set(e, HP_EINVAL, "the reference model has no parameter '%s'", q->name);
			else
				memcpy(rp->w, v->buf, n * sizeof(float));
		}
	}
	if (!rc && v->have_ref)
		rc = hp_model_upload(&v->ref, e);
	return rc;
}

void hp_verify_free(struct hp_verify *v)
{
	if (v->have_ref) {
		hp_optim_release(&v->opt);
		hp_model_release(&v->ref);
	}
	for (int i = 0; i < v->nrec; i++)
		hp_free(v->rec[i].x);
	hp_free(v->rec);
	hp_free(v->buf);
	hp_free(v->rows);
	if (v->world != MPI_COMM_NULL && v->world)
		MPI_Comm_free(&v->world);
	if (v->tp != MPI_COMM_NULL && v->tp)
		MPI_Comm_free(&v->tp);
	if (v->stage != MPI_COMM_NULL && v->stage)
		MPI_Comm_free(&v->stage);
	memset(v, 0, sizeof(*v));
}

/* The reference's probe: keep a copy of each output of the micro-batch. */
static int record(void *ctx, const struct hp_probe *pr, struct hp_err *e)
{
	struct hp_verify *v = ctx;
	size_t n = (size_t)pr->rows * pr->cols;
	struct hp_vrec *r;

	if (v->nrec == v->caprec) {
		int cap = v->caprec ? 2 * v->caprec : 64;
		struct hp_vrec *x = hp_realloc(v->rec, (size_t)cap * sizeof(*x));
		if (!x)
			return hp_err_set(e, HP_ENOMEM, "out of memory recording the reference");
		v->rec = x;
		v->caprec = cap;
	}
	r = &v->rec[v->nrec];
	if (!(r->x = hp_malloc(n * sizeof(float))))
		return hp_err_set(e, HP_ENOMEM, "out of memory recording the reference");
	v->nrec++;
	snprintf(r->name, sizeof(r->name), "%d:%s", v->rec_micro, pr->module);
	memcpy(r->x, pr->x, n * sizeof(float));
	r->n = (long)n;
	r->cols = pr->cols;
	return 0;
}

int hp_verify_reference(struct hp_verify *v, long step, const int32_t *ids, const int32_t *labels,
			const int32_t *seg, long accum, double total, struct hp_err *e)
{
	struct hp_model *r = &v->ref;
	long BS = v->p->micro * v->p->seq;
	int rc;

	v->step = (int)step;
	for (int i = 0; i < v->nrec; i++)
		hp_free(v->rec[i].x);
	v->nrec = 0;
	if (!v->have_ref)
		return 0;
	hp_model_zero_grad(r);
	r->probe = record;
	r->probe_ctx = v;
	for (long a = 0; a < accum; a++) {
		double ls;
		long cnt;

		v->rec_micro = (int)a;
		if ((rc = hp_model_forward(r, ids + a * BS, labels + a * BS, seg ? seg + a * BS : NULL,
					   total > 0 ? 1.0 / total : 0, &ls, &cnt, e)))
			return hp_err_prefix(e, "the reference's forward failed");
		if ((rc = hp_model_backward(r, ids + a * BS, labels + a * BS, total, 1.0 / accum, e)))
			return hp_err_prefix(e, "the reference's backward failed");
	}
	return 0;
}

/* A point-to-point transfer on the uncounted world, waited for without
 * spinning inside MPI (comm.h). */
static void xfer(struct hp_verify *v, void *buf, int n, MPI_Datatype t, int peer, int send)
{
	MPI_Request req;

	if (send)
		MPI_Isend(buf, n, t, peer, 1, v->world, &req);
	else
		MPI_Irecv(buf, n, t, peer, 1, v->world, &req);
	hp_comm_wait_op(&req, v->world, HP_COMM_OP_GATHER);
}

/* Pipeline stages: every stage's leader takes rank 0's records of the
 * step (every rank calls it).  Each record's floats follow its header only
 * once the leader has room for them (it says so), so that a leader out of
 * memory fails without leaving rank 0 waiting. */
int hp_verify_share(struct hp_verify *v, struct hp_err *e)
{
	const struct hp_plan *p = v->p;
	int sw = p->world / (int)p->pp, rc = 0;

	if (p->pp <= 1 || (v->rank != 0 && !v->leader))
		return 0;
	for (int s = 1; s < p->pp; s++) {
		int to = s * sw, n = v->nrec, ok;

		if (v->rank != 0 && v->rank != to)
			continue;
		if (v->rank == 0) {
			xfer(v, &n, 1, MPI_INT, to, 1);
			for (int i = 0; i < n; i++) {
				xfer(v, &v->rec[i], (int)sizeof(v->rec[i]), MPI_BYTE, to, 1);
				xfer(v, &ok, 1, MPI_INT, to, 0);
				if (ok)
					xfer(v, v->rec[i].x, (int)v->rec[i].n, MPI_FLOAT, to, 1);
			}
			continue;
		}
		for (int i = 0; i < v->nrec; i++)
			hp_free(v->rec[i].x);
		v->nrec = 0;
		xfer(v, &n, 1, MPI_INT, 0, 0);
		if (n > v->caprec) {
			struct hp_vrec *r = hp_realloc(v->rec, (size_t)n * sizeof(*r));

			if (r) {
				v->rec = r;
				v->caprec = n;
			} else {
				rc = hp_err_set(e, HP_ENOMEM, "out of memory for the reference's records");
			}
		}
		for (int i = 0; i < n; i++) {
			struct hp_vrec h;

			xfer(v, &h, (int)sizeof(h), MPI_BYTE, 0, 0);
			h.x = rc ? NULL : hp_malloc((size_t)h.n * sizeof(float) + 1);
			ok = h.x != NULL;
			xfer(v, &ok, 1, MPI_INT, 0, 1);
			if (!ok) {
				if (!rc)
					rc = hp_err_set(e, HP_ENOMEM, "out of memory for the reference's records");
				continue;
			}
			xfer(v, h.x, (int)h.n, MPI_FLOAT, 0, 0);
			v->rec[v->nrec++] = h;
		}
	}
	return rc;
}

void hp_verify_micro(struct hp_verify *v, int micro)
{
	v->micro = micro;
}

/* Validation mode: when rank 0 found a difference, every rank stops with
 * its message. */
static int stop_here(struct hp_verify *v, struct hp_err *e)
{
	int bad = v->first[0] != 0;

	if (!v->stop)
		return 0;
	hp_comm_bcast_raw(v->world, &bad, 1, MPI_INT, 0);
	if (!bad)
		return 0;
	hp_comm_bcast_raw(v->world, v->first, (int)sizeof(v->first), MPI_CHAR, 0);
	return hp_err_set(e, HP_ENUM, "validation: %s", v->first);
}

/* How the plan lays a module output out, for messages. */
static void out_placement(const struct hp_verify *v, const struct hp_probe *pr, char *buf, size_t n)
{
	const struct hp_plan *p = v->p;
	size_t at = 0;

	buf[0] = '\0';
	if (p->pp > 1)
		at += (size_t)snprintf(buf + at, n - at, "pp stage %d", hp_plan_stage(p, v->rank));
	if (p->dp > 1 && at < n)
		at += (size_t)snprintf(buf + at, n - at, "%sdp shard(batch)", at ? ", " : "");
	if (p->cp > 1 && at < n)
		at += (size_t)snprintf(buf + at, n - at, "%scp shard(seq)", at ? ", " : "");
	if (p->tp > 1 && at < n)
		at += (size_t)snprintf(buf + at, n - at, "%stp %s", at ? ", " : "",
				       pr->row_split ? "shard(seq)" : pr->col_split ? "shard(vocab)" : "replicate");
	if (!at)
		snprintf(buf, n, "whole on every rank");
}

static uint64_t fnv(const void *x, size_t n)
{
	const unsigned char *c = x;
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ c[i]) * 1099511628211ull;
	return h;
}

int hp_verify_probe(void *ctx, const struct hp_probe *pr, struct hp_err *e)
{
	struct hp_verify *v = ctx;
	const struct hp_plan *p = v->p;
	int tpr = hp_mesh_coord(p->size, HP_DIM_TP, v->rank), cpr = hp_mesh_coord(p->size, HP_DIM_CP, v->rank);
	int d = hp_mesh_coord(p->size, HP_DIM_DP, v->rank), tp = (int)p->tp;
	long B = p->micro, S = p->seq, T = S / p->cp, R = B * S;
	int F = pr->cols * (pr->col_split ? tp : 1), c0 = pr->col_split ? tpr * pr->cols : 0;
	size_t blk = (size_t)R * F;
	char pl[96];
	int rc;

	out_placement(v, pr, pl, sizeof(pl));
	if (v->placement && tp > 1 && !pr->row_split && !pr->col_split) {
		/* declared replicated over tp: the same bytes on every rank of the group */
		uint64_t h[2];
		h[0] = h[1] = fnv(pr->x, (size_t)pr->rows * pr->cols * sizeof(float));
		hp_comm_allreduce_raw(v->tp, &h[0], 1, MPI_UINT64_T, MPI_MIN);
		hp_comm_allreduce_raw(v->tp, &h[1], 1, MPI_UINT64_T, MPI_MAX);
		if (h[0] != h[1]) {
			struct hp_vrow *r = row(v, "place", pr->module, pl);
			if (r && !r->bad) {
				r->bad = 1;
				r->first_bad_step = v->step;
			}
			if (earlier(v, pr->module))
				snprintf(v->first, sizeof(v->first), "step %d, the output of %s: declared tp "
					 "replicate, but the ranks of the tp group hold different values (%s)",
					 v->step, pr->module, pl);
		}
	}
	if ((rc = grow(v, (size_t)p->dp * blk, e)))
		return rc;
	memset(v->buf, 0, (size_t)p->dp * blk * sizeof(float));
	if (pr->row_split || pr->col_split || tpr == 0) {
		float *dst = v->buf + (size_t)d * blk;

		for (long i = 0; i < pr->rows; i++) {
			long n = (pr->row_split ? (long)tpr * pr->rows : 0) + i, b = n / T, t = n % T;

			memcpy(dst + (size_t)(b * S + (long)cpr * T + t) * F + c0, pr->x + (size_t)i * pr->cols,
			       (size_t)pr->cols * sizeof(float));
		}
	}
	hp_comm_allreduce_raw(v->stage != MPI_COMM_NULL ? v->stage : v->world, v->buf, (int)((size_t)p->dp * blk),
			      MPI_FLOAT, MPI_SUM);
	if (v->leader)
		for (long dd = 0; dd < p->dp; dd++) {
			char key[112];
			const struct hp_vrec *r = NULL;

			snprintf(key, sizeof(key), "%ld:%s", dd * p->accum + v->micro, pr->module);
			for (int i = 0; i < v->nrec && !r; i++)
				if (!strcmp(v->rec[i].name, key))
					r = &v->rec[i];
			if (r && (size_t)r->n == blk)
				judge(v, "output", pr->module, pl, v->buf + (size_t)dd * blk, r->x, blk);
		}
	/* every rank learns whether to stop (with stages, at the step's end:
	 * their probes come at different times) */
	return v->p->pp > 1 ? 0 : stop_here(v, e);
}

static void param_placement(const struct hp_plan *p, const struct hp_plan_param *q, char *buf, size_t n)
{
	size_t at = 0;

	buf[0] = '\0';
	for (int d = 0; d < HP_NDIM && at < n; d++) {
		char pl[32];

		if (q->pl[d].kind == HP_PL_NONE || p->size[d] <= 1)
			continue;
		at += (size_t)snprintf(buf + at, n - at, "%s%s %s", at ? ", " : "", hp_dim_name((enum hp_dim)d),
				       hp_placement_str(q->pl[d], pl, sizeof(pl)));
	}
	if (!at)
		snprintf(buf, n, "whole on every rank");
}

/* Pipeline stages: the leaders' rows of the module outputs (and their
 * first difference and checks) merged into rank 0's, the worst of each,
 * stage by stage, the first difference the earliest in the forward; a
 * leader then starts afresh.  The rows come one at a time into one on the
 * stack, so that nothing here can fail and leave a sender waiting. */
static void merge_stages(struct hp_verify *v)
{
	const struct hp_plan *p = v->p;
	int sw = p->world / (int)p->pp;

	for (int s = 1; s < p->pp; s++) {
		int from = s * sw, n = v->rank == from ? v->nrows : 0;
		long checks = v->rank == from ? v->checks : 0, at = v->first_at;
		char first[sizeof(v->first)];

		if (v->rank != 0 && v->rank != from)
			continue;
		if (v->rank == from) {
			xfer(v, &n, 1, MPI_INT, 0, 1);
			xfer(v, &checks, 1, MPI_LONG, 0, 1);
			xfer(v, v->first, (int)sizeof(v->first), MPI_CHAR, 0, 1);
			xfer(v, &at, 1, MPI_LONG, 0, 1);
			for (int i = 0; i < n; i++)
				xfer(v, &v->rows[i], (int)sizeof(v->rows[i]), MPI_BYTE, 0, 1);
			v->nrows = 0;
			v->checks = 0;
			v->first[0] = '\0';
			continue;
		}
		xfer(v, &n, 1, MPI_INT, from, 0);
		xfer(v, &checks, 1, MPI_LONG, from, 0);
		xfer(v, first, (int)sizeof(first), MPI_CHAR, from, 0);
		xfer(v, &at, 1, MPI_LONG, from, 0);
		v->checks += checks;
		if (first[0] && (!v->first[0] || at < v->first_at)) {
			memcpy(v->first, first, sizeof(first));
			v->first_at = at;
		}
		for (int i = 0; i < n; i++) {
			struct hp_vrow got, *r;

			xfer(v, &got, (int)sizeof(got), MPI_BYTE, from, 0);
			if (!(r = row(v, got.kind, got.name, got.placement)))
				continue;
			r->max_abs = got.max_abs > r->max_abs ? got.max_abs : r->max_abs;
			r->rel = got.rel > r->rel ? got.rel : r->rel;
			if (got.bad && !r->bad) {
				r->bad = 1;
				r->first_bad_step = got.first_bad_step;
			}
		}
	}
}

int hp_verify_params(struct hp_verify *v, int grads, struct hp_err *e)
{
	const struct hp_plan *p = v->p;
	int rc;

	if (grads && p->pp > 1)
		merge_stages(v);

	/* a device's shards and the reference's tensors come to the host */
	if ((rc = hp_fsdp_download(v->f, grads, !grads, e)) ||
	    (v->have_ref && (rc = hp_model_download(&v->ref, grads, e))))
		return rc;
	/* gradients in the backward's order: the last parameter first */
	for (int j = 0; j < p->nparams; j++) {
		int i = grads ? p->nparams - 1 - j : j;
		const struct hp_plan_param *q = &p->params[i];
		size_t n = (size_t)(q->shape[0] * (q->ndim > 1 ? q->shape[1] : 1));
		struct hp_param *rp = v->rank == 0 ? ref_param(v, i) : NULL;
		char pl[96];

		if (rp && rp->numel != n)
			rp = NULL;
		if ((rc = grow(v, n, e)))
			return rc;
		assemble(v, i, grads ? HP_FSDP_GRADS : HP_FSDP_WEIGHTS, n);
		if (rp) {
			param_placement(p, q, pl, sizeof(pl));
			judge(v, grads ? "grad" : "param", q->name, pl, v->buf, grads ? rp->g : rp->w, n);
		}
		if (grads)
			continue;
		/* each step is replayed from the same state: the reference takes
		 * the parallel run's weights and moments, so float noise does not
		 * pile up over the steps */
		if (rp)
			memcpy(rp->w, v->buf, n * sizeof(float));
		assemble(v, i, HP_FSDP_EXP_AVG, n);
		if (rp)
			memcpy(v->opt.hm + rp->offset, v->buf, n * sizeof(float));
		assemble(v, i, HP_FSDP_EXP_AVG_SQ, n);
		if (rp)
			memcpy(v->opt.hv + rp->offset, v->buf, n * sizeof(float));
	}
	if (!grads && v->have_ref && ((rc = hp_model_upload(&v->ref, e)) ||
				      (rc = hp_optim_move(&v->opt, 0, e))))
		return rc;
	return stop_here(v, e);
}

void hp_verify_update(struct hp_verify *v, double lr)
{
	struct hp_err e;
	struct hp_backend *bk = v->ref.bk;
	double norm, ss = NAN, *acc = hp_model_stat(&v->ref, HP_ST_GRAD_SQ);

	if (!v->have_ref)
		return;
	/* the reference's backend failing leaves a NaN norm, which the
	 * comparison of the weights after the update reports */
	bk->zero(bk, acc, sizeof(*acc));
	if (!hp_optim_grad_sumsq(&v->opt, acc, &e))
		bk->download(bk, &ss, acc, sizeof(ss), &e);
	norm = sqrt(ss);
	hp_optim_clip(&v->opt, norm);
	hp_optim_step(&v->opt, lr, NULL);
}

void hp_verify_print(const struct hp_verify *v, FILE *out, int json)
{
	int nbad = 0;

	for (int i = 0; i < v->nrows; i++)
		nbad += v->rows[i].bad;
	if (json) {
		fprintf(out, "{\"steps\": %d, \"rtol\": %g, \"param_rtol\": %g, \"atol\": %g, \"checks\": %ld, "
			"\"ok\": %s, \"first_divergence\": ", v->step, v->rtol, v->prtol, v->atol, v->checks,
			nbad ? "false" : "true");
		if (v->first[0]) {
			fputc('"', out);
			for (const char *c = v->first; *c; c++)
				fprintf(out, *c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
			fputc('"', out);
		} else {
			fprintf(out, "null");
		}
		fprintf(out, ", \"rows\": [");
		for (int i = 0; i < v->nrows; i++) {
			const struct hp_vrow *r = &v->rows[i];
			fprintf(out, "%s\n  {\"kind\": \"%s\", \"name\": \"%s\", \"placement\": \"%s\", "
				"\"max_abs\": %.6g, \"rel\": %.6g, \"ok\": %s}", i ? "," : "", r->kind, r->name,
				r->placement, r->max_abs, r->rel, r->bad ? "false" : "true");
		}
		fprintf(out, "\n]}\n");
		return;
	}
	fprintf(out, "%-6s %-52s %12s %12s  %s\n", "kind", "module or parameter", "max abs err", "rel err",
		"verdict");
	for (int i = 0; i < v->nrows; i++) {
		const struct hp_vrow *r = &v->rows[i];
		char verdict[32];

		if (r->bad)
			snprintf(verdict, sizeof(verdict), "DIFFERS (step %d)", r->first_bad_step);
		else
			snprintf(verdict, sizeof(verdict), "ok");
		fprintf(out, "%-6s %-52s %12.3e %12.3e  %s\n", r->kind, r->name, r->max_abs, r->rel, verdict);
	}
	if (v->first[0])
		fprintf(out, "first divergence: %s\n", v->first);
	else
		fprintf(out, "verdict: all %ld checks of %d step%s match (module outputs, gradients, parameters "
			"after the update)\n", v->checks, v->step, v->step == 1 ? "" : "s");
}
