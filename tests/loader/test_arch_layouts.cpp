// The tensor layouts of the newer architectures, written tensor by tensor as transformers saves
// them, loaded and compared value for value: bf16 gpt-oss (interleaved gate/up, biases),
// GraniteMoE (input_linear / output_linear, router.layer, layer-level shared_mlp), Llama-4
// (feed_forward, transposed fused experts, shared_expert, text tower prefix), ERNIE-4.5
// (moe_statics correction bias [1, E]) and Hunyuan (gate.wg, shared_mlp).
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "ft/common.hpp"
#include "ft/loader.hpp"
#include "ft/synth.hpp"
#include "scratch_files.hpp"

namespace ft {
namespace {

using nlohmann::json;
using test::expect_error;
using test::ScratchDir;

// Random values that bf16 represents exactly, stored as F32 (the loader rounds to bf16: exact).
struct Values {
    std::mt19937 rng{11};
    std::vector<float> draw(size_t n) {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> v(n);
        for (float &x : v) x = bf16_to_f32(f32_to_bf16(nd(rng)));
        return v;
    }
};

synth::RawTensor f32(const std::string &name, std::vector<int64_t> shape, const std::vector<float> &v) {
    synth::RawTensor t{name, "F32", std::move(shape), std::vector<uint8_t>(v.size() * 4)};
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    return t;
}

float bank_value(const uint16_t *p, size_t i) { return bf16_to_f32(p[i]); }

float extra_f32(const Tensor &t, size_t i) {
    EXPECT_EQ(t.dtype, FT_DTYPE_F32);
    float v;
    std::memcpy(&v, t.bytes.data() + i * 4, 4);
    return v;
}

float extra_bf16(const Tensor &t, size_t i) {
    EXPECT_EQ(t.dtype, FT_DTYPE_BF16);
    uint16_t v;
    std::memcpy(&v, t.bytes.data() + i * 2, 2);
    return bf16_to_f32(v);
}

constexpr int64_t E = 4, H = 32, I = 8;

TEST(ArchLayouts, GptOssBf16InterleavedWithBiases) {
    ScratchDir dir;
    test::write_file(dir / "config.json",
                     json{{"model_type", "gpt_oss"}, {"hidden_size", H}, {"num_hidden_layers", 1},
                          {"num_local_experts", E}, {"num_experts_per_tok", 2}, {"intermediate_size", I},
                          {"swiglu_limit", 7.0}}.dump());
    Values val;
    const auto gu = val.draw(E * H * 2 * I), gub = val.draw(E * 2 * I), dn = val.draw(E * I * H), dnb = val.draw(E * H),
               router = val.draw(E * H), rb = val.draw(E);
    const std::string p = "model.layers.0.mlp.";
    synth::write_safetensors(dir / "model.safetensors",
                             {f32(p + "experts.gate_up_proj", {E, H, 2 * I}, gu),
                              f32(p + "experts.gate_up_proj_bias", {E, 2 * I}, gub),
                              f32(p + "experts.down_proj", {E, I, H}, dn), f32(p + "experts.down_proj_bias", {E, H}, dnb),
                              f32(p + "router.weight", {E, H}, router), f32(p + "router.bias", {E}, rb)});
    const auto m = load_checkpoint(dir.path());
    const ModelSpec &s = m->spec();
    EXPECT_EQ(s.format, Format::bf16);
    EXPECT_TRUE(s.expert_biases);
    EXPECT_EQ(s.activation, FT_ACT_SWIGLU_CLAMP);
    const LayerExtras &x = m->extras(0);
    for (int64_t e = 0; e < E; ++e) {
        for (int64_t i = 0; i < I; ++i) {
            for (int64_t h = 0; h < H; ++h) {
                // Column 2i of gate_up is gate unit i, column 2i + 1 up unit i.
                ASSERT_EQ(bank_value(m->gate(0, int(e)), i * H + h), gu[(e * H + h) * 2 * I + 2 * i]);
                ASSERT_EQ(bank_value(m->up(0, int(e)), i * H + h), gu[(e * H + h) * 2 * I + 2 * i + 1]);
                ASSERT_EQ(bank_value(m->down(0, int(e)), h * I + i), dn[(e * I + i) * H + h]);
            }
            EXPECT_EQ(extra_f32(x.expert_gate_up_bias, e * 2 * I + i), gub[e * 2 * I + 2 * i]);
            EXPECT_EQ(extra_f32(x.expert_gate_up_bias, e * 2 * I + I + i), gub[e * 2 * I + 2 * i + 1]);
        }
        for (int64_t h = 0; h < H; ++h) EXPECT_EQ(extra_f32(x.expert_down_bias, e * H + h), dnb[e * H + h]);
    }
    EXPECT_EQ(x.router_bias.shape, (std::vector<int64_t>{E}));
    EXPECT_EQ(extra_f32(x.router_bias, 3), rb[3]);
}

TEST(ArchLayouts, GptOssBf16WithoutItsBiasesIsRefused) {
    ScratchDir dir;
    test::write_file(dir / "config.json",
                     json{{"model_type", "gpt_oss"}, {"hidden_size", H}, {"num_hidden_layers", 1},
                          {"num_local_experts", E}, {"num_experts_per_tok", 2}, {"intermediate_size", I}}.dump());
    Values val;
    const std::string p = "model.layers.0.mlp.";
    synth::write_safetensors(dir / "model.safetensors",
                             {f32(p + "experts.gate_up_proj", {E, H, 2 * I}, val.draw(E * H * 2 * I)),
                              f32(p + "experts.down_proj", {E, I, H}, val.draw(E * I * H)),
                              f32(p + "router.weight", {E, H}, val.draw(E * H)), f32(p + "router.bias", {E}, val.draw(E))});
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"gate_up_proj_bias"});
}

