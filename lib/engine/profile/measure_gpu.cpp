// The profiler's GPU rig: the production zero-copy gather over page-locked synthetic banks.
// Only compiled when FreeToken has CUDA (measure_gpu_stub.cpp stands in otherwise).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "ft/common.hpp"
#include "ft/cuda_check.hpp"
#include "ft/cuda_device.hpp"
#include "ft/cuda_gather.hpp"
#include "gather_rig.hpp"

namespace ft::profiler {

namespace {

void check(cudaError_t e, const char *what) { cuda::check_cuda(e, "profile gather: ", what); }

}  // namespace

bool gather_rig_built() { return true; }

struct GatherRig::Impl {
    int device = 0;
    int num_banks = 0;
    int32_t count = 0;
    uint64_t bytes = 0;
    std::vector<cuda::HostRegistration> pins;
    cuda::GatherBank banks[cuda::kMaxGatherBanks] = {};
    std::vector<void *> slots;       // cudaMalloc'd, one per bank
    void *plan = nullptr;            // int64 count, then count slots, then count sources
    cuda::GatherPlan gplan;
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;

    ~Impl() {
        // Nothing of ours may still run on the stream when the memory goes away.
        if (stream) cudaStreamSynchronize(stream);
        if (stop) cudaEventDestroy(stop);
        if (start) cudaEventDestroy(start);
        if (stream) cudaStreamDestroy(stream);
        if (plan) cudaFree(plan);
        for (void *s : slots) cudaFree(s);
        cudaGetLastError();
    }

    cudaError_t launch() { return cuda::launch_gather_zero_copy(banks, num_banks, gplan, stream); }
};

GatherRig::GatherRig(int device, const HostExperts &h, int32_t count) : impl_(std::make_unique<Impl>()) {
    Impl &r = *impl_;
    if (h.num_banks < 1 || h.num_banks > cuda::kMaxGatherBanks)
        fail(FT_ERR_INVALID_ARGUMENT, "profile gather: ", h.num_banks, " banks, 1..", cuda::kMaxGatherBanks, " supported");
    if (count < 1 || count > h.experts)
        fail(FT_ERR_INVALID_ARGUMENT, "profile gather: ", count, " slots for a window of ", h.experts, " experts");
    r.device = device;
    r.num_banks = h.num_banks;
    r.count = count;
    check(cudaSetDevice(device), "cudaSetDevice");
    for (int b = 0; b < h.num_banks; ++b) {
        const size_t bank_bytes = h.row_bytes[b] * static_cast<size_t>(h.experts);
        r.pins.emplace_back(device, h.base[b], bank_bytes);
        void *dev = nullptr;
        check(cudaHostGetDevicePointer(&dev, h.base[b], 0), "cudaHostGetDevicePointer");
        void *slots = nullptr;
        check(cudaMalloc(&slots, h.row_bytes[b] * static_cast<size_t>(count)), "cudaMalloc of the slots");
        r.slots.push_back(slots);
        r.banks[b].host_layer = static_cast<const uint8_t *>(dev);
        r.banks[b].slots = static_cast<uint8_t *>(slots);
        r.banks[b].row_bytes = h.row_bytes[b];
        r.bytes += h.row_bytes[b] * static_cast<uint64_t>(count);
    }

    // Slots 0..count-1 from `count` distinct experts of the window in random order.
    const std::vector<int32_t> host = cuda::synthetic_gather_plan(h.experts, count, 0x9a7e);
    check(cudaMalloc(&r.plan, host.size() * sizeof(int32_t)), "cudaMalloc of the plan");
    check(cudaMemcpy(r.plan, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "plan upload");
    r.gplan = cuda::synthetic_gather_plan_view(r.plan, count);
    if (const char *why = cuda::detail::gather_argument_error(r.banks, r.num_banks, r.gplan))
        fail(FT_ERR_INVALID_ARGUMENT, "profile gather: ", why);

    check(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreate(&r.start), "cudaEventCreate");
    // Blocking sync: the thread that waits for a batch sleeps instead of spinning on a core the
    // CPU expert kernels need during the overlapped measurement.
    check(cudaEventCreateWithFlags(&r.stop, cudaEventBlockingSync), "cudaEventCreate");
    // Two warm-up calls: the first launch loads the module, the first touches map the pages.
    for (int i = 0; i < 2; ++i) check(r.launch(), "warm-up gather");
    check(cudaStreamSynchronize(r.stream), "warm-up gather");
}

GatherRig::~GatherRig() = default;

uint64_t GatherRig::bytes_per_call() const { return impl_->bytes; }

double GatherRig::time_calls(int calls) {
    Impl &r = *impl_;
    check(cudaSetDevice(r.device), "cudaSetDevice");
    check(cudaEventRecord(r.start, r.stream), "cudaEventRecord");
    for (int i = 0; i < calls; ++i) check(r.launch(), "gather");
    check(cudaEventRecord(r.stop, r.stream), "cudaEventRecord");
    check(cudaEventSynchronize(r.stop), "cudaEventSynchronize");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, r.start, r.stop), "cudaEventElapsedTime");
    return static_cast<double>(ms) * 1e-3;
}

GatherRig::Run GatherRig::run_until(Clock::time_point start, Clock::time_point deadline, int batch,
                                    const std::atomic<bool> *stop) {
    Impl &r = *impl_;
    check(cudaSetDevice(r.device), "cudaSetDevice");
    batch = std::max(batch, 1);
    std::this_thread::sleep_until(start);
    Run run;
    Clock::time_point last = start;
    while (Clock::now() < deadline && !(stop && stop->load(std::memory_order_relaxed))) {
        for (int i = 0; i < batch; ++i) check(r.launch(), "gather");
        check(cudaEventRecord(r.stop, r.stream), "cudaEventRecord");
        check(cudaEventSynchronize(r.stop), "cudaEventSynchronize");
        last = Clock::now();
        run.calls += batch;
    }
    run.seconds = std::chrono::duration<double>(last - start).count();
    return run;
}

int64_t GatherRig::slots_that_fit(int device, uint64_t expert_bytes) {
    const cuda::MemoryInfo m = cuda::memory_info(device);
    return expert_bytes ? static_cast<int64_t>(m.free_bytes / 2 / expert_bytes) : 0;
}

}  // namespace ft::profiler
