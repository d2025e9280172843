#include <algorithm>

#include "ft/cuda_numerics.cuh"
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

__global__ void hybrid_stage_kernel(const HybridStage s) {
    const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = first; i < s.routes; i += stride) {
        const int32_t id = s.ids[i];
        s.host_ids[i] = s.slots[i] < 0 && id >= 0 && id < s.experts ? id : -1;
        s.host_weights[i] = s.weights[i];
    }
    // Hidden states in 16-byte pieces where both sides allow it (PCIe writes of whole pieces).
    const bool wide = (reinterpret_cast<uintptr_t>(s.x) | reinterpret_cast<uintptr_t>(s.host_x)) % 16 == 0;
    const int64_t pieces = wide ? s.x_elems / 8 : 0;
    for (int64_t i = first; i < pieces; i += stride)
        reinterpret_cast<uint4 *>(s.host_x)[i] = reinterpret_cast<const uint4 *>(s.x)[i];
    for (int64_t i = pieces * 8 + first; i < s.x_elems; i += stride) s.host_x[i] = s.x[i];
    if (first == 0 && s.missing) *s.host_missing = *s.missing;
    __threadfence_system();
}

__global__ void scale_input_kernel(const uint16_t *x, const float *w, int64_t tokens, int64_t hidden, uint16_t *xs,
                                   float *ones) {
    const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = first; i < tokens * hidden; i += stride)
        xs[i] = f32_to_bf16(w[i / hidden] * bf16_to_f32(x[i]));
    for (int64_t t = first; t < tokens; t += stride) ones[t] = 1.0f;
}

}  // namespace

cudaError_t launch_scale_input(const uint16_t *x, const float *w, int64_t tokens, int64_t hidden, uint16_t *xs, float *ones,
                               cudaStream_t stream) {
    if (tokens < 0 || hidden <= 0 || (tokens > 0 && (!x || !w || !xs || !ones))) return cudaErrorInvalidValue;
    if (tokens == 0) return cudaSuccess;
    const int blocks = int(std::min<int64_t>((tokens * hidden + kThreads - 1) / kThreads, 1024));
    scale_input_kernel<<<blocks, kThreads, 0, stream>>>(x, w, tokens, hidden, xs, ones);
    return cudaGetLastError();
}

cudaError_t launch_hybrid_stage(const HybridStage &s, cudaStream_t stream) {
    if (s.routes < 0 || s.x_elems < 0 || s.experts <= 0) return cudaErrorInvalidValue;
    if (s.routes > 0 && (!s.ids || !s.slots || !s.weights || !s.host_ids || !s.host_weights)) return cudaErrorInvalidValue;
    if (s.x_elems > 0 && (!s.x || !s.host_x)) return cudaErrorInvalidValue;
    if (s.missing && !s.host_missing) return cudaErrorInvalidValue;
    const int64_t work = std::max<int64_t>({s.routes, s.x_elems / 8, 1});
    const int blocks = int(std::min<int64_t>((work + kThreads - 1) / kThreads, 64));
    hybrid_stage_kernel<<<blocks, kThreads, 0, stream>>>(s);
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
