/*
 * gmodel.c - the training step on one GPU; see gmodel.h.
 */
#include <math.h>
#include <string.h>

#include "alloc.h"
#include "gmodel.h"
#include "params.h"
#include "cuda/ops.h"

/* (id, index) order: a total order, so any correct sort gives the same
 * result a stable sort by id would */
static int tok_less(const int32_t *ids, int32_t a, int32_t b)
{
	return ids[a] < ids[b] || (ids[a] == ids[b] && a < b);
}

static void tok_sift(int32_t *o, const int32_t *ids, long i, long n)
{
	for (;;) {
		long c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && tok_less(ids, o[c], o[c + 1]))
			c++;
		if (!tok_less(ids, o[i], o[c]))
			break;
		int32_t t = o[i];
		o[i] = o[c];
		o[c] = t;
		i = c;
	}
}

/* The tokens grouped by id for hp_cuda_embedding_bwd (kernels/cuda/ops.h),
 * host code built in every build.  Heap sort: in place, O(N log N), no
 * allocation in the step loop. */
int hp_cuda_embedding_groups(int32_t *order, int32_t *starts, const int32_t *ids, long N, int pad)
{
	int nu = 0;
	long kept = 0;

	for (long i = 0; i < N; i++)
		order[i] = (int32_t)i;
	for (long i = N / 2 - 1; i >= 0; i--)
		tok_sift(order, ids, i, N);
	for (long n = N - 1; n > 0; n--) {
		int32_t t = order[0];
		order[0] = order[n];
		order[n] = t;
		tok_sift(order, ids, 0, n);
	}
	for (long i = 0; i < N; i++)
		if (ids[order[i]] != pad)
			order[kept++] = order[i];
	N = kept;
	for (long i = 0; i < N; i++)
		if (i == 0 || ids[order[i]] != ids[order[i - 1]])
			starts[nu++] = (int32_t)i;
	starts[nu] = (int32_t)N;
	return nu;
}

#ifndef HP_HAVE_CUDA

int hp_gmodel_init(struct hp_gmodel **gp, struct hp_model *m, const struct hp_optim *o, int dev,
		   int B, int T, long ce_chunk, struct hp_err *e)
{
	*gp = NULL;
	return hp_err_set(e, HP_EUNSUP, "training.device: cuda: this hp was built without CUDA "
			  "(no nvcc at build time); rebuild on a machine with the CUDA toolkit");
}
void hp_gmodel_free(struct hp_gmodel *g) { (void)g; }
void hp_gmodel_zero_grad(struct hp_gmodel *g) { (void)g; }
int hp_gmodel_micro(struct hp_gmodel *g, const int32_t *ids, const int32_t *targets, const int32_t *seg,
		    double ce_scale, double aux_weight, double *loss_sum, long *count, double *aux,
		    struct hp_err *e)
{
	return hp_err_set(e, HP_EUNSUP, "built without CUDA");
}
int hp_gmodel_grad_norm(struct hp_gmodel *g, double *norm, struct hp_err *e)
{
	return hp_err_set(e, HP_EUNSUP, "built without CUDA");
}
int hp_gmodel_step(struct hp_gmodel *g, const struct hp_optim *o, double norm, struct hp_err *e)
{
	return hp_err_set(e, HP_EUNSUP, "built without CUDA");
}
int hp_gmodel_download(struct hp_gmodel *g, struct hp_model *m, struct hp_optim *o, int with_grads,
		       struct hp_err *e)
{
	return hp_err_set(e, HP_EUNSUP, "built without CUDA");
}
size_t hp_gmodel_bytes(const struct hp_gmodel *g) { (void)g; return 0; }
long hp_gmodel_ce_chunk(const struct hp_gmodel *g) { (void)g; return 0; }
size_t hp_gmodel_bytes_for(const struct hp_model_spec *s, int B, int T, long ce_chunk) { return 0; }

#else

/* one layer's saved activations (device) */
struct glayer {
	float *x_in, *x_mid, *rstd1, *rstd2, *rstd_q, *rstd_k, *lse;
	hp_bf16 *xn1, *xn2, *q_raw, *k_raw, *q, *k, *v, *att;
	hp_bf16 *gu, *h;                 /* dense: [N, 2I] gate|up, [N, I] */
	/* MoE */
	float *probs, *wsel;             /* [N,E], [N,k] */
	int32_t *sel, *row_tok, *tok_row;   /* [N*k] */
	hp_bf16 *ge, *he, *ye;           /* [R, 2Im], [R, Im], [R, C] expert-major rows */
	int32_t *off;                    /* host [E+1] */
	/* where this layer's weights start in the flat layout (elements) */
	size_t in_norm, post_norm, wq, wk, wv, wo, bq, bk, bv, bo, q_norm, k_norm;
	size_t wgu, wd, router, *ex_gu, *ex_d;   /* ex_*: host [E] */
	int moe;
};

