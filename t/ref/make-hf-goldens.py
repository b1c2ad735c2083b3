#!/usr/bin/env python3
"""Goldens from transformers itself: every family x RoPE type, as 4.x and 5.x write them.

    t/ref/make-hf-goldens.sh            (makes the venvs, then runs this once per line)

Run directly only inside one of those environments:

    python make-hf-goldens.py OUTDIR LINE [FAMILY|FOLDER...]   (LINE is "4" or "5")

(FAMILY: all that family's folders; FOLDER: that folder alone, e.g.
qwen2-window or llama-default-pad; none: all folders.)

For each family (llama, mistral, qwen2, qwen3, qwen3_moe) and each RoPE type
(default, linear, dynamic, yarn, llama3), and for gpt_oss (default, yarn
as gpt-oss ships it), and for mistral, qwen2 and gpt_oss with a sliding
window of 8 (<family>-window: shorter than the rows, so it masks keys),
and for deepseek_v3 (default; yarn as DeepSeek-V3 ships it, mscale and
mscale_all_dim; nolora: a plain q_proj, rotate_half RoPE, biases, one
expert group, no renormalisation, v_head_dim > qk_head_dim),
and for the Gated DeltaNet hybrids qwen3_next (both lines), qwen3_5 and
qwen3_5_moe (their text models, 5.x only) (default; yarn on the 4 rotary
dimensions of partial_rotary_factor 0.25; qwen3_next-long in 5.x: rows of
96 tokens, across the delta rule's chunk of 64),
it builds the model with
transformers' own config class and AutoModelForCausalLM.from_config, draws
weights from a fixed seed, writes the folder with save_pretrained (so
config.json is what that release line writes), and records with the same
model, in float64 (model.double(): transformers' float32 islands, the RoPE
table, RMSNorm and the softmaxes, and the gated delta rule, stay as
transformers has them):

  reference.json      the batch, loss_f64 (aux included for the MoE), the
                      inverse frequencies and attention scaling of the
                      model's rotary embedding, the loss of the same weights
                      under default RoPE (so a test knows the RoPE type
                      matters), five torch.optim.AdamW steps in float32
                      (hp-train's optimizer settings), router margins;
                      gpt_oss also the SwiGLU clamp counts and the loss with
                      the sinks, the clamp or the biases taken out;
                      deepseek_v3 the softmax scaling, its own router
                      margins (sigmoid choice and group scores), the tokens
                      per expert and the loss without the correction bias or
                      without the shared experts;
                      the hybrids the loss with the attention output gate
                      open, the shared expert gate open, the conv an
                      identity or dt_bias 0, the delta rule's code path,
                      and (MoE) the tokens per expert and the loss and aux
                      loss with output_router_logits true;
                      a -window folder also the loss with the window
                      taken out (all layers full attention), and the
                      window it was checked to apply
  logits.safetensors  logits of batch row 0, float64 stored F32
  grads.safetensors   d loss / d parameter under HF names, float64 stored F32
                      (5.x's and gpt_oss's stacked experts under hp's
                      per-expert names)

(qwen3_5 and qwen3_5_moe have no folders in line 4: 4.57.6 lacks them.)

and reloads the folder with from_pretrained to check it gives the same
loss.  Folders go to OUTDIR/tf<LINE>/<family>-<rope>/.  Two runs write the
same bytes (fixed seeds, one thread).
"""
import copy
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from torch.nn import functional as F
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hfnames import hub_names  # noqa: E402

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
transformers.utils.logging.disable_progress_bar()

OUT, LINE = sys.argv[1], sys.argv[2]
WANT = {"4": "4.57.6", "5": "5.24.0"}[LINE]
if transformers.__version__ != WANT:
    sys.exit("make-hf-goldens: transformers %s, expected %s" % (transformers.__version__, WANT))

BATCH, SEQ, VOCAB = 2, 32, 64
BATCH_SEED = 20251201
IGNORED = [(0, 3), (0, 17), (1, 0), (1, 31)]
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
STEPS = 5
GAP_MIN = 5e-4   # smallest k-th vs (k+1)-th router logit gap: any fp32 order routes alike
# deepseek_v3's margins are taken on more comparisons (choice and group
# scores, sigmoid-compressed): about one seed in ten or twenty passes
# (routes_apart screens them cheaply)
TRIES = {"deepseek_v3": 500}

