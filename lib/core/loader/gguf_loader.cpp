// GGUF file (or split set) -> Model: geometry from the metadata (read_gguf_config, gguf_config.cpp),
// routed experts from blk.{l}.ffn_{gate,up,down}_exps.weight or the fused
// blk.{l}.ffn_gate_up_exps.weight, routers from blk.{l}.ffn_gate_inp.weight, shared experts from
// blk.{l}.ffn_{gate,up,down}_shexp.weight (+ ffn_gate_inp_shexp.weight). Block types (Q4_0, Q8_0,
// K-quants, IQ4_XS) are copied verbatim into the banks of the matching format, one format per
// matrix and layer; BF16 is copied and F16/F32 rounded into bf16 banks; MXFP4 is rearranged into
// the transposed mxfp4 banks with its biases. Shared experts of any of these types are
// dequantised to bf16. Same plan-then-parallel-readers scheme as
// safetensors checkpoints (pieces.hpp).
#include <algorithm>
#include <climits>
#include <cstring>

#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "ft/gguf.hpp"
#include "ft/loader.hpp"
#include "gguf_internal.hpp"
#include "pieces.hpp"

namespace ft {

namespace {

constexpr const char *kSupportedTypes = "Q4_0, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, MXFP4, BF16, F16, F32";

std::string dims_str(const std::vector<uint64_t> &d) {
    std::string s = "[";
    for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
}

std::string type_str(uint32_t t) {
    const char *n = ggml_type_name(t);
    return n ? std::string(n) : "type id " + std::to_string(t);
}

bool is_float_type(uint32_t t) { return t == ggml_type::F32 || t == ggml_type::F16 || t == ggml_type::BF16; }

// The bank format a ggml tensor type is stored in; false for types FreeToken does not read.
bool format_of_type(uint32_t type, Format *f) {
    switch (type) {
        case ggml_type::F32: case ggml_type::F16: case ggml_type::BF16: *f = Format::bf16; return true;
        case ggml_type::Q4_0: *f = Format::q4_0; return true;
        case ggml_type::Q8_0: *f = Format::q8_0; return true;
        case ggml_type::Q2_K: *f = Format::q2_k; return true;
        case ggml_type::Q3_K: *f = Format::q3_k; return true;
        case ggml_type::Q4_K: *f = Format::q4_k; return true;
        case ggml_type::Q5_K: *f = Format::q5_k; return true;
        case ggml_type::Q6_K: *f = Format::q6_k; return true;
        case ggml_type::IQ4_XS: *f = Format::iq4_xs; return true;
        case ggml_type::MXFP4: *f = Format::mxfp4; return true;
        default: return false;
    }
}

Format expert_format(const GgufFile &g, const GgufTensorInfo &t) {
    Format f;
    if (!format_of_type(t.type, &f))
        fail(FT_ERR_UNSUPPORTED, g.path(), ": tensor '", t.name, "': type ", type_str(t.type),
             " is not supported (supported: ", kSupportedTypes, ")");
    return f;
}

std::string layer_tensor(int32_t layer, const char *what) { return gguf_layer_tensor(layer, what); }

const GgufTensorInfo *first_expert_tensor(const GgufFile &g, int32_t layer) {
    if (const GgufTensorInfo *t = g.find_tensor(layer_tensor(layer, "ffn_gate_up_exps.weight"))) return t;
    return g.find_tensor(layer_tensor(layer, "ffn_gate_exps.weight"));
}

}  // namespace

void gguf_expert_formats(const GgufFile &g, ModelSpec &spec) {
    std::vector<LayerFormats> lf;
    // The tensor that decided each layer's gate/up and down format, for the messages below.
    std::vector<const GgufTensorInfo *> gu_of, down_of;
    for (int32_t cl : spec.moe_layers) {
        const GgufTensorInfo *gu = first_expert_tensor(g, cl);
        if (!gu)
            fail(FT_ERR_FORMAT, g.path(), ": missing tensor '", layer_tensor(cl, "ffn_gate_exps.weight"),
                 "' (routed expert gate projections of MoE layer ", cl, ")");
        const GgufTensorInfo *up = g.find_tensor(layer_tensor(cl, "ffn_up_exps.weight"));
        const GgufTensorInfo *down = g.find_tensor(layer_tensor(cl, "ffn_down_exps.weight"));
        LayerFormats f;
        f.gate_up = expert_format(g, *gu);
        if (up && gu->name != layer_tensor(cl, "ffn_gate_up_exps.weight") && expert_format(g, *up) != f.gate_up)
            fail(FT_ERR_UNSUPPORTED, g.path(), ": tensor '", gu->name, "' is ", type_str(gu->type), " but '", up->name,
                 "' is ", type_str(up->type), ": gate and up of one layer must share a type");
        f.down = down ? expert_format(g, *down) : f.gate_up;  // a missing down is reported by the planner
        lf.push_back(f);
        gu_of.push_back(gu);
        down_of.push_back(down ? down : gu);
    }
    // Block formats mix freely; float experts and mxfp4 experts only with their own kind.
    auto kind = [](Format f) { return f == Format::bf16 ? 0 : f == Format::mxfp4 ? 1 : 2; };
    static const char *const kKind[] = {"float (BF16/F16/F32)", "MXFP4", "block-quantised"};
    const int k0 = kind(lf[0].gate_up);
    bool mixed = false;
    for (size_t l = 0; l < lf.size(); ++l) {
        for (int m = 0; m < 2; ++m) {
            const Format f = m ? lf[l].down : lf[l].gate_up;
            const GgufTensorInfo *t = m ? down_of[l] : gu_of[l];
            if (kind(f) != k0)
                fail(FT_ERR_UNSUPPORTED, g.path(), ": tensor '", t->name, "' is ", type_str(t->type), " but '",
                     gu_of[0]->name, "' is ", type_str(gu_of[0]->type), ": a model's experts may mix block types (",
                     "Q4_0, Q8_0, Q2_K..Q6_K, IQ4_XS) but not ", kKind[kind(f)], " with ", kKind[k0], " experts");
            if (f != lf[0].gate_up) mixed = true;
        }
    }
    spec.format = lf[0].gate_up;
    spec.layer_formats.clear();
    if (mixed) spec.layer_formats = lf;
}

namespace load {

namespace {

class GgufPlanner {
public:
    GgufPlanner(const GgufFile &g, Model &m) : g_(g), model_(m), spec_(m.spec()) {}

