/*
 * cuda_emu.c - the CUDA kernels of kernels/cuda/ops.h emulated on the host
 * (HP_CUDA_EMULATE=exact|bf16, hp-train(1)), so that the CUDA backend
 * (lib/backend/backend_cuda.c, compiled against these as hp_emu_*) runs its own
 * code - conversions to bf16 operands, working copies of the weights,
 * routing tables, host-staged collectives - in every build and in CI,
 * without a GPU.
 *
 * "Device" memory is host memory from hp_malloc, kept apart from the
 * host's arrays as a GPU's is: what the backend forgets to upload or
 * download shows.  hp_bf16 is a float here (cuda/ops.h with HP_CUDA_EMU),
 * the fp32 shadow of a bf16 value: every kernel that stores bf16 rounds
 * it to bf16 in bf16 mode, and keeps it as is in exact mode.
 *
 * Every kernel is the CPU kernel the CPU backend calls for the same op
 * (kernels/cpu, the op table hp_backend_cpu_ops()), with the same
 * arguments, so that in exact mode a step on the emulated GPU gives the
 * CPU's bits wherever the backend computes what the CPU does (it does
 * not where it rounds, where the GPU has no kernel of the CPU's kind: the
 * eager attention, context parallelism's chunk attention, the fused norm).
 * bf16 mode rounds inside flash attention where flashattn.cu's tensor
 * cores do (P before P V; P and dS in the backward), besides the stored
 * outputs.  What it does not emulate: streams and their overlap (every
 * call is done when it returns) and the GPU's own reduction orders.
 */
#define HP_CUDA_EMU 1   /* cuda/ops.h: the hp_emu_* names, hp_bf16 a float */

#include <limits.h>
#include <math.h>
#include <sys/mman.h>
#include <time.h>

#include "backend/backend.h"
#include "base/alloc.h"
#include "base/dtype.h"
#include "cpu/ops.h"
#include "cuda/ops.h"

static int round_on;

void hp_emu_round_bf16(int on)
{
	round_on = on;
}

int hp_emu_rounds(void)
{
	return round_on;
}

static float rnd(float f)
{
	return round_on ? hp_bf16_to_f32(hp_f32_to_bf16(f)) : f;
}

static void round_out(hp_bf16 *p, size_t n)
{
	for (size_t i = 0; round_on && i < n; i++)
		p[i] = rnd(p[i]);
}

static const struct hp_cpu_ops *ops(void)
{
	return hp_backend_cpu_ops();
}

/* ---- device, stream, memory ---- */

int hp_emu_device_count(void)
{
	return 1;
}

int hp_emu_device_name(int dev, char *buf, unsigned long n, struct hp_err *e)
{
	snprintf(buf, n, "host emulation (%s)", round_on ? "bf16" : "exact");
	return 0;
}

int hp_emu_init(int dev, struct hp_err *e)
{
	return 0;
}

void hp_emu_fini(void)
{
}

void *hp_emu_stream(void)
{
	return NULL;
}

int hp_emu_sync(struct hp_err *e)
{
	return 0;
}

int hp_emu_check(struct hp_err *e)
{
	return 0;
}

void *hp_emu_alloc(size_t bytes, struct hp_err *e)
{
	void *p = hp_zalloc_aligned(bytes ? bytes : 1);

	if (!p) {
		hp_err_set(e, HP_ENOMEM, "cuda (emulated): out of device memory for %zu MiB", bytes >> 20);
		return NULL;
	}
	return p;
}

void hp_emu_free(void *p)
{
	hp_free_aligned(p);
}

/* the GPU's granule, so that the emulation counts what a GPU maps */
#define EMU_GRANULE HP_CUDA_GRANULE

/* An address range with no access: a use of it faults, as a GPU's use of
 * unmapped memory does. */
