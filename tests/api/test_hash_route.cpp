// DeepSeek-V4's hash-routed layers and FP8 shared expert through the public C API: a synthetic
// checkpoint (ft::synth) whose first MoE layer routes by token id (tid2eid) and whose shared expert
// is e4m3 with 128 x 128 block scales. ft_route_tokens is checked against a scalar reference
// written here for the three score functions, ft_route's refusal and the argument errors, and
// ft_route_tokens + ft_decode with the shared expert on the cpu backend against a reference built
// from the dequantised weights.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <fstream>
#include <sstream>

#include "api_handles.hpp"
#include "synth_reference.hpp"
#include "ft/dequant.hpp"
#include "ft/synth.hpp"

namespace {

using namespace ft::test;

ft::synth::Spec hashed_spec() {
    ft::synth::Spec s = dsv4_hashed_spec(50, 4242);
    s.routed_scaling_factor = 1.5f;
    return s;
}

// Rewrites config.json's score function (the synth writes "sigmoid").
void set_score_func(const std::string &dir, const std::string &func) {
    const std::string path = dir + "/config.json";
    std::stringstream ss;
    ss << std::ifstream(path).rdbuf();
    std::string text = ss.str();
    const std::string from = "\"sigmoid\"";
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos);
    text.replace(at, from.size(), "\"" + func + "\"");
    std::ofstream(path) << text;
}

ModelPtr load(ft_engine *engine, const std::string &path) {
    ft_model *raw = nullptr;
    char err[512];
    EXPECT_EQ(ft_model_load(engine, path.c_str(), nullptr, &raw, err, sizeof err), FT_OK) << err;
    return ModelPtr(raw);
}

// The hash rule written from its definition: the table row's experts, weighted by the unbiased
// score, normalised to sum 1 unless softmax, times the scaling factor.
void reference(const std::string &func, const std::vector<int32_t> &table, int K, int E, double scale,
               const float *logits, int32_t token, std::vector<int32_t> &ids, std::vector<double> &w) {
    std::vector<double> score(E);
    double mx = -INFINITY, z = 0;
    for (int e = 0; e < E; ++e) mx = std::max(mx, double(logits[e]));
    for (int e = 0; e < E; ++e) z += std::exp(double(logits[e]) - mx);
    for (int e = 0; e < E; ++e) {
        const double x = logits[e];
        if (func == "softmax") score[e] = std::exp(x - mx) / z;
        else if (func == "sigmoid") score[e] = 1.0 / (1.0 + std::exp(-x));
        else score[e] = std::sqrt(std::log(1.0 + std::exp(x)));
    }
    ids.assign(table.begin() + size_t(token) * K, table.begin() + size_t(token + 1) * K);
    w.resize(K);
    double sum = 0;
    for (int k = 0; k < K; ++k) sum += score[ids[k]];
    for (int k = 0; k < K; ++k) w[k] = score[ids[k]] * scale / (func == "softmax" ? 1.0 : sum);
}

class HashRoute : public ::testing::TestWithParam<const char *> {};

