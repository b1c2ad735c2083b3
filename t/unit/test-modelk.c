/*
 * test-modelk.c - the substituted module kernels (flash attention, fused
 * RMSNorm, grouped experts, chunked cross-entropy) against HF's algorithms,
 * inside the whole model: loss and every gradient, one kernel at a time and
 * all together, on the Llama, Qwen3 and Qwen3-MoE fixtures, with packed
 * rows, odd lengths and chunks that do not divide the tokens.  And the
 * plan's activation estimate equals the model's arena with every kernel
 * choice (hp-plan measures with lib/model/model.c's own take_acts; this holds the
 * measuring pass equal to the allocation).  And one backend carries
 * model after model, each with its own weights (models_in_turn).
 *
 * Tolerances.  A substituted kernel computes HF's algebra in another
 * summation order (flash tiles against the eager softmax, eight double
 * lanes against one double sum, chunks of the head, one GEMM per expert
 * group), so the two runs differ by rounding alone.  Independent roundings
 * add like a random walk: sqrt(n) u (u = 2^-24) for n terms summed, and a
 * gradient element's chain through these fixtures sums at most a few
 * thousand terms in all (V = 512, hidden 64, intermediate up to 172, 37
 * keys times the GQA group, the B*T = 74 tokens of a weight gradient, over
 * 2 to 5 layers): about 50 u = 3e-6.  So every gradient tensor is within
 * 1e-5 relative L2 of the reference's, each against its own norm or, when
 * cancellation left it smaller, against the norm it would have at the
 * model's typical gradient element (tap_rel_l2_parts: the floor tied to
 * the global gradient norm), while a wrong gradient of any tensor of
 * typical size fails by its own norm.  The loss is a mean of non-negative
 * terms, so it is relative to itself; it sees only the forward's part of
 * the chain (a logit's rounding moves its token's loss by at most twice
 * that, since sum |softmax - onehot| <= 2), averaged over the B*T targets:
 * 1e-6.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "config/config.h"
#include "model/model.h"
#include "plan/plan.h"
#include "tap.h"

static char src[4096];

struct result {
	double loss;
	long count;
	float *grads;
	size_t n;
	int nparts;                  /* the tensors of grads: offsets, sizes, names */
	size_t *off, *len;
	char (*name)[96];
	size_t act;                  /* the model's activation arena, bytes */
};

static uint32_t rng = 12345;
static uint32_t rnd(void)
{
	rng = rng * 1664525u + 1013904223u;
	return rng >> 8;
}

/* One forward and backward of the fixture with kernels k; grads copied out. */
static int preset_scale;

static int run(const char *dir, const struct hp_model_kernels *k, int B, int T, const int32_t *ids,
	       const int32_t *tg, const int32_t *seg, struct result *r)
{
	struct hp_model_spec s;
	struct hp_model m;
	struct hp_err e;

	hp_err_clear(&e);
	if (hp_hfconfig_load(&s, dir, &e) || hp_model_init_kernels(&m, &s, k, B, T, &e) ||
	    hp_model_load_hf(&m, dir, &e)) {
		tap_diag("  %s", e.msg);
		return -1;
	}
	hp_model_zero_grad(&m);
	double scale = 0;
	if (preset_scale) {   /* as lib/train/train.c does: the step's count is known first */
		long c = 0;

		for (long i = 0; i < (long)B * T; i++)
			c += tg[i] != -100;
		scale = c ? 1.0 / (double)c : 0;
	}
	if (hp_model_forward(&m, ids, tg, seg, scale, &r->loss, &r->count, &e) ||
	    hp_model_backward(&m, ids, tg, (double)r->count, 1.0, &e)) {
		tap_diag("  %s", e.msg);
		hp_model_release(&m);
		return -1;
	}
	r->n = m.w.numel;
	r->nparts = m.w.nparams;
	r->off = malloc(sizeof(size_t) * (size_t)m.w.nparams);
	r->len = malloc(sizeof(size_t) * (size_t)m.w.nparams);
	r->name = malloc(sizeof(*r->name) * (size_t)m.w.nparams);
	for (int i = 0; i < m.w.nparams; i++) {
		r->off[i] = m.w.params[i].offset;
		r->len[i] = m.w.params[i].numel;
		snprintf(r->name[i], sizeof(r->name[i]), "%s", m.w.params[i].name);
	}
	r->act = m.a.aarena.used;
	r->grads = malloc(m.w.numel * sizeof(float));
	if (r->grads)
		memcpy(r->grads, m.w.flat_g, m.w.numel * sizeof(float));
	hp_model_release(&m);
	return r->grads && r->off && r->len && r->name ? 0 : -1;
}

