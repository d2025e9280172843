// The kernels of the GPU prefill (prefill_kernels.cuh): dequantisation, gather, epilogue and
// scatter, and launch_dequant_bf16 (ft/cuda_prefill.hpp).
#include <algorithm>
#include <cstring>

#include "ft/cuda_gguf.cuh"
#include "ft/cuda_numerics.cuh"
#include "ft/cuda_prefill.hpp"
#include "ft/dequant.hpp"
#include "prefill_kernels.cuh"

namespace ft::cuda {
namespace prefill {

Roles roles_of(Format f) {
    switch (f) {
        case Format::fp8_block:
            return {0, 1, -1, -1, 2, 3, -1, -1};
        case Format::nvfp4:
            return {0, 1, 2, -1, 3, 4, 5, -1};
        case Format::mxfp4:
            return {0, 1, -1, 2, 3, 4, -1, 5};
        case Format::ds_fp4:
            return {0, 1, -1, -1, 2, 3, -1, -1};
        default:
            return {0, -1, -1, -1, 1, -1, -1, -1};  // bf16 and the GGUF block formats
    }
}

namespace {

// ---- device helpers -------------------------------------------------------------------------

__device__ __forceinline__ const uint8_t *bank_row(const DeviceExperts &e, int bank, int32_t slot) {
    return e.base[bank] + size_t(slot) * e.row_bytes[bank];
}

// Little-endian 16-bit value at any byte address (bank rows carry no alignment promise).
__device__ __forceinline__ uint16_t load_u16(const uint8_t *p) {
    return uint16_t(p[0] | (uint32_t(p[1]) << 8));
}

__device__ __forceinline__ uint4 pack8(const float *v) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = uint32_t(f32_to_bf16(v[2 * i])) | (uint32_t(f32_to_bf16(v[2 * i + 1])) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// Row-major formats (fp8_block, nvfp4, ds_fp4, the GGUF block formats): one block per output row (blockIdx.x)
// of one matrix (matrix < 0: blockIdx.y = 2 * expert + (0 gate_up | 1 down); matrix 0 or 1: only
// gate_up or only down, blockIdx.y = expert, for models mixing block formats per matrix); each
// thread makes 8 consecutive bf16 outputs per step, so a warp reads 128 (fp4) or 256 (fp8)
// contiguous bytes.
template <Format F>
__global__ void dequant_rows_kernel(DeviceExperts ex, Roles ro, const int32_t *slots, uint16_t *out, int matrix) {
    const int32_t H = ex.hidden, I = ex.inter;
    const int32_t j = matrix < 0 ? int32_t(blockIdx.y >> 1) : int32_t(blockIdx.y);
    const bool down = matrix < 0 ? (blockIdx.y & 1) != 0 : matrix == 1;
    const int32_t N = down ? H : 2 * I, K = down ? I : H;
    const int32_t row = int32_t(blockIdx.x);
    if (row >= N) return;
    const int32_t slot = slots[j];
    const uint8_t *data = bank_row(ex, down ? ro.dn : ro.gu, slot);
    const uint8_t *sc = ro.gu_scale >= 0 ? bank_row(ex, down ? ro.dn_scale : ro.gu_scale, slot) : nullptr;
    uint16_t *dst = out + int64_t(j) * 3 * H * I + (down ? int64_t(2) * I * H : 0) + int64_t(row) * K;
    for (int32_t k0 = threadIdx.x * 8; k0 < K; k0 += blockDim.x * 8) {  // K is a multiple of 8
        float vals[8];
        if constexpr (F == Format::fp8_block) {
            const float s =
                bf16_to_f32(load_u16(sc + (int64_t(row / kFp8Block) * (K / kFp8Block) + k0 / kFp8Block) * 2));
            const uint8_t *p = data + int64_t(row) * K + k0;
#pragma unroll
            for (int e = 0; e < 8; ++e) vals[e] = e4m3_to_f32(p[e]) * s;
        } else if constexpr (F == Format::nvfp4 || F == Format::ds_fp4) {
            const float s = F == Format::nvfp4 ? e4m3_to_f32(sc[int64_t(row) * (K / kNvfp4Block) + k0 / kNvfp4Block])
                                               : e8m0_to_f32(sc[int64_t(row) * (K / kDsfp4Block) + k0 / kDsfp4Block]);
            const uint8_t *p = data + int64_t(row) * (K / 2) + k0 / 2;
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const uint32_t byte = p[b];
                vals[2 * b] = e2m1_to_f32(byte & 15u) * s;
                vals[2 * b + 1] = e2m1_to_f32(byte >> 4) * s;
            }
        } else {  // the GGUF block formats
            gguf_dequant8<F>(data + int64_t(row) * gguf_row_bytes<F>(K), k0, vals);
        }
        *reinterpret_cast<uint4 *>(dst + k0) = pack8(vals);
    }
}

// mxfp4 (transposed, N innermost): a block turns a 64 (K) x 64 (N) tile around through shared
// memory so both the byte reads (along N) and the bf16 row writes (along K) are coalesced.
// blockIdx.x: tile, y: 0 gate_up / 1 down, z: expert. gate_up units are de-interleaved.
constexpr int kMxTile = 64;
constexpr int kMxPitch = kMxTile + 8;  // keeps 16-byte rows for the vector reads

__global__ void dequant_mxfp4_kernel(DeviceExperts ex, Roles ro, const int32_t *slots, uint16_t *out) {
    const int64_t H = ex.hidden, I = ex.inter;
    const bool down = blockIdx.y == 1;
    const int64_t N = down ? H : 2 * I, K = down ? I : H;
    const int64_t tiles_n = (N + kMxTile - 1) / kMxTile, tiles_k = (K + kMxTile - 1) / kMxTile;
    if (int64_t(blockIdx.x) >= tiles_n * tiles_k) return;  // uniform per block: before any barrier
    const int64_t n0 = (blockIdx.x % tiles_n) * kMxTile, k0 = (blockIdx.x / tiles_n) * kMxTile;
    const int32_t slot = slots[blockIdx.z];
    const uint8_t *blocks = bank_row(ex, down ? ro.dn : ro.gu, slot);              // [K/2][N]
    const uint8_t *scales = bank_row(ex, down ? ro.dn_scale : ro.gu_scale, slot);  // [K/32][N]
    __shared__ __align__(16) uint16_t tile[kMxTile][kMxPitch];
    const int tx = threadIdx.x % kMxTile, ty = threadIdx.x / kMxTile, rows_per_pass = blockDim.x / kMxTile;
    const int64_t n = n0 + tx;
    for (int kb = ty; kb < kMxTile / 2; kb += rows_per_pass) {
        const int64_t kk = k0 / 2 + kb;  // packed K row
        uint16_t lo = 0, hi = 0;
        if (n < N && 2 * kk < K) {
            const uint32_t b = blocks[kk * N + n];
            const float s = e8m0_to_f32(scales[(kk / (kMxfp4Block / 2)) * N + n]);
            lo = f32_to_bf16(e2m1_to_f32(b & 15u) * s);
            hi = f32_to_bf16(e2m1_to_f32(b >> 4) * s);
        }
        tile[tx][2 * kb] = lo;
        tile[tx][2 * kb + 1] = hi;
    }
    __syncthreads();
    uint16_t *dst = out + int64_t(blockIdx.z) * 3 * H * I + (down ? 2 * I * H : 0);
    for (int w = threadIdx.x; w < kMxTile * kMxTile / 8; w += blockDim.x) {
        const int r = w / (kMxTile / 8), c = (w % (kMxTile / 8)) * 8;
        const int64_t nn = n0 + r, kk = k0 + c;
        if (nn >= N || kk >= K) continue;  // K is a multiple of 32, so kk < K means kk + 8 <= K
        const int64_t row = down ? nn : ((nn & 1) ? I + (nn >> 1) : (nn >> 1));
        *reinterpret_cast<uint4 *>(dst + row * K + kk) = *reinterpret_cast<const uint4 *>(&tile[r][c]);
    }
}

// xg[r] = x[row_token[r]] for the chunk's rows; ds_fp4 FP8-round-trips each 128 on the way.
// One block per row; each thread moves 8 elements per step (16 consecutive threads = one 128
// group), all threads take the same number of steps so the shuffles see full warps.
template <bool kRoundTrip, bool kVector>
__global__ void gather_rows_kernel(const uint16_t *x, const int32_t *row_token, int32_t H, uint16_t *xg) {
    const int64_t r = blockIdx.x;
    const uint16_t *src = x + int64_t(row_token[r]) * H;
    uint16_t *dst = xg + r * H;
    for (int base = 0; base < H; base += blockDim.x * 8) {
        const int k = base + threadIdx.x * 8;
        const bool in = k < H;  // H is a multiple of 8
        uint16_t raw[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (in) {
            if constexpr (kVector) {
                const uint4 v = *reinterpret_cast<const uint4 *>(src + k);
                std::memcpy(raw, &v, 16);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) raw[e] = src[k + e];
            }
        }
        if constexpr (kRoundTrip) {
            float v[8], amax = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                v[e] = bf16_to_f32(raw[e]);
                amax = fmaxf(amax, fabsf(v[e]));
            }
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
            const float s = fp8_group_scale(amax);
#pragma unroll
            for (int e = 0; e < 8; ++e) raw[e] = f32_to_bf16(fp8_round_trip(v[e], s));
        }
        if (in) {
            uint4 v;
            std::memcpy(&v, raw, 16);
            *reinterpret_cast<uint4 *>(dst + k) = v;  // xg rows are 16-byte aligned (H % 8 == 0)
        }
    }
}

// Intermediate of the chunk's rows from the gate_up GEMM output acc [rows, 2I] (gate units,
// then up units): nvfp4 globals, mxfp4 biases, ds_fp4 bf16 rounding and clamp, activation,
// bf16; ds_fp4 then FP8-round-trips each 128 of the bf16 intermediate. A warp owns 128 units.
template <Format F>
__global__ void epilogue_kernel(const float *acc, const int32_t *row_slot, DeviceExperts ex, Roles ro,
                                DeviceActivation act, bool ds_clamp, uint16_t *inter) {
    const int64_t r = blockIdx.x, I = ex.inter;
    const float *g_row = acc + r * 2 * I, *u_row = g_row + I;
    const int32_t slot = row_slot[r];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int64_t i0 = int64_t(warp) * 128; i0 < I; i0 += int64_t(nwarps) * 128) {
        float a[4];
        float amax = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int64_t i = i0 + lane * 4 + e;
            a[e] = 0.0f;
            if (i >= I) continue;
            float g = g_row[i], u = u_row[i];
            if constexpr (F == Format::nvfp4) {
                const uint8_t *gl = bank_row(ex, ro.gu_global, slot);
                g *= f16_to_f32(load_u16(gl + i * 2));
                u *= f16_to_f32(load_u16(gl + (I + i) * 2));
            } else if constexpr (F == Format::mxfp4) {
                const uint8_t *bias = bank_row(ex, ro.gu_bias, slot);  // interleaved like the columns
                g += bf16_to_f32(load_u16(bias + i * 4));
                u += bf16_to_f32(load_u16(bias + i * 4 + 2));
            } else if constexpr (F == Format::ds_fp4) {
                g = round_bf16(g);
                u = round_bf16(u);
                if (ds_clamp) {
                    g = fminf(g, act.limit);
                    u = fmaxf(fminf(u, act.limit), -act.limit);
                }
            } else if constexpr (F == Format::bf16) {
                if (ex.gate_up_bias && slot < ex.bias_experts) {  // bf16 gpt-oss: slot = expert id
                    const float *bias = ex.gate_up_bias + int64_t(slot) * 2 * I;
                    g += bias[i];
                    u += bias[I + i];
                }
            }
            a[e] = round_bf16(activate(act, g, u));
            amax = fmaxf(amax, fabsf(a[e]));
        }
        if constexpr (F == Format::ds_fp4) {  // I % 128 == 0: the whole warp holds one group
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
            const float s = fp8_group_scale(amax);
#pragma unroll
            for (int e = 0; e < 4; ++e) a[e] = fp8_round_trip(a[e], s);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int64_t i = i0 + lane * 4 + e;
            if (i < I) inter[r * I + i] = f32_to_bf16(a[e]);
        }
    }
}

