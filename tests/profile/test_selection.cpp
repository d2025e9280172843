// `auto` backend selection over synthetic profiles: each backend wins where the step model says
// it should, the fallbacks without usable figures, and the JSON round trip of the figures the
// selection reads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "ft/backend_registry.hpp"
#include "ft/common.hpp"
#include "ft/formats.hpp"
#include "ft/profile.hpp"
#include "ft/selector.hpp"
#include "scratch_dir.hpp"

namespace {

constexpr double kGB = 1e9;

// A bf16 model like qwen3-30b: 48 layers of 128 experts of 9.44 MB (58 GB of experts).
ft::ModelSpec big_bf16() {
    ft::ModelSpec s;
    s.num_layers = 48;
    s.num_experts = 128;
    s.top_k = 8;
    s.hidden = 2048;
    s.intermediate = 768;
    s.format = ft::Format::bf16;
    return s;
}

ft::MachineCaps gpu_caps(double free_gb) {
    ft::MachineCaps c;
    c.gpu = true;
    c.gpu_kernels = true;
    c.gpu_free_bytes = static_cast<uint64_t>(free_gb * kGB);
    c.vram_reserve_bytes = 2ull << 30;
    return c;
}

ft::KernelEntry entry(double cpu, double gather, double cpu_ov = 0, double gather_ov = 0) {
    ft::KernelEntry e;
    e.expert_bytes = 9437184;
    if (cpu > 0) e.cpu_moe_gbs = cpu;
    if (gather > 0) e.pcie_gather_gbs = gather;
    if (cpu_ov > 0) e.cpu_moe_overlap_gbs = cpu_ov;
    if (gather_ov > 0) e.pcie_gather_overlap_gbs = gather_ov;
    return e;
}

ft::Profile profile_with(const std::string &key, const ft::KernelEntry &e) {
    ft::Profile p;
    p.gpu_name = "NVIDIA Test GPU";
    p.dtype_kernels[key] = e;
    return p;
}

ft::BackendChoice choose(const ft::Profile *p, const ft::MachineCaps &caps, double cache_fraction = 0.0) {
    ft::SelectionInputs in;
    in.profile = p;
    in.cache_fraction = cache_fraction;
    return ft::select_backend(FT_BACKEND_AUTO, caps, big_bf16(), in);
}

bool has(const std::string &text, const char *what) { return text.find(what) != std::string::npos; }

TEST(Selection, SlotFractionMirrorsTheSlotCacheSizing) {
    const ft::ModelSpec m = big_bf16();
    const double all = 48.0 * 128.0, eb = 9437184.0;
    ft::SelectionInputs in;
    // Automatic: free minus reserve minus the two prefill layer buffers, in whole experts.
    const ft::MachineCaps caps = gpu_caps(24.0);
    const double usable = 24e9 - double(2ull << 30) - 2 * 128 * eb;
    EXPECT_NEAR(ft::expected_slot_fraction(caps, m, in), std::floor(usable / eb) / all, 1e-12);
    in.cache_slots = 1000;
    EXPECT_NEAR(ft::expected_slot_fraction(caps, m, in), 1000 / all, 1e-12);
    in.cache_slots = 0;
    in.cache_fraction = 0.25;
    EXPECT_NEAR(ft::expected_slot_fraction(caps, m, in), std::ceil(0.25 * all) / all, 1e-12);
    in.cache_fraction = 0.0;
    EXPECT_EQ(ft::expected_slot_fraction(gpu_caps(3.0), m, in), 0.0);  // not one layer beyond the buffers
}

TEST(Selection, PredictionFollowsTheStepModel) {
    const ft::Profile p = profile_with("bf16", entry(60, 50, 40, 45));
    const ft::StepPrediction s = ft::predict_step(p, big_bf16(), 0.3, 3000);
    ASSERT_TRUE(s.usable);
    EXPECT_EQ(s.source, "dtype_kernels.bf16");
    EXPECT_DOUBLE_EQ(s.hit_rate, 0.3);
    const double B = 8 * 9437184.0, miss = 0.7 * B, hit_s = 0.3 * B / 3000e9;
    EXPECT_NEAR(s.cpu_s, B / 60e9, 1e-12);
    EXPECT_NEAR(s.offload_s, miss / 50e9 + hit_s, 1e-12);
    const double f = 45.0 / 85.0;
    EXPECT_NEAR(s.fetch_fraction, f, 1e-12);
    EXPECT_NEAR(s.hybrid_s, std::max(f * miss / 45e9, (1 - f) * miss / 40e9) + hit_s, 1e-12);
    EXPECT_NEAR(s.gpu_s, B / 3000e9, 1e-12);
}

TEST(Selection, CpuWinsWhenMemoryOutrunsTheBus) {
    const ft::Profile p = profile_with("bf16", entry(200, 25));
    const ft::BackendChoice c = choose(&p, gpu_caps(24.0));
    EXPECT_EQ(c.backend, FT_BACKEND_CPU) << c.reason;
    EXPECT_TRUE(c.prediction.usable);
    EXPECT_LT(c.prediction.cpu_s, c.prediction.offload_s);
    EXPECT_EQ(c.prediction.hybrid_s, 0.0);  // no overlapped figures: not predicted
    EXPECT_TRUE(has(c.reason, "auto: cpu")) << c.reason;
    EXPECT_TRUE(has(c.reason, "hit rate")) << c.reason;
    EXPECT_TRUE(has(c.reason, "offload")) << c.reason;
}

TEST(Selection, HitRateMovesTheChoice) {
    // The same machine as above, but a slot cache holding 90% of the experts: offload's misses
    // are few enough to beat the CPU reading every expert.
    const ft::Profile p = profile_with("bf16", entry(200, 25));
    const ft::BackendChoice c = choose(&p, gpu_caps(24.0), 0.9);
    EXPECT_EQ(c.backend, FT_BACKEND_OFFLOAD) << c.reason;
    EXPECT_NEAR(c.prediction.hit_rate, std::ceil(0.9 * 48 * 128) / (48 * 128), 1e-12);
}

TEST(Selection, OffloadWinsWhenTheBusOutrunsTheCpu) {
    // The overlapped pair moves 45 GB/s together, less than the gather's 50 alone.
    const ft::Profile p = profile_with("bf16", entry(20, 50, 5, 40));
    const ft::BackendChoice c = choose(&p, gpu_caps(24.0));
    EXPECT_EQ(c.backend, FT_BACKEND_OFFLOAD) << c.reason;
    EXPECT_GT(c.prediction.hybrid_s, c.prediction.offload_s);
    EXPECT_EQ(ft::entry_verdict(p.dtype_kernels.at("bf16"), 2.0), "offload");
}

TEST(Selection, HybridWinsWhenBothSidesAddUp) {
    const ft::Profile p = profile_with("bf16", entry(60, 50, 40, 45));
    const ft::BackendChoice c = choose(&p, gpu_caps(24.0));
    EXPECT_EQ(c.backend, FT_BACKEND_HYBRID) << c.reason;
    EXPECT_LT(c.prediction.hybrid_s, c.prediction.offload_s);
    EXPECT_LT(c.prediction.hybrid_s, c.prediction.cpu_s);
    EXPECT_TRUE(has(c.reason, "auto: hybrid")) << c.reason;
    EXPECT_EQ(ft::entry_verdict(p.dtype_kernels.at("bf16"), 2.0), "hybrid");
    // The original's rule alone would have said offload here (60 < 2 x 50).
    ft::KernelEntry standalone = entry(60, 50);
    EXPECT_EQ(ft::entry_verdict(standalone, 2.0), "offload");
}

TEST(Selection, GpuWinsWhenEveryExpertFits) {
    const ft::Profile p = profile_with("bf16", entry(200, 25));
    const ft::BackendChoice c = choose(&p, gpu_caps(100.0));
    EXPECT_EQ(c.backend, FT_BACKEND_GPU) << c.reason;
    EXPECT_TRUE(has(c.reason, "fits")) << c.reason;
}

TEST(Selection, WithoutAGpuOnlyTheCpu) {
    const ft::Profile p = profile_with("bf16", entry(20, 50, 5, 40));
    const ft::BackendChoice c = choose(&p, ft::MachineCaps{});
    EXPECT_EQ(c.backend, FT_BACKEND_CPU) << c.reason;
    // A GPU too small for one layer (plus the reserve) leaves the CPU as well.
    EXPECT_EQ(choose(&p, gpu_caps(2.5)).backend, FT_BACKEND_CPU);
}

TEST(Selection, FallbackWithoutUsableFigures) {
    const ft::MachineCaps caps = gpu_caps(24.0);
    // No profile at all.
    ft::BackendChoice c = choose(nullptr, caps);
    EXPECT_EQ(c.backend, FT_BACKEND_OFFLOAD) << c.reason;
    EXPECT_TRUE(has(c.reason, "no usable profile")) << c.reason;
    EXPECT_FALSE(c.prediction.usable);
    // The format is missing from the profile.
    const ft::Profile other = profile_with("nvfp4", entry(200, 25));
    c = choose(&other, caps);
    EXPECT_EQ(c.backend, FT_BACKEND_OFFLOAD) << c.reason;
    EXPECT_TRUE(has(c.reason, "no cpu and gather figures for bf16")) << c.reason;
    // A CPU-only profile (no gather figure) cannot weigh the GPU side.
    const ft::Profile cpu_only = profile_with("bf16", entry(200, 0));
    EXPECT_EQ(choose(&cpu_only, caps).backend, FT_BACKEND_OFFLOAD);
    // The old entry point has no profile: the same fallback.
    EXPECT_EQ(ft::select_backend(FT_BACKEND_AUTO, caps, big_bf16()).backend, FT_BACKEND_OFFLOAD);
}

TEST(Selection, PerModelEntriesWhenTheFormatEntryHasNoFigures) {
    ft::Profile p = profile_with("bf16", entry(200, 0));
    ft::WorkloadEntry w;
    w.name = "qwen3-30b";
    w.kernels["bf16"] = entry(60, 50, 40, 45);
    p.workloads.push_back(w);
    const ft::BackendChoice c = choose(&p, gpu_caps(24.0));
    EXPECT_EQ(c.backend, FT_BACKEND_HYBRID) << c.reason;
    EXPECT_EQ(c.prediction.source, "workloads.qwen3-30b.kernels.bf16");
}

TEST(Selection, ExplicitRequestsAreUnchanged) {
    const ft::Profile p = profile_with("bf16", entry(200, 25));
    ft::SelectionInputs in;
    in.profile = &p;
    const ft::BackendChoice c = ft::select_backend(FT_BACKEND_HYBRID, gpu_caps(24.0), big_bf16(), in);
    EXPECT_EQ(c.backend, FT_BACKEND_HYBRID);
    EXPECT_EQ(c.reason, "hybrid requested");
    try {
        ft::select_backend(FT_BACKEND_OFFLOAD, ft::MachineCaps{}, big_bf16(), in);
        FAIL();
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_UNSUPPORTED);
    }
}

