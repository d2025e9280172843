// AVX-512-VNNI kernels of the GGUF block formats (the integer dot by vpdpbusd):
// quant_gguf_avx512_unit.inc with VNNI, entry points *_avx512vnni.
#define FT_GGUF_VNNI true
#define FT_GGUF_NAME(f) f##_avx512vnni
#include "quant_gguf_avx512_unit.inc"
