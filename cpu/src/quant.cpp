// Quantised expert formats: decode tables, activation preparation, the scalar kernels (a direct
// transcription of the lib/core/formats reference) and the choice of kernel per tier.
//
// Prepared activation layouts (one per format, shared by the tiers except as noted):
//   fp8_block, mxfp4  float[K] as is.
//   nvfp4, ds_fp4     float, per 32 elements [16 even, 16 odd] (x0 x2 .. x30 x1 x3 .. x31), so a
//                     kernel multiplies the low nibbles of 16 packed bytes by the first half and
//                     the high nibbles by the second; zero-padded to a multiple of 32. ds_fp4 rounds
//                     x through FP8 per 128 first (DeepSeek-V4).
//   q4_0              Q8_0 (ft::quantize_q8_0): int8 q[K] zero-padded to a multiple of 64, then
//                     float d[K/32] (+1 zero entry).
// The AVX-512-BF16 tier's kernels (quant_avx512bf16.cpp) read bf16 activations instead:
//   fp8_block, mxfp4  bf16[K] as is.
//   nvfp4, ds_fp4     bf16, per 128 elements 4 phases of 32 (phase r, word m = x[4m + r]),
//                     zero-padded to a multiple of 128 (ds_fp4 after the FP8 round trip, whose
//                     results are bf16 values).
//   q8_0              the q4_0 layout (Q8_0) on every tier.
//   q2_k .. q6_k, iq4_xs  Q8_K (ft::quantize_q8_k, one scale per 256) in the q4_0 layout, each
//                     super-block's d repeated in its 8 entries, on every tier.
// q4_0 with AVX-512-VNNI: the same Q8_0 values grouped per 4 blocks, with per-lane d and the
// -8 * sum(q) correction (q8_0_x4_act_bytes in quant_kernels.hpp). The AVX2 kernels of nvfp4,
// ds_fp4 and mxfp4, and mxfp4's one-token VNNI kernel, take W4A8 x2 activations (two int8 terms
// per 32 elements: e2m1_x16_act_bytes, mxfp4_q8_act_bytes in quant_kernels.hpp).
#include "quant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(FT_CPU_X86_KERNELS)
#include <cpuid.h>
#endif

#include "ft/common.hpp"
#include "ft/dequant.hpp"

