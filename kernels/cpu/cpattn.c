/*
 * cpattn.c - causal GQA attention of one context-parallel chunk of queries
 * against every key of their rows, forward and backward, F32.
 *
 * Under context parallelism a rank holds the queries at positions
 * q0 .. q0+Tq-1 of rows of S tokens and, after an all-gather, all S keys
 * and values.  The function is attention_fwd/attention_bwd's (HF eager
 * semantics, query head h reads kv head h / (Hq/Hkv) by index, the seg
 * block-diagonal causal mask of packed rows) restricted to the chunk's
 * query rows: the query at position p sees keys seg..p, where seg is the
 * position in the row where its document starts.  Only those keys are
 * read, so a chunk late in the row costs more than an early one.
 *
 * The computation is the flash kernel's (kernels/cpu/flashattn.c; read its
 * header first), with the query tiles offset by q0 in the row:
 *
 * Forward, per (batch, head, query tile of TB rows): key tiles from the
 * tile's earliest document start to its last position, scores computed
 * transposed (S^T = K Q^T, one vector lane per query), online softmax in
 * float with a running max m and a double sum l per query, the output
 * rescaled when m grows; lse = m + log(l), out = O / l.  When P is given,
 * its rows receive the scaled, masked scores of each key tile (-inf where
 * masked) and at the end P = exp(score - m) / l (so exactly 0 outside the
 * mask); P is written beside the computation, never read back by it, so
 * out and lse are the same bits with or without P.
 *
 * Backward, per (batch, kv head) - dk, dv of that head and dq of the query
 * heads of its group, so that work items write disjoint outputs - query
 * tiles outer and key tiles inner: Q, Q^T, dO, dO^T are built once per
 * query tile, K and V rows copied per key tile, and with the transposed
 * tiles (key rows, query lanes)
 *   P^T  = exp(scale K Q^T - lse)  (or P's entries, masked)
 *   dP^T = V dO^T                  dS^T = P^T * (dP^T - Di)
 *   dV  += P^T dO                  dK  += dS^T Q      dQ += dS K
 * with Di = rowsum(dO * O) when recomputing from lse (the flash identity)
 * and Di = rowsum(dP * P) when P is given (then out may be NULL): one more
 * pass over the query tile's key tiles, dP^T = V dO^T against P^T, before
 * the main one.  dQ accumulates on the stack for the query tile and is
 * scaled when written; dK and dV accumulate in dk and dv themselves, a
 * tile product at a time (dk scaled at the end), in a fixed order.  dk and
 * dv are this chunk's contributions to every key of the rows (zero for the
 * keys no query of the chunk sees); the caller sums them over the ranks.
 *
 * Exactness and determinism: the tile products are the flash kernel's
 * (each element one float sum in k order), compiled for AVX-512, AVX2 and
 * baseline x86-64 and picked per call (HP_FLASH=avx2 or baseline caps the
 * version, as for the flash kernel); every output element is computed by
 * one thread in a fixed order, so the results are bit-identical for any
 * thread count and version.  They match the eager kernels to float
 * rounding (t/unit/test-cpattn.c pins 1e-5 relative L2).
 *
 * Threads: the items - (batch, head, query tile) in the forward, heaviest
 * first, (batch, kv head) in the backward - go through an atomic counter
 * to hp_sgemm_threads() threads, or HP_CPATTN_THREADS (read on every call;
 * for tests and benchmarks), when the call is large enough to pay for
 * starting them.  The backward has only B * Hkv items.
 *
 * Head dims above CP_MAX_HEAD_DIM, or Hq not a multiple of Hkv, go to the
 * plain scalar loops at the end of the file (double-precision dot
 * products per (query, key); they need hp_cp_attention_scratch(S) floats
 * of scratch, the tiled kernel none).
 */
#include <math.h>
#include <pthread.h>

#include "cpu/gemm.h"
#include "cpu/ops.h"
#include "cpu/vec.h"

/* Compiled versions, as in flashattn.c: AVX-512, AVX2 and baseline x86-64
 * where GCC targets x86-64 (flatten inlines vec.h's helpers into each). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(HP_NO_CLONES)
#define CP_X86 1
#define CP_V4 __attribute__((target("arch=x86-64-v4"), flatten))
#define CP_V3 __attribute__((target("arch=x86-64-v3"), flatten))
#endif
#define CP_BASE __attribute__((flatten))
#define CP_INLINE static inline __attribute__((always_inline))

typedef float cp_v16 __attribute__((vector_size(64)));

/* Tiles as the flash kernel's: one buffer holds 64 rows of a head_dim
 * padded to 128; the forward keeps 5 and a score tile on the stack (about
 * 180 KiB), the backward 8 and two (about 300 KiB); worker threads get
 * CP_STACK bytes of stack. */
#define CP_TILE_FLOATS 8192
#define CP_MAX_TB 64
#define CP_MAX_HEAD_DIM 512
#define CP_STACK (4u << 20)
#define CP_MAX_THREADS 64
/* Below this many multiply-adds a call runs on the calling thread. */
#define CP_MIN_THREADED_MACS (1L << 23)

/* Keys per block of the scalar fallback's online softmax. */
#define CP_BLOCK 64

size_t hp_cp_attention_scratch(int S)
{
	return 2 * (size_t)(S > 0 ? S : 0);   /* the scalar fallback's probability and dS rows */
}

static int cp_dpad(int D)
{
	return (D + 15) & ~15;
}

/* Rows per tile: 64 for D <= 128, 32 for D <= 256, 16 for D <= 512. */
static int cp_tile(int D)
{
	int t = (CP_TILE_FLOATS / cp_dpad(D)) & ~15;

	return t > CP_MAX_TB ? CP_MAX_TB : t;
}

