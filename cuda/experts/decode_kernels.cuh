// Shared pieces of the decode kernels (decode.cu): launch constants, streaming loads, the
// projection arguments, the gate_up epilogue, the mma.sync primitives and the launchers each
// kernel file (decode_simt.cu, decode_mma.cu, decode_mxfp4.cu, decode_group.cu) exports.
// Private to ft_cuda_experts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "ft/cuda_activation.hpp"
#include "ft/cuda_numerics.cuh"
#include "ft/formats.hpp"

namespace ft::cuda::decode {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRouteChunk = 4;  // routes whose accumulators live in registers at once
constexpr int kMaxGridY = 65535;
constexpr int kGroupThreads = 512;
constexpr int kMmaRoutes = 8;  // the n side of m16n8k16 (decode_mma.cu)
constexpr int kMxMmaCols = 64;  // output columns of one mxfp4 CTA (decode_mxfp4.cu)

// ---- loads ----------------------------------------------------------------------------------

// Weights are read once: stream them past L1 so the activations (reused by every row) stay there.
__device__ __forceinline__ uint4 ld_stream16(const void *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ld_stream8(const void *p) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ld_stream4(const void *p) {
    uint32_t v;
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ld_stream2(const void *p) {
    unsigned short v;
    asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ float lo_bf16(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf16(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- kernel arguments -----------------------------------------------------------------------

struct GroupView {
    const int32_t *num, *slot, *start, *count, *routes;
};

// One projection (gate_up or down) of the grouped experts.
struct ProjArgs {
    GroupView g;
    const uint8_t *data, *scale, *extra;  // banks; extra = nvfp4 global / mxfp4 bias
    size_t data_rb, scale_rb, extra_rb;   // bytes per slot
    int32_t K, N;                         // reduction length, output rows (gate_up: 2I)
    int32_t inter, top_k;
    const uint16_t *act;  // gate_up: [T, K] by token; down: [R, K] by route
    bool act_by_token;
    uint16_t *inter_out;  // gate_up: [R, I]
    float *route_out;     // down: [R, N]
    DeviceActivation activation;
    bool ds_fp4, ds_clamp;
};

__device__ __forceinline__ void bf16x8_to_f32(const uint4 &v, float *o) {
    o[0] = lo_bf16(v.x), o[1] = hi_bf16(v.x), o[2] = lo_bf16(v.y), o[3] = hi_bf16(v.y);
    o[4] = lo_bf16(v.z), o[5] = hi_bf16(v.z), o[6] = lo_bf16(v.w), o[7] = hi_bf16(v.w);
}
__device__ __forceinline__ uint32_t word(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// The gate_up epilogue shared by all formats: format clamp, activation, bf16 store.
__device__ __forceinline__ uint16_t gate_up_out(const ProjArgs &p, float g, float u) {
    if (p.ds_fp4) {
        // DeepSeek-V4 keeps the GEMM outputs in bf16, then clamps at swiglu_limit.
        g = round_bf16(g);
        u = round_bf16(u);
        if (p.ds_clamp) {
            g = fminf(g, p.activation.limit);
            u = fmaxf(fminf(u, p.activation.limit), -p.activation.limit);
        }
    }
    return f32_to_bf16(activate(p.activation, g, u));
}

// ---- mma.sync primitives (decode_mma.cu, decode_mxfp4.cu) -------------------------------------

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}
__device__ __forceinline__ __nv_bfloat162 bits_bf16x2(uint32_t u) {
    __nv_bfloat162 v;
    memcpy(&v, &u, 4);
    return v;
}

// A launch's own error, else the last one pending (and cleared), as a checked launch returns.
inline cudaError_t launched(cudaError_t e) {
    const cudaError_t last = cudaGetLastError();
    return e != cudaSuccess ? e : last;
}

// ---- launchers (each waits for its predecessor: launch_pdl) ------------------------------------

// CUDA-core kernel: bf16 rows whose length is not a multiple of 8 (decode_simt.cu).
cudaError_t launch_simt_projection(bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s);
// Tensor-core kernel of a row-major format: bf16, fp8_block, nvfp4, ds_fp4, q4_0 (decode_mma.cu);
// cudaErrorInvalidValue for another format.
cudaError_t launch_mma_projection(Format f, bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s);
// Tensor-core kernel of mxfp4's transposed banks (decode_mxfp4.cu).
cudaError_t launch_mxfp4_projection(bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s);

struct GroupScratch {
    int32_t *num, *slot, *start, *count, *routes;  // the groups, read by the expert kernels
    int32_t *entry, *rank;                         // per route: table entry, position in group
    int32_t *key, *cnt, *grp;                      // hash table: slot, routes, group index
    int32_t table_bits;
};

// Block 0 groups the routes by slot into g; `blocks` more blocks stage x into xin (mode 0: none,
// 1: copy, 2: ds_fp4's FP8 round trip per 128) (decode_group.cu).
cudaError_t launch_prep(int blocks, const int32_t *slots, int R, const GroupScratch &g, const uint16_t *x,
                        uint16_t *xin, int64_t elems, int mode, cudaStream_t s);
// ds_fp4: the intermediate [R, I] of every valid route FP8-round-tripped per 128 in place.
cudaError_t launch_inter_round_trip(const int32_t *slots, uint16_t *inter, int64_t R, int32_t I, cudaStream_t s);

}  // namespace ft::cuda::decode
