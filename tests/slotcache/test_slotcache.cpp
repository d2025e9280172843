// Host mirror of slot cache admission (docs/formulas.md, "Slot cache") on hand-built cases and random runs.
// Runs everywhere; the device kernels are compared against this mirror in test_slotcache_gpu.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "ft/common.hpp"
#include "ft/slotcache.hpp"
#include "slotcache_steps.hpp"

namespace {

using ft::FetchOrder;
using ft::HostSlotCache;
using ft::HybridFetch;
using ft::SlotCacheShape;
using ft::SlotCacheState;

SlotCacheShape shape(int32_t layers, int32_t experts, int32_t slots, int32_t plan) {
    SlotCacheShape s;
    s.layers = layers;
    s.experts = experts;
    s.slots = slots;
    s.plan_capacity = plan;
    return s;
}

std::vector<int32_t> lru(const SlotCacheState &st, int32_t layer, std::vector<int32_t> ids) {
    ft::admit_lru(st, layer, ids.data(), ids.data(), static_cast<int64_t>(ids.size()));
    return ids;
}

std::vector<int32_t> hybrid(const SlotCacheState &st, int32_t layer, std::vector<int32_t> ids, HybridFetch f) {
    ft::admit_hybrid(st, layer, ids.data(), ids.data(), static_cast<int64_t>(ids.size()), f);
    return ids;
}

HybridFetch fraction(double f, FetchOrder order = FetchOrder::Recency) {
    HybridFetch h;
    h.fraction_q16 = ft::fraction_to_q16(f);
    h.order = order;
    return h;
}

HybridFetch cap(int32_t n, FetchOrder order = FetchOrder::Recency) {
    HybridFetch h;
    h.max_fetch = n;
    h.order = order;
    return h;
}

std::vector<int32_t> plan_slots(const SlotCacheState &st) { return {st.evict_slots, st.evict_slots + *st.num_indices}; }
std::vector<int32_t> plan_experts(const SlotCacheState &st) { return {st.src_indices, st.src_indices + *st.num_indices}; }
int64_t stat(const SlotCacheState &st, int layer, int col) { return st.stats[layer * ft::kStatColumns + col]; }

TEST(SlotCacheState, LayoutIsAlignedAndResetMatchesSpec) {
    HostSlotCache c(shape(3, 8, 12, 8));
    const SlotCacheState &st = c.state();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data()) % 256, 0u);
    EXPECT_EQ(c.bytes(), ft::slot_cache_bytes(st.shape));
    for (int i = 0; i < 24; ++i) EXPECT_EQ(st.slot_for_id[i], -1);
    for (int i = 0; i < 24; ++i) EXPECT_EQ(st.expert_recency[i], -1);
    for (int s = 0; s < 12; ++s) EXPECT_EQ(st.id_of_slot[s], -1);
    for (int s = 0; s < 12; ++s) EXPECT_EQ(st.usage[s], 0);
    EXPECT_EQ(*st.step, 0);
    EXPECT_EQ(*st.num_indices, 0);

    // After traffic, reset gives back the fresh buffer except for the statistics it keeps.
    HostSlotCache fresh(st.shape);
    std::mt19937 rng(3);
    for (int i = 0; i < 50; ++i) {
        auto step = ft::test::random_step(rng, st.shape, i % 2 == 1, 8);
        for (auto &id : step.ids) id = std::min(id, 7);
        if (step.hybrid) hybrid(st, step.layer, step.ids, step.fetch);
        else lru(st, step.layer, step.ids);
    }
    EXPECT_EQ(stat(st, 0, ft::kStatCalls) + stat(st, 1, ft::kStatCalls) + stat(st, 2, ft::kStatCalls), 50);
    ft::slot_cache_reset(st);
    EXPECT_EQ(stat(st, 0, ft::kStatCalls) + stat(st, 1, ft::kStatCalls) + stat(st, 2, ft::kStatCalls), 50);
    ft::slot_cache_clear_stats(st);
    EXPECT_EQ(std::memcmp(c.data(), fresh.data(), c.bytes()), 0);
}

