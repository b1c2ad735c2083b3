/*
 * mma.h - the CPU emulation's stand-in (t/cuemu) for nvcuda::wmma, the
 * warp-wide tensor-core fragments: bf16 matrix_a and matrix_b fragments,
 * fp32 accumulators, any M x N x K (grouped.cu uses 16x16x16); fill,
 * load, store and mma_sync.
 *
 * The hardware's fragment layout (which lane holds which elements) is
 * opaque to the code that uses it, so here every lane holds the whole
 * tile and computes the whole product itself: what load, mma and store
 * mean is the same, 32 times over.  The fp32 sums run in k order, one
 * rounding per product and add; the tensor cores' order and rounding are
 * their own (the tests' tolerances cover both).
 *
 * What the hardware requires and would not report, this aborts on: a load,
 * store or mma_sync that not every lane of the warp reaches (they are warp
 * collective: each is a warp operation here, so the scheduler's divergence
 * and deadlock checks apply), lanes passing different pointers or leading
 * dimensions, a pointer not 32-byte aligned, a leading dimension not a
 * multiple of 16 bytes.  Not emulated: other element types (half, tf32,
 * int8), the fragments' x[] layout.
 */
#ifndef CUEMU_MMA_H
#define CUEMU_MMA_H

#include <cstdint>
#include <type_traits>

#include "cuda_bf16.h"

namespace nvcuda {
namespace wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K> struct cuemu_shape;
template <int M, int N, int K> struct cuemu_shape<matrix_a, M, N, K> { enum { R = M, C = K }; };
template <int M, int N, int K> struct cuemu_shape<matrix_b, M, N, K> { enum { R = K, C = N }; };
template <int M, int N, int K> struct cuemu_shape<accumulator, M, N, K> { enum { R = M, C = N }; };

/* the whole R x C tile, row by row, as floats (bf16 converts exactly) */
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
	static_assert(((std::is_same<Use, accumulator>::value && std::is_same<T, float>::value) ||
				      (!std::is_same<Use, accumulator>::value && std::is_same<T, __nv_bfloat16>::value)),
		      "cuemu: wmma fragments are emulated for bf16 operands and fp32 accumulators only");
	enum { R = cuemu_shape<Use, M, N, K>::R, C = cuemu_shape<Use, M, N, K>::C };
	static const int num_elements = R * C;
	float x[R * C];
};

static inline float cuemu_bf16_f32(__nv_bfloat16 b)
{
	return __uint_as_float((unsigned)b.bits << 16);
}

/* a warp operation that checks every lane passes the same p and ldm, with
 * p 32-byte and ldm 16-byte aligned (elem bytes per element) */
static inline void cuemu_wmma_check(const void *p, unsigned ldm, unsigned elem, const char *what)
{
	uint64_t u = (uint64_t)(uintptr_t)p, u0 = __shfl_sync(0xffffffffu, u, 0);
	unsigned l0 = __shfl_sync(0xffffffffu, ldm, 0);

	if (u != u0 || ldm != l0)
		cuemu_fail("wmma::%s: lane %u passes %p, ldm %u; lane 0 %p, ldm %u", what, threadIdx.x & 31, p, ldm,
			   (const void *)(uintptr_t)u0, l0);
	if (u % 32)
		cuemu_fail("wmma::%s: pointer %p is not 32-byte aligned", what, p);
	if (ldm * elem % 16)
		cuemu_fail("wmma::%s: ldm %u is not a multiple of %u elements", what, ldm, 16 / elem);
}

template <typename Use, int M, int N, int K, typename T, typename L>
static inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, float v)
{
	for (int i = 0; i < f.num_elements; i++)
		f.x[i] = v;
}

/* a(i, k) = p[i*ldm + k] (row_major) or p[k*ldm + i] (col_major) */
template <int M, int N, int K, typename L>
static inline void load_matrix_sync(fragment<matrix_a, M, N, K, __nv_bfloat16, L> &f, const __nv_bfloat16 *p,
				    unsigned ldm)
{
	cuemu_wmma_check(p, ldm, 2, "load_matrix_sync (matrix_a)");
	for (int i = 0; i < M; i++)
		for (int k = 0; k < K; k++)
			f.x[i * K + k] = cuemu_bf16_f32(std::is_same<L, row_major>::value ? p[i * ldm + k] : p[k * ldm + i]);
}

/* b(k, j) = p[k*ldm + j] (row_major) or p[j*ldm + k] (col_major) */
template <int M, int N, int K, typename L>
static inline void load_matrix_sync(fragment<matrix_b, M, N, K, __nv_bfloat16, L> &f, const __nv_bfloat16 *p,
				    unsigned ldm)
{
	cuemu_wmma_check(p, ldm, 2, "load_matrix_sync (matrix_b)");
	for (int k = 0; k < K; k++)
		for (int j = 0; j < N; j++)
			f.x[k * N + j] = cuemu_bf16_f32(std::is_same<L, row_major>::value ? p[k * ldm + j] : p[j * ldm + k]);
}

template <int M, int N, int K>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p, unsigned ldm,
				    layout_t lay)
{
	cuemu_wmma_check(p, ldm, 4, "load_matrix_sync (accumulator)");
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++)
			f.x[i * N + j] = lay == mem_row_major ? p[i * ldm + j] : p[j * ldm + i];
}

/* every lane writes the same values: the last write is as good as any */
template <int M, int N, int K>
static inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f, unsigned ldm,
				     layout_t lay)
{
	cuemu_wmma_check(p, ldm, 4, "store_matrix_sync");
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++)
			(lay == mem_row_major ? p[i * ldm + j] : p[j * ldm + i]) = f.x[i * N + j];
}

/* d = a b + c, fp32 sums in k order starting from c; d may be c */
template <int M, int N, int K, typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float> &d,
			    const fragment<matrix_a, M, N, K, __nv_bfloat16, LA> &a,
			    const fragment<matrix_b, M, N, K, __nv_bfloat16, LB> &b,
			    const fragment<accumulator, M, N, K, float> &c)
{
	__syncwarp();   /* warp collective: every lane must reach it */
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			float s = c.x[i * N + j];
			for (int k = 0; k < K; k++)
				s += a.x[i * K + k] * b.x[k * N + j];
			d.x[i * N + j] = s;
		}
}

}   /* namespace wmma */
}   /* namespace nvcuda */

#endif
