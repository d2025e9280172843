"""FreeToken inside a PyTorch / transformers MoE model.

    import freetoken.torch as ftt
    model = ftt.from_pretrained("/models/Qwen3-30B-A3B", backend="hybrid", cache_fraction=0.25)
    model.generate(...)

or, for a model you built yourself (its expert weights may be on the meta device):

    offload = ftt.offload_experts(model, "/models/Qwen3-30B-A3B", backend="hybrid")

Each MoE block's routed experts are replaced by a FreeTokenExperts module that runs the layer through
one FreeToken session: ft_decode_cuda on torch.cuda.current_stream() for CUDA tensors (capturable in a
CUDA graph while calls stay below the session's prefill_min_tokens), ft_decode for CPU tensors; calls
longer than the session's max_tokens are split. The router stays the model's own module (or ft_route
with router="freetoken"). The expert weights come from the checkpoint through ft_model_load, so host
memory holds them once, in FreeToken's banks. Inference only: no gradients flow through the experts.

An MoE block is a module under `layers.N` with a router (`gate` or `router`) and routed experts
(`experts`, or GraniteMoe/JetMoe-style `input_linear`/`output_linear` parallel experts). Three
kinds are handled:
  - blocks that call their experts as one module, experts(hidden, ids, weights) (transformers >= 5
    and gpt-oss): only `experts` is replaced and the block's own forward runs unchanged;
  - blocks that loop over an nn.ModuleList of experts (older transformers), call a fused experts module
    with the hidden states alone (Llama-4: the routing weight scales the expert's input, which
    FreeToken applies itself) or run parallel experts (input_linear/output_linear): the block's forward
    is replaced by one that calls the block's own router, FreeToken for the routed experts, and the
    block's shared experts (`shared_experts`, `shared_mlp`, or `shared_expert` scaled by
    sigmoid(`shared_expert_gate`) when the block has that gate), and returns what the original returned
    (the tensor, or (tensor, router_logits)).
Shared experts a decoder layer holds beside its MoE block (GraniteMoeShared's `shared_mlp`) stay the
layer's own, or are zeroed with shared_experts='freetoken'.
"""
import contextlib
import functools
import inspect
import json
import os
import re
import types

import torch
import torch.nn.functional as F
from torch import nn

from . import _ffi
from ._core import Engine, Error, Model, Session
from .safetensors import checkpoint_files, load_torch, read_header

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


class _Zero(nn.Module):
    """Stands for a shared expert FreeToken computes (shared_experts='freetoken')."""

    def forward(self, x, *args, **kwargs):
        return torch.zeros_like(x)


_ID_DTYPES = (torch.int32, torch.int64, torch.int16)  # expert ids (bool masks are not)


def _pick_routing(result, num_experts):
    """(ids [T, K] int, weights [T, K] float, logits [T, E] or None) from what a router returned."""
    tensors = [t for t in (result if isinstance(result, (tuple, list)) else (result,)) if isinstance(t, torch.Tensor)]
    ints = [t for t in tensors if t.dtype in _ID_DTYPES]
    floats = [t for t in tensors if t.is_floating_point()]
    if not ints:
        return None
    ids = ints[0].reshape(-1, ints[0].shape[-1])
    same = [t for t in floats if t.numel() == ids.numel()]
    dense = [t for t in floats if t.shape[-1] == num_experts and t.numel() == ids.shape[0] * num_experts]
    if same and (len(same) == 1 or ids.shape[-1] != num_experts):
        weights = same[0].reshape(ids.shape)
        logits = next((t for t in dense if t is not same[0]), None)
    elif dense:
        weights = dense[0].reshape(ids.shape[0], num_experts).gather(1, ids.long())  # dense [T, E] scores
        logits = None
    else:
        raise Error(_ffi.FT_ERR_UNSUPPORTED, "cannot tell the routing weights among the router's outputs %s" %
                    [tuple(t.shape) for t in tensors])
    return ids, weights, logits


class FreeTokenExperts(nn.Module):
    """The routed experts of one MoE layer, computed by a FreeToken session.

    forward(hidden [..., H], expert_ids [..., K], expert_weights [..., K] or dense [..., E]) -> [..., H]
    in hidden's dtype; the ids and weights may come positionally or by any keyword name."""

    def __init__(self, session, layer, num_experts, hidden_size):
        super().__init__()
        self.session, self.layer = session, layer
        self.num_experts, self.hidden_size = num_experts, hidden_size
        self.host_only = session.backend == "cpu"

    def forward(self, hidden_states, *args, **kwargs):
        picked = _pick_routing(tuple(args) + tuple(kwargs.values()), self.num_experts)
        if picked is None:
            raise Error(_ffi.FT_ERR_INVALID_ARGUMENT, "FreeTokenExperts: no expert ids among the arguments")
        ids, weights, _ = picked
        return self.run(hidden_states, ids, weights)

    def run(self, hidden_states, ids, weights):
        shape, dtype = hidden_states.shape, hidden_states.dtype
        x = hidden_states.reshape(-1, self.hidden_size).to(torch.bfloat16).contiguous()
        ids = ids.reshape(x.shape[0], -1).to(torch.int32).contiguous()
        weights = weights.reshape(x.shape[0], -1).to(torch.float32).contiguous()
        if x.is_cuda and self.host_only:
            # a cpu session under a CUDA model: through host memory (synchronises; not capturable)
            out = self.run(hidden_states.cpu(), ids.cpu(), weights.cpu())
            return out.to(hidden_states.device)
        out = torch.empty_like(x)
        if x.shape[0]:
            self.session.decode(self.layer, x, ids, weights, out=out)
        return out.to(dtype).reshape(shape)

    def extra_repr(self):
        return "layer=%d, num_experts=%d, backend=%s" % (self.layer, self.num_experts, self.session.backend)


