/*
 * plan.c - hp_plan_resolve(): meshes, placements, FSDP units and kernel
 * bindings from a config and a model spec, and the "hp-plan/1" writer.
 *
 * The parameter list walks hp_model_spec_params (lib/model/params.c), as
 * the model does, name for name and in the same order, so that a plan and
 * a model can be walked side by side.
 * Nothing here talks MPI: the world size is given, which keeps plans
 * reproducible on a laptop for a cluster run.  hp_plan_load reads a plan
 * file back by making it again from the config and model it carries.
 */
#include <errno.h>
#include <limits.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/kernels.h"
#include "base/alloc.h"
#include "base/checked.h"
#include "base/fileio.h"
#include "base/log.h"
#include "base/sha256.h"
#include "model/model.h"
#include "model/params.h"
#include "plan/plan.h"
#include "plan/schedule.h"

const char *hp_placement_str(struct hp_placement pl, char *buf, size_t n)
{
	switch (pl.kind) {
	case HP_PL_REPLICATE: snprintf(buf, n, "replicate"); break;
	case HP_PL_SHARD: snprintf(buf, n, "shard(%d)", pl.dim); break;
	case HP_PL_PARTIAL: snprintf(buf, n, "partial"); break;
	default: snprintf(buf, n, "-"); break;
	}
	return buf;
}

const struct hp_plan_param *hp_plan_find_param(const struct hp_plan *p, const char *name)
{
	for (int i = 0; i < p->nparams; i++)
		if (!strcmp(p->params[i].name, name))
			return &p->params[i];
	return NULL;
}

const struct hp_plan_module *hp_plan_find_module(const struct hp_plan *p, const char *name)
{
	for (int i = 0; i < p->nmodules; i++)
		if (!strcmp(p->modules[i].name, name))
			return &p->modules[i];
	return NULL;
}

void hp_plan_free(struct hp_plan *p)
{
	if (!p)
		return;
	for (int i = 0; i < p->nparams; i++)
		hp_free(p->params[i].name);
	for (int i = 0; i < p->nunits; i++)
		hp_free(p->units[i].name);
	for (int i = 0; i < p->nmodules; i++) {
		hp_free(p->modules[i].name);
		hp_free(p->modules[i].cls);
		hp_free(p->modules[i].kernel);
	}
	for (int i = 0; i < p->nwarnings; i++)
		hp_free(p->warnings[i]);
	hp_free(p->params);
	hp_free(p->units);
	hp_free(p->modules);
	hp_free(p->warnings);
	json_decref(p->config);
	hp_free(p);
}

/* --- checks ---------------------------------------------------------------- */

/*
 * Pipeline stages: the layer split (given, or even with the first stages
 * one layer longer), the micro-batches, and what is not supported with a
 * pipeline yet, each refused by name.  Fills p->stage_l0.
 */
static int check_pipeline(struct hp_plan *p, const struct hp_config *c, int world, struct hp_err *e)
{
	const char *f = c->path ? c->path : "config";
	const struct hp_model_spec *s = &p->spec;
	const int *split = c->accelerator.pp_layer_split;
	int n = c->accelerator.npp_layer_split, L = s->n_layers, pp = (int)p->pp;
	int vpp = p->pp > 1 ? (int)c->accelerator.pp_vpp : 1, V = pp * vpp;
	long sum = 0, dp = world / (p->pp * p->tp * p->cp), mb = c->training.global_batch_size /
				     (c->training.micro_batch_size * (dp > 0 ? dp : 1));

	p->pp_schedule = (enum hp_pp_schedule)c->accelerator.pp_schedule;
	p->vpp = vpp;
	if (vpp > 1 && V > L)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.pp_vpp: pp_size %ld x pp_vpp %d = %d virtual "
				  "stages for %d layers: every virtual stage needs a layer", f, p->pp, vpp, V, L);
	if (p->pp > L)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.pp_size: %ld stages for %d layers: every "
				  "stage needs a layer", f, p->pp, L);
	if (split && n != V)
		return hp_err_set(e, HP_ECONFIG, vpp > 1 ? "'%s': $.accelerator.pp_layer_split: %d entries for "
				  "%d virtual stages (pp_size x pp_vpp): give one per virtual stage" :
				  "'%s': $.accelerator.pp_layer_split: %d entries for pp_size %d: give one per stage",
				  f, n, V);
	for (int i = 0; split && i < n; i++)
		sum += split[i];
	if (split && sum != L)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.pp_layer_split: the stages' layers add up "
				  "to %ld, the model has %d (num_hidden_layers)", f, sum, L);
	p->stage_l0[0] = 0;
	for (int i = 0; i < V; i++)
		p->stage_l0[i + 1] = p->stage_l0[i] + (split ? split[i] : L / V + (i < L % V));
	if (vpp > 1 && mb % p->pp)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.pp_vpp: interleaved 1F1B needs the step's "
				  "micro-batches per data-parallel rank (%ld: global_batch_size %ld / (micro_batch_size "
				  "%ld * dp %ld)) a multiple of pp_size %ld", f, mb, c->training.global_batch_size,
				  c->training.micro_batch_size, dp, p->pp);
	if (c->accelerator.pp_micro_batch_num > 0) {
		if (c->accelerator.pp_micro_batch_num != mb)
			return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.pp_micro_batch_num: %ld, but a step has "
					  "%ld micro-batches per data-parallel rank (global_batch_size %ld / "
					  "(micro_batch_size %ld * dp %ld)); give %ld or leave it out", f,
					  c->accelerator.pp_micro_batch_num, mb, c->training.global_batch_size,
					  c->training.micro_batch_size, dp, mb);
	}
	if (p->pp == 1)
		return 0;
	if (!c->fsdp.reshard_after_backward)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.fsdp_config.reshard_after_backward: false with "
				  "pp_size %ld is not supported yet", f, p->pp);
	return 0;
}

