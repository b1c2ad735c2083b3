/*
 * test-init.c - the counter-based random init of lib/model/init.c: Philox4x32-10
 * known answers, values pinned against an independent Python
 * implementation of the definition in init.h, slice independence, distinct
 * streams, the statistics of a million draws, the HF init kind of every
 * Llama / Qwen3 / Qwen3-MoE parameter name, and Qwen3-Next / Qwen3.5's
 * rules: zero-centred norms, dt_bias, and A_log's ln(uniform(lo, 16)).
 *
 * It does not compare with torch: hp's init is HF's distribution, not
 * torch's generator (see init.h).
 *
 * The pinned values come from this Python (3, standard library only),
 * written from the definition in init.h; rerun it to regenerate them:
 *
 *   import math, struct
 *   M = 2**64 - 1
 *   def philox(c, k):
 *       c = list(c); k0, k1 = k
 *       for r in range(10):
 *           if r:
 *               k0 = (k0 + 0x9e3779b9) & 0xffffffff; k1 = (k1 + 0xbb67ae85) & 0xffffffff
 *           p0 = 0xd2511f53 * c[0]; p1 = 0xcd9e8d57 * c[2]
 *           c = [(p1 >> 32) ^ c[1] ^ k0, p1 & 0xffffffff, (p0 >> 32) ^ c[3] ^ k1, p0 & 0xffffffff]
 *       return c
 *   def mix(z):
 *       z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M
 *       z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M
 *       return z ^ (z >> 31)
 *   def key(seed, name):
 *       h = 0xcbf29ce484222325
 *       for b in name.encode():
 *           h = ((h ^ b) * 0x100000001b3) & M
 *       return mix(mix((seed + 0x9e3779b97f4a7c15) & M) ^ h)
 *   def ln(x):
 *       m, e = math.frexp(x)
 *       if m < 0.7071067811865476:
 *           m, e = m * 2.0, e - 1
 *       s = (m - 1.0) / (m + 1.0); s2 = s * s; p = 1.0 / 21.0
 *       for k in range(9, -1, -1):
 *           p = p * s2 + 1.0 / (2 * k + 1)
 *       return e * 0.6931471805599453 + 2.0 * s * p
 *   def sincos2pi(u):
 *       f = math.factorial
 *       S = [(-1) ** k / f(2 * k + 1) for k in range(9)]
 *       C = [(-1) ** k / f(2 * k) for k in range(9)]
 *       t = 4.0 * u; q = int(t); x = t - q
 *       if x > 0.5:
 *           x, q = x - 1.0, q + 1
 *       a = x * 1.5707963267948966; a2 = a * a; ps, pc = S[8], C[8]
 *       for k in range(7, -1, -1):
 *           ps = ps * a2 + S[k]; pc = pc * a2 + C[k]
 *       s, c = a * ps, pc
 *       return [(s, c), (c, -s), (-s, -c), (-c, s)][q & 3]
 *   def normal(kk, i):
 *       c = i >> 1
 *       x = philox([c & 0xffffffff, c >> 32, 0, 0], [kk & 0xffffffff, kk >> 32])
 *       a = ((x[1] << 32) | x[0]) >> 11; b = ((x[3] << 32) | x[2]) >> 11
 *       r = math.sqrt(-2.0 * ln((a + 1) * 2.0 ** -53))
 *       sn, cs = sincos2pi(b * 2.0 ** -53)
 *       return r * (cs if i % 2 == 0 else sn)
 *   def elem(seed, name, i, std):   # the float's bits
 *       sd = struct.unpack('<f', struct.pack('<f', std))[0]
 *       return struct.unpack('<I', struct.pack('<f', sd * normal(key(seed, name), i)))[0]
 *   print(hex(key(0, '')), hex(key(42, 'model.embed_tokens.weight')))
 *   kk = key(42, 'model.embed_tokens.weight')
 *   print([hex(struct.unpack('<Q', struct.pack('<d', normal(kk, i)))[0])
 *          for i in list(range(8)) + [12345, 2**33 + 1, 2**33 + 2]])
 *   print([hex(elem(1234, 'model.layers.0.self_attn.q_proj.weight', i, 0.02)) for i in range(8)])
 *   print([hex(elem(7, 'lm_head.weight', i, 1.0)) for i in range(2**33 - 3, 2**33 + 3)])
 *   def uniform(kk, i):   # A_log's stream (step 7)
 *       x = philox([i & 0xffffffff, i >> 32, 1, 0], [kk & 0xffffffff, kk >> 32])
 *       return ((((x[1] << 32) | x[0]) >> 11) + 1) * 2.0 ** -53
 *   def a_log(seed, name, i, lo):   # the float's bits
 *       y = lo + (16.0 - lo) * uniform(key(seed, name), i)
 *       return struct.unpack('<I', struct.pack('<f', ln(y)))[0]
 *   n = 'model.layers.0.linear_attn.A_log'
 *   print([hex(struct.unpack('<Q', struct.pack('<d', uniform(key(5, n), i)))[0]) for i in (0, 1, 2**33 + 1)])
 *   print([hex(a_log(5, n, i, lo)) for lo in (0.0, 0.01) for i in (0, 1, 2, 3, 2**33 + 1)])
 */
