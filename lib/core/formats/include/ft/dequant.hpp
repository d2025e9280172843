// Scalar reference numerics of every expert format (docs/formats.md): element decoders, per-row
// dequantisation in the exact bank byte layouts, and the activation-side quantisers the CPU
// kernels mirror. This is the one definition every kernel and every test is checked against;
// it favours obviousness over speed.
//
// Edge cases, decided once here (the original engine's CPU and GPU paths disagree on them):
//
// * e4m3 ("fn", no infinities): codes 0x7F and 0xFF are NaN, not +-480; the largest finite
//   value is 448 (0x7E). Encoding saturates finite values to +-448 and maps NaN to 0x7F.
// * e8m0 (OCP MX scale, pure exponent): code s is 2^(s-127) for s in [0, 254]; code 0 is
//   2^-127 (an fp32 subnormal, NOT zero: the format has no zero, and a kernel that builds the
//   float as `s << 23` must special-case it); code 255 is NaN, as the OCP MX specification
//   defines it. The loaders reject 255 in a checkpoint's scale tensors (FT_ERR_FORMAT naming the
//   tensor) because no real quantiser emits it, so banks never hold it.
// * fp16 (q4_0's d, nvfp4's per-row global): full IEEE half: subnormals decode exactly, +-Inf
//   and NaN decode to themselves and propagate by IEEE rules (q = 8 with d = Inf gives NaN).
//   Loaders do not scan for them; a poisoned scale shows up as non-finite expert output.
// * e2m1: code 8 is -0; all 16 codes are finite.
// * Rows whose length is not a multiple of the format's block are not supported anywhere:
//   no partial last block. Loaders reject such tensors with FT_ERR_FORMAT naming the tensor and
//   bank_schema() rejects such geometry; see format_block() in formats.hpp for the multiples.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ft {

// ---- element decoders / encoders ------------------------------------------------------------

// e2m1 (fp4): low 4 bits of `code`; magnitude {0, .5, 1, 1.5, 2, 3, 4, 6}[c & 7], sign bit 3.
float e2m1_to_f32(uint8_t code);
// Nearest e2m1 code (ties to the even code, i.e. the one with mantissa bit 0); saturates at +-6.
uint8_t f32_to_e2m1(float v);

// fp8 e4m3fn: bias 7, subnormals m/8 * 2^-6, max 448; 0x7F / 0xFF are NaN.
float e4m3_to_f32(uint8_t v);
// Round to nearest even, saturating to +-448; NaN -> 0x7F. Values below half the smallest
// subnormal (2^-10) become signed zero.
uint8_t f32_to_e4m3(float v);

// e8m0: 2^(s-127); 0 -> 2^-127; 255 -> NaN.
float e8m0_to_f32(uint8_t s);

// IEEE half from f32, round to nearest even, overflow to Inf, NaN stays NaN.
uint16_t f32_to_f16(float v);

// ---- block constants ------------------------------------------------------------------------

constexpr int kFp8Block = 128;   // fp8_block: 128 x 128 weight tiles per scale_inv
constexpr int kNvfp4Block = 16;  // nvfp4: elements per e4m3 block scale
constexpr int kMxfp4Block = 32;  // mxfp4: K elements per e8m0 scale
constexpr int kDsfp4Block = 32;  // ds_fp4: elements per e8m0 scale
constexpr int kQ4_0Block = 32;   // q4_0: elements per 18-byte block
constexpr int kQ4_0BlockBytes = 18;
constexpr int kFp8ActBlock = 128;  // ds_fp4 activation FP8 round trip group
constexpr int kQ8_0BlockBytes = 34;  // q8_0: fp16 d, int8 q[32]
constexpr int kQK = 256;             // K-quant and iq4_xs super-block
constexpr int kQ2_KBlockBytes = 84;
constexpr int kQ3_KBlockBytes = 110;
constexpr int kQ4_KBlockBytes = 144;
constexpr int kQ5_KBlockBytes = 176;
constexpr int kQ6_KBlockBytes = 210;
constexpr int kIQ4_XSBlockBytes = 136;

// ---- per-row dequantisation (out[k], k in [0, K); K a multiple of the block) -----------------

// fp8_block: one row of e4m3 weights and the K/128 bf16 scale_inv entries of the 128-row band the
// row lies in: w[k] = e4m3(row[k]) * bf16(scale_inv[k / 128]).
void dequant_row_fp8_block(const uint8_t *row, const uint16_t *scale_inv_band, int64_t K, float *out);

// nvfp4 (ModelOpt): packed[K/2] (byte j: element 2j low nibble, 2j+1 high nibble), scale[K/16]
// e4m3, global fp16 for the row: w[k] = e2m1 * e4m3(scale[k/16]) * f16(global).
void dequant_row_nvfp4(const uint8_t *packed, const uint8_t *scale, uint16_t global_f16, int64_t K, float *out);

// ds_fp4 (DeepSeek-V4): like nvfp4 without the global and with e8m0 scales per 32:
// w[k] = e2m1 * 2^(scale[k/32] - 127).
void dequant_row_ds_fp4(const uint8_t *packed, const uint8_t *scale, int64_t K, float *out);

// q4_0 (GGUF): K/32 blocks of 18 bytes: fp16 d (little-endian), then 16 bytes qs; element j
// (0..15) is the low nibble of qs[j], element j + 16 the high nibble: w = (q - 8) * d.
void dequant_row_q4_0(const uint8_t *blocks, int64_t K, float *out);

