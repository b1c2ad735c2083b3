/*
 * test-gmodel.c - lib/gmodel.c's training step, checked on any machine.
 *
 * gmodel.c is compiled into this test against a host emulation of the
 * CUDA op interface (kernels/cuda/ops.h) built from the CPU reference
 * kernels: every "device" buffer is host memory, and every buffer the
 * model reads as bf16 has an fp32 shadow the emulated ops compute in.
 * With rounding off (exact mode) the emulated GPU step must give the CPU
 * model's losses, gradients and weights to float rounding: that checks
 * what gmodel.c adds - the flat offsets, the order of the ops, the fused
 * gate|up GEMMs, routing and grouping, the aux loss, the chunked LM head,
 * the embedding's grouped backward, clipping and AdamW - independently of
 * the CUDA kernels, which t/unit/test-cuda*.c check against the same CPU
 * references on a GPU.  With every bf16 store rounded (bf16 mode) the
 * losses must stay within the 1e-2 the GPU run is held to.
 */
#ifndef HP_HAVE_CUDA
#define HP_HAVE_CUDA 1   /* gmodel.c's real body, whatever this build has */
#endif
#include "../../lib/gmodel.c"

#include <stdio.h>

#include "dtype.h"
#include "hfconfig.h"
#include "tap.h"

/* ---- the emulated device ---- */

static int emu_bf16;   /* round every bf16 store */

struct emu_alloc { char *p; size_t n; float *shadow; };
static struct emu_alloc allocs[4096];
static int nallocs;

static float rnd(float f)
{
	return emu_bf16 ? hp_bf16_to_f32(hp_f32_to_bf16(f)) : f;
}

/* the fp32 shadow of bf16 element p */
static float *F(const void *p)
{
	const char *c = p;

	for (int i = nallocs - 1; i >= 0; i--)
		if (c >= allocs[i].p && c < allocs[i].p + allocs[i].n)
			return allocs[i].shadow + (c - allocs[i].p) / 2;
	fprintf(stderr, "emu: %p is no device buffer\n", p);
	abort();
}

static void round_out(const void *p, size_t n)
{
	float *f = F(p);

	for (size_t i = 0; i < n; i++)
		f[i] = rnd(f[i]);
}

int hp_cuda_device_count(void) { return 1; }
int hp_cuda_device_name(int dev, char *buf, unsigned long n, struct hp_err *e)
{
	snprintf(buf, n, "host emulation");
	return 0;
}
int hp_cuda_init(int dev, struct hp_err *e) { return 0; }
void hp_cuda_fini(void) {}
void *hp_cuda_stream(void) { return NULL; }
int hp_cuda_sync(struct hp_err *e) { return 0; }
int hp_cuda_check(struct hp_err *e) { return 0; }
void *hp_cuda_alloc(size_t bytes, struct hp_err *e)
{
	struct emu_alloc *a = &allocs[nallocs];

	if (nallocs == (int)(sizeof(allocs) / sizeof(allocs[0])))
		return NULL;
	a->n = bytes ? bytes : 1;
	a->p = calloc(1, a->n);
	a->shadow = calloc(a->n / 2 + 1, sizeof(float));
	if (!a->p || !a->shadow) {
		hp_err_set(e, HP_ENOMEM, "emu: out of memory");
		return NULL;
	}
	nallocs++;
	return a->p;
}
void hp_cuda_free(void *p) { (void)p; }
int hp_cuda_upload(void *dst, const void *src, size_t bytes, struct hp_err *e)
{
	memcpy(dst, src, bytes);
	return 0;
}
int hp_cuda_download(void *dst, const void *src, size_t bytes, struct hp_err *e)
{
	memcpy(dst, src, bytes);
	return 0;
}
void hp_cuda_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
void hp_cuda_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
int hp_cuda_reserve(int max_cols, struct hp_err *e) { return 0; }
int hp_cuda_mem_info(size_t *f, size_t *t, struct hp_err *e) { *f = *t = (size_t)1 << 34; return 0; }

