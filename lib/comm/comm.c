/*
 * comm.c - the MPI backend of comm.h: communicators split from the plan's
 * coordinates, non-blocking collectives waited on with MPI_Test and
 * sched_yield under a timeout that names who has not arrived, and the byte
 * counters hp-plan's estimates are checked against.
 *
 * It does not recover from a timeout or a dead peer (MPI cannot shrink a
 * communicator here): it says why the job ends, and ends it.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fileio.h"
#include "base/log.h"
#include "comm/comm.h"

/* Every rank's pid and host (hp_comms_watch_peers), for naming a dead one. */
static struct { long pid; unsigned long host; } *peers;
static int npeers, me;
static unsigned long my_host;

static void check_peers(void);
static int answer(void);

static double timeout_s;

void hp_comm_set_timeout(double seconds)
{
	timeout_s = seconds > 0 ? seconds : 0;
}

/* Seconds spent in hp_comm_wait since the start (hp_comm_waited). */
static double waited, waited_op[HP_NCOLL];

double hp_comm_waited_in(int op)
{
	return op >= 0 && op < HP_NCOLL ? waited_op[op] : 0;
}

double hp_comm_waited(void)
{
	return waited;
}

/* --- the timed wait ----------------------------------------------------------- */

/*
 * Why a collective does not complete is a question about the other ranks,
 * and only they can answer it.  So every rank keeps, per group of ranks,
 * the number of collectives it has entered there, and while it waits in
 * one (and only then: the hot path pays nothing) it answers questions
 * every half millisecond, as it looks for dead peers.  A rank whose wait
 * passes the timeout asks every rank, with a few bytes each over a
 * communicator of its own (ask, a duplicate of the world), for its count on
 * the group of the collective and what it waits in; it gives them a grace
 * (at most GRACE_S) to answer.  A member whose count is below the asker's
 * has not arrived; a member that does not answer is stopped (its
 * /proc/PID/stat says T), gone, or busy outside hp's waits (computing, or
 * in a blocking MPI call).
 *
 * A stopped rank makes every rank wait, one after another, but only those
 * whose groups hold an unresponsive rank see the cause: the lowest of them
 * prints the one line and ends the job, and tells the others first (END),
 * so that none mistakes its exit for a death.  The others wait until it
 * should have done so (its own timeout, the grace and END_MARGIN_S), and
 * print and end the job themselves only if it is still running then.
 *
 * A group is a set of world ranks named on every member alike by a hash of
 * its members.  Two communicators over the same ranks (a dim and a raw
 * duplicate of it) are one group: every member calls both in the same
 * order, so the sum of their counts agrees as each count would.
 */
#define GRACE_S 3.0         /* waiting ranks answer in milliseconds; 3 s lets a
			       rank that computes on for a moment enter a wait */
#define END_MARGIN_S 5.0    /* the printer's drain_stderr (2 s at most) and the
			       launcher's teardown after its MPI_Abort */
#define NGROUPS 32          /* a plan's dims and a few raw communicators */
#define NHANDLES 32
#define NPENDING 64         /* started collectives not yet waited for (prefetch) */
#define NHOOKS 4
#define MAX_MEMBERS 256     /* of a group in an answer: 2 KiB, an eager message */
#define TAG_ASK 1
#define TAG_END 2
#define TAG_ANSWER 16       /* + the asker's round */
enum { A_COUNT, A_OP, A_DIM, A_GSIZE, A_ELAPSED_US, A_NMEM, A_TRUNC, A_HDR };

struct what {
	int op;                 /* enum hp_coll, HP_COMM_OP_*, or -1: not waiting */
	int group;              /* index in groups[], -1: not known */
	int dim;                /* the dim it was called on, -1: a raw communicator */
	int64_t seq;            /* its number among the group's collectives */
};

static struct group {
	uint64_t key;
	int size;
	int *members;           /* ranks in ask (else MPI_COMM_WORLD), in group order */
	int dim;                /* the first dim found with these members, or -1 */
	int64_t entered;
} groups[NGROUPS];
static int ngroups;
static struct { MPI_Comm comm; int size, group; } handles[NHANDLES];
static int nhandles;
static struct { MPI_Request req; struct what w; } pending[NPENDING];
static int npending;

static MPI_Comm ask = MPI_COMM_NULL;
static int ask_refs, ask_round;
static struct what cur = { -1, -1, -1, 0 };   /* what this rank waits in now */
static double cur_t0;
static double ending;                           /* when a peer said it ends the job */
static void (*hooks[NHOOKS])(void);

void hp_comm_on_timeout(void (*fn)(void))
{
	for (int i = 0; i < NHOOKS; i++)
		if (!hooks[i] || hooks[i] == fn) {
			hooks[i] = fn;
			return;
		}
}

/* The group of comm's ranks (-1 when the books are full): its members
 * translated to ask's ranks, hashed (FNV-1a) into the key every member
 * computes alike. */
