// Route traces (format, recorder, Zipf generator) and the host simulation of the slot cache
// policies against the admission mirror, Belady against exhaustive search.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "ft/common.hpp"
#include "ft/slot_sim.hpp"
#include "ft/slotcache.hpp"
#include "ft/trace.hpp"

namespace {

using ft::CacheSim;
using ft::RouteTrace;
using ft::SlotPolicy;
using ft::SlotPolicyKind;

std::string temp_path(const char *name) {
    return std::string(::testing::TempDir()) + "/" + name + "_" + std::to_string(::getpid());
}

ft_status status_of(const std::function<void()> &f) {
    try {
        f();
    } catch (const ft::Error &e) {
        return e.status();
    }
    return FT_OK;
}

RouteTrace small_trace(uint64_t seed, int64_t steps = 50) {
    ft::ZipfTraceSpec z;
    z.layers = 3;
    z.experts = 16;
    z.top_k = 4;
    z.steps = steps;
    z.batch = 2;
    z.s = 1.0;
    z.repeat = 0.3;
    z.seed = seed;
    return ft::make_zipf_trace(z);
}

bool same(const RouteTrace &a, const RouteTrace &b) {
    if (a.layers != b.layers || a.experts != b.experts || a.top_k != b.top_k || a.calls.size() != b.calls.size())
        return false;
    for (size_t i = 0; i < a.calls.size(); ++i)
        if (a.calls[i].layer != b.calls[i].layer || a.calls[i].tokens != b.calls[i].tokens ||
            a.calls[i].ids != b.calls[i].ids)
            return false;
    return true;
}

TEST(RouteTrace, FileRoundTrips) {
    RouteTrace t = small_trace(7);
    t.calls[3].ids[1] = -1;  // routes left to another device are recorded as they came
    const std::string path = temp_path("roundtrip.ftroutes");
    ft::write_route_trace(path, t);
    EXPECT_TRUE(same(ft::read_route_trace(path), t));
    std::remove(path.c_str());
}

TEST(RouteTrace, RecorderAppendsAcrossOpensAndChecksTheHeader) {
    const RouteTrace t = small_trace(3, 4);
    const std::string path = temp_path("recorder.ftroutes");
    std::remove(path.c_str());
    const size_t half = t.calls.size() / 2;
    {
        ft::RouteRecorder r(path, t.layers, t.experts, t.top_k);
        for (size_t i = 0; i < half; ++i) r.record(t.calls[i].layer, t.calls[i].tokens, t.calls[i].ids.data());
    }
    {
        ft::RouteRecorder r(path, t.layers, t.experts, t.top_k);  // a second run appends
        for (size_t i = half; i < t.calls.size(); ++i)
            r.record(t.calls[i].layer, t.calls[i].tokens, t.calls[i].ids.data());
    }
    EXPECT_TRUE(same(ft::read_route_trace(path), t));
    EXPECT_EQ(status_of([&] { ft::RouteRecorder r(path, t.layers, t.experts + 1, t.top_k); }), FT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(same(ft::read_route_trace(path), t));  // the refused recorder left the file alone
    std::remove(path.c_str());
}

TEST(RouteTrace, DamagedFilesAreRefusedWithFormatErrors) {
    const RouteTrace t = small_trace(5, 3);
    const std::string path = temp_path("damaged.ftroutes");
    ft::write_route_trace(path, t);
    std::string bytes;
    {
        std::ifstream in(path, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    auto read_with = [&](const std::string &b) {
        {
            std::ofstream out(path, std::ios::binary | std::ios::trunc);
            out.write(b.data(), static_cast<std::streamsize>(b.size()));
        }
        return status_of([&] { ft::read_route_trace(path); });
    };
    // Every truncation inside a record or the header is refused; at a record boundary it reads.
    for (size_t n = 0; n < bytes.size(); ++n) {
        const size_t rec = 8 + 4 * size_t(t.top_k) * 2;  // batch 2
        const bool boundary = n >= 24 && (n - 24) % rec == 0;
        EXPECT_EQ(read_with(bytes.substr(0, n)), boundary ? FT_OK : FT_ERR_FORMAT) << "truncated to " << n;
    }
    std::string b = bytes;
    b[0] = 'X';
    EXPECT_EQ(read_with(b), FT_ERR_FORMAT);  // magic
    b = bytes;
    b[24] = char(t.layers);  // first record's layer out of range
    EXPECT_EQ(read_with(b), FT_ERR_FORMAT);
    b = bytes;
    b[32] = char(t.experts);  // first id out of range
    EXPECT_EQ(read_with(b), FT_ERR_FORMAT);
    b = bytes;
    b[28] = 0;  // zero tokens
    EXPECT_EQ(read_with(b), FT_ERR_FORMAT);
    EXPECT_EQ(status_of([&] { ft::read_route_trace(path + ".missing"); }), FT_ERR_IO);
    std::remove(path.c_str());
}

TEST(ZipfTrace, SeededDistinctSkewedAndLocal) {
    ft::ZipfTraceSpec z;
    z.layers = 2;
    z.experts = 64;
    z.top_k = 8;
    z.steps = 400;
    z.s = 1.2;
    z.seed = 11;
    const RouteTrace a = ft::make_zipf_trace(z), b = ft::make_zipf_trace(z);
    EXPECT_TRUE(same(a, b));
    z.seed = 12;
    EXPECT_FALSE(same(a, ft::make_zipf_trace(z)));
    ASSERT_EQ(a.calls.size(), size_t(800));
    std::vector<std::vector<int64_t>> count(2, std::vector<int64_t>(64, 0));
    for (const auto &c : a.calls) {
        ASSERT_EQ(c.ids.size(), size_t(8));
        std::set<int32_t> d(c.ids.begin(), c.ids.end());
        EXPECT_EQ(d.size(), size_t(8));  // top-k distinct
        for (int32_t id : c.ids) {
            ASSERT_GE(id, 0);
            ASSERT_LT(id, 64);
            ++count[c.layer][id];
        }
    }
    // Skewed: the most popular expert of a layer is drawn far more than the uniform 50 times;
    // and each layer has its own permutation.
    for (int l = 0; l < 2; ++l) EXPECT_GT(*std::max_element(count[l].begin(), count[l].end()), 150);
    EXPECT_NE(std::max_element(count[0].begin(), count[0].end()) - count[0].begin(),
              std::max_element(count[1].begin(), count[1].end()) - count[1].begin());
    // repeat = 1: every step of a layer repeats the previous step's set.
    z.repeat = 1.0;
    const RouteTrace r = ft::make_zipf_trace(z);
    for (size_t i = 2; i < r.calls.size(); ++i) {
        std::set<int32_t> now(r.calls[i].ids.begin(), r.calls[i].ids.end()),
            before(r.calls[i - 2].ids.begin(), r.calls[i - 2].ids.end());
        EXPECT_EQ(now, before);
    }
    z.top_k = 65;
    EXPECT_EQ(status_of([&] { ft::make_zipf_trace(z); }), FT_ERR_INVALID_ARGUMENT);
}

TEST(SlotPolicyMath, FrequencyPriorityRanksDecayedCounts) {
    const int64_t h = 10;
    // A second access adds the full half-life at distance 0 and less further away.
    EXPECT_EQ(ft::frequency_priority(ft::frequency_priority(0, 5, h), 5, h), (5 << 8) + (h << 8));
    int64_t last = INT64_MAX;
    for (int64_t gap = 0; gap < 400; gap += 7) {
        const int64_t p = ft::frequency_priority(ft::frequency_priority(0, 100, h), 100 + gap, h) - ((100 + gap) << 8);
        EXPECT_LE(p, last);
        EXPECT_GE(p, 0);
        last = p;
    }
    EXPECT_EQ(last, 0);  // 40 half-lives later the old access no longer counts
    // Three accesses ending at step 30 rank above one access at step 30, below one at step 30 + 2h.
    int64_t three = ft::frequency_priority(0, 10, h);
    three = ft::frequency_priority(three, 20, h);
    three = ft::frequency_priority(three, 30, h);
    EXPECT_GT(three, ft::frequency_priority(0, 30, h));
    EXPECT_LT(three, ft::frequency_priority(0, 30 + 2 * h, h));
    // Monotone in the old priority.
    for (int64_t p = 0; p < (50 << 8); p += 97)
        EXPECT_LE(ft::frequency_priority(p, 25, h), ft::frequency_priority(p + 1, 25, h));
}

TEST(SlotPolicyMath, SessionParametersMapToThePolicy) {
    const SlotPolicy lru = ft::slot_policy_for(0, 5, 24);
    EXPECT_EQ(lru.kind, SlotPolicyKind::Lru);
    const SlotPolicy dflt = ft::slot_policy_for(1, 0, 24);
    EXPECT_EQ(dflt.kind, SlotPolicyKind::Frequency);
    EXPECT_EQ(dflt.half_life, int64_t(ft::kDefaultHalfLifeSteps) * 24);  // steps times layers
    EXPECT_EQ(ft::slot_policy_for(1, 3, 4).half_life, 12);
    EXPECT_EQ(status_of([] { ft::slot_policy_for(2, 0, 24); }), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status_of([] { ft::slot_policy_for(1, -1, 24); }), FT_ERR_INVALID_ARGUMENT);
    ft::SlotCacheShape s;
    s.layers = 2;
    s.experts = 4;
    s.slots = 4;
    s.plan_capacity = 4;
    s.policy = {SlotPolicyKind::Frequency, 0};  // a half-life below one call cannot be bound
    EXPECT_EQ(status_of([&] { ft::slot_cache_bytes(s); }), FT_ERR_INVALID_ARGUMENT);
}

// Replays a trace through the admission mirror (admit_lru with the policy); hits per call.
CacheSim mirror(const RouteTrace &t, int32_t slots, const SlotPolicy &policy) {
    ft::SlotCacheShape s;
    s.layers = t.layers;
    s.experts = t.experts;
    s.slots = slots;
    s.plan_capacity = ft::plan_capacity_for(int64_t(t.top_k) * 8, slots);
    s.policy = policy;
    ft::HostSlotCache c(s);
    CacheSim r;
    std::vector<int32_t> out;
    for (const auto &call : t.calls) {
        out.resize(call.ids.size());
        ft::admit_lru(c.state(), call.layer, call.ids.data(), out.data(), int64_t(call.ids.size()));
        r.call_misses.push_back(int32_t(*c.state().num_missing_full));
    }
    for (int l = 0; l < t.layers; ++l) {
        r.requests += c.state().stats[l * ft::kStatColumns + ft::kStatActive];
        r.hits += c.state().stats[l * ft::kStatColumns + ft::kStatActive] - c.state().stats[l * ft::kStatColumns + ft::kStatMissing];
    }
    return r;
}

TEST(SlotCacheSim, MatchesTheAdmissionMirrorCallForCall) {
    for (uint64_t seed = 1; seed <= 6; ++seed) {
        const RouteTrace t = small_trace(seed, 120);
        for (const SlotPolicy p : {SlotPolicy{SlotPolicyKind::Lru, 1}, SlotPolicy{SlotPolicyKind::Frequency, 3},
                                   SlotPolicy{SlotPolicyKind::Frequency, 40}})
            for (int32_t slots : {16, 20, 30}) {
                const CacheSim sim = ft::simulate_slot_cache(t, slots, p);
                const CacheSim ref = mirror(t, slots, p);
                EXPECT_EQ(sim.call_misses, ref.call_misses) << "seed " << seed << " slots " << slots;
                EXPECT_EQ(sim.hits, ref.hits);
                EXPECT_EQ(sim.requests, ref.requests);
                EXPECT_GT(sim.hits, 0);
                EXPECT_LT(sim.hits, sim.requests);
            }
    }
}

TEST(SlotCacheSim, PoliciesDifferAndAFullCacheOnlyMissesColdStarts) {
    const RouteTrace t = small_trace(9, 200);
    const CacheSim lru = ft::simulate_slot_cache(t, 20, {SlotPolicyKind::Lru, 1});
    const CacheSim freq = ft::simulate_slot_cache(t, 20, {SlotPolicyKind::Frequency, 300});
    EXPECT_NE(lru.call_misses, freq.call_misses);
    std::set<int32_t> distinct;
    for (const auto &c : t.calls)
        for (int32_t id : c.ids)
            if (id >= 0) distinct.insert(c.layer * t.experts + id);
    for (const SlotPolicy p : {SlotPolicy{SlotPolicyKind::Lru, 1}, SlotPolicy{SlotPolicyKind::Frequency, 5}})
        EXPECT_EQ(ft::simulate_slot_cache(t, t.layers * t.experts, p).requests -
                      ft::simulate_slot_cache(t, t.layers * t.experts, p).hits,
                  int64_t(distinct.size()));
    EXPECT_EQ(ft::simulate_belady(t, t.layers * t.experts).requests - ft::simulate_belady(t, t.layers * t.experts).hits,
              int64_t(distinct.size()));
    EXPECT_EQ(status_of([&] { ft::simulate_slot_cache(t, t.experts - 1, {}); }), FT_ERR_INVALID_ARGUMENT);
}

TEST(Belady, AtLeastEveryPolicyOnRandomTraces) {
    for (uint64_t seed = 1; seed <= 8; ++seed) {
        const RouteTrace t = small_trace(100 + seed, 150);
        for (int32_t slots : {16, 24, 36}) {
            const CacheSim best = ft::simulate_belady(t, slots);
            for (const SlotPolicy p : {SlotPolicy{SlotPolicyKind::Lru, 1}, SlotPolicy{SlotPolicyKind::Frequency, 2},
                                       SlotPolicy{SlotPolicyKind::Frequency, 30}, SlotPolicy{SlotPolicyKind::Frequency, 600}})
                EXPECT_GE(best.hits, ft::simulate_slot_cache(t, slots, p).hits) << "seed " << seed << " slots " << slots;
            EXPECT_EQ(best.requests, ft::simulate_slot_cache(t, slots, {}).requests);
        }
    }
}

TEST(Belady, EqualsExhaustiveSearchOnTinyTraces) {
    std::mt19937 rng(42);
    int strict = 0;  // traces where the optimum beats LRU: the comparison is not vacuous
    for (int trial = 0; trial < 300; ++trial) {
        RouteTrace t;
        t.layers = 2;
        t.experts = 5;
        t.top_k = std::uniform_int_distribution<int>(1, 3)(rng);
        const int calls = std::uniform_int_distribution<int>(3, 14)(rng);
        for (int c = 0; c < calls; ++c) {
            ft::TraceCall call;
            call.layer = std::uniform_int_distribution<int>(0, 1)(rng);
            call.tokens = 1;
            for (int k = 0; k < t.top_k; ++k) call.ids.push_back(std::uniform_int_distribution<int>(0, 4)(rng));
            t.calls.push_back(call);
        }
        const int32_t slots = std::uniform_int_distribution<int32_t>(3, 6)(rng);
        const CacheSim exact = ft::optimum_by_search(t, slots), belady = ft::simulate_belady(t, slots);
        ASSERT_EQ(belady.hits, exact.hits) << "trial " << trial << " slots " << slots;
        ASSERT_EQ(belady.requests, exact.requests);
        if (slots >= t.experts && exact.hits > ft::simulate_slot_cache(t, slots, {}).hits) ++strict;
    }
    EXPECT_GT(strict, 10);
}

}  // namespace