#include <math.h>

#include "config/hfconfig.h"
#include "model/init.h"
#include "tap.h"

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static uint64_t d2u(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }

static void test_philox_kat(void)
{
	/* Random123 tests/kat_vectors, the three philox4x32 10 lines:
	 * counter (4 words), key (2 words), expected output (4 words). */
	static const uint32_t kat[3][10] = {
		{ 0, 0, 0, 0, 0, 0,
		  0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 },
		{ 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
		  0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd },
		{ 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
		  0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 },
	};

	for (int t = 0; t < 3; t++) {
		uint32_t out[4];

		hp_philox4x32_10(kat[t], kat[t] + 4, out);
		ok(!memcmp(out, kat[t] + 6, sizeof(out)), "philox4x32-10 known answer %d", t);
		if (memcmp(out, kat[t] + 6, sizeof(out)))
			tap_diag("  got %08x %08x %08x %08x", out[0], out[1], out[2], out[3]);
	}
}

static void test_pinned(void)
{
	/* Every value below is from the Python reference in the header comment. */
	is_int(hp_init_key(0, ""), 0xaebe53f85cdc3c4cull, "key of (0, \"\")");
	uint64_t key = hp_init_key(42, "model.embed_tokens.weight");
	is_int(key, 0x1fa1913ea06b19dcull, "key of (42, model.embed_tokens.weight)");

	/* Standard normals as double bits: the whole chain before the float
	 * rounding, including pairs whose counter needs the high word. */
	static const struct { uint64_t i, bits; } nd[] = {
		{ 0, 0xc0002de1b842ba50ull }, { 1, 0xbffc8b1bcc5a6261ull },
		{ 2, 0xc002204da443d003ull }, { 3, 0xbfe3066b26fa0c49ull },
		{ 4, 0x3feaf94d2fa9b14full }, { 5, 0x3ff62192cf2071f8ull },
		{ 6, 0xbfe0ff20e2bb6272ull }, { 7, 0x3fb4d43226716ba9ull },
		{ 12345, 0x3ff021cddc7b1b5cull },
		{ (1ull << 33) + 1, 0x3fcb06d1b96d9a0eull },
		{ (1ull << 33) + 2, 0xbfccd1e33af4bb20ull },
	};
	int bad = 0;
	for (size_t t = 0; t < sizeof(nd) / sizeof(nd[0]); t++) {
		double z = hp_init_normal_at(key, nd[t].i);
		if (d2u(z) != nd[t].bits) {
			bad++;
			tap_diag("  normal_at(%llu) = %016llx, want %016llx", (unsigned long long)nd[t].i,
				 (unsigned long long)d2u(z), (unsigned long long)nd[t].bits);
		}
	}
	is_int(bad, 0, "standard normals bit-identical to the Python reference");

	static const uint32_t q[8] = {
		0xbbba6caf, 0xbbc67648, 0x3c211b70, 0x3c88cae1,
		0xbc9b9631, 0xbcc2dc1f, 0xbd0b5be5, 0x3d453dff,
	};
	float f[8];
	bad = 0;
	hp_init_normal_slice(f, 1234, "model.layers.0.self_attn.q_proj.weight", 0, 8, 0.02f);
	for (int i = 0; i < 8; i++)
		bad += f2u(f[i]) != q[i];
	is_int(bad, 0, "std 0.02 floats bit-identical to the Python reference");

	/* A slice straddling element 2^33, starting mid-pair. */
	static const uint32_t h[6] = {
		0xbf3c238f, 0xbfa2c915, 0x3eb5411b, 0x3f295e2a, 0xbf851926, 0x3eb30349,
	};
	bad = 0;
	hp_init_normal_slice(f, 7, "lm_head.weight", (1ull << 33) - 3, 6, 1.0f);
	for (int i = 0; i < 6; i++)
		bad += f2u(f[i]) != h[i];
	is_int(bad, 0, "slice at 2^33 - 3 bit-identical to the Python reference");
}

