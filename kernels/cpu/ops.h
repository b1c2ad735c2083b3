/*
 * ops.h - the CPU compute kernels, forward and backward, F32.
 *
 * Layout conventions (row-major everywhere):
 *   N = B*T tokens; a token's activations are one contiguous row.
 *   Linear weights are [out, in] as in HF (y = x W^T + b).
 *   Attention q is [N, n_heads*head_dim], k and v [N, n_kv_heads*head_dim],
 *   head h of token n at q[n*n_heads*head_dim + h*head_dim].
 *   Attention probabilities are saved as P[B, n_heads, T, T].
 * Gradient conventions: weight gradients (dW, db, dw, d_embed) always
 * accumulate (+=), so micro-batches add up; activation gradients overwrite
 * unless the function takes an `accumulate` flag.
 *
 * Every op has a plain C reference (*_ref) that follows HF transformers'
 * modeling code; some have a faster variant.  struct hp_cpu_ops is the op
 * table the CPU backend (lib/backend/backend_cpu.c) and the CUDA host
 * emulation call through (the model calls its backend); hp_cpu_ops_get() returns the fast table, or
 * the all-reference one when HP_KERNELS=reference.  The reference kernels are
 * checked against finite differences in t/unit/test-kernels.c.
 */
#ifndef HP_KERNELS_CPU_OPS_H
#define HP_KERNELS_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

/* ---- embedding ---- */
void hp_embedding_fwd(float *out, const int32_t *ids, const float *table, long N, int C);
/* dtable[ids[n]] += dout[n], except for tokens whose id is pad (>= 0):
 * nn.Embedding(padding_idx=pad) gives its row no gradient. */
void hp_embedding_bwd(float *dtable, const float *dout, const int32_t *ids, long N, int C, int pad);

/* The vocabulary-parallel embedding (kernels/cpu/rows.c): rows of the
 * table for ids in [v0, v0 + V), zero rows for the others; the backward
 * adds only the ids in range, except pad. */
void hp_embedding_fwd_range(float *out, const int32_t *ids, const float *table, long N, int C, int v0, int V);
void hp_embedding_bwd_range(float *dtable, const float *dout, const int32_t *ids, long N, int C, int v0, int V,
			    int pad);

/* ---- the model's bookkeeping between kernels (kernels/cpu/rows.c) ---- */
/* dst[r] = src[idx[r]]; dst[idx[r]] = src[r] (rows of C, r < R) */
void hp_rows_gather(float *dst, const float *src, const int32_t *idx, long R, int C);
void hp_rows_scatter(float *dst, const float *src, const int32_t *idx, long R, int C);
/* Multi-head latent attention's shared key part: every head's copy of a
 * token's w values, dst[(n*H + h)*ldd + i] = src[n*lds + i]; and the
 * adjoint, dst[n*ldd + i] = sum over h ascending of src[(n*H + h)*lds + i]. */
void hp_heads_bcast(float *dst, int ldd, const float *src, int lds, long N, int H, int w);
void hp_heads_sum(float *dst, int ldd, const float *src, int lds, long N, int H, int w);
/* The MoE block's output: out [N,C] = the sum, over the expert-major rows
 * r < N*K in order (row r is token row_tok[r]'s slot row_slot[r]), of
 * wsel[t, slot] * ye[r], as HF's index_add_ adds them. */
void hp_moe_combine(float *out, const float *ye, const float *wsel, const int32_t *row_tok,
		    const int32_t *row_slot, long N, int K, int C);
/* Its backward, row by row: dye[r] = wsel[t, s] * dout[t]; dwsel[t, s] =
 * dout[t] . ye[r] (in double). */
void hp_moe_combine_bwd(float *dye, float *dwsel, const float *dout, const float *ye, const float *wsel,
			const int32_t *row_tok, const int32_t *row_slot, long R, int K, int C);
/* dx[row_tok[r]] += dxe[r], rows in order */
void hp_moe_scatter_add(float *dx, const float *dxe, const int32_t *row_tok, long R, int C);
/* x = a + b (x may alias either); x *= s; x[n, :] += bias; db[c] += sum
 * over rows in order of x[n, c]; x = max(x, y) (y taken where y > x); x += y */
