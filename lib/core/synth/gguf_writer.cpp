// GGUF v3 files: the byte-level GgufWriter tests use to build valid or broken files, and
// write_gguf, a MoE model in llama.cpp's tensor names with block, MXFP4 or float experts, mixed
// per matrix and layer, shared experts, optionally split in parts.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "synth_internal.hpp"

namespace ft::synth {

using namespace detail;

namespace {

template <typename T>
std::vector<uint8_t> le_bytes(T v) {
    std::vector<uint8_t> out(sizeof v);
    std::memcpy(out.data(), &v, sizeof v);
    return out;
}

void put_string(std::vector<uint8_t> &out, const std::string &str) {
    append(out, le_bytes<uint64_t>(str.size()));
    out.insert(out.end(), str.begin(), str.end());
}

constexpr uint32_t kGgufU32 = 4, kGgufI32 = 5, kGgufF32 = 6, kGgufBool = 7, kGgufString = 8, kGgufArray = 9,
                   kGgufU64 = 10, kGgufF64 = 12;

}  // namespace

void GgufWriter::kv_raw(const std::string &key, uint32_t type, const std::vector<uint8_t> &value) {
    kvs_.push_back({key, type, value});
}
void GgufWriter::kv_u32(const std::string &key, uint32_t v) { kv_raw(key, kGgufU32, le_bytes(v)); }
void GgufWriter::kv_i32(const std::string &key, int32_t v) { kv_raw(key, kGgufI32, le_bytes(v)); }
void GgufWriter::kv_u64(const std::string &key, uint64_t v) { kv_raw(key, kGgufU64, le_bytes(v)); }
void GgufWriter::kv_f32(const std::string &key, float v) { kv_raw(key, kGgufF32, le_bytes(v)); }
void GgufWriter::kv_f64(const std::string &key, double v) { kv_raw(key, kGgufF64, le_bytes(v)); }
void GgufWriter::kv_bool(const std::string &key, bool v) { kv_raw(key, kGgufBool, {static_cast<uint8_t>(v ? 1 : 0)}); }
void GgufWriter::kv_string(const std::string &key, const std::string &v) {
    std::vector<uint8_t> b;
    put_string(b, v);
    kv_raw(key, kGgufString, b);
}
void GgufWriter::kv_strings(const std::string &key, const std::vector<std::string> &v) {
    std::vector<uint8_t> b = le_bytes(kGgufString);
    append(b, le_bytes<uint64_t>(v.size()));
    for (const std::string &x : v) put_string(b, x);
    kv_raw(key, kGgufArray, b);
}
void GgufWriter::kv_f32s(const std::string &key, const std::vector<float> &v) {
    std::vector<uint8_t> b = le_bytes(kGgufF32);
    append(b, le_bytes<uint64_t>(v.size()));
    for (float x : v) append(b, le_bytes(x));
    kv_raw(key, kGgufArray, b);
}
void GgufWriter::tensor(const std::string &name, const std::vector<uint64_t> &dims, uint32_t ggml_type,
                        std::vector<uint8_t> data) {
    tensors_.push_back({name, dims, ggml_type, std::move(data)});
}

std::vector<uint8_t> GgufWriter::build(Layout *layout) const {
    Layout lay;
    std::vector<uint8_t> out = {'G', 'G', 'U', 'F'};
    append(out, le_bytes<uint32_t>(3));
    append(out, le_bytes<uint64_t>(tensors_.size()));
    append(out, le_bytes<uint64_t>(kvs_.size()));
    for (const Kv &kv : kvs_) {
        lay.key_pos.push_back(out.size());
        put_string(out, kv.key);
        append(out, le_bytes(kv.type));
        append(out, kv.value);
    }
    const uint64_t a = alignment_;
    std::vector<uint64_t> offsets;
    uint64_t off = 0;
    for (const Tensor &t : tensors_) {
        offsets.push_back(off);
        off += (t.data.size() + a - 1) / a * a;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
        const Tensor &t = tensors_[i];
        lay.info_pos.push_back(out.size());
        put_string(out, t.name);
        lay.n_dims_pos.push_back(out.size());
        append(out, le_bytes<uint32_t>(static_cast<uint32_t>(t.dims.size())));
        lay.dims_pos.push_back(out.size());
        for (uint64_t d : t.dims) append(out, le_bytes(d));
        lay.type_pos.push_back(out.size());
        append(out, le_bytes(t.type));
        lay.offset_pos.push_back(out.size());
        append(out, le_bytes(offsets[i]));
    }
    out.resize((out.size() + a - 1) / a * a, 0);
    lay.data_start = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
        out.resize(lay.data_start + offsets[i], 0);
        append(out, tensors_[i].data);
    }
    if (layout) *layout = lay;
    return out;
}

