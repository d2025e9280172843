// Golden tests against transformers: every tests/golden/<case>/ directory (written by
// tools/golden/make_golden.py on a machine with torch and transformers) is loaded through the C
// API and checked on each backend: routes identical to transformers' router (weights within
// 1e-4), ft_decode's output within 1e-2 relative L2 of the transformers MoE block's. GPU backends
// skip without a GPU. FT_GOLDEN_DIR in the environment points the suite at another directory.
//
// GoldenHarnessSelfTest checks the harness itself on a directory it writes from lib/core/synth's
// checkpoint and the fp64 references of tests/support (not transformers data): that a correct
// directory passes and that a wrong output or route is caught.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "ft/synth.hpp"
#include "golden_check.hpp"
#include "moe_reference.hpp"
#include "routing_reference.hpp"

namespace {

using ft::golden::check_dir;
using ft::golden::Result;

std::string golden_root() {
    const char *env = std::getenv("FT_GOLDEN_DIR");
    return env && *env ? env : FT_GOLDEN_SOURCE_DIR;
}

bool engine_has_gpu() {
    static const bool has = [] {
        ft_engine_params p;
        ft_engine_params_init(&p);
        p.cpu_threads = 1;
        p.pin_threads = false;
        ft_engine *e = nullptr;
        if (ft_engine_create(&p, &e, nullptr, 0) != FT_OK) return false;
        ft_engine_info info{};
        info.struct_size = sizeof info;
        const bool gpu = ft_engine_get_info(e, &info) == FT_OK && info.device != FT_DEVICE_NONE;
        ft_engine_free(e);
        return gpu;
    }();
    return has;
}

std::string describe(const Result &r) {
    std::ostringstream s;
    s << r.architecture << " (transformers " << r.transformers_version << ")";
    if (!r.error.empty()) s << ": " << r.error;
    for (const auto &l : r.layers)
        s << "\n  layer " << l.layer << ": routes " << (l.routes_equal ? "equal" : "DIFFER") << ", max weight error "
          << l.max_weight_error << ", relative L2 " << l.relative_l2 << (l.detail.empty() ? "" : " (" + l.detail + ")");
    return s.str();
}

struct Case {
    std::string dir;
    int32_t backend;
};

std::vector<Case> cases() {
    std::vector<Case> out;
    for (const std::string &d : ft::golden::golden_dirs(golden_root()))
        for (int32_t b : {FT_BACKEND_CPU, FT_BACKEND_GPU, FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID}) out.push_back({d, b});
    return out;
}

const char *backend_name(int32_t b) {
    switch (b) {
        case FT_BACKEND_CPU: return "cpu";
        case FT_BACKEND_GPU: return "gpu";
        case FT_BACKEND_OFFLOAD: return "offload";
        default: return "hybrid";
    }
}

void PrintTo(const Case &c, std::ostream *os) {
    *os << std::filesystem::path(c.dir).filename().string() << " on " << backend_name(c.backend);
}

class Golden : public ::testing::TestWithParam<Case> {};

TEST_P(Golden, MatchesTransformers) {
    const Case &c = GetParam();
    if (c.backend != FT_BACKEND_CPU && !engine_has_gpu()) GTEST_SKIP() << "no GPU";
    const Result r = check_dir(c.dir, c.backend);
    if (!r.skipped.empty()) GTEST_SKIP() << backend_name(c.backend) << " refuses this model: " << r.skipped;
    std::cout << "[ golden   ] " << describe(r) << "\n";
    ASSERT_TRUE(r.error.empty()) << describe(r);
    ASSERT_FALSE(r.layers.empty()) << "golden.json lists no layers";
    for (const auto &l : r.layers) {
        EXPECT_TRUE(l.routes_equal) << "layer " << l.layer << ": " << l.detail;
        EXPECT_LE(l.max_weight_error, ft::golden::kMaxWeightError) << "layer " << l.layer;
        EXPECT_LE(l.relative_l2, ft::golden::kMaxRelativeL2) << "layer " << l.layer;
    }
}

INSTANTIATE_TEST_SUITE_P(Dirs, Golden, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case> &info) {
                             return std::filesystem::path(info.param.dir).filename().string() + "_" +
                                    backend_name(info.param.backend);
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Golden);

// ---- the harness itself ------------------------------------------------------------------------

class TempDir {
public:
    TempDir() {
        const char *base = std::getenv("TMPDIR");
        std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ft_golden_selftest_XXXXXX";
        if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        path_ = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    const std::string &path() const { return path_; }

private:
    std::string path_;
};

template <typename T>
void write_raw(const std::string &path, const std::vector<T> &v) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char *>(v.data()), std::streamsize(v.size() * sizeof(T)));
    ASSERT_TRUE(out.good()) << path;
}

// A golden directory computed without transformers: lib/core/synth's qwen3_moe checkpoint, routes by
// the fp64 routing reference, outputs by the fp64 MoE reference. Returns the output file of
// layer 0 and the ids file, for the tests that break them.
struct SelfTestDir {
    TempDir tmp;
    ft::synth::Spec spec;
    std::vector<int32_t> ids0;