struct hp_gmodel {
	struct hp_model *m;
	struct hp_model_spec s;
	int B, T;
	long N, chunk;
	size_t numel;
	char *arena;                     /* all device memory (carve) */
	size_t at;                       /* bytes of it handed out */
	float *w32, *g32, *m1, *m2;
	hp_bf16 *wb;
	size_t embed, final_norm, lm_head;
	struct glayer *L;
	/* the rest of the forward */
	float *x_final, *rstd_f, *logits, *loss_rows, *cos_t, *sin_t;
	hp_bf16 *xf, *dlogits;
	int32_t *ids, *tgt, *seg, *pos, *order, *starts;
	/* backward and MoE scratch */
	float *dx, *dwsel, *fscratch, *aux;
	hp_bf16 *dyb, *dxn, *datt, *dq, *dk, *dv, *dq2, *dk2, *dgu, *dh, *mlp_out;
	hp_bf16 *xe, *dye, *dhe, *dge, *dxe, *dprob;
	/* host scratch */
	int32_t *h_pos, *h_sel, *h_row_tok, *h_tok_row, *h_fill, *h_order, *h_starts;
	float *h_loss, *h_probs, *h_aux;
	double *h_F, *h_P;
	const hp_bf16 **h_wptr;          /* [E] grouped GEMM weight pointers */
	float **h_gptr;                  /* [E] grouped GEMM gradient pointers */
	int n_moe;
};

static size_t off_of(const struct hp_model *m, const float *p)
{
	return p ? (size_t)(p - m->flat_w) : (size_t)-1;
}

/*
 * Device memory is one arena, cut into the buffers in a fixed order: a
 * first pass (no arena yet) only adds up the sizes, the second hands out
 * the same pieces of the arena, 256-byte aligned.
 */
static void *carve(struct hp_gmodel *g, size_t bytes)
{
	char *p = g->arena ? g->arena + g->at : NULL;

	g->at += (bytes + 255) & ~(size_t)255;
	return p;
}

#define DA(ptr, n, type) ((ptr) = carve(g, (size_t)(n) * sizeof(type)))

static void carve_layer(struct hp_gmodel *g, int l)
{
	const struct hp_model_spec *s = &g->s;
	struct glayer *a = &g->L[l];
	long N = g->N, R = g->N * s->top_k;
	int C = s->hidden, D = s->head_dim, QD = s->n_heads * D, KD = s->n_kv_heads * D;

	DA(a->x_in, N * C, float);
	DA(a->x_mid, N * C, float);
	DA(a->rstd1, N, float);
	DA(a->rstd2, N, float);
	DA(a->xn1, N * C, hp_bf16);
	DA(a->xn2, N * C, hp_bf16);
	if (s->qk_norm) {
		DA(a->q_raw, N * QD, hp_bf16);
		DA(a->k_raw, N * KD, hp_bf16);
		DA(a->rstd_q, N * s->n_heads, float);
		DA(a->rstd_k, N * s->n_kv_heads, float);
	}
	DA(a->q, N * QD, hp_bf16);
	DA(a->k, N * KD, hp_bf16);
	DA(a->v, N * KD, hp_bf16);
	DA(a->att, N * QD, hp_bf16);
	DA(a->lse, (long)g->B * s->n_heads * g->T, float);
	if (!a->moe) {
		DA(a->gu, N * 2 * s->intermediate, hp_bf16);
		DA(a->h, N * s->intermediate, hp_bf16);
		return;
	}
	int E = s->n_experts, Im = s->moe_intermediate;
	DA(a->probs, N * E, float);
	DA(a->wsel, R, float);
	DA(a->sel, R, int32_t);
	DA(a->row_tok, R, int32_t);
	DA(a->tok_row, R, int32_t);
	DA(a->ge, R * 2 * Im, hp_bf16);
	DA(a->he, R * Im, hp_bf16);
	DA(a->ye, R * C, hp_bf16);
}

/* every device buffer, layers first */
static void carve_all(struct hp_gmodel *g)
{
	const struct hp_model_spec *s = &g->s;
	long N = g->N, R = N * (s->n_experts ? s->top_k : 0);
	int C = s->hidden, D = s->head_dim, QD = s->n_heads * D, KD = s->n_kv_heads * D;
	int I = s->intermediate, Im = s->moe_intermediate, E = s->n_experts;

	g->at = 0;
	for (int l = 0; l < s->n_layers; l++)
		carve_layer(g, l);
	DA(g->w32, g->numel, float);
	DA(g->g32, g->numel, float);
	DA(g->m1, g->numel, float);
	DA(g->m2, g->numel, float);
	DA(g->wb, g->numel, hp_bf16);
	DA(g->x_final, N * C, float);
	DA(g->rstd_f, N, float);
	DA(g->xf, N * C, hp_bf16);
	DA(g->logits, g->chunk * s->vocab, float);
	DA(g->dlogits, g->chunk * s->vocab, hp_bf16);
	DA(g->loss_rows, g->chunk, float);
	DA(g->cos_t, (long)g->T * D / 2, float);
	DA(g->sin_t, (long)g->T * D / 2, float);
	DA(g->ids, N, int32_t);
	DA(g->tgt, N, int32_t);
	DA(g->seg, N, int32_t);
	DA(g->pos, N, int32_t);
	DA(g->order, N, int32_t);
	DA(g->starts, N + 1, int32_t);
	DA(g->dx, N * C, float);
	DA(g->fscratch, hp_cuda_flash_scratch(g->B, g->T, s->n_heads) + 1, float);
	DA(g->dyb, N * C, hp_bf16);
	DA(g->dxn, N * C, hp_bf16);
	DA(g->mlp_out, N * C, hp_bf16);
	DA(g->datt, N * QD, hp_bf16);
	DA(g->dq, N * QD, hp_bf16);
	DA(g->dk, N * KD, hp_bf16);
	DA(g->dv, N * KD, hp_bf16);
	if (s->qk_norm) {
		DA(g->dq2, N * QD, hp_bf16);
		DA(g->dk2, N * KD, hp_bf16);
	}
	DA(g->dgu, N * 2 * (I > Im ? I : Im), hp_bf16);
	DA(g->dh, N * I, hp_bf16);
	if (g->n_moe) {
		DA(g->dwsel, R, float);
		DA(g->aux, E, float);
		DA(g->xe, R * C, hp_bf16);
		DA(g->dye, R * C, hp_bf16);
		DA(g->dhe, R * Im, hp_bf16);
		DA(g->dge, R * 2 * Im, hp_bf16);
		DA(g->dxe, R * C, hp_bf16);
		DA(g->dprob, N * E, hp_bf16);
	}
}

