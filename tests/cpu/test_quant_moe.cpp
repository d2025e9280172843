// Quantised expert formats on the CPU: the whole MoE layer per format and tier against the fp64
// reference of the dequantised weights (ft::dequant_projection, the one scalar reference), the
// fast FP8 round trip against ft::fp8_round_trip_per128, determinism across pool sizes and the
// dedup byte counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <tuple>

#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "ft/dequant.hpp"
#include "ft/formats.hpp"
#include "moe_reference.hpp"
#include "quant.hpp"
#include "quant_test_util.hpp"

namespace {

using namespace quant_test;

std::vector<double> reference(const QLayer &L, const Batch &b, const ft::cpu::ActivationSpec &act) {
    ft::test::ActivationRef a{act.kind, act.alpha, act.limit};
    ft::test::FormatNumerics fmt;
    if (L.f == Format::ds_fp4) {
        fmt.ds_fp4 = true;
        fmt.ds_limit = act.kind == FT_ACT_SILU && std::isfinite(act.limit) ? act.limit : 0.0;
        fmt.fp8_round_trip = [](const float *x, int64_t K, float *y) { ft::fp8_round_trip_per128(x, K, y); };
    }
    return ft::test::moe_reference_f32([&](int32_t e) { return L.expert(e); }, L.E, a, fmt, L.H, L.I, b.T, b.K,
                                          b.x.data(), b.ids.data(), b.w.data());
}

std::vector<ft::cpu::ActivationSpec> activations_of(Format f) {
    const float inf = std::numeric_limits<float>::infinity();
    switch (f) {
        case Format::mxfp4: return {{FT_ACT_SWIGLU_CLAMP, 1.702f, 7.0f}, {FT_ACT_SWIGLU_CLAMP, 1.702f, 0.3f}};
        case Format::ds_fp4: return {{FT_ACT_SILU, 1.702f, 0.0f}, {FT_ACT_SILU, 1.702f, 0.25f}, {FT_ACT_SILU, 1.702f, inf}};
        default: return {{FT_ACT_SILU, 1.702f, 7.0f}, {FT_ACT_GELU, 1.702f, 7.0f}, {FT_ACT_GELU_TANH, 1.702f, 7.0f}};
    }
}

// Max relative error bounds of the whole layer (bf16 output, so >= 2^-9 anyway): W8A16 / W4A16
// compute with exact weights and fp32 sums; the GGUF block formats (q4_0, q8_0, the K-quants) use
// Q8_0 activations in both GEMMs, and each is compared with the unquantised fp64 reference. mxfp4
// W4A8 x2 (two int8 terms per activation, the default with VNNI + VBMI) keeps the W4A16 bound:
// measured 2.5e-3 .. 3.2e-3 here, as W4A16.
// nvfp4 W4A8 (QuantChoice::nvfp4_w4a8, FT_CPU_NVFP4_W4A8=1; one int8 term per 16,
// ft::quantize_int8_per16) is W4A8 like q4_0: 3e-2; measured 1.1e-2 .. 1.3e-2 here.
double bound_of(Format f, const char *kernel = "") {
    return ft::format_is_block(f) || (f == Format::nvfp4 && std::strstr(kernel, "w4a8")) ? 3e-2 : 1e-2;
}

struct Geometry {
    Format f;
    int32_t H, I;
};
const Geometry kGeometries[] = {
    {Format::fp8_block, 256, 128}, {Format::nvfp4, 272, 48},  // nvfp4 rows ending in half a 32-chunk
    {Format::nvfp4, 256, 96},      {Format::mxfp4, 192, 96},  // pass-2 tiles of 32 and 64 columns
    {Format::ds_fp4, 256, 128},    {Format::q4_0, 224, 96},
    // GGUF block formats, Q8_0 activations like q4_0.
    {Format::q8_0, 224, 96},       {Format::q4_k, 512, 256},
    {Format::q5_k, 256, 512},      {Format::q6_k, 512, 256},
};

// The kernel choices the knobs make (docs/knobs.md), each one run explicitly.
struct Variant {
    const char *name;
    ft::cpu::QuantChoice choice;
};
const Variant kVariants[] = {
    {"defaults", {}},
    {"no_vnni", {false, true, false}},      // FT_CPU_VNNI=0: q4_0 on AVX-512F
    {"mxfp4_w4a16", {true, false, false}},  // FT_CPU_MXFP4_W4A8=0
    {"nvfp4_w4a8", {true, true, true}},     // FT_CPU_NVFP4_W4A8=1
};

ft::cpu::MoeTuning tuning_of(const Variant &v) {
    ft::cpu::MoeTuning t;
    t.quant = v.choice;
    return t;
}

class QuantMoe : public ::testing::TestWithParam<std::tuple<Isa, int>> {};

TEST_P(QuantMoe, MatchesDequantisedReference) {
    const Isa isa = std::get<0>(GetParam());
    const Variant &variant = kVariants[std::get<1>(GetParam())];
    if (int(isa) > int(ft::cpu::cpu_best_isa())) GTEST_SKIP() << ft::cpu::isa_name(isa) << " not supported here";
    ft::cpu::ThreadPool pool(2, false);
    for (const Geometry &geo : kGeometries) {
        // No knob changes the kernels of the GGUF block formats beyond q4_0: defaults only.
        if (ft::format_is_block(geo.f) && geo.f != Format::q4_0 && std::get<1>(GetParam()) != 0) continue;
        std::mt19937 rng(17 + int(geo.f) * 31 + geo.H);
        QLayer L(rng, geo.f, geo.H, geo.I, 6);
        for (const auto &act : activations_of(geo.f))
            for (int32_t T : {1, 2, 5, 16}) {
                const int32_t K = 4;
                ft::cpu::MoeExecutor ex(pool, geo.f, L.H, L.I, K, 16, act, 0, isa, tuning_of(variant));
                Batch b = random_batch(rng, L.E, L.H, T, K);
                std::vector<uint16_t> y(size_t(T) * L.H, 0x7fc0);
                auto src = L.cpu_source();
                ex.run(src, nullptr, T, b.x.data(), b.ids.data(), b.w.data(), y.data());
                const double err = ft::test::relative_error_bf16(y, reference(L, b, act));
                EXPECT_LT(err, bound_of(geo.f, ex.kernel_name())) << ft::format_name(geo.f) << " H=" << L.H << " I=" << L.I << " "
                                                << ex.kernel_name() << " act " << act.kind << " limit " << act.limit
                                                << " T=" << T;
                if (T >= 2) {
                    for (int32_t h = 0; h < L.H; ++h) ASSERT_EQ(y[size_t(T - 1) * L.H + h], 0) << "skipped token";
                }
            }
    }
}

INSTANTIATE_TEST_SUITE_P(AllTiers, QuantMoe,
                         ::testing::Combine(::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16),
                                            ::testing::Range(0, int(std::size(kVariants)))),
                         [](const auto &info) {
                             return std::string(ft::cpu::isa_name(std::get<0>(info.param))) + "_" +
                                    kVariants[std::get<1>(info.param)].name;
                         });

