/*
 * rmsnorm.cu - RMSNorm forward and backward on the GPU, F32.
 *
 * One block per row; the sum of squares is reduced in the block through
 * shared memory.  Same maths as kernels/cpu/rmsnorm.c, so the CPU reference
 * is the test oracle (t/unit/test-cuda.c).
 */
#include <cuda_runtime.h>

#include "cuda/ops.h"

#define CK(call) do { cudaError_t rc_ = (call); if (rc_ != cudaSuccess) { \
	rc = hp_err_set(e, HP_ECUDA, "%s: %s", #call, cudaGetErrorString(rc_)); goto out; } } while (0)

static __device__ float block_sum(float v, float *sh)
{
	int t = threadIdx.x;

	sh[t] = v;
	__syncthreads();
	for (int s = blockDim.x / 2; s > 0; s >>= 1) {
		if (t < s)
			sh[t] += sh[t + s];
		__syncthreads();
	}
	float r = sh[0];
	__syncthreads();
	return r;
}

static __global__ void rmsnorm_fwd_k(float *y, float *rstd, const float *x, const float *w, int C, float eps)
{
	__shared__ float sh[256];
	const float *xr = x + (long)blockIdx.x * C;
	float *yr = y + (long)blockIdx.x * C;
	float ss = 0;

	for (int c = threadIdx.x; c < C; c += blockDim.x)
		ss += xr[c] * xr[c];
	ss = block_sum(ss, sh);
	float r = rsqrtf(ss / C + eps);
	if (threadIdx.x == 0)
		rstd[blockIdx.x] = r;
	for (int c = threadIdx.x; c < C; c += blockDim.x)
		yr[c] = w[c] * (xr[c] * r);
}

static __global__ void rmsnorm_bwd_k(float *dx, float *dw, const float *dy, const float *x,
				     const float *w, const float *rstd, int C)
{
	__shared__ float sh[256];
	long row = blockIdx.x;
	const float *xr = x + row * C, *dyr = dy + row * C;
	float r = rstd[row], dot = 0;

	for (int c = threadIdx.x; c < C; c += blockDim.x)
		dot += dyr[c] * w[c] * xr[c] * r;
	dot = block_sum(dot, sh) / C;
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		float xh = xr[c] * r;
		dx[row * C + c] = r * (dyr[c] * w[c] - xh * dot);
		atomicAdd(&dw[c], dyr[c] * xh);
	}
}

extern "C" int hp_cuda_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w,
				   long N, int C, float eps, struct hp_err *e)
{
	float *dy = NULL, *dr = NULL, *dx = NULL, *dw = NULL;
	size_t nc = (size_t)N * C * sizeof(float);
	int rc = 0;

	CK(cudaMalloc(&dx, nc));
	CK(cudaMalloc(&dy, nc));
	CK(cudaMalloc(&dr, (size_t)N * sizeof(float)));
	CK(cudaMalloc(&dw, (size_t)C * sizeof(float)));
	CK(cudaMemcpy(dx, x, nc, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dw, w, (size_t)C * sizeof(float), cudaMemcpyHostToDevice));
	rmsnorm_fwd_k<<<(unsigned)N, 256>>>(dy, dr, dx, dw, C, eps);
	CK(cudaGetLastError());
	CK(cudaMemcpy(y, dy, nc, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(rstd, dr, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost));
out:
	cudaFree(dx);
	cudaFree(dy);
	cudaFree(dr);
	cudaFree(dw);
	return rc;
}

extern "C" int hp_cuda_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
				   const float *rstd, long N, int C, struct hp_err *e)
{
	float *ddx = NULL, *ddw = NULL, *ddy = NULL, *dxx = NULL, *dww = NULL, *dr = NULL;
	size_t nc = (size_t)N * C * sizeof(float), cb = (size_t)C * sizeof(float);
	int rc = 0;

	CK(cudaMalloc(&ddx, nc));
	CK(cudaMalloc(&ddy, nc));
	CK(cudaMalloc(&dxx, nc));
	CK(cudaMalloc(&ddw, cb));
	CK(cudaMalloc(&dww, cb));
	CK(cudaMalloc(&dr, (size_t)N * sizeof(float)));
	CK(cudaMemcpy(ddy, dy, nc, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dxx, x, nc, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dww, w, cb, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(ddw, dw, cb, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dr, rstd, (size_t)N * sizeof(float), cudaMemcpyHostToDevice));
	rmsnorm_bwd_k<<<(unsigned)N, 256>>>(ddx, ddw, ddy, dxx, dww, dr, C);
	CK(cudaGetLastError());
	CK(cudaMemcpy(dx, ddx, nc, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(dw, ddw, cb, cudaMemcpyDeviceToHost));
out:
	cudaFree(ddx);
	cudaFree(ddy);
	cudaFree(dxx);
	cudaFree(ddw);
	cudaFree(dww);
	cudaFree(dr);
	return rc;
}
