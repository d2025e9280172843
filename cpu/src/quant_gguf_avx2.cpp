// AVX2 + FMA + F16C kernels of the GGUF block formats q8_0, q4_k, q5_k, q6_k over Q8_0 activations
// (the q4_0 layout, q8_0_act_bytes). Each 32-element block of weights is decoded once per tile of
// up to 8 tokens into unsigned (K-quants) or signed (q8_0) bytes and multiplied exactly in integers:
//   q8_0   `vpmaddubsw(|w|, sign(a, w))`, `vpmaddwd` by ones, x fp16 d x activation d;
//   q4_k, q5_k, q6_k   codes u (0..15, 0..31, 0..63) by `vpmaddubsw(u, a)` (pairs fit int16),
//          then `vpmaddwd` by the integer sub-block scale (q6_k: one per 16 elements, the two
//          halves of the register), x super-block d x activation d. The offsets (q4_k / q5_k:
//          -dmin * m per 32, q6_k: -32 * d * sc per 16) multiply the activation's sums per 16
//          elements, which are computed once per call and token (d_act * sum q) and paired with a
//          vector of the 16 offsets of a super-block: two FMAs per super-block and token.
// Products are exact; only the fp32 summation order differs from the scalar definition
// (quant_gguf_scalar.cpp).
#include <immintrin.h>

#include <cstring>
#include <type_traits>

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

inline uint32_t u32_at(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// body(TokenTile<NT>{}, t) for tiles of up to 8 tokens: full tiles, then one of the rest.
template <typename Body>
inline void tiles8(int ntok, Body &&body) {
    int t = 0;
    for (; t + 8 <= ntok; t += 8) body(TokenTile<8>{}, t);
    switch (ntok - t) {
        case 7: body(TokenTile<7>{}, t); break;
        case 6: body(TokenTile<6>{}, t); break;
        case 5: body(TokenTile<5>{}, t); break;
        case 4: body(TokenTile<4>{}, t); break;
        case 3: body(TokenTile<3>{}, t); break;
        case 2: body(TokenTile<2>{}, t); break;
        case 1: body(TokenTile<1>{}, t); break;
        default: break;
    }
}

// Accumulator sets per token: one FMA chain per token would be latency-bound for 1-2 tokens.
template <int NT>
constexpr int sets() { return NT <= 2 ? 2 : 1; }

// ---- q8_0 -------------------------------------------------------------------------------------

template <int NT>
void q8_0_row(const uint8_t *const *act, float *out, size_t ldo, const uint8_t *row, int64_t nb, int64_t qbytes,
              int pf) {
    constexpr int S = sets<NT>();
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *q[NT];
    const float *d[NT];
    __m256 acc[NT][S];
    for (int t = 0; t < NT; ++t) {
        q[t] = reinterpret_cast<const int8_t *>(act[t]);
        d[t] = reinterpret_cast<const float *>(act[t] + qbytes);
        for (int i = 0; i < S; ++i) acc[t][i] = _mm256_setzero_ps();
    }
    auto block = [&](int64_t b, auto set) {
        constexpr int A = decltype(set)::value;
        const uint8_t *blk = row + b * 34;
        if (pf && (b & 1) == 0) _mm_prefetch(reinterpret_cast<const char *>(blk) + pf, _MM_HINT_T0);
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 2));
        const __m256i aw = _mm256_abs_epi8(w);
        const __m256 dw = _mm256_set1_ps(f16(blk));
        for (int t = 0; t < NT; ++t) {
            const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q[t] + b * 32));
            const __m256i i32 = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w)), ones);
            acc[t][A] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_mul_ps(dw, _mm256_broadcast_ss(d[t] + b)),
                                        acc[t][A]);
        }
    };
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        block(b, std::integral_constant<int, 0>{});
        block(b + 1, std::integral_constant<int, S - 1>{});
    }
    if (b < nb) block(b, std::integral_constant<int, 0>{});
    for (int t = 0; t < NT; ++t) {
        __m256 s = acc[t][0];
        if (S > 1) s = _mm256_add_ps(s, acc[t][S - 1]);
        out[t * ldo] = hsum(s);
    }
}

