/*
 * backend_cpu.c - the CPU backend (backend.h): host memory, the kernels of
 * kernels/cpu, the MPI collectives of lib/comm.
 *
 * Each op calls exactly the kernel lib/model/model.c called before there was a
 * backend table, with the same arguments, so the CPU's numbers are the
 * same bits whatever goes through the table.  The loops that were the
 * model's own (the vocabulary-parallel embedding, the MoE combine and its
 * backward, the residual adds) are kernels/cpu/rows.c, unchanged.
 */
#include <sys/mman.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/alloc.h"
#include "comm/comm.h"

static const struct hp_cpu_ops *ops_of(void)
{
	static const struct hp_cpu_ops *ops;

	if (!ops)
		ops = hp_cpu_ops_get();
	return ops;
}

const struct hp_cpu_ops *hp_backend_cpu_ops(void)
{
	return ops_of();
}

/* ---- memory ---- */

static void *c_alloc(struct hp_backend *b, size_t bytes, struct hp_err *e)
{
	void *p = hp_zalloc_aligned(bytes ? bytes : 1);

	if (!p) {
		hp_err_set(e, HP_ENOMEM, "out of memory (%zu MiB)", bytes >> 20);
		return NULL;
	}
	return p;
}

static void *c_alloc_as(struct hp_backend *b, size_t bytes, size_t counted, struct hp_err *e)
{
	return c_alloc(b, bytes, e);
}

static void c_free(struct hp_backend *b, void *p)
{
	hp_free_aligned(p);
}

/* operands are read where they are */
static int c_prepare(struct hp_backend *b, const struct hp_op_sizes *z, struct hp_err *e)
{
	return 0;
}

/* pages appear when written: nothing to put behind a span */
static int c_commit(struct hp_backend *b, void *p, size_t bytes, struct hp_err *e)
{
	return 0;
}

static int c_upload(struct hp_backend *b, void *dst, const void *src, size_t bytes, struct hp_err *e)
{
	if (dst != src)
		memcpy(dst, src, bytes);
	return 0;
}

static void c_copy(struct hp_backend *b, void *dst, const void *src, size_t bytes)
{
	if (dst != src)
		memmove(dst, src, bytes);
}

static void c_copy2d(struct hp_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
		     size_t rows)
{
	for (size_t r = 0; r < rows; r++)
		memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}

static void c_zero(struct hp_backend *b, void *p, size_t bytes)
{
	memset(p, 0, bytes);
}

/* Give the whole pages inside [p, p + bytes) back to the system
 * (MADV_DONTNEED on private anonymous memory reads back as zeros); 0 when
 * they went, and [*lo, *hi) says which. */
static int give_back(void *p, size_t bytes, uintptr_t *lo, uintptr_t *hi)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p, e = a + bytes;

	*lo = (a + page - 1) & ~(page - 1);
	*hi = e & ~(page - 1);
	if (*hi <= *lo) {
		*lo = *hi = a;
		return 0;
	}
	return madvise((void *)*lo, *hi - *lo, MADV_DONTNEED);
}

/* Zero the span and give its whole pages back, so a released FSDP unit
 * costs no memory until it is gathered again. */
static void c_release(struct hp_backend *b, void *p, size_t bytes)
{
	uintptr_t lo, hi;

	if (give_back(p, bytes, &lo, &hi)) {
		memset(p, 0, bytes);
		return;
	}
	memset(p, 0, lo - (uintptr_t)p);
	memset((void *)hi, 0, (uintptr_t)p + bytes - hi);
}

static void c_discard(struct hp_backend *b, void *p, size_t bytes)
{
	uintptr_t lo, hi;

	(void)give_back(p, bytes, &lo, &hi);
}

static int c_sync(struct hp_backend *b, struct hp_err *e)
{
	return 0;
}

/* an index array is one array on the CPU: put and get move nothing */
static int c_put_get(struct hp_backend *b, const struct hp_i32 *x, size_t n, struct hp_err *e)
{
	return 0;
}

static size_t c_esize(struct hp_backend *b, enum hp_dtype t)
{
	return hp_dtype_size(t);
}

static void c_convert(struct hp_backend *b, void *dst, enum hp_dtype dt, const void *src, enum hp_dtype st, size_t n)
{
	if (dt == st) {
		c_copy(b, dst, src, n * hp_dtype_size(dt));
		return;
	}
	if (st == HP_DTYPE_F32)
		hp_convert_from_f32(dst, dt, src, n);
	else
		hp_convert_to_f32(dst, src, st, n);
}

