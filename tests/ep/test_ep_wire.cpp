// FP8 wire format (hand values, bit-exact against a brute-force nearest-value search, error
// bounds), record layout, the combine reduction's fixed order, and chunk plans.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ep_traces.hpp"
#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "ft/ep.hpp"

namespace {

using namespace ft::ep;
using ft::bf16_to_f32;
using ft::f32_to_bf16;
using ft::test::Rng;

std::vector<uint16_t> bf16_row(const std::vector<float> &v) {
    std::vector<uint16_t> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = f32_to_bf16(v[i]);
    return r;
}

float scale_fp32(const std::vector<uint8_t> &scales, int b) {
    float s;
    std::memcpy(&s, scales.data() + 4 * b, 4);
    return s;
}

// ---- FP8: hand values -------------------------------------------------------------------------

TEST(EpFp8, HandValuesFp32Scale) {
    std::vector<float> x(256, 0.0f);
    // Block 0: amax 448, so x is encoded unscaled (inv = 1).
    x[0] = 448.0f;   // 1.75 * 2^8: exponent 15, mantissa 6 -> 0x7E
    x[1] = 1.0f;     // 0x38
    x[2] = -2.0f;    // 0xC0
    x[3] = 0.5f;     // 0x30
    x[4] = 3.0f;     // 1.5 * 2: 0x44
    x[5] = 1.0625f;  // halfway 1.0 / 1.125: to the even mantissa 0 -> 0x38
    x[6] = 1.1875f;  // halfway 1.125 / 1.25: to the even mantissa 2 -> 0x3A
    x[7] = 0x1p-9f;  // smallest subnormal: 0x01
    x[8] = 0x1p-11f; // below half the smallest subnormal: +0
    // Block 1: amax 1, inv = 448.
    x[128] = 1.0f;       // 448 -> 0x7E
    x[129] = 0.5f;       // 224 = 1.75 * 2^7 -> 0x76
    x[130] = -0.25f;     // -112 -> 0xEE
    x[131] = 0x1p-7f;    // 3.5 -> 0x46
    const auto xb = bf16_row(x);
    std::vector<uint8_t> q(256), scales(8);
    quantize_fp8_row(xb.data(), 256, ScaleFormat::Fp32, q.data(), scales.data());
    const uint8_t want0[] = {0x7E, 0x38, 0xC0, 0x30, 0x44, 0x38, 0x3A, 0x01, 0x00};
    for (int i = 0; i < 9; ++i) EXPECT_EQ(q[i], want0[i]) << i;
    const uint8_t want1[] = {0x7E, 0x76, 0xEE, 0x46};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(q[128 + i], want1[i]) << i;
    EXPECT_EQ(scale_fp32(scales, 0), 1.0f);
    EXPECT_EQ(scale_fp32(scales, 1), 1.0f / 448.0f);
    // Decoding multiplies by the stored scale.
    std::vector<float> y(256);
    dequantize_fp8_row(q.data(), scales.data(), 256, ScaleFormat::Fp32, y.data());
    EXPECT_EQ(y[4], 3.0f);
    EXPECT_EQ(y[6], 1.25f);
    EXPECT_EQ(y[129], ft::e4m3_to_f32(0x76) * (1.0f / 448.0f));
}

TEST(EpFp8, HandValuesUe8m0Scale) {
    std::vector<float> x(384, 0.0f);
    x[0] = 448.0f;  // amax / 448 = 1: e = 0, byte 127
    x[1] = 1.0f;
    x[128] = 1.0f;  // amax / 448 = 2^-8.8: e = -8, byte 119; x * 2^8 = 256 -> 0x78
    x[129] = 0.5f;  // 128 -> 0x70
    x[256] = 56.0f; // amax / 448 = 2^-3 exactly: e = -3, byte 124 (no rounding up)
    x[257] = -7.0f; // -56 = -1.75 * 2^5 -> 0xE6
    const auto xb = bf16_row(x);
    std::vector<uint8_t> q(384), scales(3);
    quantize_fp8_row(xb.data(), 384, ScaleFormat::Ue8m0, q.data(), scales.data());
    EXPECT_EQ(scales[0], 127);
    EXPECT_EQ(scales[1], 119);
    EXPECT_EQ(scales[2], 124);
    EXPECT_EQ(q[0], 0x7E);
    EXPECT_EQ(q[1], 0x38);
    EXPECT_EQ(q[128], 0x78);
    EXPECT_EQ(q[129], 0x70);
    EXPECT_EQ(q[256], 0x7E);
    EXPECT_EQ(q[257], 0xE6);
    // Power-of-two scales make the decode exact for these values.
    std::vector<float> y(384);
    dequantize_fp8_row(q.data(), scales.data(), 384, ScaleFormat::Ue8m0, y.data());
    for (int i : {0, 1, 128, 129, 256, 257}) EXPECT_EQ(y[i], x[i]) << i;
}

TEST(EpFp8, ZerosNanAndInfinity) {
    std::vector<float> x(128, 0.0f);
    x[5] = -0.0f;
    auto xb = bf16_row(x);
    std::vector<uint8_t> q(128), scales(4);
    quantize_fp8_row(xb.data(), 128, ScaleFormat::Fp32, q.data(), scales.data());
    // An all-zero block uses the amax floor, so the scale is finite and non-zero.
    EXPECT_EQ(scale_fp32(scales, 0), 1e-4f / 448.0f);
    EXPECT_EQ(q[0], 0x00);
    EXPECT_EQ(q[5], 0x80);
    // NaN stays NaN and does not poison the scale; Inf saturates; the scale follows the finite amax.
    x[0] = std::numeric_limits<float>::quiet_NaN();
    x[1] = std::numeric_limits<float>::infinity();
    x[2] = -std::numeric_limits<float>::infinity();
    x[3] = 2.0f;
    xb = bf16_row(x);
    for (ScaleFormat f : {ScaleFormat::Fp32, ScaleFormat::Ue8m0}) {
        quantize_fp8_row(xb.data(), 128, f, q.data(), scales.data());
        EXPECT_EQ(q[0], 0x7F);
        EXPECT_EQ(q[1], 0x7E);
        EXPECT_EQ(q[2], 0xFE);
        // 2.0 is the amax: 448 with the fp32 scale; with e8m0 the scale rounds up to 2^-7, so 256.
        EXPECT_EQ(q[3], f == ScaleFormat::Fp32 ? 0x7E : 0x78);
        std::vector<float> y(128);
        dequantize_fp8_row(q.data(), scales.data(), 128, f, y.data());
        EXPECT_TRUE(std::isnan(y[0]));
    }
}

// ---- FP8: bit-exact against a brute-force reference -----------------------------------------

// Nearest finite e4m3 code by exhaustive search (ties to the even code), saturating: independent
// of f32_to_e4m3's arithmetic.
uint8_t nearest_e4m3(float v) {
    if (std::isnan(v)) return 0x7F;
    const double a = std::min(std::fabs(static_cast<double>(v)), 448.0);
    int best = 0;
    double best_d = 1e300;
    for (int c = 0; c <= 0x7E; ++c) {
        const int e = c >> 3, m = c & 7;
        const double val = e == 0 ? m * std::ldexp(1.0, -9) : (8 + m) * std::ldexp(1.0, e - 10);
        const double d = std::fabs(val - a);
        if (d < best_d || (d == best_d && (c & 1) == 0)) {
            best = c;
            best_d = d;
        }
    }
    return static_cast<uint8_t>((std::signbit(v) ? 0x80 : 0) | best);
}

TEST(EpFp8, BitExactAgainstBruteForce) {
    Rng rng(0x5eed0003);
    const int64_t H = 1024;
    for (int trial = 0; trial < 40; ++trial) {
        // Per block: a random magnitude over many decades, some exact zeros, some tiny values.
        std::vector<float> x(H);
        for (int64_t b = 0; b < H / 128; ++b) {
            const double mag = std::ldexp(1.0, static_cast<int>(rng.below(60)) - 30);
            for (int i = 0; i < 128; ++i) {
                const double u = rng.uniform();
                x[b * 128 + i] = u < 0.05 ? 0.0f : static_cast<float>((rng.uniform() * 2 - 1) * mag * (u < 0.1 ? 1e-3 : 1.0));
            }
        }
        const auto xb = bf16_row(x);
        for (ScaleFormat f : {ScaleFormat::Fp32, ScaleFormat::Ue8m0}) {
            std::vector<uint8_t> q(H), scales(fp8_scale_bytes(H, f));
            quantize_fp8_row(xb.data(), H, f, q.data(), scales.data());
            for (int64_t b = 0; b < H / 128; ++b) {
                double amax = 0;
                for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(static_cast<double>(bf16_to_f32(xb[b * 128 + i]))));
                const float famax = std::max(static_cast<float>(amax), 1e-4f);
                if (f == ScaleFormat::Fp32) {
                    ASSERT_EQ(scale_fp32(scales, static_cast<int>(b)), famax / 448.0f);
                    const float inv = 448.0f / famax;
                    for (int i = 0; i < 128; ++i)
                        ASSERT_EQ(q[b * 128 + i], nearest_e4m3(bf16_to_f32(xb[b * 128 + i]) * inv)) << trial << " " << b << " " << i;
                } else {
                    // The smallest power of two at or above amax / 448, found by doubling.
                    const float r = famax / 448.0f;
                    int e = -140;
                    while (std::ldexp(1.0f, e) < r) ++e;
                    ASSERT_EQ(scales[b], e + 127);
                    for (int i = 0; i < 128; ++i)
                        ASSERT_EQ(q[b * 128 + i], nearest_e4m3(std::ldexp(bf16_to_f32(xb[b * 128 + i]), -e)));
                }
            }
        }
    }
}

