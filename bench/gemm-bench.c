/*
 * gemm-bench.c - GFLOP/s of hp_sgemm against OpenBLAS's cblas_sgemm on the
 * shapes hp's training runs, single thread.
 *
 * Build and run (from the source root):
 *   gcc -O2 -std=gnu11 -include lib/compat.h -Ilib -Ikernels -o /tmp/gemm-bench \
 *       bench/gemm-bench.c kernels/cpu/gemm.c lib/alloc.c -lopenblas
 *   OPENBLAS_NUM_THREADS=1 /tmp/gemm-bench
 *
 * Each shape is timed as the best of 5 runs (each run repeats the product
 * until it has taken at least 50 ms), after one untimed warm-up call; the
 * same inputs go to both, and the max |difference| between their results is
 * printed so a fast wrong answer shows.  hp is hp_sgemm as training calls it
 * (its threshold may send small shapes to OpenBLAS: the "path" column says
 * which).  OPENBLAS_CORETYPE is left as the environment sets it and printed.
 * Not a test: it checks nothing.
 */
#include <cblas.h>
#include <math.h>
#include <time.h>

#include "alloc.h"
#include "cpu/gemm.h"

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

typedef void (*gemm_fn)(int, int, int, int, int, float, const float *, int, const float *, int,
			float, float *, int);

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double gflops(gemm_fn f, const struct shape *s, const float *A, const float *B, float *C)
{
	int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
	double flop = 2.0 * s->M * s->N * s->K, best = 0;

	f(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, s->beta, C, s->N);
	for (int run = 0; run < 5; run++) {
		long reps = 0;
		double t0 = now(), t;

		do {
			f(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, s->beta, C, s->N);
			reps++;
		} while ((t = now() - t0) < 0.05);
		if (flop * reps / t > best)
			best = flop * reps / t;
	}
	return best * 1e-9;
}

int main(void)
{
	const char *ct = getenv("OPENBLAS_CORETYPE");
	size_t cap = (size_t)2048 * 2048;
	float *A = hp_malloc_aligned(cap * sizeof(float)), *B = hp_malloc_aligned(cap * sizeof(float));
	float *C = hp_malloc_aligned(cap * sizeof(float)), *C2 = hp_malloc_aligned(cap * sizeof(float));
	double lsum = 0, n = 0;

	if (!A || !B || !C || !C2)
		return 1;
	for (size_t i = 0; i < cap; i++) {
		A[i] = (float)((i * 7919 % 1000) / 500.0 - 1.0);
		B[i] = (float)((i * 104729 % 997) / 498.5 - 1.0);
	}
	printf("hp_sgemm vs cblas_sgemm, 1 thread; OPENBLAS_CORETYPE=%s; hp path: %s\n",
	       ct ? ct : "unset", hp_sgemm_path());
	printf("%-16s %2s %2s %5s %5s %5s %4s %9s %9s %6s %8s\n", "shape", "tA", "tB", "M", "N", "K",
	       "beta", "openblas", "hp", "ratio", "maxdiff");
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		const struct shape *s = &shapes[i];
		size_t nc = (size_t)s->M * s->N;
		double maxd = 0;

		memset(C, 0, nc * sizeof(float));
		memset(C2, 0, nc * sizeof(float));
		hp_sgemm_openblas(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, s->ta ? s->M : s->K,
				  B, s->tb ? s->K : s->N, 0.0f, C, s->N);
		hp_sgemm(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, s->ta ? s->M : s->K,
			 B, s->tb ? s->K : s->N, 0.0f, C2, s->N);
		for (size_t j = 0; j < nc; j++)
			if (fabs((double)C[j] - C2[j]) > maxd)
				maxd = fabs((double)C[j] - C2[j]);
		double go = gflops(hp_sgemm_openblas, s, A, B, C);
		double gh = gflops(hp_sgemm, s, A, B, C);
		printf("%-16s %2d %2d %5d %5d %5d %4g %9.1f %9.1f %5.2fx %8.1e\n", s->what, s->ta, s->tb,
		       s->M, s->N, s->K, s->beta, go, gh, gh / go, maxd);
		if (s->M >= 256 && s->N >= 256 && s->K >= 256) {
			lsum += log(gh / go);
			n++;
		}
	}
	printf("geometric-mean ratio over the big training shapes (M, N, K >= 256): %.2fx\n",
	       exp(lsum / n));
	hp_free_aligned(A);
	hp_free_aligned(B);
	hp_free_aligned(C);
	hp_free_aligned(C2);
	return 0;
}
