/*
 * hp-plan - resolve a YAML config into a placement plan ("hp-plan/1" JSON),
 * or explain a plan as tables.
 *
 * Thin client of lib/plan/plan.h: load the config and the model's config.json,
 * call hp_plan_resolve() and write the plan.  The world size is an input,
 * not a property of this process, so a plan for 64 ranks can be made on a
 * laptop.  --explain reads either a plan (checking its hash) or a config,
 * and prints from the JSON text in both cases, so what it shows is exactly
 * what the file holds.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "common-main.h"
#include "config/config.h"
#include "model/params.h"
#include "config/hfconfig.h"
#include "plan/plan.h"
#include "plan/schedule.h"

const char hp_tool_name[] = "hp-plan";

static const char usage_str[] =
	"hp-plan CONFIG.yaml [--world N] [--a.b=c ...] [-o PLAN.json]\n"
	"   or: hp-plan --explain PLAN.json|CONFIG.yaml [--world N] [--a.b=c ...]";

static void help(void)
{
	printf("usage: %s\n\n"
	       "Resolve a HyperParallel-style YAML config into a placement plan.\n\n"
	       "  --world N             the number of ranks (else the MPI world when > 1,\n"
	       "                        else SLURM_NTASKS)\n"
	       "  --a.b=c               override config key a.b with the YAML value c\n"
	       "  -o, --output FILE     write the plan to FILE (atomically); '-' or absent: stdout\n"
	       "  --explain             print meshes, placements and kernels as tables\n"
	       "  -h, --help            show this help\n"
	       "      --version         show the version\n\n"
	       "See hp-plan(1) and hp-plan(5).\n", usage_str);
}

static int parse_world(const char *s, int *w)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 1 || v > 1 << 20)
		return -1;
	*w = (int)v;
	return 0;
}

/* Config and spec to plan, the model crop applied as lib/train/train.c does. */
static int resolve(struct hp_plan **p, const char *path, int novr, char **ovr, int world,
		   struct hp_err *e)
{
	struct hp_config c;
	struct hp_model_spec s;
	int rc;

	memset(&c, 0, sizeof(c));
	if ((rc = hp_config_load(&c, path, novr, ovr, e)))
		return rc;
	if ((rc = hp_hfconfig_load(&s, c.model.path, e)))
		goto out;
	if (c.model.num_hidden_layers > 0) {
		if (c.model.source != HP_MODEL_FROM_CONFIG) {
			rc = hp_err_set(e, HP_ECONFIG, "'%s': $.model.num_hidden_layers: cropping applies to "
					"from_config models only", c.path);
			goto out;
		}
		if (c.model.num_hidden_layers < s.n_layers)
			s.n_layers = (int)c.model.num_hidden_layers;
	}
	rc = hp_plan_resolve(p, &c, &s, world, e);
out:
	hp_config_release(&c);
	return rc;
}

/* --- explain ------------------------------------------------------------------ */

static void print_groups(json_t *groups)
{
	const char *dim;
	json_t *list;

	json_object_foreach(groups, dim, list) {
		size_t i, j;
		json_t *g, *r;

		printf("  %-14s", dim);
		json_array_foreach(list, i, g) {
			printf(" {");
			json_array_foreach(g, j, r)
				printf("%s%lld", j ? "," : "", (long long)json_integer_value(r));
			printf("}");
		}
		printf("\n");
	}
}

/* 1536 -> "1.5 KiB" */
static const char *human(long long b, char *buf, size_t n)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double x = (double)b;
	int u = 0;

	while (x >= 1024 && u < 4) {
		x /= 1024;
		u++;
	}
	snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", x, unit[u]);
	return buf;
}

/* "0-3,6" from a list of ranks */
static const char *rank_list(json_t *ranks, char *buf, size_t n)
{
	size_t i, at = 0, len = json_array_size(ranks);

	buf[0] = '\0';
	for (i = 0; i < len && at < n; ) {
		long long a = json_integer_value(json_array_get(ranks, i)), b = a;
		size_t j = i + 1;

		while (j < len && json_integer_value(json_array_get(ranks, j)) == b + 1)
			b = json_integer_value(json_array_get(ranks, j++));
		at += (size_t)snprintf(buf + at, n - at, b > a ? "%s%lld-%lld" : "%s%lld", at ? "," : "", a, b);
		i = j;
	}
	return buf;
}

