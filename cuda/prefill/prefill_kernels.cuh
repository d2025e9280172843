// The kernels of the GPU prefill (prefill.cpp): bf16 dequantisation of whole experts, the gather
// of the chunk's rows, and the epilogue / scatter after each GEMM. Private to ft_cuda_prefill.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ft/cuda_activation.hpp"
#include "ft/cuda_experts.hpp"
#include "ft/formats.hpp"

namespace ft::cuda::prefill {

// Where each format keeps its matrices in the bank schema (-1: none); the CPU executor's table.
struct Roles {
    int gu, gu_scale, gu_global, gu_bias, dn, dn_scale, dn_global, dn_bias;
};

Roles roles_of(Format f);

// xg[r] = x[row_token[r]] for the chunk's rows (ds_fp4: FP8-round-tripped per 128); vec: x is
// 16-byte aligned.
void launch_gather_rows(bool ds_fp4, bool vec, const uint16_t *x, const int32_t *row_token, int32_t H, uint16_t *xg,
                        int32_t rows, cudaStream_t s);

// After the gate_up GEMM (scatter false): the intermediate of the chunk's rows from acc; after
// the down GEMM (scatter true): route_out[row_route[r]] = acc[r] with the format's per-row factor.
void launch_format(Format f, bool scatter, const float *acc, const int32_t *rt, const int32_t *rs,
                   const DeviceExperts &ex, const Roles &ro, const DeviceActivation &act, bool ds_clamp,
                   uint16_t *inter, float *route_out, int32_t rows, cudaStream_t s);

}  // namespace ft::cuda::prefill