void GgufWriter::write(const std::string &path, Layout *layout) const {
    const std::vector<uint8_t> bytes = build(layout);
    File f(path);
    f.write_at(bytes.data(), bytes.size(), 0);
    f.close();
}

namespace {

constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ8_0 = 8, kGgmlBf16 = 30;

// The ggml type id of a GGUF expert format (bf16: the expert dtype's type).
uint32_t ggml_type_of(Format f, Dtype xd) {
    switch (f) {
        case Format::q4_0: return 2;
        case Format::q8_0: return 8;
        case Format::q2_k: return 10;
        case Format::q3_k: return 11;
        case Format::q4_k: return 12;
        case Format::q5_k: return 13;
        case Format::q6_k: return 14;
        case Format::iq4_xs: return 23;
        case Format::mxfp4: return 39;
        case Format::bf16: return xd == Dtype::bf16 ? kGgmlBf16 : xd == Dtype::f16 ? kGgmlF16 : kGgmlF32;
        default: break;
    }
    fail(FT_ERR_INVALID_ARGUMENT, "synth: GGUF experts cannot be ", format_name(f));
}

// general.* and the architecture's hyperparameters, plus tokenizer arrays as real files carry.
void add_gguf_metadata(GgufWriter &w, const Spec &s) {
    const std::string a = s.gguf_arch + ".";
    w.kv_string("general.architecture", s.gguf_arch);
    w.kv_string("general.name", "freetoken synthetic");
    w.kv_u32(a + "block_count", static_cast<uint32_t>(s.num_layers));
    w.kv_u32(a + "context_length", 4096);
    w.kv_u32(a + "embedding_length", static_cast<uint32_t>(s.hidden));
    w.kv_u32(a + "expert_count", static_cast<uint32_t>(s.num_experts));
    w.kv_u32(a + "expert_used_count", static_cast<uint32_t>(s.top_k));
    w.kv_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.intermediate));
    if (s.shared_intermediate > 0)
        w.kv_u32(a + "expert_shared_feed_forward_length", static_cast<uint32_t>(s.shared_intermediate));
    if (s.first_dense > 0) w.kv_u32(a + "leading_dense_block_count", static_cast<uint32_t>(s.first_dense));
    w.kv_bool(a + "expert_weights_norm", s.norm_topk_prob);
    w.kv_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
    w.kv_f64("general.synthetic_f64", 0.25);
    w.kv_strings("tokenizer.ggml.tokens", {"<s>", "</s>", "a", "b", "hello"});
    w.kv_f32s("tokenizer.ggml.scores", {0.0f, 0.0f, -1.0f, -2.0f, -3.5f});
}

// Element values of a float tensor keyed `key`, stored as `d`.
std::vector<uint8_t> float_tensor(uint64_t key, uint64_t n, float scale, Dtype d) {
    const size_t es = dtype_size(d);
    std::vector<uint8_t> data(n * es);
    for (uint64_t i = 0; i < n; ++i) store(value(key, i, scale), d, &data[i * es]);
    return data;
}

// `rows` rows of K elements keyed `key` in format f: blocks of a block format, ggml MXFP4
// blocks, or values in the expert dtype (bf16).
std::vector<uint8_t> matrix_bytes(const Spec &s, Format f, uint64_t key, uint64_t rows, uint64_t K, float scale) {
    if (format_is_block(f)) return bytes_of(block_byte_fn(f), key, 0, rows * block_row_bytes(f, static_cast<int64_t>(K)));
    if (f == Format::mxfp4) return bytes_of(ggml_mxfp4_byte, key, 0, rows * (K / 32) * 17);
    return float_tensor(key, rows * K, scale, parse_dtype(s.expert_dtype));
}

// The bytes of one projection of every expert of layer l: [E][rows][K], the kinds of each expert
// back to back (gate then up for a fused tensor).
std::vector<uint8_t> gguf_expert_tensor(const Spec &s, Format f, int l, std::initializer_list<Kind> kinds,
                                        uint64_t rows, uint64_t K, float scale) {
    std::vector<uint8_t> data;
    for (int e = 0; e < s.num_experts; ++e)
        for (Kind k : kinds) append(data, matrix_bytes(s, f, tensor_key(s, l, k, e), rows, K, scale));
    return data;
}

// f32 values of the tensor keyed (layer, kOther): offset + value(scale).
std::vector<uint8_t> f32_tensor(const Spec &s, int layer, uint64_t n, float offset, float scale) {
    std::vector<uint8_t> out(n * 4);
    for (uint64_t i = 0; i < n; ++i) {
        const float v = offset + value(tensor_key(s, layer, kOther, 0), i, scale);
        std::memcpy(&out[i * 4], &v, 4);
    }
    return out;
}