static void explain_estimates(json_t *est)
{
	json_t *step = json_object_get(est, "step"), *r, *c;
	char h[7][32], rl[256];
	size_t i, j;
	int dev = 0;

	printf("\nestimates per rank: one step is %lld micro-batch(es) of %lld x %lld tokens; "
	       "params %s, reduce %s, activation checkpoint %s, cp %s\n",
	       (long long)json_integer_value(json_object_get(step, "grad_accumulation")),
	       (long long)json_integer_value(json_object_get(step, "micro_batch_size")),
	       (long long)json_integer_value(json_object_get(step, "seq_length")),
	       json_string_value(json_object_get(step, "param_dtype")),
	       json_string_value(json_object_get(step, "reduce_dtype")),
	       json_string_value(json_object_get(step, "activation_checkpoint")),
	       json_string_value(json_object_get(step, "cp_mode")));
	json_array_foreach(json_object_get(est, "per_rank"), i, r)
		dev |= json_object_get(r, "device_bytes") != NULL;
	printf("  %-16s %12s %12s %12s %12s %12s %12s%s\n", "ranks", "params", "grads", "optimizer",
	       "activations", "fsdp gather", "host", dev ? "       device" : "");
	json_array_foreach(json_object_get(est, "per_rank"), i, r) {
		char d[48] = "";

		if (dev)
			snprintf(d, sizeof(d), " %12s", human(json_integer_value(json_object_get(r, "device_bytes")), h[6],
							     sizeof(h[6])));
		printf("  %-16s %12s %12s %12s %12s %12s %12s%s\n", rank_list(json_object_get(r, "ranks"), rl, sizeof(rl)),
		       human(json_integer_value(json_object_get(r, "param_bytes")), h[0], sizeof(h[0])),
		       human(json_integer_value(json_object_get(r, "grad_bytes")), h[1], sizeof(h[1])),
		       human(json_integer_value(json_object_get(r, "optimizer_bytes")), h[2], sizeof(h[2])),
		       human(json_integer_value(json_object_get(r, "activation_bytes")), h[3], sizeof(h[3])),
		       human(json_integer_value(json_object_get(r, "gathered_bytes")), h[4], sizeof(h[4])),
		       human(json_integer_value(json_object_get(r, "host_bytes")), h[5], sizeof(h[5])), d);
	}
	json_array_foreach(json_object_get(est, "per_rank"), i, r) {
		printf("\ntraffic per step, ranks %s (bytes of each rank's send buffers)\n",
		       rank_list(json_object_get(r, "ranks"), rl, sizeof(rl)));
		printf("  %-14s %-15s %8s %16s\n", "dim", "collective", "calls", "bytes");
		json_array_foreach(json_object_get(r, "comm"), j, c) {
			json_t *rb = json_object_get(c, "routed_bytes");

			printf("  %-14s %-15s %8lld %16lld", json_string_value(json_object_get(c, "dim")),
			       json_string_value(json_object_get(c, "op")),
			       (long long)json_integer_value(json_object_get(c, "calls")),
			       (long long)json_integer_value(json_object_get(c, "bytes")));
			if (rb)
				printf("  (%lld of them for even routing)", (long long)json_integer_value(rb));
			printf("\n");
		}
		if (!json_array_size(json_object_get(r, "comm")))
			printf("  none\n");
	}
}

/* The stages and the schedule as a grid: one row per stage, one column
 * per time unit (a forward takes 1, a backward 2), Fk / Bk the forward and
 * backward of micro-batch k (with chunks Fk.c, of chunk c), . idle. */
