// config.json -> ModelSpec for the architectures beyond Qwen3/Mixtral/DeepSeek-V3/GLM: each
// family's routing rule, shared expert and MoE layer selection under transformers' field names,
// nested text towers, and the refusal of unsupported model types.
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

json base(const char *model_type) {
    return {{"model_type", model_type}, {"hidden_size", 64}, {"num_hidden_layers", 4}, {"num_experts_per_tok", 2},
            {"hidden_act", "silu"}};
}

TEST(ConfigArchs, Qwen2MoeSoftmaxWithoutRenormAndGatedSharedExpert) {
    ScratchDir dir;
    json c = base("qwen2_moe");
    c["num_experts"] = 8;
    c["moe_intermediate_size"] = 16;
    c["shared_expert_intermediate_size"] = 40;
    ModelSpec s = read(c, dir);
    EXPECT_EQ(s.architecture, "qwen2_moe");
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_TOPK);  // norm_topk_prob defaults to false
    EXPECT_EQ(s.shared_intermediate, 40);
    EXPECT_TRUE(s.shared_expert_gate);
    EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{0, 1, 2, 3}));
    c["norm_topk_prob"] = true;
    c["mlp_only_layers"] = {0, 2};
    s = read(c, dir);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_TOPK_RENORM);
    EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{1, 3}));
}

TEST(ConfigArchs, Qwen3MoeUnderTransformers5FieldName) {
    ScratchDir dir;
    json c = base("qwen3_moe");
    c["num_local_experts"] = 12;
    c["moe_intermediate_size"] = 16;
    EXPECT_EQ(read(c, dir).num_experts, 12);
}

TEST(ConfigArchs, Qwen3NextRenormalisesByDefault) {
    ScratchDir dir;
    json c = base("qwen3_next");
    c["num_experts"] = 8;
    c["moe_intermediate_size"] = 16;
    c["shared_expert_intermediate_size"] = 16;
    ModelSpec s = read(c, dir);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_TOPK_RENORM);
    EXPECT_TRUE(s.shared_expert_gate);
}

TEST(ConfigArchs, TextTowersOfMultimodalReleases) {
    ScratchDir dir;
    json text = base("qwen3_vl_moe_text");
    text["num_experts"] = 8;
    text["moe_intermediate_size"] = 16;
    json c = {{"model_type", "qwen3_vl_moe"}, {"text_config", text}, {"vision_config", {{"depth", 2}}}};
    ModelSpec s = read(c, dir);
    EXPECT_EQ(s.architecture, "qwen3_vl_moe");
    EXPECT_EQ(s.num_experts, 8);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_TOPK_RENORM);
    // The text tower saved alone carries its own model_type.
    EXPECT_EQ(read(text, dir).architecture, "qwen3_vl_moe");

    json glm = base("glm4v_moe_text");
    glm["n_routed_experts"] = 8;
    glm["moe_intermediate_size"] = 16;
    s = read({{"model_type", "glm4v_moe"}, {"text_config", glm}}, dir);
    EXPECT_EQ(s.architecture, "glm4v_moe");
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SIGMOID_GROUP_TOPK);
    EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{1, 2, 3}));  // first_k_dense_replace defaults to 1
    EXPECT_EQ(s.shared_intermediate, 16);
}

TEST(ConfigArchs, Llama4TopOneSigmoidOnTheInputWithSharedExpert) {
    ScratchDir dir;
    json text = base("llama4_text");
    text["num_experts_per_tok"] = 1;
    text["num_local_experts"] = 8;
    text["intermediate_size"] = 24;
    text["intermediate_size_mlp"] = 48;
    text["interleave_moe_layer_step"] = 2;
    ModelSpec s = read({{"model_type", "llama4"}, {"text_config", text}}, dir);
    EXPECT_EQ(s.architecture, "llama4");
    EXPECT_EQ(s.routing.rule, FT_ROUTING_TOPK_SIGMOID);
    EXPECT_EQ(s.route_weight, FT_ROUTE_WEIGHT_INPUT);
    EXPECT_EQ(s.shared_intermediate, 24);
    EXPECT_FALSE(s.shared_expert_gate);
    EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{1, 3}));
    text["moe_layers"] = {0, 2, 3};  // an explicit list wins
    EXPECT_EQ(read(text, dir).moe_layers, (std::vector<int32_t>{0, 2, 3}));
}

TEST(ConfigArchs, DeepseekV2GreedyAndGroupLimited) {
    ScratchDir dir;
    json c = base("deepseek_v2");
    c["n_routed_experts"] = 8;
    c["moe_intermediate_size"] = 16;
    c["first_k_dense_replace"] = 1;
    c["n_shared_experts"] = 2;
    c["routed_scaling_factor"] = 16.0;
    ModelSpec s = read(c, dir);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_GROUP_TOPK);
    EXPECT_EQ(s.routing.num_groups, 1);
    EXPECT_FALSE(s.routing.renormalize);
    EXPECT_FLOAT_EQ(s.routing.routed_scaling_factor, 16.0f);
    EXPECT_EQ(s.shared_intermediate, 32);
    EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{1, 2, 3}));
    c["topk_method"] = "group_limited_greedy";
    c["n_group"] = 4;
    c["topk_group"] = 2;
    s = read(c, dir);
    EXPECT_EQ(s.routing.num_groups, 4);
    EXPECT_EQ(s.routing.topk_groups, 2);
    c["topk_method"] = "noaux_tc";
    expect_error([&] { read(c, dir); }, FT_ERR_UNSUPPORTED, {"topk_method", "noaux_tc"});
}