// MXFP4 biases [n, E] in F32: element j of expert e is value(key(kind, e), first + j, 0.5).
std::vector<uint8_t> bias_tensor(const Spec &s, int l, Kind kind, uint64_t first, uint64_t n) {
    std::vector<uint8_t> out;
    for (int e = 0; e < s.num_experts; ++e) {
        const uint64_t key = tensor_key(s, l, kind, e);
        for (uint64_t j = 0; j < n; ++j) append(out, le_bytes(value(key, first + j, 0.5f)));
    }
    return out;
}

struct PendingTensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::vector<uint8_t> data;
};

// One MoE block: its router (BF16), its routed experts and its shared expert.
void add_gguf_moe_layer(std::vector<PendingTensor> &w, const Spec &s, int moe_index, int l, const std::string &b) {
    const uint64_t E = static_cast<uint64_t>(s.num_experts), H = static_cast<uint64_t>(s.hidden),
                   I = static_cast<uint64_t>(s.intermediate);
    const MatrixFormats mf = gguf_layer_formats(s, moe_index);
    const Dtype xd = parse_dtype(s.expert_dtype);
    const uint32_t gt = ggml_type_of(mf.gate_up, xd), dt = ggml_type_of(mf.down, xd);
    const float sh = 1.0f / std::sqrt(static_cast<float>(H)), si = 1.0f / std::sqrt(static_cast<float>(I));
    std::vector<uint8_t> router(E * H * 2);
    for (uint64_t i = 0; i < E * H; ++i) {
        const uint16_t v = f32_to_bf16(value(tensor_key(s, l, kRouter, 0), i, sh));
        std::memcpy(&router[i * 2], &v, 2);
    }
    w.push_back({b + "ffn_gate_inp.weight", {H, E}, kGgmlBf16, router});
    if (s.gguf_fused_gate_up) {
        w.push_back({b + "ffn_gate_up_exps.weight", {H, 2 * I, E}, gt,
                     gguf_expert_tensor(s, mf.gate_up, l, {kGate, kUp}, I, H, sh)});
    } else {
        w.push_back({b + "ffn_gate_exps.weight", {H, I, E}, gt, gguf_expert_tensor(s, mf.gate_up, l, {kGate}, I, H, sh)});
        w.push_back({b + "ffn_up_exps.weight", {H, I, E}, gt, gguf_expert_tensor(s, mf.gate_up, l, {kUp}, I, H, sh)});
    }
    w.push_back({b + "ffn_down_exps.weight", {I, H, E}, dt, gguf_expert_tensor(s, mf.down, l, {kDown}, H, I, si)});
    if (mf.gate_up == Format::mxfp4) {
        if (s.gguf_fused_gate_up) {
            w.push_back({b + "ffn_gate_up_exps.bias", {2 * I, E}, kGgmlF32, bias_tensor(s, l, kGateUpBias, 0, 2 * I)});
        } else {
            w.push_back({b + "ffn_gate_exps.bias", {I, E}, kGgmlF32, bias_tensor(s, l, kGateUpBias, 0, I)});
            w.push_back({b + "ffn_up_exps.bias", {I, E}, kGgmlF32, bias_tensor(s, l, kGateUpBias, I, I)});
        }
        w.push_back({b + "ffn_down_exps.bias", {H, E}, kGgmlF32, bias_tensor(s, l, kDownBias, 0, H)});
    }
    if (s.shared_intermediate > 0) {
        const uint64_t Is = static_cast<uint64_t>(s.shared_intermediate);
        const Format sf = gguf_shared_format(s, moe_index);
        const uint32_t st = ggml_type_of(sf, xd);
        const float sis = 1.0f / std::sqrt(static_cast<float>(Is));
        w.push_back({b + "ffn_gate_shexp.weight", {H, Is}, st, matrix_bytes(s, sf, tensor_key(s, l, kSharedGate, 0), Is, H, sh)});
        w.push_back({b + "ffn_up_shexp.weight", {H, Is}, st, matrix_bytes(s, sf, tensor_key(s, l, kSharedUp, 0), Is, H, sh)});
        w.push_back({b + "ffn_down_shexp.weight", {Is, H}, st,
                     matrix_bytes(s, sf, tensor_key(s, l, kSharedDown, 0), H, Is, sis)});
        if (s.gguf_shared_gate)
            w.push_back({b + "ffn_gate_inp_shexp.weight", {H}, ggml_type_of(Format::bf16, xd),
                         float_tensor(tensor_key(s, l, kSharedGateProj, 0), H, sh, xd)});
    }
}

