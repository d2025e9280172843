// Gather of planned experts, both methods: random host banks of assorted row sizes
// (including rows that only allow 8-, 4-, 2- or 1-byte accesses), slots prefilled with a sentinel,
// random plans of every count; planned slots must hold their source rows byte for byte and every
// other slot must keep the sentinel. Also count 0, counts above the capacity, skipped entries,
// CUDA-graph replays with new plans in device memory, every tuning the benchmark sweeps, slots
// wider than the rows, and argument errors. Skips where no CUDA device is usable.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ft/common.hpp"
#include "ft/cuda_device.hpp"
#include "ft/cuda_gather.hpp"

namespace {

using ft::cuda::CopyEngineGather;
using ft::cuda::GatherBank;
using ft::cuda::GatherMethod;
using ft::cuda::GatherPlan;
using ft::cuda::detail::GatherLoad;
using ft::cuda::detail::GatherStore;
using ft::cuda::detail::GatherTuning;

constexpr uint8_t kSentinel = 0xA5;

#define SKIP_WITHOUT_GPU() \
    if (ft::cuda::device_count() == 0) GTEST_SKIP() << "no usable CUDA device"

#define CUDA_OK(expr)                                                                                         \
    do {                                                                                                      \
        const cudaError_t e_ = (expr);                                                                        \
        ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
    } while (0)

struct FreeDeleter {
    void operator()(uint8_t *p) const { std::free(p); }
};

struct DeviceFree {
    void operator()(void *p) const { cudaFree(p); }
};

// One bank of one layer: `experts` random rows in page-locked host memory (starting `offset`
// bytes into the registered block, to test unaligned bases) and `slots` device slots of
// slot_bytes each (0: row_bytes; wider slots hold the row at their start).
class Bank {
public:
    Bank(size_t row_bytes, int32_t experts, int32_t slots, size_t offset, std::mt19937 &rng, size_t slot_bytes = 0)
        : row_(row_bytes), slot_(slot_bytes ? slot_bytes : row_bytes), experts_(experts), slots_(slots), offset_(offset) {
        const size_t bytes = offset + row_bytes * static_cast<size_t>(experts);
        const size_t rounded = (bytes + 4095) / 4096 * 4096;
        host_.reset(static_cast<uint8_t *>(std::aligned_alloc(4096, rounded)));
        for (size_t i = 0; i < rounded; ++i) host_.get()[i] = static_cast<uint8_t>(rng());
        registration_ = std::make_unique<ft::cuda::HostRegistration>(0, host_.get(), rounded);
        void *mapped = nullptr;
        if (cudaHostGetDevicePointer(&mapped, host_.get(), 0) != cudaSuccess) return;
        mapped_ = static_cast<uint8_t *>(mapped) + offset;
        void *dev = nullptr;
        if (cudaMalloc(&dev, slot_ * static_cast<size_t>(slots)) != cudaSuccess) return;
        slots_mem_.reset(dev);
    }