    void plan() {
        layer_bytes_.assign(spec_.num_layers, 0);
        for (int l = 0; l < spec_.num_layers; ++l) plan_layer(l, spec_.moe_layers[l]);
    }
    std::vector<Piece> &pieces() { return pieces_; }
    const std::vector<uint64_t> &layer_bytes() const { return layer_bytes_; }

private:
    const GgufTensorInfo &require(const std::string &name, const char *why) const {
        const GgufTensorInfo *t = g_.find_tensor(name);
        if (!t) fail(FT_ERR_FORMAT, g_.path(), ": missing tensor '", name, "' (", why, ")");
        return *t;
    }
    void check_dims(const GgufTensorInfo &t, const std::vector<uint64_t> &want) const {
        if (t.dims != want)
            fail(FT_ERR_FORMAT, g_.path(), ": tensor '", t.name, "': expected dims ", dims_str(want),
                 " (innermost first), got ", dims_str(t.dims));
    }
    // An expert tensor must be of its matrix's format in this layer.
    void check_expert_type(const GgufTensorInfo &t, Format f) const {
        if (expert_format(g_, t) != f)
            fail(FT_ERR_FORMAT, g_.path(), ": tensor '", t.name, "': type ", type_str(t.type), " differs from the ",
                 format_name(f), " of the other expert matrix of its kind in this layer");
    }
    Src src_of(const GgufTensorInfo &t) const {
        switch (t.type) {
            case ggml_type::F32: return Src::F32;
            case ggml_type::F16: return Src::F16;
            case ggml_type::BF16: return Src::BF16;
            default: return Src::U8;
        }
    }
    Piece base_piece(const GgufTensorInfo &t) const {
        Piece p;
        p.file = {t.part->fd(), t.part->mapping(), &t.part->path()};
        p.tensor = &t.name;
        p.src = src_of(t);
        return p;
    }
    void push(Piece p, int layer) {
        p.moe_layer = layer;
        if (layer >= 0) layer_bytes_[layer] += p.dst_bytes;
        pieces_.push_back(p);
    }
    LayerFormats formats(int l) const {
        return spec_.layer_formats.empty() ? LayerFormats{spec_.format, spec_.format} : spec_.layer_formats[l];
    }
    // Expert e's row of bank b in MoE layer l, at that layer's row size.
    uint8_t *bank_row(int b, int l, uint64_t e) {
        ExpertBanks &banks = model_.banks();
        return banks.layer_base(b, l) + e * banks.layer_row_bytes(b, l);
    }

