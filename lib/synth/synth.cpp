#include "ft/synth.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "ft/formats.hpp"

namespace ft::synth {

namespace {

using nlohmann::ordered_json;

// ---- values ----------------------------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// What a tensor holds; with the checkpoint layer and expert it seeds the values.
enum Kind : uint64_t {
    kGate = 1, kUp, kDown, kRouter, kBias, kSharedGate, kSharedUp, kSharedDown, kSharedGateProj,
    kDenseGate, kDenseUp, kDenseDown, kOther,
    // Quantised formats: block scales and per-tensor globals of gate / up / down (and of the shared
    // expert), gpt-oss's fused blocks / scales / biases.
    kGateScale, kUpScale, kDownScale, kGateGlobal, kUpGlobal, kDownGlobal,
    kGateUpBlocks, kGateUpScales, kGateUpBias, kDownBlocks, kDownScales, kDownBias,
    kSharedGateScale, kSharedUpScale, kSharedDownScale,
};

uint64_t tensor_key(const Spec &s, int layer, Kind kind, int expert) {
    const uint64_t id = (static_cast<uint64_t>(static_cast<uint32_t>(layer)) << 40) ^ (static_cast<uint64_t>(kind) << 32) ^
                        static_cast<uint32_t>(expert);
    return splitmix64(s.seed ^ splitmix64(id));
}

// Element `index` of the tensor with `key`: uniform in (-scale, scale), never exactly zero.
inline float value(uint64_t key, uint64_t index, float scale) {
    const uint64_t z = splitmix64(key + index * 0x9e3779b97f4a7c15ull);
    const float u = (static_cast<float>(z >> 40) + 0.5f) * (2.0f / 16777216.0f) - 1.0f;
    return u * scale;
}

enum class Dtype { bf16, f16, f32 };

Dtype parse_dtype(const std::string &d) {
    if (d == "BF16") return Dtype::bf16;
    if (d == "F16") return Dtype::f16;
    if (d == "F32") return Dtype::f32;
    fail(FT_ERR_INVALID_ARGUMENT, "synth: expert_dtype '", d, "' (BF16, F16, F32)");
}

const char *dtype_name(Dtype d) { return d == Dtype::bf16 ? "BF16" : d == Dtype::f16 ? "F16" : "F32"; }
size_t dtype_size(Dtype d) { return d == Dtype::f32 ? 4 : 2; }

// The bf16 a loader gets from a value stored as `d`.
uint16_t stored_as_bf16(float v, Dtype d) {
    if (d == Dtype::f16) return f32_to_bf16(f16_to_f32(f32_to_f16(v)));
    return f32_to_bf16(v);
}

void store(float v, Dtype d, uint8_t *out) {
    if (d == Dtype::f32) {
        std::memcpy(out, &v, 4);
    } else {
        const uint16_t h = d == Dtype::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(out, &h, 2);
    }
}


// ---- quantised bytes ----------------------------------------------------------------------------
// Raw bytes of quantised tensors, element i of the tensor with `key`. Every class avoids codes a
// real quantiser never writes (e4m3 NaN, e8m0 255) and keeps scales in a range where the
// dequantised weights are of the usual magnitude; nothing is zero by construction.

uint64_t rnd(uint64_t key, uint64_t index) { return splitmix64(key + index * 0x9e3779b97f4a7c15ull); }

uint8_t any_byte(uint64_t key, uint64_t i) { return static_cast<uint8_t>(rnd(key, i) >> 17); }

// e4m3 weights of fp8_block: any finite code (0x7F / 0xFF, the NaNs, become 0x7E / 0xFE).
uint8_t fp8_weight_byte(uint64_t key, uint64_t i) {
    uint8_t b = any_byte(key, i);
    if ((b & 0x7f) == 0x7f) b ^= 1;
    return b;
}

// Positive e4m3 block scales of nvfp4: exponent field 4..10 (2^-3 .. 2^3), any mantissa.
uint8_t e4m3_scale_byte(uint64_t key, uint64_t i) {
    const uint64_t r = rnd(key, i);
    return static_cast<uint8_t>(((4 + r % 7) << 3) | ((r >> 8) & 7));
}

// e8m0 scales of mxfp4 / ds_fp4: 2^-8 .. 2^1.
uint8_t e8m0_byte(uint64_t key, uint64_t i) { return static_cast<uint8_t>(119 + rnd(key, i) % 10); }

// fp8_block scale_inv: (1 + m/8) * 2^-(8..11), exactly representable in bf16 and f32.
float fp8_scale_inv(uint64_t key, uint64_t i) {
    const uint64_t r = rnd(key, i);
    return std::ldexp(1.0f + static_cast<float>(r % 8) / 8.0f, -8 - static_cast<int>((r >> 8) % 4));
}

// nvfp4 weight_scale_2: a normal fp16 value in [2^-10, 2^-6).
float nvfp4_global(uint64_t key) {
    const uint64_t r = rnd(key, 0);
    return std::ldexp(1.0f + static_cast<float>(r % 1024) / 1024.0f, -10 - static_cast<int>((r >> 10) % 3));
}

// q4_0 blocks: byte i of a run of 18-byte blocks; bytes 0-1 of a block are its fp16 d
// (+-[2^-9, 2^-6)), the other 16 random nibble pairs.
uint8_t q4_0_byte(uint64_t key, uint64_t i) {
    const uint64_t block = i / kQ4_0BlockBytes, off = i % kQ4_0BlockBytes;
    if (off >= 2) return any_byte(key, i);
    const uint64_t r = rnd(key ^ 0x5bd1e9955bd1e995ull, block);
    float d = std::ldexp(1.0f + static_cast<float>(r % 256) / 256.0f, -9 + static_cast<int>((r >> 8) % 3));
    if ((r >> 16) & 1) d = -d;
    const uint16_t h = f32_to_f16(d);
    return static_cast<uint8_t>(off == 0 ? h & 0xff : h >> 8);
}

using ByteFn = uint8_t (*)(uint64_t, uint64_t);

void fill_bytes(ByteFn fn, uint64_t key, uint64_t first, uint64_t count, uint8_t *out) {
    for (uint64_t i = 0; i < count; ++i) out[i] = fn(key, first + i);
}

std::vector<uint8_t> bytes_of(ByteFn fn, uint64_t key, uint64_t first, uint64_t count) {
    std::vector<uint8_t> out(count);
    fill_bytes(fn, key, first, count, out.data());
    return out;
}

void append(std::vector<uint8_t> &dst, const std::vector<uint8_t> &src) { dst.insert(dst.end(), src.begin(), src.end()); }

void append_u16(std::vector<uint8_t> &dst, uint16_t v) {
    dst.push_back(static_cast<uint8_t>(v & 0xff));
    dst.push_back(static_cast<uint8_t>(v >> 8));
}

// ---- tensors ---------------------------------------------------------------------------------

// How stored element g maps to a logical matrix element. `plain`: element g of one matrix.
// The fused layouts hold every expert: [E, 2I, H] (gate rows then up rows), [E, H, 2I],
// [E, H, I] and [E, I, H].
enum class Mode { plain, gate_up, gate_up_t, down, down_t };

struct TensorDesc {
    std::string name;
    Dtype dtype = Dtype::bf16;
    std::vector<int64_t> shape;
    Mode mode = Mode::plain;
    int layer = 0;        // checkpoint layer (seeding)
    Kind kind = kOther;   // plain only
    int expert = 0;       // plain only
    float scale = 1.0f;   // plain only
    // Raw tensors (quantised formats): `raw_dtype` goes in the header, `raw` fills elements
    // [first, first + count) as bytes (raw_es bytes per element).
    std::string raw_dtype;
    size_t raw_es = 1;
    std::function<void(uint64_t first, uint64_t count, uint8_t *out)> raw;
    size_t elem_size() const { return raw ? raw_es : dtype_size(dtype); }
    const char *elem_dtype() const { return raw ? raw_dtype.c_str() : dtype_name(dtype); }
    uint64_t numel() const {
        uint64_t n = 1;
        for (int64_t d : shape) n *= static_cast<uint64_t>(d);
        return n;
    }
};

// Fills out[0, count) with the values of elements [first, first + count) of t.
void generate(const Spec &s, const TensorDesc &t, uint64_t first, uint64_t count, float *out) {
    if (t.mode == Mode::plain) {
        const uint64_t key = tensor_key(s, t.layer, t.kind, t.expert);
        for (uint64_t i = 0; i < count; ++i) out[i] = value(key, first + i, t.scale);
        return;
    }
    const int64_t H = s.hidden, I = s.intermediate;
    const int64_t R = t.shape[1], C = t.shape[2];
    const float sh = 1.0f / std::sqrt(static_cast<float>(H)), si = 1.0f / std::sqrt(static_cast<float>(I));
    // Walk (expert, row, column) incrementally: no division per element.
    int64_t e = static_cast<int64_t>(first / static_cast<uint64_t>(R * C));
    int64_t r = static_cast<int64_t>(first % static_cast<uint64_t>(R * C)) / C;
    int64_t c = static_cast<int64_t>(first % static_cast<uint64_t>(C));
    uint64_t kg = 0, ku = 0, kd = 0;
    int64_t keyed = -1;
    for (uint64_t i = 0; i < count; ++i) {
        if (keyed != e) {
            kg = tensor_key(s, t.layer, kGate, static_cast<int>(e));
            ku = tensor_key(s, t.layer, kUp, static_cast<int>(e));
            kd = tensor_key(s, t.layer, kDown, static_cast<int>(e));
            keyed = e;
        }
        switch (t.mode) {
            case Mode::gate_up:  // row r of [2I, H]
                out[i] = r < I ? value(kg, r * H + c, sh) : value(ku, (r - I) * H + c, sh);
                break;
            case Mode::gate_up_t:  // [H, 2I]: column c is unit c of gate (c < I) or up
                out[i] = c < I ? value(kg, c * H + r, sh) : value(ku, (c - I) * H + r, sh);
                break;
            case Mode::down: out[i] = value(kd, r * I + c, si); break;
            case Mode::down_t: out[i] = value(kd, c * I + r, si); break;
            case Mode::plain: break;
        }
        if (++c == C) {
            c = 0;
            if (++r == R) {
                r = 0;
                ++e;
            }
        }
    }
}

bool is_deepseek_like(const std::string &a) { return a == "deepseek_v3" || a == "kimi_k2" || a == "glm4_moe"; }
bool is_qwen(const std::string &a) { return a == "qwen3_moe" || a == "qwen3_5_moe"; }
// Layers before first_dense are dense (DeepSeek-style configs, DeepSeek-V4, GGUF files).
bool has_leading_dense(const Spec &s) {
    return s.gguf || is_deepseek_like(s.architecture) || s.architecture == "deepseek_v4";
}
bool is_row_quant(Format f) { return f == Format::fp8_block || f == Format::nvfp4 || f == Format::ds_fp4; }

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
    if ((s.architecture == "qwen3_moe" || s.architecture == "mixtral") && s.shared_intermediate != 0)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: ", s.architecture, " has no shared expert");
    parse_dtype(s.expert_dtype);
    const Format f = parse_format(s.format);
    if ((f == Format::mxfp4) != (s.architecture == "gpt_oss") && !s.gguf)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: gpt_oss is written in mxfp4 and mxfp4 only for gpt_oss");
    if ((f == Format::ds_fp4) != (s.architecture == "deepseek_v4") && !s.gguf)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: deepseek_v4 is written in ds_fp4 and ds_fp4 only for deepseek_v4");
    if ((s.architecture == "gpt_oss" || s.architecture == "deepseek_v4") && s.shared_intermediate != 0)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: ", s.architecture, " is written without a shared expert");
    if (is_row_quant(f) && s.layout != Spec::Layout::per_expert)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: ", s.format, " checkpoints are written per expert");
    if (s.fp8_scale_dtype != "F32" && s.fp8_scale_dtype != "BF16")
        fail(FT_ERR_INVALID_ARGUMENT, "synth: fp8_scale_dtype '", s.fp8_scale_dtype, "' (F32, BF16)");
    if (s.e8m0_dtype != "F8_E8M0" && s.e8m0_dtype != "U8")
        fail(FT_ERR_INVALID_ARGUMENT, "synth: e8m0_dtype '", s.e8m0_dtype, "' (F8_E8M0, U8)");
}

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

void add_moe_layer(const Spec &s, int l, std::vector<TensorDesc> &out) {
    const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate, Is = s.shared_intermediate;
    const Dtype xd = parse_dtype(s.expert_dtype);
    const float sh = 1.0f / std::sqrt(static_cast<float>(H));
    const std::string b = layer_prefix(s, l) + moe_block(s);
    auto plain = [&](std::string name, Dtype d, std::vector<int64_t> shape, Kind kind, int expert, float scale) {
        TensorDesc t;
        t.name = std::move(name);
        t.dtype = d;
        t.shape = std::move(shape);
        t.layer = l;
        t.kind = kind;
        t.expert = expert;
        t.scale = scale;
        out.push_back(std::move(t));
    };
    auto fused = [&](std::string name, std::vector<int64_t> shape, Mode mode) {
        TensorDesc t;
        t.name = std::move(name);
        t.dtype = xd;
        t.shape = std::move(shape);
        t.mode = mode;
        t.layer = l;
        out.push_back(std::move(t));
    };

    auto raw = [&](std::string name, const char *dtype, size_t es, std::vector<int64_t> shape,
                   std::function<void(uint64_t, uint64_t, uint8_t *)> fn) {
        TensorDesc t;
        t.name = std::move(name);
        t.shape = std::move(shape);
        t.layer = l;
        t.raw_dtype = dtype;
        t.raw_es = es;
        t.raw = std::move(fn);
        out.push_back(std::move(t));
    };
    auto raw_bytes = [&](std::string name, const char *dtype, std::vector<int64_t> shape, ByteFn fn, uint64_t key) {
        raw(std::move(name), dtype, 1, std::move(shape),
            [fn, key](uint64_t first, uint64_t count, uint8_t *o) { fill_bytes(fn, key, first, count, o); });
    };
    // fp8_block weight_scale_inv values, stored as F32 or BF16 (exact either way).
    auto fp8_scales = [&](std::string name, std::vector<int64_t> shape, uint64_t key) {
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
    };
    const Format fmt = parse_format(s.format);

    if (s.architecture == "gpt_oss") {
        plain(b + "router.weight", Dtype::bf16, {E, H}, kRouter, 0, sh);
        plain(b + "router.bias", Dtype::bf16, {E}, kBias, 0, 0.05f);
    } else {
        plain(b + "gate.weight", Dtype::bf16, {E, H}, kRouter, 0, sh);
        if (is_deepseek_like(s.architecture)) plain(b + "gate.e_score_correction_bias", Dtype::f32, {E}, kBias, 0, 0.05f);
        if (s.architecture == "deepseek_v4") plain(b + "gate.bias", Dtype::f32, {E}, kBias, 0, 0.05f);
    }

    if (fmt == Format::mxfp4) {
        // gpt-oss: fused over experts; blocks [E, N, K/32, 16], scales [E, N, K/32], bias [E, N].
        for (int down = 0; down < 2; ++down) {
            const std::string n = b + "experts." + (down ? "down_proj" : "gate_up_proj");
            const int64_t N = down ? H : 2 * I, K = down ? I : H;
            const Kind kb = down ? kDownBlocks : kGateUpBlocks, ks = down ? kDownScales : kGateUpScales,
                       kbias = down ? kDownBias : kGateUpBias;
            const uint64_t per_blocks = static_cast<uint64_t>(N * K / 2), per_scales = static_cast<uint64_t>(N * K / 32);
            const Spec sc = s;
            auto experts_bytes = [sc, l, per_blocks](Kind kind, ByteFn fn, uint64_t per) {
                return [sc, l, kind, fn, per](uint64_t first, uint64_t count, uint8_t *o) {
                    for (uint64_t i = 0; i < count; ++i) {
                        const uint64_t g = first + i;
                        o[i] = fn(tensor_key(sc, l, kind, static_cast<int>(g / per)), g % per);
                    }
                };
            };
            raw(n + "_blocks", "U8", 1, {E, N, K / 32, 16}, experts_bytes(kb, any_byte, per_blocks));
            raw(n + "_scales", "U8", 1, {E, N, K / 32}, experts_bytes(ks, e8m0_byte, per_scales));
            raw(n + "_bias", "BF16", 2, {E, N}, [sc, l, kbias, N](uint64_t first, uint64_t count, uint8_t *o) {
                for (uint64_t i = 0; i < count; ++i) {
                    const uint64_t g = first + i;
                    const uint16_t h = f32_to_bf16(value(tensor_key(sc, l, kbias, static_cast<int>(g / N)), g % N, 0.5f));
                    std::memcpy(o + 2 * i, &h, 2);
                }
            });
        }
    } else if (is_row_quant(fmt)) {
        // Per-expert tensors in the layout of the format's real exports.
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
                    raw_bytes(base + "weight", "F8_E4M3", {N, K}, fp8_weight_byte, wkey);
                    fp8_scales(base + "weight_scale_inv", {N / 128, K / 128}, skey);
                } else if (fmt == Format::nvfp4) {
                    raw_bytes(base + "weight", "U8", {N, K / 2}, any_byte, wkey);
                    raw_bytes(base + "weight_scale", "F8_E4M3", {N, K / 16}, e4m3_scale_byte, skey);
                    if (!s.drop_weight_scale_2) {
                        const float g = nvfp4_global(tensor_key(s, l, gk[p], e));
                        raw(base + "weight_scale_2", "F32", 4, {}, [g](uint64_t, uint64_t, uint8_t *o) { std::memcpy(o, &g, 4); });
                    }
                    const float in_scale = 1.0f / 448.0f;  // ModelOpt's activation scale; not used by FreeToken
                    raw(base + "input_scale", "F32", 4, {}, [in_scale](uint64_t, uint64_t, uint8_t *o) { std::memcpy(o, &in_scale, 4); });
                } else {  // ds_fp4
                    raw_bytes(base + "weight", "I8", {N, K / 2}, any_byte, wkey);
                    raw_bytes(base + "scale", s.e8m0_dtype.c_str(), {N, K / 32}, e8m0_byte, skey);
                }
            }
        }
    } else {
    switch (s.layout) {
        case Spec::Layout::per_expert: {
            const bool w = s.architecture == "mixtral";
            for (int e = 0; e < E; ++e) {
                const std::string p = b + "experts." + std::to_string(e) + ".";
                plain(p + (w ? "w1" : "gate_proj") + ".weight", xd, {I, H}, kGate, e, sh);
                plain(p + (w ? "w2" : "down_proj") + ".weight", xd, {H, I}, kDown, e,
                      1.0f / std::sqrt(static_cast<float>(I)));
                plain(p + (w ? "w3" : "up_proj") + ".weight", xd, {I, H}, kUp, e, sh);
            }
            break;
        }
        case Spec::Layout::fused:
            fused(b + "experts.gate_up_proj", {E, 2 * I, H}, Mode::gate_up);
            fused(b + "experts.down_proj", {E, H, I}, Mode::down);
            break;
        case Spec::Layout::fused_transposed:
            fused(b + "experts.gate_up_proj", {E, H, 2 * I}, Mode::gate_up_t);
            fused(b + "experts.down_proj", {E, I, H}, Mode::down_t);
            break;
    }
    }

    if (Is > 0 && fmt == Format::fp8_block) {
        // Block-FP8 exports quantise the shared expert as well (its sigmoid gate stays bf16).
        const std::string p = b + (s.architecture == "qwen3_5_moe" ? "shared_expert." : "shared_experts.");
        const char *names[3] = {"gate_proj", "up_proj", "down_proj"};
        const Kind wk[3] = {kSharedGate, kSharedUp, kSharedDown}, sk[3] = {kSharedGateScale, kSharedUpScale, kSharedDownScale};
        for (int q = 0; q < 3; ++q) {
            const int64_t N = q == 2 ? H : Is, K = q == 2 ? Is : H;
            raw_bytes(p + names[q] + ".weight", "F8_E4M3", {N, K}, fp8_weight_byte, tensor_key(s, l, wk[q], 0));
            fp8_scales(p + names[q] + ".weight_scale_inv", {N / 128, K / 128}, tensor_key(s, l, sk[q], 0));
        }
        if (s.architecture == "qwen3_5_moe") plain(b + "shared_expert_gate.weight", Dtype::bf16, {1, H}, kSharedGateProj, 0, sh);
    } else if (Is > 0) {
        const std::string p = b + (s.architecture == "qwen3_5_moe" ? "shared_expert." : "shared_experts.");
        plain(p + "gate_proj.weight", xd, {Is, H}, kSharedGate, 0, sh);
        plain(p + "up_proj.weight", xd, {Is, H}, kSharedUp, 0, sh);
        plain(p + "down_proj.weight", xd, {H, Is}, kSharedDown, 0, 1.0f / std::sqrt(static_cast<float>(Is)));
        if (s.architecture == "qwen3_5_moe") plain(b + "shared_expert_gate.weight", xd, {1, H}, kSharedGateProj, 0, sh);
    }
}

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

