/*
 * planest.c - what a rank of a plan holds and sends per step.
 *
 * The figures follow from the plan alone, by the rules written in
 * hp-plan(5), "ESTIMATES"; hp-train's allocator and its byte counters
 * follow the same rules, so a run can be checked against its plan.
 * Parameter, gradient and optimizer bytes are exact sums over the local
 * pieces; activation bytes mirror lib/model.c's activation arena at the
 * rank's local sizes (t/unit/test-plan.c holds them equal for one rank);
 * traffic is counted as the bytes of the send buffer a rank passes to each
 * collective, which does not depend on the algorithm the library picks.
 * Only two all-to-allv exchanges of expert parallelism depend on the
 * routing; they are given for even routing and flagged inexact.
 */
#include <stdio.h>

#include "alloc.h"
#include "cpu/ops.h"
#include "plan.h"

static const char *const coll_names[HP_NCOLL] = {
	"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "all_to_allv",
};

const char *hp_coll_name(enum hp_coll c)
{
	return (unsigned)c < HP_NCOLL ? coll_names[c] : "?";
}

const char *hp_comm_dim_name(int d)
{
	return d == HP_COMM_WORLD ? "world" : hp_dim_name((enum hp_dim)d);
}

/* --- parameters ------------------------------------------------------------- */

int hp_plan_owns(const struct hp_plan *p, const struct hp_plan_param *q, int rank)
{
	return q->mesh != HP_MESH_EXPERT || hp_plan_coord(p, HP_DIM_EP, rank) == q->ep_owner;
}

void hp_plan_piece(const struct hp_plan *p, const struct hp_plan_param *q, int rank,
		   struct hp_piece *pc)
{
	enum hp_dim sd = q->mesh == HP_MESH_EXPERT ? HP_DIM_EDP_SHARD : HP_DIM_DP_SHARD;
	int64_t k = p->size[sd], s = hp_plan_coord(p, sd, rank);

	pc->rows = q->shape[0];
	pc->cols = q->ndim > 1 ? q->shape[1] : 1;
	pc->col0 = 0;
	pc->row0 = 0;
	if (q->pl[HP_DIM_TP].kind == HP_PL_SHARD) {
		int64_t t = hp_plan_coord(p, HP_DIM_TP, rank);

		if (q->pl[HP_DIM_TP].dim == 0) {
			pc->rows /= p->tp;
			pc->row0 = t * pc->rows;
		} else {
			pc->cols /= p->tp;
			pc->col0 = t * pc->cols;
		}
	}
	/* FSDP: torch.chunk of dim 0, padded to the chunk for the collectives */
	pc->chunk = (pc->rows + k - 1) / k;
	pc->first = s * pc->chunk;
	pc->nrows = pc->rows - pc->first;
	if (pc->nrows > pc->chunk)
		pc->nrows = pc->chunk;
	if (pc->nrows < 0)
		pc->nrows = 0;
	pc->row0 += pc->first < pc->rows ? pc->first : pc->rows;
}

/* Whether q's gradient is a partial sum over tp: q/k norms see only the
 * rank's heads; with sequence parallel every tp-replicated weight sees
 * only the rank's tokens. */
int hp_plan_tp_partial(const struct hp_plan *p, const struct hp_plan_param *q)
{
	size_t n = strlen(q->name);

	if (p->tp <= 1 || q->mesh != HP_MESH_DENSE || q->pl[HP_DIM_TP].kind != HP_PL_REPLICATE)
		return 0;
	if (p->sequence_parallel)
		return 1;
	return (n > 14 && !strcmp(q->name + n - 14, ".q_norm.weight")) ||
	       (n > 14 && !strcmp(q->name + n - 14, ".k_norm.weight"));
}

/* --- activations ------------------------------------------------------------ */

#define A64(x) (((int64_t)(x) + 63) & ~(int64_t)63)

/* A rank's sizes (lib/model.c, set_par): N tokens of its chunk, Ns of them
 * in the residual stream, the tp-local heads, rows and vocabulary, R the
 * expert rows it can receive. */
struct dims {
	int64_t B, T, S, N, Ns, C, QD, KD, Hq, Hkv, I, V, E, K, Im, NK, R, El, D, ep;
	int cpag, cpul;
};

