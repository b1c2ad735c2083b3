/*
 * flashattn.c - tiled causal grouped-query attention (FlashAttention-2),
 * forward and backward, F32, for the CPU.
 *
 * The same function as hp_attention_fwd_ref/bwd_ref in attention.c (HF
 * eager semantics, repeat_kv without the copy, the `seg` block-diagonal
 * causal mask of packed rows), computed a tile at a time so that no T x T
 * matrix ever exists.  The forward walks, per (batch, head, query tile),
 * the key tiles the mask can reach - from the tile's earliest document
 * start to its last row - keeping a running max m and sum l per query
 * (online softmax), rescaling the output accumulator when m grows, and
 * saves lse = m + log(l) per query instead of P.  It computes the scores
 * transposed, S^T = K Q^T, so that Q^T is built once per query tile and
 * the softmax runs down the columns with one vector lane per query.  The
 * backward recomputes P = exp(S - lse), key tiles outer and query tiles
 * inner, so that dK and dV of a key tile accumulate on the stack over
 * every query tile and every query head of the kv head's group, and K^T,
 * V^T are built once per key tile:
 *   Di = rowsum(dOi * Oi)             dV_j += P^T dO_i
 *   dP = dO_i V_j^T                   dS    = P * (dP - Di)
 *   dQ_i += scale * dS K_j            dK_j += scale * dS^T Q_i
 * Di is recomputed for each (key tile, query tile) pair rather than stored:
 * it costs rows x D multiply-adds against the pair's 5 x rows x TB x D, and
 * keeps the backward free of caller memory (hp_flash_attention_scratch is
 * 0) and free to run (batch, kv head) pairs on different threads.  Each
 * tile product is summed apart and then added to its accumulator (O, dQ,
 * dK, dV), so long sums round as sums of tile sums.
 *
 * Tiles are square, TB = 64 rows for head_dim <= 128 and smaller above (see
 * fa_tile), copied out of q, k, v, dout into contiguous buffers (rows read
 * in place sit H*D floats apart, alias in L1 and made the products 10-30%
 * slower) on the stack of the thread that works on them; head_dim is
 * padded with zeros to a multiple of 16, so the products need no tails.
 *
 * The tile products (fa_mm8, fa_mm16) are GCC vector extensions, compiled
 * three times - AVX-512 (16 lanes), AVX2 and baseline x86-64 (8 lanes) -
 * and picked per call.  Each element of a product is one float sum in k
 * order, so the vector width, the register blocking and the version do not
 * change a single bit (t/unit/test-flashattn.c checks); with
 * -ffp-contract=off none fuses a multiply-add.  On Zen 5 (separate add and
 * multiply pipes) the AVX-512 version runs at 55-70 Gmul-add/s per core at
 * T = 2048, D = 64.
 *
 * Threads: work is split into independent items - (batch, head, query tile)
 * in the forward, (batch, kv head) in the backward - that write disjoint
 * outputs, handed out through an atomic counter to hp_sgemm_threads()
 * threads (HP_NUM_THREADS, ...; hp_flash_attention_set_threads overrides)
 * started for the call when it is large enough to pay for them.  Every
 * output element is computed by one thread in a fixed order, so results are
 * bit-identical whatever the thread count.  The backward has only
 * B * n_kv_heads items: fewer than the threads, some of them idle.
 *
 * What it is not: a kernel for masks other than causal/packed-causal, for
 * dropout, for head_dim above HP_FLASH_ATTENTION_MAX_HEAD_DIM, or
 * bit-identical to the eager kernels (it matches them to float rounding;
 * t/unit/test-flashattn.c pins 1e-5 relative L2).
 */
#include <math.h>
#include <pthread.h>

#include "cpu/gemm.h"
#include "cpu/ops.h"
#include "cpu/vec.h"

/* Three compiled versions of the work items (see fa_mm8) where GCC targets
 * x86-64, picked per call by __builtin_cpu_supports; one elsewhere.
 * flatten: vec.h's helpers are static inline, and GCC may keep one
 * out-of-line baseline copy of them (hp_row_exp_sum was, at 40% of the
 * time); flatten inlines everything into each version. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(HP_NO_CLONES)
#define FA_X86 1
#define FA_V4 __attribute__((target("arch=x86-64-v4"), flatten))
#define FA_V3 __attribute__((target("arch=x86-64-v3"), flatten))
#endif
#define FA_BASE __attribute__((flatten))
#define FA_INLINE static inline __attribute__((always_inline))

typedef float fa_v16 __attribute__((vector_size(64)));

/* One tile buffer: 64 rows of a head_dim padded to 128 (32 KiB).  The
 * forward keeps 5 of them and a TB x TB score tile on the stack (about
 * 180 KiB), the backward 8 and two (about 300 KiB), the caller's stack
 * included; worker threads get FA_STACK bytes of stack. */
