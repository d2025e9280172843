// bf16 gpt-oss's expert biases on the GPU backends (gpu, offload, hybrid) through the public C
// API: a checkpoint written as transformers saves it (gate/up interleaved on the last axis,
// non-zero bf16 biases) equals the cpu backend and the fp64 reference on the decode path (tensor-
// core and CUDA-core kernels) and the prefill path, from host pointers, device pointers and a
// replayed CUDA graph; the same weights with zero biases give visibly different outputs, and so
// does the reference without either bias, so the comparisons show both biases are added.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "ft/synth.hpp"
#include "gpu_sessions.hpp"

namespace {

using namespace ft::test;

// A bf16 gpt-oss model: per layer the de-interleaved experts (gate / up [E, I, H], down [E, H, I])
// and their biases (gate / up [E, I], down [E, H]), every value bf16-exact.
struct GptOssBf16 {
    int L, E, K, H, I;
    std::vector<std::vector<float>> gate, up, down, bias_gate, bias_up, bias_down, router, router_bias;

    GptOssBf16(int layers, int experts, int top_k, int hidden, int inter, uint32_t seed)
        : L(layers), E(experts), K(top_k), H(hidden), I(inter) {
        std::mt19937 rng(seed);
        auto draw = [&rng](size_t n, double scale) {
            std::uniform_real_distribution<float> u(-float(scale), float(scale));
            std::vector<float> v(n);
            for (float &x : v) x = float(bf16_to_f64(f32_to_bf16_rne(u(rng))));
            return v;
        };
        const double sh = 1.0 / std::sqrt(double(H)), si = 1.0 / std::sqrt(double(I));
        for (int l = 0; l < L; ++l) {
            gate.push_back(draw(size_t(E) * I * H, 1.5 * sh));
            up.push_back(draw(size_t(E) * I * H, 1.5 * sh));
            down.push_back(draw(size_t(E) * H * I, 1.5 * si));
            bias_gate.push_back(draw(size_t(E) * I, 0.5));
            bias_up.push_back(draw(size_t(E) * I, 0.5));
            bias_down.push_back(draw(size_t(E) * H, 0.2));
            router.push_back(draw(size_t(E) * H, sh));
            router_bias.push_back(draw(size_t(E), 0.1));
        }
    }

    static ft::synth::RawTensor bf16(const std::string &name, std::vector<int64_t> shape, const std::vector<float> &v) {
        ft::synth::RawTensor t{name, "BF16", std::move(shape), std::vector<uint8_t>(v.size() * 2)};
        for (size_t i = 0; i < v.size(); ++i) {
            const uint16_t b = f32_to_bf16_rne(v[i]);
            std::memcpy(t.bytes.data() + 2 * i, &b, 2);
        }
        return t;
    }

    // config.json and model.safetensors in the layout of the bf16 releases: gate_up_proj
    // [E, H, 2I] with column 2i gate unit i and 2i + 1 up unit i, its bias [E, 2I] alike,
    // down_proj [E, I, H], down_proj_bias [E, H]. zero_biases: the same weights, expert biases 0.
    void write(const std::string &dir, bool zero_biases) const {
        std::ofstream(dir + "/config.json")
            << "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"hidden_size\": " << H
            << ", \"intermediate_size\": " << I << ", \"num_hidden_layers\": " << L << ", \"num_local_experts\": " << E
            << ", \"num_experts_per_tok\": " << K << ", \"swiglu_limit\": 7.0, \"hidden_act\": \"silu\"}";
        std::vector<ft::synth::RawTensor> tensors;
        for (int l = 0; l < L; ++l) {
            std::vector<float> gu(size_t(E) * H * 2 * I), gub(size_t(E) * 2 * I), dn(size_t(E) * I * H), dnb(size_t(E) * H);
            for (size_t e = 0; e < size_t(E); ++e) {
                for (size_t i = 0; i < size_t(I); ++i) {
                    for (size_t h = 0; h < size_t(H); ++h) {
                        gu[(e * H + h) * 2 * I + 2 * i] = gate[l][(e * I + i) * H + h];
                        gu[(e * H + h) * 2 * I + 2 * i + 1] = up[l][(e * I + i) * H + h];
                        dn[(e * I + i) * H + h] = down[l][(e * H + h) * I + i];
                    }
                    gub[e * 2 * I + 2 * i] = zero_biases ? 0.0f : bias_gate[l][e * I + i];
                    gub[e * 2 * I + 2 * i + 1] = zero_biases ? 0.0f : bias_up[l][e * I + i];
                }
                for (size_t h = 0; h < size_t(H); ++h) dnb[e * H + h] = zero_biases ? 0.0f : bias_down[l][e * H + h];
            }
            const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
            tensors.push_back(bf16(p + "experts.gate_up_proj", {E, H, 2 * I}, gu));
            tensors.push_back(bf16(p + "experts.gate_up_proj_bias", {E, 2 * I}, gub));
            tensors.push_back(bf16(p + "experts.down_proj", {E, I, H}, dn));
            tensors.push_back(bf16(p + "experts.down_proj_bias", {E, H}, dnb));
            tensors.push_back(bf16(p + "router.weight", {E, H}, router[l]));
            tensors.push_back(bf16(p + "router.bias", {E}, router_bias[l]));
        }
        ft::synth::write_safetensors(dir + "/model.safetensors", tensors);
    }

