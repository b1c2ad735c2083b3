/*
 * deltanet.c - the gated delta rule of Qwen3-Next's (and Qwen3.5's) Gated
 * DeltaNet layers, forward and backward, and the L2 normalisation their q
 * and k go through first.
 *
 * The rule (transformers' modeling_qwen3_next.py,
 * torch_recurrent_gated_delta_rule; the FLA library's chunk_gated_delta_rule
 * computes the same): per batch row and value head a state S [Dk, Dv],
 * zero at the start of each document, and at each token t
 *     S' = exp(g_t) S,  u_t = beta_t (v_t - S'^T k_t),  S_t = S' + k_t u_t^T,
 *     o_t = S_t^T (scale q_t)
 * with g_t <= 0 the log decay and beta_t in (0, 1) the write strength
 * (Qwen3NextGatedDeltaNet.forward: g = -exp(A_log) softplus(a + dt_bias),
 * beta = sigmoid(b), q and k through l2norm, scale = Dk^-0.5).
 *
 * Two implementations:
 *
 * hp_gdr_ref_*: the recurrence above token by token, the state in double:
 * the specification, checked by finite differences in t/unit/test-deltanet.c.
 * Its backward runs the recurrence backwards in time on dS = dL/dS_t:
 *     dS += q~ dO_t^T            (o_t = S_t^T q~, q~ = scale q_t; dq~ = S_t dO_t)
 *     du = dS^T k_t, dk += dS u_t,  dS' = dS           (S_t = S' + k u^T)
 *     dv = beta du, dbeta = du . (v - S'^T k), dp = -beta du
 *     dS' += k dp^T, dk += S' dp                        (p = S'^T k)
 *     dg = <S', dS'>, dS_{t-1} = exp(g) dS'             (S' = exp(g) S_{t-1})
 * and dS = 0 again at a document's first token.  It needs S_{t-1} at every
 * token: the forward is replayed from states kept every 64 tokens, 64 at a
 * time.
 *
 * hp_gdr_fwd/bwd: the chunked (WY / UT transform) form of
 * torch_chunk_gated_delta_rule, in float.  Within a chunk of L <= 64 tokens
 * starting from state S0, with gamma_i = g_0 + .. + g_i:
 *     (I + A) U = R,  A_ij = beta_i e^(gamma_i - gamma_j) k_i.k_j  (j < i),
 *                     R_i  = beta_i (v_i - e^gamma_i S0^T k_i)
 *     o_i   = e^gamma_i S0^T q~_i + sum_{j<=i} e^(gamma_i - gamma_j) (q~_i.k_j) u_j
 *     S_end = e^gamma_L S0 + sum_j e^(gamma_L - gamma_j) k_j u_j^T
 * (unrolling the recurrence gives exactly these; U is the u_t of the chunk,
 * HF's v_new).  The unit lower-triangular system is solved by forward
 * substitution on R directly (HF solves for v_beta and decayed k_beta
 * separately and combines; the same numbers up to rounding).  The backward
 * differentiates these formulas chunk by chunk, last chunk first, carrying
 * dS from each chunk's start into the end of the one before; the
 * triangular solve's adjoint is the transposed solve, dR = (I + A)^-T dU,
 * with dA_ij = -dR_i . u_j.  The comments in chunk_bwd name each term.
 * Chunks are 64 tokens of a row from position 0 (the last one shorter),
 * further cut at every document start, so no chunk spans two documents.
 * The forward keeps the state at the start of each 64-token block (after a
 * document's reset); the backward recomputes U from it.
 *
 * Threads (pool.h): the forward's work splits over (b, value head), the
 * backward's over (b, key head), whose value heads run in ascending order
 * adding into dq and dk; every (b, head) is computed alone in a fixed
 * order, so the bits do not depend on the thread count.  The matrix
 * products are GCC vector code whose lanes do the scalar operations
 * (vec.h), compiled for x86-64 and x86-64-v3: the same bits at both.
 *
 * Not here: the causal convolution, the gating of the output and the
 * projections around the rule (other kernels), initial states carried in
 * from outside (a document always starts from zero), fused or bf16 paths.
 */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "cpu/ops.h"
#include "cpu/pool.h"
#include "cpu/vec.h"

#define CH HP_GDR_CHUNK

/* Token t of row b starts a document (its state begins at zero). */
static int doc_start(const int32_t *seg, int b, int T, int t)
{
	return t == 0 || (seg && seg[(long)b * T + t] == t);
}

static void fill_nan(float *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = NAN;
}

/* ---- the reference -------------------------------------------------- */

/* One token: S (the state entering it, doubles) becomes S_t; u gets u_t. */
static void ref_step(double *S, double *u, const float *k, const float *v, float g, float beta, int Dk, int Dv)
{
	double a = exp((double)g);

	for (long i = 0; i < (long)Dk * Dv; i++)
		S[i] *= a;
	for (int j = 0; j < Dv; j++) {
		double p = 0;
		for (int d = 0; d < Dk; d++)
			p += S[(long)d * Dv + j] * k[d];
		u[j] = beta * (v[j] - p);
	}
	for (int d = 0; d < Dk; d++)
		for (int j = 0; j < Dv; j++)
			S[(long)d * Dv + j] += k[d] * u[j];
}

