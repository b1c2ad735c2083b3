/*
 * device.cu - CUDA device discovery and the error-check macro's home.
 */
#include <cuda_runtime.h>
#include <stdio.h>

#include "cuda/ops.h"

extern "C" int hp_cuda_device_count(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError();   /* clear the sticky "no driver" error */
		return 0;
	}
	return n;
}

extern "C" int hp_cuda_device_name(int dev, char *buf, unsigned long n, struct hp_err *e)
{
	cudaDeviceProp p;
	cudaError_t rc = cudaGetDeviceProperties(&p, dev);

	if (rc != cudaSuccess)
		return hp_err_set(e, HP_ECUDA, "cuda device %d: %s", dev, cudaGetErrorString(rc));
	snprintf(buf, n, "%s (sm_%d%d, %.0f GiB)", p.name, p.major, p.minor,
		 (double)p.totalGlobalMem / (1 << 30));
	return 0;
}
