/*
 * test-router-group.c - DeepSeek-V3's grouped sigmoid router
 * (hp_router_group_fwd / _bwd, kernels/cpu/router.c) against
 * DeepseekV3TopkRouter as transformers writes it, brute force here.
 *
 * The reference takes the values that decide the choice in float32, as
 * torch does - s = sigmoid(logit) rounded once, c = s + bias, a group's
 * score the float sum of its two largest c - and then sorts: the groups
 * by score (ties to the lower index), the first TG kept, the others'
 * experts masked to -inf (transformers 5) or 0 (4.57), the experts by
 * masked c, the first K chosen.  So the kernel's sel must be the
 * reference's exactly and its probs the same bits.  The weights are in
 * double: s[sel] / (their sum + 1e-20) when norm, times scale; the
 * kernel's float ones within 4 u relative (the sum rounded to float, the
 * 1e-20 add, the division, the product: one rounding each).
 *
 * Cases: ties everywhere (logits and biases from a few values, whole rows
 * equal), a negative bias that makes kept experts' c negative (then the
 * two masks choose differently, and the test makes sure some tokens do),
 * G = 1, TG = G, no bias, norm off, DeepSeek-V3's shape (256 experts, 8
 * groups, 4 kept, top 8, scale 2.5).  The backward against central
 * differences in double of the reference's weights with the choice held
 * (step 1e-5: truncation 1e-10, far below the 1e-6 relative L2 allowed;
 * the kernel rounds once to float, and differentiates at the float s), and
 * exactly 0 at the experts not chosen.  Both directions give the same bits
 * at 1 and 3 threads.
 */
#include <math.h>
#include <sys/mman.h>

#include "cpu/ops.h"
#include "tap.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double urand(void)
{
	return tap_urand(&rng);
}

/* uniform in [lo, hi) */
static float *ufill(size_t n, double lo, double hi)
{
	float *x = malloc(n * sizeof(float) + 4);

	for (size_t i = 0; i < n; i++)
		x[i] = (float)(lo + (hi - lo) * urand());
	return x;
}

/* one of the m values v[] at random */
static float *pick_fill(size_t n, const float *v, int m)
{
	float *x = malloc(n * sizeof(float) + 4);

	for (size_t i = 0; i < n; i++)
		x[i] = v[(int)(urand() * m) % m];
	return x;
}

struct router_case {
	int E, K, G, TG, norm, mask_zero;
	float scale;
};

/* ---- the reference ---- */

static const float *sort_key;

/* indices by falling key, ties to the lower index */
static int by_key(const void *a, const void *b)
{
	int i = *(const int *)a, j = *(const int *)b;

	if (sort_key[i] != sort_key[j])
		return sort_key[i] > sort_key[j] ? -1 : 1;
	return i - j;
}

static void sorted(int *idx, const float *key, int n)
{
	for (int i = 0; i < n; i++)
		idx[i] = i;
	sort_key = key;
	qsort(idx, (size_t)n, sizeof(int), by_key);
}

/* one token: s [E] (float), sel [K], w [K] (double) */
static void ref_token(float *s, int32_t *sel, double *w, const float *logit, const float *bias,
		      const struct router_case *rc)
{
	int E = rc->E, G = rc->G, S = E / G;
	float *c = malloc(sizeof(float) * (size_t)E), *gs = malloc(sizeof(float) * (size_t)G);
	int *idx = malloc(sizeof(int) * (size_t)E), *kept = calloc((size_t)G, sizeof(int));
	double sum = 0;

	for (int e = 0; e < E; e++) {
		s[e] = (float)(1.0 / (1.0 + exp(-(double)logit[e])));
		c[e] = bias ? s[e] + bias[e] : s[e];
	}
	for (int g = 0; g < G; g++) {
		sorted(idx, c + g * S, S);
		gs[g] = c[g * S + idx[0]] + c[g * S + idx[1]];
	}
	sorted(idx, gs, G);
	for (int r = 0; r < rc->TG; r++)
		kept[idx[r]] = 1;
	for (int e = 0; e < E; e++)
		if (!kept[e / S])
			c[e] = rc->mask_zero ? 0.0f : -INFINITY;
	sorted(idx, c, E);
	for (int k = 0; k < rc->K; k++) {
		sel[k] = idx[k];
		sum += s[idx[k]];
	}
	for (int k = 0; k < rc->K; k++)
		w[k] = s[sel[k]] / (rc->norm ? sum + 1e-20 : 1.0) * rc->scale;
	free(c); free(gs); free(idx); free(kept);
}