def _routing_by_rule(logits, info, bias, session=None, layer=0):
    """The model's routing rule (ft_model_info) applied in torch, for routers that return only logits;
    rules without a torch form here go through ft_route on host logits (not capturable)."""
    rule, K = info["routing"], info["top_k"]
    lg = logits.float()
    if rule in (_ffi.FT_ROUTING_SOFTMAX_TOPK, _ffi.FT_ROUTING_SOFTMAX_TOPK_RENORM):
        w, ids = torch.topk(F.softmax(lg, dim=-1), K, dim=-1)
        if rule == _ffi.FT_ROUTING_SOFTMAX_TOPK_RENORM:
            w = w / w.sum(dim=-1, keepdim=True)
        return ids, w
    if rule == _ffi.FT_ROUTING_TOPK_SOFTMAX:
        if bias is not None:
            lg = lg + bias
        vals, ids = torch.topk(lg, K, dim=-1)
        return ids, F.softmax(vals, dim=-1)
    if rule == _ffi.FT_ROUTING_TOPK_SIGMOID:  # Llama-4: the weight scales the expert input in ft_decode
        vals, ids = torch.topk(lg, K, dim=-1)
        return ids, torch.sigmoid(vals)
    if rule == _ffi.FT_ROUTING_SIGMOID_GROUP_TOPK:
        scores = torch.sigmoid(lg)
        sel = scores + (bias if bias is not None else 0)
        G, TG, E = info["num_groups"], info["topk_groups"], lg.shape[-1]
        if G > 1:
            grouped = sel.view(-1, G, E // G)
            group_scores = grouped.topk(min(2, E // G), dim=-1)[0].sum(dim=-1)
            keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(TG, dim=-1)[1], 1.0)
            sel = sel.masked_fill(~keep.bool().unsqueeze(-1).expand_as(grouped).reshape_as(sel), float("-inf"))
        ids = torch.topk(sel, K, dim=-1)[1]
        w = scores.gather(1, ids)
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)  # DeepSeek-V3 / GLM-4.x default norm_topk_prob
        return ids, w * info["routed_scaling_factor"]
    if session is None:
        raise Error(_ffi.FT_ERR_UNSUPPORTED, "routing rule %d has no torch form; use router='freetoken'" % rule)
    ids, w = session.route(layer, lg.detach().cpu().contiguous())
    return ids.to(logits.device), w.to(logits.device)


def _moe_forward(block, hidden_states):
    """Replacement forward of a block whose experts FreeToken cannot take as one call (see the module
    docstring)."""
    st = block._freetoken
    if st["returns_tuple"] is None:
        st["returns_tuple"] = _probe_returns_tuple(block, hidden_states)
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    ids, weights, logits = _route(block, x)
    out = st["experts"].run(x, ids, weights)
    for name in ("shared_experts", "shared_mlp"):
        shared = getattr(block, name, None)
        if isinstance(shared, nn.Module) and not isinstance(shared, _Zero):
            out = out + _first_tensor(shared(x))
    single = getattr(block, "shared_expert", None)
    if isinstance(single, nn.Module) and not isinstance(single, _Zero):
        s = _first_tensor(single(x))
        gate = getattr(block, "shared_expert_gate", None)
        if gate is not None:
            s = torch.sigmoid(gate(x)) * s
        out = out + s
    out = out.reshape(shape)
    if st["returns_tuple"]:
        if logits is None:
            logits = _router_logits(block, x)
        return out, logits
    return out


def _first_tensor(result):
    return result[0] if isinstance(result, (tuple, list)) else result


def _router_module(block):
    for name in ("gate", "router"):
        m = getattr(block, name, None)
        if isinstance(m, nn.Module):
            return m
    return None


def _router_linear(router):
    """The linear layer of a router module: the module itself (nn.Linear or a module with `weight`), or
    its `layer` (GraniteMoe/JetMoe), `wg` (HunYuan), `linear` or only nn.Linear child; None if none."""
    if router is None:
        return None
    if isinstance(getattr(router, "weight", None), torch.Tensor):
        return router
    for name in ("layer", "wg", "linear", "classifier"):
        m = getattr(router, name, None)
        if isinstance(getattr(m, "weight", None), torch.Tensor):
            return m
    linears = [m for m in router.children() if isinstance(m, nn.Linear)]
    return linears[0] if len(linears) == 1 else None


def _router_logits(block, x):
    lin = _router_linear(_router_module(block))
    if lin is None:
        raise Error(_ffi.FT_ERR_UNSUPPORTED, "%s: no router linear layer to read the logits from"
                    % type(block).__name__)
    bias = getattr(lin, "bias", None)
    return F.linear(x, lin.weight, bias if isinstance(bias, torch.Tensor) else None)


def _routes_of(result, tokens, num_experts):
    """(ids, weights, logits) when the router's output holds per-token ids [T, K], else None."""
    tensors = [t for t in (result if isinstance(result, (tuple, list)) else (result,)) if isinstance(t, torch.Tensor)]
    if not any(t.dtype in _ID_DTYPES and t.dim() >= 2 and t.numel() % tokens == 0 and
               t.reshape(tokens, -1).shape[1] <= num_experts for t in tensors):
        return None
    return _pick_routing(result, num_experts)


def _route(block, x):
    """(ids, weights, logits or None) by the block's own router, or ft_route with router='freetoken'."""
    st = block._freetoken
    session, layer = st["experts"].session, st["experts"].layer
    if st["router"] == "freetoken":
        logits = _router_logits(block, x)
        ids, w = session.route(layer, logits.detach().float().cpu().contiguous())
        return ids.to(x.device), w.to(x.device), logits
    gate = _router_module(block)
    result = gate(x)
    picked = _routes_of(result, x.shape[0], st["num_experts"])
    if picked is not None:
        return picked
    if isinstance(result, torch.Tensor):
        logits = result
        if hasattr(block, "route_tokens_to_experts"):
            picked = _pick_routing(block.route_tokens_to_experts(logits), st["num_experts"])
            if picked is not None:
                return picked[0], picked[1], logits
    else:
        # A tuple without per-token ids (Llama-4's dense scores, GraniteMoe's expert-sorted lists):
        # the logits from the router's own linear layer, then the model's rule.
        logits = _router_logits(block, x)
    # A correction bias the rule adds to the scores, on the router (DeepSeek-V3) or the block
    # (MiniMax-M2); gpt-oss routers have none here, their bias is inside the linear layer and so
    # already in `logits`.
    bias = getattr(gate, "e_score_correction_bias", None)
    if not isinstance(bias, torch.Tensor):
        bias = getattr(block, "e_score_correction_bias", None)
    bias = bias if isinstance(bias, torch.Tensor) else None
    ids, w = _routing_by_rule(logits, st["info"], bias.float() if bias is not None else None, session, layer)
    return ids, w, logits


class _ZeroParallel(nn.Module):
    """Stands for GraniteMoe parallel experts while probing: (inputs, expert_size) -> zeros [N, width]."""

    def __init__(self, width):
        super().__init__()
        self.width = width

    def forward(self, inputs, *args, **kwargs):
        return inputs.new_zeros(inputs.shape[0], self.width)


def _probe_returns_tuple(block, hidden_states):
    """Whether the block's original forward returns a tuple: run it once on one token with experts that
    return zeros (no expert weights needed)."""
    st = block._freetoken
    E = st["num_experts"]

    class ZeroExperts(nn.ModuleList):
        def forward(self, x, *args, **kwargs):
            return torch.zeros_like(x)

    if st["kind"] == "parallel":
        I, H = st["info"]["intermediate_size"], st["info"]["hidden_size"]
        swap = {"input_linear": _ZeroParallel(2 * I), "output_linear": _ZeroParallel(H)}
    else:
        swap = {"experts": ZeroExperts([_Zero() for _ in range(E)])}
    saved = {name: getattr(block, name) for name in swap}
    try:
        for name, m in swap.items():
            setattr(block, name, m)
        with torch.no_grad():
            probe = hidden_states.reshape(-1, hidden_states.shape[-1])[:1].reshape(1, 1, -1)
            result = st["original_forward"](probe)
        return isinstance(result, tuple)
    except Exception:
        return False
    finally:
        for name, m in saved.items():
            setattr(block, name, m)


def _fused_call(experts):
    """True if the experts module is called as one with the routes, experts(hidden, ids, weights):
    a forward of its own that takes more than the hidden states."""
    if isinstance(experts, (FreeTokenExperts, nn.ModuleList)):
        return False
    fwd = getattr(type(experts), "forward", None)
    if fwd is None or fwd is nn.Module.forward:
        return False
    try:
        params = list(inspect.signature(fwd).parameters.values())[1:]  # without self
    except (TypeError, ValueError):
        return True
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return True
    return len(params) >= 3


def _block_kind(block):
    """'fused', 'loop' (ModuleList experts or experts called with the hidden states alone) or
    'parallel' (GraniteMoe/JetMoe input_linear/output_linear)."""
    experts = getattr(block, "experts", None)
    if isinstance(experts, nn.Module):
        return "fused" if _fused_call(experts) else "loop"
    return "parallel"


def _num_experts(block):
    experts = getattr(block, "experts", None)
    if experts is None:
        experts = getattr(block, "input_linear", None)
    for attr in ("num_experts", "num_local_experts", "n_routed_experts"):
        n = getattr(experts, attr, None)
        if isinstance(n, int):
            return n
    if isinstance(experts, nn.ModuleList):
        return len(experts)
    for name in ("gate_up_proj", "gate_up_proj_blocks", "weight"):
        p = getattr(experts, name, None)
        if isinstance(p, torch.Tensor):
            return int(p.shape[0])
    return None


def _is_moe_block(module):
    experts = getattr(module, "experts", None)
    if isinstance(experts, nn.Module) and not isinstance(experts, FreeTokenExperts) and _fused_call(experts):
        return True  # the block routes by itself, whatever its router is called
    if _router_module(module) is None:
        return False
    if isinstance(experts, nn.Module):
        return True
    return isinstance(getattr(module, "input_linear", None), nn.Module) and \
        isinstance(getattr(module, "output_linear", None), nn.Module)


def find_moe_blocks(model):
    """[(checkpoint layer index, name, block)] of every module with routed experts called with the
    routes (`experts(x, ids, weights)`), or with a router (`gate`/`router`) and routed experts
    (`experts`, or `input_linear` + `output_linear`)."""
    found = []
    for name, module in model.named_modules():
        if not _is_moe_block(module):
            continue
        m = _LAYER_RE.search(name)
        if m is None:
            raise Error(_ffi.FT_ERR_UNSUPPORTED, "MoE block '%s' is not under a 'layers.N' module; cannot tell "
                        "its checkpoint layer" % name)
        found.append((int(m.group(1)), name, module))
    return found


def _model_device(blocks, device):
    if device is not None:
        return torch.device(device)
    for _, _, block in blocks:  # the router's weight, else any of the block's tensors
        lin = _router_linear(_router_module(block))
        tensors = [getattr(lin, "weight", None)] + list(block.parameters()) + list(block.buffers())
        for w in tensors:
            if isinstance(w, torch.Tensor) and w.device.type != "meta":
                return w.device
    raise Error(_ffi.FT_ERR_INVALID_ARGUMENT, "the MoE blocks are on the meta device: pass device=")


class Offload:
    """What offload_experts() installed: the engine, model and session (closed together by close()),
    the replaced blocks, and the session's statistics."""

    def __init__(self, engine, ft_model, session, blocks, own_engine=True, own_model=True):
        self.engine, self.ft_model, self.session, self.blocks = engine, ft_model, session, blocks
        self._own_engine, self._own_model = own_engine, own_model

    @property
    def backend(self):
        return self.session.backend

    def stats(self):
        return self.session.stats()

    def close(self):
        """Frees the session and the model (and the engine when offload_experts made it)."""
        self.session.close()
        if self._own_model:
            self.ft_model.close()
        if self._own_engine:
            self.engine.close()

    def __repr__(self):
        return "Offload(%d MoE layers, backend=%s)" % (len(self.blocks), self.session.backend)


def offload_experts(model, checkpoint, backend="auto", cache_fraction=0.0, max_tokens=256, router="model",
                    shared_experts="model", device=None, cpu_threads=0, engine=None, progress=None,
                    **session_fields):
    """Replaces the routed experts of every MoE block of `model` by FreeToken (see the module docstring).

    checkpoint: the Hugging Face directory (or GGUF file) the experts are loaded from with ft_model_load,
        or a freetoken.Model already built (ft_model_create + set_expert; its MoE layer i is the
        model's decoder layer i); that model and its engine stay the caller's.
    backend: 'auto', 'cpu', 'gpu', 'offload' or 'hybrid' (GPU backends need a CUDA model; a cpu
        session under a CUDA model copies each call through host memory).
    cache_fraction: share of all experts the GPU slot cache holds (offload/hybrid; 0: from free memory).
    max_tokens: the session's largest call; longer calls are split.
    router: 'model' (the block's own router) or 'freetoken' (ft_route on host logits; not capturable).
    shared_experts: 'model' (the block's own shared expert modules) or 'freetoken' (the session adds them).
    device: the model's device when its routers are still on the meta device.
    engine: an Engine to use (default: a new one on the model's device, no GPU for CPU models).
    Other ft_session_params fields (prefill_min_tokens, hybrid_fraction, vram_reserve_bytes, ...) as
    keywords. Returns an Offload; the model keeps it as model.freetoken_offload."""
    if router not in ("model", "freetoken"):
        raise ValueError("router must be 'model' or 'freetoken', not %r" % (router,))
    if shared_experts not in ("model", "freetoken"):
        raise ValueError("shared_experts must be 'model' or 'freetoken', not %r" % (shared_experts,))
    blocks = find_moe_blocks(model)
    if not blocks:
        raise Error(_ffi.FT_ERR_UNSUPPORTED, "no MoE block (a module with a `gate`/`router` and `experts` or "
                    "`input_linear`/`output_linear`) found in %s" % type(model).__name__)
    for _, name, block in blocks:
        _check_block(name, block, router)
    dev = _model_device(blocks, device)
    prebuilt = isinstance(checkpoint, Model)
    if prebuilt:
        engine = checkpoint._parent
    own_engine = engine is None
    if own_engine:
        engine = Engine(device=dev.index if dev.type == "cuda" and dev.index is not None else
                        (torch.cuda.current_device() if dev.type == "cuda" else _ffi.FT_DEVICE_NONE),
                        cpu_threads=cpu_threads)
    try:
        ft_model = checkpoint if prebuilt else Model.load(engine, checkpoint, progress=progress)
        info = ft_model.info()
        if shared_experts == "freetoken" and info["shared_intermediate_size"] == 0:
            raise Error(_ffi.FT_ERR_UNSUPPORTED, "shared_experts='freetoken': the checkpoint's model has no "
                        "shared expert")
        session = Session(ft_model, backend=backend, max_tokens=max_tokens, cache_fraction=cache_fraction,
                          shared_experts=shared_experts == "freetoken", **session_fields)
        if dev.type == "cpu" and session.backend != "cpu":
            raise Error(_ffi.FT_ERR_UNSUPPORTED, "the model is on the CPU; backend %r needs a CUDA model"
                        % session.backend)
        installed = []
        for model_layer, name, block in blocks:
            layer = ft_model.moe_layer(model_layer)
            if layer < 0:
                raise Error(_ffi.FT_ERR_FORMAT, "'%s': checkpoint layer %d has no routed experts in %s"
                            % (name, model_layer, checkpoint))
            n = _num_experts(block)
            if n is not None and n != info["num_experts"]:
                raise Error(_ffi.FT_ERR_FORMAT, "'%s' has %d experts, the checkpoint %d" % (name, n,
                                                                                            info["num_experts"]))
            installed.append((layer, name, block))
        if len(installed) != info["num_layers"]:
            raise Error(_ffi.FT_ERR_FORMAT, "the model has %d MoE blocks, the checkpoint %d MoE layers"
                        % (len(installed), info["num_layers"]))
        for layer, name, block in installed:
            _install(block, session, layer, info, router, shared_experts, _parent(model, name))
    except BaseException:
        if own_engine:
            engine.close()
        raise
    offload = Offload(engine, ft_model, session, [n for _, n, _ in installed], own_engine, not prebuilt)
    model.freetoken_offload = offload
    return offload


def _parent(model, name):
    return model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model


def _check_block(name, block, router):
    """Raises FT_ERR_UNSUPPORTED for a block whose routes cannot be read: one whose forward must be
    replaced (not 'fused', or router='freetoken') while its router has no linear layer to take the
    logits from."""
    fused = _block_kind(block) == "fused"
    if (not fused or router == "freetoken") and _router_linear(_router_module(block)) is None:
        why = "its experts are not called with the routes" if not fused else "router='freetoken' needs the logits"
        raise Error(_ffi.FT_ERR_UNSUPPORTED, "MoE block '%s' (%s): %s and its router %s has no linear layer to "
                    "read them from" % (name, type(block).__name__, why, type(_router_module(block)).__name__))


_SHARED_NAMES = ("shared_experts", "shared_expert", "shared_mlp")


def _install(block, session, layer, info, router, shared_experts, parent):
    kind = _block_kind(block)
    experts = FreeTokenExperts(session, layer, info["num_experts"], info["hidden_size"])
    if shared_experts == "freetoken":
        # the block's shared experts, and those its decoder layer adds beside it (GraniteMoeShared)
        for owner in (block, parent):
            for attr in _SHARED_NAMES:
                m = getattr(owner, attr, None)
                if isinstance(m, nn.Module) and m is not block:
                    setattr(owner, attr, _Zero())
    block._freetoken = dict(experts=experts, layer=layer, num_experts=info["num_experts"], info=info,
                            router=router, kind=kind, returns_tuple=None, original_forward=block.forward)
    if kind == "parallel":
        block.input_linear = _ZeroParallel(2 * info["intermediate_size"])  # drops the expert parameters
        block.output_linear = _ZeroParallel(info["hidden_size"])
    block.experts = experts  # drops the block's own expert parameters
    if kind != "fused" or router != "model":
        block.forward = types.MethodType(_moe_forward, block)


# ---- building a transformers model without its expert weights ------------------------------------

@contextlib.contextmanager
def _parameters_on_meta():
    """Parameters registered meanwhile go to the meta device (no memory); buffers stay real."""
    original = nn.Module.register_parameter

    def register(module, name, param):
        original(module, name, param)
        p = module._parameters.get(name)
        if p is not None and p.device.type != "meta":
            module._parameters[name] = nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)
    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


