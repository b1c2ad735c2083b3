/*
 * model.h - a decoder-only transformer (HF LlamaForCausalLM,
 * MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
 * Qwen3MoeForCausalLM, GptOssForCausalLM, DeepseekV3ForCausalLM) in F32 on a backend (lib/backend/backend.h:
 * the CPU, or a GPU): parameters, gradients and activations in arenas,
 * forward, backward.  One orchestration for every backend and layout.
 *
 * Invariants:
 *  - Parameters are a flat list in a fixed order (embed, per layer
 *    input_layernorm, q, k, v, o (with biases), q_norm, k_norm,
 *    post_attention_layernorm, then the dense MLP or the router and the
 *    experts one by one, then model.norm and lm_head unless tied), each
 *    under its HF name (experts per expert, as hub files name them), all in
 *    one arena; gradients mirror that layout in a second arena, so a flat
 *    index i means the same element in both.
 *  - With tie_word_embeddings there is no lm_head parameter: the LM head
 *    reads model.embed_tokens.weight and adds its gradient there.
 *  - Activations are sized for one micro-batch of B x T tokens at
 *    hp_model_init time; no allocation happens in forward or backward.
 *  - Memory: params[i].w and .g (flat_w, flat_g) are host memory, the
 *    copy that loading, initialisation, checkpoints and the CPU optimizer
 *    read and write.  The model computes on bw, bg and the activations,
 *    in the backend's memory: on the CPU, bw == flat_w and bg == flat_g;
 *    on a device, hp_model_upload and hp_model_download move the weights
 *    (and gradients) between the two.  The layer tables lw, lg and embed,
 *    lm_head, ... point into bw and bg.
 *
 * Ownership: struct hp_model is caller-owned (hp_model_init/release); it
 * owns its arenas and parameter table.
 */
#ifndef HP_MODEL_H
#define HP_MODEL_H

#include <stdint.h>

#include "backend/backend.h"
#include "base/arena.h"
#include "base/err.h"
#include "config/config.h"
#include "config/hfconfig.h"
#include "cpu/ops.h"

/* Every parameter starts at a multiple of this many floats of the flat
 * arrays, so SIMD paths may assume its alignment (hp-plan lays the arrays
 * out the same way). */
#define HP_PARAM_ALIGN 16

struct hp_param {
	char name[96];          /* HF name */
	int ndim;
	int64_t shape[2];
	size_t numel;
	size_t offset;          /* element offset in the flat parameter/gradient arrays */
	float *w, *g;           /* host views into flat_w, flat_g */
	float **wslot, **gslot; /* where the model keeps its pointer to its copy in bw, bg */
	int decay;              /* weight decay applies (set by the optimizer setup) */
};

struct hp_expert_w {
	float *wg, *wu, *wd;    /* [Im,C], [Im,C], [C,Im] */
	float *bg, *bu, *bd;    /* GPT-OSS: [Im], [Im], [C] (bu == bg + Im), else NULL */
};

struct hp_layer_w {
	float *in_norm, *post_norm;
	float *wq, *wk, *wv, *wo;
	float *bq, *bk, *bv, *bo;     /* attention_bias, else NULL */
	float *q_norm, *k_norm;       /* Qwen3, else NULL */
	float *wg, *wu, *wd;          /* dense MLP, else NULL */
	float *router;                /* MoE: mlp.gate.weight [E,C] (GPT-OSS: mlp.router.weight) */
	float *router_b;              /* GPT-OSS: mlp.router.bias [E], else NULL */
	float *sinks;                 /* GPT-OSS: self_attn.sinks [heads], else NULL */
	/* DeepSeek-V3's latent attention (wq is q_proj or q_b_proj, wk, wv NULL) */
	float *wqa, *bqa, *qa_norm;   /* q_a_proj [R,C] (+bias), q_a_layernorm [R]; NULL without q_lora_rank */
	float *wkva, *bkva, *kva_norm;   /* kv_a_proj_with_mqa [L+r,C] (+bias), kv_a_layernorm [L] */
	float *wkvb;                  /* kv_b_proj [H*(nope+v), L] */
	float *router_corr;           /* mlp.gate.e_score_correction_bias [E] (frozen) */
	float *wsg, *wsu, *wsd;       /* mlp.shared_experts (Qwen3-Next: shared_expert): [Is,C], [Is,C], [C,Is] */
	float *wshg;                  /* Qwen3-Next: mlp.shared_expert_gate [1,C] */
	/* a Gated DeltaNet layer (linear_attn): in_proj_qkvz [2Kd+2Vd,C] and
	 * in_proj_ba [2Hv,C], or in_proj_qkv [2Kd+Vd,C], in_proj_z [Vd,C],
	 * in_proj_b, in_proj_a [Hv,C]; conv1d [2Kd+Vd,K], dt_bias, A_log
	 * [Hv], norm [Dv], out_proj [C,Vd] */
	float *wqkvz, *wba, *wqkv, *wz, *wb, *wa, *conv, *dt_bias, *A_log, *lin_norm, *wout;
	struct hp_expert_w *ex;       /* MoE: [E] */
	size_t xs;                    /* MoE: ex[x].f == ex[0].f + x * xs (the grouped kernels' stride) */
	int moe;
};