/* the kernel's forward on logits [N, E] against the reference; the
 * number of tokens chosen differently, or -1 when the kernel fails */
static long check_fwd(const char *what, const float *logits, const float *bias, long N,
		      const struct router_case *rc, int32_t *sel_out)
{
	int E = rc->E, K = rc->K;
	size_t ne = (size_t)N * E, nk = (size_t)N * K;
	float *probs = malloc(ne * 4), *wsel = malloc(nk * 4), *s = malloc((size_t)E * 4);
	int32_t *sel = malloc(nk * 4), rsel[64];
	double rw[64], werr = 0;
	long bad_sel = 0, bad_s = 0;

	memcpy(probs, logits, ne * 4);
	hp_router_group_fwd(probs, sel, wsel, bias, N, E, K, rc->G, rc->TG, rc->norm, rc->scale, rc->mask_zero);
	for (long n = 0; n < N; n++) {
		ref_token(s, rsel, rw, logits + n * E, bias, rc);
		bad_s += memcmp(s, probs + n * E, (size_t)E * 4) != 0;
		bad_sel += memcmp(rsel, sel + n * K, (size_t)K * 4) != 0;
		for (int k = 0; k < K; k++) {
			double d = fabs(wsel[n * K + k] - rw[k]) / fabs(rw[k]);
			werr = d > werr || isnan(d) ? d : werr;
		}
	}
	/* 4 roundings of float arithmetic against double */
	ok(bad_sel == 0 && bad_s == 0 && werr <= 4 * TAP_U,
	   "router_group %s E=%d K=%d G=%d TG=%d norm=%d scale=%g mask_zero=%d%s N=%ld: %ld tokens choose "
	   "otherwise, %ld rows of s not the sigmoid's bits, wsel %.2f u", what, E, K, rc->G, rc->TG, rc->norm,
	   rc->scale, rc->mask_zero, bias ? "" : " no bias", N, bad_sel, bad_s, werr / TAP_U);
	if (sel_out)
		memcpy(sel_out, sel, nk * 4);
	free(probs); free(wsel); free(s); free(sel);
	return bad_sel;
}

static void check_random(const char *what, long N, const struct router_case *rc, double blo, double bhi,
			 int with_bias)
{
	float *lg = ufill((size_t)N * rc->E, -4, 4), *bias = ufill((size_t)rc->E, blo, bhi);

	check_fwd(what, lg, with_bias ? bias : NULL, N, rc, NULL);
	free(lg); free(bias);
}

/* ties: logits and biases from a handful of values (sigmoid(0) = 0.5, c
 * sums exact), every fifth row all equal: groups' scores and experts'
 * scores tie, both masks */
static void test_ties(void)
{
	const float lv[] = { -1, 0, 0, 1, 2 }, bv[] = { 0, 0, -0.25f, 0.5f };
	long N = 200;
	struct router_case rc = { .E = 32, .K = 6, .G = 8, .TG = 3, .norm = 1, .scale = 1 };
	float *lg = pick_fill((size_t)N * rc.E, lv, 5), *bias = pick_fill((size_t)rc.E, bv, 4);

	for (long n = 0; n < N; n += 5)
		for (int e = 0; e < rc.E; e++)
			lg[n * rc.E + e] = 0;
	for (rc.mask_zero = 0; rc.mask_zero < 2; rc.mask_zero++) {
		check_fwd("ties", lg, bias, N, &rc, NULL);
		check_fwd("ties", lg, NULL, N, &rc, NULL);
	}

	/* one token by hand: all equal, so groups 0..2 and experts 0..5 */
	int32_t sel[6];
	float p[32] = { 0 }, w[6];
	hp_router_group_fwd(p, sel, w, NULL, 1, 32, 6, 8, 3, 1, 1.0f, 0);
	int want = 1;
	for (int k = 0; k < 6; k++)
		want &= sel[k] == k && w[k] == 1.0f / 6;
	ok(want && p[31] == 0.5f, "router_group all tied: experts 0..5 of groups 0, 1, 2, each weight 1/6");
	free(lg); free(bias);
}