void *hp_emu_vm_reserve(size_t bytes, size_t *granule, struct hp_err *e)
{
	size_t n = (bytes + EMU_GRANULE - 1) / EMU_GRANULE * EMU_GRANULE;
	void *p = mmap(NULL, n ? n : EMU_GRANULE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	*granule = EMU_GRANULE;
	if (p == MAP_FAILED) {
		hp_err_set(e, HP_ENOMEM, "cuda (emulated): cannot reserve %zu MiB of addresses", bytes >> 20);
		return NULL;
	}
	return p;
}

/* fresh pages: zero until written */
int hp_emu_vm_map(void *p, size_t bytes, struct hp_err *e)
{
	if (mprotect(p, bytes, PROT_READ | PROT_WRITE))
		return hp_err_set(e, HP_ENOMEM, "cuda (emulated): cannot map %zu MiB of device memory",
				  bytes >> 20);
	return 0;
}

void hp_emu_vm_unmap(void *p, size_t bytes)
{
	madvise(p, bytes, MADV_DONTNEED);
	mprotect(p, bytes, PROT_NONE);
}

void hp_emu_vm_free(void *p, size_t bytes)
{
	size_t n = (bytes + EMU_GRANULE - 1) / EMU_GRANULE * EMU_GRANULE;

	if (p)
		munmap(p, n ? n : EMU_GRANULE);
}

/* pinned memory is host memory; every call is done when it returns, so
 * every mark has passed */
void *hp_emu_host_alloc(size_t bytes, struct hp_err *e)
{
	void *p = hp_malloc(bytes ? bytes : 1);

	if (!p)
		hp_err_set(e, HP_ENOMEM, "cuda (emulated): out of memory for %zu bytes of pinned memory", bytes);
	return p;
}

void hp_emu_host_free(void *p)
{
	hp_free(p);
}

/* the host's clock at each mark, in milliseconds */
void *hp_emu_timer_new(int n, struct hp_err *e)
{
	double *t = hp_calloc((size_t)n, sizeof(double));

	if (!t)
		hp_err_set(e, HP_ENOMEM, "out of host memory for %d timing marks", n);
	return t;
}

void hp_emu_timer_free(void *t, int n)
{
	(void)n;
	hp_free(t);
}

void hp_emu_timer_mark(void *t, int i)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	((double *)t)[i] = ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

double hp_emu_timer_ms(void *t, int i, int j)
{
	return ((double *)t)[j] - ((double *)t)[i];
}

static int emu_mark;

void *hp_emu_mark_new(struct hp_err *e)
{
	(void)e;
	return &emu_mark;
}

void hp_emu_mark_free(void *mk)
{
	(void)mk;
}

int hp_emu_mark_record(void *mk, struct hp_err *e)
{
	(void)mk, (void)e;
	return 0;
}

int hp_emu_mark_passed(void *mk)
{
	(void)mk;
	return 1;
}

int hp_emu_mark_wait(void *mk, struct hp_err *e)
{
	(void)mk, (void)e;
	return 0;
}

int hp_emu_upload(void *dst, const void *src, size_t bytes, struct hp_err *e)
{
	memcpy(dst, src, bytes);
	return 0;
}

int hp_emu_download(void *dst, const void *src, size_t bytes, struct hp_err *e)
{
	memcpy(dst, src, bytes);
	return 0;
}

void hp_emu_zero(void *p, size_t bytes)
{
	memset(p, 0, bytes);
}

void hp_emu_copy(void *dst, const void *src, size_t bytes)
{
	memmove(dst, src, bytes);
}

void hp_emu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows)
{
	for (size_t r = 0; r < rows; r++)
		memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}

int hp_emu_reserve(int max_cols, struct hp_err *e)
{
	return 0;
}

/* HP_CUDA_EMULATE_MEMORY: the emulated GPU's memory (bytes, or with K, M,
 * G or T: powers of 1024); unset, 1 TiB */
int hp_emu_mem_info(size_t *free_b, size_t *total_b, struct hp_err *e)
{
	const char *s = getenv("HP_CUDA_EMULATE_MEMORY");
	char *end;
	double v;

	*free_b = *total_b = (size_t)1 << 40;
	if (!s || !*s)
		return 0;
	v = strtod(s, &end);
	switch (*end) {
	case 'T': v *= 1024; /* fall through */
	case 'G': v *= 1024; /* fall through */
	case 'M': v *= 1024; /* fall through */
	case 'K': v *= 1024; end++; break;
	default: break;
	}
	if (end == s || *end || !(v >= 1) || v > 1e18)
		return hp_err_set(e, HP_ECONFIG, "HP_CUDA_EMULATE_MEMORY=%s: expected the emulated GPU's memory, "
				  "as bytes or with K, M, G or T (80G)", s);
	*free_b = *total_b = (size_t)v;
	return 0;
}