static int group_of(MPI_Comm comm, int dim)
{
	MPI_Group g, wg;
	uint64_t key = 1469598103934665603ull;
	int n, *in, *out;

	MPI_Comm_size(comm, &n);
	if (!(in = hp_calloc(2 * (size_t)n, sizeof(int))))
		return -1;
	out = in + n;
	for (int i = 0; i < n; i++)
		in[i] = i;
	MPI_Comm_group(comm, &g);
	MPI_Comm_group(ask != MPI_COMM_NULL ? ask : MPI_COMM_WORLD, &wg);
	MPI_Group_translate_ranks(g, n, in, wg, out);
	MPI_Group_free(&g);
	MPI_Group_free(&wg);
	for (int i = 0; i < n; i++) {
		uint32_t v = (uint32_t)out[i];

		for (int b = 0; b < 4; b++)
			key = (key ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
	}
	for (int i = 0; i < ngroups; i++)
		if (groups[i].key == key) {
			hp_free(in);
			return i;
		}
	if (ngroups == NGROUPS) {
		hp_free(in);
		return -1;
	}
	memmove(in, out, (size_t)n * sizeof(int));
	groups[ngroups] = (struct group){ .key = key, .size = n, .members = in, .dim = dim };
	return ngroups++;
}

/* The group of a communicator that comm.h's structs do not describe,
 * remembered by handle (a freed handle that MPI hands out again for
 * another group is told apart by its size, which is all a cache can do). */
static int raw_group(MPI_Comm comm)
{
	int n, g;

	if (comm == MPI_COMM_NULL)
		return -1;
	MPI_Comm_size(comm, &n);
	for (int i = 0; i < nhandles; i++)
		if (handles[i].comm == comm && handles[i].size == n)
			return handles[i].group;
	if ((g = group_of(comm, -1)) >= 0 && nhandles < NHANDLES)
		handles[nhandles++] = (typeof(handles[0])){ comm, n, g };
	return g;
}

static int comm_group(struct hp_comm *c)
{
	if (c->slot > 0 && c->slot <= ngroups)
		return c->slot - 1;
	return raw_group(c->comm);
}

/* Count a collective entered on group g; what a wait for it is. */
static struct what enter(int g, int dim, int op)
{
	struct what w = { op, g, dim, 0 };

	if (g >= 0)
		w.seq = ++groups[g].entered;
	return w;
}

int64_t hp_comm_enter(struct hp_comm *c, int op)
{
	return c->size > 1 ? enter(comm_group(c), c->dim, op).seq : 0;
}

static void forget_groups(void)
{
	for (int i = 0; i < ngroups; i++)
		hp_free(groups[i].members);
	memset(groups, 0, sizeof(groups));
	ngroups = nhandles = npending = 0;
}

/* --- the one line, and the end of the job --- */

static void drain_stderr(void);

/* As people say them (hp_coll_name's are the plan's JSON keys). */
static const char *op_name(int op)
{
	static const char *const coll[HP_NCOLL] = {
		[HP_COLL_ALL_GATHER] = "all-gather", [HP_COLL_REDUCE_SCATTER] = "reduce-scatter",
		[HP_COLL_ALL_REDUCE] = "all-reduce", [HP_COLL_ALL_TO_ALL] = "all-to-all",
		[HP_COLL_ALL_TO_ALLV] = "all-to-allv", [HP_COLL_P2P] = "point-to-point send/receive",
	};

	switch (op) {
	case HP_COMM_OP_BROADCAST: return "broadcast";
	case HP_COMM_OP_BARRIER: return "barrier";
	case HP_COMM_OP_GATHER: return "gather";
	case HP_COMM_OP_DEVICE: return "its GPU's queue";
	}
	return op >= 0 && op < HP_NCOLL ? coll[op] : "a collective";
}

/* A line on stderr, built piece by piece; what does not fit is cut. */
struct line {
	char b[1024];
	size_t at;
};

__attribute__((format(printf, 2, 3)))
static void put(struct line *l, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (l->at >= sizeof(l->b) - 1)
		return;
	va_start(ap, fmt);
	n = vsnprintf(l->b + l->at, sizeof(l->b) - 1 - l->at, fmt, ap);
	va_end(ap);
	if (n > 0)
		l->at += (size_t)n;
	if (l->at > sizeof(l->b) - 2)
		l->at = sizeof(l->b) - 2;
}

/* "all-reduce on dp_shard", "gather on world", "a collective on a group of
 * 3 ranks" (g < 0: of gsize ranks); op alone when the group is not known */
static void put_what(struct line *l, int op, int dim, int g, int gsize)
{
	int ws = 0;

	if (ask != MPI_COMM_NULL)
		MPI_Comm_size(ask, &ws);
	if (dim < 0 && g >= 0) {
		dim = groups[g].size == ws ? HP_COMM_WORLD : groups[g].dim;
		gsize = groups[g].size;
	}
	if (op == HP_COMM_OP_DEVICE || (dim < 0 && gsize <= 0))
		put(l, "%s", op_name(op));
	else if (dim >= 0)
		put(l, "%s on %s", op_name(op), hp_comm_dim_name(dim));
	else
		put(l, "%s on a group of %d ranks", op_name(op), gsize);
}

/* Run the hooks, remove the temporaries, end the job (MPI_Abort's status
 * is mpiexec's). */
static void end_job(void)
{
	for (int i = 0; i < NHOOKS && hooks[i]; i++)
		hooks[i]();
	hp_tmp_remove_all();
	MPI_Abort(MPI_COMM_WORLD, 1);
	_exit(1);
}

/* Tell every rank that this one ends the job, and give them a moment to
 * read it (they look every half millisecond while they wait) before this
 * process is gone. */
static void say_end(void)
{
	static int64_t none;
	struct timespec moment = { 0, 50 * 1000 * 1000 };
	int n;

	if (ask == MPI_COMM_NULL)
		return;
	MPI_Comm_size(ask, &n);
	for (int r = 0; r < n; r++) {
		MPI_Request q;

		if (r == me)
			continue;
		MPI_Isend(&none, 1, MPI_INT64_T, r, TAG_END, ask, &q);
		MPI_Request_free(&q);
	}
	nanosleep(&moment, NULL);
}

/* A peer ends the job and has said why: wait for the launcher to end this
 * rank too, answering; should it not come, end the job 10 s after, silently. */
static void quiet_end(void)
{
	struct timespec ms = { 0, 1000 * 1000 };

	for (;;) {
		answer();
		if (MPI_Wtime() - ending > 10)
			end_job();
		nanosleep(&ms, NULL);
	}
}

static const char *stat_state(long pid, char *st, size_t cap, ssize_t *n);
static int gone(long pid);

/* The state letter of pid ('R', 'S', 'T'...), 0 when it cannot be read. */
static char proc_state(long pid)
{
	char st[256];
	ssize_t n;
	const char *s = stat_state(pid, st, sizeof(st), &n);

	return s ? *s : 0;
}

/* Why rank r, which does not answer, does not: what its /proc entry says
 * when it is on this host. */
static const char *silent_why(int r)
{
	char s;

	if (r >= npeers || peers[r].host != my_host)
		return "not responding";
	if (gone(peers[r].pid))
		return "gone";
	s = proc_state(peers[r].pid);
	return s == 'T' || s == 't' ? "stopped" : "running, not in a collective";
}

/* Whether rank r is known never to answer: stopped or gone. */
static int known_silent(int r)
{
	const char *why = silent_why(r);

	return !strcmp(why, "stopped") || !strcmp(why, "gone");
}

/* --- answering --- */

/* Answer the questions that have come, and take note of an END; returns
 * whether a peer is ending the job. */
static int answer(void)
{
	int flag;
	MPI_Status st;
	int64_t q[3], a[A_HDR + MAX_MEMBERS];

	if (ask == MPI_COMM_NULL)
		return 0;
	for (;;) {
		MPI_Iprobe(MPI_ANY_SOURCE, TAG_ASK, ask, &flag, &st);
		if (!flag)
			break;
		MPI_Recv(q, 3, MPI_INT64_T, st.MPI_SOURCE, TAG_ASK, ask, MPI_STATUS_IGNORE);
		memset(a, 0, sizeof(a));
		for (int i = 0; i < ngroups; i++)
			if (groups[i].key == (uint64_t)q[0])
				a[A_COUNT] = groups[i].entered;
		a[A_OP] = cur.op;
		a[A_DIM] = cur.dim;
		a[A_GSIZE] = cur.group >= 0 ? groups[cur.group].size : 0;
		a[A_ELAPSED_US] = (int64_t)((MPI_Wtime() - cur_t0) * 1e6);
		if (cur.group >= 0) {
			struct group *g = &groups[cur.group];

			a[A_NMEM] = g->size < MAX_MEMBERS ? g->size : MAX_MEMBERS;
			a[A_TRUNC] = g->size > MAX_MEMBERS;
			for (int i = 0; i < a[A_NMEM]; i++)
				a[A_HDR + i] = g->members[i];
		}
		MPI_Send(a, (int)(A_HDR + a[A_NMEM]), MPI_INT64_T, st.MPI_SOURCE, (int)q[2], ask);
	}
	MPI_Iprobe(MPI_ANY_SOURCE, TAG_END, ask, &flag, &st);
	if (flag) {
		int64_t x;

		MPI_Recv(&x, 1, MPI_INT64_T, st.MPI_SOURCE, TAG_END, ask, MPI_STATUS_IGNORE);
		if (!ending)
			ending = MPI_Wtime();
	}
	return ending != 0;
}

/* --- asking --- */

struct reply {
	int answered;
	int64_t a[A_HDR];
	int *mem;               /* A_NMEM members (hp_malloc) */
};

/* Ask every rank of ask about w's group (answering meanwhile); NULL when
 * there is nobody to ask or no memory.  Returns early, with the wait's
 * request done, when test(arg) says so (*done set). */
static struct reply *inquire(const struct what *w, int (*test)(void *), void *arg, int *done)
{
	static int64_t qs[4][3];   /* a question's bytes stay until it is sent */
	int64_t *q = qs[ask_round % 4];
	struct reply *rep;
	int n, left;
	double t0 = MPI_Wtime(), grace = timeout_s < GRACE_S ? timeout_s : GRACE_S, last = 0;

	if (ask == MPI_COMM_NULL)
		return NULL;
	MPI_Comm_size(ask, &n);
	if (!(rep = hp_calloc((size_t)n, sizeof(*rep))))
		return NULL;
	q[0] = w->group >= 0 ? (int64_t)groups[w->group].key : 0;
	q[1] = w->seq;
	q[2] = TAG_ANSWER + ask_round++ % 1000;
	for (int r = 0; r < n; r++) {
		MPI_Request req;

		if (r == me)
			continue;
		MPI_Isend(q, 3, MPI_INT64_T, r, TAG_ASK, ask, &req);
		MPI_Request_free(&req);
	}
	left = n - 1;
	while (left > 0 && MPI_Wtime() - t0 < grace) {
		MPI_Status st;
		int flag, cnt;

		answer();
		if ((*done = test(arg)) != 0)
			return rep;
		MPI_Iprobe(MPI_ANY_SOURCE, (int)q[2], ask, &flag, &st);
		if (flag) {
			int64_t a[A_HDR + MAX_MEMBERS];
			struct reply *p = &rep[st.MPI_SOURCE];

			MPI_Get_count(&st, MPI_INT64_T, &cnt);
			MPI_Recv(a, A_HDR + MAX_MEMBERS, MPI_INT64_T, st.MPI_SOURCE, (int)q[2], ask,
				 MPI_STATUS_IGNORE);
			if (p->answered || cnt < A_HDR)
				continue;
			memcpy(p->a, a, sizeof(p->a));
			if (p->a[A_NMEM] > cnt - A_HDR)
				p->a[A_NMEM] = cnt - A_HDR;
			if (p->a[A_NMEM] > 0 && !(p->mem = hp_calloc((size_t)p->a[A_NMEM], sizeof(int)))) {
				p->a[A_NMEM] = 0;   /* its members unknown: as a cut list */
				p->a[A_TRUNC] = 1;
			}
			for (int i = 0; i < p->a[A_NMEM]; i++)
				p->mem[i] = (int)a[A_HDR + i];
			p->answered = 1;
			left--;
			continue;
		}
		/* a stopped or dead peer on this host will not answer: no need to
		 * give it the grace (looked at every 10 ms, /proc is not free) */
		if (MPI_Wtime() - last > 0.01) {
			int all = 1;

			for (int r = 0; r < n && all; r++)
				if (r != me && !rep[r].answered && !known_silent(r))
					all = 0;
			if (all)
				break;
			last = MPI_Wtime();
		}
		sched_yield();
	}
	rep[me].answered = 1;
	return rep;
}

static void free_replies(struct reply *rep)
{
	int n = 0;

	if (!rep)
		return;
	MPI_Comm_size(ask, &n);
	for (int r = 0; r < n; r++)
		hp_free(rep[r].mem);
	hp_free(rep);
}

/* Whether reply p's wait (or this rank's, p NULL) is held by a silent rank:
 * its group holds one, or its group is not known and any is silent. */
static int held_by_silent(const struct reply *rep, int n, const struct reply *p)
{
	int any = 0;

	for (int r = 0; r < n; r++)
		any |= !rep[r].answered;
	if (!any)
		return 0;
	if (!p) {
		if (cur.group < 0)
			return 1;
		for (int i = 0; i < groups[cur.group].size; i++) {
			int m = groups[cur.group].members[i];

			if (m >= 0 && m < n && !rep[m].answered)
				return 1;
		}
		return 0;
	}
	if (p->a[A_GSIZE] <= 0 || p->a[A_TRUNC])
		return 1;
	for (int i = 0; i < p->a[A_NMEM]; i++)
		if (p->mem[i] >= 0 && p->mem[i] < n && !rep[p->mem[i]].answered)
			return 1;
	return 0;
}

/*
 * The line: "TOOL: rank R: all-gather on dp_shard waited 3.0 s
 * (training.collective_timeout_s): rank 3 has not arrived (stopped)"; or
 * "ranks 1 (waiting in all-reduce on dp_replicate), 3 (stopped) have not
 * arrived"; with the group not known, the ranks that do not respond.
 */
static void say_timeout(const struct what *w, double held, const struct reply *rep, int n)
{
	struct line l = { .at = 0 };
	int *who = NULL, nwho = 0, known = w->group >= 0;

	put(&l, "%s: rank %d: ", hp_log_tool(), me);
	put_what(&l, w->op, w->dim, w->group, 0);
	put(&l, " waited %.*f s (training.collective_timeout_s)", held < 10 ? 1 : 0, held);
	/* who: the members not arrived, else the silent ranks */
	if (rep && (who = hp_calloc((size_t)n, sizeof(int)))) {
		for (int i = 0; i < (known ? groups[w->group].size : n); i++) {
			int r = known ? groups[w->group].members[i] : i;

			if (r != me && r >= 0 && r < n &&
			    (!rep[r].answered || (known && rep[r].a[A_COUNT] < w->seq)))
				who[nwho++] = r;
		}
	}
	if (!who)
		put(&l, "; its peers could not be asked");
	else if (!nwho)
		put(&l, known ? ": every rank of the group has arrived" : ": every rank answers from a wait");
	else
		put(&l, ": rank%s ", nwho > 1 ? "s" : "");
	for (int i = 0; i < nwho && i < 8; i++) {
		const struct reply *p = &rep[who[i]];

		/* one rank: "rank 3 has not arrived (stopped)" */
		if (nwho == 1)
			put(&l, "%d %s (", who[i], known ? "has not arrived" : "does not respond");
		else
			put(&l, "%s%d (", i ? ", " : "", who[i]);
		if (!p->answered) {
			put(&l, "%s", silent_why(who[i]));
		} else {
			put(&l, "waiting in ");
			put_what(&l, (int)p->a[A_OP], (int)p->a[A_DIM], -1, (int)p->a[A_GSIZE]);
		}
		put(&l, ")");
	}
	if (nwho > 8)
		put(&l, " and %d more", nwho - 8);
	if (nwho > 1)
		put(&l, known ? " have not arrived" : " do not respond");
	l.b[l.at++] = '\n';
	hp_free(who);
	if (write(STDERR_FILENO, l.b, l.at) < 0)
		return;
	drain_stderr();
}

/* The rank that prints, of those that answered: the lowest whose wait a
 * silent rank holds, else (no silent rank, or none that holds a wait: a
 * cycle of waits) the lowest. */
static int choose_printer(const struct reply *rep, int n)
{
	for (int r = 0; r < n; r++)
		if (rep[r].answered && held_by_silent(rep, n, r == me ? NULL : &rep[r]))
			return r;
	for (int r = 0; r < n; r++)
		if (rep[r].answered)
			return r;
	return me;
}

/*
 * This rank's wait for w has passed the timeout.  Ask, then print and end
 * the job, or leave that to the rank choose_printer names (see above).
 * Returns only when the wait completed meanwhile (a stopped rank went on).
 */
static void timed_out(struct what *w, int (*test)(void *), void *arg,
		      void (*blame)(void *, struct hp_comm_what *), void *barg)
{
	struct reply *rep;
	double held = MPI_Wtime() - cur_t0;
	int n = 1, done = 0;

	if (blame) {
		struct hp_comm_what hw = { NULL, HP_COMM_OP_UNKNOWN, 0 };

		blame(barg, &hw);
		w->op = hw.op;
		w->dim = hw.c ? hw.c->dim : -1;
		w->group = hw.c && hw.c->size > 1 ? comm_group(hw.c) : -1;
		w->seq = hw.seq;
		cur = *w;   /* what it answers from now on */
	}
	rep = inquire(w, test, arg, &done);
	if (done) {
		free_replies(rep);
		return;
	}
	if (rep) {
		int printer;

		MPI_Comm_size(ask, &n);
		printer = choose_printer(rep, n);
		if (printer != me) {
			/* until it should have ended the job: its timeout, its
			 * questions, its line; answering meanwhile */
			double left = timeout_s - (double)rep[printer].a[A_ELAPSED_US] * 1e-6;
			double until = MPI_Wtime() + (left > 0 ? left : 0) +
				       (timeout_s < GRACE_S ? timeout_s : GRACE_S) + END_MARGIN_S;

			while (MPI_Wtime() < until && !answer()) {
				if (test(arg)) {
					free_replies(rep);
					return;
				}
				sched_yield();
			}
		}
	}
	/* a peer that has said it ends the job has said why */
	if (answer()) {
		free_replies(rep);
		quiet_end();
	}
	say_timeout(w, held, rep, n);
	free_replies(rep);
	say_end();
	end_job();
}

struct req_arg {
	MPI_Request *req;
};

static int test_req(void *arg)
{
	int done = 0;

	MPI_Test(((struct req_arg *)arg)->req, &done, MPI_STATUS_IGNORE);
	return done;
}

/*
 * The wait: test, yield, and every half millisecond look for dead peers,
 * answer questions and check the timeout.  After a peer's END nothing is
 * looked for: the peer that ends the job is not dead, it has said why, and
 * the launcher ends this rank soon (quiet_end).
 * Returns test's value when non-zero.
 */
static int wait_for(struct what *w, int (*test)(void *), void *arg,
		    void (*blame)(void *, struct hp_comm_what *), void *barg)
{
	struct what prev = cur;
	double t0 = MPI_Wtime(), start = t0, prev_t0 = cur_t0, last = t0, now;
	int rc;

	cur = *w;
	cur_t0 = t0;
	for (;;) {
		if ((rc = test(arg)) != 0)
			break;
		sched_yield();
		/* a wait may be for a dead peer: look every half millisecond, before
		 * the launcher's clean-up ends this process without a word */
		if ((now = MPI_Wtime()) - last <= 5e-4)
			continue;
		if (answer())
			quiet_end();
		if (npeers)
			check_peers();
		if (timeout_s > 0 && now - t0 > timeout_s) {
			timed_out(w, test, arg, blame, barg);
			t0 = cur_t0 = MPI_Wtime();   /* it went on: a new wait */
		}
		last = MPI_Wtime();
	}
	now = MPI_Wtime() - start;
	waited += now;
	if (w->op >= 0 && w->op < HP_NCOLL)
		waited_op[w->op] += now;
	cur = prev;
	cur_t0 = prev_t0;
	return rc;
}

static void wait_what(MPI_Request *req, struct what w)
{
	struct req_arg a = { req };

	if (*req != MPI_REQUEST_NULL)
		wait_for(&w, test_req, &a, NULL, NULL);
}

void hp_comm_wait(MPI_Request *req)
{
	struct what w = { HP_COMM_OP_UNKNOWN, -1, -1, 0 };

	/* a request this file started: what it is, and out of the books */
	for (int i = 0; i < npending; i++)
		if (pending[i].req == *req) {
			w = pending[i].w;
			pending[i] = pending[--npending];
			break;
		}
	wait_what(req, w);
}

void hp_comm_wait_op(MPI_Request *req, MPI_Comm c, int op)
{
	wait_what(req, enter(raw_group(c), -1, op));
}

int hp_comm_wait_until(int (*done)(void *arg), void (*what)(void *arg, struct hp_comm_what *w), void *arg)
{
	struct what w = { HP_COMM_OP_DEVICE, -1, -1, 0 };
	int rc = wait_for(&w, done, arg, what, arg);

	return rc < 0 ? rc : 0;
}

void hp_comm_allreduce_raw(MPI_Comm c, void *buf, int n, MPI_Datatype t, MPI_Op op)
{
	MPI_Request req;

	MPI_Iallreduce(MPI_IN_PLACE, buf, n, t, op, c, &req);
	hp_comm_wait_op(&req, c, HP_COLL_ALL_REDUCE);
}

void hp_comm_bcast_raw(MPI_Comm c, void *buf, int n, MPI_Datatype t, int root)
{
	MPI_Request req;

	MPI_Ibcast(buf, n, t, root, c, &req);
	hp_comm_wait_op(&req, c, HP_COMM_OP_BROADCAST);
}

/* The MPI type of t; 16-bit floats travel as raw 16-bit words (they can be
 * gathered and exchanged, not reduced). */
static MPI_Datatype mpi_type(enum hp_dtype t, int reduce)
{
	switch (t) {
	case HP_DTYPE_F32: return MPI_FLOAT;
	case HP_DTYPE_F64: return MPI_DOUBLE;
	case HP_DTYPE_I32: return MPI_INT32_T;
	case HP_DTYPE_I64: return MPI_INT64_T;
	case HP_DTYPE_U8: return MPI_UINT8_T;
	case HP_DTYPE_BF16: case HP_DTYPE_F16: return reduce ? MPI_DATATYPE_NULL : MPI_UINT16_T;
	default: return MPI_DATATYPE_NULL;
	}
}

static MPI_Op mpi_op(enum hp_red op)
{
	return op == HP_RED_MAX ? MPI_MAX : op == HP_RED_MIN ? MPI_MIN : MPI_SUM;
}

static int bad_args(struct hp_err *e, const char *what, enum hp_dtype t, size_t n)
{
	return hp_err_set(e, HP_EINVAL, "%s of %zu %s: not a type or size MPI takes here", what, n,
			  hp_dtype_name(t));
}

void hp_comm_count(struct hp_comm *c, enum hp_coll op, uint64_t bytes, int routed)
{
	c->calls[op]++;
	c->bytes[op] += (int64_t)bytes;
	if (routed)
		c->routed[op] += (int64_t)bytes;
}

static void count(struct hp_comm *c, enum hp_coll op, uint64_t bytes, int routed)
{
	if (!c->quiet)
		hp_comm_count(c, op, bytes, routed);
}

int hp_comms_init(struct hp_comms *cs, MPI_Comm world, const int lay[HP_NDIM], struct hp_err *e)
{
	int rank, size;

	memset(cs, 0, sizeof(*cs));
	MPI_Comm_rank(world, &rank);
	MPI_Comm_size(world, &size);
	if (size != hp_mesh_world(lay))
		return hp_err_set(e, HP_EINVAL, "%d processes for a plan of %d ranks", size, hp_mesh_world(lay));
	cs->world_rank = rank;
	cs->world_size = size;
	for (int d = 0; d <= HP_NDIM; d++) {
		struct hp_comm *c = &cs->dim[d];

		c->dim = d;
		c->comm = MPI_COMM_NULL;
		if (d == HP_COMM_WORLD) {
			c->rank = rank;
			c->size = size;
			if (size > 1)
				MPI_Comm_dup(world, &c->comm);
			continue;
		}
		/* the group along d is the ranks that differ from this one only in
		 * d; its smallest member names it, the coordinate orders it */
		int *g = hp_calloc((size_t)size, sizeof(int));

		if (!g) {
			hp_comms_free(cs);
			return hp_err_set(e, HP_ENOMEM, "out of memory");
		}
		c->size = hp_mesh_group(lay, (enum hp_dim)d, rank, g);
		c->rank = hp_mesh_coord(lay, (enum hp_dim)d, rank);
		if (c->size > 1)
			MPI_Comm_split(world, g[0], c->rank, &c->comm);
		hp_free(g);
	}
	/* the timeout's questions travel apart from every collective; the
	 * books start here, on every rank alike */
	if (size > 1) {
		if (!ask_refs++) {
			forget_groups();
			MPI_Comm_dup(world, &ask);
		}
		me = rank;
		cs->asks = 1;
		for (int d = 0; d <= HP_NDIM; d++) {
			struct hp_comm *c = &cs->dim[d];

			if (c->size > 1)
				c->slot = group_of(c->comm, d) + 1;
		}
	}
	return 0;
}

void hp_comms_free(struct hp_comms *cs)
{
	for (int d = 0; d <= HP_NDIM; d++)
		if (cs->dim[d].comm != MPI_COMM_NULL && cs->dim[d].comm != 0)
			MPI_Comm_free(&cs->dim[d].comm);
	if (cs->asks && !--ask_refs) {
		MPI_Comm_free(&ask);
		forget_groups();
	}
	memset(cs, 0, sizeof(*cs));
}

void hp_comms_reset(struct hp_comms *cs)
{
	for (int d = 0; d <= HP_NDIM; d++) {
		memset(cs->dim[d].calls, 0, sizeof(cs->dim[d].calls));
		memset(cs->dim[d].bytes, 0, sizeof(cs->dim[d].bytes));
		memset(cs->dim[d].routed, 0, sizeof(cs->dim[d].routed));
	}
}

int hp_comm_allreduce(struct hp_comm *c, void *buf, size_t n, enum hp_dtype t, enum hp_red op,
		      struct hp_err *e)
{
	MPI_Datatype mt = mpi_type(t, 1);
	MPI_Request req;

	if (mt == MPI_DATATYPE_NULL || n > INT_MAX)
		return bad_args(e, "all-reduce", t, n);
	if (c->size <= 1 || !n)
		return 0;
	count(c, HP_COLL_ALL_REDUCE, n * hp_dtype_size(t), 0);
	MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, mt, mpi_op(op), c->comm, &req);
	wait_what(&req, enter(comm_group(c), c->dim, HP_COLL_ALL_REDUCE));
	return 0;
}

