// The bandwidth profile through the public C API: a real CPU-only measurement (short, for a
// 2-core CI machine), cancellation, save/load, the original engine's v4 shape, errors, old
// callers and NULL arguments.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "freetoken.h"
#include "scratch_dir.hpp"

namespace {

struct ProfileDeleter {
    void operator()(ft_profile *p) const { ft_profile_free(p); }
};
using ProfilePtr = std::unique_ptr<ft_profile, ProfileDeleter>;
using ft::test::read_file;
using ft::test::ScratchDir;

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

constexpr uint32_t bit(int32_t format) { return 1u << format; }

// Records every progress call; cancels at the first call of `cancel_phase` (if set).
struct ProgressLog {
    std::string cancel_phase;
    std::vector<std::string> phases;
    bool ordered = true;  // done <= total on every call
    static bool call(void *user, const char *phase, uint64_t done, uint64_t total) {
        auto *self = static_cast<ProgressLog *>(user);
        if (self->phases.empty() || self->phases.back() != phase) self->phases.push_back(phase);
        self->ordered &= done <= total;
        return self->cancel_phase != phase;
    }
};

// Warnings the library logs while profiling (a non-finite output on the synthetic banks would
// mean the profiler filled them with invalid codes).
struct Warnings {
    std::mutex m;
    std::vector<std::string> lines;
    static void call(void *user, int32_t, const char *message) {
        auto *self = static_cast<Warnings *>(user);
        std::lock_guard<std::mutex> lock(self->m);
        self->lines.push_back(message);
    }
};

ft_profile_params cpu_params(uint32_t formats, double seconds) {
    ft_profile_params p;
    ft_profile_params_init(&p);
    p.device = FT_DEVICE_NONE;
    p.cpu_threads = 2;
    p.formats = formats;
    p.max_seconds = seconds;
    return p;
}

// One CPU-only measurement of two formats shared by the tests that read it.
class MeasuredProfile : public testing::Test {
protected:
    static void SetUpTestSuite() {
        ft_log_set_callback(Warnings::call, &warnings_, FT_LOG_WARN);
        ft_profile_params p = cpu_params(bit(FT_FORMAT_BF16) | bit(FT_FORMAT_Q4_0), 2.0);
        p.progress = ProgressLog::call;
        p.progress_user_data = &progress_;
        const auto t0 = std::chrono::steady_clock::now();
        ft_profile *out = nullptr;
        status_ = ft_profile_bandwidth(&p, &out, err_, sizeof err_);
        seconds_ = seconds_since(t0);
        profile_ = out;
        ft_log_set_callback(nullptr, nullptr, FT_LOG_WARN);
    }
    static void TearDownTestSuite() {
        ft_profile_free(profile_);
        profile_ = nullptr;
    }

