#!/usr/bin/env python3
"""Check the data/ref/ Qwen3 goldens against HF transformers itself.

Optional; not part of `make check`.  Needs transformers 4.51.3 and the
safetensors package next to Debian's torch 1.13:

    /usr/bin/python3 -m venv --system-site-packages /tmp/tfvenv
    /tmp/tfvenv/bin/pip install 'transformers==4.51.3' safetensors
    /tmp/tfvenv/bin/python t/ref/check-qwen3-vs-transformers.py [data/ref]

transformers 4.51.3 does not import on torch 1.13 as it is: modeling_utils
does `import torch.distributed.tensor` (torch >= 2.4) and the modules touch
torch.compiler and torch.float8_e4m3fn.  None of these is used on the path
exercised here (eager attention, CPU, no tensor parallelism, no compile), so
stand-ins are installed before the import; see shim_old_torch().

For qwen3-dense, qwen3-dense-bf16, qwen3-moe-a and qwen3-moe-b, builds the
model from the folder's config.json (AutoConfig.from_pretrained; the model's
from_pretrained needs torch 2) and loads its tensors with the safetensors
package, through the index when sharded, then compares with reference.json and the golden files: the logits of row
0, the loss (float32 model, and model.double()), every gradient, and five
torch.optim.AdamW steps.  qwen3-moe-b-stacked is not loadable by 4.x (5.x
reads it, 5.x needs torch >= 2); it is the same model as qwen3-moe-b.

The loss is HF's own ForCausalLMLoss, given the golden targets through its
shift_labels argument (the goldens use pre-shifted targets of the full
length, as hp-train does).  transformers 4.51.3 cannot compute the aux loss
of qwen3-moe-a itself: with mlp_only_layers non-empty its router-logit tuple
holds None for the dense layers and load_balancing_loss_func fails on it
(later versions record router logits from the sparse blocks only).  This
script shows that failure, then calls 4.51.3's load_balancing_loss_func on
the tuple without the None entries, which is what later versions compute.
"""
import importlib
import json
import os
import sys
import types

import torch


def shim_old_torch():
    if "torch.distributed.tensor" not in sys.modules:
        try:
            importlib.import_module("torch.distributed.tensor")
        except ImportError:
            m = types.ModuleType("torch.distributed.tensor")

            class DTensor:  # never instantiated: isinstance() checks answer False
                pass
            m.DTensor = DTensor
            sys.modules["torch.distributed.tensor"] = m
            torch.distributed.tensor = m
    if not hasattr(torch, "compiler"):
        c = types.ModuleType("torch.compiler")

        def disable(fn=None, recursive=True):
            return (lambda f: f) if fn is None else fn
        c.disable = disable
        c.is_compiling = lambda: False
        sys.modules["torch.compiler"] = c
        torch.compiler = c
    for n in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
        if not hasattr(torch, n):
            setattr(torch, n, object())   # only used as dict keys of dtype tables


shim_old_torch()
import transformers  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_ref as Q  # noqa: E402

torch.set_num_threads(1)
ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "ref")
TOL = 1e-5
bad = 0
shown = False


def check(what, ok):
    global bad
    print("%s %s" % ("ok  " if ok else "FAIL", what))
    bad += not ok


def hf_loss(model, cfg, ids, tgt):
    """(total, cross-entropy, aux or None, logits) computed by transformers."""
    global shown
    if cfg.get("model_type") == "qwen3_moe" and cfg.get("output_router_logits"):
        try:
            out = model(input_ids=ids, labels=tgt, shift_labels=tgt)
            ce = out.loss - cfg["router_aux_loss_coef"] * out.aux_loss
            return out.loss, ce, out.aux_loss, out.logits
        except AttributeError as e:
            if not shown:
                print("     transformers %s fails with output_router_logits and mlp_only_layers "
                      "(%s); calling its load_balancing_loss_func without the None entries"
                      % (transformers.__version__, e))
                shown = True
        base = model.model(input_ids=ids, output_router_logits=True)
        routers = tuple(r for r in base.router_logits if r is not None)
        aux = modeling_qwen3_moe.load_balancing_loss_func(
            routers, cfg["num_experts"], cfg["num_experts_per_tok"], None)
        out = model(input_ids=ids, labels=tgt, shift_labels=tgt, output_router_logits=False)
        return out.loss + cfg["router_aux_loss_coef"] * aux, out.loss, aux, out.logits
    out = model(input_ids=ids, labels=tgt, shift_labels=tgt)
    return out.loss, out.loss, None, out.logits


