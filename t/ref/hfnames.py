"""hfnames.py - checkpoint tensors under hp's per-parameter names, shared by
the golden generators (make-hf-goldens.py, make-mxfp4-golden.py)."""


def hub_names(grads, family):
    """5.x holds a layer's experts stacked (experts.gate_up_proj [E, 2I, H],
    gate rows first, experts.down_proj [E, H, I]): qwen3_moe and deepseek_v3
    (whose shared_experts stay nn.Linear); save_pretrained writes them one by
    one, and so do the gradients here.  4.57.6 holds them one by one already.

    gpt_oss holds them stacked in both lines, and save_pretrained writes them
    so (model.safetensors keeps transformers' names); the gradients go under
    hp's per-expert names: gate_up_proj [E, H, 2I] has gate and up
    interleaved by column (gate 0::2, up 1::2), each transposed to
    nn.Linear's [I, H]; down_proj [E, I, H] transposed to [H, I]; the biases
    gate_up_proj_bias [E, 2I] (split alike) and down_proj_bias [E, H]."""
    out = {}
    for n, g in grads.items():
        if family == "gpt_oss" and n.endswith("mlp.experts.gate_up_proj"):
            pre = n[:-len("gate_up_proj")]
            for e in range(g.shape[0]):
                out["%s%d.gate_proj.weight" % (pre, e)] = g[e][:, 0::2].t().contiguous()
                out["%s%d.up_proj.weight" % (pre, e)] = g[e][:, 1::2].t().contiguous()
        elif family == "gpt_oss" and n.endswith("mlp.experts.gate_up_proj_bias"):
            pre = n[:-len("gate_up_proj_bias")]
            for e in range(g.shape[0]):
                out["%s%d.gate_proj.bias" % (pre, e)] = g[e][0::2].contiguous()
                out["%s%d.up_proj.bias" % (pre, e)] = g[e][1::2].contiguous()
        elif family == "gpt_oss" and n.endswith("mlp.experts.down_proj"):
            pre = n[:-len("down_proj")]
            for e in range(g.shape[0]):
                out["%s%d.down_proj.weight" % (pre, e)] = g[e].t().contiguous()
        elif family == "gpt_oss" and n.endswith("mlp.experts.down_proj_bias"):
            pre = n[:-len("down_proj_bias")]
            for e in range(g.shape[0]):
                out["%s%d.down_proj.bias" % (pre, e)] = g[e].contiguous()
        elif n.endswith("mlp.experts.gate_up_proj"):
            pre, half = n[:-len("gate_up_proj")], g.shape[1] // 2
            for e in range(g.shape[0]):
                out["%s%d.gate_proj.weight" % (pre, e)] = g[e, :half].contiguous()
                out["%s%d.up_proj.weight" % (pre, e)] = g[e, half:].contiguous()
        elif n.endswith("mlp.experts.down_proj"):
            pre = n[:-len("down_proj")]
            for e in range(g.shape[0]):
                out["%s%d.down_proj.weight" % (pre, e)] = g[e].contiguous()
        else:
            out[n] = g
    return out