int hp_gdr_ref_fwd(float *out, const float *q, const float *k, const float *v, const float *g,
		   const float *beta, const int32_t *seg, int B, int T, int Hv, int Hk, int Dk, int Dv,
		   float scale)
{
	double *S = hp_malloc(sizeof(double) * ((size_t)Dk * Dv + Dv));
	int grp = Hv / Hk;

	if (!S) {
		fill_nan(out, (size_t)B * T * Hv * Dv);
		return -1;
	}
	double *u = S + (size_t)Dk * Dv;
	for (int b = 0; b < B; b++)
		for (int h = 0; h < Hv; h++)
			for (int t = 0; t < T; t++) {
				long n = (long)b * T + t;
				const float *qt = q + (n * Hk + h / grp) * Dk, *kt = k + (n * Hk + h / grp) * Dk;
				float *ot = out + (n * Hv + h) * Dv;

				if (doc_start(seg, b, T, t))
					memset(S, 0, sizeof(double) * Dk * Dv);
				ref_step(S, u, kt, v + (n * Hv + h) * Dv, g[n * Hv + h], beta[n * Hv + h], Dk, Dv);
				for (int j = 0; j < Dv; j++) {
					double o = 0;
					for (int d = 0; d < Dk; d++)
						o += S[(long)d * Dv + j] * ((double)scale * qt[d]);
					ot[j] = (float)o;
				}
			}
	hp_free(S);
	return 0;
}

int hp_gdr_ref_bwd(float *dq, float *dk, float *dv, float *dg, float *dbeta, const float *dout,
		   const float *q, const float *k, const float *v, const float *g, const float *beta,
		   const int32_t *seg, int B, int T, int Hv, int Hk, int Dk, int Dv, float scale)
{
	long DD = (long)Dk * Dv, nblk = (T + CH - 1) / CH;
	int grp = Hv / Hk;
	/* ckpt: the state entering each block's first token; blk: the state
	 * entering each token of the block being differentiated; Sp = S',
	 * St = S_t, dS; vectors u, du, dp, vmp = v - p, and dq, dk in double */
	size_t nd = (size_t)(nblk + CH + 3) * DD + 4 * (size_t)Dv + 2 * (size_t)Dk;
	double *ckpt = hp_malloc(sizeof(double) * nd);

	memset(dq, 0, sizeof(float) * B * T * Hk * Dk);
	memset(dk, 0, sizeof(float) * B * T * Hk * Dk);
	if (!ckpt) {
		fill_nan(dq, (size_t)B * T * Hk * Dk);
		fill_nan(dk, (size_t)B * T * Hk * Dk);
		fill_nan(dv, (size_t)B * T * Hv * Dv);
		fill_nan(dg, (size_t)B * T * Hv);
		fill_nan(dbeta, (size_t)B * T * Hv);
		return -1;
	}
	double *blk = ckpt + nblk * DD, *Sp = blk + CH * DD, *St = Sp + DD, *dS = St + DD;
	double *u = dS + DD, *du = u + Dv, *dp = du + Dv, *vmp = dp + Dv, *dqt = vmp + Dv, *dkt = dqt + Dk;

	for (int b = 0; b < B; b++)
		for (int h = 0; h < Hv; h++) {
			int hk = h / grp;

			/* forward, keeping the state at each block's start */
			memset(St, 0, sizeof(double) * DD);
			for (int t = 0; t < T; t++) {
				long n = (long)b * T + t;

				if (doc_start(seg, b, T, t))
					memset(St, 0, sizeof(double) * DD);
				if (t % CH == 0)
					memcpy(ckpt + (t / CH) * DD, St, sizeof(double) * DD);
				ref_step(St, u, k + (n * Hk + hk) * Dk, v + (n * Hv + h) * Dv, g[n * Hv + h],
					 beta[n * Hv + h], Dk, Dv);
			}
			memset(dS, 0, sizeof(double) * DD);
			for (long c = nblk - 1; c >= 0; c--) {
				int t0 = (int)(c * CH), t1 = t0 + CH < T ? t0 + CH : T;

				memcpy(St, ckpt + c * DD, sizeof(double) * DD);
				for (int t = t0; t < t1; t++) {
					long n = (long)b * T + t;

					if (doc_start(seg, b, T, t))
						memset(St, 0, sizeof(double) * DD);
					memcpy(blk + (t - t0) * DD, St, sizeof(double) * DD);
					ref_step(St, u, k + (n * Hk + hk) * Dk, v + (n * Hv + h) * Dv, g[n * Hv + h],
						 beta[n * Hv + h], Dk, Dv);
				}
				for (int t = t1 - 1; t >= t0; t--) {
					long n = (long)b * T + t;
					const float *qt = q + (n * Hk + hk) * Dk, *kt = k + (n * Hk + hk) * Dk;
					const float *vt = v + (n * Hv + h) * Dv, *dot = dout + (n * Hv + h) * Dv;
					double a = exp((double)g[n * Hv + h]), bt = beta[n * Hv + h], dgt = 0, dbt = 0;

					/* recompute S', p, u and S_t from the state entering t */
					for (long i = 0; i < DD; i++)
						Sp[i] = a * blk[(t - t0) * DD + i];
					for (int j = 0; j < Dv; j++) {
						double p = 0;
						for (int d = 0; d < Dk; d++)
							p += Sp[(long)d * Dv + j] * kt[d];
						vmp[j] = vt[j] - p;
						u[j] = bt * vmp[j];
					}
					for (int d = 0; d < Dk; d++)
						for (int j = 0; j < Dv; j++)
							St[(long)d * Dv + j] = Sp[(long)d * Dv + j] + kt[d] * u[j];
					/* o = S_t^T q~ */
					for (int d = 0; d < Dk; d++) {
						double s = 0, qd = (double)scale * qt[d];
						for (int j = 0; j < Dv; j++) {
							s += St[(long)d * Dv + j] * dot[j];
							dS[(long)d * Dv + j] += qd * dot[j];
						}
						dqt[d] = scale * s;
					}
					/* S_t = S' + k u^T */
					for (int j = 0; j < Dv; j++) {
						double s = 0;
						for (int d = 0; d < Dk; d++)
							s += dS[(long)d * Dv + j] * kt[d];
						du[j] = s;
						dp[j] = -bt * s;
						dbt += s * vmp[j];
						dv[(n * Hv + h) * Dv + j] = (float)(bt * s);
					}
					for (int d = 0; d < Dk; d++) {
						double s = 0, s2 = 0;
						for (int j = 0; j < Dv; j++) {
							s += dS[(long)d * Dv + j] * u[j];
							s2 += Sp[(long)d * Dv + j] * dp[j];
						}
						dkt[d] = s + s2;
					}
					/* p = S'^T k, S' = e^g S_{t-1} */
					for (int d = 0; d < Dk; d++)
						for (int j = 0; j < Dv; j++) {
							long i = (long)d * Dv + j;
							dS[i] += kt[d] * dp[j];
							dgt += Sp[i] * dS[i];
							dS[i] *= a;
						}
					if (doc_start(seg, b, T, t))
						memset(dS, 0, sizeof(double) * DD);
					dg[n * Hv + h] = (float)dgt;
					dbeta[n * Hv + h] = (float)dbt;
					for (int d = 0; d < Dk; d++) {
						dq[(n * Hk + hk) * Dk + d] += (float)dqt[d];
						dk[(n * Hk + hk) * Dk + d] += (float)dkt[d];
					}
				}
			}
		}
	hp_free(ckpt);
	return 0;
}

