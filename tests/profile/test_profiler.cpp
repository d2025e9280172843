// The profiler's internals: the geometries it measures.
#include <gtest/gtest.h>

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