FAMILIES = {
    # Llama-3.2-shaped: tied embeddings, no biases
    "llama": dict(model_type="llama", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
                  tie_word_embeddings=True, attention_bias=False),
    # a window no shorter than the rows is full attention; head_dim given
    # (= 32 / 4), since 4.57's dynamic and yarn RoPE fail on MistralConfig's
    # head_dim None
    "mistral": dict(model_type="mistral", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10000.0,
                    sliding_window=SEQ, tie_word_embeddings=False),
    # q/k/v biases; layer 1 has a sliding window (of the rows' length)
    "qwen2": dict(model_type="qwen2", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, rope_theta=1000000.0,
                  use_sliding_window=True, sliding_window=SEQ, max_window_layers=1,
                  tie_word_embeddings=False),
    # head_dim 16 != 32 / 4, all four biases
    "qwen3": dict(model_type="qwen3", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1000000.0,
                  attention_bias=True, tie_word_embeddings=False),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      rope_theta=10000.0, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=16, norm_topk_prob=True, output_router_logits=True,
                      router_aux_loss_coef=0.01, decoder_sparse_step=1, mlp_only_layers=[],
                      tie_word_embeddings=False),
    # attention sinks, biases everywhere, a router with a bias, experts stacked
    # with interleaved gate/up columns and biases, the clamped SwiGLU (a limit
    # low enough that both clamps act), layer 0 with a window of the rows'
    # length (full attention); no aux loss (output_router_logits false, as
    # gpt-oss ships); swiglu_alpha left at its default 1.702
    "gpt_oss": dict(model_type="gpt_oss", hidden_size=32, intermediate_size=24,
                    num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
                    sliding_window=SEQ, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    rope_theta=10000.0, num_local_experts=4, num_experts_per_tok=2,
                    attention_bias=True, tie_word_embeddings=False, output_router_logits=False,
                    rms_norm_eps=1e-5, swiglu_limit=0.5),
    # multi-head latent attention (q and kv LoRA with their norms, a shared
    # rotary key, v_head_dim 12 != qk_head_dim 16, interleaved RoPE), layer 0
    # dense then MoE: 8 sigmoid-scored experts in 4 groups (top-2 groups, then
    # top-2 experts) with the e_score_correction_bias, weights renormalised
    # and scaled by 2.5, two shared experts; no aux loss.  Appended last, so
    # the seeds of the families above stay put
    "deepseek_v3": dict(model_type="deepseek_v3", hidden_size=32, intermediate_size=48,
                        moe_intermediate_size=16, num_hidden_layers=3, first_k_dense_replace=1,
                        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8,
                        n_shared_experts=2, num_experts_per_tok=2, n_group=4, topk_group=2,
                        norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True,
                        attention_bias=False, tie_word_embeddings=False, rope_theta=10000.0),
    # hybrid: layers 0 and 2 Gated DeltaNet (linear attention: in_proj_qkvz
    # and in_proj_ba, a depthwise causal conv of 4 taps, the gated delta rule
    # with GQA, 2 key heads for 4 value heads, A_log, dt_bias, a gated
    # RMSNorm), layers 1 and 3 full attention with the output gate (q_proj
    # twice as wide), q/k norms and RoPE on 4 of head_dim 16; zero-centred
    # RMSNorms (1 + w); layer 0 a dense SwiGLU (mlp_only_layers), the others
    # 4 experts top-2 plus a shared expert behind a sigmoid gate; no aux loss.
    # Appended last (and the two below), so the seeds above stay put
    "qwen3_next": dict(model_type="qwen3_next", hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                       layer_types=["linear_attention", "full_attention"] * 2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.25,
                       attention_bias=False, linear_num_key_heads=2, linear_num_value_heads=4,
                       linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                       num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                       shared_expert_intermediate_size=24, decoder_sparse_step=1, mlp_only_layers=[0],
                       norm_topk_prob=True, output_router_logits=False, tie_word_embeddings=False,
                       rope_theta=10000.0),
    # 5.x only: Qwen3.5's text model (Qwen3_5ForCausalLM, model_type
    # qwen3_5_text): qwen3_next's layers with in_proj_qkv, in_proj_z,
    # in_proj_b and in_proj_a apart, every MLP dense
    "qwen3_5": dict(model_type="qwen3_5_text", hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                    layer_types=["linear_attention", "full_attention"] * 2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.25,
                    attention_bias=False, linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                    tie_word_embeddings=False, rope_theta=10000.0),
    # 5.x only: Qwen3.5-MoE's text model (Qwen3_5MoeForCausalLM, model_type
    # qwen3_5_moe_text): every layer MoE with the shared expert; its config
    # has no intermediate_size, mlp_only_layers, decoder_sparse_step or
    # norm_topk_prob (the router always renormalises)
    "qwen3_5_moe": dict(model_type="qwen3_5_moe_text", hidden_size=32, num_hidden_layers=4,
                        layer_types=["linear_attention", "full_attention"] * 2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.25,
                        attention_bias=False, linear_num_key_heads=2, linear_num_value_heads=4,
                        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                        shared_expert_intermediate_size=24, output_router_logits=False,
                        tie_word_embeddings=False, rope_theta=10000.0),
}
# the families with Gated DeltaNet layers, and the line each needs
DELTA = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
LINES = {"qwen3_5": "5", "qwen3_5_moe": "5"}
# the scaled types with a short original context, so that every band and ramp
# of llama3 and yarn falls inside the 32 positions of the batch
ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
}
# gpt_oss: default, and yarn as gpt-oss ships it (beta 32/1, truncate false,
# theta 150000), with the short original context of the others
FAMILY_ROPES = {
    "gpt_oss": {
        "default": None,
        "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                 "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0},
    },
    # deepseek_v3: default; yarn as DeepSeek-V3 ships it (beta 32/1, mscale 1
    # and mscale_all_dim 0.8 != 1, so that both the cos/sin factor and the
    # softmax scale's mscale^2 differ from 1), with the short original
    # context; nolora: default RoPE and the VARIANTS changes below
    "deepseek_v3": {
        "default": None,
        "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8},
        "nolora": None,
    },
    # the hybrids: default and yarn (as the other families', on the 4
    # rotary dimensions); qwen3_next's -long (5.x): default RoPE, rows of
    # 96 tokens, so that the delta rule's chunks of 64 meet a boundary
    "qwen3_next": dict({"default": None, "yarn": ROPES["yarn"]}, **({"long": None} if LINE == "5" else {})),
    "qwen3_5": {"default": None, "yarn": ROPES["yarn"]},
    "qwen3_5_moe": {"default": None, "yarn": ROPES["yarn"]},
}
# folders that change more than the RoPE: config keys over FAMILIES'
VARIANTS = {
    # a plain q_proj, rotate_half RoPE, biases (kv_a_proj_with_mqa and o_proj:
    # transformers gives q_proj none), weights not renormalised, one group,
    # v_head_dim 20 > qk_head_dim 16, one shared expert
    ("deepseek_v3", "nolora"): dict(q_lora_rank=None, rope_interleave=False, attention_bias=True,
                                    norm_topk_prob=False, n_group=1, topk_group=1, v_head_dim=20,
                                    n_shared_experts=1),
    ("qwen3_next", "long"): dict(max_position_embeddings=128),
}
# rows longer than SEQ, per folder
SEQS = {("qwen3_next", "long"): 96}
MAX_POS = 64
# <family>-window: default RoPE and a window shorter than the rows, on the
# layers of SLIDING (mistral: every layer; qwen2: max_window_layers 1, so
# layer 1; gpt_oss: layer_types' layer 0); FULL takes the window out
WINDOW = 8
WINDOWS = {
    "mistral": dict(sliding_window=WINDOW),
    # 4.57.6 derives layer_types from max_window_layers 1; 5.x is given them
    "qwen2": dict(sliding_window=WINDOW, **({"layer_types": ["full_attention", "sliding_attention"]}
                                           if LINE == "5" else {})),
    "gpt_oss": dict(sliding_window=WINDOW),
}
SLIDING = {"mistral": [0, 1], "qwen2": [1], "gpt_oss": [0]}
FULL = {
    "mistral": dict(sliding_window=None),
    "qwen2": dict(use_sliding_window=False, sliding_window=None,
                  layer_types=["full_attention", "full_attention"]),
    # gpt_oss builds the sliding mask whatever the layers (none: a ValueError)
    "gpt_oss": dict(sliding_window=WINDOW, layer_types=["full_attention", "full_attention"]),
}
# the plain loops: 5.x's grouped_mm experts take no float64
IMPL = {"attn_implementation": "eager"}
if LINE == "5":
    IMPL["experts_implementation"] = "eager"


def seq_of(family, rope):
    return SEQS.get((family, rope), SEQ)


def ropes_of(family):
    return FAMILY_ROPES.get(family, ROPES)


def theta_of(family, rope):
    r = ropes_of(family)[rope]
    return r["rope_theta"] if r and "rope_theta" in r else FAMILIES[family]["rope_theta"]


def make_config(family, rope, pad=None, theta=None, extra=None):
    kw = dict(FAMILIES[family], **VARIANTS.get((family, rope), {}))
    kw.update(extra or {})
    if pad is not None:   # nn.Embedding(padding_idx=pad_token_id): that row gets no gradient
        kw["pad_token_id"] = pad
    mt = kw.pop("model_type")
    kw.update(vocab_size=VOCAB, max_position_embeddings=kw.get("max_position_embeddings", MAX_POS),
              rms_norm_eps=kw.get("rms_norm_eps", 1e-6))
    kw.pop("rope_theta")
    theta = theta_of(family, rope) if theta is None else theta
    r = ropes_of(family)[rope]
    r = {k: v for k, v in r.items() if k != "rope_theta"} if r else None
    if mt == "gpt_oss" and LINE == "4":
        # 4.57.6's experts compute with limit 7.0 whatever the config says;
        # and a null rope_scaling is default RoPE to 4.57.6 but
        # GptOssConfig's yarn to 5.x (hp refuses it): say "default"
        kw["swiglu_limit"] = 7.0
        r = r or {"rope_type": "default"}
    if LINE == "4":
        kw["rope_theta"] = theta
        kw["rope_scaling"] = dict(r) if r else None
    else:
        kw["rope_parameters"] = dict(r or {"rope_type": "default"}, rope_theta=theta)
        if "partial_rotary_factor" in kw:   # 5.x keeps it in rope_parameters
            kw["rope_parameters"]["partial_rotary_factor"] = kw.pop("partial_rotary_factor")
    cfg = AutoConfig.for_model(mt, **kw)
    cfg._attn_implementation = "eager"
    return cfg


