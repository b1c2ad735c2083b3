/*
 * schedule.h - pipeline schedules: the order in which a stage runs the
 * forwards and backwards of a step's micro-batches, and what the order
 * costs.  hp-train runs these lists (lib/train/train.c) and hp-plan draws
 * and times them (lib/plan/plan.c), so the two cannot disagree.
 *
 *   gpipe   every forward, then every backward (GPipe): a stage keeps the
 *           activations of all G micro-batches;
 *   1f1b    Megatron-LM's one-forward-one-backward: stage s runs
 *           min(pp - s - 1, G) forwards ahead, then alternates a forward
 *           and a backward, then runs the backwards left; it keeps at most
 *           min(pp - s, G) micro-batches' activations.
 *
 * Micro-batches are numbered 0..G-1 on every stage and complete in order.
 */
#ifndef HP_SCHEDULE_H
#define HP_SCHEDULE_H

#include "config/config.h"

struct hp_pp_action {
	int backward;   /* 0: the forward of mb, 1: its backward */
	int mb;         /* the micro-batch, 0..G-1 */
};

/* Stage s's 2 G actions in order into out[2 G]; returns 2 G. */
int hp_pp_actions(enum hp_pp_schedule sch, int pp, int s, int G, struct hp_pp_action *out);
/* The micro-batches stage s keeps at once under sch (its activation slots). */
int hp_pp_in_flight(enum hp_pp_schedule sch, int pp, int s, int G);
/* "gpipe", "1f1b". */
const char *hp_pp_schedule_name(enum hp_pp_schedule sch);

/*
 * The step's timeline with a forward taking 1 unit and a backward 2 (as a
 * transformer's backward is about twice its forward) and each action
 * starting when its stage is free and its input has arrived: the start of
 * every action (start[s * 2G + i] for stage s's action i, NULL: not
 * wanted) and the step's length in units (returned; -1 out of memory).
 * The bubble is the share of the stages' time spent idle:
 * 1 - 3 G / length.
 */
int hp_pp_timeline(enum hp_pp_schedule sch, int pp, int G, int *start);

#endif