// route_out[row_route[r]] = acc[r] [H] (down GEMM output) with nvfp4's per-row global or
// mxfp4's down bias; unweighted (launch_combine_routes applies w).
template <Format F>
__global__ void scatter_kernel(const float *acc, const int32_t *row_route, const int32_t *row_slot, DeviceExperts ex,
                               Roles ro, float *route_out) {
    const int64_t r = blockIdx.x, H = ex.hidden;
    const float *src = acc + r * H;
    float *dst = route_out + int64_t(row_route[r]) * H;
    const int32_t slot = row_slot[r];
    for (int64_t h = int64_t(threadIdx.x) * 4; h < H; h += int64_t(blockDim.x) * 4) {
        float4 v = *reinterpret_cast<const float4 *>(src + h);
        if constexpr (F == Format::nvfp4) {
            const uint8_t *gl = bank_row(ex, ro.dn_global, slot) + h * 2;
            v.x *= f16_to_f32(load_u16(gl));
            v.y *= f16_to_f32(load_u16(gl + 2));
            v.z *= f16_to_f32(load_u16(gl + 4));
            v.w *= f16_to_f32(load_u16(gl + 6));
        } else if constexpr (F == Format::mxfp4) {
            const uint8_t *b = bank_row(ex, ro.dn_bias, slot) + h * 2;
            v.x += bf16_to_f32(load_u16(b));
            v.y += bf16_to_f32(load_u16(b + 2));
            v.z += bf16_to_f32(load_u16(b + 4));
            v.w += bf16_to_f32(load_u16(b + 6));
        } else if constexpr (F == Format::bf16) {
            if (ex.down_bias && slot < ex.bias_experts) {  // bf16 gpt-oss: slot = expert id
                const float *b = ex.down_bias + int64_t(slot) * H + h;
                v.x += b[0];
                v.y += b[1];
                v.z += b[2];
                v.w += b[3];
            }
        }
        *reinterpret_cast<float4 *>(dst + h) = v;
    }
}

