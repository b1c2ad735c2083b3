/*
 * model.c - LlamaForCausalLM (and Mistral, Qwen2), Qwen3ForCausalLM and
 * Qwen3MoeForCausalLM in F32: parameter table, buffers, forward and backward, written once over
 * the backend op table (lib/backend/backend.h) for every backend and every
 * parallel layout.
 *
 * It follows transformers' modeling code step by step: embedding, for
 * each layer
 * x += o_proj(attn(rope(qk_norm(q_proj(norm(x)))), rope(..k..), v_proj(..)))
 * and x += mlp(norm(x)), the mlp dense SwiGLU or the sparse MoE block,
 * final norm, LM head, cross-entropy (+ the router's load-balancing loss);
 * the kernels the plan binds (flash attention, fused norms, grouped
 * experts, chunked cross-entropy) and this rank's part of a layout (the
 * collectives at TP/SP, CP and EP module boundaries) are choices made here,
 * the arithmetic is the backend's.  What runs on the host is bookkeeping:
 * positions, routing tables, row counts and the reductions' final sums.
 * Loading and saving by name are in modelio.c.
 */
#include <math.h>

#include "base/alloc.h"
#include "comm/comm.h"
#include "model/model.h"
#include "model/params.h"

static void add_param(struct hp_model *m, size_t *off, const char *name, int ndim, int64_t d0, int64_t d1,
		      float **wslot, float **gslot)
{
	struct hp_param *p = &m->w.params[m->w.nparams++];

	snprintf(p->name, sizeof(p->name), "%s", name);
	p->ndim = ndim;
	p->shape[0] = d0;
	p->shape[1] = ndim > 1 ? d1 : 1;
	p->numel = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
	p->wslot = wslot;
	p->gslot = gslot;
	/* keep every tensor aligned so SIMD paths may assume it */
	*off = (*off + HP_PARAM_ALIGN - 1) & ~(size_t)(HP_PARAM_ALIGN - 1);
	p->offset = *off;
	*off += p->numel;
}

static int count_one(void *ctx, const struct hp_param_desc *d)
{
	(void)d;
	(*(int *)ctx)++;
	return 0;
}

/* Whether a chunk of the rank's stage holds layer l. */
static int holds_layer(const struct hp_model_par *p, int l)
{
	for (int c = 0; c < p->vpp; c++)
		if (l >= p->chunk_l0[c] && l < p->chunk_l1[c])
			return 1;
	return 0;
}

/* The chunk slot k belongs to (par.chunk_slots of them each, in order). */
static int slot_chunk(const struct hp_model_par *p, int k)
{
	int c = 0;

	while (c + 1 < p->vpp && k >= p->chunk_slots[c]) {
		k -= p->chunk_slots[c];
		c++;
	}
	return c;
}

/* Make chunk c's layers the ones a pass runs. */
static void use_chunk(struct hp_model *m, int c)
{
	m->cur_chunk = c;
	m->par.l0 = m->par.chunk_l0[c];
	m->par.l1 = m->par.chunk_l1[c];
}

/* Where the model keeps the pointers of the parameter d describes. */
static int add_one(void *ctx, const struct hp_param_desc *d)
{
	struct hp_model *m = ctx;
	struct hp_layer_w *w = d->layer >= 0 ? &m->w.lw[d->layer] : NULL, *g = d->layer >= 0 ? &m->w.lg[d->layer] : NULL;
	float **ws = NULL, **gs = NULL;
	int64_t d0 = d->shape[0], d1 = d->shape[1];
	int x = d->expert;

	/* a pipeline stage holds its layers, the first the embedding, the last
	 * the final norm and the LM head */
	int last = m->par.pp_rank == m->par.pp - 1;

	if (d->layer >= 0 ? !holds_layer(&m->par, d->layer) :
	    d->field == HP_PF_EMBED ? m->par.pp_rank != 0 && !(last && m->gspec.tie_word_embeddings) : !last)
		return 0;

	/* this rank's part: tp cuts columns' rows and rows' columns; an expert
	 * lives on one ep rank */
	if (d->role == HP_ROLE_EXPERT) {
		if (x < m->lay.e0 || x >= m->lay.e0 + m->lay.El)
			return 0;
		x -= m->lay.e0;
	} else if (d->role == HP_ROLE_COLUMN) {
		d0 /= m->par.tp;
	} else if (d->role == HP_ROLE_ROW) {
		d1 /= m->par.tp;
	}

#define SLOT(f) do { ws = &w->f; gs = &g->f; } while (0)
	switch (d->field) {
	case HP_PF_EMBED: ws = &m->w.embed; gs = &m->w.d_embed; break;
	case HP_PF_FINAL_NORM: ws = &m->w.final_norm; gs = &m->w.d_final_norm; break;
	case HP_PF_LM_HEAD: ws = &m->w.lm_head; gs = &m->w.d_lm_head; break;
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
	case HP_PF_SINKS: SLOT(sinks); break;
	case HP_PF_ROUTER_B: SLOT(router_b); break;
	case HP_PF_EX_GATE_B: ws = &w->ex[x].bg; gs = &g->ex[x].bg; break;
	case HP_PF_EX_UP_B: ws = &w->ex[x].bu; gs = &g->ex[x].bu; break;
	case HP_PF_EX_DOWN_B: ws = &w->ex[x].bd; gs = &g->ex[x].bd; break;
	case HP_PF_Q_A: SLOT(wqa); break;
	case HP_PF_Q_A_B: SLOT(bqa); break;
	case HP_PF_Q_A_NORM: SLOT(qa_norm); break;
	case HP_PF_KV_A: SLOT(wkva); break;
	case HP_PF_KV_A_B: SLOT(bkva); break;
	case HP_PF_KV_A_NORM: SLOT(kva_norm); break;
	case HP_PF_KV_B: SLOT(wkvb); break;
	case HP_PF_ROUTER_CORR: SLOT(router_corr); break;
	case HP_PF_SH_GATE: SLOT(wsg); break;
	case HP_PF_SH_UP: SLOT(wsu); break;
	case HP_PF_SH_DOWN: SLOT(wsd); break;
	case HP_PF_SH_GATE_W: SLOT(wshg); break;
	case HP_PF_LIN_QKVZ: SLOT(wqkvz); break;
	case HP_PF_LIN_BA: SLOT(wba); break;
	case HP_PF_LIN_QKV: SLOT(wqkv); break;
	case HP_PF_LIN_Z: SLOT(wz); break;
	case HP_PF_LIN_B: SLOT(wb); break;
	case HP_PF_LIN_A: SLOT(wa); break;
	case HP_PF_LIN_CONV: SLOT(conv); break;
	case HP_PF_LIN_DT: SLOT(dt_bias); break;
	case HP_PF_LIN_ALOG: SLOT(A_log); break;
	case HP_PF_LIN_NORM: SLOT(lin_norm); break;
	case HP_PF_LIN_OUT: SLOT(wout); break;
	}
#undef SLOT
	add_param(m, &m->w.numel, d->name, d->ndim, d0, d1, ws, gs);
	return 0;
}

static int build_params(struct hp_model *m, struct hp_err *e)
{
	m->w.cap_params = 0;
	hp_model_spec_params(&m->gspec, count_one, &m->w.cap_params);
	m->w.params = hp_calloc((size_t)m->w.cap_params, sizeof(*m->w.params));
	if (!m->w.params)
		return hp_err_set(e, HP_ENOMEM, "out of memory for the parameter table");
	m->w.numel = 0;
	hp_model_spec_params(&m->gspec, add_one, m);
	m->w.numel = (m->w.numel + 15) & ~(size_t)15;
	return 0;
}

/* The experts' stride in the flat arrays (hp_model_spec_params lists
 * them one after another, each the same sizes), which the grouped kernels
 * step by. */
static int expert_stride(struct hp_layer_w *w, int El, struct hp_err *e)
{
	const struct hp_expert_w *x0 = &w->ex[0];

	w->xs = El > 1 ? (size_t)(w->ex[1].wg - x0->wg) : 0;
	for (int x = 1; x < El; x++)
		if (w->ex[x].wg != x0->wg + x * w->xs || w->ex[x].wu != x0->wu + x * w->xs ||
		    w->ex[x].wd != x0->wd + x * w->xs ||
		    (x0->bg && (w->ex[x].bg != x0->bg + x * w->xs || w->ex[x].bd != x0->bd + x * w->xs ||
				w->ex[x].bu != x0->bu + x * w->xs)))
			return hp_err_set(e, HP_EINVAL, "internal: expert %d's tensors are not %zu floats after "
					  "expert %d's", x, w->xs, x - 1);
	return 0;
}

static int any_grouped(const struct hp_model *m)
{
	for (int l = 0; l < m->spec.n_layers; l++)
		if (m->w.lw[l].moe && m->k.grouped[l])
			return 1;
	return 0;
}

/* The current chunk is the model's first virtual stage (the embedding's),
 * or its last (the final norm's and LM head's). */
static int first_stage(const struct hp_model *m)
{
	return m->par.pp_rank == 0 && m->cur_chunk == 0;
}

static int last_stage(const struct hp_model *m)
{
	return m->par.pp_rank == m->par.pp - 1 && m->cur_chunk == m->par.vpp - 1;
}

static int cp_ag(const struct hp_model *m)
{
	return m->par.cp > 1 && !m->par.ulysses;
}

static int cp_ul(const struct hp_model *m)
{
	return m->par.cp > 1 && m->par.ulysses;
}

/* Whether the sliding window masks anything: a window of at least the
 * rows' length is full causal attention (transformers keeps j > i - W). */
static int windowed(const struct hp_model *m)
{
	return m->spec.sliding_window > 0 && m->spec.sliding_window < m->lay.S;
}

static int on_device(const struct hp_model *m)
{
	return m->bk && m->bk->device;
}

static int chunked(const struct hp_model *m)
{
	return m->k.ce_chunk > 0 && m->k.ce_chunk < (long)m->a.B * m->a.T;
}

/* The rows of one LM head call: a chunk of them in one process with the
 * chunked cross-entropy (over tp the vocabulary-parallel loss takes them
 * all), else the micro-batch's tokens. */
static size_t zmax(size_t a, size_t b)
{
	return a > b ? a : b;
}

static size_t head_rows(const struct hp_model *m)
{
	return chunked(m) && m->par.tp == 1 ? (size_t)m->k.ce_chunk : (size_t)m->a.B * m->a.T;
}

/* The attention backward's scratch: a row block for HF's algorithm, the
 * flash kernel's own for flash layers, the context-parallel kernel's. */
static size_t scratch_floats(const struct hp_model *m)
{
	struct hp_backend *bk = m->bk;
	int Tq = cp_ul(m) ? m->lay.S : m->a.T, H = cp_ul(m) ? m->spec.n_heads / m->par.cp : m->spec.n_heads;
	size_t n = 0, fl = bk->flash_scratch(bk, m->a.B, Tq, H, m->spec.head_dim);

	for (int l = 0; l < m->spec.n_layers; l++) {
		size_t x = cp_ag(m) ? bk->cp_attention_scratch(bk, m->lay.S) : m->k.flash[l] ? fl : (size_t)Tq * Tq;

		if (x > n)
			n = x;
	}
	return n ? n : 1;
}

/*
 * A Gated DeltaNet layer's sizes on this rank: tensor parallelism splits
 * its key heads (and with them their value heads) over tp, the weights
 * whole on every rank (each reads its heads' rows, columns and elements;
 * their gradients are partial sums over tp, params.c hp_param_tp_partial).
 * Context parallelism (ulysses) splits the tp rank's heads again over cp:
 * the projections run on this rank's tokens with the tp rank's heads (the
 * "t" sizes), an all-to-all trades them for every token of its cp share
 * of those heads (the core: conv, norms, gates, the delta rule), and
 * another trades the output back.  N * Kd = Nl * tKd: a buffer holds
 * either layout.
 */
struct gdn_dims {
	long N, Nl;                  /* the core's rows (B T, with cp B S), this rank's tokens (B T) */
	int T, cp;                   /* the core's row length; cp, or 1 without the head split */
	int C, Dk, Dv, K, r;         /* r: value heads per key head */
	int Hk, Hv, Kd, Vd;          /* the core's heads and their widths */
	int j0, h0;                  /* its first key and value head */
	int tHk, tHv, tKd, tVd;      /* the tp rank's heads and widths: the projections' */
	int t0, th0;                 /* the tp rank's first key and value head */
	int gKd, gVd;                /* the whole layer's widths */
	int pw, P;                   /* qwen3_next: one key head's [q k v z] rows, the tp rank's */
	float scale;                 /* the delta rule's Dk^-0.5 on q */
};

static struct gdn_dims gdn_dims(const struct hp_model *m)
{
	const struct hp_model_spec *s = &m->spec;
	struct gdn_dims g;

	g.cp = cp_ul(m) ? m->par.cp : 1;
	g.Nl = (long)m->a.B * m->a.T;
	g.N = g.Nl * g.cp;
	g.T = m->a.T * g.cp;
	g.C = s->hidden;
	g.Dk = s->lin_kd;
	g.Dv = s->lin_vd;
	g.K = s->lin_conv;
	g.r = s->lin_vh / s->lin_kh;
	g.tHk = s->lin_kh / m->par.tp;
	g.tHv = g.tHk * g.r;
	g.tKd = g.tHk * g.Dk;
	g.tVd = g.tHv * g.Dv;
	g.t0 = m->par.tp_rank * g.tHk;
	g.th0 = g.t0 * g.r;
	g.Hk = g.tHk / g.cp;
	g.Hv = g.Hk * g.r;
	g.Kd = g.Hk * g.Dk;
	g.Vd = g.Hv * g.Dv;
	g.j0 = g.t0 + (g.cp > 1 ? m->par.cp_rank * g.Hk : 0);
	g.h0 = g.j0 * g.r;
	g.gKd = s->lin_kh * g.Dk;
	g.gVd = s->lin_vh * g.Dv;
	g.pw = 2 * g.Dk + 2 * g.r * g.Dv;
	g.P = g.tHk * g.pw;
	g.scale = (float)(1.0 / sqrt((double)g.Dk));
	return g;
}

/* The q, k and v rows (part 0, 1, 2) of the conv or of in_proj_qkv for
 * the heads from key head j0 on. */
static size_t qkv_row(const struct gdn_dims *g, int part, int j0)
{
	return part == 0 ? (size_t)j0 * g->Dk : part == 1 ? (size_t)g->gKd + (size_t)j0 * g->Dk :
	       2 * (size_t)g->gKd + (size_t)j0 * g->r * g->Dv;
}

/* The Gated DeltaNet layers' scratch of one pass (gdn_fwd, gdn_bwd), and
 * gated attention's and the gated shared expert's. */
static size_t gdn_scratch_floats(const struct hp_model *m)
{
	const struct hp_model_spec *s = &m->spec;
	size_t N = (size_t)m->a.B * m->a.T, n = 0;

	if (s->n_linear) {   /* gdn_bwd's carving, this rank's heads (gdn_fwd's is within it) */
		struct gdn_dims g = gdn_dims(m);
		size_t Kd = g.Kd, Vd = g.Vd, Hv = g.Hv, Nc = (size_t)g.N;
		/* qwen3_next's interleaved projections (dp, dpba), out_proj's
		 * columns under tp (ws, dws) */
		size_t P = s->lin_split ? 0 : (size_t)g.Nl * g.P, B = s->lin_split ? 0 : 2 * Nc * Hv;
		size_t W = m->par.tp > 1 ? (size_t)g.C * g.tVd : 0;

		n = Nc * (4 * Vd + 4 * Kd + 4 * Hv + 2 * Kd + Vd) + B + 2 * W + P;
	}
	if (s->attn_gate)
		n = zmax(n, 4 * N * (size_t)s->n_heads * s->head_dim);
	if (s->shared_gate)
		n = zmax(n, (size_t)m->lay.Ns * (s->hidden + 1));
	return n;
}

/*
 * The model's buffers come from arenas: floats (and the index arrays the
 * kernels read) from the activation arena in the backend's memory; on a
 * device backend, the index arrays' host copies and what only the host
 * reads from harena.  On the CPU both are one array of the activation
 * arena, taken in the same order as they always were, so that the arena's
 * size is hp-plan's estimate to the byte.
 */
struct takes {
	struct hp_model *m;
	int ok;
};

static void *take_in(struct takes *t, struct hp_arena *a, size_t bytes)
{
	void *p = hp_arena_take(a, bytes);

	t->ok &= p != NULL;
	return p;
}

/* host-only: the activation arena on the CPU, harena on a device */
static int32_t *take_host(struct takes *t, struct hp_arena *a, size_t n)
{
	return take_in(t, on_device(t->m) ? &t->m->a.harena : a, n * sizeof(int32_t));
}

/* both copies */
static void take_pair(struct takes *t, struct hp_arena *a, struct hp_i32 *x, size_t n)
{
	x->d = take_in(t, a, n * sizeof(int32_t));
	x->h = on_device(t->m) ? take_in(t, &t->m->a.harena, n * sizeof(int32_t)) : x->d;
}

