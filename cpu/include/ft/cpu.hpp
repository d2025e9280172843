// CPU expert compute: ISA detection, a pinned worker pool, bf16 GEMV kernels and the MoE executor
// that runs routed (and shared) experts straight from host memory.
//
// Threading: a ThreadPool serialises its jobs internally; one MoeExecutor must be used by one
// thread at a time (it owns scratch). Several executors may share one pool.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "freetoken.h"
#include "ft/formats.hpp"
#include "ft/knobs.hpp"

namespace ft::cpu {

// ---- ISA -------------------------------------------------------------------------------------

// Kernel tiers, ordered: each one needs everything below it.
enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2, avx512bf16 = 3 };

// Best tier this CPU (and OS: XSAVE state enabled) supports, from cpuid at run time.
Isa cpu_best_isa();
// cpu_best_isa() capped by `cap` (scalar|avx2|avx512|avx512bf16; "" = no cap). The cap only
// lowers the tier; an unknown name is ignored with a warning log line.
Isa capped_isa(const std::string &cap);
// capped_isa() of the FT_CPU_ISA knob as the environment has it now (engines use their Tuning).
Isa default_isa();
// Whether the CPU has AMX-BF16 and the OS grants this process the tile state (asked once, on
// the first call). Above the avx512bf16 tier, not a tier of its own: see gemv_kernel_amx().
bool amx_bf16_available();
// "scalar", "avx2", "avx512", "avx512bf16".
const char *isa_name(Isa isa);
// Parses a name as above; false if unknown.
bool isa_from_name(const char *name, Isa *out);

// One logical CPU per physical core within the process affinity set (sysfs
// thread_siblings_list); all allowed CPUs when the topology cannot be read.
std::vector<int> physical_core_cpus();

// Logical CPUs in the process affinity set (hardware_concurrency when it cannot be read; >= 1).
int logical_cpu_count();

// The default worker count: one per physical core, less two when a GPU is driven from this
// process (less one below 4 cores; at least one). Those cores are left to the thread that
// enqueues the GPU work and waits on it (CUDA's default wait spins) and to the hybrid
// coordinator: a pinned worker sharing its core with either is descheduled for whole time
// slices, and every pass barrier of the MoE layer then waits for it (on the H200 host, under a
// transformers decode loop, a hybrid step's CPU share took 1.2 ms with 15 of 16 cores and 90 us
// with 14 or 12).
int default_worker_count(bool drives_gpu);

// Size in bytes of the largest CPU cache (sysfs), 0 if unknown. Working sets that must come
// from DRAM have to be several times larger.
size_t last_level_cache_bytes();

// ---- worker pool -----------------------------------------------------------------------------

// Persistent workers that sleep on a condition variable between jobs (after a short spin, so that
// back-to-back jobs such as consecutive MoE layers do not pay a futex wake-up each).
class ThreadPool {
public:
    // threads = 0: one worker per physical core. pin: worker i is bound to
    // physical_core_cpus()[i mod n] (then to the remaining allowed logical CPUs). spin_us: how
    // long an idle worker polls before it sleeps (the engine passes FT_CPU_SPIN_US).
    ThreadPool(int threads, bool pin, int spin_us = 100);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    // Number of workers; run() calls fn with num_workers == size().
    int size() const { return static_cast<int>(workers_.size()); }

    // Runs fn(worker, size()) once on every worker and returns when all have returned. The
    // caller does not compute; it waits (short spin, then sleeps). The first exception thrown by
    // any fn is rethrown here after all workers finished. Concurrent calls are serialised.
    void run(const std::function<void(int worker, int num_workers)> &fn);

    // Keeps the workers (and the caller of the next run()) polling for `period` from now, waking
    // sleeping ones, so that a job known to be coming (a hybrid step's CPU share, which the GPU
    // signals later) starts without a futex wake-up per worker. Cheap when they already poll.
    void warm(std::chrono::microseconds period);

private:
    void worker_main(int index, int cpu);