TEST(QuantMoe, SharedBf16ExpertNextToQuantisedRoutes) {
    std::mt19937 rng(8);
    QLayer L(rng, Format::q4_0, 128, 64, 4);
    ft::cpu::ThreadPool pool(2, false);
    const int32_t Is = 32;
    std::uniform_real_distribution<float> d(-0.1f, 0.1f);
    std::vector<uint16_t> sg(Is * L.H), su(Is * L.H), sd(L.H * Is);
    for (auto *v : {&sg, &su, &sd})
        for (auto &e : *v) e = ft::f32_to_bf16(d(rng) + 1e-3f);
    ft::cpu::SharedExpertView sh{sg.data(), su.data(), sd.data(), Is, nullptr};
    ft::cpu::MoeExecutor ex(pool, Format::q4_0, L.H, L.I, 2, 4, {}, Is, ft::cpu::cpu_best_isa());
    Batch b = random_batch(rng, L.E, L.H, 3, 2);
    std::vector<uint16_t> y(3 * L.H);
    auto src = L.cpu_source();
    ex.run(src, &sh, 3, b.x.data(), b.ids.data(), b.w.data(), y.data());
    auto ref = reference(L, b, {});
    ft::test::ExpertRef shr{sg.data(), su.data(), sd.data(), Is};
    for (int32_t t = 0; t < 3; ++t) {
        std::vector<double> o(L.H, 0.0);
        ft::test::expert_ref(shr, {}, L.H, b.x.data() + t * L.H, 1.0, o.data());
        for (int32_t h = 0; h < L.H; ++h) ref[t * L.H + h] += o[h];
    }
    EXPECT_LT(ft::test::relative_error_bf16(y, ref), 3e-2);
}