TEST_P(HashRoute, MatchesTheScalarReferenceAndRefusesWhatItMust) {
    const std::string func = GetParam();
    const ft::synth::Spec s = hashed_spec();
    ScratchDir dir;
    const std::string path = write_synth_model(dir.path(), s);
    set_score_func(path, func);
    auto engine = make_engine();
    ModelPtr model = load(engine.get(), path);
    ASSERT_TRUE(model);
    ft_model_info info;
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_model_get_info(model.get(), &info), FT_OK);
    EXPECT_EQ(info.hash_layers, 1);
    EXPECT_EQ(info.vocab_size, s.vocab_size);
    EXPECT_EQ(info.shared_intermediate_size, s.shared_intermediate);
    auto session = make_session(model.get(), 16, false);
    ASSERT_TRUE(session);

    const int E = s.num_experts, K = s.top_k, T = 9;
    const std::vector<int32_t> table = ft::synth::tid2eid(s, 0);
    std::mt19937 rng(7);
    std::normal_distribution<float> n(0.f, 2.0f);
    std::vector<float> logits(size_t(T) * E);
    for (float &x : logits) x = n(rng);
    logits[3] = 40.0f;  // softplus's large-argument branch
    std::vector<int32_t> tokens(T);
    for (int t = 0; t < T; ++t) tokens[t] = (t * 17 + 3) % s.vocab_size;
    tokens[T - 1] = s.vocab_size - 1;
    std::vector<int32_t> ids(size_t(T) * K, -7);
    std::vector<float> w(size_t(T) * K, -1.f);
    ASSERT_EQ(ft_route_tokens(session.get(), 0, T, logits.data(), tokens.data(), ids.data(), w.data()), FT_OK)
        << ft_session_last_error(session.get());
    for (int t = 0; t < T; ++t) {
        std::vector<int32_t> rid;
        std::vector<double> rw;
        reference(func, table, K, E, s.routed_scaling_factor, &logits[size_t(t) * E], tokens[t], rid, rw);
        double sum = 0;
        for (int k = 0; k < K; ++k) {
            EXPECT_EQ(ids[size_t(t) * K + k], rid[k]) << "token " << t << " route " << k;
            EXPECT_NEAR(w[size_t(t) * K + k], rw[k], 1e-6 * std::max(1.0, std::fabs(rw[k]))) << "token " << t;
            sum += w[size_t(t) * K + k];
        }
        if (func != "softmax") {
            EXPECT_NEAR(sum, s.routed_scaling_factor, 1e-5);
        }
    }

    // Layer 1 routes by its logits: token ids are ignored there, and the result is ft_route's.
    std::vector<int32_t> ids1(size_t(T) * K), ids2(size_t(T) * K);
    std::vector<float> w1(size_t(T) * K), w2(size_t(T) * K);
    ASSERT_EQ(ft_route_tokens(session.get(), 1, T, logits.data(), nullptr, ids1.data(), w1.data()), FT_OK)
        << ft_session_last_error(session.get());
    ASSERT_EQ(ft_route(session.get(), 1, T, logits.data(), ids2.data(), w2.data()), FT_OK);
    EXPECT_EQ(ids1, ids2);
    EXPECT_EQ(w1, w2);

    // ft_route on the hash layer names the call to use.
    EXPECT_EQ(ft_route(session.get(), 0, T, logits.data(), ids.data(), w.data()), FT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(ft_session_last_error(session.get())).find("ft_route_tokens"), std::string::npos)
        << ft_session_last_error(session.get());
    // No token ids for the hash layer.
    EXPECT_EQ(ft_route_tokens(session.get(), 0, T, logits.data(), nullptr, ids.data(), w.data()),
              FT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(ft_session_last_error(session.get())).find("layer 0"), std::string::npos)
        << ft_session_last_error(session.get());
    // Token ids outside the vocabulary, named by their token.
    for (int32_t bad : {-1, s.vocab_size, INT32_MAX}) {
        std::vector<int32_t> tk = tokens;
        tk[4] = bad;
        EXPECT_EQ(ft_route_tokens(session.get(), 0, T, logits.data(), tk.data(), ids.data(), w.data()),
                  FT_ERR_INVALID_ARGUMENT);
        const std::string msg = ft_session_last_error(session.get());
        EXPECT_NE(msg.find("token 4"), std::string::npos) << msg;
        EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
    }
    // NaN logits, a bad layer.
    std::vector<float> nan_logits = logits;
    nan_logits[E + 2] = NAN;
    EXPECT_EQ(ft_route_tokens(session.get(), 0, T, nan_logits.data(), tokens.data(), ids.data(), w.data()),
              FT_ERR_NON_FINITE);
    EXPECT_EQ(ft_route_tokens(session.get(), 2, T, logits.data(), tokens.data(), ids.data(), w.data()),
              FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_route_tokens(nullptr, 0, T, logits.data(), tokens.data(), ids.data(), w.data()),
              FT_ERR_INVALID_ARGUMENT);
}

INSTANTIATE_TEST_SUITE_P(ScoreFunctions, HashRoute, ::testing::Values("softmax", "sigmoid", "sqrtsoftplus"),
                         [](const ::testing::TestParamInfo<const char *> &i) { return std::string(i.param); });

// sqrt(softplus), sigmoid and softmax weights differ: the cases above cannot pass by accident.
TEST(HashRoute, ScoreFunctionsGiveDifferentWeights) {
    const std::vector<int32_t> table = {0, 1, 2};
    const float logits[4] = {0.5f, -1.0f, 2.0f, 0.0f};
    std::vector<int32_t> ids;
    std::vector<double> a, b, c;
    reference("softmax", table, 3, 4, 1.0, logits, 0, ids, a);
    reference("sigmoid", table, 3, 4, 1.0, logits, 0, ids, b);
    reference("sqrtsoftplus", table, 3, 4, 1.0, logits, 0, ids, c);
    EXPECT_GT(std::fabs(a[0] - b[0]), 1e-3);
    EXPECT_GT(std::fabs(b[0] - c[0]), 1e-3);
}

