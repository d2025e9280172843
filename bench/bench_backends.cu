// Session-level decode benchmarks of the GPU backends (issues 4 and 5), through the public C API
// only: one MoE layer per ft_decode_cuda call at one token, on device buffers and one stream.
//
// Every figure a bound is built from is measured in this same process before it is used:
//   h2d    linear pinned host -> device cudaMemcpyAsync (256 MiB copies, best of 3 batches);
//   hbm    a streaming read kernel over 2 GiB of device memory (best of 3 batches);
//   pcie_ov, cpu_ov (per format)  a batch of the same pinned H2D copies on the copy engine while
//          an FT_BACKEND_CPU session of the same model decodes the same all-miss trace on all
//          cores; pcie_ov = copied bytes / copy time, cpu_ov = the CPU session's expert bytes
//          (ft_session_stats.cpu_bytes) / its wall time meanwhile. The copies read their own
//          pinned buffer, disjoint from the expert banks the CPU reads.
// Per call, with distinct hits and misses from ft_session_get_stats and eb = expert bytes:
//   offload bound = misses * eb / h2d + hits * eb / hbm
//   hybrid bound  = misses * eb / (pcie_ov + cpu_ov) + hits * eb / hbm   (the additive bound)
//   cpu bound     = (hits + misses) * eb / cpu_alone
// ratio = bound / measured (1.0 = at the bound). Time is per layer call, timed with a steady
// clock around batches of calls that end in a stream synchronisation (one per round of layers,
// as a runtime syncs once per token).
//
// Routing traces are built so the slot cache (one layer of slots, cache_slots = E, shared LRU
// over all layers) gives known hit rates; the measured hit_rate counter is the truth:
//   rotating  every layer in turn, each visit the next K experts of the layer: with enough
//             layers every pair is evicted before it comes back (0 % hits, "all-miss");
//   hot/cold  a few layers, each call h experts of a fixed hot set (they stay resident) plus
//             K - h cold experts rotating over the rest (evicted before reuse): hits = h / K.
//
// `--quick` runs fewer calls and a coarser f sweep. Without a usable GPU it prints a message and
// exits 0. Models: bf16 H=4096 I=1536 E=64 K=8 L=10 (built in memory, ~24 GB of host banks) and
// mxfp4 gpt-oss-20b shapes H=I=2880 E=32 K=4 L=5 (a synthetic checkpoint of ~2.1 GB written
// once to /tmp/ft-bench-backends-mxfp4 and reused), nvfp4 GLM-4.x expert shapes H=5120 I=1536
// E=64 K=8 L=5 (~4 GB, /tmp/ft-bench-backends-nvfp4).
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

namespace {

using Clock = std::chrono::steady_clock;

bool g_quick = false;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

void ft_ok(ft_status s, const char *what, const char *detail) {
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

// Streaming read of n int4 words; the xor keeps the loads from being optimised away.
__global__ void read_kernel(const int4 *p, size_t n, int *sink) {
    int acc = 0;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x1234567) *sink = acc;
}

constexpr size_t kCopyBytes = size_t(256) << 20;

// Bytes per second of `reps` back-to-back pinned H2D copies of kCopyBytes, best of 3 batches.
double measure_h2d(const PinnedBuffer &src, const DeviceBuffer &dst, cudaStream_t s, int reps) {
    Event a(true), b(true);
    double best = 0.0;
    cuda_ok(cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes, cudaMemcpyHostToDevice, s), "H2D warm-up");
    for (int trial = 0; trial < 3; ++trial) {
        cuda_ok(cudaEventRecord(a.get(), s), "cudaEventRecord");
        for (int r = 0; r < reps; ++r) cuda_ok(cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes, cudaMemcpyHostToDevice, s), "H2D");
        cuda_ok(cudaEventRecord(b.get(), s), "cudaEventRecord");
        cuda_ok(cudaEventSynchronize(b.get()), "H2D");
        float ms = 0.0f;
        cuda_ok(cudaEventElapsedTime(&ms, a.get(), b.get()), "cudaEventElapsedTime");
        best = std::max(best, double(reps) * kCopyBytes / (ms * 1e-3));
    }
    return best;
}

struct Bandwidths {
    double h2d = 0.0, hbm = 0.0;  // bytes per second
};

