// The profiler: every figure comes from the code production runs (the CPU read probe of ft_cpu,
// CUDA copies, the MoeExecutor), never from stand-ins, over working sets several times the
// last-level cache so that memory, not cache, is measured. The whole run is bounded by
// max_seconds: each phase gets a share of the time that is left and sizes its buffers and step
// counts from the figures measured before it. With a GPU, each format's window is also
// page-locked and gathered into device slots by the production zero-copy kernel, alone and while
// the CPU kernels run over the same banks (docs/formulas.md, "Bandwidth profile", steps 1 and 4).
#include "ft/profiler.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "ft/cuda_device.hpp"
#include "ft/dequant.hpp"
#include "gather_rig.hpp"

namespace ft {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kPcieBytes = 256 * kMiB;  // pinned linear copies
constexpr int kPcieMaxIters = 30;
constexpr int kWarmupSteps = 8;            // CPU expert steps
constexpr int kMaxTimedSteps = 64;
constexpr int kMinTimedSteps = 8;          // fewer would make the median a coin toss
constexpr int64_t kMaxExperts = 128;       // synthetic experts per format, at most, unless
constexpr int64_t kMaxSmallExperts = 1024;  // small experts need more to span 4 x LLC (this many at most)
// best_read_bandwidth tries 21 probe shapes per pass (cpu/src/membw.cpp); only used to predict
// how long a buffer size takes, so a change there costs accuracy of the bound, nothing else.
constexpr int kReadProbes = 21;
// Fraction of a format's time share its bank fill may take; the rest goes to the steps.
constexpr double kFillShare = 0.3;
// The phases' shares of the time budget, by weight.
constexpr double kReadWeight = 2.0, kPcieWeight = 1.0, kFormatWeight = 2.0;
// With a GPU a format's share grows by this weight for the gather and the overlapped pair, and
// the time after the bank fill is split: CPU steps, the gather alone, the two together.
constexpr double kGpuFormatWeight = 1.5;
constexpr double kCpuStepShare = 0.5, kGatherShare = 0.15;
// The gather window: at least this many experts (far beyond any L2), each call refills them all.
constexpr int64_t kMinGatherExperts = 64;
// The overlapped pair runs for at most the original's 2 s and at least long enough for many
// gathers and CPU steps to interleave.
constexpr double kMaxOverlapSeconds = 2.0, kMinOverlapSeconds = 0.2;
// Gathers enqueued per wait in the overlapped run: about this long, so the gather side stops
// close to the end of the window.
constexpr double kOverlapBatchSeconds = 0.02;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

const Format kAllFormats[] = {Format::bf16,  Format::fp8_block, Format::nvfp4, Format::mxfp4, Format::ds_fp4,
                              Format::q4_0,  Format::q8_0,      Format::q2_k,  Format::q3_k,  Format::q4_k,
                              Format::q5_k,  Format::q6_k,      Format::iq4_xs};

// Calls the progress callback; a false answer ends the run with FT_ERR_CANCELLED.
class Progress {
public:
    explicit Progress(const ft_profile_params &p) : fn_(p.progress), user_(p.progress_user_data) {}
    void operator()(const char *phase, uint64_t done, uint64_t total) const {
        if (fn_ && !fn_(user_, phase, done, total))
            fail(FT_ERR_CANCELLED, "profile: cancelled by the progress callback during \"", phase, "\"");
    }

private:
    ft_progress_fn fn_;
    void *user_;
};

// Memory available to the profiler now: MemAvailable, within the cgroup v2 limit if one is set.
size_t available_memory() {
    size_t avail = 0;
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    uint64_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib >> unit) {
        if (key == "MemAvailable:") {
            avail = static_cast<size_t>(kib) * 1024;
            break;
        }
    }
    if (avail == 0) {
        const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
        avail = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 4 * kGiB;
    }
    std::ifstream max_f("/sys/fs/cgroup/memory.max"), cur_f("/sys/fs/cgroup/memory.current");
    std::string max_s;
    uint64_t current = 0;
    if (max_f >> max_s && max_s != "max" && cur_f >> current) {
        const uint64_t limit = std::strtoull(max_s.c_str(), nullptr, 10);
        avail = std::min<size_t>(avail, limit > current ? static_cast<size_t>(limit - current) : 0);
    }
    return avail;
}

