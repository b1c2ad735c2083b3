/*
 * test-cuda.c - the CUDA backend's element-wise, RMSNorm, RoPE, SwiGLU,
 * embedding and MoE routing ops (kernels/cuda/elementwise.cu, moe.cu)
 * against the CPU: the reference kernels of kernels/cpu/ops.h where there
 * is one, and for the router and the MoE row movements (which have no
 * standalone CPU function) plain C copies of lib/model.c's moe_forward /
 * moe_backward loops, statement for statement (ref_router, ref_router_bwd,
 * ref_route and the combine / scatter loops below).
 *
 * Inputs are rounded to bf16 on the host first (ct_round) wherever the GPU
 * reads bf16, so both sides see the same numbers.  Sizes: single rows and
 * single columns, widths that are no multiple of 32 or 256 (1000, 1001,
 * 4100), realistic shapes (N=4096 x C=2048, 32 heads of 128, E=128 k=8) and
 * small routers (E=8 k=2, k=E) with tied logits.  Every output the GPU
 * overwrites starts as NaN, so an element left unwritten fails.  Every
 * backward that reduces runs twice from the same state and must give the
 * same bits.
 *
 * Tolerances (normalised L2 error, ct_nerr; measured values are printed):
 *  - TOL_BF16 3e-3 for bf16 outputs against the unrounded fp32 reference:
 *    one rounding to bf16 is at most 2^-9 = 1.95e-3 relative per element
 *    (typically 1.6e-3 normalised), so 3e-3 leaves room for fp32 values
 *    that differ from the CPU's in the last bits, not for a wrong element.
 *  - TOL_F32 1e-5 for fp32 outputs of fp32 arithmetic on identical inputs
 *    whose sums run in another order (fp32 partial sums over up to 4096
 *    rows: a few 1e-7; double dot products: ~1e-8).
 *  - TOL_PROB 2e-6 for the router's probabilities: the GPU's expf is within
 *    2 ulp (2.4e-7 relative) of glibc's, the sum is in double on both.
 *  - conversions, add, scale, embedding forward and gather are exact.
 */
#include <math.h>

#include "cpu/ops.h"
#include "hfconfig.h"
#include "tap.h"

#ifdef HP_HAVE_CUDA
#include "cudatest.h"

#define TOL_BF16 3e-3
#define TOL_F32 1e-5
#define TOL_PROB 2e-6

static struct hp_err err;

static void *dalloc(size_t bytes)
{
	void *p = hp_cuda_alloc(bytes, &err);

	if (!p) {
		tap_diag("%s", err.msg);
		exit(1);
	}
	return p;
}

/* n floats in [-a, a), rounded to bf16 when rnd */
static float *hfill(size_t n, unsigned seed, float a, int rnd)
{
	return ct_hfill(n, seed, a, rnd);
}

static float *hnan(size_t n)
{
	float *x = malloc(n * sizeof(float) + 4);

	for (size_t i = 0; i < n; i++)
		x[i] = NAN;
	return x;
}

static float *hcopy(const float *x, size_t n)
{
	float *y = malloc(n * sizeof(float) + 4);

	memcpy(y, x, n * sizeof(float));
	return y;
}

/* a device buffer of n NaNs, fp32 (bf 0) or bf16 (bf 1): an element an op
 * fails to write shows */
static void *dnan(size_t n, int bf)
{
	float *h = hnan(n);
	void *d = ct_dev(h, n, bf);

	hp_cuda_sync(&err);   /* the upload has read h */
	free(h);
	return d;
}

/* synchronise and report a pending CUDA error; 1 when there is none */
static int gpu_ok(void)
{
	if (hp_cuda_sync(&err)) {
		tap_diag("cuda: %s", err.msg);
		return 0;
	}
	return 1;
}

/* 1 when device buffers a and b hold the same bytes */
static int dev_same(const void *a, const void *b, size_t bytes)
{
	unsigned char *x = malloc(bytes + 1), *y = malloc(bytes + 1);
	int same;

	hp_cuda_download(x, a, bytes, &err);
	hp_cuda_download(y, b, bytes, &err);
	same = !memcmp(x, y, bytes);
	free(x);
	free(y);
	return same;
}

static int32_t *hids(size_t n, unsigned seed, int V)
{
	int32_t *id = malloc(n * sizeof(int32_t) + 4);
	float *r = hfill(n, seed, 1.0f, 0);

	for (size_t i = 0; i < n; i++) {
		id[i] = (int32_t)((r[i] + 1.0f) * 0.5f * V);
		if (id[i] >= V)
			id[i] = V - 1;
		if (id[i] < 0)
			id[i] = 0;
	}
	free(r);
	return id;
}

/* elements of got (bf16 values) that are not want rounded to bf16: where
 * the GPU does the CPU's fp32 arithmetic unfused this is 0; printed, not
 * required */
static size_t bf_diff(const float *got, const float *want, size_t n)
{
	size_t d = 0;

	for (size_t i = 0; i < n; i++)
		d += hp_f32_to_bf16(got[i]) != hp_f32_to_bf16(want[i]);
	return d;
}

