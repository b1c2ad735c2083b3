/*
 * ce.cu - cross-entropy on fp32 logits: the loss (summed on the host), its
 * gradient (in place allowed), and the three device passes of the
 * vocabulary-parallel form.  What it is not: the LM head's GEMM (gemm.cu)
 * or the collectives between the vocabulary-parallel passes (the backend's).
 *
 * One block per row, the algebra of kernels/cpu/crossentropy.c step for
 * step: the row's max in fp32 (exact in any order), each exponential an
 * expf of (logit - max), their sum in double (a block sum: another order
 * than the CPU's, a difference in the last bits of a double), the loss
 * log(sum) + max - logit[t] in double, the gradient's scale / sum rounded
 * to float once and the products kept unfused.  The loss of a row is
 * written to device scratch in double and the rows are summed on the host
 * in row order, as hp_cross_entropy_fwd sums them; so the loss differs from
 * the CPU's only by expf's last ulp and the order of the exponentials' sum.
 *
 * Deterministic: block sums in a fixed shape, no atomics.
 */
#include <math.h>

#include "cuda/common.cuh"

extern "C" {
#include "base/alloc.h"
}

/* threads for rows of V: enough to keep a 150k-entry vocabulary's row
 * from being a single block's long loop, few for small rows */
static unsigned ce_threads(int V)
{
	return V >= 8192 ? 1024 : V >= 1024 ? 256 : 64;
}

/* blocks for n rows (the kernels loop over the rest) */
static unsigned ce_blocks(long n)
{
	return (unsigned)(n < (1L << 20) ? n : (1L << 20));
}

/* the largest logit of row l (fmaxf skips NaN as the CPU's > does) */
static __device__ __forceinline__ float row_max(const float *l, int V, float *sh)
{
	float m = -INFINITY;

	for (int v = threadIdx.x; v < V; v += blockDim.x)
		m = fmaxf(m, l[v]);
	return block_max(m, sh);
}

/* sum over the row of exp(l - mx), each term an fp32 expf, the sum in double */
static __device__ __forceinline__ double row_expsum(const float *l, int V, float mx, double *sh)
{
	double s = 0;

	for (int v = threadIdx.x; v < V; v += blockDim.x)
		s += expf(l[v] - mx);
	return block_sum(s, sh);
}

/* ---- the loss: per-row losses, then their sum, on the device ---- */

/* loss[r] = log(sum exp) + max - logit[t]; 0 for -100, NaN for a target
 * out of range (the caller checks targets: this only keeps it visible) */
static __global__ void k_ce_loss(double *loss, const float *logits, const int32_t *targets, long n, int V)
{
	__shared__ float shf[32];
	__shared__ double shd[32];

	for (long r = blockIdx.x; r < n; r += gridDim.x) {
		const float *l = logits + r * V;
		int t = targets[r];

		/* t is the same for the whole block: no divergent __syncthreads */
		if (t < 0 || t >= V) {
			if (threadIdx.x == 0)
				loss[r] = t == -100 ? 0.0 : (double)NAN;
			continue;
		}
		float mx = row_max(l, V, shf);
		double se = row_expsum(l, V, mx, shd);
		if (threadIdx.x == 0)
			loss[r] = log(se) + mx - l[t];
	}
}

/* one thread adds the rows' losses in row order onto *acc: the CPU's
 * order (hp_cross_entropy_fwd), and no host round trip */
static __global__ void k_ce_acc(double *acc, const double *loss, long n)
{
	double s = 0;

	for (long r = 0; r < n; r++)
		s += loss[r];
	*acc += s;
}

/* device scratch for the per-row losses, grown to the most rows asked for
 * (the old one retired once the stream is past it) */
static double *ce_dev;
static long ce_cap;

static int ce_grow(long n, struct hp_err *e)
{
	if (n > ce_cap) {
		hp_cu_retire(ce_dev);
		ce_dev = NULL;
		ce_cap = 0;
		CK(cudaMalloc(&ce_dev, (size_t)n * sizeof(double)));
		ce_cap = n;
	}
	return 0;
}

extern "C" int hp_cuda_ce_loss(double *acc, const float *logits, const int32_t *targets, long n, int V,
			       struct hp_err *e)
{
	if (n <= 0)
		return 0;
	if (ce_grow(n, e))
		return e->code;
	k_ce_loss<<<ce_blocks(n), ce_threads(V), 0, hp_cu_stream>>>(ce_dev, logits, targets, n, V);
	/* an ignored row's 0 adds nothing */
	k_ce_acc<<<1, 1, 0, hp_cu_stream>>>(acc, ce_dev, n);
	CK(cudaGetLastError());
	return 0;
}

/* ---- the gradient: scale * (softmax - onehot), zero rows for -100 ---- */

