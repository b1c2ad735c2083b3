/*
 * gemm.h - hp's own single-precision GEMM: kernels at each instruction-set
 * level (kernels/cpu/isa.h) for the shapes that dominate training,
 * OpenBLAS for small ones.
 *
 * Invariants:
 *   - hp_sgemm has exactly the contract of cblas_sgemm in row-major order;
 *     it is a drop-in replacement at every call site.
 *   - The result depends only on the inputs (the shape, the four trans and
 *     stride arguments, alpha, beta and the data) and the level: a fixed
 *     blocking, a fixed summation order, never the thread count.  The avx2
 *     and avx512 levels give the same bits; baseline (no FMA) its own.  None
 *     is bit-identical to OpenBLAS; all are within float rounding of the
 *     exact product.
 *   - beta == 0 means C is write-only: whatever C held (NaN included) does
 *     not reach the result, as in BLAS.
 *   - Nothing is allocated per call in the steady state: each thread packs
 *     into one buffer of fixed size (about 2.2 MiB), allocated through
 *     hp_malloc_aligned on its first call and kept for the life of the
 *     thread.  If that allocation fails the call goes to OpenBLAS.
 *
 * The path is chosen per call: hp's kernels at hp_cpu_level() (the CPU's
 * level capped by HP_CPU) when the problem is large enough to pay for
 * packing (see HP_SGEMM_MIN_* in gemm.c), else cblas_sgemm.  OpenBLAS is set
 * to one thread (openblas_set_num_threads(1)) on first use: its threading
 * would make the rounding of the products it gets depend on the thread
 * count.
 *
 * Environment:
 *   HP_CPU=baseline|avx2|avx512   cap the level (isa.h; read per call)
 *   HP_GEMM=openblas   every call goes to cblas_sgemm with OpenBLAS's own
 *                      threads: not thread-count invariant (read once)
 */
#ifndef HP_KERNELS_CPU_GEMM_H
#define HP_KERNELS_CPU_GEMM_H

/* C[M,N] = alpha * op(A) * op(B) + beta * C, row-major, exactly the contract of
 * cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
 *             transB ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc).
 * op(A) is M x K (A is K x M when transA), op(B) is K x N (B is N x K when transB).
 * beta == 0 means C is write-only (NaNs in C are not propagated), as BLAS. */
void hp_sgemm(int transA, int transB, int M, int N, int K, float alpha,
	      const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* Threads hp_sgemm splits large products over (HP_NUM_THREADS, else
 * OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, else the online CPUs).  The
 * result does not depend on it. */
int hp_sgemm_threads(void);

/* Which path hp_sgemm takes now for a large problem: "avx512", "avx2",
 * "baseline" (hp's kernels at that level) or "openblas" (HP_GEMM=openblas). */
const char *hp_sgemm_path(void);

/* The paths, callable directly (for tests and the benchmark), one thread.
 * hp_sgemm_openblas is cblas_sgemm with hp_sgemm's arguments.
 * hp_sgemm_level runs hp's kernels of `level` (an enum hp_cpu_level)
 * whatever the size (any M, N, K >= 0; HP_CPU and HP_GEMM ignored) and
 * returns 0, or returns -1 having done nothing when the CPU or the build
 * lacks the level, an argument is invalid, or the packing buffer cannot be
 * allocated. */
void hp_sgemm_openblas(int transA, int transB, int M, int N, int K, float alpha,
		       const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
int hp_sgemm_level(int level, int transA, int transB, int M, int N, int K, float alpha,
		   const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

#endif