static int same_f32(float a, float b)
{
	return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof(float));
}

/* ---- conversions, add, scale, sum of squares ---- */

static void test_convert(size_t n)
{
	float *x = hfill(n, 1, 100.0f, 0), *h = hfill(n, 2, 10.0f, 0);
	static const uint32_t special[] = {
		0x7fc00000u, 0x7f800000u, 0xff800000u, 0x80000000u,   /* NaN, inf, -inf, -0 */
		0x00000001u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu,   /* denormal, ties to even down / up, max */
		0xff7f8000u, 0x7fa00001u,                             /* rounds to -inf, signalling NaN */
	};
	size_t bad = 0, ns = sizeof(special) / sizeof(special[0]);

	for (size_t i = 0; i < ns && i < n; i++)
		memcpy(&x[i], &special[i], 4);
	float *dx = ct_dev(x, n, 0), *dh = ct_dev(h, n, 0);
	hp_bf16 *dy = dalloc(n * 2), *hy = malloc(n * 2 + 2);
	float *hz = malloc(n * 4 + 4), *hh = malloc(n * 4 + 4);

	hp_cuda_f32_to_bf16(dy, dx, n);
	int g = gpu_ok();
	hp_cuda_download(hy, dy, n * 2, &err);
	for (size_t i = 0; i < n; i++)
		bad += hy[i] != hp_f32_to_bf16(x[i]);
	ok(g && bad == 0, "f32_to_bf16 n=%zu: %zu of %zu differ from round-to-nearest-even", n, bad, n);

	hp_cuda_add_bf16(dh, dy, n);
	g = gpu_ok();
	hp_cuda_download(hh, dh, n * 4, &err);
	bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += !same_f32(hh[i], h[i] + hp_bf16_to_f32(hy[i]));
	ok(g && bad == 0, "add_bf16 n=%zu: %zu differ from h + (float)o", n, bad);

	hp_cuda_scale(dh, 0.37f, n);
	g = gpu_ok();
	hp_cuda_download(hz, dh, n * 4, &err);
	bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += !same_f32(hz[i], hh[i] * 0.37f);
	ok(g && bad == 0, "scale n=%zu: %zu differ from x * s", n, bad);

	hp_cuda_free(dx);
	hp_cuda_free(dh);
	hp_cuda_free(dy);
	free(x);
	free(h);
	free(hy);
	free(hz);
	free(hh);
}

static void test_sumsq(size_t n)
{
	float *x = hfill(n + 1, 3, 3.0f, 0);
	float *dx = ct_dev(x, n + 1, 0);
	double want = 0, got = -1, again = -2;

	for (size_t i = 0; i < n; i++)
		want += (double)x[i] * x[i];
	int rc = hp_cuda_sumsq(&got, dx, n, &err);
	int rc2 = hp_cuda_sumsq(&again, dx, n, &err);
	double rel = fabs(got - want) / (want > 0 ? want : 1);
	/* double sums of non-negative terms in another order: n * 2^-53 at worst */
	ok(rc == 0 && rc2 == 0 && rel <= 1e-10 && !memcmp(&got, &again, sizeof(double)),
	   "sumsq n=%zu: relative error %.2e, same bits twice: %s", n, rel,
	   memcmp(&got, &again, sizeof(double)) ? "no" : "yes");
	hp_cuda_free(dx);
	free(x);
}

/* ---- embedding ---- */

