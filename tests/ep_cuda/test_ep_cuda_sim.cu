// Whole EP steps on one GPU with R = 2..8 ranks simulated by the device-copy transport double
// against the host reference: the received records, expert grouping, unpack, local reduction and
// combine bit for bit; tokens that encode (source, index) arrive exactly once where they should;
// the output equals a single-device MoE within the FP8 tolerance; bit-identical across chunk
// counts, throughput vs latency mode, and eager vs CUDA-graph replay. Skips without a GPU.
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

// ---- the whole step through the simulated transport ------------------------------------------

TEST(EpCudaSim, StepMatchesHostBitForBit) {
    REQUIRE_GPU();
    for (const Case &c : cases()) {
        if (c.T > 64 && c.H > 2048) continue;
        SCOPED_TRACE(name(c));
        Rng rng(c.seed);
        const Placement p = make_placement_for(c, rng);
        const std::vector<RankInput> in = make_inputs(c, p, rng);
        const Experts ex = make_experts(rng, p.num_experts);
        const std::vector<HostRank> h = host_pipeline(p, in, c.H, c.dtype, ex);
        const DeviceResult d = run_device(p, in, c.H, c.dtype, ex, Run::Throughput, 1, max_expert_rows(h));
        for (int32_t r = 0; r < c.R; ++r) {
            SCOPED_TRACE(ft::cat("rank ", r));
            EXPECT_TRUE(d.received[r] == h[r].received) << "received records differ";
            EXPECT_EQ(d.expert_offset[r], h[r].rows.offset);
            EXPECT_EQ(d.row_position[r], h[r].rows.record);
            EXPECT_EQ(d.row_route[r], h[r].rows.route);
            EXPECT_TRUE(d.x_rows[r] == h[r].x_rows) << "unpacked rows differ";
            EXPECT_TRUE(d.partials[r] == h[r].partials) << "partials differ";
            EXPECT_TRUE(d.out[r] == h[r].out) << "combined output differs";
        }
    }
}

TEST(EpCudaSim, BitIdenticalAcrossChunksModesAndGraphReplay) {
    REQUIRE_GPU();
    for (const Case &c : {Case{4, 2048, 64, WireDtype::Fp8Fp32, true, 11}, Case{3, 2048, 300, WireDtype::Fp8Ue8m0, false, 12},
                          Case{8, 7168, 16, WireDtype::Fp8Fp32, true, 13}}) {
        SCOPED_TRACE(name(c));
        Rng rng(c.seed);
        const Placement p = make_placement_for(c, rng);
        const std::vector<RankInput> in = make_inputs(c, p, rng);
        const std::vector<RankInput> other = make_inputs(c, p, rng);  // graph captured on these
        const Experts ex = make_experts(rng, p.num_experts);
        const std::vector<HostRank> h = host_pipeline(p, in, c.H, c.dtype, ex);
        const int64_t rows = max_expert_rows(h);
        const DeviceResult base = run_device(p, in, c.H, c.dtype, ex, Run::Throughput, 1, rows);
        for (int32_t chunks : {2, 3, 4}) {
            const DeviceResult d = run_device(p, in, c.H, c.dtype, ex, Run::Throughput, chunks, rows);
            EXPECT_EQ(d.chunks[0], chunks);
            EXPECT_TRUE(d.out == base.out) << chunks << " chunks";
        }
        EXPECT_TRUE(run_device(p, in, c.H, c.dtype, ex, Run::LatencyThreaded, 0, rows).out == base.out) << "latency";
        EXPECT_TRUE(run_device(p, in, c.H, c.dtype, ex, Run::LatencyOneThread, 0, rows).out == base.out) << "one thread";
        // The graph sees the other inputs' token counts: same shapes, so the counts agree.
        std::vector<RankInput> shaped = other;
        for (int32_t r = 0; r < c.R; ++r) ASSERT_EQ(shaped[r].tokens, in[r].tokens);
        EXPECT_TRUE(run_device(p, in, c.H, c.dtype, ex, Run::LatencyGraph, 0, rows, &shaped).out == base.out)
            << "graph replay";
        for (int32_t r = 0; r < c.R; ++r) EXPECT_TRUE(base.out[r] == h[r].out) << "rank " << r;
    }
}

