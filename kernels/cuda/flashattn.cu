/*
 * flashattn.cu - causal grouped-query flash attention (FlashAttention-2) on
 * bf16 tensors, forward and deterministic backward, for sm_80 and later.
 *
 * The same function as kernels/cpu/flashattn.c (hp_flash_attention_fwd/bwd):
 * query i of a row sees keys j with lo_i <= j <= i, lo_i = seg[b*T + i]
 * (0 without seg), scale 1/sqrt(D), softmax in fp32, lse = log(sum exp) in
 * [B, Hq, T]; query head h reads kv head h / (Hq / Hkv).
 *
 * Tiles: 64 queries (4 warps of 16 rows) by 64 keys, rows of D bf16 staged
 * in shared memory with 8 bf16 of padding per row (row strides of 72 or
 * 136 bf16 put the 8 rows a fragment load touches on different banks).
 * Products run on the tensor cores through mma.sync.m16n8k16 (bf16 in,
 * fp32 accumulators), fragments read from shared memory with plain 32-bit
 * and 16-bit loads (layouts: PTX ISA, "Matrix Fragments for mma.m16n8k16
 * with floating point type"):
 *   A (16x16, row major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..],
 *                         a[2] = A[g][2t+8..],   a[3] = A[g+8][2t+8..]
 *   B (16x8, B[k][n]):    b0 = B[2t..2t+1][g],   b1 = B[2t+8..2t+9][g]
 *   C (16x8, fp32):       c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..]
 * with g = lane / 4, t = lane % 4, the lower index in the low 16 bits.  An
 * accumulator of two neighbouring n-tiles is, element for element, the A
 * fragment of the next product (P V, P^T dO, ...), so P never leaves the
 * registers.  Tiles that a block walks through (K, V in the forward and
 * for dQ; Q, dO for dK, dV) are double-buffered: cp.async copies the next
 * one while the tensor cores work on this one.
 *
 * Forward (fa_fwd): one block per (query tile, head, batch row).  Scores live in the log2 domain
 * (x = s * scale * log2 e, exp2f), the running max m and partial sums l per
 * row in registers (online softmax); P is rounded to bf16 for P V, l sums
 * it in fp32.
 *
 * Backward: Di = rowsum(dO * O) into scratch (fa_bwd_dot), then
 *  - fa_bwd_dkdv: one block per (key tile, kv head, batch row); each warp
 *    owns 16 keys and keeps their dK, dV in fp32 registers over every query
 *    tile of every query head of the group, recomputing P^T = exp(S^T - lse)
 *    for 16 queries at a time;
 *  - fa_bwd_dq: one block per (query tile, head, batch row) over the key
 *    tiles, dQ in registers.
 * A query whose lse is +inf (a row the caller pads, hp_cuda_fill_inf) has
 * P = dS = 0 by a select, not by a product, so that its Di cannot bring a
 * NaN into dK, dV; its q and dout rows still enter the tensor-core
 * products (multiplied by those zeros), so they must be finite - the
 * backend pads with zero rows.
 * Every output element is summed by one thread in a fixed order: no
 * atomics on floats, the same bits every run.  Tiles no query of a block
 * (or warp) can see are skipped: keys after the block's last query, keys
 * before its earliest document start, queries whose documents start after
 * the key tile ends (seg is non-decreasing along a row, as cpu/ops.h says).
 *
 * Grids are (head, tile, batch row) with x the fastest, so blocks start
 * heaviest tiles first across all heads: the last query tiles of a row
 * (forward, dQ), the first key tiles (dK, dV).
 *
 * Requirements beyond ops.h: every tensor pointer 16-byte aligned
 * (cudaMalloc'd buffers and 16-byte aligned offsets into them); T / 64 and
 * B at most 65535 (grid y and z).
 *
 * Resources at D = 128: 85 KiB of shared memory in the forward, 102 KiB in
 * the backward kernels, about 220 registers a thread: two blocks (8 warps)
 * to an SM.
 */
#include <math.h>
#include <limits.h>
#include <string.h>

#include "cuda/common.cuh"

#define FA_BM 64            /* queries of a tile: 4 warps of 16 rows */
#define FA_BN 64            /* keys of a tile */
#define FA_NT 128           /* threads of a block */
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

/* ---- fragments ---- */

