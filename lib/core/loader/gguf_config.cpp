// GGUF metadata -> ModelSpec: geometry, MoE layers and the routing rule of the file's
// general.architecture, by the per-family table below (docs/architectures.md, "GGUF files").
// The expert formats come from the tensors (gguf_expert_formats).
#include <algorithm>
#include <climits>

#include "ft/common.hpp"
#include "ft/gguf.hpp"
#include "ft/loader.hpp"
#include "gguf_internal.hpp"

namespace ft {

namespace {

// How a family scores and weights its experts when the metadata does not say otherwise.
enum class Gate {
    softmax,         // softmax over all experts, top-k of the probabilities
    sigmoid,         // sigmoid scores, selection on score + exp_probs_b
    softmax_biased,  // softmax scores, selection on probability + exp_probs_b (ERNIE)
    topk_softmax,    // top-k of the logits, softmax over those k (gpt-oss, Granite)
    topk_sigmoid,    // top-k of the logits, sigmoid weight scaling the expert input (Llama-4)
    sparsemixer,     // PhiMoE's inference routing
    refused,         // a family whose experts FreeToken cannot serve (`why` says which part)
};

// The values of {arch}.expert_gating_func (llama.cpp's gating function ids).
constexpr uint64_t kGatingNone = 0, kGatingSoftmax = 1, kGatingSigmoid = 2, kGatingSoftmaxWeight = 3;

struct GgufArch {
    const char *name;       // general.architecture
    const char *canonical;  // spec.architecture (a supported_model_types() name where one exists)
    Gate gate;
    bool gating_key;        // expert_gating_func may switch the family between softmax and sigmoid
    bool norm;              // renormalise the selected weights when expert_weights_norm is absent
    bool grouped_softmax;   // softmax always through FT_ROUTING_SOFTMAX_GROUP_TOPK (DeepSeek-V2)
    bool shared_gate;       // the shared expert is scaled by sigmoid(ffn_gate_inp_shexp . x)
    const char *why;        // Gate::refused: what is not supported
};

// One row per general.architecture llama.cpp writes for a MoE model. Routing as llama.cpp's graph
// for that architecture computes it; the canonical name is the config.json model_type whose reader
// builds the same ModelSpec.
const GgufArch kArchs[] = {
    {"qwen2moe", "qwen2_moe", Gate::softmax, false, false, false, true, nullptr},
    {"qwen3moe", "qwen3_moe", Gate::softmax, false, true, false, false, nullptr},
    {"qwen3vlmoe", "qwen3_vl_moe", Gate::softmax, false, true, false, false, nullptr},
    {"qwen3next", "qwen3_next", Gate::softmax, false, true, false, true, nullptr},
    {"qwen35moe", "qwen3_5_moe", Gate::softmax, false, true, false, true, nullptr},
    {"llama", "mixtral", Gate::softmax, false, true, false, false, nullptr},
    {"phimoe", "phimoe", Gate::sparsemixer, false, true, false, false, nullptr},
    {"olmoe", "olmoe", Gate::softmax, false, false, false, false, nullptr},
    {"jamba", "jamba", Gate::softmax, false, false, false, false, nullptr},
    {"dbrx", "dbrx", Gate::softmax, false, true, false, false, nullptr},
    {"deepseek", "deepseek", Gate::softmax, false, false, true, false, nullptr},
    {"deepseek2", "deepseek_v2", Gate::softmax, true, false, true, false, nullptr},
    {"glm4moe", "glm4_moe", Gate::sigmoid, true, false, false, false, nullptr},
    {"dots1", "dots1", Gate::sigmoid, true, false, false, false, nullptr},
    {"bailingmoe", "bailingmoe", Gate::softmax, false, false, false, false, nullptr},
    {"bailingmoe2", "bailingmoe2", Gate::sigmoid, true, false, false, false, nullptr},
    {"minimax-m2", "minimax_m2", Gate::sigmoid, true, true, false, false, nullptr},
    {"lfm2moe", "lfm2moe", Gate::sigmoid, true, true, false, false, nullptr},
    {"ernie4_5-moe", "ernie4_5_moe", Gate::softmax_biased, false, true, false, false, nullptr},
    {"hunyuan-moe", "hunyuan_v1_moe", Gate::softmax, false, true, false, false, nullptr},
    {"gpt-oss", "gpt_oss", Gate::topk_softmax, false, false, false, false, nullptr},
    {"llama4", "llama4", Gate::topk_sigmoid, false, false, false, false, nullptr},
    {"granitemoe", "granitemoe", Gate::topk_softmax, false, true, false, false, nullptr},
    {"granitehybrid", "granitemoehybrid", Gate::topk_softmax, false, true, false, false, nullptr},
    {"gemma4", "gemma4", Gate::refused, false, true, false, false,
     "each expert's output carries its own scale (ffn_down_exps scale), which the routing rules do not apply"},
    {"grovemoe", "grovemoe", Gate::refused, false, true, false, false,
     "its adjugate (chunk) experts ffn_*_chexps, a second expert set sharing the router, are not served"},
};

const GgufArch *find_arch(const std::string &name) {
    for (const GgufArch &a : kArchs)
        if (name == a.name) return &a;
    return nullptr;
}

std::string supported_list() {
    std::string out;
    for (const GgufArch &a : kArchs)
        if (a.gate != Gate::refused) out += std::string(out.empty() ? "" : ", ") + a.name;
    return out;
}

const char *gating_name(uint64_t g) {
    switch (g) {
        case kGatingSoftmax: return "softmax";
        case kGatingSigmoid: return "sigmoid";
        case kGatingSoftmaxWeight: return "softmax over the selected logits";
        default: return "unknown";
    }
}

// The expert_gating_func value that describes a fixed-rule family's scoring.
uint64_t gating_of(Gate g) {
    switch (g) {
        case Gate::softmax:
        case Gate::softmax_biased:
        case Gate::sparsemixer: return kGatingSoftmax;
        case Gate::sigmoid:
        case Gate::topk_sigmoid: return kGatingSigmoid;
        case Gate::topk_softmax: return kGatingSoftmaxWeight;
        default: return kGatingNone;
    }
}

int32_t to_i32(const GgufFile &g, const std::string &key, uint64_t v) {
    if (v > static_cast<uint64_t>(INT32_MAX)) fail(FT_ERR_FORMAT, g.path(), ": metadata '", key, "' = ", v, " is out of range");
    return static_cast<int32_t>(v);
}

std::string layer_tensor(int32_t layer, const char *what) { return gguf_layer_tensor(layer, what); }

int32_t expert_tensor_layer(const std::string &name) { return gguf_expert_tensor_layer(name); }

bool is_scalar_int(const GgufValue *v) { return v && v->is_integer(); }

// Width of each routed expert: expert_feed_forward_length when it is one integer, else (absent, as
// Mixtral/PhiMoE/OLMoE/Granite files leave it, or a per-layer array) the first MoE layer's
// ffn_down_exps rows. The loader checks every layer's tensors against it.
int32_t expert_width(const GgufFile &g, const std::string &a, int32_t first_moe) {
    const std::string key = a + "expert_feed_forward_length";
    const GgufValue *v = g.find(key);
    if (is_scalar_int(v)) return to_i32(g, key, g.req_uint(key));
    const GgufTensorInfo *down = g.find_tensor(layer_tensor(first_moe, "ffn_down_exps.weight"));
    if (!down || down->dims.size() != 3)
        fail(FT_ERR_FORMAT, g.path(), ": required metadata '", key, "' is ", v ? "not an integer" : "missing",
             " and no 3-dimensional '", layer_tensor(first_moe, "ffn_down_exps.weight"), "' gives it");
    return to_i32(g, down->name, down->dims[0]);
}

// Total width of the shared expert(s): expert_shared_feed_forward_length, else expert_shared_count
// experts of width I, else the rows of the first MoE layer's ffn_down_shexp (Llama-4 and Hunyuan
// files may carry neither key); 0 when the file has none of these.
int32_t shared_width(const GgufFile &g, const std::string &a, int32_t first_moe, int32_t I) {
    const std::string len_key = a + "expert_shared_feed_forward_length", count_key = a + "expert_shared_count";
    if (g.find(len_key)) return to_i32(g, len_key, g.opt_uint(len_key, 0));
    if (g.find(count_key)) {
        const uint64_t n = g.opt_uint(count_key, 0);
        if (n > static_cast<uint64_t>(INT32_MAX) || n * static_cast<uint64_t>(I) > static_cast<uint64_t>(INT32_MAX))
            fail(FT_ERR_FORMAT, g.path(), ": metadata '", count_key, "' = ", n, " times the expert width ", I,
                 " is out of range");
        return static_cast<int32_t>(n * static_cast<uint64_t>(I));
    }
    const GgufTensorInfo *down = g.find_tensor(layer_tensor(first_moe, "ffn_down_shexp.weight"));
    if (down && down->dims.size() == 2) return to_i32(g, down->name, down->dims[0]);
    return 0;
}

}  // namespace

std::vector<std::string> supported_gguf_architectures() {
    std::vector<std::string> out;
    for (const GgufArch &a : kArchs)
        if (a.gate != Gate::refused) out.emplace_back(a.name);
    return out;
}

std::string gguf_layer_tensor(int32_t layer, const char *what) { return "blk." + std::to_string(layer) + "." + what; }

int32_t gguf_expert_tensor_layer(const std::string &name) {
    if (name.compare(0, 4, "blk.") != 0) return -1;
    size_t i = 4;
    int64_t l = 0;
    while (i < name.size() && i < 13 && name[i] >= '0' && name[i] <= '9') l = l * 10 + (name[i++] - '0');
    if (i == 4 || i >= name.size() || name[i] != '.' || (name[4] == '0' && i > 5)) return -1;
    const std::string rest = name.substr(i + 1);
    return rest == "ffn_gate_exps.weight" || rest == "ffn_gate_up_exps.weight" ? static_cast<int32_t>(l) : -1;
}

ModelSpec read_gguf_config(const GgufFile &g) {
    const std::string arch = g.req_string("general.architecture");
    const std::string a = arch + ".";
    auto req = [&](const char *k) { return to_i32(g, a + k, g.req_uint(a + k)); };
    auto opt = [&](const char *k, uint64_t def) { return to_i32(g, a + k, g.opt_uint(a + k, def)); };

    const int32_t blocks = req("block_count");
    const int32_t hidden = req("embedding_length");
    // A model without routed experts is refused before any expert key is read.
    if (opt("expert_count", 0) == 0)
        fail(FT_ERR_UNSUPPORTED, g.path(), ": general.architecture '", arch, "' without '", a,
             "expert_count' is a dense model: it has no routed experts for FreeToken to serve");
    const GgufArch *fam = find_arch(arch);
    if (!fam)
        fail(FT_ERR_UNSUPPORTED, g.path(), ": general.architecture '", arch, "' is not supported (supported: ",
             supported_list(), ")");
    if (fam->gate == Gate::refused)
        fail(FT_ERR_UNSUPPORTED, g.path(), ": general.architecture '", arch, "' is not supported: ", fam->why);

    ModelSpec spec;
    spec.architecture = fam->canonical;
    spec.hidden = hidden;
    spec.num_experts = req("expert_count");
    spec.top_k = req("expert_used_count");
    const int32_t leading = opt("leading_dense_block_count", 0);
    const int32_t nextn = opt("nextn_predict_layers", 0);
    if (blocks <= 0) fail(FT_ERR_FORMAT, g.path(), ": metadata '", a, "block_count' must be positive");
    if (blocks > limits::kMaxLayers)
        fail(FT_ERR_FORMAT, g.path(), ": metadata '", a, "block_count' = ", blocks, " exceeds the limit of ",
             limits::kMaxLayers);
    if (nextn >= blocks)
        fail(FT_ERR_FORMAT, g.path(), ": metadata '", a, "nextn_predict_layers' = ", nextn, " leaves no decoder layer of ",
             blocks);
    // The trailing next-token-prediction (MTP) layers are not decoder layers.
    spec.total_layers = blocks - nextn;
    // MoE layers from the tensors the file holds (work linear in the file, not in the declared count).
    for (const GgufTensorInfo &t : g.tensors()) {
        const int32_t l = expert_tensor_layer(t.name);
        if (l >= leading && l < spec.total_layers) spec.moe_layers.push_back(l);
    }
    std::sort(spec.moe_layers.begin(), spec.moe_layers.end());
    spec.moe_layers.erase(std::unique(spec.moe_layers.begin(), spec.moe_layers.end()), spec.moe_layers.end());
    if (spec.moe_layers.empty())
        fail(FT_ERR_FORMAT, g.path(), ": no routed expert tensors (blk.N.ffn_gate_exps.weight or "
             "blk.N.ffn_gate_up_exps.weight) in layers ", leading, "..", spec.total_layers - 1);
    spec.num_layers = static_cast<int32_t>(spec.moe_layers.size());
    spec.intermediate = expert_width(g, a, spec.moe_layers[0]);

    gguf_expert_formats(g, spec);

    // Scoring: the family's, or what expert_gating_func says for the families that read it.
    Gate gate = fam->gate;
    const std::string gating_key = a + "expert_gating_func";
    const uint64_t gating = g.opt_uint(gating_key, kGatingNone);
    if (gating != kGatingNone) {
        if (fam->gating_key && (gating == kGatingSoftmax || gating == kGatingSigmoid)) {
            gate = gating == kGatingSoftmax ? Gate::softmax : Gate::sigmoid;
        } else if (gating != gating_of(fam->gate)) {
            fail(FT_ERR_UNSUPPORTED, g.path(), ": metadata '", gating_key, "' = ", gating, " (", gating_name(gating),
                 ") is not supported for ", arch, " (", fam->gating_key ? "1 softmax, 2 sigmoid" : "it routes only as ",
                 fam->gating_key ? "" : gating_name(gating_of(fam->gate)), ")");
        }
    }
    const bool norm = g.opt_bool(a + "expert_weights_norm", fam->norm);
    // expert_weights_scale: 0 (or absent) is what converters write for a model without scaling.
    double scale = g.opt_float(a + "expert_weights_scale", 0.0);
    if (!(scale >= 0.0) || !(scale < 1e30))
        fail(FT_ERR_FORMAT, g.path(), ": metadata '", a, "expert_weights_scale' = ", scale, " must be a finite, "
             "non-negative number");
    if (scale == 0.0) scale = 1.0;
    const int32_t groups = std::max(1, opt("expert_group_count", 1));
    const int32_t used_groups = g.find(a + "expert_group_used_count") ? std::max(1, opt("expert_group_used_count", 1))
                                                                       : groups;

    RoutingSpec &r = spec.routing;
    r.num_groups = groups;
    r.topk_groups = used_groups;
    r.routed_scaling_factor = static_cast<float>(scale);
    r.renormalize = norm;
    auto no_groups_or_scale = [&](const char *rule) {
        if (groups > 1)
            fail(FT_ERR_UNSUPPORTED, g.path(), ": metadata '", a, "expert_group_count' = ", groups,
                 " (group-limited selection) is not supported with ", rule, " routing (", arch, ")");
        if (scale != 1.0)
            fail(FT_ERR_UNSUPPORTED, g.path(), ": metadata '", a, "expert_weights_scale' = ", scale,
                 " is not supported with ", rule, " routing (", arch, ")");
        r.num_groups = r.topk_groups = 1;
        r.routed_scaling_factor = 1.0f;
    };
    switch (gate) {
        case Gate::softmax:
            if (fam->grouped_softmax || groups > 1 || scale != 1.0) {
                r.rule = FT_ROUTING_SOFTMAX_GROUP_TOPK;
            } else {
                r.rule = norm ? FT_ROUTING_SOFTMAX_TOPK_RENORM : FT_ROUTING_SOFTMAX_TOPK;
                r.renormalize = true;
            }
            break;
        case Gate::sigmoid: r.rule = FT_ROUTING_SIGMOID_GROUP_TOPK; break;
        case Gate::softmax_biased: r.rule = FT_ROUTING_SOFTMAX_BIASED_TOPK; break;
        case Gate::topk_softmax:
            no_groups_or_scale("top-k softmax");
            r.rule = FT_ROUTING_TOPK_SOFTMAX;
            r.renormalize = true;
            break;
        case Gate::topk_sigmoid:
            no_groups_or_scale("top-k sigmoid");
            r.rule = FT_ROUTING_TOPK_SIGMOID;
            r.renormalize = true;
            spec.route_weight = FT_ROUTE_WEIGHT_INPUT;
            break;
        case Gate::sparsemixer:
            no_groups_or_scale("sparsemixer");
            r.rule = FT_ROUTING_SPARSEMIXER;
            r.renormalize = true;
            break;
        case Gate::refused: break;  // refused above
    }
    r.num_experts = spec.num_experts;
    r.top_k = spec.top_k;
    if (r.num_groups > 1 && (r.num_groups > spec.num_experts || spec.num_experts % r.num_groups != 0 ||
                             r.topk_groups > r.num_groups))
        fail(FT_ERR_FORMAT, g.path(), ": metadata '", a, "expert_group_count' = ", r.num_groups, " / '", a,
             "expert_group_used_count' = ", r.topk_groups, " do not fit ", spec.num_experts, " experts");

    // DeepSeek-V2's softmax routing is deepseek_v2; the sigmoid one (V3, R1, Kimi-K2) deepseek_v3.
    if (arch == "deepseek2" && gate == Gate::sigmoid) spec.architecture = "deepseek_v3";
    if (arch == "gpt-oss") {
        spec.activation = FT_ACT_SWIGLU_CLAMP;
        spec.swiglu_alpha = 1.702f;
        spec.swiglu_limit = 7.0f;
    } else {
        spec.activation = FT_ACT_SILU;
    }
    if (spec.route_weight == FT_ROUTE_WEIGHT_INPUT && spec.format != Format::bf16)
        fail(FT_ERR_UNSUPPORTED, g.path(), ": ", arch, " scales the expert input by its route weight, which is served "
             "for bf16 experts only (the experts are ", format_name(spec.format), ")");
    if (spec.architecture == "phimoe" && spec.top_k != 2)
        fail(FT_ERR_UNSUPPORTED, g.path(), ": metadata '", a, "expert_used_count' = ", spec.top_k,
             ": phimoe's sparsemixer routing selects exactly 2 experts");

    spec.shared_intermediate = shared_width(g, a, spec.moe_layers[0], spec.intermediate);
    spec.shared_expert_gate = fam->shared_gate && spec.shared_intermediate > 0;
    if (arch == "granitemoe" && spec.shared_intermediate > 0) spec.architecture = "granitemoeshared";
    spec.validate(true);
    return spec;
}

}  // namespace ft
