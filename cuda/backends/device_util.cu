#include "ft/device_util.hpp"

namespace ft::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kBitmapWords = 2048;  // distinct counting for up to 65536 experts

__global__ void resident_slots_kernel(const int32_t *ids, int32_t *slots, int64_t count, int32_t experts,
                                      int64_t *layer_stats) {
    __shared__ uint32_t seen[kBitmapWords];
    __shared__ unsigned long long distinct;
    const bool count_distinct = layer_stats != nullptr && experts <= kBitmapWords * 32;
    for (int i = threadIdx.x; i < kBitmapWords; i += blockDim.x) seen[i] = 0;
    if (threadIdx.x == 0) distinct = 0;
    __syncthreads();
    unsigned long long my_distinct = 0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
        const int32_t id = ids[i];
        const bool ok = id >= 0 && id < experts;
        slots[i] = ok ? id : -1;
        if (ok && count_distinct) {
            const uint32_t bit = 1u << (id & 31);
            if (!(atomicOr(&seen[id >> 5], bit) & bit)) ++my_distinct;
        }
    }
    atomicAdd(&distinct, my_distinct);
    __syncthreads();
    if (threadIdx.x == 0 && layer_stats) {
        // Columns of the slot cache's statistics rows (SlotCacheStat): every expert is resident.
        layer_stats[0] += static_cast<int64_t>(distinct);  // active
        layer_stats[3] += 1;                                // calls
    }
}

__global__ void cpu_ids_kernel(const int32_t *ids, const int32_t *slots, int32_t *cpu_ids, int64_t count, int32_t experts) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
        const int32_t id = ids[i];
        cpu_ids[i] = slots[i] < 0 && id >= 0 && id < experts ? id : -1;
    }
}

}  // namespace

cudaError_t launch_cpu_ids(const int32_t *ids, const int32_t *slots, int32_t *cpu_ids, int64_t count, int32_t experts,
                           cudaStream_t stream) {
    if (count < 0 || experts <= 0 || (count > 0 && (!ids || !slots || !cpu_ids))) return cudaErrorInvalidValue;
    if (count == 0) return cudaSuccess;
    const int blocks = int((count + kThreads - 1) / kThreads < 64 ? (count + kThreads - 1) / kThreads : 64);
    cpu_ids_kernel<<<blocks, kThreads, 0, stream>>>(ids, slots, cpu_ids, count, experts);
    return cudaGetLastError();
}

cudaError_t launch_resident_slots(const int32_t *ids, int32_t *slots, int64_t count, int32_t experts,
                                  int64_t *layer_stats, cudaStream_t stream) {
    if (count < 0 || experts <= 0 || (count > 0 && (!ids || !slots))) return cudaErrorInvalidValue;
    if (count == 0) return cudaSuccess;
    resident_slots_kernel<<<1, kThreads, 0, stream>>>(ids, slots, count, experts, layer_stats);
    return cudaGetLastError();
}

}  // namespace ft::cuda