namespace ft::cpu {
namespace detail {

float g_e2m1[16];
float g_e4m3[256];
float g_e8m0[256];
uint16_t g_e2m1_bf16x32[32];
uint16_t g_e4m3_sub_bf16x32[32];
uint8_t g_e2m1_u8x64[64];
int16_t g_e2m1_i16x32[32];

namespace {
const bool g_tables_ready = [] {
    for (int i = 0; i < 16; ++i) g_e2m1[i] = e2m1_to_f32(uint8_t(i));
    for (int i = 0; i < 256; ++i) {
        g_e4m3[i] = e4m3_to_f32(uint8_t(i));
        g_e8m0[i] = e8m0_to_f32(uint8_t(i));
    }
    // Exact: e2m1 values and e4m3 subnormals have at most 2 significant bits.
    for (int i = 0; i < 32; ++i) {
        g_e2m1_bf16x32[i] = f32_to_bf16(e2m1_to_f32(uint8_t(i & 15)));
        g_e4m3_sub_bf16x32[i] = f32_to_bf16(e4m3_to_f32(uint8_t(i & 7)));
    }
    for (int i = 0; i < 64; ++i) g_e2m1_u8x64[i] = uint8_t(int(2.0f * e2m1_to_f32(uint8_t(i & 15))) + 12);
    for (int i = 0; i < 32; ++i) g_e2m1_i16x32[i] = int16_t(2.0f * e2m1_to_f32(uint8_t(i & 15)));
    return true;
}();

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Position of element k in the [16 even, 16 odd] per-32 layout.
inline int64_t split_index(int64_t k) { return (k & ~int64_t(31)) + ((k & 1) ? 16 : 0) + ((k & 31) >> 1); }

// bf16 per 128 elements in 4 phases of 32 (phase r, word m = element 4m + r), zero-padded to a
// multiple of 128; v holds bf16 bits.
void split128_bf16(const uint16_t *v, int64_t K, uint16_t *y) {
    for (int64_t c = 0; c < K; c += 128)
        for (int r = 0; r < 4; ++r)
            for (int i = 0; i < 32; ++i) {
                const int64_t k = c + 4 * i + r;
                y[c + 32 * r + i] = k < K ? v[k] : 0;
            }
}

inline uint8_t nibble(const uint8_t *packed, int64_t k) {
    const uint8_t b = packed[k / 2];
    return (k & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xf);
}

uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}
}  // namespace

size_t q8_0_act_bytes(int64_t K) { return size_t(round_up(K, 64) + 4 * (K / 32 + 1) + 63) / 64 * 64; }
size_t q8_0_x4_act_bytes(int64_t K) { return size_t(2 * round_up(K, 128)); }
size_t nvfp4_q8_act_bytes(int64_t K) { return size_t(2 * round_up(K, 128)); }
size_t mxfp4_q8_act_bytes(int64_t K) { return size_t(round_up(4 * round_up(K, 64) + 12 * (K / 32), 64)); }

void mxfp4_residual_q8(const float *x, const int8_t *q, float d, int8_t *q2) {
    // A non-finite block (quantize_q8_0 gave it scale NaN) has zero residual codes too.
    if (!std::isfinite(d)) {
        std::memset(q2, 0, 32);
        return;
    }
    const float inv = 256.0f * (1.0f / d);
    for (int i = 0; i < 32; ++i) {
        const float r = x[i] - float(q[i]) * d;
        q2[i] = int8_t(std::clamp(std::round(r * inv), -127.0f, 127.0f));
    }
}

namespace {
// One block of 32 as the W4A8 x2 terms: q1 and d by ft::quantize_q8_0, q2 the residual.
float q8x2_block(const float *v, int8_t *q1, int8_t *q2) {
    float d;
    quantize_q8_0(v, 32, q1, &d);
    mxfp4_residual_q8(v, q1, d, q2);
    return d;
}
}  // namespace

void prepare_mxfp4_q8x2_scalar(const uint16_t *x, int64_t K, uint8_t *dst) {
    const int64_t qbytes = round_up(K, 64), nb = K / 32;
    uint8_t *x16 = dst;  // int16 256 q1 + q2 per element, zero-padded
    std::memset(x16, 0, size_t(qbytes) * 2);
    dst += 2 * qbytes;
    int8_t *q1 = reinterpret_cast<int8_t *>(dst), *q2 = q1 + qbytes;
    float v[32];
    for (int64_t b = 0; b < nb; ++b) {
        for (int i = 0; i < 32; ++i) v[i] = bf16_to_f32(x[32 * b + i]);
        const float d = q8x2_block(v, q1 + 32 * b, q2 + 32 * b);
        int32_t c[2] = {0, 0};
        for (int i = 0; i < 32; ++i) {
            const int16_t w = int16_t(256 * q1[32 * b + i] + q2[32 * b + i]);
            std::memcpy(x16 + 2 * (32 * b + i), &w, 2);
            c[0] += q1[32 * b + i], c[1] += q2[32 * b + i];
        }
        c[0] *= -12, c[1] *= -12;
        const float ds = d / 512.0f;
        std::memcpy(dst + 2 * qbytes + 4 * b, &ds, 4);
        std::memcpy(dst + 2 * qbytes + 4 * nb + 8 * b, c, 8);
    }
    std::memset(q1 + K, 0, size_t(qbytes - K));
    std::memset(q2 + K, 0, size_t(qbytes - K));
}

size_t e2m1_x16_act_bytes(int64_t K) { return size_t(round_up(K, 64) * 2 + round_up(K, 64) / 2); }

namespace {
// 64 elements v (zero-padded) of the e2m1 W4A8 x2 activation from c: the int16 pairs of the
// 4 vectors and the 8 floats d / 512 (layout: quant_kernels.hpp).
void x16_chunk(const float *v, int64_t c, uint8_t *dst, float *dv) {
    int16_t x16[64];
    for (int h = 0; h < 2; ++h) {
        int8_t q1[32], q2[32];
        const float d = q8x2_block(v + 32 * h, q1, q2);
        for (int i = 0; i < 32; ++i) x16[32 * h + i] = int16_t(256 * q1[i] + q2[i]);
        for (int i = 0; i < 4; ++i) dv[c / 8 + 4 * h + i] = d / 512.0f;
    }
    // Vector g, word i: element 4 i + {0, 2, 1, 3}[g].
    static constexpr int kPhase[4] = {0, 2, 1, 3};
    int16_t *o = reinterpret_cast<int16_t *>(dst) + c;
    for (int g = 0; g < 4; ++g)
        for (int i = 0; i < 16; ++i) o[16 * g + i] = x16[4 * i + kPhase[g]];
}

// nvfp4's x16 activation zero-padded to kp elements (a multiple of 64).
void nvfp4_x16_padded(const uint16_t *x, int64_t K, int64_t kp, uint8_t *dst) {
    float *dv = reinterpret_cast<float *>(dst + 2 * kp);
    for (int64_t c = 0; c < kp; c += 64) {
        float v[64];
        for (int i = 0; i < 64; ++i) v[i] = c + i < K ? bf16_to_f32(x[c + i]) : 0.0f;
        x16_chunk(v, c, dst, dv);
    }
}

// The x16 order of kp elements (a multiple of 128) rearranged in place into the x16z order.
void x16_to_x16z(uint8_t *dst, int64_t kp) {
    uint8_t t[256];
    for (int64_t c = 0; c < kp; c += 128) {
        uint8_t *p = dst + 2 * c;
        std::memcpy(t, p, 256);
        for (int g = 0; g < 4; ++g) {
            std::memcpy(p + 64 * g, t + 32 * g, 32);
            std::memcpy(p + 64 * g + 32, t + 128 + 32 * g, 32);
        }
    }
}
}  // namespace

void prepare_nvfp4_x16(const uint16_t *x, int64_t K, uint8_t *dst) { nvfp4_x16_padded(x, K, round_up(K, 64), dst); }

// ds_fp4's: the FP8 round trip per 128, then the chunks (K is a multiple of 128 for ds_fp4).
void prepare_ds_fp4_x16(const uint16_t *x, int64_t K, uint8_t *dst) {
    float *dv = reinterpret_cast<float *>(dst + 2 * K);
    float v[kFp8ActBlock];
    for (int64_t c = 0; c < K; c += kFp8ActBlock) {
        fp8_round_trip_bf16(x + c, kFp8ActBlock, v);
        for (int64_t h = 0; h < kFp8ActBlock; h += 64) x16_chunk(v + h, c + h, dst, dv);
    }
}

size_t e2m1_x16z_act_bytes(int64_t K) { return size_t(round_up(K, 128) * 2 + round_up(K, 128) / 2); }

void prepare_nvfp4_x16z(const uint16_t *x, int64_t K, uint8_t *dst) {
    nvfp4_x16_padded(x, K, round_up(K, 128), dst);
    x16_to_x16z(dst, round_up(K, 128));
}

void prepare_ds_fp4_x16z(const uint16_t *x, int64_t K, uint8_t *dst) {
    prepare_ds_fp4_x16(x, K, dst);
    x16_to_x16z(dst, K);
}

// The scalar kernels dequantise each weight exactly as lib/core/formats does and accumulate in fp32.
void fp8_block_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                      float *out, size_t ldo) {
    const int64_t K = m.K, kb = K / 128;
    for (int j = 0; j < count; ++j) {
        const int64_t r = first + j;
        const uint8_t *w = m.data + r * K;
        const uint8_t *band = m.scale + (r / 128) * kb * 2;
        for (int t = 0; t < ntok; ++t) {
            const float *x = reinterpret_cast<const float *>(act[t]);
            float s = 0.0f;
            for (int64_t k = 0; k < K; ++k) s += g_e4m3[w[k]] * bf16_to_f32(load_u16(band + (k / 128) * 2)) * x[k];
            out[t * ldo + j] = s;
        }
    }
}

