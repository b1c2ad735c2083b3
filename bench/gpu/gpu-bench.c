/*
 * gpu-bench.c - the CUDA backend's benchmark (issue: CUDA and NCCL backend).
 *
 *   gpu-bench [--layers N] [--seq T] [--steps S] CONFIG.json
 *
 * 1. bf16 GEMMs: hp_cuda_linear_fwd against cublasGemmEx with the same
 *    shapes, types and stream, measured in the same run (target >= 0.90).
 * 2. Flash attention forward and backward TFLOP/s at B=1, T, 32 heads,
 *    4 KV heads, head_dim 128 (causal: forward 2*T*T*Hq*D flops,
 *    backward 2.5x that).
 * 3. The model of CONFIG (a Qwen3-30B-A3B-shaped config.json by default),
 *    with as many layers as fit in device memory (or --layers), one
 *    sequence of T tokens: forward + backward + AdamW step, tokens/s and
 *    MFU against 989 TFLOP/s (H100/H200 dense bf16).  Model flops per
 *    token: 6 * (active matmul parameters, LM head included) +
 *    6 * layers * T * Hq * D (causal attention, forward and backward).
 * Weights are a cheap deterministic pattern, not trained values: the
 * router still spreads tokens over experts.  Prints one line per result;
 * exit 0, or 1 on a CUDA error, 77 without a GPU.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/ops.h"
#include "gmodel.h"
#include "hfconfig.h"
#include "model.h"
#include "optim.h"

#define PEAK 989e12

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

/* mean seconds of fn over reps after a warm-up, timed with events on the stream */
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
		hp_bf16 *y = hp_cuda_alloc(sizeof(hp_bf16) * N * O, &e);
		float one = 1, zero = 0;
		double t_hp, t_cb, fl = 2.0 * N * K * O;

		if (!x || !W || !y)
			die("gemm buffers", &e);
		TIME(20, t_hp, if (hp_cuda_linear_fwd(y, 0, x, W, NULL, N, (int)K, (int)O, &e)) die("linear", &e));
		/* row-major y[N,O] = x[N,K] W[O,K]^T is column-major y^T = W^T' x^T: op(A)=W^T of [K,O] col */
		TIME(20, t_cb, cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)O, (int)N, (int)K, &one, W, CUDA_R_16BF,
					    (int)K, x, CUDA_R_16BF, (int)K, &zero, y, CUDA_R_16BF, (int)O,
					    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
		printf("gemm %ldx%ldx%ld  hp %.1f TFLOP/s  cublas %.1f TFLOP/s  ratio %.3f\n", N, K, O,
		       fl / t_hp * 1e-12, fl / t_cb * 1e-12, t_cb / t_hp);
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

