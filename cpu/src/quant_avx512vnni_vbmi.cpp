// AVX-512-VNNI + VBMI kernel of mxfp4 (gpt-oss transposed layout) as W4A8: the weights as
// integers 2 * e2m1 (exact: {0, +-1, +-2, +-3, +-4, +-6, +-8, +-12}), activations Q8_0 per block of
// 32 (ft::quantize_q8_0, the block of the e8m0 scales), `vpdpbusd` into exact int32 block sums.
// Chosen where cpuid has avx512vnni and avx512vbmi (FT_CPU_MXFP4_W4A8, see quant.cpp).
//
// Per step two K rows kb, kb + 1 (64 bytes of each per line): `vpunpck{l,h}bw` pairs the bytes of
// a column into one word, whose four nibbles are its weights at k = 2kb .. 2kb + 3 in order; one
// `vpmultishiftqb` per 16 columns moves each nibble to the low bits of its own byte (two columns
// per qword; the upper bits hold the next nibble) and one `vpermb` (a 64-entry table, the 16 codes
// four times, so those upper bits do not matter) makes the unsigned bytes u = 2 * e2m1 + 12 in
// [0, 24]. Lane = one column x 4 consecutive k, multiplied by the broadcast 4 activation bytes:
// 2 shuffles + 1 `vpdpbusd` per 64 weights (the W4A16 VBMI kernel: 2 shuffles + 1 `vdpbf16ps`
// per 32), plus one unpack per 32 columns and 2 rows. The int32 block sums start at
// -12 * sum(q) of the block (the offset of u), so after 8 steps each lane is exactly
// sum(2 * e2m1 * q) over the block's 32 k; then fp32: (sum * d / 2) * e8m0, one FMA per block.
#include "immintrin_avx512.hpp"

#include <cstring>