    // Rows [row, row + rows) of tensor t (rows of `K` elements) into dst: verbatim blocks of block
    // format f, or elements converted to bf16, in pieces of at most kPieceBytes.
    void add_rows(const GgufTensorInfo &t, Format f, uint64_t row, uint64_t rows, int64_t K, uint8_t *dst, int layer) {
        if (format_is_block(f)) {
            const uint64_t rb = block_row_bytes(f, K);
            const uint64_t count = rows * rb;
            for (uint64_t done = 0; done < count; done += kPieceBytes) {
                Piece p = base_piece(t);
                p.src_offset = t.file_offset + row * rb + done;
                p.src_bytes = std::min<uint64_t>(kPieceBytes, count - done);
                p.dst = dst + done;
                p.dst_bytes = p.src_bytes;
                p.op = Op::copy;
                push(p, layer);
            }
            return;
        }
        const Src s = src_of(t);
        const size_t es = src_size(s);
        const uint64_t count = rows * static_cast<uint64_t>(K);
        const uint64_t per_piece = std::max<uint64_t>(1, kPieceBytes / es);
        for (uint64_t done = 0; done < count; done += per_piece) {
            const uint64_t n = std::min(per_piece, count - done);
            Piece p = base_piece(t);
            p.src_offset = t.file_offset + (row * K + done) * es;
            p.src_bytes = n * es;
            p.dst = dst + done * 2;
            p.dst_bytes = n * 2;
            p.op = s == Src::BF16 ? Op::copy : Op::to_bf16;
            push(p, layer);
        }
    }

    // Rows [row, row + rows) of a ggml MXFP4 tensor (K elements each) into columns
    // col_first + r * col_step of the transposed blocks/scales banks (dst_cols columns).
    void add_mxfp4_rows(const GgufTensorInfo &t, uint64_t row, uint64_t rows, int64_t K, uint8_t *blocks,
                        uint8_t *scales, int64_t dst_cols, int64_t col_first, int64_t col_step, int layer) {
        const uint64_t rb = static_cast<uint64_t>(K / 32) * 17;
        const uint64_t per_piece = std::max<uint64_t>(1, kPieceBytes / rb);
        for (uint64_t done = 0; done < rows; done += per_piece) {
            const uint64_t n = std::min(per_piece, rows - done);
            Piece p = base_piece(t);
            p.op = Op::ggml_mxfp4;
            p.src_offset = t.file_offset + (row + done) * rb;
            p.src_bytes = n * rb;
            p.dst = blocks;
            p.dst2 = scales;
            p.dst_bytes = n * static_cast<uint64_t>(K / 2 + K / 32);
            p.cols = K;
            p.row_begin = static_cast<int64_t>(done);
            p.row_end = static_cast<int64_t>(done + n);
            p.dst_cols = dst_cols;
            p.col_first = col_first;
            p.col_step = col_step;
            p.check_e8m0 = true;
            push(p, layer);
        }
    }