/*
 * Which kernel computes each module, from the plan's bindings (hp-plan(1));
 * zero everywhere is HF's algorithm with the default op table.
 *   flash[l]       attention by tiled online softmax: keeps the log-sum-exp
 *                  [B, heads, T] instead of P [B, heads, T, T] and recomputes
 *                  P block by block in the backward;
 *   fused_in[l], fused_post[l], fused_final
 *                  RMSNorm with the residual add that makes its input, in
 *                  one pass;
 *   grouped[l]     experts: one GEMM for gate and up together (their weights
 *                  are adjacent), a fused SwiGLU, the SwiGLU output recomputed
 *                  in the backward instead of kept (and on one rank the
 *                  experts' outputs, from it and down_proj);
 *   ce_chunk       LM head and cross-entropy over chunks of this many tokens,
 *                  never the whole [tokens, vocab] logits (recomputed in the
 *                  backward); 0: whole.
 */
/*
 * Activation checkpointing of a layer (activation_checkpoint.mode).  full:
 * only the layer's input is kept; the backward runs the layer's forward
 * again, collectives included, into one working set that every such layer
 * shares.  selective: everything is kept but the attention probabilities
 * [B,H,T,S] of a layer on the reference attention, which the backward
 * recomputes from the kept q, k, v (flash attention never keeps them).
 */
enum hp_act_ckpt { HP_ACT_CKPT_OFF = 0, HP_ACT_CKPT_FULL, HP_ACT_CKPT_SELECTIVE };

struct hp_model_kernels {
	unsigned char flash[HP_MAX_LAYERS], fused_in[HP_MAX_LAYERS], fused_post[HP_MAX_LAYERS];
	unsigned char grouped[HP_MAX_LAYERS];
	unsigned char ckpt[HP_MAX_LAYERS];   /* enum hp_act_ckpt of layer l */
	unsigned char fused_final;
	long ce_chunk;
};

/*
 * This rank's part of a parallel layout (hp-plan(5)); all ones, or a NULL
 * comms, is the single-process model.
 *   tp   attention heads, the dense MLP's intermediate rows and the
 *        vocabulary split over tp ranks (Megatron's column/row-parallel
 *        linears and vocab-parallel embedding and LM head); with sp the
 *        residual stream between blocks holds this rank's 1/tp of the
 *        tokens (all-gather on a block's entry, reduce-scatter on its exit);
 *        with loss_parallel the cross-entropy runs on the rank's vocabulary
 *        slice, else the logits are all-gathered.
 *   cp   each row's tokens split into cp contiguous chunks: attention
 *        all-gathers K and V (backward: reduce-scatter of dK, dV), or with
 *        ulysses trades the sequence split for a head split (all-to-all).
 *   ep   the routed experts split into ep blocks; each MoE layer sends
 *        every routed row to its expert's rank and the output back.
 */
struct hp_comms;
#define HP_MAX_EP 1024
struct hp_model_par {
	int tp, tp_rank, cp, cp_rank, ep, ep_rank;
	int sp, loss_parallel, ulysses;
	/* the weights and gradients come and go unit by unit (FSDP, which
	 * commits and releases them): on a device they are reserved, with
	 * memory only behind what is gathered (backend.h, reserve) */
	int sharded;
	/* pipeline parallelism: pp stages, this rank's stage pp_rank, which
	 * holds the decoder layers [l0, l1) (the embedding on the first stage,
	 * the final norm and LM head on the last); slots micro-batches' kept
	 * activations at once (hp_model_use_slot).  pp 0 or 1: one stage of
	 * every layer, one slot.  Interleaved (vpp > 1 chunks): chunk c holds
	 * the layers [chunk_l0[c], chunk_l1[c]) and has chunk_slots[c] of the
	 * slots; l0, l1 are the current slot's chunk's, the embedding is chunk
	 * 0's of the first stage, the head the last chunk's of the last. */
	int pp, pp_rank, l0, l1, slots;
	int vpp, chunk_l0[HP_MAX_VPP], chunk_l1[HP_MAX_VPP], chunk_slots[HP_MAX_VPP];
	struct hp_comms *cs;
};

