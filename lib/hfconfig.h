/*
 * hfconfig.h - an HF config.json turned into a model spec.
 *
 * Only the architectures hp computes are accepted (model_type "llama" for
 * now); anything that would change the maths and that hp does not
 * implement (rope_scaling, another hidden_act, biases we do not load) is
 * refused with HP_EUNSUP rather than silently ignored.  Missing required keys
 * and wrongly typed values are HP_ECONFIG errors naming the file and key.
 */
#ifndef HP_HFCONFIG_H
#define HP_HFCONFIG_H

#include "dtype.h"
#include "err.h"

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
	int bos_token_id, eos_token_id;   /* -1 when absent */
};

/* Read DIR/config.json (or the file itself if path ends in .json). */
int hp_hfconfig_load(struct hp_model_spec *s, const char *path, struct hp_err *e);

/* Number of parameters the spec implies (tied embeddings counted once). */
long long hp_model_spec_nparams(const struct hp_model_spec *s);

#endif
