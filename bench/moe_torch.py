#!/usr/bin/python3
"""moe_torch.py - the PyTorch side of bench/moe-bench.sh.

  /usr/bin/python3 bench/moe_torch.py make DIR          write the benchmark's
      Qwen3-MoE as an HF folder: normal(0, 0.02) weights, norms one, seeded,
      for the shape of DIR/config.json when the caller wrote one
      (moe-bench.sh does, so that its smoke mode can shrink it), else of
      CONFIG below (hidden 256, 4 layers, 16 experts, top-4,
      moe_intermediate_size 128, vocab 512), written to DIR/config.json
  /usr/bin/python3 bench/moe_torch.py train DIR PREFIX THREADS STEPS BATCH SEQ [WARMUP]
      train it in float32 with t/ref/qwen3_ref.py (the faithful port of HF's
      modeling_qwen3_moe.py: per-expert loop with index_add, as HF's eager
      code) and torch.optim.AdamW, on the records of a Megatron dataset, and
      print one JSON line like bench/torch_llama.py (the first WARMUP steps,
      default 2, untimed).
"""
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "t", "ref"))
sys.path.insert(0, HERE)
import qwen3_ref as Q  # noqa: E402
from torch_llama import time_adamw  # noqa: E402

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "vocab_size": 512, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "tie_word_embeddings": False, "attention_bias": False,
    "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 128,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
    "output_router_logits": False, "router_aux_loss_coef": 0.001,
    "hidden_act": "silu", "initializer_range": 0.02, "torch_dtype": "float32",
}


def make(folder):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.json")
    cfg = CONFIG
    if os.path.exists(path):
        with open(path) as f:
            cfg = json.load(f)
    rng = np.random.RandomState(1234)
    w = {}
    for name, shape, kind in Q.parameter_shapes(cfg):
        w[name] = (np.ones(shape) if kind == "norm" else rng.normal(0, 0.02, size=shape)).astype(np.float32)
    Q.write_safetensors(os.path.join(folder, "model.safetensors"), w)
    if cfg is CONFIG:
        with open(path, "w") as f:
            json.dump(CONFIG, f, indent=2)


def train(folder, prefix, threads, steps, batch, seq, warmup=2):
    cfg, w = Q.load_folder(folder)
    m = Q.Qwen3Ref(cfg, w, torch.float32)
    time_adamw(list(m.named_parameters()), lambda x, y: m.loss(x, y)[0], prefix, threads, steps, batch, seq,
               warmup, "torch")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        train(sys.argv[2], sys.argv[3], *(int(x) for x in sys.argv[4:9]))
