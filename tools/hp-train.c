/*
 * hp-train - train a Hugging Face decoder model from a YAML config.
 *
 * Thin client: parse the command line into struct hp_train_opts and call
 * hp_train_run().  Arguments of the form --key=value whose key is not one
 * of hp-train's own options (--a.b=c, --lr_scheduler=null) are config
 * overrides, applied in order after the config file.
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>

#include "backend/kernels.h"
#include "base/alloc.h"
#include "base/log.h"
#include "common-main.h"
#include "train/train.h"

const char hp_tool_name[] = "hp-train";

static const char usage_str[] =
	"hp-train CONFIG.yaml [--a.b=c ...] [--shards DIR] [--max-steps N] [--metrics FILE.jsonl]\n"
	"                [--dump-grads FILE.safetensors] [--dump-params FILE.safetensors] [-q]\n"
	"   or: hp-train --list-kernels";

static void help(void)
{
	printf("usage: %s\n\n"
	       "Train the model a HyperParallel-style YAML config describes.\n\n"
	       "  --a.b=c                   override config key a.b with the YAML value c\n"
	       "  --metrics FILE.jsonl      write one JSON object per step\n"
	       "  --shards DIR              start from hp-convert's shards for this layout (over ranks)\n"
	       "  --max-steps N             stop after step N (the schedule still spans train_iters)\n"
	       "  --dump-grads FILE         write step 1's gradients (F32 safetensors, HF names)\n"
	       "  --dump-params FILE        write the weights after the last step (F32, HF names)\n"
	       "  -q, --quiet               print no table and no step lines\n"
	       "  --list-kernels            print every op x backend and how a run selects it\n"
	       "  -h, --help                show this help\n"
	       "      --version             show the version\n\n"
	       "See hp-train(1) and hp-config(5).\n", usage_str);
}

int cmd_main(int argc, char **argv, MPI_Comm comm)
{
	static const struct option longopts[] = {
		{ "metrics", required_argument, NULL, 'm' },
		{ "dump-grads", required_argument, NULL, 'g' },
		{ "dump-params", required_argument, NULL, 'P' },
		{ "shards", required_argument, NULL, 's' },
		{ "max-steps", required_argument, NULL, 'M' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "list-kernels", no_argument, NULL, 'k' },
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
	/* Pull --a.b=c overrides out before getopt sees them. */
	if (hp_split_overrides(argc, argv, longopts, &rest, &nrest, &ovr, &novr)) {
		hp_err_set(&err, HP_ENOMEM, "out of memory");
		return die_err(&err);
	}
	opterr = 0;
	rc = -1;
	while (rc < 0 && (c = getopt_long(nrest, rest, "qh", longopts, NULL)) != -1) {
		switch (c) {
		case 'm': o.metrics = optarg; break;
		case 'g': o.dump_grads = optarg; break;
		case 'P': o.dump_params = optarg; break;
		case 's': o.shards = optarg; break;
		case 'M': {
			char *end;
			errno = 0;
			o.max_steps = strtol(optarg, &end, 10);
			if (errno || end == optarg || *end || o.max_steps < 1)
				rc = usage_error(usage_str, "--max-steps: '%s' is not a positive whole number", optarg);
			break;
		}
		case 'q': o.quiet = 1; break;
		case 'k': if (!rank) hp_kernels_print(stdout); rc = 0; break;
		case 'h': if (!rank) help(); rc = 0; break;
		case 'V': if (!rank) printf("hp-train %s\n", HP_VERSION); rc = 0; break;
		default:
			rc = usage_error(usage_str, "unknown option '%s'", rest[optind - 1]);
		}
	}
	if (rc < 0) {
		if (optind >= nrest)
			rc = usage_error(usage_str, "missing CONFIG.yaml");
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
