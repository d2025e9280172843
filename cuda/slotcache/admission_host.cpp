// Host mirror of the admission kernels (docs/formulas.md, "Slot cache"). Written the way that states the
// algorithms -- query-space dedup, sequential victim order -- rather than the way the kernel
// computes them, so that a test that finds the two identical checks one against the other.
#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "ft/common.hpp"
#include "ft/slotcache.hpp"

namespace ft {

namespace {

void check_call(const SlotCacheState &st, int32_t layer, const int32_t *ids, const int32_t *slots_out,
                int64_t count) {
    if (const char *why = admission_argument_error(st.shape, layer, ids, slots_out, count))
        fail(FT_ERR_INVALID_ARGUMENT, "slot cache admission: ", why, " (layer ", layer, " of ", st.shape.layers,
             ", ", count, " ids, plan capacity ", st.shape.plan_capacity, ", ", st.shape.experts, " experts)");
    for (int64_t i = 0; i < count; ++i)
        if (ids[i] >= st.shape.experts)
            fail(FT_ERR_INVALID_ARGUMENT, "slot cache admission: id ", ids[i], " at position ", i,
                 " is not an expert of a layer of ", st.shape.experts);
}

bool frequency(const SlotCacheState &st) { return st.shape.policy.kind == SlotPolicyKind::Frequency; }

// The policy's key of a slot: its usage (LRU) or priority (Frequency).
const int64_t *victim_keys(const SlotCacheState &st) { return frequency(st) ? st.priority : st.usage; }

// Frequency: an access of flat id `id` at `step` (hit or miss) updates its priority.
void access(const SlotCacheState &st, int32_t id, int64_t step) {
    if (frequency(st))
        st.expert_priority[id] = frequency_priority(st.expert_priority[id], step, st.shape.policy.half_life);
}

// A hit on `slot` (owned by `id`) at `step`: the LRU stamp, and the owner's priority.
void touch(const SlotCacheState &st, int32_t slot, int32_t id, int64_t step) {
    st.usage[slot] = step;
    access(st, id, step);
    if (frequency(st)) st.priority[slot] = st.expert_priority[id];
}

// The n coldest slots that `usable` allows, in ascending (key, slot) order -- the order in which
// n rounds of "argmin key, ties to the lower slot" would take them; the key is the policy's.
std::vector<int32_t> coldest_slots(const SlotCacheState &st, int64_t n, const std::vector<char> &usable) {
    std::vector<std::pair<int64_t, int32_t>> keys;
    keys.reserve(st.shape.slots);
    const int64_t *key = victim_keys(st);
    for (int32_t s = 0; s < st.shape.slots; ++s)
        if (usable[s]) keys.emplace_back(key[s], s);
    if (static_cast<int64_t>(keys.size()) < n)
        fail(FT_ERR_INTERNAL, "slot cache admission: ", n, " misses but only ", keys.size(), " evictable slots");
    std::partial_sort(keys.begin(), keys.begin() + n, keys.end());
    std::vector<int32_t> out(n);
    for (int64_t i = 0; i < n; ++i) out[i] = keys[i].second;
    return out;
}

// Moves flat id `id` into `victim` (evicting its owner) and records plan entry `i`.
void install(const SlotCacheState &st, int64_t i, int32_t victim, int32_t base, int32_t expert, int64_t step) {
    const int32_t old = st.id_of_slot[victim];
    if (old >= 0) st.slot_for_id[old] = -1;
    st.id_of_slot[victim] = base + expert;
    st.slot_for_id[base + expert] = victim;
    st.usage[victim] = step;
    if (frequency(st)) st.priority[victim] = st.expert_priority[base + expert];
    st.evict_slots[i] = victim;
    st.src_indices[i] = expert;
}

void add_stats(const SlotCacheState &st, int32_t layer, int64_t active, int64_t missing, int64_t fetched) {
    int64_t *row = st.stats + static_cast<int64_t>(layer) * kStatColumns;
    row[kStatActive] += active;
    row[kStatMissing] += missing;
    row[kStatFetched] += fetched;
    row[kStatCalls] += 1;
}

}  // namespace

void admit_lru(const SlotCacheState &st, int32_t layer, const int32_t *ids, int32_t *slots_out, int64_t count) {
    check_call(st, layer, ids, slots_out, count);
    const int32_t E = st.shape.experts, base = layer * E;
    const int64_t step = ++*st.step;

    // Phase 1, query space: a position is a first occurrence if no earlier position holds its
    // id. Distinct hits are stamped with this step; distinct misses are collected.
    std::vector<int32_t> misses;
    int64_t distinct = 0;
    for (int64_t i = 0; i < count; ++i) {
        const int32_t id = ids[i];
        if (id < 0 || std::find(ids, ids + i, id) != ids + i) continue;
        ++distinct;
        const int32_t slot = st.slot_for_id[base + id];
        if (slot >= 0) {
            touch(st, slot, base + id, step);
        } else {
            access(st, base + id, step);
            misses.push_back(id);
        }
    }
    // Rank of a miss = number of misses with a smaller id.
    std::sort(misses.begin(), misses.end());

    // Phase 2: the i-th smallest missing id takes the i-th coldest slot; slots stamped with this
    // step (hit above) are not evictable.
    const auto k = static_cast<int64_t>(misses.size());
    if (k > 0) {
        std::vector<char> usable(st.shape.slots);
        for (int32_t s = 0; s < st.shape.slots; ++s) usable[s] = st.usage[s] != step;
        const std::vector<int32_t> victims = coldest_slots(st, k, usable);
        for (int64_t i = 0; i < k; ++i) install(st, i, victims[i], base, misses[i], step);
    }
    *st.num_indices = k;
    *st.num_missing_full = k;

    for (int64_t i = 0; i < count; ++i) slots_out[i] = ids[i] < 0 ? -1 : st.slot_for_id[base + ids[i]];
    add_stats(st, layer, distinct, k, k);
}

void admit_hybrid(const SlotCacheState &st, int32_t layer, const int32_t *ids, int32_t *slots_out, int64_t count,
                  const HybridFetch &fetch) {
    check_call(st, layer, ids, slots_out, count);
    const int32_t E = st.shape.experts, base = layer * E;
    const int64_t step = ++*st.step;

    // Phase 1, expert space: the active set (duplicates collapse), its misses and the split.
    std::vector<char> active(E, 0);
    for (int64_t i = 0; i < count; ++i)
        if (ids[i] >= 0) active[ids[i]] = 1;
    std::vector<int32_t> missing;
    int64_t distinct = 0;
    for (int32_t e = 0; e < E; ++e) {
        if (!active[e]) continue;
        ++distinct;
        const int32_t slot = st.slot_for_id[base + e];
        if (slot >= 0) {
            touch(st, slot, base + e, step);
        } else {
            access(st, base + e, step);
            missing.push_back(e);
        }
    }
    const auto M = static_cast<int64_t>(missing.size());
    const int64_t k = hybrid_fetch_limit(M, fetch);
    *st.num_missing_full = M;
    *st.num_indices = k;

    // Fetch priority. Recency: score = recency * E + (E - 1 - e), highest first -- most recently
    // active first, ties to the lower id, never-seen (-1) below every seen expert.
    if (fetch.order == FetchOrder::Recency) {
        auto score = [&](int32_t e) { return st.expert_recency[base + e] * E + (E - 1 - e); };
        std::stable_sort(missing.begin(), missing.end(), [&](int32_t a, int32_t b) { return score(a) > score(b); });
    }

    // Phase 2: victims are the coldest slots not owned by an expert active in this call.
    if (k > 0) {
        std::vector<char> usable(st.shape.slots);
        for (int32_t s = 0; s < st.shape.slots; ++s) {
            const int32_t owner = st.id_of_slot[s];
            usable[s] = !(owner >= base && owner < base + E && active[owner - base]);
        }
        const std::vector<int32_t> victims = coldest_slots(st, k, usable);
        for (int64_t i = 0; i < k; ++i) install(st, i, victims[i], base, missing[i], step);
    }

    // Phase 3: slots for hits and fetched misses, -1 for the misses left to the CPU.
    for (int64_t i = 0; i < count; ++i) slots_out[i] = ids[i] < 0 ? -1 : st.slot_for_id[base + ids[i]];

    if (fetch.order == FetchOrder::Recency)
        for (int32_t e = 0; e < E; ++e)
            if (active[e]) st.expert_recency[base + e] = step;
    add_stats(st, layer, distinct, M, k);
}

}  // namespace ft
