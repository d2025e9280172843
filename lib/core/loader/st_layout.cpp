// Where a safetensors checkpoint keeps its routed experts: the decoder layer prefix, each
// architecture's MoE block name, the per-expert projection names, and the stored expert format.
#include <algorithm>

#include "ft/common.hpp"
#include "st_plan.hpp"

namespace ft::load {

namespace {

bool starts_with(const std::string &s, const std::string &p) { return s.compare(0, p.size(), p) == 0; }

bool has_prefix(const std::vector<std::string> &sorted_names, const std::string &prefix) {
    auto it = std::lower_bound(sorted_names.begin(), sorted_names.end(), prefix);
    return it != sorted_names.end() && starts_with(*it, prefix);
}

// The MoE block names an architecture uses, most specific first. Newer transformers rewrite
// Mixtral-derived models' block_sparse_moe as mlp; both are accepted.
std::vector<std::string> block_candidates(const ModelSpec &spec) {
    const std::string &a = spec.architecture;
    if (a == "deepseek_v4") return {"ffn."};
    if (a == "mixtral" || a == "minimax" || a == "minimax_m2" || a == "phimoe") return {"block_sparse_moe.", "mlp."};
    if (a == "granitemoe" || a == "granitemoeshared" || a == "granitemoehybrid") return {"block_sparse_moe.", "mlp."};
    if (a == "llama4" || a == "jamba") return {"feed_forward.", "mlp."};
    return {"mlp."};
}

}  // namespace

std::string find_layer_prefix(const SafetensorsCheckpoint &ckpt, const ModelSpec &spec) {
    // Text-only exports say model.layers.N; multimodal ones put the language model under
    // model.language_model. or language_model.model. (Qwen3-VL/3.5/3.6, GLM-4.xV, Llama-4);
    // DeepSeek-V4 has no model. prefix.
    std::vector<const char *> candidates = {"model.layers.", "model.language_model.layers.",
                                            "language_model.model.layers.", "language_model.layers."};
    if (spec.architecture == "deepseek_v4") candidates = {"layers."};
    const std::vector<std::string> &names = ckpt.names();
    std::vector<std::string> present;
    for (const char *c : candidates)
        if (has_prefix(names, c)) present.push_back(c);
    if (present.size() == 1) return present[0];
    if (present.empty())
        fail(FT_ERR_FORMAT, ckpt.dir(), ": no decoder layer tensors found (looked for ",
             spec.architecture == "deepseek_v4" ? "layers.*" : "model.layers.*, model.language_model.layers.*, "
             "language_model.model.layers.*, language_model.layers.*", ")");
    // Several: keep those that hold the first MoE layer's MoE block.
    std::vector<std::string> with_experts;
    const std::string l0 = std::to_string(spec.moe_layers[0]) + ".";
    for (const std::string &p : present) {
        for (const std::string &block : block_candidates(spec)) {
            if (has_prefix(names, p + l0 + block + "experts.") || has_prefix(names, p + l0 + block + "input_linear.")) {
                with_experts.push_back(p);
                break;
            }
        }
    }
    if (with_experts.size() == 1) return with_experts[0];
    fail(FT_ERR_FORMAT, ckpt.dir(), ": decoder layers appear under both '", present[0], "' and '", present[1],
         "'; cannot tell which is the language model");
}

Block find_block(const SafetensorsCheckpoint &ckpt, const ModelSpec &spec, const std::string &layer_prefix) {
    if (spec.architecture == "deepseek_v4") return {"ffn.", {"w1", "w3", "w2"}};
    const std::vector<std::string> blocks = block_candidates(spec);
    std::string name = blocks[0];
    for (const std::string &b : blocks) {
        if (has_prefix(ckpt.names(), layer_prefix + b + "experts.") ||
            has_prefix(ckpt.names(), layer_prefix + b + "input_linear.")) {
            name = b;
            break;
        }
    }
    // Mixtral's and MiniMax's original exports name the projections w1 (gate), w3 (up), w2 (down).
    if (has_prefix(ckpt.names(), layer_prefix + name + "experts.0.w1.")) return {name, {"w1", "w3", "w2"}};
    return {name, {"gate_proj", "up_proj", "down_proj"}};
}

bool gpt_oss_bf16(const SafetensorsCheckpoint &ckpt, const ModelSpec &spec, const std::string &prefix) {
    if (spec.architecture != "gpt_oss") return false;
    const std::string lp = prefix + std::to_string(spec.moe_layers[0]) + ".";
    return ckpt.contains(lp + find_block(ckpt, spec, lp).name + "experts.gate_up_proj");
}

Format detect_format(const SafetensorsCheckpoint &ckpt, const ModelSpec &spec, const std::string &prefix) {
    const std::string lp = prefix + std::to_string(spec.moe_layers[0]) + ".";
    const Block b = find_block(ckpt, spec, lp);
    const std::string experts = lp + b.name + "experts.";
    Format found = Format::bf16;
    std::string evidence;
    if (spec.architecture == "gpt_oss") {
        if (ckpt.contains(experts + "gate_up_proj_blocks")) {
            found = Format::mxfp4;
            evidence = experts + "gate_up_proj_blocks";
        } else if (!ckpt.contains(experts + "gate_up_proj")) {
            fail(FT_ERR_FORMAT, ckpt.dir(), ": missing tensor '", experts,
                 "gate_up_proj_blocks' (gpt-oss MXFP4 routed experts) or '", experts,
                 "gate_up_proj' (bf16 routed experts)");
        }
    } else {
        const std::string first = experts + "0." + b.proj[0] + ".";
        if (ckpt.contains(first + "weight_scale_2")) {
            found = Format::nvfp4;
            evidence = first + "weight_scale_2";
        } else if (ckpt.contains(first + "weight_scale_inv")) {
            found = Format::fp8_block;
            evidence = first + "weight_scale_inv";
        } else if (spec.architecture == "deepseek_v4") {
            if (!ckpt.contains(first + "scale"))
                fail(FT_ERR_FORMAT, ckpt.dir(), ": missing tensor '", first,
                     "scale' (DeepSeek-V4 FP4 experts carry an e8m0 scale per 32 weights)");
            found = Format::ds_fp4;
            evidence = first + "scale";
        } else if (const Entry *w = ckpt.find(first + "weight")) {
            const StDtype d = w->info->dtype;
            if (d == StDtype::F8_E4M3)
                fail(FT_ERR_FORMAT, w->file->path(), ": tensor '", w->info->name,
                     "' is F8_E4M3 but its block scales '", first, "weight_scale_inv' are missing");
            if (d == StDtype::U8 || d == StDtype::I8)
                fail(FT_ERR_FORMAT, w->file->path(), ": tensor '", w->info->name, "' holds packed ",
                     st_dtype_name(d), " codes but neither '", first, "weight_scale' + 'weight_scale_2' (NVFP4) nor "
                     "a scale tensor is present");
        }
    }
    if (spec.format != Format::bf16 && spec.format != found)
        fail(FT_ERR_FORMAT, ckpt.dir(), ": config.json declares ", format_name(spec.format),
             " experts but the tensors are ", format_name(found),
             evidence.empty() ? std::string() : " ('" + evidence + "')");
    return found;
}

}  // namespace ft::load