static void explain_pipeline(const struct hp_plan *p)
{
	int pp = (int)p->pp, G = (int)p->accum, vpp = p->vpp, n = 2 * G * vpp, w = vpp > 1 ? 6 : 4;
	int *start = hp_calloc((size_t)pp * n + 1, sizeof(int)), len, per[HP_MAX_VPP];
	struct hp_pp_action *act = hp_calloc((size_t)n + 1, sizeof(*act));
	long sw = p->world / pp;

	if (!start || !act || (len = hp_pp_timeline(p->pp_schedule, pp, vpp, G, start)) <= 0) {
		hp_free(start);
		hp_free(act);
		return;
	}
	printf("\npipeline (%s, %d micro-batches per step", hp_pp_schedule_name(p->pp_schedule, vpp), G);
	if (vpp > 1)
		printf(", %d chunks per stage", vpp);
	printf(", %d units with a forward 1 and a backward 2: bubble %.4f)\n", len, 1.0 - 3.0 * G * vpp / len);
	for (int s = 0; s < pp; s++) {
		printf("  stage %d  layers", s);
		for (int c = 0; c < vpp; c++)
			printf(" [%d, %d)", p->stage_l0[c * pp + s], p->stage_l0[c * pp + s + 1]);
		printf("  ranks %ld..%ld  %d micro-batch%s in flight", s * sw, (s + 1) * sw - 1,
		       hp_pp_in_flight(p->pp_schedule, pp, vpp, s, G, per), vpp > 1 ? " chunks" : "es");
		for (int c = 0; vpp > 1 && c < vpp; c++)
			printf("%s%d", c ? " + " : " (", per[c]);
		printf("%s\n", vpp > 1 ? ")" : "");
	}
	for (int s = 0; s < pp; s++) {
		int t = 0;

		hp_pp_actions(p->pp_schedule, pp, vpp, s, G, act);
		printf("stage %d |", s);
		for (int i = 0; i < n; i++) {
			char cell[32];

			for (; t < start[s * n + i]; t++)
				printf("%*s", w, "");
			if (vpp > 1)
				snprintf(cell, sizeof(cell), "%c%d.%d", act[i].backward ? 'B' : 'F', act[i].mb, act[i].chunk);
			else
				snprintf(cell, sizeof(cell), "%c%d", act[i].backward ? 'B' : 'F', act[i].mb);
			for (int u = 0; u < (act[i].backward ? 2 : 1); u++, t++)
				printf(" %-*s", w - 1, cell);
		}
		printf("\n");
	}
	hp_free(start);
	hp_free(act);
}

