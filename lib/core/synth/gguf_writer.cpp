// GGUF v3 files: the byte-level GgufWriter tests use to build valid or broken files, and
// write_gguf, a MoE model in llama.cpp's tensor names with Q4_0 or float experts.
#include <algorithm>
#include <cmath>
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

constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ8_0 = 8, kGgmlBf16 = 30;

// general.* and the architecture's hyperparameters, plus tokenizer arrays as real files carry.
void add_gguf_metadata(GgufWriter &w, const Spec &s) {
    const std::string a = s.gguf_arch + ".";
    w.kv_string("general.architecture", s.gguf_arch);
    w.kv_string("general.name", "freetoken synthetic");
    if (s.gguf_alignment != 32) {
        w.kv_u32("general.alignment", s.gguf_alignment);
        w.set_alignment(s.gguf_alignment);
    }
    w.kv_u32(a + "block_count", static_cast<uint32_t>(s.num_layers));
    w.kv_u32(a + "context_length", 4096);
    w.kv_u32(a + "embedding_length", static_cast<uint32_t>(s.hidden));
    w.kv_u32(a + "expert_count", static_cast<uint32_t>(s.num_experts));
    w.kv_u32(a + "expert_used_count", static_cast<uint32_t>(s.top_k));
    w.kv_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.intermediate));
    if (s.first_dense > 0) w.kv_u32(a + "leading_dense_block_count", static_cast<uint32_t>(s.first_dense));
    w.kv_bool(a + "expert_weights_norm", s.norm_topk_prob);
    w.kv_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
    w.kv_f64("general.synthetic_f64", 0.25);
    w.kv_strings("tokenizer.ggml.tokens", {"<s>", "</s>", "a", "b", "hello"});
    w.kv_f32s("tokenizer.ggml.scores", {0.0f, 0.0f, -1.0f, -2.0f, -3.5f});
}

// The bytes of one projection of every expert of layer l: [E][rows][K], the kinds of each expert
// back to back (gate then up for a fused tensor), in Q4_0 or the expert dtype.
std::vector<uint8_t> gguf_expert_tensor(const Spec &s, int l, std::initializer_list<Kind> kinds, uint64_t rows,
                                        uint64_t K, float scale) {
    const Format f = parse_format(s.format);
    const Dtype xd = parse_dtype(s.expert_dtype);
    std::vector<uint8_t> data;
    for (int e = 0; e < s.num_experts; ++e) {
        for (Kind k : kinds) {
            const uint64_t key = tensor_key(s, l, k, e);
            if (f == Format::q4_0) {
                append(data, bytes_of(q4_0_byte, key, 0, rows * (K / 32) * kQ4_0BlockBytes));
            } else {
                const size_t es = dtype_size(xd);
                const size_t at = data.size();
                data.resize(at + rows * K * es);
                for (uint64_t i = 0; i < rows * K; ++i) store(value(key, i, scale), xd, &data[at + i * es]);
            }
        }
    }
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

// One MoE block: its router (BF16) and its routed experts.
void add_gguf_moe_layer(GgufWriter &w, const Spec &s, int l, const std::string &b) {
    const uint64_t E = static_cast<uint64_t>(s.num_experts), H = static_cast<uint64_t>(s.hidden),
                   I = static_cast<uint64_t>(s.intermediate);
    const Format f = parse_format(s.format);
    const Dtype xd = parse_dtype(s.expert_dtype);
    const uint32_t float_type = xd == Dtype::bf16 ? kGgmlBf16 : xd == Dtype::f16 ? kGgmlF16 : kGgmlF32;
    const uint32_t xt = f == Format::q4_0 ? kGgmlQ4_0 : float_type;
    const float sh = 1.0f / std::sqrt(static_cast<float>(H)), si = 1.0f / std::sqrt(static_cast<float>(I));
    std::vector<uint8_t> router(E * H * 2);
    for (uint64_t i = 0; i < E * H; ++i) {
        const uint16_t v = f32_to_bf16(value(tensor_key(s, l, kRouter, 0), i, sh));
        std::memcpy(&router[i * 2], &v, 2);
    }
    w.tensor(b + "ffn_gate_inp.weight", {H, E}, kGgmlBf16, router);
    if (s.gguf_fused_gate_up) {
        w.tensor(b + "ffn_gate_up_exps.weight", {H, 2 * I, E}, xt, gguf_expert_tensor(s, l, {kGate, kUp}, I, H, sh));
    } else {
        w.tensor(b + "ffn_gate_exps.weight", {H, I, E}, xt, gguf_expert_tensor(s, l, {kGate}, I, H, sh));
        w.tensor(b + "ffn_up_exps.weight", {H, I, E}, xt, gguf_expert_tensor(s, l, {kUp}, I, H, sh));
    }
    w.tensor(b + "ffn_down_exps.weight", {I, H, E}, xt, gguf_expert_tensor(s, l, {kDown}, H, I, si));
}

}  // namespace

void write_gguf(const std::string &path, const Spec &s) {
    check_spec(s);
    if (!s.gguf) fail(FT_ERR_INVALID_ARGUMENT, "synth: write_gguf needs spec.gguf = true");
    const Format f = parse_format(s.format);
    if (f != Format::q4_0 && f != Format::bf16)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: GGUF experts are q4_0 or bf16, not ", s.format);
    const uint64_t H = static_cast<uint64_t>(s.hidden);
    GgufWriter w;
    add_gguf_metadata(w, s);
    const std::vector<int> moe = moe_layers(s);
    w.tensor("token_embd.weight", {H, 16}, kGgmlF32, f32_tensor(s, -1, H * 16, 0.0f, 0.5f));
    for (int l = 0; l < s.num_layers; ++l) {
        const std::string b = "blk." + std::to_string(l) + ".";
        w.tensor(b + "attn_norm.weight", {H}, kGgmlF32, f32_tensor(s, l, H, 1.0f, 0.1f));
        if (std::find(moe.begin(), moe.end(), l) == moe.end()) {
            // A dense layer: a Q8_0 tensor, which FreeToken never reads but must validate.
            w.tensor(b + "ffn_up.weight", {H, 4}, kGgmlQ8_0, std::vector<uint8_t>(H / 32 * 34 * 4, 0x11));
            continue;
        }
        add_gguf_moe_layer(w, s, l, b);
    }
    w.write(path);
}

}  // namespace ft::synth
