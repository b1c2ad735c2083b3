/*
 * backend.h - where a model's tensors live and what computes on them: the
 * one op table that lib/model/model.c, lib/dist/fsdp.c and lib/dist/optim.c call, with a
 * CPU backend (host memory, kernels/cpu) and a CUDA backend (device memory,
 * kernels/cuda), so that the model's orchestration - every layer, every
 * parallel module boundary, FSDP, activation checkpointing - is written
 * once (DESIGN.md §7, "One orchestration").
 *
 * Invariants:
 *  - Every float array an op takes is fp32 in the backend's memory, with
 *    the semantics of the CPU kernel of the same name (kernels/cpu/ops.h):
 *    row-major, weight gradients accumulate, activation gradients
 *    overwrite unless an accumulate flag says otherwise.  The CPU backend
 *    calls exactly those kernels, so its numbers are the CPU model's.
 *  - The CUDA backend keeps activations in fp32 too and rounds to bf16
 *    where the tensor cores read: the operands of every GEMM (x, dy and a
 *    bf16 working copy of the weights) and of attention (q, k, v, out,
 *    dout).  Weights are fp32 on the device; the working copy of the
 *    registered weight region (hp_backend.weights) follows them after
 *    weights_changed or an AdamW step.
 *  - Index arrays are struct hp_i32: a host copy, which the orchestration
 *    reads and writes, and the backend's copy, which kernels read; on the
 *    CPU they are one array.  put/get move them (nothing on the CPU).
 *  - Collectives take the hp_comm of a mesh dim (lib/comm/comm.h) and count
 *    into its counters exactly what hp_comm_* counts for the same call, so
 *    a run on any backend is checked against its plan alike.  A BF16 or
 *    F16 collective counts 2 bytes an element, whatever carries it.
 *  - Calls are ordered as issued; results are visible to the next call.
 *    Only get, download, vp_ce_loss (its statistics come to the host) and
 *    sync wait for the device; the sums (ce_fwd, sumsq_acc) stay in the
 *    backend's memory until a download.
 *
 * HP_CUDA_EMULATE=exact|bf16 replaces the CUDA kernels (not the backend)
 * with a host emulation built from kernels/cpu: the CUDA backend's own
 * code - conversions, working copies, host-staged collectives, chunking -
 * runs as on a GPU, with bf16 values held in fp32 (exact: never rounded;
 * bf16: rounded at every bf16 store, where the GPU rounds).  See
 * hp-train(1), ENVIRONMENT.
 *
 * Errors: ops return nothing (a device error surfaces at the next sync)
 * except where they return int: 0 or a negative HP_E* with e set.
 *
 * Ownership: hp_backend_open returns a backend the caller frees with
 * hp_backend_close; memory from alloc is the caller's, freed with free.
 * The CPU backend is a static object (open returns it, close does
 * nothing).
 */
#ifndef HP_BACKEND_H
#define HP_BACKEND_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"
#include "cpu/ops.h"

enum hp_backend_kind { HP_BACKEND_CPU = 0, HP_BACKEND_CUDA, HP_BACKEND_CUDA_EMU };
enum hp_emulate { HP_EMULATE_OFF = 0, HP_EMULATE_EXACT, HP_EMULATE_BF16 };

/* The kernel families of a device's profile (hp_backend.kernel_times):
 * GEMMs (cuBLASLt's and ours), the experts' grouped GEMMs, attention,
 * MoE routing and permutation (top-k, routing table, gathers, combine),
 * the loss, the optimizer (sums of squares, clipping, AdamW), bf16
 * conversions of operands, copies and fills, the rest element-wise
 * (norms, RoPE, SwiGLU, adds). */
enum hp_kfam { HP_KF_GEMM, HP_KF_EXPERTS, HP_KF_ATTENTION, HP_KF_ROUTING, HP_KF_LOSS, HP_KF_OPTIMIZER,
	       HP_KF_CAST, HP_KF_MEMORY, HP_KF_ELEMENTWISE, HP_KF_N };
const char *hp_kfam_name(int f);
/* The family of a kernel-layer function, by its name (hp_cuda_...). */
int hp_kfam_of(const char *fn);

/* An int32 array with a host copy (h) and the backend's (d; == h on the CPU). */
struct hp_i32 {
	int32_t *h, *d;
};