/* A started request and what it is, for hp_comm_wait.  A handle MPI hands
 * out again belongs to a request that ended without hp_comm_wait: its
 * entry goes; a full book forgets the oldest (whose handle, should it
 * still be waited for, is then "a collective"). */
static void book(MPI_Request req, struct what w)
{
	for (int i = 0; i < npending; i++)
		if (pending[i].req == req)
			pending[i] = pending[--npending];
	if (npending == NPENDING) {
		npending--;
		memmove(pending, pending + 1, (size_t)npending * sizeof(pending[0]));
	}
	pending[npending].req = req;
	pending[npending++].w = w;
}

/* A started collective's rc, after waiting for it when it started: the
 * blocking calls */
static int finished(int rc, MPI_Request *req)
{
	if (!rc && *req != MPI_REQUEST_NULL)
		hp_comm_wait(req);
	return rc;
}

int hp_comm_iallgather(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
		       MPI_Request *req, struct hp_err *e)
{
	MPI_Datatype mt = mpi_type(t, 0);
	struct what w;

	*req = MPI_REQUEST_NULL;
	if (mt == MPI_DATATYPE_NULL || n > INT_MAX)
		return bad_args(e, "all-gather", t, n);
	if (c->size <= 1) {
		if (send != recv)
			memmove(recv, send, n * hp_dtype_size(t));
		return 0;
	}
	count(c, HP_COLL_ALL_GATHER, n * hp_dtype_size(t), 0);
	w = enter(comm_group(c), c->dim, HP_COLL_ALL_GATHER);
	MPI_Iallgather(send, (int)n, mt, recv, (int)n, mt, c->comm, req);
	book(*req, w);
	return 0;
}

