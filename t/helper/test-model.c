/*
 * test-model.c - hp-test-tool subcommands that expose the model and the
 * safetensors comparison to shell tests.
 *
 *   logits -o OUT.safetensors MODEL_DIR ID...
 *       forward one sequence, write logits F32 [T, V] under "logits"
 *   teacher MODEL_DIR ID...
 *       teacher-forced argmax: for every position i < T-1 the argmax of the
 *       logits must be ID[i+1]; prints "N/M positions match", exit 1 if not all
 *   cmpst [--max-rel-l2 R] [--max-abs A] A.safetensors B.safetensors
 *       compare tensors of the same names; one line per tensor with the max
 *       absolute difference and the relative L2 error ||a-b||/||b||; exit 1
 *       when a bound is exceeded or the name sets differ
 */
#include <jansson.h>
#include <math.h>

#include "base/alloc.h"
#include "config/hfconfig.h"
#include "model/model.h"
#include "model/params.h"
#include "data/online.h"
#include "dist/optim.h"
#include "format/safetensors.h"
#include "tap.h"

int cmd_logits(int argc, char **argv);
int cmd_teacher(int argc, char **argv);
int cmd_cmpst(int argc, char **argv);

static int load(struct hp_model *m, const char *dir, int T)
{
	struct hp_model_spec s;
	struct hp_err e;

	hp_err_clear(&e);
	if (hp_hfconfig_load(&s, dir, &e) || hp_model_init(m, &s, 1, T, &e) || hp_model_load_hf(m, dir, &e)) {
		fprintf(stderr, "hp-test-tool: %s\n", e.msg);
		return -1;
	}
	return 0;
}

static int32_t *parse_ids(int n, char **argv)
{
	int32_t *ids = hp_malloc((size_t)n * sizeof(int32_t));

	for (int i = 0; ids && i < n; i++)
		ids[i] = (int32_t)strtol(argv[i], NULL, 10);
	return ids;
}

int cmd_logits(int argc, char **argv)
{
	struct hp_model m;
	struct hp_err e;
	const char *out;
	int32_t *ids;
	int T, rc = 1;

	if (argc < 5 || strcmp(argv[1], "-o")) {
		fprintf(stderr, "usage: hp-test-tool logits -o OUT.safetensors MODEL_DIR ID...\n");
		return 2;
	}
	out = argv[2];
	T = argc - 4;
	ids = parse_ids(T, argv + 4);
	if (!ids || load(&m, argv[3], T))
		goto done;
	hp_model_forward(&m, ids, NULL, NULL, 0, NULL, NULL, &e);
	{
		struct hp_st_entry ent = { .name = "logits", .dtype = HP_DTYPE_F32, .ndim = 2,
					   .shape = { T, m.spec.vocab }, .data = m.a.logits };
		hp_err_clear(&e);
		if (hp_st_write(out, 1, &ent, 0, NULL, NULL, &e))
			fprintf(stderr, "hp-test-tool: %s\n", e.msg);
		else
			rc = 0;
	}
	hp_model_release(&m);
done:
	hp_free(ids);
	return rc;
}

int cmd_teacher(int argc, char **argv)
{
	struct hp_model m;
	struct hp_err e;   /* a CPU forward of one process has no collective to fail */
	int32_t *ids;
	int T = argc - 2, match = 0, rc = 1;

	if (argc < 4) {
		fprintf(stderr, "usage: hp-test-tool teacher MODEL_DIR ID...\n");
		return 2;
	}
	ids = parse_ids(T, argv + 2);
	if (!ids || load(&m, argv[1], T))
		goto done;
	hp_model_forward(&m, ids, NULL, NULL, 0, NULL, NULL, &e);
	for (int i = 0; i + 1 < T; i++) {
		const float *l = m.a.logits + (long)i * m.spec.vocab;
		int best = 0;
		for (int v = 1; v < m.spec.vocab; v++)
			if (l[v] > l[best])
				best = v;
		if (best == ids[i + 1])
			match++;
		else
			printf("# position %d: argmax %d, next id %d\n", i, best, ids[i + 1]);
	}
	printf("%d/%d positions match\n", match, T - 1);
	rc = match == T - 1 ? 0 : 1;
	hp_model_release(&m);
done:
	hp_free(ids);
	return rc;
}

