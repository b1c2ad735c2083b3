#!/usr/bin/env python3
"""Goldens from transformers itself: every family x RoPE type, as 4.x and 5.x write them.

    t/ref/make-hf-goldens.sh            (makes the venvs, then runs this once per line)

Run directly only inside one of those environments:

    python make-hf-goldens.py OUTDIR LINE      (LINE is "4" or "5")

For each family (llama, mistral, qwen2, qwen3, qwen3_moe) and each RoPE type
(default, linear, dynamic, yarn, llama3) it builds the model with
transformers' own config class and AutoModelForCausalLM.from_config, draws
weights from a fixed seed, writes the folder with save_pretrained (so
config.json is what that release line writes), and records with the same
model, in float64 (model.double(): transformers' float32 islands, the RoPE
table, RMSNorm and the softmaxes, stay as transformers has them):

  reference.json      the batch, loss_f64 (aux included for the MoE), the
                      inverse frequencies and attention scaling of the
                      model's rotary embedding, the loss of the same weights
                      under default RoPE (so a test knows the RoPE type
                      matters), five torch.optim.AdamW steps in float32
                      (hp-train's optimizer settings), router margins
  logits.safetensors  logits of batch row 0, float64 stored F32
  grads.safetensors   d loss / d parameter under HF names, float64 stored F32

and reloads the folder with from_pretrained to check it gives the same
loss.  Folders go to OUTDIR/tf<LINE>/<family>-<rope>/.  Two runs write the
same bytes (fixed seeds, one thread).
"""
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

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
}
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
MAX_POS = 64
# the plain loops: 5.x's grouped_mm experts take no float64
IMPL = {"attn_implementation": "eager"}
if LINE == "5":
    IMPL["experts_implementation"] = "eager"


def make_config(family, rope, pad=None):
    kw = dict(FAMILIES[family])
    if pad is not None:   # nn.Embedding(padding_idx=pad_token_id): that row gets no gradient
        kw["pad_token_id"] = pad
    mt = kw.pop("model_type")
    kw.update(vocab_size=VOCAB, max_position_embeddings=MAX_POS, rms_norm_eps=1e-6)
    theta = kw.pop("rope_theta")
    r = ROPES[rope]
    if LINE == "4":
        kw["rope_theta"] = theta
        kw["rope_scaling"] = dict(r) if r else None
    else:
        kw["rope_parameters"] = dict(r or {"rope_type": "default"}, rope_theta=theta)
    cfg = AutoConfig.for_model(mt, **kw)
    cfg._attn_implementation = "eager"
    return cfg


