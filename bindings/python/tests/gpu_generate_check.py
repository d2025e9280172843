#!/usr/bin/env python3
"""GPU check of freetoken.torch (no pytest): for every architecture of the golden set
(tools/golden/golden_cases.py: its cases, tiny geometry and seeded weights), a tiny random
transformers model generates greedily with and without offload_experts on the gpu, offload and
hybrid backends; the tokens must be identical and the logits agree within bf16 tolerance; then the
offloaded MoE blocks' one-token decode step is captured in a CUDA graph and replayed with new inputs
against eager calls.

Usage: gpu_generate_check.py [--archs CASE_OR_MODEL_TYPE,...] [--backends gpu,offload,hybrid]
                             [--tokens 32] [--geometry HIDDEN,INTER,LAYERS] [--param FIELD=VALUE]...
                             [--keep DIR] [--list]
Exits 0 when every case passes, 1 on a failure, 77 (skip) without CUDA, torch or transformers.

Per case the model is built by the golden tool (build_model: the multimodal model with tiny towers for
composite cases, which generates from text alone; else the causal LM), its weights re-drawn (redraw)
and saved with save_pretrained in bf16 (save_checkpoint); that directory is what FreeToken loads and
what freetoken.torch.from_pretrained reads the non-expert weights from. The reference is
transformers' own from_pretrained of that directory in bf16 on the GPU: what a user's model is
(rotary frequencies computed in float32, modules the class keeps in float32 kept so). Where
transformers cannot run its own reload of a tiny saved config, the reference is the built model
cast to bf16 with those buffers kept in float32, and the result says so. gpt_oss_mxfp4 is the
gpt_oss case with its experts rounded to MXFP4 and stored as gpt-oss does (`*_blocks`/`*_scales`),
at an intermediate size of 64 (MXFP4 blocks are 32 wide). deepseek_v3_fp8 is the deepseek_v3 case as
DeepSeek-V3's FP8 release stores it: every projection weight (attention, dense and shared MLPs,
experts) E4M3 with a weight_scale_inv per 128x128 block, at hidden 256 / intermediate 128; its
values are rounded with power-of-two block scales so the bf16 reference holds them exactly. Cases
whose release names the model type differently (kimi_k2, qwen3_6_moe) are saved under the release's
model_type after the reference is built, so freetoken.torch.from_pretrained reads the config a user
has. Cases the golden tool skips (a model type this transformers lacks; the Qwen3-Omni
thinker/talker composite) and models that cannot generate text are SKIP with the reason. A failure of
one case (building it, its reference, or a backend) is recorded as FAIL with the exception and the
others still run. One FreeToken engine serves every session of the run.

Logits are judged against the exact model, not against one bf16 run: the reference's greedy
sequence is fed once more (teacher forcing) to the model loaded in fp32 (its bf16 weights held
exactly), to transformers' bf16 model, to that bf16 model with its MoE blocks computed in fp32
(what FreeToken computes: fp32 accumulation, bf16 out) and to the offloaded one. FreeToken's relative
L2 error to the fp32 logits must stay within twice the larger of the two transformers bf16 errors
(+ 2e-3): random tiny models amplify rounding differently at every size, so a fixed threshold would
judge the model, not the library. That pass is one prefill-sized call per block; the decode steps
are judged the same way: the logits generate returned at each step against the fp32 model's on the
same sequence, within twice the larger error of the two transformers models' own generate (+ 2e-3).
Rows where a routing decision flipped are left out and listed: positions whose experts in the
offloaded model's teacher-forced pass differ from those its own MoE block (the model's router)
picks on the fp32 model's input to that block. The teacher-forced errors of all three models are
taken over the other rows; the decode-step error of FreeToken over the same positions (or, when
it generated other tokens, over the positions without a flip on its own sequence), against a
bound from the transformers models' errors over every row.
A flip swaps whole experts, so one flipped near tie dominates a row's error although every expert
is computed right; rows without a flip still judge the offloaded experts.
A divergence of the greedy tokens counts as a failure unless the fp32 top-1/top-2 margin at that
step is within twice the largest bf16 logit error (a near tie that rounding may flip), or the
tokens are those the bf16 model with fp32 MoE blocks generates (FreeToken computes what that model
computes; generation's caches can amplify a difference the teacher-forced logits do not show). A
model whose own bf16 reference cannot be built or generate (transformers at this tiny geometry) is
SKIP with transformers' error.

Each offloaded MoE block is also checked on its own (block_check): on random inputs of 1, 8 and 40
tokens its output against the fp32 reference's block must stay within twice the error of
transformers' bf16 block (+ 2e-3). Both run the same router (bf16, or float32 where the model keeps
it so), so they take the same routes: a block that fails here computes something other than
transformers' block, while a case that passes here and fails only on the whole model's logits
differs by rounding that the model amplifies.
"""
import argparse
import contextlib
import copy
import gc
import json
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "golden"))

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
import golden_cases  # noqa: E402
import golden_model  # noqa: E402
from freetoken.safetensors import checkpoint_files, load_torch, read_header, save_file  # noqa: E402
from mxfp4 import mxfp4_quantise  # noqa: E402