/* ---- conversions and element-wise ---- */

void hp_emu_f32_to_bf16(hp_bf16 *y, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] = rnd(x[i]);
}

void hp_emu_bf16_to_f32(float *y, const hp_bf16 *x, size_t n)
{
	if ((const void *)y != (const void *)x)
		memmove(y, x, n * sizeof(float));
}

void hp_emu_add_bf16(float *h, const hp_bf16 *o, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h[i] += o[i];
}

/* hp_bf16_sum_ranks on the fp32 shadows: rounded once in bf16 mode */
void hp_emu_bf16_sum_ranks(hp_bf16 *out, const hp_bf16 *in, int k, size_t n, size_t s)
{
	for (size_t i = 0; i < n; i++) {
		float a = in[i];

		for (int r = 1; r < k; r++)
			a += in[(size_t)r * s + i];
		out[i] = rnd(a);
	}
}

void hp_emu_add(float *x, const float *a, const float *b, size_t n)
{
	hp_residual_add(x, a, b, (long)n);
}

void hp_emu_acc(float *x, const float *y, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] += y[i];
}

void hp_emu_add_bias(float *x, const float *b, long N, int C)
{
	hp_bias_add(x, b, N, C);
}

void hp_emu_colsum(float *db, const float *x, long N, int C)
{
	hp_bias_grad(db, x, N, C);
}

void hp_emu_max(float *x, const float *y, size_t n)
{
	hp_max_into(x, y, (long)n);
}

void hp_emu_add_f64(double *x, const double *y, size_t n)
{
	hp_add_into_f64(x, y, (long)n);
}

void hp_emu_scale(float *x, float s, size_t n)
{
	hp_scale(x, s, (long)n);
}

void hp_emu_clip_gate(float *g, size_t n, float *cg, const double *ss, const double *loss, const double *aux,
		      const int32_t *bad, double max_norm, int check)
{
	hp_clip_grads(g, n, cg, ss, loss, aux, bad, max_norm, check);
}

int hp_emu_sumsq(double *acc, const float *x, size_t n, struct hp_err *e)
{
	double ss = 0;

	for (size_t i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	*acc += ss;
	return 0;
}

/* ---- embedding ---- */

void hp_emu_embedding_fwd(float *out, const int32_t *ids, const float *table, long N, int C, int v0, int V)
{
	hp_embedding_fwd_range(out, ids, table, N, C, v0, V);
}

void hp_emu_embedding_bwd(float *dtable, const float *dout, const int32_t *ids, const int32_t *order,
			  const int32_t *starts, int nu, int C, int v0)
{
	for (int u = 0; u < nu; u++)
		for (int32_t j = starts[u]; j < starts[u + 1]; j++) {
			float *row = dtable + (long)(ids[order[j]] - v0) * C;
			const float *d = dout + (long)order[j] * C;

			for (int c = 0; c < C; c++)
				row[c] += d[c];
		}
}

/* ---- RMSNorm, RoPE, SwiGLU ---- */

void hp_emu_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int C, float eps)
{
	hp_rmsnorm_fwd(y, rstd, x, w, N, C, eps);
}

void hp_emu_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
			long N, int C, int accumulate)
{
	hp_rmsnorm_bwd(dx, dw, dy, x, w, rstd, N, C, accumulate);
}

void hp_emu_rope_fwd(float *x, const int32_t *pos, const float *cos_t, const float *sin_t, long N, int H, int ld,
		     int Dr, int inter)
{
	hp_rope_fwd(x, pos, cos_t, sin_t, N, H, ld, Dr, inter);
}

void hp_emu_rope_bwd(float *dx, const int32_t *pos, const float *cos_t, const float *sin_t, long N, int H, int ld,
		     int Dr, int inter)
{
	hp_rope_bwd(dx, pos, cos_t, sin_t, N, H, ld, Dr, inter);
}

void hp_emu_swiglu_fwd(float *h, const float *g, const float *u, size_t n)
{
	ops()->swiglu_fwd(h, g, u, (long)n);
}

void hp_emu_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n)
{
	ops()->swiglu_bwd(dg, du, dh, g, u, (long)n);
}