    static inline ft_profile *profile_ = nullptr;
    static inline ft_status status_ = FT_ERR_INTERNAL;
    static inline char err_[512] = {};
    static inline double seconds_ = 0;
    static inline ProgressLog progress_;
    static inline Warnings warnings_;
};

TEST_F(MeasuredProfile, CpuOnlyFiguresArePositiveAndGatherIsAbsent) {
    ASSERT_EQ(status_, FT_OK) << err_;
    ASSERT_NE(profile_, nullptr);
    EXPECT_LT(seconds_, 30.0) << "a 2-second profile took " << seconds_ << " s";

    ft_profile_machine m;
    m.struct_size = sizeof m;
    ASSERT_EQ(ft_profile_get_machine(profile_, &m), FT_OK);
    EXPECT_GT(m.cpu_read_gbs, 0.0);
    EXPECT_TRUE(std::isfinite(m.cpu_read_gbs));
    EXPECT_EQ(m.h2d_gbs, 0.0);
    EXPECT_EQ(m.d2h_gbs, 0.0);
    EXPECT_STREQ(m.gpu_name, "");
    ASSERT_NE(m.cpu_model, nullptr);
    EXPECT_GE(m.physical_cores, 1);
    EXPECT_EQ(m.threads_used, 2);

    for (int32_t f : {FT_FORMAT_BF16, FT_FORMAT_Q4_0}) {
        ft_profile_format e;
        e.struct_size = sizeof e;
        ASSERT_EQ(ft_profile_get_format(profile_, f, &e), FT_OK) << f;
        EXPECT_EQ(e.format, f);
        EXPECT_GT(e.cpu_gbs, 0.0) << f;
        EXPECT_TRUE(std::isfinite(e.cpu_gbs)) << f;
        EXPECT_EQ(e.gather_gbs, 0.0);
        EXPECT_EQ(e.cpu_overlap_gbs, 0.0);
        EXPECT_EQ(e.gather_overlap_gbs, 0.0);
        EXPECT_EQ(e.fetch_fraction, -1.0);
        ASSERT_NE(e.cpu_kernel, nullptr);
        EXPECT_GT(std::strlen(e.cpu_kernel), 0u) << f;
    }
    ft_profile_format e;
    e.struct_size = sizeof e;
    ASSERT_EQ(ft_profile_get_format(profile_, FT_FORMAT_BF16, &e), FT_OK);
    EXPECT_EQ(e.expert_bytes, 9437184u);  // the bf16 canonical geometry (docs/formulas.md)
    // A format that was not asked for has no figures.
    EXPECT_EQ(ft_profile_get_format(profile_, FT_FORMAT_NVFP4, &e), FT_ERR_UNSUPPORTED);

    EXPECT_EQ(progress_.phases, (std::vector<std::string>{"read", "bf16", "q4_0"}));
    EXPECT_TRUE(progress_.ordered);
    for (const std::string &w : warnings_.lines) EXPECT_EQ(w.find("non-finite"), std::string::npos) << w;
}

TEST_F(MeasuredProfile, SaveLoadRoundTrip) {
    ASSERT_EQ(status_, FT_OK) << err_;
    ScratchDir dir;
    const std::string a = dir.path() + "/deep/er/a.json", b = dir.path() + "/b.json";
    char err[512];
    ASSERT_EQ(ft_profile_save(profile_, a.c_str(), err, sizeof err), FT_OK) << err;
    ft_profile *raw = nullptr;
    ASSERT_EQ(ft_profile_load(a.c_str(), &raw, err, sizeof err), FT_OK) << err;
    ProfilePtr loaded(raw);
    ASSERT_EQ(ft_profile_save(loaded.get(), b.c_str(), err, sizeof err), FT_OK) << err;
    EXPECT_EQ(read_file(a), read_file(b));  // the file is a fixed point of load + save

    ft_profile_machine m1, m2;
    m1.struct_size = m2.struct_size = sizeof m1;
    ASSERT_EQ(ft_profile_get_machine(profile_, &m1), FT_OK);
    ASSERT_EQ(ft_profile_get_machine(loaded.get(), &m2), FT_OK);
    EXPECT_NEAR(m1.cpu_read_gbs, m2.cpu_read_gbs, 0.005 + 1e-9);  // written with 2 decimals
    EXPECT_EQ(m1.physical_cores, m2.physical_cores);
    EXPECT_EQ(m1.threads_used, m2.threads_used);
    EXPECT_STREQ(m1.cpu_model, m2.cpu_model);
    EXPECT_STREQ(m1.gpu_name, m2.gpu_name);
    for (int32_t f : {FT_FORMAT_BF16, FT_FORMAT_Q4_0}) {
        ft_profile_format e1, e2;
        e1.struct_size = e2.struct_size = sizeof e1;
        ASSERT_EQ(ft_profile_get_format(profile_, f, &e1), FT_OK);
        ASSERT_EQ(ft_profile_get_format(loaded.get(), f, &e2), FT_OK);
        EXPECT_EQ(e1.expert_bytes, e2.expert_bytes);
        EXPECT_NEAR(e1.cpu_gbs, e2.cpu_gbs, 0.005 + 1e-9);
        EXPECT_EQ(e2.fetch_fraction, -1.0);
        EXPECT_STREQ(e1.cpu_kernel, e2.cpu_kernel);
    }
    // No temporary file is left beside the profile.
    EXPECT_EQ(read_file(a + ".tmp." + std::to_string(::getpid())), "");
}

TEST_F(MeasuredProfile, OldCallersOutputStructs) {
    ASSERT_EQ(status_, FT_OK) << err_;
    // An old ft_profile_format without fetch_fraction and cpu_kernel: nothing past it is written.
    ft_profile_format e;
    std::memset(&e, 0xab, sizeof e);
    e.struct_size = offsetof(ft_profile_format, fetch_fraction);
    ASSERT_EQ(ft_profile_get_format(profile_, FT_FORMAT_BF16, &e), FT_OK);
    EXPECT_EQ(e.struct_size, offsetof(ft_profile_format, fetch_fraction));
    EXPECT_GT(e.cpu_gbs, 0.0);
    const unsigned char *tail = reinterpret_cast<const unsigned char *>(&e) + offsetof(ft_profile_format, fetch_fraction);
    for (size_t i = 0; i < sizeof e - offsetof(ft_profile_format, fetch_fraction); ++i) EXPECT_EQ(tail[i], 0xab) << i;

    ft_profile_machine m;
    std::memset(&m, 0xcd, sizeof m);
    m.struct_size = offsetof(ft_profile_machine, gpu_name);
    ASSERT_EQ(ft_profile_get_machine(profile_, &m), FT_OK);
    EXPECT_GT(m.cpu_read_gbs, 0.0);
    const unsigned char *mt = reinterpret_cast<const unsigned char *>(&m) + offsetof(ft_profile_machine, gpu_name);
    for (size_t i = 0; i < sizeof m - offsetof(ft_profile_machine, gpu_name); ++i) EXPECT_EQ(mt[i], 0xcd) << i;

    // Too small to hold even struct_size and the first field.
    m.struct_size = 4;
    EXPECT_EQ(ft_profile_get_machine(profile_, &m), FT_ERR_INVALID_ARGUMENT);
    e.struct_size = 0;
    EXPECT_EQ(ft_profile_get_format(profile_, FT_FORMAT_BF16, &e), FT_ERR_INVALID_ARGUMENT);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// Every expert format in one short CPU-only run, each on its own production kernel: a finite,
// positive figure, a kernel name, progress in format order, and no non-finite output (the
// synthetic banks of each format hold valid codes and finite scales). Under sanitizers a kernel
// step takes up to seconds (nvfp4, ds_fp4): there the run takes the GGUF block formats only.
TEST(AllFormatsProfile, EveryFormatGetsFiniteFigures) {
    const std::vector<std::pair<int32_t, const char *>> all = {
        {FT_FORMAT_BF16, "bf16"}, {FT_FORMAT_FP8_BLOCK, "fp8_block"}, {FT_FORMAT_NVFP4, "nvfp4"}, {FT_FORMAT_MXFP4, "mxfp4"},
        {FT_FORMAT_DS_FP4, "ds_fp4"}, {FT_FORMAT_Q4_0, "q4_0"}, {FT_FORMAT_Q8_0, "q8_0"}, {FT_FORMAT_Q2_K, "q2_k"},
        {FT_FORMAT_Q3_K, "q3_k"}, {FT_FORMAT_Q4_K, "q4_k"}, {FT_FORMAT_Q5_K, "q5_k"}, {FT_FORMAT_Q6_K, "q6_k"},
        {FT_FORMAT_IQ4_XS, "iq4_xs"}};
    const int32_t first = kSanitized ? FT_FORMAT_Q4_0 : FT_FORMAT_BF16;
    const double budget = 6.0, bound = kSanitized ? 120.0 : 30.0;
    Warnings warnings;
    ft_log_set_callback(Warnings::call, &warnings, FT_LOG_WARN);
    ProgressLog progress;
    uint32_t formats = 0;  // 0: every format
    for (int32_t f = first; kSanitized && f <= FT_FORMAT_IQ4_XS; ++f) formats |= bit(f);
    ft_profile_params p = cpu_params(formats, budget);
    p.progress = ProgressLog::call;
    p.progress_user_data = &progress;
    ft_profile *out = nullptr;
    char err[512] = {};
    const auto t0 = std::chrono::steady_clock::now();
    const ft_status s = ft_profile_bandwidth(&p, &out, err, sizeof err);
    const double seconds = seconds_since(t0);
    ft_log_set_callback(nullptr, nullptr, FT_LOG_WARN);
    ProfilePtr prof(out);
    ASSERT_EQ(s, FT_OK) << err;
    EXPECT_LT(seconds, bound) << "a " << budget << "-second profile took " << seconds << " s";

    std::vector<std::string> phases{"read"};
    for (const auto &[f, name] : all) {
        ft_profile_format e;
        e.struct_size = sizeof e;
        if (f < first) {
            EXPECT_EQ(ft_profile_get_format(prof.get(), f, &e), FT_ERR_UNSUPPORTED) << name;
            continue;
        }
        phases.push_back(name);
        ASSERT_EQ(ft_profile_get_format(prof.get(), f, &e), FT_OK) << name;
        EXPECT_EQ(e.format, f);
        EXPECT_TRUE(std::isfinite(e.cpu_gbs) && e.cpu_gbs > 0.0) << name << ": " << e.cpu_gbs;
        EXPECT_GT(e.expert_bytes, 0u) << name;
        ASSERT_NE(e.cpu_kernel, nullptr);
        // The GGUF block formats' kernels are named after their format ("q4_k-w4a8-avx2").
        if (f >= FT_FORMAT_Q4_0) {
            EXPECT_EQ(std::string(e.cpu_kernel).rfind(std::string(name) + "-", 0), 0u) << e.cpu_kernel;
        }
        EXPECT_GT(std::strlen(e.cpu_kernel), 0u) << name;
    }
    // The GGUF K-quants and iq4_xs are measured at one shape (2048 x 768): their expert sizes
    // are in the ratio of their bytes per 256-element super-block.
    ft_profile_format q4k, q6k;
    q4k.struct_size = q6k.struct_size = sizeof q4k;
    ASSERT_EQ(ft_profile_get_format(prof.get(), FT_FORMAT_Q4_K, &q4k), FT_OK);
    ASSERT_EQ(ft_profile_get_format(prof.get(), FT_FORMAT_Q6_K, &q6k), FT_OK);
    EXPECT_EQ(q4k.expert_bytes * 210, q6k.expert_bytes * 144);
    EXPECT_EQ(progress.phases, phases);
    EXPECT_TRUE(progress.ordered);
    for (const std::string &w : warnings.lines) EXPECT_EQ(w.find("non-finite"), std::string::npos) << w;
}

TEST(ProfileApi, CancelledAtTheFirstCallOfAFormatPhase) {
    ProgressLog log;
    log.cancel_phase = "bf16";
    ft_profile_params p = cpu_params(bit(FT_FORMAT_BF16), 2.0);
    p.progress = ProgressLog::call;
    p.progress_user_data = &log;
    ft_profile *out = reinterpret_cast<ft_profile *>(&p);  // must be reset to NULL
    char err[256];
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ft_profile_bandwidth(&p, &out, err, sizeof err), FT_ERR_CANCELLED);
    EXPECT_LT(seconds_since(t0), 20.0);
    EXPECT_EQ(out, nullptr);
    EXPECT_NE(std::string(err).find("cancel"), std::string::npos) << err;
    EXPECT_EQ(log.phases, (std::vector<std::string>{"read", "bf16"}));
}

TEST(ProfileApi, CancelledAtTheVeryStart) {
    ProgressLog log;
    log.cancel_phase = "read";
    ft_profile_params p = cpu_params(0, 30.0);
    p.progress = ProgressLog::call;
    p.progress_user_data = &log;
    ft_profile *out = nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ft_profile_bandwidth(&p, &out, nullptr, 0), FT_ERR_CANCELLED);
    EXPECT_LT(seconds_since(t0), 5.0);
    EXPECT_EQ(out, nullptr);
}

