"""make-mxfp4-golden.py OUTDIR - data/hf/tf5/gpt_oss-mxfp4: a tiny GPT-OSS
checkpoint whose experts are stored as MXFP4 blocks and scales, as the
released gpt-oss checkpoints are, and what transformers 5.24.0 makes of it.

Run by t/ref/make-hf-goldens.sh (after make-hf-goldens.py, whose
gpt_oss-default folder gives the batch) with build/ref-venv's python and
accelerate on PYTHONPATH (transformers' mxfp4 quantizer imports it).

The folder: config.json as 5.24.0 saves the gpt_oss config (hidden 32, 2
layers, 4 experts of intermediate 32 - MXFP4 groups 32 values - top-2,
swiglu_limit 0.5) plus the quantization_config of the released checkpoints
(quant_method mxfp4, modules_to_not_convert); model.safetensors with every
other tensor in bfloat16 (normal(0, 0.1), norms 1 + normal(0, 0.2)) and the
experts' gate_up_proj and down_proj as *_blocks (random bytes) and *_scales
(exponents 121..123, so weights of about 2^-5 .. 6 * 2^-4).

transformers, without MXFP4 kernels on the CPU, dequantizes them to
bfloat16 on load (integrations/mxfp4.py).  The goldens:
- dequantized.safetensors: the experts' gate_up_proj [E, C, 2I] and
  down_proj [E, I, C] as the loaded model holds them (exact in float32);
- reference.json: the batch of gpt_oss-default, loss_f64 of the loaded
  model in float64 (model.double());
- grads.safetensors: d loss_f64 / d param under hp's per-expert names, as
  make-hf-goldens.py writes them.
Two runs write the same bytes.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GptOssConfig, GptOssForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hfnames import hub_names  # noqa: E402

OUT = sys.argv[1]
FOLDER = os.path.join(OUT, "tf5", "gpt_oss-mxfp4")
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
os.makedirs(FOLDER, exist_ok=True)

cfg = GptOssConfig(hidden_size=32, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
                   sliding_window=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, vocab_size=64,
                   max_position_embeddings=64, swiglu_limit=0.5, rms_norm_eps=1e-5, attention_bias=True,
                   tie_word_embeddings=False, output_router_logits=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
GptOssForCausalLM(cfg).save_pretrained(FOLDER)
sd = load_file(os.path.join(FOLDER, "model.safetensors"))
g = torch.Generator().manual_seed(7007)
new = {}
for n in sorted(sd):
    t = sd[n]
    if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"):
        E, K, R = t.shape    # [E, C, 2I] / [E, I, C]: blocks over the decoded [E, R, K]
        new[n + "_blocks"] = torch.randint(0, 256, (E, R, K // 32, 16), generator=g, dtype=torch.uint8)
        new[n + "_scales"] = torch.randint(121, 124, (E, R, K // 32), generator=g).to(torch.uint8)
    elif "norm" in n:
        new[n] = (1 + 0.2 * torch.randn(t.shape, generator=g, dtype=torch.float64)).to(torch.bfloat16)
    else:
        new[n] = (0.1 * torch.randn(t.shape, generator=g, dtype=torch.float64)).to(torch.bfloat16)
save_file(new, os.path.join(FOLDER, "model.safetensors"), metadata={"format": "pt"})
c = json.load(open(os.path.join(FOLDER, "config.json")))
c["dtype"] = "bfloat16"
c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
with open(os.path.join(FOLDER, "config.json"), "w") as f:
    json.dump(c, f, indent=2, sort_keys=True)
    f.write("\n")

m = AutoModelForCausalLM.from_pretrained(FOLDER, experts_implementation="eager", attn_implementation="eager")
deq = {}
for n, p in m.named_parameters():
    if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"):
        assert p.dtype == torch.bfloat16
        deq[n] = p.detach().float().contiguous()
save_file(deq, os.path.join(FOLDER, "dequantized.safetensors"), metadata={"format": "pt"})

re = m.model.rotary_emb
rope = {"inv_freq_f32": [float(x) for x in re.inv_freq.float()], "attention_scaling": float(re.attention_scaling)}
ref = json.load(open(os.path.join(OUT, "tf5", "gpt_oss-default", "reference.json")))
ids = torch.tensor(ref["batch"]["input_ids"])
tgt = torch.tensor(ref["batch"]["target_ids"])
m = m.double()
m.train()
loss = m(input_ids=ids, labels=tgt, shift_labels=tgt).loss   # as make-hf-goldens.py's forward
loss.backward()
grads = hub_names({n: p.grad.float() for n, p in m.named_parameters()}, "gpt_oss")
save_file(grads, os.path.join(FOLDER, "grads.safetensors"), metadata={"format": "pt"})
out = {
    "generator": "t/ref/make-mxfp4-golden.py",
    "transformers": __import__("transformers").__version__, "torch": torch.__version__,
    "batch": ref["batch"],
    "rope": rope,
    "loss": {"loss_f64": float(loss), "note": "the model transformers 5.24.0 loads from this folder on the CPU "
             "(experts dequantized to bfloat16), then model.double(); transformers' loss (labels, "
             "shift_labels), which takes the logits as float32"},
    "dequantized": "dequantized.safetensors: the experts as the loaded model holds them (bfloat16, stored F32)",
}
with open(os.path.join(FOLDER, "reference.json"), "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
    f.write("\n")
print("tf5 gpt_oss-mxfp4 loss %.10f" % float(loss))
