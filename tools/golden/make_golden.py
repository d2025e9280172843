#!/usr/bin/env python3
"""Golden data for FreeToken's architecture tests, produced by transformers itself.

    python3 tools/golden/make_golden.py OUTDIR [case ...]   (no case: every case of golden_cases.py
                                                             and the discovered ones)
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
import json
import os
import shutil
import sys
import traceback
import zlib

from golden_cases import (CASES, CaseSkipped, EXPERT_COUNT_FIELDS, MAX_DIR_BYTES, NOT_GATED, SIZE_PRESETS,
                          TOKENS, case_overrides, log)
from golden_model import build_model, dir_bytes, redraw, relabel, safetensors_names, save_checkpoint
from golden_routes import SHARED_NAMES, first_attr, flatten, moe_block_of, run_block, text_layers


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
    overrides = case_overrides(extra, opts, preset)
    torch.manual_seed(seed)
    model, tcfg = build_model(transformers, model_type, overrides, opts.get("composite", False))
    model.eval()
    model.to(torch.float32)
    redraw(model, seed)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    save_checkpoint(model, out, dtype)
    if opts.get("saved_as"):
        relabel(os.path.join(out, "config.json"), model_type, opts["saved_as"])
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
    ap.add_argument("--no-discover", action="store_true", help="only the cases named in golden_cases.py")
    args = ap.parse_intermixed_args()  # options may stand between or after the case names

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
