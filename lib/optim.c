/*
 * optim.c - clipping, schedules and AdamW over the model's flat parameters.
 */
#include <math.h>

#include "alloc.h"
#include "optim.h"

static int name_has(const char *name, const char *sub)
{
	return sub[0] && strcasestr(name, sub) != NULL;
}

int hp_optim_init(struct hp_optim *o, struct hp_model *m, const struct hp_config *c, struct hp_err *e)
{
	memset(o, 0, sizeof(*o));
	o->m = hp_malloc_aligned(m->numel * sizeof(float));
	o->v = hp_malloc_aligned(m->numel * sizeof(float));
	if (!o->m || !o->v) {
		hp_optim_release(o);
		return hp_err_set(e, HP_ENOMEM, "out of memory for optimizer state (%zu MiB)",
				  2 * m->numel * sizeof(float) >> 20);
	}
	memset(o->m, 0, m->numel * sizeof(float));
	memset(o->v, 0, m->numel * sizeof(float));
	o->hp.beta1 = c->optimizer.beta1;
	o->hp.beta2 = c->optimizer.beta2;
	o->hp.eps = c->optimizer.eps;
	o->hp.weight_decay = c->optimizer.weight_decay;
	o->style = c->lr_scheduler.style;
	o->lr_max = c->lr_scheduler.lr >= 0 ? c->lr_scheduler.lr : c->optimizer.lr;
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

void hp_optim_release(struct hp_optim *o)
{
	hp_free_aligned(o->m);
	hp_free_aligned(o->v);
	o->m = o->v = NULL;
}

void hp_optim_drop_moments(struct hp_optim *o)
{
	hp_free_aligned(o->m);
	hp_free_aligned(o->v);
	o->m = o->v = NULL;
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

	for (int i = 0; i < m->nparams; i++) {
		const struct hp_param *p = &m->params[i];
		for (size_t j = 0; j < p->numel; j++)
			ss += (double)p->g[j] * p->g[j];
	}
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
	for (size_t j = 0; j < m->numel; j++)
		m->flat_g[j] *= coef;
	return coef;
}

void hp_optim_step(struct hp_optim *o, struct hp_model *m, double lr)
{
	o->step++;
	o->hp.step = o->step;
	o->hp.lr = lr;
	for (int i = 0; i < m->nparams; i++) {
		struct hp_param *p = &m->params[i];
		hp_adamw_step(p->w, p->g, o->m + p->offset, o->v + p->offset, p->numel, &o->hp, p->decay);
	}
}
