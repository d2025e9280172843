// GGUF models that mix block formats per layer and per matrix on the GPU backends: gpu, offload
// (one layer of slots, so slots keep changing between layers of different formats) and hybrid
// against the cpu backend and the fp64 reference, on the decode and the prefill paths, from host
// and device pointers, eager and replayed from a CUDA graph.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ft/formats.hpp"
#include "ft/synth.hpp"
#include "gpu_sessions.hpp"
#include "synth_reference.hpp"

namespace {

using namespace ft::test;

struct MixCase {
    const char *name;
    std::vector<std::string> mix;  // per MoE layer "GATEUP/DOWN" (ft::synth::Spec::gguf_mix)
};

void PrintTo(const MixCase &c, std::ostream *os) { *os << c.name; }

std::vector<MixCase> mix_cases() {
    return {
        // Q4_K_M's pattern: q4_k gate/up, q6_k down, in every layer.
        {"per_matrix", {"q4_k/q6_k"}},
        // Every block format across the layers, most layers' gate_up and down in different ones.
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
    ft_model_info info;
    ModelPtr model = load_model(engine.get(), write_synth_model(dir.path(), s), &info);
    ASSERT_TRUE(model);
    ft_model *raw = model.get();
    ASSERT_EQ(info.mixed_formats, 1);
    const int L = info.num_layers, E = info.num_experts, K = info.top_k, H = info.hidden_size, I = info.intermediate_size;

    const int kMaxTokens = 96;  // > the default prefill threshold of 64
    BackendSessions b(raw, kMaxTokens, E, 0.4f);                          // one layer of slots
    auto off_dev = open_session(raw, FT_BACKEND_OFFLOAD, kMaxTokens, E);  // driven by ft_decode_cuda
    ASSERT_TRUE(b.ok() && off_dev);
    EXPECT_EQ(ft_session_backend(b.gpu.get()), FT_BACKEND_GPU);
    EXPECT_EQ(ft_session_backend(b.offload.get()), FT_BACKEND_OFFLOAD);
    EXPECT_EQ(ft_session_backend(b.hybrid.get()), FT_BACKEND_HYBRID);

    const double bound = 5e-2;  // the K-quants' bound in AllFormats (Q8_K activations)
    ft::test::ActivationRef act{info.activation, info.swiglu_alpha, info.swiglu_limit};
    const ft::test::FormatNumerics fmt;
    std::vector<SynthLayerRef> layer_ref;
    for (int l = 0; l < L; ++l) layer_ref.emplace_back(s, l, E);

    std::mt19937 rng(4321);
    RouteTally tally;
    const int kSteps = 8;
    for (int step = 0; step < kSteps; ++step) {
        for (int l = 0; l < L; ++l) {
            const int T = step % 4 == 3 ? 80 : std::vector<int>{1, 3, 8}[(step + l) % 3];
            SCOPED_TRACE(::testing::Message() << c.name << " step " << step << " layer " << l << " T " << T);
            DecodeCall call;
            ASSERT_NO_FATAL_FAILURE(routed_call(b.cpu.get(), l, T, info, rng, &call));
            const auto ref = ft::test::moe_reference_f32([&](int32_t e) { return layer_ref[l].expert(e); }, E, act, fmt,
                                                         H, I, T, K, call.x.data(), call.ids.data(), call.w.data());
            BackendOutputs y;
            ASSERT_NO_FATAL_FAILURE(decode_on_every_backend(b, call, H, ref, bound, &y));
            tally.add(call);

            // Device pointers (decode and prefill sizes): the same bytes as the host calls.
            DeviceCall dc(T, H, K);
            dc.upload(call);
            for (ft_session *sess : {b.gpu.get(), off_dev.get()}) {
                ASSERT_EQ(cudaMemset(dc.y, 0xff, dc.nx * 2), cudaSuccess);
                ASSERT_EQ(dc.run(sess, l, T), FT_OK) << ft_session_last_error(sess);
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                EXPECT_EQ(0, std::memcmp(dc.output().data(), y.gpu.data(), y.gpu.size() * 2))
                    << "ft_decode_cuda differs from ft_decode (" << (sess == b.gpu.get() ? "gpu" : "offload") << ")";
            }
        }
    }

    // Offload: every decode miss fetched, each counted at its layer's own expert bytes.
    ft_session_stats st;
    st.struct_size = sizeof st;
    ASSERT_EQ(ft_session_get_stats(b.offload.get(), &st), FT_OK);
    EXPECT_EQ(st.cache_hits + st.cache_misses, tally.decode_distinct);
    EXPECT_EQ(st.fetched_experts, st.cache_misses);
    EXPECT_GT(st.cache_misses, uint64_t(E));  // one layer of slots: layers keep evicting each other
    uint64_t bytes = 0;
    for (int l = 0; l < L; ++l) {
        ft_layer_stats ls;
        ls.struct_size = sizeof ls;
        ASSERT_EQ(ft_session_get_layer_stats(b.offload.get(), l, &ls), FT_OK);
        EXPECT_EQ(ls.fetched_bytes, ls.fetched_experts * layer_expert_bytes(raw, l, H, I)) << "layer " << l;
        bytes += ls.fetched_bytes;
    }
    EXPECT_EQ(st.fetched_bytes, bytes);
    EXPECT_EQ(st.prefill_calls, uint64_t(kSteps / 4 * L));
    EXPECT_EQ(ft_session_status(b.offload.get()), FT_OK);

    // Hybrid: every route computed once, by one side or the other; the CPU took some.
    ASSERT_EQ(ft_session_get_stats(b.hybrid.get(), &st), FT_OK);
    EXPECT_EQ(st.routes_gpu + st.routes_cpu, tally.valid_routes);
    EXPECT_GT(st.routes_cpu, 0u);
    EXPECT_GT(st.fetched_experts, 0u);
    EXPECT_EQ(ft_session_status(b.hybrid.get()), FT_OK);
}

// ft_decode_cuda of every layer captured once in a CUDA graph (offload and hybrid, one layer of
// slots) and replayed with new inputs: each replay equals the gpu backend's host calls.
TEST_P(MixedGpu, GraphReplayEqualsResident) {
    const MixCase &c = GetParam();
    auto engine = make_engine();
    if (!gpu_engine(engine.get())) GTEST_SKIP() << "no usable GPU";
    const ft::synth::Spec s = mix_spec(c);
    ScratchDir dir;
    ft_model_info info;
    ModelPtr model = load_model(engine.get(), write_synth_model(dir.path(), s), &info);
    ASSERT_TRUE(model);
    const int E = info.num_experts, H = info.hidden_size, T = 4;
    auto gpu = open_session(model.get(), FT_BACKEND_GPU, 16);
    ASSERT_TRUE(gpu);
    for (int32_t backend : {FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID}) {
        SCOPED_TRACE(backend == FT_BACKEND_HYBRID ? "hybrid" : "offload");
        auto graphed = open_session(model.get(), backend, 16, E, 0.5f);
        ASSERT_TRUE(graphed);
        ASSERT_NO_FATAL_FAILURE(replay_layers_graph(
            graphed.get(), info, T, 6, 17, false,
            [&](int step, int l, const DecodeCall &in, const std::vector<uint16_t> &got) {
                std::vector<uint16_t> want(size_t(T) * H);
                ASSERT_EQ(ft_decode(gpu.get(), l, T, in.x.data(), in.ids.data(), in.w.data(), want.data()), FT_OK);
                if (backend == FT_BACKEND_OFFLOAD) {
                    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 2)) << "step " << step << " layer " << l;
                } else {  // the CPU's share is summed apart and rounded once more
                    EXPECT_LT(ft::test::relative_error_bf16(got, as_f64(want)), 5e-2) << "step " << step << " layer " << l;
                }
            }));
        EXPECT_EQ(ft_session_status(graphed.get()), FT_OK);
    }
}

INSTANTIATE_TEST_SUITE_P(Mixes, MixedGpu, ::testing::ValuesIn(mix_cases()),
                         [](const ::testing::TestParamInfo<MixCase> &i) { return std::string(i.param.name); });

}  // namespace