static uint64_t xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static int cmp_size(const void *a, const void *b)
{
	size_t x = *(const size_t *)a, y = *(const size_t *)b;

	return x < y ? -1 : x > y;
}

static void test_slices(void)
{
	/* 10007 is prime and odd, so the slices cannot all fall on pair
	 * boundaries and the last pair is a half one. */
	enum { N = 10007, NS = 7 };
	static float whole[N], parts[N];
	const char *name = "model.layers.3.mlp.experts.5.up_proj.weight";
	uint64_t rs = 0x2545f4914f6cdd1dull;
	size_t cut[NS + 1];

	hp_init_normal_slice(whole, 99, name, 0, N, 0.02f);
	cut[0] = 0;
	cut[NS] = N;
	for (int s = 1; s < NS; s++)
		cut[s] = 1 + xorshift(&rs) % (N - 1);
	qsort(cut + 1, NS - 1, sizeof(cut[0]), cmp_size);
	/* Fill back to front, to show the order of generation does not matter. */
	memset(parts, 0xff, sizeof(parts));
	for (int s = NS - 1; s >= 0; s--)
		hp_init_normal_slice(parts + cut[s], 99, name, cut[s], cut[s + 1] - cut[s], 0.02f);
	ok(!memcmp(whole, parts, sizeof(whole)), "7 random slices equal the whole tensor bit for bit");
	tap_diag("  cuts at %zu %zu %zu %zu %zu %zu", cut[1], cut[2], cut[3], cut[4], cut[5], cut[6]);

	/* Every single element alone, and every (start, length) up to 5 near the front. */
	int bad = 0;
	for (size_t i = 0; i < N; i++) {
		float one;
		hp_init_normal_slice(&one, 99, name, i, 1, 0.02f);
		bad += f2u(one) != f2u(whole[i]);
	}
	for (size_t a = 0; a < 16; a++)
		for (size_t n = 0; n <= 5; n++) {
			float buf[5];
			hp_init_normal_slice(buf, 99, name, a, n, 0.02f);
			bad += !!memcmp(buf, whole + a, n * sizeof(float));
		}
	is_int(bad, 0, "one-element and short slices equal the whole tensor");

	/* hp_init_tensor of a NORMAL name is the slice from 0. */
	hp_init_tensor(parts, NULL, 99, name, N, 0.02f);
	ok(!memcmp(whole, parts, sizeof(whole)), "hp_init_tensor equals hp_init_normal_slice from 0");
}

/* How many of the first n elements of two streams have the same bits. */
static int same_count(uint64_t s1, const char *n1, uint64_t s2, const char *n2)
{
	enum { N = 256 };
	float a[N], b[N];
	int same = 0;

	hp_init_normal_slice(a, s1, n1, 0, N, 1.0f);
	hp_init_normal_slice(b, s2, n2, 0, N, 1.0f);
	for (int i = 0; i < N; i++)
		same += f2u(a[i]) == f2u(b[i]);
	return same;
}

static void test_streams(void)
{
	const char *q = "model.layers.0.self_attn.q_proj.weight";
	const char *k = "model.layers.0.self_attn.k_proj.weight";

	/* Independent streams agree on a float's bits with probability about
	 * 2^-23 per element; 256 elements should share none. */
	is_int(same_count(1, q, 1, q), 256, "same seed and name: same stream");
	is_int(same_count(1, q, 2, q), 0, "seeds 1 and 2 differ");
	is_int(same_count(0, q, 1, q), 0, "seeds 0 and 1 differ");
	is_int(same_count(1, q, 1, k), 0, "q_proj and k_proj differ");
	is_int(same_count(1, "model.layers.1.mlp.up_proj.weight", 1,
			  "model.layers.10.mlp.up_proj.weight"), 0, "layers 1 and 10 differ");
	is_int(same_count(5, "a", 5, "b"), 0, "one-byte names differ");
	is_int(same_count(5, "", 5, "a"), 0, "empty name differs from \"a\"");
	/* Seed and name must not trade off: (seed s, name x) vs (seed s', name x'). */
	is_int(same_count(1, "", 0, ""), 0, "seeds 0 and 1 differ for the empty name");

	/* Neighbouring pairs are unrelated too (the counter, not the key, moves). */
	uint64_t key = hp_init_key(3, q);
	int same = 0;
	for (uint64_t i = 0; i < 1000; i++)
		same += hp_init_normal_at(key, i) == hp_init_normal_at(key, i + 2);
	is_int(same, 0, "elements two apart differ");
}

