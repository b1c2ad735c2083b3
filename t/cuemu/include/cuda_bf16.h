/* cuda_bf16.h - the CPU emulation's stand-in (t/cuemu): the backend keeps
 * bf16 as raw uint16_t bits (hp_bf16), so nothing is needed here. */
#include "cuda_runtime.h"
