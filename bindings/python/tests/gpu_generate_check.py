#!/usr/bin/env python3
"""GPU check of freetoken.torch (no pytest): for each architecture FreeToken loads, a tiny random
transformers model generates greedily with and without offload_experts on the gpu, offload and
hybrid backends; the tokens must be identical and the logits agree within bf16 tolerance; then the
offloaded MoE blocks' one-token decode step is captured in a CUDA graph and replayed with new inputs
against eager calls.

Usage: gpu_generate_check.py [--archs qwen3_moe,mixtral,...] [--backends gpu,offload,hybrid]
                             [--tokens 32] [--keep DIR]
Exits 0 when every case passes, 1 on a failure, 77 (skip) without CUDA, torch or transformers.

A divergence of the greedy tokens is reported with the reference's top-1/top-2 margin at that
step; it counts as a failure unless that margin is below the logit error measured over the steps
before it (a near tie that bf16 rounding may flip), which is printed as such.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

SKIP = 77


def skip(msg):
    print("SKIP:", msg)
    sys.exit(SKIP)


try:
    import torch
except ImportError:
    skip("torch is not installed")
if not torch.cuda.is_available():
    skip("no CUDA device")
try:
    import transformers
except ImportError:
    skip("transformers is not installed")

import freetoken as ft  # noqa: E402
import freetoken.torch as ftt  # noqa: E402
from freetoken.safetensors import save_file  # noqa: E402
from mxfp4 import mxfp4_quantise  # noqa: E402

VOCAB, H, I, E, K = 512, 256, 384, 16, 4
COMMON = dict(vocab_size=VOCAB, hidden_size=H, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, tie_word_embeddings=False, initializer_range=0.05)


def configs():
    """{arch: (config class name, kwargs)}: tiny models of every architecture FreeToken loads that
    transformers has (Qwen3.5/3.6-MoE and Kimi-K2 are checked by the C++ loader tests; DeepSeek-V4
    has no transformers model)."""
    return {
        "qwen3_moe": ("Qwen3MoeConfig", dict(COMMON, num_hidden_layers=2, head_dim=64, intermediate_size=512,
                                             num_experts=E, num_experts_per_tok=K, moe_intermediate_size=I,
                                             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])),
        "mixtral": ("MixtralConfig", dict(COMMON, num_hidden_layers=2, intermediate_size=I, num_local_experts=E,
                                          num_experts_per_tok=K)),
        "deepseek_v3": ("DeepseekV3Config", dict(COMMON, num_hidden_layers=3, intermediate_size=512,
                                                 moe_intermediate_size=I, n_routed_experts=E, n_shared_experts=1,
                                                 num_experts_per_tok=K, n_group=4, topk_group=2,
                                                 routed_scaling_factor=2.5, first_k_dense_replace=1,
                                                 norm_topk_prob=True, kv_lora_rank=64, q_lora_rank=64,
                                                 qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=64,
                                                 num_key_value_heads=4)),
        "glm4_moe": ("Glm4MoeConfig", dict(COMMON, num_hidden_layers=3, head_dim=64, intermediate_size=512,
                                           moe_intermediate_size=I, n_routed_experts=E, n_shared_experts=1,
                                           num_experts_per_tok=K, n_group=1, topk_group=1,
                                           routed_scaling_factor=1.0, first_k_dense_replace=1,
                                           norm_topk_prob=True)),
        "gpt_oss": ("GptOssConfig", dict(COMMON, num_hidden_layers=2, head_dim=64, intermediate_size=I,
                                         num_local_experts=E, num_experts_per_tok=K, sliding_window=128,
                                         layer_types=["sliding_attention", "full_attention"])),
    }


# ---- gpt-oss: MXFP4 experts ------------------------------------------------------------------------

def quantise_gpt_oss(model):
    """Replaces each layer's expert weights by their MXFP4 round trip; returns the checkpoint tensors."""
    out = {}
    for name, module in model.named_modules():
        if type(module).__name__ != "GptOssExperts":
            continue
        for proj, n_out, k_in in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            p = getattr(module, proj)
            transposed = tuple(p.shape[1:]) == (k_in, n_out)  # transformers keeps [E, K, N]
            w = p.data.transpose(1, 2) if transposed else p.data
            blocks, scales, deq = mxfp4_quantise(w)
            with torch.no_grad():
                p.copy_((deq.transpose(1, 2) if transposed else deq).to(p.dtype))
            out[name + "." + proj + "_blocks"] = blocks
            out[name + "." + proj + "_scales"] = scales
    return out


# ---- checkpoints -----------------------------------------------------------------------------------

def write_checkpoint(model, path, arch):
    os.makedirs(path, exist_ok=True)
    tensors = {}
    extra = quantise_gpt_oss(model) if arch == "gpt_oss" else {}
    for name, t in model.state_dict().items():
        if arch == "gpt_oss" and (name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj")):
            continue
        tensors[name] = t.float() if name.endswith("e_score_correction_bias") else t
    tensors.update(extra)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    cfg = model.config.to_dict()
    if arch == "gpt_oss":
        cfg["quantization_config"] = {"quant_method": "mxfp4"}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1, default=str)


def randomise_biases(model):
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.05)


