// Quantised kernels one by one: every kernel this CPU can run against the lib/core/formats
// reference (quant_kernel_case.hpp), the activation preparations against their definitions, the
// exact W4A8 sum of q4_0, and NaN / non-finite inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>

#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "ft/dequant.hpp"
#include "ft/formats.hpp"
#include "fresh_seed.hpp"
#include "quant.hpp"
#include "quant_kernel_case.hpp"
#include "quant_test_util.hpp"

namespace {

using namespace quant_test;

// The W4A8 kernel against the exact integer sum of the scalar reference: only fp32 rounding of
// the per-block products differs.
// Against the exact W4A8 products in fp64. 5 tokens, and 9 over K = 547 blocks: tiles of 3+
// tokens take the activation's block sums in ranges of blocks (547 = 512 + 35 for 8 tokens on
// AVX2), with 8-block groups and tails in each range.
TEST(QuantKernels, Q4_0MatchesExactW4A8) {
    std::mt19937 rng(6);
    for (const auto &[H, I, T] : {std::tuple<int32_t, int32_t, int>{320, 64, 5}, {547 * 32, 32, 9}}) {
        QLayer L(rng, Format::q4_0, H, I, 1);
        for (Isa isa : tiers_here())
            for (bool vnni : {true, false}) {
                ft::cpu::QuantChoice choice;
                choice.vnni = vnni;
                const ft::cpu::QuantOps *ops = ft::cpu::quant_ops(Format::q4_0, isa, choice);
                std::vector<std::vector<uint8_t>> act;
                std::vector<const uint8_t *> ap;
                std::vector<std::vector<float>> xf;
                for (int t = 0; t < T; ++t) {
                    Batch b = random_batch(rng, 1, L.H, 1, 1);
                    act.emplace_back(ops->act_bytes(L.H));
                    ops->prepare(b.x.data(), L.H, act.back().data());
                    xf.emplace_back(L.H);
                    for (int h = 0; h < L.H; ++h) xf.back()[h] = ft::bf16_to_f32(b.x[h]);
                }
                for (auto &a : act) ap.push_back(a.data());
                ft::cpu::detail::QuantMatrix m{L.banks[0].data(), nullptr, nullptr, L.H, 2 * L.I};
                std::vector<float> out(size_t(T) * 2 * L.I);
                ops->gemv(m, 0, 2 * L.I, ap.data(), T, out.data(), 2 * L.I);
                for (int t = 0; t < T; ++t) {
                    std::vector<int8_t> q(L.H);
                    std::vector<float> d(L.H / 32), w(L.H);
                    ft::quantize_q8_0(xf[t].data(), L.H, q.data(), d.data());
                    for (int r = 0; r < 2 * L.I; ++r) {
                        ft::dequant_row_q4_0(L.banks[0].data() + size_t(r) * (L.H / 32) * 18, L.H, w.data());
                        double ref = 0, mag = 0;
                        for (int h = 0; h < L.H; ++h)
                            ref += double(w[h]) * q[h] * d[h / 32], mag += std::fabs(double(w[h]) * q[h] * d[h / 32]);
                        ASSERT_NEAR(out[size_t(t) * 2 * L.I + r], ref, 1e-6 * mag + 1e-9)
                            << ft::cpu::isa_name(isa) << " K=" << L.H << " token " << t << " row " << r;
                    }
                }
            }
    }
}

TEST(QuantKernels, EveryKernelMatchesReference) {
    std::mt19937 rng(1234);
    struct G { Format f; int64_t K, N, first; int count; double bound; };
    // K with tails (nvfp4 272 = 4 x 64 + 16), counts with tails, every token count 1..32 (the
    // kernels' token tiles of 2, 4 or 8 and every remainder), and duplicate tokens.
    const G geos[] = {
        {Format::fp8_block, 384, 260, 3, 255, 1e-5}, {Format::nvfp4, 272, 40, 1, 37, 1e-5},
        {Format::nvfp4, 512, 8, 0, 8, 1e-5},         {Format::ds_fp4, 384, 24, 2, 21, 1e-5},
        {Format::mxfp4, 96, 160, 5, 150, 1e-5},       {Format::mxfp4, 64, 64, 0, 64, 1e-5},
        {Format::mxfp4, 64, 200, 7, 100, 1e-5},  // one token: a two-line pass ending mid-line
        {Format::mxfp4, 64, 72, 2, 45, 1e-5},    // AVX2: a partial tile of 64 columns
        {Format::mxfp4, 64, 40, 0, 32, 1e-5},    // AVX2: one whole group of 32 columns
        {Format::q4_0, 224, 20, 1, 18, 1e-5},         {Format::q4_0, 256, 9, 0, 9, 1e-5},
        // nvfp4 W4A8: one block only, 3 chunks + one block.
        {Format::nvfp4, 16, 5, 1, 3, 1e-5},           {Format::nvfp4, 400, 9, 0, 9, 1e-5},
        // q4_0 four blocks per step (avx512vnni-x4): fewer blocks than a group, one group + 1.
        {Format::q4_0, 96, 7, 2, 5, 1e-5},            {Format::q4_0, 160, 12, 0, 11, 1e-5},
        // ds_fp4: one chunk of 128, and 5 chunks (a group of 16 scales + a partial one), odd counts.
        {Format::ds_fp4, 128, 6, 1, 5, 1e-5},         {Format::ds_fp4, 640, 11, 0, 11, 1e-5},
        // fp8_block on AMX tiles (first row a multiple of 16): rows across 128-row scale bands and
        // past 128 (two super-blocks), 6 tail rows; K of one chunk of 1024 plus a 128 block.
        {Format::fp8_block, 640, 300, 16, 262, 1e-5}, {Format::fp8_block, 1152, 144, 0, 144, 1e-5},
    };
    for (const G &g : geos) {
        const Case c = make_case(rng, g.f, g.K, g.N);
        for (int ntok = 1; ntok <= 32; ++ntok) check(c, g.first, g.count, ntok, rng, g.bound);
        for (int ntok : {2, 9, 17}) check(c, g.first, g.count, ntok, rng, g.bound, 1.0f, true);
    }
}

// The GGUF block formats beyond q4_0 on fresh random blocks (codes and scales random bytes, fp16
// d / dmin finite): K of one, two and three super-blocks (q8_0: 1, 7, 24 and 27 blocks: the AVX2
// kernel takes groups of 8 blocks, then pairs, then one), first row
// != 0, row counts that are not a multiple of any tile, every token count 1..32.
TEST(QuantKernels, GgufBlockKernelsMatchReference) {
    std::mt19937 rng(uint32_t(ft::test::fresh_seed("QuantKernels.GgufBlockKernelsMatchReference")));
    struct G { Format f; int64_t K, N, first; int count; };
    const G geos[] = {
        {Format::q8_0, 32, 9, 1, 7},   {Format::q8_0, 224, 20, 3, 17}, {Format::q8_0, 768, 6, 0, 6},
        {Format::q8_0, 864, 7, 2, 5},
        {Format::q4_k, 256, 9, 2, 7},  {Format::q4_k, 512, 12, 0, 11}, {Format::q4_k, 768, 5, 1, 3},
        {Format::q5_k, 256, 9, 2, 7},  {Format::q5_k, 512, 12, 0, 11}, {Format::q5_k, 768, 5, 1, 3},
        {Format::q6_k, 256, 9, 2, 7},  {Format::q6_k, 512, 12, 0, 11}, {Format::q6_k, 768, 5, 1, 3},
    };
    for (const G &g : geos) {
        const Case c = make_case(rng, g.f, g.K, g.N);
        for (int ntok = 1; ntok <= 32; ++ntok) check(c, g.first, g.count, ntok, rng, 1e-5);
        for (int ntok : {2, 9, 17}) check(c, g.first, g.count, ntok, rng, 1e-5, 1.0f, true);
        // Small activations (|x| <= 1e-3).
        check(c, g.first, g.count, 5, rng, 1e-5, 1e-3f);
    }
    // K of 33 super-blocks: tiles of 8 tokens take the activation sums of 32 super-blocks per
    // pass (quant_gguf_avx2.cpp), so the rows are summed in two K ranges.
    for (Format f : {Format::q4_k, Format::q5_k, Format::q6_k}) {
        const Case c = make_case(rng, f, 33 * 256, 4);
        for (int ntok : {8, 16, 11}) check(c, 1, 3, ntok, rng, 1e-5);
    }
}

// The kernel table of the GGUF block formats beyond q4_0, whatever this CPU runs: each tier has its
// own kernel (avx512bf16 runs the avx512 one), VNNI its own at tiers >= avx512 only, all over the
// Q8_0 activation of the scalar kernel.
TEST(QuantKernels, GgufBlockKernelTable) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    for (Format f : {Format::q8_0, Format::q2_k, Format::q3_k, Format::q4_k, Format::q5_k, Format::q6_k, Format::iq4_xs}) {
        const ft::cpu::QuantOps *scalar = ft::cpu::quant_ops_variant(f, Isa::scalar, false, false);
        const std::string sname = scalar->kernel;  // "<format>-w<b>a8-scalar"
        ASSERT_GT(sname.size(), 7u);
        ASSERT_EQ(sname.substr(sname.size() - 7), "-scalar");
        const std::string base = sname.substr(0, sname.size() - 7);
        struct Want { Isa isa; bool vnni; const char *suffix; };
        // The AVX-VNNI flavour at the avx2 tier where cpuid has avx_vnni.
        const char *avx2_vnni = ft::cpu::cpu_has_avx_vnni() ? "-avx2vnni" : "-avx2";
        const Want wants[] = {{Isa::scalar, true, "-scalar"},        {Isa::avx2, false, "-avx2"},
                              {Isa::avx2, true, avx2_vnni},          {Isa::avx512, false, "-avx512"},
                              {Isa::avx512, true, "-avx512vnni"},    {Isa::avx512bf16, false, "-avx512"},
                              {Isa::avx512bf16, true, "-avx512vnni"}};
        for (const Want &w : wants) {
            const ft::cpu::QuantOps *ops = ft::cpu::quant_ops_variant(f, w.isa, w.vnni, false);
            EXPECT_EQ(std::string(ops->kernel), base + w.suffix) << ft::cpu::isa_name(w.isa) << " vnni " << w.vnni;
            EXPECT_EQ(ops->act_bytes, scalar->act_bytes) << ops->kernel;
            EXPECT_EQ(ops->prepare, scalar->prepare) << ops->kernel;
        }
    }
#else
    GTEST_SKIP() << "no x86 kernels in this build";
#endif
}

