// The EP layout, pack and quantise kernels on one GPU against the host reference ft/ep.hpp, bit
// for bit, for every case of cases(), and the quantiser at its edge values. Skips without a GPU.
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
}  // namespace
