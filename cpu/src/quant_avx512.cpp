// AVX-512F (+BW/VL, F16C) kernels of the quantised formats; the AVX-512-BF16 tier uses them too.
// Weights are decoded in registers and never stored: e2m1 nibbles through a 16-entry vpermps
// table, e4m3 bytes through fp16 (vcvtph2ps), Q4_0 with integer multiply-adds.
#include "immintrin_avx512.hpp"

#include <cstring>
#include <initializer_list>

#include "kernels.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu::detail {
namespace {

#include "tier_tiles.inc"

#include "tier_scalar.inc"

// ---- ds_fp4 / nvfp4: row-major e2m1, activations in the [16 even, 16 odd] layout -----------

// One row: `Block` = 32 (ds_fp4, one e8m0 scale per 16 packed bytes; `biased`: e8m0_biased
// factors, tier_scalar.inc) or 16 (nvfp4, two e4m3 scales per 16 packed bytes). The scaled
// weights are exact products, as in the reference.
template <int Block, int NT>
void e2m1_row(const uint8_t *p, const uint8_t *sc, int64_t K, const uint8_t *const *act, float *out, size_t ldo,
              float row_scale, bool biased, int pf) {
    const __m512 lut = _mm512_loadu_ps(g_e2m1);
    const __m512i m15 = _mm512_set1_epi32(15);
    const float *table = Block == 32 ? g_e8m0 : g_e4m3;
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < K; c += 32) {
        __m128i bytes;
        __m512 s;
        if (Block == 32) {
            bytes = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + c / 2));
            s = _mm512_set1_ps(biased ? e8m0_biased(sc[c / 32], false) : table[sc[c / 32]]);
        } else if (c + 32 <= K) {
            bytes = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + c / 2));
            s = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(table[sc[c / 16]]), _mm512_set1_ps(table[sc[c / 16 + 1]]));
        } else {  // nvfp4 row ending in half a chunk: the missing block is zeros with scale 0
            bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p + c / 2));
            s = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(table[sc[c / 16]]), _mm512_setzero_ps());
        }
        if (pf) _mm_prefetch(reinterpret_cast<const char *>(p + c / 2) + pf, _MM_HINT_T0);
        const __m512i v = _mm512_cvtepu8_epi32(bytes);
        const __m512 lo = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_and_si512(v, m15), lut), s);
        const __m512 hi = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut), s);
        for (int t = 0; t < NT; ++t) {
            const float *x = reinterpret_cast<const float *>(act[t]) + c;
            acc[t] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x), acc[t]);
            acc[t] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), acc[t]);
        }
    }
    for (int t = 0; t < NT; ++t) out[t * ldo] = _mm512_reduce_add_ps(acc[t]) * row_scale;
}

// ds_fp4 rows with the biased factors first, each row with an output that is not finite again
// with the absolute ones.
template <int Block>
void e2m1_rows(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
               size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t K = m.K;
    for (int j = 0; j < count; ++j) {
        const int64_t r = first + j;
        const uint8_t *p = m.data + r * (K / 2), *sc = m.scale + r * (K / Block);
        for (bool biased : {Block == 32, false}) {
            const float g = Block == 16 ? f16(m.global + r * 2) : biased ? kUnbias : 1.0f;
            for_token_tiles(ntok, [&](auto tile_n, int t) {
                using NT = decltype(tile_n);
                e2m1_row<Block, NT::value>(p, sc, K, act + t, out + t * ldo + j, ldo, g, biased, pf);
            });
            if (!biased || outputs_finite(out + j, ldo, 1, ntok)) break;
        }
    }
}

// ---- fp8_block: e4m3 -> fp16 bits -> fp32, block sums scaled per 128 -------------------------

// e4m3 byte -> fp16 with the same bits shifted: sign to bit 15, exponent/mantissa to bits 13..7.
// The fp16 value is the e4m3 value * 2^-8 (subnormals included); the 2^8 is applied per row.
inline __m512 e4m3x16(const uint8_t *p) {
    const __m256i u = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(u, _mm256_set1_epi16(0x7f)), 7),
                                      _mm256_slli_epi16(_mm256_and_si256(u, _mm256_set1_epi16(0x80)), 8));
    return _mm512_cvtph_ps(h);
}

