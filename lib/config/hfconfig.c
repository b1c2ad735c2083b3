/*
 * hfconfig.c - config.json -> struct hp_model_spec, with jansson.
 *
 * This is not a general HF config reader: it reads exactly the keys that
 * change the computation of the architectures hp implements, with the
 * defaults of each family's configuration class in transformers 4.57 and
 * 5.24 (read, not copied), checks their types, and rejects features hp
 * would otherwise get silently wrong.  The key lists below are the one
 * place that says what every key of config.json does to hp.
 */
#include <jansson.h>
#include <math.h>

#include "base/checked.h"
#include "config/hfconfig.h"
#include "cpu/ops.h"

struct ctx {
	const char *path;
	json_t *root;
	struct hp_err *e;
	const char *pre;            /* "" or the enclosing key and a dot, for messages */
};

static int get_int(struct ctx *c, const char *key, int required, int dflt, int *out)
{
	json_t *v = json_object_get(c->root, key);

	if (!v || json_is_null(v)) {
		if (required)
			return hp_err_set(c->e, HP_ECONFIG, "'%s': missing required key '%s%s'", c->path, c->pre, key);
		*out = dflt;
		return 0;
	}
	if (!json_is_integer(v))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key '%s%s': expected an integer", c->path, c->pre, key);
	if (json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key '%s%s': value %lld out of range",
				  c->path, c->pre, key, (long long)json_integer_value(v));
	*out = (int)json_integer_value(v);
	return 0;
}

/*
 * A dimension or count: an integer of at least 1 when given.  Zero or a
 * negative value is named here, by its key, rather than later by what it
 * breaks (a division by zero, "head_dim 0", "not a multiple of 0").
 */
static int get_dim(struct ctx *c, const char *key, int required, int dflt, int *out)
{
	json_t *v = json_object_get(c->root, key);

	if (json_is_integer(v) && json_integer_value(v) <= 0)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': %s%s must be positive (it is %lld)", c->path,
				  c->pre, key, (long long)json_integer_value(v));
	return get_int(c, key, required, dflt, out);
}

/* lib/base/checked.h: sizes bounded, so that no product of the model's sizes
 * overflows before the planner adds them up with checked arithmetic. */
static int at_most(struct ctx *c, const char *what, long long v, long long max)
{
	if (v > max)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': %s %lld is more than hp can size (at most %lld)", c->path,
				  what, v, max);
	return 0;
}

static int get_num(struct ctx *c, const char *key, double dflt, double *out)
{
	json_t *v = json_object_get(c->root, key);

	if (!v || json_is_null(v)) {
		*out = dflt;
		return 0;
	}
	if (!json_is_number(v))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key '%s%s': expected a number", c->path, c->pre, key);
	*out = json_number_value(v);
	return 0;
}

static int get_bool(struct ctx *c, const char *key, int dflt, int *out)
{
	json_t *v = json_object_get(c->root, key);

	if (!v || json_is_null(v)) {
		*out = dflt;
		return 0;
	}
	if (!json_is_boolean(v))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key '%s%s': expected true or false", c->path, c->pre, key);
	*out = json_is_true(v);
	return 0;
}

/* ---- the families ------------------------------------------------------- */

enum bias_rule { BIAS_KEY, BIAS_QKV, BIAS_NONE };
enum sw_rule { SW_NONE, SW_ALL, SW_FLAG_ALL, SW_LAYERS, SW_TYPES };

/*
 * What each model type's configuration and modeling code in transformers
 * decide (4.57 and 5.24 agree on all of it but deepseek_v3's masked groups):
 *   llama     biases from attention_bias (q/k/v/o), mlp_bias, pretraining_tp;
 *             no sliding window
 *   mistral   no biases; sliding_window (default 4096) on every layer when
 *             not null
 *   qwen2     q/k/v biases always, o_proj none; sliding_window only with
 *             use_sliding_window, on the layers layer_types marks (default:
 *             layer >= max_window_layers)
 *   qwen3     attention_bias (q/k/v/o); q_norm/k_norm; head_dim default 128;
 *             sliding window as qwen2
 *   qwen3_moe as qwen3 but head_dim defaults to hidden / heads (its modeling
 *             reads getattr(config, "head_dim", ...)), the window, when
 *             use_sliding_window, is on every layer; num_experts is
 *             num_local_experts in 5.x (attribute_map)
 *   gpt_oss   attention_bias (q/k/v/o, default true); a learned sink logit
 *             per head; head_dim default 64, rms_norm_eps 1e-5, rope_theta
 *             150000 and, without a rope key, yarn (factor 32, beta 32/1,
 *             truncate false, original context 4096); layer_types (default
 *             sliding on even layers) with sliding_window (default 128);
 *             every layer an MoE of num_local_experts experts of
 *             intermediate_size with biases, a router with a bias and a
 *             softmax over its top-k logits (the renormalised top-k of the
 *             full softmax: the same numbers), the clamped SwiGLU
 *             (swiglu_limit 7, swiglu_alpha 1.702; 4.57 has no
 *             swiglu_alpha key and uses 1.702)
 *   deepseek_v3 multi-head latent attention (parse_mla_dims; attention_bias
 *             on q_a_proj, kv_a_proj_with_mqa and o_proj); dense layers
 *             before first_k_dense_replace, then MoE layers with shared
 *             experts and the sigmoid group-limited router with its
 *             correction bias (parse_deepseek); n_routed_experts is
 *             num_local_experts in 5.x; the groups it drops score 0 in
 *             4.57, -inf in 5.x
 *   qwen3_next, qwen3_5_text, qwen3_5_moe_text (5.x's text configs of
 *             Qwen3.5; 4.57 has qwen3_next only)
 *             layer_types of linear_attention (Gated DeltaNet) and
 *             full_attention (default: every full_attention_interval-th,
 *             4); gated full attention (q_proj doubled, q/k norms, the
 *             output times sigmoid(gate)), head_dim default 256, partial
 *             RoPE (partial_rotary_factor, default 0.25: 4.x reads the
 *             top-level key, 5.x the rope dict's, then the top-level one);
 *             zero-centred RMSNorms; the linear_* sizes (parse_gdn);
 *             qwen3_next: MoE as qwen3_moe (norm_topk_prob default true,
 *             mlp_only_layers, decoder_sparse_step) plus a shared expert
 *             of shared_expert_intermediate_size behind a sigmoid gate;
 *             qwen3_5_moe_text: every layer MoE, top-k always
 *             renormalised, the shared expert likewise; no
 *             intermediate_size
 */
struct family {
	const char *model_type, *arch;
	enum bias_rule bias;
	int qk_norm, moe, head_dim;  /* head_dim: the class default (0: hidden / heads) */
	enum sw_rule sw;
	int max_pos, kv_heads;      /* the class defaults (kv_heads 0: = heads) */
	int bias_default, oss;      /* attention_bias's default; gpt_oss */
	double eps, theta;          /* rms_norm_eps and rope_theta defaults */
	int mla;                    /* deepseek_v3 */
	int gdn;                    /* Gated DeltaNet hybrids: 1 qwen3_next (fused projections), 2 qwen3_5 (split) */
};

static const struct family families[] = {
	{ "llama", "LlamaForCausalLM", BIAS_KEY, 0, 0, 0, SW_NONE, 2048, 0, 0, 0, 1e-6, 1e4, 0, 0 },
	{ "mistral", "MistralForCausalLM", BIAS_NONE, 0, 0, 0, SW_ALL, 4096 * 32, 8, 0, 0, 1e-6, 1e4, 0, 0 },
	{ "qwen2", "Qwen2ForCausalLM", BIAS_QKV, 0, 0, 0, SW_LAYERS, 32768, 0, 0, 0, 1e-6, 1e4, 0, 0 },
	{ "qwen3", "Qwen3ForCausalLM", BIAS_KEY, 1, 0, 128, SW_LAYERS, 32768, 0, 0, 0, 1e-6, 1e4, 0, 0 },
	{ "qwen3_moe", "Qwen3MoeForCausalLM", BIAS_KEY, 1, 1, 0, SW_FLAG_ALL, 32768, 4, 0, 0, 1e-6, 1e4, 0, 0 },
	{ "gpt_oss", "GptOssForCausalLM", BIAS_KEY, 0, 1, 64, SW_TYPES, 131072, 8, 1, 1, 1e-5, 150000, 0, 0 },
	{ "deepseek_v3", "DeepseekV3ForCausalLM", BIAS_KEY, 0, 1, 0, SW_NONE, 4096, 0, 0, 0, 1e-6, 1e4, 1, 0 },
	{ "qwen3_next", "Qwen3NextForCausalLM", BIAS_KEY, 1, 1, 256, SW_NONE, 32768, 2, 0, 0, 1e-6, 1e4, 0, 1 },
	{ "qwen3_5_text", "Qwen3_5ForCausalLM", BIAS_KEY, 1, 0, 256, SW_NONE, 32768, 4, 0, 0, 1e-6, 1e4, 0, 2 },
	{ "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", BIAS_KEY, 1, 1, 256, SW_NONE, 32768, 2, 0, 0, 1e-6, 1e4, 0, 2 },
};

static const struct family *family_of(const char *model_type)
{
	for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++)
		if (!strcmp(model_type, families[i].model_type))
			return &families[i];
	return NULL;
}

/* ---- the key lists ------------------------------------------------------ */

/* Keys that change what hp computes and that parse() reads, for every family
 * (family-specific ones are in family_keys()). */
static const char *const implemented_keys[] = {
	"architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
	"num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
	"max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
	"original_max_position_embeddings", "partial_rotary_factor", "tie_word_embeddings",
	"hidden_act", "torch_dtype", "dtype", "initializer_range", "pad_token_id",
	"attention_dropout", "quantization_config", "hp_unknown_keys",
};

/* Keys known to leave training's maths alone: bookkeeping, generation
 * defaults of old configs, and PretrainedConfig's task fields. */
