// The EP kernels are the device twins of ft/ep.hpp's layout, pack_dispatch, group_by_expert,
// unpack_payload, reduce_partials and combine_at_source; comments name the host rule each one
// mirrors and the tests compare them bit for bit. One file per stage: kernels_layout.cu,
// kernels_pack.cu, kernels_group.cu, kernels_reduce.cu (unpack, reduce, combine) and
// kernels_combine_wire.cu (FP8 combine). This header holds what they share: the bf16/e4m3 codecs
// matching the host ones, the FP8 block quantiser of the wire, the record geometry and the
// receive-side record lookup. Private to ft_ep_cuda.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "ft/cuda_launch.cuh"
#include "ft/cuda_numerics.cuh"
#include "ft/ep_cuda.hpp"

namespace ft::ep::cuda::detail {

using ft::cuda::launch_pdl;
using ft::cuda::pdl_wait;

// The device decoders of the expert kernels (ft::cuda), not the host ones of ft/common.hpp.
using ::ft::cuda::bf16_to_f32;
using ::ft::cuda::e4m3_to_f32;
using ::ft::cuda::e8m0_to_f32;

constexpr int kScanThreads = 256;

inline size_t align256(size_t v) { return (v + 255) / 256 * 256; }

template <typename T>
T *take(uint8_t *&p, size_t count) {
    T *out = reinterpret_cast<T *>(p);
    p += align256(count * sizeof(T));
    return out;
}

inline int grid_for(int64_t items, int per_block, int cap = 8192) {
    const int64_t g = (items + per_block - 1) / per_block;
    return static_cast<int>(std::clamp<int64_t>(g, 1, cap));
}

// Host ft::f32_to_bf16 exactly (NaN keeps its payload with the quiet bit set), so even NaN rows
// match the reference byte for byte.
__device__ __forceinline__ uint16_t to_bf16(float f) {
    uint32_t bits = __float_as_uint(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}

// Host ft::f32_to_e4m3: round to nearest even, saturating, NaN -> 0x7F whatever its sign.
__device__ __forceinline__ uint8_t to_e4m3(float v) {
    if (isnan(v)) return 0x7f;
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// Four consecutive bf16 values (8-byte aligned) to fp32, and back.
__device__ __forceinline__ void load4(const uint16_t *p, float (&v)[4]) {
    const uint2 raw = *reinterpret_cast<const uint2 *>(p);
    v[0] = bf16_to_f32(raw.x & 0xffffu);
    v[1] = bf16_to_f32(raw.x >> 16);
    v[2] = bf16_to_f32(raw.y & 0xffffu);
    v[3] = bf16_to_f32(raw.y >> 16);
}

__device__ __forceinline__ void store4(uint16_t *p, const float (&v)[4]) {
    uint2 out;
    out.x = uint32_t(to_bf16(v[0])) | (uint32_t(to_bf16(v[1])) << 16);
    out.y = uint32_t(to_bf16(v[2])) | (uint32_t(to_bf16(v[3])) << 16);
    *reinterpret_cast<uint2 *>(p) = out;
}

// Decode multiplier of FP8 wire block b: an fp32 scale or an e8m0 exponent byte.
__device__ __forceinline__ float block_scale(const uint8_t *scales, int64_t b, WireDtype dtype) {
    return dtype == WireDtype::Fp8Fp32 ? reinterpret_cast<const float *>(scales)[b] : e8m0_to_f32(scales[b]);
}

// The four e4m3 bytes of a word (lowest first), each times the block's multiplier: one fp32
// multiply, as the host's dequantize_fp8_row.
__device__ __forceinline__ void dequant4(uint32_t q, float scale, float (&v)[4]) {
    for (int i = 0; i < 4; ++i) v[i] = __fmul_rn(e4m3_to_f32(static_cast<uint8_t>(q >> (8 * i))), scale);
}

__device__ __forceinline__ int32_t rank_of(const DevicePlacement &p, int32_t phy) { return phy / p.slots_per_rank; }

constexpr uint32_t kFullWarp = 0xffffffffu;

// Inclusive sums over the warp of two values per lane, lo for index lane and hi for lane + 32
// (ranks and sources, R <= kMaxRanks = 64). Integer sums, so equal to the serial running sums.
__device__ __forceinline__ void warp_scan64(int64_t &lo, int64_t &hi) {
    const int lane = threadIdx.x % 32;
    for (int d = 1; d < 32; d <<= 1) {
        const int64_t lo_up = __shfl_up_sync(kFullWarp, lo, d), hi_up = __shfl_up_sync(kFullWarp, hi, d);
        if (lane >= d) {
            lo += lo_up;
            hi += hi_up;
        }
    }
    hi += __shfl_sync(kFullWarp, lo, 31);
}

// ---- wire records ------------------------------------------------------------------------------

struct RecordGeom {
    uint32_t payload_bytes, scales, scale_bytes, token, source, n, weight, slot, bytes;
};

inline RecordGeom geom(int64_t hidden, int32_t K, WireDtype dtype) {
    const RecordLayout L = record_layout(hidden, K, dtype);
    return {static_cast<uint32_t>(L.payload_bytes), static_cast<uint32_t>(L.scales), static_cast<uint32_t>(L.scale_bytes),
            static_cast<uint32_t>(L.token), static_cast<uint32_t>(L.source), static_cast<uint32_t>(L.n),
            static_cast<uint32_t>(L.weight), static_cast<uint32_t>(L.slot), static_cast<uint32_t>(L.bytes)};
}

constexpr int kPackThreads = 128;  // 4 warps; each warp quantises one 128-channel block at a time

// One 128-channel block: lane holds channels 4*lane .. 4*lane+3. The dispatch records and the
// FP8 combine rows are both encoded here. Returns the block's decode multiplier (what
// dequantize_fp8_row multiplies by); v and word receive the lane's inputs and e4m3 bytes.
__device__ __forceinline__ float quantise_block(const uint16_t *xb, uint8_t *qb, uint8_t *scale_at, WireDtype dtype,
                                                int lane, float (&v)[4], uint32_t &word) {
    load4(xb + 4 * lane, v);
    float amax = 0.0f;
    for (int i = 0; i < 4; ++i) {
        const float a = fabsf(v[i]);
        if (isfinite(a)) amax = fmaxf(amax, a);
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    amax = fmaxf(amax, kAmaxFloor);
    word = 0;
    float scale;
    if (dtype == WireDtype::Fp8Fp32) {
        const float inv = kE4m3Max / amax;
        for (int i = 0; i < 4; ++i) word |= uint32_t(to_e4m3(v[i] * inv)) << (8 * i);
        scale = amax / kE4m3Max;
        if (lane == 0) *reinterpret_cast<float *>(scale_at) = scale;
    } else {
        const uint32_t bits = __float_as_uint(amax / kE4m3Max);
        const int e = int((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0 ? 1 : 0);
        for (int i = 0; i < 4; ++i) word |= uint32_t(to_e4m3(ldexpf(v[i], -e))) << (8 * i);
        if (lane == 0) *scale_at = static_cast<uint8_t>(e + 127);
        scale = e8m0_to_f32(static_cast<uint8_t>(e + 127));
    }
    *reinterpret_cast<uint32_t *>(qb + 4 * lane) = word;
    return scale;
}

// ---- receive side ------------------------------------------------------------------------------

// Records of chunk c: source s contributes [count*c/C, count*(c+1)/C) (ChunkPlan::begin/end);
// the virtual index v runs over them, sources ascending. first[s] is prefix[s] (where source s's
// records start when the region is packed), kept here so that a position needs no global load.
struct ChunkTable {
    int64_t begin[kMaxRanks];
    int64_t first[kMaxRanks];
    int64_t vstart[kMaxRanks + 1];
};

// Warp 0 fills the table: lane l takes sources l and l + 32, so all count and prefix loads are in
// flight together; vstart is a warp scan of the per-source lengths. Needs blockDim.x >= 32.
__device__ inline void load_chunk_table(ChunkTable &tab, const int64_t *count, const int64_t *prefix, int32_t R, int32_t c,
                                 int32_t C) {
    if (threadIdx.x < 32) {
        const int32_t lane = threadIdx.x;
        int64_t n[2] = {0, 0}, p[2] = {0, 0}, len[2] = {0, 0};
        for (int h = 0; h < 2; ++h) {
            const int32_t s = lane + 32 * h;
            if (s >= R) continue;
            n[h] = count[s];
            p[h] = prefix[s];
        }
        for (int h = 0; h < 2; ++h) {
            const int32_t s = lane + 32 * h;
            if (s >= R) continue;
            const int64_t b = n[h] * c / C;
            tab.begin[s] = b;
            tab.first[s] = p[h];
            len[h] = n[h] * (c + 1) / C - b;
        }
        warp_scan64(len[0], len[1]);
        if (lane == 0) tab.vstart[0] = 0;
        if (lane < R) tab.vstart[lane + 1] = len[0];
        if (lane + 32 < R) tab.vstart[lane + 33] = len[1];
    }
    __syncthreads();
}

struct RecvGeom {
    const uint8_t *base;
    size_t peer_bytes;
    int64_t capacity;
    uint32_t bytes;
};

// (source, index) of virtual record v -> its position. The source is the last s with
// vstart[s] <= v (the serial scan's answer, empty sources skipped): a binary search over the
// non-decreasing vstart, log2(kMaxRanks) shared loads at most, no global ones.
__device__ __forceinline__ int64_t position_of(const ChunkTable &tab, int32_t R, const RecvGeom &rg, int64_t v,
                                               int32_t &source) {
    int32_t s = 0;
#pragma unroll
    for (int32_t step = kMaxRanks / 2; step > 0; step >>= 1)
        if (s + step < R && tab.vstart[s + step] <= v) s += step;
    source = s;
    const int64_t i = tab.begin[s] + (v - tab.vstart[s]);
    return rg.peer_bytes ? s * rg.capacity + i : tab.first[s] + i;
}

__device__ __forceinline__ const uint8_t *record_at(const RecvGeom &rg, int64_t pos) {
    if (rg.peer_bytes == 0) return rg.base + pos * rg.bytes;
    // 32-bit division where it fits (always at decode sizes): a 64-bit one is a long call.
    int64_t s, i;
    if (pos >= 0 && pos <= INT32_MAX && rg.capacity > 0 && rg.capacity <= INT32_MAX) {
        const uint32_t p32 = static_cast<uint32_t>(pos), c32 = static_cast<uint32_t>(rg.capacity);
        s = p32 / c32;
        i = p32 % c32;
    } else {
        s = pos / rg.capacity;
        i = pos % rg.capacity;
    }
    return rg.base + s * rg.peer_bytes + kPeerHeaderBytes + i * rg.bytes;
}

__device__ __forceinline__ int32_t rec_n(const uint8_t *rec, const RecordGeom &g) {
    return *reinterpret_cast<const int16_t *>(rec + g.n);
}
__device__ __forceinline__ int32_t rec_slot(const uint8_t *rec, const RecordGeom &g, int32_t j) {
    return *reinterpret_cast<const int16_t *>(rec + g.slot + 2 * j);
}

inline void check_launch(const char *what) { check_cuda(cudaGetLastError(), what); }

inline RecvGeom recv_geom(const RecvRegion &src, const RecordGeom &g) {
    return {src.base, src.peer_bytes, src.capacity, g.bytes};
}

}  // namespace ft::ep::cuda::detail