/*
 * Faults injected on purpose (debug.inject_fault), so that validation and
 * hp-verify can be shown to catch what they claim to catch
 * (hp-verify(1)).  Each breaks one collective or offset of the first layer
 * it applies to.
 */
enum hp_fault {
	HP_FAULT_NONE = 0,
	HP_FAULT_TP_SKIP_REDUCE,          /* layer 0's o_proj partial sums not reduced over tp */
	HP_FAULT_SP_SKIP_GATHER,          /* layer 0's input norm output not gathered over tp */
	HP_FAULT_CP_WRONG_OFFSET,         /* layer 0's attention: the chunk's causal offset taken as 0 */
	HP_FAULT_CP_SKIP_KV_GRAD_REDUCE,  /* layer 0: dK, dV not reduce-scattered over cp */
	HP_FAULT_EP_WRONG_ROUTE,          /* first MoE layer: a token's row sent to the wrong rank */
	HP_FAULT_EP_DROP_TOKEN,           /* first MoE layer: a token's expert output dropped */
	HP_FAULT_FSDP_STALE_SHARD,        /* layer 0 gathered from the previous step's shards */
	HP_FAULT_GRAD_SCALE,              /* gradients scaled by the rank's token count, not the global one */
	HP_FAULT_PP_STALE_ACTIVATION,     /* the second stage computes micro-batch 1 from micro-batch 0's input */
	HP_FAULT_PP_OUT_OF_ORDER,         /* the first stage sends micro-batches 0 and 1 swapped */
	HP_NFAULT
};
/* The fault's name as debug.inject_fault spells it, and back (-1: unknown). */
const char *hp_fault_name(int f);
int hp_fault_parse(const char *name);

/* A module's output as this rank holds it, for validation and hp-verify:
 * rows of this rank's tokens (its cp chunk of each row, row-major) by cols. */
struct hp_probe {
	const char *module;     /* "model.layers.3.self_attn" */
	const float *x;
	long rows;
	int cols;
	int row_split;          /* the rows are this rank's 1/tp of them (sequence parallel) */
	int col_split;          /* the cols are this rank's 1/tp slice (the vocabulary) */
};

enum { HP_HOOK_PRE_FORWARD = 0, HP_HOOK_POST_FORWARD, HP_HOOK_PRE_BACKWARD, HP_HOOK_POST_BACKWARD };

