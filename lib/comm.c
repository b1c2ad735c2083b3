/*
 * comm.c - the MPI backend of comm.h: communicators split from the plan's
 * coordinates, non-blocking collectives waited on with MPI_Test and
 * sched_yield, and the byte counters hp-plan's estimates are checked
 * against.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "comm.h"

/* Every rank's pid and host (hp_comms_watch_peers), for naming a dead one. */
static struct { long pid; unsigned long host; } *peers;
static int npeers, me;
static unsigned long my_host;

static void check_peers(void);

/* Seconds spent in hp_comm_wait since the start (hp_comm_waited). */
static double waited;

double hp_comm_waited(void)
{
	return waited;
}

void hp_comm_wait(MPI_Request *req)
{
	int done = 0;
	double t0 = MPI_Wtime(), last = t0;

	for (;;) {
		MPI_Test(req, &done, MPI_STATUS_IGNORE);
		if (done) {
			waited += MPI_Wtime() - t0;
			return;
		}
		sched_yield();
		/* a wait may be for a dead peer: look every half millisecond, before
		 * the launcher's clean-up ends this process without a word */
		if (npeers && MPI_Wtime() - last > 5e-4) {
			check_peers();
			last = MPI_Wtime();
		}
	}
}

void hp_comm_allreduce_raw(MPI_Comm c, void *buf, int n, MPI_Datatype t, MPI_Op op)
{
	MPI_Request req;

	MPI_Iallreduce(MPI_IN_PLACE, buf, n, t, op, c, &req);
	hp_comm_wait(&req);
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

int hp_comms_init(struct hp_comms *cs, MPI_Comm world, const struct hp_plan *p, struct hp_err *e)
{
	int rank, size;

	memset(cs, 0, sizeof(*cs));
	MPI_Comm_rank(world, &rank);
	MPI_Comm_size(world, &size);
	if (size != p->world)
		return hp_err_set(e, HP_EINVAL, "%d processes for a plan of %d ranks", size, p->world);
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
		c->size = hp_plan_group(p, (enum hp_dim)d, rank, g);
		c->rank = hp_plan_coord(p, (enum hp_dim)d, rank);
		if (c->size > 1)
			MPI_Comm_split(world, g[0], c->rank, &c->comm);
		hp_free(g);
	}
	return 0;
}

void hp_comms_free(struct hp_comms *cs)
{
	for (int d = 0; d <= HP_NDIM; d++)
		if (cs->dim[d].comm != MPI_COMM_NULL && cs->dim[d].comm != 0)
			MPI_Comm_free(&cs->dim[d].comm);
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
	hp_comm_wait(&req);
	return 0;
}

int hp_comm_iallgather(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
		       MPI_Request *req, struct hp_err *e)
{
	MPI_Datatype mt = mpi_type(t, 0);

	*req = MPI_REQUEST_NULL;
	if (mt == MPI_DATATYPE_NULL || n > INT_MAX)
		return bad_args(e, "all-gather", t, n);
	if (c->size <= 1) {
		if (send != recv)
			memmove(recv, send, n * hp_dtype_size(t));
		return 0;
	}
	count(c, HP_COLL_ALL_GATHER, n * hp_dtype_size(t), 0);
	MPI_Iallgather(send, (int)n, mt, recv, (int)n, mt, c->comm, req);
	return 0;
}

int hp_comm_allgather(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
		      struct hp_err *e)
{
	MPI_Request req;
	int rc = hp_comm_iallgather(c, send, recv, n, t, &req, e);

	if (!rc && req != MPI_REQUEST_NULL)
		hp_comm_wait(&req);
	return rc;
}

int hp_comm_reduce_scatter(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
			   enum hp_red op, struct hp_err *e)
{
	MPI_Datatype mt = mpi_type(t, 1);
	MPI_Request req;

	if (mt == MPI_DATATYPE_NULL || n > INT_MAX)
		return bad_args(e, "reduce-scatter", t, n);
	if (c->size <= 1) {
		if (send != recv)
			memmove(recv, send, n * hp_dtype_size(t));
		return 0;
	}
	count(c, HP_COLL_REDUCE_SCATTER, (uint64_t)c->size * n * hp_dtype_size(t), 0);
	MPI_Ireduce_scatter_block(send, recv, (int)n, mt, mpi_op(op), c->comm, &req);
	hp_comm_wait(&req);
	return 0;
}

int hp_comm_alltoall(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
		     struct hp_err *e)
{
	MPI_Datatype mt = mpi_type(t, 0);
	MPI_Request req;

	if (mt == MPI_DATATYPE_NULL || n > INT_MAX)
		return bad_args(e, "all-to-all", t, n);
	if (c->size <= 1) {
		if (send != recv)
			memmove(recv, send, n * hp_dtype_size(t));
		return 0;
	}
	count(c, HP_COLL_ALL_TO_ALL, (uint64_t)c->size * n * hp_dtype_size(t), 0);
	MPI_Ialltoall(send, (int)n, mt, recv, (int)n, mt, c->comm, &req);
	hp_comm_wait(&req);
	return 0;
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
	hp_comm_wait(&req);
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
	hp_comm_wait(&req);
	return 0;
}

