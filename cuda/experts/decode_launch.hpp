// The host side of the decode kernels (decode.cpp and the kernel files decode_*.cu):
// launch constants, the projection and grouping arguments, and the launchers each kernel file
// exports. Private to ft_cuda_experts; plain C++ (no device code).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ft/cuda_activation.hpp"
#include "ft/formats.hpp"

namespace ft::cuda::decode {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRouteChunk = 4;  // routes whose accumulators live in registers at once
constexpr int kMaxGridY = 65535;
constexpr int kGroupThreads = 512;
constexpr int kMmaRoutes = 8;  // the n side of m16n8k16 (decode_mma.cu)
constexpr int kMxMmaCols = 64;  // output columns of one mxfp4 CTA (decode_mxfp4.cu)

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
    int32_t tokens;       // of the call
    int32_t sms;          // multiprocessors of the device (ExpertDecoder's, sizes the grids)
    const uint16_t *act;  // gate_up: [T, K] by token; down: [R, K] by route
    bool act_by_token;
    uint16_t *inter_out;  // gate_up: [R, I]
    float *route_out;     // down: [R, N]
    DeviceActivation activation;
    bool ds_fp4, ds_clamp;
    // bf16 biases (bf16 gpt-oss; nullptr: none): this projection's f32 table [bias_experts, N],
    // indexed by the expert id bias_ids[route] of each route.
    const float *bias;
    const int32_t *bias_ids;
    int32_t bias_experts;
    // Integer-dot kernel only, set by its launcher (decode_dp4a.cu): units (row pairs) per warp,
    // lanes per unit, and whether each CTA copies its rows into shared memory first.
    int32_t units_per_warp;
    int32_t unit_lanes;  // lanes per unit (8, 16 or 32): a warp serves 32 / unit_lanes units at once
    bool stage_rows;
};

// A launch's own error, else the last one pending (and cleared), as a checked launch returns.
inline cudaError_t launched(cudaError_t e) {
    const cudaError_t last = cudaGetLastError();
    return e != cudaSuccess ? e : last;
}

// ---- launchers (each waits for its predecessor: launch_pdl) ------------------------------------

// CUDA-core kernel (decode_simt.cu): bf16 rows whose length is not a multiple of 8, and the GGUF
// block formats (format_is_block; decoded with gguf_dequant8, ft/cuda_gguf.cuh);
// cudaErrorInvalidValue for another format. The GGUF block formats go to the integer-dot kernel
// where dp4a_usable(p).
cudaError_t launch_simt_projection(Format f, bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s);
// Integer-dot kernel of the GGUF block formats (decode_dp4a.cu): activations quantised to int8
// per 32 in shared memory, __dp4a dots; usable where rows are 2-byte aligned and the activations
// of kRouteChunk routes fit 48 KiB of shared memory (K <= 8928).
bool dp4a_usable(const ProjArgs &p);
bool dp4a_fits(int32_t K);  // the shared-memory part of dp4a_usable
cudaError_t launch_dp4a_projection(Format f, bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s);
// Tensor-core kernel of a row-major format: bf16, fp8_block, nvfp4, ds_fp4 (decode_mma.cu);
// cudaErrorInvalidValue for another format.
cudaError_t launch_mma_projection(Format f, bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s);
// Tensor-core kernel of mxfp4's transposed banks (decode_mxfp4.cu).
cudaError_t launch_mxfp4_projection(bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s);

struct GroupScratch {
    int32_t *num, *slot, *start, *count, *routes;  // the groups, read by the expert kernels
    int32_t *entry, *rank;                         // per route: table entry, position in group
    int32_t *key, *cnt, *grp;                      // hash table: slot, routes, group index
    int32_t table_bits;
};

// Block 0 groups the routes by slot into g; `blocks` more blocks stage x into xin (mode 0: none,
// 1: copy, 2: ds_fp4's FP8 round trip per 128) (decode_group.cu).
cudaError_t launch_prep(int blocks, const int32_t *slots, int R, const GroupScratch &g, const uint16_t *x,
                        uint16_t *xin, int64_t elems, int mode, cudaStream_t s);
// ds_fp4: the intermediate [R, I] of every valid route FP8-round-tripped per 128 in place.
cudaError_t launch_inter_round_trip(const int32_t *slots, uint16_t *inter, int64_t R, int32_t I, cudaStream_t s);

}  // namespace ft::cuda::decode