    // n float elements from element `first` of t, rounded to bf16 into dst[i * step].
    void add_bias(const GgufTensorInfo &t, uint64_t first, uint64_t n, uint8_t *dst, int64_t step, int layer) {
        if (!is_float_type(t.type))
            fail(FT_ERR_UNSUPPORTED, g_.path(), ": tensor '", t.name, "': type ", type_str(t.type),
                 " is not supported for a bias (F32, F16, BF16)");
        Piece p = base_piece(t);
        p.op = Op::to_bf16;
        p.src_offset = t.file_offset + first * src_size(p.src);
        p.src_bytes = n * src_size(p.src);
        p.dst = dst;
        p.dst_bytes = n * 2;
        p.col_step = step;
        push(p, layer);
    }

    void add_extra(const GgufTensorInfo &t, Tensor &out, bool as_f32) {
        if (!is_float_type(t.type))
            fail(FT_ERR_UNSUPPORTED, g_.path(), ": tensor '", t.name, "': type ", type_str(t.type),
                 " is not supported here (F32, F16, BF16)");
        const Src s = src_of(t);
        for (auto it = t.dims.rbegin(); it != t.dims.rend(); ++it) out.shape.push_back(static_cast<int64_t>(*it));
        Piece p = base_piece(t);
        p.src_offset = t.file_offset;
        p.src_bytes = t.nbytes;
        if (as_f32 || s == Src::F32) {
            out.dtype = FT_DTYPE_F32;
            out.bytes.resize(t.numel * 4);
            p.op = s == Src::F32 ? Op::copy : Op::to_f32;
        } else {
            out.dtype = FT_DTYPE_BF16;
            out.bytes.resize(t.numel * 2);
            p.op = s == Src::BF16 ? Op::copy : Op::to_bf16;
        }
        p.dst = out.bytes.data();
        p.dst_bytes = out.bytes.size();
        if (p.src_bytes > 0) push(p, -1);
    }

    // A [N, K] matrix of any float, block or MXFP4 type -> bf16 `out` (block types and MXFP4
    // through the reference dequantiser of their format, then rounded to bf16).
    void add_bf16_matrix(const GgufTensorInfo &t, int64_t N, int64_t K, Tensor &out) {
        out.dtype = FT_DTYPE_BF16;
        out.shape = {N, K};
        out.bytes.resize(static_cast<size_t>(N * K * 2));
        if (is_float_type(t.type)) {
            add_rows(t, Format::bf16, 0, static_cast<uint64_t>(N), K, out.bytes.data(), -1);
            return;
        }
        const Format f = expert_format(g_, t);
        if (!format_is_block(f) && f != Format::mxfp4)
            fail(FT_ERR_UNSUPPORTED, g_.path(), ": tensor '", t.name, "': type ", type_str(t.type),
                 " is not supported for a shared expert (block types, MXFP4, BF16, F16, F32)");
        // The parser checked that K is whole blocks of the tensor's type.
        const uint64_t rb = f == Format::mxfp4 ? static_cast<uint64_t>(K / 32) * 17 : block_row_bytes(f, K);
        const int64_t per_piece = std::max<int64_t>(1, static_cast<int64_t>(kPieceBytes / rb));
        for (int64_t r = 0; r < N; r += per_piece) {
            const int64_t n = std::min(per_piece, N - r);
            Piece p = base_piece(t);
            p.op = f == Format::mxfp4 ? Op::ggml_mxfp4_to_bf16 : Op::block_to_bf16;
            p.check_e8m0 = f == Format::mxfp4;
            p.fmt = f;
            p.src_offset = t.file_offset + static_cast<uint64_t>(r) * rb;
            p.src_bytes = static_cast<uint64_t>(n) * rb;
            p.dst = out.bytes.data() + static_cast<size_t>(r * K * 2);
            p.dst_bytes = static_cast<uint64_t>(n * K * 2);
            p.cols = K;
            p.row_begin = r;
            p.row_end = r + n;
            push(p, -1);
        }
    }