void nvfp4_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                  float *out, size_t ldo) {
    const int64_t K = m.K;
    for (int j = 0; j < count; ++j) {
        const int64_t r = first + j;
        const uint8_t *p = m.data + r * (K / 2), *sc = m.scale + r * (K / 16);
        const float g = f16_to_f32(load_u16(m.global + r * 2));
        for (int t = 0; t < ntok; ++t) {
            const float *x = reinterpret_cast<const float *>(act[t]);
            float s = 0.0f;
            for (int64_t k = 0; k < K; ++k) s += g_e2m1[nibble(p, k)] * g_e4m3[sc[k / 16]] * g * x[split_index(k)];
            out[t * ldo + j] = s;
        }
    }
}

void ds_fp4_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                   float *out, size_t ldo) {
    const int64_t K = m.K;
    for (int j = 0; j < count; ++j) {
        const int64_t r = first + j;
        const uint8_t *p = m.data + r * (K / 2), *sc = m.scale + r * (K / 32);
        for (int t = 0; t < ntok; ++t) {
            const float *x = reinterpret_cast<const float *>(act[t]);
            float s = 0.0f;
            for (int64_t k = 0; k < K; ++k) s += g_e2m1[nibble(p, k)] * g_e8m0[sc[k / 32]] * x[split_index(k)];
            out[t * ldo + j] = s;
        }
    }
}

void q4_0_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                 float *out, size_t ldo) {
    const int64_t K = m.K, nb = K / 32, qbytes = round_up(K, 64);
    for (int j = 0; j < count; ++j) {
        const uint8_t *row = m.data + (first + j) * nb * 18;
        for (int t = 0; t < ntok; ++t) {
            const int8_t *q = reinterpret_cast<const int8_t *>(act[t]);
            const float *d = reinterpret_cast<const float *>(act[t] + qbytes);
            float s = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t *blk = row + b * 18;
                int32_t isum = 0;
                for (int i = 0; i < 16; ++i) {
                    isum += (int32_t(blk[2 + i] & 0xf) - 8) * q[b * 32 + i];
                    isum += (int32_t(blk[2 + i] >> 4) - 8) * q[b * 32 + 16 + i];
                }
                s += float(isum) * (f16_to_f32(load_u16(blk)) * d[b]);
            }
            out[t * ldo + j] = s;
        }
    }
}

void mxfp4_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                  float *out, size_t ldo) {
    const int64_t K = m.K, N = m.N;
    for (int j = 0; j < count; ++j) {
        const int64_t n = first + j;
        for (int t = 0; t < ntok; ++t) {
            const float *x = reinterpret_cast<const float *>(act[t]);
            float s = 0.0f;
            for (int64_t k = 0; k < K; ++k) {
                const uint8_t b = m.data[(k / 2) * N + n];
                const uint8_t code = (k & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xf);
                s += g_e2m1[code] * g_e8m0[m.scale[(k / 32) * N + n]] * x[k];
            }
            out[t * ldo + j] = s;
        }
    }
}

// Groups of 4 Q8_0 blocks (q8_0_x4_act_bytes): q of elements 0..15 of each block, then 16..31,
// then per int32 lane (8 elements of block l / 4) -8 * sum(q) and the block's d. The definition
// the SIMD prepare_q8_0_x4_avx512 is tested against.
void prepare_q8_0_x4_scalar(const uint16_t *x, int64_t K, uint8_t *dst) {
    const int64_t nb = K / 32;
    float v[32], d[4];
    int8_t q[4][32];
    for (int64_t g = 0; g < round_up(nb, 4); g += 4) {
        uint8_t *o = dst + g * 64;
        for (int j = 0; j < 4; ++j) {
            if (g + j < nb) {
                for (int i = 0; i < 32; ++i) v[i] = bf16_to_f32(x[(g + j) * 32 + i]);
                quantize_q8_0(v, 32, q[j], &d[j]);
            } else {
                std::memset(q[j], 0, 32);
                d[j] = 0.0f;
            }
            std::memcpy(o + 16 * j, q[j], 16);
            std::memcpy(o + 64 + 16 * j, q[j] + 16, 16);
        }
        int32_t c[16];
        float dl[16];
        for (int l = 0; l < 16; ++l) {
            const int8_t *lo = q[l / 4] + 4 * (l % 4), *hi = lo + 16;
            c[l] = -8 * (lo[0] + lo[1] + lo[2] + lo[3] + hi[0] + hi[1] + hi[2] + hi[3]);
            dl[l] = d[l / 4];
        }
        std::memcpy(o + 128, c, 64);
        std::memcpy(o + 192, dl, 64);
    }
}

// The ds_fp4 activation of the AVX-512-BF16 kernels: FP8 round trip per 128, then bf16 in the
// 4 phases per 128 (phase r, word m = element 4m + r). The definition prepare_ds_fp4_bf16_avx512
// is tested against, and its fallback for groups holding Inf/NaN.
void prepare_ds_fp4_bf16_scalar(const uint16_t *x, int64_t K, uint8_t *dst) {
    float v[kFp8ActBlock];
    uint16_t b[kFp8ActBlock];
    uint16_t *y = reinterpret_cast<uint16_t *>(dst);
    for (int64_t c = 0; c < K; c += kFp8ActBlock) {  // K is a multiple of 128 for ds_fp4
        fp8_round_trip_bf16(x + c, kFp8ActBlock, v);
        for (int i = 0; i < kFp8ActBlock; ++i) b[i] = f32_to_bf16(v[i]);  // exact: v is bf16
        split128_bf16(b, kFp8ActBlock, y + c);
    }
}

}  // namespace detail

