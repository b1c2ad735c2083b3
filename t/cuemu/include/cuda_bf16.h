/* cuda_bf16.h - the CPU emulation's stand-in (t/cuemu): the backend keeps
 * bf16 as raw uint16_t bits (hp_bf16); __nv_bfloat16 is only the element
 * type the wmma stand-in (mma.h) names, the same bits. */
#ifndef CUEMU_CUDA_BF16_H
#define CUEMU_CUDA_BF16_H
#include "cuda_runtime.h"
#ifdef __cplusplus
struct __nv_bfloat16 {
	unsigned short bits;
};
#endif
#endif