#include "kernels.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu::detail {
namespace {

#include "tier_tiles.inc"

#include "tier_avx512.inc"

// Column (within a line) of lane l of group g: groups 0, 1 come from the low unpack (columns
// 8 .. 15 of each 16 excluded), 2, 3 from the high one; even groups take words 0, 1 of each
// qword of the unpacked vector, odd groups words 2, 3.
constexpr int column_of(int g, int l) {
    return 16 * (l >> 2) + 8 * (g >> 1) + 4 * ((l >> 1) & 1) + 2 * (g & 1) + (l & 1);
}

// vpermb indices putting the scale byte of lane l's column into byte 4l (the others masked).
alignas(64) const struct SIdx {
    uint8_t v[4][64];
    constexpr SIdx() : v() {
        for (int g = 0; g < 4; ++g)
            for (int l = 0; l < 16; ++l) v[g][4 * l] = uint8_t(column_of(g, l));
    }
} kSidx;

// One token, NL lines (64 columns each), all four groups of each line. Every column's lane sees
// the same operations whatever NL.
template <int NL>
void tile(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int64_t qbytes, float *out,
          size_t ldo, int pf_rows, int pf_span) {
    constexpr int NT = 1, NG = 4, G0 = 0;
    const int64_t K = m.K, N = m.N, nb = K / 32;
    const __m512i lut = _mm512_loadu_si512(g_e2m1_u8x64);
    // Bit offsets of the nibbles of words 0, 1 (even groups) and 2, 3 (odd) of each qword.
    const __m512i ctrl_a = _mm512_set1_epi64(0x1c1814100c080400ll), ctrl_b = _mm512_set1_epi64(0x3c3834302c282420ll);
    __mmask64 mask[NL];
    for (int l = 0; l < NL; ++l) {
        const int cl = count - 64 * l;
        mask[l] = cl >= 64 ? ~__mmask64(0) : cl <= 0 ? __mmask64(0) : (__mmask64(1) << cl) - 1;
    }
    __m512 acc[NT][NL * NG];
#pragma GCC unroll 2
    for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
        for (int g = 0; g < NL * NG; ++g) acc[t][g] = _mm512_setzero_ps();
    const uint8_t *row = m.data + first;
    for (int64_t b = 0; b < nb; ++b) {
        // hi: sums with the high halves q1, lo: with the residuals q2, each starting at its
        // block's -12 * sum(q).
        __m512i hi[NT][NL * NG], lo[NT][NL * NG];
        __m512 dt[NT];
#pragma GCC unroll 2
        for (int t = 0; t < NT; ++t) {
            const uint8_t *a = act[t] + 2 * qbytes;
            int32_t c1, c2;
            float d;
            std::memcpy(&d, a + 4 * b, 4);
            std::memcpy(&c1, a + 4 * nb + 8 * b, 4);
            std::memcpy(&c2, a + 4 * nb + 8 * b + 4, 4);
            dt[t] = _mm512_set1_ps(d);
#pragma GCC unroll 8
            for (int g = 0; g < NL * NG; ++g) hi[t][g] = _mm512_set1_epi32(c1), lo[t][g] = _mm512_set1_epi32(c2);
        }
        for (int s = 0; s < 8; ++s, row += 2 * N) {
            const int64_t kb = 16 * b + 2 * s;
            if (pf_rows && kb + pf_rows + 1 < K / 2) {
                const char *pr = reinterpret_cast<const char *>(row + pf_rows * N);
                for (int r = 0; r < 2; ++r, pr += N) {
                    for (int o = 0; o < pf_span; o += 64) _mm_prefetch(pr + o, _MM_HINT_T1);
                    _mm_prefetch(pr + pf_span - 1, _MM_HINT_T1);
                }
            }
            __m512i x1[NT], x2[NT];
#pragma GCC unroll 2
            for (int t = 0; t < NT; ++t) {
                int32_t q4;
                std::memcpy(&q4, act[t] + 2 * kb, 4);
                x1[t] = _mm512_set1_epi32(q4);
                std::memcpy(&q4, act[t] + qbytes + 2 * kb, 4);
                x2[t] = _mm512_set1_epi32(q4);
            }
#pragma GCC unroll 2
            for (int l = 0; l < NL; ++l) {
                const __m512i v0 = _mm512_maskz_loadu_epi8(mask[l], row + 64 * l);
                const __m512i v1 = _mm512_maskz_loadu_epi8(mask[l], row + N + 64 * l);
                __m512i u[2];
                if (G0 < 2) u[0] = _mm512_unpacklo_epi8(v0, v1);
                if (G0 + NG > 2) u[1] = _mm512_unpackhi_epi8(v0, v1);
#pragma GCC unroll 4
                for (int gi = 0; gi < NG; ++gi) {
                    const int g = G0 + gi;
                    const __m512i w =
                        _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(g & 1 ? ctrl_b : ctrl_a, u[g >> 1]), lut);
#pragma GCC unroll 2
                    for (int t = 0; t < NT; ++t) {
                        hi[t][l * NG + gi] = _mm512_dpbusd_epi32(hi[t][l * NG + gi], w, x1[t]);
                        lo[t][l * NG + gi] = _mm512_dpbusd_epi32(lo[t][l * NG + gi], w, x2[t]);
                    }
                }
            }
        }
#pragma GCC unroll 2
        for (int l = 0; l < NL; ++l) {
            const __m512i sv = _mm512_maskz_loadu_epi8(mask[l], m.scale + b * N + first + 64 * l);
#pragma GCC unroll 4
            for (int gi = 0; gi < NG; ++gi) {
                const __m512 s = e8m0x16(_mm512_maskz_permutexvar_epi8(
                    0x1111111111111111ull, _mm512_load_si512(kSidx.v[G0 + gi]), sv));
#pragma GCC unroll 2
                for (int t = 0; t < NT; ++t) {
                    // 256 * hi + lo: exact in int32 and, below 2^24, in the fp32 convert.
                    const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(hi[t][l * NG + gi], 8), lo[t][l * NG + gi]);
                    // (sum * d) * e8m0: the power-of-two scale last, in the FMA (a product s * d
                    // formed first is subnormal for small codes, which made this loop 20 %
                    // slower on the dev box with the benchmark's scale bytes).
                    acc[t][l * NG + gi] =
                        _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), dt[t]), s, acc[t][l * NG + gi]);
                }
            }
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; ++t) {
        alignas(64) float lanes[NL * NG * 16];
#pragma GCC unroll 8
        for (int g = 0; g < NL * NG; ++g) _mm512_store_ps(lanes + 16 * g, acc[t][g]);
        for (int li = 0; li < NL; ++li)
            for (int gi = 0; gi < NG; ++gi)
                for (int l = 0; l < 16; ++l) {
                    const int c = 64 * li + column_of(G0 + gi, l);
                    if (c < count) out[t * ldo + c] = lanes[16 * (li * NG + gi) + l];
                }
    }
}

