#!/usr/bin/env python3
"""Golden data for FreeToken's architecture tests, produced by transformers itself.

    python3 tools/golden/make_golden.py OUTDIR [case ...]   (no case: every case below + discovered ones)
    python3 tools/golden/make_golden.py --list              (the cases and what transformers has)

Per case it builds a tiny random model from the transformers config class, re-draws every
parameter and persistent float buffer with a seeded generator (norm weights near 1, biases and
correction biases non-zero, every value rounded to a bf16-representable float32 so that a bf16
checkpoint holds exactly the values the float32 reference uses), saves it with
`save_pretrained` into OUTDIR/<case>/, then calls the sparse-MoE module of every MoE decoder layer
on a few tokens of random hidden states in float32 and records:

  golden.json           manifest (versions, geometry, per-layer files, tensor names written)
  hidden.f32            [T, H] input hidden states, raw little-endian float32
  layer<L>.out.f32      [T, H] the MoE module's output for checkpoint layer L
  layer<L>.ids.i32      [T, K] expert ids chosen by transformers' router, little-endian int32
  layer<L>.weights.f32  [T, K] the routing weights transformers passes to its experts

Routes come from transformers' own code: a forward pre-hook on the block's `experts` module
captures the (top_k_index, top_k_weights) it is called with; where the experts take no ids
(Llama-4, JetMoE/Granite scatter experts) the router module's output is decoded instead.
Every case is wrapped: a failure prints the error and the next case runs; a summary ends the run.
"""

import argparse
import inspect
import json
import os
import shutil
import sys
import traceback
import zlib

MAX_DIR_BYTES = 150 * 1024
TOKENS = 6

# Common tiny geometry, applied to every config field of these names that the config class has.
# Sizes are tried in order until the saved directory fits MAX_DIR_BYTES.
SIZE_PRESETS = [
    dict(hidden=32, inter=16, layers=3),
    dict(hidden=32, inter=8, layers=3),
    dict(hidden=16, inter=8, layers=3),
    dict(hidden=16, inter=8, layers=2),
]


def base_overrides(p, num_experts=8, top_k=2):
    h, i, n = p["hidden"], p["inter"], p["layers"]
    return {
        "vocab_size": 32,
        "hidden_size": h,
        "intermediate_size": i,
        "moe_intermediate_size": i,
        "shared_expert_intermediate_size": i + 8,
        "shared_intermediate_size": i + 8,
        "num_hidden_layers": n,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": h // 2,
        "max_position_embeddings": 64,
        "max_window_layers": n,
        # expert count, all spellings
        "num_experts": num_experts,
        "num_local_experts": num_experts,
        "n_routed_experts": num_experts,
        "moe_num_experts": num_experts,
        # top-k, all spellings
        "num_experts_per_tok": top_k,
        "moe_topk": top_k,
        "moe_k": top_k,
        # MLA (DeepSeek-V2/V3 family)
        "kv_lora_rank": 16,
        "q_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 8,
        # linear attention / mamba parts of hybrid models, kept tiny
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
        "mamba_n_heads": 2,
        "mamba_d_head": h // 2,  # mamba_n_heads * mamba_d_head == mamba_expand * hidden_size
        "mamba_d_state": 8,
        "mamba_n_groups": 1,
        "mamba_expand": 1,
        "mamba_d_conv": 4,
        "tie_word_embeddings": False,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "use_cache": False,
        "output_router_logits": False,
    }


