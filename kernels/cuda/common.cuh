/*
 * common.cuh - what every .cu file of the CUDA backend shares: the stream,
 * the error-check macro, bf16 conversions and block reductions.
 */
#ifndef HP_KERNELS_CUDA_COMMON_CUH
#define HP_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/ops.h"

/* the backend's stream (context.cu) */
extern cudaStream_t hp_cu_stream;

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

static inline unsigned hp_cu_blocks(size_t n, unsigned threads)
{
	size_t b = (n + threads - 1) / threads;

	return (unsigned)(b > 65535u * 16u ? 65535u * 16u : (b ? b : 1));
}

#endif