void hp_residual_add(float *x, const float *a, const float *b, long n);
void hp_scale(float *x, float s, long n);
void hp_bias_add(float *x, const float *bias, long N, int C);
void hp_bias_grad(float *db, const float *x, long N, int C);
void hp_max_into(float *x, const float *y, long n);
void hp_add_into_f64(double *x, const double *y, long n);

/* ---- RMSNorm: y = w * (x * rstd), rstd = 1/sqrt(mean(x^2) + eps) ---- */
void hp_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int C, float eps);
/* dx = (accumulate ? dx : 0) + d/dx; dw += d/dw */
void hp_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
		    const float *rstd, long N, int C, int accumulate);

/* fused_rmsnorm: h = a + b (b NULL: h = a), y = w * h * rstd, one pass;
 * h may alias a or b.  Its backward is hp_rmsnorm_bwd_vec with accumulate
 * (dx holds the residual's gradient).  Vector paths, results within a
 * float ulp of the reference's. */
void hp_rmsnorm_res_fwd(float *h, float *y, float *rstd, const float *a, const float *b,
			const float *w, long N, int C, float eps);
void hp_rmsnorm_bwd_vec(float *dx, float *dw, const float *dy, const float *x, const float *w,
			const float *rstd, long N, int C, int accumulate);

/* ---- RoPE (HF rotate_half form, or DeepSeek's interleaved pairs) ---- */
/* cos/sin tables [T, head_dim/2] for positions 0..T-1: angle = pos * inv_freq[i],
 * both times attention_factor (lib/config/hfconfig.h, hp_model_spec_rope_table). */
void hp_rope_table(float *cos_t, float *sin_t, int T, int head_dim, const double *inv_freq,
		   double attention_factor);
/* Rotate in place the Dr floats at x + (n*n_heads + h)*ld, token n (at
 * position pos[n]) head h: the rotated part of each head, x already offset
 * to it (ld = Dr = head_dim: whole heads); the other floats are not
 * touched.  cos_t, sin_t [T, Dr/2].  inter 0: HF's rotate_half, pairs
 * (i, i + Dr/2); inter 1: DeepSeek's rope_interleave, pairs (2i, 2i+1),
 * out[2i] = x[2i]*c[i] - x[2i+1]*s[i], out[2i+1] = x[2i+1]*c[i] +
 * x[2i]*s[i] (transformers' output de-interleaved, permuted back). */
void hp_rope_fwd(float *x, const int32_t *pos, const float *cos_t, const float *sin_t,
		 long N, int n_heads, int ld, int Dr, int inter);
/* The adjoint: rotate the gradient back by -angle, in place. */
void hp_rope_bwd(float *dx, const int32_t *pos, const float *cos_t, const float *sin_t,
		 long N, int n_heads, int ld, int Dr, int inter);

/* ---- SwiGLU: h = silu(g) * u ---- */
void hp_swiglu_fwd(float *h, const float *g, const float *u, long n);
void hp_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, long n);
/* grouped experts' fused SwiGLU on rows of [gate | up] (2*I floats each):
 * h[r, i] = silu(gu[r, i]) * gu[r, I + i]; the backward writes dgu in the
 * same layout.  Element for element the same arithmetic as the op table's
 * swiglu_fwd / swiglu_bwd (the vector variants). */
void hp_swiglu_rows_fwd(float *h, const float *gu, long rows, int I);
void hp_swiglu_rows_bwd(float *dgu, const float *dh, const float *gu, long rows, int I);

/* ---- GPT-OSS (oss.c) ---- */
/* Attention sinks on a flash kernel's out [B,T,H,D] and lse [B,H,T], in
 * place: the sink logit sinks[h] joins each row's softmax.  The backward
 * adds d loss / d sinks[h] into dsinks (out and lse the fixed ones). */
void hp_attn_sinks_fwd(float *out, float *lse, const float *sinks, int B, int T, int H, int D);
void hp_attn_sinks_bwd(float *dsinks, const float *dout, const float *out, const float *lse,
		       const float *sinks, int B, int T, int H, int D);
/* The clamped SwiGLU, h [rows, I] = (clamp(u, -limit, limit) + 1) *
 * g' * sigmoid(alpha * g'), g' = min(g, limit); row r's gate and up at
 * g + r * ld, u + r * ld; dg and du written with the same stride. */
