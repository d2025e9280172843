// CPU expert GEMV bandwidth. Every benchmark streams weights from a rotating window of experts
// several times larger than the last-level cache, so it measures DRAM, and reports GB/s of
// weight bytes next to the STREAM-style read bandwidth of the same worker pool
// (ratio_to_read). Flags (removed before Google Benchmark sees argv):
//   --short            small windows (also FT_BENCH_SHORT=1), for CI-sized machines
//   --threads=N        pool size (default: one per physical core; also FT_BENCH_THREADS)
//   --budget=S         seconds for the whole run (default 140): a benchmark that would start
//                      later is skipped and named in the summary
// --benchmark_min_time defaults to 0.2 s per benchmark. After the run a summary table lists, per
// format and batch, GB/s, the interleaved read bound, their ratio, bs / bs=1 and µs per token.
// FT_BENCH_WINDOW_MB sets the window size in MiB; FT_BENCH_HUGEPAGES=0 keeps 4 KiB pages;
// FT_BENCH_MXFP4_SCALE=c fills mxfp4's e8m0 scales with codes c .. c + 7 (default 120, see
// e8m0_scale_base), FT_BENCH_DS_FP4_SCALE=c ds_fp4's, FT_BENCH_FP8_SCALE=e fp8_block's bf16
// scales with exponents e .. e + 7 (default 113, see fp8_scale_base). kernel_<format> benchmarks:
// the quantised formats' kernels on in-cache weights in thread CPU time, their compute ceiling next
// to the read bound.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "ft/formats.hpp"
#include "quant.hpp"  // cpu/src: the format kernels, for the in-cache kernel benchmarks

namespace {

using Clock = std::chrono::steady_clock;

bool g_short = false;
int g_threads = 0;
double g_budget_s = 140;
const Clock::time_point g_start = Clock::now();

// One summary row per default-path layer benchmark (moe_layer, moe_layer_<format>), the last run
// of each (Google Benchmark may call a benchmark more than once), in the order they first ran.
struct SummaryRow {
    std::string format, shape, kernel;
    int64_t bs;
    double gbps, read, us_per_layer;
};
std::vector<SummaryRow> g_summary;
std::vector<std::string> g_skipped;

void add_summary(const SummaryRow &r) {
    for (SummaryRow &o : g_summary)
        if (o.format == r.format && o.shape == r.shape && o.bs == r.bs) {
            o = r;
            return;
        }
    g_summary.push_back(r);
}

// False (and the benchmark skipped, named in the summary) once the run is past its budget.
bool within_budget(benchmark::State &state, const std::string &name) {
    if (std::chrono::duration<double>(Clock::now() - g_start).count() < g_budget_s) return true;
    if (std::find(g_skipped.begin(), g_skipped.end(), name) == g_skipped.end()) g_skipped.push_back(name);
    state.SkipWithError("past the run's --budget");
    return false;
}

// FT_BENCH_WINDOW_MB overrides, e.g. to check that a larger window does not change the result
// (a last-level cache that keeps part of a cyclic scan would make small windows look faster).
// By default 32x the last-level cache (at least 2 GiB, at most a quarter of the memory): the
// GPU machine's 315 MB L3 still served part of a 2 GiB cyclic window (ratios up to 1.3), not
// of a 12 GiB one.
size_t window_bytes() {
    const std::string mb = ft::env_string("FT_BENCH_WINDOW_MB");
    if (!mb.empty()) return size_t(std::max(64L, std::atol(mb.c_str()))) << 20;
    if (g_short) return size_t(256) << 20;
    const size_t phys = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGESIZE));
    const size_t want = std::max(size_t(2) << 30, 32 * ft::cpu::last_level_cache_bytes());
    return std::max(size_t(256) << 20, std::min(want, phys / 4));
}

ft::cpu::ThreadPool &pool() {
    static ft::cpu::ThreadPool p(g_threads, true, ft::read_tuning(false).cpu_spin_us);
    return p;
}

