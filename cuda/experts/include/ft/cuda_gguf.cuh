// Device dequantisation of the GGUF block formats (q4_0, q8_0, q2_k .. q6_k, iq4_xs): eight
// consecutive weights of a row, the CUDA twins of lib/core/formats/dequant.cpp (q4_0) and
// dequant_gguf.cpp (the others). Products are rounded one by one (__fmul_rn/__fsub_rn, no fused
// multiply-add) in the reference's order, so the values equal the host reference bit for bit
// (tests/prefill: PrefillGpuDequant). Bytes are read one at a time: bank rows of these formats
// carry no alignment promise.
#pragma once

#include <cstdint>

#include "ft/cuda_numerics.cuh"
#include "ft/dequant.hpp"
#include "ft/formats.hpp"

namespace ft::cuda {

namespace gguf_detail {

__device__ __forceinline__ float half_at(const uint8_t *p) { return f16_to_f32(uint16_t(p[0] | (uint32_t(p[1]) << 8))); }

// q4_k / q5_k: 6-bit scale and min of sub-block j from the 12 packed bytes.
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t *s, int &sc, int &m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// q3_k: signed scale of sub-block i (0..15).
__device__ __forceinline__ int scale_q3_k(int i, const uint8_t *s) {
    const int lo = i < 8 ? (s[i] & 0xf) : (s[i - 8] >> 4);
    const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

// The IQ4_NL value of a 4-bit code {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53,
// 69, 89, 113}, picked from registers by byte permutes (an indexed array would live in local memory).
__device__ __forceinline__ float iq4nl(int code) {
    const unsigned lo = __byte_perm(0xbfad9881u, 0xf6eaddcfu, unsigned(code) & 7u);
    const unsigned hi = __byte_perm(0x26190d01u, 0x71594535u, unsigned(code) & 7u);
    return float(int8_t((code & 8 ? hi : lo) & 0xffu));
}

}  // namespace gguf_detail

// Bytes of one row of K weights of block format F.
template <Format F>
__host__ __device__ constexpr int64_t gguf_row_bytes(int64_t K) {
    return F == Format::q4_0     ? K / kQ4_0Block * kQ4_0BlockBytes
           : F == Format::q8_0   ? K / 32 * kQ8_0BlockBytes
           : F == Format::q2_k   ? K / kQK * kQ2_KBlockBytes
           : F == Format::q3_k   ? K / kQK * kQ3_KBlockBytes
           : F == Format::q4_k   ? K / kQK * kQ4_KBlockBytes
           : F == Format::q5_k   ? K / kQK * kQ5_KBlockBytes
           : F == Format::q6_k   ? K / kQK * kQ6_KBlockBytes
           : F == Format::iq4_xs ? K / kQK * kIQ4_XSBlockBytes
                                 : 0;
}

// The scales of the 32 weights of a row starting at k32 (a multiple of 32): the block they lie in,
// their offset in it, and the factors of their first and second 16 (the same pair where the
// format's sub-block is 32 wide). w = dl * q - ml, or dl * q where the format has no minimum.
struct GgufScales {
    const uint8_t *blk;
    int idx;
    float dl[2], ml[2];
};

template <Format F>
__device__ __forceinline__ GgufScales gguf_scales32(const uint8_t *row, int64_t k32) {
    using namespace gguf_detail;
    GgufScales s;
    if constexpr (F == Format::q4_0 || F == Format::q8_0) {
        s.blk = row + (k32 / 32) * gguf_row_bytes<F>(32);
        s.idx = 0;
        s.dl[0] = s.dl[1] = half_at(s.blk);
        s.ml[0] = s.ml[1] = 0.0f;
    } else {
        s.blk = row + (k32 / kQK) * gguf_row_bytes<F>(kQK);
        s.idx = int(k32 % kQK);
        const int half = s.idx / 128, quarter = (s.idx % 128) / 32;
        if constexpr (F == Format::q2_k) {
            for (int r = 0; r < 2; ++r) {
                const uint8_t sc = s.blk[half * 8 + quarter * 2 + r];
                s.dl[r] = __fmul_rn(half_at(s.blk + 80), float(sc & 0xf));
                s.ml[r] = __fmul_rn(half_at(s.blk + 82), float(sc >> 4));
            }
        } else if constexpr (F == Format::q3_k) {
            for (int r = 0; r < 2; ++r) s.dl[r] = __fmul_rn(half_at(s.blk + 108), float(scale_q3_k(half * 8 + quarter * 2 + r, s.blk + 96)));
            s.ml[0] = s.ml[1] = 0.0f;
        } else if constexpr (F == Format::q4_k || F == Format::q5_k) {
            int sc, mn;
            scale_min_k4(s.idx / 32, s.blk + 4, sc, mn);
            s.dl[0] = s.dl[1] = __fmul_rn(half_at(s.blk), float(sc));
            s.ml[0] = s.ml[1] = __fmul_rn(half_at(s.blk + 2), float(mn));
        } else if constexpr (F == Format::q6_k) {
            for (int r = 0; r < 2; ++r)
                s.dl[r] = __fmul_rn(half_at(s.blk + 208), float(int8_t(s.blk[192 + 8 * half + 2 * quarter + r])));
            s.ml[0] = s.ml[1] = 0.0f;
        } else if constexpr (F == Format::iq4_xs) {
            const int ib = s.idx / 32;
            const unsigned scales_h = unsigned(s.blk[2] | (uint32_t(s.blk[3]) << 8));
            const int ls = ((s.blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
            s.dl[0] = s.dl[1] = __fmul_rn(half_at(s.blk), float(ls - 32));
            s.ml[0] = s.ml[1] = 0.0f;
        }
    }
    return s;
}

// o[0..8) = weights 8i .. 8i + 7 (i in 0..3) of the 32 that `s` describes.
template <Format F>
__device__ __forceinline__ void gguf_quants8(const GgufScales &s, int i, float *o) {
    using namespace gguf_detail;
    const int l0 = 8 * i, run = i / 2;
    // Selects, not s.dl[run]: an array indexed by a run-time i would live in local memory.
    const float dl = run ? s.dl[1] : s.dl[0], ml = run ? s.ml[1] : s.ml[0];
    if constexpr (F == Format::q4_0) {
        // Element j (0..15) is the low nibble of qs[j], element j + 16 its high nibble.
        const uint8_t *q = s.blk + 2 + (l0 & 15);
        const int shift = l0 < 16 ? 0 : 4;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = __fmul_rn(float(int((q[e] >> shift) & 0xf) - 8), dl);
    } else if constexpr (F == Format::q8_0) {
        const uint8_t *q = s.blk + 2 + l0;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = __fmul_rn(float(int8_t(q[e])), dl);
    } else if constexpr (F == Format::q2_k || F == Format::q3_k) {
        // Element l0 + e of plane `quarter` in half `half`: bits 2 * quarter of byte l0 + e.
        const int half = s.idx / 128, quarter = (s.idx % 128) / 32, shift = 2 * quarter;
        if constexpr (F == Format::q2_k) {
            const uint8_t *q = s.blk + 16 + 32 * half + l0;
#pragma unroll
            for (int e = 0; e < 8; ++e) o[e] = __fsub_rn(__fmul_rn(dl, float((q[e] >> shift) & 3)), ml);
        } else {
            const uint8_t m = uint8_t(1u << (4 * half + quarter));
            const uint8_t *q = s.blk + 32 + 32 * half + l0, *hm = s.blk + l0;
#pragma unroll
            for (int e = 0; e < 8; ++e) o[e] = __fmul_rn(dl, float(((q[e] >> shift) & 3) - ((hm[e] & m) ? 0 : 4)));
        }
    } else if constexpr (F == Format::q4_k || F == Format::q5_k) {
        constexpr int qs_at = F == Format::q4_k ? 16 : 48;
        const int sub = s.idx / 32, c = sub / 2, hi = sub % 2;
        const uint8_t *q = s.blk + qs_at + 32 * c + l0;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            int v = hi ? q[e] >> 4 : q[e] & 0xf;
            if constexpr (F == Format::q5_k) v += ((s.blk[16 + l0 + e] >> sub) & 1) << 4;
            o[e] = __fsub_rn(__fmul_rn(dl, float(v)), ml);
        }
    } else if constexpr (F == Format::q6_k) {
        const int half = s.idx / 128, p = (s.idx % 128) / 32;
        const uint8_t *ql = s.blk + 64 * half + 32 * (p & 1) + l0, *qh = s.blk + 128 + 32 * half + l0;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const int lo = p < 2 ? (ql[e] & 0xf) : (ql[e] >> 4);
            o[e] = __fmul_rn(dl, float((lo | (((qh[e] >> (2 * p)) & 3) << 4)) - 32));
        }
    } else if constexpr (F == Format::iq4_xs) {
        const uint8_t *q = s.blk + 8 + 16 * (s.idx / 32) + (l0 & 15);
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = __fmul_rn(dl, iq4nl(l0 < 16 ? (q[e] & 0xf) : (q[e] >> 4)));
    }
}

// o[0..8) = weights k0 .. k0 + 7 of the row starting at `row` (k0 a multiple of 8).
template <Format F>
__device__ __forceinline__ void gguf_dequant8(const uint8_t *row, int64_t k0, float *o) {
    gguf_quants8<F>(gguf_scales32<F>(row, k0 / 32 * 32), int(k0 % 32) / 8, o);
}

}  // namespace ft::cuda