// The preparation of mxfp4 W4A8 x2 activations of every such kernel here (the AVX-512 SIMD one,
// the AVX2 tier's) against its definition (ft::quantize_q8_0 for q1 and d, mxfp4_residual_q8 for
// q2), byte for byte: random blocks of several magnitudes,
// an all-zero block, and exact .5 ties of x / d (block amax 127 makes d = 1), which must round
// away from zero as std::round. Kernels that split by token count (x2_max_tokens > 0) keep the
// x2 layout as the last part of their activation.
void check_mxfp4_w4a8x2_prepare(const ft::cpu::QuantOps *ops) {
    std::mt19937 rng(99);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int64_t K = 224, nb = K / 32, qbytes = 256;
    std::vector<float> xf(K);
    for (int64_t k = 0; k < K; ++k) xf[k] = u(rng) * (k < 96 ? 1.0f : k < 160 ? 3e-3f : 250.0f);
    for (int64_t k = 96; k < 128; ++k) xf[k] = 0.0f;
    const float ties[] = {127.0f, 2.5f, -3.5f, 12.5f, -0.5f, 0.5f, -126.5f, 6.5f};
    for (int i = 0; i < 32; ++i) xf[160 + i] = i < 8 ? ties[i] : u(rng);
    std::vector<uint16_t> x(K);
    for (int64_t k = 0; k < K; ++k) x[k] = ft::f32_to_bf16(xf[k]), xf[k] = ft::bf16_to_f32(x[k]);
    std::vector<uint8_t> all(ops->act_bytes(K) + 64, 0xcd);
    ops->prepare(x.data(), K, all.data());
    const size_t head = ops->x2_max_tokens > 0 ? ops->act_bytes(K) - ft::cpu::detail::mxfp4_q8_act_bytes(K) : 0;
    const uint8_t *const act = all.data() + head;
    std::vector<int8_t> q(K), q2(K);
    std::vector<float> d(nb);
    ft::quantize_q8_0(xf.data(), K, q.data(), d.data());
    for (int64_t b = 0; b < nb; ++b)
        ft::cpu::detail::mxfp4_residual_q8(xf.data() + 32 * b, q.data() + 32 * b, d[b], q2.data() + 32 * b);
    const uint8_t *a = act + 2 * qbytes;
    for (int64_t k = 0; k < qbytes; ++k) {
        int16_t x16;
        std::memcpy(&x16, act + 2 * k, 2);
        ASSERT_EQ(x16, k < K ? 256 * q[k] + q2[k] : 0) << "x16 k=" << k;
        ASSERT_EQ(int8_t(a[k]), k < K ? q[k] : 0) << "q1 k=" << k;
        ASSERT_EQ(int8_t(a[qbytes + k]), k < K ? q2[k] : 0) << "q2 k=" << k;
    }
    EXPECT_EQ(q[161], 3) << "2.5 rounds away from zero";
    EXPECT_EQ(q[162], -4);
    for (int64_t b = 0; b < nb; ++b) {
        float ds;
        int32_t c[2], s1 = 0, s2 = 0;
        std::memcpy(&ds, a + 2 * qbytes + 4 * b, 4);
        std::memcpy(c, a + 2 * qbytes + 4 * nb + 8 * b, 8);
        for (int i = 0; i < 32; ++i) s1 += q[32 * b + i], s2 += q2[32 * b + i];
        EXPECT_EQ(ds, d[b] / 512.0f) << b;
        EXPECT_EQ(c[0], -12 * s1) << b;
        EXPECT_EQ(c[1], -12 * s2) << b;
    }
}