// Cancelled in the middle of a format's measurement (its fourth step): the run stops there, with
// nothing of the next format measured.
TEST(ProfileApi, CancelledWithinOneMeasurement) {
    struct Log {
        std::vector<std::string> phases;
        uint64_t last_done = 0;
        static bool call(void *user, const char *phase, uint64_t done, uint64_t) {
            auto *self = static_cast<Log *>(user);
            if (self->phases.empty() || self->phases.back() != phase) self->phases.push_back(phase);
            self->last_done = done;
            return !(std::string(phase) == "bf16" && done >= 4);
        }
    } log;
    ft_profile_params p = cpu_params(bit(FT_FORMAT_BF16) | bit(FT_FORMAT_Q4_0), 4.0);
    p.progress = Log::call;
    p.progress_user_data = &log;
    ft_profile *out = nullptr;
    char err[256];
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ft_profile_bandwidth(&p, &out, err, sizeof err), FT_ERR_CANCELLED);
    EXPECT_LT(seconds_since(t0), 20.0);
    EXPECT_EQ(out, nullptr);
    EXPECT_EQ(log.phases, (std::vector<std::string>{"read", "bf16"}));
    EXPECT_EQ(log.last_done, 4u);
}

// The session says why it runs its backend: here `auto` on an engine without a GPU.
TEST(ProfileApi, SessionBackendReason) {
    ft_engine_params ep;
    ft_engine_params_init(&ep);
    ep.cpu_threads = 2;
    ep.pin_threads = false;
    ep.device = FT_DEVICE_NONE;
    ft_engine *engine = nullptr;
    char err[256];
    ASSERT_EQ(ft_engine_create(&ep, &engine, err, sizeof err), FT_OK) << err;
    ft_model_desc d;
    ft_model_desc_init(&d);
    d.num_layers = 1;
    d.num_experts = 4;
    d.top_k = 2;
    d.hidden_size = 32;
    d.intermediate_size = 16;
    ft_model *m = nullptr;
    ASSERT_EQ(ft_model_create(engine, &d, &m, err, sizeof err), FT_OK) << err;
    const std::vector<uint16_t> w(32 * 16, 0x3c00);
    for (int e = 0; e < 4; ++e)
        for (int proj = FT_PROJ_GATE; proj <= FT_PROJ_DOWN; ++proj)
            ASSERT_EQ(ft_model_set_expert(m, 0, e, proj, w.data(), w.size() * 2), FT_OK);
    ASSERT_EQ(ft_model_finalize(m), FT_OK);
    ft_session *s = nullptr;
    ASSERT_EQ(ft_session_create(m, nullptr, &s, err, sizeof err), FT_OK) << err;
    EXPECT_EQ(ft_session_backend(s), FT_BACKEND_CPU);
    const std::string reason = ft_session_backend_reason(s);
    EXPECT_NE(reason.find("auto: cpu"), std::string::npos) << reason;
    ft_session_free(s);

    ft_session_params sp;
    ft_session_params_init(&sp);
    sp.backend = FT_BACKEND_CPU;
    ASSERT_EQ(ft_session_create(m, &sp, &s, err, sizeof err), FT_OK) << err;
    EXPECT_STREQ(ft_session_backend_reason(s), "cpu requested");
    ft_session_free(s);
    EXPECT_STREQ(ft_session_backend_reason(nullptr), "");
    ft_model_free(m);
    ft_engine_free(engine);
}