_EXPERT_KEY = re.compile(r"\.experts\.")
# Checkpoint tensors FreeToken reads as experts although their name has no ".experts." (GraniteMoe's
# parallel experts); left out of the list of unmatched checkpoint names.
_EXPERT_LIKE_KEY = re.compile(r"\.experts\.|\.block_sparse_moe\.(input|output)_linear\.weight$")

# Renames tried when transformers' own mapping gives no parameter name: checkpoint spelling ->
# model spelling, applied alone or two together (PhiMoE: block_sparse_moe.gate -> mlp.router).
_RENAMES = (("block_sparse_moe.", "mlp."), ("mlp.", "block_sparse_moe."),
            ("model.language_model.", "model."), ("language_model.model.", "model."),
            ("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
            ("vision_model.", "model.vision_model."), ("multi_modal_projector.", "model.multi_modal_projector."),
            (".router.layer.", ".router."),  # GraniteMoe (transformers >= 5: the router holds the weight)
            (".gate.weight", ".router.weight"),  # PhiMoE (transformers >= 5)
            ("mlp.moe_statics.", "mlp.gate.moe_statics."))  # ERNIE-4.5 MoE (transformers >= 5)


def _transformers_renamings(model):
    """[(kind, rename)]: transformers' own checkpoint-key renaming for `model` (its conversion
    mapping, transformers >= 5), as functions name -> (new name, matched). kind: 'rename' for a
    renaming (transformers applies every one that matches, in order), 'converter' for a weight
    converter that only renames and 'convert' for one that transforms the tensor too (concatenates,
    transposes, splits); transformers applies the first converter that matches, after the renamings.
    Without transformers or that machinery: the model's class attribute
    `_checkpoint_conversion_mapping` (regex -> replacement, transformers 4.x); else []."""
    out = []
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        transforms = list(get_model_conversion_mapping(model) or ())
    except Exception:  # noqa: BLE001 - no transformers, an older one, or a model it does not know
        transforms = None
    if transforms:
        for t in transforms:
            rename = getattr(t, "rename_source_key", None)
            if not callable(rename):
                continue
            if "Converter" in type(t).__name__:
                kind = "convert" if getattr(t, "operations", None) else "converter"
            else:
                kind = "rename"

            def apply(name, rename=rename):
                try:
                    new, matched = rename(name)
                except Exception:  # noqa: BLE001 - a transform that cannot handle this key
                    return name, False
                return new, matched is not None
            out.append((kind, apply))
        if out:
            return out
    mapping = getattr(type(model), "_checkpoint_conversion_mapping", None)
    if isinstance(mapping, dict):
        for pattern, replacement in mapping.items():
            def apply(name, pattern=pattern, replacement=replacement):
                new, n = re.subn(pattern, replacement, name)
                return new, n > 0
            out.append(("rename", apply))
    return out


class _CheckpointKeys:
    """Which model parameter or buffer a checkpoint tensor fills: the same name, else the name
    transformers gives it on load (its renamings, then its first matching converter), else
    the name with the model's base_model_prefix added or removed, and after one or two of _RENAMES."""

    def __init__(self, model):
        self.renamings = _transformers_renamings(model)
        self.needs_conversion = {}  # checkpoint name -> model name a transformers conversion gives it
        prefix = getattr(model, "base_model_prefix", "")
        self.prefix = prefix + "." if isinstance(prefix, str) and prefix else ""

    def transformers_name(self, name):
        """(name after transformers' renamings and first matching converter, True when that
        converter transforms the tensor)."""
        for kind, apply in self.renamings:
            if kind == "rename":
                name, _ = apply(name)
        for kind, apply in self.renamings:
            if kind != "rename":
                new, matched = apply(name)
                if matched:
                    return new, kind == "convert"
        return name, False

    def target(self, name, targets):
        if name in targets:
            return name
        renamed, converted = self.transformers_name(name)
        if renamed in targets:
            if converted:  # the tensor itself differs from the parameter (fused, transposed)
                self.needs_conversion[name] = renamed
                return None
            return renamed
        bases = [name, renamed]
        if self.prefix:  # a checkpoint of the base model read into a model with a head, and back
            bases += [n[len(self.prefix):] if n.startswith(self.prefix) else self.prefix + n for n in bases]
        for base in dict.fromkeys(bases):
            if base in targets:
                return base
            for a, b in _RENAMES:
                once = base.replace(a, b)
                if once == base:
                    continue
                if once in targets:
                    return once
                for c, d in _RENAMES:
                    twice = once.replace(c, d)
                    if twice != once and twice in targets:
                        return twice
        return None


@functools.lru_cache(maxsize=1)
def _e4m3_values():
    """The float32 value of each of the 256 FP8 E4M3 (fn) bytes: bias 7, subnormals below 2^-6,
    S.1111.111 NaN, no infinities."""
    values = []
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        v = float("nan") if e == 15 and m == 7 else (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
        values.append(-v if b & 128 else v)
    return torch.tensor(values, dtype=torch.float32)


def _fp8_block(checkpoint):
    """(rows, cols) of the blocks FP8 weights share a scale over: config.json's
    quantization_config.weight_block_size, else (128, 128) as DeepSeek-V3 and Kimi-K2 store them."""
    try:
        with open(os.path.join(checkpoint, "config.json")) as f:
            quant = json.load(f).get("quantization_config") or {}
        rows, cols = quant["weight_block_size"]
        if int(rows) > 0 and int(cols) > 0:
            return int(rows), int(cols)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return 128, 128


def _dequant_fp8_block(weight, scale_inv, block, dtype, what):
    """weight (uint8 bytes of E4M3, [N, K]) times its block's scale_inv ([ceil(N/rows), ceil(K/cols)]),
    in `dtype`, one band of rows at a time."""
    rows, cols = block
    if weight.dim() != 2:
        raise Error(_ffi.FT_ERR_UNSUPPORTED, "%s is F8_E4M3 with %d dimensions; from_pretrained dequantises "
                    "2-D FP8 weights with block scales" % (what, weight.dim()))
    N, K = weight.shape
    want = [-(-N // rows), -(-K // cols)]
    if list(scale_inv.shape) != want:
        raise Error(_ffi.FT_ERR_FORMAT, "%s: weight %s with %dx%d blocks needs a scale_inv of shape %s, found %s" % (
            what, [N, K], rows, cols, want, list(scale_inv.shape)))
    table = _e4m3_values()
    scale = scale_inv.float().repeat_interleave(cols, dim=1)[:, :K]
    out = torch.empty(N, K, dtype=dtype)
    for band in range(want[0]):
        r0, r1 = band * rows, min(N, band * rows + rows)
        out[r0:r1] = (table[weight[r0:r1].long()] * scale[band]).to(dtype)
    return out


def load_non_expert_weights(model, checkpoint, device):
    """Materialises every parameter still on the meta device on `device` and fills it, and every
    persistent buffer the checkpoint holds, from the checkpoint's tensors (expert tensors skipped),
    keeping tied parameters tied. Checkpoint names are matched to the model's by transformers' own
    key renaming where it has one (_CheckpointKeys). FP8 (E4M3) weights with a block `*_scale_inv`
    (DeepSeek-V3, Kimi-K2, the "-FP8" releases) are dequantised to the parameter's dtype. Raises Error
    naming any parameter left unloaded and the checkpoint tensors no parameter took."""
    replaced = {}
    for module in model.modules():
        for pname, p in list(module._parameters.items()):
            if p is not None and p.device.type == "meta":
                if id(p) not in replaced:
                    replaced[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device),
                                                   requires_grad=False)
                module._parameters[pname] = replaced[id(p)]
    targets = {}  # every name a parameter or buffer is reachable by (tied ones more than once)
    for mname, module in model.named_modules(remove_duplicate=False):
        prefix = mname + "." if mname else ""
        for pname, p in module._parameters.items():
            if p is not None:
                targets[prefix + pname] = p
        for bname, b in module._buffers.items():
            if b is not None and bname not in getattr(module, "_non_persistent_buffers_set", ()):
                targets[prefix + bname] = b
    keys = _CheckpointKeys(model)
    headers = [(path, read_header(path)[0]) for path in checkpoint_files(checkpoint)]
    file_of = {name: path for path, header in headers for name in header}
    # the block scales of FP8 weights: read with their weight, not matched to a parameter themselves
    scales = {name + "_scale_inv" for path, header in headers for name, meta in header.items()
              if meta["dtype"] == "F8_E4M3" and name + "_scale_inv" in file_of}
    block = _fp8_block(checkpoint) if scales else None
    loaded, unmatched = set(), []
    for path, header in headers:
        wanted = {}
        for name, meta in header.items():
            if _EXPERT_KEY.search(name) or name in scales:
                continue
            target = keys.target(name, targets)
            if target is None:
                if not _EXPERT_LIKE_KEY.search(name):
                    unmatched.append(name)
                continue
            if meta["dtype"].startswith("F8") and not (meta["dtype"] == "F8_E4M3" and name + "_scale_inv" in scales):
                raise Error(_ffi.FT_ERR_UNSUPPORTED, "%s: non-expert tensor '%s' is %s without a block scale "
                            "'%s_scale_inv'; from_pretrained loads bf16/f16/f32 non-expert weights and FP8 E4M3 "
                            "ones with block scales" % (path, name, meta["dtype"], name))
            wanted[name] = target
        # this file's FP8 weights' scales, one read per file that holds them
        needed = {name + "_scale_inv" for name in wanted if header[name]["dtype"] == "F8_E4M3"}
        scale_of = {}
        for f in sorted({file_of[n] for n in needed}):
            scale_of.update(load_torch(f, names=needed))
        for name, t in load_torch(path, names=set(wanted)).items():
            p = targets[wanted[name]]
            if header[name]["dtype"] == "F8_E4M3":
                t = _dequant_fp8_block(t, scale_of[name + "_scale_inv"], block, p.dtype, "%s: '%s'" % (path, name))
            if tuple(p.shape) != tuple(t.shape):
                raise Error(_ffi.FT_ERR_FORMAT, "%s: tensor '%s' has shape %s, the model's '%s' %s" % (
                    path, name, list(t.shape), wanted[name], list(p.shape)))
            with torch.no_grad():
                p.copy_(t.to(dtype=p.dtype))
            loaded.add(id(p))
    new = {id(v) for v in replaced.values()}
    missing = sorted({n for n, p in targets.items() if id(p) in new and id(p) not in loaded})
    if missing:
        how = ("transformers' checkpoint conversion mapping of %s and freetoken's own renames"
               % type(model).__name__ if keys.renamings else "freetoken's own renames (transformers has no "
               "checkpoint conversion mapping for %s here)" % type(model).__name__)
        text = "%s: no tensor for %d parameter(s): %s" % (
            checkpoint, len(missing), ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else ""))
        converted = sorted(n for n in keys.needs_conversion if keys.needs_conversion[n] in missing)
        if converted:
            text += "; transformers converts (not only renames) %s into them, which from_pretrained does " \
                    "not do" % ", ".join(converted[:4])
        text += "; checkpoint tensors that matched no parameter by %s: %s" % (
            how, ", ".join(sorted(unmatched)[:8]) + (" ..." if len(unmatched) > 8 else "") if unmatched else "none")
        raise Error(_ffi.FT_ERR_FORMAT, text)


def _fix_meta_buffers(model, device):
    for module in model.modules():
        for bname, b in list(module._buffers.items()):
            if b is None or b.device.type != "meta":
                continue
            if bname in ("inv_freq", "original_inv_freq") and hasattr(module, "rope_init_fn"):
                inv_freq, scaling = module.rope_init_fn(module.config, device)
                module._buffers["inv_freq"] = inv_freq
                if "original_inv_freq" in module._buffers or hasattr(module, "original_inv_freq"):
                    module.original_inv_freq = inv_freq
                module.attention_scaling = scaling
                continue
            raise Error(_ffi.FT_ERR_UNSUPPORTED, "buffer '%s' of %s was created on the meta device and "
                        "cannot be rebuilt" % (bname, type(module).__name__))


def _keep_in_fp32(model, dtype):
    """A regex of the parameter names transformers keeps in float32 when loading in `dtype`: the
    `_keep_in_fp32_modules_strict` of the model and its submodels for fp16 and bf16, their
    `_keep_in_fp32_modules` for fp16 only; None if none."""
    names = []
    for module in model.modules():
        strict = getattr(module, "_keep_in_fp32_modules_strict", None)
        loose = getattr(module, "_keep_in_fp32_modules", None)
        if strict and dtype in (torch.float16, torch.bfloat16):
            names += list(strict)
        if loose and dtype == torch.float16:
            names += list(loose)
    names = sorted(set(n for n in names if isinstance(n, str) and n))
    if not names:
        return None
    return re.compile("|".join(r"(^|\.)%s($|\.)" % re.escape(n) for n in names))


def _config_of(checkpoint, trust_remote_code):
    """transformers' config of a checkpoint directory. A model_type transformers does not know
    (Kimi-K2's kimi_k2, whose release ships remote code for DeepSeek-V3's classes) is built, without
    remote code, by the config class of the first class config.json's "architectures" names that
    this transformers has."""
    import transformers
    try:
        return transformers.AutoConfig.from_pretrained(checkpoint, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError) as e:
        if trust_remote_code:
            raise
        why = e
    try:
        with open(os.path.join(checkpoint, "config.json")) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        raise why
    names = raw.get("architectures") or []
    known = [getattr(transformers, n) for n in names if hasattr(transformers, n)]
    if not known:
        raise Error(_ffi.FT_ERR_UNSUPPORTED, "%s: transformers does not know model_type '%s' and has none of "
                    "the classes config.json's architectures names (%s); pass config= (a transformers config) "
                    "or trust_remote_code=True" % (checkpoint, raw.get("model_type"), ", ".join(names) or "none"))
    raw.pop("auto_map", None)  # remote code is not used
    raw.pop("model_type", None)
    return known[0].config_class.from_dict(raw)


def from_pretrained(checkpoint, backend="auto", device=None, dtype=None, model_class=None, config=None,
                    trust_remote_code=False, attn_implementation=None, **offload_kwargs):
    """A transformers model of `checkpoint` whose routed experts run in FreeToken: built with its
    parameters on the meta device, experts replaced (offload_experts), then only the non-expert weights
    read from the checkpoint onto `device` (default cuda when available, else cpu). dtype: default
    torch.bfloat16 (parameters the model keeps in float32 for transformers stay float32). Checkpoint
    names are matched to the model's as transformers' own loading does (load_non_expert_weights).
    model_class: an Auto class (default AutoModelForCausalLM) or a model class (e.g. a
    multimodal ...ForConditionalGeneration). attn_implementation: passed to the model's construction
    ("eager", "sdpa", ...; default transformers' choice). Other keywords go to offload_experts()."""
    import transformers
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = dtype or torch.bfloat16
    if config is None:
        config = _config_of(checkpoint, trust_remote_code)
    # FreeToken reads the quantised experts (gpt-oss MXFP4, FP8 blocks) and load_non_expert_weights
    # dequantises FP8 non-expert weights, so the model is built unquantised.
    if getattr(config, "quantization_config", None) is not None:
        config.quantization_config = None
        try:
            delattr(config, "quantization_config")
        except AttributeError:
            pass
    cls = model_class or transformers.AutoModelForCausalLM
    # Auto classes build with from_config, model classes with _from_config
    build = cls.from_config if hasattr(cls, "from_config") else cls._from_config
    extra = {"trust_remote_code": trust_remote_code} if hasattr(cls, "from_config") else {}
    if attn_implementation is not None:
        extra["attn_implementation"] = attn_implementation
    with _parameters_on_meta():
        try:
            model = build(config, dtype=dtype, **extra)
        except TypeError:  # transformers 4.x names it torch_dtype
            model = build(config, torch_dtype=dtype, **extra)
    # floating parameters in `dtype` whatever the build made of them (tied ones kept tied), except
    # those the model keeps in float32 as transformers' from_pretrained does (ERNIE-4.5's correction
    # bias and router weight)
    keep_fp32 = _keep_in_fp32(model, dtype)
    cast = {}
    for mname, module in model.named_modules(remove_duplicate=False):
        for pname, p in list(module._parameters.items()):
            if p is None or not p.is_floating_point():
                continue
            want = torch.float32 if keep_fp32 is not None and keep_fp32.search(
                (mname + "." if mname else "") + pname) else dtype
            if p.dtype != want:
                if id(p) not in cast:
                    cast[id(p)] = nn.Parameter(p.to(want), requires_grad=p.requires_grad)
                module._parameters[pname] = cast[id(p)]
    model.eval()
    if device.type == "cpu" and backend == "auto":
        backend = "cpu"
    offload_experts(model, checkpoint, backend=backend, device=device, **offload_kwargs)
    load_non_expert_weights(model, checkpoint, device)
    for module in model.modules():  # buffers (rotary tables, ...) to the device
        for bname, b in list(module._buffers.items()):
            if b is not None and b.device.type != "meta":
                module._buffers[bname] = b.to(device)
        if isinstance(getattr(module, "original_inv_freq", None), torch.Tensor):
            module.original_inv_freq = module.original_inv_freq.to(device)
    _fix_meta_buffers(model, device)
    return model