/* ---- tile products (flashattn.c's fa_mm8/fa_mm16, see there) ---- */

CP_INLINE cp_v16 cp_load16(const float *p)
{
	cp_v16 v;
	__builtin_memcpy(&v, p, sizeof(v));
	return v;
}

CP_INLINE void cp_store16(float *p, cp_v16 v)
{
	__builtin_memcpy(p, &v, sizeof(v));
}

/*
 * C[m][0..N) = (acc ? C[m][0..N) : 0) + sum_k A(m, k) * B[k][0..N) for
 * m < M, with A(m, k) = A[m*sam + k*sak] and N a multiple of 16; each
 * element summed in k order, one product rounded and added at a time, so
 * that every version gives the same bits.
 */
CP_INLINE void cp_mm8(int nv, int M, int N, int K, const float *A, long sam, long sak,
		      const float *B, long ldb, float *C, long ldc, int acc)
{
	for (int n = 0; n < N; n += 8 * nv) {
		int m = 0;
		for (; m + 4 <= M; m += 4) {
			const float *a = A + m * sam, *b = B + n;
			float *c = C + m * ldc + n;
			hp_v8 z = hp_v8_set1(0.0f), c00 = z, c01 = z, c10 = z, c11 = z;
			hp_v8 c20 = z, c21 = z, c30 = z, c31 = z;
			if (acc) {
				c00 = hp_v8_load(c), c10 = hp_v8_load(c + ldc);
				c20 = hp_v8_load(c + 2 * ldc), c30 = hp_v8_load(c + 3 * ldc);
				if (nv == 2)
					c01 = hp_v8_load(c + 8), c11 = hp_v8_load(c + ldc + 8),
					c21 = hp_v8_load(c + 2 * ldc + 8), c31 = hp_v8_load(c + 3 * ldc + 8);
			}
			for (int k = 0; k < K; k++, a += sak, b += ldb) {
				hp_v8 b0 = hp_v8_load(b);
				float a0 = a[0], a1 = a[sam], a2 = a[2 * sam], a3 = a[3 * sam];
				c00 += b0 * a0, c10 += b0 * a1, c20 += b0 * a2, c30 += b0 * a3;
				if (nv == 2) {
					hp_v8 b1 = hp_v8_load(b + 8);
					c01 += b1 * a0, c11 += b1 * a1, c21 += b1 * a2, c31 += b1 * a3;
				}
			}
			hp_v8_store(c, c00), hp_v8_store(c + ldc, c10);
			hp_v8_store(c + 2 * ldc, c20), hp_v8_store(c + 3 * ldc, c30);
			if (nv == 2)
				hp_v8_store(c + 8, c01), hp_v8_store(c + ldc + 8, c11),
				hp_v8_store(c + 2 * ldc + 8, c21), hp_v8_store(c + 3 * ldc + 8, c31);
		}
		for (; m < M; m++) {
			const float *a = A + m * sam, *b = B + n;
			float *c = C + m * ldc + n;
			for (int v = 0; v < nv; v++) {
				hp_v8 c0 = acc ? hp_v8_load(c + 8 * v) : hp_v8_set1(0.0f);
				for (int k = 0; k < K; k++)
					c0 += hp_v8_load(b + k * ldb + 8 * v) * a[k * sak];
				hp_v8_store(c + 8 * v, c0);
			}
		}
	}
}

CP_INLINE void cp_mm16(int M, int N, int K, const float *A, long sam, long sak,
		       const float *B, long ldb, float *C, long ldc, int acc)
{
	int n = 0;

	for (; n + 32 <= N; n += 32) {
		int m = 0;
		for (; m + 4 <= M; m += 4) {
			const float *a = A + m * sam, *b = B + n;
			float *c = C + m * ldc + n;
			cp_v16 z = { 0 }, c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z;
			if (acc) {
				c00 = cp_load16(c), c01 = cp_load16(c + 16);
				c10 = cp_load16(c + ldc), c11 = cp_load16(c + ldc + 16);
				c20 = cp_load16(c + 2 * ldc), c21 = cp_load16(c + 2 * ldc + 16);
				c30 = cp_load16(c + 3 * ldc), c31 = cp_load16(c + 3 * ldc + 16);
			}
			for (int k = 0; k < K; k++, a += sak, b += ldb) {
				cp_v16 b0 = cp_load16(b), b1 = cp_load16(b + 16);
				float a0 = a[0], a1 = a[sam], a2 = a[2 * sam], a3 = a[3 * sam];
				c00 += b0 * a0, c01 += b1 * a0;
				c10 += b0 * a1, c11 += b1 * a1;
				c20 += b0 * a2, c21 += b1 * a2;
				c30 += b0 * a3, c31 += b1 * a3;
			}
			cp_store16(c, c00), cp_store16(c + 16, c01);
			cp_store16(c + ldc, c10), cp_store16(c + ldc + 16, c11);
			cp_store16(c + 2 * ldc, c20), cp_store16(c + 2 * ldc + 16, c21);
			cp_store16(c + 3 * ldc, c30), cp_store16(c + 3 * ldc + 16, c31);
		}
		for (; m < M; m++) {
			const float *a = A + m * sam, *b = B + n;
			float *c = C + m * ldc + n;
			cp_v16 c0 = { 0 }, c1 = { 0 };
			if (acc)
				c0 = cp_load16(c), c1 = cp_load16(c + 16);
			for (int k = 0; k < K; k++, a += sak, b += ldb)
				c0 += cp_load16(b) * a[0], c1 += cp_load16(b + 16) * a[0];
			cp_store16(c, c0), cp_store16(c + 16, c1);
		}
	}
	if (n < N)      /* the last 16 columns */
		for (int m = 0; m < M; m++) {
			const float *a = A + m * sam, *b = B + n;
			float *c = C + m * ldc + n;
			cp_v16 c0 = acc ? cp_load16(c) : (cp_v16){ 0 };
			for (int k = 0; k < K; k++, a += sak, b += ldb)
				c0 += cp_load16(b) * a[0];
			cp_store16(c, c0);
		}
}

