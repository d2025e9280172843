// AVX2 kernels of q2_k, q3_k, iq4_xs (quant_gguf_low_avx2_unit.inc with `vpmaddubsw` /
// `vpmaddwd`), entry points *_avx2.
#define FT_AVX2_VNNI 0
#define FT_AVX2_NAME(f) f##_avx2
#include "quant_gguf_low_avx2_unit.inc"