// Page-aligned buffer filled (in parallel, which also places pages near the workers) with
// finite bf16 values of moderate magnitude.
struct Buffer {
    uint16_t *data = nullptr;
    size_t elems = 0;
    explicit Buffer(size_t n) : elems(n) {
        // Transparent huge pages as the library's banks ask for them (lib/core/bank: MADV_HUGEPAGE
        // above 2 MiB), before the first touch. Without them mxfp4's transposed layout, one
        // 64-byte line per K row of an item at a stride of N bytes, takes a TLB miss per line.
        // FT_BENCH_HUGEPAGES=0: 4 KiB pages (the earlier runs).
        const bool huge = n * 2 >= (size_t{2} << 20) && ft::env_string("FT_BENCH_HUGEPAGES") != "0";
        const size_t align = huge ? size_t{2} << 20 : 4096;
        const size_t bytes = (n * 2 + align - 1) / align * align;
        data = static_cast<uint16_t *>(std::aligned_alloc(align, bytes));
        if (!data) throw std::bad_alloc();
        if (huge) madvise(data, bytes, MADV_HUGEPAGE);
        pool().run([&](int w, int nw) {
            size_t a = n * w / nw, b = n * (w + 1) / nw;
            uint64_t s = 0x9e3779b97f4a7c15ull * (w + 1);
            for (size_t i = a; i < b; ++i) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                data[i] = uint16_t((s & 0x807f) | 0x3c00);  // +-[2^-7, 2^-6)
            }
        });
    }
    ~Buffer() { std::free(data); }
};

// The read bandwidth of the pool (best over probe shapes), the bound every ratio refers to.
double read_bandwidth() {
    static const double bw = ft::cpu::measure_read_bandwidth(pool(), window_bytes()) / 1e9;
    return bw;
}

// The read bandwidth of this benchmark's own window (up to 2 GiB of it, still far above any
// cache), taken before and after the timed loop: on a shared machine the bound moves between
// runs, so each ratio is to the memory it actually streamed, measured in the same run. `shape`,
// if given, receives the read shape (streams, spacing, prefetch) of that best pass.
double window_read_gbps(const void *p, size_t bytes, ft::cpu::ReadProbe *shape = nullptr) {
    bytes = std::min(bytes, size_t(2) << 30) / 4096 * 4096;
    return ft::cpu::best_read_bandwidth(pool(), static_cast<const uint8_t *>(p), bytes, 1, shape) / 1e9;
}

// Single-stream read without prefetch, for comparison with the best probe (read_GBps).
void BM_stream_read(benchmark::State &state) {
    Buffer buf(window_bytes() / 2);
    double bytes = 0, secs = 0;
    for (auto _ : state) {
        auto t0 = Clock::now();
        ft::cpu::read_pass(pool(), reinterpret_cast<uint8_t *>(buf.data), buf.elems * 2);
        double s = std::chrono::duration<double>(Clock::now() - t0).count();
        state.SetIterationTime(s);
        secs += s;
        bytes += buf.elems * 2;
    }
    state.counters["GBps"] = bytes / secs / 1e9;
    state.counters["read_GBps"] = read_bandwidth();
    state.counters["threads"] = pool().size();
}

// The timed part shared by the layer benchmarks: each iteration is one MoE layer in which every
// token picks 8 distinct experts out of the next 16 of the window (as a router spreads a batch
// over a few dozen experts); the cursor then moves on, so weights never come from cache. GB/s
// counts bytes of distinct experts read.
// The bound (read_GBps): after every timed layer, untimed for the layer, the same number of bytes
// is read from `probe` (part of the same window, its own rotating cursor) in the read shape that
// won the probe before the loop, so the bound and the kernel see the same moments of a shared
// machine; ratio_to_read is the ratio of the two totals. read_best_GBps is the best single probe
// of the window when it was filled (a maximum over ~40 samples, so it reads high when the
// machine's bandwidth moves).
struct WindowBound {
    double best = 0;            // best single probe of the window when it was filled
    ft::cpu::ReadProbe shape;   // its read shape, used for the interleaved bound
};

WindowBound probe_window(const void *probe, size_t probe_bytes) {
    WindowBound b;
    b.best = window_read_gbps(probe, probe_bytes, &b.shape);
    return b;
}

