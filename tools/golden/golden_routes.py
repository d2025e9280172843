"""Finding the MoE blocks of a transformers model, running them and reading their routes
(make_golden.py)."""

from golden_cases import BLOCK_CHILD_NAMES


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
