#!/usr/bin/python3
"""Regenerate the Qwen3 / Qwen3-MoE fixtures and goldens of data/ref/.

    /usr/bin/python3 t/ref/make-qwen3-fixtures.py     (Debian's python3-torch)

Needs only torch and numpy (no transformers, no safetensors package): the
reference is the port in t/ref/qwen3_ref.py, checked against transformers
itself by t/ref/check-qwen3-vs-transformers.py (see t/ref/README.md).
Everything comes from fixed seeds; two runs write the same bytes.

Writes, under data/ref/ (or the folder given as the only argument):

  qwen3-dense/          qwen3, F32, one model.safetensors
  qwen3-dense-bf16/     the same weights rounded to BF16 (RNE)
  qwen3-moe-a/          qwen3_moe, 8 experts top-2, dense layer 0, aux loss
                        on, tied embeddings; two files + index
  qwen3-moe-b/          qwen3_moe, 16 experts top-4, no renormalisation
  qwen3-moe-b-stacked/  qwen3-moe-b with the experts stacked as
                        transformers 5.x holds them (gate_up_proj, down_proj)

and in each a reference.json (+ logits.safetensors, grads.safetensors):
the fixed 2x64 batch, the loss in float64 and float32, the logits of the
first sequence, every gradient (float64, stored F32), a finite-difference
check, and five torch.optim.AdamW steps in float32.  It also checks itself
(float32 against float64, finite differences, reload of every folder) and
exits 1 if a check fails.
"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_ref as Q  # noqa: E402

torch.set_num_threads(1)  # summation order, hence float32 results, fixed

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "ref")

BATCH, SEQ, VOCAB = 2, 64, 512
BATCH_SEED = 20250514
IGNORED = [(0, 5), (0, 6), (0, 31), (1, 0), (1, 63)]   # (row, position) targets set to -100
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
MAX_GRAD_NORM = 1.0
STEPS = 5
# Smallest allowed distance between the k-th and (k+1)-th router logit of
# any token: a float32 or reordered computation must pick the same experts.
GAP_MIN = 5e-4
STD = {"matrix": 0.02, "bias": 0.1, "norm": 0.2, "router": 0.1}


def base_config(model_type):
    """The keys transformers 4.51.3 save_pretrained writes for these configs."""
    c = {
        "architectures": ["Qwen3ForCausalLM" if model_type == "qwen3" else "Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
        "model_type": model_type,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.51.3",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }
    if model_type == "qwen3_moe":
        c.update({"decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": False,
                  "output_router_logits": False, "router_aux_loss_coef": 0.001})
    return c


def dense_config():
    c = base_config("qwen3")
    c.update({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96,
              "attention_bias": True, "tie_word_embeddings": False,
              "rope_theta": 1000000.0, "rms_norm_eps": 1e-06})
    return c


def moe_a_config():
    c = base_config("qwen3_moe")
    c.update({"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
              "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
              "norm_topk_prob": True, "mlp_only_layers": [0], "decoder_sparse_step": 1,
              "output_router_logits": True, "router_aux_loss_coef": 0.01,
              "tie_word_embeddings": True, "rope_theta": 1000000.0})
    return c


def moe_b_config():
    c = base_config("qwen3_moe")
    c.update({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "head_dim": 16, "intermediate_size": 128,
              "moe_intermediate_size": 24, "num_experts": 16, "num_experts_per_tok": 4,
              "norm_topk_prob": False, "mlp_only_layers": [], "decoder_sparse_step": 1,
              "output_router_logits": False, "router_aux_loss_coef": 0.001,
              "tie_word_embeddings": False, "rope_theta": 10000.0})
    return c


def init_weights(cfg, seed):
    """name -> float32 ndarray: matrices normal(0, 0.02), biases normal(0, 0.1),
    norms 1 + normal(0, 0.2), routers normal(0, 0.1); one RandomState, drawn
    in parameter_shapes order."""
    rng = np.random.RandomState(seed)
    w = {}
    for name, shape, kind in Q.parameter_shapes(cfg):
        a = rng.normal(0.0, STD[kind], size=shape)
        if kind == "norm":
            a = 1.0 + a
        w[name] = a.astype(np.float32)
    return w


def make_batch():
    rng = np.random.RandomState(BATCH_SEED)
    rec = rng.randint(0, VOCAB, size=(BATCH, SEQ + 1)).astype(np.int64)
    ids = rec[:, :-1].copy()
    tgt = rec[:, 1:].copy()
    for b, t in IGNORED:
        tgt[b, t] = -100
    return torch.from_numpy(ids), torch.from_numpy(tgt)


# --- writing folders ---------------------------------------------------------

def write_config(folder, cfg):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def write_single(folder, cfg, w, dtype="F32"):
    write_config(folder, cfg)
    Q.write_safetensors(os.path.join(folder, "model.safetensors"), w, dtype)


def write_sharded(folder, cfg, w, first):
    """Two files; names for which first(name) is true go to the first."""
    write_config(folder, cfg)
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    parts = [{n: a for n, a in w.items() if first(n)}, {n: a for n, a in w.items() if not first(n)}]
    total = 0
    wmap = {}
    for fn, part in zip(files, parts):
        total += Q.write_safetensors(os.path.join(folder, fn), part)
        for n in part:
            wmap[n] = fn
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": {n: wmap[n] for n in sorted(wmap)}}, f, indent=2)
        f.write("\n")


# --- goldens -----------------------------------------------------------------

def no_decay(name):
    return "norm" in name or "bias" in name


def run_adamw(cfg, w, ids, tgt):
    """Five steps in float32 on the same batch: losses before each update."""
    m = Q.Qwen3Ref(cfg, {n: torch.from_numpy(a) for n, a in w.items()}, torch.float32)
    named = m.named_parameters()
    groups = [{"params": [t for n, t in named if not no_decay(n)], "weight_decay": ADAMW["weight_decay"]},
              {"params": [t for n, t in named if no_decay(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"])
    params = [t for _, t in named]
    k = cfg.get("num_experts_per_tok", 0)
    out = {"losses": [], "ce": [], "aux": [], "grad_norms": [], "gap": math.inf}
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        total, ce, aux, _, routers, _ = m.loss(ids, tgt)
        total.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        opt.step()
        out["losses"].append(total.item())
        out["ce"].append(ce.item())
        out["aux"].append(None if aux is None else aux.item())
        out["grad_norms"].append(norm.item())
        if routers:
            out["gap"] = min(out["gap"], Q.router_min_gap(routers, k))
    return out


def finite_differences(cfg, w, ids, tgt, picks):
    """Central differences in float64 on single elements against autograd."""
    base = {n: torch.from_numpy(a).double() for n, a in w.items()}
    m = Q.Qwen3Ref(cfg, base, torch.float64)
    m.loss(ids, tgt)[0].backward()
    rows = []
    h = 1e-5
    for name, index in picks:
        vals = []
        for s in (+1, -1):
            ww = dict(base)
            t = base[name].clone()
            t.view(-1)[index] += s * h
            ww[name] = t
            with torch.no_grad():
                vals.append(Q.Qwen3Ref(cfg, ww, torch.float64).loss(ids, tgt)[0].item())
        num = (vals[0] - vals[1]) / (2 * h)
        ana = m.p[name].grad.view(-1)[index].item()
        err = abs(num - ana)
        rows.append({"param": name, "flat_index": index, "autograd": ana, "numeric": num,
                     "abs_err": err, "rel_err": err / max(abs(ana), 1e-300)})
    return rows


def goldens(name, cfg, w, ids, tgt, fd_picks, folder):
    """Compute and write reference.json, logits.safetensors, grads.safetensors."""
    k = cfg.get("num_experts_per_tok", 0)
    t64 = {n: torch.from_numpy(a).double() for n, a in w.items()}
    m64 = Q.Qwen3Ref(cfg, t64, torch.float64)
    total64, ce64, aux64, logits64, routers64, sel64 = m64.loss(ids, tgt)
    total64.backward()
    m32 = Q.Qwen3Ref(cfg, {n: torch.from_numpy(a) for n, a in w.items()}, torch.float32)
    total32, ce32, aux32, logits32, routers32, sel32 = m32.loss(ids, tgt)
    total32.backward()

    checks = []
    dloss = abs(total32.item() - total64.item())
    checks.append(("loss f32 vs f64 %.3e < 1e-5" % dloss, dloss < 1e-5))
    same_routes = all(torch.equal(a, b) for a, b in zip(sel32, sel64))
    checks.append(("float32 routes the tokens as float64", same_routes))
    gmax = max((m32.p[n].grad.double() - m64.p[n].grad).abs().max().item() for n in m64.p)
    checks.append(("grad f32 vs f64 %.3e < 1e-5" % gmax, gmax < 1e-5))
    lmax = (logits32.double() - logits64).abs().max().item()

    ref = {
        "about": ("Goldens for data/ref/%s computed by t/ref/make-qwen3-fixtures.py with the "
                  "port t/ref/qwen3_ref.py of transformers' modeling_qwen3(_moe).py, torch %s. "
                  "Random weights generated here from fixed seeds." % (name, torch.__version__)),
        "model": name,
        "batch": {
            "shape": [BATCH, SEQ],
            "input_ids": ids.tolist(),
            "target_ids": tgt.tolist(),
            "note": ("targets are the inputs shifted by one (record of 65 random tokens, seed %d, "
                     "inputs rec[:-1], targets rec[1:]) with the targets at (row, pos) %s set to -100; "
                     "loss = mean cross-entropy over the %d targets != -100"
                     % (BATCH_SEED, IGNORED, int((tgt != -100).sum()))),
        },
        "loss": {
            "loss_f64": total64.item(),
            "loss_f32": total32.item(),
            "cross_entropy_f64": ce64.item(),
            "cross_entropy_f32": ce32.item(),
        },
        "logits": {
            "file": "logits.safetensors",
            "tensor": "logits",
            "shape": [SEQ, VOCAB],
            "note": "logits of batch row 0, computed in float64, stored F32",
            "argmax": logits64[0].argmax(-1).tolist(),
            "max_abs_diff_f32_vs_f64": lmax,
        },
        "grads": {
            "file": "grads.safetensors",
            "note": ("d loss_f64 / d param for every parameter, HF tensor names, computed in float64, "
                     "stored F32" + ("; model.embed_tokens.weight includes the tied lm_head's share"
                                     if cfg.get("tie_word_embeddings") else "")
                     + ("; the loss includes router_aux_loss_coef * aux" if aux64 is not None else "")),
            "l2_norms_f64": {n: m64.p[n].grad.norm().item() for n in sorted(m64.p)},
            "max_abs_diff_f32_vs_f64": gmax,
        },
    }
    if aux64 is not None:
        ref["loss"].update({
            "aux_f64": aux64.item(),
            "aux_f32": aux32.item(),
            "router_aux_loss_coef": cfg["router_aux_loss_coef"],
            "note": "loss = cross_entropy + router_aux_loss_coef * aux (output_router_logits true)",
        })
    if routers64:
        with torch.no_grad():
            off64 = m64.loss(ids, tgt, output_router_logits=False)[0].item()
            off32 = m32.loss(ids, tgt, output_router_logits=False)[0].item()
        if cfg.get("output_router_logits"):
            ref["loss"]["loss_without_router_logits_f64"] = off64
            ref["loss"]["loss_without_router_logits_f32"] = off32
            ref["loss"]["note_without"] = ("the same batch with output_router_logits false: "
                                           "cross-entropy only, no aux term")
            ok = off64 == ce64.item()
            checks.append(("output_router_logits false gives the cross-entropy alone", ok))
        else:
            with torch.no_grad():
                on64 = m64.loss(ids, tgt, output_router_logits=True)
            ref["loss"]["aux_f64_if_enabled"] = on64[2].item()
            ref["loss"]["note"] = ("output_router_logits false: loss is the cross-entropy alone; "
                                   "aux_f64_if_enabled is what load_balancing_loss_func would give")
        gap64 = Q.router_min_gap(routers64, k)
        ref["router"] = {
            "moe_layers": [i for i in range(cfg["num_hidden_layers"]) if Q.is_moe_layer(cfg, i)],
            "tokens_per_expert_f64": [torch.bincount(s.reshape(-1), minlength=cfg["num_experts"]).tolist()
                                      for s in sel64],
            "min_topk_logit_gap_f64": gap64,
            "note": ("tokens_per_expert counts top-k assignments per MoE layer; min_topk_logit_gap is "
                     "the smallest distance between a token's k-th and (k+1)-th router logit, kept "
                     ">= %g so that any correct float32 computation picks the same experts" % GAP_MIN),
        }
        checks.append(("router gap %.3e >= %g" % (gap64, GAP_MIN), gap64 >= GAP_MIN))

    fd = finite_differences(cfg, w, ids, tgt, fd_picks)
    ref["finite_differences"] = {
        "h": 1e-5, "dtype": "float64", "checks": fd,
        "note": ("central differences (L(w+h) - L(w-h)) / 2h of loss_f64 on single elements; "
                 "their own error is about 1e-10 (h^2 truncation, rounding of L / h)")}
    for r in fd:
        print("  fd %-48s [%5d] autograd % .10e numeric % .10e abs %.1e rel %.1e"
              % (r["param"], r["flat_index"], r["autograd"], r["numeric"], r["abs_err"], r["rel_err"]))
        checks.append(("finite difference %s[%d] |err| %.1e <= 1e-9 + 1e-6 |g|"
                       % (r["param"], r["flat_index"], r["abs_err"]),
                       r["abs_err"] <= 1e-9 + 1e-6 * abs(r["autograd"])))

    ad = run_adamw(cfg, w, ids, tgt)
    ref["adamw"] = {
        "optimizer": "torch.optim.AdamW",
        "lr": ADAMW["lr"], "betas": list(ADAMW["betas"]), "eps": ADAMW["eps"],
        "weight_decay": ADAMW["weight_decay"],
        "no_decay": "parameters whose name contains 'norm' or 'bias' (weight_decay 0)",
        "max_grad_norm": MAX_GRAD_NORM,
        "clip": "torch.nn.utils.clip_grad_norm_ over all parameters (tied embedding once)",
        "dtype": "float32",
        "steps": STEPS,
        "batch": "the batch above, every step",
        "losses_f32": ad["losses"],
        "grad_norms_f32": ad["grad_norms"],
        "note": "losses_f32[i] is the loss before update i+1; grad_norms_f32 the norm before clipping",
    }
    if aux64 is not None:
        ref["adamw"]["cross_entropy_f32"] = ad["ce"]
        ref["adamw"]["aux_f32"] = ad["aux"]
    if routers64:
        ref["adamw"]["min_topk_logit_gap_f32"] = ad["gap"]
        checks.append(("router gap over the AdamW steps %.3e >= %g" % (ad["gap"], GAP_MIN),
                       ad["gap"] >= GAP_MIN))
    checks.append(("AdamW lowers the loss", ad["losses"][-1] < ad["losses"][0]))

    Q.write_safetensors(os.path.join(folder, "logits.safetensors"),
                        {"logits": logits64[0].detach().float().numpy()})
    Q.write_safetensors(os.path.join(folder, "grads.safetensors"),
                        {n: m64.p[n].grad.float().numpy() for n in m64.p})
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    return ref, checks, logits64.detach()


def reload_check(folder, cfg, w, ids, tgt, expect):
    """The folder as written gives back the weights and the float64 loss."""
    cfg2, w2 = Q.load_folder(folder)
    ok = cfg2 == cfg and set(w2) == set(w) and all(
        np.array_equal(w2[n].numpy(), w[n]) for n in w)
    with torch.no_grad():
        loss = Q.Qwen3Ref(cfg2, w2, torch.float64).loss(ids, tgt)[0].item()
    return ("reload %s: weights identical, loss %.12f" % (os.path.basename(folder), loss),
            ok and loss == expect)


def main():
    ids, tgt = make_batch()
    allchecks = []
    summary = {}

    # qwen3-dense and its BF16 copy
    cfg = dense_config()
    w = init_weights(cfg, 1001)
    folder = os.path.join(ROOT, "qwen3-dense")
    print("qwen3-dense")
    write_single(folder, cfg, w)
    ref, checks, logits_f32w = goldens("qwen3-dense", cfg, w, ids, tgt, [
        ("model.layers.0.self_attn.q_norm.weight", 3),
        ("model.layers.1.self_attn.k_norm.weight", 17),
        ("model.layers.0.self_attn.k_proj.bias", 40),
        ("model.layers.1.self_attn.o_proj.bias", 9),
        ("model.layers.1.mlp.down_proj.weight", 1234),
        ("model.embed_tokens.weight", int(ids[0, 3]) * 64 + 5)], folder)
    checks.append(reload_check(folder, cfg, w, ids, tgt, ref["loss"]["loss_f64"]))
    allchecks += checks
    summary["qwen3-dense"] = ref

    cfgb = dict(cfg, torch_dtype="bfloat16")
    wb = {n: Q.bf16_round(a) for n, a in w.items()}
    folder = os.path.join(ROOT, "qwen3-dense-bf16")
    print("qwen3-dense-bf16")
    write_single(folder, cfgb, wb, "BF16")
    m64 = Q.Qwen3Ref(cfgb, {n: torch.from_numpy(a).double() for n, a in wb.items()}, torch.float64)
    m32 = Q.Qwen3Ref(cfgb, {n: torch.from_numpy(a) for n, a in wb.items()}, torch.float32)
    with torch.no_grad():
        l64, _, _, lg64, _, _ = m64.loss(ids, tgt)
        l32, _, _, lg32, _, _ = m32.loss(ids, tgt)
    Q.write_safetensors(os.path.join(folder, "logits.safetensors"), {"logits": lg64[0].float().numpy()})
    refb = {
        "about": ("Goldens for data/ref/qwen3-dense-bf16: the weights of qwen3-dense rounded to BF16 "
                  "(round to nearest even), computed in float64 from the BF16 values by "
                  "t/ref/make-qwen3-fixtures.py (port t/ref/qwen3_ref.py), torch %s" % torch.__version__),
        "model": "qwen3-dense-bf16",
        "batch": "the batch of ../qwen3-dense/reference.json (input_ids, target_ids)",
        "loss": {"loss_f64": l64.item(), "loss_f32": l32.item(),
                 "note": "loss_f32: the BF16 weights widened to float32 and computed in float32"},
        "logits": {"file": "logits.safetensors", "tensor": "logits", "shape": [SEQ, VOCAB],
                   "note": "logits of batch row 0, computed in float64 from the BF16 weights, stored F32",
                   "argmax": lg64[0].argmax(-1).tolist(),
                   "max_abs_diff_f32_vs_f64": (lg32.double() - lg64).abs().max().item(),
                   "max_abs_diff_vs_f32_weights": (lg64 - logits_f32w).abs().max().item()},
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(refb, f, indent=1)
        f.write("\n")
    allchecks.append(reload_check(folder, cfgb, wb, ids, tgt, l64.item()))
    allchecks.append(("bf16 loss f32 vs f64 %.2e < 1e-5" % abs(l32.item() - l64.item()),
                      abs(l32.item() - l64.item()) < 1e-5))
    summary["qwen3-dense-bf16"] = refb

    # qwen3-moe-a: two files and an index
    cfg = moe_a_config()
    w = init_weights(cfg, 2026)
    folder = os.path.join(ROOT, "qwen3-moe-a")
    print("qwen3-moe-a")
    write_sharded(folder, cfg, w, lambda n: n.startswith(("model.embed_tokens.", "model.layers.0.",
                                                           "model.layers.1.")))
    ref, checks, _ = goldens("qwen3-moe-a", cfg, w, ids, tgt, [
        ("model.layers.1.mlp.gate.weight", 77),
        ("model.layers.2.mlp.gate.weight", 300),
        ("model.layers.2.mlp.experts.5.up_proj.weight", 100),
        ("model.layers.1.self_attn.q_norm.weight", 7),
        ("model.layers.0.mlp.gate_proj.weight", 2000),
        ("model.embed_tokens.weight", int(ids[1, 10]) * 64 + 33)], folder)
    checks.append(reload_check(folder, cfg, w, ids, tgt, ref["loss"]["loss_f64"]))
    allchecks += checks
    summary["qwen3-moe-a"] = ref

    # qwen3-moe-b, per expert and stacked
    cfg = moe_b_config()
    w = init_weights(cfg, 3012)
    folder = os.path.join(ROOT, "qwen3-moe-b")
    print("qwen3-moe-b")
    write_single(folder, cfg, w)
    ref, checks, _ = goldens("qwen3-moe-b", cfg, w, ids, tgt, [
        ("model.layers.0.mlp.gate.weight", 500),
        ("model.layers.1.mlp.experts.11.down_proj.weight", 200),
        ("model.layers.1.self_attn.k_norm.weight", 2),
        ("lm_head.weight", 4321)], folder)
    checks.append(reload_check(folder, cfg, w, ids, tgt, ref["loss"]["loss_f64"]))
    allchecks += checks
    summary["qwen3-moe-b"] = ref

    folder = os.path.join(ROOT, "qwen3-moe-b-stacked")
    print("qwen3-moe-b-stacked")
    ws = {n: t.numpy() for n, t in Q.stack_experts({n: torch.from_numpy(a) for n, a in w.items()},
                                                    cfg).items()}
    write_single(folder, cfg, ws)
    src = os.path.join(ROOT, "qwen3-moe-b", "logits.safetensors")
    with open(src, "rb") as f:
        blob = f.read()
    with open(os.path.join(folder, "logits.safetensors"), "wb") as f:
        f.write(blob)   # byte-identical: git stores it once
    refs = {
        "about": ("qwen3-moe-b with the experts in transformers 5.x's stacked layout: "
                  "model.layers.L.mlp.experts.gate_up_proj [E, 2*I, H] = for each expert e, "
                  "cat(experts.e.gate_proj.weight, experts.e.up_proj.weight) along rows (gate rows "
                  "0..I-1, up rows I..2I-1), and experts.down_proj [E, H, I] = stack of "
                  "experts.e.down_proj.weight.  The same model: every number of "
                  "../qwen3-moe-b/reference.json holds; the gradients are in "
                  "../qwen3-moe-b/grads.safetensors under the per-expert names (stack them the "
                  "same way).  logits.safetensors is a byte copy of qwen3-moe-b's."),
        "model": "qwen3-moe-b-stacked",
        "same_as": "../qwen3-moe-b/reference.json",
        "loss": ref["loss"],
        "adamw_losses_f32": ref["adamw"]["losses_f32"],
        "logits": {"file": "logits.safetensors", "tensor": "logits", "shape": [SEQ, VOCAB]},
        "grads_file": "../qwen3-moe-b/grads.safetensors",
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(refs, f, indent=1)
        f.write("\n")
    allchecks.append(reload_check(folder, cfg, w, ids, tgt, ref["loss"]["loss_f64"]))

    bad = 0
    for what, ok in allchecks:
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        bad += not ok
    for name, r in summary.items():
        print("%-20s loss_f64 %.10f loss_f32 %.10f%s%s" % (
            name, r["loss"]["loss_f64"], r["loss"]["loss_f32"],
            "  aux_f64 %.10f" % r["loss"]["aux_f64"] if "aux_f64" in r["loss"] else "",
            "  adamw %s" % " ".join("%.6f" % x for x in r["adamw"]["losses_f32"]) if "adamw" in r else ""))
    total = 0
    for dp, _, fns in os.walk(ROOT):
        total += sum(os.path.getsize(os.path.join(dp, fn)) for fn in fns)
    print("%s: %d bytes" % (ROOT, total))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
