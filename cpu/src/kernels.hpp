// Declarations of the per-tier GEMV kernels. Included by the tier translation units, so it must
// stay free of inline functions and templates (see cpu/CMakeLists.txt).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ft::cpu::detail {

// Software prefetch distance in bytes ahead of each weight row (0 = none). Set once by
// gemv_kernel() from FT_CPU_PREFETCH; read by the kernels.
extern int g_prefetch_bytes;

// Same contract as ft::cpu::GemvFn.
void gemv_scalar(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
                 int ntok, float *out, size_t ldo);
void gemv_avx2(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
               int ntok, float *out, size_t ldo);
void gemv_avx512(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
                 int ntok, float *out, size_t ldo);
void gemv_avx512bf16(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
                     int ntok, float *out, size_t ldo);

}  // namespace ft::cpu::detail