    std::chrono::microseconds spin_;  // idle polling before sleeping; the caller polls a quarter
    std::vector<std::thread> workers_;
    std::mutex run_mutex_;  // serialises run()
    std::mutex mutex_;      // guards the sleep/wake state below
    std::condition_variable wake_;
    std::condition_variable done_cv_;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> remaining_{0};
    std::atomic<int> sleepers_{0};
    std::atomic<bool> stop_{false};
    std::atomic<int64_t> warm_until_ns_{0};  // steady-clock time until which idle threads poll
    std::atomic<uint64_t> warm_epoch_{0};    // bumped by warm() to wake sleeping workers
    const std::function<void(int, int)> *job_ = nullptr;
    std::exception_ptr error_;
    std::mutex error_mutex_;
};

// ---- bf16 GEMV kernels -----------------------------------------------------------------------

// out[t * ldo + r] = sum_{c < cols} w[r * ldw + c] * x[t][c] for r < rows, t < ntok; bf16 inputs,
// fp32 accumulation. Any rows/cols (tails handled). Each loaded weight vector is reused for up
// to four tokens at a time, so an expert's weights cross the memory bus once for all its tokens.
using GemvFn = void (*)(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
                        int ntok, float *out, size_t ldo);
// The kernel of a tier. FT_ERR_UNSUPPORTED if the CPU lacks the tier.
GemvFn gemv_kernel(Isa isa);
// The AMX-BF16 kernel (tiles for calls of 2 or more tokens, the avx512bf16 kernel otherwise), or
// nullptr where amx_bf16_available() is false. Same contract and error bound as the tier kernels.
GemvFn gemv_kernel_amx();
// Software prefetch distance of every CPU kernel, in bytes ahead of each weight row (0 = off;
// default 512). Process-wide: the kernels read one value, set by each engine at its creation
// from FT_CPU_PREFETCH, so the engine created last decides.
void set_prefetch_bytes(int bytes);

// ---- oneDNN bf16 matmul ----------------------------------------------------------------------

// dst[M,N] f32 = src[M,K] bf16 · W^T, where W is row-major [N,K] bf16 with row stride ldw
// elements (oneDNN sees it as a [K,N] weight with format "ba"). Primitives are created once per
// (M,N,K,ldw) and cached (thread-safe). Runs on oneDNN's OpenMP threads: call it from one thread
// that is not a pool worker. oneDNN failures become ft::Error(FT_ERR_INTERNAL/UNSUPPORTED).
void onednn_matmul_bf16(int64_t m, int64_t n, int64_t k, const uint16_t *src, int64_t lds,
                        const uint16_t *w, int64_t ldw, float *dst, int64_t ldd);
// Number of OpenMP threads oneDNN runs with (omp_get_max_threads of the calling thread).
int onednn_threads();
// Whether oneDNN can create a bf16 matmul on this CPU (AVX-512 or newer, within
// ONEDNN_MAX_CPU_ISA). Probed once; the executor never takes the oneDNN path when false.
bool onednn_bf16_available();

// ---- memory read bandwidth -------------------------------------------------------------------

// How a read pass walks memory: each worker reads its contiguous share as `streams` parts in
// lockstep, the parts `stride` bytes apart (0: equal contiguous slices of the share),
// prefetching `prefetch` bytes ahead (0 = none).
struct ReadProbe {
    int streams = 1;
    size_t stride = 0;
    int prefetch = 0;
};

// One STREAM-style pass: every worker of `pool` sums its share of [data, data + bytes) with the
// widest loads of default_isa(). Returns bytes/s.
double read_pass(ThreadPool &pool, const uint8_t *data, size_t bytes, ReadProbe probe = {});

// The best read_pass over [data, data + bytes) across stream counts, stream spacings and
// prefetch distances, `passes` times each: the read bandwidth these cores reach on that memory.
// `best`, if given, receives the probe of that pass. Past `max_seconds` it stops after the pass
// it is in (at least one pass runs) and returns the best so far.
double best_read_bandwidth(ThreadPool &pool, const uint8_t *data, size_t bytes, int passes = 2,
                           ReadProbe *best = nullptr, double max_seconds = std::numeric_limits<double>::infinity());

