// EP unpack, reduce and combine on the device (ft/ep_cuda.hpp): unpack_payload into expert
// rows, reduce_partials per record and combine_at_source per token.
#include "ft/common.hpp"
#include "kernels_common.cuh"

namespace ft::ep::cuda {
namespace {

using namespace detail;

constexpr int kUnpackThreads = 128;

// Global loads that stay where they are written (asm volatile): the compiler sinks plain loads
// below a bound check that does not need them, back into the chain of dependent loads.
__device__ __forceinline__ int64_t load_early(const int64_t *p) {
    int64_t v;
    asm volatile("ld.global.s64 %0, [%1];" : "=l"(v) : "l"(__cvta_generic_to_global(p)));
    return v;
}
__device__ __forceinline__ int32_t load_early(const int32_t *p) {
    int32_t v;
    asm volatile("ld.global.s32 %0, [%1];" : "=r"(v) : "l"(__cvta_generic_to_global(p)));
    return v;
}

// unpack_payload(): e4m3 * scale in fp32 (or the bf16 values), per expert row.
__global__ void unpack_kernel(const int64_t *offset, int32_t S, int64_t max_rows, RecvGeom rg, RecordGeom g,
                              int64_t hidden, WireDtype dtype, const int64_t *row_position, const int32_t *row_route,
                              uint16_t *x_bf16, float *x_f32, int32_t *row_source, int32_t *row_token,
                              float *row_weight) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    const int64_t rows = offset[S];
    for (int64_t row = blockIdx.x; row < max_rows; row += gridDim.x) {
        // The row's position and route are read BEFORE its count is known, so the three loads go
        // out together: every row below max_rows lies in the buffers, and the values of a row at
        // or past the count are never used.
        const int64_t position = load_early(row_position + row);
        const int32_t route = load_early(row_route + row);
        if (row >= rows) break;
        const uint8_t *rec = record_at(rg, position);
        if (threadIdx.x == 0) {
            // The three metadata loads before the first store (a store could alias them).
            const int32_t source = *reinterpret_cast<const int16_t *>(rec + g.source);
            const int32_t token = *reinterpret_cast<const int32_t *>(rec + g.token);
            const float weight = *reinterpret_cast<const float *>(rec + g.weight + 4 * route);
            row_source[row] = source;
            row_token[row] = token;
            row_weight[row] = weight;
        }
        for (int64_t c4 = threadIdx.x; c4 < hidden / 4; c4 += blockDim.x) {
            float v[4];
            if (dtype == WireDtype::Bf16)
                load4(reinterpret_cast<const uint16_t *>(rec) + 4 * c4, v);
            else
                dequant4(reinterpret_cast<const uint32_t *>(rec)[c4], block_scale(rec + g.scales, c4 * 4 / kWireBlock, dtype),
                         v);
            if (x_bf16) store4(x_bf16 + row * hidden + 4 * c4, v);
            if (x_f32) reinterpret_cast<float4 *>(x_f32 + row * hidden)[c4] = make_float4(v[0], v[1], v[2], v[3]);
        }
    }
}

constexpr int kReduceThreads = 256;

// reduce_partials(): acc = fma(weight_j, y_j, acc) over the record's routes in order, four
// channels per thread (each channel's chain is the host's).
__global__ void reduce_kernel(const int64_t *count, const int64_t *prefix, int32_t R, RecvGeom rg, RecordGeom g,
                              int32_t K, int32_t c, int32_t C, int64_t hidden, const int32_t *route_row,
                              const uint16_t *y, uint16_t *partial) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    __shared__ ChunkTable tab;
    __shared__ float w[kMaxTopK];
    __shared__ int32_t yrow[kMaxTopK];
    __shared__ int32_t n;
    load_chunk_table(tab, count, prefix, R, c, C);
    const int64_t total = tab.vstart[R];
    for (int64_t v = blockIdx.x; v < total; v += gridDim.x) {
        int32_t s;
        const int64_t pos = position_of(tab, R, rg, v, s);
        const uint8_t *rec = record_at(rg, pos);
        if (threadIdx.x == 0) n = min(rec_n(rec, g), K);
        if (threadIdx.x < K) {
            w[threadIdx.x] = *reinterpret_cast<const float *>(rec + g.weight + 4 * threadIdx.x);
            yrow[threadIdx.x] = route_row[pos * K + threadIdx.x];
        }
        __syncthreads();
        for (int64_t h = 4 * threadIdx.x; h < hidden; h += 4 * blockDim.x) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, yv[4];
            for (int32_t j = 0; j < n; ++j) {
                if (yrow[j] < 0) continue;
                load4(y + int64_t(yrow[j]) * hidden + h, yv);
                for (int i = 0; i < 4; ++i) acc[i] = fmaf(w[j], yv[i], acc[i]);
            }
            store4(partial + pos * hidden + h, acc);
        }
        __syncthreads();
    }
}

