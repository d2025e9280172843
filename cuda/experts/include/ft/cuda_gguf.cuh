// Device dequantisation of the GGUF block formats beyond q4_0 (q8_0, q2_k .. q6_k, iq4_xs): eight
// consecutive weights of a row, the CUDA twins of lib/core/formats/dequant_gguf.cpp. Products are
// rounded one by one (__fmul_rn/__fsub_rn, no fused multiply-add) in the reference's order, so
// the values equal the host reference bit for bit (tests/experts/test_gguf_gpu.cu). Bytes are
// read one at a time: bank rows of these formats carry no alignment promise.
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

__device__ __forceinline__ float iq4nl(int code) {
    constexpr int8_t v[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    return float(v[code]);
}

}  // namespace gguf_detail

// Bytes of one row of K weights of block format F.
template <Format F>
__host__ __device__ constexpr int64_t gguf_row_bytes(int64_t K) {
    return F == Format::q8_0     ? K / 32 * kQ8_0BlockBytes
           : F == Format::q2_k   ? K / kQK * kQ2_KBlockBytes
           : F == Format::q3_k   ? K / kQK * kQ3_KBlockBytes
           : F == Format::q4_k   ? K / kQK * kQ4_KBlockBytes
           : F == Format::q5_k   ? K / kQK * kQ5_KBlockBytes
           : F == Format::q6_k   ? K / kQK * kQ6_KBlockBytes
           : F == Format::iq4_xs ? K / kQK * kIQ4_XSBlockBytes
                                 : 0;
}

// o[0..8) = weights k0 .. k0 + 7 of the row starting at `row` (k0 a multiple of 8).
template <Format F>
__device__ __forceinline__ void gguf_dequant8(const uint8_t *row, int64_t k0, float *o) {
    using namespace gguf_detail;
    if constexpr (F == Format::q8_0) {
        const uint8_t *blk = row + (k0 / 32) * kQ8_0BlockBytes;
        const float d = half_at(blk);
        const int jj = int(k0 % 32);
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = __fmul_rn(float(int8_t(blk[2 + jj + e])), d);
    } else if constexpr (F == Format::q2_k || F == Format::q3_k) {
        constexpr int bytes = F == Format::q2_k ? kQ2_KBlockBytes : kQ3_KBlockBytes;
        const uint8_t *blk = row + (k0 / kQK) * bytes;
        const int idx = int(k0 % kQK), half = idx / 128, plane = (idx % 128) / 32, run = (idx % 32) / 16, l0 = idx % 16;
        const int shift = 2 * plane, i0 = 16 * run + l0;
        if constexpr (F == Format::q2_k) {
            const uint8_t sc = blk[half * 8 + plane * 2 + run];
            const float dl = __fmul_rn(half_at(blk + 80), float(sc & 0xf)), ml = __fmul_rn(half_at(blk + 82), float(sc >> 4));
            const uint8_t *q = blk + 16 + 32 * half + i0;
#pragma unroll
            for (int e = 0; e < 8; ++e) o[e] = __fsub_rn(__fmul_rn(dl, float((q[e] >> shift) & 3)), ml);
        } else {
            const float dl = __fmul_rn(half_at(blk + 108), float(scale_q3_k(half * 8 + plane * 2 + run, blk + 96)));
            const uint8_t m = uint8_t(1u << (4 * half + plane));
            const uint8_t *q = blk + 32 + 32 * half + i0;
            const uint8_t *hm = blk + i0;
#pragma unroll
            for (int e = 0; e < 8; ++e) o[e] = __fmul_rn(dl, float(((q[e] >> shift) & 3) - ((hm[e] & m) ? 0 : 4)));
        }
    } else if constexpr (F == Format::q4_k || F == Format::q5_k) {
        constexpr int bytes = F == Format::q4_k ? kQ4_KBlockBytes : kQ5_KBlockBytes;
        constexpr int qs_at = F == Format::q4_k ? 16 : 48;
        const uint8_t *blk = row + (k0 / kQK) * bytes;
        const int idx = int(k0 % kQK), c = idx / 64, hi = (idx % 64) / 32, l0 = idx % 32, s = 2 * c + hi;
        int sc, mn;
        scale_min_k4(s, blk + 4, sc, mn);
        const float dl = __fmul_rn(half_at(blk), float(sc)), ml = __fmul_rn(half_at(blk + 2), float(mn));
        const uint8_t *q = blk + qs_at + 32 * c + l0;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            int v = hi ? q[e] >> 4 : q[e] & 0xf;
            if constexpr (F == Format::q5_k) v += ((blk[16 + l0 + e] >> s) & 1) << 4;
            o[e] = __fsub_rn(__fmul_rn(dl, float(v)), ml);
        }
    } else if constexpr (F == Format::q6_k) {
        const uint8_t *blk = row + (k0 / kQK) * kQ6_KBlockBytes;
        const int idx = int(k0 % kQK), half = idx / 128, p = (idx % 128) / 32, l0 = idx % 32;
        const float ds = __fmul_rn(half_at(blk + 208), float(int8_t(blk[192 + 8 * half + 2 * p + l0 / 16])));
        const uint8_t *ql = blk + 64 * half + 32 * (p & 1) + l0, *qh = blk + 128 + 32 * half + l0;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const int lo = p < 2 ? (ql[e] & 0xf) : (ql[e] >> 4);
            o[e] = __fmul_rn(ds, float((lo | (((qh[e] >> (2 * p)) & 3) << 4)) - 32));
        }
    } else if constexpr (F == Format::iq4_xs) {
        const uint8_t *blk = row + (k0 / kQK) * kIQ4_XSBlockBytes;
        const int idx = int(k0 % kQK), ib = idx / 32, j = idx % 32;
        const unsigned scales_h = unsigned(blk[2] | (uint32_t(blk[3]) << 8));
        const int ls = ((blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
        const float dl = __fmul_rn(half_at(blk), float(ls - 32));
        const uint8_t *q = blk + 8 + 16 * ib + (j & 15);
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = __fmul_rn(dl, iq4nl(j < 16 ? (q[e] & 0xf) : (q[e] >> 4)));
    }
}

}  // namespace ft::cuda