/* One MoE layer's expert-major rows, backend copies (lib/model/model.c routes):
 * row r holds token row_tok[r]'s slot row_slot[r]; tok_rows[t*K + j] are
 * token t's K rows in ascending order (NULL where the backend loops over
 * rows itself, the CPU). */
struct hp_route {
	const int32_t *row_tok, *row_slot, *tok_rows;
};

/* A started collective (hp_backend.iallgather, ireduce_scatter), finished
 * by wait; its owner zeroes it first and gives it back with req_free. */
struct hp_breq {
	MPI_Request req;          /* MPI, host buffers or staged */
	void *recv, *stage;       /* staged: where the result goes, and the host buffer */
	size_t off, bytes, cap;   /* staged: the result's place in stage, its size, stage's size */
	void *nc;                 /* NCCL: the group whose stream carries it */
	void *ev;                 /* NCCL: an event of its own, marking its end there */
	void *sum;                /* a bf16 sum: the k blocks of n to add up in wait (NULL: none) */
	size_t n;
	int k, active;
	/* the emulation's check of the ordering: what was sent, and its crc */
	const void *sent;
	size_t sent_bytes;
	uint32_t crc;
};

/* The largest operands a model hands the ops, in elements (hp_model
 * works them out from its layout; lib/model/model.c, op_sizes): a backend
 * that copies operands (the CUDA backend's bf16 copies for the tensor
 * cores) makes its scratch for them once (prepare), and hp-plan counts
 * the same bytes (hp_backend_cuda_scratch_bytes). */
struct hp_op_sizes {
	size_t lin_x, lin_dy;     /* linear: N * K of x, N * O of dy */
	size_t att_q, att_kv;     /* attention: q (out, dout, dq) and k (v, dk, dv), a context-parallel
				     chunk's zero-padded prefix included */
	int cp_B, cp_L, cp_Hq;    /* context parallel: the prefix's rows, length and heads (its lse,
				     segment ids and backward scratch); 0 without */
	size_t tokens;            /* the embedding's N (its backward's grouping) */
};

struct hp_comm;
struct hp_comms;
struct hp_p2p;

struct hp_backend {
	const char *name;         /* "cpu", "cuda", "cuda (emulated, exact)", ... */
	enum hp_backend_kind kind;
	int device;               /* memory is not the host's: upload/download between them */
	/* device backends: the bytes of device memory the backend holds now,
	 * and at most since it started: every allocation it makes (the model's
	 * and FSDP's buffers, its scratch, its bf16 weight copies), counted by
	 * the same code on a GPU and in the emulation; the kernels' own
	 * scratch (cuBLASLt's workspace) aside.  0 on the CPU. */
	size_t dev_bytes, dev_bytes_peak;
	/* device backends: the times the host has waited, or may have waited,
	 * for the device (a stream synchronised, a download, a sum read back,
	 * an upload from pageable memory), counted by the same code on a GPU
	 * and in the emulation.  0 on the CPU. */
	long host_syncs;
	/* device backends: the calls that put work on the device (a kernel, a
	 * library call such as a GEMM, a copy, a memset), each counted once
	 * by the same code on a GPU and in the emulation (a kernel-layer call
	 * that launches several kernels counts one).  0 on the CPU. */
	long kernel_launches;
	/* device backends: with profile set, the compute stream's time per
	 * kernel family (enum hp_kfam) is measured from each launch to the
	 * next (a kernel's time and any idle gap after it; the
	 * communication streams' aside), read and reset by kernel_times.
	 * For a diagnostic (gpu-bench, HP_CUDA_PROFILE): the marks cost
	 * time. */
	int profile;
	/* device backends: the device's memory free when the backend opened
	 * (the emulation: HP_CUDA_EMULATE_MEMORY, else 1 TiB) */
	size_t dev_free;

