// Device admission kernels against the host mirror, bit for bit: random runs for
// both algorithms over many shapes, crafted large caches (S up to 65536) with heavy usage ties and
// miss counts up to E, the clock across the fast path's packing limit, CUDA-graph replays with new
// ids (bench/bench_admission times the admission calls).
// Skips where no CUDA device is usable.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ft/cuda_memory.hpp"
#include "ft/slotcache.hpp"
#include "ft/slotcache_cuda.hpp"
#include "slotcache_steps.hpp"

namespace {

using ft::FetchOrder;
using ft::HostSlotCache;
using ft::HybridFetch;
using ft::SlotCacheShape;
using ft::SlotCacheState;

#define SKIP_WITHOUT_GPU()                                                    \
    do {                                                                      \
        int n_ = 0;                                                           \
        const cudaError_t e_ = cudaGetDeviceCount(&n_);                       \
        if (e_ != cudaSuccess) {                                              \
            cudaGetLastError();                                               \
            GTEST_SKIP() << "no CUDA device: " << cudaGetErrorString(e_);     \
        }                                                                     \
        if (n_ == 0) GTEST_SKIP() << "no CUDA device";                        \
    } while (0)

#define CUDA_OK(expr)                                                                                   \
    do {                                                                                                \
        const cudaError_t e_ = (expr);                                                                  \
        ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
    } while (0)

SlotCacheShape shape(int32_t layers, int32_t experts, int32_t slots, int32_t plan) {
    SlotCacheShape s;
    s.layers = layers;
    s.experts = experts;
    s.slots = slots;
    s.plan_capacity = plan;
    return s;
}

std::string describe(const SlotCacheShape &s) {
    return "L=" + std::to_string(s.layers) + " E=" + std::to_string(s.experts) + " S=" + std::to_string(s.slots) +
           " plan=" + std::to_string(s.plan_capacity);
}

// A device copy of a host cache, in the same layout.
class DeviceCache {
public:
    explicit DeviceCache(const HostSlotCache &host) : bytes_(host.bytes()) {
        try {
            buffer_ = ft::cuda::DeviceBuffer(bytes_);
        } catch (const ft::Error &) {
            return;
        }
        if (cudaMemcpy(buffer_.get(), host.data(), bytes_, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess) {
            buffer_ = ft::cuda::DeviceBuffer();
            return;
        }
        state_ = ft::slot_cache_bind(host.state().shape, buffer_.get());
    }

    bool ok() const { return buffer_.get() != nullptr; }
    const SlotCacheState &state() const { return state_; }

    // Bit-for-bit comparison with the mirror; the message names every array that differs.
    ::testing::AssertionResult matches(const HostSlotCache &mirror) const {
        HostSlotCache copy(state_.shape);
        const cudaError_t e = cudaMemcpy(const_cast<void *>(copy.data()), buffer_.get(), bytes_, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) return ::testing::AssertionFailure() << "download: " << cudaGetErrorString(e);
        if (std::memcmp(copy.data(), mirror.data(), bytes_) == 0) return ::testing::AssertionSuccess();
        const std::string diff = ft::test::describe_difference(mirror.state(), copy.state());
        return ::testing::AssertionFailure() << "device state differs from the mirror:\n"
                                             << (diff.empty() ? std::string("(padding bytes only)\n") : diff);
    }

private:
    ft::cuda::DeviceBuffer buffer_;
    size_t bytes_ = 0;
    SlotCacheState state_;
};

template <typename T>
class DeviceArray {
public:
    // p_ stays null when the allocation fails (the tests assert on get()).
    explicit DeviceArray(size_t n) : n_(n) {
        try {
            buf_ = ft::cuda::DeviceBuffer(std::max<size_t>(n, 1) * sizeof(T));
            p_ = buf_.get<T>();
        } catch (const ft::Error &) {
        }
    }
    T *get() const { return p_; }
    // Waits for the whole device: a pageable cudaMemcpy may return before its DMA lands, and the
    // kernels that read these ids may run on a non-blocking stream.
    cudaError_t upload(const std::vector<T> &v, size_t at = 0) const {
        const cudaError_t e = cudaMemcpy(p_ + at, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
        return e != cudaSuccess ? e : cudaDeviceSynchronize();
    }
    cudaError_t download(std::vector<T> &v, size_t at = 0) const {
        return cudaMemcpy(v.data(), p_ + at, v.size() * sizeof(T), cudaMemcpyDeviceToHost);
    }

private:
    ft::cuda::DeviceBuffer buf_;
    T *p_ = nullptr;
    size_t n_;
};

std::string first_route_difference(const std::vector<int32_t> &ids, const std::vector<int32_t> &want,
                                   const std::vector<int32_t> &got) {
    for (size_t i = 0; i < want.size(); ++i)
        if (want[i] != got[i])
            return "position " + std::to_string(i) + " (id " + std::to_string(ids[i]) + "): mirror slot " +
                   std::to_string(want[i]) + ", device slot " + std::to_string(got[i]);
    return "";
}

std::string describe(const ft::test::Step &s) {
    std::string out = (s.hybrid ? "hybrid" : "lru");
    out += " layer " + std::to_string(s.layer) + ", " + std::to_string(s.ids.size()) + " ids";
    if (s.hybrid)
        out += ", fraction_q16 " + std::to_string(s.fetch.fraction_q16) + ", max_fetch " +
               std::to_string(s.fetch.max_fetch) + (s.fetch.order == FetchOrder::Recency ? ", recency" : ", lowest_id");
    return out;
}

// Runs `steps` random calls on the mirror and the device, comparing routes and every array after
// each call. Odd steps rewrite the ids in place on the device.
void run_random(const SlotCacheShape &s, bool hybrid, int steps, uint32_t seed, int32_t max_ids = 256) {
    HostSlotCache mirror(s);
    DeviceCache device(mirror);
    ASSERT_TRUE(device.ok()) << "cudaMalloc of the cache failed";
    DeviceArray<int32_t> d_ids(max_ids), d_out(max_ids);
    ASSERT_NE(d_ids.get(), nullptr);
    std::mt19937 rng(seed);
    for (int i = 0; i < steps; ++i) {
        const ft::test::Step step = ft::test::random_step(rng, s, hybrid, max_ids);
        const auto n = static_cast<int64_t>(step.ids.size());
        std::vector<int32_t> want(step.ids.size()), got(step.ids.size());
        if (hybrid) ft::admit_hybrid(mirror.state(), step.layer, step.ids.data(), want.data(), n, step.fetch);
        else ft::admit_lru(mirror.state(), step.layer, step.ids.data(), want.data(), n);

        CUDA_OK(d_ids.upload(step.ids));
        int32_t *out = (i % 2 == 1) ? d_ids.get() : d_out.get();
        if (hybrid) CUDA_OK(ft::cuda::launch_admit_hybrid(device.state(), step.layer, d_ids.get(), out, n, step.fetch, nullptr));
        else CUDA_OK(ft::cuda::launch_admit_lru(device.state(), step.layer, d_ids.get(), out, n, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(got.data(), out, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));

        ASSERT_EQ(want, got) << describe(s) << ", step " << i << " (" << describe(step) << ", "
                             << (out == d_ids.get() ? "in place" : "separate output")
                             << "): " << first_route_difference(step.ids, want, got);
        ASSERT_TRUE(device.matches(mirror)) << describe(s) << ", step " << i << " (" << describe(step) << ")";
        const std::string call = ft::test::check_call(mirror.state(), step, want);
        ASSERT_TRUE(call.empty()) << describe(s) << ", step " << i << ": mirror broke an invariant: " << call;
    }
}

struct RandomCase {
    SlotCacheShape shape;
    int steps;
};

std::vector<RandomCase> random_cases() {
    return {
        {shape(2, 32, 32, 32), 300},      // S = E: every miss evicts
        {shape(2, 32, 40, 40), 300},      // the original engine's hybrid test shape
        {shape(3, 64, 96, 64), 300},
        {shape(4, 64, 256, 256), 300},    // S = L * E: never evicts once full
        {shape(2, 128, 200, 128), 250},
        {shape(4, 256, 300, 256), 250},
        {shape(3, 256, 768, 256), 200},
        {shape(2, 100, 150, 100), 200},   // E not a power of two, not a multiple of 32
        {shape(36, 256, 8192, 256), 120}, // largest S on the register path
        {shape(33, 256, 8193, 256), 120}, // smallest S on the global-memory path
        {shape(64, 256, 12000, 256), 80},
        {shape(256, 256, 65536, 256), 40},
        {shape(2, 1024, 1500, 1024), 60}, // kMaxAdmissionExperts
    };
}

TEST(SlotCacheGpu, LruMatchesMirrorOverRandomSteps) {
    SKIP_WITHOUT_GPU();
    uint32_t seed = 100;
    for (const auto &c : random_cases()) {
        SCOPED_TRACE(describe(c.shape));
        run_random(c.shape, false, c.steps, seed++);
        if (HasFatalFailure()) return;
    }
}

TEST(SlotCacheGpu, HybridMatchesMirrorOverRandomSteps) {
    SKIP_WITHOUT_GPU();
    uint32_t seed = 200;
    for (const auto &c : random_cases()) {
        SCOPED_TRACE(describe(c.shape));
        run_random(c.shape, true, c.steps, seed++);
        if (HasFatalFailure()) return;
    }
}

// ---- Crafted states: large caches, ties, the fast path's limits ------------------------------------

// One call on the mirror and on the device (in place or into a separate output), then routes and
// every array compared.
::testing::AssertionResult same_call(const HostSlotCache &mirror, const DeviceCache &device,
                                     const DeviceArray<int32_t> &d_ids, const DeviceArray<int32_t> &d_out,
                                     const ft::test::Step &step, bool in_place) {
    const auto n = static_cast<int64_t>(step.ids.size());
    std::vector<int32_t> want(step.ids.size()), got(step.ids.size());
    if (step.hybrid) ft::admit_hybrid(mirror.state(), step.layer, step.ids.data(), want.data(), n, step.fetch);
    else ft::admit_lru(mirror.state(), step.layer, step.ids.data(), want.data(), n);
    cudaError_t e = d_ids.upload(step.ids);
    int32_t *out = in_place ? d_ids.get() : d_out.get();
    if (e == cudaSuccess)
        e = step.hybrid ? ft::cuda::launch_admit_hybrid(device.state(), step.layer, d_ids.get(), out, n, step.fetch, nullptr)
                        : ft::cuda::launch_admit_lru(device.state(), step.layer, d_ids.get(), out, n, nullptr);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpy(got.data(), out, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << describe(step) << ": " << cudaGetErrorString(e);
    if (want != got)
        return ::testing::AssertionFailure() << describe(step) << ": " << first_route_difference(step.ids, want, got);
    ::testing::AssertionResult same = device.matches(mirror);
    if (!same) return ::testing::AssertionFailure() << describe(step) << ": " << same.message();
    return ::testing::AssertionSuccess();
}

// Fills a reset mirror: every slot holds a random flat id (L * E >= S) or, with probability
// `empty`, nothing; usages take only `distinct_usages` values, so ties are everywhere and the slot
// index decides; the clock stands just above them; recency takes few values too (ties by id).
void craft_state(const HostSlotCache &mirror, std::mt19937 &rng, int32_t distinct_usages, double empty) {
    const SlotCacheState &st = mirror.state();
    const int64_t ids = static_cast<int64_t>(st.shape.layers) * st.shape.experts;
    std::vector<int32_t> flat(static_cast<size_t>(ids));
    for (int64_t i = 0; i < ids; ++i) flat[i] = static_cast<int32_t>(i);
    std::shuffle(flat.begin(), flat.end(), rng);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::uniform_int_distribution<int32_t> use(1, distinct_usages);
    for (int32_t s = 0; s < st.shape.slots; ++s) {
        if (s < ids && u(rng) >= empty) {
            st.id_of_slot[s] = flat[s];
            st.slot_for_id[flat[s]] = s;
            st.usage[s] = use(rng);
        }
    }
    *st.step = distinct_usages + 1;
    std::uniform_int_distribution<int64_t> rec(-1, 3);
    for (int64_t i = 0; i < ids; ++i) st.expert_recency[i] = rec(rng);
}

// Routing of `tokens` x `k` ids for `layer` with exactly `misses` distinct non-resident experts and
// up to `hits` distinct resident ones (fewer if the layer lacks them), shuffled, duplicates
// included when tokens * k exceeds the distinct experts.
std::vector<int32_t> controlled_ids(const SlotCacheState &st, int32_t layer, int32_t hits, int32_t misses,
                                    int32_t count, std::mt19937 &rng) {
    const int32_t E = st.shape.experts;
    std::vector<int32_t> in, out;
    for (int32_t e = 0; e < E; ++e) (st.slot_for_id[layer * E + e] >= 0 ? in : out).push_back(e);
    std::shuffle(in.begin(), in.end(), rng);
    std::shuffle(out.begin(), out.end(), rng);
    in.resize(std::min<size_t>(in.size(), static_cast<size_t>(hits)));
    out.resize(std::min<size_t>(out.size(), static_cast<size_t>(misses)));
    std::vector<int32_t> distinct = out;
    distinct.insert(distinct.end(), in.begin(), in.end());
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < count && !distinct.empty(); ++i)
        ids.push_back(i < static_cast<int32_t>(distinct.size())
                          ? distinct[i]
                          : distinct[std::uniform_int_distribution<size_t>(0, distinct.size() - 1)(rng)]);
    std::shuffle(ids.begin(), ids.end(), rng);
    return ids;
}

HybridFetch fetch_rule(double fraction, int32_t cap, FetchOrder order) {
    HybridFetch f;
    f.fraction_q16 = ft::fraction_to_q16(fraction);
    f.max_fetch = cap;
    f.order = order;
    return f;
}

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

// A captured sequence of admissions (four layers per replay) replayed with new ids gives what the
// same calls give eagerly on a second device cache, and what the mirror gives.
void run_graph(bool hybrid, ft::SlotPolicy policy = {}) {
    SlotCacheShape s = shape(4, 64, 128, 64);
    s.policy = policy;
    constexpr int kLayers = 4, kIds = 48;
    HostSlotCache mirror(s);
    DeviceCache graph_cache(mirror), eager_cache(mirror);
    ASSERT_TRUE(graph_cache.ok() && eager_cache.ok());
    DeviceArray<int32_t> g_ids(kLayers * kIds), g_out(kLayers * kIds), e_ids(kLayers * kIds), e_out(kLayers * kIds);
    HybridFetch fetch[kLayers];
    for (int l = 0; l < kLayers; ++l) {
        fetch[l].fraction_q16 = l == 3 ? 0 : ft::fraction_to_q16(0.2 + 0.2 * l);
        fetch[l].max_fetch = 2;
        fetch[l].order = l == 1 ? FetchOrder::LowestId : FetchOrder::Recency;
    }
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto enqueue = [&](const DeviceCache &c, const DeviceArray<int32_t> &in, const DeviceArray<int32_t> &out) {
        for (int l = 0; l < kLayers; ++l) {
            const cudaError_t e =
                hybrid ? ft::cuda::launch_admit_hybrid(c.state(), l, in.get() + l * kIds, out.get() + l * kIds, kIds,
                                                       fetch[l], stream)
                       : ft::cuda::launch_admit_lru(c.state(), l, in.get() + l * kIds, out.get() + l * kIds, kIds, stream);
            if (e != cudaSuccess) return e;
        }
        return cudaSuccess;
    };

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const cudaError_t captured = enqueue(graph_cache, g_ids, g_out);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(captured);
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

    std::mt19937 rng(hybrid ? 31 : 30);
    for (int rep = 0; rep < 60; ++rep) {
        std::vector<int32_t> ids(kLayers * kIds);
        for (auto &id : ids) {
            id = std::uniform_int_distribution<int32_t>(0, rep % 2 ? 15 : 63)(rng);
            if (hybrid && std::uniform_int_distribution<int>(0, 9)(rng) == 0) id = -1;
        }
        std::vector<int32_t> want = ids;
        for (int l = 0; l < kLayers; ++l) {
            int32_t *p = want.data() + l * kIds;
            if (hybrid) ft::admit_hybrid(mirror.state(), l, p, p, kIds, fetch[l]);
            else ft::admit_lru(mirror.state(), l, p, p, kIds);
        }
        CUDA_OK(g_ids.upload(ids));
        CUDA_OK(e_ids.upload(ids));
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(enqueue(eager_cache, e_ids, e_out));
        CUDA_OK(cudaStreamSynchronize(stream));
        std::vector<int32_t> from_graph(ids.size()), from_eager(ids.size());
        CUDA_OK(g_out.download(from_graph));
        CUDA_OK(e_out.download(from_eager));
        ASSERT_EQ(from_eager, want) << "eager, replay " << rep << ": " << first_route_difference(ids, want, from_eager);
        ASSERT_EQ(from_graph, want) << "graph, replay " << rep << ": " << first_route_difference(ids, want, from_graph);
        ASSERT_TRUE(graph_cache.matches(mirror)) << "graph replay " << rep;
        ASSERT_TRUE(eager_cache.matches(mirror)) << "eager call " << rep;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
}

TEST(SlotCacheGpu, LruGraphReplaysEqualEagerCalls) {
    SKIP_WITHOUT_GPU();
    run_graph(false);
}

TEST(SlotCacheGpu, HybridGraphReplaysEqualEagerCalls) {
    SKIP_WITHOUT_GPU();
    run_graph(true);
}

// ---- Frequency policy -----------------------------------------------------------------------------

SlotCacheShape with_frequency(SlotCacheShape s, int64_t half_life) {
    s.policy = {ft::SlotPolicyKind::Frequency, half_life};
    return s;
}

TEST(SlotCacheGpu, FrequencyGraphReplaysEqualEagerCalls) {
    SKIP_WITHOUT_GPU();
    run_graph(false, {ft::SlotPolicyKind::Frequency, 6});
    if (HasFatalFailure()) return;
    run_graph(true, {ft::SlotPolicyKind::Frequency, 40});
}

// Every random shape (register and global-memory paths, S = E up to S = L * E), LRU-style and
// hybrid admission, with half-lives from one call (bonuses vanish fast) to thousands.
TEST(SlotCacheGpu, FrequencyMatchesMirrorOverRandomSteps) {
    SKIP_WITHOUT_GPU();
    uint32_t seed = 300;
    const int64_t half_lives[] = {1, 3, 17, 200, 5000};
    for (const auto &c : random_cases()) {
        for (bool hybrid : {false, true}) {
            const SlotCacheShape s = with_frequency(c.shape, half_lives[seed % 5]);
            SCOPED_TRACE(describe(s) + (hybrid ? " hybrid" : " lru") + " frequency h=" + std::to_string(s.policy.half_life));
            run_random(s, hybrid, c.steps, seed++);
            if (HasFatalFailure()) return;
        }
    }
}

// Decode-sized calls on large caches (the threshold path, its fallback rounds, the global-memory
// path at S = 65536), then priorities beyond the packing limit, which only the general path orders.
TEST(SlotCacheGpu, FrequencyDecodeRunsAndHugePrioritiesMatchTheMirror) {
    SKIP_WITHOUT_GPU();
    const SlotCacheShape cases[] = {with_frequency(shape(64, 256, 8192, 64), 64 * 16),
                                    with_frequency(shape(512, 256, 65536, 64), 7)};
    DeviceArray<int32_t> d_ids(64), d_out(64);
    uint32_t seed = 1900;
    for (const SlotCacheShape &sh : cases) {
        for (bool hybrid : {false, true}) {
            SCOPED_TRACE(describe(sh) + (hybrid ? " hybrid" : " lru"));
            std::mt19937 rng(seed++);
            HostSlotCache mirror(sh);
            DeviceCache device(mirror);
            ASSERT_TRUE(device.ok());
            for (int call = 0; call < 200; ++call) {
                ft::test::Step step;
                step.hybrid = hybrid;
                step.layer = call % 8;  // few layers: experts come back and build up priority
                step.ids = controlled_ids(mirror.state(), step.layer, 56, 1 + call % 16, 64, rng);
                step.fetch = fetch_rule(0.415 + 0.1 * (call % 4), call % 5, FetchOrder::Recency);
                ASSERT_TRUE(same_call(mirror, device, d_ids, d_out, step, call % 2 == 0)) << "call " << call;
            }
            // Priorities past 2^(63 - slot bits): the packed paths refuse them, the general path runs.
            const SlotCacheState &st = mirror.state();
            for (int32_t s = 0; s < st.shape.slots; s += 3)
                if (st.id_of_slot[s] >= 0) st.priority[s] = st.expert_priority[st.id_of_slot[s]] = (int64_t{1} << 58) + s % 7;
            DeviceCache crafted(mirror);
            ASSERT_TRUE(crafted.ok());
            for (int call = 0; call < 40; ++call) {
                ft::test::Step step;
                step.hybrid = hybrid;
                step.layer = call % 8;
                step.ids = controlled_ids(mirror.state(), step.layer, 8, 1 + call % 6, 16, rng);
                step.fetch = fetch_rule(0.5, 0, FetchOrder::Recency);
                ASSERT_TRUE(same_call(mirror, crafted, d_ids, d_out, step, false)) << "huge priorities, call " << call;
            }
        }
    }
}

}  // namespace
