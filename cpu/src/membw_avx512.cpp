// AVX-512 memory read probe (see kernels.hpp and membw_probe.inc).
// GCC 12 warns about deliberately undefined lanes inside its own AVX-512 headers (GCC bug
// 105593); the warning says nothing about this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "kernels.hpp"
#include "membw_probe.inc"

namespace ft::cpu::detail {

FT_DEFINE_READ_SUM(read_sum_avx512, __m512i, _mm512_load_si512, _mm512_add_epi64, _mm512_setzero_si512(), _mm512_reduce_add_epi64)

}  // namespace ft::cpu::detail
