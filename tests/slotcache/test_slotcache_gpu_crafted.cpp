// Device admission against the host mirror on crafted states: large caches (S up to 65536) with
// heavy usage ties and miss counts up to E, the clock across the fast path's packing limit, empty
// calls, and the launchers' argument checks. Skips where no CUDA device is usable.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "slotcache_gpu_check.hpp"

namespace {

using namespace slotcache_gpu;

// Decode-sized and batch-sized calls on crafted caches of S = 2048, 8192 and 65536 with heavy
// usage ties, miss counts on both sides of the fast path's 32, for LRU and for hybrid with the
// fractions and fixed caps the engine uses.
TEST(SlotCacheGpu, CraftedLargeCachesWithTiesMatchTheMirror) {
    SKIP_WITHOUT_GPU();
    struct Case {
        SlotCacheShape shape;
        int32_t distinct_usages;
        double empty;
    };
    const Case cases[] = {
        {shape(16, 256, 2048, 1024), 3, 0.0},
        {shape(64, 256, 8192, 1024), 5, 0.1},
        {shape(64, 256, 8192, 1024), 1, 0.0},  // every slot ties: the slot index alone orders
        {shape(16, 1024, 8192, 1024), 40, 0.02},
        {shape(512, 256, 65536, 1024), 7, 0.05},
        {shape(4, 1024, 65536, 1024), 2, 0.97},  // nearly cold: M up to E, 60000 empty slots tied at 0
    };
    const int32_t miss_counts[] = {1, 8, 31, 32, 33, 64, 256, 1024};
    const double fractions[] = {0.1, 0.415, 0.7, 1.0};
    const int32_t caps[] = {0, 1, 8, 40};
    DeviceArray<int32_t> d_ids(1024), d_out(1024);
    ASSERT_NE(d_ids.get(), nullptr);
    uint32_t seed = 700;
    for (const Case &c : cases) {
        for (int variant = 0; variant < 2; ++variant) {  // 0: LRU, 1: hybrid
            SCOPED_TRACE(describe(c.shape) + (variant ? " hybrid" : " lru"));
            std::mt19937 rng(seed++);
            HostSlotCache mirror(c.shape);
            craft_state(mirror, rng, c.distinct_usages, c.empty);
            DeviceCache device(mirror);
            ASSERT_TRUE(device.ok());
            int call = 0;
            for (int32_t misses : miss_counts) {
                if (misses > c.shape.experts) continue;
                for (int rep = 0; rep < 3; ++rep, ++call) {
                    ft::test::Step step;
                    step.hybrid = variant == 1;
                    step.layer = std::uniform_int_distribution<int32_t>(0, c.shape.layers - 1)(rng);
                    const int32_t count = misses <= 8 ? 64 : std::min(1024, 2 * misses);
                    step.ids = controlled_ids(mirror.state(), step.layer, 8, misses, count, rng);
                    if (step.hybrid) {
                        const FetchOrder order = rep == 2 ? FetchOrder::LowestId : FetchOrder::Recency;
                        step.fetch = call % 2 ? fetch_rule(fractions[(call / 2) % 4], 0, order)
                                              : fetch_rule(0.0, caps[(call / 2) % 4], order);
                    }
                    ASSERT_TRUE(same_call(mirror, device, d_ids, d_out, step, call % 2 == 1))
                        << "call " << call << ", " << misses << " misses asked";
                }
            }
        }
    }
}

// The fast path skips its step 4 when no winning thread owns a second key among the coldest; here
// every thread's slots are the coldest of all in turn (usage grows with the owning thread first),
// so each round's victims cluster on one or two threads and step 4 must run.
TEST(SlotCacheGpu, VictimsSharingAThreadMatchTheMirror) {
    SKIP_WITHOUT_GPU();
    const SlotCacheShape shapes[] = {shape(16, 256, 2048, 1024), shape(64, 256, 8192, 1024)};
    DeviceArray<int32_t> d_ids(1024), d_out(1024);
    ASSERT_NE(d_ids.get(), nullptr);
    uint32_t seed = 900;
    for (const SlotCacheShape &sh : shapes) {
        for (int variant = 0; variant < 2; ++variant) {  // 0: LRU, 1: hybrid
            SCOPED_TRACE(describe(sh) + (variant ? " hybrid" : " lru"));
            std::mt19937 rng(seed++);
            HostSlotCache mirror(sh);
            craft_state(mirror, rng, 2, 0.0);
            const SlotCacheState &st = mirror.state();
            const int32_t per_thread = (sh.slots + 1023) / 1024;
            for (int32_t s = 0; s < sh.slots; ++s) st.usage[s] = 1 + int64_t(s % 1024) * per_thread + s / 1024;
            *st.step = int64_t(1024) * per_thread + 2;
            DeviceCache device(mirror);
            ASSERT_TRUE(device.ok());
            int call = 0;
            for (int32_t misses : {8, 3, 33, 8, 64, 8}) {
                ft::test::Step step;
                step.hybrid = variant == 1;
                step.layer = std::uniform_int_distribution<int32_t>(0, sh.layers - 1)(rng);
                step.ids = controlled_ids(mirror.state(), step.layer, 8, misses, std::min(1024, 2 * misses + 16), rng);
                if (step.hybrid) step.fetch = fetch_rule(1.0, 0, FetchOrder::Recency);
                ASSERT_TRUE(same_call(mirror, device, d_ids, d_out, step, call % 2 == 1)) << "call " << call;
                ++call;
            }
        }
    }
}

// Decode-size calls (k <= 32) take the threshold path: T = the k-th smallest warp minimum, then a
// rank among the keys <= T. With usage ascending in slot index, warp w's minimum is slot 32 w, so
// the keys <= T are the slots <= 32 (k - 1): 225 for k = 8 (ranked), 257 for k = 9 and 993 for
// k = 32 (more than the 256 it ranks: the rounds take over with its keys). Random distinct
// usages put about k keys under T. Every call matches the mirror.
TEST(SlotCacheGpu, ThresholdPathAndItsFallbackMatchTheMirror) {
    SKIP_WITHOUT_GPU();
    const SlotCacheShape s = shape(64, 256, 8192, 1024);
    DeviceArray<int32_t> d_ids(1024), d_out(1024);
    ASSERT_NE(d_ids.get(), nullptr);
    uint32_t seed = 1100;
    for (int ordering = 0; ordering < 2; ++ordering) {  // 0: usage ascending in slot, 1: random
        for (int variant = 0; variant < 2; ++variant) {  // 0: LRU, 1: hybrid
            SCOPED_TRACE(std::string(ordering ? "random usages" : "usage = slot") + (variant ? " hybrid" : " lru"));
            std::mt19937 rng(seed++);
            HostSlotCache mirror(s);
            craft_state(mirror, rng, 2, 0.0);
            const SlotCacheState &st = mirror.state();
            std::vector<int64_t> usage(static_cast<size_t>(s.slots));
            for (int32_t i = 0; i < s.slots; ++i) usage[i] = 1 + i;
            if (ordering == 1) std::shuffle(usage.begin(), usage.end(), rng);
            std::copy(usage.begin(), usage.end(), st.usage);
            *st.step = s.slots + 2;
            DeviceCache device(mirror);
            ASSERT_TRUE(device.ok());
            int call = 0;
            for (int32_t misses : {1, 8, 9, 32, 8, 2, 31, 8}) {
                ft::test::Step step;
                step.hybrid = variant == 1;
                step.layer = std::uniform_int_distribution<int32_t>(0, s.layers - 1)(rng);
                step.ids = controlled_ids(st, step.layer, 16, misses, std::max(64, 2 * misses + 16), rng);
                if (step.hybrid) step.fetch = fetch_rule(1.0, 0, FetchOrder::Recency);
                ASSERT_TRUE(same_call(mirror, device, d_ids, d_out, step, call % 2 == 1))
                    << "call " << call << ", " << misses << " misses asked";
                ++call;
            }
        }
    }
}

// The packed keys of the fast path are exact only while step < 2^(63 - slot bits); calls across
// that limit (the general path takes over) and usages outside [0, step] (a state the API never
// makes; the general path again) still match the mirror.
TEST(SlotCacheGpu, ClockNearThePackingLimitAndOddUsagesMatchTheMirror) {
    SKIP_WITHOUT_GPU();
    for (const SlotCacheShape s : {shape(64, 256, 8192, 256), shape(256, 256, 65536, 256), shape(4, 32, 40, 32)}) {
        SCOPED_TRACE(describe(s));
        int32_t bits = 0;
        while ((int64_t{1} << bits) < s.slots) ++bits;
        const int64_t limit = int64_t{1} << (63 - bits);
        std::mt19937 rng(static_cast<uint32_t>(s.slots));
        HostSlotCache mirror(s);
        craft_state(mirror, rng, 6, 0.0);
        const SlotCacheState &st = mirror.state();
        for (int32_t i = 0; i < s.slots; ++i) st.usage[i] += limit - 12;  // ties kept, clock near the limit
        *st.step += limit - 12;
        DeviceCache device(mirror);
        ASSERT_TRUE(device.ok());
        DeviceArray<int32_t> d_ids(64), d_out(64);
        for (int call = 0; call < 12; ++call) {  // the clock passes the limit half-way
            ft::test::Step step;
            step.hybrid = call % 3 == 2;
            step.layer = call % s.layers;
            step.ids = controlled_ids(st, step.layer, 4, 1 + call % 8, 64, rng);
            step.fetch = fetch_rule(0.7, 0, FetchOrder::Recency);
            ASSERT_TRUE(same_call(mirror, device, d_ids, d_out, step, false))
                << "call " << call << ", step " << *st.step << ", limit " << limit;
        }

        // Usages from the future and negative ones (the mirror orders them as plain integers).
        HostSlotCache odd(s);
        craft_state(odd, rng, 6, 0.0);
        odd.state().usage[s.slots - 1] = -5;
        odd.state().usage[s.slots / 2] = *odd.state().step + 1000;
        odd.state().usage[1] = INT64_MIN + 3;
        DeviceCache odd_device(odd);
        ASSERT_TRUE(odd_device.ok());
        for (int call = 0; call < 6; ++call) {
            ft::test::Step step;
            step.hybrid = call % 2 == 1;
            step.layer = call % s.layers;
            step.ids = controlled_ids(odd.state(), step.layer, 4, 8, 64, rng);
            step.fetch = fetch_rule(1.0, 0, FetchOrder::Recency);
            ASSERT_TRUE(same_call(odd, odd_device, d_ids, d_out, step, true)) << "odd usages, call " << call;
        }
    }
}

// Decode shape from a cold start: S = 8192 and 65536, 8 tokens x K = 8, long runs so that empty
// slots (usage 0, all tied) run out and the LRU order of earlier installs (8 slots per step share
// a usage) decides.
TEST(SlotCacheGpu, DecodeRunsOnLargeCachesMatchTheMirror) {
    SKIP_WITHOUT_GPU();
    struct Case {
        SlotCacheShape shape;
        int calls;
    };
    const Case cases[] = {{shape(64, 256, 8192, 64), 300}, {shape(512, 256, 65536, 64), 60}};
    DeviceArray<int32_t> d_ids(64), d_out(64);
    uint32_t seed = 900;
    for (const Case &c : cases) {
        for (bool hybrid : {false, true}) {
            SCOPED_TRACE(describe(c.shape) + (hybrid ? " hybrid" : " lru"));
            std::mt19937 rng(seed++);
            HostSlotCache mirror(c.shape);
            DeviceCache device(mirror);
            ASSERT_TRUE(device.ok());
            for (int call = 0; call < c.calls; ++call) {
                ft::test::Step step;
                step.hybrid = hybrid;
                step.layer = call % c.shape.layers;
                step.ids = controlled_ids(mirror.state(), step.layer, 56, 1 + call % 16, 64, rng);
                step.fetch = fetch_rule(call % 5 == 4 ? 0.0 : 0.415 + 0.1 * (call % 4), call % 5, FetchOrder::Recency);
                ASSERT_TRUE(same_call(mirror, device, d_ids, d_out, step, call % 2 == 0)) << "call " << call;
            }
        }
    }
}

TEST(SlotCacheGpu, ManyMissesAtOnceSpanSeveralRounds) {
    SKIP_WITHOUT_GPU();
    // 256 distinct misses per call: eight victim rounds of 32; large T*K with a plan of min(T*K, S).
    const SlotCacheShape s = shape(8, 256, 1664, ft::plan_capacity_for(1024, 1664));
    HostSlotCache mirror(s);
    DeviceCache device(mirror);
    ASSERT_TRUE(device.ok());
    DeviceArray<int32_t> d_ids(1024);
    std::mt19937 rng(5);
    for (int i = 0; i < 24; ++i) {
        const int32_t layer = i % 8;
        std::vector<int32_t> ids(1024);
        for (auto &id : ids) id = std::uniform_int_distribution<int32_t>(0, 255)(rng);
        for (int e = 0; e < 256; ++e) ids[e] = e;  // every expert at least once
        std::vector<int32_t> want = ids, got(ids.size());
        const bool hyb = i % 3 == 2;
        HybridFetch f;
        f.fraction_q16 = ft::fraction_to_q16(0.7);
        if (hyb) ft::admit_hybrid(mirror.state(), layer, want.data(), want.data(), 1024, f);
        else ft::admit_lru(mirror.state(), layer, want.data(), want.data(), 1024);
        CUDA_OK(d_ids.upload(ids));
        if (hyb) CUDA_OK(ft::cuda::launch_admit_hybrid(device.state(), layer, d_ids.get(), d_ids.get(), 1024, f, nullptr));
        else CUDA_OK(ft::cuda::launch_admit_lru(device.state(), layer, d_ids.get(), d_ids.get(), 1024, nullptr));
        CUDA_OK(d_ids.download(got));
        ASSERT_EQ(want, got) << "call " << i << ": " << first_route_difference(ids, want, got);
        ASSERT_TRUE(device.matches(mirror)) << "call " << i;
    }
}

TEST(SlotCacheGpu, EmptyCallsResetAndClearStatsMatchTheMirror) {
    SKIP_WITHOUT_GPU();
    const SlotCacheShape s = shape(3, 32, 64, 32);
    HostSlotCache mirror(s);
    DeviceCache device(mirror);
    ASSERT_TRUE(device.ok());
    DeviceArray<int32_t> d_ids(64);
    std::mt19937 rng(9);
    for (int i = 0; i < 40; ++i) {
        const ft::test::Step step = ft::test::random_step(rng, s, i % 2 == 1, 64);
        std::vector<int32_t> ids = step.ids;
        const auto n = static_cast<int64_t>(ids.size());
        if (step.hybrid) ft::admit_hybrid(mirror.state(), step.layer, ids.data(), ids.data(), n, step.fetch);
        else ft::admit_lru(mirror.state(), step.layer, ids.data(), ids.data(), n);
        CUDA_OK(d_ids.upload(step.ids));
        if (step.hybrid) CUDA_OK(ft::cuda::launch_admit_hybrid(device.state(), step.layer, d_ids.get(), d_ids.get(), n, step.fetch, nullptr));
        else CUDA_OK(ft::cuda::launch_admit_lru(device.state(), step.layer, d_ids.get(), d_ids.get(), n, nullptr));
    }
    // A call with no ids still ticks the clock and counts as a call.
    ft::admit_lru(mirror.state(), 1, nullptr, nullptr, 0);
    CUDA_OK(ft::cuda::launch_admit_lru(device.state(), 1, nullptr, nullptr, 0, nullptr));
    ft::admit_hybrid(mirror.state(), 2, nullptr, nullptr, 0, HybridFetch{});
    CUDA_OK(ft::cuda::launch_admit_hybrid(device.state(), 2, nullptr, nullptr, 0, HybridFetch{}, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_TRUE(device.matches(mirror)) << "after random and empty calls";

    ft::slot_cache_reset(mirror.state());
    CUDA_OK(ft::cuda::launch_slot_cache_reset(device.state(), nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_TRUE(device.matches(mirror)) << "after reset (statistics kept)";
    ft::slot_cache_clear_stats(mirror.state());
    CUDA_OK(ft::cuda::launch_slot_cache_clear_stats(device.state(), nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_TRUE(device.matches(mirror)) << "after clearing statistics";
}

TEST(SlotCacheGpu, LaunchersRejectBadArgumentsWithoutLaunching) {
    // Host-side checks only: no device needed.
    const SlotCacheShape s = shape(2, 8, 8, 4);
    HostSlotCache host(s);  // pointers are never dereferenced by a rejected launch
    const SlotCacheState &st = host.state();
    int32_t ids[8] = {0};
    EXPECT_EQ(ft::cuda::launch_admit_lru(st, 2, ids, ids, 1, nullptr), cudaErrorInvalidValue);
    EXPECT_EQ(ft::cuda::launch_admit_lru(st, 0, ids, ids, -1, nullptr), cudaErrorInvalidValue);
    EXPECT_EQ(ft::cuda::launch_admit_lru(st, 0, nullptr, ids, 3, nullptr), cudaErrorInvalidValue);
    EXPECT_EQ(ft::cuda::launch_admit_lru(st, 0, ids, ids, 5, nullptr), cudaErrorInvalidValue);  // plan 4 < 5
    EXPECT_EQ(ft::cuda::launch_admit_hybrid(st, 0, ids, ids, 8, HybridFetch{}, nullptr), cudaErrorInvalidValue);
    SlotCacheState bad = st;
    bad.shape.slots = 7;  // S < E
    EXPECT_EQ(ft::cuda::launch_admit_lru(bad, 0, ids, ids, 1, nullptr), cudaErrorInvalidValue);
    bad = st;
    bad.usage = nullptr;
    EXPECT_EQ(ft::cuda::launch_admit_lru(bad, 0, ids, ids, 1, nullptr), cudaErrorInvalidValue);
}

TEST(SlotCacheGpu, IdsAtOrAboveExpertsAreIgnoredOnTheDevice) {
    SKIP_WITHOUT_GPU();
    // The mirror rejects them; the kernel cannot report them, so it must at least stay in bounds.
    const SlotCacheShape s = shape(2, 8, 8, 8);
    HostSlotCache mirror(s);
    DeviceCache device(mirror);
    ASSERT_TRUE(device.ok());
    DeviceArray<int32_t> d_ids(4);
    CUDA_OK(d_ids.upload({3, 8, 1000000, 3}));
    CUDA_OK(ft::cuda::launch_admit_lru(device.state(), 1, d_ids.get(), d_ids.get(), 4, nullptr));
    std::vector<int32_t> got(4);
    CUDA_OK(d_ids.download(got));
    EXPECT_EQ(got, (std::vector<int32_t>{0, -1, -1, 0}));
    std::vector<int32_t> valid = {3, -1, -1, 3};
    ft::admit_lru(mirror.state(), 1, valid.data(), valid.data(), 4);
    EXPECT_TRUE(device.matches(mirror));
}
}  // namespace