/* `isa` (2 AVX-512, 1 AVX2, 0 baseline) is a constant in each version. */
#define cp_mm(isa, ...) ((isa) == 2 ? cp_mm16(__VA_ARGS__) : cp_mm8((isa) == 1 ? 2 : 1, __VA_ARGS__))

/* ---- tiles ---- */

/* dst[r][0..Dp) = src row r (stride ld), zero-padded from D; r < rows. */
CP_INLINE void cp_load_rows(float *dst, const float *src, long ld, int rows, int D, int Dp)
{
	for (int r = 0; r < rows; r++) {
		memcpy(dst + (long)r * Dp, src + r * ld, sizeof(float) * (size_t)D);
		memset(dst + (long)r * Dp + D, 0, sizeof(float) * (size_t)(Dp - D));
	}
}

/* dst[d][c] = src[c*ld + d] for d < D (leading dimension ncp), zero for
 * n <= c < ncp. */
CP_INLINE void cp_load_cols(float *dst, const float *src, long ld, int n, int ncp, int D)
{
	for (int d = 0; d < D; d++) {
		float *o = dst + (long)d * ncp;
		for (int c = 0; c < n; c++)
			o[c] = src[c * ld + d];
		memset(o + n, 0, sizeof(float) * (size_t)(ncp - n));
	}
}

/* dst[x] = alpha * dst[x] + src[x] for x < n, n a multiple of 8. */
CP_INLINE void cp_axpy_row(float *dst, float alpha, const float *src, int n)
{
	hp_v8 av = hp_v8_set1(alpha);

	for (int x = 0; x < n; x += 8)
		hp_v8_store(dst + x, hp_v8_load(dst + x) * av + hp_v8_load(src + x));
}

/* dst[d] += src[d] for d < D (dst a row of dk or dv, D floats). */
CP_INLINE void cp_add_row(float *dst, const float *src, int D)
{
	int d = 0;

	for (; d + 8 <= D; d += 8)
		hp_v8_store(dst + d, hp_v8_load(dst + d) + hp_v8_load(src + d));
	for (; d < D; d++)
		dst[d] += src[d];
}

/* dst[d] = k * src[d] for d < D. */
CP_INLINE void cp_scale_row(float *dst, const float *src, float k, int D)
{
	int d = 0;

	for (; d + 8 <= D; d += 8)
		hp_v8_store(dst + d, hp_v8_set1(k) * hp_v8_load(src + d));
	for (; d < D; d++)
		dst[d] = k * src[d];
}

/* The lanes of a query tile: query r (chunk row r0 + r, position
 * q0 + r0 + r) sees keys first[r] .. last[r]; padding lanes (r >= rows)
 * see none. */
CP_INLINE void cp_lanes(int32_t *first, int32_t *last, const int32_t *sg, int r0, int rows, int rp, int q0)
{
	for (int r = 0; r < rp; r++) {
		first[r] = r < rows ? (sg ? sg[r0 + r] : 0) : INT32_MAX;
		last[r] = q0 + r0 + r;
	}
}

/* In a transposed tile t[c][r] (kc rows of rp lanes, key c0 + c), replace
 * the entries of (key, query) pairs the mask hides by `fill`. */
CP_INLINE void cp_mask(float *t, int kc, int rp, int c0, const int32_t *first, const int32_t *last, float fill)
{
	for (int c = 0; c < kc; c++) {
		float *s = t + (long)c * rp;
		hp_v8i jv = { c0 + c, c0 + c, c0 + c, c0 + c, c0 + c, c0 + c, c0 + c, c0 + c };
		for (int r = 0; r < rp; r += 8) {
			hp_v8i f, l8;
			__builtin_memcpy(&f, first + r, sizeof(f));
			__builtin_memcpy(&l8, last + r, sizeof(l8));
			hp_v8_store(s + r, hp_v8_select((f <= jv) & (jv <= l8), hp_v8_load(s + r), hp_v8_set1(fill)));
		}
	}
}

/* ---- work items ---- */

struct cp_args {
	/* forward */
	float *out, *P_out, *lse_out;
	/* backward */
	float *dq, *dk, *dv;
	const float *dout, *o, *P, *lse;
	/* both */
	const float *q, *k, *v;
	const int32_t *seg;
	int B, Tq, S, q0, H, KV, D;
};

/* Forward of (batch b, head h, query tile qt), the last tile of a row
 * (the most keys) first.  As fa_fwd_body, with the query rows at
 * positions q0 + r0 + r and, when P is given, the scores written to it. */