	/* ---- memory (bytes) ---- */
	void *(*alloc)(struct hp_backend *b, size_t bytes, struct hp_err *e);   /* zeroed */
	/* the same, counted in dev_bytes as counted: what a GPU holds for a
	 * buffer this backend holds wider (the emulation's bf16, 4 bytes) */
	void *(*alloc_as)(struct hp_backend *b, size_t bytes, size_t counted, struct hp_err *e);
	void (*free)(struct hp_backend *b, void *p);
	int (*upload)(struct hp_backend *b, void *dst, const void *host_src, size_t bytes, struct hp_err *e);
	int (*download)(struct hp_backend *b, void *host_dst, const void *src, size_t bytes, struct hp_err *e);
	void (*copy)(struct hp_backend *b, void *dst, const void *src, size_t bytes);
	/* rows of width bytes, src rows spitch apart to dst rows dpitch apart */
	void (*copy2d)(struct hp_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch,
		       size_t width, size_t rows);
	void (*zero)(struct hp_backend *b, void *p, size_t bytes);
	/* a span no longer in use: zeroed, and on the CPU its pages given back;
	 * in a reserved range, the end of one commit of that span */
	void (*release)(struct hp_backend *b, void *p, size_t bytes);
	/* An address range of bytes with no memory behind it yet (freed with
	 * free): commit puts zeroed memory behind a span before its first use,
	 * and each commit of a span ends with a release of the same span; the
	 * memory goes when no committed span touches it.  A device maps and
	 * unmaps granules (hp_cuda_vm_*), counted in dev_bytes; the CPU's
	 * pages appear when written and go at release, so its reserve is
	 * alloc and its commit nothing.  FSDP's unsharded units live there. */
	void *(*reserve)(struct hp_backend *b, size_t bytes, struct hp_err *e);
	int (*commit)(struct hp_backend *b, void *p, size_t bytes, struct hp_err *e);
	/* the scratch for operands up to z, made now (nothing on the CPU) */
	int (*prepare)(struct hp_backend *b, const struct hp_op_sizes *z, struct hp_err *e);
	/* a scratch span whose contents are no longer needed (its next user
	 * writes it before reading): on the CPU its whole pages go back to the
	 * system; a device keeps its memory (pooled) */
	void (*discard)(struct hp_backend *b, void *p, size_t bytes);
	int (*sync)(struct hp_backend *b, struct hp_err *e);
	/* An index array to the backend (n elements), and back. */
	int (*put)(struct hp_backend *b, const struct hp_i32 *x, size_t n, struct hp_err *e);
	int (*get)(struct hp_backend *b, const struct hp_i32 *x, size_t n, struct hp_err *e);
	/* Element size of t in this backend's memory (BF16: 2, or 4 in the
	 * emulation, which holds bf16 values in fp32). */
	size_t (*esize)(struct hp_backend *b, enum hp_dtype t);
	/* n elements from one float type to another (F32, BF16), rounding to
	 * nearest even; dst and src may not overlap unless the types agree. */
	void (*convert)(struct hp_backend *b, void *dst, enum hp_dtype dt, const void *src, enum hp_dtype st,
			size_t n);
	/* dst[i] += (float)src[i], src of type st */
	void (*acc)(struct hp_backend *b, float *dst, const void *src, enum hp_dtype st, size_t n);

	/* ---- weights ---- */
	/* The region the linear ops' W arguments point into (the model's flat
	 * parameters, n floats): the CUDA backend makes its bf16 working copy
	 * of it.  Once per region; 0 or an error.  n 0: the region at base is
	 * gone (its model released). */
	int (*weights)(struct hp_backend *b, float *base, size_t n, struct hp_err *e);
	/* [w, w + n) of that region changed: the working copy follows */
	void (*weights_changed)(struct hp_backend *b, const float *w, size_t n);
	/* The working copy alone of [w, w + n) of a reserved region, for a
	 * weight only GEMMs read (never in fp32): memory behind it (dir 1) or
	 * gone (-1), as commit and release do for both; dir 0: set from src
	 * (n elements of st), the fp32 weights not written.  1 when done, 0
	 * when the backend keeps no copy of that span (the CPU; the caller
	 * holds and writes the fp32 weights then), or a negative HP_E*. */
	int (*copy_only)(struct hp_backend *b, float *w, size_t n, int dir, const void *src, enum hp_dtype st,
			 struct hp_err *e);