static const char *const inert_keys[] = {
	"use_cache", "transformers_version", "bos_token_id", "eos_token_id", "_name_or_path",
	"output_attentions", "output_hidden_states", "return_dict", "torchscript", "use_bfloat16",
	"tf_legacy_loss", "pruned_heads", "chunk_size_feed_forward", "is_encoder_decoder",
	"is_decoder", "cross_attention_hidden_size", "add_cross_attention", "tie_encoder_decoder",
	"finetuning_task", "id2label", "label2id", "tokenizer_class", "prefix", "sep_token_id",
	"decoder_start_token_id", "task_specific_params", "problem_type", "max_length", "min_length",
	"do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
	"temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
	"no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
	"num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
	"forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
	"suppress_tokens", "begin_suppress_tokens", "auto_map", "_attn_implementation_autoset",
	"attn_implementation",
	/* written by other tools into real hub configs (SmolLM2, Qwen2.5);
	 * no transformers configuration or modeling class reads them */
	"is_llama_config", "rope_interleaved", "use_mrope",
	/* OpenAI's gpt-oss config.json, from its own format; GptOssConfig keeps
	 * them as plain attributes that nothing reads */
	"experts_per_token", "initial_context_length",
};

static int in_list(const char *const *l, size_t n, const char *k)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(l[i], k))
			return 1;
	return 0;
}

/* The keys a family's configuration class has beyond the common ones. */
static int family_key(const struct family *f, const char *k)
{
	static const char *const moe[] = {
		"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
		"decoder_sparse_step", "norm_topk_prob", "output_router_logits", "router_aux_loss_coef",
		"mlp_only_layers",
	};

	static const char *const oss[] = {
		"num_experts", "num_local_experts", "num_experts_per_tok", "output_router_logits",
		"router_aux_loss_coef", "swiglu_limit", "swiglu_alpha", "sliding_window", "layer_types",
	};

	static const char *const mla[] = {
		"n_routed_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
		"n_shared_experts", "routed_scaling_factor", "kv_lora_rank", "q_lora_rank",
		"qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "qk_head_dim", "n_group", "topk_group",
		"first_k_dense_replace", "norm_topk_prob", "rope_interleave", "output_router_logits",
		"pretraining_tp", "num_nextn_predict_layers", "num_mtp_layers",
		/* DeepSeek's own config.json, for its remote code: checked
		 * against what transformers' DeepseekV3 computes */
		"scoring_func", "topk_method", "moe_layer_freq",
		/* ... and read by that remote code only (its expert-parallel
		 * degree at inference, its sequence-wise auxiliary loss), never
		 * by transformers, which computes no auxiliary loss for it */
		"ep_size", "aux_loss_alpha", "seq_aux",
	};

	static const char *const gdn[] = {
		"linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
		"linear_num_value_heads", "layer_types", "full_attention_interval",
		/* the released checkpoints' multi-token-prediction module (mtp.*),
		 * which transformers never loads (nor hp: hp_param_not_loaded) */
		"mtp_num_hidden_layers", "mtp_use_dedicated_embeddings",
	};
	static const char *const gdn_moe[] = {
		"num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
		"output_router_logits", "router_aux_loss_coef",
	};

	if (f->bias == BIAS_KEY && !strcmp(k, "attention_bias"))
		return 1;
	if (f->gdn) {   /* num_experts only: their configs have no num_local_experts alias */
		if (!strcmp(k, "num_local_experts"))
			return 0;
		if (in_list(gdn, sizeof(gdn) / sizeof(gdn[0]), k))
			return 1;
		if (f->gdn == 1 && (in_list(moe, sizeof(moe) / sizeof(moe[0]), k) ||
				    !strcmp(k, "shared_expert_intermediate_size")))
			return 1;
		return f->moe && in_list(gdn_moe, sizeof(gdn_moe) / sizeof(gdn_moe[0]), k);
	}
	if (f->mla)
		return in_list(mla, sizeof(mla) / sizeof(mla[0]), k);
	if (f->oss)
		return in_list(oss, sizeof(oss) / sizeof(oss[0]), k);
	if (!strcmp(f->model_type, "llama") && (!strcmp(k, "mlp_bias") || !strcmp(k, "pretraining_tp")))
		return 1;
	if (f->sw != SW_NONE && !strcmp(k, "sliding_window"))
		return 1;
	if ((f->sw == SW_LAYERS || f->sw == SW_FLAG_ALL) && !strcmp(k, "use_sliding_window"))
		return 1;
	if (f->sw == SW_LAYERS && (!strcmp(k, "max_window_layers") || !strcmp(k, "layer_types")))
		return 1;
	/* Qwen3MoeConfig has no max_window_layers; hub configs carry it and
	 * its modeling never reads it */
	if (f->moe && !strcmp(k, "max_window_layers"))
		return 1;
	return f->moe && in_list(moe, sizeof(moe) / sizeof(moe[0]), k);
}

/* Key k (after prefix pre) to the comma-separated list in s->unknown. */
static void add_unknown(struct hp_model_spec *s, const char *pre, const char *k)
{
	size_t n = strlen(s->unknown);

	snprintf(s->unknown + n, sizeof(s->unknown) - n, "%s%s%s", n ? ", " : "", pre, k);
}

/* A plan's model section carries the source's unknown keys along. */
static void carried_unknown(struct ctx *c, struct hp_model_spec *s)
{
	json_t *v = json_object_get(c->root, "hp_unknown_keys");

	if (json_is_string(v) && !s->unknown[0])
		snprintf(s->unknown, sizeof(s->unknown), "%s", json_string_value(v));
}

/* A common key the family's configuration class does not have, which its
 * model never reads: Qwen3_5MoeTextConfig's intermediate_size (every layer
 * is MoE). */
static int family_lacks(const struct family *f, const char *k)
{
	return f->gdn == 2 && f->moe && !strcmp(k, "intermediate_size");
}

/* Name every top-level key in none of the lists in s->unknown. */
static void collect_unknown(struct ctx *c, const struct family *f, struct hp_model_spec *s)
{
	const char *k;
	json_t *v;

	json_object_foreach(c->root, k, v) {
		if ((in_list(implemented_keys, sizeof(implemented_keys) / sizeof(implemented_keys[0]), k) &&
		     !family_lacks(f, k)) ||
		    in_list(inert_keys, sizeof(inert_keys) / sizeof(inert_keys[0]), k) || family_key(f, k))
			continue;
		add_unknown(s, "", k);
	}
	carried_unknown(c, s);
}

/* ---- RoPE --------------------------------------------------------------- */

static const char *const rope_names[] = {
	[HP_ROPE_DEFAULT] = "default", [HP_ROPE_LINEAR] = "linear", [HP_ROPE_DYNAMIC] = "dynamic",
	[HP_ROPE_YARN] = "yarn", [HP_ROPE_LLAMA3] = "llama3",
};

const char *hp_rope_type_name(enum hp_rope_type t)
{
	return (unsigned)t < sizeof(rope_names) / sizeof(rope_names[0]) ? rope_names[t] : "?";
}

/* yarn's get_mscale */
static double yarn_mscale(double scale, double m)
{
	return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

/* A number the RoPE type needs from its dict. */
static int rope_num(struct ctx *c, const char *key, double *out)
{
	json_t *v = json_object_get(c->root, key);

	if (!v || json_is_null(v))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': rope type needs '%s%s'", c->path, c->pre, key);
	return get_num(c, key, 0, out);
}

/*
 * partial_rotary_factor: the share of each head RoPE rotates, int(head_dim
 * x factor) values (transformers' dim), into s->rope_dim.  The Gated
 * DeltaNet hybrids default it to 0.25; 4.x reads the top-level key, 5.x
 * the rope dict's first, then the top-level one (so when both are given
 * they must agree).  Other families: only 1.
 */
static int parse_partial(struct ctx *c, const struct family *f, struct hp_model_spec *s, struct ctx *sub,
			 int five)
{
	json_t *top = json_object_get(c->root, "partial_rotary_factor");
	json_t *in = sub ? json_object_get(sub->root, "partial_rotary_factor") : NULL;
	double x = f->gdn ? 0.25 : 1.0, y;
	int rc;

	if (top && !json_is_null(top) && (rc = get_num(c, "partial_rotary_factor", 1.0, &x)))
		return rc;
	if (in && !json_is_null(in)) {
		if ((rc = get_num(sub, "partial_rotary_factor", 1.0, &y)))
			return rc;
		if (top && !json_is_null(top) && y != x)
			return hp_err_set(c->e, HP_EUNSUP, "'%s': partial_rotary_factor %g and %spartial_rotary_factor "
					  "%g differ; transformers 4.x reads the first, 5.x the second", c->path, x,
					  sub->pre, y);
		if (!five && f->gdn)   /* 4.x reads the top-level key only */
			y = x;
		x = y;
	}
	if (!f->gdn) {
		if (x != 1.0)
			return hp_err_set(c->e, HP_EUNSUP, "'%s': partial_rotary_factor %g is not supported for %s "
					  "(only 1)", c->path, x, f->model_type);
		return 0;
	}
	int d = (int)(s->head_dim * x);
	if (!(x > 0 && x <= 1) || d < 2 || d % 2)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': partial_rotary_factor %g rotates %d of head_dim %d values; "
				  "expected an even count of at least 2", c->path, x, d, s->head_dim);
	s->rope_dim = d;
	s->partial_rotary = x;
	return 0;
}

