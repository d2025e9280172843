#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "ft/common.hpp"
#include "ft/profile.hpp"
#include "scratch_dir.hpp"

namespace {

// A profile in the original engine's v4 shape (docs/formulas.md), as its writer lays it out.
const char *kOriginal = R"({
  "version": 4,
  "timestamp": "2026-08-20T10:11:12+02:00",
  "epoch": 1787213472,
  "host": "box",
  "gpu": {"index": 0, "name": "NVIDIA GeForce RTX 5090"},
  "cpu": {"physical_cores": 16, "threads_used": 16},
  "threshold": 2.0,
  "ceilings": {"cpu_stream_read_gbs": 84.5, "pcie_linear_h2d_gbs": 55.1, "pcie_linear_d2h_gbs": 54.2},
  "dtypes": {"bf16": "offload", "nvfp4": "hybrid"},
  "dtype_kernels": {
    "bf16": {"expert_bytes": 9437184, "synth_experts": 128, "cpu_moe_gbs": 50.0, "cpu_moe_isa": "avx512bf16",
             "isa_sweep": null, "pcie_gather_gbs": 20.0, "cpu_moe_overlap_gbs": null,
             "pcie_gather_overlap_gbs": null, "ratio": 2.5, "recommended": "hybrid", "note": ""},
    "nvfp4": {"expert_bytes": 7974912, "synth_experts": 128, "cpu_moe_gbs": 60.0, "cpu_moe_isa": "avx512",
              "isa_sweep": null, "pcie_gather_gbs": 30.0, "cpu_moe_overlap_gbs": 30.0,
              "pcie_gather_overlap_gbs": 10.0, "ratio": 2.0, "recommended": "offload", "note": "x | y"}
  },
  "workloads": {
    "gpt-oss-120b": {"model": {"name": "gpt-oss-120b", "hidden": 2880, "inter": 2880, "experts": 128, "top_k": 4},
                     "kernels": {"mxfp4_triton": {"expert_bytes": 13236480, "synth_experts": 128, "cpu_moe_gbs": 40.0,
                                                  "cpu_moe_isa": "avx512", "isa_sweep": null, "pcie_gather_gbs": 25.0,
                                                  "cpu_moe_overlap_gbs": null, "pcie_gather_overlap_gbs": null,
                                                  "ratio": 1.6, "recommended": "offload", "note": ""}},
                     "recommended_moe_backend": {"mxfp4_triton": "offload"}},
    "dsv4": {"model": {"name": "dsv4", "hidden": 4096, "inter": 2048, "experts": 256, "top_k": 6},
             "kernels": {"ds_fp4": {"expert_bytes": 13369344, "synth_experts": 128, "cpu_moe_gbs": 90.0,
                                    "cpu_moe_isa": "avx512", "isa_sweep": null, "pcie_gather_gbs": 30.0,
                                    "cpu_moe_overlap_gbs": null, "pcie_gather_overlap_gbs": null, "ratio": 3.0,
                                    "recommended": "hybrid", "note": ""}},
             "recommended_moe_backend": {"ds_fp4": "hybrid"}}
  }
})";

TEST(Profile, ReadsTheOriginalV4Shape) {
    const ft::Profile p = ft::profile_from_json(kOriginal);
    EXPECT_EQ(p.gpu_name, "NVIDIA GeForce RTX 5090");
    EXPECT_EQ(p.physical_cores, 16);
    ASSERT_TRUE(p.cpu_stream_read_gbs);
    EXPECT_DOUBLE_EQ(*p.cpu_stream_read_gbs, 84.5);
    ASSERT_EQ(p.workloads.size(), 2u);
    EXPECT_EQ(p.workloads[0].name, "gpt-oss-120b");  // file order kept
    EXPECT_EQ(p.workloads[1].top_k, 6);
    EXPECT_EQ(p.dtype_kernels.at("nvfp4").note, "x | y");
    EXPECT_FALSE(p.dtype_kernels.at("bf16").cpu_moe_overlap_gbs);
}

TEST(Profile, FetchFractionRulesOfTheOriginalReader) {
    const ft::Profile p = ft::profile_from_json(kOriginal);
    // Standalone pair only: pcie / cpu = 20 / 50.
    EXPECT_NEAR(*ft::hybrid_fetch_fraction(p, "bf16"), 0.4, 1e-12);
    // Overlapped pair preferred: 10 / (10 + 30).
    EXPECT_NEAR(*ft::hybrid_fetch_fraction(p, "nvfp4"), 0.25, 1e-12);
    // No per-format entry: the per-model entry, 25 / 40.
    EXPECT_NEAR(*ft::hybrid_fetch_fraction(p, "mxfp4_triton"), 0.625, 1e-12);
    // Nothing for a format the profile does not cover.
    EXPECT_FALSE(ft::hybrid_fetch_fraction(p, "q4_0"));
    // The standalone rule is clamped at 1 when PCIe outruns the CPU.
    ft::Profile q = p;
    q.dtype_kernels["bf16"].pcie_gather_gbs = 80.0;
    EXPECT_DOUBLE_EQ(*ft::hybrid_fetch_fraction(q, "bf16"), 1.0);
}

