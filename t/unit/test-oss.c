/*
 * test-oss.c - GPT-OSS's kernels (kernels/cpu/oss.c) against their
 * definitions, as transformers' modeling_gpt_oss.py writes them, in double.
 *
 * Sinks: the flash kernel (kernels/cpu/flashattn.c) then hp_attn_sinks_fwd
 * must give HF's eager_attention_forward with sinks: scores, the sink logit
 * concatenated to each row, the row max subtracted, softmax, the sink's
 * column dropped, P V; computed here in double from the same q, k, v.  The
 * backward (hp_attn_sinks_bwd for the sinks, then the flash backward with
 * the fixed out and lse for q, k, v) against the same definition
 * differentiated by hand in double: dP = dO V^T, dS = P (dP - rowsum(P dP))
 * over the keys, d sink = -p_sink rowsum(P dP).  Shapes: GQA 1 and 2,
 * packed rows (seg), sinks from -4 to 4 (a sink that takes almost all or
 * almost none of a row).  Tolerance 1e-5 relative L2 (tap.h's norms): the
 * kernels are float, the definition double; a row's rounding is a few
 * float ulps over sums of at most 64 terms.
 *
 * Clamped SwiGLU: hp_glu_clamp_fwd/bwd element for element against the
 * formula in double, inputs spread over [-3 limit, 3 limit] so that both
 * clamps bind on both sides, both strides (separate gate and up, [gate |
 * up] rows); the gradient where a clamp binds is exactly 0.  Tolerance
 * 1e-5 relative to the larger of the value and 1 (float arithmetic
 * against double, a few ulps of factors up to limit + 1).  Central
 * differences in double (step 1e-6, away from the kinks) confirm the
 * hand-written derivative within 1e-6.
 *
 * Grouped biases: hp_bias_grouped_fwd/bwd against a loop over experts.
 *
 * Checkpoint layout (lib/model/params.c): a layer's MXFP4 blocks and
 * scales written to a safetensors file, found by hp_stacked_find and
 * decoded by hp_mxfp4_rows, row and column slices of gate, up and down
 * against the format's definition written out here (code k of
 * +-{0, .5, 1, 1.5, 2, 3, 4, 6}, low nibble first, times 2^(scale - 127),
 * gate and up interleaved by row, the decoded matrix transposed), and
 * refused by name where a row is not whole blocks of 32 or a shape is off.
 */
#include <math.h>

#include <unistd.h>

#include "config/hfconfig.h"
#include "cpu/ops.h"
#include "format/safetensors.h"
#include "model/params.h"
#include "tap.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;

static double urand(void)
{
	return tap_urand(&rng);
}

static float randn(void)
{
	return (float)(sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand()));
}

static float *fill(size_t n, double scale)
{
	float *p = malloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		p[i] = (float)(scale * randn());
	return p;
}

/* HF's eager attention with sinks and its backward, in double; seg as the
 * kernels' (NULL: one document per row). */
