// AVX2 + FMA + F16C kernels of the GGUF block formats q8_0, q4_k, q5_k, q6_k over activations in the
// q4_0 layout (q8_0_act_bytes): Q8_0 for q8_0, Q8_K (one d per 256) for the K-quants. Each
// 32-element block of weights is decoded once per tile of
// up to 8 tokens into unsigned (K-quants) or signed (q8_0) bytes and multiplied exactly in integers:
//   q8_0   `vpmaddubsw(|w|, sign(a, w))`, `vpmaddwd` by ones, x fp16 d x activation d;
//   q4_k, q5_k, q6_k   codes u (0..15, 0..31, 0..63) by `vpmaddubsw(u, a)` (pairs fit int16),
//          then `vpmaddwd` by the integer sub-block scale (q6_k: one per 16 elements, the two
//          halves of the register), summed in int32 over the super-block, then x super-block d x
//          activation d once; one token: two rows per pass (j, j + count / 2). The offsets (q4_k / q5_k:
//          -dmin * m per 32, q6_k: -32 * d * sc per 16) multiply the activation's sums per 16
//          elements, which are computed once per call and token (d_act * sum q) and paired with a
//          vector of the 16 offsets of a super-block: two FMAs per super-block and token.
// The integer sums are exact; results differ from the scalar definition (quant_gguf_scalar.cpp)
// only by fp32 rounding: summation order, and the K-quants never round an individual weight.
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

// Accumulator sets per token: one FMA chain per token would be latency-bound for 1-2 tokens.
template <int NT>
constexpr int sets() { return NT <= 2 ? 2 : 1; }

// fn(std::integral_constant<int, i>{}) for i = 0 .. N-1, unrolled (sub-block indices stay
// compile-time constants: shift counts and shuffle controls become immediates / constants).
template <class Fn, int... I>
inline void unroll(Fn &&fn, std::integer_sequence<int, I...>) {
    (fn(std::integral_constant<int, I>{}), ...);
}

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
    // Groups of 8 blocks: the 8 products dw * d_act per token in one multiply, kept on the stack
    // and broadcast from there (a load, not an ALU operation, per block and token).
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *g = row + b * 34;
        const __m256 dw = f16x8<34>(g);
        alignas(32) float pr[NT][8];
        for (int t = 0; t < NT; ++t) _mm256_store_ps(pr[t], _mm256_mul_ps(dw, _mm256_loadu_ps(d[t] + b)));
        unroll([&](auto ic) {
            constexpr int i = decltype(ic)::value;
            const uint8_t *blk = g + i * 34;
            if (pf && (i & 1) == 0) _mm_prefetch(reinterpret_cast<const char *>(blk) + pf, _MM_HINT_T0);
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 2));
            const __m256i aw = _mm256_abs_epi8(w);
            for (int t = 0; t < NT; ++t) {
                const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q[t] + (b + i) * 32));
                const __m256i i32 = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w)), ones);
                acc[t][i % S] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_broadcast_ss(&pr[t][i]), acc[t][i % S]);
            }
        }, std::make_integer_sequence<int, 8>{});
    }
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
    __m256i sc16;  // the 8 scales as int16, in both 128-bit lanes
    uint32_t mn[2];  // bytes: m[0..3], m[4..7]
    explicit ScalesMins(const uint8_t *s) {
        const uint32_t w0 = u32_at(s), w1 = u32_at(s + 4), w2 = u32_at(s + 8);
        const uint32_t sc0 = w0 & 0x3f3f3f3fu, sc1 = (w2 & 0x0f0f0f0fu) | (((w0 >> 6) & 0x03030303u) << 4);
        mn[0] = w1 & 0x3f3f3f3fu;
        mn[1] = ((w2 >> 4) & 0x0f0f0f0fu) | (((w1 >> 6) & 0x03030303u) << 4);
        sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(uint64_t(sc0) | uint64_t(sc1) << 32))));
    }
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
    explicit Q4K(const uint8_t *blk) : qs(blk + 16), sm(blk + 4), d(f16(blk)), dmin(f16(blk + 2)) {}
    // Codes of sub-block I: the low nibbles of 32 bytes for even I, their high nibbles for odd.
    template <int I>
    __m256i codes() {
        if constexpr ((I & 1) == 0) {
            const __m256i m15 = _mm256_set1_epi8(0x0f);
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qs + 16 * I));
            lo = _mm256_and_si256(v, m15);
            hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m15);
            return lo;
        } else {
            return hi;
        }
    }
    template <int I>
    __m256i scales() const { return word_bcast<I>(sm.sc16); }
    void offsets(__m256 &o0, __m256 &o1) const { o0 = sm.offsets(0, dmin), o1 = sm.offsets(1, dmin); }
};

