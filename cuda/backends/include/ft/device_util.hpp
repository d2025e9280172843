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

// Hybrid: the routes the CPU computes. cpu_ids[i] = ids[i] where the admission left slots[i] = -1
// and the id is a valid expert, else -1 (routes the GPU computes, or no route). Capturable.
cudaError_t launch_cpu_ids(const int32_t *ids, const int32_t *slots, int32_t *cpu_ids, int64_t count, int32_t experts,
                           cudaStream_t stream);

}  // namespace ft::cuda
