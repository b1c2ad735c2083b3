/*
 * test-gemm.c - hp_sgemm (kernels/cpu/gemm.c) against a double-precision
 * loop, for every path this machine has.
 *
 * For each awkward shape (1x1x1, sizes that are not multiples of the 12 x 32
 * tile, K = 1, K across several K blocks, N across several N blocks, M
 * across several M blocks), each of the four trans cases, alpha in {1, 0.5}
 * and beta in {0, 1, -0.25}, and leading dimensions at and above the
 * minimum, hp's kernels at every level this machine has (forced whatever
 * the size) and the OpenBLAS path are compared with
 *   C_ref = alpha * sum_k op(A)[i,k] op(B)[k,j] (in double) + beta * C0.
 * Tolerance: |C - C_ref| <= 1e-5 * K * max|a| * max|b| * |alpha|
 * + 1e-6 * |beta| * max|C0|: a float dot product of length K has a
 * rounding error of order K * 2^-24 * max|a| * max|b| at worst and about
 * sqrt(K) times that in practice, so 1e-5 K leaves room for any summation
 * order while an indexing or edge bug (an error of order max|a| max|b|)
 * fails even at K = 1.  The columns of C between N and ldc must be left
 * alone, and beta = 0 must not read C (C is filled with NaN first).
 *
 * Then the bit-level promises of gemm.h: avx2 and avx512 give the same bits
 * on every shape (when the machine has both), and hp_sgemm gives the same
 * bits at 1, 2 and 3 threads at each level (children with HP_CPU and
 * HP_NUM_THREADS set, the thread count being read once per process).
 */
#include <sys/mman.h>
#include <math.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "cpu/gemm.h"
#include "cpu/isa.h"
#include "tap.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
	/* xorshift64*: deterministic, good enough for test data */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (float)((rng_state * 0x2545f4914f6cdd1dull) >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}

static float *rnd(size_t n)
{
	float *p = malloc((n ? n : 1) * sizeof(float));

	for (size_t i = 0; i < n; i++)
		p[i] = frand();
	return p;
}

typedef void (*gemm_fn)(int, int, int, int, int, float, const float *, int, const float *, int,
			float, float *, int);