struct FreeDeleter {
    void operator()(uint8_t *p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<uint8_t, FreeDeleter>;

HostBuffer alloc_host(size_t bytes, const char *what) {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
    auto *p = static_cast<uint8_t *>(std::aligned_alloc(4096, rounded));
    if (!p) fail(FT_ERR_OUT_OF_MEMORY, "profile: cannot allocate ", rounded, " bytes for ", what);
    return HostBuffer(p);
}

// Runs fn(begin, end) over [0, n) split evenly across the workers, so each page is first
// touched by the worker that reads it later (the executor splits experts by rows the same way).
template <typename Fn>
void parallel_range(cpu::ThreadPool &pool, size_t n, Fn &&fn) {
    pool.run([&](int w, int nw) { fn(n * w / nw, n * (w + 1) / nw); });
}

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Random 64-bit words, each (r & keep) | set: the masks pin the bits that make a code valid.
// The word at index i depends only on (seed, i), so the split across workers does not matter.
void fill_random(cpu::ThreadPool &pool, uint8_t *p, size_t bytes, uint64_t seed, uint64_t keep, uint64_t set) {
    const size_t words = bytes / 8;
    parallel_range(pool, words, [&](size_t a, size_t b) {
        for (size_t i = a; i < b; ++i) {
            const uint64_t v = (splitmix64(seed ^ (i * 0xd1342543de82ef95ull)) & keep) | set;
            std::memcpy(p + 8 * i, &v, 8);
        }
    });
    for (size_t i = words * 8; i < bytes; ++i) p[i] = static_cast<uint8_t>((splitmix64(seed + i) & keep) | set);
}

void fill_u16(cpu::ThreadPool &pool, uint8_t *p, size_t bytes, uint16_t value) {
    parallel_range(pool, bytes / 2, [&](size_t a, size_t b) {
        for (size_t i = a; i < b; ++i) std::memcpy(p + 2 * i, &value, 2);
    });
}

void fill_u8(cpu::ThreadPool &pool, uint8_t *p, size_t bytes, uint8_t value) {
    parallel_range(pool, bytes, [&](size_t a, size_t b) { std::memset(p + a, value, b - a); });
}

// How a bank is filled so that every code is valid and the outputs stay finite: weights random,
// scales fixed at 1.0 (as the original bench sets them), biases zero; GGUF blocks random with
// small normal fp16 scales (gguf_blocks).
enum class Fill { codes, bf16_weights, e4m3_weights, bf16_one, e4m3_one, f16_one, e8m0_one, zero, gguf_blocks };

bool ends_with(const std::string &s, const char *suffix) {
    const size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

Fill fill_of(Format f, const std::string &bank) {
    switch (f) {
        case Format::bf16: return Fill::bf16_weights;
        case Format::fp8_block: return ends_with(bank, "_scale") ? Fill::bf16_one : Fill::e4m3_weights;
        case Format::nvfp4:
            if (ends_with(bank, "_scale")) return Fill::e4m3_one;
            if (ends_with(bank, "_global")) return Fill::f16_one;
            return Fill::codes;
        case Format::mxfp4:
            if (ends_with(bank, "_scales")) return Fill::e8m0_one;
            if (ends_with(bank, "_bias")) return Fill::zero;
            return Fill::codes;
        case Format::ds_fp4: return ends_with(bank, "_scale") ? Fill::e8m0_one : Fill::codes;
        case Format::q4_0: case Format::q8_0: case Format::q2_k: case Format::q3_k: case Format::q4_k: case Format::q5_k:
        case Format::q6_k: case Format::iq4_xs: return Fill::gguf_blocks;
    }
    return Fill::codes;
}

// The fp16 fields of a GGUF block (d, and dmin where the format has one: docs/formats.md) and
// the binade [2^e, 2^(e+1)) their values are drawn from. Everything else in a block is a code or
// an integer sub-block scale, valid at any bit pattern. e keeps the largest |weight| (codes and
// sub-block scales at their extremes) at or below 1 and each scale at or above 2^-13, a binade
// clear of fp16's subnormals (below 2^-14).
struct GgufScales {
    int offsets[2];
    int count;
    int exponent;
};

GgufScales gguf_scales(Format f) {
    switch (f) {
        case Format::q4_0: return {{0, 0}, 1, -7};     // |q - 8| <= 8
        case Format::q8_0: return {{0, 0}, 1, -11};    // |q| <= 128
        case Format::q2_k: return {{80, 82}, 2, -9};   // scale 15 x code 3, min 15
        case Format::q3_k: return {{108, 0}, 1, -11};  // |sc - 32| <= 32 x |q| <= 4
        case Format::q4_k: return {{0, 2}, 2, -13};    // sc 63 x code 15, min 63
        case Format::q5_k: return {{0, 2}, 2, -13};    // sc 63 x code 31, min 63
        case Format::q6_k: return {{208, 0}, 1, -13};  // |int8 scale| <= 128 x |code - 32| <= 32
        case Format::iq4_xs: return {{0, 0}, 1, -13};  // |ls - 32| <= 32 x |level| <= 127
        default: break;
    }
    fail(FT_ERR_INTERNAL, "profile: ", format_name(f), " is not a GGUF block format");
}

// Random bytes, then each block's fp16 scale fields set to positive normal values of the
// format's binade with random mantissas (rows, and so banks, are whole blocks).
void fill_gguf_blocks(cpu::ThreadPool &pool, Format f, uint8_t *p, size_t bytes, uint64_t seed) {
    const size_t bb = static_cast<size_t>(block_bytes(f));
    if (bb == 0 || bytes % bb != 0) fail(FT_ERR_INTERNAL, "profile: ", bytes, " bytes are not whole ", format_name(f), " blocks");
    const GgufScales s = gguf_scales(f);
    const uint16_t exponent_bits = static_cast<uint16_t>((15 + s.exponent) << 10);
    fill_random(pool, p, bytes, seed, ~uint64_t{0}, 0);
    parallel_range(pool, bytes / bb, [&](size_t a, size_t b) {
        for (size_t i = a; i < b; ++i) {
            const uint64_t r = splitmix64(~seed ^ (i * 0x9e3779b97f4a7c15ull));
            for (int k = 0; k < s.count; ++k) {
                const uint16_t v = static_cast<uint16_t>(exponent_bits | ((r >> (16 * k)) & 0x3ffu));
                std::memcpy(p + i * bb + static_cast<size_t>(s.offsets[k]), &v, 2);
            }
        }
    });
}

void fill_bank(cpu::ThreadPool &pool, Format f, Fill fill, uint8_t *p, size_t bytes, uint64_t seed) {
    constexpr uint64_t all = ~uint64_t{0};
    switch (fill) {
        case Fill::codes: fill_random(pool, p, bytes, seed, all, 0); break;  // e2m1 nibbles: all 16 finite
        // bf16 with a random sign and mantissa and exponent 2^-7: |w| in [1/128, 1/64), never
        // subnormal (which would slow the FMAs down) and never large.
        case Fill::bf16_weights: fill_random(pool, p, bytes, seed, 0x807f807f807f807full, 0x3c003c003c003c00ull); break;
        // e4m3 with bit 6 clear: exponent <= 7, so never the NaN codes 0x7f / 0xff.
        case Fill::e4m3_weights: fill_random(pool, p, bytes, seed, 0xbfbfbfbfbfbfbfbfull, 0); break;
        case Fill::bf16_one: fill_u16(pool, p, bytes, f32_to_bf16(1.0f)); break;
        case Fill::e4m3_one: fill_u8(pool, p, bytes, f32_to_e4m3(1.0f)); break;
        case Fill::f16_one: fill_u16(pool, p, bytes, f32_to_f16(1.0f)); break;
        case Fill::e8m0_one: fill_u8(pool, p, bytes, 127); break;
        case Fill::zero: fill_u8(pool, p, bytes, 0); break;
        case Fill::gguf_blocks: fill_gguf_blocks(pool, f, p, bytes, seed); break;
    }
}

}  // namespace

void fill_synthetic_bank(cpu::ThreadPool &pool, Format f, const std::string &bank, uint8_t *p, size_t bytes, uint64_t seed) {
    fill_bank(pool, f, fill_of(f, bank), p, bytes, seed);
}

int64_t window_experts(size_t window, size_t expert_bytes, int64_t top_k, size_t llc) {
    const int64_t llc_experts = static_cast<int64_t>((4 * llc + expert_bytes - 1) / expert_bytes);
    return std::clamp<int64_t>(static_cast<int64_t>(window / expert_bytes), 2 * top_k,
                               std::max(kMaxExperts, std::min(kMaxSmallExperts, llc_experts)));
}

namespace {

// ---- phases --------------------------------------------------------------------------------

struct ReadResult {
    double bytes_per_s = 0.0;
    double fill_bytes_per_s = 0.0;  // first-touch fill rate, to size the format phases' banks
};

// CPU read bandwidth: best_read_bandwidth over max(2 GiB, 8 x LLC), capped at
// `mem_cap` and shrunk to fit `budget_s`, but not below a pilot over the first part (at least
// 4 x LLC, so it already comes from DRAM), which gives the fill and read rates the size is chosen
// from; the probe shapes stop where `budget_s` ends.
ReadResult measure_read(cpu::ThreadPool &pool, double budget_s, size_t mem_cap, size_t llc, const Progress &progress) {
    progress("read", 0, 2);
    const auto t0 = Clock::now();
    const size_t target = std::min(std::max(2 * kGiB, 8 * llc), mem_cap) / 4096 * 4096;
    const size_t pilot = std::min(target, std::max(4 * llc, 64 * kMiB)) / 4096 * 4096;
    HostBuffer buf = alloc_host(target, "the read-bandwidth probe");  // pages are touched only as filled
    uint8_t *data = buf.get();

    const auto f0 = Clock::now();
    fill_random(pool, data, pilot, 1, ~uint64_t{0}, 0);
    ReadResult r;
    r.fill_bytes_per_s = pilot / std::max(seconds_since(f0), 1e-6);
    const double pilot_bw = cpu::read_pass(pool, data, pilot);
    progress("read", 1, 2);

    // Time for `bytes` at `passes`: filling the rest, then kReadProbes x passes reads of it.
    const double left = std::max(budget_s - seconds_since(t0), 0.0);
    auto fitting = [&](int passes) {
        const double per_byte = kReadProbes * passes / pilot_bw + 1.0 / r.fill_bytes_per_s;
        return static_cast<size_t>(std::min<double>(static_cast<double>(target), left / per_byte));
    };
    int passes = 2;
    size_t bytes = fitting(2);
    if (bytes < target) {
        passes = 1;
        bytes = fitting(1);
    }
    bytes = std::max(bytes, pilot) / 4096 * 4096;
    if (bytes > pilot) fill_random(pool, data + pilot, bytes - pilot, 1 + pilot, ~uint64_t{0}, 0);
    r.bytes_per_s = cpu::best_read_bandwidth(pool, data, bytes, passes, nullptr, std::max(budget_s - seconds_since(t0), 0.0));
    log(FT_LOG_INFO, "profile: read ", r.bytes_per_s / 1e9, " GB/s over ", bytes / kMiB, " MiB (", pool.size(), " threads, ",
        passes, " pass(es), ", seconds_since(t0), " s)");
    progress("read", 2, 2);
    return r;
}

// Pinned linear copies, fewer of them when the budget is short.
void measure_pcie(int device, double budget_s, Profile &prof, const Progress &progress) {
    progress("pcie", 0, 2);
    // Sized for a PCIe 3.0 x16 link (~12 GB/s), the slowest a GPU worth profiling sits on.
    const double per_direction = budget_s / 2.0;
    const int iters = std::clamp(static_cast<int>(per_direction * 12e9 / kPcieBytes) - 3, 5, kPcieMaxIters);
    prof.pcie_linear_h2d_gbs = cuda::measure_copy_bandwidth(device, cuda::CopyDirection::host_to_device, kPcieBytes, iters) / 1e9;
    progress("pcie", 1, 2);
    prof.pcie_linear_d2h_gbs = cuda::measure_copy_bandwidth(device, cuda::CopyDirection::device_to_host, kPcieBytes, iters) / 1e9;
    log(FT_LOG_INFO, "profile: H2D ", *prof.pcie_linear_h2d_gbs, " GB/s, D2H ", *prof.pcie_linear_d2h_gbs, " GB/s");
    progress("pcie", 2, 2);
}

void add_note(KernelEntry &e, const std::string &note) { e.note += (e.note.empty() ? "" : " | ") + note; }

// The synthetic window of one format: its geometry and how many experts it holds.
struct FormatWindow {
    ProfileGeometry g;
    size_t eb = 0;    // bytes of one expert
    int64_t K = 0;    // experts per step (top_k)
    int64_t E = 0;    // experts in the window
};

// The window: what a share of the budget can fill, at most 2 GiB (the original's budget) and
// the memory cap, at least 4 x LLC so that it is DRAM-bound, and 2K experts so that
// consecutive steps are disjoint. At most 128 experts, or as many as 4 x LLC takes when they are
// smaller (the GGUF low-bit formats on a large LLC), up to 1024. With a GPU, also at least the
// gather's window, within the cap.
FormatWindow plan_window(Format f, bool gpu, double budget_s, size_t mem_cap, size_t llc, double fill_rate) {
    FormatWindow w;
    w.g = profile_geometry(f);
    w.eb = expert_bytes(f, w.g.hidden, w.g.intermediate);
    w.K = w.g.top_k;
    const double fill_fit = fill_rate * budget_s * kFillShare;
    const size_t window = std::max(static_cast<size_t>(std::min({static_cast<double>(2 * kGiB), static_cast<double>(mem_cap), fill_fit})),
                                   4 * llc);
    w.E = window_experts(window, w.eb, w.K, llc);
    if (gpu)
        w.E = std::max<int64_t>(w.E, std::min<int64_t>(kMinGatherExperts, std::max<int64_t>(2 * w.K, static_cast<int64_t>(mem_cap / w.eb))));
    return w;
}

// The window's experts in host memory, in the exact bank schema of the format, filled with
// synthetic values; `src` is the executor's view of them.
struct SyntheticBanks {
    std::vector<HostBuffer> buffers;
    cpu::ExpertSource src;
};

SyntheticBanks fill_window(cpu::ThreadPool &pool, Format f, const FormatWindow &w, const char *phase) {
    const std::vector<BankSpec> schema = bank_schema(f, w.g.hidden, w.g.intermediate);
    if (schema.size() > 8) fail(FT_ERR_INTERNAL, "profile: ", phase, " has ", schema.size(), " banks, the executor takes 8");
    SyntheticBanks s;
    s.src.format = f;
    s.src.num_experts = static_cast<int32_t>(w.E);
    s.src.num_banks = static_cast<int>(schema.size());
    for (size_t b = 0; b < schema.size(); ++b) {
        const size_t bytes = schema[b].row_bytes * static_cast<size_t>(w.E);
        s.buffers.push_back(alloc_host(bytes, "synthetic expert banks"));
        fill_synthetic_bank(pool, f, schema[b].name, s.buffers.back().get(), bytes, splitmix64(static_cast<uint64_t>(f) * 16 + b));
        s.src.base[b] = s.buffers.back().get();
        s.src.row_bytes[b] = schema[b].row_bytes;
    }
    return s;
}

// One-token steps of the production CPU expert kernels over the window: step i routes to
// experts (i K + j) mod E with weights 1/K, so consecutive steps share no expert and each reads K
// experts from DRAM. The kernels are those a session of an engine created now would run (its
// knobs, docs/knobs.md).
class CpuSteps {
public:
    CpuSteps(cpu::ThreadPool &pool, Format f, const FormatWindow &w, const cpu::ExpertSource &src)
        : w_(w), src_(src), knobs_(read_tuning(false)),
          exec_(pool, f, w.g.hidden, w.g.intermediate, w.g.top_k, 1, activation(w.g), 0, cpu::capped_isa(knobs_.cpu_isa),
                cpu::moe_tuning(knobs_)),
          x_(static_cast<size_t>(w.g.hidden)), y_(static_cast<size_t>(w.g.hidden)), ids_(static_cast<size_t>(w.K)),
          weights_(static_cast<size_t>(w.K), 1.0f / static_cast<float>(w.K)) {
        // One token of small activations.
        for (size_t i = 0; i < x_.size(); ++i) x_[i] = f32_to_bf16(static_cast<float>(splitmix64(i) % 2001) / 10000.0f - 0.1f);
    }

    // Runs the next step; its seconds.
    double run() {
        for (int64_t j = 0; j < w_.K; ++j) ids_[j] = static_cast<int32_t>((step_ * w_.K + j) % w_.E);
        ++step_;
        const auto s0 = Clock::now();
        exec_.run(src_, nullptr, 1, x_.data(), ids_.data(), weights_.data(), y_.data());
        return seconds_since(s0);
    }

    int64_t steps() const { return step_; }
    const char *kernel_name() const { return exec_.kernel_name(); }
    bool output_finite() const {
        return std::none_of(y_.begin(), y_.end(), [](uint16_t v) { return (v & 0x7f80u) == 0x7f80u; });
    }

private:
    static cpu::ActivationSpec activation(const ProfileGeometry &g) {
        cpu::ActivationSpec act;
        act.kind = g.activation;
        act.limit = g.swiglu_limit > 0.0f ? g.swiglu_limit : INFINITY;
        return act;
    }

    const FormatWindow &w_;
    const cpu::ExpertSource &src_;
    const Tuning knobs_;
    cpu::MoeExecutor exec_;
    std::vector<uint16_t> x_, y_;
    std::vector<int32_t> ids_;
    const std::vector<float> weights_;
    int64_t step_ = 0;
};

// What one format's run has to share between its phases, and where it reports.
struct FormatClock {
    const char *phase;
    uint64_t total_units;
    Clock::time_point t0;   // the format's start
    double budget_s;        // the format's share of the run
    double fill_s = 0.0;    // what the bank fill took
    double after_fill() const { return std::max(budget_s - fill_s, 0.0); }
};

// Warm-up steps, then as many timed steps as the rest of the share allows (its CPU part with a
// GPU), judged from the warm-up steps. Returns the median step time; `timed` the steps timed.
double time_cpu_steps(CpuSteps &steps, bool gpu, const FormatClock &c, const Progress &progress, int &timed) {
    double warm_s = 0.0;
    for (int i = 0; i < kWarmupSteps; ++i) {
        progress(c.phase, static_cast<uint64_t>(steps.steps()), c.total_units);
        warm_s += steps.run();
    }
    const double per_step = std::max(warm_s / kWarmupSteps, 1e-6);
    const double left = gpu ? kCpuStepShare * c.after_fill() - (seconds_since(c.t0) - c.fill_s) : c.budget_s - seconds_since(c.t0);
    timed = std::clamp(static_cast<int>(left / per_step), kMinTimedSteps, kMaxTimedSteps);
    std::vector<double> times;
    times.reserve(static_cast<size_t>(timed));
    for (int i = 0; i < timed; ++i) {
        progress(c.phase, static_cast<uint64_t>(steps.steps()), c.total_units);
        times.push_back(steps.run());
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    return times[times.size() / 2];
}

// The gather and the CPU steps over the same wall window: this thread runs CPU steps (on the
// pool), another loops gathers; each side's rate is its bytes over its own elapsed time.
struct OverlapRun {
    profiler::GatherRig::Run gathered;
    int64_t cpu_steps = 0;
    double cpu_s = 0.0;
};

OverlapRun run_overlapped(profiler::GatherRig &rig, CpuSteps &steps, double window_s, int batch) {
    const auto start = Clock::now() + std::chrono::milliseconds(5);
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(window_s));
    std::atomic<bool> stop{false};
    OverlapRun r;
    std::exception_ptr gather_error;
    std::thread gatherer([&] {
        try {
            r.gathered = rig.run_until(start, deadline, batch, &stop);
        } catch (...) {
            gather_error = std::current_exception();
            stop = true;
        }
    });
    auto cpu_end = start;
    try {
        std::this_thread::sleep_until(start);
        while (Clock::now() < deadline && !stop.load()) {
            steps.run();
            ++r.cpu_steps;
            cpu_end = Clock::now();
        }
    } catch (...) {
        stop = true;
        gatherer.join();
        throw;
    }
    gatherer.join();
    if (gather_error) std::rethrow_exception(gather_error);
    r.cpu_s = std::chrono::duration<double>(cpu_end - start).count();
    return r;
}

// The production gather of the window into device slots, alone (docs/formulas.md, "Bandwidth
// profile", step 1) and beside the CPU steps (step 4), into `e`. Throws ft::Error.
void measure_gather(CpuSteps &steps, const SyntheticBanks &banks, const FormatWindow &w, int device, const FormatClock &c,
                    const Progress &progress, KernelEntry &e) {
    uint64_t done = static_cast<uint64_t>(steps.steps());
    profiler::HostExperts h;
    h.num_banks = banks.src.num_banks;
    h.experts = w.E;
    for (int b = 0; b < banks.src.num_banks; ++b) {
        h.base[b] = banks.buffers[static_cast<size_t>(b)].get();
        h.row_bytes[b] = banks.src.row_bytes[b];
    }
    const int64_t count = std::min<int64_t>(w.E, profiler::GatherRig::slots_that_fit(device, w.eb));
    if (count < 1) fail(FT_ERR_OUT_OF_MEMORY, "no room on the GPU for one ", w.eb / 1e6, " MB slot");
    profiler::GatherRig rig(device, h, static_cast<int32_t>(count));
    const double bytes = static_cast<double>(rig.bytes_per_call());

    // The gather alone: back-to-back calls bracketed by events, as many as its share allows.
    const double one = std::max(rig.time_calls(1), 1e-6);
    const int calls = std::clamp(static_cast<int>(kGatherShare * c.after_fill() / one), 3, 20);
    const double gather_s = rig.time_calls(calls);
    if (gather_s > 0) e.pcie_gather_gbs = bytes * calls / gather_s / 1e9;
    progress(c.phase, ++done, c.total_units);

    const double window_s = std::clamp(c.budget_s - seconds_since(c.t0), kMinOverlapSeconds, kMaxOverlapSeconds);
    const OverlapRun o = run_overlapped(rig, steps, window_s, std::max(1, static_cast<int>(kOverlapBatchSeconds / one)));
    if (o.cpu_steps > 0 && o.cpu_s > 0)
        e.cpu_moe_overlap_gbs = static_cast<double>(o.cpu_steps) * static_cast<double>(w.K) * static_cast<double>(w.eb) / o.cpu_s / 1e9;
    if (o.gathered.calls > 0 && o.gathered.seconds > 0)
        e.pcie_gather_overlap_gbs = static_cast<double>(o.gathered.calls) * bytes / o.gathered.seconds / 1e9;
    log(FT_LOG_INFO, "profile: ", c.phase, " gather ", e.pcie_gather_gbs.value_or(0.0), " GB/s (", count, " experts, ", calls,
        " calls); overlapped over ", window_s, " s: CPU ", e.cpu_moe_overlap_gbs.value_or(0.0), " GB/s (", o.cpu_steps,
        " steps) + gather ", e.pcie_gather_overlap_gbs.value_or(0.0), " GB/s (", o.gathered.calls, " calls)");
    if (count < kMinGatherExperts) add_note(e, cat("gather window of ", count, " experts (GPU memory)"));
}

// The production CPU expert kernels at one token (docs/formulas.md, "Bandwidth profile", step 2)
// over a window of synthetic experts in the exact bank schema (CpuSteps). With a GPU (`device` >=
// 0), then the production gather of the window into device slots (step 1) and both at once for
// the same wall window (step 4); a failing GPU part is a note, not the end of the profile.
KernelEntry measure_format(cpu::ThreadPool &pool, Format f, int device, double budget_s, size_t mem_cap, size_t llc,
                           double fill_rate, const Progress &progress) {
    const bool gpu = device >= 0 && profiler::gather_rig_built();
    FormatClock c{format_name(f), static_cast<uint64_t>(kWarmupSteps + kMaxTimedSteps + (gpu ? 2 : 0)), {}, budget_s};
    progress(c.phase, 0, c.total_units);
    c.t0 = Clock::now();

    const FormatWindow w = plan_window(f, gpu, budget_s, mem_cap, llc, fill_rate);
    const SyntheticBanks banks = fill_window(pool, f, w, c.phase);
    c.fill_s = seconds_since(c.t0);

    CpuSteps steps(pool, f, w, banks.src);
    int timed = 0;
    const double median = time_cpu_steps(steps, gpu, c, progress, timed);
    if (!steps.output_finite())
        log(FT_LOG_WARN, "profile: ", c.phase, " gave a non-finite output on synthetic weights (a bug in the profiler's fill)");

    KernelEntry e;
    e.expert_bytes = w.eb;
    e.synth_experts = w.E;
    e.cpu_moe_gbs = static_cast<double>(w.K) * static_cast<double>(w.eb) / median / 1e9;
    e.cpu_moe_isa = steps.kernel_name();
    log(FT_LOG_INFO, "profile: ", c.phase, " ", *e.cpu_moe_gbs, " GB/s (", e.cpu_moe_isa, ", ", w.E, " experts of ", w.eb / 1e6,
        " MB, fill ", c.fill_s, " s, ", timed, " timed steps of ", median * 1e3, " ms median)");

    if (!gpu) {
        add_note(e, device >= 0 ? "gather: this build has no CUDA support" : "gather: no GPU measured");
    } else {
        progress(c.phase, static_cast<uint64_t>(steps.steps()), c.total_units);  // a cancellation point before the GPU part
        try {
            measure_gather(steps, banks, w, device, c, progress, e);
        } catch (const Error &err) {
            if (err.status() == FT_ERR_CANCELLED) throw;
            log(FT_LOG_WARN, "profile: ", c.phase, " gather not measured: ", err.what());
            add_note(e, cat("gather: ", err.what()));
        }
    }
    if (e.pcie_gather_gbs && *e.pcie_gather_gbs > 0 && e.cpu_moe_gbs) e.ratio = *e.cpu_moe_gbs / *e.pcie_gather_gbs;
    progress(c.phase, c.total_units, c.total_units);
    return e;
}

std::string local_timestamp(std::time_t now) {
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[64];
    if (std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S%z", &tm) == 0) return {};
    std::string s = buf;
    // %z gives +0200; ISO-8601 extended form (and Python's isoformat) writes +02:00.
    if (s.size() > 5 && (s[s.size() - 5] == '+' || s[s.size() - 5] == '-')) s.insert(s.size() - 2, ":");
    return s;
}

std::string host_name() {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return {};
    return buf;
}

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) == 0) {
            const size_t colon = line.find(':');
            if (colon == std::string::npos) break;
            const size_t first = line.find_first_not_of(" \t", colon + 1);
            return first == std::string::npos ? std::string() : line.substr(first);
        }
    }
    return {};
}

}  // namespace