static void set_shape(struct hp_gmodel *g, const struct hp_model_spec *s, int B, int T, long ce_chunk)
{
	g->s = *s;
	g->B = B;
	g->T = T;
	g->N = (long)B * T;
	g->chunk = ce_chunk > 0 ? ce_chunk : HP_GMODEL_CE_CHUNK;
	if (g->chunk > g->N)
		g->chunk = g->N;
}

/* the flat parameter layout's length, as lib/model.c lays it out (each
 * tensor 16-float aligned, the end too) */
static int add_numel(void *ctx, const struct hp_param_desc *d)
{
	size_t *n = ctx;

	*n = ((*n + 15) & ~(size_t)15) + (size_t)(d->shape[0] * d->shape[1]);
	return 0;
}

size_t hp_gmodel_bytes_for(const struct hp_model_spec *s, int B, int T, long ce_chunk)
{
	struct hp_gmodel g;

	memset(&g, 0, sizeof(g));
	set_shape(&g, s, B, T, ce_chunk);
	hp_model_spec_params(s, add_numel, &g.numel);
	g.numel = (g.numel + 15) & ~(size_t)15;
	if (!(g.L = hp_calloc((size_t)s->n_layers, sizeof(*g.L))))
		return 0;
	for (int l = 0; l < s->n_layers; l++)
		g.n_moe += g.L[l].moe = hp_model_spec_layer_is_moe(s, l);
	carve_all(&g);
	hp_free(g.L);
	return g.at;
}

/* the flat offsets of layer l's weights; gate and up must be adjacent (one
 * GEMM computes both) */
static int layer_offsets(struct hp_gmodel *g, int l, struct hp_err *e)
{
	const struct hp_model *m = g->m;
	const struct hp_layer_w *w = &m->lw[l];
	struct glayer *a = &g->L[l];
	int C = g->s.hidden;

	a->moe = w->moe;
	a->in_norm = off_of(m, w->in_norm);
	a->post_norm = off_of(m, w->post_norm);
	a->wq = off_of(m, w->wq);
	a->wk = off_of(m, w->wk);
	a->wv = off_of(m, w->wv);
	a->wo = off_of(m, w->wo);
	a->bq = off_of(m, w->bq);
	a->bk = off_of(m, w->bk);
	a->bv = off_of(m, w->bv);
	a->bo = off_of(m, w->bo);
	a->q_norm = off_of(m, w->q_norm);
	a->k_norm = off_of(m, w->k_norm);
	if (!w->moe) {
		a->wgu = off_of(m, w->wg);
		a->wd = off_of(m, w->wd);
		if (w->wu != w->wg + (size_t)g->s.intermediate * C)
			return hp_err_set(e, HP_EUNSUP, "layer %d: gate_proj and up_proj are not adjacent in "
					  "the parameter layout (intermediate_size * hidden_size not a multiple "
					  "of 16); the CUDA backend needs them adjacent", l);
		return 0;
	}
	int E = g->s.n_experts;
	a->router = off_of(m, w->router);
	if (!(a->ex_gu = hp_calloc((size_t)E, sizeof(size_t))) || !(a->ex_d = hp_calloc((size_t)E, sizeof(size_t))) ||
	    !(a->off = hp_calloc((size_t)E + 1, sizeof(int32_t))))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	for (int x = 0; x < E; x++) {
		a->ex_gu[x] = off_of(m, w->ex[x].wg);
		a->ex_d[x] = off_of(m, w->ex[x].wd);
		if (w->ex[x].wu != w->ex[x].wg + (size_t)g->s.moe_intermediate * C)
			return hp_err_set(e, HP_EUNSUP, "layer %d expert %d: gate_proj and up_proj are not "
					  "adjacent in the parameter layout; the CUDA backend needs them adjacent", l, x);
	}
	return 0;
}

