/*
 * gemm-bench.c - GFLOP/s of hp's SGEMM at each instruction-set level this
 * CPU has against OpenBLAS's cblas_sgemm, on the shapes hp's training runs,
 * one thread.
 *
 * Built by make as build/bench/gemm-bench; `make bench` runs it.
 *   build/bench/gemm-bench [--smoke]
 *
 * Each shape is timed as the best of 5 runs (each run repeats the product
 * until it has taken at least 50 ms), after one untimed warm-up call; the
 * same inputs go to every path.  Columns: OpenBLAS (one thread), hp's
 * kernels forced at each level (hp_sgemm_level: whatever the size, so small
 * shapes show what the dispatch thresholds avoid), the ratio of the CPU's
 * own level to OpenBLAS, and the max |difference| between hp's result and
 * OpenBLAS's, so that a fast wrong answer shows.  OPENBLAS_CORETYPE is left
 * as the environment sets it and printed.  Below the table: the core's
 * multiply-add peak at each level (peak_gflops) and the geometric mean of
 * hp's big training shapes as a share of it.  --smoke: every shape at 1/8 of
 * its sizes (at least 1), one call each, nothing timed worth reading: it
 * proves the benchmark still runs (t/t1300).  Not a test: it checks nothing.
 */
#include <cblas.h>
#include <math.h>
#include <time.h>

#include "base/alloc.h"
#include "cpu/gemm.h"
#include "cpu/isa.h"

struct shape {
	const char *what;
	int ta, tb, M, N, K;
	float beta;
};

