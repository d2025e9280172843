// Baseline x86-64 (SSE2) memory read probe (see kernels.hpp and membw_probe.inc).
#include <immintrin.h>

#include "kernels.hpp"
#include "membw_probe.inc"

namespace ft::cpu::detail {

FT_DEFINE_READ_SUM(read_sum_sse2, __m128i, _mm_load_si128, _mm_add_epi64, _mm_setzero_si128(), _mm_cvtsi128_si64)

}  // namespace ft::cpu::detail
