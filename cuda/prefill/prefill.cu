// GPU prefill of the routed experts: host-planned grouping of routes by expert slot, gather of
// the tokens' rows, bf16 dequantisation of each expert once, cuBLAS GEMMs (fp32 accumulate) with
// our own epilogues, scatter into per-route rows and launch_combine_routes (see
// ft/cuda_prefill.hpp for the interface and the numerics).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ft/common.hpp"
#include "ft/cublas_loader.hpp"
#include "ft/cuda_numerics.cuh"
#include "ft/cuda_prefill.hpp"
#include "ft/dequant.hpp"
#include "plan.hpp"

namespace ft::cuda {
namespace {

constexpr int kStreams = 4;                           // internal streams of the "streams" GEMM path
constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // per cuBLAS handle (Hopper's recommendation)
constexpr int kDefaultChunkRows = 8192;

// Where each format keeps its matrices in the bank schema (-1: none); the CPU executor's table.
struct Roles {
    int gu, gu_scale, gu_global, gu_bias, dn, dn_scale, dn_global, dn_bias;
};

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
            return {0, -1, -1, -1, 1, -1, -1, -1};  // bf16, q4_0
    }
}

void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) fail(FT_ERR_DEVICE, "GPU prefill: ", what, ": ", cudaGetErrorString(e));
}

void check_blas(cublasStatus_t s, const char *what) {
    if (s != CUBLAS_STATUS_SUCCESS) fail(FT_ERR_DEVICE, "GPU prefill: ", what, ": ", cublas_status_name(s));
}

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

// Row-major formats (fp8_block, nvfp4, ds_fp4, q4_0): one block per output row (blockIdx.x)
// of one matrix (blockIdx.y = 2 * expert + (0 gate_up | 1 down)); each thread makes 8
// consecutive bf16 outputs per step, so a warp reads 128 (fp4) or 256 (fp8) contiguous bytes.
template <Format F>
__global__ void dequant_rows_kernel(DeviceExperts ex, Roles ro, const int32_t *slots, uint16_t *out) {
    const int32_t H = ex.hidden, I = ex.inter;
    const int32_t j = int32_t(blockIdx.y >> 1);
    const bool down = (blockIdx.y & 1) != 0;
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
        } else {  // q4_0: 8 elements of one 32-block: low (jj < 16) or high nibbles of qs[jj & 15 ..]
            const uint8_t *blk = data + (int64_t(row) * (K / kQ4_0Block) + k0 / kQ4_0Block) * kQ4_0BlockBytes;
            const float d = f16_to_f32(load_u16(blk));
            const int jj = k0 % kQ4_0Block;
            const uint8_t *qs = blk + 2 + (jj & 15);
            const int shift = jj < 16 ? 0 : 4;
#pragma unroll
            for (int e = 0; e < 8; ++e) vals[e] = float(int((qs[e] >> shift) & 15u) - 8) * d;
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
        default:  // bf16, fp8_block, q4_0: no per-row factor, no bias
            return launch_epilogue_scatter<Format::bf16>(scatter, acc, rt, rs, ex, ro, act, ds_clamp, inter, route_out,
                                                         rows, s);
    }
}

size_t align_up(size_t v, size_t a) {
    return (v + a - 1) / a * a;
}

}  // namespace

