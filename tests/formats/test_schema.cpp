// Bank schemas (docs/formats.md): names, order, row sizes against the per-expert byte counts,
// geometry rules, and dequant_projection's reading of each schema (gate/up halves, mxfp4
// interleaving, per-row globals).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "ft/formats.hpp"
#include "fresh_seed.hpp"

namespace ft {
namespace {

std::vector<std::string> names(Format f, int64_t H, int64_t I) {
    std::vector<std::string> out;
    for (const BankSpec &b : bank_schema(f, H, I)) out.push_back(b.name);
    return out;
}

TEST(Schema, EnumValuesAndNames) {
    EXPECT_EQ(static_cast<int32_t>(Format::bf16), FT_FORMAT_BF16);
    EXPECT_EQ(static_cast<int32_t>(Format::fp8_block), 2);
    EXPECT_EQ(static_cast<int32_t>(Format::nvfp4), 3);
    EXPECT_EQ(static_cast<int32_t>(Format::mxfp4), 4);
    EXPECT_EQ(static_cast<int32_t>(Format::ds_fp4), 5);
    EXPECT_EQ(static_cast<int32_t>(Format::q4_0), 6);
    EXPECT_EQ(static_cast<int32_t>(Format::q8_0), 7);
    EXPECT_EQ(static_cast<int32_t>(Format::q2_k), 8);
    EXPECT_EQ(static_cast<int32_t>(Format::q3_k), 9);
    EXPECT_EQ(static_cast<int32_t>(Format::q4_k), 10);
    EXPECT_EQ(static_cast<int32_t>(Format::q5_k), 11);
    EXPECT_EQ(static_cast<int32_t>(Format::q6_k), 12);
    EXPECT_EQ(static_cast<int32_t>(Format::iq4_xs), 13);
    for (const char *n : {"bf16", "fp8_block", "nvfp4", "mxfp4", "ds_fp4", "q4_0", "q8_0", "q2_k", "q3_k", "q4_k",
                          "q5_k", "q6_k", "iq4_xs"}) {
        EXPECT_STREQ(format_name(parse_format(n)), n);
        EXPECT_TRUE(format_known(static_cast<int32_t>(parse_format(n))));
    }
    EXPECT_THROW(parse_format("fp8"), Error);
    EXPECT_THROW(parse_format("q4_k_m"), Error);
    EXPECT_FALSE(format_known(0));
    EXPECT_FALSE(format_known(14));
    // The C API accepts only what freetoken.h publishes.
    EXPECT_TRUE(format_valid(FT_FORMAT_BF16));
    EXPECT_FALSE(format_valid(2));
}

TEST(Schema, ExpertBytesMatchSpecTable) {
    // Per-expert bytes of the canonical profile geometries (docs/formulas.md).
    EXPECT_EQ(expert_bytes(Format::bf16, 2048, 768), 9437184u);
    EXPECT_EQ(expert_bytes(Format::nvfp4, 3072, 1536), 7974912u);
    EXPECT_EQ(expert_bytes(Format::fp8_block, 2048, 512), 3146112u);
    EXPECT_EQ(expert_bytes(Format::mxfp4, 2880, 2880), 13236480u);
    EXPECT_EQ(expert_bytes(Format::ds_fp4, 4096, 2048), 13369344u);
    // Gemma-4 Q4_0: gate_up 2*704 rows of 88 blocks, down 2816 rows of 22 blocks, 18 bytes each.
    EXPECT_EQ(expert_bytes(Format::q4_0, 2816, 704), (2u * 704 * 88 + 2816u * 22) * 18);
}

TEST(Schema, BankOrderAndRowBytes) {
    const int64_t H = 256, I = 128;
    EXPECT_EQ(names(Format::bf16, H, I), (std::vector<std::string>{"gate_up", "down"}));
    EXPECT_EQ(bank_schema(Format::bf16, H, I)[0].row_bytes, size_t(2 * I * H * 2));
    EXPECT_EQ(names(Format::fp8_block, H, I),
              (std::vector<std::string>{"gate_up", "gate_up_scale", "down", "down_scale"}));
    EXPECT_EQ(names(Format::nvfp4, H, I), (std::vector<std::string>{"gate_up_packed", "gate_up_scale", "gate_up_global",
                                                                     "down_packed", "down_scale", "down_global"}));
    EXPECT_EQ(names(Format::mxfp4, H, I), (std::vector<std::string>{"gate_up_blocks", "gate_up_scales", "gate_up_bias",
                                                                     "down_blocks", "down_scales", "down_bias"}));
    EXPECT_EQ(names(Format::ds_fp4, H, I),
              (std::vector<std::string>{"gate_up_packed", "gate_up_scale", "down_packed", "down_scale"}));
    EXPECT_EQ(names(Format::q4_0, H, I), (std::vector<std::string>{"gate_up", "down"}));
    const std::vector<BankSpec> nv = bank_schema(Format::nvfp4, H, I);
    const size_t want_nv[6] = {size_t(2 * I * H / 2), size_t(2 * I * H / 16), size_t(2 * I * 2),
                               size_t(H * I / 2),     size_t(H * I / 16),     size_t(H * 2)};
    for (int b = 0; b < 6; ++b) EXPECT_EQ(nv[b].row_bytes, want_nv[b]) << nv[b].name;
    const std::vector<BankSpec> mx = bank_schema(Format::mxfp4, H, I);
    const size_t want_mx[6] = {size_t(H / 2 * 2 * I), size_t(H / 32 * 2 * I), size_t(2 * I * 2),
                               size_t(I / 2 * H),     size_t(I / 32 * H),     size_t(H * 2)};
    for (int b = 0; b < 6; ++b) EXPECT_EQ(mx[b].row_bytes, want_mx[b]) << mx[b].name;
    const std::vector<BankSpec> f8 = bank_schema(Format::fp8_block, H, I);
    EXPECT_EQ(f8[1].row_bytes, size_t(2 * I / 128 * H / 128 * 2));
    EXPECT_EQ(f8[3].row_bytes, size_t(H / 128 * I / 128 * 2));
    EXPECT_EQ(bank_index(Format::nvfp4, "down_global"), 5);
    EXPECT_EQ(bank_index(Format::mxfp4, "gate_up_bias"), 2);
    EXPECT_EQ(bank_index(Format::bf16, "gate_up_scale"), -1);
}

TEST(Schema, GeometryMustBeWholeBlocks) {
    EXPECT_EQ(format_block(Format::bf16), 1);
    EXPECT_EQ(format_block(Format::fp8_block), 128);
    EXPECT_EQ(format_block(Format::nvfp4), 16);
    EXPECT_EQ(format_block(Format::mxfp4), 32);
    EXPECT_EQ(format_block(Format::ds_fp4), 128);
    EXPECT_EQ(format_block(Format::q4_0), 32);
    EXPECT_TRUE(format_geometry_error(Format::bf16, 72, 20).empty());
    EXPECT_NE(format_geometry_error(Format::nvfp4, 72, 32).find("hidden_size"), std::string::npos);
    EXPECT_NE(format_geometry_error(Format::q4_0, 64, 48).find("intermediate_size"), std::string::npos);
    EXPECT_FALSE(format_geometry_error(Format::ds_fp4, 256, 64).empty());  // 64 is not a 128-group
    try {
        bank_schema(Format::mxfp4, 2880, 2888);
        ADD_FAILURE() << "no throw";
    } catch (const Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_INVALID_ARGUMENT);
    }
}

// Random bank rows of one expert (scales kept finite) and their pointers.
struct Rows {
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<const uint8_t *> ptrs;
};

Rows random_rows(Format f, int64_t H, int64_t I, std::mt19937_64 &g) {
    Rows r;
    for (const BankSpec &b : bank_schema(f, H, I)) {
        std::vector<uint8_t> v(b.row_bytes);
        for (uint8_t &x : v) x = static_cast<uint8_t>(g());
        const bool e8m0 = b.name.find("scale") != std::string::npos && (f == Format::mxfp4 || f == Format::ds_fp4);
        const bool e4m3 = b.name.find("scale") != std::string::npos && f == Format::nvfp4;
        const bool half = b.name.find("global") != std::string::npos;
        const bool bf = b.name.find("bias") != std::string::npos || (f == Format::fp8_block && b.name.find("scale") != std::string::npos);
        if (e8m0)
            for (uint8_t &x : v) x = static_cast<uint8_t>(120 + x % 10);
        if (e4m3)
            for (uint8_t &x : v) x = static_cast<uint8_t>(0x30 + x % 0x20);
        for (size_t i = 0; (half || bf) && i + 1 < v.size(); i += 2) {
            const uint16_t h = half ? f32_to_f16(0.001f * (1 + (v[i] % 16))) : f32_to_bf16(0.01f * (1 + (v[i] % 16)));
            std::memcpy(&v[i], &h, 2);
        }
        if (f == Format::fp8_block && (b.name == "gate_up" || b.name == "down"))
            for (uint8_t &x : v)
                if ((x & 0x7f) == 0x7f) x ^= 1;
        // Block formats: the fp16 d (and dmin) of every block finite, at their offsets in the block.
        if (format_is_block(f)) {
            int offs[2] = {0, -1};
            if (f == Format::q2_k) offs[0] = 80, offs[1] = 82;
            if (f == Format::q3_k) offs[0] = 108;
            if (f == Format::q4_k || f == Format::q5_k) offs[1] = 2;
            if (f == Format::q6_k) offs[0] = 208;
            const size_t bb = static_cast<size_t>(block_bytes(f));
            for (size_t i = 0; i < v.size(); i += bb)
                for (int o : offs)
                    if (o >= 0) {
                        const uint16_t d = f32_to_f16(0.001f * (1 + (v[i] % 16)));
                        std::memcpy(&v[i + static_cast<size_t>(o)], &d, 2);
                    }
        }
        r.bytes.push_back(std::move(v));
    }
    for (const auto &b : r.bytes) r.ptrs.push_back(b.data());
    return r;
}

TEST(Schema, DequantProjectionReadsEachSchema) {
    std::mt19937_64 g(test::fresh_seed("Schema.DequantProjectionReadsEachSchema"));
    const int64_t H = 256;
    for (Format f : {Format::bf16, Format::fp8_block, Format::nvfp4, Format::mxfp4, Format::ds_fp4, Format::q4_0,
                     Format::q8_0, Format::q2_k, Format::q3_k, Format::q4_k, Format::q5_k, Format::q6_k,
                     Format::iq4_xs}) {
        SCOPED_TRACE(format_name(f));
        const int64_t I = format_block(f) == 256 ? 256 : 128;  // the super-block formats need I % 256 == 0
        const Rows r = random_rows(f, H, I, g);
        std::vector<float> gate(H * I), up(H * I), down(H * I), row(std::max(H, I));
        dequant_projection(f, r.ptrs.data(), H, I, FT_PROJ_GATE, gate.data());
        dequant_projection(f, r.ptrs.data(), H, I, FT_PROJ_UP, up.data());
        dequant_projection(f, r.ptrs.data(), H, I, FT_PROJ_DOWN, down.data());
        // Spot rows, each read straight from the bytes by docs/formats.md's layout.
        for (int64_t n : {int64_t(0), I / 2 + 1, I - 1}) {
            switch (f) {
                case Format::nvfp4: {
                    uint16_t gg, gu;
                    std::memcpy(&gg, r.ptrs[2] + n * 2, 2);
                    std::memcpy(&gu, r.ptrs[2] + (I + n) * 2, 2);
                    dequant_row_nvfp4(r.ptrs[0] + n * H / 2, r.ptrs[1] + n * H / 16, gg, H, row.data());
                    for (int64_t k = 0; k < H; ++k) ASSERT_EQ(gate[n * H + k], row[k]);
                    dequant_row_nvfp4(r.ptrs[0] + (I + n) * H / 2, r.ptrs[1] + (I + n) * H / 16, gu, H, row.data());
                    for (int64_t k = 0; k < H; ++k) ASSERT_EQ(up[n * H + k], row[k]);
                    break;
                }
                case Format::mxfp4:
                    dequant_col_mxfp4(r.ptrs[0], r.ptrs[1], H, 2 * I, 2 * n, row.data());
                    for (int64_t k = 0; k < H; ++k) ASSERT_EQ(gate[n * H + k], row[k]);
                    dequant_col_mxfp4(r.ptrs[0], r.ptrs[1], H, 2 * I, 2 * n + 1, row.data());
                    for (int64_t k = 0; k < H; ++k) ASSERT_EQ(up[n * H + k], row[k]);
                    break;
                case Format::ds_fp4:
                    dequant_row_ds_fp4(r.ptrs[0] + (I + n) * H / 2, r.ptrs[1] + (I + n) * H / 32, H, row.data());
                    for (int64_t k = 0; k < H; ++k) ASSERT_EQ(up[n * H + k], row[k]);
                    break;
                case Format::q4_0:
                    dequant_row_q4_0(r.ptrs[0] + (I + n) * (H / 32 * 18), H, row.data());
                    for (int64_t k = 0; k < H; ++k) ASSERT_EQ(up[n * H + k], row[k]);
                    dequant_row_q4_0(r.ptrs[1] + n * (I / 32 * 18), I, row.data());
                    for (int64_t k = 0; k < I; ++k) ASSERT_EQ(down[n * I + k], row[k]);
                    break;
                case Format::q8_0:
                case Format::q2_k:
                case Format::q3_k:
                case Format::q4_k:
                case Format::q5_k:
                case Format::q6_k:
                case Format::iq4_xs: {
                    // Each format's own row function (not the dispatch under test) on the up row
                    // (gate_up row I + n) and down row n.
                    void (*row_fn)(const uint8_t *, int64_t, float *) =
                        f == Format::q8_0   ? dequant_row_q8_0
                        : f == Format::q2_k ? dequant_row_q2_k
                        : f == Format::q3_k ? dequant_row_q3_k
                        : f == Format::q4_k ? dequant_row_q4_k
                        : f == Format::q5_k ? dequant_row_q5_k
                        : f == Format::q6_k ? dequant_row_q6_k
                                            : dequant_row_iq4_xs;
                    const int64_t blk = format_block(f), bb = block_bytes(f);
                    row_fn(r.ptrs[0] + (I + n) * (H / blk * bb), H, row.data());
                    for (int64_t k = 0; k < H; ++k) ASSERT_EQ(up[n * H + k], row[k]);
                    row_fn(r.ptrs[1] + n * (I / blk * bb), I, row.data());
                    for (int64_t k = 0; k < I; ++k) ASSERT_EQ(down[n * I + k], row[k]);
                    break;
                }
                case Format::fp8_block: {
                    uint16_t band[2];  // H / 128 scale columns of the up row's 128-row band
                    std::memcpy(band, r.ptrs[1] + ((I + n) / 128) * (H / 128) * 2, sizeof band);
                    dequant_row_fp8_block(r.ptrs[0] + (I + n) * H, band, H, row.data());
                    for (int64_t k = 0; k < H; ++k) ASSERT_EQ(up[n * H + k], row[k]);
                    break;
                }
                case Format::bf16: {
                    uint16_t v;
                    std::memcpy(&v, r.ptrs[0] + ((I + n) * H + 3) * 2, 2);
                    // Bit patterns: random bf16 bytes may be NaN, which never compares equal.
                    const float want = bf16_to_f32(v), got = up[n * H + 3];
                    ASSERT_EQ(0, std::memcmp(&got, &want, sizeof want)) << got << " vs " << want;
                    break;
                }
            }
        }
        if (f != Format::bf16) {  // random bf16 bytes may be NaN; every other schema's scales are finite
            for (float v : gate) ASSERT_TRUE(std::isfinite(v));
            for (float v : down) ASSERT_TRUE(std::isfinite(v));
        }
        std::vector<float> bias(H);
        EXPECT_EQ(projection_bias(f, r.ptrs.data(), H, I, FT_PROJ_UP, bias.data()), f == Format::mxfp4);
        if (f == Format::mxfp4) {
            uint16_t b3;
            std::memcpy(&b3, r.ptrs[2] + (2 * 3 + 1) * 2, 2);  // up unit 3 is column 7
            EXPECT_EQ(bias[3], bf16_to_f32(b3));
        }
    }
}

}  // namespace
}  // namespace ft
