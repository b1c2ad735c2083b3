/*
 * hfconfig.c - config.json -> struct hp_model_spec, with jansson.
 *
 * This is not a general HF config reader: it reads exactly the keys that
 * change the computation of the architectures hp implements, checks their
 * types, and rejects features hp would otherwise get silently wrong.
 */
#include <jansson.h>
#include <math.h>

#include "hfconfig.h"

struct ctx {
	const char *path;
	json_t *root;
	struct hp_err *e;
};

static int get_int(struct ctx *c, const char *key, int required, int dflt, int *out)
{
	json_t *v = json_object_get(c->root, key);

	if (!v || json_is_null(v)) {
		if (required)
			return hp_err_set(c->e, HP_ECONFIG, "'%s': missing required key '%s'", c->path, key);
		*out = dflt;
		return 0;
	}
	if (!json_is_integer(v))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key '%s': expected an integer", c->path, key);
	if (json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key '%s': value %lld out of range",
				  c->path, key, (long long)json_integer_value(v));
	*out = (int)json_integer_value(v);
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
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key '%s': expected a number", c->path, key);
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
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key '%s': expected true or false", c->path, key);
	*out = json_is_true(v);
	return 0;
}

static int parse_moe(struct ctx *c, struct hp_model_spec *s)
{
	json_t *v;
	int rc;

	if ((rc = get_int(c, "num_experts", 0, 128, &s->n_experts)) ||
	    (rc = get_int(c, "num_experts_per_tok", 0, 8, &s->top_k)) ||
	    (rc = get_int(c, "moe_intermediate_size", 0, 768, &s->moe_intermediate)) ||
	    (rc = get_int(c, "decoder_sparse_step", 0, 1, &s->decoder_sparse_step)) ||
	    (rc = get_bool(c, "norm_topk_prob", 0, &s->norm_topk_prob)) ||
	    (rc = get_bool(c, "output_router_logits", 0, &s->output_router_logits)) ||
	    (rc = get_num(c, "router_aux_loss_coef", 0.001, &s->router_aux_loss_coef)))
		return rc;
	if (s->n_experts > 0 && (s->top_k < 1 || s->top_k > s->n_experts))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': num_experts_per_tok %d must be between 1 and "
				  "num_experts %d", c->path, s->top_k, s->n_experts);
	if (s->n_experts > 0 && s->moe_intermediate <= 0)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': moe_intermediate_size must be positive", c->path);
	if (s->decoder_sparse_step < 1)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': decoder_sparse_step must be at least 1", c->path);
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

int hp_model_spec_layer_is_moe(const struct hp_model_spec *s, int l)
{
	return s->n_experts > 0 && l >= 0 && l < HP_MAX_LAYERS && !s->mlp_only[l] &&
	       (l + 1) % s->decoder_sparse_step == 0;
}

