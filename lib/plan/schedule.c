/*
 * schedule.c - pipeline schedules (see schedule.h).
 */
#include <stdlib.h>

#include "base/alloc.h"
#include "plan/schedule.h"

const char *hp_pp_schedule_name(enum hp_pp_schedule sch, int vpp)
{
	return sch == HP_PP_GPIPE ? "gpipe" : vpp > 1 ? "interleaved_1f1b" : "1f1b";
}

static int warmup(enum hp_pp_schedule sch, int pp, int s, int G)
{
	int w = sch == HP_PP_GPIPE ? G : pp - s - 1;

	return w < G ? w : G;
}

/* Interleaved 1F1B's k-th chunk-forward (or backward) of a stage: groups
 * of pp micro-batches, chunk by chunk (backwards from the last chunk). */
static struct hp_pp_action interleaved(int pp, int vpp, int k, int backward)
{
	int c = k % (pp * vpp) / pp;

	return (struct hp_pp_action){ backward, k / (pp * vpp) * pp + k % pp, backward ? vpp - 1 - c : c, 1 };
}

int hp_pp_actions(enum hp_pp_schedule sch, int pp, int vpp, int s, int G, struct hp_pp_action *out)
{
	int n = 0, total = G * vpp, w;

	if (vpp <= 1) {
		w = warmup(sch, pp, s, G);
		for (int i = 0; i < w; i++)
			out[n++] = (struct hp_pp_action){ 0, i, 0, 1 };
		for (int i = 0; i < G - w; i++) {
			out[n++] = (struct hp_pp_action){ 0, w + i, 0, 1 };
			out[n++] = (struct hp_pp_action){ 1, i, 0, 1 };
		}
		for (int i = G - w; i < G; i++)
			out[n++] = (struct hp_pp_action){ 1, i, 0, 1 };
		return n;
	}
	w = (pp - s - 1) * 2 + (vpp - 1) * pp;
	if (w > total)
		w = total;
	for (int k = 0; k < w; k++)
		out[n++] = interleaved(pp, vpp, k, 0);
	for (int k = 0; k < total - w; k++) {
		out[n] = interleaved(pp, vpp, k + w, 0);
		out[n++].xchg = 0;   /* its output leaves with the backward's */
		out[n++] = interleaved(pp, vpp, k, 1);
	}
	for (int k = total - w; k < total; k++)
		out[n++] = interleaved(pp, vpp, k, 1);
	return n;
}

int hp_pp_forwards(int pp, int vpp, int G, struct hp_pp_action *out)
{
	for (int k = 0; k < G * vpp; k++)
		out[k] = interleaved(pp, vpp > 1 ? vpp : 1, k, 0);
	return G * vpp;
}

int hp_pp_peer(int pp, int vpp, int s, const struct hp_pp_action *a, int in)
{
	int v = a->chunk * pp + s, V = pp * vpp;

	/* forwards go up the virtual stages, backwards down */
	if (a->backward == !in)
		return v == 0 ? -1 : (s + pp - 1) % pp;
	return v == V - 1 ? -1 : (s + 1) % pp;
}

int hp_pp_root_chunk(int pp, int vpp, int s, int c)
{
	return (s == 0 && c == 0) || (s == pp - 1 && c == vpp - 1);
}

int hp_pp_slot(const int *per_chunk, int mb, int c)
{
	int base = 0;

	for (int i = 0; i < c; i++)
		base += per_chunk[i];
	return base + mb % per_chunk[c];
}

static int cmp_long(const void *x, const void *y)
{
	long a = *(const long *)x, b = *(const long *)y;

	return (a > b) - (a < b);
}

