// AVX-512-BF16 kernels of fp8_block, nvfp4, ds_fp4 and mxfp4 (W8A16 / W4A16 with bf16
// activations). Weights are decoded in registers straight to bf16, which holds every e2m1 and
// every e4m3 value exactly (e4m3 subnormals are bf16 normals), and multiplied with `vdpbf16ps`
// (32 bf16 pairs -> 16 fp32 lanes); block scales are applied in fp32 to block sums, one FMA per
// 16 lanes. Activations are bf16 in the pass inputs already (x, and the bf16 intermediate), so
// every product is exact and only the fp32 summation order differs from the reference.
//
// Decodes (tables filled from the lib/core/formats reference decoders in quant.cpp):
//   e2m1   `vpermw` with a 32-entry table (the 16 codes twice) reads only the low 5 bits of each
//          word, so a nibble needs no mask: nvfp4/ds_fp4 permute the 64-byte chunk shifted by
//          0/4/8/12 bits (see e2m1_rows_x), mxfp4 the words b | b << 12 of zero-extended bytes.
//   e4m3   e4m3x32_bf16 (e4m3_avx512.inc): NaN codes become bf16 NaN, so NaN reaches the output
//          as the reference says.
#include "immintrin_avx512.hpp"

#include <cstring>

#include "kernels.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu::detail {
namespace {

#include "tier_tiles.inc"

#include "tier_scalar.inc"

inline __m512 dp(__m512 acc, __m512i a, __m512i b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }

#include "tier_avx512.inc"

#include "e4m3_avx512.inc"

// ---- nvfp4 / ds_fp4: row-major e2m1, activations bf16 in 4 phases per 128 ---------------
//
// Chunk of 128 elements = 64 packed bytes v, loaded once. Word m of v holds bytes 2m, 2m + 1,
// i.e. elements 4m .. 4m + 3 as nibbles; `vpermw` reads the low 5 bits of each word (the table
// repeats the 16 codes, so bit 4 does not matter), so v, v >> 4, v >> 8 and v >> 12 (16-bit
// shifts) give the bf16 weights of elements 4m, 4m + 1, 4m + 2, 4m + 3: one shift and one
// permute per 32 weights, nothing else.
// The activation is stored in the same 4 phases (phase r, word m = x[4m + r]). Lane j of the
// 4 `vdpbf16ps` summed is elements 8j .. 8j + 7, inside block 8j / B: 2 lanes per nvfp4 block of
// 16, 4 per ds_fp4 block of 32. Scales of 256 (nvfp4) / 512 (ds_fp4) elements are decoded at
// once (16 lanes) and spread to the lanes of each chunk with `vpermps`.
//
// Two rows at once (R = 2) or one (R = 1, the odd row left): the same decode per row, but each
// activation vector is loaded once for both rows, and the two rows are two independent memory
// streams (the caller pairs row j with row j + count / 2, 41 KB apart in a 32-row nvfp4 item), so
// a core keeps more misses in flight, as the read probe does with several streams. One
// accumulator per row and token, so a row's sum is the same whichever R computed it (results do
// not depend on how rows were paired, i.e. stay bitwise independent of the pool size).
//
// RowExp (ds_fp4 only, see "-rowexp" below): the e8m0 codes decoded as 2^(code - 95), i.e. 2^32
// times their value; row_scale = 2^-32 restores the magnitude once per row.
template <int B, int R, int NT, bool RowExp = false>
void e2m1_rows_x(const uint8_t *const *p, const uint8_t *const *sc, int64_t K, const uint8_t *const *act, float *out,
                 size_t ldo, const int *col, const float *row_scale, int pf) {
    const __m512i lut = _mm512_loadu_si512(g_e2m1_bf16x32);
    const __m512 sub = _mm512_loadu_ps(g_e4m3);
    constexpr int per_chunk = 128 / B;
    constexpr int chunks = 16 / per_chunk;
    const __m512i idx0 = B == 16 ? _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0)
                                 : _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc[NT][R];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; ++t)
        #pragma GCC unroll 4
        for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
    __mmask16 big[R] = {};
    for (int64_t c0 = 0; c0 < K; c0 += 128 * chunks) {
        const int64_t left = K - c0;
        const int ns = int(left >= 16 * B ? 16 : left / B);
        __m512 s16[R];
        #pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const __m128i sb = _mm_maskz_loadu_epi8(__mmask16((1u << ns) - 1), sc[r] + c0 / B);
            if constexpr (RowExp) {  // 2^(code - 95): normal for codes 0 .. 190; larger ones noted
                s16[r] = _mm512_castsi512_ps(
                    _mm512_add_epi32(_mm512_slli_epi32(_mm512_cvtepu8_epi32(sb), 23), _mm512_set1_epi32(32 << 23)));
                big[r] |= _mm_cmpgt_epu8_mask(sb, _mm_set1_epi8(char(190)));
            } else
                s16[r] = B == 16 ? e4m3x16(_mm512_cvtepi8_epi32(sb), sub) : e8m0x16(_mm512_cvtepu8_epi32(sb));
        }
        #pragma GCC unroll 4
        for (int q = 0; q < chunks; ++q) {
            const int64_t c = c0 + 128 * q;
            if (c >= K) break;
            const __m512i sidx = _mm512_add_epi32(idx0, _mm512_set1_epi32(q * per_chunk));
            __m512i w[R][4];
            __m512 s[R];
            #pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
                if (pf) _mm_prefetch(reinterpret_cast<const char *>(p[r] + c / 2) + pf, _MM_HINT_T0);
                __m512i v;
                if (c + 128 <= K) v = _mm512_loadu_si512(p[r] + c / 2);
                else v = _mm512_maskz_loadu_epi8((__mmask64(1) << ((K - c) / 2)) - 1, p[r] + c / 2);
                w[r][0] = _mm512_permutexvar_epi16(v, lut);
                w[r][1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), lut);
                w[r][2] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 8), lut);
                w[r][3] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 12), lut);
                s[r] = _mm512_permutexvar_ps(sidx, s16[r]);
            }
            #pragma GCC unroll 4
            for (int t = 0; t < NT; ++t) {
                const uint16_t *x = reinterpret_cast<const uint16_t *>(act[t]) + c;
                const __m512i x0 = _mm512_loadu_si512(x), x1 = _mm512_loadu_si512(x + 32);
                const __m512i x2 = _mm512_loadu_si512(x + 64), x3 = _mm512_loadu_si512(x + 96);
                #pragma GCC unroll 4
                for (int r = 0; r < R; ++r) {
                    // Up to 2 tokens: one chain of 4 dp (saves the add; 22.7 -> 23.6 GB/s hot, 1
                    // token); 3-4 tokens: two chains (one chain was latency-bound: 8.3 -> 7.1).
                    if constexpr (NT <= 2) {
                        const __m512 d =
                            dp(dp(dp(dp(_mm512_setzero_ps(), w[r][0], x0), w[r][1], x1), w[r][2], x2), w[r][3], x3);
                        acc[t][r] = _mm512_fmadd_ps(d, s[r], acc[t][r]);
                    } else {
                        __m512 d = dp(_mm512_setzero_ps(), w[r][0], x0);
                        __m512 e = dp(_mm512_setzero_ps(), w[r][1], x1);
                        d = dp(d, w[r][2], x2);
                        e = dp(e, w[r][3], x3);
                        acc[t][r] = _mm512_fmadd_ps(_mm512_add_ps(d, e), s[r], acc[t][r]);
                    }
                }
            }
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < NT; ++t)
        #pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const float v = _mm512_reduce_add_ps(acc[t][r]) * row_scale[r];
            // RowExp: a code above 190 makes the row NaN here, which the caller redoes.
            out[t * ldo + col[r]] = RowExp && big[r] ? __builtin_nanf("") : v;
        }
}

