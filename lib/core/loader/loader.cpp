// Checkpoint -> Model. Loading runs in two phases: a plan that resolves every tensor, checks its
// dtype and shape and cuts the copies into pieces of at most kPieceBytes (so that all errors come
// before any I/O and a few huge fused tensors still keep every reader busy), then parallel readers
// (pieces.cpp) that pread each piece straight into its bank row (or convert it from the read-only
// mapping).
//
// Expert formats come from the tensors found (the config's quantization_config must agree):
// bf16/f16/f32 per-expert or fused tensors -> bf16 banks; `weight` + `weight_scale_inv` ->
// fp8_block; `weight` + `weight_scale` + `weight_scale_2` -> nvfp4 (ModelOpt); gpt-oss
// `*_blocks` / `*_scales` / `*_bias` -> mxfp4; DeepSeek-V4 `{w1,w2,w3}.{weight,scale}` -> ds_fp4.
// GGUF files go through gguf_loader.cpp.
#include "ft/loader.hpp"

#include <sys/stat.h>
#include <dirent.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "ft/safetensors.hpp"
#include "pieces.hpp"

namespace ft {

namespace {

using load::Op;
using load::Piece;
using load::Src;
using load::kPieceBytes;
using load::shape_str;
using Entry = SafetensorsCheckpoint::Entry;

load::Source source_of(const Entry &e) { return {e.file->fd(), e.file->mapping(), &e.file->path()}; }

// How the planner reads a safetensors dtype: floats as themselves, every 1-byte type as raw bytes.
Src src_of(StDtype d) {
    switch (d) {
        case StDtype::BF16: return Src::BF16;
        case StDtype::F16: return Src::F16;
        case StDtype::F32: return Src::F32;
        case StDtype::U8: case StDtype::I8: case StDtype::F8_E4M3: case StDtype::F8_E8M0: return Src::U8;
        default: fail(FT_ERR_INTERNAL, "src_of: dtype ", st_dtype_name(d), " is not read by the planner");
    }
}

bool starts_with(const std::string &s, const std::string &p) { return s.compare(0, p.size(), p) == 0; }

bool has_prefix(const std::vector<std::string> &sorted_names, const std::string &prefix) {
    auto it = std::lower_bound(sorted_names.begin(), sorted_names.end(), prefix);
    return it != sorted_names.end() && starts_with(*it, prefix);
}

// The prefix of decoder layer tensors ("model.layers.", ...).
std::string find_layer_prefix(const SafetensorsCheckpoint &ckpt, const ModelSpec &spec) {
    // Text-only exports say model.layers.N; multimodal ones (Qwen3.5/3.6) put the language model
    // under model.language_model. or language_model.model.; DeepSeek-V4 has no model. prefix.
    std::vector<const char *> candidates = {"model.layers.", "model.language_model.layers.",
                                            "language_model.model.layers.", "language_model.layers."};
    if (spec.architecture == "deepseek_v4") candidates = {"layers."};
    const std::vector<std::string> &names = ckpt.names();
    std::vector<std::string> present;
    for (const char *c : candidates)
        if (has_prefix(names, c)) present.push_back(c);
    if (present.size() == 1) return present[0];
    if (present.empty())
        fail(FT_ERR_FORMAT, ckpt.dir(), ": no decoder layer tensors found (looked for ",
             spec.architecture == "deepseek_v4" ? "layers.*" : "model.layers.*, model.language_model.layers.*, "
             "language_model.model.layers.*", ")");
    // Several: keep those that hold the first MoE layer's experts.
    std::vector<std::string> with_experts;
    const std::string l0 = std::to_string(spec.moe_layers[0]) + ".";
    for (const std::string &p : present) {
        for (const char *block : {"mlp.experts.", "block_sparse_moe.experts."}) {
            if (has_prefix(names, p + l0 + block)) {
                with_experts.push_back(p);
                break;
            }
        }
    }
    if (with_experts.size() == 1) return with_experts[0];
    fail(FT_ERR_FORMAT, ckpt.dir(), ": decoder layers appear under both '", present[0], "' and '", present[1],
         "'; cannot tell which is the language model");
}

// Mixtral's original exports use block_sparse_moe.{w1,w3,w2}; DeepSeek-V4 ffn.{w1,w3,w2};
// everything else (and Mixtral as rewritten by newer transformers) mlp.{gate,up,down}_proj.
struct Block {
    std::string name;             // "mlp." ...
    const char *proj[3];          // gate, up, down
};

Block find_block(const SafetensorsCheckpoint &ckpt, const ModelSpec &spec, const std::string &layer_prefix) {
    if (spec.architecture == "deepseek_v4") return {"ffn.", {"w1", "w3", "w2"}};
    std::vector<std::string> blocks = {"mlp."};
    if (spec.architecture == "mixtral") blocks.insert(blocks.begin(), "block_sparse_moe.");
    std::string name = blocks[0];
    for (const std::string &b : blocks) {
        const std::string cand = layer_prefix + b;
        if (ckpt.contains(cand + "gate.weight") || ckpt.contains(cand + "experts.gate_up_proj") ||
            ckpt.contains(cand + "experts.0.w1.weight")) {
            name = b;
            break;
        }
    }
    if (name == "block_sparse_moe.") return {name, {"w1", "w3", "w2"}};
    return {name, {"gate_proj", "up_proj", "down_proj"}};
}

// The expert format the tensors of the first MoE layer are stored in; checked against what the
// config's quantization_config declared (spec.format as read_model_config set it).
Format detect_format(const SafetensorsCheckpoint &ckpt, const ModelSpec &spec, const std::string &prefix) {
    const std::string lp = prefix + std::to_string(spec.moe_layers[0]) + ".";
    const Block b = find_block(ckpt, spec, lp);
    const std::string experts = lp + b.name + "experts.";
    Format found = Format::bf16;
    std::string evidence;
    if (spec.architecture == "gpt_oss") {
        if (ckpt.contains(experts + "gate_up_proj_blocks")) {
            found = Format::mxfp4;
            evidence = experts + "gate_up_proj_blocks";
        } else if (ckpt.contains(experts + "gate_up_proj")) {
            // The dequantised bf16 release: interleaved gate/up columns plus per-expert biases,
            // which the bf16 banks have no place for.
            fail(FT_ERR_UNSUPPORTED, ckpt.dir(), ": tensor '", experts,
                 "gate_up_proj': gpt-oss with bf16 experts is not supported (its biases have no bf16 bank); "
                 "use the MXFP4 release");
        } else {
            fail(FT_ERR_FORMAT, ckpt.dir(), ": missing tensor '", experts,
                 "gate_up_proj_blocks' (gpt-oss MXFP4 routed experts)");
        }
    } else {
        const std::string first = experts + "0." + b.proj[0] + ".";
        if (ckpt.contains(first + "weight_scale_2")) {
            found = Format::nvfp4;
            evidence = first + "weight_scale_2";
        } else if (ckpt.contains(first + "weight_scale_inv")) {
            found = Format::fp8_block;
            evidence = first + "weight_scale_inv";
        } else if (spec.architecture == "deepseek_v4") {
            if (!ckpt.contains(first + "scale"))
                fail(FT_ERR_FORMAT, ckpt.dir(), ": missing tensor '", first,
                     "scale' (DeepSeek-V4 FP4 experts carry an e8m0 scale per 32 weights)");
            found = Format::ds_fp4;
            evidence = first + "scale";
        } else if (const Entry *w = ckpt.find(first + "weight")) {
            const StDtype d = w->info->dtype;
            if (d == StDtype::F8_E4M3)
                fail(FT_ERR_FORMAT, w->file->path(), ": tensor '", w->info->name,
                     "' is F8_E4M3 but its block scales '", first, "weight_scale_inv' are missing");
            if (d == StDtype::U8 || d == StDtype::I8)
                fail(FT_ERR_FORMAT, w->file->path(), ": tensor '", w->info->name, "' holds packed ",
                     st_dtype_name(d), " codes but neither '", first, "weight_scale' + 'weight_scale_2' (NVFP4) nor "
                     "a scale tensor is present");
        }
    }
    if (spec.format != Format::bf16 && spec.format != found)
        fail(FT_ERR_FORMAT, ckpt.dir(), ": config.json declares ", format_name(spec.format),
             " experts but the tensors are ", format_name(found),
             evidence.empty() ? std::string() : " ('" + evidence + "')");
    return found;
}

// Resolves tensor names and builds the piece list for one checkpoint.
class Planner {
public:
    Planner(const SafetensorsCheckpoint &ckpt, Model &model, std::string prefix)
        : ckpt_(ckpt), model_(model), spec_(model.spec()), prefix_(std::move(prefix)) {}