Bandwidths measure_bandwidths() {
    Bandwidths bw;
    Stream s;
    {
        PinnedBuffer src(kCopyBytes, "cudaHostAlloc", cudaHostAllocPortable);
        std::memset(src.get(), 1, kCopyBytes);
        DeviceBuffer dst(kCopyBytes);
        bw.h2d = measure_h2d(src, dst, s.get(), g_quick ? 4 : 8);
    }
    const size_t bytes = size_t(2) << 30, n = bytes / sizeof(int4);
    DeviceBuffer buf(bytes), sink(sizeof(int));
    cuda_ok(cudaMemsetAsync(buf.get(), 1, bytes, s.get()), "cudaMemset");
    int dev = 0, sms = 0;
    cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    Event a(true), b(true);
    const int reps = 10;
    read_kernel<<<sms * 4, 512, 0, s.get()>>>(buf.get<int4>(), n, sink.get<int>());
    for (int trial = 0; trial < 3; ++trial) {
        cuda_ok(cudaEventRecord(a.get(), s.get()), "cudaEventRecord");
        for (int r = 0; r < reps; ++r) read_kernel<<<sms * 4, 512, 0, s.get()>>>(buf.get<int4>(), n, sink.get<int>());
        cuda_ok(cudaGetLastError(), "read kernel");
        cuda_ok(cudaEventRecord(b.get(), s.get()), "cudaEventRecord");
        cuda_ok(cudaEventSynchronize(b.get()), "read kernel");
        float ms = 0.0f;
        cuda_ok(cudaEventElapsedTime(&ms, a.get(), b.get()), "cudaEventElapsedTime");
        bw.hbm = std::max(bw.hbm, double(reps) * bytes / (ms * 1e-3));
    }
    return bw;
}

// ---- routing traces -----------------------------------------------------------------------------

struct Trace {
    int period = 1;               // calls after which the pattern (and its hit rate) repeats
    std::vector<int32_t> layer;   // per call
    std::vector<int32_t> ids;     // [call][K]
};

// Every layer in turn; visit v of a layer routes to experts vK .. vK + K - 1 (mod E).
Trace rotating(int layers, int E, int K, int64_t calls) {
    Trace t;
    t.period = layers;
    for (int64_t c = 0; c < calls; ++c) {
        const int64_t v = c / layers;
        t.layer.push_back(int32_t(c % layers));
        for (int j = 0; j < K; ++j) t.ids.push_back(int32_t((v * K + j) % E));
    }
    return t;
}

// Layers 0 .. layers-1 in turn; visit v uses hot[v % hot.size()] experts of the hot set
// 0 .. max(hot)-1 and fills the other routes with the layer's next cold experts (rotating over
// max(hot) .. E-1). The pattern follows the visit, not the call, so every layer sees all of it
// and no hot expert sits unused for long enough to be evicted.
Trace hot_cold(int layers, int E, int K, const std::vector<int> &hot, int64_t calls) {
    Trace t;
    t.period = layers * int(hot.size());
    const int hot_set = *std::max_element(hot.begin(), hot.end()), cold_pool = E - hot_set;
    std::vector<int64_t> next_cold(size_t(layers), 0);
    for (int64_t c = 0; c < calls; ++c) {
        const int l = int(c % layers);
        const int h = hot[size_t((c / layers) % int64_t(hot.size()))];
        t.layer.push_back(l);
        for (int j = 0; j < h; ++j) t.ids.push_back(j);
        for (int j = h; j < K; ++j) t.ids.push_back(int32_t(hot_set + next_cold[size_t(l)]++ % cold_pool));
    }
    return t;
}

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// ---- models -------------------------------------------------------------------------------------

struct Model {
    ft_model *m = nullptr;
    ft_model_info info{};
    const char *name = "";
    double setup_seconds = 0.0;
};

// Random bf16 patterns of magnitude 2^-7 .. 2^-5 (finite, like trained expert weights).
std::vector<uint16_t> random_weights(size_t n, uint64_t seed) {
    std::vector<uint16_t> v(n);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto &w : v) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const uint16_t sign = uint16_t((x >> 8) & 1u) << 15, exp = uint16_t(0x78 + (x >> 16) % 3), mant = uint16_t((x >> 24) & 0x7f);
        w = uint16_t(sign | exp << 7 | mant);
    }
    return v;
}

void fill_info(Model &m) {
    m.info.struct_size = sizeof m.info;
    ft_ok(ft_model_get_info(m.m, &m.info), "ft_model_get_info", ft_model_last_error(m.m));
    if (m.info.pinned_bytes != m.info.bank_bytes)
        std::fprintf(stderr, "bench_backends: %s: only %llu of %llu bank bytes are pinned\n", m.name,
                     (unsigned long long)m.info.pinned_bytes, (unsigned long long)m.info.bank_bytes);
}