/* hp_sgemm_level at run_level as a gemm_fn; records a refusal in refused. */
static int refused, run_level;
static void run_at_level(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
			 const float *B, int ldb, float beta, float *C, int ldc)
{
	if (hp_sgemm_level(run_level, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
		refused = 1;
}

static float fmaxabs(const float *p, size_t n)
{
	float m = 0;

	for (size_t i = 0; i < n; i++)
		m = fabsf(p[i]) > m ? fabsf(p[i]) : m;
	return m;
}

/* All alpha/beta combinations of one shape, trans case and padding through
 * f; returns 1 when every one is within tolerance. */
static int check(gemm_fn f, int ta, int tb, int M, int N, int K, int pad, double *worst)
{
	static const float alphas[] = { 1.0f, 0.5f }, betas[] = { 0.0f, 1.0f, -0.25f };
	int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
	size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
	float *A = rnd(na), *B = rnd(nb), *C0 = rnd(nc), *C = malloc((nc ? nc : 1) * sizeof(float));
	double *ab = malloc(((size_t)M * N + 1) * sizeof(double));
	float maxa = fmaxabs(A, na), maxb = fmaxabs(B, nb), maxc = fmaxabs(C0, nc);
	int good = 1;

	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double s = 0;
			for (int k = 0; k < K; k++)
				s += (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
				     (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
			ab[(size_t)i * N + j] = s;
		}
	for (int ai = 0; ai < 2; ai++)
		for (int bi = 0; bi < 3; bi++) {
			float alpha = alphas[ai], beta = betas[bi];
			double tol = 1e-5 * K * maxa * maxb * fabs(alpha) + 1e-6 * fabs(beta) * maxc;

			/* beta == 0: C is write-only, so NaN in it must not matter */
			for (size_t i = 0; i < nc; i++)
				C[i] = beta == 0.0f ? NAN : C0[i];
			f(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
			for (int i = 0; i < M; i++) {
				for (int j = 0; j < N; j++) {
					size_t ic = (size_t)i * ldc + j;
					double want = alpha * ab[(size_t)i * N + j] +
						      (beta == 0.0f ? 0.0 : (double)beta * C0[ic]);
					double d = fabs(C[ic] - want);

					if (!(d <= tol)) {
						if (good)
							tap_diag("  alpha %g beta %g: C[%d,%d] = %g, want %g (tol %.2g)",
								 alpha, beta, i, j, C[ic], want, tol);
						good = 0;
					}
					if (tol > 0 && d / tol > *worst)
						*worst = d / tol;
				}
				/* the padding columns of C are not part of C */
				for (int j = N; j < ldc; j++) {
					size_t ic = (size_t)i * ldc + j;
					int same = beta == 0.0f ? isnan(C[ic]) : C[ic] == C0[ic];

					if (!same) {
						if (good)
							tap_diag("  alpha %g beta %g: C[%d,%d] past N written",
								 alpha, beta, i, j);
						good = 0;
					}
				}
			}
		}
	free(A);
	free(B);
	free(C0);
	free(C);
	free(ab);
	return good;
}

static const struct { int M, N, K; } shapes[] = {
	{ 1, 1, 1 },       /* smallest */
	{ 7, 13, 5 },      /* below one tile */
	{ 12, 32, 16 },    /* exactly one tile */
	{ 13, 33, 17 },    /* one past a tile each way */
	{ 33, 65, 17 },
	{ 25, 31, 1 },     /* K = 1 */
	{ 1, 100, 40 },    /* one row */
	{ 100, 1, 40 },    /* one column */
	{ 130, 47, 513 },  /* three K blocks, ragged */
	{ 301, 70, 40 },   /* three M blocks */
	{ 20, 2100, 24 },  /* two N blocks */
	{ 64, 256, 64 },   /* attention scores */
	{ 64, 64, 8 },     /* tiny head_dim */
};

/* In a new thread (so a new packing buffer) whose allocation fails:
 * hp's kernels refuse, and hp_sgemm still gives the right answer. */
struct nomem { int refused, right; };

static void *nomem_thread(void *arg)
{
	struct nomem *r = arg;
	int M = 100, N = 100, K = 100;
	float *A = rnd((size_t)M * K), *B = rnd((size_t)K * N);
	float *C1 = malloc((size_t)M * N * sizeof(float)), *C2 = malloc((size_t)M * N * sizeof(float));

	hp_alloc_fail_at(1);
	r->refused = hp_sgemm_level(hp_cpu_level(), 0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C1, N) == -1;
	hp_alloc_fail_at(1);
	hp_sgemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C1, N);
	hp_alloc_fail_at(0);
	hp_sgemm_openblas(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C2, N);
	r->right = !memcmp(C1, C2, (size_t)M * N * sizeof(float));
	free(A);
	free(B);
	free(C1);
	free(C2);
	return NULL;
}

/* HP_GEMM=openblas is read once, so it is checked in a child that sets it
 * before its first call. */
static int path_with_env_openblas(void)
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return -1;
	if (pid == 0) {
		setenv("HP_GEMM", "openblas", 1);
		_exit(strcmp(hp_sgemm_path(), "openblas") ? 1 : 0);
	}
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Every level against every other on every shape and trans case, alpha
 * and beta as in check(): 1 when avx2 and avx512 agree bit for bit. */
static int same_bits_avx2_avx512(int *shapes_checked)
{
	int same = 1;

	*shapes_checked = 0;
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
		for (int t = 0; t < 4; t++)
			for (int bi = 0; bi < 2; bi++) {
				int ta = t >> 1, tb = t & 1, M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
				size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
				float *A = rnd(na), *B = rnd(nb), *C0 = rnd(nc);
				float *C1 = malloc(nc * sizeof(float)), *C2 = malloc(nc * sizeof(float));
				float beta = bi ? -0.25f : 0.0f;

				memcpy(C1, C0, nc * sizeof(float));
				memcpy(C2, C0, nc * sizeof(float));
				if (hp_sgemm_level(HP_CPU_AVX2, ta, tb, M, N, K, 0.5f, A, ta ? M : K, B, tb ? K : N,
						   beta, C1, N) ||
				    hp_sgemm_level(HP_CPU_AVX512, ta, tb, M, N, K, 0.5f, A, ta ? M : K, B, tb ? K : N,
						   beta, C2, N) ||
				    memcmp(C1, C2, nc * sizeof(float))) {
					if (same)
						tap_diag("  avx2 and avx512 differ: %s%s %dx%dx%d beta %g",
							 ta ? "A^T" : "A", tb ? "B^T" : "B", M, N, K, beta);
					same = 0;
				}
				(*shapes_checked)++;
				free(A);
				free(B);
				free(C0);
				free(C1);
				free(C2);
			}
	return same;
}

/* hp_sgemm's bits at HP_CPU=level and HP_NUM_THREADS=threads, in a child
 * (the pool's size is read once per process): the four trans cases of a
 * product large enough for the thread pool, written to out[4 * M * N].
 * Returns 0, or -1 when the child failed or ran another level. */
#define TI_M 300
#define TI_N 200
#define TI_K 600
struct ti_run { int level, threads; float *out; };

static int ti_child(void *p)
{
	const struct ti_run *r = p;

	rng_state = 0x243f6a8885a308d3ull;
	float *A = rnd((size_t)TI_M * TI_K), *B = rnd((size_t)TI_K * TI_N);
	for (int t = 0; t < 4; t++)
		hp_sgemm(t >> 1, t & 1, TI_M, TI_N, TI_K, 1.0f, A, t >> 1 ? TI_M : TI_K, B,
			 t & 1 ? TI_K : TI_N, 0.0f, r->out + (size_t)t * TI_M * TI_N, TI_N);
	return !(hp_sgemm_threads() == r->threads && !strcmp(hp_sgemm_path(), hp_cpu_level_name(r->level)));
}

static int threaded_run(int level, int threads, float *out)
{
	struct ti_run r = { level, threads, out };

	return tap_child(threads, hp_cpu_level_name(level), ti_child, &r);
}

int main(void)
{
	const char *env = getenv("HP_GEMM");
	int forced = env && !strcmp(env, "openblas");
	int max = hp_cpu_level_max(), level = hp_cpu_level();
	/* before anything reads HP_GEMM in this process */
	int child = path_with_env_openblas();
	const char *path = hp_sgemm_path();

	tap_diag("CPU level %s, in use %s; hp_sgemm path: %s%s", hp_cpu_level_name(max),
		 hp_cpu_level_name(level), path, forced ? " (HP_GEMM=openblas)" : "");
	ok(!strcmp(path, forced ? "openblas" : hp_cpu_level_name(level)), "hp_sgemm_path() is '%s'", path);
	ok(child == 0, "HP_GEMM=openblas selects the openblas path");

	for (int p = 0; p <= HP_CPU_AVX512 + 1; p++) {
		const char *name = p <= HP_CPU_AVX512 ? hp_cpu_level_name(p) : "openblas";

		for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
			int M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;

			for (int t = 0; t < 4; t++) {
				double worst = 0;
				int good = 1;

				if (p <= HP_CPU_AVX512 && p > max) {
					tap_skip("the CPU lacks it", "%s: %s%s %dx%dx%d", name, t >> 1 ? "A^T" : "A",
						 t & 1 ? "B^T" : "B", M, N, K);
					continue;
				}
				refused = 0;
				run_level = p;
				for (int pad = 0; pad <= 3; pad += 3)
					good &= check(p <= HP_CPU_AVX512 ? run_at_level : hp_sgemm_openblas,
						      t >> 1, t & 1, M, N, K, pad, &worst);
				ok(good && !refused, "%s: %s%s %dx%dx%d (worst %.2g of tol)",
				   name, t >> 1 ? "A^T" : "A", t & 1 ? "B^T" : "B", M, N, K, worst);
			}
		}
	}

	if (max >= HP_CPU_AVX512) {
		int n = 0;
		ok(same_bits_avx2_avx512(&n), "avx2 and avx512 give the same bits (%d products)", n);
	} else {
		tap_skip("no AVX-512 on this CPU", "avx2 and avx512 give the same bits");
	}
	ok(hp_sgemm_level(max + 1, 0, 0, 1, 1, 1, 1.0f, (float[]){ 1 }, 1, (float[]){ 1 }, 1, 0.0f,
			  (float[]){ 0 }, 1) == -1,
	   "a level above the CPU's is refused");

	/* Thread-count invariance of hp_sgemm, per level. */
	{
		size_t n = (size_t)4 * TI_M * TI_N;
		float *sh = mmap(NULL, 3 * n * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

		for (int l = HP_CPU_BASELINE; l <= HP_CPU_AVX512; l++) {
			int good = sh != MAP_FAILED;

			if (l > max) {
				tap_skip("the CPU lacks it", "%s: hp_sgemm gives the same bits at 1, 2 and 3 threads",
					 hp_cpu_level_name(l));
				continue;
			}
			for (int t = 1; good && t <= 3; t++)
				good = !threaded_run(l, t, sh + (t - 1) * n);
			good = good && !memcmp(sh, sh + n, n * sizeof(float)) &&
			       !memcmp(sh, sh + 2 * n, n * sizeof(float));
			ok(good, "%s: hp_sgemm gives the same bits at 1, 2 and 3 threads (%dx%dx%d, 4 trans cases)",
			   hp_cpu_level_name(l), TI_M, TI_N, TI_K);
		}
		if (sh != MAP_FAILED)
			munmap(sh, 3 * n * sizeof(float));
	}

	/* The dispatcher on a shape big enough for the fast path. */
	{
		int M = 200, N = 150, K = 300;
		float *A = rnd((size_t)M * K), *B = rnd((size_t)K * N);
		float *C1 = malloc((size_t)M * N * sizeof(float)), *C2 = malloc((size_t)M * N * sizeof(float));
		double d = 0;

		hp_sgemm(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C1, N);
		hp_sgemm_openblas(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C2, N);
		for (int i = 0; i < M * N; i++)
			d = fabs((double)C1[i] - C2[i]) > d ? fabs((double)C1[i] - C2[i]) : d;
		ok(d <= 1e-5 * K, "hp_sgemm agrees with OpenBLAS on %dx%dx%d (max |diff| %.2g)", M, N, K, d);
		free(A);
		free(B);
		free(C1);
		free(C2);
	}

	{
		float x[4] = { 0 };
		struct nomem r = { 0, 0 };
		pthread_t th;

		if (pthread_create(&th, NULL, nomem_thread, &r) || pthread_join(th, NULL))
			r.refused = r.right = 0;
		ok(r.refused, "hp's kernels refuse when their buffer cannot be allocated");
		ok(r.right, "... and hp_sgemm then falls back to OpenBLAS, same result bit for bit");

		ok(hp_sgemm_level(level, 0, 0, 2, 2, 2, 1.0f, x, 1, x, 2, 0.0f, x, 2) == -1,
		   "hp's kernels refuse lda < K");
		ok(hp_sgemm_level(level, 0, 0, -1, 2, 2, 1.0f, x, 2, x, 2, 0.0f, x, 2) == -1,
		   "hp's kernels refuse M < 0");
	}
	return tap_done();
}
