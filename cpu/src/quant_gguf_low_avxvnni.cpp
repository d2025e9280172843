// AVX2 kernels of q2_k, q3_k, iq4_xs (quant_gguf_low_avx2_unit.inc) with AVX-VNNI (`vpdpbusd` /
// `vpdpwssd`), entry points *_avxvnni; chosen at the avx2 tier where cpuid has avx_vnni.
#define FT_AVX2_VNNI 1
#define FT_AVX2_NAME(f) f##_avxvnni
#include "quant_gguf_low_avx2_unit.inc"
