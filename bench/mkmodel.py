#!/usr/bin/python3
"""mkmodel.py - write a randomly initialised Hugging Face Llama folder.

Writes DIR/config.json and DIR/model.safetensors (F32) for a Llama with the
given shape: matrices drawn from normal(0, 0.02) (HF's initializer_range),
RMSNorm weights set to one, from a fixed seed, so that two runs give the same
bytes.  The safetensors file is written by hand (the safetensors package is
not a dependency): an 8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets}} with names sorted and padded with spaces
to a multiple of 8, then the raw little-endian tensors in the same order --
the bytes t/ref/qwen3_ref.py's write_safetensors writes for F32, without
importing it: that module imports torch (seconds), and this needs numpy
alone, so that bench/run.sh's smoke mode makes the model without torch.

This is a benchmark helper, not a converter: no tokenizer files are written
and only the fields a Llama config needs are set.

Usage: /usr/bin/python3 bench/mkmodel.py -o DIR [--hidden 512] [--layers 8]
         [--heads 8] [--kv-heads 4] [--intermediate 1376] [--vocab 512]
         [--max-pos 512] [--tied] [--seed 1234]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def write_safetensors(path, tensors):
    """tensors: dict name -> float32 ndarray, written F32 as described above."""
    names = sorted(tensors)
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for n in names:
        size = tensors[n].size * 4
        header[n] = {"dtype": "F32", "shape": list(tensors[n].shape), "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for n in names:
            f.write(np.ascontiguousarray(tensors[n], dtype="<f4").tobytes())
    os.replace(path + ".tmp", path)


def llama_tensors(a):
    """(name, shape, kind) for every parameter, kind 'matrix' or 'norm'."""
    hd = a.hidden // a.heads
    out = [("model.embed_tokens.weight", (a.vocab, a.hidden), "matrix")]
    for i in range(a.layers):
        p = "model.layers.%d." % i
        out += [
            (p + "input_layernorm.weight", (a.hidden,), "norm"),
            (p + "self_attn.q_proj.weight", (a.heads * hd, a.hidden), "matrix"),
            (p + "self_attn.k_proj.weight", (a.kv_heads * hd, a.hidden), "matrix"),
            (p + "self_attn.v_proj.weight", (a.kv_heads * hd, a.hidden), "matrix"),
            (p + "self_attn.o_proj.weight", (a.hidden, a.heads * hd), "matrix"),
            (p + "post_attention_layernorm.weight", (a.hidden,), "norm"),
            (p + "mlp.gate_proj.weight", (a.intermediate, a.hidden), "matrix"),
            (p + "mlp.up_proj.weight", (a.intermediate, a.hidden), "matrix"),
            (p + "mlp.down_proj.weight", (a.hidden, a.intermediate), "matrix"),
        ]
    out.append(("model.norm.weight", (a.hidden,), "norm"))
    if not a.tied:
        out.append(("lm_head.weight", (a.vocab, a.hidden), "matrix"))
    return out


def main():
    ap = argparse.ArgumentParser(description="write a random HF Llama folder")
    ap.add_argument("-o", "--out", required=True, help="output folder")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=1376)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--max-pos", type=int, default=512)
    ap.add_argument("--tied", action="store_true", help="tie lm_head to the embedding")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    if a.hidden % a.heads or a.heads % a.kv_heads:
        sys.exit("mkmodel: hidden must divide by heads and heads by kv-heads")

    rng = np.random.RandomState(a.seed)
    tensors = {}
    for name, shape, kind in llama_tensors(a):
        if kind == "norm":
            tensors[name] = np.ones(shape, dtype=np.float32)
        else:
            tensors[name] = rng.normal(0.0, 0.02, size=shape).astype(np.float32)

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.hidden // a.heads,
        "vocab_size": a.vocab,
        "max_position_embeddings": a.max_pos,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": bool(a.tied),
        "initializer_range": 0.02,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(a.out, "model.safetensors"), tensors)


if __name__ == "__main__":
    main()
