/*
 * comm_nccl.c - the NCCL backend of comm.h (see comm_nccl.h): an NCCL
 * communicator per mesh dim's group, its id carried over the group's MPI
 * communicator, collectives on device buffers enqueued on the group's
 * stream, counted as comm.c counts them.
 *
 * Built for real only when the Makefile found nvcc (HP_HAVE_CUDA) and
 * NCCL's header and library (HP_HAVE_NCCL); otherwise every function is a
 * stub that says what the build lacks (HP_EUNSUP).
 *
 * Invariants: nc->comm is NULL exactly when the group has one rank (or nc
 * is zeroed); nc->stream is set whenever init succeeded.  The counters move
 * before the call is enqueued and exactly when comm.c's would for the same
 * arguments (an empty all-reduce counts nothing, an empty all-gather counts
 * a call), so device and host runs of one plan count the same.  Every call
 * that reaches NCCL is entered in comm.c's books (issued()), on every rank
 * of the group alike, for the timeout's questions.
 */
#include "base/alloc.h"
#include "comm/comm_nccl.h"

#if HP_HAVE_CUDA && HP_HAVE_NCCL

#include <cuda_runtime_api.h>
/* nccl.h declares a few functions as f() rather than f(void) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

static int cuda_fail(struct hp_err *e, const char *what, const struct hp_comm *c, const char *call,
		     cudaError_t rc)
{
	return hp_err_set(e, HP_ECUDA, "nccl %s on dim '%s': %s: %s", what, hp_comm_dim_name(c->dim), call,
			  cudaGetErrorString(rc));
}

/* comm may be NULL (init); NCCL's last error, when it has one, says more
 * than the code's string. */
static int nccl_fail(struct hp_err *e, const char *what, const struct hp_comm *c, ncclComm_t comm,
		     const char *call, ncclResult_t rc)
{
	const char *last = ncclGetLastError(comm);
	int more = last && *last;

	return hp_err_set(e, HP_ECUDA, "nccl %s on dim '%s': %s: %s%s%s%s", what, hp_comm_dim_name(c->dim),
			  call, ncclGetErrorString(rc), more ? " (" : "", more ? last : "", more ? ")" : "");
}

static int bad_args(struct hp_err *e, const char *what, enum hp_dtype t, size_t n)
{
	return hp_err_set(e, HP_EINVAL, "nccl %s of %zu %s: not a type NCCL takes here", what, n,
			  hp_dtype_name(t));
}

/* 0 and *nt, or -1 for a type the backend does not carry. */
static int nccl_type(enum hp_dtype t, ncclDataType_t *nt)
{
	switch (t) {
	case HP_DTYPE_F32: *nt = ncclFloat32; return 0;
	case HP_DTYPE_F64: *nt = ncclFloat64; return 0;
	case HP_DTYPE_BF16: *nt = ncclBfloat16; return 0;
	case HP_DTYPE_F16: *nt = ncclFloat16; return 0;
	case HP_DTYPE_I32: *nt = ncclInt32; return 0;
	case HP_DTYPE_I64: *nt = ncclInt64; return 0;
	case HP_DTYPE_U8: *nt = ncclUint8; return 0;
	default: return -1;
	}
}

static ncclRedOp_t nccl_op(enum hp_red op)
{
	return op == HP_RED_MAX ? ncclMax : op == HP_RED_MIN ? ncclMin : ncclSum;
}

/* As comm.c's count(). */
static void count(struct hp_comm *c, enum hp_coll op, uint64_t bytes, int routed)
{
	if (!c->quiet)
		hp_comm_count(c, op, bytes, routed);
}

/* --- the timeout (comm_nccl.h) --- */

/* The communicators to abort when the job ends on a timeout or a dead
 * peer: ncclCommAbort stops their kernels, which a stopped peer would
 * otherwise keep spinning on the GPU past this process's MPI_Abort. */
#define NLIVE 16
static ncclComm_t live[NLIVE];
static uint64_t order;          /* calls queued so far, over every group */

static void abort_live(void)
{
	for (int i = 0; i < NLIVE; i++)
		if (live[i]) {
			ncclCommAbort(live[i]);
			live[i] = NULL;
		}
}