/* One layer's saved activations at local sizes (lib/model.c, take_acts). */
static int64_t layer_acts(const struct hp_plan *p, const struct dims *d, int l, int flash, int grouped,
			  int noP)
{
	const int64_t f = 4, i4 = 4;
	int64_t b = 0;

	b += A64(d->Ns * d->C * f) + A64(d->Ns * f) + A64(d->N * d->C * f);
	if (p->spec.qk_norm)
		b += A64(d->N * d->QD * f) + A64(d->N * d->KD * f) + A64(d->N * d->Hq * f) +
		     A64(d->N * d->Hkv * f);
	b += A64(d->N * d->QD * f) + 2 * A64(d->N * d->KD * f);
	if (!noP)
		b += A64(flash ? d->B * d->Hq * d->T * f : d->B * d->Hq * d->T * d->S * f);
	if (d->cpag)        /* the gathered K and V, kept for the backward */
		b += 2 * A64(d->B * d->S * d->KD * f);
	else if (d->cpul)   /* the output in the head split */
		b += A64(d->N * d->QD * f);
	b += A64(d->N * d->QD * f) + A64(d->Ns * d->C * f) + A64(d->Ns * f);
	if (hp_model_spec_layer_is_moe(&p->spec, l)) {
		b += A64(d->Ns * d->C * f);
		b += A64(d->Ns * d->E * f) + A64(d->NK * i4) + A64(d->NK * f) + 2 * A64(d->NK * i4) +
		     A64((d->E + 1) * i4) + (grouped && d->ep == 1 ? 0 : A64(d->R * d->C * f)) +
		     (grouped ? A64(d->R * 2 * d->Im * f) : 3 * A64(d->R * d->Im * f)) +
		     (grouped && d->ep == 1 ? 0 : A64(d->NK * d->C * f)) + A64(d->Ns * d->C * f);
		if (d->ep > 1)
			b += 2 * A64(d->ep * i4) + A64(d->R * i4) + A64((d->El + 1) * i4);
	} else {
		b += A64(d->N * d->C * f) + 3 * A64(d->N * d->I * f);
	}
	return b;
}

static int bound(const struct hp_plan *p, const char *module, const char *kernel)
{
	const struct hp_plan_module *m = hp_plan_find_module(p, module);

	return m && !strcmp(m->kernel, kernel);
}