void set_alignment(GgufWriter &w, const Spec &s) {
    if (s.gguf_alignment != 32) {
        w.kv_u32("general.alignment", s.gguf_alignment);
        w.set_alignment(s.gguf_alignment);
    }
}

}  // namespace

MatrixFormats detail::gguf_layer_formats(const Spec &s, int moe_layer) {
    const Format f = parse_format(s.format);
    if (s.gguf_mix.empty()) return {f, f};
    const std::string &m = s.gguf_mix[static_cast<size_t>(moe_layer) % s.gguf_mix.size()];
    const size_t slash = m.find('/');
    if (slash == std::string::npos) fail(FT_ERR_INVALID_ARGUMENT, "synth: gguf_mix entry '", m, "' is not GATEUP/DOWN");
    return {parse_format(m.substr(0, slash)), parse_format(m.substr(slash + 1))};
}

Format detail::gguf_shared_format(const Spec &s, int moe_layer) {
    if (!s.gguf_shared_format.empty()) return parse_format(s.gguf_shared_format);
    const Format f = gguf_layer_formats(s, moe_layer).gate_up;
    return format_is_block(f) ? f : Format::bf16;
}

std::string gguf_part_path(const std::string &path, int part, int parts) {
    const std::string stem = path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0
                                 ? path.substr(0, path.size() - 5) : path;
    char buf[32];
    std::snprintf(buf, sizeof buf, "-%05d-of-%05d.gguf", part, parts);
    return stem + buf;
}

void write_gguf(const std::string &path, const Spec &s) {
    check_spec(s);
    if (!s.gguf) fail(FT_ERR_INVALID_ARGUMENT, "synth: write_gguf needs spec.gguf = true");
    if (s.gguf_splits < 1 || s.gguf_splits > 99999) fail(FT_ERR_INVALID_ARGUMENT, "synth: gguf_splits must be in [1, 99999]");
    const uint64_t H = static_cast<uint64_t>(s.hidden);
    const std::vector<int> moe = moe_layers(s);
    for (size_t i = 0; i < moe.size(); ++i) {
        const MatrixFormats mf = gguf_layer_formats(s, static_cast<int>(i));
        for (Format f : {mf.gate_up, mf.down, gguf_shared_format(s, static_cast<int>(i))}) {
            ggml_type_of(f, parse_dtype(s.expert_dtype));
            const std::string gerr = format_geometry_error(f, s.hidden, s.intermediate);
            if (!gerr.empty()) fail(FT_ERR_INVALID_ARGUMENT, "synth: ", gerr);
        }
    }
    std::vector<PendingTensor> tensors;
    tensors.push_back({"token_embd.weight", {H, 16}, kGgmlF32, f32_tensor(s, -1, H * 16, 0.0f, 0.5f)});
    for (int l = 0; l < s.num_layers; ++l) {
        const std::string b = "blk." + std::to_string(l) + ".";
        tensors.push_back({b + "attn_norm.weight", {H}, kGgmlF32, f32_tensor(s, l, H, 1.0f, 0.1f)});
        const auto it = std::find(moe.begin(), moe.end(), l);
        if (it == moe.end()) {
            // A dense layer: a Q8_0 tensor, which FreeToken never reads but must validate.
            tensors.push_back({b + "ffn_up.weight", {H, 4}, kGgmlQ8_0, std::vector<uint8_t>(H / 32 * 34 * 4, 0x11)});
            continue;
        }
        add_gguf_moe_layer(tensors, s, static_cast<int>(it - moe.begin()), l, b);
    }
    const int n = s.gguf_splits;
    std::vector<GgufWriter> parts(static_cast<size_t>(n));
    add_gguf_metadata(parts[0], s);
    for (int k = 0; k < n; ++k) {
        GgufWriter &w = parts[static_cast<size_t>(k)];
        set_alignment(w, s);
        if (n > 1) {
            w.kv_raw("split.no", 2, le_bytes<uint16_t>(static_cast<uint16_t>(k)));
            w.kv_raw("split.count", 2, le_bytes<uint16_t>(static_cast<uint16_t>(n)));
            w.kv_i32("split.tensors.count", static_cast<int32_t>(tensors.size()));
        }
    }
    // Tensors in order, part k taking the k-th share.
    for (size_t i = 0; i < tensors.size(); ++i) {
        PendingTensor &t = tensors[i];
        parts[i * static_cast<size_t>(n) / tensors.size()].tensor(t.name, t.dims, t.type, std::move(t.data));
    }
    if (n == 1) {
        parts[0].write(path);
        return;
    }
    for (int k = 0; k < n; ++k) parts[static_cast<size_t>(k)].write(gguf_part_path(path, k + 1, n));
}

}  // namespace ft::synth