TEST(EpCudaSim, ValueEncodedTokensArriveExactlyOnceWhereTheyShould) {
    REQUIRE_GPU();
    for (const Case &c : {Case{5, 2048, 300, WireDtype::Bf16, true, 21}, Case{8, 2048, 64, WireDtype::Bf16, false, 22}}) {
        SCOPED_TRACE(name(c));
        Rng rng(c.seed);
        const Placement p = make_placement_for(c, rng);
        const std::vector<RankInput> in = make_inputs(c, p, rng, true);
        const Experts ex = make_experts(rng, p.num_experts);
        const std::vector<HostRank> h = host_pipeline(p, in, c.H, c.dtype, ex);
        const DeviceResult d = run_device(p, in, c.H, c.dtype, ex, Run::Throughput, 2, max_expert_rows(h));
        const int32_t R = c.R;
        const RecordLayout RL = record_layout(c.H, kTopK, c.dtype);
        for (int32_t dst = 0; dst < R; ++dst) {
            // Expected: (source, token) for every token whose layout sends it to dst; and per local
            // slot, the (source, token) of every route whose chosen replica is that slot.
            std::multiset<std::pair<int32_t, int32_t>> want_records, got_records;
            for (int32_t s = 0; s < R; ++s)
                for (int64_t t = 0; t < in[s].tokens; ++t)
                    if (h[s].layout.sends(dst, t)) want_records.insert({s, static_cast<int32_t>(t)});
            // Dispatch was chunked here, so read what arrived (throughput numbering) directly.
            const std::vector<uint8_t> &rec = d.received[dst];
            for (size_t i = 0; i < rec.size() / RL.bytes; ++i) {
                const uint8_t *r0 = rec.data() + i * RL.bytes;
                const RecordMeta m = read_record_meta(r0, RL, kTopK);
                uint16_t v[3];
                std::memcpy(v, r0 + RL.payload, sizeof v);
                const int32_t src = static_cast<int32_t>(bf16_to_f32(v[0]));
                const int32_t tok = static_cast<int32_t>(bf16_to_f32(v[1])) + 256 * static_cast<int32_t>(bf16_to_f32(v[2]));
                EXPECT_EQ(src, m.source);
                EXPECT_EQ(tok, m.token);
                got_records.insert({src, tok});
            }
            EXPECT_EQ(got_records, want_records) << "dst " << dst;
            const std::set<std::pair<int32_t, int32_t>> distinct(got_records.begin(), got_records.end());
            EXPECT_EQ(distinct.size(), got_records.size())
                << "a token reached rank " << dst << " twice";
        }
        // Expert rows (last chunk only here, so use an unchunked run for them).
        const DeviceResult one = run_device(p, in, c.H, c.dtype, ex, Run::Throughput, 1, max_expert_rows(h));
        for (int32_t dst = 0; dst < R; ++dst) {
            std::map<int32_t, std::multiset<std::pair<int32_t, int32_t>>> want_rows, got_rows;
            for (int32_t s = 0; s < R; ++s)
                for (int64_t t = 0; t < in[s].tokens; ++t)
                    for (int32_t j = 0; j < kTopK; ++j) {
                        const int32_t phy = h[s].layout.route_phy[t * kTopK + j];
                        if (phy >= 0 && p.rank_of(phy) == dst) want_rows[p.slot_of(phy)].insert({s, static_cast<int32_t>(t)});
                    }
            const std::vector<int64_t> &off = one.expert_offset[dst];
            for (int32_t slot = 0; slot < p.slots_per_rank; ++slot)
                for (int64_t k = off[slot]; k < off[slot + 1]; ++k) {
                    const uint16_t *xr = one.x_rows[dst].data() + k * c.H;
                    const int32_t src = static_cast<int32_t>(bf16_to_f32(xr[0]));
                    const int32_t tok = static_cast<int32_t>(bf16_to_f32(xr[1])) + 256 * static_cast<int32_t>(bf16_to_f32(xr[2]));
                    EXPECT_EQ(src, one.row_source[dst][k]);
                    EXPECT_EQ(tok, one.row_token[dst][k]);
                    got_rows[slot].insert({src, tok});
                }
            EXPECT_EQ(got_rows, want_rows) << "expert rows of rank " << dst;
        }
    }
}

// Single-device MoE in double from the bf16 inputs; the EP path sees FP8 on the wire.
TEST(EpCudaSim, EqualsSingleDeviceMoEWithinFp8Tolerance) {
    REQUIRE_GPU();
    for (const Case &c : {Case{4, 2048, 200, WireDtype::Fp8Fp32, true, 31}, Case{8, 7168, 32, WireDtype::Fp8Ue8m0, false, 32},
                          Case{2, 2048, 64, WireDtype::Bf16, false, 33}}) {
        SCOPED_TRACE(name(c));
        Rng rng(c.seed);
        const Placement p = make_placement_for(c, rng);
        const std::vector<RankInput> in = make_inputs(c, p, rng);
        const Experts ex = make_experts(rng, p.num_experts);
        const std::vector<HostRank> h = host_pipeline(p, in, c.H, c.dtype, ex);
        const DeviceResult d = run_device(p, in, c.H, c.dtype, ex, Run::Throughput, 0, max_expert_rows(h));
        int64_t bad = 0;
        double worst = 0;
        for (int32_t r = 0; r < c.R; ++r) {
            const MoeCheck m = check_against_moe(in[r], ex, c.H, c.dtype, d.out[r]);
            bad += m.bad;
            worst = std::max(worst, m.worst);
        }
        EXPECT_EQ(bad, 0) << "worst error / tolerance " << worst;
    }
}

TEST(EpCudaSim, CountsAndBytesMatchTheLayout) {
    REQUIRE_GPU();
    const Case c{4, 2048, 128, WireDtype::Fp8Fp32, true, 41};
    Rng rng(c.seed);
    const Placement p = make_placement_for(c, rng);
    const std::vector<RankInput> in = make_inputs(c, p, rng);
    const Experts ex = make_experts(rng, p.num_experts);
    const std::vector<HostRank> h = host_pipeline(p, in, c.H, c.dtype, ex);
    const DeviceResult d = run_device(p, in, c.H, c.dtype, ex, Run::Throughput, 1, max_expert_rows(h));
    const size_t rb = record_bytes(c.H, kTopK, c.dtype);
    size_t want_remote = 0;
    for (int32_t s = 0; s < c.R; ++s) {
        size_t sent = 0;
        for (int32_t t = 0; t < c.R; ++t) {
            EXPECT_EQ(d.count_matrix[0][s * c.R + t], h[s].layout.count[t]);
            // FP8 records out to t, bf16 partials back to t for the records t sent here.
            if (t != s) sent += h[s].layout.count[t] * rb + h[t].layout.count[s] * c.H * 2;
        }
        EXPECT_EQ(d.bytes_sent[s], sent) << "rank " << s;
        want_remote += sent;
    }
    // The simulated wire also carried the count all-gather.
    EXPECT_EQ(d.sim_remote_bytes, want_remote + size_t(c.R) * (c.R - 1) * c.R * sizeof(int64_t));
}
}  // namespace