/* ---- the chunked kernels ------------------------------------------------ */

/* y[0..n) += a x[0..n) */
static inline void axpy(float *y, float a, const float *x, int n)
{
	int i = 0;

	for (; i + 8 <= n; i += 8)
		hp_v8_store(y + i, hp_v8_load(y + i) + a * hp_v8_load(x + i));
	for (; i < n; i++)
		y[i] += a * x[i];
}

enum { MM_FULL, MM_ALOWER, MM_AUPPER, MM_CLOWER };

/*
 * C[i][j] += sum over k ascending of A(i, k) B[k][j], i < M, j < N, k < K,
 * with A(i, k) = A[i*ai + k*ak] (so ai = 1, ak = lda reads A^T).  shape:
 * MM_ALOWER: A(i, k) is 0 for k > i, and those k are skipped;
 * MM_AUPPER: A(i, k) is 0 for k < i, skipped; MM_CLOWER: only j <= i is
 * wanted (a block of rows also writes j > i up to the next multiple of 16,
 * so that no block has a ragged edge; the caller ignores them).  Every element is the same chain of float adds whichever of
 * the loops below computes it, so blocking changes no bit.
 */
HP_TARGET_CLONES static void mm(float *C, int ldc, const float *A, long ai, long ak, const float *B, int ldb, int M,
				int N, int K, int shape)
{
	int i = 0;

	for (; i + 4 <= M; i += 4) {
		int klo = shape == MM_AUPPER ? i : 0;
		int khi = shape == MM_ALOWER && i + 4 < K ? i + 4 : K;
		int nj = shape == MM_CLOWER && (i + 4 + 15) / 16 * 16 < N ? (i + 4 + 15) / 16 * 16 : N, j = 0;
		float *c0 = C + (long)i * ldc;

		for (; j + 16 <= nj; j += 16) {
			/* eight named accumulators and scalar-times-vector
			 * products: GCC keeps them in registers and broadcasts
			 * with one instruction (an array of them, or set1 of a
			 * strided load, went through memory and vinsertps) */
			float *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc;
			hp_v8 x0 = hp_v8_load(c0 + j), y0 = hp_v8_load(c0 + j + 8);
			hp_v8 x1 = hp_v8_load(c1 + j), y1 = hp_v8_load(c1 + j + 8);
			hp_v8 x2 = hp_v8_load(c2 + j), y2 = hp_v8_load(c2 + j + 8);
			hp_v8 x3 = hp_v8_load(c3 + j), y3 = hp_v8_load(c3 + j + 8);
			const float *ar = A + (long)i * ai;

			for (int kk = klo; kk < khi; kk++) {
				const float *bk = B + (long)kk * ldb + j, *ak_ = ar + (long)kk * ak;
				hp_v8 b0 = hp_v8_load(bk), b1 = hp_v8_load(bk + 8);
				float a0 = ak_[0], a1 = ak_[ai], a2 = ak_[2 * ai], a3 = ak_[3 * ai];

				x0 = x0 + a0 * b0, y0 = y0 + a0 * b1;
				x1 = x1 + a1 * b0, y1 = y1 + a1 * b1;
				x2 = x2 + a2 * b0, y2 = y2 + a2 * b1;
				x3 = x3 + a3 * b0, y3 = y3 + a3 * b1;
			}
			hp_v8_store(c0 + j, x0), hp_v8_store(c0 + j + 8, y0);
			hp_v8_store(c1 + j, x1), hp_v8_store(c1 + j + 8, y1);
			hp_v8_store(c2 + j, x2), hp_v8_store(c2 + j + 8, y2);
			hp_v8_store(c3 + j, x3), hp_v8_store(c3 + j + 8, y3);
		}
		if (j < nj)
			for (int r = 0; r < 4; r++)
				for (int kk = klo; kk < khi; kk++)
					axpy(c0 + (long)r * ldc + j, A[(long)(i + r) * ai + (long)kk * ak],
					     B + (long)kk * ldb + j, nj - j);
	}
	for (; i < M; i++) {
		int klo = shape == MM_AUPPER ? i : 0;
		int khi = shape == MM_ALOWER && i + 1 < K ? i + 1 : K;
		int nj = shape == MM_CLOWER && i + 1 < N ? i + 1 : N;

		for (int kk = klo; kk < khi; kk++)
			axpy(C + (long)i * ldc, A[(long)i * ai + (long)kk * ak], B + (long)kk * ldb, nj);
	}
}

/* dst [C, R] = src [R, C]^T (leading dimensions C and R) */
static void transpose(float *dst, const float *src, int R, int C)
{
	/* in 8 x 8 tiles: a row-at-a-time copy writes one float per cache
	 * line of dst, and was a fifth of the backward's own time */
	for (int r0 = 0; r0 < R; r0 += 8)
		for (int c0 = 0; c0 < C; c0 += 8)
			for (int r = r0; r < r0 + 8 && r < R; r++)
				for (int c = c0; c < c0 + 8 && c < C; c++)
					dst[(long)c * R + r] = src[(long)r * C + c];
}