    void plan();
    std::vector<Piece> &pieces() { return pieces_; }
    const std::vector<uint64_t> &layer_bytes() const { return layer_bytes_; }

private:
    const Entry &require(const std::string &name, const std::string &why) const {
        const Entry *e = ckpt_.find(name);
        if (!e) fail(FT_ERR_FORMAT, ckpt_.dir(), ": missing tensor '", name, "' (", why, ")");
        return *e;
    }
    void check_shape(const Entry &e, const std::vector<int64_t> &want) const {
        if (e.info->shape != want)
            fail(FT_ERR_FORMAT, e.file->path(), ": tensor '", e.info->name, "': expected shape ", shape_str(want),
                 ", got ", shape_str(e.info->shape));
    }
    void check_float(const Entry &e) const {
        const StDtype d = e.info->dtype;
        if (d != StDtype::BF16 && d != StDtype::F16 && d != StDtype::F32)
            fail(FT_ERR_UNSUPPORTED, e.file->path(), ": tensor '", e.info->name, "': dtype ", st_dtype_name(d),
                 " is not supported (BF16, F16, F32)");
    }
    // Requires one of `allowed` (named in the message).
    void check_dtype(const Entry &e, std::initializer_list<StDtype> allowed) const {
        for (StDtype d : allowed)
            if (e.info->dtype == d) return;
        std::string names;
        for (StDtype d : allowed) names += std::string(names.empty() ? "" : ", ") + st_dtype_name(d);
        fail(FT_ERR_FORMAT, e.file->path(), ": tensor '", e.info->name, "': dtype ", st_dtype_name(e.info->dtype),
             " where ", names, " is expected");
    }
    // A [rows, K]-weight tensor whose stored K per row must be whole blocks of `block`.
    void check_block_multiple(const Entry &e, int64_t k, int block) const {
        if (k % block != 0)
            fail(FT_ERR_FORMAT, e.file->path(), ": tensor '", e.info->name, "': input dimension ", k,
                 " is not a multiple of the ", format_name(spec_.format), " block of ", block,
                 " (partial blocks are not supported)");
    }

