/*
 * init.h - deterministic random initialization of a model built from its
 * config (model._target_: ...from_config), as HF's _init_weights does it
 * for Llama, Qwen3 and Qwen3-MoE.
 *
 * What HF does (PreTrainedModel._init_weights, and the older per-model
 * copies in modeling_llama.py / modeling_qwen3*.py):
 *  - nn.Linear weights (q/k/v/o_proj, gate/up/down_proj, lm_head, the MoE
 *    router mlp.gate, every expert's projections, or the fused expert
 *    tensors mlp.experts.gate_up_proj / down_proj of newer releases):
 *    normal(0, initializer_range);
 *  - nn.Linear biases (attention_bias, mlp_bias): zeros, and GPT-OSS's
 *    expert biases; GPT-OSS's router bias mlp.router.bias and attention
 *    sinks self_attn.sinks: normal(0, initializer_range);
 *  - nn.Embedding: normal(0, initializer_range), then the row padding_idx
 *    (= config.pad_token_id when set) zeroed;
 *  - RMSNorm weights (input_layernorm, post_attention_layernorm, model.norm,
 *    Qwen3's q_norm and k_norm): ones.
 * hp_init_kind_of() decides this from the HF parameter name alone; the pad
 * row is the caller's to zero (hp_init_zero_row_slice), since only it knows
 * pad_token_id.  With tie_word_embeddings lm_head is the embedding, so it
 * is drawn once, under the name "model.embed_tokens.weight".
 *
 * What this is not: a copy of torch's generator.  The values are not those
 * of torch.manual_seed(s) + from_config; only the distribution is.  They are
 * instead a pure function of (seed, tensor name, flat element index), so any
 * rank can generate exactly its slice of any tensor and the global weights
 * never depend on world size, sharding or the order tensors are visited in.
 *
 * The generator, exactly (so another implementation reproduces it bit for
 * bit; t/unit/test-init.c carries a Python reference and pins its values):
 *
 *  1. name hash: h = FNV-1a 64 over the bytes of name (no terminator):
 *     h = 0xcbf29ce484222325; for each byte b: h = (h ^ b) * 0x100000001b3.
 *  2. mix(z) is splitmix64's finalizer, all mod 2^64:
 *     z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9; z = (z ^ z >> 27) *
 *     0x94d049bb133111eb; return z ^ z >> 31.
 *     key = mix(mix(seed + 0x9e3779b97f4a7c15) ^ h); the Philox key is
 *     k0 = key & 0xffffffff, k1 = key >> 32.
 *  3. element i (0-based, row-major in the global tensor) belongs to pair
 *     c = i >> 1 and lane i & 1.  x[0..3] = Philox4x32-10(counter =
 *     (c & 0xffffffff, c >> 32, 0, 0), key = (k0, k1)), Random123's
 *     definition (multipliers 0xd2511f53, 0xcd9e8d57; key bumps 0x9e3779b9,
 *     0xbb67ae85 between rounds; its published known answers hold).
 *  4. two 53-bit uniforms from the four words:
 *     a = ((x[1] << 32 | x[0]) >> 11), u1 = (a + 1) * 2^-53, in (0, 1];
 *     b = ((x[3] << 32 | x[2]) >> 11), u2 = b * 2^-53, in [0, 1).
 *  5. Box-Muller in IEEE double, every operation rounded to nearest, no
 *     fused multiply-add: r = sqrt(-2 * ln(u1)), and lane 0 takes
 *     r * cos(2 pi u2), lane 1 r * sin(2 pi u2).  ln, cos and sin are NOT
 *     libm's (which differs between glibc versions, CUDA and others in the
 *     last bit) but the fixed sequences of +, -, *, / written out in init.c
 *     (hp_init_ln, hp_init_sincos2pi), accurate to a few 1e-16.
 *  6. the element is (float)((double)std * z): one rounding to float.
 *
 * Pair lanes keep every element a function of its own index: a slice may
 * start or end in the middle of a pair.  Differences in the last bit
 * between two implementations of steps 1-6 are bugs, not noise.
 */
#ifndef HP_INIT_H
#define HP_INIT_H

#include <stddef.h>
#include <stdint.h>

/* Kind of init for a parameter, decided from its HF name. */
enum hp_init_kind {
	HP_INIT_NORMAL,   /* normal(0, std): Linear and Embedding weights, experts, router */
	HP_INIT_ONES,     /* RMSNorm weights */
	HP_INIT_ZEROS,    /* biases */
};

/*
 * "...norm.weight" -> HP_INIT_ONES (input_layernorm, post_attention_layernorm,
 * model.norm, q_norm, k_norm); "...bias" as the last component ->
 * HP_INIT_ZEROS; anything else -> HP_INIT_NORMAL.
 */
enum hp_init_kind hp_init_kind_of(const char *hf_name);

/*
 * Fill dst[0..n) with the elements [first, first + n) (flat, row-major
 * indices into the GLOBAL tensor) of tensor name drawn for seed:
 * normal(0, std) by the generator above.  A pure function of
 * (seed, name, index): an element gets the same bits whatever slice it is
 * generated in.
 */
void hp_init_normal_slice(float *dst, uint64_t seed, const char *name, uint64_t first,
			  size_t n, float std);

/* The same slice, filled by hp_init_kind_of(name): normal, ones or zeros. */
void hp_init_slice(float *dst, uint64_t seed, const char *name, uint64_t first, size_t n,
		   float std);

/* A whole tensor of numel elements, by kind: hp_init_slice from 0. */
void hp_init_tensor(float *dst, uint64_t seed, const char *name, size_t numel, float std);

/*
 * Zero the part of row `row` of a [rows, cols] row-major tensor that falls in
 * the slice dst = elements [first, first + n): HF's padding_idx row of the
 * embedding.  A negative row (no pad_token_id) does nothing.
 */
void hp_init_zero_row_slice(float *dst, uint64_t first, size_t n, int64_t row, int64_t cols);

/*
 * The pieces, exposed for the known-answer tests and for anyone checking
 * another implementation against this one.
 */
/* Random123's Philox4x32-10 of ctr under key, into out. */
void hp_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* The 64-bit key of (seed, name): steps 1-2. */
uint64_t hp_init_key(uint64_t seed, const char *name);
/* Element i of the standard normal stream of key, in double (steps 3-5). */
double hp_init_normal_at(uint64_t key, uint64_t i);

#endif