TEST(QuantMoe, IdenticalAcrossPoolSizesAndDedupCounts) {
    ft::cpu::ThreadPool p1(1, false), p2(2, false), p3(3, true);
    for (const Geometry &geo : kGeometries) {
        std::mt19937 rng(5 + int(geo.f));
        QLayer L(rng, geo.f, geo.H, geo.I, 8);
        const auto act = activations_of(geo.f)[0];
        for (Isa isa : tiers_here())
        for (const Variant &variant : kVariants) {
            Batch b = random_batch(rng, L.E, L.H, 11, 8);
            std::set<int32_t> distinct;
            for (int32_t e : b.ids)
                if (e >= 0 && e < L.E) distinct.insert(e);
            std::vector<uint16_t> first;
            for (ft::cpu::ThreadPool *pool : {&p1, &p2, &p3}) {
                ft::cpu::MoeExecutor ex(*pool, geo.f, L.H, L.I, 8, 16, act, 0, isa, tuning_of(variant));
                std::vector<uint16_t> y(size_t(11) * L.H);
                auto src = L.cpu_source();
                auto st = ex.run(src, nullptr, 11, b.x.data(), b.ids.data(), b.w.data(), y.data());
                EXPECT_EQ(st.experts_read, distinct.size());
                EXPECT_EQ(st.bytes_read, distinct.size() * ft::expert_bytes(geo.f, L.H, L.I));
                if (first.empty()) first = y;
                else EXPECT_EQ(y, first) << ft::format_name(geo.f) << " pool " << pool->size() << " " << ft::cpu::isa_name(isa)
                                         << " " << variant.name;
            }
        }
    }
}

// The batched path (dequantise to bf16 + bf16 GEMV) forced on for every expert and off, against
// the same reference as the direct kernels; bitwise independent of the pool size.
TEST(QuantMoe, BatchedPathMatchesReference) {
    ft::cpu::ThreadPool p1(1, false), p3(3, false);
    for (const Geometry &geo : kGeometries) {
        std::mt19937 rng(41 + int(geo.f) + geo.H);
        QLayer L(rng, geo.f, geo.H, geo.I, 4);
        const auto act = activations_of(geo.f)[0];
        for (Isa isa : tiers_here()) {
            Batch b = random_batch(rng, L.E, L.H, 13, 4);
            for (int32_t bmin : {1, 0, 5}) {
                ft::cpu::MoeTuning tu;
                tu.quant_batched_min_tokens = bmin;
                std::vector<uint16_t> first;
                for (ft::cpu::ThreadPool *pool : {&p1, &p3}) {
                    ft::cpu::MoeExecutor ex(*pool, geo.f, L.H, L.I, 4, 16, act, 0, isa, tu);
                    std::vector<uint16_t> y(size_t(13) * L.H, 0x7fc0);
                    auto src = L.cpu_source();
                    ex.run(src, nullptr, 13, b.x.data(), b.ids.data(), b.w.data(), y.data());
                    EXPECT_LT(ft::test::relative_error_bf16(y, reference(L, b, act)), bound_of(geo.f, ex.kernel_name()))
                        << ft::format_name(geo.f) << " " << ex.kernel_name() << " bmin " << bmin << " batched from "
                        << ex.quant_batched_min_tokens();
                    if (first.empty()) first = y;
                    else EXPECT_EQ(y, first) << ft::format_name(geo.f) << " bmin " << bmin;
                }
            }
        }
    }
}

TEST(QuantMoe, RejectsMismatchedSources) {
    ft::cpu::ThreadPool pool(1, false);
    std::mt19937 rng(2);
    QLayer L(rng, Format::ds_fp4, 128, 128, 2);
    ft::cpu::MoeExecutor ex(pool, Format::ds_fp4, 128, 128, 1, 1, {}, 0, ft::cpu::cpu_best_isa());
    std::vector<uint16_t> x(128, 0x3f80), y(128);
    int32_t id = 0;
    float w = 1.0f;
    auto src = L.cpu_source();
    src.format = Format::nvfp4;
    EXPECT_THROW(ex.run(src, nullptr, 1, x.data(), &id, &w, y.data()), ft::Error);
    src = L.cpu_source();
    src.row_bytes[3] = 1;
    EXPECT_THROW(ex.run(src, nullptr, 1, x.data(), &id, &w, y.data()), ft::Error);
    // ds_fp4 needs multiples of 128.
    EXPECT_THROW(ft::cpu::MoeExecutor(pool, Format::ds_fp4, 96, 128, 1, 1, {}, 0, ft::cpu::cpu_best_isa()), ft::Error);
}

TEST(QuantMoe, Fp8RoundTripMatchesReference) {
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (float scale : {1e-6f, 1e-3f, 1.0f, 300.0f, 1e5f}) {
        std::vector<uint16_t> x(1024);
        std::vector<float> xf(1024), ref(1024), got(1024);
        for (size_t i = 0; i < x.size(); ++i) {
            x[i] = ft::f32_to_bf16(d(rng) * scale * (i % 7 == 0 ? 1e-3f : 1.0f));
            xf[i] = ft::bf16_to_f32(x[i]);
        }
        ft::fp8_round_trip_per128(xf.data(), 1024, ref.data());
        ft::cpu::fp8_round_trip_bf16(x.data(), 1024, got.data());
        for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(std::memcmp(&got[i], &ref[i], 4), 0) << i << " scale " << scale;
    }
}

}  // namespace
