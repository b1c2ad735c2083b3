/*
 * stubs.cpp - what the emulated build has instead of gemm.cu (cuBLASLt)
 * and flashattn.cu (inline PTX mma.sync): a GEMM on the host, and
 * tensor-core attention that aborts if called (attn.cu still dispatches:
 * head dims 64 and 128 are supported, as on a GPU; the tests skip them
 * under HP_CUDA_EMULATED).
 *
 * The host GEMM is hp_cu_mm's contract done plainly (column-major, bf16
 * operands, fp32 sums in k order, D = sum + beta C), so that linear.cu's
 * own code - which GEMM with which transposes and leading dimensions, beta
 * for accumulate, the skipped dx, the bias pass and db's column sum - runs
 * under t/cuemu against the CPU reference.  It says nothing about cuBLASLt.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda/common.cuh"

extern "C" int hp_cu_gemm_init(struct hp_err *e) { return 0; }
extern "C" int hp_cu_lt_open(struct hp_err *e) { return hp_err_set(e, HP_EUNSUP, "t/cuemu has no cuBLASLt"); }
extern "C" void hp_cu_gemm_fini(void) {}

extern "C" int hp_cu_mm(int ta, int tb, uint64_t m, uint64_t n, uint64_t k, const hp_bf16 *A, int64_t lda,
			const hp_bf16 *B, int64_t ldb, float *C, int64_t ldc, float beta, struct hp_err *e)
{
	if (m == 0 || n == 0 || k == 0)
		return 0;
	for (uint64_t j = 0; j < n; j++)
		for (uint64_t i = 0; i < m; i++) {
			float s = 0.0f;
			for (uint64_t p = 0; p < k; p++) {
				float a = bf2f(ta ? A[p + i * lda] : A[i + p * lda]);
				float b = bf2f(tb ? B[j + p * ldb] : B[p + j * ldb]);
				s += a * b;
			}
			float *d = C + i + j * ldc;
			*d = beta != 0.0f ? s + beta * *d : s;
		}
	return 0;
}

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