Model build_bf16(ft_engine *engine) {
    const auto t0 = Clock::now();
    Model m;
    m.name = "bf16";
    ft_model_desc d;
    ft_model_desc_init(&d);
    d.num_layers = 10;  // 8 L fetches per rotation > 64 slots even at one fetch per call
    d.num_experts = 64;
    d.top_k = 8;
    d.hidden_size = 4096;
    d.intermediate_size = 1536;
    d.format = FT_FORMAT_BF16;
    char err[512] = "";
    ft_ok(ft_model_create(engine, &d, &m.m, err, sizeof err), "ft_model_create", err);
    // A few distinct random projections reused across experts: the bytes differ per expert in
    // address only, which is all a bandwidth benchmark needs, and filling stays fast.
    const size_t n = size_t(d.hidden_size) * d.intermediate_size;
    std::vector<std::vector<uint16_t>> variants;
    for (uint64_t i = 0; i < 5; ++i) variants.push_back(random_weights(n, i + 1));
    for (int l = 0; l < d.num_layers; ++l)
        for (int e = 0; e < d.num_experts; ++e)
            for (int p : {FT_PROJ_GATE, FT_PROJ_UP, FT_PROJ_DOWN}) {
                const auto &v = variants[size_t(l * 7 + e * 3 + p) % variants.size()];
                ft_ok(ft_model_set_expert(m.m, l, e, p, v.data(), n * sizeof(uint16_t)), "ft_model_set_expert",
                      ft_model_last_error(m.m));
            }
    ft_ok(ft_model_finalize(m.m), "ft_model_finalize", ft_model_last_error(m.m));
    fill_info(m);
    m.setup_seconds = seconds_since(t0);
    return m;
}

// A synthetic checkpoint written once to `dir` (reused by later runs) and loaded.
Model build_synth(ft_engine *engine, const char *name, const ft::synth::Spec &s, const std::string &dir) {
    const auto t0 = Clock::now();
    Model m;
    m.name = name;
    namespace fs = std::filesystem;
    const std::string marker = dir + "/.complete-v1";
    if (!fs::exists(marker)) {
        fs::remove_all(dir);
        std::fprintf(stderr, "bench_backends: writing the %s checkpoint to %s (once)\n", name, dir.c_str());
        ft::synth::write_checkpoint(dir, s);
        std::ofstream(marker) << "ok\n";
    }
    char err[512] = "";
    ft_ok(ft_model_load(engine, dir.c_str(), nullptr, &m.m, err, sizeof err), "ft_model_load", err);
    fill_info(m);
    m.setup_seconds = seconds_since(t0);
    return m;
}

Model build_mxfp4(ft_engine *engine) {
    ft::synth::Spec s;
    s.architecture = "gpt_oss";
    s.format = "mxfp4";
    s.num_layers = 5;  // 8 L fetches per rotation > 32 slots at one fetch per call
    s.num_experts = 32;
    s.top_k = 4;
    s.hidden = 2880;
    s.intermediate = 2880;
    s.seed = 7;
    return build_synth(engine, "mxfp4", s, "/tmp/ft-bench-backends-mxfp4");
}

// nvfp4 at GLM-4.x expert shapes (H=5120, I=1536, top-8), E=64 and L=5: a 4-bit model whose
// steps miss eight experts, as DeepSeek-style models do (gpt-oss misses four).
Model build_nvfp4(ft_engine *engine) {
    ft::synth::Spec s;
    s.architecture = "qwen3_moe";  // no shared expert, no leading dense layers
    s.format = "nvfp4";
    s.num_layers = 5;
    s.num_experts = 64;
    s.top_k = 8;
    s.hidden = 5120;
    s.intermediate = 1536;
    s.seed = 11;
    return build_synth(engine, "nvfp4", s, "/tmp/ft-bench-backends-nvfp4");
}

// ---- sessions and timed runs --------------------------------------------------------------------

Session open_session(const Model &m, int32_t backend, double fraction = 0.5, bool adaptive = false) {
    ft_session_params p;
    ft_session_params_init(&p);
    p.backend = backend;
    p.max_tokens = 1;  // decode only: no prefill buffers
    p.cache_slots = m.info.num_experts;  // one layer of slots, shared LRU over all layers
    p.vram_reserve_bytes = 0;
    p.hybrid_fraction = float(fraction);
    p.hybrid_adaptive = adaptive;
    ft_session *s = nullptr;
    char err[512] = "";
    ft_ok(ft_session_create(m.m, &p, &s, err, sizeof err), "ft_session_create", err);
    return Session(s);
}

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

// Calls between stream synchronisations in the timed part: whole periods, about 16 calls.
int64_t sync_interval(const Trace &t) { return int64_t(t.period) * std::max(1, 16 / t.period); }

