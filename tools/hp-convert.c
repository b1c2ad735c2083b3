/*
 * hp-convert - HF folders to per-rank shards of a plan, shards to another
 * plan's shards, random init straight into shards, and shards back to an HF
 * folder.
 *
 * Thin client of lib/dist/shard.h.  Output goes to a temporary folder beside
 * the target, renamed when every process has finished, so a failure leaves
 * nothing behind.  Under mpiexec process p writes ranks p, p + n, ...; as
 * one process it writes them all.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "base/alloc.h"
#include "base/fileio.h"
#include "base/log.h"
#include "comm/comm.h"
#include "common-main.h"
#include "dist/shard.h"

const char hp_tool_name[] = "hp-convert";

static const char usage_str[] =
	"hp-convert --plan PLAN.json|- [-o DIR] [MODEL_DIR|SHARD_DIR]\n"
	"   or: hp-convert --export [-o HF_DIR] [--dtype bf16|f32|f16] [--max-shard-size SIZE] SHARD_DIR\n"
	"   or: hp-convert --verify SHARD_DIR";

static void help(void)
{
	printf("usage: %s\n\n"
	       "Reshard a Hugging Face checkpoint into one safetensors file per rank of a plan,\n"
	       "reshard shards made for one plan into another's, draw a from_config model's\n"
	       "random init straight into shards, or gather shards back into an HF folder.\n\n"
	       "  --plan PLAN.json      the plan to convert for ('-': stdin); the source is\n"
	       "                        MODEL_DIR (an HF folder), SHARD_DIR (another plan's\n"
	       "                        shards), else the plan's model path, or its random\n"
	       "                        init for a from_config model\n"
	       "  --export              write SHARD_DIR's parameters as an HF folder\n"
	       "  --dtype bf16|f32|f16  --export: the dtype written (default: the model's\n"
	       "                        torch_dtype)\n"
	       "  --max-shard-size SIZE --export: split files past SIZE (5GB, 500MB, 2GiB; 0\n"
	       "                        or absent: one file)\n"
	       "  --verify              check every shard's metadata and checksums\n"
	       "  -o, --output DIR      where to write (default: shards, or hf for --export);\n"
	       "                        must not exist, or be an empty folder\n"
	       "  -q, --quiet           no progress line\n"
	       "  -h, --help            show this help\n"
	       "      --version         show the version\n\n"
	       "See hp-convert(1).\n", usage_str);
}

/* "5GB", "500MB", "2GiB", "123" -> bytes (HF: GB = 10^9, GiB = 2^30). */
static int parse_size(const char *s, uint64_t *out)
{
	static const struct { const char *suf; uint64_t mul; } u[] = {
		{ "", 1 }, { "B", 1 }, { "KB", 1000 }, { "MB", 1000000 }, { "GB", 1000000000 },
		{ "TB", 1000000000000ull }, { "KiB", 1024 }, { "MiB", 1 << 20 }, { "GiB", 1 << 30 },
		{ "TiB", 1ull << 40 },
	};
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || v < 0)
		return -1;
	for (size_t i = 0; i < sizeof(u) / sizeof(u[0]); i++)
		if (!strcasecmp(end, u[i].suf) && (!strcmp(end, u[i].suf) || i < 6)) {
			*out = (uint64_t)(v * (double)u[i].mul);
			return 0;
		}
	return -1;
}

static int is_dir(const char *path)
{
	struct stat st;

	return !stat(path, &st) && S_ISDIR(st.st_mode);
}

static int has_plan(const char *dir)
{
	char p[4200];

	snprintf(p, sizeof(p), "%s/plan.json", dir);
	return !access(p, F_OK);
}

