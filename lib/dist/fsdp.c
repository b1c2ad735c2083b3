/*
 * fsdp.c - sharded parameters, gradients and optimizer state over the FSDP
 * dims of a plan (see fsdp.h).  The shard arrays hold, unit after unit,
 * each parameter's chunk of rows padded to the chunk (padding stays zero),
 * so that a unit's shard is one contiguous run: the send buffer of its
 * all-gather and the target of its replica all-reduce.  Every byte moves
 * through the model's backend (lib/backend/backend.h), so the same code shards a
 * CPU model and a GPU one.
 */
#include <math.h>

#include "base/alloc.h"
#include "dist/fsdp.h"
#include "dist/shard.h"
#include "model/params.h"

/* "bfloat16" -> BF16, "float32" or "" -> F32; INVALID for the others */
static enum hp_dtype mp_dtype(const char *s)
{
	if (!s[0] || !strcmp(s, "float32") || !strcmp(s, "fp32"))
		return HP_DTYPE_F32;
	return !strcmp(s, "bfloat16") ? HP_DTYPE_BF16 : HP_DTYPE_INVALID;
}

/* The element at index i of a buffer of dtype t on f's backend. */
static void *at(const struct hp_fsdp *f, const void *buf, enum hp_dtype t, size_t i)
{
	return (char *)buf + i * f->bk->esize(f->bk, t);
}

/* A backend array of n floats (zeroed), and its host copy. */
static float *arr(struct hp_fsdp *f, size_t n, float **host, struct hp_err *e)
{
	float *d = f->bk->alloc(f->bk, (n + 1) * sizeof(float), e);

	if (!d)
		return NULL;
	*host = d;
	if (f->bk->device && !(*host = hp_calloc(n + 1, sizeof(float)))) {
		f->bk->free(f->bk, d);
		hp_err_set(e, HP_ENOMEM, "out of memory for the FSDP shards' host copies");
		return NULL;
	}
	return d;
}

static size_t tp_partials(struct hp_fsdp *f, int dir);

int hp_fsdp_init(struct hp_fsdp *f, const struct hp_plan *p, struct hp_comms *cs, struct hp_model *m,
		 struct hp_err *e)
{
	struct hp_fsdp_bytes have, gpu;
	int at = 0;