TEST(QuantKernels, Mxfp4W4A8x2PrepareMatchesDefinition) {
    int checked = 0;
    for (const ft::cpu::QuantOps *ops : variants_here(Format::mxfp4)) {
        if (std::string(ops->kernel).find("w4a8x2") == std::string::npos) continue;
        ++checked;
        SCOPED_TRACE(ops->kernel);
        check_mxfp4_w4a8x2_prepare(ops);
    }
    if (int(ft::cpu::cpu_best_isa()) >= int(Isa::avx2)) {
        EXPECT_GT(checked, 0) << "no W4A8 x2 kernel run here";
    }
}

// ntok tokens of K fresh random bf16 values in [-1, 1), prepared by ops; ptr: one per token.
struct PreparedTokens {
    std::vector<std::vector<uint8_t>> act;
    std::vector<const uint8_t *> ptr;
    PreparedTokens(std::mt19937 &rng, const ft::cpu::QuantOps *ops, int64_t K, int ntok)
        : act(size_t(ntok), std::vector<uint8_t>(ops->act_bytes(K))) {
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::vector<uint16_t> x(static_cast<size_t>(K));
        for (auto &a : act) {
            for (auto &v : x) v = ft::f32_to_bf16(u(rng));
            ops->prepare(x.data(), K, a.data());
            ptr.push_back(a.data());
        }
    }
};

// quant_ops at tier isa picks vnni by default and plain with QuantChoice::vnni off.
void expect_vnni_choice(Format f, Isa isa, const ft::cpu::QuantOps *vnni, const ft::cpu::QuantOps *plain) {
    ft::cpu::QuantChoice choice;
    EXPECT_EQ(ft::cpu::quant_ops(f, isa, choice)->gemv, vnni->gemv) << vnni->kernel;
    choice.vnni = false;
    EXPECT_EQ(ft::cpu::quant_ops(f, isa, choice)->gemv, plain->gemv) << plain->kernel;
}

