/*
 * gemm.cu - the linear layers' GEMMs (dense and grouped experts) through
 * cuBLASLt: bf16 A and B, fp32 accumulation (CUBLAS_COMPUTE_32F), bf16 or
 * fp32 C = D, all on hp_cu_stream with one 32 MiB workspace.
 *
 * Row-major to cuBLAS's column-major: a row-major [r, c] matrix is, byte for
 * byte, the column-major [c, r] matrix (its transpose) with ld = c.  So with
 * W [O,K], x [N,K], y [N,O], dy [N,O] row-major:
 *   y  = x W^T    is  y^T [O,N]  = (W^T)^T x^T  : m=O n=N k=K, A=W (K x O, ld K) op T,
 *                                                 B=x (K x N, ld K) op N, D ld O
 *   dx = dy W     is  dx^T [K,N] = W^T dy^T     : m=K n=N k=O, A=W (K x O, ld K) op N,
 *                                                 B=dy (O x N, ld O) op N, D ld K
 *   dW += dy^T x  is  dW^T [K,O] = x^T dy       : m=K n=O k=N, A=x (K x N, ld K) op N,
 *                                                 B=dy (O x N, ld O) op T, D ld K
 * (dims written column-major: rows x cols of the stored matrix).
 *
 * Determinism: cuBLASLt gives the same bits for the same algorithm on the
 * same GPU, and its split-K reductions are ordered (the in-place scheme uses
 * counters for sequentiality, the others a separate reduction pass); the
 * algorithm is chosen once per shape and cached, so a shape always runs the
 * same one.  The bias and db are plain kernels with a fixed order.
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
	int ta, tb, ct;                 /* transposes, C/D data type */
	unsigned al_a, al_b, al_c;      /* pointer alignments in bytes, <= 256 */
};
static_assert(sizeof(struct mm_key) == 6 * 8 + 6 * 4, "mm_key must have no padding");

struct mm_entry {
	struct mm_key key;
	cublasLtMatmulDescOpaque_t op;
	cublasLtMatrixLayoutOpaque_t a, b, c;
	cublasLtMatmulAlgo_t algo;
	size_t ws;
};

static cublasLtHandle_t lt;
static void *ws;
static struct mm_entry cache[NCACHE];
static int ncache, next_evict;

extern "C" int hp_cu_gemm_init(struct hp_err *e)
{
	cublasStatus_t st = cublasLtCreate(&lt);

	if (st != CUBLAS_STATUS_SUCCESS)
		return hp_err_set(e, HP_ECUDA, "cublasLtCreate: %s", cublasLtGetStatusString(st));
	cudaError_t rc = cudaMalloc(&ws, WS_BYTES);
	if (rc != cudaSuccess) {
		cublasLtDestroy(lt);
		lt = NULL;
		return hp_err_set(e, HP_ECUDA, "cuBLASLt workspace: %s", cudaGetErrorString(rc));
	}
	ncache = next_evict = 0;
	return 0;
}

extern "C" void hp_cu_gemm_fini(void)
{
	if (lt)
		cublasLtDestroy(lt);
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
	TRY(cublasLtMatmulDescInit(&c->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	TRY(cublasLtMatmulDescSetAttribute(&c->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
	TRY(cublasLtMatmulDescSetAttribute(&c->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
	/* stored shapes: op(A) is m x k, op(B) k x n */
	TRY(cublasLtMatrixLayoutInit(&c->a, CUDA_R_16BF, k->ta ? k->k : k->m, k->ta ? k->m : k->k, k->lda));
	TRY(cublasLtMatrixLayoutInit(&c->b, CUDA_R_16BF, k->tb ? k->n : k->k, k->tb ? k->k : k->n, k->ldb));
	TRY(cublasLtMatrixLayoutInit(&c->c, (cudaDataType_t)k->ct, k->m, k->n, k->ldc));
	TRY(cublasLtMatmulPreferenceInit(&pref));
	TRY(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
	TRY(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k->al_a, 4));
	TRY(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k->al_b, 4));
	TRY(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k->al_c, 4));
	TRY(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k->al_c, 4));
	TRY(cublasLtMatmulAlgoGetHeuristic(lt, &c->op, &c->a, &c->b, &c->c, &c->c, &pref, 1, &res, &got));
#undef TRY
	if (got < 1 || res.state != CUBLAS_STATUS_SUCCESS)
		return CUBLAS_STATUS_NOT_SUPPORTED;
	c->algo = res.algo;
	c->ws = res.workspaceSize;
	return CUBLAS_STATUS_SUCCESS;
}

/*
 * D = op(A) op(B) + beta C, column-major, C = D (type ct, ld ldc), A and B
 * bf16.  Nothing to do when m, n or k is 0 (callers never need the k = 0
 * "D = beta C" case).
 */
static int mm(int ta, int tb, uint64_t m, uint64_t n, uint64_t k, const void *A, int64_t lda,
	      const void *B, int64_t ldb, void *C, cudaDataType_t ct, int64_t ldc, float beta,
	      struct hp_err *e)
{
	struct mm_key key;
	struct mm_entry *c = NULL;
	float alpha = 1.0f;
	cublasStatus_t st;

	if (m == 0 || n == 0 || k == 0)
		return 0;
	key.ta = ta; key.tb = tb; key.ct = ct;
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
					  (unsigned long)k, cublasLtGetStatusString(st));
		}
		if (ncache < NCACHE)
			ncache++;
		else
			next_evict = (next_evict + 1) % NCACHE;
	}
	st = cublasLtMatmul(lt, &c->op, &alpha, A, &c->a, B, &c->b, &beta, C, &c->c, C, &c->c,
			    &c->algo, ws, c->ws, hp_cu_stream);
	if (st != CUBLAS_STATUS_SUCCESS)
		return hp_err_set(e, HP_ECUDA, "cublasLtMatmul %s%s m=%lu n=%lu k=%lu: %s",
				  ta ? "T" : "N", tb ? "T" : "N", (unsigned long)m, (unsigned long)n,
				  (unsigned long)k, cublasLtGetStatusString(st));
	return 0;
}