/* a negative bias: some kept experts' c below 0, where a masked expert's
 * 0 wins under 4.57's mask and -inf loses under 5's */
static void test_negative_bias(void)
{
	long N = 300, differ = 0;
	struct router_case rc = { .E = 16, .K = 6, .G = 4, .TG = 2, .norm = 1, .scale = 2.5f };
	float *lg = ufill((size_t)N * rc.E, -4, 4), *bias = ufill((size_t)rc.E, -1.0, 0.2);
	int32_t *s0 = malloc((size_t)N * rc.K * 4), *s1 = malloc((size_t)N * rc.K * 4);

	rc.mask_zero = 0;
	check_fwd("negative bias", lg, bias, N, &rc, s0);
	rc.mask_zero = 1;
	check_fwd("negative bias", lg, bias, N, &rc, s1);
	for (long n = 0; n < N; n++)
		differ += memcmp(s0 + n * rc.K, s1 + n * rc.K, (size_t)rc.K * 4) != 0;
	ok(differ > 0 && differ < N, "router_group: the masks -inf and 0 choose differently where a kept c < 0 "
	   "(%ld of %ld tokens)", differ, N);
	free(lg); free(bias); free(s0); free(s1);
}

/* ---- the backward ---- */

/* sum_k R_k w_k in double, the choice sel held, at logits x (one token) */
static double ref_loss(const double *x, const int32_t *sel, const float *R, const struct router_case *rc)
{
	double sum = 0, L = 0;

	for (int k = 0; k < rc->K; k++)
		sum += 1.0 / (1.0 + exp(-x[sel[k]]));
	for (int k = 0; k < rc->K; k++)
		L += R[k] * (1.0 / (1.0 + exp(-x[sel[k]]))) / (rc->norm ? sum + 1e-20 : 1.0) * rc->scale;
	return L;
}

static void test_bwd(struct router_case rc)
{
	long N = 7;
	int E = rc.E, K = rc.K;
	size_t ne = (size_t)N * E, nk = (size_t)N * K;
	float *lg = ufill(ne, -3, 3), *bias = ufill((size_t)E, -0.2, 0.2), *R = ufill(nk, -1, 1);
	float *probs = malloc(ne * 4), *wsel = malloc(nk * 4), *dl = malloc(ne * 4), *num = malloc(ne * 4);
	int32_t *sel = malloc(nk * 4);
	double x[64];
	long nonzero = 0;

	memcpy(probs, lg, ne * 4);
	hp_router_group_fwd(probs, sel, wsel, bias, N, E, K, rc.G, rc.TG, rc.norm, rc.scale, rc.mask_zero);
	for (size_t i = 0; i < ne; i++)
		dl[i] = NAN;
	hp_router_group_bwd(dl, probs, sel, R, N, E, K, rc.norm, rc.scale);
	for (long n = 0; n < N; n++) {
		const double h = 1e-5;
		for (int e = 0; e < E; e++)
			x[e] = lg[n * E + e];
		for (int e = 0; e < E; e++) {
			int chosen = 0;
			for (int k = 0; k < K; k++)
				chosen |= sel[n * K + k] == e;
			x[e] += h;
			double lp = ref_loss(x, sel + n * K, R + n * K, &rc);
			x[e] -= 2 * h;
			double lm = ref_loss(x, sel + n * K, R + n * K, &rc);
			x[e] += h;
			num[n * E + e] = (float)((lp - lm) / (2 * h));
			nonzero += !chosen && memcmp(&dl[n * E + e], &(float){ 0 }, 4) != 0;
		}
	}
	double err = tap_rel_l2(dl, num, ne, 0);
	ok(err <= 1e-6 && nonzero == 0, "router_group_bwd E=%d K=%d norm=%d scale=%g: central differences within "
	   "%.2e, %ld experts not chosen with a gradient other than +0", E, K, rc.norm, rc.scale, err, nonzero);
	free(lg); free(bias); free(R); free(probs); free(wsel); free(dl); free(num); free(sel);
}