static void test_embedding(long N, int C, int V)
{
	size_t nt = (size_t)V * C, no = (size_t)N * C;
	float *table = hfill(nt, 4, 1.0f, 1), *dout = hfill(no, 5, 1.0f, 0);
	float *dtab0 = hfill(nt, 6, 1.0f, 0), *want = malloc(no * 4 + 4), *dwant = hcopy(dtab0, nt);
	int32_t *ids = hids((size_t)N, 7, V), *order = malloc((size_t)N * 4 + 4), *starts = malloc((size_t)N * 4 + 8);
	float *dtable = ct_dev(table, nt, 1), *dd = ct_dev(dout, no, 0), *dout_gpu = dnan(no, 0);
	float *dt1 = ct_dev(dtab0, nt, 0), *dt2 = ct_dev(dtab0, nt, 0);
	int32_t *dids = ct_dev_i32(ids, (size_t)N);

	/* forward: exact copies of the bf16 rows */
	hp_embedding_fwd(want, ids, table, N, C);
	hp_cuda_embedding_fwd(dout_gpu, dids, (const hp_bf16 *)dtable, N, C);
	int g = gpu_ok();
	float *got = ct_host(dout_gpu, no, 0);
	ok(g && !memcmp(got, want, no * 4), "embedding_fwd N=%ld C=%d V=%d: exact", N, C, V);

	/* the host grouping: (id, index) order, one group per distinct id */
	int nu = hp_cuda_embedding_groups(order, starts, ids, N, -1), good = starts[0] == 0 && starts[nu] == N;
	char *seen = calloc((size_t)N + 1, 1), *idseen = calloc((size_t)V, 1);
	int distinct = 0;
	for (long i = 0; i < N; i++) {
		good &= order[i] >= 0 && order[i] < N && !seen[order[i]];
		if (order[i] >= 0 && order[i] < N)
			seen[order[i]] = 1;
		if (i > 0)
			good &= ids[order[i - 1]] < ids[order[i]] ||
				(ids[order[i - 1]] == ids[order[i]] && order[i - 1] < order[i]);
		if (!idseen[ids[i]]) {
			idseen[ids[i]] = 1;
			distinct++;
		}
	}
	for (int u = 0; u < nu && good; u++) {
		good &= starts[u] < starts[u + 1];
		for (int i = starts[u]; i < starts[u + 1]; i++)
			good &= ids[order[i]] == ids[order[starts[u]]];
		if (u > 0)
			good &= ids[order[starts[u]]] != ids[order[starts[u - 1]]];
	}
	ok(good && nu == distinct, "embedding_groups N=%ld: %d groups (%d distinct ids), sorted by (id, index)",
	   N, nu, distinct);

	/* backward: dtable += rows, per id in token order (the CPU's order) */
	int32_t *dorder = ct_dev_i32(order, (size_t)N), *dstarts = ct_dev_i32(starts, (size_t)nu + 1);
	hp_embedding_bwd(dwant, dout, ids, N, C, -1);
	hp_cuda_embedding_bwd(dt1, dd, dids, dorder, dstarts, nu, N, C);
	hp_cuda_embedding_bwd(dt2, dd, dids, dorder, dstarts, nu, N, C);
	g = gpu_ok();
	float *dgot = ct_host(dt1, nt, 0);
	double ne = ct_nerr(dgot, dwant, nt);
	/* the same fp32 additions in the same order: exact in practice */
	ok(g && ne <= 1e-6 && dev_same(dt1, dt2, nt * 4),
	   "embedding_bwd N=%ld C=%d V=%d: nerr %.2e (bit-exact: %s), deterministic", N, C, V, ne,
	   memcmp(dgot, dwant, nt * 4) ? "no" : "yes");

	hp_cuda_free(dtable);
	hp_cuda_free(dd);
	hp_cuda_free(dout_gpu);
	hp_cuda_free(dt1);
	hp_cuda_free(dt2);
	hp_cuda_free(dids);
	hp_cuda_free(dorder);
	hp_cuda_free(dstarts);
	free(table);
	free(dout);
	free(dtab0);
	free(want);
	free(dwant);
	free(ids);
	free(order);
	free(starts);
	free(got);
	free(dgot);
	free(seen);
	free(idseen);
}

/* ---- RMSNorm: fp32 rows (bf = 0) or per-head bf16 rows (bf = 1) ---- */

static void test_rmsnorm(long N, int C, int bf, int acc)
{
	size_t n = (size_t)N * C;
	float eps = 1e-6f;
	float *x = hfill(n, 8, 2.0f, bf), *w = hfill((size_t)C, 9, 0.5f, 0);
	float *dy = hfill(n, 10, 1.0f, 1), *dx0 = hfill(n, 11, 1.0f, 0), *dw0 = hfill((size_t)C, 12, 1.0f, 0);
	float *y = malloc(n * 4 + 4), *rstd = malloc((size_t)N * 4 + 4);
	const char *kind = bf ? "rmsnorm_bf16" : "rmsnorm";

	for (int c = 0; c < C; c++)
		w[c] += 1.0f;   /* weights around 1 as trained norms have */
	if (bf)
		acc = 0;
	hp_rmsnorm_fwd(y, rstd, x, w, N, C, eps);

	float *dxv = ct_dev(x, n, bf), *dw = ct_dev(w, (size_t)C, 0), *dys = ct_dev(dy, n, 1);
	float *drstd = dnan((size_t)N, 0);
	hp_bf16 *dyout = dnan(n, 1);

	if (bf)
		hp_cuda_rmsnorm_fwd_bf16(dyout, drstd, (const hp_bf16 *)dxv, dw, N, C, eps);
	else
		hp_cuda_rmsnorm_fwd(dyout, drstd, dxv, dw, N, C, eps);
	int g = gpu_ok();
	float *gy = ct_host(dyout, n, 1), *gr = ct_host(drstd, (size_t)N, 0);
	double ey = ct_nerr(gy, y, n), er = ct_nerr(gr, rstd, (size_t)N);
	/* rstd: the same double sum in another order, rounded once to float */
	ok(g && ey <= TOL_BF16 && er <= TOL_F32, "%s_fwd N=%ld C=%d: y nerr %.2e (%zu of %zu not the CPU's "
	   "rounded), rstd nerr %.2e", kind, N, C, ey, bf_diff(gy, y, n), n, er);

	/* backward from the CPU's rstd, so both sides use the same one */
	float *dxr = hcopy(dx0, n), *dwr = hcopy(dw0, (size_t)C);
	hp_rmsnorm_bwd(dxr, dwr, dy, x, w, rstd, N, C, acc);
	hp_cuda_upload(drstd, rstd, (size_t)N * 4, &err);
	void *ddx1 = bf ? dnan(n, 1) : ct_dev(dx0, n, 0);
	void *ddx2 = bf ? dnan(n, 1) : ct_dev(dx0, n, 0);
	float *ddw1 = ct_dev(dw0, (size_t)C, 0), *ddw2 = ct_dev(dw0, (size_t)C, 0);
	for (int run = 0; run < 2; run++) {
		void *ddx = run ? ddx2 : ddx1;
		float *ddw = run ? ddw2 : ddw1;
		if (bf)
			hp_cuda_rmsnorm_bwd_bf16(ddx, ddw, (const hp_bf16 *)dys, (const hp_bf16 *)dxv, dw, drstd, N, C);
		else
			hp_cuda_rmsnorm_bwd(ddx, ddw, (const hp_bf16 *)dys, dxv, dw, drstd, N, C, acc);
	}
	g = gpu_ok();
	float *gdx = ct_host(ddx1, n, bf), *gdw = ct_host(ddw1, (size_t)C, 0);
	double edx = ct_nerr(gdx, dxr, n), edw = ct_nerr(gdw, dwr, (size_t)C);
	int det = dev_same(ddx1, ddx2, n * (bf ? 2 : 4)) && dev_same(ddw1, ddw2, (size_t)C * 4);
	/* dx: fp32 (TOL_F32) or one bf16 rounding (TOL_BF16); dw: fp32 column sums in another order */
	ok(g && edx <= (bf ? TOL_BF16 : TOL_F32) && edw <= TOL_F32 && det,
	   "%s_bwd N=%ld C=%d accumulate=%d: dx nerr %.2e, dw nerr %.2e, deterministic: %s",
	   kind, N, C, acc, edx, edw, det ? "yes" : "no");

	hp_cuda_free(dxv);
	hp_cuda_free(dw);
	hp_cuda_free(dys);
	hp_cuda_free(drstd);
	hp_cuda_free(dyout);
	hp_cuda_free(ddx1);
	hp_cuda_free(ddx2);
	hp_cuda_free(ddw1);
	hp_cuda_free(ddw2);
	free(x);
	free(w);
	free(dy);
	free(dx0);
	free(dw0);
	free(y);
	free(rstd);
	free(gy);
	free(gr);
	free(dxr);
	free(dwr);
	free(gdx);
	free(gdw);
}

