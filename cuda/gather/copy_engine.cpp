// The copy-engine gather (the gather by DMA): the plan comes to the host, then one cudaMemcpyAsync
// per run of entries and bank. Per-call overhead is a few microseconds per copy, small next to
// expert rows of megabytes; cudaMemcpyBatchAsync is not used because CUDA 13 turns batches over
// registered memory synchronous when small and large entries mix (as the original engine found).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ft/common.hpp"
#include "ft/cuda_check.hpp"
#include "ft/cuda_device.hpp"
#include "ft/cuda_gather.hpp"

namespace ft::cuda {

CopyEngineGather::CopyEngineGather(int32_t capacity) : capacity_(capacity) {
    if (capacity < 0) fail(FT_ERR_INVALID_ARGUMENT, "copy-engine gather: capacity ", capacity, " < 0");
    if (device_count() == 0) fail(FT_ERR_NO_DEVICE, "copy-engine gather: no CUDA device is usable");
    const size_t bytes = sizeof(int64_t) + 2 * sizeof(int32_t) * static_cast<size_t>(capacity);
    staging_ = PinnedBuffer(bytes, "copy-engine gather: cudaHostAlloc of the plan staging", cudaHostAllocPortable);
}

cudaError_t CopyEngineGather::gather(const GatherBank *banks, int num_banks, const GatherPlan &plan,
                                     cudaStream_t stream) {
    if (detail::gather_argument_error(banks, num_banks, plan) || plan.capacity > capacity_)
        return cudaErrorInvalidValue;
    // The synchronisation below would invalidate a capture in progress; refuse before touching it.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(stream, &capture);
    if (e != cudaSuccess) return e;
    if (capture != cudaStreamCaptureStatusNone) return cudaErrorStreamCaptureUnsupported;

    auto *count = staging_.get<int64_t>();
    auto *slots = reinterpret_cast<int32_t *>(count + 1);
    int32_t *sources = slots + capacity_;
    const size_t entry_bytes = sizeof(int32_t) * static_cast<size_t>(plan.capacity);
    e = cudaMemcpyAsync(count, plan.num_indices, sizeof(int64_t), cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess && entry_bytes)
        e = cudaMemcpyAsync(slots, plan.evict_slots, entry_bytes, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess && entry_bytes)
        e = cudaMemcpyAsync(sources, plan.src_indices, entry_bytes, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return e;

    int64_t n = *count;
    if (n > plan.capacity) n = plan.capacity;
    for (int64_t i = 0; i < n;) {
        if (slots[i] < 0 || sources[i] < 0) {
            ++i;
            continue;
        }
        // Admission hands out empty slots in ascending order to misses in ascending expert order,
        // so after a reset whole runs are contiguous on both sides: one copy each.
        int64_t run = 1;
        while (i + run < n && slots[i + run] == int64_t{slots[i]} + run &&
               sources[i + run] == int64_t{sources[i]} + run)
            ++run;
        for (int b = 0; b < num_banks; ++b) {
            const size_t row = banks[b].row_bytes, slot = banks[b].slot_bytes ? banks[b].slot_bytes : row;
            uint8_t *dst = banks[b].slots + static_cast<size_t>(slots[i]) * slot;
            const uint8_t *src = banks[b].host_layer + static_cast<size_t>(sources[i]) * row;
            // Slots wider than the rows: the run's rows land slot_bytes apart.
            e = slot == row ? cudaMemcpyAsync(dst, src, row * static_cast<size_t>(run), cudaMemcpyDefault, stream)
                            : cudaMemcpy2DAsync(dst, slot, src, row, row, static_cast<size_t>(run), cudaMemcpyDefault, stream);
            if (e != cudaSuccess) return e;
        }
        i += run;
    }
    return cudaSuccess;
}

}  // namespace ft::cuda
