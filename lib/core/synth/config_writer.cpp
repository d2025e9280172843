// config.json (and hf_quant_config.json) as each architecture's releases write them: field
// names, nesting, and how a quantised release declares its format.
#include "synth_internal.hpp"

namespace ft::synth::detail {

namespace {

// qwen3_moe at the top level; qwen3_5_moe nests the same fields in text_config beside a vision tower.
ordered_json qwen_config(const Spec &s) {
    const std::string &a = s.architecture;
    ordered_json c;
    ordered_json t;
    t["model_type"] = a == "qwen3_moe" ? "qwen3_moe" : "qwen3_5_moe_text";
    t["hidden_size"] = s.hidden;
    t["intermediate_size"] = s.intermediate * 4;
    t["moe_intermediate_size"] = s.intermediate;
    if (a == "qwen3_5_moe") t["shared_expert_intermediate_size"] = s.shared_intermediate;
    t["num_hidden_layers"] = s.num_layers;
    t["num_attention_heads"] = 4;
    t["num_key_value_heads"] = 2;
    t["num_experts"] = s.num_experts;
    t["num_experts_per_tok"] = s.top_k;
    t["norm_topk_prob"] = s.norm_topk_prob;
    t["decoder_sparse_step"] = 1;
    t["mlp_only_layers"] = s.mlp_only_layers;
    t["hidden_act"] = s.hidden_act;
    t["rms_norm_eps"] = 1e-6;
    t["vocab_size"] = 16;
    t["tie_word_embeddings"] = false;
    if (a == "qwen3_moe") {
        c = t;
        c["architectures"] = {"Qwen3MoeForCausalLM"};
    } else {
        c["architectures"] = {"Qwen3_5MoeForConditionalGeneration"};
        c["model_type"] = "qwen3_5_moe";
        c["text_config"] = t;
        c["vision_config"] = {{"model_type", "qwen3_5_moe"}, {"depth", 1}, {"hidden_size", 8}};
    }
    return c;
}

ordered_json mixtral_config(const Spec &s) {
    ordered_json c;
    c["architectures"] = {"MixtralForCausalLM"};
    c["model_type"] = "mixtral";
    c["hidden_size"] = s.hidden;
    c["intermediate_size"] = s.intermediate;
    c["num_hidden_layers"] = s.num_layers;
    c["num_attention_heads"] = 4;
    c["num_key_value_heads"] = 2;
    c["num_local_experts"] = s.num_experts;
    c["num_experts_per_tok"] = s.top_k;
    c["hidden_act"] = s.hidden_act;
    c["router_aux_loss_coef"] = 0.02;
    c["vocab_size"] = 16;
    return c;
}

ordered_json gpt_oss_config(const Spec &s) {
    ordered_json c;
    c["architectures"] = {"GptOssForCausalLM"};
    c["model_type"] = "gpt_oss";
    c["hidden_size"] = s.hidden;
    c["intermediate_size"] = s.intermediate;
    c["num_hidden_layers"] = s.num_layers;
    c["num_attention_heads"] = 4;
    c["num_key_value_heads"] = 2;
    c["num_local_experts"] = s.num_experts;
    c["num_experts_per_tok"] = s.top_k;
    c["experts_per_token"] = s.top_k;
    c["swiglu_limit"] = 7.0;
    c["hidden_act"] = "silu";
    c["vocab_size"] = 16;
    return c;
}

ordered_json deepseek_v4_config(const Spec &s) {
    ordered_json c;
    c["architectures"] = {"DeepseekV4ForCausalLM"};
    c["model_type"] = "deepseek_v4";
    c["hidden_size"] = s.hidden;
    c["moe_intermediate_size"] = s.intermediate;
    c["num_hidden_layers"] = s.num_layers;
    c["n_routed_experts"] = s.num_experts;
    c["n_shared_experts"] = s.shared_intermediate / s.intermediate;
    c["num_experts_per_tok"] = s.top_k;
    c["first_k_dense_replace"] = s.first_dense;
    c["scoring_func"] = "sigmoid";
    c["n_group"] = s.n_group;
    c["topk_group"] = s.topk_group;
    c["routed_scaling_factor"] = s.routed_scaling_factor;
    c["swiglu_limit"] = 7.0;
    c["n_hash_layers"] = s.hash_layers;
    c["num_nextn_predict_layers"] = s.mtp_layer ? 1 : 0;
    c["vocab_size"] = s.vocab_size;
    return c;
}

// deepseek_v3, kimi_k2, glm4_moe.
ordered_json deepseek_v3_config(const Spec &s) {
    const std::string &a = s.architecture;
    ordered_json c;
    c["architectures"] = {a == "glm4_moe" ? "Glm4MoeForCausalLM" : "DeepseekV3ForCausalLM"};
    c["model_type"] = a;
    c["hidden_size"] = s.hidden;
    c["intermediate_size"] = s.intermediate * 4;
    c["moe_intermediate_size"] = s.intermediate;
    c["num_hidden_layers"] = s.num_layers;
    c["num_attention_heads"] = 4;
    c["n_routed_experts"] = s.num_experts;
    c["n_shared_experts"] = s.shared_intermediate / s.intermediate;
    c["num_experts_per_tok"] = s.top_k;
    c["first_k_dense_replace"] = s.first_dense;
    if (a != "glm4_moe") {
        c["moe_layer_freq"] = 1;
        c["scoring_func"] = "sigmoid";
        c["topk_method"] = "noaux_tc";
    }
    c["n_group"] = s.n_group;
    c["topk_group"] = s.topk_group;
    c["routed_scaling_factor"] = s.routed_scaling_factor;
    c["norm_topk_prob"] = s.norm_topk_prob;
    c["num_nextn_predict_layers"] = s.mtp_layer ? 1 : 0;
    c["hidden_act"] = s.hidden_act;
    c["vocab_size"] = 16;
    return c;
}

// How each quantised release declares itself. DeepSeek-V4's declares FP8 (its other weights);
// its experts are FP4 regardless.
void add_quantization_config(const Spec &s, ordered_json &c) {
    const Format f = parse_format(s.format);
    if (!s.declare_quantization) return;
    if (f == Format::fp8_block || s.architecture == "deepseek_v4")
        c["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                    {"weight_block_size", {128, 128}}};
    else if (f == Format::mxfp4)
        c["quantization_config"] = {{"quant_method", "mxfp4"},
                                    {"modules_to_not_convert", {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                "model.embed_tokens", "lm_head"}}};
    else if (f == Format::nvfp4 && !s.hf_quant_config_file)
        c["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16},
                                    {"ignore", {"lm_head"}}};
}

}  // namespace

ordered_json config_json(const Spec &s) {
    const std::string &a = s.architecture;
    ordered_json c;
    if (a == "qwen3_moe" || a == "qwen3_5_moe")
        c = qwen_config(s);
    else if (a == "mixtral")
        c = mixtral_config(s);
    else if (a == "gpt_oss")
        c = gpt_oss_config(s);
    else if (a == "deepseek_v4")
        c = deepseek_v4_config(s);
    else
        c = deepseek_v3_config(s);
    c["torch_dtype"] = "bfloat16";
    add_quantization_config(s, c);
    return c;
}

std::string hf_quant_config_text(const Spec &s) {
    if (!(s.declare_quantization && s.hf_quant_config_file && parse_format(s.format) == Format::nvfp4)) return {};
    ordered_json h;
    h["producer"] = {{"name", "modelopt"}, {"version", "0.29.0"}};
    h["quantization"] = {{"quant_algo", "NVFP4"}, {"kv_cache_quant_algo", nullptr}, {"group_size", 16},
                         {"exclude_modules", {"lm_head"}}};
    return h.dump(2) + "\n";
}

}  // namespace ft::synth::detail
