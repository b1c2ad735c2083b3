/*
 * gemm.h - hp's own single-precision GEMM: an AVX-512 path for the shapes
 * that dominate training, OpenBLAS for everything else.
 *
 * Invariants:
 *   - hp_sgemm has exactly the contract of cblas_sgemm in row-major order;
 *     it is a drop-in replacement at every call site.
 *   - The result depends only on the inputs (the shape, the four trans and
 *     stride arguments, alpha, beta and the data): one thread, a fixed
 *     blocking, a fixed summation order.  It is not bit-identical to
 *     OpenBLAS; both are within float rounding of the exact product.
 *   - beta == 0 means C is write-only: whatever C held (NaN included) does
 *     not reach the result, as in BLAS.
 *   - Nothing is allocated per call in the steady state: each thread packs
 *     into one buffer of fixed size (about 2.2 MiB), allocated through
 *     hp_malloc_aligned on its first AVX-512 call and kept for the life of
 *     the thread.  If that allocation fails the call goes to OpenBLAS.
 *
 * The path is chosen once per process: AVX-512 when the CPU has avx512f and
 * avx512vl and HP_GEMM is not "openblas"; then per call, the problem must be
 * large enough to pay for packing (see HP_SGEMM_MIN_* in gemm.c), else the
 * call goes to cblas_sgemm.  On non-x86-64 builds there is no AVX-512 path.
 *
 * When the AVX-512 path is on, OpenBLAS is set to one thread
 * (openblas_set_num_threads(1)): the products it still gets are small, and
 * its threading would make their rounding depend on the thread count.
 *
 * Environment:
 *   HP_GEMM=openblas   every call goes to cblas_sgemm (read once)
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

/* Threads hp_sgemm splits large AVX-512 products over (HP_NUM_THREADS, else
 * OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, else the online CPUs).  The
 * result does not depend on it. */
int hp_sgemm_threads(void);

/* Which path hp_sgemm takes on this machine for a large problem:
 * "avx512" or "openblas". */
const char *hp_sgemm_path(void);

/* The two paths, callable directly (for tests and the benchmark).
 * hp_sgemm_openblas is cblas_sgemm with hp_sgemm's arguments.
 * hp_sgemm_avx512 runs the AVX-512 path whatever the size (any M, N, K >= 0,
 * HP_GEMM ignored) and returns 0, or returns -1 having done nothing when the
 * CPU or the build lacks AVX-512, an argument is invalid, or the packing
 * buffer cannot be allocated. */
void hp_sgemm_openblas(int transA, int transB, int M, int N, int K, float alpha,
		       const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
int hp_sgemm_avx512(int transA, int transB, int M, int N, int K, float alpha,
		    const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

#endif
