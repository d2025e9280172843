// Decode traces through the GPU backends (offload, hybrid) and the CPU backend, against per-step
// bounds from bandwidths measured in the same run, and the slot cache policies against Belady.
//
//   bench_trace [--geometry qwen3|dsv3|gptoss|nvfp4|all] [--steps N] [--warmup N] [--s S]
//               [--repeat R[,R...]] [--seed N] [--trace FILE] [--cache-fraction F]
//               [--policy lru|frequency|both] [--half-life STEPS]
//               [--methods offload,hybrid,cpu,resident,gpu] [--layers N] [--wait spin|block]
//               [--threads N]
//
// resident: offload with a slot cache of every expert (after the warm-up nearly every call hits),
// which isolates the fixed cost of a layer call; gpu: the `gpu` backend (every expert resident, no
// admission or gather), the decode kernels' own fixed cost. Every row also gives the time above its bound
// per layer call ("over/layer"): the per-layer overhead (admission, plan, gather launch, combine,
// handoff) that the bandwidths do not explain, and the host time inside each ft_decode_cuda call
// ("host us/call": validation and enqueue; the GPU runs behind it unless that is the longer).
// --threads sets the engine's CPU worker count (default 0: the engine's choice). Each row's note
// ends with the share of CPU time the hypervisor stole during its timed steps (/proc/stat), which
// tells a contended virtual machine from a slow method.
//
// Trace: a Zipf(s) decode trace (ft/trace.hpp: a popularity permutation per layer, top-k
// distinct, `repeat` = temporal locality) or a file recorded with FT_TRACE_ROUTES (its geometry
// must match the model's). One token per ft_decode_cuda call (ft_decode for cpu), one call per
// layer, a stream synchronisation per token (polling the token's event, or blocking with --wait block).
//
// Measured here, before they are used: h2d (pinned H2D copies), hbm (a streaming device read),
// and for hybrid pcie_ov / cpu_ov: pinned H2D copies and an FT_BACKEND_CPU session decoding the
// same trace at the same time (bytes moved / wall time, each side). With distinct hits and misses
// per token from ft_session_get_stats and eb = bytes of one expert:
//   offload bound = misses * eb / h2d + hits * eb / hbm
//   hybrid bound  = misses * eb / (pcie_ov + cpu_ov) + hits * eb / hbm
//   cpu bound     = (distinct experts) * eb / cpu_alone
// summed over the measured steps (every term is linear in a step's counts, so the sum of per-step
// bounds is the bound of the sums). ratio = bound / measured (1.0 = at the bound).
//
// Simulated on the host for the same trace and slot count: Belady's optimal hit rate, LRU, and the
// session's policy; the device's measured offload hit rate should equal the simulation of its
// policy over the same calls (the bench prints both). Without a usable GPU it says so and exits 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "freetoken.h"
#include "freetoken_cuda.h"
#include "ft/slot_sim.hpp"
#include "ft/synth.hpp"
#include "ft/trace.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void ft_ok(ft_status s, const char *what, const char *detail) {
    if (s != FT_OK)
        throw std::runtime_error(std::string(what) + ": " + ft_status_string(s) +
                                 (detail && *detail ? std::string(" (") + detail + ")" : ""));
}