ordered_json config_json(const Spec &s) {
    const std::string &a = s.architecture;
    ordered_json c;
    if (a == "qwen3_moe" || a == "qwen3_5_moe") {
        ordered_json t;
        t["model_type"] = a == "qwen3_moe" ? "qwen3_moe" : "qwen3_5_moe_text";
        t["hidden_size"] = s.hidden;
        t["intermediate_size"] = s.intermediate * 4;
        t["moe_intermediate_size"] = s.intermediate;
        if (a == "qwen3_5_moe") t["shared_expert_intermediate_size"] = s.shared_intermediate;
        t["num_hidden_layers"] = s.num_layers;
        t["num_attention_heads"] = 4;
        t["num_key_value_heads"] = 2;
        t["num_experts"] = s.num_experts;
        t["num_experts_per_tok"] = s.top_k;
        t["norm_topk_prob"] = s.norm_topk_prob;
        t["decoder_sparse_step"] = 1;
        t["mlp_only_layers"] = s.mlp_only_layers;
        t["hidden_act"] = s.hidden_act;
        t["rms_norm_eps"] = 1e-6;
        t["vocab_size"] = 16;
        t["tie_word_embeddings"] = false;
        if (a == "qwen3_moe") {
            c = t;
            c["architectures"] = {"Qwen3MoeForCausalLM"};
        } else {
            c["architectures"] = {"Qwen3_5MoeForConditionalGeneration"};
            c["model_type"] = "qwen3_5_moe";
            c["text_config"] = t;
            c["vision_config"] = {{"model_type", "qwen3_5_moe"}, {"depth", 1}, {"hidden_size", 8}};
        }
    } else if (a == "mixtral") {
        c["architectures"] = {"MixtralForCausalLM"};
        c["model_type"] = "mixtral";
        c["hidden_size"] = s.hidden;
        c["intermediate_size"] = s.intermediate;
        c["num_hidden_layers"] = s.num_layers;
        c["num_attention_heads"] = 4;
        c["num_key_value_heads"] = 2;
        c["num_local_experts"] = s.num_experts;
        c["num_experts_per_tok"] = s.top_k;
        c["hidden_act"] = s.hidden_act;
        c["router_aux_loss_coef"] = 0.02;
        c["vocab_size"] = 16;
    } else if (a == "gpt_oss") {
        c["architectures"] = {"GptOssForCausalLM"};
        c["model_type"] = "gpt_oss";
        c["hidden_size"] = s.hidden;
        c["intermediate_size"] = s.intermediate;
        c["num_hidden_layers"] = s.num_layers;
        c["num_attention_heads"] = 4;
        c["num_key_value_heads"] = 2;
        c["num_local_experts"] = s.num_experts;
        c["num_experts_per_tok"] = s.top_k;
        c["experts_per_token"] = s.top_k;
        c["swiglu_limit"] = 7.0;
        c["hidden_act"] = "silu";
        c["vocab_size"] = 16;
    } else if (a == "deepseek_v4") {
        c["architectures"] = {"DeepseekV4ForCausalLM"};
        c["model_type"] = "deepseek_v4";
        c["hidden_size"] = s.hidden;
        c["moe_intermediate_size"] = s.intermediate;
        c["num_hidden_layers"] = s.num_layers;
        c["n_routed_experts"] = s.num_experts;
        c["n_shared_experts"] = 1;
        c["num_experts_per_tok"] = s.top_k;
        c["first_k_dense_replace"] = s.first_dense;
        c["scoring_func"] = "sigmoid";
        c["n_group"] = s.n_group;
        c["topk_group"] = s.topk_group;
        c["routed_scaling_factor"] = s.routed_scaling_factor;
        c["swiglu_limit"] = 7.0;
        c["n_hash_layers"] = 0;
        c["num_nextn_predict_layers"] = s.mtp_layer ? 1 : 0;
        c["vocab_size"] = 16;
    } else {  // deepseek_v3, kimi_k2, glm4_moe
        c["architectures"] = {a == "glm4_moe" ? "Glm4MoeForCausalLM" : "DeepseekV3ForCausalLM"};
        c["model_type"] = a;
        c["hidden_size"] = s.hidden;
        c["intermediate_size"] = s.intermediate * 4;
        c["moe_intermediate_size"] = s.intermediate;
        c["num_hidden_layers"] = s.num_layers;
        c["num_attention_heads"] = 4;
        c["n_routed_experts"] = s.num_experts;
        c["n_shared_experts"] = s.shared_intermediate / s.intermediate;
        c["num_experts_per_tok"] = s.top_k;
        c["first_k_dense_replace"] = s.first_dense;
        if (a != "glm4_moe") {
            c["moe_layer_freq"] = 1;
            c["scoring_func"] = "sigmoid";
            c["topk_method"] = "noaux_tc";
        }
        c["n_group"] = s.n_group;
        c["topk_group"] = s.topk_group;
        c["routed_scaling_factor"] = s.routed_scaling_factor;
        c["norm_topk_prob"] = s.norm_topk_prob;
        c["num_nextn_predict_layers"] = s.mtp_layer ? 1 : 0;
        c["hidden_act"] = s.hidden_act;
        c["vocab_size"] = 16;
    }
    c["torch_dtype"] = "bfloat16";
    // How each quantised release declares itself. DeepSeek-V4's declares FP8 (its other weights);
    // its experts are FP4 regardless.
    const Format f = parse_format(s.format);
    if (s.declare_quantization) {
        if (f == Format::fp8_block || a == "deepseek_v4")
            c["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                        {"weight_block_size", {128, 128}}};
        else if (f == Format::mxfp4)
            c["quantization_config"] = {{"quant_method", "mxfp4"},
                                        {"modules_to_not_convert", {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                    "model.embed_tokens", "lm_head"}}};
        else if (f == Format::nvfp4 && !s.hf_quant_config_file)
            c["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16},
                                        {"ignore", {"lm_head"}}};
    }
    return c;
}

// ---- file writing ----------------------------------------------------------------------------

class File {
public:
    explicit File(const std::string &path) : path_(path) {
        fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_ < 0) fail(FT_ERR_IO, path, ": cannot create: ", std::strerror(errno));
    }
    ~File() {
        if (fd_ >= 0) ::close(fd_);
    }
    File(const File &) = delete;
    File &operator=(const File &) = delete;

    void write_at(const void *data, size_t bytes, uint64_t offset) const {
        const uint8_t *p = static_cast<const uint8_t *>(data);
        while (bytes > 0) {
            const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) fail(FT_ERR_IO, path_, ": write failed: ", std::strerror(errno));
            p += n;
            bytes -= static_cast<size_t>(n);
            offset += static_cast<uint64_t>(n);
        }
    }
    void close() {
        if (::close(fd_) != 0) fail(FT_ERR_IO, path_, ": close failed: ", std::strerror(errno));
        fd_ = -1;
    }

