// AVX-512-VNNI kernels: q4_0 x Q8_0 (W4A8, four blocks per step), nvfp4 / ds_fp4 W4A8 x2 (int16
// activations, below) and nvfp4 W4A8. In the W4A8 ones the nibbles u are unsigned bytes, the int8
// activation q signed ones; vpdpbusd adds sum(u * q) per 4 bytes to an accumulator preloaded with
// the offset correction (-8 * sum(q) for q4_0, the "sign trick", precomputed in the activation),
// so each int32 lane is exact. Then per lane: float(lane) * d_act * d_weight, in fp32.
#include "immintrin_avx512.hpp"

#include <cstring>

#include "kernels.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu::detail {

namespace {

#include "tier_tiles.inc"

#include "tier_scalar.inc"

#include "tier_avx512.inc"


// ---- q4_0: four blocks per step ---------------------------------------------------------------
//
// The qs bytes of 4 consecutive 18-byte blocks (72 bytes) sit at even offsets 18j + 2, so one
// `vpermt2w` over two loads packs them into one vector (block j at bytes 16j .. 16j + 15), one
// `vpermw` + `vcvtph2ps` spreads the 4 fp16 d to the lanes, and the low and high nibbles (and,
// shift + and) go through two `vpdpbusd` into the same int32 lanes: lane l = 8 elements of block
// l / 4, exactly sum((u - 8) * q) with the correction in the activation. Per 128 weights that is
// 2 loads, 2 permutes, 1 convert and 3 integer ops for the row and 2 `vpdpbusd` + convert + mul +
// FMA per token.
// Activation (q8_0_x4_act_bytes): per group of 128 elements, 256 bytes: q of elements 0..15 of
// blocks 0..3, q of elements 16..31 of blocks 0..3, int32 correction per lane, float d per lane
// (blocks past K: zeros).

inline __m512i x4_qs_index() {
    alignas(64) int16_t idx[32];
    for (int w = 0; w < 32; ++w) idx[w] = int16_t(9 * (w / 8) + 1 + w % 8);  // >= 32: second source
    return _mm512_load_si512(idx);
}

inline __m512i x4_d_index() {
    alignas(64) int16_t idx[32] = {};
    for (int l = 0; l < 16; ++l) idx[l] = int16_t(9 * (l / 4));
    return _mm512_load_si512(idx);
}

template <int R, int NT>
void rows_x4(const uint8_t *const *r, int64_t nb, const uint8_t *const *act, float *out, size_t ldo, const int *col,
             int pf) {
    const __m512i qidx = x4_qs_index(), didx = x4_d_index(), m4 = _mm512_set1_epi8(0x0f);
    __m512 acc[NT][R];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t)
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) acc[t][i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 4) {
        const int64_t left = nb - b;
        __m512i lo[R], hi[R];
        __m512 wd[R];
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) {
            const uint8_t *p = r[i] + b * 18;
            if (pf) _mm_prefetch(reinterpret_cast<const char *>(p) + pf, _MM_HINT_T0);
            __m512i v0, v1;
            if (left >= 4) {
                v0 = _mm512_loadu_si512(p);
                v1 = _mm512_maskz_loadu_epi16(0xf, p + 64);  // bytes 64 .. 71; no read past the row
            } else {
                v0 = _mm512_maskz_loadu_epi8((__mmask64(1) << (18 * left)) - 1, p);  // 18 * left <= 54
                v1 = _mm512_setzero_si512();
            }
            const __m512i qs = _mm512_permutex2var_epi16(v0, qidx, v1);
            lo[i] = _mm512_and_si512(qs, m4);
            hi[i] = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4);
            wd[i] = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(didx, v0)));
        }
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
            const uint8_t *a = act[t] + b * 64;  // 256 bytes per 4 blocks
            const __m512i ql = _mm512_loadu_si512(a), qh = _mm512_loadu_si512(a + 64);
            const __m512i cl = _mm512_loadu_si512(a + 128);
            const __m512 dl = _mm512_loadu_ps(reinterpret_cast<const float *>(a + 192));