static void test_stats(void)
{
	/* 1e6 standard normals (std 1, so absolute and relative tolerances
	 * agree).  Standard errors: mean 1e-3, std 7.1e-4, 3-sigma tail
	 * fraction sqrt(0.0027 / 1e6) = 5.2e-5, kurtosis sqrt(24 / 1e6) = 4.9e-3;
	 * the tolerances are 3 to 6 of those.  The draw is fixed, so this
	 * either always passes or never does. */
	enum { N = 1000000 };
	static float v[N];
	double s1 = 0, s2 = 0, s4 = 0, maxabs = 0;
	long tail = 0, below1 = 0;

	hp_init_normal_slice(v, 2024, "model.layers.7.mlp.down_proj.weight", 0, N, 1.0f);
	for (int i = 0; i < N; i++) {
		double x = v[i];
		s1 += x;
		s2 += x * x;
		s4 += x * x * x * x;
		tail += fabs(x) > 3.0;
		below1 += x < 1.0;
		if (fabs(x) > maxabs)
			maxabs = fabs(x);
	}
	double mean = s1 / N, var = s2 / N - mean * mean, sd = sqrt(var);
	double kurt = s4 / N / (var * var);
	double ftail = (double)tail / N, fbelow1 = (double)below1 / N;

	tap_diag("  mean %.3g std %.6f kurtosis %.4f beyond 3 sigma %.5f below 1 %.5f max |x| %.3f",
		 mean, sd, kurt, ftail, fbelow1, maxabs);
	ok(fabs(mean) < 3e-3, "mean of 1e6 draws within 3e-3 of 0");
	ok(fabs(sd - 1.0) < 3e-3, "std of 1e6 draws within 3e-3 of 1");
	/* P(|Z| > 3) = erfc(3 / sqrt 2) = 0.0026998 */
	ok(fabs(ftail - 0.0026998) < 3e-4, "fraction beyond 3 sigma is 0.27%%");
	/* P(Z < 1) = 0.8413447, standard error 3.7e-4 */
	ok(fabs(fbelow1 - 0.8413447) < 2e-3, "fraction below 1 sigma is 84.1%%");
	ok(fabs(kurt - 3.0) < 0.03, "kurtosis of 1e6 draws is 3");
	/* 1e6 normals reach about 4.9 sigma; far beyond would mean a broken ln. */
	ok(maxabs > 4.0 && maxabs < 6.5, "largest |x| is plausible");

	/* The std argument scales: std 0.02 gives (float)(0.02f * z). */
	hp_init_normal_slice(v, 2024, "model.layers.7.mlp.down_proj.weight", 0, 1000, 0.02f);
	uint64_t key = hp_init_key(2024, "model.layers.7.mlp.down_proj.weight");
	int bad = 0;
	for (int i = 0; i < 1000; i++)
		bad += f2u(v[i]) != f2u((float)((double)0.02f * hp_init_normal_at(key, (uint64_t)i)));
	is_int(bad, 0, "std 0.02 is one rounding of 0.02f times the standard normal");
	hp_init_normal_slice(v, 1, "x", 0, 64, 0.0f);
	bad = 0;
	for (int i = 0; i < 64; i++)
		bad += v[i] != 0.0f;
	is_int(bad, 0, "std 0 gives zeros");
}