int hp_gmodel_init(struct hp_gmodel **gp, struct hp_model *m, const struct hp_optim *o, int dev,
		   int B, int T, long ce_chunk, struct hp_err *e)
{
	struct hp_gmodel *g;
	const struct hp_model_spec *s = &m->spec;
	int rc, C = s->hidden, D = s->head_dim, E = s->n_experts;
	long N = (long)B * T, R = N * (E ? s->top_k : 0);

	*gp = NULL;
	if (m->par.tp > 1 || m->par.cp > 1 || m->par.ep > 1)
		return hp_err_set(e, HP_EUNSUP, "training.device: cuda runs each rank's whole model; tensor, "
				  "context and expert parallelism on GPUs are not implemented yet");
	if (!hp_cuda_flash_supports(D))
		return hp_err_set(e, HP_EUNSUP, "training.device: cuda: head_dim %d is not supported by the "
				  "CUDA flash attention kernel", D);
	if ((rc = hp_cuda_init(dev, e)))
		return rc;
	if (!(g = hp_calloc(1, sizeof(*g))))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	*gp = g;
	g->m = m;
	set_shape(g, s, B, T, ce_chunk);
	g->numel = m->numel;
	g->embed = off_of(m, m->embed);
	g->final_norm = off_of(m, m->final_norm);
	g->lm_head = off_of(m, m->lm_head);
	if (!(g->L = hp_calloc((size_t)s->n_layers, sizeof(*g->L))))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	for (int l = 0; l < s->n_layers; l++) {
		if ((rc = layer_offsets(g, l, e)))
			return rc;
		g->n_moe += g->L[l].moe;
	}
	carve_all(g);
	if (!(g->arena = hp_cuda_alloc(g->at, e)))
		return HP_ECUDA;
	carve_all(g);
	/* host scratch */
	g->h_pos = hp_calloc((size_t)N, sizeof(int32_t));
	g->h_order = hp_calloc((size_t)N, sizeof(int32_t));
	g->h_starts = hp_calloc((size_t)N + 1, sizeof(int32_t));
	g->h_loss = hp_calloc((size_t)g->chunk, sizeof(float));
	if (!g->h_pos || !g->h_order || !g->h_starts || !g->h_loss)
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	if (g->n_moe) {
		g->h_sel = hp_calloc((size_t)R, sizeof(int32_t));
		g->h_row_tok = hp_calloc((size_t)R, sizeof(int32_t));
		g->h_tok_row = hp_calloc((size_t)R, sizeof(int32_t));
		g->h_fill = hp_calloc((size_t)E, sizeof(int32_t));
		g->h_probs = hp_calloc((size_t)N * E, sizeof(float));
		g->h_aux = hp_calloc((size_t)E, sizeof(float));
		g->h_F = hp_calloc(2 * (size_t)E, sizeof(double));
		g->h_P = g->h_F + E;
		g->h_wptr = hp_calloc((size_t)E, sizeof(*g->h_wptr));
		g->h_gptr = hp_calloc((size_t)E, sizeof(*g->h_gptr));
		if (!g->h_sel || !g->h_row_tok || !g->h_tok_row || !g->h_fill || !g->h_probs || !g->h_aux ||
		    !g->h_F || !g->h_wptr || !g->h_gptr)
			return hp_err_set(e, HP_ENOMEM, "out of memory");
	}
	/* the reductions' scratch now, not in the first step */
	if ((rc = hp_cuda_reserve(C > D ? C : D, e)))
		return rc;
	/* RoPE tables for positions 0..T-1, the weights, the moments */
	float *ct = hp_malloc(sizeof(float) * (size_t)T * D), *st = ct ? ct + (size_t)T * D / 2 : NULL;
	if (!ct)
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	hp_model_spec_rope_table(s, ct, st, T);
	rc = hp_cuda_upload(g->cos_t, ct, sizeof(float) * (size_t)T * D / 2, e);
	if (!rc)
		rc = hp_cuda_upload(g->sin_t, st, sizeof(float) * (size_t)T * D / 2, e);
	if (!rc)
		rc = hp_cuda_upload(g->w32, m->flat_w, sizeof(float) * g->numel, e);
	if (!rc && o && o->m)
		rc = hp_cuda_upload(g->m1, o->m, sizeof(float) * g->numel, e);
	if (!rc && o && o->v)
		rc = hp_cuda_upload(g->m2, o->v, sizeof(float) * g->numel, e);
	if (!rc)
		rc = hp_cuda_sync(e);
	hp_free(ct);
	if (rc)
		return rc;
	hp_cuda_f32_to_bf16(g->wb, g->w32, g->numel);
	return hp_cuda_sync(e);
}

void hp_gmodel_free(struct hp_gmodel *g)
{
	if (!g)
		return;
	hp_cuda_free(g->arena);
	for (int l = 0; g->L && l < g->s.n_layers; l++) {
		hp_free(g->L[l].ex_gu);
		hp_free(g->L[l].ex_d);
		hp_free(g->L[l].off);
	}
	hp_free(g->L);
	hp_free(g->h_pos);
	hp_free(g->h_order);
	hp_free(g->h_starts);
	hp_free(g->h_loss);
	hp_free(g->h_sel);
	hp_free(g->h_row_tok);
	hp_free(g->h_tok_row);
	hp_free(g->h_fill);
	hp_free(g->h_probs);
	hp_free(g->h_aux);
	hp_free(g->h_F);
	hp_free(g->h_wptr);
	hp_free(g->h_gptr);
	hp_free(g);
	hp_cuda_fini();
}

