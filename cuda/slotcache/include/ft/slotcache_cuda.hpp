// Device admission kernels and state maintenance for the slot cache (docs/formulas.md, "Slot cache").
//
// Each launcher enqueues one single-CTA kernel on `stream` and returns: it never synchronises,
// allocates or reads device memory from the host, so a sequence of calls can be captured in a
// CUDA graph and replayed with new ids (the layer, the id count and every pointer are baked into
// the captured node; the counts the gather needs stay on the device in num_indices).
//
// Results -- maps, usage, step, plan, counts, recency, stats and the rewritten ids -- are bit for
// bit those of the host mirror (admit_lru / admit_hybrid in slotcache.hpp) run on the same state,
// with one difference on invalid input: the mirror rejects an id >= E, the kernels route it to -1
// and ignore it (they cannot report it without a host synchronisation).
//
// Returns cudaErrorInvalidValue (nothing enqueued) for what admission_argument_error reports, for
// count > INT32_MAX, or for a shape with E > kMaxAdmissionExperts or S < E; else the
// launch status. `state` must be bound to device memory; ids and slots_out are device arrays of
// `count` entries and may be the same array.
#pragma once

#include <cuda_runtime_api.h>

#include "ft/slotcache.hpp"

namespace ft::cuda {

cudaError_t launch_admit_lru(const SlotCacheState &state, int32_t layer, const int32_t *ids, int32_t *slots_out,
                             int64_t count, cudaStream_t stream);

cudaError_t launch_admit_hybrid(const SlotCacheState &state, int32_t layer, const int32_t *ids, int32_t *slots_out,
                                int64_t count, const HybridFetch &fetch, cudaStream_t stream);

// Reset of a device-bound state (as slot_cache_reset); statistics are kept.
cudaError_t launch_slot_cache_reset(const SlotCacheState &state, cudaStream_t stream);
cudaError_t launch_slot_cache_clear_stats(const SlotCacheState &state, cudaStream_t stream);

}  // namespace ft::cuda