def fill_weights(model, seed):
    """transformers' init, then a fixed draw that makes every parameter matter:
    matrices normal(0, 0.1), q/k 0.25 (attention far from uniform, so RoPE
    shows in the loss; deepseek_v3's q_a_proj, q_b_proj, kv_a_proj_with_mqa
    and kv_b_proj too), routers 0.3 (decisive routing), norms 1 + normal(0,
    0.2), biases normal(0, 0.1) (gpt_oss's expert and router biases too),
    attention sinks normal(0, 1) (a real share of each softmax).  Drawn in
    named_parameters order; then deepseek_v3's e_score_correction_bias
    buffers (persistent, saved, no parameter) normal(0, 0.1) in
    named_buffers order, so that they change the experts chosen.
    The hybrids' tensors fall under the same rules: A_log, conv1d,
    in_proj_*, shared_expert_gate normal(0, 0.1) (A = exp(A_log) near 1),
    dt_bias as a bias, the gated norm (linear_attn.norm) and the
    zero-centred RMSNorms as norms, 1 + normal(0, 0.2): the latter compute
    x (1 + weight), a factor 2 + normal(0, 0.2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            else:
                std = 0.25 if (".q_proj." in name or ".k_proj." in name or
                               ".q_a_proj." in name or ".q_b_proj." in name or
                               ".kv_a_proj_with_mqa." in name or ".kv_b_proj." in name) else \
                    0.3 if name.endswith(("mlp.gate.weight", "mlp.router.weight")) else \
                    1.0 if name.endswith("self_attn.sinks") else 0.1
                p.copy_(std * torch.randn(p.shape, generator=g, dtype=torch.float64))
        for name, b in model.named_buffers():
            if name.endswith("mlp.gate.e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g, dtype=torch.float64))


def make_batch(seq=SEQ):
    rng = np.random.RandomState(BATCH_SEED)
    rec = rng.randint(0, VOCAB, size=(BATCH, seq + 1)).astype(np.int64)
    ids, tgt = rec[:, :-1].copy(), rec[:, 1:].copy()
    for b, t in IGNORED:
        tgt[b, t] = -100
    return torch.from_numpy(ids), torch.from_numpy(tgt)


def forward(model, ids, tgt):
    return model(input_ids=ids, labels=tgt, shift_labels=tgt)


def router_gap(out, k):
    gaps = []
    for r in getattr(out, "router_logits", None) or ():   # (4.57.6's deepseek_v3: no such field)
        if r is None:
            continue
        s = torch.sort(r.double(), dim=-1, descending=True).values
        gaps.append(float((s[:, k - 1] - s[:, k]).min()))
    return min(gaps) if gaps else math.inf


def swiglu_fix(model):
    """4.57.6's GptOssExperts hard-code limit 7.0 and alpha 1.702 and never
    read config.json (5.x reads swiglu_limit and swiglu_alpha).  The tf4
    folders therefore say swiglu_limit 7.0, the value 4.57.6 computes with
    (hp refuses any other in a 4.x folder); here every gpt_oss model built
    is checked to compute with its config's limit."""
    if model.config.model_type == "gpt_oss":
        lim = model.config.swiglu_limit
        for mod in model.modules():
            if type(mod).__name__ == "GptOssExperts":
                assert mod.limit == lim and mod.alpha == 1.702
    return model


class OssTap:
    """Hooks on gpt_oss's MLPs.  Its outputs give no router logits: None
    with output_router_logits false, and 4.57.6's router_logits are the
    router scores (the softmaxed top-k scattered into zeros).  So each
    forward's logits are recomputed from the MLP's input with the router's
    own F.linear (bias included) for the margins, and the SwiGLU's clamps
    are counted on the routed (token, expert) pairs as the experts compute
    them: gate above the limit, up above it, up below minus it."""

    def __init__(self, model):
        self.k = model.config.num_experts_per_tok
        self.gap, self.clamped = math.inf, []
        for m in model.modules():
            if type(m).__name__ == "GptOssMLP":
                m.register_forward_hook(self.hook)

    def hook(self, mlp, args, output):
        with torch.no_grad():
            x = args[0].reshape(-1, args[0].shape[-1])
            logits = F.linear(x, mlp.router.weight, mlp.router.bias)
            s = torch.sort(logits.double(), dim=-1, descending=True).values
            self.gap = min(self.gap, float((s[:, self.k - 1] - s[:, self.k]).min()))
            idx = torch.topk(logits, self.k, dim=-1).indices
            ex, n = mlp.experts, [0, 0, 0]
            for e in range(ex.gate_up_proj.shape[0]):
                tok = torch.where(idx == e)[0]
                gu = x[tok] @ ex.gate_up_proj[e] + ex.gate_up_proj_bias[e]
                gate, up = gu[..., 0::2], gu[..., 1::2]
                n[0] += int((gate > ex.limit).sum())
                n[1] += int((up > ex.limit).sum())
                n[2] += int((up < -ex.limit).sum())
            self.clamped.append(n)


