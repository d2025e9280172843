// The profiler's GPU side (docs/formulas.md, "Bandwidth profile", steps 1 and 4): the production
// zero-copy gather (launch_gather_zero_copy) from page-locked host banks into device slots. Built from
// measure_gpu.cpp when FreeToken has CUDA, else from measure_gpu_stub.cpp, so the profiler's CPU
// code has no CUDA types and a CPU-only build still links.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace ft::profiler {

// True when this build carries the GPU measurements (the stub says false).
bool gather_rig_built();

// One layer of synthetic experts in host memory, in the exact bank schema of a format.
struct HostExperts {
    int num_banks = 0;
    uint8_t *base[8] = {};       // bank b: `experts` rows of row_bytes[b], 4096-byte aligned
    size_t row_bytes[8] = {};
    int64_t experts = 0;
};

// Page-locks the banks for `device` (portable + mapped, as the model's banks are), allocates
// `count` device slots per bank and a device plan that fills slots 0..count-1 from `count`
// distinct experts in random order, i.e. every call refills a whole window from scattered host
// rows, as the original bench pokes its copy plan. Releases everything on destruction (the host
// banks stay the caller's). Throws FT_ERR_UNSUPPORTED in a build without CUDA, FT_ERR_DEVICE /
// FT_ERR_OUT_OF_MEMORY from CUDA, FT_ERR_INVALID_ARGUMENT for count outside 1..experts.
class GatherRig {
public:
    using Clock = std::chrono::steady_clock;

    GatherRig(int device, const HostExperts &banks, int32_t count);
    ~GatherRig();
    GatherRig(const GatherRig &) = delete;
    GatherRig &operator=(const GatherRig &) = delete;

    // Expert bytes one call moves (count x the expert's bytes over all banks).
    uint64_t bytes_per_call() const;

    // Seconds of `calls` back-to-back gathers bracketed by CUDA events (the GPU's time for them).
    double time_calls(int calls);

    // Waits until `start`, then enqueues gathers in batches of `batch` calls and sleeps on each
    // batch's completion (a blocking-sync event, so this thread leaves the CPU to the expert
    // kernels running beside it) until `deadline` passes or `*stop` (may be null) becomes true. Returns the
    // calls completed and the seconds from `start` to the last completion. Callable from any
    // thread (it makes the device current there).
    struct Run {
        int64_t calls = 0;
        double seconds = 0.0;
    };
    Run run_until(Clock::time_point start, Clock::time_point deadline, int batch, const std::atomic<bool> *stop);

    // How many experts of `expert_bytes` fit half the device's free memory (0 without CUDA).
    static int64_t slots_that_fit(int device, uint64_t expert_bytes);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ft::profiler