// Bit-exact with ft::fp8_round_trip_per128 (tested), without its per-element frexp/ldexp: after the
// power-of-two scaling, e4m3 rounding is RNE to 3 mantissa bits for normals (|c| >= 2^-6) and to
// multiples of 2^-9 below.
void fp8_round_trip_bf16(const uint16_t *x, int64_t K, float *y) {
    for (int64_t g = 0; g < K / kFp8ActBlock; ++g) {
        const uint16_t *xs = x + g * kFp8ActBlock;
        float *ys = y + g * kFp8ActBlock;
        float amax = 0.0f;
        for (int i = 0; i < kFp8ActBlock; ++i) amax = std::max(amax, std::fabs(bf16_to_f32(xs[i])));
        amax = std::max(amax, 1e-4f);
        const float r = amax / 448.0f;
        uint32_t bits;
        std::memcpy(&bits, &r, 4);
        const int e = int((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0 ? 1 : 0);
        const float s = std::ldexp(1.0f, e);
        for (int i = 0; i < kFp8ActBlock; ++i) {
            const float c = std::clamp(bf16_to_f32(xs[i]) / s, -448.0f, 448.0f);
            float q;
            if (std::fabs(c) < 0.015625f) {
                q = std::nearbyint(c * 512.0f) / 512.0f;  // default rounding mode: nearest even
                if (q == 0.0f) q = std::copysign(0.0f, c);
            } else {
                uint32_t b;
                std::memcpy(&b, &c, 4);
                b += 0x7ffffu + ((b >> 20) & 1u);
                b &= ~0xfffffu;
                std::memcpy(&q, &b, 4);
            }
            ys[i] = bf16_to_f32(f32_to_bf16(q * s));
        }
    }
}

namespace {

using detail::round_up;

size_t f32_act_bytes(int64_t K) { return size_t(round_up(K, 32) * 4 + 63) / 64 * 64; }

void prepare_f32(const uint16_t *x, int64_t K, uint8_t *dst) {
    float *y = reinterpret_cast<float *>(dst);
    for (int64_t k = 0; k < K; ++k) y[k] = bf16_to_f32(x[k]);
}

// v[0, K) to y in the per-32 layout Index (zero-padded to a multiple of 32).
template <int64_t (*Index)(int64_t)>
void split_f32(const float *v, int64_t K, float *y) {
    const int64_t padded = round_up(K, 32);
    for (int64_t k = K; k < padded; ++k) y[Index(k)] = 0.0f;
    for (int64_t k = 0; k < K; ++k) y[Index(k)] = v[k];
}

// nvfp4: the fp32 activation in the per-32 layout Index.
template <int64_t (*Index)(int64_t)>
void prepare_split(const uint16_t *x, int64_t K, uint8_t *dst) {
    float v[32];
    float *y = reinterpret_cast<float *>(dst);
    for (int64_t c = 0; c < K; c += 32) {
        const int64_t n = std::min<int64_t>(32, K - c);
        for (int64_t i = 0; i < n; ++i) v[i] = bf16_to_f32(x[c + i]);
        split_f32<Index>(v, n, y + c);
    }
}

// ds_fp4: the FP8 round trip per 128, then the per-32 layout Index.
template <int64_t (*Index)(int64_t)>
void prepare_ds_fp4(const uint16_t *x, int64_t K, uint8_t *dst) {
    float v[kFp8ActBlock];
    float *y = reinterpret_cast<float *>(dst);
    for (int64_t c = 0; c < K; c += kFp8ActBlock) {  // K is a multiple of 128 for ds_fp4
        fp8_round_trip_bf16(x + c, kFp8ActBlock, v);
        split_f32<Index>(v, kFp8ActBlock, y + c);
    }
}
constexpr auto prepare_split_even_odd = prepare_split<detail::split_index>;
constexpr auto prepare_ds_fp4_even_odd = prepare_ds_fp4<detail::split_index>;

// Q8_0 (Block 32) or Q8_K (Block 256: quantize_q8_k; K a multiple of 256 for the K-quants), both in
// the Q8_0 layout: int8 q[K] zero-padded to 64, then float d[K/32] (+1 zero entry), a Q8_K scale
// repeated in its super-block's 8 entries, so per-32 kernels read either.
template <int Block>
void prepare_q8(const uint16_t *x, int64_t K, uint8_t *dst) {
    const int64_t qbytes = round_up(K, 64);
    int8_t *q = reinterpret_cast<int8_t *>(dst);
    float *d = reinterpret_cast<float *>(dst + qbytes);
    float v[Block], scale;
    for (int64_t b = 0; b < K / Block; ++b) {
        for (int i = 0; i < Block; ++i) v[i] = bf16_to_f32(x[b * Block + i]);
        if constexpr (Block == 32) quantize_q8_0(v, 32, q + b * 32, &scale);
        else quantize_q8_k(v, Block, q + b * Block, &scale);
        for (int i = 0; i < Block / 32; ++i) d[b * (Block / 32) + i] = scale;
    }
    std::memset(q + K, 0, size_t(qbytes - K));
    d[K / 32] = 0.0f;
}
constexpr auto prepare_q8_0 = prepare_q8<32>;
constexpr auto prepare_q8_k = prepare_q8<256>;

size_t bf16_act_bytes(int64_t K) { return size_t(round_up(K, 64) * 2); }

void prepare_bf16(const uint16_t *x, int64_t K, uint8_t *dst) {
    std::memcpy(dst, x, size_t(K) * 2);
    std::memset(dst + K * 2, 0, size_t(round_up(K, 64) - K) * 2);
}

size_t bf16_act128_bytes(int64_t K) { return size_t(round_up(K, 128) * 2); }

void prepare_split_bf16(const uint16_t *x, int64_t K, uint8_t *dst) {
    detail::split128_bf16(x, K, reinterpret_cast<uint16_t *>(dst));
}

void prepare_nvfp4_q8(const uint16_t *x, int64_t K, uint8_t *dst) {
    float v[16], d;
    int8_t q[16];
    for (int64_t c = 0; c < round_up(K, 128); c += 128) {
        uint8_t *o = dst + 2 * c;
        int32_t cl[16];
        float dl[16];
        for (int b = 0; b < 8; ++b) {  // blocks of 16 of the chunk, q as [8 even, 8 odd]
            const int64_t k0 = c + 16 * b;
            if (k0 < K) {
                for (int i = 0; i < 16; ++i) v[i] = bf16_to_f32(x[k0 + i]);
                quantize_int8_per16(v, 16, q, &d);
            } else {
                std::memset(q, 0, 16);
                d = 0.0f;
            }
            for (int h = 0; h < 2; ++h) {
                const int l = 2 * b + h;
                std::memcpy(o + 4 * l, q + 4 * h, 4);
                std::memcpy(o + 64 + 4 * l, q + 8 + 4 * h, 4);
                int32_t sum = 0;
                for (int j = 0; j < 4; ++j) sum += q[4 * h + j] + q[8 + 4 * h + j];
                cl[l] = -12 * sum;
                dl[l] = d * 0.5f;  // the 1/2 of u = 2 * e2m1 + 12
            }
        }
        std::memcpy(o + 128, cl, 64);
        std::memcpy(o + 192, dl, 64);
    }
}

#if defined(FT_CPU_X86_KERNELS)
// nvfp4 / ds_fp4 at the avx512bf16 tier with AVX-512-VNNI. The activation is the avx512bf16
// kernel's (bf16; the batched path reads it too) followed by the W4A8 x2 one (x16z). Calls of up
// to kX2MaxTokens tokens run the VNNI kernel on the second part (its decode is cheaper: 1.1-1.7x
// per core at 1-8 tokens on the dev box's Xeon), more tokens the avx512bf16 kernel on the first
// (fewer activation bytes per element, and more tokens' activations stay in cache: even at 16
// tokens there, and the ds_fp4 layer with 16 tokens per expert 1.4x on the H100 host's Xeon).
constexpr int kX2MaxTokens = 8;

size_t bf16_x16z_act_bytes(int64_t K) { return bf16_act128_bytes(K) + detail::e2m1_x16z_act_bytes(K); }

// A two-part activation: Head's layout (HeadBytes(K) bytes), then Tail's.
template <size_t (*HeadBytes)(int64_t), void (*Head)(const uint16_t *, int64_t, uint8_t *),
          void (*Tail)(const uint16_t *, int64_t, uint8_t *)>
void prepare_two_part(const uint16_t *x, int64_t K, uint8_t *dst) {
    Head(x, K, dst);
    Tail(x, K, dst + HeadBytes(K));
}

template <void (*Head)(const uint16_t *, int64_t, uint8_t *), void (*Tail)(const uint16_t *, int64_t, uint8_t *)>
constexpr auto prepare_bf16_x16z = prepare_two_part<bf16_act128_bytes, Head, Tail>;

// Calls of up to MaxX2 tokens through X2 on the second part of a two-part activation, more through
// W4A16 on the first (HeadBytes(K) bytes).
template <detail::QuantGemv X2, detail::QuantGemv W4A16, size_t (*HeadBytes)(int64_t) = bf16_act128_bytes,
          int MaxX2 = kX2MaxTokens>
void x2_or_w4a16(const detail::QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                 float *out, size_t ldo) {
    if (ntok > MaxX2) return W4A16(m, first, count, act, ntok, out, ldo);
    const size_t head = HeadBytes(m.K);
    const uint8_t *tail[MaxX2];
    for (int t = 0; t < ntok; ++t) tail[t] = act[t] + head;
    X2(m, first, count, tail, ntok, out, ldo);
}

// The AMX variants over a W4A8 x2 kernel: calls of few tokens stay on it, on the second part of
// the activation (bf16, then the x2 layout), more go to the tiles on the first (H100 host,
// `moe_layer_*` bs 2 and 8, cpu/README "AMX kernels of the quantised formats"). mxfp4: one token
// (with the tiles from 2 tokens the layer was as fast at bs 2 and 0-9 % faster at bs 8); ds_fp4:
// up to 2 (from 2 tokens the layer lost 8 % at bs 2, mostly 1- and 2-token calls, and won 30 % at
// bs 8, about 4 tokens per call).
constexpr int kMxfp4AmxX2MaxTokens = 1;
constexpr int kDsAmxX2MaxTokens = 2;
size_t mxfp4_bf16_q8_act_bytes(int64_t K) { return bf16_act_bytes(K) + detail::mxfp4_q8_act_bytes(K); }
#endif

struct Kernel {
    detail::QuantGemv gemv = nullptr;  // nullptr: the tier below's
    const char *suffix = nullptr;
    size_t (*act_bytes)(int64_t) = nullptr;
    void (*prepare)(const uint16_t *, int64_t, uint8_t *) = nullptr;
    detail::QuantDequant dequant = nullptr;
    const char *name = nullptr;  // replaces TierKernels::name (a kernel of other numerics)
    size_t (*dequant_act_bytes)(int64_t) = nullptr;  // QuantOps::dequant_act_bytes
    int x2_max_tokens = 0;                           // QuantOps::x2_max_tokens
};

struct TierKernels {
    Format format;
    const char *name;
    Kernel tier[4];  // scalar, avx2, avx512, avx512bf16
    Kernel vnni;     // with AVX-512-VNNI, at tiers >= avx512 (nvfp4, ds_fp4, q4_0, GGUF block formats)
    Kernel vbmi;     // with AVX-512-VBMI, at the avx512bf16 tier (mxfp4 only)
    // The W4A8 kernel where its knob switches it on (quant_ops: QuantChoice), at tiers >=
    // fast_tier on a CPU with AVX-512-VNNI (and VBMI where fast_vbmi): nvfp4 W4A8, mxfp4 W4A8 x2.
    Kernel fast = {};
    bool fast_vbmi = false;
    Isa fast_tier = Isa::avx512;  // the lowest tier that runs it
    Kernel vnni_bf16 = {};        // with AVX-512-VNNI at the avx512bf16 tier, over `vnni`
    Kernel amx = {};              // with the AMX GEMV at the avx512bf16 tier, over all the above (fp8_block, mxfp4, ds_fp4, q2_k, q3_k)
    // amx where the kernel it replaces is a W4A8 x2 one (ds_fp4's vnni_bf16, mxfp4's fast): calls of
    // few tokens stay on that kernel.
    Kernel amx_x2 = {};
};

// A GGUF block format: scalar, AVX2, AVX-512 (also the avx512bf16 tier's) and AVX-512-VNNI kernels,
// all over one activation in the Q8_0 layout: Q8_0 for q8_0, Q8_K (prepare_q8_k) for the super-block
// formats (format_act_block). The SIMD ones are nullptr where the build has no x86 kernels.
TierKernels gguf_kernels(Format f, const char *name, detail::QuantGemv scalar, detail::QuantGemv avx2,
                         detail::QuantGemv avx512, detail::QuantGemv avx512vnni) {
    const auto prep = format_act_block(f) == 256 ? prepare_q8_k : prepare_q8_0;
    TierKernels k{f, name, {{scalar, "-scalar", detail::q8_0_act_bytes, prep}}, {}, {}};
    if (avx2) k.tier[1] = {avx2, "-avx2", detail::q8_0_act_bytes, prep};
    if (avx512) k.tier[2] = {avx512, "-avx512", detail::q8_0_act_bytes, prep};
    if (avx512vnni) k.vnni = {avx512vnni, "-avx512vnni", detail::q8_0_act_bytes, prep};
    return k;
}

// k with its AMX kernel (nullptr: none), over the same activation as its other tiers.
TierKernels with_amx(TierKernels k, detail::QuantGemv amx) {
    if (amx) k.amx = {amx, "-amx", k.tier[0].act_bytes, k.tier[0].prepare};
    return k;
}

#if defined(FT_CPU_X86_KERNELS)
#define X86(kernel) kernel
#else
#define X86(kernel) nullptr
#endif

const TierKernels kKernels[] = {
    {Format::fp8_block, "fp8_block-w8a16",
     {{detail::fp8_block_scalar, "-scalar", f32_act_bytes, prepare_f32}
#if defined(FT_CPU_X86_KERNELS)
      , {detail::fp8_block_avx2, "-avx2", f32_act_bytes, prepare_f32}, {detail::fp8_block_avx512, "-avx512", f32_act_bytes, prepare_f32},
      {detail::fp8_block_avx512bf16, "-avx512bf16", bf16_act_bytes, prepare_bf16}
#endif
     }, {}, {}, {}, false, Isa::avx512, {},
#if defined(FT_CPU_X86_KERNELS)
     {detail::fp8_block_amx, "-amx", bf16_act_bytes, prepare_bf16}},
#else
     {}},
#endif
    {Format::nvfp4, "nvfp4-w4a16",
     {{detail::nvfp4_scalar, "-scalar", f32_act_bytes, prepare_split_even_odd}
#if defined(FT_CPU_X86_KERNELS)
      , {detail::nvfp4_avx2, "-avx2", detail::e2m1_x16_act_bytes, detail::prepare_nvfp4_x16, nullptr, "nvfp4-w4a8x2"},
      {detail::nvfp4_avx512, "-avx512", f32_act_bytes, prepare_split_even_odd},
      {detail::nvfp4_avx512bf16, "-avx512bf16", bf16_act128_bytes, prepare_split_bf16,
       detail::nvfp4_dequant_avx512bf16}
#endif
     },
#if defined(FT_CPU_X86_KERNELS)
     {detail::nvfp4_avx512vnni_x16, "-avx512vnni", detail::e2m1_x16z_act_bytes, detail::prepare_nvfp4_x16z, nullptr,
      "nvfp4-w4a8x2"},
     {},
     {detail::nvfp4_avx512vnni_w4a8, "-avx512vnni", detail::nvfp4_q8_act_bytes, prepare_nvfp4_q8, nullptr,
      "nvfp4-w4a8"}, false, Isa::avx512,
     {x2_or_w4a16<detail::nvfp4_avx512vnni_x16, detail::nvfp4_avx512bf16>, "-avx512vnni+avx512bf16", bf16_x16z_act_bytes,
      prepare_bf16_x16z<prepare_split_bf16, detail::prepare_nvfp4_x16z>, detail::nvfp4_dequant_avx512bf16,
      "nvfp4-w4a8x2", bf16_act128_bytes, kX2MaxTokens}},
#else
     {}, {}},
#endif
    {Format::ds_fp4, "ds_fp4-w4a16(fp8 act)",
     {{detail::ds_fp4_scalar, "-scalar", f32_act_bytes, prepare_ds_fp4_even_odd}
#if defined(FT_CPU_X86_KERNELS)
      , {detail::ds_fp4_avx2, "-avx2", detail::e2m1_x16_act_bytes, detail::prepare_ds_fp4_x16, nullptr,
         "ds_fp4-w4a8x2(fp8 act)"},
      {detail::ds_fp4_avx512, "-avx512", f32_act_bytes, prepare_ds_fp4_even_odd},
      {detail::ds_fp4_avx512bf16_rowexp, "-avx512bf16-rowexp", bf16_act128_bytes, detail::prepare_ds_fp4_bf16_avx512,
       detail::ds_fp4_dequant_avx512bf16_rowexp}
#endif
     },
#if defined(FT_CPU_X86_KERNELS)
     {detail::ds_fp4_avx512vnni_x16, "-avx512vnni", detail::e2m1_x16z_act_bytes, detail::prepare_ds_fp4_x16z, nullptr,
      "ds_fp4-w4a8x2(fp8 act)"},
     {}, {}, false, Isa::avx512,
     {x2_or_w4a16<detail::ds_fp4_avx512vnni_x16, detail::ds_fp4_avx512bf16_rowexp>, "-avx512vnni+avx512bf16-rowexp",
      bf16_x16z_act_bytes, prepare_bf16_x16z<detail::prepare_ds_fp4_bf16_avx512, detail::prepare_ds_fp4_x16z>,
      detail::ds_fp4_dequant_avx512bf16_rowexp, "ds_fp4-w4a8x2(fp8 act)", bf16_act128_bytes, kX2MaxTokens},
     {detail::ds_fp4_amx, "-amx", bf16_act128_bytes, detail::prepare_ds_fp4_bf16_avx512},
     {x2_or_w4a16<detail::ds_fp4_avx512vnni_x16, detail::ds_fp4_amx, bf16_act128_bytes, kDsAmxX2MaxTokens>,
      "-avx512vnni+amx", bf16_x16z_act_bytes,
      prepare_bf16_x16z<detail::prepare_ds_fp4_bf16_avx512, detail::prepare_ds_fp4_x16z>, nullptr,
      "ds_fp4-w4a8x2(fp8 act)", nullptr, kDsAmxX2MaxTokens}},
#else
     {}, {}},
