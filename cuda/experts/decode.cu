// Decode-time expert kernels (ft/cuda_experts.hpp). One decode call is, in stream order:
//   prep     one CTA groups the routes by slot on the device (a hash table in scratch: each
//            distinct slot once, with its routes); the other CTAs stage the input
//            (ds_fp4: FP8 round trip per 128; otherwise only a copy when x is not 16-byte aligned)
//   gate_up  grid (row tiles, distinct-slot capacity): CTAs past the device's group count return
//            at once; each streams its weight rows once and dots them with all the group's routes
//            (register chunks of kRouteChunk), epilogue = format clamp/bias + activation -> bf16
//   [ds_fp4] the intermediate is FP8-round-tripped per 128 in place
//   down     the same over the down rows -> f32 per route (mxfp4: + down bias)
//   combine  y[t] = sum_k w * route (+ addend), one bf16 rounding
// gate_up and down run on tensor cores (mma.sync, see "tensor-core kernels") for every format;
// bf16 rows whose length is not a multiple of 8 take a CUDA-core kernel instead (a warp owns two
// output rows, its lanes split the reduction and finish with a shuffle reduction).
// Every sum runs in a fixed order, so results are deterministic run to run.
#include "ft/cuda_experts.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "ft/common.hpp"
#include "ft/cuda_launch.cuh"
#include "ft/cuda_numerics.cuh"

namespace ft::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRouteChunk = 4;  // routes whose accumulators live in registers at once
constexpr int kMaxGridY = 65535;
constexpr int kGroupThreads = 512;

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

// ---- CUDA-core kernel (bf16 rows not a multiple of 8) -----------------------------------------
// A format reads its rows in chunks of E elements (Raw: the chunk's bytes, one vector load
// where alignment allows) made of G groups of W elements. decode(raw, i, out) writes group i's
// weights without the block scale; scale(n, c, raw) is the chunk's block scale (one per chunk);
// finish(n, acc) applies what is per row. A chunk's weights are decoded once and
// reused by every route of the group.

__device__ __forceinline__ void bf16x8_to_f32(const uint4 &v, float *o) {
    o[0] = lo_bf16(v.x), o[1] = hi_bf16(v.x), o[2] = lo_bf16(v.y), o[3] = hi_bf16(v.y);
    o[4] = lo_bf16(v.z), o[5] = hi_bf16(v.z), o[6] = lo_bf16(v.w), o[7] = hi_bf16(v.w);
}
__device__ __forceinline__ uint32_t word(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// bf16 rows whose length is not a multiple of 8 elements: one element per chunk.
struct Bf16Scalar {
    static constexpr int E = 1, G = 1, W = 1;
    using Raw = uint32_t;
    const uint8_t *data;
    int64_t ld;
    __device__ Bf16Scalar(const ProjArgs &p, int32_t slot)
        : data(p.data + size_t(slot) * p.data_rb), ld(int64_t(p.K) * 2) {}
    __device__ Raw load(int n, int c) const { return ld_stream2(data + n * ld + int64_t(c) * 2); }
    __device__ void decode(const Raw &w, int, float *o) const { o[0] = lo_bf16(w); }
    __device__ float scale(int, int, const Raw &) const { return 1.0f; }
    __device__ float finish(int, float acc) const { return acc; }
};

// W activations starting at element `e` of a bf16 row, as floats.
template <int W>
__device__ __forceinline__ void load_act(const uint16_t *row, int64_t e, float *o) {
    if constexpr (W == 8) {
        bf16x8_to_f32(__ldg(reinterpret_cast<const uint4 *>(row + e)), o);
    } else {
        o[0] = bf16_to_f32(__ldg(reinterpret_cast<const unsigned short *>(row) + e));
    }
}

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

// One chunk of rows n0 (and n1) against the activations of up to kRouteChunk routes: the chunk's
// weights are decoded group by group once, block sums per route, then one FMA with the scale.
template <class F>
__device__ __forceinline__ void chunk_dot(const F &f, int n0, int n1, bool has1, int c, const typename F::Raw &wa,
                                          const typename F::Raw &wb, const uint16_t *const *arow, int nr,
                                          float *acc0, float *acc1) {
    float s0[kRouteChunk] = {}, s1[kRouteChunk] = {};
#pragma unroll
    for (int i = 0; i < F::G; ++i) {
        float x0[F::W], x1[F::W];
        f.decode(wa, i, x0);
        if (has1) f.decode(wb, i, x1);
#pragma unroll
        for (int j = 0; j < kRouteChunk; ++j) {
            if (j < nr) {
                float a[F::W];
                load_act<F::W>(arow[j], int64_t(c) * F::E + i * F::W, a);
#pragma unroll
                for (int k = 0; k < F::W; ++k) s0[j] = fmaf(x0[k], a[k], s0[j]);
                if (has1) {
#pragma unroll
                    for (int k = 0; k < F::W; ++k) s1[j] = fmaf(x1[k], a[k], s1[j]);
                }
            }
        }
    }
    const float sc0 = f.scale(n0, c, wa), sc1 = has1 ? f.scale(n1, c, wb) : 0.0f;
#pragma unroll
    for (int j = 0; j < kRouteChunk; ++j) {
        acc0[j] = fmaf(s0[j], sc0, acc0[j]);
        acc1[j] = fmaf(s1[j], sc1, acc1[j]);
    }
}

// gate_up (GATE_UP): warp w of CTA x owns unit j = x * 8 + w: rows j (gate) and I + j (up).
// down: rows 2j and 2j + 1 of the N = H outputs.
template <class F, bool GATE_UP>
__global__ void __launch_bounds__(kThreads) rowmajor_kernel(ProjArgs p) {
    pdl_wait();  // launched by launch_pdl: nothing before this reads earlier kernels' output
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int unit = blockIdx.x * kWarps + warp;
    int n0, n1;
    bool has1;
    if (GATE_UP) {
        if (unit >= p.inter) return;
        n0 = unit;
        n1 = p.inter + unit;
        has1 = true;
    } else {
        n0 = 2 * unit;
        n1 = n0 + 1;
        if (n0 >= p.N) return;
        has1 = n1 < p.N;
    }
    const int chunks = p.K / F::E;
    const int ngroups = *p.g.num;
    for (int gi = blockIdx.y; gi < ngroups; gi += gridDim.y) {
        const F f(p, p.g.slot[gi]);
        const int first = p.g.start[gi], count = p.g.count[gi];
        for (int r0 = 0; r0 < count; r0 += kRouteChunk) {
            const int nr = min(kRouteChunk, count - r0);
            const uint16_t *arow[kRouteChunk];
            int route[kRouteChunk];
#pragma unroll
            for (int j = 0; j < kRouteChunk; ++j) {
                route[j] = p.g.routes[first + r0 + min(j, nr - 1)];
                const int64_t arow_index = p.act_by_token ? route[j] / p.top_k : route[j];
                arow[j] = p.act + arow_index * p.K;
            }
            float acc0[kRouteChunk] = {}, acc1[kRouteChunk] = {};
            // Two chunks per lane per step: all four rows' loads are in flight before any math.
            for (int c = lane; c < chunks; c += 64) {
                const int c1 = c + 32;
                const bool two = c1 < chunks;
                const typename F::Raw w00 = f.load(n0, c);
                const typename F::Raw w10 = has1 ? f.load(n1, c) : w00;
                typename F::Raw w01 = w00, w11 = w00;
                if (two) {
                    w01 = f.load(n0, c1);
                    w11 = has1 ? f.load(n1, c1) : w01;
                }
                chunk_dot(f, n0, n1, has1, c, w00, w10, arow, nr, acc0, acc1);
                if (two) chunk_dot(f, n0, n1, has1, c1, w01, w11, arow, nr, acc0, acc1);
            }
#pragma unroll
            for (int j = 0; j < kRouteChunk; ++j) {
                if (j < nr) {
                    const float v0 = f.finish(n0, warp_sum(acc0[j]));
                    const float v1 = has1 ? f.finish(n1, warp_sum(acc1[j])) : 0.0f;
                    if (lane == j) {
                        if (GATE_UP)
                            p.inter_out[int64_t(route[j]) * p.inter + unit] = gate_up_out(p, v0, v1);
                        else {
                            float *o = p.route_out + int64_t(route[j]) * p.N;
                            o[n0] = v0;
                            if (has1) o[n1] = v1;
                        }
                    }
                }
            }
        }
    }
}

// ---- tensor-core kernels: row-major formats, then mxfp4 ---------------------------------------
// A CUDA-core kernel spends several integer instructions per weight element (decode, activation
// conversion, one FMA per route). Here the weights become bf16 mma operands (mma.sync m16n8k16,
// fp32 accumulate) and the routes are the 8-wide side, so per element only the decode into bf16
// remains.
// Tile: one CTA owns 16 rows (gate_up: rows g = gate of unit j0 + g and g + 8 = its up row, so a
// lane's accumulators hold gate and up of the same unit; down: 16 consecutive rows) and up to 8
// routes of a group; its 8 warps split K and reduce through shared memory in warp order (a fixed
// order: deterministic). The reduction index k inside an mma step is only a label: lane quad t
// takes E consecutive elements of each of its two rows per chunk (one vector load), and the
// activation operand is loaded with the same element -> k map, so any map is a valid dot product.
// Block scales: nvfp4 (e4m3) and ds_fp4 (e8m0) times an e2m1 value are exact in bf16, so the
// scale is applied to the operand; fp8_block's e4m3 x bf16 is not, so each chunk (64 elements,
// inside one 128-column tile) goes to a fresh accumulator that is scaled in fp32, as before.

constexpr int kMmaRoutes = 8;  // the n side of m16n8k16

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

// Two e4m3 codes (low byte first) as bf16x2: every e4m3 value, NaN included, is exact in bf16.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two) {
    const float2 f = e4m3x2_to_f32x2(uint16_t(two & 0xffffu));
    return bf16x2_bits(__floats2bfloat162_rn(f.x, f.y));
}

