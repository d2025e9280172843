// The EP kernels and EpRank on one GPU against the host reference ft/ep.hpp, bit for bit, with
// R = 2..8 ranks simulated by the device-copy transport double (sim_transport.hpp): layout, pack +
// quantise, the received records, expert grouping, unpack, local reduction and combine; tokens
// that encode (source, index) arrive exactly once where they should; the output equals a
// single-device MoE within the FP8 tolerance; and it is bit-identical across chunk counts,
// throughput vs latency mode, and eager vs CUDA-graph replay. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "ep_traces.hpp"
#include "freetoken_ep.h"
#include "ep_toy_expert.cuh"
#include "ft/common.hpp"
#include "ft/cuda_device.hpp"
#include "ft/ep.hpp"
#include "ft/ep_cuda.hpp"
#include "ep_sim_reference.cuh"
#include "sim_transport.hpp"

namespace {

using namespace ft::ep;
using ft::bf16_to_f32;
using ft::f32_to_bf16;
using ft::test::DeviceArray;
using ft::test::fetch;
using ft::test::Rng;
using namespace ft::test;
namespace epc = ft::ep::cuda;

#define REQUIRE_GPU()                                              \
    do {                                                           \
        if (ft::cuda::device_count() == 0) GTEST_SKIP() << "no GPU"; \
    } while (0)

// ---- the device pipeline ---------------------------------------------------------------------

enum class Run { Throughput, LatencyThreaded, LatencyOneThread, LatencyGraph };

struct DeviceRank {
    DeviceArray<int32_t> ids;
    DeviceArray<float> weights;
    DeviceArray<uint16_t> x, out;
    DeviceArray<int32_t> phy2log;
    DeviceArray<float> a, b;
};

struct DeviceResult {
    std::vector<std::vector<uint16_t>> out;
    // Throughput with one chunk only: what each rank received and computed.
    std::vector<std::vector<uint8_t>> received;
    std::vector<std::vector<int64_t>> expert_offset, row_position;
    std::vector<std::vector<int32_t>> row_route, row_source, row_token;
    std::vector<std::vector<uint16_t>> x_rows, partials;
    std::vector<int32_t> chunks;
    std::vector<std::vector<int64_t>> count_matrix;
    size_t sim_remote_bytes = 0;
    std::vector<size_t> bytes_sent;
};

DeviceResult run_device(const Placement &p, const std::vector<RankInput> &in, int64_t H, WireDtype dtype,
                        const Experts &ex, Run run, int32_t chunks, int64_t max_rows,
                        const std::vector<RankInput> *graph_capture_inputs = nullptr) {
    const int32_t R = p.num_ranks, S = p.slots_per_rank;
    int64_t T = 1;
    for (const RankInput &ri : in) T = std::max(T, ri.tokens);
    const bool threaded = run == Run::Throughput || run == Run::LatencyThreaded;
    ft::test::SimHub hub(R, threaded);
    std::vector<std::unique_ptr<ft::test::SimTransport>> net;
    std::vector<std::unique_ptr<epc::EpRank>> ranks;
    std::vector<DeviceRank> dev(R);
    epc::EpConfig cfg;
    cfg.top_k = kTopK;
    cfg.hidden = H;
    cfg.max_tokens = T;
    cfg.dispatch_dtype = dtype;
    cfg.mode = run == Run::Throughput ? epc::Mode::Throughput : epc::Mode::Latency;
    cfg.chunks = chunks;
    cfg.max_expert_rows = max_rows;
    for (int32_t r = 0; r < R; ++r) {
        net.push_back(std::make_unique<ft::test::SimTransport>(hub, r));
        ranks.push_back(std::make_unique<epc::EpRank>(*net[r], p, cfg));
        const std::vector<RankInput> &src = graph_capture_inputs ? *graph_capture_inputs : in;
        dev[r].ids = DeviceArray<int32_t>(src[r].ids);
        dev[r].weights = DeviceArray<float>(src[r].weights);
        dev[r].x = DeviceArray<uint16_t>(src[r].x);
        dev[r].out = DeviceArray<uint16_t>(std::max<size_t>(in[r].x.size(), 1));
        dev[r].phy2log = DeviceArray<int32_t>(std::vector<int32_t>(p.phy2log.begin() + r * S, p.phy2log.begin() + (r + 1) * S));
        dev[r].a = DeviceArray<float>(ex.a);
        dev[r].b = DeviceArray<float>(ex.b);
    }
    auto expert = [&](int32_t r) { return ft::test::toy_expert(dev[r].phy2log.ptr, dev[r].a.ptr, dev[r].b.ptr); };
    auto tokens = [&](int32_t r) { return (graph_capture_inputs ? *graph_capture_inputs : in)[r].tokens; };

    if (threaded) {
        std::vector<std::string> errors(R);
        std::vector<std::thread> threads;
        for (int32_t r = 0; r < R; ++r)
            threads.emplace_back([&, r] {
                try {
                    cudaStream_t st;
                    ft::test::cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
                    ranks[r]->forward(dev[r].ids.ptr, dev[r].weights.ptr, dev[r].x.ptr, tokens(r), expert(r),
                                      dev[r].out.ptr, st);
                    ft::test::cuda_ok(cudaStreamSynchronize(st), "sync");
                    cudaStreamDestroy(st);
                } catch (const std::exception &e) {
                    errors[r] = e.what();
                    hub.abort(ft::cat("rank ", r, " failed: ", e.what()));
                }
            });
        for (std::thread &t : threads) t.join();
        for (int32_t r = 0; r < R; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
    } else {
        cudaStream_t st;
        ft::test::cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
        auto step = [&] {
            for (int32_t r = 0; r < R; ++r)
                ranks[r]->dispatch_send(dev[r].ids.ptr, dev[r].weights.ptr, dev[r].x.ptr, tokens(r), st);
            for (int32_t r = 0; r < R; ++r) {
                ranks[r]->dispatch_recv(st);
                expert(r)(ranks[r]->batch(), st);
                ranks[r]->combine_send(st);
            }
            for (int32_t r = 0; r < R; ++r) ranks[r]->combine_recv(dev[r].out.ptr, st);
        };
        if (run == Run::LatencyGraph) {
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            ft::test::cuda_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
            step();
            ft::test::cuda_ok(cudaStreamEndCapture(st, &graph), "end capture");
            ft::test::cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
            // Captured on other inputs: the replay must read the buffers' current contents.
            for (int32_t r = 0; r < R; ++r) {
                dev[r].ids.upload(in[r].ids);
                dev[r].weights.upload(in[r].weights);
                dev[r].x.upload(in[r].x);
            }
            ft::test::cuda_ok(cudaGraphLaunch(exec, st), "replay");
            ft::test::cuda_ok(cudaStreamSynchronize(st), "sync");
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        } else {
            step();
            ft::test::cuda_ok(cudaStreamSynchronize(st), "sync");
        }
        cudaStreamDestroy(st);
    }
    ft::test::cuda_ok(cudaDeviceSynchronize(), "EP step");

    DeviceResult res;
    res.sim_remote_bytes = hub.remote_bytes();
    for (int32_t r = 0; r < R; ++r) {
        res.out.push_back(dev[r].out.download(in[r].x.size()));
        res.chunks.push_back(ranks[r]->last_chunks());
        res.bytes_sent.push_back(ranks[r]->last_bytes_sent());
        EXPECT_FALSE(ranks[r]->overflowed(nullptr)) << "rank " << r;
        if (run != Run::Throughput) continue;
        res.count_matrix.push_back(ranks[r]->last_count_matrix());
        const epc::ReceiveBuffers &B = ranks[r]->receive();
        const std::vector<int64_t> counts = fetch(B.count, R);
        int64_t n = 0;
        for (int64_t c : counts) n += c;
        const size_t rb = record_bytes(H, kTopK, dtype);
        res.received.push_back(fetch(ranks[r]->recv_region().base, n * rb));
        res.expert_offset.push_back(fetch(B.expert_offset, S + 1));
        const int64_t rows = res.expert_offset.back()[S];
        res.row_position.push_back(fetch(B.row_position, rows));
        res.row_route.push_back(fetch(B.row_route, rows));
        res.row_source.push_back(fetch(B.row_source, rows));
        res.row_token.push_back(fetch(B.row_token, rows));
        res.x_rows.push_back(fetch(ranks[r]->batch().x, rows * H));
        res.partials.push_back(fetch(ranks[r]->partials(), n * H));
    }
    return res;
}

std::vector<Case> cases() {
    std::vector<Case> c;
    uint64_t seed = 100;
    // Every R of 2..8, both hidden sizes, tokens 1, 7, 64 and 4096 (the largest only at the smaller
    // shape: the scalar host reference is the slow part), every wire dtype, with and without replicas.
    const WireDtype dt[3] = {WireDtype::Fp8Fp32, WireDtype::Fp8Ue8m0, WireDtype::Bf16};
    int i = 0;
    for (int32_t R = 2; R <= 8; ++R)
        for (int64_t T : {1, 7, 64}) {
            c.push_back({R, 2048, T, dt[i % 3], (i % 2) == 1, seed++});
            ++i;
        }
    for (int32_t R : {2, 5, 8}) c.push_back({R, 7168, 7, dt[i++ % 3], R == 5, seed++});
    c.push_back({4, 7168, 64, WireDtype::Fp8Fp32, true, seed++});
    c.push_back({2, 2048, 4096, WireDtype::Fp8Fp32, false, seed++});
    c.push_back({4, 2048, 4096, WireDtype::Fp8Ue8m0, true, seed++});
    // The one-block decode kernels' bounds (kernels_layout.cu, kernels_group.cu): rank 0 has
    // 512 * 8 = 4096 routes (the layout bound, still one block) or 513 * 8 (the chain), and
    // R * T * 8 = 8192 positions * top-k
    // (the group bound) or 8208.
    c.push_back({2, 2048, 512, WireDtype::Fp8Ue8m0, true, seed++});
    c.push_back({2, 2048, 513, WireDtype::Fp8Fp32, true, seed++});
    return c;
}

// ---- layout and pack kernels against the host -------------------------------------------------

TEST(EpCudaKernels, LayoutAndPackMatchHostBitForBit) {
    REQUIRE_GPU();
    std::vector<Case> all = cases();
    all.push_back({3, 7168, 4096, WireDtype::Fp8Fp32, true, 90});  // prefill size at the large shape
    for (const Case &c : all) {
        SCOPED_TRACE(name(c));
        Rng rng(c.seed);
        const Placement p = make_placement_for(c, rng);
        const std::vector<RankInput> in = make_inputs(c, p, rng);
        const int32_t R = c.R, S = p.slots_per_rank, K = kTopK;
        epc::PlacementBuffer dp(p);
        for (int32_t r = 0; r < R; ++r) {
            const RankInput &ri = in[r];
            const int64_t T = std::max<int64_t>(ri.tokens, 1);
            const DispatchLayout hl = dispatch_layout(p, ri.ids.data(), ri.weights.data(), ri.tokens, K, r);
            DeviceArray<uint8_t> lmem(epc::layout_bytes(R, S, K, T));
            const epc::LayoutBuffers L = epc::carve_layout(lmem.ptr, R, S, K, T);
            DeviceArray<int32_t> ids(ri.ids);
            DeviceArray<float> w(ri.weights);
            DeviceArray<uint16_t> x(ri.x);
            epc::launch_layout(dp.view(), ids.ptr, w.ptr, ri.tokens, K, r, nullptr, L, nullptr);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const int64_t rows = hl.offset[R];
            EXPECT_EQ(fetch(L.route_phy, ri.tokens * K), hl.route_phy);
            EXPECT_EQ(fetch(L.row, R * ri.tokens), hl.row);
            EXPECT_EQ(fetch(L.count, R), hl.count);
            EXPECT_EQ(fetch(L.offset, R + 1), hl.offset);
            EXPECT_EQ(fetch(L.expert_count, R * S), hl.expert_count);
            EXPECT_EQ(fetch(L.send_token, rows), hl.send_token);
            EXPECT_EQ(fetch(L.send_n, rows), hl.send_n);
            EXPECT_EQ(fetch(L.send_slot, rows * K), hl.send_slot);
            EXPECT_EQ(fetch(L.send_weight, rows * K), hl.send_weight);

            // Pack into one buffer (throughput) and into per-peer regions with headers (latency).
            const RecordLayout RL = record_layout(c.H, K, c.dtype);
            std::vector<uint8_t> want(RL.bytes * rows);
            pack_dispatch(hl, ri.x.data(), c.H, c.dtype, want.data());
            DeviceArray<uint8_t> flat(RL.bytes * R * T);
            epc::launch_pack(L, R * T, x.ptr, c.H, c.dtype, r, {flat.ptr, 0}, nullptr);
            const size_t peer = epc::latency_peer_bytes(c.H, K, c.dtype, T);
            DeviceArray<uint8_t> regions(peer * R);
            epc::launch_pack(L, R * T, x.ptr, c.H, c.dtype, r, {regions.ptr, peer}, nullptr);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            EXPECT_TRUE(flat.download(want.size()) == want) << "rank " << r << ": packed records differ";
            const std::vector<uint8_t> reg = regions.download(peer * R);
            for (int32_t d = 0; d < R; ++d) {
                int64_t header[2];
                std::memcpy(header, reg.data() + d * peer, sizeof header);
                EXPECT_EQ(header[0], hl.count[d]);
                EXPECT_EQ(header[1], 0);
                EXPECT_EQ(0, std::memcmp(reg.data() + d * peer + epc::kPeerHeaderBytes, want.data() + RL.bytes * hl.offset[d],
                                         RL.bytes * hl.count[d]))
                    << "rank " << r << " region " << d;
            }
        }
    }
}

// FP8 edge values through the pack kernel: zeros, tiny, huge, +-Inf and NaN in one row.
TEST(EpCudaKernels, QuantiserEdgeValuesMatchHost) {
    REQUIRE_GPU();
    const int64_t H = 512;
    const Placement p = contiguous_placement(2, 2);
    std::vector<int32_t> ids = {0, 1};
    std::vector<float> w = {0.5f, 0.25f};
    std::vector<uint16_t> x(H);
    Rng rng(7);
    for (int64_t h = 0; h < H; ++h) x[h] = static_cast<uint16_t>(rng.bits());  // every bf16 pattern, NaNs included
    for (int64_t h = 128; h < 256; ++h) x[h] = 0;                                  // an all-zero block
    x[300] = 0x7f80;                                                               // +Inf
    x[301] = 0xff80;                                                               // -Inf
    x[302] = 0x7fc1;                                                               // NaN
    for (int64_t h = 384; h < 512; ++h) x[h] = static_cast<uint16_t>(h & 1 ? 0x0001 : 0x8003);  // subnormals
    epc::PlacementBuffer dp(p);
    for (WireDtype dtype : {WireDtype::Fp8Fp32, WireDtype::Fp8Ue8m0, WireDtype::Bf16}) {
        const DispatchLayout hl = dispatch_layout(p, ids.data(), w.data(), 1, 2, 0);
        const RecordLayout RL = record_layout(H, 2, dtype);
        std::vector<uint8_t> want(RL.bytes * hl.offset[2]);
        pack_dispatch(hl, x.data(), H, dtype, want.data());
        DeviceArray<uint8_t> lmem(epc::layout_bytes(2, 1, 2, 1));
        const epc::LayoutBuffers L = epc::carve_layout(lmem.ptr, 2, 1, 2, 1);
        DeviceArray<int32_t> di(ids);
        DeviceArray<float> dw(w);
        DeviceArray<uint16_t> dx(x);
        DeviceArray<uint8_t> out(RL.bytes * 2);
        epc::launch_layout(dp.view(), di.ptr, dw.ptr, 1, 2, 0, nullptr, L, nullptr);
        epc::launch_pack(L, 2, dx.ptr, H, dtype, 0, {out.ptr, 0}, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_TRUE(out.download(want.size()) == want) << "dtype " << static_cast<int>(dtype);
    }
}

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

// ---- the C API on a one-rank group (NCCL with a single GPU) -----------------------------------

struct CExpert {
    const int32_t *phy2log;
    const float *a, *b;
};

void c_expert(const ft_ep_expert_batch *batch, void *stream, void *user) {
    const CExpert *e = static_cast<const CExpert *>(user);
    epc::ExpertBatch b;
    b.slots = batch->slots;
    b.hidden = batch->hidden;
    b.max_rows = batch->max_rows;
    b.offset = batch->offset;
    b.x = batch->x;
    b.y = batch->y;
    ft::test::toy_expert(e->phy2log, e->a, e->b)(b, static_cast<cudaStream_t>(stream));
}

TEST(EpCudaCApi, OneRankGroupMatchesHost) {
    REQUIRE_GPU();
    std::string why;
    if (!epc::NcclTransport::available(&why)) GTEST_SKIP() << why;
    const Case c{1, 256, 40, WireDtype::Fp8Fp32, false, 51};
    Rng rng(c.seed);
    const Placement p = contiguous_placement(16, 1);
    std::vector<RankInput> in = make_inputs(c, p, rng);
    const Experts ex = make_experts(rng, p.num_experts);
    const std::vector<HostRank> h = host_pipeline(p, in, c.H, c.dtype, ex);
    DeviceArray<int32_t> ids(in[0].ids), phy2log(p.phy2log);
    DeviceArray<float> w(in[0].weights), a(ex.a), b(ex.b);
    DeviceArray<uint16_t> x(in[0].x), out(in[0].x.size());
    CExpert ce{phy2log.ptr, a.ptr, b.ptr};
    for (int32_t mode : {FT_EP_MODE_THROUGHPUT, FT_EP_MODE_LATENCY}) {
        ft_ep_params prm;
        ft_ep_params_init(&prm);
        prm.num_experts = 16;
        prm.top_k = kTopK;
        prm.hidden = c.H;
        prm.max_tokens = 64;
        prm.mode = mode;
        ft_ep_group *g = nullptr;
        char err[256];
        const int32_t dev = 0;
        ASSERT_EQ(ft_ep_group_bootstrap_local(1, &dev, &prm, &g, err, sizeof err), FT_OK) << err;
        ft_ep_group_info info;
        info.struct_size = sizeof info;
        ASSERT_EQ(ft_ep_group_info_get(g, &info), FT_OK);
        EXPECT_EQ(info.ranks, 1);
        EXPECT_EQ(info.slots_per_rank, 16);
        std::vector<int32_t> map(16);
        size_t n = 0;
        ASSERT_EQ(ft_ep_group_get_placement(g, map.data(), map.size(), &n), FT_OK);
        EXPECT_EQ(n, 16u);
        EXPECT_EQ(map, p.phy2log);
        EXPECT_EQ(ft_ep_group_set_placement(g, map.data(), 3), FT_ERR_INVALID_ARGUMENT);
        EXPECT_STRNE(ft_ep_group_last_error(g), "");
        ASSERT_EQ(ft_ep_group_set_placement(g, map.data(), map.size()), FT_OK);

        ASSERT_EQ(ft_ep_forward(g, ids.ptr, w.ptr, x.ptr, in[0].tokens, c_expert, &ce, out.ptr, nullptr), FT_OK)
            << ft_ep_group_last_error(g);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_TRUE(out.download(in[0].x.size()) == h[0].out) << "forward, mode " << mode;

        cudaMemset(out.ptr, 0, in[0].x.size() * 2);
        ft_ep_expert_batch batch;
        batch.struct_size = sizeof batch;
        ASSERT_EQ(ft_ep_dispatch(g, ids.ptr, w.ptr, x.ptr, in[0].tokens, nullptr, &batch), FT_OK) << ft_ep_group_last_error(g);
        c_expert(&batch, nullptr, &ce);
        ASSERT_EQ(ft_ep_combine(g, out.ptr, nullptr), FT_OK) << ft_ep_group_last_error(g);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_TRUE(out.download(in[0].x.size()) == h[0].out) << "dispatch + combine, mode " << mode;
        EXPECT_EQ(ft_ep_dispatch(g, ids.ptr, w.ptr, x.ptr, 65, nullptr, nullptr), FT_ERR_INVALID_ARGUMENT);
        ft_ep_group_free(g);
    }
    ft_ep_group_free(nullptr);
}

}  // namespace
