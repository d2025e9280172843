// Kernels and activation preparation of the quantised expert formats (internal to ft_cpu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ft/cpu.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu {

struct QuantOps {
    Format format;
    detail::QuantGemv gemv;
    const char *kernel;  // e.g. "nvfp4-w4a16-avx512", for logs and benchmarks
    // Bytes of one prepared activation of length K (a multiple of 64, so rows stay aligned).
    size_t (*act_bytes)(int64_t K);
    // x (bf16, K values) -> the layout the kernels of the format read (quant.cpp documents each).
    void (*prepare)(const uint16_t *x, int64_t K, uint8_t *dst);
    // Batched path (quant_kernels.hpp): dequantise rows to bf16 for the tier's bf16 GEMV over the
    // prepared activations; nullptr where the format has none at this tier.
    detail::QuantDequant dequant;
    // Bytes of the leading part of the prepared activation that the batched path reads (bf16 in
    // dequant's column order): act_bytes unless the kernel's own layout follows; set with dequant.
    size_t (*dequant_act_bytes)(int64_t K);
    // > 0: calls of more tokens than this run the tier's W4A16 kernel (or the AMX one) on the
    // leading bf16 part of the activation, the others the W4A8 x2 kernel on the rest (nvfp4, ds_fp4
    // with AVX-512-VNNI at avx512bf16; the AMX variants of mxfp4 and ds_fp4).
    int x2_max_tokens;
};

// The kernels of `f` at tier `isa` (the best the format has at or below it; with choice.vnni the
// VNNI ones where the CPU has AVX-512-VNNI (tiers >= avx512) or AVX-VNNI (avx2)); nullptr for bf16.
// amx: the format's AMX kernel at the avx512bf16 tier where quant_amx_available(f) (the executor
// passes whether its GEMV is the AMX one).
const QuantOps *quant_ops(Format f, Isa isa, const QuantChoice &choice, bool amx = false);
// The same with VNNI and VBMI forced on or off (tests; each only true on a CPU that has it: VNNI
// means AVX-512-VNNI at tiers >= avx512 and AVX-VNNI at the avx2 tier). VBMI
// selects mxfp4's avx512bf16vbmi kernel at the avx512bf16 tier (quant_avx512vbmi.cpp), which
// quant_ops uses whenever the CPU has avx512vbmi.
// fast: the format's W4A8 kernel where it has one (nvfp4: W4A8; mxfp4: W4A8 x2, also needing
// vbmi and the avx512bf16 tier), only with vnni. amx: the format's AMX kernel at the avx512bf16
// tier (only true where quant_amx_available(f)).
const QuantOps *quant_ops_variant(Format f, Isa isa, bool vnni, bool vbmi, bool fast = false, bool amx = false);
bool cpu_has_vbmi();
// Whether the format has an AMX kernel this CPU runs: fp8_block (AMX-BF16, amx_bf16_available),
// mxfp4 and ds_fp4 (AMX-BF16 and VBMI), q2_k and q3_k (AMX-INT8 and VBMI); false for the others.
bool quant_amx_available(Format f);
// AVX-VNNI (VEX vpdpbusd / vpdpwssd) in cpuid: the avx2 tier's VNNI kernels.
bool cpu_has_avx_vnni();

// DeepSeek-V4 FP8 round trip per 128 (ft::fp8_round_trip_per128, bit-identical), input bf16.
void fp8_round_trip_bf16(const uint16_t *x, int64_t K, float *y);

}  // namespace ft::cpu