// ---- K-quants ---------------------------------------------------------------------------------

// The activation's offset sums of one token: per group of 4 Q8_0 blocks (128 elements) 8 floats,
// d[b] * (sum of q over elements 0..15 of block b) for b = 0..3, then the same over elements
// 16..31. Groups [g0, g0 + ng) of the token go to dst.
void act_sums(const uint8_t *act, int64_t qbytes, int64_t g0, int64_t ng, float *dst) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const int8_t *q = reinterpret_cast<const int8_t *>(act);
    const float *d = reinterpret_cast<const float *>(act + qbytes);
    for (int64_t g = g0; g < g0 + ng; ++g) {
        __m256i v[4];
        for (int b = 0; b < 4; ++b) {
            const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + g * 128 + b * 32));
            v[b] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, a), ones16);
        }
        const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        const __m256 da = _mm256_broadcast_ps(reinterpret_cast<const __m128 *>(d + g * 4));
        _mm256_storeu_ps(dst + (g - g0) * 8, _mm256_mul_ps(_mm256_cvtepi32_ps(s), da));
    }
}

// q4_k and q5_k: 8 sub-blocks of 32 with 6-bit scales and mins (12 packed bytes): sc[j] / m[j]
// for j < 4 are the low 6 bits of bytes j / j + 4; for j >= 4 the low 4 bits come from the low /
// high nibble of byte j + 4 and the top 2 from bits 6-7 of byte j - 4 / j. Four at a time in
// 32-bit words.
struct ScalesMins {
    uint32_t sc[2], mn[2];  // bytes: sc[0..3], sc[4..7]; m[0..3], m[4..7]
    explicit ScalesMins(const uint8_t *s) {
        const uint32_t w0 = u32_at(s), w1 = u32_at(s + 4), w2 = u32_at(s + 8);
        sc[0] = w0 & 0x3f3f3f3fu;
        mn[0] = w1 & 0x3f3f3f3fu;
        sc[1] = (w2 & 0x0f0f0f0fu) | (((w0 >> 6) & 0x03030303u) << 4);
        mn[1] = ((w2 >> 4) & 0x0f0f0f0fu) | (((w1 >> 6) & 0x03030303u) << 4);
    }
    int scale(int j) const { return int((sc[j / 4] >> (8 * (j % 4))) & 0xff); }
    // Offset vector of group g (sub-blocks 4g..4g+3, both halves): dmin * m in the act_sums order.
    __m256 offsets(int g, float dmin) const {
        const __m256i m = _mm256_cvtepu8_epi32(_mm_set1_epi32(int(mn[g])));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(dmin));
    }
};

struct Q4K {
    static constexpr int kBytes = 144;
    const uint8_t *qs;
    ScalesMins sm;
    float d, dmin;
    __m256i lo{}, hi{};
    const __m256i m15 = _mm256_set1_epi8(0x0f);
    explicit Q4K(const uint8_t *blk) : qs(blk + 16), sm(blk + 4), d(f16(blk)), dmin(f16(blk + 2)) {}
    // Codes of sub-block i (0..7): the low nibbles of 32 bytes for even i, high for odd.
    __m256i codes(int i) {
        if ((i & 1) == 0) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qs + 16 * i));
            lo = _mm256_and_si256(v, m15);
            hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m15);
            return lo;
        }
        return hi;
    }
    __m256i scales(int i) const { return _mm256_set1_epi16(short(sm.scale(i))); }
    // Offsets subtracted per act_sums group.
    void offsets(__m256 &o0, __m256 &o1) const { o0 = sm.offsets(0, dmin), o1 = sm.offsets(1, dmin); }
};