static void track(ncclComm_t comm, int on)
{
	for (int i = 0; i < NLIVE; i++)
		if (on ? !live[i] : live[i] == comm) {
			live[i] = on ? comm : NULL;
			break;
		}
	if (on)
		hp_comm_on_timeout(abort_live);
}

/* A call of kind op queued on nc's group. */
static void issued(struct hp_nccl *nc, int op)
{
	nc->last_op = op;
	nc->last_seq = hp_comm_enter(nc->c, op);
	nc->last_order = ++order;
}

struct qwait {
	cudaStream_t stream;
	struct hp_nccl *nc;
	int n;
	struct hp_err *e;
};

/* 1 when the stream is idle, 0 while it works, an error (negative) when it
 * or a group's communicator failed */
static int q_done(void *arg)
{
	struct qwait *q = arg;
	cudaError_t cr = cudaStreamQuery(q->stream);
	ncclResult_t r, ar;

	if (cr == cudaSuccess)
		return 1;
	for (int i = 0; i < q->n; i++) {
		struct hp_nccl *nc = &q->nc[i];

		if (!nc->comm)
			continue;
		ar = ncclSuccess;
		if ((r = ncclCommGetAsyncError(nc->comm, &ar)) != ncclSuccess)
			return nccl_fail(q->e, "sync", nc->c, nc->comm, "ncclCommGetAsyncError", r);
		if (ar != ncclSuccess && ar != ncclInProgress)
			return nccl_fail(q->e, "sync", nc->c, nc->comm, "a queued call", ar);
	}
	if (cr != cudaErrorNotReady)
		return q->n ? cuda_fail(q->e, "sync", q->nc[0].c, "cudaStreamQuery", cr) :
			      hp_err_set(q->e, HP_ECUDA, "nccl sync: cudaStreamQuery: %s", cudaGetErrorString(cr));
	return 0;
}

/* At the timeout: the oldest of the groups' last calls whose stream is not
 * idle (the one that holds the others), else the latest call of all. */
static void q_what(void *arg, struct hp_comm_what *w)
{
	struct qwait *q = arg;
	struct hp_nccl *held = NULL, *latest = NULL;

	for (int i = 0; i < q->n; i++) {
		struct hp_nccl *nc = &q->nc[i];

		if (!nc->comm || !nc->last_order)
			continue;
		if (!latest || nc->last_order > latest->last_order)
			latest = nc;
		if (cudaStreamQuery(nc->stream) == cudaErrorNotReady &&
		    (!held || nc->last_order < held->last_order))
			held = nc;
	}
	if (!held)
		held = latest;
	if (held) {
		w->c = held->c;
		w->op = held->last_op;
		w->seq = held->last_seq;
	}
}

int hp_nccl_wait_stream(void *stream, struct hp_nccl *ncs, int n, struct hp_err *e)
{
	struct qwait q = { (cudaStream_t)stream, ncs, n, e };

	return hp_comm_wait_until(q_done, q_what, &q);
}

/* A device-to-device copy on the group's stream (a group of one, and the
 * block a rank sends itself); nothing for no bytes or the same buffer. */
static int copy(struct hp_nccl *nc, const char *what, void *dst, const void *src, size_t bytes,
		struct hp_err *e)
{
	cudaError_t rc;

	if (!bytes || dst == src)
		return 0;
	rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nc->stream);
	return rc == cudaSuccess ? 0 : cuda_fail(e, what, nc->c, "cudaMemcpyAsync", rc);
}