#endif
    {Format::mxfp4, "mxfp4-w4a16",
     {{detail::mxfp4_scalar, "-scalar", f32_act_bytes, prepare_f32}
#if defined(FT_CPU_X86_KERNELS)
      , {detail::mxfp4_avx2, "-avx2", detail::mxfp4_q8_act_bytes, detail::prepare_mxfp4_q8x2_scalar, nullptr,
         "mxfp4-w4a8x2"},
      {detail::mxfp4_avx512, "-avx512", f32_act_bytes, prepare_f32},
      {detail::mxfp4_avx512bf16, "-avx512bf16", bf16_act_bytes, prepare_bf16}
#endif
     }, {},
#if defined(FT_CPU_X86_KERNELS)
     {detail::mxfp4_avx512vbmi, "-avx512bf16vbmi", bf16_act_bytes, prepare_bf16},
     {detail::mxfp4_avx512vnni_w4a8, "-avx512vnnivbmi", detail::mxfp4_q8_act_bytes,
      detail::prepare_mxfp4_q8x2_avx512, nullptr,
      "mxfp4-w4a8x2"}, true, Isa::avx512bf16, {},
     {detail::mxfp4_amx, "-amx", bf16_act_bytes, prepare_bf16},
     {x2_or_w4a16<detail::mxfp4_avx512vnni_w4a8, detail::mxfp4_amx, bf16_act_bytes, kMxfp4AmxX2MaxTokens>,
      "-avx512vnnivbmi+amx",
      mxfp4_bf16_q8_act_bytes, prepare_two_part<bf16_act_bytes, prepare_bf16, detail::prepare_mxfp4_q8x2_avx512>,
      nullptr, "mxfp4-w4a8x2", nullptr, kMxfp4AmxX2MaxTokens}},
