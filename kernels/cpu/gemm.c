/*
 * gemm.c - single-threaded AVX-512 SGEMM (GotoBLAS/BLIS blocking), with
 * OpenBLAS as the fallback and the path for small problems.
 *
 * Why it exists: training is GEMM-bound, and on this project's machines the
 * installed OpenBLAS (0.3.21) has to run with OPENBLAS_CORETYPE=Haswell, i.e.
 * AVX2 kernels, on CPUs that have two 512-bit FMA pipes.
 *
 * How: op(B) is packed a block of KC x NC at a time into panels of NR = 32
 * columns (two zmm per k), op(A) a block of MC x KC into panels of MR = 12
 * rows.  The micro-kernel keeps a 12 x 32 tile of C in 24 zmm accumulators
 * and, per k, loads two vectors of B and broadcasts the 12 elements of A
 * (24 FMAs against 14 loads).  All four trans cases differ only in packing,
 * so there is one micro-kernel.  Edges: packing pads the last panels with
 * zeros, and the micro-kernel stores only the valid rows and, through
 * AVX-512 masks, the valid columns.  alpha is applied when C is written;
 * the first K block writes alpha*AB + beta*C (no read of C when beta == 0),
 * later K blocks add.
 *
 * What it is not: multi-threaded (hp runs one rank per core), a complex or
 * double GEMM, or bit-compatible with OpenBLAS.  The result is
 * deterministic: the blocking depends only on M, N, K.
 *
 * Only the functions marked HP_AVX512 are compiled for AVX-512 (target
 * attribute), so the rest of the file and the build stay baseline x86-64;
 * they are reached only after __builtin_cpu_supports says yes.  Other
 * architectures build the OpenBLAS path alone.
 */
#include <cblas.h>
#include <pthread.h>

#include "alloc.h"
#include "cpu/gemm.h"

/* -DHP_GEMM_GENERIC builds the non-x86 configuration on x86 (to test it). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HP_GEMM_GENERIC)
#define HP_GEMM_X86 1
#include <immintrin.h>
#endif

/*
 * Blocking (measured on Zen 5: 48 KiB L1d, 1 MiB L2 per core; see
 * bench/gemm-bench.c).  The micro-panel of B (KC x 32 floats = 32 KiB at
 * KC = 256) is reused across all MR-row panels of A in L1; the packed block
 * of A (MC x KC = 144 KiB at MC = 144) stays in L2; the packed block of B
 * (KC x NC = 2 MiB at NC = 2048) lives in L3 and each of its micro-panels is
 * read once per A block.  K and N are split into equal blocks no larger
 * than KC and NC, so a K of 1376 runs as 6 x ~230 rather than 5 x 256 + 96.
 */
#ifndef HP_GEMM_MR
#define HP_GEMM_MR 12
#endif
#define HP_GEMM_NR 32
#ifndef HP_GEMM_KC
#define HP_GEMM_KC 256
#endif
#ifndef HP_GEMM_MC
#define HP_GEMM_MC 144
#endif
#ifndef HP_GEMM_NC
#define HP_GEMM_NC 2048
#endif

/*
 * Dispatch thresholds: below these a call goes to OpenBLAS.  Packing costs
 * about one pass over A per N/NC and over B per M/MC; it pays once there is
 * enough reuse.  Measured (bench/gemm-bench.c, Zen 5, OpenBLAS-Haswell):
 * see the report in the commit; K = 8 attention products stay on OpenBLAS.
 */
#ifndef HP_SGEMM_MIN_FLOPS
#define HP_SGEMM_MIN_FLOPS (64L * 64 * 64)  /* M*N*K */
#endif
#ifndef HP_SGEMM_MIN_K
#define HP_SGEMM_MIN_K 16
#endif