#pragma GCC unroll 4
            for (int i = 0; i < R; ++i) {
                const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(cl, lo[i], ql), hi[i], qh);
                acc[t][i] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), dl), wd[i], acc[t][i]);
            }
        }
    }
    for (int t = 0; t < NT; ++t)
        for (int i = 0; i < R; ++i) out[t * ldo + col[i]] = _mm512_reduce_add_ps(acc[t][i]);
}

}  // namespace

// The four-block activation (q8_0_x4_act_bytes) with ft::quantize_q8_0's fp32 operations per block
// (amax, d = amax / 127, x * (1 / d) rounded half away from zero, clamped), the per-lane sums by
// `vpdpbusd` with ones. Byte-identical to the scalar definition (tested); 11 us -> ~1 us for
// K = 2816 on the dev box, which matters at bs = 1, where one worker prepares the token while the
// others wait.
void prepare_q8_0_x4_avx512(const uint16_t *x, int64_t K, uint8_t *dst) {
    const int64_t nb = K / 32;
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t g = 0; g < nb; g += 4) {
        uint8_t *o = dst + g * 64;
        alignas(64) float dl[16] = {};
        _mm512_storeu_si512(o, _mm512_setzero_si512());
        _mm512_storeu_si512(o + 64, _mm512_setzero_si512());
        for (int j = 0; j < 4 && g + j < nb; ++j) {
            __m512 v[2], q[2];
            const float d = q8_0_block(x + (g + j) * 32, v, q);
            for (int h = 0; h < 2; ++h)
                _mm_storeu_si128(reinterpret_cast<__m128i *>(o + 64 * h + 16 * j), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(q[h])));
            for (int l = 0; l < 4; ++l) dl[4 * j + l] = d;
        }
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(o)),
                                              ones, _mm512_loadu_si512(o + 64));
        _mm512_storeu_si512(o + 128, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s, 3)));
        _mm512_storeu_si512(o + 192, _mm512_load_si512(dl));
    }
}

void q4_0_avx512vnni_x4(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                        float *out, size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t nb = m.K / 32;
    if (ntok <= 2) {
        // Rows j, j + q, j + 2q, j + 3q (four streams; hot 29.3 -> 31.5 GB/s on the dev box with
        // one token), then the rest in pairs / alone below. 3-4 tokens: pairs (registers).
        const int qr = count / 4;
        for (int j = 0; j < qr; ++j) {
            const int cols[4] = {j, j + qr, j + 2 * qr, j + 3 * qr};
            const uint8_t *rp[4];
            for (int i = 0; i < 4; ++i) rp[i] = m.data + (first + cols[i]) * nb * 18;
            if (ntok == 2) rows_x4<4, 2>(rp, nb, act, out, ldo, cols, pf);
            else rows_x4<4, 1>(rp, nb, act, out, ldo, cols, pf);
        }
        const int done = 4 * qr;
        first += done, count -= done, out += done;
    }
    // Row j with row j + half (two streams), then the odd row alone.
    for_row_pairs(count, [&](const int R, const int *cols) {
        const uint8_t *rp[2];
        for (int i = 0; i < R; ++i) rp[i] = m.data + (first + cols[i]) * nb * 18;
        for_token_tiles(ntok, [&](auto tile_n, int t) {
            using NT = decltype(tile_n);
            if (R == 2) rows_x4<2, NT::value>(rp, nb, act + t, out + t * ldo, ldo, cols, pf);
            else rows_x4<1, NT::value>(rp, nb, act + t, out + t * ldo, ldo, cols, pf);
        });
    });
}

