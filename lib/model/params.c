/*
 * params.c - the canonical parameter list of a model spec (see params.h).
 */
#include "base/checked.h"
#include "format/safetensors.h"
#include "model/params.h"

struct walk {
	hp_param_fn fn;
	void *ctx;
	char name[128];
};

static int emit(struct walk *w, enum hp_param_field f, enum hp_param_role r, int layer, int expert,
		int ndim, int64_t a, int64_t b)
{
	struct hp_param_desc d = {
		.name = w->name, .ndim = ndim, .shape = { a, ndim > 1 ? b : 1 }, .role = r,
		.field = f, .layer = layer, .expert = expert,
	};
	return w->fn(w->ctx, &d);
}

/* The decoder's names start here: model., or a Qwen3.5 multimodal folder's
 * model.language_model. (hp_model_spec.vl) */
static const char *mpre(const struct hp_model_spec *s)
{
	return s->vl ? "model.language_model." : "model.";
}

/* The length of that start in name (0: neither) */
static size_t mpre_len(const char *name)
{
	if (!strncmp(name, "model.language_model.", 21))
		return 21;
	return strncmp(name, "model.", 6) ? 0 : 6;
}

int hp_param_is_embed(const char *name)
{
	size_t n = mpre_len(name);

	return n && !strcmp(name + n, "embed_tokens.weight");
}

int hp_param_uncopied(const char *name, int tied)
{
	return !tied && hp_param_is_embed(name);
}

int hp_param_ends(const char *name, const char *suffix)
{
	size_t n = strlen(name), k = strlen(suffix);

	return n > k && !strcmp(name + n - k, suffix);
}

int hp_param_frozen(const char *name)
{
	return hp_param_ends(name, ".e_score_correction_bias");
}

int hp_param_tp_partial(const char *name)
{
	static const char *const sfx[] = {
		".q_norm.weight", ".k_norm.weight", ".q_a_proj.weight", ".q_a_proj.bias", ".q_a_layernorm.weight",
		".kv_a_proj_with_mqa.weight", ".kv_a_proj_with_mqa.bias", ".kv_a_layernorm.weight",
	};

	for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++)
		if (hp_param_ends(name, sfx[i]))
			return 1;
	/* a Gated DeltaNet layer: whole on every tp rank, each its heads' share */
	return strstr(name, ".linear_attn.") != NULL;
}

int hp_param_gemm_only(const char *name, int ndim)
{
	/* a Gated DeltaNet layer's conv (a depthwise kernel, [C, K]) and, under
	 * tp, its out_proj (this rank's columns copied out) are read in fp32 */
	return ndim == 2 && !hp_param_is_embed(name) && !hp_param_ends(name, ".linear_attn.conv1d.weight") &&
	       !hp_param_ends(name, ".linear_attn.out_proj.weight");
}

