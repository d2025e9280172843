// Decode prep and combine (decode.cpp): grouping the routes by slot on the device, staging the
// input, ds_fp4's intermediate round trip, and the weighted sum over routes.
#include <cuda_runtime.h>

#include <cstdint>

#include "decode_kernels.cuh"
#include "ft/cuda_launch.cuh"
#include "ft/cuda_experts.hpp"

namespace ft::cuda::decode {
namespace {

// Inclusive scan over the 32 lanes of a warp; every lane must call it.
__device__ __forceinline__ int warp_inclusive_scan(int v) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int x = __shfl_up_sync(0xffffffffu, v, o);
        if ((threadIdx.x & 31) >= o) v += x;
    }
    return v;
}
__device__ __forceinline__ int2 warp_inclusive_scan(int2 v) {
    return make_int2(warp_inclusive_scan(v.x), warp_inclusive_scan(v.y));
}

// Exclusive block scan of two counters; `total` gets the block sums. All threads must call it.
__device__ int2 block_exclusive_scan2(int2 v, int2 *total) {
    __shared__ int2 ws[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    const int2 inc = warp_inclusive_scan(v);
    if (lane == 31) ws[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        ws[lane] = warp_inclusive_scan(lane < nw ? ws[lane] : make_int2(0, 0));
    }
    __syncthreads();
    const int2 before = warp > 0 ? ws[warp - 1] : make_int2(0, 0);
    *total = ws[nw - 1];
    __syncthreads();  // ws is reused by the next call
    return make_int2(before.x + inc.x - v.x, before.y + inc.y - v.y);
}

// The grouping's temporaries fit shared memory up to these sizes (one call's routes R = tokens x
// top_k, table 2^bits >= 2R entries); larger calls keep them in the global scratch.
constexpr int kSmemTable = 2048, kSmemRoutes = 1024;

// A temporary written by atomics or by other threads of the block, read after a barrier: shared
// memory is coherent within the block; global values are read from L2 (ld.cg), never a stale L1.
template <bool SMEM>
__device__ __forceinline__ int32_t ld_temp(const int32_t *p) {
    if constexpr (SMEM)
        return *p;
    else
        return __ldcg(p);
}

// Groups routes by slot through an open-addressing hash table (key, cnt, grp: 2^bits >= 2R
// entries, so probing ends; entry, rank: per route): one CAS per route finds its slot's entry, an
// atomicAdd there gives its position in the group; a scan over the table numbers the used
// entries. O((R + 2^bits) / threads) per thread. The order of routes inside a group follows the
// atomics, which does not change any result: every route is computed by the same operations
// whatever its position. The temporaries are in shared memory (SMEM) or the global scratch.
template <bool SMEM>
__device__ void build_groups(const int32_t *slots, int R, const GroupScratch &g, int32_t *key, int32_t *cnt,
                             int32_t *grp, int32_t *entry, int32_t *rank) {
    const int P = 1 << g.table_bits;
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        key[i] = -1;
        cnt[i] = 0;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
        const int32_t s = slots[r];
        if (s < 0) continue;
        uint32_t h = (uint32_t(s) * 2654435761u) >> (32 - g.table_bits);
        for (;;) {
            const int32_t old = atomicCAS(&key[h], -1, s);
            if (old == -1 || old == s) break;
            h = (h + 1) & uint32_t(P - 1);
        }
        entry[r] = int32_t(h);
        rank[r] = atomicAdd(&cnt[h], 1);
    }
    __syncthreads();
    __shared__ int2 carry;
    if (threadIdx.x == 0) carry = make_int2(0, 0);
    __syncthreads();
    for (int base = 0; base < P; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const int32_t c = i < P ? ld_temp<SMEM>(&cnt[i]) : 0;
        int2 total;
        const int2 pos = block_exclusive_scan2(make_int2(c > 0 ? 1 : 0, c), &total);
        if (c > 0) {
            const int gi = carry.x + pos.x;
            g.slot[gi] = ld_temp<SMEM>(&key[i]);
            g.start[gi] = carry.y + pos.y;
            g.count[gi] = c;
            grp[i] = gi;
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
        const int gi = ld_temp<SMEM>(&grp[ld_temp<SMEM>(&entry[r])]);
        g.routes[__ldcg(&g.start[gi]) + ld_temp<SMEM>(&rank[r])] = r;
    }
}

// Groups up to 32 routes in one warp (a decode step of a few tokens): lanes holding the same slot
// find each other with __match_any_sync; groups are numbered by their first route, and a group's
// routes are in route order. The same tables as build_groups, without its temporaries and barriers.
__device__ void build_groups_warp(const int32_t *slots, int R, const GroupScratch &g) {
    constexpr unsigned kAll = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const int32_t s = lane < R ? slots[lane] : -1;
    const bool valid = s >= 0;
    const unsigned peers = __match_any_sync(kAll, s) & __ballot_sync(kAll, valid);  // 0 where !valid
    const int leader = valid ? __ffs(peers) - 1 : 0;
    const bool lead = valid && leader == lane;
    const unsigned leaders = __ballot_sync(kAll, lead);
    // Exclusive prefix sum of the group sizes over the leaders, in lane order.
    const int count = __popc(peers);
    const int incl = warp_inclusive_scan(lead ? count : 0);
    const int start = __shfl_sync(kAll, incl - (lead ? count : 0), leader);
    if (lead) {
        const int gi = __popc(leaders & ((1u << lane) - 1u));
        g.slot[gi] = s;
        g.start[gi] = start;
        g.count[gi] = count;
    }
    if (valid) g.routes[start + __popc(peers & ((1u << lane) - 1u))] = lane;
    if (lane == 0) *g.num = __popc(leaders);
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
    __shared__ int32_t table[3 * kSmemTable], per_route[2 * kSmemRoutes];
    pdl_wait();
    if (blockIdx.x == 0) {
        const int P = 1 << g.table_bits;
        if (R <= 32) {
            if (threadIdx.x < 32) build_groups_warp(slots, R, g);
        } else if (P <= kSmemTable && R <= kSmemRoutes) {
            build_groups<true>(slots, R, g, table, table + P, table + 2 * P, per_route, per_route + R);
        } else {
            build_groups<false>(slots, R, g, g.key, g.cnt, g.grp, g.entry, g.rank);
        }
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

}  // namespace

cudaError_t launch_prep(int blocks, const int32_t *slots, int R, const GroupScratch &g, const uint16_t *x,
                        uint16_t *xin, int64_t elems, int mode, cudaStream_t s) {
    return launch_pdl(prep_kernel, dim3(1 + blocks), dim3(kGroupThreads), 0, s, slots, R, g, x, xin, elems, mode);
}

cudaError_t launch_inter_round_trip(const int32_t *slots, uint16_t *inter, int64_t R, int32_t I, cudaStream_t s) {
    const int64_t groups = R * (I / 128);
    int64_t blocks = (groups + kWarps - 1) / kWarps;
    blocks = blocks > 4096 ? 4096 : blocks;
    return launch_pdl(inter_round_trip_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, s, slots, inter, R, I);
}

}  // namespace ft::cuda::decode

namespace ft::cuda {

using namespace decode;

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

}  // namespace ft::cuda