CP_INLINE void cp_fwd_body(const struct cp_args *a, long item, int isa)
{
	int Tq = a->Tq, S = a->S, q0 = a->q0, H = a->H, D = a->D, Dp = cp_dpad(D), TB = cp_tile(D);
	int nqt = (Tq + TB - 1) / TB, qt = nqt - 1 - (int)(item % nqt);
	int h = (int)(item / nqt % H), b = (int)(item / nqt / H), kh = h / (H / a->KV);
	long qs = (long)H * D, ks = (long)a->KV * D;
	float scale = 1.0f / sqrtf((float)D);
	const int32_t *sg = a->seg ? a->seg + (long)b * Tq : NULL;
	int r0 = qt * TB, rows = Tq - r0 < TB ? Tq - r0 : TB, rp = (rows + 15) & ~15;
	/* Documents are contiguous, so the tile's first row starts earliest:
	 * its keys run from there to its last row's position (causal). */
	int klo = sg ? sg[r0] : 0, khi = q0 + r0 + rows - 1;
	const float *kb = a->k + (long)b * S * ks + kh * D, *vb = a->v + (long)b * S * ks + kh * D;
	float *P = a->P_out ? a->P_out + (((long)b * H + h) * Tq + r0) * S : NULL;
	float Qt[CP_TILE_FLOATS] __attribute__((aligned(64)));
	float Kp[CP_TILE_FLOATS] __attribute__((aligned(64)));
	float Vp[CP_TILE_FLOATS] __attribute__((aligned(64)));
	float O[CP_TILE_FLOATS] __attribute__((aligned(64)));
	float tmp[CP_TILE_FLOATS] __attribute__((aligned(64)));
	float St[CP_MAX_TB * CP_MAX_TB] __attribute__((aligned(64)));
	/* per query lane: running max, this tile's max (then the max exp()
	 * subtracts), rescale factor, this tile's sum; the keys it may see */
	float m[CP_MAX_TB], mt[CP_MAX_TB], alpha[CP_MAX_TB], ts[CP_MAX_TB];
	int32_t first[CP_MAX_TB], last[CP_MAX_TB];
	double l[CP_MAX_TB];

	cp_load_cols(Qt, a->q + ((long)b * Tq + r0) * qs + h * D, qs, rows, rp, D);
	memset(O, 0, sizeof(float) * (size_t)rows * Dp);
	cp_lanes(first, last, sg, r0, rows, rp, q0);
	for (int r = 0; r < rp; r++)
		m[r] = -INFINITY, l[r] = 0;
	for (int c0 = klo; c0 <= khi; c0 += TB) {
		int kc = khi + 1 - c0 < TB ? khi + 1 - c0 : TB;
		/* every (key, query) pair of the tile visible, no padding lane */
		int full = c0 + kc - 1 <= q0 + r0 && (!sg || sg[r0 + rows - 1] <= c0) && rows == rp;

		/* S^T[c][r] = k_c . q_r, scaled, -inf where masked */
		cp_load_rows(Kp, kb + (long)c0 * ks, ks, kc, D, Dp);
		cp_load_rows(Vp, vb + (long)c0 * ks, ks, kc, D, Dp);
		cp_mm(isa, kc, rp, D, Kp, Dp, 1, Qt, rp, St, rp, 0);
		for (int c = 0; c < kc; c++) {
			float *s = St + (long)c * rp;
			for (int r = 0; r < rp; r += 8)
				hp_v8_store(s + r, hp_v8_load(s + r) * hp_v8_set1(scale));
		}
		if (!full)
			cp_mask(St, kc, rp, c0, first, last, -INFINITY);
		if (P)          /* the scores, turned into probabilities at the end */
			for (int r = 0; r < rows; r++) {
				float *pr = P + (long)r * S + c0;
				for (int c = 0; c < kc; c++)
					pr[c] = St[(long)c * rp + r];
			}
		memcpy(mt, m, sizeof(float) * (size_t)rp);
		for (int c = 0; c < kc; c++)
			for (int r = 0; r < rp; r += 8)
				hp_v8_store(mt + r, hp_v8_max(hp_v8_load(mt + r), hp_v8_load(St + (long)c * rp + r)));
		/* new max; a lane that has seen nothing yet subtracts 0, not -inf */
		for (int r = 0; r < rp; r += 8) {
			hp_v8 mn = hp_v8_load(mt + r), ninf = hp_v8_set1(-INFINITY);
			hp_v8 safe = hp_v8_select(mn == ninf, hp_v8_set1(0.0f), mn);
			hp_v8_store(alpha + r, hp_vexp(hp_v8_load(m + r) - safe));
			hp_v8_store(m + r, mn);
			hp_v8_store(mt + r, safe);
			hp_v8_store(ts + r, hp_v8_set1(0.0f));
		}
		/* P^T = exp(S^T - max), column sums */
		for (int c = 0; c < kc; c++) {
			float *s = St + (long)c * rp;
			for (int r = 0; r < rp; r += 8) {
				hp_v8 p = hp_vexp(hp_v8_load(s + r) - hp_v8_load(mt + r));
				hp_v8_store(s + r, p);
				hp_v8_store(ts + r, hp_v8_load(ts + r) + p);
			}
		}
		/* O = alpha O + P V, the tile's product summed apart */
		cp_mm(isa, rows, Dp, kc, St, 1, rp, Vp, Dp, tmp, Dp, 0);
		for (int r = 0; r < rows; r++) {
			l[r] = l[r] * alpha[r] + ts[r];
			cp_axpy_row(O + (long)r * Dp, alpha[r], tmp + (long)r * Dp, Dp);
		}
	}
	for (int r = 0; r < rows; r++) {
		int i = r0 + r;
		float *oi = a->out + ((long)b * Tq + i) * qs + h * D;
		const float *src = O + (long)r * Dp;
		double inv = 1.0 / l[r];
		for (int d = 0; d < D; d++)
			oi[d] = (float)(src[d] * inv);
		if (a->lse_out)
			a->lse_out[((long)b * H + h) * Tq + i] = (float)(m[r] + log(l[r]));
		if (P) {
			/* P = exp(score - m) / l on klo..khi (0 where masked), 0 elsewhere */
			float *pr = P + (long)r * S;
			hp_v8 mv = hp_v8_set1(m[r]), iv = hp_v8_set1((float)inv);
			int j = klo;
			memset(pr, 0, sizeof(float) * (size_t)klo);
			for (; j + 8 <= khi + 1; j += 8)
				hp_v8_store(pr + j, hp_vexp(hp_v8_load(pr + j) - mv) * iv);
			if (j <= khi)
				hp_v8_store_part(pr + j, hp_vexp(hp_v8_load_part(pr + j, khi + 1 - j, -INFINITY) - mv) * iv,
						 khi + 1 - j);
			memset(pr + khi + 1, 0, sizeof(float) * (size_t)(S - 1 - khi));
		}
	}
}