void hp_sgemm_openblas(int transA, int transB, int M, int N, int K, float alpha,
		       const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
	cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
		    transB ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#ifdef HP_GEMM_X86

#define HP_AVX512 __attribute__((target("avx512f,avx512vl,fma")))

/* One buffer per thread, allocated once at its full size (packed A block,
 * then packed B block; both 64-byte aligned) and freed by a thread-specific
 * destructor when the thread exits. */
#define HP_GEMM_ABUF ((size_t)HP_GEMM_MC * HP_GEMM_KC)
#define HP_GEMM_BBUF ((size_t)HP_GEMM_KC * HP_GEMM_NC)
static __thread float *gemm_buf;
static pthread_key_t gemm_buf_key;
static pthread_once_t gemm_buf_once = PTHREAD_ONCE_INIT;
static int gemm_buf_key_ok;

static void gemm_buf_key_init(void)
{
	gemm_buf_key_ok = !pthread_key_create(&gemm_buf_key, hp_free_aligned);
}

static float *gemm_buffer(void)
{
	if (!gemm_buf) {
		pthread_once(&gemm_buf_once, gemm_buf_key_init);
		gemm_buf = hp_malloc_aligned((HP_GEMM_ABUF + HP_GEMM_BBUF) * sizeof(float));
		if (gemm_buf && gemm_buf_key_ok)
			pthread_setspecific(gemm_buf_key, gemm_buf);
	}
	return gemm_buf;
}

static int has_avx512(void)
{
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
}

static inline long imin(long a, long b)
{
	return a < b ? a : b;
}

/* Split n into the fewest blocks of at most max, of equal size rounded up
 * to a multiple of align (the last block takes the rest). */
static long block_size(long n, long max, long align)
{
	long nb = (n + max - 1) / max;
	long b = (n + nb - 1) / nb;

	b = (b + align - 1) / align * align;
	return b < max ? b : max;
}

/*
 * Pack op(B)[k0:k0+kc, j0:j0+nc] into panels of NR columns: panel p holds
 * kc rows of NR floats, columns past nc are zero.
 */
HP_AVX512 static void pack_b(float *dst, int transB, const float *B, long ldb,
			     long k0, long kc, long j0, long nc)
{
	for (long jp = 0; jp < nc; jp += HP_GEMM_NR, dst += kc * HP_GEMM_NR) {
		long nb = imin(HP_GEMM_NR, nc - jp);

		if (!transB) {
			/* op(B)[k][j] = B[k*ldb + j]: rows are contiguous */
			__mmask16 m0 = nb >= 16 ? 0xffff : (__mmask16)((1u << nb) - 1);
			__mmask16 m1 = nb >= 32 ? 0xffff : nb > 16 ? (__mmask16)((1u << (nb - 16)) - 1) : 0;
			const float *src = B + k0 * ldb + j0 + jp;

			for (long k = 0; k < kc; k++, src += ldb) {
				_mm512_store_ps(dst + k * HP_GEMM_NR, _mm512_maskz_loadu_ps(m0, src));
				_mm512_store_ps(dst + k * HP_GEMM_NR + 16, _mm512_maskz_loadu_ps(m1, src + 16));
			}
		} else {
			/* op(B)[k][j] = B[j*ldb + k]: a transpose, column by column */
			for (long j = 0; j < nb; j++) {
				const float *src = B + (j0 + jp + j) * ldb + k0;
				float *d = dst + j;

				for (long k = 0; k < kc; k++)
					d[k * HP_GEMM_NR] = src[k];
			}
			for (long j = nb; j < HP_GEMM_NR; j++)
				for (long k = 0; k < kc; k++)
					dst[k * HP_GEMM_NR + j] = 0.0f;
		}
	}
}

/*
 * Pack op(A)[i0:i0+mc, k0:k0+kc] into panels of MR rows: panel p holds kc
 * columns of MR floats, rows past mc are zero.
 */
HP_AVX512 static void pack_a(float *dst, int transA, const float *A, long lda,
			     long i0, long mc, long k0, long kc)
{
	for (long ip = 0; ip < mc; ip += HP_GEMM_MR, dst += kc * HP_GEMM_MR) {
		long mb = imin(HP_GEMM_MR, mc - ip);

		if (transA) {
			/* op(A)[i][k] = A[k*lda + i]: each k's MR rows are contiguous */
			__mmask16 lm = (__mmask16)((1u << mb) - 1), sm = (1u << HP_GEMM_MR) - 1;
			const float *src = A + k0 * lda + i0 + ip;

			for (long k = 0; k < kc; k++, src += lda)
				_mm512_mask_storeu_ps(dst + k * HP_GEMM_MR, sm, _mm512_maskz_loadu_ps(lm, src));
		} else {
			/* op(A)[i][k] = A[i*lda + k]: a transpose, row by row */
			for (long r = 0; r < mb; r++) {
				const float *src = A + (i0 + ip + r) * lda + k0;
				float *d = dst + r;

				for (long k = 0; k < kc; k++)
					d[k * HP_GEMM_MR] = src[k];
			}
			for (long r = mb; r < HP_GEMM_MR; r++)
				for (long k = 0; k < kc; k++)
					dst[k * HP_GEMM_MR + r] = 0.0f;
		}
	}
}

/* C row (32 wide, masked) = alpha * acc + beta * C, C not read when beta == 0. */
HP_AVX512 static inline void store_row(float *c, __m512 v0, __m512 v1, __mmask16 m0, __mmask16 m1,
				       __m512 va, __m512 vb, int read_c)
{
	v0 = _mm512_mul_ps(va, v0);
	v1 = _mm512_mul_ps(va, v1);
	if (read_c) {
		v0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, c), v0);
		v1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, c + 16), v1);
	}
	_mm512_mask_storeu_ps(c, m0, v0);
	_mm512_mask_storeu_ps(c + 16, m1, v1);
}