static void c_acc(struct hp_backend *b, float *dst, const void *src, enum hp_dtype st, size_t n)
{
	const float *s = src;

	if (st == HP_DTYPE_F32) {
		for (size_t i = 0; i < n; i++)
			dst[i] += s[i];
		return;
	}
	for (size_t i = 0; i < n; i++)
		dst[i] += hp_bf16_to_f32(((const uint16_t *)src)[i]);
}

static int c_weights(struct hp_backend *b, float *base, size_t n, struct hp_err *e)
{
	return 0;
}

static void c_weights_changed(struct hp_backend *b, const float *w, size_t n)
{
}

/* no working copy: the GEMMs read the fp32 weights */
static int c_copy_only(struct hp_backend *b, float *w, size_t n, int dir, const void *src, enum hp_dtype st,
		       struct hp_err *e)
{
	return 0;
}

/* ---- ops ---- */

static void c_linear_fwd(struct hp_backend *b, float *y, const float *x, const float *W, const float *bias, long N,
			 int K, int O)
{
	ops_of()->linear_fwd(y, x, W, bias, N, K, O);
}

static void c_linear_bwd(struct hp_backend *b, float *dx, float *dW, float *db, const float *dy, const float *x,
			 const float *W, long N, int K, int O, int accumulate)
{
	ops_of()->linear_bwd(dx, dW, db, dy, x, W, N, K, O, accumulate);
}

static void c_rmsnorm_fwd(struct hp_backend *b, float *y, float *rstd, const float *x, const float *w, long N, int C,
			  float eps)
{
	hp_rmsnorm_fwd(y, rstd, x, w, N, C, eps);
}

static void c_rmsnorm_bwd(struct hp_backend *b, float *dx, float *dw, const float *dy, const float *x, const float *w,
			  const float *rstd, long N, int C, int accumulate)
{
	hp_rmsnorm_bwd(dx, dw, dy, x, w, rstd, N, C, accumulate);
}

static void c_rmsnorm_res_fwd(struct hp_backend *b, float *h, float *y, float *rstd, const float *a, const float *bb,
			      const float *w, long N, int C, float eps)
{
	hp_rmsnorm_res_fwd(h, y, rstd, a, bb, w, N, C, eps);
}

static void c_rmsnorm_res_bwd(struct hp_backend *b, float *dx, float *dw, const float *dy, const float *x,
			      const float *w, const float *rstd, long N, int C, int accumulate)
{
	hp_rmsnorm_bwd_vec(dx, dw, dy, x, w, rstd, N, C, accumulate);
}

static void c_rope_fwd(struct hp_backend *b, float *x, const int32_t *pos, const float *cos_t, const float *sin_t,
		       long N, int H, int ld, int Dr, int inter)
{
	hp_rope_fwd(x, pos, cos_t, sin_t, N, H, ld, Dr, inter);
}

static void c_rope_bwd(struct hp_backend *b, float *dx, const int32_t *pos, const float *cos_t, const float *sin_t,
		       long N, int H, int ld, int Dr, int inter)
{
	hp_rope_bwd(dx, pos, cos_t, sin_t, N, H, ld, Dr, inter);
}

static void c_swiglu_fwd(struct hp_backend *b, float *h, const float *g, const float *u, long n)
{
	ops_of()->swiglu_fwd(h, g, u, n);
}

static void c_swiglu_bwd(struct hp_backend *b, float *dg, float *du, const float *dh, const float *g, const float *u,
			 long n)
{
	ops_of()->swiglu_bwd(dg, du, dh, g, u, n);
}

static void c_swiglu_rows_fwd(struct hp_backend *b, float *h, const float *gu, long rows, int I)
{
	hp_swiglu_rows_fwd(h, gu, rows, I);
}

static void c_swiglu_rows_bwd(struct hp_backend *b, float *dgu, const float *dh, const float *gu, long rows, int I)
{
	hp_swiglu_rows_bwd(dgu, dh, gu, rows, I);
}

static void c_sinks_fwd(struct hp_backend *b, float *out, float *lse, const float *sinks, int B, int T, int H,
			int D)
{
	hp_attn_sinks_fwd(out, lse, sinks, B, T, H, D);
}