void hp_glu_clamp_fwd(float *h, const float *g, const float *u, long ld, long rows, int I, float alpha,
		      float limit);
void hp_glu_clamp_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, long ld, long rows,
		      int I, float alpha, float limit);
/* Per-expert biases on rows grouped by expert (off [nx + 1]): x[r, j] +=
 * bias[e * bs + j] for j < n; the backward adds the column sums to db. */
void hp_bias_grouped_fwd(float *x, long ld, const float *bias, size_t bs, const int32_t *off, int nx, int n);
void hp_bias_grouped_bwd(float *db, size_t bs, const float *dx, long ld, const int32_t *off, int nx, int n);

/* ---- the MoE routers (Qwen3-MoE, DeepSeek-V3) and routing (router.c) ---- */
/* In place on probs [N, E]: the router logits in, their softmax out (fp32
 * exps, the sum in double); sel [N, K] the top-K experts by falling
 * probability (ties to the lower index), wsel [N, K] their probabilities,
 * renormalised to sum 1 when norm (norm_topk_prob). */
void hp_router_topk(float *probs, int32_t *sel, float *wsel, long N, int E, int K, int norm);
/* dprob [N, E] overwritten with the gradient of the router logits, from
 * dwsel [N, K] (the gradient of wsel) and, when aux_grad != 0, the
 * load-balancing loss's aux_grad * aux[e] on every probability. */
void hp_router_bwd(float *dprob, const float *probs, const int32_t *sel, const float *wsel,
		   const float *dwsel, const double *aux, double aux_grad, long N, int E, int K, int norm);
/* DeepSeek-V3's router (DeepseekV3TopkRouter), in place on probs [N, E]:
 * the router logits in, s = sigmoid(logits) out (in double, rounded once).
 * The choice score c = s + bias (bias [E], NULL: 0); the experts are G
 * groups of E/G consecutive ones (E % G == 0, E/G >= 2), a group's score
 * the sum of its two largest c; the TG groups with the largest scores are
 * kept (1 <= TG <= G), the others' experts get c = -inf (mask_zero 0,
 * transformers 5) or 0 (mask_zero 1, transformers 4.57's masked_fill with
 * 0.0); sel [N, K] the K <= E experts with the largest c, by falling c.
 * Every choice: ties to the lower index, a NaN counted as -inf.  wsel
 * [N, K] = s[sel], divided by (their sum + 1e-20f) when norm
 * (norm_topk_prob), times scale (routed_scaling_factor).  Parallel over
 * tokens, the same bits at any thread count. */
void hp_router_group_fwd(float *probs, int32_t *sel, float *wsel, const float *bias, long N, int E, int K, int G,
			 int TG, int norm, float scale, int mask_zero);
/* dlogits [N, E] overwritten (0 but at the chosen experts) from dwsel
 * [N, K], probs holding s: with D = sum_k s[sel_k] + 1e-20 and u_k =
 * dwsel_k * scale, ds_k = u_k/D - (sum_j u_j s[sel_j])/D^2 (norm) or u_k,
 * dlogit = ds s (1 - s), in double and rounded once.  The choice and the
 * bias take no gradient. */
void hp_router_group_bwd(float *dlogits, const float *probs, const int32_t *sel, const float *dwsel, long N, int E,
			 int K, int norm, float scale);
/* The routing table, expert-major rows: off [E+1] the first row of each
 * expert (token order within one), row r is token row_tok[r]'s slot
 * row_slot[r]; tok_rows [N, K] (when not NULL) token t's K rows in
 * ascending order.  Choices outside [0, E) (a top-k of NaN logits) become
 * expert 0, in sel too; their number is added to *bad. */
void hp_moe_route(int32_t *off, int32_t *row_tok, int32_t *row_slot, int32_t *tok_rows, int32_t *bad,
		  int32_t *sel, long N, int E, int K);
/* HF's load_balancing_loss_func in two parts.  acc, per MoE layer: FP[x] +=
 * off[x+1] - off[x] (the slots routed to x), FP[E+x] += the sum over t < N
 * in order of probs[t, x].  fin, after the last: FP[x] /= n (n the router
 * outputs of every layer), *aux = E * sum over x of FP[x] * (FP[E+x] / n),
 * and *acc += *aux / div when acc is not NULL (the step's sum). */
