/*
 * dtype.h - element types and exact conversions between them.
 *
 * F32 <-> BF16 and F32 <-> F16 conversions round to nearest, ties to even,
 * exactly as torch's .to(dtype) does; NaN stays NaN (quiet), overflow goes to
 * infinity, F16 subnormals are produced and consumed exactly.  No hardware
 * F16C or AVX512-BF16 is assumed: these are the reference conversions.
 */
#ifndef HP_DTYPE_H
#define HP_DTYPE_H

#include <stddef.h>
#include <stdint.h>

enum hp_dtype {
	HP_DTYPE_INVALID = 0,
	HP_DTYPE_F32,
	HP_DTYPE_BF16,
	HP_DTYPE_F16,
	HP_DTYPE_F64,
	HP_DTYPE_I64,
	HP_DTYPE_I32,
	HP_DTYPE_I16,
	HP_DTYPE_I8,
	HP_DTYPE_U8,
	HP_DTYPE_U16,
	HP_DTYPE_U32,
	HP_DTYPE_U64,
	HP_DTYPE_BOOL,
};

/* Bytes per element; 0 for HP_DTYPE_INVALID. */
size_t hp_dtype_size(enum hp_dtype t);
/* safetensors spelling: "F32", "BF16", ... */
const char *hp_dtype_name(enum hp_dtype t);
/* Parse the safetensors spelling; HP_DTYPE_INVALID when unknown. */
enum hp_dtype hp_dtype_parse(const char *s);
/* Parse torch_dtype spellings ("float32", "bfloat16", "float16"). */
enum hp_dtype hp_dtype_parse_torch(const char *s);
/* The torch_dtype spelling of a float dtype ("float32" for any other). */
const char *hp_dtype_torch_name(enum hp_dtype t);
/* True for F32/BF16/F16 (the dtypes model weights may have). */
int hp_dtype_is_float(enum hp_dtype t);

float hp_bf16_to_f32(uint16_t h);
uint16_t hp_f32_to_bf16(float f);
float hp_f16_to_f32(uint16_t h);
uint16_t hp_f32_to_f16(float f);
/* The rule of every bf16 sum over ranks (hp-train(1), "bf16 reductions";
 * the CUDA twin hp_cuda_bf16_sum_ranks): out[i] = bf16(in[i] + in[s + i] +
 * ... + in[(k - 1) s + i]), added in fp32 in that order and rounded once.
 * out may be in (each element is read and written by one pass). */
void hp_bf16_sum_ranks(uint16_t *out, const uint16_t *in, int k, size_t n, size_t s);

/* Convert n elements of src (F32/BF16/F16/F64) to F32. Returns 0 or -1 for an
 * unsupported source type. */
int hp_convert_to_f32(float *dst, const void *src, enum hp_dtype t, size_t n);
/* Convert n F32 elements to dst in F32/BF16/F16. Returns 0 or -1. */
int hp_convert_from_f32(void *dst, enum hp_dtype t, const float *src, size_t n);
/*
 * MXFP4, as GPT-OSS checkpoints store their experts (transformers'
 * integrations/mxfp4.py, convert_moe_packed_tensors): n values (a multiple
 * of 32) from n / 2 bytes of blocks - two E2M1 codes a byte, the low nibble
 * first, code k the k-th of +-{0, 0.5, 1, 1.5, 2, 3, 4, 6} (8..15 negative)
 * - and n / 32 scale bytes, each the exponent of its 32 values biased by
 * 127: value = code * 2^(scale - 127), exact in float (and in bf16, which
 * transformers dequantizes to: at most two significant bits, the same
 * exponent range).
 */
void hp_mxfp4_decode(float *dst, const uint8_t *blocks, const uint8_t *scales, size_t n);

/* The index of the first NaN or infinity of x[0..n), or n when none. */
size_t hp_find_nonfinite(const float *x, size_t n);

#endif
