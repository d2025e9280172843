// Seeded pseudo-random values of every tensor: floats per (layer, kind, expert) key, the byte
// classes of the quantised formats, and the element walk of the fused expert layouts.
#include <cmath>
#include <cstring>

#include "synth_internal.hpp"

namespace ft::synth::detail {

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

// DeepSeek-V4's FP8 shared-expert scales as e8m0 codes: 2^-7 .. 2^-4 (a shared expert as large
// as the routed sum, whose gate and up reach swiglu_limit).
uint8_t ds_shared_scale_byte(uint64_t key, uint64_t i) { return static_cast<uint8_t>(120 + rnd(key, i) % 4); }

// Expert ids of a tid2eid table: uniform over the experts (repeats within a row allowed).
int32_t tid2eid_value(const Spec &s, int layer, uint64_t i) {
    return static_cast<int32_t>(rnd(tensor_key(s, layer, kTid2eid, 0), i) % static_cast<uint64_t>(s.num_experts));
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

namespace {

// One byte of an fp16 super-block scale: +-[2^(e0), 2^(e0 + 3)) (or positive only), seeded per
// block and field so each block gets its own finite, normal scale.
uint8_t half_byte(uint64_t key, uint64_t block, uint64_t field, int e0, bool sign, uint64_t off) {
    const uint64_t r = rnd(key ^ (0x2545f4914f6cdd1dull * (field + 1)), block);
    float d = std::ldexp(1.0f + static_cast<float>(r % 256) / 256.0f, e0 + static_cast<int>((r >> 8) % 3));
    if (sign && ((r >> 16) & 1)) d = -d;
    const uint16_t h = f32_to_f16(d);
    return static_cast<uint8_t>(off == 0 ? h & 0xff : h >> 8);
}

// A run of ggml blocks of `bb` bytes: the fp16 fields at byte offsets f0 (and f1 when >= 0) get
// scales of exponent e0 (positive for min scales), every other byte is random.
uint8_t block_with_halves(uint64_t key, uint64_t i, uint64_t bb, int64_t f0, int e0, int64_t f1, int e1) {
    const uint64_t block = i / bb, off = i % bb;
    if (static_cast<int64_t>(off) == f0 || static_cast<int64_t>(off) == f0 + 1)
        return half_byte(key, block, 0, e0, true, off - static_cast<uint64_t>(f0));
    if (f1 >= 0 && (static_cast<int64_t>(off) == f1 || static_cast<int64_t>(off) == f1 + 1))
        return half_byte(key, block, 1, e1, false, off - static_cast<uint64_t>(f1));
    return any_byte(key, i);
}

// Scales chosen so the dequantised weights are of the usual magnitude (a few hundredths).
uint8_t q8_0_byte(uint64_t key, uint64_t i) { return block_with_halves(key, i, 34, 0, -13, -1, 0); }
uint8_t q2_k_byte(uint64_t key, uint64_t i) { return block_with_halves(key, i, 84, 80, -10, 82, -11); }
uint8_t q3_k_byte(uint64_t key, uint64_t i) { return block_with_halves(key, i, 110, 108, -12, -1, 0); }
uint8_t q4_k_byte(uint64_t key, uint64_t i) { return block_with_halves(key, i, 144, 0, -14, 2, -14); }
uint8_t q5_k_byte(uint64_t key, uint64_t i) { return block_with_halves(key, i, 176, 0, -14, 2, -14); }
uint8_t q6_k_byte(uint64_t key, uint64_t i) { return block_with_halves(key, i, 210, 208, -14, -1, 0); }
uint8_t iq4_xs_byte(uint64_t key, uint64_t i) { return block_with_halves(key, i, 136, 0, -14, -1, 0); }

}  // namespace

// ggml MXFP4 blocks: byte 0 of each 17 an e8m0 scale (as e8m0_byte), then 16 random nibble pairs.
uint8_t ggml_mxfp4_byte(uint64_t key, uint64_t i) {
    const uint64_t block = i / 17;
    return i % 17 == 0 ? e8m0_byte(key ^ 0x9e3779b97f4a7c15ull, block) : any_byte(key, i);
}

ByteFn block_byte_fn(Format f) {
    switch (f) {
        case Format::q4_0: return q4_0_byte;
        case Format::q8_0: return q8_0_byte;
        case Format::q2_k: return q2_k_byte;
        case Format::q3_k: return q3_k_byte;
        case Format::q4_k: return q4_k_byte;
        case Format::q5_k: return q5_k_byte;
        case Format::q6_k: return q6_k_byte;
        case Format::iq4_xs: return iq4_xs_byte;
        default: break;
    }
    fail(FT_ERR_INVALID_ARGUMENT, "synth: ", format_name(f), " is not a GGUF block format");
}

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

}  // namespace ft::synth::detail