cudaError_t launch_dequant_bf16(const DeviceExperts &ex, const int32_t *slots, int32_t n, uint16_t *out,
                                cudaStream_t stream) {
    if (n < 0 || ex.format == Format::bf16 || !format_known(int32_t(ex.format))) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (!slots || !out || ex.hidden <= 0 || ex.inter <= 0 || ex.hidden % 8 || ex.inter % 8)
        return cudaErrorInvalidValue;
    const Roles ro = roles_of(ex.format);
    if (ex.format == Format::mxfp4) {
        const int64_t tiles = ((2 * int64_t(ex.inter) + kMxTile - 1) / kMxTile) * ((ex.hidden + kMxTile - 1) / kMxTile);
        const int64_t tiles_dn = ((int64_t(ex.hidden) + kMxTile - 1) / kMxTile) * ((ex.inter + kMxTile - 1) / kMxTile);
        const dim3 grid(unsigned(std::max(tiles, tiles_dn)), 2, unsigned(n));
        if (n > 65535) return cudaErrorInvalidValue;
        dequant_mxfp4_kernel<<<grid, 256, 0, stream>>>(ex, ro, slots, out);
        return cudaGetLastError();
    }
    if (2 * int64_t(n) > 65535) return cudaErrorInvalidValue;
    const dim3 grid(unsigned(std::max(2 * ex.inter, ex.hidden)), unsigned(2 * n));
    const int threads = 128;  // K / 8 units per row: 88 .. 896 at real shapes
    switch (ex.format) {
        case Format::fp8_block:
            dequant_rows_kernel<Format::fp8_block><<<grid, threads, 0, stream>>>(ex, ro, slots, out);
            break;
        case Format::nvfp4:
            dequant_rows_kernel<Format::nvfp4><<<grid, threads, 0, stream>>>(ex, ro, slots, out);
            break;
        case Format::ds_fp4:
            dequant_rows_kernel<Format::ds_fp4><<<grid, threads, 0, stream>>>(ex, ro, slots, out);
            break;
        case Format::q4_0:
            dequant_rows_kernel<Format::q4_0><<<grid, threads, 0, stream>>>(ex, ro, slots, out);
            break;
        default:
            return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

// ---- ExpertPrefill --------------------------------------------------------------------------

struct ExpertPrefill::Impl {
    using Piece = prefill::Piece;
    using Chunk = prefill::Chunk;

    Format format;
    int32_t H, I, K, max_tokens;
    DeviceActivation act;
    bool ds_clamp = false;
    bool quant = false;
    Roles ro{};
    std::vector<size_t> bank_bytes;
    int32_t chunk_rows = 0, chunk_experts = 0;
    int64_t max_pieces = 0;
    bool grouped = false;
    const CublasApi *blas = nullptr;
    std::string error;
    size_t device_bytes = 0;

    // Device memory.
    uint16_t *xg = nullptr;      // [chunk_rows, H] gathered (ds_fp4: round-tripped) inputs
    float *acc = nullptr;        // [chunk_rows, max(2I, H)] GEMM outputs
    uint16_t *inter = nullptr;   // [chunk_rows, I]
    float *route_out = nullptr;  // [max_tokens * K, H]
    // Two dequantisation buffers [chunk_experts, 3 H I] (quantised formats): chunk c uses c % 2,
    // so the dequantisation of chunk c + 1 (on dq_stream) overlaps the GEMMs of chunk c.
    uint16_t *deq[2] = {};
    void *workspace = nullptr;  // (kStreams + 1) cuBLAS workspaces
    uint8_t *plan_dev = nullptr;
    uint8_t *plan_host = nullptr;  // pinned staging of the plan
    size_t plan_bytes = 0;

    cudaStream_t streams[kStreams] = {};
    cudaStream_t dq_stream = nullptr;
    cudaEvent_t ev_ready[2] = {}, ev_free[2] = {};  // dequantised buffer b written / no longer read
    cublasHandle_t handles[kStreams + 1] = {};      // [kStreams]: the caller's stream (grouped path)
    cudaEvent_t ev_fork = nullptr, ev_join[kStreams] = {}, ev_upload = nullptr;

    prefill::Plan plan;  // per run (host)
    // Grouped path: per-piece host arrays (cuBLAS reads them on the host).
    std::vector<cublasOperation_t> op_t, op_n;
    std::vector<int> gm, gn, gk, glda, gldb, gldc, gsize;
    std::vector<float> alpha, beta;

    ~Impl() { release(); }

    void release() noexcept {
        for (int i = 0; i < kStreams; ++i)
            if (streams[i]) cudaStreamSynchronize(streams[i]);
        if (dq_stream) cudaStreamSynchronize(dq_stream), cudaStreamDestroy(dq_stream), dq_stream = nullptr;
        for (int b = 0; b < 2; ++b) {
            if (ev_ready[b]) cudaEventDestroy(ev_ready[b]), ev_ready[b] = nullptr;
            if (ev_free[b]) cudaEventDestroy(ev_free[b]), ev_free[b] = nullptr;
        }
        if (blas)
            for (cublasHandle_t &h : handles)
                if (h) blas->destroy(h), h = nullptr;
        for (int i = 0; i < kStreams; ++i) {
            if (streams[i]) cudaStreamDestroy(streams[i]), streams[i] = nullptr;
            if (ev_join[i]) cudaEventDestroy(ev_join[i]), ev_join[i] = nullptr;
        }
        if (ev_fork) cudaEventDestroy(ev_fork), ev_fork = nullptr;
        if (ev_upload) cudaEventSynchronize(ev_upload), cudaEventDestroy(ev_upload), ev_upload = nullptr;
        for (void *p : {(void *)xg, (void *)acc, (void *)inter, (void *)route_out, (void *)deq[0], (void *)deq[1],
                        workspace, (void *)plan_dev})
            if (p) cudaFree(p);
        xg = nullptr, acc = nullptr, inter = nullptr, route_out = nullptr, workspace = nullptr;
        deq[0] = deq[1] = nullptr;
        plan_dev = nullptr;
        if (plan_host) cudaFreeHost(plan_host), plan_host = nullptr;
    }

    template <typename T>
    void alloc(T *&p, size_t bytes, const char *what) {
        if (bytes == 0) return;
        void *q = nullptr;
        const cudaError_t e = cudaMalloc(&q, bytes);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            fail(FT_ERR_OUT_OF_MEMORY, "GPU prefill: cannot allocate ", bytes, " bytes of device memory for ", what);
        }
        check(e, what);
        p = static_cast<T *>(q);
        device_bytes += bytes;
    }

    void gemm(cublasHandle_t h, int m, int n, int k, const uint16_t *A, int lda, const uint16_t *B, int ldb, float *C,
              int ldc) {
        // Row-major C[n, m] = B[n, k] * A[m, k]^T, i.e. column-major C = op_T(A) * B.
        const float one = 1.0f, zero = 0.0f;
        check_blas(blas->gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb,
                                 &zero, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    }
};

PrefillTuning prefill_tuning(const Tuning &t) {
    PrefillTuning p;
    p.grouped = t.prefill_gemm == "grouped";
    p.dequant_mib = t.prefill_dequant_mib;
    p.chunk_rows = t.prefill_chunk_rows;
    return p;
}

ExpertPrefill::ExpertPrefill(Format format, int32_t hidden, int32_t inter, int32_t top_k, int32_t max_tokens,
                             DeviceActivation act, PrefillTuning tuning)
    : p_(std::make_unique<Impl>()) {
    Impl &s = *p_;
    if (!format_known(int32_t(format))) fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: unknown format ", int32_t(format));
    if (hidden <= 0 || inter <= 0 || hidden % 8 || inter % 8)
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: hidden (", hidden, ") and intermediate (", inter,
             ") sizes must be positive multiples of 8");
    if (const std::string err = format_geometry_error(format, hidden, inter); !err.empty())
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: ", err);
    if (top_k <= 0 || top_k > 1024)
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: top_k must be in [1, 1024], got ", top_k);
    if (max_tokens <= 0 || int64_t(max_tokens) * top_k > INT_MAX / 2)
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: max_tokens ", max_tokens, " x top_k ", top_k, " out of range");
    if (act.kind < FT_ACT_SILU || act.kind > FT_ACT_SWIGLU_CLAMP)
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: unknown activation ", act.kind);
    s.blas = cublas_api();
    if (!s.blas) fail(FT_ERR_UNSUPPORTED, "GPU prefill needs cuBLAS: ", cublas_load_error());

    s.format = format;
    s.H = hidden, s.I = inter, s.K = top_k, s.max_tokens = max_tokens;
    s.act = act;
    s.quant = format != Format::bf16;
    s.ds_clamp = format == Format::ds_fp4 && act.kind == FT_ACT_SILU && std::isfinite(act.limit) && act.limit > 0.0f;
    s.ro = roles_of(format);
    for (const BankSpec &b : bank_schema(format, hidden, inter)) s.bank_bytes.push_back(b.row_bytes);

    const int64_t routes = int64_t(max_tokens) * top_k;
    int rows = tuning.chunk_rows;
    if (rows <= 0) rows = int(std::max<int64_t>(max_tokens, std::min<int64_t>(routes, kDefaultChunkRows)));
    s.chunk_rows = int32_t(std::min<int64_t>(rows, routes));
    const size_t expert_bf16 = size_t(3) * hidden * inter * 2;
    if (s.quant) {
        const size_t budget = size_t(std::max(0, tuning.dequant_mib)) << 20;
        s.chunk_experts =
            int32_t(std::clamp<int64_t>(int64_t(budget / 2 / expert_bf16), 1, std::min<int64_t>(routes, 512)));
    } else {
        s.chunk_experts = INT_MAX;
    }
    // Each distinct slot gives ceil(rows / chunk_rows) pieces: at most routes + routes / chunk_rows.
    s.max_pieces = routes + routes / s.chunk_rows + 1;
    s.grouped = tuning.grouped && s.blas->gemm_grouped_batched_ex;

    try {
        s.plan.keys.reserve(routes);
        for (auto *v : {&s.plan.row_token, &s.plan.row_route, &s.plan.row_slot}) v->reserve(routes);
        s.plan.pieces.reserve(s.max_pieces);
        s.plan.chunks.reserve(s.max_pieces);
        s.plan.chunk_slots.reserve(s.max_pieces);
        if (s.grouped) {
            s.op_t.assign(s.max_pieces, CUBLAS_OP_T);
            s.op_n.assign(s.max_pieces, CUBLAS_OP_N);
            for (auto *v : {&s.gm, &s.gn, &s.gk, &s.glda, &s.gldb, &s.gldc}) v->resize(s.max_pieces);
            s.gsize.assign(s.max_pieces, 1);
            s.alpha.assign(s.max_pieces, 1.0f);
            s.beta.assign(s.max_pieces, 0.0f);
        }
    } catch (const std::bad_alloc &) {
        fail(FT_ERR_OUT_OF_MEMORY, "GPU prefill: cannot allocate the host plan for ", routes, " routes");
    }

    const size_t R = size_t(s.chunk_rows);
    s.alloc(s.xg, R * hidden * 2, "gathered activations");
    s.alloc(s.acc, R * std::max<size_t>(2 * size_t(inter), hidden) * 4, "GEMM output");
    s.alloc(s.inter, R * inter * 2, "intermediate");
    s.alloc(s.route_out, size_t(routes) * hidden * 4, "route outputs");
    if (s.quant)
        for (uint16_t *&d : s.deq) s.alloc(d, size_t(s.chunk_experts) * expert_bf16, "dequantised experts");
    s.alloc(s.workspace, (kStreams + 1) * kWorkspaceBytes, "cuBLAS workspaces");
    // Plan: row_token, row_route, row_slot [routes] + chunk slots [max_pieces] (int32), then six
    // pointer arrays [max_pieces] for the grouped path.
    s.plan_bytes = align_up((3 * size_t(routes) + size_t(s.max_pieces)) * 4, 16) +
                   (s.grouped ? 6 * size_t(s.max_pieces) * sizeof(void *) : 0);
    s.alloc(s.plan_dev, s.plan_bytes, "routing plan");
    {
        void *h = nullptr;
        const cudaError_t e = cudaMallocHost(&h, s.plan_bytes);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            fail(FT_ERR_OUT_OF_MEMORY, "GPU prefill: cannot allocate ", s.plan_bytes, " bytes of pinned memory");
        }
        check(e, "cudaMallocHost");
        s.plan_host = static_cast<uint8_t *>(h);
    }
    check(cudaEventCreateWithFlags(&s.ev_fork, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&s.ev_upload, cudaEventDisableTiming), "cudaEventCreate");
    if (s.quant) {
        check(cudaStreamCreateWithFlags(&s.dq_stream, cudaStreamNonBlocking), "cudaStreamCreate");
        for (int b = 0; b < 2; ++b) {
            check(cudaEventCreateWithFlags(&s.ev_ready[b], cudaEventDisableTiming), "cudaEventCreate");
            check(cudaEventCreateWithFlags(&s.ev_free[b], cudaEventDisableTiming), "cudaEventCreate");
        }
    }
    for (int i = 0; i < kStreams; ++i) {
        check(cudaStreamCreateWithFlags(&s.streams[i], cudaStreamNonBlocking), "cudaStreamCreate");
        check(cudaEventCreateWithFlags(&s.ev_join[i], cudaEventDisableTiming), "cudaEventCreate");
    }
    for (int i = 0; i <= kStreams; ++i) {
        check_blas(s.blas->create(&s.handles[i]), "cublasCreate");
        check_blas(s.blas->set_math_mode(s.handles[i], CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
        if (i < kStreams) check_blas(s.blas->set_stream(s.handles[i], s.streams[i]), "cublasSetStream");
        // A handle's workspace must not be shared by kernels that can run at once: one each.
        if (s.blas->set_workspace)
            check_blas(s.blas->set_workspace(s.handles[i], static_cast<uint8_t *>(s.workspace) + i * kWorkspaceBytes,
                                             kWorkspaceBytes),
                       "cublasSetWorkspace");
    }
}

ExpertPrefill::~ExpertPrefill() = default;

const char *ExpertPrefill::last_error() const {
    return p_->error.c_str();
}
size_t ExpertPrefill::scratch_bytes() const {
    return p_->device_bytes;
}
const char *ExpertPrefill::gemm_path() const {
    return p_->grouped ? "grouped" : "streams";
}

ft_status ExpertPrefill::run(const DeviceExperts &ex, const uint16_t *x, const int32_t *slots_dev,
                             const int32_t *slots_host, const float *w, const uint16_t *addend, uint16_t *y,
                             int32_t tokens, cudaStream_t stream) {
    Impl &s = *p_;
    s.error.clear();
    try {
        if (tokens < 0 || tokens > s.max_tokens)
            fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: tokens ", tokens, " outside [0, ", s.max_tokens, "]");
        if (tokens == 0) return FT_OK;
        if (!x || !slots_dev || !slots_host || !w || !y)
            fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: NULL x, slots, weights or output");
        if (ex.format != s.format || ex.hidden != s.H || ex.inter != s.I)
            fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: experts are ", format_name(ex.format), " H=", ex.hidden,
                 " I=", ex.inter, ", the prefill was made for ", format_name(s.format), " H=", s.H, " I=", s.I);
        if (ex.num_banks != int(s.bank_bytes.size()))
            fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: ", ex.num_banks, " banks, ", format_name(s.format), " has ",
                 s.bank_bytes.size());
        for (int b = 0; b < ex.num_banks; ++b)
            if (!ex.base[b] || ex.row_bytes[b] < s.bank_bytes[b])
                fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: bank ", b, " has no base or rows of ", ex.row_bytes[b],
                     " bytes (< ", s.bank_bytes[b], ")");

        const int64_t H = s.H, I = s.I, K = s.K, T = tokens;
        // ---- plan on the host: sort valid routes by (slot, route), cut into pieces and chunks.
        // The pinned staging is reused: wait until the previous run's upload has been read.
        check(cudaEventSynchronize(s.ev_upload), "waiting for the previous plan upload");
        prefill::Plan &pl = s.plan;
        pl.build(slots_host, T * K, s.K, s.chunk_rows, s.chunk_experts);
        const int64_t nvalid = pl.rows();
        int32_t *row_token = reinterpret_cast<int32_t *>(s.plan_host);
        std::copy(pl.row_token.begin(), pl.row_token.end(), row_token);
        std::copy(pl.row_route.begin(), pl.row_route.end(), row_token + nvalid);
        std::copy(pl.row_slot.begin(), pl.row_slot.end(), row_token + 2 * nvalid);
        const int64_t npieces = int64_t(pl.pieces.size());
        std::copy(pl.chunk_slots.begin(), pl.chunk_slots.end(), row_token + 3 * nvalid);
        size_t used = (3 * size_t(nvalid) + pl.chunk_slots.size()) * 4;
        const int32_t *d_row_token = reinterpret_cast<const int32_t *>(s.plan_dev);
        const int32_t *d_row_route = d_row_token + nvalid;
        const int32_t *d_row_slot = d_row_route + nvalid;
        const int32_t *d_cslots = d_row_slot + nvalid;

        // Operands of every piece's two GEMMs (A: weights, B: activations, C: fp32 output).
        const size_t expert_elems = size_t(3) * H * I;
        auto operands = [&](const prefill::Piece &pc, const prefill::Chunk &c, size_t ci, bool down, const void *&A,
                            const void *&B, void *&C) {
            const int64_t lr = pc.row0 - c.row0;  // first row within the chunk
            if (s.quant) {
                A = s.deq[ci & 1] + size_t(pc.dq) * expert_elems + (down ? size_t(2) * I * H : 0);
            } else {
                const int bank = down ? s.ro.dn : s.ro.gu;
                A = ex.base[bank] + size_t(pc.slot) * ex.row_bytes[bank];
            }
            B = down ? static_cast<const void *>(s.inter + lr * I) : static_cast<const void *>(s.xg + lr * H);
            C = s.acc + lr * (down ? H : 2 * I);
        };
        void **ptrs = nullptr;
        void *const *d_ptrs = nullptr;
        if (s.grouped && npieces > 0) {
            used = align_up(used, 16);
            ptrs = reinterpret_cast<void **>(s.plan_host + used);
            d_ptrs = reinterpret_cast<void *const *>(s.plan_dev + used);
            for (size_t ci = 0; ci < pl.chunks.size(); ++ci)
                for (int32_t q = pl.chunks[ci].piece0; q < pl.chunks[ci].piece0 + pl.chunks[ci].pieces; ++q)
                    for (int d = 0; d < 2; ++d) {
                        const void *A, *B;
                        void *C;
                        operands(pl.pieces[q], pl.chunks[ci], ci, d == 1, A, B, C);
                        ptrs[(3 * d + 0) * npieces + q] = const_cast<void *>(A);
                        ptrs[(3 * d + 1) * npieces + q] = const_cast<void *>(B);
                        ptrs[(3 * d + 2) * npieces + q] = C;
                    }
            used += 6 * size_t(npieces) * sizeof(void *);
        }
        if (used > 0) {
            check(cudaMemcpyAsync(s.plan_dev, s.plan_host, used, cudaMemcpyHostToDevice, stream), "plan upload");
            check(cudaEventRecord(s.ev_upload, stream), "cudaEventRecord");
        }

        // ---- per chunk: gather, dequantise, GEMM gate_up, epilogue, GEMM down, scatter.
        const bool vec_x = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
        const bool ds = s.format == Format::ds_fp4;
        if (s.grouped) check_blas(s.blas->set_stream(s.handles[kStreams], stream), "cublasSetStream");
        // Dequantisation of chunk ci into buffer ci % 2 on dq_stream, once the GEMMs that read the
        // buffer before (chunk ci - 2, possibly of the previous run) are done.
        auto enqueue_dequant = [&](size_t ci) {
            const prefill::Chunk &c = pl.chunks[ci];
            const int b = int(ci & 1);
            check(cudaStreamWaitEvent(s.dq_stream, s.ev_free[b], 0), "cudaStreamWaitEvent");
            check(launch_dequant_bf16(ex, d_cslots + c.slot0, c.nslots, s.deq[b], s.dq_stream), "dequant kernel");
            check(cudaEventRecord(s.ev_ready[b], s.dq_stream), "cudaEventRecord");
        };
        if (s.quant && !pl.chunks.empty()) {
            check(cudaStreamWaitEvent(s.dq_stream, s.ev_upload, 0), "cudaStreamWaitEvent");  // chunk slot lists
            for (size_t ci = 0; ci < std::min<size_t>(2, pl.chunks.size()); ++ci) enqueue_dequant(ci);
        }
        for (size_t ci = 0; ci < pl.chunks.size(); ++ci) {
            const prefill::Chunk &c = pl.chunks[ci];
            if (ds)
                vec_x ? gather_rows_kernel<true, true><<<c.rows, 256, 0, stream>>>(x, d_row_token + c.row0, s.H, s.xg)
                      : gather_rows_kernel<true, false><<<c.rows, 256, 0, stream>>>(x, d_row_token + c.row0, s.H, s.xg);
            else
                vec_x
                    ? gather_rows_kernel<false, true><<<c.rows, 256, 0, stream>>>(x, d_row_token + c.row0, s.H, s.xg)
                    : gather_rows_kernel<false, false><<<c.rows, 256, 0, stream>>>(x, d_row_token + c.row0, s.H, s.xg);
            check(cudaGetLastError(), "gather kernel");
            if (s.quant) check(cudaStreamWaitEvent(stream, s.ev_ready[ci & 1], 0), "cudaStreamWaitEvent");

            for (int d = 0; d < 2; ++d) {
                const bool down = d == 1;
                const int m = int(down ? H : 2 * I), k = int(down ? I : H);
                bool done = false;
                if (s.grouped) {
                    for (int32_t q = 0; q < c.pieces; ++q) {
                        s.gm[q] = m, s.gn[q] = pl.pieces[c.piece0 + q].rows, s.gk[q] = k;
                        s.glda[q] = k, s.gldb[q] = k, s.gldc[q] = m;
                    }
                    const void *const *A = const_cast<const void *const *>(d_ptrs + (3 * d + 0) * npieces + c.piece0);
                    const void *const *B = const_cast<const void *const *>(d_ptrs + (3 * d + 1) * npieces + c.piece0);
                    void *const *C = d_ptrs + (3 * d + 2) * npieces + c.piece0;
                    const cublasStatus_t st = s.blas->gemm_grouped_batched_ex(
                        s.handles[kStreams], s.op_t.data(), s.op_n.data(), s.gm.data(), s.gn.data(), s.gk.data(),
                        s.alpha.data(), A, CUDA_R_16BF, s.glda.data(), B, CUDA_R_16BF, s.gldb.data(), s.beta.data(), C,
                        CUDA_R_32F, s.gldc.data(), c.pieces, s.gsize.data(), CUBLAS_COMPUTE_32F);
                    if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
                        // This cuBLAS has the entry point but not bf16 -> fp32: the streams path from now on.
                        log(FT_LOG_WARN,
                            "GPU prefill: cublasGemmGroupedBatchedEx does not take bf16 x bf16 -> "
                            "fp32 here; using one GEMM per expert");
                        s.grouped = false;
                    } else {
                        check_blas(st, "cublasGemmGroupedBatchedEx");
                        done = true;
                    }
                }
                if (!done) {
                    // Fork the chunk's GEMMs over the internal streams, then join them back.
                    const int used_streams = std::min(kStreams, c.pieces);
                    check(cudaEventRecord(s.ev_fork, stream), "cudaEventRecord");
                    for (int i = 0; i < used_streams; ++i)
                        check(cudaStreamWaitEvent(s.streams[i], s.ev_fork, 0), "cudaStreamWaitEvent");
                    for (int32_t q = 0; q < c.pieces; ++q) {
                        const prefill::Piece &pc = pl.pieces[c.piece0 + q];
                        const void *A, *B;
                        void *C;
                        operands(pc, c, ci, down, A, B, C);
                        s.gemm(s.handles[q % used_streams], m, pc.rows, k, static_cast<const uint16_t *>(A), k,
                               static_cast<const uint16_t *>(B), k, static_cast<float *>(C), m);
                    }
                    for (int i = 0; i < used_streams; ++i) {
                        check(cudaEventRecord(s.ev_join[i], s.streams[i]), "cudaEventRecord");
                        check(cudaStreamWaitEvent(stream, s.ev_join[i], 0), "cudaStreamWaitEvent");
                    }
                }
                if (down && s.quant) {
                    // The chunk's weights are consumed: their buffer takes chunk ci + 2.
                    check(cudaEventRecord(s.ev_free[ci & 1], stream), "cudaEventRecord");
                    if (ci + 2 < pl.chunks.size()) enqueue_dequant(ci + 2);
                }
                launch_format(s.format, down, s.acc, d_row_route + c.row0, d_row_slot + c.row0, ex, s.ro, s.act,
                              s.ds_clamp, s.inter, s.route_out, c.rows, stream);
                check(cudaGetLastError(), down ? "scatter kernel" : "epilogue kernel");
            }
        }
        check(launch_combine_routes(s.route_out, slots_dev, w, addend, y, tokens, s.K, s.H, ds, stream),
              "launch_combine_routes");
        return FT_OK;
    } catch (const Error &e) {
        s.error = e.what();
        return e.status();
    } catch (const std::bad_alloc &) {
        s.error = "GPU prefill: out of host memory";
        return FT_ERR_OUT_OF_MEMORY;
    } catch (const std::exception &e) {
        s.error = cat("GPU prefill: ", e.what());
        return FT_ERR_INTERNAL;
    }
}

}  // namespace ft::cuda
