// Random but valid expert banks of every format for the prefill test and benchmark: fp4 codes
// uniform, scales in ranges that keep activations O(1), no NaN codes (the unused, NaN-filled
// slot is made separately). Host-side only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ft/dequant.hpp"
#include "ft/formats.hpp"

namespace ft::testing {

inline uint16_t bf16_bits(float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    b += 0x7fffu + ((b >> 16) & 1u);
    return uint16_t(b >> 16);
}

// Fills one expert's row of bank `name` (row_bytes bytes) of format f with valid random data.
inline void fill_bank_row(Format f, const std::string &name, uint8_t *row, size_t bytes, std::mt19937 &rng) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    auto put16 = [&](size_t i, uint16_t v) { row[i] = uint8_t(v & 0xff), row[i + 1] = uint8_t(v >> 8); };
    const bool scale = name.find("scale") != std::string::npos;
    if (name.find("global") != std::string::npos) {  // nvfp4 fp16 per-row global, 0.01 .. 0.03
        for (size_t i = 0; i + 1 < bytes; i += 2) put16(i, f32_to_f16(0.01f + 0.01f * (uni(rng) + 1.0f)));
    } else if (name.find("bias") != std::string::npos) {  // mxfp4 bf16 bias, +-0.2
        for (size_t i = 0; i + 1 < bytes; i += 2) put16(i, bf16_bits(0.2f * uni(rng)));
    } else if (f == Format::bf16) {
        for (size_t i = 0; i + 1 < bytes; i += 2) put16(i, bf16_bits(0.1f * uni(rng)));
    } else if (f == Format::fp8_block) {
        if (scale)  // bf16 scale_inv 2^-6 .. 2^-5
            for (size_t i = 0; i + 1 < bytes; i += 2) put16(i, bf16_bits(0.015625f * (1.5f + 0.5f * uni(rng))));
        else  // e4m3 with exponent field 4..9: |w| in [2^-3, 3.75], never NaN
            for (size_t i = 0; i < bytes; ++i) row[i] = uint8_t((byte(rng) & 0x87) | ((4 + byte(rng) % 6) << 3));
    } else if (f == Format::nvfp4 && scale) {  // e4m3 block scales 0.25 .. 3.75
        for (size_t i = 0; i < bytes; ++i) row[i] = uint8_t((byte(rng) & 0x07) | ((5 + byte(rng) % 4) << 3));
    } else if ((f == Format::mxfp4 || f == Format::ds_fp4) && scale) {  // e8m0 2^-6 .. 2^-3
        for (size_t i = 0; i < bytes; ++i) row[i] = uint8_t(121 + byte(rng) % 4);
    } else if (f == Format::q4_0) {  // 18-byte blocks: fp16 d in 0.005 .. 0.015, random nibbles
        for (size_t i = 0; i < bytes; ++i) row[i] = uint8_t(byte(rng));
        for (size_t i = 0; i + kQ4_0BlockBytes <= bytes; i += kQ4_0BlockBytes)
            put16(i, f32_to_f16(0.01f + 0.005f * uni(rng)));
    } else {  // fp4 codes: every byte is valid
        for (size_t i = 0; i < bytes; ++i) row[i] = uint8_t(byte(rng));
    }
}

}  // namespace ft::testing