static int parse(struct ctx *c, struct hp_model_spec *s)
{
	json_t *v;
	int rc = 0;

	v = json_object_get(c->root, "model_type");
	if (!v)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': missing required key 'model_type'", c->path);
	if (!json_is_string(v))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': key 'model_type': expected a string", c->path);
	if (strcmp(json_string_value(v), "llama") && strcmp(json_string_value(v), "qwen3") &&
	    strcmp(json_string_value(v), "qwen3_moe"))
		return hp_err_set(c->e, HP_EUNSUP, "'%s': model_type '%s' is not supported; supported: "
				  "llama, qwen3, qwen3_moe", c->path, json_string_value(v));
	int qwen = strncmp(json_string_value(v), "qwen3", 5) == 0;
	int moe = !strcmp(json_string_value(v), "qwen3_moe");
	snprintf(s->model_type, sizeof(s->model_type), "%s", json_string_value(v));

	v = json_object_get(c->root, "architectures");
	if (json_is_array(v) && json_array_size(v) && json_is_string(json_array_get(v, 0)))
		snprintf(s->architecture, sizeof(s->architecture), "%s",
			 json_string_value(json_array_get(v, 0)));
	else
		snprintf(s->architecture, sizeof(s->architecture), "LlamaForCausalLM");

	if ((rc = get_int(c, "hidden_size", 1, 0, &s->hidden)) ||
	    (rc = get_int(c, "intermediate_size", 1, 0, &s->intermediate)) ||
	    (rc = get_int(c, "num_hidden_layers", 1, 0, &s->n_layers)) ||
	    (rc = get_int(c, "num_attention_heads", 1, 0, &s->n_heads)) ||
	    (rc = get_int(c, "vocab_size", 1, 0, &s->vocab)) ||
	    (rc = get_int(c, "num_key_value_heads", 0, s->n_heads, &s->n_kv_heads)) ||
	    (rc = get_int(c, "max_position_embeddings", 0, 2048, &s->max_pos)) ||
	    (rc = get_int(c, "bos_token_id", 0, -1, &s->bos_token_id)) ||
	    (rc = get_int(c, "eos_token_id", 0, -1, &s->eos_token_id)) ||
	    (rc = get_int(c, "pad_token_id", 0, -1, &s->pad_token_id)) ||
	    (rc = get_num(c, "rms_norm_eps", 1e-6, &s->rms_eps)) ||
	    (rc = get_num(c, "rope_theta", 10000.0, &s->rope_theta)) ||
	    (rc = get_bool(c, "tie_word_embeddings", 0, &s->tie_word_embeddings)) ||
	    (rc = get_bool(c, "attention_bias", 0, &s->attention_bias)) ||
	    (rc = get_bool(c, "mlp_bias", 0, &s->mlp_bias)))
		return rc;
	if (s->n_layers > HP_MAX_LAYERS)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': num_hidden_layers %d exceeds %d", c->path,
				  s->n_layers, HP_MAX_LAYERS);
	if (s->hidden <= 0 || s->n_heads <= 0 || s->n_layers <= 0 || s->vocab <= 0 || s->intermediate <= 0)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': hidden_size, intermediate_size, num_hidden_layers, "
				  "num_attention_heads and vocab_size must be positive", c->path);
	/* Qwen3Config's head_dim defaults to 128, LlamaConfig's to hidden / heads */
	if ((rc = get_int(c, "head_dim", 0, qwen ? 128 : s->hidden / s->n_heads, &s->head_dim)))
		return rc;
	if ((rc = get_num(c, "initializer_range", 0.02, &s->initializer_range)))
		return rc;
	s->qk_norm = qwen;
	if (moe && (rc = parse_moe(c, s)))
		return rc;
	if (qwen) {
		int slide = 0;
		if ((rc = get_bool(c, "use_sliding_window", 0, &slide)))
			return rc;
		if (slide)
			return hp_err_set(c->e, HP_EUNSUP, "'%s': use_sliding_window is not supported", c->path);
	}
	if (s->head_dim <= 0 || s->head_dim % 2)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': head_dim %d must be positive and even", c->path, s->head_dim);
	if (s->n_kv_heads <= 0 || s->n_heads % s->n_kv_heads)
		return hp_err_set(c->e, HP_ECONFIG, "'%s': num_attention_heads %d is not a multiple of "
				  "num_key_value_heads %d", c->path, s->n_heads, s->n_kv_heads);
	if (!(s->rms_eps > 0) || !(s->rope_theta > 0))
		return hp_err_set(c->e, HP_ECONFIG, "'%s': rms_norm_eps and rope_theta must be positive", c->path);

	v = json_object_get(c->root, "hidden_act");
	if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), "silu")))
		return hp_err_set(c->e, HP_EUNSUP, "'%s': hidden_act must be \"silu\"", c->path);
	v = json_object_get(c->root, "rope_scaling");
	if (v && !json_is_null(v))
		return hp_err_set(c->e, HP_EUNSUP, "'%s': rope_scaling is not supported yet (only plain RoPE)", c->path);
	if (s->mlp_bias)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': mlp_bias is not supported yet", c->path);
	v = json_object_get(c->root, "pretraining_tp");
	if (v && json_is_integer(v) && json_integer_value(v) != 1)
		return hp_err_set(c->e, HP_EUNSUP, "'%s': pretraining_tp %lld is not supported (only 1)",
				  c->path, (long long)json_integer_value(v));
	s->torch_dtype = HP_DTYPE_F32;
	v = json_object_get(c->root, "torch_dtype");
	if (!v)
		v = json_object_get(c->root, "dtype");
	if (v && json_is_string(v)) {
		s->torch_dtype = hp_dtype_parse_torch(json_string_value(v));
		if (s->torch_dtype == HP_DTYPE_INVALID)
			return hp_err_set(c->e, HP_EUNSUP, "'%s': torch_dtype '%s' is not supported; "
					  "supported: float32, bfloat16, float16", c->path, json_string_value(v));
	}
	return 0;
}