// A qwen3-30b-shaped model of block formats: gate/up q4_k in every layer, down q6_k in the first
// half of the layers and q5_k in the second (as Q4_K_M-style GGUF files mix them).
ft::ModelSpec mixed_gguf() {
    ft::ModelSpec s = big_bf16();
    s.format = ft::Format::q4_k;
    for (int32_t l = 0; l < s.num_layers; ++l)
        s.layer_formats.push_back({ft::Format::q4_k, l < s.num_layers / 2 ? ft::Format::q6_k : ft::Format::q5_k});
    return s;
}

// Bytes of one expert's gate/up bank (2I rows of H) and down bank (H rows of I) in block format f.
double gate_up_bytes(ft::Format f) { return 2.0 * 768 * double(ft::block_row_bytes(f, 2048)); }
double down_bytes(ft::Format f) { return 2048.0 * double(ft::block_row_bytes(f, 768)); }

// A model mixing formats is predicted from every format it uses, weighted by its bytes: each rate
// is the total bytes over the time each format's bytes take at that format's rate.
TEST(Selection, MixedFormatsWeighEachFormatByItsBytes) {
    const ft::ModelSpec m = mixed_gguf();
    ASSERT_TRUE(m.mixed_formats());
    ft::Profile p;
    p.gpu_name = "NVIDIA Test GPU";
    p.dtype_kernels["q4_k"] = entry(80, 20, 30, 16);
    p.dtype_kernels["q6_k"] = entry(10, 25, 6, 18);
    ft::WorkloadEntry w;  // q5_k's figures from a per-model entry (the reader's order)
    w.name = "qwen3-30b";
    w.kernels["q5_k"] = entry(40, 22, 20, 17);
    p.workloads.push_back(w);
    p.dtype_kernels["bf16"] = entry(500, 500, 500, 500);  // a format the model does not use: ignored

    // Shares of the routed bytes: q4_k in every layer's gate/up, q6_k and q5_k in half the downs each.
    const double b4 = 48 * gate_up_bytes(ft::Format::q4_k), b6 = 24 * down_bytes(ft::Format::q6_k),
                 b5 = 24 * down_bytes(ft::Format::q5_k), total = b4 + b5 + b6;
    EXPECT_DOUBLE_EQ(total * 128, double(m.routed_bytes()));
    auto blend = [&](double r4, double r5, double r6) { return total / (b4 / r4 + b5 / r5 + b6 / r6); };

    const ft::StepPrediction s = ft::predict_step(p, m, 0.25, 3000);
    ASSERT_TRUE(s.usable) << s.missing;
    EXPECT_NEAR(s.cpu_gbs, blend(80, 40, 10), 1e-9);
    EXPECT_NEAR(s.gather_gbs, blend(20, 22, 25), 1e-9);
    EXPECT_NEAR(s.cpu_ov_gbs, blend(30, 20, 6), 1e-9);
    EXPECT_NEAR(s.gather_ov_gbs, blend(16, 17, 18), 1e-9);
    const double f = s.gather_ov_gbs / (s.gather_ov_gbs + s.cpu_ov_gbs);
    EXPECT_NEAR(s.fetch_fraction, f, 1e-12);
    ASSERT_TRUE(ft::model_fetch_fraction(p, m).has_value());
    EXPECT_NEAR(*ft::model_fetch_fraction(p, m), f, 1e-12);
    // Step times from the model's real bytes per layer and the blended rates.
    const double B = 8 * total / 48, miss = 0.75 * B, hit_s = 0.25 * B / 3000e9;
    EXPECT_NEAR(s.cpu_s, B / (s.cpu_gbs * 1e9), 1e-12);
    EXPECT_NEAR(s.offload_s, miss / (s.gather_gbs * 1e9) + hit_s, 1e-12);
    EXPECT_NEAR(s.hybrid_s, std::max(f * miss / (s.gather_ov_gbs * 1e9), (1 - f) * miss / (s.cpu_ov_gbs * 1e9)) + hit_s, 1e-12);
    // Every entry used is named, the largest share first.
    EXPECT_EQ(s.source, "dtype_kernels.q4_k + dtype_kernels.q6_k + workloads.qwen3-30b.kernels.q5_k") << s.source;
    EXPECT_TRUE(has(s.formats, "q4_k") && has(s.formats, "q5_k") && has(s.formats, "q6_k")) << s.formats;
    EXPECT_TRUE(s.missing.empty()) << s.missing;

    // A single-format model keeps its own entry's figures and the reader rules' fraction.
    ft::ModelSpec one = big_bf16();
    one.format = ft::Format::q6_k;
    const ft::StepPrediction o = ft::predict_step(p, one, 0.25, 3000);
    EXPECT_EQ(o.cpu_gbs, 10.0);
    EXPECT_EQ(o.source, "dtype_kernels.q6_k");
    EXPECT_NEAR(*ft::model_fetch_fraction(p, one), 18.0 / 24.0, 1e-12);
}