private:
    std::string path_;
    int fd_ = -1;
};

// Header text padded with spaces to a multiple of 8 so the data section is aligned, as the
// reference writer does.
std::string padded(std::string header) {
    while (header.size() % 8) header += ' ';
    return header;
}

void write_text(const std::string &path, const std::string &text) {
    File f(path);
    f.write_at(text.data(), text.size(), 0);
    f.close();
}

void make_dir(const std::string &dir) {
    std::string partial;
    size_t pos = 0;
    while (pos != std::string::npos) {
        pos = dir.find('/', pos + 1);
        partial = dir.substr(0, pos);
        if (partial.empty()) continue;
        if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
            fail(FT_ERR_IO, partial, ": cannot create directory: ", std::strerror(errno));
    }
}

struct Placed {
    const TensorDesc *t;
    size_t shard;
    uint64_t offset;  // absolute file offset
};

}  // namespace

std::vector<int> moe_layers(const Spec &s) {
    std::vector<int> out;
    for (int l = 0; l < s.num_layers; ++l) {
        if (is_qwen(s.architecture) && !s.gguf) {
            if (std::find(s.mlp_only_layers.begin(), s.mlp_only_layers.end(), l) == s.mlp_only_layers.end())
                out.push_back(l);
        } else if (has_leading_dense(s)) {
            if (l >= s.first_dense) out.push_back(l);
        } else {
            out.push_back(l);
        }
    }
    return out;
}