/* ---- RoPE ---- */

/* A spec of RoPE type `type` for head_dim D (the scaled types with an
 * original context of T / 4, so that every band of llama3 and yarn's ramp
 * fall inside the table). */
static struct hp_model_spec rope_spec(enum hp_rope_type type, int D, int T)
{
	struct hp_model_spec s = { .head_dim = D, .max_pos = T };

	s.rope = (struct hp_rope_spec){ .type = type, .theta = 10000.0, .factor = 4.0,
					.low_freq_factor = 1.0, .high_freq_factor = 4.0,
					.orig_max_pos = T / 4 > 1 ? T / 4 : 1, .attention_factor = 1.1386,
					.beta_fast = 32, .beta_slow = 1, .truncate = 1 };
	return s;
}

static void test_rope(long N, int H, int D, int T, enum hp_rope_type type)
{
	size_t n = (size_t)N * H * D, nt = (size_t)T * (D / 2);
	float *cs = malloc(nt * 4 + 4), *sn = malloc(nt * 4 + 4);
	float *x = hfill(n, 13, 2.0f, 1), *dx = hfill(n, 14, 1.0f, 1);
	int32_t *pos = hids((size_t)N, 15, T);
	struct hp_model_spec rs = rope_spec(type, D, T);

	hp_model_spec_rope_table(&rs, cs, sn, T);
	if (N > 1)
		pos[N - 1] = T - 1;   /* the table's last row */
	float *dcs = ct_dev(cs, nt, 0), *dsn = ct_dev(sn, nt, 0);
	hp_bf16 *dxq = ct_dev(x, n, 1), *ddx = ct_dev(dx, n, 1);
	int32_t *dpos = ct_dev_i32(pos, (size_t)N);

	hp_cuda_rope_fwd(dxq, dpos, dcs, dsn, N, H, D);
	hp_cuda_rope_bwd(ddx, dpos, dcs, dsn, N, H, D);
	int g = gpu_ok();
	float *gx = ct_host(dxq, n, 1), *gdx = ct_host(ddx, n, 1);
	hp_rope_fwd(x, pos, cs, sn, N, H, D);
	hp_rope_bwd(dx, pos, cs, sn, N, H, D);
	double ef = ct_nerr(gx, x, n), eb = ct_nerr(gdx, dx, n);
	/* the CPU's fp32 arithmetic unfused, then one bf16 rounding */
	ok(g && ef <= TOL_BF16 && eb <= TOL_BF16, "rope %s N=%ld H=%d D=%d: fwd nerr %.2e, bwd nerr %.2e "
	   "(%zu and %zu of %zu not the CPU's rounded)", hp_rope_type_name(type), N, H, D, ef, eb,
	   bf_diff(gx, x, n), bf_diff(gdx, dx, n), n);

	hp_cuda_free(dcs);
	hp_cuda_free(dsn);
	hp_cuda_free(dxq);
	hp_cuda_free(ddx);
	hp_cuda_free(dpos);
	free(cs);
	free(sn);
	free(x);
	free(dx);
	free(pos);
	free(gx);
	free(gdx);
}

