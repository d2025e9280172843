// Shared by the slot cache tests: random routing steps and checks of the cache invariants.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ft/slotcache.hpp"

namespace ft::test {

// One admission call: a layer, its routed ids and, for hybrid, the fetch rule.
struct Step {
    bool hybrid = false;
    int32_t layer = 0;
    std::vector<int32_t> ids;
    ft::HybridFetch fetch;
};

// Ids skewed towards a per-layer hot set, so that hits, misses and evictions all happen; for
// hybrid some ids are negative (routes handled elsewhere), as are a few for LRU (passed through).
inline Step random_step(std::mt19937 &rng, const ft::SlotCacheShape &shape, bool hybrid, int32_t max_ids) {
    Step s;
    s.hybrid = hybrid;
    s.layer = std::uniform_int_distribution<int32_t>(0, shape.layers - 1)(rng);
    const int32_t ks[] = {1, 2, 4, 6, 8};
    const int32_t k = ks[std::uniform_int_distribution<int>(0, 4)(rng)];
    const int32_t tokens = std::uniform_int_distribution<int32_t>(1, std::max(1, max_ids / k))(rng);
    const int32_t E = shape.experts, hot = std::max(1, E / 4);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (int32_t i = 0; i < tokens * k; ++i) {
        int32_t id = u(rng) < 0.6 ? std::uniform_int_distribution<int32_t>(0, hot - 1)(rng)
                                  : std::uniform_int_distribution<int32_t>(0, E - 1)(rng);
        if (u(rng) < (hybrid ? 0.1 : 0.03)) id = -1 - std::uniform_int_distribution<int32_t>(0, 3)(rng);
        s.ids.push_back(id);
    }
    if (hybrid) {
        const double fractions[] = {0.0, 0.1, 0.415, 0.454, 0.7, 1.0};
        s.fetch.fraction_q16 = ft::fraction_to_q16(fractions[std::uniform_int_distribution<int>(0, 5)(rng)]);
        s.fetch.max_fetch = std::uniform_int_distribution<int32_t>(0, 4)(rng);
        s.fetch.order = u(rng) < 0.75 ? ft::FetchOrder::Recency : ft::FetchOrder::LowestId;
    }
    return s;
}

// slot_for_id and id_of_slot are inverse maps, usage never runs ahead of the clock.
inline std::string check_maps(const ft::SlotCacheState &st) {
    const auto &s = st.shape;
    const int64_t ids = static_cast<int64_t>(s.layers) * s.experts;
    std::ostringstream err;
    for (int64_t g = 0; g < ids; ++g) {
        const int32_t slot = st.slot_for_id[g];
        if (slot < -1 || slot >= s.slots) err << "slot_for_id[" << g << "] = " << slot << " out of range; ";
        else if (slot >= 0 && st.id_of_slot[slot] != g)
            err << "slot_for_id[" << g << "] = " << slot << " but id_of_slot[" << slot << "] = " << st.id_of_slot[slot] << "; ";
    }
    for (int32_t slot = 0; slot < s.slots; ++slot) {
        const int32_t g = st.id_of_slot[slot];
        if (g < -1 || g >= ids) err << "id_of_slot[" << slot << "] = " << g << " out of range; ";
        else if (g >= 0 && st.slot_for_id[g] != slot)
            err << "id_of_slot[" << slot << "] = " << g << " but slot_for_id[" << g << "] = " << st.slot_for_id[g] << "; ";
        if (st.usage[slot] < 0 || st.usage[slot] > *st.step)
            err << "usage[" << slot << "] = " << st.usage[slot] << " outside [0, step " << *st.step << "]; ";
    }
    return err.str();
}

// What one call must have done: every routed id is the slot holding it (or -1 for a CPU route in
// hybrid, and for negative ids), the plan names exactly the fetched experts and their slots, and
// the number of distinct ids routed to -1 is missing - fetched.
inline std::string check_call(const ft::SlotCacheState &st, const Step &step, const std::vector<int32_t> &out) {
    std::ostringstream err;
    const int32_t E = st.shape.experts, base = step.layer * E;
    std::set<int32_t> distinct, to_cpu;
    for (size_t i = 0; i < step.ids.size(); ++i) {
        const int32_t id = step.ids[i], slot = out[i];
        if (id < 0) {
            if (slot != -1) err << "negative id at " << i << " routed to " << slot << "; ";
            continue;
        }
        distinct.insert(id);
        if (slot == -1) {
            if (!step.hybrid) err << "LRU routed id " << id << " at " << i << " to -1; ";
            to_cpu.insert(id);
        } else if (slot < 0 || slot >= st.shape.slots || st.id_of_slot[slot] != base + id) {
            err << "id " << id << " at " << i << " routed to slot " << slot << " that does not hold it; ";
        }
    }
    const int64_t fetched = *st.num_indices, missing = *st.num_missing_full;
    if (fetched < 0 || fetched > missing || missing > static_cast<int64_t>(distinct.size()))
        err << "counts: fetched " << fetched << ", missing " << missing << ", distinct " << distinct.size() << "; ";
    if (static_cast<int64_t>(to_cpu.size()) != missing - fetched)
        err << to_cpu.size() << " distinct ids routed to -1, expected missing - fetched = " << missing - fetched << "; ";
    if (step.hybrid) {
        const int64_t want = ft::hybrid_fetch_limit(missing, step.fetch);
        if (fetched != want) err << "fetched " << fetched << " of " << missing << ", split says " << want << "; ";
    } else if (fetched != missing) {
        err << "LRU fetched " << fetched << " of " << missing << " misses; ";
    }
    std::set<int32_t> victims;
    for (int64_t i = 0; i < fetched && i < st.shape.plan_capacity; ++i) {
        const int32_t slot = st.evict_slots[i], e = st.src_indices[i];
        if (!victims.insert(slot).second) err << "plan slot " << slot << " twice; ";
        if (e < 0 || e >= E || !distinct.count(e) || to_cpu.count(e))
            err << "plan entry " << i << " fetches expert " << e << " that was not a fetched miss; ";
        if (slot < 0 || slot >= st.shape.slots || st.id_of_slot[slot] != base + e || st.usage[slot] != *st.step)
            err << "plan entry " << i << " (slot " << slot << ", expert " << e << ") not installed; ";
        if (!step.hybrid && i > 0 && st.src_indices[i - 1] >= e) err << "LRU plan not in ascending expert id; ";
    }
    return err.str();
}

// Names the first differing element of each array of two caches of the same shape ("" if equal).
inline std::string describe_difference(const ft::SlotCacheState &want, const ft::SlotCacheState &got) {
    std::ostringstream err;
    const auto &s = want.shape;
    const int64_t ids = static_cast<int64_t>(s.layers) * s.experts;
    auto cmp = [&](const char *name, const auto *a, const auto *b, int64_t n) {
        int64_t diffs = 0, first = -1;
        for (int64_t i = 0; i < n; ++i)
            if (a[i] != b[i] && diffs++ == 0) first = i;
        if (diffs)
            err << name << ": " << diffs << " of " << n << " differ, first [" << first << "] mirror " << a[first]
                << " device " << b[first] << "\n";
    };
    cmp("step", want.step, got.step, 1);
    cmp("num_indices", want.num_indices, got.num_indices, 1);
    cmp("num_missing_full", want.num_missing_full, got.num_missing_full, 1);
    cmp("slot_for_id", want.slot_for_id, got.slot_for_id, ids);
    cmp("id_of_slot", want.id_of_slot, got.id_of_slot, s.slots);
    cmp("usage", want.usage, got.usage, s.slots);
    cmp("priority", want.priority, got.priority, s.slots);
    cmp("expert_priority", want.expert_priority, got.expert_priority, ids);
    cmp("evict_slots", want.evict_slots, got.evict_slots, s.plan_capacity);
    cmp("src_indices", want.src_indices, got.src_indices, s.plan_capacity);
    cmp("expert_recency", want.expert_recency, got.expert_recency, ids);
    cmp("stats", want.stats, got.stats, static_cast<int64_t>(s.layers) * ft::kStatColumns);
    return err.str();
}

}  // namespace ft::test