/*
 * cmpst [--max-rel-l2 R] [--max-abs A] [--floor F] A B: compare every tensor
 * of A with the one of the same name in B (the reference).
 *
 * The one tensor comparison of the shell tests, and why it is what it is:
 * a tensor t is judged by
 *     rel_l2(t) = ||a_t - b_t|| / max(||b_t||, F * rms(B) * sqrt(n_t))
 * where rms(B) is the root mean square of every element of B and n_t the
 * size of t.  Float rounding puts into each element an error of order
 * eps * (the magnitudes summed into it), and those magnitudes follow the
 * scale of the whole model's gradients (or weights), not the size of the
 * element's own result: a gradient that is small because its terms cancel
 * (a bias behind a norm layer, whose largest element can be 1e-9 while the
 * model's are 1e-3) carries the rounding of its large terms, and its error
 * relative to its own norm measures cancellation, not correctness.  So a
 * tensor is measured against its own norm, or, when that is below F times
 * what its norm would be at the model's typical element (F = 1 by default),
 * against that: an error that is 1e-5 of the model's typical element fails
 * in any tensor, a wrong tensor of typical size fails by its own norm.
 * --floor 0 gives the plain per-tensor relative error.  The floor is
 * tap_floor, the unit tests' (t/tap.h), so both judge a tensor alike.
 * --max-abs bounds every element's |a - b| (for logits, whose scale is O(1)).
 */
int cmd_cmpst(int argc, char **argv)
{
	double max_rel = INFINITY, max_abs = INFINITY, floor_f = 1.0;
	struct hp_st_file a = { 0 }, b = { 0 };
	struct hp_err e;
	int i = 1, bad = 0;
	double ss_all = 0, n_all = 0;
	struct cmp { double num, den, mabs; int ok; } *c = NULL;

	for (; i + 1 < argc && !strncmp(argv[i], "--", 2); i += 2) {
		if (!strcmp(argv[i], "--max-rel-l2"))
			max_rel = strtod(argv[i + 1], NULL);
		else if (!strcmp(argv[i], "--max-abs"))
			max_abs = strtod(argv[i + 1], NULL);
		else if (!strcmp(argv[i], "--floor"))
			floor_f = strtod(argv[i + 1], NULL);
		else
			break;
	}
	if (argc - i != 2) {
		fprintf(stderr, "usage: hp-test-tool cmpst [--max-rel-l2 R] [--max-abs A] [--floor F] A B\n");
		return 2;
	}
	hp_err_clear(&e);
	if (hp_st_open(&a, argv[i], &e) || hp_st_open(&b, argv[i + 1], &e)) {
		fprintf(stderr, "hp-test-tool: %s\n", e.msg);
		hp_st_close(&a);
		return 1;
	}
	if (a.ntensors != b.ntensors) {
		printf("tensor count differs: %zu vs %zu\n", a.ntensors, b.ntensors);
		bad = 1;
	}
	c = hp_calloc(a.ntensors + 1, sizeof(*c));
	for (size_t k = 0; c && k < a.ntensors; k++) {
		const struct hp_st_tensor *ta = &a.tensors[k], *tb = hp_st_find(&b, ta->name);
		float *x, *y;

		if (!tb || tb->numel != ta->numel) {
			printf("%s: missing or of another size in %s\n", ta->name, argv[i + 1]);
			bad = 1;
			continue;
		}
		x = hp_malloc((size_t)ta->numel * sizeof(float));
		y = hp_malloc((size_t)ta->numel * sizeof(float));
		if (!x || !y || hp_st_read_f32(ta, x, &e) || hp_st_read_f32(tb, y, &e)) {
			printf("%s: cannot read\n", ta->name);
			bad = 1;
		} else {
			for (int64_t j = 0; j < ta->numel; j++) {
				double d = (double)x[j] - y[j];
				c[k].num += d * d;
				c[k].den += (double)y[j] * y[j];
				if (fabs(d) > c[k].mabs || isnan(d))
					c[k].mabs = isnan(d) ? INFINITY : fabs(d);
			}
			c[k].ok = 1;
			ss_all += c[k].den;
			n_all += (double)ta->numel;
		}
		hp_free(x);
		hp_free(y);
	}
	for (size_t k = 0; c && k < a.ntensors; k++) {
		if (!c[k].ok)
			continue;
		double fl = n_all > 0 ? floor_f * tap_floor(sqrt(ss_all / n_all), (size_t)a.tensors[k].numel) : 0;
		double scale = sqrt(c[k].den) > fl ? sqrt(c[k].den) : fl;
		double rel = scale > 0 ? sqrt(c[k].num) / scale : sqrt(c[k].num);
		int fail = !(rel <= max_rel) || !(c[k].mabs <= max_abs);

		printf("%-50s max_abs %.3e rel_l2 %.3e%s%s\n", a.tensors[k].name, c[k].mabs, rel,
		       scale > sqrt(c[k].den) ? " (floor)" : "", fail ? "  FAIL" : "");
		bad |= fail;
	}
	if (!c)
		bad = 1;
	hp_free(c);
	hp_st_close(&a);
	hp_st_close(&b);
	return bad;
}