void hp_cuda_f32_to_bf16(hp_bf16 *y, const float *x, size_t n)
{
	float *o = F(y);
	for (size_t i = 0; i < n; i++)
		o[i] = rnd(x[i]);
}
void hp_cuda_add_bf16(float *h, const hp_bf16 *o, size_t n)
{
	const float *f = F(o);
	for (size_t i = 0; i < n; i++)
		h[i] += f[i];
}
void hp_cuda_scale(float *x, float s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] *= s;
}
int hp_cuda_sumsq(double *out, const float *x, size_t n, struct hp_err *e)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += (double)x[i] * x[i];
	*out = s;
	return 0;
}
void hp_cuda_embedding_fwd(float *out, const int32_t *ids, const hp_bf16 *table, long N, int C)
{
	hp_embedding_fwd(out, ids, F(table), N, C);
}
void hp_cuda_embedding_bwd(float *dtable, const float *dout, const int32_t *ids, const int32_t *order,
			   const int32_t *starts, int nu, long N, int C)
{
	for (int u = 0; u < nu; u++)
		for (int32_t j = starts[u]; j < starts[u + 1]; j++)
			for (int c = 0; c < C; c++)
				dtable[(long)ids[order[j]] * C + c] += dout[(long)order[j] * C + c];
}
void hp_cuda_rmsnorm_fwd(hp_bf16 *y, float *rstd, const float *x, const float *w, long N, int C, float eps)
{
	hp_rmsnorm_fwd(F(y), rstd, x, w, N, C, eps);
	round_out(y, (size_t)N * C);
}
void hp_cuda_rmsnorm_bwd(float *dx, float *dw, const hp_bf16 *dy, const float *x, const float *w,
			 const float *rstd, long N, int C, int accumulate)
{
	hp_rmsnorm_bwd(dx, dw, F(dy), x, w, rstd, N, C, accumulate);
}
void hp_cuda_rmsnorm_fwd_bf16(hp_bf16 *y, float *rstd, const hp_bf16 *x, const float *w, long N, int C, float eps)
{
	hp_rmsnorm_fwd(F(y), rstd, F(x), w, N, C, eps);
	round_out(y, (size_t)N * C);
}
void hp_cuda_rmsnorm_bwd_bf16(hp_bf16 *dx, float *dw, const hp_bf16 *dy, const hp_bf16 *x, const float *w,
			      const float *rstd, long N, int C)
{
	hp_rmsnorm_bwd(F(dx), dw, F(dy), F(x), w, rstd, N, C, 0);
	round_out(dx, (size_t)N * C);
}
void hp_cuda_rope_fwd(hp_bf16 *x, const int32_t *pos, const float *c, const float *s, long N, int H, int D)
{
	hp_rope_fwd(F(x), pos, c, s, N, H, D);
	round_out(x, (size_t)N * H * D);
}
void hp_cuda_rope_bwd(hp_bf16 *x, const int32_t *pos, const float *c, const float *s, long N, int H, int D)
{
	hp_rope_bwd(F(x), pos, c, s, N, H, D);
	round_out(x, (size_t)N * H * D);
}
void hp_cuda_swiglu_fwd(hp_bf16 *h, const hp_bf16 *gu, long rows, int I)
{
	hp_swiglu_rows_fwd(F(h), F(gu), rows, I);
	round_out(h, (size_t)rows * I);
}
void hp_cuda_swiglu_bwd(hp_bf16 *dgu, const hp_bf16 *dh, const hp_bf16 *gu, long rows, int I)
{
	hp_swiglu_rows_bwd(F(dgu), F(dh), F(gu), rows, I);
	round_out(dgu, (size_t)rows * 2 * I);
}
int hp_cuda_linear_fwd(void *y, int y_f32, const hp_bf16 *x, const hp_bf16 *W, const float *b,
		       long N, int K, int O, struct hp_err *e)
{
	hp_linear_fwd_ref(y_f32 ? y : F(y), F(x), F(W), b, N, K, O);
	if (!y_f32)
		round_out(y, (size_t)N * O);
	return 0;
}
int hp_cuda_linear_bwd_dx(hp_bf16 *dx, const hp_bf16 *dy, const hp_bf16 *W, long N, int K, int O,
			  int accumulate, struct hp_err *e)
{
	float *d = F(dx);
	const float *g = F(dy), *w = F(W);

	for (long n = 0; n < N; n++)
		for (int k = 0; k < K; k++) {
			double s = 0;
			for (int o = 0; o < O; o++)
				s += (double)g[n * O + o] * w[(long)o * K + k];
			d[n * K + k] = rnd(accumulate ? d[n * K + k] + (float)s : (float)s);
		}
	return 0;
}
int hp_cuda_linear_bwd_dw(float *dW, float *db, const hp_bf16 *dy, const hp_bf16 *x, long N, int K, int O,
			  struct hp_err *e)
{
	const float *g = F(dy), *a = F(x);

