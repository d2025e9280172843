// The whole MoE block of every supported architecture, from a checkpoint written in its real
// Hugging Face layout: ft_model_load, then ft_route on router logits, then ft_decode (with the
// shared experts), against an fp64 reference built from the values the writer put in the files.
#include <gtest/gtest.h>

#include <cmath>

#include "api_handles.hpp"
#include "ft/synth.hpp"
#include "routing_reference.hpp"

namespace {

using namespace ft::test;
using ft::test::ActivationRef;
using ft::test::ExpertRef;

struct ArchCase {
    const char *name;
    ft::synth::Spec spec;
    int32_t routing;
};

ft::synth::Spec base(const char *arch) {
    ft::synth::Spec s;
    s.architecture = arch;
    s.num_layers = 2;
    s.num_experts = 16;
    s.top_k = 4;
    s.hidden = 160;
    s.intermediate = 96;
    return s;
}

std::vector<ArchCase> cases() {
    std::vector<ArchCase> c;
    {
        ft::synth::Spec s = base("qwen3_moe");
        s.seed = 11;
        c.push_back({"qwen3_moe_per_expert", s, FT_ROUTING_SOFTMAX_TOPK_RENORM});
        s.layout = ft::synth::Spec::Layout::fused;
        s.norm_topk_prob = false;
        s.shards = 3;
        s.seed = 12;
        c.push_back({"qwen3_moe_fused_no_renorm", s, FT_ROUTING_SOFTMAX_TOPK});
    }
    {
        ft::synth::Spec s = base("qwen3_5_moe");
        s.layout = ft::synth::Spec::Layout::fused;
        s.language_model_prefix = true;
        s.shared_intermediate = 80;
        s.seed = 13;
        c.push_back({"qwen3_5_moe_fused_shared_gate", s, FT_ROUTING_SOFTMAX_TOPK_RENORM});
    }
    {
        ft::synth::Spec s = base("mixtral");
        s.top_k = 2;
        s.num_experts = 8;
        s.seed = 14;
        s.shards = 2;
        c.push_back({"mixtral", s, FT_ROUTING_SOFTMAX_TOPK_RENORM});
    }
    for (const char *arch : {"deepseek_v3", "kimi_k2", "glm4_moe"}) {
        ft::synth::Spec s = base(arch);
        s.num_layers = 3;
        s.first_dense = 1;
        s.mtp_layer = true;
        s.n_group = 4;
        s.topk_group = 2;
        s.routed_scaling_factor = 2.5f;
        s.shared_intermediate = s.intermediate;
        s.seed = 15;
        s.shards = 2;
        c.push_back({arch, s, FT_ROUTING_SIGMOID_GROUP_TOPK});
    }
    {
        ft::synth::Spec s = base("qwen3_moe");
        s.expert_dtype = "F32";
        s.hidden_act = "gelu";
        s.seed = 16;
        c.push_back({"qwen3_moe_f32_gelu", s, FT_ROUTING_SOFTMAX_TOPK_RENORM});
    }
    return c;
}

// Test names and failure messages show the case's name, not its bytes.
void PrintTo(const ArchCase &c, std::ostream *os) { *os << c.name; }

class Checkpoint : public ::testing::TestWithParam<ArchCase> {};

TEST_P(Checkpoint, RouteAndDecodeMatchTheReference) {
    const ArchCase &c = GetParam();
    const ft::synth::Spec &s = c.spec;
    ScratchDir dir;
    ft::synth::write_checkpoint(dir.path(), s);

    auto engine = make_engine();
    ft_model *raw = nullptr;
    char err[512];
    ASSERT_EQ(ft_model_load(engine.get(), dir.path().c_str(), nullptr, &raw, err, sizeof err), FT_OK) << err;
    ModelPtr model(raw);
    ft_model_info info;
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_model_get_info(raw, &info), FT_OK);
    const std::vector<int> moe = ft::synth::moe_layers(s);
    ASSERT_EQ(info.num_layers, static_cast<int>(moe.size()));
    EXPECT_EQ(info.num_experts, s.num_experts);
    EXPECT_EQ(info.top_k, s.top_k);
    EXPECT_EQ(info.hidden_size, s.hidden);
    EXPECT_EQ(info.intermediate_size, s.intermediate);
    EXPECT_EQ(info.routing, c.routing);
    EXPECT_EQ(info.first_moe_layer, moe.front());
    EXPECT_EQ(ft_model_moe_layer(raw, moe.back()), info.num_layers - 1);
    if (s.first_dense > 0) {
        EXPECT_EQ(ft_model_moe_layer(raw, 0), -1);
    }

