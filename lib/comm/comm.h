/*
 * comm.h - the collectives of a layout's mesh dims, with byte counters
 * (DESIGN.md §7).
 *
 * One struct hp_comm per mesh dim of the layout (comm/mesh.h; and one for
 * the world), split once from MPI_COMM_WORLD by the ranks' coordinates, so
 * that the group of a rank along dim X is exactly hp_mesh_group(size, X,
 * rank).  Every
 * call counts, per dim and collective, the calls and the bytes of the send
 * buffer this rank passes — the quantities hp-plan's estimates predict
 * (hp-plan(5), ESTIMATES) — so that a run can be checked against its plan.
 *
 * The MPI backend issues non-blocking calls and waits with MPI_Test and
 * sched_yield: Debian's MPICH busy-polls inside blocking calls, and with
 * more ranks than cores a rank waiting in a collective would take the core
 * of the rank it waits for (DESIGN.md, "MPICH trap").  A dim of size 1
 * moves nothing and counts nothing.  Buffers are host memory; device
 * memory goes through comm/comm_nccl.h (NCCL) or is staged by the CUDA
 * backend.
 *
 * Every wait has a timeout (hp_comm_set_timeout; training.collective_timeout_s
 * in hp-train): a rank that waits longer in one collective ends the job
 * with MPI_Abort after one line on stderr that names the collective, its
 * mesh dim and the ranks that have not arrived, found out for real: every
 * rank counts the collectives it enters per group, and a waiting rank
 * answers a timed-out one's question (over a communicator of their own)
 * with its counts and what it waits in.  See "the timed wait" in comm.c.
 *
 * Errors: MPI errors are fatal in MPICH's default handler (the job
 * aborts); the functions return 0 or HP_ENOMEM/HP_EINVAL for caller bugs.
 */
#ifndef HP_COMM_H
#define HP_COMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"
#include "comm/mesh.h"

enum hp_red { HP_RED_SUM = 0, HP_RED_MAX, HP_RED_MIN };

struct hp_comm {
	MPI_Comm comm;              /* MPI_COMM_NULL for a dim of size 1 */
	int dim;                    /* enum hp_dim, or HP_COMM_WORLD */
	int rank, size;             /* within the group */
	int64_t calls[HP_NCOLL];
	int64_t bytes[HP_NCOLL];    /* send-buffer bytes, as hp-plan(5) counts them */
	int64_t routed[HP_NCOLL];   /* the part the caller marked routing-dependent */
	int quiet;                  /* > 0: calls count nothing (a caller that counts them itself) */
	int slot;                   /* comm.c's: its group in the timeout's books + 1; 0: look it up */
};

struct hp_comms {
	struct hp_comm dim[HP_NDIM + 1];   /* indexed by enum hp_dim; [HP_COMM_WORLD] */
	int world_rank, world_size;
	int asks;                   /* holds a reference on comm.c's communicator for questions */
};

/* What a wait can be in, for the timeout's message: an enum hp_coll, or
 * one of these. */
enum {
	HP_COMM_OP_BROADCAST = HP_NCOLL, HP_COMM_OP_BARRIER, HP_COMM_OP_GATHER,
	HP_COMM_OP_DEVICE,          /* a device's queue, behind which collectives wait */
	HP_COMM_OP_UNKNOWN
};

/* Split world by the layout size (a plan's).  world's size must be the
 * layout's (HP_EINVAL). */
int hp_comms_init(struct hp_comms *cs, MPI_Comm world, const int size[HP_NDIM], struct hp_err *e);
void hp_comms_free(struct hp_comms *cs);
/* Zero every counter. */
void hp_comms_reset(struct hp_comms *cs);

/* training.collective_timeout_s: how long a rank waits in one collective
 * before it ends the job, naming the collective, its mesh dim and the
 * ranks that have not arrived; 0 waits forever.  0 until set, so that a
 * tool that does not set it (hp-data's ranks waiting for the slowest
 * tokenizer) keeps waiting as it always has. */
void hp_comm_set_timeout(double seconds);

/* Wait for a request without spinning inside MPI (see above), under the
 * timeout.  A request that this file started (hp_comm_iallgather) is named
 * in the timeout's message; any other is "a collective" — wait for those
 * with hp_comm_wait_op. */
void hp_comm_wait(MPI_Request *req);
/* The same for a collective of kind op (enum hp_coll or HP_COMM_OP_*) that
 * the caller has just started on c (MPI_Ibcast, MPI_Igather...): it counts
 * as entered on c's group, and a timeout names it. */
void hp_comm_wait_op(MPI_Request *req, MPI_Comm c, int op);
/* An all-reduce in place on any communicator, waited for as above and
 * counted nowhere: for checks and agreements that are not a step's
 * traffic (validation, checkpoints). */
void hp_comm_allreduce_raw(MPI_Comm c, void *buf, int n, MPI_Datatype t, MPI_Op op);
/* A broadcast from root, the same way. */
void hp_comm_bcast_raw(MPI_Comm c, void *buf, int n, MPI_Datatype t, int root);