	for (int o = 0; o < O; o++) {
		for (int k = 0; k < K; k++) {
			double s = 0;
			for (long n = 0; n < N; n++)
				s += (double)g[n * O + o] * a[n * K + k];
			dW[(long)o * K + k] += (float)s;
		}
		if (db) {
			double s = 0;
			for (long n = 0; n < N; n++)
				s += g[n * O + o];
			db[o] += (float)s;
		}
	}
	return 0;
}
int hp_cuda_grouped_fwd(hp_bf16 *y, const hp_bf16 *x, const hp_bf16 *const *W, const int32_t *off, int ng,
			int K, int O, struct hp_err *e)
{
	for (int q = 0; q < ng; q++)
		if (off[q + 1] > off[q])
			hp_cuda_linear_fwd(y + (long)off[q] * O, 0, x + (long)off[q] * K, W[q], NULL,
					   off[q + 1] - off[q], K, O, e);
	return 0;
}
int hp_cuda_grouped_bwd_dx(hp_bf16 *dx, const hp_bf16 *dy, const hp_bf16 *const *W, const int32_t *off,
			   int ng, int K, int O, struct hp_err *e)
{
	for (int q = 0; q < ng; q++)
		if (off[q + 1] > off[q])
			hp_cuda_linear_bwd_dx(dx + (long)off[q] * K, dy + (long)off[q] * O, W[q],
					      off[q + 1] - off[q], K, O, 0, e);
	return 0;
}
int hp_cuda_grouped_bwd_dw(float *const *dW, const hp_bf16 *dy, const hp_bf16 *x, const int32_t *off, int ng,
			   int K, int O, struct hp_err *e)
{
	for (int q = 0; q < ng; q++)
		if (off[q + 1] > off[q])
			hp_cuda_linear_bwd_dw(dW[q], NULL, dy + (long)off[q] * O, x + (long)off[q] * K,
					      off[q + 1] - off[q], K, O, e);
	return 0;
}
/* the CPU model's router (kernels/cpu/router.c) */
void hp_cuda_router_topk(float *probs, int32_t *sel, float *wsel, const float *logits, long N, int E, int K,
			 int norm)
{
	memmove(probs, logits, sizeof(float) * (size_t)N * E);
	hp_router_topk(probs, sel, wsel, N, E, K, norm);
}
void hp_cuda_router_bwd(hp_bf16 *dlogits, const float *probs, const int32_t *sel, const float *wsel,
			const float *dwsel, const float *aux, double aux_grad, long N, int E, int K, int norm)
{
	double *ad = calloc((size_t)E, sizeof(double));

	for (int x = 0; aux && x < E; x++)
		ad[x] = aux[x];
	hp_router_bwd(F(dlogits), probs, sel, wsel, dwsel, ad, aux ? aux_grad : 0, N, E, K, norm);
	round_out(dlogits, (size_t)N * E);
	free(ad);
}
void hp_cuda_gather_rows(hp_bf16 *xs, const hp_bf16 *x, const int32_t *row_tok, long R, int C)
{
	for (long r = 0; r < R; r++)
		memcpy(F(xs + r * C), F(x + (long)row_tok[r] * C), sizeof(float) * (size_t)C);
}
void hp_cuda_combine(hp_bf16 *out, const hp_bf16 *ye, const float *wsel, const int32_t *tok_row, long N, int K,
		     int C)
{
	float *o = F(out);
	const float *y = F(ye);

	for (long t = 0; t < N; t++)
		for (int c = 0; c < C; c++) {
			float s = 0;
			for (int j = 0; j < K; j++)
				s += y[(long)tok_row[t * K + j] * C + c] * wsel[t * K + j];
			o[t * C + c] = rnd(s);
		}
}
void hp_cuda_combine_bwd(hp_bf16 *dye, float *dwsel, const hp_bf16 *dout, const hp_bf16 *ye, const float *wsel,
			 const int32_t *tok_row, long N, int K, int C)
{
	float *dy = F(dye);
	const float *d = F(dout), *y = F(ye);

	for (long t = 0; t < N; t++)
		for (int j = 0; j < K; j++) {
			long r = tok_row[t * K + j];
			double dot = 0;
			for (int c = 0; c < C; c++) {
				dy[r * C + c] = rnd(d[t * C + c] * wsel[t * K + j]);
				dot += (double)d[t * C + c] * y[r * C + c];
			}
			dwsel[t * K + j] = (float)dot;
		}
}
void hp_cuda_scatter_add_rows(hp_bf16 *dx, const hp_bf16 *dxe, const int32_t *tok_row, long N, int K, int C)
{
	float *d = F(dx);
	const float *x = F(dxe);

	for (long t = 0; t < N; t++)
		for (int c = 0; c < C; c++) {
			float s = d[t * C + c];
			for (int j = 0; j < K; j++)
				s += x[(long)tok_row[t * K + j] * C + c];
			d[t * C + c] = rnd(s);
		}
}
int hp_cuda_flash_supports(int D) { return D >= 1 && D <= HP_CUDA_ATTN_MAX_HEAD_DIM; }
size_t hp_cuda_flash_scratch(int B, int T, int Hq) { return 0; }
static float *fscr;
void hp_cuda_flash_fwd(hp_bf16 *out, float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
		       const int32_t *seg, int B, int T, int Hq, int Hkv, int D)
{
	hp_flash_attention_fwd(F(out), lse, F(q), F(k), F(v), seg, B, T, Hq, Hkv, D);
	round_out(out, (size_t)B * T * Hq * D);
}
void hp_cuda_flash_bwd(hp_bf16 *dq, hp_bf16 *dk, hp_bf16 *dv, const hp_bf16 *dout, const hp_bf16 *out,
		       const float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v, const int32_t *seg,
		       float *scratch, int B, int T, int Hq, int Hkv, int D)
{
	hp_flash_attention_bwd(F(dq), F(dk), F(dv), F(dout), F(out), lse, F(q), F(k), F(v), seg, fscr,
			       B, T, Hq, Hkv, D);
	round_out(dq, (size_t)B * T * Hq * D);
	round_out(dk, (size_t)B * T * Hkv * D);
	round_out(dv, (size_t)B * T * Hkv * D);
}
void hp_cuda_ce_fwd_bwd(float *loss, hp_bf16 *dlogits, const float *logits, const int32_t *targets, long n, int V,
			float scale)
{
	float *d = F(dlogits);

	for (long r = 0; r < n; r++) {
		double ls = 0;
		long cnt;

		if (hp_cross_entropy_fwd(&ls, &cnt, logits + r * V, targets + r, 1, V))
			ls = NAN;
		loss[r] = (float)ls;
		hp_cross_entropy_bwd(d + r * V, logits + r * V, targets + r, 1, V, scale);
	}
	round_out(dlogits, (size_t)n * V);
}
void hp_cuda_adamw(float *w, hp_bf16 *wb, const float *g, float *m, float *v, size_t n, double lr, double beta1,
		   double beta2, double eps, double weight_decay, long step, int decay)
{
	struct hp_adamw_hparams h = { lr, beta1, beta2, eps, weight_decay, step };
	float *o = F(wb);

	hp_adamw_step(w, g, m, v, n, &h, decay);
	for (size_t i = 0; i < n; i++)
		o[i] = rnd(w[i]);
}