#if HP_GEMM_MR == 14
#define HP_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#elif HP_GEMM_MR == 12
#define HP_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#elif HP_GEMM_MR == 10
#define HP_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9)
#endif
#define HP_ACC_DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps();
#define HP_ACC_FMA(r) { \
		__m512 ar = _mm512_set1_ps(a[r]); \
		c##r##0 = _mm512_fmadd_ps(ar, b0, c##r##0); \
		c##r##1 = _mm512_fmadd_ps(ar, b1, c##r##1); }
#define HP_ACC_STORE(r) \
	if (r < m) \
		store_row(c + r * ldc, c##r##0, c##r##1, m0, m1, va, vb, read_c);
#define HP_C_PREFETCH(r) \
	if (r < m) { \
		_mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0); \
		_mm_prefetch((const char *)(c + r * ldc + HP_GEMM_NR - 1), _MM_HINT_T0); }

/*
 * The micro-kernel: C[0:m, 0:n] (row stride ldc) = alpha * a b + beta * C,
 * a one packed MR x kc panel of A, b one packed kc x NR panel of B; m <= MR
 * rows and n <= NR columns of C are written.  alpha_beta points at {alpha, beta}.
 */
HP_AVX512 __attribute__((noinline)) static void kernel_12x32(long kc, const float *a, const float *b, float *c, long ldc,
				   int m, int n, const float *alpha_beta)
{
	HP_ROWS(HP_ACC_DECL)
	HP_ROWS(HP_C_PREFETCH)
	for (long k = 0; k < kc; k++) {
		__m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);

		HP_ROWS(HP_ACC_FMA)
		a += HP_GEMM_MR;
		b += HP_GEMM_NR;
	}
	__mmask16 m0 = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
	__mmask16 m1 = n >= 32 ? 0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
	__m512 va = _mm512_set1_ps(alpha_beta[0]), vb = _mm512_set1_ps(alpha_beta[1]);
	int read_c = alpha_beta[1] != 0.0f;

	HP_ROWS(HP_ACC_STORE)
}