void write_checkpoint(const std::string &dir, const Spec &s, const std::function<bool(uint64_t, uint64_t)> &progress) {
    check_spec(s);
    make_dir(dir);
    write_text(dir + "/config.json", config_json(s).dump(2) + "\n");
    if (parse_format(s.format) == Format::q4_0)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: q4_0 checkpoints are GGUF files (write_gguf)");
    if (s.declare_quantization && s.hf_quant_config_file && parse_format(s.format) == Format::nvfp4) {
        ordered_json h;
        h["producer"] = {{"name", "modelopt"}, {"version", "0.29.0"}};
        h["quantization"] = {{"quant_algo", "NVFP4"}, {"kv_cache_quant_algo", nullptr}, {"group_size", 16},
                             {"exclude_modules", {"lm_head"}}};
        write_text(dir + "/hf_quant_config.json", h.dump(2) + "\n");
    }

    const std::vector<TensorDesc> tensors = all_tensors(s);
    uint64_t total = 0;
    for (const TensorDesc &t : tensors) total += t.numel() * t.elem_size();

    // Contiguous runs of tensors per shard, cut by bytes.
    const size_t n_shards = static_cast<size_t>(s.shards);
    std::vector<std::vector<const TensorDesc *>> shard_tensors(n_shards);
    {
        uint64_t acc = 0;
        for (const TensorDesc &t : tensors) {
            const size_t shard = std::min(n_shards - 1, static_cast<size_t>(acc * n_shards / std::max<uint64_t>(total, 1)));
            shard_tensors[shard].push_back(&t);
            acc += t.numel() * t.elem_size();
        }
    }
    auto shard_name = [&](size_t i) {
        if (n_shards == 1) return std::string("model.safetensors");
        char buf[64];
        std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n_shards);
        return std::string(buf);
    };

    std::vector<std::unique_ptr<File>> files;
    std::vector<Placed> placed;
    ordered_json weight_map = ordered_json::object();
    for (size_t i = 0; i < n_shards; ++i) {
        ordered_json header;
        header["__metadata__"] = {{"format", "pt"}};
        uint64_t off = 0;
        for (const TensorDesc *t : shard_tensors[i]) {
            const uint64_t bytes = t->numel() * t->elem_size();
            header[t->name] = {{"dtype", t->elem_dtype()}, {"shape", t->shape}, {"data_offsets", {off, off + bytes}}};
            off += bytes;
            weight_map[t->name] = shard_name(i);
        }
        const std::string text = padded(header.dump());
        files.push_back(std::make_unique<File>(dir + "/" + shard_name(i)));
        const uint64_t len = text.size();
        uint8_t prefix[8];
        for (int b = 0; b < 8; ++b) prefix[b] = static_cast<uint8_t>(len >> (8 * b));
        files.back()->write_at(prefix, 8, 0);
        files.back()->write_at(text.data(), text.size(), 8);
        uint64_t data_off = 8 + len;
        for (const TensorDesc *t : shard_tensors[i]) {
            placed.push_back({t, i, data_off});
            data_off += t->numel() * t->elem_size();
        }
    }

    // Pieces of at most 1 Mi elements, generated and written by every core in parallel.
    struct Job {
        const Placed *p;
        uint64_t first, count;
    };
    constexpr uint64_t kJobElems = 1ull << 20;
    std::vector<Job> jobs;
    for (const Placed &p : placed)
        for (uint64_t first = 0; first < p.t->numel(); first += kJobElems)
            jobs.push_back({&p, first, std::min(kJobElems, p.t->numel() - first)});

    std::atomic<size_t> next{0};
    std::atomic<uint64_t> done{0};
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::exception_ptr error;
    auto worker = [&]() {
        std::vector<float> values;
        std::vector<uint8_t> bytes;
        try {
            for (size_t j; !stop && (j = next.fetch_add(1)) < jobs.size();) {
                const Job &job = jobs[j];
                const TensorDesc &t = *job.p->t;
                const size_t es = t.elem_size();
                bytes.resize(job.count * es);
                if (t.raw) {
                    t.raw(job.first, job.count, bytes.data());
                } else {
                    values.resize(job.count);
                    generate(s, t, job.first, job.count, values.data());
                    for (uint64_t i = 0; i < job.count; ++i) store(values[i], t.dtype, &bytes[i * es]);
                }
                files[job.p->shard]->write_at(bytes.data(), bytes.size(), job.p->offset + job.first * es);
                done += bytes.size();
            }
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu);
            if (!error) error = std::current_exception();
            stop = true;
        }
    };
    const unsigned n_threads = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (unsigned i = 0; i < n_threads; ++i) pool.emplace_back(worker);
    if (progress) {
        uint64_t reported = UINT64_MAX;
        while (done.load() < total && !stop) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            const uint64_t now = done.load();
            if (now != reported) {
                reported = now;
                if (!progress(now, total)) stop = true;
            }
        }
    }
    for (std::thread &t : pool) t.join();
    if (error) std::rethrow_exception(error);
    for (auto &f : files) f->close();
    if (stop) fail(FT_ERR_CANCELLED, "synth: writing ", dir, " cancelled by the progress callback");

    if (n_shards > 1) {
        ordered_json index;
        index["metadata"] = {{"total_size", total}};
        index["weight_map"] = weight_map;
        write_text(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
    }
    if (progress) progress(total, total);
}

