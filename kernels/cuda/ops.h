/*
 * cuda/ops.h - the CUDA backend: every op of the CPU op table (cpu/ops.h),
 * forward and backward, on device memory.
 *
 * Conventions (the CPU's, see cpu/ops.h, unless said otherwise):
 *  - Every pointer named here is a DEVICE pointer, except where a comment
 *    says "host".  Shapes are row-major, N = tokens, a token one row.
 *  - Storage: activations and the working copy of the weights are bf16
 *    (hp_bf16, raw bits); the residual stream, norm weights, the weights'
 *    gradients, the master weights and AdamW's moments are fp32.  Every
 *    reduction and every GEMM accumulates in fp32.
 *  - Weight gradients (dW, db, dw, dtable) accumulate (+=) so micro-batches
 *    add up; activation gradients overwrite unless a flag says accumulate.
 *  - Every launch goes to the backend's one stream (hp_cuda_stream); calls
 *    are asynchronous unless they say "synchronises".  Kernels return
 *    nothing: a launch error surfaces at the next hp_cuda_sync/hp_cuda_check.
 *  - Deterministic: every kernel here gives the same bits on every run (no
 *    float atomics; reductions in a fixed order), so that two runs of a
 *    deterministic configuration give bit-identical losses.
 *  - Errors: functions that return int return 0 or HP_ECUDA with the
 *    CUDA/cuBLAS error string in e.
 *
 * Tested against the CPU reference by t/unit/test-cuda*.c on a machine with
 * a GPU (scripts/gpu-check.sh); they skip without one.
 */
#ifndef HP_KERNELS_CUDA_OPS_H
#define HP_KERNELS_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t hp_bf16;   /* bfloat16 bits; round-to-nearest-even from fp32 */

/* ---- device, stream, memory (context.cu) ---- */
/* Number of usable CUDA devices (0 when there is no driver or GPU). */
int hp_cuda_device_count(void);
/* "NVIDIA H200 (sm_90, 139 GiB)" for device dev, into buf (host). */
int hp_cuda_device_name(int dev, char *buf, unsigned long n, struct hp_err *e);
/* Select device dev for this process, create the stream, the cuBLASLt
 * handle and its workspace.  Once per process; hp_cuda_fini undoes it. */
int hp_cuda_init(int dev, struct hp_err *e);
void hp_cuda_fini(void);
void *hp_cuda_stream(void);                    /* the cudaStream_t */
int hp_cuda_sync(struct hp_err *e);            /* synchronises the stream, reports any error */
int hp_cuda_check(struct hp_err *e);           /* reports a pending launch error, no sync */
/* One cudaMalloc (zeroed); NULL with e set on failure.  Only at set-up: the
 * step loop allocates nothing. */
void *hp_cuda_alloc(size_t bytes, struct hp_err *e);
void hp_cuda_free(void *p);
/* Copies on the stream; the host side must stay valid until the next sync.
 * hp_cuda_download synchronises. */
int hp_cuda_upload(void *dst, const void *host_src, size_t bytes, struct hp_err *e);
int hp_cuda_download(void *host_dst, const void *src, size_t bytes, struct hp_err *e);
void hp_cuda_zero(void *p, size_t bytes);
void hp_cuda_copy(void *dst, const void *src, size_t bytes);   /* device to device */
/* Make the element-wise kernels' scratch (the reductions' partial sums)
 * for rows of up to max_cols, so that nothing is allocated later. */
int hp_cuda_reserve(int max_cols, struct hp_err *e);
/* Bytes of device memory free and total (host outputs). */
int hp_cuda_mem_info(size_t *free_b, size_t *total_b, struct hp_err *e);

/* ---- conversions and element-wise (elementwise.cu) ---- */
void hp_cuda_f32_to_bf16(hp_bf16 *y, const float *x, size_t n);
/* h[i] += (float)o[i]: a block's output added to the fp32 residual */
void hp_cuda_add_bf16(float *h, const hp_bf16 *o, size_t n);
/* x[i] *= s */
void hp_cuda_scale(float *x, float s, size_t n);
/* Sum of squares of x (fp32) in double, into *host_out; synchronises.
 * Fixed reduction order. */
int hp_cuda_sumsq(double *host_out, const float *x, size_t n, struct hp_err *e);

/* ---- embedding ---- */
void hp_cuda_embedding_fwd(float *out, const int32_t *ids, const hp_bf16 *table, long N, int C);
/* dtable[id] += dout rows, deterministically: the caller passes the tokens
 * grouped by id: order[N] token indices sorted by (id, index), and
 * starts[nu + 1] where group u is order[starts[u] .. starts[u+1]) and all
 * share the id ids[order[starts[u]]] (hp_cuda_embedding_groups builds them
 * on the host). */