int hp_comm_allgather(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
		      struct hp_err *e)
{
	MPI_Request req;

	return finished(hp_comm_iallgather(c, send, recv, n, t, &req, e), &req);
}

int hp_comm_ireduce_scatter(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
			    enum hp_red op, MPI_Request *req, struct hp_err *e)
{
	MPI_Datatype mt = mpi_type(t, 1);
	struct what w;

	*req = MPI_REQUEST_NULL;
	if (mt == MPI_DATATYPE_NULL || n > INT_MAX)
		return bad_args(e, "reduce-scatter", t, n);
	if (c->size <= 1) {
		if (send != recv)
			memmove(recv, send, n * hp_dtype_size(t));
		return 0;
	}
	count(c, HP_COLL_REDUCE_SCATTER, (uint64_t)c->size * n * hp_dtype_size(t), 0);
	w = enter(comm_group(c), c->dim, HP_COLL_REDUCE_SCATTER);
	MPI_Ireduce_scatter_block(send, recv, (int)n, mt, mpi_op(op), c->comm, req);
	book(*req, w);
	return 0;
}

int hp_comm_reduce_scatter(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
			   enum hp_red op, struct hp_err *e)
{
	MPI_Request req;

	return finished(hp_comm_ireduce_scatter(c, send, recv, n, t, op, &req, e), &req);
}