static void test_kinds(void)
{
	static const struct { const char *name; enum hp_init_kind kind; } t[] = {
		/* Llama / Qwen3 dense */
		{ "model.embed_tokens.weight", HP_INIT_NORMAL },
		{ "model.layers.0.input_layernorm.weight", HP_INIT_ONES },
		{ "model.layers.0.self_attn.q_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.0.self_attn.k_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.0.self_attn.v_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.0.self_attn.o_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.0.self_attn.q_proj.bias", HP_INIT_ZEROS },
		{ "model.layers.0.self_attn.k_proj.bias", HP_INIT_ZEROS },
		{ "model.layers.0.self_attn.v_proj.bias", HP_INIT_ZEROS },
		{ "model.layers.0.self_attn.o_proj.bias", HP_INIT_ZEROS },
		{ "model.layers.0.self_attn.q_norm.weight", HP_INIT_ONES },
		{ "model.layers.0.self_attn.k_norm.weight", HP_INIT_ONES },
		{ "model.layers.0.post_attention_layernorm.weight", HP_INIT_ONES },
		{ "model.layers.0.mlp.gate_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.0.mlp.up_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.0.mlp.down_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.0.mlp.down_proj.bias", HP_INIT_ZEROS },
		{ "model.layers.27.input_layernorm.weight", HP_INIT_ONES },
		{ "model.norm.weight", HP_INIT_ONES },
		{ "lm_head.weight", HP_INIT_NORMAL },
		/* Qwen3-MoE: the router is an nn.Linear, normal like the experts */
		{ "model.layers.1.mlp.gate.weight", HP_INIT_NORMAL },
		{ "model.layers.1.mlp.experts.3.gate_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.1.mlp.experts.3.up_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.1.mlp.experts.3.down_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.1.mlp.experts.127.down_proj.weight", HP_INIT_NORMAL },
		/* newer HF releases fuse the experts into one parameter each */
		{ "model.layers.1.mlp.experts.gate_up_proj", HP_INIT_NORMAL },
		{ "model.layers.1.mlp.experts.down_proj", HP_INIT_NORMAL },
		/* edge cases of the name rules */
		{ "bias", HP_INIT_ZEROS },
		{ "model.layers.1.mlp.gate.score_bias", HP_INIT_NORMAL },   /* "_bias": not a bias */
		/* DeepSeek-V3's correction bias buffer: zeros, as its _init_weights */
		{ "model.layers.1.mlp.gate.e_score_correction_bias", HP_INIT_ZEROS },
		{ "norm.weight", HP_INIT_ONES },
		{ "weight", HP_INIT_NORMAL },
		{ "", HP_INIT_NORMAL },
	};
	int bad = 0;

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		enum hp_init_kind got = hp_init_kind_of(t[i].name);
		if (got != t[i].kind) {
			bad++;
			tap_diag("  kind of '%s' = %d, want %d", t[i].name, (int)got, (int)t[i].kind);
		}
	}
	is_int(bad, 0, "init kind of %zu Llama/Qwen3/Qwen3-MoE names", sizeof(t) / sizeof(t[0]));

	/* hp_init_tensor and hp_init_slice follow the kind. */
	float v[37];
	int ones = 0, zeros = 0;
	memset(v, 0, sizeof(v));
	hp_init_tensor(v, NULL, 1, "model.layers.0.self_attn.q_norm.weight", 37, 0.02f);
	for (int i = 0; i < 37; i++)
		ones += v[i] == 1.0f;
	memset(v, 0xff, sizeof(v));
	hp_init_slice(v, NULL, 1, "model.layers.0.self_attn.q_proj.bias", 100, 37, 0.02f);
	for (int i = 0; i < 37; i++)
		zeros += f2u(v[i]) == 0;
	is_int(ones, 37, "a norm weight is ones");
	is_int(zeros, 37, "a bias is +0");
}

static void test_pad_row(void)
{
	/* A [5, 7] embedding with pad row 2 (elements 14..20), cut in three. */
	enum { R = 5, C = 7 };
	float whole[R * C], part[R * C];
	const char *name = "model.embed_tokens.weight";
	static const size_t cut[4] = { 0, 16, 19, R * C };
	int bad = 0;

	hp_init_tensor(whole, NULL, 3, name, R * C, 0.02f);
	hp_init_zero_row_slice(whole, 0, R * C, 2, C);
	for (int i = 0; i < R * C; i++) {
		int pad = i >= 2 * C && i < 3 * C;
		bad += pad ? f2u(whole[i]) != 0 : whole[i] == 0.0f;
	}
	is_int(bad, 0, "pad row zeroed, others left");
	for (int s = 0; s < 3; s++) {
		hp_init_slice(part + cut[s], NULL, 3, name, cut[s], cut[s + 1] - cut[s], 0.02f);
		hp_init_zero_row_slice(part + cut[s], cut[s], cut[s + 1] - cut[s], 2, C);
	}
	ok(!memcmp(whole, part, sizeof(whole)), "pad row zeroed slice by slice equals whole");
	memcpy(part, whole, sizeof(part));
	hp_init_zero_row_slice(part, 0, R * C, -1, C);
	ok(!memcmp(whole, part, sizeof(whole)), "no pad row (-1) changes nothing");
}

/* A spec of model_type type, by hand: only the fields init reads. */
static void gdn_spec(struct hp_model_spec *s, const char *type, const char *tf_version)
{
	memset(s, 0, sizeof(*s));
	snprintf(s->model_type, sizeof(s->model_type), "%s", type);
	snprintf(s->transformers_version, sizeof(s->transformers_version), "%s", tf_version);
	if (!strcmp(type, "llama"))
		return;
	s->norm_zc = 1;
	s->lin_split = strcmp(type, "qwen3_next") != 0;
}

