#include "ft/model.hpp"

#include <algorithm>
#include <cmath>

#include "ft/common.hpp"

namespace ft {

namespace {

bool routing_rule_valid(int32_t rule) {
    return rule >= FT_ROUTING_SOFTMAX_TOPK && rule <= FT_ROUTING_SPARSEMIXER;
}

bool activation_valid(int32_t act) {
    return act == FT_ACT_SILU || act == FT_ACT_GELU || act == FT_ACT_GELU_TANH || act == FT_ACT_SWIGLU_CLAMP;
}

}  // namespace

void ModelSpec::validate(bool from_checkpoint) const {
    const ft_status code = from_checkpoint ? FT_ERR_FORMAT : FT_ERR_INVALID_ARGUMENT;
    auto check = [&](bool ok, const char *what) {
        if (!ok) fail(code, "model geometry: ", what);
    };
    check(num_layers > 0, "num_layers must be positive");
    check(num_experts > 0, "num_experts must be positive");
    check(top_k > 0 && top_k <= num_experts, "top_k must be in [1, num_experts]");
    check(hidden > 0, "hidden_size must be positive");
    check(intermediate > 0, "intermediate_size must be positive");
    check(hidden <= limits::kMaxDim && intermediate <= limits::kMaxDim, "hidden/intermediate size beyond 2^20");
    check(shared_intermediate <= limits::kMaxDim, "shared_intermediate_size beyond 2^20");
    check(num_experts <= limits::kMaxExperts, "more than 65536 experts per layer");
    check(num_layers <= limits::kMaxLayers && total_layers <= limits::kMaxLayers, "more than 4096 layers");
    // An upper bound of the expert bytes (3 bf16 matrices per expert) must fit in 63 bits, so no
    // size computed from this geometry overflows.
    uint64_t bytes = 0;
    const bool fits = mul_fits(static_cast<uint64_t>(num_layers), static_cast<uint64_t>(num_experts), &bytes) &&
                      mul_fits(bytes, static_cast<uint64_t>(hidden) * static_cast<uint64_t>(intermediate), &bytes) &&
                      mul_fits(bytes, 6, &bytes) && bytes <= static_cast<uint64_t>(INT64_MAX);
    check(fits, "the expert weights' size overflows 63 bits");
    check(moe_layers.empty() || static_cast<int32_t>(moe_layers.size()) == num_layers,
          "moe_layers must list every MoE layer");
    check(shared_intermediate >= 0, "shared_intermediate_size must not be negative");
    check(hash_layers >= 0 && hash_layers <= num_layers, "hash_layers must be in [0, num_layers]");
    // 2^24 token ids bound tid2eid's rows (DeepSeek-V4 has 129280).
    check(hash_layers == 0 || (vocab_size > 0 && vocab_size <= (1 << 24)),
          "hash-routed layers need a vocab_size in [1, 2^24]");
    if (!layer_formats.empty()) {
        check(static_cast<int32_t>(layer_formats.size()) == num_layers,
              "layer_formats must give the formats of every MoE layer (size num_layers)");
        for (size_t l = 0; l < layer_formats.size(); ++l) {
            for (const Format f : {layer_formats[l].gate_up, layer_formats[l].down}) {
                if (!format_known(static_cast<int32_t>(f)) || !format_is_block(f))
                    fail(code, "model geometry: MoE layer ", l, " has expert format ",
                         format_known(static_cast<int32_t>(f)) ? format_name(f) : "(unknown)",
                         "; only GGUF block formats (q4_0, q8_0, q2_k..q6_k, iq4_xs) mix per layer or matrix");
                if (const std::string err = format_geometry_error(f, hidden, intermediate); !err.empty())
                    fail(code, "model geometry: MoE layer ", l, " (", format_name(f), "): ", err);
            }
        }
        if (layer_formats[0].gate_up != format)
            fail(code, "model geometry: format (", format_known(static_cast<int32_t>(format)) ? format_name(format) : "?",
                 ") must be MoE layer 0's gate_up format (", format_name(layer_formats[0].gate_up), ")");
    }
    if (!activation_valid(activation)) fail(code, "unknown activation ", activation);
    if (activation == FT_ACT_SWIGLU_CLAMP) {
        check(std::isfinite(swiglu_alpha), "swiglu_alpha must be finite");
        check(!(swiglu_limit <= 0.0f) && !std::isnan(swiglu_limit), "swiglu_limit must be positive");
    }
    if (!routing_rule_valid(routing.rule)) fail(code, "unknown routing rule ", routing.rule);
    check(routing.num_experts == num_experts && routing.top_k == top_k, "routing spec disagrees with geometry");
    check(std::isfinite(routing.routed_scaling_factor) && routing.routed_scaling_factor > 0.0f,
          "routed_scaling_factor must be positive and finite");
    check(route_weight == FT_ROUTE_WEIGHT_OUTPUT || route_weight == FT_ROUTE_WEIGHT_INPUT,
          "route_weight must be FT_ROUTE_WEIGHT_OUTPUT or FT_ROUTE_WEIGHT_INPUT");
    check(route_weight == FT_ROUTE_WEIGHT_OUTPUT || format == Format::bf16,
          "FT_ROUTE_WEIGHT_INPUT is served for bf16 experts only");
    if (routing.rule == FT_ROUTING_SPARSEMIXER) {
        check(top_k == 2, "FT_ROUTING_SPARSEMIXER routes exactly 2 experts per token");
        check(std::isfinite(routing.jitter_eps) && routing.jitter_eps >= 0.0f,
              "router_jitter_eps must be finite and not negative");
    }
    if (routing.rule == FT_ROUTING_SIGMOID_GROUP_TOPK || routing.rule == FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK ||
        routing.rule == FT_ROUTING_SOFTMAX_GROUP_TOPK || routing.rule == FT_ROUTING_SOFTMAX_BIASED_TOPK) {
        check(routing.num_groups >= 1 && num_experts % routing.num_groups == 0,
              "num_groups must divide num_experts");
        check(routing.topk_groups >= 1 && routing.topk_groups <= routing.num_groups,
              "topk_groups must be in [1, num_groups]");
        // Each kept group must be able to supply top-k candidates between them.
        check(static_cast<int64_t>(routing.topk_groups) * (num_experts / routing.num_groups) >= top_k,
              "topk_groups * experts per group must be at least top_k");
        if (routing.num_groups > 1) check(num_experts / routing.num_groups >= 2, "groups need at least 2 experts");
    }
}

LayerFormats ModelSpec::formats_of(int32_t layer) const {
    if (!layer_formats.empty()) return layer_formats.at(static_cast<size_t>(layer));
    return LayerFormats{format, format};
}

bool ModelSpec::mixed_formats() const {
    for (const LayerFormats &lf : layer_formats)
        if (lf.gate_up != format || lf.down != format) return true;
    return false;
}

uint64_t ModelSpec::layer_expert_bytes(int32_t layer) const {
    const LayerFormats lf = formats_of(layer);
    if (lf.gate_up == lf.down) return expert_bytes(lf.gate_up, hidden, intermediate);
    // Only two-bank block formats mix: gate_up [2I rows of H], down [H rows of I].
    return 2 * static_cast<uint64_t>(intermediate) * block_row_bytes(lf.gate_up, hidden) +
           static_cast<uint64_t>(hidden) * block_row_bytes(lf.down, intermediate);
}

uint64_t ModelSpec::max_expert_bytes() const {
    if (layer_formats.empty()) return expert_bytes(format, hidden, intermediate);
    // Only two-bank block formats mix: the largest gate_up row plus the largest down row.
    uint64_t gu = 0, dn = 0;
    for (const LayerFormats &lf : layer_formats) {
        gu = std::max<uint64_t>(gu, 2 * static_cast<uint64_t>(intermediate) * block_row_bytes(lf.gate_up, hidden));
        dn = std::max<uint64_t>(dn, static_cast<uint64_t>(hidden) * block_row_bytes(lf.down, intermediate));
    }
    return gu + dn;
}

uint64_t ModelSpec::routed_bytes() const {
    uint64_t total = 0;
    if (layer_formats.empty()) return expert_bytes(format, hidden, intermediate) * uint64_t(num_experts) * uint64_t(num_layers);
    for (int32_t l = 0; l < num_layers; ++l) total += layer_expert_bytes(l) * uint64_t(num_experts);
    return total;
}

int64_t Tensor::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return shape.empty() ? 0 : n;
}

