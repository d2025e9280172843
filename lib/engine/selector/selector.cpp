#include "ft/selector.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "ft/backend_registry.hpp"
#include "ft/common.hpp"
#include "ft/slotcache.hpp"

namespace ft {

namespace {

// The registry's probe of `id` (backend_registry.cpp).
std::string unavailable(int32_t id, const MachineCaps &caps, const ModelSpec &model) {
    return find_backend(id)->unavailable(caps, model);
}

bool positive(const std::optional<double> &v) { return v && std::isfinite(*v) && *v > 0.0; }

// "1.23 ms" with three significant digits.
std::string ms(double seconds) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g ms", seconds * 1e3);
    return buf;
}

std::string gbs(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GB/s", v);
    return buf;
}

// One format of a model: its share of a decode step's bytes, and the profile entry its figures
// come from (null if the profile has none with CPU and gather figures).
struct FormatShare {
    FormatShare(Format f, double s) : format(f), share(s) {}
    Format format;
    double share;
    const KernelEntry *entry = nullptr;
    std::string source;
};

// The first entry for `key` with CPU and gather figures, in the reader's order (dtype_kernels,
// then each workload in file order); null if none.
const KernelEntry *measured_entry(const Profile &profile, const std::string &key, std::string &source) {
    auto usable = [](const KernelEntry &e) { return positive(e.cpu_moe_gbs) && positive(e.pcie_gather_gbs); };
    if (auto it = profile.dtype_kernels.find(key); it != profile.dtype_kernels.end() && usable(it->second)) {
        source = "dtype_kernels." + key;
        return &it->second;
    }
    for (const WorkloadEntry &w : profile.workloads) {
        if (auto it = w.kernels.find(key); it != w.kernels.end() && usable(it->second)) {
            source = cat("workloads.", w.name, ".kernels.", key);
            return &it->second;
        }
    }
    return nullptr;
}

// The formats of `model`, each with its share of the routed bytes: every MoE layer's gate/up bank
// in its format and its down bank in its own. A step reads top_k experts of every layer, so
// these are also the shares of a token's expert bytes. Largest share first.
std::vector<FormatShare> format_shares(const Profile &profile, const ModelSpec &model) {
    std::vector<FormatShare> out;
    if (!model.mixed_formats()) {
        out.emplace_back(model.format, 1.0);
    } else {
        std::map<Format, double> bytes;
        double total = 0.0;
        for (int32_t l = 0; l < model.num_layers; ++l) {
            const LayerFormats lf = model.formats_of(l);
            const double gu = double(bank_schema(lf.gate_up, model.hidden, model.intermediate)[0].row_bytes);
            const double dn = double(bank_schema(lf.down, model.hidden, model.intermediate)[1].row_bytes);
            bytes[lf.gate_up] += gu;
            bytes[lf.down] += dn;
            total += gu + dn;
        }
        for (const auto &[f, b] : bytes) out.emplace_back(f, total > 0.0 ? b / total : 0.0);
        std::stable_sort(out.begin(), out.end(), [](const FormatShare &a, const FormatShare &b) { return a.share > b.share; });
    }
    for (FormatShare &f : out) f.entry = measured_entry(profile, profile_format_key(f.format), f.source);
    return out;
}

// One rate for bytes split over the formats at their shares: the bytes over the time each
// share takes at its format's rate, 1 / sum(share / rate). Empty when a format lacks the figure.
std::optional<double> blended(const std::vector<FormatShare> &shares, std::optional<double> KernelEntry::*figure) {
    double seconds_per_byte = 0.0;
    for (const FormatShare &f : shares) {
        if (!f.entry || !positive(f.entry->*figure)) return std::nullopt;
        seconds_per_byte += f.share / *(f.entry->*figure);
    }
    if (!(seconds_per_byte > 0.0)) return std::nullopt;
    return 1.0 / seconds_per_byte;
}

// The figures a model's decode traffic meets: the one entry of a single-format model, else the
// byte-weighted blend of its formats' entries (overlapped figures only when every format has them).
KernelEntry model_entry(const std::vector<FormatShare> &shares) {
    if (shares.size() == 1) return *shares[0].entry;
    KernelEntry e;
    e.cpu_moe_gbs = blended(shares, &KernelEntry::cpu_moe_gbs);
    e.pcie_gather_gbs = blended(shares, &KernelEntry::pcie_gather_gbs);
    e.cpu_moe_overlap_gbs = blended(shares, &KernelEntry::cpu_moe_overlap_gbs);
    e.pcie_gather_overlap_gbs = blended(shares, &KernelEntry::pcie_gather_overlap_gbs);
    if (!e.cpu_moe_overlap_gbs || !e.pcie_gather_overlap_gbs) e.cpu_moe_overlap_gbs = e.pcie_gather_overlap_gbs = std::nullopt;
    return e;
}

bool all_measured(const std::vector<FormatShare> &shares) {
    return std::all_of(shares.begin(), shares.end(), [](const FormatShare &f) { return f.entry != nullptr; });
}

BackendChoice select_auto(const MachineCaps &caps, const ModelSpec &model, const SelectionInputs &in) {
    BackendChoice c;
    const std::string gpu_why = unavailable(FT_BACKEND_GPU, caps, model);
    if (gpu_why.empty()) {
        c.backend = FT_BACKEND_GPU;
        c.reason = "auto: gpu, every expert fits the GPU memory beyond the reserve";
        return c;
    }
    const std::string offload_why = unavailable(FT_BACKEND_OFFLOAD, caps, model);
    const std::string cpu_why = unavailable(FT_BACKEND_CPU, caps, model);
    // Without a GPU (or room for one layer) only the CPU remains; no prediction needed.
    if (!offload_why.empty()) {
        if (!cpu_why.empty()) fail(FT_ERR_UNSUPPORTED, "no backend can run this model: gpu: ", gpu_why, "; cpu: ", cpu_why,
                                   "; offload: ", offload_why);
        c.backend = FT_BACKEND_CPU;
        c.reason = cat("auto: cpu, the only backend available (gpu: ", gpu_why, "; offload/hybrid: ", offload_why, ")");
        return c;
    }
    const double s = expected_slot_fraction(caps, model, in);
    if (in.profile) c.prediction = predict_step(*in.profile, model, s, in.hbm_gbs);
    const StepPrediction &p = c.prediction;
    if (!p.usable) {
        c.backend = FT_BACKEND_OFFLOAD;
        c.reason = cat("auto: offload, the fallback with a GPU: ",
                       in.profile ? cat("the profile has no cpu and gather figures for ", p.missing) : std::string("no usable profile"),
                       " (run `ft profile` to let measurements choose between cpu, offload and hybrid); gpu: ", gpu_why);
        return c;
    }
    // Lowest predicted time among the available backends; ties keep the earlier (simpler) one.
    struct Candidate {
        int32_t id;
        double seconds;
    };
    Candidate cands[] = {{FT_BACKEND_OFFLOAD, p.offload_s}, {FT_BACKEND_CPU, cpu_why.empty() ? p.cpu_s : 0.0},
                         {FT_BACKEND_HYBRID, cpu_why.empty() ? p.hybrid_s : 0.0}};
    const Candidate *best = nullptr;
    for (const Candidate &k : cands) {
        if (k.seconds > 0.0 && (!best || k.seconds < best->seconds)) best = &k;
    }
    c.backend = best->id;
    c.reason = cat("auto: ", backend_name(c.backend), ", lowest predicted step time per layer (", p.formats, " figures of ",
                   p.source, "; slots ", std::lround(100.0 * p.slot_fraction), "% of experts, expected hit rate ",
                   std::lround(100.0 * p.hit_rate), "% assuming uniform routing): cpu ", ms(p.cpu_s), " at ", gbs(p.cpu_gbs),
                   ", offload ", ms(p.offload_s), " at ", gbs(p.gather_gbs), ", hybrid ",
                   p.hybrid_s > 0.0 ? cat(ms(p.hybrid_s), " at f ", p.fetch_fraction, " (", gbs(p.gather_ov_gbs), " + ",
                                          gbs(p.cpu_ov_gbs), " overlapped)")
                                    : std::string("not predicted (no overlapped figures)"),
                   ", gpu-resident would be ", ms(p.gpu_s), " but ", gpu_why);
    return c;
}

}  // namespace