// ---- expected values -------------------------------------------------------------------------

namespace {

int checkpoint_layer(const Spec &s, int moe_layer) {
    const std::vector<int> moe = moe_layers(s);
    if (moe_layer < 0 || moe_layer >= static_cast<int>(moe.size()))
        fail(FT_ERR_INVALID_ARGUMENT, "synth: MoE layer ", moe_layer, " out of range");
    return moe[moe_layer];
}

std::vector<uint16_t> bf16_values(const Spec &s, int layer, Kind kind, int expert, uint64_t n, float scale, Dtype d) {
    const uint64_t key = tensor_key(s, layer, kind, expert);
    std::vector<uint16_t> out(n);
    for (uint64_t i = 0; i < n; ++i) out[i] = stored_as_bf16(value(key, i, scale), d);
    return out;
}

}  // namespace

std::vector<uint16_t> expert_weight(const Spec &s, int moe_layer, int expert, int proj) {
    const int l = checkpoint_layer(s, moe_layer);
    const uint64_t n = static_cast<uint64_t>(s.hidden) * s.intermediate;
    const Dtype d = parse_dtype(s.expert_dtype);
    switch (proj) {
        case FT_PROJ_GATE: return bf16_values(s, l, kGate, expert, n, 1.0f / std::sqrt(static_cast<float>(s.hidden)), d);
        case FT_PROJ_UP: return bf16_values(s, l, kUp, expert, n, 1.0f / std::sqrt(static_cast<float>(s.hidden)), d);
        case FT_PROJ_DOWN:
            return bf16_values(s, l, kDown, expert, n, 1.0f / std::sqrt(static_cast<float>(s.intermediate)), d);
    }
    fail(FT_ERR_INVALID_ARGUMENT, "synth: unknown projection ", proj);
}