// combine_at_source(): fp32 sum from 0 over ranks in ascending order, then bf16.
__global__ void combine_kernel(const int32_t *row, const int64_t *offset, int32_t R, int64_t tokens,
                               const uint16_t *partial, int64_t peer_rows, int64_t hidden, uint16_t *out) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    __shared__ int64_t base[kMaxRanks];
    for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
        for (int32_t r = threadIdx.x; r < R; r += blockDim.x) {
            const int32_t rr = row[int64_t(r) * tokens + t];
            base[r] = rr < 0 ? -1 : ((peer_rows ? r * peer_rows : offset[r]) + rr) * hidden;
        }
        __syncthreads();
        for (int64_t h = 4 * threadIdx.x; h < hidden; h += 4 * blockDim.x) {
            float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f}, pv[4];
            for (int32_t r = 0; r < R; ++r) {
                if (base[r] < 0) continue;
                load4(partial + base[r] + h, pv);
                for (int i = 0; i < 4; ++i) sum[i] = __fadd_rn(sum[i], pv[i]);
            }
            store4(out + t * hidden + h, sum);
        }
        __syncthreads();  // base is rewritten for the next token
    }
}

}  // namespace

void launch_unpack(const ReceiveBuffers &B, const RecvRegion &src, int64_t hidden, WireDtype dtype, uint16_t *x_bf16,
                   float *x_f32, cudaStream_t st) {
    const RecordGeom g = geom(hidden, B.top_k, dtype);
    if (B.max_rows > 0)
        launch_pdl(unpack_kernel, dim3(grid_for(B.max_rows, 1, 16384)), dim3(kUnpackThreads), 0, st, 
            B.expert_offset, B.slots, B.max_rows, recv_geom(src, g), g, hidden, dtype, B.row_position, B.row_route,
            x_bf16, x_f32, B.row_source, B.row_token, B.row_weight);
    check_launch("unpack kernel");
}

void launch_reduce(const ReceiveBuffers &B, const RecvRegion &src, int64_t hidden, WireDtype dtype, int32_t c,
                   int32_t C, const uint16_t *y, uint16_t *partial, cudaStream_t st) {
    if (C < 1 || c < 0 || c >= C) fail(FT_ERR_INVALID_ARGUMENT, "EP reduce: chunk ", c, " of ", C);
    const RecordGeom g = geom(hidden, B.top_k, dtype);
    if (B.max_positions > 0)
        launch_pdl(reduce_kernel, dim3(grid_for(B.max_positions, 1, 16384)), dim3(kReduceThreads), 0, st, 
            B.count, B.prefix, B.num_ranks, recv_geom(src, g), g, B.top_k, c, C, hidden, B.route_row, y, partial);
    check_launch("reduce kernel");
}

void launch_combine(const LayoutBuffers &L, int64_t tokens, const uint16_t *partial, int64_t peer_rows, int64_t hidden,
                    uint16_t *out, cudaStream_t st) {
    if (reinterpret_cast<uintptr_t>(out) % 8 || reinterpret_cast<uintptr_t>(partial) % 8)
        fail(FT_ERR_INVALID_ARGUMENT, "EP combine: output and partials must be 8-byte aligned");
    if (tokens > 0)
        launch_pdl(combine_kernel, dim3(grid_for(tokens, 1, 16384)), dim3(256), 0, st, L.row, L.offset, L.num_ranks, tokens, partial,
                                                                   peer_rows, hidden, out);
    check_launch("combine kernel");
}

}  // namespace ft::ep::cuda
