/*
 * cuda/ops.h - the CUDA kernels under the CUDA backend (lib/backend/backend_cuda.c),
 * on device memory.
 *
 * Conventions (the CPU's, see cpu/ops.h, unless said otherwise):
 *  - Every pointer named here is a DEVICE pointer, except where a comment
 *    says "host".  Shapes are row-major, N = tokens, a token one row.
 *  - Storage: every activation, gradient, weight and moment is fp32; hp_bf16
 *    arrays are the operands the tensor cores read: a GEMM's x, dy and
 *    weights (the backend's working copy) and attention's q, k, v, out,
 *    dout, made by hp_cuda_f32_to_bf16.  Every reduction and every GEMM
 *    accumulates in fp32 (some in double, as the CPU kernel does).
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
 * The host emulation (lib/backend/cuda_emu.c, HP_CUDA_EMULATE) implements this
 * same interface on the host from kernels/cpu: compiled with HP_CUDA_EMU,
 * this header declares hp_emu_* in place of hp_cuda_* (cuda/emu_names.h)
 * and hp_bf16 is a float holding a bf16 value (rounded, or in exact mode
 * the fp32 value itself: the "fp32 shadow").
 *
 * Tested against the CPU reference by t/unit/test-cuda*.c on a machine with
 * a GPU (scripts/gpu-check.sh), and under t/cuemu without one.
 */
#ifndef HP_KERNELS_CUDA_OPS_H
#define HP_KERNELS_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

#ifdef HP_CUDA_EMU
#include "cuda/emu_names.h"
typedef float hp_bf16;      /* the emulation: a bf16 value held in fp32 */
#else
typedef uint16_t hp_bf16;   /* bfloat16 bits; round-to-nearest-even from fp32 */
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device, stream, memory (context.cu) ---- */
/* Number of usable CUDA devices (0 when there is no driver or GPU). */
int hp_cuda_device_count(void);
/* "NVIDIA H200 (sm_90, 139 GiB)" for device dev, into buf (host). */
int hp_cuda_device_name(int dev, char *buf, unsigned long n, struct hp_err *e);
/* Select device dev for this process, create the stream, the cuBLASLt
 * handle and its workspace.  Once per process; hp_cuda_fini undoes it. */
int hp_cuda_init(int dev, struct hp_err *e);
/* Open cuBLASLt (dlopen: a CPU run never loads it) and resolve every
 * function the GEMM calls; hp_cuda_init does it first.  Needs no device.
 * 0, or HP_ECUDA naming the library or the missing function. */
int hp_cu_lt_open(struct hp_err *e);
void hp_cuda_fini(void);
void *hp_cuda_stream(void);                    /* the cudaStream_t */
int hp_cuda_sync(struct hp_err *e);            /* synchronises the stream, reports any error */
int hp_cuda_check(struct hp_err *e);           /* reports a pending launch error, no sync */
/* One cudaMalloc (zeroed); NULL with e set on failure.  Set-up and the
 * first step only: the step loop allocates nothing once sizes are known. */
void *hp_cuda_alloc(size_t bytes, struct hp_err *e);
void hp_cuda_free(void *p);
/* Virtual memory (CUDA's cuMem* API): an address range reserved with no
 * memory behind it, into which granules of physical memory are mapped
 * (zeroed, on the stream) and unmapped again, the device twin of the
 * host's fresh mappings and MADV_DONTNEED.  *granule: the size every map
 * and unmap is a multiple of (counted bytes: the backend's bookkeeping).
 * An unmapped granule's memory is pooled and its address given up only
 * once the stream has passed its last use (an event, never a device
 * synchronisation: NCCL forbids those while its collectives run).  The
 * emulation maps host pages and makes unmapped ones inaccessible, so that
 * a use of memory the GPU would not have faults there too. */
void *hp_cuda_vm_reserve(size_t bytes, size_t *granule, struct hp_err *e);
int hp_cuda_vm_map(void *p, size_t bytes, struct hp_err *e);
void hp_cuda_vm_unmap(void *p, size_t bytes);
void hp_cuda_vm_free(void *p, size_t bytes);
/* Pinned host memory (cudaHostAlloc): an upload from it is queued on the
 * stream without the host waiting.  NULL with e set on failure. */