static void c_sinks_bwd(struct hp_backend *b, float *dsinks, const float *dout, const float *out, const float *lse,
			const float *sinks, int B, int T, int H, int D)
{
	hp_attn_sinks_bwd(dsinks, dout, out, lse, sinks, B, T, H, D);
}

static void c_glu_clamp_fwd(struct hp_backend *b, float *h, const float *g, const float *u, long ld, long rows,
			    int I, float alpha, float limit)
{
	hp_glu_clamp_fwd(h, g, u, ld, rows, I, alpha, limit);
}

static void c_glu_clamp_bwd(struct hp_backend *b, float *dg, float *du, const float *dh, const float *g,
			    const float *u, long ld, long rows, int I, float alpha, float limit)
{
	hp_glu_clamp_bwd(dg, du, dh, g, u, ld, rows, I, alpha, limit);
}

static void c_bias_grouped_fwd(struct hp_backend *b, float *x, long ld, const float *bias, size_t bs,
			       const int32_t *off, int nx, int n, long R)
{
	hp_bias_grouped_fwd(x, ld, bias, bs, off, nx, n);
}

static void c_bias_grouped_bwd(struct hp_backend *b, float *db, size_t bs, const float *dx, long ld,
			       const int32_t *off, int nx, int n)
{
	hp_bias_grouped_bwd(db, bs, dx, ld, off, nx, n);
}

static void c_attention_fwd(struct hp_backend *b, float *out, float *P, const float *q, const float *k,
			    const float *v, const int32_t *seg, int B, int T, int Hq, int Hkv, int D)
{
	ops_of()->attention_fwd(out, P, q, k, v, seg, B, T, Hq, Hkv, D);
}

static void c_attention_bwd(struct hp_backend *b, float *dq, float *dk, float *dv, const float *dout, const float *P,
			    const float *q, const float *k, const float *v, const int32_t *seg, float *scratch,
			    int B, int T, int Hq, int Hkv, int D)
{
	ops_of()->attention_bwd(dq, dk, dv, dout, P, q, k, v, seg, scratch, B, T, Hq, Hkv, D);
}

static int c_flash_supports(struct hp_backend *b, int D)
{
	return hp_flash_attention_supports(D);
}

static void c_flash_fwd(struct hp_backend *b, float *out, float *lse, const float *q, const float *k, const float *v,
			const int32_t *seg, int B, int T, int Hq, int Hkv, int D)
{
	hp_flash_attention_fwd(out, lse, q, k, v, seg, B, T, Hq, Hkv, D);
}

static void c_flash_bwd(struct hp_backend *b, float *dq, float *dk, float *dv, const float *dout, const float *out,
			const float *lse, const float *q, const float *k, const float *v, const int32_t *seg,
			float *scratch, int B, int T, int Hq, int Hkv, int D)
{
	hp_flash_attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, seg, scratch, B, T, Hq, Hkv, D);
}

static size_t c_flash_scratch(struct hp_backend *b, int B, int T, int H, int D)
{
	return hp_flash_attention_scratch(T, H, D);
}

static void c_cp_attention_fwd(struct hp_backend *b, float *out, float *P, float *lse, const float *q,
			       const float *k, const float *v, const int32_t *seg, int B, int Tq, int S, int q0,
			       int Hq, int Hkv, int D)
{
	hp_cp_attention_fwd(out, P, lse, q, k, v, seg, B, Tq, S, q0, Hq, Hkv, D);
}

static void c_cp_attention_bwd(struct hp_backend *b, float *dq, float *dk, float *dv, const float *dout,
			       const float *out, const float *P, const float *lse, const float *q, const float *k,
			       const float *v, const int32_t *seg, float *scratch, int B, int Tq, int S, int q0,
			       int Hq, int Hkv, int D)
{
	hp_cp_attention_bwd(dq, dk, dv, dout, out, P, lse, q, k, v, seg, scratch, B, Tq, S, q0, Hq, Hkv, D);
}

static size_t c_cp_attention_scratch(struct hp_backend *b, int S)
{
	return hp_cp_attention_scratch(S);
}

static void c_router_topk(struct hp_backend *b, float *probs, int32_t *sel, float *wsel, long N, int E, int K,
			  int norm)
{
	hp_router_topk(probs, sel, wsel, N, E, K, norm);
}

