/*
 * kernel-bench.c - each substitutable kernel against HF's algorithm (the
 * reference it replaces): time and memory, in one run; part of `make bench`
 * through bench/kernels-bench.sh.
 *
 * Usage: kernel-bench [--quick] [--smoke] [--runs N] [--attn-runs N] [--what attention,moe,ce]
 *
 *   attention  hp_cpu_ops_blas.attention_fwd/bwd (HF eager: saves P
 *              [B,H,T,T], the backward needs T*T floats of scratch) against
 *              hp_flash_attention_fwd/bwd (saves lse [B,H,T], scratch
 *              hp_flash_attention_scratch()), B=1, T=2048, heads 16 / kv 4
 *              and 8 / 8, head_dim 64 and 128.  Memory: the bytes each keeps
 *              for its backward plus its scratch (P + scratch against lse +
 *              scratch); q, k, v, out and the gradients are the same for
 *              both and not counted.  Time: forward + backward.
 *   moe        a one-layer Qwen3-MoE (hidden 512, 64 experts, top-8,
 *              moe_intermediate 256, 8 heads / 4 kv heads of 64, vocab 1024
 *              so that the LM head stays small) at B=1, T=1024, through the
 *              whole model (hp_model_init_kernels): grouped[0] = 0 against 1.
 *   ce         a one-layer Llama (hidden 1024, vocab 151936, 16 heads / 4 kv
 *              heads of 64, intermediate 2816, untied) at B=1, T=2048,
 *              ce_chunk 0 against 1024 (--quick: T=1024, chunk 512, so that
 *              the chunk still splits the tokens in two).
 * The model lines time forward + backward of the whole model, so their time
 * ratio includes the layers the kernel does not touch (the embedding, the
 * attention, the norms); both sides use flash attention so that T x T
 * buffers do not dilute the memory ratio.  Memory: the model's activation
 * arena (m.a.aarena.cap, what hp-plan estimates as activation_bytes).  The
 * weights are random (uniform, +-0.02; norms 1), ids and targets random.
 *
 * Every measurement is the best of --runs runs (default 3; the attention
 * lines, which take well under a second, --attn-runs, default 5) after one
 * untimed warm-up that also faults the buffers in.  The best, because on a
 * shared machine another process on one of the cores slows a run down (the
 * flash kernels by up to 2x on 2 cores).  Threads: hp_sgemm's
 * (HP_NUM_THREADS, else OPENBLAS_NUM_THREADS, ...), and the flash kernels
 * are set to the same count.  Each line also prints how far the fast
 * kernel's result is from the reference's (max relative difference of the
 * attention output and dq; relative difference of the model's loss and the
 * L2 distance of the gradients), so a fast wrong answer shows.
 *
 * --smoke (or HP_BENCH_SMOKE=1 in the environment): the same lines at
 * tiny sizes (attention T=128; the MoE model at hidden 128, 8 experts top-2,
 * T=64; the cross-entropy model at vocab 4096, hidden 128, T=64, chunk 32),
 * one run each, in well under a second: it proves the benchmark still runs
 * (t/t1300), and its times are not worth reading.
 *
 * Output, one line per kernel:
 *   kernel  ref_ms  fast_ms  speedup  ref_MiB  fast_MiB  mem_ratio  check
 * Not a test: it checks nothing; exits non-zero only when a run fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "cpu/gemm.h"
#include "cpu/ops.h"
#include "config/hfconfig.h"
#include "model/model.h"

static int runs = 3, attn_runs = 5;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 32);
}

static void fill(float *x, size_t n, float a)
{
	for (size_t i = 0; i < n; i++)
		x[i] = a * ((float)rnd() / 2147483648.0f - 1.0f);
}

static float *falloc(size_t n)
{
	float *p = hp_malloc_aligned(n * sizeof(float));

	if (!p) {
		fprintf(stderr, "kernel-bench: out of memory for %zu floats\n", n);
		exit(1);
	}
	memset(p, 0, n * sizeof(float));
	return p;
}

static double mib(size_t bytes)
{
	return bytes / 1048576.0;
}

static void line(const char *what, double ref_s, double fast_s, size_t ref_b, size_t fast_b, const char *check)
{
	printf("%-38s %9.1f %9.1f %7.2fx %9.1f %9.2f %8.1fx  %s\n", what, ref_s * 1e3, fast_s * 1e3,
	       ref_s / fast_s, mib(ref_b), mib(fast_b), (double)ref_b / (double)fast_b, check);
	fflush(stdout);
}

/* ---- attention ---------------------------------------------------------- */

