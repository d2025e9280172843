#include "ft/dequant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ft/common.hpp"

namespace ft {

namespace {

// Round to nearest, ties to even, independent of the floating-point rounding mode. Only called
// on values whose scaling was exact (power-of-two steps), so the fraction test is exact too.
float rne(float x) {
    const float r = std::floor(x);
    const float diff = x - r;
    if (diff > 0.5f) return r + 1.0f;
    if (diff < 0.5f) return r;
    return std::fmod(r, 2.0f) == 0.0f ? r : r + 1.0f;
}

constexpr float kE2m1Magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

}  // namespace

float e2m1_to_f32(uint8_t code) {
    const float m = kE2m1Magnitude[code & 7u];
    return (code & 8u) ? -m : m;
}

uint8_t f32_to_e2m1(float v) {
    if (std::isnan(v)) return 0;
    const uint8_t sign = std::signbit(v) ? 8 : 0;
    const float a = std::fabs(v);
    uint8_t best = 0;
    for (uint8_t c = 1; c < 8; ++c) {
        const float dc = std::fabs(a - kE2m1Magnitude[c]), db = std::fabs(a - kE2m1Magnitude[best]);
        // Strictly closer wins; on a tie the even code (mantissa bit 0) wins.
        if (dc < db || (dc == db && (c & 1u) == 0)) best = c;
    }
    return static_cast<uint8_t>(sign | best);
}

float e4m3_to_f32(uint8_t v) {
    const bool neg = (v & 0x80u) != 0;
    const int exp = (v >> 3) & 0xf;
    const int man = v & 0x7;
    if (exp == 15 && man == 7) return std::nanf("");
    const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                               : std::ldexp(static_cast<float>(8 + man), exp - 10);
    return neg ? -mag : mag;
}

uint8_t f32_to_e4m3(float v) {
    if (std::isnan(v)) return 0x7f;
    const uint8_t sign = std::signbit(v) ? 0x80 : 0;
    float a = std::min(std::fabs(v), 448.0f);
    if (a < std::ldexp(1.0f, -6)) {
        // Subnormal range: multiples of 2^-9; rounding up to 8 * 2^-9 lands exactly on the
        // smallest normal, whose code (exp 1, man 0) is 0x08 as well.
        const int m = static_cast<int>(rne(a * 512.0f));
        return static_cast<uint8_t>(sign | m);
    }
    int e2;
    std::frexp(a, &e2);  // a = f * 2^e2, f in [0.5, 1)
    int E = e2 - 1;
    int m = static_cast<int>(rne(std::ldexp(a, 3 - E)));  // in [8, 16]
    if (m == 16) {
        m = 8;
        ++E;
    }
    // a <= 448 = 1.75 * 2^8, so E <= 8 and the saturated case cannot produce the NaN code.
    return static_cast<uint8_t>(sign | ((E + 7) << 3) | (m - 8));
}

float e8m0_to_f32(uint8_t s) {
    if (s == 255) return std::nanf("");
    return std::ldexp(1.0f, static_cast<int>(s) - 127);
}

uint16_t f32_to_f16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00);
    if (a >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to infinity
    if (a < 0x38800000u) {                       // below 2^-14: subnormal, units of 2^-24
        float v;
        std::memcpy(&v, &a, 4);
        return sign | static_cast<uint16_t>(rne(v * 16777216.0f));
    }
    uint32_t h = ((((a >> 23) - 127 + 15) << 10) | ((a & 0x7fffffu) >> 13));
    const uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
    return sign | static_cast<uint16_t>(h);
}

// ---- rows ------------------------------------------------------------------------------------

void dequant_row_fp8_block(const uint8_t *row, const uint16_t *scale_inv_band, int64_t K, float *out) {
    for (int64_t k = 0; k < K; ++k) out[k] = e4m3_to_f32(row[k]) * bf16_to_f32(scale_inv_band[k / kFp8Block]);
}

void dequant_row_nvfp4(const uint8_t *packed, const uint8_t *scale, uint16_t global_f16, int64_t K, float *out) {
    const float g = f16_to_f32(global_f16);
    for (int64_t k = 0; k < K; ++k) {
        const uint8_t byte = packed[k / 2];
        const uint8_t code = (k & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xf);
        out[k] = e2m1_to_f32(code) * e4m3_to_f32(scale[k / kNvfp4Block]) * g;
    }
}

