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
 * Shared code: the tile machinery lives in attntile.h and attntile.c,
 * shared with the context-parallel kernel (cpattn.c) - the tile sizes, the
 * tile products, the tile copies, the query lanes and mask, the whole
 * forward of a query tile (at_fwd_tile, which this file runs with the
 * queries at positions 0.., q0 = 0), the compiled versions and the
 * threads.  What stays here: the square causal row (T queries against
 * their own T keys), its work items, and the backward.
 *
 * Tiles are square, TB = 64 rows for head_dim <= 128 and smaller above (see
 * at_tile), copied out of q, k, v, dout into contiguous buffers (rows read
 * in place sit H*D floats apart, alias in L1 and made the products 10-30%
 * slower) on the stack of the thread that works on them; head_dim is
 * padded with zeros to a multiple of 16, so the products need no tails.
 *
 * The tile products (at_mm8, at_mm16 in attntile.h) are GCC vector
 * extensions, compiled three times - AVX-512 (16 lanes), AVX2 and baseline
 * x86-64 (8 lanes) - and picked per call (HP_CPU=avx2 or baseline caps
 * the version; HP_NO_CLONES builds only the baseline one).  Each element
 * of a product is one float sum in k order, so the vector width, the
 * register blocking and the version do not change a single bit
 * (t/unit/test-flashattn.c checks); with -ffp-contract=off none fuses a
 * multiply-add.  On Zen 5 (separate add and multiply pipes) the AVX-512
 * version runs at 55-70 Gmul-add/s per core at T = 2048, D = 64.
 *
 * Threads: work is split into independent items - (batch, head, query tile)
 * in the forward, (batch, kv head) in the backward - that write disjoint
 * outputs, handed out through an atomic counter (hp_attntile_run) to
 * hp_sgemm_threads() threads (HP_NUM_THREADS, ...;
 * hp_attention_set_threads overrides) started for the call when it
 * is large enough to pay for them.  Every output element is computed by
 * one thread in a fixed order, so results are bit-identical whatever the
 * thread count.  The backward has only B * n_kv_heads items: fewer than
 * the threads, some of them idle.
 *
 * What it is not: a kernel for masks other than causal/packed-causal, for
 * dropout, for head_dim above HP_FLASH_ATTENTION_MAX_HEAD_DIM, or
 * bit-identical to the eager kernels (it matches them to float rounding;
 * t/unit/test-flashattn.c pins 1e-5 relative L2).
 */
#include <math.h>

#include "cpu/attntile.h"
#include "cpu/ops.h"
#include "cpu/vec.h"

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
	int rnd;     /* a GPU's roundings (hp_flash_attention_fwd_round) */
};

/* Forward of (batch b, head h, query tile qt), heaviest tile first (the
 * last query tile of a row sees the most keys): at_fwd_tile with the
 * queries at positions 0 .. T-1 of their row (q0 = 0) and its T keys. */