void hp_moe_aux_acc(double *FP, const float *probs, const int32_t *off, long N, int E);
void hp_moe_aux_fin(double *FP, double *aux, double *acc, int E, double n, double div);

/* ---- cross-entropy over logits[N, V] ---- */
#define HP_IGNORE_INDEX (-100)
/* Sum of -log softmax(logits)[target] over rows whose target != -100; the
 * number of such rows goes to *count.  A target outside [0, V) other than
 * -100 returns -1 (and nothing else is defined). */
int hp_cross_entropy_fwd(double *loss_sum, long *count, const float *logits, const int32_t *targets,
			 long N, int V);
/* dlogits = scale * (softmax(logits) - onehot(target)), zero rows for
 * ignored targets; may run in place (dlogits == logits). */
void hp_cross_entropy_bwd(float *dlogits, const float *logits, const int32_t *targets,
			  long N, int V, float scale);

/* Vocab-parallel cross-entropy over a rank's vocabulary range [v0, v0+Vl)
 * (loss_parallel): the caller all-reduces mx (MAX) after hp_vp_ce_max and
 * stats (SUM, 2 doubles per row) after hp_vp_ce_sums; see crossentropy.c. */
void hp_vp_ce_max(float *mx, const float *logits, long N, int Vl);
void hp_vp_ce_sums(double *stats, const float *logits, const float *mx, const int32_t *targets,
		   long N, int Vl, int v0);
int hp_vp_ce_loss(double *loss_sum, long *count, const double *stats, const float *mx,
		  const int32_t *targets, long N, int V);
void hp_vp_ce_bwd(float *dlogits, const float *logits, const double *stats, const float *mx,
		  const int32_t *targets, long N, int Vl, int v0, float scale);

/* ---- AdamW, exactly torch.optim.AdamW (decoupled weight decay) ---- */
struct hp_adamw_hparams {
	double lr, beta1, beta2, eps, weight_decay;   /* as Python floats */
	long step;                  /* 1-based step count after increment */
};
void hp_adamw_step(float *w, const float *g, float *m, float *v, size_t n,
		   const struct hp_adamw_hparams *h, int decay);
/* torch's clip_grad_norm_ factor for the total norm: (float)(max_norm /
 * (norm + 1e-6)), 1 when that is at least 1 or max_norm <= 0 (no clip). */
float hp_clip_factor(double norm, double max_norm);
/* The step's gate from its sums: cg[0] the clip factor of the norm
 * sqrt(*ss), cg[1] 1 to update or 0 to skip it (the router chose experts
 * out of range, *bad; or check, and the loss sum, the aux sum or the norm
 * not finite). */
void hp_clip_gate(float *cg, const double *ss, const double *loss, const double *aux, const int32_t *bad,
		  double max_norm, int check);
/* hp_clip_gate, then g[n] *= cg[0] unless it is 1 (hp_scale) */
void hp_clip_grads(float *g, size_t n, float *cg, const double *ss, const double *loss, const double *aux,
		   const int32_t *bad, double max_norm, int check);

/* ---- the op table: ops that have more than one implementation ---- */
/* The forms of the ops that come in several variants (the op table's and
 * the kernel registry's, lib/backend/kernels.h). */
/* y[N,O] = x[N,K] W[O,K]^T (+ b[O] when b) */
typedef void hp_linear_fwd_fn(float *y, const float *x, const float *W, const float *b, long N, int K, int O);
/* dx = (accumulate ? dx : 0) + dy W; dW += dy^T x; db += colsum(dy) when db */
typedef void hp_linear_bwd_fn(float *dx, float *dW, float *db, const float *dy, const float *x,
			      const float *W, long N, int K, int O, int accumulate);
/* The grouped experts (lib/backend's grouped_fwd/_bwd) on a host: expert
 * i < nx's rows [off[i], off[i+1]) through f with the weight W + i*ws and
 * its gradient dW + i*gs, expert by expert (dx not NULL). */
void hp_grouped_linear_fwd(hp_linear_fwd_fn *f, float *y, const float *x, const float *W, size_t ws,
			   const int32_t *off, int nx, int K, int O);