/* P^T of a (key tile, query tile) pair into Pt[kc][rp]: recomputed from
 * lse (Qt the query tile transposed, Kp the key rows, L the lanes' lse),
 * or gathered from P's rows (Prow the tile's first row); 0 where masked
 * and in padding lanes. */
CP_INLINE void cp_probs(float *Pt, const struct cp_args *a, const float *Prow, const float *Qt, const float *Kp,
			const float *L, int rows, int rp, int c0, int kc, int full, const int32_t *first,
			const int32_t *last, int isa)
{
	int D = a->D, Dp = cp_dpad(D);

	if (Prow) {
		for (int r = 0; r < rows; r++) {
			const float *pr = Prow + (long)r * a->S + c0;
			for (int c = 0; c < kc; c++)
				Pt[(long)c * rp + r] = pr[c];
		}
		for (int c = 0; c < kc; c++)
			for (int r = rows; r < rp; r++)
				Pt[(long)c * rp + r] = 0;
		if (!full)
			cp_mask(Pt, kc, rp, c0, first, last, 0.0f);
		return;
	}
	float scale = 1.0f / sqrtf((float)D);
	cp_mm(isa, kc, rp, D, Kp, Dp, 1, Qt, rp, Pt, rp, 0);
	for (int c = 0; c < kc; c++) {
		float *s = Pt + (long)c * rp;
		for (int r = 0; r < rp; r += 8)
			hp_v8_store(s + r, hp_v8_load(s + r) * hp_v8_set1(scale));
	}
	if (!full)
		cp_mask(Pt, kc, rp, c0, first, last, -INFINITY);
	for (int c = 0; c < kc; c++) {
		float *s = Pt + (long)c * rp;
		for (int r = 0; r < rp; r += 8)
			hp_v8_store(s + r, hp_vexp(hp_v8_load(s + r) - hp_v8_load(L + r)));
	}
}

/* Backward of (batch b, kv head kh): dk, dv of that head over all S keys,
 * dq of the query heads of its group. */
