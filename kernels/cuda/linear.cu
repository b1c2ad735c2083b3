/*
 * linear.cu - the linear layers y = x W^T + b and their backward on the
 * bf16 operands the backend makes (x, dy, the weights' working copy), fp32
 * outputs: each a GEMM of gemm.cu plus the bias pass and the bias
 * gradient's column sum, kernels of their own with a fixed order.  What it
 * is not: the GEMM itself (gemm.cu, cuBLASLt).
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
 */
#include "cuda/common.cuh"

/* y[r, o] += b[o] over rows of O: a pass of its own after the GEMM, as the
 * CPU's linear_fwd adds the bias to the finished product */
static __global__ void bias_kernel(float *y, const float *b, size_t n, int O)
{
	HP_CU_GRID_STRIDE(i, n)
		y[i] = __fadd_rn(y[i], b[i % (size_t)O]);
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
			s = __fadd_rn(s, bf2f(dy[r * O + c]));
	sh[ty][tx] = s;
	__syncthreads();
	if (ty == 0 && c < O) {
		for (int j = 1; j < DB_ROWS; j++)
			s = __fadd_rn(s, sh[j][tx]);
		db[c] = __fadd_rn(db[c], s);
	}
}

extern "C" int hp_cuda_linear_fwd(float *y, const hp_bf16 *x, const hp_bf16 *W, const float *b, long N, int K, int O,
				  struct hp_err *e)
{
	size_t n = (size_t)N * O;

	if (N <= 0 || O <= 0)
		return 0;
	if (K <= 0)     /* an empty product: y = b or 0 */
		CK(cudaMemsetAsync(y, 0, n * sizeof(float), hp_cu_stream));
	else if (hp_cu_mm(1, 0, O, N, K, W, K, x, K, y, O, 0.0f, e))
		return HP_ECUDA;
	if (b)
		bias_kernel<<<hp_cu_blocks(n, 256), 256, 0, hp_cu_stream>>>(y, b, n, O);
	return 0;
}

extern "C" int hp_cuda_linear_bwd(float *dx, float *dW, float *db, const hp_bf16 *dy, const hp_bf16 *x,
				  const hp_bf16 *W, long N, int K, int O, int accumulate, struct hp_err *e)
{
	if (N <= 0)
		return 0;
	/* dx = dy W (+ dx): beta 1 accumulates into the fp32 dx */
	if (dx && K > 0) {
		if (O > 0) {
			if (hp_cu_mm(0, 0, K, N, O, W, K, dy, O, dx, K, accumulate ? 1.0f : 0.0f, e))
				return HP_ECUDA;
		} else if (!accumulate) {
			CK(cudaMemsetAsync(dx, 0, (size_t)N * K * sizeof(float), hp_cu_stream));
		}
	}
	if (O <= 0)
		return 0;
	if (dW && K > 0 && hp_cu_mm(0, 1, K, O, N, x, K, dy, O, dW, K, 1.0f, e))
		return HP_ECUDA;
	if (db)
		colsum_kernel<<<(unsigned)((O + 31) / 32), dim3(32, DB_ROWS), 0, hp_cu_stream>>>(db, dy, N, O);
	return 0;
}