/* ---- SwiGLU on [gate | up] rows ---- */

static void test_swiglu(long rows, int I)
{
	size_t n = (size_t)rows * I;
	float *gu = hfill(2 * n, 16, 8.0f, 1), *dh = hfill(n, 17, 1.0f, 1);
	float *h = malloc(n * 4 + 4), *dgu = malloc(2 * n * 4 + 4);

	/* saturated gates: exp overflows on one side, silu must stay finite */
	if (I >= 4)
		for (long r = 0; r < rows; r += 3) {
			gu[r * 2 * I] = 100.0f;
			gu[r * 2 * I + 1] = -100.0f;
			gu[r * 2 * I + 2] = -88.5f;
			gu[r * 2 * I + 3] = 0.0f;
		}
	hp_bf16 *dgu_in = ct_dev(gu, 2 * n, 1), *ddh = ct_dev(dh, n, 1);
	hp_bf16 *dhout = dnan(n, 1), *ddgu = dnan(2 * n, 1);

	hp_cuda_swiglu_fwd(dhout, dgu_in, rows, I);
	hp_cuda_swiglu_bwd(ddgu, ddh, dgu_in, rows, I);
	int g = gpu_ok();
	float *gh = ct_host(dhout, n, 1), *gdgu = ct_host(ddgu, 2 * n, 1);
	hp_swiglu_rows_fwd(h, gu, rows, I);
	hp_swiglu_rows_bwd(dgu, dh, gu, rows, I);
	double ef = ct_nerr(gh, h, n), eb = ct_nerr(gdgu, dgu, 2 * n);
	/* sigmoid within an ulp or two of the CPU's, then one bf16 rounding */
	ok(g && ef <= TOL_BF16 && eb <= TOL_BF16, "swiglu rows=%ld I=%d: fwd nerr %.2e, bwd nerr %.2e "
	   "(%zu and %zu not the CPU's rounded)", rows, I, ef, eb, bf_diff(gh, h, n), bf_diff(gdgu, dgu, 2 * n));

	hp_cuda_free(dgu_in);
	hp_cuda_free(ddh);
	hp_cuda_free(dhout);
	hp_cuda_free(ddgu);
	free(gu);
	free(dh);
	free(h);
	free(dgu);
	free(gh);
	free(gdgu);
}

/* ---- MoE routing: the references are kernels/cpu/router.c (the CPU
 * model's) and, for the rows, lib/model.c's loops ---- */

static void ref_router(float *probs, int32_t *sel, float *wsel, const float *logits,
		       long N, int E, int K, int norm)
{
	memcpy(probs, logits, sizeof(float) * (size_t)N * E);
	hp_router_topk(probs, sel, wsel, N, E, K, norm);
}

/* aux is float here (the CUDA op's), double in the CPU model */
static void ref_router_bwd(float *dprob, const float *probs, const int32_t *sel, const float *wsel,
			   const float *dws, const float *aux, double aux_grad, long N, int E, int K, int norm)
{
	double *ad = calloc((size_t)E, sizeof(double));

	for (int x = 0; aux && x < E; x++)
		ad[x] = aux[x];
	hp_router_bwd(dprob, probs, sel, wsel, dws, ad, aux ? aux_grad : 0, N, E, K, norm);
	free(ad);
}

/* router logits [N, E]: bf16-valued (distinct values then differ by far more
 * than expf's ulps, so the top-k cannot flip between CPU and GPU), or with
 * ties: small integers, every row of a few all equal */
static float *router_logits(long N, int E, int ties, unsigned seed)
{
	float *lg = hfill((size_t)N * E, seed, 4.0f, 1);

	if (ties) {
		for (size_t i = 0; i < (size_t)N * E; i++)
			lg[i] = floorf(lg[i]);
		for (long t = 0; t < N; t += 5)
			for (int x = 0; x < E; x++)
				lg[t * E + x] = 0.5f;
	}
	return lg;
}