/*
 * The chunk's unit triangular systems, nA = -A (strictly lower, [CH, CH]),
 * X [L, n] the right-hand side on entry and the solution on return.
 * (I + A) X = R forward: x_i = r_i + sum_{j<i} nA_ij x_j, j ascending;
 * (I + A)^T X = R backward: x_i = r_i + sum_{j>i} nA_ji x_j, first the j past
 * i's block of four, ascending, then those in it, ascending.
 * Four rows at a time: the rows solved before a block come in through mm,
 * the block's own triangle one row after another.
 */
static void solve_lower(float *X, const float *nA, int L, int n)
{
	for (int i0 = 0; i0 < L; i0 += 4) {
		int m = L - i0 < 4 ? L - i0 : 4;

		mm(X + (long)i0 * n, n, nA + i0 * CH, CH, 1, X, n, m, n, i0, MM_FULL);
		for (int i = i0 + 1; i < i0 + m; i++)
			for (int j = i0; j < i; j++)
				axpy(X + (long)i * n, nA[i * CH + j], X + (long)j * n, n);
	}
}

static void solve_upper(float *X, const float *nA, int L, int n)
{
	for (int i0 = (L - 1) / 4 * 4; i0 >= 0; i0 -= 4) {
		int m = L - i0 < 4 ? L - i0 : 4;

		mm(X + (long)i0 * n, n, nA + (i0 + m) * CH + i0, 1, CH, X + (long)(i0 + m) * n, n, m, n, L - i0 - m,
		   MM_FULL);
		for (int i = i0 + m - 2; i >= i0; i--)
			for (int j = i + 1; j < i0 + m; j++)
				axpy(X + (long)i * n, nA[j * CH + i], X + (long)j * n, n);
	}
}

/* One (b, head)'s working set, carved from the caller's scratch. */
struct gdr_ws {
	float *Q, *K, *KT, *Kh, *Kx, *dq, *dk, *Y, *Z;  /* [CH, Dk] (KT [Dk, CH]) */
	float *V, *Vt, *U, *UT, *dO, *dU, *dR;          /* [CH, Dv] (UT [Dv, CH]) */
	float *A, *KK, *G, *P, *W, *E;                  /* [CH, CH] */
	float *S, *dS, *S0T, *dST;                      /* [Dk, Dv] (the T's [Dv, Dk]) */
	float *g, *beta, *eg, *el;                      /* [CH] */
	double *gam, *dgam, *dbeta;                     /* [CH] */
};

static size_t ws_floats(int Dk, int Dv)
{
	return (size_t)9 * CH * Dk + (size_t)7 * CH * Dv + (size_t)6 * CH * CH + (size_t)4 * Dk * Dv + 4 * CH +
	       3 * 2 * CH;
}

static void ws_carve(struct gdr_ws *w, float *p, int Dk, int Dv)
{
	float **fk[] = { &w->Q, &w->K, &w->KT, &w->Kh, &w->Kx, &w->dq, &w->dk, &w->Y, &w->Z };
	float **fv[] = { &w->V, &w->Vt, &w->U, &w->UT, &w->dO, &w->dU, &w->dR };
	float **fc[] = { &w->A, &w->KK, &w->G, &w->P, &w->W, &w->E };
	float **fs[] = { &w->S, &w->dS, &w->S0T, &w->dST };
	float **f1[] = { &w->g, &w->beta, &w->eg, &w->el };

	for (int i = 0; i < 9; i++, p += (size_t)CH * Dk)
		*fk[i] = p;
	for (int i = 0; i < 7; i++, p += (size_t)CH * Dv)
		*fv[i] = p;
	for (int i = 0; i < 6; i++, p += (size_t)CH * CH)
		*fc[i] = p;
	for (int i = 0; i < 4; i++, p += (size_t)Dk * Dv)
		*fs[i] = p;
	for (int i = 0; i < 4; i++, p += CH)
		*f1[i] = p;
	/* doubles: p is 8-byte aligned when the scratch is (hp_malloc's is) */
	w->gam = (double *)p;
	w->dgam = w->gam + CH;
	w->dbeta = w->dgam + CH;
}

size_t hp_gdr_saved_floats(int B, int T, int Hv, int Dk, int Dv)
{
	return (size_t)B * Hv * ((T + CH - 1) / CH) * Dk * Dv;
}

static int gdr_slots(int B, int Hv)
{
	int n = hp_pool_threads();
	return n < B * Hv ? n : B * Hv;
}

size_t hp_gdr_unit_floats(int Dk, int Dv)
{
	return ws_floats(Dk, Dv) + 16;
}

size_t hp_gdr_scratch_floats(int B, int Hv, int Dk, int Dv)
{
	return (size_t)gdr_slots(B, Hv) * hp_gdr_unit_floats(Dk, Dv);
}

struct gdr_args {
	float *out, *saved, *scratch, *dq, *dk, *dv, *dg, *dbeta;
	const float *q, *k, *v, *g, *beta, *dout, *saved_in;
	const int32_t *seg;
	int B, T, Hv, Hk, Dk, Dv, slots;
	float scale;
};

/* Copy chunk [s, s + L) of (b, value head h) in, and compute what forward
 * and backward share: gamma, the decays, K^T, KK = K K^T and A (lower
 * parts), and U and Vt = v - e^gamma S0^T k (S0 = w->S). */
