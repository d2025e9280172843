// The per-architecture readers of config.json: each reads its family's expert geometry, MoE
// layer selection, routing rule and shared expert under transformers' field names (aliases
// included) and defaults. docs/ARCHITECTURE.md describes every rule.
#include <algorithm>

#include "config_fields.hpp"

namespace ft::config {

namespace {

void all_layers(ModelSpec &spec) {
    for (int32_t l = 0; l < spec.total_layers; ++l) spec.moe_layers.push_back(l);
}

// Qwen-MoE style layer selection: layers listed in mlp_only_layers are dense, and of the rest
// every decoder_sparse_step-th (counting from 1) is MoE.
void qwen_moe_layers(ReadContext &c) {
    const int32_t step = c.f.opt_int("decoder_sparse_step", 1);
    if (step <= 0) fail(FT_ERR_FORMAT, c.where(), ": field 'decoder_sparse_step' = ", step, " must be positive");
    std::vector<bool> dense(static_cast<size_t>(c.spec.total_layers), false);  // total <= limits::kMaxLayers
    for (int32_t l : c.f.opt_int_list("mlp_only_layers"))
        if (l >= 0 && l < c.spec.total_layers) dense[static_cast<size_t>(l)] = true;
    for (int32_t l = 0; l < c.spec.total_layers; ++l)
        if (!dense[static_cast<size_t>(l)] && c.spec.num_experts > 0 && (l + 1) % step == 0) c.spec.moe_layers.push_back(l);
}

// DeepSeek style: layers from first_k_dense_replace on, every moe_layer_freq-th.
void dense_then_moe_layers(ReadContext &c, int32_t first_dense_default, bool with_freq) {
    const int32_t first_dense = c.f.opt_int("first_k_dense_replace", first_dense_default);
    const int32_t freq = with_freq ? c.f.opt_int("moe_layer_freq", 1) : 1;
    if (freq <= 0) fail(FT_ERR_FORMAT, c.where(), ": field 'moe_layer_freq' = ", freq, " must be positive");
    if (first_dense < 0) fail(FT_ERR_FORMAT, c.where(), ": field 'first_k_dense_replace' must not be negative");
    // Layers >= num_hidden_layers (the MTP / next-token-prediction layers) are not decoder layers.
    for (int32_t l = first_dense; l < c.spec.total_layers; ++l)
        if (l % freq == 0) c.spec.moe_layers.push_back(l);
}

int32_t softmax_rule(bool renormalize) {
    return renormalize ? FT_ROUTING_SOFTMAX_TOPK_RENORM : FT_ROUTING_SOFTMAX_TOPK;
}

// Qwen3-MoE (and the Qwen3-VL / Qwen3.5 / 3.6 text towers): softmax top-k, renormalised when
// norm_topk_prob; Qwen2-MoE and Qwen3-Next add a shared expert behind a sigmoid gate.
void read_qwen_moe(ReadContext &c) {
    ModelSpec &s = c.spec;
    const std::string &mt = c.model_type;
    s.num_experts = c.f.req_int_any({"num_experts", "num_local_experts"});
    s.intermediate = c.f.req_int("moe_intermediate_size");
    const bool qwen35 = s.architecture == "qwen3_5_moe";
    const bool norm_default = mt != "qwen3_moe" && mt != "qwen2_moe";
    // Qwen3.5/3.6 renormalise whatever the config says.
    s.routing.rule = softmax_rule(qwen35 || c.f.opt_bool("norm_topk_prob", norm_default));
    if (s.architecture == "qwen2_moe" || s.architecture == "qwen3_next" || qwen35) {
        s.shared_intermediate = qwen35 ? c.f.req_int("shared_expert_intermediate_size")
                                       : c.f.opt_int("shared_expert_intermediate_size", 0);
        if (s.shared_intermediate < 0)
            fail(FT_ERR_FORMAT, c.where(), ": field 'shared_expert_intermediate_size' must not be negative");
        s.shared_expert_gate = s.shared_intermediate > 0;
    }
    qwen_moe_layers(c);
}

// OLMoE / FlexOlmo: softmax top-k (renormalised when norm_topk_prob), every layer MoE.
void read_olmoe(ReadContext &c) {
    c.spec.num_experts = c.f.req_int_any({"num_experts", "num_local_experts"});
    c.spec.intermediate = c.f.req_int("intermediate_size");
    c.spec.routing.rule = softmax_rule(c.f.opt_bool("norm_topk_prob", false));
    all_layers(c.spec);
}

// Mixtral and MiniMax(-Text): softmax, top-k, renormalised; every layer MoE.
void read_mixtral(ReadContext &c) {
    c.spec.num_experts = c.f.req_int_any({"num_local_experts", "num_experts"});
    c.spec.intermediate = c.f.req_int("intermediate_size");
    c.spec.routing.rule = FT_ROUTING_SOFTMAX_TOPK_RENORM;
    all_layers(c.spec);
}

// PhiMoE: Mixtral's layout with the sparsemixer routing of inference (router_jitter_noise is its
// margin).
void read_phimoe(ReadContext &c) {
    read_mixtral(c);
    c.spec.routing.rule = FT_ROUTING_SPARSEMIXER;
    c.spec.routing.jitter_eps = static_cast<float>(c.f.opt_number("router_jitter_noise", 0.01));
}

// MiniMax-M2: sigmoid scores, selection on score + e_score_correction_bias, renormalised.
void read_minimax_m2(ReadContext &c) {
    read_mixtral(c);
    RoutingSpec &r = c.spec.routing;
    r.rule = FT_ROUTING_SIGMOID_GROUP_TOPK;
    r.num_groups = r.topk_groups = 1;
    r.renormalize = true;
    r.routed_scaling_factor = static_cast<float>(c.f.opt_number("routed_scaling_factor", 1.0));
}

// Jamba: softmax top-k without renormalisation on the layers l % expert_layer_period ==
// expert_layer_offset.
void read_jamba(ReadContext &c) {
    ModelSpec &s = c.spec;
    s.num_experts = c.f.req_int_any({"num_experts", "num_local_experts"});
    s.intermediate = c.f.req_int("intermediate_size");
    s.routing.rule = FT_ROUTING_SOFTMAX_TOPK;
    const int32_t period = c.f.opt_int("expert_layer_period", 2), offset = c.f.opt_int("expert_layer_offset", 1);
    if (period <= 0) fail(FT_ERR_FORMAT, c.where(), ": field 'expert_layer_period' = ", period, " must be positive");
    for (int32_t l = 0; l < s.total_layers; ++l)
        if (l % period == offset) s.moe_layers.push_back(l);
}

// The DeepSeek-V3 family's defaults as transformers' config classes give them.
struct DeepseekDefaults {
    int32_t first_dense, n_group, topk_group, n_shared;
    double scaling;
    bool norm, with_freq, scoring_field, shared_at_least_one;
};

// DeepSeek-V3 / Kimi-K2 / GLM-4.x MoE (and GLM-4.xV's text tower) / dots.llm1: sigmoid scores,
// correction-biased selection within the best groups, routed scaling; shared experts of width
// moe_intermediate_size * n_shared_experts.
void read_deepseek_v3_family(ReadContext &c, const DeepseekDefaults &d) {
    ModelSpec &s = c.spec;
    RoutingSpec &r = s.routing;
    s.num_experts = c.f.req_int_any({"n_routed_experts", "num_local_experts"});
    s.intermediate = c.f.req_int("moe_intermediate_size");
    dense_then_moe_layers(c, d.first_dense, d.with_freq);
    const int32_t n_shared = c.f.opt_int("n_shared_experts", d.n_shared);
    if (n_shared < 0) fail(FT_ERR_FORMAT, c.where(), ": field 'n_shared_experts' must not be negative");
    // GLM-4.x always has a shared expert, of width I * max(1, n_shared_experts).
    s.shared_intermediate = shared_width(s.intermediate, d.shared_at_least_one ? std::max(1, n_shared) : n_shared,
                                         c.where(), "moe_intermediate_size * n_shared_experts");
    r.num_groups = c.f.opt_int("n_group", d.n_group);
    r.topk_groups = c.f.opt_int("topk_group", d.topk_group);
    r.routed_scaling_factor = static_cast<float>(c.f.opt_number("routed_scaling_factor", d.scaling));
    const bool norm = c.f.opt_bool("norm_topk_prob", d.norm);
    const std::string scoring = d.scoring_field ? c.f.opt_string("scoring_func", "sigmoid") : "sigmoid";
    if (scoring == "sigmoid") {
        r.rule = FT_ROUTING_SIGMOID_GROUP_TOPK;
        r.renormalize = norm;
    } else if (scoring == "softmax") {
        // Softmax scoring is served only without group limits or scaling, which the softmax
        // rules do not apply (DeepSeek-V2 checkpoints load as deepseek_v2).
        if (r.topk_groups < r.num_groups || r.routed_scaling_factor != 1.0f)
            fail(FT_ERR_UNSUPPORTED, c.where(), ": scoring_func 'softmax' with group-limited selection or "
                 "routed_scaling_factor != 1 is not supported");
        r.rule = softmax_rule(norm);
        r.num_groups = r.topk_groups = 1;
    } else {
        fail(FT_ERR_UNSUPPORTED, c.where(), ": scoring_func '", scoring, "' is not supported (sigmoid, softmax)");
    }
}

void read_deepseek_v3(ReadContext &c) { read_deepseek_v3_family(c, {3, 8, 4, 1, 2.5, true, true, true, false}); }
void read_glm4_moe(ReadContext &c) { read_deepseek_v3_family(c, {1, 1, 1, 1, 1.0, true, false, false, true}); }
void read_dots1(ReadContext &c) { read_deepseek_v3_family(c, {0, 1, 1, 0, 1.0, false, false, false, false}); }

// DeepSeek-V2 / V2-Lite: softmax probabilities; topk_method greedy (all experts) or
// group_limited_greedy (the topk_group groups with the best single probability); weights the
// probabilities times routed_scaling_factor. transformers does not renormalise here whatever
// norm_topk_prob says, and neither does this rule.
void read_deepseek_v2(ReadContext &c) {
    ModelSpec &s = c.spec;
    RoutingSpec &r = s.routing;
    s.num_experts = c.f.req_int("n_routed_experts");
    s.intermediate = c.f.req_int("moe_intermediate_size");
    dense_then_moe_layers(c, 0, true);
    const int32_t n_shared = c.f.opt_int("n_shared_experts", 0);
    if (n_shared < 0) fail(FT_ERR_FORMAT, c.where(), ": field 'n_shared_experts' must not be negative");
    s.shared_intermediate = shared_width(s.intermediate, n_shared, c.where(), "moe_intermediate_size * n_shared_experts");
    r.rule = FT_ROUTING_SOFTMAX_GROUP_TOPK;
    r.renormalize = false;
    r.routed_scaling_factor = static_cast<float>(c.f.opt_number("routed_scaling_factor", 1.0));
    const std::string method = c.f.opt_string("topk_method", "greedy");
    if (method == "greedy") {
        r.num_groups = r.topk_groups = 1;
    } else if (method == "group_limited_greedy") {
        r.num_groups = c.f.req_int("n_group");
        r.topk_groups = c.f.req_int("topk_group");
    } else {
        fail(FT_ERR_UNSUPPORTED, c.where(), ": topk_method '", method,
             "' is not supported for deepseek_v2 (greedy, group_limited_greedy)");
    }
    if (c.f.opt_bool("norm_topk_prob", false))
        log(FT_LOG_INFO, c.where(), ": norm_topk_prob is true; DeepSeek-V2 routing does not renormalise (as "
            "transformers)");
}

// gpt-oss: every layer MoE; experts use the clamped SwiGLU with alpha 1.702 and biases; the
// router takes the top-k logits (plus its bias) and softmaxes over those k.
void read_gpt_oss(ReadContext &c) {
    ModelSpec &s = c.spec;
    s.num_experts = c.f.req_int_any({"num_local_experts", "num_experts"});
    s.intermediate = c.f.req_int("intermediate_size");
    s.activation = FT_ACT_SWIGLU_CLAMP;
    s.swiglu_alpha = 1.702f;
    s.swiglu_limit = static_cast<float>(c.f.opt_number("swiglu_limit", 7.0));
    s.routing.rule = FT_ROUTING_TOPK_SOFTMAX;
    all_layers(s);
}

// Llama-4 (text): top-k (top-1) of the logits with sigmoid weights that scale the expert's
// input; a shared expert of width intermediate_size on every MoE layer. MoE layers are
// moe_layers when listed, else every interleave_moe_layer_step-th layer.
void read_llama4(ReadContext &c) {
    ModelSpec &s = c.spec;
    s.num_experts = c.f.req_int_any({"num_local_experts", "num_experts"});
    s.intermediate = c.f.req_int("intermediate_size");
    s.routing.rule = FT_ROUTING_TOPK_SIGMOID;
    s.route_weight = FT_ROUTE_WEIGHT_INPUT;
    s.shared_intermediate = s.intermediate;
    if (c.f.has("moe_layers")) {
        for (int32_t l : c.f.opt_int_list("moe_layers"))
            if (l >= 0 && l < s.total_layers) s.moe_layers.push_back(l);
        std::sort(s.moe_layers.begin(), s.moe_layers.end());
        s.moe_layers.erase(std::unique(s.moe_layers.begin(), s.moe_layers.end()), s.moe_layers.end());
    } else {
        const int32_t step = c.f.opt_int("interleave_moe_layer_step", 1);
        if (step <= 0)
            fail(FT_ERR_FORMAT, c.where(), ": field 'interleave_moe_layer_step' = ", step, " must be positive");
        for (int32_t l = step - 1; l < s.total_layers; l += step) s.moe_layers.push_back(l);
    }
}

// GraniteMoE (-Shared, -Hybrid): top-k of the logits, softmax over the k; every layer MoE; the
// Shared/Hybrid releases add an ungated shared MLP of width shared_intermediate_size.
void read_granite(ReadContext &c) {
    ModelSpec &s = c.spec;
    s.num_experts = c.f.req_int_any({"num_local_experts", "num_experts"});
    s.intermediate = c.f.req_int("intermediate_size");
    s.routing.rule = FT_ROUTING_TOPK_SOFTMAX;
    s.shared_intermediate = c.f.opt_int("shared_intermediate_size", 0);
    if (s.shared_intermediate < 0)
        fail(FT_ERR_FORMAT, c.where(), ": field 'shared_intermediate_size' must not be negative");
    all_layers(s);
}

// ERNIE-4.5 MoE: softmax probabilities, selection on probability + correction bias, the
// unbiased probabilities renormalised; MoE on layers start..end (inclusive) with (l + 1) %
// interval == 0; shared experts of width moe_intermediate_size * moe_num_shared_experts.
void read_ernie(ReadContext &c) {
    ModelSpec &s = c.spec;
    s.num_experts = c.f.req_uniform_int("moe_num_experts");
    s.intermediate = c.f.req_uniform_int("moe_intermediate_size");
    if (c.f.opt_bool("use_bias", false))
        fail(FT_ERR_UNSUPPORTED, c.where(), ": use_bias true (biased expert projections) is not supported for "
             "ernie4_5_moe");
    s.routing.rule = FT_ROUTING_SOFTMAX_BIASED_TOPK;
    s.routing.renormalize = true;
    s.shared_intermediate = shared_width(s.intermediate, c.f.opt_int("moe_num_shared_experts", 0), c.where(),
                                         "moe_intermediate_size * moe_num_shared_experts");
    const int32_t start = c.f.opt_int("moe_layer_start_index", 1);
    int32_t end = c.f.opt_int("moe_layer_end_index", -1);
    if (end < 0) end = s.total_layers - 1;
    const int32_t interval = c.f.opt_int("moe_layer_interval", 1);
    if (interval <= 0) fail(FT_ERR_FORMAT, c.where(), ": field 'moe_layer_interval' = ", interval, " must be positive");
    for (int32_t l = std::max(0, start); l <= end && l < s.total_layers; ++l)
        if ((l + 1) % interval == 0) s.moe_layers.push_back(l);
}

// Hunyuan-A13B (hunyuan_v1_moe): softmax top-k, renormalised (a top-1 route weighs 1); every
// layer has the routed experts and one shared MLP, both of width intermediate_size.
void read_hunyuan(ReadContext &c) {
    ModelSpec &s = c.spec;
    s.num_experts = c.f.req_uniform_int("num_experts");
    s.intermediate = c.f.req_int("intermediate_size");
    s.routing.rule = FT_ROUTING_SOFTMAX_TOPK_RENORM;
    s.shared_intermediate = s.intermediate;
    all_layers(s);
}

// DeepSeek-V4: field names as transformers writes them, or as DeepSeek's own inference configs
// do (moe_inter_dim, n_dense_layers, score_func, route_scale, ...). Routed experts are ds_fp4
// whatever quantization_config says (it describes the other weights).
void read_deepseek_v4(ReadContext &c) {
    ModelSpec &s = c.spec;
    RoutingSpec &r = s.routing;
    const Fields &f = c.f;
    s.format = Format::ds_fp4;
    s.num_experts = f.req_int("n_routed_experts");
    s.intermediate = f.req_int_any({"moe_intermediate_size", "moe_inter_dim"});
    const int32_t first_dense = f.opt_int_any({"first_k_dense_replace", "n_dense_layers"}, 0);
    if (first_dense < 0) fail(FT_ERR_FORMAT, c.where(), ": field 'first_k_dense_replace' must not be negative");
    // MTP layers (index >= num_hidden_layers) are skipped.
    for (int32_t l = first_dense; l < s.total_layers; ++l) s.moe_layers.push_back(l);
    // The experts' SwiGLU clamps gate and up at swiglu_limit (0 or absent: no clamp). The ds_fp4
    // kernels apply it with FT_ACT_SILU; there is no separate public activation for it.
    s.activation = FT_ACT_SILU;
    s.swiglu_limit = static_cast<float>(f.opt_number("swiglu_limit", 0.0));
    r.num_groups = f.opt_int_any({"n_group", "n_expert_groups"}, 1);
    r.topk_groups = f.opt_int_any({"topk_group", "n_limited_groups"}, 1);
    const char *scale_field = f.first_of({"routed_scaling_factor", "route_scale"});
    r.routed_scaling_factor = static_cast<float>(scale_field ? f.opt_number(scale_field, 1.0) : 1.0);
    const char *score_field = f.first_of({"scoring_func", "score_func"});
    const std::string scoring = score_field ? f.opt_string(score_field, "") : "sqrtsoftplus";
    if (scoring == "softmax") {
        // Selection on probability + gate.bias; the unbiased probabilities, not renormalised,
        // times route_scale.
        r.rule = FT_ROUTING_SOFTMAX_BIASED_TOPK;
        r.renormalize = false;
        r.num_groups = r.topk_groups = 1;
    } else if (scoring == "sigmoid" || scoring == "sqrtsoftplus") {
        r.rule = scoring == "sigmoid" ? FT_ROUTING_SIGMOID_GROUP_TOPK : FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK;
        r.renormalize = true;
    } else {
        fail(FT_ERR_UNSUPPORTED, c.where(), ": score function '", scoring,
             "' is not supported (softmax, sigmoid, sqrtsoftplus)");
    }
    // The first n_hash_layers decoder layers select their experts by token id (tid2eid, read by
    // the loader); those of them that are MoE layers are MoE layers 0 .. hash_layers-1.
    const int32_t hash_decoder = f.opt_int_any({"n_hash_layers", "num_hash_layers"}, 0);
    if (hash_decoder < 0 || hash_decoder > s.total_layers)
        fail(FT_ERR_FORMAT, c.where(), ": field 'n_hash_layers' = ", hash_decoder, " must be in [0, num_hidden_layers = ",
             s.total_layers, "]");
    s.hash_layers = std::max(0, hash_decoder - first_dense);
    if (s.hash_layers > 0) {
        s.vocab_size = f.req_int("vocab_size");
        if (s.vocab_size <= 0 || s.vocab_size > (1 << 24))
            fail(FT_ERR_FORMAT, c.where(), ": field 'vocab_size' = ", s.vocab_size, " must be in [1, 2^24]");
    }
    // The shared expert: an FP8 (e4m3, 128 x 128 block scales) SwiGLU MLP of width
    // n_shared_experts * moe_intermediate_size, dequantised to bf16 at load.
    const int32_t n_shared = f.opt_int("n_shared_experts", 0);
    if (n_shared < 0) fail(FT_ERR_FORMAT, c.where(), ": field 'n_shared_experts' must not be negative");
    if (n_shared > 0) s.shared_intermediate = shared_width(s.intermediate, n_shared, c.where(), "n_shared_experts");
}

}  // namespace

const std::vector<ArchEntry> &arch_table() {
    static const std::vector<ArchEntry> table = {
        {"qwen3_moe", "qwen3_moe", read_qwen_moe},
        {"qwen2_moe", "qwen2_moe", read_qwen_moe},
        {"qwen3_next", "qwen3_next", read_qwen_moe},
        {"qwen3_vl_moe", "qwen3_vl_moe", read_qwen_moe},
        {"qwen3_vl_moe_text", "qwen3_vl_moe", read_qwen_moe},
        {"qwen3_5_moe", "qwen3_5_moe", read_qwen_moe},
        {"qwen3_5_moe_text", "qwen3_5_moe", read_qwen_moe},
        {"qwen3_6_moe", "qwen3_5_moe", read_qwen_moe},
        {"qwen3_6_moe_text", "qwen3_5_moe", read_qwen_moe},
        {"mixtral", "mixtral", read_mixtral},
        {"minimax", "minimax", read_mixtral},
        {"minimax_m2", "minimax_m2", read_minimax_m2},
        {"phimoe", "phimoe", read_phimoe},
        {"olmoe", "olmoe", read_olmoe},
        {"flex_olmo", "flex_olmo", read_olmoe},
        {"jamba", "jamba", read_jamba},
        {"deepseek_v2", "deepseek_v2", read_deepseek_v2},
        {"deepseek_v3", "deepseek_v3", read_deepseek_v3},
        {"kimi_k2", "kimi_k2", read_deepseek_v3},
        {"glm4_moe", "glm4_moe", read_glm4_moe},
        {"glm4v_moe", "glm4v_moe", read_glm4_moe},
        {"glm4v_moe_text", "glm4v_moe", read_glm4_moe},
        {"dots1", "dots1", read_dots1},
        {"gpt_oss", "gpt_oss", read_gpt_oss},
        {"llama4", "llama4", read_llama4},
        {"llama4_text", "llama4", read_llama4},
        {"granitemoe", "granitemoe", read_granite},
        {"granitemoeshared", "granitemoeshared", read_granite},
        {"granitemoehybrid", "granitemoehybrid", read_granite},
        {"ernie4_5_moe", "ernie4_5_moe", read_ernie},
        {"hunyuan_v1_moe", "hunyuan_v1_moe", read_hunyuan},
        {"deepseek_v4", "deepseek_v4", read_deepseek_v4},
    };
    return table;
}

std::string supported_list() {
    std::string out;
    for (const ArchEntry &a : arch_table()) out += std::string(out.empty() ? "" : ", ") + a.model_type;
    return out;
}

int32_t parse_activation(const std::string &act, const std::string &where) {
    if (act == "silu" || act == "swish") return FT_ACT_SILU;
    if (act == "gelu") return FT_ACT_GELU;
    if (act == "gelu_pytorch_tanh" || act == "gelu_tanh" || act == "gelu_new") return FT_ACT_GELU_TANH;
    fail(FT_ERR_UNSUPPORTED, where, ": hidden_act '", act, "' is not supported (silu, gelu, gelu_pytorch_tanh)");
}

int32_t shared_width(int64_t unit, int64_t count, const std::string &where, const char *what) {
    const int64_t w = checked_mul(unit, count, where + ": " + what);
    if (w > limits::kMaxDim)
        fail(FT_ERR_FORMAT, where, ": ", what, " = ", w, " (the shared expert's width) exceeds the limit of ",
             limits::kMaxDim);
    return static_cast<int32_t>(w);
}

}  // namespace ft::config