void hp_emu_swiglu_rows_fwd(float *h, const float *gu, long rows, int I)
{
	hp_swiglu_rows_fwd(h, gu, rows, I);
}

void hp_emu_swiglu_rows_bwd(float *dgu, const float *dh, const float *gu, long rows, int I)
{
	hp_swiglu_rows_bwd(dgu, dh, gu, rows, I);
}

/* ---- GPT-OSS ---- */

void hp_emu_sinks_fwd(float *out, float *lse, const float *sinks, int B, int T, int H, int D)
{
	hp_attn_sinks_fwd(out, lse, sinks, B, T, H, D);
}

void hp_emu_sinks_bwd(float *dsinks, const float *dout, const float *out, const float *lse, const float *sinks,
		      int B, int T, int H, int D)
{
	hp_attn_sinks_bwd(dsinks, dout, out, lse, sinks, B, T, H, D);
}

void hp_emu_glu_clamp_fwd(float *h, const float *g, const float *u, long ld, long rows, int I, float alpha,
			  float limit)
{
	hp_glu_clamp_fwd(h, g, u, ld, rows, I, alpha, limit);
}

void hp_emu_glu_clamp_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, long ld,
			  long rows, int I, float alpha, float limit)
{
	hp_glu_clamp_bwd(dg, du, dh, g, u, ld, rows, I, alpha, limit);
}

/* ---- Qwen3-Next / Qwen3.5 ---- */

void hp_emu_conv1d_silu_fwd(float *y, const float *x, const float *w, const int32_t *seg, int B, int T, int C, int K)
{
	hp_conv1d_silu_fwd(y, x, w, seg, B, T, C, K);
}

void hp_emu_conv1d_silu_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
			    const int32_t *seg, int B, int T, int C, int K)
{
	hp_conv1d_silu_bwd(dx, dw, dy, x, w, seg, B, T, C, K);
}

void hp_emu_l2norm_fwd(float *y, float *rinv, const float *x, long N, int D)
{
	hp_l2norm_fwd(y, rinv, x, N, D);
}

void hp_emu_l2norm_bwd(float *dx, const float *dy, const float *y, const float *rinv, long N, int D)
{
	hp_l2norm_bwd(dx, dy, y, rinv, N, D);
}

void hp_emu_gdn_gates_fwd(float *beta, float *g, const float *b, const float *a, const float *A_log,
			  const float *dt_bias, long N, int H)
{
	hp_gdn_gates_fwd(beta, g, b, a, A_log, dt_bias, N, H);
}

void hp_emu_gdn_gates_bwd(float *db, float *da, float *dA_log, float *ddt_bias, const float *dbeta, const float *dg,
			  const float *b, const float *a, const float *A_log, const float *dt_bias, long N, int H)
{
	hp_gdn_gates_bwd(db, da, dA_log, ddt_bias, dbeta, dg, b, a, A_log, dt_bias, N, H);
}

void hp_emu_rmsnorm_gated_fwd(float *y, float *rstd, const float *x, const float *z, const float *w, long N, int D,
			      float eps)
{
	hp_rmsnorm_gated_fwd(y, rstd, x, z, w, N, D, eps);
}

void hp_emu_rmsnorm_gated_bwd(float *dx, float *dz, float *dw, const float *dy, const float *x, const float *z,
			      const float *w, const float *rstd, long N, int D)
{
	hp_rmsnorm_gated_bwd(dx, dz, dw, dy, x, z, w, rstd, N, D);
}

void hp_emu_sigmoid_gate_fwd(float *y, const float *x, const float *gate, long n)
{
	hp_sigmoid_gate_fwd(y, x, gate, n);
}

void hp_emu_sigmoid_gate_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate, long n)
{
	hp_sigmoid_gate_bwd(dx, dgate, dy, x, gate, n);
}

void hp_emu_sigmoid_gate_rows_fwd(float *y, const float *x, const float *gate, long T, int C)
{
	hp_sigmoid_gate_rows_fwd(y, x, gate, T, C);
}

void hp_emu_sigmoid_gate_rows_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate,
				  long T, int C)
{
	hp_sigmoid_gate_rows_bwd(dx, dgate, dy, x, gate, T, C);
}