# case -> (model_type, extra overrides, options). Options: composite (try the multimodal model
# with a tiny vision tower first), top_k, num_experts.
CASES = {
    "qwen3_moe": ("qwen3_moe", {"norm_topk_prob": True}, {}),
    "qwen3_moe_nonorm": ("qwen3_moe", {"norm_topk_prob": False, "decoder_sparse_step": 1,
                                       "mlp_only_layers": [0]}, {}),
    "qwen2_moe": ("qwen2_moe", {"norm_topk_prob": False}, {}),
    "qwen3_next": ("qwen3_next", {"norm_topk_prob": True, "full_attention_interval": 2}, {}),
    "qwen3_5_moe": ("qwen3_5_moe", {}, {"composite": True}),
    "qwen3_vl_moe": ("qwen3_vl_moe", {}, {"composite": True}),
    "qwen3_omni_moe": ("qwen3_omni_moe", {}, {"composite": True}),
    "mixtral": ("mixtral", {}, {}),
    "minimax": ("minimax", {"block_size": 8}, {}),
    "minimax_m2": ("minimax_m2", {}, {}),
    "deepseek_v2": ("deepseek_v2", {"head_dim": 8, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
                                    "first_k_dense_replace": 1, "n_shared_experts": 2,
                                    "routed_scaling_factor": 1.0, "norm_topk_prob": False,
                                    "q_lora_rank": None}, {}),
    "deepseek_v2_group": ("deepseek_v2", {"head_dim": 8, "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
                                          "first_k_dense_replace": 1, "n_shared_experts": 1,
                                          "routed_scaling_factor": 2.0, "norm_topk_prob": False}, {}),
    "deepseek_v3": ("deepseek_v3", {"head_dim": 8, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
                                    "n_shared_experts": 1, "routed_scaling_factor": 2.5,
                                    "norm_topk_prob": True}, {}),
    "glm4_moe": ("glm4_moe", {"n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
                              "n_shared_experts": 1, "routed_scaling_factor": 1.5,
                              "norm_topk_prob": True, "partial_rotary_factor": 0.5}, {}),
    "glm4v_moe": ("glm4v_moe", {"first_k_dense_replace": 1, "n_shared_experts": 1}, {"composite": True}),
    "dots1": ("dots1", {"n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
                        "n_shared_experts": 1, "routed_scaling_factor": 2.0, "norm_topk_prob": True}, {}),
    "gpt_oss": ("gpt_oss", {"swiglu_limit": 1.5, "sliding_window": 8, "layer_types": None}, {}),
    "llama4": ("llama4", {"interleave_moe_layer_step": 1, "intermediate_size_mlp": 24,
                          "attention_chunk_size": 16}, {"composite": True, "top_k": 1}),
    "olmoe": ("olmoe", {"norm_topk_prob": False}, {}),
    "flex_olmo": ("flex_olmo", {}, {}),
    "granitemoe": ("granitemoe", {}, {}),
    "granitemoeshared": ("granitemoeshared", {}, {}),
    "granitemoehybrid": ("granitemoehybrid", {"layer_types": None}, {}),
    # PhiMoE keeps experts whose logit is within 2 * router_jitter_noise (relative) of the best
    # one in its softmax; 0.2 makes that mask keep several experts.
    "phimoe": ("phimoe", {"router_jitter_noise": 0.2, "input_jitter_noise": 0.0}, {}),
    "ernie4_5_moe": ("ernie4_5_moe", {"moe_layer_start_index": 1, "moe_layer_end_index": "last",
                                      "moe_layer_interval": 1, "moe_num_shared_experts": 1, "use_bias": False}, {}),
    # Hunyuan's top-k > 1 gating drops tokens beyond an expert capacity of top_k * T / E; top-1
    # keeps every token, so it is the case whose routes are fully defined.
    "hunyuan_v1_moe": ("hunyuan_v1_moe", {}, {"top_k": 1}),
    "hunyuan_v1_moe_top2": ("hunyuan_v1_moe", {}, {}),
    "jamba": ("jamba", {"expert_layer_period": 1, "expert_layer_offset": 0, "attn_layer_period": 2,
                        "attn_layer_offset": 1, "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 1,
                        "mamba_dt_rank": 4, "use_mamba_kernels": False}, {}),
}