static void sinks_ref(double *out, double *dq, double *dk, double *dv, double *dsink, const float *q,
		      const float *k, const float *v, const float *dout, const float *sinks, const int32_t *seg,
		      int B, int T, int H, int Hkv, int D)
{
	int group = H / Hkv;
	double scale = 1.0 / sqrt((double)D), *p = malloc((size_t)T * sizeof(double));
	long qs = (long)H * D, ks = (long)Hkv * D;

	memset(dk, 0, sizeof(double) * (size_t)B * T * ks);
	memset(dv, 0, sizeof(double) * (size_t)B * T * ks);
	memset(dsink, 0, sizeof(double) * (size_t)H);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < H; h++)
			for (int i = 0; i < T; i++) {
				int j0 = seg ? seg[(long)b * T + i] : 0, kh = h / group;
				const float *qi = q + ((long)b * T + i) * qs + (long)h * D;
				const float *doi = dout + ((long)b * T + i) * qs + (long)h * D;
				double mx = sinks[h], sum, ps, rs = 0;

				for (int j = j0; j <= i; j++) {
					double s = 0;
					for (int d = 0; d < D; d++)
						s += (double)qi[d] * k[((long)b * T + j) * ks + (long)kh * D + d];
					p[j] = s * scale;
					mx = p[j] > mx ? p[j] : mx;
				}
				sum = exp(sinks[h] - mx);
				for (int j = j0; j <= i; j++)
					sum += (p[j] = exp(p[j] - mx));
				ps = exp(sinks[h] - mx) / sum;
				for (int j = j0; j <= i; j++)
					p[j] /= sum;
				double *oi = out + ((long)b * T + i) * qs + (long)h * D;
				for (int d = 0; d < D; d++) {
					oi[d] = 0;
					for (int j = j0; j <= i; j++)
						oi[d] += p[j] * v[((long)b * T + j) * ks + (long)kh * D + d];
				}
				/* backward */
				double *dpj = malloc((size_t)T * sizeof(double));
				for (int j = j0; j <= i; j++) {
					dpj[j] = 0;
					for (int d = 0; d < D; d++)
						dpj[j] += (double)doi[d] * v[((long)b * T + j) * ks + (long)kh * D + d];
					rs += p[j] * dpj[j];
				}
				dsink[h] += -ps * rs;
				double *dqi = dq + ((long)b * T + i) * qs + (long)h * D;
				for (int d = 0; d < D; d++)
					dqi[d] = 0;
				for (int j = j0; j <= i; j++) {
					double ds = p[j] * (dpj[j] - rs) * scale;
					for (int d = 0; d < D; d++) {
						long kj = ((long)b * T + j) * ks + (long)kh * D + d;
						dqi[d] += ds * k[kj];
						dk[kj] += ds * qi[d];
						dv[kj] += p[j] * doi[d];
					}
				}
				free(dpj);
			}
	free(p);
}

static double rel_l2d(const float *got, const double *want, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		num += (got[i] - want[i]) * (got[i] - want[i]);
		den += want[i] * want[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check_sinks(int B, int T, int H, int Hkv, int D, int packed, double sink_scale)
{
	size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D;
	float *q = fill(nq, 1), *k = fill(nk, 1), *v = fill(nk, 1), *dout = fill(nq, 1);
	float *sinks = fill((size_t)H, sink_scale), *out = malloc(nq * sizeof(float));
	float *lse = malloc((size_t)B * H * T * sizeof(float)), *dq = malloc(nq * sizeof(float));
	float *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float));
	float *ds = calloc((size_t)H, sizeof(float)), scratch[1];
	double *ro = malloc(nq * sizeof(double)), *rdq = malloc(nq * sizeof(double));
	double *rdk = malloc(nk * sizeof(double)), *rdv = malloc(nk * sizeof(double)), *rds = malloc((size_t)H * sizeof(double));
	int32_t *seg = NULL;

	if (packed) {   /* documents of 5, 9, ... tokens */
		seg = malloc((size_t)B * T * sizeof(int32_t));
		for (int b = 0; b < B; b++)
			for (int t = 0, start = 0, len = 5 + 4 * b; t < T; t++) {
				if (t - start == len) {
					start = t;
					len += 4;
				}
				seg[(long)b * T + t] = start;
			}
	}
	hp_flash_attention_fwd(out, lse, q, k, v, seg, B, T, H, Hkv, D);
	hp_attn_sinks_fwd(out, lse, sinks, B, T, H, D);
	hp_attn_sinks_bwd(ds, dout, out, lse, sinks, B, T, H, D);
	hp_flash_attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, seg, scratch, B, T, H, Hkv, D);
	sinks_ref(ro, rdq, rdk, rdv, rds, q, k, v, dout, sinks, seg, B, T, H, Hkv, D);
	double eo = rel_l2d(out, ro, nq), eq = rel_l2d(dq, rdq, nq), ek = rel_l2d(dk, rdk, nk);
	double ev = rel_l2d(dv, rdv, nk), es = rel_l2d(ds, rds, (size_t)H);
	tap_ok(eo < 1e-5 && eq < 1e-5 && ek < 1e-5 && ev < 1e-5 && es < 1e-5,
	       "sinks B=%d T=%d H=%d/%d D=%d%s sinks*%g: out %.1e dq %.1e dk %.1e dv %.1e dsinks %.1e", B, T, H,
	       Hkv, D, packed ? " packed" : "", sink_scale, eo, eq, ek, ev, es);
	free(q), free(k), free(v), free(dout), free(sinks), free(out), free(lse), free(dq), free(dk), free(dv);
	free(ds), free(ro), free(rdq), free(rdk), free(rdv), free(rds), free(seg);
}