static void test_router(long N, int E, int K, int norm, int ties)
{
	size_t ne = (size_t)N * E, nk = (size_t)N * K;
	float *lg = router_logits(N, E, ties, 18 + (unsigned)E);
	float *probs = malloc(ne * 4 + 4), *wsel = malloc(nk * 4 + 4);
	int32_t *sel = malloc(nk * 4 + 4), *gsel = malloc(nk * 4 + 4), *gsel2 = malloc(nk * 4 + 4);

	ref_router(probs, sel, wsel, lg, N, E, K, norm);
	float *dlg = ct_dev(lg, ne, 0), *dprobs = dnan(ne, 0), *dwsel = dnan(nk, 0);
	float *dws2 = dnan(nk, 0);
	int32_t *dsel = dalloc(nk * 4 + 4), *dsel2 = dalloc(nk * 4 + 4);

	hp_cuda_router_topk(dprobs, dsel, dwsel, dlg, N, E, K, norm);
	hp_cuda_router_topk(dlg, dsel2, dws2, dlg, N, E, K, norm);    /* in place */
	int g = gpu_ok();
	float *gp = ct_host(dprobs, ne, 0), *gw = ct_host(dwsel, nk, 0);
	hp_cuda_download(gsel, dsel, nk * 4, &err);
	hp_cuda_download(gsel2, dsel2, nk * 4, &err);
	size_t bad = 0;
	for (size_t i = 0; i < nk; i++)
		bad += gsel[i] != sel[i];
	double ep = ct_nerr(gp, probs, ne), ew = ct_nerr(gw, wsel, nk);
	int inplace = dev_same(dlg, dprobs, ne * 4) && dev_same(dws2, dwsel, nk * 4) && !memcmp(gsel, gsel2, nk * 4);
	ok(g && bad == 0 && ep <= TOL_PROB && ew <= TOL_PROB && inplace,
	   "router_topk N=%ld E=%d k=%d norm=%d%s: %zu of %zu experts differ, probs nerr %.2e, "
	   "wsel nerr %.2e, in place the same: %s", N, E, K, norm, ties ? " ties" : "", bad, nk, ep, ew,
	   inplace ? "yes" : "no");

	/* backward, from the CPU's forward */
	/* aux in [0, 0.5) with aux_grad 1: large enough that dropping it fails */
	float *dws = hfill(nk, 19, 1.0f, 0), *aux = hfill((size_t)E, 20, 0.25f, 0), *want = malloc(ne * 4 + 4);
	double aux_grad = ties ? 0 : 1.0;
	for (int x = 0; x < E; x++)
		aux[x] += 0.25f;
	ref_router_bwd(want, probs, sel, wsel, dws, aux, aux_grad, N, E, K, norm);
	hp_cuda_upload(dprobs, probs, ne * 4, &err);
	hp_cuda_upload(dsel, sel, nk * 4, &err);
	hp_cuda_upload(dwsel, wsel, nk * 4, &err);
	float *ddws = ct_dev(dws, nk, 0), *daux = ct_dev(aux, (size_t)E, 0);
	hp_bf16 *dl1 = dnan(ne, 1), *dl2 = dnan(ne, 1);
	for (int run = 0; run < 2; run++)
		hp_cuda_router_bwd(run ? dl2 : dl1, dprobs, dsel, dwsel, ddws, aux_grad != 0 ? daux : NULL, aux_grad,
				   N, E, K, norm);
	g = gpu_ok();
	float *gl = ct_host(dl1, ne, 1);
	double el = ct_nerr(gl, want, ne);
	int det = dev_same(dl1, dl2, ne * 2);
	/* dlogits are the CPU's fp32 values (double sums in another order) rounded once to bf16 */
	ok(g && el <= TOL_BF16 && det, "router_bwd N=%ld E=%d k=%d norm=%d aux=%g: dlogits nerr %.2e, "
	   "deterministic: %s", N, E, K, norm, aux_grad, el, det ? "yes" : "no");

	hp_cuda_free(dlg);
	hp_cuda_free(dprobs);
	hp_cuda_free(dwsel);
	hp_cuda_free(dws2);
	hp_cuda_free(dsel);
	hp_cuda_free(dsel2);
	hp_cuda_free(ddws);
	hp_cuda_free(daux);
	hp_cuda_free(dl1);
	hp_cuda_free(dl2);
	free(lg);
	free(probs);
	free(wsel);
	free(sel);
	free(gsel);
	free(gsel2);
	free(gp);
	free(gw);
	free(dws);
	free(aux);
	free(want);
	free(gl);
}

/* moe_forward's expert-major rows: row r holds (row_tok[r], row_slot[r]);
 * tok_row is the inverse map the CUDA ops take */
static void ref_route(int32_t *row_tok, int32_t *row_slot, int32_t *tok_row, const int32_t *sel,
		      long N, int E, int K)
{
	int32_t *off = calloc((size_t)E + 1, 4), *fill = malloc((size_t)E * 4 + 4);

	for (long i = 0; i < N * K; i++)
		off[sel[i] + 1]++;
	for (int x = 0; x < E; x++)
		off[x + 1] += off[x];
	memcpy(fill, off, sizeof(int32_t) * (size_t)E);
	for (long t = 0; t < N; t++)
		for (int k = 0; k < K; k++) {
			int32_t r = fill[sel[t * K + k]]++;
			row_tok[r] = (int32_t)t;
			row_slot[r] = k;
			tok_row[t * K + k] = r;
		}
	free(off);
	free(fill);
}