void *hp_cuda_host_alloc(size_t bytes, struct hp_err *e);
void hp_cuda_host_free(void *p);
/* A mark on the stream (an event): recorded after the calls queued so far;
 * passed when the stream has run them all (no wait); waited for by the
 * host.  new: NULL with e set on failure. */
void *hp_cuda_mark_new(struct hp_err *e);
void hp_cuda_mark_free(void *mk);
int hp_cuda_mark_record(void *mk, struct hp_err *e);
int hp_cuda_mark_passed(void *mk);
int hp_cuda_mark_wait(void *mk, struct hp_err *e);
/* Timing marks for the kernel profile (backend.h, profile): n events
 * that time; mark i recorded on the stream after the calls queued so far;
 * after a sync, the milliseconds from mark i to mark j.  The emulation
 * reads the host's clock (its calls are done when they return).  new:
 * NULL with e set on failure. */
void *hp_cuda_timer_new(int n, struct hp_err *e);
void hp_cuda_timer_free(void *t, int n);
void hp_cuda_timer_mark(void *t, int i);
double hp_cuda_timer_ms(void *t, int i, int j);
/* Copies on the stream; the host side must stay valid until the next sync
 * (pinned memory: until a mark recorded after the copy has passed).
 * hp_cuda_download synchronises. */
int hp_cuda_upload(void *dst, const void *host_src, size_t bytes, struct hp_err *e);
int hp_cuda_download(void *host_dst, const void *src, size_t bytes, struct hp_err *e);
void hp_cuda_zero(void *p, size_t bytes);
void hp_cuda_copy(void *dst, const void *src, size_t bytes);   /* device to device, may overlap */
/* rows of width bytes from src (rows spitch apart) to dst (dpitch apart);
 * the two must not overlap */
void hp_cuda_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows);
/* Make the element-wise kernels' scratch (the reductions' partial sums)
 * for rows of up to max_cols, so that nothing is allocated later. */
int hp_cuda_reserve(int max_cols, struct hp_err *e);
/* Bytes of device memory free and total (host outputs). */
int hp_cuda_mem_info(size_t *free_b, size_t *total_b, struct hp_err *e);

/* ---- conversions and element-wise (elementwise.cu) ---- */
void hp_cuda_f32_to_bf16(hp_bf16 *y, const float *x, size_t n);
void hp_cuda_bf16_to_f32(float *y, const hp_bf16 *x, size_t n);
/* h[i] += (float)o[i] */
void hp_cuda_add_bf16(float *h, const hp_bf16 *o, size_t n);
/* hp_bf16_sum_ranks (base/dtype.h): out[i] = bf16 of the fp32 sum of
 * in[r * s + i] over r = 0 .. k-1 in that order; out may be in */
void hp_cuda_bf16_sum_ranks(hp_bf16 *out, const hp_bf16 *in, int k, size_t n, size_t s);
/* x = a + b (x may alias a or b); x += y */
void hp_cuda_add(float *x, const float *a, const float *b, size_t n);
void hp_cuda_acc(float *x, const float *y, size_t n);
/* x[n, :] += b over N rows of C */
void hp_cuda_add_bias(float *x, const float *b, long N, int C);
/* db[c] += sum over rows of x[., c] (fixed order) */
void hp_cuda_colsum(float *db, const float *x, long N, int C);
/* x[i] = y[i] > x[i] ? y[i] : x[i]; xd[i] += yd[i] (doubles) */
void hp_cuda_max(float *x, const float *y, size_t n);
void hp_cuda_add_f64(double *x, const double *y, size_t n);
/* x[i] *= s */
void hp_cuda_scale(float *x, float s, size_t n);
/* *acc (a device double) += the sum of squares of x (fp32) in double.
 * Fixed reduction order. */
int hp_cuda_sumsq(double *acc, const float *x, size_t n, struct hp_err *e);

/* ---- embedding ---- */
/* out[n] = table[ids[n] - v0] for ids in [v0, v0 + V), else a zero row */
void hp_cuda_embedding_fwd(float *out, const int32_t *ids, const float *table, long N, int C, int v0, int V);
/* dtable[ids - v0] += dout rows, deterministically: the caller passes the
 * tokens grouped by id: order[] token indices sorted by (id, index), and
 * starts[nu + 1] where group u is order[starts[u] .. starts[u+1]) and all
 * share the id ids[order[starts[u]]] (lib/backend/backend_cuda.c builds them on
 * the host, leaving out the ids outside the range and the padding id). */