CP_INLINE void cp_bwd_body(const struct cp_args *a, long item, int isa)
{
	int Tq = a->Tq, S = a->S, q0 = a->q0, H = a->H, D = a->D, Dp = cp_dpad(D), TB = cp_tile(D);
	int group = H / a->KV, kh = (int)(item % a->KV), b = (int)(item / a->KV);
	long qs = (long)H * D, ks = (long)a->KV * D;
	float scale = 1.0f / sqrtf((float)D);
	const int32_t *sg = a->seg ? a->seg + (long)b * Tq : NULL;
	const float *kb = a->k + (long)b * S * ks + kh * D, *vb = a->v + (long)b * S * ks + kh * D;
	float *dkb = a->dk + (long)b * S * ks + kh * D, *dvb = a->dv + (long)b * S * ks + kh * D;
	float Qt[CP_TILE_FLOATS] __attribute__((aligned(64)));
	float Qp[CP_TILE_FLOATS] __attribute__((aligned(64)));
	float dOt[CP_TILE_FLOATS] __attribute__((aligned(64)));
	float dOp[CP_TILE_FLOATS] __attribute__((aligned(64)));
	float Kp[CP_TILE_FLOATS] __attribute__((aligned(64)));
	float Vp[CP_TILE_FLOATS] __attribute__((aligned(64)));
	float dQa[CP_TILE_FLOATS] __attribute__((aligned(64)));
	float tmp[CP_TILE_FLOATS] __attribute__((aligned(64)));
	float Pt[CP_MAX_TB * CP_MAX_TB] __attribute__((aligned(64)));
	float dSt[CP_MAX_TB * CP_MAX_TB] __attribute__((aligned(64)));
	float Di[CP_MAX_TB] __attribute__((aligned(64))), L[CP_MAX_TB] __attribute__((aligned(64)));
	int32_t first[CP_MAX_TB], last[CP_MAX_TB];

	for (int j = 0; j < S; j++) {
		memset(dkb + (long)j * ks, 0, sizeof(float) * (size_t)D);
		memset(dvb + (long)j * ks, 0, sizeof(float) * (size_t)D);
	}
	for (int hh = 0; hh < group; hh++) {
		int h = kh * group + hh;
		for (int r0 = 0; r0 < Tq; r0 += TB) {
			int rows = Tq - r0 < TB ? Tq - r0 : TB, rp = (rows + 15) & ~15;
			int klo = sg ? sg[r0] : 0, khi = q0 + r0 + rows - 1;
			long base = ((long)b * Tq + r0) * qs + h * D, lrow = ((long)b * H + h) * Tq + r0;
			const float *Prow = a->P ? a->P + lrow * S : NULL;

			/* contiguous copies: see flashattn.c */
			cp_load_rows(Qp, a->q + base, qs, rows, D, Dp);
			cp_load_rows(dOp, a->dout + base, qs, rows, D, Dp);
			cp_load_cols(Qt, a->q + base, qs, rows, rp, D);
			cp_load_cols(dOt, a->dout + base, qs, rows, rp, D);
			cp_lanes(first, last, sg, r0, rows, rp, q0);
			for (int r = 0; r < rp; r++) {
				L[r] = r < rows && !Prow ? a->lse[lrow + r] : 0;
				Di[r] = r < rows && !Prow ? hp_row_dot(a->dout + base + r * qs, a->o + base + r * qs, D) : 0;
			}
			if (Prow) {
				/* Di = rowsum(dP * P): a pass over the key tiles first,
				 * each tile's sum in float, the tiles' in double */
				double dd[CP_MAX_TB] = { 0 };
				for (int c0 = klo; c0 <= khi; c0 += TB) {
					int kc = khi + 1 - c0 < TB ? khi + 1 - c0 : TB;
					int full = c0 + kc - 1 <= q0 + r0 && (!sg || sg[r0 + rows - 1] <= c0) && rows == rp;
					cp_load_rows(Vp, vb + (long)c0 * ks, ks, kc, D, Dp);
					cp_probs(Pt, a, Prow, NULL, NULL, NULL, rows, rp, c0, kc, full, first, last, isa);
					cp_mm(isa, kc, rp, D, Vp, Dp, 1, dOt, rp, dSt, rp, 0);
					for (int r = 0; r < rp; r += 8) {
						hp_v8 s = hp_v8_set1(0.0f);
						for (int c = 0; c < kc; c++)
							s += hp_v8_load(Pt + (long)c * rp + r) * hp_v8_load(dSt + (long)c * rp + r);
						for (int x = 0; x < 8; x++)
							dd[r + x] += s[x];
					}
				}
				for (int r = 0; r < rp; r++)
					Di[r] = (float)dd[r];
			}
			memset(dQa, 0, sizeof(float) * (size_t)rows * Dp);
			for (int c0 = klo; c0 <= khi; c0 += TB) {
				int kc = khi + 1 - c0 < TB ? khi + 1 - c0 : TB;
				int full = c0 + kc - 1 <= q0 + r0 && (!sg || sg[r0 + rows - 1] <= c0) && rows == rp;

				cp_load_rows(Kp, kb + (long)c0 * ks, ks, kc, D, Dp);
				cp_load_rows(Vp, vb + (long)c0 * ks, ks, kc, D, Dp);
				cp_probs(Pt, a, Prow, Qt, Kp, L, rows, rp, c0, kc, full, first, last, isa);
				/* dS^T = P^T * (V dO^T - Di) */
				cp_mm(isa, kc, rp, D, Vp, Dp, 1, dOt, rp, dSt, rp, 0);
				for (int c = 0; c < kc; c++) {
					float *ds = dSt + (long)c * rp;
					const float *p = Pt + (long)c * rp;
					for (int r = 0; r < rp; r += 8)
						hp_v8_store(ds + r, hp_v8_load(p + r) * (hp_v8_load(ds + r) - hp_v8_load(Di + r)));
				}
				/* dV += P^T dO, dK += dS^T Q (scaled at the end): each
				 * tile's product summed apart, then added */
				cp_mm(isa, kc, Dp, rows, Pt, rp, 1, dOp, Dp, tmp, Dp, 0);
				for (int c = 0; c < kc; c++)
					cp_add_row(dvb + (long)(c0 + c) * ks, tmp + (long)c * Dp, D);
				cp_mm(isa, kc, Dp, rows, dSt, rp, 1, Qp, Dp, tmp, Dp, 0);
				for (int c = 0; c < kc; c++)
					cp_add_row(dkb + (long)(c0 + c) * ks, tmp + (long)c * Dp, D);
				/* dQ += dS K (scaled when written) */
				cp_mm(isa, rows, Dp, kc, dSt, 1, rp, Kp, Dp, tmp, Dp, 0);
				for (int r = 0; r < rows; r++)
					cp_axpy_row(dQa + (long)r * Dp, 1.0f, tmp + (long)r * Dp, Dp);
			}
			for (int r = 0; r < rows; r++)
				cp_scale_row(a->dq + base + r * qs, dQa + (long)r * Dp, scale, D);
		}
	}
	for (int j = 0; j < S; j++)
		cp_scale_row(dkb + (long)j * ks, dkb + (long)j * ks, scale, D);
}

/* A call: its work items and the compiled version that runs them. */
struct cp_job {
	void (*fn)(const struct cp_args *, long);
	const struct cp_args *args;
	long n;
	long next;              /* atomic */
};

#ifdef CP_X86
CP_V4 static void cp_fwd_item_v4(const struct cp_args *a, long item)
{
	cp_fwd_body(a, item, 2);
}

CP_V4 static void cp_bwd_item_v4(const struct cp_args *a, long item)
{
	cp_bwd_body(a, item, 2);
}

CP_V3 static void cp_fwd_item_v3(const struct cp_args *a, long item)
{
	cp_fwd_body(a, item, 1);
}

CP_V3 static void cp_bwd_item_v3(const struct cp_args *a, long item)
{
	cp_bwd_body(a, item, 1);
}
#endif

CP_BASE static void cp_fwd_item(const struct cp_args *a, long item)
{
	cp_fwd_body(a, item, 0);
}

CP_BASE static void cp_bwd_item(const struct cp_args *a, long item)
{
	cp_bwd_body(a, item, 0);
}

