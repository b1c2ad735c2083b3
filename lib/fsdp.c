/*
 * fsdp.c - sharded parameters, gradients and optimizer state over the FSDP
 * dims of a plan (see fsdp.h).  The shard arrays hold, unit after unit,
 * each parameter's chunk of rows padded to the chunk (padding stays zero),
 * so that a unit's shard is one contiguous run: the send buffer of its
 * all-gather and the target of its replica all-reduce.
 */
#include <math.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloc.h"
#include "fsdp.h"
#include "shard.h"

int hp_fsdp_init(struct hp_fsdp *f, const struct hp_plan *p, struct hp_comms *cs, struct hp_model *m,
		 struct hp_err *e)
{
	size_t maxbuf = 0;
	int at = 0;

	memset(f, 0, sizeof(*f));
	f->p = p;
	f->cs = cs;
	f->m = m;
	f->rank = cs->world_rank;
	f->stale_unit = -1;
	f->units = hp_calloc((size_t)p->nunits, sizeof(*f->units));
	f->order = hp_calloc((size_t)p->nparams, sizeof(int));
	f->poff = hp_calloc((size_t)p->nparams, sizeof(size_t));
	f->mp = hp_calloc((size_t)p->nparams, sizeof(*f->mp));
	f->pc = hp_calloc((size_t)p->nparams, sizeof(*f->pc));
	if (!f->units || !f->order || !f->poff || !f->mp || !f->pc)
		goto oom;
	/* the model holds this rank's tp-local tensors and its own experts, in
	 * the plan's order */
	for (int i = 0, j = 0; i < p->nparams; i++) {
		const struct hp_plan_param *q = &p->params[i];

		hp_plan_piece(p, q, f->rank, &f->pc[i]);
		if (!hp_plan_owns(p, q, f->rank))
			continue;
		if (j >= m->nparams || strcmp(m->params[j].name, q->name))
			return hp_err_set(e, HP_EINVAL, "parameter '%s' of the plan is not the model's "
					  "parameter %d ('%s')", q->name, j, j < m->nparams ? m->params[j].name : "");
		if ((int64_t)m->params[j].numel != f->pc[i].rows * f->pc[i].cols)
			return hp_err_set(e, HP_EINVAL, "parameter '%s': the model holds %zu elements, the "
					  "plan's piece %lld", q->name, m->params[j].numel,
					  (long long)(f->pc[i].rows * f->pc[i].cols));
		f->mp[i] = &m->params[j++];
	}
	f->nunits = p->nunits;
	for (int u = 0; u < p->nunits; u++) {
		struct hp_fsdp_unit *un = &f->units[u];
		int k;

		un->shard_dim = p->units[u].mesh == HP_MESH_EXPERT ? HP_DIM_EDP_SHARD : HP_DIM_DP_SHARD;
		un->rep_dim = p->units[u].mesh == HP_MESH_EXPERT ? HP_DIM_EDP_REPLICATE : HP_DIM_DP_REPLICATE;
		un->root = u == 0;
		un->first = at;
		un->off = f->total;
		k = p->size[un->shard_dim];
		for (int i = 0; i < p->nparams; i++) {
			if (p->params[i].unit != u || !f->mp[i])
				continue;
			f->order[at++] = i;
			f->poff[i] = f->total;
			f->total += (size_t)(f->pc[i].chunk * f->pc[i].cols);
		}
		un->n = at - un->first;
		un->padded = f->total - un->off;
		if ((size_t)(k + 1) * un->padded > maxbuf)
			maxbuf = (size_t)(k + 1) * un->padded;
	}
	if (f->total > maxbuf)
		maxbuf = f->total;   /* the tp all-reduce of partial gradients packs there */
	/* the prefetch ring: a layer's units (its own and its experts') for the
	 * layer in hand and each one fetched ahead */
	f->nslots = 2 * (1 + (int)(p->forward_prefetch > p->backward_prefetch ? p->forward_prefetch :
				    p->backward_prefetch));
	f->slots = hp_calloc((size_t)f->nslots, sizeof(*f->slots));
	if (!f->slots)
		goto oom;
	for (int i = 0; i < f->nslots; i++) {
		f->slots[i].unit = -1;
		f->slots[i].req = MPI_REQUEST_NULL;
	}
	f->slot_floats = 0;
	for (int u = 0; u < p->nunits; u++) {
		size_t n = (size_t)p->size[f->units[u].shard_dim] * f->units[u].padded;
		if (n > f->slot_floats)
			f->slot_floats = n;
	}
	f->w = hp_calloc(f->total + 1, sizeof(float));
	f->g = hp_calloc(f->total + 1, sizeof(float));
	f->m1 = hp_calloc(f->total + 1, sizeof(float));
	f->m2 = hp_calloc(f->total + 1, sizeof(float));
	f->buf = hp_calloc(maxbuf + 1, sizeof(float));
	f->layer_unit = hp_calloc((size_t)p->spec.n_layers + 1, sizeof(int));
	f->expert_unit = hp_calloc((size_t)p->spec.n_layers + 1, sizeof(int));
	if (!f->w || !f->g || !f->m1 || !f->m2 || !f->buf || !f->layer_unit || !f->expert_unit)
		goto oom;
	for (int l = 0; l < p->spec.n_layers; l++)
		f->layer_unit[l] = f->expert_unit[l] = -1;
	for (int u = 1; u < p->nunits; u++) {
		int l, n = 0;

		if (sscanf(p->units[u].name, "model.layers.%d%n", &l, &n) != 1 || l < 0 || l >= p->spec.n_layers)
			continue;
		if (p->units[u].name[n])
			f->expert_unit[l] = u;
		else
			f->layer_unit[l] = u;
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
		    (rc = hp_src_read(src, i, pc->row0, pc->nrows, pc->col0, pc->cols, f->w + f->poff[i], e)))
			return rc;
	}
	return 0;
}