	memset(f, 0, sizeof(*f));
	f->p = p;
	f->cs = cs;
	f->m = m;
	f->bk = m->bk;
	f->rank = cs->world_rank;
	f->stale_unit = -1;
	f->sync = 1;
	f->pdt = mp_dtype(p->param_dtype);
	f->rdt = mp_dtype(p->reduce_dtype);
	if (f->pdt == HP_DTYPE_INVALID || f->rdt == HP_DTYPE_INVALID)
		return hp_err_set(e, HP_EUNSUP, "fsdp_config.mix_precision: %s is not implemented (float32 or "
				  "bfloat16)", f->pdt == HP_DTYPE_INVALID ? p->param_dtype : p->reduce_dtype);
	f->units = hp_calloc((size_t)p->nunits, sizeof(*f->units));
	f->order = hp_calloc((size_t)p->nparams, sizeof(int));
	f->poff = hp_calloc((size_t)p->nparams, sizeof(size_t));
	f->mp = hp_calloc((size_t)p->nparams, sizeof(*f->mp));
	f->pc = hp_calloc((size_t)p->nparams, sizeof(*f->pc));
	f->conly = hp_calloc((size_t)p->nparams + 1, 1);
	if (!f->units || !f->order || !f->poff || !f->mp || !f->pc || !f->conly)
		goto oom;
	/* the model holds this rank's tp-local tensors and its own experts, in
	 * the plan's order */
	for (int i = 0, j = 0; i < p->nparams; i++) {
		const struct hp_plan_param *q = &p->params[i];

		hp_plan_piece(p, q, f->rank, &f->pc[i]);
		if (!hp_plan_owns(p, q, f->rank))
			continue;
		if (j >= m->w.nparams || strcmp(m->w.params[j].name, q->name))
			return hp_err_set(e, HP_EINVAL, "parameter '%s' of the plan is not the model's "
					  "parameter %d ('%s')", q->name, j, j < m->w.nparams ? m->w.params[j].name : "");
		if ((int64_t)m->w.params[j].numel != f->pc[i].rows * f->pc[i].cols)
			return hp_err_set(e, HP_EINVAL, "parameter '%s': the model holds %zu elements, the "
					  "plan's piece %lld", q->name, m->w.params[j].numel,
					  (long long)(f->pc[i].rows * f->pc[i].cols));
		f->mp[i] = &m->w.params[j++];
		/* on a device, a matrix only GEMMs read lives gathered in the
		 * working copy alone */
		f->conly[i] = m->bk->device && m->par.sharded && hp_param_gemm_only(q->name, q->ndim);
	}
	f->nunits = p->nunits;
	for (int u = 0; u < p->nunits; u++) {
		struct hp_fsdp_unit *un = &f->units[u];

		un->shard_dim = p->units[u].mesh == HP_MESH_EXPERT ? HP_DIM_EDP_SHARD : HP_DIM_DP_SHARD;
		un->rep_dim = p->units[u].mesh == HP_MESH_EXPERT ? HP_DIM_EDP_REPLICATE : HP_DIM_DP_REPLICATE;
		un->root = u == 0;
		un->first = at;
		un->off = f->total;
		for (int i = 0; i < p->nparams; i++) {
			if (p->params[i].unit != u || !f->mp[i])
				continue;
			f->order[at++] = i;
			f->poff[i] = f->total;
			f->total += (size_t)(f->pc[i].chunk * f->pc[i].cols);
		}
		un->n = at - un->first;
		un->padded = f->total - un->off;
	}
	f->nrs = m->bk->device ? HP_FSDP_RS_RING : 1;
	/* the buffers' bytes as this backend holds them, and as a GPU does
	 * (what the backend counts, and hp-plan) */
	if (hp_plan_fsdp_bytes(p, f->rank, f->bk->esize(f->bk, f->pdt), f->bk->esize(f->bk, f->rdt), f->nrs > 1,
			       &have) ||
	    hp_plan_fsdp_bytes(p, f->rank, hp_dtype_size(f->pdt), hp_dtype_size(f->rdt), f->nrs > 1, &gpu))
		goto oom;
	f->bytes = have;
	f->gpu_bytes = gpu;
	for (int i = 0; i < HP_FSDP_RS_RING; i++)
		f->rs[i].unit = -1;
	/* the prefetch ring: a layer's units (its own and its experts') for the
	 * layer in hand and each one fetched ahead */
	f->nslots = 2 * (1 + (int)(p->forward_prefetch > p->backward_prefetch ? p->forward_prefetch :
				    p->backward_prefetch));
	f->slots = hp_calloc((size_t)f->nslots, sizeof(*f->slots));
	if (!f->slots)
		goto oom;
	for (int i = 0; i < f->nslots; i++)
		f->slots[i].unit = -1;
	f->root_slot.unit = -1;
	size_t er = f->bk->esize(f->bk, f->rdt);

	for (int u = 0; u < p->nunits; u++) {
		const struct hp_fsdp_unit *un = &f->units[u];
		size_t k = (size_t)p->size[un->shard_dim];

		if (!un->root && (k + 1) * un->padded * er > f->steady_rs)
			f->steady_rs = (k + 1) * un->padded * er;
	}
	if ((f->nrs > 1 && !(f->rs[1].buf = f->bk->alloc_as(f->bk, have.rs1 + 8, gpu.rs1 + 8, e))) ||
	    !(f->w = arr(f, f->total, &f->hw, e)) || !(f->g = arr(f, f->total, &f->hg, e)) ||
	    !(f->m1 = arr(f, f->total, &f->hm1, e)) || !(f->m2 = arr(f, f->total, &f->hm2, e)) ||
	    !(f->buf = f->bk->alloc_as(f->bk, have.buf + 8, gpu.buf + 8, e))) {
		int rc = e->code;
		hp_fsdp_free(f);
		return rc;
	}
	f->rs[0].buf = f->buf;
	f->layer_unit = hp_calloc((size_t)p->spec.n_layers + 1, sizeof(int));
	f->expert_unit = hp_calloc((size_t)p->spec.n_layers + 1, sizeof(int));
	if (!f->layer_unit || !f->expert_unit)
		goto oom;
	for (int l = 0; l < p->spec.n_layers; l++)
		f->layer_unit[l] = f->expert_unit[l] = -1;
	for (int u = 1; u < p->nunits; u++) {
		int l = hp_plan_unit_layer(p, u);

		if (l >= 0)
			*(p->units[u].mesh == HP_MESH_EXPERT ? &f->expert_unit[l] : &f->layer_unit[l]) = u;
	}
	return 0;
oom:
	hp_fsdp_free(f);
	return hp_err_set(e, HP_ENOMEM, "out of memory for the FSDP shards");
}