void hp_cuda_embedding_bwd(float *dtable, const float *dout, const int32_t *ids,
			   const int32_t *order, const int32_t *starts, int nu, long N, int C);
/* Host helper (host code, lib/gmodel.c, in every build): order and starts
 * as above from host ids, leaving out the tokens whose id is pad (>= 0:
 * nn.Embedding's padding_idx, whose row gets no gradient); returns nu. */
int hp_cuda_embedding_groups(int32_t *order, int32_t *starts, const int32_t *ids, long N, int pad);

/* ---- RMSNorm: y = w * (x * rstd), rstd = 1/sqrt(mean(x^2) + eps) ---- */
/* x fp32 (the residual stream), y bf16, rstd [N] fp32. */
void hp_cuda_rmsnorm_fwd(hp_bf16 *y, float *rstd, const float *x, const float *w,
			 long N, int C, float eps);
/* dx (fp32) = (accumulate ? dx : 0) + d/dx; dw += d/dw (fixed order over rows). */
void hp_cuda_rmsnorm_bwd(float *dx, float *dw, const hp_bf16 *dy, const float *x, const float *w,
			 const float *rstd, long N, int C, int accumulate);
/* The same on bf16 rows (Qwen3's q_norm / k_norm, per head: N = tokens*heads,
 * C = head_dim), dx overwritten. */
void hp_cuda_rmsnorm_fwd_bf16(hp_bf16 *y, float *rstd, const hp_bf16 *x, const float *w,
			      long N, int C, float eps);
void hp_cuda_rmsnorm_bwd_bf16(hp_bf16 *dx, float *dw, const hp_bf16 *dy, const hp_bf16 *x,
			      const float *w, const float *rstd, long N, int C);

/* ---- RoPE (HF rotate_half), in place on bf16 [N, H*D]; tables fp32 [T, D/2] ---- */
void hp_cuda_rope_fwd(hp_bf16 *x, const int32_t *pos, const float *cos_t, const float *sin_t,
		      long N, int H, int D);
void hp_cuda_rope_bwd(hp_bf16 *dx, const int32_t *pos, const float *cos_t, const float *sin_t,
		      long N, int H, int D);

/* ---- SwiGLU on rows of [gate | up] (2*I each): h = silu(g) * u ---- */
void hp_cuda_swiglu_fwd(hp_bf16 *h, const hp_bf16 *gu, long rows, int I);
/* dgu overwritten, same layout as gu */
void hp_cuda_swiglu_bwd(hp_bf16 *dgu, const hp_bf16 *dh, const hp_bf16 *gu, long rows, int I);

/* ---- GEMMs through cuBLASLt, bf16 inputs, fp32 accumulation (gemm.cu) ---- */
/* y[N,O] = x[N,K] W[O,K]^T (+ b[O] when b); y is bf16 (y_f32 0) or fp32 (y_f32 1). */
int hp_cuda_linear_fwd(void *y, int y_f32, const hp_bf16 *x, const hp_bf16 *W, const float *b,
		       long N, int K, int O, struct hp_err *e);
/* dx[N,K] = (accumulate ? dx : 0) + dy[N,O] W[O,K]   (bf16 out) */
int hp_cuda_linear_bwd_dx(hp_bf16 *dx, const hp_bf16 *dy, const hp_bf16 *W, long N, int K, int O,
			  int accumulate, struct hp_err *e);
/* dW[O,K] += dy^T x (fp32); db[O] += colsum(dy) when db */
int hp_cuda_linear_bwd_dw(float *dW, float *db, const hp_bf16 *dy, const hp_bf16 *x,
			  long N, int K, int O, struct hp_err *e);
/* Grouped experts: group g has rows [off[g], off[g+1]) of x and y (off is
 * HOST memory, ng+1 entries) and weight W[g] (host array of device
 * pointers, each [O,K]).  Empty groups are skipped. */
int hp_cuda_grouped_fwd(hp_bf16 *y, const hp_bf16 *x, const hp_bf16 *const *W, const int32_t *off,
			int ng, int K, int O, struct hp_err *e);
int hp_cuda_grouped_bwd_dx(hp_bf16 *dx, const hp_bf16 *dy, const hp_bf16 *const *W,
			   const int32_t *off, int ng, int K, int O, struct hp_err *e);
int hp_cuda_grouped_bwd_dw(float *const *dW, const hp_bf16 *dy, const hp_bf16 *x,
			   const int32_t *off, int ng, int K, int O, struct hp_err *e);

