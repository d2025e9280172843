// The random expert generator of the test suites and benchmarks: random but valid bank rows of one
// expert in any format. fp4 codes are uniform; scales come from the ranges real quantisers produce
// (no NaN codes, e8m0 scales near 2^0 scaled so outputs stay O(1), finite fp16 globals), with e8m0
// code 0 and e4m3 subnormal scales mixed in. Host-side only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "ft/formats.hpp"

namespace ft::test {

namespace detail {
inline void put_u16(uint8_t *p, uint16_t v) { std::memcpy(p, &v, 2); }
}  // namespace detail

// GGUF block formats: gives the fp16 d (and dmin) fields of every block of one row of K elements
// finite values of size about 1 / (typical |code x sub-block scale| * sqrt(K)), so the weights
// are O(1 / sqrt(K)); the other bytes stay as they are (every code and scale byte is valid).
inline void fix_block_fp16(Format f, uint8_t *row, int64_t K, std::mt19937 &rng) {
    int d_at = 0, dmin_at = -1;
    double typical = 1.0;
    switch (f) {
        case Format::q4_0: typical = 8; break;
        case Format::q8_0: typical = 64; break;
        case Format::q2_k: d_at = 80, dmin_at = 82, typical = 12; break;
        case Format::q3_k: d_at = 108, typical = 64; break;
        case Format::q4_k: dmin_at = 2, typical = 256; break;
        case Format::q5_k: dmin_at = 2, typical = 512; break;
        case Format::q6_k: d_at = 208, typical = 1024; break;
        case Format::iq4_xs: typical = 1024; break;
        default: return;
    }
    const double base = 1.0 / (typical * std::sqrt(double(K)));
    std::uniform_real_distribution<float> d(float(0.5 * base), float(base));
    const size_t bb = size_t(block_bytes(f));
    for (size_t i = 0; i < block_row_bytes(f, K); i += bb) {
        detail::put_u16(row + i + d_at, f32_to_f16(d(rng)));
        if (dmin_at >= 0) detail::put_u16(row + i + dmin_at, f32_to_f16(d(rng)));
    }
}

// Turns random bytes in one expert's rows (rows[b]: schema[b].row_bytes bytes of bank b) into valid
// data of format f for an H x I expert.
inline void make_valid_expert(Format f, const std::vector<BankSpec> &schema, uint8_t *const *rows, int32_t H,
                              int32_t I, std::mt19937 &rng) {
    auto row = [&](int b) { return rows[b]; };
    auto len = [&](int b) { return schema[b].row_bytes; };
    std::uniform_int_distribution<int> coin(0, 15);
    auto e8m0_fill = [&](int b, int64_t K) {
        const int center = 127 - int(std::lround(std::log2(std::sqrt(double(K))))) - 2;
        std::uniform_int_distribution<int> c(center - 1, center + 1);
        for (size_t i = 0; i < len(b); ++i) row(b)[i] = coin(rng) == 0 ? 0 : uint8_t(c(rng));
    };
    auto bf16_fill = [&](int b, double mag) {
        std::uniform_real_distribution<float> d(float(mag) * 0.5f, float(mag));
        for (size_t i = 0; i < len(b); i += 2)
            detail::put_u16(row(b) + i, f32_to_bf16(d(rng) * (coin(rng) & 1 ? 1.0f : -1.0f)));
    };
    switch (f) {
        case Format::bf16: {
            std::normal_distribution<float> d(0.0f, 1.0f);
            const float sg = float(1.0 / std::sqrt(double(H))), sd = float(1.0 / std::sqrt(double(I)));
            for (size_t i = 0; i < len(0); i += 2) detail::put_u16(row(0) + i, f32_to_bf16(d(rng) * sg));
            for (size_t i = 0; i < len(1); i += 2) detail::put_u16(row(1) + i, f32_to_bf16(d(rng) * sd));
            break;
        }
        case Format::fp8_block:
            for (int b : {0, 2})
                for (size_t i = 0; i < len(b); ++i)
                    if ((row(b)[i] & 0x7f) == 0x7f) row(b)[i] ^= 1;  // no NaN codes
            bf16_fill(1, 1.0 / (40 * std::sqrt(double(H))));
            bf16_fill(3, 1.0 / (40 * std::sqrt(double(I))));
            break;
        case Format::nvfp4: {
            std::uniform_int_distribution<int> c(0x02, 0x40);  // subnormal to 2.0
            for (int b : {1, 4})
                for (size_t i = 0; i < len(b); ++i) row(b)[i] = uint8_t(c(rng));
            for (int b : {2, 5})
                for (size_t i = 0; i < len(b); i += 2)
                    detail::put_u16(row(b) + i, f32_to_f16(float(0.3 / std::sqrt(double(b == 2 ? H : I)))));
            break;
        }
        case Format::mxfp4:
            e8m0_fill(1, H);
            e8m0_fill(4, I);
            bf16_fill(2, 0.1);
            bf16_fill(5, 0.1);
            break;
        case Format::ds_fp4:
            e8m0_fill(1, H);
            e8m0_fill(3, I);
            break;
        case Format::q8_0:
        case Format::q2_k:
        case Format::q3_k:
        case Format::q4_k:
        case Format::q5_k:
        case Format::q6_k:
        case Format::iq4_xs:
            for (int64_t r = 0; r < 2 * I; ++r) fix_block_fp16(f, row(0) + r * block_row_bytes(f, H), H, rng);
            for (int64_t r = 0; r < H; ++r) fix_block_fp16(f, row(1) + r * block_row_bytes(f, I), I, rng);
            break;
        case Format::q4_0:
            for (int b : {0, 1}) {
                const int64_t K = b == 0 ? H : I;
                std::uniform_real_distribution<float> d(0.02f / float(std::sqrt(double(K))),
                                                        0.1f / float(std::sqrt(double(K))));
                for (size_t i = 0; i < len(b); i += 18) detail::put_u16(row(b) + i, f32_to_f16(d(rng)));
            }
            break;
    }
}

// Fills one expert's rows with random bytes, then makes them valid (make_valid_expert).
inline void fill_random_expert(Format f, const std::vector<BankSpec> &schema, uint8_t *const *rows, int32_t H,
                               int32_t I, std::mt19937 &rng) {
    std::uniform_int_distribution<int> byte(0, 255);
    for (size_t b = 0; b < schema.size(); ++b)
        for (size_t i = 0; i < schema[b].row_bytes; ++i) rows[b][i] = uint8_t(byte(rng));
    make_valid_expert(f, schema, rows, H, I, rng);
}

}  // namespace ft::test
