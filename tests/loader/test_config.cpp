// config.json -> ModelSpec: field mapping per architecture, defaults, and malformed configs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ft/loader.hpp"
#include "scratch_files.hpp"

namespace ft {
namespace {

using nlohmann::json;
using test::expect_error;
using test::ScratchDir;

ModelSpec read(const json &cfg, const ScratchDir &dir) {
    test::write_file(dir / "config.json", cfg.dump());
    return read_model_config(dir.path());
}

json qwen3() {
    return {{"model_type", "qwen3_moe"}, {"hidden_size", 128}, {"num_hidden_layers", 6}, {"num_experts", 16},
            {"num_experts_per_tok", 4}, {"moe_intermediate_size", 48}, {"norm_topk_prob", true},
            {"hidden_act", "silu"}};
}

json deepseek() {
    return {{"model_type", "deepseek_v3"}, {"hidden_size", 112}, {"num_hidden_layers", 5},
            {"n_routed_experts", 32}, {"num_experts_per_tok", 6}, {"moe_intermediate_size", 40},
            {"first_k_dense_replace", 1}, {"moe_layer_freq", 1}, {"n_group", 4}, {"topk_group", 2},
            {"routed_scaling_factor", 2.5}, {"norm_topk_prob", true}, {"n_shared_experts", 2},
            {"scoring_func", "sigmoid"}, {"hidden_act", "silu"}, {"num_nextn_predict_layers", 1}};
}

TEST(Config, Qwen3MoeLayerSelection) {
    ScratchDir dir;
    json c = qwen3();
    c["decoder_sparse_step"] = 2;
    c["mlp_only_layers"] = {3};
    ModelSpec s = read(c, dir);
    EXPECT_EQ(s.architecture, "qwen3_moe");
    EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{1, 5}));  // odd layers, minus mlp-only 3
    EXPECT_EQ(s.num_layers, 2);
    EXPECT_EQ(s.total_layers, 6);
    EXPECT_EQ(s.num_experts, 16);
    EXPECT_EQ(s.top_k, 4);
    EXPECT_EQ(s.hidden, 128);
    EXPECT_EQ(s.intermediate, 48);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_TOPK_RENORM);
    EXPECT_EQ(s.routing.num_experts, 16);
    EXPECT_EQ(s.routing.top_k, 4);
    EXPECT_EQ(s.shared_intermediate, 0);

    c = qwen3();
    c["norm_topk_prob"] = false;
    EXPECT_EQ(read(c, dir).routing.rule, FT_ROUTING_SOFTMAX_TOPK);
    c.erase("norm_topk_prob");  // transformers' Qwen3MoeConfig default is false
    EXPECT_EQ(read(c, dir).routing.rule, FT_ROUTING_SOFTMAX_TOPK);
}

TEST(Config, ExpertCountUnderEitherName) {
    // transformers 5 saves Qwen3-MoE's expert count as num_local_experts; older exports as num_experts.
    ScratchDir dir;
    json c = qwen3();
    c.erase("num_experts");
    c["num_local_experts"] = 24;
    EXPECT_EQ(read(c, dir).num_experts, 24);
    c.erase("num_local_experts");
    expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {"num_experts", "num_local_experts"});
}

TEST(Config, Activations) {
    ScratchDir dir;
    json c = qwen3();
    const std::pair<const char *, int> acts[] = {{"silu", FT_ACT_SILU}, {"swish", FT_ACT_SILU},
                                                  {"gelu", FT_ACT_GELU}, {"gelu_pytorch_tanh", FT_ACT_GELU_TANH},
                                                  {"gelu_tanh", FT_ACT_GELU_TANH}};
    for (auto [name, act] : acts) {
        c["hidden_act"] = name;
        EXPECT_EQ(read(c, dir).activation, act) << name;
    }
    c["hidden_act"] = "relu2";
    expect_error([&] { read(c, dir); }, FT_ERR_UNSUPPORTED, {"hidden_act", "relu2"});
}

TEST(Config, Qwen35NestedTextConfig) {
    ScratchDir dir;
    json text = qwen3();
    text["model_type"] = "qwen3_5_moe_text";
    text["shared_expert_intermediate_size"] = 64;
    text["norm_topk_prob"] = false;  // ignored: Qwen3.5 always renormalises
    json c = {{"model_type", "qwen3_5_moe"}, {"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
              {"text_config", text}, {"vision_config", {{"depth", 2}}}};
    ModelSpec s = read(c, dir);
    EXPECT_EQ(s.architecture, "qwen3_5_moe");
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_TOPK_RENORM);
    EXPECT_EQ(s.shared_intermediate, 64);
    EXPECT_TRUE(s.shared_expert_gate);
    EXPECT_EQ(s.num_layers, 6);
    EXPECT_EQ(s.hidden, 128);

    text.erase("shared_expert_intermediate_size");
    c["text_config"] = text;
    expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {"shared_expert_intermediate_size", "missing"});
}