namespace {

// ---- nvfp4 / ds_fp4 W4A8 x2 (e2m1_x16z_act_bytes) -------------------------------------------
//
// The AVX2 tier's x16 kernel (quant_avx2_unit.inc) on 512-bit vectors: per 128 elements (64
// packed bytes) of a row, two `vpshufb` of the int8 table of 2 * value give the even and the odd
// elements' bytes, and a shift or a mask moves them into the high byte of a word: int16 256 x
// (2 * value), vector g word k element 4k + {0, 2, 1, 3}[g]. Per token two `vpmaddwd` + `vpdpwssd`
// pairs and an add sum the four vectors exactly in int32: lane l holds elements 8l .. 8l + 7 (nvfp4
// block l / 2 of 16, ds_fp4 block l / 4 of 32). Then per lane (sum * block scale * d / 512) in
// fp32, g / 256 per row. The activation holds vector g of both 64s of each 128 in one 64-byte
// line (x16z order).
template <int B, int NT, int R>
void e2m1_x16z_rows(const uint8_t *const p[R], const uint8_t *const sc[R], const float g[R], int64_t K,
                    const uint8_t *const *act, float *const out[R], size_t ldo, int pf, bool biased) {
    const int64_t kp = (K + 127) / 128 * 128;
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
    const __m512i m15 = _mm512_set1_epi8(15), high = _mm512_set1_epi16(int16_t(0xff00));
    const __m512 sub = _mm512_loadu_ps(g_e4m3);
    // Lane -> scale of the 128 elements: nvfp4 block l / 2 of 16, ds_fp4 block l / 4 of 32.
    const __m512i idx = B == 16 ? _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)
                                : _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const int16_t *xa[NT];
    const float *dv[NT];
    __m512 acc[R][NT];
    for (int t = 0; t < NT; ++t) {
        xa[t] = reinterpret_cast<const int16_t *>(act[t]);
        dv[t] = reinterpret_cast<const float *>(act[t] + 2 * kp);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_setzero_ps();
    }
    // The block scales are decoded 16 at a time: nvfp4's of 256 elements (the second 128 take
    // lanes 8..15), ds_fp4's of 512 (128 q take lanes 4q..4q + 3).
    __m512 s16[R];
    for (int64_t c = 0; c < K; c += 128) {
        const bool whole = c + 128 <= K;
        const int part = B == 16 ? int((c >> 7) & 1) : int((c >> 7) & 3);  // the 128's place in its 256 / 512
        const __m512i ip = part ? _mm512_add_epi32(idx, _mm512_set1_epi32((B == 16 ? 8 : 4) * part)) : idx;
        for (int r = 0; r < R; ++r) {
            const uint8_t *wp = p[r] + c / 2;
            if (pf) _mm_prefetch(reinterpret_cast<const char *>(wp) + pf, _MM_HINT_T0);
            const __m512i v =
                whole ? _mm512_loadu_si512(wp) : _mm512_maskz_loadu_epi8((__mmask64(1) << ((K - c) / 2)) - 1, wp);
            if (part == 0) {
                const int64_t left = (K - c) / B;
                const __mmask16 ms = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
                if constexpr (B == 16) {
                    s16[r] = e4m3x16(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(ms, sc[r] + c / 16)), sub);
                } else {
                    const __m512i codes = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(ms, sc[r] + c / 32));
                    if (biased) {  // 2^(code - 95) = (code + 32) << 23, NaN above 190 (e8m0_biased)
                        s16[r] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(codes, _mm512_set1_epi32(32)), 23));
                        s16[r] = _mm512_mask_mov_ps(s16[r], _mm512_cmpgt_epi32_mask(codes, _mm512_set1_epi32(190)),
                                                    _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
                    } else {
                        s16[r] = e8m0x16(codes);
                    }
                }
            }
            const __m512 sl = _mm512_permutexvar_ps(ip, s16[r]);
            const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, m15));
            const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), m15));
            const __m512i w0 = _mm512_slli_epi16(lo, 8), w1 = _mm512_and_si512(lo, high);
            const __m512i w2 = _mm512_slli_epi16(hi, 8), w3 = _mm512_and_si512(hi, high);
            for (int t = 0; t < NT; ++t) {
                const int16_t *x = xa[t] + c;  // 4 x 32 int16 per 128 elements
                // Two chains of two, then one add: half the latency of one chain of four.
                const __m512i s01 = _mm512_dpwssd_epi32(_mm512_madd_epi16(w0, _mm512_loadu_si512(x)), w1, _mm512_loadu_si512(x + 32));
                const __m512i s23 = _mm512_dpwssd_epi32(_mm512_madd_epi16(w2, _mm512_loadu_si512(x + 64)), w3, _mm512_loadu_si512(x + 96));
                const __m512i sum = _mm512_add_epi32(s01, s23);
                const __m512 d = _mm512_loadu_ps(dv[t] + c / 8);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(sl, d), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        const float gr = g[r] * 0x1p-8f;  // the weights came x 256
        for (int t = 0; t < NT; ++t)
            out[r][t * ldo] = _mm512_reduce_add_ps(acc[r][t]) * gr;
    }
}