// e2m1 codes i and i + 4 of word w (nibble k = element k) as bf16x2 times 2^-126: the three
// magnitude bits land on the low exponent bits and the top mantissa bit (code 1 a subnormal), the
// sign on bit 15 -- the bf16 twin of e2m1_to_f32_mul. w8 = w >> 8. One multiply makes two copies
// of each nibble (at +6 and +12 for even i, +2 and +8 for odd: never overlapping, so no carries):
// the first gives the magnitude bits, the second the sign. The caller's exact multiply by 2^126
// ends it.
template <int i>
__device__ __forceinline__ uint32_t e2m1_pair_bits(uint32_t w, uint32_t w8) {
    const uint32_t n = (i < 2 ? w : w8) & (0x000f000fu << (4 * (i & 1)));
    return (n * ((i & 1) ? 0x104u : 0x1040u)) & 0x81c081c0u;
}

// The four bf16x2 operands of one fp4 word (elements 0..7): steps s0 and s0 + 1 of `a`, pairs
// (0,4), (1,5) then (2,6), (3,7), each times `scale` (bf16x2, exact).
template <int S>
__device__ __forceinline__ void fp4_word_operands(uint32_t w, __nv_bfloat162 scale, int s0, uint32_t (&a)[S][2]) {
    const __nv_bfloat162 two126 = bits_bf16x2(0x7e807e80u);  // 2^126 twice
    const uint32_t w8 = w >> 8;
    const uint32_t raw[4] = {e2m1_pair_bits<0>(w, w8), e2m1_pair_bits<1>(w, w8), e2m1_pair_bits<2>(w, w8),
                             e2m1_pair_bits<3>(w, w8)};
#pragma unroll
    for (int q = 0; q < 4; ++q)
        a[s0 + q / 2][q % 2] = bf16x2_bits(__hmul2(__hmul2(bits_bf16x2(raw[q]), two126), scale));
}

// The activation operands matching fp4_word_operands for 8 consecutive bf16 activations v.
template <int S>
__device__ __forceinline__ void fp4_word_acts(const uint4 &v, int s0, uint32_t (&b)[S][2]) {
    b[s0][0] = __byte_perm(v.x, v.z, 0x5410);  // elements 0, 4
    b[s0][1] = __byte_perm(v.x, v.z, 0x7632);  // 1, 5
    b[s0 + 1][0] = __byte_perm(v.y, v.w, 0x5410);  // 2, 6
    b[s0 + 1][1] = __byte_perm(v.y, v.w, 0x7632);  // 3, 7
}

__device__ __forceinline__ uint4 ld_act16(const uint16_t *p) { return __ldg(reinterpret_cast<const uint4 *>(p)); }

// Per format: E elements per lane and row per chunk (S = E / 4 mma steps), U chunks of loads in
// flight per warp, kMinBlocks CTAs per SM (register cap, no spills), load(row, pos) of the
// raw bytes of elements pos.., operands(raw, row, pos, a) for one row (a[s][0]: k 2t, 2t+1,
// a[s][1]: k 2t+8, 2t+9), acts(row pointer, pos, b) with the same map, cscale(row, chunk_pos)
// only for formats scaled per chunk in fp32 (kScaleC), finish(row, v) for what is per row.
struct MmaBf16 {
    static constexpr int E = 8, S = 2;
    static constexpr int kMinBlocks = 3;  // CTAs per SM the registers must allow
    static constexpr int U = 4;  // chunks whose weight loads a warp keeps in flight
    static constexpr bool kScaleC = false;
    using Raw = uint4;
    const uint8_t *data;
    int64_t ld;
    __device__ MmaBf16(const ProjArgs &p, int32_t slot)
        : data(p.data + size_t(slot) * p.data_rb), ld(int64_t(p.K) * 2) {}
    __device__ Raw load(int row, int pos) const { return ld_stream16(data + row * ld + int64_t(pos) * 2); }
    __device__ void operands(const Raw &w, int, int, uint32_t (&a)[S][2]) const {
        a[0][0] = w.x, a[0][1] = w.y, a[1][0] = w.z, a[1][1] = w.w;
    }
    __device__ static void acts(const uint16_t *row, int pos, uint32_t (&b)[S][2]) {
        const uint4 v = ld_act16(row + pos);
        b[0][0] = v.x, b[0][1] = v.y, b[1][0] = v.z, b[1][1] = v.w;
    }
    __device__ float finish(int, float v) const { return v; }
};