TEST(Config, MixtralUsesIntermediateSize) {
    ScratchDir dir;
    json c = {{"model_type", "mixtral"}, {"hidden_size", 96}, {"intermediate_size", 80}, {"num_hidden_layers", 3},
              {"num_local_experts", 8}, {"num_experts_per_tok", 2}, {"hidden_act", "silu"}};
    ModelSpec s = read(c, dir);
    EXPECT_EQ(s.architecture, "mixtral");
    EXPECT_EQ(s.intermediate, 80);
    EXPECT_EQ(s.num_experts, 8);
    EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{0, 1, 2}));
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_TOPK_RENORM);
}

TEST(Config, DeepSeekV3Family) {
    ScratchDir dir;
    ModelSpec s = read(deepseek(), dir);
    EXPECT_EQ(s.architecture, "deepseek_v3");
    EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{1, 2, 3, 4}));  // the MTP layer (5) is not one
    EXPECT_EQ(s.total_layers, 5);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SIGMOID_GROUP_TOPK);
    EXPECT_EQ(s.routing.num_groups, 4);
    EXPECT_EQ(s.routing.topk_groups, 2);
    EXPECT_FLOAT_EQ(s.routing.routed_scaling_factor, 2.5f);
    EXPECT_TRUE(s.routing.renormalize);
    EXPECT_EQ(s.shared_intermediate, 80);
    EXPECT_FALSE(s.shared_expert_gate);

    json c = deepseek();
    c["moe_layer_freq"] = 2;
    c["norm_topk_prob"] = false;
    c["n_shared_experts"] = nullptr;
    s = read(c, dir);
    EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{2, 4}));
    EXPECT_FALSE(s.routing.renormalize);
    EXPECT_EQ(s.shared_intermediate, 40);  // null counts as absent: default 1 shared expert

    c = deepseek();
    c["model_type"] = "kimi_k2";
    c["n_group"] = 1;
    c["topk_group"] = 1;
    c["routed_scaling_factor"] = 2.827;
    c["n_shared_experts"] = 0;
    s = read(c, dir);
    EXPECT_EQ(s.architecture, "kimi_k2");
    EXPECT_EQ(s.routing.num_groups, 1);
    EXPECT_FLOAT_EQ(s.routing.routed_scaling_factor, 2.827f);
    EXPECT_EQ(s.shared_intermediate, 0);

    c = deepseek();
    c["scoring_func"] = "softmax";
    c["n_group"] = 1;
    c["topk_group"] = 1;
    c["routed_scaling_factor"] = 1.0;
    c["norm_topk_prob"] = false;
    EXPECT_EQ(read(c, dir).routing.rule, FT_ROUTING_SOFTMAX_TOPK);
    c["n_group"] = 4;
    expect_error([&] { read(c, dir); }, FT_ERR_UNSUPPORTED, {"softmax"});
    c["scoring_func"] = "sqrtsoftplus";
    expect_error([&] { read(c, dir); }, FT_ERR_UNSUPPORTED, {"scoring_func", "sqrtsoftplus"});
}

// DeepSeek-V4 under its own inference config's names: hash-routed layers counted among the MoE
// layers, the shared expert's width, and each score function's rule.
TEST(Config, DeepseekV4HashLayersSharedExpertAndScoreFunctions) {
    ScratchDir dir;
    json c = {{"model_type", "deepseek_v4"}, {"hidden_size", 256}, {"num_hidden_layers", 6},
              {"n_routed_experts", 16}, {"num_experts_per_tok", 4}, {"moe_inter_dim", 128},
              {"n_dense_layers", 1}, {"n_hash_layers", 3}, {"n_shared_experts", 2}, {"vocab_size", 1000},
              {"score_func", "sqrtsoftplus"}, {"route_scale", 1.5}, {"swiglu_limit", 10.0}};
    ModelSpec s = read(c, dir);
    EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{1, 2, 3, 4, 5}));
    EXPECT_EQ(s.hash_layers, 2);  // decoder layers 1 and 2; layer 0 is dense
    EXPECT_EQ(s.vocab_size, 1000);
    EXPECT_EQ(s.shared_intermediate, 256);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK);
    EXPECT_FLOAT_EQ(s.routing.routed_scaling_factor, 1.5f);
    EXPECT_FLOAT_EQ(s.swiglu_limit, 10.0f);
    c["score_func"] = "softmax";
    s = read(c, dir);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_BIASED_TOPK);
    EXPECT_FALSE(s.routing.renormalize);
    c["score_func"] = "sigmoid";
    EXPECT_EQ(read(c, dir).routing.rule, FT_ROUTING_SIGMOID_GROUP_TOPK);
    c["n_hash_layers"] = 1;  // only the dense layer: no MoE layer hashes
    s = read(c, dir);
    EXPECT_EQ(s.hash_layers, 0);
    EXPECT_EQ(s.vocab_size, 0);
    c["n_hash_layers"] = 2;
    c["vocab_size"] = 0;
    expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {"vocab_size"});
    c["vocab_size"] = 1000;
    c["n_hash_layers"] = -1;
    expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {"n_hash_layers"});
    c["n_hash_layers"] = 0;
    c["n_shared_experts"] = -1;
    expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {"n_shared_experts"});
}

