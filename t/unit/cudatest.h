/*
 * cudatest.h - what the CUDA kernel tests (t/unit/test-cuda*.c) share:
 * host bf16 rounding, device buffers made from host arrays and back, bit
 * comparisons, and the normalised error they are judged by.  Only for
 * tests built with HP_HAVE_CUDA (on a GPU, or under t/cuemu); the host
 * emulation of lib/backend/cuda_emu.c is not what they test.
 */
#ifndef HP_T_CUDATEST_H
#define HP_T_CUDATEST_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/ops.h"
#include "base/dtype.h"
#include "tap.h"

/* x rounded to bf16 in place: the CPU reference then sees exactly the
 * inputs the GPU sees where it reads bf16 */
static inline void ct_round(float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = hp_bf16_to_f32(hp_f32_to_bf16(x[i]));
}

/* device memory of bytes; aborts the test program on failure */
static inline void *ct_alloc(size_t bytes)
{
	struct hp_err e;
	void *d = hp_cuda_alloc(bytes, &e);

	if (!d) {
		tap_diag("%s", e.msg);
		exit(1);
	}
	return d;
}

/* a device copy of host fp32 x, as fp32 (bf 0) or bf16 (bf 1); the upload
 * has read x when it returns */
static inline void *ct_dev(const float *x, size_t n, int bf)
{
	struct hp_err e;
	void *d = ct_alloc(n * (bf ? 2 : 4) + 4);

	if (bf) {
		hp_bf16 *h = malloc(n * 2 + 2);
		for (size_t i = 0; i < n; i++)
			h[i] = hp_f32_to_bf16(x[i]);
		hp_cuda_upload(d, h, n * 2, &e);
		hp_cuda_sync(&e);
		free(h);
	} else {
		hp_cuda_upload(d, x, n * 4, &e);
		hp_cuda_sync(&e);
	}
	return d;
}

/* a device copy of the bytes at x; as int32 or double elements */
static inline void *ct_dev_bytes(const void *x, size_t bytes)
{
	struct hp_err e;
	void *d = ct_alloc(bytes + 8);

	hp_cuda_upload(d, x, bytes, &e);
	hp_cuda_sync(&e);
	return d;
}

static inline int32_t *ct_dev_i32(const int32_t *x, size_t n)
{
	return ct_dev_bytes(x, n * sizeof(*x));
}

static inline double *ct_dev_f64(const double *x, size_t n)
{
	return ct_dev_bytes(x, n * sizeof(*x));
}

/* host fp32 copy of device d (fp32 or bf16); synchronises; caller frees */
static inline float *ct_host(const void *d, size_t n, int bf)
{
	struct hp_err e;
	float *h = malloc(n * 4 + 4);

	if (bf) {
		hp_bf16 *b = malloc(n * 2 + 2);
		hp_cuda_download(b, d, n * 2, &e);
		for (size_t i = 0; i < n; i++)
			h[i] = hp_bf16_to_f32(b[i]);
		free(b);
	} else {
		hp_cuda_download(h, d, n * 4, &e);
	}
	return h;
}

static inline double *ct_host_f64(const double *d, size_t n)
{
	struct hp_err e;
	double *h = malloc(n * 8 + 8);

	hp_cuda_download(h, d, n * 8, &e);
	return h;
}

/* a device buffer of n NaNs, fp32 (bf 0) or bf16 (bf 1): an element an op
 * fails to write shows */
static inline void *ct_dnan(size_t n, int bf)
{
	float *h = malloc(n * sizeof(float) + 4);
	void *d;

	for (size_t i = 0; i < n; i++)
		h[i] = NAN;
	d = ct_dev(h, n, bf);
	free(h);
	return d;
}

/* elements of got and want whose bits differ (0: the same floats) */
static inline size_t ct_ndiff(const float *got, const float *want, size_t n)
{
	size_t d = 0;

	for (size_t i = 0; i < n; i++)
		d += memcmp(got + i, want + i, sizeof(float)) != 0;
	return d;
}

/* 1 when device buffers a and b hold the same bytes */
static inline int ct_dev_same(const void *a, const void *b, size_t bytes)
{
	struct hp_err e;
	unsigned char *x = malloc(bytes + 1), *y = malloc(bytes + 1);
	int same;

	hp_cuda_download(x, a, bytes, &e);
	hp_cuda_download(y, b, bytes, &e);
	same = !memcmp(x, y, bytes);
	free(x);
	free(y);
	return same;
}

/* ||got - want||_2 / max(||want||_2, floor): the normalised error; a floor
 * above 0 keeps outputs that are only rounding noise around zero from
 * dividing by nothing; INFINITY when got holds a NaN */
static inline double ct_nerr_floor(const float *got, const float *want, size_t n, double floor)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		double d = (double)got[i] - want[i];
		num += d * d;
		den += (double)want[i] * want[i];
	}
	if (num != num)
		return INFINITY;
	return sqrt(num / (den > floor * floor ? den : floor * floor));
}

/* normalised error: ||got - want||_2 / max(||want||_2, tiny) */
static inline double ct_nerr(const float *got, const float *want, size_t n)
{
	return ct_nerr_floor(got, want, n, 1e-15);
}

/* deterministic pseudo-random fill in [-a, a) */
static inline void ct_fill(float *x, size_t n, unsigned seed, float a)
{
	uint64_t s = 0x9e3779b97f4a7c15ull * (seed + 1);

	for (size_t i = 0; i < n; i++) {
		s ^= s << 13; s ^= s >> 7; s ^= s << 17;
		x[i] = a * (2.0f * (float)((s >> 40) & 0xffffff) / 16777216.0f - 1.0f);
	}
}

/* n host floats in [-a, a), rounded to bf16 when rnd; caller frees */
static inline float *ct_hfill(size_t n, unsigned seed, float a, int rnd)
{
	float *x = malloc(n * sizeof(float) + 4);

	ct_fill(x, n, seed, a);
	if (rnd)
		ct_round(x, n);
	return x;
}

/* HP_CUDA_TEST_SMALL set: the small and awkward shapes only (under
 * compute-sanitizer, which is slow, and under t/cuemu) */
static inline int ct_small(void)
{
	return getenv("HP_CUDA_TEST_SMALL") != NULL;
}

/* HP_CUDA_EMULATED set: the kernels run under t/cuemu (no tensor cores, a
 * host GEMM in place of cuBLASLt) */
static inline int ct_emulated(void)
{
	return getenv("HP_CUDA_EMULATED") != NULL;
}

/* 0 when the program should skip (no CUDA device), else 1 with device 0 set up */
static inline int ct_start(const char *what)
{
	struct hp_err e;
	char name[128];

	if (hp_cuda_device_count() == 0) {
		tap_skip("no CUDA device on this machine", "%s", what);
		return 0;
	}
	if (hp_cuda_init(0, &e)) {
		tap_ok(0, "cuda init: %s", e.msg);
		return 0;
	}
	if (hp_cuda_device_name(0, name, sizeof(name), &e) == 0)
		tap_diag("device 0: %s", name);
	return 1;
}

#endif