/* Random ids and targets (every 11th ignored) for B rows of T tokens of
 * model's vocabulary; packed: documents of 1, 6 and the rest tokens in
 * every row.  0, or -1 with the failure reported. */
static int make_batch(const char *model, char *dir, size_t ndir, int B, int T, int packed,
		      int32_t **ids, int32_t **tg, int32_t **seg)
{
	struct hp_model_spec s;
	struct hp_err e;
	long N = (long)B * T;

	snprintf(dir, ndir, "%s/data/%s", src, model);
	hp_err_clear(&e);
	*ids = *tg = *seg = NULL;
	if (hp_hfconfig_load(&s, dir, &e)) {
		ok(0, "%s: %s", model, e.msg);
		return -1;
	}
	*ids = malloc((size_t)N * sizeof(**ids));
	*tg = malloc((size_t)N * sizeof(**tg));
	*seg = packed ? malloc((size_t)N * sizeof(**seg)) : NULL;
	if (!*ids || !*tg || (packed && !*seg)) {
		ok(0, "%s: out of memory for %ld tokens", model, N);
		return -1;
	}
	for (long i = 0; i < N; i++) {
		int t = (int)(i % T);

		(*ids)[i] = (int32_t)(rnd() % (uint32_t)s.vocab);
		(*tg)[i] = i % 11 == 3 ? -100 : (int32_t)(rnd() % (uint32_t)s.vocab);
		if (packed)
			(*seg)[i] = t < 1 ? 0 : t < 7 ? 1 : 7;
	}
	return 0;
}

static void result_free(struct result *r)
{
	free(r->grads);
	free(r->off);
	free(r->len);
	free(r->name);
}

/*
 * One batch run with kernels ref (NULL: HF's algorithms) and with k.
 * exact (activation checkpointing, which recomputes the same operations on
 * the same inputs in the same order): loss and every gradient identical,
 * with less memory; else within the tolerances above.
 */
static void check(const char *model, const char *what, const struct hp_model_kernels *ref_k,
		  const struct hp_model_kernels *k, int B, int T, int packed, int exact)
{
	char dir[4200];
	struct result ref = { 0 }, got = { 0 };
	int32_t *ids, *tg, *seg;

	if (make_batch(model, dir, sizeof(dir), B, T, packed, &ids, &tg, &seg))
		goto out;
	if (run(dir, ref_k, B, T, ids, tg, seg, &ref) || run(dir, k, B, T, ids, tg, seg, &got)) {
		ok(0, "%s %s: runs", model, what);
	} else if (exact) {
		ok(got.count == ref.count && got.loss == ref.loss && got.n == ref.n &&
		   !memcmp(got.grads, ref.grads, ref.n * sizeof(float)) && got.act < ref.act,
		   "%s, %s, B=%d T=%d%s: loss and every gradient bit-identical, activations %zu of %zu bytes",
		   model, what, B, T, packed ? " packed" : "", got.act, ref.act);
	} else {
		int wp;
		double dl = fabs(got.loss - ref.loss) / fabs(ref.loss);
		double dg = tap_rel_l2_parts(got.grads, ref.grads, ref.nparts, ref.off, ref.len, &wp);

		ok(got.count == ref.count && dl < 1e-6 && dg < 1e-5,
		   "%s, %s, B=%d T=%d%s: loss within %.1e, every gradient within %.1e (rel L2, worst %s)", model,
		   what, B, T, packed ? " packed" : "", dl, dg, ref.name[wp]);
	}
	result_free(&ref);
	result_free(&got);
out:
	free(ids);
	free(tg);
	free(seg);
}

static void compare(const char *model, const char *what, const struct hp_model_kernels *k, int B, int T,
		    int packed)
{
	check(model, what, NULL, k, B, T, packed, 0);
}

static void same_bits(const char *model, const char *what, const struct hp_model_kernels *keep,
		      const struct hp_model_kernels *k, int B, int T, int packed)
{
	check(model, what, keep, k, B, T, packed, 1);
}

static void all_layers(struct hp_model_kernels *k, int flash, int norm, int grouped, long chunk)
{
	memset(k, 0, sizeof(*k));
	for (int l = 0; l < HP_MAX_LAYERS; l++) {
		k->flash[l] = (unsigned char)flash;
		k->fused_in[l] = k->fused_post[l] = (unsigned char)norm;
		k->grouped[l] = (unsigned char)grouped;
	}
	k->fused_final = (unsigned char)norm;
	k->ce_chunk = chunk;
}

