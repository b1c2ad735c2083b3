/*
 * model.c - LlamaForCausalLM in F32: parameter table, HF loading, forward
 * and backward through the CPU op table.
 *
 * This is the single-process model every parallel layout is checked
 * against, so it follows transformers' modeling_llama.py step by step
 * rather than fusing anything: embedding, for each layer
 * x += o_proj(attn(rope(q_proj(norm(x))), rope(k_proj(..)), v_proj(..)))
 * and x += down(silu(gate(norm(x))) * up(norm(x))), final norm, LM head,
 * cross-entropy.  Fused and parallel variants live elsewhere.
 */
#include "alloc.h"
#include "model.h"
#include "safetensors.h"

#define N_PER_LAYER 9

static void add_param(struct hp_model *m, int *i, size_t *off, const char *name,
		      int ndim, int64_t d0, int64_t d1)
{
	struct hp_param *p = &m->params[(*i)++];

	snprintf(p->name, sizeof(p->name), "%s", name);
	p->ndim = ndim;
	p->shape[0] = d0;
	p->shape[1] = ndim > 1 ? d1 : 1;
	p->numel = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
	/* keep every tensor 16-float aligned so SIMD paths may assume it */
	*off = (*off + 15) & ~(size_t)15;
	p->offset = *off;
	*off += p->numel;
}

static int build_params(struct hp_model *m, struct hp_err *e)
{
	const struct hp_model_spec *s = &m->spec;
	int C = s->hidden, I = s->intermediate, D = s->head_dim;
	int n = 1 + s->n_layers * N_PER_LAYER + 1 + !s->tie_word_embeddings;
	char name[96];
	size_t off = 0;
	int i = 0;

	m->params = hp_calloc((size_t)n, sizeof(*m->params));
	if (!m->params)
		return hp_err_set(e, HP_ENOMEM, "out of memory for the parameter table");
	add_param(m, &i, &off, "model.embed_tokens.weight", 2, s->vocab, C);
	for (int l = 0; l < s->n_layers; l++) {
#define P(suffix, nd, a, b) do { \
		snprintf(name, sizeof(name), "model.layers.%d.%s", l, suffix); \
		add_param(m, &i, &off, name, nd, a, b); } while (0)
		P("input_layernorm.weight", 1, C, 1);
		P("self_attn.q_proj.weight", 2, s->n_heads * D, C);
		P("self_attn.k_proj.weight", 2, s->n_kv_heads * D, C);
		P("self_attn.v_proj.weight", 2, s->n_kv_heads * D, C);
		P("self_attn.o_proj.weight", 2, C, s->n_heads * D);
		P("post_attention_layernorm.weight", 1, C, 1);
		P("mlp.gate_proj.weight", 2, I, C);
		P("mlp.up_proj.weight", 2, I, C);
		P("mlp.down_proj.weight", 2, C, I);
#undef P
	}
	add_param(m, &i, &off, "model.norm.weight", 1, C, 1);
	if (!s->tie_word_embeddings)
		add_param(m, &i, &off, "lm_head.weight", 2, s->vocab, C);
	m->nparams = i;
	m->numel = (off + 15) & ~(size_t)15;
	return 0;
}

static void bind_layer(struct hp_layer_w *lw, float *flat, const struct hp_param *p)
{
	float **slots[N_PER_LAYER] = { &lw->in_norm, &lw->wq, &lw->wk, &lw->wv, &lw->wo,
				       &lw->post_norm, &lw->wg, &lw->wu, &lw->wd };
	for (int j = 0; j < N_PER_LAYER; j++)
		*slots[j] = flat + p[j].offset;
}

/* Take every activation buffer from the arena; with base NULL this only measures. */
static int take_acts(struct hp_model *m)
{
	const struct hp_model_spec *s = &m->spec;
	long N = (long)m->B * m->T;
	size_t C = s->hidden, I = s->intermediate, QD = (size_t)s->n_heads * s->head_dim,
	       KD = (size_t)s->n_kv_heads * s->head_dim, V = s->vocab, f = sizeof(float);
	size_t TT = (size_t)m->T * m->T;
	struct hp_arena *a = &m->aarena;
	int ok = 1;

#define TAKE(ptr, bytes) do { (ptr) = hp_arena_take(a, (bytes)); ok &= (ptr) != NULL; } while (0)
	for (int l = 0; l < s->n_layers; l++) {
		struct hp_layer_act *t = &m->act[l];
		TAKE(t->x_in, N * C * f);
		TAKE(t->rstd1, N * f);
		TAKE(t->xn1, N * C * f);
		TAKE(t->q, N * QD * f);
		TAKE(t->k, N * KD * f);
		TAKE(t->v, N * KD * f);
		TAKE(t->P, (size_t)m->B * s->n_heads * TT * f);
		TAKE(t->att, N * QD * f);
		TAKE(t->x_mid, N * C * f);
		TAKE(t->rstd2, N * f);
		TAKE(t->xn2, N * C * f);
		TAKE(t->g, N * I * f);
		TAKE(t->u, N * I * f);
		TAKE(t->h, N * I * f);
	}
	TAKE(m->x_final, N * C * f);
	TAKE(m->rstd_f, N * f);
	TAKE(m->xf, N * C * f);
	TAKE(m->logits, N * V * f);
	TAKE(m->cos_t, (size_t)m->T * s->head_dim / 2 * f);
	TAKE(m->sin_t, (size_t)m->T * s->head_dim / 2 * f);
	TAKE(m->pos, N * sizeof(int32_t));
	TAKE(m->dx, N * C * f);
	TAKE(m->dxn, N * C * f);
	TAKE(m->dq, N * QD * f);
	TAKE(m->dk, N * KD * f);
	TAKE(m->dv, N * KD * f);
	TAKE(m->datt, N * QD * f);
	TAKE(m->dg, N * I * f);
	TAKE(m->du, N * I * f);
	TAKE(m->dh, N * I * f);
	TAKE(m->dscratch, TT * f);
#undef TAKE
	return ok;
}