	/* ---- ops: kernels/cpu/ops.h's semantics on the backend's memory ---- */
	void (*linear_fwd)(struct hp_backend *b, float *y, const float *x, const float *W, const float *bias,
			   long N, int K, int O);
	void (*linear_bwd)(struct hp_backend *b, float *dx, float *dW, float *db, const float *dy,
			   const float *x, const float *W, long N, int K, int O, int accumulate);
	void (*rmsnorm_fwd)(struct hp_backend *b, float *y, float *rstd, const float *x, const float *w,
			    long N, int C, float eps);
	void (*rmsnorm_bwd)(struct hp_backend *b, float *dx, float *dw, const float *dy, const float *x,
			    const float *w, const float *rstd, long N, int C, int accumulate);
	/* fused_rmsnorm: h = a + bb (bb NULL: h = a), y = norm(h); and its backward */
	void (*rmsnorm_res_fwd)(struct hp_backend *b, float *h, float *y, float *rstd, const float *a,
				const float *bb, const float *w, long N, int C, float eps);
	void (*rmsnorm_res_bwd)(struct hp_backend *b, float *dx, float *dw, const float *dy, const float *x,
				const float *w, const float *rstd, long N, int C, int accumulate);
	/* RoPE on the Dr floats at x + (n*H + h)*ld (x offset to each head's
	 * rotated part), tables [T, Dr/2]; inter 0 HF's rotate_half, 1
	 * DeepSeek's interleaved pairs (kernels/cpu/ops.h: hp_rope_fwd) */
	void (*rope_fwd)(struct hp_backend *b, float *x, const int32_t *pos, const float *cos_t, const float *sin_t,
			 long N, int H, int ld, int Dr, int inter);
	void (*rope_bwd)(struct hp_backend *b, float *dx, const int32_t *pos, const float *cos_t,
			 const float *sin_t, long N, int H, int ld, int Dr, int inter);
	void (*swiglu_fwd)(struct hp_backend *b, float *h, const float *g, const float *u, long n);
	void (*swiglu_bwd)(struct hp_backend *b, float *dg, float *du, const float *dh, const float *g,
			   const float *u, long n);
	void (*swiglu_rows_fwd)(struct hp_backend *b, float *h, const float *gu, long rows, int I);
	void (*swiglu_rows_bwd)(struct hp_backend *b, float *dgu, const float *dh, const float *gu, long rows, int I);
	/* GPT-OSS (kernels/cpu/ops.h: hp_attn_sinks_*, hp_glu_clamp_*,
	 * hp_bias_grouped_*); off is the backend's */
	void (*sinks_fwd)(struct hp_backend *b, float *out, float *lse, const float *sinks, int B, int T, int H,
			  int D);
	void (*sinks_bwd)(struct hp_backend *b, float *dsinks, const float *dout, const float *out,
			  const float *lse, const float *sinks, int B, int T, int H, int D);
	void (*glu_clamp_fwd)(struct hp_backend *b, float *h, const float *g, const float *u, long ld, long rows,
			      int I, float alpha, float limit);
	void (*glu_clamp_bwd)(struct hp_backend *b, float *dg, float *du, const float *dh, const float *g,
			      const float *u, long ld, long rows, int I, float alpha, float limit);
	void (*bias_grouped_fwd)(struct hp_backend *b, float *x, long ld, const float *bias, size_t bs,
				 const int32_t *off, int nx, int n, long R);   /* R: the rows off spans at most */
	void (*bias_grouped_bwd)(struct hp_backend *b, float *db, size_t bs, const float *dx, long ld,
				 const int32_t *off, int nx, int n);
	/* attention as the op table's (P [B,H,T,T]) and as flash (lse [B,H,T]);
	 * has_eager: the backend has the first (the CUDA backend runs flash for
	 * both, and the model keeps lse then) */
	int has_eager;
	void (*attention_fwd)(struct hp_backend *b, float *out, float *P, const float *q, const float *k,
			      const float *v, const int32_t *seg, int B, int T, int Hq, int Hkv, int D);
	void (*attention_bwd)(struct hp_backend *b, float *dq, float *dk, float *dv, const float *dout,
			      const float *P, const float *q, const float *k, const float *v, const int32_t *seg,
			      float *scratch, int B, int T, int Hq, int Hkv, int D);
	int (*flash_supports)(struct hp_backend *b, int D);
	void (*flash_fwd)(struct hp_backend *b, float *out, float *lse, const float *q, const float *k,
			  const float *v, const int32_t *seg, int B, int T, int Hq, int Hkv, int D);
	void (*flash_bwd)(struct hp_backend *b, float *dq, float *dk, float *dv, const float *dout,
			  const float *out, const float *lse, const float *q, const float *k, const float *v,
			  const int32_t *seg, float *scratch, int B, int T, int Hq, int Hkv, int D);
	/* scratch floats the attention backward needs (flash: 1; eager T*T) */
	size_t (*flash_scratch)(struct hp_backend *b, int B, int T, int H, int D);
	/* context parallel: a chunk of Tq queries at q0 against S keys
	 * (hp_cp_attention_fwd/bwd); P or lse as attention_fwd */
	void (*cp_attention_fwd)(struct hp_backend *b, float *out, float *P, float *lse, const float *q,
				 const float *k, const float *v, const int32_t *seg, int B, int Tq, int S, int q0,
				 int Hq, int Hkv, int D);
	void (*cp_attention_bwd)(struct hp_backend *b, float *dq, float *dk, float *dv, const float *dout,
				 const float *out, const float *P, const float *lse, const float *q, const float *k,
				 const float *v, const int32_t *seg, float *scratch, int B, int Tq, int S, int q0,
				 int Hq, int Hkv, int D);
	size_t (*cp_attention_scratch)(struct hp_backend *b, int S);
	/* sel: the backend's copy (the caller gets it to read it) */
	void (*router_topk)(struct hp_backend *b, float *probs, int32_t *sel, float *wsel, long N, int E, int K,
			    int norm);
	/* aux: [E] doubles in the backend's memory (NULL: no load-balancing term) */
	void (*router_bwd)(struct hp_backend *b, float *dprob, const float *probs, const int32_t *sel,
			   const float *wsel, const float *dwsel, const double *aux, double aux_grad, long N, int E,
			   int K, int norm);
	/* DeepSeek-V3's grouped sigmoid router (kernels/cpu/ops.h:
	 * hp_router_group_fwd / _bwd): probs the logits in, the sigmoids out;
	 * sel, wsel and bias (or NULL) the backend's */
	void (*router_group_fwd)(struct hp_backend *b, float *probs, int32_t *sel, float *wsel, const float *bias,
				 long N, int E, int K, int G, int TG, int norm, float scale, int mask_zero);
	void (*router_group_bwd)(struct hp_backend *b, float *dlogits, const float *probs, const int32_t *sel,
				 const float *dwsel, long N, int E, int K, int norm, float scale);
	/* The routing table from sel [N,K] (hp_moe_route, cpu/ops.h), every
	 * array the backend's: off [E+1], struct hp_route's rows (tok_rows may
	 * be NULL), *bad += the choices out of range.  Nothing comes to the host. */
	void (*moe_route)(struct hp_backend *b, int32_t *off, int32_t *row_tok, int32_t *row_slot, int32_t *tok_rows,
			  int32_t *bad, int32_t *sel, long N, int E, int K);
	/* the load-balancing loss's sums (hp_moe_aux_acc, hp_moe_aux_fin), FP
	 * [2E], *aux and *acc the backend's doubles */
	void (*moe_aux_acc)(struct hp_backend *b, double *FP, const float *probs, const int32_t *off, long N, int E);
	void (*moe_aux_fin)(struct hp_backend *b, double *FP, double *aux, double *acc, int E, double n, double div);
	/* Grouped experts: for x < nx, the rows [off[x], off[x+1]) (off the
	 * backend's, off[nx] <= R) through linear_fwd / linear_bwd (no bias)
	 * with the weight W + x*ws and its gradient dW + x*gs (dx not NULL);
	 * the same numbers as those calls expert by expert, in as many
	 * launches as one. */
	void (*grouped_fwd)(struct hp_backend *b, float *y, const float *x, const float *W, size_t ws,
			    const int32_t *off, int nx, long R, int K, int O);
	void (*grouped_bwd)(struct hp_backend *b, float *dx, float *dW, size_t gs, const float *dy, const float *x,
			    const float *W, size_t ws, const int32_t *off, int nx, long R, int K, int O,
			    int accumulate);
	/* cross-entropy: *loss_sum (the backend's double) += the sum, the
	 * count to the host; -1 for a target out of range */
	int (*ce_fwd)(struct hp_backend *b, double *loss_sum, long *count, const float *logits,
		      const struct hp_i32 *targets, long N, int V);
	void (*ce_bwd)(struct hp_backend *b, float *dlogits, const float *logits, const int32_t *targets, long N,
		       int V, float scale);
	/* vocabulary-parallel cross-entropy (hp_vp_ce_*); the loss from the
	 * backend's stats and maxima, on the host, added to *loss_sum (the
	 * backend's double) */
	void (*vp_ce_max)(struct hp_backend *b, float *mx, const float *logits, long N, int Vl);
	void (*vp_ce_sums)(struct hp_backend *b, double *stats, const float *logits, const float *mx,
			   const int32_t *targets, long N, int Vl, int v0);
	int (*vp_ce_loss)(struct hp_backend *b, double *loss_sum, long *count, const double *stats, const float *mx,
			  const struct hp_i32 *targets, long N, int V);
	void (*vp_ce_bwd)(struct hp_backend *b, float *dlogits, const float *logits, const double *stats,
			  const float *mx, const int32_t *targets, long N, int Vl, int v0, float scale);
	/* rows of table for ids in [v0, v0 + V), zero rows for the others */
	void (*embed_fwd)(struct hp_backend *b, float *out, const struct hp_i32 *ids, const float *table, long N,
			  int C, int v0, int V);
	/* dtable[id - v0] += dout rows for ids in range, except pad */
	int (*embed_bwd)(struct hp_backend *b, float *dtable, const float *dout, const struct hp_i32 *ids, long N,
			 int C, int v0, int V, int pad, struct hp_err *e);
	/* x = a + bb over n; x may alias either */
	void (*add)(struct hp_backend *b, float *x, const float *a, const float *bb, long n);
	/* x[n, :] += bias over N rows of C */
	void (*add_bias)(struct hp_backend *b, float *x, const float *bias, long N, int C);
	/* db[c] += sum over rows of x[n, c] (the CPU in row order, a GPU in a
	 * fixed order of its own) */
	void (*colsum)(struct hp_backend *b, float *db, const float *x, long N, int C);
	/* x = max(x, y) element-wise; xd += yd (doubles) */
	void (*max)(struct hp_backend *b, float *x, const float *y, long n);
	void (*add_f64)(struct hp_backend *b, double *x, const double *y, long n);
	/* dst[r] = src[idx[r]] / dst[idx[r]] = src[r], rows of C */
	void (*gather_rows)(struct hp_backend *b, float *dst, const float *src, const int32_t *idx, long R, int C);
	/* MLA's shared key part to every head and back (hp_heads_bcast, hp_heads_sum) */
	void (*bcast_heads)(struct hp_backend *b, float *dst, int ldd, const float *src, int lds, long N, int H, int w);
	void (*sum_heads)(struct hp_backend *b, float *dst, int ldd, const float *src, int lds, long N, int H, int w);
	void (*scatter_rows)(struct hp_backend *b, float *dst, const float *src, const int32_t *idx, long R, int C);
	/* Qwen3-Next / Qwen3.5 (kernels/cpu/ops.h: hp_conv1d_silu_*,
	 * hp_l2norm_*, hp_gdn_gates_*, hp_gdr_*, hp_rmsnorm_gated_*,
	 * hp_sigmoid_gate_*) */
	void (*conv1d_silu_fwd)(struct hp_backend *b, float *y, const float *x, const float *w, const int32_t *seg,
				int B, int T, int C, int K);
	void (*conv1d_silu_bwd)(struct hp_backend *b, float *dx, float *dw, const float *dy, const float *x,
				const float *w, const int32_t *seg, int B, int T, int C, int K);
	void (*l2norm_fwd)(struct hp_backend *b, float *y, float *rinv, const float *x, long N, int D);
	void (*l2norm_bwd)(struct hp_backend *b, float *dx, const float *dy, const float *y, const float *rinv, long N,
			   int D);
	void (*gdn_gates_fwd)(struct hp_backend *b, float *beta, float *g, const float *bb, const float *a,
			      const float *A_log, const float *dt_bias, long N, int H);
	void (*gdn_gates_bwd)(struct hp_backend *b, float *dbb, float *da, float *dA_log, float *ddt_bias,
			      const float *dbeta, const float *dg, const float *bb, const float *a, const float *A_log,
			      const float *dt_bias, long N, int H);
	/* the chunked gated delta rule; saved as hp_gdr_fwd's
	 * (hp_gdr_saved_floats), scratch gdr_scratch floats in the backend's
	 * memory (the CPU's hp_gdr_scratch_floats, which depends on its thread
	 * count; a device's B Hv units of hp_gdr_unit_floats) */
	size_t (*gdr_scratch)(struct hp_backend *b, int B, int Hv, int Dk, int Dv);
	void (*gdr_fwd)(struct hp_backend *b, float *out, float *saved, const float *q, const float *k, const float *v,
			const float *g, const float *beta, const int32_t *seg, float *scratch, int B, int T, int Hv,
			int Hk, int Dk, int Dv, float scale);
	void (*gdr_bwd)(struct hp_backend *b, float *dq, float *dk, float *dv, float *dg, float *dbeta,
			const float *dout, const float *saved, const float *q, const float *k, const float *v,
			const float *g, const float *beta, const int32_t *seg, float *scratch, int B, int T, int Hv,
			int Hk, int Dk, int Dv, float scale);
	void (*rmsnorm_gated_fwd)(struct hp_backend *b, float *y, float *rstd, const float *x, const float *z,
				  const float *w, long N, int D, float eps);
	void (*rmsnorm_gated_bwd)(struct hp_backend *b, float *dx, float *dz, float *dw, const float *dy,
				  const float *x, const float *z, const float *w, const float *rstd, long N, int D);
	void (*sigmoid_gate_fwd)(struct hp_backend *b, float *y, const float *x, const float *gate, long n);
	void (*sigmoid_gate_bwd)(struct hp_backend *b, float *dx, float *dgate, const float *dy, const float *x,
				 const float *gate, long n);
	void (*sigmoid_gate_rows_fwd)(struct hp_backend *b, float *y, const float *x, const float *gate, long T, int C);
	void (*sigmoid_gate_rows_bwd)(struct hp_backend *b, float *dx, float *dgate, const float *dy, const float *x,
				      const float *gate, long T, int C);
	/* out [N,C] = sum over each token's rows, in row order, of wsel * ye */
	void (*moe_combine)(struct hp_backend *b, float *out, const float *ye, const float *wsel,
			    const struct hp_route *rt, long N, int K, int C);
	/* dye[r] = wsel * dout[t]; dwsel[t,k] = dout[t] . ye[r] (in double) */
	void (*moe_combine_bwd)(struct hp_backend *b, float *dye, float *dwsel, const float *dout, const float *ye,
				const float *wsel, const struct hp_route *rt, long N, int K, int C);
	/* dx[t] += each of token t's rows of dxe, in row order */
	void (*moe_scatter_add)(struct hp_backend *b, float *dx, const float *dxe, const struct hp_route *rt,
				long N, int K, int C);
	/* *acc (the backend's double) += sum of x^2 in double, in index order */
	int (*sumsq_acc)(struct hp_backend *b, double *acc, const float *x, size_t n, struct hp_err *e);
	void (*scale)(struct hp_backend *b, float *x, float s, size_t n);
	/* cg (the backend's, from clip_gate; NULL: none) skips the step where cg[1] is 0 */
	void (*adamw)(struct hp_backend *b, float *w, const float *g, float *m, float *v, size_t n,
		      const struct hp_adamw_hparams *h, int decay, const float *cg);
	/* the step's clip factor and gate (hp_clip_gate) from its sums into
	 * cg, and g[n] *= cg[0] unless it is 1: all in the backend's memory */
	void (*clip_gate)(struct hp_backend *b, float *g, size_t n, float *cg, const double *ss, const double *loss,
			  const double *aux, const int32_t *bad, double max_norm, int check);

