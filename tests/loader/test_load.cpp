// Checkpoints written by ft_synth in every architecture and layout, loaded back and compared
// byte for byte with the values synth says it wrote; callbacks, cancellation and throughput.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "ft/loader.hpp"
#include "ft/synth.hpp"
#include "scratch_files.hpp"

namespace ft {
namespace {

using synth::Spec;
using test::expect_error;
using test::ScratchDir;

struct Case {
    const char *name;
    Spec spec;
    int32_t rule;
    int32_t activation = FT_ACT_SILU;
};

void PrintTo(const Case &c, std::ostream *os) { *os << c.name; }

uint64_t case_seed(const char *name) {
    // A different seed per case and per run of the suite, so nothing passes by matching stale data.
    static const uint64_t run = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    uint64_t h = run;
    for (const char *p = name; *p; ++p) h = h * 1099511628211ull + static_cast<unsigned char>(*p);
    return h;
}

std::vector<Case> cases() {
    std::vector<Case> out;
    auto add = [&](const char *name, Spec s, int32_t rule, int32_t act = FT_ACT_SILU) {
        s.seed = case_seed(name);
        out.push_back({name, s, rule, act});
    };
    Spec s;
    s.architecture = "qwen3_moe";
    s.num_layers = 3;
    s.mlp_only_layers = {1};
    s.norm_topk_prob = false;
    add("qwen3_per_expert", s, FT_ROUTING_SOFTMAX_TOPK);

    s = Spec{};
    s.architecture = "qwen3_moe";
    s.layout = Spec::Layout::fused;
    s.hidden = 40;
    s.intermediate = 28;
    add("qwen3_fused", s, FT_ROUTING_SOFTMAX_TOPK_RENORM);

    s.layout = Spec::Layout::fused_transposed;
    s.hidden = 72;       // not a multiple of the transpose tile
    s.intermediate = 20;
    add("qwen3_fused_transposed", s, FT_ROUTING_SOFTMAX_TOPK_RENORM);

    s = Spec{};
    s.architecture = "qwen3_5_moe";
    s.layout = Spec::Layout::fused;
    s.language_model_prefix = true;
    s.shared_intermediate = 40;
    s.num_experts = 12;
    s.top_k = 3;
    s.shards = 3;
    s.mtp_layer = true;
    add("qwen3_5_fused_prefix_shared", s, FT_ROUTING_SOFTMAX_TOPK_RENORM);

    s = Spec{};
    s.architecture = "mixtral";
    s.num_layers = 2;
    add("mixtral_per_expert", s, FT_ROUTING_SOFTMAX_TOPK_RENORM);

    s.layout = Spec::Layout::fused;
    s.hidden_act = "gelu_pytorch_tanh";
    add("mixtral_fused_gelu_tanh", s, FT_ROUTING_SOFTMAX_TOPK_RENORM, FT_ACT_GELU_TANH);

    s = Spec{};
    s.architecture = "deepseek_v3";
    s.num_layers = 3;
    s.first_dense = 1;
    s.mtp_layer = true;
    s.num_experts = 16;
    s.top_k = 4;
    s.n_group = 4;
    s.topk_group = 2;
    s.routed_scaling_factor = 2.5f;
    s.shared_intermediate = 2 * s.intermediate;
    add("deepseek_v3_dense_mtp_shared_groups", s, FT_ROUTING_SIGMOID_GROUP_TOPK);

    s = Spec{};
    s.architecture = "kimi_k2";
    s.num_experts = 10;
    s.top_k = 3;
    s.routed_scaling_factor = 2.827f;
    s.shared_intermediate = s.intermediate;
    add("kimi_k2", s, FT_ROUTING_SIGMOID_GROUP_TOPK);

    s = Spec{};
    s.architecture = "glm4_moe";
    s.num_layers = 3;
    s.first_dense = 1;
    s.mtp_layer = true;
    s.norm_topk_prob = false;
    s.shared_intermediate = s.intermediate;
    s.routed_scaling_factor = 2.5f;
    add("glm4_moe", s, FT_ROUTING_SIGMOID_GROUP_TOPK);

    s = Spec{};
    s.architecture = "qwen3_moe";
    s.expert_dtype = "F32";
    add("qwen3_f32_experts", s, FT_ROUTING_SOFTMAX_TOPK_RENORM);

    s = Spec{};
    s.architecture = "deepseek_v3";
    s.layout = Spec::Layout::fused;
    s.expert_dtype = "F16";
    s.shared_intermediate = s.intermediate;
    add("deepseek_v3_f16_fused", s, FT_ROUTING_SIGMOID_GROUP_TOPK);

    s = Spec{};
    s.architecture = "qwen3_5_moe";
    s.layout = Spec::Layout::fused_transposed;
    s.expert_dtype = "F32";
    s.shared_intermediate = 16;
    add("qwen3_5_transposed_f32", s, FT_ROUTING_SOFTMAX_TOPK_RENORM);

    s = Spec{};
    s.architecture = "qwen3_moe";
    s.num_layers = 4;
    s.shards = 3;
    add("qwen3_three_shards", s, FT_ROUTING_SOFTMAX_TOPK_RENORM);
    return out;
}

void expect_bytes_eq(const void *got, const void *want, size_t bytes, const std::string &what) {
    if (std::memcmp(got, want, bytes) == 0) return;
    const uint8_t *g = static_cast<const uint8_t *>(got), *w = static_cast<const uint8_t *>(want);
    size_t i = 0;
    while (g[i] == w[i]) ++i;
    ADD_FAILURE() << what << ": first difference at byte " << i << " of " << bytes;
}

// Every bank row and extra tensor of `m` against what synth wrote for `s`.
void check_model(const Model &m, const Spec &s) {
    const ModelSpec &ms = m.spec();
    const size_t HI = static_cast<size_t>(s.hidden) * s.intermediate;
    for (int l = 0; l < ms.num_layers; ++l) {
        for (int e = 0; e < s.num_experts; ++e) {
            const std::string at = "layer " + std::to_string(l) + " expert " + std::to_string(e);
            const auto gate = synth::expert_weight(s, l, e, FT_PROJ_GATE);
            const auto up = synth::expert_weight(s, l, e, FT_PROJ_UP);
            const auto down = synth::expert_weight(s, l, e, FT_PROJ_DOWN);
            ASSERT_EQ(gate.size(), HI);
            expect_bytes_eq(m.gate(l, e), gate.data(), HI * 2, at + " gate");
            expect_bytes_eq(m.up(l, e), up.data(), HI * 2, at + " up");
            expect_bytes_eq(m.down(l, e), down.data(), HI * 2, at + " down");
            // The two gate_up halves sit back to back in one bank row.
            EXPECT_EQ(m.banks().row(0, l, e) + HI * 2, reinterpret_cast<const uint8_t *>(m.up(l, e)));
        }
        const LayerExtras &x = m.extras(l);
        const auto router = synth::router_weight(s, l);
        EXPECT_EQ(x.router_weight.dtype, FT_DTYPE_BF16);
        EXPECT_EQ(x.router_weight.shape, (std::vector<int64_t>{s.num_experts, s.hidden}));
        ASSERT_EQ(x.router_weight.bytes.size(), router.size() * 2);
        for (size_t i = 0; i < router.size(); ++i) {
            uint16_t b;
            std::memcpy(&b, &x.router_weight.bytes[i * 2], 2);
            ASSERT_EQ(bf16_to_f32(b), router[i]) << "router element " << i;
        }
        const bool ds = s.architecture == "deepseek_v3" || s.architecture == "kimi_k2" || s.architecture == "glm4_moe";
        if (ds) {
            const auto bias = synth::router_bias(s, l);
            EXPECT_EQ(x.router_bias.dtype, FT_DTYPE_F32);
            EXPECT_EQ(x.router_bias.shape, std::vector<int64_t>{s.num_experts});
            ASSERT_EQ(x.router_bias.bytes.size(), bias.size() * 4);
            expect_bytes_eq(x.router_bias.bytes.data(), bias.data(), bias.size() * 4, "router bias");
        } else {
            EXPECT_TRUE(x.router_bias.empty());
        }
        if (s.shared_intermediate > 0) {
            const size_t n = static_cast<size_t>(s.hidden) * s.shared_intermediate;
            const Tensor *t[3] = {&x.shared_gate, &x.shared_up, &x.shared_down};
            const int proj[3] = {FT_PROJ_GATE, FT_PROJ_UP, FT_PROJ_DOWN};
            for (int p = 0; p < 3; ++p) {
                const auto want = synth::shared_weight(s, l, proj[p]);
                EXPECT_EQ(t[p]->dtype, FT_DTYPE_BF16);
                ASSERT_EQ(t[p]->bytes.size(), n * 2);
                expect_bytes_eq(t[p]->bytes.data(), want.data(), n * 2, "shared projection " + std::to_string(p));
            }
            EXPECT_EQ(x.shared_down.shape, (std::vector<int64_t>{s.hidden, s.shared_intermediate}));
        } else {
            EXPECT_TRUE(x.shared_gate.empty());
        }
        if (s.architecture == "qwen3_5_moe" && s.shared_intermediate > 0) {
            const auto want = synth::shared_gate_weight(s, l);
            EXPECT_EQ(x.shared_gate_proj.shape, (std::vector<int64_t>{1, s.hidden}));
            ASSERT_EQ(x.shared_gate_proj.bytes.size(), want.size() * 2);
            expect_bytes_eq(x.shared_gate_proj.bytes.data(), want.data(), want.size() * 2, "shared expert gate");
        } else {
            EXPECT_TRUE(x.shared_gate_proj.empty());
        }
    }
}

class LoadArchitecture : public ::testing::TestWithParam<Case> {};

TEST_P(LoadArchitecture, BanksAndSpecMatchWhatWasWritten) {
    const Case &c = GetParam();
    const Spec &s = c.spec;
    ScratchDir dir;
    synth::write_checkpoint(dir.path(), s);
    if (s.shards > 1) {
        EXPECT_TRUE(std::filesystem::exists(dir / "model.safetensors.index.json"));
        char name[64];
        std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s.shards, s.shards);
        EXPECT_TRUE(std::filesystem::exists(dir / name)) << name;
    }
    LoadOptions opts;
    opts.io_threads = 3;
    std::unique_ptr<Model> m = load_checkpoint(dir.path(), opts);
    const ModelSpec &ms = m->spec();

