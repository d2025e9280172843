// Declarations of the per-tier kernels of the quantised expert formats. Included by the tier
// translation units, so it must stay free of inline functions and templates (see
// cpu/CMakeLists.txt).
//
// A kernel computes out[t * ldo + j] = dot(output first + j of matrix m, act[t]) for j < count
// and t < ntok, in fp32. Outputs are weight rows, except for mxfp4 where they are columns of the
// transposed [K][N] matrix. act[t] is the activation of token t prepared by the format's
// prepare function (quant.cpp) in the layout documented there.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ft/dequant.hpp"  // kQ8MinAmax of the Q8_0 rule (plain declarations and constants only)

namespace ft::cpu::detail {

struct QuantMatrix {
    const uint8_t *data;    // weights: fp8_block e4m3 [N,K]; nvfp4/ds_fp4 packed [N,K/2];
                            // q4_0 and the other GGUF block formats: blocks [N, row bytes];
                            // mxfp4 blocks [K/2][N]
    const uint8_t *scale;   // fp8_block bf16 [N/128][K/128]; nvfp4 e4m3 [N,K/16]; ds_fp4 e8m0
                            // [N,K/32]; mxfp4 e8m0 [K/32][N]; block formats: unused
    const uint8_t *global;  // nvfp4: fp16 [N]; others unused
    int64_t K;              // reduction length
    int64_t N;              // outputs of the whole matrix (mxfp4: its row stride in bytes)
};

using QuantGemv = void (*)(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok,
                           float *out, size_t ldo);

// Element decode tables filled once from the lib/core/formats reference decoders (so every edge case,
// e4m3 NaN codes and e8m0 code 0 = 2^-127 included, is the reference's by construction).
extern float g_e2m1[16];
extern float g_e4m3[256];
extern float g_e8m0[256];
// bf16 bits for the bf16-activation kernels: the 16 e2m1 codes twice (index = low 5 bits of a
// byte gives its low nibble), and bf16(e4m3(i & 7)) for the E == 0 codes (zero and subnormals).
extern uint16_t g_e2m1_bf16x32[32];
extern uint16_t g_e4m3_sub_bf16x32[32];
// u = 2 * e2m1 + 12 as unsigned bytes (0 .. 24, exact), the 16 codes four times (a `vpermb`
// index reads the low 6 bits): the W4A8 mxfp4/nvfp4 kernels' weights.
extern uint8_t g_e2m1_u8x64[64];
// 2 * e2m1 as int16 (-12 .. 12, exact), the 16 codes twice (a `vpermw` index reads the low 5
// bits): the weights of the mxfp4 W4A8 x2 kernel's calls of several tokens.
extern int16_t g_e2m1_i16x32[32];

// Bytes of a prepared q4_0 activation of length K: int8 q[K] (Q8_0), then float d[K/32].
size_t q8_0_act_bytes(int64_t K);
// q4_0 with VNNI, four blocks per step (q4_0_avx512vnni_x4): per group of 4 blocks (128
// elements, zero-padded), 256 bytes: int8 q of elements 0..15 of the 4 blocks (16 bytes each),
// int8 q of elements 16..31, int32 c[16] (lane l: -8 * the sum of its 8 q, block l / 4), float
// d[16] (the block's d per lane).
size_t q8_0_x4_act_bytes(int64_t K);
void prepare_q8_0_x4_scalar(const uint16_t *x, int64_t K, uint8_t *dst);
// nvfp4 W4A8 (nvfp4_avx512vnni_w4a8): ft::quantize_int8_per16 values, per 128 elements
// (zero-padded) 256 bytes: int8 q of the even elements (lane l: elements 8l, 8l + 2, 8l + 4,
// 8l + 6), of the odd ones, int32 -12 * sum of the lane's 8 q, float d / 2 of the lane's block.
size_t nvfp4_q8_act_bytes(int64_t K);
// mxfp4 W4A8 x2 (mxfp4_avx512vnni_w4a8): each activation block of 32 as two int8 terms,
// x ~ d * (q1 + q2 / 256): q1, d = Q8_0 (ft::quantize_q8_0), q2 = the residual (mxfp4_residual_q8),
// so |x - d (q1 + q2 / 256)| <= d / 512 (d / 256 where q2 clamps): about 15 bits per block,
// finer than bf16 for all but the block's smallest values. Layout: int8 q1[Kp], int8 q2[Kp]
// (Kp = K rounded up to 64, zero-padded), float d[K/32] / 512, int32 {-12 sum(q1), -12 sum(q2)}
// per block; all of it after int16 x16[Kp] = 256 q1 + q2 (zero-padded), the same values as one
// int16 per element (|x16| <= 32639), which the kernel's calls of several tokens read.
void mxfp4_residual_q8(const float *x, const int8_t *q, float d, int8_t *q2);
size_t mxfp4_q8_act_bytes(int64_t K);
// That layout by its definition (ft::quantize_q8_0, mxfp4_residual_q8): the AVX2 tier's preparation.
void prepare_mxfp4_q8x2_scalar(const uint16_t *x, int64_t K, uint8_t *dst);
// nvfp4 / ds_fp4 W4A8 x2 (their AVX2 kernels): the same two terms per 32 elements
// (zero-padded to a multiple of 64; ds_fp4 after its FP8 round trip) as one int16,
// x16 = 256 q1 + q2, so x ~ d / 256 * x16. Per 64 elements: 4 vectors of 16 int16 (vector g,
// word i: element 4 i + {0, 2, 1, 3}[g]), the order of the kernels' decode; after all of them,
// per 64 elements 8 floats: d / 512 of the first 32 four times, then of the second 32.
size_t e2m1_x16_act_bytes(int64_t K);
void prepare_nvfp4_x16(const uint16_t *x, int64_t K, uint8_t *dst);
void prepare_ds_fp4_x16(const uint16_t *x, int64_t K, uint8_t *dst);
// The same values for the AVX-512 kernels (x16z): zero-padded to a multiple of 128, and per 128
// elements vector g of its first 64 then vector g of its second (g = 0..3), so that one 64-byte
// load holds both; then the floats as above (per 128: 16, in element order).
size_t e2m1_x16z_act_bytes(int64_t K);
void prepare_nvfp4_x16z(const uint16_t *x, int64_t K, uint8_t *dst);
void prepare_ds_fp4_x16z(const uint16_t *x, int64_t K, uint8_t *dst);

void fp8_block_scalar(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void nvfp4_scalar(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void ds_fp4_scalar(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q4_0_scalar(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void mxfp4_scalar(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
// GGUF block formats beyond q4_0 (quant_gguf_scalar.cpp): weights in the file's blocks [N, K/block
// blocks], activations Q8_0 in the q4_0 layout (q8_0_act_bytes).
void q8_0_scalar(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q4_k_scalar(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q5_k_scalar(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q6_k_scalar(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);

// AVX2 + FMA + F16C (quant_avx2.cpp, quant_avx2_unit.inc): fp8_block fp32 activations, q4_0 Q8_0, nvfp4 / ds_fp4
// e2m1_x16_act_bytes, mxfp4 mxfp4_q8_act_bytes.
void fp8_block_avx2(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void nvfp4_avx2(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void ds_fp4_avx2(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q4_0_avx2(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void mxfp4_avx2(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
// The same with AVX-VNNI (quant_avxvnni.cpp; same activations, same results).
void nvfp4_avxvnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void ds_fp4_avxvnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q4_0_avxvnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void mxfp4_avxvnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
// GGUF block formats (quant_gguf_avx2.cpp; with AVX-VNNI quant_gguf_avxvnni.cpp, same results),
// the scalar kernels' layouts.
void q8_0_avx2(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q4_k_avx2(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q5_k_avx2(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q6_k_avx2(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q8_0_avxvnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q4_k_avxvnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q5_k_avxvnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q6_k_avxvnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);

void fp8_block_avx512(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void nvfp4_avx512(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void ds_fp4_avx512(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q4_0_avx512(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void mxfp4_avx512(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);

// AVX-512-BF16 (quant_avx512bf16.cpp): bf16 activations. fp8_block, mxfp4: bf16[K] as is;
// nvfp4, ds_fp4: bf16 per 128 elements in 4 phases (word m of phase r = x[4m + r]), zero-padded
// to a multiple of 128.
void fp8_block_avx512bf16(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
// AMX-BF16 tiles for calls of 2 or more tokens (gemv_amx.cpp), the rest through
// fp8_block_avx512bf16; same activation. Only where amx_bf16_available() (ft/cpu.hpp).
void fp8_block_amx(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void nvfp4_avx512bf16(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void mxfp4_avx512bf16(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);

// Batched path (many tokens per expert): rows [first, first + count) of the matrix dequantised
// to bf16 in the K order of the format's prepared activation (nvfp4/ds_fp4: 4 phases per 128),
// row j at dst + j * ld (ld >= K rounded up to 128), block scales multiplied in (exact), the
// per-row factor that does not fit bf16 exactly (nvfp4's fp16 global; else 1) in row_scale[j].
// The bf16 GEMV of the tier then runs on them with the prepared activations.
using QuantDequant = void (*)(const QuantMatrix &m, int64_t first, int count, uint16_t *dst, size_t ld,
                              float *row_scale);
void nvfp4_dequant_avx512bf16(const QuantMatrix &, int64_t, int, uint16_t *, size_t, float *);

// ds_fp4 with a row exponent (quant_avx512bf16.cpp, ds_row_bias): the e8m0 codes of a row are
// decoded relative to its largest one and 2^(smax - 127) multiplies the row sum, so no block
// factor or product is an fp32 subnormal (Intel cores take microcode assists for those); same
// layout and numerics otherwise. Also its batched-path dequantiser (row_scale = 2^(smax - 127)).
void ds_fp4_avx512bf16_rowexp(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void ds_fp4_dequant_avx512bf16_rowexp(const QuantMatrix &, int64_t, int, uint16_t *, size_t, float *);
// The ds_fp4 activation of the AVX-512-BF16 kernels (bf16 per 128 in 4 phases after the FP8 round
// trip): the scalar definition (quant.cpp) and its SIMD form, byte-identical (tested).
void prepare_ds_fp4_bf16_scalar(const uint16_t *x, int64_t K, uint8_t *dst);
void prepare_ds_fp4_bf16_avx512(const uint16_t *x, int64_t K, uint8_t *dst);

// AVX-512-BF16 + VBMI (quant_avx512vbmi.cpp): mxfp4, activations bf16[K] as for avx512bf16.
void mxfp4_avx512vbmi(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
// AMX-BF16 tiles for calls of 2 or more tokens (quant_e2m1_amx.cpp), one-token calls and lines
// holding e8m0 codes outside 64..190 through mxfp4_avx512vbmi; same activation. Only where
// quant_amx_available(Format::mxfp4) (quant.hpp).
void mxfp4_amx(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
// The same for ds_fp4 (quant_e2m1_amx.cpp), one-token calls, the last count % 16 rows and rows
// holding codes outside 64..190 through ds_fp4_avx512bf16_rowexp; same activation.
void ds_fp4_amx(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);

// AVX-512-VNNI (quant_avx512vnni.cpp): q4_0 x Q8_0 with vpdpbusd, activations q8_0_vnni layout.
// AVX-512-VNNI + VBMI (quant_avx512vnni_vbmi.cpp): mxfp4 W4A8, activations mxfp4_q8 layout.
void mxfp4_avx512vnni_w4a8(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
// Its activation preparation (mxfp4_q8_act_bytes), bit-identical to quantize_q8_0 +
// mxfp4_residual_q8 (tested), ~40x faster than those in scalar code.
void prepare_mxfp4_q8x2_avx512(const uint16_t *x, int64_t K, uint8_t *dst);
// nvfp4 / ds_fp4 W4A8 x2 on AVX-512-VNNI (quant_avx512vnni.cpp), activations e2m1_x16z.
void nvfp4_avx512vnni_x16(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void ds_fp4_avx512vnni_x16(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
// nvfp4 W4A8 (quant_avx512vnni.cpp), activations nvfp4_q8 layout.
void nvfp4_avx512vnni_w4a8(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q4_0_avx512vnni_x4(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
// Its activation preparation, byte-identical to prepare_q8_0_x4_scalar (quant.cpp, tested).
void prepare_q8_0_x4_avx512(const uint16_t *x, int64_t K, uint8_t *dst);

// Low-bit GGUF super-block formats (256 elements per block), Q8_K activations (q8_0_act_bytes):
// q2_k, q3_k, iq4_xs. Scalar (quant_gguf_scalar.cpp): the reference row dequantisation dotted
// per block of 32; AVX2 + FMA + F16C (quant_gguf_low_avx2.cpp; with AVX-VNNI
// quant_gguf_low_avxvnni.cpp): integer dots summed per super-block.
void q2_k_scalar(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q3_k_scalar(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void iq4_xs_scalar(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q2_k_avx2(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q3_k_avx2(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void iq4_xs_avx2(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q2_k_avxvnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q3_k_avxvnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void iq4_xs_avxvnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
// AVX-512F/BW/VL (quant_gguf_avx512.cpp) and AVX-512-VNNI (quant_gguf_avx512vnni.cpp) kernels of
// every GGUF block format beyond q4_0: two blocks of 32 per register, the q8_0_act_bytes layout.
void q8_0_avx512(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q4_k_avx512(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q5_k_avx512(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q6_k_avx512(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q2_k_avx512(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q3_k_avx512(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void iq4_xs_avx512(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q8_0_avx512vnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q4_k_avx512vnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q5_k_avx512vnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q6_k_avx512vnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q2_k_avx512vnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
// AMX-INT8 tiles for calls of 5 or more tokens (quant_gguf_amx.cpp), the rest through the
// AVX-512-VNNI kernel; same activation. Only where quant_amx_available(f) (quant.hpp).
void q2_k_amx(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q3_k_amx(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void q3_k_avx512vnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);
void iq4_xs_avx512vnni(const QuantMatrix &, int64_t, int, const uint8_t *const *, int, float *, size_t);

}  // namespace ft::cpu::detail
