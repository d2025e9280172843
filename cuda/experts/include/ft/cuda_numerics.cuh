// Device-side element decoders and activations of every expert format: the CUDA twins of
// ft/dequant.hpp (the scalar reference, where the edge cases are decided) and of the CPU
// executor's activate(). Header-only so each kernel file inlines them; every function here is
// tested against its host counterpart bit for bit (tests/experts/test_experts_gpu.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cstdint>

#include "freetoken.h"
#include "ft/cuda_activation.hpp"  // DeviceActivation, shared with host code

namespace ft::cuda {

__device__ __forceinline__ float bf16_to_f32(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }

// Round to nearest even, NaN kept (as __float2bfloat16_rn does).
__device__ __forceinline__ uint16_t f32_to_bf16(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ __forceinline__ float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

// Full IEEE half: subnormals exact, Inf and NaN kept.
__device__ __forceinline__ float f16_to_f32(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

// e4m3fn: bias 7, subnormals m * 2^-9, 0x7F / 0xFF NaN.
__device__ __forceinline__ float e4m3_to_f32(uint8_t v) {
    const uint32_t sign = uint32_t(v & 0x80u) << 24;
    const uint32_t e = (v >> 3) & 0xfu, m = v & 0x7u;
    if (e == 15 && m == 7) return __uint_as_float(0x7fc00000u | sign);
    float mag;
    if (e == 0)
        mag = float(m) * 0.001953125f;  // 2^-9
    else
        mag = __uint_as_float(((e + 120u) << 23) | (m << 20));  // 2^(e-7) * (1 + m/8)
    return __uint_as_float(__float_as_uint(mag) | sign);
}

// e8m0: 2^(s - 127); code 0 is 2^-127 (an fp32 subnormal), 255 is NaN.
__device__ __forceinline__ float e8m0_to_f32(uint8_t s) {
    if (s == 0) return __uint_as_float(0x00400000u);
    if (s == 255) return __uint_as_float(0x7fc00000u);
    return __uint_as_float(uint32_t(s) << 23);
}

// e2m1 (low 4 bits): magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign (code 8 is -0).
__device__ __forceinline__ float e2m1_to_f32(uint32_t code) {
    const uint32_t e = (code >> 1) & 3u, m = code & 1u;
    // e = 0: m * 0.5; else (1 + m/2) * 2^(e-1), built as an fp32 with exponent e - 1 + 127.
    const uint32_t mag_bits = e == 0 ? (m ? 0x3f000000u : 0u) : (((e + 126u) << 23) | (m << 22));
    return __uint_as_float(mag_bits | ((code & 8u) << 28));
}

// Nearest e4m3 value of v (round to nearest even), saturating at +-448 (ft::round_e4m3).
__device__ __forceinline__ float round_e4m3(float v) {
    const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    return e4m3_to_f32(uint8_t(q));
}

// The scale of ft::fp8_round_trip_per128 for a group whose largest magnitude is amax:
// 2^ceil(log2(max(amax, 1e-4) / 448)), the ceiling taken from the fp32 bits.
__device__ __forceinline__ float fp8_group_scale(float amax) {
    const float r = fmaxf(amax, 1e-4f) / 448.0f;
    const uint32_t bits = __float_as_uint(r);
    const int e = int((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0 ? 1 : 0);
    return ldexpf(1.0f, e);
}

// One element of the DeepSeek-V4 FP8 round trip with the group's scale s (bf16-exact result).
__device__ __forceinline__ float fp8_round_trip(float x, float s) {
    const float c = fminf(fmaxf(x / s, -448.0f), 448.0f);
    return round_bf16(round_e4m3(c) * s);
}

// out = act(g) * u, exactly the formulas of the CPU executor (cpu/src/moe_internal.hpp).
__device__ __forceinline__ float activate(const DeviceActivation &a, float g, float u) {
    switch (a.kind) {
        case FT_ACT_GELU: return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f)) * u;
        case FT_ACT_GELU_TANH: {
            const float k = 0.79788456080286536f;
            return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * u;
        }
        case FT_ACT_SWIGLU_CLAMP: {
            g = fminf(g, a.limit);
            u = fmaxf(fminf(u, a.limit), -a.limit);
            return g / (1.0f + expf(-a.alpha * g)) * (u + 1.0f);
        }
        default: return g / (1.0f + expf(-g)) * u;
    }
}

// e2m1 code in the low 4 bits of `code` (higher bits ignored), decoded without branches: the three
// magnitude bits become the exponent and top mantissa bit of an fp32 2^-126 below the value (code 1
// a subnormal), so one exact multiply by 2^126 finishes it. Equal to e2m1_to_f32 for all 16 codes;
// needs fp32 subnormals (no -ftz), which is nvcc's default.
__device__ __forceinline__ float e2m1_to_f32_mul(uint32_t code) {
    const uint32_t bits = ((code & 7u) << 22) | ((code & 8u) << 28);
    return __uint_as_float(bits) * 0x1p126f;
}

// Two e4m3 codes (low byte first) to fp32 through the hardware e4m3x2 -> f16x2 conversion: every
// finite e4m3 value (subnormals included) is exact in f16, and NaN codes stay NaN.
__device__ __forceinline__ float2 e4m3x2_to_f32x2(uint16_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
    return __half22float2(*reinterpret_cast<const __half2 *>(&h));
}

}  // namespace ft::cuda