int hp_param_stacked(const struct hp_model_spec *s, const char *name, struct hp_stacked_view *v)
{
	static const char *const parts[3] = { "gate", "up", "down" };
	int l, x, n = 0, part, up, down;
	char proj[8], kind[8];
	int64_t E = s->n_experts, C = s->hidden, Im = s->moe_intermediate;

	size_t p0 = mpre_len(name);

	if (!p0 || sscanf(name + p0, "layers.%d.mlp.experts.%d.%4[a-z]_proj.%6[a-z]%n", &l, &x, proj, kind, &n) != 4 ||
	    name[p0 + n] || (strcmp(kind, "weight") && strcmp(kind, "bias")) || l < 0 || l >= s->n_layers ||
	    x < 0 || x >= E)
		return 0;
	for (part = 0; part < 3 && strcmp(proj, parts[part]); part++)
		;
	if (part == 3)
		return 0;
	up = part == 1;
	down = part == 2;
	memset(v, 0, sizeof(*v));
	v->expert = x;
	v->part = part;
	if (!strcmp(kind, "bias")) {
		if (!s->moe_bias)
			return 0;
		snprintf(v->name, sizeof(v->name), "%slayers.%d.mlp.experts.%s", mpre(s), l,
			 down ? "down_proj_bias" : "gate_up_proj_bias");
		v->ndim = 2;
		v->shape[0] = E;
		v->shape[1] = down ? C : 2 * Im;
		v->base = x * v->shape[1] + up;
		v->rs = down ? 1 : 2;
		return 1;
	}
	snprintf(v->name, sizeof(v->name), "%slayers.%d.mlp.experts.%s", mpre(s), l, down ? "down_proj" : "gate_up_proj");
	v->ndim = 3;
	v->shape[0] = E;
	if (s->moe_bias) {   /* GPT-OSS: [E, C, 2*Im] interleaved, [E, Im, C]: both transposed */
		v->shape[1] = down ? Im : C;
		v->shape[2] = down ? C : 2 * Im;
		v->base = down ? x * Im * C : x * C * 2 * Im + up;
		v->rs = down ? 1 : 2;
		v->cs = down ? C : 2 * Im;
		v->mx_R = down ? C : 2 * Im;
		v->mx_K = down ? Im : C;
		v->mx_row0 = x * v->mx_R + up;
		v->mx_rstep = down ? 1 : 2;
	} else {             /* [E, 2*Im, C] gate rows then up rows, [E, C, Im] */
		v->shape[1] = down ? C : 2 * Im;
		v->shape[2] = down ? Im : C;
		v->base = down ? x * C * Im : x * 2 * Im * C + up * Im * C;
		v->rs = down ? Im : C;
		v->cs = 1;
	}
	return 1;
}

int hp_stacked_find(const struct hp_st_model *st, const struct hp_stacked_view *v, int E, const char *dir,
		    const struct hp_st_tensor **t, const struct hp_st_tensor **scales, struct hp_err *e)
{
	const struct hp_st_tensor *b, *sc;
	char bn[160], sn[160];
	int64_t G = v->mx_K / 32;

	*scales = NULL;
	if ((*t = hp_st_model_find(st, v->name))) {
		int same = (*t)->ndim == v->ndim;

		for (int d = 0; same && d < v->ndim; d++)
			same = (*t)->shape[d] == v->shape[d];
		if (!same)
			return hp_err_set(e, HP_EFORMAT, "'%s': tensor '%s' has the wrong shape for %d experts of this "
					  "config.json: expected [%lld, %lld%s%lld]", dir, v->name, E,
					  (long long)v->shape[0], (long long)v->shape[1], v->ndim > 2 ? ", " : "",
					  v->ndim > 2 ? (long long)v->shape[2] : 0LL);
		return 0;
	}
	snprintf(bn, sizeof(bn), "%s_blocks", v->name);
	snprintf(sn, sizeof(sn), "%s_scales", v->name);
	if (!v->mx_R || !(b = hp_st_model_find(st, bn)) || !(sc = hp_st_model_find(st, sn)))
		return 1;
	if (v->mx_K % 32)   /* a block is 32 values of a row */
		return hp_err_set(e, HP_EFORMAT, "'%s': MXFP4 tensor '%s' encodes rows of %lld values, not a "
				  "multiple of 32", dir, bn, (long long)v->mx_K);
	if (b->dtype != HP_DTYPE_U8 || sc->dtype != HP_DTYPE_U8 || b->ndim != 4 || sc->ndim != 3 ||
	    b->shape[0] != E || b->shape[1] != v->mx_R || b->shape[2] != G || b->shape[3] != 16 ||
	    sc->shape[0] != E || sc->shape[1] != v->mx_R || sc->shape[2] != G)
		return hp_err_set(e, HP_EFORMAT, "'%s': MXFP4 tensors '%s' and '%s' are not U8 [%d, %lld, %lld, 16] "
				  "and [%d, %lld, %lld]", dir, bn, sn, E, (long long)v->mx_R, (long long)G, E,
				  (long long)v->mx_R, (long long)G);
	*t = b;
	*scales = sc;
	return 0;
}