void hp_cuda_embedding_bwd(float *dtable, const float *dout, const int32_t *ids, const int32_t *order,
			   const int32_t *starts, int nu, int C, int v0);

/* ---- RMSNorm: y = w * (x * rstd), rstd = 1/sqrt(mean(x^2) + eps) ---- */
void hp_cuda_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, long N, int C, float eps);
/* dx = (accumulate ? dx : 0) + d/dx; dw += d/dw (fixed order over rows). */
void hp_cuda_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
			 const float *rstd, long N, int C, int accumulate);

/* ---- RoPE, in place on the Dr floats at x + (n*H + h)*ld; tables [T, Dr/2];
 * inter 0 HF's rotate_half, 1 DeepSeek's interleaved pairs (cpu/ops.h) ---- */
void hp_cuda_rope_fwd(float *x, const int32_t *pos, const float *cos_t, const float *sin_t, long N, int H, int ld,
		      int Dr, int inter);
void hp_cuda_rope_bwd(float *dx, const int32_t *pos, const float *cos_t, const float *sin_t, long N, int H, int ld,
		      int Dr, int inter);

/* ---- SwiGLU: h = silu(g) * u, element-wise, and on rows of [gate | up] ---- */
void hp_cuda_swiglu_fwd(float *h, const float *g, const float *u, size_t n);
void hp_cuda_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n);
void hp_cuda_swiglu_rows_fwd(float *h, const float *gu, long rows, int I);
/* dgu overwritten, same layout as gu */
void hp_cuda_swiglu_rows_bwd(float *dgu, const float *dh, const float *gu, long rows, int I);

/* ---- GPT-OSS (oss.cu): kernels/cpu/ops.h's hp_attn_sinks_*, hp_glu_clamp_*,
 * hp_bias_grouped_* on the device; off the device's, max_rows a bound on
 * off[nx] - off[0] (the grid's size) ---- */
void hp_cuda_sinks_fwd(float *out, float *lse, const float *sinks, int B, int T, int H, int D);
void hp_cuda_sinks_bwd(float *dsinks, const float *dout, const float *out, const float *lse, const float *sinks,
		       int B, int T, int H, int D);
void hp_cuda_glu_clamp_fwd(float *h, const float *g, const float *u, long ld, long rows, int I, float alpha,
			   float limit);
void hp_cuda_glu_clamp_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, long ld,
			   long rows, int I, float alpha, float limit);
void hp_cuda_bias_grouped_fwd(float *x, long ld, const float *bias, size_t bs, const int32_t *off, int nx, int n,
			      long max_rows);
void hp_cuda_bias_grouped_bwd(float *db, size_t bs, const float *dx, long ld, const int32_t *off, int nx, int n);

/* ---- Qwen3-Next / Qwen3.5 (gdn.cu): kernels/cpu/ops.h's hp_conv1d_silu_*,
 * hp_l2norm_*, hp_gdn_gates_*, hp_rmsnorm_gated_*, hp_sigmoid_gate_* and
 * the chunked delta rule hp_gdr_* on the device.  The delta rule's saved
 * states are hp_gdr_saved_floats's layout; its scratch is B Hv units of
 * unit floats (hp_gdr_unit_floats(Dk, Dv)), one a block; outputs NaN when
 * the shapes or the unit cannot serve. ---- */
#define HP_CUDA_GDR_CHUNK 64   /* cpu/ops.h's HP_GDR_CHUNK (backend_cuda.c checks) */
void hp_cuda_conv1d_silu_fwd(float *y, const float *x, const float *w, const int32_t *seg, int B, int T, int C,
			     int K);
void hp_cuda_conv1d_silu_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
			     const int32_t *seg, int B, int T, int C, int K);
void hp_cuda_l2norm_fwd(float *y, float *rinv, const float *x, long N, int D);
void hp_cuda_l2norm_bwd(float *dx, const float *dy, const float *y, const float *rinv, long N, int D);
void hp_cuda_gdn_gates_fwd(float *beta, float *g, const float *b, const float *a, const float *A_log,
			   const float *dt_bias, long N, int H);