# MoE model types whose experts are not gated MLPs of the kind FreeToken serves, or whose MoE
# block adds what FreeToken does not compute (dbrx: fused w1/v1/w2 experts with a p-norm
# renormalisation; jetmoe: a learned bias after the expert sum); discovery skips them.
NOT_GATED = {"switch_transformers", "nllb_moe", "gptsan-japanese", "gptsan_japanese", "longcat_flash", "dbrx",
             "jetmoe"}

EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
BLOCK_CHILD_NAMES = ("mlp", "block_sparse_moe", "feed_forward", "moe", "ffn", "ff")


def log(*a):
    print(*a, flush=True)


class CaseSkipped(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# building the tiny model

def accepted_fields(cfg_cls, default_cfg):
    names = set()
    try:
        names |= {k for k in inspect.signature(cfg_cls.__init__).parameters if k not in ("self", "kwargs")}
    except (TypeError, ValueError):
        pass
    try:
        names |= set(default_cfg.to_dict().keys())
    except Exception:
        pass
    return names


def make_config(cfg_cls, overrides):
    default = cfg_cls()
    ok = accepted_fields(cfg_cls, default)
    kwargs = {k: v for k, v in overrides.items() if k in ok}
    # A default per-layer list sized for the default depth would not match the new depth.
    for k in ("layer_types", "mlp_only_layers", "no_rope_layers", "moe_layers", "layers_block_type"):
        if k in ok and k not in overrides and isinstance(getattr(default, k, None), (list, tuple)):
            kwargs[k] = None if k != "mlp_only_layers" else []
    return cfg_cls(**kwargs)


def shrink_vision(vcfg, hidden):
    sizes = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "depth": 1,
             "num_attention_heads": 2, "num_heads": 2, "out_hidden_size": hidden, "vision_output_dim": 16,
             "projector_input_dim": 16, "projector_output_dim": hidden, "text_hidden_size": hidden,
             "image_size": 28, "patch_size": 14, "spatial_merge_size": 1, "temporal_patch_size": 1,
             "num_position_embeddings": 4, "deepstack_visual_indexes": [], "output_dim": hidden,
             "encoder_layers": 1, "d_model": 16, "encoder_attention_heads": 2, "encoder_ffn_dim": 16,
             "num_mel_bins": 8, "max_source_positions": 8, "n_window": 4, "output_dim_audio": hidden}
    for k, v in sizes.items():
        if hasattr(vcfg, k):
            setattr(vcfg, k, v)


def composite_loaders():
    import transformers
    names = ("AutoModelForImageTextToText", "AutoModelForVision2Seq", "AutoModel", "AutoModelForCausalLM")
    return [getattr(transformers, n) for n in names if hasattr(transformers, n)]


