/*
 * gpu-bench.c - the CUDA backend's benchmark.
 *
 *   gpu-bench [--layers N] [--seq T] [--steps S] [--model-only] CONFIG.json
 *
 * 1. GEMMs: hp_cuda_linear_fwd (bf16 operands, fp32 output) against
 *    cublasGemmEx with the same shapes, types and stream, measured in the
 *    same run (target >= 0.90).
 * 2. Flash attention forward and backward TFLOP/s at B=1, T, 32 heads,
 *    4 KV heads, head_dim 128 (causal: forward 2*T*T*Hq*D flops,
 *    backward 2.5x that), and the gated delta rule's (gdn.cu) at
 *    Qwen3-Next's heads, GFLOP/s in fp32.  --model-only skips 1 and 2.
 * 3. The model of CONFIG (a Qwen3-30B-A3B-shaped config.json by default)
 *    on the CUDA backend (lib/backend/backend_cuda.c, lib/model/model.c's one
 *    orchestration), one sequence of T tokens: forward + backward + grad
 *    norm and clipping + AdamW step, as hp-train's single-process loop
 *    (lib/train/train.c) runs them, tokens/s and MFU against 989 TFLOP/s
 *    (H100/H200 dense bf16).  Model flops per token: 6 * (active matmul
 *    parameters, LM head included) + 6 * layers * T * Hq * D (causal
 *    attention, forward and backward).  Kernels: flash attention (the
 *    backend's only one), grouped experts, the LM head and loss in chunks
 *    of 1024 tokens.
 *    Layers: --layers, else as many as fit, from a measurement: a 1-layer
 *    and a 2-layer model each run one step, and the device memory each
 *    used (hp_cuda_mem_info before and after) gives a fixed part and a
 *    part per layer; the layers that fit in the free memory less 2 GiB of
 *    headroom are run, at most the config's, and at most what 80% of the
 *    host's memory holds (the model keeps host copies of the weights,
 *    gradients and moments: 16 bytes a parameter).
 *    Then per step: host syncs and launches (the backend's counts), the
 *    device's peak as the backend counts it beside what the device lost
 *    of its free memory (cudaMemGetInfo), and one more step profiled
 *    (hp_backend.profile): the share of the compute stream's time per
 *    kernel family.
 * Weights are a cheap deterministic pattern, not trained values: the
 * router still spreads tokens over experts.  Prints one line per result;
 * exit 0, or 1 on a CUDA error, 77 without a GPU.
 *
 * HP_CUDA_EMULATE=exact|bf16 runs part 3 alone on the backend's host
 * emulation (no GPU needed; a smoke test of this program with a small
 * config and --layers).
 */
#include <math.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cuda/ops.h"
#include "config/hfconfig.h"
#include "model/model.h"
#include "dist/optim.h"

#define PEAK 989e12
#define GIB 1073741824.0
#define HEADROOM (2.0 * GIB)    /* device memory left for what a step grows beyond the measured one */
#define CE_CHUNK 1024

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, const struct hp_err *e)
{
	fprintf(stderr, "gpu-bench: %s: %s\n", what, e ? e->msg : "");
	exit(1);
}

/* mean seconds of body over reps after a warm-up, timed with events on the stream */
#define TIME(reps, secs, body) do { \
	cudaEvent_t a_, b_; float ms_; \
	body; \
	cudaEventCreate(&a_); cudaEventCreate(&b_); \
	cudaEventRecord(a_, (cudaStream_t)hp_cuda_stream()); \
	for (int r_ = 0; r_ < (reps); r_++) { body; } \
	cudaEventRecord(b_, (cudaStream_t)hp_cuda_stream()); \
	cudaEventSynchronize(b_); cudaEventElapsedTime(&ms_, a_, b_); \
	(secs) = ms_ * 1e-3 / (reps); \
	cudaEventDestroy(a_); cudaEventDestroy(b_); } while (0)