/* RoPE from dict d (NULL: none) of rope_parameters (five) or rope_scaling. */
static int parse_rope_in(struct ctx *c, const struct family *f, struct hp_model_spec *s, json_t *d, int five)
{
	json_t *v, *tv;
	struct hp_rope_spec *r = &s->rope;
	struct ctx sub = *c;
	double top_theta;
	const char *k, *type = "default";
	int rc;
	static const char *const known[] = {
		"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
		"original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
		"mscale", "mscale_all_dim", "truncate", "low_freq_factor", "high_freq_factor",
	};
	/* Qwen3.5's multimodal RoPE: for text, whose three position ids are
	 * the same, every section rotates by the one position (1-D RoPE) */
	static const char *const mrope[] = { "mrope_section", "mrope_interleaved" };

	if ((rc = get_num(c, "rope_theta", f->theta, &top_theta)))
		return rc;
	memset(r, 0, sizeof(*r));
	r->theta = top_theta;
	r->attention_factor = 1.0;
	if (d) {
		sub.root = d;
		sub.pre = five ? "rope_parameters." : "rope_scaling.";
		json_object_foreach(d, k, v) {
			if (json_is_object(v))
				return hp_err_set(c->e, HP_EUNSUP, "'%s': %s%s: per-layer-type RoPE parameters "
						  "are not supported", c->path, sub.pre, k);
			if (f->gdn == 2 && in_list(mrope, 2, k))
				continue;
			if (!in_list(known, sizeof(known) / sizeof(known[0]), k))
				add_unknown(s, sub.pre, k);
		}
		v = json_object_get(d, "rope_type");
		tv = json_object_get(d, "type");
		if ((v && !json_is_string(v)) || (tv && !json_is_string(tv)))
			return hp_err_set(c->e, HP_ECONFIG, "'%s': key '%srope_type': expected a string",
					  c->path, sub.pre);
		if (v && tv && strcmp(json_string_value(v), json_string_value(tv)))
			return hp_err_set(c->e, HP_EUNSUP, "'%s': %srope_type '%s' and type '%s' differ; "
					  "transformers 4.x reads type, 5.x rope_type", c->path, sub.pre,
					  json_string_value(v), json_string_value(tv));
		if (v || tv)
			type = json_string_value(v ? v : tv);
		/* 5.x keeps rope_theta inside; 4.x reads only the top-level key */
		v = json_object_get(d, "rope_theta");
		if (v && !json_is_null(v)) {
			if ((rc = get_num(&sub, "rope_theta", 0, &r->theta)))
				return rc;
			if (json_object_get(c->root, "rope_theta") && r->theta != top_theta)
				return hp_err_set(c->e, HP_EUNSUP, "'%s': rope_theta %g and %srope_theta %g "
						  "differ; transformers 4.x reads the first, 5.x the second",
						  c->path, top_theta, sub.pre, r->theta);
		}
		if ((rc = parse_partial(c, f, s, &sub, five)))
			return rc;
	} else if ((rc = parse_partial(c, f, s, NULL, 0))) {
		return rc;
	}
	int r_type = -1;
	for (size_t i = 0; i < sizeof(rope_names) / sizeof(rope_names[0]); i++)
		if (!strcmp(type, rope_names[i]))
			r_type = (int)i;
	if (r_type < 0)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': rope type '%s' is not supported; supported: "
				  "default, linear, dynamic, yarn, llama3", c->path, type);
	r->type = (enum hp_rope_type)r_type;
	if (!(r->theta > 0))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': rope_theta must be positive", c->path);

	/* 5.x puts a top-level original_max_position_embeddings into llama3's
	 * and yarn's parameters; 4.x never reads it there, and neither line
	 * reads it for default, linear or dynamic RoPE (only longrope, refused) */
	int top_orig = 0;
	if ((rc = get_dim(c, "original_max_position_embeddings", 0, 0, &top_orig)))
		return rc;
	if (r->type == HP_ROPE_DEFAULT)
		return 0;
	if ((rc = rope_num(&sub, "factor", &r->factor)) ||
	    (rc = get_num(&sub, "mscale_all_dim", 0, &r->mscale_all_dim)))
		return rc;
	if (!(r->factor > 0))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': %sfactor must be positive", c->path, sub.pre);
	if (r->type == HP_ROPE_LINEAR || r->type == HP_ROPE_DYNAMIC)
		return 0;
	if ((rc = get_dim(&sub, "original_max_position_embeddings", 0, 0, &r->orig_max_pos)))
		return rc;
	if (top_orig && top_orig != (r->orig_max_pos ? r->orig_max_pos : s->max_pos))
		return hp_err_set(c->e, HP_EUNSUP, "'%s': original_max_position_embeddings %d and %s"
				  "original_max_position_embeddings %d differ; transformers 5.x reads the "
				  "first, 4.x the second", c->path, top_orig, sub.pre,
				  r->orig_max_pos ? r->orig_max_pos : s->max_pos);
	if (r->type == HP_ROPE_LLAMA3) {
		if (!r->orig_max_pos)   /* no max_position_embeddings fallback here */
			return hp_err_set(c->e, HP_ECONFIG, "'%s': rope type needs '%soriginal_max_position_"
					  "embeddings'", c->path, sub.pre);
		if ((rc = rope_num(&sub, "low_freq_factor", &r->low_freq_factor)) ||
		    (rc = rope_num(&sub, "high_freq_factor", &r->high_freq_factor)))
			return rc;
		if (!(r->high_freq_factor > r->low_freq_factor) || !(r->low_freq_factor > 0))
			return hp_err_set(c->e, HP_ECONFIG, "'%s': %shigh_freq_factor must exceed "
					  "low_freq_factor, both positive", c->path, sub.pre);
		return 0;
	}
	/* yarn (transformers' _compute_yarn_parameters) */
	double mscale;
	if (!r->orig_max_pos)
		r->orig_max_pos = s->max_pos;
	if ((rc = get_num(&sub, "beta_fast", 0, &r->beta_fast)) ||
	    (rc = get_num(&sub, "beta_slow", 0, &r->beta_slow)) ||
	    (rc = get_num(&sub, "mscale", 0, &mscale)) ||
	    (rc = get_bool(&sub, "truncate", 1, &r->truncate)))
		return rc;
	if (r->beta_fast == 0)      /* `get("beta_fast") or 32` */
		r->beta_fast = 32;
	if (r->beta_slow == 0)
		r->beta_slow = 1;
	v = json_object_get(d, "attention_factor");
	if (v && !json_is_null(v)) {
		if ((rc = get_num(&sub, "attention_factor", 1.0, &r->attention_factor)))
			return rc;
	} else if (mscale != 0 && r->mscale_all_dim != 0) {
		r->attention_factor = yarn_mscale(r->factor, mscale) / yarn_mscale(r->factor, r->mscale_all_dim);
	} else {
		r->attention_factor = yarn_mscale(r->factor, 1);
	}
	return 0;
}

static int parse_rope(struct ctx *c, const struct family *f, struct hp_model_spec *s)
{
	json_t *rp = json_object_get(c->root, "rope_parameters");
	json_t *rs = json_object_get(c->root, "rope_scaling");
	json_t *d = NULL;
	int rc;

	if (rp && json_is_null(rp))
		rp = NULL;
	if (rs && json_is_null(rs))
		rs = NULL;
	if (rp && rs)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': both rope_scaling and rope_parameters are set; "
				  "transformers 4.x reads only the first, 5.x prefers it: keep one", c->path);
	d = rp ? rp : rs;
	if (d && !json_is_object(d))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key '%s': expected an object", c->path,
				  rp ? "rope_parameters" : "rope_scaling");
	/* GptOssConfig without a rope key: its yarn (both lines); a null one
	 * is default RoPE to 4.57 but the yarn to 5.x */
	json_t *oss_yarn = NULL;
	if (f->oss && !d && (json_object_get(c->root, "rope_parameters") || json_object_get(c->root, "rope_scaling")))
		return hp_err_set(c->e, HP_EUNSUP, "'%s': %s is null: transformers 4.x reads that as default RoPE, "
				  "5.x as GptOssConfig's yarn (factor 32); give the rope type", c->path,
				  json_object_get(c->root, "rope_parameters") ? "rope_parameters" : "rope_scaling");
	if (f->oss && !d) {
		oss_yarn = json_pack("{s:s, s:f, s:f, s:f, s:b, s:i}", "rope_type", "yarn", "factor", 32.0,
				     "beta_fast", 32.0, "beta_slow", 1.0, "truncate", 0,
				     "original_max_position_embeddings", 4096);
		if (!oss_yarn)
			return hp_err_set(c->e, HP_ENOMEM, "out of memory");
		d = oss_yarn;
	}
	rc = parse_rope_in(c, f, s, d, rp != NULL);
	json_decref(oss_yarn);
	return rc;
}

void hp_model_spec_rope(const struct hp_model_spec *s, double *f, double *attention_factor)
{
	const struct hp_rope_spec *r = &s->rope;
	int dim = hp_model_spec_rope_dim(s), half = dim / 2;

	*attention_factor = 1.0;
	for (int i = 0; i < half; i++)
		f[i] = pow(r->theta, -(2.0 * i) / dim);
	switch (r->type) {
	case HP_ROPE_DEFAULT:
	case HP_ROPE_DYNAMIC:   /* at positions below max_position_embeddings, the default */
		break;
	case HP_ROPE_LINEAR:
		for (int i = 0; i < half; i++)
			f[i] /= r->factor;
		break;
	case HP_ROPE_LLAMA3: {
		double old = r->orig_max_pos, lo = r->low_freq_factor, hi = r->high_freq_factor;
		double lo_wl = old / lo, hi_wl = old / hi;

		for (int i = 0; i < half; i++) {
			double wl = 2 * M_PI / f[i];
			double v = wl > lo_wl ? f[i] / r->factor : f[i];
			double smooth = (old / wl - lo) / (hi - lo);

			if (!(wl < hi_wl) && !(wl > lo_wl))   /* the medium band */
				v = (1 - smooth) * v / r->factor + smooth * v;
			f[i] = v;
		}
		break;
	}
	case HP_ROPE_YARN: {
		/* find_correction_range(beta_fast, beta_slow, dim, base, orig) */
		double lo = dim * log(r->orig_max_pos / (r->beta_fast * 2 * M_PI)) / (2 * log(r->theta));
		double hi = dim * log(r->orig_max_pos / (r->beta_slow * 2 * M_PI)) / (2 * log(r->theta));

		if (r->truncate) {
			lo = floor(lo);
			hi = ceil(hi);
		}
		lo = lo > 0 ? lo : 0;
		hi = hi < dim - 1 ? hi : dim - 1;
		if (lo == hi)
			hi += 0.001;   /* as transformers: no singular ramp */
		for (int i = 0; i < half; i++) {
			double ramp = (i - lo) / (hi - lo), extra;

			ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
			extra = 1 - ramp;   /* the share of the extrapolated (unscaled) frequency */
			f[i] = f[i] / r->factor * (1 - extra) + f[i] * extra;
		}
		*attention_factor = r->attention_factor;
		break;
	}
	}
}

