/*
 * log.c - rank-aware stderr logging (see log.h).
 */
#include <unistd.h>

#include "base/log.h"

static const char *tool_name = "hp";
static int my_rank;
static int level = -1;   /* -1 unread; 0 normal; 1 debug; 2 all ranks info */

static void read_level(void)
{
	const char *s;

	if (level >= 0)
		return;
	s = getenv("HP_LOG");
	level = 0;
	if (s && !strcmp(s, "debug"))
		level = 1;
	else if (s && !strcmp(s, "all"))
		level = 2;
}

void hp_log_init(const char *tool, int rank)
{
	tool_name = tool;
	my_rank = rank;
}

const char *hp_log_tool(void) { return tool_name; }
int hp_log_rank(void) { return my_rank; }

static void emit(const char *kind, const char *fmt, va_list ap)
{
	char host[64] = "?", line[2048];
	int n;

	if (my_rank) {
		gethostname(host, sizeof(host) - 1);
		host[sizeof(host) - 1] = '\0';
		n = snprintf(line, sizeof(line), "%s: rank %d on %s: %s", tool_name, my_rank, host, kind);
	} else {
		n = snprintf(line, sizeof(line), "%s: %s", tool_name, kind);
	}
	if (n < 0 || (size_t)n >= sizeof(line))
		n = 0;
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	fprintf(stderr, "%s\n", line);
}

void hp_debug(const char *fmt, ...)
{
	va_list ap;

	read_level();
	if (level != 1)
		return;
	va_start(ap, fmt);
	emit("debug: ", fmt, ap);
	va_end(ap);
}

void hp_info(const char *fmt, ...)
{
	va_list ap;

	read_level();
	if (my_rank && level != 2)
		return;
	va_start(ap, fmt);
	emit("", fmt, ap);
	va_end(ap);
}

void hp_warn(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	emit("warning: ", fmt, ap);
	va_end(ap);
}

void hp_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	emit("", fmt, ap);
	va_end(ap);
}