std::vector<float> router_weight(const Spec &s, int moe_layer) {
    const int l = checkpoint_layer(s, moe_layer);
    const std::vector<uint16_t> bits = bf16_values(s, l, kRouter, 0, static_cast<uint64_t>(s.num_experts) * s.hidden,
                                                   1.0f / std::sqrt(static_cast<float>(s.hidden)), Dtype::bf16);
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_f32(bits[i]);
    return out;
}

std::vector<float> router_bias(const Spec &s, int moe_layer) {
    const int l = checkpoint_layer(s, moe_layer);
    const uint64_t key = tensor_key(s, l, kBias, 0);
    std::vector<float> out(s.num_experts);
    for (int e = 0; e < s.num_experts; ++e) out[e] = value(key, e, 0.05f);
    return out;
}

std::vector<uint16_t> shared_weight(const Spec &s, int moe_layer, int proj) {
    const int l = checkpoint_layer(s, moe_layer);
    if (parse_format(s.format) == Format::fp8_block) {
        // Written as e4m3 + scale_inv; the loader dequantises to bf16 with the reference.
        const int q = proj == FT_PROJ_GATE ? 0 : proj == FT_PROJ_UP ? 1 : 2;
        const Kind wk[3] = {kSharedGate, kSharedUp, kSharedDown}, sk[3] = {kSharedGateScale, kSharedUpScale, kSharedDownScale};
        const int64_t N = q == 2 ? s.hidden : s.shared_intermediate, K = q == 2 ? s.shared_intermediate : s.hidden;
        const uint64_t wkey = tensor_key(s, l, wk[q], 0), skey = tensor_key(s, l, sk[q], 0);
        std::vector<uint16_t> out(static_cast<size_t>(N * K));
        std::vector<uint16_t> band(static_cast<size_t>(K / 128));
        std::vector<float> row(static_cast<size_t>(K));
        for (int64_t n = 0; n < N; ++n) {
            for (int64_t b = 0; b < K / 128; ++b) band[b] = f32_to_bf16(fp8_scale_inv(skey, (n / 128) * (K / 128) + b));
            const std::vector<uint8_t> w = bytes_of(fp8_weight_byte, wkey, static_cast<uint64_t>(n * K), K);
            dequant_row_fp8_block(w.data(), band.data(), K, row.data());
            for (int64_t k = 0; k < K; ++k) out[n * K + k] = f32_to_bf16(row[k]);
        }
        return out;
    }
    const uint64_t n = static_cast<uint64_t>(s.hidden) * s.shared_intermediate;
    const Dtype d = parse_dtype(s.expert_dtype);
    const float sh = 1.0f / std::sqrt(static_cast<float>(s.hidden));
    switch (proj) {
        case FT_PROJ_GATE: return bf16_values(s, l, kSharedGate, 0, n, sh, d);
        case FT_PROJ_UP: return bf16_values(s, l, kSharedUp, 0, n, sh, d);
        case FT_PROJ_DOWN:
            return bf16_values(s, l, kSharedDown, 0, n, 1.0f / std::sqrt(static_cast<float>(s.shared_intermediate)), d);
    }
    fail(FT_ERR_INVALID_ARGUMENT, "synth: unknown projection ", proj);
}

std::vector<uint16_t> shared_gate_weight(const Spec &s, int moe_layer) {
    const int l = checkpoint_layer(s, moe_layer);
    return bf16_values(s, l, kSharedGateProj, 0, static_cast<uint64_t>(s.hidden),
                       1.0f / std::sqrt(static_cast<float>(s.hidden)), parse_dtype(s.expert_dtype));
}