template <Format F>
void launch_epilogue_scatter(bool scatter, const float *acc, const int32_t *rt, const int32_t *rs,
                             const DeviceExperts &ex, const Roles &ro, const DeviceActivation &act, bool ds_clamp,
                             uint16_t *inter, float *route_out, int32_t rows, cudaStream_t s) {
    if (scatter)
        scatter_kernel<F><<<rows, 256, 0, s>>>(acc, rt, rs, ex, ro, route_out);
    else
        epilogue_kernel<F><<<rows, 128, 0, s>>>(acc, rs, ex, ro, act, ds_clamp, inter);
}

}  // namespace

void launch_gather_rows(bool ds_fp4, bool vec, const uint16_t *x, const int32_t *row_token, int32_t H, uint16_t *xg,
                        int32_t rows, cudaStream_t s) {
    if (ds_fp4)
        vec ? gather_rows_kernel<true, true><<<rows, 256, 0, s>>>(x, row_token, H, xg)
            : gather_rows_kernel<true, false><<<rows, 256, 0, s>>>(x, row_token, H, xg);
    else
        vec ? gather_rows_kernel<false, true><<<rows, 256, 0, s>>>(x, row_token, H, xg)
            : gather_rows_kernel<false, false><<<rows, 256, 0, s>>>(x, row_token, H, xg);
}