static double glu_def(double g, double u, double alpha, double limit)
{
	double gc = g < limit ? g : limit, uc = u < -limit ? -limit : u > limit ? limit : u;
	return (uc + 1) * gc / (1 + exp(-alpha * gc));
}

static void check_glu(long ld_mode, float alpha, float limit)
{
	const long rows = 37;
	const int I = 29;
	long ld = ld_mode ? 2 * I : I;
	size_t n = (size_t)rows * (size_t)ld;
	float *g = malloc(n * sizeof(float)), *u, *h = malloc((size_t)rows * I * sizeof(float));
	float *dh = fill((size_t)rows * I, 1), *dg = malloc(n * sizeof(float)), *du;
	float *gbuf = NULL, *ubuf = NULL;
	double eh = 0, eg = 0, eu = 0, efd = 0;
	int clamped_g = 0, clamped_u = 0, zero_ok = 1;

	for (size_t i = 0; i < n; i++)
		g[i] = (float)(3 * limit * (2 * urand() - 1));
	if (ld_mode) {
		u = g + I;
		du = dg + I;
	} else {
		ubuf = malloc(n * sizeof(float));
		gbuf = malloc(n * sizeof(float));
		for (size_t i = 0; i < n; i++)
			ubuf[i] = (float)(3 * limit * (2 * urand() - 1));
		u = ubuf;
		du = gbuf;
	}
	hp_glu_clamp_fwd(h, g, u, ld, rows, I, alpha, limit);
	hp_glu_clamp_bwd(dg, du, dh, g, u, ld, rows, I, alpha, limit);
	for (long r = 0; r < rows; r++)
		for (int i = 0; i < I; i++) {
			double gv = g[r * ld + i], uv = u[r * ld + i], eps = 1e-6;
			double want = glu_def(gv, uv, alpha, limit), d = dh[r * I + i];
			double fg = (glu_def(gv + eps, uv, alpha, limit) - glu_def(gv - eps, uv, alpha, limit)) / (2 * eps);
			double fu = (glu_def(gv, uv + eps, alpha, limit) - glu_def(gv, uv - eps, alpha, limit)) / (2 * eps);
			/* the derivative by hand, in double */
			double gc = gv < limit ? gv : limit, uc = uv < -limit ? -limit : uv > limit ? limit : uv;
			double sg = 1 / (1 + exp(-alpha * gc));
			double ag = gv <= limit ? (uc + 1) * (sg + gc * alpha * sg * (1 - sg)) : 0;
			double au = uv >= -limit && uv <= limit ? gc * sg : 0;
			double e1 = fabs(h[r * I + i] - want) / (fabs(want) + 1e-6);

			eh = e1 > eh ? e1 : eh;
			/* float against double: a few ulps of the larger factor */
			e1 = fabs(dg[r * ld + i] - d * ag) / (fabs(d) * (fabs(ag) + 1) + 1e-30);
			eg = e1 > eg ? e1 : eg;
			e1 = fabs(du[r * ld + i] - d * au) / (fabs(d) * (fabs(au) + 1) + 1e-30);
			eu = e1 > eu ? e1 : eu;
			/* central differences away from the kinks confirm the hand's derivative */
			if (fabs(gv - limit) > 1e-3 && fabs(fabs(uv) - limit) > 1e-3) {
				e1 = fabs(fg - ag) / (fabs(ag) + 1) + fabs(fu - au) / (fabs(au) + 1);
				efd = e1 > efd ? e1 : efd;
			}
			if (gv > limit) {
				clamped_g++;
				zero_ok &= dg[r * ld + i] == 0.0f;
			}
			if (uv > limit || uv < -limit) {
				clamped_u++;
				zero_ok &= du[r * ld + i] == 0.0f;
			}
		}
	tap_ok(eh < 1e-5 && eg < 1e-5 && eu < 1e-5 && efd < 1e-6 && zero_ok && clamped_g > 0 && clamped_u > 0,
	       "clamped SwiGLU %s alpha %g limit %g: h %.1e, dgate %.1e, dup %.1e (central differences %.1e); "
	       "%d gate and %d up entries clamped, their gradients exactly 0", ld_mode ? "[gate|up] rows" :
	       "separate", alpha, limit, eh, eg, eu, efd, clamped_g, clamped_u);
	free(g), free(h), free(dh), free(dg), free(ubuf), free(gbuf);
}