/*
 * packcheck MODEL_DIR DATA T
 *     pack the documents of DATA (online mode, model's tokenizer) into one
 *     row of T, run the model on the packed row, then run each whole
 *     document alone, and compare every document's summed loss; prints one
 *     line per document and exits 1 if any differs by more than 1e-5
 *     relative (float summation order differs between the two runs).
 */
int cmd_packcheck(int argc, char **argv);

/* The reference cross-entropy of one position. */
static double token_loss(const float *l, int V, int32_t t)
{
	double loss;
	long n;

	hp_cross_entropy_fwd(&loss, &n, l, &t, 1, V);
	return loss;
}

int cmd_packcheck(int argc, char **argv)
{
	struct hp_online *on = NULL;
	struct hp_model m, alone;
	struct hp_err e;
	int32_t *in = NULL, *lb = NULL, *sg = NULL;
	int T, rc = 1, ndocs = 0, bad = 0;

	if (argc != 4) {
		fprintf(stderr, "usage: hp-test-tool packcheck MODEL_DIR DATA T\n");
		return 2;
	}
	T = atoi(argv[3]);
	hp_err_clear(&e);
	char *paths[1] = { argv[2] };
	struct hp_online_opts oo = { .paths = paths, .npaths = 1, .tokenizer = argv[1], .seq_length = T };
	in = hp_malloc((size_t)T * 4);
	lb = hp_malloc((size_t)T * 4);
	sg = hp_malloc((size_t)T * 4);
	if (!in || !lb || !sg || hp_online_open(&on, &oo, &e) || hp_online_next(on, 1, in, lb, sg, &e)) {
		fprintf(stderr, "hp-test-tool: %s\n", e.msg);
		goto done;
	}
	if (load(&m, argv[1], T))
		goto done;
	hp_model_forward(&m, in, NULL, sg, 0, NULL, NULL, &e);
	for (int s0 = 0; s0 < T;) {
		int s1 = s0 + 1;
		while (s1 < T && sg[s1] == s0)
			s1++;
		if (lb[s0] == -100) {          /* padding */
			s0 = s1;
			continue;
		}
		double packed = 0, single = 0;
		for (int i = s0; i < s1; i++)
			packed += token_loss(m.a.logits + (long)i * m.spec.vocab, m.spec.vocab, lb[i]);
		if (load(&alone, argv[1], s1 - s0)) {
			hp_model_release(&m);
			goto done;
		}
		hp_model_forward(&alone, in + s0, NULL, NULL, 0, NULL, NULL, &e);
		for (int i = s0; i < s1; i++)
			single += token_loss(alone.a.logits + (long)(i - s0) * m.spec.vocab, m.spec.vocab, lb[i]);
		hp_model_release(&alone);
		double rel = fabs(packed - single) / fabs(single);
		printf("document at %d, %d tokens: packed %.9g alone %.9g rel %.2e%s\n", s0, s1 - s0,
		       packed, single, rel, rel > 1e-5 ? "  FAIL" : "");
		bad |= rel > 1e-5;
		ndocs++;
		s0 = s1;
	}
	hp_model_release(&m);
	printf("%d documents in the row\n", ndocs);
	rc = bad || ndocs < 2;
done:
	hp_online_free(on);
	hp_free(in);
	hp_free(lb);
	hp_free(sg);
	return rc;
}

