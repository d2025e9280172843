// Gather bandwidth next to the bus: both methods move 8 or 32 planned experts of real
// shapes from a 64-expert window of page-locked host banks into device slots (scattered source
// rows, as the profiler measures it), and each benchmark also times a linear pinned H2D
// cudaMemcpyAsync of the same byte count in the same run (bound_GBps; ratio = GBps / bound_GBps).
//   gather/<shape>/<count>/<method>     the two public methods
//   tune/<shape>/<count>/<knobs>        zero-copy kernel variants (detail::GatherTuning), the
//                                       bulk (TMA) ones named bulk_*
// Exits 0 with a message where no CUDA device is usable.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
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
#include "ft/formats.hpp"

namespace {

using ft::cuda::GatherBank;
using ft::cuda::GatherPlan;
using ft::cuda::detail::GatherLoad;
using ft::cuda::detail::GatherStore;
using ft::cuda::detail::GatherTuning;

constexpr int32_t kWindow = 64;    // experts of the host layer
constexpr int32_t kMaxCount = 32;  // planned experts per gather, at most
constexpr int kIters = 10;         // timed gathers per benchmark (Google Benchmark iterations)

void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) ft::fail(FT_ERR_DEVICE, what, ": ", cudaGetErrorString(e));
}

struct Shape {
    const char *name;
    ft::Format format;
    int64_t hidden, intermediate;
};

const Shape kShapes[] = {
    {"bf16_H4096_I1536", ft::Format::bf16, 4096, 1536},
    {"q4_0_H2816_I704", ft::Format::q4_0, 2816, 704},
    {"mxfp4_H2880_I2880", ft::Format::mxfp4, 2880, 2880},
};

struct FreeDeleter {
    void operator()(uint8_t *p) const { std::free(p); }
};

// Everything one shape needs: the host window per bank (page-aligned and registered, as the
// loader maps banks), the slots, a plan, the bound's pinned buffer, stream and events.
class Rig {
public:
    explicit Rig(const Shape &shape) : shape_(shape) {
        for (const ft::BankSpec &spec : ft::bank_schema(shape.format, shape.hidden, shape.intermediate)) {
            const size_t bytes = (spec.row_bytes * kWindow + 4095) / 4096 * 4096;
            host_.emplace_back(static_cast<uint8_t *>(std::aligned_alloc(4096, bytes)));
            if (!host_.back()) throw std::bad_alloc();
            std::memset(host_.back().get(), 0x3c, bytes);  // fault every page in before timing
            registrations_.emplace_back(0, host_.back().get(), bytes);
            void *mapped = nullptr, *slots = nullptr;
            check(cudaHostGetDevicePointer(&mapped, host_.back().get(), 0), "cudaHostGetDevicePointer");
            check(cudaMalloc(&slots, spec.row_bytes * kMaxCount), "cudaMalloc slots");
            GatherBank b;
            b.host_layer = static_cast<const uint8_t *>(mapped);
            b.slots = static_cast<uint8_t *>(slots);
            b.row_bytes = spec.row_bytes;
            banks_.push_back(b);
            expert_bytes_ += spec.row_bytes;
        }
        check(cudaMalloc(&plan_, sizeof(int64_t) + 2 * sizeof(int32_t) * kMaxCount), "cudaMalloc plan");
        check(cudaHostAlloc(&bound_host_, expert_bytes_ * kMaxCount, cudaHostAllocPortable | cudaHostAllocMapped),
              "cudaHostAlloc");
        std::memset(bound_host_, 0x3c, expert_bytes_ * kMaxCount);
        check(cudaMalloc(&bound_dev_, expert_bytes_ * kMaxCount), "cudaMalloc bound");
        check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
        check(cudaEventCreate(&start_), "cudaEventCreate");
        check(cudaEventCreate(&stop_), "cudaEventCreate");
        engine_ = std::make_unique<ft::cuda::CopyEngineGather>(kMaxCount);
    }
    ~Rig() {
        engine_.reset();
        cudaEventDestroy(stop_);
        cudaEventDestroy(start_);
        cudaStreamDestroy(stream_);
        cudaFree(bound_dev_);
        cudaFreeHost(bound_host_);
        cudaFree(plan_);
        for (const GatherBank &b : banks_) cudaFree(b.slots);
        registrations_.clear();
    }
    Rig(const Rig &) = delete;
    Rig &operator=(const Rig &) = delete;

    const Shape &shape() const { return shape_; }
    size_t expert_bytes() const { return expert_bytes_; }