ProfileGeometry profile_geometry(Format f) {
    switch (f) {
        case Format::bf16: return {2048, 768, 8, FT_ACT_SILU, 0.0f};
        case Format::nvfp4: return {3072, 1536, 8, FT_ACT_SILU, 0.0f};
        case Format::fp8_block: return {2048, 512, 8, FT_ACT_SILU, 0.0f};
        case Format::mxfp4: return {2880, 2880, 4, FT_ACT_SWIGLU_CLAMP, 7.0f};
        case Format::ds_fp4: return {4096, 2048, 6, FT_ACT_SILU, 7.0f};
        case Format::q4_0: return {2816, 704, 8, FT_ACT_GELU_TANH, 0.0f};
        // The other GGUF block formats at qwen3-30b-a3b's shape (one for all, so they compare
        // directly; H and I are whole 256-element super-blocks).
        case Format::q8_0: case Format::q2_k: case Format::q3_k: case Format::q4_k: case Format::q5_k:
        case Format::q6_k: case Format::iq4_xs: return {2048, 768, 8, FT_ACT_SILU, 0.0f};
    }
    fail(FT_ERR_INVALID_ARGUMENT, "unknown expert format ", static_cast<int32_t>(f));
}

Profile measure_profile(const ft_profile_params &p) {
    if (p.cpu_threads < 0 || p.cpu_threads > 4096) fail(FT_ERR_INVALID_ARGUMENT, "cpu_threads must be in [0, 4096], got ", p.cpu_threads);
    if (p.device < FT_DEVICE_AUTO) fail(FT_ERR_INVALID_ARGUMENT, "device must be >= -2, got ", p.device);
    if (!(p.max_seconds > 0.0) || !std::isfinite(p.max_seconds))
        fail(FT_ERR_INVALID_ARGUMENT, "max_seconds must be a finite number > 0, got ", p.max_seconds);
    uint32_t known = 0;
    for (Format f : kAllFormats) known |= 1u << static_cast<int>(f);
    if (p.formats & ~known) fail(FT_ERR_INVALID_ARGUMENT, "formats has bits set that name no expert format: 0x", std::hex, p.formats & ~known);
    std::vector<Format> formats;
    for (Format f : kAllFormats) {
        if (p.formats == 0 || (p.formats & (1u << static_cast<int>(f)))) formats.push_back(f);
    }

    // The device first, so an explicit ordinal that is missing fails before anything is measured.
    int device = FT_DEVICE_NONE;
    const int count = cuda::device_count();
    if (p.device == FT_DEVICE_AUTO) {
        device = count > 0 ? 0 : FT_DEVICE_NONE;
    } else if (p.device >= 0) {
        if (!cuda::built_with_cuda()) fail(FT_ERR_NO_DEVICE, "device ", p.device, " asked for, but this build has no CUDA support");
        if (p.device >= count) fail(FT_ERR_NO_DEVICE, "device ", p.device, " asked for, but ", count, " CUDA device(s) are usable");
        device = p.device;
    }

    const auto t0 = Clock::now();
    const Progress progress(p);
    Profile prof;
    const std::time_t now = std::time(nullptr);
    prof.timestamp = local_timestamp(now);
    prof.epoch = static_cast<int64_t>(now);
    prof.host = host_name();
    prof.threshold = 2.0;
    prof.library_version = cat(FT_VERSION_MAJOR, ".", FT_VERSION_MINOR, ".", FT_VERSION_PATCH);
    prof.cpu_model = cpu_model();
    if (device >= 0) {
        prof.gpu_index = device;
        prof.gpu_name = cuda::device_name(device);
    }

    // The engine's default, so the figures describe the pool a session will run with.
    cpu::ThreadPool pool(p.cpu_threads > 0 ? p.cpu_threads : cpu::default_worker_count(device >= 0), true,
                         read_tuning(false).cpu_spin_us);
    prof.physical_cores = static_cast<int64_t>(cpu::physical_core_cpus().size());
    prof.threads_used = pool.size();
    // Unknown cache sizes are taken as a large server LLC, so windows err on the DRAM side.
    const size_t llc_read = cpu::last_level_cache_bytes();
    const size_t llc = llc_read ? llc_read : 32 * kMiB;
    const size_t mem_cap = std::max<size_t>(available_memory() / 4, 64 * kMiB);

    // Each phase gets its weight's share of the time left, so a phase that finishes early
    // leaves its time to the ones after it.
    const double format_weight = kFormatWeight + (device >= 0 && profiler::gather_rig_built() ? kGpuFormatWeight : 0.0);
    double weights_left = kReadWeight + (device >= 0 ? kPcieWeight : 0.0) + format_weight * static_cast<double>(formats.size());
    auto share = [&](double weight) {
        const double left = std::max(p.max_seconds - seconds_since(t0), 0.0);
        const double s = left * weight / weights_left;
        weights_left -= weight;
        return s;
    };

    const ReadResult read = measure_read(pool, share(kReadWeight), mem_cap, llc, progress);
    prof.cpu_stream_read_gbs = read.bytes_per_s / 1e9;
    if (device >= 0) measure_pcie(device, share(kPcieWeight), prof, progress);
    for (Format f : formats) {
        KernelEntry e = measure_format(pool, f, device, share(format_weight), mem_cap, llc, read.fill_bytes_per_s, progress);
        // The verdict the original engine reads (`recommended` and `dtypes`, docs/formulas.md).
        if (auto v = entry_verdict(e, prof.threshold)) {
            e.recommended = *v;
            prof.dtypes[profile_format_key(f)] = *v;
        }
        prof.dtype_kernels[profile_format_key(f)] = std::move(e);
    }
    log(FT_LOG_INFO, "profile: done in ", seconds_since(t0), " s");
    return prof;
}

}  // namespace ft