struct DeviceMem {
    void *p = nullptr;
    explicit DeviceMem(size_t bytes) { cuda_ok(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc"); }
    ~DeviceMem() { cudaFree(p); }
    DeviceMem(const DeviceMem &) = delete;
    DeviceMem &operator=(const DeviceMem &) = delete;
};
struct PinnedMem {
    void *p = nullptr;
    explicit PinnedMem(size_t bytes) { cuda_ok(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc"); }
    ~PinnedMem() { cudaFreeHost(p); }
    PinnedMem(const PinnedMem &) = delete;
    PinnedMem &operator=(const PinnedMem &) = delete;
};
struct Stream {
    cudaStream_t s = nullptr;
    Stream() { cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
    ~Stream() { cudaStreamDestroy(s); }
};
struct Event {
    cudaEvent_t e = nullptr;
    Event() { cuda_ok(cudaEventCreate(&e), "cudaEventCreate"); }
    ~Event() { cudaEventDestroy(e); }
};
struct SessionDeleter {
    void operator()(ft_session *s) const { ft_session_free(s); }
};
using Session = std::unique_ptr<ft_session, SessionDeleter>;
struct ModelDeleter {
    void operator()(ft_model *m) const { ft_model_free(m); }
};
using Model = std::unique_ptr<ft_model, ModelDeleter>;

// ---- options and geometries ---------------------------------------------------------------------

struct Geometry {
    const char *name;
    const char *format;  // bf16 (built in memory), mxfp4, nvfp4 (synthetic checkpoints in /tmp)
    int layers, experts, top_k, hidden, intermediate;
};

// Layer counts keep the host banks within the GPU machine's memory and the synthetic checkpoints
// quick to write: Qwen3-30B-A3B in full (29 GB), DeepSeek-V3 experts at 4 layers (90 GB),
// gpt-oss-120b at 4 layers (7 GB), the nvfp4 model (Qwen3-30B-A3B experts) at 8 layers (3 GB).
const Geometry kGeometries[] = {
    {"qwen3", "bf16", 24, 128, 8, 2048, 768},
    {"dsv3", "bf16", 4, 256, 8, 7168, 2048},
    {"gptoss", "mxfp4", 4, 128, 4, 2880, 2880},
    {"nvfp4", "nvfp4", 8, 128, 8, 2048, 768},
};

struct Options {
    std::vector<const Geometry *> geometries;
    int64_t steps = 200, warmup = 100;
    double s = 1.0, fraction = 0.25;
    std::vector<double> repeats = {0.0};  // one Zipf trace per value, on the same model
    uint64_t seed = 1;
    std::string trace_file;
    std::vector<int32_t> policies = {FT_CACHE_LRU};  // offload and hybrid run once per policy
    int32_t half_life = 0;
    std::vector<std::string> methods = {"offload", "hybrid", "cpu"};
    int layers = 0;  // 0: the geometry's
    int threads = 0;  // engine CPU workers (0: the engine's default)
    bool spin = true;  // --wait block: the per-token wait blocks instead of polling the event
};

[[noreturn]] void usage(const std::string &why) {
    std::fprintf(stderr, "bench_trace: %s\n", why.c_str());
    std::exit(2);
}

Options parse(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage(a + " needs a value");
            return argv[++i];
        };
        if (a == "--geometry") {
            const std::string v = value();
            for (const Geometry &g : kGeometries)
                if (v == "all" || v == g.name) o.geometries.push_back(&g);
            if (o.geometries.empty()) usage("unknown geometry " + v + " (qwen3, dsv3, gptoss, nvfp4, all)");
        } else if (a == "--steps") {
            o.steps = std::atoll(value().c_str());
        } else if (a == "--warmup") {
            o.warmup = std::atoll(value().c_str());
        } else if (a == "--s") {
            o.s = std::atof(value().c_str());
        } else if (a == "--repeat") {
            o.repeats.clear();
            const std::string v = value();
            for (size_t at = 0; at <= v.size();) {
                const size_t end = std::min(v.find(',', at), v.size());
                o.repeats.push_back(std::atof(v.substr(at, end - at).c_str()));
                at = end + 1;
            }
        } else if (a == "--seed") {
            o.seed = std::strtoull(value().c_str(), nullptr, 10);
        } else if (a == "--trace") {
            o.trace_file = value();
        } else if (a == "--cache-fraction") {
            o.fraction = std::atof(value().c_str());
        } else if (a == "--policy") {
            const std::string v = value();
            o.policies.clear();
            if (v == "lru" || v == "both") o.policies.push_back(FT_CACHE_LRU);
            if (v == "frequency" || v == "both") o.policies.push_back(FT_CACHE_FREQUENCY);
            if (o.policies.empty()) usage("--policy lru, frequency or both");
        } else if (a == "--half-life") {
            o.half_life = std::atoi(value().c_str());
        } else if (a == "--wait") {
            const std::string v = value();
            if (v != "block" && v != "spin") usage("--wait is block or spin");
            o.spin = v == "spin";
        } else if (a == "--layers") {
            o.layers = std::atoi(value().c_str());
        } else if (a == "--threads") {
            o.threads = std::atoi(value().c_str());
        } else if (a == "--methods") {
            o.methods.clear();
            std::string v = value();
            for (size_t at = 0; at <= v.size();) {
                const size_t end = std::min(v.find(',', at), v.size());
                const std::string m = v.substr(at, end - at);
                if (m != "offload" && m != "hybrid" && m != "cpu" && m != "resident" && m != "gpu") usage("unknown method " + m);
                o.methods.push_back(m);
                at = end + 1;
            }
        } else {
            usage("unknown argument " + a);
        }
    }
    if (o.geometries.empty()) o.geometries.push_back(&kGeometries[0]);
    if (o.steps < 1 || o.warmup < 0) usage("--steps must be >= 1 and --warmup >= 0");
    if (o.threads < 0) usage("--threads must be >= 0");
    return o;
}

// ---- bandwidths measured in this run -------------------------------------------------------

__global__ void read_kernel(const int4 *p, size_t n, int *sink) {
    int acc = 0;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const int4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x1234567) *sink = acc;
}

constexpr size_t kCopyBytes = size_t(256) << 20;

struct Bandwidths {
    double h2d = 0, hbm = 0;  // bytes per second
};

// Best of three batches of `reps` operations, each timed with events on `s`.
template <typename F>
double best_rate(cudaStream_t s, double bytes_per_batch, F &&batch) {
    Event a, b;
    batch();  // warm-up
    double best = 0;
    for (int t = 0; t < 3; ++t) {
        cuda_ok(cudaEventRecord(a.e, s), "cudaEventRecord");
        batch();
        cuda_ok(cudaEventRecord(b.e, s), "cudaEventRecord");
        cuda_ok(cudaEventSynchronize(b.e), "timed batch");
        float ms = 0;
        cuda_ok(cudaEventElapsedTime(&ms, a.e, b.e), "cudaEventElapsedTime");
        best = std::max(best, bytes_per_batch / (ms * 1e-3));
    }
    return best;
}

Bandwidths measure_bandwidths() {
    Bandwidths bw;
    Stream s;
    {
        PinnedMem src(kCopyBytes);
        std::memset(src.p, 1, kCopyBytes);
        DeviceMem dst(kCopyBytes);
        bw.h2d = best_rate(s.s, 8.0 * kCopyBytes, [&] {
            for (int r = 0; r < 8; ++r) cuda_ok(cudaMemcpyAsync(dst.p, src.p, kCopyBytes, cudaMemcpyHostToDevice, s.s), "H2D");
        });
    }
    const size_t bytes = size_t(2) << 30;
    DeviceMem buf(bytes), sink(sizeof(int));
    cuda_ok(cudaMemsetAsync(buf.p, 1, bytes, s.s), "cudaMemset");
    int dev = 0, sms = 0;
    cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    bw.hbm = best_rate(s.s, 10.0 * bytes, [&] {
        for (int r = 0; r < 10; ++r)
            read_kernel<<<sms * 4, 512, 0, s.s>>>(static_cast<const int4 *>(buf.p), bytes / sizeof(int4), static_cast<int *>(sink.p));
        cuda_ok(cudaGetLastError(), "read kernel");
    });
    return bw;
}

// ---- models -------------------------------------------------------------------------------------

std::vector<uint16_t> random_weights(size_t n, uint64_t seed) {
    std::vector<uint16_t> v(n);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto &w : v) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        // sign, exponent 2^-7 .. 2^-5, mantissa: finite values of trained-weight magnitude
        w = uint16_t((((x >> 8) & 1u) << 15) | (0x78 + (x >> 16) % 3) << 7 | ((x >> 24) & 0x7f));
    }
    return v;
}