void time_rotating_layers(benchmark::State &state, ft::cpu::MoeExecutor &ex, const ft::cpu::ExpertSource &src,
                          int32_t H, int32_t T, const void *probe, size_t probe_bytes, const WindowBound &wb) {
    const int32_t K = 8, P = 16, E = src.num_experts;
    const ft::cpu::ReadProbe shape = wb.shape;
    const size_t window = std::min(probe_bytes, size_t(2) << 30) / 4096 * 4096;
    size_t read_at = 0;
    double read_bytes = 0, read_secs = 0;
    Buffer x(size_t(T) * H);
    std::vector<uint16_t> y(size_t(T) * H);
    std::vector<int32_t> ids(size_t(T) * K);
    std::vector<float> w(size_t(T) * K, 0.125f);
    std::mt19937 rng(1);
    int32_t cursor = 0;
    double bytes = 0, secs = 0;
    for (auto _ : state) {
        for (int32_t t = 0; t < T; ++t) {
            std::vector<int32_t> pick(P);
            for (int32_t i = 0; i < P; ++i) pick[i] = (cursor + i) % E;
            std::shuffle(pick.begin(), pick.end(), rng);
            std::copy(pick.begin(), pick.begin() + K, ids.begin() + size_t(t) * K);
        }
        cursor = (cursor + P) % E;
        auto t0 = Clock::now();
        ft::cpu::MoeStats st = ex.run(src, nullptr, T, x.data, ids.data(), w.data(), y.data());
        double s = std::chrono::duration<double>(Clock::now() - t0).count();
        state.SetIterationTime(s);
        secs += s;
        bytes += double(st.bytes_read);
        // The bound's sample for this layer: as many bytes, read the best way, right after it.
        const size_t n = std::min(window, std::max<size_t>(size_t(st.bytes_read) / 4096 * 4096, 4096));
        if (read_at + n > window) read_at = 0;
        const double rate = ft::cpu::read_pass(pool(), static_cast<const uint8_t *>(probe) + read_at, n, shape);
        read_at += n;
        read_bytes += double(n);
        read_secs += double(n) / rate;
    }
    const double gbps = bytes / secs / 1e9;
    const double read = read_secs > 0 ? read_bytes / read_secs / 1e9 : 0.0;
    const double best = wb.best;
    state.counters["GBps"] = gbps;
    state.counters["read_GBps"] = read;
    state.counters["ratio_to_read"] = read > 0 ? gbps / read : 0.0;
    state.counters["read_best_GBps"] = best;
    state.counters["ratio_to_best"] = gbps / best;
    state.counters["us_per_layer"] = secs / state.iterations() * 1e6;
}

// bf16 MoE layers through MoeExecutor (K=8), see time_rotating_layers.
// Args: H, I, tokens, onednn (0: SIMD kernels only, 1: oneDNN from 16 routes per expert).
void BM_moe_layer(benchmark::State &state) {
    const int32_t H = int32_t(state.range(0)), I = int32_t(state.range(1)), T = int32_t(state.range(2));
    const bool onednn = state.range(3) != 0;
    if (!within_budget(state, "moe_layer " + std::to_string(H) + "x" + std::to_string(I) + " bs=" + std::to_string(T) +
                                  (onednn ? " onednn" : ""))) return;
    const int32_t K = 8, P = 16;
    const size_t expert_elems = size_t(3) * H * I;
    const int32_t E = int32_t(std::max<size_t>(2 * P, window_bytes() / (expert_elems * 2)));
    Buffer gate_up(size_t(E) * 2 * H * I), down(size_t(E) * H * I);
    const WindowBound wb = probe_window(gate_up.data, gate_up.elems * 2);
    ft::cpu::ExpertSource src;
    src.format = ft::Format::bf16;
    src.num_experts = E;
    src.num_banks = 2;
    src.base[0] = reinterpret_cast<uint8_t *>(gate_up.data);
    src.row_bytes[0] = size_t(2) * H * I * 2;
    src.base[1] = reinterpret_cast<uint8_t *>(down.data);
    src.row_bytes[1] = size_t(H) * I * 2;
    // The engine's knobs as the environment sets them (docs/knobs.md), then this benchmark's choice.
    ft::cpu::MoeTuning tuning = ft::cpu::moe_tuning(ft::read_tuning(false));
    tuning.onednn_min_tokens = onednn ? 16 : 0;
    ft::cpu::MoeExecutor ex(pool(), ft::Format::bf16, H, I, K, T, {}, 0, ft::cpu::default_isa(), tuning);
    time_rotating_layers(state, ex, src, H, T, gate_up.data, gate_up.elems * 2, wb);
    const std::string label =
        std::string(ft::cpu::isa_name(ft::cpu::default_isa())) + (ex.amx_gemv() ? "+amx" : "") + (onednn ? "+onednn" : "");
    state.SetLabel(label);
    if (!onednn)
        add_summary({"bf16", std::to_string(H) + "x" + std::to_string(I), label, T, state.counters["GBps"],
                             state.counters["read_GBps"], state.counters["us_per_layer"]});
}

