/*
 * attn.cuh - the attention kernels' internal entry points, for attn.cu's
 * dispatch: flashattn.cu (tensor cores, head_dim 64 and 128) and
 * attnsmall.cu (other head dims up to 256).  Arguments as
 * hp_cuda_flash_fwd/bwd (ops.h), already checked.
 */
#ifndef HP_KERNELS_CUDA_ATTN_CUH
#define HP_KERNELS_CUDA_ATTN_CUH

#include "cuda/ops.h"

extern "C" {
void hp_cu_flash_tc_fwd(hp_bf16 *out, float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
			const int32_t *seg, int B, int T, int Hq, int Hkv, int D);
void hp_cu_flash_tc_bwd(hp_bf16 *dq, hp_bf16 *dk, hp_bf16 *dv, const hp_bf16 *dout, const hp_bf16 *out,
			const float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v, const int32_t *seg,
			float *scratch, int B, int T, int Hq, int Hkv, int D);
int hp_cu_attn_small_supports(int D);
void hp_cu_attn_small_fwd(hp_bf16 *out, float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
			  const int32_t *seg, int B, int T, int Hq, int Hkv, int D);
void hp_cu_attn_small_bwd(hp_bf16 *dq, hp_bf16 *dk, hp_bf16 *dv, const hp_bf16 *dout, const hp_bf16 *out,
			  const float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
			  const int32_t *seg, float *scratch, int B, int T, int Hq, int Hkv, int D);
}

#endif