/* the CPU kernel on the device's scratch: B Hv units hold the CPU's
 * slots (at most B Hv of them, a unit each) */
void hp_emu_gdr_fwd(float *out, float *saved, const float *q, const float *k, const float *v, const float *g,
		    const float *beta, const int32_t *seg, float *scratch, size_t unit, int B, int T, int Hv, int Hk,
		    int Dk, int Dv, float scale)
{
	if (unit < hp_gdr_unit_floats(Dk, Dv)) {
		for (size_t i = 0, n = (size_t)B * T * Hv * Dv; i < n; i++)
			out[i] = NAN;
		return;
	}
	hp_gdr_fwd(out, saved, q, k, v, g, beta, seg, scratch, B, T, Hv, Hk, Dk, Dv, scale);
}

void hp_emu_gdr_bwd(float *dq, float *dk, float *dv, float *dg, float *dbeta, const float *dout, const float *saved,
		    const float *q, const float *k, const float *v, const float *g, const float *beta,
		    const int32_t *seg, float *scratch, size_t unit, int B, int T, int Hv, int Hk, int Dk, int Dv,
		    float scale)
{
	if (unit < hp_gdr_unit_floats(Dk, Dv)) {   /* gdn.cu's answer: every output NaN */
		size_t nt = (size_t)B * T;

		for (size_t i = 0; i < nt * Hk * Dk; i++)
			dq[i] = dk[i] = NAN;
		for (size_t i = 0; i < nt * Hv * Dv; i++)
			dv[i] = NAN;
		for (size_t i = 0; i < nt * Hv; i++)
			dg[i] = dbeta[i] = NAN;
		return;
	}
	hp_gdr_bwd(dq, dk, dv, dg, dbeta, dout, saved, q, k, v, g, beta, seg, scratch, B, T, Hv, Hk, Dk, Dv, scale);
}

void hp_emu_bias_grouped_fwd(float *x, long ld, const float *bias, size_t bs, const int32_t *off, int nx, int n,
			     long max_rows)
{
	(void)max_rows;
	hp_bias_grouped_fwd(x, ld, bias, bs, off, nx, n);
}

void hp_emu_bias_grouped_bwd(float *db, size_t bs, const float *dx, long ld, const int32_t *off, int nx, int n)
{
	hp_bias_grouped_bwd(db, bs, dx, ld, off, nx, n);
}

/* ---- GEMMs: the CPU op table's, on the bf16 operands ---- */

int hp_emu_linear_fwd(float *y, const hp_bf16 *x, const hp_bf16 *W, const float *b, long N, int K, int O,
		      struct hp_err *e)
{
	if (N > 0 && O > 0)
		ops()->linear_fwd(y, x, W, b, N, K, O);
	return 0;
}

int hp_emu_linear_bwd(float *dx, float *dW, float *db, const hp_bf16 *dy, const hp_bf16 *x, const hp_bf16 *W,
		      long N, int K, int O, int accumulate, struct hp_err *e)
{
	float *tmp = NULL;

	if (N <= 0)
		return 0;
	/* no dx wanted (the GPU skips it): the CPU kernel makes one anyway */
	if (!dx && !(dx = tmp = hp_malloc((size_t)N * K * sizeof(float) + 1)))
		return hp_err_set(e, HP_ENOMEM, "cuda (emulated): out of memory");
	ops()->linear_bwd(dx, dW, db, dy, x, W, N, K, O, tmp ? 0 : accumulate);
	hp_free(tmp);
	return 0;
}

/* ---- grouped experts: the linear layers, expert by expert ---- */

int hp_emu_grouped_fwd(float *y, const hp_bf16 *x, const hp_bf16 *W, size_t ws, const int32_t *off, int nx,
		       long R, int K, int O, struct hp_err *e)
{
	if (O > 0)
		hp_grouped_linear_fwd(ops()->linear_fwd, y, x, W, ws, off, nx, K, O);
	return 0;
}