// The e8m0 scale codes of mxfp4 and ds_fp4 weights in the benchmarks are base + (random & 7). The
// base comes from FT_BENCH_MXFP4_SCALE / FT_BENCH_DS_FP4_SCALE; the default 120 (factors 2^-7 ..
// 2^0) is the range of real checkpoints. Small bases give subnormal factors and products, which
// Intel cores handle by microcode assists: the kernels' worst case (0 for the extreme).
uint8_t e8m0_scale_base(ft::Format f) {
    const std::string sc = ft::env_string(f == ft::Format::ds_fp4 ? "FT_BENCH_DS_FP4_SCALE" : "FT_BENCH_MXFP4_SCALE");
    return sc.empty() ? uint8_t(120) : uint8_t(std::atoi(sc.c_str()));
}

// fp8_block's bf16 scale_inv values in the benchmarks: 2^(e - 127) times a random mantissa, e =
// base + (random & 7). The base comes from FT_BENCH_FP8_SCALE; the default 113 (2^-14 .. 2^-6)
// covers real checkpoints (amax / 448 of blocks whose largest weight is 1e-3 .. 1). Bytes masked by
// 0x77 would give exponents down to bf16 subnormals, whose subnormal products Intel cores handle by
// microcode assists (small bases reproduce that: the kernels' worst case).
uint8_t fp8_scale_base() {
    const std::string sc = ft::env_string("FT_BENCH_FP8_SCALE");
    return sc.empty() ? uint8_t(113) : uint8_t(std::atoi(sc.c_str()));
}

// Fills [p, p + n) (n even) with bf16 scale_inv values from random bytes, as fp8_scale_base says.
void fill_fp8_scales(uint8_t *p, size_t n, uint8_t base) {
    for (size_t i = 0; i + 1 < n; i += 2) {
        const uint32_t e = uint32_t(base) + (p[i + 1] & 7u), m = p[i] & 0x7fu;
        const uint16_t v = uint16_t((e & 0xffu) << 7 | m);
        p[i] = uint8_t(v), p[i + 1] = uint8_t(v >> 8);
    }
}

// The window of a quantised format: the same rotating window and routing as BM_moe_layer, banks
// in the format's schema filled with bytes masked by 0x77 (no e4m3 NaN codes, moderate fp16
// scales), e8m0 scales as e8m0_scale_base says, fp8_block's scales as fp8_scale_base says. Kept
// for the next benchmark of the same (format, H, I) (the batch sizes of a format run one after
// another), so each window is filled and probed once.
struct FormatWindow {
    ft::Format f;
    int64_t H = 0, I = 0;
    std::vector<std::unique_ptr<Buffer>> banks;
    ft::cpu::ExpertSource src;
    WindowBound bound;
};

const FormatWindow &format_window(ft::Format f, int32_t H, int32_t I) {
    static std::unique_ptr<FormatWindow> cur;
    if (cur && cur->f == f && cur->H == H && cur->I == I) return *cur;
    cur.reset();  // free the previous window before filling the next
    cur = std::make_unique<FormatWindow>();
    cur->f = f, cur->H = H, cur->I = I;
    const int32_t P = 16;
    const auto schema = ft::bank_schema(f, H, I);
    const size_t per_expert = ft::expert_bytes(f, H, I);
    const int32_t E = int32_t(std::max<size_t>(2 * P, window_bytes() / per_expert));
    std::vector<std::unique_ptr<Buffer>> &banks = cur->banks;
    ft::cpu::ExpertSource &src = cur->src;
    src.format = f;
    src.num_experts = E;
    src.num_banks = int(schema.size());
    for (size_t b = 0; b < schema.size(); ++b) {
        banks.push_back(std::make_unique<Buffer>((schema[b].row_bytes * E + 1) / 2));
        uint8_t *p = reinterpret_cast<uint8_t *>(banks.back()->data);
        const size_t n = schema[b].row_bytes * E;
        // Scale banks: mxfp4 / ds_fp4 e8m0 codes e8m0_scale_base + (byte & 7), fp8_block bf16 values
        // by fill_fp8_scales; every other byte masked by 0x77.
        const bool scale_bank = schema[b].name.find("_scale") != std::string::npos;
        const bool e8m0 = (f == ft::Format::mxfp4 || f == ft::Format::ds_fp4) && scale_bank;
        const bool fp8_scales = f == ft::Format::fp8_block && scale_bank;
        const uint8_t base = fp8_scales ? fp8_scale_base() : e8m0_scale_base(f);
        pool().run([&](int w, int nw) {
            // Locals: stores through a uint8_t pointer may alias the captured variables, which would
            // keep the loop scalar (it dominated the run time of a benchmark).
            uint8_t *const q = p;
            const size_t lo = n * w / nw / 2 * 2, hi = n * (w + 1) / nw / 2 * 2;  // whole bf16 values
            if (fp8_scales) {
                fill_fp8_scales(q + lo, hi - lo, base);
            } else if (e8m0) {
                for (size_t i = lo; i < hi; ++i) q[i] = uint8_t(base + (q[i] & 7));
            } else {
                for (size_t i = lo; i < hi; ++i) q[i] = uint8_t(q[i] & 0x77);
            }
        });
        src.base[b] = p;
        src.row_bytes[b] = schema[b].row_bytes;
    }
    cur->bound = probe_window(src.base[0], src.row_bytes[0] * E);
    return *cur;
}