def build_model(transformers, model_type, overrides, composite):
    """Returns (model, text_config). composite: the multimodal model with tiny towers."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModel
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise CaseSkipped(f"transformers {transformers.__version__} has no model_type '{model_type}'")
    cfg_cls = CONFIG_MAPPING[model_type]
    default = cfg_cls()
    text_cfg_attr = None
    for a in ("text_config", "thinker_config"):
        if getattr(default, a, None) is not None:
            text_cfg_attr = a
            break

    if text_cfg_attr is None:
        cfg = make_config(cfg_cls, overrides)
        model = None
        for loader in (AutoModelForCausalLM, AutoModel):
            try:
                model = loader.from_config(cfg, attn_implementation="eager")
                break
            except Exception as e:  # noqa: BLE001 - try the next auto class
                last = e
        if model is None:
            raise last
        return model, cfg

    # Composite (multimodal) config: shrink the text tower with the overrides.
    sub = getattr(default, text_cfg_attr)
    if text_cfg_attr == "thinker_config":  # Qwen3-Omni: thinker_config.text_config
        raise CaseSkipped(f"{model_type}: the thinker/talker composite is not built by this script")
    text_cls = type(sub)
    text_cfg = make_config(text_cls, overrides)
    if composite:
        try:
            vcfg = getattr(default, "vision_config", None)
            if vcfg is not None:
                shrink_vision(vcfg, text_cfg.hidden_size)
            kwargs = {"text_config": text_cfg.to_dict()}
            if vcfg is not None:
                kwargs["vision_config"] = vcfg.to_dict()
            cfg = cfg_cls(**kwargs)
            for loader in composite_loaders():
                try:
                    return loader.from_config(cfg, attn_implementation="eager"), cfg.get_text_config()
                except Exception as e:  # noqa: BLE001
                    last = e
            raise last
        except Exception as e:  # noqa: BLE001 - fall back to the text tower alone
            log(f"  note: the multimodal {model_type} model could not be built ({type(e).__name__}: {e}); "
                f"using its text model alone")
    for loader in (AutoModelForCausalLM, AutoModel):
        try:
            return loader.from_config(text_cfg, attn_implementation="eager"), text_cfg
        except Exception as e:  # noqa: BLE001
            last = e
    raise last


def redraw(model, seed):
    """Every parameter and persistent float buffer re-drawn, then rounded to bf16 values."""
    import torch
    g = torch.Generator().manual_seed(seed)
    persistent = set(model.state_dict().keys())
    norm_params = set()
    for mname, mod in model.named_modules():
        if "norm" in type(mod).__name__.lower() or "norm" in mname.split(".")[-1].lower():
            norm_params |= {f"{mname}.{p}" if mname else p for p, _ in mod.named_parameters(recurse=False)}
    with torch.no_grad():
        items = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if n in persistent]
        for name, t in items:
            if not t.is_floating_point():
                continue
            shape = t.shape
            if t.dim() <= 1:
                if name in norm_params:
                    v = 1.0 + 0.1 * torch.randn(shape, generator=g)
                else:  # biases, correction biases, gates of one value
                    v = 0.1 * torch.randn(shape, generator=g)
            else:
                v = 0.2 * torch.randn(shape, generator=g)
            t.copy_(v.to(torch.bfloat16).to(torch.float32).to(t.dtype))


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def save_checkpoint(model, out, dtype):
    import torch
    model.to(dtype)
    try:
        try:
            model.save_pretrained(out, safe_serialization=True)
        except TypeError:
            model.save_pretrained(out)
    finally:
        model.to(torch.float32)
    for extra in ("generation_config.json",):
        p = os.path.join(out, extra)
        if os.path.exists(p):
            os.remove(p)


def safetensors_names(out):
    names = {}
    for f in sorted(os.listdir(out)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(out, f), "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            hdr = json.loads(fh.read(n))
        for k, v in hdr.items():
            if k != "__metadata__":
                names[k] = {"dtype": v["dtype"], "shape": v["shape"]}
    return names


# ---------------------------------------------------------------------------------------------
# finding the MoE blocks and reading their routes

def text_layers(model):
    """The decoder layers of the language model (the longest ModuleList called *layers outside
    vision/audio towers)."""
    import torch.nn as nn
    best = None
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or not name.endswith("layers"):
            continue
        low = name.lower()
        if any(s in low for s in ("vision", "visual", "audio", "talker", "mtp", "encoder")):
            continue
        if best is None or len(mod) > len(best[1]):
            best = (name, mod)
    if best is None:
        raise RuntimeError("no decoder layer list (*.layers) found in the model")
    return best


def is_moe_block(mod):
    names = dict(mod.named_children())
    if "experts" in names:
        return True
    if "input_linear" in names and ("router" in names or "gate" in names):
        return True
    return False


def moe_block_of(layer):
    for n in BLOCK_CHILD_NAMES:
        m = getattr(layer, n, None)
        if m is not None and is_moe_block(m):
            return n, m
    for n, m in layer.named_children():
        if is_moe_block(m):
            return n, m
    return None, None


def flatten(out):
    """Tensors of a module output: tuples and ModelOutputs are opened, lists kept whole."""
    if isinstance(out, tuple):
        r = []
        for o in out:
            r.extend(flatten(o))
        return r
    if hasattr(out, "to_tuple"):
        return flatten(out.to_tuple())
    return [out]


def routes_from_args(tensors, T, E, K):
    import torch
    ids = w = dense = None
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[0] != T:
            continue
        if not t.is_floating_point() and t.shape[1] == K and ids is None:
            ids = t
        elif t.is_floating_point() and t.shape[1] == K and w is None:
            w = t
        elif t.is_floating_point() and t.shape[1] == E and dense is None:
            dense = t
    if ids is None:
        return None
    if w is None and dense is not None:
        w = torch.gather(dense, 1, ids.long())
    if w is None:
        return None
    return ids.long(), w.float()


def routes_from_router(out, T, E, K):
    """Decode a router module's output: (ids, weights) pairs, dense scores with K non-zeros per
    row (Llama-4), or JetMoE/Granite's sorted (index, batch_index, gates, expert_size, logits)."""
    import torch
    ts = flatten(out)
    r = routes_from_args(ts, T, E, K)
    if r is not None:
        return r
    # JetMoE / GraniteMoe top-k gating
    if len(ts) >= 4 and isinstance(ts[1], torch.Tensor) and ts[1].dim() == 1 and ts[1].numel() == T * K:
        batch_index, batch_gates, expert_size = ts[1], ts[2], ts[3]
        sizes = expert_size.tolist() if isinstance(expert_size, torch.Tensor) else list(expert_size)
        if len(sizes) == E and sum(int(s) for s in sizes) == T * K:
            per_tok = [[] for _ in range(T)]
            j = 0
            for e, s in enumerate(sizes):
                for _ in range(int(s)):
                    per_tok[int(batch_index[j])].append((e, float(batch_gates[j])))
                    j += 1
            ids = torch.tensor([[e for e, _ in sorted(p, key=lambda x: -x[1])] for p in per_tok])
            w = torch.tensor([[v for _, v in sorted(p, key=lambda x: -x[1])] for p in per_tok])
            return ids, w
    # dense scores with exactly K non-zeros per row ([T, E], or capacity-slotted combine weights
    # [T, E, C] summed over the slots; a token dropped for capacity leaves fewer than K and fails)
    for t in ts:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() == 3 and tuple(t.shape[:2]) == (T, E):
            t = t.float().sum(dim=2)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() == 2 and tuple(t.shape) == (T, E):
            nz = (t != 0).sum(dim=1)
            if bool((nz == K).all()):
                w, ids = torch.topk(t.float(), K, dim=1)
                return ids.long(), w
    return None


