/*
 * gemm.c - hp's single-precision GEMM (GotoBLAS/BLIS blocking) at three
 * instruction-set levels, with OpenBLAS for small problems.
 *
 * Why it exists: training is GEMM-bound, and a run must give the same bits
 * whatever the thread count.  OpenBLAS's threaded GEMM splits the K sum
 * differently with the thread count; hp's splits C by rows, so each element
 * is the same sum in the same order however many threads share a product.
 * hp's kernels also run faster than the installed OpenBLAS (0.3.21) on
 * AVX-512 machines, where that OpenBLAS has to run its Haswell kernels.
 *
 * How: op(B) is packed a block of KC x NC at a time into panels of NR
 * columns, op(A) a block of MC x KC into panels of MR rows; a micro-kernel
 * keeps an MR x NR tile of C in registers.  The blocking loops are one
 * function (sgemm_blocked) over a table per level:
 *   avx512  MR 12, NR 32: 24 zmm accumulators; per k two vectors of B and
 *           12 broadcasts of A (24 FMAs against 14 loads); packing by
 *           16 x 16 transposes, edges through AVX-512 masks
 *   avx2    MR 6, NR 16: 12 ymm accumulators; per k two vectors of B and
 *           6 broadcasts (12 FMAs against 8 loads); op(A) broadcast from
 *           where it lies (not packed) unless transposed with N >= 1024;
 *           packing by vector copies and 8 x 8 transposes
 *   baseline MR 4, NR 8: vector extensions (SSE on x86-64, NEON on arm64),
 *           a multiply and an add per term (no FMA at this level)
 * All four trans cases differ only in packing (or where A is read from).
 * Packing pads the last panels with zeros; the micro-kernels store only
 * the valid rows and columns.  alpha is applied when C is written: the
 * first K block writes alpha*AB + beta*C (no read of C when beta == 0),
 * later K blocks add C.
 *
 * Bits: each element of C is, per K block of KC terms (K split into equal
 * blocks by block_size, the same at every level), a sum in k order from
 * zero, then alpha*sum + beta*C with one rounding of each.  MR, NR, MC and
 * NC only decide which element is computed when, so avx2 and avx512 (both
 * a fused multiply-add per term) give identical bits, and t/unit/test-gemm
 * checks that they do; baseline rounds the product and the sum apart.
 *
 * Threads: a process that asks for more than one thread (HP_NUM_THREADS,
 * else OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, else the online CPUs, as
 * OpenBLAS itself does) splits large products by rows of C over pool.h's workers
 * (started on first use).  Each element of C is still computed by
 * one thread with the same K blocking, so the result is bit-identical
 * whatever the thread count.  Under MPI, run one thread per rank.  OpenBLAS,
 * which still gets the small products, runs on one thread per call.
 *
 * Only the functions marked HP_AVX512 or HP_AVX2 are compiled for those
 * levels (target attribute), so the rest of the file and the build stay
 * baseline x86-64; they are reached only when hp_cpu_level() says so.
 * Other architectures build the baseline level alone.
 */
#include <cblas.h>
#include <pthread.h>

#include "base/alloc.h"
#include "cpu/gemm.h"
#include "cpu/isa.h"
#include "cpu/pool.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
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
 * KC is the same at every level (it decides the bits); MC must be a multiple
 * of every level's MR and NC of every NR.
 */
#ifndef HP_GEMM_MR
#define HP_GEMM_MR 12
#endif
#define MR512 HP_GEMM_MR
#define NR512 32
#define MR2 6
#define NR2 16
#define MR0 4
#define NR0 8
#ifndef HP_GEMM_KC
#define HP_GEMM_KC 256
#endif
#ifndef HP_GEMM_MC
#define HP_GEMM_MC 144
#endif
#ifndef HP_GEMM_NC
#define HP_GEMM_NC 2048
#endif
_Static_assert(HP_GEMM_MC % MR512 == 0 && HP_GEMM_MC % MR2 == 0 && HP_GEMM_MC % MR0 == 0,
	       "MC must hold whole panels of every level");
_Static_assert(HP_GEMM_NC % NR512 == 0 && HP_GEMM_NC % NR2 == 0 && HP_GEMM_NC % NR0 == 0,
	       "NC must hold whole panels of every level");