TEST(EpFp8, RoundTripWithinBound) {
    Rng rng(0x5eed0004);
    const int64_t H = 2048;
    double worst = 0;
    for (int trial = 0; trial < 30; ++trial) {
        std::vector<float> x(H);
        for (float &v : x) v = static_cast<float>((rng.uniform() * 2 - 1) * std::ldexp(1.0, static_cast<int>(rng.below(24)) - 12));
        const auto xb = bf16_row(x);
        for (ScaleFormat f : {ScaleFormat::Fp32, ScaleFormat::Ue8m0}) {
            std::vector<uint8_t> q(H), scales(fp8_scale_bytes(H, f));
            std::vector<float> y(H);
            quantize_fp8_row(xb.data(), H, f, q.data(), scales.data());
            dequantize_fp8_row(q.data(), scales.data(), H, f, y.data());
            for (int64_t h = 0; h < H; ++h) {
                const double xv = bf16_to_f32(xb[h]);
                const double s = fp8_block_scale(scales.data(), h / 128, f);
                const double bound = std::fabs(xv) / 16 + s * 0x1p-10 + std::fabs(xv) * 0x1p-22;
                const double err = std::fabs(xv - y[h]);
                ASSERT_LE(err, bound) << "h " << h << " x " << xv << " y " << y[h];
                worst = std::max(worst, err / (bound > 0 ? bound : 1));
            }
        }
    }
    // The bound is tight: some element uses most of it (else it would not test much).
    EXPECT_GT(worst, 0.5);
}