/* The output folder may be absent or empty. */
static int check_out(const char *out, struct hp_err *e)
{
	DIR *d;
	struct dirent *de;
	int empty = 1;

	if (access(out, F_OK))
		return 0;
	if (!(d = opendir(out)))
		return hp_err_set(e, HP_EIO, "'%s': exists and is not a folder", out);
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			empty = 0;
	closedir(d);
	return empty ? 0 : hp_err_set(e, HP_EIO, "'%s': exists and is not empty; remove it or pick another", out);
}

/* Remove the temporary folder and the files in it (it holds no folders). */
static void remove_tmp(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char p[4400];

	if (!d)
		return;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
		unlink(p);
	}
	closedir(d);
	rmdir(dir);
}

/* Rank 0 reads the plan text (a file or stdin) and every process gets it. */
static int load_plan(struct hp_plan **p, const char *path, MPI_Comm comm, struct hp_err *e)
{
	int rank, rc = 0;
	long long len = 0;
	char *buf = NULL;

	MPI_Comm_rank(comm, &rank);
	if (strcmp(path, "-"))
		return hp_plan_load(p, NULL, path, e);
	if (rank == 0) {
		size_t n;

		if (hp_read_stream(stdin, &buf, &n))
			rc = errno == ENOMEM ? hp_err_set(e, HP_ENOMEM, "out of memory reading the plan")
					     : hp_err_set(e, HP_EIO, "<stdin>: cannot read: %s", strerror(errno));
		len = rc ? -1 : (long long)n;
	}
	hp_comm_bcast_raw(comm, &len, 1, MPI_LONG_LONG, 0);
	if (len < 0)   /* rank 0 could not read it, and says why */
		return rc ? rc : hp_err_set(e, HP_EIO, "<stdin>: rank 0 could not read the plan");
	if (rank && !(buf = hp_malloc((size_t)len + 1)))
		rc = hp_err_set(e, HP_ENOMEM, "out of memory reading the plan");
	if (hp_agree_status(comm, rc ? 1 : 0)) {
		hp_free(buf);
		return rc ? rc : hp_err_set(e, HP_ENOMEM, "out of memory on another rank");
	}
	hp_comm_bcast_raw(comm, buf, (int)len, MPI_CHAR, 0);
	rc = hp_plan_load_text(p, NULL, "<stdin>", buf, (size_t)len, e);
	hp_free(buf);
	return rc;
}

/* Another process failed and said why; this one stays quiet. */
#define HP_EAGAIN_OTHER 1

static int status_of(int rc)
{
	return !rc || rc == HP_EAGAIN_OTHER ? 0 : hp_err_exit_code(rc);
}

struct job {
	int export, verify, quiet;
	const char *plan, *out, *src;
	enum hp_dtype dtype;
	uint64_t max_shard;
};

/* Every process runs this; the caller agrees on the outcome.  Shards are
 * verified in parts, and all agree that they are sound before any is used. */
static int run(const struct job *j, struct hp_plan *p, const char *tmp, MPI_Comm comm,
	       struct hp_err *e)
{
	int proc, nproc;
	struct hp_progress pg;
	struct hp_src src;
	uint64_t total = 0;
	int rc = 0;

