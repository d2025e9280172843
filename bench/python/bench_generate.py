#!/usr/bin/env python3
"""Decode tokens/s of a transformers MoE model (Qwen3-30B-A3B-shaped by default: 48 layers, 128
experts, top-8, H=2048, I=768; random weights) at batch 1 with its routed experts in host memory:
FreeToken hybrid and offload against transformers' own ways, for the same GPU memory budget for
expert weights (cache_fraction of all experts):

  accelerate   transformers' offload: accelerate.dispatch_model with a device_map that keeps the
               expert modules beyond the budget on the CPU (copied to the GPU at every use);
               run where accelerate is installed
  lru          a hand-written per-expert copy (pinned host -> GPU slot, non_blocking) with an LRU
               slot cache in torch, the same number of slots as FreeToken's cache
  ft-hybrid    freetoken.torch.offload_experts, backend hybrid
  ft-offload   freetoken.torch.offload_experts, backend offload

Every method builds its own model from the same seeds (non-expert weights on the GPU, the same expert
weights), prefills a random prompt and times greedy decoding with model.generate; the rate is
(N - 1) / (time(N tokens) - time(1 token)), after one untimed N-token run. Each row also gives the
calling thread's time per MoE block call and, for FreeToken, the slot cache's hit rate and misses
per layer-step and, for hybrid, the split and both sides' time per step. Prints a table and the
ratio of ft-hybrid to the best baseline. Needs one CUDA GPU, torch, transformers, host memory for
one copy of the experts (about 58 GB in bf16 at the default shape) and the freetoken package with a
CUDA build of libfreetoken.

  python3 bench/python/bench_generate.py                      # all methods, default shape
  python3 bench/python/bench_generate.py --layers 8 --tokens 32 --methods lru,ft-hybrid
"""
import argparse
import collections
import gc
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
import freetoken as ft  # noqa: E402
import freetoken.torch as ftt  # noqa: E402

METHODS = ["accelerate", "lru", "ft-hybrid", "ft-offload"]


def parse():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--moe-inter", type=int, default=768)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    ap.add_argument("--tokens", type=int, default=64, help="decoded tokens per timed run")
    ap.add_argument("--cache-fraction", type=float, default=0.25, help="GPU budget: share of all experts")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu-threads", type=int, default=0, help="FreeToken engine workers (0: the library's default)")
    ap.add_argument("--hybrid-fraction", type=float, default=None,
                    help="fixed hybrid fetch fraction (default: adaptive from the profile)")
    return ap.parse_args()


# ---- the model ---------------------------------------------------------------------------------------

def make_config(a):
    import transformers
    return transformers.Qwen3MoeConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=3 * a.hidden, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim, num_experts=a.experts,
        num_experts_per_tok=a.top_k, moe_intermediate_size=a.moe_inter, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=4096, tie_word_embeddings=False)


def build_skeleton(a):
    """The transformers model with every parameter on the meta device and its MoE blocks listed."""
    import transformers
    with ftt._parameters_on_meta():
        try:
            model = transformers.AutoModelForCausalLM.from_config(make_config(a), torch_dtype=torch.bfloat16)
        except TypeError:
            model = transformers.AutoModelForCausalLM.from_config(make_config(a), dtype=torch.bfloat16)
    return model.eval(), ftt.find_moe_blocks(model)


def materialise_non_experts(model, a, device):
    """Random non-expert weights on the GPU (the same for every method: seeded by name order)."""
    gen = torch.Generator(device=device).manual_seed(a.seed)
    replaced = {}
    for mname, module in model.named_modules():
        if ".experts" in mname + ".":
            continue
        for pname, p in list(module._parameters.items()):
            if p is None or p.device.type != "meta":
                continue
            if id(p) not in replaced:
                t = torch.empty(p.shape, dtype=p.dtype, device=device)
                if "norm" in pname or "norm" in mname:
                    t.fill_(1.0)
                else:
                    t.normal_(0, 0.02, generator=gen)
                replaced[id(p)] = nn.Parameter(t, requires_grad=False)
            module._parameters[pname] = replaced[id(p)]
    for module in model.modules():
        for bname, b in list(module._buffers.items()):
            if b is not None and b.device.type != "meta":
                module._buffers[bname] = b.to(device)
    ftt._fix_meta_buffers(model, device)