// BM_moe_layer for a quantised format (window: format_window). Args: format id (ft::Format), H,
// I, tokens, and the batched-path threshold (MoeTuning::quant_batched_min_tokens: 0 = direct
// kernels only, 1 = batched path for every expert; -1 = the default).
void BM_moe_layer_format(benchmark::State &state) {
    const ft::Format f = ft::Format(state.range(0));
    const int32_t H = int32_t(state.range(1)), I = int32_t(state.range(2)), T = int32_t(state.range(3));
    if (!within_budget(state, std::string("moe_layer_") + ft::format_name(f) + " bs=" + std::to_string(T) +
                                  " bmin=" + std::to_string(state.range(4)))) return;
    const int32_t K = 8;
    const FormatWindow &win = format_window(f, H, I);
    const ft::cpu::ExpertSource &src = win.src;
    const int32_t E = src.num_experts;
    ft::cpu::ActivationSpec act;
    if (f == ft::Format::mxfp4) act = {FT_ACT_SWIGLU_CLAMP, 1.702f, 7.0f};
    ft::cpu::MoeTuning tuning = ft::cpu::moe_tuning(ft::read_tuning(false));
    if (state.range(4) >= 0) tuning.quant_batched_min_tokens = int32_t(state.range(4));
    ft::cpu::MoeExecutor ex(pool(), f, H, I, K, T, act, 0, ft::cpu::default_isa(), tuning);
    time_rotating_layers(state, ex, src, H, T, src.base[0], src.row_bytes[0] * E, win.bound);
    const std::string label = std::string(ex.kernel_name()) +
        (ex.quant_batched_min_tokens() > 0
             ? "+batched>=" + std::to_string(ex.quant_batched_min_tokens()) + (ex.amx_gemv() ? "(amx)" : "")
             : "");
    state.SetLabel(label);
    if (state.range(4) < 0)
        add_summary({ft::format_name(f), std::to_string(H) + "x" + std::to_string(I), label, T,
                             state.counters["GBps"], state.counters["read_GBps"], state.counters["us_per_layer"]});
}

double thread_cpu_seconds() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The first 4 KiB page boundary at or after p.
uint8_t *page_start(uint8_t *p) { return p + (4096 - reinterpret_cast<uintptr_t>(p) % 4096) % 4096; }

