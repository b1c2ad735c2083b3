/*
 * schedule.h - pipeline schedules: the order in which a stage runs the
 * forwards and backwards of a step's micro-batches, where each action's
 * input comes from and its output goes, and what the order costs.
 * hp-train runs these lists (lib/train/train.c) and hp-plan draws and
 * times them (lib/plan/plan.c), so the two cannot disagree.
 *
 * A rank of stage s (0 <= s < pp) holds vpp chunks of layers: chunk c is
 * the virtual stage v = c pp + s of V = pp vpp (Megatron-LM's order: the
 * model's first layers on stage 0's chunk 0, its next on stage 1's chunk
 * 0, ..., stage pp-1's chunk 0 hands on to stage 0's chunk 1).
 *
 *   gpipe   every forward, then every backward (GPipe): a stage keeps the
 *           activations of all G micro-batches (vpp 1);
 *   1f1b    Megatron-LM's one-forward-one-backward: stage s runs
 *           min(pp - s - 1, G) forwards ahead, then alternates a forward
 *           and a backward, then runs the backwards left; it keeps at most
 *           min(pp - s, G) micro-batches' activations.  With vpp > 1 it
 *           is Megatron's interleaved 1F1B: the chunk-forwards run in
 *           groups of pp micro-batches per chunk, (pp - s - 1) 2 +
 *           (vpp - 1) pp of them ahead, and G must be a multiple of pp.
 *
 * Micro-batches are numbered 0..G-1 and complete in order within a chunk.
 *
 * The exchange.  Between two actions a stage may trade with its
 * neighbours, in one exchange, the outputs of the actions since the last
 * exchange and the inputs of those before the next (an action's xchg says
 * an exchange follows it).  Plain schedules exchange after every action
 * (Megatron's send_forward_recv_backward and its kin); interleaved 1F1B
 * after each forward-backward pair of its steady state
 * (send_forward_backward_recv_forward_backward), without which two stages
 * can each wait to send to the other.  t/unit/test-schedule.c checks, for
 * every schedule up to 8 stages and 4 chunks, that each pair of stages
 * sends and receives in the same order and that no exchange waits forever.
 */
#ifndef HP_SCHEDULE_H
#define HP_SCHEDULE_H

#include "config/config.h"

struct hp_pp_action {
	int backward;   /* 0: the forward of mb, 1: its backward */
	int mb;         /* the micro-batch, 0..G-1 */
	int chunk;      /* the rank's chunk, 0..vpp-1 */
	int xchg;       /* an exchange follows this action */
};

/* Stage s's 2 G vpp actions in order into out[2 G vpp]; returns their number. */
int hp_pp_actions(enum hp_pp_schedule sch, int pp, int vpp, int s, int G, struct hp_pp_action *out);
/* A stage's G vpp forwards alone, in the schedule's order (evaluation; the
 * same on every stage). */
int hp_pp_forwards(int pp, int vpp, int G, struct hp_pp_action *out);
/* The stage action a of stage s takes its input from (in 1) or hands its
 * output to (in 0); -1: none (the model's start or its loss). */
int hp_pp_peer(int pp, int vpp, int s, const struct hp_pp_action *a, int in);
/* Whether chunk c of stage s holds the root unit's layers (the embedding:
 * the first virtual stage; the final norm and LM head: the last). */
int hp_pp_root_chunk(int pp, int vpp, int s, int c);
/*
 * The activation slots stage s needs under its list act[n]: per chunk
 * (per_chunk[c], NULL: not wanted), the most micro-batches of the chunk
 * alive at once, alive from the exchange that brings its input (or its
 * forward) until the exchange that sends its input's gradient (or its
 * backward); one that leaves at an exchange frees its slot for one that
 * arrives in it (its gradient leaves from another buffer).  Returns the
 * sum; -1 out of memory.
 */
int hp_pp_slots(const struct hp_pp_action *act, int n, int pp, int vpp, int s, int *per_chunk);
/* The same for the schedule's own list. */
int hp_pp_in_flight(enum hp_pp_schedule sch, int pp, int vpp, int s, int G, int *per_chunk);
/* The slot of micro-batch mb of chunk c (per_chunk as above). */
int hp_pp_slot(const int *per_chunk, int mb, int c);
/* "gpipe", "1f1b", "interleaved_1f1b". */
const char *hp_pp_schedule_name(enum hp_pp_schedule sch, int vpp);

/*
 * The step's timeline with a chunk's forward taking 1 unit and its
 * backward 2 (as a transformer's backward is about twice its forward);
 * the actions between two exchanges start when the stage is free and
 * every input they receive has been sent (at the exchange after the
 * action that made it).  The start of every action (start[s * n + i] for
 * stage s's action i, n = 2 G vpp; NULL: not wanted) and the step's
 * length in units (returned; -1 out of memory or a list that cannot
 * finish).  The bubble is the share of the stages' time spent idle:
 * 1 - 3 G vpp / length.
 */
int hp_pp_timeline(enum hp_pp_schedule sch, int pp, int vpp, int G, int *start);

#endif
