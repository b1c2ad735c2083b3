/*
 * attn.cu - the attention entry points of kernels/cuda/ops.h: the call's
 * preconditions, then head_dim 64 and 128 to the tensor-core kernels
 * (flashattn.cu) and the other head dims up to 256 to attnsmall.cu, and
 * hp_cuda_fill_inf, with which a caller marks the query rows it pads (lse
 * +inf: probability 0 in the backward, so they add nothing to dK, dV).  A
 * call that breaks the preconditions fills its outputs with NaN, as the
 * CPU kernel does.
 */
#include "cuda/common.cuh"
#include "cuda/attn.cuh"

static __global__ void nan_bf16(hp_bf16 *p, size_t n)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = 0x7fc0;
}

static __global__ void nan_f32(float *p, size_t n)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = __int_as_float(0x7fc00000);
}

void hp_cu_fill_nan(float *p, size_t n)
{
	if (n)
		nan_f32<<<hp_cu_blocks(n, 256), 256, 0, hp_cu_stream>>>(p, n);
}

static __global__ void inf_f32(float *p, size_t n)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = INFINITY;
}

extern "C" void hp_cuda_fill_inf(float *x, size_t n)
{
	if (n)
		inf_f32<<<hp_cu_blocks(n, 256), 256, 0, hp_cu_stream>>>(x, n);
}

static void fill_nan_bf16(hp_bf16 *p, size_t n)
{
	if (p && n)
		nan_bf16<<<hp_cu_blocks(n, 256), 256, 0, hp_cu_stream>>>(p, n);
}

static int tensor_cores(int D)
{
	return D == 64 || D == 128;
}

extern "C" int hp_cuda_flash_supports(int D)
{
	return tensor_cores(D) || hp_cu_attn_small_supports(D);
}

extern "C" size_t hp_cuda_flash_scratch(int B, int T, int Hq)
{
	return B > 0 && T > 0 && Hq > 0 ? (size_t)B * T * Hq : 0;   /* Di[B, Hq, T] */
}

static int valid(int Hq, int Hkv, int D)
{
	return hp_cuda_flash_supports(D) && Hkv > 0 && Hq % Hkv == 0;
}

extern "C" void hp_cuda_flash_fwd(hp_bf16 *out, float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
				  const int32_t *seg, int B, int T, int Hq, int Hkv, int D)
{
	if (B <= 0 || T <= 0 || Hq <= 0)
		return;
	if (!valid(Hq, Hkv, D)) {
		size_t n = (size_t)B * Hq * T;
		fill_nan_bf16(out, n * (size_t)(D > 0 ? D : 0));
		if (lse)
			hp_cu_fill_nan(lse, n);
		return;
	}
	if (tensor_cores(D))
		hp_cu_flash_tc_fwd(out, lse, q, k, v, seg, B, T, Hq, Hkv, D);
	else
		hp_cu_attn_small_fwd(out, lse, q, k, v, seg, B, T, Hq, Hkv, D);
}

extern "C" void hp_cuda_flash_bwd(hp_bf16 *dq, hp_bf16 *dk, hp_bf16 *dv, const hp_bf16 *dout, const hp_bf16 *out,
				  const float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
				  const int32_t *seg, float *scratch, int B, int T, int Hq, int Hkv, int D)
{
	if (B <= 0 || T <= 0 || Hq <= 0)
		return;
	if (!valid(Hq, Hkv, D)) {
		size_t nd = (size_t)B * T * (D > 0 ? D : 0), nkv = Hkv > 0 ? (size_t)Hkv : 0;
		fill_nan_bf16(dq, nd * (size_t)Hq);
		fill_nan_bf16(dk, nd * nkv);
		fill_nan_bf16(dv, nd * nkv);
		return;
	}
	if (tensor_cores(D))
		hp_cu_flash_tc_bwd(dq, dk, dv, dout, out, lse, q, k, v, seg, scratch, B, T, Hq, Hkv, D);
	else
		hp_cu_attn_small_bwd(dq, dk, dv, dout, out, lse, q, k, v, seg, scratch, B, T, Hq, Hkv, D);
}
