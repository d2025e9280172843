// AVX2 kernels of q8_0, q4_k, q5_k, q6_k (quant_gguf_avx2_unit.inc with `vpmaddubsw` /
// `vpmaddwd`), entry points *_avx2.
#define FT_AVX2_VNNI 0
#define FT_AVX2_NAME(f) f##_avx2
#include "quant_gguf_avx2_unit.inc"