static void chunk_prep(struct gdr_ws *w, const struct gdr_args *a, int b, int h, int s, int L)
{
	int Dk = a->Dk, Dv = a->Dv, hk = h / (a->Hv / a->Hk);
	double gm = 0;

	for (int i = 0; i < L; i++) {
		long n = (long)b * a->T + s + i;
		const float *qi = a->q + (n * a->Hk + hk) * Dk;

		for (int d = 0; d < Dk; d++)
			w->Q[(long)i * Dk + d] = a->scale * qi[d];
		memcpy(w->K + (long)i * Dk, a->k + (n * a->Hk + hk) * Dk, sizeof(float) * Dk);
		memcpy(w->V + (long)i * Dv, a->v + (n * a->Hv + h) * Dv, sizeof(float) * Dv);
		w->g[i] = a->g[n * a->Hv + h];
		w->beta[i] = a->beta[n * a->Hv + h];
		gm += w->g[i];
		w->gam[i] = gm;
		w->eg[i] = (float)exp(gm);
	}
	for (int i = 0; i < L; i++) {
		w->el[i] = (float)exp(w->gam[L - 1] - w->gam[i]);
		for (int j = 0; j <= i; j++)
			w->E[i * CH + j] = (float)exp(w->gam[i] - w->gam[j]);
	}
	transpose(w->KT, w->K, L, Dk);
	memset(w->KK, 0, sizeof(float) * CH * CH);
	mm(w->KK, CH, w->K, Dk, 1, w->KT, L, L, L, Dk, MM_CLOWER);
	/* A is kept negated: the solves below add -A_ij u_j */
	for (int i = 0; i < L; i++)
		for (int j = 0; j < CH; j++)
			w->A[i * CH + j] = j < i ? -(w->beta[i] * w->E[i * CH + j] * w->KK[i * CH + j]) : 0;
	/* Vt = V - e^gamma (K S0); U = beta Vt, then (I + A) U = R by rows */
	memset(w->Vt, 0, sizeof(float) * L * Dv);
	mm(w->Vt, Dv, w->K, Dk, 1, w->S, Dv, L, Dv, Dk, MM_FULL);
	for (int i = 0; i < L; i++)
		for (int j = 0; j < Dv; j++) {
			long x = (long)i * Dv + j;
			w->Vt[x] = w->V[x] - w->eg[i] * w->Vt[x];
			w->U[x] = w->beta[i] * w->Vt[x];
		}
	solve_lower(w->U, w->A, L, Dv);
}

/* P_ij = e^(gamma_i - gamma_j) q~_i.k_j for j <= i, else 0 (G keeps q~_i.k_j) */
static void chunk_scores(struct gdr_ws *w, int L, int Dk)
{
	memset(w->G, 0, sizeof(float) * CH * CH);
	mm(w->G, CH, w->Q, Dk, 1, w->KT, L, L, L, Dk, MM_CLOWER);
	for (int i = 0; i < L; i++)
		for (int j = 0; j < CH; j++)
			w->P[i * CH + j] = j <= i ? w->E[i * CH + j] * w->G[i * CH + j] : 0;
}

/* The forward of one chunk: its outputs, and w->S from S0 to S_end. */
static void chunk_fwd(struct gdr_ws *w, const struct gdr_args *a, int b, int h, int s, int L)
{
	int Dk = a->Dk, Dv = a->Dv;
	float *O = w->dO;

	chunk_prep(w, a, b, h, s, L);
	chunk_scores(w, L, Dk);
	/* O = diag(e^gamma) Q~ S0 + P U */
	memset(O, 0, sizeof(float) * L * Dv);
	mm(O, Dv, w->Q, Dk, 1, w->S, Dv, L, Dv, Dk, MM_FULL);
	for (int i = 0; i < L; i++)
		for (int j = 0; j < Dv; j++)
			O[(long)i * Dv + j] *= w->eg[i];
	mm(O, Dv, w->P, CH, 1, w->U, Dv, L, Dv, L, MM_ALOWER);
	for (int i = 0; i < L; i++)
		memcpy(a->out + (((long)b * a->T + s + i) * a->Hv + h) * Dv, O + (long)i * Dv, sizeof(float) * Dv);
	/* S_end = e^gamma_L S0 + Kh^T U, Kh_j = e^(gamma_L - gamma_j) k_j */
	for (long x = 0; x < (long)Dk * Dv; x++)
		w->S[x] *= w->eg[L - 1];
	for (int j = 0; j < L; j++)
		for (int d = 0; d < Dk; d++)
			w->Kh[(long)j * Dk + d] = w->el[j] * w->K[(long)j * Dk + d];
	mm(w->S, Dv, w->Kh, 1, Dk, w->U, Dv, Dk, Dv, L, MM_FULL);
}

typedef double gdr_v4d __attribute__((vector_size(32)));

/* x.y in double, four lanes (element i in lane i % 4) added at the end */
static double dotd(const float *x, const float *y, long n)
{
	gdr_v4d acc = { 0, 0, 0, 0 };
	double s = 0;
	long i = 0;

	for (; i + 4 <= n; i += 4)
		acc += (gdr_v4d){ x[i], x[i + 1], x[i + 2], x[i + 3] } * (gdr_v4d){ y[i], y[i + 1], y[i + 2], y[i + 3] };
	for (; i < n; i++)
		s += (double)x[i] * y[i];
	return (acc[0] + acc[2]) + (acc[1] + acc[3]) + s;
}

/*
 * The backward of one chunk: w->S holds S0, w->dS dL/dS_end on entry and
 * dL/dS0 on return.  dq, dk are added into the outputs, dv, dg, dbeta
 * written.
 */