static void c_router_bwd(struct hp_backend *b, float *dprob, const float *probs, const int32_t *sel,
			 const float *wsel, const float *dwsel, const double *aux, double aux_grad, long N, int E,
			 int K, int norm)
{
	hp_router_bwd(dprob, probs, sel, wsel, dwsel, aux, aux_grad, N, E, K, norm);
}

static void c_router_group_fwd(struct hp_backend *b, float *probs, int32_t *sel, float *wsel, const float *bias,
			       long N, int E, int K, int G, int TG, int norm, float scale, int mask_zero)
{
	hp_router_group_fwd(probs, sel, wsel, bias, N, E, K, G, TG, norm, scale, mask_zero);
}

static void c_router_group_bwd(struct hp_backend *b, float *dlogits, const float *probs, const int32_t *sel,
			       const float *dwsel, long N, int E, int K, int norm, float scale)
{
	hp_router_group_bwd(dlogits, probs, sel, dwsel, N, E, K, norm, scale);
}

static int c_ce_fwd(struct hp_backend *b, double *loss_sum, long *count, const float *logits,
		    const struct hp_i32 *targets, long N, int V)
{
	double ls;
	int rc = ops_of()->cross_entropy_fwd(&ls, count, logits, targets->h, N, V);

	if (!rc)
		*loss_sum += ls;
	return rc;
}

static void c_ce_bwd(struct hp_backend *b, float *dlogits, const float *logits, const int32_t *targets, long N, int V,
		     float scale)
{
	ops_of()->cross_entropy_bwd(dlogits, logits, targets, N, V, scale);
}

static void c_vp_ce_max(struct hp_backend *b, float *mx, const float *logits, long N, int Vl)
{
	hp_vp_ce_max(mx, logits, N, Vl);
}

static void c_vp_ce_sums(struct hp_backend *b, double *stats, const float *logits, const float *mx,
			 const int32_t *targets, long N, int Vl, int v0)
{
	hp_vp_ce_sums(stats, logits, mx, targets, N, Vl, v0);
}

static int c_vp_ce_loss(struct hp_backend *b, double *loss_sum, long *count, const double *stats, const float *mx,
			const struct hp_i32 *targets, long N, int V)
{
	double ls;
	int rc = hp_vp_ce_loss(&ls, count, stats, mx, targets->h, N, V);

	if (!rc)
		*loss_sum += ls;
	return rc;
}

static void c_vp_ce_bwd(struct hp_backend *b, float *dlogits, const float *logits, const double *stats,
			const float *mx, const int32_t *targets, long N, int Vl, int v0, float scale)
{
	hp_vp_ce_bwd(dlogits, logits, stats, mx, targets, N, Vl, v0, scale);
}

static void c_embed_fwd(struct hp_backend *b, float *out, const struct hp_i32 *ids, const float *table, long N,
			int C, int v0, int V)
{
	hp_embedding_fwd_range(out, ids->h, table, N, C, v0, V);
}

static int c_embed_bwd(struct hp_backend *b, float *dtable, const float *dout, const struct hp_i32 *ids, long N,
		       int C, int v0, int V, int pad, struct hp_err *e)
{
	hp_embedding_bwd_range(dtable, dout, ids->h, N, C, v0, V, pad);
	return 0;
}

static void c_add(struct hp_backend *b, float *x, const float *a, const float *bb, long n)
{
	hp_residual_add(x, a, bb, n);
}

static void c_add_bias(struct hp_backend *b, float *x, const float *bias, long N, int C)
{
	hp_bias_add(x, bias, N, C);
}

static void c_colsum(struct hp_backend *b, float *db, const float *x, long N, int C)
{
	hp_bias_grad(db, x, N, C);
}

static void c_max(struct hp_backend *b, float *x, const float *y, long n)
{
	hp_max_into(x, y, n);
}

static void c_add_f64(struct hp_backend *b, double *x, const double *y, long n)
{
	hp_add_into_f64(x, y, n);
}

static void c_moe_route(struct hp_backend *b, int32_t *off, int32_t *row_tok, int32_t *row_slot, int32_t *tok_rows,
			int32_t *bad, int32_t *sel, long N, int E, int K)
{
	hp_moe_route(off, row_tok, row_slot, tok_rows, bad, sel, N, E, K);
}