void hp_model_spec_rope_table(const struct hp_model_spec *s, float *cos_t, float *sin_t, int T)
{
	double f[HP_ROPE_MAX_HALF], af;

	hp_model_spec_rope(s, f, &af);
	hp_rope_table(cos_t, sin_t, T, hp_model_spec_rope_dim(s), f, af);
}

int hp_model_spec_rope_dim(const struct hp_model_spec *s)
{
	return s->rope_dim ? s->rope_dim : s->head_dim;
}

int hp_model_spec_check_seq(const struct hp_model_spec *s, int T, struct hp_err *e)
{
	if (T > s->max_pos)
		return hp_err_set(e, HP_ECONFIG, "sequence length %d exceeds the model's "
				  "max_position_embeddings %d", T, s->max_pos);
	/* a sliding window shorter than the rows: lib/model/model.c, window_lows */
	return 0;
}

/* ---- sliding windows ---------------------------------------------------- */

/*
 * layer_types: one entry a layer, full_attention or the family's other
 * kind (flags[l] = 1 for it).  1 when the key is given, 0 when it is absent
 * or null, or the negative HP_E code of a wrong one.
 */
static int layer_types(struct ctx *c, const struct hp_model_spec *s, const char *other, unsigned char *flags)
{
	json_t *v = json_object_get(c->root, "layer_types"), *x;
	size_t i;

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_array(v) || json_array_size(v) != (size_t)s->n_layers)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key 'layer_types': expected a list of %d layer types",
				  c->path, s->n_layers);
	json_array_foreach(v, i, x) {
		const char *t = json_is_string(x) ? json_string_value(x) : "";

		if (strcmp(t, other) && strcmp(t, "full_attention"))
			return hp_err_set(c->e, HP_EUNSUP, "'%s': layer_types[%zu] '%s' is not supported; supported: "
					  "full_attention, %s", c->path, i, t, other);
		flags[i] = !strcmp(t, other);
	}
	return 1;
}

static int parse_sliding(struct ctx *c, const struct family *f, struct hp_model_spec *s)
{
	json_t *v;
	int use = 1, w = 0, mwl = 28, rc;

	memset(s->sliding, 0, sizeof(s->sliding));
	s->sliding_window = 0;
	if (f->sw == SW_NONE)
		return 0;
	if (f->sw != SW_ALL && f->sw != SW_TYPES && (rc = get_bool(c, "use_sliding_window", 0, &use)))
		return rc;
	v = json_object_get(c->root, "sliding_window");
	if (use && json_is_integer(v) && json_integer_value(v) <= 0)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': sliding_window must be positive or null (it is %lld)",
				  c->path, (long long)json_integer_value(v));
	if (!v)
		w = f->sw == SW_TYPES ? 128 : 4096;   /* every class's default (gpt_oss 128) */
	else if (!json_is_null(v) && (rc = get_int(c, "sliding_window", 0, 0, &w)))
		return rc;
	if (!use)
		w = 0;
	s->sliding_window = w;
	if (f->sw == SW_ALL || f->sw == SW_FLAG_ALL) {
		for (int l = 0; w && l < s->n_layers; l++)
			s->sliding[l] = 1;
		return 0;
	}
	if (f->sw == SW_LAYERS && (rc = get_int(c, "max_window_layers", 0, 28, &mwl)))
		return rc;
	if ((rc = layer_types(c, s, "sliding_attention", s->sliding)) < 0)
		return rc;
	if (rc) {
		for (int i = 0; i < s->n_layers; i++)
			if (s->sliding[i] && !w)
				return hp_err_set(c->e, HP_EUNSUP, "'%s': layer_types[%d] is sliding_attention "
						  "but there is no window (use_sliding_window false or "
						  "sliding_window null)", c->path, i);
	} else if (f->sw == SW_TYPES) {   /* GptOssConfig: sliding on even layers */
		for (int l = 0; l < s->n_layers; l += 2)
			s->sliding[l] = 1;
		if (s->n_layers && !w)
			return hp_err_set(c->e, HP_EUNSUP, "'%s': sliding_window is null but the default "
					  "layer_types has sliding_attention layers", c->path);
	} else {
		for (int l = mwl; w && l < s->n_layers; l++)
			s->sliding[l] = 1;
	}
	if (!w)
		return 0;
	for (int l = 0; l < s->n_layers; l++)
		if (s->sliding[l])
			return 0;
	s->sliding_window = 0;   /* a window no layer uses */
	return 0;
}

/* ---- MoE ---------------------------------------------------------------- */

/*
 * How many experts and how many a token takes, under either name of the
 * first (5.x's attribute_map makes num_experts and num_local_experts one
 * key): the family's own, unless only the other (NULL: none) is given.  Zero experts
 * is no MoE block (transformers builds a router of no outputs and fails
 * in top-k), so it is refused as a dimension.
 */
static int parse_experts(struct ctx *c, struct hp_model_spec *s, const char *own, const char *other, int def_e,
			 int def_k)
{
	json_t *a = json_object_get(c->root, own), *b = other ? json_object_get(c->root, other) : NULL;
	const char *k = b && !a ? other : own;
	int rc;

	if (a && b && !json_equal(a, b))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': %s and %s differ", c->path, own, other);
	if ((rc = get_dim(c, k, 0, def_e, &s->n_experts)) ||
	    (rc = get_dim(c, "num_experts_per_tok", 0, def_k, &s->top_k)))
		return rc;
	if (s->top_k > s->n_experts)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': num_experts_per_tok %d must be between 1 and "
				  "%s %d", c->path, s->top_k, k, s->n_experts);
	if ((rc = at_most(c, k, s->n_experts, HP_MAX_EXPERTS)) ||
	    (rc = at_most(c, "num_experts_per_tok", s->top_k, HP_MAX_TOP_K)))
		return rc;
	if ((rc = get_bool(c, "output_router_logits", 0, &s->output_router_logits)))
		return rc;
	return get_num(c, "router_aux_loss_coef", 0.001, &s->router_aux_loss_coef);
}

static int parse_moe(struct ctx *c, struct hp_model_spec *s, const char *other, int def_e, int def_k, int def_im,
		     int def_norm)
{
	json_t *v;
	int rc;

	if ((rc = parse_experts(c, s, "num_experts", other, def_e, def_k)) ||
	    (rc = get_dim(c, "moe_intermediate_size", 0, def_im, &s->moe_intermediate)) ||
	    (rc = get_dim(c, "decoder_sparse_step", 0, 1, &s->decoder_sparse_step)) ||
	    (rc = get_bool(c, "norm_topk_prob", def_norm, &s->norm_topk_prob)))
		return rc;
	if ((rc = at_most(c, "moe_intermediate_size", s->moe_intermediate, HP_MAX_DIM)))
		return rc;
	v = json_object_get(c->root, "mlp_only_layers");
	if (v && !json_is_null(v)) {
		size_t i;
		json_t *x;
		if (!json_is_array(v))
			return hp_err_set(c->e, HP_ECONFIG, "'%s': key 'mlp_only_layers': expected a list of "
					  "layer indices", c->path);
		json_array_foreach(v, i, x) {
			if (!json_is_integer(x) || json_integer_value(x) < 0 ||
			    json_integer_value(x) >= HP_MAX_LAYERS)
				return hp_err_set(c->e, HP_ECONFIG, "'%s': key 'mlp_only_layers': entry %zu is "
						  "not a layer index", c->path, i);
			s->mlp_only[json_integer_value(x)] = 1;
		}
	}
	return 0;
}

/*
 * GptOssConfig's experts: num_local_experts (num_experts in 5.x's
 * attribute_map) of intermediate_size, every layer; its router and
 * experts carry biases; the clamped SwiGLU.  output_router_logits: 4.57's
 * router records its top-k scores as the "logits" and 5.24's its logits,
 * so the two lines' load-balancing losses differ; hp computes neither yet.
 */
static int parse_oss(struct ctx *c, struct hp_model_spec *s)
{
	int rc;

	if ((rc = parse_experts(c, s, "num_local_experts", "num_experts", 128, 4)) ||
	    (rc = get_num(c, "swiglu_limit", 7.0, &s->swiglu_limit)) ||
	    (rc = get_num(c, "swiglu_alpha", 1.702, &s->swiglu_alpha)))
		return rc;
	if (!(s->swiglu_limit > 0))   /* JSON has no infinity: a number is finite */
		return hp_err_set(c->e, HP_ECONFIG, "'%s': swiglu_limit must be positive", c->path);
	/* 4.57's GptOssExperts compute with 7 and 1.702 whatever the config says */
	if (!strncmp(s->transformers_version, "4.", 2) && (s->swiglu_limit != 7.0 || s->swiglu_alpha != 1.702))
		return hp_err_set(c->e, HP_EUNSUP, "'%s': swiglu_limit %g, swiglu_alpha %g in a folder of transformers "
				  "%s, whose experts compute with 7 and 1.702 whatever the config says (5.x reads "
				  "them); use 7 and 1.702, or the 5.x line's transformers_version", c->path,
				  s->swiglu_limit, s->swiglu_alpha, s->transformers_version);
	if (s->output_router_logits)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': output_router_logits true is not supported for "
				  "gpt_oss (transformers 4.x and 5.x compute different load-balancing losses "
				  "for it); set it false", c->path);
	s->moe_intermediate = s->intermediate;
	s->decoder_sparse_step = 1;
	s->norm_topk_prob = 1;   /* softmax of the top-k logits = the renormalised top-k */
	s->attn_sinks = 1;
	s->moe_bias = 1;
	s->moe_act = HP_MOE_ACT_CLAMPED;
	return 0;
}

/* A string key that must hold one value when given (DeepSeek's own keys). */
static int want_str(struct ctx *c, const char *key, const char *want)
{
	json_t *v = json_object_get(c->root, key);

	if (!v || json_is_null(v) || (json_is_string(v) && !strcmp(json_string_value(v), want)))
		return 0;
	return hp_err_set(c->e, HP_EUNSUP, "'%s': %s %s is not supported: transformers' DeepseekV3 computes "
			  "\"%s\"", c->path, key, json_is_string(v) ? json_string_value(v) : "(not a string)", want);
}