/* The best version the CPU has, capped by HP_FLASH ("avx2" or "baseline",
 * read on every call, as the flash kernel does). */
static void cp_pick(struct cp_job *j, int bwd)
{
#ifdef CP_X86
	const char *e = getenv("HP_FLASH");
	int cap = e && !strcmp(e, "baseline") ? 0 : e && !strcmp(e, "avx2") ? 1 : 2;

	if (cap >= 2 && __builtin_cpu_supports("x86-64-v4"))
		j->fn = bwd ? cp_bwd_item_v4 : cp_fwd_item_v4;
	else if (cap >= 1 && __builtin_cpu_supports("x86-64-v3"))
		j->fn = bwd ? cp_bwd_item_v3 : cp_fwd_item_v3;
	else
#endif
		j->fn = bwd ? cp_bwd_item : cp_fwd_item;
}

static void *cp_drain(void *p)
{
	struct cp_job *j = p;
	long i;

	while ((i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->n)
		j->fn(j->args, i);
	return NULL;
}

/* Run the job's items over up to hp_sgemm_threads() threads (or
 * HP_CPATTN_THREADS), the caller included; a worker that fails to start
 * leaves its share to the others. */
static void cp_run(struct cp_job *j, double macs)
{
	const char *e = getenv("HP_CPATTN_THREADS");
	int nt = e && atoi(e) > 0 ? atoi(e) : hp_sgemm_threads(), started = 0;
	pthread_t tid[CP_MAX_THREADS];
	pthread_attr_t at;

	if (nt > CP_MAX_THREADS)
		nt = CP_MAX_THREADS;
	if (nt > j->n)
		nt = (int)j->n;
	if (macs < (double)CP_MIN_THREADED_MACS)
		nt = 1;
	if (nt > 1 && !pthread_attr_init(&at)) {
		pthread_attr_setstacksize(&at, CP_STACK);
		while (started < nt - 1 && !pthread_create(&tid[started], &at, cp_drain, j))
			started++;
		pthread_attr_destroy(&at);
	}
	cp_drain(j);
	for (int t = 0; t < started; t++)
		pthread_join(tid[t], NULL);
}

/* Multiply-adds of one (query, key) product over the visible pairs (an
 * upper bound with packed rows): enough to decide whether threads pay. */
static double cp_macs(int B, int Tq, int q0, int H, int D)
{
	return (double)B * H * Tq * (q0 + (Tq + 1) / 2.0) * D;
}

static int cp_tiled(int Hq, int Hkv, int D)
{
	return D >= 1 && D <= CP_MAX_HEAD_DIM && Hkv > 0 && Hq % Hkv == 0;
}

static void cp_fwd_scalar(float *out, float *P, float *lse, const float *q, const float *k, const float *v,
			  const int32_t *seg, int B, int Tq, int S, int q0, int Hq, int Hkv, int D);
static void cp_bwd_scalar(float *dq, float *dk, float *dv, const float *dout, const float *out,
			  const float *P, const float *lse, const float *q, const float *k, const float *v,
			  const int32_t *seg, float *scratch, int B, int Tq, int S, int q0, int Hq, int Hkv, int D);

void hp_cp_attention_fwd(float *out, float *P, float *lse, const float *q, const float *k, const float *v,
			 const int32_t *seg, int B, int Tq, int S, int q0, int Hq, int Hkv, int D)
{
	struct cp_args a = { .out = out, .P_out = P, .lse_out = lse, .q = q, .k = k, .v = v, .seg = seg,
			     .B = B, .Tq = Tq, .S = S, .q0 = q0, .H = Hq, .KV = Hkv, .D = D };

	if (B <= 0 || Tq <= 0 || Hq <= 0)
		return;
	if (!cp_tiled(Hq, Hkv, D)) {
		cp_fwd_scalar(out, P, lse, q, k, v, seg, B, Tq, S, q0, Hq, Hkv, D);
		return;
	}
	int TB = cp_tile(D);
	struct cp_job j = { NULL, &a, (long)B * Hq * ((Tq + TB - 1) / TB), 0 };
	cp_pick(&j, 0);
	cp_run(&j, 2 * cp_macs(B, Tq, q0, Hq, D));
}

void hp_cp_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
			 const float *P, const float *lse, const float *q, const float *k, const float *v,
			 const int32_t *seg, float *scratch, int B, int Tq, int S, int q0, int Hq, int Hkv, int D)
{
	struct cp_args a = { .dq = dq, .dk = dk, .dv = dv, .dout = dout, .o = out, .P = P, .lse = lse,
			     .q = q, .k = k, .v = v, .seg = seg,
			     .B = B, .Tq = Tq, .S = S, .q0 = q0, .H = Hq, .KV = Hkv, .D = D };

	if (B <= 0 || Hq <= 0)
		return;
	if (!cp_tiled(Hq, Hkv, D) || Tq <= 0) {
		cp_bwd_scalar(dq, dk, dv, dout, out, P, lse, q, k, v, seg, scratch, B, Tq, S, q0, Hq, Hkv, D);
		return;
	}
	struct cp_job j = { NULL, &a, (long)B * Hkv, 0 };
	cp_pick(&j, 1);
	cp_run(&j, 5 * cp_macs(B, Tq, q0, Hq, D));
}

/* ---- the scalar fallback (head dims above CP_MAX_HEAD_DIM, Hq not a
 * multiple of Hkv): per (batch, head, query), dot products in double ---- */