RunResult timed_run(ft_session *s, const Model &m, const Trace &t, const RunOptions &o) {
    const int K = m.info.top_k, H = m.info.hidden_size;
    const int64_t warm = round_up(o.warmup, t.period), meas = round_up(std::max<int64_t>(o.measured, 1), sync_interval(t));
    if (int64_t(t.layer.size()) < warm + meas) throw std::runtime_error("trace shorter than the run");
    const bool device = ft_session_backend(s) != FT_BACKEND_CPU;
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<uint16_t> x(static_cast<size_t>(H)), y(static_cast<size_t>(H));
    for (auto &v : x) {
        const float f = u(rng);
        uint32_t b;
        std::memcpy(&b, &f, 4);
        v = uint16_t(b >> 16);
    }
    const size_t routes = size_t(warm + meas) * K;
    std::vector<float> w(routes, 1.0f / float(K));
    Stream stream;
    std::unique_ptr<DeviceBuffer> dx, dy, dids, dw;
    if (device) {
        dx = std::make_unique<DeviceBuffer>(x.size() * 2);
        dy = std::make_unique<DeviceBuffer>(y.size() * 2);
        dids = std::make_unique<DeviceBuffer>(routes * sizeof(int32_t));
        dw = std::make_unique<DeviceBuffer>(routes * sizeof(float));
        cuda_ok(cudaMemcpy(dx->get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice), "upload");
        cuda_ok(cudaMemcpy(dids->get(), t.ids.data(), routes * sizeof(int32_t), cudaMemcpyHostToDevice), "upload");
        cuda_ok(cudaMemcpy(dw->get(), w.data(), routes * sizeof(float), cudaMemcpyHostToDevice), "upload");
    }
    auto call = [&](int64_t c) {
        const size_t r = size_t(c) * K;
        const ft_status st = device ? ft_decode_cuda(s, t.layer[size_t(c)], 1, dx->get<uint16_t>(), dids->get<int32_t>() + r,
                                                     dw->get<float>() + r, dy->get<uint16_t>(), stream.get())
                                    : ft_decode(s, t.layer[size_t(c)], 1, x.data(), t.ids.data() + r, w.data() + r, y.data());
        ft_ok(st, "decode", ft_session_last_error(s));
    };
    auto sync = [&] {
        if (device) cuda_ok(cudaStreamSynchronize(stream.get()), "decode (stream)");
    };
    for (int64_t c = 0; c < warm; ++c) {
        call(c);
        if (o.sync_each_warmup || (c + 1) % t.period == 0) sync();
    }
    sync();
    ft_session_reset_stats(s);
    const int64_t every = sync_interval(t);
    const auto t0 = Clock::now();
    for (int64_t c = warm; c < warm + meas; ++c) {
        call(c);
        if ((c - warm + 1) % every == 0) sync();
    }
    sync();
    RunResult r;
    r.seconds_per_call = seconds_since(t0) / double(meas);
    ft_ok(ft_session_status(s), "session status", ft_session_last_error(s));
    ft_session_stats st;
    st.struct_size = sizeof st;
    ft_ok(ft_session_get_stats(s, &st), "ft_session_get_stats", ft_session_last_error(s));
    if (device) {
        r.hits_per_call = double(st.cache_hits) / double(meas);
        r.misses_per_call = double(st.cache_misses) / double(meas);
        const double active = double(st.cache_hits + st.cache_misses);
        r.hit_rate = active > 0 ? double(st.cache_hits) / active : 0.0;
    } else {
        r.misses_per_call = double(st.experts_cpu) / double(meas);  // every routed expert is read
    }
    r.fraction = st.hybrid_fraction;
    const double all = double(st.routes_cpu + st.routes_gpu);
    r.cpu_share = all > 0 ? double(st.routes_cpu) / all : 0.0;
    r.cpu_bytes_per_call = double(st.cpu_bytes) / double(meas);
    r.cpu_task_seconds = st.cpu_seconds / double(meas);
    return r;
}

// ---- the shared context (built on first use, so a filtered run builds only what it needs) ------

struct Overlap {
    double pcie_alone = 0, cpu_alone = 0, pcie_ov = 0, cpu_ov = 0;  // bytes per second
};

// The models of the hybrid benchmarks.
enum class Fmt { bf16, mxfp4, nvfp4 };
constexpr int kFmts = 3;
const char *fmt_name(Fmt f) { return f == Fmt::bf16 ? "bf16" : f == Fmt::mxfp4 ? "mxfp4" : "nvfp4"; }

class Context {
public:
    static Context &get() {
        static Context c;
        return c;
    }