TEST(Config, Glm4MoeDefaults) {
    ScratchDir dir;
    json c = {{"model_type", "glm4_moe"}, {"hidden_size", 64}, {"num_hidden_layers", 4}, {"n_routed_experts", 16},
              {"num_experts_per_tok", 4}, {"moe_intermediate_size", 24}, {"first_k_dense_replace", 2},
              {"n_shared_experts", 0}, {"routed_scaling_factor", 2.5}};
    ModelSpec s = read(c, dir);
    EXPECT_EQ(s.architecture, "glm4_moe");
    EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{2, 3}));
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SIGMOID_GROUP_TOPK);
    EXPECT_EQ(s.routing.num_groups, 1);
    EXPECT_TRUE(s.routing.renormalize);
    EXPECT_FLOAT_EQ(s.routing.routed_scaling_factor, 2.5f);
    EXPECT_EQ(s.shared_intermediate, 24);  // GLM always has at least one shared expert
    EXPECT_EQ(s.activation, FT_ACT_SILU);
}

TEST(Config, ArchitectureFromClassName) {
    ScratchDir dir;
    json c = qwen3();
    c.erase("model_type");
    c["architectures"] = {"Qwen3MoeForCausalLM"};
    EXPECT_EQ(read(c, dir).architecture, "qwen3_moe");
}

TEST(Config, RejectsMalformedConfigs) {
    ScratchDir dir;
    expect_error([&] { read_model_config(dir.path()); }, FT_ERR_IO, {"config.json"});

    test::write_file(dir / "config.json", "{\"model_type\": \"qwen3_moe\", ");
    expect_error([&] { read_model_config(dir.path()); }, FT_ERR_FORMAT, {"config.json", "not valid JSON"});
    test::write_file(dir / "config.json", "[1]");
    expect_error([&] { read_model_config(dir.path()); }, FT_ERR_FORMAT, {"not a JSON object"});

    json c = qwen3();
    c["model_type"] = "llama4_moe";
    expect_error([&] { read(c, dir); }, FT_ERR_UNSUPPORTED, {"model_type", "llama4_moe"});
    c.erase("model_type");
    expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {"model_type"});

    for (const char *field : {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "hidden_size",
                              "num_hidden_layers"}) {
        c = qwen3();
        c.erase(field);
        expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {field, "missing"});
        c[field] = "8";
        expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {field, "integer"});
        c[field] = 8.5;
        expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {field, "integer"});
    }
    c = qwen3();
    c["num_experts"] = 1ll << 40;
    expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {"num_experts", "out of range"});
    c = qwen3();
    c["norm_topk_prob"] = "yes";
    expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {"norm_topk_prob"});
    c = qwen3();
    c["mlp_only_layers"] = {"x"};
    expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {"mlp_only_layers"});
    c = qwen3();
    c["num_experts_per_tok"] = 17;  // top_k > num_experts: rejected by ModelSpec validation
    expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {"top_k"});
    c = qwen3();
    c["text_config"] = 3;
    expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {"text_config"});

    json d = deepseek();
    d["routed_scaling_factor"] = "2.5";
    expect_error([&] { read(d, dir); }, FT_ERR_FORMAT, {"routed_scaling_factor", "number"});
    d = deepseek();
    d["n_group"] = 5;  // does not divide 32 experts
    expect_error([&] { read(d, dir); }, FT_ERR_FORMAT, {"num_groups"});
    d = deepseek();
    d["first_k_dense_replace"] = 5;
    expect_error([&] { read(d, dir); }, FT_ERR_FORMAT, {"no MoE layers"});
}

}  // namespace
}  // namespace ft