	MPI_Comm_rank(comm, &proc);
	MPI_Comm_size(comm, &nproc);
	memset(&src, 0, sizeof(src));
	if (j->verify || j->export) {
		hp_progress_start(&pg, "verifying", 0, !j->quiet && proc == 0);
		rc = hp_src_open_shards_part(&src, p, j->src, proc, nproc, &pg, e);
		hp_progress_done(&pg);
		if (hp_agree_status(comm, status_of(rc)) && !rc)
			rc = HP_EAGAIN_OTHER;
		if (rc || j->verify)
			goto out;
		hp_progress_start(&pg, "exporting", hp_export_bytes(p, j->dtype, j->max_shard, proc, nproc),
				  !j->quiet && proc == 0);
		rc = hp_export_hf(p, &src, tmp, j->dtype, j->max_shard, 1, proc, nproc, &pg, e);
		hp_progress_done(&pg);
		goto out;
	}
	if (j->src && has_plan(j->src)) {
		hp_progress_start(&pg, "verifying", 0, !j->quiet && proc == 0);
		rc = hp_src_open_shards_part(&src, p, j->src, proc, nproc, &pg, e);
		hp_progress_done(&pg);
	} else if (j->src) {
		rc = hp_src_open_hf(&src, p, j->src, e);
	} else {
		rc = hp_src_open_init(&src, p, e);
	}
	if (hp_agree_status(comm, status_of(rc)) && !rc)
		rc = HP_EAGAIN_OTHER;
	if (rc)
		goto out;
	for (int r = proc; r < p->world; r += nproc)
		total += hp_shard_bytes(p, r);
	hp_progress_start(&pg, "converting", total, !j->quiet && proc == 0);
	for (int r = proc; r < p->world && !rc; r += nproc)
		rc = hp_shard_write(p, r, &src, tmp, &pg, e);
	hp_progress_done(&pg);
	if (!rc && proc == 0) {
		char path[4200];

		snprintf(path, sizeof(path), "%s/plan.json", tmp);
		rc = hp_plan_save(p, path, e);
	}
out:
	hp_src_close(&src);
	return rc;
}

static int parse_dtype(const char *s, enum hp_dtype *t)
{
	if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16"))
		*t = HP_DTYPE_BF16;
	else if (!strcmp(s, "f16") || !strcmp(s, "fp16") || !strcmp(s, "float16"))
		*t = HP_DTYPE_F16;
	else if (!strcmp(s, "f32") || !strcmp(s, "fp32") || !strcmp(s, "float32"))
		*t = HP_DTYPE_F32;
	else
		return -1;
	return 0;
}

