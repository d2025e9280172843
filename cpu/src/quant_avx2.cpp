// AVX2 + FMA (+ F16C) kernels of every quantised format, on prepared activations (quant.cpp):
// fp8_block float[K], q4_0 Q8_0, and for the e2m1 formats W4A8 x2 (two int8 terms per 32
// elements read as one int16, x16 = 256 q1 + q2): nvfp4 / ds_fp4 e2m1_x16_act_bytes, mxfp4
// mxfp4_q8_act_bytes. Each weight vector is decoded once per tile of up to 8 tokens and used for
// all of them; weights are decoded exactly in registers and never stored, except by mxfp4 from
// 3 tokens on (one block's 16 decoded K row pairs at a time in a stack buffer):
//   e2m1   nvfp4 / ds_fp4: per 32 packed bytes of a row, two `vpshufb` of the int8 table of
//          2 * value give the even and the odd elements, each byte unpacked above a zero byte
//          (256 x the value as int16); `vpmaddwd` with the activation in that order sums
//          exactly in int32 per lane, then (sum * block scale * d / 512) per lane in fp32 and
//          2^-8 per row;
//          mxfp4: from a table of 2 * value + 12 (unsigned), byte unpacks with zero give int16
//          pairs (k, k + 1) per column and K row pair; `vpmaddwd` with the activation pair sums
//          exactly in int32 per 32-row block, from the block's -12 x sum(x16); then
//          (sum * d / 512) * e8m0 per column;
//   e4m3   byte << 8 (unpack with zero), arithmetic shift right by 1, bit 14 cleared: the fp16 bits
//          of value * 2^-8 (subnormals exact), `vcvtph2ps`, times the bf16 block scale; 2^8 per row;
//          a 128-chunk holding a NaN code (0x7F/0xFF) is summed from the reference table so the
//          NaN reaches the output (fp8_block); nvfp4's e4m3 scales the same way, NaN codes -> NaN;
//   e8m0   (mxfp4, ds_fp4) the factor biased by 2^32, 2^(code - 95) = (code + 32) << 23, NaN
//          above 190, the sums times 2^-32 (e8m0_biased in tier_scalar.inc: no subnormal
//          operands or products); outputs that are not finite again with the absolute factors,
//          s << 23 with code 0 -> 2^-127 and 255 -> NaN blended in;
//   q4_0   codes u = w + 8; one or two tokens: `vpmaddubsw(u, a) - vpmaddubsw(8, a)`, then
//          `vpmaddwd` by ones: exact int32 per 4 elements (pairs fit int16), x fp16 d x activation
//          d; tiles of 3+ tokens: `vpmaddubsw(u, a)`, `vpmaddwd`, one FMA by d x activation d per
//          block and token, and the -8 offset once per 8 blocks from the activation's block sums.
// fp8_block's products are exact (e4m3 x bf16 fit fp32), so only the fp32 summation order differs
// from the reference; the integer sums are exact, so the others differ by the activation (Q8_0
// for q4_0 by definition, W4A8 x2: at most d / 256 per element) and fp32 rounding.
#include <immintrin.h>

#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "kernels.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu::detail {
namespace {

#include "tier_tiles.inc"

#include "tier_scalar.inc"

#include "tier_avx2.inc"

template <int S>
inline __m256 sum_sets(const __m256 *a) {
    __m256 r = a[0];
    for (int i = 1; i < S; ++i) r = _mm256_add_ps(r, a[i]);
    return r;
}

inline __m256 e8m0x8(__m256i s) {
    __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(s, 23));
    f = _mm256_blendv_ps(f, _mm256_set1_ps(0x1p-127f), _mm256_castsi256_ps(_mm256_cmpeq_epi32(s, _mm256_setzero_si256())));
    return _mm256_blendv_ps(f, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)),
                            _mm256_castsi256_ps(_mm256_cmpeq_epi32(s, _mm256_set1_epi32(255))));
}

// The e8m0 factors of 8 codes (int32 lanes): biased by 2^32 as e8m0_biased (tier_scalar.inc),
// else absolute.
inline __m256 e8m0_full8(__m256i s, bool biased) {
    if (!biased) return e8m0x8(s);
    const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(s, _mm256_set1_epi32(32)), 23));
    return _mm256_blendv_ps(f, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)),
                            _mm256_castsi256_ps(_mm256_cmpgt_epi32(s, _mm256_set1_epi32(190))));
}

// Independent accumulators per token: one FMA chain per token would be latency-bound below 4-5
// tokens (4 cycles per FMA), so small tiles spread a token's sums over several registers.
template <int NT>
constexpr int acc_sets() { return NT == 1 ? 4 : NT <= 4 ? 2 : 1; }

template <template <int> class Row, class... A>
void per_tokens(int ntok, const uint8_t *const *act, float *out, size_t ldo, A... a) {
    for_tiles<8>(ntok, [&](auto tile_n, int t) {
        using NT = decltype(tile_n);
        Row<NT::value>::run(act + t, out + t * ldo, ldo, a...);
    });
}

// ---- nvfp4 / ds_fp4 W4A8 x2: integer sums with `vpmaddwd` -----------------------------------

// 2 * e2m1(code) as int8 for codes 0..15, in both 128-bit lanes (the `vpshufb` table).
inline __m256i e2m1x2_i8_table() {
    return _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
}

// 2 * e2m1 as int8 of the low and of the high nibbles of 32 packed bytes: two `vpshufb`.
inline void e2m1_nibbles(__m256i v, __m256i lut, __m256i m15, __m256i &lo, __m256i &hi) {
    lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m15));
    hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m15));
}