int hp_fsdp_load_model(struct hp_fsdp *f)
{
	for (int i = 0; i < f->p->nparams; i++) {
		const struct hp_piece *pc = &f->pc[i];

		if (f->mp[i])
			memcpy(f->w + f->poff[i], f->mp[i]->w + pc->first * pc->cols,
			       (size_t)(pc->nrows * pc->cols) * sizeof(float));
	}
	return 0;
}

void hp_fsdp_free(struct hp_fsdp *f)
{
	hp_free(f->units);
	hp_free(f->order);
	hp_free(f->poff);
	hp_free(f->mp);
	hp_free(f->pc);
	hp_free(f->w);
	hp_free(f->g);
	hp_free(f->m1);
	hp_free(f->m2);
	hp_free(f->buf);
	hp_free(f->layer_unit);
	hp_free(f->expert_unit);
	for (int i = 0; f->slots && i < f->nslots; i++)
		hp_free(f->slots[i].buf);
	hp_free(f->slots);
	hp_free(f->stale);
	memset(f, 0, sizeof(*f));
}

/* Rows of the chunk group rank s holds of a piece, in a group of k. */
static int64_t rows_of(const struct hp_piece *pc, int s)
{
	int64_t r = pc->rows - (int64_t)s * pc->chunk;

	return r < 0 ? 0 : r > pc->chunk ? pc->chunk : r;
}

/* Unit un's gathered chunks (k blocks of padded floats in buf) into the
 * model's weights. */
static void unpack_unit(struct hp_fsdp *f, const struct hp_fsdp_unit *un, const float *buf)
{
	int k = f->cs->dim[un->shard_dim].size;

	for (int s = 0; s < k; s++)
		for (int j = 0; j < un->n; j++) {
			int i = f->order[un->first + j];
			const struct hp_piece *pc = &f->pc[i];

			memcpy(f->mp[i]->w + (int64_t)s * pc->chunk * pc->cols,
			       buf + (size_t)s * un->padded + (f->poff[i] - un->off),
			       (size_t)(rows_of(pc, s) * pc->cols) * sizeof(float));
		}
}

