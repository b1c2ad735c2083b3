/*
 * optim.c - clipping, schedules and AdamW over the model's flat parameters,
 * on the model's backend.
 */
#include <math.h>

#include "base/alloc.h"
#include "dist/optim.h"

static int name_has(const char *name, const char *sub)
{
	return sub[0] && strcasestr(name, sub) != NULL;
}

int hp_optim_init(struct hp_optim *o, struct hp_model *m, const struct hp_config *c, struct hp_err *e)
{
	size_t bytes = m->numel * sizeof(float);

	memset(o, 0, sizeof(*o));
	o->bk = m->bk;
	if (!(o->m = o->bk->alloc(o->bk, bytes, e)) || !(o->v = o->bk->alloc(o->bk, bytes, e))) {
		hp_optim_release(o);
		return hp_err_set(e, HP_ENOMEM, "out of memory for optimizer state (%zu MiB on %s)",
				  2 * bytes >> 20, m->bk->name);
	}
	o->hm = o->m;
	o->hv = o->v;
	if (o->bk->device && (!(o->hm = hp_calloc(m->numel + 1, sizeof(float))) ||
			      !(o->hv = hp_calloc(m->numel + 1, sizeof(float))))) {
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
	for (int i = 0; i < m->nparams; i++) {
		struct hp_param *p = &m->params[i];
		p->decay = 1;
		for (int j = 0; j < c->optimizer.nno_decay_params; j++)
			if (name_has(p->name, c->optimizer.no_decay_params[j]))
				p->decay = 0;
	}
	return 0;
}

void hp_optim_drop_moments(struct hp_optim *o)
{
	if (o->hm != o->m)
		hp_free(o->hm);
	if (o->hv != o->v)
		hp_free(o->hv);
	if (o->bk) {
		o->bk->free(o->bk, o->m);
		o->bk->free(o->bk, o->v);
	}
	o->m = o->v = o->hm = o->hv = NULL;
}

void hp_optim_release(struct hp_optim *o)
{
	hp_optim_drop_moments(o);
}

int hp_optim_move(struct hp_optim *o, size_t numel, int to_host, struct hp_err *e)
{
	float *const d[2] = { o->m, o->v }, *const h[2] = { o->hm, o->hv };
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

double hp_grad_norm(const struct hp_model *m)
{
	double ss = 0;
	struct hp_err e;

	/* the whole flat array at once: the padding between tensors is zero,
	 * and adding zeros leaves the sum's bits alone */
	if (m->bk->sumsq_acc(m->bk, &ss, m->bg, m->numel, &e))
		return NAN;
	return sqrt(ss);
}

double hp_clip_grads(struct hp_model *m, double norm, double max_norm)
{
	float coef;

	if (max_norm <= 0)
		return 1.0;
	coef = (float)(max_norm / (norm + 1e-6));
	if (coef >= 1.0f)
		return 1.0;
	m->bk->scale(m->bk, m->bg, coef, m->numel);
	return coef;
}

void hp_optim_step(struct hp_optim *o, struct hp_model *m, double lr)
{
	o->step++;
	o->hp.step = o->step;
	o->hp.lr = lr;
	/* one call per run of parameters alike in weight decay (AdamW is
	 * element-wise; the 16-float padding between tensors is zero in the
	 * weights, gradients and moments, and stays zero) */
	for (int i = 0, j; i < m->nparams; i = j) {
		const struct hp_param *p = &m->params[i];

		for (j = i + 1; j < m->nparams && m->params[j].decay == p->decay; j++)
			;
		size_t n = m->params[j - 1].offset + m->params[j - 1].numel - p->offset;
		m->bk->adamw(m->bk, m->bw + p->offset, m->bg + p->offset, o->m + p->offset, o->v + p->offset, n,
			     &o->hp, p->decay);
	}
}