/*
 * refstep [--steps K] [--dump-grads F] [--no-router-logits] MODEL_DIR REFERENCE.json
 *     the reference batch of REFERENCE.json (batch.input_ids, batch.target_ids,
 *     -100 allowed) trained for K steps (default 5) through the library's
 *     model and optimizer exactly as hp-train runs them: AdamW lr 1e-3,
 *     betas (0.9, 0.95), eps 1e-8, weight decay 0.1 except names holding
 *     "norm" or "bias", clipping at 1.0, constant LR.  One JSON line a step:
 *     {"step", "loss", "ce", "aux", "grad_norm"}; --dump-grads writes step 1's
 *     gradients.  hp-train itself cannot take -100 targets from a Megatron
 *     file, hence this door for the Qwen3 goldens.
 */
int cmd_refstep(int argc, char **argv);

int cmd_refstep(int argc, char **argv)
{
	const char *dump = NULL;
	int steps = 5, no_aux = 0, i = 1, B = 0, T = 0, rc = 1;
	struct hp_model_spec spec;
	struct hp_model m;
	struct hp_optim opt;
	struct hp_config cfg;
	struct hp_err e;
	json_t *root = NULL, *in, *tg;
	json_error_t jerr;
	int32_t *ids = NULL, *tgt = NULL;
	static char *no_decay[] = { "norm", "bias" };

	for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
		if (!strcmp(argv[i], "--steps") && i + 1 < argc)
			steps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--dump-grads") && i + 1 < argc)
			dump = argv[++i];
		else if (!strcmp(argv[i], "--no-router-logits"))
			no_aux = 1;
		else
			break;
	}
	if (argc - i != 2) {
		fprintf(stderr, "usage: hp-test-tool refstep [--steps K] [--dump-grads F] [--no-router-logits] "
			"MODEL_DIR REFERENCE.json\n");
		return 2;
	}
	hp_err_clear(&e);
	memset(&m, 0, sizeof(m));
	memset(&opt, 0, sizeof(opt));
	if (!(root = json_load_file(argv[i + 1], 0, &jerr)) ||
	    !(in = json_object_get(json_object_get(root, "batch"), "input_ids")) ||
	    !(tg = json_object_get(json_object_get(root, "batch"), "target_ids")) ||
	    !json_is_array(in) || !(B = (int)json_array_size(in)) ||
	    !(T = (int)json_array_size(json_array_get(in, 0)))) {
		fprintf(stderr, "hp-test-tool: '%s': no batch.input_ids/target_ids\n", argv[i + 1]);
		goto done;
	}
	ids = hp_malloc((size_t)B * T * 4);
	tgt = hp_malloc((size_t)B * T * 4);
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++) {
			ids[b * T + t] = (int32_t)json_integer_value(json_array_get(json_array_get(in, b), (size_t)t));
			tgt[b * T + t] = (int32_t)json_integer_value(json_array_get(json_array_get(tg, b), (size_t)t));
		}
	if (hp_hfconfig_load(&spec, argv[i], &e)) {
		fprintf(stderr, "hp-test-tool: %s\n", e.msg);
		goto done;
	}
	if (no_aux)
		spec.output_router_logits = 0;
	if (hp_model_init(&m, &spec, B, T, &e) || hp_model_load_hf(&m, argv[i], &e)) {
		fprintf(stderr, "hp-test-tool: %s\n", e.msg);
		goto done;
	}
	memset(&cfg, 0, sizeof(cfg));
	cfg.optimizer.lr = 1e-3;
	cfg.optimizer.beta1 = 0.9;
	cfg.optimizer.beta2 = 0.95;
	cfg.optimizer.eps = 1e-8;
	cfg.optimizer.weight_decay = 0.1;
	cfg.optimizer.no_decay_params = no_decay;
	cfg.optimizer.nno_decay_params = 2;
	cfg.lr_scheduler.style = HP_LR_CONSTANT;
	cfg.lr_scheduler.lr = cfg.optimizer.lr;   /* one rate under both names, as the config resolves it */
	cfg.training.train_iters = steps;
	cfg.training.max_grad_norm = 1.0;
	if (hp_optim_init(&opt, &m, &cfg, 1, &e)) {
		fprintf(stderr, "hp-test-tool: %s\n", e.msg);
		goto done;
	}
	for (int s = 1; s <= steps; s++) {
		double ce_sum;
		long cnt;
		double st[HP_ST_N];
		hp_model_zero_grad(&m);
		hp_model_stats_zero(&m);
		if (hp_model_forward(&m, ids, tgt, NULL, 0, &ce_sum, &cnt, &e) || hp_model_stats(&m, st, &e)) {
			fprintf(stderr, "hp-test-tool: %s\n", e.msg);
			goto done;
		}
		double ce = ce_sum / cnt, aux = st[HP_ST_AUX];
		double loss = ce + (spec.output_router_logits && m.n_moe ? spec.router_aux_loss_coef * aux : 0);
		if (hp_model_backward(&m, ids, tgt, (double)cnt, 1.0, &e)) {
			fprintf(stderr, "hp-test-tool: %s\n", e.msg);
			goto done;
		}
		if (s == 1 && dump && hp_model_save_grads(&m, dump, 0, NULL, NULL, &e)) {
			fprintf(stderr, "hp-test-tool: %s\n", e.msg);
			goto done;
		}
		double norm, ss = 0;   /* the CPU backend's memory is the host's */
		hp_optim_grad_sumsq(&opt, &ss, &e);
		norm = sqrt(ss);
		printf("{\"step\": %d, \"loss\": %.10g, \"ce\": %.10g, \"aux\": %.10g, \"grad_norm\": %.10g}\n",
		       s, loss, ce, aux, norm);
		opt.max_grad_norm = 1.0;
		hp_optim_clip(&opt, norm);
		hp_optim_step(&opt, hp_lr_at(&opt, s), NULL);
	}
	rc = 0;