/* the backend's copy only: the host's is NULL on a device */
static void take_dev(struct takes *t, struct hp_arena *a, struct hp_i32 *x, size_t n)
{
	x->d = take_in(t, a, n * sizeof(int32_t));
	x->h = on_device(t->m) ? NULL : x->d;
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
	long N = (long)m->a.B * m->a.T, Ns = m->lay.Ns;
	size_t C = s->hidden, I = s->intermediate, QD = (size_t)s->n_heads * s->head_dim,
	       KD = (size_t)s->n_kv_heads * s->head_dim, f = sizeof(float);
	size_t E = s->n_experts, K = s->top_k, Im = s->moe_intermediate, NK = (size_t)Ns * K;
	size_t R = pr->ep > 1 ? (size_t)m->lay.ep_rcap : NK, BS = (size_t)m->a.B * m->lay.S;
	size_t TS = (size_t)m->a.T * m->lay.S;
	struct hp_layer_act *t = &m->a.act[l];
	int full = m->k.ckpt[l] == HP_ACT_CKPT_FULL;
	struct hp_arena *a = full ? work : keep;
	struct hp_arena *pa = full || (m->k.ckpt[l] == HP_ACT_CKPT_SELECTIVE && !m->k.flash[l]) ? work : keep;
	struct takes tk = { m, 1 };

#define TAKE_IN(ar, ptr, bytes) ((ptr) = take_in(&tk, ar, (bytes)))
#define TAKE(ptr, bytes) TAKE_IN(a, ptr, bytes)
	TAKE_IN(keep, t->x_in, Ns * C * f);
	TAKE(t->rstd1, Ns * f);
	TAKE(t->xn1, N * C * f);
	if (s->linear[l]) {   /* Gated DeltaNet (gdn_fwd): this rank's heads, the core's rows */
		struct gdn_dims g = gdn_dims(m);
		size_t Hk = g.Hk, Hv = g.Hv, Kd = g.Kd, Vd = g.Vd, n = (size_t)g.N;

		TAKE(t->xc, n * (2 * Kd + Vd) * f);
		TAKE(t->z, n * Vd * f);
		TAKE(t->gb, n * Hv * f);
		TAKE(t->ga, n * Hv * f);
		TAKE(t->qn, n * Kd * f);
		TAKE(t->kn, n * Kd * f);
		TAKE(t->rq, n * Hk * f);
		TAKE(t->rk, n * Hk * f);
		TAKE(t->vv, n * Vd * f);
		TAKE(t->beta, n * Hv * f);
		TAKE(t->gl, n * Hv * f);
		TAKE(t->saved, hp_gdr_saved_floats(m->a.B, g.T, g.Hv, g.Dk, g.Dv) * f);
		TAKE(t->o, n * Vd * f);
		TAKE(t->rstd_o, n * Hv * f);
		TAKE(t->y, n * Vd * f);
		goto mlp;
	}
	if (s->qk_norm) {
		TAKE(t->q_raw, N * QD * f);
		TAKE(t->k_raw, N * KD * f);
		TAKE(t->rstd_q, N * s->n_heads * f);
		TAKE(t->rstd_k, N * s->n_kv_heads * f);
	}
	if (s->mla) {
		size_t Rq = s->q_lora_rank, L = s->kv_lora_rank;

		if (Rq) {
			TAKE(t->qa, N * Rq * f);
			TAKE(t->rstd_qa, N * f);
			TAKE(t->qan, N * Rq * f);
		}
		TAKE(t->kvc, N * L * f);
		TAKE(t->rstd_kv, N * f);
		TAKE(t->cn, N * L * f);
		if (s->v_head != s->head_dim)
			TAKE(t->att_v, N * (size_t)s->n_heads * s->v_head * f);
	}
	TAKE(t->q, N * QD * f);
	TAKE(t->k, N * KD * f);
	TAKE(t->v, N * KD * f);
	if (m->k.flash[l])
		TAKE_IN(pa, t->P, (size_t)m->a.B * s->n_heads * m->a.T * f);
	else
		TAKE_IN(pa, t->P, (size_t)m->a.B * s->n_heads * TS * f);
	if (cp_ag(m)) {
		TAKE(t->kg, BS * KD * f);
		TAKE(t->vg, BS * KD * f);
	} else if (cp_ul(m)) {
		TAKE(t->att_u, N * QD * f);
	}
	TAKE(t->att, N * QD * f);
	if (s->attn_gate) {
		TAKE(t->gate, N * QD * f);
		TAKE(t->att_g, N * QD * f);
	}
mlp:
	TAKE(t->x_mid, Ns * C * f);
	TAKE(t->rstd2, Ns * f);
	if (m->w.lw[l].moe) {
		TAKE(t->xn2, Ns * C * f);
		TAKE(t->probs, Ns * E * f);
		take_pair(&tk, a, &t->sel, NK);
		TAKE(t->wsel, NK * f);
		take_dev(&tk, a, &t->row_tok, NK);
		take_dev(&tk, a, &t->row_slot, NK);
		/* the host reads the experts' rows only to send them (ep) */
		if (pr->ep > 1)
			take_pair(&tk, a, &t->ex_off, E + 1);
		else
			take_dev(&tk, a, &t->ex_off, E + 1);
		/* grouped on one rank: gathered per expert into m->a.xg */
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
		if (s->shared_inter) {   /* the shared experts' SwiGLU */
			size_t Is = s->shared_inter;

			TAKE(t->g, Ns * Is * f);
			TAKE(t->u, Ns * Is * f);
			TAKE(t->h, Ns * Is * f);
		}
		if (s->shared_gate) {   /* and its gate */
			TAKE(t->sh_out, Ns * C * f);
			TAKE(t->sh_gl, Ns * f);
		}
		if (pr->ep > 1) {
			t->ep_scount = take_host(&tk, a, (size_t)pr->ep);
			t->ep_rcount = take_host(&tk, a, (size_t)pr->ep);
			take_pair(&tk, a, &t->ep_perm, R);
			take_pair(&tk, a, &t->ep_off, (size_t)m->lay.El + 1);
		}
		/* the device's combine and scatter-add read each token's rows */
		if (on_device(m))
			take_dev(&tk, a, &t->tok_rows, NK);
	} else {
		TAKE(t->xn2, N * C * f);
		TAKE(t->g, N * I * f);
		TAKE(t->u, N * I * f);
		TAKE(t->h, N * I * f);
	}
#undef TAKE
	return tk.ok;
}

/* Take every activation buffer from the arena; with base NULL this only
 * measures (hp_model_act_bytes: hp-plan's estimate).  Sizes are this
 * rank's: N tokens of its chunk, Ns of them in the residual stream, the
 * local heads, intermediate rows and vocabulary. */
static int take_acts(struct hp_model *m)
{
	const struct hp_model_spec *s = &m->spec;
	const struct hp_model_par *pr = &m->par;
	long N = (long)m->a.B * m->a.T, Ns = m->lay.Ns;
	size_t C = s->hidden, I = s->intermediate, QD = (size_t)s->n_heads * s->head_dim,
	       KD = (size_t)s->n_kv_heads * s->head_dim, V = s->vocab, f = sizeof(float), i4 = sizeof(int32_t);
	size_t E = s->n_experts, K = s->top_k, Im = s->moe_intermediate, NK = (size_t)Ns * K;
	size_t R = pr->ep > 1 ? (size_t)m->lay.ep_rcap : NK, BS = (size_t)m->a.B * m->lay.S;
	struct hp_arena *a = &m->a.aarena;
	struct takes tk = { m, 1 };
	size_t wmax = 0;
	int own = m->cur_slot == 0;   /* the first slot takes the one pass's scratch */
	unsigned char *wbase;

	/* the checkpointed layers' shared work region: the largest of theirs */
	for (int l = pr->l0; l < pr->l1; l++) {
		struct hp_arena kp, w, h = m->a.harena;

		if (m->k.ckpt[l] == HP_ACT_CKPT_OFF)
			continue;
		hp_arena_init(&kp);
		hp_arena_init(&w);
		take_layer(m, l, &kp, &w);
		m->a.harena = h;   /* host copies are per layer: taken below */
		if (w.used > wmax)
			wmax = w.used;
	}
	wbase = wmax ? take_in(&tk, a, wmax) : NULL;
	for (int l = pr->l0; l < pr->l1; l++) {
		struct hp_arena w = { wbase, wbase ? wmax : 0, 0 };

		tk.ok &= take_layer(m, l, a, m->k.ckpt[l] == HP_ACT_CKPT_OFF ? a : &w);
	}
#define TAKE(ptr, bytes) TAKE_IN(a, ptr, bytes)
	/* the last layer's output (a stage's, sent on) */
	TAKE(m->a.x_final, Ns * C * f);
	if (last_stage(m)) {
		TAKE(m->a.rstd_f, Ns * f);
		TAKE(m->a.xf, N * C * f);
		TAKE(m->a.logits, head_rows(m) * V * f);
	}
	if (pr->tp > 1 && last_stage(m)) {
		if (!pr->loss_parallel)
			TAKE(m->lay.glogits, N * (size_t)m->gspec.vocab * f);
		TAKE(m->lay.vp_mx, 2 * N * f);
		TAKE(m->lay.vp_st, 4 * N * sizeof(double));
	}
	/* what every slot shares: the first takes it (take_slots) */
	if (m->cur_slot == 0) {
		TAKE(m->a.cos_t, (size_t)m->lay.S * hp_model_spec_rope_dim(s) / 2 * f);
		TAKE(m->a.sin_t, (size_t)m->lay.S * hp_model_spec_rope_dim(s) / 2 * f);
	}
	take_pair(&tk, a, &m->a.pos, (size_t)N);
	if (on_device(m)) {
		/* the micro-batch on the device: the chunk (cp), or its whole rows
		 * (the segments of ulysses attention); host copies for cp */
		m->a.ids.d = take_in(&tk, a, N * i4);
		m->a.tgt.d = take_in(&tk, a, N * i4);
		m->a.segs.d = take_in(&tk, a, BS * i4);
		if (pr->cp > 1) {
			m->a.ids.h = take_host(&tk, a, (size_t)N);
			m->a.tgt.h = take_host(&tk, a, (size_t)N);
			m->a.segs.h = take_host(&tk, a, (size_t)N);
		}
	} else if (pr->cp > 1) {
		take_pair(&tk, a, &m->a.ids, (size_t)N);
		take_pair(&tk, a, &m->a.tgt, (size_t)N);
		take_pair(&tk, a, &m->a.segs, (size_t)N);
	}
	if (windowed(m))   /* the windowed layers' first keys (stage_batch) */
		take_pair(&tk, a, &m->a.segw, BS);
	/* a slot's gradient in flight (dx), and dxn, which holds the LM
	 * head's gradient from a chunked forward to its backward; what follows
	 * is scratch of one pass, which the first slot takes for every slot
	 * (share_scratch) */
	TAKE(m->a.dx, N * C * f);
	TAKE(m->a.dxn, N * C * f);
	if (own) {
		TAKE(m->a.dq, N * QD * f);
		TAKE(m->a.dk, N * KD * f);
		TAKE(m->a.dv, N * KD * f);
		TAKE(m->a.datt, N * QD * f);
		/* the dense MLP's, or the shared experts' */
		size_t Id = zmax(N * I, (size_t)Ns * s->shared_inter);

		TAKE(m->a.dg, Id * f);
		TAKE(m->a.du, Id * f);
		TAKE(m->a.dh, Id * f);
		TAKE(m->a.dscratch, scratch_floats(m) * f);
	}
	if (own && s->qk_norm) {
		TAKE(m->a.dq2, N * QD * f);
		TAKE(m->a.dk2, N * KD * f);
	}
	size_t gw = own ? gdn_scratch_floats(m) : 0;
	if (gw)
		TAKE(m->a.gdn_w, gw * f);
	if (own && s->n_linear && on_device(m)) {   /* the delta rule's (a CPU's is m->gdr_ws) */
		struct gdn_dims g = gdn_dims(m);

		TAKE(m->a.gdr_ws, m->bk->gdr_scratch(m->bk, m->a.B, g.Hv, g.Dk, g.Dv) * f);
	}
	if (m->cur_slot == 0 && s->norm_zc) {   /* zero-centred norms' 1 + w (zc_fill) */
		TAKE(m->a.zc, ((size_t)s->n_layers * (2 * C + 2 * (size_t)s->head_dim) + C) * f);
		TAKE(m->a.ones, zmax(C, (size_t)s->head_dim) * f);
	}
	if (m->cur_slot == 0 && s->router_group)   /* the routed loads (moe_forward) */
		TAKE(m->a.route_cnt, (size_t)s->n_layers * 2 * E * sizeof(double));
	if (own && s->mla) {   /* the latent attention's in-between values (mla_fwd, mla_bwd) */
		size_t H = s->n_heads, Rq = s->q_lora_rank, L = s->kv_lora_rank, r = s->qk_rope;
		size_t qk = s->qk_nope + r;

		TAKE(m->a.mla_t, N * zmax(H * (s->qk_nope + s->v_head), L) * f);
		TAKE(m->a.mla_u, N * zmax(Rq, L + r) * f);
		TAKE(m->a.mla_w, N * zmax(zmax(H * qk, H * s->v_head), zmax(Rq, L)) * f);
	}
	if (own && pr->tp > 1) {
		TAKE(m->lay.dfull, N * C * f);
		TAKE(m->lay.dred, Ns * C * f);
	}
	if (own && cp_ag(m)) {
		TAKE(m->lay.cp_send, 2 * BS * KD * f);
		TAKE(m->lay.cp_recv, 2 * BS * KD * f);
	} else if (own && cp_ul(m)) {   /* attention's q, k, v; a Gated DeltaNet's q, k, v, z, b, a */
		size_t w = QD + 2 * KD;

		if (s->n_linear) {
			struct gdn_dims g = gdn_dims(m);

			w = zmax(w, 2 * (size_t)g.tKd + 2 * (size_t)g.tVd + 2 * (size_t)g.tHv);
		}
		TAKE(m->lay.cp_send, N * w * f);
		TAKE(m->lay.cp_recv, N * w * f);
	}
	/* the step's sums, then the load-balancing loss's */
	if (m->cur_slot == 0) {
		TAKE(m->a.st, (HP_ST_N + (m->n_moe ? 2 * E + 1 : 0)) * sizeof(double));
		m->a.fp = m->a.st ? m->a.st + HP_ST_N : NULL;
	} else if (m->n_moe) {
		TAKE(m->a.fp, (2 * E + 1) * sizeof(double));
	}
	if (own && m->n_moe) {
		TAKE(m->a.dye, R * C * f);
		TAKE(m->a.dxe, R * C * f);
		TAKE(m->a.dge, R * (any_grouped(m) ? 2 : 1) * Im * f);
		TAKE(m->a.due, R * Im * f);
		TAKE(m->a.dhe, R * Im * f);
		TAKE(m->a.dprob, Ns * E * f);
		TAKE(m->a.dwsel, NK * f);
		if (pr->ep > 1)
			m->a.moe_fill = take_host(&tk, a, 2 * E);
		if (any_grouped(m)) {
			TAKE(m->a.hrec, R * Im * f);
			if (pr->ep == 1)
				TAKE(m->a.xg, NK * C * f);
		}
		if (pr->ep > 1) {
			TAKE(m->lay.ep_send, R * C * f);
			TAKE(m->lay.ep_recv, R * C * f);
		}
	}
#undef TAKE
#undef TAKE_IN
	return tk.ok;
}

/* A pass's scratch, which one slot takes for all (take_acts). */
static void share_scratch(struct hp_model_acts *a, struct hp_model_lay *y, const struct hp_model_acts *a0,
			  const struct hp_model_lay *y0)
{
	a->dq = a0->dq;
	a->dk = a0->dk;
	a->dv = a0->dv;
	a->datt = a0->datt;
	a->dg = a0->dg;
	a->du = a0->du;
	a->dh = a0->dh;
	a->dscratch = a0->dscratch;
	a->dq2 = a0->dq2;
	a->dk2 = a0->dk2;
	a->mla_t = a0->mla_t;
	a->mla_u = a0->mla_u;
	a->mla_w = a0->mla_w;
	a->gdn_w = a0->gdn_w;
	a->gdr_ws = a0->gdr_ws;
	a->route_cnt = a0->route_cnt;
	a->dye = a0->dye;
	a->dxe = a0->dxe;
	a->dge = a0->dge;
	a->due = a0->due;
	a->dhe = a0->dhe;
	a->dprob = a0->dprob;
	a->dwsel = a0->dwsel;
	a->moe_fill = a0->moe_fill;
	a->hrec = a0->hrec;
	a->xg = a0->xg;
	y->dfull = y0->dfull;
	y->dred = y0->dred;
	y->cp_send = y0->cp_send;
	y->cp_recv = y0->cp_recv;
	y->ep_send = y0->ep_send;
	y->ep_recv = y0->ep_recv;
}

/* Every slot's activations one after another in the arena, each with its
 * own layer table when m->slot is there (else measuring: all into
 * m->a.act); slot 0 current after. */
static int take_slots(struct hp_model *m)
{
	struct hp_arena aa, ha;
	int ok = 1;

	for (int k = 0; k < m->par.slots; k++) {
		m->cur_slot = k;
		use_chunk(m, slot_chunk(&m->par, k));
		if (m->slot)
			m->a.act = m->slot[k].a.act;
		ok &= take_acts(m);
		if (m->slot) {
			m->slot[k].a = m->a;
			m->slot[k].lay = m->lay;
		}
	}
	m->cur_slot = 0;
	use_chunk(m, 0);
	if (m->slot) {
		/* the RoPE tables, the step's sums and a pass's scratch are one */
		for (int k = 1; k < m->par.slots; k++) {
			m->slot[k].a.cos_t = m->slot[0].a.cos_t;
			m->slot[k].a.sin_t = m->slot[0].a.sin_t;
			m->slot[k].a.st = m->slot[0].a.st;
			m->slot[k].a.zc = m->slot[0].a.zc;
			m->slot[k].a.ones = m->slot[0].a.ones;
			share_scratch(&m->slot[k].a, &m->slot[k].lay, &m->slot[0].a, &m->slot[0].lay);
		}
		aa = m->a.aarena;
		ha = m->a.harena;
		m->a = m->slot[0].a;
		m->lay = m->slot[0].lay;
		m->a.aarena = aa;
		m->a.harena = ha;
		m->cur_slot = 0;
	}
	return ok;
}

void hp_model_use_slot(struct hp_model *m, int k)
{
	struct hp_arena aa = m->a.aarena, ha = m->a.harena;
	float *pb = m->a.probe_buf;
	size_t pc = m->a.probe_cap;
	double *st;

	if (!m->slot || k == m->cur_slot)
		return;
	st = m->slot[0].a.st;   /* the step's sums are one */
	m->slot[m->cur_slot] = (struct hp_model_slot){ m->a, m->lay, m->head_done };
	m->a = m->slot[k].a;
	m->lay = m->slot[k].lay;
	m->head_done = m->slot[k].head_done;
	m->a.aarena = aa;
	m->a.harena = ha;
	m->a.st = st;
	m->a.probe_buf = pb;
	m->a.probe_cap = pc;
	m->cur_slot = k;
	use_chunk(m, slot_chunk(&m->par, k));
}

void hp_model_slot_io(struct hp_model *m, int k, struct hp_stage_io *io)
{
	const struct hp_model_acts *a = !m->slot || k == m->cur_slot ? &m->a : &m->slot[k].a;
	int on = m->n_moe && m->spec.output_router_logits;

	io->in = a->act[m->par.chunk_l0[slot_chunk(&m->par, k)]].x_in;
	io->out = a->x_final;
	io->grad = a->dx;
	io->aux = on ? a->fp : NULL;
	io->naux = on ? 2 * (size_t)m->spec.n_experts + 1 : 0;
}

size_t hp_model_stage_numel(const struct hp_model *m)
{
	return (size_t)m->lay.Ns * (size_t)m->spec.hidden;
}

int hp_model_init(struct hp_model *m, const struct hp_model_spec *spec, int B, int T, struct hp_err *e)
{
	return hp_model_init_par(m, NULL, spec, NULL, NULL, B, T, e);
}