static void test_rows(long N, int C, int E, int K)
{
	long R = N * K;
	size_t nx = (size_t)N * C, nr = (size_t)R * C;
	float *lg = router_logits(N, E, 0, 21), *probs = malloc((size_t)N * E * 4 + 4), *wsel = malloc((size_t)R * 4 + 4);
	int32_t *sel = malloc((size_t)R * 4 + 4), *row_tok = malloc((size_t)R * 4 + 4);
	int32_t *row_slot = malloc((size_t)R * 4 + 4), *tok_row = malloc((size_t)R * 4 + 4);

	ref_router(probs, sel, wsel, lg, N, E, K, 1);
	ref_route(row_tok, row_slot, tok_row, sel, N, E, K);
	int32_t *drow_tok = ct_dev_i32(row_tok, (size_t)R), *dtok_row = ct_dev_i32(tok_row, (size_t)R);
	float *dwsel = ct_dev(wsel, (size_t)R, 0);

	/* gather: exact row copies, aligned (vector path when C % 8 == 0) and
	 * one element off (the scalar path) */
	float *x = hfill(nx + 1, 22, 2.0f, 1);
	hp_bf16 *dx = ct_dev(x, nx + 1, 1), *dxs = dnan(nr + 1, 1);
	hp_bf16 *dxs_off = dnan(nr + 1, 1);
	hp_cuda_gather_rows(dxs, dx, drow_tok, R, C);
	hp_cuda_gather_rows(dxs_off + 1, dx + 1, drow_tok, R, C);
	int g = gpu_ok();
	float *gxs = ct_host(dxs, nr, 1), *gxo = ct_host(dxs_off, nr + 1, 1);
	size_t bad = 0;
	for (long r = 0; r < R; r++)
		for (int c = 0; c < C; c++) {
			bad += !same_f32(gxs[r * C + c], x[(long)row_tok[r] * C + c]);
			bad += !same_f32(gxo[1 + r * C + c], x[1 + (long)row_tok[r] * C + c]);
		}
	ok(g && bad == 0, "gather_rows R=%ld C=%d: %zu elements differ (aligned and misaligned)", R, C, bad);

	/* combine: the CPU adds rows in expert order, the GPU in slot order */
	float *ye = hfill(nr, 23, 2.0f, 1), *out = calloc(nx + 1, 4);
	for (long r = 0; r < R; r++) {
		long t = row_tok[r];
		float wt = wsel[t * K + row_slot[r]];
		const float *y = ye + r * C;
		float *o = out + t * C;
		for (int c = 0; c < C; c++)
			o[c] += y[c] * wt;
	}
	hp_bf16 *dye = ct_dev(ye, nr, 1), *dout = dnan(nx, 1);
	hp_cuda_combine(dout, dye, dwsel, dtok_row, N, K, C);
	g = gpu_ok();
	float *gout = ct_host(dout, nx, 1);
	double eo = ct_nerr(gout, out, nx);
	/* fp32 sums of k terms in another order, one bf16 rounding */
	ok(g && eo <= TOL_BF16, "combine N=%ld C=%d E=%d k=%d: nerr %.2e", N, C, E, K, eo);

	/* combine backward: dy_r = w * dout_t, dw = dout_t . y_r */
	float *dd = hfill(nx, 24, 1.0f, 1), *dyr = malloc(nr * 4 + 4), *dwr = malloc((size_t)R * 4 + 4);
	for (long r = 0; r < R; r++) {
		long t = row_tok[r];
		int k = row_slot[r];
		float wt = wsel[t * K + k];
		const float *d = dd + t * C, *y = ye + r * C;
		float *dy = dyr + r * C;
		double dot = 0;
		for (int c = 0; c < C; c++) {
			dy[c] = d[c] * wt;
			dot += (double)d[c] * y[c];
		}
		dwr[t * K + k] = (float)dot;
	}
	hp_bf16 *ddout = ct_dev(dd, nx, 1), *ddye1 = dnan(nr, 1), *ddye2 = dnan(nr, 1);
	float *ddw1 = dnan((size_t)R, 0), *ddw2 = dnan((size_t)R, 0);
	for (int run = 0; run < 2; run++)
		hp_cuda_combine_bwd(run ? ddye2 : ddye1, run ? ddw2 : ddw1, ddout, dye, dwsel, dtok_row, N, K, C);
	g = gpu_ok();
	float *gdye = ct_host(ddye1, nr, 1), *gdw = ct_host(ddw1, (size_t)R, 0);
	double edy = ct_nerr(gdye, dyr, nr), edw = ct_nerr(gdw, dwr, (size_t)R);
	int det = dev_same(ddye1, ddye2, nr * 2) && dev_same(ddw1, ddw2, (size_t)R * 4);
	/* dye: one product rounded to bf16; dwsel: double dot products in another order */
	ok(g && edy <= TOL_BF16 && edw <= TOL_F32 && det,
	   "combine_bwd N=%ld C=%d E=%d k=%d: dye nerr %.2e, dwsel nerr %.2e, deterministic: %s",
	   N, C, E, K, edy, edw, det ? "yes" : "no");

	/* scatter-add: dx[t] += the experts' input gradients of its rows */
	float *dx0 = hfill(nx, 25, 1.0f, 1), *dxe = hfill(nr, 26, 1.0f, 1), *dxr = hcopy(dx0, nx);
	for (long r = 0; r < R; r++) {
		float *d = dxr + (long)row_tok[r] * C;
		const float *xr = dxe + r * C;
		for (int c = 0; c < C; c++)
			d[c] += xr[c];
	}
	hp_bf16 *ddx1 = ct_dev(dx0, nx, 1), *ddx2 = ct_dev(dx0, nx, 1), *ddxe = ct_dev(dxe, nr, 1);
	hp_cuda_scatter_add_rows(ddx1, ddxe, dtok_row, N, K, C);
	hp_cuda_scatter_add_rows(ddx2, ddxe, dtok_row, N, K, C);
	g = gpu_ok();
	float *gdx = ct_host(ddx1, nx, 1);
	double ex = ct_nerr(gdx, dxr, nx);
	det = dev_same(ddx1, ddx2, nx * 2);
	/* k + 1 fp32 terms in another order, one bf16 rounding */
	ok(g && ex <= TOL_BF16 && det, "scatter_add_rows N=%ld C=%d k=%d: nerr %.2e, deterministic: %s",
	   N, C, K, ex, det ? "yes" : "no");

	hp_cuda_free(drow_tok);
	hp_cuda_free(dtok_row);
	hp_cuda_free(dwsel);
	hp_cuda_free(dx);
	hp_cuda_free(dxs);
	hp_cuda_free(dxs_off);
	hp_cuda_free(dye);
	hp_cuda_free(dout);
	hp_cuda_free(ddout);
	hp_cuda_free(ddye1);
	hp_cuda_free(ddye2);
	hp_cuda_free(ddw1);
	hp_cuda_free(ddw2);
	hp_cuda_free(ddx1);
	hp_cuda_free(ddx2);
	hp_cuda_free(ddxe);
	free(lg);
	free(probs);
	free(wsel);
	free(sel);
	free(row_tok);
	free(row_slot);
	free(tok_row);
	free(x);
	free(gxs);
	free(gxo);
	free(ye);
	free(out);
	free(gout);
	free(dd);
	free(dyr);
	free(dwr);
	free(gdye);
	free(gdw);
	free(dx0);
	free(dxe);
	free(dxr);
	free(gdx);
}

