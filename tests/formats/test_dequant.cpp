// The scalar references of ft/dequant.hpp against hand-computed values, every edge case the
// header decides, and quantise -> dequantise round trips within the stated bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "fresh_seed.hpp"

namespace ft {
namespace {

std::mt19937_64 &rng() {
    static std::mt19937_64 g(test::fresh_seed("test_dequant"));
    return g;
}

float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng()); }

TEST(Dequant, E2m1AllCodes) {
    const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int c = 0; c < 16; ++c) {
        EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), want[c]) << c;
        EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c | 0xf0)), want[c]) << "high bits ignored, code " << c;
    }
    EXPECT_TRUE(std::signbit(e2m1_to_f32(8)));  // code 8 is -0
    for (int c = 0; c < 16; ++c) EXPECT_EQ(f32_to_e2m1(want[c]), c);  // -0.0 keeps its sign: code 8
    // Ties go to the even code: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
    EXPECT_EQ(f32_to_e2m1(0.25f), 0);
    EXPECT_EQ(f32_to_e2m1(0.75f), 2);
    EXPECT_EQ(f32_to_e2m1(1.25f), 2);
    EXPECT_EQ(f32_to_e2m1(1.75f), 4);
    EXPECT_EQ(f32_to_e2m1(2.5f), 4);
    EXPECT_EQ(f32_to_e2m1(3.5f), 6);
    EXPECT_EQ(f32_to_e2m1(5.0f), 6);
    EXPECT_EQ(f32_to_e2m1(100.0f), 7);
    EXPECT_EQ(f32_to_e2m1(-100.0f), 15);
}

TEST(Dequant, E4m3HandValues) {
    EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
    EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));       // smallest subnormal
    EXPECT_EQ(e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));   // largest subnormal
    EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));       // smallest normal
    EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
    EXPECT_EQ(e4m3_to_f32(0x3c), 1.5f);
    EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
    EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
    EXPECT_EQ(e4m3_to_f32(0xb9), -1.125f);
    EXPECT_TRUE(std::signbit(e4m3_to_f32(0x80)));
    // The NaN codes are NaN, not +-480 (the original CPU LUT's reading).
    EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
    EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
    int nans = 0;
    for (int c = 0; c < 256; ++c) nans += std::isnan(e4m3_to_f32(static_cast<uint8_t>(c)));
    EXPECT_EQ(nans, 2);
}

TEST(Dequant, E4m3EncodeRoundTripAndRounding) {
    for (int c = 0; c < 256; ++c) {
        if ((c & 0x7f) == 0x7f) continue;
        const float v = e4m3_to_f32(static_cast<uint8_t>(c));
        EXPECT_EQ(f32_to_e4m3(v), c) << "code " << c << " value " << v;
    }
    EXPECT_EQ(f32_to_e4m3(1.0f + 1.0f / 16), 0x38);   // tie -> even mantissa (1.0)
    EXPECT_EQ(f32_to_e4m3(1.0f + 3.0f / 16), 0x3a);   // tie -> even mantissa (1.25)
    EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7e);            // saturates
    EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xfe);
    EXPECT_EQ(f32_to_e4m3(NAN), 0x7f);
    EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);         // half the smallest subnormal: tie to 0
    EXPECT_EQ(f32_to_e4m3(std::ldexp(1.5f, -10)), 0x01);
    EXPECT_EQ(f32_to_e4m3(7.5f * std::ldexp(1.0f, -9)), 0x08);  // tie rounds up (even) into the normals
    // Against a brute-force nearest search over every finite code, ties to the even code.
    for (int i = 0; i < 20000; ++i) {
        const float v = std::ldexp(uniform(-1.0f, 1.0f), static_cast<int>(rng()() % 20) - 10);
        float best = 0;
        int best_code = 0;
        for (int c = 0; c < 128; ++c) {
            if (c == 0x7f) continue;
            const float cv = std::copysign(e4m3_to_f32(static_cast<uint8_t>(c)), v);
            const float d = std::fabs(cv - v), bd = std::fabs(best - v);
            if (c == 0 || d < bd || (d == bd && (c & 1) == 0 && (best_code & 1))) {
                best = cv;
                best_code = c;
            }
        }
        if (std::fabs(v) > 448.0f) best = std::copysign(448.0f, v);
        EXPECT_EQ(round_e4m3(v), best) << v;
    }
}