int hp_model_init_kernels(struct hp_model *m, const struct hp_model_spec *spec,
			  const struct hp_model_kernels *k, int B, int T, struct hp_err *e)
{
	return hp_model_init_par(m, NULL, spec, k, NULL, B, T, e);
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
	if (p->pp < 1)
		p->pp = 1;
	if (p->slots < 1)
		p->slots = 1;
	if (p->l1 <= 0) {
		p->l0 = 0;
		p->l1 = g->n_layers;
	}
	if (p->vpp <= 1) {   /* one chunk: [l0, l1) */
		p->vpp = 1;
		p->chunk_l0[0] = p->l0;
		p->chunk_l1[0] = p->l1;
		p->chunk_slots[0] = p->slots;
	}
	/* each chunk a run of layers with a slot or more; the slots all of them */
	int nslots = 0, bad = p->vpp > HP_MAX_VPP;
	for (int c = 0; c < p->vpp && !bad; c++) {
		nslots += p->chunk_slots[c];
		bad = p->chunk_l0[c] < 0 || p->chunk_l0[c] >= p->chunk_l1[c] || p->chunk_l1[c] > g->n_layers ||
		      p->chunk_slots[c] < 1;
	}
	if (bad || p->pp_rank < 0 || p->pp_rank >= p->pp || nslots != p->slots)
		return hp_err_set(e, HP_EINVAL, "pipeline stage %d of %d with layers [%d, %d) of %d in %d chunks "
				  "(%d slots)", p->pp_rank, p->pp, p->l0, p->l1, g->n_layers, p->vpp, p->slots);
	p->l0 = p->chunk_l0[0];
	p->l1 = p->chunk_l1[0];
	if (g->n_heads % p->tp || g->n_kv_heads % p->tp || g->intermediate % p->tp || g->vocab % p->tp)
		return hp_err_set(e, HP_ECONFIG, "tp %d must divide the heads (%d, %d KV), intermediate_size "
				  "%d and vocab_size %d", p->tp, g->n_heads, g->n_kv_heads, g->intermediate,
				  g->vocab);
	if (T % p->cp)
		return hp_err_set(e, HP_ECONFIG, "cp %d must divide the sequence length %d", p->cp, T);
	if (p->cp > 1 && p->ulysses && ((g->n_heads / p->tp) % p->cp || (g->n_kv_heads / p->tp) % p->cp))
		return hp_err_set(e, HP_ECONFIG, "ulysses attention with cp %d needs the heads per tp rank "
				  "(%d, %d KV) divisible by cp", p->cp, g->n_heads / p->tp, g->n_kv_heads / p->tp);
	if (g->n_linear && p->cp > 1 && !p->ulysses)
		return hp_err_set(e, HP_EUNSUP, "context parallelism over the Gated DeltaNet layers (layer_types "
				  "linear_attention) splits their heads (ulysses): bind ulysses_attention to the "
				  "attention layers; the recurrent state passed between cp ranks is not implemented");
	if (g->n_linear && g->lin_kh % p->tp)
		return hp_err_set(e, HP_ECONFIG, "tp %d must divide linear_num_key_heads %d", p->tp, g->lin_kh);
	if (g->n_linear && p->cp > 1 && (g->lin_kh / p->tp) % p->cp)
		return hp_err_set(e, HP_ECONFIG, "cp %d must divide the Gated DeltaNet key heads per tp rank (%d)",
				  p->cp, g->lin_kh / p->tp);
	if (p->ep > HP_MAX_EP)
		return hp_err_set(e, HP_ECONFIG, "ep %d is more than the %d this build takes", p->ep, HP_MAX_EP);
	if (g->n_experts && g->n_experts % p->ep)
		return hp_err_set(e, HP_ECONFIG, "ep %d must divide num_experts %d", p->ep, g->n_experts);
	m->lay.S = T;
	m->a.T = T / p->cp;
	N = (long)B * m->a.T;
	if (p->tp == 1)
		p->sp = 0;
	if (p->sp && N % p->tp)
		return hp_err_set(e, HP_ECONFIG, "sequence parallelism needs the %ld tokens of a rank's "
				  "micro-batch divisible by tp %d", N, p->tp);
	if (g->n_experts && p->tp > 1 && !p->sp)
		return hp_err_set(e, HP_ECONFIG, "a MoE model with tp %d needs sequence parallelism", p->tp);
	m->lay.Ns = p->sp ? N / p->tp : N;
	s->n_heads /= p->tp;
	s->n_kv_heads /= p->tp;
	s->intermediate /= p->tp;
	s->vocab /= p->tp;
	m->lay.v0 = p->tp_rank * s->vocab;
	m->lay.El = g->n_experts / p->ep;
	m->lay.e0 = p->ep_rank * m->lay.El;
	/* the most rows one rank's experts can get: every token of the ep group
	 * sends at most min(top_k, local experts) of its slots here */
	m->lay.ep_rcap = (long)p->ep * m->lay.Ns * (g->top_k < m->lay.El ? g->top_k : m->lay.El);
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
	m->w.lw = hp_calloc((size_t)spec->n_layers, sizeof(*m->w.lw));
	m->a.act = hp_calloc((size_t)spec->n_layers, sizeof(*m->a.act));
	if (!m->w.lw || !m->a.act)
		return hp_err_set(e, HP_ENOMEM, "out of memory for the layer tables");
	for (int l = 0; l < spec->n_layers; l++)
		if ((m->w.lw[l].moe = hp_model_spec_layer_is_moe(spec, l)))
			m->n_moe++;
	return 0;
}

/* The largest operands the passes hand the backend (struct hp_op_sizes),
 * from the layout alone, as the calls below make them: the linear layers
 * on the micro-batch's N tokens (the LM head's in chunks when chunked),
 * the experts' on at most every token of the ep group each, attention as
 * flash over the rank's rows, a context-parallel chunk over its prefix. */
static void op_sizes(const struct hp_model *m, struct hp_op_sizes *z)
{
	const struct hp_model_spec *s = &m->spec;
	size_t N = (size_t)m->a.B * m->a.T, C = (size_t)s->hidden, D = (size_t)s->head_dim;
	size_t QD = (size_t)s->n_heads * D, KD = (size_t)s->n_kv_heads * D, V = (size_t)s->vocab;
	size_t Nh = head_rows(m);
	size_t Im = (size_t)s->moe_intermediate;
	/* the grouped experts' operands: every routed row at once */
	size_t R = m->par.ep > 1 ? (size_t)m->lay.ep_rcap : (size_t)m->lay.Ns * (size_t)s->top_k;
	int dense = 0, moe = 0, grouped = 0;

	memset(z, 0, sizeof(*z));
	for (int l = 0; l < s->n_layers; l++) {
		moe |= m->w.lw[l].moe;
		dense |= !m->w.lw[l].moe;
		grouped |= m->w.lw[l].moe && m->k.grouped[l];
	}
	z->lin_x = zmax(N * C, N * QD);
	z->lin_dy = zmax(zmax(N * QD, N * KD), zmax(N * C, Nh * V));
	if (dense) {
		z->lin_x = zmax(z->lin_x, N * (size_t)s->intermediate);
		z->lin_dy = zmax(z->lin_dy, N * (size_t)s->intermediate);
	}
	if (s->mla) {   /* the latent projections, kv_b_proj, o_proj's input */
		size_t H = (size_t)s->n_heads, Rq = (size_t)s->q_lora_rank, L = (size_t)s->kv_lora_rank;

		z->lin_x = zmax(z->lin_x, N * zmax(zmax(Rq, L), H * (size_t)s->v_head));
		z->lin_dy = zmax(z->lin_dy, N * zmax(zmax(Rq, L + (size_t)s->qk_rope),
						     H * (size_t)(s->qk_nope + zmax((size_t)s->qk_rope, (size_t)s->v_head))));
	}
	if (moe && s->shared_inter) {   /* DeepSeek's shared experts, Qwen3-Next's shared expert */
		z->lin_x = zmax(z->lin_x, (size_t)m->lay.Ns * (size_t)s->shared_inter);
		z->lin_dy = zmax(z->lin_dy, (size_t)m->lay.Ns * (size_t)s->shared_inter);
	}
	if (s->attn_gate)   /* q_proj's [q | gate] */
		z->lin_dy = zmax(z->lin_dy, 2 * N * QD);
	if (s->n_linear) {   /* the projections' outputs (qwen3_next's fused), out_proj's input */
		struct gdn_dims g = gdn_dims(m);
		size_t Nl = (size_t)g.Nl;

		z->lin_x = zmax(z->lin_x, Nl * (size_t)g.tVd);
		z->lin_dy = zmax(z->lin_dy, Nl * (s->lin_split ? zmax((size_t)g.tKd, (size_t)g.tVd) : (size_t)g.P));
	}
	if (moe) {
		z->lin_x = zmax(z->lin_x, R * zmax(C, Im));
		z->lin_dy = zmax(zmax(z->lin_dy, N * (size_t)s->n_experts), R * zmax(C, (grouped ? 2 : 1) * Im));
	}
	if (cp_ag(m)) {
		z->cp_B = m->a.B;
		z->cp_L = (m->par.cp_rank + 1) * m->a.T;
		z->cp_Hq = s->n_heads;
		z->att_q = (size_t)m->a.B * (size_t)z->cp_L * QD;
		z->att_kv = (size_t)m->a.B * (size_t)z->cp_L * KD;
	} else if (cp_ul(m)) {
		z->att_q = (size_t)m->a.B * (size_t)m->lay.S * QD / (size_t)m->par.cp;
		z->att_kv = (size_t)m->a.B * (size_t)m->lay.S * KD / (size_t)m->par.cp;
	} else {
		z->att_q = N * QD;
		z->att_kv = N * KD;
	}
	z->tokens = N;
}

/* The model's layout for (spec, k, par, B, T) without its memory: the
 * activation bytes take_acts measures (its arena's base NULL), and on a
 * device backend (flash attention for every layer, as hp_model_init_par
 * binds it there) the operand scratch the backend prepares.  -1 when the
 * layout is one the model refuses, -2 when the bytes overflow 64 bits. */
static int64_t measure(const struct hp_model_spec *spec, const struct hp_model_kernels *k,
		       const struct hp_model_par *par, int B, int T, int device, int64_t *scratch)
{
	struct hp_model m;
	struct hp_err e;
	int64_t bytes = -1;

	memset(&m, 0, sizeof(m));
	if (k)
		m.k = *k;
	m.spec = m.gspec = *spec;
	m.a.B = B;
	m.a.T = m.lay.S = T;
	/* a device's layout: its memory is not the host's (take_acts puts the
	 * host's index arrays apart), its attention scratch its own; nothing
	 * is called on it */
	m.bk = (struct hp_backend *)(device ? hp_backend_cuda_sizing() : hp_backend_cpu());
	hp_arena_init(&m.a.aarena);
	hp_arena_init(&m.a.harena);
	hp_err_clear(&e);
	if (B > 0 && T > 0 && !set_layout(&m, par, B, T, &e)) {
		for (int l = 0; device && l < spec->n_layers; l++)
			m.k.flash[l] = 1;
		take_slots(&m);
		bytes = m.a.aarena.used > (size_t)INT64_MAX - 63 ? -2 :
			(int64_t)((m.a.aarena.used + 63) & ~(size_t)63);   /* whole slices */
		if (device && bytes >= 0) {
			struct hp_op_sizes z;

			bytes = (int64_t)m.a.aarena.used;   /* one allocation of what it uses */
			op_sizes(&m, &z);
			*scratch = (int64_t)hp_backend_cuda_scratch_bytes(&z);
		}
	}
	hp_free(m.w.lw);
	hp_free(m.a.act);
	return bytes;
}

int64_t hp_model_act_bytes(const struct hp_model_spec *spec, const struct hp_model_kernels *k,
			   const struct hp_model_par *par, int B, int T)
{
	return measure(spec, k, par, B, T, 0, NULL);
}

int64_t hp_model_device_act_bytes(const struct hp_model_spec *spec, const struct hp_model_kernels *k,
				  const struct hp_model_par *par, int B, int T, int64_t *scratch)
{
	*scratch = 0;
	return measure(spec, k, par, B, T, 1, scratch);
}

/* An arena of cap bytes in the backend's memory (zeroed). */
static int arena_on(struct hp_model *m, struct hp_arena *a, size_t cap, struct hp_err *e)
{
	if (!on_device(m))
		return hp_arena_alloc(a, cap) ? hp_err_set(e, HP_ENOMEM, "out of memory") : 0;
	if (!(a->base = m->bk->alloc(m->bk, cap ? cap : 1, e)))
		return e->code;
	a->cap = cap;
	a->used = 0;
	return 0;
}

static void arena_off(struct hp_model *m, struct hp_arena *a)
{
	if (on_device(m)) {
		m->bk->free(m->bk, a->base);
		hp_arena_init(a);
	} else {
		hp_arena_release(a);
	}
}

int hp_model_init_par(struct hp_model *m, struct hp_backend *bk, const struct hp_model_spec *spec,
		      const struct hp_model_kernels *k, const struct hp_model_par *par, int B, int T,
		      struct hp_err *e)
{
	int rc;

	memset(m, 0, sizeof(*m));
	if (k)
		m->k = *k;
	hp_arena_init(&m->w.warena);
	hp_arena_init(&m->w.garena);
	hp_arena_init(&m->a.aarena);
	hp_arena_init(&m->a.harena);
	m->spec = *spec;
	m->gspec = *spec;
	m->a.B = B;
	m->a.T = T;
	m->lay.S = T;
	m->bk = bk ? bk : hp_backend_cpu();
	if (B <= 0 || T <= 0)
		return hp_err_set(e, HP_EINVAL, "micro-batch %d x %d must be positive", B, T);
	if ((rc = hp_model_spec_check_seq(spec, T, e)))
		return rc;
	if (par && (par->tp > 1 || par->cp > 1 || par->ep > 1) && !par->cs)
		return hp_err_set(e, HP_EINVAL, "a parallel layout needs its communicators");
	if ((rc = set_layout(m, par, B, T, e)))
		return rc;
	if (spec->n_linear && !on_device(m) &&
	    !(m->gdr_ws = hp_malloc(m->bk->gdr_scratch(m->bk, B, gdn_dims(m).Hv, spec->lin_kd, spec->lin_vd) *
				    sizeof(float)))) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory for the delta rule's workspace");
		goto fail;
	}
	rc = HP_ENOMEM;
	m->w.lg = hp_calloc((size_t)spec->n_layers, sizeof(*m->w.lg));
	if (!m->w.lg) {
		hp_err_set(e, rc, "out of memory for the layer tables");
		goto fail;
	}
	for (int l = 0; l < spec->n_layers; l++) {
		if (!m->w.lw[l].moe)
			continue;
		m->w.lg[l].moe = 1;
		m->w.lw[l].ex = hp_calloc((size_t)m->lay.El + 1, sizeof(struct hp_expert_w));
		m->w.lg[l].ex = hp_calloc((size_t)m->lay.El + 1, sizeof(struct hp_expert_w));
		if (!m->w.lw[l].ex || !m->w.lg[l].ex) {
			hp_err_set(e, rc, "out of memory for the expert tables");
			goto fail;
		}
	}
	if ((rc = build_params(m, e)))
		goto fail;
	rc = HP_ENOMEM;
	if (hp_arena_alloc(&m->w.warena, m->w.numel * sizeof(float)) ||
	    hp_arena_alloc(&m->w.garena, m->w.numel * sizeof(float))) {
		hp_err_set(e, rc, "out of memory for %zu parameters", m->w.numel);
		goto fail;
	}
	m->w.flat_w = hp_arena_take(&m->w.warena, m->w.numel * sizeof(float));
	m->w.flat_g = hp_arena_take(&m->w.garena, m->w.numel * sizeof(float));
	m->w.bw = m->w.flat_w;
	m->w.bg = m->w.flat_g;
	if (on_device(m)) {
		void *(*get)(struct hp_backend *, size_t, struct hp_err *) = par && par->sharded ? m->bk->reserve :
									      m->bk->alloc;

		if (!(m->w.bw = get(m->bk, m->w.numel * sizeof(float), e)) ||
		    !(m->w.bg = get(m->bk, m->w.numel * sizeof(float), e))) {
			rc = e->code;
			goto fail;
		}
	}
	/* the working copy: every weight but an untied embedding (the first
	 * parameter), which is only looked up, in fp32 */
	size_t wc0 = m->w.nparams && hp_param_uncopied(m->w.params[0].name, spec->tie_word_embeddings) ?
		     m->w.params[0].numel : 0;
	if ((rc = m->bk->weights(m->bk, m->w.bw + wc0, m->w.numel - wc0, e)))
		goto fail;
	m->w.wc0 = wc0;
	for (int i = 0; i < m->w.nparams; i++) {
		struct hp_param *p = &m->w.params[i];
		p->w = m->w.flat_w + p->offset;
		p->g = m->w.flat_g + p->offset;
		*p->wslot = m->w.bw + p->offset;
		*p->gslot = m->w.bg + p->offset;
	}
	if (spec->tie_word_embeddings) {
		m->w.lm_head = m->w.embed;
		m->w.d_lm_head = m->w.d_embed;
	}
	/* a backend without HF's eager attention runs flash in its place: the
	 * same function, lse kept instead of P; so does attention with sinks,
	 * which join the lse (sinks_fwd) */
	for (int l = 0; l < spec->n_layers && (!m->bk->has_eager || spec->attn_sinks); l++)
		m->k.flash[l] = 1;
	for (int l = 0; l < spec->n_layers; l++)
		if (m->k.flash[l] && !m->bk->flash_supports(m->bk, spec->head_dim)) {
			if (!m->bk->has_eager)
				rc = hp_err_set(e, HP_EUNSUP, "%s: no attention kernel takes head_dim %d",
						m->bk->name, spec->head_dim);
			else
				rc = hp_err_set(e, HP_ECONFIG, "flash_attention takes head_dim up to %d, the model "
						"has %d; leave its attention on the reference",
						HP_FLASH_ATTENTION_MAX_HEAD_DIM, spec->head_dim);
			goto fail;
		}
	/* grouped experts read gate and up as one [2*Im, C] matrix */
	for (int l = 0; l < spec->n_layers; l++)
		for (int x = 0; holds_layer(&m->par, l) && m->k.grouped[l] && m->w.lw[l].moe && x < m->lay.El; x++)
			if (m->w.lw[l].ex[x].wu != m->w.lw[l].ex[x].wg + (size_t)spec->moe_intermediate * spec->hidden ||
			    m->w.lg[l].ex[x].wu != m->w.lg[l].ex[x].wg + (size_t)spec->moe_intermediate * spec->hidden)
				m->k.grouped[l] = 0;
	for (int l = 0; l < spec->n_layers; l++)
		if (holds_layer(&m->par, l) && m->w.lw[l].moe && ((rc = expert_stride(&m->w.lw[l], m->lay.El, e)) ||
				       (rc = expert_stride(&m->w.lg[l], m->lay.El, e))))
			goto fail;
	take_slots(m);                      /* measure */
	if ((rc = arena_on(m, &m->a.aarena, m->a.aarena.used, e))) {
		hp_err_set(e, rc, "out of memory for activations (%zu MiB for %d x %d tokens on %s)",
			   m->a.aarena.cap >> 20, B, T, m->bk->name);
		goto fail;
	}
	if (on_device(m) && hp_arena_alloc(&m->a.harena, m->a.harena.used ? m->a.harena.used : 1)) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory for the host's index arrays");
		goto fail;
	}
	if (m->par.slots > 1) {
		if (!(m->slot = hp_calloc((size_t)m->par.slots, sizeof(*m->slot)))) {
			rc = hp_err_set(e, HP_ENOMEM, "out of memory for the layer tables");
			goto fail;
		}
		m->slot[0].a.act = m->a.act;
		for (int j = 1; j < m->par.slots; j++)
			if (!(m->slot[j].a.act = hp_calloc((size_t)spec->n_layers, sizeof(*m->a.act)))) {
				rc = hp_err_set(e, HP_ENOMEM, "out of memory for the layer tables");
				goto fail;
			}
	}
	take_slots(m);
	if (!on_device(m)) {
		hp_model_spec_rope_table(spec, m->a.cos_t, m->a.sin_t, m->lay.S);
		for (size_t i = 0; m->a.ones && i < zmax((size_t)spec->hidden, (size_t)spec->head_dim); i++)
			m->a.ones[i] = 1.0f;
		return 0;
	}
	struct hp_op_sizes z;
	op_sizes(m, &z);
	if ((rc = m->bk->prepare(m->bk, &z, e)))
		goto fail;
	/* the RoPE tables and the zero-centred norms' ones are made on the host */
	size_t half = (size_t)m->lay.S * hp_model_spec_rope_dim(spec) / 2;
	size_t n1 = m->a.ones ? zmax((size_t)spec->hidden, (size_t)spec->head_dim) : 0;
	float *ct = hp_malloc((2 * half + n1) * sizeof(float) + 1);
	if (!ct) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory for the RoPE tables");
		goto fail;
	}
	hp_model_spec_rope_table(spec, ct, ct + half, m->lay.S);
	for (size_t i = 0; i < n1; i++)
		ct[2 * half + i] = 1.0f;
	rc = m->bk->upload(m->bk, m->a.cos_t, ct, half * sizeof(float), e);
	if (!rc)
		rc = m->bk->upload(m->bk, m->a.sin_t, ct + half, half * sizeof(float), e);
	if (!rc && n1)
		rc = m->bk->upload(m->bk, m->a.ones, ct + 2 * half, n1 * sizeof(float), e);
	hp_free(ct);
	if (!rc)
		return 0;
fail:
	hp_model_release(m);
	return e ? e->code : rc;
}

void hp_model_release(struct hp_model *m)
{
	if (m->bk && m->w.bw)
		m->bk->weights(m->bk, m->w.bw + m->w.wc0, 0, NULL);   /* the backend forgets the region */
	if (on_device(m)) {
		m->bk->free(m->bk, m->w.bw);
		m->bk->free(m->bk, m->w.bg);
	}
	m->w.bw = m->w.bg = NULL;
	hp_arena_release(&m->w.warena);
	hp_arena_release(&m->w.garena);
	if (m->bk)
		arena_off(m, &m->a.aarena);
	hp_arena_release(&m->a.harena);
	hp_free(m->w.params);
	for (int l = 0; m->w.lw && l < m->spec.n_layers; l++) {
		hp_free(m->w.lw[l].ex);
		if (m->w.lg)   /* a failed init may have the one table without the other */
			hp_free(m->w.lg[l].ex);
	}
	hp_free(m->w.lw);
	hp_free(m->w.lg);
	if (m->slot) {
		/* every slot's layer table, the current one's among them */
		m->slot[m->cur_slot].a.act = m->a.act;
		for (int k = 0; k < m->par.slots; k++)
			hp_free(m->slot[k].a.act);
		hp_free(m->slot);
		m->slot = NULL;
		m->a.act = NULL;
	}
	hp_free(m->a.act);
	hp_free(m->a.probe_buf);
	m->a.probe_buf = NULL;
	hp_free(m->gdr_ws);
	m->gdr_ws = NULL;
	m->w.params = NULL;
	m->w.lw = m->w.lg = NULL;
	m->a.act = NULL;
	m->w.nparams = 0;
}