class DsTap:
    """Hooks on deepseek_v3's routers (DeepseekV3TopkRouter, the MoE's gate).
    Each forward's choice is recomputed from the gate's input as transformers
    makes it: scores = sigmoid(linear(x, weight)) in float32; choice scores =
    scores + e_score_correction_bias; group score = the sum of the group's two
    best choice scores; the topk_group best groups kept, the others' choice
    scores masked (4.57.6 with 0.0, 5.x with -inf); the K best masked choice
    scores route.  The recomputed experts are checked to be transformers'.
    Margins (float64 from those values): the K-th vs (K+1)-th masked choice
    score and, when topk_group < n_group, the topk_group-th vs next group
    score, minimum over tokens; and how often an expert gets no token (4.57.6
    then leaves its gradient None: see grad_of).  The first forward also
    records the tokens per expert, how many tokens would route elsewhere
    without the bias (same input), and how many would under the other line's
    masking."""

    def __init__(self, model):
        c = model.config
        self.k, self.ng, self.tg = c.num_experts_per_tok, c.n_group, c.topk_group
        self.choice_gap = self.group_gap = math.inf
        self.idle = 0   # (forward, layer, expert) without a token
        self.layers = []   # one entry per router call: the first forward's come first
        for m in model.modules():
            if type(m).__name__ == "DeepseekV3TopkRouter":
                m.register_forward_hook(self.hook)

    @property
    def gap(self):
        return min(self.choice_gap, self.group_gap)

    def choose(self, scores, bias, fill):
        sfc = scores.double() + bias.double()
        e = sfc.shape[-1]
        gs = sfc.view(-1, self.ng, e // self.ng).topk(2, dim=-1)[0].sum(dim=-1)
        ggap = math.inf
        if self.tg < self.ng:
            s = torch.sort(gs, dim=-1, descending=True).values
            ggap = float((s[:, self.tg - 1] - s[:, self.tg]).min())
        keep = torch.zeros_like(gs, dtype=torch.bool)
        keep.scatter_(1, torch.topk(gs, self.tg, dim=-1).indices, True)
        keep = keep[:, :, None].expand(-1, self.ng, e // self.ng).reshape(-1, e)
        masked = sfc.masked_fill(~keep, fill)
        s = torch.sort(masked, dim=-1, descending=True).values
        cgap = float((s[:, self.k - 1] - s[:, self.k]).min())
        idx = torch.sort(torch.topk(masked, self.k, dim=-1).indices, dim=-1).values
        return idx, cgap, ggap

    def hook(self, gate, args, output):
        with torch.no_grad():
            x = args[0].reshape(-1, args[0].shape[-1])
            scores = F.linear(x.float(), gate.weight.float()).sigmoid()
            bias = gate.e_score_correction_bias
            fill, other = (0.0, -math.inf) if LINE == "4" else (-math.inf, 0.0)
            idx, cgap, ggap = self.choose(scores, bias, fill)
            # 4.57.6 returns (indices, weights), 5.x (logits, weights, indices)
            theirs = output[0] if LINE == "4" else output[2]
            assert torch.equal(idx, torch.sort(theirs, dim=-1).values), "not transformers' experts"
            self.choice_gap, self.group_gap = min(self.choice_gap, cgap), min(self.group_gap, ggap)
            nb = int((self.choose(scores, torch.zeros_like(bias), fill)[0] != idx).any(-1).sum())
            nf = int((self.choose(scores, bias, other)[0] != idx).any(-1).sum())
            per = torch.bincount(idx.flatten(), minlength=bias.shape[0])
            self.idle += int((per == 0).sum())
            self.layers.append({"tokens_per_expert": per.tolist(),
                                "tokens_rerouted_without_bias": nb, "tokens_rerouted_by_other_fill": nf})


class RouterTap:
    """Hooks on the softmax routers (mlp.gate) of qwen3_next and
    qwen3_5_moe, whose outputs carry no router logits with
    output_router_logits false: each forward's logits are recomputed from
    the gate's input with F.linear (checked against transformers': 4.57.6's
    gate is the nn.Linear itself, 5.x's router returns the experts it
    picked), for the k-th vs (k+1)-th logit margin, minimum over tokens; the
    first forward also records the tokens per expert of each MoE layer."""

    def __init__(self, model):
        self.k, self.gap, self.layers = model.config.num_experts_per_tok, math.inf, []
        for n, m in model.named_modules():
            if n.endswith("mlp.gate"):
                m.register_forward_hook(self.hook)

    def hook(self, gate, args, output):
        with torch.no_grad():
            x = args[0].reshape(-1, args[0].shape[-1])
            logits = F.linear(x, gate.weight)
            idx = torch.topk(logits, self.k, dim=-1).indices
            if LINE == "4":
                assert torch.equal(logits, output), "not transformers' router logits"
            else:
                assert torch.equal(torch.sort(idx, -1).values, torch.sort(output[2], -1).values), \
                    "not transformers' experts"
            s = torch.sort(logits.double(), dim=-1, descending=True).values
            self.gap = min(self.gap, float((s[:, self.k - 1] - s[:, self.k]).min()))
            self.layers.append(torch.bincount(idx.flatten(), minlength=gate.weight.shape[0]).tolist())


def delta_paths(model):
    """Which gated delta rule and causal conv transformers runs on this
    CPU: the torch fallbacks (neither fla nor causal_conv1d is installed,
    and 5.x's hub kernels are used only with use_kernels=True).  4.57.6
    binds them on each Qwen3NextGatedDeltaNet (chunk_gated_delta_rule =
    torch_chunk_gated_delta_rule, causal_conv1d_fn None: F.silu(conv1d));
    5.x wraps module functions whose implementation must be the torch one.
    Returns their names; asserts that no other runs."""
    mod = sys.modules[type(model).__module__]
    if LINE == "4":
        layers = [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]
        assert layers and all(m.chunk_gated_delta_rule is mod.torch_chunk_gated_delta_rule and
                              m.causal_conv1d_fn is None for m in layers)
        return ["torch_chunk_gated_delta_rule", "F.silu(conv1d)"]
    out = []
    for n in ("torch_chunk_gated_delta_rule", "causal_conv1d_fn"):
        f = getattr(mod, n)
        cells = dict(zip(f.__code__.co_freevars, (c.cell_contents for c in f.__closure__)))
        assert cells["implementation"] is cells["torch_function"] and not cells["is_new_implementation"], n
        out.append(n)
    return out


def float64_moe(model):
    """4.57.6's DeepseekV3MoE.moe accumulates the experts in the routing
    weights' dtype, float32 (the router is a float32 island), and index_add_
    refuses the float64 expert outputs of a model.double(): a forward hook on
    the gate hands the weights on as float64 (exact).  5.x accumulates in the
    hidden dtype already; float32 models are left alone."""
    if LINE == "4" and model.config.model_type == "deepseek_v3" and model.dtype == torch.float64:
        def hook(gate, args, output):
            return output[0], output[1].to(torch.float64)
        for m in model.modules():
            if type(m).__name__ == "DeepseekV3TopkRouter":
                m.register_forward_hook(hook)
    return model


def routes_apart(family, rope, seed):
    """A cheap first look at a deepseek_v3 seed, in memory: the router
    margins and tokens per expert of one()'s float64 forward and float32
    AdamW steps, on the same weights (one() takes them again from the saved
    folder and decides).  True for the other families."""
    if family != "deepseek_v3":
        return True
    ids, tgt = make_batch()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(family, rope), **IMPL).float()
    fill_weights(model, seed)
    m64 = float64_moe(copy.deepcopy(model).double())
    m64.train()
    tap = DsTap(m64)
    with torch.no_grad():
        forward(m64, ids, tgt)
    model.train()
    tap32 = DsTap(model)
    adamw(model, ids, tgt, tap32)
    return min(tap.gap, tap32.gap) >= GAP_MIN


def grad_of(p):
    """The gradient after backward: 0 where autograd leaves None.  Only
    4.57.6's deepseek_v3 does, for an expert (a module of its own) that no
    token reached; 5.x's stacked experts get zeros there.  AdamW is handed
    the zeros too (weight decay and the moments act as on 5.x's, and as in a
    trainer with dense gradients), not a None it would skip."""
    return p.grad if p.grad is not None else torch.zeros_like(p)


def no_decay(name):
    return "norm" in name or "bias" in name


def adamw(model, ids, tgt, tap=None):
    decay = [p for n, p in model.named_parameters() if not no_decay(n)]
    nod = [p for n, p in model.named_parameters() if no_decay(n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                             {"params": nod, "weight_decay": 0.0}],
                            lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"])
    losses, norms, gap = [], [], math.inf
    k = getattr(model.config, "num_experts_per_tok", 0)
    for _ in range(STEPS):
        opt.zero_grad()
        out = forward(model, ids, tgt)
        out.loss.backward()
        for p in model.parameters():
            p.grad = grad_of(p)
        if k:
            gap = min(gap, router_gap(out, k))
        losses.append(out.loss.item())
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
    if tap:
        gap = min(gap, tap.gap)
    return losses, norms, gap


def keys_kept(model, ids):
    """Which keys each query attends to, per layer: the nonzero entries of
    the eager attention weights (a masked score gets the dtype's minimum,
    whose exp underflows to exactly 0), [B, H, S, S] booleans."""
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
    assert len(out.attentions) == model.config.num_hidden_layers
    return [a != 0 for a in out.attentions]


def check_window(model, ids, sliding, window):
    """Layer l keeps key j for query i exactly when j <= i, and on the
    layers of sliding also i - window < j (window keys, itself included)."""
    i = torch.arange(SEQ)[:, None]
    j = torch.arange(SEQ)[None, :]
    for l, kept in enumerate(keys_kept(model, ids)):
        want = (j <= i) & ((j > i - window) if l in sliding else True)
        assert torch.equal(kept, want.expand_as(kept)), "layer %d: not the mask i - %d < j <= i" % (l, window)


def rotary(model):
    re = model.model.rotary_emb
    return [float(x) for x in re.inv_freq.float()], float(re.attention_scaling)


def correction_biases(model):
    return {n: b for n, b in model.named_buffers() if n.endswith("mlp.gate.e_score_correction_bias")}


def check_biases(model, want, what):
    """deepseek_v3's e_score_correction_bias, one per MoE layer, all
    equal to want's (float32 values, exactly)."""
    got = correction_biases(model)
    want = {n: t for n, t in want.items() if n.endswith("mlp.gate.e_score_correction_bias")}
    assert sorted(got) == sorted(want), what
    for n, b in got.items():
        assert torch.equal(b.float(), want[n].float()), "%s: %s differs" % (what, n)


def delta_ablations(cfg):
    """The hybrids' ablations, as changes to a loaded float64 model: the
    attention output gate open (gate logits 1e4, sigmoid 1: a forward hook
    on q_proj sets the gate half of each head's 2 x head_dim outputs), the
    shared expert gate open (shared_expert_gate's logit 1e4), the causal
    conv an identity (every tap 0 but the last, the current token's, 1; the
    SiLU after it stays), dt_bias 0."""
    hd = cfg.head_dim

    def q_hook(mod, args, out):
        o = out.reshape(*out.shape[:-1], -1, 2 * hd).clone()
        o[..., hd:] = 1e4
        return o.reshape(out.shape)

    def hooks(suffix, hook):
        def change(mv):
            for n, m in mv.named_modules():
                if n.endswith(suffix):
                    m.register_forward_hook(hook)
        return change

    def conv_identity(mv):
        for n, p in mv.named_parameters():
            if n.endswith("linear_attn.conv1d.weight"):
                p.zero_()
                p[..., -1] = 1.0

    def dt_bias_zero(mv):
        for n, p in mv.named_parameters():
            if n.endswith("linear_attn.dt_bias"):
                p.zero_()

    out = [("attn_output_gate_off", hooks("self_attn.q_proj", q_hook))]
    if getattr(cfg, "num_experts", 0):
        out.append(("shared_expert_gate_off", hooks("mlp.shared_expert_gate",
                                                    lambda mod, args, o: torch.full_like(o, 1e4))))
    return out + [("conv_identity", conv_identity), ("dt_bias_zero", dt_bias_zero)]


def folder_of(family, rope, pad=None, window=False):
    return "%s-%s" % (family, "window" if window else rope) + ("-pad" if pad is not None else "")


def one(family, rope, seed, pad=None, window=False):
    folder = os.path.join(OUT, "tf" + LINE, folder_of(family, rope, pad, window))
    os.makedirs(folder, exist_ok=True)
    seq = seq_of(family, rope)
    ids, tgt = make_batch(seq)
    cfg = make_config(family, rope, pad, extra=WINDOWS[family] if window else None)
    if window:
        assert rope == "default" and pad is None and cfg.sliding_window == WINDOW
        if family != "mistral":
            assert [l for l, t in enumerate(cfg.layer_types) if t == "sliding_attention"] == SLIDING[family]
    oss = family == "gpt_oss"
    ds = family == "deepseek_v3"
    delta = family in DELTA
    torch.manual_seed(seed)
    model = swiglu_fix(AutoModelForCausalLM.from_config(cfg, **IMPL).float())
    fill_weights(model, seed)
    model.save_pretrained(folder, safe_serialization=True)
    inv_freq, scaling = rotary(model)
    if ds:
        # the drawn biases (one per MoE layer, not zero) are in model.safetensors
        biases = {n: b.detach().clone() for n, b in correction_biases(model).items()}
        assert len(biases) == cfg.num_hidden_layers - cfg.first_k_dense_replace
        assert all(float(b.abs().min()) > 0 for b in biases.values())
        check_biases(model, load_file(os.path.join(folder, "model.safetensors")), "model.safetensors")

    m64 = float64_moe(swiglu_fix(AutoModelForCausalLM.from_pretrained(folder, **IMPL).double()))
    m64.train()
    if ds:   # from_pretrained gives back every tensor as drawn, the biases included
        check_biases(m64, biases, "from_pretrained")
        sd = model.state_dict()
        assert all(torch.equal(t.float(), sd[n]) for n, t in m64.state_dict().items())
    k = getattr(cfg, "num_experts_per_tok", 0)
    tap = OssTap(m64) if oss else DsTap(m64) if ds else RouterTap(m64) if delta and k else None
    paths = delta_paths(m64) if delta else None
    out = forward(m64, ids, tgt)
    out.loss.backward()
    gap = router_gap(out, k) if k else math.inf
    if tap:
        gap = min(gap, tap.gap)
    grads, l2 = {}, {}
    # a tied embedding's gradient includes the LM head's share; no lm_head entry
    for n, p in m64.named_parameters():
        grads[n] = grad_of(p).detach().float().contiguous()
        l2[n] = float(grad_of(p).norm())
    save_file({"logits": out.logits[0].detach().float().contiguous()},
              os.path.join(folder, "logits.safetensors"), metadata={"format": "pt"})
    grads = hub_names(grads, family)
    l2 = {n: float(g.double().norm()) for n, g in grads.items()}
    save_file(dict(sorted(grads.items())), os.path.join(folder, "grads.safetensors"),
              metadata={"format": "pt"})

    # the same weights under default RoPE: the test's evidence that the type matters
    loss_default = None
    if ropes_of(family)[rope] is not None:   # (gpt_oss's yarn: under its own rope_theta)
        cd = make_config(family, "default", pad, theta=theta_of(family, rope))
        md = float64_moe(swiglu_fix(AutoModelForCausalLM.from_config(cd, **IMPL).double()))
        md.load_state_dict(m64.state_dict())
        with torch.no_grad():
            loss_default = float(forward(md, ids, tgt).loss)

    # a window shorter than the rows: the mask transformers applies, as
    # reloaded from config.json, is i - WINDOW < j <= i on the sliding
    # layers and causal on the others; the same weights with the window
    # taken out (every layer full attention) give another loss
    loss_full = None
    if window:
        mw = float64_moe(swiglu_fix(AutoModelForCausalLM.from_pretrained(folder, **IMPL).double()))
        check_window(mw, ids, SLIDING[family], WINDOW)
        cf = make_config(family, rope, extra=FULL[family])
        assert cf.sliding_window is None or family == "gpt_oss"
        assert getattr(cf, "layer_types", None) in (None, ["full_attention"] * cfg.num_hidden_layers)
        mf = float64_moe(swiglu_fix(AutoModelForCausalLM.from_config(cf, **IMPL).double()))
        mf.load_state_dict(m64.state_dict())
        check_window(mf, ids, [], SEQ)
        with torch.no_grad():
            loss_full = float(forward(mf, ids, tgt).loss)
        assert abs(loss_full - out.loss.item()) > 1e-4 * out.loss.item(), "the window masks nothing"
        # and a window of the rows' length (the other folders') is full attention, bit for bit
        cs = make_config(family, rope, extra=dict(WINDOWS[family], sliding_window=SEQ))
        ms = float64_moe(swiglu_fix(AutoModelForCausalLM.from_config(cs, **IMPL).double()))
        ms.load_state_dict(m64.state_dict())
        with torch.no_grad():
            assert float(forward(ms, ids, tgt).loss) == loss_full

    # gpt_oss: the loss of the same weights with one feature taken out each,
    # the evidence that the sinks, the clamps and the biases all count
    ablations = {}

    def ablated(change):
        mv = float64_moe(swiglu_fix(AutoModelForCausalLM.from_pretrained(folder, **IMPL).double()))
        mv.train()
        with torch.no_grad():
            change(mv)
            return float(forward(mv, ids, tgt).loss)

    if oss:
        def fill(value, *suffixes):
            def change(mv):
                for n, p in mv.named_parameters():
                    if n.endswith(suffixes):
                        p.fill_(value)
            return change

        def no_clamp(mv):
            for mod in mv.modules():
                if type(mod).__name__ == "GptOssExperts":
                    mod.limit = math.inf

        for name, change in (("sinks_zero", fill(0.0, "self_attn.sinks")),
                             ("sinks_off", fill(-math.inf, "self_attn.sinks")),
                             ("no_clamp", no_clamp),
                             ("expert_biases_zero", fill(0.0, "experts.gate_up_proj_bias",
                                                         "experts.down_proj_bias")),
                             ("router_bias_zero", fill(0.0, "mlp.router.bias"))):
            ablations["loss_f64_" + name] = loss = ablated(change)
            # tf4's limit 7 binds nowhere: no clamp changes nothing there
            if name != "no_clamp" or LINE == "5":
                assert abs(loss - out.loss.item()) > 1e-4 * out.loss.item(), name
    # deepseek_v3: the correction bias (routing) and the shared experts count
    if ds:
        def zero(suffix):
            def change(mv):
                for n, t in list(mv.named_parameters()) + list(mv.named_buffers()):
                    if n.endswith(suffix):
                        t.zero_()
            return change

        for name, change in (("correction_bias_zero", zero("mlp.gate.e_score_correction_bias")),
                             ("shared_experts_off", zero("mlp.shared_experts.down_proj.weight"))):
            ablations["loss_f64_" + name] = loss = ablated(change)
            assert abs(loss - out.loss.item()) > 1e-4 * out.loss.item(), name
    # the hybrids: the output gate, the shared expert gate, the conv and
    # dt_bias count; and what output_router_logits true would add
    with_router_logits = None
    if delta:
        for name, change in delta_ablations(cfg):
            ablations["loss_f64_" + name] = loss = ablated(change)
            assert abs(loss - out.loss.item()) > 1e-4 * out.loss.item(), name
        if k:
            mr = AutoModelForCausalLM.from_pretrained(folder, **IMPL).double()
            mr.train()
            with torch.no_grad():
                o = mr(input_ids=ids, labels=tgt, shift_labels=tgt, output_router_logits=True)
            n_moe = sum(1 for n, _ in mr.named_modules() if n.endswith("mlp.gate"))
            assert len([r for r in o.router_logits if r is not None]) == n_moe
            coef = cfg.router_aux_loss_coef
            assert abs(float(o.loss) - (out.loss.item() + coef * float(o.aux_loss))) < 1e-6
            with_router_logits = {
                "loss_f64": float(o.loss), "aux_loss_f64": float(o.aux_loss), "router_aux_loss_coef": coef,
                "router_logits_layers": n_moe,
                "note": "the same weights and batch with output_router_logits=True passed to the ForCausalLM's "
                        "forward: it adds router_aux_loss_coef x load_balancing_loss_func(router logits of the "
                        "MoE layers only, as in qwen3_moe) to the cross-entropy, which stays loss_f64; "
                        "config.json says false, so loss_f64 has no aux"}

    m32 = swiglu_fix(AutoModelForCausalLM.from_pretrained(folder, **IMPL).float())
    m32.train()
    tap32 = OssTap(m32) if oss else DsTap(m32) if ds else RouterTap(m32) if delta and k else None
    losses, norms, gap32 = adamw(m32, ids, tgt, tap32)
    if ds:   # a buffer: no gradient, and AdamW leaves it as loaded
        check_biases(m32, biases, "after AdamW")

    variant = VARIANTS.get((family, rope))
    ref = {
        "about": "transformers %s, torch %s: %s with %s RoPE%s, saved by save_pretrained; "
                 "made by t/ref/make-hf-goldens.py" % (transformers.__version__, torch.__version__,
                                                      family, "default" if variant else rope,
                                                      " and a sliding window of %d" % WINDOW if window else
                                                      " (%s: %s)" % (rope, ", ".join(
                                                          "%s %s" % (n, json.dumps(v))
                                                          for n, v in sorted(variant.items())))
                                                      if variant else ""),
        "model": family, "rope": rope, "seed": seed,
        "batch": {"shape": [BATCH, seq], "input_ids": ids.tolist(), "target_ids": tgt.tolist(),
                  "note": "targets pre-shifted, full length; -100 at %s" % IGNORED},
        "loss": {"loss_f64": float(out.loss), "loss_f64_default_rope": loss_default,
                 "note": "model.double() (transformers keeps its float32 islands: RoPE table, "
                         "RMSNorm, softmaxes); the MoE loss includes router_aux_loss_coef x aux"},
        "rope": {"inv_freq_f32": inv_freq, "attention_scaling": scaling},
        "logits": {"file": "logits.safetensors", "tensor": "logits", "shape": [seq, VOCAB]},
        "grads": {"file": "grads.safetensors", "l2_norms_f64": l2},
        "adamw": dict(ADAMW, betas=list(ADAMW["betas"]), steps=STEPS, max_grad_norm=1.0,
                      no_decay=["norm", "bias"], dtype="float32", losses_f32=losses,
                      grad_norms_f32=norms),
    }
    if window:
        ref["loss"]["loss_f64_full_attention"] = loss_full
        ref["window"] = {
            "sliding_window": WINDOW, "sliding_layers": SLIDING[family],
            "keys_kept": "query i keeps key j exactly when i - %d < j <= i (%d keys, itself included) on "
                         "the sliding layers, j <= i on the others" % (WINDOW, WINDOW),
            "note": "checked on the float64 eager attention weights (output_attentions) of the folder as "
                    "reloaded: exact zeros where masked, none elsewhere; loss_f64_full_attention is the same "
                    "weights with every layer full_attention and sliding_window null (gpt_oss: kept, unused) "
                    "(a window of 32, the "
                    "rows' length, gives that loss bit for bit)"}
    if oss:
        lim = cfg.swiglu_limit
        ref["loss"]["note"] = ("model.double() (transformers keeps its float32 islands: RoPE table, "
                               "RMSNorm); gpt_oss: output_router_logits false, no aux loss")
        ref["swiglu"] = {"limit": lim, "alpha": 1.702, "note":
                         "4.57.6 hard-codes limit 7.0 and alpha 1.702 in GptOssExperts and reads neither "
                         "from config.json: this folder says 7.0, which binds nowhere here"
                         if LINE == "4" else "read from config.json (swiglu_limit, swiglu_alpha)"}
        ref["swiglu_clamped"] = {
            "gate_above_limit": [c[0] for c in tap.clamped], "up_above_limit": [c[1] for c in tap.clamped],
            "up_below_minus_limit": [c[2] for c in tap.clamped],
            "of_per_layer_and_side": BATCH * SEQ * k * cfg.intermediate_size,
            "note": "elements clamped per layer in the float64 forward, over the routed (token, expert) "
                    "pairs: gate = gate_up[..., 0::2] > limit, up = gate_up[..., 1::2] beyond +-limit"}
        ref["ablations"] = dict(ablations, note=(
            "float64 loss of the same weights with one thing changed: sinks 0, sinks -inf (no sink), "
            "no clamp (limit inf), expert biases 0, router bias 0; each differs from loss_f64"))
        ref["grads"]["names"] = ("hp's per-expert names: experts.X.{gate,up}_proj.weight [I, H] = "
                                 "gate_up_proj[X][:, 0::2 / 1::2].T, experts.X.down_proj.weight [H, I] = "
                                 "down_proj[X].T, experts.X.{gate,up}_proj.bias = gate_up_proj_bias[X][0::2 / "
                                 "1::2], experts.X.down_proj.bias = down_proj_bias[X]; the rest under "
                                 "transformers' names")
        assert len(tap.clamped) == cfg.num_hidden_layers
        assert all(min(c) > 0 for c in tap.clamped) if LINE == "5" else all(max(c) == 0 for c in tap.clamped)
    if ds:
        def finite(x):
            return x if x != math.inf else None
        first = cfg.first_k_dense_replace
        ref["variant"] = rope
        ref["loss"]["note"] = (
            "model.double() (transformers keeps its float32 islands: RoPE table, RMSNorm, softmaxes, and the "
            "router's linear and sigmoid, so the routing weights are float32 numbers); deepseek_v3: no aux loss" +
            ("; 4.57.6 accumulates the experts in the routing weights' dtype and its index_add_ refuses float64: "
             "the generator's hook on the gate hands the weights on as float64 (exact)" if LINE == "4" else ""))
        ref["attention"] = {
            "scaling": float(m64.model.layers[0].self_attn.scaling),
            "qk_head_dim": cfg.qk_nope_head_dim + cfg.qk_rope_head_dim,
            "note": "the softmax scale transformers uses (self_attn.scaling of layer 0, every layer's): "
                    "qk_head_dim^-0.5, times (0.1 mscale_all_dim ln(factor) + 1)^2 when the RoPE type is not "
                    "default and mscale_all_dim is set; the rotary cos/sin carry rope.attention_scaling "
                    "(yarn: mscale(factor, mscale) / mscale(factor, mscale_all_dim))"}
        ref["router"] = {
            "min_choice_gap_f64": tap.choice_gap, "min_group_gap_f64": finite(tap.group_gap),
            "min_choice_gap_f32_adamw": tap32.choice_gap, "min_group_gap_f32_adamw": finite(tap32.group_gap),
            "experts_without_tokens_f64": tap.idle, "experts_without_tokens_f32_adamw": tap32.idle,
            "masked_groups_fill": "0.0" if LINE == "4" else "-inf",
            "layers": [dict(l, layer=first + i) for i, l in enumerate(tap.layers[:cfg.num_hidden_layers - first])],
            "note": "choice score = sigmoid(router logit) + e_score_correction_bias; group score = sum of the "
                    "group's two best choice scores; the topk_group best groups kept, the others' choice scores "
                    "masked with masked_groups_fill (4.57.6: 0.0, 5.x: -inf); the num_experts_per_tok best masked "
                    "choice scores route, with weights sigmoid (without the bias), divided by their sum when "
                    "norm_topk_prob, times routed_scaling_factor.  min_choice_gap: smallest K-th minus (K+1)-th "
                    "masked choice score; min_group_gap: smallest topk_group-th minus next group score (null "
                    "when every group is kept); in the float64 forward and over the float32 AdamW steps.  "
                    "layers (float64 forward): tokens per expert, tokens that would route elsewhere with the "
                    "bias at 0 or with the other line's fill (same layer input); experts_without_tokens: "
                    "(layer, expert) pairs that get no token, in the float64 forward and summed over the "
                    "AdamW steps (their gradient is 0; 4.57.6 leaves it None, taken as 0)"}
        ref["ablations"] = dict(ablations, note=(
            "float64 loss of the same weights with one thing changed: every e_score_correction_bias 0, "
            "the shared experts' down_proj 0 (shared experts off); each differs from loss_f64"))
        ref["e_score_correction_bias"] = (
            "a persistent buffer per MoE layer (mlp.gate.e_score_correction_bias, in model.safetensors, "
            "checked after save_pretrained and from_pretrained), drawn normal(0, 0.1) with the weights' "
            "generator after the parameters; no parameter: no gradient, AdamW leaves it (checked)")
        ref["grads"]["names"] = (
            "hp's per-expert names (experts.X.{gate,up,down}_proj.weight)" +
            (": 5.x holds experts.gate_up_proj [E, 2I, H] (gate rows first) and experts.down_proj [E, H, I], "
             "split here as save_pretrained splits them" if LINE == "5" else
             ", as 4.57.6 holds them") + "; the rest under transformers' names")
        if min(tap.gap, tap32.gap) < GAP_MIN:
            return None
    if delta:
        ref["variant"] = rope
        ref["loss"]["note"] = (
            "model.double() (transformers keeps its float32 islands: RoPE table, RMSNorms, softmaxes, the "
            "gated delta rule (q, k, v, beta and g taken to float32 inside it, the output back to float64; "
            "g = -exp(A_log) softplus(a + dt_bias) in float32), the gated norm's SiLU gate" +
            (", the router softmax); no aux loss (output_router_logits false)" if k else ")"))
        lin = [i for i, t in enumerate(cfg.layer_types) if t == "linear_attention"]
        ref["delta_rule"] = {
            "linear_attention_layers": lin,
            "full_attention_layers": [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"],
            "chunk_size": 64, "chunks_per_row": -(-seq // 64), "paths": paths,
            "note": "transformers' torch fallbacks on the CPU (no fla, no causal_conv1d; checked): the chunked "
                    "gated delta rule (4.57.6 inverts each chunk's unit lower-triangular system by forward "
                    "substitution, 5.x with torch.linalg.solve_triangular; rows padded to a multiple of 64) "
                    "and the depthwise causal conv1d with SiLU; q and k l2-normalised (eps 1e-6) per head "
                    "(4.57.6 before the float32 cast, 5.x after), q scaled by linear_key_head_dim^-0.5, each "
                    "key head serving linear_num_value_heads / linear_num_key_heads consecutive value heads "
                    "(repeat_interleave)"}
        ref["norms"] = ("Qwen3Next/Qwen3_5 RMSNorm (input/post-attention/final norms, q_norm, k_norm) computes "
                        "x / rms(x) x (1 + weight): weight starts at 0 in transformers, drawn here 1 + normal(0, "
                        "0.2) like every norm, so the factor is 2 + normal(0, 0.2); the gated norm "
                        "(linear_attn.norm) is weight x x / rms(x) x silu(z), weight 1 + normal(0, 0.2)")
        ref["ablations"] = dict(ablations, note=(
            "float64 loss of the same weights with one thing changed: the attention output gate open (gate "
            "logits 1e4: sigmoid 1), " + ("the shared expert gate open (its logit 1e4), " if k else "") +
            "the causal conv an identity (all taps 0 but the last, the current token's, 1), every dt_bias 0; "
            "each differs from loss_f64 by more than 1e-4 relative"))
        if k:
            ref["output_router_logits_true"] = with_router_logits
            ref["grads"]["names"] = (
                "hp's per-expert names (experts.X.{gate,up,down}_proj.weight)" +
                (": 5.x holds experts.gate_up_proj [E, 2I, H] (gate rows first) and experts.down_proj "
                 "[E, H, I], split here as save_pretrained splits them" if LINE == "5" else
                 ", as 4.57.6 holds them") + "; the rest under transformers' names")
            ref["router"] = {"min_topk_logit_gap_f64": gap, "min_topk_logit_gap_f32_adamw": gap32,
                             "tokens_per_expert_f64": tap.layers,
                             "note": "router logits = mlp.gate (Linear H -> E, no bias), softmax in float32, "
                                     "top-k, renormalised; min_topk_logit_gap: smallest k-th minus (k+1)-th "
                                     "logit over the tokens, float64 forward and float32 AdamW steps (seeds "
                                     "redrawn below 5e-4); tokens_per_expert_f64: per MoE layer, in order"}
            if min(gap, gap32) < GAP_MIN:
                return None
    elif k:
        ref["router"] = {"min_topk_logit_gap_f64": gap, "min_topk_logit_gap_f32_adamw": gap32}
        if min(gap, gap32) < GAP_MIN:
            return None
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1, sort_keys=True)
        f.write("\n")
    return ref


def jobs():
    """(folder, family, rope, seed, pad, window) for every folder, in order."""
    out = []
    for fi, family in enumerate(FAMILIES):
        if LINES.get(family, LINE) != LINE:   # (qwen3_5, qwen3_5_moe: 5.x only)
            continue
        for ri, rope in enumerate(ropes_of(family)):
            out.append((folder_of(family, rope), family, rope, 1000 * (fi + 1) + ri, None, False))
        # (+10, +20, +30: one of gpt_oss's ablations moves a line's loss by < 1e-4 relative)
        if family in WINDOWS:
            out.append((folder_of(family, "default", window=True), family, "default", 1000 * (fi + 1) + 40,
                        None, True))
    # a pad token that occurs in the batch (id 28, four times): its
    # embedding row gets no gradient, though the tied LM head's share does
    out.append((folder_of("llama", "default", pad=28), "llama", "default", 1999, 28, False))
    return out


def main():
    bad = 0
    only = sys.argv[3:]   # optional: only these families or folders (all when none)
    todo = jobs()
    for f in only:
        if f not in FAMILIES and f not in [j[0] for j in todo]:
            sys.exit("make-hf-goldens: unknown family or folder '%s' (%s)" % (f, ", ".join(FAMILIES)))
    for name, family, rope, seed, pad, window in todo:
        if only and family not in only and name not in only:
            continue
        if pad is not None:
            ids, _ = make_batch()
            assert int((ids == pad).sum()) == 4
            ref = one(family, rope, seed, pad=pad)
            print("tf%s llama      default  pad_token_id %d (%d tokens) loss %.10f" % (
                LINE, pad, int((ids == pad).sum()), ref["loss"]["loss_f64"]))
            continue
        for tries in range(TRIES.get(family, 50)):
            ref = one(family, rope, seed, window=window) if routes_apart(family, rope, seed) else None
            if ref:
                break
            seed += 100   # routing too close to a tie: another draw
        else:
            sys.exit("make-hf-goldens: %s: no seed gives router margins >= %g" % (name, GAP_MIN))
        d = ref["loss"]["loss_f64_default_rope"]
        moved = d is None or abs(d - ref["loss"]["loss_f64"]) > 1e-4 * abs(d)
        if rope == "dynamic":   # positions below max_position_embeddings: the default table
            moved = d is not None and abs(d - ref["loss"]["loss_f64"]) < 1e-12
        print("tf%s %-10s %-8s seed %5d loss %.10f (default RoPE %s) %s" % (
            LINE, family, "window" if window else rope, seed, ref["loss"]["loss_f64"],
            "%.10f" % d if d is not None else "-", "ok" if moved else "RoPE NOT VISIBLE"))
        if window:
            print("tf%s %-10s window   sliding_window %d on layers %s (keys i-%d < j <= i), full attention "
                  "%.10f, AdamW %s" % (LINE, family, WINDOW, SLIDING[family], WINDOW,
                                       ref["loss"]["loss_f64_full_attention"],
                                       " ".join("%.6f" % x for x in ref["adamw"]["losses_f32"])))
        if "swiglu" in ref:
            print("tf%s %-10s %-8s margins %.3g / %.3g, clamped gate>%g %s up>%g %s up<-%g %s, %s" % (
                LINE, family, "window" if window else rope, ref["router"]["min_topk_logit_gap_f64"],
                ref["router"]["min_topk_logit_gap_f32_adamw"], ref["swiglu"]["limit"],
                ref["swiglu_clamped"]["gate_above_limit"], ref["swiglu"]["limit"],
                ref["swiglu_clamped"]["up_above_limit"], ref["swiglu"]["limit"],
                ref["swiglu_clamped"]["up_below_minus_limit"],
                " ".join("%s %.6f" % (n[9:], v) for n, v in sorted(ref["ablations"].items())
                         if n != "note")))
        if "attention" in ref:
            r = ref["router"]
            print("tf%s %-10s %-8s margins choice %.3g / %.3g group %s / %s, scaling %.10f rotary %.10f, %s, "
                  "AdamW %s" % (
                      LINE, family, rope, r["min_choice_gap_f64"], r["min_choice_gap_f32_adamw"],
                      "%.3g" % r["min_group_gap_f64"] if r["min_group_gap_f64"] is not None else "-",
                      "%.3g" % r["min_group_gap_f32_adamw"] if r["min_group_gap_f32_adamw"] is not None else "-",
                      ref["attention"]["scaling"], ref["rope"]["attention_scaling"],
                      " ".join("%s %.10f" % (n[9:], v) for n, v in sorted(ref["ablations"].items())
                               if n != "note"),
                      " ".join("%.6f" % x for x in ref["adamw"]["losses_f32"])))
            print("tf%s %-10s %-8s rerouted without bias %s, by the other fill %s, tokens per expert %s" % (
                LINE, family, rope, [l["tokens_rerouted_without_bias"] for l in r["layers"]],
                [l["tokens_rerouted_by_other_fill"] for l in r["layers"]],
                [l["tokens_per_expert"] for l in r["layers"]]))
        if "delta_rule" in ref:
            r = ref.get("router", {})
            print("tf%s %-10s %-8s %s%s, AdamW %s" % (
                LINE, family, rope, "margins %.3g / %.3g, " % (r["min_topk_logit_gap_f64"],
                                                             r["min_topk_logit_gap_f32_adamw"]) if r else "",
                " ".join("%s %.10f" % (n[9:], v) for n, v in sorted(ref["ablations"].items()) if n != "note"),
                " ".join("%.6f" % x for x in ref["adamw"]["losses_f32"])))
        bad += not moved
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
