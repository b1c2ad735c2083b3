/*
 * common.cuh - what every .cu file of the CUDA kernels shares: the stream,
 * the GEMM, the error-check macro, bf16 conversions and block reductions.
 */
#ifndef HP_KERNELS_CUDA_COMMON_CUH
#define HP_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/ops.h"

/* the backend's stream (context.cu) */
extern cudaStream_t hp_cu_stream;

/* context.cu: device memory no longer used (grown scratch), freed at
 * hp_cuda_fini rather than now, when collectives may be in flight */
void hp_cu_retire(void *p);

/* context.cu: a library opened at run time (dlopen: a CPU run never loads
 * it), the first of names that loads, and each of syms resolved into its
 * slot; 0, or HP_ECUDA naming the library or the missing function.  Once
 * is enough; again costs a lookup. */
struct hp_cu_sym {
	const char *name;
	void **slot;
};
int hp_cu_dlopen(const char *const *names, int nnames, const struct hp_cu_sym *syms, int nsyms,
		 struct hp_err *e);

/* gemm.cu: D = op(A) op(B) + beta C, column-major (ta, tb: A, B transposed),
 * A and B bf16, C = D fp32 with leading dimension ldc; nothing to do when m,
 * n or k is 0.  0 or HP_ECUDA with e set. */
extern "C" int hp_cu_mm(int ta, int tb, uint64_t m, uint64_t n, uint64_t k, const hp_bf16 *A, int64_t lda,
			const hp_bf16 *B, int64_t ldb, float *C, int64_t ldc, float beta, struct hp_err *e);

/* CK(call): on failure set e and return HP_ECUDA from the enclosing function */
#define CK(call) do { cudaError_t rc_ = (call); if (rc_ != cudaSuccess) \
	return hp_err_set(e, HP_ECUDA, "%s: %s", #call, cudaGetErrorString(rc_)); } while (0)

static __device__ __forceinline__ float bf2f(hp_bf16 b)
{
	return __uint_as_float((unsigned)b << 16);
}

/* round to nearest even, NaN kept a (quiet) NaN */
static __device__ __forceinline__ hp_bf16 f2bf(float f)
{
	unsigned u = __float_as_uint(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (hp_bf16)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (hp_bf16)(u >> 16);
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024), the
 * same order every time; every thread gets the result.  T float or double;
 * sh: 32 of them. */
template <typename T>
static __device__ __forceinline__ T block_sum(T v, T *sh)
{
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;

	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	__syncthreads();
	if (lane == 0)
		sh[wid] = v;
	__syncthreads();
	v = lane < (int)(blockDim.x >> 5) ? sh[lane] : (T)0;
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

static __device__ __forceinline__ float block_max(float v, float *sh)
{
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;

	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	__syncthreads();
	if (lane == 0)
		sh[wid] = v;
	__syncthreads();
	v = lane < (int)(blockDim.x >> 5) ? sh[lane] : -INFINITY;
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* sigmoid(x) and sigmoid(-x) from one e = exp(-|x|), which never overflows:
 * 1/(1+e) and e/(1+e) for x >= 0, the other way round below (kernels/cpu's
 * swiglu.c and gdn.c compute them so) */
static __device__ __forceinline__ void hp_cu_sig2(float x, float *s, float *sm)
{
	float e = expf(x < 0.0f ? x : -x), d = __fadd_rn(1.0f, e);

	*s = __fdiv_rn(x < 0.0f ? e : 1.0f, d);
	*sm = __fdiv_rn(x < 0.0f ? 1.0f : e, d);
}

static __device__ __forceinline__ float hp_cu_sigmoid(float x)
{
	float s, sm;

	hp_cu_sig2(x, &s, &sm);
	return s;
}

/* attn.cu: n floats at p (device) set to NaN, on the stream */
void hp_cu_fill_nan(float *p, size_t n);

/* a float from either storage type, and back (bf16 rounded to nearest even) */
static __device__ __forceinline__ float hp_ld(const float *p) { return *p; }
static __device__ __forceinline__ float hp_ld(const hp_bf16 *p) { return bf2f(*p); }
static __device__ __forceinline__ void hp_st(float *p, float v) { *p = v; }
static __device__ __forceinline__ void hp_st(hp_bf16 *p, float v) { *p = f2bf(v); }

/* i over [0, n) in a grid-stride loop */
#define HP_CU_GRID_STRIDE(i, n) \
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
	     i += (size_t)gridDim.x * blockDim.x)

/* the most blocks a launch asks for; kernels loop over what is left */
#define HP_CU_MAX_GRID (65535u * 16u)

/* blocks of threads for n items (at least 1, at most HP_CU_MAX_GRID) */
static inline unsigned hp_cu_blocks(size_t n, unsigned threads)
{
	size_t b = (n + threads - 1) / threads;

	return (unsigned)(b > HP_CU_MAX_GRID ? HP_CU_MAX_GRID : (b ? b : 1));
}

/* blocks for one block per row, N rows */
static inline unsigned hp_cu_rows(long N)
{
	return hp_cu_blocks(N > 0 ? (size_t)N : 0, 1);
}

/* threads for one block per row of C items: a multiple of 32, at most cap */
static inline unsigned hp_cu_row_threads(int C, unsigned cap)
{
	unsigned t = ((unsigned)C + 31u) / 32u * 32u;

	return t < 32u ? 32u : t > cap ? cap : t;
}

#endif