static double max_rel(const float *a, const float *b, size_t n)
{
	double d = 0, r = 0;

	for (size_t i = 0; i < n; i++) {
		double x = fabs((double)a[i] - b[i]), y = fabs((double)b[i]);

		if (x > d)
			d = x;
		if (y > r)
			r = y;
	}
	return r > 0 ? d / r : d;
}

static void bench_attention(int T, int H, int Hkv, int D)
{
	const int B = 1;
	size_t N = (size_t)B * T, QD = (size_t)H * D, KD = (size_t)Hkv * D;
	size_t nP = (size_t)B * H * T * T, nS = (size_t)T * T, nL = (size_t)B * H * T;
	size_t nFS = hp_flash_attention_scratch(T, H, D);
	float *q = falloc(N * QD), *k = falloc(N * KD), *v = falloc(N * KD), *dout = falloc(N * QD);
	float *out_r = falloc(N * QD), *out_f = falloc(N * QD);
	float *dq_r = falloc(N * QD), *dk_r = falloc(N * KD), *dv_r = falloc(N * KD);
	float *dq_f = falloc(N * QD), *dk_f = falloc(N * KD), *dv_f = falloc(N * KD);
	float *P = falloc(nP), *S = falloc(nS), *lse = falloc(nL), *FS = nFS ? falloc(nFS) : NULL;
	double best_r = 1e30, best_f = 1e30;
	char what[64], check[96];

	fill(q, N * QD, 1.0f);
	fill(k, N * KD, 1.0f);
	fill(v, N * KD, 1.0f);
	fill(dout, N * QD, 1.0f);
	for (int r = 0; r <= attn_runs; r++) {
		double t0 = now(), t1;

		hp_cpu_ops_blas.attention_fwd(out_r, P, q, k, v, NULL, B, T, H, Hkv, D);
		hp_cpu_ops_blas.attention_bwd(dq_r, dk_r, dv_r, dout, P, q, k, v, NULL, S, B, T, H, Hkv, D);
		t1 = now();
		if (r && t1 - t0 < best_r)
			best_r = t1 - t0;
		t0 = now();
		hp_flash_attention_fwd(out_f, lse, q, k, v, NULL, B, T, H, Hkv, D);
		hp_flash_attention_bwd(dq_f, dk_f, dv_f, dout, out_f, lse, q, k, v, NULL, FS, B, T, H, Hkv, D);
		t1 = now();
		if (r && t1 - t0 < best_f)
			best_f = t1 - t0;
	}
	snprintf(what, sizeof(what), "attention T=%d H=%d/%d D=%d", T, H, Hkv, D);
	snprintf(check, sizeof(check), "out %.1e dq %.1e dk %.1e (max rel)", max_rel(out_f, out_r, N * QD),
		 max_rel(dq_f, dq_r, N * QD), max_rel(dk_f, dk_r, N * KD));
	line(what, best_r, best_f, (nP + nS) * sizeof(float), (nL + nFS) * sizeof(float), check);
	hp_free_aligned(q), hp_free_aligned(k), hp_free_aligned(v), hp_free_aligned(dout);
	hp_free_aligned(out_r), hp_free_aligned(out_f);
	hp_free_aligned(dq_r), hp_free_aligned(dk_r), hp_free_aligned(dv_r);
	hp_free_aligned(dq_f), hp_free_aligned(dk_f), hp_free_aligned(dv_f);
	hp_free_aligned(P), hp_free_aligned(S), hp_free_aligned(lse), hp_free_aligned(FS);
}

/* ---- whole model -------------------------------------------------------- */

struct model_run {
	double best_s, loss;
	size_t act_bytes;
	float *grads;
	size_t n;
};

static int model_run(const struct hp_model_spec *s, const struct hp_model_kernels *k, int T,
		     struct model_run *out)
{
	struct hp_model m;
	struct hp_err e;
	int32_t *ids = malloc((size_t)T * sizeof(*ids)), *tg = malloc((size_t)T * sizeof(*tg));
	int rc = -1;