// ---- records ----------------------------------------------------------------------------------

TEST(EpRecord, LayoutOffsets) {
    const RecordLayout a = record_layout(7168, 8, WireDtype::Fp8Fp32);
    EXPECT_EQ(a.payload_bytes, 7168u);
    EXPECT_EQ(a.scales, 7168u);
    EXPECT_EQ(a.scale_bytes, 224u);
    EXPECT_EQ(a.token, 7392u);
    EXPECT_EQ(a.source, 7396u);
    EXPECT_EQ(a.n, 7398u);
    EXPECT_EQ(a.weight, 7400u);
    EXPECT_EQ(a.slot, 7432u);
    EXPECT_EQ(a.bytes, 7456u);
    EXPECT_EQ(record_bytes(7168, 8, WireDtype::Fp8Ue8m0), 7280u);  // 7168 + 56 + 8 + 32 + 16
    EXPECT_EQ(record_bytes(7168, 8, WireDtype::Bf16), 14400u);     // 14336 + 56, to 16
    EXPECT_EQ(record_bytes(2048, 8, WireDtype::Fp8Fp32), 2176u);   // 2048 + 64 + 56, to 16
    EXPECT_THROW(record_layout(100, 8, WireDtype::Fp8Fp32), ft::Error);
    EXPECT_THROW(record_layout(128, 0, WireDtype::Fp8Fp32), ft::Error);
}

