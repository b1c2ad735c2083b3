/*
 * pool.h - the CPU kernels' threads: one small pool of workers, started on
 * first use, that runs a call's parts beside the calling thread.
 *
 * Invariants:
 *   - The pool never decides a result: a call is split into parts whose
 *     outputs are disjoint and each computed in a fixed order, so the bits
 *     do not depend on the thread count (callers keep that promise; the
 *     tests of each kernel check it at 1 and 3 threads).
 *   - One caller at a time: a call made while the pool is busy (another
 *     thread's call, or a part calling a pooled kernel itself) runs on its
 *     own thread, with the same result.
 *   - Under MPI run one thread per rank (HP_NUM_THREADS=1).
 */
#ifndef HP_KERNELS_CPU_POOL_H
#define HP_KERNELS_CPU_POOL_H

/* Threads a call may use, the caller included: HP_NUM_THREADS, else
 * OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, else the online CPUs (as
 * OpenBLAS counts them), at most 64; read once. */
int hp_pool_threads(void);

/* Run fn(ctx, part, nparts) for part 0 .. nparts-1, nparts = the pool's
 * threads, the caller doing part 0, and return when all are done.  Returns
 * 0, or -1 having run nothing when the pool has one thread, could not
 * start its workers, or is busy: the caller then does the work itself. */
int hp_pool_run(void (*fn)(void *ctx, int part, int nparts), void *ctx);

/* fn(ctx, i0, i1) over [0, n) in contiguous ranges, one per thread, when n
 * is at least 2 * grain (below, one call on the caller with [0, n)).  The
 * ranges split n evenly, each a multiple of align (> 0) but the last. */
void hp_parallel_for(long n, long grain, long align, void (*fn)(void *ctx, long i0, long i1), void *ctx);

/* Floats a streaming kernel (a pass or two over its arrays at memory speed)
 * should have per part: about 50 microseconds of work, above the tens of
 * microseconds a wake-up of the workers costs. */
#define HP_POOL_GRAIN (1L << 16)

#endif