struct hp_layer_act {
	float *x_in;       /* [N,C] residual stream entering the layer */
	float *rstd1;      /* [N] */
	float *xn1;        /* [N,C] */
	float *q_raw, *k_raw, *rstd_q, *rstd_k;   /* qk_norm: projections before the norm */
	float *q, *k, *v;  /* [N,Hq*D], [N,Hkv*D] after norm and RoPE (q, k) */
	float *P;          /* [B,Hq,T,T]; flash: the log-sum-exp [B,Hq,T] */
	float *att;        /* [N,Hq*D] attention output before o_proj */
	float *x_mid;      /* [N,C] residual after attention */
	float *rstd2;      /* [N] */
	float *xn2;        /* [N,C] */
	float *g, *u, *h;  /* dense: [N,I]; an MoE layer's shared experts: [Ns,Is] */
	/* multi-head latent attention: q_a_proj's output, its norm's rstd and
	 * output [N,R]; the latent c of kv_a_proj [N,L], kv_a_layernorm's
	 * rstd and output [N,L]; the attention output cut to v_head_dim per
	 * head [N,H*v] (NULL when v_head is head_dim) */
	float *qa, *rstd_qa, *qan, *kvc, *rstd_kv, *cn, *att_v;
	/* gated attention (attn_gate): the gate [N,Hq*D] and the gated output
	 * o_proj reads [N,Hq*D] */
	float *gate, *att_g;
	/* a gated shared expert: its output before the gate [Ns,C], the gate's logit [Ns] */
	float *sh_out, *sh_gl;
	/* a Gated DeltaNet layer: the conv's input [N,CD] (CD = 2Kd+Vd), z
	 * [N,Vd], b and a [N,Hv]; the normalised q, k [N,Kd] and their 1/norms
	 * [N*Hk]; v [N,Vd]; beta, g [N,Hv]; the delta rule's saved states, its
	 * output [N,Vd], the gated norm's rstd [N*Hv] and output [N,Vd] */
	float *xc, *z, *gb, *ga, *qn, *kn, *rq, *rk, *vv, *beta, *gl, *saved, *o, *rstd_o, *y;
	/* MoE: router and the expert-major rows (N*k of them) */
	float *probs;      /* [N,E] softmax of the router logits, fp32 */
	struct hp_i32 sel; /* [N,k] chosen experts, by falling probability */
	float *wsel;       /* [N,k] their weights (renormalized if norm_topk_prob) */
	struct hp_i32 row_tok, row_slot;   /* [N*k] token and slot of each row */
	struct hp_i32 tok_rows;   /* [N*k] each token's rows, ascending (device backends) */
	struct hp_i32 ex_off;   /* [E+1] first row of each expert (the host's copy: ep > 1 only) */
	float *xe, *ge, *ue, *he, *ye; /* [N*k,C], [N*k,Im] x3, [N*k,C]; grouped: ge is
					  [N*k, 2*Im] (gate | up per row), xe, ue and he NULL,
					  and on one rank ye NULL too (recomputed) */
	float *moe_out;    /* [N,C] weighted sum of the experts */
	/* context parallelism: the whole rows' K and V [B,S,Hkv*D] (all-gather),
	 * or the attention output in the head-split layout (ulysses) */
	float *kg, *vg, *att_u;
	/* expert parallelism: rows received for this rank's experts, grouped
	 * expert-major, and where each came from */
	int32_t *ep_scount, *ep_rcount;   /* [ep] rows sent to / received from each rank (host) */
	struct hp_i32 ep_perm;   /* [rcap] expert-major row -> received row */
	struct hp_i32 ep_off;   /* [El+1] first expert-major row of each local expert */
	long ep_rows;      /* rows received */
};

/* The parameters and their gradients: every tensor in one flat array each
 * (16-float padding between tensors), named views of them per layer. */
struct hp_model_weights {
	int nparams, cap_params;
	struct hp_param *params;
	size_t numel;                 /* total parameter elements */
	float *flat_w, *flat_g;       /* all parameters / gradients, numel each (host) */
	float *bw, *bg;               /* the same in the backend's memory (== flat_w, flat_g on the CPU) */
	size_t wc0;                   /* bw + wc0 on: the region with a working copy (hp_backend.weights) */
	struct hp_arena warena, garena;
	float *embed, *final_norm, *lm_head;      /* lm_head == embed when tied */
	float *d_embed, *d_final_norm, *d_lm_head;
	struct hp_layer_w *lw, *lg;               /* weights and grads per layer */
};