/* The plan's estimate at one rank equals the model's activation arena for
 * the kernels the plan binds. */
static void estimate_is_arena(const char *model, const char *extra, const char *tail)
{
	char dir[4200], y[8192];
	struct hp_config c;
	struct hp_model_spec s;
	struct hp_plan *p = NULL;
	struct hp_model_kernels k;
	struct hp_model m;
	struct hp_rank_est r;
	struct hp_err e;

	snprintf(dir, sizeof(dir), "%s/data/%s", src, model);
	snprintf(y, sizeof(y),
		 "model: {_target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained,\n"
		 "        pretrained_model_name_or_path: %s}\n"
		 "training: {train_iters: 1, micro_batch_size: 2, global_batch_size: 2%s}\n"
		 "dataset: {_target_: hyper_parallel.data.build_online_text_dataset, data_path: x,\n"
		 "          data_config: {seq_length: 40}}\n"
		 "plan_overrides:\n"
		 "  - {match: [\"*norm\"], replace_module: {_target_: fused_rmsnorm}}\n"
		 "  - {match: \"*.self_attn\", replace_module: {_target_: flash_attention}}\n"
		 "  - {match: \"*.mlp.experts\", replace_module: {_target_: grouped_experts}}\n%s\n",
		 dir, extra, tail);
	hp_err_clear(&e);
	if (hp_config_load_buf(&c, "k.yaml", y, strlen(y), 0, NULL, &e) || hp_hfconfig_load(&s, dir, &e) ||
	    hp_plan_resolve(&p, &c, &s, 1, &e)) {
		ok(0, "%s: plan: %s", model, e.msg);
		hp_config_release(&c);
		return;
	}
	hp_plan_model_kernels(p, &k);
	ok(k.flash[0] && k.fused_in[0] && k.fused_post[s.n_layers - 1] && k.fused_final &&
	   (!s.n_experts || k.grouped[s.n_layers - 1]) && k.ce_chunk == (*extra ? 16 : 0) &&
	   k.ckpt[0] == (strstr(tail, "full") ? HP_ACT_CKPT_FULL : strstr(tail, "selective") ?
			 HP_ACT_CKPT_SELECTIVE : HP_ACT_CKPT_OFF),
	   "%s%s %s: the plan binds the kernels", model, extra, tail);
	if (!hp_model_init_kernels(&m, &s, &k, 2, 40, &e)) {
		hp_plan_estimate(p, 0, &r);
		is_int(r.act_bytes, (long long)((m.a.aarena.used + 63) & ~(size_t)63),
		       "%s%s %s: the activation estimate is the arena with the bound kernels", model, extra, tail);
		hp_model_release(&m);
	} else {
		ok(0, "%s: model: %s", model, e.msg);
	}
	hp_plan_free(p);
	hp_config_release(&c);
}

/*
 * The same on every rank of a parallel layout: the model each rank builds
 * for its part (hp_model_init_par, no collective needed to size it) holds
 * the arena the plan estimates for that rank.
 */