Model build_model(ft_engine *engine, const Geometry &g, int layers) {
    char err[512] = "";
    ft_model *m = nullptr;
    if (std::strcmp(g.format, "bf16") == 0) {
        ft_model_desc d;
        ft_model_desc_init(&d);
        d.num_layers = layers;
        d.num_experts = g.experts;
        d.top_k = g.top_k;
        d.hidden_size = g.hidden;
        d.intermediate_size = g.intermediate;
        d.format = FT_FORMAT_BF16;
        ft_ok(ft_model_create(engine, &d, &m, err, sizeof err), "ft_model_create", err);
        Model model(m);
        // A few random projections shared by the experts: the bytes differ per expert in address only.
        const size_t n = size_t(g.hidden) * g.intermediate;
        std::vector<std::vector<uint16_t>> variants;
        for (uint64_t i = 0; i < 3; ++i) variants.push_back(random_weights(n, i + 1));
        for (int l = 0; l < layers; ++l)
            for (int e = 0; e < g.experts; ++e)
                for (int p : {FT_PROJ_GATE, FT_PROJ_UP, FT_PROJ_DOWN})
                    ft_ok(ft_model_set_expert(m, l, e, p, variants[size_t(l + e + p) % 3].data(), n * 2),
                          "ft_model_set_expert", ft_model_last_error(m));
        ft_ok(ft_model_finalize(m), "ft_model_finalize", ft_model_last_error(m));
        return model;
    }
    ft::synth::Spec s;
    s.architecture = std::strcmp(g.format, "mxfp4") == 0 ? "gpt_oss" : "qwen3_moe";
    s.format = g.format;
    s.num_layers = layers;
    s.num_experts = g.experts;
    s.top_k = g.top_k;
    s.hidden = g.hidden;
    s.intermediate = g.intermediate;
    s.seed = 5;
    const std::string dir = std::string("/tmp/ft-bench-trace-") + g.name + "-L" + std::to_string(layers);
    if (!std::filesystem::exists(dir + "/.complete-v1")) {
        std::filesystem::remove_all(dir);
        std::fprintf(stderr, "bench_trace: writing the %s checkpoint to %s (once)\n", g.name, dir.c_str());
        ft::synth::write_checkpoint(dir, s);
        std::ofstream(dir + "/.complete-v1") << "ok\n";
    }
    ft_ok(ft_model_load(engine, dir.c_str(), nullptr, &m, err, sizeof err), "ft_model_load", err);
    return Model(m);
}

