// GPU slot cache: sizing, state, reset and the host mirror of admission (docs/formulas.md, "Slot cache");
// the device kernels are in slotcache_cuda.hpp. A slot holds one expert of one layer across all
// its banks; the cache holds at least one whole layer (E slots) and never more than every expert
// (L * E).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "freetoken.h"
#include "ft/hybrid.hpp"
#include "ft/slot_policy.hpp"

namespace ft {

struct SlotRequest {
    int64_t count = 0;            // explicit slot count (0: not given)
    double fraction = 0.0;        // fraction of all L * E experts (0: not given)
    uint64_t free_bytes = 0;      // free device memory, for the automatic size
    uint64_t reserve_bytes = 0;   // memory the caller keeps for itself
};

// The one slot sizing rule, used by the offload/hybrid backends and by the selector's prediction:
// explicit count first, then fraction, else as many slots as free_bytes - reserve_bytes holds;
// at most every expert (L * E). Refused (status FT_ERR_INVALID_ARGUMENT) for an explicit count or
// fraction below one layer, and FT_ERR_OUT_OF_MEMORY when the memory left cannot hold one layer.
struct SlotPlan {
    int64_t slots = 0;       // when status is FT_OK
    ft_status status = FT_OK;
    std::string why;         // the refusal, "slot cache: ..."
};
SlotPlan plan_slots(const SlotRequest &request, int64_t layers, int64_t experts, uint64_t expert_bytes);

// plan_slots, throwing its refusal as ft::Error.
int64_t plan_slot_count(const SlotRequest &request, int64_t layers, int64_t experts, uint64_t expert_bytes);

// The policy of ft_session_params' cache_policy (FT_CACHE_*) and cache_half_life (decode steps,
// 0 = 8): the half-life in admission calls is the steps times the layers (one call per layer).
// Throws FT_ERR_INVALID_ARGUMENT for an unknown policy or a negative half-life.
SlotPolicy slot_policy_for(int32_t cache_policy, int32_t half_life_steps, int32_t layers);

}  // namespace ft

// ---- Slot cache state ---------------------------------------------------------------------------
//
// Experts are named by a flat id, layer * E + expert, so one map covers every layer and "which
// layer owns slot s" is a range check on id_of_slot[s]. All arrays of one cache live in a single
// buffer laid out by slot_cache_bytes/slot_cache_bind: the device copy is one allocation, the host
// mirror uses the same layout, and tests compare the two byte for byte.

