/*
 * test-plan.c - the plan's contracts that tools build on:
 *   - the "model" section is a config.json that loads back to the same spec;
 *   - the "config" section loads back to the same config;
 *   - at one rank, the estimate of parameter bytes is what lib/model/model.c
 *     allocates for weights, and the activation estimate is its arena;
 *   - the ranks' pieces of every parameter tile it exactly once, for every
 *     layout of the golden plans (t/plan), at every rank;
 *   - FSDP memory falls as 1/N.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/hfconfig.h"
#include "model/model.h"
#include "plan/plan.h"
#include "tap.h"

static char src[4096];

static const char *data(const char *rel, char *buf, size_t n)
{
	snprintf(buf, n, "%s/data/%s", src, rel);
	return buf;
}

static const char *const models[] = { "stories260K/hf", "ref/qwen3-dense", "ref/qwen3-moe-a" };
#define NMODELS 3

static void spec_round_trip(void)
{
	for (int i = 0; i < NMODELS; i++) {
		struct hp_model_spec a, b;
		struct hp_err e;
		char path[4096], *t;
		json_t *j;

		hp_err_clear(&e);
		if (!ok(!hp_hfconfig_load(&a, data(models[i], path, sizeof(path)), &e), "load %s", models[i])) {
			tap_diag("  %s", e.msg);
			continue;
		}
		j = hp_model_spec_json(&a);
		t = j ? json_dumps(j, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
		ok(t && !hp_hfconfig_load_buf(&b, "spec", t, strlen(t), &e) && !memcmp(&a, &b, sizeof(a)),
		   "%s: the spec's config.json loads back to the same spec", models[i]);
		free(t);
		json_decref(j);
	}
}

static char *print_config(const struct hp_config *c)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	if (!f)
		return NULL;
	hp_config_print(c, f);
	fclose(f);
	return buf;
}

static const char yaml[] =
	"model:\n"
	"  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_config\n"
	"  config_path: /models/x\n"
	"  num_hidden_layers: 2\n"
	"training: {train_iters: 7, global_batch_size: 16, micro_batch_size: 2, max_grad_norm: 0.3,\n"
	"           loss_aggregation: rank_average}\n"
	"accelerator: {tp_size: 2, cp_size: 2, sequence_parallel: true}\n"
	"fsdp_config: {dp_shard_size: 2, reshard_after_forward: false,\n"
	"              mix_precision: {param_dtype: bfloat16}, replicate_params: [a, b]}\n"
	"plan_overrides:\n"
	"  - match: [\"*.self_attn\"]\n"
	"    when: cp\n"
	"    region_dispatch: true\n"
	"    local_compute_fn: {_target_: some.fn, chunk: 3}\n"
	"  - match: \"*.mlp\"\n"
	"    replace_module: {_target_: x.y}\n"
	"dataset:\n"
	"  _target_: hyper_parallel.data.build_indexed_text_dataset\n"
	"  data_path: /data/corpus\n"
	"  data_config: {seq_length: 128, is_dataset_from_mr: true}\n"
	"optimizer:\n"
	"  adamw_config: {adamw_lr: 0.2, adamw_betas: [0.8, 0.95]}\n"
	"lr_scheduler: {lr_decay_style: cosine, lr_config: {lr: 0.2, lr_warmup_steps: 3}}\n"
	"checkpoint: {checkpoint_dir: /ckpt, restore_from: LATEST}\n"
	"activation_checkpoint: {mode: selective}\n"
	"debug: {inject_fault: 'allgather:1'}\n";

static void config_round_trip(void)
{
	struct hp_config a, b;
	struct hp_err e;
	json_t *ja, *jb = NULL;
	char *t = NULL, *pa = NULL, *pb = NULL;
	int rc;

	hp_err_clear(&e);
	rc = hp_config_load_buf(&a, "cfg", yaml, strlen(yaml), 0, NULL, &e);
	if (!ok(!rc, "the test config loads")) {
		tap_diag("  %s", e.msg);
		return;
	}
	ja = hp_config_json(&a);
	t = ja ? json_dumps(ja, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
	rc = t ? hp_config_load_resolved(&b, "cfg", t, strlen(t), &e) : -1;
	if (!ok(!rc, "its JSON loads back")) {
		tap_diag("  %s", e.msg);
	} else {
		jb = hp_config_json(&b);
		ok(json_equal(ja, jb), "to the same JSON");
		pa = print_config(&a);
		pb = print_config(&b);
		ok(pa && pb && !strcmp(pa, pb), "and the same config, field by field");
		hp_config_release(&b);
	}
	json_decref(ja);
	json_decref(jb);
	free(t);
	free(pa);
	free(pb);
	hp_config_release(&a);
}

/* A plan of model dir for world ranks with extra YAML lines. */
static struct hp_plan *make_plan(const char *dir, int world, const char *extra, long B, long T)
{
	struct hp_config c;
	struct hp_model_spec s;
	struct hp_plan *p = NULL;
	struct hp_err e;
	char y[4096];