size_t hp_mxfp4_buf_bytes(const struct hp_stacked_view *v)
{
	/* a row's blocks and scales (17 bytes a group), then its values */
	return ((size_t)v->mx_K / 32 * 17 + 15) / 16 * 16 + (size_t)v->mx_K * sizeof(float);
}

int hp_mxfp4_rows(const struct hp_stacked_view *v, const struct hp_st_tensor *blocks,
		  const struct hp_st_tensor *scales, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *dst,
		  void *buf, struct hp_err *e)
{
	int64_t G = v->mx_K / 32;
	uint8_t *raw = buf;
	float *row = (float *)(raw + ((size_t)G * 17 + 15) / 16 * 16);
	int rc = 0;

	for (int64_t r = 0; r < nr && !rc; r++) {
		int64_t j = v->mx_row0 + (r0 + r) * v->mx_rstep;

		if (!(rc = hp_st_pread(blocks, (uint64_t)(j * G * 16), raw, (size_t)G * 16, e)) &&
		    !(rc = hp_st_pread(scales, (uint64_t)(j * G), raw + G * 16, (size_t)G, e))) {
			hp_mxfp4_decode(row, raw, raw + G * 16, (size_t)v->mx_K);
			memcpy(dst + r * nc, row + c0, (size_t)nc * sizeof(float));
		}
	}
	return rc;
}

int hp_param_not_loaded(const struct hp_model_spec *s, const char *name)
{
	int l, n = 0;

	/* Qwen3-Next's and Qwen3.5's multi-token-prediction module, mtp.*:
	 * transformers skips it (_keys_to_ignore_on_load_unexpected) */
	if (s->attn_gate && !strncmp(name, "mtp.", 4))
		return 1;
	/* a multimodal folder's vision tower: carried through export, not loaded */
	if (s->vl && !strncmp(name, "model.visual.", 13))
		return 1;
	return s->n_mtp > 0 && sscanf(name, "model.layers.%d.%n", &l, &n) == 1 && n && l >= s->n_layers &&
	       l < s->n_layers + s->n_mtp;
}

int hp_param_hf_shape(const char *name, int ndim, const int64_t shape[2], int64_t out[3])
{
	if (ndim == 2 && hp_param_ends(name, ".linear_attn.conv1d.weight")) {
		out[0] = shape[0];   /* nn.Conv1d(C, C, K, groups=C): [C, 1, K] */
		out[1] = 1;
		out[2] = shape[1];
		return 3;
	}
	out[0] = shape[0];
	out[1] = shape[1];
	return ndim;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
	size_t used = (size_t)snprintf(buf, n, "[");

	for (int d = 0; d < ndim && used < n; d++)
		used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
	if (used < n)
		snprintf(buf + used, n - used, "]");
}

int hp_param_hf_check_shape(const struct hp_st_tensor *t, const char *name, int ndim, const int64_t shape[2],
			    const char *dir, const char *who, struct hp_err *e)
{
	int64_t want[3];
	int nd = hp_param_hf_shape(name, ndim, shape, want), same = t->ndim == nd;
	char ws[96], gs[96];

	for (int d = 0; same && d < nd; d++)
		same = t->shape[d] == want[d];
	if (same)
		return 0;
	shape_str(ws, sizeof(ws), nd, want);
	shape_str(gs, sizeof(gs), t->ndim, t->shape);
	return hp_err_set(e, HP_EFORMAT, "'%s': tensor '%s' has shape %s, %s %s", dir, name, gs, who, ws);
}

int hp_param_is_stacked(const struct hp_model_spec *s, const char *name)
{
	static const char *const suffix[] = { "gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias",
					       "gate_up_proj_blocks", "down_proj_blocks", "gate_up_proj_scales",
					       "down_proj_scales" };
	int l, n = 0;

	size_t p0 = mpre_len(name);

	if (!s->n_experts || !p0 || sscanf(name + p0, "layers.%d.mlp.experts.%n", &l, &n) != 1 || !n)
		return 0;
	for (int i = 0; i < (s->moe_bias ? 8 : 2); i++)
		if (!strcmp(name + p0 + n, suffix[i]))
			return 1;
	return 0;
}

