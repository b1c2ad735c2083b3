/*
 * init.h - deterministic random initialization of a model built from its
 * config (model._target_: ...from_config), as HF's _init_weights does it
 * for Llama, Qwen3, Qwen3-MoE and the other families of hfconfig.h,
 * Qwen3-Next and Qwen3.5 among them.
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
 * Qwen3-Next and Qwen3.5 (model types qwen3_next, qwen3_5_text,
 * qwen3_5_moe_text; Qwen3NextPreTrainedModel._init_weights and
 * Qwen3_5*PreTrainedModel._init_weights) change three things:
 *  - their RMSNorms are zero-centred (x_hat * (1 + weight), spec->norm_zc),
 *    so every "...norm.weight" is zeros (input_layernorm,
 *    post_attention_layernorm, model.norm, self_attn.q_norm, k_norm),
 *    EXCEPT the Gated DeltaNet's gated norm "...linear_attn.norm.weight"
 *    (Qwen3NextRMSNormGated, a plain x_hat * weight): ones;
 *  - linear_attn.dt_bias: ones;
 *  - linear_attn.A_log: ln(uniform(lo, 16)), one value per value head, with
 *    lo = 0 for a qwen3_next config whose transformers_version is 4.x
 *    (4.57's uniform_(0, 16)) and lo = 0.01 otherwise (every 5.x family,
 *    whose _init_weights keep the bound away from 0 so ln is finite; also
 *    the choice without a spec, and with no transformers_version, as
 *    hfconfig.c's other 4.x/5.x choices read it); drawn by step 7 below.
 * Their Linear and Conv1d weights (in_proj_qkvz, in_proj_ba, in_proj_qkv,
 * in_proj_z, in_proj_b, in_proj_a, conv1d, out_proj, the gated attention's
 * q/k/v/o_proj, mlp.shared_expert.*, mlp.shared_expert_gate) are
 * normal(0, initializer_range) as above; conv1d and the projections have no
 * bias.
 * hp_init_kind_of() decides from the HF parameter name alone (dt_bias and
 * A_log included, as no other family has those names);
 * hp_init_kind_for() adds what needs the spec: with norm_zc set, a norm
 * other than linear_attn.norm is zeros.  The pad row is the caller's to
 * zero (hp_init_zero_row_slice), since only it knows pad_token_id.  With
 * tie_word_embeddings lm_head is the embedding, so it is drawn once, under
 * the name "model.embed_tokens.weight".
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
 *  7. A_log (HP_INIT_LOG_UNIFORM), std unused: element i is its own Philox
 *     call under the same key, on a counter the normal stream never uses
 *     (its third word is 1, theirs 0): x[0..3] = Philox4x32-10(counter =
 *     (i & 0xffffffff, i >> 32, 1, 0), key = (k0, k1)); only x[0], x[1]
 *     are used: a = ((x[1] << 32 | x[0]) >> 11), u = (a + 1) * 2^-53, in
 *     (0, 1].  In IEEE double, rounded to nearest, no fused multiply-add:
 *     w = 16 - lo, y = lo + w * u (the product rounded, then the sum), and
 *     the element is (float)hp_init_ln(y), with lo the double 0 or 0.01
 *     (the one nearest 0.01) as above.  So every element lies in
 *     (ln lo, ln 16] (lo = 0: ln 16 - 53 ln 2 at the least, finite), its
 *     distribution that of ln(uniform(lo, 16)).
 *
 * Pair lanes keep every element a function of its own index: a slice may
 * start or end in the middle of a pair.  Differences in the last bit
 * between two implementations of steps 1-7 are bugs, not noise.
 */
#ifndef HP_INIT_H
#define HP_INIT_H

#include <stddef.h>
#include <stdint.h>

struct hp_model_spec;   /* config/hfconfig.h */

/* Kind of init for a parameter, decided from its HF name (and the spec). */
enum hp_init_kind {
	HP_INIT_NORMAL,        /* normal(0, std): Linear, Conv1d and Embedding weights, experts, router */
	HP_INIT_ONES,          /* RMSNorm weights, Gated DeltaNet's dt_bias and gated norm */
	HP_INIT_ZEROS,         /* biases; zero-centred RMSNorm weights (norm_zc) */
	HP_INIT_LOG_UNIFORM,   /* ln(uniform(lo, 16)): Gated DeltaNet's A_log (step 7) */
};

/*
 * The rules of the name alone: "...norm.weight" -> HP_INIT_ONES
 * (input_layernorm, post_attention_layernorm, model.norm, q_norm, k_norm,
 * linear_attn.norm); "linear_attn.dt_bias" as the last two components ->
 * HP_INIT_ONES; "linear_attn.A_log" -> HP_INIT_LOG_UNIFORM; "...bias" as
 * the last component -> HP_INIT_ZEROS; anything else -> HP_INIT_NORMAL.
 */
enum hp_init_kind hp_init_kind_of(const char *hf_name);

/*
 * The kind under spec s: hp_init_kind_of(hf_name), except that with
 * s->norm_zc (Qwen3-Next, Qwen3.5) a "...norm.weight" other than
 * "linear_attn.norm.weight" is HP_INIT_ZEROS.  s NULL: the name rules only.
 */
enum hp_init_kind hp_init_kind_for(const struct hp_model_spec *s, const char *hf_name);

/*
 * A_log's lower bound lo under spec s (step 7): 0 for model_type qwen3_next
 * with a transformers_version of 4.x, else 0.01 (s NULL included).
 */
double hp_init_log_uniform_lo(const struct hp_model_spec *s);

/*
 * Fill dst[0..n) with the elements [first, first + n) (flat, row-major
 * indices into the GLOBAL tensor) of tensor name drawn for seed:
 * normal(0, std) by the generator above.  A pure function of
 * (seed, name, index): an element gets the same bits whatever slice it is
 * generated in.
 */
void hp_init_normal_slice(float *dst, uint64_t seed, const char *name, uint64_t first,
			  size_t n, float std);

/*
 * The same slice, filled by hp_init_kind_for(s, name): normal(0, std), ones,
 * zeros, or A_log's ln(uniform(hp_init_log_uniform_lo(s), 16)).  s may be
 * NULL (the name rules only).  Still a pure function of (seed, name, index)
 * for a given spec.
 */
void hp_init_slice(float *dst, const struct hp_model_spec *s, uint64_t seed, const char *name,
		   uint64_t first, size_t n, float std);

/* A whole tensor of numel elements, by kind: hp_init_slice from 0. */
void hp_init_tensor(float *dst, const struct hp_model_spec *s, uint64_t seed, const char *name,
		    size_t numel, float std);

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
/* Element i's uniform u in (0, 1] of key's A_log stream (step 7). */
double hp_init_uniform_at(uint64_t key, uint64_t i);
/* Element i of ln(uniform(lo, 16)) of key, in double before the float rounding (step 7). */
double hp_init_log_uniform_at(uint64_t key, uint64_t i, double lo);

#endif
