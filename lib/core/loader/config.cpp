// config.json -> ModelSpec for the supported architectures (docs/ARCHITECTURE.md).
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ft/common.hpp"
#include "ft/json_limits.hpp"
#include "ft/loader.hpp"

namespace ft {

namespace {

using nlohmann::json;

// Typed access to the fields of one JSON object, failing with messages that name the field.
// A field that is present but null counts as absent (transformers writes null for unset values).
class Fields {
public:
    Fields(const json &obj, std::string where) : obj_(obj), where_(std::move(where)) {}

    bool has(const char *name) const {
        auto it = obj_.find(name);
        return it != obj_.end() && !it->is_null();
    }

    int32_t req_int(const char *name) const {
        if (!has(name)) fail(FT_ERR_FORMAT, where_, ": required field '", name, "' is missing");
        return to_int(name);
    }
    int32_t opt_int(const char *name, int32_t def) const { return has(name) ? to_int(name) : def; }

    // The first of `names` present (checkpoints of one family name some fields two ways, e.g.
    // DeepSeek's inference configs say dim / n_layers where transformers says hidden_size /
    // num_hidden_layers). nullptr when none is.
    const char *first_of(std::initializer_list<const char *> names) const {
        for (const char *n : names)
            if (has(n)) return n;
        return nullptr;
    }
    int32_t req_int_any(std::initializer_list<const char *> names) const {
        if (const char *n = first_of(names)) return to_int(n);
        std::string aliases;
        for (auto it = names.begin() + 1; it != names.end(); ++it) aliases += std::string(" or '") + *it + "'";
        fail(FT_ERR_FORMAT, where_, ": required field '", *names.begin(), "'", aliases, " is missing");
    }
    int32_t opt_int_any(std::initializer_list<const char *> names, int32_t def) const {
        const char *n = first_of(names);
        return n ? to_int(n) : def;
    }

    double opt_number(const char *name, double def) const {
        if (!has(name)) return def;
        const json &v = obj_.at(name);
        if (!v.is_number()) type_error(name, "a number");
        return v.get<double>();
    }

    bool opt_bool(const char *name, bool def) const {
        if (!has(name)) return def;
        const json &v = obj_.at(name);
        if (!v.is_boolean()) type_error(name, "true or false");
        return v.get<bool>();
    }

    std::string opt_string(const char *name, const std::string &def) const {
        if (!has(name)) return def;
        const json &v = obj_.at(name);
        if (!v.is_string()) type_error(name, "a string");
        return v.get<std::string>();
    }

    std::vector<int32_t> opt_int_list(const char *name) const {
        std::vector<int32_t> out;
        if (!has(name)) return out;
        const json &v = obj_.at(name);
        if (!v.is_array()) type_error(name, "an array of integers");
        for (const json &e : v) {
            if (!e.is_number_integer() || e.get<int64_t>() < INT32_MIN || e.get<int64_t>() > INT32_MAX)
                type_error(name, "an array of integers");
            out.push_back(static_cast<int32_t>(e.get<int64_t>()));
        }
        return out;
    }

private:
    int32_t to_int(const char *name) const {
        const json &v = obj_.at(name);
        if (!v.is_number_integer()) type_error(name, "an integer");
        if (v.is_number_unsigned() ? v.get<uint64_t>() > INT32_MAX
                                   : (v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX))
            fail(FT_ERR_FORMAT, where_, ": field '", name, "' = ", json_brief(v), " is out of range");
        return static_cast<int32_t>(v.get<int64_t>());
    }

    [[noreturn]] void type_error(const char *name, const char *what) const {
        fail(FT_ERR_FORMAT, where_, ": field '", name, "' must be ", what, ", got ", json_brief(obj_.at(name)));
    }