struct MmaFp8 {
    static constexpr int E = 16, S = 4;
    static constexpr int kMinBlocks = 2;  // CTAs per SM the registers must allow
    static constexpr int U = 4;  // chunks whose weight loads a warp keeps in flight
    static constexpr bool kScaleC = true;
    using Raw = uint4;
    const uint8_t *data, *scales;
    int64_t ld;
    int32_t tiles;
    __device__ MmaFp8(const ProjArgs &p, int32_t slot)
        : data(p.data + size_t(slot) * p.data_rb), scales(p.scale + size_t(slot) * p.scale_rb), ld(p.K),
          tiles(p.K / 128) {}
    __device__ Raw load(int row, int pos) const { return ld_stream16(data + row * ld + pos); }
    __device__ void operands(const Raw &w, int, int, uint32_t (&a)[S][2]) const {
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const uint32_t ws = word(w, s);  // elements 4s .. 4s+3
            a[s][0] = e4m3x2_to_bf16x2(ws);
            a[s][1] = e4m3x2_to_bf16x2(ws >> 16);
        }
    }
    __device__ static void acts(const uint16_t *row, int pos, uint32_t (&b)[S][2]) {
        const uint4 v0 = ld_act16(row + pos), v1 = ld_act16(row + pos + 8);
        b[0][0] = v0.x, b[0][1] = v0.y, b[1][0] = v0.z, b[1][1] = v0.w;
        b[2][0] = v1.x, b[2][1] = v1.y, b[3][0] = v1.z, b[3][1] = v1.w;
    }
    __device__ float cscale(int row, int cpos) const {
        const unsigned short *s = reinterpret_cast<const unsigned short *>(scales);
        return bf16_to_f32(__ldg(s + int64_t(row / 128) * tiles + cpos / 128));
    }
    __device__ float finish(int, float v) const { return v; }
};

struct MmaNvfp4 {
    static constexpr int E = 16, S = 4;  // one 16-element block (8 bytes) per lane and row
    static constexpr int kMinBlocks = 2;  // CTAs per SM the registers must allow
    static constexpr int U = 8;  // chunks whose weight loads a warp keeps in flight
    static constexpr bool kScaleC = false;
    using Raw = uint2;
    const uint8_t *data, *scales, *global;
    int64_t ld, sld;
    __device__ MmaNvfp4(const ProjArgs &p, int32_t slot)
        : data(p.data + size_t(slot) * p.data_rb), scales(p.scale + size_t(slot) * p.scale_rb),
          global(p.extra + size_t(slot) * p.extra_rb), ld(p.K / 2), sld(p.K / 16) {}
    __device__ Raw load(int row, int pos) const { return ld_stream8(data + row * ld + pos / 2); }
    __device__ void operands(const Raw &w, int row, int pos, uint32_t (&a)[S][2]) const {
        const __nv_bfloat16 s = __float2bfloat16_rn(e4m3x2_to_f32x2(__ldg(scales + row * sld + pos / 16)).x);
        const __nv_bfloat162 s2(s, s);
        fp4_word_operands<S>(w.x, s2, 0, a);
        fp4_word_operands<S>(w.y, s2, 2, a);
    }
    __device__ static void acts(const uint16_t *row, int pos, uint32_t (&b)[S][2]) {
        fp4_word_acts<S>(ld_act16(row + pos), 0, b);
        fp4_word_acts<S>(ld_act16(row + pos + 8), 2, b);
    }
    __device__ float finish(int row, float v) const {
        return v * f16_to_f32(__ldg(reinterpret_cast<const unsigned short *>(global) + row));
    }
};

struct MmaDsFp4 {
    static constexpr int E = 32, S = 8;  // one 32-element block (16 bytes) per lane and row
    static constexpr int kMinBlocks = 2;  // CTAs per SM the registers must allow
    static constexpr int U = 4;  // chunks whose weight loads a warp keeps in flight
    static constexpr bool kScaleC = false;
    using Raw = uint4;
    const uint8_t *data, *scales;
    int64_t ld, sld;
    __device__ MmaDsFp4(const ProjArgs &p, int32_t slot)
        : data(p.data + size_t(slot) * p.data_rb), scales(p.scale + size_t(slot) * p.scale_rb), ld(p.K / 2),
          sld(p.K / 32) {}
    __device__ Raw load(int row, int pos) const { return ld_stream16(data + row * ld + pos / 2); }
    __device__ void operands(const Raw &w, int row, int pos, uint32_t (&a)[S][2]) const {
        // e8m0 2^-127 .. 2^127 and NaN are all bf16 values.
        const __nv_bfloat16 s = __float2bfloat16_rn(e8m0_to_f32(__ldg(scales + row * sld + pos / 32)));
        const __nv_bfloat162 s2(s, s);
#pragma unroll
        for (int q = 0; q < 4; ++q) fp4_word_operands<S>(word(w, q), s2, 2 * q, a);
    }
    __device__ static void acts(const uint16_t *row, int pos, uint32_t (&b)[S][2]) {
#pragma unroll
        for (int q = 0; q < 4; ++q) fp4_word_acts<S>(ld_act16(row + pos + 8 * q), 2 * q, b);
    }
    __device__ float finish(int, float v) const { return v; }
};

// q4_0: one 32-element block (18 bytes: fp16 d, 16 qs bytes; byte j = elements j (low nibble)
// and j + 16 (high)) per chunk; lane quad t takes qs bytes 4t .. 4t+3, i.e. elements 4t .. 4t+3
// (step 0) and 16+4t .. 16+4t+3 (step 1). q - 8 is exact in bf16 (built as 128 + q, minus 136);
// d (fp16) times q is not, so each block goes to a fresh accumulator scaled by d in fp32, as the
// CUDA-core kernel does. Blocks are only 2-byte aligned: two 2-byte loads per lane and row.
struct MmaQ4_0 {
    static constexpr int E = 8, S = 2;
    static constexpr int kMinBlocks = 2;  // CTAs per SM the registers must allow
    static constexpr int U = 8;  // chunks whose weight loads a warp keeps in flight
    static constexpr bool kScaleC = true;
    using Raw = uint32_t;
    const uint8_t *data;
    int64_t ld;
    __device__ MmaQ4_0(const ProjArgs &p, int32_t slot)
        : data(p.data + size_t(slot) * p.data_rb), ld(int64_t(p.K / 32) * 18) {}
    // pos = block * 32 + 8t: qs bytes 4t .. 4t+3 of the block.
    __device__ Raw load(int row, int pos) const {
        const uint8_t *b = data + row * ld + int64_t(pos / 32) * 18 + 2 + (pos % 32) / 2;
        return ld_stream2(b) | (ld_stream2(b + 2) << 16);
    }
    // bf16 pairs (128 + q) of the low nibbles of bytes (0, 1) and (2, 3) of x, minus 136.
    __device__ static void q_pairs(uint32_t x, uint32_t &p01, uint32_t &p23) {
        const __nv_bfloat162 off = bits_bf16x2(0x43084308u);  // 136 twice
        p01 = bf16x2_bits(__hsub2(bits_bf16x2(__byte_perm(x, 0x43u, 0x4140) & 0xff0fff0fu), off));
        p23 = bf16x2_bits(__hsub2(bits_bf16x2(__byte_perm(x, 0x43u, 0x4342) & 0xff0fff0fu), off));
    }
    __device__ void operands(const Raw &w, int, int, uint32_t (&a)[S][2]) const {
        q_pairs(w, a[0][0], a[0][1]);
        q_pairs(w >> 4, a[1][0], a[1][1]);
    }
    __device__ static void acts(const uint16_t *row, int pos, uint32_t (&b)[S][2]) {
        const uint16_t *blk = row + (pos & ~31) + (pos & 31) / 2;  // element 4t of the block
        const uint2 lo = __ldg(reinterpret_cast<const uint2 *>(blk));
        const uint2 hi = __ldg(reinterpret_cast<const uint2 *>(blk + 16));
        b[0][0] = lo.x, b[0][1] = lo.y, b[1][0] = hi.x, b[1][1] = hi.y;
    }
    __device__ float cscale(int row, int cpos) const {
        return f16_to_f32(uint16_t(ld_stream2(data + row * ld + int64_t(cpos / 32) * 18)));
    }
    __device__ float finish(int, float v) const { return v; }
};