    bool ok() const { return mapped_ && slots_mem_; }
    GatherBank bank() const {
        GatherBank b;
        b.host_layer = mapped_;
        b.slots = static_cast<uint8_t *>(slots_mem_.get());
        b.row_bytes = row_;
        b.slot_bytes = slot_ == row_ ? 0 : slot_;
        return b;
    }
    const uint8_t *host_row(int32_t e) const { return host_.get() + offset_ + row_ * static_cast<size_t>(e); }
    cudaError_t fill_sentinel() const {
        return cudaMemset(slots_mem_.get(), kSentinel, slot_ * static_cast<size_t>(slots_));
    }
    std::vector<uint8_t> read_slots() const {
        std::vector<uint8_t> out(slot_ * static_cast<size_t>(slots_));
        if (cudaMemcpy(out.data(), slots_mem_.get(), out.size(), cudaMemcpyDeviceToHost) != cudaSuccess) out.clear();
        return out;
    }
    size_t row() const { return row_; }
    size_t slot() const { return slot_; }

private:
    size_t row_, slot_;
    int32_t experts_, slots_;
    size_t offset_;
    std::unique_ptr<uint8_t, FreeDeleter> host_;
    std::unique_ptr<ft::cuda::HostRegistration> registration_;
    uint8_t *mapped_ = nullptr;
    std::unique_ptr<void, DeviceFree> slots_mem_;
};

// A plan on the host: the first `count` entries are the real plan; the arrays may hold more.
struct HostPlan {
    int64_t count = 0;
    std::vector<int32_t> slots, sources;
};

// The banks of one layer, the device plan (count, then `stored` slots, then `stored` sources).
class Rig {
public:
    Rig(const std::vector<size_t> &rows, int32_t experts, int32_t slots, int32_t stored, uint32_t seed,
        const std::vector<size_t> &offsets = {}, const std::vector<size_t> &slot_bytes = {})
        : experts_(experts), slots_(slots), stored_(stored), rng_(seed) {
        for (size_t b = 0; b < rows.size(); ++b)
            banks_.push_back(std::make_unique<Bank>(rows[b], experts, slots, b < offsets.size() ? offsets[b] : 0, rng_,
                                                    b < slot_bytes.size() ? slot_bytes[b] : 0));
        void *plan = nullptr;
        if (cudaMalloc(&plan, sizeof(int64_t) + 2 * sizeof(int32_t) * static_cast<size_t>(stored)) == cudaSuccess)
            plan_mem_.reset(plan);
    }

    bool ok() const {
        if (!plan_mem_) return false;
        for (const auto &b : banks_)
            if (!b->ok()) return false;
        return true;
    }
    int num_banks() const { return static_cast<int>(banks_.size()); }
    std::vector<GatherBank> banks() const {
        std::vector<GatherBank> out;
        for (const auto &b : banks_) out.push_back(b->bank());
        return out;
    }
    GatherPlan plan(int32_t capacity) const {
        GatherPlan p;
        p.num_indices = static_cast<const int64_t *>(plan_mem_.get());
        p.evict_slots = reinterpret_cast<const int32_t *>(p.num_indices + 1);
        p.src_indices = p.evict_slots + stored_;
        p.capacity = capacity;
        return p;
    }

    // `count` distinct random slots from distinct random experts; the stored entries past the
    // count name slots outside the plan, so a gather that reads past the count is caught.
    HostPlan random_plan(int64_t count) {
        std::vector<int32_t> slot_order(static_cast<size_t>(slots_)), expert_order(static_cast<size_t>(experts_));
        std::iota(slot_order.begin(), slot_order.end(), 0);
        std::iota(expert_order.begin(), expert_order.end(), 0);
        std::shuffle(slot_order.begin(), slot_order.end(), rng_);
        std::shuffle(expert_order.begin(), expert_order.end(), rng_);
        HostPlan p;
        p.count = count;
        for (int32_t i = 0; i < stored_; ++i) {
            p.slots.push_back(slot_order[static_cast<size_t>(i) % slot_order.size()]);
            p.sources.push_back(expert_order[static_cast<size_t>(i) % expert_order.size()]);
        }
        return p;
    }

    cudaError_t upload(const HostPlan &p, cudaStream_t stream = nullptr) {
        staged_.assign(2 + 2 * static_cast<size_t>(stored_), 0);
        std::memcpy(staged_.data(), &p.count, sizeof p.count);
        std::copy(p.slots.begin(), p.slots.end(), staged_.begin() + 2);
        std::copy(p.sources.begin(), p.sources.end(), staged_.begin() + 2 + stored_);
        const cudaError_t e = cudaMemcpyAsync(plan_mem_.get(), staged_.data(), staged_.size() * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream);
        return e == cudaSuccess ? cudaStreamSynchronize(stream) : e;
    }

    cudaError_t fill_sentinel() const {
        for (const auto &b : banks_) {
            const cudaError_t e = b->fill_sentinel();
            if (e != cudaSuccess) return e;
        }
        return cudaDeviceSynchronize();
    }