struct Q5K {
    static constexpr int kBytes = 176;
    const uint8_t *qs;
    ScalesMins sm;
    float d, dmin;
    __m256i qh, lo{}, hi{};
    explicit Q5K(const uint8_t *blk)
        : qs(blk + 48), sm(blk + 4), d(f16(blk)), dmin(f16(blk + 2)),
          qh(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 16))) {}
    // As q4_k, plus bit I of qh[l] as bit 4 of element l of sub-block I (16-bit shifts; the mask
    // drops what crossed a byte).
    template <int I>
    __m256i codes() {
        const __m256i m15 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
        if constexpr ((I & 1) == 0) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qs + 16 * I));
            lo = _mm256_and_si256(v, m15);
            hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m15);
        }
        __m256i h;
        if constexpr (I <= 4) h = _mm256_slli_epi16(qh, 4 - I);
        else h = _mm256_srli_epi16(qh, I - 4);
        return _mm256_or_si256((I & 1) ? hi : lo, _mm256_and_si256(h, b4));
    }
    template <int I>
    __m256i scales() const { return word_bcast<I>(sm.sc16); }
    void offsets(__m256 &o0, __m256 &o1) const { o0 = sm.offsets(0, dmin), o1 = sm.offsets(1, dmin); }
};

struct Q6K {
    static constexpr int kBytes = 210;
    const uint8_t *ql, *qh;
    __m128i sc8;    // the 16 int8 scales
    __m256i sc16;   // as int16: even-numbered scales in the low lane, odd ones in the high lane
    float d;
    __m256i l0{}, l1{}, h{};
    explicit Q6K(const uint8_t *blk)
        : ql(blk), qh(blk + 128), sc8(_mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 192))), d(f16(blk + 208)) {
        const __m128i eo = _mm_shuffle_epi8(sc8, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
        sc16 = _mm256_cvtepi8_epi16(eo);
    }
    // Sub-block I = 4 * half + p: element l has low 4 bits from ql[64 half + l + 32 (p & 1)] (low
    // nibble for p < 2) and high 2 bits from bits 2p, 2p + 1 of qh[32 half + l].
    template <int I>
    __m256i codes() {
        constexpr int half = I / 4, p = I % 4;
        const __m256i m15 = _mm256_set1_epi8(0x0f), m48 = _mm256_set1_epi8(0x30);
        if constexpr (p == 0) {
            l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(ql + 64 * half));
            l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(ql + 64 * half + 32));
            h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qh + 32 * half));
        }
        const __m256i lb = (p & 1) ? l1 : l0;
        const __m256i low = p < 2 ? _mm256_and_si256(lb, m15) : _mm256_and_si256(_mm256_srli_epi16(lb, 4), m15);
        __m256i hb;
        if constexpr (p < 2) hb = _mm256_slli_epi16(h, 4 - 2 * p);
        else hb = _mm256_srli_epi16(h, 2 * p - 4);
        return _mm256_or_si256(low, _mm256_and_si256(hb, m48));
    }
    // Scale 2I for elements 0..15 (low 128-bit lane), 2I + 1 for 16..31, as int16.
    template <int I>
    __m256i scales() const { return word_bcast<I>(sc16); }
    // The code offset 32: 32 * d * sc per 16 elements, in the act_sums order (lanes 0..3: scales
    // 8g, 8g + 2, 8g + 4, 8g + 6 of the first halves; 4..7: 8g + 1, ... of the second).
    void offsets(__m256 &o0, __m256 &o1) const {
        const __m128i s = _mm_shuffle_epi8(sc8, _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
        const __m256 f = _mm256_set1_ps(32.0f * d);
        o0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)), f);
        o1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s, 8))), f);
    }
};

// The super-blocks at byte offset `off` of R rows.
template <class F, int R>
struct RowBlocks;
template <class F>
struct RowBlocks<F, 1> {
    F w[1];
    RowBlocks(const uint8_t *const *row, int64_t off) : w{F(row[0] + off)} {}
};
template <class F>
struct RowBlocks<F, 2> {
    F w[2];
    RowBlocks(const uint8_t *const *row, int64_t off) : w{F(row[0] + off), F(row[1] + off)} {}
};