int hp_emu_grouped_bwd(float *dx, float *dW, size_t gs, const hp_bf16 *dy, const hp_bf16 *x, const hp_bf16 *W,
		       size_t ws, const int32_t *off, int nx, long R, int K, int O, int accumulate, struct hp_err *e)
{
	float *tmp = NULL;

	/* no dx wanted (the GPU skips it): the CPU kernel makes one anyway */
	if (!dx && !(dx = tmp = hp_malloc((size_t)R * K * sizeof(float) + 1)))
		return hp_err_set(e, HP_ENOMEM, "cuda (emulated): out of memory");
	hp_grouped_linear_bwd(ops()->linear_bwd, dx, dW, gs, dy, x, W, ws, off, nx, K, O, tmp ? 0 : accumulate);
	hp_free(tmp);
	return 0;
}

/* ---- MoE ---- */

void hp_emu_moe_route(int32_t *off, int32_t *row_tok, int32_t *row_slot, int32_t *tok_rows, int32_t *bad,
		      int32_t *sel, long N, int E, int k)
{
	hp_moe_route(off, row_tok, row_slot, tok_rows, bad, sel, N, E, k);
}

void hp_emu_moe_aux_acc(double *FP, const float *probs, const int32_t *off, long N, int E)
{
	hp_moe_aux_acc(FP, probs, off, N, E);
}

void hp_emu_moe_aux_fin(double *FP, double *aux, double *acc, int E, double n, double div)
{
	hp_moe_aux_fin(FP, aux, acc, E, n, div);
}

void hp_emu_router_topk(float *probs, int32_t *sel, float *wsel, const float *logits, long N, int E, int k, int norm)
{
	if (probs != logits)
		memcpy(probs, logits, sizeof(float) * (size_t)N * E);
	hp_router_topk(probs, sel, wsel, N, E, k, norm);
}

void hp_emu_router_bwd(float *dlogits, const float *probs, const int32_t *sel, const float *wsel,
		       const float *dwsel, const double *aux, double aux_grad, long N, int E, int k, int norm)
{
	hp_router_bwd(dlogits, probs, sel, wsel, dwsel, aux, aux_grad, N, E, k, norm);
}

void hp_emu_router_group_fwd(float *probs, int32_t *sel, float *wsel, const float *bias, long N, int E, int K, int G,
			     int TG, int norm, float scale, int mask_zero)
{
	hp_router_group_fwd(probs, sel, wsel, bias, N, E, K, G, TG, norm, scale, mask_zero);
}

void hp_emu_router_group_bwd(float *dlogits, const float *probs, const int32_t *sel, const float *dwsel, long N,
			     int E, int K, int norm, float scale)
{
	hp_router_group_bwd(dlogits, probs, sel, dwsel, N, E, K, norm, scale);
}

void hp_emu_gather_rows(float *dst, const float *src, const int32_t *idx, long R, int C)
{
	hp_rows_gather(dst, src, idx, R, C);
}

void hp_emu_heads_bcast(float *dst, int ldd, const float *src, int lds, long N, int H, int w)
{
	hp_heads_bcast(dst, ldd, src, lds, N, H, w);
}

void hp_emu_heads_sum(float *dst, int ldd, const float *src, int lds, long N, int H, int w)
{
	hp_heads_sum(dst, ldd, src, lds, N, H, w);
}

void hp_emu_scatter_rows(float *dst, const float *src, const int32_t *idx, long R, int C)
{
	hp_rows_scatter(dst, src, idx, R, C);
}

void hp_emu_combine(float *out, const float *ye, const float *wsel, const int32_t *tok_rows, const int32_t *row_slot,
		    long N, int k, int C)
{
	memset(out, 0, sizeof(float) * (size_t)N * C);
	for (long t = 0; t < N; t++)
		for (int j = 0; j < k; j++) {
			long r = tok_rows[t * k + j];
			float wt = wsel[t * k + row_slot[r]];
			const float *y = ye + r * C;
			float *o = out + t * C;

			for (int c = 0; c < C; c++)
				o[c] += y[c] * wt;
		}
}

void hp_emu_combine_bwd(float *dye, float *dwsel, const float *dout, const float *ye, const float *wsel,
			const int32_t *row_tok, const int32_t *row_slot, long R, int k, int C)
{
	hp_moe_combine_bwd(dye, dwsel, dout, ye, wsel, row_tok, row_slot, R, k, C);
}