/* One micro-batch's activations, what the backward keeps and its scratch. */
struct hp_model_acts {
	int B, T;
	struct hp_arena aarena;
	struct hp_arena harena;       /* device backends: the host-only index arrays */
	/* the micro-batch as the kernels read it: this rank's chunk of it (cp),
	 * in the backend's memory; on the CPU at cp 1 the caller's arrays */
	struct hp_i32 ids, tgt, segs;
	struct hp_layer_act *act;
	float *x_final, *rstd_f, *xf, *logits;    /* logits [N,V]; chunked: [ce_chunk,V] */
	float *cos_t, *sin_t;                     /* RoPE tables [T, D/2] */
	struct hp_i32 pos;                        /* [N] RoPE position of each token */
	const int32_t *seg;                       /* the last forward's segments, as the kernels read them */
	/* sliding-window layers: each query's first visible key, max(seg,
	 * position - W + 1), laid out as seg is for the kernels (the chunk's
	 * rows, or the whole rows for ulysses); segw.d what they read */
	struct hp_i32 segw;
	float *probe_buf;                         /* device backends: a probed output, on the host */
	size_t probe_cap;
	/* backward scratch: dx (a slot's gradient in flight) and dxn are each
	 * slot's own; the rest is one pass's, the same buffers in every slot */
	float *dx, *dxn, *dq, *dk, *dv, *datt, *dg, *du, *dh, *dscratch;
	float *dq2, *dk2;                         /* qk_norm */
	float *mla_t, *mla_u, *mla_w;             /* MLA: [N,H*(nope+v)], [N,max(R,L+r)], [N,max(H*qk,L)] */
	float *gdn_w;                             /* Gated DeltaNet and gated attention: a pass's scratch (gdn_scratch) */
	float *gdr_ws;                            /* a device's delta rule scratch (bk->gdr_scratch floats) */
	/* zero-centred norms: 1 + w of each layer's input, post-attention, q
	 * and k norms ([2C + 2D] a layer) and the final one, made before their
	 * first use in each forward; ones [max(C, D)] to make them from */
	float *zc, *ones;
	/* DeepSeek: each layer's routed rows per expert over the step's
	 * forwards [n_layers][2E] (the first E; hp_moe_aux_acc's layout), the
	 * first slot's, every slot's (hp_model_route_loads) */
	double *route_cnt;
	float *dye, *dxe, *dge, *due, *dhe, *dprob, *dwsel;   /* MoE */
	float *hrec;                              /* grouped experts: SwiGLU recomputed */
	float *xg;                                /* grouped experts: routed rows gathered */
	int32_t *moe_fill;                        /* [2E] ep: the counts sent and received */
	/* the backend's: the sums of enum hp_model_stat, then (MoE) the
	 * load-balancing loss's [2E] (hp_moe_aux_acc) and its value, fp (in
	 * st's tail, or a slot's own) */
	double *st, *fp;
};

/* This rank's part of the layout: its local sizes and the buffers its
 * collectives move. */
struct hp_model_lay {
	int S;                        /* tokens per row (T is this rank's chunk: S / cp) */
	long Ns;                      /* tokens of the residual stream (N / tp with sp) */
	int v0, e0, El;               /* first vocabulary row, first and number of local experts */
	long ep_rcap;                 /* rows a rank can receive per MoE layer (no token dropped) */
	float *dfull, *dred;          /* tp: [N,C] gathered gradient, [Ns,C] reduced one */
	float *glogits;               /* tp without loss_parallel: [N, vocab] */
	float *vp_mx; double *vp_st;  /* loss_parallel: [N] row maxima, [2N] sums */
	float *cp_send, *cp_recv;     /* cp: packing buffers */
	float *ep_send, *ep_recv;     /* ep: rows in flight */
};

struct hp_model {
	/* spec: what this rank computes (heads, intermediate rows and
	 * vocabulary divided by tp); gspec: the model as config.json has it */
	struct hp_model_spec spec, gspec;
	struct hp_model_par par;
	struct hp_backend *bk;        /* borrowed */
	struct hp_model_kernels k;
	struct hp_model_weights w;
	struct hp_model_acts a;
	struct hp_model_lay lay;
	int n_moe;                    /* MoE layers */

	/* pipeline parallelism: each slot's activations and layout buffers
	 * (par.slots of them; slot 0's sums are the step's), and the slot in
	 * m->a and m->lay now */
	struct hp_model_slot { struct hp_model_acts a; struct hp_model_lay lay; int head_done; } *slot;
	int cur_slot, cur_chunk;   /* the slot in use, and its chunk (par.vpp) */

	/* the pass in flight */
	int par_rc;                   /* its first error: a collective's, the backend's, a hook's */
	struct hp_err err;            /* its message (hp_model_forward and _backward hand it on) */
	/* chunked cross-entropy: given the gradient's scale, the forward also
	 * computes the LM head's gradients, chunk by chunk, and the backward
	 * starts from them (head_done); else it recomputes each chunk's logits */
	int head_done;
	int st_fresh;                 /* hp_model_stats_zero: the next forward zeroes the step's sums */
	int fault;                    /* enum hp_fault */
	/* the delta rule's per-thread workspace (hp_gdr_scratch_floats), host
	 * memory of the kernel's as the attention kernels' own is */
	float *gdr_ws;

	/* called before and after each layer's forward and backward (FSDP
	 * gathers a layer's weights just in time and frees them after); an
	 * HP_E code, with its message in e, stops the pass, and the pass
	 * returns it */
	int (*hook)(void *ctx, int layer, int phase, struct hp_err *e);
	void *hook_ctx;
	/* called with every module's output in forward order (NULL: not);
	 * a failure stops the forward as the hook's does */
	int (*probe)(void *ctx, const struct hp_probe *p, struct hp_err *e);
	void *probe_ctx;
};

