/*
 * tap.c - TAP output, the float comparisons of the C unit tests (see
 * tap.h for what each comparison is relative to, and why) and their
 * forked children.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* ---- float comparisons (see tap.h for why they are what they are) ---- */

double tap_norm(const float *x, size_t n)
{
	double s = 0;

	for (size_t i = 0; i < n; i++)
		s += (double)x[i] * x[i];
	return sqrt(s);
}

double tap_rms(int k, const float *const x[], const size_t n[])
{
	double ss = 0, cnt = 0;

	for (int i = 0; i < k; i++) {
		double t = tap_norm(x[i], n[i]);
		ss += t * t;
		cnt += (double)n[i];
	}
	return cnt > 0 ? sqrt(ss / cnt) : 0;
}

double tap_floor(double rms, size_t n)
{
	return rms * sqrt((double)n);
}

double tap_rel_l2(const float *got, const float *want, size_t n, double floor)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		double d = (double)got[i] - want[i];
		num += d * d;
		den += (double)want[i] * want[i];
	}
	if (!isfinite(num))
		return INFINITY;
	den = sqrt(den);
	if (den < floor)
		den = floor;
	if (den == 0)
		return num == 0 ? 0 : INFINITY;
	return sqrt(num) / den;
}

double tap_urand(uint64_t *state)
{
	uint64_t x = *state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return ((double)((x * 0x2545f4914f6cdd1dull) >> 11) + 0.5) / 9007199254740992.0;
}

double tap_bound_err(const float *got, const float *want, const double *mag, size_t n, double k)
{
	double worst = 0;

	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]), b = k * TAP_U * mag[i], r;

		if (!isfinite(d))
			return INFINITY;
		r = d == 0 ? 0 : b > 0 ? d / b : INFINITY;
		if (r > worst)
			worst = r;
	}
	return worst;
}

double tap_rel_l2_parts(const float *got, const float *want, int nparts, const size_t *off,
			const size_t *len, int *worst)
{
	double ss = 0, n = 0, rms, e, w = 0;

	for (int p = 0; p < nparts; p++) {
		double t = tap_norm(want + off[p], len[p]);
		ss += t * t;
		n += (double)len[p];
	}
	rms = n > 0 ? sqrt(ss / n) : 0;
	if (worst)
		*worst = 0;
	for (int p = 0; p < nparts; p++) {
		e = tap_rel_l2(got + off[p], want + off[p], len[p], tap_floor(rms, len[p]));
		if (!(e <= w)) {
			w = e;
			if (worst)
				*worst = p;
		}
		if (isinf(w))
			break;
	}
	return w;
}

int tap_child(int threads, const char *level, int (*fn)(void *), void *arg)
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return -1;
	if (pid == 0) {
		char nt[16];

		snprintf(nt, sizeof(nt), "%d", threads);
		setenv("HP_NUM_THREADS", nt, 1);
		if (level)
			setenv("HP_CPU", level, 1);
		_exit(fn(arg) ? 1 : 0);
	}
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}
