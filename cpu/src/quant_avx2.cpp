// AVX2 + FMA (+ F16C) kernels of every quantised format, fp32 activations in the layouts of the
// scalar kernels (quant.cpp): fp8_block / mxfp4 float[K], nvfp4 / ds_fp4 float per 32 elements
// [16 even, 16 odd], q4_0 Q8_0. Weights are decoded exactly in registers and never stored:
//   e2m1   `vpermps` of an 8-entry magnitude table (it reads only the low 3 bits of each index),
//          the sign from bit 3 (code << 28, masked) xor-ed in;
//   e4m3   bits moved into fp16 (sign -> 15, exponent/mantissa -> 13..7), `vcvtph2ps`: the e4m3
//          value * 2^-8, subnormals exact; 2^8 applied per row; a 128-chunk holding a NaN code
//          (0x7F/0xFF) is summed from the reference table so the NaN reaches the output;
//   e8m0   s << 23 with code 0 -> 2^-127 and 255 -> NaN blended in;
//   q4_0   `vpmaddubsw(u, a) - vpmaddubsw(8, a)` then `vpmaddwd` by ones: exact int32 per 4
//          elements (|u a| <= 15 * 127, pairs fit int16), x fp16 d x activation d in fp32.
// The CPU has no AVX-VNNI here (Zen 4: AVX-512-VNNI only), so q4_0 has no vpdpbusd variant in
// this tier. Products are exact (e2m1 x e4m3 / e8m0 scales fit fp32), so only the fp32 summation
// order differs from the reference.
#include <immintrin.h>

#include <cstring>

#include "kernels.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu::detail {
namespace {

#include "tier_tiles.inc"

#include "tier_scalar.inc"
inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// 8 e2m1 codes (low 4 bits of each 32-bit lane; higher bits must be 0 above bit 3 or be
// masked by the caller) -> fp32.
inline __m256 e2m1x8(__m256i c, __m256 mag) {
    const __m256 m = _mm256_permutevar8x32_ps(mag, c);
    const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(c, 28), _mm256_set1_epi32(int(0x80000000u)));
    return _mm256_xor_ps(m, _mm256_castsi256_ps(sign));
}

inline __m256 e8m0x8(__m256i s) {
    __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(s, 23));
    f = _mm256_blendv_ps(f, _mm256_set1_ps(0x1p-127f), _mm256_castsi256_ps(_mm256_cmpeq_epi32(s, _mm256_setzero_si256())));
    return _mm256_blendv_ps(f, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)),
                            _mm256_castsi256_ps(_mm256_cmpeq_epi32(s, _mm256_set1_epi32(255))));
}

template <template <int> class Row, class... A>
void per_tokens(int ntok, const uint8_t *const *act, float *out, size_t ldo, A... a) {
    for_token_tiles(ntok, [&](auto tile_n, int t) {
        using NT = decltype(tile_n);
        Row<NT::value>::run(act + t, out + t * ldo, ldo, a...);
    });
}

// ---- nvfp4 / ds_fp4 -------------------------------------------------------------------------

// One row; B = 16 (nvfp4, e4m3 scale per 8 packed bytes) or 32 (ds_fp4, e8m0 per 16 bytes).
template <int B>
struct E2m1Row {
    template <int NT>
    struct Row {
        static void run(const uint8_t *const *act, float *out, size_t ldo, const uint8_t *p, const uint8_t *sc, int64_t K,
                        float row_scale, int pf) {
            const __m256 mag = _mm256_loadu_ps(g_e2m1);  // codes 0..7
            __m256 acc[NT];
            for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
            for (int64_t c = 0; c < K; c += 32) {
                if (pf) _mm_prefetch(reinterpret_cast<const char *>(p + c / 2) + pf, _MM_HINT_T0);
                const bool half = c + 32 > K;  // nvfp4 row ending in half a chunk
                const __m128i bytes = half ? _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p + c / 2))
                                           : _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + c / 2));
                float s0, s1;
                if (B == 32) s0 = s1 = g_e8m0[sc[c / 32]];
                else s0 = g_e4m3[sc[c / 16]], s1 = half ? 0.0f : g_e4m3[sc[c / 16 + 1]];
                const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(15));
                const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(15));
                const __m256 vs0 = _mm256_set1_ps(s0), vs1 = _mm256_set1_ps(s1);
                // Layout per 32: [16 even (low nibbles of bytes 0..15), 16 odd (high nibbles)].
                const __m256 w0 = _mm256_mul_ps(e2m1x8(_mm256_cvtepu8_epi32(lo), mag), vs0);
                const __m256 w1 = _mm256_mul_ps(e2m1x8(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), mag), vs1);
                const __m256 w2 = _mm256_mul_ps(e2m1x8(_mm256_cvtepu8_epi32(hi), mag), vs0);
                const __m256 w3 = _mm256_mul_ps(e2m1x8(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)), mag), vs1);
                for (int t = 0; t < NT; ++t) {
                    const float *x = reinterpret_cast<const float *>(act[t]) + c;
                    acc[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), acc[t]);
                    acc[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), acc[t]);
                    acc[t] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + 16), acc[t]);
                    acc[t] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + 24), acc[t]);
                }
            }
            for (int t = 0; t < NT; ++t) out[t * ldo] = hsum(acc[t]) * row_scale;
        }
    };
};