// ---- any format ------------------------------------------------------------------------------

namespace {

// Every bank row of one expert, in schema order.
std::vector<std::vector<uint8_t>> expert_rows(const Spec &s, int moe_layer, int e) {
    const Format f = parse_format(s.format);
    const int l = checkpoint_layer(s, moe_layer);
    const uint64_t H = static_cast<uint64_t>(s.hidden), I = static_cast<uint64_t>(s.intermediate);
    auto key = [&](Kind k) { return tensor_key(s, l, k, e); };
    std::vector<std::vector<uint8_t>> rows;
    switch (f) {
        case Format::bf16: {
            std::vector<uint8_t> gu, dn;
            for (int proj : {FT_PROJ_GATE, FT_PROJ_UP})
                for (uint16_t v : expert_weight(s, moe_layer, e, proj)) append_u16(gu, v);
            for (uint16_t v : expert_weight(s, moe_layer, e, FT_PROJ_DOWN)) append_u16(dn, v);
            rows = {gu, dn};
            break;
        }
        case Format::fp8_block: {
            std::vector<uint8_t> gu, gus, dn, dns;
            auto scales = [&](std::vector<uint8_t> &dst, Kind k, uint64_t n) {
                for (uint64_t i = 0; i < n; ++i) append_u16(dst, f32_to_bf16(fp8_scale_inv(key(k), i)));
            };
            append(gu, bytes_of(fp8_weight_byte, key(kGate), 0, I * H));
            append(gu, bytes_of(fp8_weight_byte, key(kUp), 0, I * H));
            scales(gus, kGateScale, (I / 128) * (H / 128));  // gate's scale rows, then up's
            scales(gus, kUpScale, (I / 128) * (H / 128));
            append(dn, bytes_of(fp8_weight_byte, key(kDown), 0, H * I));
            scales(dns, kDownScale, (H / 128) * (I / 128));
            rows = {gu, gus, dn, dns};
            break;
        }
        case Format::nvfp4: {
            std::vector<uint8_t> gp, gs, gg, dp, ds, dg;
            append(gp, bytes_of(any_byte, key(kGate), 0, I * H / 2));
            append(gp, bytes_of(any_byte, key(kUp), 0, I * H / 2));
            append(gs, bytes_of(e4m3_scale_byte, key(kGateScale), 0, I * H / 16));
            append(gs, bytes_of(e4m3_scale_byte, key(kUpScale), 0, I * H / 16));
            // Each projection's per-tensor global, once per output row.
            for (uint64_t r = 0; r < I; ++r) append_u16(gg, f32_to_f16(nvfp4_global(key(kGateGlobal))));
            for (uint64_t r = 0; r < I; ++r) append_u16(gg, f32_to_f16(nvfp4_global(key(kUpGlobal))));
            append(dp, bytes_of(any_byte, key(kDown), 0, H * I / 2));
            append(ds, bytes_of(e4m3_scale_byte, key(kDownScale), 0, H * I / 16));
            for (uint64_t r = 0; r < H; ++r) append_u16(dg, f32_to_f16(nvfp4_global(key(kDownGlobal))));
            rows = {gp, gs, gg, dp, ds, dg};
            break;
        }
        case Format::ds_fp4: {
            std::vector<uint8_t> gp, gs, dp, ds;
            append(gp, bytes_of(any_byte, key(kGate), 0, I * H / 2));
            append(gp, bytes_of(any_byte, key(kUp), 0, I * H / 2));
            append(gs, bytes_of(e8m0_byte, key(kGateScale), 0, I * H / 32));
            append(gs, bytes_of(e8m0_byte, key(kUpScale), 0, I * H / 32));
            append(dp, bytes_of(any_byte, key(kDown), 0, H * I / 2));
            append(ds, bytes_of(e8m0_byte, key(kDownScale), 0, H * I / 32));
            rows = {gp, gs, dp, ds};
            break;
        }
        case Format::mxfp4: {
            for (int down = 0; down < 2; ++down) {
                const uint64_t N = down ? H : 2 * I, K = down ? I : H;
                const uint64_t kb = key(down ? kDownBlocks : kGateUpBlocks), ks = key(down ? kDownScales : kGateUpScales),
                               kbias = key(down ? kDownBias : kGateUpBias);
                // Written per unit n as [K/2] bytes / [K/32] scales; the bank is the transpose.
                std::vector<uint8_t> blocks(K / 2 * N), scales(K / 32 * N), bias;
                for (uint64_t n = 0; n < N; ++n) {
                    for (uint64_t j = 0; j < K / 2; ++j) blocks[j * N + n] = any_byte(kb, n * (K / 2) + j);
                    for (uint64_t j = 0; j < K / 32; ++j) scales[j * N + n] = e8m0_byte(ks, n * (K / 32) + j);
                    append_u16(bias, f32_to_bf16(value(kbias, n, 0.5f)));
                }
                rows.push_back(blocks);
                rows.push_back(scales);
                rows.push_back(bias);
            }
            break;
        }
        case Format::q4_0: {
            const uint64_t rbh = H / 32 * kQ4_0BlockBytes, rbi = I / 32 * kQ4_0BlockBytes;
            std::vector<uint8_t> gu;
            append(gu, bytes_of(q4_0_byte, key(kGate), 0, I * rbh));
            append(gu, bytes_of(q4_0_byte, key(kUp), 0, I * rbh));
            rows = {gu, bytes_of(q4_0_byte, key(kDown), 0, H * rbi)};
            break;
        }
    }
    return rows;
}

}  // namespace

std::vector<uint8_t> bank_row(const Spec &s, int moe_layer, int expert, const std::string &bank) {
    const Format f = parse_format(s.format);
    const int b = bank_index(f, bank);
    if (b < 0) fail(FT_ERR_INVALID_ARGUMENT, "synth: format ", s.format, " has no bank '", bank, "'");
    return expert_rows(s, moe_layer, expert)[static_cast<size_t>(b)];
}

std::vector<float> expert_dequant(const Spec &s, int moe_layer, int expert, int proj) {
    const Format f = parse_format(s.format);
    const std::vector<std::vector<uint8_t>> rows = expert_rows(s, moe_layer, expert);
    std::vector<const uint8_t *> ptrs;
    for (const auto &r : rows) ptrs.push_back(r.data());
    std::vector<float> out(static_cast<size_t>(s.hidden) * s.intermediate);
    dequant_projection(f, ptrs.data(), s.hidden, s.intermediate, proj, out.data());
    return out;
}

