// The AVX-512 and AVX-512-VNNI kernels of the GGUF block formats on any x86-64 CPU: their two units
// (cpu/src/quant_gguf_avx512*.cpp) are compiled a second time against SIMDe's portable intrinsics
// (simde_avx512/immintrin.h) with namespace ft renamed ft_simde, and checked here like the native
// kernels are in test_quant_kernels / test_quant_gguf_low: the fp64 sum of the reference
// dequantisation times the Q8_0 (q8_0) or Q8_K activation, fresh random blocks, K with partial groups and several
// chunks, 1..32 tokens, duplicate tokens, small activations, and non-finite activations. So the
// kernels' data flow (decoding, lane order, scales, offsets, tails) is tested on CPUs without
// AVX-512 too; the native build of the same source runs in test_cpu where the CPU has AVX-512.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fresh_seed.hpp"
#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "ft/formats.hpp"
#include "quant.hpp"
#include "quant_kernel_case.hpp"

// What the emulated units use from outside (their ft:: names renamed ft_simde::), and their kernels.
namespace ft_simde {
extern const int8_t kIq4nlValues[16];
const int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
namespace cpu::detail {
int g_prefetch_bytes = 0;
struct QuantMatrix {  // cpu/src/quant_kernels.hpp's, field for field
    const uint8_t *data, *scale, *global;
    int64_t K, N;
};
using Gemv = void (*)(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
#define FT_SIMDE_KERNEL(name) void name(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
FT_SIMDE_KERNEL(q8_0_avx512)
FT_SIMDE_KERNEL(q4_k_avx512)
FT_SIMDE_KERNEL(q5_k_avx512)
FT_SIMDE_KERNEL(q6_k_avx512)
FT_SIMDE_KERNEL(q2_k_avx512)
FT_SIMDE_KERNEL(q3_k_avx512)
FT_SIMDE_KERNEL(iq4_xs_avx512)
FT_SIMDE_KERNEL(q8_0_avx512vnni)
FT_SIMDE_KERNEL(q4_k_avx512vnni)
FT_SIMDE_KERNEL(q5_k_avx512vnni)
FT_SIMDE_KERNEL(q6_k_avx512vnni)
FT_SIMDE_KERNEL(q2_k_avx512vnni)
FT_SIMDE_KERNEL(q3_k_avx512vnni)
FT_SIMDE_KERNEL(iq4_xs_avx512vnni)
#undef FT_SIMDE_KERNEL
}  // namespace cpu::detail
}  // namespace ft_simde

namespace {

using namespace quant_test;
namespace E = ft_simde::cpu::detail;

struct Kernels {
    Format f;
    E::Gemv bw, vnni;
};
const Kernels kKernels[] = {
    {Format::q8_0, E::q8_0_avx512, E::q8_0_avx512vnni},     {Format::q4_k, E::q4_k_avx512, E::q4_k_avx512vnni},
    {Format::q5_k, E::q5_k_avx512, E::q5_k_avx512vnni},     {Format::q6_k, E::q6_k_avx512, E::q6_k_avx512vnni},
    {Format::q2_k, E::q2_k_avx512, E::q2_k_avx512vnni},     {Format::q3_k, E::q3_k_avx512, E::q3_k_avx512vnni},
    {Format::iq4_xs, E::iq4_xs_avx512, E::iq4_xs_avx512vnni},
};

// Both emulated kernels of k.f on rows [first, first + count) of c for ntok tokens against the fp64
// reference, within bound * sum |w x|; outputs NaN-poisoned first, ldo > count (nothing written
// past count). dup: odd tokens share the previous token's activation.
void check_emulated(const Kernels &k, const Case &c, int64_t first, int count, int ntok, std::mt19937 &rng,
                    double bound, float xscale = 1.0f, bool dup = false, int prefetch = 0) {
    SCOPED_TRACE(std::string(ft::format_name(k.f)) + " K=" + std::to_string(c.K) + " first=" + std::to_string(first) +
                 " count=" + std::to_string(count) + " ntok=" + std::to_string(ntok) + (dup ? " dup" : ""));
    const ft::cpu::QuantOps *scalar = ft::cpu::quant_ops_variant(k.f, Isa::scalar, false, false);
    std::uniform_real_distribution<float> xd(-xscale, xscale);
    std::vector<std::vector<uint8_t>> act;
    std::vector<std::vector<double>> xq;
    for (int t = 0; t < ntok; ++t) {
        if (dup && (t & 1)) {
            xq.push_back(xq.back());
            continue;
        }
        std::vector<uint16_t> x(size_t(c.K));
        std::vector<float> xf(size_t(c.K));
        for (int64_t i = 0; i < c.K; ++i) x[i] = ft::f32_to_bf16(xd(rng)), xf[i] = ft::bf16_to_f32(x[i]);
        xq.push_back(ft::test::cpu_block_activation(c.f, xf.data(), c.K));
        act.emplace_back(scalar->act_bytes(c.K), 0);
        scalar->prepare(x.data(), c.K, act.back().data());
    }
    std::vector<const uint8_t *> ap;
    for (int t = 0, a = -1; t < ntok; ++t) ap.push_back(act[size_t(dup && (t & 1) ? a : ++a)].data());
    std::vector<double> ref(size_t(ntok) * count), mag(ref.size());
    for (int j = 0; j < count; ++j) {
        const std::vector<float> w = c.weights(first + j);
        for (int t = 0; t < ntok; ++t)
            for (int64_t i = 0; i < c.K; ++i) {
                ref[size_t(t) * count + j] += double(w[i]) * xq[t][i];
                mag[size_t(t) * count + j] += std::fabs(double(w[i]) * xq[t][i]);
            }
    }
    E::g_prefetch_bytes = prefetch;
    const E::QuantMatrix m{c.data.data(), nullptr, nullptr, c.K, c.N};
    for (const auto &[gemv, name] : {std::pair{k.bw, "avx512"}, std::pair{k.vnni, "avx512vnni"}}) {
        const size_t ldo = size_t(count) + 3;
        std::vector<float> out(ldo * size_t(ntok), std::numeric_limits<float>::quiet_NaN());
        gemv(m, first, count, ap.data(), ntok, out.data(), ldo);
        for (int t = 0; t < ntok; ++t) {
            for (int j = 0; j < count; ++j) {
                const size_t r = size_t(t) * count + j;
                ASSERT_NEAR(out[size_t(t) * ldo + j], ref[r], bound * mag[r] + 1e-30) << name << " j=" << j << " t=" << t;
            }
            for (size_t j = size_t(count); j < ldo && t + 1 < ntok; ++j)
                ASSERT_TRUE(std::isnan(out[size_t(t) * ldo + j])) << name << " wrote past count";
        }
    }
}

TEST(GgufAvx512Emulated, KernelsMatchReference) {
    std::mt19937 rng(uint32_t(ft::test::fresh_seed("GgufAvx512Emulated.KernelsMatchReference")));
    for (const Kernels &k : kKernels) {
        const bool q8 = k.f == Format::q8_0;
        const bool low = k.f == Format::q2_k || k.f == Format::q3_k || k.f == Format::iq4_xs;
        const double bound = low ? 5e-5 : 1e-5;
        // q8_0: 1, 7, 24 and 27 blocks (groups of 8 blocks, partial groups of odd and even size);
        // super-block formats: 1, 2, 3 and 5 super-blocks.
        const int64_t Ks[] = {q8 ? 32 : 256, q8 ? 224 : 512, q8 ? 768 : 768, q8 ? 864 : 1280};
        for (int64_t K : Ks) {
            const Case c = make_case(rng, k.f, K, 12);
            for (int ntok = 1; ntok <= 32; ++ntok) check_emulated(k, c, 1, 9, ntok, rng, bound);
            for (int ntok : {2, 9, 17}) check_emulated(k, c, 3, 8, ntok, rng, bound, 1.0f, true);
            check_emulated(k, c, 0, 12, 5, rng, bound, 1e-3f, false, 256);  // small |x|, prefetch on
            if (HasFatalFailure()) return;
        }
        // K of 33 super-blocks: the activation sums go in chunks of 32 super-blocks.
        const Case big = make_case(rng, k.f, 33 * 256, 4);
        for (int ntok : {1, 8, 11}) check_emulated(k, big, 1, 3, ntok, rng, low ? 1e-4 : 1e-5);
        if (HasFatalFailure()) return;
    }
}

// A block of the activation holding Inf (Q8_0 scale NaN): every output of that token is NaN, the
// other token's are finite.
TEST(GgufAvx512Emulated, NonFiniteActivationGivesNaN) {
    std::mt19937 rng(17);
    for (const Kernels &k : kKernels) {
        const int64_t K = 512;
        const Case c = make_case(rng, k.f, K, 4);
        const ft::cpu::QuantOps *scalar = ft::cpu::quant_ops_variant(k.f, Isa::scalar, false, false);
        std::vector<std::vector<uint8_t>> act(2, std::vector<uint8_t>(scalar->act_bytes(K)));
        for (int t = 0; t < 2; ++t) {
            std::vector<uint16_t> x(static_cast<size_t>(K));
            for (int64_t i = 0; i < K; ++i) x[i] = ft::f32_to_bf16(0.25f + float(i % 5) * 0.125f);
            if (t == 0) x[300] = 0x7f80;  // +Inf
            scalar->prepare(x.data(), K, act[t].data());
        }
        const uint8_t *ap[2] = {act[0].data(), act[1].data()};
        const E::QuantMatrix m{c.data.data(), nullptr, nullptr, K, 4};
        for (E::Gemv gemv : {k.bw, k.vnni}) {
            std::vector<float> out(8, 0.0f);
            gemv(m, 0, 4, ap, 2, out.data(), 4);
            for (int j = 0; j < 4; ++j) {
                EXPECT_TRUE(std::isnan(out[size_t(j)])) << ft::format_name(k.f) << " j=" << j;
                EXPECT_TRUE(std::isfinite(out[size_t(4 + j)])) << ft::format_name(k.f) << " j=" << j;
            }
        }
    }
}

}  // namespace
