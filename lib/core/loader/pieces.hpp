// Internal to ft_loader: the unit of work of checkpoint loading. A plan (built by a format's
// planner before any byte is read, so every error comes first) is a list of pieces; execute()
// runs them on parallel readers, each piece pread-ing or converting at most kPieceBytes of one
// source tensor straight into its place (a bank row or an extra tensor) with no intermediate copy
// of the whole tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ft/formats.hpp"
#include "ft/loader.hpp"

namespace ft::load {

constexpr uint64_t kPieceBytes = 8ull << 20;

// Element types a piece reads (safetensors and GGUF sources map onto these).
enum class Src { BF16, F16, F32, U8 };
size_t src_size(Src s);

// What a piece does with its source bytes.
enum class Op {
    copy,           // bytes verbatim (pread); with check_e8m0, then rejects any 255 byte
    to_bf16,        // f16 / f32 elements -> bf16, rounded to nearest even (element i to dst[i * col_step])
    to_f32,         // bf16 / f16 / f32 elements -> f32
    transpose,      // rows [row_begin, row_end) of a [rows, cols] matrix -> columns of a [cols, rows] bf16 matrix
    transpose_u8,   // the same for bytes, verbatim (mxfp4 blocks and scales); honours check_e8m0
    broadcast_f16,  // one bf16/f16/f32 scalar -> dst_bytes / 2 copies as IEEE half
    fp8_to_bf16,    // rows [row_begin, row_end) of an e4m3 [rows, cols] matrix times its 128x128
                    // scale_inv tiles (second source, bf16/f32 [rows/128, cols/128], or e8m0
                    // bytes with scale_e8m0) -> bf16
    block_to_bf16,  // rows [row_begin, row_end) of `cols` elements of block format `fmt`, dequantised
                    // by the reference (ft/dequant.hpp) and rounded to bf16 -> dst, row-major
    ids_to_i32,     // src_bytes of little-endian integers of id_width bytes (4 or 8) -> int32 at dst,
                    // each checked in [0, id_limit) (FT_ERR_FORMAT naming the tensor otherwise)
    ggml_mxfp4,     // rows [row_begin, row_end) of ggml MXFP4 blocks (17 bytes per 32 elements: e8m0,
                    // then byte j = element j low nibble, element j + 16 high nibble), `cols`
                    // elements per row, into the transposed mxfp4 banks: row r becomes column
                    // col_first + r * col_step of dst (blocks [cols/2, dst_cols], element 2i low
                    // nibble) and of dst2 (e8m0 scales [cols/32, dst_cols]); honours check_e8m0
    ggml_mxfp4_to_bf16,  // rows [row_begin, row_end) of ggml MXFP4 blocks, `cols` elements each,
                         // dequantised like the mxfp4 banks (dequant_col_mxfp4) and rounded to
                         // bf16 -> dst, row-major; honours check_e8m0
};

// Where a piece reads from: an open, mapped file.
struct Source {
    int fd = -1;
    const uint8_t *map = nullptr;
    const std::string *path = nullptr;
};

struct Piece {
    Source file;
    const std::string *tensor = nullptr;  // for error messages
    Src src = Src::BF16;
    uint64_t src_offset = 0;  // absolute file offset of this piece's first source byte
    uint64_t src_bytes = 0;
    uint8_t *dst = nullptr;   // for transpose ops: the whole destination matrix
    uint64_t dst_bytes = 0;   // bytes this piece writes
    Op op = Op::copy;
    bool check_e8m0 = false;
    // transpose: source column c goes to destination row (c % 2) * cols / 2 + c / 2 (gate/up
    // columns interleaved -> gate rows then up rows). to_f32: the same within each row of `cols`.
    bool deinterleave = false;
    int64_t rows = 0, cols = 0, row_begin = 0, row_end = 0;  // transposes, fp8_to_bf16
    Src src2 = Src::BF16;     // fp8_to_bf16: the scale tensor
    uint64_t src2_offset = 0; //   (absolute offset of its first element)
    bool scale_e8m0 = false;  // fp8_to_bf16: the scales are e8m0 bytes (2^(b - 127); 255 rejected)
    int32_t id_width = 0;     // ids_to_i32
    int64_t id_limit = 0;
    Format fmt = Format::bf16;  // block_to_bf16
    uint8_t *dst2 = nullptr;    // ggml_mxfp4: the scale bank
    int64_t dst_cols = 0, col_first = 0, col_step = 1;  // ggml_mxfp4; to_bf16 uses col_step
    int moe_layer = -1;       // whose bank bytes these are; -1 for extras
};

// Runs the pieces on `threads` workers while this thread reports progress; layer_bytes[l] is the
// sum of dst_bytes of the pieces of MoE layer l (for on_layer_filled).
void execute(std::vector<Piece> &pieces, const std::vector<uint64_t> &layer_bytes, int threads,
             const LoadOptions &opts);

// Number of reader threads for `pieces` under `opts`.
int reader_threads(const LoadOptions &opts, size_t pieces);

std::string shape_str(const std::vector<int64_t> &shape);

// The GGUF half of load_checkpoint (gguf_loader.cpp).
std::unique_ptr<Model> load_gguf(const std::string &path, const LoadOptions &opts);

}  // namespace ft::load