int hp_fsdp_load(struct hp_fsdp *f, struct hp_src *src, struct hp_err *e)
{
	for (int i = 0; i < f->p->nparams; i++) {
		const struct hp_piece *pc = &f->pc[i];
		int rc;

		if (f->mp[i] && pc->nrows > 0 &&
		    (rc = hp_src_read(src, i, pc->row0, pc->nrows, pc->col0, pc->cols, f->hw + f->poff[i], e)))
			return rc;
	}
	return hp_fsdp_upload(f, e);
}

int hp_fsdp_upload(struct hp_fsdp *f, struct hp_err *e)
{
	size_t n = f->total * sizeof(float);
	int rc;

	if (!f->bk->device)
		return 0;
	if ((rc = f->bk->upload(f->bk, f->w, f->hw, n, e)) || (rc = f->bk->upload(f->bk, f->m1, f->hm1, n, e)))
		return rc;
	return f->bk->upload(f->bk, f->m2, f->hm2, n, e);
}

int hp_fsdp_download(struct hp_fsdp *f, int grads, int moments, struct hp_err *e)
{
	size_t n = f->total * sizeof(float);
	int rc;

	if (!f->bk->device)
		return 0;
	if ((rc = f->bk->download(f->bk, f->hw, f->w, n, e)) ||
	    (grads && (rc = f->bk->download(f->bk, f->hg, f->g, n, e))) ||
	    (moments && (rc = f->bk->download(f->bk, f->hm1, f->m1, n, e))))
		return rc;
	return moments ? f->bk->download(f->bk, f->hm2, f->m2, n, e) : 0;
}

void hp_fsdp_free(struct hp_fsdp *f)
{
	struct hp_backend *bk = f->bk;

	hp_free(f->units);
	hp_free(f->order);
	hp_free(f->poff);
	hp_free(f->mp);
	hp_free(f->pc);
	hp_free(f->conly);
	if (bk) {
		float *const d[4] = { f->w, f->g, f->m1, f->m2 }, *const h[4] = { f->hw, f->hg, f->hm1, f->hm2 };

		for (int i = 0; i < 4; i++) {
			if (h[i] != d[i])
				hp_free(h[i]);
			bk->free(bk, d[i]);
		}
		bk->free(bk, f->buf);
		for (int i = 0; f->slots && i < f->nslots; i++) {
			bk->free(bk, f->slots[i].buf);
			bk->free(bk, f->slots[i].send);
			bk->req_free(bk, &f->slots[i].req);
		}
		bk->req_free(bk, &f->root_slot.req);   /* its buffers are buf */
		bk->free(bk, f->rs[1].buf);
		for (int i = 0; i < HP_FSDP_RS_RING; i++)
			bk->req_free(bk, &f->rs[i].req);
		bk->free(bk, f->stale);
	}
	hp_free(f->layer_unit);
	hp_free(f->expert_unit);
	hp_free(f->slots);
	memset(f, 0, sizeof(*f));
}

/* Rows of the chunk group rank s holds of a piece, in a group of k. */
static int64_t rows_of(const struct hp_piece *pc, int s)
{
	int64_t r = pc->rows - (int64_t)s * pc->chunk;

	return r < 0 ? 0 : r > pc->chunk ? pc->chunk : r;
}

/* The next span of unit u's params from its param *j on, in the model's
 * flat arrays: its offset, and its length (returned); *j moves past it.
 * For the weights (grads 0), a weight that only GEMMs read on a device is
 * a span of its own, held in the working copy alone (*conly 1, f->conly);
 * the others form runs of params that follow each other.  A layer's
 * params are one run; the root's are not (the embedding leads the arrays,
 * the final norm and the head end them), and what lies between is the
 * layers'. */
static size_t span_at(const struct hp_fsdp *f, int u, int grads, int *j, size_t *off, int *conly)
{
	const struct hp_fsdp_unit *un = &f->units[u];
	int i = f->order[un->first + *j];
	const struct hp_param *mp = f->mp[i];
	size_t end = mp->offset + mp->numel;

	*off = mp->offset;
	*conly = !grads && f->conly[i];
	for (++*j; !*conly && *j < un->n; ++*j) {
		i = f->order[un->first + *j];
		mp = f->mp[i];
		if ((!grads && f->conly[i]) || mp->offset != end)
			break;
		end += mp->numel;
	}
	return end - *off;
}

/* Unit un's gathered chunks (k blocks of padded elements of the param
 * dtype in buf) into the model's weights, whose working copy follows (a
 * weight only GEMMs read: into its working copy alone). */
