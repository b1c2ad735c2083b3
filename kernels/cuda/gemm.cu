/*
 * gemm.cu - the one GEMM the linear layers (linear.cu) are made of, through
 * cuBLASLt: D = op(A) op(B) + beta C, column-major, bf16 A and B, fp32
 * accumulation (CUBLAS_COMPUTE_32F) and fp32 C = D, on hp_cu_stream with
 * one 32 MiB workspace.  What it is not: a grouped or batched GEMM (the
 * experts run one call each, from the backend's loop over them), nor the
 * row-major bookkeeping (linear.cu).  Under t/cuemu, t/cuemu/stubs.cpp
 * stands in for this file.
 *
 * cuBLASLt is opened (dlopen) by hp_cu_gemm_init, when a CUDA backend
 * starts, not linked: loading it runs initialisers that leave about 200 MB
 * resident in every process, which a CPU run must not pay (hp-train(1),
 * "Memory").  hp_cu_lt_open resolves every function this file calls, so a
 * test can check the table on a machine without a GPU.
 *
 * Determinism: cuBLASLt gives the same bits for the same algorithm on the
 * same GPU, and its split-K reductions are ordered (the in-place scheme uses
 * counters for sequentiality, the others a separate reduction pass); the
 * algorithm is chosen once per shape and cached, so a shape always runs the
 * same one.
 *
 * The descriptors live by value in a small table (cuBLASLt's *Init calls on
 * its semi-opaque structs allocate nothing), keyed by the whole problem
 * including the pointers' alignment, which the heuristic depends on.  Not
 * thread-safe: the backend is driven by one host thread.
 */
#include <stdio.h>
#include <string.h>

#include <cublasLt.h>

#include "cuda/common.cuh"

#define WS_BYTES (32u << 20)
#define NCACHE 256

/* no padding: keys compare with memcmp */
struct mm_key {
	uint64_t m, n, k;
	int64_t lda, ldb, ldc;
	int ta, tb;                     /* transposes */
	unsigned al_a, al_b, al_c;      /* pointer alignments in bytes, <= 256 */
	int pad_;                       /* 0: the key's size a multiple of 8 */
};
static_assert(sizeof(struct mm_key) == 6 * 8 + 6 * 4, "mm_key must have no padding");

struct mm_entry {
	struct mm_key key;
	cublasLtMatmulDescOpaque_t op;
	cublasLtMatrixLayoutOpaque_t a, b, c;
	cublasLtMatmulAlgo_t algo;
	size_t ws;
};

/* the functions this file calls, by their names in libcublasLt */
#define LT_FUNCS(X) \
	X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetStatusString) X(cublasLtMatmul) \
	X(cublasLtMatmulDescInit_internal) X(cublasLtMatmulDescSetAttribute) \
	X(cublasLtMatrixLayoutInit_internal) X(cublasLtMatmulPreferenceInit_internal) \
	X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulAlgoGetHeuristic)

static struct {
#define X(f) decltype(&::f) f;
	LT_FUNCS(X)
#undef X
} L;

#define STR_(x) #x
#define STR(x) STR_(x)
#ifndef HP_CUDA_LIBDIR
#define HP_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

extern "C" int hp_cu_lt_open(struct hp_err *e)
{
	static const char *const names[] = { "libcublasLt.so." STR(CUBLAS_VER_MAJOR),
					     HP_CUDA_LIBDIR "/libcublasLt.so." STR(CUBLAS_VER_MAJOR) };
	static const struct hp_cu_sym syms[] = {
#define X(f) { #f, (void **)&L.f },
		LT_FUNCS(X)
#undef X
	};

	return hp_cu_dlopen(names, 2, syms, (int)(sizeof(syms) / sizeof(syms[0])), e);
}

static cublasLtHandle_t lt;
static void *ws;
static struct mm_entry cache[NCACHE];
static int ncache, next_evict;

extern "C" int hp_cu_gemm_init(struct hp_err *e)
{
	int orc = hp_cu_lt_open(e);

	if (orc)
		return orc;
	cublasStatus_t st = L.cublasLtCreate(&lt);

	if (st != CUBLAS_STATUS_SUCCESS)
		return hp_err_set(e, HP_ECUDA, "cublasLtCreate: %s", L.cublasLtGetStatusString(st));
	cudaError_t rc = cudaMalloc(&ws, WS_BYTES);
	if (rc != cudaSuccess) {
		L.cublasLtDestroy(lt);
		lt = NULL;
		return hp_err_set(e, HP_ECUDA, "cuBLASLt workspace: %s", cudaGetErrorString(rc));
	}
	ncache = next_evict = 0;
	return 0;
}

extern "C" void hp_cu_gemm_fini(void)
{
	if (lt)
		L.cublasLtDestroy(lt);
	cudaFree(ws);
	lt = NULL;
	ws = NULL;
	ncache = next_evict = 0;
}