    void plan_layer(int moe_layer, const std::string &prefix);
    void plan_layer_bf16(int moe_layer, const std::string &layer_prefix);
    void plan_layer_fp8_nvfp4(int moe_layer, const std::string &block, const Block &b);
    void plan_layer_mxfp4(int moe_layer, const std::string &block);
    void plan_layer_ds_fp4(int moe_layer, const std::string &block, const Block &b);
    void plan_extras(int moe_layer, const std::string &block);

    // `bytes` source bytes of `e` starting at element `first` -> dst as bf16 (or verbatim).
    void add_bf16(const Entry &e, uint64_t first, uint64_t count, uint8_t *dst, int layer);
    void add_transpose(const Entry &e, uint64_t first, int64_t rows, int64_t cols, uint8_t *dst, int layer);
    // `count` bytes of `e` from byte `first`, verbatim (checked for e8m0 NaN codes if asked).
    void add_raw(const Entry &e, uint64_t first, uint64_t count, uint8_t *dst, int layer, bool e8m0 = false);
    // Bytes [first, first + rows * cols) of `e` as a [rows, cols] byte matrix -> dst [cols, rows].
    void add_transpose_u8(const Entry &e, uint64_t first, int64_t rows, int64_t cols, uint8_t *dst, int layer,
                          bool e8m0);
    // The scalar `e` (a per-tensor weight_scale_2) -> `count` fp16 copies at dst.
    void add_broadcast_f16(const Entry &e, uint64_t count, uint8_t *dst, int layer);
    // An extra tensor into `t`: bf16 (converted if needed), f32, or kept as stored if bf16/f32.
    // Quantised extras (an fp8_block checkpoint's shared expert) are dequantised to bf16.
    enum class Keep { bf16, f32, stored };
    void add_extra(const Entry &e, Tensor &t, Keep keep);
    void push(Piece p, int layer);