// The original engine's v4 shape (docs/formulas.md), built here with the figures of the original engine's reader tests.
std::string original_profile_json() {
    auto entry = [](const char *bytes, const char *cpu, const char *pcie, const char *cpu_ov, const char *pcie_ov, const char *rec) {
        return std::string("{\"expert_bytes\": ") + bytes + ", \"synth_experts\": 128, \"cpu_moe_gbs\": " + cpu +
               ", \"cpu_moe_isa\": \"avx512bf16\", \"isa_sweep\": null, \"pcie_gather_gbs\": " + pcie +
               ", \"cpu_moe_overlap_gbs\": " + cpu_ov + ", \"pcie_gather_overlap_gbs\": " + pcie_ov +
               ", \"ratio\": null, \"recommended\": \"" + rec + "\", \"note\": \"\"}";
    };
    return std::string("{\n\"version\": 4, \"timestamp\": \"2026-08-20T10:11:12+02:00\", \"epoch\": 1787213472, \"host\": \"box\",\n") +
           "\"gpu\": {\"index\": 0, \"name\": \"NVIDIA GeForce RTX 5090\"},\n" +
           "\"cpu\": {\"physical_cores\": 16, \"threads_used\": 16}, \"threshold\": 2.0,\n" +
           "\"ceilings\": {\"cpu_stream_read_gbs\": 84.5, \"pcie_linear_h2d_gbs\": 55.1, \"pcie_linear_d2h_gbs\": 54.2},\n" +
           "\"dtypes\": {\"bf16\": \"hybrid\", \"nvfp4\": \"hybrid\"},\n" +
           "\"dtype_kernels\": {\"bf16\": " + entry("9437184", "50.0", "20.0", "null", "null", "hybrid") +
           ",\n \"nvfp4\": " + entry("7974912", "60.0", "30.0", "30.0", "10.0", "hybrid") + "},\n" +
           "\"workloads\": {\"gpt-oss-120b\": {\"model\": {\"name\": \"gpt-oss-120b\", \"hidden\": 2880, \"inter\": 2880, "
           "\"experts\": 128, \"top_k\": 4}, \"kernels\": {\"mxfp4_triton\": " +
           entry("13236480", "40.0", "25.0", "null", "null", "offload") +
           "}, \"recommended_moe_backend\": {\"mxfp4_triton\": \"offload\"}}}\n}\n";
}