static void unpack_unit(struct hp_fsdp *f, int u, const void *buf)
{
	const struct hp_fsdp_unit *un = &f->units[u];
	int k = f->cs->dim[un->shard_dim].size, conly;
	size_t off, n;
	struct hp_err e;

	for (int s = 0; s < k; s++)
		for (int j = 0; j < un->n; j++) {
			int i = f->order[un->first + j];
			const struct hp_piece *pc = &f->pc[i];
			float *w = f->m->w.bw + f->mp[i]->offset + (int64_t)s * pc->chunk * pc->cols;
			const void *src = at(f, buf, f->pdt, (size_t)s * un->padded + (f->poff[i] - un->off));
			size_t len = (size_t)(rows_of(pc, s) * pc->cols);

			if (f->conly[i])
				f->bk->copy_only(f->bk, w, len, 0, src, f->pdt, &e);
			else
				f->bk->convert(f->bk, w, HP_DTYPE_F32, src, f->pdt, len);
		}
	for (int j = 0; j < un->n;) {
		n = span_at(f, u, 0, &j, &off, &conly);
		if (!conly)
			f->bk->weights_changed(f->bk, f->m->w.bw + off, n);
	}
}

/* A buffer's first used bytes were just used: what lies beyond the keep
 * bytes every layer uses goes back (a page fault per page is dear on every
 * layer, cheap once per micro-batch). */
static void trim(struct hp_fsdp *f, void *buf, size_t used, size_t keep)
{
	if (used > keep)
		f->bk->discard(f->bk, (char *)buf + keep, used - keep);
}

/* Finish the reduce-scatter in flight in s: wait for it, add what it
 * brought to its unit's shard sums. */
static int rs_finish(struct hp_fsdp *f, struct hp_fsdp_rs *s, struct hp_err *e)
{
	const struct hp_fsdp_unit *un;
	struct hp_backend *bk = f->bk;
	int k, rc;

	if (s->unit < 0)
		return 0;
	un = &f->units[s->unit];
	k = f->cs->dim[un->shard_dim].size;
	s->unit = -1;
	if ((rc = bk->wait(bk, &s->req, e)))
		return rc;
	bk->acc(bk, f->g + un->off, at(f, s->buf, f->rdt, (size_t)k * un->padded), f->rdt, un->padded);
	if (s->buf == f->buf)
		trim(f, f->buf, (size_t)(k + 1) * un->padded * bk->esize(bk, f->rdt), f->steady_rs);
	return 0;
}

/* Every reduce-scatter in flight finished, oldest first. */
static int rs_drain(struct hp_fsdp *f, struct hp_err *e)
{
	int rc = 0;

	for (int i = 0; i < f->nrs && !rc; i++)
		rc = rs_finish(f, &f->rs[(f->rsi + i) % f->nrs], e);
	return rc;
}

/* Reduce-scatter unit u's gradients into the shard sums, in the reduce
 * dtype: a layer's is started in the ring's next buffer (finishing the
 * one started there before), the root's (in buf) after the ring is done. */
int hp_fsdp_reduce_scatter_unit(struct hp_fsdp *f, int u, struct hp_err *e)
{
	const struct hp_fsdp_unit *un = &f->units[u];
	struct hp_comm *c = &f->cs->dim[un->shard_dim];
	struct hp_backend *bk = f->bk;
	struct hp_fsdp_rs *s;
	int k = c->size, rc;

	/* a unit with nothing on this rank (a pipeline stage's root unit
	 * without the embedding or the head) moves nothing; the root's end
	 * of the micro-batch still drains the ring */
	if (!un->padded)
		return un->root ? rs_drain(f, e) : 0;
	if (un->root || f->nrs == 1) {
		if ((rc = rs_drain(f, e)))
			return rc;
		s = &f->rs[0];
	} else {
		s = &f->rs[f->rsi];
		f->rsi = (f->rsi + 1) % f->nrs;
		if ((rc = rs_finish(f, s, e)))
			return rc;
	}
	/* block r: every param's rows of rank r, padded to the chunk */
	for (int r = 0; r < k; r++)
		for (int j = 0; j < un->n; j++) {
			int i = f->order[un->first + j];
			const struct hp_piece *pc = &f->pc[i];
			int64_t rows = rows_of(pc, r);
			size_t b = (size_t)r * un->padded + (f->poff[i] - un->off);

			bk->convert(bk, at(f, s->buf, f->rdt, b), f->rdt,
				    f->m->w.bg + f->mp[i]->offset + (int64_t)r * pc->chunk * pc->cols, HP_DTYPE_F32,
				    (size_t)(rows * pc->cols));
			bk->zero(bk, at(f, s->buf, f->rdt, b + (size_t)(rows * pc->cols)),
				 (size_t)((pc->chunk - rows) * pc->cols) * bk->esize(bk, f->rdt));
		}
	/* packed: the unit's unsharded gradients go back before the sum */
	hp_fsdp_release(f, u, 1);
	if ((rc = bk->ireduce_scatter(bk, c, s->buf, at(f, s->buf, f->rdt, (size_t)k * un->padded), un->padded,
				      f->rdt, HP_RED_SUM, &s->req, e)))
		return rc;
	s->unit = u;
	return un->root || f->nrs == 1 ? rs_finish(f, s, e) : 0;
}

