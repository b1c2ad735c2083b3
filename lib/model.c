/*
 * model.c - LlamaForCausalLM, Qwen3ForCausalLM and Qwen3MoeForCausalLM in
 * F32: parameter table, HF loading, forward and backward through the CPU op
 * table.
 *
 * This is the single-process model every parallel layout is checked
 * against, so it follows transformers' modeling code step by step rather
 * than fusing anything: embedding, for each layer
 * x += o_proj(attn(rope(qk_norm(q_proj(norm(x)))), rope(..k..), v_proj(..)))
 * and x += mlp(norm(x)), the mlp dense SwiGLU or the sparse MoE block,
 * final norm, LM head, cross-entropy (+ the router's load-balancing loss).
 * Fused and parallel variants live elsewhere.
 */
#include <math.h>

#include "alloc.h"
#include "comm.h"
#include "model.h"
#include "params.h"
#include "safetensors.h"

static void add_param(struct hp_model *m, size_t *off, const char *name, int ndim, int64_t d0, int64_t d1,
		      float **wslot, float **gslot)
{
	struct hp_param *p = &m->params[m->nparams++];

	snprintf(p->name, sizeof(p->name), "%s", name);
	p->ndim = ndim;
	p->shape[0] = d0;
	p->shape[1] = ndim > 1 ? d1 : 1;
	p->numel = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
	p->wslot = wslot;
	p->gslot = gslot;
	/* keep every tensor 16-float aligned so SIMD paths may assume it */
	*off = (*off + 15) & ~(size_t)15;
	p->offset = *off;
	*off += p->numel;
}

static int count_one(void *ctx, const struct hp_param_desc *d)
{
	(void)d;
	(*(int *)ctx)++;
	return 0;
}

/* Where the model keeps the pointers of the parameter d describes. */
static int add_one(void *ctx, const struct hp_param_desc *d)
{
	struct hp_model *m = ctx;
	struct hp_layer_w *w = d->layer >= 0 ? &m->lw[d->layer] : NULL, *g = d->layer >= 0 ? &m->lg[d->layer] : NULL;
	float **ws = NULL, **gs = NULL;
	int64_t d0 = d->shape[0], d1 = d->shape[1];
	int x = d->expert;

	/* this rank's part: tp cuts columns' rows and rows' columns; an expert
	 * lives on one ep rank */
	if (d->role == HP_ROLE_EXPERT) {
		if (x < m->e0 || x >= m->e0 + m->El)
			return 0;
		x -= m->e0;
	} else if (d->role == HP_ROLE_COLUMN) {
		d0 /= m->par.tp;
	} else if (d->role == HP_ROLE_ROW) {
		d1 /= m->par.tp;
	}

#define SLOT(f) do { ws = &w->f; gs = &g->f; } while (0)
	switch (d->field) {
	case HP_PF_EMBED: ws = &m->embed; gs = &m->d_embed; break;
	case HP_PF_FINAL_NORM: ws = &m->final_norm; gs = &m->d_final_norm; break;
	case HP_PF_LM_HEAD: ws = &m->lm_head; gs = &m->d_lm_head; break;
	case HP_PF_IN_NORM: SLOT(in_norm); break;
	case HP_PF_WQ: SLOT(wq); break;
	case HP_PF_BQ: SLOT(bq); break;
	case HP_PF_WK: SLOT(wk); break;
	case HP_PF_BK: SLOT(bk); break;
	case HP_PF_WV: SLOT(wv); break;
	case HP_PF_BV: SLOT(bv); break;
	case HP_PF_WO: SLOT(wo); break;
	case HP_PF_BO: SLOT(bo); break;
	case HP_PF_Q_NORM: SLOT(q_norm); break;
	case HP_PF_K_NORM: SLOT(k_norm); break;
	case HP_PF_POST_NORM: SLOT(post_norm); break;
	case HP_PF_WG: SLOT(wg); break;
	case HP_PF_WU: SLOT(wu); break;
	case HP_PF_WD: SLOT(wd); break;
	case HP_PF_ROUTER: SLOT(router); break;
	case HP_PF_EX_GATE: ws = &w->ex[x].wg; gs = &g->ex[x].wg; break;
	case HP_PF_EX_UP: ws = &w->ex[x].wu; gs = &g->ex[x].wu; break;
	case HP_PF_EX_DOWN: ws = &w->ex[x].wd; gs = &g->ex[x].wd; break;
	}
#undef SLOT
	add_param(m, &m->numel, d->name, d->ndim, d0, d1, ws, gs);
	return 0;
}

static int build_params(struct hp_model *m, struct hp_err *e)
{
	m->cap_params = 0;
	hp_model_spec_params(&m->gspec, count_one, &m->cap_params);
	m->params = hp_calloc((size_t)m->cap_params, sizeof(*m->params));
	if (!m->params)
		return hp_err_set(e, HP_ENOMEM, "out of memory for the parameter table");
	m->numel = 0;
	hp_model_spec_params(&m->gspec, add_one, m);
	m->numel = (m->numel + 15) & ~(size_t)15;
	return 0;
}

static int any_grouped(const struct hp_model *m)
{
	for (int l = 0; l < m->spec.n_layers; l++)
		if (m->lw[l].moe && m->k.grouped[l])
			return 1;
	return 0;
}

static int cp_ag(const struct hp_model *m)
{
	return m->par.cp > 1 && !m->par.ulysses;
}

static int cp_ul(const struct hp_model *m)
{
	return m->par.cp > 1 && m->par.ulysses;
}

/* The attention backward's scratch: a row block for HF's algorithm, the
 * flash kernel's own for flash layers, the context-parallel kernel's. */
static size_t scratch_floats(const struct hp_model *m)
{
	int Tq = cp_ul(m) ? m->S : m->T, H = cp_ul(m) ? m->spec.n_heads / m->par.cp : m->spec.n_heads;
	size_t n = 0, fl = hp_flash_attention_scratch(Tq, H, m->spec.head_dim);

	for (int l = 0; l < m->spec.n_layers; l++) {
		size_t x = cp_ag(m) ? hp_cp_attention_scratch(m->S) : m->k.flash[l] ? fl : (size_t)Tq * Tq;

		if (x > n)
			n = x;
	}
	return n ? n : 1;
}

/*
 * One layer's activation buffers: what its backward reads.  A layer under
 * activation checkpointing takes what it recomputes from work instead of
 * keep: full, everything but its input x_in; selective, the attention
 * probabilities (of a layer on the reference attention).  Every such layer
 * takes from the same work region, so they share it.
 */
static int take_layer(struct hp_model *m, int l, struct hp_arena *keep, struct hp_arena *work)
{
	const struct hp_model_spec *s = &m->spec;
	const struct hp_model_par *pr = &m->par;
	long N = (long)m->B * m->T, Ns = m->Ns;
	size_t C = s->hidden, I = s->intermediate, QD = (size_t)s->n_heads * s->head_dim,
	       KD = (size_t)s->n_kv_heads * s->head_dim, f = sizeof(float), i4 = sizeof(int32_t);
	size_t E = s->n_experts, K = s->top_k, Im = s->moe_intermediate, NK = (size_t)Ns * K;
	size_t R = pr->ep > 1 ? (size_t)m->ep_rcap : NK, BS = (size_t)m->B * m->S;
	size_t TS = (size_t)m->T * m->S;
	struct hp_layer_act *t = &m->act[l];
	int full = m->k.ckpt[l] == HP_ACT_CKPT_FULL;
	struct hp_arena *a = full ? work : keep;
	struct hp_arena *pa = full || (m->k.ckpt[l] == HP_ACT_CKPT_SELECTIVE && !m->k.flash[l]) ? work : keep;
	int ok = 1;

#define TAKE_IN(ar, ptr, bytes) do { (ptr) = hp_arena_take(ar, (bytes)); ok &= (ptr) != NULL; } while (0)
#define TAKE(ptr, bytes) TAKE_IN(a, ptr, bytes)
	TAKE_IN(keep, t->x_in, Ns * C * f);
	TAKE(t->rstd1, Ns * f);
	TAKE(t->xn1, N * C * f);
	if (s->qk_norm) {
		TAKE(t->q_raw, N * QD * f);
		TAKE(t->k_raw, N * KD * f);
		TAKE(t->rstd_q, N * s->n_heads * f);
		TAKE(t->rstd_k, N * s->n_kv_heads * f);
	}
	TAKE(t->q, N * QD * f);
	TAKE(t->k, N * KD * f);
	TAKE(t->v, N * KD * f);
	if (m->k.flash[l])
		TAKE_IN(pa, t->P, (size_t)m->B * s->n_heads * m->T * f);
	else
		TAKE_IN(pa, t->P, (size_t)m->B * s->n_heads * TS * f);
	if (cp_ag(m)) {
		TAKE(t->kg, BS * KD * f);
		TAKE(t->vg, BS * KD * f);
	} else if (cp_ul(m)) {
		TAKE(t->att_u, N * QD * f);
	}
	TAKE(t->att, N * QD * f);
	TAKE(t->x_mid, Ns * C * f);
	TAKE(t->rstd2, Ns * f);
	if (m->lw[l].moe) {
		TAKE(t->xn2, Ns * C * f);
		TAKE(t->probs, Ns * E * f);
		TAKE(t->sel, NK * i4);
		TAKE(t->wsel, NK * f);
		TAKE(t->row_tok, NK * i4);
		TAKE(t->row_slot, NK * i4);
		TAKE(t->ex_off, (E + 1) * i4);
		/* grouped on one rank: gathered per expert into m->xg */
		if (!m->k.grouped[l] || pr->ep > 1)
			TAKE(t->xe, R * C * f);
		if (m->k.grouped[l]) {
			TAKE(t->ge, R * 2 * Im * f);
			t->ue = t->he = NULL;
		} else {
			TAKE(t->ge, R * Im * f);
			TAKE(t->ue, R * Im * f);
			TAKE(t->he, R * Im * f);
		}
		/* grouped on one rank: the experts' outputs are recomputed in the
		 * backward (from the SwiGLU it recomputes anyway) instead of kept */
		if (!m->k.grouped[l] || pr->ep > 1)
			TAKE(t->ye, NK * C * f);
		else
			t->ye = NULL;
		TAKE(t->moe_out, Ns * C * f);
		if (pr->ep > 1) {
			TAKE(t->ep_scount, (size_t)pr->ep * i4);
			TAKE(t->ep_rcount, (size_t)pr->ep * i4);
			TAKE(t->ep_perm, R * i4);
			TAKE(t->ep_off, (size_t)(m->El + 1) * i4);
		}
	} else {
		TAKE(t->xn2, N * C * f);
		TAKE(t->g, N * I * f);
		TAKE(t->u, N * I * f);
		TAKE(t->h, N * I * f);
	}
#undef TAKE
	return ok;
}