static const struct shape shapes[] = {
	{ "fwd q/o/lm_head", 0, 1, 2048, 512, 512, 0 },
	{ "fwd k/v", 0, 1, 2048, 256, 512, 0 },
	{ "fwd gate/up", 0, 1, 2048, 1376, 512, 0 },
	{ "fwd down", 0, 1, 2048, 512, 1376, 0 },
	{ "bwd dx q/o", 0, 0, 2048, 512, 512, 0 },
	{ "bwd dx gate/up", 0, 0, 2048, 512, 1376, 0 },
	{ "bwd dx down", 0, 0, 2048, 1376, 512, 0 },
	{ "bwd dx k/v", 0, 0, 2048, 512, 256, 0 },
	{ "bwd dW q/o", 1, 0, 512, 512, 2048, 1 },
	{ "bwd dW k/v", 1, 0, 256, 512, 2048, 1 },
	{ "bwd dW gate/up", 1, 0, 1376, 512, 2048, 1 },
	{ "bwd dW down", 1, 0, 512, 1376, 2048, 1 },
	{ "attn S=QK^T", 0, 1, 64, 256, 64, 0 },
	{ "attn O=PV", 0, 0, 64, 64, 256, 0 },
	{ "attn S small", 0, 1, 64, 128, 64, 0 },
	{ "attn K=8", 0, 1, 64, 256, 8, 0 },
	{ "small fwd", 0, 1, 2048, 64, 64, 0 },
	{ "small fwd up", 0, 1, 2048, 172, 64, 0 },
	{ "small fwd down", 0, 1, 2048, 64, 172, 0 },
	{ "small dx", 0, 0, 2048, 64, 172, 0 },
	{ "small dW", 1, 0, 172, 64, 2048, 1 },
	{ "small lm_head", 0, 1, 2048, 512, 64, 0 },
	{ "small dW lm", 1, 0, 512, 64, 2048, 1 },
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* path -1: OpenBLAS, else hp's kernels at that level */
static void run(int path, const struct shape *s, const float *A, const float *B, float *C)
{
	int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;

	if (path < 0)
		hp_sgemm_openblas(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, s->beta, C, s->N);
	else
		hp_sgemm_level(path, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, s->beta, C, s->N);
}

/* GFLOP/s of once(ctx) (which returns the FLOPs it did): the best of 5
 * runs, each repeating it until it has taken at least 50 ms, after one
 * untimed call; one timed call in smoke mode.  The GEMM shapes and the
 * peak loops are timed alike. */
static double best_gflops(double (*once)(void *), void *ctx, int smoke)
{
	double best = 0;

	once(ctx);
	for (int r = 0; r < (smoke ? 1 : 5); r++) {
		double flop = 0, t0 = now(), t;

		do
			flop += once(ctx);
		while ((t = now() - t0) < (smoke ? 0 : 0.05));
		if (flop / t > best)
			best = flop / t;
	}
	return best * 1e-9;
}

struct gemm_call { int path; const struct shape *s; const float *A, *B; float *C; };

static double gemm_once(void *p)
{
	const struct gemm_call *g = p;

	run(g->path, g->s, g->A, g->B, g->C);
	return 2.0 * g->s->M * g->s->N * g->s->K;
}

static double gflops(int path, const struct shape *s, const float *A, const float *B, float *C, int smoke)
{
	struct gemm_call g = { path, s, A, B, C };

	return best_gflops(gemm_once, &g, smoke);
}

/*
 * The multiply-add peak of one core at a level: 12 independent chains of
 * a = a * x + y on registers, no memory, enough chains to keep two pipes'
 * latency covered; 2 FLOPs per lane per multiply-add.  No GEMM at that
 * level can pass it on this core, so it is the yardstick for the kernels
 * and for a training step's FLOP/s (bench/run.sh).  baseline: SSE, a
 * multiply and an add apart, as its kernel does (-ffp-contract=off).
 * The sum of the lanes goes to peak_sink (volatile), so that the loop is
 * not removed; the chains converge to y / (1 - x) = 1: no overflow, no
 * denormals.
 */
static volatile double peak_sink;

#define PEAK_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

#if defined(__x86_64__)
#include <immintrin.h>

/* one level's loop over PV (the vector type), PSET1, PFMA and PADD */
#define PEAK_LOOP(LANES)								\
	PV x = PSET1(0.999f), y = PSET1(0.001f);					\
	PEAK_CHAINS(PEAK_DECL)								\
	for (long k = 0; k < n; k++) {							\
		PEAK_CHAINS(PEAK_STEP)							\
	}										\
	PV t = PSET1(0.0f);								\
	PEAK_CHAINS(PEAK_SUM)								\
	float l[LANES];									\
	memcpy(l, &t, sizeof(l));							\
	for (int i = 0; i < LANES; i++)							\
		peak_sink += l[i];							\
	return 2.0 * LANES * 12 * n;
#define PEAK_DECL(i) PV a##i = PSET1((float)(i));
#define PEAK_STEP(i) a##i = PFMA(a##i, x, y);
#define PEAK_SUM(i) t = PADD(t, a##i);

#define PV __m128
#define PSET1 _mm_set1_ps
#define PFMA(a, x, y) _mm_add_ps(_mm_mul_ps(a, x), y)
#define PADD _mm_add_ps
static double peak_baseline(long n)
{
	PEAK_LOOP(4)
}
#undef PV
#undef PSET1
#undef PFMA
#undef PADD

#define PV __m256
#define PSET1 _mm256_set1_ps
#define PFMA _mm256_fmadd_ps
#define PADD _mm256_add_ps
__attribute__((target("avx2,fma"))) static double peak_avx2(long n)
{
	PEAK_LOOP(8)
}
#undef PV
#undef PSET1
#undef PFMA
#undef PADD

#define PV __m512
#define PSET1 _mm512_set1_ps
#define PFMA _mm512_fmadd_ps
#define PADD _mm512_add_ps
__attribute__((target("avx512f,avx512vl,fma"))) static double peak_avx512(long n)
{
	PEAK_LOOP(16)
}
#undef PV
#undef PSET1
#undef PFMA
#undef PADD

/* one call of a level's peak loop, n iterations */
struct peak_call { double (*fn)(long); long n; };

static double peak_once(void *p)
{
	const struct peak_call *c = p;

	return c->fn(c->n);
}
#endif

/* GFLOP/s of the level's peak loop; 0 where this build has no such loop
 * (not x86-64). */
static double peak_gflops(int level, int smoke)
{
#if defined(__x86_64__)
	struct peak_call c = { level == HP_CPU_AVX512 ? peak_avx512 : level == HP_CPU_AVX2 ? peak_avx2 : peak_baseline,
			       smoke ? 1000 : 1000000 };

	return best_gflops(peak_once, &c, smoke);
#else
	(void)level;
	(void)smoke;
	return 0;
#endif
}

int main(int argc, char **argv)
{
	const char *ct = getenv("OPENBLAS_CORETYPE");
	int smoke = argc > 1 && !strcmp(argv[1], "--smoke"), max = hp_cpu_level_max();
	size_t cap = (size_t)2048 * 2048;
	float *A = hp_malloc_aligned(cap * sizeof(float)), *B = hp_malloc_aligned(cap * sizeof(float));
	float *C = hp_malloc_aligned(cap * sizeof(float)), *C2 = hp_malloc_aligned(cap * sizeof(float));
	double lsum[HP_CPU_AVX512 + 1] = { 0 }, lg[HP_CPU_AVX512 + 1] = { 0 }, n = 0;

	if (argc > 2 || (argc == 2 && !smoke)) {
		fprintf(stderr, "usage: gemm-bench [--smoke]\n");
		return 2;
	}
	if (!A || !B || !C || !C2)
		return 1;
	for (size_t i = 0; i < cap; i++) {
		A[i] = (float)((i * 7919 % 1000) / 500.0 - 1.0);
		B[i] = (float)((i * 104729 % 997) / 498.5 - 1.0);
	}
	/* one call first: sets OpenBLAS to one thread before anything is timed */
	hp_sgemm_openblas(0, 0, 1, 1, 1, 1.0f, A, 1, B, 1, 0.0f, C, 1);
	printf("GFLOP/s, 1 thread%s; CPU level %s; OPENBLAS_CORETYPE=%s\n", smoke ? " (smoke: 1/8 sizes, untimed)" : "",
	       hp_cpu_level_name(max), ct ? ct : "unset");
	printf("%-16s %2s %2s %5s %5s %5s %4s %9s", "shape", "tA", "tB", "M", "N", "K", "beta", "openblas");
	for (int l = 0; l <= max; l++)
		printf(" %9s", hp_cpu_level_name(l));
	printf(" %6s %8s\n", "ratio", "maxdiff");
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		struct shape s = shapes[i];
		size_t nc;
		double maxd = 0, go, g[HP_CPU_AVX512 + 1];

		if (smoke) {
			s.M = (s.M + 7) / 8;
			s.N = (s.N + 7) / 8;
			s.K = (s.K + 7) / 8;
		}
		nc = (size_t)s.M * s.N;
		memset(C, 0, nc * sizeof(float));
		memset(C2, 0, nc * sizeof(float));
		run(-1, &s, A, B, C);
		run(max, &s, A, B, C2);
		for (size_t j = 0; j < nc; j++)
			if (fabs((double)C[j] - C2[j]) > maxd)
				maxd = fabs((double)C[j] - C2[j]);
		go = gflops(-1, &s, A, B, C, smoke);
		printf("%-16s %2d %2d %5d %5d %5d %4g %9.1f", s.what, s.ta, s.tb, s.M, s.N, s.K, s.beta, go);
		for (int l = 0; l <= max; l++)
			printf(" %9.1f", g[l] = gflops(l, &s, A, B, C, smoke));
		printf(" %5.2fx %8.1e\n", g[max] / go, maxd);
		if (shapes[i].M >= 256 && shapes[i].N >= 256 && shapes[i].K >= 256) {
			for (int l = 0; l <= max; l++) {
				lsum[l] += log(g[l] / go);
				lg[l] += log(g[l]);
			}
			n++;
		}
	}
	printf("geometric-mean ratio to openblas over the big training shapes (M, N, K >= 256):");
	for (int l = 0; l <= max; l++)
		printf(" %s %.2fx", hp_cpu_level_name(l), exp(lsum[l] / n));
	printf("\n");
	printf("multiply-add peak of one core (registers only), and hp's big training shapes (geometric mean) as a share of it:\n");
	for (int l = 0; l <= max; l++) {
		double pk = peak_gflops(l, smoke), gm = exp(lg[l] / n);

		if (pk > 0)
			printf("  %-8s peak %6.1f GFLOP/s, big shapes %6.1f GFLOP/s = %3.0f%%\n", hp_cpu_level_name(l), pk,
			       gm, 100 * gm / pk);
	}
	hp_free_aligned(A);
	hp_free_aligned(B);
	hp_free_aligned(C);
	hp_free_aligned(C2);
	return 0;
}
