// GGUF metadata -> ModelSpec: geometry, MoE layers and the routing rule of the file's
// general.architecture. The expert formats come from the tensors (gguf_expert_formats).
#include <algorithm>
#include <climits>

#include "ft/common.hpp"
#include "ft/gguf.hpp"
#include "ft/loader.hpp"
#include "gguf_internal.hpp"

namespace ft {

namespace {

int32_t to_i32(const GgufFile &g, const std::string &key, uint64_t v) {
    if (v > static_cast<uint64_t>(INT32_MAX)) fail(FT_ERR_FORMAT, g.path(), ": metadata '", key, "' = ", v, " is out of range");
    return static_cast<int32_t>(v);
}

int32_t expert_tensor_layer(const std::string &name) { return gguf_expert_tensor_layer(name); }

}  // namespace

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

    ModelSpec spec;
    spec.architecture = arch;
    spec.total_layers = req("block_count");
    spec.hidden = req("embedding_length");
    spec.num_experts = req("expert_count");
    spec.top_k = req("expert_used_count");
    spec.intermediate = req("expert_feed_forward_length");
    const int32_t leading = opt("leading_dense_block_count", 0);
    const int32_t nextn = opt("nextn_predict_layers", 0);
    if (spec.total_layers <= 0) fail(FT_ERR_FORMAT, g.path(), ": metadata '", a, "block_count' must be positive");
    if (spec.total_layers > limits::kMaxLayers)
        fail(FT_ERR_FORMAT, g.path(), ": metadata '", a, "block_count' = ", spec.total_layers, " exceeds the limit of ",
             limits::kMaxLayers);
    // MoE layers from the tensors the file holds (work linear in the file, not in the declared count).
    for (const GgufTensorInfo &t : g.tensors()) {
        const int32_t l = expert_tensor_layer(t.name);
        if (l >= leading && l < spec.total_layers - nextn) spec.moe_layers.push_back(l);
    }
    std::sort(spec.moe_layers.begin(), spec.moe_layers.end());
    spec.moe_layers.erase(std::unique(spec.moe_layers.begin(), spec.moe_layers.end()), spec.moe_layers.end());
    if (spec.moe_layers.empty())
        fail(FT_ERR_FORMAT, g.path(), ": no routed expert tensors (blk.N.ffn_gate_exps.weight or "
             "blk.N.ffn_gate_up_exps.weight) in layers ", leading, "..", spec.total_layers - nextn - 1);
    spec.num_layers = static_cast<int32_t>(spec.moe_layers.size());

    gguf_expert_formats(g, spec);
    spec.activation = arch.rfind("gemma", 0) == 0 ? FT_ACT_GELU_TANH : FT_ACT_SILU;

    RoutingSpec &r = spec.routing;
    const uint64_t gating = g.opt_uint(a + "expert_gating_func", 1);  // 0 = unset: softmax
    const bool norm = g.opt_bool(a + "expert_weights_norm", true);
    double scale = g.opt_float(a + "expert_weights_scale", 1.0);
    if (!(scale > 0.0)) scale = 1.0;  // 0 is what converters write when the model has no scaling
    if (gating == 2) {
        r.rule = FT_ROUTING_SIGMOID_GROUP_TOPK;
        r.renormalize = norm;
        r.routed_scaling_factor = static_cast<float>(scale);
        r.num_groups = std::max(1, opt("expert_group_count", 1));
        r.topk_groups = std::max(1, opt("expert_group_used_count", 1));
    } else if (gating == 0 || gating == 1) {
        r.rule = norm ? FT_ROUTING_SOFTMAX_TOPK_RENORM : FT_ROUTING_SOFTMAX_TOPK;
    } else {
        fail(FT_ERR_UNSUPPORTED, g.path(), ": metadata '", a, "expert_gating_func' = ", gating,
             " is not supported (1 softmax, 2 sigmoid)");
    }
    r.num_experts = spec.num_experts;
    r.top_k = spec.top_k;
    gguf_shared_experts(g, spec);
    spec.validate(true);
    return spec;
}

}  // namespace ft