int hp_fsdp_sync_replicas(struct hp_fsdp *f, struct hp_err *e)
{
	struct hp_backend *bk = f->bk;

	for (int u = 0; u < f->nunits; u++) {
		const struct hp_fsdp_unit *un = &f->units[u];
		struct hp_comm *c = &f->cs->dim[un->rep_dim];
		float *g = f->g + un->off;
		int rc;

		if (!un->padded)
			continue;
		if (f->rdt == HP_DTYPE_F32) {
			if ((rc = bk->allreduce(bk, c, g, un->padded, HP_DTYPE_F32, HP_RED_SUM, e)))
				return rc;
			continue;
		}
		/* in the reduce dtype, as the reduce-scatter */
		if (c->size <= 1)
			continue;
		bk->convert(bk, f->buf, f->rdt, g, HP_DTYPE_F32, un->padded);
		if ((rc = bk->allreduce(bk, c, f->buf, un->padded, f->rdt, HP_RED_SUM, e)))
			return rc;
		bk->convert(bk, g, HP_DTYPE_F32, f->buf, f->rdt, un->padded);
	}
	return 0;
}

int hp_fsdp_sync_tied(struct hp_fsdp *f, struct hp_err *e)
{
	const struct hp_plan_param *q = &f->p->params[0];   /* the embedding: the first parameter */
	struct hp_comm *c = &f->cs->dim[HP_DIM_PP];
	size_t n = (size_t)(f->pc[0].chunk * f->pc[0].cols);
	float *g = f->mp[0] ? f->g + f->poff[0] : (float *)f->buf;

	if (q->stage2 < 0 || c->size <= 1)
		return 0;
	/* a stage between the two adds nothing (its buf is large enough: hp_plan_fsdp_bytes) */
	if (!f->mp[0])
		f->bk->zero(f->bk, g, n * sizeof(float));
	return f->bk->allreduce(f->bk, c, g, n, HP_DTYPE_F32, HP_RED_SUM, e);
}

/* Pack (dir 0) or unpack (1) the shard sums of the tp-partial parameters,
 * in the reduce dtype, or only count them (-1); their elements. */
static size_t tp_partials(struct hp_fsdp *f, int dir)
{
	size_t n = 0;

	for (int i = 0; i < f->p->nparams; i++) {
		size_t len = (size_t)(f->pc[i].chunk * f->pc[i].cols);

		if (!f->mp[i] || !hp_plan_tp_partial(f->p, &f->p->params[i]))
			continue;
		if (dir == 0)
			f->bk->convert(f->bk, at(f, f->buf, f->rdt, n), f->rdt, f->g + f->poff[i], HP_DTYPE_F32, len);
		else if (dir == 1)
			f->bk->convert(f->bk, f->g + f->poff[i], HP_DTYPE_F32, at(f, f->buf, f->rdt, n), f->rdt, len);
		n += len;
	}
	return n;
}

int hp_fsdp_sync_tp(struct hp_fsdp *f, struct hp_err *e)
{
	size_t n = tp_partials(f, 0);
	int rc;

	if (!n)
		return 0;
	if ((rc = f->bk->allreduce(f->bk, &f->cs->dim[HP_DIM_TP], f->buf, n, f->rdt, HP_RED_SUM, e)))
		return rc;
	tp_partials(f, 1);
	return 0;
}

/* Whether this rank's copy of plan param i is the one that counts (the
 * others are identical replicas): the first replica, and for a weight
 * replicated over tp, tp rank 0. */
