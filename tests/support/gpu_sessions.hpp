// The GPU session backends' test harness (tests/backends/test_*_gpu.cpp): whether the engine has
// a GPU, a model's sessions on cpu, gpu, offload and hybrid, device buffers for ft_decode_cuda,
// one routed call decoded on every backend and compared, and every layer's ft_decode_cuda
// captured in one CUDA graph and replayed with fresh inputs. Needs the CUDA runtime (links
// CUDA::cudart_static) and freetoken_cuda.h; the callers skip (GTEST_SKIP) when gpu_engine is
// false.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "api_handles.hpp"
#include "freetoken.h"
#include "freetoken_cuda.h"
#include "moe_reference.hpp"

namespace ft::test {

// True when `engine` drives a usable CUDA device.
inline bool gpu_engine(ft_engine *engine) {
    ft_engine_info info;
    info.struct_size = sizeof info;
    return engine && ft_engine_get_info(engine, &info) == FT_OK && info.device >= 0;
}

// A session on `backend` with no VRAM reserve; records a failure (with the error) if refused.
inline SessionPtr open_session(ft_model *m, int32_t backend, int max_tokens, int64_t cache_slots = 0,
                               float hybrid_fraction = 0.5f, bool adaptive = false, double timeout = 10.0,
                               bool shared_experts = false) {
    ft_session_params p;
    ft_session_params_init(&p);
    p.backend = backend;
    p.max_tokens = max_tokens;
    p.cache_slots = cache_slots;
    p.vram_reserve_bytes = 0;
    p.hybrid_fraction = hybrid_fraction;
    p.hybrid_adaptive = adaptive;
    p.handoff_timeout_seconds = timeout;
    p.shared_experts = shared_experts;
    ft_session *s = nullptr;
    char err[512];
    EXPECT_EQ(ft_session_create(m, &p, &s, err, sizeof err), FT_OK) << "backend " << backend << ": " << err;
    return SessionPtr(s);
}

// Loads `path` on `engine` (and its info into *info when given); null, with a failure recorded,
// if it does not load.
inline ModelPtr load_model(ft_engine *engine, const std::string &path, ft_model_info *info = nullptr) {
    ft_model *raw = nullptr;
    char err[512];
    EXPECT_EQ(ft_model_load(engine, path.c_str(), nullptr, &raw, err, sizeof err), FT_OK) << path << ": " << err;
    if (raw && info) {
        info->struct_size = sizeof *info;
        EXPECT_EQ(ft_model_get_info(raw, info), FT_OK);
    }
    return ModelPtr(raw);
}

// One model's sessions on cpu, gpu, offload and hybrid; offload and hybrid get `slots` slots
// (the number of experts: one layer of slots, so every layer change evicts), hybrid runs at
// `hybrid_fraction`.
struct BackendSessions {
    SessionPtr cpu, gpu, offload, hybrid;
    BackendSessions(ft_model *m, int max_tokens, int64_t slots, float hybrid_fraction, bool shared_experts = false)
        : cpu(open_session(m, FT_BACKEND_CPU, max_tokens, 0, 0.5f, false, 10.0, shared_experts)),
          gpu(open_session(m, FT_BACKEND_GPU, max_tokens, 0, 0.5f, false, 10.0, shared_experts)),
          offload(open_session(m, FT_BACKEND_OFFLOAD, max_tokens, slots, 0.5f, false, 10.0, shared_experts)),
          hybrid(open_session(m, FT_BACKEND_HYBRID, max_tokens, slots, hybrid_fraction, false, 10.0, shared_experts)) {}
    bool ok() const { return cpu && gpu && offload && hybrid; }
};

// T tokens of K distinct experts each, in [0, E).
inline std::vector<int32_t> distinct_ids(std::mt19937 &rng, int T, int K, int E) {
    std::vector<int32_t> ids(size_t(T) * K);
    std::uniform_int_distribution<int> pick(0, E - 1);
    for (int t = 0; t < T; ++t) {
        std::set<int> used;
        for (int k = 0; k < K; ++k) {
            int e;
            do e = pick(rng);
            while (!used.insert(e).second);
            ids[size_t(t) * K + k] = e;
        }
    }
    return ids;
}

inline std::vector<double> as_f64(const std::vector<uint16_t> &y) {
    std::vector<double> r(y.size());
    for (size_t i = 0; i < y.size(); ++i) r[i] = bf16_to_f64(y[i]);
    return r;
}

// One ft_decode call's inputs.
struct DecodeCall {
    int layer = 0, T = 0;
    std::vector<uint16_t> x;
    std::vector<int32_t> ids;
    std::vector<float> w;
};

// T tokens of `layer` routed by `router` from normal(0, 1.5) logits, then (T > 1) route 1 of
// token 1 set to -1 (a route computed elsewhere), and random hidden states. Fatal failure if
// ft_route fails.
inline void routed_call(ft_session *router, int layer, int T, const ft_model_info &info, std::mt19937 &rng, DecodeCall *c) {
    const int E = info.num_experts, K = info.top_k;
    std::normal_distribution<float> n(0.f, 1.5f);
    std::vector<float> logits(size_t(T) * E);
    for (float &v : logits) v = n(rng);
    c->layer = layer;
    c->T = T;
    c->ids.assign(size_t(T) * K, 0);
    c->w.assign(size_t(T) * K, 0.0f);
    ASSERT_EQ(ft_route(router, layer, T, logits.data(), c->ids.data(), c->w.data()), FT_OK) << ft_session_last_error(router);
    if (T > 1) c->ids[size_t(K) + 1] = -1;
    c->x = random_bf16(rng, size_t(T) * info.hidden_size, 1.0f);
}

// ft_decode of `c` on `s` into *y (NaN-filled first); fatal failure, with the session's error,
// if the call fails.
inline void decode(ft_session *s, const DecodeCall &c, int hidden, std::vector<uint16_t> *y) {
    y->assign(size_t(c.T) * hidden, 0x7fc0);
    ASSERT_EQ(ft_decode(s, c.layer, c.T, c.x.data(), c.ids.data(), c.w.data(), y->data()), FT_OK) << ft_session_last_error(s);
}

// What one call gave on each backend.
struct BackendOutputs {
    std::vector<uint16_t> cpu, gpu, offload, hybrid;
};

// Decodes `c` on every session of `b` and checks what holds for any model: every call succeeds,
// offload equals gpu bit for bit (same kernels, same weights) and is finite (a poisoned slot
// read shows as NaN), and gpu and hybrid (whose CPU partial sum is rounded to bf16 once more)
// are within `bound` of the cpu backend and of `ref`, the fp64 reference. Call it under
// ASSERT_NO_FATAL_FAILURE.
inline void decode_on_every_backend(BackendSessions &b, const DecodeCall &c, int hidden, const std::vector<double> &ref,
                                    double bound, BackendOutputs *out) {
    ASSERT_NO_FATAL_FAILURE(decode(b.cpu.get(), c, hidden, &out->cpu));
    ASSERT_NO_FATAL_FAILURE(decode(b.gpu.get(), c, hidden, &out->gpu));
    ASSERT_NO_FATAL_FAILURE(decode(b.offload.get(), c, hidden, &out->offload));
    ASSERT_NO_FATAL_FAILURE(decode(b.hybrid.get(), c, hidden, &out->hybrid));
    ASSERT_EQ(0, std::memcmp(out->gpu.data(), out->offload.data(), out->gpu.size() * 2)) << "offload differs from gpu";
    for (uint16_t v : out->offload) ASSERT_NE(v & 0x7f80, 0x7f80) << "non-finite output: a poisoned slot was read";
    const std::vector<double> cpu_ref = as_f64(out->cpu);
    EXPECT_LT(relative_error_bf16(out->gpu, cpu_ref), bound) << "gpu vs cpu";
    EXPECT_LT(relative_error_bf16(out->gpu, ref), bound) << "gpu vs reference";
    EXPECT_LT(relative_error_bf16(out->hybrid, ref), bound) << "hybrid vs reference";
    EXPECT_LT(relative_error_bf16(out->hybrid, cpu_ref), bound) << "hybrid vs cpu";
}

// Route counts over a run, for the slot cache's figures: every valid route, and for the
// decode-sized calls (T < 64; larger ones take the prefill path) their number and the distinct
// experts of each.
struct RouteTally {
    uint64_t valid_routes = 0, decode_calls = 0, decode_distinct = 0;
    void add(const DecodeCall &c) {
        for (int32_t id : c.ids) valid_routes += id >= 0 ? 1 : 0;
        if (c.T >= 64) return;
        std::set<int32_t> distinct;
        for (int32_t id : c.ids)
            if (id >= 0) distinct.insert(id);
        decode_distinct += distinct.size();
        ++decode_calls;
    }
};

// Device buffers for one call of T tokens; with `misaligned` the hidden states start one bf16 off
// a 4-byte boundary.
struct DeviceCall {
    uint16_t *x = nullptr, *y = nullptr;
    int32_t *ids = nullptr;
    float *w = nullptr;
    size_t nx = 0, nr = 0;
    DeviceCall(int T, int H, int K, bool misaligned = false) : nx(size_t(T) * H), nr(size_t(T) * K) {
        EXPECT_EQ(cudaMalloc(&x_alloc_, (nx + 1) * 2), cudaSuccess);
        x = x_alloc_ + (misaligned ? 1 : 0);
        EXPECT_EQ(cudaMalloc(&y, nx * 2), cudaSuccess);
        EXPECT_EQ(cudaMalloc(&ids, nr * 4), cudaSuccess);
        EXPECT_EQ(cudaMalloc(&w, nr * 4), cudaSuccess);
    }
    ~DeviceCall() {
        cudaFree(x_alloc_);
        cudaFree(y);
        cudaFree(ids);
        cudaFree(w);
    }
    DeviceCall(const DeviceCall &) = delete;
    DeviceCall &operator=(const DeviceCall &) = delete;
    void upload(const std::vector<uint16_t> &hx, const std::vector<int32_t> &hids, const std::vector<float> &hw) {
        ASSERT_EQ(cudaMemcpy(x, hx.data(), nx * 2, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(ids, hids.data(), nr * 4, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(w, hw.data(), nr * 4, cudaMemcpyHostToDevice), cudaSuccess);
    }
    void upload(const DecodeCall &c) { upload(c.x, c.ids, c.w); }
    ft_status run(ft_session *s, int layer, int T, cudaStream_t stream = nullptr) const {
        return ft_decode_cuda(s, layer, T, x, ids, w, y, stream);
    }
    std::vector<uint16_t> output() const {
        std::vector<uint16_t> out(nx);
        EXPECT_EQ(cudaMemcpy(out.data(), y, nx * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        return out;
    }

private:
    uint16_t *x_alloc_ = nullptr;
};

// ft_decode_cuda of every MoE layer of `graphed` (T tokens each) captured once in a CUDA graph on
// a stream of its own, then replayed `steps` times; before every replay but the first, fresh
// inputs (random hidden states, K distinct experts per token with, when `drop_route` and T > 1,
// route 1 of token 1 set to -1, weights in [0.05, 1)) are uploaded into the captured buffers.
// check(step, layer, call, output) judges each layer's output after each replay. Call it under
// ASSERT_NO_FATAL_FAILURE.
inline void replay_layers_graph(ft_session *graphed, const ft_model_info &info, int T, int steps, uint32_t seed,
                                bool drop_route,
                                const std::function<void(int, int, const DecodeCall &, const std::vector<uint16_t> &)> &check) {
    const int L = info.num_layers, E = info.num_experts, K = info.top_k, H = info.hidden_size;
    std::vector<std::unique_ptr<DeviceCall>> dev;
    for (int l = 0; l < L; ++l) dev.push_back(std::make_unique<DeviceCall>(T, H, K));
    std::vector<DecodeCall> calls(static_cast<size_t>(L));
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> weight(0.05f, 1.0f);
    auto fresh_inputs = [&] {
        for (int l = 0; l < L; ++l) {
            DecodeCall &c = calls[l];
            c.layer = l;
            c.T = T;
            c.x = random_bf16(rng, size_t(T) * H, 1.0f);
            c.ids = distinct_ids(rng, T, K, E);
            if (drop_route && T > 1) c.ids[size_t(K) + 1] = -1;
            c.w.assign(size_t(T) * K, 0.0f);
            for (float &v : c.w) v = weight(rng);
            dev[l]->upload(c);
        }
    };
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_guard(stream, [](cudaStream_t s) { cudaStreamDestroy(s); });
    ASSERT_NO_FATAL_FAILURE(fresh_inputs());
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    for (int l = 0; l < L; ++l) {
        const ft_status s = dev[l]->run(graphed, l, T, stream);
        if (s != FT_OK) {
            cudaStreamEndCapture(stream, &graph);
            if (graph) cudaGraphDestroy(graph);
        }
        ASSERT_EQ(s, FT_OK) << ft_session_last_error(graphed);
    }
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    std::unique_ptr<CUgraph_st, void (*)(cudaGraph_t)> graph_guard(graph, [](cudaGraph_t g) { cudaGraphDestroy(g); });
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    std::unique_ptr<CUgraphExec_st, void (*)(cudaGraphExec_t)> exec_guard(exec, [](cudaGraphExec_t e) { cudaGraphExecDestroy(e); });
    for (int step = 0; step < steps; ++step) {
        if (step > 0) {
            ASSERT_NO_FATAL_FAILURE(fresh_inputs());
        }
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        for (int l = 0; l < L; ++l) ASSERT_NO_FATAL_FAILURE(check(step, l, calls[l], dev[l]->output()));
    }
}

}  // namespace ft::test
