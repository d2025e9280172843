// GGUF file -> Model: geometry from the metadata (read_gguf_config, gguf_config.cpp), routed experts from
// blk.{l}.ffn_{gate,up,down}_exps.weight or the fused blk.{l}.ffn_gate_up_exps.weight, routers
// from blk.{l}.ffn_gate_inp.weight. Q4_0 blocks are copied into the q4_0 banks verbatim; BF16 is
// copied and F16/F32 rounded into bf16 banks. Same plan-then-parallel-readers scheme as
// safetensors checkpoints (pieces.hpp).
#include <algorithm>
#include <climits>

#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "ft/gguf.hpp"
#include "ft/loader.hpp"
#include "gguf_internal.hpp"
#include "pieces.hpp"

namespace ft {

namespace {

std::string dims_str(const std::vector<uint64_t> &d) {
    std::string s = "[";
    for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
}

bool is_float_type(uint32_t t) { return t == ggml_type::F32 || t == ggml_type::F16 || t == ggml_type::BF16; }

std::string layer_tensor(int32_t layer, const char *what) { return gguf_layer_tensor(layer, what); }

const GgufTensorInfo *first_expert_tensor(const GgufFile &g, int32_t layer) {
    if (const GgufTensorInfo *t = g.find_tensor(layer_tensor(layer, "ffn_gate_up_exps.weight"))) return t;
    return g.find_tensor(layer_tensor(layer, "ffn_gate_exps.weight"));
}

}  // namespace

void gguf_expert_formats(const GgufFile &g, ModelSpec &spec) {
    const GgufTensorInfo *first = first_expert_tensor(g, spec.moe_layers[0]);
    if (first->type == ggml_type::Q4_0) {
        spec.format = Format::q4_0;
    } else if (is_float_type(first->type)) {
        spec.format = Format::bf16;
    } else {
        const char *tn = ggml_type_name(first->type);
        fail(FT_ERR_UNSUPPORTED, g.path(), ": tensor '", first->name, "': expert type ", tn ? tn : "?",
             " is not supported (Q4_0, BF16, F16, F32)");
    }
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
    // Expert tensors must all be of the model's format: Q4_0 for q4_0, a float type for bf16.
    void check_expert_type(const GgufTensorInfo &t) const {
        const bool ok = spec_.format == Format::q4_0 ? t.type == ggml_type::Q4_0 : is_float_type(t.type);
        if (!ok) {
            const char *tn = ggml_type_name(t.type);
            fail(FT_ERR_FORMAT, g_.path(), ": tensor '", t.name, "': type ", tn ? tn : "?", " differs from the ",
                 format_name(spec_.format), " experts of the first MoE layer");
        }
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
        p.file = {g_.fd(), g_.mapping(), &g_.path()};
        p.tensor = &t.name;
        p.src = src_of(t);
        return p;
    }
    void push(Piece p, int layer) {
        p.moe_layer = layer;
        if (layer >= 0) layer_bytes_[layer] += p.dst_bytes;
        pieces_.push_back(p);
    }

    // Rows [row, row + rows) of tensor t (rows of `K` elements) into dst: verbatim Q4_0 blocks or
    // elements converted to bf16, in pieces of at most kPieceBytes.
    void add_rows(const GgufTensorInfo &t, uint64_t row, uint64_t rows, int64_t K, uint8_t *dst, int layer) {
        if (spec_.format == Format::q4_0) {
            const uint64_t rb = static_cast<uint64_t>(K / kQ4_0Block) * kQ4_0BlockBytes;
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

    void add_extra(const GgufTensorInfo &t, Tensor &out, bool as_f32) {
        if (!is_float_type(t.type)) {
            const char *tn = ggml_type_name(t.type);
            fail(FT_ERR_UNSUPPORTED, g_.path(), ": tensor '", t.name, "': type ", tn ? tn : "?",
                 " is not supported here (F32, F16, BF16)");
        }
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

    void plan_layer(int l, int32_t cl) {
        const uint64_t E = static_cast<uint64_t>(spec_.num_experts), H = static_cast<uint64_t>(spec_.hidden),
                       I = static_cast<uint64_t>(spec_.intermediate);
        ExpertBanks &banks = model_.banks();
        const GgufTensorInfo *fused = g_.find_tensor(layer_tensor(cl, "ffn_gate_up_exps.weight"));
        const GgufTensorInfo *gate = g_.find_tensor(layer_tensor(cl, "ffn_gate_exps.weight"));
        if (fused && gate)
            fail(FT_ERR_FORMAT, g_.path(), ": layer ", cl, " has both fused '", fused->name, "' and separate '",
                 gate->name, "' expert tensors");
        const GgufTensorInfo &down = require(layer_tensor(cl, "ffn_down_exps.weight"), "routed expert down projections");
        check_expert_type(down);
        check_dims(down, {I, H, E});
        // Bank row bytes per output row of gate/up ([.., H]) and down ([.., I]).
        const bool q4 = spec_.format == Format::q4_0;
        const uint64_t gu_rb = q4 ? H / kQ4_0Block * kQ4_0BlockBytes : H * 2;
        if (fused) {
            // [E][2I][H] with gate rows first: exactly the gate_up bank, all experts at once.
            check_expert_type(*fused);
            check_dims(*fused, {H, 2 * I, E});
            add_rows(*fused, 0, E * 2 * I, spec_.hidden, banks.row(0, l, 0), l);
        } else {
            const GgufTensorInfo &g = require(layer_tensor(cl, "ffn_gate_exps.weight"), "routed expert gate projections");
            const GgufTensorInfo &u = require(layer_tensor(cl, "ffn_up_exps.weight"), "routed expert up projections");
            check_expert_type(g);
            check_expert_type(u);
            check_dims(g, {H, I, E});
            check_dims(u, {H, I, E});
            for (uint64_t e = 0; e < E; ++e) {
                uint8_t *row = banks.row(0, l, static_cast<int>(e));
                add_rows(g, e * I, I, spec_.hidden, row, l);
                add_rows(u, e * I, I, spec_.hidden, row + I * gu_rb, l);
            }
        }
        add_rows(down, 0, E * H, spec_.intermediate, banks.row(1, l, 0), l);

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
    }

    const GgufFile &g_;
    Model &model_;
    const ModelSpec &spec_;
    std::vector<Piece> pieces_;
    std::vector<uint64_t> layer_bytes_;
};

}  // namespace

std::unique_ptr<Model> load_gguf(const std::string &path, const LoadOptions &opts) {
    GgufFile g(path);
    ModelSpec spec = read_gguf_config(g);
    const std::string gerr = format_geometry_error(spec.format, spec.hidden, spec.intermediate);
    if (!gerr.empty())
        fail(FT_ERR_FORMAT, path, ": tensor '", first_expert_tensor(g, spec.moe_layers[0])->name, "': ", gerr,
             " (partial blocks are not supported)");
    auto model = std::make_unique<Model>(std::move(spec));
    GgufPlanner planner(g, *model);
    planner.plan();
    if (opts.on_model_allocated) opts.on_model_allocated(*model);
    std::vector<Piece> &pieces = planner.pieces();
    const int threads = reader_threads(opts, pieces.size());
    log(FT_LOG_INFO, "loading ", path, ": ", model->spec().num_layers, " MoE layers of ",
        format_name(model->spec().format), " experts, ", pieces.size(), " pieces, ", threads, " readers");
    execute(pieces, planner.layer_bytes(), threads, opts);
    return model;
}

}  // namespace load

}  // namespace ft