TEST(ArchLayouts, GraniteMoeSharedFusedLinearsAndLayerSharedMlp) {
    ScratchDir dir;
    const int64_t Is = 12;
    test::write_file(dir / "config.json",
                     json{{"model_type", "granitemoeshared"}, {"hidden_size", H}, {"num_hidden_layers", 1},
                          {"num_local_experts", E}, {"num_experts_per_tok", 2}, {"intermediate_size", I},
                          {"shared_intermediate_size", Is}}.dump());
    Values val;
    const auto in = val.draw(E * 2 * I * H), out = val.draw(E * H * I), router = val.draw(E * H),
               sin = val.draw(2 * Is * H), sout = val.draw(H * Is);
    const std::string l = "model.layers.0.";
    synth::write_safetensors(dir / "model.safetensors",
                             {f32(l + "block_sparse_moe.input_linear.weight", {E, 2 * I, H}, in),
                              f32(l + "block_sparse_moe.output_linear.weight", {E, H, I}, out),
                              f32(l + "block_sparse_moe.router.layer.weight", {E, H}, router),
                              f32(l + "shared_mlp.input_linear.weight", {2 * Is, H}, sin),
                              f32(l + "shared_mlp.output_linear.weight", {H, Is}, sout)});
    const auto m = load_checkpoint(dir.path());
    EXPECT_EQ(m->spec().routing.rule, FT_ROUTING_TOPK_SOFTMAX);
    for (int64_t e = 0; e < E; ++e)
        for (int64_t i = 0; i < I * H; ++i) {
            ASSERT_EQ(bank_value(m->gate(0, int(e)), i), in[e * 2 * I * H + i]);
            ASSERT_EQ(bank_value(m->up(0, int(e)), i), in[e * 2 * I * H + I * H + i]);
            ASSERT_EQ(bank_value(m->down(0, int(e)), i), out[e * H * I + i]);
        }
    const LayerExtras &x = m->extras(0);
    EXPECT_EQ(extra_f32(x.router_weight, 5), router[5]);  // an F32 router stays F32
    EXPECT_EQ(x.shared_gate.shape, (std::vector<int64_t>{Is, H}));
    for (int64_t i = 0; i < Is * H; ++i) {
        ASSERT_EQ(extra_bf16(x.shared_gate, i), sin[i]);
        ASSERT_EQ(extra_bf16(x.shared_up, i), sin[Is * H + i]);
        ASSERT_EQ(extra_bf16(x.shared_down, i), sout[i]);
    }
}

TEST(ArchLayouts, Llama4TextTowerTransposedExpertsAndSharedExpert) {
    ScratchDir dir;
    json text = {{"model_type", "llama4_text"}, {"hidden_size", H}, {"num_hidden_layers", 2}, {"num_local_experts", E},
                 {"num_experts_per_tok", 1}, {"intermediate_size", I}, {"intermediate_size_mlp", 24},
                 {"interleave_moe_layer_step", 2}};
    test::write_file(dir / "config.json", json{{"model_type", "llama4"}, {"text_config", text}}.dump());
    Values val;
    const auto gu = val.draw(E * H * 2 * I), dn = val.draw(E * I * H), router = val.draw(E * H), sg = val.draw(I * H),
               su = val.draw(I * H), sd = val.draw(H * I);
    const std::string p = "language_model.model.layers.1.feed_forward.";
    synth::write_safetensors(dir / "model.safetensors",
                             {f32(p + "experts.gate_up_proj", {E, H, 2 * I}, gu), f32(p + "experts.down_proj", {E, I, H}, dn),
                              f32(p + "router.weight", {E, H}, router),
                              f32(p + "shared_expert.gate_proj.weight", {I, H}, sg),
                              f32(p + "shared_expert.up_proj.weight", {I, H}, su),
                              f32(p + "shared_expert.down_proj.weight", {H, I}, sd),
                              f32("language_model.model.layers.0.feed_forward.gate_proj.weight", {24, H}, val.draw(24 * H))});
    const auto m = load_checkpoint(dir.path());
    EXPECT_EQ(m->spec().moe_layers, (std::vector<int32_t>{1}));
    EXPECT_EQ(m->spec().route_weight, FT_ROUTE_WEIGHT_INPUT);
    for (int64_t e = 0; e < E; ++e)
        for (int64_t i = 0; i < I; ++i)
            for (int64_t h = 0; h < H; ++h) {
                // Not interleaved: column i is gate unit i, column I + i up unit i.
                ASSERT_EQ(bank_value(m->gate(0, int(e)), i * H + h), gu[(e * H + h) * 2 * I + i]);
                ASSERT_EQ(bank_value(m->up(0, int(e)), i * H + h), gu[(e * H + h) * 2 * I + I + i]);
            }
    EXPECT_EQ(extra_bf16(m->extras(0).shared_up, 7), su[7]);
    EXPECT_TRUE(m->extras(0).router_bias.empty());
}