// ds_fp4 row exponent (the "-rowexp" kernels). A block scaled by 2^(code - 127) with a small code
// is an fp32 subnormal (code 0 is 2^-127 itself) or makes subnormal products, and Intel cores
// take a microcode assist (~150 cycles) for such an FMA or multiply (Zen 4 does not). When the
// row's codes have smax <= 254 and smax - smin <= 126, every 2^(code - smax) is a normal float in
// [2^-126, 1]: the kernel decodes code + 127 - smax (the returned bias) and the row sum is
// multiplied by 2^(smax - 127) once (*row_scale). Both are exact power-of-two scalings, so the sum
// equals the absolute-scale one wherever that stays normal. Otherwise (an e8m0 NaN code 255, or
// codes more than 126 apart: no real checkpoint) bias 0 and factor 1, the absolute values.
inline int ds_row_bias(const uint8_t *sc, int64_t n, float *row_scale) {
    __m512i mx = _mm512_setzero_si512(), mn = _mm512_set1_epi8(-1);
    for (int64_t i = 0; i < n; i += 64) {
        const __mmask64 k = n - i >= 64 ? ~__mmask64(0) : (__mmask64(1) << (n - i)) - 1;
        const __m512i v = _mm512_maskz_loadu_epi8(k, sc + i);
        mx = _mm512_max_epu8(mx, v);
        mn = _mm512_mask_min_epu8(mn, k, mn, v);
    }
    const __m256i mx2 = _mm256_max_epu8(_mm512_castsi512_si256(mx), _mm512_extracti64x4_epi64(mx, 1));
    const __m256i mn2 = _mm256_min_epu8(_mm512_castsi512_si256(mn), _mm512_extracti64x4_epi64(mn, 1));
    __m128i a = _mm_max_epu8(_mm256_castsi256_si128(mx2), _mm256_extracti128_si256(mx2, 1));
    __m128i b = _mm_min_epu8(_mm256_castsi256_si128(mn2), _mm256_extracti128_si256(mn2, 1));
    a = _mm_max_epu8(a, _mm_srli_si128(a, 8));
    b = _mm_min_epu8(b, _mm_srli_si128(b, 8));
    // 8 bytes each left; phminposuw finds the smallest of 8 words (of 255 - x for the maximum).
    const __m128i na = _mm_cvtepu8_epi16(_mm_xor_si128(a, _mm_set1_epi8(-1)));
    const int smax = 255 - (_mm_cvtsi128_si32(_mm_minpos_epu16(na)) & 0xffff);
    const int smin = _mm_cvtsi128_si32(_mm_minpos_epu16(_mm_cvtepu8_epi16(b))) & 0xffff;
    if (smax > 254 || smax - smin > 126) {
        *row_scale = 1.0f;
        return 0;
    }
    *row_scale = g_e8m0[smax];
    return 127 - smax;
}

