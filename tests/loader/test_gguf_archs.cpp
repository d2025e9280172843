// GGUF general.architecture -> ModelSpec: every MoE family in the table, written with the metadata
// keys its llama.cpp conversions carry, gives the routing rule, activation and shared expert the
// family computes with, and (where a config.json reader exists for it) exactly the spec that reader
// builds for the equivalent config.json. Refusals: dense models, unknown architectures, routing
// metadata a family cannot serve. Router biases (exp_probs_b, gpt-oss's ffn_gate_inp.bias) load.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "fresh_seed.hpp"
#include "ft/gguf.hpp"
#include "ft/loader.hpp"
#include "ft/synth.hpp"
#include "scratch_files.hpp"

namespace ft {
namespace {

using nlohmann::json;
using synth::GgufWriter;
using test::expect_error;
using test::ScratchDir;

constexpr uint32_t kF32 = 0, kBf16 = 30, kQ4_0 = 2;
constexpr uint64_t H = 64, I = 32, E = 8;

// One synthetic GGUF model: metadata under `arch`, routed experts (BF16 unless q4) on `moe`
// layers, an optional shared expert of width `shared_rows` (tensor only; keys are the caller's).
struct File {
    explicit File(std::string a) : arch(std::move(a)) {}
    std::string arch;
    uint32_t blocks = 4;
    uint32_t top_k = 2;
    std::vector<int> moe = {0, 1, 2, 3};
    bool width_key = true;        // write expert_feed_forward_length
    uint64_t shared_rows = 0;     // ffn_{gate,up,down}_shexp of this width
    bool q4 = false;
    std::function<void(GgufWriter &, const std::string &)> keys;  // family keys, given "arch."
    std::function<void(GgufWriter &, int)> layer_tensors;          // extra tensors per MoE layer
};

std::vector<uint8_t> zeros(uint64_t n) { return std::vector<uint8_t>(n, 0); }

std::vector<uint8_t> f32_bytes(const std::vector<float> &v) {
    std::vector<uint8_t> out(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
}

std::string write(const ScratchDir &dir, const File &f) {
    GgufWriter w;
    const std::string a = f.arch + ".";
    w.kv_string("general.architecture", f.arch);
    w.kv_u32(a + "block_count", f.blocks);
    w.kv_u32(a + "embedding_length", H);
    w.kv_u32(a + "feed_forward_length", 4 * H);  // the dense layers' width, never the experts'
    w.kv_u32(a + "expert_count", E);
    w.kv_u32(a + "expert_used_count", f.top_k);
    if (f.width_key) w.kv_u32(a + "expert_feed_forward_length", I);
    if (f.keys) f.keys(w, a);
    const uint32_t xt = f.q4 ? kQ4_0 : kBf16;
    auto expert_bytes = [&](uint64_t rows, uint64_t k) { return f.q4 ? zeros(E * rows * (k / 32) * 18) : zeros(E * rows * k * 2); };
    for (int l : f.moe) {
        const std::string b = "blk." + std::to_string(l) + ".";
        w.tensor(b + "ffn_gate_inp.weight", {H, E}, kF32, zeros(H * E * 4));
        w.tensor(b + "ffn_gate_exps.weight", {H, I, E}, xt, expert_bytes(I, H));
        w.tensor(b + "ffn_up_exps.weight", {H, I, E}, xt, expert_bytes(I, H));
        w.tensor(b + "ffn_down_exps.weight", {I, H, E}, xt, expert_bytes(H, I));
        if (f.shared_rows) {
            w.tensor(b + "ffn_gate_shexp.weight", {H, f.shared_rows}, kBf16, zeros(H * f.shared_rows * 2));
            w.tensor(b + "ffn_up_shexp.weight", {H, f.shared_rows}, kBf16, zeros(H * f.shared_rows * 2));
            w.tensor(b + "ffn_down_shexp.weight", {f.shared_rows, H}, kBf16, zeros(H * f.shared_rows * 2));
        }
        if (f.layer_tensors) f.layer_tensors(w, l);
    }
    const std::string path = dir / (f.arch + ".gguf");
    w.write(path);
    return path;
}

ModelSpec gguf_spec(const ScratchDir &dir, const File &f) {
    GgufFile g(write(dir, f));
    return read_gguf_config(g);
}

// exp_probs_b of every MoE layer (the sigmoid / biased families ship it).
void with_probs_bias(GgufWriter &w, int l) {
    w.tensor("blk." + std::to_string(l) + ".exp_probs_b.bias", {E}, kF32, zeros(E * 4));
}

ModelSpec config_spec(const ScratchDir &dir, json cfg) {
    cfg["hidden_size"] = H;
    if (!cfg.contains("num_hidden_layers")) cfg["num_hidden_layers"] = 4;
    if (!cfg.contains("num_experts_per_tok")) cfg["num_experts_per_tok"] = 2;
    test::write_file(dir / "config.json", cfg.dump());
    return read_model_config(dir.path());
}

// The GGUF reader's spec must be the config.json reader's for the same model, field by field.
void expect_same(const ModelSpec &g, const ModelSpec &c) {
    EXPECT_EQ(g.architecture, c.architecture);
    EXPECT_EQ(g.total_layers, c.total_layers);
    EXPECT_EQ(g.moe_layers, c.moe_layers);
    EXPECT_EQ(g.num_layers, c.num_layers);
    EXPECT_EQ(g.num_experts, c.num_experts);
    EXPECT_EQ(g.top_k, c.top_k);
    EXPECT_EQ(g.hidden, c.hidden);
    EXPECT_EQ(g.intermediate, c.intermediate);
    EXPECT_EQ(g.format, c.format);
    EXPECT_EQ(g.activation, c.activation);
    EXPECT_EQ(g.swiglu_alpha, c.swiglu_alpha);
    EXPECT_EQ(g.swiglu_limit, c.swiglu_limit);
    EXPECT_EQ(g.routing.rule, c.routing.rule);
    EXPECT_EQ(g.routing.num_experts, c.routing.num_experts);
    EXPECT_EQ(g.routing.top_k, c.routing.top_k);
    EXPECT_EQ(g.routing.num_groups, c.routing.num_groups);
    EXPECT_EQ(g.routing.topk_groups, c.routing.topk_groups);
    EXPECT_FLOAT_EQ(g.routing.routed_scaling_factor, c.routing.routed_scaling_factor);
    EXPECT_EQ(g.routing.renormalize, c.routing.renormalize);
    EXPECT_FLOAT_EQ(g.routing.jitter_eps, c.routing.jitter_eps);
    EXPECT_EQ(g.shared_intermediate, c.shared_intermediate);
    EXPECT_EQ(g.shared_expert_gate, c.shared_expert_gate);
    EXPECT_EQ(g.route_weight, c.route_weight);
}

// ---- families with a config.json counterpart: same spec -------------------------------------

struct Pair {
    const char *name;
    File file;
    json config;
    int32_t rule;  // the rule both must arrive at (guards against both readers being wrong alike)
};

void PrintTo(const Pair &p, std::ostream *os) { *os << p.name; }

class GgufArchPair : public ::testing::TestWithParam<Pair> {};

TEST_P(GgufArchPair, SameSpecAsConfigJson) {
    const Pair &p = GetParam();
    ScratchDir gdir, cdir;
    const ModelSpec g = gguf_spec(gdir, p.file);
    const ModelSpec c = config_spec(cdir, p.config);
    EXPECT_EQ(g.routing.rule, p.rule);
    expect_same(g, c);
}

auto u32 = [](const char *k, uint32_t v) { return [=](GgufWriter &w, const std::string &a) { w.kv_u32(a + k, v); }; };

std::vector<Pair> pairs() {
    std::vector<Pair> out;
    {
        File f{"qwen2moe"};
        f.shared_rows = 48;
        f.keys = u32("expert_shared_feed_forward_length", 48);
        out.push_back({"qwen2moe", f,
                       {{"model_type", "qwen2_moe"}, {"num_experts", E}, {"moe_intermediate_size", I},
                        {"shared_expert_intermediate_size", 48}},
                       FT_ROUTING_SOFTMAX_TOPK});
    }
    out.push_back({"qwen3moe", File{"qwen3moe"},
                   {{"model_type", "qwen3_moe"}, {"num_experts", E}, {"moe_intermediate_size", I}, {"norm_topk_prob", true}},
                   FT_ROUTING_SOFTMAX_TOPK_RENORM});
    out.push_back({"qwen3vlmoe", File{"qwen3vlmoe"},
                   {{"model_type", "qwen3_vl_moe_text"}, {"num_experts", E}, {"moe_intermediate_size", I}},
                   FT_ROUTING_SOFTMAX_TOPK_RENORM});
    {
        File f{"qwen3next"};
        f.shared_rows = 32;
        f.keys = u32("expert_shared_feed_forward_length", 32);
        out.push_back({"qwen3next", f,
                       {{"model_type", "qwen3_next"}, {"num_experts", E}, {"moe_intermediate_size", I},
                        {"shared_expert_intermediate_size", 32}},
                       FT_ROUTING_SOFTMAX_TOPK_RENORM});
    }
    {
        // Qwen3.5/3.6 MoE: gated shared expert, renormalised, an MTP block after the decoder layers.
        File f{"qwen35moe"};
        f.blocks = 5;
        f.moe = {0, 1, 2, 3, 4};
        f.shared_rows = 40;
        f.keys = [](GgufWriter &w, const std::string &a) {
            w.kv_u32(a + "expert_shared_feed_forward_length", 40);
            w.kv_u32(a + "nextn_predict_layers", 1);
        };
        out.push_back({"qwen35moe", f,
                       {{"model_type", "qwen3_5_moe_text"}, {"num_experts", E}, {"moe_intermediate_size", I},
                        {"shared_expert_intermediate_size", 40}},
                       FT_ROUTING_SOFTMAX_TOPK_RENORM});
    }
    {
        File f{"llama"};  // Mixtral converted as llama: no expert_feed_forward_length
        f.width_key = false;
        out.push_back({"mixtral_as_llama", f, {{"model_type", "mixtral"}, {"num_local_experts", E}, {"intermediate_size", I}},
                       FT_ROUTING_SOFTMAX_TOPK_RENORM});
    }
    {
        File f{"phimoe"};
        f.width_key = false;
        out.push_back({"phimoe", f, {{"model_type", "phimoe"}, {"num_local_experts", E}, {"intermediate_size", I}},
                       FT_ROUTING_SPARSEMIXER});
    }
    out.push_back({"olmoe", File{"olmoe"}, {{"model_type", "olmoe"}, {"num_experts", E}, {"intermediate_size", I}},
                   FT_ROUTING_SOFTMAX_TOPK});
    {
        File f{"jamba"};
        f.moe = {1, 3};
        out.push_back({"jamba", f, {{"model_type", "jamba"}, {"num_experts", E}, {"intermediate_size", I}},
                       FT_ROUTING_SOFTMAX_TOPK});
    }
    {
        // DeepSeek-V2 (softmax): no expert_gating_func in older files; scaling; 2 shared experts.
        File f{"deepseek2"};
        f.moe = {1, 2, 3};
        f.shared_rows = 2 * I;
        f.keys = [](GgufWriter &w, const std::string &a) {
            w.kv_u32(a + "leading_dense_block_count", 1);
            w.kv_u32(a + "expert_shared_count", 2);
            w.kv_f32(a + "expert_weights_scale", 16.0f);
        };
        out.push_back({"deepseek2_v2", f,
                       {{"model_type", "deepseek_v2"}, {"n_routed_experts", E}, {"moe_intermediate_size", I},
                        {"first_k_dense_replace", 1}, {"n_shared_experts", 2}, {"routed_scaling_factor", 16.0}},
                       FT_ROUTING_SOFTMAX_GROUP_TOPK});
    }
    {
        // DeepSeek-V3 / Kimi-K2 (sigmoid, groups) with a trailing MTP layer (block_count 5).
        File f{"deepseek2"};
        f.blocks = 5;
        f.moe = {1, 2, 3, 4};
        f.shared_rows = I;
        f.keys = [](GgufWriter &w, const std::string &a) {
            w.kv_u32(a + "leading_dense_block_count", 1);
            w.kv_u32(a + "nextn_predict_layers", 1);
            w.kv_u32(a + "expert_shared_count", 1);
            w.kv_f32(a + "expert_weights_scale", 2.5f);
            w.kv_bool(a + "expert_weights_norm", true);
            w.kv_u32(a + "expert_gating_func", 2);
            w.kv_u32(a + "expert_group_count", 4);
            w.kv_u32(a + "expert_group_used_count", 2);
        };
        f.layer_tensors = with_probs_bias;
        out.push_back({"deepseek2_v3", f,
                       {{"model_type", "deepseek_v3"}, {"n_routed_experts", E}, {"moe_intermediate_size", I},
                        {"first_k_dense_replace", 1}, {"n_shared_experts", 1}, {"routed_scaling_factor", 2.5},
                        {"n_group", 4}, {"topk_group", 2}, {"norm_topk_prob", true}},
                       FT_ROUTING_SIGMOID_GROUP_TOPK});
    }
    {
        File f{"glm4moe"};
        f.blocks = 5;
        f.moe = {1, 2, 3, 4};
        f.shared_rows = I;
        f.keys = [](GgufWriter &w, const std::string &a) {
            w.kv_u32(a + "leading_dense_block_count", 1);
            w.kv_u32(a + "nextn_predict_layers", 1);
            w.kv_u32(a + "expert_shared_count", 1);
            w.kv_f32(a + "expert_weights_scale", 1.0f);
            w.kv_bool(a + "expert_weights_norm", true);
            w.kv_u32(a + "expert_gating_func", 2);
        };
        f.layer_tensors = with_probs_bias;
        out.push_back({"glm4moe", f,
                       {{"model_type", "glm4_moe"}, {"n_routed_experts", E}, {"moe_intermediate_size", I},
                        {"first_k_dense_replace", 1}, {"n_shared_experts", 1}},
                       FT_ROUTING_SIGMOID_GROUP_TOPK});
    }
    {
        File f{"dots1"};
        f.shared_rows = 2 * I;
        f.keys = [](GgufWriter &w, const std::string &a) {
            w.kv_u32(a + "leading_dense_block_count", 0);
            w.kv_u32(a + "expert_shared_count", 2);
            w.kv_f32(a + "expert_weights_scale", 2.5f);
            w.kv_u32(a + "expert_gating_func", 2);
        };
        f.layer_tensors = with_probs_bias;
        out.push_back({"dots1", f,
                       {{"model_type", "dots1"}, {"n_routed_experts", E}, {"moe_intermediate_size", I},
                        {"n_shared_experts", 2}, {"routed_scaling_factor", 2.5}},
                       FT_ROUTING_SIGMOID_GROUP_TOPK});
    }
    {
        File f{"minimax-m2"};
        f.keys = u32("expert_gating_func", 2);
        f.layer_tensors = with_probs_bias;
        out.push_back({"minimax_m2", f, {{"model_type", "minimax_m2"}, {"num_local_experts", E}, {"intermediate_size", I}},
                       FT_ROUTING_SIGMOID_GROUP_TOPK});
    }
    {
        File f{"ernie4_5-moe"};
        f.moe = {1, 2, 3};
        f.shared_rows = 2 * I;
        f.keys = [](GgufWriter &w, const std::string &a) {
            w.kv_u32(a + "leading_dense_block_count", 1);
            w.kv_u32(a + "interleave_moe_layer_step", 1);
            w.kv_u32(a + "expert_shared_count", 2);
        };
        f.layer_tensors = with_probs_bias;
        out.push_back({"ernie4_5_moe", f,
                       {{"model_type", "ernie4_5_moe"}, {"moe_num_experts", E}, {"moe_intermediate_size", I},
                        {"moe_num_shared_experts", 2}, {"moe_layer_start_index", 1}},
                       FT_ROUTING_SOFTMAX_BIASED_TOPK});
    }
    {
        File f{"hunyuan-moe"};
        f.shared_rows = I;
        f.keys = u32("expert_shared_feed_forward_length", I);
        out.push_back({"hunyuan_moe", f, {{"model_type", "hunyuan_v1_moe"}, {"num_experts", E}, {"intermediate_size", I}},
                       FT_ROUTING_SOFTMAX_TOPK_RENORM});
    }
    {
        File f{"gpt-oss"};
        f.top_k = 4;
        out.push_back({"gpt_oss", f,
                       {{"model_type", "gpt_oss"}, {"num_local_experts", E}, {"intermediate_size", I},
                        {"num_experts_per_tok", 4}},
                       FT_ROUTING_TOPK_SOFTMAX});
    }
    {
        // Llama-4: MoE every second layer, top-1, a shared expert of width I given only by its tensors.
        File f{"llama4"};
        f.top_k = 1;
        f.moe = {1, 3};
        f.shared_rows = I;
        f.keys = u32("interleave_moe_layer_step", 2);
        out.push_back({"llama4", f,
                       {{"model_type", "llama4_text"}, {"num_local_experts", E}, {"intermediate_size", I},
                        {"num_experts_per_tok", 1}, {"interleave_moe_layer_step", 2}},
                       FT_ROUTING_TOPK_SIGMOID});
    }
    {
        File f{"granitemoe"};
        f.width_key = false;
        out.push_back({"granitemoe", f, {{"model_type", "granitemoe"}, {"num_local_experts", E}, {"intermediate_size", I}},
                       FT_ROUTING_TOPK_SOFTMAX});
        f.shared_rows = 48;
        f.keys = u32("expert_shared_feed_forward_length", 48);
        out.push_back({"granitemoeshared", f,
                       {{"model_type", "granitemoeshared"}, {"num_local_experts", E}, {"intermediate_size", I},
                        {"shared_intermediate_size", 48}},
                       FT_ROUTING_TOPK_SOFTMAX});
        f.arch = "granitehybrid";
        out.push_back({"granitehybrid", f,
                       {{"model_type", "granitemoehybrid"}, {"num_local_experts", E}, {"intermediate_size", I},
                        {"shared_intermediate_size", 48}},
                       FT_ROUTING_TOPK_SOFTMAX});
    }
    return out;
}

INSTANTIATE_TEST_SUITE_P(Families, GgufArchPair, ::testing::ValuesIn(pairs()),
                         [](const ::testing::TestParamInfo<Pair> &i) { return std::string(i.param.name); });

// ---- what each family computes, spelled out --------------------------------------------------

TEST(GgufArchs, FamilySpecifics) {
    ScratchDir dir;
    const std::vector<Pair> all = pairs();
    std::map<std::string, ModelSpec> s;
    for (const Pair &p : all) {
        ScratchDir d;
        s[p.name] = gguf_spec(d, p.file);
    }
    // Renormalisation: fixed by the family unless expert_weights_norm says otherwise.
    EXPECT_EQ(s["qwen2moe"].routing.rule, FT_ROUTING_SOFTMAX_TOPK);
    EXPECT_EQ(s["mixtral_as_llama"].architecture, "mixtral");
    EXPECT_EQ(s["mixtral_as_llama"].intermediate, static_cast<int32_t>(I));  // from ffn_down_exps, not feed_forward_length
    // Shared experts and their gate.
    EXPECT_EQ(s["qwen2moe"].shared_intermediate, 48);
    EXPECT_TRUE(s["qwen2moe"].shared_expert_gate);
    EXPECT_TRUE(s["qwen3next"].shared_expert_gate);
    EXPECT_TRUE(s["qwen35moe"].shared_expert_gate);
    EXPECT_EQ(s["qwen35moe"].total_layers, 4);
    EXPECT_EQ(s["qwen35moe"].moe_layers, (std::vector<int32_t>{0, 1, 2, 3}));
    EXPECT_EQ(s["deepseek2_v2"].shared_intermediate, static_cast<int32_t>(2 * I));
    EXPECT_FALSE(s["deepseek2_v2"].shared_expert_gate);
    EXPECT_EQ(s["llama4"].shared_intermediate, static_cast<int32_t>(I));
    EXPECT_EQ(s["hunyuan_moe"].shared_intermediate, static_cast<int32_t>(I));
    // DeepSeek: the gating function picks V2 or V3; MTP layers are not decoder layers.
    EXPECT_EQ(s["deepseek2_v2"].architecture, "deepseek_v2");
    EXPECT_FALSE(s["deepseek2_v2"].routing.renormalize);
    EXPECT_FLOAT_EQ(s["deepseek2_v2"].routing.routed_scaling_factor, 16.0f);
    EXPECT_EQ(s["deepseek2_v3"].architecture, "deepseek_v3");
    EXPECT_EQ(s["deepseek2_v3"].total_layers, 4);
    EXPECT_EQ(s["deepseek2_v3"].moe_layers, (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(s["deepseek2_v3"].routing.num_groups, 4);
    EXPECT_EQ(s["deepseek2_v3"].routing.topk_groups, 2);
    EXPECT_FALSE(s["dots1"].routing.renormalize);  // dots1 without expert_weights_norm
    EXPECT_TRUE(s["minimax_m2"].routing.renormalize);
    // gpt-oss: clamped SwiGLU; Llama-4: the route weight scales the expert input.
    EXPECT_EQ(s["gpt_oss"].activation, FT_ACT_SWIGLU_CLAMP);
    EXPECT_FLOAT_EQ(s["gpt_oss"].swiglu_alpha, 1.702f);
    EXPECT_FLOAT_EQ(s["gpt_oss"].swiglu_limit, 7.0f);
    EXPECT_EQ(s["llama4"].route_weight, FT_ROUTE_WEIGHT_INPUT);
    EXPECT_EQ(s["llama4"].moe_layers, (std::vector<int32_t>{1, 3}));
    EXPECT_EQ(s["granitemoeshared"].architecture, "granitemoeshared");
    EXPECT_EQ(s["granitehybrid"].architecture, "granitemoehybrid");
    for (const char *n : {"qwen3moe", "deepseek2_v3", "ernie4_5_moe", "phimoe"})
        EXPECT_EQ(s[n].activation, FT_ACT_SILU) << n;
}

// Families without a config.json reader: the rule llama.cpp computes with.
TEST(GgufArchs, FamiliesWithoutConfigReader) {
    ScratchDir dir;
    {
        // Ling (bailingmoe): softmax, expert_weights_norm, shared experts by count.
        File f{"bailingmoe"};
        f.shared_rows = 2 * I;
        f.keys = [](GgufWriter &w, const std::string &a) {
            w.kv_u32(a + "expert_shared_count", 2);
            w.kv_f32(a + "expert_weights_scale", 1.0f);
            w.kv_bool(a + "expert_weights_norm", true);
        };
        const ModelSpec s = gguf_spec(dir, f);
        EXPECT_EQ(s.architecture, "bailingmoe");
        EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_TOPK_RENORM);
        EXPECT_EQ(s.shared_intermediate, static_cast<int32_t>(2 * I));
    }
    {
        // Ling 2.0 (bailingmoe2): sigmoid, groups, scaling, shared width by key, MTP layer.
        File f{"bailingmoe2"};
        f.blocks = 5;
        f.moe = {1, 2, 3, 4};
        f.shared_rows = 40;
        f.keys = [](GgufWriter &w, const std::string &a) {
            w.kv_u32(a + "leading_dense_block_count", 1);
            w.kv_u32(a + "nextn_predict_layers", 1);
            w.kv_u32(a + "expert_shared_count", 1);
            w.kv_u32(a + "expert_shared_feed_forward_length", 40);
            w.kv_f32(a + "expert_weights_scale", 2.5f);
            w.kv_bool(a + "expert_weights_norm", true);
            w.kv_u32(a + "expert_gating_func", 2);
            w.kv_u32(a + "expert_group_count", 4);
            w.kv_u32(a + "expert_group_used_count", 2);
        };
        f.layer_tensors = with_probs_bias;
        const ModelSpec s = gguf_spec(dir, f);
        EXPECT_EQ(s.routing.rule, FT_ROUTING_SIGMOID_GROUP_TOPK);
        EXPECT_TRUE(s.routing.renormalize);
        EXPECT_FLOAT_EQ(s.routing.routed_scaling_factor, 2.5f);
        EXPECT_EQ(s.routing.num_groups, 4);
        EXPECT_EQ(s.routing.topk_groups, 2);
        EXPECT_EQ(s.shared_intermediate, 40);  // the length key wins over count x I
        EXPECT_EQ(s.total_layers, 4);
        EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{1, 2, 3}));
    }
    {
        // DeepSeek-MoE (v1): softmax without renormalisation, through the grouped softmax rule.
        File f{"deepseek"};
        f.keys = [](GgufWriter &w, const std::string &a) {
            w.kv_u32(a + "leading_dense_block_count", 1);
            w.kv_f32(a + "expert_weights_scale", 1.0f);
        };
        const ModelSpec s = gguf_spec(dir, f);
        EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_GROUP_TOPK);
        EXPECT_FALSE(s.routing.renormalize);
        EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{1, 2, 3}));
    }
    {
        File f{"dbrx"};
        EXPECT_EQ(gguf_spec(dir, f).routing.rule, FT_ROUTING_SOFTMAX_TOPK_RENORM);
    }
    {
        File f{"lfm2moe"};
        f.keys = u32("expert_gating_func", 2);
        f.layer_tensors = with_probs_bias;
        const ModelSpec s = gguf_spec(dir, f);
        EXPECT_EQ(s.routing.rule, FT_ROUTING_SIGMOID_GROUP_TOPK);
        EXPECT_TRUE(s.routing.renormalize);
    }
    {
        // A softmax family with expert_weights_scale goes through the grouped softmax rule, which scales.
        File f{"hunyuan-moe"};
        f.keys = [](GgufWriter &w, const std::string &a) { w.kv_f32(a + "expert_weights_scale", 2.0f); };
        const ModelSpec s = gguf_spec(dir, f);
        EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_GROUP_TOPK);
        EXPECT_TRUE(s.routing.renormalize);
        EXPECT_FLOAT_EQ(s.routing.routed_scaling_factor, 2.0f);
    }
}