// Calls of several tokens: the x16 form of the same activation (256 q1 + q2 per element) times
// the weights as int16 2 * e2m1 (`vpermw` from g_e2m1_i16x32), `vpdpwssd` into exact int32 block
// sums, so each column's sum, and all fp32 operations on it, are those of the one-token tile
// above: the results are bitwise the same whatever the token count. A lane (mxfp4_vbmi_column)
// holds its column's words at k = 2kb, 2kb + 1, as in the W4A16 VBMI kernel; a 32-bit broadcast
// of the token's x16 pair multiplies it. One pass over a tile of up to 64 columns computes its
// groups G0 .. G0 + NG - 1 (tile_x16_passes chooses them).
template <int NT, int NG, int G0>
void tile_x16(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int64_t qbytes, float *out,
              size_t ldo, int pf_rows) {
    const int64_t K = m.K, N = m.N, nb = K / 32;
    const __m512i lut = _mm512_loadu_si512(g_e2m1_i16x32);
    const __mmask64 mask = count >= 64 ? ~__mmask64(0) : (__mmask64(1) << count) - 1;
    __m512i ctrl[NG], sidx[NG];
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) mxfp4_vbmi_group(G0 + g, ctrl[g], sidx[g]);
    __m512 acc[NT][NG];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t)
#pragma GCC unroll 4
        for (int g = 0; g < NG; ++g) acc[t][g] = _mm512_setzero_ps();
    const uint8_t *row = m.data + first;
    for (int64_t b = 0; b < nb; ++b) {
        __m512i sum[NT][NG];
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t)
#pragma GCC unroll 4
            for (int g = 0; g < NG; ++g) sum[t][g] = _mm512_setzero_si512();
        for (int64_t kb = 16 * b; kb < 16 * b + 16; ++kb, row += N) {
            if (pf_rows && kb + pf_rows < K / 2) {
                // The lines of the tile's span pf_rows K rows ahead (one more where not 64-aligned).
                const char *pr = reinterpret_cast<const char *>(row + pf_rows * N);
                _mm_prefetch(pr, _MM_HINT_T1);
                _mm_prefetch(pr + count - 1, _MM_HINT_T1);
            }
            const __m512i v = _mm512_maskz_loadu_epi8(mask, row);
            __m512i xp[NT];
#pragma GCC unroll 8
            for (int t = 0; t < NT; ++t) {
                int32_t pair;
                std::memcpy(&pair, act[t] + 4 * kb, 4);
                xp[t] = _mm512_set1_epi32(pair);
            }
#pragma GCC unroll 4
            for (int g = 0; g < NG; ++g) {
                const __m512i w = _mm512_permutexvar_epi16(_mm512_multishift_epi64_epi8(ctrl[g], v), lut);
#pragma GCC unroll 8
                for (int t = 0; t < NT; ++t) sum[t][g] = _mm512_dpwssd_epi32(sum[t][g], w, xp[t]);
            }
        }
        __m512 dt[NT];  // each token's d / 512 of block b
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
            float d;
            std::memcpy(&d, act[t] + 4 * qbytes + 4 * b, 4);
            dt[t] = _mm512_set1_ps(d);
        }
        const __m512i sv = _mm512_maskz_loadu_epi8(mask, m.scale + b * N + first);
#pragma GCC unroll 4
        for (int g = 0; g < NG; ++g) {
            const __m512 s = e8m0x16(_mm512_maskz_permutexvar_epi8(0x1111111111111111ull, sidx[g], sv));
#pragma GCC unroll 8
            for (int t = 0; t < NT; ++t)  // as the one-token tile: (sum * d) * e8m0, the power of two last
                acc[t][g] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum[t][g]), dt[t]), s, acc[t][g]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
        alignas(64) float lanes[NG * 16];
#pragma GCC unroll 4
        for (int g = 0; g < NG; ++g) _mm512_store_ps(lanes + 16 * g, acc[t][g]);
        for (int g = 0; g < NG; ++g)
            for (int l = 0; l < 16; ++l) {
                const int c = mxfp4_vbmi_column(G0 + g, l);
                if (c < count) out[t * ldo + c] = lanes[16 * g + l];
            }
    }
}

// NT tokens on one tile of up to 64 columns: up to 4 tokens in one pass over its lines (the
// block totals live in memory between blocks), 5 to 8 in two passes of two groups each, the
// second reading what the first brought into L2 (one pass with four groups, or four with one:
// 31 % and 10 % slower at 8 tokens, `kernel_mxfp4` on the dev box).
template <int NT>
void tile_x16_passes(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int64_t qbytes,
                     float *out, size_t ldo, int pf_rows) {
    if constexpr (NT <= 4) {
        tile_x16<NT, 4, 0>(m, first, count, act, qbytes, out, ldo, pf_rows);
    } else {
        tile_x16<NT, 2, 0>(m, first, count, act, qbytes, out, ldo, pf_rows);
        tile_x16<NT, 2, 2>(m, first, count, act, qbytes, out, ldo, 0);
    }
}

}  // namespace

