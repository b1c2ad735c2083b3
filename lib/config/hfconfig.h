/*
 * hfconfig.h - an HF config.json turned into a model spec.
 *
 * config.json is read as both transformers release lines write it: 4.x
 * (top-level rope_theta and rope_scaling, torch_dtype, num_experts) and 5.x
 * (rope_parameters, dtype, num_local_experts).  The model types are llama,
 * mistral, qwen2, qwen3, qwen3_moe, gpt_oss, deepseek_v3, qwen3_next,
 * qwen3_5_text and qwen3_5_moe_text, each with the defaults of its own
 * configuration class.
 *
 * Every top-level key falls in one of three lists kept in hfconfig.c:
 * implemented (it changes what hp computes, exactly as transformers does),
 * inert (known to leave training's maths alone: use_cache, bos/eos ids,
 * transformers_version, ...), or refused by value with HP_EUNSUP naming key
 * and value (partial_rotary_factor != 1, hidden_act other than silu,
 * pretraining_tp > 1, quantization_config, an unknown rope type, ...).  A key
 * in none of the lists is kept in spec->unknown, which the tools print as
 * one warning line at start-up and the plan records.  Missing required keys
 * and wrongly typed values are HP_ECONFIG errors naming the file and key.
 */
#ifndef HP_HFCONFIG_H
#define HP_HFCONFIG_H

#include "base/dtype.h"
#include "base/err.h"

#define HP_MAX_LAYERS 1024
#define HP_ROPE_MAX_HALF 512    /* head_dim / 2 at most (head_dim up to 1024) */

/* The RoPE variants of transformers' modeling_rope_utils.py that hp computes. */
enum hp_rope_type {
	HP_ROPE_DEFAULT,
	HP_ROPE_LINEAR,     /* inv_freq / factor */
	HP_ROPE_DYNAMIC,    /* NTK: the unscaled table at positions < max_position_embeddings */
	HP_ROPE_YARN,       /* ramped interpolation, cos/sin times attention_factor */
	HP_ROPE_LLAMA3,     /* Llama 3.1 wavelength bands */
};

/*
 * RoPE as resolved from either format: every default filled in, yarn's
 * attention_factor computed, so two configs that mean the same RoPE give
 * the same struct.
 */
struct hp_rope_spec {
	enum hp_rope_type type;
	double theta;               /* rope_theta (default 10000) */
	double factor;              /* linear, dynamic, yarn, llama3 */
	double low_freq_factor;     /* llama3 */
	double high_freq_factor;    /* llama3 */
	int orig_max_pos;           /* llama3, yarn: original_max_position_embeddings */
	double attention_factor;    /* yarn: scales cos and sin (1 otherwise) */
	double beta_fast, beta_slow;   /* yarn (defaults 32 and 1) */
	double mscale_all_dim;      /* the key of a scaled type (0 absent): DeepSeek-V3's softmax scale reads it */
	int truncate;               /* yarn: floor/ceil the correction range (default 1) */
};

/* The experts' activation: SwiGLU, or GPT-OSS's clamped one,
 * (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit). */
enum hp_moe_act { HP_MOE_ACT_SWIGLU, HP_MOE_ACT_CLAMPED };

struct hp_model_spec {
	char model_type[32];        /* "llama", ..., "qwen3_moe", "gpt_oss", "deepseek_v3" */
	char architecture[64];      /* architectures[0], e.g. "LlamaForCausalLM" */
	int hidden;                 /* hidden_size */
	int intermediate;           /* intermediate_size */
	int n_layers;               /* num_hidden_layers */
	int n_heads;                /* num_attention_heads */
	int n_kv_heads;             /* num_key_value_heads (default n_heads) */
	int head_dim;               /* head_dim (default hidden / n_heads) */
	int vocab;                  /* vocab_size */
	int max_pos;                /* max_position_embeddings (default 2048) */
	double rms_eps;             /* rms_norm_eps (default 1e-6, as LlamaConfig) */
	struct hp_rope_spec rope;   /* rope_theta + rope_scaling, or rope_parameters */
	int tie_word_embeddings;    /* default 0, as LlamaConfig */
	int qkv_bias;               /* q/k/v biases: attention_bias, or always (qwen2) */
	int o_bias;                 /* o_proj bias: attention_bias (never for qwen2) */
	int mlp_bias;               /* refused when true */
	/* Sliding-window attention, per layer as transformers decides it
	 * (mistral: every layer; qwen2/qwen3: layer_types or max_window_layers;
	 * qwen3_moe: every layer; gpt_oss: layer_types), 0 = full attention:
	 * query i sees keys i - W < j <= i (of its document). */
	int sliding_window;         /* the window of the layers that have one, else 0 */
	unsigned char sliding[HP_MAX_LAYERS];   /* 1: layer l uses the window */
	char transformers_version[24];   /* as the folder says ("" if absent) */
	/* top-level keys in none of hfconfig.c's lists, comma-separated (the
	 * warning); kept through the plan as "hp_unknown_keys" */
	char unknown[256];
	enum hp_dtype torch_dtype;  /* the checkpoint's declared dtype (F32 if absent) */
	int bos_token_id, eos_token_id, pad_token_id;   /* -1 when absent */
	double initializer_range;   /* std of random init (default 0.02) */