TEST(Dequant, E8m0EdgeCodes) {
    EXPECT_EQ(e8m0_to_f32(127), 1.0f);
    EXPECT_EQ(e8m0_to_f32(128), 2.0f);
    EXPECT_EQ(e8m0_to_f32(120), 1.0f / 128);
    EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
    // Code 0 is 2^-127 (a subnormal float), not zero; code 255 is NaN (OCP MX).
    EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
    EXPECT_GT(e8m0_to_f32(0), 0.0f);
    EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

TEST(Dequant, F16EncodeDecode) {
    EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
    EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
    EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
    EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to Inf
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even
    EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
    for (int i = 0; i < 10000; ++i) {
        const float v = std::ldexp(uniform(-1.0f, 1.0f), static_cast<int>(rng()() % 40) - 25);
        const float r = f16_to_f32(f32_to_f16(v));
        const float ulp = std::max(std::ldexp(1.0f, -24), std::ldexp(std::fabs(v), -10));
        EXPECT_LE(std::fabs(r - v), ulp / 2 * 1.0001f) << v;
    }
}

// One q4_0 block: d = 0.5, qs[j] = j | (15 - j) << 4.
std::vector<uint8_t> q4_block(uint16_t d) {
    std::vector<uint8_t> b(18);
    b[0] = static_cast<uint8_t>(d & 0xff);
    b[1] = static_cast<uint8_t>(d >> 8);
    for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    return b;
}

TEST(Dequant, Q4_0HandBlock) {
    std::vector<uint8_t> blocks = q4_block(0x3800);  // 0.5
    const std::vector<uint8_t> second = q4_block(0xbc00);  // -1.0
    blocks.insert(blocks.end(), second.begin(), second.end());
    float out[64];
    dequant_row_q4_0(blocks.data(), 64, out);
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(out[j], (j - 8) * 0.5f);               // low nibbles: elements 0..15
        EXPECT_EQ(out[16 + j], (15 - j - 8) * 0.5f);     // high nibbles: elements 16..31
        EXPECT_EQ(out[32 + j], (j - 8) * -1.0f);
        EXPECT_EQ(out[48 + j], (15 - j - 8) * -1.0f);
    }
}

TEST(Dequant, Q4_0ScaleEdgeCases) {
    float out[32];
    // Subnormal d (2^-24 * 3) decodes exactly.
    dequant_row_q4_0(q4_block(0x0003).data(), 32, out);
    EXPECT_EQ(out[0], -8 * 3 * std::ldexp(1.0f, -24));
    EXPECT_EQ(out[15], 7 * 3 * std::ldexp(1.0f, -24));
    // d = +Inf: q = 8 gives NaN (0 * Inf), others +-Inf: IEEE propagation, nothing hidden.
    dequant_row_q4_0(q4_block(0x7c00).data(), 32, out);
    EXPECT_TRUE(std::isnan(out[8]));   // element 8: low nibble 8
    EXPECT_EQ(out[0], -INFINITY);
    EXPECT_EQ(out[9], INFINITY);
    dequant_row_q4_0(q4_block(0x7e00).data(), 32, out);  // NaN d
    for (float v : out) EXPECT_TRUE(std::isnan(v));
}

// Two q8_0 blocks of 34 bytes (fp16 d, int8 q[32]): d = 0.25 with q = j - 16, then d = -2 with
// q = +127 / -127 alternating.
TEST(Dequant, Q8_0HandBlocks) {
    uint8_t b[68] = {};
    b[0] = 0x00, b[1] = 0x34;  // 0.25
    for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(j - 16);
    b[34] = 0x00, b[35] = 0xc0;  // -2.0
    for (int j = 0; j < 32; ++j) b[36 + j] = static_cast<uint8_t>(j % 2 ? -127 : 127);
    float out[64];
    dequant_row_q8_0(b, 64, out);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], (j - 16) * 0.25f) << j;
    EXPECT_EQ(out[0], -4.0f);
    EXPECT_EQ(out[31], 3.75f);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(out[32 + j], j % 2 ? 254.0f : -254.0f) << j;
}