static void estimate_is_arena_par(const char *model, const char *acc, int world, int kernels,
				  const char *tail)
{
	char dir[4200], y[8192];
	struct hp_config c;
	struct hp_model_spec s;
	struct hp_plan *p = NULL;
	struct hp_model_kernels k;
	struct hp_err e;
	int bad = 0;
	long long got = 0, want = 0;

	snprintf(dir, sizeof(dir), "%s/data/%s", src, model);
	snprintf(y, sizeof(y),
		 "model: {_target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained,\n"
		 "        pretrained_model_name_or_path: %s}\n"
		 "training: {train_iters: 1, micro_batch_size: 2, global_batch_size: 16}\n"
		 "accelerator: {%s}\n"
		 "dataset: {_target_: hyper_parallel.data.build_online_text_dataset, data_path: x,\n"
		 "          data_config: {seq_length: 48}}\n%s\n%s", dir, acc, tail, kernels ?
		 "plan_overrides:\n"
		 "  - {match: [\"*norm\"], replace_module: {_target_: fused_rmsnorm}}\n"
		 "  - {match: \"*.self_attn\", replace_module: {_target_: flash_attention}}\n"
		 "  - {match: \"*.mlp.experts\", replace_module: {_target_: grouped_experts}}\n" : "");
	hp_err_clear(&e);
	if (hp_config_load_buf(&c, "k.yaml", y, strlen(y), 0, NULL, &e) || hp_hfconfig_load(&s, dir, &e) ||
	    hp_plan_resolve(&p, &c, &s, world, &e)) {
		ok(0, "%s {%s}: plan: %s", model, acc, e.msg);
		hp_config_release(&c);
		return;
	}
	hp_plan_model_kernels(p, &k);
	for (int r = 0; r < world && !bad; r++) {
		struct hp_model_par par = {
			.tp = (int)p->tp, .cp = (int)p->cp, .ep = (int)p->ep,
			.tp_rank = hp_mesh_coord(p->size, HP_DIM_TP, r), .cp_rank = hp_mesh_coord(p->size, HP_DIM_CP, r),
			.ep_rank = hp_mesh_coord(p->size, HP_DIM_EP, r), .sp = p->sequence_parallel,
			.loss_parallel = p->loss_parallel, .ulysses = p->cp_mode == HP_CP_ULYSSES,
			.cs = (struct hp_comms *)&par,   /* sizing the model calls no collective */
		};
		struct hp_model m;
		struct hp_rank_est est;

		if (hp_model_init_par(&m, NULL, &s, &k, &par, 2, 48, &e)) {
			ok(0, "%s {%s}: rank %d: %s", model, acc, r, e.msg);
			bad = 1;
			break;
		}
		hp_plan_estimate(p, r, &est);
		got = est.act_bytes;
		want = (long long)((m.a.aarena.used + 63) & ~(size_t)63);
		bad = got != want;
		hp_model_release(&m);
	}
	if (!bad || got != want)
		is_int(got, want, "%s {%s}%s %s, %d ranks: every rank's activation estimate is its model's arena",
		       model, acc, kernels ? " with the seed's kernels" : "", tail, world);
	hp_plan_free(p);
	hp_config_release(&c);
}

/* One forward of model's fixture with every weight times scale, on bk
 * (NULL: the CPU): the loss sum, or NAN with the failure reported. */
static double scaled_loss(struct hp_backend *bk, const char *dir, const struct hp_model_kernels *k, float scale,
			  const int32_t *ids, const int32_t *tg, int T)
{
	struct hp_model_spec s;
	struct hp_model m;
	struct hp_err e;
	double loss = NAN;
	long cnt;

	hp_err_clear(&e);
	if (hp_hfconfig_load(&s, dir, &e) || hp_model_init_par(&m, bk, &s, k, NULL, 1, T, &e)) {
		tap_diag("  %s", e.msg);
		return NAN;
	}
	if (!hp_model_load_hf(&m, dir, &e)) {
		for (size_t i = 0; i < m.w.numel; i++)
			m.w.flat_w[i] *= scale;
		if (!hp_model_upload(&m, &e) && hp_model_forward(&m, ids, tg, NULL, 0, &loss, &cnt, &e))
			loss = NAN;
	}
	if (e.code)
		tap_diag("  %s", e.msg);
	hp_model_release(&m);
	return loss;
}

/*
 * One backend carries model after model (hp-verify's reference beside the
 * run's model; a program that makes several): the CUDA backend keeps a
 * working copy of each model's weights, and a released model's copy must
 * go with it, or the next model, handed the same device memory, computes
 * with the old weights.  Six models in turn on the emulation (exact: the
 * CPU's bits where both run flash attention), each with other weights,
 * each forward equal to the CPU's.
 */
static void models_in_turn(void)
{
	char dir[4200];
	struct hp_backend *bk;
	struct hp_model_kernels k;
	struct hp_err e;
	int32_t *ids, *tg, *seg;
	int T = 37, same = 0;

	if (make_batch("stories260K/hf", dir, sizeof(dir), 1, T, 0, &ids, &tg, &seg))
		return;
	all_layers(&k, 1, 0, 0, 0);
	hp_err_clear(&e);
	if (hp_backend_cuda_open(&bk, 0, 0, HP_EMULATE_EXACT, &e)) {
		ok(0, "the emulated CUDA backend: %s", e.msg);
	} else {
		for (int i = 0; i < 6; i++) {
			float scale = 1.0f + 0.125f * (float)i;
			double cpu = scaled_loss(NULL, dir, &k, scale, ids, tg, T);
			double dev = scaled_loss(bk, dir, &k, scale, ids, tg, T);

			same += cpu == dev && !isnan(cpu);
			if (cpu != dev)
				tap_diag("  model %d (weights x%g): %.9g on the device, %.9g on the CPU", i, scale, dev,
					 cpu);
		}
		hp_backend_close(bk);
		ok(same == 6, "six models in turn on one emulated CUDA backend: %d of 6 forwards the CPU's bits", same);
	}
	free(ids);
	free(tg);
	free(seg);
}

