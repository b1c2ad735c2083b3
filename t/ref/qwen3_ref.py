#!/usr/bin/python3
"""qwen3_ref.py - a PyTorch port of HF transformers' Qwen3 and Qwen3-MoE causal LMs.

The reference that data/ref/ goldens are computed with.  It needs only
Debian's python3-torch (1.13) and numpy: transformers >= 4.51 (the first
release with Qwen3) does not import on torch 1.13, see t/ref/README.md.
Written from modeling_qwen3.py and modeling_qwen3_moe.py of transformers
4.51.3 (per-expert modules) and 5.x (stacked experts); t/ref/check-qwen3-
vs-transformers.py compares this port with transformers 4.51.3 itself.

What it computes, for model_type "qwen3" and "qwen3_moe":

  x = embed_tokens[ids]
  per layer:
    h = rmsnorm(x, input_layernorm)
    q = q_proj(h) viewed [B, T, heads, head_dim]     (bias iff attention_bias;
    k = k_proj(h) viewed [B, T, kv_heads, head_dim]   head_dim from the config,
    v = v_proj(h) viewed [B, T, kv_heads, head_dim]   not hidden / heads)
    q = rmsnorm(q, q_norm)  k = rmsnorm(k, k_norm)    per head, over head_dim,
                                                      BEFORE RoPE
    q, k = rope(q), rope(k)                           rotate_half, theta rope_theta
    y = softmax(q k^T * head_dim^-0.5 + causal) v     query head h reads kv head
                                                      h // (heads / kv_heads)
    x = x + o_proj(y)
    h = rmsnorm(x, post_attention_layernorm)
    x = x + mlp(h)
  logits = lm_head(rmsnorm(x, norm))                  lm_head = embed_tokens when
                                                      tie_word_embeddings
  rmsnorm(x, w) = w * (x * rsqrt(mean(x^2, -1) + rms_norm_eps))

  mlp is dense, down(silu(gate(h)) * up(h)) with intermediate_size, unless
  (qwen3_moe and layer not in mlp_only_layers and num_experts > 0 and
  (layer + 1) % decoder_sparse_step == 0); then the sparse block:
    r = gate(h)                                   router logits [N, E], no bias
    p = softmax(r, -1)                            (float32 in HF)
    w, e = topk(p, num_experts_per_tok)
    w = w / sum(w)  iff norm_topk_prob
    out = sum_j w_j * expert_{e_j}(h)             each expert a SwiGLU MLP of
                                                  moe_intermediate_size

  loss = mean cross-entropy over targets != -100
       + router_aux_loss_coef * aux               iff output_router_logits
  aux  = load_balancing_loss_func over the router logits of the MoE layers
         only, concatenated over layers: p = softmax(R), e = topk(p, k),
         f[k, E] = mean_tokens(one_hot(e)), P[E] = mean_tokens(p),
         aux = num_experts * sum(f * P)   (f carries no gradient)

The whole model runs in one dtype: float64 for the goldens (the exact
mathematics, RoPE tables included), float32 to mirror HF in float32 (HF
forces RMSNorm, attention softmax, router softmax, RoPE tables and the loss
into float32, which in a float32 model is the same thing).

Weights are read from and written to HF folders by hand (safetensors: an
8-byte little-endian header length, a JSON header, raw little-endian data),
one file or several with model.safetensors.index.json, F32 or BF16, experts
per module (model.layers.L.mlp.experts.E.gate_proj.weight, as the hub files
and transformers 4.x) or stacked (model.layers.L.mlp.experts.gate_up_proj
[E, 2*I, H], gate rows then up rows, and experts.down_proj [E, H, I], as
transformers 5.x holds them in memory).
"""
import json
import math
import os
import re
import struct

import numpy as np
import torch
import torch.nn.functional as F


# --- safetensors by hand ---------------------------------------------------

def read_safetensors(path):
    """dict name -> float32 tensor (F32, BF16 or F16 on disk); __metadata__ skipped.
    Also the reader of bench/torch_llama.py and bench/moe_torch.py."""
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        a, b = d["data_offsets"]
        buf = raw[base + a:base + b]
        if d["dtype"] == "F32":
            arr = np.frombuffer(buf, dtype="<f4")
        elif d["dtype"] == "F16":
            arr = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif d["dtype"] == "BF16":
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError("%s: tensor %s: unsupported dtype %s" % (path, name, d["dtype"]))
        out[name] = torch.from_numpy(arr.copy()).reshape(d["shape"])
    return out


def bf16_bits(a):
    """float32 ndarray -> uint16 bf16 bits, round to nearest even (no NaN here)."""
    u = np.ascontiguousarray(a, dtype="<f4").view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2")


def bf16_round(a):
    """float32 ndarray rounded to the nearest bf16 value (RNE), as float32."""
    return (bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors, dtype="F32"):
    """tensors: dict name -> ndarray; stored F32 or BF16 (RNE), names sorted,
    header padded with spaces to a multiple of 8 and carrying
    {"__metadata__": {"format": "pt"}} as transformers' files do."""
    names = sorted(tensors)
    blobs = []
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for n in names:
        a = np.asarray(tensors[n], dtype=np.float32)
        b = bf16_bits(a).tobytes() if dtype == "BF16" else np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[n] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    return off