/*
 * DeepseekV3Config's attention (multi-head latent attention): its sizes,
 * and head_dim, which the class sets to qk_rope_head_dim whatever the
 * file says (so a different value there is refused, not read).  Every
 * head has its own key: num_key_value_heads must be the heads' count
 * (repeat_kv of more would not match the heads in transformers).
 */
static int parse_mla_dims(struct ctx *c, struct hp_model_spec *s)
{
	json_t *v;
	int rc, hd, interleave;

	if ((rc = get_dim(c, "kv_lora_rank", 0, 512, &s->kv_lora_rank)) ||
	    (rc = get_dim(c, "qk_rope_head_dim", 0, 64, &s->qk_rope)) ||
	    (rc = get_dim(c, "qk_nope_head_dim", 0, 128, &s->qk_nope)) ||
	    (rc = get_dim(c, "v_head_dim", 0, 128, &s->v_head)) ||
	    (rc = get_bool(c, "rope_interleave", 1, &interleave)))
		return rc;
	v = json_object_get(c->root, "q_lora_rank");
	if (!v)   /* the class default; null: a plain q_proj */
		s->q_lora_rank = 1536;
	else if (!json_is_null(v) && (rc = get_dim(c, "q_lora_rank", 0, 0, &s->q_lora_rank)))
		return rc;
	if ((rc = get_dim(c, "head_dim", 0, s->qk_rope, &hd)))
		return rc;
	if (hd != s->qk_rope)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': head_dim %d is not qk_rope_head_dim %d, which "
				  "DeepseekV3Config sets it to whatever the file says", c->path, hd, s->qk_rope);
	if ((rc = get_dim(c, "qk_head_dim", 0, s->qk_nope + s->qk_rope, &hd)))
		return rc;
	if (hd != s->qk_nope + s->qk_rope)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': qk_head_dim %d is not qk_nope_head_dim + qk_rope_head_dim "
				  "%d, which DeepseekV3Config sets it to whatever the file says", c->path, hd,
				  s->qk_nope + s->qk_rope);
	if (s->qk_rope % 2 || s->qk_rope / 2 > HP_ROPE_MAX_HALF)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': qk_rope_head_dim %d must be even and at most %d", c->path,
				  s->qk_rope, 2 * HP_ROPE_MAX_HALF);
	if (s->n_kv_heads != s->n_heads)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': num_key_value_heads %d is not num_attention_heads %d: "
				  "multi-head latent attention gives every head its key", c->path, s->n_kv_heads,
				  s->n_heads);
	if ((rc = at_most(c, "kv_lora_rank", s->kv_lora_rank, HP_MAX_DIM)) ||
	    (rc = at_most(c, "q_lora_rank", s->q_lora_rank, HP_MAX_DIM)) ||
	    (rc = at_most(c, "qk_nope_head_dim + qk_rope_head_dim", (long long)s->qk_nope + s->qk_rope, 1024)) ||
	    (rc = at_most(c, "v_head_dim", s->v_head, 1024)))
		return rc;
	s->mla = 1;
	s->rope_interleave = interleave;
	s->rope_dim = s->qk_rope;
	s->head_dim = s->qk_nope + s->qk_rope > s->v_head ? s->qk_nope + s->qk_rope : s->v_head;
	return 0;
}

/*
 * DeepseekV3Config's MoE: n_routed_experts (num_local_experts in 5.x's
 * attribute_map) of moe_intermediate_size on the layers from
 * first_k_dense_replace on, each beside n_shared_experts' worth of shared
 * MLP; the sigmoid router with group-limited top-k.  transformers computes
 * no load-balancing loss for it (output_router_logits only records the
 * logits), so true is refused rather than ignored.  The softmax scale's
 * mscale: (qk_nope + qk_rope)^-0.5, times yarn_get_mscale(factor,
 * mscale_all_dim)^2 when the RoPE is scaled and mscale_all_dim is set.
 */
static int parse_deepseek(struct ctx *c, struct hp_model_spec *s)
{
	int rc, first_k = 3, mtp = 1;
	json_t *v;

	if ((rc = parse_experts(c, s, "n_routed_experts", "num_local_experts", 256, 8)) ||
	    (rc = get_dim(c, "moe_intermediate_size", 0, 2048, &s->moe_intermediate)) ||
	    (rc = get_dim(c, "n_shared_experts", 0, 1, &s->n_shared)) ||
	    (rc = get_dim(c, "n_group", 0, 8, &s->n_group)) ||
	    (rc = get_dim(c, "topk_group", 0, 4, &s->topk_group)) ||
	    (rc = get_num(c, "routed_scaling_factor", 2.5, &s->routed_scaling)) ||
	    (rc = get_bool(c, "norm_topk_prob", 1, &s->norm_topk_prob)) ||
	    (rc = get_int(c, "first_k_dense_replace", 0, 3, &first_k)) ||
	    (rc = want_str(c, "scoring_func", "sigmoid")) || (rc = want_str(c, "topk_method", "noaux_tc")))
		return rc;
	if ((rc = at_most(c, "moe_intermediate_size x n_shared_experts",
			  (long long)s->moe_intermediate * s->n_shared, HP_MAX_DIM)))
		return rc;
	v = json_object_get(c->root, "moe_layer_freq");
	if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
		return hp_err_set(c->e, HP_EUNSUP, "'%s': moe_layer_freq must be 1: transformers' DeepseekV3 "
				  "makes every layer from first_k_dense_replace on an MoE", c->path);
	if (s->n_experts % s->n_group || s->n_experts / s->n_group < 2)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': n_routed_experts %d must split into n_group %d groups of "
				  "at least 2 experts (a group's score is its top two)", c->path, s->n_experts, s->n_group);
	if (s->topk_group > s->n_group || s->top_k > s->topk_group * (s->n_experts / s->n_group))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': num_experts_per_tok %d must come from topk_group %d of the "
				  "n_group %d groups (%d experts each)", c->path, s->top_k, s->topk_group, s->n_group,
				  s->n_experts / s->n_group);
	if (!(s->routed_scaling > 0))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': routed_scaling_factor must be positive", c->path);
	if (s->output_router_logits)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': output_router_logits true is not supported for "
				  "deepseek_v3 (transformers computes no load-balancing loss for it); set it false",
				  c->path);
	/* the multi-token-prediction layers after the decoder's: transformers
	 * loads none of them (DeepSeek's checkpoints hold one, as layer 61) */
	if ((rc = get_int(c, json_object_get(c->root, "num_nextn_predict_layers") ? "num_nextn_predict_layers" :
			  "num_mtp_layers", 0, 1, &mtp)))
		return rc;
	s->n_mtp = mtp;
	s->shared_inter = s->moe_intermediate * s->n_shared;
	for (int l = 0; l < first_k && l < HP_MAX_LAYERS; l++)
		s->mlp_only[l] = 1;
	s->decoder_sparse_step = 1;
	s->router_group = 1;
	s->group_mask_zero = !strncmp(s->transformers_version, "4.", 2);
	return 0;
}

/*
 * The Gated DeltaNet hybrids (Qwen3NextConfig, Qwen3_5TextConfig,
 * Qwen3_5MoeTextConfig): which layers are linear, the linear layers'
 * sizes, and the MoE with its gated shared expert.
 */
static int parse_gdn(struct ctx *c, const struct family *f, struct hp_model_spec *s)
{
	int rc, every = 4;

	if ((rc = get_dim(c, "linear_conv_kernel_dim", 0, 4, &s->lin_conv)) ||
	    (rc = get_dim(c, "linear_key_head_dim", 0, 128, &s->lin_kd)) ||
	    (rc = get_dim(c, "linear_value_head_dim", 0, 128, &s->lin_vd)) ||
	    (rc = get_dim(c, "linear_num_key_heads", 0, 16, &s->lin_kh)) ||
	    (rc = get_dim(c, "linear_num_value_heads", 0, 32, &s->lin_vh)) ||
	    (rc = get_dim(c, "full_attention_interval", 0, 4, &every)))
		return rc;
	if (s->lin_vh % s->lin_kh)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': linear_num_value_heads %d is not a multiple of "
				  "linear_num_key_heads %d", c->path, s->lin_vh, s->lin_kh);
	if ((rc = at_most(c, "linear_conv_kernel_dim", s->lin_conv, 1024)) ||
	    (rc = at_most(c, "linear_key_head_dim", s->lin_kd, 1024)) ||
	    (rc = at_most(c, "linear_value_head_dim", s->lin_vd, 1024)) ||
	    (rc = at_most(c, "linear_num_value_heads x linear_value_head_dim", (long long)s->lin_vh * s->lin_vd,
			  HP_MAX_DIM)) ||
	    (rc = at_most(c, "linear_num_key_heads x linear_key_head_dim", (long long)s->lin_kh * s->lin_kd,
			  HP_MAX_DIM)))
		return rc;
	memset(s->linear, 0, sizeof(s->linear));
	if ((rc = layer_types(c, s, "linear_attention", s->linear)) < 0)
		return rc;
	if (!rc) {
		for (int l = 0; l < s->n_layers; l++)
			s->linear[l] = (l + 1) % every != 0;
	}
	s->n_linear = 0;
	for (int l = 0; l < s->n_layers; l++)
		s->n_linear += s->linear[l];
	s->lin_split = f->gdn == 2;
	s->attn_gate = 1;
	s->norm_zc = 1;
	if (!f->moe)
		return 0;
	if (f->gdn == 1)
		rc = parse_moe(c, s, "num_experts", 512, 10, 512, 1);
	else if (!(rc = parse_experts(c, s, "num_experts", NULL, 256, 8)))
		rc = get_dim(c, "moe_intermediate_size", 0, 512, &s->moe_intermediate);
	if (rc || (rc = get_dim(c, "shared_expert_intermediate_size", 0, 512, &s->shared_inter)) ||
	    (rc = at_most(c, "moe_intermediate_size", s->moe_intermediate, HP_MAX_DIM)) ||
	    (rc = at_most(c, "shared_expert_intermediate_size", s->shared_inter, HP_MAX_DIM)))
		return rc;
	if (f->gdn == 2) {   /* Qwen3_5MoeTopKRouter always renormalises; every layer MoE */
		s->decoder_sparse_step = 1;
		s->norm_topk_prob = 1;
	}
	s->shared_gate = 1;
	return 0;
}

