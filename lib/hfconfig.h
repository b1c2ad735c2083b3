/*
 * hfconfig.h - an HF config.json turned into a model spec.
 *
 * Only the architectures hp computes are accepted (model_type "llama",
 * "qwen3", "qwen3_moe"); anything that would change the maths and that hp does not
 * implement (rope_scaling, another hidden_act, biases we do not load) is
 * refused with HP_EUNSUP rather than silently ignored.  Missing required keys
 * and wrongly typed values are HP_ECONFIG errors naming the file and key.
 */
#ifndef HP_HFCONFIG_H
#define HP_HFCONFIG_H

#include "dtype.h"
#include "err.h"

#define HP_MAX_LAYERS 1024

struct hp_model_spec {
	char model_type[32];        /* "llama" */
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
	double rope_theta;          /* rope_theta (default 10000) */
	int tie_word_embeddings;    /* default 0, as LlamaConfig */
	int attention_bias;         /* q/k/v/o biases (default 0) */
	int mlp_bias;               /* default 0 */
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
};

/* Whether layer l is a sparse MoE layer: not in mlp_only_layers, experts
 * configured, and (l + 1) a multiple of decoder_sparse_step, as HF decides. */
int hp_model_spec_layer_is_moe(const struct hp_model_spec *s, int l);

/* Read DIR/config.json (or the file itself if path ends in .json). */
int hp_hfconfig_load(struct hp_model_spec *s, const char *path, struct hp_err *e);

/* The same from a config.json held in memory; name is used in messages. */
int hp_hfconfig_load_buf(struct hp_model_spec *s, const char *name, const char *buf, size_t len,
			 struct hp_err *e);

/*
 * The spec as an HF config.json object (a new reference, NULL when out of
 * memory): every key hp reads, in a fixed order, so that
 * hp_hfconfig_load_buf() of its text gives back the same spec.  Used for the
 * plan's "model" section and for exported HF folders.
 */
struct json_t;
struct json_t *hp_model_spec_json(const struct hp_model_spec *s);

/* Number of parameters the spec implies (tied embeddings counted once). */
long long hp_model_spec_nparams(const struct hp_model_spec *s);

#endif