	hp_err_clear(&e);
	snprintf(y, sizeof(y),
		 "model: {_target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained,\n"
		 "        pretrained_model_name_or_path: %s}\n"
		 "training: {train_iters: 1, micro_batch_size: %ld, global_batch_size: %ld}\n"
		 "dataset: {_target_: hyper_parallel.data.build_online_text_dataset, data_path: x,\n"
		 "          data_config: {seq_length: %ld}}\n%s", dir, B, B * world, T, extra);
	if (hp_config_load_buf(&c, "plan.yaml", y, strlen(y), 0, NULL, &e) ||
	    hp_hfconfig_load(&s, dir, &e) || hp_plan_resolve(&p, &c, &s, world, &e))
		tap_diag("  %s", e.msg);
	hp_config_release(&c);
	return p;
}

static void one_rank_is_the_model(void)
{
	for (int i = 0; i < NMODELS; i++) {
		char dir[4096];
		struct hp_plan *p = make_plan(data(models[i], dir, sizeof(dir)), 1, "", 2, 16);
		struct hp_model m;
		struct hp_rank_est r;
		struct hp_err e;

		hp_err_clear(&e);
		if (!ok(p && !hp_model_init(&m, &p->spec, 2, 16, &e), "%s: plan and model", models[i])) {
			hp_plan_free(p);
			continue;
		}
		ok(!hp_plan_estimate(p, 0, &r), "%s: estimate", models[i]);
		is_int(r.param_bytes, (long long)m.w.numel * 4, "%s: parameter bytes = the model's weights",
		       models[i]);
		is_int(r.optim_bytes, (long long)m.w.numel * 8, "%s: optimizer bytes = AdamW's two moments",
		       models[i]);
		is_int(r.act_bytes, (long long)((m.a.aarena.used + 63) & ~(size_t)63),
		       "%s: activation bytes = the model's activation arena", models[i]);
		hp_model_release(&m);
		hp_plan_free(p);
	}
}

/* Every global element of every parameter is held by exactly one rank of
 * each replica group: count the holders per element and per replica. */
static void pieces_tile(const char *name, struct hp_plan *p)
{
	int bad = 0;

	for (int i = 0; p && i < p->nparams && !bad; i++) {
		const struct hp_plan_param *q = &p->params[i];
		int64_t rows = q->shape[0], cols = q->ndim > 1 ? q->shape[1] : 1;
		int *seen = calloc((size_t)(rows * cols), sizeof(int));
		/* copies of the parameter: replicas of the mesh outside the shards */
		int copies = q->mesh == HP_MESH_EXPERT ? p->size[HP_DIM_EDP_REPLICATE] :
			     p->size[HP_DIM_DP_REPLICATE] * (q->pl[HP_DIM_TP].kind == HP_PL_SHARD ? 1 : (int)p->tp);

		for (int r = 0; seen && r < p->world; r++) {
			struct hp_piece pc;

			if (!hp_plan_owns(p, q, r))
				continue;
			hp_plan_piece(p, q, r, &pc);
			for (int64_t a = 0; a < pc.nrows; a++)
				for (int64_t b = 0; b < pc.cols; b++)
					seen[(pc.row0 + a) * cols + pc.col0 + b]++;
		}
		for (int64_t x = 0; seen && x < rows * cols; x++)
			if (seen[x] != copies) {
				tap_diag("  %s: %s element %lld held %d times, want %d", name, q->name,
					 (long long)x, seen[x], copies);
				bad = 1;
				break;
			}
		free(seen);
	}
	ok(p && !bad, "%s: the ranks' pieces tile every parameter", name);
}

