// AVX-512 memory read probe (see kernels.hpp and membw_probe.inc).
#include "immintrin_avx512.hpp"

#include "kernels.hpp"
#include "membw_probe.inc"

namespace ft::cpu::detail {

FT_DEFINE_READ_SUM(read_sum_avx512, __m512i, _mm512_load_si512, _mm512_add_epi64, _mm512_setzero_si512(), _mm512_reduce_add_epi64)

}  // namespace ft::cpu::detail