TEST(ProfileApi, ReadsTheOriginalShapeAndItsFetchFractions) {
    ScratchDir dir;
    const std::string path = dir.path() + "/benchbw.json";
    std::ofstream(path) << original_profile_json();
    ft_profile *raw = nullptr;
    char err[512];
    ASSERT_EQ(ft_profile_load(path.c_str(), &raw, err, sizeof err), FT_OK) << err;
    ProfilePtr p(raw);

    ft_profile_format e;
    e.struct_size = sizeof e;
    ASSERT_EQ(ft_profile_get_format(p.get(), FT_FORMAT_BF16, &e), FT_OK);
    EXPECT_NEAR(e.fetch_fraction, 0.4, 1e-12);  // standalone pair: 20 / 50
    EXPECT_EQ(e.expert_bytes, 9437184u);
    EXPECT_DOUBLE_EQ(e.cpu_gbs, 50.0);
    EXPECT_DOUBLE_EQ(e.gather_gbs, 20.0);
    EXPECT_STREQ(e.cpu_kernel, "avx512bf16");
    ASSERT_EQ(ft_profile_get_format(p.get(), FT_FORMAT_NVFP4, &e), FT_OK);
    EXPECT_NEAR(e.fetch_fraction, 0.25, 1e-12);  // overlapped pair preferred: 10 / (10 + 30)
    EXPECT_DOUBLE_EQ(e.cpu_overlap_gbs, 30.0);
    EXPECT_DOUBLE_EQ(e.gather_overlap_gbs, 10.0);
    // Only a per-model entry: it answers (25 / 40).
    ASSERT_EQ(ft_profile_get_format(p.get(), FT_FORMAT_MXFP4, &e), FT_OK);
    EXPECT_NEAR(e.fetch_fraction, 0.625, 1e-12);
    EXPECT_EQ(e.expert_bytes, 13236480u);
    EXPECT_EQ(ft_profile_get_format(p.get(), FT_FORMAT_Q4_0, &e), FT_ERR_UNSUPPORTED);
    EXPECT_EQ(ft_profile_get_format(p.get(), 0, &e), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_profile_get_format(p.get(), 99, &e), FT_ERR_INVALID_ARGUMENT);

    ft_profile_machine m;
    m.struct_size = sizeof m;
    ASSERT_EQ(ft_profile_get_machine(p.get(), &m), FT_OK);
    EXPECT_STREQ(m.gpu_name, "NVIDIA GeForce RTX 5090");
    EXPECT_STREQ(m.cpu_model, "");  // the original writes no "freetoken" section
    EXPECT_DOUBLE_EQ(m.cpu_read_gbs, 84.5);
    EXPECT_DOUBLE_EQ(m.h2d_gbs, 55.1);
    EXPECT_DOUBLE_EQ(m.d2h_gbs, 54.2);
    EXPECT_EQ(m.physical_cores, 16);
}