    SelfTestDir() {
        spec.architecture = "qwen3_moe";
        spec.num_layers = 2;
        spec.num_experts = 8;
        spec.top_k = 2;
        spec.hidden = 64;
        spec.intermediate = 24;
        spec.seed = 7;
        ft::synth::write_checkpoint(tmp.path(), spec);
        const int32_t T = 5, H = spec.hidden, I = spec.intermediate, E = spec.num_experts, K = spec.top_k;
        std::mt19937 rng(3);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<uint16_t> xb(size_t(T) * H);
        std::vector<float> x(xb.size());
        for (size_t i = 0; i < xb.size(); ++i) {
            xb[i] = ft::test::f32_to_bf16_rne(nd(rng));
            x[i] = float(ft::test::bf16_to_f64(xb[i]));
        }
        write_raw(tmp.path() + "/hidden.f32", x);
        nlohmann::json layers = nlohmann::json::array();
        const std::vector<int> moe = ft::synth::moe_layers(spec);
        for (int l = 0; l < int(moe.size()); ++l) {
            const std::vector<float> router = ft::synth::router_weight(spec, l);
            std::vector<int32_t> ids;
            std::vector<float> w;
            for (int32_t t = 0; t < T; ++t) {
                std::vector<double> logits(E);
                for (int32_t e = 0; e < E; ++e) {
                    double z = 0;
                    for (int32_t h = 0; h < H; ++h) z += double(router[size_t(e) * H + h]) * x[size_t(t) * H + h];
                    logits[e] = float(z);
                }
                const auto r = ft::test::ref_route(FT_ROUTING_SOFTMAX_TOPK_RENORM, K, logits, {});
                for (int32_t k = 0; k < K; ++k) {
                    ids.push_back(r.ids[k]);
                    w.push_back(float(r.weights[k]));
                }
            }
            std::vector<std::vector<uint16_t>> weights(size_t(E) * 3);
            for (int32_t e = 0; e < E; ++e)
                for (int p = 0; p < 3; ++p) weights[size_t(e) * 3 + p] = ft::synth::expert_weight(spec, l, e, p + 1);
            const auto out = ft::test::moe_reference(
                [&](int32_t e) {
                    return ft::test::ExpertRef{weights[size_t(e) * 3].data(), weights[size_t(e) * 3 + 1].data(),
                                                  weights[size_t(e) * 3 + 2].data(), I};
                },
                E, {}, H, T, K, xb.data(), ids.data(), w.data());
            const std::string stem = "layer" + std::to_string(moe[l]);
            write_raw(tmp.path() + "/" + stem + ".out.f32", std::vector<float>(out.begin(), out.end()));
            write_raw(tmp.path() + "/" + stem + ".ids.i32", ids);
            write_raw(tmp.path() + "/" + stem + ".weights.f32", w);
            if (l == 0) ids0 = ids;
            layers.push_back({{"layer", moe[l]}, {"output", stem + ".out.f32"}, {"ids", stem + ".ids.i32"},
                              {"weights", stem + ".weights.f32"}, {"k", K}});
        }
        nlohmann::json m = {{"case", "harness_selftest_qwen3_moe"}, {"transformers_version", "none (self-test)"},
                            {"tokens", T}, {"hidden", H}, {"hidden_states", "hidden.f32"}, {"layers", layers}};
        std::ofstream(tmp.path() + "/golden.json") << m.dump(1);
    }
    std::string path(const std::string &name) const { return tmp.path() + "/" + name; }
};

TEST(GoldenHarnessSelfTest, SynthDirectoryPasses) {
    SelfTestDir d;
    const Result r = check_dir(d.tmp.path(), FT_BACKEND_CPU);
    ASSERT_TRUE(r.error.empty()) << r.error;
    ASSERT_EQ(r.layers.size(), 2u);
    EXPECT_TRUE(r.passed()) << describe(r);
}

TEST(GoldenHarnessSelfTest, WrongOutputIsCaught) {
    SelfTestDir d;
    const std::string out = d.path("layer0.out.f32");
    std::vector<float> y(size_t(5) * d.spec.hidden);
    std::ifstream(out, std::ios::binary).read(reinterpret_cast<char *>(y.data()), std::streamsize(y.size() * 4));
    for (size_t i = 0; i < y.size(); i += 3) y[i] *= 1.2f;
    write_raw(out, y);
    const Result r = check_dir(d.tmp.path(), FT_BACKEND_CPU);
    ASSERT_TRUE(r.error.empty()) << r.error;
    EXPECT_FALSE(r.passed());
    EXPECT_GT(r.layers.at(0).relative_l2, ft::golden::kMaxRelativeL2);
    EXPECT_LE(r.layers.at(1).relative_l2, ft::golden::kMaxRelativeL2);
}

TEST(GoldenHarnessSelfTest, WrongRouteIsCaught) {
    SelfTestDir d;
    std::vector<int32_t> ids = d.ids0;
    ids[0] = (ids[0] + 1) % d.spec.num_experts == ids[1] ? (ids[0] + 2) % d.spec.num_experts
                                                          : (ids[0] + 1) % d.spec.num_experts;
    write_raw(d.path("layer0.ids.i32"), ids);
    const Result r = check_dir(d.tmp.path(), FT_BACKEND_CPU);
    ASSERT_TRUE(r.error.empty()) << r.error;
    EXPECT_FALSE(r.layers.at(0).routes_equal);
    EXPECT_TRUE(r.layers.at(1).routes_equal);
    EXPECT_FALSE(r.passed());
}

TEST(GoldenHarnessSelfTest, TruncatedFileIsAnError) {
    SelfTestDir d;
    write_raw(d.path("layer0.weights.f32"), std::vector<float>{1.0f});
    const Result r = check_dir(d.tmp.path(), FT_BACKEND_CPU);
    EXPECT_NE(r.error.find("layer0.weights.f32"), std::string::npos) << r.error;
    EXPECT_FALSE(r.passed());
}

}  // namespace
