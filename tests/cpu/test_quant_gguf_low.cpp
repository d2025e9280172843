// The low-bit GGUF super-block formats q2_k, q3_k, iq4_xs on the CPU: every kernel this CPU runs
// (each tier) against the fp64 sum of the reference dequantisation (ft::dequant_row_*) times the
// Q8_0 activation, on fresh random blocks; and the whole MoE layer per tier against the fp64
// reference of the dequantised weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fresh_seed.hpp"
#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "ft/dequant.hpp"
#include "ft/formats.hpp"
#include "moe_reference.hpp"
#include "quant.hpp"
#include "quant_kernel_case.hpp"
#include "quant_test_util.hpp"

namespace {

using namespace quant_test;

const Format kFormats[] = {Format::q2_k, Format::q3_k, Format::iq4_xs};

// Offsets of the fp16 fields of a super-block.
std::vector<int> half_fields(Format f) {
    switch (f) {
        case Format::q2_k: return {80, 82};
        case Format::q3_k: return {108};
        default: return {0};
    }
}

// N rows of K: random bytes, the fp16 fields set to finite values of either sign in [0.25, 2).
std::vector<uint8_t> random_rows(std::mt19937 &rng, Format f, int64_t K, int64_t N) {
    const size_t row = ft::block_row_bytes(f, K);
    std::vector<uint8_t> v(row * size_t(N));
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto &b : v) b = uint8_t(byte(rng));
    std::uniform_real_distribution<float> d(0.25f, 2.0f);
    const int bytes = ft::block_bytes(f);
    for (size_t s = 0; s < v.size(); s += size_t(bytes))
        for (int off : half_fields(f)) put_u16(&v[s + size_t(off)], ft::f32_to_f16(d(rng) * (byte(rng) & 1 ? 1.0f : -1.0f)));
    return v;
}

struct Tokens {
    std::vector<std::vector<uint16_t>> x;  // bf16
    std::vector<std::vector<double>> xq;   // q * d of f's activation (Q8_K)
};

Tokens random_tokens(std::mt19937 &rng, Format f, int64_t K, int ntok, bool dup) {
    Tokens tk;
    std::uniform_real_distribution<float> xd(-1.0f, 1.0f);
    for (int t = 0; t < ntok; ++t) {
        std::vector<uint16_t> x(static_cast<size_t>(K));
        if (dup && (t & 1)) {
            x = tk.x.back();
        } else {
            for (auto &v : x) v = ft::f32_to_bf16(xd(rng));
        }
        std::vector<float> xf(static_cast<size_t>(K));
        for (int64_t k = 0; k < K; ++k) xf[size_t(k)] = ft::bf16_to_f32(x[size_t(k)]);
        tk.x.push_back(std::move(x));
        tk.xq.push_back(ft::test::cpu_block_activation(f, xf.data(), K));
    }
    return tk;
}