    void plan_mxfp4(int l, int32_t cl, const GgufTensorInfo *fused, const GgufTensorInfo &down) {
        const uint64_t E = static_cast<uint64_t>(spec_.num_experts), H = static_cast<uint64_t>(spec_.hidden),
                       I = static_cast<uint64_t>(spec_.intermediate);
        const int64_t gu_cols = static_cast<int64_t>(2 * I);
        const GgufTensorInfo *g = fused, *u = fused;
        if (!fused) {
            g = &require(layer_tensor(cl, "ffn_gate_exps.weight"), "routed expert gate projections");
            u = &require(layer_tensor(cl, "ffn_up_exps.weight"), "routed expert up projections");
            check_expert_type(*g, Format::mxfp4);
            check_expert_type(*u, Format::mxfp4);
            check_dims(*g, {H, I, E});
            check_dims(*u, {H, I, E});
        }
        for (uint64_t e = 0; e < E; ++e) {
            uint8_t *blocks = bank_row(0, l, e), *scales = bank_row(1, l, e);
            // Gate unit j -> column 2j, up unit j -> column 2j + 1.
            const uint64_t gate_row = fused ? e * 2 * I : e * I, up_row = fused ? e * 2 * I + I : e * I;
            add_mxfp4_rows(*g, gate_row, I, spec_.hidden, blocks, scales, gu_cols, 0, 2, l);
            add_mxfp4_rows(*u, up_row, I, spec_.hidden, blocks, scales, gu_cols, 1, 2, l);
            add_mxfp4_rows(down, e * H, H, spec_.intermediate, bank_row(3, l, e), bank_row(4, l, e),
                           static_cast<int64_t>(H), 0, 1, l);
        }
        // Biases (F32 in gpt-oss files) rounded to bf16; a file without them gets zero biases.
        const GgufTensorInfo *fb = g_.find_tensor(layer_tensor(cl, "ffn_gate_up_exps.bias"));
        const GgufTensorInfo *gb = g_.find_tensor(layer_tensor(cl, "ffn_gate_exps.bias"));
        const GgufTensorInfo *ub = g_.find_tensor(layer_tensor(cl, "ffn_up_exps.bias"));
        const GgufTensorInfo *db = g_.find_tensor(layer_tensor(cl, "ffn_down_exps.bias"));
        if (fb) check_dims(*fb, {2 * I, E});
        if (gb) check_dims(*gb, {I, E});
        if (ub) check_dims(*ub, {I, E});
        if (db) check_dims(*db, {H, E});
        for (uint64_t e = 0; e < E; ++e) {
            uint8_t *gub = bank_row(2, l, e), *dnb = bank_row(5, l, e);
            if (!fb && !(gb && ub)) std::memset(gub, 0, 2 * I * 2);
            if (!db) std::memset(dnb, 0, H * 2);
            if (fb) {
                add_bias(*fb, e * 2 * I, I, gub, 2, l);
                add_bias(*fb, e * 2 * I + I, I, gub + 2, 2, l);
            } else if (gb && ub) {
                add_bias(*gb, e * I, I, gub, 2, l);
                add_bias(*ub, e * I, I, gub + 2, 2, l);
            } else if (gb || ub) {
                fail(FT_ERR_FORMAT, g_.path(), ": layer ", cl, " has '", (gb ? gb : ub)->name,
                     "' but not its gate/up counterpart");
            }
            if (db) add_bias(*db, e * H, H, dnb, 1, l);
        }
    }

    void plan_shared(int l, int32_t cl) {
        const int64_t H = spec_.hidden, Is = spec_.shared_intermediate;
        const uint64_t h = static_cast<uint64_t>(H), is = static_cast<uint64_t>(Is);
        LayerExtras &x = model_.extras(l);
        const GgufTensorInfo &g = require(layer_tensor(cl, "ffn_gate_shexp.weight"), "shared expert");
        const GgufTensorInfo &u = require(layer_tensor(cl, "ffn_up_shexp.weight"), "shared expert");
        const GgufTensorInfo &d = require(layer_tensor(cl, "ffn_down_shexp.weight"), "shared expert");
        check_dims(g, {h, is});
        check_dims(u, {h, is});
        check_dims(d, {is, h});
        add_bf16_matrix(g, Is, H, x.shared_gate);
        add_bf16_matrix(u, Is, H, x.shared_up);
        add_bf16_matrix(d, H, Is, x.shared_down);
        if (spec_.shared_expert_gate) {
            const GgufTensorInfo &sg =
                require(layer_tensor(cl, "ffn_gate_inp_shexp.weight"), "sigmoid gate of the shared expert");
            if (sg.dims != std::vector<uint64_t>{h} && sg.dims != std::vector<uint64_t>{h, 1}) check_dims(sg, {h});
            add_bf16_matrix(sg, 1, H, x.shared_gate_proj);
        }
    }