static int check(struct hp_plan *p, const struct hp_config *c, int world, struct hp_err *e)
{
	const char *f = c->path ? c->path : "config";
	const struct hp_model_spec *s = &p->spec;
	long seq = hp_config_seq_length(c);
	long sq;
	int rc;

	if (world < 1)
		return hp_err_set(e, HP_ECONFIG, "world size %d: must be at least 1", world);
	if (p->tp < 1 || p->cp < 1 || p->ep < 1 || p->pp < 1)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator: tp_size, cp_size, ep_size and "
				  "pp_size must be at least 1", f);
	if (p->dp_shard < 1 || p->edp_shard < 1)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.fsdp_config: dp_shard_size and edp_shard_size "
				  "must be at least 1", f);
	if (world % (p->pp * p->tp * p->cp))
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator: world size %d is not divisible by "
				  "pp_size*tp_size*cp_size = %ld; pick a world size that is a multiple", f, world,
				  p->pp * p->tp * p->cp);
	if ((rc = check_pipeline(p, c, world, e)))
		return rc;
	if ((p->dp * p->cp) % p->dp_shard)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.fsdp_config.dp_shard_size: %ld does not divide "
				  "dp*cp = %ld; pick a divisor", f, p->dp_shard, p->dp * p->cp);
	if ((world / p->pp) % p->ep)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.ep_size: %ld does not divide the "
				  "%ld ranks of a pipeline stage (world size %d / pp_size %ld)", f, p->ep, world / p->pp,
				  world, p->pp);
	if (p->edp % p->edp_shard)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.fsdp_config.edp_shard_size: %ld does not divide "
				  "edp = world/(pp_size*ep_size) = %ld; pick a divisor", f, p->edp_shard, p->edp);
	if (s->n_linear && s->lin_kh % p->tp)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.tp_size: %ld does not divide "
				  "linear_num_key_heads %d (the Gated DeltaNet heads are split over tp)", f, p->tp,
				  s->lin_kh);
	if (s->n_linear && p->cp > 1 && (s->lin_kh / p->tp) % p->cp)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.cp_size: %ld does not divide the Gated "
				  "DeltaNet key heads per tp rank (%ld; cp splits them again)", f, p->cp,
				  s->lin_kh / p->tp);
	if (s->n_heads % p->tp)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.tp_size: %ld does not divide "
				  "num_attention_heads %d", f, p->tp, s->n_heads);
	if (s->n_kv_heads % p->tp)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.tp_size: %ld does not divide "
				  "num_key_value_heads %d", f, p->tp, s->n_kv_heads);
	if (s->vocab % p->tp)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.tp_size: %ld does not divide "
				  "vocab_size %d (the embedding and LM head are split over the "
				  "vocabulary); pad the vocabulary or pick a divisor", f, p->tp, s->vocab);
	if (s->intermediate % p->tp)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.tp_size: %ld does not divide "
				  "intermediate_size %d", f, p->tp, s->intermediate);
	if (s->n_experts > 0 && p->tp > 1 && !p->sequence_parallel)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.sequence_parallel: a MoE model with "
				  "tp_size %ld needs sequence_parallel: true (as Megatron-LM), so that "
				  "each tp rank routes its own tokens", f, p->tp);
	if (s->n_experts > 0 && s->n_experts % p->ep)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.ep_size: %ld does not divide "
				  "num_experts %d", f, p->ep, s->n_experts);
	/* the sizes a rank allocates from the batch, checked before anything
	 * is sized by them: a micro-batch's tokens (the model's activations)
	 * and a step's (every rank reads the whole step's ids, inputs, labels
	 * and segments) */
	if (seq > 0) {
		int64_t t;

		if (hp_mul_size(c->training.micro_batch_size, seq, &t) || t > HP_MAX_TOKENS)
			return hp_err_set(e, HP_ECONFIG, "'%s': $.training.micro_batch_size: %ld rows of %ld tokens is "
					  "more than the %lld tokens a micro-batch may hold", f,
					  c->training.micro_batch_size, seq, (long long)HP_MAX_TOKENS);
		if (hp_mul3_size(c->training.global_batch_size, seq, 3 * sizeof(int32_t), &t))
			return hp_err_set(e, HP_ECONFIG, "'%s': $.training.global_batch_size: %ld rows of %ld tokens: "
					  "the step's token ids alone overflow 64 bits", f,
					  c->training.global_batch_size, seq);
	}
	if (c->training.global_batch_size % (c->training.micro_batch_size * p->dp))
		return hp_err_set(e, HP_ECONFIG, "'%s': $.training.global_batch_size: %ld is not a "
				  "multiple of micro_batch_size*dp = %ld*%ld", f,
				  c->training.global_batch_size, c->training.micro_batch_size, p->dp);
	/* CP cuts the sequence in cp chunks; sequence parallel cuts each again over tp */
	sq = p->cp * (p->sequence_parallel ? p->tp : 1);
	if (seq > 0 && seq % sq)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.dataset.data_config.seq_length: %ld is not "
				  "divisible by cp_size%s = %ld", f, seq,
				  p->sequence_parallel ? "*tp_size (sequence_parallel)" : "", sq);
	if (seq > 0) {
		struct hp_err why = { 0 };

		if (hp_model_spec_check_seq(s, seq > INT_MAX ? INT_MAX : (int)seq, &why))
			return hp_err_set(e, why.code, "'%s': $.dataset.data_config.seq_length: %s", f, why.msg);
	}
	return 0;
}

/* --- parameters and units --------------------------------------------------- */

static int add_unit(struct hp_plan *p, int cap, enum hp_mesh mesh, const char *fmt, int l)
{
	char name[96];

	if (p->nunits >= cap)
		return -1;
	snprintf(name, sizeof(name), fmt, l);
	if (!(p->units[p->nunits].name = hp_strdup(name)))
		return -1;
	p->units[p->nunits].mesh = mesh;
	return p->nunits++;
}


static int add_param(struct hp_plan *p, int cap, const char *name, int nd, long a, long b,
		     enum hp_param_role r, int unit, int expert)
{
	struct hp_plan_param *q;

	if (p->nparams >= cap || !(name = hp_strdup(name)))
		return -1;
	q = &p->params[p->nparams++];
	memset(q, 0, sizeof(*q));
	q->name = (char *)name;
	q->ndim = nd;
	q->shape[0] = a;
	q->shape[1] = nd > 1 ? b : 0;
	q->unit = unit;
	q->ep_owner = -1;
	if (r == HP_ROLE_EXPERT) {
		q->mesh = HP_MESH_EXPERT;
		q->pl[HP_DIM_EDP_REPLICATE].kind = HP_PL_REPLICATE;
		q->pl[HP_DIM_EDP_SHARD] = (struct hp_placement){ HP_PL_SHARD, 0 };
		/* the experts are split over ep; hp names them one by one, so each
		 * tensor records the ep rank that holds it */
		q->pl[HP_DIM_EP] = (struct hp_placement){ HP_PL_SHARD, 0 };
		q->ep_owner = (int)(expert / (p->spec.n_experts / p->ep));
		return 0;
	}
	q->mesh = HP_MESH_DENSE;
	q->pl[HP_DIM_DP].kind = HP_PL_REPLICATE;
	q->pl[HP_DIM_CP].kind = HP_PL_REPLICATE;
	q->pl[HP_DIM_TP].kind = HP_PL_REPLICATE;
	if (r == HP_ROLE_COLUMN)
		q->pl[HP_DIM_TP] = (struct hp_placement){ HP_PL_SHARD, 0 };
	else if (r == HP_ROLE_ROW)
		q->pl[HP_DIM_TP] = (struct hp_placement){ HP_PL_SHARD, 1 };
	q->pl[HP_DIM_DP_REPLICATE].kind = HP_PL_REPLICATE;
	q->pl[HP_DIM_DP_SHARD] = (struct hp_placement){ HP_PL_SHARD, 0 };
	return 0;
}

/* The walk over lib/model/params.c's list: FSDP units are opened as their first
 * parameter arrives (a layer's, then its experts'), the root unit holds
 * everything outside the layers. */
struct pwalk {
	struct hp_plan *p;
	int cap, ucap, root, layer_unit, expert_unit, layer, expert_layer;
};

