"""oss_torch.py - the transformers side of bench/oss-bench.sh (build/ref-venv's
python: torch 2.15.0, transformers 5.24.0).

  python bench/oss_torch.py make DIR
      write DIR/config.json's GPT-OSS as an HF folder with transformers'
      own save_pretrained: its init, seeded
  python bench/oss_torch.py train DIR PREFIX THREADS STEPS BATCH SEQ [WARMUP]
      train transformers' GptOssForCausalLM from DIR in float32, eager
      attention and the eager experts loop (attn_implementation and
      experts_implementation "eager": HF's training path on the CPU), with
      torch.optim.AdamW and clipping at 1, on the records of a Megatron
      dataset, and print one JSON line like bench/moe_torch.py (the first
      WARMUP steps, default 2, untimed).
"""
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_llama import read_indexed  # noqa: E402

IMPL = {"attn_implementation": "eager", "experts_implementation": "eager"}


def make(folder):
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(1234)
    cfg = AutoConfig.from_pretrained(folder)
    AutoModelForCausalLM.from_config(cfg, **IMPL).float().save_pretrained(folder)


def train(folder, prefix, threads, steps, batch, seq, warmup=2):
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    m = AutoModelForCausalLM.from_pretrained(folder, **IMPL).float()
    m.train()
    named = list(m.named_parameters())
    params = [t for _, t in named]
    decay = [t for n, t in named if "norm" not in n and "bias" not in n]
    nodecay = [t for n, t in named if "norm" in n or "bias" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    recs = read_indexed(prefix)
    times, losses = [], []
    for step in range(steps):
        rec = torch.from_numpy(np.stack([recs[(step * batch + i) % len(recs)] for i in range(batch)])).long()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        tgt = rec[:, 1:].contiguous()
        loss = m(input_ids=rec[:, :-1].contiguous(), labels=tgt, shift_labels=tgt).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    timed = times[warmup:]
    if not timed:
        sys.exit("oss_torch: %d steps leave none timed after %d warm-up steps" % (steps, warmup))
    print(json.dumps({"impl": "transformers", "tokens_per_s": batch * seq * len(timed) / sum(timed),
                      "step_time_s": sum(timed) / len(timed), "first_loss": losses[0],
                      "threads": threads}))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        train(sys.argv[2], sys.argv[3], *(int(x) for x in sys.argv[4:9]))
