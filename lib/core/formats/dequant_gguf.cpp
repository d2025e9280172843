// Scalar reference dequantisers of the GGUF block formats beyond q4_0 (docs/formats.md, "GGUF
// block formats"). Products are formed in the order ggml's reference uses (scale times d first,
// then times the quant), so these give the same fp32 values as llama.cpp's own dequantisation.
#include <cstring>

#include "ft/common.hpp"
#include "ft/dequant.hpp"

namespace ft {

const int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

namespace {

float half_at(const uint8_t *p) { return f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8))); }

// The 6-bit scale and min of sub-block j (0..7) of q4_k / q5_k from their 12 packed bytes: sub-blocks
// 0-3 keep both in the low 6 bits of bytes j and j + 4; 4-7 put the low 4 bits in byte j + 4's
// nibbles and the high 2 bits in the top bits of bytes j - 4 (scale) and j (min).
void scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// The signed 6-bit scale of sub-block i (0..15) of q3_k: low 4 bits from the nibbles of bytes
// 0-7, high 2 bits from bytes 8-11, minus the bias 32.
int scale_q3_k(int i, const uint8_t *s) {
    const int lo = i < 8 ? (s[i] & 0xf) : (s[i - 8] >> 4);
    const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

}  // namespace

void dequant_row_q8_0(const uint8_t *blocks, int64_t K, float *out) {
    for (int64_t b = 0; b < K / 32; ++b) {
        const uint8_t *blk = blocks + b * kQ8_0BlockBytes;
        const float d = half_at(blk);
        for (int j = 0; j < 32; ++j) out[b * 32 + j] = static_cast<float>(static_cast<int8_t>(blk[2 + j])) * d;
    }
}

void dequant_row_q2_k(const uint8_t *blocks, int64_t K, float *out) {
    for (int64_t b = 0; b < K / kQK; ++b) {
        const uint8_t *blk = blocks + b * kQ2_KBlockBytes;
        const uint8_t *scales = blk, *qs = blk + 16;
        const float d = half_at(blk + 80), dmin = half_at(blk + 82);
        float *y = out + b * kQK;
        // Two halves of 128; in each, 32 bytes of qs give four 2-bit planes, each plane two runs of 16.
        for (int half = 0; half < 2; ++half) {
            const uint8_t *q = qs + 32 * half;
            for (int plane = 0; plane < 4; ++plane) {
                for (int run = 0; run < 2; ++run) {
                    const uint8_t sc = scales[half * 8 + plane * 2 + run];
                    const float dl = d * static_cast<float>(sc & 0xf), ml = dmin * static_cast<float>(sc >> 4);
                    for (int l = 0; l < 16; ++l)
                        *y++ = dl * static_cast<float>((q[16 * run + l] >> (2 * plane)) & 3) - ml;
                }
            }
        }
    }
}

void dequant_row_q3_k(const uint8_t *blocks, int64_t K, float *out) {
    for (int64_t b = 0; b < K / kQK; ++b) {
        const uint8_t *blk = blocks + b * kQ3_KBlockBytes;
        const uint8_t *hmask = blk, *qs = blk + 32, *scales = blk + 96;
        const float d = half_at(blk + 108);
        float *y = out + b * kQK;
        // As q2_k, with a third bit per element in hmask: bit (4 * half + plane) of hmask[l]; a
        // clear bit subtracts 4.
        for (int half = 0; half < 2; ++half) {
            const uint8_t *q = qs + 32 * half;
            for (int plane = 0; plane < 4; ++plane) {
                const uint8_t m = static_cast<uint8_t>(1u << (4 * half + plane));
                for (int run = 0; run < 2; ++run) {
                    const float dl = d * static_cast<float>(scale_q3_k(half * 8 + plane * 2 + run, scales));
                    for (int l = 0; l < 16; ++l) {
                        const int i = 16 * run + l;
                        const int v = ((q[i] >> (2 * plane)) & 3) - ((hmask[i] & m) ? 0 : 4);
                        *y++ = dl * static_cast<float>(v);
                    }
                }
            }
        }
    }
}