/*
 * Reading op(A) in place (avx2): packing A cost 14% of a product with N =
 * 64 (4 panels of B share each packed block) and 4% of the wide model's
 * step.  Measured on Zen 5 at HP_CPU=avx2 against packing, GFLOP/s: N = 64
 * shapes 100-113 -> 116-127 (OpenBLAS 108-120), the big training shapes
 * unchanged within the +-3% noise, except transposed A with N = 1376, 2%
 * slower in 4 of 4 runs: there a packed block serves 86 panels of B.
 */
#define HP_GEMM_DIRECT_N 1024
/* rows of C per thread are a multiple of this: whole panels at every level */
#define HP_GEMM_ROW_UNIT 12
_Static_assert(HP_GEMM_ROW_UNIT % MR2 == 0 && HP_GEMM_ROW_UNIT % MR0 == 0, "thread rows");

/*
 * Dispatch thresholds: smaller calls go to OpenBLAS.  Measured on Zen 5
 * against OpenBLAS-Haswell, one thread, over all four trans cases and
 * M, N, K in {8..256}: with N >= 32 (a narrower C wastes most of the
 * 32-wide tile), M >= 24 (two row tiles; at M = 8..16 packing B is paid
 * for too few rows), K >= 16 and M*N*K >= 32^3, the AVX-512 path won on
 * every shape measured (geometric mean 1.5x at these sizes, 1.7x from
 * 2^22 up); below, OpenBLAS won on 141 of 875 shapes, down to 0.3x.
 * The attention products with head_dim 8 (K = 8) stay on OpenBLAS.
 * The same thresholds serve every level: which path a product takes
 * never depends on the thread count, so they decide speed, not bits.
 */
#define HP_SGEMM_MIN_M 24
#define HP_SGEMM_MIN_N 32
#define HP_SGEMM_MIN_K 16
#define HP_SGEMM_MIN_MNK (32L * 32 * 32)

static int sgemm_mode(void);

void hp_sgemm_openblas(int transA, int transB, int M, int N, int K, float alpha,
		       const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
	sgemm_mode();   /* sets OpenBLAS to one thread, unless HP_GEMM=openblas */
	cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
		    transB ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

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

/* A level: its tile and its three functions.
 *   pack_a(dst, transA, A, lda, i0, mc, k0, kc): op(A)[i0:i0+mc, k0:k0+kc]
 *     into panels of mr rows (kc columns of mr floats each), rows past mc 0
 *   pack_b(dst, transB, B, ldb, k0, kc, j0, nc): op(B)[k0:k0+kc, j0:j0+nc]
 *     into panels of nr columns (kc rows of nr floats each), columns past nc 0
 *   kernel(kc, a, b, c, ldc, m, n, alpha_beta): C[0:m, 0:n] (row stride
 *     ldc) = alpha * a b + beta * C for one packed panel of each, m <= mr,
 *     n <= nr, alpha_beta = {alpha, beta}; C is not read when beta == 0. */
struct gemm_level {
	int mr, nr;
	void (*pack_a)(float *, int, const float *, long, long, long, long, long);
	void (*pack_b)(float *, int, const float *, long, long, long, long, long);
	void (*kernel)(long, const float *, const float *, float *, long, int, int, const float *);
	/* kernel_rows(kc, a, lda, b, c, ldc, m, n, alpha_beta): kernel's
	 * product with op(A) = A read in place (row r at a + r*lda); NULL
	 * where the level always packs A */
	void (*kernel_rows)(long, const float *, long, const float *, float *, long, int, int, const float *);
	/* kernel_cols: the same with op(A) = A^T read in place (row r of
	 * op(A) at a + r, k at stride lda) */
	void (*kernel_cols)(long, const float *, long, const float *, float *, long, int, int, const float *);
};

/* ---- packing in plain C (avx2 and baseline) ---- */

#define HP_INLINE static inline __attribute__((always_inline))

/*
 * Both operands pack the same way: w-wide panels along the dimension the
 * panels run over (rows of op(A), columns of op(B)), kc values of k each,
 * panel p at dst + p*kc*w, element (k, i) at [k*w + i], zeros past n.  The
 * source X holds element (k, i) at X[(k0+k)*ld + r0+i] when kmajor (op(A)
 * with transA, op(B) without transB: each k's w values are contiguous), at
 * X[(r0+i)*ld + k0+k] otherwise (each i's kc values are contiguous).
 */
HP_INLINE void pack_plain(float *dst, int kmajor, const float *X, long ld,
			  long r0, long n, long k0, long kc, const int w)
{
	for (long ip = 0; ip < n; ip += w, dst += kc * w) {
		long nb = imin(w, n - ip);

		if (kmajor) {
			const float *src = X + k0 * ld + r0 + ip;

			for (long k = 0; k < kc; k++, src += ld) {
				long i = 0;
				for (; i < nb; i++)
					dst[k * w + i] = src[i];
				for (; i < w; i++)
					dst[k * w + i] = 0.0f;
			}
		} else {
			for (long i = 0; i < w; i++) {
				const float *src = i < nb ? X + (r0 + ip + i) * ld + k0 : NULL;

				for (long k = 0; k < kc; k++)
					dst[k * w + i] = src ? src[k] : 0.0f;
			}
		}
	}
}

/* The level table's two packers over pack_plain, for one level's MR and NR. */
#define HP_PACKERS(attr, lv, mr, nr)								\
	attr static void pack_a_##lv(float *dst, int transA, const float *A, long lda,		\
				     long i0, long mc, long k0, long kc)			\
	{											\
		pack_plain(dst, transA, A, lda, i0, mc, k0, kc, mr);				\
	}											\
	attr static void pack_b_##lv(float *dst, int transB, const float *B, long ldb,		\
				     long k0, long kc, long j0, long nc)			\
	{											\
		pack_plain(dst, !transB, B, ldb, j0, nc, k0, kc, nr);				\
	}

