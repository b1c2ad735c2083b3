/*
 * test-optim.c - AdamW and gradient clipping against torch, bit for bit.
 *
 * The golden t/golden/adamw.txt comes from torch.optim.AdamW and
 * torch.nn.utils.clip_grad_norm_ (regenerate: /usr/bin/python3
 * t/golden/make-goldens.py).  AdamW must agree in every bit for five steps
 * with and without weight decay (hp's AdamW is written to do torch's
 * float operations in torch's order, at every CPU level).  Clipping: torch
 * takes the float norm of per-tensor float norms, hp one double sum, so
 * they agree within the rounding of torch's norm, bounded below.  Also the
 * LR schedules, in double.
 */
#include <math.h>

#include "model/model.h"
#include "dist/optim.h"
#include "tap.h"

#define MAXN 64

struct row { char key[16]; int n; float v[MAXN]; };

static int read_row(FILE *f, struct row *r, char *head, size_t headn)
{
	char line[4096];

	while (fgets(line, sizeof(line), f)) {
		if (line[0] == '#')
			continue;
		if (!strncmp(line, "adamw", 5) || !strncmp(line, "clip", 4)) {
			snprintf(head, headn, "%s", line);
			r->key[0] = '\0';
			r->n = 0;
			return 1;
		}
		char *p = line, *end;
		int k = 0;
		while (*p && *p != ' ' && k < 15)
			r->key[k++] = *p++;
		r->key[k] = '\0';
		r->n = 0;
		for (;;) {
			unsigned long u = strtoul(p, &end, 16);
			if (end == p || r->n >= MAXN)
				break;
			uint32_t b = (uint32_t)u;
			memcpy(&r->v[r->n++], &b, 4);
			p = end;
		}
		return 1;
	}
	return 0;
}

static int same_bits(const float *a, const float *b, int n)
{
	return !memcmp(a, b, (size_t)n * sizeof(float));
}

static void test_golden(const char *path)
{
	FILE *f = fopen(path, "r");
	struct row r;
	char head[256] = "";
	float w[MAXN], m[MAXN], v[MAXN], g[MAXN];
	int n = 0, step = 0, adam_ok = 1, nsteps = 0;
	struct hp_adamw_hparams h = { .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8 };

	if (!ok(f != NULL, "golden '%s' opens", path))
		return;
	while (read_row(f, &r, head, sizeof(head))) {
		if (!r.key[0] && !strncmp(head, "adamw", 5)) {
			const char *wd = strstr(head, " wd ");
			h.weight_decay = wd ? strtod(wd + 4, NULL) : 0;
			step = 0;
			memset(m, 0, sizeof(m));
			memset(v, 0, sizeof(v));
			continue;
		}
		if (!r.key[0] && !strncmp(head, "clip", 4))
			break;
		if (!strcmp(r.key, "w0")) {
			n = r.n;
			memcpy(w, r.v, sizeof(float) * n);
		} else if (r.key[0] == 'g') {
			memcpy(g, r.v, sizeof(float) * n);
			h.step = ++step;
			hp_adamw_step(w, g, m, v, (size_t)n, &h, h.weight_decay != 0);
			nsteps++;
		} else if (r.key[0] == 'w') {
			adam_ok &= same_bits(w, r.v, n);
		} else if (r.key[0] == 'm') {
			adam_ok &= same_bits(m, r.v, n);
		} else if (r.key[0] == 'v') {
			adam_ok &= same_bits(v, r.v, n);
		}
	}
	ok(adam_ok && nsteps == 10, "AdamW matches torch.optim.AdamW bit for bit (%d steps, with and without decay)",
	   nsteps);

	/* clip_grad_norm_ */
	struct row ga, gb, nrm, ca, cb;
	read_row(f, &ga, head, sizeof(head));
	read_row(f, &gb, head, sizeof(head));
	read_row(f, &nrm, head, sizeof(head));
	read_row(f, &ca, head, sizeof(head));
	read_row(f, &cb, head, sizeof(head));
	fclose(f);
	float flat[32];
	struct hp_err e;
	memcpy(flat, ga.v, sizeof(float) * ga.n);
	memcpy(flat + ga.n, gb.v, sizeof(float) * gb.n);
	/* a store of the two tensors, as the model's flat arrays make one */
	struct hp_optim o = { .max_grad_norm = 1.0,
			      .s = { .bk = hp_backend_cpu(), .g = flat, .total = (size_t)(ga.n + gb.n) } };
	hp_store_add_run(&o.s.norm, &o.s.nnorm, 0, o.s.total, 0, &e);
	/*
	 * hp's norm is a double sum of float squares: exact to float
	 * precision.  torch's is float: a tensor's sum of n squares is within
	 * gamma_n (n u, u = 2^-24) of its sum of squares and its sqrt halves
	 * that and rounds once, (n/2 + 1) u = 4.5 u for the 7 elements of ga;
	 * the norm of the two norms squares them (doubling that), sums two
	 * and takes the sqrt: (9 + 2)/2 + 1 = 6.5 u.  So 8 u relative.
	 */
	double norm, ss = 0;   /* the CPU backend's memory is the host's */
	hp_optim_grad_sumsq(&o, &ss, &e);
	norm = sqrt(ss);
	ok(fabs(norm - nrm.v[0]) <= 8 * TAP_U * nrm.v[0], "global grad norm matches clip_grad_norm_ (%.9g vs %.9g)",
	   norm, nrm.v[0]);
	/*
	 * Each clipped element is one product g * coef on each side, so it is
	 * relative to itself (no sum, no cancellation): torch's coef =
	 * max_norm / (norm + 1e-6) in float carries its norm's 6.5 u and two
	 * roundings, hp's one rounding of a double quotient; with each side's
	 * product that is 8.5 + 1 + 2 = 11.5 u, so 12 u.
	 */
	hp_optim_clip(&o, norm);
	int clip_ok = 1;
	for (int i = 0; i < ga.n; i++)
		clip_ok &= fabsf(flat[i] - ca.v[i]) <= 12 * TAP_U * fabsf(ca.v[i]);
	for (int i = 0; i < gb.n; i++)
		clip_ok &= fabsf(flat[ga.n + i] - cb.v[i]) <= 12 * TAP_U * fabsf(cb.v[i]);
	ok(clip_ok, "clipped gradients match clip_grad_norm_ within torch's rounding of the coefficient (12 u)");
	hp_store_free(&o.s);
}