static int plan_one(void *ctx, const struct hp_param_desc *d)
{
	struct pwalk *w = ctx;
	int unit = w->root;

	if (d->layer >= 0) {
		if (d->layer != w->layer) {
			if ((w->layer_unit = add_unit(w->p, w->ucap, HP_MESH_FSDP, "model.layers.%d", d->layer)) < 0)
				return -1;
			w->layer = d->layer;
		}
		unit = w->layer_unit;
		if (d->role == HP_ROLE_EXPERT) {
			if (d->layer != w->expert_layer) {
				w->expert_unit = add_unit(w->p, w->ucap, HP_MESH_EXPERT, "model.layers.%d.mlp.experts",
							  d->layer);
				if (w->expert_unit < 0)
					return -1;
				w->expert_layer = d->layer;
			}
			unit = w->expert_unit;
		}
	}
	if (add_param(w->p, w->cap, d->name, d->ndim, (long)d->shape[0], (long)d->shape[1], d->role, unit,
		      d->expert > 0 ? d->expert : 0))
		return -1;
	/* its pipeline stage: its layer's; the embedding the first's, the
	 * final norm and LM head the last's */
	struct hp_plan_param *q = &w->p->params[w->p->nparams - 1];
	q->stage2 = d->field == HP_PF_EMBED && w->p->spec.tie_word_embeddings && w->p->pp > 1 ? (int)w->p->pp - 1 : -1;
	if (d->layer >= 0)
		q->stage = hp_plan_layer_stage(w->p, d->layer);
	else if (d->field != HP_PF_EMBED)
		q->stage = (int)w->p->pp - 1;
	return 0;
}

static int count_plan(void *ctx, const struct hp_param_desc *d)
{
	(void)d;
	(*(int *)ctx)++;
	return 0;
}

static int build_params(struct hp_plan *p)
{
	const struct hp_model_spec *s = &p->spec;
	struct pwalk w = { .p = p, .ucap = 1 + 2 * s->n_layers, .layer = -1, .expert_layer = -1 };

	hp_model_spec_params(s, count_plan, &w.cap);
	p->params = hp_calloc((size_t)w.cap, sizeof(*p->params));
	p->units = hp_calloc((size_t)w.ucap, sizeof(*p->units));
	if (!p->params || !p->units || (w.root = add_unit(p, w.ucap, HP_MESH_FSDP, "model", 0)) < 0)
		return -1;
	return hp_model_spec_params(s, plan_one, &w) ? -1 : 0;
}

/* --- modules and kernels ---------------------------------------------------- */

static int add_module(struct hp_plan *p, int cap, const char *name, const char *prefix,
		      const char *cls, const char *op, int layer, enum hp_plan_slot slot)
{
	struct hp_plan_module *m;
	char buf[96];

	if (p->nmodules >= cap)
		return -1;
	m = &p->modules[p->nmodules++];
	m->override = -1;
	m->layer = layer;
	m->slot = slot;
	m->name = hp_strdup(name);
	snprintf(buf, sizeof(buf), "%s%s", prefix, cls);
	m->cls = hp_strdup(buf);
	snprintf(buf, sizeof(buf), "reference.%s", op);
	m->kernel = hp_strdup(buf);
	return m->name && m->cls && m->kernel ? 0 : -1;
}

static int build_modules(struct hp_plan *p)
{
	const struct hp_model_spec *s = &p->spec;
	/* the HF class names' prefix: Qwen3MoeForCausalLM -> Qwen3Moe(Attention) */
	const char *arch = s->architecture, *cut = strstr(arch, "ForCausalLM");
	char pre[64];
	int cap = 3 + 12 * s->n_layers, bad = 0;
	char name[96];

	snprintf(pre, sizeof(pre), "%.*s", cut ? (int)(cut - arch) : (int)strlen(arch), arch);
	if (!(p->modules = hp_calloc((size_t)cap, sizeof(*p->modules))))
		return -1;
	bad |= add_module(p, cap, "model.embed_tokens", "", "Embedding", "embedding", -1, HP_SLOT_OTHER);
	for (int l = 0; l < s->n_layers; l++) {
		int moe = hp_model_spec_layer_is_moe(s, l);
#define M(suffix, cpre, cls, op, slot) do { \
		snprintf(name, sizeof(name), "model.layers.%d%s", l, suffix); \
		bad |= add_module(p, cap, name, cpre, cls, op, l, slot); } while (0)
		M("", pre, "DecoderLayer", "decoder_layer", HP_SLOT_OTHER);
		M(".input_layernorm", pre, "RMSNorm", "rmsnorm", HP_SLOT_NORM_IN);
		if (s->linear[l]) {   /* Qwen3NextGatedDeltaNet and its gated norm */
			M(".linear_attn", pre, "GatedDeltaNet", "gated_deltanet", HP_SLOT_OTHER);
			M(".linear_attn.norm", pre, "RMSNormGated", "rmsnorm_gated", HP_SLOT_OTHER);
			goto mlp;
		}
		M(".self_attn", pre, "Attention", "attention", HP_SLOT_ATTN);
		if (s->mla && s->q_lora_rank)
			M(".self_attn.q_a_layernorm", pre, "RMSNorm", "rmsnorm", HP_SLOT_OTHER);
		if (s->mla)
			M(".self_attn.kv_a_layernorm", pre, "RMSNorm", "rmsnorm", HP_SLOT_OTHER);
		if (s->qk_norm) {
			M(".self_attn.q_norm", pre, "RMSNorm", "rmsnorm", HP_SLOT_OTHER);
			M(".self_attn.k_norm", pre, "RMSNorm", "rmsnorm", HP_SLOT_OTHER);
		}
mlp:
		M(".post_attention_layernorm", pre, "RMSNorm", "rmsnorm", HP_SLOT_NORM_POST);
		if (moe && s->moe_bias) {   /* GptOssMLP, GptOssTopKRouter */
			M(".mlp", pre, "MLP", "moe", HP_SLOT_OTHER);
			M(".mlp.router", pre, "TopKRouter", "router", HP_SLOT_OTHER);
			M(".mlp.experts", pre, "Experts", "experts", HP_SLOT_EXPERTS);
		} else if (moe && s->router_group) {   /* DeepseekV3MoE, its TopkRouter, shared experts */
			M(".mlp", pre, "MoE", "moe", HP_SLOT_OTHER);
			M(".mlp.gate", pre, "TopkRouter", "router", HP_SLOT_OTHER);
			M(".mlp.experts", pre, "Experts", "experts", HP_SLOT_EXPERTS);
			M(".mlp.shared_experts", pre, "MLP", "mlp", HP_SLOT_OTHER);
		} else if (moe) {
			M(".mlp", pre, "SparseMoeBlock", "moe", HP_SLOT_OTHER);
			M(".mlp.gate", "", "Linear", "router", HP_SLOT_OTHER);
			M(".mlp.experts", pre, "Experts", "experts", HP_SLOT_EXPERTS);
			if (s->shared_gate) {   /* Qwen3-Next's shared expert and its gate */
				M(".mlp.shared_expert", pre, "MLP", "mlp", HP_SLOT_OTHER);
				M(".mlp.shared_expert_gate", "", "Linear", "shared_expert_gate", HP_SLOT_OTHER);
			}
		} else {
			M(".mlp", pre, "MLP", "mlp", HP_SLOT_OTHER);
		}
#undef M
	}
	bad |= add_module(p, cap, "model.norm", pre, "RMSNorm", "rmsnorm", -1, HP_SLOT_NORM_FINAL);
	bad |= add_module(p, cap, "lm_head", "", "Linear", "lm_head", -1, HP_SLOT_LM_HEAD);
	return bad ? -1 : 0;
}

/* Glob over a whole name: '*' matches any run of characters, dots included;
 * '?' one character. */