template <class F, bool GATE_UP>
__global__ void __launch_bounds__(kThreads, F::kMinBlocks) mma_kernel(ProjArgs p) {
    pdl_wait();  // launched by launch_pdl: nothing before this reads earlier kernels' output
    __shared__ float red[kWarps][4][32];
    constexpr int CE = 4 * F::E;  // elements per chunk and row (the lane quad)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int row0, row1, unit = 0;
    bool ok0, ok1;
    if (GATE_UP) {
        unit = blockIdx.x * 8 + g;
        ok0 = ok1 = unit < p.inter;
        const int u = min(unit, p.inter - 1);  // rows past the end read a real row, never stored
        row0 = u;
        row1 = p.inter + u;
    } else {
        row0 = blockIdx.x * 16 + g;
        row1 = row0 + 8;
        ok0 = row0 < p.N;
        ok1 = row1 < p.N;
        row0 = min(row0, p.N - 1);
        row1 = min(row1, p.N - 1);
    }
    const int chunks = (p.K + CE - 1) / CE;
    const int ngroups = *p.g.num;
    for (int gi = blockIdx.y; gi < ngroups; gi += gridDim.y) {
        const F f(p, p.g.slot[gi]);
        const int first = p.g.start[gi], count = p.g.count[gi];
        for (int r0 = 0; r0 < count; r0 += kMmaRoutes) {
            const int nr = min(kMmaRoutes, count - r0);
            // This lane's activation column: route g of the chunk (the last one repeated as padding).
            const int rb = p.g.routes[first + r0 + min(g, nr - 1)];
            const uint16_t *arow = p.act + (p.act_by_token ? int64_t(rb / p.top_k) : int64_t(rb)) * p.K;
            float acc[4] = {};
            for (int c0 = warp; c0 < chunks; c0 += kWarps * F::U) {
                typename F::Raw w0[F::U], w1[F::U];
#pragma unroll
                for (int u = 0; u < F::U; ++u) {
                    const int cc = c0 + u * kWarps, pos = cc * CE + t * F::E;
                    w0[u] = w1[u] = typename F::Raw{};
                    if (cc < chunks && pos < p.K) {
                        w0[u] = f.load(row0, pos);
                        w1[u] = f.load(row1, pos);
                    }
                }
#pragma unroll
                for (int u = 0; u < F::U; ++u) {
                    const int cc = c0 + u * kWarps, pos = cc * CE + t * F::E;
                    if (cc >= chunks) break;  // warp-uniform
                    uint32_t a0[F::S][2] = {}, a1[F::S][2] = {}, b[F::S][2] = {};
                    if (pos < p.K) {  // K is a multiple of E: a lane's elements are all in or all out
                        f.operands(w0[u], row0, pos, a0);
                        f.operands(w1[u], row1, pos, a1);
                        F::acts(arow, pos, b);
                    }
                    __syncwarp();
                    if constexpr (F::kScaleC) {
                        float ct[4] = {};
#pragma unroll
                        for (int s = 0; s < F::S; ++s)
                            mma_bf16_16816(ct, a0[s][0], a1[s][0], a0[s][1], a1[s][1], b[s][0], b[s][1]);
                        const float s0 = f.cscale(row0, cc * CE), s1 = f.cscale(row1, cc * CE);
                        acc[0] = fmaf(ct[0], s0, acc[0]);
                        acc[1] = fmaf(ct[1], s0, acc[1]);
                        acc[2] = fmaf(ct[2], s1, acc[2]);
                        acc[3] = fmaf(ct[3], s1, acc[3]);
                    } else {
#pragma unroll
                        for (int s = 0; s < F::S; ++s)
                            mma_bf16_16816(acc, a0[s][0], a1[s][0], a0[s][1], a1[s][1], b[s][0], b[s][1]);
                    }
                }
            }
            // acc: [0], [1] row0 x routes 2t, 2t+1; [2], [3] row1 x the same routes.
#pragma unroll
            for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
            __syncthreads();
            if (warp == 0) {
                float v[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    float s = 0.0f;
#pragma unroll
                    for (int w2 = 0; w2 < kWarps; ++w2) s += red[w2][i][lane];
                    v[i] = s;
                }
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int n = 2 * t + c;
                    if (n >= nr) continue;
                    const int route = p.g.routes[first + r0 + n];
                    if (GATE_UP) {
                        if (ok0)
                            p.inter_out[int64_t(route) * p.inter + unit] =
                                gate_up_out(p, f.finish(row0, v[c]), f.finish(row1, v[2 + c]));
                    } else {
                        float *o = p.route_out + int64_t(route) * p.N;
                        if (ok0) o[row0] = f.finish(row0, v[c]);
                        if (ok1) o[row1] = f.finish(row1, v[2 + c]);
                    }
                }
            }
            __syncthreads();
        }
    }
}

// mxfp4 on the tensor cores. The banks are transposed (byte (kb, n) = W[n, 2kb] low nibble and
// W[n, 2kb+1] high nibble), so one byte is exactly the k pair an mma operand register holds for
// one row n. A CTA owns 64 columns as four m16 tiles: lane (g, t) supplies row g of tile j from
// column 4g + j and row g + 8 from column 32 + 4g + j, so its 4-byte loads at (kb, 4g) and
// (kb, 32 + 4g) serve all four tiles and a warp's load covers 4 rows x 32 contiguous bytes. Each
// mma step spans 8 kb (16 k) inside one 32-k scale block; the block's two steps go to a fresh
// accumulator scaled by e8m0 in fp32 (the CUDA-core kernel's order of operations). 8 warps split
// the blocks and reduce through shared memory in warp order.
constexpr int kMxMmaCols = 64;
constexpr int kMxMmaUnroll = 2;  // blocks whose loads a warp keeps in flight