    const std::vector<int> want_layers = synth::moe_layers(s);
    EXPECT_EQ(ms.moe_layers, std::vector<int32_t>(want_layers.begin(), want_layers.end()));
    EXPECT_EQ(ms.num_layers, static_cast<int32_t>(want_layers.size()));
    EXPECT_EQ(ms.total_layers, s.num_layers);
    EXPECT_EQ(ms.architecture, s.architecture);
    EXPECT_EQ(ms.num_experts, s.num_experts);
    EXPECT_EQ(ms.top_k, s.top_k);
    EXPECT_EQ(ms.hidden, s.hidden);
    EXPECT_EQ(ms.intermediate, s.intermediate);
    EXPECT_EQ(ms.activation, c.activation);
    EXPECT_EQ(ms.routing.rule, c.rule);
    EXPECT_EQ(ms.routing.num_experts, s.num_experts);
    EXPECT_EQ(ms.routing.top_k, s.top_k);
    EXPECT_EQ(ms.shared_intermediate, s.shared_intermediate);
    EXPECT_EQ(ms.shared_expert_gate, s.architecture == "qwen3_5_moe" && s.shared_intermediate > 0);
    if (c.rule == FT_ROUTING_SIGMOID_GROUP_TOPK) {
        EXPECT_EQ(ms.routing.num_groups, s.n_group);
        EXPECT_EQ(ms.routing.topk_groups, s.topk_group);
        EXPECT_FLOAT_EQ(ms.routing.routed_scaling_factor, s.routed_scaling_factor);
        EXPECT_EQ(ms.routing.renormalize, s.norm_topk_prob);
    }
    for (size_t i = 0; i < want_layers.size(); ++i) EXPECT_EQ(m->moe_layer_of(want_layers[i]), static_cast<int32_t>(i));
    check_model(*m, s);

