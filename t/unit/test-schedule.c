/*
 * test-schedule.c - the pipeline schedules of lib/plan/schedule.c, run on
 * paper: for every schedule, stages 2..8, chunks 1..4 and several
 * micro-batch counts,
 *   - every forward and backward of every (micro-batch, virtual stage)
 *     happens once, on the stage that holds it, the forward before the
 *     backward and each after the one that feeds it (dataflow);
 *   - each pair of stages sends and receives the same messages in the same
 *     order (MPI matches by order on one tag, NCCL by order alone: a
 *     mismatch hands a micro-batch another one's activations);
 *   - no exchange waits forever when every send waits for its receive
 *     (rendezvous, as large messages go), train lists and forward-only
 *     (evaluation) lists alike;
 *   - the slots hp_pp_slot hands out never hold two live micro-batches;
 *   - the counts everyone knows: 1F1B keeps min(pp - s, G), GPipe G, and
 *     the bubble of 1F1B with 4 stages and 8 micro-batches is 9/33.
 */
#include <string.h>

#include "base/alloc.h"
#include "plan/schedule.h"
#include "tap.h"

#define MAXN 4096

struct msg { int dir, mb, v; };
struct ex { int first_send, nsend, first_recv, nrecv; };

/* One stage's exchanges and what crosses in each, per peer channel. */
struct stage {
	struct hp_pp_action act[MAXN];
	int n, nex;
	struct ex ex[MAXN];
	struct { int peer; struct msg m; } send[MAXN], recv[MAXN];
	int ns, nr;
};

static struct stage st[8];

static void build(struct stage *x, int pp, int vpp, int s)
{
	int i = 0;

	x->nex = x->ns = x->nr = 0;
	/* exchange 0 before the first action, then one after each xchg */
	while (i <= x->n) {
		struct ex *e = &x->ex[x->nex++];
		int j = i;

		e->first_send = x->ns;
		e->first_recv = x->nr;
		/* sends: the actions of the group before this exchange */
		if (x->nex > 1) {
			int k = i - 1;

			while (k > 0 && !x->act[k - 1].xchg)
				k--;
			for (; k < i; k++) {
				const struct hp_pp_action *a = &x->act[k];
				int p = hp_pp_peer(pp, vpp, s, a, 0), v = a->chunk * pp + s;

				if (p >= 0) {
					x->send[x->ns].peer = p;
					x->send[x->ns++].m = (struct msg){ a->backward, a->mb, a->backward ? v - 1 : v + 1 };
				}
			}
		}
		/* receives: the inputs of the group after it */
		for (j = i; j < x->n; j++) {
			const struct hp_pp_action *a = &x->act[j];
			int p = hp_pp_peer(pp, vpp, s, a, 1);

			if (p >= 0) {
				x->recv[x->nr].peer = p;
				x->recv[x->nr++].m = (struct msg){ a->backward, a->mb, a->chunk * pp + s };
			}
			if (a->xchg)
				break;
		}
		e->nsend = x->ns - e->first_send;
		e->nrecv = x->nr - e->first_recv;
		i = j + 1;
	}
}

/* The exchange of stage s that holds its k-th message on the channel to
 * (send) or from (recv) peer p; -1 none. */
static int nth(const struct stage *x, int send, int p, int k)
{
	int at = 0;

	for (int e = 0; e < x->nex; e++) {
		const struct ex *q = &x->ex[e];
		int f = send ? q->first_send : q->first_recv, n = send ? q->nsend : q->nrecv;

		for (int i = f; i < f + n; i++)
			if ((send ? x->send[i].peer : x->recv[i].peer) == p && at++ == k)
				return e;
	}
	return -1;
}

/* Which message on its channel to (from) p the i-th send (receive) is. */
static int index_on(const struct stage *x, int send, int i, int p)
{
	int k = 0;

	for (int j = 0; j < (send ? x->ns : x->nr); j++) {
		if (j == i)
			return k;
		k += (send ? x->send[j].peer : x->recv[j].peer) == p;
	}
	return -1;
}

