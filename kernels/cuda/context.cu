/*
 * context.cu - the CUDA kernels' process-wide state: the device, the one
 * stream every kernel runs on, device memory and copies.  A copy's or
 * memset's launch error is left pending for hp_cuda_sync/hp_cuda_check,
 * as a kernel's is.
 */
#include <stdlib.h>
#include <stdio.h>

#include "cuda/common.cuh"

extern "C" {
#include "base/alloc.h"
}
#include <dlfcn.h>

cudaStream_t hp_cu_stream;
static int inited = -1;

/* Overlapping copies go through this scratch, grown to the largest: the
 * copy engine's areas may not overlap (cudaMemcpyAsync), and a kernel
 * cannot move a range onto itself in parallel.  The backend's copies
 * rarely overlap, so it is usually never made. */
static void *mv_buf;
static size_t mv_cap;

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

/* gemm.cu's cuBLASLt handle and workspace */
extern "C" int hp_cu_gemm_init(struct hp_err *e);
extern "C" void hp_cu_gemm_fini(void);

extern "C" int hp_cuda_init(int dev, struct hp_err *e)
{
	int n = hp_cuda_device_count();

	if (inited >= 0)
		return inited == dev ? 0 : hp_err_set(e, HP_EINVAL, "cuda: already using device %d, asked for %d", inited, dev);
	if (dev < 0 || dev >= n)
		return hp_err_set(e, HP_ECUDA, "cuda: device %d asked for, %d visible", dev, n);
	CK(cudaSetDevice(dev));
	CK(cudaStreamCreateWithFlags(&hp_cu_stream, cudaStreamNonBlocking));
	if (hp_cu_gemm_init(e))
		return HP_ECUDA;
	inited = dev;
	return 0;
}

int hp_cu_dlopen(const char *const *names, int nnames, const struct hp_cu_sym *syms, int nsyms,
		 struct hp_err *e)
{
	void *h = NULL;

	for (int i = 0; !h && i < nnames; i++)
		h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return hp_err_set(e, HP_ECUDA, "cuda: cannot open %s: %s", names[0], dlerror());
	for (int i = 0; i < nsyms; i++)
		if (!*syms[i].slot && !(*syms[i].slot = dlsym(h, syms[i].name)))
			return hp_err_set(e, HP_ECUDA, "cuda: %s has no function %s", names[0], syms[i].name);
	return 0;
}

/* Scratch outgrown while the run goes on: freed at hp_cuda_fini, not now.
 * cudaFree waits for the whole device, and a collective in flight on
 * another stream may wait for a peer that waits for us (NCCL's rule: no
 * device-synchronizing call while its operations run). */
static void **retired;
static size_t nretired, retired_cap;

void hp_cu_retire(void *p)
{
	if (!p)
		return;
	if (nretired == retired_cap) {
		size_t cap = retired_cap ? 2 * retired_cap : 16;
		void **r = (void **)hp_realloc(retired, cap * sizeof(*r));

		if (!r) {
			/* no room to remember it: the old way, the device synchronised */
			cudaDeviceSynchronize();
			cudaFree(p);
			return;
		}
		retired = r;
		retired_cap = cap;
	}
	retired[nretired++] = p;
}

extern "C" void hp_cuda_fini(void)
{
	if (inited < 0)
		return;
	hp_cu_gemm_fini();
	cudaDeviceSynchronize();
	for (size_t i = 0; i < nretired; i++)
		cudaFree(retired[i]);
	hp_free(retired);
	retired = NULL;
	nretired = retired_cap = 0;
	cudaFree(mv_buf);
	mv_buf = NULL;
	mv_cap = 0;
	cudaStreamDestroy(hp_cu_stream);
	hp_cu_stream = 0;
	inited = -1;
}

extern "C" void *hp_cuda_stream(void)
{
	return (void *)hp_cu_stream;
}

extern "C" int hp_cuda_sync(struct hp_err *e)
{
	CK(cudaStreamSynchronize(hp_cu_stream));
	CK(cudaGetLastError());
	return 0;
}

extern "C" int hp_cuda_check(struct hp_err *e)
{
	CK(cudaGetLastError());
	return 0;
}

extern "C" void *hp_cuda_alloc(size_t bytes, struct hp_err *e)
{
	void *p = NULL;
	cudaError_t rc = cudaMalloc(&p, bytes ? bytes : 1);

	if (rc != cudaSuccess) {
		hp_err_set(e, HP_ECUDA, "cuda: cannot allocate %.1f MiB of device memory: %s",
			   (double)bytes / (1 << 20), cudaGetErrorString(rc));
		cudaGetLastError();
		return NULL;
	}
	/* on the stream every kernel runs on: the legacy default stream's
	 * cudaMemset is not ordered before a non-blocking stream's work */
	if ((rc = cudaMemsetAsync(p, 0, bytes, hp_cu_stream)) != cudaSuccess) {
		hp_err_set(e, HP_ECUDA, "cudaMemsetAsync: %s", cudaGetErrorString(rc));
		cudaFree(p);
		return NULL;
	}
	return p;
}