def expert_layer(a, layer, device):
    """Layer `layer`'s experts: gate_up [E, 2I, H] (gate rows, then up rows) and down [E, H, I], bf16."""
    gen = torch.Generator(device=device).manual_seed(1000 + a.seed * 7919 + layer)
    E, H, I = a.experts, a.hidden, a.moe_inter
    gu = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device=device).normal_(0, 0.02, generator=gen)
    dn = torch.empty(E, H, I, dtype=torch.bfloat16, device=device).normal_(0, 0.02, generator=gen)
    return gu, dn


def route(block, x, a):
    """The block's own router: (ids [T, K], weights [T, K])."""
    gate = ftt._router_module(block)
    picked = ftt._pick_routing(gate(x), a.experts)
    if picked is not None:
        return picked[0], picked[1]
    w, ids = torch.topk(F.softmax(gate(x).float(), dim=-1), a.top_k, dim=-1)
    return ids, w / w.sum(-1, keepdim=True)


# ---- baselines ------------------------------------------------------------------------------------

class LruExperts:
    """Pinned host copies of every expert and S GPU slots shared by all layers, least recently used
    evicted; each miss is one host->GPU copy per projection on the current stream."""

    def __init__(self, a, device, slots):
        self.a, self.device = a, device
        H, I = a.hidden, a.moe_inter
        self.host_gu, self.host_dn = [], []
        for l in range(a.layers):
            gu, dn = expert_layer(a, l, device)
            self.host_gu.append(gu.cpu().pin_memory())
            self.host_dn.append(dn.cpu().pin_memory())
            del gu, dn
        self.slot_gu = torch.empty(slots, 2 * I, H, dtype=torch.bfloat16, device=device)
        self.slot_dn = torch.empty(slots, H, I, dtype=torch.bfloat16, device=device)
        self.lru = collections.OrderedDict()  # (layer, expert) -> slot
        self.free = list(range(slots))
        self.copies = 0

    def slot(self, layer, e):
        key = (layer, e)
        s = self.lru.get(key)
        if s is not None:
            self.lru.move_to_end(key)
            return s
        s = self.free.pop() if self.free else self.lru.popitem(last=False)[1]
        self.slot_gu[s].copy_(self.host_gu[layer][e], non_blocking=True)
        self.slot_dn[s].copy_(self.host_dn[layer][e], non_blocking=True)
        self.copies += 1
        self.lru[key] = s
        return s

    def forward(self, block, layer, hidden_states):
        I = self.a.moe_inter
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        ids, w = route(block, x, self.a)
        out = torch.zeros_like(x)
        for e in ids.unique().tolist():
            tok, kpos = (ids == e).nonzero(as_tuple=True)
            s = self.slot(layer, e)
            gu = x[tok] @ self.slot_gu[s].t()
            h = F.silu(gu[:, :I]) * gu[:, I:]
            y = h @ self.slot_dn[s].t()
            out.index_add_(0, tok, (y.float() * w[tok, kpos, None].float()).to(x.dtype))
        return out.reshape(shape)


def setup_lru(model, blocks, a, device):
    slots = max(a.experts, int(a.cache_fraction * a.layers * a.experts))
    lru = LruExperts(a, device, slots)
    for layer, _, block in blocks:
        block.experts = nn.Module()
        block.forward = (lambda b, l: (lambda hidden_states: lru.forward(b, l, hidden_states)))(block, layer)
    return "%d slots (%.1f GB)" % (slots, slots * 3 * a.hidden * a.moe_inter * 2 / 1e9), lambda: None


