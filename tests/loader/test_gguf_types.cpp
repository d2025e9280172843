// GGUF files as people download them: every expert type (Q8_0, K-quants, IQ4_XS, MXFP4) loaded
// byte-exactly or re-laid-out into its banks, types mixed per matrix and layer, split sets, shared
// experts, and hostile files of each type (every truncation, wrong block counts, broken split sets).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "ft/dequant.hpp"
#include "ft/gguf.hpp"
#include "ft/loader.hpp"
#include "ft/synth.hpp"
#include "fresh_seed.hpp"
#include "scratch_files.hpp"

namespace ft {
namespace {

using synth::GgufWriter;
using synth::Spec;
using test::expect_error;
using test::read_bytes;
using test::ScratchDir;
using test::write_bytes;

uint64_t fresh_seed() {
    static const uint64_t base = test::fresh_seed("test_gguf_types");
    static uint64_t n = 0;
    return base + 7919 * ++n;
}

template <typename T>
void poke(std::vector<uint8_t> &b, uint64_t pos, T v) {
    std::memcpy(b.data() + pos, &v, sizeof v);
}

// K-quants need H and I multiples of 256.
Spec spec_of(const char *format) {
    Spec s;
    s.gguf = true;
    s.format = format;
    s.hidden = 256;
    s.intermediate = 256;
    s.num_experts = 3;
    s.top_k = 2;
    s.num_layers = 3;
    s.first_dense = 1;
    s.seed = fresh_seed();
    return s;
}

// Every bank row of every expert equals what the synth says the file's bytes become.
void expect_banks(const Model &m, const Spec &s) {
    const ModelSpec &ms = m.spec();
    for (int l = 0; l < ms.num_layers; ++l) {
        const Format f = ms.layer_formats.empty() ? ms.format : ms.layer_formats[l].gate_up;
        const std::vector<BankSpec> schema = bank_schema(f, ms.hidden, ms.intermediate);
        for (int e = 0; e < ms.num_experts; ++e) {
            for (int b = 0; b < m.banks().num_banks(); ++b) {
                const std::vector<uint8_t> want = synth::bank_row(s, l, e, schema[b].name);
                ASSERT_EQ(m.banks().layer_row_bytes(b, l), want.size()) << "layer " << l << " bank " << b;
                const uint8_t *got = m.banks().layer_base(b, l) + e * m.banks().layer_row_bytes(b, l);
                ASSERT_EQ(std::memcmp(got, want.data(), want.size()), 0)
                    << "layer " << l << " expert " << e << " bank " << schema[b].name;
            }
        }
    }
}

// ---- every type ---------------------------------------------------------------------------------

struct TCase {
    const char *format;
    bool fused;
};

class GgufTypes : public ::testing::TestWithParam<TCase> {};

TEST_P(GgufTypes, BanksAndDequantisedWeights) {
    const TCase c = GetParam();
    ScratchDir dir;
    Spec s = spec_of(c.format);
    s.gguf_fused_gate_up = c.fused;
    synth::write_gguf(dir / "model.gguf", s);
    auto model = load_checkpoint(dir / "model.gguf");
    const ModelSpec &ms = model->spec();
    EXPECT_EQ(ms.format, parse_format(c.format));
    EXPECT_TRUE(ms.layer_formats.empty());
    EXPECT_EQ(ms.moe_layers, (std::vector<int32_t>{1, 2}));
    expect_banks(*model, s);
    // The weights the banks stand for, by the format's reference, equal the synth's expectation.
    const Format f = ms.format;
    const int nb = model->banks().num_banks();
    for (int l = 0; l < 2; ++l) {
        for (int e = 0; e < 3; ++e) {
            std::vector<const uint8_t *> rows;
            for (int b = 0; b < nb; ++b) rows.push_back(model->banks().row(b, l, e));
            for (int proj : {FT_PROJ_GATE, FT_PROJ_UP, FT_PROJ_DOWN}) {
                std::vector<float> got(256 * 256);
                dequant_projection(f, rows.data(), 256, 256, proj, got.data());
                const std::vector<float> want = synth::expert_dequant(s, l, e, proj);
                ASSERT_EQ(got.size(), want.size());
                size_t nonzero = 0;
                for (size_t i = 0; i < got.size(); ++i) {
                    ASSERT_TRUE(std::isfinite(got[i])) << i;
                    ASSERT_EQ(got[i], want[i]) << "layer " << l << " expert " << e << " proj " << proj << " at " << i;
                    nonzero += got[i] != 0.0f;
                }
                EXPECT_GT(nonzero, got.size() / 2);  // real weights, not an all-zero bank
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Each, GgufTypes,
                         ::testing::Values(TCase{"q4_0", false}, TCase{"q8_0", false}, TCase{"q2_k", false},
                                           TCase{"q3_k", false}, TCase{"q4_k", false}, TCase{"q5_k", true},
                                           TCase{"q6_k", false}, TCase{"iq4_xs", false}, TCase{"q4_k", true},
                                           TCase{"mxfp4", false}, TCase{"mxfp4", true}),
                         [](const ::testing::TestParamInfo<TCase> &i) {
                             return std::string(i.param.format) + (i.param.fused ? "_fused" : "");
                         });

// MXFP4 checked against the ggml block layout directly (not through the synth's re-layout):
// weight k of unit n is e2m1(code) * 2^(e - 127), code in the low nibble of byte k for k < 16 of
// each 32 and in the high nibble of byte k - 16 otherwise; biases are the F32 values rounded to bf16.
TEST(GgufMxfp4, WeightsFollowTheGgmlBlockLayout) {
    ScratchDir dir;
    Spec s = spec_of("mxfp4");
    s.hidden = 64;
    s.intermediate = 32;
    synth::write_gguf(dir / "m.gguf", s);
    auto model = load_checkpoint(dir / "m.gguf");
    ASSERT_EQ(model->spec().format, Format::mxfp4);
    GgufFile g(dir / "m.gguf");
    static const float kE2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    auto ggml_weight = [&](const GgufTensorInfo &t, uint64_t unit, int64_t K, int64_t k) {
        const uint8_t *blk = g.mapping() + t.file_offset + unit * (K / 32) * 17 + (k / 32) * 17;
        const int j = static_cast<int>(k % 32);
        const int code = j < 16 ? blk[1 + j] & 15 : blk[1 + j - 16] >> 4;
        return kE2m1[code] * std::ldexp(1.0f, blk[0] - 127);
    };
    const int64_t H = 64, I = 32;
    for (int l = 0; l < 2; ++l) {
        const std::string b = "blk." + std::to_string(l + 1) + ".";
        const GgufTensorInfo *gate = g.find_tensor(b + "ffn_gate_exps.weight"), *up = g.find_tensor(b + "ffn_up_exps.weight"),
                             *down = g.find_tensor(b + "ffn_down_exps.weight"),
                             *gb = g.find_tensor(b + "ffn_gate_exps.bias"), *db = g.find_tensor(b + "ffn_down_exps.bias");
        ASSERT_TRUE(gate && up && down && gb && db);
        EXPECT_EQ(gate->type, ggml_type::MXFP4);
        for (int e = 0; e < 3; ++e) {
            std::vector<const uint8_t *> rows;
            for (int k = 0; k < 6; ++k) rows.push_back(model->banks().row(k, l, e));
            std::vector<float> w(H * I), bias(H);
            dequant_projection(Format::mxfp4, rows.data(), H, I, FT_PROJ_GATE, w.data());
            for (int64_t n = 0; n < I; ++n)
                for (int64_t k = 0; k < H; ++k)
                    ASSERT_EQ(w[n * H + k], ggml_weight(*gate, e * I + n, H, k)) << n << "," << k;
            dequant_projection(Format::mxfp4, rows.data(), H, I, FT_PROJ_UP, w.data());
            for (int64_t n = 0; n < I; ++n)
                for (int64_t k = 0; k < H; ++k) ASSERT_EQ(w[n * H + k], ggml_weight(*up, e * I + n, H, k));
            dequant_projection(Format::mxfp4, rows.data(), H, I, FT_PROJ_DOWN, w.data());
            for (int64_t n = 0; n < H; ++n)
                for (int64_t k = 0; k < I; ++k) ASSERT_EQ(w[n * I + k], ggml_weight(*down, e * H + n, I, k));
            ASSERT_TRUE(projection_bias(Format::mxfp4, rows.data(), H, I, FT_PROJ_GATE, bias.data()));
            for (int64_t n = 0; n < I; ++n) {
                float f;
                std::memcpy(&f, g.mapping() + gb->file_offset + (e * I + n) * 4, 4);
                ASSERT_EQ(bias[n], bf16_to_f32(f32_to_bf16(f)));
            }
            ASSERT_TRUE(projection_bias(Format::mxfp4, rows.data(), H, I, FT_PROJ_DOWN, bias.data()));
            for (int64_t n = 0; n < H; ++n) {
                float f;
                std::memcpy(&f, g.mapping() + db->file_offset + (e * H + n) * 4, 4);
                ASSERT_EQ(bias[n], bf16_to_f32(f32_to_bf16(f)));
            }
        }
    }
}

// ---- mixed types ----------------------------------------------------------------------------------

// Whether this build's banks allocate each layer at its own formats' row sizes.
bool per_layer_banks(const ModelSpec &spec) {
    Model m(spec);
    for (int l = 0; l < spec.num_layers; ++l)
        if (m.banks().layer_row_bytes(1, l) != bank_schema(spec.layer_formats[l].down, spec.hidden, spec.intermediate)[1].row_bytes)
            return false;
    return true;
}

TEST(GgufMixed, FormatsPerMatrixAndLayer) {
    ScratchDir dir;
    Spec s = spec_of("q4_k");
    s.num_layers = 4;
    s.gguf_mix = {"q4_k/q6_k", "q8_0/q4_k", "iq4_xs/iq4_xs"};
    synth::write_gguf(dir / "mix.gguf", s);
    GgufFile g(dir / "mix.gguf");
    const ModelSpec ms = read_gguf_config(g);
    EXPECT_EQ(ms.format, Format::q4_k);
    ASSERT_EQ(ms.layer_formats.size(), 3u);
    const Format want[3][2] = {{Format::q4_k, Format::q6_k}, {Format::q8_0, Format::q4_k}, {Format::iq4_xs, Format::iq4_xs}};
    for (int l = 0; l < 3; ++l) {
        EXPECT_EQ(ms.layer_formats[l].gate_up, want[l][0]) << l;
        EXPECT_EQ(ms.layer_formats[l].down, want[l][1]) << l;
    }
    ASSERT_TRUE(per_layer_banks(ms));
    auto model = load_checkpoint(dir / "mix.gguf");
    EXPECT_EQ(model->spec().layer_formats.size(), 3u);
    expect_banks(*model, s);

    // One format per matrix, the same in every layer, is a mix too.
    Spec s2 = spec_of("q4_k");
    s2.gguf_mix = {"q4_k/q6_k"};
    synth::write_gguf(dir / "m2.gguf", s2);
    GgufFile g2(dir / "m2.gguf");
    const ModelSpec ms2 = read_gguf_config(g2);
    ASSERT_EQ(ms2.layer_formats.size(), 2u);
    EXPECT_EQ(ms2.layer_formats[1].down, Format::q6_k);
}

TEST(GgufMixed, RefusedMixes) {
    ScratchDir dir;
    Spec s = spec_of("q4_k");
    s.gguf_mix = {"q4_k/q4_k", "q4_k/bf16"};
    synth::write_gguf(dir / "fb.gguf", s);
    expect_error([&] { load_checkpoint(dir / "fb.gguf"); }, FT_ERR_UNSUPPORTED,
                 {"blk.2.ffn_down_exps.weight", "BF16", "blk.1.ffn_gate_exps.weight", "Q4_K", "float"});
    s.gguf_mix = {"mxfp4/mxfp4", "q4_k/q4_k"};
    synth::write_gguf(dir / "mx.gguf", s);
    expect_error([&] { load_checkpoint(dir / "mx.gguf"); }, FT_ERR_UNSUPPORTED,
                 {"blk.2.ffn_gate_exps.weight", "Q4_K", "MXFP4"});

    // Gate and up of one layer in different types.
    GgufWriter w;
    w.kv_string("general.architecture", "qwen3moe");
    for (const char *k : {"block_count", "embedding_length", "expert_count", "expert_used_count", "expert_feed_forward_length"})
        w.kv_u32(std::string("qwen3moe.") + k, std::string(k) == "block_count" || std::string(k) == "expert_used_count" ? 1
                                               : std::string(k) == "expert_count" ? 2 : 256);
    w.tensor("blk.0.ffn_gate_exps.weight", {256, 256, 2}, ggml_type::Q4_K, std::vector<uint8_t>(512 * 144, 0));
    w.tensor("blk.0.ffn_up_exps.weight", {256, 256, 2}, ggml_type::Q6_K, std::vector<uint8_t>(512 * 210, 0));
    w.write(dir / "gu.gguf");
    expect_error([&] { load_checkpoint(dir / "gu.gguf"); }, FT_ERR_UNSUPPORTED,
                 {"blk.0.ffn_gate_exps.weight' is Q4_K", "blk.0.ffn_up_exps.weight' is Q6_K", "share a type"});
}

// ---- split files --------------------------------------------------------------------------------

TEST(GgufSplit, ThreePartsLoadLikeOneFile) {
    ScratchDir dir;
    Spec s = spec_of("q6_k");
    s.gguf_splits = 3;
    std::filesystem::create_directory(dir / "set");
    synth::write_gguf(dir / "set/model.gguf", s);
    for (int k = 1; k <= 3; ++k) ASSERT_TRUE(std::filesystem::exists(synth::gguf_part_path(dir / "set/model.gguf", k, 3)));
    EXPECT_FALSE(std::filesystem::exists(dir / "set/model.gguf"));
    {
        // The parts really split the tensors: the first holds none of the last layer's.
        GgufFile first(synth::gguf_part_path(dir / "set/model.gguf", 1, 3));
        EXPECT_EQ(first.find_tensor("blk.2.ffn_down_exps.weight"), nullptr);
    }
    auto model = load_checkpoint(synth::gguf_part_path(dir / "set/model.gguf", 1, 3));
    expect_banks(*model, s);
    auto again = load_checkpoint(dir / "set");  // the directory
    expect_banks(*again, s);
    const std::unique_ptr<GgufFile> g = open_gguf_model(synth::gguf_part_path(dir / "set/model.gguf", 1, 3));
    EXPECT_EQ(g->parts().size(), 2u);
    EXPECT_EQ(g->find_tensor("blk.2.ffn_down_exps.weight")->part->path(), synth::gguf_part_path(dir / "set/model.gguf", 3, 3));
}

TEST(GgufSplit, BrokenSets) {
    ScratchDir dir;
    Spec s = spec_of("q4_k");
    s.num_layers = 2;
    s.gguf_splits = 3;
    const std::string m = dir / "model.gguf";
    synth::write_gguf(m, s);
    const std::string p1 = synth::gguf_part_path(m, 1, 3), p2 = synth::gguf_part_path(m, 2, 3),
                      p3 = synth::gguf_part_path(m, 3, 3);
    // Given a later part.
    expect_error([&] { load_checkpoint(p2); }, FT_ERR_FORMAT, {"part 2 of 3", "first part"});
    // A part missing.
    std::filesystem::rename(p3, dir / "aside");
    expect_error([&] { load_checkpoint(p1); }, FT_ERR_IO, {"part 3 of 3", "missing"});
    std::filesystem::rename(dir / "aside", p3);
    // A part truncated: parsed with the same checks as any file, named.
    const std::vector<uint8_t> part2 = read_bytes(p2);
    write_bytes(p2, std::vector<uint8_t>(part2.begin(), part2.begin() + static_cast<long>(part2.size() - 100)));
    expect_error([&] { load_checkpoint(p1); }, FT_ERR_FORMAT, {"model-00002-of-00003.gguf", "truncated"});
    // A part of another set (another count) under this name.
    Spec s2 = s;
    s2.gguf_splits = 2;
    synth::write_gguf(dir / "other.gguf", s2);
    std::filesystem::copy_file(synth::gguf_part_path(dir / "other.gguf", 2, 2), p2,
                               std::filesystem::copy_options::overwrite_existing);
    expect_error([&] { load_checkpoint(p1); }, FT_ERR_FORMAT, {"model-00002-of-00003.gguf", "split.count = 2"});
    // The first part duplicated in place of the second.
    std::filesystem::copy_file(p1, p2, std::filesystem::copy_options::overwrite_existing);
    expect_error([&] { load_checkpoint(p1); }, FT_ERR_FORMAT, {"model-00002-of-00003.gguf", "split.no = 0"});
    // A directory with two sets, and one whose first part is missing.
    std::filesystem::remove(p2);
    std::filesystem::remove(dir / "other-00001-of-00002.gguf");
    std::filesystem::remove(p1);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_UNSUPPORTED, {"several split sets"});
    std::filesystem::remove(dir / "other-00002-of-00002.gguf");
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_IO, {"no first part", "model-00001-of-00003.gguf"});
}

// Parts built by hand: a tensor in two parts, and a tensor count that disagrees.
TEST(GgufSplit, TensorInTwoPartsAndWrongCount) {
    ScratchDir dir;
    auto part = [&](int no, int count, int32_t total, const char *tensor) {
        GgufWriter w;
        if (no == 0) w.kv_string("general.architecture", "qwen3moe");
        w.kv_raw("split.no", 2, {static_cast<uint8_t>(no), 0});
        w.kv_raw("split.count", 2, {static_cast<uint8_t>(count), 0});
        w.kv_i32("split.tensors.count", total);
        w.tensor(tensor, {8}, ggml_type::F32, std::vector<uint8_t>(32, 0));
        w.write(synth::gguf_part_path(dir / "t.gguf", no + 1, count));
    };
    part(0, 2, 2, "x");
    part(1, 2, 2, "x");
    expect_error([&] { open_gguf_model(synth::gguf_part_path(dir / "t.gguf", 1, 2)); }, FT_ERR_FORMAT,
                 {"t-00002-of-00002.gguf", "'x'", "also in", "t-00001-of-00002.gguf"});
    part(1, 2, 2, "y");
    EXPECT_EQ(open_gguf_model(synth::gguf_part_path(dir / "t.gguf", 1, 2))->tensors().size(), 2u);
    part(0, 2, 3, "x");
    expect_error([&] { open_gguf_model(synth::gguf_part_path(dir / "t.gguf", 1, 2)); }, FT_ERR_FORMAT,
                 {"split.tensors.count = 3", "hold 2 tensors"});
}

// ---- shared experts -------------------------------------------------------------------------------

struct SCase {
    const char *format;
    const char *dtype;
    const char *shared_format = "";  // "": the writer's default (the layer's block type or dtype)
};

void PrintTo(const SCase &c, std::ostream *os) {
    *os << c.format << "/" << c.dtype << "/" << (*c.shared_format ? c.shared_format : "default");
}

class GgufShared : public ::testing::TestWithParam<SCase> {};

TEST_P(GgufShared, LoadedAsBf16) {
    ScratchDir dir;
    Spec s = spec_of(GetParam().format);
    s.expert_dtype = GetParam().dtype;
    s.gguf_shared_format = GetParam().shared_format;
    s.shared_intermediate = 512;
    s.gguf_shared_gate = true;
    s.gguf_arch = "qwen2moe";  // the family with the shared expert's sigmoid gate
    synth::write_gguf(dir / "sh.gguf", s);
    auto model = load_checkpoint(dir / "sh.gguf");
    const ModelSpec &ms = model->spec();
    EXPECT_EQ(ms.shared_intermediate, 512);
    EXPECT_TRUE(ms.shared_expert_gate);
    auto expect_bf16 = [](const Tensor &t, const std::vector<uint16_t> &want, std::vector<int64_t> shape, const char *what) {
        EXPECT_EQ(t.dtype, FT_DTYPE_BF16) << what;
        EXPECT_EQ(t.shape, shape) << what;
        ASSERT_EQ(t.bytes.size(), want.size() * 2) << what;
        EXPECT_EQ(std::memcmp(t.bytes.data(), want.data(), t.bytes.size()), 0) << what;
    };
    for (int l = 0; l < 2; ++l) {
        const LayerExtras &x = model->extras(l);
        expect_bf16(x.shared_gate, synth::shared_weight(s, l, FT_PROJ_GATE), {512, 256}, "gate");
        expect_bf16(x.shared_up, synth::shared_weight(s, l, FT_PROJ_UP), {512, 256}, "up");
        expect_bf16(x.shared_down, synth::shared_weight(s, l, FT_PROJ_DOWN), {256, 512}, "down");
        expect_bf16(x.shared_gate_proj, synth::shared_gate_weight(s, l), {1, 256}, "shared gate");
    }
}

INSTANTIATE_TEST_SUITE_P(Types, GgufShared,
                         ::testing::Values(SCase{"q4_k", "BF16"}, SCase{"q6_k", "BF16"}, SCase{"bf16", "F16"},
                                           SCase{"bf16", "F32"}, SCase{"q4_k", "BF16", "mxfp4"},
                                           SCase{"mxfp4", "BF16", "mxfp4"}, SCase{"bf16", "F32", "mxfp4"}),
                         [](const ::testing::TestParamInfo<SCase> &i) {
                             return std::string(i.param.format) + "_" + i.param.dtype +
                                    (*i.param.shared_format ? std::string("_shared_") + i.param.shared_format : "");
                         });

// MXFP4 shared experts: the writer's expected values decode the ggml nibble order on their own, so
// a swapped nibble or scale in the loader shows up; here the values are also checked against the
// e2m1 / e8m0 element decoders for one whole block by hand.
TEST(GgufShared, Mxfp4BlockByHand) {
    ScratchDir dir;
    Spec s = spec_of("q8_0");
    s.shared_intermediate = 256;
    s.gguf_shared_format = "mxfp4";
    synth::write_gguf(dir / "sh.gguf", s);
    // Overwrite the first block of layer 1's shared gate: scale 2^1, element j < 16 = code j (low
    // nibble of byte j), element j + 16 = code 15 - j (its high nibble).
    std::vector<uint8_t> b = read_bytes(dir / "sh.gguf");
    uint64_t at = 0;
    {
        GgufFile g(dir / "sh.gguf");
        const GgufTensorInfo *t = g.find_tensor("blk.1.ffn_gate_shexp.weight");
        ASSERT_NE(t, nullptr);
        ASSERT_EQ(t->type, ggml_type::MXFP4);
        at = t->file_offset;
    }
    b[at] = 128;
    for (int j = 0; j < 16; ++j) b[at + 1 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    write_bytes(dir / "sh.gguf", b);
    auto model = load_checkpoint(dir / "sh.gguf");
    const Tensor &t = model->extras(0).shared_gate;
    ASSERT_EQ(t.shape, (std::vector<int64_t>{256, 256}));
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int k = 0; k < 32; ++k) {
        const int code = k < 16 ? k : 15 - (k - 16);
        const float want = (code & 8 ? -2.0f : 2.0f) * mag[code & 7];
        uint16_t v;
        std::memcpy(&v, t.bytes.data() + 2 * k, 2);
        EXPECT_EQ(bf16_to_f32(v), want) << "element " << k;
    }
}

// Hostile MXFP4 shared experts: a NaN scale, wrong dims, a truncated tensor: FT_ERR_FORMAT naming it.
TEST(GgufShared, Mxfp4Hostile) {
    ScratchDir dir;
    Spec s = spec_of("q4_k");
    s.shared_intermediate = 256;
    s.gguf_shared_format = "mxfp4";
    synth::write_gguf(dir / "sh.gguf", s);
    const std::vector<uint8_t> base = read_bytes(dir / "sh.gguf");
    uint64_t up_at = 0, down_at = 0, down_bytes = 0, down_dims_pos = 0;
    {
        GgufFile g(dir / "sh.gguf");
        const GgufTensorInfo *up = g.find_tensor("blk.2.ffn_up_shexp.weight");
        const GgufTensorInfo *down = g.find_tensor("blk.2.ffn_down_shexp.weight");
        ASSERT_TRUE(up && down);
        ASSERT_EQ(&g.tensors().back(), down);  // the file's last tensor
        up_at = up->file_offset;
        down_at = down->file_offset;
        down_bytes = down->nbytes;
        ASSERT_EQ(down_bytes, 256u * 256 / 32 * 17);
        const std::string name = down->name;
        down_dims_pos = static_cast<uint64_t>(std::search(base.begin(), base.end(), name.begin(), name.end()) - base.begin()) +
                        name.size() + 4;
    }
    // e8m0 code 255 (NaN) in the scale of block 3 of the up projection.
    auto b = base;
    b[up_at + 3 * 17] = 0xff;
    write_bytes(dir / "h.gguf", b);
    expect_error([&] { load_checkpoint(dir / "h.gguf"); }, FT_ERR_FORMAT,
                 {"blk.2.ffn_up_shexp.weight", "e8m0 scale byte 255"});
    // Down [Is, H] = [256, 256] declared as [128, 512]: the same bytes, the wrong shape.
    b = base;
    poke<uint64_t>(b, down_dims_pos, 128);
    poke<uint64_t>(b, down_dims_pos + 8, 512);
    write_bytes(dir / "h.gguf", b);
    expect_error([&] { load_checkpoint(dir / "h.gguf"); }, FT_ERR_FORMAT,
                 {"blk.2.ffn_down_shexp.weight", "expected dims [256, 256]"});
    // Inner dimension not whole MXFP4 blocks.
    b = base;
    poke<uint64_t>(b, down_dims_pos, 48);
    write_bytes(dir / "h.gguf", b);
    expect_error([&] { load_checkpoint(dir / "h.gguf"); }, FT_ERR_FORMAT, {"blk.2.ffn_down_shexp.weight", "MXFP4"});
    // Truncated anywhere inside the last tensor's data.
    for (uint64_t cut : {down_at + 1, down_at + 17, down_at + down_bytes / 2, down_at + down_bytes - 1}) {
        write_bytes(dir / "h.gguf", std::vector<uint8_t>(base.begin(), base.begin() + static_cast<long>(cut)));
        expect_error([&] { load_checkpoint(dir / "h.gguf"); }, FT_ERR_FORMAT,
                     {"blk.2.ffn_down_shexp.weight", "file truncated?"});
    }
}

TEST(GgufShared, MissingPieceIsNamed) {
    ScratchDir dir;
    Spec s = spec_of("q4_k");
    s.shared_intermediate = 256;
    synth::write_gguf(dir / "sh.gguf", s);
    auto model = load_checkpoint(dir / "sh.gguf");
    EXPECT_FALSE(model->spec().shared_expert_gate);
    EXPECT_TRUE(model->extras(0).shared_gate_proj.bytes.empty());
    // Rename layer 2's shared down projection: the loader names what it misses.
    std::vector<uint8_t> b = read_bytes(dir / "sh.gguf");
    const std::string name = "blk.2.ffn_down_shexp.weight";
    auto it = std::search(b.begin(), b.end(), name.begin(), name.end());
    ASSERT_NE(it, b.end());
    *(it + 4) = '7';  // blk.7...
    write_bytes(dir / "sh.gguf", b);
    expect_error([&] { load_checkpoint(dir / "sh.gguf"); }, FT_ERR_FORMAT, {"missing tensor 'blk.2.ffn_down_shexp.weight'"});
}

// ---- hostile files per type -----------------------------------------------------------------------

struct HCase {
    const char *name;
    uint32_t type, block_elems, block_bytes;
};

const HCase kTypes[] = {{"Q8_0", 8, 32, 34},       {"Q2_K", 10, 256, 84},  {"Q3_K", 11, 256, 110},
                        {"Q4_K", 12, 256, 144},    {"Q5_K", 13, 256, 176}, {"Q6_K", 14, 256, 210},
                        {"IQ4_XS", 23, 256, 136}, {"MXFP4", 39, 32, 17}};

// A small file: metadata and one two-row tensor of the type, then an F32 tensor of tail elements.
std::vector<uint8_t> small_file(const HCase &c, GgufWriter::Layout *lay, uint64_t tail = 8) {
    GgufWriter w;
    w.kv_string("general.architecture", "qwen3moe");
    w.kv_strings("tokenizer.ggml.tokens", {"a", "bc"});
    w.tensor("blk.0.ffn_down_exps.weight", {c.block_elems, 2}, c.type, std::vector<uint8_t>(2 * c.block_bytes, 0x21));
    w.tensor("tail.weight", {tail}, ggml_type::F32, std::vector<uint8_t>(tail * 4, 0x3c));
    return w.build(lay);
}

TEST(GgufHostileTypes, GeometryMatchesGgml) {
    for (const HCase &c : kTypes) {
        uint32_t be = 0, bb = 0;
        ASSERT_TRUE(ggml_type_geometry(c.type, &be, &bb)) << c.name;
        EXPECT_EQ(be, c.block_elems) << c.name;
        EXPECT_EQ(bb, c.block_bytes) << c.name;
        EXPECT_STREQ(ggml_type_name(c.type), c.name);
    }
    // The ids the loader maps agree with the table.
    EXPECT_STREQ(ggml_type_name(ggml_type::Q4_K), "Q4_K");
    EXPECT_STREQ(ggml_type_name(ggml_type::IQ4_XS), "IQ4_XS");
    EXPECT_STREQ(ggml_type_name(ggml_type::MXFP4), "MXFP4");
    // And with the bank formats' blocks.
    EXPECT_EQ(block_bytes(Format::q4_k), 144);
    EXPECT_EQ(block_bytes(Format::iq4_xs), 136);
    EXPECT_EQ(block_bytes(Format::q3_k), 110);
}

TEST(GgufHostileTypes, EveryTruncationFails) {
    ScratchDir dir;
    for (const HCase &c : kTypes) {
        const std::vector<uint8_t> base = small_file(c, nullptr);
        write_bytes(dir / "ok.gguf", base);
        GgufFile ok(dir / "ok.gguf");
        ASSERT_EQ(ok.find_tensor("blk.0.ffn_down_exps.weight")->nbytes, 2u * c.block_bytes) << c.name;
        for (size_t n = 0; n < base.size(); ++n) {
            write_bytes(dir / "t.gguf", std::vector<uint8_t>(base.begin(), base.begin() + static_cast<long>(n)));
            try {
                GgufFile g(dir / "t.gguf");
                ADD_FAILURE() << c.name << " truncated to " << n << " bytes: accepted";
            } catch (const Error &e) {
                ASSERT_EQ(e.status(), FT_ERR_FORMAT) << c.name << " at " << n << ": " << e.what();
            }
        }
    }
}

TEST(GgufHostileTypes, WrongBlockCounts) {
    ScratchDir dir;
    auto expect_format = [&](const std::vector<uint8_t> &b, std::initializer_list<std::string> parts) {
        write_bytes(dir / "h.gguf", b);
        expect_error([&] { GgufFile g(dir / "h.gguf"); }, FT_ERR_FORMAT, parts);
    };
    for (const HCase &c : kTypes) {
        GgufWriter::Layout lay;
        const std::vector<uint8_t> base = small_file(c, &lay, 1024);
        // Rows that are not whole blocks.
        auto b = base;
        poke<uint64_t>(b, lay.dims_pos[0], c.block_elems + c.block_elems / 2);
        expect_format(b, {"blk.0.ffn_down_exps.weight", std::string("multiple of the ") + c.name + " block"});
        // More blocks than the bytes before the next tensor.
        b = base;
        // More rows than stored, beyond the alignment padding (32 bytes) after them.
        poke<uint64_t>(b, lay.dims_pos[0] + 8, 3 + 32 / c.block_bytes);
        expect_format(b, {"overlaps tensor 'blk.0.ffn_down_exps.weight'"});
        // The same shape declared as a type with bigger blocks: its bytes overlap the next tensor.
        b = base;
        poke<uint32_t>(b, lay.type_pos[0], c.block_elems == 32 ? 0u /* F32 */ : 15u /* Q8_K, 292 bytes */);
        expect_format(b, {"overlaps tensor 'blk.0.ffn_down_exps.weight'"});
    }
}

// A model whose K is not a multiple of the type's block is refused at parse time, naming it.
TEST(GgufHostileTypes, ModelGeometry) {
    ScratchDir dir;
    Spec s = spec_of("q4_k");
    s.intermediate = 128;  // down rows of 128 elements: half a Q4_K block
    expect_error([&] { synth::write_gguf(dir / "g.gguf", s); }, FT_ERR_INVALID_ARGUMENT, {"256"});
    // Written as q4_0 (blocks of 32), then relabelled Q4_K with the byte count of the Q4_0 data.
    Spec q = spec_of("q4_0");
    q.intermediate = 128;
    GgufWriter::Layout lay;
    synth::write_gguf(dir / "g.gguf", q);
    std::vector<uint8_t> b = read_bytes(dir / "g.gguf");
    const std::string name = "blk.1.ffn_down_exps.weight";
    auto it = std::search(b.begin(), b.end(), name.begin(), name.end());
    ASSERT_NE(it, b.end());
    const uint64_t type_pos = static_cast<uint64_t>(it - b.begin()) + name.size() + 4 + 3 * 8;
    poke<uint32_t>(b, type_pos, ggml_type::Q4_K);
    write_bytes(dir / "g.gguf", b);
    expect_error([&] { load_checkpoint(dir / "g.gguf"); }, FT_ERR_FORMAT,
                 {"blk.1.ffn_down_exps.weight", "innermost dimension 128", "Q4_K block of 256"});
}

// Random bit flips in the tensor infos of whole models (each new kind: MXFP4, a mix, shared
// experts, the first part of a split set) end in a loaded model or an ft::Error, never a crash.
// The metadata is left intact so the geometry, and what is allocated, stays small.
TEST(GgufHostileTypes, CorruptTensorInfosNeverCrash) {
    ScratchDir dir;
    std::vector<std::string> paths;
    Spec mx = spec_of("mxfp4");
    mx.hidden = 64;
    mx.intermediate = 32;
    synth::write_gguf(dir / "mx.gguf", mx);
    paths.push_back(dir / "mx.gguf");
    Spec mix = spec_of("q4_k");
    mix.gguf_mix = {"q4_k/q6_k", "q8_0/q5_k"};
    synth::write_gguf(dir / "mix.gguf", mix);
    paths.push_back(dir / "mix.gguf");
    Spec sh = spec_of("q6_k");
    sh.shared_intermediate = 256;
    synth::write_gguf(dir / "sh.gguf", sh);
    paths.push_back(dir / "sh.gguf");
    Spec sp = spec_of("q8_0");
    sp.hidden = 64;
    sp.intermediate = 32;
    sp.gguf_splits = 3;
    synth::write_gguf(dir / "sp.gguf", sp);
    paths.push_back(synth::gguf_part_path(dir / "sp.gguf", 1, 3));
    std::mt19937_64 rng(test::fresh_seed("GgufHostileTypes.CorruptTensorInfosNeverCrash"));
    int rejected = 0, loaded = 0;
    for (const std::string &path : paths) {
        const std::vector<uint8_t> base = read_bytes(path);
        uint64_t info_begin = 0, data_start = 0;
        {
            GgufFile g(path);
            data_start = g.data_offset();
            const std::string first = g.tensors().front().name;
            info_begin = static_cast<uint64_t>(std::search(base.begin(), base.end(), first.begin(), first.end()) - base.begin()) - 8;
        }
        ASSERT_LT(info_begin, data_start);
        for (int trial = 0; trial < 60; ++trial) {
            auto b = base;
            const int flips = 1 + static_cast<int>(rng() % 3);
            for (int f = 0; f < flips; ++f)
                b[info_begin + rng() % (data_start - info_begin)] ^= static_cast<uint8_t>(1u << (rng() % 8));
            write_bytes(path, b);
            try {
                load_checkpoint(path);
                ++loaded;
            } catch (const Error &e) {
                ASSERT_TRUE(e.status() == FT_ERR_FORMAT || e.status() == FT_ERR_UNSUPPORTED || e.status() == FT_ERR_IO)
                    << e.status() << ": " << e.what();
                ++rejected;
            }
        }
        write_bytes(path, base);
    }
    RecordProperty("loaded", loaded);
    EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace ft