// The 32 packed bytes of 64 elements of a row (nvfp4 / ds_fp4) -> 4 vectors of 256 x (2 e2m1) as
// int16: the even and odd elements' bytes unpacked above a zero byte (the sign comes along). Per
// 128-bit lane h (elements 32h .. 32h + 31): w[0] the even elements 0..14 of it, w[1] the odd
// 1..15, w[2] the even 16..30, w[3] the odd 17..31 (the activation's order, prepare_nvfp4_x16),
// so each int32 lane of vpmaddwd stays in one block of 16.
inline void e2m1_i16_x256(__m256i v, __m256i lut, __m256i m15, __m256i w[4]) {
    __m256i lo, hi;
    e2m1_nibbles(v, lut, m15, lo, hi);
    const __m256i z = _mm256_setzero_si256();
    w[0] = _mm256_unpacklo_epi8(z, lo), w[1] = _mm256_unpacklo_epi8(z, hi);
    w[2] = _mm256_unpackhi_epi8(z, lo), w[3] = _mm256_unpackhi_epi8(z, hi);
}

// The e4m3 scales of 128 elements of a row (8 codes) as fp32 with the reference's values: the
// fp16 bits of value * 2^-8 (byte << 8 shifted right arithmetically by 1, bit 14 cleared;
// subnormals exact), x 2^8, and 0x7F / 0xFF -> NaN.
inline __m256 e4m3x8(const uint8_t *sc) {
    const __m128i w = _mm_unpacklo_epi8(_mm_setzero_si128(), _mm_loadl_epi64(reinterpret_cast<const __m128i *>(sc)));
    const __m128i h = _mm_and_si128(_mm_srai_epi16(w, 1), _mm_set1_epi16(int16_t(0xbfff)));
    const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f00)), _mm_set1_epi16(0x7f00));
    return _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)),
                            _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan)));
}

// The block scales of 128 elements of a row: nvfp4 (B = 16) the 8 e4m3 codes in lanes 0..7;
// ds_fp4 (B = 32) the 4 e8m0 factors in lanes 0..3 (biased by 2^32 as e8m0_biased, or absolute).
template <int B>
inline __m256 x16_scales128(const uint8_t *sc, bool biased) {
    if constexpr (B == 16) {
        return e4m3x8(sc);
    } else {
        int32_t four;
        std::memcpy(&four, sc, 4);
        return e8m0_full8(_mm256_cvtepu8_epi32(_mm_cvtsi32_si128(four)), biased);
    }
}

// One row x NT tokens. Per 64 elements and token: vpmaddwd of the 4 weight vectors
// (e2m1_i16_x256) with the activation's, added in two pairs (the first: block 0 of 16 in lanes
// 0..3, block 2 in 4..7; the second: blocks 1 and 3; ds_fp4 adds the two, one block of 32 per
// 128-bit lane), converted, times (block scale x activation d / 512) per lane, into the
// accumulators; the row sum times g / 256 (g: nvfp4's fp16 global; ds_fp4 2^-32 with biased
// factors, else 1). The int32 lane sums are exact (|sum| <= 8 x 256 x 12 x 32639 < 2^30), their
// conversion rounds as an fp32 product would. A partial last 64 (nvfp4, K % 64 = 16, 32, 48) is
// read from zero-padded copies, so no byte past the row is touched.
template <int B, int NT>
void e2m1_x16_row(const uint8_t *p, const uint8_t *sc, float g, int64_t K, const uint8_t *const *act, float *out,
                  size_t ldo, int pf, bool biased) {
    const int64_t kp = (K + 63) / 64 * 64;
    const __m256i lut = e2m1x2_i8_table(), m15 = _mm256_set1_epi8(15);
    // Lane -> scale of 128 elements, per half (64) of them: nvfp4 blocks {0, 2} and {1, 3} of 16
    // in the half, ds_fp4 the half's two blocks of 32 for both.
    const __m256i idx01[2] = {B == 16 ? _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2) : _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
                              B == 16 ? _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6) : _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3)};
    const __m256i idx23[2] = {B == 16 ? _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3) : idx01[0],
                              B == 16 ? _mm256_setr_epi32(5, 5, 5, 5, 7, 7, 7, 7) : idx01[1]};
    constexpr int A = B == 16 && NT <= 4 ? 2 : 1;  // accumulators per token (16 ymm registers)
    const int16_t *xa[NT];
    const float *dv[NT];
    __m256 acc[NT][A];
    for (int t = 0; t < NT; ++t) {
        xa[t] = reinterpret_cast<const int16_t *>(act[t]);
        dv[t] = reinterpret_cast<const float *>(act[t] + 2 * kp);
        for (int i = 0; i < A; ++i) acc[t][i] = _mm256_setzero_ps();
    }
    // The 64 elements from c (half h of 128) with the weight bytes wp and the block scales s8.
    auto half = [&](int64_t c, int h, const uint8_t *wp, __m256 s8) {
        const __m256 s01 = _mm256_permutevar8x32_ps(s8, idx01[h]), s23 = _mm256_permutevar8x32_ps(s8, idx23[h]);
        __m256i w[4];
        e2m1_i16_x256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(wp)), lut, m15, w);
        for (int t = 0; t < NT; ++t) {
            const __m256i *xv = reinterpret_cast<const __m256i *>(xa[t] + c);
            const __m256i r01 = _mm256_add_epi32(_mm256_madd_epi16(w[0], _mm256_loadu_si256(xv)),
                                                 _mm256_madd_epi16(w[1], _mm256_loadu_si256(xv + 1)));
            const __m256i r23 = _mm256_add_epi32(_mm256_madd_epi16(w[2], _mm256_loadu_si256(xv + 2)),
                                                 _mm256_madd_epi16(w[3], _mm256_loadu_si256(xv + 3)));
            const __m256 d = _mm256_loadu_ps(dv[t] + c / 8);
            if constexpr (B == 32) {  // both halves in the same block of 32: one conversion
                acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(r01, r23)), _mm256_mul_ps(s01, d), acc[t][0]);
            } else {
                acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(r01), _mm256_mul_ps(s01, d), acc[t][0]);
                acc[t][A - 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(r23), _mm256_mul_ps(s23, d), acc[t][A - 1]);
            }
        }
    };
    // Whole 128s without tail checks (no calls in the loop, so the accumulators stay in
    // registers), then a partial last 128 from zero-padded copies.
    int64_t c = 0;
    for (; c + 128 <= K; c += 128) {
        const uint8_t *wp = p + c / 2;
        if (pf) _mm_prefetch(reinterpret_cast<const char *>(wp) + pf, _MM_HINT_T0);
        const __m256 s8 = x16_scales128<B>(sc + c / B, biased);
        half(c, 0, wp, s8);
        half(c + 64, 1, wp + 32, s8);
    }
    if (c < K) {
        alignas(32) uint8_t wtail[64] = {};
        alignas(8) uint8_t stail[8] = {};
        std::memcpy(wtail, p + c / 2, size_t(K - c) / 2);
        std::memcpy(stail, sc + c / B, size_t(K - c) / B);
        const __m256 s8 = x16_scales128<B>(stail, biased);
        half(c, 0, wtail, s8);
        if (c + 64 < kp) half(c + 64, 1, wtail + 32, s8);
    }
    g *= 0x1p-8f;  // the weights came x 256
    for (int t = 0; t < NT; ++t) out[t * ldo] = hsum(A == 2 ? _mm256_add_ps(acc[t][0], acc[t][A - 1]) : acc[t][0]) * g;
}