static int canonical(const struct hp_fsdp *f, int i)
{
	const struct hp_plan *p = f->p;
	const struct hp_plan_param *q = &p->params[i];

	if (q->stage != hp_plan_stage(p, f->rank))   /* the last stage's copy of a tied embedding */
		return 0;
	if (q->mesh == HP_MESH_EXPERT)
		return hp_mesh_coord(p->size, HP_DIM_EDP_REPLICATE, f->rank) == 0;
	if (hp_mesh_coord(p->size, HP_DIM_DP_REPLICATE, f->rank))
		return 0;
	return q->pl[HP_DIM_TP].kind == HP_PL_SHARD || hp_mesh_coord(p->size, HP_DIM_TP, f->rank) == 0;
}

/*
 * The shards as the optimizer's store.  The norm counts each distinct piece
 * once (replicas hold the same sums); pieces that follow each other in the
 * shards are summed in one call, in the same order as piece by piece.
 * AdamW runs over pieces that follow each other and share the decay flag
 * (element-wise; the padding between pieces is zero and stays zero).
 */
int hp_fsdp_store(struct hp_fsdp *f, struct hp_store *s, struct hp_err *e)
{
	size_t run0 = 0, run = 0;
	int rc;

	*s = (struct hp_store){ .bk = f->bk, .w = f->w, .g = f->g, .m1 = f->m1, .m2 = f->m2, .total = f->total,
				.world = &f->cs->dim[HP_COMM_WORLD] };
	for (int i = 0; i <= f->p->nparams; i++) {
		int last = i == f->p->nparams;
		size_t n = last ? 0 : (size_t)(f->pc[i].chunk * f->pc[i].cols);

		if (!last && (!f->mp[i] || !canonical(f, i)))
			continue;
		if (!last && run && run0 + run == f->poff[i]) {
			run += n;
			continue;
		}
		if (run && (rc = hp_store_add_run(&s->norm, &s->nnorm, run0, run, 0, e)))
			goto fail;
		run0 = last ? 0 : f->poff[i];
		run = n;
	}
	for (int i = 0, j; i < f->p->nparams; i = j) {
		size_t off, n;
		int decay;

		if (!f->mp[i]) {
			j = i + 1;
			continue;
		}
		off = f->poff[i];
		n = (size_t)(f->pc[i].chunk * f->pc[i].cols);
		decay = f->mp[i]->decay;
		for (j = i + 1; j < f->p->nparams && f->mp[j] && f->mp[j]->decay == decay && f->poff[j] == off + n; j++)
			n += (size_t)(f->pc[j].chunk * f->pc[j].cols);
		if ((rc = hp_store_add_run(&s->upd, &s->nupd, off, n, decay, e)))
			goto fail;
	}
	return 0;
fail:
	hp_store_free(s);
	return rc;
}

void hp_fsdp_piece_into(struct hp_fsdp *f, int i, enum hp_fsdp_which which, float *dst)
{
	const struct hp_plan_param *q = &f->p->params[i];
	const struct hp_piece *pc = &f->pc[i];
	int64_t cols = q->ndim > 1 ? q->shape[1] : 1;
	const float *const arrs[] = { f->hw, f->hg, f->hm1, f->hm2 };
	const float *src = arrs[which] + f->poff[i];

	if (f->mp[i] && canonical(f, i))
		for (int64_t r = 0; r < pc->nrows; r++)
			memcpy(dst + (pc->row0 + r) * cols + pc->col0, src + r * pc->cols,
			       (size_t)pc->cols * sizeof(float));
}

int hp_fsdp_global(struct hp_fsdp *f, int i, enum hp_fsdp_which which, float *dst, struct hp_err *e)
{
	const struct hp_plan_param *q = &f->p->params[i];
	size_t n = (size_t)(q->shape[0] * (q->ndim > 1 ? q->shape[1] : 1));

	memset(dst, 0, n * sizeof(float));
	hp_fsdp_piece_into(f, i, which, dst);
	return hp_comm_allreduce(&f->cs->dim[HP_COMM_WORLD], dst, n, HP_DTYPE_F32, HP_RED_SUM, e);
}

void hp_fsdp_before_update(struct hp_fsdp *f)
{
	const struct hp_fsdp_unit *un;
	struct hp_backend *bk = f->bk;
	struct hp_err e;

	if (f->stale_unit < 0)
		return;
	/* the fault (fsdp_stale_shard): keep this step's shard of the unit for the next */
	un = &f->units[f->stale_unit];
	if (!f->stale)
		f->stale = bk->alloc(bk, (un->padded + 1) * sizeof(float), &e);
	if (f->stale)
		bk->copy(bk, f->stale, f->w + un->off, un->padded * sizeof(float));
}

/* --- just in time: one unit at a time -------------------------------------- */