void hp_grouped_linear_bwd(hp_linear_bwd_fn *f, float *dx, float *dW, size_t gs, const float *dy, const float *x,
			   const float *W, size_t ws, const int32_t *off, int nx, int K, int O, int accumulate);
/* Causal GQA attention over B rows of T tokens; saves P.  seg[B*T]
 * (or NULL: one document per row) gives, per token, the index in its
 * row where its document starts; documents are contiguous, so seg is
 * non-decreasing along a row and seg[i] <= i. */
typedef void hp_attention_fwd_fn(float *out, float *P, const float *q, const float *k, const float *v,
				 const int32_t *seg, int B, int T, int n_heads, int n_kv_heads, int head_dim);
/* dq, dk, dv are overwritten; scratch holds at least T*T floats. */
typedef void hp_attention_bwd_fn(float *dq, float *dk, float *dv, const float *dout, const float *P,
				 const float *q, const float *k, const float *v, const int32_t *seg,
				 float *scratch, int B, int T, int n_heads, int n_kv_heads, int head_dim);
typedef void hp_swiglu_fwd_fn(float *h, const float *g, const float *u, long n);
typedef void hp_swiglu_bwd_fn(float *dg, float *du, const float *dh, const float *g, const float *u, long n);
typedef int hp_cross_entropy_fwd_fn(double *loss_sum, long *count, const float *logits,
				    const int32_t *targets, long N, int V);
typedef void hp_cross_entropy_bwd_fn(float *dlogits, const float *logits, const int32_t *targets,
				     long N, int V, float scale);

struct hp_cpu_ops {
	const char *name;     /* "reference" or "blas" */
	hp_linear_fwd_fn *linear_fwd;
	hp_linear_bwd_fn *linear_bwd;
	hp_attention_fwd_fn *attention_fwd;
	hp_attention_bwd_fn *attention_bwd;
	hp_swiglu_fwd_fn *swiglu_fwd;
	hp_swiglu_bwd_fn *swiglu_bwd;
	hp_cross_entropy_fwd_fn *cross_entropy_fwd;
	hp_cross_entropy_bwd_fn *cross_entropy_bwd;
};

extern const struct hp_cpu_ops hp_cpu_ops_reference;
extern const struct hp_cpu_ops hp_cpu_ops_blas;     /* OpenBLAS + vectorised element-wise ops */
/* The table in use: HP_KERNELS=reference selects the references. */
const struct hp_cpu_ops *hp_cpu_ops_get(void);

/* Reference implementations, also reachable directly for tests. */
void hp_linear_fwd_ref(float *y, const float *x, const float *W, const float *b, long N, int K, int O);
void hp_linear_bwd_ref(float *dx, float *dW, float *db, const float *dy, const float *x,
		       const float *W, long N, int K, int O, int accumulate);
void hp_attention_fwd_ref(float *out, float *P, const float *q, const float *k, const float *v,
			  const int32_t *seg, int B, int T, int n_heads, int n_kv_heads, int head_dim);
void hp_attention_bwd_ref(float *dq, float *dk, float *dv, const float *dout, const float *P,
			  const float *q, const float *k, const float *v, const int32_t *seg, float *scratch,
			  int B, int T, int n_heads, int n_kv_heads, int head_dim);

/* Fast variants (the "blas" table). */
void hp_linear_fwd_blas(float *y, const float *x, const float *W, const float *b, long N, int K, int O);
void hp_linear_bwd_blas(float *dx, float *dW, float *db, const float *dy, const float *x,
			const float *W, long N, int K, int O, int accumulate);
void hp_attention_fwd_blas(float *out, float *P, const float *q, const float *k, const float *v,
			   const int32_t *seg, int B, int T, int n_heads, int n_kv_heads, int head_dim);
void hp_attention_bwd_blas(float *dq, float *dk, float *dv, const float *dout, const float *P,
			   const float *q, const float *k, const float *v, const int32_t *seg, float *scratch,
			   int B, int T, int n_heads, int n_kv_heads, int head_dim);
void hp_swiglu_fwd_vec(float *h, const float *g, const float *u, long n);
void hp_swiglu_bwd_vec(float *dg, float *du, const float *dh, const float *g, const float *u, long n);
int hp_cross_entropy_fwd_vec(double *loss_sum, long *count, const float *logits, const int32_t *targets,
			     long N, int V);