// ---- refusals ---------------------------------------------------------------------------------

TEST(GgufArchs, DenseUnknownAndRefusedArchitectures) {
    ScratchDir dir;
    // A dense model (no expert_count) of a known or unknown architecture.
    for (const char *arch : {"qwen3", "llama", "gemma3"}) {
        GgufWriter w;
        w.kv_string("general.architecture", arch);
        w.kv_u32(std::string(arch) + ".block_count", 2);
        w.kv_u32(std::string(arch) + ".embedding_length", H);
        w.write(dir / "dense.gguf");
        GgufFile g(dir / "dense.gguf");
        expect_error([&] { read_gguf_config(g); }, FT_ERR_UNSUPPORTED, {arch, "dense", "no routed experts"});
    }
    // expert_count 0 is dense too.
    {
        GgufWriter w;
        w.kv_string("general.architecture", "llama");
        w.kv_u32("llama.block_count", 2);
        w.kv_u32("llama.embedding_length", H);
        w.kv_u32("llama.expert_count", 0);
        w.write(dir / "zero.gguf");
        GgufFile g(dir / "zero.gguf");
        expect_error([&] { read_gguf_config(g); }, FT_ERR_UNSUPPORTED, {"llama", "dense"});
    }
    // An unknown MoE architecture: named, with the supported list.
    {
        GgufFile g(write(dir, File{"futuremoe"}));
        expect_error([&] { read_gguf_config(g); }, FT_ERR_UNSUPPORTED,
                     {"'futuremoe'", "not supported", "qwen3moe", "deepseek2", "gpt-oss", "llama4"});
    }
    // GroveMoE's second (chunk) expert set and Gemma 4's per-expert output scale are not served: named.
    {
        GgufFile g(write(dir, File{"grovemoe"}));
        expect_error([&] { read_gguf_config(g); }, FT_ERR_UNSUPPORTED, {"grovemoe", "chexps"});
        GgufFile g4(write(dir, File{"gemma4"}));
        expect_error([&] { read_gguf_config(g4); }, FT_ERR_UNSUPPORTED, {"gemma4", "scale"});
    }
    // Every listed architecture is accepted, and refused ones are not listed.
    const std::vector<std::string> list = supported_gguf_architectures();
    EXPECT_EQ(std::count(list.begin(), list.end(), "grovemoe"), 0);
    EXPECT_EQ(std::count(list.begin(), list.end(), "gemma4"), 0);
    for (const std::string &arch : list) {
        File f{arch};
        f.top_k = arch == "llama4" ? 1 : 2;
        if (arch == "glm4moe" || arch == "dots1" || arch == "bailingmoe2" || arch == "minimax-m2" || arch == "lfm2moe" ||
            arch == "ernie4_5-moe")
            f.layer_tensors = with_probs_bias;
        ScratchDir d;
        EXPECT_NO_THROW(gguf_spec(d, f)) << arch;
    }
}