static void chunk_bwd(struct gdr_ws *w, const struct gdr_args *a, int b, int h, int s, int L)
{
	int Dk = a->Dk, Dv = a->Dv, hk = h / (a->Hv / a->Hk);
	long DD = (long)Dk * Dv;
	double *dgam = w->dgam, *dbeta = w->dbeta;

	chunk_prep(w, a, b, h, s, L);
	chunk_scores(w, L, Dk);
	for (int i = 0; i < L; i++) {
		long n = (long)b * a->T + s + i;
		memcpy(w->dO + (long)i * Dv, a->dout + (n * a->Hv + h) * Dv, sizeof(float) * Dv);
		dgam[i] = dbeta[i] = 0;
	}
	for (int j = 0; j < L; j++)
		for (int d = 0; d < Dk; d++)
			w->Kh[(long)j * Dk + d] = w->el[j] * w->K[(long)j * Dk + d];

	/* dU = P^T dO (from o) + Kh dS (from S_end) */
	memset(w->dU, 0, sizeof(float) * L * Dv);
	mm(w->dU, Dv, w->P, 1, CH, w->dO, Dv, L, Dv, L, MM_AUPPER);
	mm(w->dU, Dv, w->Kh, Dk, 1, w->dS, Dv, L, Dv, Dk, MM_FULL);
	/* the transposed solve: dR = (I + A)^-T dU, last row first */
	memcpy(w->dR, w->dU, sizeof(float) * L * Dv);
	solve_upper(w->dR, w->A, L, Dv);

	/* S_end: dk_j += e^(gamma_L - gamma_j) dS u_j, the decays' share of
	 * gamma, and dS0 = e^gamma_L dS (below, once dS is no longer needed) */
	transpose(w->dST, w->dS, Dk, Dv);
	memset(w->Z, 0, sizeof(float) * L * Dk);
	mm(w->Z, Dk, w->U, Dv, 1, w->dST, Dk, L, Dk, Dv, MM_FULL);
	dgam[L - 1] += w->eg[L - 1] * dotd(w->S, w->dS, DD);
	memset(w->dk, 0, sizeof(float) * L * Dk);
	for (int j = 0; j < L; j++) {
		double x = w->el[j] * dotd(w->K + (long)j * Dk, w->Z + (long)j * Dk, Dk);
		dgam[L - 1] += x;
		dgam[j] -= x;
		axpy(w->dk + (long)j * Dk, w->el[j], w->Z + (long)j * Dk, Dk);
	}

	/* o: dq~_i = e^gamma_i S0 dO_i + sum_{j<=i} Pd_ij k_j with
	 * Pd_ij = e^(gamma_i - gamma_j) dO_i.u_j; dk_j += sum_{i>=j} Pd_ij q~_i;
	 * gamma gets Pd_ij q~_i.k_j at i, minus it at j, and
	 * e^gamma_i q~_i.(S0 dO_i) at i */
	transpose(w->UT, w->U, L, Dv);
	transpose(w->S0T, w->S, Dk, Dv);
	memset(w->W, 0, sizeof(float) * CH * CH);
	mm(w->W, CH, w->dO, Dv, 1, w->UT, L, L, L, Dv, MM_CLOWER);
	for (int i = 0; i < L; i++)
		for (int j = 0; j < CH; j++) {
			float pd = j <= i ? w->E[i * CH + j] * w->W[i * CH + j] : 0;
			w->W[i * CH + j] = pd;
			if (j < i) {
				double x = (double)pd * w->G[i * CH + j];
				dgam[i] += x;
				dgam[j] -= x;
			}
		}
	memset(w->Y, 0, sizeof(float) * L * Dk);
	mm(w->Y, Dk, w->dO, Dv, 1, w->S0T, Dk, L, Dk, Dv, MM_FULL);
	for (int i = 0; i < L; i++) {
		float *dqi = w->dq + (long)i * Dk, *yi = w->Y + (long)i * Dk;
		dgam[i] += w->eg[i] * dotd(w->Q + (long)i * Dk, yi, Dk);
		for (int d = 0; d < Dk; d++)
			dqi[d] = w->eg[i] * yi[d];
	}
	mm(w->dq, Dk, w->W, CH, 1, w->K, Dk, L, Dk, L, MM_ALOWER);
	mm(w->dk, Dk, w->W, 1, CH, w->Q, Dk, L, Dk, L, MM_AUPPER);

	/* R_i = beta_i Vt_i: dv_i = beta_i dR_i, dbeta_i += dR_i.Vt_i; and
	 * through Vt_i = v_i - e^gamma_i S0^T k_i: with y_i = S0 dR_i,
	 * dk_i -= beta_i e^gamma_i y_i, gamma_i gets -beta_i e^gamma_i k_i.y_i,
	 * dS0 -= sum_i beta_i e^gamma_i k_i dR_i^T */
	memset(w->Y, 0, sizeof(float) * L * Dk);
	mm(w->Y, Dk, w->dR, Dv, 1, w->S0T, Dk, L, Dk, Dv, MM_FULL);
	for (int i = 0; i < L; i++) {
		long n = (long)b * a->T + s + i;
		float c = w->beta[i] * w->eg[i];
		float *dvi = a->dv + (n * a->Hv + h) * Dv;
		const float *dri = w->dR + (long)i * Dv;

		for (int j = 0; j < Dv; j++)
			dvi[j] = w->beta[i] * dri[j];
		dbeta[i] += dotd(dri, w->Vt + (long)i * Dv, Dv);
		dgam[i] -= c * dotd(w->K + (long)i * Dk, w->Y + (long)i * Dk, Dk);
		axpy(w->dk + (long)i * Dk, -c, w->Y + (long)i * Dk, Dk);
		for (int d = 0; d < Dk; d++) {
			w->Kx[(long)i * Dk + d] = -c * w->K[(long)i * Dk + d];
			w->Kh[(long)i * Dk + d] = w->eg[i] * w->Q[(long)i * Dk + d];
		}
	}

	/* A_ij = beta_i e^(gamma_i - gamma_j) KK_ij: with dA_ij = -dR_i.u_j
	 * and F_ij = dA_ij e^(gamma_i - gamma_j), dbeta_i += F_ij KK_ij;
	 * H_ij = beta_i F_ij gives dk_i += H_ij k_j, dk_j += H_ij k_i, and
	 * H_ij KK_ij to gamma at i, minus it at j */
	memset(w->W, 0, sizeof(float) * CH * CH);
	mm(w->W, CH, w->dR, Dv, 1, w->UT, L, L, L, Dv, MM_CLOWER);
	for (int i = 0; i < L; i++)
		for (int j = 0; j < CH; j++) {
			float f = j < i ? -w->E[i * CH + j] * w->W[i * CH + j] : 0;
			float hh = w->beta[i] * f;
			w->W[i * CH + j] = hh;
			if (j < i) {
				double x = (double)hh * w->KK[i * CH + j];
				dbeta[i] += (double)f * w->KK[i * CH + j];
				dgam[i] += x;
				dgam[j] -= x;
			}
		}
	mm(w->dk, Dk, w->W, CH, 1, w->K, Dk, L, Dk, L, MM_ALOWER);
	mm(w->dk, Dk, w->W, 1, CH, w->K, Dk, L, Dk, L, MM_AUPPER);

	/* dS0 = e^gamma_L dS + sum_i e^gamma_i q~_i dO_i^T
	 *       - sum_i beta_i e^gamma_i k_i dR_i^T */
	for (long x = 0; x < DD; x++)
		w->dS[x] *= w->eg[L - 1];
	mm(w->dS, Dv, w->Kh, 1, Dk, w->dO, Dv, Dk, Dv, L, MM_FULL);
	mm(w->dS, Dv, w->Kx, 1, Dk, w->dR, Dv, Dk, Dv, L, MM_FULL);

	/* out: dg_m = sum_{i>=m} dgamma_i; dq = scale dq~ added */
	double acc = 0;
	for (int i = L - 1; i >= 0; i--) {
		long n = (long)b * a->T + s + i;
		float *dqo = a->dq + (n * a->Hk + hk) * Dk, *dko = a->dk + (n * a->Hk + hk) * Dk;

		acc += dgam[i];
		a->dg[n * a->Hv + h] = (float)acc;
		a->dbeta[n * a->Hv + h] = (float)dbeta[i];
		axpy(dqo, a->scale, w->dq + (long)i * Dk, Dk);
		axpy(dko, 1.0f, w->dk + (long)i * Dk, Dk);
	}
}