// Rows [first, first + count) in pairs (j, j + count / 2), each pair for all tokens in tiles of up
// to 8: the pair shares each activation load, so a tile's activations, which outgrow L1 at large
// K, cross from L2 once per two rows. ds_fp4 with the biased factors first, then its rows with an
// output that is not finite again with the absolute ones.
template <int B>
void e2m1_x16z_gemv(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                    size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t K = m.K;
    auto row_of = [&](int j, bool biased, const uint8_t *&p, const uint8_t *&sc, float &g) {
        const int64_t r = first + j;
        p = m.data + r * (K / 2), sc = m.scale + r * (K / B);
        g = B == 16 ? f16(m.global + r * 2) : biased ? kUnbias : 1.0f;
    };
    auto rows = [&](int j0, int n, bool biased) {
        for_row_pairs(n, [&](int R, const int *cols) {
            const uint8_t *p[2], *sc[2];
            float g[2];
            for (int i = 0; i < R; ++i) row_of(j0 + cols[i], biased, p[i], sc[i], g[i]);
            for_tiles<8>(ntok, [&](auto tile_n, int t) {
                constexpr int NT = decltype(tile_n)::value;
                float *const o[2] = {out + t * ldo + j0 + cols[0], out + t * ldo + j0 + cols[R - 1]};
                if (R == 1) e2m1_x16z_rows<B, NT, 1>(p, sc, g, K, act + t, o, ldo, pf, biased);
                else e2m1_x16z_rows<B, NT, 2>(p, sc, g, K, act + t, o, ldo, pf, biased);
            });
        });
    };
    constexpr bool kBiased = B == 32;
    rows(0, count, kBiased);
    if constexpr (kBiased)
        for (int j = 0; j < count; ++j)
            if (!outputs_finite(out + j, ldo, 1, ntok)) rows(j, 1, false);
}

}  // namespace

void nvfp4_avx512vnni_x16(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                          float *out, size_t ldo) {
    e2m1_x16z_gemv<16>(m, first, count, act, ntok, out, ldo);
}

void ds_fp4_avx512vnni_x16(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                           float *out, size_t ldo) {
    e2m1_x16z_gemv<32>(m, first, count, act, ntok, out, ldo);
}