def setup_accelerate(model, blocks, a, device):
    import accelerate
    E, I = a.experts, a.moe_inter
    budget = int(a.cache_fraction * a.layers * E)  # experts kept on the GPU
    device_map, on_gpu = {}, 0
    # expert weights materialised on the CPU (the rest of the model is on the GPU already)
    for layer, name, block in blocks:
        gu, dn = expert_layer(a, layer, device)
        gu, dn = gu.cpu(), dn.cpu()
        experts = block.experts
        if isinstance(experts, nn.ModuleList):  # one module per expert: the first budget/L of each layer
            for e, mlp in enumerate(experts):
                for pname, value in (("gate_proj", gu[e, :I]), ("up_proj", gu[e, I:]), ("down_proj", dn[e])):
                    getattr(mlp, pname)._parameters["weight"] = nn.Parameter(value.clone(), requires_grad=False)
                keep = e < budget // a.layers
                device_map["%s.experts.%d" % (name, e)] = 0 if keep else "cpu"
                on_gpu += keep
        else:  # fused parameters: whole layers on the GPU while the budget lasts
            for pname, value in (("gate_up_proj", gu), ("down_proj", dn)):
                shape = tuple(experts._parameters[pname].shape)
                if shape != tuple(value.shape):
                    value = value.transpose(1, 2)
                if shape != tuple(value.shape):
                    raise RuntimeError("%s.experts.%s has shape %s" % (name, pname, shape))
                experts._parameters[pname] = nn.Parameter(value.contiguous(), requires_grad=False)
            keep = on_gpu + E <= budget
            device_map[name + ".experts"] = 0 if keep else "cpu"
            on_gpu += E if keep else 0
        del gu, dn
    expert_keys = list(device_map)
    for mname, module in model.named_modules():
        if not mname or any(mname == k or mname.startswith(k + ".") for k in expert_keys):
            continue
        if list(module.parameters(recurse=False)) or list(module.buffers(recurse=False)):
            device_map[mname] = 0
    accelerate.dispatch_model(model, device_map=device_map,
                              skip_keys=getattr(model, "_skip_keys_device_placement", None))
    return "%d of %d experts on the GPU, the rest copied per use" % (on_gpu, a.layers * E), lambda: None


def setup_freetoken(backend):
    def setup(model, blocks, a, device):
        engine = ft.Engine(device=device.index if device.index is not None else torch.cuda.current_device(),
                           cpu_threads=a.cpu_threads)
        ftm = ft.Model.create(engine, num_layers=a.layers, num_experts=a.experts, top_k=a.top_k,
                              hidden_size=a.hidden, intermediate_size=a.moe_inter,
                              routing=ft.FT_ROUTING_SOFTMAX_TOPK_RENORM)
        I = a.moe_inter
        for l in range(a.layers):
            gu, dn = expert_layer(a, l, device)
            gu, dn = gu.cpu(), dn.cpu()
            for e in range(a.experts):
                ftm.set_expert(l, e, ft.FT_PROJ_GATE, gu[e, :I])
                ftm.set_expert(l, e, ft.FT_PROJ_UP, gu[e, I:])
                ftm.set_expert(l, e, ft.FT_PROJ_DOWN, dn[e])
            del gu, dn
        ftm.finalize()
        fields = {}
        if backend == "hybrid" and a.hybrid_fraction is not None:
            fields = dict(hybrid_fraction=a.hybrid_fraction, hybrid_adaptive=False)
        offload = ftt.offload_experts(model, ftm, backend=backend, cache_fraction=a.cache_fraction, device=device,
                                      **fields)

        def note():
            st = offload.stats()
            seen = st["cache_hits"] + st["cache_misses"]
            calls = max(st["decode_calls"], 1)
            text = "%d workers; hit rate %.1f%%, %.2f misses/layer-step" % (
                engine.info()["cpu_threads"], 100.0 * st["cache_hits"] / max(seen, 1), st["cache_misses"] / calls)
            if backend == "hybrid":
                text += "; fraction %.2f, CPU %.2f experts %.0f us/step, GPU side %.0f us/step" % (
                    st["hybrid_fraction"], st["experts_cpu"] / calls, 1e6 * st["cpu_seconds"] / calls,
                    1e6 * st["hybrid_gpu_seconds"] / max(st["hybrid_timed_steps"], 1))
            return text
        setup.reset = offload.session.reset_stats

        def close():
            offload.close()
            engine.close()
        setup.close = close
        return "slot cache %.0f%% of the experts" % (100 * a.cache_fraction), note
    return setup


# ---- timing ----------------------------------------------------------------------------------------