    ft_engine *engine() {
        if (!engine_) {
            ft_engine_params p;
            ft_engine_params_init(&p);
            p.device = FT_DEVICE_AUTO;
            p.cpu_threads = 0;  // one per physical core
            p.pin_threads = true;
            char err[512] = "";
            ft_ok(ft_engine_create(&p, &engine_, err, sizeof err), "ft_engine_create", err);
            ft_engine_info info;
            info.struct_size = sizeof info;
            ft_ok(ft_engine_get_info(engine_, &info), "ft_engine_get_info", ft_engine_last_error(engine_));
            if (info.device < 0) throw std::runtime_error("the engine has no GPU");
            std::fprintf(stderr, "bench_backends: engine on %s, %d CPU threads (%s)\n", info.device_name, info.cpu_threads,
                         info.cpu_isa);
        }
        return engine_;
    }

    const Model &model(Fmt f) {
        Model &m = models_[int(f)];
        if (!m.m) {
            m = f == Fmt::bf16 ? build_bf16(engine()) : f == Fmt::mxfp4 ? build_mxfp4(engine()) : build_nvfp4(engine());
            std::fprintf(stderr, "bench_backends: %s model ready in %.1f s (%d layers, %d experts, %.1f MB per expert)\n",
                         m.name, m.setup_seconds, m.info.num_layers, m.info.num_experts, m.info.expert_bytes / 1e6);
        }
        return m;
    }

    const Bandwidths &bandwidths() {
        if (!have_bw_) {
            engine();
            bw_ = measure_bandwidths();
            have_bw_ = true;
            std::fprintf(stderr, "bench_backends: linear pinned H2D %.1f GB/s, device read %.0f GB/s\n", bw_.h2d / 1e9,
                         bw_.hbm / 1e9);
        }
        return bw_;
    }

    // The overlapped pair for a model's format (see the file comment).
    const Overlap &overlap(Fmt f) {
        Overlap &ov = overlaps_[int(f)];
        if (ov.cpu_alone > 0) return ov;
        const Model &m = model(f);
        ov.pcie_alone = bandwidths().h2d;
        Session cpu = open_session(m, FT_BACKEND_CPU);
        const int L = m.info.num_layers, E = m.info.num_experts, K = m.info.top_k;
        const Trace t = rotating(L, E, K, 100000);
        // CPU alone.
        RunOptions o;
        o.warmup = 2 * L;
        o.measured = g_quick ? 4 * L : 10 * L;
        const RunResult alone = timed_run(cpu.get(), m, t, o);
        ov.cpu_alone = alone.cpu_bytes_per_call / alone.seconds_per_call;
        // Both at once: a batch of copies long enough for many CPU calls.
        PinnedBuffer src(kCopyBytes, "cudaHostAlloc", cudaHostAllocPortable);
        std::memset(src.get(), 1, kCopyBytes);
        DeviceBuffer dst(kCopyBytes);
        Stream s;
        Event a(true), b(true);
        const int reps = std::max(8, int(std::ceil((g_quick ? 0.3 : 0.6) * ov.pcie_alone / double(kCopyBytes))));
        std::vector<uint16_t> x(size_t(m.info.hidden_size), 0x3c00), y(x.size());
        std::vector<float> w(size_t(K), 1.0f / float(K));
        for (int64_t c = 0; c < 2 * L; ++c)  // warm the CPU side again
            ft_ok(ft_decode(cpu.get(), t.layer[size_t(c)], 1, x.data(), t.ids.data() + c * K, w.data(), y.data()), "ft_decode",
                  ft_session_last_error(cpu.get()));
        ft_session_reset_stats(cpu.get());
        cuda_ok(cudaEventRecord(a.get(), s.get()), "cudaEventRecord");
        for (int r = 0; r < reps; ++r) cuda_ok(cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes, cudaMemcpyHostToDevice, s.get()), "H2D");
        cuda_ok(cudaEventRecord(b.get(), s.get()), "cudaEventRecord");
        const auto t0 = Clock::now();
        int64_t c = 2 * L;
        while (cudaEventQuery(b.get()) == cudaErrorNotReady) {
            ft_ok(ft_decode(cpu.get(), t.layer[size_t(c)], 1, x.data(), t.ids.data() + c * K, w.data(), y.data()), "ft_decode",
                  ft_session_last_error(cpu.get()));
            c = c + 1 < int64_t(t.layer.size()) ? c + 1 : 0;
        }
        const double cpu_secs = seconds_since(t0);
        cuda_ok(cudaEventSynchronize(b.get()), "H2D");
        float ms = 0.0f;
        cuda_ok(cudaEventElapsedTime(&ms, a.get(), b.get()), "cudaEventElapsedTime");
        ov.pcie_ov = double(reps) * kCopyBytes / (ms * 1e-3);
        ft_session_stats st;
        st.struct_size = sizeof st;
        ft_ok(ft_session_get_stats(cpu.get(), &st), "ft_session_get_stats", ft_session_last_error(cpu.get()));
        ov.cpu_ov = double(st.cpu_bytes) / cpu_secs;
        std::fprintf(stderr,
                     "bench_backends: %s overlap: pcie %.1f GB/s alone, %.1f overlapped; cpu %.1f GB/s alone, %.1f overlapped\n",
                     m.name, ov.pcie_alone / 1e9, ov.pcie_ov / 1e9, ov.cpu_alone / 1e9, ov.cpu_ov / 1e9);
        return ov;
    }

    // Non-adaptive hybrid sweep results: f -> seconds per call (the adaptive benchmark compares).
    std::map<double, double> &sweep(Fmt f) { return sweeps_[int(f)]; }

    void teardown() {
        for (Model &m : models_) {
            ft_model_free(m.m);
            m.m = nullptr;
        }
        ft_engine_free(engine_);
        engine_ = nullptr;
    }