// GGUF block formats beyond q4_0, one row of K elements (K a multiple of the block) in ggml's
// byte layouts, documented field by field in docs/formats.md ("GGUF block formats"). All fp16
// fields are little-endian IEEE half with the fp16 rules above.
//   q8_0:   blocks of 34 bytes: fp16 d, int8 q[32]: w = d * q.
//   q2_k:   84 bytes per 256: scales[16] (low nibble scale, high nibble min of each 16), qs[64]
//           (2-bit), fp16 d, fp16 dmin: w = d * sc * q - dmin * m.
//   q3_k:   110 bytes: hmask[32], qs[64] (low 2 bits), scales[12] (16 signed 6-bit scales, -32
//           biased), fp16 d: w = d * (sc - 32) * (q - 4 * !hbit).
//   q4_k:   144 bytes: fp16 d, fp16 dmin, scales[12] (8 6-bit scales and 8 6-bit mins), qs[128]:
//           w = d * sc * q - dmin * m per sub-block of 32.
//   q5_k:   176 bytes: fp16 d, fp16 dmin, scales[12], qh[32], qs[128]: as q4_k with a fifth bit.
//   q6_k:   210 bytes: ql[128], qh[64], int8 scales[16], fp16 d: w = d * sc * (q - 32) per 16.
//   iq4_xs: 136 bytes: fp16 d, u16 scales_h, scales_l[4], qs[128]: w = d * (ls - 32) *
//           kIq4nlValues[nibble] per sub-block of 32.
void dequant_row_q8_0(const uint8_t *blocks, int64_t K, float *out);
void dequant_row_q2_k(const uint8_t *blocks, int64_t K, float *out);
void dequant_row_q3_k(const uint8_t *blocks, int64_t K, float *out);
void dequant_row_q4_k(const uint8_t *blocks, int64_t K, float *out);
void dequant_row_q5_k(const uint8_t *blocks, int64_t K, float *out);
void dequant_row_q6_k(const uint8_t *blocks, int64_t K, float *out);
void dequant_row_iq4_xs(const uint8_t *blocks, int64_t K, float *out);
// The 16 non-uniform levels of iq4_xs (and ggml's IQ4_NL), as int8.
extern const int8_t kIq4nlValues[16];

// mxfp4 (gpt-oss, transposed, N innermost): output unit n of a [K/2][N] blocks / [K/32][N]
// scales matrix pair: W[n, k] = e2m1(nibble k&1 of blocks[k/2][n]) * 2^(scales[k/32][n] - 127).
// The bias is not part of W (see dequant_projection in formats.hpp).
void dequant_col_mxfp4(const uint8_t *blocks, const uint8_t *scales, int64_t K, int64_t N, int64_t n, float *out);

// ---- activation-side quantisers -------------------------------------------------------------

// Rounding to nearest, ties away from zero (what the integer paths use).
float round_half_away(float v);

// Blocks whose largest magnitude is below this quantise to zero codes with d = 1: below it
// 1 / d would overflow fp32 (a bf16 input can be that small).
constexpr float kQ8MinAmax = 0x1p-100f;

// Q8_0 (q4_0's W4A8 path), per block of 32 (K a multiple of 32):
//   amax = max |x|; d = amax / 127 in fp32, d = 1 when amax < kQ8MinAmax (zero included);
//   q = clamp(round_half_away(x * (1 / d)), -127, 127) with 1/d computed once per block in fp32.
// Multiplying by the reciprocal (not dividing) is part of the definition, so SIMD kernels that
// do the same are bit-exact. Dequantised value: q * d. |x - q d| <= d / 2 (+ fp32 rounding).
// A block holding NaN or +-Inf gets zero codes and d = NaN (the dot products using it are NaN:
// docs/limits.md, non-finite values). No input makes a float -> int conversion undefined.
void quantize_q8_0(const float *x, int64_t K, int8_t *q, float *d);

// Q8_K (the K-quants' and iq4_xs' CPU activations): the same rule per block of 256 (K a multiple
// of 256), d[b] the scale of elements 256b .. 256b + 255. One scale per super-block lets a kernel
// keep a super-block's integer sums in int32 and convert once.
void quantize_q8_k(const float *x, int64_t K, int8_t *q, float *d);

// nvfp4 W4A8: the same rule per block of 16, stored per block as [8 even elements, 8 odd
// elements] (q[16b + i] = x[16b + 2i], q[16b + 8 + i] = x[16b + 2i + 1]) so a kernel can pair them
// with the low / high nibbles of 8 packed bytes. d[b] is the block's scale.
void quantize_int8_per16(const float *x, int64_t K, int8_t *q, float *d);

// DeepSeek-V4 activation FP8 round trip (ds_fp4), per group of 128 (K a multiple of 128):
//   amax = max(max |x|, 1e-4); s = 2^ceil(log2(amax / 448)), the ceiling taken from the fp32
//   bits of amax / 448 (unbiased exponent, +1 if any mantissa bit is set);
//   y = round_e4m3(clamp(x / s, -448, 448)) * s, then rounded to bf16 (y is stored bf16).
// Returns the bf16 values as floats (exactly representable in bf16).
void fp8_round_trip_per128(const float *x, int64_t K, float *y);

// The e4m3 rounding used above: nearest e4m3 value of v (RNE), saturating at +-448.
float round_e4m3(float v);

}  // namespace ft