/* d may be l: each thread reads and writes only its own columns */
static __global__ void k_ce_bwd(float *dlogits, const float *logits, const int32_t *targets, long n, int V,
				float scale)
{
	__shared__ float shf[32];
	__shared__ double shd[32];

	for (long r = blockIdx.x; r < n; r += gridDim.x) {
		const float *l = logits + r * V;
		float *d = dlogits + r * V;
		int t = targets[r];

		if (t < 0 || t >= V) {    /* -100 (anything else is the caller's bug): no gradient */
			for (int v = threadIdx.x; v < V; v += blockDim.x)
				d[v] = 0.0f;
			continue;
		}
		float mx = row_max(l, V, shf);
		/* the exponentials kept in d, then scaled in place: crossentropy.c's order */
		double s = 0;
		for (int v = threadIdx.x; v < V; v += blockDim.x) {
			float ev = expf(l[v] - mx);
			d[v] = ev;
			s += ev;
		}
		double se = block_sum(s, shd);
		float k = (float)(scale / se);
		for (int v = threadIdx.x; v < V; v += blockDim.x) {
			float p = __fmul_rn(d[v], k);
			d[v] = v == t ? __fsub_rn(p, scale) : p;
		}
	}
}

extern "C" void hp_cuda_ce_bwd(float *dlogits, const float *logits, const int32_t *targets, long n, int V, float scale)
{
	if (n > 0 && V > 0)
		k_ce_bwd<<<ce_blocks(n), ce_threads(V), 0, hp_cu_stream>>>(dlogits, logits, targets, n, V, scale);
}

/* ---- vocabulary-parallel: hp_vp_ce_max, _sums, _bwd on this rank's Vl columns ---- */

static __global__ void k_vp_max(float *mx, const float *logits, long N, int Vl)
{
	__shared__ float sh[32];

	for (long r = blockIdx.x; r < N; r += gridDim.x) {
		float m = row_max(logits + r * Vl, Vl, sh);
		if (threadIdx.x == 0)
			mx[r] = m;
	}
}

/* stats[2r] = sum exp(l - mx[r]) (double); stats[2r+1] = the target's logit
 * when it is one of these columns, else 0 */
static __global__ void k_vp_sums(double *stats, const float *logits, const float *mx, const int32_t *targets, long N,
				 int Vl, int v0)
{
	__shared__ double sh[32];

	for (long r = blockIdx.x; r < N; r += gridDim.x) {
		const float *l = logits + r * Vl;
		double se = row_expsum(l, Vl, mx[r], sh);
		if (threadIdx.x == 0) {
			long t = (long)targets[r] - v0;
			stats[2 * r] = se;
			stats[2 * r + 1] = targets[r] != -100 && t >= 0 && t < Vl ? (double)l[t] : 0.0;
		}
	}
}

/* loss[r] = log(sum) + mx - the target's logit (hp_vp_ce_loss's terms, in
 * its order); 0 for -100 */
static __global__ void k_vp_loss(double *loss, const double *stats, const float *mx, const int32_t *targets, long N)
{
	HP_CU_GRID_STRIDE(r, (size_t)N)
		loss[r] = targets[r] == -100 ? 0.0 : log(stats[2 * r]) + (double)mx[r] - stats[2 * r + 1];
}

/* d = (float)(exp(l - mx) / sum) * scale, minus scale at a local target */
static __global__ void k_vp_bwd(float *dlogits, const float *logits, const double *stats, const float *mx,
				const int32_t *targets, long N, int Vl, int v0, float scale)
{
	for (long r = blockIdx.x; r < N; r += gridDim.x) {
		const float *l = logits + r * Vl;
		float *d = dlogits + r * Vl;
		long t = (long)targets[r] - v0;

		if (targets[r] == -100) {
			for (int v = threadIdx.x; v < Vl; v += blockDim.x)
				d[v] = 0.0f;
			continue;
		}
		double inv = 1.0 / stats[2 * r];
		float m = mx[r];
		for (int v = threadIdx.x; v < Vl; v += blockDim.x) {
			float p = __fmul_rn((float)(expf(l[v] - m) * inv), scale);
			d[v] = v == t ? __fsub_rn(p, scale) : p;
		}
	}
}

extern "C" int hp_cuda_vp_ce_loss(double *acc, const double *stats, const float *mx, const int32_t *targets, long N,
				  struct hp_err *e)
{
	if (N <= 0)
		return 0;
	if (ce_grow(N, e))
		return e->code;
	k_vp_loss<<<hp_cu_blocks((size_t)N, 256), 256, 0, hp_cu_stream>>>(ce_dev, stats, mx, targets, N);
	k_ce_acc<<<1, 1, 0, hp_cu_stream>>>(acc, ce_dev, N);
	CK(cudaGetLastError());
	return 0;
}

extern "C" void hp_cuda_vp_ce_max(float *mx, const float *logits, long N, int Vl)
{
	if (N > 0)
		k_vp_max<<<ce_blocks(N), ce_threads(Vl), 0, hp_cu_stream>>>(mx, logits, N, Vl);
}

extern "C" void hp_cuda_vp_ce_sums(double *stats, const float *logits, const float *mx, const int32_t *targets,
				   long N, int Vl, int v0)
{
	if (N > 0)
		k_vp_sums<<<ce_blocks(N), ce_threads(Vl), 0, hp_cu_stream>>>(stats, logits, mx, targets, N, Vl, v0);
}

extern "C" void hp_cuda_vp_ce_bwd(float *dlogits, const float *logits, const double *stats, const float *mx,
				  const int32_t *targets, long N, int Vl, int v0, float scale)
{
	if (N > 0 && Vl > 0)
		k_vp_bwd<<<ce_blocks(N), ce_threads(Vl), 0, hp_cu_stream>>>(dlogits, logits, stats, mx, targets, N, Vl,
									    v0, scale);
}
