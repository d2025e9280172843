/*
 * freetoken_cuda.h - the CUDA side of the FreeToken C API (since 0.2).
 *
 * For runtimes whose activations already live in GPU memory: one MoE layer is computed from
 * device pointers on the caller's CUDA stream, without any host synchronisation, so the call can
 * sit inside the caller's own CUDA graph. Include it after (or instead of) freetoken.h; it needs
 * the CUDA runtime headers for cudaStream_t. Link and version rules are those of freetoken.h.
 */
#ifndef FREETOKEN_CUDA_H
#define FREETOKEN_CUDA_H

#include <cuda_runtime_api.h>

#include "freetoken.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ft_decode on device memory for a session whose backend is FT_BACKEND_GPU, FT_BACKEND_OFFLOAD
 * or FT_BACKEND_HYBRID (else FT_ERR_UNSUPPORTED):
 *   hidden [num_tokens, H] bf16, expert_ids [num_tokens, K] int32, expert_weights
 *   [num_tokens, K] f32, out [num_tokens, H] bf16: device (or mapped pinned) memory of the
 *   engine's GPU; out may not alias hidden.
 * Everything is enqueued on `stream` (0 = the legacy default stream) and the call returns
 * without waiting: `out` is ready when the stream reaches that point. The caller keeps the
 * inputs alive and unchanged until then.
 *
 * CUDA graphs: with num_tokens < the session's prefill_min_tokens the call allocates nothing,
 * never synchronises and reads no device data on the host, so it may be captured (stream
 * capture, any mode) and the graph replayed with new contents of the same buffers. The captured
 * work depends on (layer, num_tokens, pointers); capture one graph per shape. Calls with more
 * tokens take the prefill path, which reads the routing on the host and returns FT_ERR_STATE
 * while `stream` is capturing.
 *
 * The device cannot report bad ids without a synchronisation: ids outside [0, E) are treated as
 * routes computed elsewhere (skipped), and check_finite is not applied; validate upstream when
 * that matters. Stream order is the only ordering: concurrent calls on one session must be on
 * one stream (the session's slot cache is shared by its calls).
 *
 * Errors: FT_ERR_INVALID_ARGUMENT (NULL, layer or num_tokens out of range, pageable host
 * pointers), FT_ERR_UNSUPPORTED (backend without a device path), FT_ERR_STATE (prefill during
 * capture), FT_ERR_DEVICE (a CUDA call failed; the message has CUDA's text), FT_ERR_DEVICE_LOST
 * (a sticky fault; see ft_session_status), FT_ERR_TIMEOUT (hybrid: a CPU handoff never
 * completed; the stream was released, the outputs since are invalid).
 * Hybrid sessions hand part of each call to the CPU through flags in mapped host memory that
 * the stream signals and waits on; the wait is on the stream, never on the calling thread. Their
 * CPU share runs on the engine's workers (by default one per physical core, less two: one core
 * is left to the thread that drives the GPU). That thread may poll for a token's completion
 * (CUDA's default for cudaStreamSynchronize): on the H100 machine polling decoded faster than
 * blocking (cudaEventBlockingSync) with every backend, hybrid included (docs/formulas.md). Block
 * instead when more host threads poll than the workers leave cores free. */
FT_API ft_status ft_decode_cuda(ft_session *session, int32_t layer, int32_t num_tokens,
                                const uint16_t *hidden, const int32_t *expert_ids,
                                const float *expert_weights, uint16_t *out, cudaStream_t stream);

/* The CUDA device ordinal of the session's engine, or FT_DEVICE_NONE. */
FT_API int32_t ft_session_device(const ft_session *session);

#ifdef __cplusplus
}
#endif

#endif /* FREETOKEN_CUDA_H */
