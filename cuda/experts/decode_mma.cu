// The tensor-core decode kernels of the row-major formats (decode.cpp): bf16, fp8_block, nvfp4
// and ds_fp4, one trait per format around one mma_kernel.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "decode_kernels.cuh"
#include "ft/cuda_launch.cuh"

namespace ft::cuda::decode {
namespace {

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
// inside one 128-column tile) goes to a fresh accumulator that is scaled in fp32.

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
    __device__ static int64_t row_bytes(int K) { return int64_t(K) * 2; }
    const uint8_t *data;
    int64_t ld;
    __device__ MmaBf16(const ProjArgs &p, int32_t slot)
        : data(p.data + size_t(slot) * p.data_rb), ld(row_bytes(p.K)) {}
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
    __device__ static int64_t row_bytes(int K) { return K; }
    const uint8_t *data, *scales;
    int64_t ld;
    int32_t tiles;
    __device__ MmaFp8(const ProjArgs &p, int32_t slot)
        : data(p.data + size_t(slot) * p.data_rb), scales(p.scale + size_t(slot) * p.scale_rb), ld(row_bytes(p.K)),
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
    __device__ static int64_t row_bytes(int K) { return K / 2; }
    const uint8_t *data, *scales, *global;
    int64_t ld, sld;
    __device__ MmaNvfp4(const ProjArgs &p, int32_t slot)
        : data(p.data + size_t(slot) * p.data_rb), scales(p.scale + size_t(slot) * p.scale_rb),
          global(p.extra + size_t(slot) * p.extra_rb), ld(row_bytes(p.K)), sld(p.K / 16) {}
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
    __device__ static int64_t row_bytes(int K) { return K / 2; }
    const uint8_t *data, *scales;
    int64_t ld, sld;
    __device__ MmaDsFp4(const ProjArgs &p, int32_t slot)
        : data(p.data + size_t(slot) * p.data_rb), scales(p.scale + size_t(slot) * p.scale_rb),
          ld(row_bytes(p.K)), sld(p.K / 32) {}
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

template <class F, bool GATE_UP>
__global__ void __launch_bounds__(kThreads, F::kMinBlocks) mma_kernel(ProjArgs p) {
    // down: the CTA's rows 16x .. 16x + 15, in the first wave (kMinBlocks CTAs per SM at least).
    if (!GATE_UP) early_prefetch_down(p, F::row_bytes(p.K), blockIdx.x * 8, 8, p.sms * F::kMinBlocks);
    pdl_wait();  // launched by launch_pdl: nothing before this reads earlier kernels' output
    pdl_trigger();  // the next projection's CTAs may be scheduled (early_prefetch_down)
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
                    // bf16 gpt-oss biases (f32, before the activation / per route after down).
                    const float *b = nullptr;
                    if constexpr (std::is_same_v<F, MmaBf16>) b = route_bias(p, route);
                    if (GATE_UP) {
                        if (ok0)
                            p.inter_out[int64_t(route) * p.inter + unit] =
                                gate_up_out(p, plus_bias(b, row0, f.finish(row0, v[c])),
                                            plus_bias(b, row1, f.finish(row1, v[2 + c])));
                    } else {
                        float *o = p.route_out + int64_t(route) * p.N;
                        if (ok0) o[row0] = plus_bias(b, row0, f.finish(row0, v[c]));
                        if (ok1) o[row1] = plus_bias(b, row1, f.finish(row1, v[2 + c]));
                    }
                }
            }
            __syncthreads();
        }
    }
}

template <class F>
cudaError_t launch_format(bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s) {
    const dim3 b(kThreads);
    return gate_up ? launch_pdl(mma_kernel<F, true>, grid, b, 0, s, p) : launch_pdl(mma_kernel<F, false>, grid, b, 0, s, p);
}

}  // namespace

cudaError_t launch_mma_projection(Format f, bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s) {
    switch (f) {
        case Format::bf16: return launch_format<MmaBf16>(gate_up, grid, p, s);
        case Format::fp8_block: return launch_format<MmaFp8>(gate_up, grid, p, s);
        case Format::nvfp4: return launch_format<MmaNvfp4>(gate_up, grid, p, s);
        case Format::ds_fp4: return launch_format<MmaDsFp4>(gate_up, grid, p, s);
        default: return cudaErrorInvalidValue;  // mxfp4: launch_mxfp4_projection
    }
}

}  // namespace ft::cuda::decode