/* ---- the test ---- */

/*
 * Why the bounds are what they are.  The flat vectors of the two models
 * hold the same tensors at the same offsets, so gradients are compared
 * tensor by tensor with tap_rel_l2_parts: each against its own norm, or
 * against the norm it would have at the model's typical gradient element
 * where cancellation left it smaller (a bias whose terms nearly cancel,
 * such as k_proj's: softmax would ignore its shift of a query's scores but
 * for RoPE's rotation).  Exact mode differs from the CPU model in summation
 * order only, as in test-modelk: independent roundings add like a random
 * walk, sqrt(n) u for n terms summed (u = 2^-24), and an element's chain
 * sums at most a few thousand terms in all (V 64 or 512, hidden 32 or 64,
 * intermediate up to 172, up to 64 keys times the GQA group and B*T
 * tokens for a weight, over 2 to 5 layers): about 50 u = 3e-6, so 1e-5
 * per tensor.  The losses are sums of non-negative terms (cross-entropy,
 * aux loss), so relative to themselves; a logit carries the forward's part
 * of the same estimate, which the loss averages over the B*T targets, and
 * the later steps' losses the weights' difference below: 1e-5.
 *
 * The weights are compared as one flat vector.  AdamW's step is
 * lr m / sqrt(v), a ratio whose relative error is about twice the
 * gradient's, so where a gradient is well above its rounding the weights
 * differ by at most lr x steps x 2e-5 = 6e-8, about 1e-6 of weights of
 * rms 0.06 to 0.18; but where a gradient element is within its rounding
 * of zero its sign is noise and AdamW moves it by lr either way, 2 lr =
 * 2e-3 apart whatever the noise's size.  Per tensor that measures AdamW, not gmodel.c; over the
 * whole model (norms 22 to 91) one such element is 2e-5 to 9e-5, so 1e-4
 * admits about one of them, and a wrong update (lr on many elements) fails.
 *
 * bf16 mode rounds every bf16 store to 8 mantissa bits (u_bf16 = 2^-9 =
 * 2e-3 a rounding, a random walk over some tens of stores along a chain):
 * the losses to the 1e-2 the GPU run is held to, the gradients and the
 * weights to 5e-2.
 */