/* y[r, o] += b[o] over rows of O (a separate pass: a bf16 y is rounded twice) */
template <typename T>
static __global__ void bias_kernel(T *y, const float *b, size_t n, int O)
{
	HP_CU_GRID_STRIDE(i, n)
		hp_st(y + i, hp_ld(y + i) + b[i % O]);
}

/*
 * db[o] += sum over rows of dy[., o]: a block takes 32 columns, thread
 * (tx, ty) sums rows ty, ty+16, ... of column tx in order, then ty = 0 adds
 * the 16 partial sums in order: the same order on every run.
 */
#define DB_ROWS 16
static __global__ void colsum_kernel(float *db, const hp_bf16 *dy, long N, int O)
{
	__shared__ float sh[DB_ROWS][33];
	int tx = threadIdx.x, ty = threadIdx.y;
	long c = (long)blockIdx.x * 32 + tx;
	float s = 0.0f;

	if (c < O)
		for (long r = ty; r < N; r += DB_ROWS)
			s += bf2f(dy[r * O + c]);
	sh[ty][tx] = s;
	__syncthreads();
	if (ty == 0 && c < O) {
		for (int j = 1; j < DB_ROWS; j++)
			s += sh[j][tx];
		db[c] += s;
	}
}

extern "C" int hp_cuda_linear_fwd(void *y, int y_f32, const hp_bf16 *x, const hp_bf16 *W, const float *b,
				  long N, int K, int O, struct hp_err *e)
{
	size_t n = (size_t)N * O;

	if (N <= 0 || O <= 0)
		return 0;
	if (mm(1, 0, O, N, K, W, K, x, K, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF, O, 0.0f, e))
		return HP_ECUDA;
	if (b) {
		if (y_f32)
			bias_kernel<<<hp_cu_blocks(n, 256), 256, 0, hp_cu_stream>>>((float *)y, b, n, O);
		else
			bias_kernel<<<hp_cu_blocks(n, 256), 256, 0, hp_cu_stream>>>((hp_bf16 *)y, b, n, O);
	}
	return 0;
}

extern "C" int hp_cuda_linear_bwd_dx(hp_bf16 *dx, const hp_bf16 *dy, const hp_bf16 *W, long N, int K, int O,
				     int accumulate, struct hp_err *e)
{
	if (N <= 0 || K <= 0)
		return 0;
	return mm(0, 0, K, N, O, W, K, dy, O, dx, CUDA_R_16BF, K, accumulate ? 1.0f : 0.0f, e);
}

extern "C" int hp_cuda_linear_bwd_dw(float *dW, float *db, const hp_bf16 *dy, const hp_bf16 *x,
				     long N, int K, int O, struct hp_err *e)
{
	if (N <= 0 || O <= 0)
		return 0;
	if (mm(0, 1, K, O, N, x, K, dy, O, dW, CUDA_R_32F, K, 1.0f, e))
		return HP_ECUDA;
	if (db)
		colsum_kernel<<<(unsigned)((O + 31) / 32), dim3(32, DB_ROWS), 0, hp_cu_stream>>>(db, dy, N, O);
	return 0;
}

/*
 * Grouped experts: one cublasLtMatmul per non-empty group over the host
 * offsets (the groups are few and each GEMM is large enough to fill the GPU
 * reasonably; a grouped kernel would save the launches).
 */
extern "C" int hp_cuda_grouped_fwd(hp_bf16 *y, const hp_bf16 *x, const hp_bf16 *const *W, const int32_t *off,
				   int ng, int K, int O, struct hp_err *e)
{
	for (int g = 0; g < ng; g++) {
		long r0 = off[g], rows = (long)off[g + 1] - off[g];
		if (rows > 0 && hp_cuda_linear_fwd(y + r0 * O, 0, x + r0 * K, W[g], NULL, rows, K, O, e))
			return HP_ECUDA;
	}
	return 0;
}

extern "C" int hp_cuda_grouped_bwd_dx(hp_bf16 *dx, const hp_bf16 *dy, const hp_bf16 *const *W,
				      const int32_t *off, int ng, int K, int O, struct hp_err *e)
{
	for (int g = 0; g < ng; g++) {
		long r0 = off[g], rows = (long)off[g + 1] - off[g];
		if (rows > 0 && hp_cuda_linear_bwd_dx(dx + r0 * K, dy + r0 * O, W[g], rows, K, O, 0, e))
			return HP_ECUDA;
	}
	return 0;
}

extern "C" int hp_cuda_grouped_bwd_dw(float *const *dW, const hp_bf16 *dy, const hp_bf16 *x,
				      const int32_t *off, int ng, int K, int O, struct hp_err *e)
{
	for (int g = 0; g < ng; g++) {
		long r0 = off[g], rows = (long)off[g + 1] - off[g];
		if (rows > 0 && hp_cuda_linear_bwd_dw(dW[g], NULL, dy + r0 * O, x + r0 * K, rows, K, O, e))
			return HP_ECUDA;
	}
	return 0;
}