void hp_gmodel_zero_grad(struct hp_gmodel *g)
{
	hp_cuda_zero(g->g32, sizeof(float) * g->numel);
}

size_t hp_gmodel_bytes(const struct hp_gmodel *g)
{
	return g->at;
}

long hp_gmodel_ce_chunk(const struct hp_gmodel *g)
{
	return g->chunk;
}

#define W32(o) (g->w32 + (o))
#define WB(o) (g->wb + (o))
#define G32(o) (g->g32 + (o))
#define OPT32(o) ((o) == (size_t)-1 ? NULL : g->w32 + (o))
#define OPTG(o) ((o) == (size_t)-1 ? NULL : g->g32 + (o))

/*
 * Routing of layer l: the device's top-k choices come to the host, which
 * groups the rows expert-major (token order within an expert, as
 * lib/model.c) and sends back row -> token and (token, slot) -> row.
 * The aux loss's per-expert counts and probability sums are added to h_F,
 * h_P.
 */
static int route(struct hp_gmodel *g, struct glayer *a, struct hp_err *e)
{
	const struct hp_model_spec *s = &g->s;
	long N = g->N, R = N * s->top_k;
	int E = s->n_experts, K = s->top_k, rc;
	int32_t *off = a->off;

	if ((rc = hp_cuda_download(g->h_sel, a->sel, sizeof(int32_t) * (size_t)R, e)))
		return rc;
	memset(off, 0, sizeof(int32_t) * (size_t)(E + 1));
	for (long i = 0; i < R; i++) {
		if (g->h_sel[i] < 0 || g->h_sel[i] >= E)
			return hp_err_set(e, HP_ENUM, "router: expert %d chosen (NaN logits?)", g->h_sel[i]);
		off[g->h_sel[i] + 1]++;
	}
	for (int x = 0; x < E; x++)
		off[x + 1] += off[x];
	memcpy(g->h_fill, off, sizeof(int32_t) * (size_t)E);
	for (long t = 0; t < N; t++)
		for (int k = 0; k < K; k++) {
			int32_t r = g->h_fill[g->h_sel[t * K + k]]++;
			g->h_row_tok[r] = (int32_t)t;
			g->h_tok_row[t * K + k] = r;
		}
	if (s->output_router_logits) {
		if ((rc = hp_cuda_download(g->h_probs, a->probs, sizeof(float) * (size_t)N * E, e)))
			return rc;
		for (long i = 0; i < R; i++)
			g->h_F[g->h_sel[i]] += 1;
		for (long t = 0; t < N; t++)
			for (int x = 0; x < E; x++)
				g->h_P[x] += g->h_probs[t * E + x];
	}
	if ((rc = hp_cuda_upload(a->row_tok, g->h_row_tok, sizeof(int32_t) * (size_t)R, e)) ||
	    (rc = hp_cuda_upload(a->tok_row, g->h_tok_row, sizeof(int32_t) * (size_t)R, e)))
		return rc;
	/* the host arrays are reused by the next layer: the copies must land first */
	return hp_cuda_sync(e);
}

static void ex_ptrs(struct hp_gmodel *g, const size_t *offs)
{
	for (int x = 0; x < g->s.n_experts; x++) {
		g->h_wptr[x] = WB(offs[x]);
		g->h_gptr[x] = G32(offs[x]);
	}
}

static int moe_fwd(struct hp_gmodel *g, struct glayer *a, struct hp_err *e)
{
	const struct hp_model_spec *s = &g->s;
	long N = g->N, R = N * s->top_k;
	int C = s->hidden, E = s->n_experts, K = s->top_k, Im = s->moe_intermediate, rc;

	if ((rc = hp_cuda_linear_fwd(a->probs, 1, a->xn2, WB(a->router), NULL, N, C, E, e)))
		return rc;
	hp_cuda_router_topk(a->probs, a->sel, a->wsel, a->probs, N, E, K, s->norm_topk_prob);
	if ((rc = route(g, a, e)))
		return rc;
	hp_cuda_gather_rows(g->xe, a->xn2, a->row_tok, R, C);
	ex_ptrs(g, a->ex_gu);
	if ((rc = hp_cuda_grouped_fwd(a->ge, g->xe, g->h_wptr, a->off, E, C, 2 * Im, e)))
		return rc;
	hp_cuda_swiglu_fwd(a->he, a->ge, R, Im);
	ex_ptrs(g, a->ex_d);
	if ((rc = hp_cuda_grouped_fwd(a->ye, a->he, g->h_wptr, a->off, E, Im, C, e)))
		return rc;
	hp_cuda_combine(g->mlp_out, a->ye, a->wsel, a->tok_row, N, K, C);
	return 0;
}

/* dout: bf16 [N,C] gradient of the MoE output; writes g->dxn */
static int moe_bwd(struct hp_gmodel *g, struct glayer *a, const hp_bf16 *dout, double aux_grad,
		   struct hp_err *e)
{
	const struct hp_model_spec *s = &g->s;
	long N = g->N, R = N * s->top_k;
	int C = s->hidden, E = s->n_experts, K = s->top_k, Im = s->moe_intermediate, rc;

