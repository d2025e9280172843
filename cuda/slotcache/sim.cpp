// Host-side slot cache simulation: the policies and Belady's optimum (slot_sim.hpp).
#include "ft/slot_sim.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "ft/common.hpp"

namespace ft {

namespace {

// Each call's distinct flat ids, ascending.
std::vector<std::vector<int32_t>> distinct_calls(const RouteTrace &t) {
    if (t.layers <= 0 || t.experts <= 0) fail(FT_ERR_INVALID_ARGUMENT, "cache simulation: empty trace geometry");
    std::vector<std::vector<int32_t>> out;
    out.reserve(t.calls.size());
    for (const TraceCall &c : t.calls) {
        if (c.layer < 0 || c.layer >= t.layers) fail(FT_ERR_INVALID_ARGUMENT, "cache simulation: layer ", c.layer);
        std::vector<int32_t> d;
        for (int32_t id : c.ids) {
            if (id >= t.experts) fail(FT_ERR_INVALID_ARGUMENT, "cache simulation: id ", id, " of ", t.experts);
            if (id >= 0) d.push_back(c.layer * t.experts + id);
        }
        std::sort(d.begin(), d.end());
        d.erase(std::unique(d.begin(), d.end()), d.end());
        out.push_back(std::move(d));
    }
    return out;
}

void check_slots(const RouteTrace &t, int32_t slots, const std::vector<std::vector<int32_t>> &calls) {
    size_t widest = 0;
    for (const auto &d : calls) widest = std::max(widest, d.size());
    if (slots < 1 || static_cast<size_t>(slots) < widest)
        fail(FT_ERR_INVALID_ARGUMENT, "cache simulation: ", slots, " slots cannot hold one call's ", widest,
             " experts");
    (void)t;
}

}  // namespace

CacheSim simulate_slot_cache(const RouteTrace &t, int32_t slots, const SlotPolicy &policy) {
    const auto calls = distinct_calls(t);
    if (slots < t.experts)
        fail(FT_ERR_INVALID_ARGUMENT, "cache simulation: ", slots, " slots hold less than one layer of ", t.experts);
    const bool freq = policy.kind == SlotPolicyKind::Frequency;
    if (freq && policy.half_life < 1) fail(FT_ERR_INVALID_ARGUMENT, "cache simulation: half-life must be >= 1");
    std::vector<int32_t> slot_of(static_cast<size_t>(t.layers) * t.experts, -1), owner(slots, -1);
    std::vector<int64_t> usage(slots, 0), prio(slots, 0);
    std::vector<int64_t> eprio(freq ? slot_of.size() : 0, 0);  // per expert, kept while evicted
    const std::vector<int64_t> &key = freq ? prio : usage;
    CacheSim r;
    r.call_misses.reserve(calls.size());
    int64_t step = 0;
    std::vector<int32_t> misses;
    std::vector<std::pair<int64_t, int32_t>> cand;
    for (const auto &d : calls) {
        ++step;
        misses.clear();
        for (int32_t id : d) {
            const int32_t s = slot_of[id];
            if (s >= 0) {
                usage[s] = step;
                if (freq) prio[s] = eprio[id] = frequency_priority(eprio[id], step, policy.half_life);
            } else {
                if (freq) eprio[id] = frequency_priority(eprio[id], step, policy.half_life);
                misses.push_back(id);
            }
        }
        r.requests += static_cast<int64_t>(d.size());
        r.hits += static_cast<int64_t>(d.size() - misses.size());
        r.call_misses.push_back(static_cast<int32_t>(misses.size()));
        if (misses.empty()) continue;
        cand.clear();
        for (int32_t s = 0; s < slots; ++s)
            if (usage[s] != step) cand.emplace_back(key[s], s);
        const auto m = static_cast<std::ptrdiff_t>(misses.size());
        std::partial_sort(cand.begin(), cand.begin() + m, cand.end());
        for (std::ptrdiff_t i = 0; i < m; ++i) {
            const int32_t s = cand[i].second;
            if (owner[s] >= 0) slot_of[owner[s]] = -1;
            owner[s] = misses[i];
            slot_of[misses[i]] = s;
            usage[s] = step;
            if (freq) prio[s] = eprio[misses[i]];
        }
    }
    return r;
}

CacheSim simulate_belady(const RouteTrace &t, int32_t slots) {
    const auto calls = distinct_calls(t);
    check_slots(t, slots, calls);
    const auto n = static_cast<int64_t>(calls.size());
    constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
    // next_use[c][j]: the next call after c that uses calls[c][j].
    std::vector<std::vector<int64_t>> next_use(calls.size());
    std::vector<int64_t> seen(static_cast<size_t>(t.layers) * t.experts, kNever);
    for (int64_t c = n - 1; c >= 0; --c) {
        next_use[c].resize(calls[c].size());
        for (size_t j = 0; j < calls[c].size(); ++j) {
            next_use[c][j] = seen[calls[c][j]];
            seen[calls[c][j]] = c;
        }
    }
    std::vector<int64_t> resident_next(seen.size(), -1);  // -1: not resident
    std::set<std::pair<int64_t, int32_t>> by_next;        // residents not in the current call
    CacheSim r;
    r.call_misses.reserve(calls.size());
    int64_t held = 0;
    for (int64_t c = 0; c < n; ++c) {
        const auto &d = calls[c];
        int32_t misses = 0;
        for (int32_t id : d) {
            if (resident_next[id] >= 0) {
                by_next.erase({resident_next[id], id});
            } else {
                ++misses;
                ++held;
            }
        }
        // Evict the farthest next uses among the residents outside this call.
        while (held > slots) {
            auto far = std::prev(by_next.end());
            resident_next[far->second] = -1;
            by_next.erase(far);
            --held;
        }
        for (size_t j = 0; j < d.size(); ++j) {
            resident_next[d[j]] = next_use[c][j];
            by_next.insert({next_use[c][j], d[j]});
        }
        r.requests += static_cast<int64_t>(d.size());
        r.hits += static_cast<int64_t>(d.size()) - misses;
        r.call_misses.push_back(misses);
    }
    return r;
}

CacheSim optimum_by_search(const RouteTrace &t, int32_t slots) {
    const auto calls = distinct_calls(t);
    check_slots(t, slots, calls);
    std::map<int32_t, int32_t> index;  // flat id -> bit
    for (const auto &d : calls)
        for (int32_t id : d) index.emplace(id, static_cast<int32_t>(index.size()));
    if (index.size() > 16 || calls.size() > 24)
        fail(FT_ERR_INVALID_ARGUMENT, "exhaustive cache search: ", index.size(), " ids and ", calls.size(),
             " calls is too large (at most 16 and 24)");
    std::vector<uint32_t> need(calls.size(), 0);
    for (size_t c = 0; c < calls.size(); ++c)
        for (int32_t id : calls[c]) need[c] |= 1u << index[id];
    std::map<std::pair<size_t, uint32_t>, int64_t> memo;
    // Fewest misses from call c on with `held` resident.
    auto best = [&](auto &&self, size_t c, uint32_t held) -> int64_t {
        if (c == calls.size()) return 0;
        const auto key = std::make_pair(c, held);
        if (auto it = memo.find(key); it != memo.end()) return it->second;
        const uint32_t miss = need[c] & ~held;
        const int64_t m = __builtin_popcount(miss);
        const uint32_t after = held | need[c];
        const int excess = __builtin_popcount(after) - slots;
        int64_t result = std::numeric_limits<int64_t>::max();
        if (excess <= 0) {
            result = m + self(self, c + 1, after);
        } else {
            // Every set of `excess` residents outside this call.
            const uint32_t evictable = held & ~need[c];
            for (uint32_t sub = evictable;; sub = (sub - 1) & evictable) {
                if (__builtin_popcount(sub) == excess) result = std::min(result, m + self(self, c + 1, after & ~sub));
                if (sub == 0) break;
            }
        }
        memo[key] = result;
        return result;
    };
    CacheSim r;
    for (const auto &d : calls) r.requests += static_cast<int64_t>(d.size());
    r.hits = r.requests - best(best, 0, 0);
    return r;
}

}  // namespace ft