static void bench_model(const char *config, int layers, int T, int steps)
{
	struct hp_model_spec s;
	struct hp_model m;
	struct hp_optim o;
	struct hp_gmodel *g = NULL;
	struct hp_err e;
	size_t free_b, total_b;

	if (hp_hfconfig_load(&s, config, &e))
		die(config, &e);
	/* the device arena grows by the same bytes with each layer (every
	 * layer of the config alike); 2 GiB stay for the kernels' workspace */
	int L0 = s.n_layers;
	s.n_layers = 1;
	double one = (double)hp_gmodel_bytes_for(&s, 1, T, 0);
	s.n_layers = 2;
	double per = (double)hp_gmodel_bytes_for(&s, 1, T, 0) - one;
	if (hp_cuda_mem_info(&free_b, &total_b, &e))
		die("memory", &e);
	int fit = (int)(((double)free_b - 2.0 * 1073741824.0 - (one - per)) / per);
	if (layers <= 0)
		layers = fit < L0 ? fit : L0;
	if (layers < 1) {
		printf("model: not even one layer fits in %.1f GiB\n", free_b / 1073741824.0);
		return;
	}
	s.n_layers = layers;
	if (hp_model_init(&m, &s, 1, 1, &e))
		die("host model", &e);
	for (int i = 0; i < m.nparams; i++) {
		struct hp_param *p = &m.params[i];
		int norm = p->ndim == 1;
		if (norm)
			for (size_t j = 0; j < p->numel; j++)
				p->w[j] = 1.0f;
		else
			pattern(p->w, p->numel, (unsigned)i, 0.02f);
	}
	memset(&o, 0, sizeof(o));
	o.hp.lr = 1e-4;
	o.hp.beta1 = 0.9;
	o.hp.beta2 = 0.95;
	o.hp.eps = 1e-8;
	o.hp.weight_decay = 0.1;
	o.max_grad_norm = 1.0;
	if (hp_gmodel_init(&g, &m, NULL, 0, 1, T, 1024, &e))
		die("device model", &e);
	int32_t *ids = malloc(sizeof(int32_t) * T), *tg = malloc(sizeof(int32_t) * T);
	for (int i = 0; i < T; i++) {
		ids[i] = (int32_t)((i * 7919u + 13) % (unsigned)s.vocab);
		tg[i] = (int32_t)((i * 104729u + 7) % (unsigned)s.vocab);
	}
	double t0 = 0, loss = 0, norm = 0;
	for (int st = 0; st <= steps; st++) {
		double ls, aux;
		long cnt;

		if (st == 1)
			t0 = now();   /* the first step warms up */
		hp_gmodel_zero_grad(g);
		if (hp_gmodel_micro(g, ids, tg, NULL, 1.0 / T, 1.0, &ls, &cnt, &aux, &e) ||
		    hp_gmodel_grad_norm(g, &norm, &e))
			die("step", &e);
		o.step++;
		o.hp.step = o.step;
		if (hp_gmodel_step(g, &o, norm, &e) || hp_cuda_sync(&e))
			die("optimizer", &e);
		loss = ls / cnt;
	}
	double dt = (now() - t0) / steps;
	double C = s.hidden, D = s.head_dim, Hq = s.n_heads, Hkv = s.n_kv_heads, E = s.n_experts, K = s.top_k;
	double Im = s.moe_intermediate;
	double active = (double)layers * (C * D * (2 * Hq + 2 * Hkv) + (E ? C * E + K * 3 * C * Im :
						3 * C * s.intermediate)) + C * s.vocab;
	double fl = 6 * active + 6.0 * layers * T * Hq * D;
	printf("model %s: %d of %d layers (%.1f GiB on the device), seq %d: %.3f s/step, %.0f tokens/s, "
	       "%.1f TFLOP/s, MFU %.1f%% (loss %.4f, grad norm %.3g)\n", config, layers, fit, hp_gmodel_bytes(g) / 1073741824.0,
	       T, dt, T / dt, fl * T / dt * 1e-12, 100 * fl * T / dt / PEAK, loss, norm);
	free(ids);
	free(tg);
	hp_gmodel_free(g);
	hp_model_release(&m);
}

int main(int argc, char **argv)
{
	int layers = 0, T = 4096, steps = 3;
	const char *config = NULL;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--layers") && i + 1 < argc)
			layers = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--seq") && i + 1 < argc)
			T = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
			steps = atoi(argv[++i]);
		else if (argv[i][0] != '-' && !config)
			config = argv[i];
		else {
			fprintf(stderr, "usage: gpu-bench [--layers N] [--seq T] [--steps S] CONFIG.json\n");
			return 2;
		}
	}
	if (!config || steps < 1 || T < 1) {
		fprintf(stderr, "usage: gpu-bench [--layers N] [--seq T] [--steps S] CONFIG.json\n");
		return 2;
	}
	if (hp_cuda_device_count() == 0) {
		printf("gpu-bench: no CUDA device; nothing measured\n");
		return 77;
	}
	struct hp_err e;
	char name[128];
	if (hp_cuda_init(0, &e) || hp_cuda_device_name(0, name, sizeof(name), &e))
		die("init", &e);
	printf("device: %s\n", name);
	bench_gemm();
	bench_flash(T);
	bench_model(config, layers, T, steps);
	return 0;
}