static void c_moe_aux_acc(struct hp_backend *b, double *FP, const float *probs, const int32_t *off, long N, int E)
{
	hp_moe_aux_acc(FP, probs, off, N, E);
}

static void c_moe_aux_fin(struct hp_backend *b, double *FP, double *aux, double *acc, int E, double n, double div)
{
	hp_moe_aux_fin(FP, aux, acc, E, n, div);
}

static void c_grouped_fwd(struct hp_backend *b, float *y, const float *x, const float *W, size_t ws,
			  const int32_t *off, int nx, long R, int K, int O)
{
	hp_grouped_linear_fwd(ops_of()->linear_fwd, y, x, W, ws, off, nx, K, O);
}

static void c_grouped_bwd(struct hp_backend *b, float *dx, float *dW, size_t gs, const float *dy, const float *x,
			  const float *W, size_t ws, const int32_t *off, int nx, long R, int K, int O, int accumulate)
{
	hp_grouped_linear_bwd(ops_of()->linear_bwd, dx, dW, gs, dy, x, W, ws, off, nx, K, O, accumulate);
}

static void c_gather_rows(struct hp_backend *b, float *dst, const float *src, const int32_t *idx, long R, int C)
{
	hp_rows_gather(dst, src, idx, R, C);
}

static void c_bcast_heads(struct hp_backend *b, float *dst, int ldd, const float *src, int lds, long N, int H, int w)
{
	hp_heads_bcast(dst, ldd, src, lds, N, H, w);
}

static void c_conv1d_silu_fwd(struct hp_backend *b, float *y, const float *x, const float *w, const int32_t *seg,
			      int B, int T, int C, int K)
{
	(void)b;
	hp_conv1d_silu_fwd(y, x, w, seg, B, T, C, K);
}

static void c_conv1d_silu_bwd(struct hp_backend *b, float *dx, float *dw, const float *dy, const float *x,
			      const float *w, const int32_t *seg, int B, int T, int C, int K)
{
	(void)b;
	hp_conv1d_silu_bwd(dx, dw, dy, x, w, seg, B, T, C, K);
}

static void c_l2norm_fwd(struct hp_backend *b, float *y, float *rinv, const float *x, long N, int D)
{
	(void)b;
	hp_l2norm_fwd(y, rinv, x, N, D);
}

static void c_l2norm_bwd(struct hp_backend *b, float *dx, const float *dy, const float *y, const float *rinv, long N,
			 int D)
{
	(void)b;
	hp_l2norm_bwd(dx, dy, y, rinv, N, D);
}

static void c_gdn_gates_fwd(struct hp_backend *b, float *beta, float *g, const float *bb, const float *a,
			    const float *A_log, const float *dt_bias, long N, int H)
{
	(void)b;
	hp_gdn_gates_fwd(beta, g, bb, a, A_log, dt_bias, N, H);
}

static void c_gdn_gates_bwd(struct hp_backend *b, float *dbb, float *da, float *dA_log, float *ddt_bias,
			    const float *dbeta, const float *dg, const float *bb, const float *a, const float *A_log,
			    const float *dt_bias, long N, int H)
{
	(void)b;
	hp_gdn_gates_bwd(dbb, da, dA_log, ddt_bias, dbeta, dg, bb, a, A_log, dt_bias, N, H);
}

static size_t c_gdr_scratch(struct hp_backend *b, int B, int Hv, int Dk, int Dv)
{
	(void)b;
	return hp_gdr_scratch_floats(B, Hv, Dk, Dv);
}

static void c_gdr_fwd(struct hp_backend *b, float *out, float *saved, const float *q, const float *k, const float *v,
		      const float *g, const float *beta, const int32_t *seg, float *scratch, int B, int T, int Hv,
		      int Hk, int Dk, int Dv, float scale)
{
	(void)b;
	hp_gdr_fwd(out, saved, q, k, v, g, beta, seg, scratch, B, T, Hv, Hk, Dk, Dv, scale);
}

static void c_gdr_bwd(struct hp_backend *b, float *dq, float *dk, float *dv, float *dg, float *dbeta,
		      const float *dout, const float *saved, const float *q, const float *k, const float *v,
		      const float *g, const float *beta, const int32_t *seg, float *scratch, int B, int T, int Hv,
		      int Hk, int Dk, int Dv, float scale)
{
	(void)b;
	hp_gdr_bwd(dq, dk, dv, dg, dbeta, dout, saved, q, k, v, g, beta, seg, scratch, B, T, Hv, Hk, Dk, Dv, scale);
}