StepPrediction predict_step(const Profile &profile, const ModelSpec &model, double slot_fraction, double hbm_gbs) {
    StepPrediction p;
    const std::vector<FormatShare> shares = format_shares(profile, model);
    for (const FormatShare &f : shares) {
        const std::string key = profile_format_key(f.format);
        if (shares.size() > 1) p.formats += cat(p.formats.empty() ? "" : " + ", key, " ", std::lround(100.0 * f.share), "%");
        else p.formats = key;
        if (!f.entry) p.missing += cat(p.missing.empty() ? "" : ", ", key);
        else p.source += cat(p.source.empty() ? "" : " + ", f.source);
    }
    p.slot_fraction = std::clamp(slot_fraction, 0.0, 1.0);
    p.hit_rate = p.slot_fraction;  // uniform routing (header)
    p.hbm_gbs = hbm_gbs > 0.0 ? hbm_gbs : kDefaultHbmGbs;
    // Mean over the layers of each layer's real expert bytes (they differ where formats mix).
    const double step_bytes = double(model.top_k) * double(model.routed_bytes()) /
                              (double(std::max(model.num_layers, 1)) * double(std::max(model.num_experts, 1)));
    p.gpu_s = step_bytes / (p.hbm_gbs * 1e9);
    if (!all_measured(shares)) {
        p.source.clear();
        return p;
    }
    const KernelEntry e = model_entry(shares);
    p.usable = true;
    p.cpu_gbs = *e.cpu_moe_gbs;
    p.gather_gbs = *e.pcie_gather_gbs;
    const double h = p.hit_rate, miss = (1.0 - h) * step_bytes, hit_s = h * step_bytes / (p.hbm_gbs * 1e9);
    p.cpu_s = step_bytes / (p.cpu_gbs * 1e9);
    p.offload_s = miss / (p.gather_gbs * 1e9) + hit_s;
    if (positive(e.cpu_moe_overlap_gbs) && positive(e.pcie_gather_overlap_gbs)) {
        p.cpu_ov_gbs = *e.cpu_moe_overlap_gbs;
        p.gather_ov_gbs = *e.pcie_gather_overlap_gbs;
        // The fraction the session's hybrid backend will use (model_fetch_fraction), from this profile.
        p.fetch_fraction = model_fetch_fraction(profile, model).value_or(p.gather_ov_gbs / (p.gather_ov_gbs + p.cpu_ov_gbs));
        const double f = p.fetch_fraction;
        p.hybrid_s = std::max(f * miss / (p.gather_ov_gbs * 1e9), (1.0 - f) * miss / (p.cpu_ov_gbs * 1e9)) + hit_s;
        // Every expert a hit: nothing for the CPU, the step is the hit part alone (still > 0).
        if (!(p.hybrid_s > 0.0)) p.hybrid_s = hit_s;
    }
    return p;
}