// The compute ceiling of a quantised format's kernel (the default tier's, as the layers run it): 64
// rows of K = 2048 that stay in L2 (mxfp4: 64 columns, a tile of 64 of its kernels, which do per
// column what their tiles of 128 do), all tokens per call, on this thread, timed in thread CPU time
// (so other processes on a shared machine do not count). GBps_core: weight bytes per CPU second;
// ceiling_to_read = GBps_core x pool threads / read_GBps, the bound of the layer benchmarks: below
// 1 the kernel, not memory, limits the layer at that token count. Args: format id, tokens.
void BM_kernel_format(benchmark::State &state) {
    const ft::Format f = ft::Format(state.range(0));
    const int T = int(state.range(1));
    const int64_t K = 2048;
    const int N = 64;
    const ft::cpu::QuantOps *ops =
        ft::cpu::quant_ops(f, ft::cpu::default_isa(), ft::cpu::moe_tuning(ft::read_tuning(false)).quant);
    if (!ops) {
        state.SkipWithError("no kernel for this format");
        return;
    }
    // Weights, then the block scales and nvfp4's fp16 globals where the format has them (mxfp4:
    // [K/2][N] and [K/32][N]); random bytes & 0x77 keep fp16 scales and e4m3 codes finite;
    // e8m0 and fp8_block scales as the layers' (e8m0_scale_base, fp8_scale_base).
    size_t wbytes = 0, sbytes = 0, gbytes = 0;
    switch (f) {
        case ft::Format::fp8_block: wbytes = size_t(N) * K, sbytes = size_t((N + 127) / 128) * (K / 128) * 2; break;
        case ft::Format::nvfp4: wbytes = size_t(N) * K / 2, sbytes = size_t(N) * K / 16, gbytes = size_t(N) * 2; break;
        case ft::Format::ds_fp4:
        case ft::Format::mxfp4: wbytes = size_t(N) * K / 2, sbytes = size_t(N) * K / 32; break;
        default: wbytes = ft::block_row_bytes(f, K) * N; break;
    }
    // Weights and activations each at the start of a 4 KiB page (the library's banks are
    // page-aligned), so runs and builds compare at the same page offsets: moving the activations
    // by 64 bytes within the page changed these ceilings by up to 20 % on the dev box.
    const size_t total = wbytes + sbytes + gbytes;
    std::vector<uint8_t> wbuf(total + 4096);
    uint8_t *const w = page_start(wbuf.data());
    std::mt19937 rng(uint32_t(state.range(0) * 64 + T));
    for (size_t i = 0; i < total; ++i) w[i] = uint8_t(rng()) & 0x77;
    if (f == ft::Format::fp8_block) fill_fp8_scales(w + wbytes, sbytes, fp8_scale_base());
    if (f == ft::Format::mxfp4 || f == ft::Format::ds_fp4) {
        const uint8_t base = e8m0_scale_base(f);
        for (size_t i = wbytes; i < wbytes + sbytes; ++i) w[i] = uint8_t(base + (w[i] & 7));
    }
    for (size_t i = 0; i < gbytes; i += 2) w[wbytes + sbytes + i] = 0, w[wbytes + sbytes + i + 1] = 0x3c;  // 1.0
    // One line-rounded stride per token, as the executor keeps them.
    const size_t ab = (ops->act_bytes(K) + 63) / 64 * 64;
    std::vector<uint8_t> act(ab * size_t(T) + 4096);
    uint8_t *const act0 = page_start(act.data());
    std::vector<const uint8_t *> ap(static_cast<size_t>(T));
    std::vector<uint16_t> x(static_cast<size_t>(K));
    for (int t = 0; t < T; ++t) {
        for (uint16_t &v : x) v = uint16_t((rng() & 0x807f) | 0x3c00);  // bf16 +-[2^-7, 2^-6)
        uint8_t *dst = act0 + size_t(t) * ab;
        ops->prepare(x.data(), K, dst);
        ap[size_t(t)] = dst;
    }
    const ft::cpu::detail::QuantMatrix m{w, sbytes ? w + wbytes : nullptr,
                                         gbytes ? w + wbytes + sbytes : nullptr, K, N};
    std::vector<float> out(size_t(T) * N);
    double secs = 0;
    int64_t calls = 0;
    for (auto _ : state) {
        const double t0 = thread_cpu_seconds();
        for (int i = 0; i < 64; ++i) ops->gemv(m, 0, N, ap.data(), T, out.data(), N);
        const double s = thread_cpu_seconds() - t0;
        benchmark::DoNotOptimize(out.data());
        state.SetIterationTime(s);
        secs += s;
        calls += 64;
    }
    const double gbps = double(total) * double(calls) / secs / 1e9;
    state.counters["GBps_core"] = gbps;
    state.counters["ceiling_to_read"] = gbps * pool().size() / read_bandwidth();
    state.SetLabel(ops->kernel);
}

// M=1 GEMV of one expert's gate_up matrix [2I, H] over a rotating window: the SIMD kernel on the
// pool (rows split evenly) against oneDNN matmul on its OpenMP threads. Args: H, I, 0 = SIMD / 1 = oneDNN.
void BM_gemv_m1(benchmark::State &state) {
    const int32_t H = int32_t(state.range(0)), N = int32_t(2 * state.range(1));
    const bool onednn = state.range(2) != 0;
    const size_t mat = size_t(N) * H;
    const int32_t count = int32_t(std::max<size_t>(4, window_bytes() / (mat * 2)));
    Buffer wbuf(mat * count), x(H);
    std::vector<float> out(N);
    ft::cpu::GemvFn gemv = ft::cpu::gemv_kernel(ft::cpu::default_isa());
    const uint16_t *xp = x.data;
    int32_t cur = 0;
    double bytes = 0, secs = 0;
    for (auto _ : state) {
        const uint16_t *W = wbuf.data + mat * cur;
        cur = (cur + 1) % count;
        auto t0 = Clock::now();
        if (onednn) {
            ft::cpu::onednn_matmul_bf16(1, N, H, xp, H, W, H, out.data(), N);
        } else {
            pool().run([&](int wk, int nw) {
                // 32-row blocks handed out round-robin, as the executor's items are.
                for (int32_t r0 = wk * 32; r0 < N; r0 += nw * 32)
                    gemv(W + size_t(r0) * H, H, std::min(32, N - r0), H, &xp, 1, out.data() + r0, 1);
            });
        }
        double s = std::chrono::duration<double>(Clock::now() - t0).count();
        state.SetIterationTime(s);
        secs += s;
        bytes += mat * 2;
    }
    const double gbps = bytes / secs / 1e9;
    state.counters["GBps"] = gbps;
    state.counters["ratio_to_read"] = gbps / read_bandwidth();
    state.counters["threads"] = onednn ? ft::cpu::onednn_threads() : pool().size();
    state.SetLabel(onednn ? "onednn" : ft::cpu::isa_name(ft::cpu::default_isa()));
}