def describe(out):
    import torch
    return [(tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else type(t).__name__
            for t in flatten(out)]


SHARED_NAMES = ("shared_expert", "shared_experts", "shared_mlp")


def routes_from_expert_calls(calls, shared_out, x2, out, K):
    """Routes of an implementation with one module per expert (nn.ModuleList, called per expert):
    the tokens each expert saw (its input rows matched exactly to the hidden states) and the
    weights that make sum_k w_k expert_k(x) (+ c * shared(x)) equal the block's output, solved
    by least squares per token (the residual must vanish)."""
    import torch
    T, H = x2.shape
    per_tok = [[] for _ in range(T)]
    for e, inp, o in calls:
        inp = inp.reshape(-1, H).float()
        o = o.reshape(-1, H).float()
        for r in range(inp.shape[0]):
            hit = (inp[r] == x2).all(dim=1).nonzero()
            if hit.numel() and bool(inp[r].abs().sum() > 0):
                per_tok[int(hit[0])].append((e, o[r]))
    ids, ws = [], []
    for t in range(T):
        if len(per_tok[t]) != K:
            raise RuntimeError(f"token {t} reached {len(per_tok[t])} experts, not top_k {K} "
                               f"(dropped by an expert capacity limit?)")
        cols = [o for _, o in per_tok[t]] + ([shared_out[t]] if shared_out is not None else [])
        A = torch.stack(cols, dim=1).double()
        sol = torch.linalg.lstsq(A, out[t].double().unsqueeze(1)).solution.squeeze(1)
        res = (A @ sol - out[t].double()).norm() / max(out[t].double().norm(), 1e-30)
        if res > 1e-4:
            raise RuntimeError(f"token {t}: expert outputs do not explain the block output (residual {res:.2e})")
        order = sorted(range(K), key=lambda k: -float(sol[k]))
        ids.append([per_tok[t][k][0] for k in order])
        ws.append([float(sol[k]) for k in order])
    return torch.tensor(ids), torch.tensor(ws)


def run_block(block, x, E, K):
    """Calls the MoE block on x [1, T, H]; returns (out [T, H], ids [T, K], weights [T, K], how)."""
    import torch
    T = x.shape[1]
    captured = {}
    hooks = []
    experts = getattr(block, "experts", None)
    calls, shared_out = [], []
    if isinstance(experts, torch.nn.ModuleList):
        for e, m in enumerate(experts):
            hooks.append(m.register_forward_hook(
                lambda _m, a, o, e=e: calls.append((e, a[0].detach().clone(), o.detach().clone()))))
        for n in SHARED_NAMES:
            m = getattr(block, n, None)
            if isinstance(m, torch.nn.Module):
                hooks.append(m.register_forward_hook(lambda _m, _a, o: shared_out.append(o)))
                break
    elif isinstance(experts, torch.nn.Module):
        def pre(_mod, args, kwargs):
            if "experts" not in captured:
                r = routes_from_args(list(args[1:]) + list(kwargs.values()), T, E, K)
                if r is not None:
                    captured["experts"] = r
        hooks.append(experts.register_forward_pre_hook(pre, with_kwargs=True))
    router_out = []
    for n in ("gate", "router"):
        m = getattr(block, n, None)
        if isinstance(m, torch.nn.Module):
            hooks.append(m.register_forward_hook(lambda _m, _a, o: router_out.append(o)))
            break
    try:
        with torch.no_grad():
            out = block(x)
    finally:
        for h in hooks:
            h.remove()
    out = flatten(out)[0]
    if not isinstance(out, torch.Tensor):
        raise RuntimeError(f"{type(block).__name__} returned {type(out).__name__}, not a tensor")
    out = out.reshape(T, -1).float()
    r, how = captured.get("experts"), "arguments of the experts module"
    if r is None:
        for o in router_out:
            r, how = routes_from_router(o, T, E, K), "output of the router module"
            if r is not None:
                break
    if r is None and calls:
        so = flatten(shared_out[0])[0].reshape(T, -1).float() if shared_out else None
        r = routes_from_expert_calls(calls, so, x.reshape(T, -1).float(), out, K)
        how = "per-expert module calls (weights by least squares)"
    if r is None:
        raise RuntimeError(
            f"cannot read the routes of {type(block).__name__}: experts called with "
            f"{'nothing captured' if experts is not None else 'no experts module'}, router outputs "
            f"{[describe(o) for o in router_out]}")
    ids, w = r
    return out, ids, w, how


def first_attr(cfg, names, default=None):
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    return default


# ---------------------------------------------------------------------------------------------

def make_case(name, model_type, extra, opts, outdir, dtype_name):
    """Tries the geometries of SIZE_PRESETS in turn until the whole directory fits MAX_DIR_BYTES."""
    last_err = None
    for preset in SIZE_PRESETS:
        try:
            return make_case_with(name, model_type, extra, opts, outdir, dtype_name, preset)
        except TooBig as e:
            last_err = str(e)
            log(f"  {name}: {e}; trying a smaller geometry")
    raise RuntimeError(f"no geometry fits {MAX_DIR_BYTES} bytes (last: {last_err})")


class TooBig(Exception):
    pass


def make_case_with(name, model_type, extra, opts, outdir, dtype_name, preset):
    import torch
    import transformers

    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype_name]
    seed = zlib.crc32(name.encode())
    out = os.path.join(outdir, name)
    overrides = base_overrides(preset, opts.get("num_experts", 8), opts.get("top_k", 2))
    overrides.update(extra)
    for k, v in list(overrides.items()):
        if v == "last":  # the last decoder layer of this geometry
            overrides[k] = preset["layers"] - 1
    torch.manual_seed(seed)
    model, tcfg = build_model(transformers, model_type, overrides, opts.get("composite", False))
    model.eval()
    model.to(torch.float32)
    redraw(model, seed)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    save_checkpoint(model, out, dtype)
    size = dir_bytes(out)
    if size > MAX_DIR_BYTES:
        raise TooBig(f"the checkpoint is {size} bytes with {preset}")

    H = tcfg.hidden_size
    E = first_attr(tcfg, EXPERT_COUNT_FIELDS)
    K = first_attr(tcfg, ("num_experts_per_tok", "moe_topk", "moe_k", "top_k"))
    if isinstance(K, (list, tuple)):
        K = K[0]
    if E is None or K is None:
        raise RuntimeError(f"cannot read the expert count / top-k from {type(tcfg).__name__}")

    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(1, TOKENS, H, generator=g).to(torch.bfloat16).to(torch.float32)
    x.reshape(TOKENS, H).numpy().astype("<f4").tofile(os.path.join(out, "hidden.f32"))

    lname, layers = text_layers(model)
    entries = []
    for li, layer in enumerate(layers):
        bname, block = moe_block_of(layer)
        if block is None:
            continue
        y, ids, w, how = run_block(block, x, E, K)
        # GraniteMoeShared adds its shared MLP beside the MoE block, in the decoder layer.
        layer_shared = None
        for n in SHARED_NAMES:
            m = getattr(layer, n, None)
            if isinstance(m, torch.nn.Module) and m is not block:
                with torch.no_grad():
                    y = y + flatten(m(x))[0].reshape(TOKENS, -1).float()
                layer_shared = n
                break
        if tuple(y.shape) != (TOKENS, H):
            raise RuntimeError(f"layer {li}: output shape {tuple(y.shape)}, expected {(TOKENS, H)}")
        stem = f"layer{li}"
        y.numpy().astype("<f4").tofile(os.path.join(out, stem + ".out.f32"))
        ids.to(torch.int32).numpy().astype("<i4").tofile(os.path.join(out, stem + ".ids.i32"))
        w.numpy().astype("<f4").tofile(os.path.join(out, stem + ".weights.f32"))
        entries.append({"layer": li, "module": f"{lname}.{li}.{bname}", "class": type(block).__name__,
                        "output": stem + ".out.f32", "ids": stem + ".ids.i32", "weights": stem + ".weights.f32",
                        "k": int(ids.shape[1]), "routes_from": how,
                        "output_includes": f"{bname} + {layer_shared}" if layer_shared else bname})
    if not entries:
        raise RuntimeError(f"no MoE block found in {lname} ({type(layers[0]).__name__} children: "
                           f"{[n for n, _ in layers[0].named_children()]})")

    manifest = {
        "case": name,
        "model_type": model_type,
        "saved_model_type": json.load(open(os.path.join(out, "config.json"))).get("model_type"),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "checkpoint_dtype": dtype_name,
        "seed": seed,
        "tokens": TOKENS,
        "hidden": H,
        "num_experts": int(E),
        "top_k": int(K),
        "hidden_states": "hidden.f32",
        "layers": entries,
        "tensors": safetensors_names(out),
    }
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    size = dir_bytes(out)
    if size > MAX_DIR_BYTES:
        raise TooBig(f"the golden directory is {size} bytes with {preset}")
    return f"{len(entries)} MoE layers, H={H} E={E} K={K}, {size} bytes, saved as " \
           f"'{manifest['saved_model_type']}'"


