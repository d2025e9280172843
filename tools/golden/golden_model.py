"""Building, re-drawing and saving the tiny random model of a golden case (make_golden.py)."""

import inspect
import json
import os

from golden_cases import CaseSkipped, log


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


def relabel(config_path, model_type, saved_as):
    """Rewrites every model_type of config.json (top level and sub-configs) that starts with
    model_type to start with saved_as instead."""
    with open(config_path) as f:
        cfg = json.load(f)

    def walk(node):
        if isinstance(node, dict):
            v = node.get("model_type")
            if isinstance(v, str) and v.startswith(model_type):
                node["model_type"] = saved_as + v[len(model_type):]
            for child in node.values():
                walk(child)
    walk(cfg)
    with open(config_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