const int64_t kShapes[][2] = {{2048, 768}, {4096, 1536}, {7168, 2048}};

// Real expert shapes per quantised format: gpt-oss-120b, DeepSeek-V3, GLM-4.x, DeepSeek-V4, a
// GGUF Q4_0 model, Qwen3-30B-A3B for Q8_0 / Q4_K / Q5_K / Q6_K and GGUF low-bit K-quant / IQ4_XS models.
struct FormatShape {
    ft::Format f;
    int64_t H, I;
};
const FormatShape kFormatShapes[] = {{ft::Format::mxfp4, 2880, 2880},
                                     {ft::Format::fp8_block, 7168, 2048},
                                     {ft::Format::nvfp4, 5120, 1536},
                                     {ft::Format::ds_fp4, 4096, 2048},
                                     {ft::Format::q4_0, 2816, 704},
                                     // GGUF releases of Qwen3-30B-A3B (Q8_0, Q4_K_M / Q5_K_M / Q6_K mixes).
                                     {ft::Format::q8_0, 2048, 768},
                                     {ft::Format::q4_k, 2048, 768},
                                     {ft::Format::q5_k, 2048, 768},
                                     {ft::Format::q6_k, 2048, 768},
                                     {ft::Format::q2_k, 7168, 2048},   // DeepSeek-V3 low-bit GGUF
                                     {ft::Format::q3_k, 4096, 1536},   // Qwen3-235B-A22B Q3_K
                                     {ft::Format::iq4_xs, 2048, 768}};  // Qwen3-30B-A3B IQ4_XS

void register_all() {
    // The per-format rows of the summary first, so a --budget cut falls on the secondary ones.
    // bs 1, 2, 8, 32: every token picks 8 of 16 experts, so an expert gets ~bs / 2 tokens.
    for (const auto &fs : kFormatShapes)
        for (int64_t bs : {1, 2, 8, 32})
            benchmark::RegisterBenchmark((std::string("moe_layer_") + ft::format_name(fs.f)).c_str(), BM_moe_layer_format)
                ->Args({int64_t(fs.f), fs.H, fs.I, bs, -1})
                ->ArgNames({"fmt", "H", "I", "bs", "bmin"})
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("stream_read", BM_stream_read)->UseManualTime()->Unit(benchmark::kMillisecond);
    for (auto &s : kShapes)
        for (int64_t bs : {1, 8}) {
            benchmark::RegisterBenchmark("moe_layer", BM_moe_layer)
                ->Args({s[0], s[1], bs, 0})
                ->ArgNames({"H", "I", "bs", "onednn"})
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
        }
    // Batched path: many tokens per expert, SIMD kernels against oneDNN (decides the threshold).
    for (int64_t bs : {16, 32, 64, 128})
        for (int64_t od : {0, 1})
            benchmark::RegisterBenchmark("moe_layer_batched", BM_moe_layer)
                ->Args({2048, 768, bs, od})
                ->ArgNames({"H", "I", "bs", "onednn"})
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
    // Batched path of the quantised formats (many tokens per expert, tokens per expert ~ bs / 2
    // here): direct kernels (bmin 0) against dequantise-to-bf16 + bf16 GEMV for every expert
    // (bmin 1); decides the default threshold. Formats without a dequantiser run direct either way.
    for (const auto &fs : kFormatShapes)
        for (int64_t bs : {16, 32, 64})
            for (int64_t bmin : {0, 1})
                benchmark::RegisterBenchmark((std::string("moe_layer_batched_") + ft::format_name(fs.f)).c_str(),
                                             BM_moe_layer_format)
                    ->Args({int64_t(fs.f), fs.H, fs.I, bs, bmin})
                    ->ArgNames({"fmt", "H", "I", "bs", "bmin"})
                    ->UseManualTime()
                    ->Unit(benchmark::kMicrosecond);
    // Kernel compute ceilings of the quantised formats (in cache, one thread).
    for (ft::Format f : {ft::Format::fp8_block, ft::Format::nvfp4, ft::Format::ds_fp4, ft::Format::mxfp4,
                         ft::Format::q4_0, ft::Format::q8_0, ft::Format::q2_k, ft::Format::q3_k, ft::Format::q4_k,
                         ft::Format::q5_k, ft::Format::q6_k, ft::Format::iq4_xs})
        for (int64_t t : {1, 4, 8, 16})
            benchmark::RegisterBenchmark((std::string("kernel_") + ft::format_name(f)).c_str(), BM_kernel_format)
                ->Args({int64_t(f), t})
                ->ArgNames({"fmt", "tokens"})
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
    for (auto &s : kShapes)
        for (int64_t od : {0, 1})
            benchmark::RegisterBenchmark("gemv_m1", BM_gemv_m1)
                ->Args({s[0], s[1], od})
                ->ArgNames({"H", "I", "onednn"})
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
}