void hp_cross_entropy_bwd_vec(float *dlogits, const float *logits, const int32_t *targets,
			      long N, int V, float scale);

/* ---- flash attention (kernels/cpu/flashattn.c) ------------------------
 * The causal GQA attention of attention_fwd/attention_bwd above - same
 * layouts, same seg, same HF semantics - computed FlashAttention-2 style in
 * tiles, so that nothing of size T x T is ever stored.  Instead of P the
 * forward saves lse[B, n_heads, T]: for query i of head h in row b,
 * lse = log(sum_j exp(scale * q_i . k_j)) (natural log, scale =
 * 1/sqrt(head_dim), j over the keys the mask lets i see); the backward
 * recomputes P from it.
 * Preconditions: n_heads a multiple of n_kv_heads, and
 * hp_flash_attention_supports(head_dim); a call that breaks them is the
 * caller's bug and fills the outputs with NaN.  Results match the eager
 * kernels to float rounding and are bit-identical for any thread count
 * (work is split over hp_sgemm_threads() threads, or the number set with
 * hp_attention_set_threads, when a call is large enough) and on
 * every x86-64 level.  Tiles live on the stack: up to about 300 KiB of the
 * calling thread's.
 * Environment: HP_CPU=avx2 or HP_CPU=baseline caps the compiled
 * version used (read on every call; for tests and benchmarks). */
#define HP_FLASH_ATTENTION_MAX_HEAD_DIM 512
int hp_flash_attention_supports(int head_dim);
/* out[B*T, n_heads*head_dim] and lse[B, n_heads, T] are overwritten. */
void hp_flash_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
			    const int32_t *seg, int B, int T, int n_heads, int n_kv_heads, int head_dim);
/* dq, dk, dv overwritten (same layouts as q, k, v); out and lse are the
 * forward's.  scratch: at least hp_flash_attention_scratch(T, n_heads,
 * head_dim) floats (may be NULL when that is 0). */
void hp_flash_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
			    const float *lse, const float *q, const float *k, const float *v,
			    const int32_t *seg, float *scratch, int B, int T, int n_heads,
			    int n_kv_heads, int head_dim);
/* The two with a GPU's roundings (kernels/cuda/flashattn.c's tensor
 * cores read bf16): P rounded to bf16 (nearest even) before P V, the sum
 * l of the unrounded P; in the backward dS from the unrounded P, then P
 * rounded before dV = P^T dO and dS before dQ and dK.  For the CUDA
 * emulation's bf16 mode (lib/backend/cuda_emu.c). */
void hp_flash_attention_fwd_round(float *out, float *lse, const float *q, const float *k, const float *v,
				  const int32_t *seg, int B, int T, int n_heads, int n_kv_heads, int head_dim);
void hp_flash_attention_bwd_round(float *dq, float *dk, float *dv, const float *dout, const float *out,
				  const float *lse, const float *q, const float *k, const float *v,
				  const int32_t *seg, float *scratch, int B, int T, int n_heads,
				  int n_kv_heads, int head_dim);
/* Floats of scratch the backward needs: 0 in this version (tiles live on
 * each thread's stack); callers size the buffer through it all the same. */
size_t hp_flash_attention_scratch(int T, int n_heads, int head_dim);
/* Threads for every attention kernel (the BLAS, flash and context-parallel
 * ones): n > 0 fixes the count (tests, benchmarks), 0 restores the default,
 * hp_sgemm_threads().  No result depends on it. */
void hp_attention_set_threads(int n);