void dequant_row_ds_fp4(const uint8_t *packed, const uint8_t *scale, int64_t K, float *out) {
    for (int64_t k = 0; k < K; ++k) {
        const uint8_t byte = packed[k / 2];
        const uint8_t code = (k & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xf);
        out[k] = e2m1_to_f32(code) * e8m0_to_f32(scale[k / kDsfp4Block]);
    }
}

void dequant_row_q4_0(const uint8_t *blocks, int64_t K, float *out) {
    for (int64_t b = 0; b < K / kQ4_0Block; ++b) {
        const uint8_t *blk = blocks + b * kQ4_0BlockBytes;
        const float d = f16_to_f32(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
        const uint8_t *qs = blk + 2;
        float *o = out + b * kQ4_0Block;
        for (int j = 0; j < 16; ++j) {
            o[j] = static_cast<float>(static_cast<int>(qs[j] & 0xf) - 8) * d;
            o[j + 16] = static_cast<float>(static_cast<int>(qs[j] >> 4) - 8) * d;
        }
    }
}

void dequant_col_mxfp4(const uint8_t *blocks, const uint8_t *scales, int64_t K, int64_t N, int64_t n, float *out) {
    for (int64_t k = 0; k < K; ++k) {
        const uint8_t byte = blocks[(k / 2) * N + n];
        const uint8_t code = (k & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xf);
        out[k] = e2m1_to_f32(code) * e8m0_to_f32(scales[(k / kMxfp4Block) * N + n]);
    }
}

// ---- activation quantisers -------------------------------------------------------------------

float round_half_away(float v) { return std::round(v); }

namespace {

// One block of the Q8_0 rule; `order[i]` is the source index of output i. A block holding NaN
// or +-Inf gets all-zero codes and scale NaN, so every dot product that uses it is NaN.
void quantize_block_int8(const float *x, const int *order, int n, int8_t *q, float *d) {
    float amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < n; ++i) {
        finite &= std::isfinite(x[i]);
        amax = std::max(amax, std::fabs(x[i]));
    }
    if (!finite) {
        std::memset(q, 0, static_cast<size_t>(n));
        *d = std::numeric_limits<float>::quiet_NaN();
        return;
    }
    const float scale = amax >= kQ8MinAmax ? amax / 127.0f : 1.0f;
    const float inv = 1.0f / scale;
    for (int i = 0; i < n; ++i) {
        const float r = round_half_away(x[order[i]] * inv);
        q[i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
    *d = scale;
}

}  // namespace

void quantize_q8_0(const float *x, int64_t K, int8_t *q, float *d) {
    int order[32];
    for (int i = 0; i < 32; ++i) order[i] = i;
    for (int64_t b = 0; b < K / 32; ++b) quantize_block_int8(x + b * 32, order, 32, q + b * 32, d + b);
}

void quantize_q8_k(const float *x, int64_t K, int8_t *q, float *d) {
    int order[256];
    for (int i = 0; i < 256; ++i) order[i] = i;
    for (int64_t b = 0; b < K / 256; ++b) quantize_block_int8(x + b * 256, order, 256, q + b * 256, d + b);
}

void quantize_int8_per16(const float *x, int64_t K, int8_t *q, float *d) {
    int order[16];
    for (int i = 0; i < 8; ++i) {
        order[i] = 2 * i;
        order[8 + i] = 2 * i + 1;
    }
    for (int64_t b = 0; b < K / 16; ++b) quantize_block_int8(x + b * 16, order, 16, q + b * 16, d + b);
}

float round_e4m3(float v) { return e4m3_to_f32(f32_to_e4m3(v)); }

void fp8_round_trip_per128(const float *x, int64_t K, float *y) {
    for (int64_t g = 0; g < K / kFp8ActBlock; ++g) {
        const float *xs = x + g * kFp8ActBlock;
        float *ys = y + g * kFp8ActBlock;
        float amax = 0.0f;
        for (int i = 0; i < kFp8ActBlock; ++i) amax = std::max(amax, std::fabs(xs[i]));
        amax = std::max(amax, 1e-4f);
        const float r = amax / 448.0f;
        uint32_t bits;
        std::memcpy(&bits, &r, 4);
        const int e = static_cast<int>((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0 ? 1 : 0);
        const float s = std::ldexp(1.0f, e);
        for (int i = 0; i < kFp8ActBlock; ++i) {
            const float c = std::clamp(xs[i] / s, -448.0f, 448.0f);
            ys[i] = bf16_to_f32(f32_to_bf16(round_e4m3(c) * s));
        }
    }
}

}  // namespace ft
