// The tensor-core decode kernel of mxfp4 (decode.cpp), whose banks are stored transposed.
#include <cuda_runtime.h>

#include <cstdint>

#include "decode_kernels.cuh"
#include "ft/cuda_launch.cuh"

namespace ft::cuda::decode {
namespace {

// mxfp4 on the tensor cores. The banks are transposed (byte (kb, n) = W[n, 2kb] low nibble and
// W[n, 2kb+1] high nibble), so one byte is exactly the k pair an mma operand register holds for
// one row n. A CTA owns 64 columns as four m16 tiles: lane (g, t) supplies row g of tile j from
// column 4g + j and row g + 8 from column 32 + 4g + j, so its 4-byte loads at (kb, 4g) and
// (kb, 32 + 4g) serve all four tiles and a warp's load covers 4 rows x 32 contiguous bytes. Each
// mma step spans 8 kb (16 k) inside one 32-k scale block; the block's two steps go to a fresh
// accumulator scaled by e8m0 in fp32 (the CUDA-core kernel's order of operations). 8 warps split
// the blocks and reduce through shared memory in warp order.
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

}  // namespace

cudaError_t launch_mxfp4_projection(bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s) {
    return launch_pdl(mxfp4_mma_kernel, grid, dim3(kThreads), 0, s, p, gate_up);
}

}  // namespace ft::cuda::decode