    const SafetensorsCheckpoint &ckpt_;
    Model &model_;
    const ModelSpec &spec_;
    std::string prefix_;
    std::vector<Piece> pieces_;
    std::vector<uint64_t> layer_bytes_;
};

void Planner::plan() {
    layer_bytes_.assign(spec_.num_layers, 0);
    for (int l = 0; l < spec_.num_layers; ++l) plan_layer(l, prefix_ + std::to_string(spec_.moe_layers[l]) + ".");
}

void Planner::push(Piece p, int layer) {
    p.moe_layer = layer;
    if (layer >= 0) layer_bytes_[layer] += p.dst_bytes;
    pieces_.push_back(p);
}

void Planner::add_bf16(const Entry &e, uint64_t first, uint64_t count, uint8_t *dst, int layer) {
    const Src dt = src_of(e.info->dtype);
    const size_t es = load::src_size(dt);
    const uint64_t per_piece = std::max<uint64_t>(1, kPieceBytes / es);
    for (uint64_t done = 0; done < count; done += per_piece) {
        const uint64_t n = std::min(per_piece, count - done);
        Piece p;
        p.file = source_of(e);
        p.tensor = &e.info->name;
        p.src = dt;
        p.src_offset = e.info->file_offset + (first + done) * es;
        p.src_bytes = n * es;
        p.dst = dst + done * 2;
        p.dst_bytes = n * 2;
        p.op = dt == Src::BF16 ? Op::copy : Op::to_bf16;
        push(p, layer);
    }
}

void Planner::add_transpose(const Entry &e, uint64_t first, int64_t rows, int64_t cols, uint8_t *dst, int layer) {
    const Src dt = src_of(e.info->dtype);
    const size_t es = load::src_size(dt);
    const int64_t rows_per_piece = std::max<int64_t>(1, static_cast<int64_t>(kPieceBytes / (cols * es)));
    for (int64_t r = 0; r < rows; r += rows_per_piece) {
        Piece p;
        p.file = source_of(e);
        p.tensor = &e.info->name;
        p.src = dt;
        p.row_begin = r;
        p.row_end = std::min(rows, r + rows_per_piece);
        p.rows = rows;
        p.cols = cols;
        p.src_offset = e.info->file_offset + (first + static_cast<uint64_t>(r) * cols) * es;
        p.src_bytes = static_cast<uint64_t>(p.row_end - r) * cols * es;
        p.dst = dst;
        p.dst_bytes = static_cast<uint64_t>(p.row_end - r) * cols * 2;
        p.op = Op::transpose;
        push(p, layer);
    }
}

void Planner::add_raw(const Entry &e, uint64_t first, uint64_t count, uint8_t *dst, int layer, bool e8m0) {
    for (uint64_t done = 0; done < count; done += kPieceBytes) {
        Piece p;
        p.file = source_of(e);
        p.tensor = &e.info->name;
        p.src = Src::U8;
        p.src_offset = e.info->file_offset + first + done;
        p.src_bytes = std::min<uint64_t>(kPieceBytes, count - done);
        p.dst = dst + done;
        p.dst_bytes = p.src_bytes;
        p.op = Op::copy;
        p.check_e8m0 = e8m0;
        push(p, layer);
    }
}

void Planner::add_transpose_u8(const Entry &e, uint64_t first, int64_t rows, int64_t cols, uint8_t *dst, int layer,
                               bool e8m0) {
    const int64_t rows_per_piece = std::max<int64_t>(1, static_cast<int64_t>(kPieceBytes / cols));
    for (int64_t r = 0; r < rows; r += rows_per_piece) {
        Piece p;
        p.file = source_of(e);
        p.tensor = &e.info->name;
        p.src = Src::U8;
        p.row_begin = r;
        p.row_end = std::min(rows, r + rows_per_piece);
        p.rows = rows;
        p.cols = cols;
        p.src_offset = e.info->file_offset + first + static_cast<uint64_t>(r) * cols;
        p.src_bytes = static_cast<uint64_t>(p.row_end - r) * cols;
        p.dst = dst;
        p.dst_bytes = p.src_bytes;
        p.op = Op::transpose_u8;
        p.check_e8m0 = e8m0;
        push(p, layer);
    }
}

void Planner::add_broadcast_f16(const Entry &e, uint64_t count, uint8_t *dst, int layer) {
    Piece p;
    p.file = source_of(e);
    p.tensor = &e.info->name;
    p.src = src_of(e.info->dtype);
    p.src_offset = e.info->file_offset;
    p.src_bytes = load::src_size(p.src);
    p.dst = dst;
    p.dst_bytes = count * 2;
    p.op = Op::broadcast_f16;
    push(p, layer);
}

void Planner::add_extra(const Entry &e, Tensor &t, Keep keep) {
    if (e.info->dtype == StDtype::F8_E4M3 && keep == Keep::bf16 && e.info->shape.size() == 2) {
        // Block-FP8 checkpoints quantise the shared expert too: dequantise it with its scale_inv.
        const std::string &name = e.info->name;
        const std::string base = name.substr(0, name.size() - std::string("weight").size());
        const Entry &s = require(base + "weight_scale_inv", "block scales of an FP8 shared-expert weight");
        const int64_t rows = e.info->shape[0], cols = e.info->shape[1];
        if (rows % kFp8Block != 0 || cols % kFp8Block != 0)
            fail(FT_ERR_FORMAT, e.file->path(), ": tensor '", name, "': shape ", shape_str(e.info->shape),
                 " is not whole 128 x 128 tiles");
        check_dtype(s, {StDtype::BF16, StDtype::F32});
        check_shape(s, {rows / kFp8Block, cols / kFp8Block});
        t.shape = e.info->shape;
        t.dtype = FT_DTYPE_BF16;
        t.bytes.resize(static_cast<size_t>(rows * cols * 2));
        const int64_t rows_per_piece = std::max<int64_t>(kFp8Block, static_cast<int64_t>(kPieceBytes / cols) /
                                                                        kFp8Block * kFp8Block);
        for (int64_t r = 0; r < rows; r += rows_per_piece) {
            Piece p;
            p.file = source_of(e);
            p.tensor = &e.info->name;
            p.src = Src::U8;
            p.row_begin = r;
            p.row_end = std::min(rows, r + rows_per_piece);
            p.rows = rows;
            p.cols = cols;
            p.src_offset = e.info->file_offset + static_cast<uint64_t>(r) * cols;
            p.src_bytes = static_cast<uint64_t>(p.row_end - r) * cols;
            p.src2 = src_of(s.info->dtype);
            p.src2_offset = s.info->file_offset;
            p.dst = t.bytes.data() + r * cols * 2;
            p.dst_bytes = static_cast<uint64_t>(p.row_end - r) * cols * 2;
            p.op = Op::fp8_to_bf16;
            // The scale tensor may live in another shard: the piece reads both through one mapping,
            // so require them to share a file (real exports keep a weight beside its scale).
            if (s.file != e.file)
                fail(FT_ERR_UNSUPPORTED, e.file->path(), ": tensor '", name, "' and its scale_inv '",
                     s.info->name, "' are in different shards");
            push(p, -1);
        }
        return;
    }
    check_float(e);
    const Src dt = src_of(e.info->dtype);
    const uint64_t n = e.info->numel;
    t.shape = e.info->shape;
    Piece p;
    p.file = source_of(e);
    p.tensor = &e.info->name;
    p.src = dt;
    p.src_offset = e.info->file_offset;
    p.src_bytes = e.info->nbytes();
    const bool as_f32 = keep == Keep::f32 || (keep == Keep::stored && dt != Src::BF16);
    if (as_f32) {
        t.dtype = FT_DTYPE_F32;
        t.bytes.resize(n * 4);
        p.op = dt == Src::F32 ? Op::copy : Op::to_f32;
    } else {
        t.dtype = FT_DTYPE_BF16;
        t.bytes.resize(n * 2);
        p.op = dt == Src::BF16 ? Op::copy : Op::to_bf16;
    }
    p.dst = t.bytes.data();
    p.dst_bytes = t.bytes.size();
    if (p.src_bytes > 0) push(p, -1);
}

void Planner::plan_layer(int l, const std::string &layer_prefix) {
    const Block b = find_block(ckpt_, spec_, layer_prefix);
    const std::string block = layer_prefix + b.name;
    switch (spec_.format) {
        case Format::bf16: plan_layer_bf16(l, layer_prefix); return;
        case Format::fp8_block:
        case Format::nvfp4: plan_layer_fp8_nvfp4(l, block, b); break;
        case Format::mxfp4: plan_layer_mxfp4(l, block); break;
        case Format::ds_fp4: plan_layer_ds_fp4(l, block, b); break;
        case Format::q4_0:
            fail(FT_ERR_FORMAT, ckpt_.dir(), ": q4_0 experts come from GGUF files, not safetensors");
    }
    plan_extras(l, block);
}

void Planner::plan_layer_bf16(int l, const std::string &layer_prefix) {
    const int64_t E = spec_.num_experts, H = spec_.hidden, I = spec_.intermediate;
    ExpertBanks &banks = model_.banks();

    // Mixtral's original exports use block_sparse_moe.{w1,w3,w2}; everything else (and Mixtral as
    // rewritten by newer transformers) uses mlp.{gate,up,down}_proj.
    std::vector<std::string> blocks = {"mlp."};
    if (spec_.architecture == "mixtral") blocks.insert(blocks.begin(), "block_sparse_moe.");
    std::string block_name = blocks[0];
    for (const std::string &b : blocks) {
        const std::string cand = layer_prefix + b;
        if (ckpt_.contains(cand + "gate.weight") || ckpt_.contains(cand + "experts.gate_up_proj")) {
            block_name = b;
            break;
        }
    }
    const std::string block = layer_prefix + block_name;
    const bool w_names = block_name == "block_sparse_moe.";
    const char *proj_names[3] = {w_names ? "w1" : "gate_proj", w_names ? "w3" : "up_proj",
                                 w_names ? "w2" : "down_proj"};

    const std::string fused_gu = block + "experts.gate_up_proj";
    const std::string fused_dn = block + "experts.down_proj";
    const std::string first_per = block + "experts.0." + proj_names[0] + ".weight";
    const bool fused = ckpt_.contains(fused_gu) || ckpt_.contains(fused_dn);
    const bool per_expert = ckpt_.contains(first_per);
    if (fused && per_expert)
        fail(FT_ERR_FORMAT, ckpt_.dir(), ": layer ", spec_.moe_layers[l], " has both fused '", fused_gu,
             "' and per-expert '", first_per, "' tensors");

    if (fused) {
        // Fused 3-D tensors exist only unquantised; a quantised export always stores per-expert
        // tensors (or, gpt-oss, its own _blocks names).
        const auto &gu = require(fused_gu, "fused gate/up projections of the routed experts");
        const auto &dn = require(fused_dn, "fused down projections of the routed experts");
        check_float(gu);
        check_float(dn);
        const std::vector<int64_t> &gs = gu.info->shape, &ds = dn.info->shape;
        const bool gu_std = gs == std::vector<int64_t>{E, 2 * I, H};
        const bool gu_tr = gs == std::vector<int64_t>{E, H, 2 * I};
        if (!gu_std && !gu_tr)
            fail(FT_ERR_FORMAT, gu.file->path(), ": tensor '", fused_gu, "': expected shape ",
                 shape_str({E, 2 * I, H}), " (or transposed ", shape_str({E, H, 2 * I}), "), got ", shape_str(gs));
        if (gu_std && gu_tr)
            fail(FT_ERR_FORMAT, gu.file->path(), ": tensor '", fused_gu, "': shape ", shape_str(gs),
                 " is ambiguous (hidden_size == 2 * intermediate_size): cannot tell [E, 2I, H] from [E, H, 2I]");
        const bool dn_std = ds == std::vector<int64_t>{E, H, I};
        const bool dn_tr = ds == std::vector<int64_t>{E, I, H};
        if (!dn_std && !dn_tr)
            fail(FT_ERR_FORMAT, dn.file->path(), ": tensor '", fused_dn, "': expected shape ",
                 shape_str({E, H, I}), " (or transposed ", shape_str({E, I, H}), "), got ", shape_str(ds));
        // With H == I both readings fit down_proj; then it follows gate_up_proj's orientation.
        if ((gu_std && !dn_std) || (gu_tr && !dn_tr))
            fail(FT_ERR_FORMAT, dn.file->path(), ": tensor '", fused_dn, "' ", shape_str(ds), " is ",
                 gu_std ? "transposed" : "not transposed", " but '", fused_gu, "' ", shape_str(gs), " is",
                 gu_std ? " not" : "", "; inconsistent fused layout");
        if (gu_std) {
            // [E, 2I, H] with gate rows then up rows is exactly the gate_up bank; [E, H, I] the down bank.
            add_bf16(gu, 0, static_cast<uint64_t>(E * 2 * I * H), banks.row(0, l, 0), l);
            add_bf16(dn, 0, static_cast<uint64_t>(E * H * I), banks.row(1, l, 0), l);
        } else {
            // [E, H, 2I]: column j < I is gate unit j, I + j up unit j; transposing each expert's
            // [H, 2I] gives the [2I, H] bank row. [E, I, H] transposes to the [H, I] down row.
            for (int64_t e = 0; e < E; ++e) {
                add_transpose(gu, static_cast<uint64_t>(e * H * 2 * I), H, 2 * I, banks.row(0, l, e), l);
                add_transpose(dn, static_cast<uint64_t>(e * I * H), I, H, banks.row(1, l, e), l);
            }
        }
    } else {
        if (!per_expert)
            require(first_per, "routed expert 0; fused '" + fused_gu + "' is absent too");
        const std::vector<int64_t> shapes[3] = {{I, H}, {I, H}, {H, I}};
        for (int64_t e = 0; e < E; ++e) {
            for (int proj = 0; proj < 3; ++proj) {
                const std::string name =
                    block + "experts." + std::to_string(e) + "." + proj_names[proj] + ".weight";
                const auto &t = require(name, "routed expert projection");
                check_float(t);
                check_shape(t, shapes[proj]);
                uint8_t *dst = proj == 2 ? banks.row(1, l, e)
                                         : banks.row(0, l, e) + (proj == 1 ? static_cast<size_t>(I * H * 2) : 0);
                add_bf16(t, 0, static_cast<uint64_t>(I * H), dst, l);
            }
        }
    }
    plan_extras(l, block);
}


void Planner::plan_layer_fp8_nvfp4(int l, const std::string &block, const Block &b) {
    const int64_t E = spec_.num_experts, H = spec_.hidden, I = spec_.intermediate;
    ExpertBanks &banks = model_.banks();
    const bool fp8 = spec_.format == Format::fp8_block;
    if (ckpt_.contains(block + "experts.gate_up_proj"))
        fail(FT_ERR_UNSUPPORTED, ckpt_.dir(), ": tensor '", block, "experts.gate_up_proj': fused 3-D ",
             format_name(spec_.format), " experts are not supported (per-expert tensors are)");
    for (int64_t e = 0; e < E; ++e) {
        for (int proj = 0; proj < 3; ++proj) {
            const std::string base = block + "experts." + std::to_string(e) + "." + b.proj[proj] + ".";
            const bool down = proj == 2;
            const int64_t N = down ? H : I, K = down ? I : H;
            const int64_t row0 = proj == 1 ? I : 0;  // first row of this projection in the gate_up banks
            const Entry &w = require(base + "weight", "routed expert projection");
            if (fp8) {
                // Banks: 0 gate_up e4m3 [2I, H], 1 gate_up_scale bf16 [2I/128, H/128], 2 down, 3 down_scale.
                const Entry &s = require(base + "weight_scale_inv", "128 x 128 block scales of the weight");
                check_dtype(w, {StDtype::F8_E4M3});
                check_shape(w, {N, K});
                check_dtype(s, {StDtype::BF16, StDtype::F32});
                check_shape(s, {N / kFp8Block, K / kFp8Block});
                uint8_t *wd = down ? banks.row(2, l, e) : banks.row(0, l, e) + row0 * H;
                uint8_t *sd = down ? banks.row(3, l, e)
                                   : banks.row(1, l, e) + (row0 / kFp8Block) * (H / kFp8Block) * 2;
                add_raw(w, 0, static_cast<uint64_t>(N * K), wd, l);
                add_bf16(s, 0, static_cast<uint64_t>((N / kFp8Block) * (K / kFp8Block)), sd, l);
            } else {
                // Banks: 0 packed [2I, H/2], 1 e4m3 scale [2I, H/16], 2 fp16 global [2I], 3-5 the same for down.
                const Entry &s = require(base + "weight_scale", "NVFP4 e4m3 block scales of the weight");
                const Entry &g = require(base + "weight_scale_2", "NVFP4 per-tensor global scale of the weight");
                check_dtype(w, {StDtype::U8, StDtype::I8});
                check_shape(w, {N, K / 2});
                check_dtype(s, {StDtype::F8_E4M3, StDtype::U8});
                check_shape(s, {N, K / kNvfp4Block});
                check_dtype(g, {StDtype::F32, StDtype::BF16, StDtype::F16});
                if (g.info->numel != 1 || g.info->shape.size() > 1)
                    fail(FT_ERR_FORMAT, g.file->path(), ": tensor '", g.info->name, "': expected a scalar, got shape ",
                         shape_str(g.info->shape));
                const int bank0 = down ? 3 : 0;
                add_raw(w, 0, static_cast<uint64_t>(N * K / 2), banks.row(bank0, l, e) + row0 * H / 2, l);
                add_raw(s, 0, static_cast<uint64_t>(N * K / kNvfp4Block),
                        banks.row(bank0 + 1, l, e) + row0 * H / kNvfp4Block, l);
                // The per-tensor global goes to each of the projection's output rows, so the gate
                // and up halves keep their own (never folded into the e4m3 scales: docs/formats.md).
                add_broadcast_f16(g, static_cast<uint64_t>(N), banks.row(bank0 + 2, l, e) + row0 * 2, l);
            }
        }
    }
}

void Planner::plan_layer_mxfp4(int l, const std::string &block) {
    const int64_t E = spec_.num_experts, H = spec_.hidden, I = spec_.intermediate;
    ExpertBanks &banks = model_.banks();
    for (int which = 0; which < 2; ++which) {
        const bool down = which == 1;
        const std::string name = block + "experts." + (down ? "down_proj" : "gate_up_proj");
        // N output units (gate_up: 2I interleaved gate/up columns), reduced over K.
        const int64_t N = down ? H : 2 * I, K = down ? I : H;
        const Entry &bl = require(name + "_blocks", "MXFP4 e2m1 blocks of the routed experts");
        const Entry &sc = require(name + "_scales", "MXFP4 e8m0 scales of the routed experts");
        const Entry &bi = require(name + "_bias", "biases of the routed experts");
        check_dtype(bl, {StDtype::U8});
        check_shape(bl, {E, N, K / kMxfp4Block, 16});
        check_dtype(sc, {StDtype::U8, StDtype::F8_E8M0});
        check_shape(sc, {E, N, K / kMxfp4Block});
        check_float(bi);
        check_shape(bi, {E, N});
        // HF stores each expert as [N][K/2] bytes (and [N][K/32] scales); the banks hold the
        // transposes, N innermost, so a GEMV streams whole contiguous rows of K (docs/formats.md).
        const int bank0 = down ? 3 : 0;
        for (int64_t e = 0; e < E; ++e) {
            add_transpose_u8(bl, static_cast<uint64_t>(e * N * K / 2), N, K / 2, banks.row(bank0, l, e), l, false);
            add_transpose_u8(sc, static_cast<uint64_t>(e * N * K / kMxfp4Block), N, K / kMxfp4Block,
                             banks.row(bank0 + 1, l, e), l, true);
        }
        // Bias rows are [N] bf16 per expert, back to back: the whole [E, N] tensor at once.
        add_bf16(bi, 0, static_cast<uint64_t>(E * N), banks.row(bank0 + 2, l, 0), l);
    }
}

void Planner::plan_layer_ds_fp4(int l, const std::string &block, const Block &b) {
    const int64_t E = spec_.num_experts, H = spec_.hidden, I = spec_.intermediate;
    ExpertBanks &banks = model_.banks();
    for (int64_t e = 0; e < E; ++e) {
        for (int proj = 0; proj < 3; ++proj) {
            const std::string base = block + "experts." + std::to_string(e) + "." + b.proj[proj] + ".";
            const bool down = proj == 2;
            const int64_t N = down ? H : I, K = down ? I : H;
            const int64_t row0 = proj == 1 ? I : 0;
            const Entry &w = require(base + "weight", "routed expert projection (packed fp4)");
            const Entry &s = require(base + "scale", "e8m0 scales of the weight");
            check_dtype(w, {StDtype::I8, StDtype::U8});
            check_shape(w, {N, K / 2});
            check_dtype(s, {StDtype::F8_E8M0, StDtype::U8});
            check_shape(s, {N, K / kDsfp4Block});
            // Banks: 0 packed [2I, H/2], 1 e8m0 [2I, H/32], 2 down packed [H, I/2], 3 down e8m0 [H, I/32].
            uint8_t *wd = down ? banks.row(2, l, e) : banks.row(0, l, e) + row0 * H / 2;
            uint8_t *sd = down ? banks.row(3, l, e) : banks.row(1, l, e) + row0 * H / kDsfp4Block;
            add_raw(w, 0, static_cast<uint64_t>(N * K / 2), wd, l);
            add_raw(s, 0, static_cast<uint64_t>(N * K / kDsfp4Block), sd, l, true);
        }
    }
}

void Planner::plan_extras(int l, const std::string &block) {
    const int64_t E = spec_.num_experts, H = spec_.hidden, Is = spec_.shared_intermediate;
    LayerExtras &x = model_.extras(l);

    // gpt-oss calls its router mlp.router (with a logit bias, kept in router_bias); everything
    // else gate (DeepSeek-V4: gate.bias is the selection-only correction bias).
    const bool gpt_oss = spec_.architecture == "gpt_oss";
    const std::string router_name = block + (gpt_oss ? "router.weight" : "gate.weight");
    const auto &router = require(router_name, "router");
    check_shape(router, {E, H});
    add_extra(router, x.router_weight, Keep::stored);

    const std::string bias_name =
        block + (gpt_oss ? "router.bias" : spec_.architecture == "deepseek_v4" ? "gate.bias" : "gate.e_score_correction_bias");
    if (const auto *bias = ckpt_.find(bias_name)) {
        check_shape(*bias, {E});
        add_extra(*bias, x.router_bias, Keep::f32);
    } else if (spec_.routing.rule == FT_ROUTING_SIGMOID_GROUP_TOPK && spec_.architecture != "deepseek_v4") {
        require(bias_name, "correction bias of sigmoid routing");
    } else if (gpt_oss) {
        require(bias_name, "router bias");
    }

    if (Is > 0) {
        // DeepSeek/GLM/Kimi: shared_experts; Qwen3.5/3.6: shared_expert plus its sigmoid gate.
        const std::string shared = block + (spec_.shared_expert_gate ? "shared_expert." : "shared_experts.");
        const auto &g = require(shared + "gate_proj.weight", "shared expert");
        const auto &u = require(shared + "up_proj.weight", "shared expert");
        const auto &d = require(shared + "down_proj.weight", "shared expert");
        check_shape(g, {Is, H});
        check_shape(u, {Is, H});
        check_shape(d, {H, Is});
        add_extra(g, x.shared_gate, Keep::bf16);
        add_extra(u, x.shared_up, Keep::bf16);
        add_extra(d, x.shared_down, Keep::bf16);
    }
    if (spec_.shared_expert_gate) {
        const auto &sg = require(block + "shared_expert_gate.weight", "sigmoid gate of the shared expert");
        check_shape(sg, {1, H});
        add_extra(sg, x.shared_gate_proj, Keep::bf16);
    }
}

bool is_regular(const std::string &p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool ends_with(const std::string &s, const std::string &suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The single .gguf file `path` names (a file, or a directory without config.json holding exactly
// one), or "" for a Hugging Face checkpoint directory.
std::string gguf_path(const std::string &path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) fail(FT_ERR_IO, path, ": ", std::strerror(errno));
    if (is_regular(path)) {
        if (ends_with(path, ".gguf")) return path;
        fail(FT_ERR_IO, path, ": not a checkpoint directory or .gguf file");
    }
    if (is_regular(path + "/config.json")) return "";
    std::vector<std::string> found;
    if (DIR *d = ::opendir(path.c_str())) {
        while (const dirent *e = ::readdir(d)) {
            const std::string n = e->d_name;
            if (ends_with(n, ".gguf")) found.push_back(n);
        }
        ::closedir(d);
    }
    if (found.empty()) return "";  // the Hugging Face path reports what is missing
    if (found.size() > 1) {
        std::sort(found.begin(), found.end());
        fail(FT_ERR_UNSUPPORTED, path, ": holds ", found.size(), " .gguf files ('", found[0], "', '", found[1],
             "', ...); split or multiple GGUF files are not supported: pass one file");
    }
    return path + "/" + found[0];
}

}  // namespace

std::unique_ptr<Model> load_checkpoint(const std::string &path, const LoadOptions &opts) {
    const std::string gguf = gguf_path(path);
    if (!gguf.empty()) return load::load_gguf(gguf, opts);

    const std::string &dir = path;
    ModelSpec spec = read_model_config(dir);
    SafetensorsCheckpoint ckpt(dir);
    const std::string prefix = find_layer_prefix(ckpt, spec);
    spec.format = detect_format(ckpt, spec, prefix);
    const std::string gerr = format_geometry_error(spec.format, spec.hidden, spec.intermediate);
    if (!gerr.empty()) {
        const std::string lp = prefix + std::to_string(spec.moe_layers[0]) + ".";
        const Block b = find_block(ckpt, spec, lp);
        const std::string first = lp + b.name + "experts." +
                                  (spec.format == Format::mxfp4 ? std::string("gate_up_proj_blocks")
                                                                : std::string("0.") + b.proj[0] + ".weight");
        fail(FT_ERR_FORMAT, dir, ": tensor '", first, "': ", gerr, " (partial blocks are not supported)");
    }
    auto model = std::make_unique<Model>(std::move(spec));

    Planner planner(ckpt, *model, prefix);
    planner.plan();
    if (opts.on_model_allocated) opts.on_model_allocated(*model);
    std::vector<Piece> &pieces = planner.pieces();

    const int threads = load::reader_threads(opts, pieces.size());
    log(FT_LOG_INFO, "loading ", dir, ": ", model->spec().num_layers, " MoE layers of ",
        format_name(model->spec().format), " experts, ", pieces.size(), " pieces, ", threads, " readers");
    load::execute(pieces, planner.layer_bytes(), threads, opts);
    return model;
}

}  // namespace ft