/* the first document start after s and before e, else e */
static int next_start(const int32_t *seg, int b, int T, int s, int e)
{
	if (seg)
		for (int t = s + 1; t < e; t++)
			if (seg[(long)b * T + t] == t)
				return t;
	return e;
}

static void fwd_unit(const struct gdr_args *a, struct gdr_ws *w, int b, int h)
{
	int T = a->T, nblk = (T + CH - 1) / CH;
	size_t DD = (size_t)a->Dk * a->Dv;

	memset(w->S, 0, sizeof(float) * DD);
	for (int c = 0; c < nblk; c++) {
		int t0 = c * CH, t1 = t0 + CH < T ? t0 + CH : T;

		for (int s = t0, e; s < t1; s = e) {
			e = next_start(a->seg, b, T, s, t1);
			if (doc_start(a->seg, b, T, s))
				memset(w->S, 0, sizeof(float) * DD);
			if (s == t0 && a->saved)
				memcpy(a->saved + (((size_t)b * a->Hv + h) * nblk + c) * DD, w->S, sizeof(float) * DD);
			chunk_fwd(w, a, b, h, s, e - s);
		}
	}
}

static void bwd_unit(const struct gdr_args *a, struct gdr_ws *w, int b, int h)
{
	int T = a->T, nblk = (T + CH - 1) / CH;
	size_t DD = (size_t)a->Dk * a->Dv;
	int starts[CH + 1];

	memset(w->dS, 0, sizeof(float) * DD);
	for (int c = nblk - 1; c >= 0; c--) {
		int t0 = c * CH, t1 = t0 + CH < T ? t0 + CH : T, ns = 0;

		for (int s = t0; s < t1; s = next_start(a->seg, b, T, s, t1))
			starts[ns++] = s;
		starts[ns] = t1;
		for (int m = ns - 1; m >= 0; m--) {
			int s = starts[m];

			if (m == 0)
				memcpy(w->S, a->saved_in + (((size_t)b * a->Hv + h) * nblk + c) * DD,
				       sizeof(float) * DD);
			else
				memset(w->S, 0, sizeof(float) * DD);
			chunk_bwd(w, a, b, h, s, starts[m + 1] - s);
			if (doc_start(a->seg, b, T, s))
				memset(w->dS, 0, sizeof(float) * DD);
		}
	}
}

static struct gdr_ws slot_ws(const struct gdr_args *a, long p)
{
	struct gdr_ws w;
	ws_carve(&w, a->scratch + p * hp_gdr_unit_floats(a->Dk, a->Dv), a->Dk, a->Dv);
	return w;
}

/* slot p runs the units p, p + slots, ... on its own part of the scratch */
static void fwd_slots(void *ctx, long p0, long p1)
{
	const struct gdr_args *a = ctx;

	for (long p = p0; p < p1; p++) {
		struct gdr_ws w = slot_ws(a, p);
		for (long u = p; u < (long)a->B * a->Hv; u += a->slots)
			fwd_unit(a, &w, (int)(u / a->Hv), (int)(u % a->Hv));
	}
}

static void bwd_slots(void *ctx, long p0, long p1)
{
	const struct gdr_args *a = ctx;
	int grp = a->Hv / a->Hk;

	for (long p = p0; p < p1; p++) {
		struct gdr_ws w = slot_ws(a, p);
		for (long u = p; u < (long)a->B * a->Hk; u += a->slots) {
			int b = (int)(u / a->Hk), hk = (int)(u % a->Hk);

			for (int t = 0; t < a->T; t++) {
				long x = (((long)b * a->T + t) * a->Hk + hk) * a->Dk;
				memset(a->dq + x, 0, sizeof(float) * a->Dk);
				memset(a->dk + x, 0, sizeof(float) * a->Dk);
			}
			for (int h = hk * grp; h < (hk + 1) * grp; h++)
				bwd_unit(a, &w, b, h);
		}
	}
}

