// AVX-512 kernels of the GGUF block formats (AVX-512F/BW/VL; the integer dot by vpmaddubsw +
// vpmaddwd): quant_gguf_avx512_unit.inc without VNNI, entry points *_avx512.
#define FT_GGUF_VNNI false
#define FT_GGUF_NAME(f) f##_avx512
#include "quant_gguf_avx512_unit.inc"