	hp_err_clear(&e);
	if (!ids || !tg || hp_model_init_kernels(&m, s, k, 1, T, &e)) {
		fprintf(stderr, "kernel-bench: %s\n", ids && tg ? e.msg : "out of memory");
		free(ids);
		free(tg);
		return -1;
	}
	/* the same weights and tokens for every run: reseed */
	rng = 0x9e3779b97f4a7c15ull;
	fill(m.w.flat_w, m.w.numel, 0.02f);
	for (int i = 0; i < m.w.nparams; i++)
		if (strstr(m.w.params[i].name, "norm"))
			for (size_t j = 0; j < m.w.params[i].numel; j++)
				m.w.params[i].w[j] = 1.0f;
	for (int i = 0; i < T; i++) {
		ids[i] = (int32_t)(rnd() % (uint32_t)s->vocab);
		tg[i] = (int32_t)(rnd() % (uint32_t)s->vocab);
	}
	out->best_s = 1e30;
	for (int r = 0; r <= runs; r++) {
		double t0, t1, loss;
		long count;

		hp_model_zero_grad(&m);
		/* every target counts: the scale is known first, as lib/train/train.c knows it */
		t0 = now();
		if (hp_model_forward(&m, ids, tg, NULL, 1.0 / T, &loss, &count, &e) ||
		    hp_model_backward(&m, ids, tg, (double)count, 1.0, &e)) {
			fprintf(stderr, "kernel-bench: %s\n", e.msg);
			goto out;
		}
		t1 = now();
		if (r && t1 - t0 < out->best_s)
			out->best_s = t1 - t0;
		out->loss = loss / (double)count;
	}
	out->act_bytes = m.a.aarena.cap;
	out->n = m.w.numel;
	out->grads = malloc(m.w.numel * sizeof(float));
	if (!out->grads)
		goto out;
	memcpy(out->grads, m.w.flat_g, m.w.numel * sizeof(float));
	rc = 0;
out:
	hp_model_release(&m);
	free(ids);
	free(tg);
	return rc;
}

static int bench_model(const char *what, const char *config_json, int T, const struct hp_model_kernels *kr,
		       const struct hp_model_kernels *kf)
{
	struct hp_model_spec s;
	struct hp_err e;
	struct model_run r = { 0 }, f = { 0 };
	char check[96];
	double d = 0, n = 0;

	hp_err_clear(&e);
	if (hp_hfconfig_load_buf(&s, what, config_json, strlen(config_json), &e)) {
		fprintf(stderr, "kernel-bench: %s\n", e.msg);
		return -1;
	}
	if (model_run(&s, kr, T, &r) || model_run(&s, kf, T, &f)) {
		free(r.grads);
		return -1;
	}
	for (size_t i = 0; i < r.n; i++) {
		d += ((double)f.grads[i] - r.grads[i]) * ((double)f.grads[i] - r.grads[i]);
		n += (double)r.grads[i] * r.grads[i];
	}
	snprintf(check, sizeof(check), "loss %.1e grads %.1e (rel L2)", fabs(f.loss - r.loss) / fabs(r.loss),
		 n > 0 ? sqrt(d / n) : sqrt(d));
	line(what, r.best_s, f.best_s, r.act_bytes, f.act_bytes, check);
	free(r.grads);
	free(f.grads);
	return 0;
}

static const char moe_json[] =
	"{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\","
	" \"hidden_size\": 512, \"intermediate_size\": 1024, \"num_hidden_layers\": 1,"
	" \"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 64,"
	" \"num_experts\": 64, \"num_experts_per_tok\": 8, \"moe_intermediate_size\": 256,"
	" \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"norm_topk_prob\": true,"
	" \"output_router_logits\": false, \"vocab_size\": 1024, \"max_position_embeddings\": 4096,"
	" \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
	" \"tie_word_embeddings\": false, \"attention_bias\": false, \"torch_dtype\": \"float32\"}";

/* --smoke's models: the same families and kernels, small enough for a test */
static const char moe_smoke_json[] =
	"{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\","
	" \"hidden_size\": 128, \"intermediate_size\": 256, \"num_hidden_layers\": 1,"
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32,"
	" \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 64,"
	" \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"norm_topk_prob\": true,"
	" \"output_router_logits\": false, \"vocab_size\": 256, \"max_position_embeddings\": 4096,"
	" \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
	" \"tie_word_embeddings\": false, \"attention_bias\": false, \"torch_dtype\": \"float32\"}";

