// Per-step cost of the CPU handoff: batches of signal + wait with an empty task on an otherwise
// idle stream, timed from the first enqueue to the stream's completion, for both mechanisms,
// eager and replayed from a CUDA graph (the way a captured decode step runs it).
// Counters: us_per_handoff, target_us (the 10 us goal), ratio = us_per_handoff / target_us, and
// service_us (the coordinator's average time from seeing the go to setting done).
#include <benchmark/benchmark.h>

#include <cuda_runtime.h>

#include <chrono>
#include <memory>

#include "ft/common.hpp"
#include "ft/cuda_device.hpp"
#include "ft/cuda_handoff.hpp"

namespace {

using ft::cuda::Handoff;
using ft::cuda::HandoffMechanism;
using Clock = std::chrono::steady_clock;

constexpr int kBatch = 100;
constexpr double kTargetUs = 10.0;

void BM_handoff(benchmark::State &state, HandoffMechanism mech, bool graph) {
    if (ft::cuda::device_count() == 0) {
        state.SkipWithError("no CUDA device");
        return;
    }
    ft::cuda::HandoffOptions o;
    o.mechanism = mech;
    std::unique_ptr<Handoff> h;
    try {
        h = std::make_unique<Handoff>(o);
    } catch (const ft::Error &e) {
        state.SkipWithError(e.what());
        return;
    }
    const int site = h->add_site([] {});
    cudaStream_t stream = nullptr;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    cudaGraphExec_t exec = nullptr;
    auto enqueue_batch = [&] {
        for (int i = 0; i < kBatch; ++i) {
            h->signal(site, stream);
            h->wait(site, stream);
        }
    };
    if (graph) {
        cudaGraph_t g = nullptr;
        cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
        enqueue_batch();
        cudaStreamEndCapture(stream, &g);
        if (!g || cudaGraphInstantiate(&exec, g, 0) != cudaSuccess) {
            state.SkipWithError("graph capture of the handoff failed");
            if (g) cudaGraphDestroy(g);
            cudaStreamDestroy(stream);
            return;
        }
        cudaGraphDestroy(g);
    }
    auto run_batch = [&] {
        if (graph)
            cudaGraphLaunch(exec, stream);
        else
            enqueue_batch();
        cudaStreamSynchronize(stream);
    };
    run_batch();  // warm-up
    run_batch();

    double total = 0;
    int64_t handoffs = 0;
    for (auto _ : state) {
        const auto t0 = Clock::now();
        run_batch();
        const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        state.SetIterationTime(dt);
        total += dt;
        handoffs += kBatch;
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || h->status() != FT_OK) {
        state.SkipWithError(e != cudaSuccess ? cudaGetErrorString(e) : h->status_message().c_str());
    } else {
        const double us = handoffs ? total / handoffs * 1e6 : 0;
        state.counters["us_per_handoff"] = us;
        state.counters["target_us"] = kTargetUs;
        state.counters["ratio"] = us / kTargetUs;
        state.counters["service_us"] = h->timing(site).service_seconds_avg * 1e6;
    }
    state.SetLabel(ft::cuda::handoff_mechanism_name(h->mechanism()));
    if (exec) cudaGraphExecDestroy(exec);
    cudaStreamDestroy(stream);
}

BENCHMARK_CAPTURE(BM_handoff, memops_eager, HandoffMechanism::stream_memops, false)->UseManualTime();
BENCHMARK_CAPTURE(BM_handoff, memops_graph, HandoffMechanism::stream_memops, true)->UseManualTime();
BENCHMARK_CAPTURE(BM_handoff, hostfn_eager, HandoffMechanism::host_func, false)->UseManualTime();
BENCHMARK_CAPTURE(BM_handoff, hostfn_graph, HandoffMechanism::host_func, true)->UseManualTime();

}  // namespace

BENCHMARK_MAIN();