int64_t hp_plan_act_bytes(const struct hp_plan *p)
{
	const struct hp_model_spec *s = &p->spec;
	const int64_t f = 4, i4 = 4;
	struct dims d;
	int64_t b = 0, maxl = 0, maxP = 0, nm = 0, ngrouped = 0, scratch = 1, N;
	char name[96];

	if (p->seq <= 0)
		return 0;
	d.B = p->micro;
	d.S = p->seq;
	d.T = p->seq / p->cp;
	d.N = d.B * d.T;
	d.Ns = p->sequence_parallel ? d.N / p->tp : d.N;
	d.C = s->hidden;
	d.D = s->head_dim;
	d.Hq = s->n_heads / p->tp;
	d.Hkv = s->n_kv_heads / p->tp;
	d.QD = d.Hq * d.D;
	d.KD = d.Hkv * d.D;
	d.I = s->intermediate / p->tp;
	d.V = s->vocab / p->tp;
	d.E = s->n_experts;
	d.K = s->top_k;
	d.Im = s->moe_intermediate;
	d.NK = d.Ns * d.K;
	d.ep = p->ep;
	d.El = d.E / p->ep;
	d.R = p->ep > 1 ? p->ep * d.Ns * (d.K < d.El ? d.K : d.El) : d.NK;
	d.cpag = p->cp > 1 && p->cp_mode != HP_CP_ULYSSES;
	d.cpul = p->cp > 1 && p->cp_mode == HP_CP_ULYSSES;
	for (int l = 0; l < s->n_layers; l++) {
		int flash;
		int64_t full, noP;

		int grouped;
		int64_t sc, Tq = d.cpul ? d.S : d.T, H = d.cpul ? d.Hq / p->cp : d.Hq;

		snprintf(name, sizeof(name), "model.layers.%d.self_attn", l);
		flash = bound(p, name, "flash_attention") || bound(p, name, "ulysses_attention");
		snprintf(name, sizeof(name), "model.layers.%d.mlp.experts", l);
		grouped = hp_model_spec_layer_is_moe(s, l) && bound(p, name, "grouped_experts");
		full = layer_acts(p, &d, l, flash, grouped, 0);
		noP = layer_acts(p, &d, l, flash, grouped, 1);
		nm += hp_model_spec_layer_is_moe(s, l);
		ngrouped += grouped;
		sc = d.cpag ? (int64_t)hp_cp_attention_scratch((int)d.S) :
		     flash ? (int64_t)hp_flash_attention_scratch((int)Tq, (int)H, (int)d.D) : Tq * Tq;
		if (sc > scratch)
			scratch = sc;
		/* lib/model.c, take_layer: a checkpointed layer's recomputed
		 * buffers live in one region the size of the largest */
		switch (p->ckpt_layer[l] ? p->act_ckpt : HP_ACT_CKPT_OFF) {
		case HP_ACT_CKPT_FULL:      /* keep the layer input; recompute the rest */
			b += A64(d.Ns * d.C * f);
			if (full - A64(d.Ns * d.C * f) > maxl)
				maxl = full - A64(d.Ns * d.C * f);
			break;
		case HP_ACT_CKPT_SELECTIVE: /* recompute the reference attention's probabilities */
			b += flash ? full : noP;
			if (!flash && full - noP > maxP)
				maxP = full - noP;
			break;
		default:
			b += full;
		}
	}
	b += maxl + maxP;
	/* the tail: final norm, LM head (vocab-parallel with tp: no chunks),
	 * RoPE tables, positions, the rank's chunk of the ids */
	N = bound(p, "lm_head", "chunked_ce") && p->ce_chunk < d.N && p->tp == 1 ? p->ce_chunk : d.N;
	b += A64(d.Ns * d.C * f) + A64(d.Ns * f) + A64(d.N * d.C * f) + A64(N * d.V * f);
	if (p->tp > 1)   /* the row statistics; without loss_parallel the gathered logits */
		b += (p->loss_parallel ? 0 : A64(d.N * s->vocab * f)) + A64(2 * d.N * f) + A64(4 * d.N * 8);
	b += 2 * A64(d.S * d.D / 2 * f) + A64(d.N * i4);
	if (p->cp > 1)
		b += 3 * A64(d.N * i4);
	/* backward scratch */
	b += 2 * A64(d.N * d.C * f) + A64(d.N * d.QD * f) + 2 * A64(d.N * d.KD * f) +
	     A64(d.N * d.QD * f) + 3 * A64(d.N * d.I * f) + A64(scratch * f);
	if (s->qk_norm)
		b += A64(d.N * d.QD * f) + A64(d.N * d.KD * f);
	if (p->tp > 1)
		b += A64(d.N * d.C * f) + A64(d.Ns * d.C * f);
	if (d.cpag)
		b += 2 * A64(2 * d.B * d.S * d.KD * f);
	else if (d.cpul)
		b += 2 * A64(d.N * (d.QD + 2 * d.KD) * f);
	if (nm)
		b += 2 * A64(d.R * d.C * f) + A64(d.R * (ngrouped ? 2 : 1) * d.Im * f) +
		     2 * A64(d.R * d.Im * f) + A64(d.Ns * d.E * f) + A64(d.NK * f) + A64(2 * d.E * i4) +
		     A64(2 * d.E * 8) + (ngrouped ? A64(d.R * d.Im * f) + (p->ep == 1 ? A64(d.NK * d.C * f) : 0) : 0) +
		     (p->ep > 1 ? 2 * A64(d.R * d.C * f) : 0);
	return b;
}

/* --- traffic ---------------------------------------------------------------- */

static void add(struct hp_rank_est *r, int dim, enum hp_coll c, int64_t calls, int64_t bytes,
		int exact)
{
	struct hp_comm_est *x = &r->comm[dim][c];

	if (calls <= 0 || (dim < HP_NDIM && r->size[dim] <= 1))
		return;
	x->calls += calls;
	x->bytes += calls * bytes;
	if (!exact)
		x->routed += calls * bytes;
}

static int esize(const char *dtype)
{
	return dtype && (!strcmp(dtype, "bfloat16") || !strcmp(dtype, "float16")) ? 2 : 4;
}