// nvfp4 / ds_fp4 W4A8 x2 (the e2m1_x16_act_bytes layout): each row decoded once per tile of up
// to 8 tokens. ds_fp4 with the biased factors first, then its rows with an output that is not
// finite again with the absolute ones (see e8m0 above).
template <int B>
void e2m1_x16_rows(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                   size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t K = m.K;
    auto rows = [&](int j0, int n, bool biased) {
        for (int j = j0; j < j0 + n; ++j) {
            const int64_t r = first + j;
            const uint8_t *p = m.data + r * (K / 2), *sc = m.scale + r * (K / B);
            const float g = B == 16 ? f16(m.global + r * 2) : biased ? kUnbias : 1.0f;
            if (ntok == 1) {
                e2m1_x16_row<B, 1>(p, sc, g, K, act, out + j, ldo, pf, biased);
                continue;
            }
            for_tiles<8>(ntok, [&](auto tile_n, int t) {
                using NT = decltype(tile_n);
                e2m1_x16_row<B, NT::value>(p, sc, g, K, act + t, out + t * ldo + j, ldo, pf, biased);
            });
        }
    };
    constexpr bool kBiased = B == 32;
    rows(0, count, kBiased);
    if constexpr (kBiased)
        for (int j = 0; j < count; ++j)
            if (!outputs_finite(out + j, ldo, 1, ntok)) rows(j, 1, false);
}

// ---- fp8_block ------------------------------------------------------------------------------

// R rows (R = 2 only for one token: two weight streams, shared activation loads) x NT tokens.
// A 128-chunk holding a NaN code in any of the R rows is summed from the reference table. Up to
// 4 (row, token) pairs sum each 128-chunk unscaled and apply its scale once per pair (fewer
// operations); larger tiles scale the decoded weights once for all their tokens.
template <int NT, int R>
void fp8_rows(const uint8_t *const *act, float *const out[R], size_t ldo, const uint8_t *const w[R],
              const uint8_t *const band[R], int64_t K, int pf) {
    const __m256i m80 = _mm256_set1_epi8(char(0x80)), ff = _mm256_set1_epi8(char(0xff));
    const __m256i fp16_mask = _mm256_set1_epi16(int16_t(0xbf80)), zero = _mm256_setzero_si256();
    constexpr int S = R == 2 ? 2 : acc_sets<NT>();
    constexpr bool chunk_sums = R * NT <= 4;
    const float *x[NT];
    __m256 acc[R][NT][S], blk[R][NT][S];
    float nan_part[R][NT] = {};
    for (int t = 0; t < NT; ++t) x[t] = reinterpret_cast<const float *>(act[t]);
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t)
            for (int i = 0; i < S; ++i) acc[r][t][i] = _mm256_setzero_ps();
    for (int64_t c = 0; c < K; c += 128) {
        float s[R];
        __m256i nan = zero;
        for (int r = 0; r < R; ++r) {
            s[r] = bf16(band[r] + (c / 128) * 2);
            if (pf) {
                _mm_prefetch(reinterpret_cast<const char *>(w[r] + c) + pf, _MM_HINT_T0);
                _mm_prefetch(reinterpret_cast<const char *>(w[r] + c + 64) + pf, _MM_HINT_T0);
            }
            for (int q = 0; q < 4; ++q) {
                const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(w[r] + c + 32 * q));
                nan = _mm256_or_si256(nan, _mm256_cmpeq_epi8(_mm256_or_si256(b, m80), ff));
            }
        }
        if (!_mm256_testz_si256(nan, nan)) {  // the reference's NaN must reach the output; the table has it
            for (int r = 0; r < R; ++r)
                for (int t = 0; t < NT; ++t)
                    for (int i = 0; i < 128; ++i) nan_part[r][t] += g_e4m3[w[r][c + i]] * s[r] * x[t][c + i];
            continue;
        }
        if (chunk_sums)
            for (int r = 0; r < R; ++r)
                for (int t = 0; t < NT; ++t)
                    for (int i = 0; i < S; ++i) blk[r][t][i] = _mm256_setzero_ps();
        for (int q = 0; q < 4; ++q) {
            __m256 f[R][4];
            for (int r = 0; r < R; ++r) {
                // Words (byte << 8) >> 1 (arithmetic), bit 14 cleared: fp16 bits of value * 2^-8.
                // unpacklo holds elements 0..7 | 16..23 of the 32, unpackhi 8..15 | 24..31.
                const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(w[r] + c + 32 * q));
                const __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(zero, b), 1), fp16_mask);
                const __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(zero, b), 1), fp16_mask);
                f[r][0] = _mm256_cvtph_ps(_mm256_castsi256_si128(lo));
                f[r][1] = _mm256_cvtph_ps(_mm256_castsi256_si128(hi));
                f[r][2] = _mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1));
                f[r][3] = _mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1));
                if (!chunk_sums) {
                    const __m256 sv = _mm256_set1_ps(s[r]);
                    for (int i = 0; i < 4; ++i) f[r][i] = _mm256_mul_ps(f[r][i], sv);
                }
            }
            for (int t = 0; t < NT; ++t) {
                const float *xt = x[t] + c + 32 * q;
                for (int i = 0; i < 4; ++i) {
                    const __m256 xv = _mm256_loadu_ps(xt + 8 * i);
                    for (int r = 0; r < R; ++r) {
                        __m256 &a = chunk_sums ? blk[r][t][i % S] : acc[r][t][i % S];
                        a = _mm256_fmadd_ps(f[r][i], xv, a);
                    }
                }
            }
        }
        if (chunk_sums)
            for (int r = 0; r < R; ++r) {
                const __m256 sv = _mm256_set1_ps(s[r]);
                for (int t = 0; t < NT; ++t)
                    for (int i = 0; i < S; ++i) acc[r][t][i] = _mm256_fmadd_ps(blk[r][t][i], sv, acc[r][t][i]);
            }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t) out[r][t * ldo] = hsum(sum_sets<S>(acc[r][t])) * 256.0f + nan_part[r][t];
}

