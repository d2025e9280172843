// GPU decode expert kernels (ft::cuda::ExpertDecoder) on the real shapes of each format, next to
// the device's own read bandwidth measured in the same run.
//
// Each iteration decodes T tokens routed to K = 8 distinct experts; successive iterations walk a
// window of 64 experts (8 disjoint sets in turn), so the 8 experts of one call are not in L2 from
// the previous call (the window is several times the H200's 50 MB L2 for every shape here).
// Counters: us_per_decode = time per decode replaying 200 calls captured in a CUDA graph (the
// device's work), us_eager = the same calls launched one by one (adds the host's launch cost);
// GBps = weight bytes of the 8 experts / us_per_decode; bound_GBps = a streaming read
// kernel over 4 GiB (uint4 loads, one sum per thread); ratio = GBps / bound_GBps; copy_GBps =
// cudaMemcpy device-to-device (read + write bytes) for reference. The label names the kernel that
// ran.
#include <benchmark/benchmark.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "ft/cuda_device.hpp"
#include "ft/cuda_experts.hpp"
#include "ft/formats.hpp"

#include "bench_cuda.hpp"

namespace {

constexpr int kTopK = 8;
constexpr int kWindow = 64;


__global__ void read_kernel(const uint4 *p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads alive
}

struct Bounds {
    double read = 0, copy = 0;
};

// Read and copy bandwidth of the current device over `bytes` buffers (best of 5 timed passes).
Bounds measure_bounds(size_t bytes) {
    Bounds b;
    void *src = nullptr, *dst = nullptr;
    unsigned *sink = nullptr;
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess ||
        cudaMalloc(&sink, 4) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(src), cudaFree(dst), cudaFree(sink);
        return b;
    }
    cudaMemset(src, 1, bytes);
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    for (int pass = 0; pass < 6; ++pass) {
        float ms = 0;
        cudaEventRecord(e0);
        read_kernel<<<sms * 8, 512>>>(static_cast<const uint4 *>(src), bytes / 16, sink);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        if (pass > 0 && bytes / (ms * 1e-3) > b.read) b.read = bytes / (ms * 1e-3);
        cudaEventRecord(e0);
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        if (pass > 0 && 2.0 * bytes / (ms * 1e-3) > b.copy) b.copy = 2.0 * bytes / (ms * 1e-3);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(src), cudaFree(dst), cudaFree(sink);
    return b;
}

Bounds g_bounds;

void BM_Decode(benchmark::State &state, ft::Format f, int32_t H, int32_t I, int32_t T) {
    if (ft::cuda::device_count() == 0) {
        state.SkipWithError("no CUDA device");
        return;
    }
    const std::vector<ft::BankSpec> schema = ft::bank_schema(f, H, I);
    const size_t expert = ft::expert_bytes(f, H, I);
    std::vector<void *> banks(schema.size(), nullptr);
    struct Free {
        std::vector<void *> &v;
        ~Free() {
            for (void *p : v) cudaFree(p);
        }
    } free_banks{banks};
    ft::cuda::DeviceExperts dx;
    dx.format = f, dx.hidden = H, dx.inter = I, dx.num_banks = int(schema.size());
    for (size_t b = 0; b < schema.size(); ++b) {
        BENCH_CUDA(cudaMalloc(&banks[b], schema[b].row_bytes * kWindow));
        // 0x22: finite, small values in every encoding (bf16, e4m3, e2m1, e8m0 2^-93, fp16).
        BENCH_CUDA(cudaMemset(banks[b], 0x22, schema[b].row_bytes * kWindow));
        dx.base[b] = static_cast<const uint8_t *>(banks[b]);
        dx.row_bytes[b] = schema[b].row_bytes;
    }
    // Set s routes every token to experts 8s .. 8s+7 (all tokens share the set: 8 distinct experts).
    const int sets = kWindow / kTopK;
    std::vector<int32_t> slots(size_t(sets) * T * kTopK);
    std::vector<float> w(size_t(T) * kTopK, 1.0f / kTopK);
    for (int s = 0; s < sets; ++s)
        for (int t = 0; t < T; ++t)
            for (int k = 0; k < kTopK; ++k) slots[(size_t(s) * T + t) * kTopK + k] = s * kTopK + (k + t) % kTopK;
    void *d_slots = nullptr, *d_w = nullptr, *d_x = nullptr, *d_y = nullptr;
    std::vector<void *> io;
    Free free_io{io};
    BENCH_CUDA(cudaMalloc(&d_slots, slots.size() * 4));
    io.push_back(d_slots);
    BENCH_CUDA(cudaMalloc(&d_w, w.size() * 4));
    io.push_back(d_w);
    BENCH_CUDA(cudaMalloc(&d_x, size_t(T) * H * 2));
    io.push_back(d_x);
    BENCH_CUDA(cudaMalloc(&d_y, size_t(T) * H * 2));
    io.push_back(d_y);
    BENCH_CUDA(cudaMemcpy(d_slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(d_w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemset(d_x, 0x3f, size_t(T) * H * 2));
    ft::cuda::DeviceActivation act;
    if (f == ft::Format::mxfp4) act.kind = FT_ACT_SWIGLU_CLAMP;
    std::unique_ptr<ft::cuda::ExpertDecoder> decp;
    try {
        decp = std::make_unique<ft::cuda::ExpertDecoder>(f, H, I, kTopK, T, act);
    } catch (const std::exception &e) {
        state.SkipWithError(e.what());
        return;
    }
    ft::cuda::ExpertDecoder &dec = *decp;
    cudaStream_t stream;
    BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto run = [&](int i) {
        return dec.decode(dx, static_cast<const uint16_t *>(d_x),
                          static_cast<const int32_t *>(d_slots) + size_t(i % sets) * T * kTopK,
                          static_cast<const float *>(d_w), nullptr, static_cast<uint16_t *>(d_y), T, stream);
    };
    BENCH_CUDA(cudaDeviceSynchronize());  // the legacy-stream fills above, before the stream runs
    for (int i = 0; i < 2 * sets; ++i) BENCH_CUDA(run(i));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    const int iters = 200;
    // The same 200 calls captured once in a graph: replay time is the device's work alone, as in
    // a runtime that captures its decode step; eager launches add the host's launch cost.
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < iters; ++i) run(i);
    BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
    BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    BENCH_CUDA(cudaGraphLaunch(exec, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    double total_s = 0, eager_s = 0;
    int64_t decodes = 0;
    for (auto _ : state) {
        float ms = 0;
        cudaEventRecord(e0, stream);
        cudaGraphLaunch(exec, stream);
        cudaEventRecord(e1, stream);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        state.SetIterationTime(ms * 1e-3);
        total_s += ms * 1e-3;
        cudaEventRecord(e0, stream);
        for (int i = 0; i < iters; ++i) run(i);
        cudaEventRecord(e1, stream);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        eager_s += ms * 1e-3;
        decodes += iters;
    }
    const cudaError_t err = cudaGetLastError();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaStreamDestroy(stream);
    if (err != cudaSuccess) {
        state.SkipWithError(cudaGetErrorString(err));
        return;
    }
    const double per = total_s / double(decodes), per_eager = eager_s / double(decodes);
    const double gbps = double(kTopK) * double(expert) / per * 1e-9;
    state.counters["us_per_decode"] = per * 1e6;
    state.counters["us_eager"] = per_eager * 1e6;
    state.counters["GBps"] = gbps;
    state.counters["bound_GBps"] = g_bounds.read * 1e-9;
    state.counters["copy_GBps"] = g_bounds.copy * 1e-9;
    state.counters["ratio"] = g_bounds.read > 0 ? gbps / (g_bounds.read * 1e-9) : 0.0;
    state.SetLabel(dec.kernel_name());
}

struct Shape {
    ft::Format f;
    int32_t H, I;
};

}  // namespace

int main(int argc, char **argv) {
    benchmark::Initialize(&argc, argv);
    if (ft::cuda::device_count() > 0) {
        g_bounds = measure_bounds(size_t(4) << 30);
        std::printf("device read %.0f GB/s, device-to-device copy %.0f GB/s (read + write)\n", g_bounds.read * 1e-9,
                    g_bounds.copy * 1e-9);
    }
    const Shape shapes[] = {
        {ft::Format::bf16, 4096, 1536},  {ft::Format::bf16, 7168, 2048},   {ft::Format::fp8_block, 7168, 2048},
        {ft::Format::nvfp4, 5120, 1536}, {ft::Format::mxfp4, 2880, 2880}, {ft::Format::ds_fp4, 4096, 2048},
        {ft::Format::q4_0, 2816, 704},
        // Qwen3-30B-A3B's expert shape (H 2048, I 768): bf16, nvfp4 and the GGUF block formats
        {ft::Format::bf16, 2048, 768},   {ft::Format::nvfp4, 2048, 768},
        {ft::Format::q8_0, 2048, 768},   {ft::Format::q4_k, 2048, 768},    {ft::Format::q6_k, 2048, 768},
        {ft::Format::q5_k, 2048, 768},   {ft::Format::q3_k, 2048, 768},    {ft::Format::q2_k, 2048, 768},
        {ft::Format::iq4_xs, 2048, 768},
        // larger experts of the GGUF releases: Qwen3-235B-A22B (4096 x 1536), DeepSeek-V3 (7168 x 2048)
        {ft::Format::q4_k, 4096, 1536},  {ft::Format::q6_k, 4096, 1536},   {ft::Format::q8_0, 4096, 1536},
        {ft::Format::q2_k, 4096, 1536},  {ft::Format::iq4_xs, 4096, 1536}, {ft::Format::q4_0, 4096, 1536},
        {ft::Format::q4_k, 7168, 2048},  {ft::Format::q3_k, 7168, 2048},
    };
    for (const Shape &s : shapes)
        for (int32_t T : {1, 8}) {
            const std::string name = std::string("decode/") + ft::format_name(s.f) + "/H" + std::to_string(s.H) + "_I" +
                                     std::to_string(s.I) + "/T" + std::to_string(T);
            benchmark::RegisterBenchmark(name.c_str(), BM_Decode, s.f, s.H, s.I, T)->UseManualTime()->Iterations(10);
        }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
