/*
 * hp-verify - run steps of a parallel layout and of the gathered
 * one-process reference in one MPI job, and name the first module whose
 * output, gradient or updated weights differ.
 *
 * Thin client: the run is hp-train's (lib/train/train.c) with the comparison of
 * lib/dist/verify.c switched on; this parses the command line and prints the
 * table hp_train_run leaves.
 */
#include <getopt.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/log.h"
#include "common-main.h"
#include "train/train.h"

const char hp_tool_name[] = "hp-verify";

static const char usage_str[] =
	"mpiexec -n N hp-verify CONFIG.yaml|PLAN.json [--a.b=c ...] [--shards DIR] [--steps K]\n"
	"                [--rtol R] [--param-rtol P] [--atol A] [--json]";

static void help(void)
{
	printf("usage: %s\n\n"
	       "Train K steps of the config's (or plan's) layout over the job's ranks and of the\n"
	       "one-process model on rank 0, and compare every module output, gradient and\n"
	       "parameter after each update.\n\n"
	       "  --a.b=c            override config key a.b with the YAML value c (not with a plan)\n"
	       "  --shards DIR       start from hp-convert's shards instead of the model's folder\n"
	       "  --steps K          compare K steps (default 2)\n"
	       "  --rtol R           relative L2 error an output or gradient may have (default 1e-5)\n"
	       "  --param-rtol P     and a weight after the update (default 1e-3)\n"
	       "  --atol A           or the largest absolute error (default 1e-7)\n"
	       "  --json             print the table as one JSON object\n"
	       "  -h, --help         show this help\n"
	       "      --version      show the version\n\n"
	       "Exit status 0: everything matches; 1: a difference (named on standard error).\n"
	       "See hp-verify(1).\n", usage_str);
}

/* A positive real, or -1. */
static double real_arg(const char *s)
{
	char *end;
	double x = strtod(s, &end);

	return *s && !*end && x > 0 ? x : -1;
}

int cmd_main(int argc, char **argv, MPI_Comm comm)
{
	static const struct option longopts[] = {
		{ "shards", required_argument, NULL, 's' },
		{ "steps", required_argument, NULL, 'k' },
		{ "rtol", required_argument, NULL, 'r' },
		{ "atol", required_argument, NULL, 'a' },
		{ "param-rtol", required_argument, NULL, 'p' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct hp_train_opts o = { 0 };
	struct hp_err err;
	char **rest, **ovr;
	int nrest = 0, novr = 0, rank = 0, rc, c;

	MPI_Comm_rank(comm, &rank);
	hp_err_clear(&err);
	if (hp_split_overrides(argc, argv, longopts, &rest, &nrest, &ovr, &novr)) {
		hp_err_set(&err, HP_ENOMEM, "out of memory");
		return die_err(&err);
	}
	o.verify = 1;
	o.max_steps = 2;
	o.quiet = 1;
	opterr = 0;
	rc = -1;
	while (rc < 0 && (c = getopt_long(nrest, rest, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 's': o.shards = optarg; break;
		case 'k':
			o.max_steps = (long)real_arg(optarg);
			if (o.max_steps < 1 || real_arg(optarg) != (double)o.max_steps)
				rc = usage_error(usage_str, "--steps: '%s' is not a positive whole number", optarg);
			break;
		case 'r':
			if ((o.rtol = real_arg(optarg)) < 0)
				rc = usage_error(usage_str, "--rtol: '%s' is not a positive number", optarg);
			break;
		case 'p':
			if ((o.prtol = real_arg(optarg)) < 0)
				rc = usage_error(usage_str, "--param-rtol: '%s' is not a positive number", optarg);
			break;
		case 'a':
			if ((o.atol = real_arg(optarg)) < 0)
				rc = usage_error(usage_str, "--atol: '%s' is not a positive number", optarg);
			break;
		case 'j': o.verify_json = 1; break;
		case 'h': if (!rank) help(); rc = 0; break;
		case 'V': if (!rank) printf("hp-verify %s\n", HP_VERSION); rc = 0; break;
		default:
			rc = usage_error(usage_str, "unknown option '%s'", rest[optind - 1]);
		}
	}
	if (rc < 0) {
		if (optind >= nrest)
			rc = usage_error(usage_str, "missing CONFIG.yaml or PLAN.json");
		else if (optind + 1 < nrest)
			rc = usage_error(usage_str, "unexpected argument '%s' (overrides look like --a.b=c)",
					 rest[optind + 1]);
	}
	if (rc < 0) {
		o.config = rest[optind];
		o.noverrides = novr;
		o.overrides = ovr;
		rc = hp_train_run(&o, comm, stdout, &err) ? die_err(&err) : 0;
	}
	hp_free(rest);
	hp_free(ovr);
	return rc;
}