// Byte j of u (low nibble: the even k) as a bf16x2 pair times 2^-126 (see e2m1_pair_bits); u4 = u >> 4.
template <int j>
__device__ __forceinline__ uint32_t e2m1_byte_bits(uint32_t u, uint32_t u4) {
    const uint32_t n = __byte_perm(u, u4, 0x4400 | (j << 8) | (j << 12) | (j << 4) | j) & 0x000f000fu;
    return (n * 0x1040u) & 0x81c081c0u;
}

__device__ __forceinline__ void e2m1_word_to_bf16x4(uint32_t u, uint32_t (&o)[4]) {
    const __nv_bfloat162 two126 = bits_bf16x2(0x7e807e80u);
    const uint32_t u4 = u >> 4;
    const uint32_t r[4] = {e2m1_byte_bits<0>(u, u4), e2m1_byte_bits<1>(u, u4), e2m1_byte_bits<2>(u, u4),
                           e2m1_byte_bits<3>(u, u4)};
#pragma unroll
    for (int q = 0; q < 4; ++q) o[q] = bf16x2_bits(__hmul2(bits_bf16x2(r[q]), two126));
}

__global__ void __launch_bounds__(kThreads, 3) mxfp4_mma_kernel(ProjArgs p, bool gate_up) {
    pdl_wait();  // launched by launch_pdl: nothing before this reads earlier kernels' output
    __shared__ float red[kWarps][16][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int N = p.N, nblk = p.K / 32;
    const int colA = blockIdx.x * kMxMmaCols + 4 * g, colB = colA + 32;
    const bool okB = blockIdx.x * kMxMmaCols + 32 < N;  // N is a multiple of 32: each half all in or out
    const int ngroups = *p.g.num;
    for (int gi = blockIdx.y; gi < ngroups; gi += gridDim.y) {
        const int32_t slot = p.g.slot[gi];
        const uint8_t *data = p.data + size_t(slot) * p.data_rb;
        const uint8_t *scale = p.scale + size_t(slot) * p.scale_rb;
        const uint16_t *bias = reinterpret_cast<const uint16_t *>(p.extra + size_t(slot) * p.extra_rb);
        const int first = p.g.start[gi], count = p.g.count[gi];
        for (int r0 = 0; r0 < count; r0 += kMmaRoutes) {
            const int nr = min(kMmaRoutes, count - r0);
            const int rb = p.g.routes[first + r0 + min(g, nr - 1)];
            const uint32_t *arow = reinterpret_cast<const uint32_t *>(
                p.act + (p.act_by_token ? int64_t(rb / p.top_k) : int64_t(rb)) * p.K);  // k pairs
            float acc[4][4] = {};  // [tile j][c0..c3]
            for (int b0 = warp; b0 < nblk; b0 += kWarps * kMxMmaUnroll) {
                // w[u][step][half][row]: kb = 16b + 8 step + 4 half + t; row 0: colA, 1: colB.
                uint32_t w[kMxMmaUnroll][2][2][2] = {}, sc[kMxMmaUnroll][2] = {};
#pragma unroll
                for (int u = 0; u < kMxMmaUnroll; ++u) {
                    const int b = b0 + u * kWarps;
                    if (b >= nblk) continue;
#pragma unroll
                    for (int st = 0; st < 2; ++st)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const int64_t kb = int64_t(b) * 16 + st * 8 + h * 4 + t;
                            w[u][st][h][0] = ld_stream4(data + kb * N + colA);
                            if (okB) w[u][st][h][1] = ld_stream4(data + kb * N + colB);
                        }
                    sc[u][0] = ld_stream4(scale + int64_t(b) * N + colA);
                    if (okB) sc[u][1] = ld_stream4(scale + int64_t(b) * N + colB);
                }
#pragma unroll
                for (int u = 0; u < kMxMmaUnroll; ++u) {
                    const int b = b0 + u * kWarps;
                    if (b >= nblk) break;  // warp-uniform
                    float ct[4][4] = {};
#pragma unroll
                    for (int st = 0; st < 2; ++st) {
                        const int kb = b * 16 + st * 8 + t;
                        const uint32_t a_lo = __ldg(arow + kb), a_hi = __ldg(arow + kb + 4);
                        uint32_t x[2][2][4];  // [half][row][tile]
#pragma unroll
                        for (int h = 0; h < 2; ++h)
#pragma unroll
                            for (int r = 0; r < 2; ++r) e2m1_word_to_bf16x4(w[u][st][h][r], x[h][r]);
#pragma unroll
                        for (int j = 0; j < 4; ++j)
                            mma_bf16_16816(ct[j], x[0][0][j], x[0][1][j], x[1][0][j], x[1][1][j], a_lo, a_hi);
                    }
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float sa = e8m0_to_f32(uint8_t(sc[u][0] >> (8 * j)));
                        const float sb = e8m0_to_f32(uint8_t(sc[u][1] >> (8 * j)));
                        acc[j][0] = fmaf(ct[j][0], sa, acc[j][0]);
                        acc[j][1] = fmaf(ct[j][1], sa, acc[j][1]);
                        acc[j][2] = fmaf(ct[j][2], sb, acc[j][2]);
                        acc[j][3] = fmaf(ct[j][3], sb, acc[j][3]);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) red[warp][4 * j + i][lane] = acc[j][i];
            __syncthreads();
            if (warp == 0) {
                float v[4][4];
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        float s = 0.0f;
#pragma unroll
                        for (int w2 = 0; w2 < kWarps; ++w2) s += red[w2][4 * j + i][lane];
                        v[j][i] = s;
                    }
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int n = 2 * t + c;
                    if (n >= nr) continue;
                    const int route = p.g.routes[first + r0 + n];
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        if (r == 1 && !okB) continue;
                        const int col = r == 0 ? colA : colB;
                        float o[4];
#pragma unroll
                        for (int j = 0; j < 4; ++j) o[j] = v[j][2 * r + c] + bf16_to_f32(__ldg(bias + col + j));
                        if (gate_up) {
                            // Columns 2u (gate) and 2u + 1 (up) of units col / 2 and col / 2 + 1.
                            uint16_t *out = p.inter_out + int64_t(route) * p.inter + col / 2;
                            out[0] = f32_to_bf16(activate(p.activation, o[0], o[1]));
                            out[1] = f32_to_bf16(activate(p.activation, o[2], o[3]));
                        } else {
                            float *out = p.route_out + int64_t(route) * N + col;
                            *reinterpret_cast<float4 *>(out) = make_float4(o[0], o[1], o[2], o[3]);
                        }
                    }
                }
            }
            __syncthreads();
        }
    }
}

// ---- prep: grouping and input staging ---------------------------------------------------------

struct GroupScratch {
    int32_t *num, *slot, *start, *count, *routes;  // the groups, read by the expert kernels
    int32_t *entry, *rank;                         // per route: table entry, position in group
    int32_t *key, *cnt, *grp;                      // hash table: slot, routes, group index
    int32_t table_bits;
};

