// config.json -> ModelSpec: the file, the language model's fields (nested under text_config or
// thinker_config.text_config in multimodal releases), the model_type's reader (config_archs.cpp)
// and the declared expert format. docs/ARCHITECTURE.md lists the architectures.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "config_fields.hpp"
#include "ft/loader.hpp"

namespace ft {

namespace {

using config::Fields;
using config::json;

json parse_json_file(const std::string &path) {
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
    return cfg;
}

// model_type from the class name when a config has no model_type (older exports).
std::string model_type_from_architectures(const json &cfg) {
    auto it = cfg.find("architectures");
    if (it == cfg.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) return "";
    const std::string a = (*it)[0].get<std::string>();
    static const std::pair<const char *, const char *> known[] = {
        {"Qwen3MoeForCausalLM", "qwen3_moe"},     {"Qwen2MoeForCausalLM", "qwen2_moe"},
        {"MixtralForCausalLM", "mixtral"},        {"DeepseekV3ForCausalLM", "deepseek_v3"},
        {"DeepseekV2ForCausalLM", "deepseek_v2"}, {"Glm4MoeForCausalLM", "glm4_moe"},
        {"GptOssForCausalLM", "gpt_oss"},         {"OlmoeForCausalLM", "olmoe"},
        {"PhimoeForCausalLM", "phimoe"},          {"PhiMoEForCausalLM", "phimoe"},
        {"MiniMaxForCausalLM", "minimax"},        {"MiniMaxM2ForCausalLM", "minimax_m2"},
        {"Ernie4_5_MoeForCausalLM", "ernie4_5_moe"}, {"HunYuanMoEV1ForCausalLM", "hunyuan_v1_moe"},
        {"Dots1ForCausalLM", "dots1"},            {"GraniteMoeForCausalLM", "granitemoe"},
        {"GraniteMoeSharedForCausalLM", "granitemoeshared"}, {"Qwen3NextForCausalLM", "qwen3_next"},
    };
    for (const auto &k : known)
        if (a == k.first) return k.second;
    if (a.rfind("Qwen3_5Moe", 0) == 0) return "qwen3_5_moe";
    return "";
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


// The language model's fields: text_config (Qwen3-VL/3.5/3.6, GLM-4.xV, Llama-4) or
// thinker_config.text_config (Qwen3-Omni), else the top level.
const json &text_tower(const json &cfg, const std::string &path, std::string &where) {
    const json *obj = &cfg;
    where = path;
    for (const char *outer : {"thinker_config", ""}) {
        const json *base = &cfg;
        if (*outer) {
            auto it = cfg.find(outer);
            if (it == cfg.end() || it->is_null()) continue;
            if (!it->is_object()) fail(FT_ERR_FORMAT, path, ": field '", outer, "' must be an object");
            base = &*it;
        }
        auto tc = base->find("text_config");
        if (tc == base->end() || tc->is_null()) continue;
        if (!tc->is_object()) fail(FT_ERR_FORMAT, path, ": field 'text_config' must be an object");
        obj = &*tc;
        where = path + (*outer ? " (thinker_config.text_config)" : " (text_config)");
        break;
    }
    return *obj;
}

std::string read_model_type(const Fields &top, const Fields &f, const json &cfg, const std::string &path) {
    std::string model_type = top.opt_string("model_type", "");
    if (model_type.empty()) model_type = f.opt_string("model_type", "");
    if (model_type.empty()) model_type = model_type_from_architectures(cfg);
    if (model_type.empty()) fail(FT_ERR_FORMAT, path, ": required field 'model_type' is missing");
    return model_type;
}

const config::ArchEntry &find_arch(const std::string &model_type, const std::string &path) {
    for (const config::ArchEntry &a : config::arch_table())
        if (model_type == a.model_type) return a;
    fail(FT_ERR_UNSUPPORTED, path, ": model_type '", model_type, "' is not supported (supported: ",
         config::supported_list(), ")");
}

// Fields every architecture has: hidden size, decoder layers, routes per token, activation.
void read_common(const Fields &f, ModelSpec &spec) {
    spec.hidden = f.req_int_any({"hidden_size", "dim"});
    spec.total_layers = f.req_int_any({"num_hidden_layers", "n_layers"});
    if (const char *k = f.first_of({"num_experts_per_tok", "experts_per_token", "n_activated_experts", "moe_k",
                                    "moe_topk"}))
        spec.top_k = f.req_uniform_int(k);
    else
        spec.top_k = f.req_int("num_experts_per_tok");
    spec.activation = config::parse_activation(f.opt_string("hidden_act", "silu"), f.where());
    if (spec.total_layers <= 0) fail(FT_ERR_FORMAT, f.where(), ": field 'num_hidden_layers' must be positive");
    // Bounded before the per-layer loops of the readers (docs/limits.md).
    if (spec.total_layers > limits::kMaxLayers)
        fail(FT_ERR_FORMAT, f.where(), ": field 'num_hidden_layers' = ", spec.total_layers, " exceeds the limit of ",
             limits::kMaxLayers);
}

}  // namespace

std::vector<std::string> supported_model_types() {
    std::vector<std::string> out;
    for (const config::ArchEntry &a : config::arch_table()) out.emplace_back(a.model_type);
    return out;
}

ModelSpec read_model_config(const std::string &dir) {
    const std::string path = dir + "/config.json";
    const json cfg = parse_json_file(path);
    if (!cfg.is_object()) fail(FT_ERR_FORMAT, path, ": not a JSON object");
    std::string where;
    const json &fields = text_tower(cfg, path, where);
    const Fields top(cfg, path);
    const Fields f(fields, where);

    const std::string model_type = read_model_type(top, f, cfg, path);
    const config::ArchEntry &arch = find_arch(model_type, path);
    ModelSpec spec;
    spec.architecture = arch.architecture;
    read_common(f, spec);
    config::ReadContext ctx{f, model_type, spec};
    arch.read(ctx);
    // DeepSeek-V4's quantization_config describes its other weights; its experts are ds_fp4.
    if (spec.format != Format::ds_fp4) spec.format = declared_format(cfg, fields, dir, where);

    if (spec.moe_layers.empty()) fail(FT_ERR_FORMAT, where, ": the configuration has no MoE layers");
    spec.num_layers = static_cast<int32_t>(spec.moe_layers.size());
    spec.routing.num_experts = spec.num_experts;
    spec.routing.top_k = spec.top_k;
    spec.validate(true);
    return spec;
}

}  // namespace ft