static void check_bias(int n, long ld, size_t bs)
{
	int32_t off[5] = { 0, 3, 3, 10, 12 };
	const int nx = 4;
	float *x = fill((size_t)12 * ld, 1), *x0 = malloc((size_t)12 * ld * sizeof(float));
	float *bias = fill(bs * nx, 1), *db = calloc(bs * nx, sizeof(float)), *dx = fill((size_t)12 * ld, 1);
	int ok = 1;

	memcpy(x0, x, (size_t)12 * ld * sizeof(float));
	hp_bias_grouped_fwd(x, ld, bias, bs, off, nx, n);
	hp_bias_grouped_bwd(db, bs, dx, ld, off, nx, n);
	for (int e = 0; e < nx; e++)
		for (int j = 0; j < (int)bs; j++) {
			double s = 0;
			for (long r = off[e]; r < off[e + 1]; r++) {
				if (j < n)
					s += dx[r * ld + j];
				if (j < (int)ld)
					ok &= x[r * ld + j] == x0[r * ld + j] + (j < n ? bias[e * bs + (size_t)j] : 0.0f);
			}
			ok &= fabs(db[e * bs + (size_t)j] - s) <= 1e-6 * (fabs(s) + 1);
		}
	tap_ok(ok, "grouped biases: each expert's rows get its bias on the first %d of %ld columns; the backward's "
	       "column sums, an empty expert's too", n, ld);
	free(x), free(x0), free(bias), free(db), free(dx);
}

/* The value transformers decodes at (row j, column k) of a [R, K] MXFP4 matrix. */
static float mx_ref(const uint8_t *blocks, const uint8_t *scales, int64_t K, int64_t j, int64_t k)
{
	static const float code[8] = { 0, 0.5f, 1, 1.5f, 2, 3, 4, 6 };
	uint8_t b = blocks[(j * K + k) / 2], nib = k % 2 ? b >> 4 : b & 15;

	return (nib & 8 ? -1.0f : 1.0f) * code[nib & 7] * exp2f((float)scales[(j * K + k) / 32] - 127);
}

/* A gpt_oss config of hidden C, intermediate Im and E experts. */
static int oss_spec(struct hp_model_spec *s, int C, int Im, int E)
{
	char buf[1024];
	struct hp_err e;

	snprintf(buf, sizeof(buf), "{\"model_type\": \"gpt_oss\", \"hidden_size\": %d, \"intermediate_size\": %d, "
		 "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16, "
		 "\"vocab_size\": 64, \"num_local_experts\": %d, \"num_experts_per_tok\": 1, "
		 "\"rope_scaling\": {\"rope_type\": \"default\"}}", C, Im, E);
	return hp_hfconfig_load_buf(s, "oss", buf, strlen(buf), &e);
}