static int load_json(struct hp_model_spec *s, const char *name, json_t *root, struct hp_err *e)
{
	struct ctx c = { .path = name, .root = root, .e = e };

	if (!json_is_object(root))
		return hp_err_set(e, HP_ECONFIG, "'%s': expected a JSON object", name);
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

int hp_hfconfig_load(struct hp_model_spec *s, const char *path, struct hp_err *e)
{
	char file[4096];
	json_error_t jerr;
	json_t *root;
	size_t n = strlen(path);
	int rc;

	memset(s, 0, sizeof(*s));
	if (n >= 5 && !strcmp(path + n - 5, ".json"))
		snprintf(file, sizeof(file), "%s", path);
	else
		snprintf(file, sizeof(file), "%s/config.json", path);
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

json_t *hp_model_spec_json(const struct hp_model_spec *s)
{
	json_t *o = json_object(), *a;
	int bad = !o;

	if (bad)
		return NULL;
	put(o, "architectures", a = json_array(), &bad);
	if (a && json_array_append_new(a, json_string(s->architecture)))
		bad = 1;
	put(o, "model_type", json_string(s->model_type), &bad);
	put(o, "hidden_size", json_integer(s->hidden), &bad);
	put(o, "intermediate_size", json_integer(s->intermediate), &bad);
	put(o, "num_hidden_layers", json_integer(s->n_layers), &bad);
	put(o, "num_attention_heads", json_integer(s->n_heads), &bad);
	put(o, "num_key_value_heads", json_integer(s->n_kv_heads), &bad);
	put(o, "head_dim", json_integer(s->head_dim), &bad);
	put(o, "vocab_size", json_integer(s->vocab), &bad);
	put(o, "max_position_embeddings", json_integer(s->max_pos), &bad);
	put(o, "rms_norm_eps", json_real(s->rms_eps), &bad);
	put(o, "rope_theta", json_real(s->rope_theta), &bad);
	put(o, "hidden_act", json_string("silu"), &bad);
	put(o, "tie_word_embeddings", json_boolean(s->tie_word_embeddings), &bad);
	put(o, "attention_bias", json_boolean(s->attention_bias), &bad);
	put(o, "mlp_bias", json_boolean(s->mlp_bias), &bad);
	put(o, "initializer_range", json_real(s->initializer_range), &bad);
	put(o, "torch_dtype", json_string(s->torch_dtype == HP_DTYPE_BF16 ? "bfloat16" :
					  s->torch_dtype == HP_DTYPE_F16 ? "float16" : "float32"), &bad);
	put(o, "bos_token_id", s->bos_token_id >= 0 ? json_integer(s->bos_token_id) : json_null(), &bad);
	put(o, "eos_token_id", s->eos_token_id >= 0 ? json_integer(s->eos_token_id) : json_null(), &bad);
	put(o, "pad_token_id", s->pad_token_id >= 0 ? json_integer(s->pad_token_id) : json_null(), &bad);
	if (!strcmp(s->model_type, "qwen3_moe")) {
		put(o, "num_experts", json_integer(s->n_experts), &bad);
		put(o, "num_experts_per_tok", json_integer(s->top_k), &bad);
		put(o, "moe_intermediate_size", json_integer(s->moe_intermediate), &bad);
		put(o, "decoder_sparse_step", json_integer(s->decoder_sparse_step), &bad);
		put(o, "norm_topk_prob", json_boolean(s->norm_topk_prob), &bad);
		put(o, "output_router_logits", json_boolean(s->output_router_logits), &bad);
		put(o, "router_aux_loss_coef", json_real(s->router_aux_loss_coef), &bad);
		put(o, "mlp_only_layers", a = json_array(), &bad);
		for (int l = 0; a && l < HP_MAX_LAYERS; l++)
			if (s->mlp_only[l] && json_array_append_new(a, json_integer(l)))
				bad = 1;
	}
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

long long hp_model_spec_nparams(const struct hp_model_spec *s)
{
	long long C = s->hidden, I = s->intermediate, hd = s->head_dim;
	long long QD = s->n_heads * hd, KD = s->n_kv_heads * hd;
	long long attn = C * QD * 2 + 2 * C * KD + (s->qk_norm ? 2 * hd : 0) +
			 (s->attention_bias ? QD + 2 * KD + C : 0);
	long long n = (long long)s->vocab * C + C;

	for (int l = 0; l < s->n_layers; l++) {
		n += 2 * C + attn;
		if (hp_model_spec_layer_is_moe(s, l))
			n += (long long)s->n_experts * C + (long long)s->n_experts * 3 * C * s->moe_intermediate;
		else
			n += 3 * C * I;
	}
	if (!s->tie_word_embeddings)
		n += (long long)s->vocab * C;
	return n;
}