int hp_comm_ialltoall(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
		      MPI_Request *req, struct hp_err *e)
{
	MPI_Datatype mt = mpi_type(t, 0);
	struct what w;

	*req = MPI_REQUEST_NULL;
	if (mt == MPI_DATATYPE_NULL || n > INT_MAX)
		return bad_args(e, "all-to-all", t, n);
	if (c->size <= 1) {
		if (send != recv)
			memmove(recv, send, n * hp_dtype_size(t));
		return 0;
	}
	count(c, HP_COLL_ALL_TO_ALL, (uint64_t)c->size * n * hp_dtype_size(t), 0);
	w = enter(comm_group(c), c->dim, HP_COLL_ALL_TO_ALL);
	MPI_Ialltoall(send, (int)n, mt, recv, (int)n, mt, c->comm, req);
	book(*req, w);
	return 0;
}

int hp_comm_alltoall(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
		     struct hp_err *e)
{
	MPI_Request req;

	return finished(hp_comm_ialltoall(c, send, recv, n, t, &req, e), &req);
}

int hp_comm_alltoallv(struct hp_comm *c, const void *send, const int *scounts, const int *sdispls,
		      void *recv, const int *rcounts, const int *rdispls, enum hp_dtype t, int routed,
		      struct hp_err *e)
{
	MPI_Datatype mt = mpi_type(t, 0);
	MPI_Request req;
	uint64_t n = 0;