TEST(SlotCacheState, RejectsShapesAdmissionCannotServe) {
    EXPECT_THROW(ft::slot_cache_bytes(shape(2, 8, 7, 8)), ft::Error);  // S < E
    EXPECT_THROW(ft::slot_cache_bytes(shape(2, 2000, 4000, 8)), ft::Error);  // E too large
    EXPECT_THROW(ft::slot_cache_bytes(shape(0, 8, 8, 8)), ft::Error);
    EXPECT_THROW(ft::slot_cache_bytes(shape(2, 8, 8, 0)), ft::Error);
    EXPECT_EQ(ft::plan_capacity_for(24, 16), 16);
    EXPECT_EQ(ft::plan_capacity_for(8, 16), 8);
}

TEST(AdmitLru, EmptyCacheFillsLowestSlotsInAscendingIdOrder) {
    HostSlotCache c(shape(2, 8, 10, 8));
    const SlotCacheState &st = c.state();
    EXPECT_EQ(lru(st, 0, {5, 2, 7}), (std::vector<int32_t>{1, 0, 2}));
    EXPECT_EQ(*st.step, 1);
    EXPECT_EQ(plan_slots(st), (std::vector<int32_t>{0, 1, 2}));
    EXPECT_EQ(plan_experts(st), (std::vector<int32_t>{2, 5, 7}));  // layer-local rows
    EXPECT_EQ(st.id_of_slot[1], 5);
    EXPECT_EQ(st.usage[0], 1);
    // Layer 1 takes the next empty slots; flat ids are layer * E + expert.
    EXPECT_EQ(lru(st, 1, {0, 3}), (std::vector<int32_t>{3, 4}));
    EXPECT_EQ(st.id_of_slot[3], 8);
    EXPECT_EQ(st.slot_for_id[11], 4);
    EXPECT_TRUE(ft::test::check_maps(st).empty()) << ft::test::check_maps(st);
}

TEST(AdmitLru, AscendingIdsPairWithAscendingUsageThenSlot) {
    HostSlotCache c(shape(2, 8, 8, 8));
    const SlotCacheState &st = c.state();
    // Every slot holds an expert of layer 1, with these last-use steps.
    const int64_t usage[8] = {5, 3, 3, 9, 1, 7, 2, 8};
    for (int s = 0; s < 8; ++s) {
        st.id_of_slot[s] = 8 + s;
        st.slot_for_id[8 + s] = s;
        st.usage[s] = usage[s];
    }
    *st.step = 10;
    // Misses 1, 4, 6 take the coldest (usage, slot): (1, 4), (2, 6), (3, 1).
    EXPECT_EQ(lru(st, 0, {6, 1, 4}), (std::vector<int32_t>{1, 4, 6}));
    EXPECT_EQ(plan_slots(st), (std::vector<int32_t>{4, 6, 1}));
    EXPECT_EQ(plan_experts(st), (std::vector<int32_t>{1, 4, 6}));
    EXPECT_EQ(st.slot_for_id[8 + 4], -1);  // evicted owners lose their mapping
    EXPECT_EQ(st.slot_for_id[8 + 6], -1);
    EXPECT_EQ(st.slot_for_id[8 + 1], -1);
    EXPECT_EQ(st.slot_for_id[8 + 2], 2);  // the tie partner at usage 3 stays
    EXPECT_EQ(st.usage[4], 11);
    EXPECT_TRUE(ft::test::check_maps(st).empty()) << ft::test::check_maps(st);
}