#define FA_TILE_FLOATS 8192
#define FA_MAX_TB 64
#define FA_STACK (4u << 20)
#define FA_MAX_THREADS 64
/* Below this many multiply-adds (0.2 ms on an AVX-512 core, 1 ms on a
 * baseline one) a call runs on the calling thread: starting a worker
 * costs tens of microseconds. */
#define FA_MIN_THREADED_MACS (1L << 23)

static int fa_dpad(int D)
{
	return (D + 15) & ~15;
}

/* Rows per tile: as many as fit FA_TILE_FLOATS at the padded head_dim, a
 * multiple of 16, at most 64 (64 for D <= 128, 32 for D <= 256, 16 for
 * D <= 512). */
static int fa_tile(int D)
{
	int t = (FA_TILE_FLOATS / fa_dpad(D)) & ~15;

	return t > FA_MAX_TB ? FA_MAX_TB : t;
}

int hp_flash_attention_supports(int head_dim)
{
	return head_dim >= 1 && head_dim <= HP_FLASH_ATTENTION_MAX_HEAD_DIM;
}

/* The preconditions of ops.h; a call that breaks them is the caller's bug
 * and gets NaN outputs (loud, and nothing out of bounds). */
static int fa_valid(int n_heads, int n_kv_heads, int head_dim)
{
	return hp_flash_attention_supports(head_dim) && n_kv_heads > 0 && n_heads % n_kv_heads == 0;
}

size_t hp_flash_attention_scratch(int T, int n_heads, int head_dim)
{
	return 0;     /* see the top of the file: the backward needs no caller memory */
}

static int fa_threads_override;

void hp_flash_attention_set_threads(int n)
{
	__atomic_store_n(&fa_threads_override, n > 0 ? n : 0, __ATOMIC_RELAXED);
}

/* ---- tile products ---- */

FA_INLINE fa_v16 fa_load16(const float *p)
{
	fa_v16 v;
	__builtin_memcpy(&v, p, sizeof(v));
	return v;
}