// best_read_bandwidth over a fresh buffer of `bytes` (choose it well above the last-level
// cache), filled by the same workers first so its pages sit near them.
double measure_read_bandwidth(ThreadPool &pool, size_t bytes, int passes = 2);

// ---- MoE executor ----------------------------------------------------------------------------

struct ActivationSpec {
    int32_t kind = FT_ACT_SILU;
    float alpha = 1.702f;  // FT_ACT_SWIGLU_CLAMP
    float limit = 7.0f;    // FT_ACT_SWIGLU_CLAMP; +inf = no clamp
};

// The banks of one MoE layer in any expert format: bank b (ft::bank_schema order) of expert e
// starts at base[b] + e * row_bytes[b].
struct ExpertSource {
    Format format = Format::bf16;  // of every bank; with down_format, of the gate_up bank
    // FT_FORMAT_* of the down bank when the layer mixes block formats (gate_up in `format`, down
    // in this one); -1: the down bank is in `format` too.
    int32_t down_format = -1;
    int32_t num_experts = 0;
    int num_banks = 0;
    const uint8_t *base[8] = {};
    size_t row_bytes[8] = {};
    // bf16 only: per-expert biases in f32, gate_up_bias [E, 2I] (gate then up), down_bias [E, H],
    // added before the activation and to the down output (bf16 gpt-oss). nullptr: none.
    const float *gate_up_bias = nullptr;
    const float *down_bias = nullptr;
};

// Shared expert(s) of a layer, applied to every token: gate/up [Is,H], down [H,Is] (bf16).
struct SharedExpertView {
    const uint16_t *gate, *up, *down;
    int32_t intermediate;
    const uint16_t *gate_proj;  // [H]: output scaled by sigmoid(gate_proj . x); nullptr: weight 1
};

struct MoeStats {
    uint64_t routes_computed = 0, routes_skipped = 0, experts_read = 0, bytes_read = 0;
};

// Which kernel serves a quantised format where a knob chooses (docs/knobs.md).
struct QuantChoice {
    bool vnni = true;         // FT_CPU_VNNI: AVX-512-VNNI kernels (tiers >= avx512), AVX-VNNI ones (avx2) where cpuid has them
    bool mxfp4_w4a8 = true;   // FT_CPU_MXFP4_W4A8: mxfp4 through W4A8 x2 (VNNI + VBMI)
    bool nvfp4_w4a8 = false;  // FT_CPU_NVFP4_W4A8: nvfp4 through W4A8 (other numerics, bound 3e-2)
};

// Tuning with measured defaults (cpu/README.md); the engine fills it from its knobs.
struct MoeTuning {
    // Experts with at least this many routes in a call go through oneDNN matmul (0 = never).
    int32_t onednn_min_tokens = -1;  // -1: 64 with AMX-BF16 and amx off, else 0
    // Quantised experts with at least this many routes in a call are dequantised to bf16 tile by
    // tile (per-worker scratch) and run through the bf16 multi-token kernel (0 = never; only
    // formats/tiers with a dequantiser, see cpu/README.md).
    int32_t quant_batched_min_tokens = -1;  // -1: 8 on the AMX GEMV (amx below), else 16
    // FT_CPU_AMX: the bf16 GEMV on AMX-BF16 tiles (gemv_kernel_amx) where the tier is avx512bf16, and
    // the quantised formats' AMX kernels (fp8_block, q2_k, q3_k; quant_amx_available).
    bool amx = true;
    QuantChoice quant;
};

// The executor tuning of an engine's knobs.
MoeTuning moe_tuning(const Tuning &t);

// Kernels and activation preparation of one quantised format at one tier (cpu/src/quant.hpp).
struct QuantOps;