/* Take every activation buffer from the arena; with base NULL this only
 * measures (hp_model_act_bytes: hp-plan's estimate).  Sizes are this
 * rank's: N tokens of its chunk, Ns of them in the residual stream, the
 * local heads, intermediate rows and vocabulary. */
static int take_acts(struct hp_model *m)
{
	const struct hp_model_spec *s = &m->spec;
	const struct hp_model_par *pr = &m->par;
	long N = (long)m->B * m->T, Ns = m->Ns;
	size_t C = s->hidden, I = s->intermediate, QD = (size_t)s->n_heads * s->head_dim,
	       KD = (size_t)s->n_kv_heads * s->head_dim, V = s->vocab, f = sizeof(float), i4 = sizeof(int32_t);
	size_t E = s->n_experts, K = s->top_k, Im = s->moe_intermediate, NK = (size_t)Ns * K;
	size_t R = pr->ep > 1 ? (size_t)m->ep_rcap : NK, BS = (size_t)m->B * m->S;
	struct hp_arena *a = &m->aarena;
	size_t wmax = 0;
	unsigned char *wbase;
	int ok = 1;

	/* the checkpointed layers' shared work region: the largest of theirs */
	for (int l = 0; l < s->n_layers; l++) {
		struct hp_arena kp, w;

		if (m->k.ckpt[l] == HP_ACT_CKPT_OFF)
			continue;
		hp_arena_init(&kp);
		hp_arena_init(&w);
		take_layer(m, l, &kp, &w);
		if (w.used > wmax)
			wmax = w.used;
	}
	wbase = wmax ? hp_arena_take(a, wmax) : NULL;
	ok &= !wmax || wbase;
	for (int l = 0; l < s->n_layers; l++) {
		struct hp_arena w = { wbase, wbase ? wmax : 0, 0 };

		ok &= take_layer(m, l, a, m->k.ckpt[l] == HP_ACT_CKPT_OFF ? a : &w);
	}
#define TAKE(ptr, bytes) TAKE_IN(a, ptr, bytes)
	TAKE(m->x_final, Ns * C * f);
	TAKE(m->rstd_f, Ns * f);
	TAKE(m->xf, N * C * f);
	TAKE(m->logits, (m->k.ce_chunk > 0 && m->k.ce_chunk < N && pr->tp == 1 ? (size_t)m->k.ce_chunk
										 : (size_t)N) * V * f);
	if (pr->tp > 1) {
		if (!pr->loss_parallel)
			TAKE(m->glogits, N * (size_t)m->gspec.vocab * f);
		TAKE(m->vp_mx, 2 * N * f);
		TAKE(m->vp_st, 4 * N * sizeof(double));
	}
	TAKE(m->cos_t, (size_t)m->S * s->head_dim / 2 * f);
	TAKE(m->sin_t, (size_t)m->S * s->head_dim / 2 * f);
	TAKE(m->pos, N * i4);
	if (pr->cp > 1) {
		TAKE(m->ids_l, N * i4);
		TAKE(m->tgt_l, N * i4);
		TAKE(m->seg_l, N * i4);
	}
	TAKE(m->dx, N * C * f);
	TAKE(m->dxn, N * C * f);
	TAKE(m->dq, N * QD * f);
	TAKE(m->dk, N * KD * f);
	TAKE(m->dv, N * KD * f);
	TAKE(m->datt, N * QD * f);
	TAKE(m->dg, N * I * f);
	TAKE(m->du, N * I * f);
	TAKE(m->dh, N * I * f);
	TAKE(m->dscratch, scratch_floats(m) * f);
	if (s->qk_norm) {
		TAKE(m->dq2, N * QD * f);
		TAKE(m->dk2, N * KD * f);
	}
	if (pr->tp > 1) {
		TAKE(m->dfull, N * C * f);
		TAKE(m->dred, Ns * C * f);
	}
	if (cp_ag(m)) {
		TAKE(m->cp_send, 2 * BS * KD * f);
		TAKE(m->cp_recv, 2 * BS * KD * f);
	} else if (cp_ul(m)) {
		TAKE(m->cp_send, N * (QD + 2 * KD) * f);
		TAKE(m->cp_recv, N * (QD + 2 * KD) * f);
	}
	if (m->n_moe) {
		TAKE(m->dye, R * C * f);
		TAKE(m->dxe, R * C * f);
		TAKE(m->dge, R * (any_grouped(m) ? 2 : 1) * Im * f);
		TAKE(m->due, R * Im * f);
		TAKE(m->dhe, R * Im * f);
		TAKE(m->dprob, Ns * E * f);
		TAKE(m->dwsel, NK * f);
		TAKE(m->moe_fill, 2 * E * i4);
		TAKE(m->aux_frac, 2 * E * sizeof(double));
		if (any_grouped(m)) {
			TAKE(m->hrec, R * Im * f);
			if (pr->ep == 1)
				TAKE(m->xg, NK * C * f);
		}
		if (pr->ep > 1) {
			TAKE(m->ep_send, R * C * f);
			TAKE(m->ep_recv, R * C * f);
		}
	}
#undef TAKE
#undef TAKE_IN
	return ok;
}

int hp_model_init(struct hp_model *m, const struct hp_model_spec *spec, int B, int T, struct hp_err *e)
{
	return hp_model_init_par(m, spec, NULL, NULL, B, T, e);
}

int hp_model_init_kernels(struct hp_model *m, const struct hp_model_spec *spec,
			  const struct hp_model_kernels *k, int B, int T, struct hp_err *e)
{
	return hp_model_init_par(m, spec, k, NULL, B, T, e);
}

/* Check the layout against the model and derive the rank's sizes. */
static int set_par(struct hp_model *m, const struct hp_model_par *par, int B, int T, struct hp_err *e)
{
	struct hp_model_par *p = &m->par;
	const struct hp_model_spec *g = &m->gspec;
	struct hp_model_spec *s = &m->spec;
	long N;

	if (par)
		*p = *par;
	if (p->tp < 1)
		p->tp = 1;
	if (p->cp < 1)
		p->cp = 1;
	if (p->ep < 1)
		p->ep = 1;
	if (g->n_heads % p->tp || g->n_kv_heads % p->tp || g->intermediate % p->tp || g->vocab % p->tp)
		return hp_err_set(e, HP_ECONFIG, "tp %d must divide the heads (%d, %d KV), intermediate_size "
				  "%d and vocab_size %d", p->tp, g->n_heads, g->n_kv_heads, g->intermediate,
				  g->vocab);
	if (T % p->cp)
		return hp_err_set(e, HP_ECONFIG, "cp %d must divide the sequence length %d", p->cp, T);
	if (p->cp > 1 && p->ulysses && ((g->n_heads / p->tp) % p->cp || (g->n_kv_heads / p->tp) % p->cp))
		return hp_err_set(e, HP_ECONFIG, "ulysses attention with cp %d needs the heads per tp rank "
				  "(%d, %d KV) divisible by cp", p->cp, g->n_heads / p->tp, g->n_kv_heads / p->tp);
	if (p->ep > HP_MAX_EP)
		return hp_err_set(e, HP_ECONFIG, "ep %d is more than the %d this build takes", p->ep, HP_MAX_EP);
	if (g->n_experts && g->n_experts % p->ep)
		return hp_err_set(e, HP_ECONFIG, "ep %d must divide num_experts %d", p->ep, g->n_experts);
	m->S = T;
	m->T = T / p->cp;
	N = (long)B * m->T;
	if (p->tp == 1)
		p->sp = 0;
	if (p->sp && N % p->tp)
		return hp_err_set(e, HP_ECONFIG, "sequence parallelism needs the %ld tokens of a rank's "
				  "micro-batch divisible by tp %d", N, p->tp);
	if (g->n_experts && p->tp > 1 && !p->sp)
		return hp_err_set(e, HP_ECONFIG, "a MoE model with tp %d needs sequence parallelism", p->tp);
	m->Ns = p->sp ? N / p->tp : N;
	s->n_heads /= p->tp;
	s->n_kv_heads /= p->tp;
	s->intermediate /= p->tp;
	s->vocab /= p->tp;
	m->v0 = p->tp_rank * s->vocab;
	m->El = g->n_experts / p->ep;
	m->e0 = p->ep_rank * m->El;
	/* the most rows one rank's experts can get: every token of the ep group
	 * sends at most min(top_k, local experts) of its slots here */
	m->ep_rcap = (long)p->ep * m->Ns * (g->top_k < m->El ? g->top_k : m->El);
	return 0;
}

/*
 * What decides the model's buffers: the layout's local sizes, the kernels
 * as the layout leaves them, the layer tables and which layers are MoE.
 */
static int set_layout(struct hp_model *m, const struct hp_model_par *par, int B, int T, struct hp_err *e)
{
	const struct hp_model_spec *spec = &m->gspec;
	int rc;

	if ((rc = set_par(m, par, B, T, e)))
		return rc;
	if (m->par.tp > 1)   /* the LM head is vocab-parallel: no chunks */
		m->k.ce_chunk = 0;
	m->lw = hp_calloc((size_t)spec->n_layers, sizeof(*m->lw));
	m->act = hp_calloc((size_t)spec->n_layers, sizeof(*m->act));
	if (!m->lw || !m->act)
		return hp_err_set(e, HP_ENOMEM, "out of memory for the layer tables");
	for (int l = 0; l < spec->n_layers; l++)
		if ((m->lw[l].moe = hp_model_spec_layer_is_moe(spec, l)))
			m->n_moe++;
	return 0;
}

int64_t hp_model_act_bytes(const struct hp_model_spec *spec, const struct hp_model_kernels *k,
			   const struct hp_model_par *par, int B, int T)
{
	struct hp_model m;
	struct hp_err e;
	int64_t bytes = -1;

	memset(&m, 0, sizeof(m));
	if (k)
		m.k = *k;
	m.spec = m.gspec = *spec;
	m.B = B;
	m.T = m.S = T;
	hp_arena_init(&m.aarena);
	hp_err_clear(&e);
	/* take_acts measures with the arena's base NULL: nothing is allocated */
	if (B > 0 && T > 0 && !set_layout(&m, par, B, T, &e)) {
		take_acts(&m);
		bytes = (int64_t)((m.aarena.used + 63) & ~(size_t)63);   /* whole slices */
	}
	hp_free(m.lw);
	hp_free(m.act);
	return bytes;
}