TEST(ProfileApi, DefaultPathComesFromTheEnvironment) {
    ScratchDir dir;
    const std::string path = dir.path() + "/env/benchbw.json";
    std::ofstream(dir.path() + "/orig.json") << original_profile_json();
    ft_profile *raw = nullptr;
    char err[512];
    ASSERT_EQ(ft_profile_load((dir.path() + "/orig.json").c_str(), &raw, err, sizeof err), FT_OK) << err;
    ProfilePtr p(raw);
    setenv("FT_PROFILE_PATH", path.c_str(), 1);
    EXPECT_EQ(ft_profile_save(p.get(), nullptr, err, sizeof err), FT_OK) << err;
    EXPECT_NE(read_file(path).find("\"version\": 4"), std::string::npos);
    ASSERT_EQ(ft_profile_load(nullptr, &raw, err, sizeof err), FT_OK) << err;
    ProfilePtr q(raw);
    unsetenv("FT_PROFILE_PATH");
    ft_profile_format e;
    e.struct_size = sizeof e;
    ASSERT_EQ(ft_profile_get_format(q.get(), FT_FORMAT_NVFP4, &e), FT_OK);
    EXPECT_NEAR(e.fetch_fraction, 0.25, 1e-12);
}

TEST(ProfileApi, CorruptAndMissingFiles) {
    ScratchDir dir;
    const std::string bad = dir.path() + "/bad.json";
    std::ofstream(bad) << "{\"version\": 4, \"ceilings\": {\"cpu_stream_read_gbs\": \"fast\"}}";
    ft_profile *out = nullptr;
    char err[512];
    EXPECT_EQ(ft_profile_load(bad.c_str(), &out, err, sizeof err), FT_ERR_FORMAT);
    EXPECT_EQ(out, nullptr);
    EXPECT_NE(std::string(err).find("bad.json"), std::string::npos) << err;
    EXPECT_NE(std::string(err).find("cpu_stream_read_gbs"), std::string::npos) << err;

    std::ofstream(bad) << "{ not json";
    EXPECT_EQ(ft_profile_load(bad.c_str(), &out, err, sizeof err), FT_ERR_FORMAT);
    EXPECT_GT(std::strlen(err), 0u);

    EXPECT_EQ(ft_profile_load((dir.path() + "/none.json").c_str(), &out, err, sizeof err), FT_ERR_IO);
    EXPECT_NE(std::string(err).find("none.json"), std::string::npos) << err;
    EXPECT_EQ(out, nullptr);
}

