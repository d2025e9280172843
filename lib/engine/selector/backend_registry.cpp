#include "ft/backend_registry.hpp"

#include "ft/common.hpp"
#include "ft/cpu_backend.hpp"
#include "ft/selector.hpp"
#ifdef FT_HAVE_CUDA_BACKENDS
#include "ft/cuda_backends.hpp"
#endif

namespace ft {

namespace {

std::string cpu_unavailable(const MachineCaps &caps, const ModelSpec &model) {
    // Every expert format has CPU kernels (cpu/README.md); only unknown values are refused.
    (void)caps;
    if (!format_known(static_cast<int32_t>(model.format))) return cat("no CPU kernel for format ", static_cast<int32_t>(model.format));
    return {};
}

std::string gpu_missing(const MachineCaps &caps, const ModelSpec &model) {
    if (!caps.gpu_kernels) return "this build has no CUDA support";
    if (!caps.gpu) return "the engine has no GPU";
    if (model.route_weight == FT_ROUTE_WEIGHT_INPUT && model.top_k != 1)
        return "route weights scale the expert input with top_k > 1, which only the cpu backend does (the GPU backends do it for top-1 models such as Llama-4)";
    return {};
}

uint64_t usable_vram(const MachineCaps &caps) {
    return caps.gpu_free_bytes > caps.vram_reserve_bytes ? caps.gpu_free_bytes - caps.vram_reserve_bytes : 0;
}

std::string resident_unavailable(const MachineCaps &caps, const ModelSpec &model) {
    if (std::string why = gpu_missing(caps, model); !why.empty()) return why;
    const uint64_t need = model.routed_bytes() + gpu_bias_bytes(model);
    if (need > usable_vram(caps))
        return cat(need / 1e9, " GB of experts do not fit the ", usable_vram(caps) / 1e9, " GB of GPU memory free beyond the reserve");
    return {};
}

std::string offload_unavailable(const MachineCaps &caps, const ModelSpec &model) {
    if (std::string why = gpu_missing(caps, model); !why.empty()) return why;
    if (model.num_experts > 1024) return cat(model.num_experts, " experts per layer; the slot cache admits at most 1024");
    const uint64_t layer = model.max_expert_bytes() * uint64_t(model.num_experts) + gpu_bias_bytes(model);
    if (layer > usable_vram(caps))
        return cat("one layer of experts (", layer / 1e9, " GB", model.expert_biases ? " with every layer's biases" : "",
                   ") does not fit the ", usable_vram(caps) / 1e9, " GB of GPU memory free beyond the reserve");
    return {};
}

#ifdef FT_HAVE_CUDA_BACKENDS
template <int32_t Id>
std::unique_ptr<Backend> make_gpu(const BackendContext &ctx) {
    return make_cuda_backend(Id, ctx);
}
constexpr auto kMakeResident = &make_gpu<FT_BACKEND_GPU>;
constexpr auto kMakeOffload = &make_gpu<FT_BACKEND_OFFLOAD>;
constexpr auto kMakeHybrid = &make_gpu<FT_BACKEND_HYBRID>;
#else
// The probes refuse these backends in a build without CUDA (caps.gpu_kernels is false).
constexpr std::unique_ptr<Backend> (*kMakeResident)(const BackendContext &) = nullptr;
constexpr std::unique_ptr<Backend> (*kMakeOffload)(const BackendContext &) = nullptr;
constexpr std::unique_ptr<Backend> (*kMakeHybrid)(const BackendContext &) = nullptr;
#endif

}  // namespace

const std::vector<BackendInfo> &backend_registry() {
    static const std::vector<BackendInfo> kBackends = {
        {FT_BACKEND_GPU, "gpu", true, resident_unavailable, kMakeResident},
        {FT_BACKEND_CPU, "cpu", false, cpu_unavailable, cpu::make_cpu_backend},
        {FT_BACKEND_OFFLOAD, "offload", true, offload_unavailable, kMakeOffload},
        {FT_BACKEND_HYBRID, "hybrid", true, offload_unavailable, kMakeHybrid},
    };
    return kBackends;
}

uint64_t gpu_bias_bytes(const ModelSpec &model) {
    if (!model.expert_biases) return 0;
    return uint64_t(model.num_layers) * uint64_t(model.num_experts) *
           (2 * uint64_t(model.intermediate) + uint64_t(model.hidden)) * sizeof(float);
}

const BackendInfo *find_backend(int32_t id) {
    for (const BackendInfo &b : backend_registry()) {
        if (b.id == id) return &b;
    }
    return nullptr;
}

const BackendInfo *find_backend(const std::string &name) {
    for (const BackendInfo &b : backend_registry()) {
        if (name == b.name) return &b;
    }
    return nullptr;
}

}  // namespace ft