/* ---- baseline: vector extensions, no FMA ---- */

HP_PACKERS(, base, MR0, NR0)

/* Four lanes, not vec.h's eight: on the baseline target (SSE) GCC splits an
 * 8-lane accumulator array through memory, and the kernel ran at 6.6
 * GFLOP/s against 11 with two 4-lane halves (gemm-bench, this AVX2 EPYC). */
typedef float gv4 __attribute__((vector_size(16)));

static gv4 gv4_load(const float *p)
{
	gv4 v;
	__builtin_memcpy(&v, p, sizeof(v));
	return v;
}

static void gv4_store(float *p, gv4 v)
{
	__builtin_memcpy(p, &v, sizeof(v));
}

static void kernel_base(long kc, const float *a, const float *b, float *c, long ldc,
			int m, int n, const float *alpha_beta)
{
	gv4 acc[MR0][2] = { { { 0 } } };
	float alpha = alpha_beta[0], beta = alpha_beta[1];

	for (long k = 0; k < kc; k++, a += MR0, b += NR0) {
		gv4 b0 = gv4_load(b), b1 = gv4_load(b + 4);

		for (int r = 0; r < MR0; r++) {
			gv4 ar = { a[r], a[r], a[r], a[r] };
			acc[r][0] += ar * b0;
			acc[r][1] += ar * b1;
		}
	}
	for (int r = 0; r < m; r++) {
		float t[NR0];

		gv4_store(t, acc[r][0]);
		gv4_store(t + 4, acc[r][1]);
		for (int j = 0; j < n; j++) {
			float v = alpha * t[j];
			c[r * ldc + j] = beta != 0.0f ? beta * c[r * ldc + j] + v : v;
		}
	}
}

static const struct gemm_level level_base = { MR0, NR0, pack_a_base, pack_b_base, kernel_base, NULL, NULL };

#ifdef HP_GEMM_X86

/* ---- avx2: AVX2 + FMA ---- */

#define HP_AVX2 __attribute__((target("avx2,fma")))

/*
 * Packing at this level: vector copies where op(X)'s panel values are
 * contiguous (kmajor), 8 x 8 transposes where they are not; the plain
 * packer did these element by element and took 12% of a training step's
 * time (perf, the bench's wide model at HP_CPU=avx2).  Packing moves
 * values and never rounds, so the bits of C do not depend on the packer.
 * No load reads past a row or column op(X) has.
 */

