// ft_decode on the cpu backend for the per-model expert rules the newer architectures add,
// against the fp64 references of tests/support: bf16 gpt-oss experts with biases (clamped
// SwiGLU), and route weights that scale the expert's input (Llama-4).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "freetoken.h"
#include "ft/synth.hpp"
#include "moe_reference.hpp"

namespace {

using ft::test::bf16_to_f64;
using ft::test::f32_to_bf16_rne;

struct EngineDeleter { void operator()(ft_engine *e) const { ft_engine_free(e); } };
struct ModelDeleter { void operator()(ft_model *m) const { ft_model_free(m); } };
struct SessionDeleter { void operator()(ft_session *s) const { ft_session_free(s); } };

std::unique_ptr<ft_engine, EngineDeleter> cpu_engine() {
    ft_engine_params p;
    ft_engine_params_init(&p);
    p.device = FT_DEVICE_NONE;
    p.cpu_threads = 2;
    p.pin_threads = false;
    ft_engine *e = nullptr;
    char err[256] = "";
    EXPECT_EQ(ft_engine_create(&p, &e, err, sizeof err), FT_OK) << err;
    return std::unique_ptr<ft_engine, EngineDeleter>(e);
}

std::unique_ptr<ft_session, SessionDeleter> cpu_session(ft_model *m, int32_t max_tokens) {
    ft_session_params p;
    ft_session_params_init(&p);
    p.backend = FT_BACKEND_CPU;
    p.max_tokens = max_tokens;
    ft_session *s = nullptr;
    char err[256] = "";
    EXPECT_EQ(ft_session_create(m, &p, &s, err, sizeof err), FT_OK) << err;
    return std::unique_ptr<ft_session, SessionDeleter>(s);
}

std::vector<float> bf16_values(std::mt19937 &rng, size_t n, float scale) {
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(n);
    for (float &x : v) x = float(bf16_to_f64(f32_to_bf16_rne(nd(rng))));
    return v;
}

ft::synth::RawTensor f32(const std::string &name, std::vector<int64_t> shape, const std::vector<float> &v) {
    ft::synth::RawTensor t{name, "F32", std::move(shape), std::vector<uint8_t>(v.size() * 4)};
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    return t;
}

struct TempDir {
    std::string path;
    TempDir() {
        std::string tmpl = "/tmp/ft_arch_decode_XXXXXX";
        if (const char *b = std::getenv("TMPDIR"); b && *b) tmpl = std::string(b) + "/ft_arch_decode_XXXXXX";
        if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        path = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
};

TEST(ArchDecode, GptOssBf16BiasesAndClampedSwiglu) {
    constexpr int64_t E = 4, H = 64, I = 32, K = 2, T = 3;
    constexpr float limit = 1.5f;  // small, so the clamp binds for many units
    TempDir dir;
    std::ofstream(dir.path + "/config.json")
        << nlohmann::json{{"model_type", "gpt_oss"}, {"hidden_size", H}, {"num_hidden_layers", 1},
                          {"num_local_experts", E}, {"num_experts_per_tok", K}, {"intermediate_size", I},
                          {"swiglu_limit", limit}}.dump();
    std::mt19937 rng(5);
    const auto gu = bf16_values(rng, E * H * 2 * I, 0.2f), gub = bf16_values(rng, E * 2 * I, 0.5f),
               dn = bf16_values(rng, E * I * H, 0.2f), dnb = bf16_values(rng, E * H, 0.5f);
    const std::string p = "model.layers.0.mlp.";
    ft::synth::write_safetensors(dir.path + "/model.safetensors",
                                 {f32(p + "experts.gate_up_proj", {E, H, 2 * I}, gu),
                                  f32(p + "experts.gate_up_proj_bias", {E, 2 * I}, gub),
                                  f32(p + "experts.down_proj", {E, I, H}, dn),
                                  f32(p + "experts.down_proj_bias", {E, H}, dnb),
                                  f32(p + "router.weight", {E, H}, bf16_values(rng, E * H, 0.2f)),
                                  f32(p + "router.bias", {E}, bf16_values(rng, E, 0.1f))});
    auto engine = cpu_engine();
    ft_model *mp = nullptr;
    char err[512] = "";
    ASSERT_EQ(ft_model_load(engine.get(), dir.path.c_str(), nullptr, &mp, err, sizeof err), FT_OK) << err;
    std::unique_ptr<ft_model, ModelDeleter> model(mp);
    ft_model_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_model_get_info(model.get(), &info), FT_OK);
    EXPECT_EQ(info.expert_biases, 1);
    EXPECT_EQ(info.route_weight, FT_ROUTE_WEIGHT_OUTPUT);
    ft_tensor_view v{};
    v.struct_size = sizeof v;
    ASSERT_EQ(ft_model_tensor(model.get(), 0, FT_TENSOR_EXPERT_GATE_UP_BIAS, &v), FT_OK);
    EXPECT_EQ(v.dtype, FT_DTYPE_F32);
    EXPECT_EQ(v.shape[0], E);
    EXPECT_EQ(v.shape[1], 2 * I);

