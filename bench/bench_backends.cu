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
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench_backends.cuh"

namespace backends_bench {
bool g_quick = false;
}  // namespace backends_bench

using namespace backends_bench;

namespace {

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
