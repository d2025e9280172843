// The tensors of a synthetic checkpoint, named as each architecture's releases name them: layer
// prefixes, MoE block names, per-expert or fused expert tensors in every format, shared experts.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "synth_internal.hpp"

namespace ft::synth {

namespace detail {

namespace {

bool is_deepseek_like(const std::string &a) { return a == "deepseek_v3" || a == "kimi_k2" || a == "glm4_moe"; }
bool is_row_quant(Format f) { return f == Format::fp8_block || f == Format::nvfp4 || f == Format::ds_fp4; }
bool is_qwen(const std::string &a) { return a == "qwen3_moe" || a == "qwen3_5_moe"; }

// Layers before first_dense are dense (DeepSeek-style configs, DeepSeek-V4, GGUF files).
bool has_leading_dense(const Spec &s) {
    return s.gguf || is_deepseek_like(s.architecture) || s.architecture == "deepseek_v4";
}

}  // namespace

void check_spec(const Spec &s) {
    static const char *const archs[] = {"qwen3_moe", "qwen3_5_moe", "mixtral",     "deepseek_v3",
                                        "kimi_k2",   "glm4_moe",    "gpt_oss", "deepseek_v4"};
    if (std::find(std::begin(archs), std::end(archs), s.architecture) == std::end(archs))
        fail(FT_ERR_INVALID_ARGUMENT, "synth: unknown architecture '", s.architecture, "'");
    if (s.num_layers <= 0 || s.num_experts <= 0 || s.top_k <= 0 || s.hidden <= 0 || s.intermediate <= 0 ||
        s.shards <= 0 || s.shards > 99999)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: sizes must be positive");
    if (is_deepseek_like(s.architecture) && s.shared_intermediate % s.intermediate != 0)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: ", s.architecture, " shared_intermediate must be a multiple of intermediate");
    if (s.architecture == "glm4_moe" && s.shared_intermediate == 0)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: glm4_moe always has a shared expert (set shared_intermediate)");
    if ((s.architecture == "qwen3_moe" || s.architecture == "mixtral") && s.shared_intermediate != 0 && !s.gguf)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: ", s.architecture, " has no shared expert");
    parse_dtype(s.expert_dtype);
    const Format f = parse_format(s.format);
    if ((f == Format::mxfp4) != (s.architecture == "gpt_oss") && !s.gguf)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: gpt_oss is written in mxfp4 and mxfp4 only for gpt_oss");
    if ((f == Format::ds_fp4) != (s.architecture == "deepseek_v4") && !s.gguf)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: deepseek_v4 is written in ds_fp4 and ds_fp4 only for deepseek_v4");
    if (s.architecture == "gpt_oss" && s.shared_intermediate != 0)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: gpt_oss is written without a shared expert");
    if (s.architecture == "deepseek_v4" && s.shared_intermediate != 0 &&
        (s.shared_intermediate % s.intermediate != 0 || s.shared_intermediate % 128 != 0 || s.hidden % 128 != 0))
        fail(FT_ERR_INVALID_ARGUMENT, "synth: deepseek_v4's FP8 shared expert needs shared_intermediate a multiple of "
             "intermediate and of 128, and hidden a multiple of 128");
    if (s.hash_layers < 0 || s.hash_layers > s.num_layers || (s.hash_layers > 0 && s.architecture != "deepseek_v4"))
        fail(FT_ERR_INVALID_ARGUMENT, "synth: hash_layers must be in [0, num_layers], and only for deepseek_v4");
    if (s.vocab_size <= 0 || (s.tid2eid_dtype != "I32" && s.tid2eid_dtype != "I64"))
        fail(FT_ERR_INVALID_ARGUMENT, "synth: vocab_size must be positive, tid2eid_dtype I32 or I64");
    if (s.ds_shared_scale_dtype != "F8_E8M0" && s.ds_shared_scale_dtype != "F32" && s.ds_shared_scale_dtype != "BF16")
        fail(FT_ERR_INVALID_ARGUMENT, "synth: ds_shared_scale_dtype '", s.ds_shared_scale_dtype, "' (F8_E8M0, F32, BF16)");
    if (is_row_quant(f) && s.layout != Spec::Layout::per_expert)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: ", s.format, " checkpoints are written per expert");
    if (s.fp8_scale_dtype != "F32" && s.fp8_scale_dtype != "BF16")
        fail(FT_ERR_INVALID_ARGUMENT, "synth: fp8_scale_dtype '", s.fp8_scale_dtype, "' (F32, BF16)");
    if (s.e8m0_dtype != "F8_E8M0" && s.e8m0_dtype != "U8")
        fail(FT_ERR_INVALID_ARGUMENT, "synth: e8m0_dtype '", s.e8m0_dtype, "' (F8_E8M0, U8)");
}

namespace {

std::string layer_prefix(const Spec &s, int layer) {
    if (s.architecture == "deepseek_v4") return "layers." + std::to_string(layer) + ".";  // no model. prefix
    return std::string(s.language_model_prefix ? "model.language_model.layers." : "model.layers.") +
           std::to_string(layer) + ".";
}

// Mixtral's per-expert exports use block_sparse_moe.{w1,w3,w2}; its fused (newer transformers)
// form and every other architecture use mlp.
std::string moe_block(const Spec &s) {
    if (s.architecture == "deepseek_v4") return "ffn.";
    return s.architecture == "mixtral" && s.layout == Spec::Layout::per_expert ? "block_sparse_moe." : "mlp.";
}

// Appends the tensors of MoE layer `l` to `out`, one entry kind per method.
struct LayerTensors {
    const Spec &s;
    int l;
    std::vector<TensorDesc> &out;
    Dtype xd;  // expert dtype of the float formats

