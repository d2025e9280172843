// The optional FP8 combine wire (issue 7 item 2) on one GPU, ranks simulated by the device-copy
// transport (sim_transport.hpp): the output equals the host reference (host_pipeline with an FP8
// combine) bit for bit across chunk counts, repeated calls and the split dispatch/combine form,
// and the bf16-combine output within the FP8 bound; bytes on the wire shrink by the row ratio; the
// accuracy gate trips on every rank in the call after the one that exceeded it, for good, after
// which the output is the bf16 path's bit for bit; latency mode refuses an FP8 combine.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <thread>

#include "ep_traces.hpp"
#include "ep_toy_expert.cuh"
#include "ep_sim_reference.cuh"
#include "freetoken_ep.h"
#include "ft/common.hpp"
#include "ft/cuda_device.hpp"
#include "ft/ep.hpp"
#include "ft/ep_cuda.hpp"
#include "sim_transport.hpp"

namespace {

using namespace ft::ep;
using namespace ft::test;
using ft::bf16_to_f32;
using ft::f32_to_bf16;
namespace epc = ft::ep::cuda;

#define REQUIRE_GPU()                                                \
    do {                                                             \
        if (ft::cuda::device_count() == 0) GTEST_SKIP() << "no GPU"; \
    } while (0)

struct CallState {
    std::vector<std::vector<uint16_t>> out;  // [rank]
    std::vector<size_t> bytes_sent;          // [rank]
    std::vector<WireDtype> wire_after;       // [rank] combine_dtype() after the call
    std::vector<float> last_error;           // [rank] combine_last_rel_error() after the call
    std::vector<int> tripped;                // [rank]
};

struct Fp8Run {
    std::vector<CallState> calls;
    size_t sim_remote_bytes = 0;  // all calls together
};

// calls[i] are the inputs of call i (every call the same shapes or not); one host thread per
// rank, throughput mode. split: dispatch + experts + combine instead of forward.
Fp8Run run_calls(const Placement &p, const std::vector<std::vector<RankInput>> &calls, int64_t H, WireDtype dispatch,
                 WireDtype combine, float limit, const Experts &ex, int32_t chunks, int64_t max_rows,
                 bool split = false) {
    const int32_t R = p.num_ranks, S = p.slots_per_rank;
    int64_t T = 1;
    for (const auto &in : calls)
        for (const RankInput &ri : in) T = std::max(T, ri.tokens);
    SimHub hub(R, true);
    epc::EpConfig cfg;
    cfg.top_k = kTopK;
    cfg.hidden = H;
    cfg.max_tokens = T;
    cfg.dispatch_dtype = dispatch;
    cfg.combine_dtype = combine;
    cfg.combine_max_rel_error = limit;
    cfg.mode = epc::Mode::Throughput;
    cfg.chunks = chunks;
    cfg.max_expert_rows = max_rows;
    std::vector<std::unique_ptr<SimTransport>> net;
    std::vector<std::unique_ptr<epc::EpRank>> ranks;
    for (int32_t r = 0; r < R; ++r) {
        net.push_back(std::make_unique<SimTransport>(hub, r));
        ranks.push_back(std::make_unique<epc::EpRank>(*net[r], p, cfg));
    }
    Fp8Run res;
    res.calls.resize(calls.size());
    for (CallState &c : res.calls) {
        c.out.resize(R);
        c.bytes_sent.resize(R);
        c.wire_after.resize(R);
        c.last_error.resize(R);
        c.tripped.resize(R);
    }
    // Every device array is made here, before the rank threads start (no cudaMalloc/cudaFree,
    // which synchronise the device, while other ranks are mid-step).
    struct CallArrays {
        DeviceArray<int32_t> ids;
        DeviceArray<float> w;
        DeviceArray<uint16_t> x, out;
    };
    struct RankArrays {
        DeviceArray<int32_t> phy2log;
        DeviceArray<float> a, b;
        std::vector<CallArrays> call;
    };
    std::vector<RankArrays> dev(R);
    for (int32_t r = 0; r < R; ++r) {
        dev[r].phy2log =
            DeviceArray<int32_t>(std::vector<int32_t>(p.phy2log.begin() + r * S, p.phy2log.begin() + (r + 1) * S));
        dev[r].a = DeviceArray<float>(ex.a);
        dev[r].b = DeviceArray<float>(ex.b);
        for (const auto &in : calls) {
            CallArrays c;
            c.ids = DeviceArray<int32_t>(in[r].ids);
            c.w = DeviceArray<float>(in[r].weights);
            c.x = DeviceArray<uint16_t>(in[r].x);
            c.out = DeviceArray<uint16_t>(std::max<size_t>(in[r].x.size(), 1));
            dev[r].call.push_back(std::move(c));
        }
    }
    std::vector<cudaStream_t> streams(R);
    for (cudaStream_t &st : streams) cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    std::vector<std::string> errors(R);
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < R; ++r)
        threads.emplace_back([&, r] {
            try {
                const cudaStream_t st = streams[r];
                const epc::ExpertFn expert = toy_expert(dev[r].phy2log.ptr, dev[r].a.ptr, dev[r].b.ptr);
                for (size_t i = 0; i < calls.size(); ++i) {
                    const RankInput &ri = calls[i][r];
                    CallArrays &a = dev[r].call[i];
                    if (split) {
                        ranks[r]->dispatch(a.ids.ptr, a.w.ptr, a.x.ptr, ri.tokens, st);
                        expert(ranks[r]->batch(), st);
                        ranks[r]->combine(a.out.ptr, st);
                    } else {
                        ranks[r]->forward(a.ids.ptr, a.w.ptr, a.x.ptr, ri.tokens, expert, a.out.ptr, st);
                    }
                    cuda_ok(cudaStreamSynchronize(st), "sync");
                    CallState &c = res.calls[i];
                    c.out[r] = a.out.download(ri.x.size());
                    c.bytes_sent[r] = ranks[r]->last_bytes_sent();
                    c.wire_after[r] = ranks[r]->combine_dtype();
                    c.last_error[r] = ranks[r]->combine_last_rel_error();
                    c.tripped[r] = ranks[r]->combine_gate_tripped();
                    if (ranks[r]->overflowed(st)) throw std::runtime_error("expert rows overflowed");
                }
            } catch (const std::exception &e) {
                errors[r] = e.what();
                hub.abort(ft::cat("rank ", r, " failed: ", e.what()));
            }
        });
    for (std::thread &t : threads) t.join();
    cuda_ok(cudaDeviceSynchronize(), "EP calls");
    for (cudaStream_t st : streams) cudaStreamDestroy(st);
    for (int32_t r = 0; r < R; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
    res.sim_remote_bytes = hub.remote_bytes();
    return res;
}

double largest(const std::vector<HostRank> &h) {
    double m = 0;
    for (const HostRank &r : h) m = std::max(m, r.combine_max_error);
    return m;
}

// |fp8 - bf16| per element <= the FP8 error of every remote partial added (half an e4m3 ulp,
// 2^-4 relative, plus the subnormal floor s 2^-10 of its block, plus one fp32 rounding of the
// decoded product) + one bf16 rounding of each output (2^-8 relative) + fp32 sum roundings.
// Counts the elements outside it.
int64_t outside_fp8_bound(const Placement &p, const std::vector<RankInput> &in, const std::vector<HostRank> &h,
                          int64_t H, int32_t src, const std::vector<uint16_t> &fp8, const std::vector<uint16_t> &bf16) {
    const int32_t R = p.num_ranks;
    // The partials rank d returned to src, in src's layout row order (records of s start at the
    // sum of counts of sources < s on d).
    std::vector<int64_t> first(R, 0);
    for (int32_t d = 0; d < R; ++d)
        for (int32_t s = 0; s < src; ++s) first[d] += h[s].layout.count[d];
    const ScaleFormat fmt = ScaleFormat::Fp32;
    int64_t bad = 0;
    std::vector<uint8_t> q(H), scales(fp8_scale_bytes(H, fmt));
    const int64_t T = in[src].tokens;
    for (int64_t t = 0; t < T; ++t) {
        std::vector<double> tol(H, 0.0), mag(H, 0.0);
        for (int32_t d = 0; d < R; ++d) {
            const int32_t row = h[src].layout.row[static_cast<size_t>(d) * T + t];
            if (row < 0) continue;
            const uint16_t *part = h[d].partials.data() + (first[d] + row) * H;
            for (int64_t k = 0; k < H; ++k) mag[k] += std::fabs(bf16_to_f32(part[k]));
            if (d == src) continue;
            quantize_fp8_row(part, H, fmt, q.data(), scales.data());  // fp32 scales >= e8m0's / 2
            for (int64_t k = 0; k < H; ++k) {
                const double v = std::fabs(bf16_to_f32(part[k]));
                // e8m0 scales are up to 2x the fp32 ones: bound with 2 s.
                tol[k] += v / 16 + 2 * fp8_block_scale(scales.data(), k / kWireBlock, fmt) * 0x1p-10 + v * 0x1p-23;
            }
        }
        for (int64_t k = 0; k < H; ++k) {
            const double a = bf16_to_f32(fp8[t * H + k]), b = bf16_to_f32(bf16[t * H + k]);
            const double bound =
                1.01 * tol[k] + 0x1p-8 * (std::fabs(a) + std::fabs(b)) + R * 0x1p-23 * (mag[k] + tol[k]);
            if (!(std::fabs(a - b) <= bound)) ++bad;
        }
    }
    return bad;
}

// ---- correctness --------------------------------------------------------------------------------

TEST(EpCombineFp8Sim, MatchesHostBitForBitAcrossChunksRepeatsAndSplitForm) {
    REQUIRE_GPU();
    const Case cs[] = {{2, 2048, 64, WireDtype::Fp8Fp32, false, 201},
                       {3, 2048, 300, WireDtype::Fp8Ue8m0, true, 202},
                       {5, 2048, 40, WireDtype::Fp8Fp32, true, 203},
                       {8, 7168, 16, WireDtype::Fp8Fp32, false, 204}};
    for (const Case &c : cs)
        for (WireDtype comb : {WireDtype::Fp8Fp32, WireDtype::Fp8Ue8m0}) {
            SCOPED_TRACE(ft::cat(name(c), " combine ", static_cast<int>(comb)));
            Rng rng(c.seed);
            const Placement p = make_placement_for(c, rng);
            const std::vector<RankInput> in = make_inputs(c, p, rng);
            const Experts ex = make_experts(rng, p.num_experts);
            const std::vector<HostRank> h = host_pipeline(p, in, c.H, c.dtype, ex, comb);
            const std::vector<HostRank> hb = host_pipeline(p, in, c.H, c.dtype, ex);
            ASSERT_LT(largest(h), kCombineDefaultMaxRelError) << "these inputs must not trip the default gate";
            const int64_t rows = max_expert_rows(h);
            const std::vector<std::vector<RankInput>> twice = {in, in};
            const Fp8Run base = run_calls(p, twice, c.H, c.dtype, comb, kCombineDefaultMaxRelError, ex, 1, rows);
            for (int32_t r = 0; r < c.R; ++r) {
                SCOPED_TRACE(ft::cat("rank ", r));
                EXPECT_TRUE(base.calls[0].out[r] == h[r].out) << "FP8 combine differs from the host reference";
                EXPECT_TRUE(base.calls[1].out[r] == h[r].out) << "second call differs";
                EXPECT_EQ(base.calls[1].wire_after[r], comb);
                EXPECT_EQ(base.calls[1].tripped[r], 0);
                // The gate's measure: the host's in double, the device's in double in another order.
                EXPECT_NEAR(base.calls[1].last_error[r], h[r].combine_max_error, 1e-6 * h[r].combine_max_error + 1e-9);
                EXPECT_EQ(outside_fp8_bound(p, in, hb, c.H, r, base.calls[0].out[r], hb[r].out), 0)
                    << "FP8 combine is farther from the bf16 combine than the FP8 bound";
            }
            for (int32_t chunks : {2, 3}) {
                const Fp8Run d = run_calls(p, {in}, c.H, c.dtype, comb, kCombineDefaultMaxRelError, ex, chunks, rows);
                EXPECT_TRUE(d.calls[0].out == base.calls[0].out) << chunks << " chunks";
            }
            const Fp8Run sp = run_calls(p, {in}, c.H, c.dtype, comb, kCombineDefaultMaxRelError, ex, 0, rows, true);
            EXPECT_TRUE(sp.calls[0].out == base.calls[0].out) << "dispatch + combine";
        }
}

// Bytes: dispatch records out, and back per remote row combine_row_bytes instead of 2H; the
// simulated wire also carries the count all-gather, one more int64 per rank (the gate word).
TEST(EpCombineFp8Sim, BytesSentShrinkByTheRowRatio) {
    REQUIRE_GPU();
    const Case c{4, 2048, 128, WireDtype::Fp8Fp32, true, 211};
    Rng rng(c.seed);
    const Placement p = make_placement_for(c, rng);
    const std::vector<RankInput> in = make_inputs(c, p, rng);
    const Experts ex = make_experts(rng, p.num_experts);
    const std::vector<HostRank> h = host_pipeline(p, in, c.H, c.dtype, ex);
    const int64_t rows = max_expert_rows(h);
    const size_t rb = record_bytes(c.H, kTopK, c.dtype);
    for (WireDtype comb : {WireDtype::Bf16, WireDtype::Fp8Fp32, WireDtype::Fp8Ue8m0}) {
        SCOPED_TRACE(ft::cat("combine ", static_cast<int>(comb)));
        const size_t crb = combine_row_bytes(c.H, comb);
        const Fp8Run d = run_calls(p, {in}, c.H, c.dtype, comb, kCombineDefaultMaxRelError, ex, 2, rows);
        size_t want_remote = 0, combine_bytes = 0, combine_bf16 = 0;
        for (int32_t s = 0; s < c.R; ++s) {
            size_t sent = 0;
            for (int32_t t = 0; t < c.R; ++t)
                if (t != s) {
                    sent += h[s].layout.count[t] * rb + h[t].layout.count[s] * crb;
                    combine_bytes += h[t].layout.count[s] * crb;
                    combine_bf16 += h[t].layout.count[s] * c.H * 2;
                }
            EXPECT_EQ(d.calls[0].bytes_sent[s], sent) << "rank " << s;
            want_remote += sent;
        }
        const size_t words = c.R + (comb == WireDtype::Bf16 ? 0 : 1);
        EXPECT_EQ(d.sim_remote_bytes, want_remote + size_t(c.R) * (c.R - 1) * words * sizeof(int64_t));
        const double ratio = static_cast<double>(combine_bytes) / combine_bf16;
        EXPECT_DOUBLE_EQ(ratio, static_cast<double>(crb) / (2.0 * c.H));
        if (comb == WireDtype::Fp8Fp32) EXPECT_DOUBLE_EQ(ratio, (2048.0 + 64.0) / 4096.0);
        if (comb == WireDtype::Fp8Ue8m0) EXPECT_DOUBLE_EQ(ratio, (2048.0 + 16.0) / 4096.0);
    }
}

// ---- the accuracy gate ----------------------------------------------------------------------------

// A limit below e4m3's round-off: call 0 encodes (and exceeds it), every rank notices in call 1's
// count exchange and combines in bf16 from then on; call 1 and 2 equal the bf16 path bit for bit.
TEST(EpCombineFp8Sim, GateTripsEveryRankInTheNextCallForGood) {
    REQUIRE_GPU();
    for (const Case &c :
         {Case{4, 2048, 64, WireDtype::Fp8Fp32, true, 221}, Case{7, 2048, 20, WireDtype::Fp8Ue8m0, false, 222}}) {
        SCOPED_TRACE(name(c));
        Rng rng(c.seed);
        const Placement p = make_placement_for(c, rng);
        const std::vector<RankInput> in = make_inputs(c, p, rng);
        const Experts ex = make_experts(rng, p.num_experts);
        const std::vector<HostRank> h8 = host_pipeline(p, in, c.H, c.dtype, ex, WireDtype::Fp8Fp32);
        const std::vector<HostRank> hb = host_pipeline(p, in, c.H, c.dtype, ex);
        const int64_t rows = max_expert_rows(h8);
        const Fp8Run d = run_calls(p, {in, in, in}, c.H, c.dtype, WireDtype::Fp8Fp32, 1e-6f, ex, 0, rows);
        const Fp8Run plain = run_calls(p, {in}, c.H, c.dtype, WireDtype::Bf16, 1e-6f, ex, 0, rows);
        for (int32_t r = 0; r < c.R; ++r) {
            SCOPED_TRACE(ft::cat("rank ", r));
            EXPECT_TRUE(d.calls[0].out[r] == h8[r].out) << "call 0 is still FP8";
            EXPECT_EQ(d.calls[0].wire_after[r], WireDtype::Fp8Fp32) << "nobody can know before the next exchange";
            EXPECT_EQ(d.calls[0].tripped[r], 0);
            for (int i = 1; i < 3; ++i) {
                EXPECT_EQ(d.calls[i].wire_after[r], WireDtype::Bf16) << "call " << i;
                EXPECT_EQ(d.calls[i].tripped[r], 1) << "call " << i;
                EXPECT_TRUE(d.calls[i].out[r] == hb[r].out) << "call " << i << " is not the bf16 path";
                EXPECT_TRUE(d.calls[i].out[r] == plain.calls[0].out[r]) << "call " << i;
                EXPECT_EQ(d.calls[i].bytes_sent[r], plain.calls[0].bytes_sent[r]) << "call " << i;
                // The last FP8-encoded call stays call 0.
                EXPECT_EQ(d.calls[i].last_error[r], d.calls[0].last_error[r]);
            }
            if (h8[r].combine_max_error > 0) EXPECT_GT(d.calls[0].last_error[r], 1e-6f);
        }
    }
}

// Only the ranks that receive an Inf exceed the default gate (FP8 cannot carry Inf: the row's
// error is +Inf); all ranks still switch together, and a clean later call equals the bf16 path.
TEST(EpCombineFp8Sim, OneRanksNonFinitePartialSwitchesAllRanks) {
    REQUIRE_GPU();
    const Case c{6, 2048, 32, WireDtype::Bf16, false, 231};
    Rng rng(c.seed);
    const Placement p = make_placement_for(c, rng);
    const std::vector<RankInput> clean = make_inputs(c, p, rng);
    std::vector<RankInput> dirty = clean;
    dirty[0].x[5 * c.H + 77] = 0x7f80;  // +Inf in token 5 of rank 0
    // Positive experts and weights: every Inf stays +Inf (no Inf - Inf, whose NaN bits differ
    // between the host's and the GPU's arithmetic).
    Experts ex = make_experts(rng, p.num_experts);
    for (float &v : ex.a) v = std::fabs(v) + 0.01f;
    for (float &v : ex.b) v = std::fabs(v) + 0.01f;
    const std::vector<HostRank> h8 = host_pipeline(p, dirty, c.H, c.dtype, ex, WireDtype::Fp8Fp32);
    const std::vector<HostRank> hb = host_pipeline(p, clean, c.H, c.dtype, ex);
    int32_t over = 0;
    for (int32_t r = 0; r < c.R; ++r) over += h8[r].combine_max_error > kCombineDefaultMaxRelError;
    ASSERT_GE(over, 1);
    ASSERT_LT(over, c.R) << "the case should trip some ranks, not all";
    const int64_t rows = std::max(max_expert_rows(h8), max_expert_rows(hb));
    const Fp8Run d =
        run_calls(p, {dirty, clean}, c.H, c.dtype, WireDtype::Fp8Fp32, kCombineDefaultMaxRelError, ex, 0, rows);
    for (int32_t r = 0; r < c.R; ++r) {
        SCOPED_TRACE(ft::cat("rank ", r));
        EXPECT_TRUE(d.calls[0].out[r] == h8[r].out) << "call 0 (FP8, Inf saturated) differs from the host";
        if (h8[r].combine_max_error > kCombineDefaultMaxRelError) EXPECT_TRUE(std::isinf(d.calls[0].last_error[r]));
        EXPECT_EQ(d.calls[1].wire_after[r], WireDtype::Bf16);
        EXPECT_TRUE(d.calls[1].out[r] == hb[r].out) << "call 1 is not the bf16 path";
    }
}

// ---- configuration ------------------------------------------------------------------------------

TEST(EpCombineFp8Config, LatencyModeAndBadLimitsAreRefused) {
    REQUIRE_GPU();
    SimHub hub(2, true);
    SimTransport t0(hub, 0);
    const Placement p = contiguous_placement(4, 2);
    epc::EpConfig cfg;
    cfg.top_k = 2;
    cfg.hidden = 256;
    cfg.max_tokens = 8;
    cfg.combine_dtype = WireDtype::Fp8Fp32;
    cfg.mode = epc::Mode::Latency;
    try {
        epc::EpRank r(t0, p, cfg);
        ADD_FAILURE() << "latency mode accepted an FP8 combine";
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find("throughput"), std::string::npos) << e.what();
    }
    cfg.mode = epc::Mode::Throughput;
    for (float bad : {0.0f, -0.1f, NAN, INFINITY}) {
        cfg.combine_max_rel_error = bad;
        try {
            epc::EpRank r(t0, p, cfg);
            ADD_FAILURE() << "limit " << bad << " accepted";
        } catch (const ft::Error &e) {
            EXPECT_EQ(e.status(), FT_ERR_INVALID_ARGUMENT);
        }
    }
}