// The choice follows the blend: q4_k (layer 0's gate/up format, ft_model_info's `format`) alone
// would pick the CPU, but most of the slow q6_k/q5_k bytes make offload faster.
TEST(Selection, MixedModelChoosesFromTheFiguresOfItsFormats) {
    const ft::ModelSpec m = mixed_gguf();
    ft::Profile p;
    p.gpu_name = "NVIDIA Test GPU";
    p.dtype_kernels["q4_k"] = entry(100, 20);
    p.dtype_kernels["q5_k"] = entry(8, 20);
    p.dtype_kernels["q6_k"] = entry(6, 20);
    const ft::MachineCaps caps = gpu_caps(8.0);  // 22 GB of q-experts: not all resident
    ft::SelectionInputs in;
    in.profile = &p;
    const double s = ft::expected_slot_fraction(caps, m, in);
    const ft::StepPrediction mixed = ft::predict_step(p, m, s);
    ASSERT_TRUE(mixed.usable);
    EXPECT_LT(mixed.offload_s, mixed.cpu_s);
    ft::ModelSpec layer0 = m;
    layer0.layer_formats.clear();
    const ft::StepPrediction q4k_only = ft::predict_step(p, layer0, s);
    EXPECT_LT(q4k_only.cpu_s, q4k_only.offload_s);

    const ft::BackendChoice c = ft::select_backend(FT_BACKEND_AUTO, caps, m, in);
    if (ft::find_backend(FT_BACKEND_OFFLOAD)->unavailable(caps, m).empty()) {
        EXPECT_EQ(c.backend, FT_BACKEND_OFFLOAD) << c.reason;
        EXPECT_TRUE(has(c.reason, "q4_k") && has(c.reason, "q5_k") && has(c.reason, "q6_k")) << c.reason;
    } else {
        // The GPU backends of this build refuse models that mix formats: the CPU is all there is.
        EXPECT_EQ(c.backend, FT_BACKEND_CPU) << c.reason;
    }

    // A format without figures leaves the model unpredicted, naming what is missing.
    p.dtype_kernels.erase("q5_k");
    const ft::StepPrediction gap = ft::predict_step(p, m, s);
    EXPECT_FALSE(gap.usable);
    EXPECT_EQ(gap.missing, "q5_k");
    EXPECT_TRUE(gap.source.empty());
    EXPECT_FALSE(ft::model_fetch_fraction(p, m).has_value());
}