static void test_gdn_kinds(void)
{
	static const struct { const char *name; enum hp_init_kind kind; } t[] = {
		/* the zero-centred RMSNorms (x_hat * (1 + w)): zeros */
		{ "model.layers.0.input_layernorm.weight", HP_INIT_ZEROS },
		{ "model.layers.0.post_attention_layernorm.weight", HP_INIT_ZEROS },
		{ "model.layers.3.self_attn.q_norm.weight", HP_INIT_ZEROS },
		{ "model.layers.3.self_attn.k_norm.weight", HP_INIT_ZEROS },
		{ "model.norm.weight", HP_INIT_ZEROS },
		/* the Gated DeltaNet: its gated norm is plain (ones), dt_bias ones */
		{ "model.layers.0.linear_attn.norm.weight", HP_INIT_ONES },
		{ "model.layers.0.linear_attn.dt_bias", HP_INIT_ONES },
		{ "model.layers.0.linear_attn.A_log", HP_INIT_LOG_UNIFORM },
		{ "model.layers.46.linear_attn.A_log", HP_INIT_LOG_UNIFORM },
		{ "model.layers.0.linear_attn.conv1d.weight", HP_INIT_NORMAL },
		{ "model.layers.0.linear_attn.in_proj_qkvz.weight", HP_INIT_NORMAL },
		{ "model.layers.0.linear_attn.in_proj_ba.weight", HP_INIT_NORMAL },
		{ "model.layers.0.linear_attn.in_proj_qkv.weight", HP_INIT_NORMAL },
		{ "model.layers.0.linear_attn.in_proj_z.weight", HP_INIT_NORMAL },
		{ "model.layers.0.linear_attn.in_proj_b.weight", HP_INIT_NORMAL },
		{ "model.layers.0.linear_attn.in_proj_a.weight", HP_INIT_NORMAL },
		{ "model.layers.0.linear_attn.out_proj.weight", HP_INIT_NORMAL },
		/* gated attention, MoE with the gated shared expert */
		{ "model.layers.3.self_attn.q_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.3.self_attn.o_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.0.mlp.gate.weight", HP_INIT_NORMAL },
		{ "model.layers.0.mlp.experts.gate_up_proj", HP_INIT_NORMAL },
		{ "model.layers.0.mlp.experts.7.down_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.0.mlp.shared_expert.gate_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.0.mlp.shared_expert.up_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.0.mlp.shared_expert.down_proj.weight", HP_INIT_NORMAL },
		{ "model.layers.0.mlp.shared_expert_gate.weight", HP_INIT_NORMAL },
		{ "model.embed_tokens.weight", HP_INIT_NORMAL },
		{ "lm_head.weight", HP_INIT_NORMAL },
		/* the name rules are whole components */
		{ "model.layers.0.linear_attn.xdt_bias", HP_INIT_NORMAL },
		{ "model.layers.0.xlinear_attn.A_log", HP_INIT_NORMAL },
		{ "model.layers.0.linear_attn.A_log.x", HP_INIT_NORMAL },
	};
	static const char *const types[] = { "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text" };
	struct hp_model_spec s;

	for (size_t f = 0; f < sizeof(types) / sizeof(types[0]); f++) {
		int bad = 0;

		gdn_spec(&s, types[f], "5.24.0");
		for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
			enum hp_init_kind got = hp_init_kind_for(&s, t[i].name);
			if (got != t[i].kind) {
				bad++;
				tap_diag("  %s: kind of '%s' = %d, want %d", types[f], t[i].name, (int)got,
					 (int)t[i].kind);
			}
		}
		is_int(bad, 0, "init kind of %zu %s names", sizeof(t) / sizeof(t[0]), types[f]);
	}

	/* Without norm_zc the norms stay ones; the GDN names are the name's own. */
	gdn_spec(&s, "llama", "");
	is_int(hp_init_kind_for(&s, "model.layers.0.input_layernorm.weight"), HP_INIT_ONES,
	       "llama (norm_zc 0): input_layernorm is ones");
	is_int(hp_init_kind_for(&s, "model.norm.weight"), HP_INIT_ONES, "llama: model.norm is ones");
	is_int(hp_init_kind_for(NULL, "model.layers.0.input_layernorm.weight"), HP_INIT_ONES,
	       "no spec: input_layernorm is ones");
	is_int(hp_init_kind_for(NULL, "model.layers.0.linear_attn.A_log"), HP_INIT_LOG_UNIFORM,
	       "no spec: A_log by its name");
	is_int(hp_init_kind_of("model.layers.0.linear_attn.dt_bias"), HP_INIT_ONES, "dt_bias by its name");

	/* A_log's lower bound: 4.57's Qwen3-Next uniform_(0, 16), 5.x's (0.01, 16) */
	gdn_spec(&s, "qwen3_next", "4.57.0.dev0");
	ok(hp_init_log_uniform_lo(&s) == 0.0, "qwen3_next under transformers 4.x: lo 0");
	gdn_spec(&s, "qwen3_next", "5.24.0");
	ok(hp_init_log_uniform_lo(&s) == 0.01, "qwen3_next under transformers 5.x: lo 0.01");
	gdn_spec(&s, "qwen3_next", "");
	ok(hp_init_log_uniform_lo(&s) == 0.01, "qwen3_next, no transformers_version: lo 0.01 (5.x)");
	gdn_spec(&s, "qwen3_5_text", "5.24.0");
	ok(hp_init_log_uniform_lo(&s) == 0.01, "qwen3_5_text: lo 0.01");
	gdn_spec(&s, "qwen3_5_moe_text", "4.99.0");
	ok(hp_init_log_uniform_lo(&s) == 0.01, "qwen3_5_moe_text: lo 0.01 whatever the version");
	ok(hp_init_log_uniform_lo(NULL) == 0.01, "no spec: lo 0.01");

	/* hp_init_slice follows the spec's kinds: +0 norms, ones elsewhere. */
	float v[41];
	int zeros = 0, ones = 0, gated = 0, llama = 0;

	gdn_spec(&s, "qwen3_5_text", "5.24.0");
	memset(v, 0xff, sizeof(v));
	hp_init_slice(v, &s, 1, "model.layers.2.input_layernorm.weight", 7, 41, 0.02f);
	for (int i = 0; i < 41; i++)
		zeros += f2u(v[i]) == 0;
	hp_init_tensor(v, &s, 1, "model.layers.2.linear_attn.dt_bias", 41, 0.02f);
	for (int i = 0; i < 41; i++)
		ones += v[i] == 1.0f;
	hp_init_tensor(v, &s, 1, "model.layers.2.linear_attn.norm.weight", 41, 0.02f);
	for (int i = 0; i < 41; i++)
		gated += v[i] == 1.0f;
	gdn_spec(&s, "llama", "");
	hp_init_tensor(v, &s, 1, "model.layers.2.input_layernorm.weight", 41, 0.02f);
	for (int i = 0; i < 41; i++)
		llama += v[i] == 1.0f;
	is_int(zeros, 41, "qwen3_5_text: input_layernorm is +0");
	is_int(ones, 41, "qwen3_5_text: dt_bias is ones");
	is_int(gated, 41, "qwen3_5_text: linear_attn.norm is ones");
	is_int(llama, 41, "llama: input_layernorm is ones");
}

