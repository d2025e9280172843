// AVX2 + FMA + F16C kernels of the low-bit GGUF super-block formats q2_k, q3_k and iq4_xs over Q8_K
// activations (int8 q[K], one d per 256 repeated in float d[K/32]: the q8_0_act_bytes layout). Per super-block of 256 and
// block g (0..7) of 32 elements, which is also the activation's block, the 32 weights are decoded
// once per row into bytes and used for a tile of up to 8 tokens:
//   q2_k    u = (qs >> 2p) & 3 (0..3); w = d * sc * u - dmin * m per sub-block of 16;
//   q3_k    u = ((qs >> 2p) & 3) + 4 * hbit (0..7); w = d * sc * (u - 4), sc signed;
//   iq4_xs  w8 = kIq4nlValues[nibble] by `vpshufb`; w = d * (ls - 32) * w8 per sub-block of 32.
// Per token: `vpmaddubsw(u, q_act)` (iq4_xs: `vpmaddubsw(|w8|, sign(q_act, w8))`, pairs <= 32258),
// then `vpmaddwd` by the sub-block scales (int16, one per 16-lane half), summed in int32 over the
// super-block (exact), converted once and multiplied by the activation's d and the super-block's d.
// The offset terms of q2_k (-dmin * m) and q3_k (-4 * d * sc) need only the activation's sums per
// sub-block of 16: those (times the activation's d) are computed once per token for a chunk of K
// and dotted with the 16 offsets of each super-block (two FMAs per super-block and token).
// Only the fp32 summation order differs from the scalar definition (quant_gguf_scalar.cpp).
#include <immintrin.h>

#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu::detail {
namespace {

#include "tier_tiles.inc"

#include "tier_scalar.inc"

#include "tier_avx2.inc"

// 16 per-sub-block bytes as int16, even-numbered sub-blocks in the low 128-bit lane and odd ones
// in the high lane, so word_bcast<g> gives block g's two halves (sub-blocks 2g, 2g + 1) their scales.
inline __m256i even_odd16(__m128i v8, bool is_signed) {
    const __m128i eo = _mm_shuffle_epi8(v8, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    return is_signed ? _mm256_cvtepi8_epi16(eo) : _mm256_cvtepu8_epi16(eo);
}

// 16 sub-block int8 values -> two fp32 vectors times f, in the order of the per-token offset sums
// (offset_sums): [0 2 4 6 1 3 5 7], [8 10 12 14 9 11 13 15] (the low / high 16 elements of blocks
// 4j .. 4j + 3).
inline void offsets16(__m128i v8, bool is_signed, float f, __m256 &o0, __m256 &o1) {
    const __m128i v = _mm_shuffle_epi8(v8, _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
    const __m128i v1 = _mm_srli_si128(v, 8);
    const __m256 a = _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
    const __m256 b = _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(v1) : _mm256_cvtepu8_epi32(v1));
    const __m256 vf = _mm256_set1_ps(f);
    o0 = _mm256_mul_ps(a, vf), o1 = _mm256_mul_ps(b, vf);
}

// Each format: scales16 (the int16 sub-block scales of a super-block, one register for the whole
// super-block: block g's are word_bcast<g> of it), weights<g> (block g's 32 weights as bytes u, plus
// the signed levels w where the dot needs them), d, and offsets (the 16 offset factors, read again
// from the block after its 8 blocks so they hold no register meanwhile).

// q2_k (84 bytes): scales[16] (low nibble scale, high nibble min), qs[64], fp16 d, fp16 dmin.
struct Q2K {
    static constexpr int kBytes = 84;
    static constexpr bool kOffsets = true;
    static __m256i scales16(const uint8_t *b) {
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b));
        return even_odd16(_mm_and_si128(raw, _mm_set1_epi8(15)), false);
    }
    static float d(const uint8_t *b) { return f16(b + 80); }
    static void offsets(const uint8_t *b, __m256 &o0, __m256 &o1) {
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b));
        offsets16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)), false, -f16(b + 82), o0, o1);
    }
    template <int G>
    static __m256i weights(const uint8_t *b, __m256i &w) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b + 16 + 32 * (G / 4)));
        w = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (G % 4)), _mm256_set1_epi8(3));
        return w;
    }
    static __m256i dot(__m256i u, __m256i, __m256i sc, __m256i a) {
        return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), sc);
    }
};