    void plain(std::string name, Dtype d, std::vector<int64_t> shape, Kind kind, int expert, float scale) {
        TensorDesc t;
        t.name = std::move(name);
        t.dtype = d;
        t.shape = std::move(shape);
        t.layer = l;
        t.kind = kind;
        t.expert = expert;
        t.scale = scale;
        out.push_back(std::move(t));
    }
    void fused(std::string name, std::vector<int64_t> shape, Mode mode) {
        TensorDesc t;
        t.name = std::move(name);
        t.dtype = xd;
        t.shape = std::move(shape);
        t.mode = mode;
        t.layer = l;
        out.push_back(std::move(t));
    }
    void raw(std::string name, const char *dtype, size_t es, std::vector<int64_t> shape,
             std::function<void(uint64_t, uint64_t, uint8_t *)> fn) {
        TensorDesc t;
        t.name = std::move(name);
        t.shape = std::move(shape);
        t.layer = l;
        t.raw_dtype = dtype;
        t.raw_es = es;
        t.raw = std::move(fn);
        out.push_back(std::move(t));
    }
    void raw_bytes(std::string name, const char *dtype, std::vector<int64_t> shape, ByteFn fn, uint64_t key) {
        raw(std::move(name), dtype, 1, std::move(shape),
            [fn, key](uint64_t first, uint64_t count, uint8_t *o) { fill_bytes(fn, key, first, count, o); });
    }
    // fp8_block weight_scale_inv values, stored as F32 or BF16 (exact either way).
    void fp8_scales(std::string name, std::vector<int64_t> shape, uint64_t key) {
        const bool f32 = s.fp8_scale_dtype == "F32";
        raw(std::move(name), f32 ? "F32" : "BF16", f32 ? 4 : 2, std::move(shape),
            [f32, key](uint64_t first, uint64_t count, uint8_t *o) {
                for (uint64_t i = 0; i < count; ++i) {
                    const float v = fp8_scale_inv(key, first + i);
                    if (f32) {
                        std::memcpy(o + 4 * i, &v, 4);
                    } else {
                        const uint16_t h = f32_to_bf16(v);
                        std::memcpy(o + 2 * i, &h, 2);
                    }
                }
            });
    }
};

// The router weight and, where the architecture has them, its biases.
void add_router(LayerTensors &lt, const std::string &b) {
    const Spec &s = lt.s;
    const int64_t E = s.num_experts, H = s.hidden;
    const float sh = 1.0f / std::sqrt(static_cast<float>(H));
    if (s.architecture == "gpt_oss") {
        lt.plain(b + "router.weight", Dtype::bf16, {E, H}, kRouter, 0, sh);
        lt.plain(b + "router.bias", Dtype::bf16, {E}, kBias, 0, 0.05f);
    } else {
        lt.plain(b + "gate.weight", Dtype::bf16, {E, H}, kRouter, 0, sh);
        if (is_deepseek_like(s.architecture)) lt.plain(b + "gate.e_score_correction_bias", Dtype::f32, {E}, kBias, 0, 0.05f);
        if (s.architecture == "deepseek_v4" && lt.l >= s.hash_layers) {
            lt.plain(b + "gate.bias", Dtype::f32, {E}, kBias, 0, 0.05f);
        } else if (s.architecture == "deepseek_v4") {
            // A hash-routed layer: its experts come from the token id, and it has no bias.
            const bool i64 = s.tid2eid_dtype == "I64";
            const Spec sc = s;
            const int l = lt.l;
            lt.raw(b + "gate.tid2eid", i64 ? "I64" : "I32", i64 ? 8 : 4, {s.vocab_size, s.top_k},
                   [sc, l, i64](uint64_t first, uint64_t count, uint8_t *o) {
                       for (uint64_t i = 0; i < count; ++i) {
                           const int64_t v = tid2eid_value(sc, l, first + i);
                           if (i64) {
                               std::memcpy(o + 8 * i, &v, 8);
                           } else {
                               const int32_t v32 = static_cast<int32_t>(v);
                               std::memcpy(o + 4 * i, &v32, 4);
                           }
                       }
                   });
        }
    }
}

// gpt-oss: fused over experts; blocks [E, N, K/32, 16], scales [E, N, K/32], bias [E, N].
void add_mxfp4_experts(LayerTensors &lt, const std::string &b) {
    const Spec &s = lt.s;
    const int l = lt.l;
    const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate;
    for (int down = 0; down < 2; ++down) {
        const std::string n = b + "experts." + (down ? "down_proj" : "gate_up_proj");
        const int64_t N = down ? H : 2 * I, K = down ? I : H;
        const Kind kb = down ? kDownBlocks : kGateUpBlocks, ks = down ? kDownScales : kGateUpScales,
                   kbias = down ? kDownBias : kGateUpBias;
        const uint64_t per_blocks = static_cast<uint64_t>(N * K / 2), per_scales = static_cast<uint64_t>(N * K / 32);
        const Spec sc = s;
        auto experts_bytes = [sc, l](Kind kind, ByteFn fn, uint64_t per) {
            return [sc, l, kind, fn, per](uint64_t first, uint64_t count, uint8_t *o) {
                for (uint64_t i = 0; i < count; ++i) {
                    const uint64_t g = first + i;
                    o[i] = fn(tensor_key(sc, l, kind, static_cast<int>(g / per)), g % per);
                }
            };
        };
        lt.raw(n + "_blocks", "U8", 1, {E, N, K / 32, 16}, experts_bytes(kb, any_byte, per_blocks));
        lt.raw(n + "_scales", "U8", 1, {E, N, K / 32}, experts_bytes(ks, e8m0_byte, per_scales));
        lt.raw(n + "_bias", "BF16", 2, {E, N}, [sc, l, kbias, N](uint64_t first, uint64_t count, uint8_t *o) {
            for (uint64_t i = 0; i < count; ++i) {
                const uint64_t g = first + i;
                const uint16_t h = f32_to_bf16(value(tensor_key(sc, l, kbias, static_cast<int>(g / N)), g % N, 0.5f));
                std::memcpy(o + 2 * i, &h, 2);
            }
        });
    }
}

// fp8_block, nvfp4, ds_fp4: per-expert tensors in the layout of the format's real exports.
void add_row_quant_experts(LayerTensors &lt, const std::string &b, Format fmt) {
    const Spec &s = lt.s;
    const int l = lt.l;
    const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate;
    const bool w = s.architecture == "mixtral" || s.architecture == "deepseek_v4";
    const char *names[3] = {w ? "w1" : "gate_proj", w ? "w3" : "up_proj", w ? "w2" : "down_proj"};
    const Kind wk[3] = {kGate, kUp, kDown}, sk[3] = {kGateScale, kUpScale, kDownScale},
               gk[3] = {kGateGlobal, kUpGlobal, kDownGlobal};
    for (int e = 0; e < E; ++e) {
        for (int p = 0; p < 3; ++p) {
            const std::string base = b + "experts." + std::to_string(e) + "." + names[p] + ".";
            const int64_t N = p == 2 ? H : I, K = p == 2 ? I : H;
            const uint64_t wkey = tensor_key(s, l, wk[p], e), skey = tensor_key(s, l, sk[p], e);
            if (fmt == Format::fp8_block) {
                lt.raw_bytes(base + "weight", "F8_E4M3", {N, K}, fp8_weight_byte, wkey);
                lt.fp8_scales(base + "weight_scale_inv", {N / 128, K / 128}, skey);
            } else if (fmt == Format::nvfp4) {
                lt.raw_bytes(base + "weight", "U8", {N, K / 2}, any_byte, wkey);
                lt.raw_bytes(base + "weight_scale", "F8_E4M3", {N, K / 16}, e4m3_scale_byte, skey);
                if (!s.drop_weight_scale_2) {
                    const float g = nvfp4_global(tensor_key(s, l, gk[p], e));
                    lt.raw(base + "weight_scale_2", "F32", 4, {}, [g](uint64_t, uint64_t, uint8_t *o) { std::memcpy(o, &g, 4); });
                }
                const float in_scale = 1.0f / 448.0f;  // ModelOpt's activation scale; not used by FreeToken
                lt.raw(base + "input_scale", "F32", 4, {}, [in_scale](uint64_t, uint64_t, uint8_t *o) { std::memcpy(o, &in_scale, 4); });
            } else {  // ds_fp4
                lt.raw_bytes(base + "weight", "I8", {N, K / 2}, any_byte, wkey);
                lt.raw_bytes(base + "scale", s.e8m0_dtype.c_str(), {N, K / 32}, e8m0_byte, skey);
            }
        }
    }
}

// bf16 (in expert_dtype): per expert, or fused over experts in either orientation.
void add_float_experts(LayerTensors &lt, const std::string &b) {
    const Spec &s = lt.s;
    const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate;
    const float sh = 1.0f / std::sqrt(static_cast<float>(H));
    switch (s.layout) {
        case Spec::Layout::per_expert: {
            const bool w = s.architecture == "mixtral";
            for (int e = 0; e < E; ++e) {
                const std::string p = b + "experts." + std::to_string(e) + ".";
                lt.plain(p + (w ? "w1" : "gate_proj") + ".weight", lt.xd, {I, H}, kGate, e, sh);
                lt.plain(p + (w ? "w2" : "down_proj") + ".weight", lt.xd, {H, I}, kDown, e,
                         1.0f / std::sqrt(static_cast<float>(I)));
                lt.plain(p + (w ? "w3" : "up_proj") + ".weight", lt.xd, {I, H}, kUp, e, sh);
            }
            break;
        }
        case Spec::Layout::fused:
            lt.fused(b + "experts.gate_up_proj", {E, 2 * I, H}, Mode::gate_up);
            lt.fused(b + "experts.down_proj", {E, H, I}, Mode::down);
            break;
        case Spec::Layout::fused_transposed:
            lt.fused(b + "experts.gate_up_proj", {E, H, 2 * I}, Mode::gate_up_t);
            lt.fused(b + "experts.down_proj", {E, I, H}, Mode::down_t);
            break;
    }
}

// The shared expert (and Qwen3.5's shared_expert_gate), when the spec has one.
void add_shared_expert(LayerTensors &lt, const std::string &b, Format fmt) {
    const Spec &s = lt.s;
    const int l = lt.l;
    const int64_t H = s.hidden, Is = s.shared_intermediate;
    const float sh = 1.0f / std::sqrt(static_cast<float>(H));
    if (Is > 0 && s.architecture == "deepseek_v4") {
        // DeepSeek-V4: w1 (gate), w3 (up), w2 (down) in e4m3 with 128 x 128 block scales in `.scale`.
        const char *names[3] = {"w1", "w3", "w2"};
        const Kind wk[3] = {kSharedGate, kSharedUp, kSharedDown}, sk[3] = {kSharedGateScale, kSharedUpScale, kSharedDownScale};
        for (int q = 0; q < 3; ++q) {
            const std::string p = b + "shared_experts." + names[q] + ".";
            const int64_t N = q == 2 ? H : Is, K = q == 2 ? Is : H;
            lt.raw_bytes(p + "weight", "F8_E4M3", {N, K}, fp8_weight_byte, tensor_key(s, l, wk[q], 0));
            const uint64_t skey = tensor_key(s, l, sk[q], 0);
            if (s.ds_shared_scale_dtype == "F8_E8M0") {
                lt.raw_bytes(p + "scale", "F8_E8M0", {N / 128, K / 128}, ds_shared_scale_byte, skey);
            } else {
                const bool f32 = s.ds_shared_scale_dtype == "F32";
                lt.raw(p + "scale", f32 ? "F32" : "BF16", f32 ? 4 : 2, {N / 128, K / 128},
                       [f32, skey](uint64_t first, uint64_t count, uint8_t *o) {
                           for (uint64_t i = 0; i < count; ++i) {
                               const float v = fp8_scale_inv(skey, first + i);
                               if (f32) {
                                   std::memcpy(o + 4 * i, &v, 4);
                               } else {
                                   const uint16_t h = f32_to_bf16(v);
                                   std::memcpy(o + 2 * i, &h, 2);
                               }
                           }
                       });
            }
        }
    } else if (Is > 0 && fmt == Format::fp8_block) {
        // Block-FP8 exports quantise the shared expert as well (its sigmoid gate stays bf16).
        const std::string p = b + (s.architecture == "qwen3_5_moe" ? "shared_expert." : "shared_experts.");
        const char *names[3] = {"gate_proj", "up_proj", "down_proj"};
        const Kind wk[3] = {kSharedGate, kSharedUp, kSharedDown}, sk[3] = {kSharedGateScale, kSharedUpScale, kSharedDownScale};
        for (int q = 0; q < 3; ++q) {
            const int64_t N = q == 2 ? H : Is, K = q == 2 ? Is : H;
            lt.raw_bytes(p + names[q] + ".weight", "F8_E4M3", {N, K}, fp8_weight_byte, tensor_key(s, l, wk[q], 0));
            lt.fp8_scales(p + names[q] + ".weight_scale_inv", {N / 128, K / 128}, tensor_key(s, l, sk[q], 0));
        }
        if (s.architecture == "qwen3_5_moe") lt.plain(b + "shared_expert_gate.weight", Dtype::bf16, {1, H}, kSharedGateProj, 0, sh);
    } else if (Is > 0) {
        const std::string p = b + (s.architecture == "qwen3_5_moe" ? "shared_expert." : "shared_experts.");
        lt.plain(p + "gate_proj.weight", lt.xd, {Is, H}, kSharedGate, 0, sh);
        lt.plain(p + "up_proj.weight", lt.xd, {Is, H}, kSharedUp, 0, sh);
        lt.plain(p + "down_proj.weight", lt.xd, {H, Is}, kSharedDown, 0, 1.0f / std::sqrt(static_cast<float>(Is)));
        if (s.architecture == "qwen3_5_moe") lt.plain(b + "shared_expert_gate.weight", lt.xd, {1, H}, kSharedGateProj, 0, sh);
    }
}

void add_moe_layer(const Spec &s, int l, std::vector<TensorDesc> &out) {
    LayerTensors lt{s, l, out, parse_dtype(s.expert_dtype)};
    const std::string b = layer_prefix(s, l) + moe_block(s);
    const Format fmt = parse_format(s.format);
    add_router(lt, b);
    if (fmt == Format::mxfp4) {
        add_mxfp4_experts(lt, b);
    } else if (is_row_quant(fmt)) {
        add_row_quant_experts(lt, b, fmt);
    } else {
        add_float_experts(lt, b);
    }
    add_shared_expert(lt, b, fmt);
}

}  // namespace

std::vector<TensorDesc> all_tensors(const Spec &s) {
    const int64_t H = s.hidden, I = s.intermediate;
    std::vector<TensorDesc> out;
    auto other = [&](std::string name, std::vector<int64_t> shape, int layer, Kind kind) {
        TensorDesc t;
        t.name = std::move(name);
        t.shape = std::move(shape);
        t.layer = layer;
        t.kind = kind;
        t.scale = 0.5f;
        out.push_back(std::move(t));
    };
    const std::string model = s.language_model_prefix ? "model.language_model." : "model.";
    other(model + "embed_tokens.weight", {16, H}, -1, kOther);
    if (s.language_model_prefix) other("model.visual.patch_embed.proj.weight", {8, 12}, -2, kOther);

    const std::vector<int> moe = moe_layers(s);
    for (int l = 0; l < s.num_layers + (s.mtp_layer ? 1 : 0); ++l) {
        const std::string p = layer_prefix(s, l);
        other(p + "input_layernorm.weight", {H}, l, kOther);
        const bool is_moe = l == s.num_layers || std::find(moe.begin(), moe.end(), l) != moe.end();
        if (is_moe) {
            add_moe_layer(s, l, out);
        } else {  // a dense MLP (DeepSeek's first_k_dense_replace layers, Qwen's mlp_only_layers)
            other(p + "mlp.gate_proj.weight", {I, H}, l, kDenseGate);
            other(p + "mlp.up_proj.weight", {I, H}, l, kDenseUp);
            other(p + "mlp.down_proj.weight", {H, I}, l, kDenseDown);
        }
        if (l == s.num_layers) other(p + "eh_proj.weight", {H, 2 * H}, l, kOther);  // the MTP layer's own
    }
    other("lm_head.weight", {16, H}, -1, kDenseGate);
    return out;
}

}  // namespace detail

std::vector<int> moe_layers(const Spec &s) {
    std::vector<int> out;
    for (int l = 0; l < s.num_layers; ++l) {
        if (detail::is_qwen(s.architecture) && !s.gguf) {
            if (std::find(s.mlp_only_layers.begin(), s.mlp_only_layers.end(), l) == s.mlp_only_layers.end())
                out.push_back(l);
        } else if (detail::has_leading_dense(s)) {
            if (l >= s.first_dense) out.push_back(l);
        } else {
            out.push_back(l);
        }
    }
    return out;
}

}  // namespace ft::synth