static void c_rmsnorm_gated_fwd(struct hp_backend *b, float *y, float *rstd, const float *x, const float *z,
				const float *w, long N, int D, float eps)
{
	(void)b;
	hp_rmsnorm_gated_fwd(y, rstd, x, z, w, N, D, eps);
}

static void c_rmsnorm_gated_bwd(struct hp_backend *b, float *dx, float *dz, float *dw, const float *dy,
				const float *x, const float *z, const float *w, const float *rstd, long N, int D)
{
	(void)b;
	hp_rmsnorm_gated_bwd(dx, dz, dw, dy, x, z, w, rstd, N, D);
}

static void c_sigmoid_gate_fwd(struct hp_backend *b, float *y, const float *x, const float *gate, long n)
{
	(void)b;
	hp_sigmoid_gate_fwd(y, x, gate, n);
}

static void c_sigmoid_gate_bwd(struct hp_backend *b, float *dx, float *dgate, const float *dy, const float *x,
			       const float *gate, long n)
{
	(void)b;
	hp_sigmoid_gate_bwd(dx, dgate, dy, x, gate, n);
}

static void c_sigmoid_gate_rows_fwd(struct hp_backend *b, float *y, const float *x, const float *gate, long T, int C)
{
	(void)b;
	hp_sigmoid_gate_rows_fwd(y, x, gate, T, C);
}

static void c_sigmoid_gate_rows_bwd(struct hp_backend *b, float *dx, float *dgate, const float *dy, const float *x,
				    const float *gate, long T, int C)
{
	(void)b;
	hp_sigmoid_gate_rows_bwd(dx, dgate, dy, x, gate, T, C);
}

static void c_sum_heads(struct hp_backend *b, float *dst, int ldd, const float *src, int lds, long N, int H, int w)
{
	hp_heads_sum(dst, ldd, src, lds, N, H, w);
}

static void c_scatter_rows(struct hp_backend *b, float *dst, const float *src, const int32_t *idx, long R, int C)
{
	hp_rows_scatter(dst, src, idx, R, C);
}

static void c_moe_combine(struct hp_backend *b, float *out, const float *ye, const float *wsel,
			  const struct hp_route *rt, long N, int K, int C)
{
	hp_moe_combine(out, ye, wsel, rt->row_tok, rt->row_slot, N, K, C);
}

static void c_moe_combine_bwd(struct hp_backend *b, float *dye, float *dwsel, const float *dout, const float *ye,
			      const float *wsel, const struct hp_route *rt, long N, int K, int C)
{
	hp_moe_combine_bwd(dye, dwsel, dout, ye, wsel, rt->row_tok, rt->row_slot, N * K, K, C);
}

static void c_moe_scatter_add(struct hp_backend *b, float *dx, const float *dxe, const struct hp_route *rt, long N,
			      int K, int C)
{
	hp_moe_scatter_add(dx, dxe, rt->row_tok, N * K, C);
}

