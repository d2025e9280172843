// Quantised checkpoints in the real layouts of their releases (block-FP8, ModelOpt NVFP4, gpt-oss
// MXFP4, DeepSeek-V4 FP4), written by ft_synth, loaded and compared byte for byte with the bank
// rows synth derives independently from what it wrote; and malformed variants, which must end
// in FT_ERR_FORMAT naming the tensor.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ft/dequant.hpp"
#include "ft/loader.hpp"
#include "ft/safetensors.hpp"
#include "ft/synth.hpp"
#include "scratch_files.hpp"

namespace ft {
namespace {

using synth::Spec;
using test::expect_error;
using test::ScratchDir;

uint64_t fresh_seed() {
    static uint64_t n = 0;
    return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) + 7919 * ++n;
}

struct QCase {
    const char *name;
    Spec spec;
    Format format;
    int32_t rule;
    int32_t activation;
};

void PrintTo(const QCase &c, std::ostream *os) { *os << c.name; }

std::vector<QCase> qcases() {
    std::vector<QCase> out;
    Spec s;
    s.architecture = "deepseek_v3";
    s.format = "fp8_block";
    s.hidden = 256;
    s.intermediate = 128;
    s.num_experts = 4;
    s.num_layers = 3;
    s.first_dense = 1;
    s.shared_intermediate = 128;
    s.mtp_layer = true;
    s.shards = 2;
    s.fp8_scale_dtype = "F32";
    out.push_back({"fp8_deepseek_v3_f32_scales", s, Format::fp8_block, FT_ROUTING_SIGMOID_GROUP_TOPK, FT_ACT_SILU});

    s = Spec{};
    s.architecture = "qwen3_5_moe";
    s.format = "fp8_block";
    s.language_model_prefix = true;
    s.hidden = 256;
    s.intermediate = 128;
    s.shared_intermediate = 256;
    s.num_experts = 3;
    s.fp8_scale_dtype = "BF16";
    out.push_back({"fp8_qwen3_5_bf16_scales", s, Format::fp8_block, FT_ROUTING_SOFTMAX_TOPK_RENORM, FT_ACT_SILU});

    s = Spec{};
    s.architecture = "glm4_moe";
    s.format = "nvfp4";
    s.hidden = 64;
    s.intermediate = 32;
    s.shared_intermediate = 32;
    s.first_dense = 1;
    s.num_layers = 3;
    s.mtp_layer = true;
    out.push_back({"nvfp4_glm_config", s, Format::nvfp4, FT_ROUTING_SIGMOID_GROUP_TOPK, FT_ACT_SILU});

    s = Spec{};
    s.format = "nvfp4";
    s.hidden = 96;
    s.intermediate = 48;
    s.hf_quant_config_file = true;
    s.shards = 3;
    out.push_back({"nvfp4_qwen3_hf_quant_config", s, Format::nvfp4, FT_ROUTING_SOFTMAX_TOPK_RENORM, FT_ACT_SILU});

    s = Spec{};
    s.architecture = "mixtral";
    s.format = "nvfp4";
    s.hidden = 64;
    s.intermediate = 16;
    s.declare_quantization = false;  // only the tensors say NVFP4
    out.push_back({"nvfp4_mixtral_undeclared", s, Format::nvfp4, FT_ROUTING_SOFTMAX_TOPK_RENORM, FT_ACT_SILU});

    s = Spec{};
    s.architecture = "gpt_oss";
    s.format = "mxfp4";
    s.hidden = 96;
    s.intermediate = 64;
    s.num_experts = 4;
    s.top_k = 2;
    s.shards = 2;
    out.push_back({"mxfp4_gpt_oss", s, Format::mxfp4, FT_ROUTING_TOPK_SOFTMAX, FT_ACT_SWIGLU_CLAMP});

    s = Spec{};
    s.architecture = "deepseek_v4";
    s.format = "ds_fp4";
    s.hidden = 256;
    s.intermediate = 128;
    s.num_experts = 4;
    s.num_layers = 3;
    s.first_dense = 1;
    s.mtp_layer = true;
    s.hash_layers = 2;  // decoder layers 0 (dense) and 1: MoE layer 0 routes by token id
    s.shared_intermediate = 256;
    out.push_back({"ds_fp4_deepseek_v4_e8m0", s, Format::ds_fp4, FT_ROUTING_SIGMOID_GROUP_TOPK, FT_ACT_SILU});

    s.e8m0_dtype = "U8";
    s.mtp_layer = false;
    s.first_dense = 0;
    s.num_layers = 2;
    s.hash_layers = 1;
    s.vocab_size = 40;
    s.tid2eid_dtype = "I64";
    s.shared_intermediate = 128;
    s.ds_shared_scale_dtype = "F32";
    out.push_back({"ds_fp4_deepseek_v4_u8_scales", s, Format::ds_fp4, FT_ROUTING_SIGMOID_GROUP_TOPK, FT_ACT_SILU});
    return out;
}

// Every bank row of every expert equals what synth says the loader must place there.
void expect_banks(const Model &m, const Spec &s) {
    const std::vector<BankSpec> schema = bank_schema(m.spec().format, s.hidden, s.intermediate);
    for (int l = 0; l < m.spec().num_layers; ++l) {
        for (int e = 0; e < s.num_experts; ++e) {
            for (int b = 0; b < static_cast<int>(schema.size()); ++b) {
                const std::vector<uint8_t> want = synth::bank_row(s, l, e, schema[b].name);
                ASSERT_EQ(want.size(), m.banks().row_bytes(b));
                ASSERT_EQ(std::memcmp(m.banks().row(b, l, e), want.data(), want.size()), 0)
                    << "layer " << l << " expert " << e << " bank " << schema[b].name;
            }
        }
    }
}

class QuantLoad : public ::testing::TestWithParam<QCase> {};

TEST_P(QuantLoad, BanksByteExact) {
    QCase c = GetParam();
    c.spec.seed = fresh_seed();
    const Spec &s = c.spec;
    ScratchDir dir;
    synth::write_checkpoint(dir.path(), s);
    LoadOptions opts;
    opts.io_threads = 3;
    std::vector<int> filled;
    std::mutex mu;
    opts.on_layer_filled = [&](int l) {
        std::lock_guard<std::mutex> lock(mu);
        filled.push_back(l);
    };
    auto model = load_checkpoint(dir.path(), opts);
    const ModelSpec &ms = model->spec();
    EXPECT_EQ(ms.format, c.format);
    EXPECT_EQ(ms.architecture, s.architecture);
    EXPECT_EQ(ms.hidden, s.hidden);
    EXPECT_EQ(ms.intermediate, s.intermediate);
    EXPECT_EQ(ms.routing.rule, c.rule);
    EXPECT_EQ(ms.activation, c.activation);
    const std::vector<int> moe = synth::moe_layers(s);
    ASSERT_EQ(ms.moe_layers, std::vector<int32_t>(moe.begin(), moe.end()));  // MTP layers skipped
    EXPECT_EQ(filled.size(), moe.size());
    expect_banks(*model, s);

    // The scalar reference over the loaded banks gives synth's dequantised weights.
    const std::vector<BankSpec> schema = bank_schema(ms.format, s.hidden, s.intermediate);
    const int l = ms.num_layers - 1, e = s.num_experts - 1;
    std::vector<const uint8_t *> rows;
    for (int b = 0; b < static_cast<int>(schema.size()); ++b) rows.push_back(model->banks().row(b, l, e));
    bool nonzero = false;
    for (int proj : {FT_PROJ_GATE, FT_PROJ_UP, FT_PROJ_DOWN}) {
        std::vector<float> got(static_cast<size_t>(s.hidden) * s.intermediate);
        dequant_projection(ms.format, rows.data(), s.hidden, s.intermediate, proj, got.data());
        const std::vector<float> want = synth::expert_dequant(s, l, e, proj);
        ASSERT_EQ(got, want) << "proj " << proj;
        for (float v : got) {
            ASSERT_TRUE(std::isfinite(v));
            nonzero |= v != 0.0f;
        }
        if (ms.format == Format::mxfp4) {
            std::vector<float> bias(proj == FT_PROJ_DOWN ? s.hidden : s.intermediate);
            ASSERT_TRUE(projection_bias(ms.format, rows.data(), s.hidden, s.intermediate, proj, bias.data()));
            EXPECT_EQ(bias, synth::expert_bias(s, l, e, proj));
        }
    }
    EXPECT_TRUE(nonzero);

    // Routers and shared experts beside the banks.
    for (int ml = 0; ml < ms.num_layers; ++ml) {
        const LayerExtras &x = model->extras(ml);
        const std::vector<float> router = synth::router_weight(s, ml);
        ASSERT_EQ(x.router_weight.dtype, FT_DTYPE_BF16);
        for (size_t i = 0; i < router.size(); ++i) {
            uint16_t v;
            std::memcpy(&v, x.router_weight.bytes.data() + 2 * i, 2);
            ASSERT_EQ(bf16_to_f32(v), router[i]);
        }
        const int hash_moe_layers = std::max(0, s.hash_layers - s.first_dense);
        const bool hashed = s.architecture == "deepseek_v4" && ml < hash_moe_layers;
        if (s.architecture == "deepseek_v4") {
            EXPECT_EQ(ms.hash_layers, hash_moe_layers);
            if (hashed) {
                // A hash-routed layer: its tid2eid as written, no correction bias.
                EXPECT_EQ(ms.vocab_size, s.vocab_size);
                EXPECT_EQ(x.tid2eid, synth::tid2eid(s, ml)) << "MoE layer " << ml;
                EXPECT_TRUE(x.router_bias.empty());
            } else {
                EXPECT_TRUE(x.tid2eid.empty());
            }
        }
        if (!hashed && (s.architecture == "gpt_oss" || s.architecture == "deepseek_v4" || s.architecture == "deepseek_v3")) {
            ASSERT_EQ(x.router_bias.dtype, FT_DTYPE_F32);
            std::vector<float> bias = synth::router_bias(s, ml);
            if (s.architecture == "gpt_oss") {  // written bf16, as gpt-oss ships it
                for (float &b : bias) b = bf16_to_f32(f32_to_bf16(b));
            }
            ASSERT_EQ(x.router_bias.bytes.size(), bias.size() * 4);
            EXPECT_EQ(std::memcmp(x.router_bias.bytes.data(), bias.data(), bias.size() * 4), 0);
        }
        if (s.shared_intermediate > 0) {
            EXPECT_EQ(ms.shared_intermediate, s.shared_intermediate);
            for (int proj : {FT_PROJ_GATE, FT_PROJ_UP, FT_PROJ_DOWN}) {
                const Tensor &t = proj == FT_PROJ_GATE ? x.shared_gate : proj == FT_PROJ_UP ? x.shared_up : x.shared_down;
                const std::vector<uint16_t> want = synth::shared_weight(s, ml, proj);
                ASSERT_EQ(t.bytes.size(), want.size() * 2);
                EXPECT_EQ(std::memcmp(t.bytes.data(), want.data(), t.bytes.size()), 0) << "shared proj " << proj;
            }
        }
    }
    if (s.architecture == "deepseek_v4") {
        EXPECT_EQ(ms.swiglu_limit, 7.0f);
    }
    if (s.architecture == "gpt_oss") {
        EXPECT_EQ(ms.swiglu_alpha, 1.702f);
        EXPECT_EQ(ms.swiglu_limit, 7.0f);
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantLoad, ::testing::ValuesIn(qcases()),
                         [](const ::testing::TestParamInfo<QCase> &i) { return std::string(i.param.name); });

// ---- malformed checkpoints -------------------------------------------------------------------

// Every tensor of a single-file checkpoint, to be edited and written back.
std::vector<synth::RawTensor> read_tensors(const std::string &path) {
    SafetensorsFile f(path);
    std::vector<synth::RawTensor> out;
    for (const std::string &n : f.names()) {
        const TensorInfo *t = f.find(n);
        out.push_back({n, st_dtype_name(t->dtype), t->shape, std::vector<uint8_t>(f.data(*t), f.data(*t) + t->nbytes())});
    }
    return out;
}

synth::RawTensor &tensor(std::vector<synth::RawTensor> &ts, const std::string &name) {
    for (synth::RawTensor &t : ts)
        if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
}

void remove_tensor(std::vector<synth::RawTensor> &ts, const std::string &name) {
    for (auto it = ts.begin(); it != ts.end(); ++it) {
        if (it->name == name) {
            ts.erase(it);
            return;
        }
    }
    throw std::runtime_error("no tensor " + name);
}

Spec small(const char *format, const char *arch) {
    Spec s;
    s.architecture = arch;
    s.format = format;
    s.hidden = 256;
    s.intermediate = 128;
    s.num_experts = 3;
    s.seed = fresh_seed();
    return s;
}

TEST(QuantMalformed, MissingWeightScale2) {
    ScratchDir dir;
    Spec s = small("nvfp4", "qwen3_moe");
    synth::write_checkpoint(dir.path(), s);
    auto ts = read_tensors(dir / "model.safetensors");
    remove_tensor(ts, "model.layers.1.mlp.experts.2.down_proj.weight_scale_2");
    synth::write_safetensors(dir / "model.safetensors", ts);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                 {"model.layers.1.mlp.experts.2.down_proj.weight_scale_2", "missing"});
}

TEST(QuantMalformed, Nvfp4ScaleShapeMismatch) {
    ScratchDir dir;
    Spec s = small("nvfp4", "qwen3_moe");
    synth::write_checkpoint(dir.path(), s);
    auto ts = read_tensors(dir / "model.safetensors");
    synth::RawTensor &t = tensor(ts, "model.layers.0.mlp.experts.1.up_proj.weight_scale");
    t.shape[1] -= 1;
    t.bytes.resize(static_cast<size_t>(t.shape[0] * t.shape[1]));
    synth::write_safetensors(dir / "model.safetensors", ts);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                 {"model.layers.0.mlp.experts.1.up_proj.weight_scale", "expected shape"});
}

