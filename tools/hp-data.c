/*
 * hp-data - tokenize text offline: JSON lines of ids (encode) or a Megatron
 * indexed dataset (build), in parallel under mpiexec.
 *
 * Thin client: parse the command line into struct hp_data_opts, call
 * hp_data_encode_run() or hp_data_build_run(), and print what rank 0 has to
 * say on stderr: the progress bar (only when stderr is a terminal) and the
 * closing statistics.  Errors are collective, so only rank 0 prints them.
 */
#include <getopt.h>
#include <unistd.h>

#include "base/log.h"
#include "base/progress.h"
#include "common-main.h"
#include "data/hpdata.h"
#include "format/indexed.h"

const char hp_tool_name[] = "hp-data";

static const char usage_str[] =
	"hp-data encode --tokenizer T [--text-key KEY] [--format jsonl|text] [chat] FILE...\n"
	"   or: hp-data build --tokenizer T [--text-key KEY] [--format jsonl|text] "
	"[--append-eod] [--pack-to-seq-len N] [chat] -o PREFIX FILE...\n"
	"  where chat is --chat-template auto|chatml|FILE.jinja [--role-key K] [--content-key K] "
	"[--all-tokens]";

static void help(void)
{
	printf("usage: %s\n\n"
	       "Tokenize text with a Hugging Face tokenizer.json: print the ids of each record\n"
	       "(encode) or write a Megatron indexed dataset PREFIX.bin + PREFIX.idx (build).\n"
	       "A record is a line of a text file or the text of a JSONL line; '-' is stdin.\n\n"
	       "  --tokenizer T             tokenizer.json, or a folder holding one\n"
	       "  --text-key KEY            JSONL key of the text (default: text)\n"
	       "  --format jsonl|text       input format (default: .jsonl/.json and - are\n"
	       "                            JSONL, other files text)\n"
	       "  --append-eod              build: end every record with the EOD token\n"
	       "  --pack-to-seq-len N       build: cut all ids into records of N+1 tokens\n"
	       "  -o, --output PREFIX       build: write PREFIX.bin and PREFIX.idx\n"
	       "  --chat-template T         records are conversations (messages under\n"
	       "                            --text-key, default messages) rendered with the\n"
	       "                            model's template (auto), chatml, or FILE.jinja;\n"
	       "                            encode prints ids and labels, build also writes\n"
	       "                            the loss mask PREFIX.mask.bin + .idx\n"
	       "  --role-key K, --content-key K   message keys (default: role, content)\n"
	       "  --all-tokens              loss on every token, not the assistant's only\n"
	       "  -h, --help                show this help\n"
	       "      --version             show the version\n\n"
	       "See hp-data(1).\n", usage_str);
}

/* ---- progress ------------------------------------------------------------- */

/* hp-data's callback reports bytes done so far; lib/progress counts
 * increments.  It starts at the first call, so that loading the tokenizer
 * (before it) does not make the first rate estimates absurd. */
struct bar {
	struct hp_progress p;
	uint64_t seen;
	int started;
};

static void bar_draw(void *arg, uint64_t done, uint64_t total, int final)
{
	struct bar *b = arg;

	if (!b->started) {
		b->started = 1;
		hp_progress_start(&b->p, "tokenizing", total, 1);
		b->seen = done;
	}
	hp_progress_add(&b->p, done - b->seen);
	b->seen = done;
	if (final)
		hp_progress_done(&b->p);
}

/* ---- command line ---------------------------------------------------------- */

static int parse_seq_len(const char *s, int64_t *out)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 10);
	/* N + 1 ids must fit the format's int32 sequence length. */
	if (errno || end == s || *end || v < 1 || v >= INT32_MAX)
		return -1;
	*out = v;
	return 0;
}