/* ---- context-parallel attention (kernels/cpu/cpattn.c) ----
 * Causal GQA attention of a chunk of queries against all keys of their
 * rows: q [B, Tq, Hq*D] holds the queries at positions q0 .. q0+Tq-1 of
 * rows of S tokens, k and v [B, S, Hkv*D] every key and value of those rows.
 * seg[B*Tq] (NULL: one document per row) gives for each query the position
 * in its row (0..S-1) where its document starts: the query at position p
 * sees keys seg..p only (HF semantics as attention_fwd: scale 1/sqrt(D),
 * softmax in fp32, query head h reads kv head h / (Hq/Hkv)).  Only the
 * visible keys are read.
 * Forward: out [B, Tq, Hq*D] overwritten; when P is non-NULL it receives the
 * probabilities [B, Hq, Tq, S] (zeros outside the mask); when lse is non-NULL
 * it receives [B, Hq, Tq] the natural-log sum of exp of the scaled scores over
 * the visible keys (as the flash kernel's lse).  At least one of P, lse is given.
 * Backward: dq [B,Tq,Hq*D], dk and dv [B,S,Hkv*D] overwritten (dk, dv are this
 * chunk's contribution to every key: the caller sums them over ranks). Uses P
 * when non-NULL (out may then be NULL), else recomputes P from lse (then out
 * is needed for rowsum(dout*out)). scratch: hp_cp_attention_scratch(S) floats. */
void hp_cp_attention_fwd(float *out, float *P, float *lse, const float *q, const float *k, const float *v,
			 const int32_t *seg, int B, int Tq, int S, int q0, int Hq, int Hkv, int D);
void hp_cp_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
			 const float *P, const float *lse, const float *q, const float *k, const float *v,
			 const int32_t *seg, float *scratch, int B, int Tq, int S, int q0, int Hq, int Hkv, int D);
size_t hp_cp_attention_scratch(int S);

/* ---- Qwen3-Next / Qwen3.5: Gated DeltaNet's side kernels and the sigmoid
 * gates (kernels/cpu/gdn.c; its opening comment gives each formula and where
 * transformers computes it).  Plain fp32, bit-identical at any thread count;
 * sigmoid from exp(-|x|), finite for any finite input.  No output aliases an
 * input, except y = x in hp_sigmoid_gate_fwd and _rows_fwd.
 *
 * Causal depthwise conv1d (no bias) then SiLU: x, y [B, T, C], w [C, K]
 * (nn.Conv1d's [C, 1, K] squeezed), 1 <= K <= HP_CONV1D_SILU_MAX_K,
 *   y[t,c] = silu(sum_j w[c,j] x[t-(K-1)+j, c]),
 * x before the row's start, or with seg [B*T] (each token's document start
 * position in its row, non-decreasing; NULL: one document a row) before the
 * token's document start, read as 0.  The backward recomputes the
 * pre-activation from x (the forward keeps nothing): dx [B, T, C]
 * overwritten, dw [C, K] accumulated. */
#define HP_CONV1D_SILU_MAX_K 1024
void hp_conv1d_silu_fwd(float *y, const float *x, const float *w, const int32_t *seg, int B, int T, int C, int K);
void hp_conv1d_silu_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, const int32_t *seg,
			int B, int T, int C, int K);
/* Qwen3NextRMSNormGated over N rows of D: y = (w * (x * rstd)) * silu(z),
 * rstd [N] = 1/sqrt(mean(x^2) + eps) kept for the backward, which
 * overwrites dx, dz [N, D] and accumulates dw [D]. */
void hp_rmsnorm_gated_fwd(float *y, float *rstd, const float *x, const float *z, const float *w, long N, int D,
			  float eps);
void hp_rmsnorm_gated_bwd(float *dx, float *dz, float *dw, const float *dy, const float *x, const float *z,
			  const float *w, const float *rstd, long N, int D);
/* Gated attention's output: y = x * sigmoid(gate) over n values; dx and
 * dgate overwritten. */
void hp_sigmoid_gate_fwd(float *y, const float *x, const float *gate, long n);
void hp_sigmoid_gate_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate, long n);
/* The shared expert's gate: y[t,:] = x[t,:] * sigmoid(gate[t]), x [T, C],
 * one logit a token; dx [T, C] and dgate [T] overwritten. */
void hp_sigmoid_gate_rows_fwd(float *y, const float *x, const float *gate, long T, int C);
void hp_sigmoid_gate_rows_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate, long T,
			      int C);
/* The delta rule's gates over b, a [N, H] (H value heads):
 *   beta = sigmoid(b),  g = -exp(A_log[h]) * softplus(a + dt_bias[h])
 * (torch's softplus: identity above 20).  Backward: db, da [N, H]
 * overwritten, dA_log and ddt_bias [H] accumulated. */
void hp_gdn_gates_fwd(float *beta, float *g, const float *b, const float *a, const float *A_log,
		      const float *dt_bias, long N, int H);