TEST(QuantMalformed, OddKIsRejectedNotTruncated) {
    // H = 72 is not a whole number of 16-blocks: no partial last block, FT_ERR_FORMAT at load.
    ScratchDir dir;
    Spec s = small("nvfp4", "qwen3_moe");
    s.hidden = 72;
    s.intermediate = 32;
    synth::write_checkpoint(dir.path(), s);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                 {"model.layers.0.mlp.experts.0.gate_proj.weight", "multiple of 16", "72"});
}

TEST(QuantMalformed, Fp8MissingScaleInv) {
    ScratchDir dir;
    Spec s = small("fp8_block", "qwen3_moe");
    synth::write_checkpoint(dir.path(), s);
    auto ts = read_tensors(dir / "model.safetensors");
    remove_tensor(ts, "model.layers.1.mlp.experts.2.gate_proj.weight_scale_inv");
    synth::write_safetensors(dir / "model.safetensors", ts);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                 {"model.layers.1.mlp.experts.2.gate_proj.weight_scale_inv"});
    // Without the first expert's scales the weights are F8 with nothing to scale them.
    remove_tensor(ts, "model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv");
    synth::write_safetensors(dir / "model.safetensors", ts);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                 {"model.layers.0.mlp.experts.0.gate_proj.weight", "F8_E4M3"});
}