// A profile of another GPU is not used: the session's path (load_usable_profile) returns nothing
// and `auto` falls back.
TEST(Selection, ProfileOfAnotherGpuFallsBack) {
    const ft::test::ScratchDir dir;
    const std::string path = dir / "benchbw.json";
    ft::save_profile(profile_with("bf16", entry(60, 50, 40, 45)), path);
    const auto same = ft::load_usable_profile(path, "NVIDIA Test GPU");
    ASSERT_TRUE(same.has_value());
    EXPECT_EQ(choose(&*same, gpu_caps(24.0)).backend, FT_BACKEND_HYBRID);
    const auto other = ft::load_usable_profile(path, "NVIDIA Other GPU");
    EXPECT_FALSE(other.has_value());
    const ft::BackendChoice c = choose(other ? &*other : nullptr, gpu_caps(24.0));
    EXPECT_EQ(c.backend, FT_BACKEND_OFFLOAD) << c.reason;
}

TEST(ProfileJson, GatherAndOverlapFiguresRoundTrip) {
    ft::Profile p = profile_with("mxfp4_triton", entry(61.234, 48.766, 39.111, 44.449));
    ft::KernelEntry &e = p.dtype_kernels["mxfp4_triton"];
    e.ratio = 61.234 / 48.766;
    e.recommended = *ft::entry_verdict(e, p.threshold);
    e.note = "gather window of 64 experts";
    p.dtypes["mxfp4_triton"] = e.recommended;
    p.pcie_linear_h2d_gbs = 53.21;
    const ft::Profile q = ft::profile_from_json(ft::profile_to_json(p));
    const ft::KernelEntry &r = q.dtype_kernels.at("mxfp4_triton");
    EXPECT_DOUBLE_EQ(*r.cpu_moe_gbs, 61.23);  // 2 decimals, as the original writes
    EXPECT_DOUBLE_EQ(*r.pcie_gather_gbs, 48.77);
    EXPECT_DOUBLE_EQ(*r.cpu_moe_overlap_gbs, 39.11);
    EXPECT_DOUBLE_EQ(*r.pcie_gather_overlap_gbs, 44.45);
    EXPECT_DOUBLE_EQ(*r.ratio, 1.256);  // 3 decimals
    EXPECT_EQ(r.recommended, "hybrid");
    EXPECT_EQ(r.note, "gather window of 64 experts");
    EXPECT_EQ(q.dtypes.at("mxfp4_triton"), "hybrid");
    EXPECT_EQ(ft::backend_recommendation(q, "mxfp4_triton"), "hybrid");
    EXPECT_NEAR(*ft::hybrid_fetch_fraction(q, "mxfp4_triton"), 44.45 / (44.45 + 39.11), 1e-12);
}

TEST(ProfileJson, VerdictRules) {
    EXPECT_FALSE(ft::entry_verdict(entry(60, 0), 2.0).has_value());  // no gather: no verdict
    EXPECT_EQ(ft::entry_verdict(entry(0, 50), 2.0), "offload");     // the original's default
    EXPECT_EQ(ft::entry_verdict(entry(101, 50), 2.0), "hybrid");    // the original's rule
    EXPECT_EQ(ft::entry_verdict(entry(100, 50), 2.0), "offload");   // strict >
    EXPECT_EQ(ft::entry_verdict(entry(100, 50, 10, 40), 2.0), "offload");  // 50 is not > 50
}

}  // namespace
