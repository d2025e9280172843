// The optional FP8 combine wire (issue 7 item 2), host reference: row sizes, the encoder is the
// dispatch quantiser byte for byte, the source sums decoded rows in ascending rank order with its
// own row kept bf16, and the gate's relative L2 error on random gaussian rows stays inside a
// stated bound. Inputs are fresh random draws per run (the seed is printed on failure).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ep_traces.hpp"
#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "ft/ep.hpp"
#include "fresh_seed.hpp"

namespace {

using namespace ft::ep;
using ft::bf16_to_f32;
using ft::f32_to_bf16;
using ft::test::Rng;

// Box-Muller from the test Rng (std:: distributions differ between standard libraries).
double gaussian(Rng &rng) {
    const double u = 1.0 - rng.uniform(), v = rng.uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
}

// A gaussian bf16 row with sigma 2^e, e drawn per row from [-20, 20] (scales must not matter);
// redrawn until no element is zero.
std::vector<uint16_t> gaussian_row(Rng &rng, int64_t H) {
    const double sigma = std::ldexp(1.0, static_cast<int>(rng.below(41)) - 20);
    std::vector<uint16_t> r(static_cast<size_t>(H));
    for (uint16_t &v : r) {
        do {
            v = f32_to_bf16(static_cast<float>(sigma * gaussian(rng)));
        } while ((v & 0x7fff) == 0);
    }
    return r;
}

ScaleFormat fmt_of(WireDtype d) {
    return d == WireDtype::Fp8Fp32 ? ScaleFormat::Fp32 : ScaleFormat::Ue8m0;
}

TEST(EpCombineFp8, RowBytes) {
    EXPECT_EQ(combine_row_bytes(7168, WireDtype::Bf16), 14336u);
    EXPECT_EQ(combine_row_bytes(7168, WireDtype::Fp8Fp32), 7168u + 224u);  // H + 4 H / 128
    EXPECT_EQ(combine_row_bytes(7168, WireDtype::Fp8Ue8m0), 7168u + 56u);  // H + H / 128
    EXPECT_EQ(combine_row_bytes(2048, WireDtype::Fp8Fp32), 2112u);
    EXPECT_EQ(combine_row_bytes(2048, WireDtype::Fp8Ue8m0), 2064u);
    EXPECT_EQ(combine_row_bytes(256, WireDtype::Fp8Ue8m0), 260u);  // 258 padded to whole words
    EXPECT_THROW(combine_row_bytes(100, WireDtype::Fp8Fp32), ft::Error);
}

// The wire bytes are quantize_fp8_row's output, scales right after the payload, zero padding;
// decoding is dequantize_fp8_row's; the returned error is the row's relative L2 error in double.
TEST(EpCombineFp8, EncoderIsTheDispatchQuantiserBitForBit) {
    const uint64_t seed = ft::test::fresh_seed("EpCombineFp8");
    SCOPED_TRACE(ft::cat("seed ", seed));
    Rng rng(seed);
    for (WireDtype d : {WireDtype::Fp8Fp32, WireDtype::Fp8Ue8m0, WireDtype::Bf16})
        for (int64_t H : {128, 256, 2048, 7168}) {
            SCOPED_TRACE(ft::cat("dtype ", static_cast<int>(d), " H ", H));
            for (int rep = 0; rep < 8; ++rep) {
                const std::vector<uint16_t> row = gaussian_row(rng, H);
                const size_t bytes = combine_row_bytes(H, d);
                std::vector<uint8_t> wire(bytes, 0xAB);
                const double err = encode_combine_row(row.data(), H, d, wire.data());
                std::vector<float> got(H), want(H);
                decode_combine_row(wire.data(), H, d, got.data());
                if (d == WireDtype::Bf16) {
                    EXPECT_EQ(0, std::memcmp(wire.data(), row.data(), bytes));
                    for (int64_t h = 0; h < H; ++h) EXPECT_EQ(got[h], bf16_to_f32(row[h]));
                    EXPECT_EQ(err, 0.0);
                    continue;
                }
                std::vector<uint8_t> q(H), scales(fp8_scale_bytes(H, fmt_of(d)));
                quantize_fp8_row(row.data(), H, fmt_of(d), q.data(), scales.data());
                EXPECT_EQ(0, std::memcmp(wire.data(), q.data(), H));
                EXPECT_EQ(0, std::memcmp(wire.data() + H, scales.data(), scales.size()));
                for (size_t i = H + scales.size(); i < bytes; ++i) EXPECT_EQ(wire[i], 0) << "padding byte " << i;
                dequantize_fp8_row(q.data(), scales.data(), H, fmt_of(d), want.data());
                EXPECT_EQ(0, std::memcmp(got.data(), want.data(), H * sizeof(float)));
                double e2 = 0, n2 = 0;
                for (int64_t h = 0; h < H; ++h) {
                    const double v = bf16_to_f32(row[h]);
                    e2 += (want[h] - v) * (want[h] - v);
                    n2 += v * v;
                }
                EXPECT_DOUBLE_EQ(err, std::sqrt(e2) / std::sqrt(n2));
                EXPECT_EQ(err, combine_rel_error(row.data(), got.data(), H));
            }
        }
}

// The gate's measure on random gaussian rows. Each element's error is at most half an e4m3 ulp,
// 2^-4 relative, so no row can exceed 0.0625; rounding errors spread over the ulp give an RMS near
// 2^-3 / sqrt(12) * E[1/m] (m the mantissa in [1, 2)), about 0.026 for fp32 scales. Asserted: every
// row < 0.05 (the bound the issue names) and below the default gate (which must not trip on
// benign data), and the mean within [0.015, 0.04] so the measure is neither zero nor the worst
// case. ue8m0 scales waste up to one binade of range at the top, which
// shifts no element's relative spacing: the same bounds hold.
TEST(EpCombineFp8, RelativeErrorOfGaussianRowsIsBounded) {
    const uint64_t seed = ft::test::fresh_seed("EpCombineFp8");
    SCOPED_TRACE(ft::cat("seed ", seed));
    Rng rng(seed);
    for (WireDtype d : {WireDtype::Fp8Fp32, WireDtype::Fp8Ue8m0}) {
        for (int64_t H : {2048, 7168}) {
            double sum = 0, worst = 0;
            const int rows = 64;
            std::vector<uint8_t> wire(combine_row_bytes(H, d));
            for (int i = 0; i < rows; ++i) {
                const std::vector<uint16_t> row = gaussian_row(rng, H);
                const double err = encode_combine_row(row.data(), H, d, wire.data());
                sum += err;
                worst = std::max(worst, err);
            }
            std::printf("[ info     ] FP8 combine, scales %s, H %lld: relative L2 error mean %.4f, worst %.4f\n",
                        d == WireDtype::Fp8Fp32 ? "fp32" : "e8m0", static_cast<long long>(H), sum / rows, worst);
            EXPECT_LT(worst, 0.05) << "dtype " << static_cast<int>(d) << " H " << H;
            EXPECT_LT(worst, kCombineDefaultMaxRelError) << "the default gate would trip on plain gaussian rows";
            EXPECT_GT(sum / rows, 0.015);
            EXPECT_LT(sum / rows, 0.04);
        }
    }
}

TEST(EpCombineFp8, ErrorOfZeroAndNonFiniteRows) {
    const int64_t H = 256;
    std::vector<uint16_t> row(H, 0);
    std::vector<uint8_t> wire(combine_row_bytes(H, WireDtype::Fp8Fp32));
    EXPECT_EQ(encode_combine_row(row.data(), H, WireDtype::Fp8Fp32, wire.data()), 0.0);
    for (uint16_t bad : {uint16_t(0x7f80), uint16_t(0xff80), uint16_t(0x7fc1)}) {
        row[17] = bad;
        EXPECT_TRUE(std::isinf(encode_combine_row(row.data(), H, WireDtype::Fp8Fp32, wire.data())));
        EXPECT_TRUE(std::isinf(encode_combine_row(row.data(), H, WireDtype::Fp8Ue8m0, wire.data())));
    }
    // A huge dynamic range inside one 128-channel block: the small values fall below e4m3's
    // subnormal range and vanish, yet the row's error stays tiny (its norm is the big value's).
    std::vector<uint16_t> wide(H, f32_to_bf16(1e-3f));
    wide[0] = f32_to_bf16(448.0f * 1024.0f);
    for (int64_t h = 128; h < H; ++h) wide[h] = f32_to_bf16(1.0f);
    std::vector<float> dec(H);
    const double err = encode_combine_row(wide.data(), H, WireDtype::Fp8Fp32, wire.data());
    decode_combine_row(wire.data(), H, WireDtype::Fp8Fp32, dec.data());
    EXPECT_EQ(dec[1], 0.0f);
    EXPECT_EQ(dec[0], 448.0f * 1024.0f);
    EXPECT_EQ(err, combine_rel_error(wide.data(), dec.data(), H));
    EXPECT_LT(err, 1e-6);
}

// Any finite row stays below 2^-4 (half an e4m3 ulp, relative) plus the subnormal term, whatever
// its shape: gaussian, log-uniform over 40 binades, mostly-tiny with a few huge values, and
// values on rounding midpoints (the worst case, which the default gate must catch).
TEST(EpCombineFp8, FiniteRowsStayBelowHalfAnUlp) {
    const uint64_t seed = ft::test::fresh_seed("EpCombineFp8");
    SCOPED_TRACE(ft::cat("seed ", seed));
    Rng rng(seed);
    const double bound = 0.0625 + 1e-4;
    for (WireDtype d : {WireDtype::Fp8Fp32, WireDtype::Fp8Ue8m0})
        for (int64_t H : {256, 2048}) {
            std::vector<uint8_t> wire(combine_row_bytes(H, d));
            for (int rep = 0; rep < 32; ++rep) {
                std::vector<uint16_t> row(H);
                for (int64_t h = 0; h < H; ++h) {
                    const double sign = rng.uniform() < 0.5 ? -1 : 1;
                    double v;
                    switch (rep % 3) {
                        case 0:
                            v = std::ldexp(1.0 + rng.uniform(), static_cast<int>(rng.below(40)) - 20);
                            break;
                        case 1:
                            v = rng.uniform() < 0.02 ? 1e4 * (1 + rng.uniform()) : 1e-3 * rng.uniform() + 1e-6;
                            break;
                        default:
                            v = gaussian(rng);
                            break;
                    }
                    row[h] = f32_to_bf16(static_cast<float>(sign * v));
                }
                const double err = encode_combine_row(row.data(), H, d, wire.data());
                EXPECT_LT(err, bound) << "shape " << rep % 3;
            }
        }
    // Midpoints: values 1.0625 * 2^k, k = 0..7, with e8m0 scales (amax 136: scale 2^-1, so each
    // value scales to 1.0625 * 2^(k+1), in e4m3's normal range) lie halfway between two e4m3
    // values and round to even (down): relative error 0.0625 / 1.0625 = 0.0588 on every element,
    // above the default gate.
    const int64_t H = 128;
    std::vector<uint16_t> mid(H);
    for (int64_t h = 0; h < H; ++h) mid[h] = f32_to_bf16(std::ldexp(1.0625f, static_cast<int>(h % 8)));
    std::vector<uint8_t> wire(combine_row_bytes(H, WireDtype::Fp8Ue8m0));
    const double err = encode_combine_row(mid.data(), H, WireDtype::Fp8Ue8m0, wire.data());
    EXPECT_NEAR(err, 0.0625 / 1.0625, 1e-9);
    EXPECT_GT(err, kCombineDefaultMaxRelError);
    EXPECT_LT(err, 0.0625);
}

// The source adds the decoded rows of ranks 0..R-1 in ascending order in fp32 (its own row bf16),
// so a reordering changes the sum and the FP8 path equals an explicit decode-and-add.
TEST(EpCombineFp8, SourceSumsDecodedRowsInRankOrder) {
    const uint64_t seed = ft::test::fresh_seed("EpCombineFp8");
    SCOPED_TRACE(ft::cat("seed ", seed));
    Rng rng(seed);
    const int32_t R = 5, K = 8;
    const int64_t H = 512, T = 40;
    const Placement p = contiguous_placement(4 * R, R);
    const std::vector<int32_t> ids = ft::test::random_routing(rng, T, K, p.num_experts);
    for (int32_t src = 0; src < R; ++src)
        for (WireDtype d : {WireDtype::Fp8Fp32, WireDtype::Fp8Ue8m0, WireDtype::Bf16}) {
            SCOPED_TRACE(ft::cat("source ", src, " dtype ", static_cast<int>(d)));
            const DispatchLayout L = dispatch_layout(p, ids.data(), nullptr, T, K, src);
            const size_t rb = combine_row_bytes(H, d);
            // Every rank's returned rows: random bf16 partials, encoded unless they are the source's.
            std::vector<std::vector<uint16_t>> part(R);
            std::vector<std::vector<uint8_t>> wire(R);
            std::vector<const uint8_t *> rows(R);
            for (int32_t r = 0; r < R; ++r) {
                for (int64_t i = 0; i < L.count[r]; ++i) {
                    const std::vector<uint16_t> g = gaussian_row(rng, H);
                    part[r].insert(part[r].end(), g.begin(), g.end());
                }
                wire[r].resize(rb * L.count[r]);
                for (int64_t i = 0; i < L.count[r]; ++i)
                    encode_combine_row(part[r].data() + i * H, H, d, wire[r].data() + rb * i);
                rows[r] = r == src ? reinterpret_cast<const uint8_t *>(part[r].data()) : wire[r].data();
            }
            std::vector<uint16_t> out(T * H), want(T * H);
            combine_at_source_wire(L, rows.data(), H, d, out.data());
            std::vector<float> v(H);
            for (int64_t t = 0; t < T; ++t) {
                std::vector<float> sum(H, 0.0f);
                for (int32_t r = 0; r < R; ++r) {
                    const int32_t row = L.row[r * T + t];
                    if (row < 0) continue;
                    if (r == src)
                        for (int64_t h = 0; h < H; ++h) v[h] = bf16_to_f32(part[r][row * H + h]);
                    else if (d == WireDtype::Bf16)
                        for (int64_t h = 0; h < H; ++h) v[h] = bf16_to_f32(part[r][row * H + h]);
                    else
                        dequantize_fp8_row(wire[r].data() + rb * row, wire[r].data() + rb * row + H, H, fmt_of(d),
                                           v.data());
                    for (int64_t h = 0; h < H; ++h) sum[h] += v[h];
                }
                for (int64_t h = 0; h < H; ++h) want[t * H + h] = f32_to_bf16(sum[h]);
            }
            EXPECT_TRUE(out == want);
            if (d == WireDtype::Bf16) {  // the bf16 wire is combine_at_source itself
                std::vector<const uint16_t *> pp(R);
                for (int32_t r = 0; r < R; ++r) pp[r] = part[r].data();
                std::vector<uint16_t> plain(T * H);
                combine_at_source(L, pp.data(), H, plain.data());
                EXPECT_TRUE(out == plain);
            }
        }
    // Order: three ranks return 2^25, 1, -2^25 (exact in e4m3 with their own scales); rank
    // order gives 0, as on the bf16 wire; the source is rank 0 and keeps its row bf16.
    const Placement p3 = contiguous_placement(3, 3);
    const std::vector<int32_t> one = {0, 1, 2};
    const DispatchLayout L3 = dispatch_layout(p3, one.data(), nullptr, 1, 3, 0);
    const int64_t H3 = 128;
    std::vector<uint16_t> r0(H3, f32_to_bf16(0x1p25f)), r1(H3, f32_to_bf16(1.0f)), r2(H3, f32_to_bf16(-0x1p25f)),
        out3(H3);
    const size_t rb = combine_row_bytes(H3, WireDtype::Fp8Fp32);
    std::vector<uint8_t> w1(rb), w2(rb);
    EXPECT_EQ(encode_combine_row(r1.data(), H3, WireDtype::Fp8Fp32, w1.data()), 0.0);
    EXPECT_EQ(encode_combine_row(r2.data(), H3, WireDtype::Fp8Fp32, w2.data()), 0.0);
    const uint8_t *rows3[3] = {reinterpret_cast<const uint8_t *>(r0.data()), w1.data(), w2.data()};
    combine_at_source_wire(L3, rows3, H3, WireDtype::Fp8Fp32, out3.data());
    EXPECT_EQ(bf16_to_f32(out3[0]), 0.0f);
}

}  // namespace