TEST(QuantMalformed, Fp8ScaleInvWrongShape) {
    ScratchDir dir;
    Spec s = small("fp8_block", "qwen3_moe");
    synth::write_checkpoint(dir.path(), s);
    auto ts = read_tensors(dir / "model.safetensors");
    synth::RawTensor &t = tensor(ts, "model.layers.0.mlp.experts.1.down_proj.weight_scale_inv");
    std::swap(t.shape[0], t.shape[1]);  // [H/128, I/128] written transposed
    synth::write_safetensors(dir / "model.safetensors", ts);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                 {"model.layers.0.mlp.experts.1.down_proj.weight_scale_inv", "expected shape [2, 1]"});
}

TEST(QuantMalformed, E8m0NanScaleRejected) {
    ScratchDir dir;
    Spec s = small("ds_fp4", "deepseek_v4");
    synth::write_checkpoint(dir.path(), s);
    auto ts = read_tensors(dir / "model.safetensors");
    synth::RawTensor &t = tensor(ts, "layers.1.ffn.experts.2.w3.scale");
    t.bytes[t.bytes.size() / 2] = 0xff;
    synth::write_safetensors(dir / "model.safetensors", ts);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"layers.1.ffn.experts.2.w3.scale", "255"});
}

// A DeepSeek-V4 checkpoint whose first MoE layer routes by token id, with an FP8 shared expert.
Spec hashed_v4() {
    Spec s = small("ds_fp4", "deepseek_v4");
    s.hash_layers = 1;
    s.vocab_size = 24;
    s.top_k = 2;
    s.shared_intermediate = 256;
    return s;
}

