// AVX2 kernels of the quantised formats with AVX-VNNI (quant_avx2_unit.inc with vpdpbusd /
// vpdpwssd), entry points *_avxvnni; chosen at the avx2 tier where cpuid has avx_vnni.
#define FT_AVX2_VNNI 1
#define FT_AVX2_NAME(f) f##_avxvnni
#include "quant_avx2_unit.inc"
