/*
 * optim.c - zeroing, norm, clipping, schedules and AdamW over a parameter
 * store, on its backend (see optim.h).
 */
#include <math.h>

#include "base/alloc.h"
#include "dist/optim.h"
#include "model/params.h"

static int name_has(const char *name, const char *sub)
{
	return sub[0] && strcasestr(name, sub) != NULL;
}

/* The model-sized moments: not a store of shards' */
static void drop_moments(struct hp_optim *o)
{
	if (o->hm != o->m)
		hp_free(o->hm);
	if (o->hv != o->v)
		hp_free(o->hv);
	if (o->bk && o->m)
		o->bk->free(o->bk, o->m);
	if (o->bk && o->v)
		o->bk->free(o->bk, o->v);
	o->m = o->v = o->hm = o->hv = NULL;
}

int hp_store_add_run(struct hp_store_run **runs, int *n, size_t off, size_t len, int decay, struct hp_err *e)
{
	if (!(*n & (*n - 1))) {
		struct hp_store_run *x = hp_realloc(*runs, (size_t)(*n ? 2 * *n : 1) * sizeof(*x));

		if (!x)
			return hp_err_set(e, HP_ENOMEM, "out of memory for the optimizer's runs");
		*runs = x;
	}
	(*runs)[(*n)++] = (struct hp_store_run){ off, len, decay };
	return 0;
}

void hp_store_free(struct hp_store *s)
{
	hp_free(s->norm);
	hp_free(s->upd);
	memset(s, 0, sizeof(*s));
}

/*
 * The model's flat arrays: the norm over the whole array at once (the
 * padding between tensors is zero, and adding zeros leaves the sum's bits
 * alone), AdamW by runs of parameters alike in weight decay (element-wise;
 * the 16-float padding is zero in the weights, gradients and moments, and
 * stays zero).
 */
static int model_store(struct hp_optim *o, struct hp_model *m, struct hp_err *e)
{
	struct hp_store *s = &o->s;
	int rc;

	*s = (struct hp_store){ .bk = m->bk, .w = m->w.bw, .g = m->w.bg, .m1 = o->m, .m2 = o->v, .total = m->w.numel };
	if ((rc = hp_store_add_run(&s->norm, &s->nnorm, 0, m->w.numel, 0, e)))
		return rc;
	for (int i = 0, j; i < m->w.nparams; i = j) {
		const struct hp_param *p = &m->w.params[i];

		for (j = i + 1; j < m->w.nparams && m->w.params[j].decay == p->decay; j++)
			;
		size_t n = m->w.params[j - 1].offset + m->w.params[j - 1].numel - p->offset;
		if ((rc = hp_store_add_run(&s->upd, &s->nupd, p->offset, n, p->decay, e)))
			return rc;
	}
	return 0;
}

int hp_optim_init(struct hp_optim *o, struct hp_model *m, const struct hp_config *c, int moments,
		  struct hp_err *e)
{
	size_t bytes = m->w.numel * sizeof(float);

	memset(o, 0, sizeof(*o));
	o->bk = m->bk;
	if (moments && (!(o->m = o->bk->alloc(o->bk, bytes, e)) || !(o->v = o->bk->alloc(o->bk, bytes, e)))) {
		hp_optim_release(o);
		return hp_err_set(e, HP_ENOMEM, "out of memory for optimizer state (%zu MiB on %s)",
				  2 * bytes >> 20, m->bk->name);
	}
	o->hm = o->m;
	o->hv = o->v;
	if (moments && o->bk->device && (!(o->hm = hp_calloc(m->w.numel + 1, sizeof(float))) ||
			      !(o->hv = hp_calloc(m->w.numel + 1, sizeof(float))))) {
		hp_optim_release(o);
		return hp_err_set(e, HP_ENOMEM, "out of memory for the optimizer state's host copy");
	}
	o->hp.beta1 = c->optimizer.beta1;
	o->hp.beta2 = c->optimizer.beta2;
	o->hp.eps = c->optimizer.eps;
	o->hp.weight_decay = c->optimizer.weight_decay;
	o->style = c->lr_scheduler.style;
	o->lr_max = c->lr_scheduler.lr;   /* the config resolved it with adamw_lr */
	o->lr_min = c->lr_scheduler.min_lr;
	o->warmup = c->lr_scheduler.warmup_steps;
	o->total = c->training.train_iters;
	o->max_grad_norm = c->training.max_grad_norm;
	for (int i = 0; i < m->w.nparams; i++) {
		struct hp_param *p = &m->w.params[i];
		p->decay = !hp_param_frozen(p->name);   /* a buffer: never decayed, its gradient zero */
		for (int j = 0; j < c->optimizer.nno_decay_params; j++)
			if (name_has(p->name, c->optimizer.no_decay_params[j]))
				p->decay = 0;
	}
	if (moments && model_store(o, m, e)) {
		hp_optim_release(o);
		return e->code;
	}
	return 0;
}