void hp_fsdp_zero_grad(struct hp_fsdp *f)
{
	memset(f->g, 0, f->total * sizeof(float));
}

/* Reduce-scatter unit u's gradients into the shard sums. */
static int rs_unit(struct hp_fsdp *f, int u, struct hp_err *e)
{
	const struct hp_fsdp_unit *un = &f->units[u];
	struct hp_comm *c = &f->cs->dim[un->shard_dim];
	int k = c->size, rc;
	float *out = f->buf + (size_t)k * un->padded;

	/* block s: every param's rows of rank s, padded to the chunk */
	for (int s = 0; s < k; s++)
		for (int j = 0; j < un->n; j++) {
			int i = f->order[un->first + j];
			const struct hp_piece *pc = &f->pc[i];
			int64_t r = rows_of(pc, s);
			float *b = f->buf + (size_t)s * un->padded + (f->poff[i] - un->off);

			memcpy(b, f->mp[i]->g + (int64_t)s * pc->chunk * pc->cols, (size_t)(r * pc->cols) * sizeof(float));
			memset(b + r * pc->cols, 0, (size_t)((pc->chunk - r) * pc->cols) * sizeof(float));
		}
	if ((rc = hp_comm_reduce_scatter(c, f->buf, out, un->padded, HP_DTYPE_F32, HP_RED_SUM, e)))
		return rc;
	for (size_t x = 0; x < un->padded; x++)
		f->g[un->off + x] += out[x];
	return 0;
}

int hp_fsdp_sync_replicas(struct hp_fsdp *f, struct hp_err *e)
{
	for (int u = 0; u < f->nunits; u++) {
		const struct hp_fsdp_unit *un = &f->units[u];
		int rc = hp_comm_allreduce(&f->cs->dim[un->rep_dim], f->g + un->off, un->padded, HP_DTYPE_F32,
					   HP_RED_SUM, e);

		if (rc)
			return rc;
	}
	return 0;
}