extern "C" void hp_cuda_free(void *p)
{
	if (p)
		cudaFree(p);
}

extern "C" void *hp_cuda_host_alloc(size_t bytes, struct hp_err *e)
{
	void *p = NULL;
	cudaError_t rc = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);

	if (rc != cudaSuccess) {
		hp_err_set(e, HP_ECUDA, "cuda: cannot pin %.1f MiB of host memory: %s", (double)bytes / (1 << 20),
			   cudaGetErrorString(rc));
		cudaGetLastError();
		return NULL;
	}
	return p;
}

extern "C" void hp_cuda_host_free(void *p)
{
	if (p)
		cudaFreeHost(p);
}

extern "C" void *hp_cuda_mark_new(struct hp_err *e)
{
	cudaEvent_t ev;
	cudaError_t rc = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);

	if (rc != cudaSuccess) {
		hp_err_set(e, HP_ECUDA, "cudaEventCreateWithFlags: %s", cudaGetErrorString(rc));
		return NULL;
	}
	return ev;
}

extern "C" void hp_cuda_mark_free(void *mk)
{
	if (mk)
		cudaEventDestroy((cudaEvent_t)mk);
}

extern "C" int hp_cuda_mark_record(void *mk, struct hp_err *e)
{
	CK(cudaEventRecord((cudaEvent_t)mk, hp_cu_stream));
	return 0;
}

extern "C" int hp_cuda_mark_passed(void *mk)
{
	return cudaEventQuery((cudaEvent_t)mk) != cudaErrorNotReady;
}

extern "C" int hp_cuda_mark_wait(void *mk, struct hp_err *e)
{
	CK(cudaEventSynchronize((cudaEvent_t)mk));
	return 0;
}

extern "C" void *hp_cuda_timer_new(int n, struct hp_err *e)
{
	cudaEvent_t *ev = (cudaEvent_t *)calloc((size_t)n, sizeof(*ev));
	cudaError_t rc = cudaSuccess;
	int i;

	if (!ev) {
		hp_err_set(e, HP_ENOMEM, "out of host memory for %d timing events", n);
		return NULL;
	}
	for (i = 0; i < n && rc == cudaSuccess; i++)
		rc = cudaEventCreate(&ev[i]);
	if (rc != cudaSuccess) {
		hp_err_set(e, HP_ECUDA, "cudaEventCreate: %s", cudaGetErrorString(rc));
		hp_cuda_timer_free(ev, i - 1);
		return NULL;
	}
	return ev;
}

extern "C" void hp_cuda_timer_free(void *t, int n)
{
	cudaEvent_t *ev = (cudaEvent_t *)t;

	for (int i = 0; ev && i < n; i++)
		cudaEventDestroy(ev[i]);
	free(ev);
}

extern "C" void hp_cuda_timer_mark(void *t, int i)
{
	cudaEventRecord(((cudaEvent_t *)t)[i], hp_cu_stream);
}

extern "C" double hp_cuda_timer_ms(void *t, int i, int j)
{
	float ms = 0;

	cudaEventElapsedTime(&ms, ((cudaEvent_t *)t)[i], ((cudaEvent_t *)t)[j]);
	return ms;
}

extern "C" int hp_cuda_upload(void *dst, const void *src, size_t bytes, struct hp_err *e)
{
	CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, hp_cu_stream));
	return 0;
}

extern "C" int hp_cuda_download(void *dst, const void *src, size_t bytes, struct hp_err *e)
{
	CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, hp_cu_stream));
	CK(cudaStreamSynchronize(hp_cu_stream));
	return 0;
}

extern "C" void hp_cuda_zero(void *p, size_t bytes)
{
	cudaMemsetAsync(p, 0, bytes, hp_cu_stream);
}

extern "C" void hp_cuda_copy(void *dst, const void *src, size_t bytes)
{
	const char *d = (const char *)dst, *s = (const char *)src;

	if (!bytes || dst == src)
		return;
	if (d + bytes <= s || s + bytes <= d) {
		cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, hp_cu_stream);
		return;
	}
	if (bytes > mv_cap) {
		hp_cu_retire(mv_buf);   /* an earlier copy may still read it */
		mv_buf = NULL;
		mv_cap = 0;
		if (cudaMalloc(&mv_buf, bytes) != cudaSuccess)
			return;   /* the error stays pending for hp_cuda_sync */
		mv_cap = bytes;
	}
	cudaMemcpyAsync(mv_buf, src, bytes, cudaMemcpyDeviceToDevice, hp_cu_stream);
	cudaMemcpyAsync(dst, mv_buf, bytes, cudaMemcpyDeviceToDevice, hp_cu_stream);
}

/* rows of width bytes between pitched buffers, one copy engine call */
extern "C" void hp_cuda_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows)
{
	if (width && rows)
		cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, hp_cu_stream);
}

extern "C" int hp_cuda_mem_info(size_t *free_b, size_t *total_b, struct hp_err *e)
{
	CK(cudaMemGetInfo(free_b, total_b));
	return 0;
}
