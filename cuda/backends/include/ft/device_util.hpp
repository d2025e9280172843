// Small device kernels of the GPU backends.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ft::cuda {

// slots[i] = ids[i] if 0 <= ids[i] < experts, else -1 (routes the device path cannot validate on
// the host are skipped, never read out of bounds). When layer_stats is not null it is one row of
// the slot cache's statistics (SlotCacheStat columns): adds the distinct experts (up to 65536
// experts per layer) to kStatActive and 1 to kStatCalls. One single-CTA launch; capturable.
cudaError_t launch_resident_slots(const int32_t *ids, int32_t *slots, int64_t count, int32_t experts,
                                  int64_t *layer_stats, cudaStream_t stream);

// Hybrid: everything the CPU task of one step reads, written by one kernel straight into mapped
// pinned host memory (the host_* pointers are device-visible pointers of such memory): the CPU's
// routes (ids[i] where the admission left slots[i] = -1 and the id is a valid expert, else -1), the routing weights, the hidden states and, when
// `missing` is not null, the step's distinct miss count. One launch instead of a kernel and four
// small copies (each a copy-engine round trip of a few microseconds on the step's critical path).
// Every thread fences its writes system-wide, so a stream operation ordered after the kernel (the
// handoff's go) cannot reach the host before the data. Capturable.
struct HybridStage {
    const int32_t *ids = nullptr;      // [routes] routed expert ids, device
    const int32_t *slots = nullptr;    // [routes] admission result, -1 = CPU route, device
    const float *weights = nullptr;    // [routes] device
    const uint16_t *x = nullptr;       // [x_elems] bf16 hidden states, device
    const int64_t *missing = nullptr;  // the admission's distinct miss count, device (optional)
    int64_t routes = 0;
    int64_t x_elems = 0;
    int32_t experts = 0;
    int32_t *host_ids = nullptr;
    float *host_weights = nullptr;
    uint16_t *host_x = nullptr;
    int64_t *host_missing = nullptr;   // required when `missing` is set
};
cudaError_t launch_hybrid_stage(const HybridStage &stage, cudaStream_t stream);

// Input-scaled routes of a top-1 model (FT_ROUTE_WEIGHT_INPUT, Llama-4): xs[t] = bf16(w[t] * x[t])
// (x, xs [tokens, hidden] bf16) and ones[t] = 1, so the expert kernels compute expert(w x)
// added unweighted, as the cpu backend does. Capturable.
cudaError_t launch_scale_input(const uint16_t *x, const float *w, int64_t tokens, int64_t hidden, uint16_t *xs, float *ones,
                               cudaStream_t stream);

}  // namespace ft::cuda
