/*
 * attntile.h - the tile machinery the two tiled attention kernels share:
 * flashattn.c (causal attention of whole rows, FlashAttention-2) and
 * cpattn.c (a context-parallel chunk of queries against every key of
 * their rows).  Internal to kernels/cpu; nothing outside includes it.
 *
 * What is here: the tile sizes; the tile products (at_mm over at_mm8 and
 * at_mm16); copying rows of q, k, v, dout into contiguous (and transposed)
 * tiles; the lanes and the mask of a query tile; the forward of one query
 * tile (at_fwd_tile: scores transposed, online softmax, out and lse), which
 * both kernels run as it is, flashattn.c with q0 = 0; and, in attntile.c,
 * the choice of the compiled version (HP_CPU) and the threads that run a
 * call's work items.  What each kernel keeps: flashattn.c the square causal
 * row and its backward (key tiles outer), cpattn.c the chunk offset q0, the
 * keys of the whole row, P and its backward (query tiles outer).
 *
 * Everything here but attntile.c's two functions is static inline and
 * always inlined, so that a work item compiled for one version (AT_VERSIONS)
 * inlines every helper for that version's ISA, with `isa` a constant.
 *
 * Invariants:
 *   - Each element of a tile product is one float sum in k order, one
 *     product rounded and added at a time: the vector width, the register
 *     blocking and the version do not change a single bit (the build passes
 *     -ffp-contract=off, so no version fuses a multiply-add).  Both kernels'
 *     tests check the versions against each other.
 *   - A work item writes outputs no other item writes, and computes each in
 *     a fixed order: results do not depend on the thread count.
 *   - Tiles are at most AT_MAX_TB rows of a head_dim padded with zeros to a
 *     multiple of 16 (at_dpad), AT_TILE_FLOATS floats in all: 64 rows for
 *     head_dim <= 128, 32 for <= 256, 16 for <= AT_MAX_HEAD_DIM.  They live
 *     on the stack of the thread that works on them (attntile.c gives
 *     workers AT_STACK bytes).
 */
#ifndef HP_KERNELS_CPU_ATTNTILE_H
#define HP_KERNELS_CPU_ATTNTILE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/vec.h"

/* Three compiled versions of the work items (see at_mm8) where GCC targets
 * x86-64, picked per call by hp_attntile_isa; one elsewhere, or with
 * HP_NO_CLONES.  flatten: vec.h's helpers are static inline, and GCC may
 * keep one out-of-line baseline copy of them (hp_row_exp_sum was, at 40%
 * of the time); flatten inlines everything into each version.
 * aligned(64): where the hot loops fall against 64-byte lines is then set
 * by the compiler, not by where the linker puts the function, so that a
 * work item runs at the same speed in every binary (a 20-byte copy loop
 * of cpattn.c's P-mode backward runs up to 13% slower across a line). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(HP_NO_CLONES)
#define AT_X86 1
#define AT_V4 __attribute__((target("arch=x86-64-v4"), flatten, aligned(64)))
#define AT_V3 __attribute__((target("arch=x86-64-v3"), flatten, aligned(64)))
#endif
#define AT_BASE __attribute__((flatten, aligned(64)))
#define AT_INLINE static inline __attribute__((always_inline))

/* One tile buffer: 64 rows of a head_dim padded to 128 (32 KiB).  The
 * forward keeps 5 of them and a TB x TB score tile on the stack (about
 * 180 KiB), a backward 8 and two (about 300 KiB), the caller's stack
 * included. */
#define AT_TILE_FLOATS 8192
#define AT_MAX_TB 64
#define AT_MAX_HEAD_DIM 512

/* A tile buffer and a score tile (up to TB x TB), as work items declare
 * them on the stack. */
typedef float at_tile_buf[AT_TILE_FLOATS] __attribute__((aligned(64)));
typedef float at_score_buf[AT_MAX_TB * AT_MAX_TB] __attribute__((aligned(64)));

AT_INLINE int at_dpad(int D)
{
	return (D + 15) & ~15;
}

/* Rows per tile: as many as fit AT_TILE_FLOATS at the padded head_dim, a
 * multiple of 16, at most 64 (64 for D <= 128, 32 for D <= 256, 16 for
 * D <= 512). */