	/* the milliseconds per kernel family since the last call (profile);
	 * the host waits for the device (not counted in host_syncs: a
	 * diagnostic's).  Nothing (zeros) on the CPU. */
	int (*kernel_times)(struct hp_backend *b, double ms[], struct hp_err *e);

	/* ---- collectives on the backend's buffers (lib/comm/comm.h's semantics; op an enum hp_red) ---- */
	int (*allreduce)(struct hp_backend *b, struct hp_comm *c, void *buf, size_t n, enum hp_dtype t,
			 int op, struct hp_err *e);
	int (*allgather)(struct hp_backend *b, struct hp_comm *c, const void *send, void *recv, size_t n,
			 enum hp_dtype t, struct hp_err *e);
	/* started now, finished by wait (buffers stay the caller's until then) */
	int (*iallgather)(struct hp_backend *b, struct hp_comm *c, const void *send, void *recv, size_t n,
			  enum hp_dtype t, struct hp_breq *r, struct hp_err *e);
	int (*wait)(struct hp_backend *b, struct hp_breq *r, struct hp_err *e);
	/* what a request kept between uses (a device's staging) */
	void (*req_free)(struct hp_backend *b, struct hp_breq *r);
	/* bf16 sums (op HP_RED_SUM) follow one rule on every path: each rank's
	 * values summed in fp32 in group rank order, rounded to bf16 once
	 * (hp_bf16_sum_ranks).  A bf16 reduce-scatter's recv holds size * n
	 * elements (every rank's block for this rank lands there; the sum is
	 * its first n), a bf16 all-reduce's buf 2 * size * ceil(n / size). */
	int (*reduce_scatter)(struct hp_backend *b, struct hp_comm *c, const void *send, void *recv, size_t n,
			      enum hp_dtype t, int op, struct hp_err *e);
	/* started now, finished by wait (buffers stay the caller's until then) */
	int (*ireduce_scatter)(struct hp_backend *b, struct hp_comm *c, const void *send, void *recv, size_t n,
			       enum hp_dtype t, int op, struct hp_breq *r, struct hp_err *e);
	int (*alltoall)(struct hp_backend *b, struct hp_comm *c, const void *send, void *recv, size_t n,
			enum hp_dtype t, struct hp_err *e);
	int (*alltoallv)(struct hp_backend *b, struct hp_comm *c, const void *send, const int *scounts,
			 const int *sdispls, void *recv, const int *rcounts, const int *rdispls, enum hp_dtype t,
			 int routed, struct hp_err *e);
	/* hp_comm_sendrecv with the backend's buffers (pipeline stages):
	 * every transfer started at once, done for the compute that follows
	 * when it returns */
	int (*sendrecv)(struct hp_backend *b, struct hp_comm *c, const struct hp_p2p *ops, int n, struct hp_err *e);
	/* Set up device collectives over the dims of cs (NCCL where each rank
	 * has a GPU of its own, else host-staged); collective over the world.
	 * Nothing on the CPU. */
	int (*attach)(struct hp_backend *b, struct hp_comms *cs, struct hp_err *e);
	/* how device collectives travel: "mpi", "nccl" or "host-staged" */
	const char *(*comm_path)(struct hp_backend *b);