namespace ft {

// Sizes of one slot cache. Admission needs slots >= experts (one whole layer) and
// experts <= kMaxAdmissionExperts.
struct SlotCacheShape {
    int32_t layers = 0;
    int32_t experts = 0;        // E, experts per layer
    int32_t slots = 0;          // S
    int32_t plan_capacity = 0;  // entries of evict_slots / src_indices, see plan_capacity_for
    SlotPolicy policy{};        // which slot a miss evicts (ft/slot_policy.hpp)
};

// The device admission kernel keeps per-expert state in shared memory; 1024 covers every MoE
// model we know of (DeepSeek 256, Kimi 384, Qwen3-Next 512) with room to spare.
inline constexpr int32_t kMaxAdmissionExperts = 1024;

// Columns of the per-layer statistics rows, stats[layer * kStatColumns + column]. Every admission
// call adds: distinct active experts, misses (before any hybrid cap), misses fetched, 1.
enum SlotCacheStat : int32_t { kStatActive = 0, kStatMissing = 1, kStatFetched = 2, kStatCalls = 3, kStatColumns = 4 };

// Pointers into one cache's buffer (host or device memory, as bound). Plain data: copy freely.
struct SlotCacheState {
    SlotCacheShape shape;
    int32_t *slot_for_id = nullptr;       // [L*E] slot holding a flat id, -1 if not resident
    int32_t *id_of_slot = nullptr;        // [S] flat id held by a slot, -1 if empty
    int64_t *usage = nullptr;             // [S] step at which the slot was last used (LRU clock)
    int64_t *priority = nullptr;          // [S] Frequency policy: the owner's priority (0: empty)
    int64_t *expert_priority = nullptr;   // [L*E] Frequency policy: each expert's priority, kept
                                          // while it is evicted (0: never accessed)
    int64_t *step = nullptr;              // [1] +1 per admission call, any layer
    int32_t *evict_slots = nullptr;       // [plan_capacity] copy plan: destination slot
    int32_t *src_indices = nullptr;       // [plan_capacity] copy plan: source expert of the layer
    int64_t *num_indices = nullptr;       // [1] valid plan entries (read on the device by the gather)
    int64_t *num_missing_full = nullptr;  // [1] distinct misses of the last call, before any cap
    int64_t *expert_recency = nullptr;    // [L*E] hybrid: last step the expert was active, -1 never
    int64_t *stats = nullptr;             // [L * kStatColumns], see SlotCacheStat
};

// The plan never holds more entries than a call's distinct experts, at most min(ids, E); sizing it
// min(max_ids, S) (S >= E) is therefore always enough -- the original sized it E and asserted
// min(ids, S), which failed for tokens * K > E.
int32_t plan_capacity_for(int64_t max_ids_per_call, int32_t slots);

// Bytes of the buffer that holds a cache of this shape. Throws FT_ERR_INVALID_ARGUMENT for a
// shape admission cannot serve (non-positive sizes, S < E, E > kMaxAdmissionExperts).
size_t slot_cache_bytes(const SlotCacheShape &shape);

// Lays the arrays out in `buffer` (slot_cache_bytes long, 256-byte aligned as cudaMalloc gives).
// Touches no memory: `buffer` may be a device address.
SlotCacheState slot_cache_bind(const SlotCacheShape &shape, void *buffer);

// Reset on host memory: maps and plan -1, usage/priority/step/counts 0, recency -1. Statistics are kept.
void slot_cache_reset(const SlotCacheState &state);
void slot_cache_clear_stats(const SlotCacheState &state);

// A cache in host memory: the mirror the device kernels are tested against. Starts reset, stats 0.
class HostSlotCache {
public:
    explicit HostSlotCache(const SlotCacheShape &shape);
    HostSlotCache(HostSlotCache &&) = default;  // the vector's buffer, and so state(), moves along
    HostSlotCache &operator=(HostSlotCache &&) = default;
    HostSlotCache(const HostSlotCache &) = delete;
    HostSlotCache &operator=(const HostSlotCache &) = delete;
    const SlotCacheState &state() const { return state_; }
    // The buffer the state points into, slot_cache_bytes long (what a device copy is compared to).
    const void *data() const { return reinterpret_cast<const unsigned char *>(storage_.data()) + offset_; }
    size_t bytes() const { return bytes_; }

private:
    std::vector<uint64_t> storage_;
    size_t offset_ = 0;  // of the 256-byte aligned start inside storage_
    size_t bytes_ = 0;
    SlotCacheState state_;
};

// Why admission cannot run with these arguments (nullptr when it can): layer out of range,
// count < 0, a null id pointer with count > 0, or a plan too small for min(count, E) entries.
// Shared by the host mirror (which throws it) and the device launchers (which return an error).
const char *admission_argument_error(const SlotCacheShape &shape, int32_t layer, const int32_t *ids,
                                     const int32_t *slots_out, int64_t count);

// ---- Host mirror of the admission kernels -------------------------------------------------------
// Both run one layer's routed ids (count = tokens * K, ids in [0, E) or negative) against the
// cache and rewrite them into slots_out, which may be the same array as ids (no other overlap).
// Negative ids are passed through as -1 and take no part. Throws FT_ERR_INVALID_ARGUMENT (and
// changes nothing) for an id >= E or what admission_argument_error reports.

// LRU admission (docs/formulas.md, "Slot cache"): every distinct id gets a slot. Hits are stamped
// with the new step; the distinct misses in ascending expert id take the least recently used slots in ascending (usage, slot)
// order, never a slot hit in this call; the plan lists (slot, expert) for the gather. With
// shape.policy Frequency every distinct id of the call updates its expert's priority (hit or
// miss, ft/slot_policy.hpp), a slot carries its owner's priority, and the victims are taken in
// ascending (priority, slot) order instead.
void admit_lru(const SlotCacheState &state, int32_t layer, const int32_t *ids, int32_t *slots_out,
               int64_t count);

// Hybrid admission (the policy as for admit_lru; every active expert's priority is updated, the
// misses left to the CPU included): of the M distinct misses, hybrid_fetch_limit(M, fetch) are admitted (chosen by
// fetch.order) into LRU slots not owned by any expert active in this call; the others are routed
// to -1 for the CPU. With FetchOrder::Recency every active expert's recency becomes the step.
void admit_hybrid(const SlotCacheState &state, int32_t layer, const int32_t *ids, int32_t *slots_out,
                  int64_t count, const HybridFetch &fetch);

}  // namespace ft