#else
     {}},
#endif
    {Format::q4_0, "q4_0-w4a8",
     {{detail::q4_0_scalar, "-scalar", detail::q8_0_act_bytes, prepare_q8_0}
#if defined(FT_CPU_X86_KERNELS)
      , {detail::q4_0_avx2, "-avx2", detail::q8_0_act_bytes, prepare_q8_0},
      {detail::q4_0_avx512, "-avx512", detail::q8_0_act_bytes, prepare_q8_0}, {}
#endif
     },
#if defined(FT_CPU_X86_KERNELS)
     {detail::q4_0_avx512vnni_x4, "-avx512vnni-x4", detail::q8_0_x4_act_bytes, detail::prepare_q8_0_x4_avx512}, {}},
#else
     {}, {}},
#endif
    // GGUF block formats beyond q4_0 (q8_0: Q8_0 activations like q4_0; the others Q8_K). One line per format.
    gguf_kernels(Format::q8_0, "q8_0-w8a8", detail::q8_0_scalar, X86(detail::q8_0_avx2), X86(detail::q8_0_avx512),
                 X86(detail::q8_0_avx512vnni)),
    gguf_kernels(Format::q4_k, "q4_k-w4a8", detail::q4_k_scalar, X86(detail::q4_k_avx2), X86(detail::q4_k_avx512),
                 X86(detail::q4_k_avx512vnni)),
    gguf_kernels(Format::q5_k, "q5_k-w5a8", detail::q5_k_scalar, X86(detail::q5_k_avx2), X86(detail::q5_k_avx512),
                 X86(detail::q5_k_avx512vnni)),
    gguf_kernels(Format::q6_k, "q6_k-w6a8", detail::q6_k_scalar, X86(detail::q6_k_avx2), X86(detail::q6_k_avx512),
                 X86(detail::q6_k_avx512vnni)),
    with_amx(gguf_kernels(Format::q2_k, "q2_k-w2a8", detail::q2_k_scalar, X86(detail::q2_k_avx2),
                          X86(detail::q2_k_avx512), X86(detail::q2_k_avx512vnni)),
             X86(detail::q2_k_amx)),
    with_amx(gguf_kernels(Format::q3_k, "q3_k-w3a8", detail::q3_k_scalar, X86(detail::q3_k_avx2),
                          X86(detail::q3_k_avx512), X86(detail::q3_k_avx512vnni)),
             X86(detail::q3_k_amx)),
    gguf_kernels(Format::iq4_xs, "iq4_xs-w4a8", detail::iq4_xs_scalar, X86(detail::iq4_xs_avx2), X86(detail::iq4_xs_avx512),
                 X86(detail::iq4_xs_avx512vnni)),
};
#undef X86