    void plan_layer(int l, int32_t cl) {
        const uint64_t E = static_cast<uint64_t>(spec_.num_experts), H = static_cast<uint64_t>(spec_.hidden),
                       I = static_cast<uint64_t>(spec_.intermediate);
        const LayerFormats lf = formats(l);
        const GgufTensorInfo *fused = g_.find_tensor(layer_tensor(cl, "ffn_gate_up_exps.weight"));
        const GgufTensorInfo *gate = g_.find_tensor(layer_tensor(cl, "ffn_gate_exps.weight"));
        if (fused && gate)
            fail(FT_ERR_FORMAT, g_.path(), ": layer ", cl, " has both fused '", fused->name, "' and separate '",
                 gate->name, "' expert tensors");
        const GgufTensorInfo &down = require(layer_tensor(cl, "ffn_down_exps.weight"), "routed expert down projections");
        check_expert_type(down, lf.down);
        check_dims(down, {I, H, E});
        if (fused) {
            check_expert_type(*fused, lf.gate_up);
            check_dims(*fused, {H, 2 * I, E});
        }
        if (lf.gate_up == Format::mxfp4) {
            plan_mxfp4(l, cl, fused, down);
        } else {
            // Bank row bytes per output row of gate/up ([.., H]).
            const uint64_t gu_rb = format_is_block(lf.gate_up) ? block_row_bytes(lf.gate_up, spec_.hidden) : H * 2;
            if (fused) {
                // [E][2I][H] with gate rows first: exactly the gate_up bank, all experts at once.
                add_rows(*fused, lf.gate_up, 0, E * 2 * I, spec_.hidden, bank_row(0, l, 0), l);
            } else {
                const GgufTensorInfo &g = require(layer_tensor(cl, "ffn_gate_exps.weight"), "routed expert gate projections");
                const GgufTensorInfo &u = require(layer_tensor(cl, "ffn_up_exps.weight"), "routed expert up projections");
                check_expert_type(g, lf.gate_up);
                check_expert_type(u, lf.gate_up);
                check_dims(g, {H, I, E});
                check_dims(u, {H, I, E});
                for (uint64_t e = 0; e < E; ++e) {
                    uint8_t *row = bank_row(0, l, e);
                    add_rows(g, lf.gate_up, e * I, I, spec_.hidden, row, l);
                    add_rows(u, lf.gate_up, e * I, I, spec_.hidden, row + I * gu_rb, l);
                }
            }
            add_rows(down, lf.down, 0, E * H, spec_.intermediate, bank_row(1, l, 0), l);
        }

        LayerExtras &x = model_.extras(l);
        const GgufTensorInfo &router = require(layer_tensor(cl, "ffn_gate_inp.weight"), "router");
        check_dims(router, {H, E});
        add_extra(router, x.router_weight, false);
        // Router bias: the selection-only correction bias exp_probs_b (e_score_correction_bias,
        // required by the biased rules), or gpt-oss's router linear bias ffn_gate_inp.bias.
        const int32_t rule = spec_.routing.rule;
        const bool biased = rule == FT_ROUTING_SIGMOID_GROUP_TOPK || rule == FT_ROUTING_SOFTMAX_BIASED_TOPK;
        if (const GgufTensorInfo *b = g_.find_tensor(layer_tensor(cl, "exp_probs_b.bias"))) {
            if (b->numel != E) check_dims(*b, {E});  // [E], or ERNIE's [E, 1]
            add_extra(*b, x.router_bias, true);
            x.router_bias.shape = {static_cast<int64_t>(E)};
        } else if (biased) {
            require(layer_tensor(cl, "exp_probs_b.bias"), "correction bias of the routing rule");
        } else if (spec_.architecture == "gpt_oss") {
            const GgufTensorInfo &b = require(layer_tensor(cl, "ffn_gate_inp.bias"), "router bias");
            check_dims(b, {E});
            add_extra(b, x.router_bias, true);
        }
        if (spec_.shared_intermediate > 0) plan_shared(l, cl);
    }