/* Pack (dir 0) or unpack the shard sums of the tp-partial parameters. */
static size_t tp_partials(struct hp_fsdp *f, int dir)
{
	size_t n = 0;

	for (int i = 0; i < f->p->nparams; i++) {
		size_t len = (size_t)(f->pc[i].chunk * f->pc[i].cols);

		if (!f->mp[i] || !hp_plan_tp_partial(f->p, &f->p->params[i]))
			continue;
		if (dir == 0)
			memcpy(f->buf + n, f->g + f->poff[i], len * sizeof(float));
		else
			memcpy(f->g + f->poff[i], f->buf + n, len * sizeof(float));
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
	if ((rc = hp_comm_allreduce(&f->cs->dim[HP_DIM_TP], f->buf, n, HP_DTYPE_F32, HP_RED_SUM, e)))
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

	if (q->mesh == HP_MESH_EXPERT)
		return hp_plan_coord(p, HP_DIM_EDP_REPLICATE, f->rank) == 0;
	if (hp_plan_coord(p, HP_DIM_DP_REPLICATE, f->rank))
		return 0;
	return q->pl[HP_DIM_TP].kind == HP_PL_SHARD || hp_plan_coord(p, HP_DIM_TP, f->rank) == 0;
}

double hp_fsdp_grad_norm(struct hp_fsdp *f, struct hp_err *e)
{
	double ss = 0;

	/* each distinct piece once: replicas hold the same sums */
	for (int i = 0; i < f->p->nparams; i++) {
		const float *g = f->g + f->poff[i];
		size_t n = (size_t)(f->pc[i].chunk * f->pc[i].cols);

		if (!f->mp[i] || !canonical(f, i))
			continue;
		for (size_t x = 0; x < n; x++)
			ss += (double)g[x] * g[x];
	}
	if (hp_comm_allreduce(&f->cs->dim[HP_COMM_WORLD], &ss, 1, HP_DTYPE_F64, HP_RED_SUM, e))
		return NAN;
	return sqrt(ss);
}

void hp_fsdp_piece_into(struct hp_fsdp *f, int i, enum hp_fsdp_which which, float *dst)
{
	const struct hp_plan_param *q = &f->p->params[i];
	const struct hp_piece *pc = &f->pc[i];
	int64_t cols = q->ndim > 1 ? q->shape[1] : 1;
	const float *const arr[] = { f->w, f->g, f->m1, f->m2 };
	const float *src = arr[which] + f->poff[i];

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

void hp_fsdp_clip(struct hp_fsdp *f, double norm, double max_norm)
{
	float coef;

	if (max_norm <= 0)
		return;
	coef = (float)(max_norm / (norm + 1e-6));   /* as hp_clip_grads: clip_grad_norm_ */
	if (coef >= 1.0f)
		return;
	for (size_t x = 0; x < f->total; x++)
		f->g[x] *= coef;
}

void hp_fsdp_adamw(struct hp_fsdp *f, struct hp_adamw_hparams *h)
{
	if (f->stale_unit >= 0) {
		/* the fault (fsdp_stale_shard): keep this step's shard of the unit for the next */
		const struct hp_fsdp_unit *un = &f->units[f->stale_unit];

		if (!f->stale)
			f->stale = hp_malloc((un->padded + 1) * sizeof(float));
		if (f->stale)
			memcpy(f->stale, f->w + un->off, un->padded * sizeof(float));
	}
	for (int i = 0; i < f->p->nparams; i++) {
		const struct hp_piece *pc = &f->pc[i];

		if (f->mp[i])
			hp_adamw_step(f->w + f->poff[i], f->g + f->poff[i], f->m1 + f->poff[i], f->m2 + f->poff[i],
				      (size_t)(pc->chunk * pc->cols), h, f->mp[i]->decay);
	}
}

/* --- just in time: one unit at a time -------------------------------------- */

/*
 * Zero n floats at p and give their whole pages back to the system
 * (MADV_DONTNEED on private anonymous memory reads back as zeros), so a
 * released unit costs no memory until it is gathered again.
 */
static void drop(float *p, size_t n)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p, b = (uintptr_t)(p + n);
	uintptr_t lo = (a + page - 1) & ~(page - 1), hi = b & ~(page - 1);

	if (hi <= lo || madvise((void *)lo, hi - lo, MADV_DONTNEED)) {
		memset(p, 0, n * sizeof(float));
		return;
	}
	memset(p, 0, lo - a);
	memset((void *)hi, 0, b - hi);
}

/* The unit's span of the model's flat arrays (its params are contiguous). */
static void span(const struct hp_fsdp *f, int u, size_t *off, size_t *n)
{
	const struct hp_fsdp_unit *un = &f->units[u];
	size_t lo = (size_t)-1, hi = 0;

	for (int j = 0; j < un->n; j++) {
		const struct hp_param *mp = f->mp[f->order[un->first + j]];

		if (mp->offset < lo)
			lo = mp->offset;
		if (mp->offset + mp->numel > hi)
			hi = mp->offset + mp->numel;
	}
	*off = un->n ? lo : 0;
	*n = un->n ? hi - lo : 0;
}

void hp_fsdp_release(struct hp_fsdp *f, int u, int grads)
{
	size_t off, n;

	span(f, u, &off, &n);
	drop((grads ? f->m->flat_g : f->m->flat_w) + off, n);
}


int hp_fsdp_reduce_scatter_unit(struct hp_fsdp *f, int u, struct hp_err *e)
{
	int rc = rs_unit(f, u, e);

	if (!rc)
		hp_fsdp_release(f, u, 1);
	return rc;
}

/* The units of layer l: its own, then its experts' (or -1). */
static void layer_units(const struct hp_fsdp *f, int l, int us[2])
{
	us[0] = f->layer_unit[l];
	us[1] = f->expert_unit[l];
}

static struct hp_fsdp_slot *slot_of(struct hp_fsdp *f, int u)
{
	for (int i = 0; i < f->nslots; i++)
		if (f->slots[i].unit == u)
			return &f->slots[i];
	return NULL;
}

/* Start unit u's all-gather into a free slot of the ring (prefetch). */
static int start_gather(struct hp_fsdp *f, int u, struct hp_err *e)
{
	const struct hp_fsdp_unit *un = &f->units[u];
	struct hp_fsdp_slot *sl = NULL;

	if (slot_of(f, u))
		return 0;
	for (int i = 0; i < f->nslots && !sl; i++)
		if (f->slots[i].unit < 0)
			sl = &f->slots[i];
	if (!sl)
		return hp_err_set(e, HP_EINVAL, "FSDP: no free prefetch slot for unit %d", u);
	if (!sl->buf && !(sl->buf = hp_malloc((f->slot_floats + 1) * sizeof(float))))
		return hp_err_set(e, HP_ENOMEM, "out of memory for the FSDP prefetch buffers");
	sl->unit = u;
	return hp_comm_iallgather(&f->cs->dim[un->shard_dim], u == f->stale_unit && f->stale ? f->stale :
				  f->w + un->off, sl->buf, un->padded, HP_DTYPE_F32, &sl->req, e);
}

/* Unit u in the model's tensors: its gather (started now if it was not
 * prefetched) waited for and unpacked. */
static int finish_gather(struct hp_fsdp *f, int u, struct hp_err *e)
{
	struct hp_fsdp_slot *sl;
	int rc;

	if ((rc = start_gather(f, u, e)))
		return rc;
	sl = slot_of(f, u);
	hp_comm_wait(&sl->req);
	unpack_unit(f, &f->units[u], sl->buf);
	sl->unit = -1;
	return 0;
}

int hp_fsdp_gather_unit(struct hp_fsdp *f, int u, struct hp_err *e)
{
	return finish_gather(f, u, e);
}

/* Gather layer l's units, then start those of the next depth layers in
 * the direction dir (+1 forward, -1 backward). */
static int gather_layer(struct hp_fsdp *f, int l, int dir, long depth)
{
	int us[2];

	layer_units(f, l, us);
	for (int k = 0; k < 2 && !f->rc; k++)
		if (us[k] >= 0) {
			f->gathers++;
			f->prefetched += slot_of(f, us[k]) != NULL;
			f->rc = finish_gather(f, us[k], f->e);
		}
	for (long d = 1; d <= depth && !f->rc; d++) {
		long m = l + dir * d;

		if (m < 0 || m >= f->p->spec.n_layers)
			break;
		layer_units(f, (int)m, us);
		for (int k = 0; k < 2 && !f->rc; k++)
			if (us[k] >= 0)
				f->rc = start_gather(f, us[k], f->e);
	}
	return f->rc;
}

int hp_fsdp_hook(void *ctx, int l, int phase)
{
	struct hp_fsdp *f = ctx;
	int us[2], raf = f->p->reshard_after_forward, rab = f->p->reshard_after_backward;

	switch (phase) {
	case HP_HOOK_PRE_FORWARD:
		return f->first_micro || rab ? gather_layer(f, l, 1, f->p->forward_prefetch) : f->rc;
	case HP_HOOK_PRE_BACKWARD:
		return raf ? gather_layer(f, l, -1, f->p->backward_prefetch) : f->rc;
	default:
		break;
	}
	layer_units(f, l, us);
	for (int k = 0; k < 2 && !f->rc; k++) {
		int u = us[k];

		if (u < 0)
			continue;
		if (phase == HP_HOOK_POST_FORWARD) {
			if (raf)
				hp_fsdp_release(f, u, 0);
			continue;
		}
		f->rc = hp_fsdp_reduce_scatter_unit(f, u, f->e);
		if (!f->rc && rab)
			hp_fsdp_release(f, u, 0);
	}
	return f->rc;
}