int hp_model_spec_sliding_layers(const struct hp_model_spec *s)
{
	int n = 0;

	for (int l = 0; l < s->n_layers && l < HP_MAX_LAYERS; l++)
		n += s->sliding[l];
	return n;
}

int hp_model_spec_layer_is_moe(const struct hp_model_spec *s, int l)
{
	return s->n_experts > 0 && l >= 0 && l < HP_MAX_LAYERS && !s->mlp_only[l] &&
	       (l + 1) % s->decoder_sparse_step == 0;
}

/*
 * bos_token_id, eos_token_id (an integer or a list of them) and
 * pad_token_id (an integer): absent or null is none (-1); anything else
 * must be an id of the vocabulary, every entry of a list included; a list's
 * first id is the one kept (eos: the end of a document).
 *
 * What transformers does with them: pad_token_id is nn.Embedding's
 * padding_idx, which refuses an id >= vocab_size and reads a negative one
 * from the end of the table; bos and eos are generation settings that the
 * configuration classes never check.  hp refuses all three out of range:
 * eos is the end-of-document id of online data, and an id past the
 * vocabulary names no row of the embedding, so a config holding one is
 * wrong, not merely unused (no hub config in t/t0610 has one).  A negative
 * pad_token_id, which early Llama conversions wrote as -1 for none, is
 * refused rather than read from the end: hp would zero a real token's row.
 */
static int get_token_id(struct ctx *c, const char *key, int list_ok, int vocab, int *out)
{
	json_t *v = json_object_get(c->root, key), *x;
	size_t n = json_is_array(v) ? json_array_size(v) : 1;
	char at[32] = "";

	*out = -1;
	if (!v || json_is_null(v))
		return 0;
	if (json_is_array(v) && !list_ok)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key '%s': expected an integer", c->path, key);
	for (size_t i = 0; i < n; i++) {
		x = json_is_array(v) ? json_array_get(v, i) : v;
		if (json_is_array(v))
			snprintf(at, sizeof(at), "[%zu]", i);
		if (!json_is_integer(x))
			return hp_err_set(c->e, HP_ECONFIG, "'%s': key '%s%s': expected a token id (an integer)",
					  c->path, key, at);
		if (json_integer_value(x) < 0)
			return hp_err_set(c->e, HP_ECONFIG, "'%s': %s%s %lld is negative (null means none)",
					  c->path, key, at, (long long)json_integer_value(x));
		if (json_integer_value(x) >= vocab)
			return hp_err_set(c->e, HP_ECONFIG, "'%s': %s%s %lld is not below vocab_size %d",
					  c->path, key, at, (long long)json_integer_value(x), vocab);
		if (i == 0)
			*out = (int)json_integer_value(x);
	}
	return 0;
}

/*
 * quantization_config: GPT-OSS's MXFP4 experts (quant_method "mxfp4",
 * as the released checkpoints are) are dequantized on load exactly as
 * transformers does where it has no MXFP4 kernels (on the CPU, or with
 * dequantize true), and trained unquantized: the tensors decide which
 * modules are quantized (modules_to_not_convert names those that are not,
 * which hold plain tensors).  Every other method is refused.
 */
static int parse_quant(struct ctx *c, const struct family *f, json_t *v)
{
	json_t *m = json_is_object(v) ? json_object_get(v, "quant_method") : NULL, *x;
	const char *k;

	if (!f->oss || !json_is_string(m) || strcmp(json_string_value(m), "mxfp4"))
		return hp_err_set(c->e, HP_EUNSUP, "'%s': quantization_config%s%s%s is not supported: hp trains "
				  "unquantized weights (and dequantizes gpt_oss's mxfp4 experts)", c->path,
				  json_is_string(m) ? " (quant_method " : "", json_is_string(m) ? json_string_value(m) : "",
				  json_is_string(m) ? ")" : "");
	json_object_foreach(v, k, x) {
		if (!strcmp(k, "quant_method") || !strcmp(k, "modules_to_not_convert") || !strcmp(k, "dequantize"))
			continue;
		return hp_err_set(c->e, HP_EUNSUP, "'%s': quantization_config.%s is not supported with mxfp4 "
				  "(known: quant_method, modules_to_not_convert, dequantize)", c->path, k);
	}
	return 0;
}

static int parse(struct ctx *c, struct hp_model_spec *s)
{
	const struct family *f = NULL;
	json_t *v;
	int rc = 0;
	double x;

	v = json_object_get(c->root, "model_type");
	if (!v)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': missing required key 'model_type'", c->path);
	if (!json_is_string(v))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key 'model_type': expected a string", c->path);
	if (!(f = family_of(json_string_value(v))))
		return hp_err_set(c->e, HP_EUNSUP, "'%s': model_type '%s' is not supported; supported: "
				  "llama, mistral, qwen2, qwen3, qwen3_moe, gpt_oss, deepseek_v3, qwen3_next, "
				  "qwen3_5_text, qwen3_5_moe_text, qwen3_5, qwen3_5_moe", c->path, json_string_value(v));
	snprintf(s->model_type, sizeof(s->model_type), "%s", f->model_type);

	v = json_object_get(c->root, "architectures");
	if (v && !json_is_null(v)) {
		if (!json_is_array(v) || json_array_size(v) != 1 || !json_is_string(json_array_get(v, 0)))
			return hp_err_set(c->e, HP_ECONFIG, "'%s': key 'architectures': expected a list of one "
					  "class name", c->path);
		if (strcmp(json_string_value(json_array_get(v, 0)), f->arch))
			return hp_err_set(c->e, HP_EUNSUP, "'%s': architectures ['%s'] does not match "
					  "model_type '%s' (hp trains %s)", c->path,
					  json_string_value(json_array_get(v, 0)), f->model_type, f->arch);
	}
	snprintf(s->architecture, sizeof(s->architecture), "%s", f->arch);
	v = json_object_get(c->root, "transformers_version");
	if (json_is_string(v))
		snprintf(s->transformers_version, sizeof(s->transformers_version), "%s", json_string_value(v));

	if ((rc = get_dim(c, "hidden_size", 1, 0, &s->hidden)) ||
	    (!family_lacks(f, "intermediate_size") && (rc = get_dim(c, "intermediate_size", 1, 0, &s->intermediate))) ||
	    (rc = get_dim(c, "num_hidden_layers", 1, 0, &s->n_layers)) ||
	    (rc = get_dim(c, "num_attention_heads", 1, 0, &s->n_heads)) ||
	    (rc = get_dim(c, "vocab_size", 1, 0, &s->vocab)) ||
	    (rc = get_dim(c, "num_key_value_heads", 0, f->kv_heads ? f->kv_heads : s->n_heads,
			  &s->n_kv_heads)) ||
	    (rc = get_dim(c, "max_position_embeddings", 0, f->max_pos, &s->max_pos)) ||
	    (rc = get_token_id(c, "bos_token_id", 1, s->vocab, &s->bos_token_id)) ||
	    (rc = get_token_id(c, "eos_token_id", 1, s->vocab, &s->eos_token_id)) ||
	    (rc = get_token_id(c, "pad_token_id", 0, s->vocab, &s->pad_token_id)) ||
	    (rc = get_num(c, "rms_norm_eps", f->eps, &s->rms_eps)) ||
	    (rc = get_bool(c, "tie_word_embeddings", 0, &s->tie_word_embeddings)))
		return rc;
	if (s->n_layers > HP_MAX_LAYERS)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': num_hidden_layers %d exceeds %d", c->path,
				  s->n_layers, HP_MAX_LAYERS);
	/*
	 * Without head_dim, every family but qwen3 (128) takes hidden_size //
	 * num_attention_heads, as transformers does (each attention class's
	 * getattr(config, "head_dim", hidden_size // num_attention_heads)).
	 * When the division is not exact, q_proj there has heads * head_dim
	 * outputs, not hidden_size, which trains fine as long as head_dim is
	 * even; a floor that is odd or zero breaks RoPE (it rotates pairs), and
	 * the cause to report is the division, not its odd result.
	 */
	v = json_object_get(c->root, "head_dim");
	int derived = !f->head_dim && (!v || json_is_null(v)) && !f->mla;
	if (derived && s->hidden % s->n_heads && (s->hidden < s->n_heads || (s->hidden / s->n_heads) % 2))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': hidden_size %d is not a multiple of "
				  "num_attention_heads %d (give head_dim)", c->path, s->hidden, s->n_heads);
	if (f->mla)
		rc = parse_mla_dims(c, s);
	else
		rc = get_dim(c, "head_dim", 0, f->head_dim ? f->head_dim : s->hidden / s->n_heads, &s->head_dim);
	if (rc)
		return rc;
	if (s->head_dim % 2 || s->head_dim / 2 > HP_ROPE_MAX_HALF) {
		char why[96] = "";

		if (derived)
			snprintf(why, sizeof(why), " (hidden_size %d / num_attention_heads %d)", s->hidden,
				 s->n_heads);
		return hp_err_set(c->e, HP_ECONFIG, "'%s': head_dim %d must be positive, even and at most %d%s",
				  c->path, s->head_dim, 2 * HP_ROPE_MAX_HALF, why);
	}
	if ((rc = at_most(c, "hidden_size", s->hidden, HP_MAX_DIM)) ||
	    (rc = at_most(c, "intermediate_size", s->intermediate, HP_MAX_DIM)) ||
	    (rc = at_most(c, "vocab_size", s->vocab, HP_MAX_DIM)) ||
	    (rc = at_most(c, "num_attention_heads x head_dim", (long long)s->n_heads * s->head_dim, HP_MAX_DIM)) ||
	    (rc = at_most(c, "num_key_value_heads x head_dim", (long long)s->n_kv_heads * s->head_dim, HP_MAX_DIM)))
		return rc;
	if ((rc = get_num(c, "initializer_range", 0.02, &s->initializer_range)))
		return rc;
	s->qk_norm = f->qk_norm;
	switch (f->bias) {
	case BIAS_KEY:
		if ((rc = get_bool(c, "attention_bias", f->bias_default, &s->qkv_bias)))
			return rc;
		s->o_bias = s->qkv_bias;
		break;
	case BIAS_QKV:
		s->qkv_bias = 1;
		break;
	case BIAS_NONE:
		break;
	}
	if (!strcmp(f->model_type, "llama") && (rc = get_bool(c, "mlp_bias", 0, &s->mlp_bias)))
		return rc;
	if (f->oss && (rc = parse_oss(c, s)))
		return rc;
	if (f->mla && (rc = parse_deepseek(c, s)))
		return rc;
	if (f->moe && !f->oss && !f->mla && !f->gdn && (rc = parse_moe(c, s, "num_local_experts", 128, 8, 768, 0)))
		return rc;
	if (f->gdn && (rc = parse_gdn(c, f, s)))
		return rc;
	if ((rc = parse_sliding(c, f, s)))
		return rc;
	if (s->n_heads % s->n_kv_heads)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': num_attention_heads %d is not a multiple of "
				  "num_key_value_heads %d", c->path, s->n_heads, s->n_kv_heads);
	if (!(s->rms_eps > 0))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': rms_norm_eps must be positive", c->path);
	if ((rc = parse_rope(c, f, s)))
		return rc;
	s->attn_mscale = 1.0;
	if (f->mla && s->rope.type != HP_ROPE_DEFAULT && s->rope.mscale_all_dim != 0) {
		double m = yarn_mscale(s->rope.factor, s->rope.mscale_all_dim);

		s->attn_mscale = m * m;
	}

	/* refused by value */
	v = json_object_get(c->root, "hidden_act");
	if (v && !json_is_null(v) && (!json_is_string(v) || (strcmp(json_string_value(v), "silu") &&
							       strcmp(json_string_value(v), "swish"))))
		return hp_err_set(c->e, HP_EUNSUP, "'%s': hidden_act %s is not supported (only \"silu\")",
				  c->path, json_is_string(v) ? json_string_value(v) : "(not a string)");
	if (s->mlp_bias)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': mlp_bias true is not supported yet", c->path);
	v = json_object_get(c->root, "pretraining_tp");
	if (v && json_is_integer(v) && json_integer_value(v) != 1 && !strcmp(f->model_type, "llama"))
		return hp_err_set(c->e, HP_EUNSUP, "'%s': pretraining_tp %lld is not supported (only 1)",
				  c->path, (long long)json_integer_value(v));
	if ((rc = get_num(c, "attention_dropout", 0.0, &x)))
		return rc;
	if (x != 0.0)   /* transformers drops attention weights in training mode */
		return hp_err_set(c->e, HP_EUNSUP, "'%s': attention_dropout %g is not supported (only 0)",
				  c->path, x);
	v = json_object_get(c->root, "quantization_config");
	if (v && !json_is_null(v) && (rc = parse_quant(c, f, v)))
		return rc;

	s->torch_dtype = HP_DTYPE_F32;
	v = json_object_get(c->root, "dtype");
	json_t *w = json_object_get(c->root, "torch_dtype");
	if (v && w && !json_is_null(v) && !json_is_null(w) && !json_equal(v, w))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': dtype and torch_dtype differ", c->path);
	if (!v || json_is_null(v))
		v = w;
	if (v && json_is_string(v)) {
		s->torch_dtype = hp_dtype_parse_torch(json_string_value(v));
		if (s->torch_dtype == HP_DTYPE_INVALID)
			return hp_err_set(c->e, HP_EUNSUP, "'%s': torch_dtype '%s' is not supported; "
					  "supported: float32, bfloat16, float16", c->path, json_string_value(v));
	}
	collect_unknown(c, f, s);
	return 0;
}