void dequant_row_q4_k(const uint8_t *blocks, int64_t K, float *out) {
    for (int64_t b = 0; b < K / kQK; ++b) {
        const uint8_t *blk = blocks + b * kQ4_KBlockBytes;
        const float d = half_at(blk), dmin = half_at(blk + 2);
        const uint8_t *scales = blk + 4, *qs = blk + 16;
        float *y = out + b * kQK;
        // Four chunks of 64: the low nibbles of 32 bytes (sub-block 2c), then their high nibbles (2c + 1).
        for (int c = 0; c < 4; ++c) {
            const uint8_t *q = qs + 32 * c;
            for (int hi = 0; hi < 2; ++hi) {
                int sc, m;
                scale_min_k4(2 * c + hi, scales, &sc, &m);
                const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
                for (int l = 0; l < 32; ++l) *y++ = dl * static_cast<float>(hi ? q[l] >> 4 : q[l] & 0xf) - ml;
            }
        }
    }
}

void dequant_row_q5_k(const uint8_t *blocks, int64_t K, float *out) {
    for (int64_t b = 0; b < K / kQK; ++b) {
        const uint8_t *blk = blocks + b * kQ5_KBlockBytes;
        const float d = half_at(blk), dmin = half_at(blk + 2);
        const uint8_t *scales = blk + 4, *qh = blk + 16, *qs = blk + 48;
        float *y = out + b * kQK;
        // As q4_k; the fifth bit of sub-block s (0..7) is bit s of qh[l].
        for (int c = 0; c < 4; ++c) {
            const uint8_t *q = qs + 32 * c;
            for (int hi = 0; hi < 2; ++hi) {
                const int s = 2 * c + hi;
                int sc, m;
                scale_min_k4(s, scales, &sc, &m);
                const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
                for (int l = 0; l < 32; ++l) {
                    const int v = (hi ? q[l] >> 4 : q[l] & 0xf) + (((qh[l] >> s) & 1) << 4);
                    *y++ = dl * static_cast<float>(v) - ml;
                }
            }
        }
    }
}

void dequant_row_q6_k(const uint8_t *blocks, int64_t K, float *out) {
    for (int64_t b = 0; b < K / kQK; ++b) {
        const uint8_t *blk = blocks + b * kQ6_KBlockBytes;
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t *sc = reinterpret_cast<const int8_t *>(blk + 192);
        const float d = half_at(blk + 208);
        float *y = out + b * kQK;
        // Two halves of 128 (64 bytes of ql, 32 of qh, 8 scales each). Element 32 * p + l of a half
        // (p = 0..3, l = 0..31): low 4 bits from ql[l + 32 * (p & 1)] (low nibble for p < 2),
        // high 2 bits from bits 2p..2p+1 of qh[l]; scale sc[2p + l / 16]; value q - 32.
        for (int half = 0; half < 2; ++half) {
            const uint8_t *l4 = ql + 64 * half, *h2 = qh + 32 * half;
            const int8_t *s = sc + 8 * half;
            for (int p = 0; p < 4; ++p) {
                for (int l = 0; l < 32; ++l) {
                    const uint8_t lb = l4[l + 32 * (p & 1)];
                    const int lo = p < 2 ? (lb & 0xf) : (lb >> 4);
                    const int v = (lo | (((h2[l] >> (2 * p)) & 3) << 4)) - 32;
                    y[128 * half + 32 * p + l] = d * static_cast<float>(s[2 * p + l / 16]) * static_cast<float>(v);
                }
            }
        }
    }
}

void dequant_row_iq4_xs(const uint8_t *blocks, int64_t K, float *out) {
    for (int64_t b = 0; b < K / kQK; ++b) {
        const uint8_t *blk = blocks + b * kIQ4_XSBlockBytes;
        const float d = half_at(blk);
        const unsigned scales_h = static_cast<unsigned>(blk[2] | (blk[3] << 8));
        const uint8_t *scales_l = blk + 4, *qs = blk + 8;
        float *y = out + b * kQK;
        for (int ib = 0; ib < 8; ++ib) {
            const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
            const float dl = d * static_cast<float>(ls - 32);
            const uint8_t *q = qs + 16 * ib;
            for (int j = 0; j < 16; ++j) {
                y[32 * ib + j] = dl * static_cast<float>(kIq4nlValues[q[j] & 0xf]);
                y[32 * ib + j + 16] = dl * static_cast<float>(kIq4nlValues[q[j] >> 4]);
            }
        }
    }
}

}  // namespace ft