void hp_optim_use(struct hp_optim *o, struct hp_store *s)
{
	drop_moments(o);
	hp_store_free(&o->s);
	o->s = *s;
	memset(s, 0, sizeof(*s));
}

void hp_optim_release(struct hp_optim *o)
{
	drop_moments(o);
	hp_store_free(&o->s);
}

int hp_optim_move(struct hp_optim *o, int to_host, struct hp_err *e)
{
	float *const d[2] = { o->m, o->v }, *const h[2] = { o->hm, o->hv };
	size_t numel = o->s.total;   /* model-sized moments: the model's store */
	int rc = 0;

	if (!o->bk || !o->bk->device || !o->m)
		return 0;
	for (int i = 0; i < 2 && !rc; i++)
		rc = to_host ? o->bk->download(o->bk, h[i], d[i], numel * sizeof(float), e) :
			       o->bk->upload(o->bk, d[i], h[i], numel * sizeof(float), e);
	return rc;
}

double hp_lr_at(const struct hp_optim *o, long s)
{
	double ratio;

	if (o->warmup > 0 && s <= o->warmup)
		return o->lr_max * (double)s / (double)o->warmup;
	if (o->style == HP_LR_CONSTANT || o->total <= o->warmup)
		return o->lr_max;
	ratio = (double)(s - o->warmup) / (double)(o->total - o->warmup);
	if (ratio > 1)
		ratio = 1;
	if (o->style == HP_LR_LINEAR)
		return o->lr_min + (o->lr_max - o->lr_min) * (1.0 - ratio);
	return o->lr_min + (o->lr_max - o->lr_min) * 0.5 * (1.0 + cos(M_PI * ratio));
}

void hp_optim_zero_grad(struct hp_optim *o)
{
	o->s.bk->zero(o->s.bk, o->s.g, o->s.total * sizeof(float));
}

int hp_optim_grad_sumsq(struct hp_optim *o, double *acc, struct hp_err *e)
{
	const struct hp_store *s = &o->s;
	int rc = 0, rc2;

	for (int i = 0; i < s->nnorm && !rc; i++)
		rc = s->bk->sumsq_acc(s->bk, acc, s->g + s->norm[i].off, s->norm[i].n, e);
	/* a backend failure still joins the all-reduce: no rank may wait alone */
	if (s->world && (rc2 = s->bk->allreduce(s->bk, s->world, acc, 1, HP_DTYPE_F64, HP_RED_SUM, e)) && !rc)
		rc = rc2;
	return rc;
}

double hp_optim_clip(struct hp_optim *o, double norm)
{
	float coef = hp_clip_factor(norm, o->max_grad_norm);

	if (coef != 1.0f)
		o->s.bk->scale(o->s.bk, o->s.g, coef, o->s.total);
	return coef;
}

void hp_optim_clip_gate(struct hp_optim *o, float *cg, const double *ss, const double *loss, const double *aux,
			const int32_t *bad, int check)
{
	struct hp_backend *bk = o->s.bk;

	bk->clip_gate(bk, o->s.g, o->s.total, cg, ss, loss, aux, bad, o->max_grad_norm, check);
}

void hp_optim_step(struct hp_optim *o, double lr, const float *cg)
{
	const struct hp_store *s = &o->s;

	o->step++;
	o->hp.step = o->step;
	o->hp.lr = lr;
	for (int i = 0; i < s->nupd; i++) {
		const struct hp_store_run *r = &s->upd[i];

		s->bk->adamw(s->bk, s->w + r->off, s->g + r->off, s->m1 + r->off, s->m2 + r->off, r->n, &o->hp,
			     r->decay, cg);
	}
}