/* scale * (q . k) summed in double, rounded as hp_attention_fwd_ref rounds it. */
static float cp_score(const float *qi, const float *kj, int D, float scale)
{
	double s = 0;

	for (int d = 0; d < D; d++)
		s += (double)qi[d] * kj[d];
	return (float)s * scale;
}

static void cp_fwd_scalar(float *out, float *P, float *lse, const float *q, const float *k, const float *v,
			  const int32_t *seg, int B, int Tq, int S, int q0, int Hq, int Hkv, int D)
{
	int group = Hq / Hkv;
	long qs = (long)Hq * D, ks = (long)Hkv * D;
	float scale = 1.0f / sqrtf((float)D), buf[CP_BLOCK];

	for (int b = 0; b < B; b++)
		for (int h = 0; h < Hq; h++) {
			int kh = h / group;
			const float *kb = k + (long)b * S * ks + kh * D, *vb = v + (long)b * S * ks + kh * D;
			for (int i = 0; i < Tq; i++) {
				const float *qi = q + ((long)b * Tq + i) * qs + h * D;
				float *oi = out + ((long)b * Tq + i) * qs + h * D;
				float *prow = P ? P + (((long)b * Hq + h) * Tq + i) * S : NULL;
				int p = q0 + i, j0 = seg ? seg[(long)b * Tq + i] : 0;
				float m = -INFINITY;
				double l = 0;

				for (int d = 0; d < D; d++)
					oi[d] = 0;
				for (int a = j0; a <= p; a += CP_BLOCK) {
					int n = p + 1 - a < CP_BLOCK ? p + 1 - a : CP_BLOCK;
					float bm = -INFINITY;
					for (int j = 0; j < n; j++) {
						buf[j] = cp_score(qi, kb + (long)(a + j) * ks, D, scale);
						if (prow)
							prow[a + j] = buf[j];
						if (buf[j] > bm)
							bm = buf[j];
					}
					float mn = bm > m ? bm : m, alpha = expf(m - mn);   /* 0 on the first block */
					l *= alpha;
					for (int j = 0; j < n; j++) {
						buf[j] = expf(buf[j] - mn);
						l += buf[j];
					}
					for (int d = 0; d < D; d++) {
						double t = 0;
						for (int j = 0; j < n; j++)
							t += (double)buf[j] * vb[(long)(a + j) * ks + d];
						oi[d] = oi[d] * alpha + (float)t;
					}
					m = mn;
				}
				for (int d = 0; d < D; d++)
					oi[d] = (float)(oi[d] / l);
				if (lse)
					lse[((long)b * Hq + h) * Tq + i] = (float)(m + log(l));
				if (prow) {
					/* the row holds the scores: P = exp(score - m) / l */
					for (int j = 0; j < j0; j++)
						prow[j] = 0;
					for (int j = j0; j <= p; j++)
						prow[j] = (float)(expf(prow[j] - m) / l);
					for (int j = p + 1; j < S; j++)
						prow[j] = 0;
				}
			}
		}
}

static void cp_bwd_scalar(float *dq, float *dk, float *dv, const float *dout, const float *out,
			  const float *P, const float *lse, const float *q, const float *k, const float *v,
			  const int32_t *seg, float *scratch, int B, int Tq, int S, int q0, int Hq, int Hkv, int D)
{
	int group = Hq / Hkv;
	long qs = (long)Hq * D, ks = (long)Hkv * D;
	float scale = 1.0f / sqrtf((float)D);
	float *pbuf = scratch, *dS = scratch + S;   /* rows indexed by key position */

	memset(dk, 0, sizeof(float) * (size_t)B * S * ks);
	memset(dv, 0, sizeof(float) * (size_t)B * S * ks);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < Hq; h++) {
			int kh = h / group;
			const float *kb = k + (long)b * S * ks + kh * D, *vb = v + (long)b * S * ks + kh * D;
			float *dkb = dk + (long)b * S * ks + kh * D, *dvb = dv + (long)b * S * ks + kh * D;
			for (int i = 0; i < Tq; i++) {
				long row = ((long)b * Tq + i) * qs + h * D;
				const float *qi = q + row, *doi = dout + row;
				float *dqi = dq + row;
				int p = q0 + i, j0 = seg ? seg[(long)b * Tq + i] : 0;
				const float *pr;
				double rs = 0;

				if (P) {
					pr = P + (((long)b * Hq + h) * Tq + i) * S;
				} else {
					float li = lse[((long)b * Hq + h) * Tq + i];
					for (int j = j0; j <= p; j++)
						pbuf[j] = expf(cp_score(qi, kb + (long)j * ks, D, scale) - li);
					pr = pbuf;
					for (int d = 0; d < D; d++)
						rs += (double)doi[d] * out[row + d];
				}
				for (int j = j0; j <= p; j++) {
					const float *vj = vb + (long)j * ks;
					double s = 0;
					for (int d = 0; d < D; d++)
						s += (double)doi[d] * vj[d];
					dS[j] = (float)s;     /* dP for now */
					if (P)
						rs += s * pr[j];
				}
				for (int j = j0; j <= p; j++)
					dS[j] = pr[j] * (float)(dS[j] - rs);
				for (int d = 0; d < D; d++) {
					double s = 0;
					for (int j = j0; j <= p; j++)
						s += (double)dS[j] * kb[(long)j * ks + d];
					dqi[d] = (float)s * scale;
				}
				for (int j = j0; j <= p; j++) {
					float *dkj = dkb + (long)j * ks, *dvj = dvb + (long)j * ks;
					for (int d = 0; d < D; d++) {
						dkj[d] += scale * dS[j] * qi[d];
						dvj[d] += pr[j] * doi[d];
					}
				}
			}
		}
}
