#!/usr/bin/env python3
"""Generates text with a transformers MoE checkpoint whose routed experts run in FreeToken (host
memory, GPU slot cache), and prints the decode speed.

  python3 examples/python/generate.py /models/Qwen3-30B-A3B --backend hybrid --cache-fraction 0.25 \\
      --prompt "The capital of France is" --max-new-tokens 64

Needs torch (CUDA for the gpu/offload/hybrid backends), transformers, and the freetoken package
(bindings/python) with libfreetoken where it finds it (FREETOKEN_LIBRARY, pkg-config, system loader).
Only the non-expert weights go to the GPU; the experts are read once into FreeToken's host banks."""
import argparse
import os
import sys
import time

try:
    import freetoken.torch as ftt
except ImportError:  # run from a source tree without the package installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
    import freetoken.torch as ftt
import freetoken as ft
import torch
import transformers


def timed_generate(model, inputs, new_tokens):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="Hugging Face checkpoint directory")
    ap.add_argument("--backend", default="hybrid", choices=["auto", "cpu", "gpu", "offload", "hybrid"])
    ap.add_argument("--cache-fraction", type=float, default=0.25, help="share of all experts in the GPU slot cache")
    ap.add_argument("--prompt", default="Mixture-of-Experts models are")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--log", default="warn", help="FreeToken log level (off, error, warn, info, debug)")
    args = ap.parse_args()

    ft.set_log_callback(lambda level, msg: print("[freetoken]", msg, file=sys.stderr), args.log)
    print("libfreetoken %s from %s (%s)" % ((ft.version(),) + ft.library_path()))
    t0 = time.perf_counter()
    model = ftt.from_pretrained(args.model, backend=args.backend, cache_fraction=args.cache_fraction,
                                device=args.device)
    offload = model.freetoken_offload
    print("loaded in %.1f s: %d MoE layers on FreeToken, backend %s (%s)" % (
        time.perf_counter() - t0, len(offload.blocks), offload.backend, offload.session.backend_reason))
    tok = transformers.AutoTokenizer.from_pretrained(args.model)
    device = next(p.device for p in model.parameters())
    inputs = tok(args.prompt, return_tensors="pt").to(device)

    _, first = timed_generate(model, inputs, 1)  # prefill and one token
    offload.session.reset_stats()
    out, total = timed_generate(model, inputs, args.max_new_tokens)
    print(tok.decode(out[0], skip_special_tokens=True))
    decode = max(total - first, 1e-9)
    st = offload.stats()
    print("\nprefill + first token %.3f s; decode %.2f tokens/s (%d tokens in %.2f s)" % (
        first, (args.max_new_tokens - 1) / decode, args.max_new_tokens - 1, decode))
    hits, misses = st["cache_hits"], st["cache_misses"]
    if hits + misses:
        print("slot cache hit rate %.1f%%, %.2f GB fetched, CPU %.2f GB read, hybrid fraction %.2f" % (
            100.0 * hits / (hits + misses), st["fetched_bytes"] / 1e9, st["cpu_bytes"] / 1e9, st["hybrid_fraction"]))
    offload.close()


if __name__ == "__main__":
    main()