template <int NT>
struct Fp8Row {
    static void run(const uint8_t *const *act, float *out, size_t ldo, const uint8_t *w, const uint8_t *band, int64_t K,
                    int pf) {
        float *const o[1] = {out};
        const uint8_t *const wr[1] = {w}, *const br[1] = {band};
        fp8_rows<NT, 1>(act, o, ldo, wr, br, K, pf);
    }
};

// ---- q4_0 x Q8_0 ----------------------------------------------------------------------------

// The 32 codes of a q4_0 block (elements 0..15: low nibbles, 16..31: high): its 16 bytes in both
// lanes, the upper lane shifted right by 4, masked (3 operations, the load broadcasts).
inline __m256i q4_codes(const uint8_t *blk) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2)));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0f));
}

// One or two tokens, R rows (R = 2 only for one token): vpmaddubsw(u, a) - vpmaddubsw(8, a) per
// block, the second shared by the R rows.
template <int NT, int R>
void q4_rows(const uint8_t *const *act, float *const out[R], size_t ldo, const uint8_t *const row[R], int64_t nb,
             int64_t qbytes, int pf) {
    const __m256i eight = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
    constexpr int S = 2;  // blocks alternate between two accumulators
    const int8_t *q[NT];
    const float *d[NT];
    __m256 acc[R][NT][S];
    for (int t = 0; t < NT; ++t) {
        for (int r = 0; r < R; ++r)
            for (int i = 0; i < S; ++i) acc[r][t][i] = _mm256_setzero_ps();
        q[t] = reinterpret_cast<const int8_t *>(act[t]);
        d[t] = reinterpret_cast<const float *>(act[t] + qbytes);
    }
    // Block b into accumulator set A (a constant, so the accumulators stay in registers).
    auto block = [&](int64_t b, auto set) {
        constexpr int A = decltype(set)::value;
        __m256i u[R];
        __m256 dw[R];
        for (int r = 0; r < R; ++r) {
            const uint8_t *blk = row[r] + b * 18;
            if (pf && (b & 3) == 0) _mm_prefetch(reinterpret_cast<const char *>(blk) + pf, _MM_HINT_T0);
            u[r] = q4_codes(blk);
            dw[r] = _mm256_set1_ps(f16(blk));
        }
        for (int t = 0; t < NT; ++t) {
            const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q[t] + b * 32));
            const __m256 da = _mm256_broadcast_ss(d[t] + b);
            const __m256i corr = _mm256_maddubs_epi16(eight, a);  // 8 * pair sums of a
            for (int r = 0; r < R; ++r) {
                const __m256i i32 = _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(u[r], a), corr), ones);
                __m256 &a_t = acc[r][t][A];
                a_t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_mul_ps(dw[r], da), a_t);
            }
        }
    };
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        block(b, std::integral_constant<int, 0>{});
        block(b + 1, std::integral_constant<int, S - 1>{});
    }
    if (b < nb) block(b, std::integral_constant<int, 0>{});
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t) out[r][t * ldo] = hsum(sum_sets<S>(acc[r][t]));
}

template <int NT>
struct Q4Row {
    static void run(const uint8_t *const *act, float *out, size_t ldo, const uint8_t *row, int64_t nb, int64_t qbytes,
                    int pf) {
        float *const o[1] = {out};
        const uint8_t *const rr[1] = {row};
        q4_rows<NT, 1>(act, o, ldo, rr, nb, qbytes, pf);
    }
};

