"""hf_torch.py - the transformers side of bench/family-bench.sh (build/ref-venv's
python: torch 2.15.0, transformers 5.24.0).

  python bench/hf_torch.py make DIR
      write DIR/config.json's model (GPT-OSS, DeepSeek-V3, Qwen3-Next) as an HF folder
      with transformers' own save_pretrained: its init, seeded
  python bench/hf_torch.py train DIR PREFIX THREADS STEPS BATCH SEQ [WARMUP]
      train transformers' model of DIR (AutoModelForCausalLM) in float32, eager
      attention and the eager experts loop (attn_implementation and
      experts_implementation "eager": HF's training path on the CPU), with
      torch.optim.AdamW and clipping at 1, on the records of a Megatron
      dataset, and print one JSON line like bench/moe_torch.py (the first
      WARMUP steps, default 2, untimed).
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_llama import time_adamw  # noqa: E402

IMPL = {"attn_implementation": "eager", "experts_implementation": "eager"}


def make(folder):
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(1234)
    cfg = AutoConfig.from_pretrained(folder)
    AutoModelForCausalLM.from_config(cfg, **IMPL).float().save_pretrained(folder)


def train(folder, prefix, threads, steps, batch, seq, warmup=2):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(folder, **IMPL).float()
    m.train()
    time_adamw(list(m.named_parameters()), lambda x, y: m(input_ids=x, labels=y, shift_labels=y).loss, prefix,
               threads, steps, batch, seq, warmup, "transformers")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        train(sys.argv[2], sys.argv[3], *(int(x) for x in sys.argv[4:9]))