    // Reference weights in the gate/up/down layout, gate/up de-interleaved from the checkpoint.
    std::vector<float> gate(E * I * H), up(E * I * H), down(E * H * I), bg(E * I), bu(E * I);
    for (int64_t e = 0; e < E; ++e)
        for (int64_t i = 0; i < I; ++i) {
            for (int64_t h = 0; h < H; ++h) {
                gate[(e * I + i) * H + h] = gu[(e * H + h) * 2 * I + 2 * i];
                up[(e * I + i) * H + h] = gu[(e * H + h) * 2 * I + 2 * i + 1];
                down[(e * H + h) * I + i] = dn[(e * I + i) * H + h];
            }
            bg[e * I + i] = gub[e * 2 * I + 2 * i];
            bu[e * I + i] = gub[e * 2 * I + 2 * i + 1];
        }
    std::vector<uint16_t> x(T * H), y(T * H);
    for (uint16_t &b : x) b = f32_to_bf16_rne(std::normal_distribution<float>(0.f, 1.f)(rng));
    const std::vector<int32_t> ids = {0, 3, 2, 1, 3, 2};
    const std::vector<float> w = {0.7f, 0.3f, 0.55f, 0.45f, 0.9f, 0.1f};
    auto session = cpu_session(model.get(), T);
    ASSERT_EQ(ft_decode(session.get(), 0, T, x.data(), ids.data(), w.data(), y.data()), FT_OK)
        << ft_session_last_error(session.get());
    ft::test::ActivationRef act{FT_ACT_SWIGLU_CLAMP, 1.702, limit};
    const auto ref = ft::test::moe_reference_f32(
        [&](int32_t e) {
            return ft::test::ExpertF32{gate.data() + e * I * H, up.data() + e * I * H, down.data() + e * H * I,
                                          bg.data() + e * I, bu.data() + e * I, dnb.data() + e * H};
        },
        E, act, {}, H, I, T, K, x.data(), ids.data(), w.data());
    EXPECT_LT(ft::test::relative_error_bf16(y, ref), 1e-2);
    // Without its biases the result is measurably different (the biases are not a no-op here).
    const auto ref_nobias = ft::test::moe_reference_f32(
        [&](int32_t e) {
            return ft::test::ExpertF32{gate.data() + e * I * H, up.data() + e * I * H, down.data() + e * H * I};
        },
        E, act, {}, H, I, T, K, x.data(), ids.data(), w.data());
    EXPECT_GT(ft::test::relative_error_bf16(y, ref_nobias), 5e-2);
}

TEST(ArchDecode, RouteWeightOnTheExpertInput) {
    constexpr int32_t E = 4, H = 64, I = 32, K = 2, T = 3;
    auto engine = cpu_engine();
    ft_model_desc d;
    ft_model_desc_init(&d);
    EXPECT_EQ(d.route_weight, FT_ROUTE_WEIGHT_OUTPUT);
    d.num_layers = 1;
    d.num_experts = E;
    d.top_k = K;
    d.hidden_size = H;
    d.intermediate_size = I;
    d.routing = FT_ROUTING_TOPK_SIGMOID;
    d.route_weight = FT_ROUTE_WEIGHT_INPUT;
    ft_model *mp = nullptr;
    char err[512] = "";
    ASSERT_EQ(ft_model_create(engine.get(), &d, &mp, err, sizeof err), FT_OK) << err;
    std::unique_ptr<ft_model, ModelDeleter> model(mp);
    std::mt19937 rng(9);
    std::vector<std::vector<uint16_t>> weights(size_t(E) * 3);
    for (int32_t e = 0; e < E; ++e)
        for (int32_t proj = 0; proj < 3; ++proj) {
            std::vector<uint16_t> &wt = weights[size_t(e) * 3 + proj];
            for (float f : bf16_values(rng, size_t(I) * H, 0.3f)) wt.push_back(f32_to_bf16_rne(f));
            ASSERT_EQ(ft_model_set_expert(model.get(), 0, e, proj + 1, wt.data(), wt.size() * 2), FT_OK);
        }
    ASSERT_EQ(ft_model_finalize(model.get()), FT_OK);
    ft_model_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_model_get_info(model.get(), &info), FT_OK);
    EXPECT_EQ(info.route_weight, FT_ROUTE_WEIGHT_INPUT);

