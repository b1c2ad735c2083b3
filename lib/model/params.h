/*
 * params.h - the parameters of a model spec, in one canonical order.
 *
 * The single list of what a model holds: every parameter's HF name, global
 * shape, tensor-parallel role and place in the model.  lib/model/model.c builds
 * its parameter table from it and lib/plan/plan.c its placements, so the two can
 * never disagree about a name, a shape or the order.
 *
 * Order: model.embed_tokens.weight; for each layer input_layernorm,
 * q_proj (+bias), k_proj (+bias), v_proj (+bias), o_proj (+bias), q_norm,
 * k_norm (Qwen3), sinks (GPT-OSS) -- or a Gated DeltaNet layer's
 * linear_attn: in_proj_qkvz, in_proj_ba (or in_proj_qkv, in_proj_z,
 * in_proj_b, in_proj_a), conv1d (held [C, K], [C, 1, K] in checkpoints),
 * dt_bias, A_log, norm, out_proj -- or DeepSeek-V3's latent attention:
 * q_a_proj (+bias), q_a_layernorm, q_b_proj (or q_proj), kv_a_proj_with_mqa
 * (+bias), kv_a_layernorm, kv_b_proj, o_proj (+bias) --,
 * post_attention_layernorm, then either the dense MLP (gate, up, down) or
 * the router (mlp.gate; GPT-OSS: mlp.router and its bias; DeepSeek-V3:
 * then its e_score_correction_bias) and each expert's gate, up, down
 * (GPT-OSS: then their biases, so that gate and up stay adjacent, and
 * every expert's block has one size), then DeepSeek-V3's shared experts'
 * gate, up, down (Qwen3-Next's shared expert's, then its
 * shared_expert_gate); then model.norm.weight and lm_head.weight unless the
 * embeddings are tied.  GPT-OSS's checkpoints hold the experts stacked and
 * transposed (experts.gate_up_proj [E, C, 2*Im], gate and up interleaved
 * by column); hp names them one by one as Qwen3-MoE's hub files do, and
 * the readers and the exporter convert.
 */
#ifndef HP_PARAMS_H
#define HP_PARAMS_H

#include <stdint.h>

#include "config/hfconfig.h"

/* How tensor parallelism splits a parameter (DESIGN.md §4). */
enum hp_param_role {
	HP_ROLE_REPLICATE = 0,   /* norms, the router, o_proj's bias */
	HP_ROLE_COLUMN,          /* shard(0) on tp: embed, lm_head, q/k/v, gate/up, their biases */
	HP_ROLE_ROW,             /* shard(1) on tp: o_proj, down_proj */
	HP_ROLE_EXPERT,          /* a routed expert: split over ep, not tp */
};

/* Which tensor of the model it is. */
enum hp_param_field {
	HP_PF_EMBED = 0, HP_PF_IN_NORM, HP_PF_WQ, HP_PF_BQ, HP_PF_WK, HP_PF_BK, HP_PF_WV, HP_PF_BV,
	HP_PF_WO, HP_PF_BO, HP_PF_Q_NORM, HP_PF_K_NORM, HP_PF_POST_NORM, HP_PF_WG, HP_PF_WU, HP_PF_WD,
	HP_PF_ROUTER, HP_PF_EX_GATE, HP_PF_EX_UP, HP_PF_EX_DOWN, HP_PF_FINAL_NORM, HP_PF_LM_HEAD,
	/* GPT-OSS */
	HP_PF_SINKS, HP_PF_ROUTER_B, HP_PF_EX_GATE_B, HP_PF_EX_UP_B, HP_PF_EX_DOWN_B,
	/* DeepSeek-V3: multi-head latent attention (WQ is q_proj or q_b_proj),
	 * the router's correction bias, the shared experts */
	HP_PF_Q_A, HP_PF_Q_A_B, HP_PF_Q_A_NORM, HP_PF_KV_A, HP_PF_KV_A_B, HP_PF_KV_A_NORM, HP_PF_KV_B,
	HP_PF_ROUTER_CORR, HP_PF_SH_GATE, HP_PF_SH_UP, HP_PF_SH_DOWN,
	/* Qwen3-Next / Qwen3.5: a Gated DeltaNet layer's tensors (its
	 * projections fused, qwen3_next: QKVZ and BA; or split, qwen3_5: QKV,
	 * Z, B, A), and the shared expert's gate */
	HP_PF_LIN_QKVZ, HP_PF_LIN_BA, HP_PF_LIN_QKV, HP_PF_LIN_Z, HP_PF_LIN_B, HP_PF_LIN_A, HP_PF_LIN_CONV,
	HP_PF_LIN_DT, HP_PF_LIN_ALOG, HP_PF_LIN_NORM, HP_PF_LIN_OUT, HP_PF_SH_GATE_W,
};