void hp_cuda_gdn_gates_bwd(float *db, float *da, float *dA_log, float *ddt_bias, const float *dbeta,
			   const float *dg, const float *b, const float *a, const float *A_log, const float *dt_bias,
			   long N, int H);
void hp_cuda_rmsnorm_gated_fwd(float *y, float *rstd, const float *x, const float *z, const float *w, long N,
			       int D, float eps);
void hp_cuda_rmsnorm_gated_bwd(float *dx, float *dz, float *dw, const float *dy, const float *x, const float *z,
			       const float *w, const float *rstd, long N, int D);
void hp_cuda_sigmoid_gate_fwd(float *y, const float *x, const float *gate, long n);
void hp_cuda_sigmoid_gate_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate, long n);
void hp_cuda_sigmoid_gate_rows_fwd(float *y, const float *x, const float *gate, long T, int C);
void hp_cuda_sigmoid_gate_rows_bwd(float *dx, float *dgate, const float *dy, const float *x, const float *gate,
				   long T, int C);
void hp_cuda_gdr_fwd(float *out, float *saved, const float *q, const float *k, const float *v, const float *g,
		     const float *beta, const int32_t *seg, float *scratch, size_t unit, int B, int T, int Hv, int Hk,
		     int Dk, int Dv, float scale);
void hp_cuda_gdr_bwd(float *dq, float *dk, float *dv, float *dg, float *dbeta, const float *dout,
		     const float *saved, const float *q, const float *k, const float *v, const float *g,
		     const float *beta, const int32_t *seg, float *scratch, size_t unit, int B, int T, int Hv,
		     int Hk, int Dk, int Dv, float scale);

/* ---- GEMMs through cuBLASLt, bf16 operands, fp32 accumulation and output (gemm.cu) ---- */
/* y[N,O] = x[N,K] W[O,K]^T (+ b[O] when b) */
int hp_cuda_linear_fwd(float *y, const hp_bf16 *x, const hp_bf16 *W, const float *b, long N, int K, int O,
		       struct hp_err *e);
/* dx[N,K] = (accumulate ? dx : 0) + dy[N,O] W[O,K]; dW[O,K] += dy^T x;
 * db[O] += colsum(dy) when db */
int hp_cuda_linear_bwd(float *dx, float *dW, float *db, const hp_bf16 *dy, const hp_bf16 *x, const hp_bf16 *W,
		       long N, int K, int O, int accumulate, struct hp_err *e);

/* ---- MoE (moe.cu) ---- */
/* probs[N,E] = softmax(logits) in fp32 (in place allowed: probs == logits);
 * sel[N,k] the top-k experts by falling probability, ties to the lower
 * index; wsel[N,k] their probabilities, renormalised to sum 1 when norm. */
void hp_cuda_router_topk(float *probs, int32_t *sel, float *wsel, const float *logits, long N, int E, int k,
			 int norm);
/* Backward to the router logits, hp_router_bwd's arithmetic: dwsel[N,k]
 * the gradient of wsel, aux[E] (device doubles, or NULL) adds aux_grad *
 * aux[e] to every dprob[., e]; dlogits[N,E] overwritten. */
void hp_cuda_router_bwd(float *dlogits, const float *probs, const int32_t *sel, const float *wsel,
			const float *dwsel, const double *aux, double aux_grad, long N, int E, int k, int norm);
/* DeepSeek-V3's grouped sigmoid router and its backward: cpu/ops.h's
 * hp_router_group_fwd / _bwd on the device (probs in place, bias [E] or
 * NULL), the same bits; G at most 49152 (a warp's flags in shared memory). */
void hp_cuda_router_group_fwd(float *probs, int32_t *sel, float *wsel, const float *bias, long N, int E, int K,
			      int G, int TG, int norm, float scale, int mask_zero);
void hp_cuda_router_group_bwd(float *dlogits, const float *probs, const int32_t *sel, const float *dwsel, long N,
			      int E, int K, int norm, float scale);
/* dst[r] = src[idx[r]]; dst[idx[r]] = src[r] (rows of C, r < R; the
 * scatter's idx distinct) */