TEST(Profile, BackendRecommendationRules) {
    ft::Profile p = ft::profile_from_json(kOriginal);
    EXPECT_EQ(*ft::backend_recommendation(p, "bf16"), "offload");   // dtypes wins over the entry
    EXPECT_EQ(*ft::backend_recommendation(p, "nvfp4"), "hybrid");
    EXPECT_EQ(*ft::backend_recommendation(p, "ds_fp4"), "hybrid");  // all models say hybrid
    EXPECT_EQ(*ft::backend_recommendation(p, "mxfp4_triton"), "offload");
    EXPECT_FALSE(ft::backend_recommendation(p, "q4_0"));
    // Any model saying offload makes it offload.
    ft::WorkloadEntry w;
    w.name = "other";
    w.kernels["ds_fp4"].recommended = "offload";
    p.workloads.push_back(w);
    EXPECT_EQ(*ft::backend_recommendation(p, "ds_fp4"), "offload");
}

TEST(Profile, RoundTripKeepsEveryField) {
    ft::Profile p = ft::profile_from_json(kOriginal);
    p.library_version = "0.1.0";
    p.cpu_model = "Xeon";
    const ft::Profile q = ft::profile_from_json(ft::profile_to_json(p));
    EXPECT_EQ(ft::profile_to_json(q), ft::profile_to_json(p));
    EXPECT_EQ(q.library_version, "0.1.0");
    EXPECT_EQ(q.cpu_model, "Xeon");
    EXPECT_EQ(q.workloads[1].kernels.at("ds_fp4").expert_bytes, 13369344u);
    EXPECT_NEAR(*q.dtype_kernels.at("nvfp4").pcie_gather_overlap_gbs, 10.0, 1e-12);
}

TEST(Profile, WriterRoundsLikeTheOriginal) {
    ft::Profile p;
    p.cpu_stream_read_gbs = 84.56789;
    p.dtype_kernels["bf16"].ratio = 2.123456;
    const std::string j = ft::profile_to_json(p);
    EXPECT_NE(j.find("84.57"), std::string::npos) << j;
    EXPECT_NE(j.find("2.123"), std::string::npos) << j;
    EXPECT_EQ(j.back(), '\n');
}

TEST(Profile, CorruptProfilesAreFormatErrors) {
    for (const char *bad : {"", "{", "[]", R"({"version": 3})", R"({"version": "4"})",
                            R"({"version": 4, "gpu": []})", R"({"version": 4, "threshold": "x"})",
                            R"({"version": 4, "dtype_kernels": {"bf16": {"cpu_moe_gbs": "fast"}}})",
                            R"({"version": 4, "workloads": {"m": 7}})"}) {
        try {
            ft::profile_from_json(bad);
            ADD_FAILURE() << "accepted: " << bad;
        } catch (const ft::Error &e) {
            EXPECT_EQ(e.status(), FT_ERR_FORMAT) << bad;
        }
    }
}

using ft::test::ScratchDir;

TEST(Profile, SaveIsAtomicAndUsableProfilesMatchTheGpu) {
    ScratchDir dir;
    const std::string path = dir.path() + "/sub/benchbw.json";
    ft::Profile p = ft::profile_from_json(kOriginal);
    ft::save_profile(p, path);
    EXPECT_NE(::access((path + ".tmp." + std::to_string(::getpid())).c_str(), F_OK), 0);  // no temporary left
    EXPECT_TRUE(ft::load_usable_profile(path, "NVIDIA GeForce RTX 5090"));
    EXPECT_TRUE(ft::load_usable_profile(path, ""));                  // serving GPU unknown: accepted
    EXPECT_FALSE(ft::load_usable_profile(path, "NVIDIA H200"));      // another GPU: ignored
    EXPECT_FALSE(ft::load_usable_profile(dir.path() + "/none.json", "NVIDIA H200"));
    std::ofstream(dir.path() + "/bad.json") << "{oops";
    EXPECT_FALSE(ft::load_usable_profile(dir.path() + "/bad.json", ""));
    p.gpu_name.clear();  // a profile without a GPU name is accepted anywhere
    ft::save_profile(p, path);
    EXPECT_TRUE(ft::load_usable_profile(path, "NVIDIA H200"));
    try {
        ft::load_profile(dir.path() + "/bad.json");
        FAIL();
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_FORMAT);
        EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos);
    }
}

TEST(Profile, DefaultPathFollowsTheEnvironment) {
    setenv("FT_PROFILE_PATH", "/x/y.json", 1);
    EXPECT_EQ(ft::default_profile_path(), "/x/y.json");
    unsetenv("FT_PROFILE_PATH");
    setenv("XDG_CACHE_HOME", "/cache", 1);
    EXPECT_EQ(ft::default_profile_path(), "/cache/freetoken/benchbw.json");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    EXPECT_EQ(ft::default_profile_path(), "/home/u/.cache/freetoken/benchbw.json");
}

TEST(Profile, FormatKeysAreTheOriginalNames) {
    EXPECT_EQ(ft::profile_format_key(ft::Format::mxfp4), "mxfp4_triton");
    EXPECT_EQ(ft::profile_format_key(ft::Format::nvfp4), "nvfp4");
    EXPECT_EQ(ft::profile_format_key(ft::Format::q4_0), "q4_0");
}

}  // namespace
