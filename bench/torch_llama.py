#!/usr/bin/python3
"""torch_llama.py - the PyTorch baseline that `make bench` measures hp-train against.

Loads a Hugging Face Llama folder (config.json + model.safetensors, parsed by
hand: no transformers or safetensors package) and trains it in float32 on
the CPU exactly as transformers' LlamaForCausalLM would be trained by a plain
loop: embedding, RMSNorm computed in fp32 (x * rsqrt(mean(x^2) + eps) * w),
rotate_half RoPE with inv_freq = 1 / theta^(arange(0, hd, 2) / hd), GQA by
repeating K/V heads, causal softmax attention with scale 1/sqrt(hd), the
SwiGLU MLP down(silu(gate(x)) * up(x)), final norm, lm_head (or the tied
embedding), mean cross-entropy over the tokens; then clip_grad_norm_ and
torch.optim.AdamW with weight decay on matrices only (hp's default
no_decay_params [bias, norm, ln_] leaves exactly the norms undecayed).

Attention (--attention auto, the default): where torch has
F.scaled_dot_product_attention (2.0 and later) it is that, with
is_causal=True after repeat_kv, as transformers' default "sdpa"
implementation calls it; on torch 1.13, which has none, explicit matmul +
mask + softmax (HF's "eager" path).  --attention eager or sdpa forces one.
The JSON line names the one used.  This is a baseline, not a second
implementation to optimise: it should be what a competent PyTorch user
runs, no slower and no cleverer.  It runs unchanged on Debian's torch 1.13
and on PyPI's torch 2.x (bench/run.sh times both).

Batches: with --data PREFIX, records of a Megatron indexed dataset
(PREFIX.idx/.bin, each record seq+1 tokens) in file order, batch b =
records [b*B, (b+1)*B) modulo the record count (wrapping row by row, as
hp's batch.h does), inputs = rec[:-1], labels = rec[1:] -- the order
hp-train reads them in, so the first losses of the two agree.  Without --data, random tokens from --seed.

Prints one JSON line on stdout per --model (several: trained in turn in one
process, which imports torch once: bench/run.sh does that); the first
--warmup steps are not timed.
--check-reference DIR instead checks the forward and backward against
data/stories260K/reference (loss and every gradient) and exits 0 or 1.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

# the safetensors reader shared with the Qwen3 reference
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "t", "ref"))
import qwen3_ref as Q  # noqa: E402


# --- loading ---------------------------------------------------------------

def load_hf(folder):
    cfg, w = Q.load_folder(folder)
    if cfg.get("model_type") != "llama":
        sys.exit("torch_llama: '%s': model_type %r is not llama" % (folder, cfg.get("model_type")))
    return cfg, w


def read_indexed(prefix):
    """Records of a Megatron MMIDIDX v1 dataset, as a list of int64 arrays."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    if idx[:9] != b"MMIDIDX\x00\x00":
        sys.exit("torch_llama: '%s.idx': bad magic" % prefix)
    version, code, nseq, _ndoc = struct.unpack("<QBQQ", idx[9:34])
    sizes = {1: "u1", 2: "i1", 3: "i2", 4: "i4", 5: "i8", 6: "f8", 7: "f4", 8: "u2"}
    if version != 1 or code not in sizes:
        sys.exit("torch_llama: '%s.idx': version %d dtype %d not supported" % (prefix, version, code))
    lengths = np.frombuffer(idx, dtype="<i4", count=nseq, offset=34)
    pointers = np.frombuffer(idx, dtype="<i8", count=nseq, offset=34 + 4 * nseq)
    tokens = np.fromfile(prefix + ".bin", dtype=np.uint8)
    dt = np.dtype("<" + sizes[code])
    return [np.frombuffer(tokens, dtype=dt, count=int(n), offset=int(p)).astype(np.int64)
            for n, p in zip(lengths, pointers)]