#ifndef HP_PACK_AHEAD
#define HP_PACK_AHEAD 64
#endif
/* t[c] = column c of the 8 x 8 block r[0..7] (rows), in place. */
HP_AVX2 static inline void transpose8(__m256 r[8])
{
	__m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
	__m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
	__m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
	__m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
	__m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
	__m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
	__m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
	__m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);

	r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
	r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
	r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
	r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
	r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
	r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
	r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
	r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* The non-kmajor case of pack_plain for one panel of NR2 values (rows of
 * X r0.., each kc long from k0), n of them present: 8 values of k at a
 * time from the 16 rows, transposed in two 8 x 8 halves; the k tail
 * (kc % 8) element by element.  (op(A) is never packed transposed this
 * way: untransposed A is read in place, see kernel_avx2_rows.) */
HP_AVX2 static inline void pack_panel_t(float *dst, const float *X, long ld, long r0, long n, long k0,
					long kc)
{
	const int w = NR2;
	long k = 0;

	for (; k + 8 <= kc; k += 8) {
		for (int h = 0; h < w; h += 8) {
			__m256 r[8];

			for (int i = 0; i < 8; i++)
				if (h + i < n) {
					const float *x = X + (r0 + h + i) * ld + k0 + k;

					_mm_prefetch((const char *)(x + HP_PACK_AHEAD), _MM_HINT_T0);
					r[i] = _mm256_loadu_ps(x);
				} else {
					r[i] = _mm256_setzero_ps();
				}
			transpose8(r);
			for (int c = 0; c < 8; c++)
				_mm256_storeu_ps(dst + (k + c) * w + h, r[c]);
		}
	}
	for (; k < kc; k++)
		for (int i = 0; i < w; i++)
			dst[k * w + i] = i < n ? X[(r0 + i) * ld + k0 + k] : 0.0f;
}

/* op(A) into panels of 6 rows.  sgemm_blocked packs only transposed A at
 * this level (the rest is read in place); untransposed A would take the
 * plain packer. */
HP_AVX2 static void pack_a_avx2(float *dst, int transA, const float *A, long lda,
				long i0, long mc, long k0, long kc)
{
	for (long ip = 0; ip < mc; ip += MR2, dst += kc * MR2) {
		long nb = imin(MR2, mc - ip);

		if (transA && nb == MR2) {
			/* op(A)[i][k] = A[k*lda + i]: 4 + 2 values per k */
			const float *src = A + k0 * lda + i0 + ip;

			for (long k = 0; k < kc; k++, src += lda) {
				_mm_storeu_ps(dst + k * MR2, _mm_loadu_ps(src));
				_mm_store_sd((double *)(dst + k * MR2 + 4), _mm_load_sd((const double *)(src + 4)));
			}
		} else {
			pack_plain(dst, transA, A, lda, i0 + ip, nb, k0, kc, MR2);
		}
	}
}

/* op(B) into panels of 16 columns. */
HP_AVX2 static void pack_b_avx2(float *dst, int transB, const float *B, long ldb,
				long k0, long kc, long j0, long nc)
{
	const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);

	for (long jp = 0; jp < nc; jp += NR2, dst += kc * NR2) {
		long nb = imin(NR2, nc - jp);

		if (transB) {
			pack_panel_t(dst, B, ldb, j0 + jp, nb, k0, kc);
		} else {
			/* op(B)[k][j] = B[k*ldb + j]: rows are contiguous */
			__m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nb), lane);
			__m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nb - 8), lane);
			const float *src = B + k0 * ldb + j0 + jp;

			if (nb == NR2)
				for (long k = 0; k < kc; k++, src += ldb) {
					_mm256_store_ps(dst + k * NR2, _mm256_loadu_ps(src));
					_mm256_store_ps(dst + k * NR2 + 8, _mm256_loadu_ps(src + 8));
				}
			else
				for (long k = 0; k < kc; k++, src += ldb) {
					_mm256_store_ps(dst + k * NR2, _mm256_maskload_ps(src, m0));
					_mm256_store_ps(dst + k * NR2 + 8, _mm256_maskload_ps(src + 8, m1));
				}
		}
	}
}

/* C row (16 wide, lanes in mask m0/m1) = alpha * acc + beta * C, C not read
 * when beta == 0: the operations of the AVX-512 store_row, lane for lane. */