done:
	hp_optim_release(&opt);
	hp_model_release(&m);
	hp_free(ids);
	hp_free(tgt);
	json_decref(root);
	return rc;
}

/*
 * stget FILE.safetensors NAME
 *     print a tensor's values as float32, one a line (%.9g: each float's
 *     exact decimal round trip)
 */
int cmd_stget(int argc, char **argv);

int cmd_stget(int argc, char **argv)
{
	struct hp_st_file f = { 0 };
	const struct hp_st_tensor *t;
	struct hp_err e;
	float *x = NULL;
	int rc = 1;

	if (argc != 3) {
		fprintf(stderr, "usage: hp-test-tool stget FILE NAME\n");
		return 2;
	}
	hp_err_clear(&e);
	if (hp_st_open(&f, argv[1], &e)) {
		fprintf(stderr, "hp-test-tool: %s\n", e.msg);
		return 1;
	}
	if (!(t = hp_st_find(&f, argv[2])))
		fprintf(stderr, "hp-test-tool: '%s': no tensor '%s'\n", argv[1], argv[2]);
	else if (!(x = hp_malloc((size_t)t->numel * sizeof(float)+ 1)) || hp_st_read_f32(t, x, &e))
		fprintf(stderr, "hp-test-tool: '%s': cannot read '%s'\n", argv[1], argv[2]);
	else
		rc = 0;
	for (int64_t i = 0; !rc && i < t->numel; i++)
		printf("%.9g\n", x[i]);
	hp_free(x);
	hp_st_close(&f);
	return rc;
}