	if (mt == MPI_DATATYPE_NULL)
		return bad_args(e, "all-to-allv", t, 0);
	for (int r = 0; r < c->size; r++)
		n += (uint64_t)scounts[r];
	if (c->size <= 1) {
		if (scounts[0])
			memmove((char *)recv + (size_t)rdispls[0] * hp_dtype_size(t),
				(const char *)send + (size_t)sdispls[0] * hp_dtype_size(t),
				(size_t)scounts[0] * hp_dtype_size(t));
		return 0;
	}
	count(c, HP_COLL_ALL_TO_ALLV, n * hp_dtype_size(t), routed);
	MPI_Ialltoallv(send, scounts, sdispls, mt, recv, rcounts, rdispls, mt, c->comm, &req);
	wait_what(&req, enter(comm_group(c), c->dim, HP_COLL_ALL_TO_ALLV));
	return 0;
}

int hp_comm_sendrecv(struct hp_comm *c, const struct hp_p2p *ops, int n, struct hp_err *e)
{
	MPI_Request req[HP_P2P_MAX];
	/* who waits for whom differs from rank to rank: no group books */
	struct what w = { HP_COLL_P2P, -1, c->dim, 0 };

	if (n > HP_P2P_MAX)
		return hp_err_set(e, HP_EINVAL, "point-to-point: %d transfers at once, %d at most", n, HP_P2P_MAX);
	for (int i = 0; i < n; i++) {
		const struct hp_p2p *o = &ops[i];
		MPI_Datatype mt = mpi_type(o->t, 0);

		if (mt == MPI_DATATYPE_NULL || o->n > INT_MAX || o->peer < 0 || o->peer >= c->size || o->peer == c->rank)
			return bad_args(e, "point-to-point send/receive", o->t, o->n);
	}
	for (int i = 0; i < n; i++) {
		const struct hp_p2p *o = &ops[i];
		MPI_Datatype mt = mpi_type(o->t, 0);

		if (o->send) {
			count(c, HP_COLL_P2P, o->n * hp_dtype_size(o->t), 0);
			MPI_Isend(o->send, (int)o->n, mt, o->peer, 0, c->comm, &req[i]);
		} else {
			MPI_Irecv(o->recv, (int)o->n, mt, o->peer, 0, c->comm, &req[i]);
		}
	}
	for (int i = 0; i < n; i++)
		wait_what(&req[i], w);
	return 0;
}

