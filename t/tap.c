/*
 * tap.c - TAP output for C unit tests (see tap.h).
 */
#include "tap.h"

static int count, failed;

int tap_ok(int cond, const char *fmt, ...)
{
	va_list ap;

	count++;
	if (!cond)
		failed++;
	printf("%sok %d - ", cond ? "" : "not ", count);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	return cond;
}

void tap_diag(const char *fmt, ...)
{
	va_list ap;

	printf("# ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
}

void tap_skip(const char *why, const char *fmt, ...)
{
	va_list ap;

	count++;
	printf("ok %d - ", count);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf(" # skip %s\n", why);
}

int tap_done(void)
{
	printf("1..%d\n", count);
	if (failed)
		printf("# failed %d of %d\n", failed, count);
	return failed ? 1 : 0;
}
