// The pieces of bench_backends (the main file bench_backends.cu says what it measures): the
// bandwidths of this run and the routing traces (bench_backends_measure.cu), the models and the
// timed runs of a session (bench_backends_models.cu).
#pragma once

#include <benchmark/benchmark.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "freetoken.h"
#include "freetoken_cuda.h"
#include "ft/cuda_memory.hpp"
#include "ft/synth.hpp"

namespace backends_bench {

using Clock = std::chrono::steady_clock;

extern bool g_quick;  // --quick: fewer calls, a coarser f sweep

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

inline void ft_ok(ft_status s, const char *what, const char *detail) {
    if (s != FT_OK)
        throw std::runtime_error(std::string(what) + ": " + ft_status_string(s) + (detail && *detail ? std::string(" (") + detail + ")" : ""));
}

// The library's owning handles (ft/cuda_memory.hpp).
using ft::cuda::DeviceBuffer;
using ft::cuda::Event;
using ft::cuda::PinnedBuffer;
using ft::cuda::Stream;

struct SessionDeleter {
    void operator()(ft_session *s) const { ft_session_free(s); }
};
using Session = std::unique_ptr<ft_session, SessionDeleter>;

// ---- bandwidths measured in this run -------------------------------------------------------

constexpr size_t kCopyBytes = size_t(256) << 20;

struct Bandwidths {
    double h2d = 0.0, hbm = 0.0;  // bytes per second
};

// Linear pinned H2D (cudaMemcpyAsync of kCopyBytes) and a streaming device read, best of 3 batches.
Bandwidths measure_bandwidths();

// ---- routing traces -----------------------------------------------------------------------------

struct Trace {
    int period = 1;               // calls after which the pattern (and its hit rate) repeats
    std::vector<int32_t> layer;   // per call
    std::vector<int32_t> ids;     // [call][K]
};

// Every layer in turn; visit v of a layer routes to experts vK .. vK + K - 1 (mod E).
Trace rotating(int layers, int E, int K, int64_t calls);

// Layers 0 .. layers-1 in turn; visit v uses hot[v % hot.size()] experts of the hot set
// 0 .. max(hot)-1 and fills the other routes with the layer's next cold experts (rotating over
// max(hot) .. E-1). The pattern follows the visit, not the call, so every layer sees all of it
// and no hot expert sits unused for long enough to be evicted.
Trace hot_cold(int layers, int E, int K, const std::vector<int> &hot, int64_t calls);

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// ---- models -------------------------------------------------------------------------------------

struct Model {
    ft_model *m = nullptr;
    ft_model_info info{};
    const char *name = "";
    double setup_seconds = 0.0;
};

// The bf16 model built in memory, and the mxfp4 / nvfp4 synthetic checkpoints (see the main file).
Model build_bf16(ft_engine *engine);
Model build_mxfp4(ft_engine *engine);
Model build_nvfp4(ft_engine *engine);

// ---- sessions and timed runs --------------------------------------------------------------------

Session open_session(const Model &m, int32_t backend, double fraction = 0.5, bool adaptive = false);

struct RunResult {
    double seconds_per_call = 0.0;
    double hits_per_call = 0.0, misses_per_call = 0.0;  // distinct experts, from the session stats
    double hit_rate = 0.0;
    double fraction = 0.0;   // hybrid: f in use at the end
    double cpu_share = 0.0;  // routes_cpu / (routes_cpu + routes_gpu)
    double cpu_bytes_per_call = 0.0;
    double cpu_task_seconds = 0.0;  // hybrid: mean wall time of the CPU task per call
};

struct RunOptions {
    int64_t warmup = 0, measured = 0;  // calls; both rounded up to the trace period
    bool sync_each_warmup = false;     // adaptive hybrid: every eager step is measured for f
};

// Runs o.warmup then o.measured calls of trace t on session s (both rounded up to t.period).
RunResult timed_run(ft_session *s, const Model &m, const Trace &t, const RunOptions &o);

}  // namespace backends_bench