private:
    ft_engine *engine_ = nullptr;
    Model models_[kFmts];
    Bandwidths bw_;
    bool have_bw_ = false;
    Overlap overlaps_[kFmts];
    std::map<double, double> sweeps_[kFmts];
};

int64_t calls_for(int64_t normal, int64_t quick) { return g_quick ? quick : normal; }

void set_common(benchmark::State &state, const RunResult &r, double bound_s) {
    state.counters["us_per_layer"] = r.seconds_per_call * 1e6;
    state.counters["bound_us"] = bound_s * 1e6;
    state.counters["ratio"] = r.seconds_per_call > 0 ? bound_s / r.seconds_per_call : 0.0;
    state.counters["hit_rate"] = r.hit_rate;
}

void finish(benchmark::State &state, double seconds) {
    for (auto _ : state) state.SetIterationTime(seconds);
}

// The hybrid all-miss trace over every layer of the model, adaptive f from 0.5, converged with a
// synchronised warm-up (each eager step measures both sides).
RunResult adaptive_allmiss(const Model &m) {
    const int L = m.info.num_layers, E = m.info.num_experts, K = m.info.top_k;
    Session s = open_session(m, FT_BACKEND_HYBRID, 0.5, true);
    RunOptions o;
    o.warmup = calls_for(240, 100);
    o.sync_each_warmup = true;
    o.measured = calls_for(12 * L, 4 * L);
    return timed_run(s.get(), m, rotating(L, E, K, round_up(o.warmup, L) + 2 * o.measured + 64), o);
}

// ---- 1. offload at 0 / 50 / 100 % hits (bf16) ---------------------------------------------------

void BM_offload_hits(benchmark::State &state, int percent) {
    RunResult r;
    double bound = 0.0;
    try {
        Context &ctx = Context::get();
        const Model &m = ctx.model(Fmt::bf16);
        const Bandwidths &bw = ctx.bandwidths();
        const int L = m.info.num_layers, E = m.info.num_experts, K = m.info.top_k;
        const int64_t n = 4096;
        const Trace t = percent == 0 ? rotating(L, E, K, n) : percent == 100 ? hot_cold(4, E, K, {K}, n) : hot_cold(2, E, K, {K / 2}, n);
        Session s = open_session(m, FT_BACKEND_OFFLOAD);
        RunOptions o;
        o.warmup = 4 * t.period;
        o.measured = calls_for(percent == 0 ? 6 * L : 160, percent == 0 ? 2 * L : 48);
        r = timed_run(s.get(), m, t, o);
        const double eb = double(m.info.expert_bytes);
        bound = r.misses_per_call * eb / bw.h2d + r.hits_per_call * eb / bw.hbm;
        state.counters["gather_GBps"] = bw.h2d / 1e9;
        state.counters["hbm_GBps"] = bw.hbm / 1e9;
        state.counters["missed_MB"] = r.misses_per_call * eb / 1e6;
    } catch (const std::exception &e) {
        state.SkipWithError(e.what());
        return;
    }
    set_common(state, r, bound);
    finish(state, r.seconds_per_call);
}

// ---- 2. hybrid all-miss against the additive bound (bf16, mxfp4, nvfp4) -------------------------

// The additive bound of a hybrid run: misses at the overlapped PCIe + CPU rate, hits from HBM.
double hybrid_bound(const RunResult &r, const Model &m, const Overlap &ov, double hbm) {
    const double eb = double(m.info.expert_bytes);
    return r.misses_per_call * eb / (ov.pcie_ov + ov.cpu_ov) + r.hits_per_call * eb / hbm;
}