static int glob_match(const char *g, const char *s)
{
	for (; *g; g++, s++) {
		if (*g == '*') {
			while (g[1] == '*')
				g++;
			if (!g[1])
				return 1;
			for (; *s; s++)
				if (glob_match(g + 1, s))
					return 1;
			return 0;
		}
		if (!*s || (*g != '?' && *g != *s))
			return 0;
	}
	return !*s;
}

static int same_match(const struct hp_plan_override *a, const struct hp_plan_override *b)
{
	if (a->nmatch != b->nmatch)
		return 0;
	for (int i = 0; i < a->nmatch; i++)
		if (strcmp(a->match[i], b->match[i]))
			return 0;
	return 1;
}

static int warn(struct hp_plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int warn(struct hp_plan *p, const char *fmt, ...)
{
	char buf[512], **w, *d;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (!(w = hp_realloc(p->warnings, (size_t)(p->nwarnings + 1) * sizeof(*w))))
		return -1;
	p->warnings = w;
	if (!(d = hp_strdup(buf)))
		return -1;
	w[p->nwarnings++] = d;
	return 0;
}

static const char *last_component(const char *s)
{
	const char *dot = strrchr(s, '.');

	return dot ? dot + 1 : s;
}

/*
 * Bind kernels.  Entries with the same match list merge (a later field
 * replaces an earlier one), as HyperParallel merges them; an entry whose
 * "when" names a dim of size 1 does not apply; an entry without
 * replace_module only shapes CP/EP regions, which hp decides by itself.
 */
static int bind_overrides(struct hp_plan *p, const struct hp_config *c, struct hp_err *e)
{
	const char *f = c->path ? c->path : "config";

	for (int i = 0; i < c->noverrides; i++) {
		const struct hp_plan_override *o = &c->overrides[i];
		const char *when = o->when, *type = o->module_type, *target = o->replace_target;
		int tidx = target ? i : -1;
		const struct hp_kernel *k;

		/* merge every entry with this match list into the first one */
		int first = 1;
		for (int j = 0; j < i && first; j++)
			first = !same_match(&c->overrides[j], o);
		if (!first)
			continue;
		for (int j = i + 1; j < c->noverrides; j++) {
			const struct hp_plan_override *q = &c->overrides[j];

			if (!same_match(q, o))
				continue;
			if (q->when)
				when = q->when;
			if (q->module_type)
				type = q->module_type;
			if (q->replace_target) {
				target = q->replace_target;
				tidx = j;
			}
		}
		if (!target)
			continue;
		if (!(k = hp_kernel_find_target(target))) {
			char known[2048];

			hp_kernel_targets(known, sizeof(known));
			return hp_err_set(e, HP_ECONFIG, "'%s': $.plan_overrides[%d].replace_module._target_: "
					  "unknown '%s'; known: %s", f, tidx, target, known);
		}
		if (when && ((!strcmp(when, "cp") && p->cp <= 1) || (!strcmp(when, "ep") && p->ep <= 1)))
			continue;
		for (int g = 0; g < o->nmatch; g++) {
			int hits = 0;

			for (int m = 0; m < p->nmodules; m++) {
				struct hp_plan_module *mod = &p->modules[m];
				char *kn;

				if (!glob_match(o->match[g], mod->name))
					continue;
				hits++;
				if (type && strcmp(last_component(type), mod->cls))
					return hp_err_set(e, HP_ECONFIG, "'%s': $.plan_overrides[%d].module_type: "
							  "'%s' matches '%s', which is a %s, not a %s", f, i,
							  o->match[g], mod->name, mod->cls, last_component(type));
				if (strncmp(mod->kernel, "reference.", 10) == 0 &&
				    strcmp(mod->kernel + 10, k->op))
					return hp_err_set(e, HP_ECONFIG, "'%s': $.plan_overrides[%d]: kernel '%s' "
							  "computes %s, but '%s' is a %s (%s)", f, tidx, k->name,
							  k->op, mod->name, mod->cls, mod->kernel + 10);
				if (k->supports) {
					struct hp_kernel_site site = {
						.module = mod->name, .layer = mod->layer, .head_dim = p->spec.head_dim,
						.moe = mod->layer >= 0 && hp_model_spec_layer_is_moe(&p->spec, mod->layer),
					};
					char why[256];

					if (!k->supports(&site, why, sizeof(why)))
						return hp_err_set(e, HP_ECONFIG, "'%s': $.plan_overrides[%d]: '%s': %s",
								  f, tidx, mod->name, why);
				}
				if (!(kn = hp_strdup(k->name)))
					return hp_err_set(e, HP_ENOMEM, "out of memory");
				hp_free(mod->kernel);
				mod->kernel = kn;
				mod->impl = k;
				mod->override = tidx;
			}
			if (!hits && warn(p, "'%s': $.plan_overrides[%d].match: '%s' matches no module",
					  f, i, o->match[g]))
				return hp_err_set(e, HP_ENOMEM, "out of memory");
		}
	}
	return 0;
}

/*
 * Attention with sinks (GPT-OSS) runs the flash kernel where nothing else
 * is bound: the sink joins each row's log-sum-exp, which the eager kernels
 * do not keep (lib/model/model.c, sinks_fwd).
 */
static int bind_sinks(struct hp_plan *p, struct hp_err *e)
{
	const struct hp_kernel *k = hp_kernel_find("attention", "cpu", "flash_attention");

	if (!p->spec.attn_sinks)
		return 0;
	for (int i = 0; i < p->nmodules; i++) {
		struct hp_plan_module *m = &p->modules[i];
		char *kn;

		if (m->slot != HP_SLOT_ATTN || m->impl)
			continue;
		if (!k || !hp_flash_attention_supports(p->spec.head_dim))
			return hp_err_set(e, HP_EUNSUP, "'%s': attention with sinks runs the flash kernel, which "
					  "takes head_dim up to %d; the model has %d", m->name,
					  HP_FLASH_ATTENTION_MAX_HEAD_DIM, p->spec.head_dim);
		if (!(kn = hp_strdup(k->name)))
			return hp_err_set(e, HP_ENOMEM, "out of memory for the plan");
		hp_free(m->kernel);
		m->kernel = kn;
		m->impl = k;
	}
	return 0;
}

/*
 * Which layers activation checkpointing applies to: every layer, the
 * first layer_count (Megatron's "block" method), or exactly layer_indices.
 */
static int ckpt_selection(struct hp_plan *p, const struct hp_config *c, const char *f, struct hp_err *e)
{
	const struct hp_model_spec *s = &p->spec;
	long count = c->activation_checkpoint.layer_count;
	int n = c->activation_checkpoint.nlayer_indices;
	const int *ix = c->activation_checkpoint.layer_indices;

	memset(p->ckpt_layer, 0, sizeof(p->ckpt_layer));
	if (p->act_ckpt == HP_ACT_CKPT_OFF) {
		if (count > 0 || ix)
			return hp_err_set(e, HP_ECONFIG, "'%s': activation_checkpoint.selection is given but "
					  "activation_checkpoint.mode is off", f);
		return 0;
	}
	if (count > 0 && ix)
		return hp_err_set(e, HP_ECONFIG, "'%s': activation_checkpoint.selection: give layer_count "
				  "or layer_indices, not both", f);
	if (count > s->n_layers)
		return hp_err_set(e, HP_ECONFIG, "'%s': activation_checkpoint.selection.layer_count: %ld, "
				  "but the model has %d layers", f, count, s->n_layers);
	for (int i = 0; i < n; i++) {
		if (ix[i] >= s->n_layers)
			return hp_err_set(e, HP_ECONFIG, "'%s': activation_checkpoint.selection.layer_indices[%d]: "
					  "%d, but the model has layers 0 to %d", f, i, ix[i], s->n_layers - 1);
		if (p->ckpt_layer[ix[i]])
			return hp_err_set(e, HP_ECONFIG, "'%s': activation_checkpoint.selection.layer_indices[%d]: "
					  "layer %d is listed twice", f, i, ix[i]);
		p->ckpt_layer[ix[i]] = 1;
	}
	for (int l = 0; !ix && l < s->n_layers; l++)
		p->ckpt_layer[l] = count <= 0 || l < count;
	return 0;
}

/*
 * What the estimates need from the config, the CP mode from the kernel
 * bound to attention, and the resolved config itself.
 */
static int step_facts(struct hp_plan *p, const struct hp_config *c, struct hp_err *e)
{
	const char *f = c->path ? c->path : "config";
	const struct hp_model_spec *s = &p->spec;
	int ulysses = 0, other = 0, rc;

	p->micro = c->training.micro_batch_size;
	p->device = c->training.device;
	p->seq = hp_config_seq_length(c);
	p->accum = c->training.global_batch_size / (p->micro * p->dp);
	p->reshard_after_forward = c->fsdp.reshard_after_forward;
	p->reshard_after_backward = c->fsdp.reshard_after_backward;
	p->grad_sync = c->fsdp.requires_grad_sync;
	p->forward_prefetch = c->fsdp.forward_prefetch_depth;
	p->backward_prefetch = c->fsdp.backward_prefetch_depth;
	snprintf(p->param_dtype, sizeof(p->param_dtype), "%s",
		 c->fsdp.param_dtype ? c->fsdp.param_dtype : "float32");
	snprintf(p->reduce_dtype, sizeof(p->reduce_dtype), "%s",
		 c->fsdp.reduce_dtype ? c->fsdp.reduce_dtype : p->param_dtype);
	p->act_ckpt = (enum hp_act_ckpt)c->activation_checkpoint.mode;
	if ((rc = ckpt_selection(p, c, f, e)))
		return rc;
	p->max_grad_norm = c->training.max_grad_norm;
	/* hp's loss_fn extension binds the LM head to the chunked kernel */
	if (c->training.loss_fn && strstr(c->training.loss_fn, "ChunkedCausalLMLoss")) {
		struct hp_plan_module *m = (struct hp_plan_module *)hp_plan_find_module(p, "lm_head");
		char *kn = hp_strdup("chunked_ce");

		if (!m || !kn) {
			hp_free(kn);
			return hp_err_set(e, HP_ENOMEM, "out of memory for the plan");
		}
		hp_free(m->kernel);
		m->kernel = kn;
		m->impl = hp_kernel_find("lm_head", "cpu", "chunked_ce");
		p->ce_chunk = c->training.loss_chunk_size;
	}
	for (int i = 0; i < p->nmodules; i++)
		if (strlen(p->modules[i].cls) > 9 &&
		    !strcmp(p->modules[i].cls + strlen(p->modules[i].cls) - 9, "Attention")) {
			if (!strcmp(p->modules[i].kernel, "ulysses_attention"))
				ulysses = i + 1;
			else
				other = 1;
		}
	if (ulysses && other && p->cp > 1)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.plan_overrides[%d]: ulysses_attention is bound to "
				  "some attention modules only; context parallelism needs one mode for "
				  "every layer", f, p->modules[ulysses - 1].override);
	if (ulysses && p->cp > 1) {
		p->cp_mode = HP_CP_ULYSSES;
		if ((s->n_heads / p->tp) % p->cp || (s->n_kv_heads / p->tp) % p->cp)
			return hp_err_set(e, HP_ECONFIG, "'%s': $.accelerator.cp_size: %ld does not divide the "
					  "heads per tp rank (%d attention, %d KV), which ulysses_attention "
					  "spreads over cp", f, p->cp, s->n_heads / (int)p->tp,
					  s->n_kv_heads / (int)p->tp);
	}
	if (s->n_linear && p->cp > 1 && p->cp_mode != HP_CP_ULYSSES)   /* model.c, set_par: the same words */
		return hp_err_set(e, HP_EUNSUP, "'%s': $.accelerator.cp_size: context parallelism over the Gated "
				  "DeltaNet layers (layer_types linear_attention) splits their heads (ulysses): bind "
				  "ulysses_attention to the attention layers; the recurrent state passed between cp "
				  "ranks is not implemented", f);
	if (!(p->config = hp_config_json(c)))
		return hp_err_set(e, HP_ENOMEM, "out of memory for the plan");
	return 0;
}