static int c_sumsq_acc(struct hp_backend *b, double *acc, const float *x, size_t n, struct hp_err *e)
{
	double ss = *acc;

	for (size_t i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	*acc = ss;
	return 0;
}

static void c_scale(struct hp_backend *b, float *x, float s, size_t n)
{
	hp_scale(x, s, (long)n);
}

static void c_adamw(struct hp_backend *b, float *w, const float *g, float *m, float *v, size_t n,
		    const struct hp_adamw_hparams *h, int decay, const float *cg)
{
	if (!cg || cg[1] != 0.0f)
		hp_adamw_step(w, g, m, v, n, h, decay);
}

static void c_clip_gate(struct hp_backend *b, float *g, size_t n, float *cg, const double *ss, const double *loss,
			const double *aux, const int32_t *bad, double max_norm, int check)
{
	hp_clip_grads(g, n, cg, ss, loss, aux, bad, max_norm, check);
}

/* ---- collectives: lib/comm's, on host buffers ---- */

static int c_allreduce(struct hp_backend *b, struct hp_comm *c, void *buf, size_t n, enum hp_dtype t, int op,
		       struct hp_err *e)
{
	return hp_comm_allreduce(c, buf, n, t, op, e);
}

static int c_allgather(struct hp_backend *b, struct hp_comm *c, const void *send, void *recv, size_t n,
		       enum hp_dtype t, struct hp_err *e)
{
	return hp_comm_allgather(c, send, recv, n, t, e);
}

static int c_iallgather(struct hp_backend *b, struct hp_comm *c, const void *send, void *recv, size_t n,
			enum hp_dtype t, struct hp_breq *r, struct hp_err *e)
{
	memset(r, 0, sizeof(*r));
	r->active = 1;
	return hp_comm_iallgather(c, send, recv, n, t, &r->req, e);
}

static void c_req_free(struct hp_backend *b, struct hp_breq *r)
{
}

static int c_wait(struct hp_backend *b, struct hp_breq *r, struct hp_err *e)
{
	if (r->active && r->req != MPI_REQUEST_NULL)
		hp_comm_wait(&r->req);
	r->active = 0;
	return 0;
}

static int c_reduce_scatter(struct hp_backend *b, struct hp_comm *c, const void *send, void *recv, size_t n,
			    enum hp_dtype t, int op, struct hp_err *e)
{
	return hp_comm_reduce_scatter(c, send, recv, n, t, op, e);
}

static int c_ireduce_scatter(struct hp_backend *b, struct hp_comm *c, const void *send, void *recv, size_t n,
			     enum hp_dtype t, int op, struct hp_breq *r, struct hp_err *e)
{
	memset(r, 0, sizeof(*r));
	r->active = 1;
	return hp_comm_ireduce_scatter(c, send, recv, n, t, op, &r->req, e);
}

static int c_kernel_times(struct hp_backend *b, double ms[], struct hp_err *e)
{
	for (int f = 0; f < HP_KF_N; f++)
		ms[f] = 0;
	return 0;
}

static int c_alltoall(struct hp_backend *b, struct hp_comm *c, const void *send, void *recv, size_t n,
		      enum hp_dtype t, struct hp_err *e)
{
	return hp_comm_alltoall(c, send, recv, n, t, e);
}

static int c_sendrecv(struct hp_backend *b, struct hp_comm *c, const struct hp_p2p *ops, int n, struct hp_err *e)
{
	return hp_comm_sendrecv(c, ops, n, e);
}

static int c_alltoallv(struct hp_backend *b, struct hp_comm *c, const void *send, const int *scounts,
		       const int *sdispls, void *recv, const int *rcounts, const int *rdispls, enum hp_dtype t,
		       int routed, struct hp_err *e)
{
	return hp_comm_alltoallv(c, send, scounts, sdispls, recv, rcounts, rdispls, t, routed, e);
}

static int c_attach(struct hp_backend *b, struct hp_comms *cs, struct hp_err *e)
{
	return 0;
}

static const char *c_comm_path(struct hp_backend *b)
{
	return "mpi";
}

static void c_close(struct hp_backend *b)
{
}

static struct hp_backend cpu = {
	.name = "cpu",
	.kind = HP_BACKEND_CPU,
	.device = 0,
	.alloc = c_alloc,
	.alloc_as = c_alloc_as,
	.free = c_free,
	.upload = c_upload,
	.download = c_upload,
	.copy = c_copy,
	.copy2d = c_copy2d,
	.zero = c_zero,
	.release = c_release,
	.reserve = c_alloc,
	.commit = c_commit,
	.prepare = c_prepare,
	.discard = c_discard,
	.sync = c_sync,
	.put = c_put_get,
	.get = c_put_get,
	.esize = c_esize,
	.convert = c_convert,
	.acc = c_acc,
	.weights = c_weights,
	.weights_changed = c_weights_changed,
	.copy_only = c_copy_only,
	.linear_fwd = c_linear_fwd,
	.linear_bwd = c_linear_bwd,
	.rmsnorm_fwd = c_rmsnorm_fwd,
	.rmsnorm_bwd = c_rmsnorm_bwd,
	.rmsnorm_res_fwd = c_rmsnorm_res_fwd,
	.rmsnorm_res_bwd = c_rmsnorm_res_bwd,
	.rope_fwd = c_rope_fwd,
	.rope_bwd = c_rope_bwd,
	.swiglu_fwd = c_swiglu_fwd,
	.swiglu_bwd = c_swiglu_bwd,
	.swiglu_rows_fwd = c_swiglu_rows_fwd,
	.swiglu_rows_bwd = c_swiglu_rows_bwd,
	.sinks_fwd = c_sinks_fwd,
	.sinks_bwd = c_sinks_bwd,
	.glu_clamp_fwd = c_glu_clamp_fwd,
	.glu_clamp_bwd = c_glu_clamp_bwd,
	.bias_grouped_fwd = c_bias_grouped_fwd,
	.bias_grouped_bwd = c_bias_grouped_bwd,
	.has_eager = 1,
	.attention_fwd = c_attention_fwd,
	.attention_bwd = c_attention_bwd,
	.flash_supports = c_flash_supports,
	.flash_fwd = c_flash_fwd,
	.flash_bwd = c_flash_bwd,
	.flash_scratch = c_flash_scratch,
	.cp_attention_fwd = c_cp_attention_fwd,
	.cp_attention_bwd = c_cp_attention_bwd,
	.cp_attention_scratch = c_cp_attention_scratch,
	.router_topk = c_router_topk,
	.router_bwd = c_router_bwd,
	.router_group_fwd = c_router_group_fwd,
	.router_group_bwd = c_router_group_bwd,
	.moe_route = c_moe_route,
	.moe_aux_acc = c_moe_aux_acc,
	.moe_aux_fin = c_moe_aux_fin,
	.grouped_fwd = c_grouped_fwd,
	.grouped_bwd = c_grouped_bwd,
	.ce_fwd = c_ce_fwd,
	.ce_bwd = c_ce_bwd,
	.vp_ce_max = c_vp_ce_max,
	.vp_ce_sums = c_vp_ce_sums,
	.vp_ce_loss = c_vp_ce_loss,
	.vp_ce_bwd = c_vp_ce_bwd,
	.embed_fwd = c_embed_fwd,
	.embed_bwd = c_embed_bwd,
	.add = c_add,
	.add_bias = c_add_bias,
	.colsum = c_colsum,
	.max = c_max,
	.add_f64 = c_add_f64,
	.gather_rows = c_gather_rows,
	.bcast_heads = c_bcast_heads,
	.sum_heads = c_sum_heads,
	.conv1d_silu_fwd = c_conv1d_silu_fwd,
	.conv1d_silu_bwd = c_conv1d_silu_bwd,
	.l2norm_fwd = c_l2norm_fwd,
	.l2norm_bwd = c_l2norm_bwd,
	.gdn_gates_fwd = c_gdn_gates_fwd,
	.gdn_gates_bwd = c_gdn_gates_bwd,
	.gdr_scratch = c_gdr_scratch,
	.gdr_fwd = c_gdr_fwd,
	.gdr_bwd = c_gdr_bwd,
	.rmsnorm_gated_fwd = c_rmsnorm_gated_fwd,
	.rmsnorm_gated_bwd = c_rmsnorm_gated_bwd,
	.sigmoid_gate_fwd = c_sigmoid_gate_fwd,
	.sigmoid_gate_bwd = c_sigmoid_gate_bwd,
	.sigmoid_gate_rows_fwd = c_sigmoid_gate_rows_fwd,
	.sigmoid_gate_rows_bwd = c_sigmoid_gate_rows_bwd,
	.scatter_rows = c_scatter_rows,
	.moe_combine = c_moe_combine,
	.moe_combine_bwd = c_moe_combine_bwd,
	.moe_scatter_add = c_moe_scatter_add,
	.sumsq_acc = c_sumsq_acc,
	.scale = c_scale,
	.adamw = c_adamw,
	.clip_gate = c_clip_gate,
	.allreduce = c_allreduce,
	.allgather = c_allgather,
	.iallgather = c_iallgather,
	.wait = c_wait,
	.req_free = c_req_free,
	.reduce_scatter = c_reduce_scatter,
	.ireduce_scatter = c_ireduce_scatter,
	.kernel_times = c_kernel_times,
	.alltoall = c_alltoall,
	.alltoallv = c_alltoallv,
	.sendrecv = c_sendrecv,
	.attach = c_attach,
	.comm_path = c_comm_path,
	.close = c_close,
};

struct hp_backend *hp_backend_cpu(void)
{
	return &cpu;
}

void hp_backend_close(struct hp_backend *b)
{
	if (b && b->close)
		b->close(b);
}