    // Without its index, a sharded checkpoint is read by scanning the directory.
    if (s.shards > 1) {
        std::filesystem::remove(dir / "model.safetensors.index.json");
        check_model(*load_checkpoint(dir.path(), opts), s);
    }
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, LoadArchitecture, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case> &i) { return std::string(i.param.name); });

TEST(LoadCallbacks, LayerFilledOnceWithItsBytesInPlace) {
    Spec s;
    s.architecture = "deepseek_v3";
    s.num_layers = 6;
    s.first_dense = 1;
    s.num_experts = 16;
    s.hidden = 256;
    s.intermediate = 96;
    s.shared_intermediate = 96;
    s.layout = Spec::Layout::fused;
    s.seed = case_seed("callbacks");
    ScratchDir dir;
    synth::write_checkpoint(dir.path(), s);
    const int L = 5;

    // Every expected bank row, so that the callback only compares.
    const size_t HI = static_cast<size_t>(s.hidden) * s.intermediate;
    std::vector<std::vector<uint16_t>> want(L);
    for (int l = 0; l < L; ++l)
        for (int e = 0; e < s.num_experts; ++e)
            for (int p : {FT_PROJ_GATE, FT_PROJ_UP, FT_PROJ_DOWN}) {
                const auto w = synth::expert_weight(s, l, e, p);
                want[l].insert(want[l].end(), w.begin(), w.end());
            }

    std::mutex mu;
    std::vector<int> filled(L, 0);
    std::vector<uint64_t> seen;
    std::atomic<int> incomplete{0};
    const Model *live = nullptr;
    LoadOptions opts;
    opts.io_threads = 4;
    opts.progress = [&](uint64_t done, uint64_t total) {
        seen.push_back(done);
        EXPECT_LE(done, total);
        return true;
    };
    opts.on_model_allocated = [&](Model &m) { live = &m; };
    opts.on_layer_filled = [&](int l) {
        std::lock_guard<std::mutex> lock(mu);
        ASSERT_TRUE(live);
        ASSERT_GE(l, 0);
        ASSERT_LT(l, L);
        ++filled[l];
        for (int e = 0; e < s.num_experts; ++e) {
            const uint16_t *w = want[l].data() + static_cast<size_t>(e) * HI * 3;
            if (std::memcmp(live->gate(l, e), w, HI * 4) != 0 || std::memcmp(live->down(l, e), w + 2 * HI, HI * 2) != 0)
                ++incomplete;
        }
    };
    std::unique_ptr<Model> m = load_checkpoint(dir.path(), opts);
    EXPECT_EQ(live, m.get());
    for (int l = 0; l < L; ++l) EXPECT_EQ(filled[l], 1) << "layer " << l;
    EXPECT_EQ(incomplete.load(), 0) << "a layer was reported before all its bytes were written";
    ASSERT_GE(seen.size(), 2u);
    EXPECT_EQ(seen.front(), 0u);
    for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i], seen[i - 1]);
    uint64_t file_bytes = 0;
    for (const auto &e : std::filesystem::directory_iterator(dir.path()))
        if (e.path().extension() == ".safetensors") file_bytes += e.file_size();
    EXPECT_GT(seen.back(), m->banks().total_bytes());  // banks plus router, bias, shared experts
    EXPECT_LT(seen.back(), file_bytes);               // dense layer, MTP, embeddings are not read
}