PROMPT = 8  # prompt tokens


def cases():
    """{case: (model_type, extra overrides, options)}: the golden cases, and gpt_oss_mxfp4."""
    out = dict(golden_cases.CASES)
    mt, extra, opts = out["gpt_oss"]
    out["gpt_oss_mxfp4"] = (mt, extra, dict(opts, mxfp4=True))
    mt, extra, opts = out["deepseek_v3"]
    out["deepseek_v3_fp8"] = (mt, extra, dict(opts, fp8=True))
    return out


class Skipped(Exception):
    pass


# ---- building and saving one case -----------------------------------------------------------------

def can_generate(model):
    try:
        return bool(model.can_generate())
    except Exception:  # noqa: BLE001 - transformers versions without can_generate
        return hasattr(model, "generate") and model.get_output_embeddings() is not None


def generation_overrides(model_type, overrides, layers):
    """Config fields a tiny model needs to generate, beyond the golden geometry (which only runs
    the MoE blocks): MLA keys carry one head per attention head; hybrid stacks get one attention
    layer (a cache of linear-attention layers only cannot tell its length); GLM-4V's multimodal
    RoPE sections need their full rotary width."""
    out = {}
    if model_type in ("deepseek_v2", "deepseek_v3"):
        out["num_key_value_heads"] = overrides["num_attention_heads"]
    if model_type in ("qwen3_next", "qwen3_5_moe"):
        out["layer_types"] = ["full_attention" if i % 2 else "linear_attention" for i in range(layers)]
    if model_type == "granitemoehybrid":
        out["layer_types"] = ["attention" if i % 2 else "mamba" for i in range(layers)]
    if model_type == "glm4v_moe":
        # its multimodal RoPE sections (8, 12, 12) fill a rotary half-width of 32: head_dim 128
        # (hidden / heads) at its partial rotary factor 0.5
        out["hidden_size"] = 128 * overrides["num_attention_heads"]
    return out


def build(name, model_type, extra, opts, preset):
    """(model float32 with the golden re-drawn weights, text config) of a case, or raises Skipped."""
    overrides = golden_cases.case_overrides(extra, opts, preset)
    overrides.update(generation_overrides(model_type, overrides, preset["layers"]))
    overrides["use_cache"] = True  # generate's decode steps: one token per call
    seed = zlib.crc32(name.encode())
    torch.manual_seed(seed)
    try:
        model, tcfg = golden_model.build_model(transformers, model_type, overrides, opts.get("composite", False))
    except golden_cases.CaseSkipped as e:
        raise Skipped(str(e))
    if not can_generate(model):
        built = type(model).__name__
        try:
            model = transformers.AutoModelForCausalLM.from_config(tcfg, attn_implementation="eager")
        except Exception as e:  # noqa: BLE001
            raise Skipped("transformers %s: %s builds %s, which has no LM head, and AutoModelForCausalLM "
                          "refuses its text config (%s: %s)" % (transformers.__version__, model_type, built,
                                                               type(e).__name__, str(e)[:160]))
        if not can_generate(model):
            raise Skipped("transformers %s: no class of %s generates text" % (transformers.__version__, model_type))
    model.eval()
    model.to(torch.float32)
    golden_model.redraw(model, seed)
    return model, tcfg


def quantise_mxfp4(model, H, I):
    """Rounds each gpt-oss experts module's weights to MXFP4 in place; returns {checkpoint name: tensor}
    of the blocks and scales, stored [E, N, K / 32, ...] as gpt-oss checkpoints do."""
    out = {}
    for name, module in model.named_modules():
        gate_up = getattr(module, "gate_up_proj", None)
        if not isinstance(gate_up, torch.Tensor) or gate_up.dim() != 3:
            continue
        transposed = tuple(gate_up.shape[1:]) == (H, 2 * I)  # transformers keeps [E, K, N]
        for proj in ("gate_up_proj", "down_proj"):
            p = getattr(module, proj)
            w = p.data.transpose(1, 2) if transposed else p.data
            blocks, scales, deq = mxfp4_quantise(w)
            with torch.no_grad():
                p.copy_((deq.transpose(1, 2) if transposed else deq).to(p.dtype))
            out[name + "." + proj + "_blocks"] = blocks
            out[name + "." + proj + "_scales"] = scales
    if not out:
        raise RuntimeError("no gpt-oss experts module (gate_up_proj [E, ., .]) to quantise")
    return out