static __device__ __forceinline__ void mma16816(float c[4], const unsigned a[4], unsigned b0, unsigned b1)
{
	asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
	    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
	    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* two bf16 next to each other (p 4-byte aligned) */
static __device__ __forceinline__ unsigned ld32(const hp_bf16 *p)
{
	return *(const unsigned *)p;
}

/* p[0] in the low half, p[ld] in the high half: two rows of one column */
static __device__ __forceinline__ unsigned ld2rows(const hp_bf16 *p, int ld)
{
	return (unsigned)p[0] | ((unsigned)p[ld] << 16);
}

/* bf16(lo) in the low half, bf16(hi) in the high half, round to nearest even */
static __device__ __forceinline__ unsigned pack_bf2(float lo, float hi)
{
	__nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
	unsigned u;

	memcpy(&u, &v, 4);
	return u;
}

/* The A fragment of rows 0..15, columns 0..15 of the tile at s (stride ld). */
static __device__ __forceinline__ void ld_afrag(unsigned a[4], const hp_bf16 *s, int ld, int g, int t)
{
	const hp_bf16 *p = s + g * ld + 2 * t;

	a[0] = ld32(p);
	a[1] = ld32(p + 8 * ld);
	a[2] = ld32(p + 8);
	a[3] = ld32(p + 8 * ld + 8);
}

/* The A fragment (16 rows x 16 columns) of the accumulators c0 (columns
 * 0..7) and c1 (columns 8..15), rounded to bf16. */
static __device__ __forceinline__ void acc_to_afrag(unsigned a[4], const float c0[4], const float c1[4])
{
	a[0] = pack_bf2(c0[0], c0[1]);
	a[1] = pack_bf2(c0[2], c0[3]);
	a[2] = pack_bf2(c1[0], c1[1]);
	a[3] = pack_bf2(c1[2], c1[3]);
}

/* Asynchronous copies global -> shared (cp.async, sm_80+): 16 bytes
 * bypassing L1, or 4 bytes; they land by the next cp_async_wait_all of the
 * issuing thread, visible to the block after the __syncthreads that
 * follows it. */
static __device__ __forceinline__ void cp_async16(void *s, const void *g)
{
	unsigned a = (unsigned)__cvta_generic_to_shared(s);

	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(a), "l"(g) : "memory");
}

static __device__ __forceinline__ void cp_async4(void *s, const void *g)
{
	unsigned a = (unsigned)__cvta_generic_to_shared(s);

	asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(a), "l"(g) : "memory");
}

static __device__ __forceinline__ void cp_async_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::: "memory");
}