/* steps of B x T tokens, the CPU model against the emulated GPU one; the
 * largest relative loss difference, the step-1 gradients' per tensor and
 * the final weights' over the whole model */
static void run(const char *dir, int B, int T, int packed, int steps, int bf16, double tol_loss, double tol_g,
		double tol_w)
{
	struct hp_model_spec s;
	struct hp_model cpu, host;
	struct hp_gmodel *g = NULL;
	struct hp_optim o1, o2;
	struct hp_err e;
	long N = (long)B * T;
	int32_t *ids = malloc(sizeof(int32_t) * N), *tg = malloc(sizeof(int32_t) * N), *seg = malloc(sizeof(int32_t) * N);
	double worst = 0, gerr = 0;
	int gworst = 0;
	size_t *off = NULL, *len = NULL;
	char path[4096];

	emu_bf16 = bf16;
	snprintf(path, sizeof(path), "%s/%s", getenv("HP_SRC_DIR") ? getenv("HP_SRC_DIR") : ".", dir);
	if (hp_hfconfig_load(&s, path, &e) || hp_model_init(&cpu, &s, B, T, &e) || hp_model_load_hf(&cpu, path, &e) ||
	    hp_model_init(&host, &s, 1, 1, &e) || hp_model_load_hf(&host, path, &e)) {
		ok(0, "%s: load: %s", dir, e.msg);
		return;
	}
	off = malloc(sizeof(size_t) * (size_t)cpu.nparams);
	len = malloc(sizeof(size_t) * (size_t)cpu.nparams);
	for (int i = 0; i < cpu.nparams; i++) {
		off[i] = cpu.params[i].offset;
		len[i] = cpu.params[i].numel;
	}
	memset(&o1, 0, sizeof(o1));
	o1.hp = (struct hp_adamw_hparams){ 1e-3, 0.9, 0.95, 1e-8, 0.1, 0 };
	o1.max_grad_norm = 1.0;
	o2 = o1;
	o1.m = calloc(cpu.numel, 4);
	o1.v = calloc(cpu.numel, 4);
	for (int i = 0; i < cpu.nparams; i++)
		host.params[i].decay = cpu.params[i].decay = cpu.params[i].ndim > 1;
	if (hp_gmodel_init(&g, &host, NULL, 0, B, T, T + 3, &e)) {
		ok(0, "%s: gmodel init: %s", dir, e.msg);
		return;
	}
	/* the estimate gpu-bench sizes its stack by is the arena, to the byte */
	size_t arena = hp_gmodel_bytes(g), est = hp_gmodel_bytes_for(&s, B, T, T + 3);
	fscr = malloc(sizeof(float) * (hp_flash_attention_scratch(T, s.n_heads, s.head_dim) + 1));
	for (int st = 1; st <= steps; st++) {
		double l1 = 0, l2 = 0, aux1 = 0, aux2 = 0, n1, n2;
		long c1, c2;
		uint32_t x = 12345u + (unsigned)st;

		for (long n = 0; n < N; n++) {
			x = x * 1664525u + 1013904223u;
			ids[n] = (int32_t)((x >> 8) % (unsigned)s.vocab);
			tg[n] = (n % 11 == 5) ? HP_IGNORE_INDEX : (int32_t)((x >> 4) % (unsigned)s.vocab);
			seg[n] = packed ? (int32_t)((n % T) / (T / 3 + 1) * (T / 3 + 1)) : 0;
		}
		double total = 0;
		for (long n = 0; n < N; n++)
			total += tg[n] != HP_IGNORE_INDEX;
		hp_model_zero_grad(&cpu);
		cpu.ce_scale = 1.0 / total;
		hp_model_forward(&cpu, ids, tg, packed ? seg : NULL, &l1, &c1);
		aux1 = cpu.aux_loss;
		hp_model_backward(&cpu, ids, tg, total, 1.0);
		n1 = hp_grad_norm(&cpu);
		hp_gmodel_zero_grad(g);
		if (hp_gmodel_micro(g, ids, tg, packed ? seg : NULL, 1.0 / total, 1.0, &l2, &c2, &aux2, &e) ||
		    hp_gmodel_grad_norm(g, &n2, &e)) {
			ok(0, "%s: step %d: %s", dir, st, e.msg);
			return;
		}
		if (st == 1) {
			hp_gmodel_download(g, &host, NULL, 1, &e);
			gerr = tap_rel_l2_parts(host.flat_g, cpu.flat_g, cpu.nparams, off, len, &gworst);
		}
		double L1 = l1 / total + s.router_aux_loss_coef * aux1, L2 = l2 / total + s.router_aux_loss_coef * aux2;
		double d = fabs(L2 - L1) / fabs(L1);
		if (d > worst)
			worst = d;
		if (c1 != c2)
			worst = INFINITY;
		hp_clip_grads(&cpu, n1, o1.max_grad_norm);
		hp_optim_step(&o1, &cpu, 1e-3);
		o2.step++;
		o2.hp.step = o2.step;
		o2.hp.lr = 1e-3;
		hp_gmodel_step(g, &o2, n2, &e);
	}
	hp_gmodel_download(g, &host, NULL, 0, &e);
	double werr = tap_rel_l2(host.flat_w, cpu.flat_w, cpu.numel, 0);
	int wworst;
	double tw = tap_rel_l2_parts(host.flat_w, cpu.flat_w, cpu.nparams, off, len, &wworst);

	tap_diag("largest one-tensor difference of the step-1 gradients: %s; of the final weights: %.2g (%s)",
		 cpu.params[gworst].name, tw, cpu.params[wworst].name);
	ok(worst <= tol_loss && gerr <= tol_g && werr <= tol_w && est == arena,
	   "%s B=%d T=%d%s, %s: %d steps: losses within %.2g relative (<= %g), step-1 gradients %.2g "
	   "relative L2 per tensor (<= %g), final weights %.2g over the model (<= %g); arena %zu bytes, "
	   "estimated %zu", dir, B, T, packed ? " packed" : "", bf16 ? "bf16 stores" : "exact", steps, worst,
	   tol_loss, gerr, tol_g, werr, tol_w, arena, est);
	hp_gmodel_free(g);
	hp_model_release(&cpu);
	hp_model_release(&host);
	free(o1.m);
	free(o1.v);
	free(ids);
	free(tg);
	free(seg);
	free(fscr);
	free(off);
	free(len);
}

