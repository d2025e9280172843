// The profiler's internals: the geometries it measures and the synthetic banks it fills.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "ft/formats.hpp"
#include "ft/profiler.hpp"
#include "freetoken.h"

namespace {

// The measured geometries give the expert sizes of docs/formulas.md.
TEST(ProfileGeometry, ExpertBytesOfSpec12) {
    auto bytes = [](ft::Format f) {
        const ft::ProfileGeometry g = ft::profile_geometry(f);
        EXPECT_TRUE(ft::format_geometry_error(f, g.hidden, g.intermediate).empty()) << ft::format_name(f);
        return ft::expert_bytes(f, g.hidden, g.intermediate);
    };
    EXPECT_EQ(bytes(ft::Format::bf16), 9437184u);
    EXPECT_EQ(bytes(ft::Format::nvfp4), 7974912u);
    EXPECT_EQ(bytes(ft::Format::fp8_block), 3146112u);
    EXPECT_EQ(bytes(ft::Format::mxfp4), 13236480u);
    EXPECT_EQ(bytes(ft::Format::ds_fp4), 13369344u);
    EXPECT_EQ(bytes(ft::Format::q4_0), 2u * 704 * 88 * 18 + 2816u * 22 * 18);
    EXPECT_EQ(ft::profile_geometry(ft::Format::mxfp4).activation, FT_ACT_SWIGLU_CLAMP);
    EXPECT_EQ(ft::profile_geometry(ft::Format::q4_0).activation, FT_ACT_GELU_TANH);
    EXPECT_EQ(ft::profile_geometry(ft::Format::ds_fp4).swiglu_limit, 7.0f);
    // The other GGUF block formats at qwen3-30b-a3b's shape: 2I rows of H/256 super-blocks, H of I/256.
    for (ft::Format f : {ft::Format::q8_0, ft::Format::q2_k, ft::Format::q3_k, ft::Format::q4_k, ft::Format::q5_k,
                         ft::Format::q6_k, ft::Format::iq4_xs}) {
        const ft::ProfileGeometry g = ft::profile_geometry(f);
        EXPECT_EQ(g.hidden, 2048) << ft::format_name(f);
        EXPECT_EQ(g.intermediate, 768) << ft::format_name(f);
        EXPECT_EQ(g.top_k, 8) << ft::format_name(f);
        EXPECT_EQ(g.activation, FT_ACT_SILU) << ft::format_name(f);
        const size_t per_2048 = f == ft::Format::q8_0 ? 64u * 34 : 8u * size_t(ft::block_bytes(f));
        EXPECT_EQ(bytes(f), 2u * 768 * per_2048 + 2048u * per_2048 * 768 / 2048) << ft::format_name(f);
    }
    EXPECT_EQ(bytes(ft::Format::q4_k), 2u * 768 * 8 * 144 + 2048u * 3 * 144);
}

// Small experts (the GGUF low-bit formats) fill a window beyond 4 x LLC on a large cache, where
// 128 of them would not; otherwise the window's size and the 128-expert cap decide.
TEST(ProfileWindow, SmallExpertsSpanFourTimesTheCache) {
    const size_t MiB = size_t{1} << 20, GiB = size_t{1} << 30;
    const size_t q2k = ft::expert_bytes(ft::Format::q2_k, 2048, 768);  // 1.55 MB
    EXPECT_EQ(ft::window_experts(2 * GiB, q2k, 8, 8 * MiB), 128);        // 128 x 1.55 MB >> 4 x 8 MiB
    EXPECT_EQ(ft::window_experts(32 * MiB, q2k, 8, 8 * MiB), int64_t(32 * MiB / q2k));
    const int64_t e = ft::window_experts(2 * GiB, q2k, 8, 105 * MiB);   // a 105 MiB LLC
    EXPECT_EQ(e, int64_t((4 * 105 * MiB + q2k - 1) / q2k));
    EXPECT_GE(uint64_t(e) * q2k, 4 * 105 * MiB);
    EXPECT_EQ(ft::window_experts(2 * GiB, q2k, 8, 1024 * MiB), 1024);   // the cap
    EXPECT_EQ(ft::window_experts(64 * MiB, 9437184, 8, 8 * MiB), 16);    // 2 top_k at least
}

// Where each GGUF block format keeps its fp16 scales (docs/formats.md, "GGUF block formats").
struct ScaleFields {
    ft::Format format;
    std::vector<int> offsets;
};
const ScaleFields kGgufScales[] = {
    {ft::Format::q4_0, {0}},  {ft::Format::q8_0, {0}},    {ft::Format::q2_k, {80, 82}}, {ft::Format::q3_k, {108}},
    {ft::Format::q4_k, {0, 2}}, {ft::Format::q5_k, {0, 2}}, {ft::Format::q6_k, {208}},    {ft::Format::iq4_xs, {0}},
};

// The banks the profiler measures each GGUF block format on: every block's d (and dmin) is a
// positive normal fp16 far from the subnormals, and the reference dequantisation of every row of
// three experts is finite, small and not constant.
TEST(ProfilerFill, GgufBlocksHaveSmallNormalScalesAndDequantiseFinite) {
    ft::cpu::ThreadPool pool(2, false);
    for (const ScaleFields &sf : kGgufScales) {
        const ft::Format f = sf.format;
        SCOPED_TRACE(ft::format_name(f));
        const ft::ProfileGeometry g = ft::profile_geometry(f);
        const std::vector<ft::BankSpec> schema = ft::bank_schema(f, g.hidden, g.intermediate);
        ASSERT_EQ(schema.size(), 2u);
        const int64_t experts = 3;
        const size_t bb = size_t(ft::block_bytes(f));
        for (size_t b = 0; b < schema.size(); ++b) {
            const size_t bytes = schema[b].row_bytes * experts;
            std::vector<uint8_t> bank(bytes);
            ft::fill_synthetic_bank(pool, f, schema[b].name, bank.data(), bytes, 1234 + b);
            // The same bytes again from the same seed (the split over the workers does not matter).
            std::vector<uint8_t> again(bytes);
            ft::cpu::ThreadPool one(1, false);
            ft::fill_synthetic_bank(one, f, schema[b].name, again.data(), bytes, 1234 + b);
            EXPECT_EQ(bank, again);

            ASSERT_EQ(bytes % bb, 0u);
            std::set<uint16_t> distinct;
            for (size_t i = 0; i < bytes / bb; ++i) {
                for (int off : sf.offsets) {
                    uint16_t h;
                    std::memcpy(&h, bank.data() + i * bb + size_t(off), 2);
                    const int exponent = (h >> 10) & 31;
                    ASSERT_EQ(h >> 15, 0) << "negative scale in block " << i;
                    ASSERT_GT(exponent, 0) << "zero or subnormal scale in block " << i;
                    ASSERT_LT(exponent, 31) << "inf/NaN scale in block " << i;
                    const float v = ft::f16_to_f32(h);
                    ASSERT_GE(v, std::ldexp(1.0f, -13)) << "block " << i;
                    ASSERT_LT(v, std::ldexp(1.0f, -6)) << "block " << i;
                    distinct.insert(h);
                }
            }
            EXPECT_GT(distinct.size(), 16u) << "scales are not random";

            // Bank 0 holds 2I rows of H, bank 1 H rows of I, per expert.
            const int64_t K = b == 0 ? g.hidden : g.intermediate;
            const int64_t rows = experts * (b == 0 ? 2 * g.intermediate : g.hidden);
            const size_t row_bytes = ft::block_row_bytes(f, K);
            ASSERT_EQ(size_t(rows) * row_bytes, bytes);
            std::vector<float> w(static_cast<size_t>(K));
            float max_abs = 0.0f;
            double sum_sq = 0.0;
            for (int64_t r = 0; r < rows; ++r) {
                ft::dequant_row_block(f, bank.data() + size_t(r) * row_bytes, K, w.data());
                for (float v : w) {
                    ASSERT_TRUE(std::isfinite(v)) << "row " << r;
                    max_abs = std::max(max_abs, std::fabs(v));
                    sum_sq += double(v) * v;
                }
            }
            EXPECT_LE(max_abs, 1.0f);
            EXPECT_GT(sum_sq, 0.0);
        }
    }
}

}  // namespace