static void bench_gemm(void)
{
	static const long shapes[][3] = {   /* N (tokens), K (in), O (out) */
		{ 8192, 8192, 8192 }, { 4096, 2048, 4096 }, { 4096, 4096, 2048 },
		{ 4096, 2048, 151936 }, { 2048, 2048, 1536 }, { 2048, 768, 2048 },
	};
	struct hp_err e;
	cublasHandle_t h;

	cublasCreate(&h);
	cublasSetStream(h, (cudaStream_t)hp_cuda_stream());
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		long N = shapes[i][0], K = shapes[i][1], O = shapes[i][2];
		hp_bf16 *x = hp_cuda_alloc(sizeof(hp_bf16) * N * K, &e), *W = hp_cuda_alloc(sizeof(hp_bf16) * O * K, &e);
		float *y = hp_cuda_alloc(sizeof(float) * N * O, &e);
		float one = 1, zero = 0;
		double t_hp, t_cb, fl = 2.0 * N * K * O;

		if (!x || !W || !y)
			die("gemm buffers", &e);
		TIME(20, t_hp, if (hp_cuda_linear_fwd(y, x, W, NULL, N, (int)K, (int)O, &e)) die("linear", &e));
		/* row-major y[N,O] = x[N,K] W[O,K]^T is column-major y^T = W^T' x^T: op(A)=W^T of [K,O] col */
		TIME(20, t_cb, cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)O, (int)N, (int)K, &one, W, CUDA_R_16BF,
					    (int)K, x, CUDA_R_16BF, (int)K, &zero, y, CUDA_R_32F, (int)O,
					    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
		printf("gemm %ldx%ldx%ld (bf16 in, fp32 out)  hp %.1f TFLOP/s  cublas %.1f TFLOP/s  ratio %.3f\n",
		       N, K, O, fl / t_hp * 1e-12, fl / t_cb * 1e-12, t_cb / t_hp);
		hp_cuda_free(x);
		hp_cuda_free(W);
		hp_cuda_free(y);
	}
	cublasDestroy(h);
}

static void bench_flash(int T)
{
	int B = 1, Hq = 32, Hkv = 4, D = 128;
	long N = (long)B * T;
	struct hp_err e;
	hp_bf16 *q = hp_cuda_alloc(2 * N * Hq * D, &e), *k = hp_cuda_alloc(2 * N * Hkv * D, &e);
	hp_bf16 *v = hp_cuda_alloc(2 * N * Hkv * D, &e), *o = hp_cuda_alloc(2 * N * Hq * D, &e);
	hp_bf16 *dq = hp_cuda_alloc(2 * N * Hq * D, &e), *dk = hp_cuda_alloc(2 * N * Hkv * D, &e);
	hp_bf16 *dv = hp_cuda_alloc(2 * N * Hkv * D, &e);
	float *lse = hp_cuda_alloc(4 * N * Hq, &e), *sc = hp_cuda_alloc(4 * (hp_cuda_flash_scratch(B, T, Hq) + 1), &e);
	double tf, tb, fl = 2.0 * B * (double)T * T * Hq * D;

	if (!q || !k || !v || !o || !dq || !dk || !dv || !lse || !sc)
		die("flash buffers", &e);
	TIME(10, tf, hp_cuda_flash_fwd(o, lse, q, k, v, NULL, B, T, Hq, Hkv, D));
	TIME(10, tb, hp_cuda_flash_bwd(dq, dk, dv, o, o, lse, q, k, v, NULL, sc, B, T, Hq, Hkv, D));
	if (hp_cuda_sync(&e))
		die("flash", &e);
	printf("flash T=%d Hq=%d Hkv=%d D=%d  forward %.1f TFLOP/s  backward %.1f TFLOP/s\n", T, Hq, Hkv, D,
	       fl / tf * 1e-12, 2.5 * fl / tb * 1e-12);
	void *all[] = { q, k, v, o, dq, dk, dv, lse, sc };
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		hp_cuda_free(all[i]);
}

/* The gated delta rule (gdn.cu) at Qwen3-Next-80B's heads: B=1, T tokens,
 * 16 key and 32 value heads of 128.  Flops as the chunked algorithm does
 * them (hp_gdr_flops, test-deltanet --bench's count on the CPU), fp32 on
 * the CUDA cores, beside the bf16 GEMM peak the MFU is measured against. */