// d[b] * (sum of the 32 codes of block b) of one token's Q8_0 activation, blocks [b0, b0 + n) to
// dst (the offset term of the codes u - 8).
void q8_block_sums(const int8_t *q, const float *d, int64_t b0, int64_t n, float *dst) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    auto sum4 = [&](int64_t b) {  // blocks b .. b + 3: 4 int32 sums
        __m256i v[4];
        for (int i = 0; i < 4; ++i) {
            const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + (b + i) * 32));
            v[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, a), ones16);
        }
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    };
    int64_t b = b0;
    for (; b + 8 <= b0 + n; b += 8) {
        const __m256 s = _mm256_cvtepi32_ps(_mm256_set_m128i(sum4(b + 4), sum4(b)));
        _mm256_storeu_ps(dst + (b - b0), _mm256_mul_ps(s, _mm256_loadu_ps(d + b)));
    }
    for (; b < b0 + n; ++b) {
        int32_t s = 0;
        for (int i = 0; i < 32; ++i) s += q[b * 32 + i];
        dst[b - b0] = d[b] * float(s);
    }
}

// Tiles of 3+ tokens, one row, blocks [b0, b0 + n): per block and token vpmaddubsw(u, a) and
// vpmaddwd by ones (exact int32), one FMA by d_w * d_a (the products of 8 blocks in one multiply,
// read back from the stack); the codes' offset -8 is applied once per 8 blocks and token from
// the activation's block sums (q8_block_sums). Adds to out when `add`.
template <int NT>
void q4_rows_tile(const int8_t *const *q, const float *const *d, const float *const *sums, const uint8_t *row,
                  int64_t b0, int64_t n, float *out, size_t ldo, bool add, int pf) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[NT], off[NT];
    float off_tail[NT];
    for (int t = 0; t < NT; ++t) acc[t] = off[t] = _mm256_setzero_ps(), off_tail[t] = 0.0f;
    auto dot = [&](__m256i u, int t, int64_t b) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q[t] + b * 32));
        return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, a), ones));
    };
    int64_t b = b0;
    for (; b + 8 <= b0 + n; b += 8) {
        const uint8_t *g = row + b * 18;
        const __m256 dw = f16x8<18>(g);
        alignas(32) float pr[NT][8];
        for (int t = 0; t < NT; ++t) {
            const __m256 p = _mm256_mul_ps(dw, _mm256_loadu_ps(d[t] + b));
            _mm256_store_ps(pr[t], p);
            off[t] = _mm256_fmadd_ps(dw, _mm256_loadu_ps(sums[t] + (b - b0)), off[t]);
        }
        for (int i = 0; i < 8; ++i) {
            const uint8_t *blk = g + i * 18;
            if (pf && (i & 3) == 0) _mm_prefetch(reinterpret_cast<const char *>(blk) + pf, _MM_HINT_T0);
            const __m256i u = q4_codes(blk);
            for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(dot(u, t, b + i), _mm256_broadcast_ss(&pr[t][i]), acc[t]);
        }
    }
    for (; b < b0 + n; ++b) {
        const uint8_t *blk = row + b * 18;
        const float dw = f16(blk);
        const __m256i u = q4_codes(blk);
        for (int t = 0; t < NT; ++t) {
            acc[t] = _mm256_fmadd_ps(dot(u, t, b), _mm256_set1_ps(dw * d[t][b]), acc[t]);
            off_tail[t] += dw * sums[t][b - b0];
        }
    }
    for (int t = 0; t < NT; ++t) {
        const float v = hsum(acc[t]) - 8.0f * (hsum(off[t]) + off_tail[t]);
        out[t * ldo] = add ? out[t * ldo] + v : v;
    }
}

// ---- mxfp4: K-outer over tiles of columns x NT tokens, W4A8 x2 ------------------------------------

// The 16 K row pairs of block b of a tile of W columns from `first` holding `count` of them, row
// r at the result + r * stride: in place, or for a partial tile copied zero-padded into
// tmp[16 * W]; the rows pf_rows ahead prefetched into L2.
template <int W>
inline const uint8_t *tile_block(const QuantMatrix &m, int64_t first, int count, int64_t b, int pf_rows, uint8_t *tmp,
                                 int64_t &stride) {
    const uint8_t *rows = m.data + 16 * b * m.N + first;
    if (pf_rows)
        for (int64_t r = 0, n = m.K / 2 - 16 * b - pf_rows; r < 16 && r < n; ++r)
            _mm_prefetch(reinterpret_cast<const char *>(rows + (r + pf_rows) * m.N), _MM_HINT_T1);
    stride = m.N;
    if (count == W) return rows;
    std::memset(tmp, 0, 16 * W);
    for (int r = 0; r < 16; ++r) std::memcpy(tmp + r * W, rows + r * m.N, size_t(count));
    stride = W;
    return tmp;
}

// The e8m0 codes of block b for a tile of W columns from `first` holding `count` of them, copied
// zero-padded into st[W]; the next block's codes prefetched.
template <int W>
inline void tile_scales(const QuantMatrix &m, int64_t first, int count, int64_t b, int64_t nb, uint8_t *st) {
    const uint8_t *srow = m.scale + b * m.N + first;
    std::memset(st, 0, W);
    std::memcpy(st, srow, size_t(count));
    if (b + 1 < nb) _mm_prefetch(reinterpret_cast<const char *>(srow + m.N), _MM_HINT_T0);
}

// The W4A8 x2 activation (mxfp4_q8_act_bytes) starts with its int16 form x16 = 256 q1 + q2
// (|x16| <= 32639), so x ~ (d / 256) x16 and the kernels' integer sums are those of the VNNI
// kernel. Block b of a token's x16.
inline const int16_t *mxfp4_x16_block(const uint8_t *act, int64_t b) {
    return reinterpret_cast<const int16_t *>(act) + 32 * b;
}

// 2 * e2m1(code) + 12 (0 .. 24) for codes 0..15, in both 128-bit lanes: mxfp4's weights as
// unsigned bytes, so they widen to int16 by unpacking with zero; each int32 sum starts at the
// block's -12 x sum(x16) = 256 c1 + c2 (the activation's -12 sum(q1), -12 sum(q2)), so it ends exact.
inline __m256i e2m1x2_u8_table() {
    return _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
}

