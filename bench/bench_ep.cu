// EP kernels on one GPU (issue 7's benchmark): pack + quantise and unpack + reduce in GB/s against
// the device copy bandwidth measured in the same run, at decode (1..64 tokens) and prefill
// (4K..32K tokens) sizes for H=7168 top-8 of 256 and H=2048 top-8 of 128, routed by a skewed trace
// (Zipf popularity, co-activated pairs) over 8 ranks; and the bytes on the wire per token (dedup +
// FP8 vs bf16 all-gather vs plain bf16 all-to-all) for 2, 4 and 8 ranks from the layout.
//
// Counters: GBps (bytes the kernel must move / time), bound_GBps (cudaMemcpy device-to-device,
// read + write bytes / time, same run), ratio. The receive-side kernels see every record of one
// source as if one rank received them all (the work per record is the same).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "ep_traces.hpp"
#include "ft/cuda_device.hpp"
#include "ft/ep.hpp"
#include "ft/ep_cuda.hpp"

namespace {

using namespace ft::ep;
namespace epc = ft::ep::cuda;

constexpr int32_t kRanks = 8, kTopK = 8;

void ok(cudaError_t e) {
    if (e != cudaSuccess) throw std::runtime_error(cudaGetErrorString(e));
}

// Device copy bandwidth (read + write bytes per second), measured once per run.
double copy_bound() {
    static double gbps = [] {
        const size_t bytes = size_t(1) << 30;
        void *a = nullptr, *b = nullptr;
        ok(cudaMalloc(&a, bytes));
        ok(cudaMalloc(&b, bytes));
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        for (int i = 0; i < 3; ++i) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e0);
        const int iters = 20;
        for (int i = 0; i < iters; ++i) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cudaFree(a);
        cudaFree(b);
        return 2.0 * bytes * iters / (ms * 1e-3) / 1e9;
    }();
    return gbps;
}