/*
 * For a backend whose collectives complete elsewhere (NCCL on a GPU's
 * streams): hp_comm_enter counts a collective of kind op entered on c's
 * group, as comm.h's own calls do, and returns its number there (0 where
 * the group is not known); hp_comm_wait_until waits until done(arg) is
 * non-zero, as hp_comm_wait waits for a request (yielding, answering the
 * peers' questions, under the timeout), and returns 0, or done's value when
 * negative (the caller's error).  At the timeout, what(arg, &w) names the
 * collective that holds the wait (w.c NULL: none known); the functions
 * given to hp_comm_on_timeout (NCCL's aborts; at most 4) run before the
 * job ends, there and when a dead peer ends it.
 */
struct hp_comm_what {
	struct hp_comm *c;          /* its group and dim; NULL: not known */
	int op;                     /* enum hp_coll or HP_COMM_OP_* */
	int64_t seq;                /* hp_comm_enter's number for it */
};
int64_t hp_comm_enter(struct hp_comm *c, int op);
int hp_comm_wait_until(int (*done)(void *arg), void (*what)(void *arg, struct hp_comm_what *w), void *arg);
void hp_comm_on_timeout(void (*fn)(void));
/* Count a call of op moving bytes (routed: as hp_comm_alltoallv's flag)
 * into c, as its own collectives count: for callers that carry a
 * collective another way (a device's host-staged path, whose wire type
 * may differ from the type it counts). */
void hp_comm_count(struct hp_comm *c, enum hp_coll op, uint64_t bytes, int routed);
/* Seconds this process has spent waiting in collectives so far; in those
 * of one kind (enum hp_coll: HP_COLL_P2P, a pipeline stage's waits for
 * its neighbours). */
double hp_comm_waited(void);
double hp_comm_waited_in(int op);

/* In place: buf holds n elements of t, reduced with op over the group. */
int hp_comm_allreduce(struct hp_comm *c, void *buf, size_t n, enum hp_dtype t, enum hp_red op,
		      struct hp_err *e);
/* send: n elements; recv: size * n, in group rank order. */
int hp_comm_allgather(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
		      struct hp_err *e);
/* The same, started: the collective completes in hp_comm_wait(req)
 * (req is MPI_REQUEST_NULL when there was nothing to wait for).  Buffers
 * stay the caller's until then. */
int hp_comm_iallgather(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
		       MPI_Request *req, struct hp_err *e);
/* send: size * n elements (block r for group rank r); recv: n, the sum of
 * every rank's block for this rank. */
int hp_comm_reduce_scatter(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
			   enum hp_red op, struct hp_err *e);
/* send and recv: size * n elements, block r to / from group rank r. */
int hp_comm_alltoall(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
		     struct hp_err *e);
/* The two, started: done in hp_comm_wait(req), as hp_comm_iallgather. */
int hp_comm_ireduce_scatter(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
			    enum hp_red op, MPI_Request *req, struct hp_err *e);
int hp_comm_ialltoall(struct hp_comm *c, const void *send, void *recv, size_t n, enum hp_dtype t,
		      MPI_Request *req, struct hp_err *e);
/* Counts and displacements in elements, one per group rank; routed says
 * whether the bytes count as routing-dependent (hp-plan's routed_bytes). */
int hp_comm_alltoallv(struct hp_comm *c, const void *send, const int *scounts, const int *sdispls,
		      void *recv, const int *rcounts, const int *rdispls, enum hp_dtype t, int routed,
		      struct hp_err *e);
/* One transfer of a point-to-point exchange: n elements of t sent to
 * group rank peer (send), or received from it (recv). */
struct hp_p2p {
	const void *send;
	void *recv;
	size_t n;
	int peer;
	enum hp_dtype t;
};
/* Point-to-point along c (pipeline stages): every transfer of ops[0..n)
 * started at once, all done on return, so that two ranks that each send
 * to and receive from the other never wait on each other.  Transfers
 * between two ranks match in the order they are listed.  Counted as
 * HP_COLL_P2P: a call and its bytes per send.  At most HP_P2P_MAX
 * transfers (an interleaved pipeline's exchange: two outputs and two
 * inputs, each with its router statistics). */
#define HP_P2P_MAX 8
int hp_comm_sendrecv(struct hp_comm *c, const struct hp_p2p *ops, int n, struct hp_err *e);
int hp_comm_bcast(struct hp_comm *c, void *buf, size_t n, enum hp_dtype t, int root, struct hp_err *e);
int hp_comm_barrier(struct hp_comm *c);

/* Learn every rank's pid and host, and on SIGTERM or SIGABRT (the launcher
 * ending the job, or the transport aborting) name the ranks of this host
 * that no longer exist, before ending as the signal would: the last words
 * of hp_stop_on_signals (lib/base/fileio.h), which removes the temporaries. */
int hp_comms_watch_peers(struct hp_comms *cs, struct hp_err *e);

#endif