// The 32 bytes of one K row pair for 32 columns (byte i holds column i's weights at k = 2kb and
// 2kb + 1) -> 4 vectors of int16 pairs (2 e2m1 + 12 at k, at k + 1): lane i of w[g] is column
// mxfp4_w4a8_column(g, i) (bytes 4g .. 4g + 3 in the low 128-bit lane, 16 + 4g .. in the high).
constexpr int mxfp4_w4a8_column(int g, int i) { return 16 * (i / 4) + 4 * g + i % 4; }

inline void mxfp4_u16_pairs(__m256i v, __m256i lut, __m256i m15, __m256i w[4]) {
    __m256i lo, hi;
    e2m1_nibbles(v, lut, m15, lo, hi);
    const __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi), z = _mm256_setzero_si256();
    w[0] = _mm256_unpacklo_epi8(a, z), w[1] = _mm256_unpackhi_epi8(a, z);
    w[2] = _mm256_unpacklo_epi8(b, z), w[3] = _mm256_unpackhi_epi8(b, z);
}

// The e8m0 factors of 32 columns (codes at sc) in the lane order of mxfp4_u16_pairs.
inline void mxfp4_w4a8_scales(const uint8_t *sc, bool biased, __m256 s[4]) {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i *>(sc)), z = _mm256_setzero_si256();
    const __m256i a = _mm256_unpacklo_epi8(v, z), b = _mm256_unpackhi_epi8(v, z);
    s[0] = e8m0_full8(_mm256_unpacklo_epi16(a, z), biased), s[1] = e8m0_full8(_mm256_unpackhi_epi16(a, z), biased);
    s[2] = e8m0_full8(_mm256_unpacklo_epi16(b, z), biased), s[3] = e8m0_full8(_mm256_unpackhi_epi16(b, z), biased);
}

// Per token and block b of nb (a: the activation past its x16 form): the start of the int32
// sums, -12 sum(x16) = 256 c1 + c2 from the block's -12 sum(q1), -12 sum(q2); its d / 512.
inline __m256i mxfp4_offset_start(const uint8_t *a, int64_t qbytes, int64_t nb, int64_t b) {
    int32_t c[2];
    std::memcpy(c, a + 2 * qbytes + 4 * nb + 8 * b, 8);
    return _mm256_set1_epi32(256 * c[0] + c[1]);
}

inline __m256 mxfp4_block_d(const uint8_t *a, int64_t qbytes, int64_t b) {
    float d;
    std::memcpy(&d, a + 2 * qbytes + 4 * b, 4);
    return _mm256_set1_ps(d);
}

// The NT x 32 NL accumulators (times 2^-32 when biased) to the count outputs of each token.
template <int NT, int NL>
inline void mxfp4_w4a8_store(const __m256 (*acc)[4 * NL], int count, bool biased, float *out, size_t ldo) {
    const __m256 unbias = _mm256_set1_ps(biased ? kUnbias : 1.0f);
    for (int t = 0; t < NT; ++t) {
        alignas(32) float o[8];
        for (int l = 0; l < NL; ++l)
            for (int g = 0; g < 4; ++g) {
                _mm256_store_ps(o, _mm256_mul_ps(acc[t][4 * l + g], unbias));
                for (int i = 0; i < 8; ++i) {
                    const int col = 32 * l + mxfp4_w4a8_column(g, i);
                    if (col < count) out[t * ldo + col] = o[i];
                }
            }
    }
}

// NL groups of 32 columns from `first` (count of them in the tile) x NT tokens (1 or 2: 4 int32
// sums per token and group in registers). Per block of 32 K rows each column's int32 sum of
// (2 e2m1 + 12) x x16 takes one `vpmaddwd` (2 k) per K row pair; then fp32 (sum * d / 512) * e8m0
// into the column's accumulator, as the VNNI kernel, with the factors biased by 2^32 (no
// subnormal products for small codes; outputs times 2^-32) or not.
template <int NT, int NL>
void mxfp4_w4a8_tile(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int64_t qbytes,
                     float *out, size_t ldo, int pf_rows, bool biased) {
    constexpr int W = 32 * NL;
    const int64_t nb = m.K / 32;
    const __m256i lut = e2m1x2_u8_table(), m15 = _mm256_set1_epi8(15);
    const uint8_t *a[NT];
    for (int t = 0; t < NT; ++t) a[t] = act[t] + 2 * qbytes;  // past the x16 form
    __m256 acc[NT][4 * NL] = {};
    for (int64_t b = 0; b < nb; ++b) {
        const int16_t *xs[NT];
        __m256i isum[NT][4 * NL];
        for (int t = 0; t < NT; ++t) {
            xs[t] = mxfp4_x16_block(act[t], b);
            const __m256i start = mxfp4_offset_start(a[t], qbytes, nb, b);
            for (int g = 0; g < 4 * NL; ++g) isum[t][g] = start;
        }
        alignas(32) uint8_t tmp[16 * W];
        int64_t stride;
        const uint8_t *rows = tile_block<W>(m, first, count, b, pf_rows, tmp, stride);
        for (int r = 0; r < 16; ++r) {
            __m256i xb[NT];
            for (int t = 0; t < NT; ++t) {
                int32_t pair;
                std::memcpy(&pair, xs[t] + 2 * r, 4);
                xb[t] = _mm256_set1_epi32(pair);
            }
            for (int l = 0; l < NL; ++l) {
                __m256i w[4];
                mxfp4_u16_pairs(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(rows + r * stride + 32 * l)), lut,
                                m15, w);
                for (int g = 0; g < 4; ++g)
                    for (int t = 0; t < NT; ++t)
                        isum[t][4 * l + g] = _mm256_add_epi32(isum[t][4 * l + g], _mm256_madd_epi16(w[g], xb[t]));
            }
        }
        alignas(32) uint8_t st[W];
        tile_scales<W>(m, first, count, b, nb, st);
        __m256 dt[NT];
        for (int t = 0; t < NT; ++t) dt[t] = mxfp4_block_d(a[t], qbytes, b);
        for (int l = 0; l < NL; ++l) {
            __m256 s[4];
            mxfp4_w4a8_scales(st + 32 * l, biased, s);
            for (int g = 0; g < 4; ++g)
                for (int t = 0; t < NT; ++t) {
                    // (sum * d) * e8m0: the power of two last (a product s * d formed first is
                    // subnormal for small codes).
                    const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[t][4 * l + g]), dt[t]);
                    acc[t][4 * l + g] = _mm256_fmadd_ps(v, s[g], acc[t][4 * l + g]);
                }
        }
    }
    mxfp4_w4a8_store<NT, NL>(acc, count, biased, out, ldo);
}

