// choose_gather_method: both gathers timed on the caller's banks (the profiler measures the gather the
// same way: a synthetic plan of scattered source rows, warm-up calls, then back-to-back calls
// bracketed by events).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ft/common.hpp"
#include "ft/cuda_check.hpp"
#include "ft/cuda_gather.hpp"

namespace ft::cuda {

namespace {

void check(cudaError_t e, const char *what) { check_cuda(e, "gather measurement: ", what); }

// Owns what one measurement creates, so every exit path releases it.
struct Rig {
    void *plan = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Rig() {
        if (stop) cudaEventDestroy(stop);
        if (start) cudaEventDestroy(start);
        if (plan) cudaFree(plan);
    }
};

template <typename Call>
double time_calls(const Rig &rig, cudaStream_t stream, int iters, double bytes_per_call, Call &&call) {
    for (int i = 0; i < 2; ++i) check(call(), "warm-up gather");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(cudaEventRecord(rig.start, stream), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) check(call(), "gather");
    check(cudaEventRecord(rig.stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(rig.stop), "cudaEventSynchronize");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, rig.start, rig.stop), "cudaEventElapsedTime");
    return ms > 0.0f ? bytes_per_call * iters / (ms * 1e-3) / 1e9 : 0.0;
}

}  // namespace

GatherChoice choose_gather_method(const GatherBank *banks, int num_banks, int32_t experts_in_layer, int32_t count,
                                  cudaStream_t stream) {
    if (count < 1 || count > experts_in_layer)
        fail(FT_ERR_INVALID_ARGUMENT, "gather measurement: count ", count, " not in 1..", experts_in_layer);

    const std::vector<int32_t> host = synthetic_gather_plan(experts_in_layer, count, 0x6a7e);
    Rig rig;
    check(cudaMalloc(&rig.plan, host.size() * sizeof(int32_t)), "cudaMalloc of the plan");
    check(cudaMemcpy(rig.plan, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "plan upload");
    check(cudaEventCreate(&rig.start), "cudaEventCreate");
    check(cudaEventCreate(&rig.stop), "cudaEventCreate");
    const GatherPlan plan = synthetic_gather_plan_view(rig.plan, count);
    if (const char *why = detail::gather_argument_error(banks, num_banks, plan))
        fail(FT_ERR_INVALID_ARGUMENT, "gather measurement: ", why);

    double bytes = 0.0;
    for (int b = 0; b < num_banks; ++b) bytes += static_cast<double>(banks[b].row_bytes) * count;
    // About 256 MB per timed run: long enough for event resolution and launch jitter.
    const int iters = static_cast<int>(std::clamp(256e6 / bytes, 3.0, 20.0));

    CopyEngineGather engine(count);
    GatherChoice choice{};
    choice.zero_copy_gbs =
        time_calls(rig, stream, iters, bytes, [&] { return launch_gather_zero_copy(banks, num_banks, plan, stream); });
    choice.copy_engine_gbs =
        time_calls(rig, stream, iters, bytes, [&] { return engine.gather(banks, num_banks, plan, stream); });
    // Ties go to the zero-copy kernel: it is the one a CUDA graph can hold.
    choice.method = choice.copy_engine_gbs > choice.zero_copy_gbs ? GatherMethod::copy_engine : GatherMethod::zero_copy;
    return choice;
}

}  // namespace ft::cuda