// q3_k (110 bytes): hmask[32], qs[64], scales[12] (16 signed 6-bit, biased by 32), fp16 d.
struct Q3K {
    static constexpr int kBytes = 110;
    static constexpr bool kOffsets = true;
    static __m128i scales8(const uint8_t *b) {
        const __m128i m15 = _mm_set1_epi8(15);
        const __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(b + 96));
        const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(a, m15), _mm_and_si128(_mm_srli_epi16(a, 4), m15));
        // High 2 bits of scale i: bits 2 * (i / 4) of byte 8 + i % 4.
        const __m128i h = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(int(u32_at(b + 104))), _mm_setr_epi32(0, 2, 4, 6)),
                                        _mm_set1_epi8(3));
        return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(h, 4)), _mm_set1_epi8(32));
    }
    static __m256i scales16(const uint8_t *b) { return even_odd16(scales8(b), true); }
    static float d(const uint8_t *b) { return f16(b + 108); }
    static void offsets(const uint8_t *b, __m256 &o0, __m256 &o1) {
        offsets16(scales8(b), true, -4.0f * f16(b + 108), o0, o1);  // u - 4: the -4 of every element
    }
    template <int G>
    static __m256i weights(const uint8_t *b, __m256i &w) {
        constexpr int bit = 4 * (G / 4) + G % 4;
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b + 32 + 32 * (G / 4)));
        const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b));
        __m256i hb;
        if constexpr (bit >= 2) hb = _mm256_srli_epi16(hm, bit - 2);
        else hb = _mm256_slli_epi16(hm, 2 - bit);
        w = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * (G % 4)), _mm256_set1_epi8(3)),
                            _mm256_and_si256(hb, _mm256_set1_epi8(4)));
        return w;
    }
    static __m256i dot(__m256i u, __m256i, __m256i sc, __m256i a) {
        return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), sc);
    }
};

// iq4_xs (136 bytes): fp16 d, u16 scales_h, scales_l[4], qs[128] (16 bytes per block of 32: low
// nibbles elements 0..15, high nibbles 16..31).
struct IQ4XS {
    static constexpr int kBytes = 136;
    static constexpr bool kOffsets = false;
    // The 8 scales ls - 32 as int16 in both lanes (one per block of 32).
    static __m256i scales16(const uint8_t *b) {
        const __m128i m15 = _mm_set1_epi8(15);
        const __m128i a = _mm_cvtsi32_si128(int(u32_at(b + 4)));
        const __m128i lo = _mm_unpacklo_epi8(_mm_and_si128(a, m15), _mm_and_si128(_mm_srli_epi16(a, 4), m15));
        // The 2-bit fields of scales_h spread to one byte each.
        uint64_t t = uint64_t(b[2]) | uint64_t(b[3]) << 8;
        t = (t | t << 24) & 0x000000ff000000ffull;
        t = (t | t << 12) & 0x000f000f000f000full;
        t = (t | t << 6) & 0x0303030303030303ull;
        const __m128i ls = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(_mm_cvtsi64_si128(int64_t(t)), 4)),
                                        _mm_set1_epi8(32));
        return _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(ls));
    }
    static float d(const uint8_t *b) { return f16(b); }
    static void offsets(const uint8_t *, __m256 &, __m256 &) {}
    // Returns u = |w8|, sets w = w8 (the signed levels).
    template <int G>
    static __m256i weights(const uint8_t *b, __m256i &w) {
        // The 16 bytes in both lanes (a broadcast load), the high lane shifted right by 4: masked,
        // the low nibbles index elements 0..15 and the high nibbles elements 16..31.
        const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 8 + 16 * G)));
        const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                                             _mm256_set1_epi8(15));
        const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4nlValues)));
        w = _mm256_shuffle_epi8(lut, idx);
        return _mm256_abs_epi8(w);
    }
    static __m256i dot(__m256i u, __m256i w, __m256i sc, __m256i a) {
        return _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(a, w)), sc);
    }
};