// One group of NG tokens over half h of 32 columns (vectors 2h, 2h + 1 of each K row pair in wb):
// the block's int32 sums, 2 per token, which stay in registers with the NG activation pairs.
template <int NG>
inline void mxfp4_w4a8_group(const __m256i (*wb)[4], int h, const int16_t *const *xs, const __m256i *start,
                             __m256i isum[NG][2]) {
    for (int t = 0; t < NG; ++t) isum[t][0] = isum[t][1] = start[t];
#pragma GCC unroll 1  // GCC unrolls it fully for 1 .. 3 tokens and then spills (2 x slower)
    for (int r = 0; r < 16; ++r) {
        const __m256i w0 = _mm256_load_si256(&wb[r][2 * h]), w1 = _mm256_load_si256(&wb[r][2 * h + 1]);
        for (int t = 0; t < NG; ++t) {
            int32_t pair;
            std::memcpy(&pair, xs[t] + 2 * r, 4);
            const __m256i xb = _mm256_set1_epi32(pair);
            isum[t][0] = _mm256_add_epi32(_mm256_madd_epi16(w0, xb), isum[t][0]);
            isum[t][1] = _mm256_add_epi32(_mm256_madd_epi16(w1, xb), isum[t][1]);
        }
    }
}

// NL groups of 32 columns from `first` (count of them in the tile) x NT tokens (up to 8): per
// block of 32 K rows, the 16 row pairs decoded once into wb, then per group of up to 4 tokens and
// half of 32 columns the sums of mxfp4_w4a8_group, into the accumulators as mxfp4_w4a8_tile.
template <int NT, int NL>
void mxfp4_w4a8_tokens(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int64_t qbytes,
                       float *out, size_t ldo, int pf_rows, bool biased) {
    constexpr int W = 32 * NL;
    const int64_t nb = m.K / 32;
    const __m256i lut = e2m1x2_u8_table(), m15 = _mm256_set1_epi8(15);
    const uint8_t *a[NT];
    for (int t = 0; t < NT; ++t) a[t] = act[t] + 2 * qbytes;  // past the x16 form
    __m256 acc[NT][4 * NL] = {};
    for (int64_t b = 0; b < nb; ++b) {
        alignas(32) uint8_t tmp[16 * W];
        int64_t stride;
        const uint8_t *rows = tile_block<W>(m, first, count, b, pf_rows, tmp, stride);
        alignas(32) __m256i wb[NL][16][4];
        for (int l = 0; l < NL; ++l)
            for (int r = 0; r < 16; ++r)
                mxfp4_u16_pairs(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(rows + r * stride + 32 * l)), lut,
                                m15, wb[l][r]);
        const int16_t *xs[NT];
        __m256i start[NT];
        __m256 dt[NT];
        for (int t = 0; t < NT; ++t) {
            xs[t] = mxfp4_x16_block(act[t], b);
            start[t] = mxfp4_offset_start(a[t], qbytes, nb, b);
            dt[t] = mxfp4_block_d(a[t], qbytes, b);
        }
        alignas(32) uint8_t st[W];
        tile_scales<W>(m, first, count, b, nb, st);
        __m256 s[NL][4];
        for (int l = 0; l < NL; ++l) mxfp4_w4a8_scales(st + 32 * l, biased, s[l]);
        auto group = [&](auto ng, int t0) {
            constexpr int NG = decltype(ng)::value;
            for (int l = 0; l < NL; ++l)
                for (int h = 0; h < 2; ++h) {
                    __m256i isum[NG][2];
                    mxfp4_w4a8_group<NG>(wb[l], h, xs + t0, start + t0, isum);
                    for (int t = 0; t < NG; ++t)
                        for (int j = 0; j < 2; ++j) {
                            const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[t][j]), dt[t0 + t]);
                            __m256 &c = acc[t0 + t][4 * l + 2 * h + j];
                            c = _mm256_fmadd_ps(v, s[l][2 * h + j], c);
                        }
                }
        };
        int t0 = 0;
        for (; t0 + 4 <= NT; t0 += 4) group(std::integral_constant<int, 4>{}, t0);
        if constexpr (NT % 4 != 0) group(std::integral_constant<int, NT % 4>{}, t0);
    }
    mxfp4_w4a8_store<NT, NL>(acc, count, biased, out, ldo);
}
}  // namespace

void nvfp4_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                size_t ldo) {
    e2m1_x16_rows<16>(m, first, count, act, ntok, out, ldo);
}

void ds_fp4_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    e2m1_x16_rows<32>(m, first, count, act, ntok, out, ldo);
}

