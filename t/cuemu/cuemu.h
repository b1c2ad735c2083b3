/*
 * cuemu.h - a small CPU emulation of the CUDA device side, enough to run
 * kernels/cuda's kernels unchanged in CI (no GPU).  A launch runs its blocks
 * one after another; the threads of a block are fibers on one OS thread,
 * switched only at __syncthreads, __syncwarp and shuffles, so a run is
 * deterministic.  t/cuemu/xform rewrites launches (k<<<g, b, s, st>>>(...))
 * into cuemu_launch and __shared__ declarations into registered statics.
 * Loud aborts: barrier deadlock or divergence, barriers or shuffles with
 * exited threads, bad launch shapes, shared memory over 48 KiB, copies
 * between overlapping areas (undefined on a GPU).
 */
#ifndef CUEMU_H
#define CUEMU_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

#include "cuda_runtime.h"

struct dim3 {
	unsigned x, y, z;
	dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 { unsigned x, y, z; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(8))) float2 { float x, y; };

/* the running fiber's coordinates: set by the scheduler at every switch */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
enum { warpSize = 32 };

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __noinline__ __attribute__((noinline))

/* barriers: the call site names the barrier (divergent __syncthreads abort) */
void cuemu_syncthreads(const char *file, int line);
void cuemu_syncwarp(unsigned mask, const char *file, int line);
#define __syncthreads() cuemu_syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) cuemu_syncwarp(cuemu_mask_(__VA_ARGS__), __FILE__, __LINE__)
static inline unsigned cuemu_mask_(unsigned m = 0xffffffffu) { return m; }

/* shuffles: the value's bytes go through the warp's exchange slots */
enum { CUEMU_XOR, CUEMU_IDX, CUEMU_DOWN, CUEMU_UP };
uint64_t cuemu_shfl(unsigned mask, uint64_t v, int mode, int arg, int width);
template <typename T>
static inline T cuemu_shfl_t(unsigned mask, T v, int mode, int arg, int width)
{
	static_assert(sizeof(T) <= 8, "cuemu: shuffle of more than 8 bytes");
	uint64_t u = 0;
	T r;
	memcpy(&u, &v, sizeof v);
	u = cuemu_shfl(mask, u, mode, arg, width);
	memcpy(&r, &u, sizeof r);
	return r;
}
template <typename T> static inline T __shfl_xor_sync(unsigned m, T v, int o, int w = 32) { return cuemu_shfl_t(m, v, CUEMU_XOR, o, w); }
template <typename T> static inline T __shfl_sync(unsigned m, T v, int l, int w = 32) { return cuemu_shfl_t(m, v, CUEMU_IDX, l, w); }
template <typename T> static inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32) { return cuemu_shfl_t(m, v, CUEMU_DOWN, (int)d, w); }
template <typename T> static inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32) { return cuemu_shfl_t(m, v, CUEMU_UP, (int)d, w); }

/* shared memory: xform turns `__shared__ T a[n];` into a static plus
 * cuemu_shared(a, sizeof a): counted against 48 KiB per block, filled with
 * 0xff bytes (NaN, -1) at every block's start */
void cuemu_shared(void *p, size_t n);
void *cuemu_dyn_shared(void);

/* the arithmetic intrinsics: host IEEE arithmetic (compiled -ffp-contract=off) */
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline float __double2float_rn(double a) { return (float)a; }
template <typename T> static inline T __ldg(const T *p) { return *p; }

/* abort with the running kernel, block and thread named (what the stand-in
 * headers check, as cuemu.cpp's own aborts) */
void cuemu_fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* the launch: f runs once per thread of every block of grid g */
void cuemu_launch(const std::function<void()> &f, const char *name, dim3 g, dim3 b, size_t smem = 0,
		  cudaStream_t st = 0);

#endif