// fn(std::integral_constant<int, g>{}) for g = 0 .. 7, unrolled: block indices stay compile-time
// constants (shift counts and shuffle controls become immediates, per-block registers stay registers).
template <class Fn, int... I>
inline void unroll_seq(Fn &&fn, std::integer_sequence<int, I...>) {
    (fn(std::integral_constant<int, I>{}), ...);
}
template <class Fn>
inline void unroll8(Fn &&fn) { unroll_seq(fn, std::make_integer_sequence<int, 8>{}); }

constexpr int kChunkSuper = 32;  // super-blocks of K per chunk of offset sums (8192 elements)

// The activation's sums per sub-block of 16 times its d, super-blocks [s0, s0 + n), 16 floats per
// super-block in the order of offsets16.
void offset_sums(const int8_t *q, const float *d, int64_t s0, int64_t n, float *fs) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t s = s0; s < s0 + n; ++s)
        for (int j = 0; j < 2; ++j) {
            const int64_t b = s * 8 + 4 * j;  // blocks b .. b + 3
            __m256i v[4];
            for (int i = 0; i < 4; ++i)
                v[i] = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(ones8, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + (b + i) * 32))),
                    ones16);
            // Low lane: the first 16 of blocks b .. b + 3; high lane: their last 16.
            const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
            const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(h), _mm256_broadcast_ps(reinterpret_cast<const __m128 *>(d + b)));
            _mm256_storeu_ps(fs + (s - s0) * 16 + 8 * j, f);
        }
}

// R rows x NT tokens over super-blocks [s0, s0 + n); fs[t]: offset_sums of token t for them.
// The scaled integer dots of a super-block's 8 blocks add up in int32 (the Q8_K activation has one
// d per super-block), converted once and multiplied by super-block d x activation d.
template <class F, int NT, int R>
void super_rows(const uint8_t *const row[R], float *const out[R], size_t ldo, const int8_t *const q[NT],
                const float *const d[NT], const float *const fs[NT], int64_t s0, int64_t n, bool add, int pf) {
    __m256 acc[R][NT];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
    for (int64_t s = s0; s < s0 + n; ++s) {
        const uint8_t *blk[R];
        __m256i sc[R];
        for (int r = 0; r < R; ++r) {
            blk[r] = row[r] + s * F::kBytes;
            if (pf) {
                _mm_prefetch(reinterpret_cast<const char *>(blk[r]) + pf, _MM_HINT_T0);
                _mm_prefetch(reinterpret_cast<const char *>(blk[r]) + pf + 64, _MM_HINT_T0);
            }
            sc[r] = F::scales16(blk[r]);
        }
        __m256i sum[R][NT];
        for (int r = 0; r < R; ++r)
            for (int t = 0; t < NT; ++t) sum[r][t] = _mm256_setzero_si256();
        unroll8([&](auto gc) {
            constexpr int g = decltype(gc)::value;
            __m256i u[R], w[R], s16[R];
            for (int r = 0; r < R; ++r) {
                u[r] = F::template weights<g>(blk[r], w[r]);
                s16[r] = word_bcast<g>(sc[r]);
            }
            for (int t = 0; t < NT; ++t) {
                const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q[t] + s * 256 + g * 32));
                for (int r = 0; r < R; ++r) sum[r][t] = _mm256_add_epi32(sum[r][t], F::dot(u[r], w[r], s16[r], a));
            }
        });
        for (int r = 0; r < R; ++r) {
            const __m256 dv = _mm256_set1_ps(F::d(blk[r]));
            for (int t = 0; t < NT; ++t)
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r][t]), _mm256_mul_ps(dv, _mm256_broadcast_ss(d[t] + s * 8)),
                                            acc[r][t]);
            if constexpr (F::kOffsets) {
                __m256 o0, o1;
                F::offsets(blk[r], o0, o1);
                for (int t = 0; t < NT; ++t) {
                    const float *f = fs[t] + (s - s0) * 16;
                    acc[r][t] = _mm256_fmadd_ps(o0, _mm256_loadu_ps(f), acc[r][t]);
                    acc[r][t] = _mm256_fmadd_ps(o1, _mm256_loadu_ps(f + 8), acc[r][t]);
                }
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t) {
            const float v = hsum(acc[r][t]);
            out[r][t * ldo] = add ? out[r][t * ldo] + v : v;
        }
}