void hp_gdn_gates_bwd(float *db, float *da, float *dA_log, float *ddt_bias, const float *dbeta, const float *dg,
		      const float *b, const float *a, const float *A_log, const float *dt_bias, long N, int H);
/* ---- the gated delta rule (kernels/cpu/deltanet.c) ----
 * Qwen3-Next's Gated DeltaNet recurrence (transformers'
 * torch_recurrent_gated_delta_rule): per row b and value head h a state
 * S [Dk, Dv], zero at each document's start, and at each token
 *     S' = exp(g) S, u = beta (v - S'^T k), S = S' + k u^T, o = S^T (scale q).
 * Layouts: q, k [B, T, Hk, Dk] (already L2-normalised), v and out
 * [B, T, Hv, Dv], g (log decay, <= 0) and beta [B, T, Hv]; value head h
 * reads key head h / (Hv / Hk), Hv a multiple of Hk.  seg [B*T] as the
 * attention kernels' (each token's document start in its row; NULL: one
 * document per row).  Gradients overwrite: dq, dk [B, T, Hk, Dk] (summed
 * over the value heads of a key head), dv [B, T, Hv, Dv], dg, dbeta
 * [B, T, Hv].
 * The reference (token by token, the state in double) allocates with
 * hp_malloc: (T/64 + 67) Dk Dv doubles for the backward; it returns 0, or
 * -1 with the outputs NaN when that fails.
 * The fast path works in chunks of HP_GDR_CHUNK tokens (cut at document
 * starts), bit-identical for any thread count.  The forward writes
 * saved (hp_gdr_saved_floats floats; may be NULL when no backward follows),
 * the state at the start of each chunk of 64, which the backward reads;
 * both need scratch of hp_gdr_scratch_floats(B, Hv, Dk, Dv) floats, 8-byte
 * aligned (it depends on the pool's thread count, fixed per process): a
 * unit of hp_gdr_unit_floats(Dk, Dv) for each thread at work, at most B Hv
 * of them.  (The CUDA kernel takes a unit a block, B Hv at most, and its
 * working set is smaller: B Hv units serve both.)
 * Hv not a multiple of Hk is the caller's bug: the outputs are NaN. */
#define HP_GDR_CHUNK 64
int hp_gdr_ref_fwd(float *out, const float *q, const float *k, const float *v, const float *g,
		   const float *beta, const int32_t *seg, int B, int T, int Hv, int Hk, int Dk, int Dv,
		   float scale);
int hp_gdr_ref_bwd(float *dq, float *dk, float *dv, float *dg, float *dbeta, const float *dout,
		   const float *q, const float *k, const float *v, const float *g, const float *beta,
		   const int32_t *seg, int B, int T, int Hv, int Hk, int Dk, int Dv, float scale);
size_t hp_gdr_saved_floats(int B, int T, int Hv, int Dk, int Dv);
/* the flops of the chunked forward and backward as they compute them,
 * every chunk counted full (deltanet.c: what each term is) */
void hp_gdr_flops(int B, int T, int Hv, int Dk, int Dv, double *fwd, double *bwd);
size_t hp_gdr_unit_floats(int Dk, int Dv);
size_t hp_gdr_scratch_floats(int B, int Hv, int Dk, int Dv);
void hp_gdr_fwd(float *out, float *saved, const float *q, const float *k, const float *v, const float *g,
		const float *beta, const int32_t *seg, float *scratch, int B, int T, int Hv, int Hk, int Dk, int Dv,
		float scale);
void hp_gdr_bwd(float *dq, float *dk, float *dv, float *dg, float *dbeta, const float *dout, const float *saved,
		const float *q, const float *k, const float *v, const float *g, const float *beta, const int32_t *seg,
		float *scratch, int B, int T, int Hv, int Hk, int Dk, int Dv, float scale);
/* transformers' l2norm over rows of D: y = x / sqrt(sum x^2 + 1e-6) (sum
 * in double), rinv[N] the factor; the backward dx = rinv (dy - y (y.dy)). */
void hp_l2norm_fwd(float *y, float *rinv, const float *x, long N, int D);
void hp_l2norm_bwd(float *dx, const float *dy, const float *y, const float *rinv, long N, int D);

#endif