int hp_model_upload(struct hp_model *m, struct hp_err *e)
{
	int rc;

	if (!on_device(m))
		return 0;
	if ((rc = m->bk->upload(m->bk, m->w.bw, m->w.flat_w, m->w.numel * sizeof(float), e)))
		return rc;
	m->bk->weights_changed(m->bk, m->w.bw, m->w.numel);
	return 0;
}

int hp_model_download(struct hp_model *m, int grads, struct hp_err *e)
{
	int rc;

	if (!on_device(m))
		return 0;
	if ((rc = m->bk->download(m->bk, m->w.flat_w, m->w.bw, m->w.numel * sizeof(float), e)))
		return rc;
	return grads ? m->bk->download(m->bk, m->w.flat_g, m->w.bg, m->w.numel * sizeof(float), e) : 0;
}

void hp_model_zero_grad(struct hp_model *m)
{
	m->bk->zero(m->bk, m->w.bg, m->w.numel * sizeof(float));
}

/* ---- faults injected on purpose ---- */

static const char *const fault_names[HP_NFAULT] = {
	"none", "tp_skip_reduce", "sp_skip_gather", "cp_wrong_offset", "cp_skip_kv_grad_reduce",
	"ep_wrong_route", "ep_drop_token", "fsdp_stale_shard", "grad_scale", "pp_stale_activation",
	"pp_out_of_order",
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

/* The first failure of a pass: its code, its message kept in m->err. */
static void par_rc(struct hp_model *m, int rc)
{
	if (rc && !m->par_rc)
		m->par_rc = rc;
}

/* A hook's or the probe's answer: non-zero (an HP_E code, its message in
 * m->err) is the pass's failure, and stops it. */
static int hook_rc(struct hp_model *m, int rc)
{
	par_rc(m, rc);
	return rc;
}

static int hook(struct hp_model *m, int l, int phase)
{
	return m->hook ? hook_rc(m, m->hook(m->hook_ctx, l, phase, &m->err)) : 0;
}

/* Show a module's output to the probe (from a device, through a host
 * copy); non-zero stops the forward. */
static int probe(struct hp_model *m, const char *fmt, int l, const float *x, long rows, int cols,
		 int row_split, int col_split)
{
	char name[96];
	struct hp_probe p = { name, x, rows, cols, row_split, col_split };
	size_t n = (size_t)rows * cols;

	if (!m->probe)
		return 0;
	if (on_device(m)) {
		if (n > m->a.probe_cap) {
			hp_free(m->a.probe_buf);
			m->a.probe_cap = 0;
			if (!(m->a.probe_buf = hp_malloc(n * sizeof(float) + 1))) {
				par_rc(m, hp_err_set(&m->err, HP_ENOMEM, "out of memory for a probe"));
				return -2;
			}
			m->a.probe_cap = n;
		}
		if (m->bk->download(m->bk, m->a.probe_buf, x, n * sizeof(float), &m->err)) {
			par_rc(m, m->err.code);
			return -2;
		}
		p.x = m->a.probe_buf;
	}
	snprintf(name, sizeof(name), fmt, l);
	return hook_rc(m, m->probe(m->probe_ctx, &p, &m->err));
}

/* ---- collectives at module boundaries ---- */

static struct hp_comm *dimc(struct hp_model *m, int d)
{
	return &m->par.cs->dim[d];
}

/* A block's entry: y [N,C] from this rank's rows src [Ns,C] (sequence
 * parallel: all-gathered over tp; else src is y). */
static void tp_gather(struct hp_model *m, float *y, const float *src)
{
	struct hp_backend *bk = m->bk;
	long N = (long)m->a.B * m->a.T;
	size_t C = (size_t)m->spec.hidden;

	if (m->lay.Ns == N) {
		if (y != src)
			bk->copy(bk, y, src, (size_t)N * C * sizeof(float));
		return;
	}
	par_rc(m, bk->allgather(bk, dimc(m, HP_DIM_TP), src, y, (size_t)m->lay.Ns * C, HP_DTYPE_F32, &m->err));
}

/* A block's exit: partial [N,C] holds this rank's share of a sum over tp;
 * returns the sum's rows this rank keeps: reduce-scattered into out [Ns,C]
 * (sequence parallel), or all-reduced in place. */
static float *tp_reduce(struct hp_model *m, float *partial, float *out)
{
	struct hp_backend *bk = m->bk;
	long N = (long)m->a.B * m->a.T;
	size_t C = (size_t)m->spec.hidden;

	if (m->par.tp == 1)
		return partial;
	if (m->par.sp) {
		par_rc(m, bk->reduce_scatter(bk, dimc(m, HP_DIM_TP), partial, out, (size_t)m->lay.Ns * C, HP_DTYPE_F32,
					     HP_RED_SUM, &m->err));
		return out;
	}
	par_rc(m, bk->allreduce(bk, dimc(m, HP_DIM_TP), partial, (size_t)N * C, HP_DTYPE_F32, HP_RED_SUM, &m->err));
	return partial;
}

/* A token mixer's row-parallel exit (o_proj, out_proj) of layer l: its
 * partial sums o reduced into x_mid, but under the tp_skip_reduce fault
 * at layer 0, where x_mid gets this rank's own partial (its rows of it
 * with sequence parallelism; without, o is x_mid already). */
static void mixer_reduce(struct hp_model *m, int l, float *o, float *x_mid)
{
	size_t Ns = (size_t)m->lay.Ns, C = (size_t)m->spec.hidden;

	if (l == 0 && m->fault == HP_FAULT_TP_SKIP_REDUCE) {
		if (m->par.sp)
			m->bk->copy(m->bk, x_mid, o + (size_t)m->par.tp_rank * Ns * C, sizeof(float) * Ns * C);
		return;
	}
	tp_reduce(m, o, x_mid);
}

/* ---- attention: one rank, or context parallel ---- */

/*
 * The all-gather of K and V: each rank packs [K | V] of its chunk, the
 * gathered blocks come back in cp-rank order and are laid out as whole
 * rows [B, S, Hkv*D] for the chunk kernel (kernels/cpu/cpattn.c).
 */
static void cp_gather_kv(struct hp_model *m, struct hp_layer_act *a)
{
	struct hp_backend *bk = m->bk;
	int B = m->a.B, T = m->a.T, cp = m->par.cp;
	size_t KD = (size_t)m->spec.n_kv_heads * m->spec.head_dim, blk = (size_t)T * KD, n = (size_t)B * blk;

	bk->copy(bk, m->lay.cp_send, a->k, n * sizeof(float));
	bk->copy(bk, m->lay.cp_send + n, a->v, n * sizeof(float));
	par_rc(m, bk->allgather(bk, dimc(m, HP_DIM_CP), m->lay.cp_send, m->lay.cp_recv, 2 * n, HP_DTYPE_F32, &m->err));
	for (int r = 0; r < cp; r++)
		for (int b = 0; b < B; b++) {
			const float *src = m->lay.cp_recv + (size_t)r * 2 * n + (size_t)b * blk;
			size_t at = ((size_t)b * m->lay.S + (size_t)r * T) * KD;

			bk->copy(bk, a->kg + at, src, blk * sizeof(float));
			bk->copy(bk, a->vg + at, src + n, blk * sizeof(float));
		}
}

/* Its backward: every rank's dK, dV of the whole rows [B,S,Hkv*D] (in
 * cp_recv) reduce-scattered, each rank keeping its chunk's. */
static void cp_scatter_dkv(struct hp_model *m, int skip)
{
	struct hp_backend *bk = m->bk;
	int B = m->a.B, T = m->a.T, cp = m->par.cp;
	size_t KD = (size_t)m->spec.n_kv_heads * m->spec.head_dim, blk = (size_t)T * KD, n = (size_t)B * blk;
	size_t whole = (size_t)B * m->lay.S * KD;

	for (int r = 0; r < cp; r++)
		for (int b = 0; b < B; b++) {
			float *dst = m->lay.cp_send + (size_t)r * 2 * n + (size_t)b * blk;
			size_t at = ((size_t)b * m->lay.S + (size_t)r * T) * KD;

			bk->copy(bk, dst, m->lay.cp_recv + at, blk * sizeof(float));
			bk->copy(bk, dst + n, m->lay.cp_recv + whole + at, blk * sizeof(float));
		}
	if (skip)   /* the fault: only this rank's own contribution to its keys */
		bk->copy(bk, m->lay.cp_recv, m->lay.cp_send + (size_t)m->par.cp_rank * 2 * n, 2 * n * sizeof(float));
	else
		par_rc(m, bk->reduce_scatter(bk, dimc(m, HP_DIM_CP), m->lay.cp_send, m->lay.cp_recv, 2 * n, HP_DTYPE_F32,
					     HP_RED_SUM, &m->err));
	bk->copy(bk, m->a.dk, m->lay.cp_recv, n * sizeof(float));
	bk->copy(bk, m->a.dv, m->lay.cp_recv + n, n * sizeof(float));
}

/*
 * Ulysses: the all-to-all that trades this rank's tokens of every head for
 * every token of its heads.  Per tensor x of H heads: to (dir 0) the head
 * split, x local [B, T, H, D] -> xs [B, S, H/cp, D]; back (dir 1) the
 * reverse.  nt tensors go in one call, packed per peer: block (peer r,
 * tensor i, row b) is T rows of the head slice, one strided copy.
 */
struct ul_t {
	float *loc, *split;
	int H, D;                 /* heads, each of D values */
};

static void ulysses(struct hp_model *m, struct ul_t *x, int nt, int dir)
{
	struct hp_backend *bk = m->bk;
	int B = m->a.B, T = m->a.T, cp = m->par.cp;
	size_t per = 0, f = sizeof(float);

	for (int i = 0; i < nt; i++)
		per += (size_t)B * T * (x[i].H / cp) * x[i].D;
	for (int r = 0; r < cp; r++) {
		float *o = m->lay.cp_send + (size_t)r * per;

		for (int i = 0; i < nt; i++) {
			int Hc = x[i].H / cp, D = x[i].D;
			size_t row = (size_t)Hc * D;

			for (int b = 0; b < B; b++, o += (size_t)T * row) {
				if (dir == 0)
					bk->copy2d(bk, o, row * f, x[i].loc + ((size_t)b * T * x[i].H + (size_t)r * Hc) * D,
						   (size_t)x[i].H * D * f, row * f, (size_t)T);
				else
					bk->copy(bk, o, x[i].split + ((size_t)b * m->lay.S + (size_t)r * T) * row,
						 (size_t)T * row * f);
			}
		}
	}
	par_rc(m, bk->alltoall(bk, dimc(m, HP_DIM_CP), m->lay.cp_send, m->lay.cp_recv, per, HP_DTYPE_F32, &m->err));
	for (int s = 0; s < cp; s++) {
		const float *in = m->lay.cp_recv + (size_t)s * per;

		for (int i = 0; i < nt; i++) {
			int Hc = x[i].H / cp, D = x[i].D;
			size_t row = (size_t)Hc * D;

			for (int b = 0; b < B; b++, in += (size_t)T * row) {
				if (dir == 0)
					bk->copy(bk, x[i].split + ((size_t)b * m->lay.S + (size_t)s * T) * row, in,
						 (size_t)T * row * f);
				else
					bk->copy2d(bk, x[i].loc + ((size_t)b * T * x[i].H + (size_t)s * Hc) * D,
						   (size_t)x[i].H * D * f, in, row * f, row * f, (size_t)T);
			}
		}
	}
}

/* The first of the heads this rank's attention kernel runs, among its tp
 * rank's heads: ulysses gives cp rank r heads r*H/cp .. */
static int sinks_at(const struct hp_model *m)
{
	return cp_ul(m) ? m->par.cp_rank * (m->spec.n_heads / m->par.cp) : 0;
}

/* The first visible key of each query as layer l's kernels read it: the
 * documents' starts, or with a sliding window window_lows'. */
static const int32_t *lseg(const struct hp_model *m, int l)
{
	return m->spec.sliding[l] && windowed(m) ? m->a.segw.d : m->a.seg;
}

/* The attention kernel itself, on q, k, v as the exchanges left them
 * (all-gathered K and V, or the ulysses head split). */
static void attention_core(struct hp_model *m, int l)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	int D = s->head_dim, Hq = s->n_heads, Hkv = s->n_kv_heads, cp = m->par.cp, fl = m->k.flash[l];

	if (cp_ag(m)) {
		int q0 = l == 0 && m->fault == HP_FAULT_CP_WRONG_OFFSET ? 0 : m->par.cp_rank * m->a.T;

		bk->cp_attention_fwd(bk, a->att, fl ? NULL : a->P, fl ? a->P : NULL, a->q, a->kg, a->vg, lseg(m, l),
				     m->a.B, m->a.T, m->lay.S, q0, Hq, Hkv, D);
	} else if (cp_ul(m)) {
		if (fl)
			bk->flash_fwd(bk, a->att_u, a->P, a->q, a->k, a->v, lseg(m, l), m->a.B, m->lay.S, Hq / cp, Hkv / cp, D);
		else
			bk->attention_fwd(bk, a->att_u, a->P, a->q, a->k, a->v, lseg(m, l), m->a.B, m->lay.S, Hq / cp,
					  Hkv / cp, D);
	} else if (fl) {
		bk->flash_fwd(bk, a->att, a->P, a->q, a->k, a->v, lseg(m, l), m->a.B, m->a.T, Hq, Hkv, D);
	} else {
		bk->attention_fwd(bk, a->att, a->P, a->q, a->k, a->v, lseg(m, l), m->a.B, m->a.T, Hq, Hkv, D);
	}
	if (m->w.lw[l].sinks)   /* GPT-OSS: the sinks join each row's softmax (flash only, see init) */
		bk->sinks_fwd(bk, cp_ul(m) ? a->att_u : a->att, a->P, m->w.lw[l].sinks + sinks_at(m),
			      m->a.B, cp_ul(m) ? m->lay.S : m->a.T, cp_ul(m) ? Hq / cp : Hq, D);
}

/* The sinks' gradient, on the kernel's dout, out and lse (before its backward). */
static void sinks_bwd(struct hp_model *m, int l, const float *dout, const float *out, int T, int H)
{
	if (m->w.lw[l].sinks)
		m->bk->sinks_bwd(m->bk, m->w.lg[l].sinks + sinks_at(m), dout, out, m->a.act[l].P,
				 m->w.lw[l].sinks + sinks_at(m), m->a.B, T, H, m->spec.head_dim);
}

static void attention_fwd(struct hp_model *m, int l)
{
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	int Hq = s->n_heads, Hkv = s->n_kv_heads;

	if (cp_ag(m)) {
		cp_gather_kv(m, a);
		attention_core(m, l);
		return;
	}
	if (cp_ul(m)) {
		/* q, k, v go to the head split in place of their local layout (the
		 * backward needs them split; q_raw, k_raw keep what qk_norm needs) */
		int D = s->head_dim;
		struct ul_t x[3] = { { a->q, a->q, Hq, D }, { a->k, a->k, Hkv, D }, { a->v, a->v, Hkv, D } };
		struct ul_t o = { a->att, a->att_u, Hq, D };

		ulysses(m, x, 3, 0);
		attention_core(m, l);
		ulysses(m, &o, 1, 1);
		return;
	}
	attention_core(m, l);
}

/* m->a.datt -> m->a.dq, m->a.dk, m->dv (this rank's tokens, local layout). */
static void attention_bwd(struct hp_model *m, int l)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	int D = s->head_dim, Hq = s->n_heads, Hkv = s->n_kv_heads, cp = m->par.cp;

	if (cp_ag(m)) {
		size_t whole = (size_t)m->a.B * m->lay.S * Hkv * D;

		int q0 = l == 0 && m->fault == HP_FAULT_CP_WRONG_OFFSET ? 0 : m->par.cp_rank * m->a.T;

		sinks_bwd(m, l, m->a.datt, a->att, m->a.T, Hq);
		bk->cp_attention_bwd(bk, m->a.dq, m->lay.cp_recv, m->lay.cp_recv + whole, m->a.datt, a->att,
				     m->k.flash[l] ? NULL : a->P, m->k.flash[l] ? a->P : NULL, a->q, a->kg, a->vg,
				     lseg(m, l), m->a.dscratch, m->a.B, m->a.T, m->lay.S, q0, Hq, Hkv, D);
		cp_scatter_dkv(m, l == 0 && m->fault == HP_FAULT_CP_SKIP_KV_GRAD_REDUCE);
		return;
	}
	if (cp_ul(m)) {
		/* dout to the head split in place, the kernel's gradients back */
		struct ul_t d = { m->a.datt, m->a.datt, Hq, D };
		struct ul_t x[3] = { { m->a.dq, m->a.dq, Hq, D }, { m->a.dk, m->a.dk, Hkv, D },
				     { m->a.dv, m->a.dv, Hkv, D } };

		ulysses(m, &d, 1, 0);
		sinks_bwd(m, l, m->a.datt, a->att_u, m->lay.S, Hq / cp);
		if (m->k.flash[l])
			bk->flash_bwd(bk, m->a.dq, m->a.dk, m->a.dv, m->a.datt, a->att_u, a->P, a->q, a->k, a->v, lseg(m, l),
				      m->a.dscratch, m->a.B, m->lay.S, Hq / cp, Hkv / cp, D);
		else
			bk->attention_bwd(bk, m->a.dq, m->a.dk, m->a.dv, m->a.datt, a->P, a->q, a->k, a->v, lseg(m, l),
					  m->a.dscratch, m->a.B, m->lay.S, Hq / cp, Hkv / cp, D);
		ulysses(m, x, 3, 1);
		return;
	}
	sinks_bwd(m, l, m->a.datt, a->att, m->a.T, Hq);
	if (m->k.flash[l])
		bk->flash_bwd(bk, m->a.dq, m->a.dk, m->a.dv, m->a.datt, a->att, a->P, a->q, a->k, a->v, lseg(m, l),
			      m->a.dscratch, m->a.B, m->a.T, Hq, Hkv, D);
	else
		bk->attention_bwd(bk, m->a.dq, m->a.dk, m->a.dv, m->a.datt, a->P, a->q, a->k, a->v, lseg(m, l),
				  m->a.dscratch, m->a.B, m->a.T, Hq, Hkv, D);
}

/* ---- the sparse MoE block (Qwen3MoeSparseMoeBlock) ---- */

static int first_moe(const struct hp_model *m)
{
	for (int l = 0; l < m->spec.n_layers; l++)
		if (m->w.lw[l].moe)
			return l;
	return -1;
}

/* The experts' activation on R rows of gate g and up u (row stride ld)
 * into h [R, Im]: SwiGLU, or GPT-OSS's clamped one. */
static void act_fwd(struct hp_model *m, float *h, const float *g, const float *u, long ld, long R)
{
	const struct hp_model_spec *s = &m->spec;
	int Im = s->moe_intermediate;

	if (s->moe_act == HP_MOE_ACT_CLAMPED)
		m->bk->glu_clamp_fwd(m->bk, h, g, u, ld, R, Im, (float)s->swiglu_alpha, (float)s->swiglu_limit);
	else if (ld == Im)
		m->bk->swiglu_fwd(m->bk, h, g, u, R * Im);
	else   /* [gate | up] rows */
		m->bk->swiglu_rows_fwd(m->bk, h, g, R, Im);
}