    std::vector<uint16_t> x(size_t(T) * H), y(size_t(T) * H);
    for (uint16_t &b : x) b = f32_to_bf16_rne(std::normal_distribution<float>(0.f, 2.f)(rng));
    const std::vector<int32_t> ids = {1, 2, 0, 3, 2, 1};
    const std::vector<float> w = {0.9f, 0.2f, 0.4f, 0.75f, 0.3f, 0.6f};
    auto session = cpu_session(model.get(), T);
    ASSERT_EQ(ft_decode(session.get(), 0, T, x.data(), ids.data(), w.data(), y.data()), FT_OK)
        << ft_session_last_error(session.get());

    // out[t] = sum_k expert(bf16(w[t,k] * x[t])): the weight goes in, not out.
    std::vector<double> ref(size_t(T) * H, 0.0), out_weighted(size_t(T) * H, 0.0);
    for (int32_t t = 0; t < T; ++t)
        for (int32_t k = 0; k < K; ++k) {
            const int32_t e = ids[size_t(t) * K + k];
            const float wk = w[size_t(t) * K + k];
            std::vector<uint16_t> xs(H);
            for (int32_t h = 0; h < H; ++h) xs[h] = f32_to_bf16_rne(float(wk * bf16_to_f64(x[size_t(t) * H + h])));
            const ft::test::ExpertRef ex{weights[size_t(e) * 3].data(), weights[size_t(e) * 3 + 1].data(),
                                            weights[size_t(e) * 3 + 2].data(), I};
            ft::test::expert_ref(ex, {}, H, xs.data(), 1.0, ref.data() + size_t(t) * H);
            ft::test::expert_ref(ex, {}, H, x.data() + size_t(t) * H, wk, out_weighted.data() + size_t(t) * H);
        }
    EXPECT_LT(ft::test::relative_error_bf16(y, ref), 1e-2);
    EXPECT_GT(ft::test::relative_error_bf16(y, out_weighted), 5e-2);  // the output rule gives another result
}

TEST(ArchDecode, RouteWeightOnTheInputNeedsBf16AndAKnownRule) {
    auto engine = cpu_engine();
    ft_model_desc d;
    ft_model_desc_init(&d);
    d.num_layers = 1;
    d.num_experts = 4;
    d.top_k = 1;
    d.hidden_size = 64;
    d.intermediate_size = 32;
    d.route_weight = 2;
    ft_model *mp = nullptr;
    char err[512] = "";
    EXPECT_EQ(ft_model_create(engine.get(), &d, &mp, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(err).find("route_weight"), std::string::npos) << err;
    d.route_weight = FT_ROUTE_WEIGHT_OUTPUT;
    d.routing = FT_ROUTING_SPARSEMIXER;  // needs top_k 2
    EXPECT_EQ(ft_model_create(engine.get(), &d, &mp, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(err).find("SPARSEMIXER"), std::string::npos) << err;
}

}  // namespace

namespace {

// ft_route through a session applies each new rule with the model's fields (the correction bias of
// FT_ROUTING_SOFTMAX_BIASED_TOPK included), the same as the routing tests' hand-computed values.
TEST(ArchDecode, FtRouteUsesTheModelsRuleAndBias) {
    auto engine = cpu_engine();
    ft_model_desc d;
    ft_model_desc_init(&d);
    d.num_layers = 1;
    d.num_experts = 4;
    d.top_k = 2;
    d.hidden_size = 32;
    d.intermediate_size = 16;
    d.routing = FT_ROUTING_SOFTMAX_BIASED_TOPK;
    ft_model *mp = nullptr;
    char err[512] = "";
    ASSERT_EQ(ft_model_create(engine.get(), &d, &mp, err, sizeof err), FT_OK) << err;
    std::unique_ptr<ft_model, ModelDeleter> model(mp);
    const std::vector<uint16_t> zeros(size_t(16) * 32, 0);
    for (int32_t e = 0; e < 4; ++e)
        for (int32_t proj = 1; proj <= 3; ++proj)
            ASSERT_EQ(ft_model_set_expert(model.get(), 0, e, proj, zeros.data(), zeros.size() * 2), FT_OK);
    const float bias[4] = {0.5f, 0.f, 0.f, 0.f};
    ASSERT_EQ(ft_model_set_router_bias(model.get(), 0, bias, 4), FT_OK);
    ASSERT_EQ(ft_model_finalize(model.get()), FT_OK);
    auto session = cpu_session(model.get(), 1);
    // softmax = [0.1, 0.2, 0.3, 0.4]; the bias selects expert 0 over 3, the weights stay unbiased.
    const float logits[4] = {0.f, std::log(2.f), std::log(3.f), std::log(4.f)};
    int32_t ids[2];
    float w[2];
    ASSERT_EQ(ft_route(session.get(), 0, 1, logits, ids, w), FT_OK) << ft_session_last_error(session.get());
    EXPECT_EQ(ids[0], 0);
    EXPECT_EQ(ids[1], 3);
    EXPECT_NEAR(w[0], 0.2, 1e-6);
    EXPECT_NEAR(w[1], 0.8, 1e-6);
}

}  // namespace