TEST(QuantMalformed, Tid2eidIdBeyondTheExperts) {
    ScratchDir dir;
    const Spec s = hashed_v4();
    synth::write_checkpoint(dir.path(), s);
    auto ts = read_tensors(dir / "model.safetensors");
    synth::RawTensor &t = tensor(ts, "layers.0.ffn.gate.tid2eid");
    const int32_t bad = s.num_experts;  // one past the last expert
    std::memcpy(t.bytes.data() + 4 * 7, &bad, 4);
    synth::write_safetensors(dir / "model.safetensors", ts);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                 {"layers.0.ffn.gate.tid2eid", "element 7", "expert id 3", "outside [0, 3)"});
}

TEST(QuantMalformed, Tid2eidNegativeI64Id) {
    ScratchDir dir;
    Spec s = hashed_v4();
    s.tid2eid_dtype = "I64";
    synth::write_checkpoint(dir.path(), s);
    auto ts = read_tensors(dir / "model.safetensors");
    synth::RawTensor &t = tensor(ts, "layers.0.ffn.gate.tid2eid");
    const int64_t bad = -1;
    std::memcpy(t.bytes.data() + 8 * 3, &bad, 8);
    synth::write_safetensors(dir / "model.safetensors", ts);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"layers.0.ffn.gate.tid2eid", "expert id -1"});
}

