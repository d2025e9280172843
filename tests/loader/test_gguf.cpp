// GGUF: the parser on generated files (metadata of every kind, alignment, tensor infos), hostile
// variants that must give FT_ERR_FORMAT naming the field or tensor (never a crash or a huge
// allocation), and MoE models in Q4_0 / bf16 / f16 / f32 loaded byte-exactly into the banks.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <cstring>
#include <random>

#include "ft/gguf.hpp"
#include "ft/loader.hpp"
#include "ft/synth.hpp"
#include "scratch_files.hpp"
#include "fresh_seed.hpp"

namespace ft {
namespace {

using synth::GgufWriter;
using synth::Spec;
using test::expect_error;
using test::ScratchDir;
using test::write_bytes;

// A new seed per synthetic checkpoint, all derived from one printed run seed (FT_TEST_SEED replays).
uint64_t fresh_seed() {
    static const uint64_t base = test::fresh_seed("test_gguf");
    static uint64_t n = 0;
    return base + 104729 * ++n;
}

Spec gguf_spec(const char *format) {
    Spec s;
    s.gguf = true;
    s.format = format;
    s.hidden = 64;
    s.intermediate = 32;
    s.num_experts = 4;
    s.top_k = 2;
    s.num_layers = 3;
    s.first_dense = 1;
    s.seed = fresh_seed();
    return s;
}

template <typename T>
void poke(std::vector<uint8_t> &b, uint64_t pos, T v) {
    std::memcpy(b.data() + pos, &v, sizeof v);
}

TEST(Gguf, ParsesGeneratedFile) {
    ScratchDir dir;
    Spec s = gguf_spec("q4_0");
    s.gguf_alignment = 64;
    synth::write_gguf(dir / "m.gguf", s);
    GgufFile g(dir / "m.gguf");
    EXPECT_EQ(g.version(), 3u);
    EXPECT_EQ(g.alignment(), 64u);
    EXPECT_EQ(g.data_offset() % 64, 0u);
    EXPECT_EQ(g.req_string("general.architecture"), "qwen3moe");
    EXPECT_EQ(g.req_uint("qwen3moe.expert_count"), 4u);
    EXPECT_EQ(g.opt_float("general.synthetic_f64", 0), 0.25);
    EXPECT_FALSE(g.opt_bool("missing.key", false));
    const GgufValue *tokens = g.find("tokenizer.ggml.tokens");
    ASSERT_NE(tokens, nullptr);
    EXPECT_EQ(tokens->type, GgufType::array);
    EXPECT_EQ(tokens->elem_type, GgufType::string);
    EXPECT_EQ(tokens->count, 5u);
    const GgufValue *scores = g.find("tokenizer.ggml.scores");
    ASSERT_NE(scores, nullptr);
    EXPECT_EQ(scores->count, 5u);
    float s3;
    std::memcpy(&s3, g.mapping() + scores->data_offset + 3 * 4, 4);
    EXPECT_EQ(s3, -2.0f);
    const GgufTensorInfo *down = g.find_tensor("blk.2.ffn_down_exps.weight");
    ASSERT_NE(down, nullptr);
    EXPECT_EQ(down->dims, (std::vector<uint64_t>{32, 64, 4}));
    EXPECT_EQ(down->type, ggml_type::Q4_0);
    EXPECT_EQ(down->nbytes, 4u * 64 * (32 / 32) * 18);
    for (const GgufTensorInfo &t : g.tensors()) EXPECT_EQ(t.file_offset % 64, 0u) << t.name;
    expect_error([&] { g.req_uint("general.architecture"); }, FT_ERR_FORMAT, {"general.architecture", "integer"});
    expect_error([&] { g.req_string("qwen3moe.nope"); }, FT_ERR_FORMAT, {"qwen3moe.nope", "missing"});
}

struct GCase {
    const char *name;
    const char *format;
    const char *dtype;  // expert_dtype for bf16 GGUF experts
    bool fused;
};

void PrintTo(const GCase &c, std::ostream *os) { *os << c.name; }

class GgufLoad : public ::testing::TestWithParam<GCase> {};

TEST_P(GgufLoad, BanksByteExact) {
    const GCase c = GetParam();
    ScratchDir dir;
    Spec s = gguf_spec(c.format);
    s.expert_dtype = c.dtype;
    s.gguf_fused_gate_up = c.fused;
    synth::write_gguf(dir / "model.gguf", s);
    auto model = load_checkpoint(dir / "model.gguf");
    const ModelSpec &ms = model->spec();
    EXPECT_EQ(ms.format, parse_format(c.format));
    EXPECT_EQ(ms.architecture, "qwen3_moe");
    EXPECT_EQ(ms.total_layers, 3);
    EXPECT_EQ(ms.moe_layers, (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(ms.hidden, 64);
    EXPECT_EQ(ms.intermediate, 32);
    EXPECT_EQ(ms.num_experts, 4);
    EXPECT_EQ(ms.top_k, 2);
    EXPECT_EQ(ms.routing.rule, FT_ROUTING_SOFTMAX_TOPK_RENORM);
    const std::vector<BankSpec> schema = bank_schema(ms.format, 64, 32);
    for (int l = 0; l < 2; ++l) {
        for (int e = 0; e < 4; ++e) {
            for (int b = 0; b < 2; ++b) {
                const std::vector<uint8_t> want = synth::bank_row(s, l, e, schema[b].name);
                ASSERT_EQ(std::memcmp(model->banks().row(b, l, e), want.data(), want.size()), 0)
                    << "layer " << l << " expert " << e << " bank " << schema[b].name;
            }
        }
        const std::vector<float> router = synth::router_weight(s, l);
        const Tensor &rw = model->extras(l).router_weight;
        ASSERT_EQ(rw.shape, (std::vector<int64_t>{4, 64}));
        for (size_t i = 0; i < router.size(); ++i) {
            uint16_t v;
            std::memcpy(&v, rw.bytes.data() + 2 * i, 2);
            ASSERT_EQ(bf16_to_f32(v), router[i]);
        }
    }
    // And through a directory holding just that one file.
    auto again = load_checkpoint(dir.path());
    EXPECT_EQ(std::memcmp(again->banks().row(0, 1, 3), model->banks().row(0, 1, 3), model->banks().row_bytes(0)), 0);
}

INSTANTIATE_TEST_SUITE_P(Types, GgufLoad,
                         ::testing::Values(GCase{"q4_0_separate", "q4_0", "BF16", false},
                                           GCase{"q4_0_fused", "q4_0", "BF16", true},
                                           GCase{"bf16", "bf16", "BF16", false},
                                           GCase{"f16_fused", "bf16", "F16", true},
                                           GCase{"f32", "bf16", "F32", false}),
                         [](const ::testing::TestParamInfo<GCase> &i) { return std::string(i.param.name); });

TEST(Gguf, ArchitectureDecidesActivationAndGating) {
    ScratchDir dir;
    Spec s = gguf_spec("q4_0");
    s.gguf_arch = "olmoe";
    s.norm_topk_prob = false;
    synth::write_gguf(dir / "g.gguf", s);
    GgufFile g(dir / "g.gguf");
    const ModelSpec ms = read_gguf_config(g);
    EXPECT_EQ(ms.activation, FT_ACT_SILU);
    EXPECT_EQ(ms.routing.rule, FT_ROUTING_SOFTMAX_TOPK);
    EXPECT_EQ(ms.architecture, "olmoe");
    // Gemma 4 scales each expert's output, which no routing rule applies: refused by name.
    s.gguf_arch = "gemma4";
    synth::write_gguf(dir / "g4.gguf", s);
    GgufFile g4(dir / "g4.gguf");
    expect_error([&] { read_gguf_config(g4); }, FT_ERR_UNSUPPORTED, {"gemma4", "scale"});
}

TEST(Gguf, DirectoryWithTwoFilesIsRefused) {
    ScratchDir dir;
    Spec s = gguf_spec("q4_0");
    synth::write_gguf(dir / "a.gguf", s);
    synth::write_gguf(dir / "b.gguf", s);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_UNSUPPORTED, {"a.gguf", "b.gguf"});
}

TEST(Gguf, ModelLevelErrors) {
    ScratchDir dir;
    // IQ2_XXS experts (ggml type 16): a valid file, a type FreeToken does not serve; named, with
    // the list of the types it does.
    GgufWriter w;
    w.kv_string("general.architecture", "qwen3moe");
    for (const char *k : {"block_count", "embedding_length", "expert_count", "expert_used_count", "expert_feed_forward_length"})
        w.kv_u32(std::string("qwen3moe.") + k, std::string(k) == "block_count" ? 1 : std::string(k) == "expert_used_count" ? 1 : 256);
    w.tensor("blk.0.ffn_gate_exps.weight", {256, 2, 2}, 16, std::vector<uint8_t>(2 * 2 * 66, 1));
    w.write(dir / "iq2.gguf");
    expect_error([&] { load_checkpoint(dir / "iq2.gguf"); }, FT_ERR_UNSUPPORTED,
                 {"blk.0.ffn_gate_exps.weight", "IQ2_XXS", "supported: Q4_0, Q8_0, Q2_K", "IQ4_XS, MXFP4, BF16"});

    // Expert dims that disagree with the metadata.
    Spec s = gguf_spec("q4_0");
    synth::write_gguf(dir / "m.gguf", s);
    std::vector<uint8_t> b;
    {
        GgufFile g(dir / "m.gguf");
        b.assign(g.mapping(), g.mapping() + g.file_size());
        // expert_feed_forward_length is the first u32 after its key; claim 64 instead of 32.
        const std::string key = "qwen3moe.expert_feed_forward_length";
        auto it = std::search(b.begin(), b.end(), key.begin(), key.end());
        ASSERT_NE(it, b.end());
        poke<uint32_t>(b, static_cast<uint64_t>(it - b.begin()) + key.size() + 4, 64);
    }
    write_bytes(dir / "m.gguf", b);
    expect_error([&] { load_checkpoint(dir / "m.gguf"); }, FT_ERR_FORMAT, {"blk.1.ffn_", "expected dims"});

    // Missing metadata key, named.
    GgufWriter w2;
    w2.kv_string("general.architecture", "deepseek2");
    w2.write(dir / "k.gguf");
    expect_error([&] { load_checkpoint(dir / "k.gguf"); }, FT_ERR_FORMAT, {"deepseek2.block_count", "missing"});
}

// ---- hostile files -----------------------------------------------------------------------------

// A small valid file: metadata of several kinds (an array included) and two tensors.
std::vector<uint8_t> base_file(GgufWriter::Layout *lay) {
    GgufWriter w;
    w.kv_string("general.architecture", "qwen3moe");
    w.kv_u32("qwen3moe.block_count", 1);
    w.kv_strings("tokenizer.ggml.tokens", {"a", "bc", "def"});
    w.kv_f32s("tokenizer.ggml.scores", {1.0f, 2.0f});
    w.tensor("first.weight", {32, 2}, ggml_type::Q4_0, std::vector<uint8_t>(2 * 2 * 18, 0x21));
    w.tensor("second.weight", {8, 4}, ggml_type::F32, std::vector<uint8_t>(8 * 4 * 4, 0x3c));
    return w.build(lay);
}

class GgufHostile : public ::testing::Test {
protected:
    void expect_format(const std::vector<uint8_t> &bytes, std::initializer_list<std::string> parts) {
        write_bytes(dir_ / "h.gguf", bytes);
        expect_error([&] { GgufFile g(dir_ / "h.gguf"); }, FT_ERR_FORMAT, parts);
    }
    ScratchDir dir_;
};

TEST_F(GgufHostile, BaseFileIsValid) {
    GgufWriter::Layout lay;
    write_bytes(dir_ / "ok.gguf", base_file(&lay));
    GgufFile g(dir_ / "ok.gguf");
    EXPECT_EQ(g.tensors().size(), 2u);
    EXPECT_EQ(g.find_tensor("second.weight")->nbytes, 128u);
}

TEST_F(GgufHostile, HeaderFields) {
    GgufWriter::Layout lay;
    const std::vector<uint8_t> base = base_file(&lay);
    auto b = base;
    b[0] = 'X';
    expect_format(b, {"magic"});
    b = base;
    poke<uint32_t>(b, 4, 2);
    expect_format(b, {"version 2"});
    b = base;
    poke<uint64_t>(b, 8, 1ull << 40);  // tensor count
    expect_format(b, {"tensor count"});
    b = base;
    poke<uint64_t>(b, 16, ~0ull);  // metadata count
    expect_format(b, {"metadata key/value count"});
    expect_format(std::vector<uint8_t>(base.begin(), base.begin() + 10), {"too short"});
}

TEST_F(GgufHostile, Metadata) {
    GgufWriter::Layout lay;
    const std::vector<uint8_t> base = base_file(&lay);
    auto b = base;
    poke<uint64_t>(b, lay.key_pos[1], 1ull << 40);  // key length past EOF (and past the cap)
    expect_format(b, {"metadata entry 1 key"});
    b = base;
    poke<uint64_t>(b, lay.key_pos[1], b.size());  // within the cap, past EOF
    expect_format(b, {"metadata entry 1 key"});
    b = base;
    const uint64_t type_pos = lay.key_pos[1] + 8 + std::string("qwen3moe.block_count").size();
    poke<uint32_t>(b, type_pos, 13);  // unknown value type
    expect_format(b, {"qwen3moe.block_count", "unknown value type 13"});
    // Arrays: element count past EOF, a string element's length past EOF, nested arrays.
    const uint64_t arr = lay.key_pos[2] + 8 + std::string("tokenizer.ggml.tokens").size() + 4;
    b = base;
    poke<uint64_t>(b, arr + 4, 1ull << 50);
    expect_format(b, {"tokenizer.ggml.tokens", "strings cannot fit"});
    b = base;
    poke<uint64_t>(b, arr + 12, 1ull << 33);  // length of element 0
    expect_format(b, {"tokenizer.ggml.tokens' element 0"});
    b = base;
    poke<uint32_t>(b, arr, 9);
    expect_format(b, {"tokenizer.ggml.tokens", "nested arrays"});
    const uint64_t farr = lay.key_pos[3] + 8 + std::string("tokenizer.ggml.scores").size() + 4;
    b = base;
    poke<uint64_t>(b, farr + 4, (1ull << 62));
    expect_format(b, {"tokenizer.ggml.scores", "past the end"});
    // Duplicate keys.
    GgufWriter w;
    w.kv_u32("a.b", 1);
    w.kv_u32("a.b", 2);
    expect_format(w.build(), {"'a.b' appears twice"});
    // Alignment must be a power of two.
    GgufWriter w2;
    w2.kv_u32("general.alignment", 48);
    expect_format(w2.build(), {"general.alignment"});
    GgufWriter w3;
    w3.kv_string("general.alignment", "32");
    expect_format(w3.build(), {"general.alignment"});
}

TEST_F(GgufHostile, TensorInfos) {
    GgufWriter::Layout lay;
    const std::vector<uint8_t> base = base_file(&lay);
    auto b = base;
    poke<uint64_t>(b, lay.offset_pos[1], 1ull << 20);  // aligned, past EOF
    expect_format(b, {"second.weight", "run past"});
    b = base;
    poke<uint64_t>(b, lay.offset_pos[1], 96 + 1);  // misaligned
    expect_format(b, {"second.weight", "not a multiple of the alignment"});
    b = base;
    poke<uint64_t>(b, lay.offset_pos[1], 0);  // overlaps first.weight
    expect_format(b, {"overlaps"});
    b = base;
    poke<uint32_t>(b, lay.type_pos[0], 4);  // a removed ggml type
    expect_format(b, {"first.weight", "unknown ggml type 4"});
    b = base;
    poke<uint32_t>(b, lay.type_pos[0], 1000);
    expect_format(b, {"first.weight", "unknown ggml type 1000"});
    b = base;
    poke<uint64_t>(b, lay.dims_pos[1], 1ull << 40);  // 2^40 * 4 elements * 4 bytes: overflow? no: past EOF
    poke<uint64_t>(b, lay.dims_pos[1] + 8, 1ull << 40);  // 2^80 elements: overflow
    expect_format(b, {"second.weight", "overflow"});
    b = base;
    poke<uint64_t>(b, lay.dims_pos[1], 1ull << 62);  // fits the element count, overflows bytes
    expect_format(b, {"second.weight", "overflow"});
    b = base;
    poke<uint32_t>(b, lay.n_dims_pos[0], 5);
    expect_format(b, {"first.weight", "n_dims 5"});
    b = base;
    poke<uint64_t>(b, lay.dims_pos[0], 48);  // Q4_0 rows must be whole blocks of 32
    expect_format(b, {"first.weight", "multiple of the Q4_0 block"});
    b = base;
    poke<uint64_t>(b, lay.info_pos[1], 1ull << 30);  // tensor name length
    expect_format(b, {"tensor info 1 name"});
    // Duplicate tensor names.
    GgufWriter w;
    w.tensor("x", {4}, ggml_type::F32, std::vector<uint8_t>(16, 0));
    w.tensor("x", {4}, ggml_type::F32, std::vector<uint8_t>(16, 0));
    expect_format(w.build(), {"'x'", "twice"});
}

TEST_F(GgufHostile, EveryTruncationFails) {
    const std::vector<uint8_t> base = base_file(nullptr);
    for (size_t n = 0; n < base.size(); ++n) {
        write_bytes(dir_ / "t.gguf", std::vector<uint8_t>(base.begin(), base.begin() + n));
        try {
            GgufFile g(dir_ / "t.gguf");
            ADD_FAILURE() << "truncated to " << n << " bytes: accepted";
        } catch (const Error &e) {
            ASSERT_EQ(e.status(), FT_ERR_FORMAT) << n << ": " << e.what();
        }
    }
}

TEST_F(GgufHostile, RandomCorruptionNeverCrashes) {
    GgufWriter::Layout lay;
    const std::vector<uint8_t> base = base_file(&lay);
    std::mt19937_64 g(test::fresh_seed("GgufHostile.RandomCorruptionNeverCrashes"));
    int rejected = 0;
    for (int trial = 0; trial < 400; ++trial) {
        auto b = base;
        const int flips = 1 + static_cast<int>(g() % 4);
        for (int f = 0; f < flips; ++f) b[g() % lay.data_start] ^= static_cast<uint8_t>(1u << (g() % 8));
        write_bytes(dir_ / "r.gguf", b);
        try {
            GgufFile file(dir_ / "r.gguf");
            for (const GgufTensorInfo &t : file.tensors()) ASSERT_LE(t.file_offset + t.nbytes, file.file_size());
        } catch (const Error &e) {
            ASSERT_EQ(e.status(), FT_ERR_FORMAT) << e.what();
            ++rejected;
        }
    }
    EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace ft