FA_INLINE void fa_store16(float *p, fa_v16 v)
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
FA_INLINE void fa_mm8(int nv, int M, int N, int K, const float *A, long sam, long sak,
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

FA_INLINE void fa_mm16(int M, int N, int K, const float *A, long sam, long sak,
		       const float *B, long ldb, float *C, long ldc, int acc)
{
	int n = 0;

	for (; n + 32 <= N; n += 32) {
		int m = 0;
		for (; m + 4 <= M; m += 4) {
			const float *a = A + m * sam, *b = B + n;
			float *c = C + m * ldc + n;
			fa_v16 z = { 0 }, c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z;
			if (acc) {
				c00 = fa_load16(c), c01 = fa_load16(c + 16);
				c10 = fa_load16(c + ldc), c11 = fa_load16(c + ldc + 16);
				c20 = fa_load16(c + 2 * ldc), c21 = fa_load16(c + 2 * ldc + 16);
				c30 = fa_load16(c + 3 * ldc), c31 = fa_load16(c + 3 * ldc + 16);
			}
			for (int k = 0; k < K; k++, a += sak, b += ldb) {
				fa_v16 b0 = fa_load16(b), b1 = fa_load16(b + 16);
				float a0 = a[0], a1 = a[sam], a2 = a[2 * sam], a3 = a[3 * sam];
				c00 += b0 * a0, c01 += b1 * a0;
				c10 += b0 * a1, c11 += b1 * a1;
				c20 += b0 * a2, c21 += b1 * a2;
				c30 += b0 * a3, c31 += b1 * a3;
			}
			fa_store16(c, c00), fa_store16(c + 16, c01);
			fa_store16(c + ldc, c10), fa_store16(c + ldc + 16, c11);
			fa_store16(c + 2 * ldc, c20), fa_store16(c + 2 * ldc + 16, c21);
			fa_store16(c + 3 * ldc, c30), fa_store16(c + 3 * ldc + 16, c31);
		}
		for (; m < M; m++) {
			const float *a = A + m * sam, *b = B + n;
			float *c = C + m * ldc + n;
			fa_v16 c0 = { 0 }, c1 = { 0 };
			if (acc)
				c0 = fa_load16(c), c1 = fa_load16(c + 16);
			for (int k = 0; k < K; k++, a += sak, b += ldb)
				c0 += fa_load16(b) * a[0], c1 += fa_load16(b + 16) * a[0];
			fa_store16(c, c0), fa_store16(c + 16, c1);
		}
	}
	if (n < N)      /* the last 16 columns */
		for (int m = 0; m < M; m++) {
			const float *a = A + m * sam, *b = B + n;
			float *c = C + m * ldc + n;
			fa_v16 c0 = acc ? fa_load16(c) : (fa_v16){ 0 };
			for (int k = 0; k < K; k++, a += sak, b += ldb)
				c0 += fa_load16(b) * a[0];
			fa_store16(c, c0);
		}
}

/* `isa` (2 AVX-512, 1 AVX2, 0 baseline) is a constant in each compiled
 * version, so one kernel is inlined. */
#define fa_mm(isa, ...) ((isa) == 2 ? fa_mm16(__VA_ARGS__) : fa_mm8((isa) == 1 ? 2 : 1, __VA_ARGS__))

/* ---- loading tiles ---- */

/* dst[r][0..Dp) = src row r (stride ld), zero-padded from D; r < rows. */
FA_INLINE void fa_load_rows(float *dst, const float *src, long ld, int rows, int D, int Dp)
{
	for (int r = 0; r < rows; r++) {
		memcpy(dst + (long)r * Dp, src + r * ld, sizeof(float) * (size_t)D);
		memset(dst + (long)r * Dp + D, 0, sizeof(float) * (size_t)(Dp - D));
	}
}

/* dst[d][c] = src[c*ld + d] for d < D (a transposed tile with leading
 * dimension ncp), zero for n <= c < ncp. */
FA_INLINE void fa_load_cols(float *dst, const float *src, long ld, int n, int ncp, int D)
{
	for (int d = 0; d < D; d++) {
		float *o = dst + (long)d * ncp;
		for (int c = 0; c < n; c++)
			o[c] = src[c * ld + d];
		memset(o + n, 0, sizeof(float) * (size_t)(ncp - n));
	}
}

/* Keep columns [lo, hi] of a score row of ncp floats and set the rest to
 * -inf, so that exp() turns them into exact zeros (all of them if lo > hi). */
FA_INLINE void fa_mask_row(float *s, int lo, int hi, int ncp)
{
	for (int j = 0; j < lo && j < ncp; j++)
		s[j] = -INFINITY;
	for (int j = hi + 1 > 0 ? hi + 1 : 0; j < ncp; j++)
		s[j] = -INFINITY;
}

/* dst[x] = alpha * dst[x] + src[x] for x < n, n a multiple of 8. */
FA_INLINE void fa_axpy_row(float *dst, float alpha, const float *src, int n)
{
	hp_v8 av = hp_v8_set1(alpha);

	for (int x = 0; x < n; x += 8)
		hp_v8_store(dst + x, hp_v8_load(dst + x) * av + hp_v8_load(src + x));
}

/* ---- work items ---- */

struct fa_args {
	/* forward */
	float *out, *lse_out;
	/* backward */
	float *dq, *dk, *dv;
	const float *dout, *o, *lse;
	/* both */
	const float *q, *k, *v;
	const int32_t *seg;
	int B, T, H, KV, D;
};

/*
 * Forward of (batch b, head h, query tile qt); items run heaviest tile
 * first (the last query tile of a row sees the most keys).  The scores are
 * computed transposed, S^T = K Q^T with Q^T built once per query tile: the
 * key tiles then need no transposing, and the online softmax runs down the
 * columns of S^T with one vector lane per query.
 */
FA_INLINE void fa_fwd_body(const struct fa_args *a, long item, int isa)
{
	int T = a->T, H = a->H, D = a->D, Dp = fa_dpad(D), TB = fa_tile(D);
	int nqt = (T + TB - 1) / TB, qt = nqt - 1 - (int)(item % nqt);
	int h = (int)(item / nqt % H), b = (int)(item / nqt / H), kh = h / (H / a->KV);
	long qs = (long)H * D, ks = (long)a->KV * D;
	float scale = 1.0f / sqrtf((float)D);
	const int32_t *sg = a->seg ? a->seg + (long)b * T : NULL;
	int r0 = qt * TB, rows = T - r0 < TB ? T - r0 : TB, rp = (rows + 15) & ~15, rlast = r0 + rows - 1;
	const float *kb = a->k + (long)b * T * ks + kh * D, *vb = a->v + (long)b * T * ks + kh * D;
	float Qt[FA_TILE_FLOATS] __attribute__((aligned(64)));
	float Kp[FA_TILE_FLOATS] __attribute__((aligned(64)));
	float Vp[FA_TILE_FLOATS] __attribute__((aligned(64)));
	float O[FA_TILE_FLOATS] __attribute__((aligned(64)));
	float tmp[FA_TILE_FLOATS] __attribute__((aligned(64)));
	float St[FA_MAX_TB * FA_MAX_TB] __attribute__((aligned(64)));
	/* per query lane: running max, this tile's max (then the max exp()
	 * subtracts), rescale factor, this tile's sum; the keys it may see */
	float m[FA_MAX_TB], mt[FA_MAX_TB], alpha[FA_MAX_TB], ts[FA_MAX_TB];
	int32_t first[FA_MAX_TB], last[FA_MAX_TB];
	double l[FA_MAX_TB];

	fa_load_cols(Qt, a->q + ((long)b * T + r0) * qs + h * D, qs, rows, rp, D);
	memset(O, 0, sizeof(float) * (size_t)rows * Dp);
	for (int r = 0; r < rp; r++) {
		m[r] = -INFINITY, l[r] = 0;
		/* padding lanes (r >= rows) see nothing: they stay -inf, P = 0 */
		first[r] = r < rows ? (sg ? sg[r0 + r] : 0) : INT32_MAX;
		last[r] = r0 + r;
	}
	/* Documents are contiguous, so the tile's first row starts earliest:
	 * key tiles begin there and end at the tile's last row (causal). */
	for (int c0 = sg ? sg[r0] : 0; c0 <= rlast; c0 += TB) {
		int kc = rlast + 1 - c0 < TB ? rlast + 1 - c0 : TB;
		/* every (key, query) pair of the tile visible, no padding lane */
		int full = c0 + kc - 1 <= r0 && (!sg || sg[rlast] <= c0) && rows == rp;

		/* S^T[c][r] = k_c . q_r.  K and V rows are copied into contiguous
		 * tiles: read in place, rows H*D floats apart alias in L1 and
		 * make the products 10-30% slower. */
		fa_load_rows(Kp, kb + (long)c0 * ks, ks, kc, D, Dp);
		fa_load_rows(Vp, vb + (long)c0 * ks, ks, kc, D, Dp);
		fa_mm(isa, kc, rp, D, Kp, Dp, 1, Qt, rp, St, rp, 0);
		memcpy(mt, m, sizeof(float) * (size_t)rp);
		for (int c = 0; c < kc; c++) {
			float *s = St + (long)c * rp;
			hp_v8i jv = { c0 + c, c0 + c, c0 + c, c0 + c, c0 + c, c0 + c, c0 + c, c0 + c };
			for (int r = 0; r < rp; r += 8) {
				hp_v8 x = hp_v8_load(s + r) * hp_v8_set1(scale);
				if (!full) {
					hp_v8i f, l8;
					__builtin_memcpy(&f, first + r, sizeof(f));
					__builtin_memcpy(&l8, last + r, sizeof(l8));
					x = hp_v8_select((f <= jv) & (jv <= l8), x, hp_v8_set1(-INFINITY));
				}
				hp_v8_store(s + r, x);
				hp_v8_store(mt + r, hp_v8_max(hp_v8_load(mt + r), x));
			}
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
		/* O = alpha O + P V, the tile's product summed apart */
		fa_mm(isa, rows, Dp, kc, St, 1, rp, Vp, Dp, tmp, Dp, 0);
		for (int r = 0; r < rows; r++) {
			l[r] = l[r] * alpha[r] + ts[r];
			fa_axpy_row(O + (long)r * Dp, alpha[r], tmp + (long)r * Dp, Dp);
		}
	}
	for (int r = 0; r < rows; r++) {
		int i = r0 + r;
		float *oi = a->out + ((long)b * T + i) * qs + h * D;
		const float *src = O + (long)r * Dp;
		double inv = 1.0 / l[r];
		for (int d = 0; d < D; d++)
			oi[d] = (float)(src[d] * inv);
		a->lse_out[((long)b * H + h) * T + i] = (float)(m[r] + log(l[r]));
	}
}

/* The last row i >= c0 with seg[i] <= c_end (seg non-decreasing, so the rows
 * that see any key of [c0, c_end] are exactly c0..that row). */
static int fa_last_row(const int32_t *sg, int T, int c0, int c_end)
{
	int lo = c0, hi = T - 1;

	if (!sg)
		return T - 1;
	while (lo < hi) {           /* sg[c0] <= c0 <= c_end: lo always qualifies */
		int mid = lo + (hi - lo + 1) / 2;
		if (sg[mid] <= c_end)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

/* Backward of (batch b, kv head kh): dk, dv of that head, dq of the query
 * heads of its group.  K and V are transposed once per key tile and serve
 * every query tile of every head of the group. */
FA_INLINE void fa_bwd_body(const struct fa_args *a, long item, int isa)
{
	int T = a->T, H = a->H, D = a->D, Dp = fa_dpad(D), TB = fa_tile(D);
	int group = H / a->KV, kh = (int)(item % a->KV), b = (int)(item / a->KV);
	long qs = (long)H * D, ks = (long)a->KV * D;
	float scale = 1.0f / sqrtf((float)D);
	const int32_t *sg = a->seg ? a->seg + (long)b * T : NULL;
	const float *kb = a->k + (long)b * T * ks + kh * D, *vb = a->v + (long)b * T * ks + kh * D;
	float *dkb = a->dk + (long)b * T * ks + kh * D, *dvb = a->dv + (long)b * T * ks + kh * D;
	float Kt[FA_TILE_FLOATS] __attribute__((aligned(64)));
	float Vt[FA_TILE_FLOATS] __attribute__((aligned(64)));
	float Kp[FA_TILE_FLOATS] __attribute__((aligned(64)));
	float dKa[FA_TILE_FLOATS] __attribute__((aligned(64)));
	float dVa[FA_TILE_FLOATS] __attribute__((aligned(64)));
	float Qp[FA_TILE_FLOATS] __attribute__((aligned(64)));
	float dOp[FA_TILE_FLOATS] __attribute__((aligned(64)));
	float tmp[FA_TILE_FLOATS] __attribute__((aligned(64)));
	float P[FA_MAX_TB * FA_MAX_TB] __attribute__((aligned(64)));
	float dS[FA_MAX_TB * FA_MAX_TB] __attribute__((aligned(64)));
	float Di[FA_MAX_TB];

	for (int hh = 0; hh < group; hh++)
		for (int i = 0; i < T; i++)
			memset(a->dq + ((long)b * T + i) * qs + (kh * group + hh) * D, 0, sizeof(float) * (size_t)D);
	for (int c0 = 0; c0 < T; c0 += TB) {
		int kc = T - c0 < TB ? T - c0 : TB, kcp = (kc + 15) & ~15;
		int ilast = fa_last_row(sg, T, c0, c0 + kc - 1);
		fa_load_rows(Kp, kb + (long)c0 * ks, ks, kc, D, Dp);
		fa_load_cols(Kt, kb + (long)c0 * ks, ks, kc, kcp, D);
		fa_load_cols(Vt, vb + (long)c0 * ks, ks, kc, kcp, D);
		memset(dKa, 0, sizeof(float) * (size_t)kc * Dp);
		memset(dVa, 0, sizeof(float) * (size_t)kc * Dp);
		for (int hh = 0; hh < group; hh++) {
			int h = kh * group + hh;
			const float *lse = a->lse + ((long)b * H + h) * T;
			for (int r0 = c0; r0 <= ilast; r0 += TB) {
				int rows = ilast + 1 - r0 < TB ? ilast + 1 - r0 : TB;
				long base = ((long)b * T + r0) * qs + h * D;
				/* every pair visible and no padding column */
				int full = c0 + kc - 1 <= r0 && (!sg || sg[r0 + rows - 1] <= c0) && kc == kcp;
				/* contiguous copies: see the forward */
				fa_load_rows(Qp, a->q + base, qs, rows, D, Dp);
				fa_load_rows(dOp, a->dout + base, qs, rows, D, Dp);

				for (int r = 0; r < rows; r++)
					Di[r] = hp_row_dot(a->dout + base + r * qs, a->o + base + r * qs, D);
				/* P = exp(scale * Q K^T - lse), masked entries exactly 0 */
				fa_mm(isa, rows, kcp, D, Qp, Dp, 1, Kt, kcp, P, kcp, 0);
				for (int r = 0; r < rows; r++) {
					int i = r0 + r, lo = (sg && sg[i] > c0 ? sg[i] : c0) - c0;
					int hi = (i < c0 + kc - 1 ? i : c0 + kc - 1) - c0;
					float *p = P + (long)r * kcp;
					if (!full)
						fa_mask_row(p, lo, hi, kcp);
					hp_row_scale(p, kcp, scale);
					hp_row_exp_sum(p, kcp, lse[i]);
				}
				/* dV += P^T dO, through a fresh tile so that long sums
				 * round as sums of tile sums */
				fa_mm(isa, kc, Dp, rows, P, 1, kcp, dOp, Dp, tmp, Dp, 0);
				for (int c = 0; c < kc; c++)
					fa_axpy_row(dVa + (long)c * Dp, 1.0f, tmp + (long)c * Dp, Dp);
				/* dS = P * (dO V^T - Di) */
				fa_mm(isa, rows, kcp, D, dOp, Dp, 1, Vt, kcp, dS, kcp, 0);
				for (int r = 0; r < rows; r++) {
					float *ds = dS + (long)r * kcp;
					const float *p = P + (long)r * kcp;
					hp_v8 dv8 = hp_v8_set1(Di[r]);
					for (int j = 0; j < kcp; j += 8)
						hp_v8_store(ds + j, hp_v8_load(p + j) * (hp_v8_load(ds + j) - dv8));
				}
				/* dQ += scale * dS K */
				fa_mm(isa, rows, Dp, kc, dS, kcp, 1, Kp, Dp, tmp, Dp, 0);
				for (int r = 0; r < rows; r++) {
					float *dqi = a->dq + base + r * qs;
					const float *t = tmp + (long)r * Dp;
					int d = 0;
					for (; d + 8 <= D; d += 8)
						hp_v8_store(dqi + d, hp_v8_load(dqi + d) + hp_v8_set1(scale) * hp_v8_load(t + d));
					for (; d < D; d++)
						dqi[d] += scale * t[d];
				}
				/* dK += dS^T Q (scaled when written) */
				fa_mm(isa, kc, Dp, rows, dS, 1, kcp, Qp, Dp, tmp, Dp, 0);
				for (int c = 0; c < kc; c++)
					fa_axpy_row(dKa + (long)c * Dp, 1.0f, tmp + (long)c * Dp, Dp);
			}
		}
		for (int c = 0; c < kc; c++) {
			float *dkc = dkb + (long)(c0 + c) * ks, *dvc = dvb + (long)(c0 + c) * ks;
			for (int d = 0; d < D; d++) {
				dkc[d] = scale * dKa[(long)c * Dp + d];
				dvc[d] = dVa[(long)c * Dp + d];
			}
		}
	}
}

/* A call: its work items and the compiled version that runs them. */
struct fa_job {
	void (*fn)(const struct fa_args *, long);
	const struct fa_args *args;
	long n;
	long next;              /* atomic */
};

/* The compiled versions (same bits, see fa_mm8). */
#ifdef FA_X86
FA_V4 static void fa_fwd_item_v4(const struct fa_args *a, long item)
{
	fa_fwd_body(a, item, 2);
}

FA_V4 static void fa_bwd_item_v4(const struct fa_args *a, long item)
{
	fa_bwd_body(a, item, 2);
}

FA_V3 static void fa_fwd_item_v3(const struct fa_args *a, long item)
{
	fa_fwd_body(a, item, 1);
}

FA_V3 static void fa_bwd_item_v3(const struct fa_args *a, long item)
{
	fa_bwd_body(a, item, 1);
}
#endif

FA_BASE static void fa_fwd_item(const struct fa_args *a, long item)
{
	fa_fwd_body(a, item, 0);
}

FA_BASE static void fa_bwd_item(const struct fa_args *a, long item)
{
	fa_bwd_body(a, item, 0);
}

/* The version for this call: the best the CPU has, capped by HP_FLASH
 * ("avx2" or "baseline"; read on every call, so that a test can compare
 * the versions in one process). */
static void fa_pick(struct fa_job *j, int bwd)
{
#ifdef FA_X86
	const char *e = getenv("HP_FLASH");
	int cap = e && !strcmp(e, "baseline") ? 0 : e && !strcmp(e, "avx2") ? 1 : 2;

	if (cap >= 2 && __builtin_cpu_supports("x86-64-v4"))
		j->fn = bwd ? fa_bwd_item_v4 : fa_fwd_item_v4;
	else if (cap >= 1 && __builtin_cpu_supports("x86-64-v3"))
		j->fn = bwd ? fa_bwd_item_v3 : fa_fwd_item_v3;
	else
#endif
		j->fn = bwd ? fa_bwd_item : fa_fwd_item;
}

/* ---- threads ---- */

static void *fa_drain(void *p)
{
	struct fa_job *j = p;
	long i;

	while ((i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->n)
		j->fn(j->args, i);
	return NULL;
}

/* Run the job's items over up to hp_sgemm_threads() threads, the caller
 * included; a worker that fails to start leaves its share to the others. */
static void fa_run(struct fa_job *j, double macs)
{
	int nt = __atomic_load_n(&fa_threads_override, __ATOMIC_RELAXED);
	pthread_t tid[FA_MAX_THREADS];
	pthread_attr_t at;
	int started = 0;

	if (nt <= 0)
		nt = hp_sgemm_threads();
	if (nt > FA_MAX_THREADS)
		nt = FA_MAX_THREADS;
	if (nt > j->n)
		nt = (int)j->n;
	if (macs < (double)FA_MIN_THREADED_MACS)
		nt = 1;
	if (nt > 1 && !pthread_attr_init(&at)) {
		pthread_attr_setstacksize(&at, FA_STACK);
		while (started < nt - 1 && !pthread_create(&tid[started], &at, fa_drain, j))
			started++;
		pthread_attr_destroy(&at);
	}
	fa_drain(j);
	for (int t = 0; t < started; t++)
		pthread_join(tid[t], NULL);
}

/* Multiply-adds of one product over the causal triangle (an upper bound
 * with packed rows): enough to decide whether threads pay. */
static double fa_macs(int B, int T, int H, int D)
{
	return (double)B * H * ((double)T * (T + 1) / 2) * D;
}

static void fa_fill_nan(float *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = NAN;
}

void hp_flash_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
			    const int32_t *seg, int B, int T, int n_heads, int n_kv_heads, int head_dim)
{
	struct fa_args a = { .out = out, .lse_out = lse, .q = q, .k = k, .v = v, .seg = seg,
			     .B = B, .T = T, .H = n_heads, .KV = n_kv_heads, .D = head_dim };

	if (B <= 0 || T <= 0 || n_heads <= 0)
		return;
	if (!fa_valid(n_heads, n_kv_heads, head_dim)) {
		fa_fill_nan(out, (size_t)B * T * n_heads * (head_dim > 0 ? head_dim : 0));
		fa_fill_nan(lse, (size_t)B * n_heads * T);
		return;
	}
	int TB = fa_tile(head_dim);
	struct fa_job j = { NULL, &a, (long)B * n_heads * ((T + TB - 1) / TB), 0 };
	fa_pick(&j, 0);
	fa_run(&j, 2 * fa_macs(B, T, n_heads, head_dim));
}

void hp_flash_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
			    const float *lse, const float *q, const float *k, const float *v,
			    const int32_t *seg, float *scratch, int B, int T, int n_heads,
			    int n_kv_heads, int head_dim)
{
	struct fa_args a = { .dq = dq, .dk = dk, .dv = dv, .dout = dout, .o = out, .lse = lse,
			     .q = q, .k = k, .v = v, .seg = seg,
			     .B = B, .T = T, .H = n_heads, .KV = n_kv_heads, .D = head_dim };

	(void)scratch;
	if (B <= 0 || T <= 0 || n_heads <= 0)
		return;
	if (!fa_valid(n_heads, n_kv_heads, head_dim)) {
		size_t nd = head_dim > 0 ? (size_t)head_dim : 0;
		fa_fill_nan(dq, (size_t)B * T * n_heads * nd);
		fa_fill_nan(dk, (size_t)B * T * (n_kv_heads > 0 ? n_kv_heads : 0) * nd);
		fa_fill_nan(dv, (size_t)B * T * (n_kv_heads > 0 ? n_kv_heads : 0) * nd);
		return;
	}
	struct fa_job j = { NULL, &a, (long)B * n_kv_heads, 0 };
	fa_pick(&j, 1);
	fa_run(&j, 5 * fa_macs(B, T, n_heads, head_dim));
}