HP_AVX512 static void sgemm_avx512(int transA, int transB, long M, long N, long K, float alpha,
				   const float *A, long lda, const float *B, long ldb,
				   float beta, float *C, long ldc, float *buf)
{
	float *pa = buf, *pb = buf + HP_GEMM_ABUF;
	long KC = block_size(K, HP_GEMM_KC, 8);
	long NC = block_size(N, HP_GEMM_NC, HP_GEMM_NR);
	long MC = block_size(M, HP_GEMM_MC, HP_GEMM_MR);

	for (long jc = 0; jc < N; jc += NC) {
		long nc = imin(NC, N - jc);

		for (long pc = 0; pc < K; pc += KC) {
			long kc = imin(KC, K - pc);
			/* by pointer: as arguments alpha and beta would sit in two
			 * zmm registers through the k loop, which needs 27 of 32 */
			const float ab[2] = { alpha, pc == 0 ? beta : 1.0f };

			pack_b(pb, transB, B, ldb, pc, kc, jc, nc);
			for (long ic = 0; ic < M; ic += MC) {
				long mc = imin(MC, M - ic);

				pack_a(pa, transA, A, lda, ic, mc, pc, kc);
				for (long jr = 0; jr < nc; jr += HP_GEMM_NR)
					for (long ir = 0; ir < mc; ir += HP_GEMM_MR)
						kernel_12x32(kc, pa + ir * kc, pb + jr * kc,
							     C + (ic + ir) * ldc + jc + jr, ldc,
							     (int)imin(HP_GEMM_MR, mc - ir),
							     (int)imin(HP_GEMM_NR, nc - jr), ab);
			}
		}
	}
}

#endif /* HP_GEMM_X86 */

/* C = beta * C (beta == 0: C = 0), for K == 0 or alpha == 0 as BLAS does. */
static void scale_c(long M, long N, float beta, float *C, long ldc)
{
	for (long i = 0; i < M; i++)
		for (long j = 0; j < N; j++)
			C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

int hp_sgemm_avx512(int transA, int transB, int M, int N, int K, float alpha,
		    const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
#ifdef HP_GEMM_X86
	float *buf;

	/* the argument checks of cblas_sgemm, row-major */
	if (M < 0 || N < 0 || K < 0 || lda < (transA ? (M > 1 ? M : 1) : (K > 1 ? K : 1)) ||
	    ldb < (transB ? (K > 1 ? K : 1) : (N > 1 ? N : 1)) || ldc < (N > 1 ? N : 1))
		return -1;
	if (!has_avx512())
		return -1;
	if (M == 0 || N == 0)
		return 0;
	if (K == 0 || alpha == 0.0f) {
		if (beta != 1.0f)
			scale_c(M, N, beta, C, ldc);
		return 0;
	}
	if (!(buf = gemm_buffer()))
		return -1;
	sgemm_avx512(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, buf);
	return 0;
#else
	(void)transA; (void)transB; (void)M; (void)N; (void)K; (void)alpha; (void)A; (void)lda;
	(void)B; (void)ldb; (void)beta; (void)C; (void)ldc; (void)scale_c;
	return -1;
#endif
}

/* 1: AVX-512, 0: OpenBLAS, -1: not decided yet (HP_GEMM and the CPU are
 * read on the first call; a race only repeats the same decision). */
static int gemm_mode = -1;

static int sgemm_mode(void)
{
	int mode = __atomic_load_n(&gemm_mode, __ATOMIC_RELAXED);

	if (mode < 0) {
		const char *s = getenv("HP_GEMM");

		mode = 0;
#ifdef HP_GEMM_X86
		if (!(s && !strcmp(s, "openblas")) && has_avx512())
			mode = 1;
#else
		(void)s;
#endif
		__atomic_store_n(&gemm_mode, mode, __ATOMIC_RELAXED);
	}
	return mode;
}

const char *hp_sgemm_path(void)
{
	return sgemm_mode() ? "avx512" : "openblas";
}

void hp_sgemm(int transA, int transB, int M, int N, int K, float alpha,
	      const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
	if (sgemm_mode() && K >= HP_SGEMM_MIN_K && (long)M * N * K >= HP_SGEMM_MIN_FLOPS &&
	    !hp_sgemm_avx512(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
		return;
	hp_sgemm_openblas(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