HP_AVX2 static inline void store_row2(float *c, __m256 v0, __m256 v1, __m256i m0, __m256i m1,
				      __m256 va, __m256 vb, int read_c, int full)
{
	v0 = _mm256_mul_ps(va, v0);
	v1 = _mm256_mul_ps(va, v1);
	if (full) {
		if (read_c) {
			v0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(c), v0);
			v1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(c + 8), v1);
		}
		_mm256_storeu_ps(c, v0);
		_mm256_storeu_ps(c + 8, v1);
		return;
	}
	if (read_c) {
		v0 = _mm256_fmadd_ps(vb, _mm256_maskload_ps(c, m0), v0);
		v1 = _mm256_fmadd_ps(vb, _mm256_maskload_ps(c + 8, m1), v1);
	}
	_mm256_maskstore_ps(c, m0, v0);
	_mm256_maskstore_ps(c + 8, m1, v1);
}

#define HP_ROWS2(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define HP_ACC2_DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps();
#define HP_AROW2_DECL(r) const float *ap##r = a + (clamp && r >= m ? 0 : r) * rs;
#define HP_ACC2_FMA(r) { \
		__m256 ar = _mm256_broadcast_ss(ap##r + k * ks); \
		c##r##0 = _mm256_fmadd_ps(ar, b0, c##r##0); \
		c##r##1 = _mm256_fmadd_ps(ar, b1, c##r##1); }
#define HP_ACC2_STORE(r) \
	if (r < m) \
		store_row2(c + r * ldc, c##r##0, c##r##1, m0, m1, va, vb, read_c, full);

/*
 * The micro-kernel, one body for the three places op(A) is read from:
 * element (r, k) of the MR x kc panel at a + r*rs + k*ks.  Packed (rs 1,
 * ks MR2, rows past m zero), or in place with no packing (A: rs lda, ks 1;
 * A^T: rs 1, ks lda), where rows past m read row 0 (clamp) and are not
 * stored.  The FMAs are the same in every case, so C's bits are too.
 */
HP_INLINE HP_AVX2 void tile_avx2(long kc, const float *a, long rs, long ks, const int clamp, const float *b,
				 float *c, long ldc, int m, int n, const float *alpha_beta)
{
	HP_ROWS2(HP_ACC2_DECL)
	HP_ROWS2(HP_AROW2_DECL)
	for (long k = 0; k < kc; k++) {
		__m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);

		HP_ROWS2(HP_ACC2_FMA)
		b += NR2;
	}
	const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	__m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
	__m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - 8), lane);
	__m256 va = _mm256_set1_ps(alpha_beta[0]), vb = _mm256_set1_ps(alpha_beta[1]);
	int read_c = alpha_beta[1] != 0.0f, full = n == NR2;

	HP_ROWS2(HP_ACC2_STORE)
}

HP_AVX2 __attribute__((noinline)) static void kernel_avx2(long kc, const float *a, const float *b, float *c,
							   long ldc, int m, int n, const float *alpha_beta)
{
	tile_avx2(kc, a, 1, MR2, 0, b, c, ldc, m, n, alpha_beta);
}

HP_AVX2 __attribute__((noinline)) static void kernel_avx2_rows(long kc, const float *a, long lda,
								const float *b, float *c, long ldc, int m, int n,
								const float *alpha_beta)
{
	tile_avx2(kc, a, lda, 1, 1, b, c, ldc, m, n, alpha_beta);
}

HP_AVX2 __attribute__((noinline)) static void kernel_avx2_cols(long kc, const float *a, long lda,
								const float *b, float *c, long ldc, int m, int n,
								const float *alpha_beta)
{
	tile_avx2(kc, a, 1, lda, 1, b, c, ldc, m, n, alpha_beta);
}

static const struct gemm_level level_avx2 = { MR2, NR2, pack_a_avx2, pack_b_avx2, kernel_avx2, kernel_avx2_rows,
					      kernel_avx2_cols };

/* ---- avx512: AVX-512 F and VL ---- */

#define HP_AVX512 __attribute__((target("avx512f,avx512vl,fma")))

/*
 * dst[k * dstride + i] = src[i * sstride + k] for i < rows (<= 16), k < kc,
 * and 0 for rows <= i < 16; each dst row keeps the lanes in keep.  Works on
 * 16 x 16 blocks: unpack pairs of rows, shuffle 4 x 4 blocks within 128-bit
 * lanes, then transpose the 128-bit lanes across four registers.
 */