// The C API on a one-rank group: the new fields' defaults and an old caller's struct, the
// latency-mode refusal before any collective, and FP8 combine on one rank (nothing remote, so
// nothing encoded: the output is the host's bf16 path and the error stays 0).
TEST(EpCombineFp8Config, CApiOneRank) {
    REQUIRE_GPU();
    std::string why;
    if (!epc::NcclTransport::available(&why)) GTEST_SKIP() << why;
    const Case c{1, 256, 40, WireDtype::Fp8Fp32, false, 241};
    Rng rng(c.seed);
    const Placement p = contiguous_placement(16, 1);
    const std::vector<RankInput> in = make_inputs(c, p, rng);
    const Experts ex = make_experts(rng, p.num_experts);
    const std::vector<HostRank> h = host_pipeline(p, in, c.H, c.dtype, ex);
    DeviceArray<int32_t> ids(in[0].ids), phy2log(p.phy2log);
    DeviceArray<float> w(in[0].weights), a(ex.a), b(ex.b);
    DeviceArray<uint16_t> x(in[0].x), out(in[0].x.size());
    ft_ep_params prm;
    ft_ep_params_init(&prm);
    EXPECT_EQ(prm.combine_wire, FT_EP_WIRE_BF16);
    EXPECT_EQ(prm.combine_max_rel_error, kCombineDefaultMaxRelError);
    prm.num_experts = 16;
    prm.top_k = kTopK;
    prm.hidden = c.H;
    prm.max_tokens = 64;
    const int32_t dev = 0;
    char err[512];
    ft_ep_group *g = nullptr;

    prm.mode = FT_EP_MODE_LATENCY;
    prm.combine_wire = FT_EP_WIRE_FP8;
    EXPECT_EQ(ft_ep_group_bootstrap_local(1, &dev, &prm, &g, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(g, nullptr);
    EXPECT_NE(std::string(err).find("THROUGHPUT"), std::string::npos) << err;
    prm.mode = FT_EP_MODE_THROUGHPUT;
    prm.combine_max_rel_error = 0.0f;
    EXPECT_EQ(ft_ep_group_bootstrap_local(1, &dev, &prm, &g, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    prm.combine_max_rel_error = 0.05f;
    prm.combine_wire = 7;
    EXPECT_EQ(ft_ep_group_bootstrap_local(1, &dev, &prm, &g, err, sizeof err), FT_ERR_INVALID_ARGUMENT);

    // An old caller: struct_size ends before combine_wire, garbage after it is ignored.
    ft_ep_params old = prm;
    old.struct_size = offsetof(ft_ep_params, combine_wire);
    old.combine_wire = 99;
    old.combine_max_rel_error = -1.0f;
    ASSERT_EQ(ft_ep_group_bootstrap_local(1, &dev, &old, &g, err, sizeof err), FT_OK) << err;
    ft_ep_group_info info;
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_ep_group_info_get(g, &info), FT_OK);
    EXPECT_EQ(info.combine_wire, FT_EP_WIRE_BF16);
    EXPECT_EQ(info.combine_last_rel_error, 0.0f);
    ft_ep_group_free(g);

    prm.combine_wire = FT_EP_WIRE_FP8_UE8M0;
    ASSERT_EQ(ft_ep_group_bootstrap_local(1, &dev, &prm, &g, err, sizeof err), FT_OK) << err;
    struct CE {
        const int32_t *phy2log;
        const float *a, *b;
    } ce{phy2log.ptr, a.ptr, b.ptr};
    const ft_ep_expert_fn fn = [](const ft_ep_expert_batch *batch, void *stream, void *user) {
        const CE *e = static_cast<const CE *>(user);
        epc::ExpertBatch bb;
        bb.slots = batch->slots;
        bb.hidden = batch->hidden;
        bb.max_rows = batch->max_rows;
        bb.offset = batch->offset;
        bb.x = batch->x;
        bb.y = batch->y;
        toy_expert(e->phy2log, e->a, e->b)(bb, static_cast<cudaStream_t>(stream));
    };
    ASSERT_EQ(ft_ep_forward(g, ids.ptr, w.ptr, x.ptr, in[0].tokens, fn, &ce, out.ptr, nullptr), FT_OK)
        << ft_ep_group_last_error(g);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(out.download(in[0].x.size()) == h[0].out);
    ASSERT_EQ(ft_ep_group_info_get(g, &info), FT_OK);
    EXPECT_EQ(info.combine_wire, FT_EP_WIRE_FP8_UE8M0);
    EXPECT_EQ(info.combine_last_rel_error, 0.0f);
    EXPECT_EQ(info.last_bytes_sent, 0u);
    ft_ep_group_free(g);
}

}  // namespace