	/* Qwen3: RMSNorm over head_dim on q and k, per head, before RoPE */
	int qk_norm;

	/* Qwen3-MoE (n_experts == 0: every layer dense) */
	int n_experts;              /* num_experts */
	int top_k;                  /* num_experts_per_tok */
	int moe_intermediate;       /* moe_intermediate_size */
	int decoder_sparse_step;    /* default 1 */
	int norm_topk_prob;         /* renormalize the top-k weights (default 0) */
	int output_router_logits;   /* add the load-balancing aux loss (default 0) */
	double router_aux_loss_coef;   /* default 0.001 */
	unsigned char mlp_only[HP_MAX_LAYERS];   /* 1: layer forced dense (mlp_only_layers) */

	/* GPT-OSS */
	int attn_sinks;             /* self_attn.sinks: a learned logit per head in each softmax */
	int moe_bias;               /* mlp.router.bias and the experts' biases */
	enum hp_moe_act moe_act;    /* the experts' activation */
	double swiglu_limit;        /* HP_MOE_ACT_CLAMPED: gate <= limit, |up| <= limit */
	double swiglu_alpha;        /* HP_MOE_ACT_CLAMPED: glu = gate * sigmoid(alpha * gate) */

	/* RoPE rotates rope_dim values of each head's query and key (head_dim,
	 * but for MLA its qk_rope_head_dim part); rope_interleave: as adjacent
	 * pairs (DeepSeek's rope_interleave), else HF's rotate_half halves */
	int rope_dim;
	int rope_interleave;
	double partial_rotary;      /* partial_rotary_factor as given (rope_dim = int(head_dim x it)); 0 for 1 */

	/* DeepSeek-V3: multi-head latent attention (mla).  q from q_proj, or
	 * q_a_proj -> q_a_layernorm -> q_b_proj (q_lora_rank > 0); k and v
	 * from kv_a_proj_with_mqa's latent (kv_lora_rank) through
	 * kv_a_layernorm and kv_b_proj, with one RoPE'd key part of
	 * qk_rope_head_dim shared by every head.  head_dim is then the
	 * attention kernels' head size, max(qk_nope + qk_rope, v_head): the
	 * shorter of q/k and v is zero-padded to it. */
	int mla;
	int q_lora_rank, kv_lora_rank;
	int qk_nope, qk_rope, v_head;
	double attn_mscale;         /* the softmax scale is (qk_nope + qk_rope)^-0.5 * attn_mscale */
	/* DeepSeek-V3's MoE: shared experts (a dense MLP of moe_intermediate x
	 * n_shared beside the routed ones), the sigmoid router with its
	 * e_score_correction_bias for the choice only, group-limited top-k
	 * (n_group groups, topk_group kept), weights times routed_scaling */
	int n_shared;
	int router_group;
	int n_group, topk_group;
	double routed_scaling;
	int group_mask_zero;        /* transformers 4.x: dropped groups score 0, 5.x: -inf */
	int n_mtp;                  /* num_nextn_predict_layers: checkpoint layers after the decoder's, not loaded */
	int shared_inter;           /* the shared experts' intermediate size (0: none) */