void BM_hybrid_allmiss(benchmark::State &state, Fmt fmt) {
    RunResult r;
    double bound = 0.0;
    try {
        Context &ctx = Context::get();
        const Model &m = ctx.model(fmt);
        const Overlap &ov = ctx.overlap(fmt);
        r = adaptive_allmiss(m);
        const double eb = double(m.info.expert_bytes);
        bound = hybrid_bound(r, m, ov, ctx.bandwidths().hbm);
        state.counters["f"] = r.fraction;
        state.counters["routes_cpu_share"] = r.cpu_share;
        state.counters["pcie_ov_GBps"] = ov.pcie_ov / 1e9;
        state.counters["cpu_ov_GBps"] = ov.cpu_ov / 1e9;
        state.counters["pcie_alone_GBps"] = ov.pcie_alone / 1e9;
        state.counters["cpu_alone_GBps"] = ov.cpu_alone / 1e9;
        state.counters["missed_MB"] = r.misses_per_call * eb / 1e6;
        // Where a step's time goes: the CPU task alone (the coordinator's clock) and the CPU
        // share's bytes over it; the rest of us_per_layer is GPU time and the handoff.
        state.counters["cpu_task_us"] = r.cpu_task_seconds * 1e6;
        state.counters["cpu_task_GBps"] = r.cpu_task_seconds > 0 ? r.cpu_bytes_per_call / r.cpu_task_seconds / 1e9 : 0.0;
    } catch (const std::exception &e) {
        state.SkipWithError(e.what());
        return;
    }
    set_common(state, r, bound);
    finish(state, r.seconds_per_call);
}

// ---- 3. step time vs fixed f, and the adaptive f against the sweep's best -----------------------

std::vector<double> sweep_points() {
    if (g_quick) return {0.0, 0.25, 0.5, 0.75, 1.0};
    std::vector<double> f;
    for (int i = 0; i <= 10; ++i) f.push_back(i / 10.0);
    return f;
}

// f = 0 asks the session for "from the profile" (hybrid_fraction's default), so the sweep's 0
// is a tiny positive fraction that fetches nothing.
double requested_fraction(double f) { return f > 0.0 ? f : 1e-4; }

RunResult fixed_fraction_run(const Model &m, double f) {
    const int L = m.info.num_layers, E = m.info.num_experts, K = m.info.top_k;
    Session s = open_session(m, FT_BACKEND_HYBRID, requested_fraction(f), false);
    RunOptions o;
    o.warmup = 2 * L;
    o.measured = calls_for(8 * L, 3 * L);
    return timed_run(s.get(), m, rotating(L, E, K, 2 * L + 2 * o.measured + 64), o);
}

void BM_hybrid_sweep(benchmark::State &state, Fmt fmt, double f) {
    RunResult r;
    double bound = 0.0;
    try {
        Context &ctx = Context::get();
        const Model &m = ctx.model(fmt);
        const Overlap &ov = ctx.overlap(fmt);
        r = fixed_fraction_run(m, f);
        ctx.sweep(fmt)[f] = r.seconds_per_call;
        bound = hybrid_bound(r, m, ov, ctx.bandwidths().hbm);
        state.counters["f"] = r.fraction;
        state.counters["routes_cpu_share"] = r.cpu_share;
    } catch (const std::exception &e) {
        state.SkipWithError(e.what());
        return;
    }
    set_common(state, r, bound);
    finish(state, r.seconds_per_call);
}

void BM_hybrid_adaptive_vs_sweep(benchmark::State &state, Fmt fmt) {
    RunResult r;
    double best = 0.0, best_f = 0.0;
    try {
        Context &ctx = Context::get();
        const Model &m = ctx.model(fmt);
        auto &sw = ctx.sweep(fmt);
        if (sw.empty())  // the sweep was filtered out: run it here
            for (double f : sweep_points()) sw[f] = fixed_fraction_run(m, f).seconds_per_call;
        r = adaptive_allmiss(m);
        best = sw.begin()->second, best_f = sw.begin()->first;
        for (const auto &[f, t] : sw)
            if (t < best) best = t, best_f = f;
        state.counters["f"] = r.fraction;
        state.counters["best_f"] = best_f;
        state.counters["best_us"] = best * 1e6;
        state.counters["routes_cpu_share"] = r.cpu_share;
        state.counters["within_5pct"] = r.seconds_per_call <= 1.05 * best ? 1.0 : 0.0;
    } catch (const std::exception &e) {
        state.SkipWithError(e.what());
        return;
    }
    // Here the bound is the sweep's best fixed f, measured in this run.
    set_common(state, r, best);
    finish(state, r.seconds_per_call);
}

// ---- 4. hybrid vs offload vs cpu on one trace at 30 % and 70 % hits (bf16) ----------------------