static unsigned align_of(const void *p)
{
	uintptr_t a = (uintptr_t)p;

	a &= ~a + 1;                    /* lowest set bit */
	return a == 0 || a > 256 ? 256 : (unsigned)a;
}

/* Set up the descriptors of c for its key and ask the heuristic for one algorithm. */
static cublasStatus_t mm_setup(struct mm_entry *c)
{
	const struct mm_key *k = &c->key;
	cublasOperation_t ta = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasLtMatmulPreferenceOpaque_t pref;
	cublasLtMatmulHeuristicResult_t res;
	uint64_t wsb = WS_BYTES;
	int got = 0;
	cublasStatus_t st;

#define TRY(call) do { if ((st = (call)) != CUBLAS_STATUS_SUCCESS) return st; } while (0)
	TRY(L.cublasLtMatmulDescInit_internal(&c->op, sizeof(c->op), CUBLAS_COMPUTE_32F, CUDA_R_32F));
	TRY(L.cublasLtMatmulDescSetAttribute(&c->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
	TRY(L.cublasLtMatmulDescSetAttribute(&c->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
	/* stored shapes: op(A) is m x k, op(B) k x n */
	TRY(L.cublasLtMatrixLayoutInit_internal(&c->a, sizeof(c->a), CUDA_R_16BF, k->ta ? k->k : k->m, k->ta ? k->m : k->k, k->lda));
	TRY(L.cublasLtMatrixLayoutInit_internal(&c->b, sizeof(c->b), CUDA_R_16BF, k->tb ? k->n : k->k, k->tb ? k->k : k->n, k->ldb));
	TRY(L.cublasLtMatrixLayoutInit_internal(&c->c, sizeof(c->c), CUDA_R_32F, k->m, k->n, k->ldc));
	TRY(L.cublasLtMatmulPreferenceInit_internal(&pref, sizeof(pref)));
	TRY(L.cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
	TRY(L.cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k->al_a, 4));
	TRY(L.cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k->al_b, 4));
	TRY(L.cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k->al_c, 4));
	TRY(L.cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k->al_c, 4));
	TRY(L.cublasLtMatmulAlgoGetHeuristic(lt, &c->op, &c->a, &c->b, &c->c, &c->c, &pref, 1, &res, &got));
#undef TRY
	if (got < 1 || res.state != CUBLAS_STATUS_SUCCESS)
		return CUBLAS_STATUS_NOT_SUPPORTED;
	c->algo = res.algo;
	c->ws = res.workspaceSize;
	return CUBLAS_STATUS_SUCCESS;
}

/* common.cuh: D = op(A) op(B) + beta C; nothing when m, n or k is 0 */
extern "C" int hp_cu_mm(int ta, int tb, uint64_t m, uint64_t n, uint64_t k, const hp_bf16 *A, int64_t lda,
			const hp_bf16 *B, int64_t ldb, float *C, int64_t ldc, float beta, struct hp_err *e)
{
	struct mm_key key;
	struct mm_entry *c = NULL;
	float alpha = 1.0f;
	cublasStatus_t st;

	if (m == 0 || n == 0 || k == 0)
		return 0;
	memset(&key, 0, sizeof(key));
	key.ta = ta; key.tb = tb;
	key.m = m; key.n = n; key.k = k;
	key.lda = lda; key.ldb = ldb; key.ldc = ldc;
	key.al_a = align_of(A); key.al_b = align_of(B); key.al_c = align_of(C);
	for (int i = 0; i < ncache && !c; i++)
		if (!memcmp(&cache[i].key, &key, sizeof(key)))
			c = &cache[i];
	if (!c) {
		/* a full table replaces its entries round robin */
		c = &cache[ncache < NCACHE ? ncache : next_evict];
		memcpy(&c->key, &key, sizeof(key));
		if ((st = mm_setup(c)) != CUBLAS_STATUS_SUCCESS) {
			memset(&c->key, 0, sizeof(c->key));   /* matches no real problem (m = 0) */
			return hp_err_set(e, HP_ECUDA, "cuBLASLt: no algorithm for %s%s m=%lu n=%lu k=%lu: %s",
					  ta ? "T" : "N", tb ? "T" : "N", (unsigned long)m, (unsigned long)n,
					  (unsigned long)k, L.cublasLtGetStatusString(st));
		}
		if (ncache < NCACHE)
			ncache++;
		else
			next_evict = (next_evict + 1) % NCACHE;
	}
	st = L.cublasLtMatmul(lt, &c->op, &alpha, A, &c->a, B, &c->b, &beta, C, &c->c, C, &c->c,
			    &c->algo, ws, c->ws, hp_cu_stream);
	if (st != CUBLAS_STATUS_SUCCESS)
		return hp_err_set(e, HP_ECUDA, "cublasLtMatmul %s%s m=%lu n=%lu k=%lu: %s",
				  ta ? "T" : "N", tb ? "T" : "N", (unsigned long)m, (unsigned long)n,
				  (unsigned long)k, L.cublasLtGetStatusString(st));
	return 0;
}