int hp_comm_barrier(struct hp_comm *c)
{
	MPI_Request req;

	if (c->size <= 1)
		return 0;
	MPI_Ibarrier(c->comm, &req);
	hp_comm_wait(&req);
	return 0;
}

/* --- naming a dead peer ------------------------------------------------------ */

/*
 * When a rank dies, MPI's launcher tears the job down (SIGTERM to the
 * others) or the transport aborts a survivor (SIGABRT); neither says which
 * rank died.  Every rank learns every rank's pid and host at start-up, and
 * a survivor's handler, before the process ends, looks for the peers on its
 * host that no longer exist and names them.  Only async-signal-safe calls
 * (kill, write, _exit) run in the handler.
 */

static size_t put_str(char *b, size_t at, const char *s)
{
	while (*s && at < 255)
		b[at++] = *s++;
	return at;
}

static size_t put_num(char *b, size_t at, long v)
{
	char d[24];
	int n = 0;

	do
		d[n++] = (char)('0' + v % 10);
	while ((v /= 10) && n < 23);
	while (n && at < 255)
		b[at++] = d[--n];
	return at;
}

/* Whether pid has ended: no such process, or a zombie its parent (the
 * launcher's proxy) has not reaped yet.  Async-signal-safe. */
static int gone(long pid)
{
	char path[40], st[256];
	size_t at = put_str(path, 0, "/proc/");
	ssize_t n;
	int fd;

	if (kill((pid_t)pid, 0) != 0)
		return errno == ESRCH;
	at = put_num(path, at, pid);
	at = put_str(path, at, "/stat");
	path[at] = '\0';
	if ((fd = open(path, O_RDONLY)) < 0)
		return errno == ENOENT;
	n = read(fd, st, sizeof(st) - 1);
	close(fd);
	/* "pid (comm) S ppid pgrp session tty tpgid flags ...": after the last
	 * ')' the state, and six fields on the flags, where PF_EXITING (0x4)
	 * marks a process already dying of its signal */
	for (ssize_t i = n - 1; i > 0; i--) {
		unsigned long flags = 0;
		int field = 0;

		if (st[i] != ')')
			continue;
		if (i + 2 >= n)
			return 0;
		if (st[i + 2] == 'Z' || st[i + 2] == 'X')
			return 1;
		for (ssize_t j = i + 2; j < n && field < 7; j++) {
			if (st[j] == ' ') {
				field++;
				continue;
			}
			if (field == 6 && st[j] >= '0' && st[j] <= '9')
				flags = flags * 10 + (unsigned long)(st[j] - '0');
		}
		return (flags & 0x4) != 0;
	}
	return 0;
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

/* Name the peers of this host that no longer exist; returns how many. */
static int report_dead(void)
{
	char b[256];
	int n = 0;

	for (int r = 0; r < npeers; r++) {
		size_t at = 0;

		if (r == me || peers[r].host != my_host || !gone(peers[r].pid))
			continue;
		at = put_str(b, at, "hp-train: rank ");
		at = put_num(b, at, r);
		at = put_str(b, at, " (pid ");
		at = put_num(b, at, peers[r].pid);
		at = put_str(b, at, ") is gone; rank ");
		at = put_num(b, at, me);
		at = put_str(b, at, " stops with the job\n");
		n++;
		if (write(STDERR_FILENO, b, at) < 0)
			break;
	}
	if (n)
		drain_stderr();
	return n;
}

static void name_the_dead(int sig)
{
	report_dead();
	signal(sig, SIG_DFL);
	raise(sig);
}

/* From the wait loop: a peer that is gone will never answer, so end the job
 * now, saying who, rather than wait for the launcher to notice. */
static void check_peers(void)
{
	if (npeers && report_dead())
		MPI_Abort(MPI_COMM_WORLD, 1);
}

int hp_comms_watch_peers(struct hp_comms *cs, struct hp_err *e)
{
	char host[256] = "";
	unsigned long h = 5381;
	long mine[2];
	struct sigaction sa;

	if (cs->world_size < 2)
		return 0;
	gethostname(host, sizeof(host) - 1);
	for (const char *c = host; *c; c++)
		h = h * 33 + (unsigned char)*c;
	if (!(peers = hp_calloc((size_t)cs->world_size, sizeof(*peers))))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	mine[0] = (long)getpid();
	mine[1] = (long)h;
	MPI_Allgather(mine, 2, MPI_LONG, peers, 2, MPI_LONG, cs->dim[HP_COMM_WORLD].comm);
	npeers = cs->world_size;
	me = cs->world_rank;
	my_host = h;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = name_the_dead;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGABRT, &sa, NULL);
	return 0;
}
