"""freetoken.torch.offload_experts on small hand-built torch MoE models (CPU, backend 'cpu'): the
output with FreeToken's experts matches the module's own (relative L2 <= 1e-2) for the block
conventions it handles: a loop over an nn.ModuleList of experts returning (out, router_logits)
(Qwen3-MoE as transformers 4.x writes it), a fused experts module called as experts(x, ids, weights)
(transformers 5; gpt-oss with MXFP4 experts and biases), a DeepSeek-V3-style block with a sigmoid
router, correction bias and a shared expert, a Qwen2-MoE-style block with a sigmoid-gated shared
expert, GraniteMoe-style parallel experts (input_linear/output_linear, expert-sorted router output;
with a shared_mlp beside the block in the decoder layer as GraniteMoeShared has), and a
Llama-4-style block (top-1, the weight scales the expert input, experts called with the hidden
states alone, a shared expert), and GraniteMoe as transformers >= 5.15 writes it (router returning
(index, weights, logits), fused experts) read from a checkpoint with the Hub's older names. The
checkpoint each time is written from the module's own weights; DeepSeek-style FP8 non-expert weights
(E4M3 with block scales) are dequantised as they load. CheckpointNames: the checkpoint-name
matching of load_non_expert_weights with a stand-in for transformers' conversion mapping.
ReleaseConfigs: from_pretrained's config of a model_type transformers does not know.
"""
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import types
import unittest

import torch
import torch.nn.functional as F
from torch import nn

import freetoken as ft
import freetoken.torch as ftt
from freetoken.safetensors import save_file
from mxfp4 import mxfp4_quantise

H, I, E, K, L = 64, 96, 8, 2, 2
IS, K4 = 80, 1  # shared expert width; Llama-4 top-k


