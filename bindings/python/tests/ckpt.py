"""Small Qwen3-MoE checkpoints for the tests, written with numpy and freetoken.safetensors."""
import json
import os

import numpy as np

from freetoken.safetensors import save_file


def to_bf16(a):
    """float32 -> bf16 bit patterns (uint16), round to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)


def from_bf16(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def write_qwen3_moe(path, layers=2, experts=8, top_k=2, hidden=64, inter=32, seed=0, norm_topk_prob=True):
    """Writes config.json + model.safetensors; returns {name: float32 array} of what was written
    (bf16-rounded values)."""
    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    tensors, values = {}, {}
    for l in range(layers):
        p = "model.layers.%d.mlp." % l
        g = to_bf16(rng.normal(0, 0.5, (experts, hidden)))
        tensors[p + "gate.weight"], values[p + "gate.weight"] = g, from_bf16(g)
        for e in range(experts):
            for proj, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                                ("down_proj", (hidden, inter))):
                name = p + "experts.%d.%s.weight" % (e, proj)
                w = to_bf16(rng.uniform(-0.2, 0.2, shape))
                tensors[name], values[name] = w, from_bf16(w)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    config = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": hidden,
              "num_hidden_layers": layers, "num_experts": experts, "num_experts_per_tok": top_k,
              "moe_intermediate_size": inter, "intermediate_size": 4 * inter, "norm_topk_prob": norm_topk_prob,
              "hidden_act": "silu", "decoder_sparse_step": 1, "mlp_only_layers": []}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return values


def reference_moe(values, layer, x, ids, weights):
    """float32 numpy reference of one MoE layer: sum_k w * down(silu(gate x) * up x)."""
    T, K = ids.shape
    out = np.zeros_like(x, dtype=np.float32)
    p = "model.layers.%d.mlp.experts." % layer
    for t in range(T):
        for k in range(K):
            e = int(ids[t, k])
            g = values[p + "%d.gate_proj.weight" % e] @ x[t]
            u = values[p + "%d.up_proj.weight" % e] @ x[t]
            h = g / (1 + np.exp(-g)) * u
            out[t] += weights[t, k] * (values[p + "%d.down_proj.weight" % e] @ h)
    return out


def rel_l2(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