std::optional<double> model_fetch_fraction(const Profile &profile, const ModelSpec &model) {
    if (!model.mixed_formats()) return hybrid_fetch_fraction(profile, profile_format_key(model.format));
    const std::vector<FormatShare> shares = format_shares(profile, model);
    if (!all_measured(shares)) return std::nullopt;
    return entry_fetch_fraction(model_entry(shares));
}

double expected_slot_fraction(const MachineCaps &caps, const ModelSpec &model, const SelectionInputs &in) {
    const uint64_t eb = model.max_expert_bytes();  // a slot holds each bank's largest row
    SlotRequest r;
    r.count = std::max<int64_t>(in.cache_slots, 0);
    r.fraction = in.cache_fraction > 0.0 ? in.cache_fraction : 0.0;
    // The backend allocates its two prefill layer buffers (and bf16 gpt-oss's bias tables) before
    // it sizes the cache.
    const uint64_t prefill = 2 * eb * uint64_t(std::max(model.num_experts, 0)) + gpu_bias_bytes(model);
    r.free_bytes = caps.gpu_free_bytes > prefill ? caps.gpu_free_bytes - prefill : 0;
    r.reserve_bytes = caps.vram_reserve_bytes;
    const SlotPlan p = plan_slots(r, model.num_layers, model.num_experts, eb);
    return p.status == FT_OK ? double(p.slots) / (double(model.num_layers) * double(model.num_experts)) : 0.0;
}

const char *backend_name(int32_t backend) {
    if (backend == FT_BACKEND_AUTO) return "auto";
    const BackendInfo *b = find_backend(backend);
    return b ? b->name : "unknown";
}

BackendChoice select_backend(int32_t requested, const MachineCaps &caps, const ModelSpec &model, const SelectionInputs &inputs) {
    if (requested == FT_BACKEND_AUTO) return select_auto(caps, model, inputs);
    const BackendInfo *b = find_backend(requested);
    if (!b) fail(FT_ERR_INVALID_ARGUMENT, "unknown backend ", requested);
    const std::string why = b->unavailable(caps, model);
    if (!why.empty()) fail(FT_ERR_UNSUPPORTED, "backend ", b->name, " cannot run this model: ", why);
    BackendChoice c;
    c.backend = b->id;
    c.reason = cat(b->name, " requested");
    return c;
}

BackendChoice select_backend(int32_t requested, const MachineCaps &caps, const ModelSpec &model) {
    return select_backend(requested, caps, model, SelectionInputs{});
}

}  // namespace ft
