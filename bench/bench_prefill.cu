// GPU prefill per expert format on real shapes: 4096 tokens, top-8 of 128 experts resident in
// device memory. Reports the layer's time, its GEMM TFLOP/s, the bound (a plain cuBLAS bf16 GEMM
// pair of the same FLOPs, m x (T*K) x k, measured in the same run) and the ratio, the fraction of
// the H200's dense bf16 peak (989 TFLOP/s); and the bf16 dequantisation kernel's GB/s against a
// device-to-device copy of the same bytes.
//   bench_prefill [--benchmark_filter=prefill/nvfp4]   (FT_PREFILL_GEMM=grouped: the grouped path)
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ft/cublas_loader.hpp"
#include "ft/cuda_device.hpp"
#include "ft/cuda_prefill.hpp"
#include "moe_reference.hpp"
#include "random_banks.hpp"

#include "bench_cuda.hpp"

namespace {

using ft::Format;
using ft::cuda::DeviceActivation;
using ft::cuda::DeviceExperts;

constexpr int32_t kTokens = 4096, kTopK = 8, kExperts = 128;
constexpr int kDistinct = 4;           // distinct random experts, repeated over the 128 slots
constexpr double kPeakTflops = 989.0;  // H200 dense bf16

struct Shape {
    Format f;
    int32_t H, I;
};

const Shape kShapes[] = {{Format::bf16, 4096, 1536},  {Format::fp8_block, 7168, 2048}, {Format::nvfp4, 5120, 1536},
                         {Format::mxfp4, 2880, 2880}, {Format::ds_fp4, 4096, 2048},    {Format::q4_0, 2816, 704}};


// Device banks of one format for kExperts slots.
struct Layer {
    Shape s;
    std::vector<uint8_t *> banks;
    DeviceExperts dev{};
    size_t expert_bytes = 0;
    ~Layer() {
        for (uint8_t *p : banks) cudaFree(p);
    }
};

std::unique_ptr<Layer> make_layer(const Shape &s, std::string &err) {
    auto L = std::make_unique<Layer>();
    L->s = s;
    const auto schema = ft::bank_schema(s.f, s.H, s.I);
    std::mt19937 rng(42);
    L->dev.format = s.f, L->dev.hidden = s.H, L->dev.inter = s.I, L->dev.num_banks = int(schema.size());
    std::vector<std::vector<uint8_t>> hosts;
    for (const auto &spec : schema) hosts.emplace_back(spec.row_bytes * kDistinct);
    for (int e = 0; e < kDistinct; ++e) {
        uint8_t *rows[8];
        for (size_t b = 0; b < schema.size(); ++b) rows[b] = hosts[b].data() + e * schema[b].row_bytes;
        ft::test::fill_random_expert(s.f, schema, rows, s.H, s.I, rng);
    }
    for (size_t b = 0; b < schema.size(); ++b) {
        const size_t rb = schema[b].row_bytes;
        const std::vector<uint8_t> &host = hosts[b];
        void *p = nullptr;
        if (cudaMalloc(&p, rb * kExperts) != cudaSuccess) {
            err = "cannot allocate the banks";
            return nullptr;
        }
        L->banks.push_back(static_cast<uint8_t *>(p));
        for (int e = 0; e < kExperts; ++e)
            cudaMemcpy(static_cast<uint8_t *>(p) + e * rb, host.data() + (e % kDistinct) * rb, rb,
                       cudaMemcpyHostToDevice);
        L->dev.base[b] = static_cast<uint8_t *>(p);
        L->dev.row_bytes[b] = rb;
        L->expert_bytes += rb;
    }
    return L;
}

// The banks of the last format benchmarked (variants of one format run back to back).
Layer *cached_layer(const Shape &s, std::string &err) {
    static std::unique_ptr<Layer> last;
    if (!last || last->s.f != s.f) {
        last.reset();
        last = make_layer(s, err);
    }
    return last.get();
}

// gemm: "grouped" or "streams" (PrefillTuning::grouped); dequant_mib: PrefillTuning::dequant_mib
// (0: default).
void bm_prefill(benchmark::State &state, Shape s, std::string gemm, int dequant_mib) {
    if (ft::cuda::device_count() == 0) return state.SkipWithError("no GPU");
    if (!ft::cuda::cublas_api()) return state.SkipWithError("no cuBLAS");
    std::string err;
    Layer *L = cached_layer(s, err);
    if (!L) return state.SkipWithError(err.c_str());
    ft::cuda::PrefillTuning tuning;
    tuning.grouped = gemm == "grouped";
    if (dequant_mib > 0) tuning.dequant_mib = dequant_mib;
    const int64_t H = s.H, I = s.I, routes = int64_t(kTokens) * kTopK;

    // Uniform top-8 of 128 per token (~256 tokens per expert), weights in (0, 1).
    std::mt19937 rng(7);
    std::vector<int32_t> slots(routes);
    std::vector<float> w(routes);
    std::vector<int32_t> perm(kExperts);
    for (int32_t t = 0; t < kTokens; ++t) {
        for (int e = 0; e < kExperts; ++e) perm[e] = e;
        for (int k = 0; k < kTopK; ++k) {
            std::swap(perm[k], perm[k + rng() % (kExperts - k)]);
            slots[t * kTopK + k] = perm[k];
            w[t * kTopK + k] = 0.1f + 0.8f * float(rng() % 1000) / 1000.0f;
        }
    }
    std::vector<uint16_t> x(size_t(kTokens) * H);
    for (auto &v : x) v = ft::test::f32_to_bf16_rne(float(int(rng() % 2001) - 1000) / 1000.0f);

    uint16_t *d_x = nullptr, *d_y = nullptr;
    int32_t *d_slots = nullptr;
    float *d_w = nullptr;
    BENCH_CUDA(cudaMalloc(&d_x, x.size() * 2));
    BENCH_CUDA(cudaMalloc(&d_y, x.size() * 2));
    BENCH_CUDA(cudaMalloc(&d_slots, routes * 4));
    BENCH_CUDA(cudaMalloc(&d_w, routes * 4));
    BENCH_CUDA(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(d_slots, slots.data(), routes * 4, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(d_w, w.data(), routes * 4, cudaMemcpyHostToDevice));

    DeviceActivation act;
    if (s.f == Format::mxfp4) act.kind = FT_ACT_SWIGLU_CLAMP;
    std::unique_ptr<ft::cuda::ExpertPrefill> pf;
    try {
        pf = std::make_unique<ft::cuda::ExpertPrefill>(s.f, s.H, s.I, kTopK, kTokens, act, tuning);
    } catch (const std::exception &e) {
        return state.SkipWithError(e.what());
    }
    cudaStream_t stream;
    BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    BENCH_CUDA(cudaEventCreate(&e0));
    BENCH_CUDA(cudaEventCreate(&e1));

    // The bound: the same FLOPs as one plain GEMM pair over all routes (no grouping, no
    // dequantisation): [T*K, H] x [H, 2I] and [T*K, I] x [I, H], bf16 in, fp32 out.
    const ft::cuda::CublasApi *blas = ft::cuda::cublas_api();
    cublasHandle_t h = nullptr;
    blas->create(&h);
    blas->set_stream(h, stream);
    uint16_t *A = nullptr, *B = nullptr;
    float *C = nullptr;
    const size_t a_elems = size_t(2) * I * H + size_t(H) * I, b_elems = size_t(routes) * std::max(H, I);
    BENCH_CUDA(cudaMalloc(&A, a_elems * 2));
    BENCH_CUDA(cudaMalloc(&B, b_elems * 2));
    BENCH_CUDA(cudaMalloc(&C, size_t(routes) * std::max(2 * I, H) * 4));
    BENCH_CUDA(cudaMemset(A, 0x3c, a_elems * 2));  // bf16 ~0.01: finite, no denormal effects
    BENCH_CUDA(cudaMemset(B, 0x3c, b_elems * 2));
    const float one = 1, zero = 0;
    auto plain = [&] {
        blas->gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, int(2 * I), int(routes), int(H), &one, A, CUDA_R_16BF, int(H), B,
                      CUDA_R_16BF, int(H), &zero, C, CUDA_R_32F, int(2 * I), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        blas->gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, int(H), int(routes), int(I), &one, A + size_t(2) * I * H,
                      CUDA_R_16BF, int(I), B, CUDA_R_16BF, int(I), &zero, C, CUDA_R_32F, int(H), CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
    };
    auto layer = [&] { return pf->run(L->dev, d_x, d_slots, slots.data(), d_w, nullptr, d_y, kTokens, stream); };
    auto time_ms = [&](auto &&fn, int iters) {
        cudaEventRecord(e0, stream);
        for (int i = 0; i < iters; ++i) fn();
        cudaEventRecord(e1, stream);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        return double(ms) / iters;
    };
    if (layer() != FT_OK) return state.SkipWithError(pf->last_error());
    plain();
    BENCH_CUDA(cudaStreamSynchronize(stream));
    {  // A broken kernel shows up here rather than as a fast time.
        std::vector<uint16_t> y(x.size());
        BENCH_CUDA(cudaMemcpy(y.data(), d_y, y.size() * 2, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (uint16_t v : y) bad += (v & 0x7f80u) == 0x7f80u;  // bf16 Inf or NaN
        state.counters["nonfinite_outputs"] = double(bad);
    }
    const double flops = 2.0 * double(routes) * 3.0 * double(H) * double(I);
    double layer_ms = 0, bound_ms = 0;
    int n = 0;
    for (auto _ : state) {
        // Alternate the two so both see the same clocks and neighbours.
        const double b = time_ms(plain, 3);
        const double l = time_ms([&] { layer(); }, 3);
        state.SetIterationTime(l / 1e3);
        layer_ms += l, bound_ms += b, ++n;
    }
    BENCH_CUDA(cudaGetLastError());
    layer_ms /= n, bound_ms /= n;
    const double tflops = flops / (layer_ms * 1e-3) / 1e12, bound = flops / (bound_ms * 1e-3) / 1e12;
    state.counters["ms_per_layer"] = layer_ms;
    state.counters["TFLOPs"] = tflops;
    state.counters["bound_TFLOPs"] = bound;
    state.counters["ratio"] = tflops / bound;
    state.counters["peak_fraction"] = tflops / kPeakTflops;
    state.counters["bound_peak_fraction"] = bound / kPeakTflops;
    state.counters["scratch_MiB"] = double(pf->scratch_bytes()) / (1 << 20);
    state.SetLabel(std::string(ft::format_name(s.f)) + " H=" + std::to_string(s.H) + " I=" + std::to_string(s.I) +
                   " gemm=" + pf->gemm_path() + (dequant_mib > 0 ? " dequant_MiB=" + std::to_string(dequant_mib) : ""));
    blas->destroy(h);
    cudaFree(A), cudaFree(B), cudaFree(C);
    cudaFree(d_x), cudaFree(d_y), cudaFree(d_slots), cudaFree(d_w);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaStreamDestroy(stream);
}

// launch_dequant_bf16 over 16 experts: bytes read (quantised) + written (bf16) per second,
// against a device-to-device copy that reads and writes the same total.
void bm_dequant(benchmark::State &state, Shape s) {
    if (ft::cuda::device_count() == 0) return state.SkipWithError("no GPU");
    std::string err;
    Layer *L = cached_layer(s, err);
    if (!L) return state.SkipWithError(err.c_str());
    constexpr int kN = 16;
    std::vector<int32_t> slots(kN);
    for (int i = 0; i < kN; ++i) slots[i] = (i * 37) % kExperts;
    int32_t *d_slots = nullptr;
    uint16_t *out = nullptr;
    const size_t out_bytes = size_t(kN) * 3 * s.H * s.I * 2, in_bytes = size_t(kN) * L->expert_bytes;
    const size_t moved = out_bytes + in_bytes;
    void *c0 = nullptr, *c1 = nullptr;
    BENCH_CUDA(cudaMalloc(&d_slots, kN * 4));
    BENCH_CUDA(cudaMalloc(&out, out_bytes));
    BENCH_CUDA(cudaMalloc(&c0, moved / 2));
    BENCH_CUDA(cudaMalloc(&c1, moved / 2));
    BENCH_CUDA(cudaMemcpy(d_slots, slots.data(), kN * 4, cudaMemcpyHostToDevice));
    cudaStream_t stream;
    BENCH_CUDA(cudaStreamCreate(&stream));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    auto time_ms = [&](auto &&fn, int iters) {
        cudaEventRecord(e0, stream);
        for (int i = 0; i < iters; ++i) fn();
        cudaEventRecord(e1, stream);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        return double(ms) / iters;
    };
    auto deq = [&] { ft::cuda::launch_dequant_bf16(L->dev, d_slots, kN, out, stream); };
    auto copy = [&] { cudaMemcpyAsync(c1, c0, moved / 2, cudaMemcpyDeviceToDevice, stream); };
    BENCH_CUDA(ft::cuda::launch_dequant_bf16(L->dev, d_slots, kN, out, stream));
    copy();
    BENCH_CUDA(cudaStreamSynchronize(stream));
    double dq = 0, cp = 0;
    int n = 0;
    for (auto _ : state) {
        const double b = time_ms(copy, 5);
        const double d = time_ms(deq, 5);
        state.SetIterationTime(d / 1e3);
        dq += d, cp += b, ++n;
    }
    BENCH_CUDA(cudaGetLastError());
    dq /= n, cp /= n;
    state.counters["GBps"] = double(moved) / (dq * 1e-3) / 1e9;
    state.counters["bound_GBps"] = double(moved / 2 * 2) / (cp * 1e-3) / 1e9;
    state.counters["ratio"] = state.counters["GBps"] / state.counters["bound_GBps"];
    state.SetLabel(std::string(ft::format_name(s.f)) + " 16 experts");
    cudaFree(d_slots), cudaFree(out), cudaFree(c0), cudaFree(c1);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaStreamDestroy(stream);
}

}  // namespace

int main(int argc, char **argv) {
    for (const Shape &s : kShapes) {
        const std::string name = ft::format_name(s.f);
        // Default settings, the grouped GEMM path, and (quantised) other dequantisation budgets:
        // 128 MiB keeps one or two experts per buffer (closer to L2), 2048 MiB many.
        std::vector<std::pair<std::string, int>> variants = {{"streams", 0}, {"grouped", 0}};
        if (s.f != Format::bf16) variants.insert(variants.end(), {{"streams", 128}, {"streams", 2048}});
        for (const auto &[gemm, mib] : variants)
            benchmark::RegisterBenchmark(
                ("prefill/" + name + "/" + gemm + (mib ? "/dequant_MiB:" + std::to_string(mib) : "")).c_str(),
                bm_prefill, s, gemm, mib)
                ->UseManualTime()
                ->Unit(benchmark::kMillisecond)
                ->Iterations(5);
        if (s.f != Format::bf16)
            benchmark::RegisterBenchmark(("dequant/" + name).c_str(), bm_dequant, s)
                ->UseManualTime()
                ->Unit(benchmark::kMillisecond)
                ->Iterations(5);
    }
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