TEST(ConfigArchs, OlmoeGraniteAndPhimoe) {
    ScratchDir dir;
    json c = base("olmoe");
    c["num_experts"] = 8;
    c["intermediate_size"] = 16;
    EXPECT_EQ(read(c, dir).routing.rule, FT_ROUTING_SOFTMAX_TOPK);

    c = base("granitemoeshared");
    c["num_local_experts"] = 8;
    c["intermediate_size"] = 16;
    c["shared_intermediate_size"] = 24;
    ModelSpec s = read(c, dir);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_TOPK_SOFTMAX);
    EXPECT_EQ(s.shared_intermediate, 24);
    EXPECT_FALSE(s.shared_expert_gate);

    c = base("phimoe");
    c["num_local_experts"] = 8;
    c["intermediate_size"] = 16;
    c["router_jitter_noise"] = 0.05;
    s = read(c, dir);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SPARSEMIXER);
    EXPECT_FLOAT_EQ(s.routing.jitter_eps, 0.05f);
    c["num_experts_per_tok"] = 3;
    expect_error([&] { read(c, dir); }, FT_ERR_FORMAT, {"SPARSEMIXER", "2"});
}

TEST(ConfigArchs, ErnieLayerRangeBiasedSoftmaxAndSharedExperts) {
    ScratchDir dir;
    json c = base("ernie4_5_moe");
    c.erase("num_experts_per_tok");
    c["moe_k"] = 2;
    c["moe_num_experts"] = 8;
    c["moe_intermediate_size"] = 16;
    c["moe_num_shared_experts"] = 2;
    c["num_hidden_layers"] = 6;
    c["moe_layer_start_index"] = 1;
    c["moe_layer_end_index"] = 4;
    c["moe_layer_interval"] = 2;
    ModelSpec s = read(c, dir);
    EXPECT_EQ(s.top_k, 2);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_BIASED_TOPK);
    EXPECT_EQ(s.shared_intermediate, 32);
    EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{1, 3}));  // (l + 1) % 2 == 0 within [1, 4]
    c["moe_layer_end_index"] = -1;                            // to the last layer
    c["moe_layer_interval"] = 1;
    EXPECT_EQ(read(c, dir).moe_layers, (std::vector<int32_t>{1, 2, 3, 4, 5}));
    c["use_bias"] = true;
    expect_error([&] { read(c, dir); }, FT_ERR_UNSUPPORTED, {"use_bias"});
}

TEST(ConfigArchs, HunyuanPerLayerListsMustBeUniform) {
    ScratchDir dir;
    json c = base("hunyuan_v1_moe");
    c.erase("num_experts_per_tok");
    c["moe_topk"] = {2, 2, 2, 2};
    c["num_experts"] = 8;
    c["intermediate_size"] = 16;
    ModelSpec s = read(c, dir);
    EXPECT_EQ(s.top_k, 2);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SOFTMAX_TOPK_RENORM);
    EXPECT_EQ(s.shared_intermediate, 16);
    c["moe_topk"] = 1;
    EXPECT_EQ(read(c, dir).routing.rule, FT_ROUTING_SOFTMAX_TOPK_RENORM);  // a top-1 route weighs 1
    c["num_experts"] = {8, 8, 16, 8};
    expect_error([&] { read(c, dir); }, FT_ERR_UNSUPPORTED, {"num_experts", "differs between layers"});
}

TEST(ConfigArchs, MinimaxM2AndDots1UseTheBiasedSigmoidRule) {
    ScratchDir dir;
    json c = base("minimax_m2");
    c["num_local_experts"] = 8;
    c["intermediate_size"] = 16;
    ModelSpec s = read(c, dir);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SIGMOID_GROUP_TOPK);
    EXPECT_TRUE(s.routing.renormalize);
    EXPECT_EQ(s.routing.num_groups, 1);

    c = base("dots1");
    c["n_routed_experts"] = 8;
    c["moe_intermediate_size"] = 16;
    s = read(c, dir);
    EXPECT_EQ(s.routing.rule, FT_ROUTING_SIGMOID_GROUP_TOPK);
    EXPECT_FALSE(s.routing.renormalize);  // Dots1Config's norm_topk_prob defaults to false
    EXPECT_EQ(s.moe_layers, (std::vector<int32_t>{0, 1, 2, 3}));
    EXPECT_EQ(s.shared_intermediate, 0);
}

TEST(ConfigArchs, UnsupportedModelTypeNamesItAndTheSupportedOnes) {
    ScratchDir dir;
    json c = base("switch_transformers");
    c["num_experts"] = 8;
    expect_error([&] { read(c, dir); }, FT_ERR_UNSUPPORTED,
                 {"'switch_transformers'", "qwen2_moe", "llama4", "deepseek_v2", "gpt_oss"});
    const std::vector<std::string> all = supported_model_types();
    EXPECT_NE(std::find(all.begin(), all.end(), "ernie4_5_moe"), all.end());
    EXPECT_EQ(std::find(all.begin(), all.end(), "switch_transformers"), all.end());
}

}  // namespace
}  // namespace ft
