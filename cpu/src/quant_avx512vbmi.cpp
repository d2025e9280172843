// AVX-512-BF16 + AVX-512-VBMI kernel of mxfp4 (gpt-oss transposed layout, W4A16, bf16
// activations). Chosen on the avx512bf16 tier when the CPU also has VBMI (Ice Lake and later,
// Sapphire Rapids, Zen 4; not Cooper Lake, which keeps quant_avx512bf16.cpp's kernel).
//
// A tile is 64 columns (one cache line of each K row) x up to 2 tokens in one pass, or 3-4 tokens
// in two passes of half its columns each (see two_passes). Per K row the 64 bytes
// are loaded once, and each group of 16 columns takes two shuffles: one `vpmultishiftqb` picks,
// inside every qword (8 columns), the two bytes of columns 8q + 2g and 8q + 2g + 1 and their high
// nibbles into the low bits of four words (word 2i: byte, word 2i + 1: byte >> 4; bits above the
// nibble are the next nibble, which the table ignores: it repeats the 16 codes), and one `vpermw`
// turns the words into bf16 e2m1 values. So lane 2q + r of group g holds the pair
// (W[n, 2kb], W[n, 2kb + 1]) of column n = 8q + 2g + r, multiplied by the broadcast activation
// pair with one `vdpbf16ps`. (The previous kernel spent a zero-extension, a shift and an or per
// 16 columns on top.) The e8m0 scales per 32 K are spread to the same lane order by a zero-masked
// `vpermb` and applied to the block sums; the lanes are put back in column order at the end.
// One token and more than 64 columns: two lines (128 columns) per K row step, so both halves of
// a 128-byte pair are requested together (the adjacent-line prefetchers fetch them as a pair).
#include "immintrin_avx512.hpp"

#include <cstring>