// Exclusive block scan of two counters; `total` gets the block sums. All threads must call it.
__device__ int2 block_exclusive_scan2(int2 v, int2 *total) {
    __shared__ int2 ws[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    int2 inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int x = __shfl_up_sync(0xffffffffu, inc.x, o), y = __shfl_up_sync(0xffffffffu, inc.y, o);
        if (lane >= o) {
            inc.x += x;
            inc.y += y;
        }
    }
    if (lane == 31) ws[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int2 s = lane < nw ? ws[lane] : make_int2(0, 0);
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int x = __shfl_up_sync(0xffffffffu, s.x, o), y = __shfl_up_sync(0xffffffffu, s.y, o);
            if (lane >= o) {
                s.x += x;
                s.y += y;
            }
        }
        ws[lane] = s;
    }
    __syncthreads();
    const int2 before = warp > 0 ? ws[warp - 1] : make_int2(0, 0);
    *total = ws[nw - 1];
    __syncthreads();  // ws is reused by the next call
    return make_int2(before.x + inc.x - v.x, before.y + inc.y - v.y);
}

// Groups routes by slot through an open-addressing hash table (global scratch, 2^bits >= 2R
// entries, so probing ends): one CAS per route finds its slot's entry, an atomicAdd there gives
// its position in the group; a scan over the table numbers the used entries. O((R + 2^bits) /
// threads) per thread. The order of routes inside a group follows the atomics, which does not
// change any result: every route is computed by the same operations whatever its position.
// Values written by atomics or by other threads are read back with ld.cg (L2), never a stale L1.
__device__ void build_groups(const int32_t *slots, int R, const GroupScratch &g) {
    const int P = 1 << g.table_bits;
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        g.key[i] = -1;
        g.cnt[i] = 0;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
        const int32_t s = slots[r];
        if (s < 0) continue;
        uint32_t h = (uint32_t(s) * 2654435761u) >> (32 - g.table_bits);
        for (;;) {
            const int32_t old = atomicCAS(&g.key[h], -1, s);
            if (old == -1 || old == s) break;
            h = (h + 1) & uint32_t(P - 1);
        }
        g.entry[r] = int32_t(h);
        g.rank[r] = atomicAdd(&g.cnt[h], 1);
    }
    __syncthreads();
    __shared__ int2 carry;
    if (threadIdx.x == 0) carry = make_int2(0, 0);
    __syncthreads();
    for (int base = 0; base < P; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const int32_t c = i < P ? __ldcg(&g.cnt[i]) : 0;
        int2 total;
        const int2 pos = block_exclusive_scan2(make_int2(c > 0 ? 1 : 0, c), &total);
        if (c > 0) {
            const int gi = carry.x + pos.x;
            g.slot[gi] = __ldcg(&g.key[i]);
            g.start[gi] = carry.y + pos.y;
            g.count[gi] = c;
            g.grp[i] = gi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            carry.x += total.x;
            carry.y += total.y;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *g.num = carry.x;
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
        if (slots[r] < 0) continue;
        const int gi = __ldcg(&g.grp[__ldcg(&g.entry[r])]);
        g.routes[__ldcg(&g.start[gi]) + __ldcg(&g.rank[r])] = r;
    }
}

// One warp: the DeepSeek-V4 FP8 round trip of 128 bf16 values (4 per lane), in to out.
__device__ __forceinline__ void round_trip_128(const uint16_t *in, uint16_t *out, int lane) {
    float v[4], amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[i] = bf16_to_f32(in[lane * 4 + i]);
        amax = fmaxf(amax, fabsf(v[i]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = fp8_group_scale(amax);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[lane * 4 + i] = f32_to_bf16(fp8_round_trip(v[i], s));
}

// Block 0 groups the routes; blocks 1.. stage x into xin (mode 1: copy, 2: FP8 round trip).
__global__ void __launch_bounds__(kGroupThreads) prep_kernel(const int32_t *slots, int R, GroupScratch g,
                                                            const uint16_t *x, uint16_t *xin, int64_t elems,
                                                            int mode) {
    pdl_wait();
    if (blockIdx.x == 0) {
        build_groups(slots, R, g);
        return;
    }
    const int64_t tid = int64_t(blockIdx.x - 1) * blockDim.x + threadIdx.x;
    const int64_t nthreads = int64_t(gridDim.x - 1) * blockDim.x;
    if (mode == 1) {
        for (int64_t i = tid; i < elems; i += nthreads) xin[i] = x[i];
    } else {
        const int lane = threadIdx.x & 31;
        for (int64_t grp = tid >> 5; grp < elems / 128; grp += nthreads >> 5)
            round_trip_128(x + grp * 128, xin + grp * 128, lane);
    }
}

// ds_fp4: the intermediate of every valid route, round-tripped per 128 in place.
__global__ void __launch_bounds__(kThreads) inter_round_trip_kernel(const int32_t *slots, uint16_t *inter,
                                                                   int64_t R, int32_t I) {
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t per_row = I / 128, total = R * per_row;
    for (int64_t grp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; grp < total;
         grp += (int64_t(gridDim.x) * blockDim.x) >> 5) {
        const int64_t r = grp / per_row;
        if (slots[r] < 0) continue;
        round_trip_128(inter + grp * 128, inter + grp * 128, lane);
    }
}

__global__ void combine_kernel(const float *route_out, const int32_t *slots, const float *w, const uint16_t *addend,
                               uint16_t *y, int32_t tokens, int32_t K, int32_t H, bool ds) {
    pdl_wait();
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    for (int t = blockIdx.y; t < tokens; t += gridDim.y) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) {
            const int64_t r = int64_t(t) * K + k;
            if (slots[r] < 0) continue;
            const float o = route_out[r * H + h];
            if (ds)
                acc += round_bf16(__fmul_rn(w[r], o));  // DeepSeek-V4: each route rounded to bf16
            else
                acc = fmaf(w[r], o, acc);
        }
        if (addend) acc += bf16_to_f32(addend[int64_t(t) * H + h]);
        y[int64_t(t) * H + h] = f32_to_bf16(acc);
    }
}

// ---- host helpers -----------------------------------------------------------------------------

// The grids of one projection's kernels (see ExpertDecoder::compute).
struct ProjGrids {
    dim3 mma, rowmajor, mxfp4_mma;
};

// One projection of the decode (gate/up + activation, or down): the format's tensor-core (`mma`)
// kernel, or the CUDA-core one for bf16 rows that are not a multiple of 8; each waits for its
// predecessor (launch_pdl).
template <bool GATE_UP>
cudaError_t launch_projection(Format f, bool mma, bool vec, const ProjGrids &g, const ProjArgs &p, cudaStream_t s) {
    const dim3 b(kThreads);
    if (mma) {
        switch (f) {
            case Format::bf16: return launch_pdl(mma_kernel<MmaBf16, GATE_UP>, g.mma, b, 0, s, p);
            case Format::fp8_block: return launch_pdl(mma_kernel<MmaFp8, GATE_UP>, g.mma, b, 0, s, p);
            case Format::nvfp4: return launch_pdl(mma_kernel<MmaNvfp4, GATE_UP>, g.mma, b, 0, s, p);
            case Format::ds_fp4: return launch_pdl(mma_kernel<MmaDsFp4, GATE_UP>, g.mma, b, 0, s, p);
            case Format::q4_0: return launch_pdl(mma_kernel<MmaQ4_0, GATE_UP>, g.mma, b, 0, s, p);
            case Format::mxfp4: return launch_pdl(mxfp4_mma_kernel, g.mxfp4_mma, b, 0, s, p, GATE_UP);
            default: return cudaErrorInvalidValue;  // mma_ is only set for the formats above
        }
    }
    // The CUDA-core kernel serves only bf16 rows whose length is not a multiple of 8.
    if (f == Format::bf16 && !vec) return launch_pdl(rowmajor_kernel<Bf16Scalar, GATE_UP>, g.rowmajor, b, 0, s, p);
    return cudaErrorInvalidValue;
}