HP_AVX512 static void transpose_pack(float *dst, long dstride, const float *src, long sstride,
				     int rows, long kc, __mmask16 keep)
{
	for (long k = 0; k < kc; k += 16) {
		int kn = (int)imin(16, kc - k);
		__mmask16 lm = kn == 16 ? 0xffff : (__mmask16)((1u << kn) - 1);
		__m512 r[16], t[16], u[16];

		for (int i = 0; i < 16; i++)
			r[i] = i < rows ? _mm512_maskz_loadu_ps(lm, src + i * sstride + k) : _mm512_setzero_ps();
		for (int i = 0; i < 16; i += 2) {
			t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
			t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
		}
		/* u[4g + c], 128-bit lane L: column 4L + c of rows 4g..4g+3 */
		for (int g = 0; g < 16; g += 4) {
			u[g] = _mm512_shuffle_ps(t[g], t[g + 2], 0x44);
			u[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], 0xee);
			u[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0x44);
			u[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0xee);
		}
		for (int c = 0; c < 4; c++) {
			__m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
			__m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xee);
			__m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
			__m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xee);

			r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
			r[4 + c] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
			r[8 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
			r[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
		}
		for (int c = 0; c < kn; c++)
			_mm512_mask_storeu_ps(dst + (k + c) * dstride, keep, r[c]);
	}
}

/*
 * Pack op(B)[k0:k0+kc, j0:j0+nc] into panels of NR columns: panel p holds
 * kc rows of NR floats, columns past nc are zero.
 */
HP_AVX512 static void pack_b_avx512(float *dst, int transB, const float *B, long ldb,
			     long k0, long kc, long j0, long nc)
{
	for (long jp = 0; jp < nc; jp += NR512, dst += kc * NR512) {
		long nb = imin(NR512, nc - jp);

		if (!transB) {
			/* op(B)[k][j] = B[k*ldb + j]: rows are contiguous */
			__mmask16 m0 = nb >= 16 ? 0xffff : (__mmask16)((1u << nb) - 1);
			__mmask16 m1 = nb >= 32 ? 0xffff : nb > 16 ? (__mmask16)((1u << (nb - 16)) - 1) : 0;
			const float *src = B + k0 * ldb + j0 + jp;

			for (long k = 0; k < kc; k++, src += ldb) {
				_mm512_store_ps(dst + k * NR512, _mm512_maskz_loadu_ps(m0, src));
				_mm512_store_ps(dst + k * NR512 + 16, _mm512_maskz_loadu_ps(m1, src + 16));
			}
		} else {
			/* op(B)[k][j] = B[j*ldb + k]: 16 x 16 transposes */
			for (int h = 0; h < 2; h++)
				transpose_pack(dst + 16 * h, NR512, B + (j0 + jp + 16 * h) * ldb + k0, ldb,
					       (int)imin(16, nb > 16 * h ? nb - 16 * h : 0), kc, 0xffff);
		}
	}
}

/*
 * Pack op(A)[i0:i0+mc, k0:k0+kc] into panels of MR rows: panel p holds kc
 * columns of MR floats, rows past mc are zero.
 */