TEST(ArchLayouts, ErnieMoeStaticsBiasAndHunyuanGateWg) {
    ScratchDir dir;
    test::write_file(dir / "config.json",
                     json{{"model_type", "ernie4_5_moe"}, {"hidden_size", H}, {"num_hidden_layers", 2},
                          {"moe_num_experts", E}, {"moe_k", 2}, {"moe_intermediate_size", I},
                          {"moe_num_shared_experts", 1}, {"moe_layer_start_index", 1}}.dump());
    Values val;
    std::vector<synth::RawTensor> t;
    const std::string p = "model.layers.1.mlp.";
    for (int64_t e = 0; e < E; ++e) {
        const std::string x = p + "experts." + std::to_string(e) + ".";
        t.push_back(f32(x + "gate_proj.weight", {I, H}, val.draw(I * H)));
        t.push_back(f32(x + "up_proj.weight", {I, H}, val.draw(I * H)));
        t.push_back(f32(x + "down_proj.weight", {H, I}, val.draw(H * I)));
    }
    for (const char *n : {"gate_proj", "up_proj"}) t.push_back(f32(p + "shared_experts." + n + ".weight", {I, H}, val.draw(I * H)));
    t.push_back(f32(p + "shared_experts.down_proj.weight", {H, I}, val.draw(H * I)));
    t.push_back(f32(p + "gate.weight", {E, H}, val.draw(E * H)));
    const auto bias = val.draw(E);
    t.push_back(f32(p + "moe_statics.e_score_correction_bias", {1, E}, bias));
    synth::write_safetensors(dir / "model.safetensors", t);
    auto m = load_checkpoint(dir.path());
    EXPECT_EQ(m->spec().routing.rule, FT_ROUTING_SOFTMAX_BIASED_TOPK);
    EXPECT_EQ(m->extras(0).router_bias.shape, (std::vector<int64_t>{E}));
    EXPECT_EQ(extra_f32(m->extras(0).router_bias, 2), bias[2]);
    EXPECT_EQ(m->extras(0).shared_gate.shape, (std::vector<int64_t>{I, H}));

    // Hunyuan: the router is gate.wg, the shared MLP shared_mlp.
    ScratchDir hy;
    test::write_file(hy / "config.json",
                     json{{"model_type", "hunyuan_v1_moe"}, {"hidden_size", H}, {"num_hidden_layers", 1},
                          {"num_experts", E}, {"moe_topk", 1}, {"intermediate_size", I}}.dump());
    for (synth::RawTensor &r : t) {
        r.name.replace(0, std::string("model.layers.1.").size(), "model.layers.0.");
        const std::string from_shared = "mlp.shared_experts.", from_gate = "mlp.gate.weight";
        if (auto at = r.name.find(from_shared); at != std::string::npos) r.name.replace(at, from_shared.size(), "mlp.shared_mlp.");
        if (auto at = r.name.find(from_gate); at != std::string::npos) r.name.replace(at, from_gate.size(), "mlp.gate.wg.weight");
    }
    synth::write_safetensors(hy / "model.safetensors", t);
    m = load_checkpoint(hy.path());
    EXPECT_EQ(m->spec().routing.rule, FT_ROUTING_SOFTMAX_TOPK_RENORM);
    EXPECT_EQ(m->extras(0).shared_down.shape, (std::vector<int64_t>{H, I}));
    EXPECT_EQ(m->extras(0).router_weight.shape, (std::vector<int64_t>{E, H}));
    EXPECT_TRUE(m->extras(0).router_bias.empty());  // a correction bias the rule does not use is not loaded
}

}  // namespace
}  // namespace ft