int hp_comm_bcast(struct hp_comm *c, void *buf, size_t n, enum hp_dtype t, int root, struct hp_err *e)
{
	MPI_Datatype mt = mpi_type(t, 0);
	MPI_Request req;

	if (mt == MPI_DATATYPE_NULL || n > INT_MAX)
		return bad_args(e, "broadcast", t, n);
	if (c->size <= 1)
		return 0;
	MPI_Ibcast(buf, (int)n, mt, root, c->comm, &req);
	wait_what(&req, enter(comm_group(c), c->dim, HP_COMM_OP_BROADCAST));
	return 0;
}

int hp_comm_barrier(struct hp_comm *c)
{
	MPI_Request req;

	if (c->size <= 1)
		return 0;
	MPI_Ibarrier(c->comm, &req);
	wait_what(&req, enter(comm_group(c), c->dim, HP_COMM_OP_BARRIER));
	return 0;
}

/* --- naming a dead peer ------------------------------------------------------ */

/*
 * When a rank dies, MPI's launcher tears the job down (SIGTERM to the
 * others) or the transport aborts a survivor (SIGABRT); neither says which
 * rank died.  Every rank learns every rank's pid and host at start-up, and
 * a survivor's handler, before the process ends, looks for the peers on its
 * host that no longer exist and names them.  Only async-signal-safe calls
 * (kill, open, read, write) run in the handler.
 */