// The shared expert of the reference: gate/up of the bf16 x, rounded to bf16 and clamped as
// DeepSeek-V4 clamps (gate <= limit, |up| <= limit; limit 0 = none), silu(g) * u rounded to bf16,
// then down, added to out.
void add_shared_reference(const ft::synth::Spec &s, int layer, double limit, const uint16_t *x, int T,
                          std::vector<double> &out) {
    const int H = s.hidden, Is = s.shared_intermediate;
    const std::vector<uint16_t> g = ft::synth::shared_weight(s, layer, FT_PROJ_GATE);
    const std::vector<uint16_t> u = ft::synth::shared_weight(s, layer, FT_PROJ_UP);
    const std::vector<uint16_t> d = ft::synth::shared_weight(s, layer, FT_PROJ_DOWN);
    std::vector<double> mid(Is);
    for (int t = 0; t < T; ++t) {
        const uint16_t *xt = x + size_t(t) * H;
        for (int i = 0; i < Is; ++i) {
            double gv = 0, uv = 0;
            for (int h = 0; h < H; ++h) {
                gv += bf16_to_f64(g[size_t(i) * H + h]) * bf16_to_f64(xt[h]);
                uv += bf16_to_f64(u[size_t(i) * H + h]) * bf16_to_f64(xt[h]);
            }
            gv = round_to_bf16(gv), uv = round_to_bf16(uv);
            if (limit > 0) gv = std::min(gv, limit), uv = std::clamp(uv, -limit, limit);
            mid[i] = round_to_bf16(gv / (1.0 + std::exp(-gv)) * uv);
        }
        for (int h = 0; h < H; ++h) {
            double acc = 0;
            for (int i = 0; i < Is; ++i) acc += bf16_to_f64(d[size_t(h) * Is + i]) * mid[i];
            out[size_t(t) * H + h] += acc;
        }
    }
}

double relative_l2(const std::vector<uint16_t> &a, const std::vector<double> &ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double d = bf16_to_f64(a[i]) - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

TEST(HashRoute, RouteTokensAndDecodeWithTheFp8SharedExpert) {
    const ft::synth::Spec s = hashed_spec();
    ScratchDir dir;
    const std::string path = write_synth_model(dir.path(), s);
    auto engine = make_engine();
    ModelPtr model = load(engine.get(), path);
    ASSERT_TRUE(model);
    ft_model_info info;
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_model_get_info(model.get(), &info), FT_OK);
    ASSERT_EQ(info.swiglu_limit, 7.0f);
    auto session = make_session(model.get(), 16, true);
    ASSERT_TRUE(session);

    ActivationRef act{info.activation, info.swiglu_alpha, info.swiglu_limit};
    FormatNumerics fmt;
    fmt.ds_fp4 = true;
    fmt.ds_limit = info.swiglu_limit;
    fmt.fp8_round_trip = [](const float *x, int64_t K, float *y) { ft::fp8_round_trip_per128(x, K, y); };
    const int E = s.num_experts, K = s.top_k, H = s.hidden, I = s.intermediate;
    std::mt19937 rng(11);
    std::normal_distribution<float> n(0.f, 1.5f);
    bool clamp_mattered = false;
    for (int l = 0; l < info.num_layers; ++l) {
        const SynthLayerRef layer_ref(s, l, E);
        for (int T : {1, 7, 16}) {
            std::vector<float> logits(size_t(T) * E);
            for (float &x : logits) x = n(rng);
            std::vector<int32_t> tokens(T);
            for (int t = 0; t < T; ++t) tokens[t] = int32_t(rng() % uint32_t(s.vocab_size));
            std::vector<int32_t> ids(size_t(T) * K);
            std::vector<float> w(size_t(T) * K);
            ASSERT_EQ(ft_route_tokens(session.get(), l, T, logits.data(), tokens.data(), ids.data(), w.data()), FT_OK)
                << ft_session_last_error(session.get());
            if (l == 0) {
                const std::vector<int32_t> table = ft::synth::tid2eid(s, 0);
                for (int t = 0; t < T; ++t)
                    for (int k = 0; k < K; ++k) ASSERT_EQ(ids[size_t(t) * K + k], table[size_t(tokens[t]) * K + k]);
            }
            const auto x = random_bf16(rng, size_t(T) * H, 1.0f);
            std::vector<uint16_t> out(size_t(T) * H, 0x7fc0);
            ASSERT_EQ(ft_decode(session.get(), l, T, x.data(), ids.data(), w.data(), out.data()), FT_OK)
                << ft_session_last_error(session.get());
            const auto routed = moe_reference_f32([&](int32_t e) { return layer_ref.expert(e); }, E, act, fmt, H, I, T,
                                                  K, x.data(), ids.data(), w.data());
            std::vector<double> ref = routed, unclamped = routed;
            add_shared_reference(s, l, info.swiglu_limit, x.data(), T, ref);
            add_shared_reference(s, l, 0.0, x.data(), T, unclamped);
            const double err = relative_l2(out, ref);
            EXPECT_LE(err, 1e-2) << "layer " << l << " T " << T;
            // Without the shared expert, or without its clamp, the output is measurably different.
            EXPECT_GT(relative_l2(out, routed), 5e-2) << "layer " << l << " T " << T;
            clamp_mattered |= relative_l2(out, unclamped) > 3 * std::max(err, 1e-3);
        }
    }
    EXPECT_TRUE(clamp_mattered) << "the synthetic shared expert never reached swiglu_limit";
}

}  // namespace