int hp_model_init(struct hp_model *m, const struct hp_model_spec *spec, int B, int T, struct hp_err *e)
{
	int rc;

	memset(m, 0, sizeof(*m));
	hp_arena_init(&m->warena);
	hp_arena_init(&m->garena);
	hp_arena_init(&m->aarena);
	m->spec = *spec;
	m->B = B;
	m->T = T;
	m->ops = hp_cpu_ops_get();
	if (B <= 0 || T <= 0)
		return hp_err_set(e, HP_EINVAL, "micro-batch %d x %d must be positive", B, T);
	if (T > spec->max_pos)
		return hp_err_set(e, HP_ECONFIG, "sequence length %d exceeds the model's "
				  "max_position_embeddings %d", T, spec->max_pos);
	if ((rc = build_params(m, e)))
		goto fail;
	rc = HP_ENOMEM;
	if (hp_arena_alloc(&m->warena, m->numel * sizeof(float)) ||
	    hp_arena_alloc(&m->garena, m->numel * sizeof(float))) {
		hp_err_set(e, rc, "out of memory for %zu parameters", m->numel);
		goto fail;
	}
	m->flat_w = hp_arena_take(&m->warena, m->numel * sizeof(float));
	m->flat_g = hp_arena_take(&m->garena, m->numel * sizeof(float));
	for (int i = 0; i < m->nparams; i++) {
		m->params[i].w = m->flat_w + m->params[i].offset;
		m->params[i].g = m->flat_g + m->params[i].offset;
	}
	m->lw = hp_calloc((size_t)spec->n_layers, sizeof(*m->lw));
	m->lg = hp_calloc((size_t)spec->n_layers, sizeof(*m->lg));
	m->act = hp_calloc((size_t)spec->n_layers, sizeof(*m->act));
	if (!m->lw || !m->lg || !m->act) {
		hp_err_set(e, rc, "out of memory for the layer tables");
		goto fail;
	}
	m->embed = m->params[0].w;
	m->d_embed = m->params[0].g;
	for (int l = 0; l < spec->n_layers; l++) {
		bind_layer(&m->lw[l], m->flat_w, &m->params[1 + l * N_PER_LAYER]);
		bind_layer(&m->lg[l], m->flat_g, &m->params[1 + l * N_PER_LAYER]);
	}
	{
		struct hp_param *fn = &m->params[1 + spec->n_layers * N_PER_LAYER];
		m->final_norm = fn->w;
		m->d_final_norm = fn->g;
		m->lm_head = spec->tie_word_embeddings ? m->embed : fn[1].w;
		m->d_lm_head = spec->tie_word_embeddings ? m->d_embed : fn[1].g;
	}
	take_acts(m);                       /* measure */
	if (hp_arena_alloc(&m->aarena, m->aarena.used)) {
		hp_err_set(e, rc, "out of memory for activations (%zu MiB for %d x %d tokens)",
			   m->aarena.used >> 20, B, T);
		goto fail;
	}
	take_acts(m);
	hp_rope_table(m->cos_t, m->sin_t, T, spec->head_dim, spec->rope_theta);
	return 0;
fail:
	hp_model_release(m);
	return e ? e->code : rc;
}

void hp_model_release(struct hp_model *m)
{
	hp_arena_release(&m->warena);
	hp_arena_release(&m->garena);
	hp_arena_release(&m->aarena);
	hp_free(m->params);
	hp_free(m->lw);
	hp_free(m->lg);
	hp_free(m->act);
	m->params = NULL;
	m->lw = m->lg = NULL;
	m->act = NULL;
	m->nparams = 0;
}