static void act_bwd(struct hp_model *m, float *dg, float *du, const float *dh, const float *g, const float *u,
		    long ld, long R)
{
	const struct hp_model_spec *s = &m->spec;
	int Im = s->moe_intermediate;

	if (s->moe_act == HP_MOE_ACT_CLAMPED)
		m->bk->glu_clamp_bwd(m->bk, dg, du, dh, g, u, ld, R, Im, (float)s->swiglu_alpha,
				     (float)s->swiglu_limit);
	else if (ld == Im)
		m->bk->swiglu_bwd(m->bk, dg, du, dh, g, u, R * Im);
	else
		m->bk->swiglu_rows_bwd(m->bk, dg, dh, g, R, Im);
}

/* The grouped experts' outputs from the activations in hrec: down_proj
 * (and its bias). */
static void down_fwd(struct hp_model *m, int l, float *ye, const int32_t *off, int nx, long R)
{
	const struct hp_layer_w *w = &m->w.lw[l];
	int C = m->spec.hidden, Im = m->spec.moe_intermediate;

	m->bk->grouped_fwd(m->bk, ye, m->a.hrec, w->ex[0].wd, w->xs, off, nx, R, Im, C);
	if (w->ex[0].bd)
		m->bk->bias_grouped_fwd(m->bk, ye, C, w->ex[0].bd, w->xs, off, nx, C, R);
}

/*
 * Experts x = 0..nx-1 (local) on their rows xe[off[x] .. off[x+1]) (off
 * the backend's; R rows in all) -> ye: each expert's gate and up
 * projections and SwiGLU, then its down projection, every expert in one
 * grouped call per projection.  Grouped kernel: one GEMM over the adjacent
 * gate and up weights, the SwiGLU of [gate | up] rows (row by row, so the
 * same numbers as expert by expert).
 * ye NULL (grouped kernel): the gate|up rows only, all that the backward
 * keeps of them (a checkpointed layer's recomputation).
 */
static void experts_fwd(struct hp_model *m, int l, const float *xe, const int32_t *off, int nx, long R, float *ye)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	const struct hp_layer_w *w = &m->w.lw[l];
	const struct hp_expert_w *x0 = &w->ex[0];
	int C = s->hidden, Im = s->moe_intermediate;

	if (!m->k.grouped[l]) {
		bk->grouped_fwd(bk, a->ge, xe, x0->wg, w->xs, off, nx, R, C, Im);
		bk->grouped_fwd(bk, a->ue, xe, x0->wu, w->xs, off, nx, R, C, Im);
		if (x0->bg) {
			bk->bias_grouped_fwd(bk, a->ge, Im, x0->bg, w->xs, off, nx, Im, R);
			bk->bias_grouped_fwd(bk, a->ue, Im, x0->bu, w->xs, off, nx, Im, R);
		}
		act_fwd(m, a->he, a->ge, a->ue, Im, R);
		bk->grouped_fwd(bk, ye, a->he, x0->wd, w->xs, off, nx, R, Im, C);
		if (x0->bd)
			bk->bias_grouped_fwd(bk, ye, C, x0->bd, w->xs, off, nx, C, R);
		return;
	}
	/* gate and up weights are adjacent: one GEMM gives [gate | up] rows */
	bk->grouped_fwd(bk, a->ge, xe, x0->wg, w->xs, off, nx, R, C, 2 * Im);
	if (x0->bg) {
		bk->bias_grouped_fwd(bk, a->ge, 2 * Im, x0->bg, w->xs, off, nx, Im, R);
		bk->bias_grouped_fwd(bk, a->ge + Im, 2 * Im, x0->bu, w->xs, off, nx, Im, R);
	}
	if (!ye)
		return;
	act_fwd(m, m->a.hrec, a->ge, a->ge + Im, 2 * Im, R);
	down_fwd(m, l, ye, off, nx, R);
}

/* Backward of experts_fwd: dye -> dxe, weight gradients added.  h_ready:
 * (grouped) hrec already holds the SwiGLU outputs, recomputed for the
 * experts' outputs. */
static void experts_bwd(struct hp_model *m, int l, const float *xe, const int32_t *off, int nx, long R,
			const float *dye, float *dxe, int h_ready)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	const struct hp_layer_w *w = &m->w.lw[l];
	const struct hp_expert_w *x0 = &w->ex[0], *g0 = &m->w.lg[l].ex[0];
	size_t gs = m->w.lg[l].xs;
	int C = s->hidden, Im = s->moe_intermediate;

	if (g0->bd)
		bk->bias_grouped_bwd(bk, g0->bd, gs, dye, C, off, nx, C);
	if (!m->k.grouped[l]) {
		bk->grouped_bwd(bk, m->a.dhe, g0->wd, gs, dye, a->he, x0->wd, w->xs, off, nx, R, Im, C, 0);
		act_bwd(m, m->a.dge, m->a.due, m->a.dhe, a->ge, a->ue, Im, R);
		if (g0->bg) {
			bk->bias_grouped_bwd(bk, g0->bg, gs, m->a.dge, Im, off, nx, Im);
			bk->bias_grouped_bwd(bk, g0->bu, gs, m->a.due, Im, off, nx, Im);
		}
		bk->grouped_bwd(bk, dxe, g0->wg, gs, m->a.dge, xe, x0->wg, w->xs, off, nx, R, C, Im, 0);
		bk->grouped_bwd(bk, dxe, g0->wu, gs, m->a.due, xe, x0->wu, w->xs, off, nx, R, C, Im, 1);
		return;
	}
	/* the SwiGLU output is recomputed rather than kept (unless the
	 * recomputed expert outputs needed it first) */
	if (!h_ready)
		act_fwd(m, m->a.hrec, a->ge, a->ge + Im, 2 * Im, R);
	bk->grouped_bwd(bk, m->a.dhe, g0->wd, gs, dye, m->a.hrec, x0->wd, w->xs, off, nx, R, Im, C, 0);
	act_bwd(m, m->a.dge, m->a.dge + Im, m->a.dhe, a->ge, a->ge + Im, 2 * Im, R);
	if (g0->bg) {
		bk->bias_grouped_bwd(bk, g0->bg, gs, m->a.dge, 2 * Im, off, nx, Im);
		bk->bias_grouped_bwd(bk, g0->bu, gs, m->a.dge + Im, 2 * Im, off, nx, Im);
	}
	bk->grouped_bwd(bk, dxe, g0->wg, gs, m->a.dge, xe, x0->wg, w->xs, off, nx, R, C, 2 * Im, 0);
}

/*
 * Expert parallelism: send [NK rows, expert-major, C] to the ranks of their
 * experts (rank r owns experts r*El ..), with the per-expert counts first,
 * so that each rank receives, from each peer, its rows grouped by local
 * expert; regroup them expert-major (a->ep_perm remembers the order) into
 * a->xe with a->ep_off.  The counts are host integers, exchanged over MPI
 * on every backend.
 */
static void ep_dispatch_counts(struct hp_model *m, int l)
{
	struct hp_layer_act *a = &m->a.act[l];
	int ep = m->par.ep, El = m->lay.El, E = m->spec.n_experts;
	int32_t *cnt = m->a.moe_fill, *rcnt = m->a.moe_fill + E;   /* [E] sent, [ep*El] = [E] received */
	int32_t *perm = a->ep_perm.h;
	long at = 0;

	for (int x = 0; x < E; x++)
		cnt[x] = a->ex_off.h[x + 1] - a->ex_off.h[x];
	par_rc(m, hp_comm_alltoall(dimc(m, HP_DIM_EP), cnt, rcnt, (size_t)El, HP_DTYPE_I32, &m->err));
	for (int r = 0; r < ep; r++) {
		a->ep_scount[r] = a->ex_off.h[(r + 1) * El] - a->ex_off.h[r * El];
		a->ep_rcount[r] = 0;
		for (int x = 0; x < El; x++)
			a->ep_rcount[r] += rcnt[r * El + x];
	}
	/* expert-major order of the received rows: expert x's rows from peer 0,
	 * then peer 1, ...; the rows of (peer s, expert x) sit in the receive
	 * buffer at s's block, after s's rows for experts before x */
	a->ep_off.h[0] = 0;
	for (int x = 0; x < El; x++) {
		long n = 0;
		for (int r = 0; r < ep; r++) {
			long src = 0;
			for (int q = 0; q < r; q++)
				src += a->ep_rcount[q];
			for (int y = 0; y < x; y++)
				src += rcnt[r * El + y];
			for (int j = 0; j < rcnt[r * El + x]; j++)
				perm[at++] = (int32_t)(src + j);
			n += rcnt[r * El + x];
		}
		a->ep_off.h[x + 1] = a->ep_off.h[x] + (int32_t)n;
	}
	a->ep_rows = at;
	par_rc(m, m->bk->put(m->bk, &a->ep_perm, (size_t)at, &m->err));
	par_rc(m, m->bk->put(m->bk, &a->ep_off, (size_t)El + 1, &m->err));
}

/* Rows out (dir 0: to the experts, send order -> recv order) or back. */
static void ep_exchange(struct hp_model *m, int l, const float *send, float *recv, int back)
{
	struct hp_backend *bk = m->bk;
	struct hp_layer_act *a = &m->a.act[l];
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
	par_rc(m, bk->alltoallv(bk, dimc(m, HP_DIM_EP), send, sc, sd, recv, rc, rd, HP_DTYPE_F32, back, &m->err));
}

/*
 * Routing, on the backend: the router's top-k choices grouped expert-major,
 * token order within an expert (ex_off, row_tok, row_slot, and for a
 * device's combine each token's rows in ascending order).  A choice out of
 * range (a top-k of NaN logits) goes to expert 0 and is counted where the
 * step's sums read back at its end (HP_ST_BAD), so that every rank still
 * makes the same collectives.  Expert parallelism sends rows by the
 * counts: the host's copy of ex_off comes back for them.
 */
static void route(struct hp_model *m, int l)
{
	struct hp_backend *bk = m->bk;
	struct hp_layer_act *a = &m->a.act[l];
	long N = m->lay.Ns;
	int E = m->spec.n_experts, K = m->spec.top_k;

	/* the fault: the first token's first row goes to an expert of the next ep rank */
	if (m->fault == HP_FAULT_EP_WRONG_ROUTE && m->par.ep > 1 && l == first_moe(m) && N > 0) {
		par_rc(m, bk->get(bk, &a->sel, 1, &m->err));
		a->sel.h[0] = (a->sel.h[0] + m->lay.El) % E;
		par_rc(m, bk->put(bk, &a->sel, 1, &m->err));
	}
	bk->moe_route(bk, a->ex_off.d, a->row_tok.d, a->row_slot.d, a->tok_rows.d, (int32_t *)(m->a.st + HP_ST_BAD),
		      a->sel.d, N, E, K);
	if (m->par.ep > 1)
		par_rc(m, bk->get(bk, &a->ex_off, (size_t)E + 1, &m->err));
}

static struct hp_route route_of(const struct hp_layer_act *a)
{
	struct hp_route rt = { a->row_tok.d, a->row_slot.d, a->tok_rows.d };

	return rt;
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
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	const struct hp_layer_w *w = &m->w.lw[l];
	long N = m->lay.Ns;
	int C = s->hidden, E = s->n_experts, K = s->top_k;
	struct hp_route rt = route_of(a);

	bk->linear_fwd(bk, a->probs, a->xn2, w->router, w->router_b, N, C, E);
	if (s->router_group)   /* DeepSeek: sigmoid, the correction bias, groups */
		bk->router_group_fwd(bk, a->probs, a->sel.d, a->wsel, w->router_corr, N, E, K, s->n_group,
				     s->topk_group, s->norm_topk_prob, (float)s->routed_scaling, s->group_mask_zero);
	else
		bk->router_topk(bk, a->probs, a->sel.d, a->wsel, N, E, K, s->norm_topk_prob);
	route(m, l);
	if (!re && m->a.route_cnt)   /* the rows each expert took (no tokens: counts only) */
		bk->moe_aux_acc(bk, m->a.route_cnt + (size_t)l * 2 * E, a->probs, a->ex_off.d, 0, E);
	if (m->par.ep > 1) {
		/* HF's index_select into the send buffer; the experts' ranks get them */
		bk->gather_rows(bk, m->lay.ep_send, a->xn2, a->row_tok.d, N * K, C);
		ep_dispatch_counts(m, l);
		ep_exchange(m, l, m->lay.ep_send, m->lay.ep_recv, 0);
		bk->gather_rows(bk, a->xe, m->lay.ep_recv, a->ep_perm.d, a->ep_rows, C);
		experts_fwd(m, l, a->xe, a->ep_off.d, m->lay.El, a->ep_rows, m->lay.ep_recv);
		bk->scatter_rows(bk, m->lay.ep_send, m->lay.ep_recv, a->ep_perm.d, a->ep_rows, C);
		ep_exchange(m, l, m->lay.ep_send, a->ye, 1);
		if (m->fault == HP_FAULT_EP_DROP_TOKEN && l == first_moe(m) && N > 0)
			bk->zero(bk, a->ye, sizeof(float) * (size_t)C);   /* the fault: one row lost */
	} else {
		/* HF's index_select: every routed row copied out; the grouped kernel
		 * gathers rows into one shared buffer instead of keeping a copy */
		float *xe = m->k.grouped[l] ? m->a.xg : a->xe;
		bk->gather_rows(bk, xe, a->xn2, a->row_tok.d, N * K, C);
		experts_fwd(m, l, xe, a->ex_off.d, E, N * K, a->ye ? a->ye : re ? NULL : m->a.dxe);
	}
	if (re)
		return;
	bk->moe_combine(bk, out, a->ye ? a->ye : m->a.dxe, a->wsel, &rt, N, K, C);
}

/*
 * HF's load_balancing_loss_func over every MoE layer of this forward:
 * with all router outputs concatenated (n tokens), F_e = (slots routed to
 * e) / n and P_e = mean probability of e; aux = E * sum_e F_e * P_e.
 * The micro-batch's tokens are spread over cp (and tp with sequence
 * parallelism): the per-expert sums are all-reduced there.  The sums stay
 * in the backend's memory (after the step's sums in m->a.st), where the
 * backward reads F.
 */
static void moe_aux_add(struct hp_model *m, int l)
{
	m->bk->moe_aux_acc(m->bk, m->a.fp, m->a.act[l].probs, m->a.act[l].ex_off.d, m->lay.Ns,
			   m->spec.n_experts);
}

/*
 * After every MoE layer's forward (a checkpointed layer's router outputs
 * do not outlive it): the aux loss, added to the step's (over cp: every
 * cp rank has the micro-batch's), on the backend.
 */
static void moe_aux(struct hp_model *m)
{
	struct hp_backend *bk = m->bk;
	int E = m->spec.n_experts;
	double n = (double)m->a.B * m->lay.S * m->n_moe, *FP = m->a.fp;

	if (m->par.cp > 1)
		par_rc(m, bk->allreduce(bk, dimc(m, HP_DIM_CP), FP, 2 * (size_t)E, HP_DTYPE_F64, HP_RED_SUM, &m->err));
	if (m->par.sp)
		par_rc(m, bk->allreduce(bk, dimc(m, HP_DIM_TP), FP, 2 * (size_t)E, HP_DTYPE_F64, HP_RED_SUM, &m->err));
	bk->moe_aux_fin(bk, FP, FP + 2 * E, m->a.st + HP_ST_AUX, E, n, m->par.cp);
}

/* Backward of moe_forward: dout is d(loss)/d(out) [N,C]; writes dxn [N,C]. */
static void moe_backward(struct hp_model *m, int l, const float *dout, float *dxn, double aux_grad)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	const struct hp_layer_w *w = &m->w.lw[l];
	struct hp_layer_w *g = &m->w.lg[l];
	long N = m->lay.Ns;
	int C = s->hidden, E = s->n_experts, K = s->top_k;
	float *dxe = m->a.dxe;
	struct hp_route rt = route_of(a);

	/* the experts' outputs again where they were not kept (grouped, one
	 * rank): the SwiGLU from the saved gate|up rows, then down_proj, into
	 * dxe's room, which the experts' backward overwrites only later */
	const float *ye = a->ye;
	if (!ye) {
		int Im = s->moe_intermediate;

		act_fwd(m, m->a.hrec, a->ge, a->ge + Im, 2 * Im, N * K);
		down_fwd(m, l, m->a.dxe, a->ex_off.d, E, N * K);
		ye = m->a.dxe;
	}
	/* through the weighted sum: dy_r = w * dout_t, dw = dout_t . y_r */
	bk->moe_combine_bwd(bk, m->a.dye, m->a.dwsel, dout, ye, a->wsel, &rt, N, K, C);
	if (m->par.ep > 1) {
		/* dY to the experts' ranks, dX back, the forward's routes reversed */
		ep_exchange(m, l, m->a.dye, m->lay.ep_recv, 0);
		bk->gather_rows(bk, m->a.dye, m->lay.ep_recv, a->ep_perm.d, a->ep_rows, C);
		experts_bwd(m, l, a->xe, a->ep_off.d, m->lay.El, a->ep_rows, m->a.dye, m->a.dxe, 0);
		bk->scatter_rows(bk, m->lay.ep_send, m->a.dxe, a->ep_perm.d, a->ep_rows, C);
		ep_exchange(m, l, m->lay.ep_send, m->lay.ep_recv, 1);
		dxe = m->lay.ep_recv;
	} else {
		const float *xe = a->xe;
		if (m->k.grouped[l]) {   /* the routed rows again, for the weight gradients */
			bk->gather_rows(bk, m->a.xg, a->xn2, a->row_tok.d, N * K, C);
			xe = m->a.xg;
		}
		experts_bwd(m, l, xe, a->ex_off.d, E, N * K, m->a.dye, m->a.dxe, !a->ye);
	}
	/* routing weights -> probabilities of the chosen experts -> router logits */
	if (s->router_group)
		bk->router_group_bwd(bk, m->a.dprob, a->probs, a->sel.d, m->a.dwsel, N, E, K, s->norm_topk_prob,
				     (float)s->routed_scaling);
	else
		bk->router_bwd(bk, m->a.dprob, a->probs, a->sel.d, a->wsel, m->a.dwsel, m->a.fp, aux_grad, N, E, K,
			       s->norm_topk_prob);
	bk->linear_bwd(bk, dxn, g->router, g->router_b, m->a.dprob, a->xn2, w->router, N, C, E, 0);
	bk->moe_scatter_add(bk, dxn, dxe, &rt, N, K, C);
}

/*
 * A norm's input x is the residual a + b (b NULL: x already holds it; a
 * NULL: nothing owed), then y = rmsnorm(x): in one pass with the fused
 * kernel, else HF's add then norm.
 */
static void norm_in(struct hp_model *m, int fused, float *x, float *y, float *rstd, const float *a,
		    const float *b, const float *w, long N, int C, float eps)
{
	struct hp_backend *bk = m->bk;

	if (fused) {
		bk->rmsnorm_res_fwd(bk, x, y, rstd, a ? a : x, a ? b : NULL, w, N, C, eps);
		return;
	}
	if (a)
		bk->add(bk, x, a, b, N * C);
	bk->rmsnorm_fwd(bk, y, rstd, x, w, N, C, eps);
}

/* Cross-entropy of the vocab-parallel logits [N, V/tp]: with loss_parallel
 * the row maxima and sums are all-reduced over tp; else every rank's
 * logits are all-gathered and each rank reduces them alike.  Leaves the
 * row statistics in vp_mx, vp_st for the backward. */