/* pid's /proc/PID/stat read into st ("pid (comm) S ppid pgrp session tty
 * tpgid flags ..."), and where its state letter is, after the last ')';
 * NULL when it cannot be read.  *n: the bytes read.  Async-signal-safe. */
static const char *stat_state(long pid, char *st, size_t cap, ssize_t *n)
{
	char path[40];
	size_t at = hp_sig_put_str(path, 0, sizeof(path) - 1, "/proc/");
	int fd;

	at = hp_sig_put_num(path, at, sizeof(path) - 1, pid);
	at = hp_sig_put_str(path, at, sizeof(path) - 1, "/stat");
	path[at] = '\0';
	*n = -1;
	if ((fd = open(path, O_RDONLY)) < 0)
		return NULL;
	*n = read(fd, st, cap - 1);
	close(fd);
	for (ssize_t i = *n - 1; i > 0; i--)
		if (st[i] == ')')
			return i + 2 < *n ? st + i + 2 : NULL;
	return NULL;
}

/* Whether pid has ended: no such process, or a zombie its parent (the
 * launcher's proxy) has not reaped yet.  Async-signal-safe. */
static int gone(long pid)
{
	char st[256];
	const char *s;
	ssize_t n;
	unsigned long flags = 0;
	int field = 0;

	if (kill((pid_t)pid, 0) != 0)
		return errno == ESRCH;
	if (!(s = stat_state(pid, st, sizeof(st), &n)))
		return n < 0 && errno == ENOENT;
	if (*s == 'Z' || *s == 'X')
		return 1;
	/* six fields on from the state, the flags, where PF_EXITING (0x4)
	 * marks a process already dying of its signal */
	for (; s < st + n && field < 7; s++) {
		if (*s == ' ') {
			field++;
			continue;
		}
		if (field == 6 && *s >= '0' && *s <= '9')
			flags = flags * 10 + (unsigned long)(*s - '0');
	}
	return (flags & 0x4) != 0;
}

/* When stderr is a pipe to the launcher's proxy (Hydra, slurmstepd), wait
 * (at most 2 s) until the proxy has read what is in it: the abort that
 * follows travels on another channel, and a proxy that handles it first
 * tears the job down with the message still unread in the pipe.
 * Async-signal-safe. */
static void drain_stderr(void)
{
	struct stat st;
	struct timespec ms = { 0, 1000000 };
	int left;

	if (fstat(STDERR_FILENO, &st) || !S_ISFIFO(st.st_mode))
		return;
	for (int i = 0; i < 2000; i++) {
		if (ioctl(STDERR_FILENO, FIONREAD, &left) || left <= 0)
			return;
		nanosleep(&ms, NULL);
	}
}

/* Whether rank r is a peer of this host that no longer exists. */
static int dead(int r)
{
	return r != me && peers[r].host == my_host && gone(peers[r].pid);
}

/* Name the peers of this host that no longer exist; returns how many. */
static int report_dead(void)
{
	char b[256];
	int n = 0;

	for (int r = 0; r < npeers; r++) {
		size_t at = 0;

		if (!dead(r))
			continue;
		at = hp_sig_put_str(b, at, 255, hp_log_tool());
		at = hp_sig_put_str(b, at, 255, ": rank ");
		at = hp_sig_put_num(b, at, 255, r);
		at = hp_sig_put_str(b, at, 255, " (pid ");
		at = hp_sig_put_num(b, at, 255, peers[r].pid);
		at = hp_sig_put_str(b, at, 255, ") is gone; rank ");
		at = hp_sig_put_num(b, at, 255, me);
		at = hp_sig_put_str(b, at, 255, " stops with the job\n");
		n++;
		if (write(STDERR_FILENO, b, at) < 0)
			break;
	}
	if (n)
		drain_stderr();
	return n;
}

/* The last words of lib/base/fileio.c's signal handler, which then removes the
 * temporaries and ends the process as the signal would. */
static void name_the_dead(int sig)
{
	report_dead();
}

/* From the wait loop: a peer that is gone will never answer, so end the job
 * now, saying who, rather than wait for the launcher to notice. */
static void check_peers(void)
{
	int any = 0;

	for (int r = 0; r < npeers && !any; r++)
		any = dead(r);
	if (!any)
		return;
	/* the temporaries first: saying who is gone waits for the launcher to
	 * read it, and a launcher that has seen a rank die may kill this one
	 * at any moment (MPICH's hydra does, under load) */
	hp_tmp_remove_all();
	report_dead();
	end_job();
}

int hp_comms_watch_peers(struct hp_comms *cs, struct hp_err *e)
{
	char host[256] = "";
	unsigned long h = 5381;
	long mine[2];
	MPI_Request req;

	if (cs->world_size < 2)
		return 0;
	gethostname(host, sizeof(host) - 1);
	for (const char *c = host; *c; c++)
		h = h * 33 + (unsigned char)*c;
	if (!(peers = hp_calloc((size_t)cs->world_size, sizeof(*peers))))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	mine[0] = (long)getpid();
	mine[1] = (long)h;
	MPI_Iallgather(mine, 2, MPI_LONG, peers, 2, MPI_LONG, cs->dim[HP_COMM_WORLD].comm, &req);
	wait_what(&req, enter(comm_group(&cs->dim[HP_COMM_WORLD]), HP_COMM_WORLD, HP_COLL_ALL_GATHER));
	npeers = cs->world_size;
	me = cs->world_rank;
	my_host = h;
	hp_stop_on_signals(name_the_dead);
	return 0;
}
