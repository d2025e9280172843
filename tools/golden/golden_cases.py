"""The golden cases of make_golden.py: tiny geometries, the transformers model types to build and
the MoE model types discovery skips."""

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


def case_overrides(extra, opts, preset):
    """The config overrides of a case (CASES entry's extra and options) at a geometry preset: the
    common tiny geometry, the case's own fields, "last" as the preset's last decoder layer."""
    overrides = base_overrides(preset, opts.get("num_experts", 8), opts.get("top_k", 2))
    overrides.update(extra)
    for k, v in list(overrides.items()):
        if v == "last":
            overrides[k] = preset["layers"] - 1
    return overrides


# case -> (model_type, extra overrides, options). Options: composite (try the multimodal model
# with a tiny vision tower first), top_k, num_experts, saved_as (the model_type written into the
# saved config.json, for releases that name transformers' architecture differently: the
# transformers model_type is replaced by it as a prefix, so a `*_text` sub-config follows).
CASES = {
    "qwen3_moe": ("qwen3_moe", {"norm_topk_prob": True}, {}),
    "qwen3_moe_nonorm": ("qwen3_moe", {"norm_topk_prob": False, "decoder_sparse_step": 1,
                                       "mlp_only_layers": [0]}, {}),
    "qwen2_moe": ("qwen2_moe", {"norm_topk_prob": False}, {}),
    "qwen3_next": ("qwen3_next", {"norm_topk_prob": True, "full_attention_interval": 2}, {}),
    "qwen3_5_moe": ("qwen3_5_moe", {}, {"composite": True}),
    # Qwen3.6's MoE releases run Qwen3.5-MoE's modules under their own model_type.
    "qwen3_6_moe": ("qwen3_5_moe", {}, {"composite": True, "saved_as": "qwen3_6_moe"}),
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
    # Kimi K2 is DeepSeek-V3's architecture (its release's classes are DeepseekV3*) with one group,
    # routed scaling 2.827 and model_type kimi_k2.
    "kimi_k2": ("deepseek_v3", {"head_dim": 8, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
                                "n_shared_experts": 1, "routed_scaling_factor": 2.827,
                                "norm_topk_prob": True}, {"saved_as": "kimi_k2"}),
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