int cmd_main(int argc, char **argv, MPI_Comm comm)
{
	static const struct option longopts[] = {
		{ "plan", required_argument, NULL, 'p' },
		{ "output", required_argument, NULL, 'o' },
		{ "export", no_argument, NULL, 'x' },
		{ "verify", no_argument, NULL, 'v' },
		{ "dtype", required_argument, NULL, 'd' },
		{ "max-shard-size", required_argument, NULL, 'm' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct job j = { .dtype = HP_DTYPE_INVALID };
	struct hp_plan *p = NULL;
	struct hp_err err;
	const char *dtype = NULL;
	char tmp[4200] = "", plan_path[4200], hash[65], out_buf[4096];
	int slot = -1;
	int rank = 0, nproc = 1, rc = -1, worst, ran = 0, r0failed, c;

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &nproc);
	hp_err_clear(&err);
	opterr = 0;
	while (rc < 0 && (c = getopt_long(argc, argv, "o:qh", longopts, NULL)) != -1) {
		switch (c) {
		case 'p': j.plan = optarg; break;
		case 'o': j.out = optarg; break;
		case 'x': j.export = 1; break;
		case 'v': j.verify = 1; break;
		case 'd': dtype = optarg; break;
		case 'm':
			if (parse_size(optarg, &j.max_shard))
				rc = usage_error(usage_str, "--max-shard-size: '%s' is not a size like 5GB", optarg);
			break;
		case 'q': j.quiet = 1; break;
		case 'h': if (!rank) help(); rc = 0; break;
		case 'V': if (!rank) printf("hp-convert %s\n", HP_VERSION); rc = 0; break;
		default: rc = usage_error(usage_str, "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (rc >= 0)
		return rc;
	if (dtype && parse_dtype(dtype, &j.dtype))
		return usage_error(usage_str, "--dtype: '%s' is not bf16, f32 or f16", dtype);
	if (j.export + j.verify + !!j.plan != 1)
		return usage_error(usage_str, "give one of --plan, --export and --verify");
	if ((dtype || j.max_shard) && !j.export)
		return usage_error(usage_str, "--dtype and --max-shard-size go with --export");
	if (optind + 1 < argc)
		return usage_error(usage_str, "unexpected argument '%s'", argv[optind + 1]);
	j.src = optind < argc ? argv[optind] : NULL;
	if ((j.export || j.verify) && !j.src)
		return usage_error(usage_str, "missing SHARD_DIR");
	/* the same on every process: one says it */
	if ((j.export || j.verify) && !has_plan(j.src)) {
		hp_err_set(&err, HP_EIO, "'%s': not a shard folder (no plan.json)", j.src);
		return rank ? hp_err_exit_code(err.code) : die_err(&err);
	}
	if (j.src && !is_dir(j.src)) {
		hp_err_set(&err, HP_EIO, "'%s': not a folder", j.src);
		return rank ? hp_err_exit_code(err.code) : die_err(&err);
	}
	if (j.verify)
		j.out = NULL;
	else if (!j.out)
		j.out = j.export ? "hf" : "shards";
	if (j.out) {   /* "new/" names the folder new: the temporary goes beside it */
		snprintf(out_buf, sizeof(out_buf), "%s", j.out);
		for (size_t n = strlen(out_buf); n > 1 && out_buf[n - 1] == '/'; n--)
			out_buf[n - 1] = '\0';
		j.out = out_buf;
	}

	/* the plan: the one given, or the shard folder's own */
	if (j.plan) {
		rc = load_plan(&p, j.plan, comm, &err);
	} else {
		snprintf(plan_path, sizeof(plan_path), "%s/plan.json", j.src);
		rc = hp_plan_load(&p, NULL, plan_path, &err);
	}
	if (!rc && j.plan && !j.src) {
		json_t *m = json_object_get(p->config, "model");
		json_t *dir = json_object_get(m, "pretrained_model_name_or_path");

		if (json_is_string(dir))     /* from_pretrained: the plan's model path */
			j.src = json_string_value(dir);
	}
	if (!rc && j.export && j.dtype == HP_DTYPE_INVALID)
		j.dtype = p->spec.torch_dtype;
	if (!rc && j.out && rank == 0)
		rc = check_out(j.out, &err);
	if (!rc && j.out) {
		/* a temporary beside the target, named by rank 0 */
		long pid = (long)getpid();

		hp_comm_bcast_raw(comm, &pid, 1, MPI_LONG, 0);
		snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", j.out, pid);
		if (rank == 0 && mkdir(tmp, 0755))
			rc = hp_err_set(&err, HP_EIO, "'%s': cannot create: %s", tmp, strerror(errno));
		else if (rank == 0)
			slot = hp_tmp_track(tmp, 1);   /* gone with the process, however it stops */
	}
	/* every process decides together: a failure anywhere removes the output */
	worst = hp_agree_status(comm, status_of(rc));
	r0failed = rc != 0;
	hp_comm_bcast_raw(comm, &r0failed, 1, MPI_INT, 0);
	if (!worst) {
		ran = 1;
		rc = run(&j, p, tmp, comm, &err);
		worst = hp_agree_status(comm, status_of(rc));
	}
	if (rank == 0 && j.out && tmp[0]) {
		if (!worst && rename(tmp, j.out)) {
			rc = hp_err_set(&err, HP_EIO, "'%s': cannot rename '%s' to it: %s", j.out, tmp,
					strerror(errno));
			worst = hp_err_exit_code(rc);
		}
		if (worst)
			remove_tmp(tmp);
		hp_tmp_forget(slot);
	}
	if (!worst && rank == 0 && j.verify && !hp_plan_hash(p, hash, &err))
		fprintf(stderr, "hp-convert: '%s': %d shards match plan %.12s... and their checksums\n",
			j.src, p->world, hash);
	hp_plan_free(p);
	/* a process that failed says why, the others share the status; a
	 * failure before the work (the plan, the output folder) is the same
	 * everywhere, and rank 0 says it */
	if (rc && rc != HP_EAGAIN_OTHER && (ran || rank == 0 || !r0failed))
		return die_err(&err);
	return worst ? worst : status_of(rc);
}