TEST(GgufArchs, RoutingMetadataTheFamilyCannotServe) {
    ScratchDir dir;
    auto refuse = [&](File f, std::initializer_list<std::string> parts, ft_status st = FT_ERR_UNSUPPORTED) {
        GgufFile g(write(dir, f));
        expect_error([&] { read_gguf_config(g); }, st, parts);
    };
    File f{"deepseek2"};
    f.keys = u32("expert_gating_func", 3);
    refuse(f, {"deepseek2.expert_gating_func", "= 3", "1 softmax, 2 sigmoid"});
    f.keys = u32("expert_gating_func", 7);
    refuse(f, {"deepseek2.expert_gating_func", "= 7"});
    // A fixed-rule family whose file claims another gating function.
    File q{"qwen3moe"};
    q.keys = u32("expert_gating_func", 2);
    refuse(q, {"qwen3moe.expert_gating_func", "= 2", "sigmoid", "softmax"});
    File go{"gpt-oss"};
    go.keys = u32("expert_gating_func", 1);
    refuse(go, {"gpt-oss.expert_gating_func", "= 1", "softmax over the selected logits"});
    // A gating value that agrees with the family's rule is accepted.
    {
        File e{"ernie4_5-moe"};
        e.keys = u32("expert_gating_func", 1);
        e.layer_tensors = with_probs_bias;
        EXPECT_EQ(gguf_spec(dir, e).routing.rule, FT_ROUTING_SOFTMAX_BIASED_TOPK);
        File l4{"llama4"};
        l4.top_k = 1;
        l4.keys = u32("expert_gating_func", 2);
        EXPECT_EQ(gguf_spec(dir, l4).routing.rule, FT_ROUTING_TOPK_SIGMOID);
        File g3{"gpt-oss"};
        g3.keys = u32("expert_gating_func", 3);
        EXPECT_EQ(gguf_spec(dir, g3).routing.rule, FT_ROUTING_TOPK_SOFTMAX);
    }
    // Rules without group limits or scaling.
    File o{"gpt-oss"};
    o.keys = [](GgufWriter &w, const std::string &a) {
        w.kv_u32(a + "expert_group_count", 4);
        w.kv_u32(a + "expert_group_used_count", 2);
    };
    refuse(o, {"gpt-oss.expert_group_count", "= 4"});
    File l{"llama4"};
    l.top_k = 1;
    l.keys = [](GgufWriter &w, const std::string &a) { w.kv_f32(a + "expert_weights_scale", 2.0f); };
    refuse(l, {"llama4.expert_weights_scale", "top-k sigmoid"});
    // Llama-4's input-scaled routes are served for bf16 experts only.
    File lq{"llama4"};
    lq.top_k = 1;
    lq.q4 = true;
    refuse(lq, {"llama4", "bf16", "q4_0"});
    // PhiMoE's sparsemixer takes exactly two experts.
    File p{"phimoe"};
    p.top_k = 4;
    refuse(p, {"phimoe.expert_used_count", "exactly 2"});
    // Malformed group metadata and MTP counts: format errors naming the key.
    File d{"deepseek2"};
    d.keys = [](GgufWriter &w, const std::string &a) {
        w.kv_u32(a + "expert_gating_func", 2);
        w.kv_u32(a + "expert_group_count", 3);
        w.kv_u32(a + "expert_group_used_count", 2);
    };
    refuse(d, {"deepseek2.expert_group_count", "= 3", "8 experts"}, FT_ERR_FORMAT);
    File n{"glm4moe"};
    n.keys = u32("nextn_predict_layers", 4);
    refuse(n, {"glm4moe.nextn_predict_layers", "= 4"}, FT_ERR_FORMAT);
    File s{"qwen3moe"};
    s.keys = [](GgufWriter &w, const std::string &a) { w.kv_f32(a + "expert_weights_scale", -1.0f); };
    refuse(s, {"qwen3moe.expert_weights_scale"}, FT_ERR_FORMAT);
}