    // The fp64 reference of layer l; without_gu / without_dn leave those biases out.
    std::vector<double> reference(int l, int T, const uint16_t *x, const int32_t *ids, const float *w,
                                  bool without_gu = false, bool without_dn = false) const {
        const ActivationRef act{FT_ACT_SWIGLU_CLAMP, 1.702, 7.0};
        return moe_reference_f32(
            [&](int32_t e) {
                ExpertF32 ex{gate[l].data() + size_t(e) * I * H, up[l].data() + size_t(e) * I * H,
                             down[l].data() + size_t(e) * H * I};
                if (!without_gu) ex.bias_gate = bias_gate[l].data() + size_t(e) * I, ex.bias_up = bias_up[l].data() + size_t(e) * I;
                if (!without_dn) ex.bias_down = bias_down[l].data() + size_t(e) * H;
                return ex;
            },
            E, act, {}, H, I, T, K, x, ids, w);
    }

};

// Sessions of these tests: hybrid at a fixed f = 0.4.
SessionPtr open(ft_model *m, int32_t backend, int max_tokens, int64_t cache_slots = 0) {
    return open_session(m, backend, max_tokens, cache_slots, 0.4f);
}

// T tokens of K distinct experts each; route 1 of token 1 left to "elsewhere" (-1).
std::vector<int32_t> ids_with_a_dropped_route(std::mt19937 &rng, int T, int K, int E) {
    std::vector<int32_t> ids = distinct_ids(rng, T, K, E);
    if (T > 1) ids[size_t(K) + 1] = -1;
    return ids;
}

constexpr double kBound = 1e-2;    // GPU vs cpu and vs the reference (the bf16 AllFormats bound)
constexpr double kVisible = 5e-2;  // a missing bias changes the output by more than this

// Decode-sized and prefill-sized calls on every GPU backend against cpu and the fp64 reference,
// and ft_decode_cuda from device pointers (the hidden states one bf16 off a 4-byte boundary).
// Shapes: H, I multiples of 8 (tensor-core decode, prefill at 80 tokens) and not (the CUDA-core
// decode kernel; max_tokens below the prefill threshold).
TEST(ExpertBiasesGpu, EveryBackendMatchesCpuAndReference) {
    auto engine = make_engine();
    if (!gpu_engine(engine.get())) GTEST_SKIP() << "no usable GPU";
    struct Shape {
        int H, I, max_tokens;
        std::vector<int> tokens;
    };
    for (const Shape &sh : {Shape{128, 64, 96, {1, 3, 8, 17, 80}}, Shape{36, 20, 32, {1, 5, 13, 32}}}) {
        SCOPED_TRACE("H " + std::to_string(sh.H) + " I " + std::to_string(sh.I));
        GptOssBf16 m(3, 16, 4, sh.H, sh.I, 2024 + uint32_t(sh.H));
        ScratchDir with, without;
        m.write(with.path(), false);
        m.write(without.path(), true);
        ModelPtr model = load_model(engine.get(), with.path()), zeroed = load_model(engine.get(), without.path());
        ASSERT_TRUE(model && zeroed);
        ft_model_info info;
        info.struct_size = sizeof info;
        ASSERT_EQ(ft_model_get_info(model.get(), &info), FT_OK);
        ASSERT_EQ(info.expert_biases, 1);
        ASSERT_EQ(info.format, FT_FORMAT_BF16);
        ASSERT_EQ(info.activation, FT_ACT_SWIGLU_CLAMP);
        const int E = m.E, K = m.K, H = m.H, T_max = sh.max_tokens;

        auto cpu = open(model.get(), FT_BACKEND_CPU, T_max);
        auto cpu0 = open(zeroed.get(), FT_BACKEND_CPU, T_max);
        auto gpu0 = open(zeroed.get(), FT_BACKEND_GPU, T_max);
        std::vector<SessionPtr> gpus;
        gpus.push_back(open(model.get(), FT_BACKEND_GPU, T_max));
        gpus.push_back(open(model.get(), FT_BACKEND_OFFLOAD, T_max, E));  // one layer of slots: slot != expert
        gpus.push_back(open(model.get(), FT_BACKEND_HYBRID, T_max, E));
        ASSERT_TRUE(cpu && cpu0 && gpu0 && gpus[0] && gpus[1] && gpus[2]);

        std::mt19937 rng(77 + uint32_t(H));
        std::uniform_real_distribution<float> wd(0.05f, 1.0f);
        for (int step = 0; step < 8; ++step) {
            for (int l = 0; l < m.L; ++l) {
                const int T = sh.tokens[size_t(step + l) % sh.tokens.size()];
                SCOPED_TRACE("step " + std::to_string(step) + " layer " + std::to_string(l) + " T " + std::to_string(T));
                const auto ids = ids_with_a_dropped_route(rng, T, K, E);
                std::vector<float> w(size_t(T) * K);
                for (float &v : w) v = wd(rng);
                const auto x = random_bf16(rng, size_t(T) * H, 1.0f);
                std::vector<uint16_t> y_cpu(size_t(T) * H), y_cpu0(size_t(T) * H), y_gpu0(size_t(T) * H, 0x7fc0);
                ASSERT_EQ(ft_decode(cpu.get(), l, T, x.data(), ids.data(), w.data(), y_cpu.data()), FT_OK);
                ASSERT_EQ(ft_decode(cpu0.get(), l, T, x.data(), ids.data(), w.data(), y_cpu0.data()), FT_OK);
                ASSERT_EQ(ft_decode(gpu0.get(), l, T, x.data(), ids.data(), w.data(), y_gpu0.data()), FT_OK)
                    << ft_session_last_error(gpu0.get());
                const auto ref = m.reference(l, T, x.data(), ids.data(), w.data());
                const auto ref_no_gu = m.reference(l, T, x.data(), ids.data(), w.data(), true, false);
                const auto ref_no_dn = m.reference(l, T, x.data(), ids.data(), w.data(), false, true);
                const auto ref_none = m.reference(l, T, x.data(), ids.data(), w.data(), true, true);
                const auto cpu_ref = as_f64(y_cpu);
                ASSERT_LT(relative_error_bf16(y_cpu, ref), kBound) << "the cpu backend and the reference disagree";
                // The zero-bias model: the biases are a visible part of the output, on cpu and gpu alike.
                EXPECT_GT(relative_error_bf16(y_cpu0, cpu_ref), kVisible);
                EXPECT_LT(relative_error_bf16(y_gpu0, ref_none), kBound) << "gpu, zero biases";
                EXPECT_LT(relative_error_bf16(y_gpu0, as_f64(y_cpu0)), kBound) << "gpu vs cpu, zero biases";

                std::vector<std::vector<uint16_t>> ys;
                for (size_t b = 0; b < gpus.size(); ++b) {
                    std::vector<uint16_t> y(size_t(T) * H, 0x7fc0);
                    ASSERT_EQ(ft_decode(gpus[b].get(), l, T, x.data(), ids.data(), w.data(), y.data()), FT_OK)
                        << ft_session_last_error(gpus[b].get());
                    EXPECT_LT(relative_error_bf16(y, cpu_ref), kBound) << "backend " << b << " vs cpu";
                    EXPECT_LT(relative_error_bf16(y, ref), kBound) << "backend " << b << " vs reference";
                    EXPECT_GT(relative_error_bf16(y, ref_no_gu), kVisible) << "backend " << b << ": gate/up biases missing?";
                    EXPECT_GT(relative_error_bf16(y, ref_no_dn), kVisible) << "backend " << b << ": down biases missing?";
                    ys.push_back(std::move(y));
                }
                // gpu and offload run the same kernels on the same weights: identical bytes.
                EXPECT_EQ(0, std::memcmp(ys[0].data(), ys[1].data(), ys[0].size() * 2)) << "gpu vs offload";

                // Device pointers on every GPU backend (decode-sized calls).
                if (T < 64) {
                    DeviceCall dc(T, H, K, true);
                    ASSERT_NO_FATAL_FAILURE(dc.upload(x, ids, w));
                    for (size_t b = 0; b < gpus.size(); ++b) {
                        ASSERT_EQ(cudaMemset(dc.y, 0xff, dc.nx * 2), cudaSuccess);
                        EXPECT_EQ(dc.run(gpus[b].get(), l, T), FT_OK) << ft_session_last_error(gpus[b].get());
                        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                        const std::vector<uint16_t> y = dc.output();
                        EXPECT_LT(relative_error_bf16(y, cpu_ref), kBound) << "device pointers, backend " << b;
                        EXPECT_GT(relative_error_bf16(y, ref_none), kVisible) << "device pointers, backend " << b;
                    }
                }
            }
        }
        // Hybrid: the CPU's share (with the biases from the model) took part.
        ft_session_stats st;
        st.struct_size = sizeof st;
        ASSERT_EQ(ft_session_get_stats(gpus[2].get(), &st), FT_OK);
        EXPECT_GT(st.routes_cpu, 0u);
        EXPECT_GT(st.routes_gpu, 0u);
        if (T_max >= 64) {
            ASSERT_EQ(ft_session_get_stats(gpus[0].get(), &st), FT_OK);
            EXPECT_GT(st.prefill_calls, 0u);
        }
        for (const SessionPtr &s : gpus) EXPECT_EQ(ft_session_status(s.get()), FT_OK);
    }
}

// ft_decode_cuda of every layer captured in one CUDA graph on gpu, offload and hybrid (the bias
// tables are read inside the captured kernels) and replayed with new inputs (offload and hybrid
// through evictions): each replay matches the cpu backend.
TEST(ExpertBiasesGpu, GraphReplayMatchesCpu) {
    auto engine = make_engine();
    if (!gpu_engine(engine.get())) GTEST_SKIP() << "no usable GPU";
    GptOssBf16 m(3, 16, 4, 128, 64, 99);
    ScratchDir dir;
    m.write(dir.path(), false);
    ft_model_info info;
    ModelPtr model = load_model(engine.get(), dir.path(), &info);
    ASSERT_TRUE(model);
    const int E = m.E, H = m.H, T = 4;
    auto cpu = open(model.get(), FT_BACKEND_CPU, 16);
    for (int32_t backend : {FT_BACKEND_GPU, FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID}) {
        SCOPED_TRACE("backend " + std::to_string(backend));
        auto graphed = open(model.get(), backend, 16, backend == FT_BACKEND_GPU ? 0 : E);
        ASSERT_TRUE(cpu && graphed);
        ASSERT_NO_FATAL_FAILURE(replay_layers_graph(
            graphed.get(), info, T, 10, 5 + uint32_t(backend), true,
            [&](int step, int l, const DecodeCall &in, const std::vector<uint16_t> &y) {
                std::vector<uint16_t> y_cpu(size_t(T) * H);
                ASSERT_EQ(ft_decode(cpu.get(), l, T, in.x.data(), in.ids.data(), in.w.data(), y_cpu.data()), FT_OK);
                EXPECT_LT(relative_error_bf16(y, as_f64(y_cpu)), kBound) << "step " << step << " layer " << l;
                const auto ref_none = m.reference(l, T, in.x.data(), in.ids.data(), in.w.data(), true, true);
                EXPECT_GT(relative_error_bf16(y, ref_none), kVisible) << "step " << step << " layer " << l;
            }));
        EXPECT_EQ(ft_session_status(graphed.get()), FT_OK);
    }
}

}  // namespace