TEST(AdmitLru, DuplicatesCollapseAndShareTheirSlot) {
    HostSlotCache c(shape(1, 8, 8, 8));
    const SlotCacheState &st = c.state();
    EXPECT_EQ(lru(st, 0, {3, 3, 1, 3, 1}), (std::vector<int32_t>{1, 1, 0, 1, 0}));
    EXPECT_EQ(*st.num_indices, 2);
    EXPECT_EQ(lru(st, 0, {1, 1, 3, 3}), (std::vector<int32_t>{0, 0, 1, 1}));  // all hits
    EXPECT_EQ(*st.num_indices, 0);
    EXPECT_EQ(st.usage[0], 2);
    EXPECT_EQ(st.usage[1], 2);
    EXPECT_EQ(stat(st, 0, ft::kStatActive), 4);
    EXPECT_EQ(stat(st, 0, ft::kStatMissing), 2);
    EXPECT_EQ(stat(st, 0, ft::kStatFetched), 2);
    EXPECT_EQ(stat(st, 0, ft::kStatCalls), 2);
}

TEST(AdmitLru, AMissNeverEvictsASlotHitInTheSameCall) {
    HostSlotCache c(shape(2, 4, 4, 4));
    const SlotCacheState &st = c.state();
    lru(st, 1, {0});        // slot 0, usage 1: the coldest slot from here on
    lru(st, 0, {0, 1, 2});  // slots 1..3, usage 2
    // Layer 1 expert 0 is hit while its slot is the coldest; the miss must take slot 1.
    EXPECT_EQ(lru(st, 1, {1, 0}), (std::vector<int32_t>{1, 0}));
    EXPECT_EQ(plan_slots(st), (std::vector<int32_t>{1}));
    EXPECT_EQ(st.slot_for_id[0], -1);  // layer 0 expert 0 was evicted
    EXPECT_EQ(st.slot_for_id[4], 0);
}

TEST(AdmitLru, NegativeIdsPassThroughAndBadIdsAreRejected) {
    HostSlotCache c(shape(2, 8, 8, 8));
    const SlotCacheState &st = c.state();
    EXPECT_EQ(lru(st, 0, {-1, 4, -7}), (std::vector<int32_t>{-1, 0, -1}));
    EXPECT_EQ(stat(st, 0, ft::kStatActive), 1);

    std::vector<unsigned char> before(static_cast<const unsigned char *>(c.data()),
                                      static_cast<const unsigned char *>(c.data()) + c.bytes());
    auto expect_rejected = [&](int32_t layer, std::vector<int32_t> ids) {
        try {
            ft::admit_lru(st, layer, ids.data(), ids.data(), static_cast<int64_t>(ids.size()));
            ADD_FAILURE() << "accepted";
        } catch (const ft::Error &e) {
            EXPECT_EQ(e.status(), FT_ERR_INVALID_ARGUMENT) << e.what();
        }
        EXPECT_EQ(std::memcmp(before.data(), c.data(), c.bytes()), 0) << "a rejected call changed the state";
    };
    expect_rejected(0, {1, 8});  // id >= E
    expect_rejected(2, {1});     // layer >= L
    expect_rejected(-1, {1});
    EXPECT_THROW(ft::admit_lru(st, 0, nullptr, nullptr, 3), ft::Error);
}

TEST(AdmitLru, PlanCapacityFollowsDistinctIdsNotTokensTimesK) {
    // 3 tokens x K=8 = 24 ids > E = 8: the plan needs at most min(24, E) = 8 entries.
    std::vector<int32_t> ids;
    for (int t = 0; t < 3; ++t)
        for (int k = 0; k < 8; ++k) ids.push_back((t + k) % 8);
    for (int32_t plan : {ft::plan_capacity_for(24, 16), 8}) {
        HostSlotCache c(shape(2, 8, 16, plan));
        const SlotCacheState &st = c.state();
        lru(st, 1, ids);
        EXPECT_EQ(*st.num_indices, 8);
        EXPECT_EQ(plan_experts(st), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
    }
    // A plan shorter than min(ids, E) fails cleanly even when this call would fit.
    HostSlotCache small(shape(2, 8, 16, 7));
    try {
        ft::admit_lru(small.state(), 0, ids.data(), ids.data(), 24);
        ADD_FAILURE() << "accepted a 7-entry plan for 24 ids";
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find("capacity"), std::string::npos) << e.what();
    }
    EXPECT_EQ(*small.state().step, 0);
    // Fewer ids than E need only as many entries as ids.
    HostSlotCache three(shape(2, 8, 16, 3));
    EXPECT_EQ(lru(three.state(), 0, {7, 6, 5}), (std::vector<int32_t>{2, 1, 0}));
}