def load_folder(folder):
    """(config dict, dict name -> float32 tensor) of an HF folder; stacked
    experts are split back into per-expert names."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        w = read_safetensors(single)
    else:
        with open(os.path.join(folder, "model.safetensors.index.json")) as f:
            wmap = json.load(f)["weight_map"]
        w = {}
        for fn in sorted(set(wmap.values())):
            part = read_safetensors(os.path.join(folder, fn))
            for n in part:
                if wmap.get(n) != fn:
                    raise ValueError("%s: %s is not mapped to %s" % (folder, n, fn))
            w.update(part)
        if set(w) != set(wmap):
            raise ValueError("%s: index and files disagree" % folder)
    return cfg, unstack_experts(w)


def stack_experts(w, cfg):
    """per-expert names -> transformers 5.x stacked layout (a new dict)."""
    out = {}
    pat = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
    groups = {}
    for n, t in w.items():
        m = pat.match(n)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = t
        else:
            out[n] = t
    E = cfg["num_experts"]
    for pre, g in groups.items():
        out[pre + ".gate_up_proj"] = torch.stack(
            [torch.cat([g[(e, "gate")], g[(e, "up")]], dim=0) for e in range(E)])
        out[pre + ".down_proj"] = torch.stack([g[(e, "down")] for e in range(E)])
    return out


def unstack_experts(w):
    out = {}
    for n, t in w.items():
        if n.endswith(".mlp.experts.gate_up_proj"):
            pre = n[:-len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[pre + "%d.gate_proj.weight" % e] = t[e, :inter].clone()
                out[pre + "%d.up_proj.weight" % e] = t[e, inter:].clone()
        elif n.endswith(".mlp.experts.down_proj"):
            pre = n[:-len("down_proj")]
            for e in range(t.shape[0]):
                out[pre + "%d.down_proj.weight" % e] = t[e].clone()
        else:
            out[n] = t
    return out


# --- the model -------------------------------------------------------------

def is_moe_layer(cfg, i):
    return (cfg.get("model_type") == "qwen3_moe"
            and i not in (cfg.get("mlp_only_layers") or [])
            and cfg.get("num_experts", 0) > 0
            and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0)


def parameter_shapes(cfg):
    """[(HF name, shape, kind)] of every parameter, kind one of matrix, bias,
    norm, router; lm_head absent when tied."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    bias = cfg.get("attention_bias", False)
    out = [("model.embed_tokens.weight", (V, H), "matrix")]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        a = p + "self_attn."
        out += [(p + "input_layernorm.weight", (H,), "norm"),
                (a + "q_proj.weight", (nh * hd, H), "matrix"),
                (a + "k_proj.weight", (nkv * hd, H), "matrix"),
                (a + "v_proj.weight", (nkv * hd, H), "matrix"),
                (a + "o_proj.weight", (H, nh * hd), "matrix"),
                (a + "q_norm.weight", (hd,), "norm"),
                (a + "k_norm.weight", (hd,), "norm")]
        if bias:
            out += [(a + "q_proj.bias", (nh * hd,), "bias"),
                    (a + "k_proj.bias", (nkv * hd,), "bias"),
                    (a + "v_proj.bias", (nkv * hd,), "bias"),
                    (a + "o_proj.bias", (H,), "bias")]
        out.append((p + "post_attention_layernorm.weight", (H,), "norm"))
        if is_moe_layer(cfg, i):
            I, E = cfg["moe_intermediate_size"], cfg["num_experts"]
            out.append((p + "mlp.gate.weight", (E, H), "router"))
            for e in range(E):
                q = p + "mlp.experts.%d." % e
                out += [(q + "gate_proj.weight", (I, H), "matrix"),
                        (q + "up_proj.weight", (I, H), "matrix"),
                        (q + "down_proj.weight", (H, I), "matrix")]
        else:
            I = cfg["intermediate_size"]
            out += [(p + "mlp.gate_proj.weight", (I, H), "matrix"),
                    (p + "mlp.up_proj.weight", (I, H), "matrix"),
                    (p + "mlp.down_proj.weight", (H, I), "matrix")]
    out.append(("model.norm.weight", (H,), "norm"))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (V, H), "matrix"))
    return out