    const json &obj_;
    std::string where_;
};

int32_t parse_activation(const std::string &act, const std::string &where) {
    if (act == "silu" || act == "swish") return FT_ACT_SILU;
    if (act == "gelu") return FT_ACT_GELU;
    if (act == "gelu_pytorch_tanh" || act == "gelu_tanh" || act == "gelu_new") return FT_ACT_GELU_TANH;
    fail(FT_ERR_UNSUPPORTED, where, ": hidden_act '", act, "' is not supported (silu, gelu, gelu_pytorch_tanh)");
}

// model_type from the class name when a config has no model_type (older exports).
std::string model_type_from_architectures(const json &cfg) {
    auto it = cfg.find("architectures");
    if (it == cfg.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) return "";
    const std::string a = (*it)[0].get<std::string>();
    if (a == "Qwen3MoeForCausalLM") return "qwen3_moe";
    if (a.rfind("Qwen3_5Moe", 0) == 0) return "qwen3_5_moe";
    if (a == "MixtralForCausalLM") return "mixtral";
    if (a == "DeepseekV3ForCausalLM") return "deepseek_v3";
    if (a == "Glm4MoeForCausalLM") return "glm4_moe";
    if (a == "GptOssForCausalLM") return "gpt_oss";
    return "";
}

// Qwen3-MoE style layer selection: layers listed in mlp_only_layers are dense, and of the rest
// every decoder_sparse_step-th (counting from 1) is MoE.
std::vector<int32_t> qwen_moe_layers(const Fields &f, const std::string &where, int32_t total,
                                     int32_t num_experts) {
    const int32_t step = f.opt_int("decoder_sparse_step", 1);
    if (step <= 0) fail(FT_ERR_FORMAT, where, ": field 'decoder_sparse_step' = ", step, " must be positive");
    std::vector<bool> dense(static_cast<size_t>(total), false);  // total <= limits::kMaxLayers
    for (int32_t l : f.opt_int_list("mlp_only_layers"))
        if (l >= 0 && l < total) dense[static_cast<size_t>(l)] = true;
    std::vector<int32_t> out;
    for (int32_t l = 0; l < total; ++l)
        if (!dense[static_cast<size_t>(l)] && num_experts > 0 && (l + 1) % step == 0) out.push_back(l);
    return out;
}

// The expert format a config declares: quantization_config in config.json (block FP8, ModelOpt,
// MXFP4) or ModelOpt's separate hf_quant_config.json; bf16 when neither says anything. The loader
// checks the declaration against the tensors it finds.
Format declared_format(const json &cfg, const json &fields, const std::string &dir, const std::string &where) {
    const json *qc = nullptr;
    for (const json *obj : {&cfg, &fields}) {
        auto it = obj->find("quantization_config");
        if (it != obj->end() && !it->is_null()) {
            qc = &*it;
            break;
        }
    }
    if (qc) {
        if (!qc->is_object()) fail(FT_ERR_FORMAT, where, ": field 'quantization_config' must be an object");
        const Fields q(*qc, where + " (quantization_config)");
        const std::string method = q.opt_string("quant_method", "");
        if (method == "fp8") {
            // Only 128 x 128 block scales are served; per-tensor or per-channel FP8 is another format.
            auto bs = qc->find("weight_block_size");
            if (bs == qc->end() || *bs != json::array({128, 128}))
                fail(FT_ERR_UNSUPPORTED, where, ": quantization_config: FP8 without weight_block_size [128, 128] "
                     "is not supported (got ", bs == qc->end() ? std::string("none") : json_brief(*bs), ")");
            return Format::fp8_block;
        }
        if (method == "mxfp4") return Format::mxfp4;
        if (method == "modelopt") {
            std::string algo = q.opt_string("quant_algo", "");
            auto inner = qc->find("quantization");
            if (algo.empty() && inner != qc->end() && inner->is_object())
                algo = Fields(*inner, where + " (quantization_config.quantization)").opt_string("quant_algo", "");
            if (algo == "NVFP4") return Format::nvfp4;
            fail(FT_ERR_UNSUPPORTED, where, ": quantization_config: ModelOpt quant_algo '", algo,
                 "' is not supported (NVFP4)");
        }
        fail(FT_ERR_UNSUPPORTED, where, ": quantization_config: quant_method '", method,
             "' is not supported (fp8 with 128 x 128 blocks, modelopt NVFP4, mxfp4)");
    }
    const std::string hq = dir + "/hf_quant_config.json";
    check_file_size(hq, limits::kMaxJsonFileBytes);
    std::ifstream in(hq, std::ios::binary);
    if (!in) return Format::bf16;
    std::ostringstream text;
    text << in.rdbuf();
    json h;
    try {
        h = json::parse(text.str(), json_depth_guard<json>(hq));
    } catch (const json::exception &e) {
        fail(FT_ERR_FORMAT, hq, ": not valid JSON: ", e.what());
    }
    auto qz = h.is_object() ? h.find("quantization") : h.end();
    if (!h.is_object() || qz == h.end() || !qz->is_object())
        fail(FT_ERR_FORMAT, hq, ": missing object 'quantization'");
    const Fields q(*qz, hq + " (quantization)");
    const std::string algo = q.opt_string("quant_algo", "");
    if (algo != "NVFP4") fail(FT_ERR_UNSUPPORTED, hq, ": quant_algo '", algo, "' is not supported (NVFP4)");
    const int32_t group = q.opt_int("group_size", 16);
    if (group != 16) fail(FT_ERR_FORMAT, hq, ": NVFP4 group_size ", group, " (must be 16)");
    return Format::nvfp4;
}

}  // namespace

ModelSpec read_model_config(const std::string &dir) {
    const std::string path = dir + "/config.json";
    check_file_size(path, limits::kMaxJsonFileBytes);
    errno = 0;
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(FT_ERR_IO, path, ": cannot open: ", errno ? std::strerror(errno) : "reason unknown");
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) fail(FT_ERR_IO, path, ": read error");

