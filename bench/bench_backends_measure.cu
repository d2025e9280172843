// Bandwidths measured in this run and the routing traces of bench_backends.
#include "bench_backends.cuh"

namespace backends_bench {

namespace {

// Streaming read of n int4 words; the xor keeps the loads from being optimised away.
__global__ void read_kernel(const int4 *p, size_t n, int *sink) {
    int acc = 0;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x1234567) *sink = acc;
}

// Bytes per second of `reps` back-to-back pinned H2D copies of kCopyBytes, best of 3 batches.
double measure_h2d(const PinnedBuffer &src, const DeviceBuffer &dst, cudaStream_t s, int reps) {
    Event a(true), b(true);
    double best = 0.0;
    cuda_ok(cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes, cudaMemcpyHostToDevice, s), "H2D warm-up");
    for (int trial = 0; trial < 3; ++trial) {
        cuda_ok(cudaEventRecord(a.get(), s), "cudaEventRecord");
        for (int r = 0; r < reps; ++r) cuda_ok(cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes, cudaMemcpyHostToDevice, s), "H2D");
        cuda_ok(cudaEventRecord(b.get(), s), "cudaEventRecord");
        cuda_ok(cudaEventSynchronize(b.get()), "H2D");
        float ms = 0.0f;
        cuda_ok(cudaEventElapsedTime(&ms, a.get(), b.get()), "cudaEventElapsedTime");
        best = std::max(best, double(reps) * kCopyBytes / (ms * 1e-3));
    }
    return best;
}

}  // namespace

Bandwidths measure_bandwidths() {
    Bandwidths bw;
    Stream s;
    {
        PinnedBuffer src(kCopyBytes, "cudaHostAlloc", cudaHostAllocPortable);
        std::memset(src.get(), 1, kCopyBytes);
        DeviceBuffer dst(kCopyBytes);
        bw.h2d = measure_h2d(src, dst, s.get(), g_quick ? 4 : 8);
    }
    const size_t bytes = size_t(2) << 30, n = bytes / sizeof(int4);
    DeviceBuffer buf(bytes), sink(sizeof(int));
    cuda_ok(cudaMemsetAsync(buf.get(), 1, bytes, s.get()), "cudaMemset");
    int dev = 0, sms = 0;
    cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    Event a(true), b(true);
    const int reps = 10;
    read_kernel<<<sms * 4, 512, 0, s.get()>>>(buf.get<int4>(), n, sink.get<int>());
    for (int trial = 0; trial < 3; ++trial) {
        cuda_ok(cudaEventRecord(a.get(), s.get()), "cudaEventRecord");
        for (int r = 0; r < reps; ++r) read_kernel<<<sms * 4, 512, 0, s.get()>>>(buf.get<int4>(), n, sink.get<int>());
        cuda_ok(cudaGetLastError(), "read kernel");
        cuda_ok(cudaEventRecord(b.get(), s.get()), "cudaEventRecord");
        cuda_ok(cudaEventSynchronize(b.get()), "read kernel");
        float ms = 0.0f;
        cuda_ok(cudaEventElapsedTime(&ms, a.get(), b.get()), "cudaEventElapsedTime");
        bw.hbm = std::max(bw.hbm, double(reps) * bytes / (ms * 1e-3));
    }
    return bw;
}

// Every layer in turn; visit v of a layer routes to experts vK .. vK + K - 1 (mod E).
Trace rotating(int layers, int E, int K, int64_t calls) {
    Trace t;
    t.period = layers;
    for (int64_t c = 0; c < calls; ++c) {
        const int64_t v = c / layers;
        t.layer.push_back(int32_t(c % layers));
        for (int j = 0; j < K; ++j) t.ids.push_back(int32_t((v * K + j) % E));
    }
    return t;
}

// Layers 0 .. layers-1 in turn; visit v uses hot[v % hot.size()] experts of the hot set
// 0 .. max(hot)-1 and fills the other routes with the layer's next cold experts (rotating over
// max(hot) .. E-1). The pattern follows the visit, not the call, so every layer sees all of it
// and no hot expert sits unused for long enough to be evicted.
Trace hot_cold(int layers, int E, int K, const std::vector<int> &hot, int64_t calls) {
    Trace t;
    t.period = layers * int(hot.size());
    const int hot_set = *std::max_element(hot.begin(), hot.end()), cold_pool = E - hot_set;
    std::vector<int64_t> next_cold(size_t(layers), 0);
    for (int64_t c = 0; c < calls; ++c) {
        const int l = int(c % layers);
        const int h = hot[size_t((c / layers) % int64_t(hot.size()))];
        t.layer.push_back(l);
        for (int j = 0; j < h; ++j) t.ids.push_back(j);
        for (int j = h; j < K; ++j) t.ids.push_back(int32_t(hot_set + next_cold[size_t(l)]++ % cold_pool));
    }
    return t;
}

}  // namespace backends_bench