// Every kernel of f on rows [first, first + count) of N x K random rows for ntok tokens, each output
// within bound * sum |w x| of the fp64 reference. dup: odd tokens share the previous token's
// activation pointer.
void check_kernels(std::mt19937 &rng, Format f, int64_t K, int64_t N, int64_t first, int count, int ntok, bool dup,
                   double bound = 5e-5) {
    SCOPED_TRACE(std::string(ft::format_name(f)) + " K=" + std::to_string(K) + " first=" + std::to_string(first) +
                 " count=" + std::to_string(count) + " ntok=" + std::to_string(ntok));
    const std::vector<uint8_t> rows = random_rows(rng, f, K, N);
    const size_t row_bytes = ft::block_row_bytes(f, K);
    const Tokens tk = random_tokens(rng, f, K, ntok, dup);
    std::vector<double> ref(size_t(ntok) * count), mag(ref.size());
    std::vector<float> w(static_cast<size_t>(K));
    for (int j = 0; j < count; ++j) {
        ft::dequant_row_block(f, rows.data() + size_t(first + j) * row_bytes, K, w.data());
        for (int t = 0; t < ntok; ++t)
            for (int64_t k = 0; k < K; ++k) {
                const double p = double(w[size_t(k)]) * tk.xq[size_t(t)][size_t(k)];
                ref[size_t(t) * count + j] += p;
                mag[size_t(t) * count + j] += std::fabs(p);
            }
    }
    const QuantMatrix m{rows.data(), nullptr, nullptr, K, N};
    const auto variants = variants_here(f);
    ASSERT_FALSE(variants.empty());
    if (int(ft::cpu::cpu_best_isa()) >= int(Isa::avx2)) {
        ASSERT_GE(variants.size(), 2u) << "no SIMD kernel of " << ft::format_name(f);
    }
    expect_every_gguf_tier(f, variants);
    for (const ft::cpu::QuantOps *ops : variants) {
        std::vector<std::vector<uint8_t>> act;
        std::vector<const uint8_t *> ap;
        for (int t = 0; t < ntok; ++t) {
            act.emplace_back(ops->act_bytes(K) + 64, 0xcd);  // poisoned slack past the prepared bytes
            ops->prepare(tk.x[size_t(t)].data(), K, act.back().data());
        }
        for (int t = 0; t < ntok; ++t) ap.push_back(act[size_t(dup && (t & 1) ? t - 1 : t)].data());
        const size_t ldo = size_t(count) + 3;
        std::vector<float> out(ldo * size_t(ntok), std::numeric_limits<float>::quiet_NaN());
        ops->gemv(m, first, count, ap.data(), ntok, out.data(), ldo);
        for (int t = 0; t < ntok; ++t) {
            for (int j = 0; j < count; ++j) {
                const size_t r = size_t(t) * count + j;
                ASSERT_NEAR(out[size_t(t) * ldo + j], ref[r], bound * mag[r] + 1e-30)
                    << ops->kernel << " j=" << j << " t=" << t;
            }
            for (size_t j = size_t(count); j < ldo && t + 1 < ntok; ++j)
                ASSERT_TRUE(std::isnan(out[size_t(t) * ldo + j])) << ops->kernel << " wrote past count";
        }
    }
}

TEST(QuantGgufLow, KernelsMatchReference) {
    std::mt19937 rng(uint32_t(ft::test::fresh_seed("QuantGgufLow.KernelsMatchReference")));
    for (Format f : kFormats) {
        // K from one super-block up; rows not a multiple of any tile or pair; first row != 0.
        check_kernels(rng, f, 256, 12, 1, 9, 1, false);
        check_kernels(rng, f, 512, 20, 3, 17, 3, false);
        check_kernels(rng, f, 768, 16, 5, 11, 8, false);
        check_kernels(rng, f, 1024, 10, 2, 7, 13, true);
        check_kernels(rng, f, 1280, 9, 0, 9, 5, false);
        check_kernels(rng, f, 2304, 6, 1, 5, 2, false);
        if (HasFatalFailure()) return;
    }
}

TEST(QuantGgufLow, EveryTokenCount) {
    std::mt19937 rng(uint32_t(ft::test::fresh_seed("QuantGgufLow.EveryTokenCount")));
    for (Format f : kFormats)
        for (int ntok = 1; ntok <= 32; ++ntok) {
            check_kernels(rng, f, 512, 7, 2, 5, ntok, ntok % 5 == 0);
            if (HasFatalFailure()) return;
        }
}

// Row counts past 128 in 16-row tiles with a tail, K of 5 super-blocks (the AMX kernel's chunks of
// 4 and one more), 2 .. 32 tokens (one and two passes of 16), duplicates.
TEST(QuantGgufLow, TiledRows) {
    std::mt19937 rng(uint32_t(ft::test::fresh_seed("QuantGgufLow.TiledRows")));
    for (Format f : kFormats)
        for (int ntok : {2, 5, 16, 17, 32}) {
            check_kernels(rng, f, 1280, 300, 5, 290, ntok, ntok == 17);
            if (HasFatalFailure()) return;
        }
}

// K beyond one chunk of the offset sums (32 super-blocks): the second chunk adds to the first.
TEST(QuantGgufLow, LongRows) {
    std::mt19937 rng(uint32_t(ft::test::fresh_seed("QuantGgufLow.LongRows")));
    for (Format f : kFormats) {
        check_kernels(rng, f, 33 * 256, 4, 1, 3, 1, false, 1e-4);
        check_kernels(rng, f, 65 * 256, 3, 0, 3, 9, false, 1e-4);
        if (HasFatalFailure()) return;
    }
}