/* ---- MoE routing (moe.cu) ---- */
/* probs[N,E] = softmax(logits) in fp32 (in place allowed: probs == logits);
 * sel[N,k] the top-k experts by falling probability, ties to the lower
 * index; wsel[N,k] their probabilities, renormalised to sum 1 when norm. */
void hp_cuda_router_topk(float *probs, int32_t *sel, float *wsel, const float *logits,
			 long N, int E, int k, int norm);
/* Backward to the router logits: dwsel[N,k] the gradient of wsel, aux[E]
 * (or NULL) adds aux_grad * aux[e] to every dprob[., e] (the load-balancing
 * loss, as lib/model.c); dlogits[N,E] bf16 overwritten. */
void hp_cuda_router_bwd(hp_bf16 *dlogits, const float *probs, const int32_t *sel, const float *wsel,
			const float *dwsel, const float *aux, double aux_grad, long N, int E, int k, int norm);
/* xs[r] = x[row_tok[r]] for r < R (bf16 rows of C) */
void hp_cuda_gather_rows(hp_bf16 *xs, const hp_bf16 *x, const int32_t *row_tok, long R, int C);
/* out[t] = sum over slots j of wsel[t,j] * ye[tok_row[t*k+j]], j in order;
 * out bf16 [N,C] overwritten; tok_row[N*k] maps (token, slot) to its row. */
void hp_cuda_combine(hp_bf16 *out, const hp_bf16 *ye, const float *wsel, const int32_t *tok_row,
		     long N, int k, int C);
/* Its backward: dye[tok_row[t,j]] = wsel[t,j] * dout[t]; dwsel[t,j] = dout[t] . ye[row] */
void hp_cuda_combine_bwd(hp_bf16 *dye, float *dwsel, const hp_bf16 *dout, const hp_bf16 *ye,
			 const float *wsel, const int32_t *tok_row, long N, int k, int C);
/* dx[t] += sum over slots j (in order) of dxe[tok_row[t,j]]  (bf16) */
void hp_cuda_scatter_add_rows(hp_bf16 *dx, const hp_bf16 *dxe, const int32_t *tok_row,
			      long N, int k, int C);

/* ---- flash attention, sm_80+ (flashattn.cu) ----
 * Same semantics as hp_flash_attention_fwd/bwd in cpu/ops.h: causal GQA
 * over B rows of T tokens, q [B*T, Hq*D], k and v [B*T, Hkv*D] (bf16),
 * seg[B*T] document starts or NULL, scale 1/sqrt(D), softmax in fp32,
 * lse [B, Hq, T] fp32 (natural log).  D 64 and 128 run on the tensor
 * cores (flashattn.cu); other D up to 256 on one thread per row
 * (attnsmall.cu: the tests' small models); hp_cuda_flash_supports says which.
 * The backward is deterministic: dK/dV by key tile, dQ by query tile, no
 * atomics; scratch holds hp_cuda_flash_scratch(B, T, Hq) floats. */
#define HP_CUDA_ATTN_MAX_HEAD_DIM 256
int hp_cuda_flash_supports(int D);
void hp_cuda_flash_fwd(hp_bf16 *out, float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
		       const int32_t *seg, int B, int T, int Hq, int Hkv, int D);
void hp_cuda_flash_bwd(hp_bf16 *dq, hp_bf16 *dk, hp_bf16 *dv, const hp_bf16 *dout, const hp_bf16 *out,
		       const float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
		       const int32_t *seg, float *scratch, int B, int T, int Hq, int Hkv, int D);
size_t hp_cuda_flash_scratch(int B, int T, int Hq);

/* ---- cross-entropy on fp32 logits [n, V] (ce.cu) ----
 * One pass per row: loss[r] = -log softmax(logits[r])[t] (0 for t == -100),
 * and dlogits[r] = scale * (softmax - onehot) (zero row for -100), bf16.
 * The chunked LM head calls it chunk by chunk. */
void hp_cuda_ce_fwd_bwd(float *loss, hp_bf16 *dlogits, const float *logits, const int32_t *targets,
			long n, int V, float scale);

/* ---- AdamW on fp32 master weights (adamw.cu) ----
 * Exactly kernels/cpu/adamw.c's arithmetic (torch.optim.AdamW, decoupled
 * decay; bias corrections computed in double on the host, rounded to float
 * once), then wb = bf16(w), the working copy the GEMMs read. */
void hp_cuda_adamw(float *w, hp_bf16 *wb, const float *g, float *m, float *v, size_t n,
		   double lr, double beta1, double beta2, double eps, double weight_decay,
		   long step, int decay);

#ifdef __cplusplus
}
#endif

#endif