static void layouts(void)
{
	char dense[4096], moe[4096], llama[4096];
	static const struct { const char *name; int world, model; const char *extra; } L[] = {
		{ "fsdp 3 (uneven chunks)", 3, 0, "fsdp_config: {dp_shard_size: 3}\n" },
		{ "hsdp 2x2", 4, 1, "fsdp_config: {dp_shard_size: 2}\n" },
		{ "tp 2 + fsdp 2", 4, 1, "accelerator: {tp_size: 2}\nfsdp_config: {dp_shard_size: 2}\n" },
		{ "cp 2 x dp 2", 4, 2, "accelerator: {cp_size: 2}\nfsdp_config: {dp_shard_size: 4}\n" },
		{ "ep 4, edp_shard 2", 8, 2, "accelerator: {ep_size: 4}\nfsdp_config: {dp_shard_size: 8, "
					     "edp_shard_size: 2}\n" },
		{ "tp2 cp2 ep2 (the seed)", 8, 2, "accelerator: {tp_size: 2, cp_size: 2, ep_size: 2, "
			"sequence_parallel: true}\nfsdp_config: {dp_shard_size: 2, edp_shard_size: 2}\n" },
		{ "fsdp 7 (empty chunks)", 7, 0, "fsdp_config: {dp_shard_size: 7}\n" },
	};
	const char *dirs[3];

	dirs[0] = data("stories260K/hf", llama, sizeof(llama));
	dirs[1] = data("ref/qwen3-dense", dense, sizeof(dense));
	dirs[2] = data("ref/qwen3-moe-a", moe, sizeof(moe));
	for (size_t i = 0; i < sizeof(L) / sizeof(L[0]); i++) {
		struct hp_plan *p = make_plan(dirs[L[i].model], L[i].world, L[i].extra, 1, 64);

		pieces_tile(L[i].name, p);
		hp_plan_free(p);
	}
}

/* FSDP over N ranks: each rank's parameters, grads and moments are at most
 * 1/N of the whole plus one padded chunk per tensor. */
static void fsdp_scales(void)
{
	char dir[4096];
	struct hp_plan *one = make_plan(data("ref/qwen3-dense", dir, sizeof(dir)), 1, "", 1, 64);
	struct hp_rank_est r1, rn;

	if (!ok(one && !hp_plan_estimate(one, 0, &r1), "one-rank estimate")) {
		hp_plan_free(one);
		return;
	}
	for (int n = 2; n <= 8; n *= 2) {
		char extra[64];
		struct hp_plan *p;
		int64_t worst = 0, slack = 0;

		snprintf(extra, sizeof(extra), "fsdp_config: {dp_shard_size: %d}\n", n);
		p = make_plan(dir, n, extra, 1, 64);
		for (int r = 0; p && r < n; r++) {
			if (hp_plan_estimate(p, r, &rn))
				break;
			if (rn.param_bytes > worst)
				worst = rn.param_bytes;
		}
		for (int i = 0; p && i < p->nparams; i++)
			slack += 4 * (p->params[i].ndim > 1 ? p->params[i].shape[1] : 1);
		ok(p && worst <= r1.param_bytes / n + slack && worst >= r1.param_bytes / n,
		   "fsdp %d: the largest rank holds %lld bytes, 1/%d of %lld is %lld", n,
		   (long long)worst, n, (long long)r1.param_bytes, (long long)(r1.param_bytes / n));
		hp_plan_free(p);
	}
	hp_plan_free(one);
}

int main(void)
{
	const char *s = getenv("HP_SRC_DIR");

	snprintf(src, sizeof(src), "%s", s ? s : ".");
	spec_round_trip();
	config_round_trip();
	one_rank_is_the_model();
	layouts();
	fsdp_scales();
	return tap_done();
}
