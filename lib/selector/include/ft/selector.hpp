// Backend selection. Each backend is a row of a small table: its id and name, and a probe that
// says whether it can run a model on this machine (and why not). `auto` takes the first
// available backend in preference order. Backends join the table as they are built.
#pragma once

#include <cstdint>
#include <string>

#include "ft/model.hpp"

namespace ft {

struct MachineCaps {
    bool gpu = false;             // a usable CUDA device is attached to the engine
    bool gpu_kernels = false;     // this build has the GPU backends (built with CUDA)
    uint64_t gpu_free_bytes = 0;
    uint64_t vram_reserve_bytes = 0;  // what the session leaves free (ft_session_params)
    int32_t cpu_threads = 0;
};

struct BackendChoice {
    int32_t backend = FT_BACKEND_CPU;
    std::string reason;           // why this backend, for logs and tools
};

const char *backend_name(int32_t backend);  // "cpu", "gpu", "offload", "hybrid", "auto", or "unknown"

// Resolves `requested` (FT_BACKEND_*) for this model and machine. Throws FT_ERR_INVALID_ARGUMENT
// for unknown values and FT_ERR_UNSUPPORTED when the requested backend cannot run here.
BackendChoice select_backend(int32_t requested, const MachineCaps &caps, const ModelSpec &model);

}  // namespace ft