int hp_pp_slots(const struct hp_pp_action *act, int n, int pp, int vpp, int s, int *per_chunk)
{
	int G = 0, g = 0, total = 0;
	long *t0, *t1;

	for (int i = 0; i < n; i++)
		if (act[i].mb >= G)
			G = act[i].mb + 1;
	t0 = hp_calloc((size_t)vpp * G + 1, sizeof(long));
	t1 = hp_calloc((size_t)vpp * G + 1, sizeof(long));
	if (!t0 || !t1) {
		hp_free(t0);
		hp_free(t1);
		return -1;
	}
	/* times in quarters of an exchange: exchange g at 4g, the actions
	 * after it at 4g + 2 (when they need no exchange to begin or end);
	 * alive over [t0, t1) */
	for (int i = 0; i < n; i++) {
		const struct hp_pp_action *a = &act[i];
		long k = (long)a->chunk * G + a->mb, t = hp_pp_peer(pp, vpp, s, a, 0) >= 0 ? 4L * (g + 1) : 4L * g + 3;

		if (!a->backward) {
			t0[k] = hp_pp_peer(pp, vpp, s, a, 1) >= 0 ? 4L * g : 4L * g + 2;
			t1[k] = t;   /* forward-only lists: until its output leaves */
		} else {
			t1[k] = t;
		}
		g += a->xchg;
	}
	/* at each arrival, those arrived by then less those gone by then
	 * (every one leaves after it arrives): the starts and the ends sorted,
	 * one sweep */
	for (int c = 0; c < vpp; c++) {
		long *a = t0 + (size_t)c * G, *d = t1 + (size_t)c * G;
		int most = 1, gone = 0;

		qsort(a, (size_t)G, sizeof(long), cmp_long);
		qsort(d, (size_t)G, sizeof(long), cmp_long);
		for (int i = 0, j; i < G; i = j) {
			for (j = i + 1; j < G && a[j] == a[i]; j++)
				;
			while (gone < G && d[gone] <= a[i])
				gone++;
			if (j - gone > most)
				most = j - gone;
		}
		if (per_chunk)
			per_chunk[c] = most;
		total += most;
	}
	hp_free(t0);
	hp_free(t1);
	return total;
}

int hp_pp_in_flight(enum hp_pp_schedule sch, int pp, int vpp, int s, int G, int *per_chunk)
{
	struct hp_pp_action *a = hp_calloc(2 * (size_t)G * vpp + 1, sizeof(*a));
	int n;

	if (!a)
		return -1;
	n = hp_pp_slots(a, hp_pp_actions(sch, pp, vpp, s, G, a), pp, vpp, s, per_chunk);
	hp_free(a);
	return n;
}

int hp_pp_timeline(enum hp_pp_schedule sch, int pp, int vpp, int G, int *start)
{
	int n = 2 * G * vpp, V = pp * vpp, len = 0, moved = 1;
	struct hp_pp_action *act = hp_calloc((size_t)pp * n + 1, sizeof(*act));
	/* per stage: its next action, when it is free; per (virtual stage,
	 * micro-batch): when its forward's and backward's outputs are sent
	 * (-1: not yet) */
	int *next = hp_calloc((size_t)pp + 1, sizeof(int)), *free_at = hp_calloc((size_t)pp + 1, sizeof(int));
	int *fsent = hp_calloc((size_t)V * G + 1, sizeof(int)), *bsent = hp_calloc((size_t)V * G + 1, sizeof(int));

	if (!act || !next || !free_at || !fsent || !bsent) {
		len = -1;
		goto out;
	}
	for (int s = 0; s < pp; s++)
		hp_pp_actions(sch, pp, vpp, s, G, act + (size_t)s * n);
	for (int i = 0; i < V * G; i++)
		fsent[i] = bsent[i] = -1;
	/* every stage runs its next actions up to an exchange once what they
	 * receive has been sent, until none moves (a valid schedule runs them
	 * all) */
	while (moved) {
		moved = 0;
		for (int s = 0; s < pp; s++) {
			const struct hp_pp_action *a = act + (size_t)s * n;
			int i = next[s], end = i, t, ok = 1;

			if (i >= n)
				continue;
			while (end < n && !a[end].xchg)
				end++;
			end += end < n;   /* the actions [i, end) */
			t = free_at[s];
			for (int j = i; j < end && ok; j++) {
				int v = a[j].chunk * pp + s, ready = 0;

				if (hp_pp_peer(pp, vpp, s, &a[j], 1) >= 0)
					ready = a[j].backward ? bsent[(v + 1) * G + a[j].mb] : fsent[(v - 1) * G + a[j].mb];
				ok = ready >= 0;
				t = ready > t ? ready : t;
			}
			if (!ok)
				continue;
			for (int j = i; j < end; j++) {
				if (start)
					start[(size_t)s * n + j] = t;
				t += a[j].backward ? 2 : 1;
			}
			for (int j = i; j < end; j++)
				(a[j].backward ? bsent : fsent)[(a[j].chunk * pp + s) * G + a[j].mb] = t;
			free_at[s] = t;
			if (t > len)
				len = t;
			next[s] = end;
			moved = 1;
		}
	}
	for (int s = 0; s < pp; s++)
		if (next[s] < n)
			len = -1;   /* a schedule that cannot finish: not one of ours */
out:
	hp_free(act);
	hp_free(next);
	hp_free(free_at);
	hp_free(fsent);
	hp_free(bsent);
	return len;
}
