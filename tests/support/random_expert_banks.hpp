// Random but valid expert banks of one layer in any format (random_banks.hpp's generator), with
// their fp64-reference dequantisation. Optionally followed by slots filled with 0xFF bytes, which is NaN
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
#include "random_banks.hpp"

namespace ft::test {

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

    // Valid codes for expert x (the shared generator, random_banks.hpp).
    void fix_expert(std::mt19937 &rng, int32_t x) {
        uint8_t *rows[8];
        for (size_t b = 0; b < schema.size(); ++b) rows[b] = banks[b].data() + x * schema[b].row_bytes;
        make_valid_expert(f, schema, rows, H, I, rng);
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

// Exact q * d (in double) of x[0..K) in the integer-dot kernels' activation of a block format
// (ft::format_act_block): Q8_0 (ft::quantize_q8_0, per 32) for q4_0 and q8_0, Q8_K
// (ft::quantize_q8_k, per 256) for the super-block formats (q2_k .. q6_k, iq4_xs).
inline std::vector<double> cpu_block_activation(Format f, const float *x, int64_t K) {
    const int64_t block = ft::format_act_block(f);
    std::vector<int8_t> q(static_cast<size_t>(K));
    std::vector<float> d(static_cast<size_t>(K / block));
    if (block == 256) ft::quantize_q8_k(x, K, q.data(), d.data());
    else ft::quantize_q8_0(x, K, q.data(), d.data());
    std::vector<double> v(static_cast<size_t>(K));
    for (int64_t i = 0; i < K; ++i) v[size_t(i)] = double(q[size_t(i)]) * double(d[size_t(i / block)]);
    return v;
}

// x through that activation and back, q * d rounded to float: the activation rounding of the
// block formats' integer-dot kernels, for FormatNumerics' in / mid round trips.
inline void cpu_block_round_trip(Format f, const float *x, int64_t K, float *y) {
    const std::vector<double> v = cpu_block_activation(f, x, K);
    for (int64_t i = 0; i < K; ++i) y[i] = float(v[size_t(i)]);
}

// The numerics of kernels that quantise both passes' inputs (the block formats' CPU rule): the
// expert input in the gate/up format's activation, the intermediate in the down format's.
inline FormatNumerics cpu_block_numerics(Format gate_up, Format down) {
    FormatNumerics n;
    n.in_round_trip = [gate_up](const float *x, int64_t K, float *y) { cpu_block_round_trip(gate_up, x, K, y); };
    n.mid_round_trip = [down](const float *x, int64_t K, float *y) { cpu_block_round_trip(down, x, K, y); };
    return n;
}
inline FormatNumerics cpu_block_numerics(Format f) { return cpu_block_numerics(f, f); }

}  // namespace ft::test