static void bench_gdr(int T)
{
	int B = 1, Hk = 16, Hv = 32, D = 128;
	long N = (long)B * T;
	size_t nq = (size_t)N * Hk * D, nv = (size_t)N * Hv * D, ng = (size_t)N * Hv, unit = hp_gdr_unit_floats(D, D);
	size_t ns = hp_gdr_saved_floats(B, T, Hv, D, D);
	struct hp_err e;
	float *q = hp_cuda_alloc(4 * nq, &e), *k = hp_cuda_alloc(4 * nq, &e), *v = hp_cuda_alloc(4 * nv, &e);
	float *g = hp_cuda_alloc(4 * ng, &e), *beta = hp_cuda_alloc(4 * ng, &e), *o = hp_cuda_alloc(4 * nv, &e);
	float *dq = hp_cuda_alloc(4 * nq, &e), *dk = hp_cuda_alloc(4 * nq, &e), *dv = hp_cuda_alloc(4 * nv, &e);
	float *dg = hp_cuda_alloc(4 * ng, &e), *db = hp_cuda_alloc(4 * ng, &e), *saved = hp_cuda_alloc(4 * ns, &e);
	float *ws = hp_cuda_alloc(4 * (size_t)B * Hv * unit, &e);
	float *h = malloc(4 * (nv > ng ? nv : ng));
	double tf, tb, ff, fb;
	float scale = (float)(1.0 / sqrt((double)D));

	hp_gdr_flops(B, T, Hv, D, D, &ff, &fb);

	if (!q || !k || !v || !g || !beta || !o || !dq || !dk || !dv || !dg || !db || !saved || !ws || !h)
		die("delta rule buffers", &e);
	/* unit-norm q and k (every value 1/sqrt(D)), v 0.5, g -0.1, beta 0.5; the
	 * backward's dout is the forward's output */
	for (size_t i = 0; i < nv; i++)
		h[i] = (float)(1.0 / sqrt((double)D));
	if (hp_cuda_upload(q, h, 4 * nq, &e) || hp_cuda_upload(k, h, 4 * nq, &e))
		die("delta rule inputs", &e);
	for (size_t i = 0; i < nv; i++)
		h[i] = 0.5f;
	if (hp_cuda_upload(v, h, 4 * nv, &e) || hp_cuda_upload(beta, h, 4 * ng, &e))
		die("delta rule inputs", &e);
	for (size_t i = 0; i < ng; i++)
		h[i] = -0.1f;
	if (hp_cuda_upload(g, h, 4 * ng, &e))
		die("delta rule inputs", &e);
	TIME(3, tf, hp_cuda_gdr_fwd(o, saved, q, k, v, g, beta, NULL, ws, unit, B, T, Hv, Hk, D, D, scale));
	TIME(3, tb, hp_cuda_gdr_bwd(dq, dk, dv, dg, db, o, saved, q, k, v, g, beta, NULL, ws, unit, B, T, Hv, Hk, D, D,
				    scale));
	if (hp_cuda_sync(&e))
		die("delta rule", &e);
	printf("gated delta rule T=%d Hk=%d Hv=%d D=%d  forward %.3f ms %.1f GFLOP/s  backward %.3f ms %.1f GFLOP/s "
	       "(fp32; the bf16 GEMM peak %.0f TFLOP/s)\n", T, Hk, Hv, D, tf * 1e3, ff / tf * 1e-9, tb * 1e3,
	       fb / tb * 1e-9, PEAK * 1e-12);
	void *all[] = { q, k, v, g, beta, o, dq, dk, dv, dg, db, saved, ws };
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		hp_cuda_free(all[i]);
	free(h);
}