AT_INLINE int at_tile(int D)
{
	int t = (AT_TILE_FLOATS / at_dpad(D)) & ~15;

	return t > AT_MAX_TB ? AT_MAX_TB : t;
}

/* ---- versions and threads (attntile.c) ---- */

/* A work item: item `item` of the call whose arguments are `args`. */
typedef void (*at_item_fn)(const void *args, long item);

/* AT_VERSIONS(name, body) defines name[3], the compiled versions of the
 * work item body(args, item, isa) - an AT_INLINE function - indexed by
 * isa: 0 baseline x86-64, 1 AVX2 (x86-64-v3), 2 AVX-512 (x86-64-v4).
 * Without clones all three are the one plain build. */
#ifdef AT_X86
#define AT_VERSIONS(name, body)								\
	AT_V4 static void name##_v4(const void *a, long item) { body(a, item, 2); }	\
	AT_V3 static void name##_v3(const void *a, long item) { body(a, item, 1); }	\
	AT_BASE static void name##_v0(const void *a, long item) { body(a, item, 0); }	\
	static const at_item_fn name[3] = { name##_v0, name##_v3, name##_v4 }
#else
#define AT_VERSIONS(name, body)								\
	AT_BASE static void name##_v0(const void *a, long item) { body(a, item, 0); }	\
	static const at_item_fn name[3] = { name##_v0, name##_v0, name##_v0 }
#endif

/* A call: its work items and the compiled version that runs them. */
struct at_job {
	at_item_fn fn;
	const void *args;
	long n;
	long next;              /* atomic */
};

/* The version for this call (an index into AT_VERSIONS' table): the best
 * the CPU has, capped by HP_CPU ("avx2" or "baseline"; read on every
 * call, so that a test can compare the versions in one process); 0 without
 * clones. */
int hp_attntile_isa(void);

/* The threads an attention call may use: those hp_attention_set_threads
 * fixed, else hp_sgemm_threads(). */
int hp_attntile_threads(void);

/* Run the job's items 0..n-1, each once, handed out through an atomic
 * counter to up to nt threads (nt <= 0: hp_attntile_threads()), the caller
 * included; on the caller alone when macs (the call's multiply-adds) is
 * too few to pay for starting threads.  A worker that fails to start
 * leaves its share to the others. */
void hp_attntile_run(struct at_job *j, int nt, double macs);

/* ---- tile products ---- */

typedef float at_v16 __attribute__((vector_size(64)));

AT_INLINE at_v16 at_load16(const float *p)
{
	at_v16 v;
	__builtin_memcpy(&v, p, sizeof(v));
	return v;
}

AT_INLINE void at_store16(float *p, at_v16 v)
{
	__builtin_memcpy(p, &v, sizeof(v));
}

/*
 * C[m][0..N) = (acc ? C[m][0..N) : 0) + sum_k A(m, k) * B[k][0..N) for
 * m < M, with A(m, k) = A[m*sam + k*sak] (so A or its transpose) and N a
 * multiple of 16.  Each element is summed in k order, one product rounded
 * and added at a time, so every version below gives the same bits whatever
 * its vector width and blocking.  The blockings keep as many accumulators
 * as the register file holds - 4 rows x 32 columns of C (8 zmm) on
 * AVX-512, 4 x 16 (8 ymm) on AVX2, 4 x 8 (8 xmm) on baseline x86-64 -
 * with one row of B and four broadcasts of A per k; measured on Zen 5 at
 * T = 2048, D = 64, the wider blockings are 1.4x (AVX2) and 4x (baseline)
 * faster than the baseline one compiled for the wider ISA, and the
 * baseline one spills at 4 x 16.
 */
AT_INLINE void at_mm8(int nv, int M, int N, int K, const float *A, long sam, long sak,
		      const float *B, long ldb, float *C, long ldc, int acc)
{
	/* nv (1 or 2, a constant after inlining): vectors per row of the block */
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

AT_INLINE void at_mm16(int M, int N, int K, const float *A, long sam, long sak,
		       const float *B, long ldb, float *C, long ldc, int acc)
{
	int n = 0;

	for (; n + 32 <= N; n += 32) {
		int m = 0;
		for (; m + 4 <= M; m += 4) {
			const float *a = A + m * sam, *b = B + n;
			float *c = C + m * ldc + n;
			at_v16 z = { 0 }, c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z;
			if (acc) {
				c00 = at_load16(c), c01 = at_load16(c + 16);
				c10 = at_load16(c + ldc), c11 = at_load16(c + ldc + 16);
				c20 = at_load16(c + 2 * ldc), c21 = at_load16(c + 2 * ldc + 16);
				c30 = at_load16(c + 3 * ldc), c31 = at_load16(c + 3 * ldc + 16);
			}
			for (int k = 0; k < K; k++, a += sak, b += ldb) {
				at_v16 b0 = at_load16(b), b1 = at_load16(b + 16);
				float a0 = a[0], a1 = a[sam], a2 = a[2 * sam], a3 = a[3 * sam];
				c00 += b0 * a0, c01 += b1 * a0;
				c10 += b0 * a1, c11 += b1 * a1;
				c20 += b0 * a2, c21 += b1 * a2;
				c30 += b0 * a3, c31 += b1 * a3;
			}
			at_store16(c, c00), at_store16(c + 16, c01);
			at_store16(c + ldc, c10), at_store16(c + ldc + 16, c11);
			at_store16(c + 2 * ldc, c20), at_store16(c + 2 * ldc + 16, c21);
			at_store16(c + 3 * ldc, c30), at_store16(c + 3 * ldc + 16, c31);
		}
		for (; m < M; m++) {
			const float *a = A + m * sam, *b = B + n;
			float *c = C + m * ldc + n;
			at_v16 c0 = { 0 }, c1 = { 0 };
			if (acc)
				c0 = at_load16(c), c1 = at_load16(c + 16);
			for (int k = 0; k < K; k++, a += sak, b += ldb)
				c0 += at_load16(b) * a[0], c1 += at_load16(b + 16) * a[0];
			at_store16(c, c0), at_store16(c + 16, c1);
		}
	}
	if (n < N)      /* the last 16 columns */
		for (int m = 0; m < M; m++) {
			const float *a = A + m * sam, *b = B + n;
			float *c = C + m * ldc + n;
			at_v16 c0 = acc ? at_load16(c) : (at_v16){ 0 };
			for (int k = 0; k < K; k++, a += sak, b += ldb)
				c0 += at_load16(b) * a[0];
			at_store16(c, c0);
		}
}

/* `isa` (2 AVX-512, 1 AVX2, 0 baseline) is a constant in each compiled
 * version, so one kernel is inlined. */
#define at_mm(isa, ...) ((isa) == 2 ? at_mm16(__VA_ARGS__) : at_mm8((isa) == 1 ? 2 : 1, __VA_ARGS__))

/* ---- loading tiles ---- */

/* dst[r][0..Dp) = src row r (stride ld), zero-padded from D; r < rows.
 * Rows read in place sit H*D floats apart, alias in L1 and make the
 * products 10-30% slower: every operand is copied into a contiguous tile. */
AT_INLINE void at_load_rows(float *dst, const float *src, long ld, int rows, int D, int Dp)
{
	for (int r = 0; r < rows; r++) {
		memcpy(dst + (long)r * Dp, src + r * ld, sizeof(float) * (size_t)D);
		memset(dst + (long)r * Dp + D, 0, sizeof(float) * (size_t)(Dp - D));
	}
}

/* dst[d][c] = src[c*ld + d] for d < D (a transposed tile with leading
 * dimension ncp), zero for n <= c < ncp. */
AT_INLINE void at_load_cols(float *dst, const float *src, long ld, int n, int ncp, int D)
{
	for (int d = 0; d < D; d++) {
		float *o = dst + (long)d * ncp;
		for (int c = 0; c < n; c++)
			o[c] = src[c * ld + d];
		memset(o + n, 0, sizeof(float) * (size_t)(ncp - n));
	}
}

/* dst[x] = alpha * dst[x] + src[x] for x < n, n a multiple of 8. */
AT_INLINE void at_axpy_row(float *dst, float alpha, const float *src, int n)
{
	hp_v8 av = hp_v8_set1(alpha);

	for (int x = 0; x < n; x += 8)
		hp_v8_store(dst + x, hp_v8_load(dst + x) * av + hp_v8_load(src + x));
}

/* ---- the lanes and the mask of a query tile ---- */

/* The lanes of a query tile: query r (row r0 + r of the queries, at
 * position q0 + r0 + r of its row; sg, if given, the position where each
 * query's document starts) sees keys first[r] .. last[r]; padding lanes
 * (rows <= r < rp) see none. */
AT_INLINE void at_lanes(int32_t *first, int32_t *last, const int32_t *sg, int r0, int rows, int rp, int q0)
{
	for (int r = 0; r < rp; r++) {
		first[r] = r < rows ? (sg ? sg[r0 + r] : 0) : INT32_MAX;
		last[r] = q0 + r0 + r;
	}
}

/* Whether every key c0 .. c0+kc-1 is visible to every query of a tile
 * whose first query is at position p0 and whose last one's document starts
 * at sg[rlast] (documents are contiguous, so it starts latest); padding
 * lanes are the caller's to rule out. */
AT_INLINE int at_all_visible(int c0, int kc, int p0, const int32_t *sg, int rlast)
{
	return c0 + kc - 1 <= p0 && (!sg || sg[rlast] <= c0);
}

/* Eight lanes of a query tile against key jv (the key's position in all
 * eight lanes; written out as { j, ..., j } where it is used, in the loop
 * over keys: built in a helper, GCC assembles it lane by lane instead of
 * one broadcast): x where the key is visible to the lane's query
 * (first[] <= jv <= last[], see at_lanes; the pointers at the eight
 * lanes), `fill` where it is not. */
AT_INLINE hp_v8 at_mask8(hp_v8 x, hp_v8i jv, const int32_t *first, const int32_t *last, float fill)
{
	hp_v8i f, l8;

	__builtin_memcpy(&f, first, sizeof(f));
	__builtin_memcpy(&l8, last, sizeof(l8));
	return hp_v8_select((f <= jv) & (jv <= l8), x, hp_v8_set1(fill));
}

/* Scores of a transposed tile t[c][r] (kc rows of rp lanes, key c0 + c):
 * each times scale, then -inf where the mask hides the pair (unless full,
 * every pair visible), so that exp() turns it into an exact zero; with mt,
 * mt[r] = max(mt[r], t[c][r]) over the tile as well, in the same pass. */
AT_INLINE void at_scores(float *t, int kc, int rp, int c0, float scale, int full, const int32_t *first,
			 const int32_t *last, float *mt)
{
	for (int c = 0; c < kc; c++) {
		float *s = t + (long)c * rp;
		hp_v8i jv = { c0 + c, c0 + c, c0 + c, c0 + c, c0 + c, c0 + c, c0 + c, c0 + c };
		for (int r = 0; r < rp; r += 8) {
			hp_v8 x = hp_v8_load(s + r) * hp_v8_set1(scale);
			if (!full)
				x = at_mask8(x, jv, first + r, last + r, -INFINITY);
			hp_v8_store(s + r, x);
			if (mt)
				hp_v8_store(mt + r, hp_v8_max(hp_v8_load(mt + r), x));
		}
	}
}

/* n floats rounded to bf16 (nearest even; NaN stays NaN) and back: a
 * GPU's tensor-core operand (hp_flash_attention_fwd_round) */
AT_INLINE void at_round_bf16(float *x, long n)
{
	for (long i = 0; i < n; i++) {
		uint32_t u;

		memcpy(&u, &x[i], 4);
		if ((u & 0x7fffffffu) <= 0x7f800000u)
			u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
		memcpy(&x[i], &u, 4);
	}
}

/* ---- the forward of a query tile ---- */

/* A query tile of the forward, for one (batch, query head). */
struct at_fwd {
	const float *q;         /* the tile's first query; queries qs floats apart */
	const float *k, *v;     /* key and value 0 of the row (its kv head); ks apart */
	const int32_t *sg;      /* where each query's document starts, by query row; NULL: row 0 */
	float *out;             /* the tile's first output row; qs apart */
	float *lse;             /* the tile's first lse, one per query; NULL: none */
	float *P;               /* NULL, or rows of the scores, ldp apart, by key position */
	long qs, ks, ldp;
	int r0, rows, q0, D;    /* queries r0 .. r0+rows-1 of sg, at positions q0 + r0 .. */
	int rnd;                /* P rounded to bf16 before P V (at_round_bf16) */
};

/*
 * The forward of one query tile, from the tile's earliest document start
 * to its last query's position (causal; documents are contiguous, so the
 * first query's document starts earliest), a key tile at a time.  The
 * scores are computed transposed, S^T = K Q^T with Q^T built once: the key
 * tiles need no transposing, and the online softmax runs down the columns
 * of S^T with one vector lane per query - a running max m (float) and sum
 * l (double) per query, the output accumulator rescaled when m grows, each
 * key tile's P V summed apart and then added.  Writes out = O / l and lse =
 * m + log(l); with P, each key tile's scaled, masked scores (-inf where
 * masked) into P's rows, beside the computation, never read back by it.
 * m and l (AT_MAX_TB each) receive the lanes' final max and sum.
 */
AT_INLINE void at_fwd_tile(const struct at_fwd *a, float *m, double *l, int isa)
{
	int D = a->D, Dp = at_dpad(D), TB = at_tile(D), r0 = a->r0, rows = a->rows, rp = (rows + 15) & ~15;
	int klo = a->sg ? a->sg[r0] : 0, khi = a->q0 + r0 + rows - 1;
	float scale = 1.0f / sqrtf((float)D);
	at_tile_buf Qt, Kp, Vp, O, tmp;
	at_score_buf St;
	/* per query lane: this tile's max (then the max exp() subtracts),
	 * rescale factor, this tile's sum; the keys it may see */
	float mt[AT_MAX_TB], alpha[AT_MAX_TB], ts[AT_MAX_TB];
	int32_t first[AT_MAX_TB], last[AT_MAX_TB];

	at_load_cols(Qt, a->q, a->qs, rows, rp, D);
	memset(O, 0, sizeof(float) * (size_t)rows * Dp);
	at_lanes(first, last, a->sg, r0, rows, rp, a->q0);
	for (int r = 0; r < rp; r++)
		m[r] = -INFINITY, l[r] = 0;
	for (int c0 = klo; c0 <= khi; c0 += TB) {
		int kc = khi + 1 - c0 < TB ? khi + 1 - c0 : TB;
		/* every (key, query) pair of the tile visible, no padding lane */
		int full = at_all_visible(c0, kc, a->q0 + r0, a->sg, r0 + rows - 1) && rows == rp;

		/* S^T[c][r] = k_c . q_r, scaled, -inf where masked; mt the new max */
		at_load_rows(Kp, a->k + (long)c0 * a->ks, a->ks, kc, D, Dp);
		at_load_rows(Vp, a->v + (long)c0 * a->ks, a->ks, kc, D, Dp);
		at_mm(isa, kc, rp, D, Kp, Dp, 1, Qt, rp, St, rp, 0);
		memcpy(mt, m, sizeof(float) * (size_t)rp);
		at_scores(St, kc, rp, c0, scale, full, first, last, mt);
		if (a->P)       /* the scores, for the caller */
			for (int r = 0; r < rows; r++) {
				float *pr = a->P + (long)r * a->ldp + c0;
				for (int c = 0; c < kc; c++)
					pr[c] = St[(long)c * rp + r];
			}
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
		if (a->rnd)     /* after l's sums, as a GPU's: they add the fp32 P */
			at_round_bf16(St, (long)kc * rp);
		/* O = alpha O + P V, the tile's product summed apart */
		at_mm(isa, rows, Dp, kc, St, 1, rp, Vp, Dp, tmp, Dp, 0);
		for (int r = 0; r < rows; r++) {
			l[r] = l[r] * alpha[r] + ts[r];
			at_axpy_row(O + (long)r * Dp, alpha[r], tmp + (long)r * Dp, Dp);
		}
	}
	for (int r = 0; r < rows; r++) {
		float *oi = a->out + r * a->qs;
		const float *src = O + (long)r * Dp;
		double inv = 1.0 / l[r];
		for (int d = 0; d < D; d++)
			oi[d] = (float)(src[d] * inv);
		if (a->lse)
			a->lse[r] = (float)(m[r] + log(l[r]));
	}
}

#endif
