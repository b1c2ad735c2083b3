/*
 * vmem.cu - device virtual memory (cuda/ops.h, hp_cuda_vm_*): an address
 * range reserved once, granules of physical memory mapped into it when a
 * unit's weights or gradients are gathered and unmapped when they go back.
 *
 * One physical allocation per granule, so that each can be unmapped alone
 * (cuMemUnmap takes whole mappings).  An unmapped granule waits in a
 * pending list until an event recorded on the stream at its release has
 * passed (kernels in flight may still read it; cuMemUnmap does not wait for
 * them), then goes to a pool that the next map takes from: no call here
 * synchronises the device.  The driver's functions come from libcuda by
 * dlopen, as cuBLASLt's do (gemm.cu): a CPU run never loads them.
 */
#include <cuda.h>

#include "cuda/common.cuh"

extern "C" {
#include "base/alloc.h"
}

#define VM_FUNCS(X) \
	X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) \
	X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAllocationGranularity) X(cuCtxGetDevice)

static struct {
#define X(f) decltype(&::f) f;
	VM_FUNCS(X)
#undef X
} D;

struct vpend { char *va; CUmemGenericAllocationHandle h; cudaEvent_t ev; };
/* a reservation: the handle mapped at each granule (0: none) */
struct vres { char *base; size_t bytes; CUmemGenericAllocationHandle *h; };

static size_t G;                                   /* the granule */
static CUmemAllocationProp prop;
static CUmemAccessDesc access_;
static struct vres *res;
static int nres;
static struct vpend *pend;
static size_t npend, cappend;
static CUmemGenericAllocationHandle *pool;          /* unmapped, free to map */
static size_t npool, cappool;
static cudaEvent_t *evs;                           /* events free to record */
static size_t nevs, capevs;

