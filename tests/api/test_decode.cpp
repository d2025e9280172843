// ft_decode on models built from memory against the fp64 reference of the MoE layer.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <thread>

#include "api_handles.hpp"

namespace {

using namespace ft::test;
using ft::test::ActivationRef;
using ft::test::ExpertRef;

struct MemoryModel {
    int L, E, K, H, I;
    int act;
    std::vector<std::vector<uint16_t>> gate, up, down;  // [l*E + e]
    ModelPtr model;

    ExpertRef expert(int l, int e) const {
        const size_t i = static_cast<size_t>(l) * E + e;
        return ExpertRef{gate[i].data(), up[i].data(), down[i].data(), I};
    }
};

MemoryModel build(ft_engine *engine, int L, int E, int K, int H, int I, int act, uint32_t seed) {
    MemoryModel m{L, E, K, H, I, act, {}, {}, {}, nullptr};
    ft_model_desc d;
    ft_model_desc_init(&d);
    d.num_layers = L;
    d.num_experts = E;
    d.top_k = K;
    d.hidden_size = H;
    d.intermediate_size = I;
    d.activation = act;
    d.swiglu_limit = 1.5f;  // low enough that the clamp really engages
    ft_model *raw = nullptr;
    char err[256];
    EXPECT_EQ(ft_model_create(engine, &d, &raw, err, sizeof err), FT_OK) << err;
    m.model.reset(raw);
    std::mt19937 rng(seed);
    const float sg = 1.0f / std::sqrt(static_cast<float>(H)), sd = 1.0f / std::sqrt(static_cast<float>(I));
    for (int l = 0; l < L; ++l) {
        for (int e = 0; e < E; ++e) {
            m.gate.push_back(random_bf16(rng, static_cast<size_t>(I) * H, 2.0f * sg));
            m.up.push_back(random_bf16(rng, static_cast<size_t>(I) * H, 2.0f * sg));
            m.down.push_back(random_bf16(rng, static_cast<size_t>(H) * I, sd));
            EXPECT_EQ(ft_model_set_expert(raw, l, e, FT_PROJ_GATE, m.gate.back().data(), m.gate.back().size() * 2), FT_OK);
            EXPECT_EQ(ft_model_set_expert(raw, l, e, FT_PROJ_UP, m.up.back().data(), m.up.back().size() * 2), FT_OK);
            EXPECT_EQ(ft_model_set_expert(raw, l, e, FT_PROJ_DOWN, m.down.back().data(), m.down.back().size() * 2), FT_OK);
        }
    }
    EXPECT_EQ(ft_model_finalize(raw), FT_OK) << ft_model_last_error(raw);
    return m;
}

struct Batch {
    std::vector<uint16_t> x;
    std::vector<int32_t> ids;
    std::vector<float> w;
};

// Random routing with duplicates within a token and some routes handed elsewhere (id -1).
Batch random_batch(std::mt19937 &rng, int T, int K, int E, int H) {
    Batch b;
    b.x = random_bf16(rng, static_cast<size_t>(T) * H, 1.0f);
    std::uniform_int_distribution<int> id(0, E - 1), coin(0, 9);
    std::uniform_real_distribution<float> w(0.05f, 1.0f);
    for (int t = 0; t < T; ++t) {
        for (int k = 0; k < K; ++k) {
            int e = id(rng);
            const int c = coin(rng);
            if (c == 0) e = -1;                                   // computed elsewhere
            else if (c == 1 && k > 0) e = b.ids[b.ids.size() - 1];  // duplicate within the token
            b.ids.push_back(e);
            b.w.push_back(w(rng));
        }
    }
    return b;
}

std::vector<double> reference(const MemoryModel &m, int layer, const Batch &b, int T) {
    ActivationRef act{m.act, 1.702, 1.5};
    return ft::test::moe_reference([&](int32_t e) { return m.expert(layer, e); }, m.E, act, m.H, T, m.K, b.x.data(),
                                      b.ids.data(), b.w.data());
}

class DecodeVsReference : public ::testing::TestWithParam<int> {};

TEST_P(DecodeVsReference, EveryBatchSizeAndLayer) {
    const int act = GetParam();
    auto engine = make_engine();
    // H and I not multiples of 32 exercise the kernels' tails.
    MemoryModel m = build(engine.get(), 2, 12, 4, 200, 72, act, 1000u + act);
    auto session = make_session(m.model.get(), 16);
    std::mt19937 rng(77u + act);
    for (int T : {1, 2, 3, 5, 8, 16}) {
        for (int layer = 0; layer < m.L; ++layer) {
            const Batch b = random_batch(rng, T, m.K, m.E, m.H);
            std::vector<uint16_t> out(static_cast<size_t>(T) * m.H, 0x7fc0);  // NaN poison
            ASSERT_EQ(ft_decode(session.get(), layer, T, b.x.data(), b.ids.data(), b.w.data(), out.data()), FT_OK)
                << ft_session_last_error(session.get());
            const double err = ft::test::relative_error_bf16(out, reference(m, layer, b, T));
            EXPECT_LT(err, 1e-2) << "act " << act << " T " << T << " layer " << layer;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Activations, DecodeVsReference,
                         ::testing::Values(FT_ACT_SILU, FT_ACT_GELU, FT_ACT_GELU_TANH, FT_ACT_SWIGLU_CLAMP));

TEST(Decode, AllRoutesElsewhereGivesZeros) {
    auto engine = make_engine();
    MemoryModel m = build(engine.get(), 1, 4, 2, 64, 32, FT_ACT_SILU, 5);
    auto session = make_session(m.model.get(), 4);
    std::mt19937 rng(9);
    const auto x = random_bf16(rng, 2 * 64, 1.0f);
    const std::vector<int32_t> ids = {-1, -1, 2, -3};
    const std::vector<float> w = {0.5f, 0.5f, 1.0f, 0.0f};
    std::vector<uint16_t> out(2 * 64, 0x7fc0);
    ASSERT_EQ(ft_decode(session.get(), 0, 2, x.data(), ids.data(), w.data(), out.data()), FT_OK);
    for (int h = 0; h < 64; ++h) EXPECT_EQ(out[h] & 0x7fff, 0) << h;  // token 0: zeros
    bool nonzero = false;
    for (int h = 64; h < 128; ++h) nonzero |= (out[h] & 0x7fff) != 0;
    EXPECT_TRUE(nonzero);
    ft_session_stats st;
    st.struct_size = sizeof st;
    ASSERT_EQ(ft_session_get_stats(session.get(), &st), FT_OK);
    EXPECT_EQ(st.routes_cpu, 1u);
    EXPECT_EQ(st.routes_skipped, 3u);
}

// The session's statistics count each distinct expert of a call once, with its bytes (the
// executor's counters behind them: MoeExecutor.StatsCountEachDistinctExpertOnce).
TEST(Decode, StatsCountEachDistinctExpertOnce) {
    auto engine = make_engine();
    MemoryModel m = build(engine.get(), 1, 16, 4, 128, 64, FT_ACT_SILU, 11);
    auto session = make_session(m.model.get(), 16);
    ft_model_info info;
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_model_get_info(m.model.get(), &info), FT_OK);
    std::mt19937 rng(3);
    const Batch b = random_batch(rng, 16, 4, 16, 128);
    std::set<int> distinct;
    for (int id : b.ids)
        if (id >= 0) distinct.insert(id);
    std::vector<uint16_t> out(16 * 128);
    ASSERT_EQ(ft_decode(session.get(), 0, 16, b.x.data(), b.ids.data(), b.w.data(), out.data()), FT_OK);
    ft_session_stats st;
    st.struct_size = sizeof st;
    ASSERT_EQ(ft_session_get_stats(session.get(), &st), FT_OK);
    EXPECT_EQ(st.experts_cpu, distinct.size());
    EXPECT_EQ(st.cpu_bytes, distinct.size() * info.expert_bytes);
    EXPECT_EQ(st.decode_calls, 1u);
    EXPECT_EQ(st.tokens, 16u);
    ft_session_reset_stats(session.get());
    ASSERT_EQ(ft_session_get_stats(session.get(), &st), FT_OK);
    EXPECT_EQ(st.decode_calls, 0u);
}

TEST(Decode, RepeatedCallsAreBitIdentical) {
    auto engine = make_engine();
    MemoryModel m = build(engine.get(), 1, 8, 2, 96, 48, FT_ACT_GELU, 21);
    auto session = make_session(m.model.get(), 8);
    std::mt19937 rng(4);
    const Batch b = random_batch(rng, 8, 2, 8, 96);
    std::vector<uint16_t> a(8 * 96), c(8 * 96, 0x7fc0);
    ASSERT_EQ(ft_decode(session.get(), 0, 8, b.x.data(), b.ids.data(), b.w.data(), a.data()), FT_OK);
    ASSERT_EQ(ft_decode(session.get(), 0, 8, b.x.data(), b.ids.data(), b.w.data(), c.data()), FT_OK);
    EXPECT_EQ(a, c);
}

// Sessions of one engine used from two threads at once take turns on the pool and stay correct.
TEST(Decode, ConcurrentSessionsShareTheEngine) {
    auto engine = make_engine();
    MemoryModel m = build(engine.get(), 2, 8, 2, 128, 64, FT_ACT_SILU, 31);
    auto run = [&](uint32_t seed, double *worst) {
        auto session = make_session(m.model.get(), 4);
        std::mt19937 rng(seed);
        for (int i = 0; i < 20; ++i) {
            const int layer = i % 2;
            const Batch b = random_batch(rng, 4, 2, 8, 128);
            std::vector<uint16_t> out(4 * 128, 0x7fc0);
            if (ft_decode(session.get(), layer, 4, b.x.data(), b.ids.data(), b.w.data(), out.data()) != FT_OK) {
                *worst = INFINITY;
                return;
            }
            *worst = std::max(*worst, ft::test::relative_error_bf16(out, reference(m, layer, b, 4)));
        }
    };
    double w1 = 0, w2 = 0;
    std::thread t1(run, 1u, &w1), t2(run, 2u, &w2);
    t1.join();
    t2.join();
    EXPECT_LT(w1, 1e-2);
    EXPECT_LT(w2, 1e-2);
}

}  // namespace