void fp8_block_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                    size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t K = m.K;
    auto band = [&](int64_t r) { return m.scale + (r / 128) * (K / 128) * 2; };
    if (ntok == 1) {  // row j together with row j + count / 2
        for_row_pairs(count, [&](int R, const int *cols) {
            const int64_t r0 = first + cols[0], r1 = first + cols[R - 1];
            if (R == 1) return Fp8Row<1>::run(act, out + cols[0], ldo, m.data + r0 * K, band(r0), K, pf);
            float *const o[2] = {out + cols[0], out + cols[1]};
            const uint8_t *const w[2] = {m.data + r0 * K, m.data + r1 * K}, *const b[2] = {band(r0), band(r1)};
            fp8_rows<1, 2>(act, o, ldo, w, b, K, pf);
        });
        return;
    }
    for (int j = 0; j < count; ++j) {
        const int64_t r = first + j;
        per_tokens<Fp8Row>(ntok, act, out + j, ldo, m.data + r * K, band(r), K, pf);
    }
}

void q4_0_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
               size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t nb = m.K / 32, qbytes = (m.K + 63) / 64 * 64;
    if (ntok == 1) {  // row j together with row j + count / 2
        for_row_pairs(count, [&](int R, const int *cols) {
            const uint8_t *r0 = m.data + (first + cols[0]) * nb * 18, *r1 = m.data + (first + cols[R - 1]) * nb * 18;
            if (R == 1) return Q4Row<1>::run(act, out + cols[0], ldo, r0, nb, qbytes, pf);
            float *const o[2] = {out + cols[0], out + cols[1]};
            const uint8_t *const rr[2] = {r0, r1};
            q4_rows<1, 2>(act, o, ldo, rr, nb, qbytes, pf);
        });
        return;
    }
    // Tiles of up to 8 tokens; from 3 tokens on, per range of blocks whose sums fit the stack
    // buffer, the activation sums once and then every row.
    constexpr int64_t kSumsFloats = 4096;
    alignas(32) float sums[kSumsFloats];
    for_tiles<8>(ntok, [&](auto tile_n, int t0) {
        constexpr int NT = decltype(tile_n)::value;
        float *o = out + size_t(t0) * ldo;
        if constexpr (NT < 3) {
            for (int j = 0; j < count; ++j)
                Q4Row<NT>::run(act + t0, o + j, ldo, m.data + (first + j) * nb * 18, nb, qbytes, pf);
        } else {
            const int8_t *q[NT];
            const float *d[NT], *sp[NT];
            for (int t = 0; t < NT; ++t) {
                q[t] = reinterpret_cast<const int8_t *>(act[t0 + t]);
                d[t] = reinterpret_cast<const float *>(act[t0 + t] + qbytes);
            }
            const int64_t chunk = kSumsFloats / NT / 8 * 8;
            for (int64_t b0 = 0; b0 < nb; b0 += chunk) {
                const int64_t n = nb - b0 < chunk ? nb - b0 : chunk;
                for (int t = 0; t < NT; ++t) {
                    q8_block_sums(q[t], d[t], b0, n, sums + t * n);
                    sp[t] = sums + t * n;
                }
                for (int j = 0; j < count; ++j)
                    q4_rows_tile<NT>(q, d, sp, m.data + (first + j) * nb * 18, b0, n, o + j, ldo, b0 > 0, pf);
            }
        }
    });
}

// mxfp4 W4A8 x2 (the mxfp4_q8_act_bytes layout): one token in tiles of 64 columns (two 32-byte
// streams per K row pair), two in tiles of 32 columns (8 int32 sums in registers), 3 .. 8 in tiles
// of 64 columns whose row pairs are decoded once per block into a buffer and summed per 4 tokens
// x 16 columns (mxfp4_w4a8_tokens). Each tile with the biased factors, again with the absolute
// ones when one of its outputs is not finite.
void mxfp4_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                size_t ldo) {
    const int pf_rows = g_prefetch_bytes / 8;
    const int64_t qbytes = (m.K + 63) / 64 * 64;
    if (ntok == 1) {
        for (int c = 0; c < count; c += 64) {
            const int n = count - c < 64 ? count - c : 64;
            for (bool biased : {true, false}) {
                if (n > 32) mxfp4_w4a8_tile<1, 2>(m, first + c, n, act, qbytes, out + c, ldo, pf_rows, biased);
                else mxfp4_w4a8_tile<1, 1>(m, first + c, n, act, qbytes, out + c, ldo, pf_rows, biased);
                if (outputs_finite(out + c, ldo, n, 1)) break;
            }
        }
        return;
    }
    for (int c = 0; c < count; c += 64) {
        const int n = count - c < 64 ? count - c : 64;
        for_tiles<8>(ntok, [&](auto tile_n, int t) {
            constexpr int NT = decltype(tile_n)::value;
            float *o = out + t * ldo + c;
            for (bool biased : {true, false}) {
                if constexpr (NT <= 2) {
                    mxfp4_w4a8_tile<NT, 1>(m, first + c, n < 32 ? n : 32, act + t, qbytes, o, ldo, pf_rows, biased);
                    if (n > 32)
                        mxfp4_w4a8_tile<NT, 1>(m, first + c + 32, n - 32, act + t, qbytes, o + 32, ldo, pf_rows,
                                               biased);
                } else if (n > 32) {
                    mxfp4_w4a8_tokens<NT, 2>(m, first + c, n, act + t, qbytes, o, ldo, pf_rows, biased);
                } else {
                    mxfp4_w4a8_tokens<NT, 1>(m, first + c, n, act + t, qbytes, o, ldo, pf_rows, biased);
                }
                if (outputs_finite(o, ldo, n, NT)) break;
            }
        });
    }
}

}  // namespace ft::cpu::detail
