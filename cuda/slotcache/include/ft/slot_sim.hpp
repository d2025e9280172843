// Host-side simulation of the slot cache over a route trace (docs/formulas.md, "Slot cache
// policies"): the cache's own policies, slot for slot as the offload admission runs them (every
// miss admitted), and Belady's optimum for the same capacity.
#pragma once

#include <cstdint>
#include <vector>

#include "ft/slot_policy.hpp"
#include "ft/trace.hpp"

namespace ft {

// Hit counts over a trace. A request is one distinct expert of one call (duplicates within a call
// count once, as the admission statistics count them); ids < 0 take no part.
struct CacheSim {
    int64_t requests = 0;
    int64_t hits = 0;
    std::vector<int32_t> call_misses;  // distinct misses of each call, in trace order
    double hit_rate() const { return requests > 0 ? double(hits) / double(requests) : 0.0; }
};

// The slot cache with `slots` slots shared by all layers (flat ids layer * E + expert) under
// `policy`, from a reset state: the same victims as admit_lru with that policy, so the same hits.
// Throws FT_ERR_INVALID_ARGUMENT for slots < E or a trace without layers.
CacheSim simulate_slot_cache(const RouteTrace &trace, int32_t slots, const SlotPolicy &policy);

// Belady's optimum for the same model: each call's experts must all be resident during the call,
// misses are admitted, and a miss evicts the resident expert (not of this call) whose next use is
// farthest away. Optimal for this model (a test checks it against exhaustive search).
CacheSim simulate_belady(const RouteTrace &trace, int32_t slots);

// The optimum by exhaustive search over every eviction choice (memoised): for tiny traces only
// (throws FT_ERR_INVALID_ARGUMENT above 16 distinct flat ids or 24 calls).
CacheSim optimum_by_search(const RouteTrace &trace, int32_t slots);

}  // namespace ft