// The mxfp4 W4A8 x2 kernels (VNNI + VBMI and AVX2) compute each column's int32 block sums and
// their fp32 scaling the same way for one token and for several: every token of a call of 2..17
// tokens equals, bit for bit, that token alone; columns with a tail, K of 3 blocks. (The AMX
// variant runs only one-token calls through the x2 kernel: E2m1AmxSplitsByTokenCount.)
TEST(QuantKernels, Mxfp4W4A8x2TokenCountsAgreeBitwise) {
    std::mt19937 rng(uint32_t(ft::test::fresh_seed("QuantKernels.Mxfp4W4A8x2TokenCounts")));
    const Case c = make_case(rng, Format::mxfp4, 96, 200);
    const int64_t first = 3;
    const int count = 190;
    int checked = 0;
    for (const ft::cpu::QuantOps *ops : variants_here(Format::mxfp4)) {
        if (std::string(ops->kernel).find("w4a8x2-avx") == std::string::npos || ops->x2_max_tokens > 0) continue;
        ++checked;
        const int ntok = 17;
        const PreparedTokens p(rng, ops, c.K, ntok);
        const std::vector<const uint8_t *> &ap = p.ptr;
        std::vector<float> one(size_t(ntok) * count);
        for (int t = 0; t < ntok; ++t) ops->gemv(c.m(), first, count, &ap[size_t(t)], 1, one.data() + size_t(t) * count, count);
        for (int n = 2; n <= ntok; ++n) {
            std::vector<float> many(size_t(n) * count, std::numeric_limits<float>::quiet_NaN());
            ops->gemv(c.m(), first, count, ap.data(), n, many.data(), count);
            ASSERT_EQ(std::memcmp(many.data(), one.data(), many.size() * sizeof(float)), 0) << ops->kernel << " tokens " << n;
        }
    }
    const bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
                      int(ft::cpu::cpu_best_isa()) >= int(Isa::avx512bf16);
    if (int(ft::cpu::cpu_best_isa()) >= int(Isa::avx2)) {
        EXPECT_GE(checked, vnni ? 2 : 1) << "a W4A8 x2 kernel did not run here";
    }
}

// A kernel that splits by token count (both: x2_max_tokens > 0) on fresh random tokens: calls of up
// to x2_max_tokens tokens equal x2 on the second part of the activation bit for bit, calls of up
// to 19 tokens `big` on the first part (big->act_bytes long); each part is the layout its own
// preparation writes.
void expect_split_by_token_count(std::mt19937 &rng, const Case &c, int64_t first, int count,
                                 const ft::cpu::QuantOps *both, const ft::cpu::QuantOps *x2,
                                 const ft::cpu::QuantOps *big) {
    const int ntok = 19;
    const PreparedTokens p(rng, both, c.K, ntok);
    const size_t head = big->act_bytes(c.K);
    ASSERT_EQ(head + x2->act_bytes(c.K), both->act_bytes(c.K)) << both->kernel;
    std::vector<const uint8_t *> tail;
    for (const uint8_t *a : p.ptr) tail.push_back(a + head);
    for (int n = 1; n <= ntok; ++n) {
        std::vector<float> got(size_t(n) * count, 1.0f), want(size_t(n) * count, 2.0f);
        both->gemv(c.m(), first, count, p.ptr.data(), n, got.data(), size_t(count));
        if (n <= both->x2_max_tokens) x2->gemv(c.m(), first, count, tail.data(), n, want.data(), size_t(count));
        else big->gemv(c.m(), first, count, p.ptr.data(), n, want.data(), size_t(count));
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << both->kernel << " tokens " << n;
    }
    std::vector<uint16_t> x(size_t(c.K));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto &v : x) v = ft::f32_to_bf16(u(rng));
    std::vector<uint8_t> a(both->act_bytes(c.K)), h(head), t(x2->act_bytes(c.K));
    both->prepare(x.data(), c.K, a.data());
    big->prepare(x.data(), c.K, h.data());
    x2->prepare(x.data(), c.K, t.data());
    EXPECT_EQ(std::memcmp(a.data(), h.data(), head), 0) << both->kernel;
    EXPECT_EQ(std::memcmp(a.data() + head, t.data(), t.size()), 0) << both->kernel;
}

// mxfp4 and ds_fp4 on AMX where their W4A8 x2 kernel is chosen (mxfp4: FT_CPU_MXFP4_W4A8; ds_fp4:
// AVX-512-VNNI), the default: calls of up to 1 (mxfp4) / 2 (ds_fp4) tokens equal that kernel,
// more the AMX kernel alone (the variant without it).
TEST(QuantKernels, E2m1AmxSplitsByTokenCount) {
    if (!ft::cpu::quant_amx_available(Format::mxfp4) || !__builtin_cpu_supports("avx512vnni"))
        GTEST_SKIP() << "no AMX-BF16 + VBMI + VNNI here";
    std::mt19937 rng(uint32_t(ft::test::fresh_seed("QuantKernels.E2m1AmxSplitsByTokenCount")));
    struct G { Format f; int64_t K, N, first; int count; int x2_max; Isa x2_tier; bool fast; };
    for (const G &g : {G{Format::mxfp4, 1088, 400, 7, 330, 1, Isa::avx512bf16, true},
                       G{Format::ds_fp4, 640, 300, 3, 290, 2, Isa::avx512, false}}) {
        const ft::cpu::QuantOps *both = ft::cpu::quant_ops_variant(g.f, Isa::avx512bf16, true, true, g.fast, true);
        const ft::cpu::QuantOps *x2 = ft::cpu::quant_ops_variant(g.f, g.x2_tier, true, true, g.fast, false);
        const ft::cpu::QuantOps *amx = ft::cpu::quant_ops_variant(g.f, Isa::avx512bf16, g.f == Format::mxfp4, true, false, true);
        ASSERT_EQ(both->x2_max_tokens, g.x2_max) << both->kernel;
        ASSERT_NE(both->gemv, amx->gemv);
        EXPECT_EQ(ft::cpu::quant_ops(g.f, Isa::avx512bf16, {}, true)->gemv, both->gemv);
        Case c = make_case(rng, g.f, g.K, g.N);
        std::uniform_int_distribution<int> code(100, 150);  // codes in the window: the tiles run
        for (auto &b : c.scale) b = uint8_t(code(rng));
        expect_split_by_token_count(rng, c, g.first, g.count, both, x2, amx);
    }
}

