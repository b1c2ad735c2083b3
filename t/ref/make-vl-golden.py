"""make-vl-golden.py - data/hf/tf5/qwen3_5_moe-vl: Qwen3.5-MoE as its releases
ship it, a Qwen3_5MoeForConditionalGeneration folder (the language model
under model.language_model.*, a vision tower under model.visual.*, config.json
with text_config and vision_config), made by transformers 5.24.0 itself.

    OMP_NUM_THREADS=1 PYTHONHASHSEED=0 build/ref-venv/bin/python t/ref/make-vl-golden.py data/hf

(t/ref/make-hf-goldens.sh runs it after the other folders.)

The language model is data/hf/tf5/qwen3_5_moe-default's (its weights copied
in, the text config its config.json's); the vision tower is a tiny one of
transformers' own init, seeded.  On the folder's text-only batch the
ForConditionalGeneration model computes what the text folder's
Qwen3_5MoeForCausalLM computes (asserted: the float64 losses equal to 1e-12,
every language-model gradient equal to 1e-10 relative): so the text
folder's float32 AdamW losses are this folder's, and its reference.json
and grads.safetensors are written under this folder's names.
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

IMPL = {"attn_implementation": "eager", "experts_implementation": "eager"}
PREFIX = "model.language_model."


def main(root):
    src = os.path.join(root, "tf5", "qwen3_5_moe-default")
    out = os.path.join(root, "tf5", "qwen3_5_moe-vl")
    ref = json.load(open(os.path.join(src, "reference.json")))
    text = json.load(open(os.path.join(src, "config.json")))
    for k in ("architectures", "transformers_version", "dtype"):
        text.pop(k, None)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, in_channels=3, out_hidden_size=32,
                  num_position_embeddings=16)
    cfg = Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
    torch.manual_seed(20261207)
    vl = Qwen3_5MoeForConditionalGeneration(cfg).double()
    cm = AutoModelForCausalLM.from_pretrained(src, **IMPL).double()
    sd = cm.state_dict()
    own = vl.state_dict()
    with torch.no_grad():
        for n, t in sd.items():
            m = "lm_head.weight" if n == "lm_head.weight" else PREFIX + n[len("model."):]
            own[m].copy_(t)
    vl.load_state_dict(own)
    vl.config._attn_implementation = "eager"
    vl.config.text_config._attn_implementation = "eager"
    vl.config.text_config._experts_implementation = "eager"
    ids = torch.tensor(ref["batch"]["input_ids"])
    tgt = torch.tensor(ref["batch"]["target_ids"])
    lc = cm(input_ids=ids, labels=tgt, shift_labels=tgt).loss
    lv = vl(input_ids=ids, labels=tgt, shift_labels=tgt).loss
    lc.backward()
    lv.backward()
    assert abs(lc.item() - lv.item()) <= 1e-12 * abs(lc.item()), (lc.item(), lv.item())
    grads = {}
    for n, p in cm.named_parameters():
        m = "lm_head.weight" if n == "lm_head.weight" else PREFIX + n[len("model."):]
        q = dict(vl.named_parameters())[m]
        assert torch.allclose(q.grad, p.grad, rtol=1e-10, atol=0), m
    gsrc = load_file(os.path.join(src, "grads.safetensors"))
    for n, t in gsrc.items():
        grads["lm_head.weight" if n == "lm_head.weight" else PREFIX + n[len("model."):]] = t
    shutil.rmtree(out, ignore_errors=True)
    vl.float().save_pretrained(out)
    save_file(grads, os.path.join(out, "grads.safetensors"), metadata={"format": "pt"})
    ref["about"] = ("Qwen3_5MoeForConditionalGeneration (t/ref/make-vl-golden.py): the language model of "
                    "tf5/qwen3_5_moe-default under model.language_model.*, a tiny vision tower under "
                    "model.visual.*; its float64 loss on this text-only batch %.17g, equal to the text "
                    "folder's (asserted to 1e-12, every language-model gradient to 1e-10), so the text "
                    "folder's loss, gradients (renamed) and float32 AdamW losses are this folder's"
                    % lv.item())
    json.dump(ref, open(os.path.join(out, "reference.json"), "w"), indent=1)
    print("qwen3_5_moe-vl: loss %.12g (text folder %.12g), %d tensors, %d of them visual" %
          (lv.item(), lc.item(), len(vl.state_dict()), sum(1 for n in vl.state_dict() if ".visual." in n)))


if __name__ == "__main__":
    main(sys.argv[1])
