/*
 * planest.c - what a rank of a plan holds and sends per step.
 *
 * The figures follow from the plan alone, by the rules written in
 * hp-plan(5), "ESTIMATES"; hp-train's allocator and its byte counters
 * follow the same rules, so a run can be checked against its plan.
 * Parameter, gradient and optimizer bytes are exact sums over the local
 * pieces; activation bytes are lib/model/model.c's own activation arena at the
 * rank's local sizes, measured by its take_acts without allocating;
 * traffic is counted as the bytes of the send buffer a rank passes to each
 * collective, which does not depend on the algorithm the library picks.
 * Only two all-to-allv exchanges of expert parallelism depend on the
 * routing; they are given for even routing and flagged inexact.
 */
#include <stdio.h>

#include "base/alloc.h"
#include "cpu/ops.h"
#include "model/params.h"
#include "plan/plan.h"
#include "plan/schedule.h"

/* --- parameters ------------------------------------------------------------- */

int hp_plan_stage(const struct hp_plan *p, int rank)
{
	return p->pp > 1 ? hp_mesh_coord(p->size, HP_DIM_PP, rank) : 0;
}

int hp_plan_layer_stage(const struct hp_plan *p, int l)
{
	int V = p->pp > 1 ? (int)p->pp * p->vpp : 1, v = 0;

	while (v + 1 < V && l >= p->stage_l0[v + 1])
		v++;
	return v % (p->pp > 1 ? (int)p->pp : 1);
}

int hp_plan_owns(const struct hp_plan *p, const struct hp_plan_param *q, int rank)
{
	int s = hp_plan_stage(p, rank);

	return (q->mesh != HP_MESH_EXPERT || hp_mesh_coord(p->size, HP_DIM_EP, rank) == q->ep_owner) &&
	       (q->stage == s || q->stage2 == s);
}

void hp_plan_model_par(const struct hp_plan *p, int rank, struct hp_model_par *par)
{
	int s = hp_plan_stage(p, rank);

	memset(par, 0, sizeof(*par));
	par->tp = (int)p->tp;
	par->cp = (int)p->cp;
	par->ep = (int)p->ep;
	par->sp = p->sequence_parallel;
	par->loss_parallel = p->loss_parallel;
	par->ulysses = p->cp_mode == HP_CP_ULYSSES;
	par->tp_rank = hp_mesh_coord(p->size, HP_DIM_TP, rank);
	par->cp_rank = hp_mesh_coord(p->size, HP_DIM_CP, rank);
	par->ep_rank = hp_mesh_coord(p->size, HP_DIM_EP, rank);
	par->pp = (int)p->pp;
	par->pp_rank = s;
	par->vpp = p->pp > 1 ? p->vpp : 1;
	par->slots = 1;
	par->chunk_slots[0] = 1;
	if (p->pp > 1)
		par->slots = hp_pp_in_flight(p->pp_schedule, (int)p->pp, par->vpp, s, (int)p->accum,
					     par->chunk_slots);
	for (int c = 0; c < par->vpp; c++) {
		par->chunk_l0[c] = p->stage_l0[c * p->pp + s];
		par->chunk_l1[c] = p->stage_l0[c * p->pp + s + 1];
	}
	par->l0 = par->chunk_l0[0];
	par->l1 = par->chunk_l1[0];
}

void hp_plan_piece(const struct hp_plan *p, const struct hp_plan_param *q, int rank,
		   struct hp_piece *pc)
{
	enum hp_dim sd = q->mesh == HP_MESH_EXPERT ? HP_DIM_EDP_SHARD : HP_DIM_DP_SHARD;
	int64_t k = p->size[sd], s = hp_mesh_coord(p->size, sd, rank);