static void explain(json_t *plan, struct hp_plan *p)
{
	json_t *v, *x, *mesh;
	const char *k;
	size_t i;

	printf("plan %s  world %lld\n\n", json_string_value(json_object_get(plan, "hash")),
	       (long long)json_integer_value(json_object_get(plan, "world_size")));
	printf("model\n");
	printf("  %-18s %s (%s)\n", "model_type", p->spec.model_type, p->spec.architecture);
	printf("  %-18s %lld\n", "parameters", hp_model_spec_nparams(&p->spec));
	printf("  %-18s %s, theta %g", "rope", hp_rope_type_name(p->spec.rope.type), p->spec.rope.theta);
	if (p->spec.rope.type != HP_ROPE_DEFAULT)
		printf(", factor %g", p->spec.rope.factor);
	printf("\n");
	if (p->spec.sliding_window)
		printf("  %-18s %d on %d of %d layers\n", "sliding_window", p->spec.sliding_window,
		       hp_model_spec_sliding_layers(&p->spec), p->spec.n_layers);
	if (p->spec.n_experts)
		printf("  %-18s %d of intermediate %d, top-%d%s\n", "experts", p->spec.n_experts,
		       p->spec.moe_intermediate, p->spec.top_k, p->spec.moe_bias ? ", with biases" : "");
	if (p->spec.attn_sinks)
		printf("  %-18s one per head (flash attention on every layer)\n", "attention sinks");
	if (p->spec.mla)
		printf("  %-18s q %s, kv latent %d, per head qk %d + %d RoPE'd (%s), v %d, softmax x %.6g\n",
		       "latent attention", p->spec.q_lora_rank ? "latent" : "q_proj", p->spec.kv_lora_rank,
		       p->spec.qk_nope, p->spec.qk_rope, p->spec.rope_interleave ? "interleaved" : "halves",
		       p->spec.v_head, p->spec.attn_mscale);
	if (p->spec.router_group)
		printf("  %-18s sigmoid, correction bias, top-%d of %d groups, x %g; %d shared (intermediate %d)\n",
		       "router", p->spec.topk_group, p->spec.n_group, p->spec.routed_scaling, p->spec.n_shared,
		       p->spec.shared_inter);
	if (p->spec.vl)
		printf("  %-18s the language model of a %s folder (model.language_model.*); its vision tower is "
		       "carried through export\n", "multimodal", hp_model_spec_vl_arch(&p->spec));
	if (p->spec.n_linear)
		printf("  %-18s Gated DeltaNet on %d of %d layers: %d key heads of %d, %d value heads of %d, conv %d "
		       "(%s projections)\n", "linear attention", p->spec.n_linear, p->spec.n_layers, p->spec.lin_kh,
		       p->spec.lin_kd, p->spec.lin_vh, p->spec.lin_vd, p->spec.lin_conv,
		       p->spec.lin_split ? "split" : "fused");
	if (p->spec.attn_gate)
		printf("  %-18s gated (sigmoid), RoPE on %d of head_dim %d, zero-centred norms\n", "full attention",
		       hp_model_spec_rope_dim(&p->spec), p->spec.head_dim);
	if (p->spec.shared_gate)
		printf("  %-18s intermediate %d, times sigmoid(shared_expert_gate)\n", "shared expert",
		       p->spec.shared_inter);
	if (p->spec.moe_act == HP_MOE_ACT_CLAMPED)
		printf("  %-18s clamped SwiGLU, limit %g, alpha %g\n", "expert activation", p->spec.swiglu_limit,
		       p->spec.swiglu_alpha);
	if (p->spec.unknown[0])
		printf("  %-18s %s\n", "unknown keys", p->spec.unknown);
	printf("\n");
	printf("parallel\n");
	json_object_foreach(json_object_get(plan, "parallel"), k, v)
		if (json_is_boolean(v))
			printf("  %-18s %s\n", k, json_is_true(v) ? "true" : "false");
		else
			printf("  %-18s %lld\n", k, (long long)json_integer_value(v));
	printf("\nmeshes\n");
	json_object_foreach(json_object_get(plan, "meshes"), k, mesh) {
		size_t j;
		json_t *d;

		printf("%s (", k);
		json_array_foreach(json_object_get(mesh, "dims"), j, d)
			printf("%s%s=%lld", j ? ", " : "", json_string_value(d),
			       (long long)json_integer_value(json_array_get(json_object_get(mesh, "sizes"), j)));
		printf(")\n");
		print_groups(json_object_get(mesh, "groups"));
	}
	if (p && p->pp > 1)
		explain_pipeline(p);
	printf("\nparams\n  %-48s %-12s %-7s %-s\n", "name", "shape", "mesh", "placements  [fsdp unit]");
	json_array_foreach(json_object_get(plan, "params"), i, v) {
		char shape[48], pls[256];
		size_t n = 0, j;

		shape[0] = pls[0] = '\0';
		json_array_foreach(json_object_get(v, "shape"), j, x)
			n += (size_t)snprintf(shape + n, n < sizeof(shape) ? sizeof(shape) - n : 0, "%s%lld",
					      j ? "x" : "", (long long)json_integer_value(x));
		n = 0;
		json_object_foreach(json_object_get(v, "placements"), k, x)
			n += (size_t)snprintf(pls + n, n < sizeof(pls) ? sizeof(pls) - n : 0, "%s%s=%s",
					      n ? " " : "", k, json_string_value(x));
		if ((x = json_object_get(v, "ep_owner")))
			n += (size_t)snprintf(pls + n, n < sizeof(pls) ? sizeof(pls) - n : 0, " ep_owner=%lld",
					      (long long)json_integer_value(x));
		printf("  %-48s %-12s %-7s %s  [%s]\n", json_string_value(json_object_get(v, "name")), shape,
		       json_string_value(json_object_get(v, "mesh")), pls,
		       json_string_value(json_object_get(v, "fsdp_unit")));
	}
	printf("\nmodules\n  %-36s %-24s %-22s %s\n", "name", "class", "kernel", "override");
	json_array_foreach(json_object_get(plan, "modules"), i, v) {
		x = json_object_get(v, "override");
		printf("  %-36s %-24s %-22s ", json_string_value(json_object_get(v, "name")),
		       json_string_value(json_object_get(v, "class")),
		       json_string_value(json_object_get(v, "kernel")));
		if (json_is_integer(x))
			printf("plan_overrides[%lld]\n", (long long)json_integer_value(x));
		else
			printf("-\n");
	}
	explain_estimates(json_object_get(plan, "estimates"));
	printf("\nwarnings\n");
	for (int w = 0; p && w < p->nwarnings; w++)
		printf("  %s\n", p->warnings[w]);
	if (!p || !p->nwarnings)
		printf("  none\n");
}

