// AVX2+FMA tier: 16 bf16 per 256-bit load, widened pairwise like the AVX-512F tier. Column tails
// (fewer than 16) are finished in scalar code.
#include <immintrin.h>

#include <cstring>

#include "kernels.hpp"

namespace ft::cpu::detail {
namespace {

#include "tier_tiles.inc"

inline __m256 lo_f32(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
inline __m256 hi_f32(__m256i v) {
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
inline float widen(uint16_t v) {
    uint32_t bits = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}
inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

template <int R, int NT>
void tile(const uint16_t *w, size_t ldw, int cols, const uint16_t *const *x, float *out,
          size_t ldo, int pf) {
    __m256 acc[R][NT];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
    int c = 0;
    for (; c + 16 <= cols; c += 16) {
        __m256i wv[R];
        for (int r = 0; r < R; ++r) {
            const uint16_t *p = w + r * ldw + c;
            // One prefetch per 64-byte line: every other 32-byte step.
            if (pf && (c & 31) == 0) _mm_prefetch(reinterpret_cast<const char *>(p) + pf, _MM_HINT_T0);
            wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
        }
        for (int t = 0; t < NT; ++t) {
            __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x[t] + c));
            __m256 xl = lo_f32(xv), xh = hi_f32(xv);
            for (int r = 0; r < R; ++r) {
                acc[r][t] = _mm256_fmadd_ps(lo_f32(wv[r]), xl, acc[r][t]);
                acc[r][t] = _mm256_fmadd_ps(hi_f32(wv[r]), xh, acc[r][t]);
            }
        }
    }
    for (int t = 0; t < NT; ++t)
        for (int r = 0; r < R; ++r) {
            float s = hsum(acc[r][t]);
            for (int k = c; k < cols; ++k) s += widen(w[r * ldw + k]) * widen(x[t][k]);
            out[t * ldo + r] = s;
        }
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

void gemv_avx2(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
               int ntok, float *out, size_t ldo) {
    const int pf = g_prefetch_bytes;
    int r = 0;
    for (; r + 4 <= rows; r += 4) row_group<4>(w + r * ldw, ldw, cols, x, ntok, out + r, ldo, pf);
    for (; r < rows; ++r) row_group<1>(w + r * ldw, ldw, cols, x, ntok, out + r, ldo, pf);
}

}  // namespace ft::cpu::detail