    const GgufFile &g_;
    Model &model_;
    const ModelSpec &spec_;
    std::vector<Piece> pieces_;
    std::vector<uint64_t> layer_bytes_;
};

// Every format the file uses must suit (H, I).
void check_layer_geometry(const GgufFile &g, const ModelSpec &spec) {
    for (int l = 0; l < spec.num_layers; ++l) {
        const LayerFormats lf =
            spec.layer_formats.empty() ? LayerFormats{spec.format, spec.format} : spec.layer_formats[l];
        for (int m = 0; m < 2; ++m) {
            const Format f = m ? lf.down : lf.gate_up;
            const std::string gerr = format_geometry_error(f, spec.hidden, spec.intermediate);
            if (!gerr.empty())
                fail(FT_ERR_FORMAT, g.path(), ": tensor '",
                     m ? layer_tensor(spec.moe_layers[l], "ffn_down_exps.weight")
                       : first_expert_tensor(g, spec.moe_layers[l])->name,
                     "': ", gerr, " (partial blocks are not supported)");
        }
    }
}

// The banks must have been allocated at each layer's own row sizes.
void check_bank_sizes(const GgufFile &g, const Model &model) {
    const ModelSpec &spec = model.spec();
    if (spec.layer_formats.empty()) return;
    for (int l = 0; l < spec.num_layers; ++l) {
        const LayerFormats &lf = spec.layer_formats[l];
        const size_t want[2] = {bank_schema(lf.gate_up, spec.hidden, spec.intermediate)[0].row_bytes,
                                bank_schema(lf.down, spec.hidden, spec.intermediate)[1].row_bytes};
        for (int b = 0; b < 2; ++b)
            if (model.banks().layer_row_bytes(b, l) != want[b])
                fail(FT_ERR_UNSUPPORTED, g.path(), ": MoE layer ", l, " stores ", format_name(b ? lf.down : lf.gate_up),
                     " ", b ? "down" : "gate/up", " experts, but this build allocates every layer's banks in ",
                     format_name(spec.format), " (per-layer formats are not supported yet)");
    }
}

std::string formats_str(const ModelSpec &spec) {
    if (spec.layer_formats.empty()) return format_name(spec.format);
    std::string s = "mixed (";
    for (size_t l = 0; l < spec.layer_formats.size(); ++l)
        s += (l ? ", " : "") + std::string(format_name(spec.layer_formats[l].gate_up)) + "/" +
             format_name(spec.layer_formats[l].down);
    return s + ")";
}

}  // namespace

std::unique_ptr<Model> load_gguf(const std::string &path, const LoadOptions &opts) {
    std::unique_ptr<GgufFile> file = open_gguf_model(path);
    const GgufFile &g = *file;
    ModelSpec spec = read_gguf_config(g);
    check_layer_geometry(g, spec);  // before any allocation
    auto model = std::make_unique<Model>(std::move(spec));
    check_bank_sizes(g, *model);
    GgufPlanner planner(g, *model);
    planner.plan();
    if (opts.on_model_allocated) opts.on_model_allocated(*model);
    std::vector<Piece> &pieces = planner.pieces();
    const int threads = reader_threads(opts, pieces.size());
    log(FT_LOG_INFO, "loading ", path, g.parts().empty() ? "" : cat(" (", g.parts().size() + 1, " parts)"), ": ",
        model->spec().num_layers, " MoE layers of ", formats_str(model->spec()), " experts",
        model->spec().shared_intermediate > 0 ? cat(", shared experts of ", model->spec().shared_intermediate) : "",
        ", ", pieces.size(), " pieces, ", threads, " readers");
    execute(pieces, planner.layer_bytes(), threads, opts);
    return model;
}

}  // namespace load

}  // namespace ft