struct hp_param *hp_model_param(struct hp_model *m, const char *name)
{
	for (int i = 0; i < m->nparams; i++)
		if (!strcmp(m->params[i].name, name))
			return &m->params[i];
	return NULL;
}

static int shape_matches(const struct hp_st_tensor *t, const struct hp_param *p)
{
	if (t->ndim != p->ndim)
		return 0;
	for (int d = 0; d < p->ndim; d++)
		if (t->shape[d] != p->shape[d])
			return 0;
	return 1;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
	size_t used = 0;

	used += (size_t)snprintf(buf, n, "[");
	for (int d = 0; d < ndim && used < n; d++)
		used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
	if (used < n)
		snprintf(buf + used, n - used, "]");
}

int hp_model_load_hf(struct hp_model *m, const char *dir, struct hp_err *e)
{
	struct hp_st_model st;
	int rc = 0;

	if ((rc = hp_st_model_open(&st, dir, e)))
		return rc;
	for (int i = 0; i < m->nparams && !rc; i++) {
		struct hp_param *p = &m->params[i];
		const struct hp_st_tensor *t = hp_st_model_find(&st, p->name);
		char want[64], got[64];

		if (!t) {
			rc = hp_err_set(e, HP_EFORMAT, "'%s': tensor '%s' is missing", dir, p->name);
			break;
		}
		if (!shape_matches(t, p)) {
			shape_str(want, sizeof(want), p->ndim, p->shape);
			shape_str(got, sizeof(got), t->ndim, t->shape);
			rc = hp_err_set(e, HP_EFORMAT, "'%s': tensor '%s' has shape %s, config.json implies %s",
					dir, p->name, got, want);
			break;
		}
		rc = hp_st_read_f32(t, p->w, e);
	}
	/* Every tensor in the checkpoint must be one the model uses. */
	for (size_t j = 0; j < st.ntensors && !rc; j++) {
		const struct hp_st_tensor *t = st.tensors[j];
		if (hp_model_param(m, t->name))
			continue;
		if (m->spec.tie_word_embeddings && !strcmp(t->name, "lm_head.weight")) {
			/* some exporters write the tied head out; accept it only if it is the embedding */
			float *tmp;
			int same = 1;
			if ((size_t)t->numel != m->params[0].numel) {
				same = 0;
			} else if (!(tmp = hp_malloc((size_t)t->numel * sizeof(float)))) {
				rc = hp_err_set(e, HP_ENOMEM, "out of memory checking '%s'", t->name);
				break;
			} else {
				rc = hp_st_read_f32(t, tmp, e);
				if (!rc)
					same = !memcmp(tmp, m->embed, (size_t)t->numel * sizeof(float));
				hp_free(tmp);
			}
			if (!rc && !same)
				rc = hp_err_set(e, HP_EFORMAT, "'%s': tie_word_embeddings is true but "
						"'lm_head.weight' differs from the embedding", dir);
			continue;
		}
		if (strstr(t->name, "rotary_emb.inv_freq"))
			continue;   /* a buffer old transformers saved; recomputed from rope_theta */
		rc = hp_err_set(e, HP_EFORMAT, "'%s': unexpected tensor '%s' for model_type %s",
				dir, t->name, m->spec.model_type);
	}
	hp_st_model_close(&st);
	return rc;
}

void hp_model_zero_grad(struct hp_model *m)
{
	memset(m->flat_g, 0, m->numel * sizeof(float));
}

