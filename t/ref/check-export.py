#!/usr/bin/env python3
"""transformers loads hp-convert's export of each golden folder and gives the source's logits.

    t/ref/check-export.sh            (exports with hp-convert, then runs this per release line)

    python check-export.py EXPORTS LINE      (inside build/ref-venv; LINE 4 or 5)

For every EXPORTS/tf<LINE>/<name>/ (hp-convert --export of data/hf/tf<LINE>/<name>)
it loads both folders with AutoModelForCausalLM.from_pretrained in float32,
runs the golden batch, and requires bit-identical logits; it also checks
that the exported config.json is the source's, key for key.  A
ForConditionalGeneration folder (Qwen3.5 as released) loads as
AutoModelForImageTextToText, and its every weight, the vision tower's among
them, must equal the source's.  Prints one line per folder and exits 1 on
any difference.
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

torch.set_num_threads(1)
transformers.utils.logging.disable_progress_bar()
ONLY = sys.argv[1] == "--logits-only"   # an export made without its source folder
if ONLY:
    del sys.argv[1]
EXP, LINE = sys.argv[1], sys.argv[2]
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "hf")
IMPL = {"attn_implementation": "eager"}
if transformers.__version__.startswith("5"):
    IMPL["experts_implementation"] = "eager"
bad = 0
top = os.path.join(EXP, "tf" + LINE)
for name in sorted(os.listdir(top) if os.path.isdir(top) else []):
    src = os.path.join(SRC, "tf" + LINE, name)
    out = os.path.join(EXP, "tf" + LINE, name)
    ref = json.load(open(os.path.join(src, "reference.json")))
    ids = torch.tensor(ref["batch"]["input_ids"])
    auto = AutoModelForCausalLM
    if json.load(open(os.path.join(src, "config.json")))["architectures"][0].endswith("ForConditionalGeneration"):
        auto = AutoModelForImageTextToText
    a = auto.from_pretrained(src, **IMPL).float().eval()
    b = auto.from_pretrained(out, **IMPL).float().eval()
    with torch.no_grad():
        la, lb = a(input_ids=ids).logits, b(input_ids=ids).logits
    same = torch.equal(la, lb)
    if auto is AutoModelForImageTextToText:   # every weight, the vision tower's too
        sa, sb = a.state_dict(), b.state_dict()
        same = same and sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ca = json.load(open(os.path.join(src, "config.json")))
    cb = json.load(open(os.path.join(out, "config.json")))
    # gpt_oss's MXFP4 experts leave dequantized, without quantization_config
    ca.pop("quantization_config", None)
    keys = ca == cb or ONLY
    print("transformers %s  %-18s logits %s  config.json %s" % (
        transformers.__version__, name, "identical" if same else
        "DIFFER (max %.3g)" % float((la - lb).abs().max()), "from the plan" if ONLY else "same keys and values" if keys else "DIFFERS"))
    bad += not (same and keys)
sys.exit(1 if bad else 0)
