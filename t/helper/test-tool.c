/*
 * test-tool.c - hp-test-tool, the shell tests' window into lib/ (after
 * git's t/helper/test-tool).
 *
 * "hp-test-tool NAME ARGS..." runs the subcommand NAME with argv[0] = NAME.
 * Each subcommand lives in t/helper/test-NAME.c and is one line in the table
 * below; there is no header, the prototypes are declared here.  This is a
 * test fixture, not a user tool: no man page, no MPI, and the output formats
 * are whatever the tests need.  Conventions: nothing on stdout unless the
 * subcommand's job is to print; errors go to stderr as "hp-test-tool: ...";
 * exit 0 on success, 1 on failure, 2 on a bad command line.
 */
#include "config/config.h"
#include "cpu/isa.h"
#include "base/err.h"

/* Defined in t/helper/test-*.c; sorted by name, like the table. */
int cmd_chatbench(int argc, char **argv);  /* test-chatbench.c */
int cmd_cmpst(int argc, char **argv);      /* test-model.c */
int cmd_dumpidx(int argc, char **argv);    /* test-mkidx.c */
int cmd_logits(int argc, char **argv);     /* test-model.c */
int cmd_mkidx(int argc, char **argv);      /* test-mkidx.c */
int cmd_packcheck(int argc, char **argv);  /* test-model.c */
int cmd_refstep(int argc, char **argv);    /* test-model.c */
int cmd_spec(int argc, char **argv);       /* test-model.c */
int cmd_stdrop(int argc, char **argv);     /* test-model.c */
int cmd_stget(int argc, char **argv);      /* test-model.c */
int cmd_stsame(int argc, char **argv);     /* test-convert.c */
int cmd_teacher(int argc, char **argv);
int cmd_tokbench(int argc, char **argv);  /* test-tokbench.c */    /* test-model.c */

/* configkeys: every key of the config schema (hp_config_schema) */
static int cmd_configkeys(int argc, char **argv)
{
	(void)argv;
	if (argc != 1) {
		fprintf(stderr, "usage: hp-test-tool configkeys\n");
		return 2;
	}
	hp_config_schema(stdout);
	return 0;
}

/* cpulevels: the CPU levels this machine has, lowest first (HP_CPU ignored) */
static int cmd_cpulevels(int argc, char **argv)
{
	(void)argv;
	if (argc != 1) {
		fprintf(stderr, "usage: hp-test-tool cpulevels\n");
		return 2;
	}
	for (int l = HP_CPU_BASELINE; l <= hp_cpu_level_max(); l++)
		printf("%s%s", l ? " " : "", hp_cpu_level_name(l));
	printf("\n");
	return 0;
}

static const struct {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *usage;
} cmds[] = {
	{ "chatbench", cmd_chatbench, "chatbench TOKENIZER TEMPLATE CONVERSATIONS.jsonl [REPEAT]" },
	{ "cmpst", cmd_cmpst, "cmpst [--max-rel-l2 R] [--max-abs A] [--floor F] A.safetensors B.safetensors" },
	{ "configkeys", cmd_configkeys, "configkeys" },
	{ "cpulevels", cmd_cpulevels, "cpulevels" },
	{ "dumpidx", cmd_dumpidx, "dumpidx PREFIX" },
	{ "logits", cmd_logits, "logits -o OUT.safetensors MODEL_DIR ID..." },
	{ "mkidx", cmd_mkidx, "mkidx --vocab V [--records-of N] [--max-records K] -o PREFIX INPUT.jsonl" },
	{ "packcheck", cmd_packcheck, "packcheck MODEL_DIR DATA T" },
	{ "refstep", cmd_refstep, "refstep [--steps K] [--dump-grads F] [--no-router-logits] MODEL_DIR REFERENCE.json" },
	{ "spec", cmd_spec, "spec MODEL_DIR" },
	{ "stdrop", cmd_stdrop, "stdrop IN.safetensors OUT.safetensors NAME..." },
	{ "stget", cmd_stget, "stget FILE.safetensors NAME" },
	{ "stsame", cmd_stsame, "stsame A_DIR B_DIR" },
	{ "teacher", cmd_teacher, "teacher MODEL_DIR ID..." },
	{ "tokbench", cmd_tokbench, "tokbench TOKENIZER FILE [REPEAT]" },
};

#define NCMDS (sizeof(cmds) / sizeof(cmds[0]))

static int usage(FILE *f)
{
	fprintf(f, "usage: hp-test-tool COMMAND [ARGS...]\ncommands:\n");
	for (size_t i = 0; i < NCMDS; i++)
		fprintf(f, "  hp-test-tool %s\n", cmds[i].usage);
	return f == stdout ? HP_EXIT_OK : HP_EXIT_USAGE;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage(stderr);
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))
		return usage(stdout);
	for (size_t i = 0; i < NCMDS; i++)
		if (!strcmp(argv[1], cmds[i].name))
			return cmds[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "hp-test-tool: unknown command '%s'\n", argv[1]);
	return usage(stderr);
}