def fill_weights(model, seed):
    """transformers' init, then a fixed draw that makes every parameter matter:
    matrices normal(0, 0.1), q/k 0.25 (attention far from uniform, so RoPE
    shows in the loss), routers 0.3 (decisive routing), norms 1 + normal(0,
    0.2), biases normal(0, 0.1).  Drawn in named_parameters order."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            else:
                std = 0.25 if (".q_proj." in name or ".k_proj." in name) else \
                    0.3 if name.endswith("mlp.gate.weight") else 0.1
                p.copy_(std * torch.randn(p.shape, generator=g, dtype=torch.float64))


def make_batch():
    rng = np.random.RandomState(BATCH_SEED)
    rec = rng.randint(0, VOCAB, size=(BATCH, SEQ + 1)).astype(np.int64)
    ids, tgt = rec[:, :-1].copy(), rec[:, 1:].copy()
    for b, t in IGNORED:
        tgt[b, t] = -100
    return torch.from_numpy(ids), torch.from_numpy(tgt)


def forward(model, ids, tgt):
    return model(input_ids=ids, labels=tgt, shift_labels=tgt)


def hub_names(grads):
    """5.x holds a layer's experts stacked (experts.gate_up_proj [E, 2I, H],
    experts.down_proj [E, H, I]); save_pretrained writes them one by one, and
    so do the gradients here."""
    out = {}
    for n, g in grads.items():
        if n.endswith("mlp.experts.gate_up_proj"):
            pre, half = n[:-len("gate_up_proj")], g.shape[1] // 2
            for e in range(g.shape[0]):
                out["%s%d.gate_proj.weight" % (pre, e)] = g[e, :half].contiguous()
                out["%s%d.up_proj.weight" % (pre, e)] = g[e, half:].contiguous()
        elif n.endswith("mlp.experts.down_proj"):
            pre = n[:-len("down_proj")]
            for e in range(g.shape[0]):
                out["%s%d.down_proj.weight" % (pre, e)] = g[e].contiguous()
        else:
            out[n] = g
    return out


def router_gap(out, k):
    gaps = []
    for r in out.router_logits or ():
        if r is None:
            continue
        s = torch.sort(r.double(), dim=-1, descending=True).values
        gaps.append(float((s[:, k - 1] - s[:, k]).min()))
    return min(gaps) if gaps else math.inf


def no_decay(name):
    return "norm" in name or "bias" in name


def adamw(model, ids, tgt):
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
        if k:
            gap = min(gap, router_gap(out, k))
        losses.append(out.loss.item())
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
    return losses, norms, gap


def rotary(model):
    re = model.model.rotary_emb
    return [float(x) for x in re.inv_freq.float()], float(re.attention_scaling)


def one(family, rope, seed, pad=None):
    folder = os.path.join(OUT, "tf" + LINE, "%s-%s" % (family, rope) + ("-pad" if pad is not None else ""))
    os.makedirs(folder, exist_ok=True)
    ids, tgt = make_batch()
    cfg = make_config(family, rope, pad)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, **IMPL).float()
    fill_weights(model, seed)
    model.save_pretrained(folder, safe_serialization=True)
    inv_freq, scaling = rotary(model)

    m64 = AutoModelForCausalLM.from_pretrained(folder, **IMPL).double()
    m64.train()
    out = forward(m64, ids, tgt)
    out.loss.backward()
    k = getattr(cfg, "num_experts_per_tok", 0)
    gap = router_gap(out, k) if k else math.inf
    grads, l2 = {}, {}
    # a tied embedding's gradient includes the LM head's share; no lm_head entry
    for n, p in m64.named_parameters():
        grads[n] = p.grad.detach().float().contiguous()
        l2[n] = float(p.grad.norm())
    save_file({"logits": out.logits[0].detach().float().contiguous()},
              os.path.join(folder, "logits.safetensors"), metadata={"format": "pt"})
    grads = hub_names(grads)
    l2 = {n: float(g.double().norm()) for n, g in grads.items()}
    save_file(dict(sorted(grads.items())), os.path.join(folder, "grads.safetensors"),
              metadata={"format": "pt"})

    # the same weights under default RoPE: the test's evidence that the type matters
    loss_default = None
    if rope != "default":
        cd = make_config(family, "default", pad)
        md = AutoModelForCausalLM.from_config(cd, **IMPL).double()
        md.load_state_dict(m64.state_dict())
        with torch.no_grad():
            loss_default = float(forward(md, ids, tgt).loss)

    m32 = AutoModelForCausalLM.from_pretrained(folder, **IMPL).float()
    m32.train()
    losses, norms, gap32 = adamw(m32, ids, tgt)

    ref = {
        "about": "transformers %s, torch %s: %s with %s RoPE, saved by save_pretrained; "
                 "made by t/ref/make-hf-goldens.py" % (transformers.__version__, torch.__version__,
                                                      family, rope),
        "model": family, "rope": rope, "seed": seed,
        "batch": {"shape": [BATCH, SEQ], "input_ids": ids.tolist(), "target_ids": tgt.tolist(),
                  "note": "targets pre-shifted, full length; -100 at %s" % IGNORED},
        "loss": {"loss_f64": float(out.loss), "loss_f64_default_rope": loss_default,
                 "note": "model.double() (transformers keeps its float32 islands: RoPE table, "
                         "RMSNorm, softmaxes); the MoE loss includes router_aux_loss_coef x aux"},
        "rope": {"inv_freq_f32": inv_freq, "attention_scaling": scaling},
        "logits": {"file": "logits.safetensors", "tensor": "logits", "shape": [SEQ, VOCAB]},
        "grads": {"file": "grads.safetensors", "l2_norms_f64": l2},
        "adamw": dict(ADAMW, betas=list(ADAMW["betas"]), steps=STEPS, max_grad_norm=1.0,
                      no_decay=["norm", "bias"], dtype="float32", losses_f32=losses,
                      grad_norms_f32=norms),
    }
    if k:
        ref["router"] = {"min_topk_logit_gap_f64": gap, "min_topk_logit_gap_f32_adamw": gap32}
        if min(gap, gap32) < GAP_MIN:
            return None
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1, sort_keys=True)
        f.write("\n")
    return ref


def main():
    bad = 0
    for fi, family in enumerate(FAMILIES):
        for ri, rope in enumerate(ROPES):
            seed = 1000 * (fi + 1) + ri
            for tries in range(50):
                ref = one(family, rope, seed)
                if ref:
                    break
                seed += 100   # routing too close to a tie: another draw
            else:
                sys.exit("make-hf-goldens: %s-%s: no seed gives router margins >= %g" %
                         (family, rope, GAP_MIN))
            d = ref["loss"]["loss_f64_default_rope"]
            moved = d is None or abs(d - ref["loss"]["loss_f64"]) > 1e-4 * abs(d)
            if rope == "dynamic":   # positions below max_position_embeddings: the default table
                moved = d is not None and abs(d - ref["loss"]["loss_f64"]) < 1e-12
            print("tf%s %-10s %-8s seed %5d loss %.10f (default RoPE %s) %s" % (
                LINE, family, rope, seed, ref["loss"]["loss_f64"],
                "%.10f" % d if d is not None else "-", "ok" if moved else "RoPE NOT VISIBLE"))
            bad += not moved
    # a pad token that occurs in the batch (id 28, four times): its
    # embedding row gets no gradient, though the tied LM head's share does
    ids, _ = make_batch()
    assert int((ids == 28).sum()) == 4
    ref = one("llama", "default", 1999, pad=28)
    print("tf%s llama      default  pad_token_id 28 (%d tokens) loss %.10f" % (
        LINE, int((ids == 28).sum()), ref["loss"]["loss_f64"]))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