def time_adamw(named, loss_of, prefix, threads, steps, batch, seq, warmup, impl):
    """Train for STEPS steps of BATCH records of PREFIX (the first WARMUP
    untimed): loss_of(inputs, targets) -> loss, then AdamW (lr 1e-3, betas
    0.9/0.95, eps 1e-8, weight decay 0.1 but for names with "norm" or
    "bias", hp-train's settings) after clipping at 1; print the JSON line of
    moe-bench.sh and family-bench.sh (tokens/s of the timed steps, the first
    loss).  named: the model's (name, tensor) parameters."""
    torch.set_num_threads(threads)
    params = [t for _, t in named]
    decay = [t for n, t in named if "norm" not in n and "bias" not in n]
    nodecay = [t for n, t in named if "norm" in n or "bias" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    recs = read_indexed(prefix)
    times, losses = [], []
    for step in range(steps):
        rec = torch.from_numpy(np.stack([recs[(step * batch + i) % len(recs)] for i in range(batch)]))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(rec[:, :-1].contiguous(), rec[:, 1:].contiguous())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    timed = times[warmup:]
    if not timed:
        sys.exit("%s: %d steps leave none timed after %d warm-up steps" % (impl, steps, warmup))
    print(json.dumps({"impl": impl, "tokens_per_s": batch * seq * len(timed) / sum(timed),
                      "step_time_s": sum(timed) / len(timed), "first_loss": losses[0],
                      "threads": threads}))


# --- the model -------------------------------------------------------------

class Llama:
    def __init__(self, cfg, weights, seq, attention="eager"):
        self.sdpa = attention == "sdpa"
        self.H = cfg["hidden_size"]
        self.nh = cfg["num_attention_heads"]
        self.nkv = cfg.get("num_key_value_heads", self.nh)
        self.hd = cfg.get("head_dim") or self.H // self.nh
        self.L = cfg["num_hidden_layers"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.tied = cfg.get("tie_word_embeddings", False)
        theta = cfg.get("rope_theta", 10000.0)
        self.p = {n: torch.nn.Parameter(t.float()) for n, t in weights.items()
                  if not (self.tied and n == "lm_head.weight")}
        # RoPE tables as transformers' LlamaRotaryEmbedding builds them (fp32).
        inv_freq = 1.0 / (theta ** (torch.arange(0, self.hd, 2, dtype=torch.int64).float() / self.hd))
        freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()
        self.mask = torch.full((seq, seq), float("-inf")).triu(1)

    def rmsnorm(self, x, w):
        x = x.float()
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    @staticmethod
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def attention(self, x, pre):
        B, T, _ = x.shape
        p = self.p
        q = F.linear(x, p[pre + "q_proj.weight"]).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = F.linear(x, p[pre + "k_proj.weight"]).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = F.linear(x, p[pre + "v_proj.weight"]).view(B, T, self.nkv, self.hd).transpose(1, 2)
        cos, sin = self.cos[:T], self.sin[:T]
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        rep = self.nh // self.nkv
        if rep > 1:  # transformers' repeat_kv: query head h reads kv head h // rep
            k = k[:, :, None].expand(B, self.nkv, rep, T, self.hd).reshape(B, self.nh, T, self.hd)
            v = v[:, :, None].expand(B, self.nkv, rep, T, self.hd).reshape(B, self.nh, T, self.hd)
        if self.sdpa:  # scale defaults to 1/sqrt(hd), as in the eager path
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(self.hd))
            att = att + self.mask[:T, :T]
            att = F.softmax(att, dim=-1, dtype=torch.float32)
            y = torch.matmul(att, v)
        y = y.transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return F.linear(y, p[pre + "o_proj.weight"])

    def loss(self, ids, labels):
        p = self.p
        x = F.embedding(ids, p["model.embed_tokens.weight"])
        for i in range(self.L):
            pre = "model.layers.%d." % i
            x = x + self.attention(self.rmsnorm(x, p[pre + "input_layernorm.weight"]), pre + "self_attn.")
            h = self.rmsnorm(x, p[pre + "post_attention_layernorm.weight"])
            m = F.silu(F.linear(h, p[pre + "mlp.gate_proj.weight"])) * F.linear(h, p[pre + "mlp.up_proj.weight"])
            x = x + F.linear(m, p[pre + "mlp.down_proj.weight"])
        x = self.rmsnorm(x, p["model.norm.weight"])
        head = p["model.embed_tokens.weight"] if self.tied else p["lm_head.weight"]
        logits = F.linear(x, head).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=-100)


# --- modes -----------------------------------------------------------------

