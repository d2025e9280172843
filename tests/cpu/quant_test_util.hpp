// Shared pieces of the quantised-format CPU tests (test_quant_moe.cpp, test_quant_kernels.cpp):
// the ISA tiers this CPU runs, a random quantised expert layer and a random routed batch.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "ft/formats.hpp"
#include "random_expert_banks.hpp"

namespace quant_test {

using ft::Format;
using ft::cpu::Isa;

inline std::vector<Isa> tiers_here() {
    std::vector<Isa> t;
    for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16})
        if (int(i) <= int(ft::cpu::cpu_best_isa())) t.push_back(i);
    return t;
}

inline void put_u16(uint8_t *p, uint16_t v) { std::memcpy(p, &v, 2); }

using QLayer = ft::test::RandomExpertLayer;

struct Batch {
    int32_t T, K;
    std::vector<uint16_t> x;
    std::vector<int32_t> ids;
    std::vector<float> w;
};

// Ids outside [0, E) mixed in, a duplicate id in token 0, and (T >= 2) an all-skipped last token.
inline Batch random_batch(std::mt19937 &rng, int32_t E, int32_t H, int32_t T, int32_t K) {
    Batch b{T, K, std::vector<uint16_t>(size_t(T) * H), std::vector<int32_t>(T * K), std::vector<float>(T * K)};
    std::uniform_real_distribution<float> xd(-1.0f, 1.0f), wd(0.05f, 1.0f);
    for (auto &v : b.x) {
        float f = xd(rng);
        v = ft::f32_to_bf16(f == 0.0f ? 0.5f : f);
    }
    std::uniform_int_distribution<int32_t> id(-2, E + 1);
    for (int32_t r = 0; r < T * K; ++r) b.ids[r] = id(rng), b.w[r] = wd(rng);
    if (K >= 2) b.ids[1] = b.ids[0] = std::abs(b.ids[0]) % E;
    if (T >= 2)
        for (int32_t k = 0; k < K; ++k) b.ids[(T - 1) * K + k] = (k % 2) ? -1 : E + k;
    return b;
}

}  // namespace quant_test