// A launch's own error, else the last one pending (and cleared), as a checked launch returns.
cudaError_t launched(cudaError_t e) {
    const cudaError_t last = cudaGetLastError();
    return e != cudaSuccess ? e : last;
}

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

bool aligned(const void *p, size_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

// Bits of the grouping hash table for R routes: 2^bits >= 2R (at least 2 entries).
int32_t table_bits_for(size_t R) {
    int32_t b = 1;
    while ((size_t(1) << b) < 2 * R) ++b;
    return b;
}

}  // namespace

cudaError_t launch_combine_routes(const float *route_out, const int32_t *slots, const float *w,
                                  const uint16_t *addend, uint16_t *y, int32_t tokens, int32_t top_k,
                                  int32_t hidden, bool ds_fp4_rounding, cudaStream_t stream) {
    if (tokens < 0 || top_k <= 0 || hidden <= 0) return cudaErrorInvalidValue;
    if (tokens == 0) return cudaSuccess;
    if (!route_out || !slots || !w || !y) return cudaErrorInvalidValue;
    const dim3 grid((hidden + 255) / 256, unsigned(tokens < kMaxGridY ? tokens : kMaxGridY));
    return launched(launch_pdl(combine_kernel, grid, dim3(256), 0, stream, route_out, slots, w, addend, y, tokens, top_k,
                               hidden, ds_fp4_rounding));
}

ExpertDecoder::ExpertDecoder(Format format, int32_t hidden, int32_t inter, int32_t top_k, int32_t max_tokens,
                             DeviceActivation act)
    : format_(format), hidden_(hidden), inter_(inter), top_k_(top_k), max_tokens_(max_tokens), act_(act) {
    if (!format_known(int32_t(format)))
        fail(FT_ERR_INVALID_ARGUMENT, "expert decoder: unknown format ", int32_t(format));
    if (hidden <= 0 || inter <= 0)
        fail(FT_ERR_INVALID_ARGUMENT, "expert decoder: hidden ", hidden, " and intermediate ", inter, " must be > 0");
    const std::string geo = format_geometry_error(format, hidden, inter);
    if (!geo.empty()) fail(FT_ERR_INVALID_ARGUMENT, "expert decoder: ", geo);
    if (top_k <= 0 || max_tokens <= 0)
        fail(FT_ERR_INVALID_ARGUMENT, "expert decoder: top_k ", top_k, " and max_tokens ", max_tokens, " must be > 0");
    vec_ = format != Format::bf16 || (hidden % 8 == 0 && inter % 8 == 0);
    // Tensor-core kernels for every format; bf16 rows not a multiple of 8 take the CUDA-core one.
    mma_ = vec_;

    const size_t R = size_t(max_tokens) * size_t(top_k);
    size_t off = 0;
    auto take = [&off](size_t bytes) {
        const size_t at = off;
        off = align_up(off + bytes, 256);
        return at;
    };
    const size_t o_num = take(sizeof(int32_t));
    const size_t table = size_t(1) << table_bits_for(R);
    const size_t o_ints = take((6 * R + 3 * table) * sizeof(int32_t));
    const size_t o_xin = take(size_t(max_tokens) * size_t(hidden) * 2);
    const size_t o_inter = take(R * size_t(inter) * 2);
    const size_t o_out = take(R * size_t(hidden) * 4);
    scratch_bytes_ = off;

    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fail(FT_ERR_DEVICE, "expert decoder: no usable CUDA device: ", cudaGetErrorString(e));
    }
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms > 0)
        sms_ = sms;
    else
        cudaGetLastError();
    e = cudaMalloc(&scratch_, scratch_bytes_);
    if (e != cudaSuccess) {
        cudaGetLastError();
        scratch_ = nullptr;
        fail(e == cudaErrorMemoryAllocation ? FT_ERR_OUT_OF_MEMORY : FT_ERR_DEVICE, "expert decoder: cannot allocate ",
             scratch_bytes_, " bytes of scratch: ", cudaGetErrorString(e));
    }
    uint8_t *base = static_cast<uint8_t *>(scratch_);
    num_groups_ = reinterpret_cast<int32_t *>(base + o_num);
    int32_t *ints = reinterpret_cast<int32_t *>(base + o_ints);
    group_slot_ = ints;
    group_start_ = ints + R;
    group_count_ = ints + 2 * R;
    group_routes_ = ints + 3 * R;  // then [4R, 6R) per-route grouping temporaries, 3 tables
    xin_ = reinterpret_cast<uint16_t *>(base + o_xin);
    inter_buf_ = reinterpret_cast<uint16_t *>(base + o_inter);
    route_out_ = reinterpret_cast<float *>(base + o_out);
    // Before the first call the group count must read as "no groups" for a stray launch.
    e = cudaMemset(num_groups_, 0, sizeof(int32_t));
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaFree(scratch_);
        scratch_ = nullptr;
        fail(FT_ERR_DEVICE, "expert decoder: cudaMemset failed: ", cudaGetErrorString(e));
    }
}

ExpertDecoder::~ExpertDecoder() {
    if (scratch_) cudaFree(scratch_);
}

const char *ExpertDecoder::kernel_name() const {
    if (mma_) {
        switch (format_) {
            case Format::bf16: return "bf16-mma";
            case Format::fp8_block: return "fp8_block-mma";
            case Format::nvfp4: return "nvfp4-mma";
            case Format::ds_fp4: return "ds_fp4-mma(fp8 act)";
            case Format::q4_0: return "q4_0-mma";
            case Format::mxfp4: return "mxfp4-mma";
            default: break;
        }
    }
    return format_ == Format::bf16 ? "bf16-gemv-scalar" : "unknown";
}