int hp_nccl_init(struct hp_nccl *nc, struct hp_comm *c, struct hp_err *e)
{
	/* the id with rank 0's verdict on making it, so that a failure there
	 * fails every rank instead of leaving them in ncclCommInitRank */
	struct { ncclUniqueId id; int rc; } msg;
	cudaStream_t s = NULL;
	ncclComm_t comm = NULL;
	cudaError_t cr;
	ncclResult_t r;
	int rc;

	memset(nc, 0, sizeof(*nc));
	if ((cr = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess)
		return cuda_fail(e, "init", c, "cudaStreamCreateWithFlags", cr);
	if (c->size > 1) {
		memset(&msg, 0, sizeof(msg));
		if (c->rank == 0)
			msg.rc = (int)ncclGetUniqueId(&msg.id);
		if ((rc = hp_comm_bcast(c, &msg, sizeof(msg), HP_DTYPE_U8, 0, e))) {
			cudaStreamDestroy(s);
			return rc;
		}
		if (msg.rc != ncclSuccess) {
			cudaStreamDestroy(s);
			return nccl_fail(e, "init", c, NULL, "ncclGetUniqueId on group rank 0", (ncclResult_t)msg.rc);
		}
		if ((r = ncclCommInitRank(&comm, c->size, msg.id, c->rank)) != ncclSuccess) {
			cudaStreamDestroy(s);
			return nccl_fail(e, "init", c, NULL, "ncclCommInitRank", r);
		}
		track(comm, 1);
	}
	nc->c = c;
	nc->comm = comm;
	nc->stream = s;
	return 0;
}

void hp_nccl_free(struct hp_nccl *nc)
{
	if (!nc)
		return;
	if (nc->comm) {
		ncclResult_t ar = ncclSuccess;

		track(nc->comm, 0);
		/* a communicator in error cannot finalize (the peers may be gone) */
		if (ncclCommGetAsyncError(nc->comm, &ar) != ncclSuccess || ar != ncclSuccess ||
		    ncclCommFinalize(nc->comm) != ncclSuccess)
			ncclCommAbort(nc->comm);
		else
			ncclCommDestroy(nc->comm);
	}
	if (nc->stream)
		cudaStreamDestroy(nc->stream);
	memset(nc, 0, sizeof(*nc));
}

int hp_nccl_sync(struct hp_nccl *nc, struct hp_err *e)
{
	return hp_nccl_wait_stream(nc->stream, nc, 1, e);
}

int hp_nccl_allreduce(struct hp_nccl *nc, void *buf, size_t n, enum hp_dtype t, enum hp_red op,
		      struct hp_err *e)
{
	struct hp_comm *c = nc->c;
	ncclDataType_t nt;
	ncclResult_t r;

	if (nccl_type(t, &nt))
		return bad_args(e, "all-reduce", t, n);
	if (c->size <= 1 || !n)
		return 0;
	count(c, HP_COLL_ALL_REDUCE, n * hp_dtype_size(t), 0);
	issued(nc, HP_COLL_ALL_REDUCE);
	r = ncclAllReduce(buf, buf, n, nt, nccl_op(op), nc->comm, nc->stream);
	return r == ncclSuccess ? 0 : nccl_fail(e, "all-reduce", c, nc->comm, "ncclAllReduce", r);
}

int hp_nccl_allgather(struct hp_nccl *nc, const void *send, void *recv, size_t n, enum hp_dtype t,
		      struct hp_err *e)
{
	struct hp_comm *c = nc->c;
	ncclDataType_t nt;
	ncclResult_t r;

	if (nccl_type(t, &nt))
		return bad_args(e, "all-gather", t, n);
	if (c->size <= 1)
		return copy(nc, "all-gather", recv, send, n * hp_dtype_size(t), e);
	count(c, HP_COLL_ALL_GATHER, n * hp_dtype_size(t), 0);
	if (!n)
		return 0;
	issued(nc, HP_COLL_ALL_GATHER);
	r = ncclAllGather(send, recv, n, nt, nc->comm, nc->stream);
	return r == ncclSuccess ? 0 : nccl_fail(e, "all-gather", c, nc->comm, "ncclAllGather", r);
}

int hp_nccl_reduce_scatter(struct hp_nccl *nc, const void *send, void *recv, size_t n, enum hp_dtype t,
			   enum hp_red op, struct hp_err *e)
{
	struct hp_comm *c = nc->c;
	ncclDataType_t nt;
	ncclResult_t r;

	if (nccl_type(t, &nt))
		return bad_args(e, "reduce-scatter", t, n);
	if (c->size <= 1)
		return copy(nc, "reduce-scatter", recv, send, n * hp_dtype_size(t), e);
	if (t == HP_DTYPE_BF16 && op != HP_RED_SUM)
		return bad_args(e, "reduce-scatter", t, n);
	count(c, HP_COLL_REDUCE_SCATTER, (uint64_t)c->size * n * hp_dtype_size(t), 0);
	if (t == HP_DTYPE_BF16) {
		/* the blocks only, counted as this reduce-scatter: the caller
		 * sums them (comm_nccl.h) */
		int rc;

		c->quiet++;
		rc = hp_nccl_alltoall(nc, send, recv, n, t, e);
		c->quiet--;
		return rc;
	}
	if (!n)
		return 0;
	issued(nc, HP_COLL_REDUCE_SCATTER);
	r = ncclReduceScatter(send, recv, n, nt, nccl_op(op), nc->comm, nc->stream);
	return r == ncclSuccess ? 0 : nccl_fail(e, "reduce-scatter", c, nc->comm, "ncclReduceScatter", r);
}

/*
 * One ncclSend and one ncclRecv per peer in one NCCL group (the peers'
 * pairs match whatever order they are posted in); the rank's own block is
 * a copy.  Counts and displacements in elements; a zero count posts
 * nothing, on both sides alike, since the peers' counts agree.
 */
static int exchange(struct hp_nccl *nc, const char *what, const void *send, const size_t *scounts,
		    const size_t *sdispls, void *recv, const size_t *rcounts, const size_t *rdispls,
		    enum hp_dtype t, ncclDataType_t nt, struct hp_err *e)
{
	struct hp_comm *c = nc->c;
	size_t sz = hp_dtype_size(t);
	const char *call = "ncclSend";
	ncclResult_t r, r2;
	int me = c->rank, rc;

	if ((rc = copy(nc, what, (char *)recv + rdispls[me] * sz, (const char *)send + sdispls[me] * sz,
		       scounts[me] * sz, e)))
		return rc;
	if ((r = ncclGroupStart()) != ncclSuccess)
		return nccl_fail(e, what, c, nc->comm, "ncclGroupStart", r);
	for (int p = 0; p < c->size && r == ncclSuccess; p++) {
		if (p == me)
			continue;
		call = "ncclSend";
		if (scounts[p])
			r = ncclSend((const char *)send + sdispls[p] * sz, scounts[p], nt, p, nc->comm, nc->stream);
		if (r != ncclSuccess || !rcounts[p])
			continue;
		call = "ncclRecv";
		r = ncclRecv((char *)recv + rdispls[p] * sz, rcounts[p], nt, p, nc->comm, nc->stream);
	}
	/* the group is closed whatever happened inside it */
	r2 = ncclGroupEnd();
	if (r != ncclSuccess)
		return nccl_fail(e, what, c, nc->comm, call, r);
	return r2 == ncclSuccess ? 0 : nccl_fail(e, what, c, nc->comm, "ncclGroupEnd", r2);
}

int hp_nccl_alltoall(struct hp_nccl *nc, const void *send, void *recv, size_t n, enum hp_dtype t,
		     struct hp_err *e)
{
	struct hp_comm *c = nc->c;
	ncclDataType_t nt;
	size_t *v;
	int rc;

	if (nccl_type(t, &nt))
		return bad_args(e, "all-to-all", t, n);
	if (c->size <= 1)
		return copy(nc, "all-to-all", recv, send, n * hp_dtype_size(t), e);
	count(c, HP_COLL_ALL_TO_ALL, (uint64_t)c->size * n * hp_dtype_size(t), 0);
	if (!n)
		return 0;
	issued(nc, HP_COLL_ALL_TO_ALL);
	/* counts, then displacements: block p at p n */
	if (!(v = hp_calloc(2 * (size_t)c->size, sizeof(*v))))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	for (int p = 0; p < c->size; p++) {
		v[p] = n;
		v[c->size + p] = (size_t)p * n;
	}
	rc = exchange(nc, "all-to-all", send, v, v + c->size, recv, v, v + c->size, t, nt, e);
	hp_free(v);
	return rc;
}

int hp_nccl_alltoallv(struct hp_nccl *nc, const void *send, const int *scounts, const int *sdispls,
		      void *recv, const int *rcounts, const int *rdispls, enum hp_dtype t, int routed,
		      struct hp_err *e)
{
	struct hp_comm *c = nc->c;
	size_t sz = hp_dtype_size(t), *v;
	ncclDataType_t nt;
	uint64_t n = 0;
	int rc, k = c->size;

	if (nccl_type(t, &nt))
		return bad_args(e, "all-to-allv", t, 0);
	for (int r = 0; r < k; r++)
		n += (uint64_t)scounts[r];
	if (k <= 1)
		return copy(nc, "all-to-allv", (char *)recv + (size_t)rdispls[0] * sz,
			    (const char *)send + (size_t)sdispls[0] * sz, (size_t)scounts[0] * sz, e);
	count(c, HP_COLL_ALL_TO_ALLV, n * sz, routed);
	issued(nc, HP_COLL_ALL_TO_ALLV);
	if (!(v = hp_calloc(4 * (size_t)k, sizeof(*v))))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	for (int p = 0; p < k; p++) {
		v[p] = (size_t)scounts[p];
		v[k + p] = (size_t)sdispls[p];
		v[2 * k + p] = (size_t)rcounts[p];
		v[3 * k + p] = (size_t)rdispls[p];
	}
	rc = exchange(nc, "all-to-allv", send, v, v + k, recv, v + 2 * k, v + 3 * k, t, nt, e);
	hp_free(v);
	return rc;
}

int hp_nccl_sendrecv(struct hp_nccl *nc, const struct hp_p2p *ops, int n, struct hp_err *e)
{
	struct hp_comm *c = nc->c;
	const char *call = "ncclGroupStart";
	ncclDataType_t nt;
	ncclResult_t r, r2;

	for (int i = 0; i < n; i++)
		if (nccl_type(ops[i].t, &nt))
			return bad_args(e, "point-to-point send/receive", ops[i].t, ops[i].n);
	/* who waits for whom differs from rank to rank: not in the group's books */
	nc->last_op = HP_COLL_P2P;
	nc->last_seq = 0;
	nc->last_order = ++order;
	if ((r = ncclGroupStart()) != ncclSuccess)
		return nccl_fail(e, "point-to-point send/receive", c, nc->comm, call, r);
	for (int i = 0; i < n && r == ncclSuccess; i++) {
		const struct hp_p2p *o = &ops[i];

		nccl_type(o->t, &nt);
		if (o->send) {
			count(c, HP_COLL_P2P, o->n * hp_dtype_size(o->t), 0);
			call = "ncclSend";
			r = ncclSend(o->send, o->n, nt, o->peer, nc->comm, nc->stream);
		} else {
			call = "ncclRecv";
			r = ncclRecv(o->recv, o->n, nt, o->peer, nc->comm, nc->stream);
		}
	}
	r2 = ncclGroupEnd();
	if (r != ncclSuccess)
		return nccl_fail(e, "point-to-point send/receive", c, nc->comm, call, r);
	return r2 == ncclSuccess ? 0 : nccl_fail(e, "point-to-point send/receive", c, nc->comm, "ncclGroupEnd", r2);
}

int hp_nccl_bcast(struct hp_nccl *nc, void *buf, size_t n, enum hp_dtype t, int root, struct hp_err *e)
{
	struct hp_comm *c = nc->c;
	ncclDataType_t nt;
	ncclResult_t r;

	if (nccl_type(t, &nt))
		return bad_args(e, "broadcast", t, n);
	if (c->size <= 1 || !n)
		return 0;
	issued(nc, HP_COMM_OP_BROADCAST);
	r = ncclBroadcast(buf, buf, n, nt, root, nc->comm, nc->stream);
	return r == ncclSuccess ? 0 : nccl_fail(e, "broadcast", c, nc->comm, "ncclBroadcast", r);
}

int hp_nccl_event_new(void **ev, struct hp_err *e)
{
	cudaEvent_t x;
	cudaError_t rc = cudaEventCreateWithFlags(&x, cudaEventDisableTiming);

	*ev = NULL;
	if (rc != cudaSuccess)
		return hp_err_set(e, HP_ECUDA, "nccl: cudaEventCreateWithFlags: %s", cudaGetErrorString(rc));
	*ev = x;
	return 0;
}

void hp_nccl_event_free(void *ev)
{
	if (ev)
		cudaEventDestroy((cudaEvent_t)ev);
}

int hp_nccl_mark(void *stream, void *ev, struct hp_err *e)
{
	cudaError_t rc = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream);

	return rc == cudaSuccess ? 0 : hp_err_set(e, HP_ECUDA, "nccl: recording an event: %s",
						   cudaGetErrorString(rc));
}