/*
 * E[ln X] and sd(ln X) for X uniform on (lo, 16], from the antiderivatives
 * of ln x (x ln x - x) and ln^2 x (x (ln^2 x - 2 ln x + 2)); x ln x -> 0 at 0.
 */
static void log_uniform_moments(double lo, double *mean, double *sd)
{
	double w = 16.0 - lo, l16 = log(16.0), llo = lo > 0 ? log(lo) : 0.0;
	double m1 = (16.0 * (l16 - 1.0) - lo * (llo - 1.0)) / w;
	double m2 = (16.0 * (l16 * l16 - 2.0 * l16 + 2.0) - lo * (llo * llo - 2.0 * llo + 2.0)) / w;

	*mean = m1;
	*sd = sqrt(m2 - m1 * m1);
}

static void test_a_log(void)
{
	enum { N = 4096 };
	static float whole[N], part[N];
	const char *name = "model.layers.0.linear_attn.A_log";
	struct hp_model_spec s;
	static const struct { const char *type, *tf; double lo; } fam[] = {
		{ "qwen3_next", "4.57.0.dev0", 0.0 },
		{ "qwen3_next", "5.24.0", 0.01 },
		{ "qwen3_5_text", "5.24.0", 0.01 },
		{ "qwen3_5_moe_text", "5.24.0", 0.01 },
	};

	for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
		double lo = fam[f].lo, mean, sd, sum = 0;
		/* the float bounds: (float)ln of lo and of 16 bracket every value
		 * (ln 0 is -inf, so lo 0 asks only for finite values) */
		float flo = lo > 0 ? (float)log(lo) : -INFINITY, fhi = (float)log(16.0);
		int out = 0;

		gdn_spec(&s, fam[f].type, fam[f].tf);
		hp_init_tensor(whole, &s, 77, name, N, 0.02f);
		for (int i = 0; i < N; i++) {
			out += !(isfinite(whole[i]) && whole[i] > flo && whole[i] <= fhi);
			sum += whole[i];
		}
		is_int(out, 0, "%s %s: %d A_log values in (ln %g, ln 16]", fam[f].type, fam[f].tf, N, lo);
		/* The mean of N draws has standard error sd / sqrt(N) = 0.0156 or
		 * less (sd is 1 for lo 0, where -ln(U(0,1)) is exponential, a
		 * little under it for 0.01); 5 of them is a test that a right
		 * generator cannot fail by chance, while a wrong upper bound, a
		 * missed ln or a normal in place of the uniform moves the mean
		 * by far more.  (lo 0 against 0.01 moves it by 0.005 only: the
		 * bounds above and the pinned bits below tell those apart.)
		 * The draw is fixed: it passes always or never. */
		log_uniform_moments(lo, &mean, &sd);
		double tol = 5.0 * sd / sqrt((double)N);
		tap_diag("  %s %s: mean %.5f, E[ln U(%g, 16)] %.5f, tolerance %.4f", fam[f].type,
			 fam[f].tf, sum / N, lo, mean, tol);
		ok(fabs(sum / N - mean) < tol, "%s %s: mean of A_log is E[ln U(%g, 16)] = %.4f",
		   fam[f].type, fam[f].tf, lo, mean);

		/* slices, back to front and mid-tensor, equal the whole */
		static const size_t cut[] = { 0, 1, 2, 333, 334, 2049, 4095, N };
		memset(part, 0xff, sizeof(part));
		for (int c = (int)(sizeof(cut) / sizeof(cut[0])) - 2; c >= 0; c--)
			hp_init_slice(part + cut[c], &s, 77, name, cut[c], cut[c + 1] - cut[c], 0.02f);
		ok(!memcmp(whole, part, sizeof(whole)), "%s %s: A_log slices equal the whole tensor",
		   fam[f].type, fam[f].tf);
	}

	/* std does not enter; the seed and name do */
	gdn_spec(&s, "qwen3_5_text", "5.24.0");
	hp_init_tensor(part, &s, 77, name, N, 1.0f);
	hp_init_tensor(whole, &s, 77, name, N, 0.02f);
	ok(!memcmp(whole, part, sizeof(whole)), "A_log ignores std");
	int same = 0;
	hp_init_tensor(part, &s, 78, name, 256, 0.02f);
	for (int i = 0; i < 256; i++)
		same += f2u(part[i]) == f2u(whole[i]);
	hp_init_tensor(part, &s, 77, "model.layers.1.linear_attn.A_log", 256, 0.02f);
	for (int i = 0; i < 256; i++)
		same += f2u(part[i]) == f2u(whole[i]);
	is_int(same, 0, "A_log of another seed or layer differs");

	/* Bit-identical to the Python reference in the header comment. */
	uint64_t key = hp_init_key(5, name);
	static const struct { uint64_t i, bits; } ud[] = {
		{ 0, 0x3fd0330a198bfb5cull }, { 1, 0x3fc6d88dd3309300ull },
		{ (1ull << 33) + 1, 0x3fc7a1b0aa72b508ull },
	};
	int bad = 0;
	for (size_t t = 0; t < sizeof(ud) / sizeof(ud[0]); t++)
		bad += d2u(hp_init_uniform_at(key, ud[t].i)) != ud[t].bits;
	is_int(bad, 0, "A_log's uniforms bit-identical to the Python reference");
	static const uint32_t al[2][5] = {
		{ 0x3fb307e3, 0x3f865078, 0x3f59fbd6, 0x400e9a7a, 0x3f8aa471 },   /* lo 0 */
		{ 0x3fb34443, 0x3f86ae99, 0x3f5aea23, 0x400ea1e2, 0x3f8afec4 },   /* lo 0.01 */
	};
	static const uint64_t at[5] = { 0, 1, 2, 3, (1ull << 33) + 1 };
	bad = 0;
	for (int l = 0; l < 2; l++) {
		gdn_spec(&s, "qwen3_next", l ? "5.24.0" : "4.57.0.dev0");
		for (int t = 0; t < 5; t++) {
			float one;
			hp_init_slice(&one, &s, 5, name, at[t], 1, 0.02f);
			if (f2u(one) != al[l][t]) {
				bad++;
				tap_diag("  lo %d element %llu: %08x, want %08x", l, (unsigned long long)at[t],
					 f2u(one), al[l][t]);
			}
			bad += f2u((float)hp_init_log_uniform_at(key, at[t], l ? 0.01 : 0.0)) != al[l][t];
		}
	}
	is_int(bad, 0, "A_log floats bit-identical to the Python reference (lo 0 and 0.01)");
}

int main(void)
{
	test_philox_kat();
	test_pinned();
	test_slices();
	test_streams();
	test_stats();
	test_kinds();
	test_pad_row();
	test_gdn_kinds();
	test_a_log();
	return tap_done();
}