template <int B>
void e2m1_rows(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
               size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t K = m.K;
    for (int j = 0; j < count; ++j) {
        const int64_t r = first + j;
        const float g = B == 16 ? f16(m.global + r * 2) : 1.0f;
        per_tokens<E2m1Row<B>::template Row>(ntok, act, out + j, ldo, m.data + r * (K / 2), m.scale + r * (K / B), K, g,
                                             pf);
    }
}

// ---- fp8_block ------------------------------------------------------------------------------

inline __m256 e4m3x8(const uint8_t *p) {  // value * 2^-8
    const __m128i u = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(u, _mm_set1_epi16(0x7f)), 7),
                                   _mm_slli_epi16(_mm_and_si128(u, _mm_set1_epi16(0x80)), 8));
    return _mm256_cvtph_ps(h);
}

template <int NT>
struct Fp8Row {
    static void run(const uint8_t *const *act, float *out, size_t ldo, const uint8_t *w, const uint8_t *band, int64_t K,
                    int pf) {
        const __m256i m7f = _mm256_set1_epi8(0x7f);
        __m256 acc[NT];
        float nan_part[NT] = {};
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
        for (int64_t c = 0; c < K; c += 128) {
            const float s = bf16(band + (c / 128) * 2);
            if (pf) {
                _mm_prefetch(reinterpret_cast<const char *>(w + c) + pf, _MM_HINT_T0);
                _mm_prefetch(reinterpret_cast<const char *>(w + c + 64) + pf, _MM_HINT_T0);
            }
            int nan = 0;
            for (int q = 0; q < 128; q += 32) {
                const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(w + c + q));
                nan |= _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_and_si256(b, m7f), m7f));
            }
            if (nan) {  // the reference's NaN must reach the output; the table has it
                for (int t = 0; t < NT; ++t) {
                    const float *x = reinterpret_cast<const float *>(act[t]) + c;
                    for (int i = 0; i < 128; ++i) nan_part[t] += g_e4m3[w[c + i]] * s * x[i];
                }
                continue;
            }
            __m256 blk[NT];
            for (int t = 0; t < NT; ++t) blk[t] = _mm256_setzero_ps();
            for (int q = 0; q < 128; q += 8) {
                const __m256 f = e4m3x8(w + c + q);
                for (int t = 0; t < NT; ++t)
                    blk[t] = _mm256_fmadd_ps(f, _mm256_loadu_ps(reinterpret_cast<const float *>(act[t]) + c + q), blk[t]);
            }
            const __m256 sv = _mm256_set1_ps(s);
            for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(blk[t], sv, acc[t]);
        }
        for (int t = 0; t < NT; ++t) out[t * ldo] = hsum(acc[t]) * 256.0f + nan_part[t];
    }
};

// ---- q4_0 x Q8_0 ----------------------------------------------------------------------------