int hp_model_spec_params(const struct hp_model_spec *s, hp_param_fn fn, void *ctx)
{
	struct walk w = { .fn = fn, .ctx = ctx };
	int64_t C = s->hidden, I = s->intermediate, D = s->head_dim, E = s->n_experts, Im = s->moe_intermediate;
	int64_t QD = s->n_heads * D, KD = s->n_kv_heads * D;
	int rc;

#define TOP(f, role, str, nd, a, b) do { \
	snprintf(w.name, sizeof(w.name), "%s", str); \
	if ((rc = emit(&w, f, role, -1, -1, nd, a, b))) return rc; } while (0)
#define LAYER(f, role, suffix, nd, a, b) do { \
	snprintf(w.name, sizeof(w.name), "%slayers.%d.%s", mpre(s), l, suffix); \
	if ((rc = emit(&w, f, role, l, -1, nd, a, b))) return rc; } while (0)

	snprintf(w.name, sizeof(w.name), "%sembed_tokens.weight", mpre(s));
	if ((rc = emit(&w, HP_PF_EMBED, HP_ROLE_COLUMN, -1, -1, 2, s->vocab, C)))
		return rc;
	for (int l = 0; l < s->n_layers; l++) {
		LAYER(HP_PF_IN_NORM, HP_ROLE_REPLICATE, "input_layernorm.weight", 1, C, 1);
		if (s->mla) {
			/* multi-head latent attention: the latent projections and
			 * their norms on every tp rank, the heads' split */
			int64_t H = s->n_heads, qk = s->qk_nope + s->qk_rope, R = s->q_lora_rank;
			int64_t L = s->kv_lora_rank;

			if (R) {
				LAYER(HP_PF_Q_A, HP_ROLE_REPLICATE, "self_attn.q_a_proj.weight", 2, R, C);
				if (s->qkv_bias)
					LAYER(HP_PF_Q_A_B, HP_ROLE_REPLICATE, "self_attn.q_a_proj.bias", 1, R, 1);
				LAYER(HP_PF_Q_A_NORM, HP_ROLE_REPLICATE, "self_attn.q_a_layernorm.weight", 1, R, 1);
				LAYER(HP_PF_WQ, HP_ROLE_COLUMN, "self_attn.q_b_proj.weight", 2, H * qk, R);
			} else {
				LAYER(HP_PF_WQ, HP_ROLE_COLUMN, "self_attn.q_proj.weight", 2, H * qk, C);
			}
			LAYER(HP_PF_KV_A, HP_ROLE_REPLICATE, "self_attn.kv_a_proj_with_mqa.weight", 2, L + s->qk_rope, C);
			if (s->qkv_bias)
				LAYER(HP_PF_KV_A_B, HP_ROLE_REPLICATE, "self_attn.kv_a_proj_with_mqa.bias", 1, L + s->qk_rope, 1);
			LAYER(HP_PF_KV_A_NORM, HP_ROLE_REPLICATE, "self_attn.kv_a_layernorm.weight", 1, L, 1);
			LAYER(HP_PF_KV_B, HP_ROLE_COLUMN, "self_attn.kv_b_proj.weight", 2, H * (s->qk_nope + s->v_head), L);
			LAYER(HP_PF_WO, HP_ROLE_ROW, "self_attn.o_proj.weight", 2, C, H * s->v_head);
			if (s->o_bias)
				LAYER(HP_PF_BO, HP_ROLE_REPLICATE, "self_attn.o_proj.bias", 1, C, 1);
			goto mlp;
		}
		if (s->linear[l]) {
			/* Gated DeltaNet: whole on every tp rank, each computing its
			 * key heads' share (hp_param_tp_partial) */
			int64_t Kd = (int64_t)s->lin_kh * s->lin_kd, Vd = (int64_t)s->lin_vh * s->lin_vd, Hv = s->lin_vh;

			if (s->lin_split) {
				LAYER(HP_PF_LIN_QKV, HP_ROLE_REPLICATE, "linear_attn.in_proj_qkv.weight", 2, 2 * Kd + Vd, C);
				LAYER(HP_PF_LIN_Z, HP_ROLE_REPLICATE, "linear_attn.in_proj_z.weight", 2, Vd, C);
				LAYER(HP_PF_LIN_B, HP_ROLE_REPLICATE, "linear_attn.in_proj_b.weight", 2, Hv, C);
				LAYER(HP_PF_LIN_A, HP_ROLE_REPLICATE, "linear_attn.in_proj_a.weight", 2, Hv, C);
			} else {
				LAYER(HP_PF_LIN_QKVZ, HP_ROLE_REPLICATE, "linear_attn.in_proj_qkvz.weight", 2, 2 * Kd + 2 * Vd, C);
				LAYER(HP_PF_LIN_BA, HP_ROLE_REPLICATE, "linear_attn.in_proj_ba.weight", 2, 2 * Hv, C);
			}
			LAYER(HP_PF_LIN_CONV, HP_ROLE_REPLICATE, "linear_attn.conv1d.weight", 2, 2 * Kd + Vd, s->lin_conv);
			LAYER(HP_PF_LIN_DT, HP_ROLE_REPLICATE, "linear_attn.dt_bias", 1, Hv, 1);
			LAYER(HP_PF_LIN_ALOG, HP_ROLE_REPLICATE, "linear_attn.A_log", 1, Hv, 1);
			LAYER(HP_PF_LIN_NORM, HP_ROLE_REPLICATE, "linear_attn.norm.weight", 1, s->lin_vd, 1);
			LAYER(HP_PF_LIN_OUT, HP_ROLE_REPLICATE, "linear_attn.out_proj.weight", 2, C, Vd);
			goto mlp;
		}
		/* gated attention: each head's [q | gate] */
		LAYER(HP_PF_WQ, HP_ROLE_COLUMN, "self_attn.q_proj.weight", 2, s->attn_gate ? 2 * QD : QD, C);
		if (s->qkv_bias)
			LAYER(HP_PF_BQ, HP_ROLE_COLUMN, "self_attn.q_proj.bias", 1, s->attn_gate ? 2 * QD : QD, 1);
		LAYER(HP_PF_WK, HP_ROLE_COLUMN, "self_attn.k_proj.weight", 2, KD, C);
		if (s->qkv_bias)
			LAYER(HP_PF_BK, HP_ROLE_COLUMN, "self_attn.k_proj.bias", 1, KD, 1);
		LAYER(HP_PF_WV, HP_ROLE_COLUMN, "self_attn.v_proj.weight", 2, KD, C);
		if (s->qkv_bias)
			LAYER(HP_PF_BV, HP_ROLE_COLUMN, "self_attn.v_proj.bias", 1, KD, 1);
		LAYER(HP_PF_WO, HP_ROLE_ROW, "self_attn.o_proj.weight", 2, C, QD);
		if (s->o_bias)
			LAYER(HP_PF_BO, HP_ROLE_REPLICATE, "self_attn.o_proj.bias", 1, C, 1);
		if (s->attn_sinks)
			LAYER(HP_PF_SINKS, HP_ROLE_COLUMN, "self_attn.sinks", 1, s->n_heads, 1);
		if (s->qk_norm) {
			LAYER(HP_PF_Q_NORM, HP_ROLE_REPLICATE, "self_attn.q_norm.weight", 1, D, 1);
			LAYER(HP_PF_K_NORM, HP_ROLE_REPLICATE, "self_attn.k_norm.weight", 1, D, 1);
		}
mlp:
		LAYER(HP_PF_POST_NORM, HP_ROLE_REPLICATE, "post_attention_layernorm.weight", 1, C, 1);
		if (hp_model_spec_layer_is_moe(s, l)) {
			static const char *const proj[3] = { "gate_proj", "up_proj", "down_proj" };
			static const enum hp_param_field pf[3] = { HP_PF_EX_GATE, HP_PF_EX_UP, HP_PF_EX_DOWN };

			static const enum hp_param_field pb[3] = { HP_PF_EX_GATE_B, HP_PF_EX_UP_B, HP_PF_EX_DOWN_B };

			if (s->moe_bias) {
				LAYER(HP_PF_ROUTER, HP_ROLE_REPLICATE, "mlp.router.weight", 2, E, C);
				LAYER(HP_PF_ROUTER_B, HP_ROLE_REPLICATE, "mlp.router.bias", 1, E, 1);
			} else {
				LAYER(HP_PF_ROUTER, HP_ROLE_REPLICATE, "mlp.gate.weight", 2, E, C);
			}
			if (s->router_group)   /* a buffer: hp_param_frozen */
				LAYER(HP_PF_ROUTER_CORR, HP_ROLE_REPLICATE, "mlp.gate.e_score_correction_bias", 1, E, 1);
			for (int x = 0; x < E; x++) {
				for (int k = 0; k < 3; k++) {
					snprintf(w.name, sizeof(w.name), "%slayers.%d.mlp.experts.%d.%s.weight",
						 mpre(s), l, x, proj[k]);
					if ((rc = emit(&w, pf[k], HP_ROLE_EXPERT, l, x, 2, k < 2 ? Im : C, k < 2 ? C : Im)))
						return rc;
				}
				for (int k = 0; s->moe_bias && k < 3; k++) {
					snprintf(w.name, sizeof(w.name), "%slayers.%d.mlp.experts.%d.%s.bias",
						 mpre(s), l, x, proj[k]);
					if ((rc = emit(&w, pb[k], HP_ROLE_EXPERT, l, x, 1, k < 2 ? Im : C, 1)))
						return rc;
				}
			}
			if (s->shared_inter) {   /* one MLP beside the routed: DeepSeek's shared_experts,
						    Qwen3-Next's shared_expert and its gate */
				static const enum hp_param_field sf[3] = { HP_PF_SH_GATE, HP_PF_SH_UP, HP_PF_SH_DOWN };
				int64_t Is = s->shared_inter;
				char sx[48];

				for (int k = 0; k < 3; k++) {
					snprintf(sx, sizeof(sx), "mlp.shared_expert%s.%s.weight", s->shared_gate ? "" : "s",
						 proj[k]);
					LAYER(sf[k], HP_ROLE_REPLICATE, sx, 2, k < 2 ? Is : C, k < 2 ? C : Is);
				}
				if (s->shared_gate)
					LAYER(HP_PF_SH_GATE_W, HP_ROLE_REPLICATE, "mlp.shared_expert_gate.weight", 2, 1, C);
			}
		} else {
			LAYER(HP_PF_WG, HP_ROLE_COLUMN, "mlp.gate_proj.weight", 2, I, C);
			LAYER(HP_PF_WU, HP_ROLE_COLUMN, "mlp.up_proj.weight", 2, I, C);
			LAYER(HP_PF_WD, HP_ROLE_ROW, "mlp.down_proj.weight", 2, C, I);
		}
	}
	snprintf(w.name, sizeof(w.name), "%snorm.weight", mpre(s));
	if ((rc = emit(&w, HP_PF_FINAL_NORM, HP_ROLE_REPLICATE, -1, -1, 1, C, 1)))
		return rc;
	if (!s->tie_word_embeddings)
		TOP(HP_PF_LM_HEAD, HP_ROLE_COLUMN, "lm_head.weight", 2, s->vocab, C);
#undef TOP
#undef LAYER
	return 0;
}

struct count {
	int64_t n;
	int bad;
};

static int count_numel(void *ctx, const struct hp_param_desc *d)
{
	struct count *c = ctx;
	int64_t k;

	c->bad |= hp_mul_size(d->shape[0], d->shape[1], &k) | hp_add_size(c->n, k, &c->n);
	return c->bad;   /* the first overflow ends the walk */
}

long long hp_model_spec_nparams(const struct hp_model_spec *s)
{
	struct count c = { 0, 0 };

	hp_model_spec_params(s, count_numel, &c);
	return c.bad ? -1 : c.n;
}