	hp_cuda_combine_bwd(g->dye, g->dwsel, dout, a->ye, a->wsel, a->tok_row, N, K, C);
	ex_ptrs(g, a->ex_d);
	if ((rc = hp_cuda_grouped_bwd_dx(g->dhe, g->dye, g->h_wptr, a->off, E, Im, C, e)) ||
	    (rc = hp_cuda_grouped_bwd_dw(g->h_gptr, g->dye, a->he, a->off, E, Im, C, e)))
		return rc;
	hp_cuda_swiglu_bwd(g->dge, g->dhe, a->ge, R, Im);
	hp_cuda_gather_rows(g->xe, a->xn2, a->row_tok, R, C);
	ex_ptrs(g, a->ex_gu);
	if ((rc = hp_cuda_grouped_bwd_dx(g->dxe, g->dge, g->h_wptr, a->off, E, C, 2 * Im, e)) ||
	    (rc = hp_cuda_grouped_bwd_dw(g->h_gptr, g->dge, g->xe, a->off, E, C, 2 * Im, e)))
		return rc;
	hp_cuda_router_bwd(g->dprob, a->probs, a->sel, a->wsel, g->dwsel, aux_grad != 0 ? g->aux : NULL,
			   aux_grad, N, E, K, s->norm_topk_prob);
	if ((rc = hp_cuda_linear_bwd_dx(g->dxn, g->dprob, WB(a->router), N, C, E, 0, e)) ||
	    (rc = hp_cuda_linear_bwd_dw(G32(a->router), NULL, g->dprob, a->xn2, N, C, E, e)))
		return rc;
	hp_cuda_scatter_add_rows(g->dxn, g->dxe, a->tok_row, N, K, C);
	return 0;
}

int hp_gmodel_micro(struct hp_gmodel *g, const int32_t *ids, const int32_t *targets, const int32_t *seg,
		    double ce_scale, double aux_weight, double *loss_sum, long *count, double *aux,
		    struct hp_err *e)
{
	const struct hp_model_spec *s = &g->s;
	long N = g->N;
	int C = s->hidden, D = s->head_dim, QD = s->n_heads * D, KD = s->n_kv_heads * D, V = s->vocab;
	int I = s->intermediate, E = s->n_experts, Hq = s->n_heads, Hkv = s->n_kv_heads, rc;
	float eps = (float)s->rms_eps;
	size_t row = sizeof(float) * (size_t)N * C;
	const int32_t *dseg = seg ? g->seg : NULL;

	/* the micro-batch: ids, targets, segments, RoPE positions, and the
	 * tokens grouped by id for the embedding's deterministic backward */
	for (long n = 0; n < N; n++)
		g->h_pos[n] = (int32_t)(n % g->T) - (seg ? seg[n] : 0);
	int nu = hp_cuda_embedding_groups(g->h_order, g->h_starts, ids, N, s->pad_token_id);
	if ((rc = hp_cuda_upload(g->ids, ids, sizeof(int32_t) * (size_t)N, e)) ||
	    (rc = hp_cuda_upload(g->tgt, targets, sizeof(int32_t) * (size_t)N, e)) ||
	    (seg && (rc = hp_cuda_upload(g->seg, seg, sizeof(int32_t) * (size_t)N, e))) ||
	    (rc = hp_cuda_upload(g->pos, g->h_pos, sizeof(int32_t) * (size_t)N, e)) ||
	    (rc = hp_cuda_upload(g->order, g->h_order, sizeof(int32_t) * (size_t)N, e)) ||
	    (rc = hp_cuda_upload(g->starts, g->h_starts, sizeof(int32_t) * (size_t)(nu + 1), e)))
		return rc;
	if (g->n_moe)
		memset(g->h_F, 0, 2 * sizeof(double) * (size_t)E);