// ---- runs ---------------------------------------------------------------------------------------

// CPU time the hypervisor gave to other guests (steal) and all CPU time, in ticks, from the
// aggregate line of /proc/stat; zeros where it cannot be read.
struct CpuTicks {
    unsigned long long steal = 0, total = 0;
};
CpuTicks read_cpu_ticks() {
    CpuTicks t;
    std::ifstream f("/proc/stat");
    std::string cpu;
    unsigned long long v[8] = {};
    if (!(f >> cpu) || cpu != "cpu") return t;
    for (auto &x : v)
        if (!(f >> x)) return CpuTicks{};
    for (auto x : v) t.total += x;  // user nice system idle iowait irq softirq steal
    t.steal = v[7];
    return t;
}
double steal_share(const CpuTicks &a, const CpuTicks &b) {
    return b.total > a.total ? double(b.steal - a.steal) / double(b.total - a.total) : 0.0;
}

struct Run {
    double steal = 0;  // share of the CPU time stolen by the hypervisor during the timed steps
    double seconds_per_token = 0, hit_rate = 0, hits_per_token = 0, misses_per_token = 0;
    double pcie_bytes_per_token = 0, cpu_bytes_per_token = 0, fraction = 0;
    double host_seconds_per_call = 0;  // inside ft_decode_cuda / ft_decode: the enqueue (cpu: the compute)
};

// A session of the method whose slot cache holds `slots` experts (0: --cache-fraction of them); with
// `skip_oom`, none (and the library's message in *skip_oom) when the GPU cannot hold it: the
// resident method on a model larger than the GPU's memory.
Session open_session(ft_model *m, int32_t backend, const Options &o, int32_t policy = FT_CACHE_LRU, int64_t slots = 0,
                     std::string *skip_oom = nullptr) {
    ft_session_params p;
    ft_session_params_init(&p);
    p.backend = backend;
    p.max_tokens = 1;
    p.cache_slots = slots;
    p.cache_fraction = slots > 0 ? 0.0 : o.fraction;
    p.vram_reserve_bytes = 0;
    p.hybrid_adaptive = true;
    p.cache_policy = policy;
    p.cache_half_life = o.half_life;
    ft_session *s = nullptr;
    char err[512] = "";
    const ft_status st = ft_session_create(m, &p, &s, err, sizeof err);
    if (st == FT_ERR_OUT_OF_MEMORY && skip_oom) {
        *skip_oom = err;
        return Session();
    }
    ft_ok(st, "ft_session_create", err);
    return Session(s);
}

