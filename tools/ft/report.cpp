// How ft names and prints what the library reports (report.hpp).
#include "report.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "ft/formats.hpp"
#include "progress.hpp"

namespace ft::tool {

int check(ft_status s, const char *what, const char *detail) {
    if (s == FT_OK) return 0;
    std::fprintf(stderr, "ft: %s failed: %s: %s\n", what, ft_status_string(s), detail && *detail ? detail : "(no detail)");
    return 1;
}

bool progress_cb(void *user, const char *, uint64_t done, uint64_t total) {
    static_cast<ProgressBar *>(user)->update(done, total);
    return true;
}

const char *backend_name(int32_t b) {
    switch (b) {
        case FT_BACKEND_CPU: return "cpu";
        case FT_BACKEND_GPU: return "gpu (every expert resident)";
        case FT_BACKEND_OFFLOAD: return "offload (GPU slot cache)";
        case FT_BACKEND_HYBRID: return "hybrid (GPU slot cache + CPU)";
        default: return "?";
    }
}

const char *act_name(int32_t a) {
    switch (a) {
        case FT_ACT_SILU: return "silu";
        case FT_ACT_GELU: return "gelu";
        case FT_ACT_GELU_TANH: return "gelu_tanh";
        case FT_ACT_SWIGLU_CLAMP: return "swiglu_clamp";
        default: return "?";
    }
}

const char *format_name(int32_t f) {
    static const char *names[] = {"?",    "bf16", "fp8_block", "nvfp4", "mxfp4", "ds_fp4", "q4_0",
                                  "q8_0", "q2_k", "q3_k",      "q4_k",  "q5_k",  "q6_k",   "iq4_xs"};
    return f >= 1 && f <= 13 ? names[f] : "?";
}

const char *routing_name(int32_t r) {
    switch (r) {
        case FT_ROUTING_SOFTMAX_TOPK: return "softmax top-k";
        case FT_ROUTING_SOFTMAX_TOPK_RENORM: return "softmax top-k, renormalised";
        case FT_ROUTING_SIGMOID_GROUP_TOPK: return "sigmoid + bias, group-limited top-k";
        case FT_ROUTING_TOPK_SOFTMAX: return "top-k, softmax over k";
        case FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK: return "sqrt(softplus) + bias, group-limited top-k";
        case FT_ROUTING_TOPK_SIGMOID: return "top-k, sigmoid weights";
        case FT_ROUTING_SOFTMAX_GROUP_TOPK: return "softmax, group-limited top-k";
        case FT_ROUTING_SOFTMAX_BIASED_TOPK: return "softmax + bias, top-k";
        case FT_ROUTING_SPARSEMIXER: return "sparsemixer (top-2)";
        default: return "?";
    }
}

std::vector<FormatRun> format_runs(const ft_model *model, const ft_model_info &m) {
    std::vector<FormatRun> runs;
    for (int32_t l = 0; l < m.num_layers; ++l) {
        int32_t gu = m.format, dn = m.format;
        if (model && m.mixed_formats) ft_model_layer_formats(model, l, &gu, &dn);
        if (!runs.empty() && runs.back().gate_up == gu && runs.back().down == dn && runs.back().last == l - 1)
            runs.back().last = l;
        else
            runs.push_back({l, l, gu, dn});
    }
    return runs;
}

std::string format_mix(const std::vector<FormatRun> &runs) {
    std::string out;
    for (const FormatRun &r : runs) {
        if (!out.empty()) out += ", ";
        out += std::to_string(r.first);
        if (r.last != r.first) out += "-" + std::to_string(r.last);
        out += " ";
        out += format_name(r.gate_up);
        if (r.down != r.gate_up) out += std::string("/") + format_name(r.down);
    }
    return out;
}

namespace {

// One expert's gate/up and down bytes in these formats. Bank 0 is gate/up and bank 1 down for
// every format that mixes (the GGUF block formats).
std::pair<uint64_t, uint64_t> matrix_bytes(const ft_model_info &m, int32_t gate_up, int32_t down) {
    return {ft::bank_schema(static_cast<ft::Format>(gate_up), m.hidden_size, m.intermediate_size)[0].row_bytes,
            ft::bank_schema(static_cast<ft::Format>(down), m.hidden_size, m.intermediate_size)[1].row_bytes};
}

}  // namespace

std::vector<uint64_t> layer_expert_bytes(const ft_model *model, const ft_model_info &m) {
    std::vector<uint64_t> out(static_cast<size_t>(m.num_layers), m.expert_bytes);
    if (!m.mixed_formats || !model) return out;
    for (const FormatRun &r : format_runs(model, m)) {
        const auto [gu, dn] = matrix_bytes(m, r.gate_up, r.down);
        for (int32_t l = r.first; l <= r.last; ++l) out[static_cast<size_t>(l)] = gu + dn;
    }
    return out;
}

std::vector<FormatShare> format_shares(const ft_model *model, const ft_model_info &m) {
    if (!m.mixed_formats || !model) return {{m.format, 1.0}};
    std::map<int32_t, double> bytes;
    double total = 0.0;
    for (const FormatRun &r : format_runs(model, m)) {
        const double layers = r.last - r.first + 1;
        const auto [gu, dn] = matrix_bytes(m, r.gate_up, r.down);
        bytes[r.gate_up] += layers * gu;
        bytes[r.down] += layers * dn;
        total += layers * (gu + dn);
    }
    std::vector<FormatShare> out;
    for (const auto &[f, b] : bytes) out.push_back({f, total > 0.0 ? b / total : 0.0});
    std::stable_sort(out.begin(), out.end(), [](const FormatShare &a, const FormatShare &b) { return a.share > b.share; });
    return out;
}

std::string shares_text(const std::vector<FormatShare> &shares) {
    std::string out;
    for (const FormatShare &f : shares) {
        char buf[48];
        std::snprintf(buf, sizeof buf, "%s%s %.0f%%", out.empty() ? "" : " + ", format_name(f.format), 100.0 * f.share);
        out += buf;
    }
    return out;
}

void print_model(const ft_model_info &m, const ft_model *model) {
    std::printf("model       %s: %d MoE layers (first at layer %d of %d), %d experts, top-%d\n", m.architecture, m.num_layers,
                m.first_moe_layer, m.total_layers, m.num_experts, m.top_k);
    const std::string format =
        m.mixed_formats ? "mixed " + shares_text(format_shares(model, m)) + " of the bytes" : format_name(m.format);
    std::printf("            H=%d I=%d, %s, %s, routing %s", m.hidden_size, m.intermediate_size, format.c_str(),
                act_name(m.activation), routing_name(m.routing));
    if (m.routing == FT_ROUTING_SIGMOID_GROUP_TOPK || m.routing == FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK ||
        m.routing == FT_ROUTING_SOFTMAX_GROUP_TOPK)
        std::printf(" (%d groups, keep %d, scale %.3g)", m.num_groups, m.topk_groups, m.routed_scaling_factor);
    std::printf("\n            %.2f MB per expert, %.2f GB of routed experts", m.expert_bytes / 1e6, m.bank_bytes / 1e9);
    if (m.shared_intermediate_size) std::printf(", shared expert width %d", m.shared_intermediate_size);
    std::printf("\n");
    if (m.mixed_formats)
        std::printf("            mixed formats per MoE layer (gate_up/down): %s; MB per expert is the largest layer's\n",
                    format_mix(format_runs(model, m)).c_str());
}

void print_engine(ft_engine *engine) {
    ft_engine_info e;
    e.struct_size = sizeof e;
    ft_engine_get_info(engine, &e);
    std::printf("engine      %d CPU workers (%d physical cores), kernels %s, %s%s\n", e.cpu_threads, e.physical_cores, e.cpu_isa,
                e.device >= 0 ? "GPU " : "no GPU", e.device >= 0 ? e.device_name : "");
}

bool gpu_backend(int32_t b) { return b == FT_BACKEND_GPU || b == FT_BACKEND_OFFLOAD || b == FT_BACKEND_HYBRID; }

const char *backend_key(int32_t b) {
    switch (b) {
        case FT_BACKEND_CPU: return "cpu";
        case FT_BACKEND_GPU: return "gpu";
        case FT_BACKEND_OFFLOAD: return "offload";
        case FT_BACKEND_HYBRID: return "hybrid";
        default: return "?";
    }
}

nlohmann::json model_json(const ft_model_info &m, const std::string &path, bool synthetic, const ft_model *model) {
    nlohmann::json j = {{"path", path},
                        {"synthetic", synthetic},
                        {"architecture", m.architecture},
                        {"moe_layers", m.num_layers},
                        {"first_moe_layer", m.first_moe_layer},
                        {"total_layers", m.total_layers},
                        {"experts", m.num_experts},
                        {"top_k", m.top_k},
                        {"hidden_size", m.hidden_size},
                        {"intermediate_size", m.intermediate_size},
                        {"format", format_name(m.format)},
                        {"activation", act_name(m.activation)},
                        {"routing", routing_name(m.routing)},
                        {"expert_bytes", m.expert_bytes},
                        {"bank_bytes", m.bank_bytes},
                        {"shared_intermediate_size", m.shared_intermediate_size}};
    if (m.routing == FT_ROUTING_SIGMOID_GROUP_TOPK || m.routing == FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK ||
        m.routing == FT_ROUTING_SOFTMAX_GROUP_TOPK) {
        j["num_groups"] = m.num_groups;
        j["topk_groups"] = m.topk_groups;
        j["routed_scaling_factor"] = m.routed_scaling_factor;
    }
    j["mixed_formats"] = m.mixed_formats != 0;
    nlohmann::json shares = nlohmann::json::array();
    for (const FormatShare &f : format_shares(model, m)) shares.push_back({{"format", format_name(f.format)}, {"share", f.share}});
    j["format_shares"] = shares;
    if (m.mixed_formats) {
        nlohmann::json runs = nlohmann::json::array();
        for (const FormatRun &r : format_runs(model, m))
            runs.push_back({{"first_layer", r.first}, {"last_layer", r.last}, {"gate_up", format_name(r.gate_up)},
                            {"down", format_name(r.down)}});
        j["layer_formats"] = runs;
    }
    return j;
}

nlohmann::json profile_json(const ProfileStatus &p) {
    nlohmann::json j = {{"path", p.path}, {"state", p.state}};
    if (!p.detail.empty()) j["detail"] = p.detail;
    if (p.state == "applies") {
        j["cpu_gbs"] = p.cpu_gbs;
        if (p.fetch_fraction >= 0) j["fetch_fraction"] = p.fetch_fraction;
    }
    // Each format of the model with its share of the bytes and, where the profile applies, its figures.
    nlohmann::json formats = nlohmann::json::array();
    for (const ProfileFigures &f : p.formats) {
        nlohmann::json e = {{"format", format_name(f.format)}, {"share", f.share}};
        if (p.state == "applies" || p.state == "no_figures") {
            e["measured"] = f.measured;
            if (f.measured) e["cpu_gbs"] = f.cpu_gbs;
            if (f.fetch_fraction >= 0) e["fetch_fraction"] = f.fetch_fraction;
        }
        formats.push_back(e);
    }
    j["formats"] = formats;
    return j;
}

}  // namespace ft::tool