static const char ce_smoke_json[] =
	"{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
	" \"hidden_size\": 128, \"intermediate_size\": 256, \"num_hidden_layers\": 1,"
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32,"
	" \"vocab_size\": 4096, \"max_position_embeddings\": 4096, \"hidden_act\": \"silu\","
	" \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"
	" \"attention_bias\": false, \"mlp_bias\": false, \"torch_dtype\": \"float32\"}";

static const char ce_json[] =
	"{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
	" \"hidden_size\": 1024, \"intermediate_size\": 2816, \"num_hidden_layers\": 1,"
	" \"num_attention_heads\": 16, \"num_key_value_heads\": 4, \"head_dim\": 64,"
	" \"vocab_size\": 151936, \"max_position_embeddings\": 4096, \"hidden_act\": \"silu\","
	" \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"
	" \"attention_bias\": false, \"mlp_bias\": false, \"torch_dtype\": \"float32\"}";

int main(int argc, char **argv)
{
	const char *what = "attention,moe,ce", *env = getenv("HP_BENCH_SMOKE");
	const char *moe_cfg = moe_json, *ce_cfg = ce_json;
	int quick = 0, smoke = env && !strcmp(env, "1"), threads, attn_T = 2048, moe_T = 1024, ce_T, ce_V;
	long ce_chunk;
	struct hp_model_kernels kr, kf;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else if (!strcmp(argv[i], "--smoke"))
			smoke = 1;
		else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
			runs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--attn-runs") && i + 1 < argc)
			attn_runs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--what") && i + 1 < argc)
			what = argv[++i];
		else {
			fprintf(stderr, "usage: kernel-bench [--quick] [--smoke] [--runs N] [--attn-runs N] "
				"[--what attention,moe,ce]\n");
			return 2;
		}
	}
	if (runs < 1)
		runs = 1;
	if (attn_runs < 1)
		attn_runs = 1;
	threads = hp_sgemm_threads();
	hp_attention_set_threads(threads);
	ce_T = quick ? 1024 : 2048;
	ce_chunk = quick ? 512 : 1024;
	ce_V = 151936;
	if (smoke) {
		runs = attn_runs = 1;
		attn_T = 128;
		moe_T = ce_T = 64;
		ce_chunk = 32;
		ce_V = 4096;
		moe_cfg = moe_smoke_json;
		ce_cfg = ce_smoke_json;
	}
	printf("kernels: fast against reference, forward + backward, best of %d runs (attention %d), "
	       "%d thread%s, gemm %s%s\n", runs, attn_runs, threads, threads == 1 ? "" : "s", hp_sgemm_path(),
	       smoke ? " (smoke: tiny sizes, times not worth reading)" : "");
	printf("%-38s %9s %9s %8s %9s %9s %9s  %s\n", "kernel", "ref ms", "fast ms", "speedup", "ref MiB",
	       "fast MiB", "mem", "fast vs ref");

	if (strstr(what, "attention")) {
		static const int cfg[][3] = { { 16, 4, 64 }, { 16, 4, 128 }, { 8, 8, 64 }, { 8, 8, 128 } };

		for (size_t i = 0; i < sizeof(cfg) / sizeof(cfg[0]); i++)
			bench_attention(attn_T, cfg[i][0], cfg[i][1], cfg[i][2]);
	}
	if (strstr(what, "moe")) {
		char name[64];

		memset(&kr, 0, sizeof(kr));
		kr.flash[0] = 1;
		kf = kr;
		kf.grouped[0] = 1;
		snprintf(name, sizeof(name), "moe E=%d k=%d (model, T=%d)", smoke ? 8 : 64, smoke ? 2 : 8, moe_T);
		if (bench_model(name, moe_cfg, moe_T, &kr, &kf))
			return 1;
	}
	if (strstr(what, "ce")) {
		char name[64];

		memset(&kr, 0, sizeof(kr));
		kr.flash[0] = 1;
		kf = kr;
		kf.ce_chunk = ce_chunk;
		snprintf(name, sizeof(name), "ce V=%d chunk %ld (model, T=%d)", ce_V, ce_chunk, ce_T);
		if (bench_model(name, ce_cfg, ce_T, &kr, &kf))
			return 1;
	}
	return 0;
}