/*
 * Build the parameter table and arenas for spec, and activations for
 * micro-batches of B sequences of T tokens.  Parameters start at zero.
 */
int hp_model_init(struct hp_model *m, const struct hp_model_spec *spec, int B, int T, struct hp_err *e);
/* The same with the kernels k (NULL: all HF's). */
int hp_model_init_kernels(struct hp_model *m, const struct hp_model_spec *spec,
			  const struct hp_model_kernels *k, int B, int T, struct hp_err *e);
/* The same for this rank's part of a parallel layout (par NULL: none) on
 * backend bk (NULL: the CPU's; borrowed, it must outlive the model); T is
 * the whole row's length.  The parameter table then holds the rank's
 * tp-local tensors (hp_plan_piece's rows x cols before FSDP) and its own
 * experts, under their global HF names.  On a backend without the eager
 * attention (CUDA) every layer runs flash attention. */
int hp_model_init_par(struct hp_model *m, struct hp_backend *bk, const struct hp_model_spec *spec,
		      const struct hp_model_kernels *k, const struct hp_model_par *par, int B, int T,
		      struct hp_err *e);
void hp_model_release(struct hp_model *m);

/* Device backends: the host weights (flat_w) to the device, and the
 * device's weights (and gradients, with grads) back to the host.  Nothing
 * on the CPU, where they are one array. */
int hp_model_upload(struct hp_model *m, struct hp_err *e);
int hp_model_download(struct hp_model *m, int grads, struct hp_err *e);

/*
 * The activation bytes hp_model_init_par would allocate for this layout
 * (its communicators unused), without allocating them: hp-plan's estimate,
 * the same code path as the model's own.  -1 when the layout is one the
 * model refuses, -2 when the bytes overflow 64 bits.
 */
int64_t hp_model_act_bytes(const struct hp_model_spec *spec, const struct hp_model_kernels *k,
			   const struct hp_model_par *par, int B, int T);
/* The same on a device backend (flash attention in every layer, its one
 * arena of what it uses), and in *scratch the device bytes of the
 * backend's operand scratch (hp_backend.prepare) for it. */
int64_t hp_model_device_act_bytes(const struct hp_model_spec *spec, const struct hp_model_kernels *k,
				  const struct hp_model_par *par, int B, int T, int64_t *scratch);

/*
 * Load every parameter from an HF folder (single file or index; F32, BF16,
 * F16 converted to F32).  A missing tensor, a shape mismatch, or a tensor
 * the model does not use is an HP_EFORMAT error naming the tensor and file.
 * A checkpoint that carries lm_head.weight for a tied model must hold the
 * same values as the embedding (checked).
 */
int hp_model_load_hf(struct hp_model *m, const char *dir, struct hp_err *e);

/*
 * What the forwards of a step add up in the backend's memory, read once
 * at its end (hp_model_stats) rather than a micro-batch at a time: a
 * device's host waits once.
 */
enum hp_model_stat {
	HP_ST_LOSS,      /* the cross-entropy sums of the forwards that returned none */
	HP_ST_AUX,       /* their load-balancing losses (output_router_logits), each over cp */
	HP_ST_GRAD_SQ,   /* the caller's: the gradients' squared norm (hp_optim_grad_sumsq) */
	HP_ST_BAD,       /* the router's choices outside the experts (an int32 at the slot) */
	HP_ST_CLIP,      /* the caller's: the update's clip factor and gate (2 floats at the slot) */
	HP_ST_FWD,       /* the last forward's cross-entropy sum (last: the forward zeroes it on) */
	HP_ST_N
};

/* DeepSeek's router: how many rows each expert of each layer took in
 * this step's forwards so far, into out [n_layers * E] (zeros for the
 * layers of other stages and dense ones); one download.  HP_EINVAL when
 * the model has no grouped router. */
int hp_model_route_loads(struct hp_model *m, double *out, struct hp_err *e);

/* Zero the step's sums (the next forward does, with its own: one launch);
 * read them (HP_ST_N doubles, one download). */
void hp_model_stats_zero(struct hp_model *m);
int hp_model_stats(struct hp_model *m, double *out, struct hp_err *e);
/* The double of the step's sums at i, in the backend's memory. */
double *hp_model_stat(struct hp_model *m, enum hp_model_stat i);

