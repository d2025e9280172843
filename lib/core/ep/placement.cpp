// Expert placement maps and the placement planner.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ft/common.hpp"
#include "ft/ep.hpp"

namespace ft::ep {

Placement make_placement(int32_t num_experts, int32_t num_ranks, std::vector<int32_t> phy2log) {
    if (num_experts <= 0 || num_ranks <= 0)
        fail(FT_ERR_INVALID_ARGUMENT, "placement: ", num_experts, " experts on ", num_ranks, " ranks");
    if (phy2log.empty() || phy2log.size() % num_ranks != 0)
        fail(FT_ERR_INVALID_ARGUMENT, "placement: ", phy2log.size(), " physical experts do not split over ",
             num_ranks, " ranks");
    Placement p;
    p.num_experts = num_experts;
    p.num_ranks = num_ranks;
    p.slots_per_rank = static_cast<int32_t>(phy2log.size() / num_ranks);
    p.phy2log = std::move(phy2log);
    p.logcnt.assign(num_experts, 0);
    p.log2phy.assign(static_cast<size_t>(num_experts) * num_ranks, -1);
    for (int32_t phy = 0; phy < static_cast<int32_t>(p.phy2log.size()); ++phy) {
        const int32_t e = p.phy2log[phy];
        if (e < 0 || e >= num_experts)
            fail(FT_ERR_INVALID_ARGUMENT, "placement: physical ", phy, " holds expert ", e, " of ", num_experts);
        int32_t &n = p.logcnt[e];
        for (int32_t i = 0; i < n; ++i)
            if (p.rank_of(p.log2phy[static_cast<size_t>(e) * num_ranks + i]) == p.rank_of(phy))
                fail(FT_ERR_INVALID_ARGUMENT, "placement: expert ", e, " twice on rank ", p.rank_of(phy));
        // Distinct ranks bound the replicas by R, so [E*R] always has room.
        p.log2phy[static_cast<size_t>(e) * num_ranks + n++] = phy;
    }
    for (int32_t e = 0; e < num_experts; ++e)
        if (p.logcnt[e] == 0) fail(FT_ERR_INVALID_ARGUMENT, "placement: expert ", e, " is not placed");
    return p;
}

Placement contiguous_placement(int32_t num_experts, int32_t num_ranks) {
    if (num_ranks <= 0 || num_experts % num_ranks != 0)
        fail(FT_ERR_INVALID_ARGUMENT, "contiguous placement: ", num_experts, " experts do not split over ",
             num_ranks, " ranks");
    std::vector<int32_t> phy2log(num_experts);
    std::iota(phy2log.begin(), phy2log.end(), 0);
    return make_placement(num_experts, num_ranks, std::move(phy2log));
}

double coactivation_cut(const Placement &p, const std::vector<double> &coact) {
    const int32_t E = p.num_experts, R = p.num_ranks;
    if (coact.empty()) return 0.0;
    if (coact.size() != static_cast<size_t>(E) * E)
        fail(FT_ERR_INVALID_ARGUMENT, "co-activation matrix has ", coact.size(), " entries, expected ", E, "x", E);
    // Rank sets as bitmasks would cap R at 64; a byte vector per expert keeps it general.
    std::vector<uint8_t> on(static_cast<size_t>(E) * R, 0);
    for (int32_t phy = 0; phy < static_cast<int32_t>(p.phy2log.size()); ++phy)
        on[static_cast<size_t>(p.phy2log[phy]) * R + p.rank_of(phy)] = 1;
    double cut = 0;
    for (int32_t e = 0; e < E; ++e)
        for (int32_t f = e + 1; f < E; ++f) {
            bool shared = false;
            for (int32_t r = 0; r < R && !shared; ++r) shared = on[static_cast<size_t>(e) * R + r] && on[static_cast<size_t>(f) * R + r];
            if (!shared) cut += coact[static_cast<size_t>(e) * E + f];
        }
    return cut;
}

namespace {

void check_input(const PlannerInput &in) {
    const int32_t E = in.num_experts, R = in.num_ranks;
    if (E <= 0 || R <= 0 || in.replicas < 0)
        fail(FT_ERR_INVALID_ARGUMENT, "planner: ", E, " experts, ", R, " ranks, ", in.replicas, " replicas");
    if ((E + in.replicas) % R != 0)
        fail(FT_ERR_INVALID_ARGUMENT, "planner: ", E, " experts + ", in.replicas, " replicas do not split over ", R,
             " ranks");
    if (static_cast<int64_t>(in.replicas) > static_cast<int64_t>(E) * (R - 1))
        fail(FT_ERR_INVALID_ARGUMENT, "planner: ", in.replicas, " replicas exceed one copy per rank for ", E,
             " experts");
    if (in.load.size() != static_cast<size_t>(E))
        fail(FT_ERR_INVALID_ARGUMENT, "planner: ", in.load.size(), " loads for ", E, " experts");
    for (int32_t e = 0; e < E; ++e)
        if (!std::isfinite(in.load[e]) || in.load[e] < 0)
            fail(FT_ERR_INVALID_ARGUMENT, "planner: load of expert ", e, " is ", in.load[e]);
    if (!in.coactivation.empty() && in.coactivation.size() != static_cast<size_t>(E) * E)
        fail(FT_ERR_INVALID_ARGUMENT, "planner: co-activation has ", in.coactivation.size(), " entries for ", E,
             " experts");
    if (!in.rank_bandwidth.empty()) {
        if (in.rank_bandwidth.size() != static_cast<size_t>(R))
            fail(FT_ERR_INVALID_ARGUMENT, "planner: ", in.rank_bandwidth.size(), " bandwidths for ", R, " ranks");
        for (int32_t r = 0; r < R; ++r)
            if (!(in.rank_bandwidth[r] > 0) || !std::isfinite(in.rank_bandwidth[r]))
                fail(FT_ERR_INVALID_ARGUMENT, "planner: bandwidth of rank ", r, " is ", in.rank_bandwidth[r]);
    }
}

}  // namespace

PlanResult plan_placement(const PlannerInput &in) {
    check_input(in);
    const int32_t E = in.num_experts, R = in.num_ranks;
    const int32_t S = (E + in.replicas) / R;

    // Bandwidth relative to the fastest link, so rank_time is in load units for equal links.
    std::vector<double> bw(R, 1.0);
    if (!in.rank_bandwidth.empty()) {
        const double top = *std::max_element(in.rank_bandwidth.begin(), in.rank_bandwidth.end());
        for (int32_t r = 0; r < R; ++r) bw[r] = in.rank_bandwidth[r] / top;
    }

    // 1. Replicas: each extra copy goes where it cuts the largest per-copy load.
    std::vector<int32_t> logcnt(E, 1);
    for (int32_t i = 0; i < in.replicas; ++i) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; ++e) {
            if (logcnt[e] >= R) continue;
            if (best < 0 || in.load[e] / logcnt[e] > in.load[best] / logcnt[best]) best = e;
        }
        ++logcnt[best];  // check_input guarantees a candidate
    }

    // 2. Largest-first packing with S experts per rank.
    struct Copy {
        int32_t expert, index;
        double weight;
    };
    std::vector<Copy> copies;
    for (int32_t e = 0; e < E; ++e)
        for (int32_t i = 0; i < logcnt[e]; ++i) copies.push_back({e, i, in.load[e] / logcnt[e]});
    std::stable_sort(copies.begin(), copies.end(), [](const Copy &a, const Copy &b) {
        if (a.weight != b.weight) return a.weight > b.weight;
        if (a.expert != b.expert) return a.expert < b.expert;
        return a.index < b.index;
    });
    std::vector<std::vector<int32_t>> members(R);
    std::vector<double> load(R, 0.0);
    std::vector<uint8_t> holds(static_cast<size_t>(E) * R, 0);
    for (const Copy &c : copies) {
        int32_t best = -1;
        double best_time = 0;
        for (int32_t r = 0; r < R; ++r) {
            if (static_cast<int32_t>(members[r].size()) >= S || holds[static_cast<size_t>(c.expert) * R + r]) continue;
            const double t = (load[r] + c.weight) / bw[r];
            if (best < 0 || t < best_time) {
                best = r;
                best_time = t;
            }
        }
        // A copy can find no rank only if all ranks with free slots already hold the expert; with
        // copies placed hottest first and logcnt <= R this is possible in corner cases, so say so.
        if (best < 0)
            fail(FT_ERR_INTERNAL, "planner: no rank left for copy ", c.index, " of expert ", c.expert);
        members[best].push_back(c.expert);
        load[best] += c.weight;
        holds[static_cast<size_t>(c.expert) * R + best] = 1;
    }

    PlanResult result;
    auto time_of = [&](int32_t r) { return load[r] / bw[r]; };
    for (int32_t r = 0; r < R; ++r) result.packed_max_time = std::max(result.packed_max_time, time_of(r));

    // 3. Affinity: swap single-copy experts to keep co-activated ones together.
    auto make = [&]() {
        std::vector<int32_t> phy2log;
        for (int32_t r = 0; r < R; ++r) {
            std::vector<int32_t> m = members[r];
            std::sort(m.begin(), m.end());  // 4. slots in ascending logical id
            phy2log.insert(phy2log.end(), m.begin(), m.end());
        }
        return make_placement(E, R, std::move(phy2log));
    };
    result.cut_before = coactivation_cut(make(), in.coactivation);
    if (!in.coactivation.empty()) {
        const std::vector<double> &C = in.coactivation;
        std::vector<int32_t> rank(E, -1);  // rank of each single-copy expert
        for (int32_t r = 0; r < R; ++r)
            for (int32_t e : members[r])
                if (logcnt[e] == 1) rank[e] = r;
        // aff[e*R + r]: co-activation of e with every other expert on rank r, kept current across
        // swaps so each candidate swap's gain costs O(1) instead of a full cut evaluation.
        std::vector<double> aff(static_cast<size_t>(E) * R, 0.0);
        for (int32_t e = 0; e < E; ++e)
            for (int32_t r = 0; r < R; ++r)
                for (int32_t f : members[r])
                    if (f != e) aff[static_cast<size_t>(e) * R + r] += C[static_cast<size_t>(e) * E + f];
        const double limit = result.packed_max_time * (1.0 + in.balance_tolerance);
        while (result.swaps < in.max_swaps) {
            int32_t be = -1, bf = -1;
            double best_gain = 0;
            for (int32_t e = 0; e < E; ++e) {
                if (rank[e] < 0) continue;
                for (int32_t f = e + 1; f < E; ++f) {
                    const int32_t a = rank[e], b = rank[f];
                    if (b < 0 || a == b) continue;
                    const double c = C[static_cast<size_t>(e) * E + f];
                    // Within-rank affinity gained: e moves a -> b (loses f's company there, as f
                    // leaves b), f moves b -> a likewise. A replicated expert on both ranks counts
                    // on both sides and cancels, which is right: it stays shared either way.
                    const double gain = (aff[static_cast<size_t>(e) * R + b] - c - aff[static_cast<size_t>(e) * R + a]) +
                                        (aff[static_cast<size_t>(f) * R + a] - c - aff[static_cast<size_t>(f) * R + b]);
                    if (gain <= best_gain) continue;
                    const double dw = in.load[f] - in.load[e];
                    if ((load[a] + dw) / bw[a] > limit || (load[b] - dw) / bw[b] > limit) continue;
                    best_gain = gain;
                    be = e;
                    bf = f;
                }
            }
            // Gains below rounding noise would let the loop cycle on ties.
            if (be < 0 || best_gain <= 1e-12 * (1.0 + result.cut_before)) break;
            const int32_t a = rank[be], b = rank[bf];
            for (int32_t g = 0; g < E; ++g) {
                aff[static_cast<size_t>(g) * R + a] += C[static_cast<size_t>(g) * E + bf] - C[static_cast<size_t>(g) * E + be];
                aff[static_cast<size_t>(g) * R + b] += C[static_cast<size_t>(g) * E + be] - C[static_cast<size_t>(g) * E + bf];
            }
            // aff[e][r] excludes e itself: undo the self terms the loop just added.
            aff[static_cast<size_t>(be) * R + b] -= C[static_cast<size_t>(be) * E + be];
            aff[static_cast<size_t>(be) * R + a] += C[static_cast<size_t>(be) * E + be];
            aff[static_cast<size_t>(bf) * R + a] -= C[static_cast<size_t>(bf) * E + bf];
            aff[static_cast<size_t>(bf) * R + b] += C[static_cast<size_t>(bf) * E + bf];
            std::replace(members[a].begin(), members[a].end(), be, bf);
            std::replace(members[b].begin(), members[b].end(), bf, be);
            const double dw = in.load[bf] - in.load[be];
            load[a] += dw;
            load[b] -= dw;
            rank[be] = b;
            rank[bf] = a;
            ++result.swaps;
        }
    }

    result.placement = make();
    result.cut_after = coactivation_cut(result.placement, in.coactivation);
    result.rank_load = load;
    result.rank_time.resize(R);
    for (int32_t r = 0; r < R; ++r) result.rank_time[r] = time_of(r);
    return result;
}

}  // namespace ft::ep