static __device__ __forceinline__ void cp_async_wait_all(void)
{
	asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* Start copying rows [0, n) of a tile of FA_BN rows of D bf16 from g (row
 * stride gs elements) into shared s (row stride D + 8); rows n.. are zeroed
 * (so that padding multiplies as 0, never as a stale NaN).  All threads
 * call it; the data is there after cp_async_wait_all + __syncthreads. */
template <int D>
static __device__ __forceinline__ void fa_load_tile(hp_bf16 *s, const hp_bf16 *__restrict__ g, long gs, int n)
{
	constexpr int CH = D / 8, LD = D + 8;

	for (int idx = threadIdx.x; idx < FA_BN * CH; idx += FA_NT) {
		int r = idx / CH, c = idx % CH;
		hp_bf16 *d = s + r * LD + c * 8;
		if (r < n)
			cp_async16(d, g + r * gs + c * 8);
		else
			*(uint4 *)d = make_uint4(0, 0, 0, 0);
	}
}

/* The document start of query row i of row-block sg (0 without seg),
 * clamped to >= 0 so that no tile loads before the row. */
static __device__ __forceinline__ int fa_lo(const int32_t *__restrict__ sg, int i)
{
	return sg ? max(sg[i], 0) : 0;
}

/* ---- forward ---- */

template <int D>
static __global__ void __launch_bounds__(FA_NT)
fa_fwd(hp_bf16 *__restrict__ out, float *__restrict__ lse, const hp_bf16 *__restrict__ q,
       const hp_bf16 *__restrict__ k, const hp_bf16 *__restrict__ v, const int32_t *__restrict__ seg,
       int T, int Hq, int Hkv, float scale)
{
	constexpr int LD = D + 8, KS = D / 16, DT = D / 8;
	extern __shared__ uint4 fa_smem[];
	/* Q, then two buffers of (K, V): the next tile loads during this one */
	hp_bf16 *sQ = (hp_bf16 *)fa_smem, *sKV = sQ + FA_BM * LD;
	__shared__ int sLo[FA_BM], sKlo;
	int qt = gridDim.y - 1 - blockIdx.y, h = blockIdx.x, b = blockIdx.z, kh = h / (Hq / Hkv);
	int q0 = qt * FA_BM, rows = min(FA_BM, T - q0);
	int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	long qs = (long)Hq * D, ks = (long)Hkv * D;
	const int32_t *sg = seg ? seg + (long)b * T : NULL;
	const hp_bf16 *kb = k + (long)b * T * ks + (long)kh * D, *vb = v + (long)b * T * ks + (long)kh * D;
	float sl2 = scale * FA_LOG2E;

	if (tid == 0)
		sKlo = INT_MAX;
	__syncthreads();
	if (tid < FA_BM) {
		int lo = tid < rows ? fa_lo(sg, q0 + tid) : INT_MAX;   /* INT_MAX: a padding row sees nothing */
		sLo[tid] = lo;
		if (tid < rows)
			atomicMin(&sKlo, lo);
	}
	__syncthreads();

	/* key tiles c0 = klo + it * FA_BN, it < ntl: from the earliest document
	 * start to the last query */
	int klo = sKlo, khi = q0 + rows - 1, ntl = klo <= khi ? (khi - klo) / FA_BN + 1 : 0;
	int wq0 = q0 + w * 16, ia = wq0 + g, ib = ia + 8, loa = sLo[w * 16 + g], lob = sLo[w * 16 + g + 8];
	unsigned qf[KS][4];
	float o[DT][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };

	fa_load_tile<D>(sQ, q + ((long)b * T + q0) * qs + (long)h * D, qs, rows);
	if (ntl > 0) {
		int n = min(FA_BN, khi + 1 - klo);
		fa_load_tile<D>(sKV, kb + (long)klo * ks, ks, n);
		fa_load_tile<D>(sKV + FA_BN * LD, vb + (long)klo * ks, ks, n);
	}
	cp_async_commit();
	cp_async_wait_all();
	__syncthreads();

	#pragma unroll
	for (int kk = 0; kk < KS; kk++)
		ld_afrag(qf[kk], sQ + w * 16 * LD + kk * 16, LD, g, t);
	#pragma unroll
	for (int dt = 0; dt < DT; dt++)
		o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

	for (int it = 0; it < ntl; it++) {
		int c0 = klo + it * FA_BN;
		hp_bf16 *sK = sKV + (it & 1) * 2 * FA_BN * LD, *sV = sK + FA_BN * LD;
		if (it > 0) {
			/* tile it has landed, and every warp is done with tile
			 * it - 1, whose buffer the next tile takes */
			cp_async_wait_all();
			__syncthreads();
		}
		if (it + 1 < ntl) {
			int c1 = c0 + FA_BN, n = min(FA_BN, khi + 1 - c1);
			hp_bf16 *nK = sKV + ((it + 1) & 1) * 2 * FA_BN * LD;
			fa_load_tile<D>(nK, kb + (long)c1 * ks, ks, n);
			fa_load_tile<D>(nK + FA_BN * LD, vb + (long)c1 * ks, ks, n);
			cp_async_commit();
		}
		if (c0 > wq0 + 15 || wq0 >= T)    /* this warp's queries see none of these keys */
			continue;

		/* S = Q K^T, 16 queries x 64 keys */
		float s[8][4];
		#pragma unroll
		for (int nt = 0; nt < 8; nt++)
			s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
		#pragma unroll
		for (int kk = 0; kk < KS; kk++)
			#pragma unroll
			for (int nt = 0; nt < 8; nt++) {
				const hp_bf16 *p = sK + (nt * 8 + g) * LD + kk * 16 + 2 * t;
				mma16816(s[nt], qf[kk], ld32(p), ld32(p + 8));
			}

		/* scale into the log2 domain, mask to -inf, the rows' new max */
		float mx[2] = { -INFINITY, -INFINITY };
		#pragma unroll
		for (int nt = 0; nt < 8; nt++)
			#pragma unroll
			for (int e = 0; e < 4; e++) {
				int hf = e >> 1, j = c0 + nt * 8 + 2 * t + (e & 1);
				int vis = hf ? (j >= lob && j <= ib) : (j >= loa && j <= ia);
				float x = vis ? s[nt][e] * sl2 : -INFINITY;
				s[nt][e] = x;
				mx[hf] = fmaxf(mx[hf], x);
			}
		float alpha[2], msub[2];
		#pragma unroll
		for (int hf = 0; hf < 2; hf++) {
			mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
			mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 2));
			float mn = fmaxf(m[hf], mx[hf]);
			/* a row that has seen nothing yet subtracts 0, not -inf */
			msub[hf] = mn == -INFINITY ? 0.0f : mn;
			alpha[hf] = exp2f(m[hf] - msub[hf]);
			m[hf] = mn;
		}

		/* P = exp2(x - m), this thread's part of the row sums */
		float ls[2] = { 0.0f, 0.0f };
		#pragma unroll
		for (int nt = 0; nt < 8; nt++)
			#pragma unroll
			for (int e = 0; e < 4; e++) {
				float p = exp2f(s[nt][e] - msub[e >> 1]);
				s[nt][e] = p;
				ls[e >> 1] += p;
			}
		l[0] = l[0] * alpha[0] + ls[0];
		l[1] = l[1] * alpha[1] + ls[1];
		#pragma unroll
		for (int dt = 0; dt < DT; dt++) {
			o[dt][0] *= alpha[0];
			o[dt][1] *= alpha[0];
			o[dt][2] *= alpha[1];
			o[dt][3] *= alpha[1];
		}

		/* O += P V, 16 keys at a time */
		#pragma unroll
		for (int kc = 0; kc < 4; kc++) {
			unsigned a[4];
			acc_to_afrag(a, s[2 * kc], s[2 * kc + 1]);
			#pragma unroll
			for (int dt = 0; dt < DT; dt++) {
				const hp_bf16 *p = sV + (kc * 16 + 2 * t) * LD + dt * 8 + g;
				mma16816(o[dt], a, ld2rows(p, LD), ld2rows(p + 8 * LD, LD));
			}
		}
	}

	/* the row sums over the quad, then out = O / l and lse = m ln 2 + ln l */
	#pragma unroll
	for (int hf = 0; hf < 2; hf++) {
		l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 1);
		l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 2);
	}
	#pragma unroll
	for (int hf = 0; hf < 2; hf++) {
		int i = hf ? ib : ia;
		if (i >= T)
			continue;
		float inv = l[hf] > 0.0f ? 1.0f / l[hf] : 0.0f;   /* no visible key: 0, lse -inf */
		hp_bf16 *op = out + ((long)b * T + i) * qs + (long)h * D + 2 * t;
		#pragma unroll
		for (int dt = 0; dt < DT; dt++)
			*(unsigned *)(op + dt * 8) = pack_bf2(o[dt][2 * hf] * inv, o[dt][2 * hf + 1] * inv);
		if (t == 0)
			lse[((long)b * Hq + h) * T + i] = l[hf] > 0.0f ? m[hf] * FA_LN2 + logf(l[hf]) : -INFINITY;
	}
}