// Row r of the matrix -> bf16 weights x block scale in the 4-phase order of the activation
// (element 4m + r of each 128 at word 32r + m), zero-padded to a multiple of 128; the nvfp4
// global is returned separately (it does not fit bf16 exactly with the rest). e2m1 x e4m3 has at
// most 6 significant bits and e2m1 x e8m0 is a power-of-two scaling, so the products are exact
// in bf16 (`vcvtne2ps2bf16` of exact values), NaN scales give NaN weights.
template <int B>
void e2m1_dequant_row(const uint8_t *p, const uint8_t *sc, int64_t K, uint16_t *dst, int sbias = 0) {
    const __m512i lut = _mm512_loadu_si512(g_e2m1_bf16x32);
    const __m512 sub = _mm512_loadu_ps(g_e4m3);
    const __m512i hi16 = _mm512_set1_epi32(int(0xffff0000u));
    constexpr int per_chunk = 128 / B;
    constexpr int chunks = 16 / per_chunk;
    // Dword lane j of a phase vector holds elements 8j + r and 8j + 4 + r: block 8j / B.
    const __m512i idx0 = B == 16 ? _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0)
                                 : _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    for (int64_t c0 = 0; c0 < K; c0 += 128 * chunks) {
        const int64_t left = K - c0;
        const int ns = int(left >= 16 * B ? 16 : left / B);
        const __m128i sb = _mm_maskz_loadu_epi8(__mmask16((1u << ns) - 1), sc + c0 / B);
        const __m512 s16 = B == 16 ? e4m3x16(_mm512_cvtepi8_epi32(sb), sub)
                                   : e8m0x16(_mm512_add_epi32(_mm512_cvtepu8_epi32(sb), _mm512_set1_epi32(sbias)));
        for (int q = 0; q < chunks; ++q) {
            const int64_t c = c0 + 128 * q;
            if (c >= K) break;
            __m512i v;  // bytes past the row are loaded as 0: weight 0 in the padding
            if (c + 128 <= K) v = _mm512_loadu_si512(p + c / 2);
            else v = _mm512_maskz_loadu_epi8((__mmask64(1) << ((K - c) / 2)) - 1, p + c / 2);
            const __m512 s = _mm512_permutexvar_ps(_mm512_add_epi32(idx0, _mm512_set1_epi32(q * per_chunk)), s16);
            for (int r = 0; r < 4; ++r) {
                const __m512i w = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4 * r), lut);
                // Even and odd words as fp32, times the lane's scale, back to bf16 by truncation
                // (the products are exact in bf16).
                const __m512 ev = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), s);
                const __m512 od = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(w, hi16)), s);
                const __m512i o = _mm512_ternarylogic_epi32(_mm512_srli_epi32(_mm512_castps_si512(ev), 16),
                                                            _mm512_castps_si512(od), hi16, 0xf8);  // a | (b & c)
                _mm512_storeu_si512(dst + c + 32 * r, o);
            }
        }
    }
}

