// cudaError_t -> ft::Error for the host code of the GPU modules: nothing for cudaSuccess; else the
// error is cleared (so later calls are not blamed for a non-sticky one) and thrown as
// FT_ERR_OUT_OF_MEMORY for an allocation failure, FT_ERR_DEVICE otherwise, with the message
// "<what...>: <CUDA's text> (<its name>)". Only for translation units compiled with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include "ft/common.hpp"

namespace ft::cuda {

template <typename... What>
void check_cuda(cudaError_t e, const What &...what) {
    if (e == cudaSuccess) return;
    cudaGetLastError();
    fail(e == cudaErrorMemoryAllocation ? FT_ERR_OUT_OF_MEMORY : FT_ERR_DEVICE, what..., ": ", cudaGetErrorString(e),
         " (", cudaGetErrorName(e), ")");
}

}  // namespace ft::cuda
