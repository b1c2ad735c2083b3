/*
 * stubs.cpp - what the emulated build has instead of gemm.cu (cuBLASLt)
 * and flashattn.cu (inline PTX mma.sync): no GEMM handle, and tensor-core
 * attention that aborts if called (attn.cu still dispatches: head dims 64
 * and 128 are supported, as on a GPU; the tests skip them under
 * HP_CUDA_EMULATED).
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda/common.cuh"

extern "C" int hp_cu_gemm_init(struct hp_err *e) { return 0; }
extern "C" void hp_cu_gemm_fini(void) {}

/* gemm.cu's entry points (lib/gmodel.o, pulled by the tests for a helper, refers to them) */
#define NOGEMM return hp_err_set(e, HP_ECUDA, "cuemu: %s: GEMMs (gemm.cu, cuBLASLt) are not emulated", __func__)
extern "C" int hp_cuda_linear_fwd(void *, int, const hp_bf16 *, const hp_bf16 *, const float *, long, int, int,
				  struct hp_err *e) { NOGEMM; }
extern "C" int hp_cuda_linear_bwd_dx(hp_bf16 *, const hp_bf16 *, const hp_bf16 *, long, int, int, int,
				     struct hp_err *e) { NOGEMM; }
extern "C" int hp_cuda_linear_bwd_dw(float *, float *, const hp_bf16 *, const hp_bf16 *, long, int, int,
				     struct hp_err *e) { NOGEMM; }
extern "C" int hp_cuda_grouped_fwd(hp_bf16 *, const hp_bf16 *, const hp_bf16 *const *, const int32_t *, int, int,
				   int, struct hp_err *e) { NOGEMM; }
extern "C" int hp_cuda_grouped_bwd_dx(hp_bf16 *, const hp_bf16 *, const hp_bf16 *const *, const int32_t *, int,
				      int, int, struct hp_err *e) { NOGEMM; }
extern "C" int hp_cuda_grouped_bwd_dw(float *const *, const hp_bf16 *, const hp_bf16 *, const int32_t *, int, int,
				      int, struct hp_err *e) { NOGEMM; }

/* flashattn.cu's tensor-core kernels (head_dim 64 and 128): the tests skip
 * those head dims under HP_CUDA_EMULATED */
static void tensor_core_dim(int D)
{
	fprintf(stderr, "cuemu: flash attention at head_dim %d (flashattn.cu, mma.sync) is not emulated\n", D);
	abort();
}

extern "C" void hp_cu_flash_tc_fwd(hp_bf16 *, float *, const hp_bf16 *, const hp_bf16 *, const hp_bf16 *,
				   const int32_t *, int, int, int, int, int D)
{
	tensor_core_dim(D);
}

extern "C" void hp_cu_flash_tc_bwd(hp_bf16 *, hp_bf16 *, hp_bf16 *, const hp_bf16 *, const hp_bf16 *,
				   const float *, const hp_bf16 *, const hp_bf16 *, const hp_bf16 *, const int32_t *,
				   float *, int, int, int, int, int D)
{
	tensor_core_dim(D);
}