/* Messages in the same order on every channel, and no deadlock. */
static int check_comm(int pp, char *why, size_t wn)
{
	int cur[8] = { 0 }, moved = 1;

	for (int a = 0; a < pp; a++)
		for (int b = 0; b < pp; b++) {
			int ka = 0, kb = 0;
			const struct stage *A = &st[a], *B = &st[b];

			for (;;) {
				while (ka < A->ns && A->send[ka].peer != b)
					ka++;
				while (kb < B->nr && B->recv[kb].peer != a)
					kb++;
				if (ka == A->ns || kb == B->nr) {
					if (ka != A->ns || kb != B->nr) {
						snprintf(why, wn, "stages %d -> %d: counts differ", a, b);
						return 0;
					}
					break;
				}
				if (memcmp(&A->send[ka].m, &B->recv[kb].m, sizeof(struct msg))) {
					snprintf(why, wn, "stages %d -> %d: sent (%d,%d,%d), received for (%d,%d,%d)", a,
						 b, A->send[ka].m.dir, A->send[ka].m.mb, A->send[ka].m.v,
						 B->recv[kb].m.dir, B->recv[kb].m.mb, B->recv[kb].m.v);
					return 0;
				}
				ka++;
				kb++;
			}
		}
	/* an exchange ends once every partner has entered the exchange that
	 * holds its side of each message */
	while (moved) {
		moved = 0;
		for (int s = 0; s < pp; s++) {
			const struct stage *x = &st[s];
			const struct ex *e;
			int ready = 1;

			if (cur[s] >= x->nex)
				continue;
			e = &x->ex[cur[s]];
			for (int i = e->first_send; ready && i < e->first_send + e->nsend; i++) {
				int p = x->send[i].peer, k = index_on(x, 1, i, p);

				ready = cur[p] >= nth(&st[p], 0, s, k);
			}
			for (int i = e->first_recv; ready && i < e->first_recv + e->nrecv; i++) {
				int p = x->recv[i].peer, k = index_on(x, 0, i, p);

				ready = cur[p] >= nth(&st[p], 1, s, k);
			}
			if (ready) {
				cur[s]++;
				moved = 1;
			}
		}
	}
	for (int s = 0; s < pp; s++)
		if (cur[s] < st[s].nex) {
			snprintf(why, wn, "stage %d waits forever in exchange %d of %d", s, cur[s], st[s].nex);
			return 0;
		}
	return 1;
}

/* Each (micro-batch, chunk) forward once and backward once (train lists),
 * forward first; the slot it uses not held by another live one. */
static int check_stage(const struct stage *x, int pp, int vpp, int s, int G, int train, char *why, size_t wn)
{
	static int fw[MAXN], bw[MAXN], owner[MAXN];
	int per[HP_MAX_VPP], nslots = hp_pp_slots(x->act, x->n, pp, vpp, s, per);

	memset(fw, 0, sizeof(fw));
	memset(bw, 0, sizeof(bw));
	for (int i = 0; i < nslots; i++)
		owner[i] = -1;
	for (int i = 0; i < x->n; i++) {
		const struct hp_pp_action *a = &x->act[i];
		int k = a->chunk * G + a->mb, sl = hp_pp_slot(per, a->mb, a->chunk);

		if (a->mb < 0 || a->mb >= G || a->chunk < 0 || a->chunk >= vpp) {
			snprintf(why, wn, "stage %d action %d: micro-batch %d chunk %d", s, i, a->mb, a->chunk);
			return 0;
		}
		if (a->backward ? bw[k]++ || !fw[k] : fw[k]++) {
			snprintf(why, wn, "stage %d: %s of (%d, %d) again or early", s, a->backward ? "B" : "F", a->mb,
				 a->chunk);
			return 0;
		}
		/* a forward takes its slot at its exchange; a slot whose last
		 * micro-batch is done (backward run, or forward-only) is free */
		if (!a->backward) {
			int o = owner[sl];

			if (o >= 0 && (train ? !bw[o] : 0)) {
				snprintf(why, wn, "stage %d: (%d, %d) takes slot %d of (%d, %d), still alive", s,
					 a->mb, a->chunk, sl, o % G, o / G);
				return 0;
			}
			owner[sl] = k;
		}
	}
	for (int k = 0; train && k < G * vpp; k++)
		if (!fw[k] || !bw[k]) {
			snprintf(why, wn, "stage %d: (%d, %d) never ran", s, k % G, k / G);
			return 0;
		}
	return 1;
}