template <int NT>
void fp8_row(const uint8_t *w, const uint8_t *band, int64_t K, const uint8_t *const *act, float *out, size_t ldo,
             int pf) {
    const __m512i m7f = _mm512_set1_epi8(0x7f);
    __m512 acc[NT];
    float nan_part[NT] = {};
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < K; c += 128) {
        const float s = bf16(band + (c / 128) * 2);
        if (pf) {
            _mm_prefetch(reinterpret_cast<const char *>(w + c) + pf, _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char *>(w + c + 64) + pf, _MM_HINT_T0);
        }
        const __m512i b0 = _mm512_loadu_si512(w + c), b1 = _mm512_loadu_si512(w + c + 64);
        if (_mm512_cmpeq_epi8_mask(_mm512_and_si512(b0, m7f), m7f) | _mm512_cmpeq_epi8_mask(_mm512_and_si512(b1, m7f), m7f)) {
            // A NaN code (0x7F/0xFF): the reference's NaN must reach the output; the table has it.
            for (int t = 0; t < NT; ++t) {
                const float *x = reinterpret_cast<const float *>(act[t]) + c;
                for (int i = 0; i < 128; ++i) nan_part[t] += g_e4m3[w[c + i]] * s * x[i];
            }
            continue;
        }
        __m512 blk[NT];
        for (int t = 0; t < NT; ++t) blk[t] = _mm512_setzero_ps();
        for (int q = 0; q < 128; q += 16) {
            const __m512 f = e4m3x16(w + c + q);
            for (int t = 0; t < NT; ++t)
                blk[t] = _mm512_fmadd_ps(f, _mm512_loadu_ps(reinterpret_cast<const float *>(act[t]) + c + q), blk[t]);
        }
        const __m512 sv = _mm512_set1_ps(s);
        for (int t = 0; t < NT; ++t) acc[t] = _mm512_fmadd_ps(blk[t], sv, acc[t]);
    }
    for (int t = 0; t < NT; ++t) out[t * ldo] = _mm512_reduce_add_ps(acc[t]) * 256.0f + nan_part[t];
}

// ---- q4_0 x Q8_0: two 18-byte blocks per 512-bit vector -------------------------------------

// 32 weights of one block as unsigned nibbles in element order (low nibbles, then high).
inline __m256i q4_block(const uint8_t *blk) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2));
    const __m128i m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

template <int NT>
void q4_0_row(const uint8_t *row, int64_t nb, const uint8_t *const *act, int64_t qbytes, float *out, size_t ldo,
              int pf) {
    const __m512i eight = _mm512_set1_epi8(8), ones = _mm512_set1_epi16(1);
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        const uint8_t *b0 = row + b * 18;
        const bool pair = b + 1 < nb;
        if (pf) _mm_prefetch(reinterpret_cast<const char *>(b0) + pf, _MM_HINT_T0);
        const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(q4_block(b0)),
                                             pair ? q4_block(b0 + 18) : _mm256_setzero_si256(), 1);
        const float d0 = f16(b0), d1 = pair ? f16(b0 + 18) : 0.0f;
        for (int t = 0; t < NT; ++t) {
            const int8_t *q = reinterpret_cast<const int8_t *>(act[t]);
            const float *d = reinterpret_cast<const float *>(act[t] + qbytes);
            const __m512i a = _mm512_loadu_si512(q + b * 32);
            // (q - 8) . a as q . a - 8 . a: both u8 x s8 products fit int16 without saturation.
            const __m512i p16 = _mm512_sub_epi16(_mm512_maddubs_epi16(w, a), _mm512_maddubs_epi16(eight, a));
            const __m512i i32 = _mm512_madd_epi16(p16, ones);
            const __m512 sv = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(d0 * d[b]), _mm512_set1_ps(d1 * d[b + 1]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i32), sv, acc[t]);
        }
    }
    for (int t = 0; t < NT; ++t) out[t * ldo] = _mm512_reduce_add_ps(acc[t]);
}

// ---- mxfp4: K-outer over a tile of up to 64 columns of the transposed matrix ---------------

#include "tier_avx512.inc"

