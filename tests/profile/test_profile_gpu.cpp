// The profiler's GPU figures on a real GPU: the production gather alone and beside the CPU
// kernels (docs/formulas.md, "Bandwidth profile", steps 1 and 4). Skips without a usable GPU. A bandwidth measurement of
// gigabytes with a bound on its duration: ctest label `timing` (tests/profile/CMakeLists.txt).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cmath>
#include <string>

#include "freetoken.h"
#include "ft/cuda_device.hpp"
#include "scratch_dir.hpp"

namespace {

TEST(ProfileGpu, GatherAndOverlappedFigures) {
    if (ft::cuda::device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    ft_profile_params p;
    ft_profile_params_init(&p);
    p.device = 0;
    p.formats = (1u << FT_FORMAT_BF16) | (1u << FT_FORMAT_MXFP4);
    p.max_seconds = 12.0;
    ft_profile *prof = nullptr;
    char err[512];
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(ft_profile_bandwidth(&p, &prof, err, sizeof err), FT_OK) << err;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(seconds, 40.0) << "a 12-second profile took " << seconds << " s";

    ft_profile_machine m;
    m.struct_size = sizeof m;
    ASSERT_EQ(ft_profile_get_machine(prof, &m), FT_OK);
    EXPECT_GT(m.h2d_gbs, 0.0);
    EXPECT_STRNE(m.gpu_name, "");
    for (int32_t f : {FT_FORMAT_BF16, FT_FORMAT_MXFP4}) {
        ft_profile_format e;
        e.struct_size = sizeof e;
        ASSERT_EQ(ft_profile_get_format(prof, f, &e), FT_OK) << f;
        std::printf("format %d: cpu %.1f, gather %.1f (H2D %.1f), overlapped cpu %.1f + gather %.1f GB/s, f %.2f\n", f, e.cpu_gbs,
                    e.gather_gbs, m.h2d_gbs, e.cpu_overlap_gbs, e.gather_overlap_gbs, e.fetch_fraction);
        EXPECT_GT(e.cpu_gbs, 0.0) << f;
        EXPECT_GT(e.gather_gbs, 0.0) << f;
        EXPECT_GT(e.cpu_overlap_gbs, 0.0) << f;
        EXPECT_GT(e.gather_overlap_gbs, 0.0) << f;
        // The gather moves experts over the same bus as the linear copy: it can lose to it
        // (scattered rows, SM loads) but cannot beat it by more than noise.
        EXPECT_GE(e.gather_gbs, 0.5 * m.h2d_gbs) << f;
        EXPECT_LE(e.gather_gbs, 1.1 * m.h2d_gbs) << f;
        EXPECT_GT(e.fetch_fraction, 0.0) << f;
        EXPECT_LE(e.fetch_fraction, 1.0) << f;
    }
    // The verdicts are written for the original engine too.
    const ft::test::ScratchDir dir;
    const std::string file = dir / "benchbw.json";
    ASSERT_EQ(ft_profile_save(prof, file.c_str(), err, sizeof err), FT_OK) << err;
    ft_profile_free(prof);
    const std::string text = ft::test::read_file(file);
    ASSERT_FALSE(text.empty()) << file;
    const bool verdict = text.find("\"recommended\": \"hybrid\"") != std::string::npos ||
                         text.find("\"recommended\": \"offload\"") != std::string::npos;
    EXPECT_TRUE(verdict) << text;
}

// Every format with the default budget (30 s, soft): the gather and the overlapped pair measured
// for each, and the whole run close to its bound.
TEST(ProfileGpu, EveryFormatWithinTheDefaultBudget) {
    if (ft::cuda::device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    ft_profile_params p;
    ft_profile_params_init(&p);
    p.device = 0;
    ft_profile *prof = nullptr;
    char err[512];
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(ft_profile_bandwidth(&p, &prof, err, sizeof err), FT_OK) << err;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("every format: %.1f s for a %.0f-second budget\n", seconds, p.max_seconds);
    // Beyond the soft bound: CUDA's start-up and at most the overlapped pair's 0.2 s minimum per format.
    EXPECT_LT(seconds, p.max_seconds + 10.0) << "the default profile took " << seconds << " s";
    for (int32_t f = FT_FORMAT_BF16; f <= FT_FORMAT_IQ4_XS; ++f) {
        ft_profile_format e;
        e.struct_size = sizeof e;
        ASSERT_EQ(ft_profile_get_format(prof, f, &e), FT_OK) << f;
        std::printf("format %2d: cpu %.1f, gather %.1f, overlapped cpu %.1f + gather %.1f GB/s, f %.2f (%s)\n", f, e.cpu_gbs,
                    e.gather_gbs, e.cpu_overlap_gbs, e.gather_overlap_gbs, e.fetch_fraction, e.cpu_kernel);
        EXPECT_TRUE(std::isfinite(e.cpu_gbs) && e.cpu_gbs > 0.0) << f;
        EXPECT_GT(e.gather_gbs, 0.0) << f;
        EXPECT_GT(e.cpu_overlap_gbs, 0.0) << f;
        EXPECT_GT(e.gather_overlap_gbs, 0.0) << f;
        EXPECT_GT(e.fetch_fraction, 0.0) << f;
        EXPECT_LE(e.fetch_fraction, 1.0) << f;
    }
    ft_profile_free(prof);
}

}  // namespace