struct hp_param_desc {
	const char *name;        /* HF name; valid during the callback only */
	int ndim;
	int64_t shape[2];        /* shape[1] is 1 for vectors */
	enum hp_param_role role;
	enum hp_param_field field;
	int layer;               /* -1 outside the decoder layers */
	int expert;              /* -1 unless a routed expert */
};

typedef int (*hp_param_fn)(void *ctx, const struct hp_param_desc *d);

/* How the passes read a parameter, by its name (and shape), for where a
 * device may keep it.  The embedding (the first parameter) is looked up
 * row by row in fp32; untied, it is never a GEMM's operand, so it has no
 * bf16 working copy.  Every other matrix is only ever a GEMM's operand:
 * gathered over ranks, a device holds it in its working copy alone
 * (lib/dist/fsdp.c), and hp-plan counts it so (lib/plan/planest.c). */
int hp_param_uncopied(const char *name, int tied);
/* A buffer, not trained by gradient (DeepSeek's e_score_correction_bias):
 * its gradient stays zero, no weight decay touches it. */
int hp_param_frozen(const char *name);
/* Whether name is the token embedding (model.embed_tokens.weight, or a
 * multimodal folder's model.language_model.embed_tokens.weight). */
int hp_param_is_embed(const char *name);
/* name ends with suffix, after something (suffixes start with their '.') */
int hp_param_ends(const char *name, const char *suffix);
/* Whether a weight replicated over tp gets only this rank's heads' share
 * of its gradient (Qwen3's q/k norms; MLA's latent projections and norms,
 * which feed every head; every tensor of a Gated DeltaNet layer, whose
 * heads tp splits): summed over tp after the backward. */
int hp_param_tp_partial(const char *name);
/* Whether only GEMMs read a weight (a device's FSDP then gathers its bf16
 * working copy alone): every 2-D weight but the embeddings and the Gated
 * DeltaNet conv and out_proj, which kernels read in fp32. */
int hp_param_gemm_only(const char *name, int ndim);

/*
 * Where expert parameter `name` sits inside a layer's stacked checkpoint
 * tensor: Qwen3-MoE's newer files (experts.gate_up_proj [E, 2*Im, C],
 * experts.down_proj [E, C, Im]) or GPT-OSS's (experts.gate_up_proj
 * [E, C, 2*Im] with gate and up interleaved by column, gate_up_proj_bias
 * [E, 2*Im] likewise, down_proj [E, Im, C], down_proj_bias [E, C]).
 * Element (r, c) of the parameter is element base + r * rs + c * cs of the
 * stacked tensor, counted flat.  Returns 1 and fills v for an expert
 * parameter of s, 0 for any other name.
 */
struct hp_stacked_view {
	char name[128];          /* the stacked tensor */
	int ndim;
	int64_t shape[3];
	int64_t base, rs, cs;
	int expert, part;        /* the parameter's expert; 0 gate, 1 up, 2 down */
	/* GPT-OSS's weights as MXFP4 (name + "_blocks" [E, R, G, 16] and
	 * "_scales" [E, R, G], dtype.h hp_mxfp4_decode): row r of the
	 * parameter is row mx_row0 + r * mx_rstep of the decoded [E * R, mx_K]
	 * (transformers transposes it after decoding), G = mx_K / 32; mx_R 0
	 * for a bias */
	int64_t mx_R, mx_K, mx_row0, mx_rstep;
};
int hp_param_stacked(const struct hp_model_spec *s, const char *name, struct hp_stacked_view *v);