/* what hp_gmodel_init refuses, with the key or layer named */
static void refusals(void)
{
	struct hp_model_spec s, s0;
	struct hp_model m;
	struct hp_gmodel *g = NULL;
	struct hp_err e;
	char path[4096];
	int rc;

	snprintf(path, sizeof(path), "%s/data/ref/qwen3-dense", getenv("HP_SRC_DIR") ? getenv("HP_SRC_DIR") : ".");
	if (hp_hfconfig_load(&s0, path, &e)) {
		ok(0, "qwen3-dense: %s", e.msg);
		return;
	}
	s = s0;
	s.head_dim = HP_CUDA_ATTN_MAX_HEAD_DIM + 4;
	rc = hp_model_init(&m, &s, 1, 1, &e) ? -1 : hp_gmodel_init(&g, &m, NULL, 0, 1, 8, 0, &e);
	ok(rc == HP_EUNSUP && !g && strstr(e.msg, "head_dim 260"), "head_dim 260: refused (%s)", e.msg);
	hp_model_release(&m);
	/* gate_proj and up_proj apart: [3, 20] is 60 floats, padded to 64 */
	s = s0;
	s.hidden = 20;
	s.intermediate = 3;
	rc = hp_model_init(&m, &s, 1, 1, &e) ? -1 : hp_gmodel_init(&g, &m, NULL, 0, 1, 8, 0, &e);
	ok(rc == HP_EUNSUP && strstr(e.msg, "layer 0: gate_proj and up_proj are not adjacent"),
	   "gate and up apart in the layout: refused (%s)", e.msg);
	hp_gmodel_free(g);
	hp_model_release(&m);
}