// RowExp (ds_fp4): the row exponent of ds_row_bias, so small codes give normal bf16 weights
// (`vdpbf16ps` reads bf16 subnormals as zero) and no subnormal multiplies.
template <int B, bool RowExp = false>
void e2m1_dequant(const QuantMatrix &m, int64_t first, int count, uint16_t *dst, size_t ld, float *row_scale) {
    const int64_t K = m.K;
    for (int j = 0; j < count; ++j) {
        const int64_t r = first + j;
        int bias = 0;
        row_scale[j] = B == 16 ? f16(m.global + r * 2) : 1.0f;
        if constexpr (RowExp) bias = ds_row_bias(m.scale + r * (K / B), K / B, &row_scale[j]);
        e2m1_dequant_row<B>(m.data + r * (K / 2), m.scale + r * (K / B), K, dst + j * ld, bias);
    }
}

// The direct ds_fp4 kernel's cheaper form of the same ("-rowexp", RowExp in e2m1_rows_x): codes
// + 32, i.e. block factors 2^(code - 95), all normal for codes 0 .. 190, and each row sum times
// 2^-32 (no pass over the codes first: reading a call's scale rows up front stalled on DRAM,
// -10 % on the layer). A row with a code above 190 (none in real checkpoints; 255 = NaN among
// them) is flagged NaN by the kernel, and a row whose scaled sum overflowed (|real sum| > 2^96) is
// non-finite too: e2m1_rows redoes those rows with the absolute scales 2^(code - 127).

template <int B, bool RowExp = false>
void e2m1_rows(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
               size_t ldo) {
    static_assert(!RowExp || B == 32, "row exponent: ds_fp4 only");
    const int pf = g_prefetch_bytes;
    const int64_t K = m.K;
    // Row j with row j + half (two streams), then the odd row alone.
    for_row_pairs(count, [&](const int R, const int *cols) {
        const uint8_t *pp[2], *sp[2];
        float g[2];
        for (int r = 0; r < R; ++r) {
            const int64_t row = first + cols[r];
            pp[r] = m.data + row * (K / 2);
            sp[r] = m.scale + row * (K / B);
            g[r] = B == 16 ? f16(m.global + row * 2) : RowExp ? kUnbias : 1.0f;
        }
        for_token_tiles(ntok, [&](auto tile_n, int t) {
            using NT = decltype(tile_n);
            if (R == 2) e2m1_rows_x<B, 2, NT::value, RowExp>(pp, sp, K, act + t, out + t * ldo, ldo, cols, g, pf);
            else e2m1_rows_x<B, 1, NT::value, RowExp>(pp, sp, K, act + t, out + t * ldo, ldo, cols, g, pf);
        });
    });
    if constexpr (RowExp) {
        // Rows flagged (a code above 190) or overflowed: again with the absolute scales.
        for (int j = 0; j < count; ++j) {
            if (outputs_finite(out + j, ldo, 1, ntok)) continue;
            const int64_t row = first + j;
            const uint8_t *p1[1] = {m.data + row * (K / 2)}, *s1[1] = {m.scale + row * (K / B)};
            const int c1[1] = {j};
            const float g1[1] = {1.0f};
            for_token_tiles(ntok, [&](auto tile_n, int t) {
                using NT = decltype(tile_n);
                e2m1_rows_x<B, 1, NT::value, false>(p1, s1, K, act + t, out + t * ldo, ldo, c1, g1, pf);
            });
        }
    }
}