/* ---- threads ---- */

#define TH_N 1000L
#define TH_E 256
#define TH_K 8

struct th_run { float *out; };

static int th_child(void *p)
{
	float *out = ((struct th_run *)p)->out, *probs = out, *wsel = out + TH_N * TH_E;
	float *dl = wsel + TH_N * TH_K;
	int32_t *sel = (int32_t *)(dl + TH_N * TH_E);

	rng = 0x1234567ull;
	float *lg = ufill((size_t)TH_N * TH_E, -4, 4), *bias = ufill(TH_E, -0.5, 0.5);
	float *R = ufill((size_t)TH_N * TH_K, -1, 1);
	memcpy(probs, lg, sizeof(float) * TH_N * TH_E);
	hp_router_group_fwd(probs, sel, wsel, bias, TH_N, TH_E, TH_K, 8, 4, 1, 2.5f, 0);
	hp_router_group_bwd(dl, probs, sel, R, TH_N, TH_E, TH_K, 1, 2.5f);
	free(lg); free(bias); free(R);
	return 0;
}

static void test_threads(void)
{
	size_t n = (size_t)TH_N * (2 * TH_E + 2 * TH_K);
	float *sh = mmap(NULL, 2 * n * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (sh == MAP_FAILED) {
		ok(0, "mmap for the router's thread test");
		return;
	}
	struct th_run r1 = { sh }, r3 = { sh + n };
	int ran = !tap_child(1, NULL, th_child, &r1) && !tap_child(3, NULL, th_child, &r3);
	ok(ran && !memcmp(sh, sh + n, n * sizeof(float)),
	   "router_group forward and backward, N=%ld E=%d: 1 and 3 threads give the same bits", TH_N, TH_E);
	munmap(sh, 2 * n * sizeof(float));
}

int main(void)
{
	test_ties();
	test_negative_bias();
	/* G = 1: no groups to mask; TG = G: every group kept */
	check_random("one group", 100, &(struct router_case){ 64, 6, 1, 1, 1, 0, 1.0f }, -0.1, 0.1, 1);
	check_random("every group kept", 100, &(struct router_case){ 64, 4, 8, 8, 1, 0, 1.0f }, -0.1, 0.1, 1);
	check_random("every group kept", 100, &(struct router_case){ 64, 4, 8, 8, 0, 1, 1.5f }, -0.1, 0.1, 0);
	/* DeepSeek-V3: 256 experts, 8 groups, 4 kept, top 8, scale 2.5 */
	for (int mz = 0; mz < 2; mz++)
		check_random("DeepSeek-V3", 500, &(struct router_case){ 256, 8, 8, 4, 1, mz, 2.5f }, -0.3, 0.3, 1);
	check_random("norm off", 100, &(struct router_case){ 64, 6, 8, 3, 0, 0, 2.5f }, -0.3, 0.3, 1);
	check_random("K = E", 20, &(struct router_case){ 8, 8, 4, 2, 1, 0, 1.0f }, -0.3, 0.3, 1);

	test_bwd((struct router_case){ 16, 4, 4, 2, 1, 0, 2.5f });
	test_bwd((struct router_case){ 16, 4, 4, 2, 0, 0, 1.5f });
	test_bwd((struct router_case){ 32, 8, 1, 1, 1, 1, 1.0f });
	test_threads();
	return tap_done();
}