int main(void)
{
	refusals();
	/* exact: the same arithmetic as the CPU model up to summation order
	 * (fused gate|up GEMM, flash vs eager attention, chunked head) */
	run("data/ref/qwen3-moe-a", 2, 24, 0, 3, 0, 1e-5, 1e-5, 1e-4);
	run("data/ref/qwen3-moe-a", 1, 40, 1, 3, 0, 1e-5, 1e-5, 1e-4);
	run("data/ref/qwen3-dense", 2, 16, 0, 3, 0, 1e-5, 1e-5, 1e-4);
	run("data/stories260K/hf", 2, 32, 1, 3, 0, 1e-5, 1e-5, 1e-4);
	/* every RoPE type (the GPU reads the same table), a new family each */
	run("data/hf/tf5/llama-linear", 2, 32, 0, 3, 0, 1e-5, 1e-5, 1e-4);
	run("data/hf/tf5/mistral-dynamic", 2, 32, 0, 3, 0, 1e-5, 1e-5, 1e-4);
	run("data/hf/tf5/qwen3_moe-yarn", 2, 32, 0, 3, 0, 1e-5, 1e-5, 1e-4);
	run("data/hf/tf4/qwen2-llama3", 2, 32, 1, 3, 0, 1e-5, 1e-5, 1e-4);
	run("data/hf/tf5/llama-default-pad", 2, 32, 0, 3, 0, 1e-5, 1e-5, 1e-4);
	run("data/hf/tf5/qwen3_moe-yarn", 2, 32, 0, 3, 1, 1e-2, 5e-2, 5e-2);
	/* bf16 stores: the GPU's rounding points (bounds: above run()) */
	run("data/ref/qwen3-moe-a", 2, 24, 0, 3, 1, 1e-2, 5e-2, 5e-2);
	run("data/ref/qwen3-moe-a", 2, 32, 0, 5, 1, 1e-2, 5e-2, 5e-2);
	run("data/ref/qwen3-moe-a", 2, 64, 0, 20, 1, 1e-2, 5e-2, 5e-2);
	run("data/stories260K/hf", 2, 32, 1, 3, 1, 1e-2, 5e-2, 5e-2);
	return tap_done();
}