// One token tile (NT tokens from act) over all rows, for one chunk of super-blocks.
template <class F, int NT>
void tile_rows(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, float *out, size_t ldo,
               const float *const fs[NT], int64_t s0, int64_t n, int pf) {
    const int64_t qbytes = (m.K + 63) / 64 * 64, row_bytes = m.K / 256 * F::kBytes;
    const int8_t *q[NT];
    const float *d[NT];
    for (int t = 0; t < NT; ++t) {
        q[t] = reinterpret_cast<const int8_t *>(act[t]);
        d[t] = reinterpret_cast<const float *>(act[t] + qbytes);
    }
    const bool add = s0 > 0;
    if constexpr (NT == 1) {  // row j together with row j + count / 2 (two weight streams)
        for_row_pairs(count, [&](int R, const int *cols) {
            const uint8_t *r0 = m.data + (first + cols[0]) * row_bytes, *r1 = m.data + (first + cols[R - 1]) * row_bytes;
            if (R == 1) {
                const uint8_t *const rr[1] = {r0};
                float *const o[1] = {out + cols[0]};
                return super_rows<F, NT, 1>(rr, o, ldo, q, d, fs, s0, n, add, pf);
            }
            const uint8_t *const rr[2] = {r0, r1};
            float *const o[2] = {out + cols[0], out + cols[1]};
            super_rows<F, NT, 2>(rr, o, ldo, q, d, fs, s0, n, add, pf);
        });
        return;
    }
    for (int j = 0; j < count; ++j) {
        const uint8_t *const rr[1] = {m.data + (first + j) * row_bytes};
        float *const o[1] = {out + j};
        super_rows<F, NT, 1>(rr, o, ldo, q, d, fs, s0, n, add, pf);
    }
}

template <class F>
void super_gemv(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t nsuper = m.K / 256, qbytes = (m.K + 63) / 64 * 64;
    alignas(32) float sums[8][F::kOffsets ? kChunkSuper * 16 : 1];
    for (int t0 = 0; t0 < ntok; t0 += 8) {
        const int nt = ntok - t0 < 8 ? ntok - t0 : 8;
        const uint8_t *const *a = act + t0;
        float *o = out + size_t(t0) * ldo;
        const float *fs[8];
        for (int t = 0; t < 8; ++t) fs[t] = sums[t];
        for (int64_t s0 = 0; s0 < nsuper; s0 += kChunkSuper) {
            const int64_t n = nsuper - s0 < kChunkSuper ? nsuper - s0 : kChunkSuper;
            if constexpr (F::kOffsets)
                for (int t = 0; t < nt; ++t)
                    offset_sums(reinterpret_cast<const int8_t *>(a[t]), reinterpret_cast<const float *>(a[t] + qbytes), s0, n,
                                sums[t]);
            switch (nt) {
                case 1: tile_rows<F, 1>(m, first, count, a, o, ldo, fs, s0, n, pf); break;
                case 2: tile_rows<F, 2>(m, first, count, a, o, ldo, fs, s0, n, pf); break;
                case 3: tile_rows<F, 3>(m, first, count, a, o, ldo, fs, s0, n, pf); break;
                case 4: tile_rows<F, 4>(m, first, count, a, o, ldo, fs, s0, n, pf); break;
                case 5: tile_rows<F, 5>(m, first, count, a, o, ldo, fs, s0, n, pf); break;
                case 6: tile_rows<F, 6>(m, first, count, a, o, ldo, fs, s0, n, pf); break;
                case 7: tile_rows<F, 7>(m, first, count, a, o, ldo, fs, s0, n, pf); break;
                default: tile_rows<F, 8>(m, first, count, a, o, ldo, fs, s0, n, pf); break;
            }
        }
    }
}

}  // namespace

void q2_k_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
               size_t ldo) {
    super_gemv<Q2K>(m, first, count, act, ntok, out, ldo);
}

void q3_k_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
               size_t ldo) {
    super_gemv<Q3K>(m, first, count, act, ntok, out, ldo);
}

void iq4_xs_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    super_gemv<IQ4XS>(m, first, count, act, ntok, out, ldo);
}

}  // namespace ft::cpu::detail