struct Q5K {
    static constexpr int kBytes = 176;
    const uint8_t *qs;
    ScalesMins sm;
    float d, dmin;
    __m256i qh, lo{}, hi{};
    const __m256i m15 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
    explicit Q5K(const uint8_t *blk)
        : qs(blk + 48), sm(blk + 4), d(f16(blk)), dmin(f16(blk + 2)),
          qh(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 16))) {}
    // As q4_k, plus bit i of qh[l] as bit 4 of element l of sub-block i.
    __m256i codes(int i) {
        if ((i & 1) == 0) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qs + 16 * i));
            lo = _mm256_and_si256(v, m15);
            hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m15);
        }
        // Bit i of each byte moved to bit 4 (shifts by 16-bit lanes; the mask drops what crossed).
        const __m256i h = i <= 4 ? _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - i)) : _mm256_srl_epi16(qh, _mm_cvtsi32_si128(i - 4));
        return _mm256_or_si256((i & 1) ? hi : lo, _mm256_and_si256(h, b4));
    }
    __m256i scales(int i) const { return _mm256_set1_epi16(short(sm.scale(i))); }
    void offsets(__m256 &o0, __m256 &o1) const { o0 = sm.offsets(0, dmin), o1 = sm.offsets(1, dmin); }
};

struct Q6K {
    static constexpr int kBytes = 210;
    const uint8_t *ql, *qh;
    __m128i sc8;  // the 16 int8 scales
    float d;
    __m256i l0{}, l1{}, h{};
    const __m256i m15 = _mm256_set1_epi8(0x0f), m48 = _mm256_set1_epi8(0x30);
    explicit Q6K(const uint8_t *blk)
        : ql(blk), qh(blk + 128), sc8(_mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 192))), d(f16(blk + 208)) {}
    // Sub-block i = 4 * half + p: element l has low 4 bits from ql[64 half + l + 32 (p & 1)] (low
    // nibble for p < 2) and high 2 bits from bits 2p, 2p + 1 of qh[32 half + l].
    __m256i codes(int i) {
        const int half = i / 4, p = i % 4;
        if (p == 0) {
            l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(ql + 64 * half));
            l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(ql + 64 * half + 32));
            h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qh + 32 * half));
        }
        const __m256i lb = (p & 1) ? l1 : l0;
        const __m256i low = p < 2 ? _mm256_and_si256(lb, m15) : _mm256_and_si256(_mm256_srli_epi16(lb, 4), m15);
        __m256i hb;
        switch (p) {
            case 0: hb = _mm256_slli_epi16(h, 4); break;
            case 1: hb = _mm256_slli_epi16(h, 2); break;
            case 2: hb = h; break;
            default: hb = _mm256_srli_epi16(h, 2); break;
        }
        return _mm256_or_si256(low, _mm256_and_si256(hb, m48));
    }
    // Scale 2i for elements 0..15 (low 128-bit lane), 2i + 1 for 16..31, as int16.
    __m256i scales(int i) const {
        const __m128i ctrl = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, _mm_add_epi8(ctrl, _mm_set1_epi8(char(2 * i)))));
    }
    // The code offset 32: 32 * d * sc per 16 elements, in the act_sums order (lanes 0..3: scales
    // 8g, 8g + 2, 8g + 4, 8g + 6 of the first halves; 4..7: 8g + 1, ... of the second).
    void offsets(__m256 &o0, __m256 &o1) const {
        const __m128i s = _mm_shuffle_epi8(sc8, _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
        const __m256 f = _mm256_set1_ps(32.0f * d);
        o0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)), f);
        o1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s, 8))), f);
    }
};