/* FSDP and replica traffic of each unit, and the tp sums of partial grads. */
static void param_traffic(const struct hp_plan *p, int rank, struct hp_rank_est *r)
{
	int64_t G = p->accum, ep = esize(p->param_dtype), er = esize(p->reduce_dtype), partial = 0;

	for (int u = 0; u < p->nunits; u++) {
		const struct hp_plan_unit *un = &p->units[u];
		int expert = un->mesh == HP_MESH_EXPERT, root = u == 0;
		enum hp_dim sd = expert ? HP_DIM_EDP_SHARD : HP_DIM_DP_SHARD;
		enum hp_dim rd = expert ? HP_DIM_EDP_REPLICATE : HP_DIM_DP_REPLICATE;
		int64_t padded = 0, k = p->size[sd];

		for (int i = 0; i < p->nparams; i++) {
			const struct hp_plan_param *q = &p->params[i];
			struct hp_piece pc;

			if (q->unit != u || !hp_plan_owns(p, q, rank))
				continue;
			hp_plan_piece(p, q, rank, &pc);
			padded += pc.chunk * pc.cols;
			if (hp_plan_tp_partial(p, q))
				partial += pc.chunk * pc.cols;
		}
		if (!padded)
			continue;
		add(r, sd, HP_COLL_ALL_GATHER, p->reshard_after_backward ? G : 1, padded * ep, 1);
		if (!root && p->reshard_after_forward)
			add(r, sd, HP_COLL_ALL_GATHER, G, padded * ep, 1);
		add(r, sd, HP_COLL_REDUCE_SCATTER, G, k * padded * er, 1);
		add(r, rd, HP_COLL_ALL_REDUCE, 1, padded * er, 1);
	}
	add(r, HP_DIM_TP, HP_COLL_ALL_REDUCE, partial ? 1 : 0, partial * er, 1);
}

/* Activation traffic of one micro-batch, times the micro-batches. */
static void act_traffic(const struct hp_plan *p, struct hp_rank_est *r)
{
	const struct hp_model_spec *s = &p->spec;
	int64_t G = p->accum, ea = esize(p->param_dtype);
	int64_t N, A, As, Nm, kv, nmoe = 0, ndense = 0, nre = 0, nre_moe = 0, nre_dense = 0;

	if (p->seq <= 0)
		return;
	N = p->micro * (p->seq / p->cp);
	A = N * s->hidden * ea;
	As = A / p->tp;
	Nm = p->sequence_parallel ? N / p->tp : N;
	for (int l = 0; l < s->n_layers; l++) {
		int moe = hp_model_spec_layer_is_moe(s, l), re = p->ckpt_layer[l] && p->act_ckpt == HP_ACT_CKPT_FULL;

		nmoe += moe;
		ndense += !moe;
		/* full checkpointing runs the layer's forward again in the
		 * backward, its collectives with it, up to a dense MLP's exit */
		nre += re;
		nre_moe += re && moe;
		nre_dense += re && !moe;
	}
	/* tensor parallel: per attention and dense MLP block, the entry and exit */
	if (p->sequence_parallel) {
		int64_t blocks = s->n_layers + ndense;

		add(r, HP_DIM_TP, HP_COLL_ALL_GATHER, G * (2 * blocks + nre + nre_dense), As, 1);
		add(r, HP_DIM_TP, HP_COLL_REDUCE_SCATTER, G * (2 * blocks + nre), A, 1);
		/* embedding: RS forward, AG backward; LM head: AG forward, RS backward */
		add(r, HP_DIM_TP, HP_COLL_REDUCE_SCATTER, G * 2, A, 1);
		add(r, HP_DIM_TP, HP_COLL_ALL_GATHER, G * 2, As, 1);
	} else {
		add(r, HP_DIM_TP, HP_COLL_ALL_REDUCE, G * (2 * (s->n_layers + ndense) + 2 + nre), A, 1);
	}
	if (p->loss_parallel) {     /* max, then sum of exp and the target logit */
		add(r, HP_DIM_TP, HP_COLL_ALL_REDUCE, G, N * 4, 1);
		add(r, HP_DIM_TP, HP_COLL_ALL_REDUCE, G, 2 * N * 8, 1);
	} else {
		add(r, HP_DIM_TP, HP_COLL_ALL_GATHER, G, N * (s->vocab / p->tp) * 4, 1);
	}
	/* context parallel: K and V of every layer */
	kv = N * (s->n_kv_heads / p->tp) * s->head_dim * ea;
	if (p->cp_mode == HP_CP_ULYSSES) {
		int64_t q = N * (s->n_heads / p->tp) * s->head_dim * ea;

		add(r, HP_DIM_CP, HP_COLL_ALL_TO_ALL, G * (2 * s->n_layers + nre), q + 2 * kv, 1);
		add(r, HP_DIM_CP, HP_COLL_ALL_TO_ALL, G * (2 * s->n_layers + nre), q, 1);
	} else {
		add(r, HP_DIM_CP, HP_COLL_ALL_GATHER, G * (s->n_layers + nre), 2 * kv, 1);
		add(r, HP_DIM_CP, HP_COLL_REDUCE_SCATTER, G * s->n_layers, p->cp * 2 * kv, 1);
	}
	if (!nmoe)
		return;
	/* expert parallel: counts, then rows out and back, forward and backward */
	add(r, HP_DIM_EP, HP_COLL_ALL_TO_ALL, G * (nmoe + nre_moe), s->n_experts * 4, 1);
	add(r, HP_DIM_EP, HP_COLL_ALL_TO_ALLV, G * (nmoe * 2 + nre_moe), Nm * s->top_k * s->hidden * ea, 1);
	add(r, HP_DIM_EP, HP_COLL_ALL_TO_ALLV, G * (nmoe * 2 + nre_moe), Nm * s->top_k * s->hidden * ea, 0);
	/* the load-balancing loss counts every token of the micro-batch */
	if (s->output_router_logits) {
		add(r, HP_DIM_CP, HP_COLL_ALL_REDUCE, G, 2 * s->n_experts * 8, 1);
		if (p->sequence_parallel)
			add(r, HP_DIM_TP, HP_COLL_ALL_REDUCE, G, 2 * s->n_experts * 8, 1);
	}
}