cudaError_t ExpertDecoder::compute(const DeviceExperts &ex, const uint16_t *x, const int32_t *slots, int32_t tokens,
                                   cudaStream_t stream) {
    if (tokens < 0 || tokens > max_tokens_) return cudaErrorInvalidValue;
    if (tokens == 0) return cudaSuccess;
    if (!x || !slots) return cudaErrorInvalidValue;
    if (ex.format != format_ || ex.hidden != hidden_ || ex.inter != inter_) return cudaErrorInvalidValue;
    // Bank roles per format: [gate_up data, scale, extra], [down data, scale, extra]; -1 = none.
    int gu[3] = {0, -1, -1}, dn[3] = {1, -1, -1};
    int nbanks = 2;
    size_t need_align = vec_ ? 16 : 2;
    switch (format_) {
        case Format::bf16: break;
        case Format::fp8_block:
            gu[1] = 1, dn[0] = 2, dn[1] = 3, nbanks = 4;
            break;
        case Format::nvfp4:
            gu[1] = 1, gu[2] = 2, dn[0] = 3, dn[1] = 4, dn[2] = 5, nbanks = 6, need_align = 8;
            break;
        case Format::mxfp4:
            gu[1] = 1, gu[2] = 2, dn[0] = 3, dn[1] = 4, dn[2] = 5, nbanks = 6, need_align = 4;
            break;
        case Format::ds_fp4:
            gu[1] = 1, dn[0] = 2, dn[1] = 3, nbanks = 4;
            break;
        case Format::q4_0: need_align = 4; break;
    }
    if (ex.num_banks != nbanks) return cudaErrorInvalidValue;
    for (int b = 0; b < nbanks; ++b) {
        // Data banks carry the vector loads; scales/biases/globals need 2-byte alignment at most.
        const bool data_bank = b == gu[0] || b == dn[0];
        const bool mx_scale = format_ == Format::mxfp4 && (b == gu[1] || b == dn[1]);  // 4-byte loads
        const size_t a = data_bank ? need_align : mx_scale ? 4 : 2;
        if (!ex.base[b] || !aligned(ex.base[b], a) || ex.row_bytes[b] % a != 0) return cudaErrorInvalidValue;
    }

    const int64_t H = hidden_, I = inter_, R = int64_t(tokens) * top_k_;
    const size_t Rmax = size_t(max_tokens_) * size_t(top_k_);
    const size_t table = size_t(1) << table_bits_for(Rmax);
    int32_t *const temps = group_routes_ + Rmax;
    GroupScratch gs{num_groups_,  group_slot_,        group_start_,          group_count_,
                    group_routes_, temps,              temps + Rmax,          temps + 2 * Rmax,
                    temps + 2 * Rmax + table,          temps + 2 * Rmax + 2 * table, table_bits_for(size_t(R))};
    const bool ds = format_ == Format::ds_fp4;
    const int mode = ds ? 2 : (!aligned(x, 16) ? 1 : 0);
    const uint16_t *xact = mode ? xin_ : x;
    const int64_t elems = int64_t(tokens) * H;
    int prep_blocks = 0;
    if (mode == 1) prep_blocks = int((elems + kGroupThreads - 1) / kGroupThreads);
    if (mode == 2) prep_blocks = int((elems / 128 + kGroupThreads / 32 - 1) / (kGroupThreads / 32));
    prep_blocks = prep_blocks > 1024 ? 1024 : prep_blocks;
    cudaError_t e = launched(launch_pdl(prep_kernel, dim3(1 + prep_blocks), dim3(kGroupThreads), 0, stream, slots, int(R),
                                        gs, x, xin_, elems, mode));
    if (e != cudaSuccess) return e;

    ProjArgs p{};
    p.g = GroupView{num_groups_, group_slot_, group_start_, group_count_, group_routes_};
    p.inter = inter_;
    p.top_k = top_k_;
    p.activation = act_;
    p.ds_fp4 = ds;
    p.ds_clamp = ds && act_.kind == FT_ACT_SILU && std::isfinite(act_.limit) && act_.limit > 0.0f;
    p.inter_out = inter_buf_;
    p.route_out = route_out_;
    auto set_banks = [&](const int *roles) {
        p.data = ex.base[roles[0]];
        p.data_rb = ex.row_bytes[roles[0]];
        p.scale = roles[1] >= 0 ? ex.base[roles[1]] : nullptr;
        p.scale_rb = roles[1] >= 0 ? ex.row_bytes[roles[1]] : 0;
        p.extra = roles[2] >= 0 ? ex.base[roles[2]] : nullptr;
        p.extra_rb = roles[2] >= 0 ? ex.row_bytes[roles[2]] : 0;
    };
    // Grid rows over the groups: CTAs past the device's group count exit at once, but each still
    // has to be scheduled, and R rows (one per route) at T = 8 meant 7 empty CTAs for every busy
    // one. A few waves of CTAs in all suffice (rows loop over the groups, each group still read by
    // exactly one CTA row, so results do not change); never fewer rows than top_k, so a
    // single-token call keeps one group per row.
    auto grid_y = [&](int64_t gx) {
        int64_t gy = std::max<int64_t>((16 * int64_t(sms_) + gx - 1) / gx, top_k_);
        gy = std::min<int64_t>(std::min<int64_t>(gy, R), kMaxGridY);
        return unsigned(gy);
    };

    // gate_up
    set_banks(gu);
    p.K = hidden_;
    p.N = 2 * inter_;
    p.act = xact;
    p.act_by_token = true;
    const int64_t gx_mx_gu = (2 * I + kMxMmaCols - 1) / kMxMmaCols;
    const ProjGrids grids_gu{dim3(unsigned((I + 7) / 8), grid_y((I + 7) / 8)),  // mma: 8 units (16 rows) per CTA
                             dim3(unsigned((I + kWarps - 1) / kWarps), grid_y((I + kWarps - 1) / kWarps)),
                             dim3(unsigned(gx_mx_gu), grid_y(gx_mx_gu))};
    if ((e = launched(launch_projection<true>(format_, mma_, vec_, grids_gu, p, stream))) != cudaSuccess) return e;

    if (ds) {
        const int64_t groups = R * (I / 128);
        int64_t blocks = (groups + kWarps - 1) / kWarps;
        blocks = blocks > 4096 ? 4096 : blocks;
        e = launch_pdl(inter_round_trip_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, slots, inter_buf_, R,
                       inter_);
        if ((e = launched(e)) != cudaSuccess) return e;
    }

    // down
    set_banks(dn);
    p.K = inter_;
    p.N = hidden_;
    p.act = inter_buf_;
    p.act_by_token = false;
    const int64_t gx_mx_dn = (H + kMxMmaCols - 1) / kMxMmaCols;
    const int64_t gx_dn = (H + 2 * kWarps - 1) / (2 * kWarps);
    const ProjGrids grids_dn{dim3(unsigned((H + 15) / 16), grid_y((H + 15) / 16)),  // mma: 16 rows per CTA
                             dim3(unsigned(gx_dn), grid_y(gx_dn)),
                             dim3(unsigned(gx_mx_dn), grid_y(gx_mx_dn))};
    return launched(launch_projection<false>(format_, mma_, vec_, grids_dn, p, stream));
}

cudaError_t ExpertDecoder::combine(const int32_t *slots, const float *w, const uint16_t *addend, uint16_t *y,
                                   int32_t tokens, cudaStream_t stream) {
    if (tokens < 0 || tokens > max_tokens_) return cudaErrorInvalidValue;
    return launch_combine_routes(route_out_, slots, w, addend, y, tokens, top_k_, hidden_, format_ == Format::ds_fp4,
                                 stream);
}

cudaError_t ExpertDecoder::decode(const DeviceExperts &experts, const uint16_t *x, const int32_t *slots,
                                  const float *w, const uint16_t *addend, uint16_t *y, int32_t tokens,
                                  cudaStream_t stream) {
    const cudaError_t e = compute(experts, x, slots, tokens, stream);
    if (e != cudaSuccess) return e;
    return combine(slots, w, addend, y, tokens, stream);
}

}  // namespace ft::cuda