// One row, NT tokens, super-blocks [sb0, sb0 + nsb): sums[t] holds the token's act_sums from
// super-block sb0 on. Adds to out when `add`, else stores.
template <class F, int NT>
void kquant_row(const int8_t *const *q, const float *const *d, const float *const *sums, const uint8_t *row,
                int64_t sb0, int64_t nsb, float *out, size_t ldo, bool add, int pf) {
    constexpr int S = sets<NT>();
    __m256 acc[NT][S];
    for (int t = 0; t < NT; ++t)
        for (int i = 0; i < S; ++i) acc[t][i] = _mm256_setzero_ps();
    for (int64_t sb = sb0; sb < sb0 + nsb; ++sb) {
        const uint8_t *blk = row + sb * F::kBytes;
        if (pf) {
            _mm_prefetch(reinterpret_cast<const char *>(blk) + pf, _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char *>(blk) + pf + 64, _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char *>(blk) + pf + 128, _MM_HINT_T0);
        }
        F w(blk);
        const __m256 dv = _mm256_set1_ps(w.d);
        for (int i = 0; i < 8; ++i) {
            const __m256i u = w.codes(i);
            const __m256i s16 = w.scales(i);
            const int64_t b = sb * 8 + i;  // Q8_0 block
            for (int t = 0; t < NT; ++t) {
                const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q[t] + b * 32));
                const __m256i x = _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), s16);
                __m256 &ac = acc[t][S > 1 ? (i & 1) : 0];
                ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(x), _mm256_mul_ps(dv, _mm256_broadcast_ss(d[t] + b)), ac);
            }
        }
        __m256 o0, o1;
        w.offsets(o0, o1);
        for (int t = 0; t < NT; ++t) {
            const float *s = sums[t] + (sb - sb0) * 16;
            __m256 &ac = acc[t][0];
            ac = _mm256_fnmadd_ps(o0, _mm256_loadu_ps(s), ac);
            ac = _mm256_fnmadd_ps(o1, _mm256_loadu_ps(s + 8), ac);
        }
    }
    for (int t = 0; t < NT; ++t) {
        __m256 s = acc[t][0];
        if (S > 1) s = _mm256_add_ps(s, acc[t][S - 1]);
        const float v = hsum(s);
        out[t * ldo] = add ? out[t * ldo] + v : v;
    }
}

// Floats of act_sums held on the stack per call: 16 per super-block and token.
constexpr int64_t kSumsFloats = 4096;

// Rows [first, first + count) for all tokens: per tile of up to 8 tokens and per range of
// super-blocks whose sums fit kSumsFloats, the sums once, then every row.
template <class F>
void kquant_gemv(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t K = m.K, nsb = K / 256, qbytes = (K + 63) / 64 * 64;
    const size_t rb = size_t(nsb) * F::kBytes;
    alignas(32) float sums[kSumsFloats];
    tiles8(ntok, [&](auto tile_n, int t0) {
        constexpr int NT = decltype(tile_n)::value;
        const int64_t chunk = kSumsFloats / (16 * NT);
        const int8_t *q[NT];
        const float *d[NT], *sp[NT];
        for (int t = 0; t < NT; ++t) {
            q[t] = reinterpret_cast<const int8_t *>(act[t0 + t]);
            d[t] = reinterpret_cast<const float *>(act[t0 + t] + qbytes);
        }
        for (int64_t sb0 = 0; sb0 < nsb; sb0 += chunk) {
            const int64_t n = nsb - sb0 < chunk ? nsb - sb0 : chunk;
            for (int t = 0; t < NT; ++t) {
                float *dst = sums + t * n * 16;
                act_sums(act[t0 + t], qbytes, sb0 * 2, n * 2, dst);
                sp[t] = dst;
            }
            for (int j = 0; j < count; ++j)
                kquant_row<F, NT>(q, d, sp, m.data + size_t(first + j) * rb, sb0, n, out + size_t(t0) * ldo + j, ldo,
                                  sb0 > 0, pf);
        }
    });
}

template <int NT>
struct Q8Row {
    static void run(const uint8_t *const *act, float *out, size_t ldo, const uint8_t *row, int64_t nb, int64_t qbytes,
                    int pf) {
        q8_0_row<NT>(act, out, ldo, row, nb, qbytes, pf);
    }
};

}  // namespace

void q8_0_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
               size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t nb = m.K / 32, qbytes = (m.K + 63) / 64 * 64;
    for (int j = 0; j < count; ++j)
        tiles8(ntok, [&](auto tile_n, int t) {
            Q8Row<decltype(tile_n)::value>::run(act + t, out + size_t(t) * ldo + j, ldo,
                                                m.data + size_t(first + j) * size_t(nb) * 34, nb, qbytes, pf);
        });
}

void q4_k_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
               size_t ldo) {
    kquant_gemv<Q4K>(m, first, count, act, ntok, out, ldo);
}

void q5_k_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
               size_t ldo) {
    kquant_gemv<Q5K>(m, first, count, act, ntok, out, ldo);
}

void q6_k_avx2(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
               size_t ldo) {
    kquant_gemv<Q6K>(m, first, count, act, ntok, out, ldo);
}

}  // namespace ft::cpu::detail