    // Slots 0..count-1 from `count` distinct random experts of the window.
    void set_plan(int32_t count) {
        std::vector<int32_t> experts(kWindow);
        std::iota(experts.begin(), experts.end(), 0);
        std::mt19937 rng(static_cast<uint32_t>(count) * 7919u);
        std::shuffle(experts.begin(), experts.end(), rng);
        std::vector<int32_t> host(2 + 2 * kMaxCount, 0);
        const int64_t n = count;
        std::memcpy(host.data(), &n, sizeof n);
        for (int32_t i = 0; i < count; ++i) {
            host[2 + i] = i;
            host[2 + kMaxCount + i] = experts[i];
        }
        check(cudaMemcpy(plan_, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "plan upload");
    }
    GatherPlan plan() const {
        GatherPlan p;
        p.num_indices = static_cast<const int64_t *>(plan_);
        p.evict_slots = reinterpret_cast<const int32_t *>(p.num_indices + 1);
        p.src_indices = p.evict_slots + kMaxCount;
        p.capacity = kMaxCount;
        return p;
    }

    // Seconds of one call of `fn` (which enqueues on stream_), bracketed by events.
    template <typename Fn>
    double time_once(Fn &&fn) {
        check(cudaEventRecord(start_, stream_), "cudaEventRecord");
        check(fn(), "gather");
        check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
        check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
        float ms = 0.0f;
        check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
        return ms * 1e-3;
    }

    // The bound: linear pinned H2D of `bytes`, 2 warm-up and kIters timed copies.
    double linear_h2d_gbs(size_t bytes) {
        auto copy = [&] { return cudaMemcpyAsync(bound_dev_, bound_host_, bytes, cudaMemcpyHostToDevice, stream_); };
        for (int i = 0; i < 2; ++i) check(copy(), "warm-up copy");
        double s = 0.0;
        for (int i = 0; i < kIters; ++i) s += time_once(copy);
        return static_cast<double>(bytes) * kIters / s / 1e9;
    }

    cudaError_t zero_copy(const GatherTuning *tuning) {
        const GatherPlan p = plan();
        return tuning ? ft::cuda::detail::launch_gather_zero_copy_tuned(banks_.data(), static_cast<int>(banks_.size()),
                                                                        p, *tuning, stream_)
                      : ft::cuda::launch_gather_zero_copy(banks_.data(), static_cast<int>(banks_.size()), p, stream_);
    }
    cudaError_t copy_engine() {
        return engine_->gather(banks_.data(), static_cast<int>(banks_.size()), plan(), stream_);
    }

private:
    Shape shape_;
    std::vector<std::unique_ptr<uint8_t, FreeDeleter>> host_;
    std::vector<ft::cuda::HostRegistration> registrations_;
    std::vector<GatherBank> banks_;
    size_t expert_bytes_ = 0;
    void *plan_ = nullptr, *bound_host_ = nullptr, *bound_dev_ = nullptr;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t start_ = nullptr, stop_ = nullptr;
    std::unique_ptr<ft::cuda::CopyEngineGather> engine_;
};

// One shape's rig at a time (the bf16 window alone is 2.4 GB of pinned memory).
Rig &rig_for(const Shape &shape) {
    static std::unique_ptr<Rig> rig;
    if (!rig || std::strcmp(rig->shape().name, shape.name) != 0) {
        rig.reset();
        rig = std::make_unique<Rig>(shape);
    }
    return *rig;
}

template <typename Fn>
void run(benchmark::State &state, Rig &rig, int32_t count, Fn &&fn) {
    rig.set_plan(count);
    for (int i = 0; i < 2; ++i) rig.time_once(fn);  // warm-up
    const size_t bytes = rig.expert_bytes() * static_cast<size_t>(count);
    double total = 0.0;
    for (auto _ : state) {
        const double s = rig.time_once(fn);
        state.SetIterationTime(s);
        total += s;
    }
    const double gbs = static_cast<double>(bytes) * static_cast<double>(state.iterations()) / total / 1e9;
    const double bound = rig.linear_h2d_gbs(bytes);
    state.counters["GBps"] = gbs;
    state.counters["bound_GBps"] = bound;
    state.counters["ratio"] = gbs / bound;
    state.counters["MB"] = static_cast<double>(bytes) / 1e6;
}

std::string tuning_name(const GatherTuning &t) {
    static const char *loads[] = {"plain", "nc", "cs", "ncL2_256"};
    static const char *stores[] = {"plain", "cs"};
    if (t.bulk)
        return "bulk_b" + std::to_string(t.blocks) + "_t" + std::to_string(t.threads) + "_stages" +
               std::to_string(t.unroll) + "_c" + std::to_string(t.chunk_bytes >> 10) + "k";
    return "b" + std::to_string(t.blocks) + "_t" + std::to_string(t.threads) + "_u" + std::to_string(t.unroll) + "_c" +
           std::to_string(t.chunk_bytes >> 10) + "k_ld" + loads[static_cast<int>(t.load)] + "_st" +
           stores[static_cast<int>(t.store)];
}

// The zero-copy variants: a grid over CTAs x threads x unroll at the default chunk and cache
// hints, then chunk size and hints one at a time around the default.
std::vector<GatherTuning> tunings() {
    std::vector<GatherTuning> out;
    for (const int blocks : {16, 32, 64, 132, 264, 528})
        for (const int threads : {256, 512, 1024})
            for (const int unroll : {2, 4, 8}) {
                if (unroll == 8 && threads > 512) continue;
                GatherTuning t;
                t.blocks = blocks;
                t.threads = threads;
                t.unroll = unroll;
                out.push_back(t);
            }
    for (const size_t chunk : {size_t(16) << 10, size_t(32) << 10, size_t(128) << 10, size_t(256) << 10}) {
        GatherTuning t;
        t.chunk_bytes = chunk;
        out.push_back(t);
    }
    for (const GatherLoad load : {GatherLoad::plain, GatherLoad::nc, GatherLoad::streaming, GatherLoad::nc_l2_256})
        for (const GatherStore store : {GatherStore::plain, GatherStore::streaming}) {
            GatherTuning t;
            t.load = load;
            t.store = store;
            if (load == GatherLoad::streaming && store == GatherStore::plain) continue;  // the default, above
            out.push_back(t);
        }
    // The bulk (TMA) variant on compute capability 9.0+: CTAs x stages x chunk, one warp each.
    int device = 0, major = 0;
    if (cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9) {
        for (const int blocks : {16, 32, 64, 132})
            for (const int stages : {2, 4, 8})
                for (const size_t chunk : {size_t(16) << 10, size_t(32) << 10}) {
                    if (stages * chunk > (size_t(192) << 10)) continue;
                    GatherTuning t;
                    t.bulk = true;
                    t.blocks = blocks;
                    t.threads = 32;
                    t.unroll = stages;
                    t.chunk_bytes = chunk;
                    out.push_back(t);
                }
    }
    return out;
}

}  // namespace