template <int NT>
struct Q4Row {
    static void run(const uint8_t *const *act, float *out, size_t ldo, const uint8_t *row, int64_t nb, int64_t qbytes,
                    int pf) {
        const __m256i eight = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
        const __m128i m15 = _mm_set1_epi8(0x0f);
        __m256 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t *blk = row + b * 18;
            if (pf && (b & 3) == 0) _mm_prefetch(reinterpret_cast<const char *>(blk) + pf, _MM_HINT_T0);
            const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2));
            const __m256i w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m15), _mm_and_si128(v, m15));
            const float dw = f16(blk);
            for (int t = 0; t < NT; ++t) {
                const int8_t *q = reinterpret_cast<const int8_t *>(act[t]);
                const float *d = reinterpret_cast<const float *>(act[t] + qbytes);
                const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + b * 32));
                const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(w, a), _mm256_maddubs_epi16(eight, a));
                const __m256i i32 = _mm256_madd_epi16(p16, ones);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_set1_ps(dw * d[b]), acc[t]);
            }
        }
        for (int t = 0; t < NT; ++t) out[t * ldo] = hsum(acc[t]);
    }
};

// ---- mxfp4: K-outer over a tile of up to 32 columns, one token --------------------------------

void mxfp4_tile(const QuantMatrix &m, int64_t first, int count, const float *x, float *out, int pf_rows) {
    const int64_t K = m.K, N = m.N;
    const __m256 mag = _mm256_loadu_ps(g_e2m1);
    const __m256i m15 = _mm256_set1_epi32(15);
    __m256 acc[4];
    for (int g = 0; g < 4; ++g) acc[g] = _mm256_setzero_ps();
    const bool full = count == 32;
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
        __m256 blk[4];
        for (int g = 0; g < 4; ++g) blk[g] = _mm256_setzero_ps();
        for (int64_t kb = k0 / 2; kb < k0 / 2 + 16; ++kb) {
            const uint8_t *row = m.data + kb * N + first;
            if (pf_rows && kb + pf_rows < K / 2) _mm_prefetch(reinterpret_cast<const char *>(row + pf_rows * N), _MM_HINT_T1);
            alignas(32) uint8_t tmp[32];
            const uint8_t *src = row;
            if (!full) {
                std::memset(tmp, 0, 32);
                std::memcpy(tmp, row, size_t(count));
                src = tmp;
            }
            const __m256 x0 = _mm256_set1_ps(x[2 * kb]), x1 = _mm256_set1_ps(x[2 * kb + 1]);
            for (int g = 0; g < 4; ++g) {
                const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(src + 8 * g)));
                blk[g] = _mm256_fmadd_ps(e2m1x8(_mm256_and_si256(v, m15), mag), x0, blk[g]);
                blk[g] = _mm256_fmadd_ps(e2m1x8(_mm256_srli_epi32(v, 4), mag), x1, blk[g]);
            }
        }
        const uint8_t *srow = m.scale + (k0 / 32) * N + first;
        alignas(32) uint8_t st[32] = {};
        std::memcpy(st, srow, size_t(count));
        for (int g = 0; g < 4; ++g) {
            const __m256 s = e8m0x8(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(st + 8 * g))));
            acc[g] = _mm256_fmadd_ps(blk[g], s, acc[g]);
        }
    }
    alignas(32) float o[32];
    for (int g = 0; g < 4; ++g) _mm256_store_ps(o + 8 * g, acc[g]);
    std::memcpy(out, o, size_t(count) * 4);
}

}  // namespace

void ds_fp4_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    e2m1_rows<32>(m, first, count, act, ntok, out, ldo);
}

void nvfp4_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                size_t ldo) {
    e2m1_rows<16>(m, first, count, act, ntok, out, ldo);
}

void fp8_block_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                    size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t K = m.K;
    for (int j = 0; j < count; ++j) {
        const int64_t r = first + j;
        per_tokens<Fp8Row>(ntok, act, out + j, ldo, m.data + r * K, m.scale + (r / 128) * (K / 128) * 2, K, pf);
    }
}

void q4_0_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
               size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t nb = m.K / 32, qbytes = (m.K + 63) / 64 * 64;
    for (int j = 0; j < count; ++j)
        per_tokens<Q4Row>(ntok, act, out + j, ldo, m.data + (first + j) * nb * 18, nb, qbytes, pf);
}

// Tiles of 32 columns, one token at a time (16 ymm registers: 4 accumulators, 4 block sums).
void mxfp4_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                size_t ldo) {
    const int pf_rows = g_prefetch_bytes / 8;
    for (int c = 0; c < count; c += 32) {
        const int n = count - c < 32 ? count - c : 32;
        for (int t = 0; t < ntok; ++t)
            mxfp4_tile(m, first + c, n, reinterpret_cast<const float *>(act[t]), out + t * ldo + c, pf_rows);
    }
}

}  // namespace ft::cpu::detail