int hp_nccl_after(void *stream, void *ev, struct hp_err *e)
{
	cudaError_t rc = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0);

	return rc == cudaSuccess ? 0 : hp_err_set(e, HP_ECUDA, "nccl: ordering streams: %s",
						   cudaGetErrorString(rc));
}

int hp_nccl_order(void *from, void *to, void *ev, struct hp_err *e)
{
	int rc = hp_nccl_mark(from, ev, e);

	return rc ? rc : hp_nccl_after(to, ev, e);
}

#else /* no CUDA or no NCCL in this build: stubs that say so */

static int unsup(struct hp_err *e, const char *what)
{
#if HP_HAVE_CUDA
	return hp_err_set(e, HP_EUNSUP, "nccl %s: hp was built without NCCL (nccl.h and libnccl not found)", what);
#else
	return hp_err_set(e, HP_EUNSUP, "nccl %s: hp was built without CUDA (no nvcc)", what);
#endif
}

int hp_nccl_init(struct hp_nccl *nc, struct hp_comm *c, struct hp_err *e)
{
	memset(nc, 0, sizeof(*nc));
	return unsup(e, "init");
}

void hp_nccl_free(struct hp_nccl *nc)
{
	if (nc)
		memset(nc, 0, sizeof(*nc));
}

int hp_nccl_sync(struct hp_nccl *nc, struct hp_err *e)
{
	return unsup(e, "sync");
}