// ---- router biases reach LayerExtras::router_bias ---------------------------------------------

std::vector<float> random_values(std::mt19937_64 &rng, size_t n) {
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (float &x : v) x = d(rng);
    return v;
}

TEST(GgufArchs, RouterBiasesLoad) {
    const uint64_t seed = test::fresh_seed("test_gguf_archs");
    std::mt19937_64 rng(seed);
    ScratchDir dir;
    std::map<int, std::vector<float>> bias;
    for (int l : {0, 1, 2, 3}) bias[l] = random_values(rng, E);

    // deepseek2 (sigmoid): exp_probs_b [E].
    File ds{"deepseek2"};
    ds.keys = u32("expert_gating_func", 2);
    ds.layer_tensors = [&](GgufWriter &w, int l) {
        w.tensor("blk." + std::to_string(l) + ".exp_probs_b.bias", {E}, kF32, f32_bytes(bias[l]));
    };
    // ERNIE: exp_probs_b as [E, 1] (the model's [1, E] moe_statics), read as [E].
    File er{"ernie4_5-moe"};
    er.layer_tensors = [&](GgufWriter &w, int l) {
        w.tensor("blk." + std::to_string(l) + ".exp_probs_b.bias", {E, 1}, kF32, f32_bytes(bias[l]));
    };
    // gpt-oss: the router linear's bias ffn_gate_inp.bias.
    File go{"gpt-oss"};
    go.layer_tensors = [&](GgufWriter &w, int l) {
        w.tensor("blk." + std::to_string(l) + ".ffn_gate_inp.bias", {E}, kF32, f32_bytes(bias[l]));
    };
    for (const File &f : {ds, er, go}) {
        SCOPED_TRACE(f.arch);
        const auto model = load_checkpoint(write(dir, f));
        for (int l = 0; l < 4; ++l) {
            const Tensor &t = model->extras(l).router_bias;
            ASSERT_EQ(t.dtype, FT_DTYPE_F32);
            ASSERT_EQ(t.shape, (std::vector<int64_t>{static_cast<int64_t>(E)}));
            ASSERT_EQ(t.bytes.size(), E * 4);
            std::vector<float> got(E);
            std::memcpy(got.data(), t.bytes.data(), E * 4);
            EXPECT_EQ(got, bias[l]) << "layer " << l;
        }
    }
    // The biased rules need their correction bias; gpt-oss needs its router bias.
    File er_missing{"ernie4_5-moe"};
    expect_error([&] { load_checkpoint(write(dir, er_missing)); }, FT_ERR_FORMAT, {"blk.0.exp_probs_b.bias", "missing"});
    File go_missing{"gpt-oss"};
    expect_error([&] { load_checkpoint(write(dir, go_missing)); }, FT_ERR_FORMAT, {"blk.0.ffn_gate_inp.bias", "missing"});
}

}  // namespace
}  // namespace ft
