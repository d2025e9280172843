// Placement maps and the dispatch layout: hand-built cases, and the layout against a naive
// reference (sets and sorts, written from the header's rules) on many random routings.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "ep_traces.hpp"
#include "ft/common.hpp"
#include "ft/ep.hpp"

namespace {

using namespace ft::ep;
using ft::test::Rng;

// ---- naive reference -----------------------------------------------------------------------

struct NaiveLayout {
    std::vector<int32_t> route_phy;
    std::vector<std::set<int32_t>> ranks_of_token;  // destinations per token
    // per destination rank: (token, [(logical, j, slot, weight)] sorted)
    std::vector<std::vector<std::pair<int32_t, std::vector<std::tuple<int32_t, int32_t, int32_t, float>>>>> rows;
    std::vector<int64_t> expert_count;
};

NaiveLayout naive_layout(const Placement &p, const std::vector<int32_t> &ids, const std::vector<float> &w,
                         int64_t T, int32_t K, const std::vector<int64_t> &load) {
    const int32_t R = p.num_ranks, S = p.slots_per_rank;
    // Replicas of each expert, found by scanning phy2log rather than through log2phy.
    std::map<int32_t, std::vector<int32_t>> replicas;
    for (int32_t phy = 0; phy < R * S; ++phy) replicas[p.phy2log[phy]].push_back(phy);
    NaiveLayout n;
    n.route_phy.assign(T * K, -1);
    n.ranks_of_token.resize(T);
    n.rows.resize(R);
    n.expert_count.assign(R * S, 0);
    for (int64_t t = 0; t < T; ++t) {
        std::set<int32_t> going;
        for (int32_t j = 0; j < K; ++j) {
            const int32_t e = ids[t * K + j];
            if (e >= 0 && replicas[e].size() == 1) going.insert(replicas[e][0] / S);
        }
        for (int32_t j = 0; j < K; ++j) {
            const int32_t e = ids[t * K + j];
            if (e < 0) continue;
            std::vector<std::pair<int64_t, int32_t>> candidates;  // (load, rank) of preferred replicas
            for (int32_t phy : replicas[e])
                if (going.count(phy / S)) candidates.push_back({load[phy / S], phy / S});
            if (candidates.empty())
                for (int32_t phy : replicas[e]) candidates.push_back({load[phy / S], phy / S});
            const int32_t r = std::min_element(candidates.begin(), candidates.end())->second;
            int32_t chosen = -1;
            for (int32_t phy : replicas[e])
                if (phy / S == r) chosen = phy;
            n.route_phy[t * K + j] = chosen;
            going.insert(r);
        }
        n.ranks_of_token[t] = going;
        for (int32_t r : going) {
            std::vector<std::tuple<int32_t, int32_t, int32_t, float>> routes;
            for (int32_t j = 0; j < K; ++j) {
                const int32_t phy = n.route_phy[t * K + j];
                if (phy >= 0 && phy / S == r) {
                    routes.emplace_back(ids[t * K + j], j, phy % S, w[t * K + j]);
                    ++n.expert_count[phy];
                }
            }
            std::sort(routes.begin(), routes.end(), [](const auto &a, const auto &b) {
                return std::make_pair(std::get<0>(a), std::get<1>(a)) < std::make_pair(std::get<0>(b), std::get<1>(b));
            });
            n.rows[r].push_back({static_cast<int32_t>(t), routes});
        }
    }
    return n;
}

void expect_layout_matches(const Placement &p, const std::vector<int32_t> &ids, const std::vector<float> &w, int64_t T,
                           int32_t K, int32_t src, const std::vector<int64_t> &load, const DispatchLayout &L,
                           const std::string &what) {
    SCOPED_TRACE(what);
    const int32_t R = p.num_ranks;
    const NaiveLayout n = naive_layout(p, ids, w, T, K, load);
    ASSERT_EQ(L.route_phy, n.route_phy);
    ASSERT_EQ(L.expert_count, n.expert_count);
    int64_t off = 0;
    for (int32_t r = 0; r < R; ++r) {
        ASSERT_EQ(L.offset[r], off);
        ASSERT_EQ(L.count[r], static_cast<int64_t>(n.rows[r].size()));
        for (size_t i = 0; i < n.rows[r].size(); ++i) {
            const auto &[t, routes] = n.rows[r][i];
            const int64_t at = off + static_cast<int64_t>(i);
            ASSERT_EQ(L.row[r * T + t], static_cast<int32_t>(i));
            ASSERT_EQ(L.send_token[at], t);
            ASSERT_EQ(L.send_n[at], static_cast<int32_t>(routes.size()));
            for (int32_t k = 0; k < K; ++k) {
                if (k < static_cast<int32_t>(routes.size())) {
                    ASSERT_EQ(L.send_slot[at * K + k], std::get<2>(routes[k]));
                    ASSERT_EQ(L.send_weight[at * K + k], std::get<3>(routes[k]));
                } else {
                    ASSERT_EQ(L.send_slot[at * K + k], -1);
                    ASSERT_EQ(L.send_weight[at * K + k], 0.0f);
                }
            }
        }
        for (int64_t t = 0; t < T; ++t)
            ASSERT_EQ(L.sends(r, t), n.ranks_of_token[t].count(r) == 1) << "rank " << r << " token " << t;
        off += L.count[r];
    }
    ASSERT_EQ(L.offset[R], off);
}

// A random valid placement with `replicas` extra copies: each copy on a distinct rank.
Placement random_placement(Rng &rng, int32_t E, int32_t R, int32_t replicas) {
    for (;;) {
        std::vector<int32_t> copies(E);
        for (int32_t e = 0; e < E; ++e) copies[e] = e;
        for (int32_t i = 0; i < replicas; ++i) copies.push_back(static_cast<int32_t>(rng.below(E)));
        ft::test::shuffle(copies, rng);
        try {
            return make_placement(E, R, copies);
        } catch (const ft::Error &) {
            // Two copies landed on one rank (or an expert got more than R): draw again.
        }
    }
}

// ---- placement maps -------------------------------------------------------------------------

TEST(EpPlacement, ContiguousMaps) {
    const Placement p = contiguous_placement(8, 4);
    EXPECT_EQ(p.slots_per_rank, 2);
    EXPECT_EQ(p.phy2log, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
    EXPECT_EQ(p.logcnt, std::vector<int32_t>(8, 1));
    EXPECT_EQ(p.log2phy[5 * 4 + 0], 5);
    EXPECT_EQ(p.log2phy[5 * 4 + 1], -1);
    EXPECT_EQ(p.rank_of(5), 2);
    EXPECT_EQ(p.slot_of(5), 1);
}

TEST(EpPlacement, ReplicasAreListedInPhysicalOrder) {
    // Ranks: {2, 0, 1} {0, 3, 1}: experts 0 and 1 have two copies.
    const Placement p = make_placement(4, 2, {2, 0, 1, 0, 3, 1});
    EXPECT_EQ(p.logcnt, (std::vector<int32_t>{2, 2, 1, 1}));
    EXPECT_EQ(p.log2phy[0 * 2 + 0], 1);
    EXPECT_EQ(p.log2phy[0 * 2 + 1], 3);
    EXPECT_EQ(p.log2phy[1 * 2 + 0], 2);
    EXPECT_EQ(p.log2phy[1 * 2 + 1], 5);
}

TEST(EpPlacement, RejectsInvalidMaps) {
    EXPECT_THROW(make_placement(4, 2, {0, 0, 1, 2}), ft::Error);       // expert 0 twice on rank 0; 3 unplaced
    EXPECT_THROW(make_placement(4, 2, {0, 1, 2, 2}), ft::Error);       // 3 unplaced, 2 twice on rank 1
    EXPECT_THROW(make_placement(3, 2, {0, 1, 2}), ft::Error);          // 3 slots over 2 ranks
    EXPECT_THROW(make_placement(3, 2, {0, 1, 2, 3}), ft::Error);       // id out of range
    EXPECT_THROW(contiguous_placement(6, 4), ft::Error);
    EXPECT_NO_THROW(make_placement(3, 2, {0, 1, 2, 0}));
}

// ---- dispatch layout: hand-built --------------------------------------------------------------

TEST(EpLayout, HandBuiltContiguous) {
    // Experts 0, 1 on rank 0 and 2, 3 on rank 1. Token 0 -> {0}, token 1 -> {0, 1}, token 2 -> {1}.
    const Placement p = contiguous_placement(4, 2);
    const std::vector<int32_t> ids = {1, 0, 2, 1, 3, -1};
    const std::vector<float> w = {0.25f, 0.75f, 0.5f, 0.5f, 1.0f, 9.0f};
    const DispatchLayout L = dispatch_layout(p, ids.data(), w.data(), 3, 2, 0);
    EXPECT_EQ(L.count, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(L.offset, (std::vector<int64_t>{0, 2, 4}));
    EXPECT_EQ(L.row, (std::vector<int32_t>{0, 1, -1, -1, 0, 1}));
    EXPECT_EQ(L.send_token, (std::vector<int32_t>{0, 1, 1, 2}));
    EXPECT_EQ(L.send_n, (std::vector<int32_t>{2, 1, 1, 1}));
    // Token 0's routes sorted by logical id: expert 0 (w 0.75) before expert 1 (w 0.25).
    EXPECT_EQ(L.send_slot, (std::vector<int32_t>{0, 1, 1, -1, 0, -1, 1, -1}));
    EXPECT_EQ(L.send_weight, (std::vector<float>{0.75f, 0.25f, 0.5f, 0, 0.5f, 0, 1.0f, 0}));
    EXPECT_EQ(L.expert_count, (std::vector<int64_t>{1, 2, 1, 1}));
    EXPECT_EQ(L.route_phy, (std::vector<int32_t>{1, 0, 2, 1, 3, -1}));
}

TEST(EpLayout, ReplicaChoicePrefersRanksTheTokenGoesTo) {
    // Rank 0: {0, 1}, rank 1: {0, 2}; expert 0 has a copy on both.
    const Placement p = make_placement(3, 2, {0, 1, 0, 2});
    const std::vector<int32_t> ids = {
        0, 2,   // goes to rank 1 for expert 2: expert 0 joins it there
        1, 0,   // goes to rank 0 for expert 1: expert 0 there, though listed second
        0, -1,  // no forced rank: least forced load wins
        2, -1,  // forced to rank 1
    };
    // Forced loads: rank 0 has token 1, rank 1 has tokens 0 and 3.
    EXPECT_EQ(forced_rank_load(p, ids.data(), 4, 2), (std::vector<int64_t>{1, 2}));
    const DispatchLayout L = dispatch_layout(p, ids.data(), nullptr, 4, 2, 1);
    EXPECT_EQ(L.route_phy, (std::vector<int32_t>{2, 3, 1, 0, 0, -1, 3, -1}));
    EXPECT_EQ(L.count, (std::vector<int64_t>{2, 2}));
    // With the caller's loads favouring rank 1, token 2 goes there instead; ties go to rank 0.
    const int64_t favour1[2] = {5, 3}, tie[2] = {4, 4};
    EXPECT_EQ(dispatch_layout(p, ids.data(), nullptr, 4, 2, 1, favour1).route_phy[4], 2);
    EXPECT_EQ(dispatch_layout(p, ids.data(), nullptr, 4, 2, 1, tie).route_phy[4], 0);
}

TEST(EpLayout, EdgeCases) {
    const Placement p = contiguous_placement(8, 4);
    // No tokens.
    const DispatchLayout empty = dispatch_layout(p, nullptr, nullptr, 0, 2, 3);
    EXPECT_EQ(empty.offset, std::vector<int64_t>(5, 0));
    // Every route masked: nothing is sent anywhere.
    const std::vector<int32_t> masked(6 * 2, -1);
    const DispatchLayout none = dispatch_layout(p, masked.data(), nullptr, 6, 2, 0);
    EXPECT_EQ(none.offset[4], 0);
    // One expert takes everything; a repeated route sends the token once, carrying both routes.
    const std::vector<int32_t> one = {5, 5, 5, -1, 5, 5};
    const DispatchLayout L = dispatch_layout(p, one.data(), nullptr, 3, 2, 0);
    EXPECT_EQ(L.count, (std::vector<int64_t>{0, 0, 3, 0}));
    EXPECT_EQ(L.send_n, (std::vector<int32_t>{2, 1, 2}));
    EXPECT_EQ(L.expert_count[5], 5);
    // Out-of-range ids and source ranks are rejected.
    const std::vector<int32_t> bad = {8, 0};
    EXPECT_THROW(dispatch_layout(p, bad.data(), nullptr, 1, 2, 0), ft::Error);
    EXPECT_THROW(dispatch_layout(p, one.data(), nullptr, 3, 2, 4), ft::Error);
}

// ---- dispatch layout vs the naive reference ------------------------------------------------

TEST(EpLayout, MatchesNaiveReferenceOnRandomRoutings) {
    Rng rng(0x5eed0001);
    int cases = 0;
    for (int32_t R = 2; R <= 8; ++R)
        for (int trial = 0; trial < 25; ++trial) {
            const int32_t S = 1 + static_cast<int32_t>(rng.below(6));
            const int32_t replicas = trial % 3 == 0 ? 0 : static_cast<int32_t>(rng.below(std::min(R * S / 2, 8) + 1));
            const int32_t E = R * S - replicas;
            if (E < 1) continue;
            const Placement p = random_placement(rng, E, R, replicas);
            const int32_t K = 1 + static_cast<int32_t>(rng.below(std::min(E, 8)));
            const int64_t T = trial % 7 == 0 ? 0 : 1 + rng.below(200);
            const auto ids = ft::test::random_routing(rng, T, K, E);
            std::vector<float> w(T * K);
            for (float &v : w) v = static_cast<float>(rng.uniform());
            const int32_t src = static_cast<int32_t>(rng.below(R));
            const std::string what = "R=" + std::to_string(R) + " E=" + std::to_string(E) + " K=" + std::to_string(K) +
                                     " T=" + std::to_string(T) + " trial " + std::to_string(trial);
            // Default loads (the forced histogram) and caller-supplied random loads.
            const DispatchLayout a = dispatch_layout(p, ids.data(), w.data(), T, K, src);
            expect_layout_matches(p, ids, w, T, K, src, forced_rank_load(p, ids.data(), T, K), a, what + " forced");
            std::vector<int64_t> load(R);
            for (int64_t &v : load) v = rng.below(4);  // small range: many ties
            const DispatchLayout b = dispatch_layout(p, ids.data(), w.data(), T, K, src, load.data());
            expect_layout_matches(p, ids, w, T, K, src, load, b, what + " given");
            ++cases;
        }
    EXPECT_GT(cases, 150);
}

TEST(EpLayout, SendsOnlyWhereAnExpertIsAndAtMostOnce) {
    Rng rng(0x5eed0002);
    for (int32_t R : {2, 3, 4, 8}) {
        const Placement p = random_placement(rng, 4 * R - 2, R, 2);
        const int32_t K = 6;
        const int64_t T = 300;
        const auto ids = ft::test::random_routing(rng, T, K, p.num_experts);
        const DispatchLayout L = dispatch_layout(p, ids.data(), nullptr, T, K, 0);
        for (int64_t t = 0; t < T; ++t)
            for (int32_t r = 0; r < R; ++r) {
                // Rank r gets t iff it holds a replica chosen for one of t's routes.
                bool chosen_here = false, holds_any = false;
                for (int32_t j = 0; j < K; ++j) {
                    const int32_t e = ids[t * K + j], phy = L.route_phy[t * K + j];
                    if (e < 0) continue;
                    ASSERT_EQ(p.phy2log[phy], e);
                    chosen_here = chosen_here || p.rank_of(phy) == r;
                    for (int32_t s = 0; s < p.slots_per_rank; ++s) holds_any = holds_any || p.phy2log[r * p.slots_per_rank + s] == e;
                }
                ASSERT_EQ(L.sends(r, t), chosen_here);
                if (!holds_any) {
                    ASSERT_FALSE(L.sends(r, t));
                }
            }
        // Each send row appears once: (rank, token) pairs in the send list are distinct.
        std::set<std::pair<int32_t, int32_t>> seen;
        for (int32_t r = 0; r < R; ++r)
            for (int64_t i = L.offset[r]; i < L.offset[r + 1]; ++i) ASSERT_TRUE(seen.insert({r, L.send_token[i]}).second);
    }
}

}  // namespace
