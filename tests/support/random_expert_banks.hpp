// Random but valid expert banks of one layer in any format, with their fp64-reference
// dequantisation: fp4 codes uniform, scales from the ranges real quantisers produce (no NaN codes,
// e8m0 scales near 2^0 scaled so outputs stay O(1), finite fp16 globals), with e8m0 code 0 and
// e4m3 subnormal scales mixed in. Optionally followed by slots filled with 0xFF bytes, which is NaN
// in every element and scale encoding (bf16, fp16, e4m3, e8m0): routes must never read them.
// Shared by the CPU kernel tests and the GPU decode tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "ft/dequant.hpp"
#include "ft/formats.hpp"
#include "moe_reference.hpp"

namespace ft::testing {

namespace detail {
inline void put_u16(uint8_t *p, uint16_t v) { std::memcpy(p, &v, 2); }
}  // namespace detail

// E experts (slots 0..E-1) then `poisoned_slots` NaN-filled slots in every bank.
struct RandomExpertLayer {
    Format f;
    int32_t H, I, E;
    std::vector<BankSpec> schema;
    std::vector<std::vector<uint8_t>> banks;
    std::vector<std::vector<float>> gate, up, down, bgate, bup, bdown;  // per expert, dequantised

    RandomExpertLayer(std::mt19937 &rng, Format fmt, int32_t h, int32_t i, int32_t e, int32_t poisoned_slots = 0)
        : f(fmt), H(h), I(i), E(e) {
        schema = bank_schema(f, H, I);
        std::uniform_int_distribution<int> byte(0, 255);
        for (const auto &b : schema) {
            std::vector<uint8_t> v(b.row_bytes * (E + poisoned_slots));
            for (auto &x : v) x = uint8_t(byte(rng));
            std::fill(v.begin() + b.row_bytes * E, v.end(), uint8_t(0xff));
            banks.push_back(std::move(v));
        }
        for (int32_t x = 0; x < E; ++x) fix_expert(rng, x);
        for (int32_t x = 0; x < E; ++x) {
            const uint8_t *rows[8];
            for (size_t b = 0; b < schema.size(); ++b) rows[b] = banks[b].data() + x * schema[b].row_bytes;
            auto proj = [&](int p, size_t n) {
                std::vector<float> o(n);
                dequant_projection(f, rows, H, I, p, o.data());
                return o;
            };
            gate.push_back(proj(FT_PROJ_GATE, size_t(I) * H));
            up.push_back(proj(FT_PROJ_UP, size_t(I) * H));
            down.push_back(proj(FT_PROJ_DOWN, size_t(H) * I));
            std::vector<float> bg(I), bu(I), bd(H);
            if (projection_bias(f, rows, H, I, FT_PROJ_GATE, bg.data())) {
                projection_bias(f, rows, H, I, FT_PROJ_UP, bu.data());
                projection_bias(f, rows, H, I, FT_PROJ_DOWN, bd.data());
                bgate.push_back(bg), bup.push_back(bu), bdown.push_back(bd);
            }
        }
    }

    // Valid codes from the ranges real quantisers produce (no NaN codes, e8m0 scales near 2^0
    // scaled so outputs stay O(1), finite fp16 globals), with e8m0 0 and e4m3 subnormals mixed in.
    void fix_expert(std::mt19937 &rng, int32_t x) {
        auto row = [&](int b) { return banks[b].data() + x * schema[b].row_bytes; };
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

    cpu::ExpertSource cpu_source() const {
        cpu::ExpertSource s;
        s.format = f;
        s.num_experts = E;
        s.num_banks = int(schema.size());
        for (size_t b = 0; b < schema.size(); ++b) {
            s.base[b] = banks[b].data();
            s.row_bytes[b] = schema[b].row_bytes;
        }
        return s;
    }

    ExpertF32 expert(int32_t e) const {
        ExpertF32 x{gate[e].data(), up[e].data(), down[e].data()};
        if (!bgate.empty()) x.bias_gate = bgate[e].data(), x.bias_up = bup[e].data(), x.bias_down = bdown[e].data();
        return x;
    }
};

}  // namespace ft::testing