/*
 * The model's sizes, checked before any estimate or allocation uses them:
 * its parameters with their gradients and two AdamW moments (16 bytes
 * each; hp_model_spec_nparams adds with checked arithmetic, and no single
 * tensor holds more than all of them), and the activations of a
 * micro-batch, measured here once for every rank's estimate.
 */
static int check_sizes(struct hp_plan *p, const struct hp_config *c, struct hp_err *e)
{
	int64_t n = hp_model_spec_nparams(&p->spec), bytes;

	if (n < 0 || hp_mul_size(n, 16, &bytes))
		return hp_err_set(e, HP_ECONFIG, "'%s/config.json': the parameters overflow 64 bits (16 bytes each "
				  "with their gradients and AdamW moments): not a model hp can hold",
				  c->model.path ? c->model.path : "model");
	if ((p->act_bytes = hp_plan_act_bytes(p)) == -2)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.training.micro_batch_size: %ld rows of %ld tokens: the "
				  "activations of this model overflow 64 bits", c->path ? c->path : "config", p->micro,
				  p->seq);
	return 0;
}

int hp_plan_resolve(struct hp_plan **pp, const struct hp_config *c, const struct hp_model_spec *s,
		    int world, struct hp_err *e)
{
	struct hp_plan *p;
	int rc;

	*pp = NULL;
	if (!(p = hp_calloc(1, sizeof(*p))))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	p->world = world;
	p->spec = *s;
	p->tp = c->accelerator.tp_size;
	p->cp = c->accelerator.cp_size;
	p->ep = c->accelerator.ep_size;
	p->pp = c->accelerator.pp_size;
	p->vpp = 1;   /* check_pipeline: pp_vpp */
	p->sequence_parallel = c->accelerator.sequence_parallel;
	p->loss_parallel = c->accelerator.loss_parallel;
	p->dp_shard = c->fsdp.dp_shard_size;
	p->edp_shard = c->fsdp.edp_shard_size;
	if (p->tp > 0 && p->cp > 0 && p->pp > 0)
		p->dp = world / (p->pp * p->tp * p->cp);
	if (p->ep > 0 && p->pp > 0)
		p->edp = world / (p->pp * p->ep);
	if ((rc = check(p, c, world, e)))
		goto fail;
	/* hfconfig.h: a key in none of the lists is named once, by rank 0 */
	if (s->unknown[0] && hp_log_rank() == 0)
		hp_warn("'%s': config.json keys hp does not know, left unused (transformers may read "
			"them): %s", c->model.path ? c->model.path : "model", s->unknown);
	p->dp_replicate = p->dp * p->cp / p->dp_shard;
	p->edp_replicate = p->edp / p->edp_shard;
	p->size[HP_DIM_DP] = (int)p->dp;
	p->size[HP_DIM_CP] = (int)p->cp;
	p->size[HP_DIM_TP] = (int)p->tp;
	p->size[HP_DIM_DP_REPLICATE] = (int)p->dp_replicate;
	p->size[HP_DIM_DP_SHARD] = (int)p->dp_shard;
	p->size[HP_DIM_EDP_REPLICATE] = (int)p->edp_replicate;
	p->size[HP_DIM_EDP_SHARD] = (int)p->edp_shard;
	p->size[HP_DIM_EP] = (int)p->ep;
	p->size[HP_DIM_PP] = (int)p->pp;
	if (build_params(p) || build_modules(p)) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory for the plan");
		goto fail;
	}
	if ((rc = bind_overrides(p, c, e)) || (rc = bind_sinks(p, e)) || (rc = step_facts(p, c, e)) ||
	    (rc = check_sizes(p, c, e)))
		goto fail;
	*pp = p;
	return 0;