def check_reference(ref_dir, model_dir):
    """Loss and every gradient of the reference batch against PyTorch float64 goldens."""
    with open(os.path.join(ref_dir, "reference.json")) as f:
        ref = json.load(f)["loss_and_grads"]
    ids = torch.tensor(ref["input_ids"])
    labels = torch.tensor(ref["target_ids"])
    cfg, w = load_hf(model_dir)
    m = Llama(cfg, w, ids.shape[1])
    loss = m.loss(ids, labels)
    loss.backward()
    golden = Q.read_safetensors(os.path.join(ref_dir, "grads_batch.safetensors"))
    worst = max((m.p[n].grad - g).abs().max().item() for n, g in golden.items())
    dloss = abs(loss.item() - ref["loss_f64"])
    # f32 against f64: the reference itself measured 5.8e-7 on the gradients;
    # 1e-5 leaves room for another summation order without hiding a bug.
    ok = dloss < 1e-5 and worst < 1e-5 and set(golden) == set(m.p)
    print("torch_llama: reference loss %.7f (|diff| %.2e), max |grad diff| %.2e over %d tensors: %s"
          % (loss.item(), dloss, worst, len(golden), "ok" if ok else "MISMATCH"))
    return 0 if ok else 1


def attention_impl(want):
    have = hasattr(F, "scaled_dot_product_attention")
    if want == "sdpa" and not have:
        sys.exit("torch_llama: torch %s has no scaled_dot_product_attention" % torch.__version__)
    return want if want != "auto" else ("sdpa" if have else "eager")


def train(a, folder):
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cfg, w = load_hf(folder)
    attn = attention_impl(a.attention)
    m = Llama(cfg, w, a.seq, attn)
    params = list(m.p.values())
    nparams = sum(t.numel() for t in params)
    decay = [t for t in params if t.dim() >= 2]
    no_decay = [t for t in params if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    V = cfg["vocab_size"]
    if a.data:
        recs = read_indexed(a.data)
        if any(len(r) != a.seq + 1 for r in recs):
            sys.exit("torch_llama: '%s': records must hold seq+1 = %d tokens" % (a.data, a.seq + 1))
        if not recs:
            sys.exit("torch_llama: '%s': no records" % a.data)
        batches = [torch.from_numpy(np.stack([recs[(b * a.batch + i) % len(recs)]
                                              for i in range(a.batch)]))
                   for b in range(a.steps)]
    else:
        g = torch.Generator().manual_seed(a.seed)
        batches = [torch.randint(0, V, (a.batch, a.seq + 1), generator=g) for _ in range(a.steps)]

    losses, norms, times = [], [], []
    for step in range(a.steps):
        rec = batches[step % len(batches)]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = m.loss(rec[:, :-1], rec[:, 1:])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, a.max_grad_norm)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        norms.append(norm.item())
        if a.verbose:
            print("torch step %d/%d | loss %.6f | grad_norm %.4f | %.1f ms"
                  % (step + 1, a.steps, losses[-1], norms[-1], times[-1] * 1e3), file=sys.stderr)
    timed = times[a.warmup:]
    tokens = a.batch * a.seq * len(timed)
    print(json.dumps({
        "impl": "torch", "torch_version": torch.__version__, "attention": attn,
        "model": os.path.basename(os.path.normpath(folder)), "params": nparams,
        "threads": a.threads, "batch": a.batch, "seq": a.seq,
        "steps": a.steps, "timed_steps": len(timed),
        "tokens_per_s": tokens / sum(timed),
        "step_time_s": sum(timed) / len(timed),
        "first_loss": losses[0], "first_grad_norm": norms[0], "last_loss": losses[-1],
    }), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description="train an HF Llama folder with PyTorch (CPU, fp32)")
    ap.add_argument("--model", required=True, action="append",
                    help="HF folder; repeated: each trained in turn, one JSON line each")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--data", metavar="PREFIX", help="Megatron indexed dataset (.idx/.bin)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--attention", choices=("auto", "eager", "sdpa"), default="auto",
                    help="sdpa where torch has it (auto), or force one")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per step on stderr")
    ap.add_argument("--check-reference", metavar="DIR",
                    help="check loss and gradients against DIR/reference.json (with --model)")
    a = ap.parse_args()
    if a.check_reference:
        torch.set_num_threads(a.threads)
        return check_reference(a.check_reference, a.model[0])
    if a.steps <= a.warmup:
        sys.exit("torch_llama: --steps must exceed --warmup (%d)" % a.warmup)
    for folder in a.model:
        train(a, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
