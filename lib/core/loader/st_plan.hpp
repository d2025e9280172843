// Internal to ft_loader: planning the load of a safetensors checkpoint. st_layout.cpp finds
// where the tensors are (layer prefix, MoE block, expert names, stored format); the Planner
// (st_planner.cpp: primitives and per-layer extras; st_experts.cpp: the routed experts of each
// format) resolves every tensor, checks dtype and shape, and cuts the copies into pieces
// (pieces.hpp) before any byte is read.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "ft/model.hpp"
#include "ft/safetensors.hpp"
#include "pieces.hpp"

namespace ft::load {

using Entry = SafetensorsCheckpoint::Entry;

// The MoE block of one decoder layer: its name ("mlp.", "block_sparse_moe.", "feed_forward.",
// "ffn.") and the per-expert projection names (gate, up, down).
struct Block {
    std::string name;
    const char *proj[3];
};

// The prefix of decoder layer tensors ("model.layers.", "model.language_model.layers.", ...).
std::string find_layer_prefix(const SafetensorsCheckpoint &ckpt, const ModelSpec &spec);

// The MoE block under `layer_prefix` (a decoder layer's prefix, ending in '.').
Block find_block(const SafetensorsCheckpoint &ckpt, const ModelSpec &spec, const std::string &layer_prefix);

// The expert format the tensors of the first MoE layer are stored in, checked against what the
// config declared (spec.format as read_model_config set it).
Format detect_format(const SafetensorsCheckpoint &ckpt, const ModelSpec &spec, const std::string &prefix);

// Whether the experts of a bf16 gpt-oss checkpoint carry the transformers layout with biases.
bool gpt_oss_bf16(const SafetensorsCheckpoint &ckpt, const ModelSpec &spec, const std::string &prefix);

// Resolves tensor names and builds the piece list for one checkpoint.
class Planner {
public:
    Planner(const SafetensorsCheckpoint &ckpt, Model &model, std::string prefix)
        : ckpt_(ckpt), model_(model), spec_(model.spec()), prefix_(std::move(prefix)) {}

    void plan();
    std::vector<Piece> &pieces() { return pieces_; }
    const std::vector<uint64_t> &layer_bytes() const { return layer_bytes_; }

private:
    const Entry &require(const std::string &name, const std::string &why) const;
    // The first of `names` (full names) present, or nullptr.
    const Entry *first_present(std::initializer_list<std::string> names) const;
    void check_shape(const Entry &e, const std::vector<int64_t> &want) const;
    void check_float(const Entry &e) const;
    // Requires one of `allowed` (named in the message).
    void check_dtype(const Entry &e, std::initializer_list<StDtype> allowed) const;

    void plan_layer(int moe_layer, const std::string &layer_prefix);
    void plan_layer_bf16(int moe_layer, const std::string &layer_prefix, const Block &b);
    void plan_fused_bf16(int moe_layer, const Entry &gu, const Entry &dn, bool transposed_only);
    void plan_gpt_oss_bf16(int moe_layer, const std::string &block);
    void plan_layer_fp8_nvfp4(int moe_layer, const std::string &block, const Block &b);
    void plan_layer_mxfp4(int moe_layer, const std::string &block);
    void plan_layer_ds_fp4(int moe_layer, const std::string &block, const Block &b);
    void plan_extras(int moe_layer, const std::string &layer_prefix, const std::string &block);
    void plan_shared(int moe_layer, const std::string &layer_prefix, const std::string &block);

    // `count` source elements of `e` starting at element `first` -> dst as bf16 (or verbatim).
    void add_bf16(const Entry &e, uint64_t first, uint64_t count, uint8_t *dst, int layer);
    // Rows [0, rows) of the [rows, cols] matrix at element `first` of `e` -> dst [cols, rows] bf16;
    // with `deinterleave`, source column c lands in dst row (c % 2) * cols / 2 + c / 2.
    void add_transpose(const Entry &e, uint64_t first, int64_t rows, int64_t cols, uint8_t *dst, int layer,
                       bool deinterleave = false);
    // `count` bytes of `e` from byte `first`, verbatim (checked for e8m0 NaN codes if asked).
    void add_raw(const Entry &e, uint64_t first, uint64_t count, uint8_t *dst, int layer, bool e8m0 = false);
    // Bytes [first, first + rows * cols) of `e` as a [rows, cols] byte matrix -> dst [cols, rows].
    void add_transpose_u8(const Entry &e, uint64_t first, int64_t rows, int64_t cols, uint8_t *dst, int layer,
                          bool e8m0);
    // The scalar `e` (a per-tensor weight_scale_2) -> `count` fp16 copies at dst.
    void add_broadcast_f16(const Entry &e, uint64_t count, uint8_t *dst, int layer);
    // An extra tensor into `t`: bf16 (converted if needed), f32, or kept as stored if bf16/f32.
    // Quantised extras (an fp8_block checkpoint's shared expert) are dequantised to bf16. With
    // `shape` non-empty the tensor's elements are kept and `shape` recorded instead of the stored
    // one (a [1, E] correction bias as [E]). `deinterleave_cols` > 0: rows of that many columns
    // are de-interleaved (even columns first) on the way (f32 only).
    enum class Keep { bf16, f32, stored };
    void add_extra(const Entry &e, Tensor &t, Keep keep, const std::vector<int64_t> &shape = {},
                   int64_t deinterleave_cols = 0);
    // The e4m3 matrix `e` times its 128 x 128 block scales `s` (bf16, f32 or e8m0 [rows/128,
    // cols/128], in the same file) -> t as bf16, through the fp8_block reference dequantiser.
    void add_fp8(const Entry &e, const Entry &s, Tensor &t);
    // DeepSeek-V4's tid2eid of a hash-routed layer ([vocab, K] int32/int64, ids < E) -> x.tid2eid.
    void plan_tid2eid(int moe_layer, const std::string &block);
    void push(Piece p, int layer);

    const SafetensorsCheckpoint &ckpt_;
    Model &model_;
    const ModelSpec &spec_;
    std::string prefix_;
    std::vector<Piece> pieces_;
    std::vector<uint64_t> layer_bytes_;
};

}  // namespace ft::load