/*
 * The schedules are a few double operations on values up to lr_max (and a
 * cos, within an ulp): each rounds by at most 2^-53 of lr_max, as does the
 * expected value's own arithmetic, so 16 of those covers both sides -
 * 1.8e-18, where a wrong step or ratio is off by at least lr_max / 100.
 */
static int lr_is(double got, double want, double lr_max)
{
	return fabs(got - want) <= 16 * 0x1p-53 * lr_max;
}

static void test_schedules(void)
{
	struct hp_optim o = { .lr_max = 1e-3, .lr_min = 1e-4, .warmup = 10, .total = 110 };

	o.style = HP_LR_CONSTANT;
	ok(hp_lr_at(&o, 1) == 1e-4 && hp_lr_at(&o, 10) == 1e-3 && hp_lr_at(&o, 50) == 1e-3,
	   "constant schedule with linear warmup (lr_max * s / warmup)");
	o.style = HP_LR_LINEAR;
	ok(lr_is(hp_lr_at(&o, 60), 5.5e-4, o.lr_max) && lr_is(hp_lr_at(&o, 110), 1e-4, o.lr_max),
	   "linear decay reaches min_lr at train_iters");
	o.style = HP_LR_COSINE;
	ok(lr_is(hp_lr_at(&o, 60), 5.5e-4, o.lr_max) && lr_is(hp_lr_at(&o, 110), 1e-4, o.lr_max) &&
	   lr_is(hp_lr_at(&o, 11), 1e-4 + 9e-4 * 0.5 * (1 + cos(M_PI / 100)), o.lr_max),
	   "cosine decay: half-way at the midpoint, min_lr at the end");
	o.warmup = 0;
	ok(lr_is(hp_lr_at(&o, 1), 1e-4 + 9e-4 * 0.5 * (1 + cos(M_PI / 110)), o.lr_max),
	   "no warmup starts at lr_max: step 1 is the first of the decay");
}

int main(void)
{
	const char *src = getenv("HP_SRC_DIR");
	char path[4096];

	snprintf(path, sizeof(path), "%s/t/golden/adamw.txt", src ? src : ".");
	test_golden(path);
	test_schedules();
	return tap_done();
}