HP_AVX512 static void pack_a_avx512(float *dst, int transA, const float *A, long lda,
			     long i0, long mc, long k0, long kc)
{
	for (long ip = 0; ip < mc; ip += MR512, dst += kc * MR512) {
		long mb = imin(MR512, mc - ip);

		if (transA) {
			/* op(A)[i][k] = A[k*lda + i]: each k's MR rows are contiguous */
			__mmask16 lm = (__mmask16)((1u << mb) - 1), sm = (1u << MR512) - 1;
			const float *src = A + k0 * lda + i0 + ip;

			for (long k = 0; k < kc; k++, src += lda)
				_mm512_mask_storeu_ps(dst + k * MR512, sm, _mm512_maskz_loadu_ps(lm, src));
		} else {
			/* op(A)[i][k] = A[i*lda + k]: 16 x 16 transposes, 12 lanes kept */
			transpose_pack(dst, MR512, A + (i0 + ip) * lda + k0, lda, (int)mb, kc,
				       (__mmask16)((1u << MR512) - 1));
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

#if MR512 == 14
#define HP_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#elif MR512 == 12
#define HP_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#elif MR512 == 10
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
		_mm_prefetch((const char *)(c + r * ldc + NR512 - 1), _MM_HINT_T0); }

/*
 * The micro-kernel: C[0:m, 0:n] (row stride ldc) = alpha * a b + beta * C,
 * a one packed MR x kc panel of A, b one packed kc x NR panel of B; m <= MR
 * rows and n <= NR columns of C are written.  alpha_beta points at {alpha, beta}.
 */
HP_AVX512 __attribute__((noinline)) static void kernel_12x32(long kc, const float *a, const float *b, float *c,
							       long ldc, int m, int n, const float *alpha_beta)
{
	HP_ROWS(HP_ACC_DECL)
	HP_ROWS(HP_C_PREFETCH)
	for (long k = 0; k < kc; k++) {
		__m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);

		HP_ROWS(HP_ACC_FMA)
		a += MR512;
		b += NR512;
	}
	__mmask16 m0 = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
	__mmask16 m1 = n >= 32 ? 0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
	__m512 va = _mm512_set1_ps(alpha_beta[0]), vb = _mm512_set1_ps(alpha_beta[1]);
	int read_c = alpha_beta[1] != 0.0f;

	HP_ROWS(HP_ACC_STORE)
}


static const struct gemm_level level_avx512 = { MR512, NR512, pack_a_avx512, pack_b_avx512, kernel_12x32, NULL, NULL };

#endif /* HP_GEMM_X86 */

/* The table of a level, or NULL when this build or CPU lacks it. */
static const struct gemm_level *gemm_level(int level)
{
	if (level < HP_CPU_BASELINE || level > hp_cpu_level_max())
		return NULL;
#ifdef HP_GEMM_X86
	if (level == HP_CPU_AVX512)
		return &level_avx512;
	if (level == HP_CPU_AVX2)
		return &level_avx2;
#endif
	return &level_base;
}

static void sgemm_blocked(const struct gemm_level *lv, int transA, int transB, long M, long N, long K,
			  float alpha, const float *A, long lda, const float *B, long ldb,
			  float beta, float *C, long ldc, float *buf)
{
	float *pa = buf, *pb = buf + HP_GEMM_ABUF;
	long KC = block_size(K, HP_GEMM_KC, 8);
	long NC = block_size(N, HP_GEMM_NC, lv->nr);
	long MC = block_size(M, HP_GEMM_MC, lv->mr);
	/* op(A) read in place instead of packed, where the level can (see
	 * kernel_avx2_rows): always when A is not transposed; when it is, for N
	 * below HP_GEMM_DIRECT_N (few panels of B to share a packed A) */
	int direct = transA ? lv->kernel_cols && N < HP_GEMM_DIRECT_N : lv->kernel_rows != NULL;

	for (long jc = 0; jc < N; jc += NC) {
		long nc = imin(NC, N - jc);

		for (long pc = 0; pc < K; pc += KC) {
			long kc = imin(KC, K - pc);
			/* by pointer: as arguments alpha and beta would sit in two
			 * vector registers through the k loop, which needs them all */
			const float ab[2] = { alpha, pc == 0 ? beta : 1.0f };

			lv->pack_b(pb, transB, B, ldb, pc, kc, jc, nc);
			for (long ic = 0; ic < M; ic += MC) {
				long mc = imin(MC, M - ic);

				if (!direct)
					lv->pack_a(pa, transA, A, lda, ic, mc, pc, kc);
				for (long jr = 0; jr < nc; jr += lv->nr)
					for (long ir = 0; ir < mc; ir += lv->mr) {
						float *c = C + (ic + ir) * ldc + jc + jr;
						int m = (int)imin(lv->mr, mc - ir), n = (int)imin(lv->nr, nc - jr);

						if (direct && transA)
							lv->kernel_cols(kc, A + pc * lda + ic + ir, lda, pb + jr * kc,
									c, ldc, m, n, ab);
						else if (direct)
							lv->kernel_rows(kc, A + (ic + ir) * lda + pc, lda, pb + jr * kc,
									c, ldc, m, n, ab);
						else
							lv->kernel(kc, pa + ir * kc, pb + jr * kc, c, ldc, m, n, ab);
					}
			}
		}
	}
}

/* C = beta * C (beta == 0: C = 0), for K == 0 or alpha == 0 as BLAS does. */
static void scale_c(long M, long N, float beta, float *C, long ldc)
{
	for (long i = 0; i < M; i++)
		for (long j = 0; j < N; j++)
			C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

int hp_sgemm_level(int level, int transA, int transB, int M, int N, int K, float alpha,
		   const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
	const struct gemm_level *lv = gemm_level(level);
	float *buf;

	/* the argument checks of cblas_sgemm, row-major */
	if (M < 0 || N < 0 || K < 0 || lda < (transA ? (M > 1 ? M : 1) : (K > 1 ? K : 1)) ||
	    ldb < (transB ? (K > 1 ? K : 1) : (N > 1 ? N : 1)) || ldc < (N > 1 ? N : 1))
		return -1;
	if (!lv)
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
	sgemm_blocked(lv, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, buf);
	return 0;
}

/* 1: hp's levels, 0: OpenBLAS alone (HP_GEMM=openblas), -1: not decided
 * yet (HP_GEMM is read on the first call; a race only repeats the same
 * decision). */
static int gemm_mode = -1;

static int sgemm_mode(void)
{
	int mode = __atomic_load_n(&gemm_mode, __ATOMIC_RELAXED);

	if (mode < 0) {
		const char *s = getenv("HP_GEMM");

		mode = !(s && !strcmp(s, "openblas"));
		/* The products left to OpenBLAS are small; OpenBLAS's own
		 * threading changes their rounding with the thread count, hp's
		 * row split does not.  One OpenBLAS thread keeps a run's numbers
		 * independent of HP_NUM_THREADS/OPENBLAS_NUM_THREADS.  With
		 * HP_GEMM=openblas OpenBLAS keeps its threads (and that
		 * dependence), as a user asking for OpenBLAS expects. */
		if (mode)
			openblas_set_num_threads(1);
		__atomic_store_n(&gemm_mode, mode, __ATOMIC_RELAXED);
	}
	return mode;
}

const char *hp_sgemm_path(void)
{
	return sgemm_mode() ? hp_cpu_level_name(hp_cpu_level()) : "openblas";
}

/* ---- threads (pool.h) ---- */

struct gemm_job {
	int level, transA, transB, M, N, K, lda, ldb, ldc;
	float alpha, beta;
	const float *A, *B;
	float *C;
};

/* Below this many multiply-adds a product runs on the calling thread:
 * waking the workers costs tens of microseconds. */
#define HP_GEMM_MIN_THREADED_MNK (1L << 23)

/* Rows [m0, m1) of C: part `part` of `nparts`, in whole micro-panels. */
static void run_part(void *p, int part, int nparts)
{
	const struct gemm_job *j = p;
	long per = ((long)j->M + nparts - 1) / nparts;
	long m0, m1;

	per = (per + HP_GEMM_ROW_UNIT - 1) / HP_GEMM_ROW_UNIT * HP_GEMM_ROW_UNIT;
	m0 = part * per;
	m1 = m0 + per < j->M ? m0 + per : j->M;
	if (m0 >= m1)
		return;
	const float *A = j->transA ? j->A + m0 : j->A + m0 * j->lda;
	float *C = j->C + m0 * j->ldc;
	if (hp_sgemm_level(j->level, j->transA, j->transB, (int)(m1 - m0), j->N, j->K, j->alpha, A, j->lda,
			    j->B, j->ldb, j->beta, C, j->ldc))
		hp_sgemm_openblas(j->transA, j->transB, (int)(m1 - m0), j->N, j->K, j->alpha, A, j->lda,
				  j->B, j->ldb, j->beta, C, j->ldc);
}

int hp_sgemm_threads(void)
{
	return hp_pool_threads();
}

void hp_sgemm(int transA, int transB, int M, int N, int K, float alpha,
	      const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
	if (sgemm_mode() && M >= HP_SGEMM_MIN_M && N >= HP_SGEMM_MIN_N && K >= HP_SGEMM_MIN_K &&
	    (long)M * N * K >= HP_SGEMM_MIN_MNK) {
		int level = hp_cpu_level();

		if ((long)M * N * K >= HP_GEMM_MIN_THREADED_MNK && M >= 4 * HP_GEMM_ROW_UNIT) {
			struct gemm_job j = { level, transA, transB, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C };

			if (!hp_pool_run(run_part, &j))
				return;
		}
		if (!hp_sgemm_level(level, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
			return;
	}
	hp_sgemm_openblas(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
