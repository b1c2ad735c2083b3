/*
 * cuda/ops.h - the CUDA backend's C interface (built when nvcc exists).
 *
 * At this stage the backend is deliberately small: device discovery and the
 * RMSNorm forward/backward pair, so that the build path (nvcc for sm_90a +
 * PTX, cudart and cuBLAS linked into every tool) exists and CI compiles it.
 * The remaining ops arrive with the CUDA backend issue; every one is tested
 * against the CPU reference by t/unit/test-cuda.c on a machine with a GPU.
 *
 * All pointers are host pointers; the wrappers copy to and from the device.
 * Functions return 0 or HP_ECUDA with the CUDA error string in e.
 */
#ifndef HP_KERNELS_CUDA_OPS_H
#define HP_KERNELS_CUDA_OPS_H

#include "err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices (0 when there is no driver or GPU). */
int hp_cuda_device_count(void);
/* "NVIDIA H200 (sm_90, 139 GiB)" for device dev, into buf. */
int hp_cuda_device_name(int dev, char *buf, unsigned long n, struct hp_err *e);

int hp_cuda_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w,
			long N, int C, float eps, struct hp_err *e);
int hp_cuda_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
			const float *rstd, long N, int C, struct hp_err *e);

#ifdef __cplusplus
}
#endif

#endif
