/*
 * kernels.h - the kernel registry: one row per (op, backend, variant) that
 * hp has, and everything that needs to know about kernels reads it:
 *   - plan binding (lib/plan/plan.c): a plan_overrides _target_ is looked up
 *     by name or HyperParallel alias (hp_kernel_find_target), and the row's
 *     supports() decides whether it may run the matched module;
 *   - hp-train --list-kernels (hp_kernels_print);
 *   - the op x backend test (t/unit/test-kernels.c walks every row: a CPU
 *     row's functions against its op's reference row's, a CUDA row's
 *     functions looked up in kernels/cuda/ops.h);
 *   - hp-kernels(7), whose KERNELS entries t/t0400-man.sh holds to the rows,
 *     one for one and in order.
 *
 * The registry is not what the model calls: the model runs its op table
 * (kernels/cpu/ops.h, hp_cpu_ops_get) and its backend's slots
 * (backend/backend.h) with the per-layer choices the plan makes
 * (struct hp_model_kernels).  A row says which functions those are, so that
 * the test runs exactly what a run runs.
 *
 * Rows are constant data with static storage; nothing here allocates.
 */
#ifndef HP_KERNELS_H
#define HP_KERNELS_H

#include <stddef.h>
#include <stdio.h>

#include "cpu/ops.h"

/* What a kernel's supports() sees of the module a plan would bind it to. */
struct hp_kernel_site {
	const char *module;      /* "model.layers.3.self_attn" */
	int layer;               /* its decoder layer, or -1 */
	int head_dim;            /* the model's */
	int moe;                 /* the module sits in an MoE layer */
};

/*
 * The CPU functions a row runs, by the form of its signature (a row fills
 * one form, or none where the op is a composition the model makes, such as
 * the experts' loop; those are covered by the model's tests).  The test
 * compares a row against its op's reference row form by form: "attention"
 * (saves P) and "flash" (saves the log-sum-exp) are two forms of one op,
 * as are "rmsnorm" and "rmsnorm_res" (the residual add fused in front).
 */
struct hp_kernel_cpu {
	void (*embedding_fwd)(float *out, const int32_t *ids, const float *table, long N, int C);
	void (*embedding_bwd)(float *dtable, const float *dout, const int32_t *ids, long N, int C, int pad);
	hp_linear_fwd_fn *linear_fwd;
	hp_linear_bwd_fn *linear_bwd;
	hp_attention_fwd_fn *attention_fwd;
	hp_attention_bwd_fn *attention_bwd;
	void (*flash_fwd)(float *out, float *lse, const float *q, const float *k, const float *v,
			  const int32_t *seg, int B, int T, int n_heads, int n_kv_heads, int head_dim);
	void (*flash_bwd)(float *dq, float *dk, float *dv, const float *dout, const float *out,
			  const float *lse, const float *q, const float *k, const float *v,
			  const int32_t *seg, float *scratch, int B, int T, int n_heads,
			  int n_kv_heads, int head_dim);
	void (*rmsnorm_fwd)(float *y, float *rstd, const float *x, const float *w, long N, int C, float eps);
	void (*rmsnorm_res_fwd)(float *h, float *y, float *rstd, const float *a, const float *b,
				const float *w, long N, int C, float eps);
	void (*rmsnorm_bwd)(float *dx, float *dw, const float *dy, const float *x, const float *w,
			    const float *rstd, long N, int C, int accumulate);
	void (*rope_fwd)(float *x, const int32_t *pos, const float *cos_t, const float *sin_t,
			 long N, int n_heads, int ld, int Dr, int inter);
	void (*rope_bwd)(float *dx, const int32_t *pos, const float *cos_t, const float *sin_t,
			 long N, int n_heads, int ld, int Dr, int inter);
	hp_swiglu_fwd_fn *swiglu_fwd;
	hp_swiglu_bwd_fn *swiglu_bwd;
	void (*router_fwd)(float *probs, int32_t *sel, float *wsel, long N, int E, int K, int norm);
	void (*router_bwd)(float *dprob, const float *probs, const int32_t *sel, const float *wsel,
			   const float *dwsel, const double *aux, double aux_grad, long N, int E, int K, int norm);
	hp_cross_entropy_fwd_fn *cross_entropy_fwd;
	hp_cross_entropy_bwd_fn *cross_entropy_bwd;
	void (*adamw)(float *w, const float *g, float *m, float *v, size_t n,
		      const struct hp_adamw_hparams *h, int decay);
};

#define HP_KERNEL_ALIASES 3

struct hp_kernel {
	const char *op;        /* "attention"; a module's "reference.<op>" */
	const char *backend;   /* "cpu", "cuda" */
	const char *name;      /* the kernel; plan_overrides names for substitutes */
	const char *status;    /* "reference", "default", "substitute", "built", "planned" */
	const char *how;       /* how a run gets it (--list-kernels' last column) */
	/* plan_overrides may bind it by name or by one of these aliases
	 * (HyperParallel's replace_module._target_ factories, both spellings
	 * of their module path) */
	int overridable;
	const char *alias[HP_KERNEL_ALIASES];
	/* NULL: every module of the op; else 1 when the kernel can run the
	 * module, or 0 with why (one clause, no final period) in why[n] */
	int (*supports)(const struct hp_kernel_site *s, char *why, size_t n);
	struct hp_kernel_cpu cpu;   /* cpu rows */
	const char *cuda;      /* cuda rows: the kernels/cuda/ops.h functions it runs,
				  space-separated */
};

extern const struct hp_kernel hp_kernels[];
extern const int hp_nkernels;

/* The row plan_overrides' _target_ target names (a kernel's name or an
 * alias; overridable rows only), or NULL. */
const struct hp_kernel *hp_kernel_find_target(const char *target);

/* The row of this (op, backend, name), or NULL. */
const struct hp_kernel *hp_kernel_find(const char *op, const char *backend, const char *name);

/* Every name a _target_ may give, as the refusal of an unknown one lists
 * them: "a, b, c" into buf[n] (cut short if n is too small). */
void hp_kernel_targets(char *buf, size_t n);

/* The table as hp-train --list-kernels prints it. */
void hp_kernels_print(FILE *f);

#endif