    json cfg;
    try {
        cfg = json::parse(text.str(), json_depth_guard<json>(path));
    } catch (const json::exception &e) {
        fail(FT_ERR_FORMAT, path, ": not valid JSON: ", e.what());
    }
    if (!cfg.is_object()) fail(FT_ERR_FORMAT, path, ": not a JSON object");

    // Multimodal releases (Qwen3.5/3.6) nest the language model's fields under text_config.
    const json *fields_obj = &cfg;
    std::string where = path;
    auto tc = cfg.find("text_config");
    if (tc != cfg.end() && !tc->is_null()) {
        if (!tc->is_object()) fail(FT_ERR_FORMAT, path, ": field 'text_config' must be an object");
        fields_obj = &*tc;
        where = path + " (text_config)";
    }
    const Fields top(cfg, path);
    const Fields f(*fields_obj, where);

    std::string model_type = top.opt_string("model_type", "");
    if (model_type.empty()) model_type = f.opt_string("model_type", "");
    if (model_type.empty()) model_type = model_type_from_architectures(cfg);
    if (model_type.empty()) fail(FT_ERR_FORMAT, path, ": required field 'model_type' is missing");

    static const char *const supported[] = {"qwen3_moe",   "qwen3_5_moe",      "qwen3_5_moe_text", "qwen3_6_moe",
                                            "qwen3_6_moe_text", "mixtral", "deepseek_v3",  "kimi_k2", "glm4_moe",
                                            "gpt_oss", "deepseek_v4"};
    if (std::find(std::begin(supported), std::end(supported), model_type) == std::end(supported))
        fail(FT_ERR_UNSUPPORTED, path, ": model_type '", model_type,
             "' is not supported (qwen3_moe, qwen3_5_moe, mixtral, deepseek_v3, kimi_k2, glm4_moe, gpt_oss, "
             "deepseek_v4)");

    ModelSpec spec;
    spec.hidden = f.req_int_any({"hidden_size", "dim"});
    spec.total_layers = f.req_int_any({"num_hidden_layers", "n_layers"});
    spec.top_k = f.req_int_any({"num_experts_per_tok", "experts_per_token", "n_activated_experts"});
    spec.activation = parse_activation(f.opt_string("hidden_act", "silu"), where);
    if (spec.total_layers <= 0) fail(FT_ERR_FORMAT, where, ": field 'num_hidden_layers' must be positive");
    // Bounded before the per-layer loops below (docs/limits.md).
    if (spec.total_layers > limits::kMaxLayers)
        fail(FT_ERR_FORMAT, where, ": field 'num_hidden_layers' = ", spec.total_layers, " exceeds the limit of ",
             limits::kMaxLayers);

