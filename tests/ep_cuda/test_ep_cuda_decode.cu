// The one-block decode kernels of the EP layout and grouping against the host, and the chains
// they hand over to past their bounds: every buffer launch_layout writes, whole steps at sizes on
// both sides of every bound, and the layout at its edges. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "ep_cuda_sim_step.cuh"

namespace {

using namespace ep_cuda_test;

// ---- the one-block decode kernels and the chains against the host ---------------------------

// Every buffer launch_layout writes, and the latency-mode regions launch_pack writes.
struct LayoutDump {
    std::vector<int32_t> route_phy, row, send_token, send_n, send_slot;
    std::vector<uint64_t> mask;
    std::vector<int64_t> forced_load, count, offset, expert_count;
    std::vector<float> send_weight;
    std::vector<uint8_t> regions;
};

// Every buffer launch_layout wrote for `tokens` tokens (forced_load only when the kernel computed
// it, i.e. without a caller's rank load).
LayoutDump read_layout(const epc::LayoutBuffers &L, int64_t tokens, bool caller_load) {
    const int32_t R = L.num_ranks, S = L.slots, K = L.top_k;
    LayoutDump d;
    const int64_t rows = fetch(L.offset + R, 1)[0];
    d.route_phy = fetch(L.route_phy, tokens * K);
    d.mask = fetch(L.mask, tokens);
    d.forced_load = caller_load ? std::vector<int64_t>() : fetch(L.forced_load, R);
    d.row = fetch(L.row, R * tokens);
    d.count = fetch(L.count, R);
    d.offset = fetch(L.offset, R + 1);
    d.expert_count = fetch(L.expert_count, R * S);
    d.send_token = fetch(L.send_token, rows);
    d.send_n = fetch(L.send_n, rows);
    d.send_slot = fetch(L.send_slot, rows * K);
    d.send_weight = fetch(L.send_weight, rows * K);
    return d;
}

LayoutDump layout_on_device(const Placement &p, const RankInput &ri, int32_t r, const int64_t *rank_load, int64_t H,
                            WireDtype dtype) {
    const int32_t R = p.num_ranks, S = p.slots_per_rank, K = kTopK;
    const int64_t T = std::max<int64_t>(ri.tokens, 1);
    epc::PlacementBuffer dp(p);
    DeviceArray<uint8_t> lmem(epc::layout_bytes(R, S, K, T));
    // Poison first: both paths must write the same bytes, not rely on what is there.
    ft::test::cuda_ok(cudaMemset(lmem.ptr, 0xa5, epc::layout_bytes(R, S, K, T)), "poison");
    const epc::LayoutBuffers L = epc::carve_layout(lmem.ptr, R, S, K, T);
    DeviceArray<int32_t> ids(ri.ids);
    DeviceArray<float> w(ri.weights);
    DeviceArray<uint16_t> x(ri.x);
    DeviceArray<int64_t> load(std::vector<int64_t>(R, 0));
    if (rank_load) load.upload(std::vector<int64_t>(rank_load, rank_load + R));
    const size_t peer = epc::latency_peer_bytes(H, K, dtype, T);
    DeviceArray<uint8_t> regions(peer * R);
    ft::test::cuda_ok(cudaMemset(regions.ptr, 0x5a, peer * R), "poison");
    epc::launch_layout(dp.view(), ids.ptr, w.ptr, ri.tokens, K, r, rank_load ? load.ptr : nullptr, L, nullptr);
    epc::launch_pack(L, R * T, x.ptr, H, dtype, r, {regions.ptr, peer}, nullptr);
    ft::test::cuda_ok(cudaDeviceSynchronize(), "layout");
    LayoutDump d = read_layout(L, ri.tokens, rank_load != nullptr);
    d.regions = regions.download(peer * R);
    return d;
}

// The layout (with and without a caller's rank load), the grouped expert rows and whole
// throughput and latency steps equal the host bit for bit, at sizes on both sides of every bound
// between the one-block kernels and the chains: decode sizes, the layout and group bounds exactly
// (T = 512, R = 2) and just above (T = 513), more than 1024 slots per rank (the group's bound;
// the layout still one block) and more than 4096 slots in all (the layout's bound).
TEST(EpCudaSim, OneBlockKernelsAndChainsEqualHost) {
    REQUIRE_GPU();
    struct KnobCase {
        Case c;
        int32_t experts;  // > 0: contiguous placement of that many experts
    };
    const KnobCase all[] = {{{4, 2048, 1, WireDtype::Fp8Fp32, true, 61}, 0},
                            {{8, 2048, 7, WireDtype::Fp8Ue8m0, true, 62}, 0},
                            {{3, 2048, 64, WireDtype::Bf16, false, 63}, 0},
                            {{5, 2048, 33, WireDtype::Fp8Fp32, true, 64}, 0},
                            {{2, 2048, 512, WireDtype::Fp8Fp32, true, 65}, 0},
                            {{2, 2048, 513, WireDtype::Fp8Ue8m0, true, 66}, 0},
                            {{2, 1024, 7, WireDtype::Fp8Fp32, false, 67}, 3000},
                            {{2, 1024, 7, WireDtype::Bf16, false, 68}, 4400}};
    for (const KnobCase &kc : all) {
        const Case &c = kc.c;
        SCOPED_TRACE(ft::cat(name(c), kc.experts ? ft::cat(" E=", kc.experts) : std::string()));
        Rng rng(c.seed);
        const Placement p = kc.experts ? contiguous_placement(kc.experts, c.R) : make_placement_for(c, rng);
        const std::vector<RankInput> in = make_inputs(c, p, rng);
        const Experts ex = make_experts(rng, p.num_experts);
        const std::vector<HostRank> h = host_pipeline(p, in, c.H, c.dtype, ex);
        const int64_t rows = max_expert_rows(h);

        // Layout + pack of every rank, forced loads and a caller's load (ties on purpose).
        std::vector<int64_t> load(c.R);
        for (int32_t r = 0; r < c.R; ++r) load[r] = (r * 7) % 3;
        for (int32_t r = 0; r < c.R; ++r) {
            SCOPED_TRACE(ft::cat("rank ", r));
            const int64_t *none = nullptr;
            for (const int64_t *rl : {none, static_cast<const int64_t *>(load.data())}) {
                const LayoutDump on = layout_on_device(p, in[r], r, rl, c.H, c.dtype);
                const DispatchLayout hl =
                    dispatch_layout(p, in[r].ids.data(), in[r].weights.data(), in[r].tokens, kTopK, r, rl);
                EXPECT_EQ(on.route_phy, hl.route_phy);
                EXPECT_EQ(on.row, hl.row);
                EXPECT_EQ(on.offset, hl.offset);
                EXPECT_EQ(on.expert_count, hl.expert_count);
                EXPECT_EQ(on.send_slot, hl.send_slot);
                if (!rl) EXPECT_EQ(on.forced_load, forced_rank_load(p, in[r].ids.data(), in[r].tokens, kTopK));
            }
        }

        // Whole steps: throughput (receive side compared buffer by buffer) and latency.
        const DeviceResult tp = run_device(p, in, c.H, c.dtype, ex, Run::Throughput, 1, rows);
        const DeviceResult lat = run_device(p, in, c.H, c.dtype, ex, Run::LatencyOneThread, 0, rows);
        for (int32_t r = 0; r < c.R; ++r) {
            SCOPED_TRACE(ft::cat("rank ", r));
            EXPECT_EQ(tp.expert_offset[r], h[r].rows.offset);
            EXPECT_EQ(tp.row_position[r], h[r].rows.record);
            EXPECT_TRUE(lat.out[r] == h[r].out) << "latency output differs from the host";
            EXPECT_TRUE(tp.out[r] == h[r].out) << "throughput output differs from the host";
        }
    }
}

// The one-block layout (a warp per token) against the host at the edges the test
// cases above do not reach: top-k 1, 13 and 32 (a full warp), more than 32 ranks (the high half
// of the 64-bit masks), experts with 1..3 replicas and one on every rank (up to 64), ids out of range (below 0,
// at or past E, INT32_MIN/MAX), repeated ids in one token (ties: lower j), tied rank loads, and
// 1..4 tokens per warp (up to the 4096-route bound). Every buffer launch_layout writes.
LayoutDump layout_dump(const epc::PlacementBuffer &dp, const Placement &p, const std::vector<int32_t> &ids_h,
                       const std::vector<float> &w_h, int64_t tokens, int32_t K, int32_t r,
                       const int64_t *rank_load) {
    const int32_t R = p.num_ranks, S = p.slots_per_rank;
    const int64_t T = std::max<int64_t>(tokens, 1);
    DeviceArray<uint8_t> lmem(epc::layout_bytes(R, S, K, T));
    ft::test::cuda_ok(cudaMemset(lmem.ptr, 0xa5, epc::layout_bytes(R, S, K, T)), "poison");
    const epc::LayoutBuffers L = epc::carve_layout(lmem.ptr, R, S, K, T);
    DeviceArray<int32_t> ids(ids_h);
    DeviceArray<float> w(w_h);
    DeviceArray<int64_t> load(std::vector<int64_t>(R, 0));
    if (rank_load) load.upload(std::vector<int64_t>(rank_load, rank_load + R));
    epc::launch_layout(dp.view(), ids.ptr, w.ptr, tokens, K, r, rank_load ? load.ptr : nullptr, L, nullptr);
    ft::test::cuda_ok(cudaDeviceSynchronize(), "layout");
    return read_layout(L, tokens, rank_load != nullptr);
}

TEST(EpCudaKernels, SmallLayoutMatchesHostAtTheEdges) {
    REQUIRE_GPU();
    // Expert of (rank r, slot s): (7 s + r) mod E, or with `hot` expert 0 in slot 0 of every rank
    // (R replicas) and 1 + (7 s + r) mod (E - 1) elsewhere: distinct on a rank, every expert placed,
    // 1..3 copies besides the hot one.
    struct Shape {
        int32_t R, S, E;
        bool hot;
    };
    const Shape shapes[] = {{8, 6, 21, true}, {40, 3, 50, false}, {64, 3, 70, true}};
    uint64_t seed = 700;
    for (const Shape &sh : shapes) {
        std::vector<int32_t> phy2log(sh.R * sh.S);
        for (int32_t r = 0; r < sh.R; ++r)
            for (int32_t s = 0; s < sh.S; ++s)
                phy2log[r * sh.S + s] = !sh.hot ? (7 * s + r) % sh.E : (s == 0 ? 0 : 1 + (7 * s + r) % (sh.E - 1));
        const Placement p = make_placement(sh.E, sh.R, phy2log);
        epc::PlacementBuffer dp(p);
        std::vector<int64_t> load(sh.R);
        for (int32_t r = 0; r < sh.R; ++r) load[r] = (r * 7) % 3;
        for (int32_t K : {1, 13, 32})
            for (int64_t T : {1, 5, 32, 33, 64, 4096 / K})
                for (bool outside : {false, true}) {
                    if (T * K > 4096) continue;
                    SCOPED_TRACE(ft::cat("R=", sh.R, " K=", K, " T=", T, outside ? " ids out of range" : ""));
                    Rng rng(seed++);
                    std::vector<int32_t> ids(T * K);
                    std::vector<float> w(T * K);
                    for (int64_t i = 0; i < T * K; ++i) {
                        const double u = rng.uniform();
                        const int64_t j = i % K;
                        if (u < 0.1)
                            ids[i] = -1 - static_cast<int32_t>(rng.below(3));
                        else if (outside && u < 0.2)
                            ids[i] = rng.below(2) ? sh.E + static_cast<int32_t>(rng.below(3))
                                                  : (rng.below(2) ? INT32_MAX : INT32_MIN);
                        else if (j > 0 && u < 0.35)
                            ids[i] = ids[i - 1 - rng.below(j)];  // a repeat: may be -1 or out of range too
                        else
                            ids[i] = static_cast<int32_t>(rng.below(sh.E));
                        w[i] = static_cast<float>(rng.uniform());
                    }
                    const int32_t src = static_cast<int32_t>(rng.below(sh.R));
                    const int64_t *none = nullptr;
                    for (const int64_t *rl : {none, static_cast<const int64_t *>(load.data())}) {
                        const LayoutDump on = layout_dump(dp, p, ids, w, T, K, src, rl);
                        // The host rejects ids >= E; the kernels skip every id outside [0, E)
                        // exactly as the host skips -1, so the host runs on ids with those as -1.
                        std::vector<int32_t> host_ids = ids;
                        for (int32_t &e : host_ids)
                            if (e >= sh.E) e = -1;
                        const DispatchLayout hl = dispatch_layout(p, host_ids.data(), w.data(), T, K, src, rl);
                        EXPECT_EQ(on.route_phy, hl.route_phy);
                        EXPECT_EQ(on.row, hl.row);
                        EXPECT_EQ(on.count, hl.count);
                        EXPECT_EQ(on.offset, hl.offset);
                        EXPECT_EQ(on.expert_count, hl.expert_count);
                        EXPECT_EQ(on.send_token, hl.send_token);
                        EXPECT_EQ(on.send_n, hl.send_n);
                        EXPECT_EQ(on.send_slot, hl.send_slot);
                        EXPECT_EQ(on.send_weight, hl.send_weight);
                        if (!rl) EXPECT_EQ(on.forced_load, forced_rank_load(p, host_ids.data(), T, K));
                    }
                }
    }
}
}  // namespace