TEST(AdmitHybrid, FractionSplitsTheMisses) {
    // docs/formulas.md, "Hybrid split": f = 0.415 fetches 1 of 3 misses and 2 of 4.
    HostSlotCache c(shape(2, 16, 16, 16));
    const SlotCacheState &st = c.state();
    auto out = hybrid(st, 0, {3, 9, 5}, fraction(0.415));
    EXPECT_EQ(*st.num_missing_full, 3);
    EXPECT_EQ(*st.num_indices, 1);
    // Nothing seen before: ties on recency go to the lower id.
    EXPECT_EQ(plan_experts(st), (std::vector<int32_t>{3}));
    EXPECT_EQ(out, (std::vector<int32_t>{0, -1, -1}));
    out = hybrid(st, 1, {1, 2, 3, 4}, fraction(0.415));
    EXPECT_EQ(*st.num_missing_full, 4);
    EXPECT_EQ(*st.num_indices, 2);
    EXPECT_EQ(out, (std::vector<int32_t>{1, 2, -1, -1}));
    EXPECT_EQ(stat(st, 1, ft::kStatMissing), 4);
    EXPECT_EQ(stat(st, 1, ft::kStatFetched), 2);
    EXPECT_EQ(stat(st, 1, ft::kStatActive), 4);
}

TEST(AdmitHybrid, FixedCapOfOneFetchesOneOfEightColdMisses) {
    HostSlotCache c(shape(2, 16, 16, 16));
    const SlotCacheState &st = c.state();
    const auto out = hybrid(st, 0, {8, 9, 10, 11, 12, 13, 14, 15}, cap(1));
    EXPECT_EQ(*st.num_missing_full, 8);
    EXPECT_EQ(*st.num_indices, 1);
    EXPECT_EQ(out, (std::vector<int32_t>{0, -1, -1, -1, -1, -1, -1, -1}));
    // The CPU-routed experts are now the most recent: with cap 2 next time, the recurring
    // overflow misses 14 and 15 outrank the never-seen 0 and 1.
    hybrid(st, 0, {0, 1, 14, 15}, cap(2));
    EXPECT_EQ(plan_experts(st), (std::vector<int32_t>{14, 15}));
    // lowest_id ignores recency.
    hybrid(st, 0, {1, 0, 9}, cap(1, FetchOrder::LowestId));
    EXPECT_EQ(plan_experts(st), (std::vector<int32_t>{0}));
}

TEST(AdmitHybrid, RecencyOrdersFetchesMostRecentFirst) {
    HostSlotCache c(shape(1, 8, 8, 8));
    const SlotCacheState &st = c.state();
    hybrid(st, 0, {5}, cap(0));     // step 1: 5 active, not fetched
    hybrid(st, 0, {2, 6}, cap(0));  // step 2
    hybrid(st, 0, {7}, cap(0));     // step 3
    hybrid(st, 0, {0, 2, 5, 6, 7}, cap(5));
    // 7 (step 3) first, then 2 and 6 (step 2, lower id first), then 5 (step 1), then 0 (never).
    EXPECT_EQ(plan_experts(st), (std::vector<int32_t>{7, 2, 6, 5, 0}));
    EXPECT_EQ(plan_slots(st), (std::vector<int32_t>{0, 1, 2, 3, 4}));
    for (int e : {0, 2, 5, 6, 7}) EXPECT_EQ(st.expert_recency[e], 4);
}