/* HP_CUDA_TEST_SMALL set: the small and awkward shapes only (under
 * compute-sanitizer, which is slow; scripts/gpu-check.sh) */
static int small_only(void)
{
	return getenv("HP_CUDA_TEST_SMALL") != NULL;
}

static void run_all(void)
{
	int big = !small_only();

	test_convert(1);
	test_convert(1000);
	if (big)
		test_convert((size_t)4096 * 2048 + 5);
	test_sumsq(0);
	test_sumsq(1);
	test_sumsq(1000);
	if (big)
		test_sumsq((size_t)4096 * 2048 + 5);

	test_embedding(1, 1, 1);
	test_embedding(1000, 1000, 50);
	if (big)
		test_embedding(4096, 2048, 3000);

	test_rmsnorm(1, 1, 0, 0);
	test_rmsnorm(1, 1000, 0, 1);
	test_rmsnorm(7, 1000, 0, 0);
	if (big)
		test_rmsnorm(300, 4100, 0, 1);
	if (big)
		test_rmsnorm(4096, 2048, 0, 1);
	if (big)
		test_rmsnorm(4096, 2048, 0, 0);
	test_rmsnorm(1, 64, 1, 0);
	test_rmsnorm(33, 1000, 1, 0);
	if (big)
		test_rmsnorm(4096L * 32, 128, 1, 0);

	test_rope(1, 1, 2, 1, HP_ROPE_DEFAULT);
	test_rope(5, 3, 64, 16, HP_ROPE_DEFAULT);
	test_rope(100, 7, 96, 300, HP_ROPE_DEFAULT);
	/* every RoPE type: the kernels read the table, so one shape each */
	for (int t = HP_ROPE_LINEAR; t <= HP_ROPE_LLAMA3; t++)
		test_rope(100, 7, 96, 300, (enum hp_rope_type)t);
	if (big)
		test_rope(4096, 32, 128, 4096, HP_ROPE_DEFAULT);

	test_swiglu(1, 1);
	test_swiglu(37, 1000);
	if (big)
		test_swiglu(4096, 768);
	if (big)
		test_swiglu(1024, 5632);

	test_router(1, 8, 2, 1, 0);
	test_router(1000, 8, 2, 0, 0);
	test_router(3, 8, 8, 1, 0);
	if (big)
		test_router(4096, 128, 8, 1, 0);
	if (big)
		test_router(4096, 128, 8, 0, 0);
	test_router(333, 64, 6, 1, 1);
	test_router(333, 60, 4, 0, 1);
	test_router(50, 200, 8, 1, 1);

	test_rows(1, 1000, 8, 2);
	test_rows(1000, 1000, 8, 2);
	test_rows(77, 1001, 60, 4);
	test_rows(50, 1002, 8, 2);
	if (big)
		test_rows(2048, 2048, 128, 8);
}
#endif

int main(void)
{
#ifdef HP_HAVE_CUDA
	if (!ct_start("cuda element-wise, norm, RoPE, SwiGLU, embedding and MoE routing ops against the CPU reference"))
		return tap_done();
	run_all();
	hp_cuda_fini();
#else
	tap_skip("built without CUDA (no nvcc)", "cuda element-wise, norm, RoPE, SwiGLU, embedding and MoE "
		 "routing ops against the CPU reference");
#endif
	return tap_done();
}