// The 12 scale bytes of q4_k / q5_k for sub-block scales {1, 2, 3, 4, 33, 17, 50, 63} and mins
// {0, 5, 10, 63, 16, 34, 1, 48}: bytes 0-3 = sc[j] | (sc[j + 4] >> 4) << 6, bytes 4-7 =
// m[j] | (m[j + 4] >> 4) << 6, bytes 8-11 = (sc[j + 4] & 15) | (m[j + 4] & 15) << 4.
const uint8_t kK4Scales[12] = {0x81, 0x42, 0xc3, 0xc4, 0x40, 0x85, 0x0a, 0xff, 0x01, 0x21, 0x12, 0x0f};
const int kK4Sc[8] = {1, 2, 3, 4, 33, 17, 50, 63}, kK4Min[8] = {0, 5, 10, 63, 16, 34, 1, 48};

// One q4_k super-block: d = 1, dmin = 0.5, the scales above; qs byte 32c + l holds element
// 64c + l in its low nibble (l % 16) and element 64c + 32 + l in its high nibble (15 - l % 16).
TEST(Dequant, Q4_KHandBlock) {
    uint8_t b[144] = {};
    b[0] = 0x00, b[1] = 0x3c;  // d = 1
    b[2] = 0x00, b[3] = 0x38;  // dmin = 0.5
    std::memcpy(b + 4, kK4Scales, 12);
    for (int i = 0; i < 128; ++i) b[16 + i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
    float out[256];
    dequant_row_q4_k(b, 256, out);
    for (int k = 0; k < 256; ++k) {
        const int s = k / 32, l = k % 32, q = s % 2 ? 15 - l % 16 : l % 16;
        EXPECT_EQ(out[k], float(kK4Sc[s] * q) - 0.5f * float(kK4Min[s])) << k;
    }
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_EQ(out[32], 27.5f);    // 2 * 15 - 0.5 * 5
    EXPECT_EQ(out[133], 157.0f);  // 33 * 5 - 0.5 * 16
    EXPECT_EQ(out[255], -24.0f);  // 63 * 0 - 0.5 * 48
}

// q5_k: the q4_k block above plus qh: qh[l] = 0x0f for l < 16, 0xf0 for l >= 16, so bit 4 of the
// code is set in sub-blocks 0-3 for l < 16 and in sub-blocks 4-7 for l >= 16.
TEST(Dequant, Q5_KHandBlock) {
    uint8_t b[176] = {};
    b[0] = 0x00, b[1] = 0x3c;  // d = 1
    b[2] = 0x00, b[3] = 0x38;  // dmin = 0.5
    std::memcpy(b + 4, kK4Scales, 12);
    for (int l = 0; l < 32; ++l) b[16 + l] = l < 16 ? 0x0f : 0xf0;
    for (int i = 0; i < 128; ++i) b[48 + i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
    float out[256];
    dequant_row_q5_k(b, 256, out);
    for (int k = 0; k < 256; ++k) {
        const int s = k / 32, l = k % 32;
        const int q = (s % 2 ? 15 - l % 16 : l % 16) + ((s < 4) == (l < 16) ? 16 : 0);
        EXPECT_EQ(out[k], float(kK4Sc[s] * q) - 0.5f * float(kK4Min[s])) << k;
    }
    EXPECT_EQ(out[0], 16.0f);     // 1 * 16
    EXPECT_EQ(out[128], -8.0f);   // 33 * 0 - 0.5 * 16
    EXPECT_EQ(out[255], 984.0f);  // 63 * 16 - 0.5 * 48
}

// One q6_k super-block: ql[64h + i] = (i & 15) | ((i + 1) & 15) << 4, every qh byte 0xe4 (bits
// 2p..2p+1 = p), scales sc[i] = i - 8, d = 0.5. Element 128h + 32p + l: low 4 bits from
// ql[64h + l + 32 (p & 1)] (low nibble for p < 2), high 2 bits p, value d * sc[8h + 2p + l / 16] *
// (code - 32).
TEST(Dequant, Q6_KHandBlock) {
    uint8_t b[210] = {};
    for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 64; ++i) b[64 * h + i] = static_cast<uint8_t>((i & 15) | (((i + 1) & 15) << 4));
    for (int i = 0; i < 64; ++i) b[128 + i] = 0xe4;
    for (int i = 0; i < 16; ++i) b[192 + i] = static_cast<uint8_t>(i - 8);
    b[208] = 0x00, b[209] = 0x38;  // d = 0.5
    float out[256];
    dequant_row_q6_k(b, 256, out);
    for (int k = 0; k < 256; ++k) {
        const int h = k / 128, p = (k % 128) / 32, l = k % 32;
        const int low = p < 2 ? (l & 15) : ((l + 1) & 15);  // (l + 32) & 15 == l & 15
        const int code = low + 16 * p, sc = 8 * h + 2 * p + l / 16 - 8;
        EXPECT_EQ(out[k], 0.5f * float(sc) * float(code - 32)) << k;
    }
    EXPECT_EQ(out[0], 128.0f);  // 0.5 * -8 * (0 - 32)
    EXPECT_EQ(out[209], 5.0f);  // h 1, p 2, l 17: code 2 + 32, scale 13 - 8 = 5
    EXPECT_EQ(out[255], 56.0f);  // h 1, p 3, l 31: code 0 + 48, scale 15 - 8 = 7
}

TEST(Dequant, Nvfp4HandRow) {
    // K = 32: two blocks. Byte j holds element 2j (low nibble) and 2j+1 (high nibble).
    uint8_t packed[16], scale[2] = {0x38 /* 1.0 */, 0x40 /* 2.0 */};
    for (int j = 0; j < 16; ++j) packed[j] = static_cast<uint8_t>((j & 15) | (((j + 3) & 15) << 4));
    const uint16_t global = 0x3400;  // 0.25
    float out[32];
    dequant_row_nvfp4(packed, scale, global, 32, out);
    for (int j = 0; j < 16; ++j) {
        const float s = j < 8 ? 1.0f : 2.0f;
        EXPECT_EQ(out[2 * j], e2m1_to_f32(static_cast<uint8_t>(j)) * s * 0.25f) << j;
        EXPECT_EQ(out[2 * j + 1], e2m1_to_f32(static_cast<uint8_t>((j + 3) & 15)) * s * 0.25f) << j;
    }
    EXPECT_EQ(out[14], 6.0f * 0.25f);   // code 7 in block 0
    EXPECT_EQ(out[31], 1.0f * 2.0f * 0.25f);  // byte 15 high nibble: (15 + 3) & 15 = 2 -> 1.0, block 1
}

TEST(Dequant, DsFp4HandRow) {
    uint8_t packed[32], scale[2] = {127, 125};  // 1.0, 0.25
    for (int j = 0; j < 32; ++j) packed[j] = static_cast<uint8_t>(0x9 | (0x6 << 4));  // -0.5, 4
    float out[64];
    dequant_row_ds_fp4(packed, scale, 64, out);
    for (int k = 0; k < 64; ++k) {
        const float s = k < 32 ? 1.0f : 0.25f;
        EXPECT_EQ(out[k], (k % 2 ? 4.0f : -0.5f) * s) << k;
    }
}

TEST(Dequant, Fp8BlockHandRow) {
    std::vector<uint8_t> row(256);
    for (int k = 0; k < 256; ++k) row[k] = static_cast<uint8_t>(k % 2 ? 0x38 : 0xc0);  // 1.0, -2.0
    const uint16_t band[2] = {f32_to_bf16(0.125f), f32_to_bf16(3.0f)};
    float out[256];
    dequant_row_fp8_block(row.data(), band, 256, out);
    for (int k = 0; k < 256; ++k) EXPECT_EQ(out[k], (k % 2 ? 1.0f : -2.0f) * (k < 128 ? 0.125f : 3.0f)) << k;
}

TEST(Dequant, Mxfp4ColumnOrientation) {
    // K = 64, N = 3: blocks[K/2][N], scales[K/32][N]; unit n's element k is nibble k&1 of
    // blocks[k/2][n].
    const int K = 64, N = 3;
    std::vector<uint8_t> blocks(K / 2 * N), scales(K / 32 * N);
    for (int kb = 0; kb < K / 2; ++kb)
        for (int n = 0; n < N; ++n) blocks[kb * N + n] = static_cast<uint8_t>(((kb + n) & 7) | (((kb * 3 + n) & 15) << 4));
    for (int s = 0; s < K / 32; ++s)
        for (int n = 0; n < N; ++n) scales[s * N + n] = static_cast<uint8_t>(125 + s + n);
    for (int n = 0; n < N; ++n) {
        float out[64];
        dequant_col_mxfp4(blocks.data(), scales.data(), K, N, n, out);
        for (int k = 0; k < K; ++k) {
            const int kb = k / 2;
            const uint8_t code = k % 2 ? static_cast<uint8_t>((kb * 3 + n) & 15) : static_cast<uint8_t>((kb + n) & 7);
            EXPECT_EQ(out[k], e2m1_to_f32(code) * std::ldexp(1.0f, 125 + k / 32 + n - 127)) << n << "," << k;
        }
    }
}

// The Q8 rule per block (quantize_q8_0: 32, quantize_q8_k: 256) on random blocks, one block of tiny
// values (still full scale) and, where inf_block >= 0, one holding +Inf (zero codes, scale NaN,
// its neighbours untouched): d = amax / 127, each code the rounded, clamped x * (1 / d).
void check_q8_blocks(int block, void (*quantize)(const float *, int64_t, int8_t *, float *), int inf_block) {
    const int nb = 6, K = block * nb;
    std::vector<float> x(K);
    for (float &v : x) v = uniform(-3.0f, 3.0f);
    for (int i = 0; i < block; ++i) x[2 * block + i] *= 1e-6f;
    if (inf_block >= 0) x[inf_block * block + 17] = std::numeric_limits<float>::infinity();
    std::vector<int8_t> q(K);
    std::vector<float> d(nb);
    quantize(x.data(), K, q.data(), d.data());
    for (int b = 0; b < nb; ++b) {
        if (b == inf_block) {
            EXPECT_TRUE(std::isnan(d[b]));
            for (int i = 0; i < block; ++i) EXPECT_EQ(q[b * block + i], 0);
            continue;
        }
        float amax = 0;
        for (int i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b * block + i]));
        EXPECT_EQ(d[b], amax / 127.0f);
        int qmax = 0;
        for (int i = 0; i < block; ++i) {
            const int k = b * block + i;
            qmax = std::max(qmax, std::abs(static_cast<int>(q[k])));
            EXPECT_LE(std::fabs(x[k] - q[k] * d[b]), d[b] * 0.5f * 1.001f) << k;
            EXPECT_EQ(q[k], static_cast<int8_t>(std::clamp(round_half_away(x[k] * (1.0f / d[b])), -127.0f, 127.0f))) << k;
        }
        EXPECT_EQ(qmax, 127);
    }
}