    RoutingSpec &r = spec.routing;
    if (model_type == "qwen3_moe") {
        spec.architecture = "qwen3_moe";
        spec.num_experts = f.req_int_any({"num_experts", "num_local_experts"});
        spec.intermediate = f.req_int("moe_intermediate_size");
        r.rule = f.opt_bool("norm_topk_prob", false) ? FT_ROUTING_SOFTMAX_TOPK_RENORM : FT_ROUTING_SOFTMAX_TOPK;
        spec.moe_layers = qwen_moe_layers(f, where, spec.total_layers, spec.num_experts);
    } else if (model_type == "qwen3_5_moe" || model_type == "qwen3_5_moe_text" || model_type == "qwen3_6_moe" ||
               model_type == "qwen3_6_moe_text") {
        spec.architecture = "qwen3_5_moe";
        spec.num_experts = f.req_int_any({"num_experts", "num_local_experts"});
        spec.intermediate = f.req_int("moe_intermediate_size");
        spec.shared_intermediate = f.req_int("shared_expert_intermediate_size");
        spec.shared_expert_gate = spec.shared_intermediate > 0;
        r.rule = FT_ROUTING_SOFTMAX_TOPK_RENORM;  // Qwen3.5/3.6 always renormalise
        spec.moe_layers = qwen_moe_layers(f, where, spec.total_layers, spec.num_experts);
    } else if (model_type == "mixtral") {
        spec.architecture = "mixtral";
        spec.num_experts = f.req_int_any({"num_local_experts", "num_experts"});
        spec.intermediate = f.req_int("intermediate_size");
        r.rule = FT_ROUTING_SOFTMAX_TOPK_RENORM;
        for (int32_t l = 0; l < spec.total_layers; ++l) spec.moe_layers.push_back(l);
    } else if (model_type == "deepseek_v3" || model_type == "kimi_k2" || model_type == "glm4_moe") {
        // Kimi-K2 ships DeepseekV3 modelling code; GLM-4.x MoE uses the same routing with its own
        // defaults (transformers Glm4MoeConfig) and no moe_layer_freq.
        const bool glm = model_type == "glm4_moe";
        spec.architecture = model_type;
        spec.num_experts = f.req_int("n_routed_experts");
        spec.intermediate = f.req_int("moe_intermediate_size");
        const int32_t first_dense = f.opt_int("first_k_dense_replace", glm ? 1 : 3);
        const int32_t freq = glm ? 1 : f.opt_int("moe_layer_freq", 1);
        if (freq <= 0) fail(FT_ERR_FORMAT, where, ": field 'moe_layer_freq' = ", freq, " must be positive");
        if (first_dense < 0) fail(FT_ERR_FORMAT, where, ": field 'first_k_dense_replace' must not be negative");
        // Layers >= num_hidden_layers (the MTP / next-token-prediction layers) are not decoder layers.
        for (int32_t l = first_dense; l < spec.total_layers; ++l)
            if (l % freq == 0) spec.moe_layers.push_back(l);

        const int32_t n_shared = f.opt_int("n_shared_experts", 1);
        if (n_shared < 0) fail(FT_ERR_FORMAT, where, ": field 'n_shared_experts' must not be negative");
        // GLM-4.x always has a shared expert , of width I * max(1, n_shared_experts).
        const int64_t shared = checked_mul(int64_t{spec.intermediate}, int64_t{glm ? std::max(1, n_shared) : n_shared},
                                           where + ": moe_intermediate_size * n_shared_experts");
        if (shared > limits::kMaxDim)
            fail(FT_ERR_FORMAT, where, ": moe_intermediate_size * n_shared_experts = ", shared,
                 " (the shared expert's width) exceeds the limit of ", limits::kMaxDim);
        spec.shared_intermediate = static_cast<int32_t>(shared);

        r.num_groups = f.opt_int("n_group", glm ? 1 : 8);
        r.topk_groups = f.opt_int("topk_group", glm ? 1 : 4);
        r.routed_scaling_factor = static_cast<float>(f.opt_number("routed_scaling_factor", glm ? 1.0 : 2.5));
        const bool norm = f.opt_bool("norm_topk_prob", true);
        const std::string scoring = glm ? "sigmoid" : f.opt_string("scoring_func", "sigmoid");
        if (scoring == "sigmoid") {
            r.rule = FT_ROUTING_SIGMOID_GROUP_TOPK;
            r.renormalize = norm;
        } else if (scoring == "softmax") {
            // DeepSeek-V2-style softmax routing is served only without group limits or scaling,
            // which the softmax rules do not apply.
            if (r.topk_groups < r.num_groups || r.routed_scaling_factor != 1.0f)
                fail(FT_ERR_UNSUPPORTED, where, ": scoring_func 'softmax' with group-limited selection or "
                     "routed_scaling_factor != 1 is not supported");
            r.rule = norm ? FT_ROUTING_SOFTMAX_TOPK_RENORM : FT_ROUTING_SOFTMAX_TOPK;
            r.num_groups = r.topk_groups = 1;
        } else {
            fail(FT_ERR_UNSUPPORTED, where, ": scoring_func '", scoring, "' is not supported (sigmoid, softmax)");
        }
    } else if (model_type == "gpt_oss") {
        // Every layer is MoE; experts use the clamped SwiGLU with alpha 1.702 and biases; the router
        // takes the top-k logits (plus its bias) and softmaxes over those k.
        spec.architecture = "gpt_oss";
        spec.num_experts = f.req_int_any({"num_local_experts", "num_experts"});
        spec.intermediate = f.req_int("intermediate_size");
        spec.activation = FT_ACT_SWIGLU_CLAMP;
        spec.swiglu_alpha = 1.702f;
        spec.swiglu_limit = static_cast<float>(f.opt_number("swiglu_limit", 7.0));
        r.rule = FT_ROUTING_TOPK_SOFTMAX;
        for (int32_t l = 0; l < spec.total_layers; ++l) spec.moe_layers.push_back(l);
    } else if (model_type == "deepseek_v4") {
        // Field names as transformers writes them, or as DeepSeek's own inference configs do
        // (moe_inter_dim, n_dense_layers, score_func, route_scale, ...). Routed experts are ds_fp4
        // whatever quantization_config says (it describes the other weights).
        spec.architecture = "deepseek_v4";
        spec.format = Format::ds_fp4;
        spec.num_experts = f.req_int("n_routed_experts");
        spec.intermediate = f.req_int_any({"moe_intermediate_size", "moe_inter_dim"});
        const int32_t first_dense = f.opt_int_any({"first_k_dense_replace", "n_dense_layers"}, 0);
        if (first_dense < 0) fail(FT_ERR_FORMAT, where, ": field 'first_k_dense_replace' must not be negative");
        // MTP layers (index >= num_hidden_layers) are skipped.
        for (int32_t l = first_dense; l < spec.total_layers; ++l) spec.moe_layers.push_back(l);
        // The experts' SwiGLU clamps gate and up at swiglu_limit (0 or absent: no clamp). The ds_fp4
        // kernels apply it with FT_ACT_SILU; there is no separate public activation for it.
        spec.activation = FT_ACT_SILU;
        spec.swiglu_limit = static_cast<float>(f.opt_number("swiglu_limit", 0.0));
        r.num_groups = f.opt_int_any({"n_group", "n_expert_groups"}, 1);
        r.topk_groups = f.opt_int_any({"topk_group", "n_limited_groups"}, 1);
        const char *scale_field = f.first_of({"routed_scaling_factor", "route_scale"});
        r.routed_scaling_factor = static_cast<float>(scale_field ? f.opt_number(scale_field, 1.0) : 1.0);
        const char *score_field = f.first_of({"scoring_func", "score_func"});
        const std::string scoring = score_field ? f.opt_string(score_field, "") : "sqrtsoftplus";
        if (scoring == "softmax") {
            r.rule = FT_ROUTING_SOFTMAX_TOPK;  // DeepSeek-V4 does not renormalise softmax weights
            r.num_groups = r.topk_groups = 1;
        } else if (scoring == "sigmoid" || scoring == "sqrtsoftplus") {
            r.rule = scoring == "sigmoid" ? FT_ROUTING_SIGMOID_GROUP_TOPK : FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK;
            r.renormalize = true;
        } else {
            fail(FT_ERR_UNSUPPORTED, where, ": score function '", scoring,
                 "' is not supported (softmax, sigmoid, sqrtsoftplus)");
        }
        const int32_t hash_layers = f.opt_int("n_hash_layers", 0);
        if (hash_layers > 0)
            log(FT_LOG_INFO, where, ": the first ", hash_layers, " MoE layers route by token id (tid2eid); the "
                "caller supplies their expert ids");
        // The shared expert is FP8 with its own scales; FreeToken serves routed experts only here.
        if (f.opt_int("n_shared_experts", 0) > 0)
            log(FT_LOG_INFO, where, ": the DeepSeek-V4 shared expert is not loaded (the host computes it)");
    } else {
        fail(FT_ERR_INTERNAL, path, ": model_type '", model_type, "' accepted but not handled");
    }
    if (model_type != "deepseek_v4") spec.format = declared_format(cfg, *fields_obj, dir, where);

    if (spec.moe_layers.empty()) fail(FT_ERR_FORMAT, where, ": the configuration has no MoE layers");
    spec.num_layers = static_cast<int32_t>(spec.moe_layers.size());
    r.num_experts = spec.num_experts;
    r.top_k = spec.top_k;
    spec.validate(true);
    return spec;
}

}  // namespace ft
