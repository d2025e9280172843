// Shared by the EP GPU test, the multi-GPU program and the benchmark: the toy expert that mixes
// channels (y[h] = bf16(a_e x[h] + b_e x[h+1 mod H]), the host test's expert), its host twin with
// the same roundings, and small CUDA helpers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_array.hpp"
#include "ft/common.hpp"
#include "ft/ep_cuda.hpp"

namespace ft::test {

// Host twin: each product and the sum rounded once (volatile stops a contraction into fma).
inline uint16_t toy_expert_host(float a, float b, float x0, float x1) {
    volatile float p = a * x0;
    volatile float q = b * x1;
    volatile float s = p + q;
    return ft::f32_to_bf16(s);
}

// One block per expert row; the slot from the batch's offsets, the logical expert from phy2log.
// Internal linkage: several test translation units include this header.
static __global__ void toy_expert_kernel(ep::cuda::ExpertBatch b, const int32_t *phy2log_rank, const float *a, const float *bb) {
    const int64_t rows = min(b.offset[b.slots], b.max_rows);
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int32_t slot = 0;
        while (slot + 1 < b.slots && b.offset[slot + 1] <= row) ++slot;
        const int32_t e = phy2log_rank[slot];
        const float ae = a[e], be = bb[e];
        const uint16_t *x = b.x + row * b.hidden;
        for (int64_t h = threadIdx.x; h < b.hidden; h += blockDim.x) {
            const float x0 = __uint_as_float(uint32_t(x[h]) << 16);
            const float x1 = __uint_as_float(uint32_t(x[(h + 1) % b.hidden]) << 16);
            const float s = __fadd_rn(__fmul_rn(ae, x0), __fmul_rn(be, x1));
            b.y[row * b.hidden + h] = __bfloat16_as_ushort(__float2bfloat16_rn(s));
        }
    }
}

// The ExpertFn running the toy expert of one rank (device arrays owned by the caller).
inline ep::cuda::ExpertFn toy_expert(const int32_t *phy2log_rank, const float *a, const float *b) {
    return [=](const ep::cuda::ExpertBatch &batch, cudaStream_t stream) {
        const int grid = static_cast<int>(std::min<int64_t>(std::max<int64_t>(batch.max_rows, 1), 4096));
        toy_expert_kernel<<<grid, 256, 0, stream>>>(batch, phy2log_rank, a, b);
    };
}

}  // namespace ft::test
