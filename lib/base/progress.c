/*
 * progress.c - the progress line of progress.h.
 *
 * Each redraw is one fprintf to unbuffered stderr, "\r" first and "\033[K"
 * (clear to end of line) last, so a shorter line leaves no debris.  The rate
 * is the average since start, not a recent window: for steady I/O it is what
 * the user wants, and it keeps the ETA from jumping.
 */
#include <time.h>
#include <unistd.h>

#include "base/progress.h"

/* Redraw period: fast enough to look alive, slow enough to cost nothing. */
#define REDRAW_S 0.25

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "512 B", "1.2 GiB" */
static void fmt_bytes(char *buf, size_t size, double v)
{
	static const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	int u = 0;

	while (v >= 1024 && u < 5) {
		v /= 1024;
		u++;
	}
	snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

/* "0:06", "1:02:03" */
static void fmt_time(char *buf, size_t size, double s)
{
	unsigned long t = s > 0 && s < 1e9 ? (unsigned long)(s + 0.5) : 0;

	if (t >= 3600)
		snprintf(buf, size, "%lu:%02lu:%02lu", t / 3600, t / 60 % 60, t % 60);
	else
		snprintf(buf, size, "%lu:%02lu", t / 60, t % 60);
}

static void draw(struct hp_progress *p, double now, int final)
{
	char done[16], total[16] = "", pct[8] = "", rate[16], eta[16] = "";
	double dt = now - p->t0, bps = dt > 0 ? (double)p->done / dt : 0;
	uint64_t d = p->done < p->total ? p->done : p->total;	/* a total can be low */

	fmt_bytes(done, sizeof(done), (double)p->done);
	fmt_bytes(rate, sizeof(rate), bps);
	if (p->total) {
		fmt_bytes(total, sizeof(total), (double)p->total);
		snprintf(pct, sizeof(pct), "%d%%", (int)(100 * (double)d / (double)p->total));
	}
	/* the last line shows the time taken where the others show the ETA */
	if (final)
		fmt_time(eta, sizeof(eta), dt);
	else if (p->total && bps > 0)
		fmt_time(eta, sizeof(eta), (double)(p->total - d) / bps);
	fprintf(stderr, "\r%s  %s%s%s%s%s  %s/s%s%s\033[K%s", p->label, done,
		*total ? " / " : "", total, *pct ? "  " : "", pct, rate,
		*eta ? (final ? "  in " : "  ETA ") : "", eta, final ? "\n" : "");
	p->last = now;
}

void hp_progress_start(struct hp_progress *p, const char *label, uint64_t total_bytes,
		       int enabled)
{
	p->label = label;
	p->total = total_bytes;
	p->done = 0;
	p->on = enabled && isatty(STDERR_FILENO);
	p->t0 = p->last = p->on ? now_s() : 0;
}

void hp_progress_add(struct hp_progress *p, uint64_t bytes)
{
	double t;

	p->done += bytes;
	if (!p->on)
		return;
	t = now_s();
	if (t - p->last >= REDRAW_S)
		draw(p, t, 0);
}

void hp_progress_done(struct hp_progress *p)
{
	if (p->on)
		draw(p, now_s(), 1);
	p->on = 0;
}