	/* Qwen3-Next and Qwen3.5: Gated DeltaNet layers (linear[l], layer_types
	 * "linear_attention") beside gated full attention.  A linear layer
	 * projects the normed input to q, k [lin_kh heads of lin_kd], v and z
	 * [lin_vh heads of lin_vd], b and a [lin_vh]: qwen3_next through
	 * in_proj_qkvz and in_proj_ba, interleaved per key head (lin_split 0),
	 * qwen3_5 through in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
	 * (lin_split 1); then the causal depthwise conv of lin_conv taps with
	 * SiLU over [q | k | v], L2-normalised q and k, the gated delta rule,
	 * the gated RMSNorm with z, out_proj. */
	unsigned char linear[HP_MAX_LAYERS];
	int n_linear;               /* layers with linear[l] set */
	int lin_kh, lin_vh, lin_kd, lin_vd, lin_conv, lin_split;
	int attn_gate;              /* q_proj gives each head [q | gate]; the output times sigmoid(gate) */
	int norm_zc;                /* zero-centred RMSNorms: x_hat * (1 + w), w zero at init */
	int shared_gate;            /* the shared expert (mlp.shared_expert) times sigmoid(shared_expert_gate) */
	/* Qwen3.5 as released: a Qwen3_5(Moe)ForConditionalGeneration folder
	 * (model_type qwen3_5, qwen3_5_moe), the language model's config in
	 * text_config and its weights under model.language_model.*, a vision
	 * tower (model.visual.*) that hp carries through export and never
	 * runs; model_type and architecture are then the text model's */
	int vl;
};

/* Whether layer l is a sparse MoE layer: not in mlp_only_layers, experts
 * configured, and (l + 1) a multiple of decoder_sparse_step, as HF decides. */
int hp_model_spec_layer_is_moe(const struct hp_model_spec *s, int l);

/* How many layers have the sliding window. */
int hp_model_spec_sliding_layers(const struct hp_model_spec *s);

/* The RoPE inverse frequencies (head_dim / 2 of them) and the factor that
 * multiplies cos and sin, computed in double from transformers' formulas. */
void hp_model_spec_rope(const struct hp_model_spec *s, double *inv_freq, double *attention_factor);

/* The model's cos/sin tables [T, head_dim/2] (kernels/cpu/ops.h, hp_rope_table). */
void hp_model_spec_rope_table(const struct hp_model_spec *s, float *cos_t, float *sin_t, int T);

/* The values RoPE rotates in each head (rope_dim, or head_dim when 0). */
int hp_model_spec_rope_dim(const struct hp_model_spec *s);

/* A Qwen3.5 multimodal folder's architecture (Qwen3_5ForConditionalGeneration,
 * Qwen3_5MoeForConditionalGeneration); NULL unless s->vl. */
const char *hp_model_spec_vl_arch(const struct hp_model_spec *s);

/* The name of a RoPE type as config.json spells it. */
const char *hp_rope_type_name(enum hp_rope_type t);

/*
 * Whether the model computes a T-token row as transformers does: 0, or
 * HP_ECONFIG when T exceeds max_position_embeddings (the RoPE table, and
 * dynamic RoPE's unscaled range, end there).  Sliding windows of any
 * length are computed (a window of at least T is full causal attention).
 */
int hp_model_spec_check_seq(const struct hp_model_spec *s, int T, struct hp_err *e);

/* The config.json a model path names: the path itself when it ends in
 * .json, else DIR/config.json; *dir_out (when not NULL) its folder. */
void hp_hfconfig_file(const char *path, char *file, size_t n, char *dir_out, size_t dn);

/* Read DIR/config.json (or the file itself if path ends in .json). */
int hp_hfconfig_load(struct hp_model_spec *s, const char *path, struct hp_err *e);

/* The same from a config.json held in memory; name is used in messages. */
int hp_hfconfig_load_buf(struct hp_model_spec *s, const char *name, const char *buf, size_t len,
			 struct hp_err *e);

/*
 * The spec as an HF config.json object (a new reference, NULL when out of
 * memory): every key hp reads, in a fixed order and in 4.x's spelling
 * (rope_theta, rope_scaling, torch_dtype), so that hp_hfconfig_load_buf()
 * of its text gives back the same spec.  Used for the plan's "model"
 * section, and for exported HF folders when the source config.json is gone.
 */
struct json_t;
struct json_t *hp_model_spec_json(const struct hp_model_spec *s);

#endif