// The AVX-VNNI kernels of the AVX2 tier (quant_avxvnni.cpp, quant_gguf_*avxvnni.cpp) form the same int32 sums as the AVX2
// ones, so their outputs are equal bit for bit: fresh random weights and activations, every token
// count 1..17, counts with tails, K with partial 64s / 128s; quant_ops picks them where cpuid has
// avx_vnni and FT_CPU_VNNI allows.
TEST(QuantKernels, AvxVnniEqualsAvx2Bitwise) {
    if (!ft::cpu::cpu_has_avx_vnni() || int(ft::cpu::cpu_best_isa()) < int(Isa::avx2))
        GTEST_SKIP() << "no avx_vnni here";
    std::mt19937 rng(uint32_t(ft::test::fresh_seed("QuantKernels.AvxVnniEqualsAvx2Bitwise")));
    struct G { Format f; int64_t K, N, first; int count; };
    const G geos[] = {{Format::nvfp4, 272, 40, 1, 37}, {Format::ds_fp4, 640, 11, 0, 11},
                      {Format::mxfp4, 96, 200, 3, 190}, {Format::mxfp4, 64, 72, 2, 45},
                      {Format::q4_0, 547 * 32, 9, 1, 7},
                      {Format::q4_0, 224, 20, 0, 20},
                      {Format::q8_0, 544, 13, 2, 9},
                      {Format::q4_k, 768, 12, 1, 11},
                      {Format::q5_k, 512, 9, 0, 9},
                      {Format::q6_k, 33 * 256, 5, 1, 3},
                      {Format::q2_k, 768, 10, 3, 7},
                      {Format::q3_k, 512, 9, 0, 9},
                      {Format::iq4_xs, 1280, 7, 1, 5}};
    for (const G &g : geos) {
        const ft::cpu::QuantOps *plain = ft::cpu::quant_ops_variant(g.f, Isa::avx2, false, false);
        const ft::cpu::QuantOps *vnni = ft::cpu::quant_ops_variant(g.f, Isa::avx2, true, false);
        ASSERT_NE(plain->gemv, vnni->gemv) << plain->kernel;
        ASSERT_EQ(plain->prepare, vnni->prepare) << vnni->kernel;
        const std::string name = vnni->kernel;
        EXPECT_EQ(name.substr(name.size() - 9), "-avx2vnni");
        expect_vnni_choice(g.f, Isa::avx2, vnni, plain);
        const Case c = make_case(rng, g.f, g.K, g.N);
        const int ntok = 17;
        const PreparedTokens p(rng, plain, c.K, ntok);
        const std::vector<const uint8_t *> &ap = p.ptr;
        for (int n = 1; n <= ntok; ++n) {
            std::vector<float> a(size_t(n) * g.count, 1.0f), b(size_t(n) * g.count, 2.0f);
            plain->gemv(c.m(), g.first, g.count, ap.data(), n, a.data(), size_t(g.count));
            vnni->gemv(c.m(), g.first, g.count, ap.data(), n, b.data(), size_t(g.count));
            ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << vnni->kernel << " tokens " << n;
        }
    }
}

// nvfp4 / ds_fp4 with AVX-512-VNNI at the avx512bf16 tier: the default kernel runs calls of up to
// x2_max_tokens tokens through the W4A8 x2 kernel (the avx512 tier's VNNI kernel) on the second
// part of its activation and larger ones through the avx512bf16 kernel on the first, so each
// token count equals one of those two bit for bit; FT_CPU_VNNI=0 selects the avx512bf16 kernel.
TEST(QuantKernels, E2m1VnniSplitsByTokenCount) {
    if (!__builtin_cpu_supports("avx512vnni") || int(ft::cpu::cpu_best_isa()) < int(Isa::avx512bf16))
        GTEST_SKIP() << "no avx512bf16 + vnni here";
    std::mt19937 rng(uint32_t(ft::test::fresh_seed("QuantKernels.E2m1VnniSplitsByTokenCount")));
    struct G { Format f; int64_t K, N, first; int count; };
    for (const G &g : {G{Format::nvfp4, 272, 40, 1, 37}, G{Format::ds_fp4, 640, 11, 0, 11}}) {
        const ft::cpu::QuantOps *both = ft::cpu::quant_ops_variant(g.f, Isa::avx512bf16, true, false);
        const ft::cpu::QuantOps *x2 = ft::cpu::quant_ops_variant(g.f, Isa::avx512, true, false);
        const ft::cpu::QuantOps *w4a16 = ft::cpu::quant_ops_variant(g.f, Isa::avx512bf16, false, false);
        ASSERT_GT(both->x2_max_tokens, 0) << both->kernel;
        ASSERT_NE(both->dequant_act_bytes, nullptr);
        EXPECT_EQ(both->dequant, w4a16->dequant);
        expect_vnni_choice(g.f, Isa::avx512bf16, both, w4a16);
        const Case c = make_case(rng, g.f, g.K, g.N);
        ASSERT_EQ(both->dequant_act_bytes(c.K), w4a16->act_bytes(c.K));
        expect_split_by_token_count(rng, c, g.first, g.count, both, x2, w4a16);
    }
}

// The SIMD preparation of the q4_0 four-block activation against the scalar definition, byte for
// byte, with K of a group + 1 block (padding), a zero block and .5 ties (block amax 127: d = 1).
TEST(QuantKernels, Q4_0X4PrepareMatchesDefinition) {
    if (!__builtin_cpu_supports("avx512vnni") || int(ft::cpu::cpu_best_isa()) < int(Isa::avx512))
        GTEST_SKIP() << "no avx512 + vnni here";
    std::mt19937 rng(98);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t K : {int64_t(160), int64_t(2816)}) {
        std::vector<uint16_t> x(K);
        for (int64_t k = 0; k < K; ++k) x[k] = ft::f32_to_bf16(u(rng) * (k % 96 < 32 ? 300.0f : 1.0f));
        for (int64_t k = 32; k < 64; ++k) x[k] = 0;
        const float ties[] = {127.0f, 2.5f, -3.5f, 12.5f, -0.5f, 0.5f, -126.5f, 6.5f};
        for (int i = 0; i < 32; ++i) x[64 + i] = ft::f32_to_bf16(i < 8 ? ties[i] : u(rng));
        const size_t n = ft::cpu::detail::q8_0_x4_act_bytes(K);
        std::vector<uint8_t> a(n + 64, 0xcd), b(n + 64, 0xcd);
        ft::cpu::detail::prepare_q8_0_x4_scalar(x.data(), K, a.data());
        ft::cpu::detail::prepare_q8_0_x4_avx512(x.data(), K, b.data());
        for (size_t i = 0; i < n + 64; ++i) ASSERT_EQ(a[i], b[i]) << "K=" << K << " byte " << i;
        EXPECT_EQ(int8_t(a[32 + 1]), 3) << "2.5 rounds away from zero";  // element 65: block 2, q lo byte 1
        EXPECT_EQ(int8_t(a[32 + 2]), -4);
    }
}

