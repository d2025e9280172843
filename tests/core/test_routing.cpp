#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ft/common.hpp"
#include "ft/model.hpp"
#include "routing_reference.hpp"

namespace {

ft::RoutingSpec spec(int32_t rule, int32_t E, int32_t K) {
    ft::RoutingSpec r;
    r.rule = rule;
    r.num_experts = E;
    r.top_k = K;
    return r;
}

struct Routed {
    std::vector<int32_t> ids;
    std::vector<float> w;
};

Routed run(const ft::RoutingSpec &r, const std::vector<float> &logits, const std::vector<float> &bias = {}) {
    const int32_t T = static_cast<int32_t>(logits.size()) / r.num_experts;
    Routed o{std::vector<int32_t>(static_cast<size_t>(T) * r.top_k, -7), std::vector<float>(static_cast<size_t>(T) * r.top_k, NAN)};
    ft::route(r, bias.empty() ? nullptr : bias.data(), T, logits.data(), o.ids.data(), o.w.data());
    return o;
}

TEST(Routing, SoftmaxTopkRenormHandComputed) {
    const Routed o = run(spec(FT_ROUTING_SOFTMAX_TOPK_RENORM, 4, 2), {1.f, 2.f, 3.f, 0.f});
    EXPECT_EQ(o.ids, (std::vector<int32_t>{2, 1}));
    const double a = std::exp(3.0) / (std::exp(3.0) + std::exp(2.0));
    EXPECT_NEAR(o.w[0], a, 1e-6);
    EXPECT_NEAR(o.w[1], 1.0 - a, 1e-6);
}

TEST(Routing, SoftmaxTopkWithoutRenormKeepsFullSoftmaxProbabilities) {
    // softmax([0, ln2, ln3, ln4]) = [0.1, 0.2, 0.3, 0.4]
    const Routed o = run(spec(FT_ROUTING_SOFTMAX_TOPK, 4, 2), {0.f, std::log(2.f), std::log(3.f), std::log(4.f)});
    EXPECT_EQ(o.ids, (std::vector<int32_t>{3, 2}));
    EXPECT_NEAR(o.w[0], 0.4, 1e-6);
    EXPECT_NEAR(o.w[1], 0.3, 1e-6);
}

TEST(Routing, TiesGoToTheLowerExpertId) {
    const Routed a = run(spec(FT_ROUTING_SOFTMAX_TOPK_RENORM, 5, 3), {0.5f, 1.f, 0.5f, 1.f, 0.5f});
    EXPECT_EQ(a.ids, (std::vector<int32_t>{1, 3, 0}));
    const Routed b = run(spec(FT_ROUTING_SOFTMAX_TOPK, 4, 2), {0.f, 0.f, 0.f, 0.f});
    EXPECT_EQ(b.ids, (std::vector<int32_t>{0, 1}));
    EXPECT_NEAR(b.w[0], 0.25, 1e-7);
}

TEST(Routing, TopkSoftmaxIsSoftmaxOverTheSelected) {
    const Routed o = run(spec(FT_ROUTING_TOPK_SOFTMAX, 3, 2), {0.f, 1.f, -5.f});
    EXPECT_EQ(o.ids, (std::vector<int32_t>{1, 0}));
    EXPECT_NEAR(o.w[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

TEST(Routing, SigmoidGroupTopkHandComputed) {
    // 8 experts in 4 groups of 2. Biased scores [0.6, 0.5 | 1.05, 0.7 | 0.5, 0.5 | 0.75, 0.75]
    // give group scores 1.1, 1.75, 1.0, 1.5: groups 1 and 3 stay; experts 2, then 6 (tie with 7).
    ft::RoutingSpec r = spec(FT_ROUTING_SIGMOID_GROUP_TOPK, 8, 2);
    r.num_groups = 4;
    r.topk_groups = 2;
    r.routed_scaling_factor = 2.5f;
    std::vector<float> logits(8, 0.f);
    logits[2] = std::log(3.f);  // sigmoid = 0.75
    const std::vector<float> bias = {0.1f, 0.0f, 0.3f, 0.2f, 0.0f, 0.0f, 0.25f, 0.25f};
    Routed o = run(r, logits, bias);
    EXPECT_EQ(o.ids, (std::vector<int32_t>{2, 6}));
    EXPECT_NEAR(o.w[0], 0.75 / 1.25 * 2.5, 1e-5);
    EXPECT_NEAR(o.w[1], 0.50 / 1.25 * 2.5, 1e-5);
    r.renormalize = false;
    o = run(r, logits, bias);
    EXPECT_NEAR(o.w[0], 0.75 * 2.5, 1e-5);
    EXPECT_NEAR(o.w[1], 0.50 * 2.5, 1e-5);
}

TEST(Routing, GroupLimitExcludesTheBestExpertOfALosingGroup) {
    ft::RoutingSpec r = spec(FT_ROUTING_SIGMOID_GROUP_TOPK, 4, 1);
    r.num_groups = 2;
    r.topk_groups = 1;
    // biased: [0.9, 0.1 | 0.6, 0.6]: group 0 sums 1.0, group 1 sums 1.2.
    const Routed o = run(r, {0.f, 0.f, 0.f, 0.f}, {0.4f, -0.4f, 0.1f, 0.1f});
    EXPECT_EQ(o.ids, (std::vector<int32_t>{2}));
    EXPECT_NEAR(o.w[0], 1.0, 1e-6);  // renormalised single route
}

TEST(Routing, CorrectionBiasSelectsButDoesNotWeigh) {
    ft::RoutingSpec r = spec(FT_ROUTING_SIGMOID_GROUP_TOPK, 3, 1);
    r.renormalize = false;
    const Routed o = run(r, {1.f, 0.f, 0.f}, {0.f, 0.5f, 0.f});
    EXPECT_EQ(o.ids[0], 1);  // 0.5 + 0.5 beats sigmoid(1) = 0.73
    EXPECT_NEAR(o.w[0], 0.5, 1e-6);
}

TEST(Routing, SqrtSoftplusScoresHandComputed) {
    // scores sqrt(log(1 + e^x)): x = 0 -> sqrt(ln 2) = 0.8326, x = 2 -> 1.5042, x = -3 -> 0.2204,
    // x = 100 -> 10 (softplus is x there).
    ft::RoutingSpec r = spec(FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK, 4, 2);
    r.renormalize = false;
    const Routed o = run(r, {0.f, 2.f, -3.f, 100.f});
    EXPECT_EQ(o.ids, (std::vector<int32_t>{3, 1}));
    EXPECT_NEAR(o.w[0], 10.0, 1e-5);
    EXPECT_NEAR(o.w[1], std::sqrt(std::log1p(std::exp(2.0))), 1e-6);
}

TEST(Routing, NonFiniteLogitsAreRejected) {
    ft::RoutingSpec r = spec(FT_ROUTING_SOFTMAX_TOPK_RENORM, 4, 2);
    for (float bad : {NAN, INFINITY, -INFINITY}) {
        try {
            run(r, {0.f, bad, 1.f, 2.f});
            FAIL() << "no error for " << bad;
        } catch (const ft::Error &e) {
            EXPECT_EQ(e.status(), FT_ERR_NON_FINITE);
            EXPECT_NE(std::string(e.what()).find("expert 1"), std::string::npos) << e.what();
        }
    }
}

// Every rule against the independent fp64 reference on random logits.
TEST(Routing, MatchesReferenceOnRandomLogits) {
    std::mt19937 rng(1234);
    std::normal_distribution<float> n(0.f, 2.f);
    struct Case {
        int32_t rule, E, K, groups, topk_groups;
        float scale;
        bool renorm;
    };
    const Case cases[] = {{FT_ROUTING_SOFTMAX_TOPK, 128, 8, 1, 1, 1.f, true},
                          {FT_ROUTING_SOFTMAX_TOPK_RENORM, 64, 6, 1, 1, 1.f, true},
                          {FT_ROUTING_TOPK_SOFTMAX, 32, 4, 1, 1, 1.f, true},
                          {FT_ROUTING_SIGMOID_GROUP_TOPK, 256, 8, 8, 4, 2.5f, true},
                          {FT_ROUTING_SIGMOID_GROUP_TOPK, 160, 8, 1, 1, 1.f, false},
                          {FT_ROUTING_SIGMOID_GROUP_TOPK, 64, 6, 4, 2, 1.8f, true},
                          {FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK, 256, 6, 1, 1, 1.5f, true},
                          {FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK, 64, 4, 8, 3, 2.0f, false}};
    for (const Case &c : cases) {
        ft::RoutingSpec r = spec(c.rule, c.E, c.K);
        r.num_groups = c.groups;
        r.topk_groups = c.topk_groups;
        r.routed_scaling_factor = c.scale;
        r.renormalize = c.renorm;
        const int T = 37;
        std::vector<float> logits(static_cast<size_t>(T) * c.E), bias;
        for (float &v : logits) v = n(rng);
        if (c.rule == FT_ROUTING_SIGMOID_GROUP_TOPK || c.rule == FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK) {
            bias.resize(c.E);
            for (float &v : bias) v = 0.1f * n(rng);
        }
        const Routed o = run(r, logits, bias);
        for (int t = 0; t < T; ++t) {
            const std::vector<double> lt(logits.begin() + t * c.E, logits.begin() + (t + 1) * c.E);
            const std::vector<double> bt(bias.begin(), bias.end());
            const auto ref = ft::test::ref_route(c.rule, c.K, lt, bt, c.groups, c.topk_groups, c.scale, c.renorm);
            for (int k = 0; k < c.K; ++k) {
                ASSERT_EQ(o.ids[t * c.K + k], ref.ids[k]) << "rule " << c.rule << " token " << t << " route " << k;
                ASSERT_NEAR(o.w[t * c.K + k], ref.weights[k], 1e-6 * std::max(1.0, std::abs(ref.weights[k])));
            }
        }
    }
}

}  // namespace

namespace {

TEST(Routing, TopkSigmoidWeighsEachRouteBySigmoidOfItsLogit) {
    const Routed o = run(spec(FT_ROUTING_TOPK_SIGMOID, 4, 1), {0.5f, -1.f, 2.f, 1.f, /* token 2 */ -3.f, -2.f, -4.f, -5.f});
    EXPECT_EQ(o.ids, (std::vector<int32_t>{2, 1}));
    EXPECT_NEAR(o.w[0], 1.0 / (1.0 + std::exp(-2.0)), 1e-7);
    EXPECT_NEAR(o.w[1], 1.0 / (1.0 + std::exp(2.0)), 1e-7);  // no renormalisation: a lone route keeps sigmoid(-2)
}

TEST(Routing, SoftmaxGroupTopkGreedyScalesWithoutRenormalising) {
    // softmax([0, ln2, ln3, ln4]) = [0.1, 0.2, 0.3, 0.4]
    ft::RoutingSpec r = spec(FT_ROUTING_SOFTMAX_GROUP_TOPK, 4, 2);
    r.routed_scaling_factor = 2.0f;
    r.renormalize = false;
    const Routed o = run(r, {0.f, std::log(2.f), std::log(3.f), std::log(4.f)});
    EXPECT_EQ(o.ids, (std::vector<int32_t>{3, 2}));
    EXPECT_NEAR(o.w[0], 0.8, 1e-6);
    EXPECT_NEAR(o.w[1], 0.6, 1e-6);
}

TEST(Routing, SoftmaxGroupTopkRanksGroupsByTheirBestProbability) {
    // Groups {0,1}, {2,3}, {4,5}. Probabilities p ~ exp(logits): group 0 has the best single
    // expert (0) but group 1 has the best pair sum; DeepSeek-V2 scores groups by their maximum, so
    // with one group kept the routes are experts 0 and 1, not 2 and 3.
    ft::RoutingSpec r = spec(FT_ROUTING_SOFTMAX_GROUP_TOPK, 6, 2);
    r.num_groups = 3;
    r.topk_groups = 1;
    r.renormalize = false;
    const std::vector<float> logits = {3.0f, 0.0f, 2.8f, 2.8f, -1.f, -1.f};
    const Routed o = run(r, logits);
    EXPECT_EQ(o.ids, (std::vector<int32_t>{0, 1}));
    double z = 0;
    for (float v : logits) z += std::exp(double(v));
    EXPECT_NEAR(o.w[0], std::exp(3.0) / z, 1e-6);
    EXPECT_NEAR(o.w[1], 1.0 / z, 1e-6);
    r.renormalize = true;
    const Routed n = run(r, logits);
    EXPECT_NEAR(n.w[0] + n.w[1], 1.0, 1e-6);
}

TEST(Routing, SoftmaxBiasedTopkSelectsOnBiasedProbabilityAndWeighsUnbiased) {
    // p = [0.1, 0.2, 0.3, 0.4]; the bias lifts expert 0 above expert 3 for selection only.
    ft::RoutingSpec r = spec(FT_ROUTING_SOFTMAX_BIASED_TOPK, 4, 2);
    const Routed o = run(r, {0.f, std::log(2.f), std::log(3.f), std::log(4.f)}, {0.5f, 0.f, 0.f, 0.f});
    EXPECT_EQ(o.ids, (std::vector<int32_t>{0, 3}));
    EXPECT_NEAR(o.w[0], 0.1 / 0.5, 1e-6);
    EXPECT_NEAR(o.w[1], 0.4 / 0.5, 1e-6);
}

TEST(Routing, SparsemixerHandComputed) {
    // eps 0.1: a logit s stays in a route's softmax when (m - s) / max(|s|, m) <= 0.2.
    ft::RoutingSpec r = spec(FT_ROUTING_SPARSEMIXER, 4, 2);
    r.jitter_eps = 0.1f;
    const Routed o = run(r, {1.0f, 0.9f, 0.5f, 0.85f});
    // Route 1: m = 1.0 (expert 0); 0.9 and 0.85 are within 20 %, 0.5 is not.
    EXPECT_EQ(o.ids[0], 0);
    EXPECT_NEAR(o.w[0], 1.0 / (1.0 + std::exp(-0.1) + std::exp(-0.15)), 1e-6);
    // Route 2: expert 0 excluded, m = 0.9 (expert 1); 0.85 is within, 0.5 is not.
    EXPECT_EQ(o.ids[1], 1);
    EXPECT_NEAR(o.w[1], 1.0 / (1.0 + std::exp(-0.05)), 1e-6);
    // With a zero margin each route is its own softmax: weight 1.
    r.jitter_eps = 0.0f;
    const Routed z = run(r, {1.0f, 0.9f, 0.5f, 0.85f});
    EXPECT_EQ(z.ids, (std::vector<int32_t>{0, 1}));
    EXPECT_FLOAT_EQ(z.w[0], 1.0f);
    EXPECT_FLOAT_EQ(z.w[1], 1.0f);
}

TEST(Routing, SparsemixerNeedsTwoRoutes) {
    ft::RoutingSpec r = spec(FT_ROUTING_SPARSEMIXER, 4, 1);
    std::vector<int32_t> ids(1);
    std::vector<float> w(1);
    const std::vector<float> logits = {1.f, 2.f, 3.f, 4.f};
    try {
        ft::route(r, nullptr, 1, logits.data(), ids.data(), w.data());
        FAIL() << "top_k 1 accepted";
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_INVALID_ARGUMENT);
    }
}

}  // namespace