/* ---- backward ---- */

/* Di[b, h, i] = dO . O over the D elements of (token b*T+i, head h): one
 * warp per (token, head), fixed butterfly order. */
template <int D>
static __global__ void fa_bwd_dot(float *__restrict__ di, const hp_bf16 *__restrict__ dout,
				  const hp_bf16 *__restrict__ out, int T, int Hq, long nrows)
{
	int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;

	for (long r = (long)blockIdx.x * wpb + (threadIdx.x >> 5); r < nrows; r += (long)gridDim.x * wpb) {
		const hp_bf16 *a = dout + r * D, *o = out + r * D;   /* [B*T, Hq*D]: (token, head) r = n*Hq + h */
		float s = 0.0f;
		for (int d = 2 * lane; d < D; d += 64) {
			unsigned ua = ld32(a + d), uo = ld32(o + d);
			s += bf2f((hp_bf16)(ua & 0xffffu)) * bf2f((hp_bf16)(uo & 0xffffu));
			s += bf2f((hp_bf16)(ua >> 16)) * bf2f((hp_bf16)(uo >> 16));
		}
		for (int off = 16; off > 0; off >>= 1)
			s += __shfl_xor_sync(0xffffffffu, s, off);
		if (lane == 0) {
			long tok = r / Hq;
			int h = (int)(r % Hq);
			di[(tok / T * Hq + h) * T + tok % T] = s;
		}
	}
}

/* The last query row i >= c0 with lo_i <= c_end (lo non-decreasing, so the
 * queries that see any key of [c0, c_end] are c0 .. that row). */