fail:
	hp_plan_free(p);
	return rc;
}

void hp_plan_model_kernels(const struct hp_plan *p, struct hp_model_kernels *k)
{
	memset(k, 0, sizeof(*k));
	for (int l = 0; l < p->spec.n_layers && l < HP_MAX_LAYERS; l++)
		k->ckpt[l] = p->ckpt_layer[l] ? (unsigned char)p->act_ckpt : HP_ACT_CKPT_OFF;
	for (int i = 0; i < p->nmodules; i++) {
		const struct hp_plan_module *m = &p->modules[i];
		const char *kn = m->impl ? m->impl->name : "";
		int l = m->layer;

		if (l >= HP_MAX_LAYERS)
			continue;
		switch (m->slot) {
		case HP_SLOT_ATTN:   /* ulysses runs each rank's heads with the flash kernel */
			k->flash[l] = !strcmp(kn, "flash_attention") || !strcmp(kn, "ulysses_attention");
			break;
		case HP_SLOT_NORM_IN:
			k->fused_in[l] = !strcmp(kn, "fused_rmsnorm");
			break;
		case HP_SLOT_NORM_POST:
			k->fused_post[l] = !strcmp(kn, "fused_rmsnorm");
			break;
		case HP_SLOT_EXPERTS:
			k->grouped[l] = !strcmp(kn, "grouped_experts");
			break;
		case HP_SLOT_NORM_FINAL:
			k->fused_final = !strcmp(kn, "fused_rmsnorm");
			break;
		case HP_SLOT_LM_HEAD:
			if (!strcmp(kn, "chunked_ce"))
				k->ce_chunk = p->ce_chunk;
			break;
		case HP_SLOT_OTHER:
			break;
		}
	}
}

/* --- JSON -------------------------------------------------------------------- */

/* Set k to v (a new reference) in o; remember a failure in *bad. */
static void set(json_t *o, const char *k, json_t *v, int *bad)
{
	if (!v || json_object_set_new(o, k, v))
		*bad = 1;
}

static void push(json_t *a, json_t *v, int *bad)
{
	if (!v || json_array_append_new(a, v))
		*bad = 1;
}

static json_t *mesh_json(const struct hp_plan *p, enum hp_mesh mesh, int *bad)
{
	json_t *m = json_object(), *names = json_array(), *sizes = json_array(), *groups = json_object();
	int *g = hp_calloc((size_t)p->world, sizeof(int));

	set(m, "dims", names, bad);
	set(m, "sizes", sizes, bad);
	set(m, "groups", groups, bad);
	if (!m || !names || !sizes || !groups || !g) {
		*bad = 1;
		hp_free(g);
		return m;
	}
	for (int d = 0; d < HP_NDIM; d++) {
		json_t *list;

		if (hp_dim_mesh((enum hp_dim)d) != mesh)
			continue;
		push(names, json_string(hp_dim_name((enum hp_dim)d)), bad);
		push(sizes, json_integer(p->size[d]), bad);
		set(groups, hp_dim_name((enum hp_dim)d), list = json_array(), bad);
		/* a group is emitted at its smallest rank, coordinate 0 along d */
		for (int r = 0; list && r < p->world; r++) {
			json_t *one;
			int n;

			if (hp_mesh_coord(p->size, (enum hp_dim)d, r))
				continue;
			n = hp_mesh_group(p->size, (enum hp_dim)d, r, g);
			push(list, one = json_array(), bad);
			for (int i = 0; one && i < n; i++)
				push(one, json_integer(g[i]), bad);
		}
	}
	hp_free(g);
	return m;
}

/* The stages, their layers and ranks, and the schedule's timeline: the
 * step's length in units (a forward 1, a backward 2) and its bubble. */
static json_t *pipeline_json(const struct hp_plan *p, int *bad)
{
	json_t *o = json_object(), *st = json_array();
	int G = (int)p->accum, pp = (int)p->pp, len = hp_pp_timeline(p->pp_schedule, pp, p->vpp, G, NULL);
	long sw = p->world / p->pp;

	set(o, "schedule", json_string(hp_pp_schedule_name(p->pp_schedule, p->vpp)), bad);
	set(o, "micro_batches", json_integer(G), bad);
	if (p->vpp > 1)
		set(o, "virtual_stages_per_rank", json_integer(p->vpp), bad);
	set(o, "step_units", json_integer(len), bad);
	set(o, "bubble", json_real(len > 0 ? 1.0 - 3.0 * G * p->vpp / len : 0), bad);
	set(o, "stages", st, bad);
	for (int s = 0; st && s < pp; s++) {
		json_t *one = json_object(), *ls = json_array();
		int per[HP_MAX_VPP];

		push(st, one, bad);
		set(one, "layers", ls, bad);
		/* [l0, l1), or with chunks one such pair per chunk */
		for (int c = 0; c < p->vpp; c++) {
			json_t *to = p->vpp > 1 ? json_array() : ls;

			push(to, json_integer(p->stage_l0[c * pp + s]), bad);
			push(to, json_integer(p->stage_l0[c * pp + s + 1]), bad);
			if (to != ls)
				push(ls, to, bad);
		}
		set(one, "first_rank", json_integer(s * sw), bad);
		set(one, "ranks", json_integer(sw), bad);
		set(one, "in_flight", json_integer(hp_pp_in_flight(p->pp_schedule, pp, p->vpp, s, G, per)), bad);
		if (p->vpp > 1) {
			json_t *pc = json_array();

			set(one, "in_flight_per_chunk", pc, bad);
			for (int c = 0; c < p->vpp; c++)
				push(pc, json_integer(per[c]), bad);
		}
	}
	return o;
}

