// Dispatch layout, chunk planning for throughput mode and the wire-byte
// model (5.8).
#include <algorithm>
#include <cmath>

#include "ft/common.hpp"
#include "ft/ep.hpp"

namespace ft::ep {

namespace {

void check_routing(const Placement &p, const int32_t *ids, int64_t tokens, int32_t top_k) {
    if (tokens < 0 || top_k <= 0 || (tokens > 0 && ids == nullptr))
        fail(FT_ERR_INVALID_ARGUMENT, "routing: ", tokens, " tokens, top-k ", top_k);
    if (tokens > INT32_MAX) fail(FT_ERR_INVALID_ARGUMENT, "routing: ", tokens, " tokens exceed int32 rows");
    for (int64_t i = 0; i < tokens * top_k; ++i)
        if (ids[i] >= p.num_experts)
            fail(FT_ERR_INVALID_ARGUMENT, "routing: token ", i / top_k, " route ", i % top_k, " names expert ", ids[i],
                 " of ", p.num_experts);
}

int32_t only_replica(const Placement &p, int32_t e) { return p.log2phy[static_cast<size_t>(e) * p.num_ranks]; }

}  // namespace

std::vector<int64_t> forced_rank_load(const Placement &p, const int32_t *ids, int64_t tokens, int32_t top_k) {
    check_routing(p, ids, tokens, top_k);
    const int32_t R = p.num_ranks;
    std::vector<int64_t> load(R, 0);
    std::vector<uint8_t> hit(R);
    for (int64_t t = 0; t < tokens; ++t) {
        std::fill(hit.begin(), hit.end(), 0);
        for (int32_t j = 0; j < top_k; ++j) {
            const int32_t e = ids[t * top_k + j];
            if (e >= 0 && p.logcnt[e] == 1) hit[p.rank_of(only_replica(p, e))] = 1;
        }
        for (int32_t r = 0; r < R; ++r) load[r] += hit[r];
    }
    return load;
}

DispatchLayout dispatch_layout(const Placement &p, const int32_t *ids, const float *weights, int64_t tokens,
                               int32_t top_k, int32_t source_rank, const int64_t *rank_load) {
    check_routing(p, ids, tokens, top_k);
    const int32_t R = p.num_ranks, S = p.slots_per_rank, K = top_k;
    if (source_rank < 0 || source_rank >= R)
        fail(FT_ERR_INVALID_ARGUMENT, "dispatch layout: source rank ", source_rank, " of ", R);
    std::vector<int64_t> forced;
    if (rank_load == nullptr) {
        forced = forced_rank_load(p, ids, tokens, top_k);
        rank_load = forced.data();
    }

    DispatchLayout L;
    L.num_ranks = R;
    L.top_k = K;
    L.tokens = tokens;
    L.source_rank = source_rank;
    L.route_phy.assign(static_cast<size_t>(tokens) * K, -1);
    L.row.assign(static_cast<size_t>(R) * tokens, -1);
    L.count.assign(R, 0);
    L.offset.assign(R + 1, 0);
    L.expert_count.assign(static_cast<size_t>(R) * S, 0);

    // Replica choice and the dedup mask, token by token (tokens are independent: one GPU thread
    // or warp per token reproduces this).
    std::vector<uint8_t> goes(R);
    for (int64_t t = 0; t < tokens; ++t) {
        const int32_t *id = ids + t * K;
        int32_t *phy = L.route_phy.data() + t * K;
        std::fill(goes.begin(), goes.end(), 0);
        for (int32_t j = 0; j < K; ++j)
            if (id[j] >= 0 && p.logcnt[id[j]] == 1) goes[p.rank_of(only_replica(p, id[j]))] = 1;
        for (int32_t j = 0; j < K; ++j) {
            const int32_t e = id[j];
            if (e < 0) continue;
            const int32_t n = p.logcnt[e];
            const int32_t *reps = p.log2phy.data() + static_cast<size_t>(e) * R;
            int32_t choice = reps[0];
            if (n > 1) {
                bool any_going = false;
                for (int32_t i = 0; i < n; ++i) any_going = any_going || goes[p.rank_of(reps[i])];
                choice = -1;
                for (int32_t i = 0; i < n; ++i) {
                    const int32_t r = p.rank_of(reps[i]);
                    if (any_going && !goes[r]) continue;
                    // Replicas are on distinct ranks, so "ties to the lower rank" is a total order.
                    if (choice < 0 || rank_load[r] < rank_load[p.rank_of(choice)] ||
                        (rank_load[r] == rank_load[p.rank_of(choice)] && r < p.rank_of(choice)))
                        choice = reps[i];
                }
            }
            phy[j] = choice;
            goes[p.rank_of(choice)] = 1;
        }
        for (int32_t r = 0; r < R; ++r)
            if (goes[r]) L.row[static_cast<size_t>(r) * tokens + t] = static_cast<int32_t>(L.count[r]++);
    }
    for (int32_t r = 0; r < R; ++r) L.offset[r + 1] = L.offset[r] + L.count[r];

    // Send rows: per rank in token order, routes in ascending logical id (ties: lower j).
    const int64_t rows = L.offset[R];
    L.send_token.assign(rows, -1);
    L.send_n.assign(rows, 0);
    L.send_slot.assign(static_cast<size_t>(rows) * K, -1);
    L.send_weight.assign(static_cast<size_t>(rows) * K, 0.0f);
    std::vector<int32_t> order(K);
    for (int64_t t = 0; t < tokens; ++t) {
        const int32_t *id = ids + t * K;
        const int32_t *phy = L.route_phy.data() + t * K;
        int32_t m = 0;
        for (int32_t j = 0; j < K; ++j)
            if (phy[j] >= 0) order[m++] = j;
        std::stable_sort(order.begin(), order.begin() + m, [&](int32_t a, int32_t b) { return id[a] < id[b]; });
        for (int32_t r = 0; r < R; ++r) {
            const int32_t rr = L.row[static_cast<size_t>(r) * tokens + t];
            if (rr < 0) continue;
            const int64_t out = L.offset[r] + rr;
            L.send_token[out] = static_cast<int32_t>(t);
            int32_t n = 0;
            for (int32_t i = 0; i < m; ++i) {
                const int32_t j = order[i];
                if (p.rank_of(phy[j]) != r) continue;
                L.send_slot[out * K + n] = p.slot_of(phy[j]);
                L.send_weight[out * K + n] = weights ? weights[t * K + j] : 1.0f;
                ++L.expert_count[phy[j]];
                ++n;
            }
            L.send_n[out] = n;
        }
    }
    return L;
}

// ---- chunks ----------------------------------------------------------------------------------

int64_t ChunkPlan::begin(int32_t src, int32_t dst, int32_t chunk) const {
    const int64_t n = counts[static_cast<size_t>(src) * num_ranks + dst];
    return n * chunk / chunks;
}

ChunkPlan plan_chunks(const std::vector<int64_t> &counts, int32_t num_ranks, size_t record_bytes,
                      double link_bytes_per_s, const ChunkPolicy &policy) {
    if (num_ranks <= 0 || counts.size() != static_cast<size_t>(num_ranks) * num_ranks)
        fail(FT_ERR_INVALID_ARGUMENT, "chunk plan: ", counts.size(), " counts for ", num_ranks, " ranks");
    if (record_bytes == 0 || !(link_bytes_per_s >= 0) || policy.max_chunks < 1 || !(policy.max_overhead > 0))
        fail(FT_ERR_INVALID_ARGUMENT, "chunk plan: record ", record_bytes, " bytes, link ", link_bytes_per_s,
             " B/s, max ", policy.max_chunks, " chunks");
    ChunkPlan plan;
    plan.num_ranks = num_ranks;
    plan.counts = counts;
    // A chunk must be large enough for the link to run near peak and to hide the per-operation
    // latency; the faster the link, the more bytes that takes.
    const double chunk_min =
        std::max(static_cast<double>(policy.min_chunk_bytes), link_bytes_per_s * policy.op_latency_s / policy.max_overhead);
    int64_t most = 0;
    for (int32_t s = 0; s < num_ranks; ++s)
        for (int32_t d = 0; d < num_ranks; ++d) {
            const int64_t n = counts[static_cast<size_t>(s) * num_ranks + d];
            if (n < 0) fail(FT_ERR_INVALID_ARGUMENT, "chunk plan: count ", s, " -> ", d, " is ", n);
            if (s != d) most = std::max(most, n);
        }
    const double c = std::floor(static_cast<double>(most) * static_cast<double>(record_bytes) / std::max(chunk_min, 1.0));
    plan.chunks = static_cast<int32_t>(std::clamp(c, 1.0, static_cast<double>(policy.max_chunks)));
    return plan;
}

// ---- wire bytes ------------------------------------------------------------------------------

WireBytes wire_bytes(const Placement &p, const int32_t *ids, int64_t tokens, int32_t top_k, int64_t hidden) {
    const int32_t R = p.num_ranks;
    WireBytes w;
    if (tokens <= 0) return w;
    const double fp8 = static_cast<double>(record_bytes(hidden, top_k, WireDtype::Fp8Fp32));
    const double b16 = static_cast<double>(record_bytes(hidden, top_k, WireDtype::Bf16));
    const double row = 2.0 * static_cast<double>(hidden);
    int64_t remote_rows = 0, remote_routes = 0;
    for (int32_t s = 0; s < R; ++s) {
        const int64_t t0 = tokens * s / R, t1 = tokens * (s + 1) / R;
        const DispatchLayout L = dispatch_layout(p, ids + t0 * top_k, nullptr, t1 - t0, top_k, s);
        for (int32_t r = 0; r < R; ++r)
            if (r != s) remote_rows += L.count[r];
        for (int32_t phy : L.route_phy)
            if (phy >= 0 && p.rank_of(phy) != s) ++remote_routes;
    }
    const double T = static_cast<double>(tokens);
    w.dispatch_dedup_fp8 = remote_rows * fp8 / T;
    w.dispatch_dedup_bf16 = remote_rows * b16 / T;
    w.allgather_bf16 = (R - 1) * row;
    w.alltoall_bf16 = remote_routes * row / T;
    w.combine_dedup_bf16 = remote_rows * row / T;
    w.combine_dedup_fp8 = remote_rows * static_cast<double>(combine_row_bytes(hidden, WireDtype::Fp8Fp32)) / T;
    w.remote_fraction = R > 1 ? remote_rows / (T * (R - 1)) : 0.0;
    return w;
}

}  // namespace ft::ep
