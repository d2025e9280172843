#include "ft/formats.hpp"

#include <cstring>

#include "ft/common.hpp"
#include "ft/dequant.hpp"

namespace ft {

namespace {

struct FormatEntry {
    Format format;
    const char *name;
    int block;
    int block_bytes;  // block formats only
    void (*dequant_row)(const uint8_t *, int64_t, float *);  // block formats only
};

constexpr FormatEntry kFormats[] = {
    {Format::bf16, "bf16", 1, 0, nullptr},
    {Format::fp8_block, "fp8_block", kFp8Block, 0, nullptr},
    {Format::nvfp4, "nvfp4", kNvfp4Block, 0, nullptr},
    {Format::mxfp4, "mxfp4", kMxfp4Block, 0, nullptr},
    // ds_fp4's weight block is 32, but its activations are FP8-round-tripped per 128 before each
    // GEMM, so both GEMM inputs (H and I) must be whole 128-groups.
    {Format::ds_fp4, "ds_fp4", kFp8ActBlock, 0, nullptr},
    {Format::q4_0, "q4_0", kQ4_0Block, kQ4_0BlockBytes, dequant_row_q4_0},
    {Format::q8_0, "q8_0", 32, kQ8_0BlockBytes, dequant_row_q8_0},
    {Format::q2_k, "q2_k", kQK, kQ2_KBlockBytes, dequant_row_q2_k},
    {Format::q3_k, "q3_k", kQK, kQ3_KBlockBytes, dequant_row_q3_k},
    {Format::q4_k, "q4_k", kQK, kQ4_KBlockBytes, dequant_row_q4_k},
    {Format::q5_k, "q5_k", kQK, kQ5_KBlockBytes, dequant_row_q5_k},
    {Format::q6_k, "q6_k", kQK, kQ6_KBlockBytes, dequant_row_q6_k},
    {Format::iq4_xs, "iq4_xs", kQK, kIQ4_XSBlockBytes, dequant_row_iq4_xs},
};

const FormatEntry &entry(Format f) {
    for (const FormatEntry &e : kFormats)
        if (e.format == f) return e;
    fail(FT_ERR_INTERNAL, "unhandled format value ", static_cast<int32_t>(f));
}

size_t sz(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

const char *format_name(Format f) {
    for (const FormatEntry &e : kFormats)
        if (e.format == f) return e.name;
    return "unknown";
}

Format parse_format(const std::string &name) {
    for (const FormatEntry &e : kFormats)
        if (name == e.name) return e.format;
    std::string names;
    for (const FormatEntry &e : kFormats) names += cat(names.empty() ? "" : ", ", e.name);
    fail(FT_ERR_INVALID_ARGUMENT, "unknown expert format '", name, "' (supported: ", names, ")");
}

bool format_valid(int32_t value) { return value == FT_FORMAT_BF16; }

bool format_known(int32_t value) {
    for (const FormatEntry &e : kFormats)
        if (static_cast<int32_t>(e.format) == value) return true;
    return false;
}

int format_block(Format f) { return entry(f).block; }

bool format_is_block(Format f) { return format_known(static_cast<int32_t>(f)) && entry(f).block_bytes > 0; }

int block_bytes(Format f) { return format_known(static_cast<int32_t>(f)) ? entry(f).block_bytes : 0; }

size_t block_row_bytes(Format f, int64_t K) {
    const FormatEntry &e = entry(f);
    if (e.block_bytes == 0) fail(FT_ERR_INTERNAL, "block_row_bytes: ", e.name, " is not a block format");
    return sz(K / e.block) * sz(e.block_bytes);
}

void dequant_row_block(Format f, const uint8_t *row, int64_t K, float *out) {
    const FormatEntry &e = entry(f);
    if (e.dequant_row == nullptr) fail(FT_ERR_INTERNAL, "dequant_row_block: ", e.name, " is not a block format");
    e.dequant_row(row, K, out);
}

std::string format_geometry_error(Format f, int64_t hidden, int64_t intermediate) {
    const int b = format_block(f);
    if (hidden <= 0 || intermediate <= 0) return "hidden and intermediate sizes must be positive";
    if (hidden % b != 0) return cat(format_name(f), " needs hidden_size to be a multiple of ", b, ", got ", hidden);
    if (intermediate % b != 0)
        return cat(format_name(f), " needs intermediate_size to be a multiple of ", b, ", got ", intermediate);
    return {};
}

std::vector<BankSpec> bank_schema(Format f, int64_t H, int64_t I) {
    const std::string err = format_geometry_error(f, H, I);
    if (!err.empty()) fail(FT_ERR_INVALID_ARGUMENT, "bank schema: ", err);
    switch (f) {
        case Format::bf16: return {{"gate_up", sz(2 * I * H * 2)}, {"down", sz(H * I * 2)}};
        case Format::fp8_block:
            return {{"gate_up", sz(2 * I * H)},
                    {"gate_up_scale", sz((2 * I / kFp8Block) * (H / kFp8Block) * 2)},
                    {"down", sz(H * I)},
                    {"down_scale", sz((H / kFp8Block) * (I / kFp8Block) * 2)}};
        case Format::nvfp4:
            return {{"gate_up_packed", sz(2 * I * H / 2)}, {"gate_up_scale", sz(2 * I * H / kNvfp4Block)},
                    {"gate_up_global", sz(2 * I * 2)},     {"down_packed", sz(H * I / 2)},
                    {"down_scale", sz(H * I / kNvfp4Block)}, {"down_global", sz(H * 2)}};
        case Format::mxfp4:
            return {{"gate_up_blocks", sz(H / 2 * 2 * I)}, {"gate_up_scales", sz(H / kMxfp4Block * 2 * I)},
                    {"gate_up_bias", sz(2 * I * 2)},       {"down_blocks", sz(I / 2 * H)},
                    {"down_scales", sz(I / kMxfp4Block * H)}, {"down_bias", sz(H * 2)}};
        case Format::ds_fp4:
            return {{"gate_up_packed", sz(2 * I * H / 2)}, {"gate_up_scale", sz(2 * I * H / kDsfp4Block)},
                    {"down_packed", sz(H * I / 2)},        {"down_scale", sz(H * I / kDsfp4Block)}};
        case Format::q4_0:
        case Format::q8_0:
        case Format::q2_k:
        case Format::q3_k:
        case Format::q4_k:
        case Format::q5_k:
        case Format::q6_k:
        case Format::iq4_xs: return {{"gate_up", 2 * sz(I) * block_row_bytes(f, H)}, {"down", sz(H) * block_row_bytes(f, I)}};
    }
    fail(FT_ERR_INTERNAL, "bank_schema: unhandled format");
}

int bank_index(Format f, const std::string &name) {
    // Block sizes do not change names; the smallest valid geometry gives the schema.
    const int64_t b = format_block(f);
    const std::vector<BankSpec> schema = bank_schema(f, b, b);
    for (size_t i = 0; i < schema.size(); ++i)
        if (schema[i].name == name) return static_cast<int>(i);
    return -1;
}

size_t expert_bytes(Format f, int64_t hidden, int64_t intermediate) {
    size_t total = 0;
    for (const BankSpec &b : bank_schema(f, hidden, intermediate)) total += b.row_bytes;
    return total;
}

void dequant_projection(Format f, const uint8_t *const *rows, int64_t H, int64_t I, int proj, float *out) {
    if (proj != FT_PROJ_GATE && proj != FT_PROJ_UP && proj != FT_PROJ_DOWN)
        fail(FT_ERR_INVALID_ARGUMENT, "dequant_projection: unknown projection ", proj);
    const std::string err = format_geometry_error(f, H, I);
    if (!err.empty()) fail(FT_ERR_INVALID_ARGUMENT, "dequant_projection: ", err);
    const bool down = proj == FT_PROJ_DOWN;
    // Output rows and their length (the reduction dimension) of this projection.
    const int64_t N = down ? H : I, K = down ? I : H;
    // First output row inside the fused gate_up bank (row-fused formats).
    const int64_t row0 = proj == FT_PROJ_UP ? I : 0;

    switch (f) {
        case Format::bf16: {
            const uint8_t *base = rows[down ? 1 : 0] + sz(row0 * K * 2);
            for (int64_t i = 0; i < N * K; ++i) {
                uint16_t v;
                std::memcpy(&v, base + i * 2, 2);
                out[i] = bf16_to_f32(v);
            }
            return;
        }
        case Format::fp8_block: {
            const uint8_t *w = rows[down ? 2 : 0];
            const uint8_t *sc = rows[down ? 3 : 1];
            const int64_t kb = K / kFp8Block;
            std::vector<uint16_t> band(sz(kb));
            for (int64_t n = 0; n < N; ++n) {
                const int64_t r = row0 + n;
                std::memcpy(band.data(), sc + sz((r / kFp8Block) * kb * 2), sz(kb * 2));
                dequant_row_fp8_block(w + sz(r * K), band.data(), K, out + n * K);
            }
            return;
        }
        case Format::nvfp4: {
            const uint8_t *packed = rows[down ? 3 : 0];
            const uint8_t *scale = rows[down ? 4 : 1];
            const uint8_t *global = rows[down ? 5 : 2];
            for (int64_t n = 0; n < N; ++n) {
                const int64_t r = row0 + n;
                uint16_t g;
                std::memcpy(&g, global + r * 2, 2);
                dequant_row_nvfp4(packed + sz(r * K / 2), scale + sz(r * K / kNvfp4Block), g, K, out + n * K);
            }
            return;
        }
        case Format::ds_fp4: {
            const uint8_t *packed = rows[down ? 2 : 0];
            const uint8_t *scale = rows[down ? 3 : 1];
            for (int64_t n = 0; n < N; ++n) {
                const int64_t r = row0 + n;
                dequant_row_ds_fp4(packed + sz(r * K / 2), scale + sz(r * K / kDsfp4Block), K, out + n * K);
            }
            return;
        }
        case Format::q4_0:
        case Format::q8_0:
        case Format::q2_k:
        case Format::q3_k:
        case Format::q4_k:
        case Format::q5_k:
        case Format::q6_k:
        case Format::iq4_xs: {
            const uint8_t *base = rows[down ? 1 : 0];
            const size_t row_bytes = block_row_bytes(f, K);
            for (int64_t n = 0; n < N; ++n) dequant_row_block(f, base + sz(row0 + n) * row_bytes, K, out + n * K);
            return;
        }
        case Format::mxfp4: {
            const uint8_t *blocks = rows[down ? 3 : 0];
            const uint8_t *scales = rows[down ? 4 : 1];
            const int64_t cols = down ? H : 2 * I;  // N of the stored matrix
            for (int64_t n = 0; n < N; ++n) {
                const int64_t col = down ? n : 2 * n + (proj == FT_PROJ_UP ? 1 : 0);
                dequant_col_mxfp4(blocks, scales, K, cols, col, out + n * K);
            }
            return;
        }
    }
    fail(FT_ERR_INTERNAL, "dequant_projection: unhandled format");
}

bool projection_bias(Format f, const uint8_t *const *rows, int64_t H, int64_t I, int proj, float *out) {
    if (f != Format::mxfp4) return false;
    const bool down = proj == FT_PROJ_DOWN;
    const uint8_t *bias = rows[down ? 5 : 2];
    const int64_t n_out = down ? H : I;
    for (int64_t n = 0; n < n_out; ++n) {
        const int64_t idx = down ? n : 2 * n + (proj == FT_PROJ_UP ? 1 : 0);
        uint16_t v;
        std::memcpy(&v, bias + idx * 2, 2);
        out[n] = bf16_to_f32(v);
    }
    return true;
}

}  // namespace ft