// The AVX-VNNI flavour of a format's AVX2 kernel (vpdpbusd / vpdpwssd, same activation and
// results), where it has one.
detail::QuantGemv avx2_vnni_gemv(Format f) {
#if defined(FT_CPU_X86_KERNELS)
    switch (f) {
        case Format::nvfp4: return detail::nvfp4_avxvnni;
        case Format::ds_fp4: return detail::ds_fp4_avxvnni;
        case Format::mxfp4: return detail::mxfp4_avxvnni;
        case Format::q4_0: return detail::q4_0_avxvnni;
        case Format::q8_0: return detail::q8_0_avxvnni;
        case Format::q4_k: return detail::q4_k_avxvnni;
        case Format::q5_k: return detail::q5_k_avxvnni;
        case Format::q6_k: return detail::q6_k_avxvnni;
        case Format::q2_k: return detail::q2_k_avxvnni;
        case Format::q3_k: return detail::q3_k_avxvnni;
        case Format::iq4_xs: return detail::iq4_xs_avxvnni;
        default: return nullptr;
    }
#else
    (void)f;
    return nullptr;
#endif
}

// VNNI is orthogonal to the tiers: AVX-512-VNNI at tiers >= avx512 (Cascade Lake has it without
// BF16), AVX-VNNI at the avx2 tier (Alder Lake and later, Zen 5), each where cpuid has it, unless
// the choice turns it off (FT_CPU_VNNI=0).
bool use_vnni(bool wanted, Isa isa) {
#if defined(FT_CPU_X86_KERNELS)
    static const bool has512 = __builtin_cpu_supports("avx512vnni"), has256 = cpu_has_avx_vnni();
    if (!wanted) return false;
    if (int(isa) >= int(Isa::avx512)) return has512 && int(cpu_best_isa()) >= int(Isa::avx512);
    return isa == Isa::avx2 && has256 && int(cpu_best_isa()) >= int(Isa::avx2);
#else
    (void)wanted;
    (void)isa;
    return false;
#endif
}