// ---- fp8_block: e4m3 -> bf16 in registers, block sums * bf16 scale_inv per 128 -------------

// Two rows (R = 2) or one at a time, as e2m1_rows_x: activations loaded once for both rows, two
// memory streams, one accumulator per row and token (same sums whichever R).
template <int R, int NT>
void fp8_rows_x(const uint8_t *const *w, const uint8_t *const *band, int64_t K, const uint8_t *const *act, float *out,
                size_t ldo, const int *col, int pf) {
    const __m512i sub_lut = _mm512_loadu_si512(g_e4m3_sub_bf16x32);
    __m512 acc[NT][R];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; ++t)
        #pragma GCC unroll 4
        for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < K; c += 128) {
        __m512i wv[R][4];
        __m512 s[R];
        #pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            if (pf) {
                _mm_prefetch(reinterpret_cast<const char *>(w[r] + c) + pf, _MM_HINT_T0);
                _mm_prefetch(reinterpret_cast<const char *>(w[r] + c + 64) + pf, _MM_HINT_T0);
            }
#pragma GCC unroll 4
            for (int q = 0; q < 4; ++q)
                wv[r][q] = e4m3x32_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(w[r] + c + 32 * q)), sub_lut);
            s[r] = _mm512_set1_ps(bf16(band[r] + (c / 128) * 2));
        }
        #pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
            const uint16_t *x = reinterpret_cast<const uint16_t *>(act[t]) + c;
            const __m512i x0 = _mm512_loadu_si512(x), x1 = _mm512_loadu_si512(x + 32);
            const __m512i x2 = _mm512_loadu_si512(x + 64), x3 = _mm512_loadu_si512(x + 96);
            #pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
                __m512 d0 = dp(_mm512_setzero_ps(), wv[r][0], x0);
                __m512 d1 = dp(_mm512_setzero_ps(), wv[r][1], x1);
                d0 = dp(d0, wv[r][2], x2);
                d1 = dp(d1, wv[r][3], x3);
                acc[t][r] = _mm512_fmadd_ps(_mm512_add_ps(d0, d1), s[r], acc[t][r]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < NT; ++t)
        #pragma GCC unroll 4
        for (int r = 0; r < R; ++r) out[t * ldo + col[r]] = _mm512_reduce_add_ps(acc[t][r]);
}