TEST(AdmitHybrid, VictimsAreNeverOwnedByAnActiveExpert) {
    HostSlotCache c(shape(2, 4, 4, 4));
    const SlotCacheState &st = c.state();
    hybrid(st, 1, {0}, fraction(1.0));        // slot 0, usage 1: the coldest slot from here on
    hybrid(st, 0, {0, 1, 2}, fraction(1.0));  // slots 1..3, usage 2
    // Layer 1 expert 0 is active and owns the coldest slot; the fetched miss takes slot 1.
    EXPECT_EQ(hybrid(st, 1, {1, -1, 0}, fraction(1.0)), (std::vector<int32_t>{1, -1, 0}));
    EXPECT_EQ(plan_slots(st), (std::vector<int32_t>{1}));
    EXPECT_EQ(st.slot_for_id[0], -1);
    // Layer 0's hits (1, 2) keep slots 2 and 3 although they are the coldest; its misses take
    // layer 1's slots, expert 0 (active at step 2) before the never-seen 3.
    EXPECT_EQ(hybrid(st, 0, {3, 2, 1, 0}, cap(4)), (std::vector<int32_t>{1, 3, 2, 0}));
    EXPECT_EQ(plan_experts(st), (std::vector<int32_t>{0, 3}));
    EXPECT_EQ(plan_slots(st), (std::vector<int32_t>{0, 1}));
}

TEST(AdmitHybrid, FullFetchByLowestIdEqualsLru) {
    // f = 1 fetches every miss; with lowest_id order the hybrid admission is the LRU one, byte
    // for byte (recency is untouched by lowest_id and stays -1 in both).
    const SlotCacheShape s = shape(3, 16, 24, 16);
    HostSlotCache a(s), b(s);
    std::mt19937 rng(11);
    for (int i = 0; i < 300; ++i) {
        ft::test::Step step = ft::test::random_step(rng, s, false, 16);
        std::vector<int32_t> x = step.ids, y = step.ids;
        ft::admit_lru(a.state(), step.layer, x.data(), x.data(), static_cast<int64_t>(x.size()));
        ft::admit_hybrid(b.state(), step.layer, y.data(), y.data(), static_cast<int64_t>(y.size()),
                         fraction(1.0, FetchOrder::LowestId));
        ASSERT_EQ(x, y) << "step " << i;
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.bytes()), 0)
            << "step " << i << "\n" << ft::test::describe_difference(a.state(), b.state());
    }
}

// Hundreds of random calls per shape; after each, the invariants of the maps and of the call.
TEST(AdmitRandom, InvariantsHoldOverManySteps) {
    const SlotCacheShape shapes[] = {shape(2, 32, 32, 32),   shape(2, 32, 40, 32),   shape(3, 64, 100, 64),
                                     shape(4, 128, 512, 128), shape(4, 256, 300, 256), shape(2, 8, 16, 8)};
    std::mt19937 rng(7);
    for (const auto &s : shapes) {
        for (bool hyb : {false, true}) {
            HostSlotCache c(s);
            const SlotCacheState &st = c.state();
            for (int i = 0; i < 300; ++i) {
                const ft::test::Step step = ft::test::random_step(rng, s, hyb, 256);
                std::vector<int32_t> out(step.ids.size());
                if (hyb)
                    ft::admit_hybrid(st, step.layer, step.ids.data(), out.data(), static_cast<int64_t>(out.size()),
                                     step.fetch);
                else
                    ft::admit_lru(st, step.layer, step.ids.data(), out.data(), static_cast<int64_t>(out.size()));
                const std::string maps = ft::test::check_maps(st), call = ft::test::check_call(st, step, out);
                ASSERT_TRUE(maps.empty() && call.empty())
                    << "L=" << s.layers << " E=" << s.experts << " S=" << s.slots << (hyb ? " hybrid" : " lru")
                    << " step " << i << ": " << maps << call;
            }
            // Statistics add up over the run.
            int64_t calls = 0;
            for (int l = 0; l < s.layers; ++l) calls += stat(st, l, ft::kStatCalls);
            EXPECT_EQ(calls, 300);
        }
    }
}

}  // namespace