// Decodes tokens [first, first + count) of the trace (whole tokens: L calls each), a stream
// synchronisation per token. Returns the wall time.
struct Decoder {
    ft_session *s;
    const ft::RouteTrace &t;
    bool device;
    int H, K;
    std::vector<uint16_t> x, y;
    std::vector<float> w;
    std::vector<int32_t> ids;  // all calls, one token each
    double host_seconds = 0;   // summed over the calls of run(): time inside the library's call
    std::unique_ptr<DeviceMem> dx, dy, dids, dw;
    Stream stream;
    // Waits for a token by polling its event (`spin`, the default; a host thread that polls runs on
    // one of the cores the engine's pool leaves free, freetoken_cuda.h) or by blocking on it.
    cudaEvent_t token_done = nullptr;
    bool spin;  // set by the constructor

    Decoder(ft_session *session, const ft::RouteTrace &trace, int hidden, bool spin_wait = true)
        : s(session), t(trace), device(ft_session_backend(session) != FT_BACKEND_CPU), H(hidden), K(trace.top_k),
          spin(spin_wait) {
        x = random_weights(size_t(H), 9);
        y.resize(size_t(H));
        for (const auto &c : t.calls) ids.insert(ids.end(), c.ids.begin(), c.ids.begin() + K);  // token 0 of each call
        w.assign(ids.size(), 1.0f / float(K));
        if (device) {
            cuda_ok(cudaEventCreateWithFlags(&token_done, spin ? cudaEventDisableTiming : cudaEventBlockingSync | cudaEventDisableTiming),
                    "cudaEventCreate");
            dx = std::make_unique<DeviceMem>(x.size() * 2);
            dy = std::make_unique<DeviceMem>(y.size() * 2);
            dids = std::make_unique<DeviceMem>(ids.size() * 4);
            dw = std::make_unique<DeviceMem>(w.size() * 4);
            cuda_ok(cudaMemcpy(dx->p, x.data(), x.size() * 2, cudaMemcpyHostToDevice), "upload");
            cuda_ok(cudaMemcpy(dids->p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "upload");
            cuda_ok(cudaMemcpy(dw->p, w.data(), w.size() * 4, cudaMemcpyHostToDevice), "upload");
        }
    }
    ~Decoder() {
        if (token_done) cudaEventDestroy(token_done);
    }
    Decoder(const Decoder &) = delete;
    Decoder &operator=(const Decoder &) = delete;
    void wait() {
        cuda_ok(cudaEventRecord(token_done, stream.s), "cudaEventRecord");
        if (!spin) {
            cuda_ok(cudaEventSynchronize(token_done), "decode (stream)");
            return;
        }
        cudaError_t e;
        while ((e = cudaEventQuery(token_done)) == cudaErrorNotReady) {
        }
        cuda_ok(e, "decode (stream)");
    }
    double run(int64_t first_call, int64_t calls) {
        const auto t0 = Clock::now();
        for (int64_t c = first_call; c < first_call + calls; ++c) {
            const size_t r = size_t(c) * K;
            const int32_t layer = t.calls[size_t(c)].layer;
            const auto c0 = Clock::now();
            const ft_status st =
                device ? ft_decode_cuda(s, layer, 1, static_cast<uint16_t *>(dx->p), static_cast<int32_t *>(dids->p) + r,
                                        static_cast<float *>(dw->p) + r, static_cast<uint16_t *>(dy->p), stream.s)
                       : ft_decode(s, layer, 1, x.data(), ids.data() + r, w.data() + r, y.data());
            host_seconds += seconds_since(c0);
            ft_ok(st, "decode", ft_session_last_error(s));
            if (device && layer == t.layers - 1) wait();
        }
        if (device) wait();
        return seconds_since(t0);
    }
};

Run timed(ft_session *s, const ft::RouteTrace &t, int hidden, int64_t warm_calls, int64_t calls, double tokens, bool spin) {
    Decoder d(s, t, hidden, spin);
    d.run(0, warm_calls);
    ft_session_reset_stats(s);
    d.host_seconds = 0;
    const CpuTicks c0 = read_cpu_ticks();
    const double seconds = d.run(warm_calls, calls);
    const CpuTicks c1 = read_cpu_ticks();
    ft_ok(ft_session_status(s), "session status", ft_session_last_error(s));
    ft_session_stats st;
    st.struct_size = sizeof st;
    ft_ok(ft_session_get_stats(s, &st), "ft_session_get_stats", ft_session_last_error(s));
    Run r;
    r.steal = steal_share(c0, c1);
    r.seconds_per_token = seconds / tokens;
    const double active = double(st.cache_hits + st.cache_misses);
    r.hit_rate = active > 0 ? double(st.cache_hits) / active : 0.0;
    r.hits_per_token = double(st.cache_hits) / tokens;
    r.misses_per_token = d.device ? double(st.cache_misses) / tokens : double(st.experts_cpu) / tokens;
    r.pcie_bytes_per_token = double(st.fetched_bytes) / tokens;
    r.cpu_bytes_per_token = double(st.cpu_bytes) / tokens;
    r.fraction = st.hybrid_fraction;
    r.host_seconds_per_call = d.host_seconds / double(calls);
    return r;
}

// pcie_ov and cpu_ov: pinned copies on a copy stream while a CPU session decodes the trace.
struct Overlap {
    double cpu_alone = 0, pcie_ov = 0, cpu_ov = 0;
};

Overlap measure_overlap(ft_model *m, const ft::RouteTrace &t, int hidden, double h2d, const Options &o,
                        int64_t calls) {
    Overlap ov;
    Session cpu = open_session(m, FT_BACKEND_CPU, o);
    Decoder d(cpu.get(), t, hidden);
    d.run(0, std::min<int64_t>(calls, t.layers * 4));
    ft_session_reset_stats(cpu.get());
    const double alone = d.run(0, calls);
    ft_session_stats st;
    st.struct_size = sizeof st;
    ft_ok(ft_session_get_stats(cpu.get(), &st), "ft_session_get_stats", "");
    ov.cpu_alone = double(st.cpu_bytes) / alone;
    // Copies for about as long as the CPU run; the CPU decodes while they run.
    PinnedMem src(kCopyBytes);
    std::memset(src.p, 1, kCopyBytes);
    DeviceMem dst(kCopyBytes);
    Stream s;
    Event a, b;
    const int reps = std::max(4, int(std::ceil(alone * h2d / double(kCopyBytes))));
    cuda_ok(cudaEventRecord(a.e, s.s), "cudaEventRecord");
    for (int r = 0; r < reps; ++r) cuda_ok(cudaMemcpyAsync(dst.p, src.p, kCopyBytes, cudaMemcpyHostToDevice, s.s), "H2D");
    cuda_ok(cudaEventRecord(b.e, s.s), "cudaEventRecord");
    ft_session_reset_stats(cpu.get());
    int64_t done = 0;
    const auto t0 = Clock::now();
    while (cudaEventQuery(b.e) == cudaErrorNotReady && done + t.layers <= calls) {
        d.run(done, t.layers);
        done += t.layers;
    }
    const double cpu_seconds = seconds_since(t0);
    cuda_ok(cudaEventSynchronize(b.e), "H2D");
    float ms = 0;
    cuda_ok(cudaEventElapsedTime(&ms, a.e, b.e), "cudaEventElapsedTime");
    ft_ok(ft_session_get_stats(cpu.get(), &st), "ft_session_get_stats", "");
    ov.cpu_ov = double(st.cpu_bytes) / cpu_seconds;
    ov.pcie_ov = double(reps) * kCopyBytes / (ms * 1e-3);
    return ov;
}

// Runs every method on one trace of `model` (repeat: the Zipf trace's locality; ignored for a file).
void run_trace(ft_model *model, double eb, const Geometry &g, int layers, const Options &o, const Bandwidths &bw,
               double repeat) {
    ft::RouteTrace trace;
    if (!o.trace_file.empty()) {
        trace = ft::read_route_trace(o.trace_file);
        // One token per call: a recorded batch is replayed as its first token.
        for (auto &c : trace.calls) c.tokens = 1, c.ids.resize(size_t(trace.top_k));
        if (trace.layers != layers || trace.experts != g.experts || trace.top_k != g.top_k)
            throw std::runtime_error("the trace's geometry (layers " + std::to_string(trace.layers) + ", experts " +
                                     std::to_string(trace.experts) + ", top_k " + std::to_string(trace.top_k) +
                                     ") is not " + g.name + "'s");
    } else {
        ft::ZipfTraceSpec z;
        z.layers = layers;
        z.experts = g.experts;
        z.top_k = g.top_k;
        z.steps = o.warmup + o.steps;
        z.s = o.s;
        z.repeat = repeat;
        z.seed = o.seed;
        trace = ft::make_zipf_trace(z);
    }
    const int64_t total = int64_t(trace.calls.size());
    const int64_t warm = std::min<int64_t>(o.warmup * layers, total / 2);
    const int64_t calls = total - warm;
    const double tokens = double(calls) / layers;

    // The slot count of the offload and hybrid sessions, given to them as cache_slots: the fraction
    // of all experts, at least one layer (the library refuses a fraction that gives fewer).
    const int64_t all = int64_t(layers) * g.experts;
    const auto slots = int32_t(std::clamp<int64_t>(int64_t(std::ceil(o.fraction * double(all))), g.experts, all));
    const ft::SlotPolicy frequency{ft::SlotPolicyKind::Frequency,
                                   int64_t(o.half_life > 0 ? o.half_life : ft::kDefaultHalfLifeSteps) * layers};
    const ft::CacheSim belady = ft::simulate_belady(trace, slots);
    const ft::CacheSim lru = ft::simulate_slot_cache(trace, slots, {});
    const ft::CacheSim freq = ft::simulate_slot_cache(trace, slots, frequency);
    // Hit rates over the measured calls only (the warm-up fills the cache).
    auto measured_rate = [&](const ft::CacheSim &c) {
        int64_t req = 0, miss = 0;
        for (int64_t i = warm; i < total; ++i) {
            const auto &ids = trace.calls[size_t(i)].ids;
            std::vector<int32_t> d;
            for (int32_t id : ids)
                if (id >= 0) d.push_back(id);
            std::sort(d.begin(), d.end());
            req += std::unique(d.begin(), d.end()) - d.begin();
            miss += c.call_misses[size_t(i)];
        }
        return req > 0 ? 1.0 - double(miss) / double(req) : 0.0;
    };
    const double r_belady = measured_rate(belady), r_lru = measured_rate(lru), r_freq = measured_rate(freq);
    std::printf("trace: %s, %lld tokens measured after %lld; %d slots (%.0f%%)\n",
                o.trace_file.empty() ? ("zipf s " + std::to_string(o.s) + " repeat " + std::to_string(repeat)).c_str()
                                     : o.trace_file.c_str(),
                (long long)(calls / layers), (long long)(warm / layers), slots, 100.0 * slots / double(all));
    std::printf("simulated hit rate (measured steps): belady %.4f, lru %.4f (%.3f of belady), frequency h=%lld calls %.4f "
                "(%.3f of belady)\n",
                r_belady, r_lru, r_lru / r_belady, (long long)frequency.half_life, r_freq, r_freq / r_belady);

    std::printf("| method | policy | ms/token | hit rate | PCIe MB/token | CPU MB/token | bound ms/token | ratio | over/layer us | host us/call | note |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    Overlap ov;
    for (const std::string &method : o.methods)
      for (const int32_t policy : method == "cpu" || method == "resident" || method == "gpu" ? std::vector<int32_t>{FT_CACHE_LRU} : o.policies) {
        const bool resident = method == "resident" || method == "gpu";
        const int32_t backend = method == "offload" || method == "resident" ? FT_BACKEND_OFFLOAD
                                : method == "gpu"                           ? FT_BACKEND_GPU
                                : method == "hybrid"                        ? FT_BACKEND_HYBRID
                                                                            : FT_BACKEND_CPU;
        if ((method == "hybrid" || method == "cpu") && ov.cpu_alone == 0)
            ov = measure_overlap(model, trace, g.hidden, bw.h2d, o, std::min<int64_t>(calls, 32 * layers));
        std::string oom;
        Session s = open_session(model, backend, o, policy, resident ? all : slots, resident ? &oom : nullptr);
        const char *policy_name = method == "cpu" || method == "gpu" ? "-" : policy == FT_CACHE_FREQUENCY ? "frequency" : "lru";
        if (!s) {
            std::printf("| %s | %s | - | - | - | - | - | - | - | - | skipped, every expert does not fit the GPU: %s |\n",
                        method.c_str(), policy_name, oom.c_str());
            continue;
        }
        const Run r = timed(s.get(), trace, g.hidden, warm, calls, tokens, o.spin);
        double bound = 0;
        char note[160] = "";
        if (method == "offload" || resident) {
            bound = r.misses_per_token * eb / bw.h2d + r.hits_per_token * eb / bw.hbm;
            // The device's hit rate must equal the simulation of its policy on the same calls.
            if (resident)
                std::snprintf(note, sizeof note, "h2d %.1f GB/s, hbm %.0f GB/s; %s", bw.h2d / 1e9, bw.hbm / 1e9,
                              method == "gpu" ? "gpu backend" : "every expert has a slot");
            else
                std::snprintf(note, sizeof note, "h2d %.1f GB/s, hbm %.0f GB/s; simulated %.4f", bw.h2d / 1e9,
                              bw.hbm / 1e9, policy == FT_CACHE_FREQUENCY ? r_freq : r_lru);
        } else if (method == "hybrid") {
            bound = r.misses_per_token * eb / (ov.pcie_ov + ov.cpu_ov) + r.hits_per_token * eb / bw.hbm;
            std::snprintf(note, sizeof note, "pcie_ov %.1f + cpu_ov %.1f GB/s, f %.2f", ov.pcie_ov / 1e9, ov.cpu_ov / 1e9,
                          r.fraction);
        } else {
            bound = r.misses_per_token * eb / ov.cpu_alone;
            std::snprintf(note, sizeof note, "cpu alone %.1f GB/s", ov.cpu_alone / 1e9);
        }
        std::printf("| %s | %s | %.3f | %.4f | %.1f | %.1f | %.3f | %.2f | %.1f | %.1f | %s; steal %.1f%% |\n", method.c_str(), policy_name,
                    1e3 * r.seconds_per_token,
                    method == "cpu" ? 0.0 : r.hit_rate, r.pcie_bytes_per_token / 1e6, r.cpu_bytes_per_token / 1e6, 1e3 * bound,
                    bound / r.seconds_per_token, 1e6 * (r.seconds_per_token - bound) / layers, 1e6 * r.host_seconds_per_call, note,
                    100.0 * r.steal);
        std::fflush(stdout);
    }
}

void run_geometry(ft_engine *engine, const Geometry &g, const Options &o, const Bandwidths &bw) {
    const int layers = o.layers > 0 ? o.layers : g.layers;
    const auto t0 = Clock::now();
    Model model = build_model(engine, g, layers);
    ft_model_info info;
    info.struct_size = sizeof info;
    ft_ok(ft_model_get_info(model.get(), &info), "ft_model_get_info", ft_model_last_error(model.get()));
    const double eb = double(info.expert_bytes);
    std::printf("\n## %s (%s, H %d, I %d, E %d, k %d, %d layers, %.1f MB per expert; model ready in %.0f s)\n", g.name,
                g.format, g.hidden, g.intermediate, g.experts, g.top_k, layers, eb / 1e6, seconds_since(t0));

    if (!o.trace_file.empty()) {
        run_trace(model.get(), eb, g, layers, o, bw, 0.0);
        return;
    }
    for (double repeat : o.repeats) run_trace(model.get(), eb, g, layers, o, bw, repeat);
}

}  // namespace

int main(int argc, char **argv) {
    const Options o = parse(argc, argv);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        std::printf("bench_trace: no usable CUDA device; nothing to measure\n");
        return 0;
    }
    try {
        ft_engine_params p;
        ft_engine_params_init(&p);
        p.device = FT_DEVICE_AUTO;
        p.cpu_threads = o.threads;
        p.pin_threads = true;
        ft_engine *engine = nullptr;
        char err[512] = "";
        ft_ok(ft_engine_create(&p, &engine, err, sizeof err), "ft_engine_create", err);
        std::unique_ptr<ft_engine, void (*)(ft_engine *)> guard(engine, ft_engine_free);
        const Bandwidths bw = measure_bandwidths();
        std::printf("bandwidths: pinned H2D %.1f GB/s, device read %.0f GB/s\n", bw.h2d / 1e9, bw.hbm / 1e9);
        for (const Geometry *g : o.geometries) run_geometry(engine, *g, o, bw);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "bench_trace: %s\n", e.what());
        return 1;
    }
    return 0;
}