TEST(ProfileApi, ExplicitMissingDeviceIsNoDevice) {
    ft_profile_params p = cpu_params(bit(FT_FORMAT_BF16), 2.0);
    p.device = 1000;
    ft_profile *out = nullptr;
    char err[256];
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ft_profile_bandwidth(&p, &out, err, sizeof err), FT_ERR_NO_DEVICE);
    EXPECT_LT(seconds_since(t0), 5.0);  // refused before measuring anything
    EXPECT_EQ(out, nullptr);
    EXPECT_NE(std::string(err).find("1000"), std::string::npos) << err;
}

TEST(ProfileApi, InvalidParams) {
    ft_profile *out = nullptr;
    char err[256];
    ft_profile_params p = cpu_params(bit(FT_FORMAT_BF16), 0.0);
    EXPECT_EQ(ft_profile_bandwidth(&p, &out, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(err).find("max_seconds"), std::string::npos) << err;
    p = cpu_params(bit(FT_FORMAT_BF16), NAN);
    EXPECT_EQ(ft_profile_bandwidth(&p, &out, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    p = cpu_params(1u << 0, 1.0);  // bit 0 names no format
    EXPECT_EQ(ft_profile_bandwidth(&p, &out, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(err).find("formats"), std::string::npos) << err;
    p = cpu_params(1u << (FT_FORMAT_IQ4_XS + 1), 1.0);  // one past the last format
    EXPECT_EQ(ft_profile_bandwidth(&p, &out, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    p = cpu_params(bit(FT_FORMAT_BF16), 1.0);
    p.cpu_threads = -1;
    EXPECT_EQ(ft_profile_bandwidth(&p, &out, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    p = cpu_params(bit(FT_FORMAT_BF16), 1.0);
    p.device = -3;
    EXPECT_EQ(ft_profile_bandwidth(&p, &out, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    p = cpu_params(bit(FT_FORMAT_BF16), 1.0);
    p.struct_size = 0;
    EXPECT_EQ(ft_profile_bandwidth(&p, &out, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(err).find("struct_size"), std::string::npos) << err;
    EXPECT_EQ(out, nullptr);
}

TEST(ProfileApi, OldCallerParamsGetDefaultsForWhatTheyDoNotKnow) {
    // A caller that knows device and cpu_threads only: the invalid formats and max_seconds
    // beyond its struct_size must be ignored, so the run gets as far as the device check.
    ft_profile_params p = cpu_params(0xffffffffu, -1.0);
    p.struct_size = offsetof(ft_profile_params, formats);
    p.device = 1000;
    ft_profile *out = nullptr;
    char err[256];
    EXPECT_EQ(ft_profile_bandwidth(&p, &out, err, sizeof err), FT_ERR_NO_DEVICE) << err;
    // Knowing up to formats, the invalid formats are read and refused.
    p.struct_size = offsetof(ft_profile_params, max_seconds);
    EXPECT_EQ(ft_profile_bandwidth(&p, &out, err, sizeof err), FT_ERR_INVALID_ARGUMENT) << err;

    ft_profile_params d;
    ft_profile_params_init(&d);
    EXPECT_EQ(d.struct_size, sizeof d);
    EXPECT_EQ(d.device, FT_DEVICE_AUTO);
    EXPECT_EQ(d.cpu_threads, 0);
    EXPECT_EQ(d.formats, 0u);
    EXPECT_EQ(d.max_seconds, 30.0);
    EXPECT_EQ(d.progress, nullptr);
}

TEST(ProfileApi, NullArguments) {
    char err[256];
    EXPECT_EQ(ft_profile_bandwidth(nullptr, nullptr, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_profile_load("/nonexistent", nullptr, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_profile_save(nullptr, "/tmp/x.json", err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_GT(std::strlen(err), 0u);
    ft_profile_machine m;
    m.struct_size = sizeof m;
    EXPECT_EQ(ft_profile_get_machine(nullptr, &m), FT_ERR_INVALID_ARGUMENT);
    ft_profile_format f;
    f.struct_size = sizeof f;
    EXPECT_EQ(ft_profile_get_format(nullptr, FT_FORMAT_BF16, &f), FT_ERR_INVALID_ARGUMENT);

    ScratchDir dir;
    std::ofstream(dir.path() + "/p.json") << original_profile_json();
    ft_profile *raw = nullptr;
    ASSERT_EQ(ft_profile_load((dir.path() + "/p.json").c_str(), &raw, nullptr, 0), FT_OK);
    ProfilePtr p(raw);
    EXPECT_EQ(ft_profile_get_machine(p.get(), nullptr), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_profile_get_format(p.get(), FT_FORMAT_BF16, nullptr), FT_ERR_INVALID_ARGUMENT);
    ft_profile_free(nullptr);
    ft_profile_params_init(nullptr);
}

}  // namespace
