// The GPU session backends: `gpu` keeps every expert in device memory, `offload` keeps a slot
// cache of hot experts and fetches each call's misses from the page-locked host banks, `hybrid`
// is offload with a bandwidth-matched share of the misses computed by the CPU (docs/formulas.md,
// "Hybrid split"). All three run few-token calls through the decode kernels (capturable, no host
// sync) and calls of prefill_min_tokens or more through the prefill path (GEMMs on the routing
// read on the host).
// Files: backend_base.hpp/.cpp (CudaBackend: what the three share), backend_resident.cpp (gpu),
// backend_offload.hpp/.cpp (offload), backend_hybrid.cpp (hybrid, whose split
// controller is lib/core/hybrid's ft/hybrid_controller.hpp); this file holds the factory.
#include "ft/cuda_backends.hpp"

#include "backend_base.hpp"

namespace ft {

std::unique_ptr<Backend> make_cuda_backend(int32_t backend, const BackendContext &ctx) {
    if (ctx.device < 0) fail(FT_ERR_NO_DEVICE, "the engine has no GPU");
    cuda::DeviceScope scope(ctx.device);
    switch (backend) {
        case FT_BACKEND_GPU: return gpu_backend::make_resident_backend(ctx);
        case FT_BACKEND_OFFLOAD: return gpu_backend::make_offload_backend(ctx);
        case FT_BACKEND_HYBRID: return gpu_backend::make_hybrid_backend(ctx);
        default: fail(FT_ERR_INTERNAL, "make_cuda_backend: backend ", backend, " is not a GPU backend");
    }
}

}  // namespace ft