template <int NT>
void mxfp4_tile(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, float *out, size_t ldo,
                int pf) {
    const int64_t K = m.K, N = m.N;
    const __m512 lut = _mm512_loadu_ps(g_e2m1);
    const __m512i m15 = _mm512_set1_epi32(15);
    const int G = (count + 15) / 16;
    __mmask16 mask[4];
    for (int g = 0; g < 4; ++g) {
        const int n = count - 16 * g;
        mask[g] = n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
    }
    __m512 acc[NT][4];
    for (int t = 0; t < NT; ++t)
        for (int g = 0; g < 4; ++g) acc[t][g] = _mm512_setzero_ps();
    const int pf_rows = pf ? 8 : 0;
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
        __m512 blk[NT][4];
        for (int t = 0; t < NT; ++t)
            for (int g = 0; g < 4; ++g) blk[t][g] = _mm512_setzero_ps();
        for (int64_t kb = k0 / 2; kb < k0 / 2 + 16; ++kb) {
            const uint8_t *row = m.data + kb * N + first;
            if (pf_rows && kb + pf_rows < K / 2) _mm_prefetch(reinterpret_cast<const char *>(row + pf_rows * N), _MM_HINT_T0);
            __m512 x0[NT], x1[NT];
            for (int t = 0; t < NT; ++t) {
                const float *x = reinterpret_cast<const float *>(act[t]);
                x0[t] = _mm512_set1_ps(x[2 * kb]);
                x1[t] = _mm512_set1_ps(x[2 * kb + 1]);
            }
            for (int g = 0; g < G; ++g) {
                const __m512i v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask[g], row + 16 * g));
                const __m512 lo = _mm512_permutexvar_ps(_mm512_and_si512(v, m15), lut);
                const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut);
                for (int t = 0; t < NT; ++t) {
                    blk[t][g] = _mm512_fmadd_ps(lo, x0[t], blk[t][g]);
                    blk[t][g] = _mm512_fmadd_ps(hi, x1[t], blk[t][g]);
                }
            }
        }
        const uint8_t *srow = m.scale + (k0 / 32) * N + first;
        for (int g = 0; g < G; ++g) {
            const __m512 s = e8m0x16(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask[g], srow + 16 * g)));
            for (int t = 0; t < NT; ++t) acc[t][g] = _mm512_fmadd_ps(blk[t][g], s, acc[t][g]);
        }
    }
    for (int t = 0; t < NT; ++t)
        for (int g = 0; g < G; ++g) _mm512_mask_storeu_ps(out + t * ldo + 16 * g, mask[g], acc[t][g]);
}

}  // namespace

void ds_fp4_avx512(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                   size_t ldo) {
    e2m1_rows<32>(m, first, count, act, ntok, out, ldo);
}

void nvfp4_avx512(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                  size_t ldo) {
    e2m1_rows<16>(m, first, count, act, ntok, out, ldo);
}

void fp8_block_avx512(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                      float *out, size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t K = m.K;
    for (int j = 0; j < count; ++j) {
        const int64_t r = first + j;
        const uint8_t *w = m.data + r * K, *band = m.scale + (r / 128) * (K / 128) * 2;
        for_token_tiles(ntok, [&](auto tile_n, int t) {
            using NT = decltype(tile_n);
            fp8_row<NT::value>(w, band, K, act + t, out + t * ldo + j, ldo, pf);
        });
    }
}

void q4_0_avx512(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t nb = m.K / 32, qbytes = (m.K + 63) / 64 * 64;
    for (int j = 0; j < count; ++j) {
        const uint8_t *row = m.data + (first + j) * nb * 18;
        for_token_tiles(ntok, [&](auto tile_n, int t) {
            using NT = decltype(tile_n);
            q4_0_row<NT::value>(row, nb, act + t, qbytes, out + t * ldo + j, ldo, pf);
        });
    }
}

// Tiles of 64 columns and two tokens: 16 accumulators plus 16 block sums stay in registers.
void mxfp4_avx512(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                  size_t ldo) {
    const int pf = g_prefetch_bytes;
    for (int c = 0; c < count; c += 64) {
        const int n = count - c < 64 ? count - c : 64;
        int t = 0;
        for (; t + 2 <= ntok; t += 2) mxfp4_tile<2>(m, first + c, n, act + t, out + t * ldo + c, ldo, pf);
        if (t < ntok) mxfp4_tile<1>(m, first + c, n, act + t, out + t * ldo + c, ldo, pf);
    }
}

}  // namespace ft::cpu::detail
