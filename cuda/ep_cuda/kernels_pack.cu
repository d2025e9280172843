// EP pack on the device (ft/ep_cuda.hpp): pack_dispatch's records (FP8 or bf16 payload, token,
// source, routes) written into each destination's region, and the region headers.
#include "ft/common.hpp"
#include "kernels_common.cuh"

namespace ft::ep::cuda {
namespace {

using namespace detail;

__global__ void pack_kernel(const int64_t *offset, int32_t R, const int32_t *send_token, const int32_t *send_n,
                            const int32_t *send_slot, const float *send_weight, int32_t K, const uint16_t *x,
                            int64_t hidden, WireDtype dtype, int32_t source_rank, uint8_t *base, size_t peer_bytes,
                            RecordGeom g, const int64_t *header_count) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    // Latency mode: block 0 also writes the per-peer headers (header_kernel's work, one launch
    // fewer at decode sizes). The grid has at least one block, whatever the row count.
    if (header_count && blockIdx.x == 0)
        for (int32_t r = threadIdx.x; r < R; r += blockDim.x) {
            int64_t *h = reinterpret_cast<int64_t *>(base + r * peer_bytes);
            h[0] = header_count[r];
            h[1] = 0;
        }
    const int64_t total = offset[R];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int64_t i = blockIdx.x; i < total; i += gridDim.x) {
        uint8_t *rec;
        if (peer_bytes == 0) {
            rec = base + i * g.bytes;
        } else {
            int32_t r = 0;
            while (r + 1 < R && offset[r + 1] <= i) ++r;
            rec = base + r * peer_bytes + kPeerHeaderBytes + (i - offset[r]) * g.bytes;
        }
        const uint16_t *xt = x + int64_t(send_token[i]) * hidden;
        const int64_t blocks = hidden / kWireBlock;
        if (dtype == WireDtype::Bf16) {
            // 8 bytes per thread, in order.
            for (int64_t c = threadIdx.x; c < hidden / 4; c += blockDim.x)
                reinterpret_cast<uint2 *>(rec)[c] = reinterpret_cast<const uint2 *>(xt)[c];
        } else {
            const size_t sb = dtype == WireDtype::Fp8Fp32 ? 4 : 1;
            float v[4];
            uint32_t word;
            for (int64_t b = warp; b < blocks; b += kPackThreads / 32)
                quantise_block(xt + b * kWireBlock, rec + b * kWireBlock, rec + g.scales + b * sb, dtype, lane, v,
                               word);
        }
        // Metadata, and zero in every padding byte (the host memsets the record first).
        const uint32_t scales_end = g.scales + g.scale_bytes;
        for (uint32_t at = scales_end + threadIdx.x; at < g.token; at += blockDim.x) rec[at] = 0;
        if (threadIdx.x == 0) {
            *reinterpret_cast<int32_t *>(rec + g.token) = send_token[i];
            *reinterpret_cast<int16_t *>(rec + g.source) = static_cast<int16_t>(source_rank);
            *reinterpret_cast<int16_t *>(rec + g.n) = static_cast<int16_t>(send_n[i]);
        }
        for (int32_t j = threadIdx.x; j < K; j += blockDim.x) {
            *reinterpret_cast<float *>(rec + g.weight + 4 * j) = send_weight[i * K + j];
            *reinterpret_cast<int16_t *>(rec + g.slot + 2 * j) = static_cast<int16_t>(send_slot[i * K + j]);
        }
        for (uint32_t at = g.slot + 2 * K + threadIdx.x; at < g.bytes; at += blockDim.x) rec[at] = 0;
    }
}

__global__ void header_kernel(const int64_t *count, int32_t R, uint8_t *base, size_t peer_bytes) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    const int r = threadIdx.x;
    if (r >= R) return;
    int64_t *h = reinterpret_cast<int64_t *>(base + r * peer_bytes);
    h[0] = count[r];
    h[1] = 0;
}

}  // namespace

void launch_pack(const LayoutBuffers &L, int64_t max_rows, const uint16_t *x, int64_t hidden, WireDtype dtype,
                 int32_t source_rank, const WireRegion &dst, cudaStream_t st) {
    const RecordGeom g = geom(hidden, L.top_k, dtype);
    if (reinterpret_cast<uintptr_t>(x) % 8 || reinterpret_cast<uintptr_t>(dst.base) % 16 || dst.peer_bytes % 16)
        fail(FT_ERR_INVALID_ARGUMENT, "EP pack: x must be 8-byte and the wire buffer 16-byte aligned");
    // Latency mode: pack_kernel's block 0 writes the headers unless there is no pack kernel.
    const bool fused_header = dst.peer_bytes && max_rows > 0;
    if (dst.peer_bytes && !fused_header)
        launch_pdl(header_kernel, dim3(1), dim3(kMaxRanks), 0, st, L.count, L.num_ranks, dst.base, dst.peer_bytes);
    if (max_rows > 0)
        launch_pdl(pack_kernel, dim3(grid_for(max_rows, 1, 16384)), dim3(kPackThreads), 0, st, 
            L.offset, L.num_ranks, L.send_token, L.send_n, L.send_slot, L.send_weight, L.top_k, x, hidden, dtype,
            source_rank, dst.base, dst.peer_bytes, g, fused_header ? static_cast<const int64_t *>(L.count) : nullptr);
    check_launch("pack kernel");
}

}  // namespace ft::ep::cuda