void hp_cuda_gather_rows(float *dst, const float *src, const int32_t *idx, long R, int C);
void hp_cuda_heads_bcast(float *dst, int ldd, const float *src, int lds, long N, int H, int w);
void hp_cuda_heads_sum(float *dst, int ldd, const float *src, int lds, long N, int H, int w);
void hp_cuda_scatter_rows(float *dst, const float *src, const int32_t *idx, long R, int C);
/* out[t] = sum over j < k of wsel[t, row_slot[r]] * ye[r], r = tok_rows[t*k+j]
 * in that order (each token's rows ascending: the CPU's order), out
 * overwritten. */
void hp_cuda_combine(float *out, const float *ye, const float *wsel, const int32_t *tok_rows,
		     const int32_t *row_slot, long N, int k, int C);
/* Its backward, row by row: dye[r] = wsel[t, s] * dout[t]; dwsel[t, s] =
 * dout[t] . ye[r] (in double), t = row_tok[r], s = row_slot[r], r < R. */
void hp_cuda_combine_bwd(float *dye, float *dwsel, const float *dout, const float *ye, const float *wsel,
			 const int32_t *row_tok, const int32_t *row_slot, long R, int k, int C);
/* dx[t] += dxe[tok_rows[t*k+j]] for j < k in order */
void hp_cuda_scatter_add_rows(float *dx, const float *dxe, const int32_t *tok_rows, long N, int k, int C);
/* The routing table from the router's choices sel[N,k], hp_moe_route's
 * (cpu/ops.h): off[E+1] the first expert-major row of each expert,
 * row_tok/row_slot[N*k], tok_rows[N,k]; *bad += the choices outside [0, E)
 * (made expert 0, in sel too).  Stable: token order within an expert. */
void hp_cuda_moe_route(int32_t *off, int32_t *row_tok, int32_t *row_slot, int32_t *tok_rows, int32_t *bad,
		       int32_t *sel, long N, int E, int k);
/* The load-balancing loss's sums, hp_moe_aux_acc's and hp_moe_aux_fin's:
 * FP[2E] device doubles; acc adds FP[x] += off[x+1] - off[x] and
 * FP[E+x] += sum over t < N in order of probs[t, x]; fin divides FP[x] by
 * n and writes *aux = E * sum over x in order of FP[x] * (FP[E+x] / n),
 * then *acc += *aux / div when acc is not NULL. */
void hp_cuda_moe_aux_acc(double *FP, const float *probs, const int32_t *off, long N, int E);
void hp_cuda_moe_aux_fin(double *FP, double *aux, double *acc, int E, double n, double div);

/* ---- grouped experts: one launch for every expert (grouped.cu) ----
 * Expert x < nx owns rows [off[x], off[x+1]) (off in device memory, off[nx]
 * <= R) and the [O,K] weight W + x*ws (bf16, row-major as HF's Linear);
 * fp32 accumulation on tensor cores.
 * fwd: y[r] = x[r] W_x^T for its rows (y [R,O] fp32, x [R,K] bf16; rows
 *      from off[nx] to R untouched).
 * bwd: dx[r] = (accumulate ? dx[r] : 0) + dy[r] W_x (dx may be NULL);
 *      dW_x += dy_x^T x_x, dW_x = dW + x*gs fp32 [O,K] (an expert without
 *      rows adds nothing). */
int hp_cuda_grouped_fwd(float *y, const hp_bf16 *x, const hp_bf16 *W, size_t ws, const int32_t *off, int nx,
			long R, int K, int O, struct hp_err *e);
int hp_cuda_grouped_bwd(float *dx, float *dW, size_t gs, const hp_bf16 *dy, const hp_bf16 *x, const hp_bf16 *W,
			size_t ws, const int32_t *off, int nx, long R, int K, int O, int accumulate,
			struct hp_err *e);