// ds_fp4 row exponent (the "-rowexp" kernel and dequantiser): every kernel against the reference
// with e8m0 codes that make subnormal block factors or products in the absolute arithmetic (the
// benchmark's bytes & 0x77: codes 0 .. 119), with a code above 190 in the call (absolute values,
// bias 0), with 255 (NaN: the rows holding it are NaN, the others not), and with sums beyond
// 2^96 (the rows redone with the absolute scales). Tokens 1..8, K with a partial scale group.
TEST(QuantKernels, DsFp4RowExponent) {
    std::mt19937 rng(4321);
    for (int64_t K : {int64_t(384), int64_t(1152)}) {
        Case c = make_case(rng, Format::ds_fp4, K, 13);
        for (auto &b : c.scale) b &= 0x77;  // 2^-127 .. 2^-8, 1 in 64 blocks code 0
        for (int ntok = 1; ntok <= 8; ++ntok) check(c, 0, 13, ntok, rng, 1e-5);
        check(c, 3, 9, 3, rng, 1e-5);
        Case big = make_case(rng, Format::ds_fp4, K, 13);
        big.scale[5 * K / 32 + 1] = 200;  // row 5: a call over it keeps the absolute scales
        for (int ntok : {1, 2, 5}) check(big, 0, 13, ntok, rng, 1e-5), check(big, 6, 7, ntok, rng, 1e-5);
        // Codes 150 .. 160 and |x| ~ 2^70: sums near 2^104, finite in fp32 but past 2^96.
        Case huge = make_case(rng, Format::ds_fp4, K, 13);
        std::uniform_int_distribution<int> hs(150, 160);
        for (auto &b : huge.scale) b = uint8_t(hs(rng));
        for (int ntok : {1, 4}) check(huge, 0, 13, ntok, rng, 1e-5, 0x1p70f);
    }
    // e8m0 255 (NaN) in row 2: its outputs are NaN, every other row finite, every kernel.
    Case c = make_case(rng, Format::ds_fp4, 256, 6);
    c.scale[2 * 8 + 3] = 255;
    std::vector<uint16_t> x(256);
    for (int k = 0; k < 256; ++k) x[k] = ft::f32_to_bf16(0.5f - float(k % 5) * 0.2f);
    for (const ft::cpu::QuantOps *ops : variants_here(Format::ds_fp4)) {
        std::vector<uint8_t> act(ops->act_bytes(256));
        ops->prepare(x.data(), 256, act.data());
        const uint8_t *ap = act.data();
        std::vector<float> out(6, 0.0f);
        ops->gemv(c.m(), 0, 6, &ap, 1, out.data(), 6);
        for (int r = 0; r < 6; ++r) EXPECT_EQ(std::isnan(out[r]), r == 2) << ops->kernel << " row " << r;
    }
}

// mxfp4 e8m0 codes at both ends (the AVX2 kernel's 2^32-biased factors, quant_avx2_unit.inc): every
// kernel against the reference with codes that make subnormal factors or products in the absolute
// arithmetic (codes 0 .. 119), with codes above 190 in two columns (computed again with the
// absolute factors: finite), with sums past 2^96 (the same), and with 255 (NaN: its column NaN,
// every other finite). Tokens 1..8, 32- and 16-column tiles and a tail.
TEST(QuantKernels, Mxfp4ExtremeScaleCodes) {
    std::mt19937 rng(4322);
    const int64_t K = 384, N = 45;
    Case c = make_case(rng, Format::mxfp4, K, N);
    for (auto &b : c.scale) b &= 0x77;  // 2^-127 .. 2^-8, 1 in 64 blocks code 0
    for (int ntok = 1; ntok <= 8; ++ntok) check(c, 0, int(N), ntok, rng, 1e-5);
    check(c, 3, 37, 3, rng, 1e-5);
    Case big = make_case(rng, Format::mxfp4, K, N);
    big.scale[2 * N + 5] = 200;
    big.scale[9 * N + 40] = 230;
    for (int ntok : {1, 2, 5}) check(big, 0, int(N), ntok, rng, 1e-5);
    // Codes 150 .. 160 and |x| ~ 2^70: sums near 2^104, finite in fp32 but past 2^96.
    Case huge = make_case(rng, Format::mxfp4, K, N);
    std::uniform_int_distribution<int> hs(150, 160);
    for (auto &b : huge.scale) b = uint8_t(hs(rng));
    for (int ntok : {1, 4}) check(huge, 0, int(N), ntok, rng, 1e-5, 0x1p70f);
    Case nan = make_case(rng, Format::mxfp4, K, N);
    nan.scale[3 * N + 7] = 255;
    std::vector<uint16_t> x(K);
    for (int64_t k = 0; k < K; ++k) x[k] = ft::f32_to_bf16(0.5f - float(k % 5) * 0.2f);
    for (const ft::cpu::QuantOps *ops : variants_here(Format::mxfp4))
        for (int ntok : {1, 3}) {
            std::vector<uint8_t> act(ops->act_bytes(K));
            ops->prepare(x.data(), K, act.data());
            std::vector<const uint8_t *> ap(size_t(ntok), act.data());
            std::vector<float> out(size_t(N) * ntok, 0.0f);
            ops->gemv(nan.m(), 0, int(N), ap.data(), ntok, out.data(), size_t(N));
            for (int t = 0; t < ntok; ++t)
                for (int64_t n = 0; n < N; ++n)
                    EXPECT_EQ(std::isnan(out[t * N + n]), n == 7) << ops->kernel << " token " << t << " column " << n;
        }
}