int hp_model_init_par(struct hp_model *m, const struct hp_model_spec *spec,
		      const struct hp_model_kernels *k, const struct hp_model_par *par, int B, int T,
		      struct hp_err *e)
{
	int rc;

	memset(m, 0, sizeof(*m));
	if (k)
		m->k = *k;
	hp_arena_init(&m->warena);
	hp_arena_init(&m->garena);
	hp_arena_init(&m->aarena);
	m->spec = *spec;
	m->gspec = *spec;
	m->B = B;
	m->T = T;
	m->S = T;
	m->ops = hp_cpu_ops_get();
	if (B <= 0 || T <= 0)
		return hp_err_set(e, HP_EINVAL, "micro-batch %d x %d must be positive", B, T);
	if ((rc = hp_model_spec_check_seq(spec, T, e)))
		return rc;
	if (par && (par->tp > 1 || par->cp > 1 || par->ep > 1) && !par->cs)
		return hp_err_set(e, HP_EINVAL, "a parallel layout needs its communicators");
	if ((rc = set_layout(m, par, B, T, e)))
		return rc;
	rc = HP_ENOMEM;
	m->lg = hp_calloc((size_t)spec->n_layers, sizeof(*m->lg));
	if (!m->lg) {
		hp_err_set(e, rc, "out of memory for the layer tables");
		goto fail;
	}
	for (int l = 0; l < spec->n_layers; l++) {
		if (!m->lw[l].moe)
			continue;
		m->lg[l].moe = 1;
		m->lw[l].ex = hp_calloc((size_t)m->El + 1, sizeof(struct hp_expert_w));
		m->lg[l].ex = hp_calloc((size_t)m->El + 1, sizeof(struct hp_expert_w));
		if (!m->lw[l].ex || !m->lg[l].ex) {
			hp_err_set(e, rc, "out of memory for the expert tables");
			goto fail;
		}
	}
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
		struct hp_param *p = &m->params[i];
		p->w = m->flat_w + p->offset;
		p->g = m->flat_g + p->offset;
		*p->wslot = p->w;
		*p->gslot = p->g;
	}
	if (spec->tie_word_embeddings) {
		m->lm_head = m->embed;
		m->d_lm_head = m->d_embed;
	}
	for (int l = 0; l < spec->n_layers; l++)
		if (m->k.flash[l] && !hp_flash_attention_supports(spec->head_dim)) {
			rc = hp_err_set(e, HP_ECONFIG, "flash_attention takes head_dim up to %d, the model has %d; "
					"leave its attention on the reference", HP_FLASH_ATTENTION_MAX_HEAD_DIM,
					spec->head_dim);
			goto fail;
		}
	/* grouped experts read gate and up as one [2*Im, C] matrix */
	for (int l = 0; l < spec->n_layers; l++)
		for (int x = 0; m->k.grouped[l] && m->lw[l].moe && x < m->El; x++)
			if (m->lw[l].ex[x].wu != m->lw[l].ex[x].wg + (size_t)spec->moe_intermediate * spec->hidden ||
			    m->lg[l].ex[x].wu != m->lg[l].ex[x].wg + (size_t)spec->moe_intermediate * spec->hidden)
				m->k.grouped[l] = 0;
	take_acts(m);                       /* measure */
	if (hp_arena_alloc(&m->aarena, m->aarena.used)) {
		hp_err_set(e, rc, "out of memory for activations (%zu MiB for %d x %d tokens)",
			   m->aarena.used >> 20, B, T);
		goto fail;
	}
	take_acts(m);
	hp_model_spec_rope_table(spec, m->cos_t, m->sin_t, m->S);
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
	for (int l = 0; m->lw && l < m->spec.n_layers; l++) {
		hp_free(m->lw[l].ex);
		hp_free(m->lg[l].ex);
	}
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