/*
 * View v's tensor in the checkpoint st: the stacked tensor (*t, *scales
 * NULL), or its MXFP4 blocks and scales (*t the blocks); 1 when the folder
 * holds neither, HP_EFORMAT naming the tensor (dir the folder) when its
 * dtype or shape is not what E experts of this model need.
 */
struct hp_st_model;
struct hp_st_tensor;
int hp_stacked_find(const struct hp_st_model *st, const struct hp_stacked_view *v, int E, const char *dir,
		    const struct hp_st_tensor **t, const struct hp_st_tensor **scales, struct hp_err *e);

/* Rows r0 .. r0+nr-1, columns c0 .. c0+nc-1 of an MXFP4 view's parameter,
 * decoded from blocks and scales into dst [nr, nc]; buf holds
 * hp_mxfp4_buf_bytes(v) bytes. */
size_t hp_mxfp4_buf_bytes(const struct hp_stacked_view *v);
int hp_mxfp4_rows(const struct hp_stacked_view *v, const struct hp_st_tensor *blocks,
		  const struct hp_st_tensor *scales, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *dst,
		  void *buf, struct hp_err *e);

/* Whether a checkpoint tensor is one transformers never loads: DeepSeek's
 * multi-token-prediction layers, after the decoder's (num_nextn_predict_layers);
 * Qwen3-Next's and Qwen3.5's mtp.* module. */
int hp_param_not_loaded(const struct hp_model_spec *s, const char *name);

/*
 * The shape parameter name (hp's ndim and shape) has in an HF checkpoint:
 * returns the checkpoint's ndim and fills out with its dimensions.  hp
 * holds every parameter as 1-D or 2-D; Qwen3-Next's and Qwen3.5's Gated
 * DeltaNet short convolution, "*.linear_attn.conv1d.weight", is a
 * depthwise nn.Conv1d whose weight transformers keeps as [C, 1, K] where
 * hp holds [C, K] (the same bytes, row-major): 3 and [shape[0], 1,
 * shape[1]].  Any other parameter: ndim, with out[0..1] = shape[0..1].
 * The readers of HF folders (hp_model_load_hf, hp-convert's source) accept
 * exactly this shape and the writers of HF-format files (hp-convert
 * --export, gradient and parameter dumps) write it; hp's per-rank shard
 * files keep hp's own shape.
 */
int hp_param_hf_shape(const char *name, int ndim, const int64_t shape[2], int64_t out[3]);

/* Whether checkpoint tensor t has parameter name's hp_param_hf_shape: 0, or
 * HP_EFORMAT "'dir': tensor 'name' has shape [..], <who> [..]" with the
 * checkpoint's expected shape (who: "config.json implies", "the plan's
 * model needs"). */
int hp_param_hf_check_shape(const struct hp_st_tensor *t, const char *name, int ndim, const int64_t shape[2],
			    const char *dir, const char *who, struct hp_err *e);

/* Whether a checkpoint tensor name is one of s's stacked expert tensors. */
int hp_param_is_stacked(const struct hp_model_spec *s, const char *name);

/* Call fn for every parameter of s in the canonical order; stop at the
 * first non-zero return and return it (0 when all were visited). */
int hp_model_spec_params(const struct hp_model_spec *s, hp_param_fn fn, void *ctx);

/* The elements of every parameter hp_model_spec_params lists (tied
 * embeddings counted once; DeepSeek's correction-bias buffer, which the
 * checkpoint holds, counted too); -1 when the sum overflows 64 bits
 * (hp_plan_resolve refuses such a model). */
long long hp_model_spec_nparams(const struct hp_model_spec *s);

#endif