namespace {

// ---- nvfp4 W4A8 (FT_CPU_NVFP4_W4A8) -----------------------------------------------------------
//
// Chunk of 128 elements = 64 packed bytes: the low nibbles (and) are the even elements, the high
// ones (shift + and) the odd ones; one `vpshufb` each maps a code to u = 2 * e2m1 + 12 in
// [0, 24] (exact), and two `vpdpbusd` with the activation's even / odd q vectors into one
// int32 lane per 8 elements (half an nvfp4 block), started at the lane's -12 * sum(q): exactly
// sum(2 * e2m1 * q) per lane. Then per lane (sum * d / 2) * e4m3 scale, one mul + one FMA, and
// the fp16 global per row at the end. Per 128 weights: 2 ands, a shift, 2 `vpshufb` (+ the scale
// spread) for the row, 2 `vpdpbusd` + convert + mul + FMA per token (W4A16: 3 shifts, 4 `vpermw`
// for the row, 4 `vdpbf16ps` + FMA per token). Activation: nvfp4_q8_act_bytes.
template <int R, int NT>
void nvfp4_w4a8_rows(const uint8_t *const *p, const uint8_t *const *sc, int64_t K, const uint8_t *const *act,
                     float *out, size_t ldo, const int *col, const float *row_scale, int pf) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i *>(g_e2m1_u8x64)));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512 sub = _mm512_loadu_ps(g_e4m3);
    const __m512i idx0 = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    __m512 acc[NT][R];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t)
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
    for (int64_t c0 = 0; c0 < K; c0 += 256) {
        const int64_t left = K - c0;
        const int ns = int(left >= 256 ? 16 : left / 16);
        __m512 s16[R];
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r)
            s16[r] = e4m3x16(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(__mmask16((1u << ns) - 1), sc[r] + c0 / 16)), sub);
        for (int q = 0; q < 2; ++q) {
            const int64_t c = c0 + 128 * q;
            if (c >= K) break;
            const __m512i sidx = _mm512_add_epi32(idx0, _mm512_set1_epi32(8 * q));
            __m512i lo[R], hi[R];
            __m512 s[R];
#pragma GCC unroll 2
            for (int r = 0; r < R; ++r) {
                if (pf) _mm_prefetch(reinterpret_cast<const char *>(p[r] + c / 2) + pf, _MM_HINT_T0);
                __m512i v;
                if (c + 128 <= K) v = _mm512_loadu_si512(p[r] + c / 2);
                else v = _mm512_maskz_loadu_epi8((__mmask64(1) << ((K - c) / 2)) - 1, p[r] + c / 2);
                lo[r] = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, m4));
                hi[r] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
                s[r] = _mm512_permutexvar_ps(sidx, s16[r]);
            }
#pragma GCC unroll 4
            for (int t = 0; t < NT; ++t) {
                const uint8_t *a = act[t] + 2 * c;  // 256 bytes per 128 elements
                const __m512i qe = _mm512_loadu_si512(a), qo = _mm512_loadu_si512(a + 64);
                const __m512i cl = _mm512_loadu_si512(a + 128);
                const __m512 dl = _mm512_loadu_ps(reinterpret_cast<const float *>(a + 192));
#pragma GCC unroll 2
                for (int r = 0; r < R; ++r) {
                    const __m512i i32 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(cl, lo[r], qe), hi[r], qo);
                    acc[t][r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(i32), dl), s[r], acc[t][r]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t)
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) out[t * ldo + col[r]] = _mm512_reduce_add_ps(acc[t][r]) * row_scale[r];
}

}  // namespace

void nvfp4_avx512vnni_w4a8(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                           float *out, size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t K = m.K;
    // Row j with row j + half (two streams), then the odd row alone, as the avx512bf16 kernel.
    for_row_pairs(count, [&](const int R, const int *cols) {
        const uint8_t *pp[2], *sp[2];
        float g[2];
        for (int r = 0; r < R; ++r) {
            const int64_t row = first + cols[r];
            pp[r] = m.data + row * (K / 2);
            sp[r] = m.scale + row * (K / 16);
            g[r] = f16(m.global + row * 2);
        }
        for_token_tiles(ntok, [&](auto tile_n, int t) {
            using NT = decltype(tile_n);
            if (R == 2) nvfp4_w4a8_rows<2, NT::value>(pp, sp, K, act + t, out + t * ldo, ldo, cols, g, pf);
            else nvfp4_w4a8_rows<1, NT::value>(pp, sp, K, act + t, out + t * ldo, ldo, cols, g, pf);
        });
    });
}

}  // namespace ft::cpu::detail
