// The CUDA-core decode kernel (decode.cpp): bf16 rows whose length is not a multiple of 8, and the
// GGUF block formats q4_0, q8_0, q2_k .. q6_k, iq4_xs where the integer-dot kernel (decode_dp4a.cu)
// does not serve them. A warp owns two output rows, its lanes split the reduction and finish with a
// shuffle reduction.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "decode_kernels.cuh"
#include "ft/cuda_gguf.cuh"
#include "ft/cuda_launch.cuh"

namespace ft::cuda::decode {
namespace {

// A format reads its rows in chunks of E elements (Raw: the chunk's bytes, one vector load
// where alignment allows) made of G groups of W elements. decode(raw, i, out) writes group i's
// weights without the block scale; scale(n, c, raw) is the chunk's block scale (one per chunk);
// finish(n, acc) applies what is per row. A chunk's weights are decoded once and
// reused by every route of the group.

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

// A GGUF block format: chunks of 32 weights whose scales (gguf_scales32) are read once per
// chunk and applied per weight, so the chunk scale is 1.
template <Format FMT>
struct GgufBlocks {
    static constexpr int E = 32, G = 4, W = 8;
    using Raw = GgufScales;
    const uint8_t *data;
    int64_t ld;
    __device__ GgufBlocks(const ProjArgs &p, int32_t slot)
        : data(p.data + size_t(slot) * p.data_rb), ld(gguf_row_bytes<FMT>(p.K)) {}
    __device__ Raw load(int n, int c) const { return gguf_scales32<FMT>(data + n * ld, int64_t(c) * E); }
    __device__ void decode(const Raw &w, int i, float *o) const { gguf_quants8<FMT>(w, i, o); }
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
    if (!unit_rows<GATE_UP>(p, unit, n0, n1, has1)) return;
    const int chunks = p.K / F::E;
    const int ngroups = *p.g.num;
    for (int gi = blockIdx.y; gi < ngroups; gi += gridDim.y) {
        const F f(p, p.g.slot[gi]);
        const int first = p.g.start[gi], count = p.g.count[gi];
        for (int r0 = 0; r0 < count; r0 += kRouteChunk) {
            const int nr = min(kRouteChunk, count - r0);
            const uint16_t *arow[kRouteChunk];
            int route[kRouteChunk];
            route_rows(p, first + r0, nr, route, arow);
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
                    float v0 = f.finish(n0, warp_sum(acc0[j]));
                    float v1 = has1 ? f.finish(n1, warp_sum(acc1[j])) : 0.0f;
                    if constexpr (std::is_same_v<F, Bf16Scalar>) {  // bf16 gpt-oss biases
                        const float *b = route_bias(p, route[j]);
                        v0 = plus_bias(b, n0, v0);
                        if (has1) v1 = plus_bias(b, n1, v1);
                    }
                    if (lane == j) store_route<GATE_UP>(p, route[j], unit, n0, n1, has1, v0, v1);
                }
            }
        }
    }
}

}  // namespace

namespace {
template <class F>
cudaError_t launch_rowmajor(bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s) {
    const dim3 b(kThreads);
    return gate_up ? launch_pdl(rowmajor_kernel<F, true>, grid, b, 0, s, p) : launch_pdl(rowmajor_kernel<F, false>, grid, b, 0, s, p);
}
}  // namespace

cudaError_t launch_simt_projection(Format f, bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s) {
    if (f != Format::bf16 && dp4a_usable(p)) return launch_dp4a_projection(f, gate_up, grid, p, s);
    switch (f) {
        case Format::bf16: return launch_rowmajor<Bf16Scalar>(gate_up, grid, p, s);
        case Format::q4_0: return launch_rowmajor<GgufBlocks<Format::q4_0>>(gate_up, grid, p, s);
        case Format::q8_0: return launch_rowmajor<GgufBlocks<Format::q8_0>>(gate_up, grid, p, s);
        case Format::q2_k: return launch_rowmajor<GgufBlocks<Format::q2_k>>(gate_up, grid, p, s);
        case Format::q3_k: return launch_rowmajor<GgufBlocks<Format::q3_k>>(gate_up, grid, p, s);
        case Format::q4_k: return launch_rowmajor<GgufBlocks<Format::q4_k>>(gate_up, grid, p, s);
        case Format::q5_k: return launch_rowmajor<GgufBlocks<Format::q5_k>>(gate_up, grid, p, s);
        case Format::q6_k: return launch_rowmajor<GgufBlocks<Format::q6_k>>(gate_up, grid, p, s);
        case Format::iq4_xs: return launch_rowmajor<GgufBlocks<Format::iq4_xs>>(gate_up, grid, p, s);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace ft::cuda::decode