/*
 * stdrop IN.safetensors OUT.safetensors NAME...
 *     copy a safetensors file without the named tensors (for bad-input tests)
 */
int cmd_stdrop(int argc, char **argv);

int cmd_stdrop(int argc, char **argv)
{
	struct hp_st_file f = { 0 };
	struct hp_st_entry *ent;
	struct hp_err e;
	size_t n = 0;
	int rc = 1;

	if (argc < 4) {
		fprintf(stderr, "usage: hp-test-tool stdrop IN OUT NAME...\n");
		return 2;
	}
	hp_err_clear(&e);
	if (hp_st_open(&f, argv[1], &e)) {
		fprintf(stderr, "hp-test-tool: %s\n", e.msg);
		return 1;
	}
	ent = hp_calloc(f.ntensors + 1, sizeof(*ent));
	for (size_t i = 0; ent && i < f.ntensors; i++) {
		const struct hp_st_tensor *t = &f.tensors[i];
		int drop = 0;
		for (int k = 3; k < argc; k++)
			drop |= !strcmp(t->name, argv[k]);
		if (drop)
			continue;
		ent[n].name = t->name;
		ent[n].dtype = t->dtype;
		ent[n].ndim = t->ndim;
		memcpy(ent[n].shape, t->shape, sizeof(t->shape));
		ent[n].data = t->data;
		n++;
	}
	if (ent && !hp_st_write(argv[2], n, ent, 0, NULL, NULL, &e))
		rc = 0;
	else
		fprintf(stderr, "hp-test-tool: %s\n", e.msg);
	hp_free(ent);
	hp_st_close(&f);
	return rc;
}

/*
 * spec MODEL_DIR
 *     the spec hp reads from MODEL_DIR/config.json, as the plan's model
 *     section holds it (hp_model_spec_json), with its parameter count and
 *     its RoPE as hp computes it: "hp_rope": {"type", "inv_freq_f32": [...],
 *     "attention_factor"} (the inverse frequencies rounded to float32, as
 *     transformers holds them).
 */
int cmd_spec(int argc, char **argv);

int cmd_spec(int argc, char **argv)
{
	struct hp_model_spec spec;
	struct hp_err e = { 0 };
	double f[HP_ROPE_MAX_HALF], af;
	json_t *j, *inv;
	char *t;

	if (argc != 2) {
		fprintf(stderr, "usage: hp-test-tool spec MODEL_DIR\n");
		return 2;
	}
	if (hp_hfconfig_load(&spec, argv[1], &e)) {
		fprintf(stderr, "hp-test-tool: %s\n", e.msg);
		return 1;
	}
	j = hp_model_spec_json(&spec);
	json_object_set_new(j, "hp_parameters", json_integer(hp_model_spec_nparams(&spec)));
	hp_model_spec_rope(&spec, f, &af);
	inv = json_array();
	for (int i = 0; i < hp_model_spec_rope_dim(&spec) / 2; i++)
		json_array_append_new(inv, json_real((float)f[i]));
	json_object_set_new(j, "hp_rope", json_pack("{s:s, s:o, s:f}", "type",
						     hp_rope_type_name(spec.rope.type), "inv_freq_f32", inv,
						     "attention_factor", af));
	t = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	puts(t);
	free(t);
	json_decref(j);
	return 0;
}