	pc->rows = q->shape[0];
	pc->cols = q->ndim > 1 ? q->shape[1] : 1;
	pc->col0 = 0;
	pc->row0 = 0;
	if (q->pl[HP_DIM_TP].kind == HP_PL_SHARD) {
		int64_t t = hp_mesh_coord(p->size, HP_DIM_TP, rank);

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

/* Whether q's gradient is a partial sum over tp: q/k norms and MLA's
 * latents see only the rank's heads (hp_param_tp_partial); with sequence parallel every tp-replicated weight sees
 * only the rank's tokens. */
int hp_plan_tp_partial(const struct hp_plan *p, const struct hp_plan_param *q)
{
	if (p->tp <= 1 || q->mesh != HP_MESH_DENSE || q->pl[HP_DIM_TP].kind != HP_PL_REPLICATE)
		return 0;
	if (p->sequence_parallel)
		return 1;
	return hp_param_tp_partial(q->name);
}

/* --- activations ------------------------------------------------------------ */

/* The bytes lib/model/model.c takes for this layout's activations: its own
 * take_acts, measuring (hp_model_act_bytes), so the estimate cannot drift
 * from what each rank allocates. */
int64_t hp_plan_rank_act_bytes(const struct hp_plan *p, int rank)
{
	struct hp_model_kernels k;
	struct hp_model_par par;
	int64_t b;

	if (p->seq <= 0)
		return 0;
	hp_plan_model_kernels(p, &k);
	hp_plan_model_par(p, rank, &par);
	b = hp_model_act_bytes(&p->spec, &k, &par, (int)p->micro, (int)p->seq);
	return b > 0 || b == -2 ? b : 0;   /* -2: overflow, refused by hp_plan_resolve */
}

int64_t hp_plan_act_bytes(const struct hp_plan *p)
{
	int64_t best = 0, sw = p->world / (p->pp > 1 ? p->pp : 1);

	for (int s = 0; s < (p->pp > 1 ? p->pp : 1); s++) {
		int64_t b = hp_plan_rank_act_bytes(p, (int)(s * sw));

		if (b == -2)
			return b;
		best = b > best ? b : best;
	}
	return best;
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

/* The root unit's gathers in a step (lib/dist/fsdp.c, hp_fsdp_micro_begin):
 * at the step's first action, and with reshard_after_backward before any
 * other that finds it released (each backward releases it); with chunks,
 * of the actions of the chunk that holds the root's layers alone.  Without
 * a pipeline a micro-batch's forward and backward are one action. */
static int64_t root_gathers(const struct hp_plan *p, int rank)
{
	int G = (int)p->accum, s = hp_plan_stage(p, rank), held = 0, pp = (int)p->pp, n2;
	int64_t n = 0;
	struct hp_pp_action *a;

	if (p->pp <= 1)
		return p->reshard_after_backward ? G : 1;
	if (!(a = hp_calloc(2 * (size_t)G * p->vpp + 1, sizeof(*a))))
		return 0;
	n2 = hp_pp_actions(p->pp_schedule, pp, p->vpp, s, G, a);
	/* only the actions of the chunk that holds the root's layers */
	for (int i = 0, first = 1; i < n2; i++) {
		if (!hp_pp_root_chunk(pp, p->vpp, s, a[i].chunk))
			continue;
		if (first || (p->reshard_after_backward && !held)) {
			first = 0;
			n++;
			held = 1;
		}
		if (a[i].backward && p->reshard_after_backward)
			held = 0;
	}
	hp_free(a);
	return n;
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
		add(r, sd, HP_COLL_ALL_GATHER, root ? root_gathers(p, rank) : p->reshard_after_backward ? G : 1,
		    padded * ep, 1);
		if (!root && p->reshard_after_forward)
			add(r, sd, HP_COLL_ALL_GATHER, G, padded * ep, 1);
		/* requires_grad_sync false: once, after the step's last micro-batch */
		add(r, sd, HP_COLL_REDUCE_SCATTER, p->grad_sync ? G : 1, k * padded * er, 1);
		add(r, rd, HP_COLL_ALL_REDUCE, 1, padded * er, 1);
	}
	add(r, HP_DIM_TP, HP_COLL_ALL_REDUCE, partial ? 1 : 0, partial * er, 1);
}

/* Activation traffic of one micro-batch, times the micro-batches.
 * Activations travel in fp32 on every backend: mix_precision sets the
 * dtype of FSDP's parameter gathers and gradient reductions (the CUDA
 * backend rounds to bf16 only the operands its tensor cores read). */
static void act_traffic(const struct hp_plan *p, int rank, struct hp_rank_est *r)
{
	const struct hp_model_spec *s = &p->spec;
	int64_t G = p->accum, ea = 4;
	int64_t N, A, As, Nm, kv, nmoe = 0, ndense = 0, nre = 0, nre_moe = 0, nre_dense = 0, nlin = 0, nre_lin = 0;
	int st = hp_plan_stage(p, rank), pp = p->pp > 1 ? (int)p->pp : 1, vpp = p->pp > 1 ? p->vpp : 1, nl = 0;
	int first = st == 0, last = st == pp - 1, sends = 0;

	if (p->seq <= 0)
		return;
	N = p->micro * (p->seq / p->cp);
	A = N * s->hidden * ea;
	As = A / p->tp;
	Nm = p->sequence_parallel ? N / p->tp : N;
	/* pipeline stages: the residual stream (this rank's rows of it) to
	 * the next (virtual) stage in each forward, its gradient back in each
	 * backward, but from the model's first and last */
	for (int c = 0; c < vpp; c++)
		for (int b = 0; b < 2; b++)
			sends += hp_pp_peer(pp, vpp, st, &(struct hp_pp_action){ b, 0, c, 1 }, 0) >= 0;
	add(r, HP_DIM_PP, HP_COLL_P2P, G * sends, (p->sequence_parallel ? As : A), 1);
	/* and the MoE load-balancing loss's router statistics with it (fp64) */
	if (s->n_experts > 0 && s->output_router_logits)
		add(r, HP_DIM_PP, HP_COLL_P2P, G * sends, (2 * s->n_experts + 1) * 8, 1);
	for (int l = 0; l < s->n_layers; l++) {
		int moe = hp_model_spec_layer_is_moe(s, l), re = p->ckpt_layer[l] && p->act_ckpt == HP_ACT_CKPT_FULL;

		if (hp_plan_layer_stage(p, l) != st)
			continue;   /* another stage's */
		nl++;

		nmoe += moe;
		ndense += !moe;
		nlin += s->linear[l];
		nre_lin += re && s->linear[l];
		/* full checkpointing runs the layer's forward again in the
		 * backward, its collectives with it, up to a dense MLP's exit */
		nre += re;
		nre_moe += re && moe;
		nre_dense += re && !moe;
	}
	/* tensor parallel: per attention and dense MLP block, the entry and exit */
	if (p->sequence_parallel) {
		int64_t blocks = nl + ndense;

		add(r, HP_DIM_TP, HP_COLL_ALL_GATHER, G * (2 * blocks + nre + nre_dense), As, 1);
		add(r, HP_DIM_TP, HP_COLL_REDUCE_SCATTER, G * (2 * blocks + nre), A, 1);
		/* embedding: RS forward, AG backward; LM head: AG forward, RS backward */
		add(r, HP_DIM_TP, HP_COLL_REDUCE_SCATTER, G * (first + last), A, 1);
		add(r, HP_DIM_TP, HP_COLL_ALL_GATHER, G * (first + last), As, 1);
	} else {
		add(r, HP_DIM_TP, HP_COLL_ALL_REDUCE, G * (2 * (nl + ndense) + first + last + nre), A, 1);
	}
	if (!last) {
	} else if (p->loss_parallel) {     /* max, then sum of exp and the target logit */
		add(r, HP_DIM_TP, HP_COLL_ALL_REDUCE, G, N * 4, 1);
		add(r, HP_DIM_TP, HP_COLL_ALL_REDUCE, G, 2 * N * 8, 1);
	} else {
		add(r, HP_DIM_TP, HP_COLL_ALL_GATHER, G, N * (s->vocab / p->tp) * 4, 1);
	}
	/* context parallel: K and V of every layer */
	kv = N * (s->n_kv_heads / p->tp) * s->head_dim * ea;
	if (p->cp_mode == HP_CP_ULYSSES) {
		int64_t q = N * (s->n_heads / p->tp) * s->head_dim * ea, na = nl - nlin, nre_a = nre - nre_lin;

		add(r, HP_DIM_CP, HP_COLL_ALL_TO_ALL, G * (2 * na + nre_a), q + 2 * kv, 1);
		add(r, HP_DIM_CP, HP_COLL_ALL_TO_ALL, G * (2 * na + nre_a), q, 1);
		if (nlin) {   /* a Gated DeltaNet layer's: q, k, v, z, b, a and back, y and back (gdn_fwd) */
			int64_t Hk = s->lin_kh / p->tp, Hv = s->lin_vh / p->tp;
			int64_t y = N * Hv * s->lin_vd * ea, in = N * (2 * Hk * s->lin_kd + 2 * Hv + Hv * s->lin_vd) * ea + y;

			add(r, HP_DIM_CP, HP_COLL_ALL_TO_ALL, G * (2 * nlin + nre_lin), in, 1);
			add(r, HP_DIM_CP, HP_COLL_ALL_TO_ALL, G * (2 * nlin + nre_lin), y, 1);
		}
	} else {
		add(r, HP_DIM_CP, HP_COLL_ALL_GATHER, G * (nl + nre), 2 * kv, 1);
		add(r, HP_DIM_CP, HP_COLL_REDUCE_SCATTER, G * nl, p->cp * 2 * kv, 1);
	}
	if (!nmoe)
		return;
	/* expert parallel: counts, then rows out and back, forward and backward */
	add(r, HP_DIM_EP, HP_COLL_ALL_TO_ALL, G * (nmoe + nre_moe), s->n_experts * 4, 1);
	add(r, HP_DIM_EP, HP_COLL_ALL_TO_ALLV, G * (nmoe * 2 + nre_moe), Nm * s->top_k * s->hidden * ea, 1);
	add(r, HP_DIM_EP, HP_COLL_ALL_TO_ALLV, G * (nmoe * 2 + nre_moe), Nm * s->top_k * s->hidden * ea, 0);
	/* the load-balancing loss counts every token of the micro-batch (the
	 * last stage's, with every stage's router statistics) */
	if (s->output_router_logits && last) {
		add(r, HP_DIM_CP, HP_COLL_ALL_REDUCE, G, 2 * s->n_experts * 8, 1);
		if (p->sequence_parallel)
			add(r, HP_DIM_TP, HP_COLL_ALL_REDUCE, G, 2 * s->n_experts * 8, 1);
	}
}

int hp_plan_unit_layer(const struct hp_plan *p, int u)
{
	int l;

	return sscanf(p->units[u].name, "model.layers.%d", &l) == 1 && l >= 0 && l < p->spec.n_layers ? l : -1;
}

/* The size of the group unit u is sharded over. */
static int64_t unit_k(const struct hp_plan *p, int u)
{
	return p->size[p->units[u].mesh == HP_MESH_EXPERT ? HP_DIM_EDP_SHARD : HP_DIM_DP_SHARD];
}

static int64_t unit_rep(const struct hp_plan *p, int u)
{
	return p->size[p->units[u].mesh == HP_MESH_EXPERT ? HP_DIM_EDP_REPLICATE : HP_DIM_DP_REPLICATE];
}

/* Each unit's elements on rank: unsharded in the model (full) and its
 * shard padded to the chunks (pad), as lib/dist/fsdp.c lays them out. */
static void unit_sizes(const struct hp_plan *p, int rank, int64_t *full, int64_t *pad)
{
	for (int i = 0; i < p->nparams; i++) {
		const struct hp_plan_param *q = &p->params[i];
		struct hp_piece pc;

		if (!hp_plan_owns(p, q, rank))
			continue;
		hp_plan_piece(p, q, rank, &pc);
		full[q->unit] += pc.rows * pc.cols;
		pad[q->unit] += pc.chunk * pc.cols;
	}
}

/*
 * What FSDP holds beyond the shards at its peak, as lib/dist/fsdp.c holds
 * it on the CPU: the root unit's weights and gradients, unsharded in the
 * model (fp32) for the whole micro-batch; the layer in hand's weights and
 * gradients (fp32, each layer with its experts); the layers gathered ahead
 * (the prefetch depth), still in the ring in param_dtype (k blocks of their
 * shard, and a param_dtype copy of the shard to send when that is not
 * fp32); and the reduce-scatter's buffer for the largest unit (k + 1
 * blocks of its shard in reduce_dtype).  Every run over ranks goes through
 * FSDP, sharded (k > 1) or not.
 */
static int64_t gathered(const struct hp_plan *p, int rank)
{
	int64_t ep = esize(p->param_dtype), er = esize(p->reduce_dtype), root = 0, best = 0, rs = 0;
	int64_t *full, *pad, *layer, *ring;
	int n = p->spec.n_layers, depth = (int)(p->forward_prefetch > p->backward_prefetch ?
					     p->forward_prefetch : p->backward_prefetch);

	if (p->world <= 1)
		return 0;
	full = hp_calloc((size_t)p->nunits, sizeof(*full));
	pad = hp_calloc((size_t)p->nunits, sizeof(*pad));
	layer = hp_calloc((size_t)n + 1, sizeof(*layer));
	ring = hp_calloc((size_t)n + 1, sizeof(*ring));
	if (!full || !pad || !layer || !ring) {
		root = -1;
		goto out;
	}
	unit_sizes(p, rank, full, pad);
	for (int u = 0; u < p->nunits; u++) {
		int64_t k = unit_k(p, u);
		int l = hp_plan_unit_layer(p, u);

		if ((k + 1) * pad[u] * er > rs)
			rs = (k + 1) * pad[u] * er;
		if (l >= 0) {
			layer[l] += full[u];
			ring[l] += k * pad[u] * ep + (ep != 4 ? pad[u] * ep : 0);
		} else {
			root += full[u];
		}
	}
	/* with requires_grad_sync false every layer's gradients stay, unsharded,
	 * from the first backward of the step to its end */
	int64_t held = 0;
	for (int l = 0; !p->grad_sync && l < n; l++)
		held += 4 * layer[l];
	for (int l = 0; l < n; l++) {
		int64_t w = (p->grad_sync ? 8 : 4) * layer[l];

		for (int j = l + 1; j < n && j <= l + depth; j++)
			w += ring[j];
		if (w > best)
			best = w;
	}
	root = 8 * root + held + best + rs;
out:
	hp_free(full);
	hp_free(pad);
	hp_free(layer);
	hp_free(ring);
	return root;
}

int hp_plan_fsdp_bytes(const struct hp_plan *p, int rank, size_t ep, size_t er, int ring,
		       struct hp_fsdp_bytes *b)
{
	int64_t *full = hp_calloc((size_t)p->nunits + 1, sizeof(*full)), *pad = hp_calloc((size_t)p->nunits + 1,
											   sizeof(*pad));
	int bf = esize(p->reduce_dtype) == 2;
	size_t partial = 0, t = (size_t)p->tp;
	int rc = -1;

	memset(b, 0, sizeof(*b));
	if (!full || !pad)
		goto out;
	unit_sizes(p, rank, full, pad);
	for (int i = 0; i < p->nparams; i++) {
		struct hp_piece pc;

		if (!hp_plan_owns(p, &p->params[i], rank) || !hp_plan_tp_partial(p, &p->params[i]))
			continue;
		hp_plan_piece(p, &p->params[i], rank, &pc);
		partial += (size_t)(pc.chunk * pc.cols);
	}
#define MAXTO(x, v) do { size_t v_ = (v); if (v_ > (x)) (x) = v_; } while (0)
	MAXTO(b->buf, partial * er);
	/* a stage between a tied embedding's two adds zeros to their sum (hp_fsdp_sync_tied) */
	if (p->params[0].stage2 >= 0 && !hp_plan_owns(p, &p->params[0], rank)) {
		struct hp_piece pc;

		hp_plan_piece(p, &p->params[0], rank, &pc);
		MAXTO(b->buf, (size_t)(pc.chunk * pc.cols) * 4);
	}
	if (bf && t > 1)
		MAXTO(b->buf, 2 * t * ((partial + t - 1) / t) * er);
	for (int u = 0; u < p->nunits; u++) {
		size_t k = (size_t)unit_k(p, u), r = (size_t)unit_rep(p, u), n = (size_t)pad[u];
		size_t rs = (bf ? 2 * k : k + 1) * n * er;

		MAXTO(b->buf, rs);
		if (bf && r > 1)
			MAXTO(b->buf, 2 * r * ((n + r - 1) / r) * er);
		if (hp_plan_unit_layer(p, u) < 0) {
			MAXTO(b->buf, (k + 1) * n * ep);
			continue;
		}
		if (ring)
			MAXTO(b->rs1, rs);
		MAXTO(b->slot, k * n * ep);
		if (esize(p->param_dtype) != 4)
			MAXTO(b->send, n * ep);
	}
#undef MAXTO
	rc = 0;
out:
	hp_free(full);
	hp_free(pad);
	return rc;
}

/* --- device memory ---------------------------------------------------------- */

/*
 * What the CUDA backend holds on rank's GPU at its peak, by the rules its
 * allocations follow (lib/backend/backend_cuda.c counts the same bytes as
 * dev_bytes, on a GPU and in the emulation alike): the activation arena
 * and the operand scratch, sized from the layout
 * (hp_model_device_act_bytes); in one process the model's fp32 weights
 * and gradients, the bf16 working copy of every weight a GEMM reads (not
 * an untied embedding), and AdamW's moments; over ranks FSDP's shards
 * (weights, gradient sums, moments), its packing buffer, its prefetch
 * slots, and the model's arrays reserved, with memory mapped in granules
 * (HP_CUDA_GRANULE) behind what is held: the root unit, and at the peak
 * the layers whose weights and gradients the schedule holds at once (a
 * matrix only GEMMs read in its working copy alone, not in fp32).
 */
/* model offset, elements; layer, -1: root; held in the working copy alone */
struct dparam { int64_t off, n; int layer, conly; };

/* granules of [lo, hi) bytes not yet marked in seen; marks them */
static int64_t touch(unsigned char *seen, int64_t lo, int64_t hi)
{
	int64_t n = 0, G = (int64_t)HP_CUDA_GRANULE;

	for (int64_t g = lo / G; g < (hi + G - 1) / G; g++)
		if (!seen[g]) {
			seen[g] = 1;
			n++;
		}
	return n;
}

/* Weights layer k holds in the backward of layer l (reshard_after_*). */
static int holds_weights(const struct hp_plan *p, int k, int l)
{
	if (p->reshard_after_forward)
		return p->reshard_after_backward ? k == l : k >= l;
	return p->reshard_after_backward ? k <= l : 1;
}

static int device_bytes(const struct hp_plan *p, int rank, int64_t *out)
{
	struct hp_model_kernels k;
	struct hp_model_par par;
	int n = p->spec.n_layers, np = 0, rc = -1;
	int64_t act, scratch = 0, numel = 0, wc0 = 0, total = 0, best = 0;
	struct hp_fsdp_bytes fb;
	int64_t *full = hp_calloc((size_t)p->nunits + 1, sizeof(*full));
	int64_t *pad = hp_calloc((size_t)p->nunits + 1, sizeof(*pad)), *units = hp_calloc((size_t)n + 1, sizeof(*units));
	struct dparam *dp = hp_calloc((size_t)p->nparams + 1, sizeof(*dp));
	unsigned char *seen = NULL;
	size_t ng;

	*out = 0;
	hp_plan_model_par(p, rank, &par);
	if (!full || !pad || !units || !dp)
		goto out;
	hp_plan_model_kernels(p, &k);
	if (p->seq <= 0 || (act = hp_model_device_act_bytes(&p->spec, &k, &par, (int)p->micro, (int)p->seq,
							    &scratch)) < 0) {
		rc = 0;   /* no activations known: no estimate */
		goto out;
	}
	/* the model's flat arrays: its pieces in the plan's order, each at
	 * HP_PARAM_ALIGN (lib/model/model.c, add_param) */
	for (int i = 0; i < p->nparams; i++) {
		const struct hp_plan_param *q = &p->params[i];
		struct hp_piece pc;

		if (!hp_plan_owns(p, q, rank))
			continue;
		hp_plan_piece(p, q, rank, &pc);
		numel = (numel + HP_PARAM_ALIGN - 1) & ~(int64_t)(HP_PARAM_ALIGN - 1);
		if (!numel && hp_param_uncopied(q->name, p->spec.tie_word_embeddings))
			wc0 = pc.rows * pc.cols;   /* looked up, never a GEMM's: no working copy */
		dp[np++] = (struct dparam){ numel, pc.rows * pc.cols, hp_plan_unit_layer(p, q->unit),
					    hp_param_gemm_only(q->name, q->ndim) };
		numel += pc.rows * pc.cols;
	}
	if (p->world <= 1) {
		/* weights, gradients, moments; the working copy (its 64 bytes' end) */
		*out = 16 * numel + 2 * (numel - wc0) + 64 + act + scratch;
		rc = 0;
		goto out;
	}
	unit_sizes(p, rank, full, pad);
	if (hp_plan_fsdp_bytes(p, rank, (size_t)esize(p->param_dtype), (size_t)esize(p->reduce_dtype), 1, &fb))
		goto out;
	for (int u = 0; u < p->nunits; u++) {
		int l = hp_plan_unit_layer(p, u);

		total += pad[u];
		if (l >= 0 && pad[u])   /* a unit of another pipeline stage's layer is not here */
			units[l]++;
	}
	/* the prefetch slots in use at once: the units of the layers fetched
	 * ahead, forward and (when the backward gathers) backward */
	int64_t nslot = 1;
	for (int l = 0; l < n; l++) {
		int64_t f = 0, b = 0;

		if (!units[l])   /* another pipeline stage's layer: never in hand here */
			continue;

		for (int j = l + 1; j < n && j <= l + p->forward_prefetch; j++)
			f += units[j];
		for (int j = l - 1; p->reshard_after_forward && j >= 0 && j >= l - p->backward_prefetch; j--)
			b += units[j];
		nslot = f > nslot ? f : nslot;
		nslot = b > nslot ? b : nslot;
	}
	/* the shards, FSDP's buffers (each allocated 8 bytes over) and the
	 * prefetch slots in use at once */
	*out = act + scratch + 4 * 4 * (total + 1) + (int64_t)fb.buf + 8 + (fb.rs1 ? (int64_t)fb.rs1 + 8 : 0) +
	       (fb.slot ? nslot * ((int64_t)fb.slot + 8 + (fb.send ? (int64_t)fb.send + 8 : 0)) : 0);
	/* the reserved arrays at the backward of each layer: the root's and
	 * the held layers' weights (fp32 unless only GEMMs read them, bf16 from
	 * wc0 on) and the gradients of the root and the layer */
	ng = (size_t)((4 * numel + (int64_t)HP_CUDA_GRANULE - 1) / (int64_t)HP_CUDA_GRANULE) + 1;
	if (!(seen = hp_calloc(3 * ng, 1)))
		goto out;
	for (int l = 0; l < (n ? n : 1); l++) {
		int64_t g = 0;

		memset(seen, 0, 3 * ng);
		for (int i = 0; i < np; i++) {
			const struct dparam *d = &dp[i];
			int64_t lo = d->off > wc0 ? d->off : wc0;

			if (d->layer < 0 || holds_weights(p, d->layer, l)) {
				if (!d->conly)
					g += touch(seen, 4 * d->off, 4 * (d->off + d->n));
				if (lo < d->off + d->n)
					g += touch(seen + ng, 2 * (lo - wc0), 2 * (d->off + d->n - wc0));
			}
			/* the gradients of the root and the layer; with requires_grad_sync
			 * false of every layer, held through the step */
			if (d->layer < 0 || d->layer == l || !p->grad_sync)
				g += touch(seen + 2 * ng, 4 * d->off, 4 * (d->off + d->n));
		}
		best = g > best ? g : best;
	}
	*out += best * (int64_t)HP_CUDA_GRANULE;
	rc = 0;
out:
	hp_free(full);
	hp_free(pad);
	hp_free(units);
	hp_free(dp);
	hp_free(seen);
	return rc;
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
	r->act_bytes = p->pp > 1 ? hp_plan_rank_act_bytes(p, rank) : p->act_bytes;
	if ((r->gathered_bytes = gathered(p, rank)) < 0)
		return -1;
	r->host_overhead_bytes = HP_HOST_OVERHEAD_BYTES;
	r->host_bytes = r->param_bytes + r->grad_bytes + r->optim_bytes + r->act_bytes + r->gathered_bytes +
			r->host_overhead_bytes;
	if (p->device != HP_DEVICE_CPU && device_bytes(p, rank, &r->device_bytes))
		return -1;
	param_traffic(p, rank, r);
	act_traffic(p, rank, r);
	/* the loss: the count of target tokens before the step (one double),
	 * the sums of the loss and the aux loss after it (two) */
	add(r, HP_DIM_DP_SHARD, HP_COLL_ALL_REDUCE, 1, 8, 1);
	add(r, HP_DIM_DP_SHARD, HP_COLL_ALL_REDUCE, 1, 16, 1);
	add(r, HP_DIM_DP_REPLICATE, HP_COLL_ALL_REDUCE, 1, 8, 1);
	add(r, HP_DIM_DP_REPLICATE, HP_COLL_ALL_REDUCE, 1, 16, 1);
	/* the loss is the last stage's: its sums go to every stage */
	add(r, HP_DIM_PP, HP_COLL_ALL_REDUCE, 1, 16, 1);
	/* a tied embedding's gradient shard, summed over the stages (fp32) */
	if (p->params[0].stage2 >= 0) {
		struct hp_piece pc;

		hp_plan_piece(p, &p->params[0], rank, &pc);
		add(r, HP_DIM_PP, HP_COLL_ALL_REDUCE, 1, pc.chunk * pc.cols * 4, 1);
	}
	if (p->world > 1) {   /* the squared gradient norm, logged even without clipping */
		r->comm[HP_COMM_WORLD][HP_COLL_ALL_REDUCE].calls += 1;
		r->comm[HP_COMM_WORLD][HP_COLL_ALL_REDUCE].bytes += 8;
	}
	return 0;
}