/* a cheap deterministic pattern in [-a, a) */
static void pattern(float *w, size_t n, unsigned salt, float a)
{
	for (size_t i = 0; i < n; i++) {
		unsigned u = (unsigned)(i * 2654435761u) ^ (salt * 0x9e3779b9u);
		u ^= u >> 15;
		u *= 0x2c1b3c6du;
		u ^= u >> 12;
		w[i] = a * ((float)(u >> 8) / 8388608.0f - 1.0f);
	}
}

/* one model on its own backend, with its optimizer and one sequence */
struct run {
	struct hp_backend *bk;
	struct hp_model m;
	struct hp_optim o;
	int32_t *ids, *tg;
	int T, has_aux;
	size_t free0;       /* device memory free once the backend was set up (a GPU's) */
};

/* backend, model of `layers` layers, weights, optimizer (AdamW as a
 * pretraining run sets it), tokens; exits on failure */
static void run_open(struct run *r, const struct hp_model_spec *spec, int layers, int T, enum hp_emulate emu)
{
	struct hp_model_spec s = *spec;
	struct hp_model_kernels k;
	struct hp_config cfg;
	struct hp_err e;
	size_t total;

	memset(r, 0, sizeof(*r));
	memset(&k, 0, sizeof(k));
	memset(&cfg, 0, sizeof(cfg));
	s.n_layers = layers;
	for (int l = 0; l < layers; l++) {
		k.flash[l] = 1;
		k.grouped[l] = 1;     /* MoE layers only: one GEMM for gate and up */
	}
	k.ce_chunk = CE_CHUNK;
	r->T = T;
	r->has_aux = s.n_experts > 0 && s.output_router_logits;
	if (hp_backend_cuda_open(&r->bk, 0, 0, emu, &e) ||
	    (emu == HP_EMULATE_OFF && hp_cuda_mem_info(&r->free0, &total, &e)))
		die("cuda backend", &e);
	if (hp_model_init_par(&r->m, r->bk, &s, &k, NULL, 1, T, &e))
		die("model", &e);
	for (int i = 0; i < r->m.w.nparams; i++) {
		struct hp_param *p = &r->m.w.params[i];
		if (p->ndim == 1)
			for (size_t j = 0; j < p->numel; j++)
				p->w[j] = 1.0f;
		else
			pattern(p->w, p->numel, (unsigned)i, 0.02f);
	}
	if (hp_model_upload(&r->m, &e) || hp_optim_init(&r->o, &r->m, &cfg, 1, &e))
		die("model on the device", &e);
	r->o.hp.beta1 = 0.9;
	r->o.hp.beta2 = 0.95;
	r->o.hp.eps = 1e-8;
	r->o.hp.weight_decay = 0.1;
	r->o.max_grad_norm = 1.0;
	r->ids = malloc(sizeof(int32_t) * T);
	r->tg = malloc(sizeof(int32_t) * T);
	if (!r->ids || !r->tg) {
		fprintf(stderr, "gpu-bench: out of host memory\n");
		exit(1);
	}
	for (int i = 0; i < T; i++) {
		r->ids[i] = (int32_t)((i * 7919u + 13) % (unsigned)s.vocab);
		r->tg[i] = (int32_t)((i * 104729u + 7) % (unsigned)s.vocab);
	}
}

/* one optimizer step of one micro-batch, as lib/train/train.c's loop runs it;
 * the loss (CE mean, plus the weighted aux loss) and the gradient norm */