/*
 * Qwen3.5's releases (Qwen3_5ForConditionalGeneration,
 * Qwen3_5MoeForConditionalGeneration): the language model's config is
 * text_config, read as its own model type; vision_config and the image and
 * video token ids belong to the vision tower, which text-only batches never
 * reach (transformers computes the text model's loss on them: its
 * multimodal RoPE positions are then the text's).  tie_word_embeddings is
 * read at both levels: they must agree.
 */
static const struct vl_type {
	const char *outer, *arch, *text;
} vl_types[] = {
	{ "qwen3_5", "Qwen3_5ForConditionalGeneration", "qwen3_5_text" },
	{ "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe_text" },
};

static const struct vl_type *vl_of(const char *model_type)
{
	for (size_t i = 0; i < sizeof(vl_types) / sizeof(vl_types[0]); i++)
		if (!strcmp(model_type, vl_types[i].outer))
			return &vl_types[i];
	return NULL;
}

static int parse_vl(struct ctx *c, struct hp_model_spec *s, const struct vl_type *t)
{
	static const char *const outer_keys[] = {
		"architectures", "model_type", "text_config", "vision_config", "image_token_id", "video_token_id",
		"vision_start_token_id", "vision_end_token_id", "tie_word_embeddings", "transformers_version",
		"dtype", "torch_dtype", "use_cache", "hp_unknown_keys",
	};
	json_t *tc = json_object_get(c->root, "text_config"), *v, *x;
	struct ctx sub = *c;
	int rc, tie = 0, tie_in = 0;
	const char *k;

	v = json_object_get(c->root, "architectures");
	if (v && !json_is_null(v) && (!json_is_array(v) || json_array_size(v) != 1 ||
				      !json_is_string(json_array_get(v, 0)) ||
				      strcmp(json_string_value(json_array_get(v, 0)), t->arch)))
		return hp_err_set(c->e, HP_EUNSUP, "'%s': architectures must be ['%s'] for model_type '%s'", c->path,
				  t->arch, t->outer);
	if (!json_is_object(tc))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key 'text_config': expected an object (the language "
				  "model's config)", c->path);
	v = json_object_get(tc, "model_type");
	if (v && !(json_is_string(v) && !strcmp(json_string_value(v), t->text)))
		return hp_err_set(c->e, HP_EUNSUP, "'%s': text_config.model_type must be '%s' in a %s folder", c->path,
				  t->text, t->arch);
	if ((rc = get_bool(c, "tie_word_embeddings", 0, &tie)))
		return rc;
	sub.root = tc;
	sub.pre = "text_config.";
	if ((rc = get_bool(&sub, "tie_word_embeddings", 0, &tie_in)))
		return rc;
	if (tie != tie_in)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': tie_word_embeddings %s and text_config.tie_word_embeddings %s "
				  "differ; give them one value", c->path, tie ? "true" : "false", tie_in ? "true" : "false");
	/* the text model's config as its own file: the folder's version and dtype */
	if (!(sub.root = json_deep_copy(tc)))
		return hp_err_set(c->e, HP_ENOMEM, "out of memory");
	json_object_set_new(sub.root, "model_type", json_string(t->text));
	json_object_del(sub.root, "architectures");
	for (size_t i = 0; i < 3; i++) {
		static const char *const up[] = { "transformers_version", "dtype", "torch_dtype" };

		x = json_object_get(c->root, up[i]);
		if (x && !json_object_get(sub.root, up[i]))
			json_object_set(sub.root, up[i], x);
	}
	rc = parse(&sub, s);
	json_decref(sub.root);
	if (rc)
		return rc;
	json_object_foreach(c->root, k, v)
		if (!in_list(outer_keys, sizeof(outer_keys) / sizeof(outer_keys[0]), k))
			add_unknown(s, "", k);
	carried_unknown(c, s);
	s->vl = 1;
	return 0;
}

static int load_json(struct hp_model_spec *s, const char *name, json_t *root, struct hp_err *e)
{
	struct ctx c = { .path = name, .root = root, .e = e, .pre = "" };
	json_t *v;

	if (!json_is_object(root))
		return hp_err_set(e, HP_ECONFIG, "'%s': expected a JSON object", name);
	v = json_object_get(root, "model_type");
	if (json_is_string(v) && vl_of(json_string_value(v)))
		return parse_vl(&c, s, vl_of(json_string_value(v)));
	return parse(&c, s);
}

int hp_hfconfig_load_buf(struct hp_model_spec *s, const char *name, const char *buf, size_t len,
			 struct hp_err *e)
{
	json_error_t jerr;
	json_t *root;
	int rc;

	memset(s, 0, sizeof(*s));
	root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		return hp_err_set(e, HP_ECONFIG, "'%s' line %d: invalid JSON: %s", name, jerr.line, jerr.text);
	}
	rc = load_json(s, name, root, e);
	json_decref(root);
	return rc;
}

void hp_hfconfig_file(const char *path, char *file, size_t n, char *dir_out, size_t dn)
{
	size_t len = strlen(path);
	int named = len >= 5 && !strcmp(path + len - 5, ".json");
	const char *sl = strrchr(path, '/');

	if (named)
		snprintf(file, n, "%s", path);
	else
		snprintf(file, n, "%s/config.json", path);
	if (dir_out && named)
		snprintf(dir_out, dn, "%.*s", sl ? (int)(sl - path) : 1, sl ? path : ".");
	else if (dir_out)
		snprintf(dir_out, dn, "%s", path);
}

int hp_hfconfig_load(struct hp_model_spec *s, const char *path, struct hp_err *e)
{
	char file[4096];
	json_error_t jerr;
	json_t *root;
	int rc;

	memset(s, 0, sizeof(*s));
	hp_hfconfig_file(path, file, sizeof(file), NULL, 0);
	FILE *f = fopen(file, "r");
	if (!f)
		return hp_err_set(e, HP_EIO, "'%s': cannot open: %s", file, strerror(errno));
	root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
	fclose(f);
	if (!root) {
		return hp_err_set(e, HP_ECONFIG, "'%s' line %d: invalid JSON: %s", file, jerr.line, jerr.text);
	}
	rc = load_json(s, file, root, e);
	json_decref(root);
	return rc;
}

/* Set k to v in o (v a new reference); remember a failure in *bad. */
static void put(json_t *o, const char *k, json_t *v, int *bad)
{
	if (!v || json_object_set_new(o, k, v))
		*bad = 1;
}