void BM_compare(benchmark::State &state, int percent, int32_t backend) {
    RunResult r;
    double bound = 0.0;
    try {
        Context &ctx = Context::get();
        const Model &m = ctx.model(Fmt::bf16);
        const Bandwidths &bw = ctx.bandwidths();
        const Overlap &ov = ctx.overlap(Fmt::bf16);
        const int E = m.info.num_experts, K = m.info.top_k;
        if (K != 8) throw std::runtime_error("the 30/70 % patterns assume K = 8");
        // Per visit 2,3,2,3,2 (30 %) or 6,5,6,5,6 (70 %) hot experts of 8.
        const std::vector<int> pattern = percent == 30 ? std::vector<int>{2, 3, 2, 3, 2} : std::vector<int>{6, 5, 6, 5, 6};
        const Trace t = hot_cold(2, E, K, pattern, 8192);
        const bool hybrid = backend == FT_BACKEND_HYBRID;
        Session s = open_session(m, backend, 0.5, hybrid);
        RunOptions o;
        o.warmup = hybrid ? calls_for(240, 100) : 4 * t.period;
        o.sync_each_warmup = hybrid;
        o.measured = calls_for(160, 48);
        r = timed_run(s.get(), m, t, o);
        const double eb = double(m.info.expert_bytes);
        if (backend == FT_BACKEND_CPU) {
            bound = r.misses_per_call * eb / ov.cpu_alone;  // the CPU reads every routed expert
        } else if (hybrid) {
            bound = hybrid_bound(r, m, ov, bw.hbm);
            state.counters["f"] = r.fraction;
            state.counters["routes_cpu_share"] = r.cpu_share;
        } else {
            bound = r.misses_per_call * eb / bw.h2d + r.hits_per_call * eb / bw.hbm;
        }
    } catch (const std::exception &e) {
        state.SkipWithError(e.what());
        return;
    }
    set_common(state, r, bound);
    state.counters["trace_hit"] = percent / 100.0;  // the trace's rate under offload's LRU
    finish(state, r.seconds_per_call);
}

template <typename F>
void reg(const std::string &name, F f) {
    benchmark::RegisterBenchmark(name.c_str(), f)->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
}

void register_all() {
    for (int p : {0, 50, 100})
        reg("offload_bf16/hit" + std::to_string(p), [p](benchmark::State &s) { BM_offload_hits(s, p); });
    const Fmt fmts[] = {Fmt::bf16, Fmt::mxfp4, Fmt::nvfp4};
    for (Fmt f : fmts)
        reg(std::string("hybrid_allmiss/") + fmt_name(f), [f](benchmark::State &s) { BM_hybrid_allmiss(s, f); });
    for (Fmt fmt : fmts) {
        for (double f : sweep_points()) {
            char name[64];
            std::snprintf(name, sizeof name, "hybrid_sweep_%s/f%.2f", fmt_name(fmt), f);
            reg(name, [fmt, f](benchmark::State &s) { BM_hybrid_sweep(s, fmt, f); });
        }
        reg(std::string("hybrid_adaptive_vs_sweep/") + fmt_name(fmt), [fmt](benchmark::State &s) { BM_hybrid_adaptive_vs_sweep(s, fmt); });
    }
    for (int p : {30, 70}) {
        const std::string h = "/hit" + std::to_string(p);
        reg("compare_bf16" + h + "/cpu", [p](benchmark::State &s) { BM_compare(s, p, FT_BACKEND_CPU); });
        reg("compare_bf16" + h + "/offload", [p](benchmark::State &s) { BM_compare(s, p, FT_BACKEND_OFFLOAD); });
        reg("compare_bf16" + h + "/hybrid", [p](benchmark::State &s) { BM_compare(s, p, FT_BACKEND_HYBRID); });
    }
}

}  // namespace

int main(int argc, char **argv) {
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--quick") == 0) g_quick = true;
        else argv[kept++] = argv[i];
    }
    argc = kept;
    argv[argc] = nullptr;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        cudaGetLastError();
        std::printf("bench_backends: skipped: no usable CUDA device\n");
        return 0;
    }
    std::printf(
        "# bench_backends%s: Time = wall time per MoE layer call (bs=1, ft_decode_cuda; cpu: ft_decode).\n"
        "# bound_us: the lower bound from bandwidths measured in this run (see the source's head);\n"
        "# ratio = bound_us / us_per_layer; hit_rate = hits / (hits + misses) from ft_session_get_stats;\n"
        "# f = hybrid fetch fraction at the end; routes_cpu_share = routes_cpu / all routes.\n"
        "# adaptive_vs_sweep: bound_us = best_us, the fastest fixed f of the sweep (within_5pct = 1 if met).\n",
        g_quick ? " --quick" : "");
    std::fflush(stdout);
    const auto t0 = Clock::now();
    register_all();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    Context::get().teardown();
    benchmark::Shutdown();
    std::fprintf(stderr, "bench_backends: done in %.1f s\n", seconds_since(t0));
    return 0;
}