/*
 * Pipeline stages (par.pp > 1).  A stage's forward starts, unless it is
 * the first, from the residual stream its caller has put in the slot's
 * input (this rank's Ns x hidden floats, in the backend's memory), and
 * ends, unless it is the last, with the residual stream it hands on in
 * the slot's output (no norm, no loss).  Its backward starts, unless it is
 * the last, from the gradient of that output, put in the slot's grad; and
 * ends, unless it is the first, with the gradient of its input in the same
 * buffer.  Each micro-batch in flight (of each chunk) computes in a slot
 * of its own (0 <= k < par.slots), made current by hp_model_use_slot
 * before its forward and again before its backward.
 * With the MoE load-balancing loss (output_router_logits) the slot's
 * router statistics (aux: 2 E + 1 doubles, in the backend's memory) travel
 * with the residual stream: forward, the sums of the stages so far, which
 * the next stage adds its layers' to (the last makes the loss of them);
 * backward, the last stage's whole sums, which every stage's routers need.
 */
void hp_model_use_slot(struct hp_model *m, int k);
/* Slot k's stage buffers, current or not: its input (in), output (out),
 * the gradient it receives and sends (grad), its router statistics (aux,
 * naux doubles; NULL, 0 without). */
struct hp_stage_io { float *in, *out, *grad; double *aux; size_t naux; };
void hp_model_slot_io(struct hp_model *m, int k, struct hp_stage_io *io);
/* Elements of each of in, out and grad: Ns x hidden. */
size_t hp_model_stage_numel(const struct hp_model *m);

/* Look a parameter up by HF name; NULL when absent. */
struct hp_param *hp_model_param(struct hp_model *m, const char *name);

/*
 * Forward over ids[B*T] (token ids validated by the caller).  When targets
 * is non-NULL, the valid-target count is returned (count) and the
 * cross-entropy sum: into loss_sum (which waits for a device), or with
 * loss_sum NULL added to the step's HP_ST_LOSS (which does not).  grad_scale is the backward's scale of the
 * cross-entropy, 1 / the step's target count, when a backward follows (0
 * when none does): with chunked cross-entropy the forward computes the LM
 * head's gradients with it.  Returns 0, or an HP_E code with e set: a target out
 * of range (HP_EINVAL), a collective's or the backend's failure, or the
 * failure of a hook or probe (with its own message).
 * seg[B*T] describes packed rows (NULL: one document per row): for each
 * token, the index in its row where its document starts.  A token attends
 * only within its document and its RoPE position counts from the
 * document's start, so a packed document computes what it computes alone.
 * seg is borrowed until the matching backward.
 * The logits stay in m->logits [B*T, V] until the next call (not with
 * chunked cross-entropy, which keeps none).  With MoE layers and
 * output_router_logits, HF's load-balancing loss over all MoE layers of
 * this forward (not scaled by its coefficient) is added to HP_ST_AUX,
 * over cp (every cp rank has it); router choices out of range (NaN
 * logits) count into HP_ST_BAD, and a forward with loss_sum fails on them.
 */
int hp_model_forward(struct hp_model *m, const int32_t *ids, const int32_t *targets,
		     const int32_t *seg, double grad_scale, double *loss_sum, long *count, struct hp_err *e);

/*
 * Backward of the last forward for the loss
 *   sum(CE) / total_count + aux_weight * router_aux_loss_coef * aux_loss
 * (aux_weight is this micro-batch's share of the averaged aux loss; 0 when
 * the model has no aux loss).  Gradients are ADDED to m->bg (zero them
 * with hp_model_zero_grad).  m->logits is overwritten.  Returns 0 or an
 * HP_E code with e set, as the forward.
 */
int hp_model_backward(struct hp_model *m, const int32_t *ids, const int32_t *targets, double total_count,
		      double aux_weight, struct hp_err *e);

void hp_model_zero_grad(struct hp_model *m);

/* Write every gradient as F32 under its HF name, in the checkpoint's shape
 * (params.h, hp_param_hf_shape), to a safetensors file (atomically, through
 * hp_st_write), with nmeta metadata pairs. */
int hp_model_save_grads(const struct hp_model *m, const char *path, size_t nmeta,
			const char *const *keys, const char *const *vals, struct hp_err *e);

#endif