	/* ---- forward ---- */
	hp_cuda_embedding_fwd(g->L[0].x_in, g->ids, WB(g->embed), N, C);
	for (int l = 0; l < s->n_layers; l++) {
		struct glayer *a = &g->L[l];
		float *next = l + 1 < s->n_layers ? g->L[l + 1].x_in : g->x_final;

		hp_cuda_rmsnorm_fwd(a->xn1, a->rstd1, a->x_in, W32(a->in_norm), N, C, eps);
		if (s->qk_norm) {
			if ((rc = hp_cuda_linear_fwd(a->q_raw, 0, a->xn1, WB(a->wq), OPT32(a->bq), N, C, QD, e)) ||
			    (rc = hp_cuda_linear_fwd(a->k_raw, 0, a->xn1, WB(a->wk), OPT32(a->bk), N, C, KD, e)))
				return rc;
			hp_cuda_rmsnorm_fwd_bf16(a->q, a->rstd_q, a->q_raw, W32(a->q_norm), N * Hq, D, eps);
			hp_cuda_rmsnorm_fwd_bf16(a->k, a->rstd_k, a->k_raw, W32(a->k_norm), N * Hkv, D, eps);
		} else if ((rc = hp_cuda_linear_fwd(a->q, 0, a->xn1, WB(a->wq), OPT32(a->bq), N, C, QD, e)) ||
			   (rc = hp_cuda_linear_fwd(a->k, 0, a->xn1, WB(a->wk), OPT32(a->bk), N, C, KD, e))) {
			return rc;
		}
		if ((rc = hp_cuda_linear_fwd(a->v, 0, a->xn1, WB(a->wv), OPT32(a->bv), N, C, KD, e)))
			return rc;
		hp_cuda_rope_fwd(a->q, g->pos, g->cos_t, g->sin_t, N, Hq, D);
		hp_cuda_rope_fwd(a->k, g->pos, g->cos_t, g->sin_t, N, Hkv, D);
		hp_cuda_flash_fwd(a->att, a->lse, a->q, a->k, a->v, dseg, g->B, g->T, Hq, Hkv, D);
		if ((rc = hp_cuda_linear_fwd(g->mlp_out, 0, a->att, WB(a->wo), OPT32(a->bo), N, QD, C, e)))
			return rc;
		hp_cuda_copy(a->x_mid, a->x_in, row);
		hp_cuda_add_bf16(a->x_mid, g->mlp_out, (size_t)N * C);
		hp_cuda_rmsnorm_fwd(a->xn2, a->rstd2, a->x_mid, W32(a->post_norm), N, C, eps);
		if (a->moe) {
			if ((rc = moe_fwd(g, a, e)))
				return rc;
		} else {
			if ((rc = hp_cuda_linear_fwd(a->gu, 0, a->xn2, WB(a->wgu), NULL, N, C, 2 * I, e)))
				return rc;
			hp_cuda_swiglu_fwd(a->h, a->gu, N, I);
			if ((rc = hp_cuda_linear_fwd(g->mlp_out, 0, a->h, WB(a->wd), NULL, N, I, C, e)))
				return rc;
		}
		hp_cuda_copy(next, a->x_mid, row);
		hp_cuda_add_bf16(next, g->mlp_out, (size_t)N * C);
	}
	/* the load-balancing loss over every MoE layer (lib/model.c moe_aux) */
	double aux_grad = 0;
	*aux = 0;
	if (g->n_moe && s->output_router_logits) {
		double n = (double)N * g->n_moe;
		for (int x = 0; x < E; x++) {
			g->h_F[x] /= n;
			*aux += g->h_F[x] * (g->h_P[x] / n);
			g->h_aux[x] = (float)g->h_F[x];
		}
		*aux *= E;
		aux_grad = aux_weight * s->router_aux_loss_coef * E / n;
		if ((rc = hp_cuda_upload(g->aux, g->h_aux, sizeof(float) * (size_t)E, e)))
			return rc;
	}
	hp_cuda_rmsnorm_fwd(g->xf, g->rstd_f, g->x_final, W32(g->final_norm), N, C, eps);
	/* the LM head and cross-entropy chunk by chunk, the head's gradients with them */
	*loss_sum = 0;
	*count = 0;
	for (long c0 = 0; c0 < N; c0 += g->chunk) {
		long n = N - c0 < g->chunk ? N - c0 : g->chunk;

		if ((rc = hp_cuda_linear_fwd(g->logits, 1, g->xf + c0 * C, WB(g->lm_head), NULL, n, C, V, e)))
			return rc;
		hp_cuda_ce_fwd_bwd(g->loss_rows, g->dlogits, g->logits, g->tgt + c0, n, V, (float)ce_scale);
		if ((rc = hp_cuda_linear_bwd_dx(g->dxn + c0 * C, g->dlogits, WB(g->lm_head), n, C, V, 0, e)) ||
		    (rc = hp_cuda_linear_bwd_dw(G32(g->lm_head), NULL, g->dlogits, g->xf + c0 * C, n, C, V, e)) ||
		    (rc = hp_cuda_download(g->h_loss, g->loss_rows, sizeof(float) * (size_t)n, e)))
			return rc;
		for (long i = 0; i < n; i++)
			if (targets[c0 + i] != HP_IGNORE_INDEX) {
				*loss_sum += g->h_loss[i];
				(*count)++;
			}
	}

