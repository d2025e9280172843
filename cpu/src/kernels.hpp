// Declarations of the per-tier GEMV kernels. Included by the tier translation units, so it must
// stay free of inline functions and templates (see cpu/CMakeLists.txt).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ft::cpu::detail {

// Software prefetch distance in bytes ahead of each weight row (0 = none). Set by
// set_prefetch_bytes() (the engine, from FT_CPU_PREFETCH); read by the kernels.
extern int g_prefetch_bytes;
// The GGUF block formats' kernels (not q4_0's) prefetch 4 x that ahead: 2048 bytes beat 512 for
// them on Intel Xeons (cpu/README.md, "Prefetch of the GGUF block formats").
inline int gguf_prefetch_bytes() { return 4 * g_prefetch_bytes; }

// Same contract as ft::cpu::GemvFn.
void gemv_scalar(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
                 int ntok, float *out, size_t ldo);
void gemv_avx2(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
               int ntok, float *out, size_t ldo);
void gemv_avx512(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
                 int ntok, float *out, size_t ldo);
void gemv_avx512bf16(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
                     int ntok, float *out, size_t ldo);
// AMX-BF16 tiles for calls of 2 or more tokens (gemv_amx.cpp); the rest through gemv_avx512bf16.
// Only where amx_bf16_available() (ft/cpu.hpp).
void gemv_amx_bf16(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
                   int ntok, float *out, size_t ldo);

// Memory read probes: sum the 64-bit words of [p, p + bytes), reading `streams` parts in
// lockstep (more misses in flight per core): parts `stride` bytes apart, or equal contiguous
// slices when stride is 0; prefetching `prefetch` bytes ahead in each (0 = none). The sum only
// keeps the loads alive. Bytes past the last whole tile are not read.
uint64_t read_sum_sse2(const uint8_t *p, size_t bytes, int streams, size_t stride, int prefetch);
uint64_t read_sum_avx2(const uint8_t *p, size_t bytes, int streams, size_t stride, int prefetch);
uint64_t read_sum_avx512(const uint8_t *p, size_t bytes, int streams, size_t stride, int prefetch);

}  // namespace ft::cpu::detail
