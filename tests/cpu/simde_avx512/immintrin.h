// Test-only stand-in for <immintrin.h>: SIMDe's portable implementations of the x86 intrinsics
// under their Intel names (SIMDE_ENABLE_NATIVE_ALIASES), so a kernel unit written for AVX-512
// compiles for, and runs on, a CPU without AVX-512 (test_gguf_avx512_emulated). Built without any
// -m flag beyond the x86-64 baseline, so no compiler intrinsic header above SSE2 is seen and
// SIMDe's types are the only __m256 / __m512. The few intrinsics SIMDe 0.7 lacks are written out
// below from their definitions in Intel's intrinsics guide.
#pragma once

#ifndef SIMDE_ENABLE_NATIVE_ALIASES
#define SIMDE_ENABLE_NATIVE_ALIASES
#endif
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <simde/x86/fma.h>
#include <stdint.h>

namespace ft_simde_emu {

inline float cvtsh_ss(unsigned short h) {
    return simde_mm_cvtss_f32(simde_mm_cvtph_ps(simde_mm_cvtsi32_si128(int(h))));
}
inline simde__m512 cvtepi32_ps(simde__m512i a) {
    int32_t v[16];
    float f[16];
    simde_mm512_storeu_si512(v, a);
    for (int i = 0; i < 16; ++i) f[i] = float(v[i]);  // round to nearest even, as vcvtdq2ps
    return simde_mm512_loadu_ps(f);
}
// 16 bytes, read as Byte (int8_t: sign-extended, uint8_t: zero-extended), widened to int32.
template <typename Byte>
inline simde__m512i widen8_epi32(simde__m128i a) {
    Byte v[16];
    int32_t r[16];
    simde_mm_storeu_si128(v, a);
    for (int i = 0; i < 16; ++i) r[i] = v[i];
    return simde_mm512_loadu_si512(r);
}
inline simde__m512i cvtepi8_epi32(simde__m128i a) { return widen8_epi32<int8_t>(a); }
inline simde__m512i cvtepu8_epi32(simde__m128i a) { return widen8_epi32<uint8_t>(a); }
// Words whose bit of k is set: a >> imm (logical; 0 for imm > 15); the others from src.
inline simde__m512i mask_srli_epi16(simde__m512i src, uint32_t k, simde__m512i a, unsigned imm) {
    uint16_t s[32], v[32];
    simde_mm512_storeu_si512(s, src);
    simde_mm512_storeu_si512(v, a);
    for (int i = 0; i < 32; ++i)
        if ((k >> i) & 1) s[i] = imm > 15 ? 0 : uint16_t(v[i] >> imm);
    return simde_mm512_loadu_si512(s);
}
inline float reduce_add_ps(simde__m512 a) {
    float f[16], s = 0.0f;
    simde_mm512_storeu_ps(f, a);
    for (int i = 0; i < 16; ++i) s += f[i];
    return s;
}
// Within each 128-bit lane, element j = element (imm >> 2j) & 3.
inline simde__m512i shuffle_epi32(simde__m512i a, int imm) {
    int32_t v[16], r[16];
    simde_mm512_storeu_si512(v, a);
    for (int l = 0; l < 4; ++l)
        for (int j = 0; j < 4; ++j) r[4 * l + j] = v[4 * l + ((imm >> (2 * j)) & 3)];
    return simde_mm512_loadu_si512(r);
}
inline simde__m512 zextps256_ps512(simde__m256 a) {
    float f[16] = {};
    simde_mm256_storeu_ps(f, a);
    return simde_mm512_loadu_ps(f);
}
inline simde__m512i zextsi256_si512(simde__m256i a) {
    int32_t v[16] = {};
    simde_mm256_storeu_si256(v, a);
    return simde_mm512_loadu_si512(v);
}
// Lanes whose bit of k is set loaded, the others zero and their memory not read.
inline simde__m256 maskz_loadu_ps256(uint8_t k, const float *p) {
    float f[8] = {};
    for (int i = 0; i < 8; ++i)
        if ((k >> i) & 1) f[i] = p[i];
    return simde_mm256_loadu_ps(f);
}

}  // namespace ft_simde_emu

#define _cvtsh_ss ft_simde_emu::cvtsh_ss
#define _mm512_cvtepi32_ps ft_simde_emu::cvtepi32_ps
#define _mm512_cvtepi8_epi32 ft_simde_emu::cvtepi8_epi32
#define _mm512_cvtepu8_epi32 ft_simde_emu::cvtepu8_epi32
#define _mm512_mask_srli_epi16 ft_simde_emu::mask_srli_epi16
#define _mm512_reduce_add_ps ft_simde_emu::reduce_add_ps
#define _mm512_shuffle_epi32(a, imm) ft_simde_emu::shuffle_epi32(a, int(imm))
#define _mm512_zextps256_ps512 ft_simde_emu::zextps256_ps512
#define _mm512_zextsi256_si512 ft_simde_emu::zextsi256_si512
#define _mm256_maskz_loadu_ps ft_simde_emu::maskz_loadu_ps256
// Names SIMDe 0.7 does not alias (or aliases with the masked form's arguments).
typedef simde__mmask8 __mmask8;
typedef simde__mmask16 __mmask16;
typedef simde__mmask32 __mmask32;
typedef simde__mmask64 __mmask64;
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
#define _mm512_shuffle_i64x2(a, b, imm) simde_mm512_shuffle_i64x2(a, b, imm)
#ifndef _MM_PERM_BADC
#define _MM_PERM_BADC 0x4E
#define _MM_PERM_CDAB 0xB1
#endif