def timed(model, prompt, n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


class HostTime:
    """The calling thread's time inside the MoE blocks' forward (launches, and any wait they do)."""

    def __init__(self, blocks):
        self.total, self.calls, self.t0 = 0.0, 0, 0.0
        for _, _, block in blocks:
            block.register_forward_pre_hook(self.enter)
            block.register_forward_hook(self.leave)

    def enter(self, *_):
        self.t0 = time.perf_counter()

    def leave(self, *_):
        self.total += time.perf_counter() - self.t0
        self.calls += 1

    def reset(self):
        self.total, self.calls = 0.0, 0

    def text(self):
        return "host %.0f us per MoE block call" % (1e6 * self.total / max(self.calls, 1))


def run_method(method, a, device, prompt):
    model, blocks = build_skeleton(a)
    materialise_non_experts(model, a, device)
    setup = {"accelerate": setup_accelerate, "lru": setup_lru, "ft-hybrid": setup_freetoken("hybrid"),
             "ft-offload": setup_freetoken("offload")}[method]
    t0 = time.perf_counter()
    what, note = setup(model, blocks, a, device)
    ready = time.perf_counter() - t0
    host = HostTime(blocks)
    try:
        timed(model, prompt, a.tokens)  # warm-up: every kernel and cache length the timed runs meet
        if hasattr(setup, "reset"):
            setup.reset()
        host.reset()
        t1 = timed(model, prompt, 1)
        tn = timed(model, prompt, a.tokens)
        rate = (a.tokens - 1) / max(tn - t1, 1e-9)
        extra = "; ".join(x for x in (note(), host.text()) if x)
    finally:
        if hasattr(setup, "close"):
            setup.close()
        del model, blocks
        gc.collect()
        torch.cuda.empty_cache()
    return rate, "%s; set up in %.0f s%s" % (what, ready, "; " + extra if extra else "")


def main():
    a = parse()
    if not torch.cuda.is_available():
        print("bench_generate: needs a CUDA GPU")
        return 2
    import transformers
    device = torch.device("cuda", torch.cuda.current_device())
    print("torch %s, transformers %s, libfreetoken %s (%s), %s" % (
        torch.__version__, transformers.__version__, ft.version(), ft.library_path()[0],
        torch.cuda.get_device_name(device)))
    expert_gb = a.layers * a.experts * 3 * a.hidden * a.moe_inter * 2 / 1e9
    print("model: %d layers, %d experts top-%d, H=%d, I=%d: %.1f GB of bf16 experts; GPU budget %.0f%% = %.1f GB; "
          "batch 1, %d-token prompt, %d decoded tokens" % (a.layers, a.experts, a.top_k, a.hidden, a.moe_inter,
                                                           expert_gb, 100 * a.cache_fraction,
                                                           a.cache_fraction * expert_gb, a.prompt, a.tokens))
    gen = torch.Generator(device=device).manual_seed(a.seed)
    prompt = torch.randint(1, a.vocab, (1, a.prompt), device=device, generator=gen)
    rows = []
    for method in a.methods.split(","):
        if method == "accelerate":
            import importlib.util
            if importlib.util.find_spec("accelerate") is None:
                rows.append((method, None, "accelerate is not installed"))
                print("%-11s skipped: accelerate is not installed" % method, flush=True)
                continue
        try:
            rate, text = run_method(method, a, device, prompt)
        except Exception as e:
            traceback.print_exc()
            rate, text = None, "failed: %s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        rows.append((method, rate, text))
        print("%-11s %s tokens/s  %s" % (method, "%8.2f" % rate if rate else "       -", text), flush=True)

    print("\n| method | decode tokens/s (batch 1) | notes |\n|---|---|---|")
    for method, rate, text in rows:
        print("| %s | %s | %s |" % (method, "%.2f" % rate if rate else "-", text))
    base = [r for m, r, _ in rows if m in ("accelerate", "lru") and r]
    hyb = next((r for m, r, _ in rows if m == "ft-hybrid" and r), None)
    if base and hyb:
        print("\nft-hybrid / best baseline = %.2fx (target >= 2x)" % (hyb / max(base)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