template <typename T>
T *dev_alloc(size_t n) {
    void *p = nullptr;
    ok(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    return static_cast<T *>(p);
}

// One source rank's tokens routed over 8 ranks, its layout and packed records, plus a receiver
// that got all of them.
struct Scene {
    int64_t H = 0, T = 0;
    int32_t E = 0;
    WireDtype dtype = WireDtype::Fp8Fp32;
    Placement p;
    std::unique_ptr<epc::PlacementBuffer> dp;
    RecordLayout rec;
    int64_t rows = 0;         // records sent
    int64_t expert_rows = 0;  // routes those records carry
    int32_t *ids = nullptr;
    float *weights = nullptr;
    uint16_t *x = nullptr, *xrows = nullptr, *yrows = nullptr, *partial = nullptr, *out = nullptr;
    uint8_t *lmem = nullptr, *rmem = nullptr, *wire = nullptr;
    int64_t *matrix = nullptr;
    epc::LayoutBuffers L;
    epc::ReceiveBuffers B;

    Scene(int64_t hidden, int32_t experts, int64_t tokens, WireDtype dt) : H(hidden), T(tokens), E(experts), dtype(dt) {
        p = contiguous_placement(E, kRanks);
        dp = std::make_unique<epc::PlacementBuffer>(p);
        ft::test::TraceSpec spec;
        spec.experts = E;
        spec.top_k = kTopK;
        spec.tokens = T;
        spec.seed = 3;
        const std::vector<int32_t> trace = ft::test::routing_trace(spec);
        const DispatchLayout hl = dispatch_layout(p, trace.data(), nullptr, T, kTopK, 0);
        rows = hl.offset[kRanks];
        expert_rows = std::accumulate(hl.send_n.begin(), hl.send_n.end(), int64_t(0));
        rec = record_layout(H, kTopK, dtype);
        ids = dev_alloc<int32_t>(T * kTopK);
        ok(cudaMemcpy(ids, trace.data(), trace.size() * 4, cudaMemcpyHostToDevice));
        std::vector<float> w(T * kTopK, 1.0f / kTopK);
        weights = dev_alloc<float>(w.size());
        ok(cudaMemcpy(weights, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
        x = dev_alloc<uint16_t>(T * H);
        ok(cudaMemset(x, 0x3f, T * H * 2));
        lmem = dev_alloc<uint8_t>(epc::layout_bytes(kRanks, p.slots_per_rank, kTopK, T));
        L = epc::carve_layout(lmem, kRanks, p.slots_per_rank, kTopK, T);
        wire = dev_alloc<uint8_t>(rec.bytes * kRanks * T);
        // The receiver: every record as if from source 0, all slot ids < S.
        rmem = dev_alloc<uint8_t>(epc::receive_bytes(kRanks, p.slots_per_rank, kTopK, T, expert_rows));
        B = epc::carve_receive(rmem, kRanks, p.slots_per_rank, kTopK, T, expert_rows);
        std::vector<int64_t> m(kRanks * kRanks, 0);
        m[0] = rows;
        matrix = dev_alloc<int64_t>(m.size());
        ok(cudaMemcpy(matrix, m.data(), m.size() * 8, cudaMemcpyHostToDevice));
        xrows = dev_alloc<uint16_t>(expert_rows * H);
        yrows = dev_alloc<uint16_t>(expert_rows * H);
        ok(cudaMemset(yrows, 0x3c, expert_rows * H * 2));
        partial = dev_alloc<uint16_t>(kRanks * T * H);
        out = dev_alloc<uint16_t>(T * H);
        layout(nullptr);
        pack(nullptr);
        receive_counts(nullptr);
        ok(cudaDeviceSynchronize());
    }
    ~Scene() {
        for (void *q : std::initializer_list<void *>{ids, weights, x, xrows, yrows, partial, out, lmem, rmem, wire, matrix})
            cudaFree(q);
    }
    epc::RecvRegion region() const { return {wire, 0, T}; }
    void layout(cudaStream_t s) { epc::launch_layout(dp->view(), ids, weights, T, kTopK, 0, nullptr, L, s); }
    void pack(cudaStream_t s) { epc::launch_pack(L, kRanks * T, x, H, dtype, 0, {wire, 0}, s); }
    void receive_counts(cudaStream_t s) { epc::launch_receive_counts(B, region(), matrix, 0, s); }
    void unpack(cudaStream_t s) {
        epc::launch_group(B, region(), H, dtype, 0, 1, s);
        epc::launch_unpack(B, region(), H, dtype, xrows, nullptr, s);
    }
    void reduce(cudaStream_t s) { epc::launch_reduce(B, region(), H, dtype, 0, 1, yrows, partial, s); }
    // The source's combine over its 8 ranks' partials (rows laid out as the layout's offsets).
    void combine(cudaStream_t s) { epc::launch_combine(L, T, partial, 0, H, out, s); }
};

Scene &scene(int64_t H, int32_t E, int64_t T) {
    static std::map<std::tuple<int64_t, int32_t, int64_t>, std::unique_ptr<Scene>> cache;
    auto &s = cache[{H, E, T}];
    if (!s) {
        cache.clear();  // one scene alive at a time: the prefill ones are large
        auto &fresh = cache[{H, E, T}];
        fresh = std::make_unique<Scene>(H, E, T, WireDtype::Fp8Fp32);
        return *fresh;
    }
    return *s;
}

template <typename Fn>
void timed(benchmark::State &state, double bytes, Fn &&fn) {
    if (ft::cuda::device_count() == 0) {
        state.SkipWithError("no GPU");
        return;
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    fn();
    double total_s = 0;
    int64_t n = 0;
    for (auto _ : state) {
        cudaEventRecord(e0);
        fn();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        state.SetIterationTime(ms * 1e-3);
        total_s += ms * 1e-3;
        ++n;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    const double bound = copy_bound(), gbps = n && total_s > 0 ? bytes * n / total_s / 1e9 : 0.0;
    state.counters["GBps"] = gbps;
    state.counters["bound_GBps"] = bound;
    state.counters["ratio"] = gbps / bound;
}

// args: H, E, tokens
void BM_Layout(benchmark::State &state) {
    if (ft::cuda::device_count() == 0) return state.SkipWithError("no GPU");
    Scene &s = scene(state.range(0), static_cast<int32_t>(state.range(1)), state.range(2));
    const double bytes = s.T * kTopK * 8.0 + s.rows * (8.0 + kTopK * 8.0);  // ids+weights in, rows out
    timed(state, bytes, [&] { s.layout(nullptr); });
    state.counters["records"] = static_cast<double>(s.rows);
}

void BM_PackQuantise(benchmark::State &state) {
    if (ft::cuda::device_count() == 0) return state.SkipWithError("no GPU");
    Scene &s = scene(state.range(0), static_cast<int32_t>(state.range(1)), state.range(2));
    const double bytes = s.rows * (2.0 * s.H + s.rec.bytes);  // a bf16 row read, a record written
    timed(state, bytes, [&] { s.pack(nullptr); });
    state.counters["records"] = static_cast<double>(s.rows);
}

void BM_GroupUnpack(benchmark::State &state) {
    if (ft::cuda::device_count() == 0) return state.SkipWithError("no GPU");
    Scene &s = scene(state.range(0), static_cast<int32_t>(state.range(1)), state.range(2));
    const double bytes = s.expert_rows * (double(s.rec.payload_bytes + s.rec.scale_bytes) + 2.0 * s.H);
    timed(state, bytes, [&] { s.unpack(nullptr); });
    state.counters["expert_rows"] = static_cast<double>(s.expert_rows);
}

void BM_ReduceCombine(benchmark::State &state) {
    if (ft::cuda::device_count() == 0) return state.SkipWithError("no GPU");
    Scene &s = scene(state.range(0), static_cast<int32_t>(state.range(1)), state.range(2));
    s.unpack(nullptr);  // route_row for the reduce
    // Expert outputs read, one partial per record written; then partials read, outputs written.
    const double bytes = 2.0 * s.H * (s.expert_rows + s.rows) + 2.0 * s.H * (s.rows + s.T);
    timed(state, bytes, [&] {
        s.reduce(nullptr);
        s.combine(nullptr);
    });
}

// Decode sizes as a decode loop runs them: each phase captured 10 times into one CUDA graph and
// replayed, so the time per phase is what it adds to a graph-replayed step (no host launch cost).
// Phase 0: the whole local chain (layout, pack, receive counts, group + unpack, reduce, combine);
// 1 layout; 2 pack; 3 receive counts + group + unpack; 4 reduce; 5 combine. Args: H, E, T, phase.
void BM_DecodePhaseGraph(benchmark::State &state) {
    if (ft::cuda::device_count() == 0) return state.SkipWithError("no GPU");
    Scene &s = scene(state.range(0), static_cast<int32_t>(state.range(1)), state.range(2));
    const int64_t phase = state.range(3);
    constexpr int kRepeats = 10;
    cudaStream_t st;
    ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    auto run = [&] {
        if (phase == 0 || phase == 1) s.layout(st);
        if (phase == 0 || phase == 2) s.pack(st);
        if (phase == 0 || phase == 3) {
            s.receive_counts(st);
            s.unpack(st);
        }
        if (phase == 0 || phase == 4) s.reduce(st);
        if (phase == 0 || phase == 5) s.combine(st);
    };
    cudaGraph_t g;
    cudaGraphExec_t exec;
    ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kRepeats; ++i) run();
    ok(cudaStreamEndCapture(st, &g));
    ok(cudaGraphInstantiate(&exec, g, 0));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    ok(cudaGraphLaunch(exec, st));
    for (auto _ : state) {
        cudaEventRecord(e0, st);
        ok(cudaGraphLaunch(exec, st));
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        state.SetIterationTime(ms * 1e-3 / kRepeats);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    cudaStreamDestroy(st);
    static const char *names[] = {"chain", "layout", "pack", "group+unpack", "reduce", "combine"};
    state.SetLabel(names[phase]);
}
BENCHMARK(BM_DecodePhaseGraph)
    ->ArgsProduct({{7168}, {256}, {1, 64}, {0, 1, 2, 3, 4, 5}})
    ->ArgsProduct({{2048}, {128}, {1, 64}, {0, 1, 2, 3, 4, 5}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void shapes(benchmark::internal::Benchmark *b) {
    for (auto [H, E] : {std::pair<int64_t, int64_t>{7168, 256}, {2048, 128}})
        for (int64_t T : {1, 8, 64, 4096, 16384, 32768}) b->Args({H, E, T});
    b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Layout)->Apply(shapes);
BENCHMARK(BM_PackQuantise)->Apply(shapes);
BENCHMARK(BM_GroupUnpack)->Apply(shapes);
BENCHMARK(BM_ReduceCombine)->Apply(shapes);

// Bytes leaving a rank per token, from the layout of a skewed trace (no GPU needed).
void BM_WireBytesPerToken(benchmark::State &state) {
    const int64_t H = state.range(0);
    const int32_t E = static_cast<int32_t>(state.range(1)), R = static_cast<int32_t>(state.range(2));
    ft::test::TraceSpec spec;
    spec.experts = E;
    spec.top_k = kTopK;
    spec.tokens = 8192;
    spec.seed = 5;
    const std::vector<int32_t> trace = ft::test::routing_trace(spec);
    const Placement p = contiguous_placement(E, R);
    WireBytes w;
    for (auto _ : state) w = wire_bytes(p, trace.data(), spec.tokens, kTopK, H);
    state.counters["dedup_fp8_B"] = w.dispatch_dedup_fp8;
    state.counters["allgather_bf16_B"] = w.allgather_bf16;
    state.counters["alltoall_bf16_B"] = w.alltoall_bf16;
    state.counters["combine_bf16_B"] = w.combine_dedup_bf16;
    state.counters["combine_fp8_B"] = w.combine_dedup_fp8;  // the optional FP8 combine wire
    state.counters["P"] = w.remote_fraction;
    state.counters["vs_allgather"] = w.allgather_bf16 / std::max(w.dispatch_dedup_fp8, 1e-9);
    state.counters["vs_alltoall"] = w.alltoall_bf16 / std::max(w.dispatch_dedup_fp8, 1e-9);
}
BENCHMARK(BM_WireBytesPerToken)
    ->ArgsProduct({{7168}, {256}, {2, 4, 8}})
    ->ArgsProduct({{2048}, {128}, {2, 4, 8}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