namespace {

// A CPU-only run (device NONE) leaves every GPU figure empty and gives no verdict: the original
// engine reads the entry, finds no gather, and the selector falls back.
TEST(Profiler, CpuOnlyRunHasNoGpuFigures) {
    ft_profile_params p{};  // ft_profile_params_init lives in the C API, not linked here
    p.struct_size = sizeof p;
    p.device = FT_DEVICE_NONE;
    p.cpu_threads = 2;
    p.formats = 1u << FT_FORMAT_FP8_BLOCK;
    p.max_seconds = 1.0;
    const ft::Profile prof = ft::measure_profile(p);
    ASSERT_EQ(prof.dtype_kernels.count("fp8_block"), 1u);
    const ft::KernelEntry &e = prof.dtype_kernels.at("fp8_block");
    ASSERT_TRUE(e.cpu_moe_gbs.has_value());
    EXPECT_GT(*e.cpu_moe_gbs, 0.0);
    EXPECT_FALSE(e.pcie_gather_gbs.has_value());
    EXPECT_FALSE(e.cpu_moe_overlap_gbs.has_value());
    EXPECT_FALSE(e.pcie_gather_overlap_gbs.has_value());
    EXPECT_FALSE(e.ratio.has_value());
    EXPECT_TRUE(e.recommended.empty());
    EXPECT_NE(e.note.find("no GPU measured"), std::string::npos) << e.note;
    EXPECT_TRUE(prof.dtypes.empty());
    EXPECT_FALSE(prof.pcie_linear_h2d_gbs.has_value());
    EXPECT_FALSE(ft::hybrid_fetch_fraction(prof, "fp8_block").has_value());
    EXPECT_FALSE(ft::backend_recommendation(prof, "fp8_block").has_value());
}

}  // namespace