// ---- mxfp4: K-outer over a tile of up to 64 columns, bf16 pairs (k even, k odd) -----------
//
// Byte (kb, n) holds W[n, 2kb] (low nibble) and W[n, 2kb+1] (high): as the two words of one
// 32-bit lane they pair with the broadcast activation pair (x[2kb], x[2kb+1]), so one dp per 16
// columns consumes a whole K row. Lane word 0 = b | b << 12 (low 5 bits = b & 31: the table
// repeats the 16 codes), word 1 = b >> 4.
template <int NT>
void mxfp4_tile(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, float *out, size_t ldo,
                int pf_rows) {
    const int64_t K = m.K, N = m.N;
    const __m512i lut = _mm512_loadu_si512(g_e2m1_bf16x32);
    const int G = (count + 15) / 16;
    __mmask16 mask[4];
    for (int g = 0; g < 4; ++g) {
        const int n = count - 16 * g;
        mask[g] = n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
    }
    __m512 acc[NT][4];
    for (int t = 0; t < NT; ++t)
        for (int g = 0; g < 4; ++g) acc[t][g] = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
        __m512 blk[NT][4];
        for (int t = 0; t < NT; ++t)
            for (int g = 0; g < 4; ++g) blk[t][g] = _mm512_setzero_ps();
        for (int64_t kb = k0 / 2; kb < k0 / 2 + 16; ++kb) {
            const uint8_t *row = m.data + kb * N + first;
            if (pf_rows && kb + pf_rows < K / 2) {
                const char *pr = reinterpret_cast<const char *>(row + pf_rows * N);
                _mm_prefetch(pr, _MM_HINT_T0);
                _mm_prefetch(pr + count - 1, _MM_HINT_T0);  // a tile not 64-aligned spans 2 lines
            }
            __m512i xp[NT];
            for (int t = 0; t < NT; ++t) {
                uint32_t pair;
                std::memcpy(&pair, act[t] + 4 * kb, 4);
                xp[t] = _mm512_set1_epi32(int(pair));
            }
            for (int g = 0; g < G; ++g) {
                const __m512i v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask[g], row + 16 * g));
                const __m512i wv = _mm512_permutexvar_epi16(_mm512_or_si512(v, _mm512_slli_epi32(v, 12)), lut);
                for (int t = 0; t < NT; ++t) blk[t][g] = dp(blk[t][g], wv, xp[t]);
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

void ds_fp4_avx512bf16_rowexp(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                              float *out, size_t ldo) {
    e2m1_rows<32, true>(m, first, count, act, ntok, out, ldo);
}

void ds_fp4_dequant_avx512bf16_rowexp(const QuantMatrix &m, int64_t first, int count, uint16_t *dst, size_t ld,
                                      float *row_scale) {
    e2m1_dequant<32, true>(m, first, count, dst, ld, row_scale);
}

// The ds_fp4 activation of the AVX-512-BF16 kernels, 16 lanes at a time, bit for bit
// prepare_ds_fp4_bf16_scalar (tested): per group of 128 amax (on the bits: finite values order as
// integers), the scalar power-of-two s from it exactly as the definition, c = x * 2^-e (= x / s:
// both are the exact quotient rounded once; 2^-e is a normal float for every finite bf16 amax),
// clamp, e4m3 rounding (RNE to 3 mantissa bits by integer carry for |c| >= 2^-6, to multiples
// of 2^-9 below), y = q * s, which has at most 4 significant bits, so bf16(y) is exact; then the
// 4-phase order by word permutes. A group holding Inf or NaN goes through the scalar definition.
void prepare_ds_fp4_bf16_avx512(const uint16_t *x, int64_t K, uint8_t *dst) {
    uint16_t *y = reinterpret_cast<uint16_t *>(dst);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
    // Word m (m < 16) of phase r: element 4m + r of the 64 words of two vectors.
    __m512i idx[4];
    for (int r = 0; r < 4; ++r) {
        alignas(64) uint16_t w[32];
        for (int m = 0; m < 32; ++m) w[m] = uint16_t((4 * m + r) & 63);
        idx[r] = _mm512_load_si512(w);
    }
    for (int64_t c = 0; c < K; c += 128) {  // K is a multiple of 128 for ds_fp4
        __m512 v[8];
        __m512i am = _mm512_setzero_si512();
        #pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
            const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + c + 16 * i));
            const __m512i b = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
            v[i] = _mm512_castsi512_ps(b);
            am = _mm512_max_epu32(am, _mm512_and_si512(b, abs_mask));
        }
        const uint32_t am_bits = _mm512_reduce_max_epu32(am);
        if (am_bits >= 0x7f800000u) {
            prepare_ds_fp4_bf16_scalar(x + c, 128, dst + 2 * c);
            continue;
        }
        float amax;
        std::memcpy(&amax, &am_bits, 4);
        amax = amax > 1e-4f ? amax : 1e-4f;
        const float r = amax / 448.0f;
        uint32_t rb;
        std::memcpy(&rb, &r, 4);
        const int e = int((rb >> 23) & 0xffu) - 127 + ((rb & 0x7fffffu) != 0 ? 1 : 0);
        const __m512 s = _mm512_castsi512_ps(_mm512_set1_epi32((e + 127) << 23));
        const __m512 inv = _mm512_castsi512_ps(_mm512_set1_epi32((127 - e) << 23));
        __m512i t[4];
        #pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
            const __m512 cv = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v[i], inv), _mm512_set1_ps(-448.0f)),
                                            _mm512_set1_ps(448.0f));
            const __mmask16 small = _mm512_cmp_ps_mask(_mm512_abs_ps(cv), _mm512_set1_ps(0.015625f), _CMP_LT_OQ);
            const __m512 qs = _mm512_mul_ps(_mm512_roundscale_ps(_mm512_mul_ps(cv, _mm512_set1_ps(512.0f)),
                                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                            _mm512_set1_ps(1.0f / 512.0f));
            __m512i b = _mm512_castps_si512(cv);
            b = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff),
                                                     _mm512_and_si512(_mm512_srli_epi32(b, 20), _mm512_set1_epi32(1))));
            b = _mm512_and_si512(b, _mm512_set1_epi32(int(~0xfffffu)));
            const __m512 q = _mm512_mask_mov_ps(_mm512_castsi512_ps(b), small, qs);
            v[i] = _mm512_mul_ps(q, s);
        }
        #pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) t[j] = (__m512i)_mm512_cvtne2ps_pbh(v[2 * j + 1], v[2 * j]);
        #pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
            const __m512i lo = _mm512_permutex2var_epi16(t[0], idx[r], t[1]);
            const __m512i hi = _mm512_permutex2var_epi16(t[2], idx[r], t[3]);
            _mm512_storeu_si512(y + c + 32 * r, _mm512_inserti64x4(lo, _mm512_castsi512_si256(hi), 1));
        }
    }
}

