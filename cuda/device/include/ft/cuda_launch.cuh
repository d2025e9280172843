// Programmatic dependent launch (PDL, sm_90 and later) for chains of small kernels on one stream.
//
// A kernel launched with launch_pdl() may be scheduled before the kernel ahead of it in the
// stream has finished: its blocks start, run until pdl_wait(), and wait there until the previous
// kernel has completed and its memory is visible. So every kernel launched with launch_pdl()
// must call pdl_wait() before it reads anything an earlier kernel wrote (and before it writes
// anything an earlier kernel reads); the chain then computes exactly what plain launches compute,
// minus the launch gap between kernels (a microsecond or two each, which dominates a decode step
// of several single-wave kernels). A kernel may call pdl_trigger() once the rest of its work no
// longer needs the SM to itself: the next PDL kernel is then scheduled right away instead of when
// this one's last block exits. Both are no-ops on older GPUs, where launch_pdl() launches plainly.
// Graph capture keeps the programmatic edges (CUDA 12.3 and later).
//
// FT_CUDA_PDL=0 (an engine knob, applied process-wide by set_pdl_allowed in cuda_device.hpp)
// launches everything plainly.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "ft/cuda_device.hpp"

namespace ft::cuda {

// Whether the current device takes programmatic launches (compute capability 9.0 or later, cached
// per device ordinal) and they are allowed (pdl_allowed(), FT_CUDA_PDL).
inline bool pdl_enabled() {
    if (!pdl_allowed()) return false;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    constexpr int kCached = 64;
    static std::atomic<int> known[kCached];  // 0 unknown, 1 yes, -1 no
    if (device >= 0 && device < kCached) {
        const int k = known[device].load(std::memory_order_relaxed);
        if (k != 0) return k > 0;
    }
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    if (device >= 0 && device < kCached) known[device].store(major >= 9 ? 1 : -1, std::memory_order_relaxed);
    return major >= 9;
}

// kernel<<<grid, block, smem, stream>>>(args...), allowed to overlap the previous kernel's tail.
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args &&...args) {
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
    config.attrs = attribute;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Waits until the previous kernel of the stream has completed and its writes are visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next PDL kernel of the stream be scheduled now (it still waits in pdl_wait()).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace ft::cuda
