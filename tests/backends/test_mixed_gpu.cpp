// GGUF models that mix block formats per layer and per matrix on the GPU backends: gpu, offload
// (one layer of slots, so slots keep changing between layers of different formats) and hybrid
// against the cpu backend and the fp64 reference, on the decode and the prefill paths, from host
// and device pointers, eager and replayed from a CUDA graph.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "api_handles.hpp"
#include "freetoken_cuda.h"
#include "ft/formats.hpp"
#include "ft/synth.hpp"
#include "synth_reference.hpp"

namespace {

using namespace ft::test;

bool gpu_engine(ft_engine *engine) {
    ft_engine_info info;
    info.struct_size = sizeof info;
    return engine && ft_engine_get_info(engine, &info) == FT_OK && info.device >= 0;
}

SessionPtr open_session(ft_model *m, int32_t backend, int max_tokens, int64_t cache_slots = 0, float hybrid_fraction = 0.5f) {
    ft_session_params p;
    ft_session_params_init(&p);
    p.backend = backend;
    p.max_tokens = max_tokens;
    p.cache_slots = cache_slots;
    p.vram_reserve_bytes = 0;
    p.hybrid_fraction = hybrid_fraction;
    p.hybrid_adaptive = false;
    p.handoff_timeout_seconds = 10.0;
    ft_session *s = nullptr;
    char err[512];
    EXPECT_EQ(ft_session_create(m, &p, &s, err, sizeof err), FT_OK) << err;
    return SessionPtr(s);
}

struct MixCase {
    const char *name;
    std::vector<std::string> mix;  // per MoE layer "GATEUP/DOWN" (ft::synth::Spec::gguf_mix)
};

void PrintTo(const MixCase &c, std::ostream *os) { *os << c.name; }

std::vector<MixCase> mix_cases() {
    return {
        // Q4_K_M's pattern: q4_k gate/up, q6_k down, in every layer.
        {"per_matrix", {"q4_k/q6_k"}},
        // Every block format, q4_0 (tensor-core kernel) next to the CUDA-core ones in one layer.
        {"per_layer", {"q4_k/q6_k", "q8_0/q4_k", "iq4_xs/iq4_xs", "q4_0/q5_k", "q2_k/q3_k", "q6_k/q4_0"}},
        // Formats that differ while the rows have the same size (q4_0 and q4_k: 0.5625 bytes a weight).
        {"equal_rows", {"q4_0/q4_0", "q4_k/q4_k"}},
    };
}

ft::synth::Spec mix_spec(const MixCase &c) {
    ft::synth::Spec s;
    s.architecture = "qwen3_moe";
    s.gguf = true;
    s.format = c.mix[0].substr(0, c.mix[0].find('/'));  // layer 0's gate_up
    s.gguf_mix = c.mix;
    s.num_layers = int(c.mix.size() < 3 ? 3 : c.mix.size());
    s.num_experts = 16;
    s.top_k = 4;
    s.hidden = 256;
    s.intermediate = 256;
    return s;
}

// Bytes of one expert of MoE layer `l` in its own formats.
uint64_t layer_expert_bytes(ft_model *m, int l, int H, int I) {
    int32_t gu = 0, dn = 0;
    EXPECT_EQ(ft_model_layer_formats(m, l, &gu, &dn), FT_OK);
    return ft::bank_schema(ft::Format(gu), H, I)[0].row_bytes + ft::bank_schema(ft::Format(dn), H, I)[1].row_bytes;
}

// Device copies of one call's inputs and its output.
struct DeviceCall {
    uint16_t *x = nullptr, *y = nullptr;
    int32_t *ids = nullptr;
    float *w = nullptr;
    size_t nx = 0, nr = 0;
    DeviceCall(int T, int H, int K) : nx(size_t(T) * H), nr(size_t(T) * K) {
        EXPECT_EQ(cudaMalloc(&x, nx * 2), cudaSuccess);
        EXPECT_EQ(cudaMalloc(&y, nx * 2), cudaSuccess);
        EXPECT_EQ(cudaMalloc(&ids, nr * 4), cudaSuccess);
        EXPECT_EQ(cudaMalloc(&w, nr * 4), cudaSuccess);
    }
    ~DeviceCall() {
        cudaFree(x);
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
    std::vector<uint16_t> output() const {
        std::vector<uint16_t> out(nx);
        EXPECT_EQ(cudaMemcpy(out.data(), y, nx * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        return out;
    }
};

class MixedGpu : public ::testing::TestWithParam<MixCase> {};

// cpu, gpu, offload and hybrid decode the same calls (1, 3, 8 tokens, and 80: the prefill path);
// offload equals gpu bit for bit (same kernels, same weights), ft_decode_cuda equals ft_decode,
// both match the cpu backend and the fp64 reference within the bound of the GGUF formats on
// the GPU (tests/backends AllFormats), and the slot cache counts each layer's own bytes.
TEST_P(MixedGpu, EveryBackendMatchesCpuAndReference) {
    const MixCase &c = GetParam();
    auto engine = make_engine();
    if (!gpu_engine(engine.get())) GTEST_SKIP() << "no usable GPU";
    const ft::synth::Spec s = mix_spec(c);
    ScratchDir dir;
    const std::string path = write_synth_model(dir.path(), s);
    ft_model *raw = nullptr;
    char err[512];
    ASSERT_EQ(ft_model_load(engine.get(), path.c_str(), nullptr, &raw, err, sizeof err), FT_OK) << err;
    ModelPtr model(raw);
    ft_model_info info;
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_model_get_info(raw, &info), FT_OK);
    ASSERT_EQ(info.mixed_formats, 1);
    const int L = info.num_layers, E = info.num_experts, K = info.top_k, H = info.hidden_size, I = info.intermediate_size;

    const int kMaxTokens = 96;  // > the default prefill threshold of 64
    auto cpu = open_session(raw, FT_BACKEND_CPU, kMaxTokens);
    auto gpu = open_session(raw, FT_BACKEND_GPU, kMaxTokens);
    auto off = open_session(raw, FT_BACKEND_OFFLOAD, kMaxTokens, E);      // one layer of slots
    auto off_dev = open_session(raw, FT_BACKEND_OFFLOAD, kMaxTokens, E);  // driven by ft_decode_cuda
    auto hyb = open_session(raw, FT_BACKEND_HYBRID, kMaxTokens, E, 0.4f);
    ASSERT_TRUE(cpu && gpu && off && off_dev && hyb);
    EXPECT_EQ(ft_session_backend(gpu.get()), FT_BACKEND_GPU);
    EXPECT_EQ(ft_session_backend(off.get()), FT_BACKEND_OFFLOAD);
    EXPECT_EQ(ft_session_backend(hyb.get()), FT_BACKEND_HYBRID);

    const double bound = 3e-2;
    ft::test::ActivationRef act{info.activation, info.swiglu_alpha, info.swiglu_limit};
    const ft::test::FormatNumerics fmt;
    std::vector<SynthLayerRef> layer_ref;
    for (int l = 0; l < L; ++l) layer_ref.emplace_back(s, l, E);

    std::mt19937 rng(4321);
    std::normal_distribution<float> n(0.f, 1.5f);
    uint64_t decode_distinct = 0, valid_routes = 0;
    const int kSteps = 8;
    for (int step = 0; step < kSteps; ++step) {
        for (int l = 0; l < L; ++l) {
            const int T = step % 4 == 3 ? 80 : std::vector<int>{1, 3, 8}[(step + l) % 3];
            SCOPED_TRACE(::testing::Message() << c.name << " step " << step << " layer " << l << " T " << T);
            std::vector<float> logits(size_t(T) * E);
            for (float &v : logits) v = n(rng);
            std::vector<int32_t> ids(size_t(T) * K);
            std::vector<float> w(size_t(T) * K);
            ASSERT_EQ(ft_route(cpu.get(), l, T, logits.data(), ids.data(), w.data()), FT_OK);
            if (T > 1) ids[K + 1] = -1;  // a route computed elsewhere
            const auto x = random_bf16(rng, size_t(T) * H, 1.0f);
            std::vector<uint16_t> y_cpu(size_t(T) * H), y_gpu(size_t(T) * H, 0x7fc0), y_off(size_t(T) * H, 0x7fc0),
                y_hyb(size_t(T) * H, 0x7fc0);
            ASSERT_EQ(ft_decode(cpu.get(), l, T, x.data(), ids.data(), w.data(), y_cpu.data()), FT_OK);
            ASSERT_EQ(ft_decode(gpu.get(), l, T, x.data(), ids.data(), w.data(), y_gpu.data()), FT_OK)
                << ft_session_last_error(gpu.get());
            ASSERT_EQ(ft_decode(off.get(), l, T, x.data(), ids.data(), w.data(), y_off.data()), FT_OK)
                << ft_session_last_error(off.get());
            ASSERT_EQ(ft_decode(hyb.get(), l, T, x.data(), ids.data(), w.data(), y_hyb.data()), FT_OK)
                << ft_session_last_error(hyb.get());
            ASSERT_EQ(0, std::memcmp(y_gpu.data(), y_off.data(), y_gpu.size() * 2)) << "offload differs from gpu";
            for (uint16_t v : y_off) ASSERT_NE(v & 0x7f80, 0x7f80) << "non-finite output: a poisoned slot was read";
            for (int32_t id : ids) valid_routes += id >= 0 ? 1 : 0;

            std::vector<double> cpu_ref(y_cpu.size());
            for (size_t i = 0; i < y_cpu.size(); ++i) cpu_ref[i] = ft::test::bf16_to_f64(y_cpu[i]);
            const auto ref = ft::test::moe_reference_f32([&](int32_t e) { return layer_ref[l].expert(e); }, E, act, fmt,
                                                         H, I, T, K, x.data(), ids.data(), w.data());
            EXPECT_LT(ft::test::relative_error_bf16(y_gpu, cpu_ref), bound) << "gpu vs cpu";
            EXPECT_LT(ft::test::relative_error_bf16(y_gpu, ref), bound) << "gpu vs reference";
            EXPECT_LT(ft::test::relative_error_bf16(y_hyb, cpu_ref), bound) << "hybrid vs cpu";
            EXPECT_LT(ft::test::relative_error_bf16(y_hyb, ref), bound) << "hybrid vs reference";

            // Device pointers (decode and prefill sizes): the same bytes as the host calls.
            DeviceCall dc(T, H, K);
            dc.upload(x, ids, w);
            for (ft_session *sess : {gpu.get(), off_dev.get()}) {
                ASSERT_EQ(cudaMemset(dc.y, 0xff, dc.nx * 2), cudaSuccess);
                ASSERT_EQ(ft_decode_cuda(sess, l, T, dc.x, dc.ids, dc.w, dc.y, nullptr), FT_OK) << ft_session_last_error(sess);
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                EXPECT_EQ(0, std::memcmp(dc.output().data(), y_gpu.data(), y_gpu.size() * 2))
                    << "ft_decode_cuda differs from ft_decode (" << (sess == gpu.get() ? "gpu" : "offload") << ")";
            }
            if (T < 64) {
                std::set<int32_t> distinct;
                for (int32_t id : ids)
                    if (id >= 0) distinct.insert(id);
                decode_distinct += distinct.size();
            }
        }
    }

    // Offload: every decode miss fetched, each counted at its layer's own expert bytes.
    ft_session_stats st;
    st.struct_size = sizeof st;
    ASSERT_EQ(ft_session_get_stats(off.get(), &st), FT_OK);
    EXPECT_EQ(st.cache_hits + st.cache_misses, decode_distinct);
    EXPECT_EQ(st.fetched_experts, st.cache_misses);
    EXPECT_GT(st.cache_misses, uint64_t(E));  // one layer of slots: layers keep evicting each other
    uint64_t bytes = 0;
    for (int l = 0; l < L; ++l) {
        ft_layer_stats ls;
        ls.struct_size = sizeof ls;
        ASSERT_EQ(ft_session_get_layer_stats(off.get(), l, &ls), FT_OK);
        EXPECT_EQ(ls.fetched_bytes, ls.fetched_experts * layer_expert_bytes(raw, l, H, I)) << "layer " << l;
        bytes += ls.fetched_bytes;
    }
    EXPECT_EQ(st.fetched_bytes, bytes);
    EXPECT_EQ(st.prefill_calls, uint64_t(kSteps / 4 * L));
    EXPECT_EQ(ft_session_status(off.get()), FT_OK);

    // Hybrid: every route computed once, by one side or the other; the CPU took some.
    ASSERT_EQ(ft_session_get_stats(hyb.get(), &st), FT_OK);
    EXPECT_EQ(st.routes_gpu + st.routes_cpu, valid_routes);
    EXPECT_GT(st.routes_cpu, 0u);
    EXPECT_GT(st.fetched_experts, 0u);
    EXPECT_EQ(ft_session_status(hyb.get()), FT_OK);
}

// ft_decode_cuda of every layer captured once in a CUDA graph (offload and hybrid, one layer of
// slots) and replayed with new inputs: each replay equals the gpu backend's host calls.
TEST_P(MixedGpu, GraphReplayEqualsResident) {
    const MixCase &c = GetParam();
    auto engine = make_engine();
    if (!gpu_engine(engine.get())) GTEST_SKIP() << "no usable GPU";
    const ft::synth::Spec s = mix_spec(c);
    ScratchDir dir;
    const std::string path = write_synth_model(dir.path(), s);
    ft_model *raw = nullptr;
    char err[512];
    ASSERT_EQ(ft_model_load(engine.get(), path.c_str(), nullptr, &raw, err, sizeof err), FT_OK) << err;
    ModelPtr model(raw);
    ft_model_info info;
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_model_get_info(raw, &info), FT_OK);
    const int L = info.num_layers, E = info.num_experts, K = info.top_k, H = info.hidden_size, T = 4;
    auto gpu = open_session(raw, FT_BACKEND_GPU, 16);
    ASSERT_TRUE(gpu);
    for (int32_t backend : {FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID}) {
        SCOPED_TRACE(backend == FT_BACKEND_HYBRID ? "hybrid" : "offload");
        auto graphed = open_session(raw, backend, 16, E, 0.5f);
        ASSERT_TRUE(graphed);
        std::vector<std::unique_ptr<DeviceCall>> calls;
        for (int l = 0; l < L; ++l) calls.push_back(std::make_unique<DeviceCall>(T, H, K));
        std::mt19937 rng(17);
        std::uniform_int_distribution<int> pick(0, E - 1);
        std::uniform_real_distribution<float> weight(0.05f, 1.0f);
        std::vector<std::vector<uint16_t>> xs(L);
        std::vector<std::vector<int32_t>> idss(L);
        std::vector<std::vector<float>> ws(L);
        auto fresh_inputs = [&] {
            for (int l = 0; l < L; ++l) {
                xs[l] = random_bf16(rng, size_t(T) * H, 1.0f);
                idss[l].assign(size_t(T) * K, -1);
                for (int t = 0; t < T; ++t) {
                    std::set<int> used;
                    for (int k = 0; k < K; ++k) {
                        int e;
                        do e = pick(rng);
                        while (!used.insert(e).second);
                        idss[l][size_t(t) * K + k] = e;
                    }
                }
                ws[l].assign(size_t(T) * K, 0.0f);
                for (float &v : ws[l]) v = weight(rng);
                calls[l]->upload(xs[l], idss[l], ws[l]);
            }
        };
        cudaStream_t stream;
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
        fresh_inputs();
        cudaGraph_t graph;
        ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        for (int l = 0; l < L; ++l)
            ASSERT_EQ(ft_decode_cuda(graphed.get(), l, T, calls[l]->x, calls[l]->ids, calls[l]->w, calls[l]->y, stream), FT_OK)
                << ft_session_last_error(graphed.get());
        ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
        cudaGraphExec_t exec;
        ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        for (int step = 0; step < 6; ++step) {
            if (step > 0) fresh_inputs();
            ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            for (int l = 0; l < L; ++l) {
                std::vector<uint16_t> want(size_t(T) * H);
                ASSERT_EQ(ft_decode(gpu.get(), l, T, xs[l].data(), idss[l].data(), ws[l].data(), want.data()), FT_OK);
                const std::vector<uint16_t> got = calls[l]->output();
                if (backend == FT_BACKEND_OFFLOAD) {
                    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 2)) << "step " << step << " layer " << l;
                } else {  // the CPU's share is summed apart and rounded once more
                    std::vector<double> ref(want.size());
                    for (size_t i = 0; i < want.size(); ++i) ref[i] = ft::test::bf16_to_f64(want[i]);
                    EXPECT_LT(ft::test::relative_error_bf16(got, ref), 3e-2) << "step " << step << " layer " << l;
                }
            }
        }
        EXPECT_EQ(ft_session_status(graphed.get()), FT_OK);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaStreamDestroy(stream);
    }
}

INSTANTIATE_TEST_SUITE_P(Mixes, MixedGpu, ::testing::ValuesIn(mix_cases()),
                         [](const ::testing::TestParamInfo<MixCase> &i) { return std::string(i.param.name); });

}  // namespace