// The comparison table: per format and batch, GB/s, the interleaved read bound of the same
// benchmark, their ratio, GB/s relative to the same format's bs=1 row, and µs per token.
void print_summary() {
    std::printf("\nsummary (isa %s, %d threads; bs/bs1 = GB/s relative to bs=1 of the same format and shape)\n",
                ft::cpu::isa_name(ft::cpu::default_isa()), pool().size());
    std::printf("%-10s %-10s %4s %8s %8s %6s %7s %10s  %s\n", "format", "shape", "bs", "GB/s", "read", "ratio",
                "bs/bs1", "us/token", "kernel");
    std::map<std::string, double> bs1;
    for (const SummaryRow &r : g_summary)
        if (r.bs == 1) bs1[r.format + r.shape] = r.gbps;
    for (const SummaryRow &r : g_summary) {
        const auto it = bs1.find(r.format + r.shape);
        const double rel = it != bs1.end() && it->second > 0 ? r.gbps / it->second : 0.0;
        std::printf("%-10s %-10s %4lld %8.2f %8.2f %6.2f %7.2f %10.1f  %s\n", r.format.c_str(), r.shape.c_str(),
                    static_cast<long long>(r.bs), r.gbps, r.read, r.read > 0 ? r.gbps / r.read : 0.0, rel,
                    r.us_per_layer / double(r.bs), r.kernel.c_str());
    }
    // A benchmark cut after its first (one-iteration) call keeps that row above.
    for (const std::string &n : g_skipped) std::printf("skipped (past --budget=%g s): %s\n", g_budget_s, n.c_str());
    std::printf("total %.1f s\n", std::chrono::duration<double>(Clock::now() - g_start).count());
}

}  // namespace

int main(int argc, char **argv) {
    // The CPU knobs an engine would apply (docs/knobs.md): the kernels' prefetch distance.
    ft::cpu::set_prefetch_bytes(ft::read_tuning().cpu_prefetch);
    g_short = !ft::env_string("FT_BENCH_SHORT").empty() && ft::env_string("FT_BENCH_SHORT") != "0";
    if (!ft::env_string("FT_BENCH_THREADS").empty()) g_threads = std::atoi(ft::env_string("FT_BENCH_THREADS").c_str());
    // 0.2 s per benchmark unless the command line says otherwise (a later flag wins).
    static char min_time[] = "--benchmark_min_time=0.2";
    std::vector<char *> args{argv[0], min_time};
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--short") == 0) g_short = true;
        else if (std::strncmp(argv[i], "--threads=", 10) == 0) g_threads = std::atoi(argv[i] + 10);
        else if (std::strncmp(argv[i], "--budget=", 9) == 0) g_budget_s = std::atof(argv[i] + 9);
        else args.push_back(argv[i]);
    }
    int n = int(args.size());
    benchmark::Initialize(&n, args.data());
    register_all();
    benchmark::AddCustomContext("pool_threads", std::to_string(pool().size()));
    benchmark::AddCustomContext("isa", ft::cpu::isa_name(ft::cpu::default_isa()));
    benchmark::AddCustomContext("read_GBps", std::to_string(read_bandwidth()));
    benchmark::AddCustomContext("window_MiB", std::to_string(window_bytes() >> 20));
    benchmark::RunSpecifiedBenchmarks();
    print_summary();
    benchmark::Shutdown();
    return 0;
}