    // Slot s must hold source row src if the first min(count, capacity) entries plan it, else the
    // sentinel; bytes of a slot past the row always keep the sentinel. Entries with a negative
    // slot or source plan nothing.
    std::string verify(const HostPlan &p, int32_t capacity) const {
        const int64_t n = std::min<int64_t>(std::max<int64_t>(p.count, 0), capacity);
        std::vector<int32_t> source_of(static_cast<size_t>(slots_), -1);
        for (int64_t i = 0; i < n; ++i)
            if (p.slots[static_cast<size_t>(i)] >= 0 && p.sources[static_cast<size_t>(i)] >= 0)
                source_of[static_cast<size_t>(p.slots[static_cast<size_t>(i)])] = p.sources[static_cast<size_t>(i)];
        for (size_t b = 0; b < banks_.size(); ++b) {
            const Bank &bank = *banks_[b];
            const std::vector<uint8_t> got = bank.read_slots();
            if (got.empty()) return "bank " + std::to_string(b) + ": slot readback failed";
            const size_t row = bank.row(), stride = bank.slot();
            const std::vector<uint8_t> sentinel(stride, kSentinel);
            for (int32_t s = 0; s < slots_; ++s) {
                const uint8_t *slot = got.data() + stride * static_cast<size_t>(s);
                const int32_t src = source_of[static_cast<size_t>(s)];
                const uint8_t *want = src >= 0 ? bank.host_row(src) : sentinel.data();
                if (std::memcmp(slot + row, sentinel.data(), stride - row) != 0)
                    return "bank " + std::to_string(b) + " slot " + std::to_string(s) + ": bytes past the row were written";
                if (std::memcmp(slot, want, row) != 0)
                    return "bank " + std::to_string(b) + " (row " + std::to_string(row) + ") slot " +
                           std::to_string(s) +
                           (src >= 0 ? " should hold expert " + std::to_string(src) : " should be untouched");
            }
        }
        return "";
    }

private:
    int32_t experts_, slots_, stored_;
    std::mt19937 rng_;
    std::vector<std::unique_ptr<Bank>> banks_;
    std::unique_ptr<void, DeviceFree> plan_mem_;
    std::vector<int32_t> staged_;
};

cudaError_t run_gather(GatherMethod method, Rig &rig, CopyEngineGather &engine, int32_t capacity, cudaStream_t stream) {
    const std::vector<GatherBank> banks = rig.banks();
    const cudaError_t e =
        method == GatherMethod::zero_copy
            ? ft::cuda::launch_gather_zero_copy(banks.data(), rig.num_banks(), rig.plan(capacity), stream)
            : engine.gather(banks.data(), rig.num_banks(), rig.plan(capacity), stream);
    return e == cudaSuccess ? cudaStreamSynchronize(stream) : e;
}

const char *name(GatherMethod m) {
    return m == GatherMethod::zero_copy ? "zero_copy" : "copy_engine";
}

// Bank sets: 1, 2, 4 and 6 banks; rows above and below the 64 KiB chunk, rows that are not a
// multiple of 16 (100 -> 4-byte, 24 -> 8-byte, 1001 and 7 -> 1-byte, 2 -> 2-byte accesses).
const std::vector<std::vector<size_t>> kBankSets = {
    {4096},
    {150000, 1040},
    {100, 24, 65536 + 48, 7},
    {8192, 256, 1001, 131072, 48, 2},
};

struct Case {
    size_t set;
    int32_t experts;
};

class GatherCounts : public ::testing::TestWithParam<Case> {};

TEST_P(GatherCounts, PlannedSlotsExactOthersUntouched) {
    SKIP_WITHOUT_GPU();
    const Case c = GetParam();
    const int32_t slots = c.experts + 3;  // more slots than one layer, so some always stay untouched
    Rig rig(kBankSets[c.set], c.experts, slots, c.experts, 1234u + static_cast<uint32_t>(c.set * 97 + c.experts));
    ASSERT_TRUE(rig.ok());
    CopyEngineGather engine(c.experts);
    cudaStream_t stream = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // Every count for E = 16; for E = 64 the small ones, a stride, and the full layer.
    std::vector<int64_t> counts;
    for (int64_t n = 0; n <= c.experts; ++n)
        if (c.experts <= 16 || n < 4 || n % 7 == 0 || n + 3 > c.experts) counts.push_back(n);
    for (const int64_t count : counts) {
        for (const GatherMethod m : {GatherMethod::zero_copy, GatherMethod::copy_engine}) {
            const HostPlan plan = rig.random_plan(count);
            CUDA_OK(rig.upload(plan));
            CUDA_OK(rig.fill_sentinel());
            CUDA_OK(run_gather(m, rig, engine, c.experts, stream));
            const std::string err = rig.verify(plan, c.experts);
            EXPECT_EQ(err, "") << name(m) << " count " << count;
            if (!err.empty()) break;
        }
    }
    CUDA_OK(cudaStreamDestroy(stream));
}

INSTANTIATE_TEST_SUITE_P(Banks, GatherCounts,
                         ::testing::Values(Case{0, 16}, Case{1, 16}, Case{2, 16}, Case{3, 16}, Case{0, 64}, Case{1, 64},
                                           Case{2, 64}, Case{3, 64}),
                         [](const ::testing::TestParamInfo<Case> &info) {
                             return "banks" + std::to_string(kBankSets[info.param.set].size()) + "_E" +
                                    std::to_string(info.param.experts);
                         });

// Counts above the capacity copy `capacity` entries (the stored arrays hold more, which must not
// be read); negative slots or sources are skipped; negative counts copy nothing.
TEST(Gather, CountClampedAndNegativeEntriesSkipped) {
    SKIP_WITHOUT_GPU();
    const int32_t experts = 16, capacity = 10;
    Rig rig({4096, 100}, experts, experts, experts, 77u);
    ASSERT_TRUE(rig.ok());
    CopyEngineGather engine(experts);
    for (const GatherMethod m : {GatherMethod::zero_copy, GatherMethod::copy_engine}) {
        HostPlan plan = rig.random_plan(capacity + 5);
        CUDA_OK(rig.upload(plan));
        CUDA_OK(rig.fill_sentinel());
        CUDA_OK(run_gather(m, rig, engine, capacity, nullptr));
        EXPECT_EQ(rig.verify(plan, capacity), "") << name(m) << " count above capacity";

        plan = rig.random_plan(8);
        plan.slots[2] = -1;
        plan.sources[5] = -3;
        CUDA_OK(rig.upload(plan));
        CUDA_OK(rig.fill_sentinel());
        CUDA_OK(run_gather(m, rig, engine, capacity, nullptr));
        EXPECT_EQ(rig.verify(plan, capacity), "") << name(m) << " negative entries";

        plan = rig.random_plan(-4);
        CUDA_OK(rig.upload(plan));
        CUDA_OK(rig.fill_sentinel());
        CUDA_OK(run_gather(m, rig, engine, capacity, nullptr));
        EXPECT_EQ(rig.verify(plan, capacity), "") << name(m) << " negative count";
    }
}

// Runs of consecutive slots and sources (what admission plans after a reset) are merged into one
// copy by the copy engine; both methods must still place every row.
TEST(Gather, ContiguousRuns) {
    SKIP_WITHOUT_GPU();
    const int32_t experts = 16;
    Rig rig({150000, 24, 7}, experts, experts + 4, experts, 5u);
    ASSERT_TRUE(rig.ok());
    CopyEngineGather engine(experts);
    HostPlan plan;
    plan.count = 12;
    plan.slots = {0, 1, 2, 3, 9, 10, 5, 6, 7, 15, 16, 17, 0, 0, 0, 0};
    plan.sources = {4, 5, 6, 7, 0, 1, 13, 14, 2, 8, 9, 10, 0, 0, 0, 0};
    for (const GatherMethod m : {GatherMethod::zero_copy, GatherMethod::copy_engine}) {
        CUDA_OK(rig.upload(plan));
        CUDA_OK(rig.fill_sentinel());
        CUDA_OK(run_gather(m, rig, engine, experts, nullptr));
        EXPECT_EQ(rig.verify(plan, experts), "") << name(m);
    }
}

// Slots wider than the rows (a model whose layers' rows differ: slots of the largest): each row
// lands at the start of its slot, the rest of the slot untouched, by both methods, in random
// plans and in runs the copy engine merges.
TEST(Gather, SlotsWiderThanRows) {
    SKIP_WITHOUT_GPU();
    const int32_t experts = 16;
    Rig rig({150000, 100, 4096, 7}, experts, experts + 4, experts, 21u, {}, {200000, 112, 4096 + 16, 9});
    ASSERT_TRUE(rig.ok());
    CopyEngineGather engine(experts);
    HostPlan runs;
    runs.count = 12;
    runs.slots = {0, 1, 2, 3, 9, 10, 5, 6, 7, 15, 16, 17, 0, 0, 0, 0};
    runs.sources = {4, 5, 6, 7, 0, 1, 13, 14, 2, 8, 9, 10, 0, 0, 0, 0};
    for (const GatherMethod m : {GatherMethod::zero_copy, GatherMethod::copy_engine}) {
        for (const int64_t count : {int64_t(1), int64_t(7), int64_t(experts)}) {
            const HostPlan plan = rig.random_plan(count);
            CUDA_OK(rig.upload(plan));
            CUDA_OK(rig.fill_sentinel());
            CUDA_OK(run_gather(m, rig, engine, experts, nullptr));
            EXPECT_EQ(rig.verify(plan, experts), "") << name(m) << " count " << count;
        }
        CUDA_OK(rig.upload(runs));
        CUDA_OK(rig.fill_sentinel());
        CUDA_OK(run_gather(m, rig, engine, experts, nullptr));
        EXPECT_EQ(rig.verify(runs, experts), "") << name(m) << " runs";
    }
}

// Host banks whose device-visible base is not 16-byte aligned fall back to narrower accesses.
TEST(Gather, UnalignedHostBase) {
    SKIP_WITHOUT_GPU();
    const int32_t experts = 16;
    Rig rig({4096, 4096, 4096}, experts, experts, experts, 9u, {4, 8, 1});
    ASSERT_TRUE(rig.ok());
    const std::vector<GatherBank> banks = rig.banks();
    EXPECT_EQ(ft::cuda::detail::gather_vector_bytes(banks[0]), 4);
    EXPECT_EQ(ft::cuda::detail::gather_vector_bytes(banks[1]), 8);
    EXPECT_EQ(ft::cuda::detail::gather_vector_bytes(banks[2]), 1);
    CopyEngineGather engine(experts);
    for (const GatherMethod m : {GatherMethod::zero_copy, GatherMethod::copy_engine}) {
        const HostPlan plan = rig.random_plan(11);
        CUDA_OK(rig.upload(plan));
        CUDA_OK(rig.fill_sentinel());
        CUDA_OK(run_gather(m, rig, engine, experts, nullptr));
        EXPECT_EQ(rig.verify(plan, experts), "") << name(m);
    }
}

// Every tuning the benchmark sweeps copies the same bytes.
TEST(Gather, EveryTuningIsExact) {
    SKIP_WITHOUT_GPU();
    const int32_t experts = 16;
    Rig rig({150000, 100, 24, 1001}, experts, experts, experts, 31u);
    ASSERT_TRUE(rig.ok());
    const std::vector<GatherBank> banks = rig.banks();
    std::vector<GatherTuning> tunings;
    for (const int unroll : {1, 2, 4, 8})
        for (const int threads : {32, 256, 512, 1024})
            for (const GatherLoad load :
                 {GatherLoad::plain, GatherLoad::nc, GatherLoad::streaming, GatherLoad::nc_l2_256}) {
                if (unroll == 8 && threads > 512) continue;
                GatherTuning t;
                t.unroll = unroll;
                t.threads = threads;
                t.load = load;
                t.store = threads == 256 ? GatherStore::streaming : GatherStore::plain;
                t.blocks = threads == 32 ? 3 : 37;
                t.chunk_bytes = threads == 1024 ? 16 * 1000 : 256 << 10;
                if (threads == 32) t.chunk_bytes = load == GatherLoad::plain ? 16 : 4096;
                tunings.push_back(t);
            }
    int device = 0, major = 0;
    CUDA_OK(cudaGetDevice(&device));
    CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    if (major >= 9) {  // the bulk (TMA) variant: stages x chunk, 1 to 8 stages, odd chunk sizes
        for (const int stages : {1, 2, 4, 8})
            for (const size_t chunk : {size_t(48), size_t(4096), size_t(24) << 10}) {
                GatherTuning t;
                t.bulk = true;
                t.unroll = stages;
                t.chunk_bytes = chunk;
                t.threads = chunk == 4096 ? 128 : 32;
                t.blocks = chunk == 48 ? 64 : 7;
                tunings.push_back(t);
            }
    }
    for (const GatherTuning &t : tunings) {
        const HostPlan plan = rig.random_plan(experts - 3);
        CUDA_OK(rig.upload(plan));
        CUDA_OK(rig.fill_sentinel());
        CUDA_OK(ft::cuda::detail::launch_gather_zero_copy_tuned(banks.data(), rig.num_banks(), rig.plan(experts), t,
                                                                nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_EQ(rig.verify(plan, experts), "")
            << "unroll " << t.unroll << " threads " << t.threads << " blocks " << t.blocks << " chunk " << t.chunk_bytes
            << " load " << static_cast<int>(t.load) << " bulk " << t.bulk;
    }
}

// The bulk variant also follows the plan under graph replay (it sets its shared-memory size at
// launch, a host call that capture allows).
TEST(Gather, BulkGraphReplay) {
    SKIP_WITHOUT_GPU();
    int device = 0, major = 0;
    CUDA_OK(cudaGetDevice(&device));
    CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    if (major < 9) GTEST_SKIP() << "the bulk variant needs compute capability 9.0";
    const int32_t experts = 16;
    Rig rig(kBankSets[2], experts, experts, experts, 99u);
    ASSERT_TRUE(rig.ok());
    GatherTuning t;
    t.bulk = true;
    t.unroll = 4;
    t.threads = 64;
    t.chunk_bytes = 32 << 10;
    cudaStream_t stream = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const std::vector<GatherBank> banks = rig.banks();
    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const cudaError_t launched =
        ft::cuda::detail::launch_gather_zero_copy_tuned(banks.data(), rig.num_banks(), rig.plan(experts), t, stream);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(launched);
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (const int64_t count : {16, 0, 3}) {
        const HostPlan plan = rig.random_plan(count);
        CUDA_OK(rig.upload(plan, stream));
        CUDA_OK(rig.fill_sentinel());
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        EXPECT_EQ(rig.verify(plan, experts), "") << "replay with count " << count;
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaStreamDestroy(stream));
}

// One captured launch, replayed after the plan in device memory changed, copies the new plan.
TEST(Gather, GraphReplayFollowsThePlan) {
    SKIP_WITHOUT_GPU();
    const int32_t experts = 64;
    Rig rig(kBankSets[3], experts, experts, experts, 4242u);
    ASSERT_TRUE(rig.ok());
    cudaStream_t stream = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const std::vector<GatherBank> banks = rig.banks();
    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const cudaError_t launched =
        ft::cuda::launch_gather_zero_copy(banks.data(), rig.num_banks(), rig.plan(experts), stream);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(launched);
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (const int64_t count : {5, 0, 64, 1, 33}) {
        const HostPlan plan = rig.random_plan(count);
        CUDA_OK(rig.upload(plan, stream));
        CUDA_OK(rig.fill_sentinel());
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        EXPECT_EQ(rig.verify(plan, experts), "") << "replay with count " << count;
    }
    // The copy engine reads the plan on the host and so refuses to be captured.
    CopyEngineGather engine(experts);
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const cudaError_t refused = engine.gather(banks.data(), rig.num_banks(), rig.plan(experts), stream);
    cudaGraph_t empty = nullptr;
    CUDA_OK(cudaStreamEndCapture(stream, &empty));
    EXPECT_EQ(refused, cudaErrorStreamCaptureUnsupported);
    if (empty) cudaGraphDestroy(empty);
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaStreamDestroy(stream));
}

TEST(Gather, InvalidArguments) {
    SKIP_WITHOUT_GPU();
    const int32_t experts = 8;
    Rig rig({4096, 100}, experts, experts, experts, 3u);
    ASSERT_TRUE(rig.ok());
    const std::vector<GatherBank> good = rig.banks();
    const GatherPlan plan = rig.plan(experts);
    CopyEngineGather engine(experts);
    auto both = [&](const GatherBank *banks, int n, const GatherPlan &p) {
        const cudaError_t zc = ft::cuda::launch_gather_zero_copy(banks, n, p, nullptr);
        const cudaError_t ce = engine.gather(banks, n, p, nullptr);
        return zc == cudaErrorInvalidValue && ce == cudaErrorInvalidValue;
    };
    EXPECT_TRUE(both(good.data(), 0, plan));
    std::vector<GatherBank> nine(9, good[0]);
    EXPECT_TRUE(both(nine.data(), 9, plan));
    EXPECT_TRUE(both(nullptr, 2, plan));
    std::vector<GatherBank> bad = good;
    bad[1].host_layer = nullptr;
    EXPECT_TRUE(both(bad.data(), 2, plan));
    bad = good;
    bad[0].slots = nullptr;
    EXPECT_TRUE(both(bad.data(), 2, plan));
    bad = good;
    bad[1].row_bytes = 0;
    EXPECT_TRUE(both(bad.data(), 2, plan));
    GatherPlan p = plan;
    p.capacity = -1;
    EXPECT_TRUE(both(good.data(), 2, p));
    p = plan;
    p.evict_slots = nullptr;
    EXPECT_TRUE(both(good.data(), 2, p));
    p = plan;
    p.src_indices = nullptr;
    EXPECT_TRUE(both(good.data(), 2, p));
    p = plan;
    p.num_indices = nullptr;
    EXPECT_TRUE(both(good.data(), 2, p));
    // A plan larger than the engine's staging.
    p = plan;
    p.capacity = experts + 1;
    EXPECT_EQ(engine.gather(good.data(), 2, p, nullptr), cudaErrorInvalidValue);
    // Tunings out of range.
    GatherTuning t;
    t.unroll = 3;
    EXPECT_EQ(ft::cuda::detail::launch_gather_zero_copy_tuned(good.data(), 2, plan, t, nullptr), cudaErrorInvalidValue);
    t = GatherTuning{};
    t.unroll = 8;
    t.threads = 1024;
    EXPECT_EQ(ft::cuda::detail::launch_gather_zero_copy_tuned(good.data(), 2, plan, t, nullptr), cudaErrorInvalidValue);
    t = GatherTuning{};
    t.chunk_bytes = 24;
    EXPECT_EQ(ft::cuda::detail::launch_gather_zero_copy_tuned(good.data(), 2, plan, t, nullptr), cudaErrorInvalidValue);
    t = GatherTuning{};
    t.threads = 100;
    EXPECT_EQ(ft::cuda::detail::launch_gather_zero_copy_tuned(good.data(), 2, plan, t, nullptr), cudaErrorInvalidValue);
    // Capacity 0 is a valid empty plan.
    p = plan;
    p.capacity = 0;
    EXPECT_EQ(ft::cuda::launch_gather_zero_copy(good.data(), 2, p, nullptr), cudaSuccess);
    EXPECT_EQ(engine.gather(good.data(), 2, p, nullptr), cudaSuccess);
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_THROW(CopyEngineGather(-1), ft::Error);
    EXPECT_THROW(ft::cuda::choose_gather_method(good.data(), 2, experts, experts + 1, nullptr), ft::Error);
    EXPECT_THROW(ft::cuda::choose_gather_method(good.data(), 2, experts, 0, nullptr), ft::Error);
}

// Argument checks and the access width need no device: they run everywhere.
TEST(GatherHost, ArgumentChecksAndVectorWidth) {
    alignas(16) static uint8_t host[64], slots[64];
    alignas(8) static int32_t entries[4];
    alignas(8) static int64_t count;
    GatherBank bank;
    bank.host_layer = host;
    bank.slots = slots;
    bank.row_bytes = 32;
    EXPECT_EQ(ft::cuda::detail::gather_vector_bytes(bank), 16);
    bank.row_bytes = 40;
    EXPECT_EQ(ft::cuda::detail::gather_vector_bytes(bank), 8);
    bank.row_bytes = 36;
    EXPECT_EQ(ft::cuda::detail::gather_vector_bytes(bank), 4);
    bank.row_bytes = 34;
    EXPECT_EQ(ft::cuda::detail::gather_vector_bytes(bank), 2);
    bank.row_bytes = 33;
    EXPECT_EQ(ft::cuda::detail::gather_vector_bytes(bank), 1);
    bank.row_bytes = 32;
    bank.slot_bytes = 40;  // the slot stride limits the width too
    EXPECT_EQ(ft::cuda::detail::gather_vector_bytes(bank), 8);
    bank.slot_bytes = 0;
    bank.host_layer = host + 4;
    EXPECT_EQ(ft::cuda::detail::gather_vector_bytes(bank), 4);
    bank.host_layer = host;
    bank.slots = slots + 2;
    EXPECT_EQ(ft::cuda::detail::gather_vector_bytes(bank), 2);
    bank.slots = slots;

    GatherPlan plan;
    plan.evict_slots = entries;
    plan.src_indices = entries + 2;
    plan.num_indices = &count;
    plan.capacity = 2;
    EXPECT_EQ(ft::cuda::detail::gather_argument_error(&bank, 1, plan), nullptr);
    EXPECT_NE(ft::cuda::detail::gather_argument_error(&bank, 0, plan), nullptr);
    EXPECT_NE(ft::cuda::detail::gather_argument_error(nullptr, 1, plan), nullptr);
    bank.slot_bytes = 16;  // slots narrower than the rows
    EXPECT_NE(ft::cuda::detail::gather_argument_error(&bank, 1, plan), nullptr);
    EXPECT_EQ(ft::cuda::launch_gather_zero_copy(&bank, 1, plan, nullptr), cudaErrorInvalidValue);
    bank.slot_bytes = 32;
    EXPECT_EQ(ft::cuda::detail::gather_argument_error(&bank, 1, plan), nullptr);
    bank.slot_bytes = 0;
    // The launcher rejects before touching CUDA, so this holds without a device too.
    EXPECT_EQ(ft::cuda::launch_gather_zero_copy(&bank, 9, plan, nullptr), cudaErrorInvalidValue);
    plan.capacity = -2;
    EXPECT_NE(ft::cuda::detail::gather_argument_error(&bank, 1, plan), nullptr);
    EXPECT_EQ(ft::cuda::launch_gather_zero_copy(&bank, 1, plan, nullptr), cudaErrorInvalidValue);
}

// The measurement runs both methods and leaves their result in the slots; small banks, so this is
// a smoke test of the plumbing, not a bandwidth figure.
TEST(Gather, ChooseMethodMeasuresBoth) {
    SKIP_WITHOUT_GPU();
    const int32_t experts = 16;
    Rig rig({65536, 4096}, experts, experts, experts, 11u);
    ASSERT_TRUE(rig.ok());
    const std::vector<GatherBank> banks = rig.banks();
    const ft::cuda::GatherChoice c = ft::cuda::choose_gather_method(banks.data(), rig.num_banks(), experts, 8, nullptr);
    EXPECT_GT(c.zero_copy_gbs, 0.0);
    EXPECT_GT(c.copy_engine_gbs, 0.0);
    EXPECT_EQ(c.method, c.copy_engine_gbs > c.zero_copy_gbs ? GatherMethod::copy_engine : GatherMethod::zero_copy);
}

}  // namespace
