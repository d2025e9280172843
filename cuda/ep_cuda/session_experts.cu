// Expert rows of an EP batch as session calls (ft/ep_session.hpp).
#include <algorithm>

#include "ft/common.hpp"
#include "ft/cuda_launch.cuh"
#include "ft/ep_session.hpp"

namespace ft::ep::cuda {

using ft::cuda::launch_pdl;
using ft::cuda::pdl_wait;

namespace {

// One thread per (row, route). The slot of a row is the s with offset[s] <= row < offset[s+1];
// offsets are non-decreasing, so a binary search over slots + 1 entries finds it.
__global__ void session_routes_kernel(const int64_t *__restrict__ offset, int32_t slots, int64_t row_begin,
                                      int32_t rows, int32_t top_k, int32_t *__restrict__ ids,
                                      float *__restrict__ weights) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    const int64_t n = static_cast<int64_t>(rows) * top_k;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = row_begin + i / top_k;
        const int32_t j = static_cast<int32_t>(i % top_k);
        int32_t slot = -1;
        if (j == 0 && row >= offset[0] && row < offset[slots]) {
            int32_t lo = 0, hi = slots - 1;  // largest s with offset[s] <= row
            while (lo < hi) {
                const int32_t mid = (lo + hi + 1) / 2;
                if (offset[mid] <= row)
                    lo = mid;
                else
                    hi = mid - 1;
            }
            slot = lo;
        }
        ids[i] = slot;
        weights[i] = slot >= 0 ? 1.0f : 0.0f;
    }
}

}  // namespace

void launch_session_routes(const int64_t *offset, int32_t slots, int64_t row_begin, int32_t rows, int32_t top_k,
                           int32_t *ids, float *weights, cudaStream_t stream) {
    if (rows <= 0) return;
    if (slots < 1 || top_k < 1) fail(FT_ERR_INVALID_ARGUMENT, "EP session routes: ", slots, " slots, top-k ", top_k);
    const int64_t n = static_cast<int64_t>(rows) * top_k;
    const int threads = 256;
    const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 4096));
    launch_pdl(session_routes_kernel, dim3(blocks), dim3(threads), 0, stream, offset, slots, row_begin, rows, top_k, ids, weights);
    check_cuda(cudaGetLastError(), "EP session routes kernel");
}

SessionExperts::SessionExperts(int32_t model_top_k, int32_t rows_per_call)
    : top_k_(model_top_k), rows_per_call_(rows_per_call) {
    if (model_top_k < 1 || rows_per_call < 1)
        fail(FT_ERR_INVALID_ARGUMENT, "EP session experts: top-k ", model_top_k, ", rows per call ", rows_per_call);
    const size_t routes = static_cast<size_t>(model_top_k) * rows_per_call;
    ids_buf_ = ft::cuda::DeviceBuffer(routes * sizeof(int32_t), "EP: EP session route ids");
    weights_buf_ = ft::cuda::DeviceBuffer(routes * sizeof(float), "EP: EP session route weights");
    rows_buf_ = ft::cuda::PinnedBuffer(sizeof(int64_t), "EP: EP session row count", cudaHostAllocDefault);
    ids_ = ids_buf_.get<int32_t>();
    weights_ = weights_buf_.get<float>();
    rows_pinned_ = rows_buf_.get<int64_t>();
}

void SessionExperts::run(const ExpertBatch &b, bool exact_rows, const SessionDecodeFn &decode, cudaStream_t stream) {
    int64_t rows = b.max_rows;
    if (exact_rows && b.max_rows > 0) {
        check_cuda(cudaMemcpyAsync(rows_pinned_, b.offset + b.slots, sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
                   "EP session row count");
        check_cuda(cudaStreamSynchronize(stream), "EP session row count");
        // The grouping pass never writes more than max_rows rows (it flags the overflow instead).
        rows = std::clamp<int64_t>(*rows_pinned_, 0, b.max_rows);
    }
    last_rows_ = rows;
    last_calls_ = 0;
    const size_t H = static_cast<size_t>(b.hidden);
    for (int64_t begin = 0; begin < rows; begin += rows_per_call_) {
        const int32_t n = static_cast<int32_t>(std::min<int64_t>(rows_per_call_, rows - begin));
        launch_session_routes(b.offset, b.slots, begin, n, top_k_, ids_, weights_, stream);
        decode(n, b.x + static_cast<size_t>(begin) * H, ids_, weights_, b.y + static_cast<size_t>(begin) * H, stream);
        ++last_calls_;
    }
}

}  // namespace ft::ep::cuda