static int cmp_param_name(const void *a, const void *b)
{
	return strcmp((*(struct hp_param *const *)a)->name, (*(struct hp_param *const *)b)->name);
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

/*
 * Newer transformers store a layer's experts stacked: experts.gate_up_proj
 * [E, 2*Im, C] (each expert's gate rows, then its up rows) and
 * experts.down_proj [E, C, Im].  Fill expert parameter p from them; returns
 * 1 when p is not an expert tensor or the stacked tensor is absent, 0 when
 * filled, or a negative error.  The whole stacked tensor is converted once
 * and kept in *cache while the same tensor serves the next experts.
 */
static int load_stacked(struct hp_model *m, const struct hp_st_model *st, const char *dir,
			struct hp_param *p, const struct hp_st_tensor **cached, float **cache,
			struct hp_err *e)
{
	const struct hp_model_spec *s = &m->spec;
	int l, x, n = 0, C = s->hidden, Im = s->moe_intermediate, E = s->n_experts;
	char proj[8], name[96];
	const struct hp_st_tensor *t;
	int64_t want0, want1, want2;

	if (sscanf(p->name, "model.layers.%d.mlp.experts.%d.%4[a-z]_proj.weight%n", &l, &x, proj, &n) != 3 ||
	    p->name[n] != '\0')
		return 1;
	int down = !strcmp(proj, "down");
	snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.%s", l, down ? "down_proj" : "gate_up_proj");
	if (!(t = hp_st_model_find(st, name)))
		return 1;
	want0 = E;
	want1 = down ? C : 2 * (int64_t)Im;
	want2 = down ? Im : C;
	if (t->ndim != 3 || t->shape[0] != want0 || t->shape[1] != want1 || t->shape[2] != want2)
		return hp_err_set(e, HP_EFORMAT, "'%s': tensor '%s' has the wrong shape for %d experts of "
				  "%d x %d", dir, name, E, Im, C);
	if (*cached != t) {
		hp_free(*cache);
		*cached = NULL;
		if (!(*cache = hp_malloc((size_t)t->numel * sizeof(float))))
			return hp_err_set(e, HP_ENOMEM, "out of memory reading '%s'", name);
		int rc = hp_st_read_f32(t, *cache, e);
		if (rc)
			return rc;
		*cached = t;
	}
	size_t per = (size_t)want1 * want2;
	const float *src = *cache + (size_t)x * per;
	if (!strcmp(proj, "up"))
		src += (size_t)Im * C;
	memcpy(p->w, src, p->numel * sizeof(float));
	return 0;
}

static int is_stacked_name(const char *name)
{
	int l, n = 0;

	if (sscanf(name, "model.layers.%d.mlp.experts.gate_up_proj%n", &l, &n) == 1 && name[n] == '\0')
		return 1;
	n = 0;
	return sscanf(name, "model.layers.%d.mlp.experts.down_proj%n", &l, &n) == 1 && name[n] == '\0';
}

int hp_model_load_hf(struct hp_model *m, const char *dir, struct hp_err *e)
{
	struct hp_st_model st;
	const struct hp_st_tensor *cached = NULL;
	float *cache = NULL;
	int rc = 0;

	if ((rc = hp_st_model_open(&st, dir, e)))
		return rc;
	for (int i = 0; i < m->nparams && !rc; i++) {
		struct hp_param *p = &m->params[i];
		const struct hp_st_tensor *t = hp_st_model_find(&st, p->name);
		char want[64], got[64];

		if (!t && m->n_moe) {
			rc = load_stacked(m, &st, dir, p, &cached, &cache, e);
			if (rc <= 0)
				continue;
			rc = 0;
		}
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
	/* Every tensor in the checkpoint must be one the model uses: a sorted
	 * index of the parameter names keeps this O(n log n) for checkpoints of
	 * tens of thousands of expert tensors. */
	struct hp_param **byname = rc ? NULL : hp_malloc((size_t)m->nparams * sizeof(*byname));
	if (!rc && !byname)
		rc = hp_err_set(e, HP_ENOMEM, "out of memory checking '%s'", dir);
	for (int i = 0; byname && i < m->nparams; i++)
		byname[i] = &m->params[i];
	if (byname)
		qsort(byname, (size_t)m->nparams, sizeof(*byname), cmp_param_name);
	for (size_t j = 0; j < st.ntensors && !rc; j++) {
		const struct hp_st_tensor *t = st.tensors[j];
		struct hp_param key, *kp = &key;
		snprintf(key.name, sizeof(key.name), "%s", t->name);
		if ((strlen(t->name) < sizeof(key.name) &&
		     bsearch(&kp, byname, (size_t)m->nparams, sizeof(*byname), cmp_param_name)) ||
		    (m->n_moe && is_stacked_name(t->name)))
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
	hp_free(byname);
	hp_free(cache);
	hp_st_model_close(&st);
	return rc;
}

int hp_model_save_grads(const struct hp_model *m, const char *path, size_t nmeta,
			const char *const *keys, const char *const *vals, struct hp_err *e)
{
	struct hp_st_entry *ent = hp_calloc((size_t)m->nparams, sizeof(*ent));
	int rc;

	if (!ent)
		return hp_err_set(e, HP_ENOMEM, "out of memory writing '%s'", path);
	for (int i = 0; i < m->nparams; i++) {
		const struct hp_param *p = &m->params[i];
		ent[i].name = p->name;
		ent[i].dtype = HP_DTYPE_F32;
		ent[i].ndim = p->ndim;
		ent[i].shape[0] = p->shape[0];
		ent[i].shape[1] = p->shape[1];
		ent[i].data = p->g;
	}
	rc = hp_st_write(path, (size_t)m->nparams, ent, nmeta, keys, vals, e);
	hp_free(ent);
	return rc;
}

void hp_model_zero_grad(struct hp_model *m)
{
	memset(m->flat_g, 0, m->numel * sizeof(float));
}

/* ---- faults injected on purpose ---- */

static const char *const fault_names[HP_NFAULT] = {
	"none", "tp_skip_reduce", "sp_skip_gather", "cp_wrong_offset", "cp_skip_kv_grad_reduce",
	"ep_wrong_route", "ep_drop_token", "fsdp_stale_shard", "grad_scale",
};

const char *hp_fault_name(int f)
{
	return f >= 0 && f < HP_NFAULT ? fault_names[f] : "?";
}

int hp_fault_parse(const char *name)
{
	for (int f = 1; f < HP_NFAULT; f++)
		if (!strcmp(name, fault_names[f]))
			return f;
	return -1;
}

/* Show a module's output to the probe; non-zero stops the forward. */
static int probe(struct hp_model *m, const char *fmt, int l, const float *x, long rows, int cols,
		 int row_split, int col_split)
{
	char name[96];
	struct hp_probe p = { name, x, rows, cols, row_split, col_split };

	if (!m->probe)
		return 0;
	snprintf(name, sizeof(name), fmt, l);
	return m->probe(m->probe_ctx, &p);
}

/* ---- collectives at module boundaries ---- */

static struct hp_comm *dimc(struct hp_model *m, int d)
{
	return &m->par.cs->dim[d];
}

static void par_rc(struct hp_model *m, int rc)
{
	if (rc && !m->par_rc)
		m->par_rc = rc;
}

/* A block's entry: y [N,C] from this rank's rows src [Ns,C] (sequence
 * parallel: all-gathered over tp; else src is y). */
static void tp_gather(struct hp_model *m, float *y, const float *src)
{
	long N = (long)m->B * m->T;
	size_t C = (size_t)m->spec.hidden;

	if (m->Ns == N) {
		if (y != src)
			memcpy(y, src, (size_t)N * C * sizeof(float));
		return;
	}
	par_rc(m, hp_comm_allgather(dimc(m, HP_DIM_TP), src, y, (size_t)m->Ns * C, HP_DTYPE_F32, NULL));
}

/* A block's exit: partial [N,C] holds this rank's share of a sum over tp;
 * returns the sum's rows this rank keeps: reduce-scattered into out [Ns,C]
 * (sequence parallel), or all-reduced in place. */
static float *tp_reduce(struct hp_model *m, float *partial, float *out)
{
	long N = (long)m->B * m->T;
	size_t C = (size_t)m->spec.hidden;

	if (m->par.tp == 1)
		return partial;
	if (m->par.sp) {
		par_rc(m, hp_comm_reduce_scatter(dimc(m, HP_DIM_TP), partial, out, (size_t)m->Ns * C,
						 HP_DTYPE_F32, HP_RED_SUM, NULL));
		return out;
	}
	par_rc(m, hp_comm_allreduce(dimc(m, HP_DIM_TP), partial, (size_t)N * C, HP_DTYPE_F32, HP_RED_SUM, NULL));
	return partial;
}

/* Vocab-parallel embedding: rows of the rank's vocabulary slice, zero for
 * the others (their ranks add theirs). */
static void embed_fwd(struct hp_model *m, float *out, const int32_t *ids, long N)
{
	int C = m->spec.hidden, V = m->spec.vocab;

	for (long n = 0; n < N; n++) {
		int t = ids[n] - m->v0;

		if (t >= 0 && t < V)
			memcpy(out + n * C, m->embed + (long)t * C, (size_t)C * sizeof(float));
		else
			memset(out + n * C, 0, (size_t)C * sizeof(float));
	}
}

static void embed_bwd(struct hp_model *m, const float *dout, const int32_t *ids, long N)
{
	int C = m->spec.hidden, V = m->spec.vocab;

	for (long n = 0; n < N; n++) {
		int t = ids[n] - m->v0;

		if (t < 0 || t >= V || ids[n] == m->spec.pad_token_id)   /* padding_idx: no gradient */
			continue;
		float *row = m->d_embed + (long)t * C;
		const float *d = dout + n * C;
		for (int c = 0; c < C; c++)
			row[c] += d[c];
	}
}

/* ---- attention: one rank, or context parallel ---- */

/*
 * The all-gather of K and V: each rank packs [K | V] of its chunk, the
 * gathered blocks come back in cp-rank order and are laid out as whole
 * rows [B, S, Hkv*D] for the chunk kernel (kernels/cpu/cpattn.c).
 */
static void cp_gather_kv(struct hp_model *m, struct hp_layer_act *a)
{
	int B = m->B, T = m->T, cp = m->par.cp;
	size_t KD = (size_t)m->spec.n_kv_heads * m->spec.head_dim, blk = (size_t)T * KD, n = (size_t)B * blk;

	memcpy(m->cp_send, a->k, n * sizeof(float));
	memcpy(m->cp_send + n, a->v, n * sizeof(float));
	par_rc(m, hp_comm_allgather(dimc(m, HP_DIM_CP), m->cp_send, m->cp_recv, 2 * n, HP_DTYPE_F32, NULL));
	for (int r = 0; r < cp; r++)
		for (int b = 0; b < B; b++) {
			const float *src = m->cp_recv + (size_t)r * 2 * n + (size_t)b * blk;
			size_t at = ((size_t)b * m->S + (size_t)r * T) * KD;

			memcpy(a->kg + at, src, blk * sizeof(float));
			memcpy(a->vg + at, src + n, blk * sizeof(float));
		}
}

/* Its backward: every rank's dK, dV of the whole rows [B,S,Hkv*D] (in
 * cp_recv) reduce-scattered, each rank keeping its chunk's. */
static void cp_scatter_dkv(struct hp_model *m, int skip)
{
	int B = m->B, T = m->T, cp = m->par.cp;
	size_t KD = (size_t)m->spec.n_kv_heads * m->spec.head_dim, blk = (size_t)T * KD, n = (size_t)B * blk;
	size_t whole = (size_t)B * m->S * KD;

	for (int r = 0; r < cp; r++)
		for (int b = 0; b < B; b++) {
			float *dst = m->cp_send + (size_t)r * 2 * n + (size_t)b * blk;
			size_t at = ((size_t)b * m->S + (size_t)r * T) * KD;

			memcpy(dst, m->cp_recv + at, blk * sizeof(float));
			memcpy(dst + n, m->cp_recv + whole + at, blk * sizeof(float));
		}
	if (skip)   /* the fault: only this rank's own contribution to its keys */
		memcpy(m->cp_recv, m->cp_send + (size_t)m->par.cp_rank * 2 * n, 2 * n * sizeof(float));
	else
		par_rc(m, hp_comm_reduce_scatter(dimc(m, HP_DIM_CP), m->cp_send, m->cp_recv, 2 * n, HP_DTYPE_F32,
						 HP_RED_SUM, NULL));
	memcpy(m->dk, m->cp_recv, n * sizeof(float));
	memcpy(m->dv, m->cp_recv + n, n * sizeof(float));
}

/*
 * Ulysses: the all-to-all that trades this rank's tokens of every head for
 * every token of its heads.  Per tensor x of H heads: to (dir 0) the head
 * split, x local [B, T, H, D] -> xs [B, S, H/cp, D]; back (dir 1) the
 * reverse.  nt tensors go in one call, packed per peer.
 */
struct ul_t {
	float *loc, *split;
	int H;
};

static void ulysses(struct hp_model *m, struct ul_t *x, int nt, int dir)
{
	int B = m->B, T = m->T, cp = m->par.cp, D = m->spec.head_dim;
	size_t per = 0;

	for (int i = 0; i < nt; i++)
		per += (size_t)B * T * (x[i].H / cp) * D;
	for (int r = 0; r < cp; r++) {
		float *o = m->cp_send + (size_t)r * per;

		for (int i = 0; i < nt; i++) {
			int Hc = x[i].H / cp;
			size_t row = (size_t)Hc * D;

			for (int b = 0; b < B; b++)
				for (int t = 0; t < T; t++, o += row) {
					const float *src = dir == 0 ?
						x[i].loc + (((size_t)b * T + t) * x[i].H + (size_t)r * Hc) * D :
						x[i].split + ((size_t)b * m->S + (size_t)r * T + t) * row;
					memcpy(o, src, row * sizeof(float));
				}
		}
	}
	par_rc(m, hp_comm_alltoall(dimc(m, HP_DIM_CP), m->cp_send, m->cp_recv, per, HP_DTYPE_F32, NULL));
	for (int s = 0; s < cp; s++) {
		const float *in = m->cp_recv + (size_t)s * per;

		for (int i = 0; i < nt; i++) {
			int Hc = x[i].H / cp;
			size_t row = (size_t)Hc * D;

			for (int b = 0; b < B; b++)
				for (int t = 0; t < T; t++, in += row) {
					float *dst = dir == 0 ?
						x[i].split + ((size_t)b * m->S + (size_t)s * T + t) * row :
						x[i].loc + (((size_t)b * T + t) * x[i].H + (size_t)s * Hc) * D;
					memcpy(dst, in, row * sizeof(float));
				}
		}
	}
}

/* The attention kernel itself, on q, k, v as the exchanges left them
 * (all-gathered K and V, or the ulysses head split). */
static void attention_core(struct hp_model *m, int l)
{
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->act[l];
	int D = s->head_dim, Hq = s->n_heads, Hkv = s->n_kv_heads, cp = m->par.cp, fl = m->k.flash[l];

	if (cp_ag(m)) {
		int q0 = l == 0 && m->fault == HP_FAULT_CP_WRONG_OFFSET ? 0 : m->par.cp_rank * m->T;

		hp_cp_attention_fwd(a->att, fl ? NULL : a->P, fl ? a->P : NULL, a->q, a->kg, a->vg, m->seg,
				    m->B, m->T, m->S, q0, Hq, Hkv, D);
	} else if (cp_ul(m)) {
		if (fl)
			hp_flash_attention_fwd(a->att_u, a->P, a->q, a->k, a->v, m->seg, m->B, m->S, Hq / cp,
					       Hkv / cp, D);
		else
			m->ops->attention_fwd(a->att_u, a->P, a->q, a->k, a->v, m->seg, m->B, m->S, Hq / cp,
					      Hkv / cp, D);
	} else if (fl) {
		hp_flash_attention_fwd(a->att, a->P, a->q, a->k, a->v, m->seg, m->B, m->T, Hq, Hkv, D);
	} else {
		m->ops->attention_fwd(a->att, a->P, a->q, a->k, a->v, m->seg, m->B, m->T, Hq, Hkv, D);
	}
}

static void attention_fwd(struct hp_model *m, int l)
{
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->act[l];
	int Hq = s->n_heads, Hkv = s->n_kv_heads;

	if (cp_ag(m)) {
		cp_gather_kv(m, a);
		attention_core(m, l);
		return;
	}
	if (cp_ul(m)) {
		/* q, k, v go to the head split in place of their local layout (the
		 * backward needs them split; q_raw, k_raw keep what qk_norm needs) */
		struct ul_t x[3] = { { a->q, a->q, Hq }, { a->k, a->k, Hkv }, { a->v, a->v, Hkv } };
		struct ul_t o = { a->att, a->att_u, Hq };

		ulysses(m, x, 3, 0);
		attention_core(m, l);
		ulysses(m, &o, 1, 1);
		return;
	}
	attention_core(m, l);
}

/* m->datt -> m->dq, m->dk, m->dv (this rank's tokens, local layout). */
static void attention_bwd(struct hp_model *m, int l)
{
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->act[l];
	int D = s->head_dim, Hq = s->n_heads, Hkv = s->n_kv_heads, cp = m->par.cp;

	if (cp_ag(m)) {
		size_t whole = (size_t)m->B * m->S * Hkv * D;

		int q0 = l == 0 && m->fault == HP_FAULT_CP_WRONG_OFFSET ? 0 : m->par.cp_rank * m->T;

		hp_cp_attention_bwd(m->dq, m->cp_recv, m->cp_recv + whole, m->datt, a->att,
				    m->k.flash[l] ? NULL : a->P, m->k.flash[l] ? a->P : NULL, a->q, a->kg, a->vg,
				    m->seg, m->dscratch, m->B, m->T, m->S, q0, Hq, Hkv, D);
		cp_scatter_dkv(m, l == 0 && m->fault == HP_FAULT_CP_SKIP_KV_GRAD_REDUCE);
		return;
	}
	if (cp_ul(m)) {
		/* dout to the head split in place, the kernel's gradients back */
		struct ul_t d = { m->datt, m->datt, Hq };
		struct ul_t x[3] = { { m->dq, m->dq, Hq }, { m->dk, m->dk, Hkv }, { m->dv, m->dv, Hkv } };

		ulysses(m, &d, 1, 0);
		if (m->k.flash[l])
			hp_flash_attention_bwd(m->dq, m->dk, m->dv, m->datt, a->att_u, a->P, a->q, a->k, a->v,
					       m->seg, m->dscratch, m->B, m->S, Hq / cp, Hkv / cp, D);
		else
			m->ops->attention_bwd(m->dq, m->dk, m->dv, m->datt, a->P, a->q, a->k, a->v, m->seg,
					      m->dscratch, m->B, m->S, Hq / cp, Hkv / cp, D);
		ulysses(m, x, 3, 1);
		return;
	}
	if (m->k.flash[l])
		hp_flash_attention_bwd(m->dq, m->dk, m->dv, m->datt, a->att, a->P, a->q, a->k, a->v, m->seg,
				       m->dscratch, m->B, m->T, Hq, Hkv, D);
	else
		m->ops->attention_bwd(m->dq, m->dk, m->dv, m->datt, a->P, a->q, a->k, a->v, m->seg,
				      m->dscratch, m->B, m->T, Hq, Hkv, D);
}

/* ---- the sparse MoE block (Qwen3MoeSparseMoeBlock) ---- */

static int first_moe(const struct hp_model *m)
{
	for (int l = 0; l < m->spec.n_layers; l++)
		if (m->lw[l].moe)
			return l;
	return -1;
}

/* Experts x = 0..nx-1 (local) on their rows xe[off[x] .. off[x+1]) -> ye.
 * ye NULL (grouped kernel): the gate|up rows only, all that the backward
 * keeps of them (a checkpointed layer's recomputation). */
static void experts_fwd(struct hp_model *m, int l, const float *xe, const int32_t *off, int nx, float *ye)
{
	const struct hp_model_spec *s = &m->spec;
	const struct hp_cpu_ops *ops = m->ops;
	struct hp_layer_act *a = &m->act[l];
	const struct hp_layer_w *w = &m->lw[l];
	int C = s->hidden, Im = s->moe_intermediate;

	for (int x = 0; x < nx; x++) {
		long r0 = off[x], n = off[x + 1] - off[x];
		if (!n)
			continue;
		if (m->k.grouped[l]) {
			/* gate and up weights are adjacent: one GEMM gives [gate | up] rows */
			ops->linear_fwd(a->ge + r0 * 2 * Im, xe + r0 * C, w->ex[x].wg, NULL, n, C, 2 * Im);
			if (!ye)
				continue;
			hp_swiglu_rows_fwd(m->hrec + r0 * Im, a->ge + r0 * 2 * Im, n, Im);
			ops->linear_fwd(ye + r0 * C, m->hrec + r0 * Im, w->ex[x].wd, NULL, n, Im, C);
			continue;
		}
		ops->linear_fwd(a->ge + r0 * Im, xe + r0 * C, w->ex[x].wg, NULL, n, C, Im);
		ops->linear_fwd(a->ue + r0 * Im, xe + r0 * C, w->ex[x].wu, NULL, n, C, Im);
		ops->swiglu_fwd(a->he + r0 * Im, a->ge + r0 * Im, a->ue + r0 * Im, n * Im);
		ops->linear_fwd(ye + r0 * C, a->he + r0 * Im, w->ex[x].wd, NULL, n, Im, C);
	}
}

/* Backward of experts_fwd: dye -> dxe, weight gradients added.  h_ready:
 * (grouped) hrec already holds the SwiGLU outputs, recomputed for the
 * experts' outputs. */
static void experts_bwd(struct hp_model *m, int l, const float *xe, const int32_t *off, int nx,
			const float *dye, float *dxe, int h_ready)
{
	const struct hp_model_spec *s = &m->spec;
	const struct hp_cpu_ops *ops = m->ops;
	struct hp_layer_act *a = &m->act[l];
	const struct hp_layer_w *w = &m->lw[l];
	struct hp_layer_w *g = &m->lg[l];
	int C = s->hidden, Im = s->moe_intermediate;

	for (int x = 0; x < nx; x++) {
		long r0 = off[x], n = off[x + 1] - off[x];
		if (!n)
			continue;
		if (m->k.grouped[l]) {
			/* the SwiGLU output is recomputed rather than kept (unless the
			 * recomputed expert outputs needed it first) */
			if (!h_ready)
				hp_swiglu_rows_fwd(m->hrec + r0 * Im, a->ge + r0 * 2 * Im, n, Im);
			ops->linear_bwd(m->dhe + r0 * Im, g->ex[x].wd, NULL, dye + r0 * C, m->hrec + r0 * Im,
					w->ex[x].wd, n, Im, C, 0);
			hp_swiglu_rows_bwd(m->dge + r0 * 2 * Im, m->dhe + r0 * Im, a->ge + r0 * 2 * Im, n, Im);
			ops->linear_bwd(dxe + r0 * C, g->ex[x].wg, NULL, m->dge + r0 * 2 * Im, xe + r0 * C,
					w->ex[x].wg, n, C, 2 * Im, 0);
			continue;
		}
		ops->linear_bwd(m->dhe + r0 * Im, g->ex[x].wd, NULL, dye + r0 * C, a->he + r0 * Im,
				w->ex[x].wd, n, Im, C, 0);
		ops->swiglu_bwd(m->dge + r0 * Im, m->due + r0 * Im, m->dhe + r0 * Im, a->ge + r0 * Im,
				a->ue + r0 * Im, n * Im);
		ops->linear_bwd(dxe + r0 * C, g->ex[x].wg, NULL, m->dge + r0 * Im, xe + r0 * C,
				w->ex[x].wg, n, C, Im, 0);
		ops->linear_bwd(dxe + r0 * C, g->ex[x].wu, NULL, m->due + r0 * Im, xe + r0 * C,
				w->ex[x].wu, n, C, Im, 1);
	}
}

/*
 * Expert parallelism: send [NK rows, expert-major, C] to the ranks of their
 * experts (rank r owns experts r*El ..), with the per-expert counts first,
 * so that each rank receives, from each peer, its rows grouped by local
 * expert; regroup them expert-major (a->ep_perm remembers the order) into
 * a->xe with a->ep_off.  routed: whether the bytes depend on the routing.
 */
static void ep_dispatch_counts(struct hp_model *m, int l)
{
	struct hp_layer_act *a = &m->act[l];
	int ep = m->par.ep, El = m->El, E = m->spec.n_experts;
	int32_t *cnt = m->moe_fill, *rcnt = m->moe_fill + E;   /* [E] sent, [ep*El] = [E] received */
	long at = 0;

	for (int x = 0; x < E; x++)
		cnt[x] = a->ex_off[x + 1] - a->ex_off[x];
	par_rc(m, hp_comm_alltoall(dimc(m, HP_DIM_EP), cnt, rcnt, (size_t)El, HP_DTYPE_I32, NULL));
	for (int r = 0; r < ep; r++) {
		a->ep_scount[r] = a->ex_off[(r + 1) * El] - a->ex_off[r * El];
		a->ep_rcount[r] = 0;
		for (int x = 0; x < El; x++)
			a->ep_rcount[r] += rcnt[r * El + x];
	}
	/* expert-major order of the received rows: expert x's rows from peer 0,
	 * then peer 1, ...; the rows of (peer s, expert x) sit in the receive
	 * buffer at s's block, after s's rows for experts before x */
	a->ep_off[0] = 0;
	for (int x = 0; x < El; x++) {
		long n = 0;
		for (int r = 0; r < ep; r++) {
			long src = 0;
			for (int q = 0; q < r; q++)
				src += a->ep_rcount[q];
			for (int y = 0; y < x; y++)
				src += rcnt[r * El + y];
			for (int j = 0; j < rcnt[r * El + x]; j++)
				a->ep_perm[at++] = (int32_t)(src + j);
			n += rcnt[r * El + x];
		}
		a->ep_off[x + 1] = a->ep_off[x] + (int32_t)n;
	}
	a->ep_rows = at;
}

/* Rows out (dir 0: to the experts, send order -> recv order) or back. */
static void ep_exchange(struct hp_model *m, int l, const float *send, float *recv, int back)
{
	struct hp_layer_act *a = &m->act[l];
	int ep = m->par.ep, C = m->spec.hidden;
	int sc[HP_MAX_EP], sd[HP_MAX_EP], rc[HP_MAX_EP], rd[HP_MAX_EP];
	const int32_t *so = back ? a->ep_rcount : a->ep_scount, *ro = back ? a->ep_scount : a->ep_rcount;

	for (int r = 0, s0 = 0, r0 = 0; r < ep; r++) {
		sc[r] = so[r] * C;
		rc[r] = ro[r] * C;
		sd[r] = s0;
		rd[r] = r0;
		s0 += sc[r];
		r0 += rc[r];
	}
	par_rc(m, hp_comm_alltoallv(dimc(m, HP_DIM_EP), send, sc, sd, recv, rc, rd, HP_DTYPE_F32, back, NULL));
}

/*
 * Router: probs = softmax(xn2 Wr^T) in fp32, the top-k experts by falling
 * probability (ties to the lower index), their weights renormalized to sum
 * to one when norm_topk_prob.  Rows are then grouped expert-major, each
 * expert runs its SwiGLU on its rows as one GEMM per projection, and every
 * token's output is the weighted sum of its experts' outputs, added in
 * expert order as HF's index_add_ loop does.  With ep > 1 the rows travel
 * to their experts' ranks and back (ep_dispatch_counts, ep_exchange).
 */
/* The MoE block of layer l into out [Ns, C]; re (recomputation): what its
 * backward reads only, neither the grouped experts' outputs, which the
 * backward makes again, nor out. */
static void moe_forward(struct hp_model *m, int l, float *out, int re)
{
	const struct hp_model_spec *s = &m->spec;
	const struct hp_cpu_ops *ops = m->ops;
	struct hp_layer_act *a = &m->act[l];
	const struct hp_layer_w *w = &m->lw[l];
	long N = m->Ns;
	int C = s->hidden, E = s->n_experts, K = s->top_k;

	ops->linear_fwd(a->probs, a->xn2, w->router, NULL, N, C, E);
	hp_router_topk(a->probs, a->sel, a->wsel, N, E, K, s->norm_topk_prob);
	/* the fault: the first token's first row goes to an expert of the next ep rank */
	if (m->fault == HP_FAULT_EP_WRONG_ROUTE && m->par.ep > 1 && l == first_moe(m) && N > 0)
		a->sel[0] = (a->sel[0] + m->El) % E;
	/* expert-major rows */
	int32_t *off = a->ex_off;
	memset(off, 0, sizeof(int32_t) * (size_t)(E + 1));
	for (long i = 0; i < N * K; i++)
		off[a->sel[i] + 1]++;
	for (int x = 0; x < E; x++)
		off[x + 1] += off[x];
	memcpy(m->moe_fill, off, sizeof(int32_t) * (size_t)E);
	for (long t = 0; t < N; t++)
		for (int k = 0; k < K; k++) {
			int32_t r = m->moe_fill[a->sel[t * K + k]]++;
			a->row_tok[r] = (int32_t)t;
			a->row_slot[r] = k;
		}
	if (m->par.ep > 1) {
		/* HF's index_select into the send buffer; the experts' ranks get them */
		for (long r = 0; r < N * K; r++)
			memcpy(m->ep_send + r * C, a->xn2 + (long)a->row_tok[r] * C, sizeof(float) * (size_t)C);
		ep_dispatch_counts(m, l);
		ep_exchange(m, l, m->ep_send, m->ep_recv, 0);
		for (long r = 0; r < a->ep_rows; r++)
			memcpy(a->xe + r * C, m->ep_recv + (long)a->ep_perm[r] * C, sizeof(float) * (size_t)C);
		experts_fwd(m, l, a->xe, a->ep_off, m->El, m->ep_recv);
		for (long r = 0; r < a->ep_rows; r++)
			memcpy(m->ep_send + (long)a->ep_perm[r] * C, m->ep_recv + r * C, sizeof(float) * (size_t)C);
		ep_exchange(m, l, m->ep_send, a->ye, 1);
		if (m->fault == HP_FAULT_EP_DROP_TOKEN && l == first_moe(m) && N > 0)
			memset(a->ye, 0, sizeof(float) * (size_t)C);   /* the fault: one row lost */
	} else {
		/* HF's index_select: every routed row copied out; the grouped kernel
		 * gathers rows into one shared buffer instead of keeping a copy */
		float *xe = m->k.grouped[l] ? m->xg : a->xe;
		for (long r = 0; r < N * K; r++)
			memcpy(xe + r * C, a->xn2 + (long)a->row_tok[r] * C, sizeof(float) * (size_t)C);
		experts_fwd(m, l, xe, off, E, a->ye ? a->ye : re ? NULL : m->dxe);
	}
	if (re)
		return;
	const float *ye = a->ye ? a->ye : m->dxe;
	memset(out, 0, sizeof(float) * (size_t)N * C);
	for (long r = 0; r < N * K; r++) {
		long t = a->row_tok[r];
		float wt = a->wsel[t * K + a->row_slot[r]];
		const float *y = ye + r * C;
		float *o = out + t * C;
		for (int c = 0; c < C; c++)
			o[c] += y[c] * wt;
	}
}

/*
 * HF's load_balancing_loss_func over every MoE layer of this forward:
 * with all router outputs concatenated (n tokens), F_e = (slots routed to
 * e) / n and P_e = mean probability of e; aux = E * sum_e F_e * P_e.
 * The micro-batch's tokens are spread over cp (and tp with sequence
 * parallelism): the per-expert sums are all-reduced there.
 */
static void moe_aux_add(struct hp_model *m, int l)
{
	const struct hp_model_spec *s = &m->spec;
	long N = m->Ns;
	int E = s->n_experts, K = s->top_k;
	double *F = m->aux_frac, *P = m->aux_frac + E;

	for (long i = 0; i < N * K; i++)
		F[m->act[l].sel[i]] += 1;
	for (long t = 0; t < N; t++)
		for (int x = 0; x < E; x++)
			P[x] += m->act[l].probs[t * E + x];
}

/* after every MoE layer's moe_aux_add, in layer order (a checkpointed
 * layer's router outputs do not outlive its forward) */
static void moe_aux(struct hp_model *m)
{
	const struct hp_model_spec *s = &m->spec;
	int E = s->n_experts;
	double n = (double)m->B * m->S * m->n_moe, aux = 0, *F = m->aux_frac, *P = m->aux_frac + E;

	if (m->par.cp > 1)
		par_rc(m, hp_comm_allreduce(dimc(m, HP_DIM_CP), F, 2 * (size_t)E, HP_DTYPE_F64, HP_RED_SUM, NULL));
	if (m->par.sp)
		par_rc(m, hp_comm_allreduce(dimc(m, HP_DIM_TP), F, 2 * (size_t)E, HP_DTYPE_F64, HP_RED_SUM, NULL));
	for (int x = 0; x < E; x++) {
		F[x] /= n;
		aux += F[x] * (P[x] / n);
	}
	m->aux_loss = aux * E;
}

/* Backward of moe_forward: dout is d(loss)/d(out) [N,C]; writes dxn [N,C]. */
static void moe_backward(struct hp_model *m, int l, const float *dout, float *dxn, double aux_grad)
{
	const struct hp_model_spec *s = &m->spec;
	const struct hp_cpu_ops *ops = m->ops;
	struct hp_layer_act *a = &m->act[l];
	const struct hp_layer_w *w = &m->lw[l];
	struct hp_layer_w *g = &m->lg[l];
	long N = m->Ns;
	int C = s->hidden, E = s->n_experts, K = s->top_k;
	float *dprob = m->dprob, *dxe = m->dxe;

	/* the experts' outputs again where they were not kept (grouped, one
	 * rank): the SwiGLU from the saved gate|up rows, then down_proj, into
	 * dxe's room, which the experts' backward overwrites only later */
	const float *ye = a->ye;
	if (!ye) {
		int Im = s->moe_intermediate;

		for (int x = 0; x < E; x++) {
			long r0 = a->ex_off[x], n = a->ex_off[x + 1] - a->ex_off[x];
			if (!n)
				continue;
			hp_swiglu_rows_fwd(m->hrec + r0 * Im, a->ge + r0 * 2 * Im, n, Im);
			ops->linear_fwd(m->dxe + r0 * C, m->hrec + r0 * Im, w->ex[x].wd, NULL, n, Im, C);
		}
		ye = m->dxe;
	}
	/* through the weighted sum: dy_r = w * dout_t, dw = dout_t . y_r */
	float *dws = m->dwsel;
	for (long r = 0; r < N * K; r++) {
		long t = a->row_tok[r];
		int k = a->row_slot[r];
		float wt = a->wsel[t * K + k];
		const float *d = dout + t * C, *y = ye + r * C;
		float *dy = m->dye + r * C;
		double dot = 0;
		for (int c = 0; c < C; c++) {
			dy[c] = d[c] * wt;
			dot += (double)d[c] * y[c];
		}
		dws[t * K + k] = (float)dot;
	}
	if (m->par.ep > 1) {
		/* dY to the experts' ranks, dX back, the forward's routes reversed */
		ep_exchange(m, l, m->dye, m->ep_recv, 0);
		for (long r = 0; r < a->ep_rows; r++)
			memcpy(m->dye + r * C, m->ep_recv + (long)a->ep_perm[r] * C, sizeof(float) * (size_t)C);
		experts_bwd(m, l, a->xe, a->ep_off, m->El, m->dye, m->dxe, 0);
		for (long r = 0; r < a->ep_rows; r++)
			memcpy(m->ep_send + (long)a->ep_perm[r] * C, m->dxe + r * C, sizeof(float) * (size_t)C);
		ep_exchange(m, l, m->ep_send, m->ep_recv, 1);
		dxe = m->ep_recv;
	} else {
		const float *xe = a->xe;
		if (m->k.grouped[l]) {   /* the routed rows again, for the weight gradients */
			for (long r = 0; r < N * K; r++)
				memcpy(m->xg + r * C, a->xn2 + (long)a->row_tok[r] * C, sizeof(float) * (size_t)C);
			xe = m->xg;
		}
		experts_bwd(m, l, xe, a->ex_off, E, m->dye, m->dxe, !a->ye);
	}
	/* routing weights -> probabilities of the chosen experts -> router logits */
	hp_router_bwd(dprob, a->probs, a->sel, a->wsel, dws, m->aux_frac, aux_grad, N, E, K, s->norm_topk_prob);
	ops->linear_bwd(dxn, g->router, NULL, dprob, a->xn2, w->router, N, C, E, 0);
	for (long r = 0; r < N * K; r++) {
		float *d = dxn + (long)a->row_tok[r] * C;
		const float *x = dxe + r * C;
		for (int c = 0; c < C; c++)
			d[c] += x[c];
	}
}

static int chunked(const struct hp_model *m)
{
	return m->k.ce_chunk > 0 && m->k.ce_chunk < (long)m->B * m->T;
}

/* x = a + b over n floats: HF's residual add (x may be a or b) */
static void residual_add(float *x, const float *a, const float *b, long n)
{
	for (long i = 0; i < n; i++)
		x[i] = a[i] + b[i];
}

/*
 * A norm's input x is the residual a + b (b NULL: x already holds it; a
 * NULL: nothing owed), then y = rmsnorm(x): in one pass with the fused
 * kernel, else HF's add then norm.
 */
static void norm_in(int fused, float *x, float *y, float *rstd, const float *a, const float *b,
		    const float *w, long N, int C, float eps)
{
	if (fused) {
		hp_rmsnorm_res_fwd(x, y, rstd, a ? a : x, a ? b : NULL, w, N, C, eps);
		return;
	}
	if (a)
		residual_add(x, a, b, N * C);
	hp_rmsnorm_fwd(y, rstd, x, w, N, C, eps);
}

/* Cross-entropy of the vocab-parallel logits [N, V/tp]: with loss_parallel
 * the row maxima and sums are all-reduced over tp; else every rank's
 * logits are all-gathered and each rank reduces them alike.  Leaves the
 * row statistics in vp_mx, vp_st for the backward. */
static int vp_loss(struct hp_model *m, const int32_t *targets, double *loss_sum, long *count)
{
	long N = (long)m->B * m->T;
	int Vl = m->spec.vocab, tp = m->par.tp;
	struct hp_comm *c = dimc(m, HP_DIM_TP);
	double *st = m->vp_st, *st2 = m->vp_st + 2 * N;
	float *mx = m->vp_mx, *mx2 = m->vp_mx + N;

	if (m->par.loss_parallel) {
		hp_vp_ce_max(mx, m->logits, N, Vl);
		par_rc(m, hp_comm_allreduce(c, mx, (size_t)N, HP_DTYPE_F32, HP_RED_MAX, NULL));
		hp_vp_ce_sums(st, m->logits, mx, targets, N, Vl, m->v0);
		par_rc(m, hp_comm_allreduce(c, st, 2 * (size_t)N, HP_DTYPE_F64, HP_RED_SUM, NULL));
	} else {
		par_rc(m, hp_comm_allgather(c, m->logits, m->glogits, (size_t)N * Vl, HP_DTYPE_F32, NULL));
		for (int r = 0; r < tp; r++) {
			hp_vp_ce_max(r ? mx2 : mx, m->glogits + (size_t)r * N * Vl, N, Vl);
			for (long n = 0; r && n < N; n++)
				if (mx2[n] > mx[n])
					mx[n] = mx2[n];
		}
		for (int r = 0; r < tp; r++) {
			hp_vp_ce_sums(r ? st2 : st, m->glogits + (size_t)r * N * Vl, mx, targets, N, Vl, r * Vl);
			for (long n = 0; r && n < 2 * N; n++)
				st[n] += st2[n];
		}
	}
	return hp_vp_ce_loss(loss_sum, count, st, mx, targets, N, m->gspec.vocab);
}

/*
 * Layer l's forward from its input x_in (plus the residual ra + rb owed to
 * it; NULL: x_in holds it already) up to mlp_out, which a dense layer
 * writes into the next layer's input.  re: the backward's recomputation
 * of a checkpointed layer: the same operations and collectives into the
 * same (shared) buffers, with m->dx, the residual's live gradient, left
 * alone; it stops where the backward needs nothing more (a dense layer's
 * down_proj), and it neither probes nor calls hooks.
 */
static int layer_fwd(struct hp_model *m, int l, const float *ra, const float *rb, int re)
{
	const struct hp_model_spec *s = &m->spec;
	const struct hp_cpu_ops *ops = m->ops;
	const struct hp_model_par *pr = &m->par;
	long N = (long)m->B * m->T, Ns = m->Ns;
	int C = s->hidden, I = s->intermediate, D = s->head_dim;
	int QD = s->n_heads * D, KD = s->n_kv_heads * D, tp = pr->tp;
	float eps = (float)s->rms_eps;
	struct hp_layer_act *a = &m->act[l];
	const struct hp_layer_w *w = &m->lw[l];
	float *next = l + 1 < s->n_layers ? m->act[l + 1].x_in : m->x_final;
	/* with sequence parallelism a norm's output is this rank's rows, then gathered */
	float *sp_out = re ? m->dxn : m->dx, *nout, *o;

#define PROBE(...) (!re && probe(m, __VA_ARGS__))
	nout = pr->sp ? sp_out : a->xn1;
	norm_in(m->k.fused_in[l], a->x_in, nout, a->rstd1, ra, rb, w->in_norm, Ns, C, eps);
	if (l == 0 && m->fault == HP_FAULT_SP_SKIP_GATHER && pr->sp) {
		/* each rank's own rows only, the others' left out */
		memset(a->xn1, 0, sizeof(float) * (size_t)N * C);
		memcpy(a->xn1 + (size_t)pr->tp_rank * Ns * C, nout, sizeof(float) * (size_t)Ns * C);
	} else {
		tp_gather(m, a->xn1, nout);
	}
	if (PROBE("model.layers.%d.input_layernorm", l, a->xn1, N, C, 0, 0))
		return -2;
	if (s->qk_norm) {
		/* Qwen3: RMSNorm over head_dim, per head, before RoPE */
		ops->linear_fwd(a->q_raw, a->xn1, w->wq, w->bq, N, C, QD);
		ops->linear_fwd(a->k_raw, a->xn1, w->wk, w->bk, N, C, KD);
		hp_rmsnorm_fwd(a->q, a->rstd_q, a->q_raw, w->q_norm, N * s->n_heads, D, eps);
		hp_rmsnorm_fwd(a->k, a->rstd_k, a->k_raw, w->k_norm, N * s->n_kv_heads, D, eps);
	} else {
		ops->linear_fwd(a->q, a->xn1, w->wq, w->bq, N, C, QD);
		ops->linear_fwd(a->k, a->xn1, w->wk, w->bk, N, C, KD);
	}
	ops->linear_fwd(a->v, a->xn1, w->wv, w->bv, N, C, KD);
	hp_rope_fwd(a->q, m->pos, m->cos_t, m->sin_t, N, s->n_heads, D);
	hp_rope_fwd(a->k, m->pos, m->cos_t, m->sin_t, N, s->n_kv_heads, D);
	attention_fwd(m, l);
	if (tp > 1) {
		/* row-parallel: partial sums, reduced, then the bias once */
		o = pr->sp ? m->dxn : a->x_mid;
		ops->linear_fwd(o, a->att, w->wo, NULL, N, QD, C);
		if (l == 0 && m->fault == HP_FAULT_TP_SKIP_REDUCE) {
			if (pr->sp)   /* the rank's rows of its own partial sum */
				memcpy(a->x_mid, o + (size_t)pr->tp_rank * Ns * C, sizeof(float) * (size_t)Ns * C);
		} else {
			tp_reduce(m, o, a->x_mid);
		}
		for (long n = 0; w->bo && n < Ns; n++)
			for (int c = 0; c < C; c++)
				a->x_mid[n * C + c] += w->bo[c];
	} else {
		ops->linear_fwd(a->x_mid, a->att, w->wo, w->bo, N, QD, C);
	}
	if (PROBE("model.layers.%d.self_attn", l, a->x_mid, Ns, C, pr->sp, 0))
		return -2;
	nout = pr->sp && !w->moe ? sp_out : a->xn2;
	norm_in(m->k.fused_post[l], a->x_mid, nout, a->rstd2, a->x_in, a->x_mid, w->post_norm, Ns, C, eps);
	if (w->moe) {
		if (PROBE("model.layers.%d.post_attention_layernorm", l, a->xn2, Ns, C, pr->sp, 0))
			return -2;
		moe_forward(m, l, a->moe_out, re);
		if (PROBE("model.layers.%d.mlp", l, a->moe_out, Ns, C, pr->sp, 0))
			return -2;
		return 0;
	}
	tp_gather(m, a->xn2, nout);
	if (PROBE("model.layers.%d.post_attention_layernorm", l, a->xn2, N, C, 0, 0))
		return -2;
	ops->linear_fwd(a->g, a->xn2, w->wg, NULL, N, C, I);
	ops->linear_fwd(a->u, a->xn2, w->wu, NULL, N, C, I);
	ops->swiglu_fwd(a->h, a->g, a->u, N * I);
	if (re)
		return 0;
	o = pr->sp ? m->dxn : next;
	ops->linear_fwd(o, a->h, w->wd, NULL, N, I, C);
	tp_reduce(m, o, next);
	if (PROBE("model.layers.%d.mlp", l, next, Ns, C, pr->sp, 0))
		return -2;
	return 0;
#undef PROBE
}

int hp_model_forward(struct hp_model *m, const int32_t *ids, const int32_t *targets,
		     const int32_t *seg, double *loss_sum, long *count)
{
	const float *ra = NULL, *rb = NULL;
	const struct hp_model_spec *s = &m->spec;
	const struct hp_cpu_ops *ops = m->ops;
	const struct hp_model_par *pr = &m->par;
	long N = (long)m->B * m->T, Ns = m->Ns;
	int C = s->hidden, V = s->vocab, tp = pr->tp;
	float eps = (float)s->rms_eps;
	/* with sequence parallelism a norm's output is this rank's rows, then gathered */
	float *nout;

	m->par_rc = 0;
	m->seg = seg;
	if (pr->cp > 1) {
		/* this rank's chunk of every row; positions stay those of the whole row */
		for (long n = 0; n < N; n++) {
			long b = n / m->T, at = b * m->S + (long)pr->cp_rank * m->T + n % m->T;

			m->ids_l[n] = ids[at];
			m->tgt_l[n] = targets ? targets[at] : HP_IGNORE_INDEX;
			m->seg_l[n] = seg ? seg[at] : 0;
			m->pos[n] = (int32_t)(at - b * m->S) - m->seg_l[n];
		}
		ids = m->ids_l;
		targets = targets ? m->tgt_l : NULL;
		if (cp_ag(m))
			m->seg = seg ? m->seg_l : NULL;
	} else {
		for (long n = 0; n < N; n++)
			m->pos[n] = (int32_t)(n % m->T) - (seg ? seg[n] : 0);
	}
	if (tp > 1) {
		embed_fwd(m, pr->sp ? m->dxn : m->act[0].x_in, ids, N);
		tp_reduce(m, pr->sp ? m->dxn : m->act[0].x_in, m->act[0].x_in);
	} else {
		hp_embedding_fwd(m->act[0].x_in, ids, m->embed, N, C);
	}
	if (probe(m, "model.embed_tokens", 0, m->act[0].x_in, Ns, C, pr->sp, 0))
		return -2;
	if (m->n_moe && s->output_router_logits)
		memset(m->aux_frac, 0, 2 * sizeof(double) * (size_t)s->n_experts);
	for (int l = 0; l < s->n_layers; l++) {
		struct hp_layer_act *a = &m->act[l];
		float *next = l + 1 < s->n_layers ? m->act[l + 1].x_in : m->x_final;
		int rc;

		if (m->hook && m->hook(m->hook_ctx, l, HP_HOOK_PRE_FORWARD))
			return -2;
		if ((rc = layer_fwd(m, l, ra, rb, 0)))
			return rc;
		/* the residual add x_mid + mlp_out is owed to the next norm's input */
		ra = a->x_mid;
		rb = m->lw[l].moe ? a->moe_out : next;
		if (m->k.ckpt[l] == HP_ACT_CKPT_FULL) {
			/* unless the layer's buffers are shared: the next layer's
			 * would overwrite them, so the add is paid now (the same
			 * float sum the norm would make) */
			residual_add(next, ra, rb, Ns * C);
			ra = rb = NULL;
		}
		if (m->lw[l].moe && s->output_router_logits)
			moe_aux_add(m, l);
		if (m->hook && m->hook(m->hook_ctx, l, HP_HOOK_POST_FORWARD))
			return -2;
	}
	m->aux_loss = 0;
	if (m->n_moe && s->output_router_logits)
		moe_aux(m);
	nout = pr->sp ? m->dx : m->xf;
	norm_in(m->k.fused_final, m->x_final, nout, m->rstd_f, ra, rb, m->final_norm, Ns, C, eps);
	tp_gather(m, m->xf, nout);
	if (probe(m, "model.norm", 0, m->xf, N, C, 0, 0))
		return -2;
	if (tp > 1) {
		ops->linear_fwd(m->logits, m->xf, m->lm_head, NULL, N, C, V);
		if (probe(m, "lm_head", 0, m->logits, N, V, 0, 1))
			return -2;
		if (targets && vp_loss(m, targets, loss_sum, count))
			return -1;
		return m->par_rc ? -2 : 0;
	}
	if (chunked(m)) {
		long ch = m->k.ce_chunk;

		*loss_sum = 0;
		*count = 0;
		for (long c0 = 0; targets && c0 < N; c0 += ch) {
			long n = N - c0 < ch ? N - c0 : ch, cnt;
			double ls;

			ops->linear_fwd(m->logits, m->xf + c0 * C, m->lm_head, NULL, n, C, V);
			if (ops->cross_entropy_fwd(&ls, &cnt, m->logits, targets + c0, n, V))
				return -1;
			*loss_sum += ls;
			*count += cnt;
			if (m->ce_scale > 0) {
				/* the scale is known: the head's gradients now, no second pass */
				ops->cross_entropy_bwd(m->logits, m->logits, targets + c0, n, V, (float)m->ce_scale);
				ops->linear_bwd(m->dxn + c0 * C, m->d_lm_head, NULL, m->logits, m->xf + c0 * C,
						m->lm_head, n, C, V, 0);
			}
		}
		m->head_done = targets && m->ce_scale > 0;
		return m->par_rc ? -2 : 0;
	}
	ops->linear_fwd(m->logits, m->xf, m->lm_head, NULL, N, C, V);
	if (probe(m, "lm_head", 0, m->logits, N, V, 0, 0))
		return -2;
	if (targets && ops->cross_entropy_fwd(loss_sum, count, m->logits, targets, N, V))
		return -1;
	return m->par_rc ? -2 : 0;
}

static void norm_bwd(int fused, float *dx, float *dw, const float *dy, const float *x, const float *w,
		     const float *rstd, long N, int C, int accumulate)
{
	if (fused)
		hp_rmsnorm_bwd_vec(dx, dw, dy, x, w, rstd, N, C, accumulate);
	else
		hp_rmsnorm_bwd(dx, dw, dy, x, w, rstd, N, C, accumulate);
}

/* The gradient at a block's entry: this rank's rows of the residual's
 * gradient dx, gathered over tp with sequence parallelism. */
static const float *entry_grad(struct hp_model *m)
{
	if (!m->par.sp)
		return m->dx;
	tp_gather(m, m->dfull, m->dx);
	return m->dfull;
}

void hp_model_backward(struct hp_model *m, const int32_t *ids, const int32_t *targets, double total_count,
		       double aux_weight)
{
	const struct hp_model_spec *s = &m->spec;
	const struct hp_cpu_ops *ops = m->ops;
	const struct hp_model_par *pr = &m->par;
	long N = (long)m->B * m->T, Ns = m->Ns;
	int C = s->hidden, I = s->intermediate, D = s->head_dim, V = s->vocab;
	int QD = s->n_heads * D, KD = s->n_kv_heads * D, tp = pr->tp;
	float *dlogits = m->logits;   /* overwritten in place */
	const float *dy;
	/* d(coef * aux)/dP_e(token) = coef * E * F_e / n, n the MoE tokens of this forward */
	double aux_grad = m->n_moe && s->output_router_logits ?
		aux_weight * s->router_aux_loss_coef * s->n_experts / ((double)m->B * m->S * m->n_moe) : 0;

	float scale = total_count > 0 ? (float)(1.0 / total_count) : 0.0f;

	if (pr->cp > 1) {
		ids = m->ids_l;
		targets = m->tgt_l;
	}
	if (tp > 1) {
		hp_vp_ce_bwd(dlogits, m->logits, m->vp_st, m->vp_mx, targets, N, V, m->v0, scale);
		ops->linear_bwd(m->dxn, m->d_lm_head, NULL, dlogits, m->xf, m->lm_head, N, C, V, 0);
	} else if (chunked(m)) {
		/* the logits of each chunk again, never all of them at once (unless
		 * the forward already did the head's backward) */
		for (long c0 = 0; !m->head_done && c0 < N; c0 += m->k.ce_chunk) {
			long n = N - c0 < m->k.ce_chunk ? N - c0 : m->k.ce_chunk;

			ops->linear_fwd(m->logits, m->xf + c0 * C, m->lm_head, NULL, n, C, V);
			ops->cross_entropy_bwd(m->logits, m->logits, targets + c0, n, V, scale);
			ops->linear_bwd(m->dxn + c0 * C, m->d_lm_head, NULL, m->logits, m->xf + c0 * C,
					m->lm_head, n, C, V, 0);
		}
	} else {
		ops->cross_entropy_bwd(dlogits, m->logits, targets, N, V, scale);
		ops->linear_bwd(m->dxn, m->d_lm_head, NULL, dlogits, m->xf, m->lm_head, N, C, V, 0);
	}
	dy = tp_reduce(m, m->dxn, m->dred);
	norm_bwd(m->k.fused_final, m->dx, m->d_final_norm, dy, m->x_final, m->final_norm, m->rstd_f, Ns, C, 0);
	for (int l = s->n_layers - 1; l >= 0; l--) {
		struct hp_layer_act *a = &m->act[l];
		const struct hp_layer_w *w = &m->lw[l];
		struct hp_layer_w *g = &m->lg[l];

		if (m->hook && m->hook(m->hook_ctx, l, HP_HOOK_PRE_BACKWARD))
			return;
		/* checkpointed: the layer's forward again from its kept input */
		if (m->k.ckpt[l] == HP_ACT_CKPT_FULL)
			layer_fwd(m, l, NULL, NULL, 1);

		/* MLP: x_out = x_mid + mlp(xn2) */
		if (w->moe) {
			moe_backward(m, l, m->dx, m->dxn, aux_grad);
			dy = m->dxn;
		} else {
			const float *din = entry_grad(m);

			ops->linear_bwd(m->dh, g->wd, NULL, din, a->h, w->wd, N, I, C, 0);
			ops->swiglu_bwd(m->dg, m->du, m->dh, a->g, a->u, N * I);
			ops->linear_bwd(m->dxn, g->wg, NULL, m->dg, a->xn2, w->wg, N, C, I, 0);
			ops->linear_bwd(m->dxn, g->wu, NULL, m->du, a->xn2, w->wu, N, C, I, 1);
			dy = tp_reduce(m, m->dxn, m->dred);
		}
		norm_bwd(m->k.fused_post[l], m->dx, g->post_norm, dy, a->x_mid, w->post_norm, a->rstd2, Ns, C, 1);
		/* attention: x_mid = x_in + o_proj(attn(q, k, v)) */
		ops->linear_bwd(m->datt, g->wo, tp > 1 ? NULL : g->bo, entry_grad(m), a->att, w->wo, N, QD, C, 0);
		for (long n = 0; tp > 1 && g->bo && n < Ns; n++)   /* the bias was added once, after the sum */
			for (int c = 0; c < C; c++)
				g->bo[c] += m->dx[n * C + c];
		/* selective: the probabilities again, from the kept q, k, v (the
		 * output it rewrites is the same bits, read only by the backward) */
		if (m->k.ckpt[l] == HP_ACT_CKPT_SELECTIVE && !m->k.flash[l])
			attention_core(m, l);
		attention_bwd(m, l);
		hp_rope_bwd(m->dq, m->pos, m->cos_t, m->sin_t, N, s->n_heads, D);
		hp_rope_bwd(m->dk, m->pos, m->cos_t, m->sin_t, N, s->n_kv_heads, D);
		const float *dqp = m->dq, *dkp = m->dk;
		if (s->qk_norm) {
			hp_rmsnorm_bwd(m->dq2, g->q_norm, m->dq, a->q_raw, w->q_norm, a->rstd_q, N * s->n_heads, D, 0);
			hp_rmsnorm_bwd(m->dk2, g->k_norm, m->dk, a->k_raw, w->k_norm, a->rstd_k, N * s->n_kv_heads, D, 0);
			dqp = m->dq2;
			dkp = m->dk2;
		}
		ops->linear_bwd(m->dxn, g->wq, g->bq, dqp, a->xn1, w->wq, N, C, QD, 0);
		ops->linear_bwd(m->dxn, g->wk, g->bk, dkp, a->xn1, w->wk, N, C, KD, 1);
		ops->linear_bwd(m->dxn, g->wv, g->bv, m->dv, a->xn1, w->wv, N, C, KD, 1);
		dy = tp_reduce(m, m->dxn, m->dred);
		norm_bwd(m->k.fused_in[l], m->dx, g->in_norm, dy, a->x_in, w->in_norm, a->rstd1, Ns, C, 1);
		if (m->hook && m->hook(m->hook_ctx, l, HP_HOOK_POST_BACKWARD))
			return;
	}
	if (tp > 1)
		embed_bwd(m, entry_grad(m), ids, N);
	else
		hp_embedding_bwd(m->d_embed, m->dx, ids, N, C, m->spec.pad_token_id);
}