AT_INLINE void fa_fwd_body(const struct fa_args *a, long item, int isa)
{
	int T = a->T, H = a->H, D = a->D, TB = at_tile(D);
	int nqt = (T + TB - 1) / TB, qt = nqt - 1 - (int)(item % nqt);
	int h = (int)(item / nqt % H), b = (int)(item / nqt / H), kh = h / (H / a->KV);
	long qs = (long)H * D, ks = (long)a->KV * D, row = ((long)b * T + qt * TB) * qs + h * D;
	struct at_fwd t = {
		.q = a->q + row, .k = a->k + (long)b * T * ks + kh * D, .v = a->v + (long)b * T * ks + kh * D,
		.sg = a->seg ? a->seg + (long)b * T : NULL, .out = a->out + row,
		.lse = a->lse_out + ((long)b * H + h) * T + qt * TB, .P = NULL, .qs = qs, .ks = ks, .ldp = 0,
		.r0 = qt * TB, .rows = T - qt * TB < TB ? T - qt * TB : TB, .q0 = 0, .D = D, .rnd = a->rnd,
	};
	float m[AT_MAX_TB];
	double l[AT_MAX_TB];

	at_fwd_tile(&t, m, l, isa);
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

/* Keep columns [lo, hi] of a score row of ncp floats and set the rest to
 * -inf, so that exp() turns them into exact zeros (all of them if lo > hi). */
AT_INLINE void fa_mask_row(float *s, int lo, int hi, int ncp)
{
	for (int j = 0; j < lo && j < ncp; j++)
		s[j] = -INFINITY;
	for (int j = hi + 1 > 0 ? hi + 1 : 0; j < ncp; j++)
		s[j] = -INFINITY;
}

/* Backward of (batch b, kv head kh): dk, dv of that head, dq of the query
 * heads of its group.  K and V are transposed once per key tile and serve
 * every query tile of every head of the group. */
AT_INLINE void fa_bwd_body(const struct fa_args *a, long item, int isa)
{
	int T = a->T, H = a->H, D = a->D, Dp = at_dpad(D), TB = at_tile(D);
	int group = H / a->KV, kh = (int)(item % a->KV), b = (int)(item / a->KV);
	long qs = (long)H * D, ks = (long)a->KV * D;
	float scale = 1.0f / sqrtf((float)D);
	const int32_t *sg = a->seg ? a->seg + (long)b * T : NULL;
	const float *kb = a->k + (long)b * T * ks + kh * D, *vb = a->v + (long)b * T * ks + kh * D;
	float *dkb = a->dk + (long)b * T * ks + kh * D, *dvb = a->dv + (long)b * T * ks + kh * D;
	at_tile_buf Kt, Vt, Kp, dKa, dVa, Qp, dOp, tmp;
	at_score_buf P, dS;
	float Di[AT_MAX_TB];

	for (int hh = 0; hh < group; hh++)
		for (int i = 0; i < T; i++)
			memset(a->dq + ((long)b * T + i) * qs + (kh * group + hh) * D, 0, sizeof(float) * (size_t)D);
	for (int c0 = 0; c0 < T; c0 += TB) {
		int kc = T - c0 < TB ? T - c0 : TB, kcp = (kc + 15) & ~15;
		int ilast = fa_last_row(sg, T, c0, c0 + kc - 1);
		at_load_rows(Kp, kb + (long)c0 * ks, ks, kc, D, Dp);
		at_load_cols(Kt, kb + (long)c0 * ks, ks, kc, kcp, D);
		at_load_cols(Vt, vb + (long)c0 * ks, ks, kc, kcp, D);
		memset(dKa, 0, sizeof(float) * (size_t)kc * Dp);
		memset(dVa, 0, sizeof(float) * (size_t)kc * Dp);
		for (int hh = 0; hh < group; hh++) {
			int h = kh * group + hh;
			const float *lse = a->lse + ((long)b * H + h) * T;
			for (int r0 = c0; r0 <= ilast; r0 += TB) {
				int rows = ilast + 1 - r0 < TB ? ilast + 1 - r0 : TB;
				long base = ((long)b * T + r0) * qs + h * D;
				/* every pair visible and no padding column */
				int full = at_all_visible(c0, kc, r0, sg, r0 + rows - 1) && kc == kcp;
				/* contiguous copies: see the forward */
				at_load_rows(Qp, a->q + base, qs, rows, D, Dp);
				at_load_rows(dOp, a->dout + base, qs, rows, D, Dp);

				for (int r = 0; r < rows; r++)
					Di[r] = hp_row_dot(a->dout + base + r * qs, a->o + base + r * qs, D);
				/* P = exp(scale * Q K^T - lse), masked entries exactly 0 */
				at_mm(isa, rows, kcp, D, Qp, Dp, 1, Kt, kcp, P, kcp, 0);
				for (int r = 0; r < rows; r++) {
					int i = r0 + r, lo = (sg && sg[i] > c0 ? sg[i] : c0) - c0;
					int hi = (i < c0 + kc - 1 ? i : c0 + kc - 1) - c0;
					float *p = P + (long)r * kcp;
					if (!full)
						fa_mask_row(p, lo, hi, kcp);
					hp_row_scale(p, kcp, scale);
					hp_row_exp_sum(p, kcp, lse[i]);
				}
				/* dS = P * (dO V^T - Di) */
				at_mm(isa, rows, kcp, D, dOp, Dp, 1, Vt, kcp, dS, kcp, 0);
				for (int r = 0; r < rows; r++) {
					float *ds = dS + (long)r * kcp;
					const float *p = P + (long)r * kcp;
					hp_v8 dv8 = hp_v8_set1(Di[r]);
					for (int j = 0; j < kcp; j += 8)
						hp_v8_store(ds + j, hp_v8_load(p + j) * (hp_v8_load(ds + j) - dv8));
				}
				if (a->rnd) {   /* the tensor cores' operands from here */
					at_round_bf16(P, (long)rows * kcp);
					at_round_bf16(dS, (long)rows * kcp);
				}
				/* dV += P^T dO, through a fresh tile so that long sums
				 * round as sums of tile sums */
				at_mm(isa, kc, Dp, rows, P, 1, kcp, dOp, Dp, tmp, Dp, 0);
				for (int c = 0; c < kc; c++)
					at_axpy_row(dVa + (long)c * Dp, 1.0f, tmp + (long)c * Dp, Dp);
				/* dQ += scale * dS K */
				at_mm(isa, rows, Dp, kc, dS, kcp, 1, Kp, Dp, tmp, Dp, 0);
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
				at_mm(isa, kc, Dp, rows, dS, 1, kcp, Qp, Dp, tmp, Dp, 0);
				for (int c = 0; c < kc; c++)
					at_axpy_row(dKa + (long)c * Dp, 1.0f, tmp + (long)c * Dp, Dp);
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

/* The compiled versions of the work items (same bits, see at_mm8). */
AT_VERSIONS(fa_fwd_items, fa_fwd_body);
AT_VERSIONS(fa_bwd_items, fa_bwd_body);

/* Run n items of the version for this call (hp_attntile_isa: HP_CPU)
 * on hp_attntile_threads(). */
static void fa_run(const at_item_fn *items, const struct fa_args *a, long n, double macs)
{
	struct at_job j = { items[hp_attntile_isa()], a, n, 0 };

	hp_attntile_run(&j, 0, macs);
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

static void fa_fwd(float *out, float *lse, const float *q, const float *k, const float *v, const int32_t *seg,
		   int B, int T, int n_heads, int n_kv_heads, int head_dim, int rnd)
{
	struct fa_args a = { .out = out, .lse_out = lse, .q = q, .k = k, .v = v, .seg = seg,
			     .B = B, .T = T, .H = n_heads, .KV = n_kv_heads, .D = head_dim, .rnd = rnd };

	if (B <= 0 || T <= 0 || n_heads <= 0)
		return;
	if (!fa_valid(n_heads, n_kv_heads, head_dim)) {
		fa_fill_nan(out, (size_t)B * T * n_heads * (head_dim > 0 ? head_dim : 0));
		fa_fill_nan(lse, (size_t)B * n_heads * T);
		return;
	}
	int TB = at_tile(head_dim);
	fa_run(fa_fwd_items, &a, (long)B * n_heads * ((T + TB - 1) / TB), 2 * fa_macs(B, T, n_heads, head_dim));
}

static void fa_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
		   const float *q, const float *k, const float *v, const int32_t *seg, int B, int T, int n_heads,
		   int n_kv_heads, int head_dim, int rnd)
{
	struct fa_args a = { .dq = dq, .dk = dk, .dv = dv, .dout = dout, .o = out, .lse = lse,
			     .q = q, .k = k, .v = v, .seg = seg,
			     .B = B, .T = T, .H = n_heads, .KV = n_kv_heads, .D = head_dim, .rnd = rnd };

	if (B <= 0 || T <= 0 || n_heads <= 0)
		return;
	if (!fa_valid(n_heads, n_kv_heads, head_dim)) {
		size_t nd = head_dim > 0 ? (size_t)head_dim : 0;
		fa_fill_nan(dq, (size_t)B * T * n_heads * nd);
		fa_fill_nan(dk, (size_t)B * T * (n_kv_heads > 0 ? n_kv_heads : 0) * nd);
		fa_fill_nan(dv, (size_t)B * T * (n_kv_heads > 0 ? n_kv_heads : 0) * nd);
		return;
	}
	fa_run(fa_bwd_items, &a, (long)B * n_kv_heads, 5 * fa_macs(B, T, n_heads, head_dim));
}

void hp_flash_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
			    const int32_t *seg, int B, int T, int n_heads, int n_kv_heads, int head_dim)
{
	fa_fwd(out, lse, q, k, v, seg, B, T, n_heads, n_kv_heads, head_dim, 0);
}

void hp_flash_attention_fwd_round(float *out, float *lse, const float *q, const float *k, const float *v,
				  const int32_t *seg, int B, int T, int n_heads, int n_kv_heads, int head_dim)
{
	fa_fwd(out, lse, q, k, v, seg, B, T, n_heads, n_kv_heads, head_dim, 1);
}

void hp_flash_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
			    const float *lse, const float *q, const float *k, const float *v,
			    const int32_t *seg, float *scratch, int B, int T, int n_heads,
			    int n_kv_heads, int head_dim)
{
	(void)scratch;
	fa_bwd(dq, dk, dv, dout, out, lse, q, k, v, seg, B, T, n_heads, n_kv_heads, head_dim, 0);
}

void hp_flash_attention_bwd_round(float *dq, float *dk, float *dv, const float *dout, const float *out,
				  const float *lse, const float *q, const float *k, const float *v,
				  const int32_t *seg, float *scratch, int B, int T, int n_heads,
				  int n_kv_heads, int head_dim)
{
	(void)scratch;
	fa_bwd(dq, dk, dv, dout, out, lse, q, k, v, seg, B, T, n_heads, n_kv_heads, head_dim, 1);
}