// R rows (2 only for one token: two weight streams, shared activation loads), NT tokens,
// super-blocks [sb0, sb0 + nsb): sums[t] holds the token's act_sums from super-block sb0 on.
// Per super-block the scaled integer dots of its 8 blocks add up in int32 (the Q8_K activation has
// one d per super-block), converted once, times super-block d x activation d into tot, and the
// offsets are subtracted there. Adds to out when `add`.
template <class F, int NT, int R>
void kquant_rows(const int8_t *const *q, const float *const *d, const float *const *sums, const uint8_t *const row[R],
                 int64_t sb0, int64_t nsb, float *const out[R], size_t ldo, bool add, int pf) {
    __m256 tot[R][NT];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t) tot[r][t] = _mm256_setzero_ps();
    for (int64_t sb = sb0; sb < sb0 + nsb; ++sb) {
        RowBlocks<F, R> rb(row, sb * F::kBytes);
        F *w = rb.w;
        for (int r = 0; r < R && pf; ++r) {
            const char *p = reinterpret_cast<const char *>(row[r] + sb * F::kBytes) + pf;
            _mm_prefetch(p, _MM_HINT_T0);
            _mm_prefetch(p + 64, _MM_HINT_T0);
            _mm_prefetch(p + 128, _MM_HINT_T0);
        }
        __m256i acc[R][NT];
        for (int r = 0; r < R; ++r)
            for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_si256();
        unroll([&](auto ic) {
            constexpr int I = decltype(ic)::value;
            __m256i u[R], s16[R];
            for (int r = 0; r < R; ++r) u[r] = w[r].template codes<I>(), s16[r] = w[r].template scales<I>();
            const int64_t b = sb * 8 + I;  // block of 32 of the activation
            for (int t = 0; t < NT; ++t) {
                const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q[t] + b * 32));
                for (int r = 0; r < R; ++r)
                    acc[r][t] = _mm256_add_epi32(acc[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(u[r], a), s16[r]));
            }
        }, std::make_integer_sequence<int, 8>{});
        for (int r = 0; r < R; ++r) {
            __m256 o0, o1;
            w[r].offsets(o0, o1);
            const __m256 dv = _mm256_set1_ps(w[r].d);
            for (int t = 0; t < NT; ++t) {
                const float *s = sums[t] + (sb - sb0) * 16;
                const __m256 f = _mm256_mul_ps(dv, _mm256_broadcast_ss(d[t] + sb * 8));  // Q8_K: one d per 256
                tot[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][t]), f, tot[r][t]);
                tot[r][t] = _mm256_fnmadd_ps(o0, _mm256_loadu_ps(s), tot[r][t]);
                tot[r][t] = _mm256_fnmadd_ps(o1, _mm256_loadu_ps(s + 8), tot[r][t]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t) {
            const float v = hsum(tot[r][t]);
            out[r][t * ldo] = add ? out[r][t * ldo] + v : v;
        }
}

// Floats of act_sums held on the stack per call: 16 per super-block and token.
constexpr int64_t kSumsFloats = 4096;

// Rows [first, first + count) for all tokens: per tile of up to 8 tokens and per range of
// super-blocks whose sums fit kSumsFloats, the sums once, then every row (one token: rows in
// pairs j, j + count / 2).
template <class F>
void kquant_gemv(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    const int pf = g_prefetch_bytes;
    const int64_t K = m.K, nsb = K / 256, qbytes = (K + 63) / 64 * 64;
    const size_t rb = size_t(nsb) * F::kBytes;
    alignas(32) float sums[kSumsFloats];
    for_tiles<8>(ntok, [&](auto tile_n, int t0) {
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
            float *o = out + size_t(t0) * ldo;
            if (NT == 1) {
                for_row_pairs(count, [&](int R, const int *cols) {
                    const uint8_t *const rr[2] = {m.data + size_t(first + cols[0]) * rb,
                                                  m.data + size_t(first + cols[R - 1]) * rb};
                    float *const oo[2] = {o + cols[0], o + cols[R - 1]};
                    if (R == 2) kquant_rows<F, NT, 2>(q, d, sp, rr, sb0, n, oo, ldo, sb0 > 0, pf);
                    else kquant_rows<F, NT, 1>(q, d, sp, rr, sb0, n, oo, ldo, sb0 > 0, pf);
                });
            } else {
                for (int j = 0; j < count; ++j) {
                    const uint8_t *const rr[1] = {m.data + size_t(first + j) * rb};
                    float *const oo[1] = {o + j};
                    kquant_rows<F, NT, 1>(q, d, sp, rr, sb0, n, oo, ldo, sb0 > 0, pf);
                }
            }
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
        for_tiles<8>(ntok, [&](auto tile_n, int t) {
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