def bf16_round_(module):
    """Makes every parameter exactly representable in bf16 (what the checkpoint stores)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return module


class MLP(nn.Module):
    def __init__(self, inter):
        super().__init__()
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LoopMoe(nn.Module):
    """Experts in a ModuleList, softmax top-k renormalised, returns (out, router_logits)."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(H, E, bias=False)
        self.experts = nn.ModuleList([MLP(I) for _ in range(E)])

    def forward(self, hidden_states):
        b, s, h = hidden_states.shape
        x = hidden_states.view(-1, h)
        logits = self.gate(x)
        w, ids = torch.topk(F.softmax(logits, dim=1, dtype=torch.float), K, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for k in range(K):
                out[t] += w[t, k] * self.experts[int(ids[t, k])](x[t])
        return out.view(b, s, h), logits


class TopKRouter(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(E, H) * 0.5)

    def forward(self, x):
        logits = F.linear(x, self.weight)
        w, ids = torch.topk(F.softmax(logits, dim=-1, dtype=torch.float), K, dim=-1)
        return logits, (w / w.sum(-1, keepdim=True)).to(x.dtype), ids


class FusedExperts(nn.Module):
    def __init__(self):
        super().__init__()
        self.num_experts = E
        self.gate_up_proj = nn.Parameter(torch.rand(E, 2 * I, H) * 0.4 - 0.2)
        self.down_proj = nn.Parameter(torch.rand(E, H, I) * 0.4 - 0.2)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for t in range(hidden_states.shape[0]):
            for k in range(top_k_index.shape[1]):
                e = int(top_k_index[t, k])
                g, u = F.linear(hidden_states[t], self.gate_up_proj[e]).chunk(2, dim=-1)
                out[t] += top_k_weights[t, k] * F.linear(F.silu(g) * u, self.down_proj[e])
        return out


class FusedMoe(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = TopKRouter()
        self.experts = FusedExperts()

    def forward(self, hidden_states):
        b, s, h = hidden_states.shape
        x = hidden_states.view(-1, h)
        _, w, ids = self.gate(x)
        return self.experts(x, ids, w).view(b, s, h)


class FusedMoeOwnRouterName(nn.Module):
    """A block that routes by itself with a router under another name (`scorer`)."""

    def __init__(self):
        super().__init__()
        self.scorer = TopKRouter()
        self.experts = FusedExperts()

    def forward(self, hidden_states):
        b, s, h = hidden_states.shape
        x = hidden_states.view(-1, h)
        _, w, ids = self.scorer(x)
        return self.experts(x, ids, w).view(b, s, h)


class SigmoidRouter(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(E, H) * 0.5)
        self.register_buffer("e_score_correction_bias", torch.randn(E) * 0.1)

    def forward(self, x):
        return F.linear(x.float(), self.weight.float())


class DeepseekStyleMoe(nn.Module):
    """Sigmoid scores, top-k on score + bias, unbiased weights renormalised times 2.5, a shared expert."""
    scaling = 2.5

    def __init__(self):
        super().__init__()
        self.gate = SigmoidRouter()
        self.experts = nn.ModuleList([MLP(I) for _ in range(E)])
        self.shared_experts = MLP(I)

    def route_tokens_to_experts(self, logits):
        scores = logits.sigmoid()
        ids = torch.topk(scores + self.gate.e_score_correction_bias, K, dim=-1)[1]
        w = scores.gather(1, ids)
        return ids, w / w.sum(-1, keepdim=True) * self.scaling

    def forward(self, hidden_states):
        b, s, h = hidden_states.shape
        x = hidden_states.view(-1, h)
        ids, w = self.route_tokens_to_experts(self.gate(x))
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for k in range(K):
                out[t] += w[t, k] * self.experts[int(ids[t, k])](x[t])
        return (out + self.shared_experts(x)).view(b, s, h)


class GptOssStyleRouter(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(E, H) * 0.5)
        self.bias = nn.Parameter(torch.randn(E) * 0.1)

    def forward(self, x):
        top, idx = torch.topk(F.linear(x, self.weight, self.bias), K, dim=-1)
        return torch.zeros(x.shape[0], E, dtype=x.dtype).scatter_(1, idx, F.softmax(top, dim=1)), idx


class GptOssStyleExperts(nn.Module):
    """[E, H, 2I] gate/up with interleaved columns, biases, clamped SwiGLU (alpha 1.702, limit 7)."""

    def __init__(self):
        super().__init__()
        self.num_experts = E
        self.gate_up_proj = nn.Parameter(torch.randn(E, H, 2 * I) * 0.3)
        self.gate_up_proj_bias = nn.Parameter(torch.randn(E, 2 * I) * 0.1)
        self.down_proj = nn.Parameter(torch.randn(E, I, H) * 0.3)
        self.down_proj_bias = nn.Parameter(torch.randn(E, H) * 0.1)

    def forward(self, hidden_states, router_indices=None, routing_weights=None):
        out = torch.zeros_like(hidden_states)
        for t in range(hidden_states.shape[0]):
            for e in router_indices[t].tolist():
                gu = hidden_states[t] @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]
                gate, up = gu[0::2].clamp(max=7.0), gu[1::2].clamp(-7.0, 7.0)
                y = ((up + 1) * gate * torch.sigmoid(gate * 1.702)) @ self.down_proj[e] + self.down_proj_bias[e]
                out[t] += routing_weights[t, e] * y
        return out


class GptOssStyleMoe(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = GptOssStyleRouter()
        self.experts = GptOssStyleExperts()

    def forward(self, hidden_states):
        b, s, h = hidden_states.shape
        x = hidden_states.reshape(-1, h)
        scores, idx = self.router(x)
        return self.experts(x, router_indices=idx, routing_weights=scores).reshape(b, s, h), scores


class Qwen2StyleMoe(nn.Module):
    """Experts in a ModuleList, softmax top-k without renormalisation, a shared expert scaled by
    sigmoid(shared_expert_gate . x); returns (out, router_logits)."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(H, E, bias=False)
        self.experts = nn.ModuleList([MLP(I) for _ in range(E)])
        self.shared_expert = MLP(IS)
        self.shared_expert_gate = nn.Linear(H, 1, bias=False)

    def forward(self, hidden_states):
        b, s, h = hidden_states.shape
        x = hidden_states.view(-1, h)
        logits = self.gate(x)
        w, ids = torch.topk(F.softmax(logits, dim=1, dtype=torch.float), K, dim=-1)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for k in range(K):
                out[t] += w[t, k] * self.experts[int(ids[t, k])](x[t])
        out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.view(b, s, h), logits


class ParallelExperts(nn.Module):
    """GraniteMoe/JetMoe parallel experts: weight [E, out, in]; rows grouped by expert, expert_size each."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.num_experts = E
        self.weight = nn.Parameter(torch.randn(E, n_out, n_in) / n_in ** 0.5)

    def forward(self, inputs, expert_size):
        parts = inputs.split(expert_size, dim=0)
        return torch.cat([F.linear(parts[e], self.weight[e]) for e in range(E)], dim=0)


class GraniteStyleGating(nn.Module):
    """Top-k of the logits, softmax over the k; returns the routes sorted by expert:
    (index_sorted_experts, batch_index, batch_gates, expert_size, logits)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(H, E, bias=False)

    def forward(self, x):
        logits = self.layer(x).float()
        top, ids = logits.topk(K, dim=1)
        gates = torch.softmax(top, dim=1).type_as(x)
        expert_size = torch.zeros(x.shape[0], E, dtype=torch.long).scatter(1, ids, 1).sum(0).tolist()
        order = ids.flatten().sort(0)[1]
        return order, order.div(K, rounding_mode="trunc"), gates.flatten()[order], expert_size, logits


class GraniteStyleMoe(nn.Module):
    """input_linear [E, 2I, H] (gate rows then up rows), output_linear [E, H, I], router.layer;
    returns (out, router_logits)."""

    def __init__(self):
        super().__init__()
        self.input_linear = ParallelExperts(H, 2 * I)
        self.output_linear = ParallelExperts(I, H)
        self.router = GraniteStyleGating()

    def forward(self, layer_input):
        b, s, h = layer_input.shape
        x = layer_input.reshape(-1, h)
        _, batch_index, batch_gates, expert_size, logits = self.router(x)
        hidden = self.input_linear(x[batch_index], expert_size)
        gate, up = hidden.chunk(2, dim=-1)
        y = self.output_linear(F.silu(gate) * up, expert_size) * batch_gates[:, None]
        out = torch.zeros_like(x).index_add(0, batch_index, y)
        return out.view(b, s, h), logits


class Granite5StyleRouter(nn.Module):
    """GraniteMoeTopKRouter as transformers >= 5.15 writes it: the weight on the router itself, top-k
    of the fp32 logits, softmax over the k; returns (top_k_index, top_k_weights, router_logits), the
    reverse of the (logits, weights, index) order of the other families."""

    def __init__(self):
        super().__init__()
        self.top_k = K
        self.weight = nn.Parameter(torch.randn(E, H) / H ** 0.5)

    def forward(self, x):
        logits = F.linear(x, self.weight).float()
        top, ids = logits.topk(self.top_k, dim=-1)
        return ids, torch.softmax(top, dim=-1), logits


class Granite5StyleMoe(nn.Module):
    """GraniteMoeMoE as transformers >= 5.15 writes it: `router` and fused `experts` (gate_up_proj
    [E, 2I, H], down_proj [E, H, I]) called with the routes; returns the tensor alone. Its Hub
    checkpoints keep the older names (router.layer.weight, input_linear.weight, output_linear.weight)."""

    def __init__(self):
        super().__init__()
        self.router = Granite5StyleRouter()
        self.experts = FusedExperts()

    def forward(self, layer_input):
        b, s, h = layer_input.shape
        x = layer_input.reshape(-1, h)
        ids, w, _ = self.router(x)
        return self.experts(x, ids, w).view(b, s, h)


class GraniteLayer(nn.Module):
    """A GraniteMoe decoder layer: the block is `block_sparse_moe`, its output scaled by the
    residual multiplier."""

    def __init__(self, block):
        super().__init__()
        self.block_sparse_moe = block
        self.residual_multiplier = 0.5

    def forward(self, x):
        y = self.block_sparse_moe(x)
        return x + self.residual_multiplier * (y[0] if isinstance(y, tuple) else y)


# GraniteMoe's names in Hub checkpoints for what transformers >= 5.15 holds under other names
GRANITE_HUB_NAMES = (("block_sparse_moe.router.weight", "block_sparse_moe.router.layer.weight"),
                     ("block_sparse_moe.experts.gate_up_proj", "block_sparse_moe.input_linear.weight"),
                     ("block_sparse_moe.experts.down_proj", "block_sparse_moe.output_linear.weight"))


class Llama4StyleRouter(nn.Linear):
    """Returns (dense scores [T, E]: sigmoid of the top-k logits, 0 elsewhere; logits)."""

    def __init__(self):
        super().__init__(H, E, bias=False)

    def forward(self, x):
        logits = super().forward(x)
        top, ids = torch.topk(logits, K4, dim=1)
        scores = torch.full_like(logits, float("-inf")).scatter_(1, ids, top)
        return torch.sigmoid(scores.float()).to(x.dtype), logits


class Llama4StyleExperts(nn.Module):
    """gate_up_proj [E, H, 2I] (gate columns then up), down_proj [E, I, H]; called with the hidden
    states alone, already scaled by the routing weight: [E * T, H] -> [E * T, H]."""

    def __init__(self):
        super().__init__()
        self.num_experts = E
        self.gate_up_proj = nn.Parameter(torch.randn(E, H, 2 * I) * 0.3)
        self.down_proj = nn.Parameter(torch.randn(E, I, H) * 0.3)

    def forward(self, hidden_states):
        x = hidden_states.view(E, -1, H)
        gate, up = torch.bmm(x, self.gate_up_proj).chunk(2, dim=-1)
        return torch.bmm(up * F.silu(gate), self.down_proj).view(-1, H)


class Llama4StyleMoe(nn.Module):
    """Top-1, the sigmoid weight scales the expert's input, a shared expert; returns (out, logits)."""

    def __init__(self):
        super().__init__()
        self.experts = Llama4StyleExperts()
        self.router = Llama4StyleRouter()
        self.shared_expert = MLP(I)

    def forward(self, hidden_states):
        b, s, h = hidden_states.shape
        x = hidden_states.reshape(-1, h)
        scores, logits = self.router(x)
        routed_in = x.repeat(E, 1) * scores.transpose(0, 1).reshape(-1, 1)
        out = self.shared_expert(x) + self.experts(routed_in).view(E, -1, h).sum(dim=0)
        return out.view(b, s, h), logits


class RouterWithoutLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(E, H))

    def forward(self, x):
        return x @ self.w.t()


class OpaqueRouterMoe(LoopMoe):
    """A loop block whose router has no linear layer to read logits from."""

    def __init__(self):
        super().__init__()
        self.gate = RouterWithoutLinear()


class GraniteSharedMLP(nn.Module):
    """input_linear [2 Is, H] (gate rows then up rows), output_linear [H, Is]."""

    def __init__(self):
        super().__init__()
        self.input_linear = nn.Linear(H, 2 * IS, bias=False)
        self.output_linear = nn.Linear(IS, H, bias=False)

    def forward(self, x):
        gate, up = self.input_linear(x).chunk(2, dim=-1)
        return self.output_linear(F.silu(gate) * up)


class SharedBesideLayer(nn.Module):
    """A decoder layer holding a shared MLP beside its MoE block (GraniteMoeShared)."""

    def __init__(self, block):
        super().__init__()
        self.mlp = block
        self.shared_mlp = GraniteSharedMLP()

    def forward(self, x):
        y = self.mlp(x)
        return x + (y[0] if isinstance(y, tuple) else y) + self.shared_mlp(x)


class Layer(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.mlp = block

    def forward(self, x):
        y = self.mlp(x)
        if isinstance(y, tuple):
            y = y[0]
        return x + y


class ProjLayer(Layer):
    """A layer with a dense MLP without activation before its MoE block (a stand-in for attention's
    projections)."""

    def __init__(self, block):
        super().__init__(block)
        self.proj_in = nn.Linear(H, 200, bias=False)
        self.proj_out = nn.Linear(200, H, bias=False)

    def forward(self, x):
        return super().forward(x + self.proj_out(self.proj_in(x)))


def e4m3_reference(raw):
    """float64 values of E4M3 (fn) bytes, from sign, exponent (bias 7) and mantissa fields."""
    b = raw.long()
    sign = 1.0 - 2.0 * (b >> 7).double()
    exp, man = (b >> 3) & 15, (b & 7).double()
    normal = (1.0 + man / 8.0) * torch.pow(2.0, (exp - 7).double())
    sub = man / 8.0 * 2.0 ** -6
    return sign * torch.where(exp == 0, sub, normal)


class TinyModel(nn.Module):
    def __init__(self, make_block, layer=Layer):
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([layer(make_block()) for _ in range(L)])

    def forward(self, x):
        for layer in self.model.layers:
            x = layer(x)
        return x


CONFIGS = {  # config.json per hand-built block style, as the loader reads them
    "deepseek": {"model_type": "deepseek_v3", "hidden_size": H, "num_hidden_layers": L, "n_routed_experts": E,
                 "num_experts_per_tok": K, "moe_intermediate_size": I, "first_k_dense_replace": 0,
                 "n_group": 1, "topk_group": 1, "routed_scaling_factor": DeepseekStyleMoe.scaling,
                 "norm_topk_prob": True, "n_shared_experts": 1, "scoring_func": "sigmoid", "hidden_act": "silu"},
    "gpt_oss": {"model_type": "gpt_oss", "hidden_size": H, "num_hidden_layers": L, "num_local_experts": E,
                "num_experts_per_tok": K, "intermediate_size": I, "swiglu_limit": 7.0,
                "quantization_config": {"quant_method": "mxfp4"}},
    "qwen3": {"model_type": "qwen3_moe", "hidden_size": H, "num_hidden_layers": L, "num_experts": E,
              "num_experts_per_tok": K, "moe_intermediate_size": I, "norm_topk_prob": True, "hidden_act": "silu"},
    "qwen2": {"model_type": "qwen2_moe", "hidden_size": H, "num_hidden_layers": L, "num_experts": E,
              "num_experts_per_tok": K, "moe_intermediate_size": I, "norm_topk_prob": False,
              "shared_expert_intermediate_size": IS, "hidden_act": "silu"},
    "granite": {"model_type": "granitemoe", "hidden_size": H, "num_hidden_layers": L, "num_local_experts": E,
                "num_experts_per_tok": K, "intermediate_size": I, "hidden_act": "silu"},
    "granite_shared": {"model_type": "granitemoeshared", "hidden_size": H, "num_hidden_layers": L,
                       "num_local_experts": E, "num_experts_per_tok": K, "intermediate_size": I,
                       "shared_intermediate_size": IS, "hidden_act": "silu"},
    "llama4": {"model_type": "llama4_text", "hidden_size": H, "num_hidden_layers": L, "num_local_experts": E,
               "num_experts_per_tok": K4, "intermediate_size": I, "interleave_moe_layer_step": 1,
               "hidden_act": "silu"},
}
CONFIGS["loop"] = CONFIGS["fused"] = CONFIGS["qwen3"]


def write_checkpoint(model, path, style, renames=()):
    """model's state dict as a safetensors checkpoint with the style's config.json; renames:
    (model spelling, checkpoint spelling) substitutions of the tensor names."""
    os.makedirs(path, exist_ok=True)
    tensors = {}
    for name, p in model.state_dict().items():
        t = p.detach()
        for a, b in renames:
            name = name.replace(a, b)
        if style == "gpt_oss" and (name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj")):
            # MXFP4 as gpt-oss stores it: [E, N, K] (the module holds [E, K, N]); the module gets the
            # dequantised weights, so both sides compute with the same values
            blocks, scales, deq = mxfp4_quantise(t.transpose(1, 2))
            with torch.no_grad():
                p.copy_(deq.transpose(1, 2))
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        elif name.endswith("e_score_correction_bias"):
            tensors[name] = t.float()
        else:
            tensors[name] = t.to(torch.bfloat16)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    config = CONFIGS[style]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)


def rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


class OffloadExperts(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ft_py_torch_")
        torch.manual_seed(0)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def build(self, make_block, style, layer=Layer, renames=()):
        model = bf16_round_(TinyModel(make_block, layer)).eval()
        path = os.path.join(self.tmp, style)
        write_checkpoint(model, path, style, renames)
        return model, path

    def check_matches(self, make_block, style, tokens=5, layer=Layer, renames=(), **kwargs):
        model, path = self.build(make_block, style, layer, renames)
        x = torch.randn(1, tokens, H)
        with torch.no_grad():
            want = model(x)
        offload = ftt.offload_experts(model, path, backend="cpu", cpu_threads=2, **kwargs)
        self.assertEqual(offload.backend, "cpu")
        with torch.inference_mode():
            got = model(x)
        self.assertEqual(got.shape, want.shape)
        self.assertEqual(got.dtype, want.dtype)
        err = rel_l2(got - x, want - x)  # the MoE contributions, without the residual
        self.assertLess(err, 1e-2, "relative L2 %.3g" % err)
        return model, offload

    def test_modulelist_experts(self):
        model, offload = self.check_matches(LoopMoe, "loop")
        self.assertEqual(offload.stats()["decode_calls"], L)
        for layer in model.model.layers:
            self.assertIsInstance(layer.mlp.experts, ftt.FreeTokenExperts)
            self.assertEqual(list(layer.mlp.experts.parameters()), [])
        # the block still returns (out, router_logits) as its original forward did
        with torch.no_grad():
            out = model.model.layers[0].mlp(torch.randn(1, 3, H))
        self.assertIsInstance(out, tuple)
        self.assertEqual(tuple(out[1].shape), (3, E))

    def test_fused_experts_keep_the_blocks_forward(self):
        model, _ = self.check_matches(FusedMoe, "fused")
        self.assertEqual(model.model.layers[0].mlp.forward.__func__, FusedMoe.forward)

    def test_fused_experts_whatever_the_router_is_called(self):
        source, path = self.build(FusedMoe, "fused")  # the checkpoint names the router `gate`
        model = TinyModel(FusedMoeOwnRouterName).eval()
        model.load_state_dict({k.replace(".gate.", ".scorer."): v for k, v in source.state_dict().items()})
        x = torch.randn(1, 4, H)
        with torch.no_grad():
            want = model(x)
        with self.assertRaises(ft.Error) as cm:  # router='freetoken' needs the router's logits
            ftt.offload_experts(model, path, backend="cpu", router="freetoken")
        self.assertEqual(cm.exception.status, ft.FT_ERR_UNSUPPORTED)
        ftt.offload_experts(model, path, backend="cpu", cpu_threads=2)
        self.assertIsInstance(model.model.layers[0].mlp.experts, ftt.FreeTokenExperts)
        with torch.no_grad():
            self.assertLess(rel_l2(model(x) - x, want - x), 1e-2)

    def test_gpt_oss_style_mxfp4_experts(self):
        model, offload = self.check_matches(GptOssStyleMoe, "gpt_oss")
        self.assertEqual(offload.ft_model.info()["format"], ft.FT_FORMAT_MXFP4)
        self.assertEqual(model.model.layers[0].mlp.forward.__func__, GptOssStyleMoe.forward)

    def test_deepseek_style_with_the_models_shared_expert(self):
        self.check_matches(DeepseekStyleMoe, "deepseek")

    def test_deepseek_style_with_freetokens_shared_expert(self):
        model, _ = self.check_matches(DeepseekStyleMoe, "deepseek", shared_experts="freetoken")
        self.assertIsInstance(model.model.layers[0].mlp.shared_experts, ftt._Zero)

    def test_qwen2_style_sigmoid_gated_shared_expert(self):
        model, offload = self.check_matches(Qwen2StyleMoe, "qwen2")
        self.assertEqual(offload.ft_model.info()["shared_expert_gate"], 1)
        block = model.model.layers[0].mlp
        self.assertIsInstance(block.shared_expert, MLP)  # the model's own, gate applied by the new forward
        with torch.no_grad():
            self.assertIsInstance(block(torch.randn(1, 2, H)), tuple)

    def test_qwen2_style_with_freetokens_shared_expert(self):
        model, _ = self.check_matches(Qwen2StyleMoe, "qwen2", shared_experts="freetoken")
        self.assertIsInstance(model.model.layers[0].mlp.shared_expert, ftt._Zero)

    def test_granite_style_parallel_experts(self):
        model, offload = self.check_matches(GraniteStyleMoe, "granite")
        self.assertEqual(offload.ft_model.info()["routing"], ft.FT_ROUTING_TOPK_SOFTMAX)
        block = model.model.layers[0].mlp
        self.assertIsInstance(block.experts, ftt.FreeTokenExperts)
        self.assertEqual([p for n, p in block.named_parameters() if "linear" in n and "router" not in n], [])
        with torch.no_grad():
            out = block(torch.randn(1, 3, H))
        self.assertIsInstance(out, tuple)  # (out, router_logits) as the original
        self.assertEqual(tuple(out[1].shape), (3, E))

    def test_granite_shared_mlp_beside_the_block(self):
        self.check_matches(GraniteStyleMoe, "granite_shared", layer=SharedBesideLayer)
        model, _ = self.check_matches(GraniteStyleMoe, "granite_shared", layer=SharedBesideLayer,
                                      shared_experts="freetoken")
        self.assertIsInstance(model.model.layers[1].shared_mlp, ftt._Zero)

    def test_granite5_style_block_from_a_hub_checkpoint(self):
        # transformers >= 5.15 GraniteMoe: the router returns (index, weights, logits) and the fused
        # experts are called with the routes, so the block keeps its forward; every token count
        # (decode steps are one token) matches the block's own output
        for tokens in (1, 2, 7):
            with self.subTest(tokens=tokens):
                model, offload = self.check_matches(Granite5StyleMoe, "granite", tokens=tokens,
                                                    layer=GraniteLayer, renames=GRANITE_HUB_NAMES)
                block = model.model.layers[0].block_sparse_moe
                self.assertEqual(block.forward.__func__, Granite5StyleMoe.forward)
                self.assertIsInstance(block.experts, ftt.FreeTokenExperts)
                self.assertEqual(offload.stats()["decode_calls"], L)
                offload.close()

    def test_granite5_style_built_on_meta_maps_the_hub_names(self):
        # from_pretrained's path: parameters on meta, experts replaced, router.layer.weight of the Hub
        # checkpoint read into the router's own weight
        model, path = self.build(Granite5StyleMoe, "granite", GraniteLayer, GRANITE_HUB_NAMES)
        x = torch.randn(1, 4, H)
        with torch.no_grad():
            want = model(x)
        torch.manual_seed(321)
        with ftt._parameters_on_meta():
            skeleton = TinyModel(Granite5StyleMoe, GraniteLayer).eval()
        ftt.offload_experts(skeleton, path, backend="cpu", device="cpu", cpu_threads=2)
        ftt.load_non_expert_weights(skeleton, path, torch.device("cpu"))
        for a, b in zip(model.model.layers, skeleton.model.layers):
            self.assertTrue(torch.equal(a.block_sparse_moe.router.weight, b.block_sparse_moe.router.weight))
        with torch.no_grad():
            self.assertLess(rel_l2(skeleton(x) - x, want - x), 1e-2)

    def test_parameters_kept_in_float32_as_transformers_keeps_them(self):
        # from_pretrained casts the model to its dtype except what the model class keeps in float32
        model = TinyModel(LoopMoe)
        model._keep_in_fp32_modules_strict = ["gate.weight", "moe_statics"]
        model.model.layers[0]._keep_in_fp32_modules = ["down_proj"]
        keep = ftt._keep_in_fp32(model, torch.bfloat16)
        self.assertTrue(keep.search("model.layers.0.mlp.gate.weight"))
        self.assertTrue(keep.search("model.layers.1.mlp.gate.moe_statics.e_score_correction_bias"))
        self.assertFalse(keep.search("model.layers.0.mlp.gate_proj.weight"))
        self.assertFalse(keep.search("model.layers.0.mlp.experts.0.down_proj.weight"))  # fp16 only
        self.assertTrue(ftt._keep_in_fp32(model, torch.float16).search("model.layers.0.mlp.experts.0.down_proj.weight"))
        self.assertIsNone(ftt._keep_in_fp32(TinyModel(LoopMoe), torch.bfloat16))

    def test_llama4_style_input_scaled_top1(self):
        model, offload = self.check_matches(Llama4StyleMoe, "llama4")
        info = offload.ft_model.info()
        self.assertEqual((info["routing"], info["route_weight"]), (ft.FT_ROUTING_TOPK_SIGMOID,
                                                                   ft.FT_ROUTE_WEIGHT_INPUT))
        self.assertIsNot(model.model.layers[0].mlp.forward.__func__, Llama4StyleMoe.forward)

    def test_a_router_without_logits_is_unsupported(self):
        model, path = self.build(LoopMoe, "loop")
        opaque = TinyModel(OpaqueRouterMoe)
        with self.assertRaises(ft.Error) as cm:
            ftt.offload_experts(opaque, path, backend="cpu")
        self.assertEqual(cm.exception.status, ft.FT_ERR_UNSUPPORTED)
        self.assertIn("OpaqueRouterMoe", cm.exception.message)

    def test_router_freetoken(self):
        self.check_matches(LoopMoe, "loop", router="freetoken")

    def test_long_calls_are_split(self):
        model, offload = self.check_matches(LoopMoe, "loop", tokens=10, max_tokens=4)
        self.assertEqual(offload.stats()["decode_calls"], L * 3)

    def test_bf16_model(self):
        model, path = self.build(LoopMoe, "loop")
        model = model.to(torch.bfloat16)
        x = torch.randn(1, 4, H).to(torch.bfloat16)
        # torch's own bf16 matmul, not oneDNN's: a torch built on the system oneDNN finds no bf16
        # matmul where ONEDNN_MAX_CPU_ISA caps it below the CPU (the AVX2 run of .ci/run).
        with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
            want = model(x).float() - x.float()
        ftt.offload_experts(model, path, backend="cpu", cpu_threads=2)
        with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
            got = model(x)
        self.assertEqual(got.dtype, torch.bfloat16)
        self.assertLess(rel_l2(got.float() - x.float(), want), 2e-2)

    def test_mismatches_are_errors(self):
        model, path = self.build(LoopMoe, "loop")
        with self.assertRaises(ft.Error) as cm:
            ftt.offload_experts(model, path, backend="gpu")
        self.assertIn(cm.exception.status, (ft.FT_ERR_UNSUPPORTED, ft.FT_ERR_NO_DEVICE))
        other = TinyModel(lambda: FusedMoe())
        other.model.layers = other.model.layers[:1]
        with self.assertRaises(ft.Error) as cm:
            ftt.offload_experts(other, path, backend="cpu")
        self.assertEqual(cm.exception.status, ft.FT_ERR_FORMAT)
        with self.assertRaises(ft.Error) as cm:
            ftt.offload_experts(nn.Sequential(nn.Linear(2, 2)), path)
        self.assertEqual(cm.exception.status, ft.FT_ERR_UNSUPPORTED)
        with self.assertRaises(ValueError):
            ftt.offload_experts(model, path, router="mine")

    def test_meta_experts_need_no_memory(self):
        model, path = self.build(LoopMoe, "loop")
        x = torch.randn(1, 3, H)
        with torch.no_grad():
            want = model(x)
        for layer in model.model.layers:  # as a model built with its experts on the meta device
            layer.mlp.experts = layer.mlp.experts.to("meta")
        ftt.offload_experts(model, path, backend="cpu", cpu_threads=2)
        self.assertFalse(any(p.device.type == "meta" for p in model.parameters()))
        with torch.no_grad():
            self.assertLess(rel_l2(model(x) - x, want - x), 1e-2)

    def test_built_on_meta_and_loaded_from_the_checkpoint(self):
        # what from_pretrained does after transformers' from_config: parameters on meta, experts
        # replaced, the other weights and persistent buffers (the correction bias) read from the file
        for make, style in ((DeepseekStyleMoe, "deepseek"), (FusedMoe, "fused")):
            with self.subTest(style=style):
                model, path = self.build(make, style)
                x = torch.randn(1, 4, H)
                with torch.no_grad():
                    want = model(x)
                torch.manual_seed(123)  # the skeleton's own initial values differ from the checkpoint's
                with ftt._parameters_on_meta():
                    skeleton = TinyModel(make).eval()
                self.assertTrue(all(p.device.type == "meta" for p in skeleton.parameters()))
                ftt.offload_experts(skeleton, path, backend="cpu", device="cpu", cpu_threads=2)
                ftt.load_non_expert_weights(skeleton, path, torch.device("cpu"))
                self.assertFalse(any(p.device.type == "meta" for p in skeleton.parameters()))
                with torch.no_grad():
                    got = skeleton(x)
                self.assertLess(rel_l2(got - x, want - x), 1e-2)

    def test_missing_non_expert_weights_are_named(self):
        model, path = self.build(LoopMoe, "loop")
        with ftt._parameters_on_meta():
            skeleton = TinyModel(LoopMoe)
            skeleton.extra = nn.Linear(2, 2)  # a parameter the checkpoint does not have
        ftt.offload_experts(skeleton, path, backend="cpu", device="cpu", cpu_threads=2)
        with self.assertRaises(ft.Error) as cm:
            ftt.load_non_expert_weights(skeleton, path, torch.device("cpu"))
        self.assertIn("extra.weight", cm.exception.message)

    def test_a_model_built_in_memory(self):
        model = bf16_round_(TinyModel(LoopMoe)).eval()
        x = torch.randn(1, 3, H)
        with torch.no_grad():
            want = model(x)
        with ft.Engine(device=ft.FT_DEVICE_NONE, cpu_threads=2) as engine:
            ftm = ft.Model.create(engine, num_layers=L, num_experts=E, top_k=K, hidden_size=H, intermediate_size=I)
            for l, layer in enumerate(model.model.layers):
                for e, mlp in enumerate(layer.mlp.experts):
                    for proj, lin in ((ft.FT_PROJ_GATE, mlp.gate_proj), (ft.FT_PROJ_UP, mlp.up_proj),
                                      (ft.FT_PROJ_DOWN, mlp.down_proj)):
                        ftm.set_expert(l, e, proj, lin.weight.detach().to(torch.bfloat16).contiguous())
            ftm.finalize()
            offload = ftt.offload_experts(model, ftm, backend="cpu")
            with torch.no_grad():
                self.assertLess(rel_l2(model(x) - x, want - x), 1e-2)
            offload.close()
            self.assertTrue(offload.session.closed)
            self.assertFalse(ftm.closed or engine.closed)

    def test_fp8_block_non_expert_weights_are_dequantised(self):
        # DeepSeek-V3-style FP8: non-expert weights stored as E4M3 bytes with a weight_scale_inv per
        # 128x128 block (the default without a quantization_config; partial blocks on both axes:
        # [200, 64] and [64, 200]). The experts stay bf16 here: FP8 experts are the loader's.
        model = bf16_round_(TinyModel(DeepseekStyleMoe, ProjLayer)).eval()
        path = os.path.join(self.tmp, "fp8")
        write_checkpoint(model, path, "deepseek")
        g = torch.Generator().manual_seed(5)
        tensors, dtypes = {}, {}
        for l, layer in enumerate(model.model.layers):
            for lin in ("proj_in", "proj_out"):
                weight = getattr(layer, lin).weight
                raw = torch.randint(0, 256, tuple(weight.shape), generator=g, dtype=torch.uint8)
                raw[(raw & 0x7F) == 0x7F] = 0x38  # no NaN bytes
                scale = torch.rand(-(-weight.shape[0] // 128), -(-weight.shape[1] // 128), generator=g) * 1e-3 + 1e-4
                grid = scale.double().repeat_interleave(128, 0)[:weight.shape[0]].repeat_interleave(128, 1)
                with torch.no_grad():
                    weight.copy_((e4m3_reference(raw) * grid[:, :weight.shape[1]]).float())
                name = "model.layers.%d.%s.weight" % (l, lin)
                tensors[name], dtypes[name] = raw, "F8_E4M3"
                tensors[name + "_scale_inv"] = scale
        save_file(tensors, os.path.join(path, "proj.safetensors"), dtypes=dtypes)
        x = torch.randn(1, 4, H)
        with torch.no_grad():
            want = model(x)

        def load():
            with ftt._parameters_on_meta():
                skeleton = TinyModel(DeepseekStyleMoe, ProjLayer).eval()
            ftt.offload_experts(skeleton, path, backend="cpu", device="cpu", cpu_threads=2)
            ftt.load_non_expert_weights(skeleton, path, torch.device("cpu"))
            return skeleton

        skeleton = load()
        for layer, ref in zip(skeleton.model.layers, model.model.layers):
            for lin in ("proj_in", "proj_out"):
                self.assertTrue(torch.equal(getattr(layer, lin).weight, getattr(ref, lin).weight), lin)
        with torch.no_grad():
            self.assertLess(rel_l2(skeleton(x) - x, want - x), 1e-2)
        # a scale grid of the wrong shape, and an FP8 weight without one, are refused by name
        bad_grid = dict(tensors, **{"model.layers.0.proj_in.weight_scale_inv": torch.ones(1, 1)})
        no_grid = {k: v for k, v in tensors.items() if k != "model.layers.0.proj_in.weight_scale_inv"}
        for bad, status in ((bad_grid, ft.FT_ERR_FORMAT), (no_grid, ft.FT_ERR_UNSUPPORTED)):
            with self.subTest(status=status):
                save_file(bad, os.path.join(path, "proj.safetensors"), dtypes=dtypes)
                with self.assertRaises(ft.Error) as cm:
                    load()
                self.assertEqual(cm.exception.status, status)
                self.assertIn("model.layers.0.proj_in.weight", cm.exception.message)

    def test_close_releases_the_session(self):
        model, path = self.build(LoopMoe, "loop")
        offload = ftt.offload_experts(model, path, backend="cpu", cpu_threads=2)
        offload.close()
        self.assertTrue(offload.session.closed)
        with self.assertRaises(ft.Error) as cm:
            with torch.no_grad():
                model(torch.randn(1, 1, H))
        self.assertEqual(cm.exception.status, ft.FT_ERR_STATE)


class WeightRenaming:
    """Stands for transformers' (>= 5) WeightRenaming: rename_source_key(key) -> (new key, the
    pattern that matched or None)."""

    def __init__(self, source, target):
        self.source, self.target = source, target

    def rename_source_key(self, key):
        new, n = re.subn(self.source, self.target, key, count=1)
        return new, (self.source if n else None)


class WeightConverter(WeightRenaming):
    """Stands for transformers' WeightConverter: a renaming whose operations transform the tensor."""

    def __init__(self, source, target, operations=()):
        super().__init__(source, target)
        self.operations = list(operations)


@contextlib.contextmanager
def transformers_mapping(transforms):
    """A `transformers.conversion_mapping` whose get_model_conversion_mapping(model) gives
    `transforms`, in place of transformers (installed or not) meanwhile."""
    names = ("transformers", "transformers.conversion_mapping")
    saved = {n: sys.modules.get(n) for n in names}
    pkg, mod = types.ModuleType(names[0]), types.ModuleType(names[1])
    mod.get_model_conversion_mapping = lambda model: list(transforms)
    pkg.conversion_mapping = mod
    sys.modules.update({names[0]: pkg, names[1]: mod})
    try:
        yield
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


class CheckpointNames(unittest.TestCase):
    """load_non_expert_weights matches checkpoint names to the model's by transformers' own key
    renaming when it has one, and fails naming both sides when nothing matches."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ft_py_names_")
        torch.manual_seed(0)
        # the checkpoint calls the router `gate`; the skeleton's block calls it `scorer`, a rename
        # only a mapping can know
        self.source = bf16_round_(TinyModel(FusedMoe)).eval()
        self.path = os.path.join(self.tmp, "fused")
        write_checkpoint(self.source, self.path, "fused")
        self.x = torch.randn(1, 3, H)
        with torch.no_grad():
            self.want = self.source(self.x)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def skeleton(self):
        with ftt._parameters_on_meta():
            model = TinyModel(FusedMoeOwnRouterName).eval()
        ftt.offload_experts(model, self.path, backend="cpu", device="cpu", cpu_threads=2)
        return model

    def test_transformers_renaming_is_applied(self):
        model = self.skeleton()
        # a converter that only renames (no operations) is a renaming too
        with transformers_mapping([WeightRenaming(r"\.mlp\.gate\.", ".mlp.router."),
                                   WeightConverter(r"\.mlp\.router\.", ".mlp.scorer.")]):
            ftt.load_non_expert_weights(model, self.path, torch.device("cpu"))
        with torch.no_grad():
            self.assertLess(rel_l2(model(self.x) - self.x, self.want - self.x), 1e-2)

    def test_unmatched_names_are_reported_on_both_sides(self):
        model = self.skeleton()
        with transformers_mapping([WeightRenaming(r"\.unrelated\.", ".other.")]):
            with self.assertRaises(ft.Error) as cm:
                ftt.load_non_expert_weights(model, self.path, torch.device("cpu"))
        self.assertEqual(cm.exception.status, ft.FT_ERR_FORMAT)
        message = cm.exception.message
        self.assertIn("model.layers.0.mlp.scorer.weight", message)  # the parameter left empty
        self.assertIn("model.layers.0.mlp.gate.weight", message)  # the checkpoint tensor no one took
        self.assertIn("transformers' checkpoint conversion mapping", message)

    def test_a_transformers_conversion_is_not_taken_for_a_rename(self):
        # a conversion transforms the tensor (fuses, transposes): copying it as it is would load
        # wrong values, so the parameter stays unloaded and the error says why
        model = self.skeleton()
        convert = WeightConverter(r"\.mlp\.gate\.", ".mlp.scorer.", operations=["transpose"])
        with transformers_mapping([convert]):
            with self.assertRaises(ft.Error) as cm:
                ftt.load_non_expert_weights(model, self.path, torch.device("cpu"))
        self.assertIn("converts", cm.exception.message)
        self.assertIn("model.layers.0.mlp.gate.weight", cm.exception.message)
        # as transformers does, the renamings apply first (wherever they are in the list), then the
        # first converter that matches; one that keeps the name (a transpose in place) is refused alike
        model = self.skeleton()
        with transformers_mapping([WeightConverter(r"\.mlp\.scorer\.", ".mlp.scorer.", operations=["transpose"]),
                                   WeightRenaming(r"\.mlp\.gate\.", ".mlp.scorer.")]):
            with self.assertRaises(ft.Error) as cm:
                ftt.load_non_expert_weights(model, self.path, torch.device("cpu"))
        self.assertIn("model.layers.0.mlp.scorer.weight", cm.exception.message)



class ReleaseConfigs(unittest.TestCase):
    """from_pretrained's config of a checkpoint whose model_type transformers does not know (a stand-in
    transformers: AutoConfig refuses it, as transformers does a model type with remote code only)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ft_py_config_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    @contextlib.contextmanager
    def stand_in(self):
        saved = sys.modules.get("transformers")
        pkg = types.ModuleType("transformers")

        class AutoConfig:
            @staticmethod
            def from_pretrained(path, trust_remote_code=False):
                raise ValueError("model type `kimi_k2` is not recognised (remote code)")

        class DeepseekV3Config:
            def __init__(self, **kwargs):
                self.__dict__.update(kwargs)

            @classmethod
            def from_dict(cls, d):
                return cls(**d)

        class DeepseekV3ForCausalLM:
            config_class = DeepseekV3Config
        pkg.AutoConfig, pkg.DeepseekV3ForCausalLM = AutoConfig, DeepseekV3ForCausalLM
        sys.modules["transformers"] = pkg
        try:
            yield pkg
        finally:
            if saved is None:
                sys.modules.pop("transformers", None)
            else:
                sys.modules["transformers"] = saved

    def write(self, architectures):
        with open(os.path.join(self.tmp, "config.json"), "w") as f:
            json.dump({"model_type": "kimi_k2", "architectures": architectures, "hidden_size": 7168,
                       "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}}, f)

    def test_built_by_the_class_architectures_names(self):
        self.write(["UnknownForCausalLM", "DeepseekV3ForCausalLM"])
        with self.stand_in() as transformers:
            config = ftt._config_of(self.tmp, trust_remote_code=False)
            self.assertIsInstance(config, transformers.DeepseekV3ForCausalLM.config_class)
        self.assertEqual(config.hidden_size, 7168)
        self.assertFalse(hasattr(config, "auto_map"))  # no remote code behind the back of the caller

    def test_refused_when_no_class_is_known(self):
        self.write(["KimiK2ForCausalLM"])
        with self.stand_in():
            with self.assertRaises(ft.Error) as cm:
                ftt._config_of(self.tmp, trust_remote_code=False)
            self.assertEqual(cm.exception.status, ft.FT_ERR_UNSUPPORTED)
            self.assertIn("kimi_k2", cm.exception.message)
            self.assertIn("KimiK2ForCausalLM", cm.exception.message)
            # with remote code allowed, transformers' own error stands
            with self.assertRaises(ValueError):
                ftt._config_of(self.tmp, trust_remote_code=True)

if __name__ == "__main__":
    unittest.main()
