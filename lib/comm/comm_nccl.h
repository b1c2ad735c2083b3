/*
 * comm_nccl.h - the NCCL backend of comm.h: the same collectives on device
 * memory, counted into the same per-dim counters (DESIGN.md §7).
 *
 * A struct hp_nccl is one mesh dim's group on the GPU: an NCCL communicator
 * over exactly the ranks of an existing struct hp_comm (same size, same
 * rank order) and a CUDA stream its calls enqueue on.  Init is collective
 * over the group: group rank 0 makes the NCCL id, the group's MPI
 * communicator carries it (non-blocking, waited on with hp_comm_wait, so
 * oversubscribed ranks yield), then ncclCommInitRank on the calling
 * thread's current CUDA device — cudaSetDevice first; NCCL wants a device
 * of its own for every rank of a group.
 *
 * Calls take device pointers and have comm.h's signatures and semantics,
 * and count what comm.h counts: the calls and send-buffer bytes per dim and
 * collective (hp-plan(5), ESTIMATES), into the hp_comm's counters, so a run
 * on GPUs is checked against its plan as a run on CPUs is; broadcast counts
 * nothing, as in comm.h.  Unlike MPI, NCCL reduces BF16 and F16 too.  A group
 * of size 1 has no NCCL communicator: its calls are copies on the stream or
 * nothing, and count nothing.
 *
 * Calls only enqueue: results are in place once hp_nccl_sync returns (or
 * for any later work on the same stream).  Buffers must stay allocated
 * until then.  Every rank of the group must make the same calls in the same
 * order, as with MPI.
 *
 * An operation that a peer never joins (a stopped rank) never completes,
 * and a stream synchronization behind it would wait forever: hp_nccl_sync
 * and hp_nccl_wait_stream poll instead (cudaStreamQuery, yielding) under
 * comm.h's timeout, checking ncclCommGetAsyncError as they go, and at the
 * timeout comm.c names the collective (the last one queued on the stream
 * that is not idle, per dim) and the ranks that have not arrived, every
 * live communicator is aborted (ncclCommAbort: its kernels stop), and the
 * job ends.  ncclCommInitRank itself is not timed: a peer that never comes
 * holds it as NCCL's blocking init does.
 *
 * Ownership: the hp_nccl borrows its hp_comm (which must outlive it) and
 * owns the NCCL communicator and the stream; hp_nccl_free releases them.
 *
 * Errors: HP_EINVAL for a type NCCL does not carry; HP_ECUDA for a failed
 * CUDA or NCCL call, the message naming the call, the dim and the
 * library's error string; HP_EUNSUP from every call in a build without
 * CUDA or without NCCL (the header is includable in every build).
 */
#ifndef HP_COMM_NCCL_H
#define HP_COMM_NCCL_H

#include <stddef.h>

#include "base/dtype.h"
#include "base/err.h"
#include "comm/comm.h"

struct ncclComm;       /* ncclComm_t is struct ncclComm * */
struct CUstream_st;    /* cudaStream_t is struct CUstream_st * */

struct hp_nccl {
	struct hp_comm *c;            /* the group and its counters (borrowed) */
	struct ncclComm *comm;        /* NULL for a group of size 1 */
	struct CUstream_st *stream;   /* every call of this group enqueues here */
	int last_op;                  /* the last call queued: enum hp_coll or HP_COMM_OP_*, */
	int64_t last_seq;             /* its number in the group (hp_comm_enter), */
	uint64_t last_order;          /* and its place among every group's calls (0: none) */
};

/* Collective over c's group; on failure nc holds nothing to free. */
int hp_nccl_init(struct hp_nccl *nc, struct hp_comm *c, struct hp_err *e);
/* Collective over the group, as init is (NCCL finalizes the communicator
 * with the peers; one in error is aborted instead).  NULL-safe; nothing for
 * a zeroed or freed hp_nccl. */
void hp_nccl_free(struct hp_nccl *nc);
/* Wait until everything enqueued on nc's stream is done, yielding the core;
 * an NCCL error raised meanwhile (a peer gone) ends the wait with HP_ECUDA;
 * past the timeout the job ends (see above). */
int hp_nccl_sync(struct hp_nccl *nc, struct hp_err *e);
/* The same for another stream (cudaStream_t as void *: the compute stream
 * that waits for the groups' streams through events), watching the n
 * groups of ncs (zeroed ones are skipped). */
int hp_nccl_wait_stream(void *stream, struct hp_nccl *ncs, int n, struct hp_err *e);

/* As in comm.h, with device buffers. */
int hp_nccl_allreduce(struct hp_nccl *nc, void *buf, size_t n, enum hp_dtype t, enum hp_red op,
		      struct hp_err *e);
int hp_nccl_allgather(struct hp_nccl *nc, const void *send, void *recv, size_t n, enum hp_dtype t,
		      struct hp_err *e);
/* bf16 (a sum only) is not NCCL's bf16 arithmetic but hp's rule
 * (backend.h, reduce_scatter): the blocks travel as an all-to-all into
 * recv (size * n elements, counted as the reduce-scatter) for the caller
 * to add up in rank order (hp_cuda_bf16_sum_ranks). */
int hp_nccl_reduce_scatter(struct hp_nccl *nc, const void *send, void *recv, size_t n, enum hp_dtype t,
			   enum hp_red op, struct hp_err *e);
/* send and recv must not overlap (one ncclSend/ncclRecv pair per peer). */
int hp_nccl_alltoall(struct hp_nccl *nc, const void *send, void *recv, size_t n, enum hp_dtype t,
		     struct hp_err *e);
/* Counts and displacements in elements, host arrays of one per group rank. */
int hp_nccl_alltoallv(struct hp_nccl *nc, const void *send, const int *scounts, const int *sdispls,
		      void *recv, const int *rcounts, const int *rdispls, enum hp_dtype t, int routed,
		      struct hp_err *e);
int hp_nccl_bcast(struct hp_nccl *nc, void *buf, size_t n, enum hp_dtype t, int root, struct hp_err *e);
/* hp_comm_sendrecv's, queued on the stream as one group. */
int hp_nccl_sendrecv(struct hp_nccl *nc, const struct hp_p2p *ops, int n, struct hp_err *e);

/* Ordering between streams (cudaStream_t as void *): an event (disable
 * timing), and "to waits for what is queued on from so far" through it.
 * The CUDA backend orders each group's collectives after the compute that
 * made their input, and the compute that reads their output after them. */
int hp_nccl_event_new(void **ev, struct hp_err *e);
void hp_nccl_event_free(void *ev);
int hp_nccl_order(void *from, void *to, void *ev, struct hp_err *e);
/* Its two halves: ev marks what is queued on stream so far; stream waits
 * for ev's mark (a started collective's end, waited for later). */
int hp_nccl_mark(void *stream, void *ev, struct hp_err *e);
int hp_nccl_after(void *stream, void *ev, struct hp_err *e);

#endif