// The W4A8 kernel of a format, where the choice switches it on.
bool fast_kernel(Format f, const QuantChoice &c) {
    switch (f) {
        case Format::mxfp4: return c.mxfp4_w4a8;
        case Format::nvfp4: return c.nvfp4_w4a8;
        default: return false;
    }
}

}  // namespace

bool cpu_has_avx_vnni() {
#if defined(FT_CPU_X86_KERNELS)
    // CPUID leaf 7, sub-leaf 1, EAX bit 4 (clang's __builtin_cpu_supports does not know "avxvnni").
    unsigned a = 0, b = 0, c = 0, d = 0;
    static const bool v = __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1u);
    return v;
#else
    return false;
#endif
}

bool cpu_has_vbmi() {
#if defined(FT_CPU_X86_KERNELS)
    static const bool v = __builtin_cpu_supports("avx512vbmi");
    return v;
#else
    return false;
#endif
}

const QuantOps *quant_ops_variant(Format f, Isa isa, bool vnni, bool vbmi, bool fast, bool amx) {
    if (f == Format::bf16) return nullptr;
    // One table of every (format, tier, vnni, vbmi, fast) combination, built once; tiers without
    // their own kernel use the next lower one.
    static const std::vector<QuantOps> table = [] {
        std::vector<QuantOps> t;
        // Reserved in full so that push_back never moves the strings whose c_str() t keeps.
        static std::vector<std::string> names;
        names.reserve(std::size(kKernels) * 64);
        for (const TierKernels &k : kKernels)
            for (int am = 0; am < 2; ++am)
            for (int fa = 0; fa < 2; ++fa)
            for (int vb = 0; vb < 2; ++vb)
            for (int v = 0; v < 2; ++v)
                for (int tier = 0; tier < 4; ++tier) {
                    Kernel use = k.tier[0];
                    for (int i = 1; i <= tier; ++i)
                        if (k.tier[i].gemv) use = k.tier[i];
                    if (v && tier == int(Isa::avx2) && use.gemv == k.tier[1].gemv && avx2_vnni_gemv(k.format)) {
                        use.gemv = avx2_vnni_gemv(k.format);
                        use.suffix = "-avx2vnni";
                    }
                    if (v && tier >= int(Isa::avx512) && k.vnni.gemv) use = k.vnni;
                    if (v && tier >= int(Isa::avx512bf16) && k.vnni_bf16.gemv) use = k.vnni_bf16;
                    if (vb && tier >= int(Isa::avx512bf16) && k.vbmi.gemv) use = k.vbmi;
                    if (fa && v && (vb || !k.fast_vbmi) && tier >= int(k.fast_tier) && k.fast.gemv)
                        use = k.fast;
                    if (am && tier >= int(Isa::avx512bf16) && k.amx.gemv) {
                        const bool x2 = k.amx_x2.gemv && (use.gemv == k.vnni_bf16.gemv || use.gemv == k.fast.gemv);
                        use = x2 ? k.amx_x2 : k.amx;
                    }
                    names.push_back(std::string(use.name ? use.name : k.name) + use.suffix);
                    const auto dequant_bytes = !use.dequant ? nullptr : use.dequant_act_bytes ? use.dequant_act_bytes : use.act_bytes;
                    t.push_back({k.format, use.gemv, names.back().c_str(), use.act_bytes, use.prepare, use.dequant,
                                 dequant_bytes, use.x2_max_tokens});
                }
        return t;
    }();
    for (size_t i = 0; i < std::size(kKernels); ++i)
        if (kKernels[i].format == f)
            return &table[i * 64 + (amx ? 32 : 0) + (fast ? 16 : 0) + (vbmi ? 8 : 0) + (vnni ? 4 : 0) + size_t(isa)];
    fail(FT_ERR_UNSUPPORTED, "no CPU kernel for format ", format_name(f));
}

bool quant_amx_available(Format f) {
#if defined(FT_CPU_X86_KERNELS)
    switch (f) {
        case Format::fp8_block: return amx_bf16_available();
        case Format::mxfp4:
        case Format::ds_fp4: return amx_bf16_available() && cpu_has_vbmi();  // quant_e2m1_amx.cpp's ISA
        case Format::q2_k:
        case Format::q3_k: {
            // CPUID.7.0:EDX bit 25: AMX-INT8 (the tile state itself: amx_bf16_available).
            unsigned a = 0, b = 0, c = 0, d = 0;
            static const bool int8 = __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 25) & 1u);
            return int8 && cpu_has_vbmi() && amx_bf16_available();
        }
        default: return false;
    }
#else
    (void)f;
    return false;
#endif
}

const QuantOps *quant_ops(Format f, Isa isa, const QuantChoice &choice, bool amx) {
    return quant_ops_variant(f, isa, use_vnni(choice.vnni, isa), cpu_has_vbmi(), fast_kernel(f, choice),
                             amx && isa == Isa::avx512bf16 && quant_amx_available(f));
}

}  // namespace ft::cpu
