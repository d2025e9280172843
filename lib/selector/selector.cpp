#include "ft/selector.hpp"

#include "ft/common.hpp"

namespace ft {

namespace {

struct BackendEntry {
    int32_t id;
    const char *name;
    // Empty string: available. Otherwise the reason it is not.
    std::string (*unavailable)(const MachineCaps &, const ModelSpec &);
};

std::string cpu_unavailable(const MachineCaps &caps, const ModelSpec &model) {
    // Every expert format has CPU kernels (cpu/README.md); only unknown values are refused.
    (void)caps;
    if (!format_known(static_cast<int32_t>(model.format))) return cat("no CPU kernel for format ", static_cast<int32_t>(model.format));
    return {};
}

std::string gpu_missing(const MachineCaps &caps) {
    if (!caps.gpu_kernels) return "this build has no CUDA support";
    if (!caps.gpu) return "the engine has no GPU";
    return {};
}

uint64_t usable_vram(const MachineCaps &caps) {
    return caps.gpu_free_bytes > caps.vram_reserve_bytes ? caps.gpu_free_bytes - caps.vram_reserve_bytes : 0;
}

std::string resident_unavailable(const MachineCaps &caps, const ModelSpec &model) {
    if (std::string why = gpu_missing(caps); !why.empty()) return why;
    const uint64_t need = uint64_t(expert_bytes(model.format, model.hidden, model.intermediate)) * model.num_experts * model.num_layers;
    if (need > usable_vram(caps))
        return cat(need / 1e9, " GB of experts do not fit the ", usable_vram(caps) / 1e9, " GB of GPU memory free beyond the reserve");
    return {};
}

std::string offload_unavailable(const MachineCaps &caps, const ModelSpec &model) {
    if (std::string why = gpu_missing(caps); !why.empty()) return why;
    if (model.num_experts > 1024) return cat(model.num_experts, " experts per layer; the slot cache admits at most 1024");
    const uint64_t layer = uint64_t(expert_bytes(model.format, model.hidden, model.intermediate)) * model.num_experts;
    if (layer > usable_vram(caps))
        return cat("one layer of experts (", layer / 1e9, " GB) does not fit the ", usable_vram(caps) / 1e9,
                   " GB of GPU memory free beyond the reserve");
    return {};
}

// Preference order for `auto`: first available wins. All experts resident on the GPU beats
// everything; between the CPU and the slot cache the choice needs the machine's measured
// bandwidths and the model's hit rate, so until a profile decides, `auto` keeps the CPU and
// offload is chosen explicitly.
const BackendEntry kBackends[] = {
    {FT_BACKEND_GPU, "gpu", resident_unavailable},
    {FT_BACKEND_CPU, "cpu", cpu_unavailable},
    {FT_BACKEND_OFFLOAD, "offload", offload_unavailable},
    {FT_BACKEND_HYBRID, "hybrid", offload_unavailable},
};

}  // namespace

const char *backend_name(int32_t backend) {
    if (backend == FT_BACKEND_AUTO) return "auto";
    for (const BackendEntry &b : kBackends) {
        if (b.id == backend) return b.name;
    }
    return "unknown";
}

BackendChoice select_backend(int32_t requested, const MachineCaps &caps, const ModelSpec &model) {
    if (requested == FT_BACKEND_AUTO) {
        std::string reasons;
        for (const BackendEntry &b : kBackends) {
            const std::string why = b.unavailable(caps, model);
            if (why.empty()) {
                return {b.id, cat("auto: ", b.name, " is the first available backend",
                                  reasons.empty() ? "" : " (", reasons, reasons.empty() ? "" : ")")};
            }
            reasons += cat(reasons.empty() ? "" : "; ", b.name, ": ", why);
        }
        fail(FT_ERR_UNSUPPORTED, "no backend can run this model: ", reasons);
    }
    for (const BackendEntry &b : kBackends) {
        if (b.id != requested) continue;
        const std::string why = b.unavailable(caps, model);
        if (!why.empty()) fail(FT_ERR_UNSUPPORTED, "backend ", b.name, " cannot run this model: ", why);
        return {b.id, cat(b.name, " requested")};
    }
    fail(FT_ERR_INVALID_ARGUMENT, "unknown backend ", requested);
}

}  // namespace ft