static int drv_open(struct hp_err *e)
{
	static const char *const names[] = { "libcuda.so.1" };
	static const struct hp_cu_sym syms[] = {
#define X(f) { #f, (void **)&D.f },
		VM_FUNCS(X)
#undef X
	};
	CUdevice dev;

	if (G)
		return 0;
	if (hp_cu_dlopen(names, 1, syms, (int)(sizeof(syms) / sizeof(syms[0])), e))
		return HP_ECUDA;
	if (D.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
		return hp_err_set(e, HP_ECUDA, "cuda: no current device for virtual memory");
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	access_.location = prop.location;
	access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	if (D.cuMemGetAllocationGranularity(&G, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !G)
		return hp_err_set(e, HP_ECUDA, "cuda: no allocation granularity for device %d", (int)dev);
	return 0;
}

/* grow *p (n elements of sz in use, *cap room) by one; 0 or -1 */
static int grow(void **p, size_t n, size_t *cap, size_t sz)
{
	void *q;

	if (n < *cap)
		return 0;
	if (!(q = hp_realloc(*p, (*cap ? 2 * *cap : 16) * sz)))
		return -1;
	*p = q;
	*cap = *cap ? 2 * *cap : 16;
	return 0;
}

static struct vres *res_of(const char *va)
{
	for (int i = 0; i < nres; i++)
		if (va >= res[i].base && va < res[i].base + res[i].bytes)
			return &res[i];
	return NULL;
}

/* the pending granules the stream has passed: unmapped, to the pool */
static void reap(void)
{
	size_t j = 0;

	for (size_t i = 0; i < npend; i++) {
		struct vpend *q = &pend[i];

		if (cudaEventQuery(q->ev) != cudaSuccess ||
		    grow((void **)&pool, npool, &cappool, sizeof(*pool)) ||
		    grow((void **)&evs, nevs, &capevs, sizeof(*evs))) {
			pend[j++] = *q;
			continue;
		}
		D.cuMemUnmap((CUdeviceptr)q->va, G);
		pool[npool++] = q->h;
		evs[nevs++] = q->ev;
	}
	cudaGetLastError();   /* cudaEventQuery's "not ready" */
	npend = j;
}

extern "C" void *hp_cuda_vm_reserve(size_t bytes, size_t *granule, struct hp_err *e)
{
	CUdeviceptr va;
	size_t n;

	if (drv_open(e))
		return NULL;
	n = (bytes + G - 1) / G * G;
	if (!n)
		n = G;
	struct vres *r = (struct vres *)hp_realloc(res, (size_t)(nres + 1) * sizeof(*res));
	if (!r) {
		hp_err_set(e, HP_ENOMEM, "cuda: out of host memory for a reservation");
		return NULL;
	}
	res = r;
	if (D.cuMemAddressReserve(&va, n, G, 0, 0) != CUDA_SUCCESS) {
		hp_err_set(e, HP_ECUDA, "cuda: cannot reserve %zu MiB of device addresses", n >> 20);
		return NULL;
	}
	if (!(res[nres].h = (CUmemGenericAllocationHandle *)hp_calloc(n / G, sizeof(*res[nres].h)))) {
		D.cuMemAddressFree(va, n);
		hp_err_set(e, HP_ENOMEM, "cuda: out of host memory for a reservation");
		return NULL;
	}
	res[nres].base = (char *)va;
	res[nres++].bytes = n;
	*granule = G;
	return (void *)va;
}

extern "C" int hp_cuda_vm_map(void *p, size_t bytes, struct hp_err *e)
{
	struct vres *r = res_of((char *)p);

	if (!r)
		return hp_err_set(e, HP_EINVAL, "cuda: %p is in no reservation", p);
	for (char *va = (char *)p; va < (char *)p + bytes; va += G) {
		size_t g = (size_t)(va - r->base) / G, i;
		CUmemGenericAllocationHandle h = 0;

		for (i = 0; i < npend && pend[i].va != va; i++)
			;
		if (i < npend) {   /* released, not yet unmapped: mapped still, and zero */
			if (grow((void **)&evs, nevs, &capevs, sizeof(*evs)))
				return hp_err_set(e, HP_ENOMEM, "cuda: out of host memory");
			evs[nevs++] = pend[i].ev;
			r->h[g] = pend[i].h;
			pend[i] = pend[--npend];
			continue;
		}
		if (!npool)
			reap();
		if (npool)
			h = pool[--npool];
		else if (D.cuMemCreate(&h, G, &prop, 0) != CUDA_SUCCESS)
			return hp_err_set(e, HP_ECUDA, "cuda: out of device memory mapping %zu MiB", bytes >> 20);
		if (D.cuMemMap((CUdeviceptr)va, G, 0, h, 0) != CUDA_SUCCESS ||
		    D.cuMemSetAccess((CUdeviceptr)va, G, &access_, 1) != CUDA_SUCCESS) {
			D.cuMemRelease(h);
			return hp_err_set(e, HP_ECUDA, "cuda: cannot map device memory at %p", (void *)va);
		}
		r->h[g] = h;
		CK(cudaMemsetAsync(va, 0, G, hp_cu_stream));
	}
	return 0;
}

extern "C" void hp_cuda_vm_unmap(void *p, size_t bytes)
{
	struct vres *r = res_of((char *)p);

	for (char *va = (char *)p; r && va < (char *)p + bytes; va += G) {
		size_t g = (size_t)(va - r->base) / G;
		cudaEvent_t ev = NULL;

		if (!r->h[g])
			continue;
		if (nevs)
			ev = evs[--nevs];
		else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess)
			ev = NULL;
		if (!ev || grow((void **)&pend, npend, &cappend, sizeof(*pend))) {
			/* no room to wait for it: it stays mapped, as if still in use */
			if (ev)
				evs[nevs++] = ev;
			continue;
		}
		cudaEventRecord(ev, hp_cu_stream);
		pend[npend++] = (struct vpend){ va, r->h[g], ev };
		r->h[g] = 0;
	}
	reap();
}

/* At the end (hp_cuda_fini has synchronised, or the run is over): every
 * mapping of the range goes, and the addresses. */
extern "C" void hp_cuda_vm_free(void *p, size_t bytes)
{
	struct vres *r = res_of((char *)p);

	(void)bytes;
	if (!r)
		return;
	cudaStreamSynchronize(hp_cu_stream);
	reap();
	for (size_t g = 0; g < r->bytes / G; g++)
		if (r->h[g]) {
			D.cuMemUnmap((CUdeviceptr)(r->base + g * G), G);
			D.cuMemRelease(r->h[g]);
		}
	for (size_t i = 0; i < npool; i++)
		D.cuMemRelease(pool[i]);
	npool = 0;
	D.cuMemAddressFree((CUdeviceptr)r->base, r->bytes);
	hp_free(r->h);
	*r = res[--nres];
}