	void (*close)(struct hp_backend *b);
};

/* The CPU backend (kernels/cpu, the op table hp_cpu_ops_get() chose at the
 * first call: HP_KERNELS=reference selects the references). */
struct hp_backend *hp_backend_cpu(void);
/* The CPU op table the CPU backend runs (for the run's table of kernels). */
const struct hp_cpu_ops *hp_backend_cpu_ops(void);

/*
 * The CUDA backend on device dev (HP_EMULATE_OFF), or its host emulation
 * (exact or bf16; dev ignored, no GPU needed).  shared: other ranks use
 * this GPU too, so collectives go host-staged (NCCL wants a GPU per
 * rank).  HP_EUNSUP when this hp was built without CUDA and no emulation
 * is asked for.
 */
int hp_backend_cuda_open(struct hp_backend **bp, int dev, int shared, enum hp_emulate emu, struct hp_err *e);
/* The CUDA backend's table as a layout sees it (device, no eager
 * attention, its attention scratch), for measuring without a GPU or a
 * backend: hp-plan's device estimate.  Not for calling its ops. */
const struct hp_backend *hp_backend_cuda_sizing(void);
/* The granule of device memory the CUDA backend maps behind a reserved
 * range (cuMemGetAllocationGranularity on the A100, H100 and H200; the
 * emulation maps the same, and hp-plan counts in it). */
#define HP_CUDA_GRANULE ((size_t)2 << 20)
/* The device bytes the CUDA backend's prepare makes for z (a GPU's: bf16
 * values 2 bytes), with or without a GPU: hp-plan's estimate. */
size_t hp_backend_cuda_scratch_bytes(const struct hp_op_sizes *z);
/* HP_CUDA_EMULATE from the environment: 0 and *emu, or HP_EINVAL naming
 * the value when it is none of "exact", "bf16" (unset or empty: OFF). */
int hp_emulate_from_env(enum hp_emulate *emu, struct hp_err *e);
/* Release the backend (its device context too); NULL and the CPU backend
 * are ignored. */
void hp_backend_close(struct hp_backend *b);

#endif