TEST(Quantize, Q8_0Bounds) { check_q8_blocks(32, quantize_q8_0, 4); }

TEST(Quantize, Q8_KBoundsAndNonFinite) { check_q8_blocks(256, quantize_q8_k, 4); }

TEST(Quantize, Q8_0RoundingAndZeros) {
    float x[64] = {};
    x[0] = 127.0f;  // d = 1 exactly
    x[1] = 2.5f;
    x[2] = -2.5f;
    x[3] = 0.5f;
    x[4] = -0.49f;
    int8_t q[64];
    float d[2];
    quantize_q8_0(x, 64, q, d);
    EXPECT_EQ(d[0], 1.0f);
    EXPECT_EQ(q[0], 127);
    EXPECT_EQ(q[1], 3);   // half away from zero
    EXPECT_EQ(q[2], -3);
    EXPECT_EQ(q[3], 1);
    EXPECT_EQ(q[4], 0);
    EXPECT_EQ(d[1], 1.0f);  // an all-zero block: d = 1, q = 0
    for (int i = 32; i < 64; ++i) EXPECT_EQ(q[i], 0);
}

TEST(Quantize, Int8Per16EvenOddLayout) {
    const int K = 64;
    std::vector<float> x(K);
    for (float &v : x) v = uniform(-1.0f, 1.0f);
    std::vector<int8_t> q(K);
    std::vector<float> d(K / 16);
    quantize_int8_per16(x.data(), K, q.data(), d.data());
    for (int b = 0; b < K / 16; ++b) {
        float amax = 0;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[b * 16 + i]));
        EXPECT_EQ(d[b], amax / 127.0f);
        for (int i = 0; i < 8; ++i) {
            EXPECT_EQ(q[b * 16 + i], static_cast<int8_t>(std::clamp(round_half_away(x[b * 16 + 2 * i] * (1.0f / d[b])), -127.0f, 127.0f)));
            EXPECT_EQ(q[b * 16 + 8 + i],
                      static_cast<int8_t>(std::clamp(round_half_away(x[b * 16 + 2 * i + 1] * (1.0f / d[b])), -127.0f, 127.0f)));
            EXPECT_LE(std::fabs(x[b * 16 + 2 * i + 1] - q[b * 16 + 8 + i] * d[b]), d[b] * 0.5f * 1.001f);
        }
    }
}