static const struct vl_type *vl_of_text(const struct hp_model_spec *s)
{
	for (size_t i = 0; s->vl && i < sizeof(vl_types) / sizeof(vl_types[0]); i++)
		if (!strcmp(s->model_type, vl_types[i].text))
			return &vl_types[i];
	return NULL;
}

const char *hp_model_spec_vl_arch(const struct hp_model_spec *s)
{
	const struct vl_type *vt = vl_of_text(s);

	return vt ? vt->arch : NULL;
}

json_t *hp_model_spec_json(const struct hp_model_spec *s)
{
	if (s->vl) {   /* the text model's config in text_config */
		struct hp_model_spec t = *s;
		const struct vl_type *vt = vl_of_text(s);
		json_t *o, *in;

		t.vl = 0;
		if (!vt || !(in = hp_model_spec_json(&t)))
			return NULL;
		json_object_del(in, "architectures");
		json_object_del(in, "transformers_version");
		json_object_del(in, "hp_unknown_keys");
		o = json_pack("{s:[s], s:s, s:o, s:b}", "architectures", vt->arch, "model_type", vt->outer,
			      "text_config", in, "tie_word_embeddings", s->tie_word_embeddings);
		if (o && s->transformers_version[0])
			json_object_set_new(o, "transformers_version", json_string(s->transformers_version));
		if (o && s->unknown[0])
			json_object_set_new(o, "hp_unknown_keys", json_string(s->unknown));
		return o;
	}

	const struct hp_rope_spec *r = &s->rope;
	const struct family *f = family_of(s->model_type);
	json_t *o = f ? json_object() : NULL, *a, *rs;
	int bad = !o;

	if (bad)
		return NULL;
	put(o, "architectures", a = json_array(), &bad);
	if (a && json_array_append_new(a, json_string(s->architecture)))
		bad = 1;
	put(o, "model_type", json_string(s->model_type), &bad);
	put(o, "hidden_size", json_integer(s->hidden), &bad);
	if (!family_lacks(f, "intermediate_size"))
		put(o, "intermediate_size", json_integer(s->intermediate), &bad);
	put(o, "num_hidden_layers", json_integer(s->n_layers), &bad);
	put(o, "num_attention_heads", json_integer(s->n_heads), &bad);
	put(o, "num_key_value_heads", json_integer(s->n_kv_heads), &bad);
	put(o, "head_dim", json_integer(s->mla ? s->qk_rope : s->head_dim), &bad);
	put(o, "vocab_size", json_integer(s->vocab), &bad);
	put(o, "max_position_embeddings", json_integer(s->max_pos), &bad);
	put(o, "rms_norm_eps", json_real(s->rms_eps), &bad);
	put(o, "rope_theta", json_real(r->theta), &bad);
	if (r->type == HP_ROPE_DEFAULT && f->oss) {   /* GptOssConfig's default is yarn: say default */
		put(o, "rope_scaling", json_pack("{s:s}", "rope_type", "default"), &bad);
	} else if (r->type == HP_ROPE_DEFAULT) {
		put(o, "rope_scaling", json_null(), &bad);
	} else {
		put(o, "rope_scaling", rs = json_object(), &bad);
		if (rs) {
			put(rs, "rope_type", json_string(hp_rope_type_name(r->type)), &bad);
			put(rs, "factor", json_real(r->factor), &bad);
			if (r->mscale_all_dim != 0)
				put(rs, "mscale_all_dim", json_real(r->mscale_all_dim), &bad);
		}
		if (rs && (r->type == HP_ROPE_LLAMA3 || r->type == HP_ROPE_YARN))
			put(rs, "original_max_position_embeddings", json_integer(r->orig_max_pos), &bad);
		if (rs && r->type == HP_ROPE_LLAMA3) {
			put(rs, "low_freq_factor", json_real(r->low_freq_factor), &bad);
			put(rs, "high_freq_factor", json_real(r->high_freq_factor), &bad);
		}
		if (rs && r->type == HP_ROPE_YARN) {
			put(rs, "attention_factor", json_real(r->attention_factor), &bad);
			put(rs, "beta_fast", json_real(r->beta_fast), &bad);
			put(rs, "beta_slow", json_real(r->beta_slow), &bad);
			put(rs, "truncate", json_boolean(r->truncate), &bad);
		}
	}
	put(o, "hidden_act", json_string("silu"), &bad);
	put(o, "tie_word_embeddings", json_boolean(s->tie_word_embeddings), &bad);
	/* each family's own keys, as family_key() lists them */
	if (family_key(f, "attention_bias"))
		put(o, "attention_bias", json_boolean(s->qkv_bias), &bad);
	if (family_key(f, "mlp_bias"))
		put(o, "mlp_bias", json_boolean(s->mlp_bias), &bad);
	if (family_key(f, "sliding_window"))
		put(o, "sliding_window", s->sliding_window ? json_integer(s->sliding_window) : json_null(), &bad);
	if (family_key(f, "use_sliding_window"))
		put(o, "use_sliding_window", json_boolean(s->sliding_window > 0), &bad);
	if (family_key(f, "layer_types") && !f->gdn) {
		put(o, "layer_types", a = json_array(), &bad);
		for (int l = 0; a && l < s->n_layers; l++)
			if (json_array_append_new(a, json_string(s->sliding[l] ? "sliding_attention" : "full_attention")))
				bad = 1;
	}
	put(o, "initializer_range", json_real(s->initializer_range), &bad);
	put(o, "torch_dtype", json_string(hp_dtype_torch_name(s->torch_dtype)), &bad);
	put(o, "bos_token_id", s->bos_token_id >= 0 ? json_integer(s->bos_token_id) : json_null(), &bad);
	put(o, "eos_token_id", s->eos_token_id >= 0 ? json_integer(s->eos_token_id) : json_null(), &bad);
	put(o, "pad_token_id", s->pad_token_id >= 0 ? json_integer(s->pad_token_id) : json_null(), &bad);
	if (f->oss) {
		put(o, "num_local_experts", json_integer(s->n_experts), &bad);
		put(o, "num_experts_per_tok", json_integer(s->top_k), &bad);
		put(o, "output_router_logits", json_boolean(s->output_router_logits), &bad);
		put(o, "router_aux_loss_coef", json_real(s->router_aux_loss_coef), &bad);
		put(o, "swiglu_limit", json_real(s->swiglu_limit), &bad);
		put(o, "swiglu_alpha", json_real(s->swiglu_alpha), &bad);
	} else if (f->mla) {
		put(o, "q_lora_rank", s->q_lora_rank ? json_integer(s->q_lora_rank) : json_null(), &bad);
		put(o, "kv_lora_rank", json_integer(s->kv_lora_rank), &bad);
		put(o, "qk_nope_head_dim", json_integer(s->qk_nope), &bad);
		put(o, "qk_rope_head_dim", json_integer(s->qk_rope), &bad);
		put(o, "v_head_dim", json_integer(s->v_head), &bad);
		put(o, "rope_interleave", json_boolean(s->rope_interleave), &bad);
		put(o, "n_routed_experts", json_integer(s->n_experts), &bad);
		put(o, "num_experts_per_tok", json_integer(s->top_k), &bad);
		put(o, "moe_intermediate_size", json_integer(s->moe_intermediate), &bad);
		put(o, "n_shared_experts", json_integer(s->n_shared), &bad);
		put(o, "n_group", json_integer(s->n_group), &bad);
		put(o, "topk_group", json_integer(s->topk_group), &bad);
		put(o, "routed_scaling_factor", json_real(s->routed_scaling), &bad);
		put(o, "norm_topk_prob", json_boolean(s->norm_topk_prob), &bad);
		int k = 0;
		while (k < s->n_layers && s->mlp_only[k])
			k++;
		put(o, "first_k_dense_replace", json_integer(k), &bad);
		put(o, "num_nextn_predict_layers", json_integer(s->n_mtp), &bad);
	}
	if (f->gdn) {
		put(o, "partial_rotary_factor", json_real(s->partial_rotary), &bad);
		put(o, "linear_conv_kernel_dim", json_integer(s->lin_conv), &bad);
		put(o, "linear_key_head_dim", json_integer(s->lin_kd), &bad);
		put(o, "linear_value_head_dim", json_integer(s->lin_vd), &bad);
		put(o, "linear_num_key_heads", json_integer(s->lin_kh), &bad);
		put(o, "linear_num_value_heads", json_integer(s->lin_vh), &bad);
		put(o, "layer_types", a = json_array(), &bad);
		for (int l = 0; a && l < s->n_layers; l++)
			if (json_array_append_new(a, json_string(s->linear[l] ? "linear_attention" : "full_attention")))
				bad = 1;
	}
	if (f->moe && !f->oss && !f->mla) {   /* Qwen3_5MoeTextConfig: no sparse step, mlp_only_layers, norm key */
		int all = f->gdn != 2;

		if (f->gdn)
			put(o, "shared_expert_intermediate_size", json_integer(s->shared_inter), &bad);
		put(o, "num_experts", json_integer(s->n_experts), &bad);
		put(o, "num_experts_per_tok", json_integer(s->top_k), &bad);
		put(o, "moe_intermediate_size", json_integer(s->moe_intermediate), &bad);
		if (all) {
			put(o, "decoder_sparse_step", json_integer(s->decoder_sparse_step), &bad);
			put(o, "norm_topk_prob", json_boolean(s->norm_topk_prob), &bad);
		}
		put(o, "output_router_logits", json_boolean(s->output_router_logits), &bad);
		put(o, "router_aux_loss_coef", json_real(s->router_aux_loss_coef), &bad);
		if (all)
			put(o, "mlp_only_layers", a = json_array(), &bad);
		for (int l = 0; all && a && l < HP_MAX_LAYERS; l++)
			if (s->mlp_only[l] && json_array_append_new(a, json_integer(l)))
				bad = 1;
	}
	if (s->transformers_version[0])
		put(o, "transformers_version", json_string(s->transformers_version), &bad);
	if (s->unknown[0])
		put(o, "hp_unknown_keys", json_string(s->unknown), &bad);
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}