TEST(LoadCallbacks, Cancellation) {
    Spec s;
    s.seed = case_seed("cancel");
    s.num_layers = 4;
    ScratchDir dir;
    synth::write_checkpoint(dir.path(), s);
    // 1: the first call (before any read); 2: the next one, mid-way or at the end.
    for (int cancel_at : {1, 2}) {
        int calls = 0;
        std::atomic<int> layers{0};
        LoadOptions opts;
        opts.io_threads = 2;
        opts.progress = [&](uint64_t, uint64_t) { return ++calls < cancel_at; };
        opts.on_layer_filled = [&](int) { ++layers; };
        expect_error([&] { load_checkpoint(dir.path(), opts); }, FT_ERR_CANCELLED, {"cancelled"});
        EXPECT_EQ(calls, cancel_at);
        if (cancel_at == 1) {
            EXPECT_EQ(layers.load(), 0) << "nothing may be read after a cancel at the start";
        }
    }
}

TEST(LoadCallbacks, SingleReaderAndErrorsFromCallbacks) {
    Spec s;
    s.seed = case_seed("single");
    s.num_experts = 5;
    ScratchDir dir;
    synth::write_checkpoint(dir.path(), s);
    LoadOptions opts;
    opts.io_threads = 1;
    check_model(*load_checkpoint(dir.path(), opts), s);
    // An exception thrown by on_layer_filled on a worker ends the load with it.
    opts.on_layer_filled = [](int l) { fail(FT_ERR_DEVICE, "cannot pin layer ", l); };
    expect_error([&] { load_checkpoint(dir.path(), opts); }, FT_ERR_DEVICE, {"cannot pin layer"});
}

}  // namespace
}  // namespace ft
