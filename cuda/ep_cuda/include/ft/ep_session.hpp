// A rank's local experts computed by a FreeToken session (issue 7 item 5): the expert rows of an
// ExpertBatch are handed to a session-style decode call (ft_decode_cuda's contract) whose model
// holds exactly this rank's physical slots, expert j of that model = local slot j. Replicas work
// because the mapping is by physical slot, never by logical expert.
//
// The batch is expert-major, one row per (token, source, local route); the EP step applies the
// route weights in its own reduction. So each row becomes one "token" of the session call with
// route 0 = its local slot and weight 1 (the session returns the bare expert output, rounded to
// bf16, which is what ExpertBatch::y wants) and routes 1..top_k-1 = -1 (skipped by the session).
// Rows past the batch's row count get -1 everywhere (the session writes zeros there).
//
// This file has no link dependency on the session code: the decode call is a callback, so the
// simulated-rank tests and the C API (which passes ft_decode_cuda) share the mapping.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "ft/ep_cuda.hpp"

namespace ft::ep::cuda {

// ids/weights [rows, top_k] for expert rows [row_begin, row_begin + rows) of a batch whose
// per-slot row offsets are offset[0..slots] (device). Graph-capturable, no host sync.
void launch_session_routes(const int64_t *offset, int32_t slots, int64_t row_begin, int32_t rows, int32_t top_k,
                           int32_t *ids, float *weights, cudaStream_t stream);

// One session call over `rows` rows: y[i] = expert(ids[i, 0])(x[i]) for the rows with a route.
// Throws on failure (ft::fail with the session's message).
using SessionDecodeFn = std::function<void(int32_t rows, const uint16_t *x, const int32_t *ids,
                                           const float *weights, uint16_t *y, cudaStream_t stream)>;

class SessionExperts {
public:
    // model_top_k: routes per token of the session's model (any >= 1; 1 wastes nothing).
    // rows_per_call: the largest num_tokens of one session call (<= the session's max_tokens;
    // below its prefill_min_tokens keeps every call on the capturable decode path).
    SessionExperts(int32_t model_top_k, int32_t rows_per_call);
    SessionExperts(const SessionExperts &) = delete;
    SessionExperts &operator=(const SessionExperts &) = delete;

    int32_t model_top_k() const { return top_k_; }
    int32_t rows_per_call() const { return rows_per_call_; }

    // Computes batch.y for the batch's rows on `stream`. exact_rows: read the row count
    // (offset[slots]) on the host first -- one stream synchronisation, not capturable -- and call
    // the session only for those rows; otherwise every one of batch.max_rows rows is covered
    // (padding rows cost a skipped route each), which never touches the host.
    void run(const ExpertBatch &batch, bool exact_rows, const SessionDecodeFn &decode, cudaStream_t stream);

    // Rows covered by the last run (for tests and statistics).
    int64_t last_rows() const { return last_rows_; }
    int32_t last_calls() const { return last_calls_; }

private:
    int32_t top_k_ = 1, rows_per_call_ = 1;
    ft::cuda::DeviceBuffer ids_buf_, weights_buf_;
    ft::cuda::PinnedBuffer rows_buf_;
    int32_t *ids_ = nullptr;          // ids_buf_
    float *weights_ = nullptr;        // weights_buf_
    int64_t *rows_pinned_ = nullptr;  // rows_buf_
    int64_t last_rows_ = 0;
    int32_t last_calls_ = 0;
};

}  // namespace ft::ep::cuda