def discovered_cases():
    """MoE model types transformers has that no case above names (expert-count field present)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, CONFIG_MAPPING
    known = {mt for mt, _, _ in CASES.values()}
    out = {}
    for mt in sorted(CONFIG_MAPPING_NAMES):
        if mt in known or mt in NOT_GATED:
            continue
        try:
            cfg = CONFIG_MAPPING[mt]()
        except Exception:  # noqa: BLE001 - configs that need arguments are not MoE text models here
            continue
        sub = cfg
        for a in ("text_config",):
            if getattr(cfg, a, None) is not None:
                sub = getattr(cfg, a)
        if any(getattr(sub, f, None) for f in EXPERT_COUNT_FIELDS):
            out[mt] = (mt, {}, {"composite": sub is not cfg})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("cases", nargs="*", help="case names or model types (default: all)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="dtype of the saved checkpoint (values are bf16-representable either way)")
    ap.add_argument("--no-discover", action="store_true", help="only the cases named in this script")
    args = ap.parse_args()

    try:
        import torch  # noqa: F401
        import transformers
    except ImportError as e:
        sys.exit(f"make_golden.py needs torch and transformers: {e}")
    log(f"transformers {transformers.__version__}, torch {torch.__version__}")

    cases = dict(CASES)
    if not args.no_discover:
        try:
            extra = discovered_cases()
            if extra:
                log(f"discovered MoE model types without a case: {', '.join(extra)}")
            cases.update(extra)
        except Exception as e:  # noqa: BLE001
            log(f"discovery failed: {type(e).__name__}: {e}")
    if args.list:
        for n, (mt, ov, op) in cases.items():
            log(f"{n:22s} {mt:20s} {op}")
        return 0
    if not args.outdir:
        ap.error("OUTDIR is required")
    wanted = args.cases or list(cases)
    selected = [(n, cases[n]) for n in cases if n in wanted or cases[n][0] in wanted]
    unknown = [w for w in wanted if w not in cases and all(c[0] != w for c in cases.values())]
    for w in unknown:
        selected.append((w, (w, {}, {})))
    os.makedirs(args.outdir, exist_ok=True)

    results = []
    for name, (mt, extra, opts) in selected:
        log(f"== {name} ({mt})")
        try:
            msg = make_case(name, mt, extra, opts, args.outdir, args.dtype)
            results.append((name, "ok", msg))
            log(f"  ok: {msg}")
        except CaseSkipped as e:
            results.append((name, "skipped", str(e)))
            log(f"  skipped: {e}")
            shutil.rmtree(os.path.join(args.outdir, name), ignore_errors=True)
        except Exception as e:  # noqa: BLE001 - one case's failure must not stop the rest
            results.append((name, "FAILED", f"{type(e).__name__}: {e}"))
            log(f"  FAILED: {type(e).__name__}: {e}")
            traceback.print_exc(limit=4)
            shutil.rmtree(os.path.join(args.outdir, name), ignore_errors=True)

    log("\nsummary:")
    for name, status, msg in results:
        log(f"  {name:22s} {status:8s} {msg}")
    with open(os.path.join(args.outdir, "summary.json"), "w") as f:
        json.dump([{"case": n, "status": s, "message": m} for n, s, m in results], f, indent=1)
    n_ok = sum(1 for _, s, _ in results if s == "ok")
    log(f"{n_ok} ok, {sum(1 for _, s, _ in results if s == 'skipped')} skipped, "
        f"{sum(1 for _, s, _ in results if s == 'FAILED')} failed")
    return 0 if n_ok else 1


if __name__ == "__main__":
    sys.exit(main())