int hp_model_forward(struct hp_model *m, const int32_t *ids, const int32_t *targets,
		     const int32_t *seg, double *loss_sum, long *count)
{
	const struct hp_model_spec *s = &m->spec;
	const struct hp_cpu_ops *ops = m->ops;
	long N = (long)m->B * m->T;
	int C = s->hidden, I = s->intermediate, D = s->head_dim, V = s->vocab;
	int QD = s->n_heads * D, KD = s->n_kv_heads * D;
	float eps = (float)s->rms_eps;

	m->seg = seg;
	for (long n = 0; n < N; n++)
		m->pos[n] = (int32_t)(n % m->T) - (seg ? seg[n] : 0);
	hp_embedding_fwd(m->act[0].x_in, ids, m->embed, N, C);
	for (int l = 0; l < s->n_layers; l++) {
		struct hp_layer_act *a = &m->act[l];
		const struct hp_layer_w *w = &m->lw[l];
		float *next = l + 1 < s->n_layers ? m->act[l + 1].x_in : m->x_final;

		hp_rmsnorm_fwd(a->xn1, a->rstd1, a->x_in, w->in_norm, N, C, eps);
		ops->linear_fwd(a->q, a->xn1, w->wq, NULL, N, C, QD);
		ops->linear_fwd(a->k, a->xn1, w->wk, NULL, N, C, KD);
		ops->linear_fwd(a->v, a->xn1, w->wv, NULL, N, C, KD);
		hp_rope_fwd(a->q, m->pos, m->cos_t, m->sin_t, N, s->n_heads, D);
		hp_rope_fwd(a->k, m->pos, m->cos_t, m->sin_t, N, s->n_kv_heads, D);
		ops->attention_fwd(a->att, a->P, a->q, a->k, a->v, m->seg, m->B, m->T, s->n_heads, s->n_kv_heads, D);
		ops->linear_fwd(a->x_mid, a->att, w->wo, NULL, N, QD, C);
		for (long i = 0; i < N * C; i++)
			a->x_mid[i] = a->x_in[i] + a->x_mid[i];
		hp_rmsnorm_fwd(a->xn2, a->rstd2, a->x_mid, w->post_norm, N, C, eps);
		ops->linear_fwd(a->g, a->xn2, w->wg, NULL, N, C, I);
		ops->linear_fwd(a->u, a->xn2, w->wu, NULL, N, C, I);
		ops->swiglu_fwd(a->h, a->g, a->u, N * I);
		ops->linear_fwd(next, a->h, w->wd, NULL, N, I, C);
		for (long i = 0; i < N * C; i++)
			next[i] = a->x_mid[i] + next[i];
	}
	hp_rmsnorm_fwd(m->xf, m->rstd_f, m->x_final, m->final_norm, N, C, eps);
	ops->linear_fwd(m->logits, m->xf, m->lm_head, NULL, N, C, V);
	if (targets)
		return ops->cross_entropy_fwd(loss_sum, count, m->logits, targets, N, V);
	return 0;
}

void hp_model_backward(struct hp_model *m, const int32_t *ids, const int32_t *targets, double total_count)
{
	const struct hp_model_spec *s = &m->spec;
	const struct hp_cpu_ops *ops = m->ops;
	long N = (long)m->B * m->T;
	int C = s->hidden, I = s->intermediate, D = s->head_dim, V = s->vocab;
	int QD = s->n_heads * D, KD = s->n_kv_heads * D;
	float *dlogits = m->logits;   /* overwritten in place */

	ops->cross_entropy_bwd(dlogits, m->logits, targets, N, V,
			     total_count > 0 ? (float)(1.0 / total_count) : 0.0f);
	ops->linear_bwd(m->dxn, m->d_lm_head, NULL, dlogits, m->xf, m->lm_head, N, C, V, 0);
	hp_rmsnorm_bwd(m->dx, m->d_final_norm, m->dxn, m->x_final, m->final_norm, m->rstd_f, N, C, 0);
	for (int l = s->n_layers - 1; l >= 0; l--) {
		struct hp_layer_act *a = &m->act[l];
		const struct hp_layer_w *w = &m->lw[l];
		struct hp_layer_w *g = &m->lg[l];

		/* MLP: x_out = x_mid + down(silu(gate(xn2)) * up(xn2)) */
		ops->linear_bwd(m->dh, g->wd, NULL, m->dx, a->h, w->wd, N, I, C, 0);
		ops->swiglu_bwd(m->dg, m->du, m->dh, a->g, a->u, N * I);
		ops->linear_bwd(m->dxn, g->wg, NULL, m->dg, a->xn2, w->wg, N, C, I, 0);
		ops->linear_bwd(m->dxn, g->wu, NULL, m->du, a->xn2, w->wu, N, C, I, 1);
		hp_rmsnorm_bwd(m->dx, g->post_norm, m->dxn, a->x_mid, w->post_norm, a->rstd2, N, C, 1);
		/* attention: x_mid = x_in + o_proj(attn(q, k, v)) */
		ops->linear_bwd(m->datt, g->wo, NULL, m->dx, a->att, w->wo, N, QD, C, 0);
		ops->attention_bwd(m->dq, m->dk, m->dv, m->datt, a->P, a->q, a->k, a->v, m->seg, m->dscratch,
				   m->B, m->T, s->n_heads, s->n_kv_heads, D);
		hp_rope_bwd(m->dq, m->pos, m->cos_t, m->sin_t, N, s->n_heads, D);
		hp_rope_bwd(m->dk, m->pos, m->cos_t, m->sin_t, N, s->n_kv_heads, D);
		ops->linear_bwd(m->dxn, g->wq, NULL, m->dq, a->xn1, w->wq, N, C, QD, 0);
		ops->linear_bwd(m->dxn, g->wk, NULL, m->dk, a->xn1, w->wk, N, C, KD, 1);
		ops->linear_bwd(m->dxn, g->wv, NULL, m->dv, a->xn1, w->wv, N, C, KD, 1);
		hp_rmsnorm_bwd(m->dx, g->in_norm, m->dxn, a->x_in, w->in_norm, a->rstd1, N, C, 1);
	}
	hp_embedding_bwd(m->d_embed, m->dx, ids, N, C);
}