/* ---- flash attention, sm_80+ (attn.cu, flashattn.cu, attnsmall.cu) ----
 * Same semantics as hp_flash_attention_fwd/bwd in cpu/ops.h: causal GQA
 * over B rows of T tokens, q [B*T, Hq*D], k and v [B*T, Hkv*D] (bf16),
 * seg[B*T] document starts or NULL, scale 1/sqrt(D), softmax in fp32,
 * lse [B, Hq, T] fp32 (natural log); a query row whose lse is +inf has
 * probability 0 everywhere in the backward (a row the caller pads; its q
 * and dout must still be finite: they go through the tensor cores).
 * D 64 and 128 run on the tensor cores (flashattn.cu); other D up to 256 on
 * one thread per row (attnsmall.cu: the tests' small models);
 * hp_cuda_flash_supports says which.  The backward is deterministic: dK/dV
 * by key tile, dQ by query tile, no atomics; scratch holds
 * hp_cuda_flash_scratch(B, T, Hq) floats. */
#define HP_CUDA_ATTN_MAX_HEAD_DIM 256
int hp_cuda_flash_supports(int D);
void hp_cuda_flash_fwd(hp_bf16 *out, float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
		       const int32_t *seg, int B, int T, int Hq, int Hkv, int D);
void hp_cuda_flash_bwd(hp_bf16 *dq, hp_bf16 *dk, hp_bf16 *dv, const hp_bf16 *dout, const hp_bf16 *out,
		       const float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
		       const int32_t *seg, float *scratch, int B, int T, int Hq, int Hkv, int D);
size_t hp_cuda_flash_scratch(int B, int T, int Hq);
/* lse[i] = +inf for n floats (the rows a caller pads out of the backward) */
void hp_cuda_fill_inf(float *x, size_t n);

/* ---- cross-entropy on fp32 logits [n, V] (ce.cu) ---- */
/* *acc (a device double) += the sum over rows whose target is not -100 of
 * -log softmax(logits)[t], in row order (targets checked by the caller). */
int hp_cuda_ce_loss(double *acc, const float *logits, const int32_t *targets, long n, int V,
		    struct hp_err *e);
/* dlogits = scale * (softmax - onehot), zero rows for -100; in place
 * allowed (dlogits == logits). */
void hp_cuda_ce_bwd(float *dlogits, const float *logits, const int32_t *targets, long n, int V, float scale);
/* Vocabulary-parallel cross-entropy (hp_vp_ce_max, _sums, _bwd in cpu/ops.h). */
void hp_cuda_vp_ce_max(float *mx, const float *logits, long N, int Vl);
void hp_cuda_vp_ce_sums(double *stats, const float *logits, const float *mx, const int32_t *targets, long N,
			int Vl, int v0);
void hp_cuda_vp_ce_bwd(float *dlogits, const float *logits, const double *stats, const float *mx,
		       const int32_t *targets, long N, int Vl, int v0, float scale);
/* *acc (a device double) += hp_vp_ce_loss's sum of the rows' losses from
 * the all-reduced statistics, in row order (targets checked by the caller) */
int hp_cuda_vp_ce_loss(double *acc, const double *stats, const float *mx, const int32_t *targets, long N,
		       struct hp_err *e);

/* ---- AdamW on fp32 weights (adamw.cu) ----
 * Exactly kernels/cpu/adamw.c's arithmetic (torch.optim.AdamW, decoupled
 * decay; bias corrections computed in double on the host, rounded to float
 * once), then, when wb is not NULL, wb = bf16(w), the working copy the
 * GEMMs read; nothing when cg (device memory, NULL: none) says cg[1] 0. */
void hp_cuda_adamw(float *w, hp_bf16 *wb, const float *g, float *m, float *v, size_t n,
		   double lr, double beta1, double beta2, double eps, double weight_decay,
		   long step, int decay, const float *cg);
/* hp_clip_gate's cg[2] from the step's sums, all in device memory (its
 * arithmetic), and g[n] *= cg[0] unless it is 1, in one launch;
 * hp_cuda_adamw with cg skips the step where cg[1] is 0. */
void hp_cuda_clip_gate(float *g, size_t n, float *cg, const double *ss, const double *loss, const double *aux,
		       const int32_t *bad, double max_norm, int check);

#ifdef HP_CUDA_EMU
/* The emulation's rounding: 1, every bf16 store rounded to bf16 (as the
 * GPU rounds); 0, never (bf16 values keep their fp32 bits: "exact"). */
void hp_emu_round_bf16(int on);
int hp_emu_rounds(void);
#endif

#ifdef __cplusplus
}
#endif

#endif
