/*
 * common-main.c - the one main() of every hp tool.
 *
 * MPI is always initialised: a tool started without mpiexec runs as an MPI
 * singleton of world size 1, so the same binary works by hand, under
 * mpiexec and under srun.  Exit statuses are those of lib/base/err.h.
 */
#include <getopt.h>

#include "base/alloc.h"
#include "base/fileio.h"
#include "base/log.h"
#include "comm/comm.h"
#include "common-main.h"
#include "cpu/isa.h"

int die_err(const struct hp_err *e)
{
	hp_error("%s", e->msg[0] ? e->msg : hp_err_name(e->code));
	if (e->code == HP_EINVAL && e->src_file)
		fprintf(stderr, "%s: BUG raised at %s:%d\n", hp_tool_name, e->src_file, e->src_line);
	return hp_err_exit_code(e->code);
}

int usage_error(const char *usage, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (hp_log_rank() == 0) {
		fprintf(stderr, "%s: %s\n", hp_tool_name, msg);
		fprintf(stderr, "usage: %s\n", usage);
	}
	return HP_EXIT_USAGE;
}

static int is_override(const char *a, const struct option *opts)
{
	const char *eq;

	if (strncmp(a, "--", 2) || !(eq = strchr(a, '=')) || eq == a + 2)
		return 0;
	for (; opts->name; opts++)
		if (strlen(opts->name) == (size_t)(eq - a - 2) && !strncmp(opts->name, a + 2, (size_t)(eq - a - 2)))
			return 0;
	return 1;
}

int hp_split_overrides(int argc, char **argv, const struct option *opts,
		       char ***rest, int *nrest, char ***ovr, int *novr)
{
	*nrest = *novr = 0;
	*rest = hp_calloc((size_t)argc + 1, sizeof(char *));
	*ovr = hp_calloc((size_t)argc + 1, sizeof(char *));
	if (!*rest || !*ovr) {
		hp_free(*rest);
		hp_free(*ovr);
		*rest = *ovr = NULL;
		return HP_ENOMEM;
	}
	for (int i = 0; i < argc; i++) {
		if (i > 0 && is_override(argv[i], opts))
			(*ovr)[(*novr)++] = argv[i];
		else
			(*rest)[(*nrest)++] = argv[i];
	}
	return 0;
}

int hp_agree_status(MPI_Comm comm, int status)
{
	int worst = status;

	hp_comm_allreduce_raw(comm, &worst, 1, MPI_INT, MPI_MAX);
	return worst;
}

int main(int argc, char **argv)
{
	int rank = 0, status, provided;
	const char *cpu;

	hp_log_init(hp_tool_name, 0);
	if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
		fprintf(stderr, "%s: MPI_Init failed\n", hp_tool_name);
		return HP_EXIT_FAILURE;
	}
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	hp_log_init(hp_tool_name, rank);
	/* a tool stopped by a signal leaves no temporary behind, and says so */
	hp_stop_on_signals(NULL);
	if (hp_cpu_env_check(&cpu)) {
		/* every rank has the same environment under mpiexec; each says it
		 * once would be noise, so rank 0 does */
		if (rank == 0)
			fprintf(stderr, "%s: HP_CPU='%s': expected baseline, avx2 or avx512\n", hp_tool_name, cpu);
		MPI_Finalize();
		return HP_EXIT_USAGE;
	}
	status = cmd_main(argc, argv, MPI_COMM_WORLD);
	if (fflush(stdout) || ferror(stdout)) {
		fprintf(stderr, "%s: error writing standard output\n", hp_tool_name);
		if (!status)
			status = HP_EXIT_IO;
	}
	MPI_Finalize();
	return status;
}
