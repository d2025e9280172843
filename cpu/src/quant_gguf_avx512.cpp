// AVX-512F/BW/VL kernels of the GGUF block formats (the integer dot by `vpmaddubsw` + `vpmaddwd`):
// quant_gguf_avx512.inc with kVnni = false.
// GCC 12 warns about the deliberately undefined upper lanes inside its own AVX-512 headers
// (GCC bug 105593); the warning says nothing about this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
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

constexpr bool kVnni = false;

#include "quant_gguf_avx512.inc"

}  // namespace

void q8_0_avx512(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    q8_0_gemv(m, first, count, act, ntok, out, ldo);
}

void q4_k_avx512(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    super_gemv<Q4K>(m, first, count, act, ntok, out, ldo);
}

void q5_k_avx512(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    super_gemv<Q5K>(m, first, count, act, ntok, out, ldo);
}

void q6_k_avx512(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    super_gemv<Q6K>(m, first, count, act, ntok, out, ldo);
}

void q2_k_avx512(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    super_gemv<Q2K>(m, first, count, act, ntok, out, ldo);
}

void q3_k_avx512(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    super_gemv<Q3K>(m, first, count, act, ntok, out, ldo);
}

void iq4_xs_avx512(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                   size_t ldo) {
    super_gemv<IQ4XS>(m, first, count, act, ntok, out, ldo);
}

}  // namespace ft::cpu::detail