    const bool shared = s.shared_intermediate > 0;
    EXPECT_EQ(info.shared_intermediate_size, s.shared_intermediate);
    const int E = s.num_experts, K = s.top_k, H = s.hidden;
    auto session = make_session(raw, 16, shared);
    ASSERT_TRUE(session);

    std::mt19937 rng(s.seed * 7 + 1);
    std::normal_distribution<float> n(0.f, 1.5f);
    const int act = s.hidden_act == "gelu" ? FT_ACT_GELU : FT_ACT_SILU;
    for (int l = 0; l < info.num_layers; ++l) {
        // Router tensors are exposed as written.
        ft_tensor_view v;
        v.struct_size = sizeof v;
        ASSERT_EQ(ft_model_tensor(raw, l, FT_TENSOR_ROUTER_WEIGHT, &v), FT_OK);
        EXPECT_EQ(v.ndim, 2);
        EXPECT_EQ(v.shape[0], E);
        EXPECT_EQ(v.shape[1], H);
        std::vector<double> bias;
        if (c.routing == FT_ROUTING_SIGMOID_GROUP_TOPK) {
            ASSERT_EQ(ft_model_tensor(raw, l, FT_TENSOR_ROUTER_BIAS, &v), FT_OK);
            ASSERT_EQ(v.dtype, FT_DTYPE_F32);
            const auto expect = ft::synth::router_bias(s, l);
            const float *got = static_cast<const float *>(v.data);
            for (int e = 0; e < E; ++e) {
                EXPECT_EQ(got[e], expect[e]);
                bias.push_back(expect[e]);
            }
        }

        // Expert weights as the writer produced them: the reference's source of truth.
        std::vector<std::vector<uint16_t>> g(E), u(E), d(E);
        for (int e = 0; e < E; ++e) {
            g[e] = ft::synth::expert_weight(s, l, e, FT_PROJ_GATE);
            u[e] = ft::synth::expert_weight(s, l, e, FT_PROJ_UP);
            d[e] = ft::synth::expert_weight(s, l, e, FT_PROJ_DOWN);
        }
        std::vector<uint16_t> sg, su, sd, sgate;
        ExpertRef shared_ref{};
        if (shared) {
            sg = ft::synth::shared_weight(s, l, FT_PROJ_GATE);
            su = ft::synth::shared_weight(s, l, FT_PROJ_UP);
            sd = ft::synth::shared_weight(s, l, FT_PROJ_DOWN);
            shared_ref = ExpertRef{sg.data(), su.data(), sd.data(), s.shared_intermediate};
            if (s.architecture == "qwen3_5_moe") sgate = ft::synth::shared_gate_weight(s, l);
        }
        for (int T : {1, 5, 16}) {
            std::vector<float> logits(static_cast<size_t>(T) * E);
            for (float &x : logits) x = n(rng);
            std::vector<int32_t> ids(static_cast<size_t>(T) * K);
            std::vector<float> w(static_cast<size_t>(T) * K);
            ASSERT_EQ(ft_route(session.get(), l, T, logits.data(), ids.data(), w.data()), FT_OK) << ft_session_last_error(session.get());
            for (int t = 0; t < T; ++t) {
                const std::vector<double> lt(logits.begin() + t * E, logits.begin() + (t + 1) * E);
                const auto ref = ft::test::ref_route(c.routing, K, lt, bias, s.n_group, s.topk_group, s.routed_scaling_factor,
                                                     s.norm_topk_prob);
                for (int k = 0; k < K; ++k) {
                    ASSERT_EQ(ids[t * K + k], ref.ids[k]) << c.name << " layer " << l << " token " << t;
                    ASSERT_NEAR(w[t * K + k], ref.weights[k], 1e-5);
                }
            }

            const auto x = random_bf16(rng, static_cast<size_t>(T) * H, 1.0f);
            std::vector<uint16_t> out(static_cast<size_t>(T) * H, 0x7fc0);
            ASSERT_EQ(ft_decode(session.get(), l, T, x.data(), ids.data(), w.data(), out.data()), FT_OK)
                << ft_session_last_error(session.get());
            const auto ref = ft::test::moe_reference(
                [&](int32_t e) { return ExpertRef{g[e].data(), u[e].data(), d[e].data(), s.intermediate}; }, E, ActivationRef{act},
                H, T, K, x.data(), ids.data(), w.data(), shared ? &shared_ref : nullptr, sgate.empty() ? nullptr : sgate.data());
            EXPECT_LT(ft::test::relative_error_bf16(out, ref), 1e-2) << c.name << " layer " << l << " T " << T;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Architectures, Checkpoint, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<ArchCase> &i) { return std::string(i.param.name); });

}  // namespace
