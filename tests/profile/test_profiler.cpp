// The profiler's internals: the geometries it measures.
#include <gtest/gtest.h>

#include "ft/formats.hpp"
#include "ft/profiler.hpp"

namespace {

// The measured geometries give spec 1.2's expert sizes.
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