int main(void)
{
	char why[256];
	int bad = 0, runs = 0;

	for (int sch = 0; sch < 2; sch++)
		for (int pp = 2; pp <= 8; pp++)
			for (int vpp = 1; vpp <= (sch == HP_PP_GPIPE ? 1 : 4); vpp++)
				for (int G = vpp > 1 ? pp : 1; G <= 3 * pp; G += vpp > 1 ? pp : 1)
					for (int train = 1; train >= 0; train--) {
						int ok1 = 1;

						for (int s = 0; s < pp && ok1; s++) {
							st[s].n = train ? hp_pp_actions(sch, pp, vpp, s, G, st[s].act) :
								  hp_pp_forwards(pp, vpp, G, st[s].act);
							build(&st[s], pp, vpp, s);
							ok1 = check_stage(&st[s], pp, vpp, s, G, train, why, sizeof(why));
						}
						ok1 = ok1 && check_comm(pp, why, sizeof(why));
						if (ok1 && train && hp_pp_timeline(sch, pp, vpp, G, NULL) < 0) {
							snprintf(why, sizeof(why), "the timeline does not finish");
							ok1 = 0;
						}
						runs++;
						if (!ok1 && bad++ < 5)
							tap_diag("%s pp %d vpp %d G %d %s: %s", hp_pp_schedule_name(sch, vpp),
								 pp, vpp, G, train ? "train" : "forward-only", why);
					}
	is_int(bad, 0, "%d schedules: dataflow, message order, no deadlock, slots", runs);

	int good = 1;
	for (int pp = 2; pp <= 8; pp++)
		for (int G = 1; G <= 3 * pp; G++)
			for (int s = 0; s < pp; s++) {
				int want = pp - s < G ? pp - s : G;

				good &= hp_pp_in_flight(HP_PP_1F1B, pp, 1, s, G, NULL) == want &&
					hp_pp_in_flight(HP_PP_GPIPE, pp, 1, s, G, NULL) == G;
			}
	ok(good, "1F1B keeps min(pp - s, G) micro-batches, GPipe G");
	is_int(hp_pp_timeline(HP_PP_1F1B, 4, 1, 8, NULL), 33, "1F1B, 4 stages, 8 micro-batches: 33 units (bubble 9/33)");
	is_int(hp_pp_timeline(HP_PP_GPIPE, 4, 1, 8, NULL), 33, "GPipe, the same length");
	/* interleaving shortens the bubble: 4 stages, 2 chunks, 8 micro-batches */
	int li = hp_pp_timeline(HP_PP_1F1B, 4, 2, 8, NULL);
	ok(li > 0 && 1.0 - 48.0 / li < 9.0 / 33, "interleaved 1F1B (4 x 2, G 8): bubble %.4f < 1F1B's %.4f",
	   li > 0 ? 1.0 - 48.0 / li : 1.0, 9.0 / 33);
	int per[HP_MAX_VPP];
	is_int(hp_pp_in_flight(HP_PP_1F1B, 4, 2, 0, 8, per), 12, "interleaved 4 x 2, G 8, stage 0: 12 chunk slots");
	ok(per[0] == 8 && per[1] == 4, "... 8 for chunk 0, 4 for chunk 1 (got %d, %d)", per[0], per[1]);
	return tap_done();
}