#include "kernels.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu::detail {
namespace {

inline __m512 dp(__m512 acc, __m512i a, __m512i b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }

#include "tier_avx512.inc"

// Groups G0 .. G0 + NG - 1 of the tile (NG = 4: all 64 columns; NG = 2 with G0 = 0 or 2: the
// columns with n % 8 < 4 or >= 4, so four tokens' block sums fit the registers). Every column's
// lane sees the same operations whatever NT, NG and G0, so the results do not depend on them.
// NL = 2 (one token only, or the registers spill): two adjacent lines of each K row per pass,
// columns 64 .. 127 in the second, both lines of a 128-byte pair requested together.
template <int NT, int NG = 4, int G0 = 0, int NL = 1>
void tile(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, float *out, size_t ldo,
          int pf_rows, int pf_span) {
    const int64_t K = m.K, N = m.N;
    const __m512i lut = _mm512_loadu_si512(g_e2m1_bf16x32);
    __mmask64 mask[NL];
    for (int l = 0; l < NL; ++l) {
        const int cl = count - 64 * l;
        mask[l] = cl >= 64 ? ~__mmask64(0) : cl <= 0 ? __mmask64(0) : (__mmask64(1) << cl) - 1;
    }
    __m512i ctrl[NG], sidx[NG];
    #pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) mxfp4_vbmi_group(G0 + g, ctrl[g], sidx[g]);
    __m512 acc[NT][NL * NG];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; ++t)
        #pragma GCC unroll 8
        for (int g = 0; g < NL * NG; ++g) acc[t][g] = _mm512_setzero_ps();
    const uint8_t *row = m.data + first;
    for (int64_t kb0 = 0; kb0 < K / 2; kb0 += 16) {
        __m512 blk[NT][NL * NG];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; ++t)
            #pragma GCC unroll 8
            for (int g = 0; g < NL * NG; ++g) blk[t][g] = _mm512_setzero_ps();
        for (int64_t kb = kb0; kb < kb0 + 16; ++kb, row += N) {
            if (pf_rows && pf_span && kb + pf_rows < K / 2) {
                // The lines of [pr, pr + pf_span): a tile not 64-aligned spans one more.
                const char *pr = reinterpret_cast<const char *>(row + pf_rows * N);
                for (int o = 0; o < pf_span; o += 64) _mm_prefetch(pr + o, _MM_HINT_T1);
                _mm_prefetch(pr + pf_span - 1, _MM_HINT_T1);
            }
            __m512i v[NL];
            #pragma GCC unroll 2
            for (int l = 0; l < NL; ++l) v[l] = _mm512_maskz_loadu_epi8(mask[l], row + 64 * l);
            __m512i xp[NT];
            #pragma GCC unroll 4
            for (int t = 0; t < NT; ++t) {
                uint32_t pair;
                std::memcpy(&pair, act[t] + 4 * kb, 4);
                xp[t] = _mm512_set1_epi32(int(pair));
            }
            #pragma GCC unroll 2
            for (int l = 0; l < NL; ++l)
                #pragma GCC unroll 4
                for (int g = 0; g < NG; ++g) {
                    const __m512i wv =
                        _mm512_permutexvar_epi16(_mm512_multishift_epi64_epi8(ctrl[g], v[l]), lut);
                    #pragma GCC unroll 4
                    for (int t = 0; t < NT; ++t) blk[t][l * NG + g] = dp(blk[t][l * NG + g], wv, xp[t]);
                }
        }
        #pragma GCC unroll 2
        for (int l = 0; l < NL; ++l) {
            const __m512i sv = _mm512_maskz_loadu_epi8(mask[l], m.scale + (kb0 / 16) * N + first + 64 * l);
            #pragma GCC unroll 4
            for (int g = 0; g < NG; ++g) {
                const __m512 s = e8m0x16(_mm512_maskz_permutexvar_epi8(0x1111111111111111ull, sidx[g], sv));
                #pragma GCC unroll 4
                for (int t = 0; t < NT; ++t)
                    acc[t][l * NG + g] = _mm512_fmadd_ps(blk[t][l * NG + g], s, acc[t][l * NG + g]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
        alignas(64) float lanes[NL * 64];
        #pragma GCC unroll 8
        for (int g = 0; g < NL * NG; ++g) _mm512_store_ps(lanes + 16 * g, acc[t][g]);
        for (int li = 0; li < NL; ++li)
            #pragma GCC unroll 4
            for (int g = 0; g < NG; ++g)
                for (int l = 0; l < 16; ++l) {
                    const int c = 64 * li + mxfp4_vbmi_column(G0 + g, l);
                    if (c < count) out[t * ldo + c] = lanes[16 * (li * NG + g) + l];
                }
    }
}

// Three or four tokens: two passes over the tile's lines (the second from L2), each decoding half
// the groups once for all of them (their block sums fit the registers).
template <int NT>
void two_passes(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, float *out, size_t ldo,
                int pf_rows, int pf_span) {
    tile<NT, 2, 0>(m, first, count, act, out, ldo, pf_rows, pf_span);
    tile<NT, 2, 2>(m, first, count, act, out, ldo, pf_rows, pf_span);
}

}  // namespace

// Tiles of 64 columns and up to 4 tokens (a group of 4 tokens, then the rest: 3 tokens in two
// passes, 2 or 1 in one). The K rows of a tile are N bytes apart, so the hardware
// prefetchers do not follow them: software prefetch into L2 (more misses in flight than L1 takes)
// FT_CPU_PREFETCH / 8 rows ahead, 64 at the default 512 (measured, cpu/README.md: 32 rows into L1
// gave 12.4 GB/s on 2 cores, 64 rows into L2 20.7).
void mxfp4_avx512vbmi(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                      float *out, size_t ldo) {
    const int pf_rows = g_prefetch_bytes / 8;
    for (int c = 0; c < count; c += 64) {
        if (ntok == 1 && count - c > 64) {
            // One token and at least two lines left: both lines of the pair in one pass.
            const int n2 = count - c < 128 ? count - c : 128;
            tile<1, 4, 0, 2>(m, first + c, n2, act, out + c, ldo, pf_rows, n2);
            c += 64;
            continue;
        }
        const int n = count - c < 64 ? count - c : 64;
        const int pf = n;
        for (int t = 0; t < ntok;) {
            const int r = ntok - t < 4 ? ntok - t : 4;
            const uint8_t *const *a = act + t;
            float *o = out + t * ldo + c;
            switch (r) {
                case 1: tile<1>(m, first + c, n, a, o, ldo, pf_rows, pf); break;
                case 2: tile<2>(m, first + c, n, a, o, ldo, pf_rows, pf); break;
                case 3: two_passes<3>(m, first + c, n, a, o, ldo, pf_rows, pf); break;
                default: two_passes<4>(m, first + c, n, a, o, ldo, pf_rows, pf); break;
            }
            t += r;
        }
    }
}

}  // namespace ft::cpu::detail
