/*
 * schedule.c - pipeline schedules (see schedule.h).
 */
#include "base/alloc.h"
#include "plan/schedule.h"

const char *hp_pp_schedule_name(enum hp_pp_schedule sch)
{
	return sch == HP_PP_GPIPE ? "gpipe" : "1f1b";
}

static int warmup(enum hp_pp_schedule sch, int pp, int s, int G)
{
	int w = sch == HP_PP_GPIPE ? G : pp - s - 1;

	return w < G ? w : G;
}

int hp_pp_in_flight(enum hp_pp_schedule sch, int pp, int s, int G)
{
	int w = warmup(sch, pp, s, G);

	return w < G ? w + 1 : G;
}

int hp_pp_actions(enum hp_pp_schedule sch, int pp, int s, int G, struct hp_pp_action *out)
{
	int w = warmup(sch, pp, s, G), n = 0;

	for (int i = 0; i < w; i++)
		out[n++] = (struct hp_pp_action){ 0, i };
	for (int i = 0; i < G - w; i++) {
		out[n++] = (struct hp_pp_action){ 0, w + i };
		out[n++] = (struct hp_pp_action){ 1, i };
	}
	for (int i = G - w; i < G; i++)
		out[n++] = (struct hp_pp_action){ 1, i };
	return n;
}

int hp_pp_timeline(enum hp_pp_schedule sch, int pp, int G, int *start)
{
	int n = 2 * G, len = 0, moved = 1;
	struct hp_pp_action *act = hp_calloc((size_t)pp * n + 1, sizeof(*act));
	/* per stage: the next action, when the stage is free; per (stage, mb):
	 * when its forward and backward end (-1: not yet) */
	int *next = hp_calloc((size_t)pp + 1, sizeof(int)), *free_at = hp_calloc((size_t)pp + 1, sizeof(int));
	int *fend = hp_calloc((size_t)pp * G + 1, sizeof(int)), *bend = hp_calloc((size_t)pp * G + 1, sizeof(int));

	if (!act || !next || !free_at || !fend || !bend) {
		len = -1;
		goto out;
	}
	for (int s = 0; s < pp; s++)
		hp_pp_actions(sch, pp, s, G, act + (size_t)s * n);
	for (int i = 0; i < pp * G; i++)
		fend[i] = bend[i] = -1;
	/* every stage runs its next action once its input is there, until
	 * none moves (a valid schedule runs them all) */
	while (moved) {
		moved = 0;
		for (int s = 0; s < pp; s++) {
			const struct hp_pp_action *a;
			int ready;

			if (next[s] >= n)
				continue;
			a = &act[(size_t)s * n + next[s]];
			if (!a->backward)
				ready = s == 0 ? 0 : fend[(s - 1) * G + a->mb];
			else
				ready = s == pp - 1 ? fend[s * G + a->mb] : bend[(s + 1) * G + a->mb];
			if (ready < 0)
				continue;
			int t0 = ready > free_at[s] ? ready : free_at[s];
			if (start)
				start[(size_t)s * n + next[s]] = t0;
			free_at[s] = t0 + (a->backward ? 2 : 1);
			(a->backward ? bend : fend)[s * G + a->mb] = free_at[s];
			if (free_at[s] > len)
				len = free_at[s];
			next[s]++;
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
	hp_free(fend);
	hp_free(bend);
	return len;
}