/* Unit u's weights (grads 0) or gradients in the model, with memory behind
 * them (backend.h, reserve) until hp_fsdp_release: before a gather
 * writes the weights, before the backward accumulates the gradients. */
static int hold(struct hp_fsdp *f, int u, int grads, struct hp_err *e)
{
	struct hp_fsdp_unit *un = &f->units[u];
	float *base = grads ? f->m->w.bg : f->m->w.bw;
	size_t off, n;
	int rc, conly;

	if (un->held[grads])
		return 0;
	for (int j = 0, k = 0; j < un->n; k = j) {
		n = span_at(f, u, grads, &j, &off, &conly);
		rc = conly ? f->bk->copy_only(f->bk, base + off, n, 1, NULL, HP_DTYPE_F32, e) :
		     f->bk->commit(f->bk, base + off, n * sizeof(float), e);
		if (!rc && conly)
			rc = hp_err_set(e, HP_EINVAL, "FSDP: %s keeps no working copy of unit %d's weights",
					f->bk->name, u);
		if (rc < 0 || (rc > 0 && !conly)) {
			/* what this one committed goes back */
			for (int i = 0; i < k;) {
				n = span_at(f, u, grads, &i, &off, &conly);
				if (conly)
					f->bk->copy_only(f->bk, base + off, n, -1, NULL, HP_DTYPE_F32, e);
				else
					f->bk->release(f->bk, base + off, n * sizeof(float));
			}
			return rc;
		}
	}
	un->held[grads] = 1;
	return 0;
}

void hp_fsdp_release(struct hp_fsdp *f, int u, int grads)
{
	struct hp_fsdp_unit *un = &f->units[u];
	float *base = grads ? f->m->w.bg : f->m->w.bw;
	size_t off, n;
	int conly;
	struct hp_err e;

	if (!un->held[grads])
		return;
	for (int j = 0; j < un->n;) {
		n = span_at(f, u, grads, &j, &off, &conly);
		if (conly)
			f->bk->copy_only(f->bk, base + off, n, -1, NULL, HP_DTYPE_F32, &e);
		else
			f->bk->release(f->bk, base + off, n * sizeof(float));
	}
	un->held[grads] = 0;
}

/* The units of layer l: its own, then its experts' (or -1). */
static void layer_units(const struct hp_fsdp *f, int l, int us[2])
{
	us[0] = f->layer_unit[l];
	us[1] = f->expert_unit[l];
}

static struct hp_fsdp_slot *slot_of(struct hp_fsdp *f, int u)
{
	if (f->root_slot.unit == u)
		return &f->root_slot;
	for (int i = 0; i < f->nslots; i++)
		if (f->slots[i].unit == u)
			return &f->slots[i];
	return NULL;
}

/* Start unit u's all-gather into a free slot of the ring (prefetch), in
 * the param dtype. */
static int start_gather(struct hp_fsdp *f, int u, struct hp_err *e)
{
	const struct hp_fsdp_unit *un = &f->units[u];
	struct hp_backend *bk = f->bk;
	struct hp_fsdp_slot *sl = NULL;
	const float *shard = u == f->stale_unit && f->stale ? f->stale : f->w + un->off;
	const void *send = shard;

	if (slot_of(f, u) || !un->padded)
		return 0;
	if (un->root) {   /* into buf: k blocks gathered, the shard to send after them */
		sl = &f->root_slot;
		sl->buf = f->buf;
		sl->send = at(f, f->buf, f->pdt, (size_t)f->cs->dim[un->shard_dim].size * un->padded);
	}
	for (int i = 0; i < f->nslots && !sl; i++)
		if (f->slots[i].unit < 0)
			sl = &f->slots[i];
	if (!sl)
		return hp_err_set(e, HP_EINVAL, "FSDP: no free prefetch slot for unit %d", u);
	if (!sl->buf && !(sl->buf = bk->alloc_as(bk, f->bytes.slot + 8, f->gpu_bytes.slot + 8, e)))
		return e->code;
	if (f->pdt != HP_DTYPE_F32) {
		if (!sl->send && !(sl->send = bk->alloc_as(bk, f->bytes.send + 8, f->gpu_bytes.send + 8, e)))
			return e->code;
		bk->convert(bk, sl->send, f->pdt, shard, HP_DTYPE_F32, un->padded);
		send = sl->send;
	}
	sl->unit = u;
	return bk->iallgather(bk, &f->cs->dim[un->shard_dim], send, sl->buf, un->padded, f->pdt, &sl->req, e);
}

/* Unit u in the model's tensors: its gather (started now if it was not
 * prefetched) waited for and unpacked. */