static __device__ int fa_last_row(const int32_t *__restrict__ sg, int T, int c0, int c_end)
{
	int lo = c0, hi = T - 1;

	if (!sg)
		return T - 1;
	if (sg[c0] > c_end)     /* only with a broken seg (seg[i] > i) */
		return c0 - 1;
	while (lo < hi) {
		int mid = lo + (hi - lo + 1) / 2;
		if (sg[mid] <= c_end)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

/* dK, dV of the keys [c0, c0 + 64) of kv head kh of row b: each warp owns
 * 16 keys and sums their dK, dV over every query that sees them, of every
 * query head of the group, 16 queries at a time:
 *   P^T = exp(S^T - lse)      dV += P^T dO
 *   dS^T = P^T (V dO^T - Di)  dK += dS^T Q   (scaled when written) */
template <int D>
static __global__ void __launch_bounds__(FA_NT)
fa_bwd_dkdv(hp_bf16 *__restrict__ dk, hp_bf16 *__restrict__ dv, const hp_bf16 *__restrict__ q,
	    const hp_bf16 *__restrict__ k, const hp_bf16 *__restrict__ v, const hp_bf16 *__restrict__ dout,
	    const float *__restrict__ lse, const float *__restrict__ di, const int32_t *__restrict__ seg,
	    int T, int Hq, int Hkv, float scale)
{
	constexpr int LD = D + 8, KS = D / 16, DT = D / 8;
	extern __shared__ uint4 fa_smem[];
	/* K, V, then two buffers of (Q, dO): the next query tile loads during
	 * this one; likewise its rows' document starts, lse and Di */
	hp_bf16 *sK = (hp_bf16 *)fa_smem, *sV = sK + FA_BN * LD, *sQO = sV + FA_BN * LD;
	__shared__ float sL[2][FA_BM], sD[2][FA_BM];
	__shared__ int sLo[2][FA_BM], sLast;
	int c0 = blockIdx.y * FA_BN, kh = blockIdx.x, b = blockIdx.z, group = Hq / Hkv;
	int n = min(FA_BN, T - c0);
	int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	long qs = (long)Hq * D, ks = (long)Hkv * D;
	const int32_t *sg = seg ? seg + (long)b * T : NULL;
	float sl2 = scale * FA_LOG2E;
	int ja = c0 + w * 16 + g, jb = ja + 8;     /* this thread's two keys */
	float dka[DT][4], dva[DT][4];

	if (tid == 0)
		sLast = fa_last_row(sg, T, c0, c0 + n - 1);
	#pragma unroll
	for (int dt = 0; dt < DT; dt++)
		#pragma unroll
		for (int e = 0; e < 4; e++)
			dka[dt][e] = dva[dt][e] = 0.0f;
	__syncthreads();

	/* steps st < nst: query head kh * group + st / nqk, query tile
	 * r0 = c0 + (st % nqk) * FA_BM - every query tile from the key tile's
	 * own to the last row that sees one of its keys */
	int ilast = sLast, nqk = ilast >= c0 ? (ilast - c0) / FA_BM + 1 : 0, nst = group * nqk;
	/* start loading step st into buffer bf */
	auto load_step = [&](int st, int bf) {
		int h = kh * group + st / nqk, r0 = c0 + st % nqk * FA_BM, nr = min(FA_BM, T - r0);
		hp_bf16 *dQ = sQO + bf * 2 * FA_BM * LD;
		long rl = ((long)b * Hq + h) * T + r0;
		fa_load_tile<D>(dQ, q + ((long)b * T + r0) * qs + (long)h * D, qs, nr);
		fa_load_tile<D>(dQ + FA_BM * LD, dout + ((long)b * T + r0) * qs + (long)h * D, qs, nr);
		if (tid < nr) {
			cp_async4(&sL[bf][tid], lse + rl + tid);
			cp_async4(&sD[bf][tid], di + rl + tid);
			if (sg)
				cp_async4(&sLo[bf][tid], sg + r0 + tid);
			else
				sLo[bf][tid] = 0;
		} else if (tid < FA_BM) {       /* rows past T see nothing */
			sLo[bf][tid] = INT_MAX;
			sL[bf][tid] = sD[bf][tid] = 0.0f;
		}
	};

	fa_load_tile<D>(sK, k + ((long)b * T + c0) * ks + (long)kh * D, ks, n);
	fa_load_tile<D>(sV, v + ((long)b * T + c0) * ks + (long)kh * D, ks, n);
	if (nst > 0)
		load_step(0, 0);
	cp_async_commit();
	for (int st = 0; st < nst; st++) {
		int bf = st & 1, r0 = c0 + st % nqk * FA_BM;
		const hp_bf16 *sQ = sQO + bf * 2 * FA_BM * LD, *sO = sQ + FA_BM * LD;
		const float *L = sL[bf], *Dd = sD[bf];
		const int *Lo = sLo[bf];
		/* step st has landed, and every warp is done with step st - 1,
		 * whose buffer the next step takes */
		cp_async_wait_all();
		__syncthreads();
		if (st + 1 < nst) {
			load_step(st + 1, bf ^ 1);
			cp_async_commit();
		}
		for (int qc = 0; qc < FA_BM; qc += 16) {
			/* no query here (i <= r0+qc+15) reaches this warp's first key */
			if (r0 + qc >= T || r0 + qc + 15 < c0 + w * 16)
				continue;
			/* S^T = K Q^T and dP^T = V dO^T, 16 keys x 16 queries */
			float s[2][4], dp[2][4];
			#pragma unroll
			for (int nt = 0; nt < 2; nt++)
				#pragma unroll
				for (int e = 0; e < 4; e++)
					s[nt][e] = dp[nt][e] = 0.0f;
			#pragma unroll
			for (int kk = 0; kk < KS; kk++) {
				unsigned ak[4], av[4];
				ld_afrag(ak, sK + w * 16 * LD + kk * 16, LD, g, t);
				ld_afrag(av, sV + w * 16 * LD + kk * 16, LD, g, t);
				#pragma unroll
				for (int nt = 0; nt < 2; nt++) {
					const hp_bf16 *pq = sQ + (qc + nt * 8 + g) * LD + kk * 16 + 2 * t;
					const hp_bf16 *po = sO + (qc + nt * 8 + g) * LD + kk * 16 + 2 * t;
					mma16816(s[nt], ak, ld32(pq), ld32(pq + 8));
					mma16816(dp[nt], av, ld32(po), ld32(po + 8));
				}
			}
			/* P^T (masked entries and padded queries, lse +inf,
			 * exactly 0), dS^T = P^T (dP^T - Di) (exactly 0 there too,
			 * whatever Di holds) */
			#pragma unroll
			for (int nt = 0; nt < 2; nt++)
				#pragma unroll
				for (int e = 0; e < 4; e++) {
					int r = qc + nt * 8 + 2 * t + (e & 1), i = r0 + r, j = e >> 1 ? jb : ja;
					int live = j >= Lo[r] && j <= i && L[r] != INFINITY;
					float p = live ? exp2f(s[nt][e] * sl2 - L[r] * FA_LOG2E) : 0.0f;
					s[nt][e] = p;
					dp[nt][e] = live ? p * (dp[nt][e] - Dd[r]) : 0.0f;
				}
			/* dV += P^T dO, dK += dS^T Q: B[k = query][n = d] */
			unsigned ap[4], as[4];
			acc_to_afrag(ap, s[0], s[1]);
			acc_to_afrag(as, dp[0], dp[1]);
			#pragma unroll
			for (int dt = 0; dt < DT; dt++) {
				const hp_bf16 *po = sO + (qc + 2 * t) * LD + dt * 8 + g;
				const hp_bf16 *pq = sQ + (qc + 2 * t) * LD + dt * 8 + g;
				mma16816(dva[dt], ap, ld2rows(po, LD), ld2rows(po + 8 * LD, LD));
				mma16816(dka[dt], as, ld2rows(pq, LD), ld2rows(pq + 8 * LD, LD));
			}
		}
	}
	cp_async_wait_all();    /* nothing left in flight at exit (nst == 0) */

	for (int hf = 0; hf < 2; hf++) {
		int j = hf ? jb : ja;
		if (j >= T)
			continue;
		long off = ((long)b * T + j) * ks + (long)kh * D + 2 * t;
		#pragma unroll
		for (int dt = 0; dt < DT; dt++) {
			*(unsigned *)(dk + off + dt * 8) = pack_bf2(scale * dka[dt][2 * hf], scale * dka[dt][2 * hf + 1]);
			*(unsigned *)(dv + off + dt * 8) = pack_bf2(dva[dt][2 * hf], dva[dt][2 * hf + 1]);
		}
	}
}

/* dQ of the queries [q0, q0 + 64) of head h of row b, over the key tiles
 * they see, 16 keys at a time:
 *   P = exp(S - lse)   dS = P (dO V^T - Di)   dQ += dS K   (scaled when written) */
template <int D>
static __global__ void __launch_bounds__(FA_NT)
fa_bwd_dq(hp_bf16 *__restrict__ dq, const hp_bf16 *__restrict__ q, const hp_bf16 *__restrict__ k,
	  const hp_bf16 *__restrict__ v, const hp_bf16 *__restrict__ dout, const float *__restrict__ lse,
	  const float *__restrict__ di, const int32_t *__restrict__ seg, int T, int Hq, int Hkv, float scale)
{
	constexpr int LD = D + 8, KS = D / 16, DT = D / 8;
	extern __shared__ uint4 fa_smem[];
	/* Q, dO, then two buffers of (K, V): the next tile loads during this one */
	hp_bf16 *sQ = (hp_bf16 *)fa_smem, *sO = sQ + FA_BM * LD, *sKV = sO + FA_BM * LD;
	__shared__ int sKlo;
	int qt = gridDim.y - 1 - blockIdx.y, h = blockIdx.x, b = blockIdx.z, kh = h / (Hq / Hkv);
	int q0 = qt * FA_BM, rows = min(FA_BM, T - q0);
	int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	long qs = (long)Hq * D, ks = (long)Hkv * D;
	const int32_t *sg = seg ? seg + (long)b * T : NULL;
	const hp_bf16 *kb = k + (long)b * T * ks + (long)kh * D, *vb = v + (long)b * T * ks + (long)kh * D;
	float sl2 = scale * FA_LOG2E;
	int wq0 = q0 + w * 16, ia = wq0 + g, ib = ia + 8;
	/* this thread's two queries: document start, lse (log2 units), Di;
	 * rows past T see nothing */
	int loa = ia < T ? fa_lo(sg, ia) : INT_MAX, lob = ib < T ? fa_lo(sg, ib) : INT_MAX;
	const float *lh = lse + ((long)b * Hq + h) * T, *dh = di + ((long)b * Hq + h) * T;
	float la = ia < T ? lh[ia] * FA_LOG2E : 0.0f, lb = ib < T ? lh[ib] * FA_LOG2E : 0.0f;
	float da = ia < T ? dh[ia] : 0.0f, db = ib < T ? dh[ib] : 0.0f;

	/* a padded query (lse +inf) sees nothing either: its dQ row is 0 */
	if (la == INFINITY) {
		loa = INT_MAX;
		la = da = 0.0f;
	}
	if (lb == INFINITY) {
		lob = INT_MAX;
		lb = db = 0.0f;
	}

	if (tid == 0)
		sKlo = INT_MAX;
	__syncthreads();
	if (tid < rows)
		atomicMin(&sKlo, fa_lo(sg, q0 + tid));
	__syncthreads();

	/* key tiles c0 = klo + it * FA_BN, it < ntl, as in the forward */
	int klo = sKlo, khi = q0 + rows - 1, ntl = klo <= khi ? (khi - klo) / FA_BN + 1 : 0;
	unsigned qf[KS][4], of[KS][4];
	float dqa[DT][4];

	fa_load_tile<D>(sQ, q + ((long)b * T + q0) * qs + (long)h * D, qs, rows);
	fa_load_tile<D>(sO, dout + ((long)b * T + q0) * qs + (long)h * D, qs, rows);
	if (ntl > 0) {
		int n = min(FA_BN, khi + 1 - klo);
		fa_load_tile<D>(sKV, kb + (long)klo * ks, ks, n);
		fa_load_tile<D>(sKV + FA_BN * LD, vb + (long)klo * ks, ks, n);
	}
	cp_async_commit();
	cp_async_wait_all();
	__syncthreads();

	#pragma unroll
	for (int kk = 0; kk < KS; kk++) {
		ld_afrag(qf[kk], sQ + w * 16 * LD + kk * 16, LD, g, t);
		ld_afrag(of[kk], sO + w * 16 * LD + kk * 16, LD, g, t);
	}
	#pragma unroll
	for (int dt = 0; dt < DT; dt++)
		dqa[dt][0] = dqa[dt][1] = dqa[dt][2] = dqa[dt][3] = 0.0f;

	for (int it = 0; it < ntl; it++) {
		int c0 = klo + it * FA_BN;
		const hp_bf16 *sK = sKV + (it & 1) * 2 * FA_BN * LD, *sV = sK + FA_BN * LD;
		if (it > 0) {
			/* tile it has landed, and every warp is done with tile
			 * it - 1, whose buffer the next tile takes */
			cp_async_wait_all();
			__syncthreads();
		}
		if (it + 1 < ntl) {
			int c1 = c0 + FA_BN, n = min(FA_BN, khi + 1 - c1);
			hp_bf16 *nK = sKV + ((it + 1) & 1) * 2 * FA_BN * LD;
			fa_load_tile<D>(nK, kb + (long)c1 * ks, ks, n);
			fa_load_tile<D>(nK + FA_BN * LD, vb + (long)c1 * ks, ks, n);
			cp_async_commit();
		}
		if (wq0 >= T)
			continue;
		for (int kc = 0; kc < FA_BN; kc += 16) {
			if (c0 + kc > wq0 + 15)    /* keys after this warp's last query */
				break;
			/* S = Q K^T and dP = dO V^T, 16 queries x 16 keys */
			float s[2][4], dp[2][4];
			#pragma unroll
			for (int nt = 0; nt < 2; nt++)
				#pragma unroll
				for (int e = 0; e < 4; e++)
					s[nt][e] = dp[nt][e] = 0.0f;
			#pragma unroll
			for (int kk = 0; kk < KS; kk++)
				#pragma unroll
				for (int nt = 0; nt < 2; nt++) {
					const hp_bf16 *pk = sK + (kc + nt * 8 + g) * LD + kk * 16 + 2 * t;
					const hp_bf16 *pv = sV + (kc + nt * 8 + g) * LD + kk * 16 + 2 * t;
					mma16816(s[nt], qf[kk], ld32(pk), ld32(pk + 8));
					mma16816(dp[nt], of[kk], ld32(pv), ld32(pv + 8));
				}
			/* P (masked entries exactly 0), dS = P (dP - Di) (exactly 0 there too) */
			#pragma unroll
			for (int nt = 0; nt < 2; nt++)
				#pragma unroll
				for (int e = 0; e < 4; e++) {
					int hf = e >> 1, j = c0 + kc + nt * 8 + 2 * t + (e & 1);
					int vis = hf ? (j >= lob && j <= ib) : (j >= loa && j <= ia);
					float p = vis ? exp2f(s[nt][e] * sl2 - (hf ? lb : la)) : 0.0f;
					dp[nt][e] = vis ? p * (dp[nt][e] - (hf ? db : da)) : 0.0f;
				}
			/* dQ += dS K: B[k = key][n = d] */
			unsigned as[4];
			acc_to_afrag(as, dp[0], dp[1]);
			#pragma unroll
			for (int dt = 0; dt < DT; dt++) {
				const hp_bf16 *pk = sK + (kc + 2 * t) * LD + dt * 8 + g;
				mma16816(dqa[dt], as, ld2rows(pk, LD), ld2rows(pk + 8 * LD, LD));
			}
		}
	}

	#pragma unroll
	for (int hf = 0; hf < 2; hf++) {
		int i = hf ? ib : ia;
		if (i >= T)
			continue;
		hp_bf16 *p = dq + ((long)b * T + i) * qs + (long)h * D + 2 * t;
		#pragma unroll
		for (int dt = 0; dt < DT; dt++)
			*(unsigned *)(p + dt * 8) = pack_bf2(scale * dqa[dt][2 * hf], scale * dqa[dt][2 * hf + 1]);
	}
}

/* ---- host side ---- */

/* Q and two buffers of (K, V): 85 KiB at D = 128 */
static size_t fa_smem_fwd(int D)
{
	return (size_t)(FA_BM + 4 * FA_BN) * (D + 8) * sizeof(hp_bf16);
}

/* Q, dO and two buffers of (K, V) (dQ); K, V and two of (Q, dO) (dK, dV):
 * 102 KiB at D = 128, two blocks to an SM */
static size_t fa_smem_bwd(int D)
{
	return (size_t)(2 * FA_BM + 4 * FA_BN) * (D + 8) * sizeof(hp_bf16);
}

/* Dynamic shared memory above 48 KiB must be allowed once per kernel. */
template <int D>
static void fa_setup(void)
{
	static int done;

	if (done)
		return;
	cudaFuncSetAttribute(fa_fwd<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fa_smem_fwd(D));
	cudaFuncSetAttribute(fa_bwd_dkdv<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fa_smem_bwd(D));
	cudaFuncSetAttribute(fa_bwd_dq<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fa_smem_bwd(D));
	done = 1;
}

static float fa_scale(int D)
{
	return 1.0f / sqrtf((float)D);      /* the CPU kernel's, to the bit */
}

template <int D>
static void fa_fwd_launch(hp_bf16 *out, float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
			  const int32_t *seg, int B, int T, int Hq, int Hkv)
{
	dim3 grid((unsigned)Hq, (unsigned)((T + FA_BM - 1) / FA_BM), (unsigned)B);

	fa_setup<D>();
	fa_fwd<D><<<grid, FA_NT, fa_smem_fwd(D), hp_cu_stream>>>(out, lse, q, k, v, seg, T, Hq, Hkv, fa_scale(D));
}

template <int D>
static void fa_bwd_launch(hp_bf16 *dq, hp_bf16 *dk, hp_bf16 *dv, const hp_bf16 *dout, const hp_bf16 *out,
			  const float *lse, const hp_bf16 *q, const hp_bf16 *k, const hp_bf16 *v,
			  const int32_t *seg, float *scratch, int B, int T, int Hq, int Hkv)
{
	long nrows = (long)B * T * Hq;
	dim3 gk((unsigned)Hkv, (unsigned)((T + FA_BN - 1) / FA_BN), (unsigned)B);
	dim3 gq((unsigned)Hq, (unsigned)((T + FA_BM - 1) / FA_BM), (unsigned)B);
	float scale = fa_scale(D);

	fa_setup<D>();
	fa_bwd_dot<D><<<hp_cu_blocks((size_t)nrows, 8), 256, 0, hp_cu_stream>>>(scratch, dout, out, T, Hq, nrows);
	fa_bwd_dkdv<D><<<gk, FA_NT, fa_smem_bwd(D), hp_cu_stream>>>(dk, dv, q, k, v, dout, lse, scratch, seg,
								     T, Hq, Hkv, scale);
	fa_bwd_dq<D><<<gq, FA_NT, fa_smem_bwd(D), hp_cu_stream>>>(dq, q, k, v, dout, lse, scratch, seg,
								   T, Hq, Hkv, scale);
}

/* The tensor-core kernels for head_dim 64 and 128; kernels/cuda/attn.cu
 * checks the call and dispatches here. */
extern "C" void hp_cu_flash_tc_fwd(hp_bf16 *out, float *lse, const hp_bf16 *q, const hp_bf16 *k,
				   const hp_bf16 *v, const int32_t *seg, int B, int T, int Hq, int Hkv, int D)
{
	if (D == 64)
		fa_fwd_launch<64>(out, lse, q, k, v, seg, B, T, Hq, Hkv);
	else
		fa_fwd_launch<128>(out, lse, q, k, v, seg, B, T, Hq, Hkv);
}

extern "C" void hp_cu_flash_tc_bwd(hp_bf16 *dq, hp_bf16 *dk, hp_bf16 *dv, const hp_bf16 *dout,
				   const hp_bf16 *out, const float *lse, const hp_bf16 *q, const hp_bf16 *k,
				   const hp_bf16 *v, const int32_t *seg, float *scratch, int B, int T, int Hq,
				   int Hkv, int D)
{
	if (D == 64)
		fa_bwd_launch<64>(dq, dk, dv, dout, out, lse, q, k, v, seg, scratch, B, T, Hq, Hkv);
	else
		fa_bwd_launch<128>(dq, dk, dv, dout, out, lse, q, k, v, seg, scratch, B, T, Hq, Hkv);
}