TEST(QuantMalformed, Tid2eidWrongShapeDtypeOrMissing) {
    ScratchDir dir;
    const Spec s = hashed_v4();
    synth::write_checkpoint(dir.path(), s);
    const auto ts = read_tensors(dir / "model.safetensors");
    {  // [K, vocab]: transposed
        auto bad = ts;
        synth::RawTensor &t = tensor(bad, "layers.0.ffn.gate.tid2eid");
        std::swap(t.shape[0], t.shape[1]);
        synth::write_safetensors(dir / "model.safetensors", bad);
        expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                     {"layers.0.ffn.gate.tid2eid", "expected shape [24, 2]"});
    }
    {  // one row short of the config's vocab_size
        auto bad = ts;
        synth::RawTensor &t = tensor(bad, "layers.0.ffn.gate.tid2eid");
        t.shape[0] -= 1;
        t.bytes.resize(t.bytes.size() - 4 * 2);
        synth::write_safetensors(dir / "model.safetensors", bad);
        expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                     {"layers.0.ffn.gate.tid2eid", "expected shape [24, 2]", "got [23, 2]"});
    }
    {  // float ids
        auto bad = ts;
        tensor(bad, "layers.0.ffn.gate.tid2eid").dtype = "F32";
        synth::write_safetensors(dir / "model.safetensors", bad);
        expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                     {"layers.0.ffn.gate.tid2eid", "dtype F32", "I32, I64"});
    }
    {
        auto bad = ts;
        remove_tensor(bad, "layers.0.ffn.gate.tid2eid");
        synth::write_safetensors(dir / "model.safetensors", bad);
        expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"layers.0.ffn.gate.tid2eid", "missing"});
    }
}