# ---- generation and comparison -------------------------------------------------------------------

def generate(model, prompt, tokens):
    with torch.inference_mode():
        r = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                           output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return r.sequences[0, prompt.shape[1]:].tolist(), torch.stack([lg[0].float() for lg in r.logits])


def compare(ref_tokens, ref_logits, tokens, logits):
    """(ok, text)."""
    n = len(ref_tokens)
    first = next((i for i in range(n) if tokens[i] != ref_tokens[i]), n)
    upto = max(first, 1)
    d = (logits[:upto] - ref_logits[:upto])
    rel = float(d.norm() / ref_logits[:upto].norm())
    err = float(d.abs().max())
    text = "logits rel L2 %.2e, max |d| %.3g over %d steps" % (rel, err, upto)
    ok = rel <= 3e-2
    if first < n:
        top2 = ref_logits[first].topk(2).values
        margin = float(top2[0] - top2[1])
        if margin <= 2 * err:
            text += "; tokens diverge at step %d at a near tie (margin %.3g <= 2 x max |d|)" % (first, margin)
        else:
            text += "; tokens DIVERGE at step %d (margin %.3g)" % (first, margin)
            ok = False
    else:
        text += "; tokens identical"
    return ok, text


def graph_check(model):
    """Captures every offloaded MoE block's one-token step in one CUDA graph; replays against eager."""
    blocks = [m for m in model.modules() if hasattr(m, "_freetoken")]
    dev = next(p.device for p in model.parameters() if p.device.type == "cuda")
    x = torch.zeros(1, 1, H, device=dev, dtype=torch.bfloat16)

    def step():
        outs = []
        for b in blocks:
            y = b(x)
            outs.append(y[0] if isinstance(y, tuple) else y)
        return outs
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        x.normal_(0, 1)
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode():
        with torch.cuda.graph(graph):
            static = step()
    worst = 0.0
    for trial in range(4):
        with torch.inference_mode():
            x.normal_(0, 1)
            graph.replay()
            torch.cuda.synchronize()
            replayed = [s.float().clone() for s in static]
            eager = [e.float() for e in step()]
            torch.cuda.synchronize()
        for a, b in zip(replayed, eager):
            worst = max(worst, float((a - b).norm() / b.norm().clamp(min=1e-30)))
    return worst <= 1e-2, "graph of %d MoE blocks, replay vs eager rel L2 <= %.2e" % (len(blocks), worst)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default=",".join(configs()))
    ap.add_argument("--backends", default="gpu,offload,hybrid")
    ap.add_argument("--tokens", type=int, default=32)
    # The slot cache holds at least one layer's experts; these models have 2 MoE layers of E experts,
    # so 0.6 gives 19 slots of 32: every layer switch evicts.
    ap.add_argument("--cache-fraction", type=float, default=0.6)
    ap.add_argument("--keep", help="write the checkpoints here and keep them")
    args = ap.parse_args()
    print("torch", torch.__version__, "transformers", transformers.__version__, "freetoken", ft.version(),
          "from", *ft.library_path())
    if not ft.build_info()["cuda"]:
        skip("this libfreetoken was built without CUDA")
    root = args.keep or tempfile.mkdtemp(prefix="ft_gpu_generate_")
    results, failed = [], False
    try:
        for arch in args.archs.split(","):
            cls_name, kwargs = configs()[arch]
            cls = getattr(transformers, cls_name, None)
            if cls is None:
                results.append((arch, "-", "SKIP", "transformers %s has no %s" % (transformers.__version__, cls_name)))
                continue
            torch.manual_seed(0)
            config = cls(**kwargs)
            ref = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16).cuda().eval()
            randomise_biases(ref)
            path = os.path.join(root, arch)
            write_checkpoint(ref, path, arch)  # gpt-oss: ref's experts become their MXFP4 round trip
            prompt = torch.randint(1, VOCAB, (1, 8), device="cuda")
            ref_tokens, ref_logits = generate(ref, prompt, args.tokens)
            del ref
            torch.cuda.empty_cache()
            for backend in args.backends.split(","):
                t0 = time.time()
                try:
                    model = ftt.from_pretrained(path, backend=backend, device="cuda",
                                                cache_fraction=0.0 if backend == "gpu" else args.cache_fraction)
                    tokens, logits = generate(model, prompt, args.tokens)
                    ok, text = compare(ref_tokens, ref_logits, tokens, logits)
                    gok, gtext = graph_check(model)
                    ok, text = ok and gok, text + "; " + gtext
                    model.freetoken_offload.close()
                    del model
                except Exception as e:  # a failure of one case is reported, the others still run
                    import traceback
                    traceback.print_exc()
                    ok, text = False, "%s: %s" % (type(e).__name__, e)
                torch.cuda.empty_cache()
                failed |= not ok
                results.append((arch, backend, "ok" if ok else "FAIL", "%s (%.1f s)" % (text, time.time() - t0)))
                print("%-12s %-8s %-4s %s" % results[-1], flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print("\n%-12s %-8s %-4s %s" % ("arch", "backend", "", "result"))
    for r in results:
        print("%-12s %-8s %-4s %s" % r)
    if all(r[2] == "SKIP" for r in results):
        return SKIP
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