/*
 * FSDP's unsharded buffers at their peak: the root unit (gathered for the
 * whole step), the window of 1 + prefetch depth layers (a layer with its
 * experts) in the param dtype, and one layer's unsharded gradients.
 */
static int64_t gathered(const struct hp_plan *p, int rank)
{
	int64_t ep = esize(p->param_dtype), root = 0, *layer, maxg = 0, best = 0, b;
	int n = p->spec.n_layers, depth = (int)(p->forward_prefetch > p->backward_prefetch ?
					     p->forward_prefetch : p->backward_prefetch);

	if (p->dp_shard <= 1 && p->edp_shard <= 1)
		return 0;
	if (!(layer = hp_calloc((size_t)n + 1, sizeof(*layer))))
		return -1;
	for (int i = 0; i < p->nparams; i++) {
		const struct hp_plan_param *q = &p->params[i];
		int sharded = p->size[q->mesh == HP_MESH_EXPERT ? HP_DIM_EDP_SHARD : HP_DIM_DP_SHARD] > 1;
		struct hp_piece pc;
		int l;

		if (!sharded || !hp_plan_owns(p, q, rank))
			continue;
		hp_plan_piece(p, q, rank, &pc);
		if (sscanf(p->units[q->unit].name, "model.layers.%d", &l) == 1 && l >= 0 && l < n)
			layer[l] += pc.rows * pc.cols;
		else
			root += pc.rows * pc.cols;
	}
	for (int l = 0; l < n; l++) {
		int64_t w = 0;

		for (int j = l; j < n && j <= l + depth; j++)
			w += layer[j];
		if (w > best)
			best = w;
		if (layer[l] > maxg)
			maxg = layer[l];
	}
	b = (root + best) * ep + maxg * 4;
	hp_free(layer);
	return b;
}

int hp_plan_estimate(const struct hp_plan *p, int rank, struct hp_rank_est *r)
{
	int64_t el = 0;

	memset(r, 0, sizeof(*r));
	memcpy(r->size, p->size, sizeof(r->size));
	for (int i = 0; i < p->nparams; i++) {
		const struct hp_plan_param *q = &p->params[i];
		struct hp_piece pc;

		if (!hp_plan_owns(p, q, rank))
			continue;
		hp_plan_piece(p, q, rank, &pc);
		el += pc.nrows * pc.cols;
	}
	r->param_bytes = 4 * el;
	r->grad_bytes = 4 * el;
	r->optim_bytes = 8 * el;
	r->act_bytes = hp_plan_act_bytes(p);
	if ((r->gathered_bytes = gathered(p, rank)) < 0)
		return -1;
	param_traffic(p, rank, r);
	act_traffic(p, r);
	/* the loss: the count of target tokens before the step (one double),
	 * the sums of the loss and the aux loss after it (two) */
	add(r, HP_DIM_DP_SHARD, HP_COLL_ALL_REDUCE, 1, 8, 1);
	add(r, HP_DIM_DP_SHARD, HP_COLL_ALL_REDUCE, 1, 16, 1);
	add(r, HP_DIM_DP_REPLICATE, HP_COLL_ALL_REDUCE, 1, 8, 1);
	add(r, HP_DIM_DP_REPLICATE, HP_COLL_ALL_REDUCE, 1, 16, 1);
	if (p->world > 1) {   /* the squared gradient norm, logged even without clipping */
		r->comm[HP_COMM_WORLD][HP_COLL_ALL_REDUCE].calls += 1;
		r->comm[HP_COMM_WORLD][HP_COLL_ALL_REDUCE].bytes += 8;
	}
	return 0;
}
