// The reference dequantisers of q2_k, q3_k and iq4_xs on blocks built by hand: each test chooses
// the quant, scale and min of every element, packs them into ggml's byte layout with its own
// encoder (written from the layout, independent of lib/core/formats), and expects the element
// formula evaluated here. A few elements are also checked against values worked out by hand.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "ft/formats.hpp"

namespace {

void put_half(uint8_t *p, float v) {
    const uint16_t h = ft::f32_to_f16(v);
    std::memcpy(p, &h, 2);
}

// Super-block s of a two-block row: distinct quants, scales and mins per block so that a decoder
// reading the wrong block or the wrong field sees different values.

// q2_k: element e of a super-block (e = 128 h + 32 p + 16 r + l) is bits 2p of qs[32 h + 16 r + l];
// sub-block e / 16 has scale = low nibble, min = high nibble of scales[e / 16].
TEST(DequantGgufLow, Q2KHandBlock) {
    const float d[2] = {0.5f, 0.25f}, dmin[2] = {0.125f, 2.0f};
    std::vector<uint8_t> row(2 * ft::kQ2_KBlockBytes, 0);
    std::vector<float> want(512);
    for (int s = 0; s < 2; ++s) {
        uint8_t *blk = row.data() + s * ft::kQ2_KBlockBytes;
        int sc[16], mn[16];
        for (int i = 0; i < 16; ++i) {
            sc[i] = (i * 5 + s) % 16;
            mn[i] = (15 - i + 3 * s) % 16;
            blk[i] = uint8_t(sc[i] | (mn[i] << 4));
        }
        for (int e = 0; e < 256; ++e) {
            const int q = (e * 7 + s + e / 64) % 4;
            const int h = e / 128, p = (e / 32) % 4, i = e % 32;
            blk[16 + 32 * h + i] |= uint8_t(q << (2 * p));
            want[size_t(256 * s + e)] = d[s] * float(sc[e / 16]) * float(q) - dmin[s] * float(mn[e / 16]);
        }
        put_half(blk + 80, d[s]);
        put_half(blk + 82, dmin[s]);
    }
    std::vector<float> got(512);
    ft::dequant_row_q2_k(row.data(), 512, got.data());
    for (int k = 0; k < 512; ++k) EXPECT_EQ(got[size_t(k)], want[size_t(k)]) << "k=" << k;
    // By hand: element 0: q = 0, scale 0, min 15 -> -0.125 * 15; element 17 of block 0: q = (119 + 0)
    // % 4 = 3, sub-block 1: scale 5, min 14 -> 0.5 * 5 * 3 - 0.125 * 14 = 5.75.
    EXPECT_EQ(got[0], -1.875f);
    EXPECT_EQ(got[17], 5.75f);
    // Element 256 (block 1, e = 0): q = 1, scale 1, min (15 + 3) % 16 = 2 -> 0.25 - 4 = -3.75.
    EXPECT_EQ(got[256], -3.75f);
}

// q3_k: element e = 128 h + 32 p + i: low 2 bits at bits 2p of qs[32 h + i], high bit at bit 4h + p
// of hmask[i]; value = low + 4 * high - 4 (-4 .. 3). Scale j (0..15), stored + 32 in 6 bits: low
// nibble of scales[j] (j < 8) or high nibble of scales[j - 8], top 2 bits at bits 2 (j / 4) of
// scales[8 + j % 4].
TEST(DequantGgufLow, Q3KHandBlock) {
    const float d[2] = {0.5f, 0.0625f};
    std::vector<uint8_t> row(2 * ft::kQ3_KBlockBytes, 0);
    std::vector<float> want(512);
    for (int s = 0; s < 2; ++s) {
        uint8_t *blk = row.data() + s * ft::kQ3_KBlockBytes;
        uint8_t *hmask = blk, *qs = blk + 32, *scales = blk + 96;
        int sc[16];
        for (int j = 0; j < 16; ++j) {
            sc[j] = (j * 11 + 7 * s) % 64 - 32;  // -32 .. 31
            const int u = sc[j] + 32;
            scales[j % 8] |= uint8_t((u & 15) << (j < 8 ? 0 : 4));
            scales[8 + j % 4] |= uint8_t((u >> 4) << (2 * (j / 4)));
        }
        for (int e = 0; e < 256; ++e) {
            const int v = (e * 5 + 3 * s + e / 32) % 8 - 4;
            const int u = v + 4, h = e / 128, p = (e / 32) % 4, i = e % 32;
            qs[32 * h + i] |= uint8_t((u & 3) << (2 * p));
            if (u & 4) hmask[i] |= uint8_t(1u << (4 * h + p));
            want[size_t(256 * s + e)] = d[s] * float(sc[e / 16]) * float(v);
        }
        put_half(blk + 108, d[s]);
    }
    std::vector<float> got(512);
    ft::dequant_row_q3_k(row.data(), 512, got.data());
    for (int k = 0; k < 512; ++k) EXPECT_EQ(got[size_t(k)], want[size_t(k)]) << "k=" << k;
    // By hand: element 0: v = 0 - 4 = -4, scale -32 -> 0.5 * -32 * -4 = 64; element 16: v = 80 % 8 - 4
    // = -4, scale 11 - 32 = -21 -> 42; element 256 (block 1): v = 3 - 4 = -1, scale 7 - 32 = -25
    // -> 0.0625 * 25 = 1.5625.
    EXPECT_EQ(got[0], 64.0f);
    EXPECT_EQ(got[16], 42.0f);
    EXPECT_EQ(got[256], 1.5625f);
}

// iq4_xs: sub-block ib (32 elements) has the 6-bit scale ls = nibble ib % 2 of scales_l[ib / 2] |
// bits 2 ib of scales_h << 4; element j < 16 is the low nibble of qs[16 ib + j], element 16 + j its
// high nibble; value = d * (ls - 32) * level[nibble].
TEST(DequantGgufLow, IQ4XSHandBlock) {
    // The 16 levels of ggml's IQ4_NL table.
    const int kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    for (int i = 0; i < 16; ++i) EXPECT_EQ(ft::kIq4nlValues[i], kLevels[i]) << i;
    const float d[2] = {0.25f, 0.125f};
    std::vector<uint8_t> row(2 * ft::kIQ4_XSBlockBytes, 0);
    std::vector<float> want(512);
    for (int s = 0; s < 2; ++s) {
        uint8_t *blk = row.data() + s * ft::kIQ4_XSBlockBytes;
        put_half(blk, d[s]);
        unsigned scales_h = 0;
        int ls[8];
        for (int ib = 0; ib < 8; ++ib) {
            ls[ib] = (ib * 23 + 5 + 9 * s) % 64;
            blk[4 + ib / 2] |= uint8_t((ls[ib] & 15) << (4 * (ib % 2)));
            scales_h |= unsigned(ls[ib] >> 4) << (2 * ib);
        }
        blk[2] = uint8_t(scales_h & 0xff);
        blk[3] = uint8_t(scales_h >> 8);
        for (int e = 0; e < 256; ++e) {
            const int n = (e * 3 + s + e / 16) % 16, ib = e / 32, j = e % 32;
            blk[8 + 16 * ib + j % 16] |= uint8_t(n << (j < 16 ? 0 : 4));
            want[size_t(256 * s + e)] = d[s] * float(ls[ib] - 32) * float(kLevels[n]);
        }
    }
    std::vector<float> got(512);
    ft::dequant_row_iq4_xs(row.data(), 512, got.data());
    for (int k = 0; k < 512; ++k) EXPECT_EQ(got[size_t(k)], want[size_t(k)]) << "k=" << k;
    // By hand: element 0: nibble 0 (-127), ls 5 -> 0.25 * -27 * -127 = 857.25; element 16: nibble
    // (48 + 1) % 16 = 1 (-104) -> 0.25 * -27 * -104 = 702; element 32 (ls 28): nibble (96 + 2) % 16
    // = 2 (-83) -> 0.25 * -4 * -83 = 83.
    EXPECT_EQ(got[0], 857.25f);
    EXPECT_EQ(got[16], 702.0f);
    EXPECT_EQ(got[32], 83.0f);
}

// Through the format table: the two-bank schema sizes and dequant_row_block pick these decoders.
TEST(DequantGgufLow, BlockTableEntries) {
    EXPECT_EQ(ft::block_bytes(ft::Format::q2_k), 84);
    EXPECT_EQ(ft::block_bytes(ft::Format::q3_k), 110);
    EXPECT_EQ(ft::block_bytes(ft::Format::iq4_xs), 136);
    EXPECT_EQ(ft::block_row_bytes(ft::Format::q3_k, 1024), size_t(440));
    std::vector<uint8_t> row(ft::kQ2_KBlockBytes, 0x5a);
    put_half(row.data() + 80, 1.0f);
    put_half(row.data() + 82, 0.5f);
    std::vector<float> a(256), b(256);
    ft::dequant_row_q2_k(row.data(), 256, a.data());
    ft::dequant_row_block(ft::Format::q2_k, row.data(), 256, b.data());
    EXPECT_EQ(a, b);
}

}  // namespace