static void run_step(struct run *r, double lr, double *loss, double *norm)
{
	struct hp_model *m = &r->m;
	struct hp_err e;
	double st[HP_ST_N];
	long cnt = 0;

	hp_model_zero_grad(m);
	hp_model_stats_zero(m);
	/* every target counts; the sums stay on the device until the step's read, as hp-train's */
	if (hp_model_forward(m, r->ids, r->tg, NULL, 1.0 / r->T, NULL, &cnt, &e))
		die("forward", &e);
	if (hp_model_backward(m, r->ids, r->tg, (double)r->T, 1.0, &e))
		die("backward", &e);
	/* the norm, clip factor and update decided on the device; the step's
	 * sums read once at its end: hp-train's one host sync a step */
	float *cg = (float *)hp_model_stat(m, HP_ST_CLIP);
	if (hp_optim_grad_sumsq(&r->o, hp_model_stat(m, HP_ST_GRAD_SQ), &e))
		die("gradient norm", &e);
	hp_optim_clip_gate(&r->o, cg, hp_model_stat(m, HP_ST_GRAD_SQ), hp_model_stat(m, HP_ST_LOSS),
			   hp_model_stat(m, HP_ST_AUX), (const int32_t *)hp_model_stat(m, HP_ST_BAD), 0);
	hp_optim_step(&r->o, lr, cg);
	if (hp_model_stats(m, st, &e))
		die("step", &e);
	*norm = sqrt(st[HP_ST_GRAD_SQ]);
	*loss = (cnt > 0 ? st[HP_ST_LOSS] / cnt : 0) + (r->has_aux ? m->spec.router_aux_loss_coef * st[HP_ST_AUX] : 0);
}

static void run_close(struct run *r)
{
	hp_optim_release(&r->o);
	hp_model_release(&r->m);
	hp_backend_close(r->bk);
	free(r->ids);
	free(r->tg);
}

/* device bytes a model of `layers` layers holds after its first step (the
 * backend's scratch grows to its size there), and its parameter count */
static double measure(const struct hp_model_spec *s, int layers, int T, size_t *numel)
{
	struct run r;
	struct hp_err e;
	size_t f1, tot;
	double loss, norm;

	run_open(&r, s, layers, T, HP_EMULATE_OFF);
	run_step(&r, 1e-4, &loss, &norm);
	if (hp_cuda_mem_info(&f1, &tot, &e))
		die("memory", &e);
	*numel = r.m.w.numel;
	run_close(&r);
	return (double)r.free0 - (double)f1;
}

/* the layers that fit on the device and the host (see the top), at most max */
static int layers_that_fit(const struct hp_model_spec *s, int T, int max)
{
	struct hp_backend *bk;
	struct hp_err e;
	size_t n1, n2, fb, tb;
	double u1 = measure(s, 1, T, &n1), u2 = measure(s, 2, T, &n2), per = u2 - u1, base = u1 - per;
	double hper = 16.0 * (double)(n2 - n1), hbase = 16.0 * (double)n1 - hper;
	double host = 0.8 * (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);

	if (hp_backend_cuda_open(&bk, 0, 0, HP_EMULATE_OFF, &e) || hp_cuda_mem_info(&fb, &tb, &e))
		die("memory", &e);
	hp_backend_close(bk);
	int fit = per > 0 ? (int)(((double)fb - HEADROOM - base) / per) : max;
	int hfit = hper > 0 ? (int)((host - hbase) / hper) : max;
	printf("model memory: %.2f GiB + %.2f GiB a layer on the device (measured), %.2f GiB a layer on the host; "
	       "%.1f of %.1f GiB free: %d layers fit (the host's memory: %d)\n", base / GIB, per / GIB, hper / GIB,
	       fb / GIB, tb / GIB, fit, hfit);
	fit = fit < hfit ? fit : hfit;
	return fit < max ? fit : max;
}