int main(void)
{
	const char *sd = getenv("HP_SRC_DIR");
	static const char *const models[] = { "stories260K/hf", "ref/qwen3-dense", "ref/qwen3-moe-a",
					      "ref/qwen3-moe-b" };
	struct hp_model_kernels k;

	snprintf(src, sizeof(src), "%s", sd ? sd : ".");
	models_in_turn();
	for (int i = 0; i < 4; i++) {
		all_layers(&k, 1, 0, 0, 0);
		compare(models[i], "flash attention", &k, 2, 37, 0);
		all_layers(&k, 0, 1, 0, 0);
		compare(models[i], "fused rmsnorm", &k, 2, 37, 0);
		all_layers(&k, 0, 0, 0, 13);
		compare(models[i], "chunked cross-entropy (13)", &k, 2, 37, 0);
		preset_scale = 1;
		compare(models[i], "chunked cross-entropy (13), head's backward in the forward", &k, 2, 37, 0);
		preset_scale = 0;
		if (strstr(models[i], "moe")) {
			all_layers(&k, 0, 0, 1, 0);
			compare(models[i], "grouped experts", &k, 2, 37, 0);
		}
		all_layers(&k, 1, 1, 1, 16);
		compare(models[i], "all together", &k, 2, 37, 1);
		compare(models[i], "all together", &k, 1, 1, 0);
		for (int a = 0; a < 4; a++) {
			static const char *const ac[] = {
				"", "activation_checkpoint: {mode: full}",
				"activation_checkpoint: {mode: selective}",
				"activation_checkpoint: {mode: full, selection: {layer_indices: [1, 0]}}",
			};
			estimate_is_arena(models[i], "", ac[a]);
			estimate_is_arena(models[i], ", loss_fn: {_target_: ChunkedCausalLMLoss, chunk_size: 16}", ac[a]);
		}
		/* checkpointing: on the reference kernels, on the substituted ones,
		 * and on some layers only */
		for (int kern = 0; kern < 2; kern++) {
			struct hp_model_kernels keep, ck;

			all_layers(&keep, kern, kern, kern, kern ? 16 : 0);
			ck = keep;
			memset(ck.ckpt, HP_ACT_CKPT_FULL, sizeof(ck.ckpt));
			same_bits(models[i], kern ? "full checkpointing, substituted kernels" : "full checkpointing",
				  &keep, &ck, 2, 37, kern);
			memset(ck.ckpt, HP_ACT_CKPT_OFF, sizeof(ck.ckpt));
			ck.ckpt[0] = ck.ckpt[1] = HP_ACT_CKPT_FULL;
			same_bits(models[i], kern ? "full checkpointing of layers 0 and 1, substituted kernels" :
				  "full checkpointing of layers 0 and 1", &keep, &ck, 2, 37, kern);
			if (!kern) {   /* flash attention keeps no probabilities to drop */
				memset(ck.ckpt, HP_ACT_CKPT_SELECTIVE, sizeof(ck.ckpt));
				same_bits(models[i], "selective checkpointing", &keep, &ck, 2, 37, 1);
			}
		}
	}
	for (int kern = 0; kern < 2; kern++) {
		for (int a = 0; a < 3; a++) {
			static const char *const ac[] = {
				"", "activation_checkpoint: {mode: full}", "activation_checkpoint: {mode: selective}",
			};
			estimate_is_arena_par("stories260K/hf", "tp_size: 2", 2, kern, ac[a]);
			estimate_is_arena_par("stories260K/hf", "tp_size: 4, sequence_parallel: true, loss_parallel: true",
					      4, kern, ac[a]);
			estimate_is_arena_par("stories260K/hf", "cp_size: 4", 4, kern, ac[a]);
			estimate_is_arena_par("ref/qwen3-dense", "tp_size: 2, cp_size: 2, sequence_parallel: true", 8,
					      kern, ac[a]);
			estimate_is_arena_par("ref/qwen3-moe-a", "ep_size: 4", 8, kern, ac[a]);
			estimate_is_arena_par("ref/qwen3-moe-b",
					      "tp_size: 2, cp_size: 2, ep_size: 2, sequence_parallel: true", 8, kern, ac[a]);
		}
	}
	return tap_done();
}