def write_mxfp4(path, quantised):
    """Replaces the bf16 expert matrices save_pretrained wrote by their MXFP4 blocks and scales."""
    for f in checkpoint_files(path):
        header, _ = read_header(f)
        drop = {n for n in header if n + "_blocks" in quantised}
        if not drop:
            continue
        tensors = {n: t for n, t in load_torch(f).items() if n not in drop}
        for n in drop:
            tensors[n + "_blocks"], tensors[n + "_scales"] = quantised[n + "_blocks"], quantised[n + "_scales"]
        save_file(tensors, f, metadata={"format": "pt"})
        quantised = {k: v for k, v in quantised.items() if k.rsplit("_", 1)[0] not in drop}
    if quantised:
        raise RuntimeError("save_pretrained wrote no tensor for %s" % sorted(quantised)[:4])
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as fh:
        cfg = json.load(fh)
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh, indent=1)


FP8_BLOCK = 128
FP8_QUANTISED = re.compile(r"(proj|proj_with_mqa)\.weight$|(^|\.)experts\.(gate_up_proj|down_proj)$")


def _fp8_round(w):
    """(w rounded to FP8 E4M3 per 128x128 block, the blocks' scale_inv) of a 2-D tensor: each block's
    scale is the power of two that brings its amax within E4M3's 448, so the rounded values are also
    exact in bf16 (what save_pretrained writes and transformers' reference reads)."""
    N, K = w.shape
    pad = torch.zeros(-(-N // FP8_BLOCK) * FP8_BLOCK, -(-K // FP8_BLOCK) * FP8_BLOCK, dtype=torch.float32)
    pad[:N, :K] = w.float()
    blocks = pad.view(pad.shape[0] // FP8_BLOCK, FP8_BLOCK, pad.shape[1] // FP8_BLOCK, FP8_BLOCK)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    deq = (q.float() * scale[:, None, :, None]).reshape(pad.shape)[:N, :K]
    return q.reshape(pad.shape)[:N, :K], deq, scale


def quantise_fp8(model):
    """Rounds every projection weight (attention, dense and shared MLPs, routed experts; not the router,
    embeddings or LM head) to FP8 values with 128x128 block scales, in place, as DeepSeek-V3's FP8
    release stores them; fused expert tensors [E, N, K] per expert."""
    n = 0
    for name, p in model.named_parameters():
        if not FP8_QUANTISED.search(name):
            continue
        with torch.no_grad():
            for w in (p.data if p.dim() == 3 else [p.data]):
                w.copy_(_fp8_round(w)[1].to(w.dtype))
        n += 1
    if not n:
        raise RuntimeError("no projection weight to quantise")


def write_fp8(path):
    """Rewrites the bf16 projection weights save_pretrained wrote as E4M3 bytes with an F32
    weight_scale_inv per 128x128 block (fused experts split per expert, DeepSeek-V3's names) and
    declares quantization_config as DeepSeek-V3's FP8 release does."""
    for f in checkpoint_files(path):
        tensors, dtypes = {}, {}
        for n, t in load_torch(f).items():
            if not FP8_QUANTISED.search(n) or t.dim() not in (2, 3):
                tensors[n] = t
                continue
            if t.dim() == 2:
                parts = [(n, t)]
            else:  # [E, 2I, H] gate_up (gate first) or [E, H, I] down
                base = n.rsplit(".", 1)[0]
                parts = []
                for e in range(t.shape[0]):
                    if n.endswith("gate_up_proj"):
                        gate, up = t[e].chunk(2, dim=0)
                        parts += [("%s.%d.gate_proj.weight" % (base, e), gate), ("%s.%d.up_proj.weight" % (base, e), up)]
                    else:
                        parts.append(("%s.%d.down_proj.weight" % (base, e), t[e]))
            for pn, w in parts:
                q, deq, scale = _fp8_round(w)
                if not torch.equal(deq.to(torch.bfloat16), w.to(torch.bfloat16)):
                    raise RuntimeError("%s is not FP8-exact after quantise_fp8" % pn)
                tensors[pn], dtypes[pn] = q.contiguous().view(torch.uint8), "F8_E4M3"
                tensors[pn + "_scale_inv"] = scale.contiguous()
        save_file(tensors, f, metadata={"format": "pt"}, dtypes=dtypes)
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as fh:
        cfg = json.load(fh)
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                  "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh, indent=1)


# ---- generation and comparison -------------------------------------------------------------------

def generate(model, prompt, tokens):
    with torch.inference_mode():
        r = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                           output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return r.sequences[0, prompt.shape[1]:].tolist(), torch.stack([lg[0].float() for lg in r.logits])


def forced_logits(model, seq, n):
    """Logits predicting the last n tokens of seq from one forward pass over it (teacher forcing)."""
    with torch.inference_mode():
        out = model(seq, use_cache=False)
    return out.logits[0, -n - 1:-1].float()


def rel_l2(got, want):
    """Relative L2 error of got to want (1 when want is all zeros)."""
    return float((got - want).norm()) / (float(want.norm()) or 1.0)


def with_tokens(prompt, tokens):
    """The prompt followed by generated token ids, one sequence on the prompt's device."""
    return torch.cat([prompt, torch.tensor([tokens], device=prompt.device)], 1)


def compare(ref_tokens, x32_tokens, tokens, exact, hf16, x32, ft16, gen_logits, suppressed=(), keep=None):
    """(ok, text): FreeToken's teacher-forced logits ft16 and transformers' bf16 ones (hf16, and x32
    with the MoE blocks in fp32) against the fp32 model's, exact; then the greedy tokens of
    FreeToken's generate against the reference's (and those of the fp32-blocks model, x32_tokens);
    gen_logits: the logits of those generate steps (before a divergence, on the same sequence as
    exact), part of the rounding noise a near tie is judged by.
    suppressed: token ids generate never picks (the EOS ids, masked while min_new_tokens is not
    reached); the top-1/top-2 margin at a divergence is taken over the other tokens.
    keep: the rows the logit errors are taken over (default all)."""
    n = len(ref_tokens)
    if len(tokens) != n:
        return False, "generated %d tokens, the reference %d" % (len(tokens), n)
    rows = slice(None) if keep is None else keep
    e_ft, e_hf, e_x32 = (rel_l2(t[rows], exact[rows]) for t in (ft16, hf16, x32))
    ok = e_ft <= 2 * max(e_hf, e_x32) + 2e-3
    text = "logits rel L2 to fp32 %.2e (transformers bf16 %.2e, with fp32 MoE blocks %.2e)" % (e_ft, e_hf, e_x32)
    first = next((i for i in range(n) if tokens[i] != ref_tokens[i]), n)
    if first < n:
        pickable = exact[first].clone()
        for t in suppressed:
            if 0 <= t < pickable.numel():
                pickable[t] = float("-inf")
        top2 = pickable.topk(2).values
        margin = float(top2[0] - top2[1])
        noise = max(float((t[first] - exact[first]).abs().max()) for t in (ft16, hf16, x32, gen_logits))
        if margin <= 2 * noise:
            text += "; tokens diverge at step %d at a near tie (fp32 margin %.3g <= 2 x %.3g)" % (first, margin, noise)
        elif tokens == x32_tokens:
            text += ("; tokens diverge at step %d (fp32 margin %.3g, bf16 error %.3g) as the fp32-blocks "
                     "model's do: identical to its tokens" % (first, margin, noise))
        else:
            text += "; tokens DIVERGE at step %d (fp32 margin %.3g, bf16 error %.3g)" % (first, margin, noise)
            ok = False
    else:
        text += "; tokens identical"
    return ok, text


class Fp32Block(torch.nn.Module):
    """A float32 MoE block inside a bf16 model: bf16 in, computed in fp32, bf16 out."""

    def __init__(self, block):
        super().__init__()
        self.inner = block

    def forward(self, x, *args, **kwargs):
        out = self.inner(x.float(), *args, **kwargs)
        if isinstance(out, tuple):
            return (out[0].to(x.dtype),) + tuple(out[1:])
        return out.to(x.dtype)


def fp32_blocks_run(ref16, ref32, names, prompt, seq, n):
    """(greedy tokens, their logits, forced_logits) of a copy of the bf16 model whose modules `names`
    are the fp32 model's."""
    model = copy.deepcopy(ref16)
    blocks = dict(ref32.named_modules())
    for name in names:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, Fp32Block(blocks[name]))
    return (*generate(model, prompt, n), forced_logits(model, seq, n))


def bf16_copy(model):
    """A bf16 copy of a float32 model whose buffers that are not saved (rotary frequencies: computed
    at build, in float32 however the model is loaded) keep their float32 values."""
    out = copy.deepcopy(model).to(torch.bfloat16)
    src = dict(model.named_modules())
    for name, module in out.named_modules():
        for b in module._non_persistent_buffers_set:
            v = src[name]._buffers.get(b)
            if v is not None and v.is_floating_point():
                module._buffers[b] = v.clone()
    return out


def decode_error(exact_model, prompt, tokens, logits, keep=None):
    """Relative L2 of generate's logits (the decode steps: one token per call after the prompt)
    to the fp32 model's on the same sequence (over the steps `keep`, default all)."""
    want = forced_logits(exact_model, with_tokens(prompt, tokens), len(tokens))
    rows = slice(None) if keep is None else keep
    return rel_l2(logits[rows], want[rows])


@contextlib.contextmanager
def recorded_routes():
    """{layer: [expert ids [T, k] of each FreeToken call, in order]} of the calls inside the block."""
    calls, run = {}, ftt.FreeTokenExperts.run

    def recording(self, hidden_states, ids, weights):
        calls.setdefault(self.layer, []).append(ids.reshape(-1, ids.shape[-1]).detach().cpu())
        return run(self, hidden_states, ids, weights)
    ftt.FreeTokenExperts.run = recording
    try:
        yield calls
    finally:
        ftt.FreeTokenExperts.run = run


def forced_with_flips(model, exact_model, names, seq, n):
    """(forced_logits of the offloaded model, {position of seq: [layers]}): the positions whose
    experts in that teacher-forced pass differ from those the model's own MoE blocks (its router, in
    bf16) pick on the fp32 model's inputs to the same blocks, i.e. routing decisions that upstream
    rounding flipped."""
    inputs, hooks = {}, []
    blocks = dict(model.named_modules())
    for name in names:
        def keep(module, args, kwargs, name=name):
            inputs.setdefault(name, (args, kwargs))
        hooks.append(exact_model.get_submodule(name).register_forward_pre_hook(keep, with_kwargs=True))
    try:
        with torch.inference_mode():
            exact_model(seq, use_cache=False)
    finally:
        for h in hooks:
            h.remove()

    def bf16(v):
        return v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() else v
    with recorded_routes() as got:
        logits = forced_logits(model, seq, n)
    with torch.inference_mode(), recorded_routes() as want:
        for name in names:
            args, kwargs = inputs[name]
            blocks[name](*[bf16(a) for a in args], **{k: bf16(v) for k, v in kwargs.items()})
    flips = {}
    for layer, calls in want.items():
        mine = torch.cat(got.get(layer, []) or [torch.empty(0, calls[0].shape[1], dtype=calls[0].dtype)])
        theirs = torch.cat(calls)
        if mine.shape != theirs.shape:
            raise RuntimeError("layer %d: %s routes in the pass, %s on the exact inputs" % (
                layer, list(mine.shape), list(theirs.shape)))
        differ = (mine.sort(dim=1).values != theirs.sort(dim=1).values).any(dim=1)
        for t in differ.nonzero().flatten().tolist():
            flips.setdefault(t % seq.shape[1], []).append(layer)
    return logits, flips


def eos_ids(tcfg):
    """The EOS token ids of a text config (generate masks them until min_new_tokens)."""
    eos = getattr(tcfg, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)


def _first(result):
    return result[0] if isinstance(result, (tuple, list)) else result


def block_check(ref32, model, hidden, seed):
    """Every offloaded MoE block against the same block of the fp32 reference model (its own
    experts) and of a bf16 copy of it (transformers' bf16 error), on random inputs of 1, 8 and 40
    tokens.
    FreeToken's block runs the offloaded model's own router, as the bf16 copy does (which keeps in
    float32 what the offloaded block keeps so), so the two take the same routes: a block whose error
    to fp32 exceeds twice transformers' (+ 2e-3) computes something else, whatever the whole
    model's drift. Returns (ok, text)."""
    ref_blocks = dict(ref32.named_modules())
    g = torch.Generator().manual_seed(seed)
    worst_ft, worst_hf, worst_name, bad = 0.0, 0.0, "", []
    for name, block in model.named_modules():
        if not hasattr(block, "_freetoken"):
            continue
        ref = ref_blocks.get(name)
        if ref is None:
            return False, "block check: the reference model has no module '%s'" % name
        ref16 = copy.deepcopy(ref).to(torch.bfloat16)
        # parameters the offloaded model keeps in float32 (a router transformers keeps so) alike here
        kept = {n for n, p in block.named_parameters() if p.dtype == torch.float32}
        exact = dict(ref.named_parameters())
        for n, p in ref16.named_parameters():
            if n in kept:
                p.data = exact[n].data.float().clone()
        for tokens in (1, 8, PROMPT + 32):  # decode, a small batch, a prompt-sized call
            x = torch.randn(1, tokens, hidden, generator=g).to(torch.bfloat16).to(next(ref.parameters()).device)
            with torch.inference_mode():
                want = _first(ref(x.float())).float()
                hf = _first(ref16(x)).float()
                got = _first(block(x)).float()
            e_ft, e_hf = rel_l2(got, want), rel_l2(hf, want)
            if e_ft - 2 * e_hf > worst_ft - 2 * worst_hf or not worst_name:
                worst_ft, worst_hf, worst_name = e_ft, e_hf, "%s, %d token%s" % (name, tokens, "s" * (tokens > 1))
            if e_ft > 2 * e_hf + 2e-3:
                bad.append(name)
        del ref16
    text = "MoE blocks vs fp32: FreeToken %.2e, transformers bf16 %.2e (worst: %s)" % (worst_ft, worst_hf, worst_name)
    if bad:
        text += "; blocks DIFFER: %s" % ", ".join(sorted(set(bad)))
    return not bad, text


def graph_check(model, hidden):
    """Captures every offloaded MoE block's one-token step in one CUDA graph; replays against eager."""
    blocks = [m for m in model.modules() if hasattr(m, "_freetoken")]
    dev = next(p.device for p in model.parameters() if p.device.type == "cuda")
    x = torch.zeros(1, 1, hidden, device=dev, dtype=torch.bfloat16)

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
    for _ in range(4):
        with torch.inference_mode():
            x.normal_(0, 1)
            graph.replay()
            torch.cuda.synchronize()
            replayed = [s.float().clone() for s in static]
            eager = [e.float() for e in step()]
            torch.cuda.synchronize()
        for a, b in zip(replayed, eager):
            worst = max(worst, float((a - b).norm() / b.norm().clamp(min=1e-30)))
    return worst <= 1e-2, "graph of %d MoE blocks, replay vs eager rel L2 %.2e" % (len(blocks), worst)


def load_reference(cls, path, dtype):
    """transformers' own from_pretrained of a saved case, on the GPU, eager attention."""
    try:
        model = cls.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    except TypeError:
        model = cls.from_pretrained(path, torch_dtype=dtype, attn_implementation="eager")
    return model.cuda().eval()


def reference_models(model, cls, path, prompt):
    """(fp32 model, bf16 model, note): transformers' from_pretrained of the saved case in both dtypes;
    where that reload cannot generate, the built float32 model and its bf16_copy, with a note."""
    try:
        ref16 = load_reference(cls, path, torch.bfloat16)
        generate(ref16, prompt, 2)
        return load_reference(cls, path, torch.float32), ref16, ""
    except Exception as e:  # noqa: BLE001 - transformers' reload of its own tiny config
        gc.collect()
        ref = model.cuda().eval()
        return ref, bf16_copy(ref), "; reference built in memory (transformers' reload: %s: %s)" % (
            type(e).__name__, str(e)[:100])


def offloaded_model(cls, path, backend, cache_fraction, engine, params):
    """(model, note): freetoken.torch.from_pretrained (meta build, experts replaced, non-expert weights
    from the checkpoint); where it cannot map a non-expert tensor name, transformers' own
    from_pretrained and offload_experts, said in the note."""
    kwargs = dict(params, cache_fraction=cache_fraction, engine=engine)
    try:
        return ftt.from_pretrained(path, backend=backend, device="cuda", model_class=cls,
                                   attn_implementation="eager", **kwargs), ""
    except ft.Error as e:
        if e.status != ft.FT_ERR_FORMAT or not ("no tensor for" in e.message or "has shape" in e.message):
            raise
        why = e.message
    gc.collect()
    model = load_reference(cls, path, torch.bfloat16)
    ftt.offload_experts(model, path, backend=backend, **kwargs)
    return model, "; non-expert weights read by transformers (freetoken.torch.from_pretrained: %s)" % why[:200]


def run_case(name, spec, args, root, results, engine):
    model_type, extra, opts = spec
    preset = dict(zip(("hidden", "inter", "layers"), args.geometry))
    if opts.get("mxfp4"):
        preset["inter"] = max(64, (preset["inter"] + 31) // 32 * 32)
    if opts.get("fp8"):  # the FreeToken fp8_block format's experts are whole 128x128 blocks
        preset["hidden"] = max(256, -(-preset["hidden"] // 128) * 128)
        preset["inter"] = max(128, -(-preset["inter"] // 128) * 128)
    t0 = time.time()
    try:
        model, tcfg = build(name, model_type, extra, opts, preset)
    except Skipped as e:
        results.append((name, "-", "SKIP", str(e)))
        print("%-20s %-8s %-4s %s" % results[-1], flush=True)
        return
    H = tcfg.hidden_size
    path = os.path.join(root, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    quantised = quantise_mxfp4(model, H, preset["inter"]) if opts.get("mxfp4") else None
    if opts.get("fp8"):
        quantise_fp8(model)
    golden_model.save_checkpoint(model, path, torch.bfloat16)
    cls = type(model)
    vocab = tcfg.vocab_size
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) + 7)
    prompt = torch.randint(3, vocab, (1, PROMPT), generator=g).cuda()
    try:
        # the bf16 model, and the same weights, exactly, in fp32 (ref: also block_check's reference)
        ref, ref16, how = reference_models(model, cls, path, prompt)
        ref_tokens, ref_logits = generate(ref16, prompt, args.tokens)
        seq = with_tokens(prompt, ref_tokens)
        hf16 = forced_logits(ref16, seq, args.tokens)
        exact = forced_logits(ref, seq, args.tokens)
    except Exception as e:  # noqa: BLE001 - transformers' own model, before FreeToken takes part
        traceback.print_exc()
        results.append((name, "-", "SKIP", "transformers' bf16 model cannot generate here: %s: %s" % (
            type(e).__name__, str(e)[:160])))
        print("%-20s %-8s %-4s %s" % results[-1], flush=True)
        return
    # what FreeToken reads is the release's form: quantised tensors, its own model_type (transformers'
    # reference above read the bf16 checkpoint under transformers' model_type)
    if quantised:
        write_mxfp4(path, quantised)
    if opts.get("fp8"):
        write_fp8(path)
    if opts.get("saved_as"):
        golden_model.relabel(os.path.join(path, "config.json"), model_type, opts["saved_as"])
    torch.cuda.empty_cache()
    del model
    # the fp32-blocks model's tokens, their logits and its forced logits, once the offloaded model
    # names its MoE blocks; dec_ref: the larger decode-step error of it and of the bf16 reference
    x32, dec_ref = None, None
    built_in = time.time() - t0
    for backend in args.backends.split(","):
        t1 = time.time()
        model = None
        try:
            model, note = offloaded_model(cls, path, backend, 0.0 if backend == "gpu" else args.cache_fraction,
                                          engine, args.params)
            tokens, logits = generate(model, prompt, args.tokens)
            if x32 is None:
                names = [n for n, m in model.named_modules() if hasattr(m, "_freetoken")]
                x32 = fp32_blocks_run(ref16, ref, names, prompt, seq, args.tokens)
                dec_ref = max(rel_l2(ref_logits, exact), decode_error(ref, prompt, x32[0], x32[1]))
            # Logit rows at positions where a routing decision flipped are left out of the logit
            # bounds (a flip swaps whole experts; the router is the model's own, its inputs differ by
            # rounding); the tokens are still judged there, and the flips are listed.
            ft16, flips = forced_with_flips(model, ref, names, seq, args.tokens)
            first_row = seq.shape[1] - args.tokens - 1
            keep = [r for r in range(args.tokens) if first_row + r not in flips]
            ok, text = compare(ref_tokens, x32[0], tokens, exact, hf16, x32[2], ft16, logits, eos_ids(tcfg),
                               keep=keep)
            # the decode steps (the teacher-forced pass above is one prefill-sized call): FreeToken's
            # rows without a flip, found on the reference's sequence or, where FreeToken generated
            # other tokens, on its own; the bound, the transformers models' errors over every row
            dec_keep, own_flips = keep, {}
            if tokens != ref_tokens:
                _, own_flips = forced_with_flips(model, ref, names, with_tokens(prompt, tokens), args.tokens)
                dec_keep = [r for r in range(args.tokens) if first_row + r not in own_flips]
            dec = decode_error(ref, prompt, tokens, logits, dec_keep)
            ok = ok and dec <= 2 * dec_ref + 2e-3
            text += "; decode-step logits rel L2 to fp32 %.2e (transformers bf16 / fp32 blocks: up to %.2e)" % (
                dec, dec_ref)
            if flips:
                text += "; routes flipped at positions %s (layers; the rows left out of the logit bounds)" % (
                    {p: flips[p] for p in sorted(flips)})
            if own_flips:
                text += "; on its own tokens at %s (left out of the decode-step bound)" % (
                    {p: own_flips[p] for p in sorted(own_flips)})
            try:
                bok, btext = block_check(ref, model, H, zlib.crc32(name.encode()) + 11)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                bok, btext = False, "block check failed: %s: %s" % (type(e).__name__, e)
            ok, text = ok and bok, text + "; " + btext
            try:
                gok, gtext = graph_check(model, H)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                gok, gtext = False, "graph capture failed: %s: %s" % (type(e).__name__, e)
            ok, text = ok and gok, text + "; " + gtext + note + how
        except Exception as e:  # noqa: BLE001 - a failure of one case is reported, the others still run
            traceback.print_exc()
            ok, text = False, "%s: %s" % (type(e).__name__, e)
        finally:
            offload = getattr(model, "freetoken_offload", None)
            if offload is not None:
                offload.close()
            del model
            gc.collect()
            torch.cuda.empty_cache()
        results.append((name, backend, "ok" if ok else "FAIL",
                        "%s (%.1f s + %.1f s)" % (text, built_in, time.time() - t1)))
        built_in = 0.0
        print("%-20s %-8s %-4s %s" % results[-1], flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default="", help="case names or model types (default: every case)")
    ap.add_argument("--backends", default="gpu,offload,hybrid")
    ap.add_argument("--tokens", type=int, default=32)
    first = golden_cases.SIZE_PRESETS[0]
    ap.add_argument("--geometry", default="%d,%d,%d" % (first["hidden"], first["inter"], first["layers"]),
                    help="hidden,intermediate,layers (default: the golden tool's first preset)")
    # The slot cache holds at least one layer's experts; 0.6 of 3 layers x 8 experts is 14 slots of 24:
    # layer switches evict.
    ap.add_argument("--cache-fraction", type=float, default=0.6)
    ap.add_argument("--param", action="append", default=[], metavar="FIELD=VALUE",
                    help="an ft_session_params field for every offloaded model (e.g. hybrid_adaptive=0); repeatable")
    ap.add_argument("--keep", help="write the checkpoints here and keep them")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args()
    args.geometry = [int(v) for v in args.geometry.split(",")]
    try:
        args.params = {k: json.loads(v) for k, v in (p.split("=", 1) for p in args.param)}
    except ValueError:
        ap.error("--param takes FIELD=VALUE with a JSON value (a number, true, false)")
    all_cases = cases()
    if args.list:
        for n, (mt, _, opts) in all_cases.items():
            print("%-20s %-16s %s" % (n, mt, opts))
        return 0
    wanted = [w for w in args.archs.split(",") if w]
    # A name that is a case selects that case only; another name selects every case of that model type.
    by_type = [w for w in wanted if w not in all_cases]
    selected = [(n, s) for n, s in all_cases.items() if not wanted or n in wanted or s[0] in by_type]
    unknown = [w for w in wanted if all(w != n and w != s[0] for n, s in all_cases.items())]
    if unknown:
        ap.error("unknown case or model type: %s (see --list)" % ", ".join(unknown))
    print("torch", torch.__version__, "transformers", transformers.__version__, "freetoken", ft.version(),
          "from", *ft.library_path())
    if not ft.build_info()["cuda"]:
        skip("this libfreetoken was built without CUDA")
    root = args.keep or tempfile.mkdtemp(prefix="ft_gpu_generate_")
    results, t0 = [], time.time()
    engine = ft.Engine(device=torch.cuda.current_device())  # one for every session of the run
    try:
        for name, spec in selected:
            try:
                run_case(name, spec, args, root, results, engine)
            except Exception as e:  # noqa: BLE001 - building or the reference failed: this case only
                traceback.print_exc()
                results.append((name, "-", "FAIL", "building the case or its reference: %s: %s" % (
                    type(e).__name__, e)))
                print("%-20s %-8s %-4s %s" % results[-1], flush=True)
                gc.collect()
                torch.cuda.empty_cache()
    finally:
        engine.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print("\n%-20s %-8s %-4s %s" % ("case", "backend", "", "result"))
    for r in results:
        print("%-20s %-8s %-4s %s" % r)
    count = {s: sum(1 for r in results if r[2] == s) for s in ("ok", "FAIL", "SKIP")}
    print("\n%d ok, %d FAIL, %d SKIP in %.0f s" % (count["ok"], count["FAIL"], count["SKIP"], time.time() - t0))
    if results and all(r[2] == "SKIP" for r in results):
        return SKIP
    return 1 if count["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