void launch_format(Format f, bool scatter, const float *acc, const int32_t *rt, const int32_t *rs,
                   const DeviceExperts &ex, const Roles &ro, const DeviceActivation &act, bool ds_clamp,
                   uint16_t *inter, float *route_out, int32_t rows, cudaStream_t s) {
    switch (f) {
        case Format::nvfp4:
            return launch_epilogue_scatter<Format::nvfp4>(scatter, acc, rt, rs, ex, ro, act, ds_clamp, inter, route_out,
                                                          rows, s);
        case Format::mxfp4:
            return launch_epilogue_scatter<Format::mxfp4>(scatter, acc, rt, rs, ex, ro, act, ds_clamp, inter, route_out,
                                                          rows, s);
        case Format::ds_fp4:
            return launch_epilogue_scatter<Format::ds_fp4>(scatter, acc, rt, rs, ex, ro, act, ds_clamp, inter,
                                                           route_out, rows, s);
        default:  // bf16, fp8_block, the GGUF block formats: no per-row factor, no bias
            return launch_epilogue_scatter<Format::bf16>(scatter, acc, rt, rs, ex, ro, act, ds_clamp, inter, route_out,
                                                         rows, s);
    }
}

}  // namespace prefill

using namespace prefill;

namespace {

// One dequant_rows_kernel launch of row-major format f (matrix: see the kernel).
cudaError_t launch_dequant_rows(Format f, dim3 grid, int threads, const DeviceExperts &ex, const Roles &ro,
                                const int32_t *slots, uint16_t *out, int matrix, cudaStream_t stream) {
    switch (f) {
        case Format::fp8_block:
            dequant_rows_kernel<Format::fp8_block><<<grid, threads, 0, stream>>>(ex, ro, slots, out, matrix);
            break;
        case Format::nvfp4:
            dequant_rows_kernel<Format::nvfp4><<<grid, threads, 0, stream>>>(ex, ro, slots, out, matrix);
            break;
        case Format::ds_fp4:
            dequant_rows_kernel<Format::ds_fp4><<<grid, threads, 0, stream>>>(ex, ro, slots, out, matrix);
            break;
        case Format::q4_0:
            dequant_rows_kernel<Format::q4_0><<<grid, threads, 0, stream>>>(ex, ro, slots, out, matrix);
            break;
        case Format::q8_0:
            dequant_rows_kernel<Format::q8_0><<<grid, threads, 0, stream>>>(ex, ro, slots, out, matrix);
            break;
        case Format::q2_k:
            dequant_rows_kernel<Format::q2_k><<<grid, threads, 0, stream>>>(ex, ro, slots, out, matrix);
            break;
        case Format::q3_k:
            dequant_rows_kernel<Format::q3_k><<<grid, threads, 0, stream>>>(ex, ro, slots, out, matrix);
            break;
        case Format::q4_k:
            dequant_rows_kernel<Format::q4_k><<<grid, threads, 0, stream>>>(ex, ro, slots, out, matrix);
            break;
        case Format::q5_k:
            dequant_rows_kernel<Format::q5_k><<<grid, threads, 0, stream>>>(ex, ro, slots, out, matrix);
            break;
        case Format::q6_k:
            dequant_rows_kernel<Format::q6_k><<<grid, threads, 0, stream>>>(ex, ro, slots, out, matrix);
            break;
        case Format::iq4_xs:
            dequant_rows_kernel<Format::iq4_xs><<<grid, threads, 0, stream>>>(ex, ro, slots, out, matrix);
            break;
        default:
            return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

}  // namespace

cudaError_t launch_dequant_bf16(const DeviceExperts &ex, const int32_t *slots, int32_t n, uint16_t *out,
                                cudaStream_t stream) {
    if (n < 0 || ex.format == Format::bf16 || !format_known(int32_t(ex.format))) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (!slots || !out || ex.hidden <= 0 || ex.inter <= 0 || ex.hidden % 8 || ex.inter % 8)
        return cudaErrorInvalidValue;
    const Roles ro = roles_of(ex.format);
    const Format f_dn = ex.down();
    // Only block formats mix per matrix.
    if (f_dn != ex.format && (!format_is_block(ex.format) || !format_is_block(f_dn))) return cudaErrorInvalidValue;
    if (ex.format == Format::mxfp4) {
        const int64_t tiles = ((2 * int64_t(ex.inter) + kMxTile - 1) / kMxTile) * ((ex.hidden + kMxTile - 1) / kMxTile);
        const int64_t tiles_dn = ((int64_t(ex.hidden) + kMxTile - 1) / kMxTile) * ((ex.inter + kMxTile - 1) / kMxTile);
        const dim3 grid(unsigned(std::max(tiles, tiles_dn)), 2, unsigned(n));
        if (n > 65535) return cudaErrorInvalidValue;
        dequant_mxfp4_kernel<<<grid, 256, 0, stream>>>(ex, ro, slots, out);
        return cudaGetLastError();
    }
    const int threads = 128;  // K / 8 units per row: 88 .. 896 at real shapes
    if (f_dn == ex.format) {
        if (2 * int64_t(n) > 65535) return cudaErrorInvalidValue;
        const dim3 grid(unsigned(std::max(2 * ex.inter, ex.hidden)), unsigned(2 * n));
        return launch_dequant_rows(ex.format, grid, threads, ex, ro, slots, out, -1, stream);
    }
    // A model mixing block formats: gate_up and down each by its own format's kernel.
    if (n > 65535) return cudaErrorInvalidValue;
    for (const Format f : {ex.format, f_dn})
        if (ex.hidden % format_block(f) != 0 || ex.inter % format_block(f) != 0) return cudaErrorInvalidValue;
    cudaError_t e = launch_dequant_rows(ex.format, dim3(unsigned(2 * ex.inter), unsigned(n)), threads, ex, ro, slots, out, 0, stream);
    if (e == cudaSuccess) e = launch_dequant_rows(f_dn, dim3(unsigned(ex.hidden), unsigned(n)), threads, ex, ro, slots, out, 1, stream);
    return e;
}

}  // namespace ft::cuda