void hp_gdr_fwd(float *out, float *saved, const float *q, const float *k, const float *v, const float *g,
		const float *beta, const int32_t *seg, float *scratch, int B, int T, int Hv, int Hk, int Dk, int Dv,
		float scale)
{
	struct gdr_args a = { .out = out, .saved = saved, .scratch = scratch, .q = q, .k = k, .v = v, .g = g,
			      .beta = beta, .seg = seg, .B = B, .T = T, .Hv = Hv, .Hk = Hk, .Dk = Dk, .Dv = Dv,
			      .slots = gdr_slots(B, Hv), .scale = scale };

	if (Hk <= 0 || Hv % Hk || T <= 0) {
		fill_nan(out, (size_t)B * (T > 0 ? T : 0) * Hv * Dv);
		return;
	}
	hp_parallel_for(a.slots, 1, 1, fwd_slots, &a);
}

void hp_gdr_bwd(float *dq, float *dk, float *dv, float *dg, float *dbeta, const float *dout, const float *saved,
		const float *q, const float *k, const float *v, const float *g, const float *beta, const int32_t *seg,
		float *scratch, int B, int T, int Hv, int Hk, int Dk, int Dv, float scale)
{
	struct gdr_args a = { .dq = dq, .dk = dk, .dv = dv, .dg = dg, .dbeta = dbeta, .dout = dout,
			      .saved_in = saved, .scratch = scratch, .q = q, .k = k, .v = v, .g = g, .beta = beta,
			      .seg = seg, .B = B, .T = T, .Hv = Hv, .Hk = Hk, .Dk = Dk, .Dv = Dv,
			      .slots = gdr_slots(B, Hk), .scale = scale };

	if (Hk <= 0 || Hv % Hk || T <= 0) {
		size_t nt = (size_t)B * (T > 0 ? T : 0);
		fill_nan(dq, nt * (Hk > 0 ? Hk : 0) * Dk);
		fill_nan(dk, nt * (Hk > 0 ? Hk : 0) * Dk);
		fill_nan(dv, nt * Hv * Dv);
		fill_nan(dg, nt * Hv);
		fill_nan(dbeta, nt * Hv);
		return;
	}
	hp_parallel_for(a.slots, 1, 1, bwd_slots, &a);
}

/* The flops of a chunk of L tokens as the kernels above compute it (a
 * multiply and an add each count; lower-triangular L x L products count
 * their L(L+1)/2 or L(L-1)/2 terms; exps, copies and transposes nothing):
 * forward: K S0, Q S0 and the state update (3 x 2 L Dk Dv), K K^T and Q K^T
 * (2 x L(L+1) Dk), the solve (L(L-1) Dv), P U (L(L+1) Dv); backward: the
 * forward's K S0, K K^T, solve and Q K^T again, then 7 products of 2 L Dk Dv
 * (dU, Z, S0 dO, S0 dR and dS0's two, Kh dS), and the L x L ones: P^T dO,
 * dO U^T, dR U^T (L(L+1) Dv each), the transposed solve (L(L-1) Dv), Pd K,
 * Pd^T Q (L(L+1) Dk each), H K, H^T K (L(L-1) Dk each).  gdn.cu's chunks
 * are the same products. */
void hp_gdr_flops(int B, int T, int Hv, int Dk, int Dv, double *fwd, double *bwd)
{
	double L = CH, n = (double)B * Hv * ((T + CH - 1) / CH);

	*fwd = n * (6 * L * Dk * Dv + 2 * L * (L + 1) * Dk + L * (L - 1) * Dv + L * (L + 1) * Dv);
	*bwd = n * (2 * L * Dk * Dv + 2 * L * (L + 1) * Dk + L * (L - 1) * Dv + 14 * L * Dk * Dv +
		    3 * L * (L + 1) * Dv + L * (L - 1) * Dv + 2 * L * (L + 1) * Dk + 2 * L * (L - 1) * Dk);
}

/* ---- l2norm ---- */

struct l2_args {
	float *y, *rinv, *dx;
	const float *x, *dy, *yin, *rin;
	int D;
};

static void l2_fwd_rows(void *ctx, long n0, long n1)
{
	const struct l2_args *a = ctx;

	for (long n = n0; n < n1; n++) {
		const float *x = a->x + n * a->D;
		float r = (float)(1.0 / sqrt(dotd(x, x, a->D) + 1e-6));

		a->rinv[n] = r;
		for (int i = 0; i < a->D; i++)
			a->y[n * a->D + i] = x[i] * r;
	}
}

static void l2_bwd_rows(void *ctx, long n0, long n1)
{
	const struct l2_args *a = ctx;

	for (long n = n0; n < n1; n++) {
		const float *y = a->yin + n * a->D, *dy = a->dy + n * a->D;
		float yd = (float)dotd(y, dy, a->D), r = a->rin[n];

		for (int i = 0; i < a->D; i++)
			a->dx[n * a->D + i] = r * (dy[i] - y[i] * yd);
	}
}

void hp_l2norm_fwd(float *y, float *rinv, const float *x, long N, int D)
{
	struct l2_args a = { .y = y, .rinv = rinv, .x = x, .D = D };
	hp_parallel_for(N, HP_POOL_GRAIN / (D > 0 ? D : 1) + 1, 1, l2_fwd_rows, &a);
}

void hp_l2norm_bwd(float *dx, const float *dy, const float *y, const float *rinv, long N, int D)
{
	struct l2_args a = { .dx = dx, .dy = dy, .yin = y, .rin = rinv, .D = D };
	hp_parallel_for(N, HP_POOL_GRAIN / (D > 0 ? D : 1) + 1, 1, l2_bwd_rows, &a);
}