def load(folder, dtype):
    """transformers' model for a folder.  from_pretrained itself needs torch 2
    (named_parameters(remove_duplicate=...)), so: AutoConfig.from_pretrained,
    from_config, and the tensors read by the safetensors package (not by this
    project's writer) through the index when there is one."""
    from safetensors.torch import load_file
    config = transformers.AutoConfig.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_config(
        config, torch_dtype=dtype, attn_implementation="eager")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    sd = {}
    for fn in files:
        sd.update(load_file(os.path.join(folder, fn)))
    sd = {n: t.to(dtype) for n, t in sd.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    allowed = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - allowed or unexpected:
        raise SystemExit("%s: missing %s unexpected %s" % (folder, missing, unexpected))
    model.tie_weights()
    if config.tie_word_embeddings and model.lm_head.weight is not model.model.embed_tokens.weight:
        raise SystemExit("%s: lm_head not tied" % folder)
    return model


def one(name):
    folder = os.path.join(ROOT, name)
    with open(os.path.join(folder, "reference.json")) as f:
        ref = json.load(f)
    if isinstance(ref["batch"], str):
        with open(os.path.join(ROOT, "qwen3-dense", "reference.json")) as f:
            batch = json.load(f)["batch"]
    else:
        batch = ref["batch"]
    ids = torch.tensor(batch["input_ids"])
    tgt = torch.tensor(batch["target_ids"])
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    print("%s (transformers %s, torch %s)" % (name, transformers.__version__, torch.__version__))
    model = load(folder, torch.float32)
    total, ce, aux, logits = hf_loss(model, cfg, ids, tgt)
    total.backward()
    gl = Q.read_safetensors(os.path.join(folder, "logits.safetensors"))["logits"]
    d = (logits[0].detach() - gl).abs().max().item()
    check("logits row 0 vs golden: max |diff| %.2e" % d, d < TOL)
    d = abs(total.item() - ref["loss"]["loss_f64"])
    check("loss %.9f vs golden f64 %.9f (|diff| %.2e)" % (total.item(), ref["loss"]["loss_f64"], d), d < TOL)
    d = abs(total.item() - ref["loss"]["loss_f32"])
    check("loss vs golden f32 port %.9f (|diff| %.2e)" % (ref["loss"]["loss_f32"], d), d < TOL)
    if aux is not None:
        d = abs(aux.item() - ref["loss"]["aux_f64"])
        check("aux %.9f vs golden %.9f (|diff| %.2e)" % (aux.item(), ref["loss"]["aux_f64"], d), d < TOL)
        d = abs(ce.item() - ref["loss"]["loss_without_router_logits_f64"])
        check("loss with output_router_logits false vs golden (|diff| %.2e)" % d, d < TOL)
    if "grads" not in ref:
        return
    golden = Q.read_safetensors(os.path.join(folder, "grads.safetensors"))
    named = dict(model.named_parameters())
    check("parameter names: HF %d, golden %d, equal sets" % (len(named), len(golden)),
          set(named) == set(golden))
    worst = max((named[n].grad - golden[n]).abs().max().item() for n in golden if n in named)
    check("every gradient vs golden: max |diff| %.2e" % worst, worst < TOL)

    m64 = load(folder, torch.float64)
    t64 = hf_loss(m64, cfg, ids, tgt)[0]
    d = abs(t64.item() - ref["loss"]["loss_f64"])
    check("model.double() loss vs golden f64 (|diff| %.2e; HF keeps norms and softmax in float32)" % d,
          d < TOL)

    model = load(folder, torch.float32)
    ad = ref["adamw"]
    named = list(model.named_parameters())
    nd = [p for n, p in named if "norm" in n or "bias" in n]
    dd = [p for n, p in named if not ("norm" in n or "bias" in n)]
    opt = torch.optim.AdamW([{"params": dd, "weight_decay": ad["weight_decay"]},
                             {"params": nd, "weight_decay": 0.0}],
                            lr=ad["lr"], betas=tuple(ad["betas"]), eps=ad["eps"])
    losses = []
    for _ in range(ad["steps"]):
        opt.zero_grad(set_to_none=True)
        loss = hf_loss(model, cfg, ids, tgt)[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in named], ad["max_grad_norm"])
        opt.step()
        losses.append(loss.item())
    d = max(abs(a - b) for a, b in zip(losses, ad["losses_f32"]))
    check("AdamW losses %s vs golden: max |diff| %.2e" % (" ".join("%.6f" % x for x in losses), d), d < TOL)


def main():
    for name in ("qwen3-dense", "qwen3-dense-bf16", "qwen3-moe-a", "qwen3-moe-b"):
        one(name)
    print("%d failed" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