Model::Model(ModelSpec spec) : spec_(std::move(spec)) {
    spec_.validate(spec_.total_layers > 0);
    if (spec_.moe_layers.empty()) {
        for (int32_t l = 0; l < spec_.num_layers; ++l) spec_.moe_layers.push_back(l);
    }
    std::vector<size_t> layer_rows;  // [bank][layer], only when the layers mix block formats
    if (!spec_.layer_formats.empty()) {
        const int32_t L = spec_.num_layers;
        layer_rows.resize(2 * static_cast<size_t>(L));
        for (int32_t l = 0; l < L; ++l) {
            const LayerFormats &lf = spec_.layer_formats[l];
            layer_rows[l] = bank_schema(lf.gate_up, spec_.hidden, spec_.intermediate)[0].row_bytes;
            layer_rows[L + l] = bank_schema(lf.down, spec_.hidden, spec_.intermediate)[1].row_bytes;
        }
    }
    banks_ = ExpertBanks(bank_schema(spec_.format, spec_.hidden, spec_.intermediate), spec_.num_layers,
                         spec_.num_experts, std::move(layer_rows));
    extras_.resize(static_cast<size_t>(spec_.num_layers));
}

const uint16_t *Model::gate(int layer, int expert) const {
    return reinterpret_cast<const uint16_t *>(banks_.row(0, layer, expert));
}

const uint16_t *Model::up(int layer, int expert) const {
    return gate(layer, expert) + static_cast<size_t>(spec_.intermediate) * spec_.hidden;
}

const uint16_t *Model::down(int layer, int expert) const {
    return reinterpret_cast<const uint16_t *>(banks_.row(1, layer, expert));
}

int32_t Model::moe_layer_of(int32_t model_layer) const {
    for (size_t i = 0; i < spec_.moe_layers.size(); ++i) {
        if (spec_.moe_layers[i] == model_layer) return static_cast<int32_t>(i);
    }
    return -1;
}

}  // namespace ft