static int vp_loss(struct hp_model *m, double *loss_sum, long *count)
{
	struct hp_backend *bk = m->bk;
	long N = (long)m->a.B * m->a.T;
	int Vl = m->spec.vocab, tp = m->par.tp;
	struct hp_comm *c = dimc(m, HP_DIM_TP);
	double *st = m->lay.vp_st, *st2 = m->lay.vp_st + 2 * N;
	float *mx = m->lay.vp_mx, *mx2 = m->lay.vp_mx + N;
	const int32_t *tg = m->a.tgt.d;

	if (m->par.loss_parallel) {
		bk->vp_ce_max(bk, mx, m->a.logits, N, Vl);
		par_rc(m, bk->allreduce(bk, c, mx, (size_t)N, HP_DTYPE_F32, HP_RED_MAX, &m->err));
		bk->vp_ce_sums(bk, st, m->a.logits, mx, tg, N, Vl, m->lay.v0);
		par_rc(m, bk->allreduce(bk, c, st, 2 * (size_t)N, HP_DTYPE_F64, HP_RED_SUM, &m->err));
	} else {
		par_rc(m, bk->allgather(bk, c, m->a.logits, m->lay.glogits, (size_t)N * Vl, HP_DTYPE_F32, &m->err));
		for (int r = 0; r < tp; r++) {
			bk->vp_ce_max(bk, r ? mx2 : mx, m->lay.glogits + (size_t)r * N * Vl, N, Vl);
			if (r)
				bk->max(bk, mx, mx2, N);
		}
		for (int r = 0; r < tp; r++) {
			bk->vp_ce_sums(bk, r ? st2 : st, m->lay.glogits + (size_t)r * N * Vl, mx, tg, N, Vl, r * Vl);
			if (r)
				bk->add_f64(bk, st, st2, 2 * N);
		}
	}
	if (m->par_rc)
		return -2;
	return bk->vp_ce_loss(bk, loss_sum, count, st, mx, &m->a.tgt, N, m->gspec.vocab);
}

/*
 * Layer l's forward from its input x_in (plus the residual ra + rb owed to
 * it; NULL: x_in holds it already) up to mlp_out, which a dense layer
 * writes into the next layer's input.  re: the backward's recomputation
 * of a checkpointed layer: the same operations and collectives into the
 * same (shared) buffers, with m->a.dx, the residual's live gradient, left
 * alone; it stops where the backward needs nothing more (a dense layer's
 * down_proj), and it neither probes nor calls hooks.
 */
/* ---- multi-head latent attention (DeepseekV3Attention) ---- */

/*
 * q is scaled by this so that the kernels' 1/sqrt(head_dim) (head_dim
 * the padded head) is transformers' softmax scale, (qk_nope +
 * qk_rope)^-0.5 times the mscale of DeepSeek's YaRN.
 */
static float mla_q_scale(const struct hp_model_spec *s)
{
	return (float)(sqrt((double)s->head_dim / (s->qk_nope + s->qk_rope)) * s->attn_mscale);
}

/*
 * xn1 -> q, k, v in the attention kernels' layout, [N, H, head_dim] each:
 * q from q_proj (or q_a_proj, its norm, q_b_proj), [q_nope | q_rope]
 * with RoPE on q_rope; the latent [c | k_rope] from kv_a_proj_with_mqa, c
 * through kv_a_layernorm and kv_b_proj into each head's [k_nope | v],
 * and k_rope, rotated once, every head's.  The shorter of q/k and v is
 * zero-padded to head_dim.  DeepSeek's rope_interleave rotates adjacent
 * pairs where transformers de-interleaves and rotates halves: the same
 * values in another order, the same in q and k, so the same products.
 */
static void mla_fwd(struct hp_model *m, int l)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	const struct hp_layer_w *w = &m->w.lw[l];
	long N = (long)m->a.B * m->a.T;
	int C = s->hidden, H = s->n_heads, D = s->head_dim, nope = s->qk_nope, r = s->qk_rope, qk = nope + r;
	int vh = s->v_head, R = s->q_lora_rank, L = s->kv_lora_rank, kv = nope + vh;
	size_t f = sizeof(float), n = (size_t)N * H * D;
	float eps = (float)s->rms_eps, qs = mla_q_scale(s), *q = D == qk ? a->q : m->a.mla_w;

	if (R) {
		bk->linear_fwd(bk, a->qa, a->xn1, w->wqa, w->bqa, N, C, R);
		bk->rmsnorm_fwd(bk, a->qan, a->rstd_qa, a->qa, w->qa_norm, N, R, eps);
		bk->linear_fwd(bk, q, a->qan, w->wq, NULL, N, R, H * qk);
	} else {
		bk->linear_fwd(bk, q, a->xn1, w->wq, NULL, N, C, H * qk);
	}
	if (D != qk) {
		bk->zero(bk, a->q, n * f);
		bk->copy2d(bk, a->q, D * f, q, qk * f, qk * f, (size_t)N * H);
	}
	bk->rope_fwd(bk, a->q + nope, m->a.pos.d, m->a.cos_t, m->a.sin_t, N, H, D, r, s->rope_interleave);
	if (qs != 1.0f)
		bk->scale(bk, a->q, qs, n);

	bk->linear_fwd(bk, m->a.mla_u, a->xn1, w->wkva, w->bkva, N, C, L + r);
	bk->copy2d(bk, a->kvc, L * f, m->a.mla_u, (L + r) * f, L * f, (size_t)N);
	bk->rope_fwd(bk, m->a.mla_u + L, m->a.pos.d, m->a.cos_t, m->a.sin_t, N, 1, L + r, r, s->rope_interleave);
	bk->rmsnorm_fwd(bk, a->cn, a->rstd_kv, a->kvc, w->kva_norm, N, L, eps);
	bk->linear_fwd(bk, m->a.mla_t, a->cn, w->wkvb, NULL, N, L, H * kv);
	if (D != qk)
		bk->zero(bk, a->k, n * f);
	if (D != vh)
		bk->zero(bk, a->v, n * f);
	bk->copy2d(bk, a->k, D * f, m->a.mla_t, kv * f, nope * f, (size_t)N * H);
	bk->bcast_heads(bk, a->k + nope, D, m->a.mla_u + L, L + r, N, H, r);
	bk->copy2d(bk, a->v, D * f, m->a.mla_t + nope, kv * f, vh * f, (size_t)N * H);
}

/* The attention output o_proj reads: each head's first v_head_dim values. */
static const float *mla_out(struct hp_model *m, int l)
{
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	size_t f = sizeof(float);

	if (!a->att_v)
		return a->att;
	m->bk->copy2d(m->bk, a->att_v, s->v_head * f, a->att, s->head_dim * f, s->v_head * f,
		      (size_t)m->a.B * m->a.T * s->n_heads);
	return a->att_v;
}

/* o_proj's input gradient [N, H*v] (in dav) to the kernels' padded datt. */
static void mla_datt(struct hp_model *m, const float *dav)
{
	const struct hp_model_spec *s = &m->spec;
	size_t f = sizeof(float), n = (size_t)m->a.B * m->a.T * s->n_heads;

	m->bk->zero(m->bk, m->a.datt, n * s->head_dim * f);
	m->bk->copy2d(m->bk, m->a.datt, s->head_dim * f, dav, s->v_head * f, s->v_head * f, n);
}

/* Backward of mla_fwd: dq, dk, dv (the kernels' layout) -> dxn (written)
 * and the weights' gradients. */
static void mla_bwd(struct hp_model *m, int l)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	const struct hp_layer_w *w = &m->w.lw[l];
	struct hp_layer_w *g = &m->w.lg[l];
	long N = (long)m->a.B * m->a.T;
	int C = s->hidden, H = s->n_heads, D = s->head_dim, nope = s->qk_nope, r = s->qk_rope, qk = nope + r;
	int vh = s->v_head, R = s->q_lora_rank, L = s->kv_lora_rank, kv = nope + vh;
	size_t f = sizeof(float), n = (size_t)N * H * D;
	float qs = mla_q_scale(s), *dq = m->a.dq;

	if (qs != 1.0f)
		bk->scale(bk, dq, qs, n);
	bk->rope_bwd(bk, dq + nope, m->a.pos.d, m->a.cos_t, m->a.sin_t, N, H, D, r, s->rope_interleave);
	if (D != qk) {
		bk->copy2d(bk, m->a.mla_w, qk * f, dq, D * f, qk * f, (size_t)N * H);
		dq = m->a.mla_w;
	}
	if (R) {
		bk->linear_bwd(bk, m->a.mla_u, g->wq, NULL, dq, a->qan, w->wq, N, R, H * qk, 0);
		bk->rmsnorm_bwd(bk, m->a.mla_w, g->qa_norm, m->a.mla_u, a->qa, w->qa_norm, a->rstd_qa, N, R, 0);
		bk->linear_bwd(bk, m->a.dxn, g->wqa, g->bqa, m->a.mla_w, a->xn1, w->wqa, N, C, R, 0);
	} else {
		bk->linear_bwd(bk, m->a.dxn, g->wq, NULL, dq, a->xn1, w->wq, N, C, H * qk, 0);
	}

	/* [dk_nope | dv] per head for kv_b_proj; every head's dk_rope summed */
	bk->copy2d(bk, m->a.mla_t, kv * f, m->a.dk, D * f, nope * f, (size_t)N * H);
	bk->copy2d(bk, m->a.mla_t + nope, kv * f, m->a.dv, D * f, vh * f, (size_t)N * H);
	bk->sum_heads(bk, m->a.mla_u + L, L + r, m->a.dk + nope, D, N, H, r);
	bk->rope_bwd(bk, m->a.mla_u + L, m->a.pos.d, m->a.cos_t, m->a.sin_t, N, 1, L + r, r, s->rope_interleave);
	bk->linear_bwd(bk, m->a.mla_w, g->wkvb, NULL, m->a.mla_t, a->cn, w->wkvb, N, L, H * kv, 0);
	bk->rmsnorm_bwd(bk, m->a.mla_t, g->kva_norm, m->a.mla_w, a->kvc, w->kva_norm, a->rstd_kv, N, L, 0);
	bk->copy2d(bk, m->a.mla_u, (L + r) * f, m->a.mla_t, L * f, L * f, (size_t)N);
	bk->linear_bwd(bk, m->a.dxn, g->wkva, g->bkva, m->a.mla_u, a->xn1, w->wkva, N, C, L + r, 1);
}

/* ---- DeepSeek's shared experts: one SwiGLU MLP beside the routed ones ---- */

/* out [Ns,C] += the shared experts of xn2; re: the SwiGLU only (what the
 * backward reads). */
static void shared_fwd(struct hp_model *m, int l, float *out, int re)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	const struct hp_layer_w *w = &m->w.lw[l];
	long Ns = m->lay.Ns;
	int C = s->hidden, Is = s->shared_inter;

	bk->linear_fwd(bk, a->g, a->xn2, w->wsg, NULL, Ns, C, Is);
	bk->linear_fwd(bk, a->u, a->xn2, w->wsu, NULL, Ns, C, Is);
	bk->swiglu_fwd(bk, a->h, a->g, a->u, Ns * Is);
	if (w->wshg) {   /* Qwen3-Next: sigmoid(shared_expert_gate(x)) * shared_expert(x) */
		bk->linear_fwd(bk, a->sh_out, a->h, w->wsd, NULL, Ns, Is, C);
		bk->linear_fwd(bk, a->sh_gl, a->xn2, w->wshg, NULL, Ns, C, 1);
		if (re)
			return;
		bk->sigmoid_gate_rows_fwd(bk, m->a.dxn, a->sh_out, a->sh_gl, Ns, C);
	} else {
		if (re)
			return;
		bk->linear_fwd(bk, m->a.dxn, a->h, w->wsd, NULL, Ns, Is, C);
	}
	bk->add(bk, out, out, m->a.dxn, Ns * C);   /* transformers: routed + shared */
}

/* Its backward: dxn += from dout [Ns,C]. */
static void shared_bwd(struct hp_model *m, int l, const float *dout, float *dxn)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	const struct hp_layer_w *w = &m->w.lw[l];
	struct hp_layer_w *g = &m->w.lg[l];
	long Ns = m->lay.Ns;
	int C = s->hidden, Is = s->shared_inter;

	if (w->wshg) {   /* the gate: dout to the shared expert's output and the gate's logit */
		float *dsh = m->a.gdn_w, *dgl = dsh + (size_t)Ns * C;

		bk->sigmoid_gate_rows_bwd(bk, dsh, dgl, dout, a->sh_out, a->sh_gl, Ns, C);
		bk->linear_bwd(bk, dxn, g->wshg, NULL, dgl, a->xn2, w->wshg, Ns, C, 1, 1);
		dout = dsh;
	}
	bk->linear_bwd(bk, m->a.dh, g->wsd, NULL, dout, a->h, w->wsd, Ns, Is, C, 0);
	bk->swiglu_bwd(bk, m->a.dg, m->a.du, m->a.dh, a->g, a->u, Ns * Is);
	bk->linear_bwd(bk, dxn, g->wsg, NULL, m->a.dg, a->xn2, w->wsg, Ns, C, Is, 1);
	bk->linear_bwd(bk, dxn, g->wsu, NULL, m->a.du, a->xn2, w->wsu, Ns, C, Is, 1);
}

/* ---- Qwen3-Next / Qwen3.5 ---- */

/*
 * The zero-centred RMSNorms (Qwen3NextRMSNorm) multiply by 1 + w: made
 * from the weights at each forward of the layer (k: 0 input, 1
 * post-attention, 2 q, 3 k norm; layer n_layers: the final norm), read by
 * that forward and its backward; the gradient of 1 + w is w's.  Other
 * models' norms: w itself.
 */
static float *zc_at(struct hp_model *m, int l, int k)
{
	size_t C = m->spec.hidden, D = m->spec.head_dim;

	return m->a.zc + (size_t)l * (2 * C + 2 * D) + (k < 2 ? k * C : 2 * C + (k - 2) * D);
}

static const float *zcw(struct hp_model *m, int l, int k, const float *w)
{
	return m->spec.norm_zc && w ? zc_at(m, l, k) : w;
}

static void zc_fill(struct hp_model *m, int l)
{
	const struct hp_layer_w *w = &m->w.lw[l];
	int C = m->spec.hidden, D = m->spec.head_dim;

	if (!m->spec.norm_zc)
		return;
	if (l == m->spec.n_layers) {
		m->bk->add(m->bk, zc_at(m, l, 0), m->a.ones, m->w.final_norm, C);
		return;
	}
	m->bk->add(m->bk, zc_at(m, l, 0), m->a.ones, w->in_norm, C);
	m->bk->add(m->bk, zc_at(m, l, 1), m->a.ones, w->post_norm, C);
	if (w->q_norm) {
		m->bk->add(m->bk, zc_at(m, l, 2), m->a.ones, w->q_norm, D);
		m->bk->add(m->bk, zc_at(m, l, 3), m->a.ones, w->k_norm, D);
	}
}

/* the delta rule's scratch: the CPU's own allocation (its size follows the
 * thread count, which a plan does not know), a device's in the arena */
static float *gdr_ws(struct hp_model *m)
{
	return on_device(m) ? m->a.gdr_ws : m->gdr_ws;
}

/* The head split's all-to-all of a Gated DeltaNet layer (cp, ulysses), in
 * place: q, k, v (the conv's input blocks), z, b and a, or their
 * gradients, to the core's layout (dir 0) or back (dir 1). */
static void gdn_ulysses(struct hp_model *m, const struct gdn_dims *g, float *xc, float *z, float *b, float *a,
			int dir)
{
	size_t n = (size_t)g->Nl;
	float *xk = xc + n * g->tKd, *xv = xk + n * g->tKd;
	struct ul_t x[6] = { { xc, xc, g->tHk, g->Dk }, { xk, xk, g->tHk, g->Dk }, { xv, xv, g->tHv, g->Dv },
			     { z, z, g->tHv, g->Dv }, { b, b, g->tHv, 1 }, { a, a, g->tHv, 1 } };

	ulysses(m, x, 6, dir);
}

/* y [N, Vd] (the core's, or this rank's tokens' [Nl, tVd]) across the head split */
static void gdn_ulysses_y(struct hp_model *m, const struct gdn_dims *g, float *y, int dir)
{
	struct ul_t x = { y, y, g->tHv, g->Dv };

	ulysses(m, &x, 1, dir);
}

/*
 * A Gated DeltaNet layer (Qwen3NextGatedDeltaNet, Qwen3_5GatedDeltaNet),
 * xn1 -> x_mid: the projections, laid out as three blocks [N, Kd] q,
 * [N, Kd] k, [N, Vd] v (xc) and z [N, Vd], b and a [N, Hv] (qwen3_next's
 * are interleaved per key head: copied apart); the causal depthwise conv
 * with SiLU on each block (documents kept apart), q and k L2-normalised,
 * beta = sigmoid(b) and g = -exp(A_log) softplus(a + dt_bias), the chunked
 * delta rule (q scaled by Dk^-0.5), the gated RMSNorm with z, out_proj
 * (row-parallel over tp: this rank's columns, partial sums reduced).
 * With cp the projections and out_proj run on this rank's tokens and
 * everything between on every token of its heads (gdn_dims).
 */
static void gdn_fwd(struct hp_model *m, int l)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	const struct hp_model_par *pr = &m->par;
	struct hp_layer_act *a = &m->a.act[l];
	const struct hp_layer_w *w = &m->w.lw[l];
	struct gdn_dims g = gdn_dims(m);
	long N = g.N, Nl = g.Nl;
	int C = g.C;
	size_t f = sizeof(float), n = (size_t)N, nl = (size_t)Nl;
	float *xq = a->xc, *xk = xq + n * g.Kd, *xv = xk + n * g.Kd;
	float *qr = m->a.gdn_w, *kr = qr + n * g.Kd, *pba = kr + n * g.Kd, *pj = pba + 2 * n * g.Hv;
	/* q, k and v: the conv's input blocks, its outputs, their widths (the
	 * core's, and the projections') */
	float *xin[3] = { xq, xk, xv }, *xout[3] = { qr, kr, a->vv };
	int wd[3] = { g.Kd, g.Kd, g.Vd }, twd[3] = { g.tKd, g.tKd, g.tVd };

	if (s->lin_split) {
		for (int p = 0; p < 3; p++)
			bk->linear_fwd(bk, xin[p], a->xn1, w->wqkv + qkv_row(&g, p, g.t0) * C, NULL, Nl, C, twd[p]);
		bk->linear_fwd(bk, a->z, a->xn1, w->wz + (size_t)g.th0 * g.Dv * C, NULL, Nl, C, g.tVd);
		bk->linear_fwd(bk, a->gb, a->xn1, w->wb + (size_t)g.th0 * C, NULL, Nl, C, g.tHv);
		bk->linear_fwd(bk, a->ga, a->xn1, w->wa + (size_t)g.th0 * C, NULL, Nl, C, g.tHv);
	} else {
		int rv = g.r * g.Dv;

		bk->linear_fwd(bk, pj, a->xn1, w->wqkvz + (size_t)g.t0 * g.pw * C, NULL, Nl, C, g.P);
		bk->linear_fwd(bk, pba, a->xn1, w->wba + (size_t)g.th0 * 2 * C, NULL, Nl, C, 2 * g.tHv);
		size_t rows = nl * g.tHk;   /* (token, key head) pairs: one copy each part */

		bk->copy2d(bk, xq, g.Dk * f, pj, g.pw * f, g.Dk * f, rows);
		bk->copy2d(bk, xk, g.Dk * f, pj + g.Dk, g.pw * f, g.Dk * f, rows);
		bk->copy2d(bk, xv, rv * f, pj + 2 * g.Dk, g.pw * f, rv * f, rows);
		bk->copy2d(bk, a->z, rv * f, pj + 2 * g.Dk + rv, g.pw * f, rv * f, rows);
		bk->copy2d(bk, a->gb, g.r * f, pba, 2 * g.r * f, g.r * f, rows);
		bk->copy2d(bk, a->ga, g.r * f, pba + g.r, 2 * g.r * f, g.r * f, rows);
	}
	if (g.cp > 1)
		gdn_ulysses(m, &g, a->xc, a->z, a->gb, a->ga, 0);
	for (int p = 0; p < 3; p++)
		bk->conv1d_silu_fwd(bk, xout[p], xin[p], w->conv + qkv_row(&g, p, g.j0) * g.K, m->a.seg, m->a.B, g.T,
				    wd[p], g.K);
	bk->l2norm_fwd(bk, a->qn, a->rq, qr, N * g.Hk, g.Dk);
	bk->l2norm_fwd(bk, a->kn, a->rk, kr, N * g.Hk, g.Dk);
	bk->gdn_gates_fwd(bk, a->beta, a->gl, a->gb, a->ga, w->A_log + g.h0, w->dt_bias + g.h0, N, g.Hv);
	bk->gdr_fwd(bk, a->o, a->saved, a->qn, a->kn, a->vv, a->gl, a->beta, m->a.seg, gdr_ws(m), m->a.B, g.T, g.Hv,
		    g.Hk, g.Dk, g.Dv, g.scale);
	bk->rmsnorm_gated_fwd(bk, a->y, a->rstd_o, a->o, a->z, w->lin_norm, N * g.Hv, g.Dv, (float)s->rms_eps);
	if (g.cp > 1)
		gdn_ulysses_y(m, &g, a->y, 1);
	if (pr->tp == 1) {
		bk->linear_fwd(bk, a->x_mid, a->y, w->wout, NULL, Nl, g.tVd, C);
		return;
	}
	/* row-parallel: this rank's columns of out_proj (copied out), partial sums reduced */
	float *ws = m->a.gdn_w, *o = pr->sp ? m->a.dxn : a->x_mid;

	bk->copy2d(bk, ws, g.tVd * f, w->wout + (size_t)g.th0 * g.Dv, g.gVd * f, g.tVd * f, (size_t)C);
	bk->linear_fwd(bk, o, a->y, ws, NULL, Nl, g.tVd, C);
	mixer_reduce(m, l, o, a->x_mid);
}