static void bench_model(const char *config, int layers, int T, int steps, enum hp_emulate emu)
{
	struct hp_model_spec s;
	struct hp_err e;
	struct run r;

	if (hp_hfconfig_load(&s, config, &e))
		die(config, &e);
	int L0 = s.n_layers;
	if (layers <= 0 && emu == HP_EMULATE_OFF)
		layers = layers_that_fit(&s, T, L0);
	else if (layers <= 0)
		layers = L0;
	if (layers < 1) {
		printf("model %s: not even one layer fits\n", config);
		return;
	}
	run_open(&r, &s, layers, T, emu);
	double t0 = 0, loss = 0, norm = 0;
	long syncs = 0, launches = 0;
	for (int st = 0; st <= steps; st++) {
		if (st == 1) {
			t0 = now();   /* the first step warms up (and grows the backend's scratch) */
			syncs = r.bk->host_syncs;
			launches = r.bk->kernel_launches;
		}
		run_step(&r, 1e-4, &loss, &norm);
	}
	double dt = (now() - t0) / steps;
	syncs = (r.bk->host_syncs - syncs) / steps;
	launches = (r.bk->kernel_launches - launches) / steps;
	/* what the step holds: the backend's count against what the device
	 * lost of its free memory (a GPU's: cudaMemGetInfo) */
	size_t fr = 0, tot = 0;
	if (emu == HP_EMULATE_OFF && hp_cuda_mem_info(&fr, &tot, &e))
		die("cudaMemGetInfo", &e);
	/* one more step, profiled: the share of the compute stream's time per kernel family */
	double ms[HP_KF_N], all = 0;
	r.bk->profile = 1;
	run_step(&r, 1e-4, &loss, &norm);
	if (r.bk->kernel_times(r.bk, ms, &e))
		die("kernel times", &e);
	r.bk->profile = 0;
	for (int f = 0; f < HP_KF_N; f++)
		all += ms[f];
	printf("model %s: %ld host syncs and %ld launches a step; device peak %.1f MiB counted by the backend",
	       config, syncs, launches, r.bk->dev_bytes_peak / 1048576.0);
	if (emu == HP_EMULATE_OFF)
		printf(", %.1f MiB taken from the device's free memory (cudaMemGetInfo)",
		       ((double)r.free0 - (double)fr) / 1048576.0);
	printf("\nmodel %s: kernel time (one profiled step, %.1f ms):", config, all);
	for (int f = 0; f < HP_KF_N; f++)
		if (ms[f] > 0)
			printf(" %s %.1f%%", hp_kfam_name(f), 100 * ms[f] / all);
	printf("\n");
	double C = s.hidden, D = s.head_dim, Hq = s.n_heads, Hkv = s.n_kv_heads, E = s.n_experts, K = s.top_k;
	double Im = s.moe_intermediate;
	double active = (double)layers * (C * D * (2 * Hq + 2 * Hkv) + (E ? C * E + K * 3 * C * Im :
						3 * C * s.intermediate)) + C * s.vocab;
	double fl = 6 * active + 6.0 * layers * T * Hq * D;
	printf("model %s on %s: %d of %d layers, seq %d: %.3f s/step, %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%% "
	       "(loss %.4f, grad norm %.3g)\n", config, r.bk->name, layers, L0, T, dt, T / dt, fl * T / dt * 1e-12,
	       100 * fl * T / dt / PEAK, loss, norm);
	run_close(&r);
}

int main(int argc, char **argv)
{
	static const char usage[] = "usage: gpu-bench [--layers N] [--seq T] [--steps S] [--model-only] CONFIG.json\n";
	int layers = 0, T = 4096, steps = 3, model_only = 0;
	const char *config = NULL;
	enum hp_emulate emu;
	struct hp_err e;
	char name[128];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--layers") && i + 1 < argc)
			layers = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--seq") && i + 1 < argc)
			T = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
			steps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--model-only"))
			model_only = 1;
		else if (argv[i][0] != '-' && !config)
			config = argv[i];
		else {
			fputs(usage, stderr);
			return 2;
		}
	}
	if (!config || steps < 1 || T < 1) {
		fputs(usage, stderr);
		return 2;
	}
	if (hp_emulate_from_env(&emu, &e))
		die("HP_CUDA_EMULATE", &e);
	if (emu != HP_EMULATE_OFF) {
		bench_model(config, layers, T, steps, emu);
		return 0;
	}
	if (hp_cuda_device_count() == 0) {
		printf("gpu-bench: no CUDA device; nothing measured\n");
		return 77;
	}
	if (hp_cuda_init(0, &e) || hp_cuda_device_name(0, name, sizeof(name), &e))
		die("init", &e);
	printf("device: %s\n", name);
	if (!model_only) {
		bench_gemm();
		bench_flash(T);
		bench_gdr(T);
	}
	hp_cuda_fini();     /* the model's backend sets the device up again, as its own */
	bench_model(config, layers, T, steps, HP_EMULATE_OFF);
	return 0;
}