// mxfp4 and ds_fp4 with every e8m0 code in 100..150 (their AMX kernels fold codes 64..190 into the
// weights' exponents; make_case mixes in code 0 everywhere), then with one code of 20 (that
// mxfp4 line or ds_fp4 row through the AVX-512-BF16 kernels, the rest on the tiles), every token
// count 1..32. mxfp4: K of two chunks of 512 plus 64, columns past one super-block of 256 (4 lines
// + 1 whole + 1 partial), first not on a line; ds_fp4: K of one B chunk of 512 plus 128, rows
// past two super-blocks of 128 and 2 rows past the last tile.
TEST(QuantKernels, E2m1ScaleCodeWindow) {
    std::mt19937 rng(uint32_t(ft::test::fresh_seed("QuantKernels.E2m1ScaleCodeWindow")));
    struct G { Format f; int64_t K, N, first; int count; int64_t low; };
    for (const G &g : {G{Format::mxfp4, 1088, 400, 7, 330, 5 * 400 + 200}, G{Format::ds_fp4, 640, 300, 3, 290, 53 * 20 + 2}}) {
        Case c = make_case(rng, g.f, g.K, g.N);
        std::uniform_int_distribution<int> code(100, 150);
        for (auto &b : c.scale) b = uint8_t(code(rng));
        for (int ntok = 1; ntok <= 32; ++ntok) check(c, g.first, g.count, ntok, rng, 1e-5);
        c.scale[size_t(g.low)] = 20;
        for (int ntok : {1, 2, 5, 16, 17}) check(c, g.first, g.count, ntok, rng, 1e-5);
    }
}

// The SIMD preparation of the ds_fp4 AVX-512-BF16 activation against its scalar definition, byte
// for byte: groups of 128 at many magnitudes (amax below the 1e-4 floor, e4m3 subnormal and
// normal ranges, near the bf16 maximum), an all-zero group, exact e4m3 rounding ties, negative
// zeros, and groups holding Inf or NaN (the scalar fallback).
TEST(QuantKernels, DsFp4PrepareMatchesDefinition) {
    if (int(ft::cpu::cpu_best_isa()) < int(Isa::avx512bf16)) GTEST_SKIP() << "no avx512bf16 here";
    std::mt19937 rng(97);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const float mags[] = {1e-7f, 3e-5f, 1e-3f, 1.0f, 3.0f, 448.0f, 1e4f, 1e20f, 3e38f, 1.0f, 1.0f, 1.0f, 0.0f};
    const int64_t groups = int64_t(std::size(mags));
    const int64_t K = 128 * groups;
    std::vector<uint16_t> x(K);
    for (int64_t k = 0; k < K; ++k) {
        const float m = mags[k / 128];
        // A spread of magnitudes inside each group too (e4m3 subnormals after the scaling).
        x[k] = ft::f32_to_bf16(u(rng) * m * (k % 3 == 0 ? 1e-3f : 1.0f));
    }
    // Group 9: amax 448 (s = 1), so x is rounded to e4m3 as is: ties at 3 mantissa bits and at
    // multiples of 2^-9 (the subnormal range), both signs; negative zero.
    const float ties[] = {448.0f, 1.0625f, -1.0625f, 1.1875f, 17.0f, -19.0f, 0.0029296875f, -0.0048828125f,
                          0.0068359375f, -0.0f, 0.013671875f, 240.0f, 232.0f, -0.0009765625f};
    for (size_t i = 0; i < std::size(ties); ++i) x[9 * 128 + int64_t(i)] = ft::f32_to_bf16(ties[i]);
    x[10 * 128 + 7] = 0x7f80;   // +Inf
    x[11 * 128 + 100] = 0xffc1;  // NaN
    for (int64_t k = 12 * 128; k < K; ++k) x[k] = (k & 1) ? 0x8000 : 0;  // zeros of both signs
    std::vector<uint8_t> a(2 * K + 64, 0xcd), b(2 * K + 64, 0xcd);
    ft::cpu::detail::prepare_ds_fp4_bf16_scalar(x.data(), K, a.data());
    ft::cpu::detail::prepare_ds_fp4_bf16_avx512(x.data(), K, b.data());
    for (int64_t i = 0; i < 2 * K + 64; ++i) ASSERT_EQ(a[i], b[i]) << "byte " << i << " group " << i / 256;
    // The definition itself: group 9's values are e4m3 values already or ties rounded to even.
    const uint16_t *y = reinterpret_cast<const uint16_t *>(a.data()) + 9 * 128;
    EXPECT_EQ(ft::bf16_to_f32(y[32 * 1 + 0]), 1.0f) << "1.0625 ties to even (1.0)";  // element 1: phase 1, word 0
    EXPECT_EQ(ft::bf16_to_f32(y[32 * 3 + 0]), 1.25f) << "1.1875 ties to even (1.25)";  // element 3
}