int cmd_main(int argc, char **argv, MPI_Comm comm)
{
	enum { O_TOK = 256, O_KEY, O_FORMAT, O_EOD, O_PACK, O_VERSION, O_CHAT, O_ROLE, O_CONTENT, O_ALL };
	static const struct option longopts[] = {
		{ "tokenizer", required_argument, NULL, O_TOK },
		{ "text-key", required_argument, NULL, O_KEY },
		{ "format", required_argument, NULL, O_FORMAT },
		{ "append-eod", no_argument, NULL, O_EOD },
		{ "pack-to-seq-len", required_argument, NULL, O_PACK },
		{ "output", required_argument, NULL, 'o' },
		{ "chat-template", required_argument, NULL, O_CHAT },
		{ "role-key", required_argument, NULL, O_ROLE },
		{ "content-key", required_argument, NULL, O_CONTENT },
		{ "all-tokens", no_argument, NULL, O_ALL },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, O_VERSION },
		{ NULL, 0, NULL, 0 },
	};
	struct hp_data_opts o = { 0 };
	struct hp_data_stats st;
	struct hp_err err;
	struct bar bar = { 0 };
	const char *sub;
	int rank = 0, world = 1, build, rc = -1, c;

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &world);
	hp_err_clear(&err);
	if (argc < 2)
		return usage_error(usage_str, "missing command: encode or build");
	sub = argv[1];
	if (!strcmp(sub, "-h") || !strcmp(sub, "--help")) {
		if (!rank)
			help();
		return 0;
	}
	if (!strcmp(sub, "--version")) {
		if (!rank)
			printf("hp-data %s\n", HP_VERSION);
		return 0;
	}
	if (strcmp(sub, "encode") && strcmp(sub, "build"))
		return usage_error(usage_str, "unknown command '%s' (encode or build)", sub);
	build = !strcmp(sub, "build");

	opterr = 0;
	optind = 1;
	while (rc < 0 && (c = getopt_long(argc - 1, argv + 1, ":o:h", longopts, NULL)) != -1) {
		switch (c) {
		case O_TOK: o.tokenizer = optarg; break;
		case O_KEY: o.text_key = optarg; break;
		case O_FORMAT:
			if (!strcmp(optarg, "jsonl"))
				o.format = HP_DATA_JSONL;
			else if (!strcmp(optarg, "text"))
				o.format = HP_DATA_TEXT;
			else
				rc = usage_error(usage_str, "--format '%s': expected jsonl or text", optarg);
			break;
		case O_EOD: o.append_eod = 1; break;
		case O_PACK:
			if (parse_seq_len(optarg, &o.pack_to_seq_len))
				rc = usage_error(usage_str, "--pack-to-seq-len '%s': expected an integer "
						 "from 1 to %d", optarg, INT32_MAX - 1);
			break;
		case 'o': o.prefix = optarg; break;
		case O_CHAT: o.chat_template = optarg; break;
		case O_ROLE: o.role_key = optarg; break;
		case O_CONTENT: o.content_key = optarg; break;
		case O_ALL: o.all_tokens = 1; break;
		case 'h': if (!rank) help(); rc = 0; break;
		case O_VERSION: if (!rank) printf("hp-data %s\n", HP_VERSION); rc = 0; break;
		case ':':
			rc = usage_error(usage_str, "option '%s' needs a value", argv[optind]);
			break;
		default:
			rc = usage_error(usage_str, "unknown option '%s'", argv[optind]);
		}
	}
	if (rc >= 0)
		return rc;
	o.inputs = argv + 1 + optind;
	o.ninputs = argc - 1 - optind;
	if (!o.tokenizer)
		return usage_error(usage_str, "missing --tokenizer");
	if (!o.ninputs)
		return usage_error(usage_str, "missing input FILE");
	if (!build && (o.prefix || o.append_eod || o.pack_to_seq_len))
		return usage_error(usage_str, "%s is an option of build, not encode",
				   o.prefix ? "-o" : o.append_eod ? "--append-eod" : "--pack-to-seq-len");
	if (build && !o.prefix)
		return usage_error(usage_str, "missing -o PREFIX");
	if (!o.chat_template && (o.role_key || o.content_key || o.all_tokens))
		return usage_error(usage_str, "%s is an option of conversations: give --chat-template",
				   o.role_key ? "--role-key" : o.content_key ? "--content-key" : "--all-tokens");
	for (int i = 0; build && world > 1 && i < o.ninputs; i++)
		if (!strcmp(o.inputs[i], "-"))
			return usage_error(usage_str, "'-': standard input cannot be split over %d ranks",
					   world);

	if (!build) {
		rc = hp_data_encode_run(&o, comm, stdout, &st, &err);
	} else {
		if (!rank && isatty(STDERR_FILENO)) {
			o.progress = bar_draw;
			o.progress_arg = &bar;
		}
		rc = hp_data_build_run(&o, comm, &st, &err);
	}
	if (rc) {
		if (bar.started && bar.p.on)
			fputs("\r\033[K", stderr);
		/* Every rank holds the same error: one line, from rank 0. */
		return rank ? hp_err_exit_code(rc) : die_err(&err);
	}
	if (build) {
		if (o.pack_to_seq_len)
			hp_info("%llu sequences of %lld tokens; dropped the last %llu tokens",
				(unsigned long long)st.sequences, (long long)o.pack_to_seq_len + 1,
				(unsigned long long)st.dropped);
		double work = st.seconds - st.load_seconds;

		if (o.chat_template)
			hp_info("conversations: ids in %s.bin/.idx, loss mask in %s.mask.bin/.idx",
				o.prefix, o.prefix);
		hp_info("%llu records, %llu tokens (%s), %.2f MB, %.2f s (%.2f s loading the "
			"tokenizer), %.2f MB/s tokenizing, %d rank%s",
			(unsigned long long)st.records, (unsigned long long)st.tokens,
			hp_indexed_dtype_name(st.dtype_code), (double)st.bytes / 1e6, st.seconds,
			st.load_seconds, work > 0 ? (double)st.bytes / 1e6 / work : 0.0, world,
			world == 1 ? "" : "s");
	}
	return 0;
}