static void check_mxfp4(void)
{
	const int C = 64, Im = 32, E = 3;
	char path[] = "/tmp/test-oss-XXXXXX";
	int fd = mkstemp(path);
	struct hp_model_spec sp;
	struct hp_st_model st;
	struct hp_err e;
	/* gate_up: blocks [E, 2 Im, C / 32, 16], down: [E, C, Im / 32, 16] */
	size_t ngu = (size_t)E * 2 * Im * C / 2, nd = (size_t)E * C * Im / 2;
	uint8_t *gu = malloc(ngu), *gus = malloc(ngu / 16), *dn = malloc(nd), *dns = malloc(nd / 16);
	int ok = fd >= 0 && !oss_spec(&sp, C, Im, E), bad = 0;

	for (size_t i = 0; i < ngu; i++)
		gu[i] = (uint8_t)(urand() * 256);
	for (size_t i = 0; i < nd; i++)
		dn[i] = (uint8_t)(urand() * 256);
	for (size_t i = 0; i < ngu / 16; i++)
		gus[i] = (uint8_t)(120 + urand() * 10);
	for (size_t i = 0; i < nd / 16; i++)
		dns[i] = (uint8_t)(120 + urand() * 10);
	struct hp_st_entry ent[4] = {
		{ "model.layers.0.mlp.experts.gate_up_proj_blocks", HP_DTYPE_U8, 4, { E, 2 * Im, C / 32, 16 }, gu },
		{ "model.layers.0.mlp.experts.gate_up_proj_scales", HP_DTYPE_U8, 3, { E, 2 * Im, C / 32 }, gus },
		{ "model.layers.0.mlp.experts.down_proj_blocks", HP_DTYPE_U8, 4, { E, C, Im / 32, 16 }, dn },
		{ "model.layers.0.mlp.experts.down_proj_scales", HP_DTYPE_U8, 3, { E, C, Im / 32 }, dns },
	};
	ok = ok && !hp_st_write(path, 4, ent, 0, NULL, NULL, &e) && !hp_st_model_open(&st, path, &e);
	/* every part of expert 1, a slice of rows and columns, against the definition */
	static const char *const names[3] = { "gate", "up", "down" };
	for (int part = 0; ok && part < 3; part++) {
		char name[96];
		struct hp_stacked_view v;
		const struct hp_st_tensor *t, *sc;
		int64_t rows = part < 2 ? Im : C, cols = part < 2 ? C : Im, r0 = 3, nr = rows - 5, c0 = 7, nc = cols - 9;
		float *got = malloc((size_t)(nr * nc) * sizeof(float));
		void *buf;

		snprintf(name, sizeof(name), "model.layers.0.mlp.experts.1.%s_proj.weight", names[part]);
		ok = hp_param_stacked(&sp, name, &v) && !hp_stacked_find(&st, &v, E, path, &t, &sc, &e) && sc &&
		     (buf = malloc(hp_mxfp4_buf_bytes(&v))) &&
		     !hp_mxfp4_rows(&v, t, sc, r0, nr, c0, nc, got, buf, &e);
		for (int64_t r = 0; ok && r < nr; r++)
			for (int64_t c = 0; c < nc; c++) {
				/* param (r, c) = transformers' [E, K, R] at (x, c, j) = decoded (j, c) */
				int64_t j = part < 2 ? 2 * (r0 + r) + part : r0 + r, K = part < 2 ? C : Im;
				const uint8_t *b = part < 2 ? gu : dn, *s = part < 2 ? gus : dns;
				int64_t R = part < 2 ? 2 * Im : C;

				bad += got[r * nc + c] != mx_ref(b, s, K, R + j, c0 + c);   /* expert 1: rows R.. */
			}
		free(got);
		if (ok)
			free(buf);
	}
	tap_ok(ok && !bad, "MXFP4: gate, up and down of expert 1 (rows 3.., columns 7..) decoded as transformers "
	       "does, bit for bit (%d differ)", bad);
	/* an intermediate of 48 (rows of down are not whole blocks) and shapes off: refused */
	struct hp_stacked_view v;
	const struct hp_st_tensor *t, *sc;
	int r1 = -1, r2 = -1;
	if (ok && !oss_spec(&sp, C, 48, E) && hp_param_stacked(&sp, "model.layers.0.mlp.experts.0.down_proj.weight", &v))
		r1 = hp_stacked_find(&st, &v, E, path, &t, &sc, &e);
	int named1 = r1 == HP_EFORMAT && strstr(e.msg, "rows of 48 values, not a multiple of 32") != NULL;
	if (ok && !oss_spec(&sp, C, 64, E) && hp_param_stacked(&sp, "model.layers.0.mlp.experts.0.gate_proj.weight", &v))
		r2 = hp_stacked_find(&st, &v, E, path, &t, &sc, &e);
	int named2 = r2 == HP_EFORMAT && strstr(e.msg, "gate_up_proj_blocks' and") != NULL;
	tap_ok(named1 && named2, "MXFP4 refused by name: rows of 48 values (%d), blocks for another intermediate "
	       "size (%d)", r1, r2);
	if (ok)
		hp_st_model_close(&st);
	unlink(path);
	free(gu), free(gus), free(dn), free(dns);
}

int main(void)
{
	check_sinks(2, 33, 4, 2, 16, 0, 1);
	check_sinks(2, 64, 4, 4, 32, 1, 1);
	check_sinks(1, 70, 2, 1, 64, 0, 4);
	check_sinks(2, 40, 4, 2, 16, 1, 0.01);
	check_glu(0, 1.702f, 7.0f);
	check_glu(1, 1.702f, 0.5f);
	check_glu(0, 0.7f, 2.0f);
	check_bias(6, 9, 20);
	check_bias(300, 310, 333);   /* wider than the backward's block of 256 columns */
	check_mxfp4();
	return tap_done();
}