class Qwen3Ref:
    """The model over a dict of leaf tensors (self.p, HF names, one dtype)."""

    def __init__(self, cfg, weights, dtype=torch.float64):
        self.cfg = cfg
        self.dtype = dtype
        self.H = cfg["hidden_size"]
        self.nh = cfg["num_attention_heads"]
        self.nkv = cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or self.H // self.nh
        self.L = cfg["num_hidden_layers"]
        self.eps = cfg["rms_norm_eps"]
        self.theta = cfg.get("rope_theta", 10000.0)
        self.tied = cfg.get("tie_word_embeddings", False)
        want = [n for n, _, _ in parameter_shapes(cfg)]
        extra = set(weights) - set(want) - ({"lm_head.weight"} if self.tied else set())
        missing = set(want) - set(weights)
        if extra or missing:
            raise ValueError("weights: missing %s, unexpected %s" % (sorted(missing), sorted(extra)))
        self.p = {n: weights[n].detach().to(dtype).clone().requires_grad_(True) for n in want}

    def named_parameters(self):
        return list(self.p.items())

    def rmsnorm(self, x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def rope_tables(self, T):
        if self.dtype == torch.float64:
            inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
            f = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        else:  # as HF: inv_freq and the angles in float32
            inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.int64).float() / self.hd))
            f = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        emb = torch.cat((f, f), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @staticmethod
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def linear(self, x, name):
        b = self.p.get(name + ".bias")
        return F.linear(x, self.p[name + ".weight"], b)

    def attention(self, x, pre, cos, sin):
        B, T, _ = x.shape
        q = self.linear(x, pre + "q_proj").view(B, T, self.nh, self.hd)
        k = self.linear(x, pre + "k_proj").view(B, T, self.nkv, self.hd)
        v = self.linear(x, pre + "v_proj").view(B, T, self.nkv, self.hd)
        q = self.rmsnorm(q, self.p[pre + "q_norm.weight"]).transpose(1, 2)
        k = self.rmsnorm(k, self.p[pre + "k_norm.weight"]).transpose(1, 2)
        v = v.transpose(1, 2)
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = torch.matmul(q, k.transpose(2, 3)) * self.hd ** -0.5
        mask = torch.full((T, T), float("-inf"), dtype=self.dtype).triu(1)
        att = F.softmax(att + mask, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.linear(y, pre + "o_proj")

    def swiglu(self, x, pre):
        return F.linear(F.silu(F.linear(x, self.p[pre + "gate_proj.weight"]))
                        * F.linear(x, self.p[pre + "up_proj.weight"]),
                        self.p[pre + "down_proj.weight"])

    def moe(self, x, pre):
        """(output, router logits [N, E]) of the sparse block."""
        cfg = self.cfg
        E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
        B, T, H = x.shape
        h = x.reshape(-1, H)
        logits = F.linear(h, self.p[pre + "gate.weight"])
        probs = F.softmax(logits, dim=-1)
        w, sel = torch.topk(probs, k, dim=-1)
        if cfg.get("norm_topk_prob", False):
            w = w / w.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(h)
        for e in range(E):
            tok, slot = torch.where(sel == e)
            if tok.numel() == 0:
                continue
            y = self.swiglu(h[tok], pre + "experts.%d." % e) * w[tok, slot, None]
            out = out.index_add(0, tok, y)
        return out.reshape(B, T, H), logits, sel

    def forward(self, ids):
        """(logits [B, T, V], [router logits of each MoE layer], [its top-k])"""
        B, T = ids.shape
        cos, sin = self.rope_tables(T)
        x = F.embedding(ids, self.p["model.embed_tokens.weight"])
        routers, selected = [], []
        for i in range(self.L):
            pre = "model.layers.%d." % i
            x = x + self.attention(self.rmsnorm(x, self.p[pre + "input_layernorm.weight"]),
                                   pre + "self_attn.", cos, sin)
            h = self.rmsnorm(x, self.p[pre + "post_attention_layernorm.weight"])
            if is_moe_layer(self.cfg, i):
                y, r, s = self.moe(h, pre + "mlp.")
                routers.append(r)
                selected.append(s)
            else:
                y = self.swiglu(h, pre + "mlp.")
            x = x + y
        x = self.rmsnorm(x, self.p["model.norm.weight"])
        head = self.p["model.embed_tokens.weight"] if self.tied else self.p["lm_head.weight"]
        return F.linear(x, head), routers, selected

    def aux_loss(self, routers):
        """HF's load_balancing_loss_func over the MoE layers' router logits."""
        E, k = self.cfg["num_experts"], self.cfg["num_experts_per_tok"]
        r = torch.cat(routers, dim=0)
        p = F.softmax(r, dim=-1)
        _, sel = torch.topk(p, k, dim=-1)
        tokens_per_expert = F.one_hot(sel, E).to(p.dtype).mean(dim=0)   # [k, E]
        router_prob_per_expert = p.mean(dim=0)                          # [E]
        return (tokens_per_expert * router_prob_per_expert[None]).sum() * E

    def loss(self, ids, targets, output_router_logits=None):
        """(total, cross-entropy, aux or None, logits, routers, selected)"""
        logits, routers, selected = self.forward(ids)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                             ignore_index=-100)
        if output_router_logits is None:
            output_router_logits = self.cfg.get("output_router_logits", False)
        aux = None
        total = ce
        if output_router_logits and routers:
            aux = self.aux_loss(routers)
            total = ce + self.cfg["router_aux_loss_coef"] * aux
        return total, ce, aux, logits, routers, selected


def router_min_gap(routers, k):
    """Smallest difference between the k-th and (k+1)-th largest router logit
    over all tokens and MoE layers: how far the top-k choice is from a tie."""
    best = math.inf
    for r in routers:
        s = torch.sort(r.detach().double(), dim=-1, descending=True).values
        best = min(best, (s[:, k - 1] - s[:, k]).min().item())
    return best