TEST(EpRecord, PackCarriesPayloadAndMetadata) {
    Rng rng(0x5eed0005);
    const Placement p = contiguous_placement(16, 4);
    const int32_t K = 4;
    const int64_t T = 50, H = 256;
    const auto ids = ft::test::random_routing(rng, T, K, 16);
    std::vector<float> w(T * K);
    for (float &v : w) v = static_cast<float>(rng.uniform());
    std::vector<uint16_t> x(T * H);
    for (auto &v : x) v = f32_to_bf16(static_cast<float>(rng.uniform() * 4 - 2));
    const DispatchLayout L = dispatch_layout(p, ids.data(), w.data(), T, K, 2);
    for (WireDtype d : {WireDtype::Bf16, WireDtype::Fp8Fp32, WireDtype::Fp8Ue8m0}) {
        const RecordLayout RL = record_layout(H, K, d);
        std::vector<uint8_t> buf(RL.bytes * L.offset[4], 0xAB);
        pack_dispatch(L, x.data(), H, d, buf.data());
        std::vector<float> y(H);
        for (int64_t i = 0; i < L.offset[4]; ++i) {
            const uint8_t *rec = buf.data() + RL.bytes * i;
            const RecordMeta m = read_record_meta(rec, RL, K);
            ASSERT_EQ(m.token, L.send_token[i]);
            ASSERT_EQ(m.source, 2);
            ASSERT_EQ(m.n, L.send_n[i]);
            for (int32_t j = 0; j < m.n; ++j) {
                ASSERT_EQ(m.slot[j], L.send_slot[i * K + j]);
                ASSERT_EQ(m.weight[j], L.send_weight[i * K + j]);
            }
            unpack_payload(rec, RL, H, d, y.data());
            for (int64_t h = 0; h < H; ++h) {
                const float xv = bf16_to_f32(x[m.token * H + h]);
                if (d == WireDtype::Bf16)
                    ASSERT_EQ(y[h], xv);
                else {
                    const ScaleFormat f = d == WireDtype::Fp8Fp32 ? ScaleFormat::Fp32 : ScaleFormat::Ue8m0;
                    const double s = fp8_block_scale(rec + RL.scales, h / 128, f);
                    ASSERT_NEAR(y[h], xv, std::fabs(xv) / 16 + s * 0x1p-10 + std::fabs(xv) * 0x1p-22);
                }
            }
            // Padding is zero, not left-over bytes: records hash and compare byte for byte.
            for (size_t b = RL.slot + 2 * K; b < RL.bytes; ++b) ASSERT_EQ(rec[b], 0);
        }
    }
}

// ---- combine ----------------------------------------------------------------------------------

// One record on a rank with routes (w0, y0), (w1, y1), in that (ascending logical id) order.
std::vector<uint8_t> record_with(const RecordLayout &RL, std::vector<float> w) {
    std::vector<uint8_t> rec(RL.bytes, 0);
    const int16_t n = static_cast<int16_t>(w.size());
    std::memcpy(rec.data() + RL.n, &n, 2);
    for (size_t j = 0; j < w.size(); ++j) {
        std::memcpy(rec.data() + RL.weight + 4 * j, &w[j], 4);
        const int16_t slot = static_cast<int16_t>(j);
        std::memcpy(rec.data() + RL.slot + 2 * j, &slot, 2);
    }
    return rec;
}

TEST(EpCombine, PartialIsAFusedMultiplyAddChainInRouteOrder) {
    const int32_t K = 2;
    const int64_t H = 128;
    const RecordLayout RL = record_layout(H, K, WireDtype::Fp8Fp32);
    // acc = fma(-1, 1 + 2^-7, 0) = -(1 + 2^-7); acc = fma(1 + 2^-23, 1 + 2^-7, acc) keeps the
    // product's 2^-30 term: 2^-23 (1 + 2^-7). A separate multiply would round it away (2^-23), and
    // the other route order would give 2^-23 as well.
    const std::vector<float> w = {-1.0f, 1.0f + 0x1p-23f};
    const auto rec = record_with(RL, w);
    std::vector<uint16_t> y(K * H, f32_to_bf16(1.0f + 0x1p-7f)), partial(H);
    reduce_partials(rec.data(), 1, RL, K, H, y.data(), partial.data());
    EXPECT_EQ(bf16_to_f32(partial[0]), 0x1p-23f * (1.0f + 0x1p-7f));
    const auto rev = record_with(RL, {w[1], w[0]});
    reduce_partials(rev.data(), 1, RL, K, H, y.data(), partial.data());
    EXPECT_EQ(bf16_to_f32(partial[0]), 0x1p-23f);
}