	/* ---- backward ---- */
	hp_cuda_rmsnorm_bwd(g->dx, G32(g->final_norm), g->dxn, g->x_final, W32(g->final_norm), g->rstd_f,
			    N, C, 0);
	for (int l = s->n_layers - 1; l >= 0; l--) {
		struct glayer *a = &g->L[l];

		hp_cuda_f32_to_bf16(g->dyb, g->dx, (size_t)N * C);
		if (a->moe) {
			if ((rc = moe_bwd(g, a, g->dyb, aux_grad, e)))
				return rc;
		} else {
			if ((rc = hp_cuda_linear_bwd_dx(g->dh, g->dyb, WB(a->wd), N, I, C, 0, e)) ||
			    (rc = hp_cuda_linear_bwd_dw(G32(a->wd), NULL, g->dyb, a->h, N, I, C, e)))
				return rc;
			hp_cuda_swiglu_bwd(g->dgu, g->dh, a->gu, N, I);
			if ((rc = hp_cuda_linear_bwd_dx(g->dxn, g->dgu, WB(a->wgu), N, C, 2 * I, 0, e)) ||
			    (rc = hp_cuda_linear_bwd_dw(G32(a->wgu), NULL, g->dgu, a->xn2, N, C, 2 * I, e)))
				return rc;
		}
		hp_cuda_rmsnorm_bwd(g->dx, G32(a->post_norm), g->dxn, a->x_mid, W32(a->post_norm), a->rstd2,
				    N, C, 1);
		/* attention: x_mid = x_in + o_proj(attn(q, k, v)) */
		hp_cuda_f32_to_bf16(g->dyb, g->dx, (size_t)N * C);
		if ((rc = hp_cuda_linear_bwd_dx(g->datt, g->dyb, WB(a->wo), N, QD, C, 0, e)) ||
		    (rc = hp_cuda_linear_bwd_dw(G32(a->wo), OPTG(a->bo), g->dyb, a->att, N, QD, C, e)))
			return rc;
		hp_cuda_flash_bwd(g->dq, g->dk, g->dv, g->datt, a->att, a->lse, a->q, a->k, a->v, dseg,
				  g->fscratch, g->B, g->T, Hq, Hkv, D);
		hp_cuda_rope_bwd(g->dq, g->pos, g->cos_t, g->sin_t, N, Hq, D);
		hp_cuda_rope_bwd(g->dk, g->pos, g->cos_t, g->sin_t, N, Hkv, D);
		const hp_bf16 *dqp = g->dq, *dkp = g->dk;
		if (s->qk_norm) {
			hp_cuda_rmsnorm_bwd_bf16(g->dq2, G32(a->q_norm), g->dq, a->q_raw, W32(a->q_norm), a->rstd_q,
						 N * Hq, D);
			hp_cuda_rmsnorm_bwd_bf16(g->dk2, G32(a->k_norm), g->dk, a->k_raw, W32(a->k_norm), a->rstd_k,
						 N * Hkv, D);
			dqp = g->dq2;
			dkp = g->dk2;
		}
		if ((rc = hp_cuda_linear_bwd_dx(g->dxn, dqp, WB(a->wq), N, C, QD, 0, e)) ||
		    (rc = hp_cuda_linear_bwd_dx(g->dxn, dkp, WB(a->wk), N, C, KD, 1, e)) ||
		    (rc = hp_cuda_linear_bwd_dx(g->dxn, g->dv, WB(a->wv), N, C, KD, 1, e)) ||
		    (rc = hp_cuda_linear_bwd_dw(G32(a->wq), OPTG(a->bq), dqp, a->xn1, N, C, QD, e)) ||
		    (rc = hp_cuda_linear_bwd_dw(G32(a->wk), OPTG(a->bk), dkp, a->xn1, N, C, KD, e)) ||
		    (rc = hp_cuda_linear_bwd_dw(G32(a->wv), OPTG(a->bv), g->dv, a->xn1, N, C, KD, e)))
			return rc;
		hp_cuda_rmsnorm_bwd(g->dx, G32(a->in_norm), g->dxn, a->x_in, W32(a->in_norm), a->rstd1, N, C, 1);
	}
	hp_cuda_embedding_bwd(G32(g->embed), g->dx, g->ids, g->order, g->starts, nu, N, C);
	return hp_cuda_check(e);
}

int hp_gmodel_grad_norm(struct hp_gmodel *g, double *norm, struct hp_err *e)
{
	double ss = 0;
	int rc = hp_cuda_sumsq(&ss, g->g32, g->numel, e);

	*norm = sqrt(ss);
	return rc;
}

int hp_gmodel_step(struct hp_gmodel *g, const struct hp_optim *o, double norm, struct hp_err *e)
{
	const struct hp_model *m = g->m;

	if (o->max_grad_norm > 0) {
		float coef = (float)(o->max_grad_norm / (norm + 1e-6));   /* as hp_clip_grads */
		if (coef < 1.0f)
			hp_cuda_scale(g->g32, coef, g->numel);
	}
	/* one launch per run of parameters alike in weight decay, not one per
	 * parameter (tens of thousands for a large MoE): the 16-float padding
	 * between them is zero in the weights, gradients and moments, and
	 * AdamW keeps it zero */
	for (int i = 0, j; i < m->nparams; i = j) {
		const struct hp_param *p = &m->params[i];

		for (j = i + 1; j < m->nparams && m->params[j].decay == p->decay; j++)
			;
		size_t n = m->params[j - 1].offset + m->params[j - 1].numel - p->offset;
		hp_cuda_adamw(g->w32 + p->offset, g->wb + p->offset, g->g32 + p->offset, g->m1 + p->offset,
			      g->m2 + p->offset, n, o->hp.lr, o->hp.beta1, o->hp.beta2, o->hp.eps,
			      o->hp.weight_decay, o->hp.step, p->decay);
	}
	return hp_cuda_check(e);
}

int hp_gmodel_download(struct hp_gmodel *g, struct hp_model *m, struct hp_optim *o, int with_grads,
		       struct hp_err *e)
{
	int rc = hp_cuda_download(m->flat_w, g->w32, sizeof(float) * g->numel, e);

	if (!rc && with_grads)
		rc = hp_cuda_download(m->flat_g, g->g32, sizeof(float) * g->numel, e);
	if (!rc && o && o->m)
		rc = hp_cuda_download(o->m, g->m1, sizeof(float) * g->numel, e);
	if (!rc && o && o->v)
		rc = hp_cuda_download(o->v, g->m2, sizeof(float) * g->numel, e);
	return rc;
}

#endif