static json_t *rank_est_json(const struct hp_rank_est *r, json_t *ranks, int *bad)
{
	json_t *o = json_object(), *comm = json_array();

	set(o, "ranks", ranks, bad);
	set(o, "param_bytes", json_integer(r->param_bytes), bad);
	set(o, "grad_bytes", json_integer(r->grad_bytes), bad);
	set(o, "optimizer_bytes", json_integer(r->optim_bytes), bad);
	set(o, "activation_bytes", json_integer(r->act_bytes), bad);
	set(o, "gathered_bytes", json_integer(r->gathered_bytes), bad);
	set(o, "host_overhead_bytes", json_integer(r->host_overhead_bytes), bad);
	set(o, "host_bytes", json_integer(r->host_bytes), bad);
	if (r->device_bytes)
		set(o, "device_bytes", json_integer(r->device_bytes), bad);
	set(o, "comm", comm, bad);
	for (int d = 0; comm && d <= HP_NDIM; d++)
		for (int c = 0; c < HP_NCOLL; c++) {
			const struct hp_comm_est *x = &r->comm[d][c];
			json_t *one;

			if (!x->calls)
				continue;
			push(comm, one = json_object(), bad);
			if (!one)
				break;
			set(one, "dim", json_string(hp_comm_dim_name(d)), bad);
			set(one, "op", json_string(hp_coll_name((enum hp_coll)c)), bad);
			set(one, "calls", json_integer(x->calls), bad);
			set(one, "bytes", json_integer(x->bytes), bad);
			if (x->routed)
				set(one, "routed_bytes", json_integer(x->routed), bad);
		}
	return o;
}

/* Ranks with the same figures share one entry, listed at its first rank. */
static json_t *estimates_json(const struct hp_plan *p, int *bad)
{
	json_t *o = json_object(), *step = json_object(), *per = json_array();
	struct hp_rank_est *est = hp_calloc((size_t)p->world, sizeof(*est));
	char *done = hp_calloc((size_t)p->world, 1);

	set(o, "step", step, bad);
	set(o, "per_rank", per, bad);
	if (!o || !step || !per || !est || !done) {
		*bad = 1;
		goto out;
	}
	set(step, "micro_batch_size", json_integer(p->micro), bad);
	set(step, "seq_length", json_integer(p->seq), bad);
	set(step, "grad_accumulation", json_integer(p->accum), bad);
	set(step, "param_dtype", json_string(p->param_dtype), bad);
	set(step, "reduce_dtype", json_string(p->reduce_dtype), bad);
	set(step, "activation_checkpoint", json_string(hp_act_ckpt_name(p->act_ckpt)), bad);
	if (p->act_ckpt != HP_ACT_CKPT_OFF) {
		json_t *ls = json_array();

		set(step, "checkpointed_layers", ls, bad);
		for (int l = 0; ls && l < p->spec.n_layers; l++)
			if (p->ckpt_layer[l] && json_array_append_new(ls, json_integer(l)))
				*bad = 1;
	}
	set(step, "cp_mode", json_string(p->cp_mode == HP_CP_ULYSSES ? "ulysses" : "allgather_kv"), bad);
	for (int r = 0; r < p->world; r++)
		if (hp_plan_estimate(p, r, &est[r]))
			*bad = 1;
	for (int r = 0; !*bad && r < p->world; r++) {
		json_t *ranks;

		if (done[r])
			continue;
		if (!(ranks = json_array())) {
			*bad = 1;
			break;
		}
		for (int q = r; q < p->world; q++)
			if (!done[q] && !memcmp(&est[q], &est[r], sizeof(est[r]))) {
				done[q] = 1;
				push(ranks, json_integer(q), bad);
			}
		push(per, rank_est_json(&est[r], ranks, bad), bad);
	}
out:
	hp_free(est);
	hp_free(done);
	return o;
}

static json_t *plan_json(const struct hp_plan *p, const char *hash, int *bad)
{
	json_t *root = json_object(), *par, *meshes, *units, *params, *mods;
	char buf[32];

	if (!root)
		return NULL;
	set(root, "format", json_string(HP_PLAN_FORMAT), bad);
	set(root, "hash", json_string(hash), bad);
	set(root, "world_size", json_integer(p->world), bad);
	set(root, "model", hp_model_spec_json(&p->spec), bad);
	set(root, "config", json_deep_copy(p->config), bad);
	set(root, "parallel", par = json_object(), bad);
	if (par) {
		set(par, "tp", json_integer(p->tp), bad);
		set(par, "cp", json_integer(p->cp), bad);
		set(par, "ep", json_integer(p->ep), bad);
		set(par, "pp", json_integer(p->pp), bad);
		set(par, "dp", json_integer(p->dp), bad);
		set(par, "sequence_parallel", json_boolean(p->sequence_parallel), bad);
		set(par, "loss_parallel", json_boolean(p->loss_parallel), bad);
		set(par, "dp_shard", json_integer(p->dp_shard), bad);
		set(par, "dp_replicate", json_integer(p->dp_replicate), bad);
		set(par, "edp", json_integer(p->edp), bad);
		set(par, "edp_shard", json_integer(p->edp_shard), bad);
		set(par, "edp_replicate", json_integer(p->edp_replicate), bad);
	}
	set(root, "meshes", meshes = json_object(), bad);
	for (int m = 0; meshes && m < HP_NMESH; m++)
		if (m != HP_MESH_PIPELINE || p->pp > 1)
			set(meshes, hp_mesh_name((enum hp_mesh)m), mesh_json(p, (enum hp_mesh)m, bad), bad);
	if (p->pp > 1)
		set(root, "pipeline", pipeline_json(p, bad), bad);
	set(root, "fsdp_units", units = json_array(), bad);
	for (int u = 0; units && u < p->nunits; u++) {
		json_t *o = json_object(), *names = json_array();

		push(units, o, bad);
		if (!o)
			break;
		set(o, "name", json_string(p->units[u].name), bad);
		set(o, "mesh", json_string(hp_mesh_name(p->units[u].mesh)), bad);
		set(o, "params", names, bad);
		for (int i = 0; names && i < p->nparams; i++)
			if (p->params[i].unit == u)
				push(names, json_string(p->params[i].name), bad);
	}
	set(root, "params", params = json_array(), bad);
	for (int i = 0; params && i < p->nparams; i++) {
		const struct hp_plan_param *q = &p->params[i];
		json_t *o = json_object(), *shape = json_array(), *pl = json_object();
		enum hp_mesh fm = q->mesh == HP_MESH_DENSE ? HP_MESH_FSDP : HP_MESH_EXPERT;

		push(params, o, bad);
		if (!o) {
			json_decref(shape);
			json_decref(pl);
			break;
		}
		set(o, "name", json_string(q->name), bad);
		set(o, "shape", shape, bad);
		for (int d = 0; shape && d < q->ndim; d++)
			push(shape, json_integer(q->shape[d]), bad);
		set(o, "dtype", json_string("F32"), bad);
		set(o, "mesh", json_string(hp_mesh_name(q->mesh)), bad);
		set(o, "placements", pl, bad);
		for (int d = 0; pl && d < HP_NDIM; d++)
			if ((hp_dim_mesh((enum hp_dim)d) == q->mesh || hp_dim_mesh((enum hp_dim)d) == fm) && q->pl[d].kind != HP_PL_NONE)
				set(pl, hp_dim_name((enum hp_dim)d), json_string(hp_placement_str(q->pl[d], buf, sizeof(buf))), bad);
		if (q->ep_owner >= 0)
			set(o, "ep_owner", json_integer(q->ep_owner), bad);
		set(o, "fsdp_unit", json_string(p->units[q->unit].name), bad);
		if (p->pp > 1)
			set(o, "stage", json_integer(q->stage), bad);
	}
	set(root, "modules", mods = json_array(), bad);
	for (int i = 0; mods && i < p->nmodules; i++) {
		const struct hp_plan_module *m = &p->modules[i];
		json_t *o = json_object();

		push(mods, o, bad);
		if (!o)
			break;
		set(o, "name", json_string(m->name), bad);
		set(o, "class", json_string(m->cls), bad);
		set(o, "kernel", json_string(m->kernel), bad);
		set(o, "override", m->override >= 0 ? json_integer(m->override) : json_null(), bad);
	}
	set(root, "estimates", estimates_json(p, bad), bad);
	return root;
}