static int is_json_file(const char *path)
{
	FILE *f = fopen(path, "r");
	int ch = EOF;

	if (!f)
		return 0;
	do
		ch = fgetc(f);
	while (ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r');
	fclose(f);
	return ch == '{';
}

static int run_explain(const char *path, int novr, char **ovr, int world, struct hp_err *e)
{
	struct hp_plan *p = NULL;
	json_t *j = NULL;
	char *buf = NULL;
	size_t len = 0;
	json_error_t je;
	FILE *m;
	int rc;

	if (is_json_file(path))
		rc = hp_plan_load(&p, NULL, path, e);
	else
		rc = resolve(&p, path, novr, ovr, world, e);
	if (rc)
		return rc;
	/* print from the plan's JSON, so the tables show exactly what the file holds */
	if (!(m = open_memstream(&buf, &len))) {
		hp_plan_free(p);
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	}
	rc = hp_plan_write_json(p, m, e);
	fclose(m);
	if (!rc && !(j = json_loadb(buf, len, 0, &je)))
		rc = hp_err_set(e, HP_EINVAL, "the plan does not parse back: %s", je.text);
	free(buf);
	if (!rc)
		explain(j, p);
	json_decref(j);
	hp_plan_free(p);
	return rc;
}

int cmd_main(int argc, char **argv, MPI_Comm comm)
{
	static const struct option longopts[] = {
		{ "world", required_argument, NULL, 'w' },
		{ "output", required_argument, NULL, 'o' },
		{ "explain", no_argument, NULL, 'x' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	const char *out = NULL;
	struct hp_plan *p = NULL;
	struct hp_err err;
	char **rest, **ovr;
	int nrest = 0, novr = 0, rank = 0, nproc = 1, world = 0, expl = 0, rc, c;

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &nproc);
	hp_err_clear(&err);
	if (hp_split_overrides(argc, argv, longopts, &rest, &nrest, &ovr, &novr)) {
		hp_err_set(&err, HP_ENOMEM, "out of memory");
		return die_err(&err);
	}
	opterr = 0;
	rc = -1;
	while (rc < 0 && (c = getopt_long(nrest, rest, "o:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'w':
			if (parse_world(optarg, &world))
				rc = usage_error(usage_str, "--world: '%s' is not a positive integer", optarg);
			break;
		case 'o': out = optarg; break;
		case 'x': expl = 1; break;
		case 'h': if (!rank) help(); rc = 0; break;
		case 'V': if (!rank) printf("hp-plan %s\n", HP_VERSION); rc = 0; break;
		default:
			rc = usage_error(usage_str, "unknown option '%s'", rest[optind - 1]);
		}
	}
	if (rc < 0) {
		if (optind >= nrest)
			rc = usage_error(usage_str, "missing %s", expl ? "PLAN.json or CONFIG.yaml" : "CONFIG.yaml");
		else if (optind + 1 < nrest)
			rc = usage_error(usage_str, "unexpected argument '%s' (overrides look like --a.b=c)",
					 rest[optind + 1]);
	}
	if (rc < 0 && !world) {
		const char *st = getenv("SLURM_NTASKS");

		if (nproc > 1)
			world = nproc;
		else if (st && *st && parse_world(st, &world))
			rc = usage_error(usage_str, "SLURM_NTASKS: '%s' is not a positive integer", st);
	}
	if (rc < 0 && !world && !(expl && is_json_file(rest[optind])))
		rc = usage_error(usage_str, "no world size: give --world N, run under mpiexec or set SLURM_NTASKS");
	if (rc < 0 && expl) {
		rc = rank ? 0 : run_explain(rest[optind], novr, ovr, world, &err);
		rc = rc ? die_err(&err) : 0;
	} else if (rc < 0) {
		if ((rc = resolve(&p, rest[optind], novr, ovr, world, &err)) == 0) {
			for (int i = 0; i < p->nwarnings; i++)
				hp_warn("%s", p->warnings[i]);
			/* the plan is the same on every rank; one writes it */
			if (rank == 0)
				rc = !out || !strcmp(out, "-") ? hp_plan_write_json(p, stdout, &err)
							       : hp_plan_save(p, out, &err);
		}
		rc = rc ? die_err(&err) : 0;
	}
	hp_plan_free(p);
	hp_free(rest);
	hp_free(ovr);
	return rc;
}
