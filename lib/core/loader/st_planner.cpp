// The Planner's primitives (pieces that copy, convert or transpose one tensor's bytes) and the
// per-layer tensors beside the routed experts: router, router/correction bias, shared expert.
#include <algorithm>

#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "st_plan.hpp"

namespace ft::load {

namespace {

Source source_of(const Entry &e) { return {e.file->fd(), e.file->mapping(), &e.file->path()}; }

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

}  // namespace

const Entry &Planner::require(const std::string &name, const std::string &why) const {
    const Entry *e = ckpt_.find(name);
    if (!e) fail(FT_ERR_FORMAT, ckpt_.dir(), ": missing tensor '", name, "' (", why, ")");
    return *e;
}

const Entry *Planner::first_present(std::initializer_list<std::string> names) const {
    for (const std::string &n : names)
        if (const Entry *e = ckpt_.find(n)) return e;
    return nullptr;
}

void Planner::check_shape(const Entry &e, const std::vector<int64_t> &want) const {
    if (e.info->shape != want)
        fail(FT_ERR_FORMAT, e.file->path(), ": tensor '", e.info->name, "': expected shape ", shape_str(want), ", got ",
             shape_str(e.info->shape));
}

void Planner::check_float(const Entry &e) const {
    const StDtype d = e.info->dtype;
    if (d != StDtype::BF16 && d != StDtype::F16 && d != StDtype::F32)
        fail(FT_ERR_UNSUPPORTED, e.file->path(), ": tensor '", e.info->name, "': dtype ", st_dtype_name(d),
             " is not supported (BF16, F16, F32)");
}

void Planner::check_dtype(const Entry &e, std::initializer_list<StDtype> allowed) const {
    for (StDtype d : allowed)
        if (e.info->dtype == d) return;
    std::string names;
    for (StDtype d : allowed) names += std::string(names.empty() ? "" : ", ") + st_dtype_name(d);
    fail(FT_ERR_FORMAT, e.file->path(), ": tensor '", e.info->name, "': dtype ", st_dtype_name(e.info->dtype),
         " where ", names, " is expected");
}

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

void Planner::add_transpose(const Entry &e, uint64_t first, int64_t rows, int64_t cols, uint8_t *dst, int layer,
                            bool deinterleave) {
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
        p.deinterleave = deinterleave;
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

void Planner::add_fp8(const Entry &e, const Entry &s, Tensor &t) {
    const std::string &name = e.info->name;
    check_dtype(e, {StDtype::F8_E4M3});
    if (e.info->shape.size() != 2)
        fail(FT_ERR_FORMAT, e.file->path(), ": tensor '", name, "': shape ", shape_str(e.info->shape), " is not a matrix");
    const int64_t rows = e.info->shape[0], cols = e.info->shape[1];
    if (rows % kFp8Block != 0 || cols % kFp8Block != 0)
        fail(FT_ERR_FORMAT, e.file->path(), ": tensor '", name, "': shape ", shape_str(e.info->shape),
             " is not whole 128 x 128 tiles");
    check_dtype(s, {StDtype::BF16, StDtype::F32, StDtype::F8_E8M0});
    check_shape(s, {rows / kFp8Block, cols / kFp8Block});
    // The scale tensor may live in another shard: the piece reads both through one mapping,
    // so require them to share a file (real exports keep a weight beside its scale).
    if (s.file != e.file)
        fail(FT_ERR_UNSUPPORTED, e.file->path(), ": tensor '", name, "' and its scales '", s.info->name,
             "' are in different shards");
    const bool e8m0 = s.info->dtype == StDtype::F8_E8M0;
    t.shape = e.info->shape;
    t.dtype = FT_DTYPE_BF16;
    t.bytes.resize(static_cast<size_t>(rows * cols * 2));
    const int64_t rows_per_piece =
        std::max<int64_t>(kFp8Block, static_cast<int64_t>(kPieceBytes / cols) / kFp8Block * kFp8Block);
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
        p.src2 = e8m0 ? Src::U8 : src_of(s.info->dtype);
        p.scale_e8m0 = e8m0;
        p.src2_offset = s.info->file_offset;
        p.dst = t.bytes.data() + r * cols * 2;
        p.dst_bytes = static_cast<uint64_t>(p.row_end - r) * cols * 2;
        p.op = Op::fp8_to_bf16;
        push(p, -1);
    }
}

void Planner::add_extra(const Entry &e, Tensor &t, Keep keep, const std::vector<int64_t> &shape,
                        int64_t deinterleave_cols) {
    if (e.info->dtype == StDtype::F8_E4M3 && keep == Keep::bf16 && e.info->shape.size() == 2) {
        // Block-FP8 checkpoints quantise the shared expert too: dequantise it with its scale_inv.
        const std::string &name = e.info->name;
        const std::string base = name.substr(0, name.size() - std::string("weight").size());
        add_fp8(e, require(base + "weight_scale_inv", "block scales of an FP8 shared-expert weight"), t);
        return;
    }
    check_float(e);
    const Src dt = src_of(e.info->dtype);
    const uint64_t n = e.info->numel;
    t.shape = shape.empty() ? e.info->shape : shape;
    Piece p;
    p.file = source_of(e);
    p.tensor = &e.info->name;
    p.src = dt;
    p.src_offset = e.info->file_offset;
    p.src_bytes = e.info->nbytes();
    const bool as_f32 = keep == Keep::f32 || (keep == Keep::stored && dt != Src::BF16);
    if (deinterleave_cols > 0) {
        t.dtype = FT_DTYPE_F32;
        t.bytes.resize(n * 4);
        p.op = Op::to_f32;
        p.deinterleave = true;
        p.cols = deinterleave_cols;
    } else if (as_f32) {
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
        case Format::bf16: plan_layer_bf16(l, layer_prefix, b); break;
        case Format::fp8_block:
        case Format::nvfp4: plan_layer_fp8_nvfp4(l, block, b); break;
        case Format::mxfp4: plan_layer_mxfp4(l, block); break;
        case Format::ds_fp4: plan_layer_ds_fp4(l, block, b); break;
        default:  // the GGUF block formats
            fail(FT_ERR_FORMAT, ckpt_.dir(), ": ", format_name(spec_.format),
                 " experts come from GGUF files, not safetensors");
    }
    plan_extras(l, layer_prefix, block);
}

void Planner::plan_extras(int l, const std::string &layer_prefix, const std::string &block) {
    const int64_t E = spec_.num_experts, H = spec_.hidden;
    LayerExtras &x = model_.extras(l);
    const std::string &arch = spec_.architecture;

    // The router: gate (a linear, or DeepSeek-V3's router module holding .weight), router (gpt-oss,
    // Llama-4, PhiMoE, Jamba), router.layer (GraniteMoE), gate.wg (Hunyuan).
    const Entry *found = first_present({block + "gate.weight", block + "router.weight", block + "router.layer.weight",
                                        block + "gate.wg.weight"});
    const Entry &router = found ? *found : require(block + "gate.weight", "router");
    check_shape(router, {E, H});
    add_extra(router, x.router_weight, Keep::stored);

    if (arch == "gpt_oss") {
        // gpt-oss's router linear has a bias, added to the logits.
        const Entry &bias = require(block + "router.bias", "router bias");
        check_shape(bias, {E});
        add_extra(bias, x.router_bias, Keep::f32);
    } else if (arch == "deepseek_v4") {
        // DeepSeek-V4's gate.bias is the selection-only correction bias (absent on hash layers).
        if (const Entry *bias = ckpt_.find(block + "gate.bias")) {
            check_shape(*bias, {E});
            add_extra(*bias, x.router_bias, Keep::f32);
        }
        if (l < spec_.hash_layers) plan_tid2eid(l, block);
    } else {
        // The selection-only correction bias: under the router (DeepSeek-V3 family), the block
        // (MiniMax-M2) or ERNIE's moe_statics ([1, E]; under the router in newer exports).
        // Loaded only for the rules that select with it.
        const int32_t rule = spec_.routing.rule;
        const bool needs_bias = rule == FT_ROUTING_SIGMOID_GROUP_TOPK || rule == FT_ROUTING_SOFTMAX_BIASED_TOPK;
        const Entry *bias = needs_bias ? first_present({block + "gate.e_score_correction_bias",
                                                        block + "e_score_correction_bias",
                                                        block + "gate.moe_statics.e_score_correction_bias",
                                                        block + "moe_statics.e_score_correction_bias"})
                                       : nullptr;
        if (bias) {
            if (bias->info->numel != static_cast<uint64_t>(E) || bias->info->shape.empty() ||
                bias->info->shape.back() != E)
                check_shape(*bias, {E});
            add_extra(*bias, x.router_bias, Keep::f32, {E});
        } else if (needs_bias) {
            require(block + "gate.e_score_correction_bias", "correction bias of the routing rule");
        }
    }
    if (spec_.shared_intermediate > 0) plan_shared(l, layer_prefix, block);
}

void Planner::plan_tid2eid(int l, const std::string &block) {
    const int64_t V = spec_.vocab_size, K = spec_.top_k;
    const Entry *found = first_present({block + "gate.tid2eid", block + "tid2eid"});
    const Entry &e = found ? *found : require(block + "gate.tid2eid", "token-id routing table of a hash-routed layer");
    check_dtype(e, {StDtype::I32, StDtype::I64});
    check_shape(e, {V, K});
    std::vector<int32_t> &table = model_.extras(l).tid2eid;
    table.resize(static_cast<size_t>(V * K));
    const uint64_t width = e.info->dtype == StDtype::I64 ? 8 : 4;
    const uint64_t per_piece = std::max<uint64_t>(1, kPieceBytes / width), n = static_cast<uint64_t>(V * K);
    for (uint64_t done = 0; done < n; done += per_piece) {
        Piece p;
        p.file = source_of(e);
        p.tensor = &e.info->name;
        p.src = Src::U8;
        p.src_offset = e.info->file_offset + done * width;
        p.src_bytes = std::min(per_piece, n - done) * width;
        p.dst = reinterpret_cast<uint8_t *>(table.data() + done);
        p.dst_bytes = p.src_bytes / width * 4;
        p.op = Op::ids_to_i32;
        p.id_width = static_cast<int32_t>(width);
        p.id_limit = spec_.num_experts;
        p.row_begin = static_cast<int64_t>(done);
        push(p, -1);
    }
}

// The shared expert(s): shared_experts (DeepSeek family, ERNIE), shared_expert (Qwen2/3-Next/3.5,
// Llama-4), shared_mlp (Hunyuan) with gate/up/down projections inside the block, or GraniteMoE's
// layer-level shared_mlp with a fused input_linear [2 Is, H] (gate rows, then up rows) and an
// output_linear [H, Is].
void Planner::plan_shared(int l, const std::string &layer_prefix, const std::string &block) {
    const int64_t H = spec_.hidden, Is = spec_.shared_intermediate;
    LayerExtras &x = model_.extras(l);
    if (const Entry *in = ckpt_.find(layer_prefix + "shared_mlp.input_linear.weight")) {
        const Entry &out = require(layer_prefix + "shared_mlp.output_linear.weight", "shared MLP");
        check_float(*in);
        check_shape(*in, {2 * Is, H});
        check_shape(out, {H, Is});
        for (Tensor *t : {&x.shared_gate, &x.shared_up}) {
            t->dtype = FT_DTYPE_BF16;
            t->shape = {Is, H};
            t->bytes.resize(static_cast<size_t>(Is * H * 2));
        }
        add_bf16(*in, 0, static_cast<uint64_t>(Is * H), x.shared_gate.bytes.data(), -1);
        add_bf16(*in, static_cast<uint64_t>(Is * H), static_cast<uint64_t>(Is * H), x.shared_up.bytes.data(), -1);
        add_extra(out, x.shared_down, Keep::bf16);
    } else if (spec_.architecture == "deepseek_v4" && ckpt_.contains(block + "shared_experts.w1.weight")) {
        // DeepSeek-V4: shared_experts.{w1 gate, w3 up, w2 down}, each an e4m3 weight with its 128 x 128
        // block scales in `.scale` (or a float weight), kept as bf16.
        Tensor *dst[3] = {&x.shared_gate, &x.shared_up, &x.shared_down};
        const char *names[3] = {"w1", "w3", "w2"};
        for (int i = 0; i < 3; ++i) {
            const std::string base = block + "shared_experts." + names[i] + ".";
            const Entry &w = require(base + "weight", "shared expert");
            check_shape(w, i == 2 ? std::vector<int64_t>{H, Is} : std::vector<int64_t>{Is, H});
            if (w.info->dtype == StDtype::F8_E4M3)
                add_fp8(w, require(base + "scale", "block scales of the FP8 shared expert"), *dst[i]);
            else
                add_extra(w, *dst[i], Keep::bf16);
        }
    } else {
        std::string shared = block + "shared_experts.";
        for (const char *name : {"shared_experts.", "shared_expert.", "shared_mlp."}) {
            if (ckpt_.contains(block + name + "gate_proj.weight")) {
                shared = block + name;
                break;
            }
        }
        const Entry &g = require(shared + "gate_proj.weight", "shared expert");
        const Entry &u = require(shared + "up_proj.weight", "shared expert");
        const Entry &d = require(shared + "down_proj.weight", "shared expert");
        check_shape(g, {Is, H});
        check_shape(u, {Is, H});
        check_shape(d, {H, Is});
        add_extra(g, x.shared_gate, Keep::bf16);
        add_extra(u, x.shared_up, Keep::bf16);
        add_extra(d, x.shared_down, Keep::bf16);
    }
    if (spec_.shared_expert_gate) {
        const Entry &sg = require(block + "shared_expert_gate.weight", "sigmoid gate of the shared expert");
        check_shape(sg, {1, H});
        add_extra(sg, x.shared_gate_proj, Keep::bf16);
    }
}

}  // namespace ft::load