int main(int argc, char **argv) {
    if (ft::cuda::device_count() == 0) {
        std::printf("bench_gather: no usable CUDA device, nothing to measure\n");
        return 0;
    }
    std::printf("bench_gather: %s; zero-copy default %s\n", ft::cuda::device_name(0).c_str(),
                tuning_name(ft::cuda::detail::default_gather_tuning()).c_str());
    for (const Shape &shape : kShapes) {
        for (const int32_t count : {8, 32}) {
            const std::string base = std::string("gather/") + shape.name + "/" + std::to_string(count);
            benchmark::RegisterBenchmark((base + "/zero_copy").c_str(),
                                         [&shape, count](benchmark::State &st) {
                                             Rig &rig = rig_for(shape);
                                             run(st, rig, count, [&rig] { return rig.zero_copy(nullptr); });
                                         })
                ->UseManualTime()
                ->Iterations(kIters)
                ->Unit(benchmark::kMillisecond);
            benchmark::RegisterBenchmark((base + "/copy_engine").c_str(),
                                         [&shape, count](benchmark::State &st) {
                                             Rig &rig = rig_for(shape);
                                             run(st, rig, count, [&rig] { return rig.copy_engine(); });
                                         })
                ->UseManualTime()
                ->Iterations(kIters)
                ->Unit(benchmark::kMillisecond);
        }
    }
    for (const Shape &shape : kShapes) {
        for (const int32_t count : {8, 32}) {
            for (const GatherTuning &t : tunings()) {
                const std::string name =
                    std::string("tune/") + shape.name + "/" + std::to_string(count) + "/" + tuning_name(t);
                benchmark::RegisterBenchmark(name.c_str(),
                                             [&shape, count, t](benchmark::State &st) {
                                                 Rig &rig = rig_for(shape);
                                                 run(st, rig, count, [&rig, &t] { return rig.zero_copy(&t); });
                                             })
                    ->UseManualTime()
                    ->Iterations(kIters)
                    ->Unit(benchmark::kMillisecond);
            }
        }
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
