// AVX2 kernels of the quantised formats (quant_avx2_unit.inc with vpmaddubsw / vpmaddwd),
// entry points *_avx2.
#define FT_AVX2_VNNI 0
#define FT_AVX2_NAME(f) f##_avx2
#include "quant_avx2_unit.inc"