int hp_nccl_wait_stream(void *stream, struct hp_nccl *ncs, int n, struct hp_err *e)
{
	return unsup(e, "sync");
}

int hp_nccl_allreduce(struct hp_nccl *nc, void *buf, size_t n, enum hp_dtype t, enum hp_red op,
		      struct hp_err *e)
{
	return unsup(e, "all-reduce");
}

int hp_nccl_allgather(struct hp_nccl *nc, const void *send, void *recv, size_t n, enum hp_dtype t,
		      struct hp_err *e)
{
	return unsup(e, "all-gather");
}

int hp_nccl_reduce_scatter(struct hp_nccl *nc, const void *send, void *recv, size_t n, enum hp_dtype t,
			   enum hp_red op, struct hp_err *e)
{
	return unsup(e, "reduce-scatter");
}

int hp_nccl_alltoall(struct hp_nccl *nc, const void *send, void *recv, size_t n, enum hp_dtype t,
		     struct hp_err *e)
{
	return unsup(e, "all-to-all");
}

int hp_nccl_alltoallv(struct hp_nccl *nc, const void *send, const int *scounts, const int *sdispls,
		      void *recv, const int *rcounts, const int *rdispls, enum hp_dtype t, int routed,
		      struct hp_err *e)
{
	return unsup(e, "all-to-allv");
}

int hp_nccl_bcast(struct hp_nccl *nc, void *buf, size_t n, enum hp_dtype t, int root, struct hp_err *e)
{
	return unsup(e, "broadcast");
}

int hp_nccl_sendrecv(struct hp_nccl *nc, const struct hp_p2p *ops, int n, struct hp_err *e)
{
	return unsup(e, "point-to-point send/receive");
}

int hp_nccl_event_new(void **ev, struct hp_err *e)
{
	*ev = NULL;
	return unsup(e, "event");
}

void hp_nccl_event_free(void *ev)
{
	(void)ev;
}

int hp_nccl_mark(void *stream, void *ev, struct hp_err *e)
{
	return unsup(e, "mark");
}

int hp_nccl_after(void *stream, void *ev, struct hp_err *e)
{
	return unsup(e, "after");
}

int hp_nccl_order(void *from, void *to, void *ev, struct hp_err *e)
{
	return unsup(e, "order");
}

#endif