/* Its backward from dy [N, C], the gradient of x_mid's addend (gathered
 * over tp with sequence parallelism): dxn written (this rank's heads'
 * share over tp), the weights' gradients added. */
static void gdn_bwd(struct hp_model *m, int l, const float *dy)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	const struct hp_layer_w *w = &m->w.lw[l];
	struct hp_layer_w *gw = &m->w.lg[l];
	struct gdn_dims g = gdn_dims(m);
	long N = g.N, Nl = g.Nl;
	int C = g.C, Kd = g.Kd, Vd = g.Vd, Hv = g.Hv, tVd = g.tVd, tHv = g.tHv;
	size_t f = sizeof(float), n = (size_t)N, nl = (size_t)Nl;
	float *dY = m->a.gdn_w, *dO = dY + n * Vd, *dZ = dO + n * Vd, *dv = dZ + n * Vd, *dq = dv + n * Vd;
	float *dk = dq + n * Kd, *dqr = dk + n * Kd, *dkr = dqr + n * Kd, *dg = dkr + n * Kd, *dbeta = dg + n * Hv;
	float *db = dbeta + n * Hv, *da = db + n * Hv, *dxq = da + n * Hv, *dxk = dxq + n * Kd, *dxv = dxk + n * Kd;
	/* then what only qwen3_next's layout (dpba, dp) and tp (ws, dws) use */
	float *dpba = dxv + n * Vd, *ws = dpba + (s->lin_split ? 0 : 2 * n * Hv);
	float *dws = ws + (m->par.tp > 1 ? (size_t)C * tVd : 0), *dp = dws + (m->par.tp > 1 ? (size_t)C * tVd : 0);

	if (m->par.tp == 1) {
		bk->linear_bwd(bk, dY, gw->wout, NULL, dy, a->y, w->wout, Nl, tVd, C, 0);
	} else {   /* this rank's columns of out_proj and of its gradient */
		size_t col = (size_t)g.th0 * g.Dv;

		bk->copy2d(bk, ws, tVd * f, w->wout + col, g.gVd * f, tVd * f, (size_t)C);
		bk->copy2d(bk, dws, tVd * f, gw->wout + col, g.gVd * f, tVd * f, (size_t)C);
		bk->linear_bwd(bk, dY, dws, NULL, dy, a->y, ws, Nl, tVd, C, 0);
		bk->copy2d(bk, gw->wout + col, g.gVd * f, dws, tVd * f, tVd * f, (size_t)C);
	}
	if (g.cp > 1)
		gdn_ulysses_y(m, &g, dY, 0);
	bk->rmsnorm_gated_bwd(bk, dO, dZ, gw->lin_norm, dY, a->o, a->z, w->lin_norm, a->rstd_o, N * Hv, g.Dv);
	bk->gdr_bwd(bk, dq, dk, dv, dg, dbeta, dO, a->saved, a->qn, a->kn, a->vv, a->gl, a->beta, m->a.seg,
		    gdr_ws(m), m->a.B, g.T, Hv, g.Hk, g.Dk, g.Dv, g.scale);
	bk->gdn_gates_bwd(bk, db, da, gw->A_log + g.h0, gw->dt_bias + g.h0, dbeta, dg, a->gb, a->ga, w->A_log + g.h0,
			  w->dt_bias + g.h0, N, Hv);
	bk->l2norm_bwd(bk, dqr, dq, a->qn, a->rq, N * g.Hk, g.Dk);
	bk->l2norm_bwd(bk, dkr, dk, a->kn, a->rk, N * g.Hk, g.Dk);
	/* q, k and v: the conv's input blocks, its output gradients, its input gradients, their widths */
	const float *xin[3] = { a->xc, a->xc + n * Kd, a->xc + 2 * n * Kd }, *dout[3] = { dqr, dkr, dv };
	float *dxin[3] = { dxq, dxk, dxv };
	int wd[3] = { Kd, Kd, Vd }, twd[3] = { g.tKd, g.tKd, tVd };

	for (int p = 0; p < 3; p++)
		bk->conv1d_silu_bwd(bk, dxin[p], gw->conv + qkv_row(&g, p, g.j0) * g.K, dout[p], xin[p],
				    w->conv + qkv_row(&g, p, g.j0) * g.K, m->a.seg, m->a.B, g.T, wd[p], g.K);
	if (g.cp > 1)   /* dxq, dxk, dxv are one block, as xc */
		gdn_ulysses(m, &g, dxq, dZ, db, da, 1);
	if (s->lin_split) {
		for (int p = 0; p < 3; p++)
			bk->linear_bwd(bk, m->a.dxn, gw->wqkv + qkv_row(&g, p, g.t0) * C, NULL, dxin[p], a->xn1,
				       w->wqkv + qkv_row(&g, p, g.t0) * C, Nl, C, twd[p], p > 0);
		bk->linear_bwd(bk, m->a.dxn, gw->wz + (size_t)g.th0 * g.Dv * C, NULL, dZ, a->xn1,
			       w->wz + (size_t)g.th0 * g.Dv * C, Nl, C, tVd, 1);
		bk->linear_bwd(bk, m->a.dxn, gw->wb + (size_t)g.th0 * C, NULL, db, a->xn1, w->wb + (size_t)g.th0 * C, Nl,
			       C, tHv, 1);
		bk->linear_bwd(bk, m->a.dxn, gw->wa + (size_t)g.th0 * C, NULL, da, a->xn1, w->wa + (size_t)g.th0 * C, Nl,
			       C, tHv, 1);
		return;
	}
	int rv = g.r * g.Dv;
	size_t rows = nl * g.tHk;   /* back to in_proj_qkvz's and in_proj_ba's layouts, a copy each part */

	bk->copy2d(bk, dp, g.pw * f, dxq, g.Dk * f, g.Dk * f, rows);
	bk->copy2d(bk, dp + g.Dk, g.pw * f, dxk, g.Dk * f, g.Dk * f, rows);
	bk->copy2d(bk, dp + 2 * g.Dk, g.pw * f, dxv, rv * f, rv * f, rows);
	bk->copy2d(bk, dp + 2 * g.Dk + rv, g.pw * f, dZ, rv * f, rv * f, rows);
	bk->copy2d(bk, dpba, 2 * g.r * f, db, g.r * f, g.r * f, rows);
	bk->copy2d(bk, dpba + g.r, 2 * g.r * f, da, g.r * f, g.r * f, rows);
	bk->linear_bwd(bk, m->a.dxn, gw->wqkvz + (size_t)g.t0 * g.pw * C, NULL, dp, a->xn1,
		       w->wqkvz + (size_t)g.t0 * g.pw * C, Nl, C, g.P, 0);
	bk->linear_bwd(bk, m->a.dxn, gw->wba + (size_t)g.th0 * 2 * C, NULL, dpba, a->xn1, w->wba + (size_t)g.th0 * 2 * C,
		       Nl, C, 2 * tHv, 1);
}

static int layer_fwd(struct hp_model *m, int l, const float *ra, const float *rb, int re)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	const struct hp_model_par *pr = &m->par;
	long N = (long)m->a.B * m->a.T, Ns = m->lay.Ns;
	int C = s->hidden, I = s->intermediate, D = s->head_dim;
	int QD = s->n_heads * D, KD = s->n_kv_heads * D, tp = pr->tp;
	int OD = s->mla ? s->n_heads * s->v_head : QD;   /* o_proj's input */
	float eps = (float)s->rms_eps;
	struct hp_layer_act *a = &m->a.act[l];
	const struct hp_layer_w *w = &m->w.lw[l];
	float *next = l + 1 < pr->l1 ? m->a.act[l + 1].x_in : m->a.x_final;
	/* with sequence parallelism a norm's output is this rank's rows, then gathered */
	float *sp_out = re ? m->a.dxn : m->a.dx, *nout, *o;

#define PROBE(...) (!re && probe(m, __VA_ARGS__))
	zc_fill(m, l);
	nout = pr->sp ? sp_out : a->xn1;
	norm_in(m, m->k.fused_in[l], a->x_in, nout, a->rstd1, ra, rb, zcw(m, l, 0, w->in_norm), Ns, C, eps);
	if (l == 0 && m->fault == HP_FAULT_SP_SKIP_GATHER && pr->sp) {
		/* each rank's own rows only, the others' left out */
		bk->zero(bk, a->xn1, sizeof(float) * (size_t)N * C);
		bk->copy(bk, a->xn1 + (size_t)pr->tp_rank * Ns * C, nout, sizeof(float) * (size_t)Ns * C);
	} else {
		tp_gather(m, a->xn1, nout);
	}
	if (PROBE("model.layers.%d.input_layernorm", l, a->xn1, N, C, 0, 0))
		return -2;
	if (s->linear[l]) {
		gdn_fwd(m, l);
		if (PROBE("model.layers.%d.linear_attn", l, a->x_mid, Ns, C, pr->sp, 0))
			return -2;
		goto mlp;
	}
	if (s->mla) {
		mla_fwd(m, l);
	} else if (s->qk_norm) {
		/* Qwen3: RMSNorm over head_dim, per head, before RoPE; gated
		 * attention's q_proj gives each head [q | gate] */
		if (s->attn_gate) {
			size_t f = sizeof(float), nh = (size_t)N * s->n_heads;

			bk->linear_fwd(bk, m->a.gdn_w, a->xn1, w->wq, w->bq, N, C, 2 * QD);
			bk->copy2d(bk, a->q_raw, D * f, m->a.gdn_w, 2 * D * f, D * f, nh);
			bk->copy2d(bk, a->gate, D * f, m->a.gdn_w + D, 2 * D * f, D * f, nh);
		} else {
			bk->linear_fwd(bk, a->q_raw, a->xn1, w->wq, w->bq, N, C, QD);
		}
		bk->linear_fwd(bk, a->k_raw, a->xn1, w->wk, w->bk, N, C, KD);
		bk->rmsnorm_fwd(bk, a->q, a->rstd_q, a->q_raw, zcw(m, l, 2, w->q_norm), N * s->n_heads, D, eps);
		bk->rmsnorm_fwd(bk, a->k, a->rstd_k, a->k_raw, zcw(m, l, 3, w->k_norm), N * s->n_kv_heads, D, eps);
	} else {
		bk->linear_fwd(bk, a->q, a->xn1, w->wq, w->bq, N, C, QD);
		bk->linear_fwd(bk, a->k, a->xn1, w->wk, w->bk, N, C, KD);
	}
	if (!s->mla) {
		bk->linear_fwd(bk, a->v, a->xn1, w->wv, w->bv, N, C, KD);
		int rd = hp_model_spec_rope_dim(s);   /* partial RoPE: the first rd of each head */

		bk->rope_fwd(bk, a->q, m->a.pos.d, m->a.cos_t, m->a.sin_t, N, s->n_heads, D, rd, 0);
		bk->rope_fwd(bk, a->k, m->a.pos.d, m->a.cos_t, m->a.sin_t, N, s->n_kv_heads, D, rd, 0);
	}
	attention_fwd(m, l);
	const float *ain = s->mla ? mla_out(m, l) : a->att;
	if (s->attn_gate) {   /* transformers: attn_output * sigmoid(gate) */
		bk->sigmoid_gate_fwd(bk, a->att_g, a->att, a->gate, N * QD);
		ain = a->att_g;
	}
	if (tp > 1) {
		/* row-parallel: partial sums, reduced, then the bias once */
		o = pr->sp ? m->a.dxn : a->x_mid;
		bk->linear_fwd(bk, o, ain, w->wo, NULL, N, OD, C);
		mixer_reduce(m, l, o, a->x_mid);
		if (w->bo)
			bk->add_bias(bk, a->x_mid, w->bo, Ns, C);
	} else {
		bk->linear_fwd(bk, a->x_mid, ain, w->wo, w->bo, N, OD, C);
	}
	if (PROBE("model.layers.%d.self_attn", l, a->x_mid, Ns, C, pr->sp, 0))
		return -2;
mlp:
	nout = pr->sp && !w->moe ? sp_out : a->xn2;
	norm_in(m, m->k.fused_post[l], a->x_mid, nout, a->rstd2, a->x_in, a->x_mid, zcw(m, l, 1, w->post_norm), Ns, C,
		eps);
	if (w->moe) {
		if (PROBE("model.layers.%d.post_attention_layernorm", l, a->xn2, Ns, C, pr->sp, 0))
			return -2;
		moe_forward(m, l, a->moe_out, re);
		if (w->wsg)
			shared_fwd(m, l, a->moe_out, re);
		if (PROBE("model.layers.%d.mlp", l, a->moe_out, Ns, C, pr->sp, 0))
			return -2;
		return 0;
	}
	tp_gather(m, a->xn2, nout);
	if (PROBE("model.layers.%d.post_attention_layernorm", l, a->xn2, N, C, 0, 0))
		return -2;
	bk->linear_fwd(bk, a->g, a->xn2, w->wg, NULL, N, C, I);
	bk->linear_fwd(bk, a->u, a->xn2, w->wu, NULL, N, C, I);
	bk->swiglu_fwd(bk, a->h, a->g, a->u, N * I);
	if (re)
		return 0;
	o = pr->sp ? m->a.dxn : next;
	bk->linear_fwd(bk, o, a->h, w->wd, NULL, N, I, C);
	tp_reduce(m, o, next);
	if (PROBE("model.layers.%d.mlp", l, next, Ns, C, pr->sp, 0))
		return -2;
	return 0;
#undef PROBE
}

/*
 * Sliding-window attention: transformers keeps key j for query i when
 * i - W < j <= i, within i's document.  The kernels take each query's
 * first visible key (seg, non-decreasing along a row), so a windowed
 * layer reads max(seg, position - W + 1), still non-decreasing: the same
 * kernels, masks and tile skipping serve it.  Laid out as the kernels read
 * seg: the chunk's queries at their row positions (cp all-gather), the
 * whole rows (ulysses), or the rows.
 */
static void window_lows(struct hp_model *m, const int32_t *seg)
{
	int W = m->spec.sliding_window, whole = cp_ul(m), cp = m->par.cp > 1 && !whole;
	long T = whole ? m->lay.S : m->a.T, n = (long)m->a.B * T;

	for (long i = 0; i < n; i++) {
		long p = (cp ? (long)m->par.cp_rank * m->a.T : 0) + i % T;
		long lo = cp ? (seg ? m->a.segs.h[i] : 0) : (seg ? seg[i] : 0);

		m->a.segw.h[i] = (int32_t)(lo > p - W + 1 ? lo : p - W + 1);
	}
}

/*
 * The micro-batch as the kernels read it: this rank's chunk of every row
 * (cp), RoPE positions counted from each document's start, on the
 * backend.  On the CPU at cp 1 the caller's arrays are read in place.
 */
static int stage_batch(struct hp_model *m, const int32_t *ids, const int32_t *targets, const int32_t *seg)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_par *pr = &m->par;
	long N = (long)m->a.B * m->a.T;
	int32_t *pos = m->a.pos.h;
	int rc;

	m->a.seg = seg;
	if (pr->cp > 1) {
		/* this rank's chunk of every row; positions stay those of the whole row */
		for (long n = 0; n < N; n++) {
			long b = n / m->a.T, at = b * m->lay.S + (long)pr->cp_rank * m->a.T + n % m->a.T;

			m->a.ids.h[n] = ids[at];
			m->a.tgt.h[n] = targets ? targets[at] : HP_IGNORE_INDEX;
			m->a.segs.h[n] = seg ? seg[at] : 0;
			pos[n] = (int32_t)(at - b * m->lay.S) - m->a.segs.h[n];
		}
		if (cp_ag(m))
			m->a.seg = seg ? m->a.segs.h : NULL;
	} else {
		for (long n = 0; n < N; n++)
			pos[n] = (int32_t)(n % m->a.T) - (seg ? seg[n] : 0);
		m->a.ids.h = (int32_t *)ids;
		m->a.tgt.h = (int32_t *)targets;
		if (!bk->device) {
			m->a.ids.d = m->a.ids.h;
			m->a.tgt.d = m->a.tgt.h;
		}
	}
	if (windowed(m))
		window_lows(m, seg);
	if (!bk->device)
		return 0;
	/* the attention's segments: the chunk's (cp all-gather), else the whole rows' */
	struct hp_i32 sg = { (int32_t *)m->a.seg, m->a.segs.d };
	size_t ns = cp_ul(m) ? (size_t)m->a.B * m->lay.S : (size_t)N;
	if ((rc = bk->put(bk, &m->a.pos, (size_t)N, &m->err)) || (rc = bk->put(bk, &m->a.ids, (size_t)N, &m->err)) ||
	    (m->a.tgt.h && (rc = bk->put(bk, &m->a.tgt, (size_t)N, &m->err))) ||
	    (m->a.seg && (rc = bk->put(bk, &sg, ns, &m->err))) ||
	    (windowed(m) && (rc = bk->put(bk, &m->a.segw, ns, &m->err)))) {
		par_rc(m, rc);
		return -2;
	}
	m->a.seg = m->a.seg ? m->a.segs.d : NULL;
	return 0;
}

/* The forward, its cross-entropy sum added to *ls (one of the step's
 * sums): 0, -1 for a target outside the vocabulary, -2 for a failure kept
 * in m->par_rc and m->err. */