// A block of the activation holding Inf: its Q8_0 scale is NaN, so every output of that token is NaN
// in every kernel; the other token is unaffected.
TEST(QuantGgufLow, NonFiniteActivationGivesNaN) {
    std::mt19937 rng(5);
    const int64_t K = 512;
    for (Format f : kFormats) {
        const std::vector<uint8_t> rows = random_rows(rng, f, K, 4);
        Tokens tk = random_tokens(rng, f, K, 2, false);
        tk.x[0][300] = 0x7f80;  // +Inf
        for (const ft::cpu::QuantOps *ops : variants_here(f)) {
            std::vector<std::vector<uint8_t>> act;
            std::vector<const uint8_t *> ap;
            for (int t = 0; t < 2; ++t) {
                act.emplace_back(ops->act_bytes(K), 0);
                ops->prepare(tk.x[size_t(t)].data(), K, act.back().data());
                ap.push_back(act.back().data());
            }
            std::vector<float> out(8, 0.0f);
            ops->gemv({rows.data(), nullptr, nullptr, K, 4}, 0, 4, ap.data(), 2, out.data(), 4);
            for (int j = 0; j < 4; ++j) {
                EXPECT_TRUE(std::isnan(out[size_t(j)])) << ops->kernel << " j=" << j;
                EXPECT_TRUE(std::isfinite(out[size_t(4 + j)])) << ops->kernel << " j=" << j;
            }
        }
    }
}

// The whole layer through the MoE executor (cpu backend) per tier, SiLU / GELU, against the fp64
// reference of the dequantised weights. Every expert takes the direct kernels (the GGUF formats
// have no batched path), which quantise both passes' inputs to Q8_K; the
// reference does the same, so what is left is fp32 summation, bf16 rounding and the
// intermediate's Q8_K steps where the two sides round it differently.
class QuantGgufLowMoe : public ::testing::TestWithParam<Isa> {};

TEST_P(QuantGgufLowMoe, MatchesDequantisedReference) {
    const Isa isa = GetParam();
    if (int(isa) > int(ft::cpu::cpu_best_isa())) GTEST_SKIP() << ft::cpu::isa_name(isa) << " not supported here";
    std::mt19937 rng(uint32_t(ft::test::fresh_seed("QuantGgufLowMoe.MatchesDequantisedReference")));
    ft::cpu::ThreadPool pool(2, false);
    for (Format f : kFormats) {
        QLayer L(rng, f, 512, 256, 6);
        for (const ft::cpu::ActivationSpec act :
             {ft::cpu::ActivationSpec{FT_ACT_SILU, 1.702f, 7.0f}, ft::cpu::ActivationSpec{FT_ACT_GELU, 1.702f, 7.0f}})
            for (int32_t T : {1, 2, 5, 16}) {
                const int32_t K = 4;
                ft::cpu::MoeExecutor ex(pool, f, L.H, L.I, K, 16, act, 0, isa);
                const std::string kernel = ex.kernel_name();
                EXPECT_NE(kernel.find(ft::format_name(f)), std::string::npos) << kernel;
                Batch b = random_batch(rng, L.E, L.H, T, K);
                std::vector<uint16_t> y(size_t(T) * L.H, 0x7fc0);
                auto src = L.cpu_source();
                ex.run(src, nullptr, T, b.x.data(), b.ids.data(), b.w.data(), y.data());
                ft::test::ActivationRef a{act.kind, act.alpha, act.limit};
                const auto ref = ft::test::moe_reference_f32([&](int32_t e) { return L.expert(e); }, L.E, a,
                                                             ft::test::cpu_block_numerics(f), L.H, L.I,
                                                             T, K, b.x.data(), b.ids.data(), b.w.data());
                const double err = ft::test::relative_error_bf16(y, ref);
                EXPECT_LT(err, 1.5e-2) << ft::format_name(f) << " " << kernel << " act " << act.kind << " T=" << T;
                if (T >= 2) {
                    for (int32_t h = 0; h < L.H; ++h) ASSERT_EQ(y[size_t(T - 1) * L.H + h], 0) << "skipped token";
                }
            }
    }
}

INSTANTIATE_TEST_SUITE_P(AllTiers, QuantGgufLowMoe, ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16),
                         [](const auto &info) { return std::string(ft::cpu::isa_name(info.param)); });

}  // namespace