void nvfp4_avx512bf16(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                      float *out, size_t ldo) {
    e2m1_rows<16>(m, first, count, act, ntok, out, ldo);
}

void nvfp4_dequant_avx512bf16(const QuantMatrix &m, int64_t first, int count, uint16_t *dst, size_t ld,
                              float *row_scale) {
    e2m1_dequant<16>(m, first, count, dst, ld, row_scale);
}

void fp8_block_avx512bf16(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                          float *out, size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t K = m.K;
    for_row_pairs(count, [&](const int R, const int *cols) {
        const uint8_t *wp[2], *bp[2];
        for (int r = 0; r < R; ++r) {
            const int64_t row = first + cols[r];
            wp[r] = m.data + row * K;
            bp[r] = m.scale + (row / 128) * (K / 128) * 2;
        }
        for_token_tiles(ntok, [&](auto tile_n, int t) {
            using NT = decltype(tile_n);
            if (R == 2) fp8_rows_x<2, NT::value>(wp, bp, K, act + t, out + t * ldo, ldo, cols, pf);
            else fp8_rows_x<1, NT::value>(wp, bp, K, act + t, out + t * ldo, ldo, cols, pf);
        });
    });
}

// Tiles of 64 columns and two tokens. The K rows of a tile are N bytes apart (strided), so the
// prefetch runs FT_CPU_PREFETCH / 16 rows ahead (32 rows at the default 512).
void mxfp4_avx512bf16(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                      float *out, size_t ldo) {
    const int pf_rows = g_prefetch_bytes / 16;
    for (int c = 0; c < count; c += 64) {
        const int n = count - c < 64 ? count - c : 64;
        int t = 0;
        for (; t + 2 <= ntok; t += 2) mxfp4_tile<2>(m, first + c, n, act + t, out + t * ldo + c, ldo, pf_rows);
        if (t < ntok) mxfp4_tile<1>(m, first + c, n, act + t, out + t * ldo + c, ldo, pf_rows);
    }
}

}  // namespace ft::cpu::detail