std::vector<float> expert_bias(const Spec &s, int moe_layer, int expert, int proj) {
    const Format f = parse_format(s.format);
    if (f != Format::mxfp4) return {};
    const std::vector<std::vector<uint8_t>> rows = expert_rows(s, moe_layer, expert);
    std::vector<const uint8_t *> ptrs;
    for (const auto &r : rows) ptrs.push_back(r.data());
    std::vector<float> out(static_cast<size_t>(proj == FT_PROJ_DOWN ? s.hidden : s.intermediate));
    projection_bias(f, ptrs.data(), s.hidden, s.intermediate, proj, out.data());
    return out;
}

// ---- GGUF ------------------------------------------------------------------------------------

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

void write_gguf(const std::string &path, const Spec &s) {
    check_spec(s);
    if (!s.gguf) fail(FT_ERR_INVALID_ARGUMENT, "synth: write_gguf needs spec.gguf = true");
    const Format f = parse_format(s.format);
    if (f != Format::q4_0 && f != Format::bf16)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: GGUF experts are q4_0 or bf16, not ", s.format);
    const uint64_t E = static_cast<uint64_t>(s.num_experts), H = static_cast<uint64_t>(s.hidden),
                   I = static_cast<uint64_t>(s.intermediate);
    const std::string a = s.gguf_arch + ".";
    GgufWriter w;
    w.kv_string("general.architecture", s.gguf_arch);
    w.kv_string("general.name", "freetoken synthetic");
    if (s.gguf_alignment != 32) {
        w.kv_u32("general.alignment", s.gguf_alignment);
        w.set_alignment(s.gguf_alignment);
    }
    w.kv_u32(a + "block_count", static_cast<uint32_t>(s.num_layers));
    w.kv_u32(a + "context_length", 4096);
    w.kv_u32(a + "embedding_length", static_cast<uint32_t>(H));
    w.kv_u32(a + "expert_count", static_cast<uint32_t>(E));
    w.kv_u32(a + "expert_used_count", static_cast<uint32_t>(s.top_k));
    w.kv_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(I));
    if (s.first_dense > 0) w.kv_u32(a + "leading_dense_block_count", static_cast<uint32_t>(s.first_dense));
    w.kv_bool(a + "expert_weights_norm", s.norm_topk_prob);
    w.kv_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
    w.kv_f64("general.synthetic_f64", 0.25);
    w.kv_strings("tokenizer.ggml.tokens", {"<s>", "</s>", "a", "b", "hello"});
    w.kv_f32s("tokenizer.ggml.scores", {0.0f, 0.0f, -1.0f, -2.0f, -3.5f});

    // The type and bytes of one projection of every expert of layer l: [E][rows][K].
    const Dtype xd = parse_dtype(s.expert_dtype);
    const uint32_t float_type = xd == Dtype::bf16 ? 30 : xd == Dtype::f16 ? 1 : 0;
    auto expert_tensor = [&](int l, std::initializer_list<Kind> kinds, uint64_t rows, uint64_t K, float scale) {
        std::vector<uint8_t> data;
        for (uint64_t e = 0; e < E; ++e) {
            for (Kind k : kinds) {
                const uint64_t key = tensor_key(s, l, k, static_cast<int>(e));
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
    };
    const uint32_t xt = f == Format::q4_0 ? 2 : float_type;
    const float sh = 1.0f / std::sqrt(static_cast<float>(H)), si = 1.0f / std::sqrt(static_cast<float>(I));
    const std::vector<int> moe = moe_layers(s);
    {
        std::vector<uint8_t> embd(H * 16 * 4);
        for (size_t i = 0; i < H * 16; ++i) {
            const float v = value(tensor_key(s, -1, kOther, 0), i, 0.5f);
            std::memcpy(&embd[i * 4], &v, 4);
        }
        w.tensor("token_embd.weight", {H, 16}, 0, embd);
    }
    for (int l = 0; l < s.num_layers; ++l) {
        const std::string b = "blk." + std::to_string(l) + ".";
        std::vector<uint8_t> norm(H * 4);
        for (uint64_t i = 0; i < H; ++i) {
            const float v = 1.0f + value(tensor_key(s, l, kOther, 0), i, 0.1f);
            std::memcpy(&norm[i * 4], &v, 4);
        }
        w.tensor(b + "attn_norm.weight", {H}, 0, norm);
        if (std::find(moe.begin(), moe.end(), l) == moe.end()) {
            // A dense layer: a Q8_0 tensor, which FreeToken never reads but must validate.
            w.tensor(b + "ffn_up.weight", {H, 4}, 8, std::vector<uint8_t>(H / 32 * 34 * 4, 0x11));
            continue;
        }
        std::vector<uint8_t> router(E * H * 2);
        for (uint64_t i = 0; i < E * H; ++i) {
            const uint16_t v = f32_to_bf16(value(tensor_key(s, l, kRouter, 0), i, sh));
            std::memcpy(&router[i * 2], &v, 2);
        }
        w.tensor(b + "ffn_gate_inp.weight", {H, E}, 30, router);
        if (s.gguf_fused_gate_up) {
            w.tensor(b + "ffn_gate_up_exps.weight", {H, 2 * I, E}, xt, expert_tensor(l, {kGate, kUp}, I, H, sh));
        } else {
            w.tensor(b + "ffn_gate_exps.weight", {H, I, E}, xt, expert_tensor(l, {kGate}, I, H, sh));
            w.tensor(b + "ffn_up_exps.weight", {H, I, E}, xt, expert_tensor(l, {kUp}, I, H, sh));
        }
        w.tensor(b + "ffn_down_exps.weight", {I, H, E}, xt, expert_tensor(l, {kDown}, H, I, si));
    }
    w.write(path);
}

// ---- raw files -------------------------------------------------------------------------------

void write_safetensors(const std::string &path, const std::vector<RawTensor> &tensors) {
    ordered_json header = ordered_json::object();
    uint64_t off = 0;
    for (const RawTensor &t : tensors) {
        header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
        off += t.bytes.size();
    }
    std::vector<uint8_t> data;
    data.reserve(off);
    for (const RawTensor &t : tensors) data.insert(data.end(), t.bytes.begin(), t.bytes.end());
    write_raw_header(path, padded(header.dump()), data);
}

void write_raw_header(const std::string &path, const std::string &header, const std::vector<uint8_t> &data,
                      int64_t declared_length) {
    const uint64_t len = declared_length >= 0 ? static_cast<uint64_t>(declared_length) : header.size();
    uint8_t prefix[8];
    for (int b = 0; b < 8; ++b) prefix[b] = static_cast<uint8_t>(len >> (8 * b));
    File f(path);
    f.write_at(prefix, 8, 0);
    f.write_at(header.data(), header.size(), 8);
    if (!data.empty()) f.write_at(data.data(), data.size(), 8 + header.size());
    f.close();
}

}  // namespace ft::synth
