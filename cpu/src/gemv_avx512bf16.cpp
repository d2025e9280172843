// AVX-512-BF16 tier: vdpbf16ps multiplies 32 bf16 pairs and accumulates into 16 fp32 lanes, so
// weights and activations are used as stored, without widening.
#include "immintrin_avx512.hpp"

#include "kernels.hpp"

namespace ft::cpu::detail {
namespace {

#include "tier_tiles.inc"

// A tile of R weight rows times NT tokens; every weight vector loaded is used NT times.
template <int R, int NT>
void tile(const uint16_t *w, size_t ldw, int cols, const uint16_t *const *x, float *out,
          size_t ldo, int pf) {
    __m512 acc[R][NT];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
    int c = 0;
    for (; c + 32 <= cols; c += 32) {
        __m512i wv[R];
        for (int r = 0; r < R; ++r) {
            const uint16_t *p = w + r * ldw + c;
            if (pf) _mm_prefetch(reinterpret_cast<const char *>(p) + pf, _MM_HINT_T0);
            wv[r] = _mm512_loadu_si512(p);
        }
        for (int t = 0; t < NT; ++t) {
            __m512i xv = _mm512_loadu_si512(x[t] + c);
            for (int r = 0; r < R; ++r)
                acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)wv[r], (__m512bh)xv);
        }
    }
    if (c < cols) {
        // Masked loads fill the lanes past the end with zeros, which add nothing.
        __mmask32 m = static_cast<__mmask32>((1ull << (cols - c)) - 1);
        __m512i wv[R];
        for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_epi16(m, w + r * ldw + c);
        for (int t = 0; t < NT; ++t) {
            __m512i xv = _mm512_maskz_loadu_epi16(m, x[t] + c);
            for (int r = 0; r < R; ++r)
                acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)wv[r], (__m512bh)xv);
        }
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

void gemv_avx512bf16(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
                     int ntok, float *out, size_t ldo) {
    const int pf = g_prefetch_bytes;
    int r = 0;
    for (; r + 4 <= rows; r += 4) row_group<4>(w + r * ldw, ldw, cols, x, ntok, out + r, ldo, pf);
    for (; r < rows; ++r) row_group<1>(w + r * ldw, ldw, cols, x, ntok, out + r, ldo, pf);
}

}  // namespace ft::cpu::detail