// The W4A8 x2 activation (mxfp4_q8_act_bytes) with the same fp32 operations as
// ft::quantize_q8_0 + mxfp4_residual_q8 (the kernel test compares the bytes): x * (1 / d), the
// residual x - q1 * d as a rounded product and a difference (no FMA: this function is built
// without contraction, see below).
// (clang: the intrinsics' products and sums are separate inline functions, never contracted.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
void prepare_mxfp4_q8x2_avx512(const uint16_t *x, int64_t K, uint8_t *dst) {
    const int64_t qbytes = (K + 63) / 64 * 64, nb = K / 32;
    int16_t *x16 = reinterpret_cast<int16_t *>(dst);  // 256 q1 + q2, for calls of several tokens
    std::memset(x16 + K, 0, size_t(qbytes - K) * 2);
    dst += 2 * qbytes;
    int8_t *q1 = reinterpret_cast<int8_t *>(dst), *q2 = q1 + qbytes;
    const __m512 lim = _mm512_set1_ps(127.0f);
    for (int64_t b = 0; b < nb; ++b) {
        __m512 v[2], q[2];
        const float d = q8_0_block(x + 32 * b, v, q), inv = 1.0f / d;
        const __m512 vd = _mm512_set1_ps(d), vinv2 = _mm512_set1_ps(256.0f * inv);
        __m512i s1 = _mm512_setzero_si512(), s2 = _mm512_setzero_si512();
        for (int h = 0; h < 2; ++h) {
            const __m512 a = q[h];
            const __m512 r = _mm512_sub_ps(v[h], _mm512_mul_ps(a, vd));
            // A non-finite block (d NaN) has zero residual codes, as mxfp4_residual_q8.
            const __m512 c = d != d ? _mm512_setzero_ps()
                                    : _mm512_min_ps(_mm512_max_ps(round_away(_mm512_mul_ps(r, vinv2)), -lim), lim);
            const __m512i ai = _mm512_cvtps_epi32(a), ci = _mm512_cvtps_epi32(c);
            _mm_storeu_si128(reinterpret_cast<__m128i *>(q1 + 32 * b + 16 * h), _mm512_cvtepi32_epi8(ai));
            _mm_storeu_si128(reinterpret_cast<__m128i *>(q2 + 32 * b + 16 * h), _mm512_cvtepi32_epi8(ci));
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(x16 + 32 * b + 16 * h),
                                _mm512_cvtepi32_epi16(_mm512_add_epi32(_mm512_slli_epi32(ai, 8), ci)));
            s1 = _mm512_add_epi32(s1, ai);
            s2 = _mm512_add_epi32(s2, ci);
        }
        const int32_t c[2] = {-12 * _mm512_reduce_add_epi32(s1), -12 * _mm512_reduce_add_epi32(s2)};
        const float ds = d / 512.0f;
        std::memcpy(dst + 2 * qbytes + 4 * b, &ds, 4);
        std::memcpy(dst + 2 * qbytes + 4 * nb + 8 * b, c, 8);
    }
    std::memset(q1 + K, 0, size_t(qbytes - K));
    std::memset(q2 + K, 0, size_t(qbytes - K));
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

// One token: tiles of 128 columns (both lines of a pair per step, as the W4A16 VBMI kernel),
// the last one of 64 where fewer are left; prefetch into L2 FT_CPU_PREFETCH / 8 K rows ahead, as
// there. Several tokens: tile_x16 per 64 columns, tokens in tiles of up to 8.
void mxfp4_avx512vnni_w4a8(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                           float *out, size_t ldo) {
    const int pf_rows = g_prefetch_bytes / 8;
    const int64_t qbytes = (m.K + 63) / 64 * 64;
    if (ntok != 1) {
        for (int c = 0; c < count; c += 64) {
            const int n = count - c < 64 ? count - c : 64;
            for_tiles<8>(ntok, [&](auto tile_n, int t) {
                tile_x16_passes<decltype(tile_n)::value>(m, first + c, n, act + t, qbytes, out + size_t(t) * ldo + c,
                                                         ldo, pf_rows);
            });
        }
        return;
    }
    const uint8_t *a = act[0] + 2 * qbytes;  // past the x16 form
    for (int c = 0; c < count; c += 128) {
        const int n = count - c < 128 ? count - c : 128;
        if (n > 64) tile<2>(m, first + c, n, &a, qbytes, out + c, ldo, pf_rows, n);
        else tile<1>(m, first + c, n, &a, qbytes, out + c, ldo, pf_rows, n);
    }
}

}  // namespace ft::cpu::detail
