// Device code shared by the decode kernel files (decode_simt.cu, decode_mma.cu, decode_mxfp4.cu,
// decode_group.cu): streaming loads, bf16 helpers, the gate_up epilogue and the mma.sync
// primitives. decode_launch.hpp holds the host side (constants, arguments, launchers). Private
// to ft_cuda_experts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "decode_launch.hpp"
#include "ft/cuda_numerics.cuh"

namespace ft::cuda::decode {

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

// Sum over each aligned group of `width` lanes (a power of two <= 32; the whole warp by default).
__device__ __forceinline__ float warp_sum(float v, int width = 32) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        if (o < width) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}


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

// bf16 gpt-oss: the bias row (N floats) of the route's expert for this projection, nullptr when
// the decode has no biases. Routes reaching an epilogue have a slot, so their id is in range; the
// check only keeps a broken id from reading outside the table.
__device__ __forceinline__ const float *route_bias(const ProjArgs &p, int route) {
    if (!p.bias) return nullptr;
    const int32_t e = p.bias_ids[route];
    return uint32_t(e) < uint32_t(p.bias_experts) ? p.bias + int64_t(e) * p.N : nullptr;
}
__device__ __forceinline__ float plus_bias(const float *b, int row, float v) { return b ? v + __ldg(b + row) : v; }

// ---- the CUDA-core kernels' routes and outputs (decode_simt.cu, decode_dp4a.cu) ----------------

// The two rows warp-unit `unit` owns: gate_up (GATE_UP) rows unit (gate) and I + unit (up); down
// rows 2 unit and 2 unit + 1 of the N = H outputs (has1: the second exists). False when the unit
// lies past the projection's rows.
template <bool GATE_UP>
__device__ __forceinline__ bool unit_rows(const ProjArgs &p, int unit, int &n0, int &n1, bool &has1) {
    if (GATE_UP) {
        n0 = unit;
        n1 = p.inter + unit;
        has1 = true;
        return unit < p.inter;
    }
    n0 = 2 * unit;
    n1 = n0 + 1;
    has1 = n1 < p.N;
    return n0 < p.N;
}

// Routes r0 .. r0 + nr - 1 (nr <= RC) of the group whose routes start at `first` (slots past nr
// repeat the last one) and each one's activation row (gate_up: its token's input; down: its intermediate).
template <int RC = kRouteChunk>
__device__ __forceinline__ void route_rows(const ProjArgs &p, int first, int nr, int *route, const uint16_t **arow) {
#pragma unroll
    for (int j = 0; j < RC; ++j) {
        route[j] = p.g.routes[first + min(j, nr - 1)];
        const int64_t arow_index = p.act_by_token ? route[j] / p.top_k : route[j];
        arow[j] = p.act + arow_index * p.K;
    }
}

// A route's results for a warp's rows: gate_up (unit j: gate v0, up v1) -> the activated bf16
// intermediate; down (rows n0, n1 when has1) -> the route's f32 outputs.
template <bool GATE_UP>
__device__ __forceinline__ void store_route(const ProjArgs &p, int route, int unit, int n0, int n1, bool has1, float v0,
                                            float v1) {
    if (GATE_UP) {
        p.inter_out[int64_t(route) * p.inter + unit] = gate_up_out(p, v0, v1);
    } else {
        float *o = p.route_out + int64_t(route) * p.N;
        o[n0] = v0;
        if (has1) o[n1] = v1;
    }
}

// ---- before pdl_wait: the down projection's first rows into L2 -------------------------------
//
// The projection kernels call pdl_trigger() right after their pdl_wait, so the down projection's
// CTAs are scheduled while gate_up's last wave runs, and those of down's first wave prefetch into
// L2 the rows they read first. prep's grouping is final by then: gate_up triggers only after its
// own pdl_wait, which returns once prep has completed (a plain launch starts later still). A
// prefetch is only a hint: no result depends on it. CTAs of later waves start after gate_up has
// finished and skip it (they would only delay their own loads).

// L2 prefetch of the first `bytes` of `rows` rows ld bytes apart from `first`, one 128-byte line
// per thread in turn.
__device__ __forceinline__ void prefetch_rows_l2(const uint8_t *first, int rows, int64_t ld, int64_t bytes) {
    if (bytes >= ld) bytes = rows * ld, rows = 1;  // whole rows: one range
    const int lines = int((bytes + 127) / 128) + 1;  // + 1: a row need not start on a line
    for (int i = threadIdx.x; i < rows * lines; i += blockDim.x) {
        const int row = i / lines;
        const uintptr_t start = reinterpret_cast<uintptr_t>(first + row * ld);
        const uintptr_t a = (start & ~uintptr_t(127)) + uintptr_t(128) * (i - row * lines);
        if (a < start + bytes) asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    }
}

// Bytes of each row the early prefetch covers: the first chunks every warp reads.
constexpr int64_t kEarlyRowBytes = 4096;

// Before pdl_wait, a down projection's CTA among the first wave_ctas in launch order: of group
// blockIdx.y's rows 2 u0 .. 2 (u0 + n) - 1 (rows of rb bytes), the first kEarlyRowBytes of each into L2.
__device__ __forceinline__ void early_prefetch_down(const ProjArgs &p, int64_t rb, int u0, int n, int wave_ctas) {
    if (int(blockIdx.y * gridDim.x + blockIdx.x) >= wave_ctas || int(blockIdx.y) >= __ldcg(p.g.num)) return;
    const uint8_t *base = p.data + size_t(__ldcg(p.g.slot + blockIdx.y)) * p.data_rb;
    const int rows = min(2 * n, p.N - 2 * u0);
    if (rows > 0) prefetch_rows_l2(base + 2 * u0 * rb, rows, rb, rb < kEarlyRowBytes ? rb : kEarlyRowBytes);
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

}  // namespace ft::cuda::decode