void hp_emu_scatter_add_rows(float *dx, const float *dxe, const int32_t *tok_rows, long N, int k, int C)
{
	for (long t = 0; t < N; t++)
		for (int j = 0; j < k; j++) {
			float *d = dx + t * C;
			const float *x = dxe + (long)tok_rows[t * k + j] * C;

			for (int c = 0; c < C; c++)
				d[c] += x[c];
		}
}

/* ---- attention: the CPU's flash kernel ---- */

int hp_emu_flash_supports(int D)
{
	return D >= 1 && D <= HP_CUDA_ATTN_MAX_HEAD_DIM && hp_flash_attention_supports(D);
}

void hp_emu_flash_fwd(hp_bf16 *out, float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
		      const int32_t *seg, int B, int T, int Hq, int Hkv, int D)
{
	(round_on ? hp_flash_attention_fwd_round : hp_flash_attention_fwd)(out, lse, q, k, v, seg, B, T, Hq, Hkv, D);
	round_out(out, (size_t)B * T * Hq * D);
}

void hp_emu_flash_bwd(hp_bf16 *dq, hp_bf16 *dk, hp_bf16 *dv, const hp_bf16 *dout, const hp_bf16 *out,
		      const float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v, const int32_t *seg,
		      float *scratch, int B, int T, int Hq, int Hkv, int D)
{
	(round_on ? hp_flash_attention_bwd_round : hp_flash_attention_bwd)(dq, dk, dv, dout, out, lse, q, k, v, seg,
									   scratch, B, T, Hq, Hkv, D);
	round_out(dq, (size_t)B * T * Hq * D);
	round_out(dk, (size_t)B * T * Hkv * D);
	round_out(dv, (size_t)B * T * Hkv * D);
}

size_t hp_emu_flash_scratch(int B, int T, int Hq)
{
	return B > 0 && T > 0 && Hq > 0 ? (size_t)B * T * Hq : 0;
}

void hp_emu_fill_inf(float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = INFINITY;
}

/* ---- cross-entropy ---- */

int hp_emu_ce_loss(double *acc, const float *logits, const int32_t *targets, long n, int V, struct hp_err *e)
{
	double s;
	long cnt;

	if (ops()->cross_entropy_fwd(&s, &cnt, logits, targets, n, V))
		return hp_err_set(e, HP_EINVAL, "cuda (emulated): a target out of range");
	*acc += s;
	return 0;
}

void hp_emu_ce_bwd(float *dlogits, const float *logits, const int32_t *targets, long n, int V, float scale)
{
	ops()->cross_entropy_bwd(dlogits, logits, targets, n, V, scale);
}

int hp_emu_vp_ce_loss(double *acc, const double *stats, const float *mx, const int32_t *targets, long N,
		      struct hp_err *e)
{
	double s;
	long cnt;

	/* the caller checked the targets' range: no bound here */
	if (hp_vp_ce_loss(&s, &cnt, stats, mx, targets, N, INT_MAX))
		return hp_err_set(e, HP_EINVAL, "cuda (emulated): a target out of range");
	*acc += s;
	return 0;
}

void hp_emu_vp_ce_max(float *mx, const float *logits, long N, int Vl)
{
	hp_vp_ce_max(mx, logits, N, Vl);
}

void hp_emu_vp_ce_sums(double *stats, const float *logits, const float *mx, const int32_t *targets, long N, int Vl,
		       int v0)
{
	hp_vp_ce_sums(stats, logits, mx, targets, N, Vl, v0);
}

void hp_emu_vp_ce_bwd(float *dlogits, const float *logits, const double *stats, const float *mx,
		      const int32_t *targets, long N, int Vl, int v0, float scale)
{
	hp_vp_ce_bwd(dlogits, logits, stats, mx, targets, N, Vl, v0, scale);
}

/* ---- AdamW ---- */

void hp_emu_adamw(float *w, hp_bf16 *wb, const float *g, float *m, float *v, size_t n, double lr, double beta1,
		  double beta2, double eps, double weight_decay, long step, int decay, const float *cg)
{
	struct hp_adamw_hparams h = { lr, beta1, beta2, eps, weight_decay, step };

	if (cg && cg[1] == 0.0f)
		return;

	hp_adamw_step(w, g, m, v, n, &h, decay);
	if (wb)
		hp_emu_f32_to_bf16(wb, w, n);
}