// e4m3 NaN codes in fp8_block weights reach the output of their row only (the reference says
// NaN); every kernel, for one token and for three (a 16-row tile: the AMX kernel's path).
TEST(QuantKernels, Fp8NanCodesPropagate) {
    std::mt19937 rng(77);
    Case c = make_case(rng, Format::fp8_block, 256, 16);
    c.data[2 * 256 + 17] = 0x7f;
    c.data[5 * 256 + 200] = 0xff;
    std::vector<uint16_t> x(256);
    for (int k = 0; k < 256; ++k) x[k] = ft::f32_to_bf16(0.5f + float(k % 7) * 0.1f);
    for (const ft::cpu::QuantOps *ops : variants_here(Format::fp8_block)) {
        std::vector<uint8_t> act(ops->act_bytes(256));
        ops->prepare(x.data(), 256, act.data());
        const uint8_t *ap[3] = {act.data(), act.data(), act.data()};
        for (int ntok : {1, 3}) {
            std::vector<float> out(size_t(ntok) * 16, 0.0f);
            ops->gemv(c.m(), 0, 16, ap, ntok, out.data(), 16);
            for (int t = 0; t < ntok; ++t)
                for (int r = 0; r < 16; ++r)
                    EXPECT_EQ(std::isnan(out[t * 16 + r]), r == 2 || r == 5) << ops->kernel << " token " << t << " row " << r;
        }
    }
}

// Non-finite and extreme activations (the hidden state when check_finite is off, or the
// intermediate of an expert whose weights hold NaN) on every kernel and preparation runnable
// here: preparations stay defined (UBSan checks the conversions in the sanitizer build), a block
// holding NaN or +-Inf makes the outputs that use it non-finite, tiny and huge finite values give
// finite codes. A CPU with AVX-512 runs its tiers here too (variants_here).
TEST(QuantKernels, NonFiniteActivationsGiveNonFiniteOutputs) {
    std::mt19937 rng(91);
    const int64_t K = 256, N = 8;
    const float inf = std::numeric_limits<float>::infinity();
    for (Format f : {Format::fp8_block, Format::nvfp4, Format::ds_fp4, Format::mxfp4, Format::q4_0, Format::q8_0,
                     Format::q4_k, Format::q5_k, Format::q6_k}) {
        const Case c = make_case(rng, f, K, N);
        for (float bad : {std::numeric_limits<float>::quiet_NaN(), inf, -inf}) {
            std::vector<uint16_t> x(K);
            for (int64_t k = 0; k < K; ++k) x[k] = ft::f32_to_bf16(0.25f + float(k % 5) * 0.125f);
            x[37] = ft::f32_to_bf16(bad);
            for (const ft::cpu::QuantOps *ops : variants_here(f)) {
                std::vector<uint8_t> act(ops->act_bytes(K) + 64);
                ops->prepare(x.data(), K, act.data());
                const uint8_t *ap = act.data();
                std::vector<float> out(N, 0.0f);
                ops->gemv(c.m(), 0, int(N), &ap, 1, out.data(), size_t(N));
                for (int64_t r = 0; r < N; ++r)
                    EXPECT_FALSE(std::isfinite(out[r])) << ops->kernel << " input " << bad << " row " << r;
            }
        }
        // Finite extremes: the largest bf16 and values far below kQ8MinAmax next to zeros.
        for (float big : {ft::bf16_to_f32(0x7f7f), 1e-38f, 1e-40f}) {
            std::vector<uint16_t> x(K, 0);
            for (int64_t k = 0; k < K; k += 3) x[k] = ft::f32_to_bf16(k % 2 ? big : -big);
            for (const ft::cpu::QuantOps *ops : variants_here(f)) {
                std::vector<uint8_t> act(ops->act_bytes(K) + 64);
                ops->prepare(x.data(), K, act.data());
                const uint8_t *ap = act.data();
                std::vector<float> out(N, 0.0f);
                ops->gemv(c.m(), 0, int(N), &ap, 1, out.data(), size_t(N));
                if (big < 1.0f) {
                    for (int64_t r = 0; r < N; ++r) EXPECT_TRUE(std::isfinite(out[r])) << ops->kernel << " row " << r;
                }
            }
        }
    }
}

// The Q8_0 rule itself on NaN, +-Inf, out-of-range and tiny blocks: codes in [-127, 127],
// d NaN exactly for the non-finite blocks, zero codes there.
TEST(QuantKernels, Q8BlockRuleDefinedForEveryInput) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> x(32 * 6, 1.0f);
    x[3] = nan;                                   // block 0
    x[32 + 5] = inf;                              // block 1
    x[64 + 7] = -inf;                             // block 2
    for (int i = 96; i < 128; ++i) x[i] = i % 2 ? 3e38f : -3e38f;  // block 3: huge, finite
    for (int i = 128; i < 160; ++i) x[i] = i % 4 ? 0.0f : 1e-40f;  // block 4: tiny, below kQ8MinAmax
    std::vector<int8_t> q(x.size(), 99);
    std::vector<float> d(6);
    ft::quantize_q8_0(x.data(), int64_t(x.size()), q.data(), d.data());
    for (int b = 0; b < 6; ++b) {
        EXPECT_EQ(std::isnan(d[b]), b < 3) << "block " << b;
        for (int i = 0; i < 32; ++i) {
            EXPECT_GE(q[32 * b + i], -127);
            if (b < 3 || b == 4) {
                EXPECT_EQ(q[32 * b + i], 0) << "block " << b << " i " << i;
            }
        }
    }
    EXPECT_EQ(d[4], 1.0f);
    EXPECT_EQ(q[96], -127);
    EXPECT_EQ(q[97], 127);
    int8_t q2[32];
    ft::cpu::detail::mxfp4_residual_q8(x.data(), q.data(), d[0], q2);
    for (int8_t v : q2) EXPECT_EQ(v, 0);
}

}  // namespace
