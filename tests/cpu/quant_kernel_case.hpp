// Kernel-level checks of the quantised formats: every kernel this CPU can run (each tier, with and
// without VNNI) against the lib/core/formats reference on fresh random data, outputs NaN-poisoned
// first (quant_kernel_case.cpp; used by test_quant_kernels.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ft/dequant.hpp"
#include "quant.hpp"
#include "quant_test_util.hpp"

namespace quant_test {

using ft::cpu::detail::QuantMatrix;

// Every distinct kernel of format f runnable here.
std::vector<const ft::cpu::QuantOps *> variants_here(Format f);

// The GGUF block formats beyond q4_0 (q8_0, q2_k .. q6_k, iq4_xs) have a kernel of their own on every
// tier: a failure unless `ops` (variants_here) holds the "-avx2", "-avx512" and "-avx512vnni"
// kernels of every tier this CPU has (a tier silently falling back to the one below is a failure,
// not a skip). No check for other formats.
void expect_every_gguf_tier(Format f, const std::vector<const ft::cpu::QuantOps *> &ops);

struct Case {
    Format f;
    int64_t K, N;
    std::vector<uint8_t> data, scale, global;
    QuantMatrix m() const { return {data.data(), scale.data(), global.data(), K, N}; }
    // Row (column for mxfp4) n dequantised by the reference.
    std::vector<float> weights(int64_t n) const {
        std::vector<float> w(K);
        switch (f) {
            case Format::fp8_block: {
                std::vector<uint16_t> band(K / 128);
                std::memcpy(band.data(), scale.data() + (n / 128) * (K / 128) * 2, band.size() * 2);
                ft::dequant_row_fp8_block(data.data() + n * K, band.data(), K, w.data());
                break;
            }
            case Format::nvfp4: {
                uint16_t g;
                std::memcpy(&g, global.data() + n * 2, 2);
                ft::dequant_row_nvfp4(data.data() + n * K / 2, scale.data() + n * K / 16, g, K, w.data());
                break;
            }
            case Format::ds_fp4: ft::dequant_row_ds_fp4(data.data() + n * K / 2, scale.data() + n * K / 32, K, w.data()); break;
            case Format::mxfp4: ft::dequant_col_mxfp4(data.data(), scale.data(), K, N, n, w.data()); break;
            case Format::q4_0: ft::dequant_row_q4_0(data.data() + n * (K / 32) * 18, K, w.data()); break;
            default:
                if (ft::format_is_block(f))
                    ft::dequant_row_block(f, data.data() + n * ft::block_row_bytes(f, K), K, w.data());
                break;
        }
        return w;
    }
};

// Random weights, scales and globals of format f, K x N, as the format stores them.
Case make_case(std::mt19937 &rng, Format f, int64_t K, int64_t N);

// Runs every kernel of c.f on rows/columns [first, first + count) for ntok tokens and checks
// each output against the fp64 sum of reference weights x the activation the kernel's numerics
// define (bf16 x; ds_fp4 FP8 round trip; the GGUF block formats Q8_0). bound: relative to sum |w x|. dup: every
// odd token repeats the previous one through the same activation pointer (a token routed twice to
// one expert, as duplicate ids give the kernels).
void check(const Case &c, int64_t first, int count, int ntok, std::mt19937 &rng, double bound, float xscale = 1.0f,
           bool dup = false);

}  // namespace quant_test
