// Factory of the GPU session backends (FT_BACKEND_GPU, FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID).
// Only in builds with CUDA; the session asks the selector first, which refuses these backends
// elsewhere.
#pragma once

#include <cstdint>
#include <memory>

#include "ft/backend.hpp"

namespace ft {

// Creates the backend `backend` for ctx.model on GPU ctx.device. Throws ft::Error:
// FT_ERR_NO_DEVICE (no device in ctx), FT_ERR_OUT_OF_MEMORY (experts or one layer of slots do not
// fit), FT_ERR_UNSUPPORTED (offload on banks that are not page-locked), FT_ERR_DEVICE or
// FT_ERR_DEVICE_LOST (CUDA failures, ft/cuda_check.hpp).
std::unique_ptr<Backend> make_cuda_backend(int32_t backend, const BackendContext &ctx);

}  // namespace ft
