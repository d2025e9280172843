// AVX2 memory read probe (see kernels.hpp and membw_probe.inc).
#include <immintrin.h>

#include "kernels.hpp"
#include "membw_probe.inc"

namespace ft::cpu::detail {
namespace {
// Only one lane feeds the result: the sum exists to keep the loads from being dropped.
inline long long first_lane(__m256i v) { return _mm256_extract_epi64(v, 0); }
}  // namespace

FT_DEFINE_READ_SUM(read_sum_avx2, __m256i, _mm256_load_si256, _mm256_add_epi64, _mm256_setzero_si256(), first_lane)

}  // namespace ft::cpu::detail