static int forward(struct hp_model *m, const int32_t *ids, const int32_t *targets, const int32_t *seg,
		   double grad_scale, double *ls, long *count)
{
	struct hp_backend *bk = m->bk;
	const float *ra = NULL, *rb = NULL;
	const struct hp_model_spec *s = &m->spec;
	const struct hp_model_par *pr = &m->par;
	long N = (long)m->a.B * m->a.T, Ns = m->lay.Ns;
	int C = s->hidden, V = s->vocab, tp = pr->tp;
	float eps = (float)s->rms_eps;
	/* with sequence parallelism a norm's output is this rank's rows, then gathered */
	float *nout;

	m->par_rc = 0;
	hp_err_clear(&m->err);
	if (stage_batch(m, ids, targets, seg))
		return -2;
	targets = m->a.tgt.h;
	/* a later pipeline stage starts from what its caller received */
	if (first_stage(m) && tp > 1) {
		bk->embed_fwd(bk, pr->sp ? m->a.dxn : m->a.act[0].x_in, &m->a.ids, m->w.embed, N, C, m->lay.v0, V);
		tp_reduce(m, pr->sp ? m->a.dxn : m->a.act[0].x_in, m->a.act[0].x_in);
	} else if (first_stage(m)) {
		bk->embed_fwd(bk, m->a.act[0].x_in, &m->a.ids, m->w.embed, N, C, 0, V);
	}
	if (first_stage(m) && probe(m, "model.embed_tokens", 0, m->a.act[0].x_in, Ns, C, pr->sp, 0))
		return -2;
	/* the sums this forward starts (its loss where it has its own, the
	 * load-balancing loss's), and the step's when it is the step's first */
	size_t z0 = m->st_fresh ? 0 : ls == m->a.st + HP_ST_FWD ? HP_ST_FWD : HP_ST_N;
	size_t nfp = m->n_moe ? 2 * (size_t)s->n_experts + 1 : 0;
	/* a later pipeline stage's router statistics start from its caller's */
	if (m->a.fp == m->a.st + HP_ST_N && first_stage(m)) {
		if (HP_ST_N + nfp > z0)
			bk->zero(bk, m->a.st + z0, (HP_ST_N + nfp - z0) * sizeof(double));
	} else {
		if (HP_ST_N > z0)
			bk->zero(bk, m->a.st + z0, (HP_ST_N - z0) * sizeof(double));
		if (nfp && first_stage(m))
			bk->zero(bk, m->a.fp, nfp * sizeof(double));
	}
	if (m->st_fresh && m->a.route_cnt)
		bk->zero(bk, m->a.route_cnt, (size_t)s->n_layers * 2 * s->n_experts * sizeof(double));
	m->st_fresh = 0;
	for (int l = pr->l0; l < pr->l1; l++) {
		struct hp_layer_act *a = &m->a.act[l];
		float *next = l + 1 < pr->l1 ? m->a.act[l + 1].x_in : m->a.x_final;
		int rc;

		if (hook(m, l, HP_HOOK_PRE_FORWARD))
			return -2;
		if ((rc = layer_fwd(m, l, ra, rb, 0)))
			return rc;
		/* the residual add x_mid + mlp_out is owed to the next norm's input */
		ra = a->x_mid;
		rb = m->w.lw[l].moe ? a->moe_out : next;
		if (m->k.ckpt[l] == HP_ACT_CKPT_FULL) {
			/* unless the layer's buffers are shared: the next layer's
			 * would overwrite them, so the add is paid now (the same
			 * float sum the norm would make) */
			bk->add(bk, next, ra, rb, Ns * C);
			ra = rb = NULL;
		}
		if (m->w.lw[l].moe && s->output_router_logits)
			moe_aux_add(m, l);
		if (hook(m, l, HP_HOOK_POST_FORWARD))
			return -2;
	}
	if (m->n_moe && s->output_router_logits && last_stage(m))
		moe_aux(m);
	if (!last_stage(m)) {
		/* the stage's output: the residual add owed to the next norm, paid
		 * now (the float sum that norm would make) */
		if (ra)
			bk->add(bk, m->a.x_final, ra, rb, Ns * C);
		return m->par_rc ? -2 : 0;
	}
	nout = pr->sp ? m->a.dx : m->a.xf;
	zc_fill(m, s->n_layers);
	norm_in(m, m->k.fused_final, m->a.x_final, nout, m->a.rstd_f, ra, rb, zcw(m, s->n_layers, 0, m->w.final_norm),
		Ns, C, eps);
	tp_gather(m, m->a.xf, nout);
	if (probe(m, "model.norm", 0, m->a.xf, N, C, 0, 0))
		return -2;
	if (tp > 1) {
		bk->linear_fwd(bk, m->a.logits, m->a.xf, m->w.lm_head, NULL, N, C, V);
		if (probe(m, "lm_head", 0, m->a.logits, N, V, 0, 1))
			return -2;
		if (targets) {
			int rc = vp_loss(m, ls, count);
			if (rc)
				return rc;
		}
		return m->par_rc ? -2 : 0;
	}
	if (chunked(m)) {
		long ch = m->k.ce_chunk;

		*count = 0;
		for (long c0 = 0; targets && c0 < N; c0 += ch) {
			long n = N - c0 < ch ? N - c0 : ch, cnt;
			struct hp_i32 tg = { m->a.tgt.h + c0, m->a.tgt.d + c0 };

			bk->linear_fwd(bk, m->a.logits, m->a.xf + c0 * C, m->w.lm_head, NULL, n, C, V);
			if (bk->ce_fwd(bk, ls, &cnt, m->a.logits, &tg, n, V))
				return -1;
			*count += cnt;
			if (grad_scale > 0) {
				/* the scale is known: the head's gradients now, no second pass */
				bk->ce_bwd(bk, m->a.logits, m->a.logits, tg.d, n, V, (float)grad_scale);
				bk->linear_bwd(bk, m->a.dxn + c0 * C, m->w.d_lm_head, NULL, m->a.logits, m->a.xf + c0 * C,
					       m->w.lm_head, n, C, V, 0);
			}
		}
		m->head_done = targets && grad_scale > 0;
		return m->par_rc ? -2 : 0;
	}
	bk->linear_fwd(bk, m->a.logits, m->a.xf, m->w.lm_head, NULL, N, C, V);
	if (probe(m, "lm_head", 0, m->a.logits, N, V, 0, 0))
		return -2;
	if (targets && bk->ce_fwd(bk, ls, count, m->a.logits, &m->a.tgt, N, V))
		return -1;
	return m->par_rc ? -2 : 0;
}

static void norm_bwd(struct hp_model *m, int fused, float *dx, float *dw, const float *dy, const float *x,
		     const float *w, const float *rstd, long N, int C, int accumulate)
{
	struct hp_backend *bk = m->bk;

	if (fused)
		bk->rmsnorm_res_bwd(bk, dx, dw, dy, x, w, rstd, N, C, accumulate);
	else
		bk->rmsnorm_bwd(bk, dx, dw, dy, x, w, rstd, N, C, accumulate);
}

/* The gradient at a block's entry: this rank's rows of the residual's
 * gradient dx, gathered over tp with sequence parallelism. */
static const float *entry_grad(struct hp_model *m)
{
	if (!m->par.sp)
		return m->a.dx;
	tp_gather(m, m->lay.dfull, m->a.dx);
	return m->lay.dfull;
}

/* Backward of q, k, v's projections, norms and RoPE: dq, dk, dv -> dxn
 * (written) and the weights' gradients. */
static void qkv_bwd(struct hp_model *m, int l)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	struct hp_layer_act *a = &m->a.act[l];
	const struct hp_layer_w *w = &m->w.lw[l];
	struct hp_layer_w *g = &m->w.lg[l];
	long N = (long)m->a.B * m->a.T;
	int C = s->hidden, D = s->head_dim, QD = s->n_heads * D, KD = s->n_kv_heads * D;

	int rd = hp_model_spec_rope_dim(s);

	bk->rope_bwd(bk, m->a.dq, m->a.pos.d, m->a.cos_t, m->a.sin_t, N, s->n_heads, D, rd, 0);
	bk->rope_bwd(bk, m->a.dk, m->a.pos.d, m->a.cos_t, m->a.sin_t, N, s->n_kv_heads, D, rd, 0);
	const float *dqp = m->a.dq, *dkp = m->a.dk;
	if (s->qk_norm) {
		bk->rmsnorm_bwd(bk, m->a.dq2, g->q_norm, m->a.dq, a->q_raw, zcw(m, l, 2, w->q_norm), a->rstd_q,
				N * s->n_heads, D, 0);
		bk->rmsnorm_bwd(bk, m->a.dk2, g->k_norm, m->a.dk, a->k_raw, zcw(m, l, 3, w->k_norm), a->rstd_k,
				N * s->n_kv_heads, D, 0);
		dqp = m->a.dq2;
		dkp = m->a.dk2;
	}
	if (s->attn_gate) {   /* [dq | dgate] per head, as q_proj's output (dgate: the o_proj step's) */
		size_t f = sizeof(float), nh = (size_t)N * s->n_heads;
		float *dqg = m->a.gdn_w + 2 * (size_t)N * QD;

		bk->copy2d(bk, dqg, 2 * D * f, dqp, D * f, D * f, nh);
		bk->copy2d(bk, dqg + D, 2 * D * f, m->a.gdn_w + (size_t)N * QD, D * f, D * f, nh);
		bk->linear_bwd(bk, m->a.dxn, g->wq, g->bq, dqg, a->xn1, w->wq, N, C, 2 * QD, 0);
	} else {
		bk->linear_bwd(bk, m->a.dxn, g->wq, g->bq, dqp, a->xn1, w->wq, N, C, QD, 0);
	}
	bk->linear_bwd(bk, m->a.dxn, g->wk, g->bk, dkp, a->xn1, w->wk, N, C, KD, 1);
	bk->linear_bwd(bk, m->a.dxn, g->wv, g->bv, m->a.dv, a->xn1, w->wv, N, C, KD, 1);
}

/* The backward; a failure is kept in m->par_rc and m->err, and a hook's
 * stops it. */
static void backward(struct hp_model *m, const int32_t *ids, const int32_t *targets, double total_count,
		     double aux_weight)
{
	struct hp_backend *bk = m->bk;
	const struct hp_model_spec *s = &m->spec;
	const struct hp_model_par *pr = &m->par;
	long N = (long)m->a.B * m->a.T, Ns = m->lay.Ns;
	int C = s->hidden, I = s->intermediate, D = s->head_dim, V = s->vocab;
	int QD = s->n_heads * D, tp = pr->tp;
	int OD = s->mla ? s->n_heads * s->v_head : QD;   /* o_proj's input */
	float *dlogits = m->a.logits;   /* overwritten in place */
	const float *dy;
	/* d(coef * aux)/dP_e(token) = coef * E * F_e / n, n the MoE tokens of this forward */
	double aux_grad = m->n_moe && s->output_router_logits ?
		aux_weight * s->router_aux_loss_coef * s->n_experts / ((double)m->a.B * m->lay.S * m->n_moe) : 0;

	float scale = total_count > 0 ? (float)(1.0 / total_count) : 0.0f;

	/* the forward staged the batch (the caller passes the same one) */
	(void)ids;
	(void)targets;
	if (!last_stage(m)) {
		/* a pipeline stage's caller has put its output's gradient in dx */
	} else if (tp > 1) {
		bk->vp_ce_bwd(bk, dlogits, m->a.logits, m->lay.vp_st, m->lay.vp_mx, m->a.tgt.d, N, V, m->lay.v0, scale);
		bk->linear_bwd(bk, m->a.dxn, m->w.d_lm_head, NULL, dlogits, m->a.xf, m->w.lm_head, N, C, V, 0);
	} else if (chunked(m)) {
		/* the logits of each chunk again, never all of them at once (unless
		 * the forward already did the head's backward) */
		for (long c0 = 0; !m->head_done && c0 < N; c0 += m->k.ce_chunk) {
			long n = N - c0 < m->k.ce_chunk ? N - c0 : m->k.ce_chunk;

			bk->linear_fwd(bk, m->a.logits, m->a.xf + c0 * C, m->w.lm_head, NULL, n, C, V);
			bk->ce_bwd(bk, m->a.logits, m->a.logits, m->a.tgt.d + c0, n, V, scale);
			bk->linear_bwd(bk, m->a.dxn + c0 * C, m->w.d_lm_head, NULL, m->a.logits, m->a.xf + c0 * C,
				       m->w.lm_head, n, C, V, 0);
		}
	} else {
		bk->ce_bwd(bk, dlogits, m->a.logits, m->a.tgt.d, N, V, scale);
		bk->linear_bwd(bk, m->a.dxn, m->w.d_lm_head, NULL, dlogits, m->a.xf, m->w.lm_head, N, C, V, 0);
	}
	if (last_stage(m)) {
		dy = tp_reduce(m, m->a.dxn, m->lay.dred);
		norm_bwd(m, m->k.fused_final, m->a.dx, m->w.d_final_norm, dy, m->a.x_final,
			 zcw(m, s->n_layers, 0, m->w.final_norm),
			 m->a.rstd_f, Ns, C, 0);
	}
	for (int l = pr->l1 - 1; l >= pr->l0; l--) {
		struct hp_layer_act *a = &m->a.act[l];
		const struct hp_layer_w *w = &m->w.lw[l];
		struct hp_layer_w *g = &m->w.lg[l];

		if (hook(m, l, HP_HOOK_PRE_BACKWARD))
			return;
		/* checkpointed: the layer's forward again from its kept input */
		if (m->k.ckpt[l] == HP_ACT_CKPT_FULL)
			layer_fwd(m, l, NULL, NULL, 1);

		/* MLP: x_out = x_mid + mlp(xn2) */
		if (w->moe) {
			moe_backward(m, l, m->a.dx, m->a.dxn, aux_grad);
			if (w->wsg)
				shared_bwd(m, l, m->a.dx, m->a.dxn);
			dy = m->a.dxn;
		} else {
			const float *din = entry_grad(m);

			bk->linear_bwd(bk, m->a.dh, g->wd, NULL, din, a->h, w->wd, N, I, C, 0);
			bk->swiglu_bwd(bk, m->a.dg, m->a.du, m->a.dh, a->g, a->u, N * I);
			bk->linear_bwd(bk, m->a.dxn, g->wg, NULL, m->a.dg, a->xn2, w->wg, N, C, I, 0);
			bk->linear_bwd(bk, m->a.dxn, g->wu, NULL, m->a.du, a->xn2, w->wu, N, C, I, 1);
			dy = tp_reduce(m, m->a.dxn, m->lay.dred);
		}
		norm_bwd(m, m->k.fused_post[l], m->a.dx, g->post_norm, dy, a->x_mid, zcw(m, l, 1, w->post_norm), a->rstd2,
			 Ns, C, 1);
		/* attention: x_mid = x_in + o_proj(attn(q, k, v)) */
		if (s->linear[l]) {
			gdn_bwd(m, l, entry_grad(m));
			goto in_norm;
		}
		if (s->mla && a->att_v) {
			bk->linear_bwd(bk, m->a.mla_w, g->wo, tp > 1 ? NULL : g->bo, entry_grad(m), a->att_v, w->wo, N, OD,
				       C, 0);
			mla_datt(m, m->a.mla_w);
		} else if (s->attn_gate) {   /* o_proj's input att * sigmoid(gate): datt, and the gate's gradient kept */
			float *dag = m->a.gdn_w, *dgate = dag + (size_t)N * QD;

			bk->linear_bwd(bk, dag, g->wo, tp > 1 ? NULL : g->bo, entry_grad(m), a->att_g, w->wo, N, OD, C, 0);
			bk->sigmoid_gate_bwd(bk, m->a.datt, dgate, dag, a->att, a->gate, (long)N * QD);
		} else {
			bk->linear_bwd(bk, m->a.datt, g->wo, tp > 1 ? NULL : g->bo, entry_grad(m), a->att, w->wo, N, OD, C, 0);
		}
		if (tp > 1 && g->bo)   /* the bias was added once, after the sum */
			bk->colsum(bk, g->bo, m->a.dx, Ns, C);
		/* selective: the probabilities again, from the kept q, k, v (the
		 * output it rewrites is the same bits, read only by the backward) */
		if (m->k.ckpt[l] == HP_ACT_CKPT_SELECTIVE && !m->k.flash[l])
			attention_core(m, l);
		attention_bwd(m, l);
		if (s->mla)
			mla_bwd(m, l);
		else
			qkv_bwd(m, l);
in_norm:
		dy = tp_reduce(m, m->a.dxn, m->lay.dred);
		norm_bwd(m, m->k.fused_in[l], m->a.dx, g->in_norm, dy, a->x_in, zcw(m, l, 0, w->in_norm), a->rstd1, Ns, C, 1);
		if (hook(m, l, HP_HOOK_POST_BACKWARD))
			return;
	}
	if (!first_stage(m))
		return;   /* dx: the gradient of the stage's input, for its caller to send */
	par_rc(m, bk->embed_bwd(bk, m->w.d_embed, tp > 1 ? entry_grad(m) : m->a.dx, &m->a.ids, N, C, tp > 1 ? m->lay.v0 : 0,
				V, m->spec.pad_token_id, &m->err));
}

/* A pass's failure, as its caller sees it. */
static int pass_failed(struct hp_model *m, struct hp_err *e)
{
	return hp_err_set(e, m->par_rc ? m->par_rc : HP_EINVAL, "%s",
			  m->err.msg[0] ? m->err.msg : "a collective failed");
}

/* The router's choices out of range counted in the slot's int32. */
static int stats_bad(const struct hp_model *m, double slot, struct hp_err *e)
{
	int32_t bad;

	memcpy(&bad, &slot, sizeof(bad));
	return bad ? hp_err_set(e, HP_ENUM, "the router chose %d experts outside [0, %d) (NaN logits?)", bad,
				m->spec.n_experts) : 0;
}

int hp_model_forward(struct hp_model *m, const int32_t *ids, const int32_t *targets,
		     const int32_t *seg, double grad_scale, double *loss_sum, long *count, struct hp_err *e)
{
	double st[HP_ST_FWD - HP_ST_BAD + 1];   /* from the router's count to the loss */
	/* the step's sum takes a loss made in one call (the same bits as
	 * adding its total); chunks are summed apart first, as on the host */
	int direct = !loss_sum && !(chunked(m) && m->par.tp == 1);
	int rc = forward(m, ids, targets, seg, grad_scale, m->a.st + (direct ? HP_ST_LOSS : HP_ST_FWD), count);

	if (rc == -1)
		return hp_err_set(e, HP_EINVAL, "a target id is outside the vocabulary of %d", m->spec.vocab);
	if (rc)
		return pass_failed(m, e);
	if (!loss_sum) {   /* the step's: no wait */
		if (!direct)
			m->bk->add_f64(m->bk, m->a.st + HP_ST_LOSS, m->a.st + HP_ST_FWD, 1);
		return 0;
	}
	if ((rc = m->bk->download(m->bk, st, m->a.st + HP_ST_BAD, sizeof(st), e)) || (rc = stats_bad(m, st[0], e)))
		return rc;
	*loss_sum = st[HP_ST_FWD - HP_ST_BAD];
	return 0;
}

void hp_model_stats_zero(struct hp_model *m)
{
	m->st_fresh = 1;
}

int hp_model_route_loads(struct hp_model *m, double *out, struct hp_err *e)
{
	int L = m->spec.n_layers, E = m->spec.n_experts;
	double *all;
	int rc;

	if (!m->a.route_cnt)
		return hp_err_set(e, HP_EINVAL, "the model has no grouped router whose loads it counts");
	if (!(all = hp_malloc((size_t)L * 2 * E * sizeof(double))))
		return hp_err_set(e, HP_ENOMEM, "out of memory for the router's loads");
	rc = m->bk->download(m->bk, all, m->a.route_cnt, (size_t)L * 2 * E * sizeof(double), e);
	for (int l = 0; !rc && l < L; l++)
		for (int x = 0; x < E; x++)
			out[(size_t)l * E + x] = m->w.lw[l].moe && holds_layer(&m->par, l) ? all[(size_t)l * 2 * E + x] : 0;
	hp_free(all);
	return rc;
}

int hp_model_stats(struct hp_model *m, double *out, struct hp_err *e)
{
	int rc = m->bk->download(m->bk, out, m->a.st, HP_ST_N * sizeof(double), e);

	return rc ? rc : stats_bad(m, out[HP_ST_BAD], e);
}

double *hp_model_stat(struct hp_model *m, enum hp_model_stat i)
{
	return m->a.st + i;
}

int hp_model_backward(struct hp_model *m, const int32_t *ids, const int32_t *targets, double total_count,
		      double aux_weight, struct hp_err *e)
{
	backward(m, ids, targets, total_count, aux_weight);
	return m->par_rc ? pass_failed(m, e) : 0;
}