TEST(Quantize, Fp8RoundTripHandValues) {
    std::vector<float> x(128, 0.0f), y(128);
    x[0] = 3.5f;   // amax / 448 = 2^-7 exactly: s = 2^-7, 3.5 -> 448 -> 3.5
    x[1] = 1.0f;   // 128 -> 1.0
    x[2] = 0.3f;   // 38.4 -> 40 (step 4 in [32, 64)) -> 0.3125
    x[3] = -0.3f;
    fp8_round_trip_per128(x.data(), 128, y.data());
    EXPECT_EQ(y[0], 3.5f);
    EXPECT_EQ(y[1], 1.0f);
    EXPECT_EQ(y[2], 0.3125f);
    EXPECT_EQ(y[3], -0.3125f);
    EXPECT_EQ(y[4], 0.0f);
    x[0] = 3.6f;   // mantissa of amax/448 non-zero: s = 2^-6; 3.6 -> 230.4 -> 224 (step 32) -> 3.5
    fp8_round_trip_per128(x.data(), 128, y.data());
    EXPECT_EQ(y[0], 3.5f);
    EXPECT_EQ(y[2], 0.3125f);  // 19.2 -> 20 (step 2 in [16, 32)) -> 0.3125
    // All zeros: amax floors at 1e-4, zeros stay zeros.
    std::vector<float> z(128, 0.0f);
    fp8_round_trip_per128(z.data(), 128, y.data());
    for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(Quantize, Fp8RoundTripBounds) {
    const int K = 128 * 32;
    std::vector<float> x(K), y(K);
    for (int g = 0; g < K / 128; ++g) {
        const float mag = std::ldexp(1.0f, static_cast<int>(rng()() % 24) - 12);
        for (int i = 0; i < 128; ++i) x[g * 128 + i] = uniform(-mag, mag);
    }
    fp8_round_trip_per128(x.data(), K, y.data());
    for (int g = 0; g < K / 128; ++g) {
        float amax = 0;
        for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(x[g * 128 + i]));
        for (int i = 0; i < 128; ++i) {
            const int k = g * 128 + i;
            EXPECT_EQ(y[k], bf16_to_f32(f32_to_bf16(y[k])));  // stored bf16
            // e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normals; below the normal
            // range of the scaled value the absolute step is 2^-9 * s, with s < 2 amax / 448.
            const float tol = std::max(std::fabs(x[k]) * 0.0625f, amax / 224.0f * std::ldexp(1.0f, -10));
            EXPECT_LE(std::fabs(y[k] - x[k]), tol * 1.01f) << k;
        }
    }
}

}  // namespace
}  // namespace ft