static int finish_gather(struct hp_fsdp *f, int u, struct hp_err *e)
{
	struct hp_fsdp_slot *sl;
	int rc;

	if (!f->units[u].padded)
		return 0;
	if ((rc = start_gather(f, u, e)))
		return rc;
	sl = slot_of(f, u);
	if ((rc = f->bk->wait(f->bk, &sl->req, e)) || (rc = hold(f, u, 0, e)))
		return rc;
	unpack_unit(f, u, sl->buf);
	if (sl == &f->root_slot)
		trim(f, f->buf, (size_t)(f->cs->dim[f->units[u].shard_dim].size + 1) * f->units[u].padded *
		     f->bk->esize(f->bk, f->pdt), f->steady_rs);
	sl->unit = -1;
	return 0;
}

int hp_fsdp_gather_unit(struct hp_fsdp *f, int u, struct hp_err *e)
{
	return finish_gather(f, u, e);
}

/* Gather layer l's units, then start those of the next depth layers in
 * the direction dir (+1 forward, -1 backward) that the pass runs (a
 * pipeline chunk's: the model's current layers). */
static int gather_layer(struct hp_fsdp *f, int l, int dir, long depth, struct hp_err *e)
{
	int us[2], rc;

	layer_units(f, l, us);
	for (int k = 0; k < 2; k++)
		if (us[k] >= 0) {
			f->gathers++;
			f->prefetched += slot_of(f, us[k]) != NULL;
			if ((rc = finish_gather(f, us[k], e)))
				return rc;
		}
	for (long d = 1; d <= depth; d++) {
		long m = l + dir * d;

		if (m < f->m->par.l0 || m >= f->m->par.l1)
			break;
		layer_units(f, (int)m, us);
		for (int k = 0; k < 2; k++)
			if (us[k] >= 0 && (rc = start_gather(f, us[k], e)))
				return rc;
	}
	return 0;
}

int hp_fsdp_micro_begin(struct hp_fsdp *f, int first, struct hp_err *e)
{
	/* the root unit (embedding, final norm, LM head) stays gathered through
	 * the backward; the layers come and go through the model's hook */
	int rc;

	f->first_micro = first;
	if ((rc = hold(f, 0, 1, e)))
		return rc;
	/* a pipeline stage begins a micro-batch's forward and, later, its
	 * backward: the second finds the weights still there, unless an
	 * earlier backward has resharded them */
	return first || (f->p->reshard_after_backward && !f->units[0].held[0]) ? hp_fsdp_gather_unit(f, 0, e) : 0;
}

void hp_fsdp_set_sync(struct hp_fsdp *f, int last_micro)
{
	f->sync = f->p->grad_sync || last_micro;
}

int hp_fsdp_micro_end(struct hp_fsdp *f, int root, struct hp_err *e)
{
	int rc;

	if (!root)
		return rs_drain(f, e);
	rc = f->sync ? hp_fsdp_reduce_scatter_unit(f, 0, e) : 0;

	if (!rc && f->p->reshard_after_backward)
		hp_fsdp_release(f, 0, 0);
	return rc;
}

int hp_fsdp_hook(void *ctx, int l, int phase, struct hp_err *e)
{
	struct hp_fsdp *f = ctx;
	int us[2], rc, raf = f->p->reshard_after_forward, rab = f->p->reshard_after_backward;

	switch (phase) {
	case HP_HOOK_PRE_FORWARD:
		/* without reshard_after_backward a layer stays gathered from the
		 * step's first forward on */
		return f->first_micro || rab ? gather_layer(f, l, 1, f->p->forward_prefetch, e) : 0;
	case HP_HOOK_PRE_BACKWARD:
		layer_units(f, l, us);
		for (int k = 0; k < 2; k++)
			if (us[k] >= 0 && (rc = hold(f, us[k], 1, e)))
				return rc;
		return raf ? gather_layer(f, l, -1, f->p->backward_prefetch, e) : 0;
	default:
		break;
	}
	layer_units(f, l, us);
	for (int k = 0; k < 2; k++) {
		int u = us[k];

		if (u < 0)
			continue;
		if (phase == HP_HOOK_POST_FORWARD) {
			if (raf)
				hp_fsdp_release(f, u, 0);
			continue;
		}
		/* deferred: the gradients stay, the next backward adds to them */
		if (f->sync && (rc = hp_fsdp_reduce_scatter_unit(f, u, e)))
			return rc;
		if (rab)
			hp_fsdp_release(f, u, 0);
	}
	return 0;
}