TEST(EpCombine, SourceSumsInAscendingRankOrder) {
    // Three ranks return 2^25, 1 and -2^25 for the one token. In rank order fp32 gives
    // (2^25 + 1) - 2^25 = 0 (the 1 is absorbed); in arrival order 0, 2, 1 it would be 1.
    const Placement p = contiguous_placement(3, 3);
    const std::vector<int32_t> ids = {0, 1, 2};
    const DispatchLayout L = dispatch_layout(p, ids.data(), nullptr, 1, 3, 0);
    const int64_t H = 128;
    std::vector<uint16_t> r0(H, f32_to_bf16(0x1p25f)), r1(H, f32_to_bf16(1.0f)), r2(H, f32_to_bf16(-0x1p25f)), out(H);
    const uint16_t *partials[3] = {r0.data(), r1.data(), r2.data()};
    combine_at_source(L, partials, H, out.data());
    EXPECT_EQ(bf16_to_f32(out[0]), 0.0f);
    const uint16_t *swapped[3] = {r0.data(), r2.data(), r1.data()};
    combine_at_source(L, swapped, H, out.data());
    EXPECT_EQ(bf16_to_f32(out[0]), 1.0f);  // the test sees order: another order gives another sum
}

// ---- chunk plans ------------------------------------------------------------------------------

TEST(EpChunks, CountFromBandwidthAndBoundariesOnRecords) {
    const size_t rec = record_bytes(7168, 8, WireDtype::Fp8Fp32);  // 7456 bytes
    std::vector<int64_t> counts = {9999, 4096, 10, 0,  // rank 0 -> 0 (self, ignored), 1, 2, 3
                                   7, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
    // 25 GB/s: chunk_min = max(4 MiB, 25e9 * 25e-6 / 0.1 = 6.25 MB); 4096 * 7456 B = 30.5 MB -> 4.
    const ChunkPlan a = plan_chunks(counts, 4, rec, 25e9);
    EXPECT_EQ(a.chunks, 4);
    EXPECT_EQ(a.begin(0, 1, 0), 0);
    EXPECT_EQ(a.begin(0, 1, 1), 1024);
    EXPECT_EQ(a.end(0, 1, 3), 4096);
    const int64_t want[] = {0, 2, 5, 7, 10};  // floor(c * 10 / 4)
    for (int c = 0; c <= 4; ++c) EXPECT_EQ(a.begin(0, 2, c), want[c]);
    // A slow link lets the 4 MiB floor decide: 30.5 MB / 4 MiB -> 7 chunks.
    EXPECT_EQ(plan_chunks(counts, 4, rec, 1e9).chunks, 7);
    // A fast one needs bigger chunks: 55 GB/s -> 13.75 MB -> 2.
    EXPECT_EQ(plan_chunks(counts, 4, rec, 55e9).chunks, 2);
    ChunkPolicy capped;
    capped.max_chunks = 3;
    EXPECT_EQ(plan_chunks(counts, 4, rec, 1e9, capped).chunks, 3);
    // Little traffic: one chunk.
    counts[1] = 100;
    EXPECT_EQ(plan_chunks(counts, 4, rec, 25e9).chunks, 1);
    EXPECT_THROW(plan_chunks(counts, 3, rec, 25e9), ft::Error);
}

TEST(EpChunks, BoundariesPartitionEveryPair) {
    Rng rng(0x5eed0006);
    for (int trial = 0; trial < 50; ++trial) {
        const int32_t R = 2 + static_cast<int32_t>(rng.below(7));
        std::vector<int64_t> counts(R * R);
        for (auto &c : counts) c = rng.below(5000);
        ChunkPolicy policy;
        policy.min_chunk_bytes = 1 + rng.below(1 << 22);
        const ChunkPlan plan = plan_chunks(counts, R, 2176, 0, policy);
        ASSERT_GE(plan.chunks, 1);
        ASSERT_LE(plan.chunks, policy.max_chunks);
        for (int32_t s = 0; s < R; ++s)
            for (int32_t d = 0; d < R; ++d) {
                ASSERT_EQ(plan.begin(s, d, 0), 0);
                ASSERT_EQ(plan.end(s, d, plan.chunks - 1), counts[s * R + d]);
                for (int32_t c = 0; c < plan.chunks; ++c) {
                    const int64_t n = plan.end(s, d, c) - plan.begin(s, d, c);
                    ASSERT_GE(n, counts[s * R + d] / plan.chunks);
                    ASSERT_LE(n, counts[s * R + d] / plan.chunks + 1);
                }
            }
    }
}

}  // namespace
