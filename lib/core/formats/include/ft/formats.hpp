// Expert weight formats: the banks each format stores per expert (docs/formats.md) and their sizes,
// plus the reference dequantisation of a whole projection from those banks. The element and row
// numerics live in ft/dequant.hpp (one place for every format).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "freetoken.h"

namespace ft {

// Format ids: the public FT_FORMAT_* values.
enum class Format : int32_t {
    bf16 = FT_FORMAT_BF16,
    fp8_block = FT_FORMAT_FP8_BLOCK,  // e4m3fn weights, bf16 scale_inv per 128 x 128 tile (DeepSeek-V3, Qwen3.5-FP8)
    nvfp4 = FT_FORMAT_NVFP4,          // ModelOpt NVFP4: e2m1, e4m3 scale per 16, fp16 global per output row
    mxfp4 = FT_FORMAT_MXFP4,          // gpt-oss MXFP4: transposed e2m1 blocks, e8m0 scale per 32 along K, bf16 bias
    ds_fp4 = FT_FORMAT_DS_FP4,        // DeepSeek-V4: e2m1, e8m0 scale per 32, row-major
    q4_0 = FT_FORMAT_Q4_0,            // GGUF Q4_0: 18-byte blocks of 32
    // GGUF (ggml) block formats, each stored verbatim as the file has it (docs/formats.md):
    q8_0 = FT_FORMAT_Q8_0,            // 34-byte blocks of 32
    q2_k = FT_FORMAT_Q2_K,            // 84-byte super-blocks of 256
    q3_k = FT_FORMAT_Q3_K,            // 110-byte super-blocks of 256
    q4_k = FT_FORMAT_Q4_K,            // 144-byte super-blocks of 256
    q5_k = FT_FORMAT_Q5_K,            // 176-byte super-blocks of 256
    q6_k = FT_FORMAT_Q6_K,            // 210-byte super-blocks of 256
    iq4_xs = FT_FORMAT_IQ4_XS,        // 136-byte super-blocks of 256
};

const char *format_name(Format f);
// Parses a format_name() ("bf16", "fp8_block", ..., "q4_k", "iq4_xs"); throws
// FT_ERR_INVALID_ARGUMENT naming the supported ones for anything else.
Format parse_format(const std::string &name);
// True for the formats a model built from memory can take (ft_model_create): bf16 only, since
// ft_model_set_expert passes bf16 projections.
bool format_valid(int32_t value);
// True for every internal Format value above.
bool format_known(int32_t value);

// GGUF block formats (q4_0, q8_0, the K-quants, iq4_xs): two banks, gate_up and down, each row a
// run of the format's blocks along K. Only these formats mix inside one model (ModelSpec's
// layer_formats).
bool format_is_block(Format f);
// Elements per int8 scale of the activation that the block formats' integer-dot kernels (CPU and
// GPU) multiply with, as ggml does: 32 (Q8_0, ft::quantize_q8_0) for q4_0 and q8_0, 256 (Q8_K,
// ft::quantize_q8_k) for the super-block formats; 0 for the other formats.
constexpr int format_act_block(Format f) {
    switch (f) {
        case Format::q4_0:
        case Format::q8_0: return 32;
        case Format::q2_k:
        case Format::q3_k:
        case Format::q4_k:
        case Format::q5_k:
        case Format::q6_k:
        case Format::iq4_xs: return 256;
        default: return 0;
    }
}
// Bytes of one block of a block format (q4_0: 18 per 32 elements, q4_k: 144 per 256, ...); 0 for
// the others.
int block_bytes(Format f);
// Bytes of one row of K elements of a block format (K a multiple of format_block(f)).
size_t block_row_bytes(Format f, int64_t K);
// The reference dequantisation (ft/dequant.hpp) of one row of a block format.
void dequant_row_block(Format f, const uint8_t *row, int64_t K, float *out);

// The multiple that H and I must be for `f` (its block along the reduction dimension; for
// fp8_block the 128 x 128 tile, for ds_fp4 the 128-element activation FP8 group). bf16: 1.
// Partial last blocks are not supported in any format (see ft/dequant.hpp).
int format_block(Format f);
// Empty when (H, I) suits `f`, else a sentence saying which dimension breaks which block.
std::string format_geometry_error(Format f, int64_t hidden, int64_t intermediate);

// One bank of a format: `row_bytes` bytes per expert, the same in every layer.
struct BankSpec {
    std::string name;
    size_t row_bytes = 0;
};

// Banks in registration order, per expert ("row"):
//   bf16       0 gate_up [2I, H] bf16 (gate rows, then up rows)   1 down [H, I] bf16
//   fp8_block  0 gate_up [2I, H] e4m3       1 gate_up_scale [2I/128, H/128] bf16 scale_inv
//              2 down [H, I] e4m3           3 down_scale [H/128, I/128] bf16
//   nvfp4      0 gate_up_packed [2I, H/2] u8   1 gate_up_scale [2I, H/16] e4m3
//              2 gate_up_global [2I] fp16 (gate rows keep w1's weight_scale_2, up rows w3's)
//              3 down_packed [H, I/2] u8       4 down_scale [H, I/16] e4m3   5 down_global [H] fp16
//   mxfp4      0 gate_up_blocks [H/2, 2I] u8 (N innermost; column 2j = gate unit j, 2j+1 = up unit j)
//              1 gate_up_scales [H/32, 2I] e8m0   2 gate_up_bias [2I] bf16 (interleaved the same way)
//              3 down_blocks [I/2, H] u8          4 down_scales [I/32, H] e8m0   5 down_bias [H] bf16
//   ds_fp4     0 gate_up_packed [2I, H/2] u8   1 gate_up_scale [2I, H/32] e8m0
//              2 down_packed [H, I/2] u8       3 down_scale [H, I/32] e8m0
//   q4_0       0 gate_up [2I, (H/32)*18] u8 (GGUF blocks)   1 down [H, (I/32)*18] u8
//   q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs: the same two banks, block_row_bytes(f, H) and
//              block_row_bytes(f, I) per row
// Every format but mxfp4 fuses gate/up by output rows: rows [0, I) gate, [I, 2I) up.
// Throws FT_ERR_INVALID_ARGUMENT when H or I is not a multiple of format_block(f).
std::vector<BankSpec> bank_schema(Format f, int64_t hidden, int64_t intermediate);

// Index of bank `name` in f's schema, -1 if the format has none.
int bank_index(Format f, const std::string &name);

// Bytes of one expert across all banks of the format.
size_t expert_bytes(Format f, int64_t hidden, int64_t intermediate);

// Reference dequantisation of one projection of one expert. `rows[b]` points at the expert's row
// in bank b (schema order). proj: FT_PROJ_GATE / FT_PROJ_UP -> out [I, H], FT_PROJ_DOWN ->
// out [H, I], row-major fp32 (for mxfp4 the gate/up units are de-interleaved: gate row j is
// gate_up column 2j). Biases are not included; see projection_bias.
void dequant_projection(Format f, const uint8_t *const *rows, int64_t hidden, int64_t intermediate, int proj,
                        float *out);

// The per-output bias of a projection (mxfp4 only: gate/up [I], down [H]); false if the format
// has no biases (out untouched).
bool projection_bias(Format f, const uint8_t *const *rows, int64_t hidden, int64_t intermediate, int proj,
                     float *out);

}  // namespace ft