class MoeExecutor {
public:
    // Validates the geometry (all > 0; bf16 takes any hidden/intermediate sizes, the other
    // formats need the multiples of ft::format_block) and preallocates every buffer for
    // max_tokens. Routed experts are in `format`; the shared expert is always bf16.
    // ds_fp4 with FT_ACT_SILU clamps like DeepSeek-V4 when act.limit is finite and > 0 (see
    // cpu/README.md). FT_ERR_INVALID_ARGUMENT on bad arguments, FT_ERR_UNSUPPORTED if the CPU
    // lacks `isa`.
    // mixed_formats: further block formats (format_is_block) that layers of a model mixing them
    // use for gate_up or down (ExpertSource::down_format); `format` must then be a block format
    // too. Scratch is sized for the largest of them; FT_ERR_UNSUPPORTED when one has no kernel.
    MoeExecutor(ThreadPool &pool, Format format, int32_t hidden, int32_t intermediate, int32_t top_k,
                int32_t max_tokens, ActivationSpec act, int32_t shared_intermediate, Isa isa,
                MoeTuning tuning = {}, const std::vector<Format> &mixed_formats = {});
    ~MoeExecutor();
    MoeExecutor(const MoeExecutor &) = delete;
    MoeExecutor &operator=(const MoeExecutor &) = delete;

    // y[t] = sum_k w[t,k] * down_e(act(gate_e x[t]) * (up_e x[t])) over routes with 0 <= id < E,
    // plus the shared expert (weight 1 or sigmoid(gate_proj . x[t])) when shared != nullptr.
    // x, y bf16 [T,H]; ids int32 / w f32 [T,K]. Each distinct expert is read once for all its
    // tokens. fp32 accumulation, bf16 intermediate, one bf16 rounding of y (format numerics in
    // cpu/README.md: mxfp4 biases, ds_fp4 FP8 round trips, q4_0 Q8_0 activations). The result does not
    // depend on the pool size. Never allocates. FT_ERR_INVALID_ARGUMENT if num_tokens is outside
    // [0, max_tokens] or a pointer is NULL.
    MoeStats run(const ExpertSource &src, const SharedExpertView *shared, int32_t num_tokens,
                 const uint16_t *x, const int32_t *ids, const float *w, uint16_t *y);

    // With `on`, a route's weight scales its expert's input instead of its output:
    // y[t] = sum_k down_e(act(gate_e x') * (up_e x')) with x' = bf16(w[t,k] * x[t]) (Llama-4).
    // bf16 experts only (FT_ERR_UNSUPPORTED otherwise); allocates its scratch here.
    void set_weight_on_input(bool on);

    Isa isa() const { return isa_; }
    Format format() const { return format_; }
    // The kernel of the routed experts, e.g. "bf16" or "q4_0-w4a8-avx512".
    const char *kernel_name() const;
    int32_t onednn_min_tokens() const { return onednn_min_tokens_; }
    // Whether the bf16 GEMV (bf16 experts, the batched path) is the AMX one (gemv_kernel_amx).
    bool amx_gemv() const { return amx_gemv_; }
    // 0 when the format/tier has no batched (dequantise-then-bf16-GEMV) path.
    int32_t quant_batched_min_tokens() const { return quant_batched_min_tokens_; }

private:
    struct Group;
    struct Scratch;
    void run_pool_passes(int worker, int num_workers, bool with_reduce);
    void run_onednn_groups();
    void reduce_rows(int64_t item);
    void run_item_pass1(int worker, int64_t item);
    void run_block_pass1(int worker, const Group &g, int64_t i0, int units);
    int p1_blocks(const Group &g) const;  // kRowBlock units per pass-1 item
    int64_t p2_rows(const Group &g) const;  // output rows (mxfp4: columns) per pass-2 item
    void run_item_pass2(int worker, int64_t item);
    int32_t group_of(const std::vector<int64_t> &prefix, int64_t item) const;

    ThreadPool &pool_;
    Format format_;
    int32_t hidden_, inter_, top_k_, max_tokens_, shared_inter_;
    ActivationSpec act_;
    Isa isa_;
    GemvFn gemv_;
    bool amx_gemv_ = false;  // gemv_ is gemv_kernel_amx()
    const QuantOps *quant_ = nullptr;  // nullptr for bf16
    struct FormatEntry;
    std::vector<FormatEntry> formats_;  // `format`, then the mixed formats
    int32_t onednn_min_tokens_;
    int32_t quant_batched_min_tokens_ = 0;
    bool weight_on_input_ = false;
    std::unique_ptr<Scratch> s_;
};

}  // namespace ft::cpu