TEST(QuantMalformed, DeepseekV4SharedExpertScales) {
    ScratchDir dir;
    const Spec s = hashed_v4();
    synth::write_checkpoint(dir.path(), s);
    const auto ts = read_tensors(dir / "model.safetensors");
    {
        auto bad = ts;
        tensor(bad, "layers.1.ffn.shared_experts.w2.scale").bytes[1] = 0xff;
        synth::write_safetensors(dir / "model.safetensors", bad);
        expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                     {"layers.1.ffn.shared_experts.w2.weight", "255"});
    }
    {
        auto bad = ts;
        remove_tensor(bad, "layers.0.ffn.shared_experts.w3.scale");
        synth::write_safetensors(dir / "model.safetensors", bad);
        expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                     {"layers.0.ffn.shared_experts.w3.scale", "missing"});
    }
    {
        auto bad = ts;
        synth::RawTensor &t = tensor(bad, "layers.0.ffn.shared_experts.w1.scale");
        t.shape = {4, 1};  // the 2 x 2 tiles' scales as one column
        synth::write_safetensors(dir / "model.safetensors", bad);
        expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                     {"layers.0.ffn.shared_experts.w1.scale", "expected shape [2, 2]"});
    }
}

TEST(QuantMalformed, HashLayersNeedAValidVocab) {
    ScratchDir dir;
    const Spec s = hashed_v4();
    synth::write_checkpoint(dir.path(), s);
    const std::string cfg = dir / "config.json";
    nlohmann::json j = nlohmann::json::parse(std::ifstream(cfg));
    j["n_hash_layers"] = 9;  // more than the 2 decoder layers
    std::ofstream(cfg) << j.dump();
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"n_hash_layers", "9"});
    j["n_hash_layers"] = 1;
    j.erase("vocab_size");
    std::ofstream(cfg) << j.dump();
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"vocab_size"});
}

TEST(QuantMalformed, Mxfp4ScalesWrongShapeAndNan) {
    ScratchDir dir;
    Spec s = small("mxfp4", "gpt_oss");
    s.hidden = 64;
    s.intermediate = 32;
    synth::write_checkpoint(dir.path(), s);
    auto ts = read_tensors(dir / "model.safetensors");
    {
        auto bad = ts;
        synth::RawTensor &t = tensor(bad, "model.layers.1.mlp.experts.down_proj_scales");
        t.shape = {t.shape[0], t.shape[2], t.shape[1]};  // [E, K/32, N]: the bank's layout, not HF's
        synth::write_safetensors(dir / "model.safetensors", bad);
        expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                     {"model.layers.1.mlp.experts.down_proj_scales", "expected shape"});
    }
    tensor(ts, "model.layers.0.mlp.experts.gate_up_proj_scales").bytes[5] = 0xff;
    synth::write_safetensors(dir / "model.safetensors", ts);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                 {"model.layers.0.mlp.experts.gate_up_proj_scales", "255"});
}

TEST(QuantMalformed, DeclaredFormatMustMatchTensors) {
    ScratchDir dir;
    Spec s = small("nvfp4", "qwen3_moe");
    synth::write_checkpoint(dir.path(), s);
    nlohmann::json cfg = nlohmann::json::parse(test::read_file(dir / "config.json"));
    cfg["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
    test::write_file(dir / "config.json", cfg.dump());
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"fp8_block", "nvfp4", "weight_scale_2"});
    cfg["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}};
    test::write_file(dir / "config.json", cfg.dump());
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_UNSUPPORTED, {"weight_block_size"});
    cfg["quantization_config"] = {{"quant_method", "gptq"}};
    test::write_file(dir / "config.json", cfg.dump());
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_UNSUPPORTED, {"gptq"});
}

TEST(QuantMalformed, GlobalScaleNotScalar) {
    ScratchDir dir;
    Spec s = small("nvfp4", "qwen3_moe");
    synth::write_checkpoint(dir.path(), s);
    auto ts = read_tensors(dir / "model.safetensors");
    synth::RawTensor &t = tensor(ts, "model.layers.0.mlp.experts.0.up_proj.weight_scale_2");
    t.shape = {2};
    t.bytes.resize(8);
    synth::write_safetensors(dir / "model.safetensors", ts);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                 {"model.layers.0.mlp.experts.0.up_proj.weight_scale_2", "scalar"});
}

}  // namespace
}  // namespace ft