/* The fewest significant digits, from 15 up, that give back every real in
 * j: "0.1" rather than "0.10000000000000001", and still exact. */
static int real_digits(json_t *j, int digits)
{
	const char *k;
	json_t *v;
	size_t i;

	if (json_is_real(j)) {
		double x = json_real_value(j);
		char buf[40];

		for (; digits < 17; digits++) {
			snprintf(buf, sizeof(buf), "%.*g", digits, x);
			if (strtod(buf, NULL) == x)
				break;
		}
	} else if (json_is_object(j)) {
		json_object_foreach(j, k, v)
			digits = real_digits(v, digits);
	} else if (json_is_array(j)) {
		json_array_foreach(j, i, v)
			digits = real_digits(v, digits);
	}
	return digits;
}

/* The plan's text: pretty-printed, keys in order, reals exact (free()). */
static char *dump(json_t *j)
{
	return json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(real_digits(j, 15)));
}

/* The plan's text with the given hash (malloc'd by jansson: free()). */
static char *plan_text(const struct hp_plan *p, const char *hash)
{
	int bad = 0;
	json_t *root = plan_json(p, hash, &bad);
	char *t = root && !bad ? dump(root) : NULL;

	json_decref(root);
	return t;
}

int hp_plan_hash(const struct hp_plan *p, char out[65], struct hp_err *e)
{
	char *t = plan_text(p, "");

	if (!t)
		return hp_err_set(e, HP_ENOMEM, "out of memory writing the plan");
	hp_sha256_hex(t, strlen(t), out);
	free(t);
	return 0;
}

int hp_plan_save(const struct hp_plan *p, const char *path, struct hp_err *e)
{
	struct hp_outfile o;
	FILE *f;
	int rc, rc2;

	/* fileio.h: -o /dev/stdout or a FIFO in place, a file whole or not at all */
	if ((rc = hp_outfile_open(&o, path, e)))
		return rc;
	if (!(f = hp_outfile_stdio(&o, e))) {
		hp_outfile_abort(&o);
		return e->code;
	}
	rc = hp_plan_write_json(p, f, e);
	rc2 = hp_outfile_close_stdio(&o, f, !rc, e);   /* a failed write removes the file */
	return rc ? rc : rc2;
}

int hp_plan_write_json(const struct hp_plan *p, FILE *f, struct hp_err *e)
{
	char hash[65], *t;
	int rc;

	if ((rc = hp_plan_hash(p, hash, e)))
		return rc;
	if (!(t = plan_text(p, hash)))
		return hp_err_set(e, HP_ENOMEM, "out of memory writing the plan");
	rc = fputs(t, f) < 0 || fputc('\n', f) == EOF;
	free(t);
	if (rc)
		return hp_err_set(e, HP_EIO, "writing the plan: %s", strerror(errno));
	return 0;
}

/* --- loading ------------------------------------------------------------------ */

/* A section of the plan as text, to go back through its own loader. */
static char *section_text(json_t *j, const char *key)
{
	json_t *v = json_object_get(j, key);

	return json_is_object(v) ? json_dumps(v, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
}

int hp_plan_load(struct hp_plan **pp, struct hp_config *cfg, const char *path, struct hp_err *e)
{
	FILE *f;
	char *buf = NULL;
	size_t len = 0;
	int rc;

	*pp = NULL;
	if (!(f = fopen(path, "rb")))
		return hp_err_set(e, HP_EIO, "'%s': cannot open: %s", path, strerror(errno));
	rc = hp_read_stream(f, &buf, &len);
	if (rc) {
		int err = errno;

		fclose(f);
		return err == ENOMEM ? hp_err_set(e, HP_ENOMEM, "out of memory reading '%s'", path)
				     : hp_err_set(e, HP_EIO, "'%s': cannot read: %s", path, strerror(err));
	}
	fclose(f);
	rc = hp_plan_load_text(pp, cfg, path, buf, len, e);
	hp_free(buf);
	return rc;
}

int hp_plan_load_text(struct hp_plan **pp, struct hp_config *cfg, const char *path, const char *text,
		      size_t len, struct hp_err *e)
{
	struct hp_config c;
	struct hp_model_spec s;
	struct hp_plan *p = NULL;
	json_error_t je;
	json_t *j, *h, *w;
	char want[65], got[65], *t = NULL, *ct = NULL, *mt = NULL;
	int rc;

	*pp = NULL;
	memset(&c, 0, sizeof(c));
	if (!(j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je)))
		return hp_err_set(e, HP_EFORMAT, "'%s': line %d: %s", path, je.line, je.text);
	h = json_object_get(j, "hash");
	w = json_object_get(j, "world_size");
	if (!json_is_object(j) || !json_is_string(json_object_get(j, "format")) ||
	    strcmp(json_string_value(json_object_get(j, "format")), HP_PLAN_FORMAT) ||
	    !json_is_string(h) || !json_is_integer(w) || json_integer_value(w) < 1 ||
	    json_integer_value(w) > 1 << 20) {
		rc = hp_err_set(e, HP_EFORMAT, "'%s': not an %s plan", path, HP_PLAN_FORMAT);
		goto out;
	}
	/* the hash covers the text with "hash" blank */
	snprintf(want, sizeof(want), "%s", json_string_value(h));
	if (json_object_set_new(j, "hash", json_string("")) || !(t = dump(j))) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory reading '%s'", path);
		goto out;
	}
	hp_sha256_hex(t, strlen(t), got);
	if (strcmp(want, got)) {
		rc = hp_err_set(e, HP_EFORMAT, "'%s': the plan's hash does not match its contents "
				"(edited by hand?); make it again with hp-plan", path);
		goto out;
	}
	/* the plan is remade from its own config and model: what a tool runs is
	 * what hp_plan_resolve makes, never a hand-edited placement */
	if (!(ct = section_text(j, "config")) || !(mt = section_text(j, "model"))) {
		rc = hp_err_set(e, HP_EFORMAT, "'%s': the plan has no config or model section", path);
		goto out;
	}
	if ((rc = hp_config_load_resolved(&c, path, ct, strlen(ct), e)) ||
	    (rc = hp_hfconfig_load_buf(&s, path, mt, strlen(mt), e)) ||
	    (rc = hp_plan_resolve(&p, &c, &s, (int)json_integer_value(w), e)))
		goto out;
	if ((rc = hp_plan_hash(p, got, e)))
		goto out;
	if (strcmp(want, got)) {
		rc = hp_err_set(e, HP_EFORMAT, "'%s': this hp makes a different plan of the plan's own "
				"config (made by another version of hp-plan?); make it again with hp-plan",
				path);
		goto out;
	}
	*pp = p;
	p = NULL;
	if (cfg) {
		*cfg = c;
		memset(&c, 0, sizeof(c));
	}
out:
	hp_plan_free(p);
	hp_config_release(&c);
	json_decref(j);
	free(t);
	free(ct);
	free(mt);
	return rc;
}
