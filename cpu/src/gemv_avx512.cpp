// AVX-512F tier (with BW/VL for masked 16-bit tail loads). A 32-bit lane holds a bf16 pair; the
// low element becomes fp32 by a left shift, the high one by masking off the low half. Both
// products go into the same accumulator, as vdpbf16ps does.
#include "immintrin_avx512.hpp"

#include "kernels.hpp"

namespace ft::cpu::detail {
namespace {

#include "tier_tiles.inc"

inline __m512 lo_f32(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
inline __m512 hi_f32(__m512i v) {
    return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

template <int R, int NT>
void tile(const uint16_t *w, size_t ldw, int cols, const uint16_t *const *x, float *out,
          size_t ldo, int pf) {
    __m512 acc[R][NT];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
    auto step = [&](const __m512i *wv, const __m512i *xv) {
        for (int t = 0; t < NT; ++t) {
            __m512 xl = lo_f32(xv[t]), xh = hi_f32(xv[t]);
            for (int r = 0; r < R; ++r) {
                acc[r][t] = _mm512_fmadd_ps(lo_f32(wv[r]), xl, acc[r][t]);
                acc[r][t] = _mm512_fmadd_ps(hi_f32(wv[r]), xh, acc[r][t]);
            }
        }
    };
    int c = 0;
    for (; c + 32 <= cols; c += 32) {
        __m512i wv[R], xv[NT];
        for (int r = 0; r < R; ++r) {
            const uint16_t *p = w + r * ldw + c;
            if (pf) _mm_prefetch(reinterpret_cast<const char *>(p) + pf, _MM_HINT_T0);
            wv[r] = _mm512_loadu_si512(p);
        }
        for (int t = 0; t < NT; ++t) xv[t] = _mm512_loadu_si512(x[t] + c);
        step(wv, xv);
    }
    if (c < cols) {
        __mmask32 m = static_cast<__mmask32>((1ull << (cols - c)) - 1);
        __m512i wv[R], xv[NT];
        for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_epi16(m, w + r * ldw + c);
        for (int t = 0; t < NT; ++t) xv[t] = _mm512_maskz_loadu_epi16(m, x[t] + c);
        step(wv, xv);
    }
    for (int t = 0; t < NT; ++t)
        for (int r = 0; r < R; ++r) out[t * ldo + r] = _mm512_reduce_add_ps(acc[r][t]);
}

template <int R>
void row_group(const uint16_t *w, size_t ldw, int cols, const uint16_t *const *x, int ntok,
               float *out, size_t ldo, int pf) {
    for_token_tiles(ntok, [&](auto tile_n, int t) {
        using NT = decltype(tile_n);
        tile<R, NT::value>(w, ldw, cols, x + t, out + t * ldo, ldo, pf);
    });
}

}  // namespace

void gemv_avx512(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
                 int ntok, float *out, size_t ldo) {
    const int pf = g_prefetch_bytes;
    int r = 0;
    for (; r + 4 <= rows; r += 4) row_group<4>(w + r * ldw, ldw, cols, x, ntok, out + r, ldo, pf);
    for (; r < rows; ++r) row_group<1>(w + r * ldw, ldw, cols, x, ntok, out + r, ldo, pf);
}

}  // namespace ft::cpu::detail
