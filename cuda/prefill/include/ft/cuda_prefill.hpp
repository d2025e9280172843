// GPU prefill path of the routed experts (many tokens per layer): tokens are grouped by expert
// slot on the host, each expert's weights are dequantised to bf16 once (quantised formats), and
// the gate_up and down projections run as cuBLAS bf16 GEMMs with fp32 accumulation, with the
// format's epilogue (activation, nvfp4 per-row globals, mxfp4 biases, ds_fp4 rounding and FP8
// round trips) in our own kernels; launch_combine_routes makes the output rows. Host-compilable.
//
// Numerics (the CPU executor's rounding points, cpu/README.md; fp32 accumulation in cuBLAS):
//   x rows gathered as bf16 (ds_fp4: FP8-round-tripped per 128, ft::fp8_round_trip_per128);
//   gate/up = fp32 GEMM outputs; nvfp4: x fp16 global of the output row (exact fp32 product,
//   never folded into the bf16 weights); mxfp4: + bf16 bias before the clamped SwiGLU; ds_fp4:
//   rounded to bf16, clamped at limit (silu, finite limit > 0); activation; intermediate rounded
//   to bf16 (ds_fp4: then FP8-round-tripped per 128); down = fp32 GEMM output (nvfp4 x global,
//   mxfp4 + down bias) per route; launch_combine_routes sums w * route in k order (ds_fp4: each
//   term rounded to bf16) + addend, one bf16 rounding.
// Weights are dequantised to bf16 once per expert and call:
//   bf16, nvfp4 (e2m1 x e4m3 <= 6 significant bits), mxfp4 and ds_fp4 (e2m1 x 2^k, bf16 has
//   fp32's exponent range incl. subnormals down to 2^-133): exact, so the only differences from
//   the fp64 reference are fp32 summation order and the shared bf16 rounding points;
//   fp8_block (e4m3 x bf16 scale_inv: up to 4 + 8 significant bits) and q4_0 ((q-8) x fp16 d:
//   up to 14 bits): one bf16 rounding per weight, relative error <= 2^-9 per weight, so a dot
//   product is off by <= 2^-9 * sum |w x| on top of the above. q4_0 keeps bf16 activations
//   (W4A16), more exact than the CPU's Q8_0 (W4A8).
// Tested bounds (max |y - ref| / max |ref|, fp64 reference with the same rounding points):
//   bf16, nvfp4, mxfp4 1e-2; fp8_block, q4_0 2e-2; ds_fp4 3e-2.
// bf16 with DeviceExperts bias tables (bf16 gpt-oss): + the f32 gate/up bias of expert = slot
// before the activation, + its f32 down bias per route, as mxfp4 adds its own.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "freetoken.h"
#include "ft/cuda_experts.hpp"  // DeviceExperts, DeviceActivation, launch_combine_routes
#include "ft/formats.hpp"
#include "ft/knobs.hpp"

namespace ft::cuda {

// Dequantises the experts in slots[0..n) (device int32 array) of a quantised format to bf16:
// per expert, out + j * 3*H*I holds gate_up [2I, H] (gate rows then up rows; mxfp4 de-interleaved
// so row i is unit i's gate and row I + i its up) followed by down [H, I], row-major. Every value
// is the reference's e2m1/e4m3/e8m0/fp16 product rounded once to bf16 (RNE); nvfp4's fp16
// per-row global is NOT applied (ExpertPrefill applies it to the GEMM output rows). bf16: error
// (nothing to dequantise). Experts whose down is in another block format than gate_up
// (DeviceExperts::down_format) dequantise each matrix by its own format. Does not synchronise.
cudaError_t launch_dequant_bf16(const DeviceExperts &experts, const int32_t *slots, int32_t n, uint16_t *out,
                                cudaStream_t stream);

// The MoE layer for many tokens (prefill). One object per (format, geometry, top_k, max_tokens);
// it owns device scratch, pinned staging for the routing plan, internal streams and cuBLAS
// handles. One thread at a time; consecutive run() calls share the scratch, so they must be on
// one stream or ordered by the caller.
//
// GEMM paths (PrefillTuning::grouped, FT_PREFILL_GEMM): "streams" (default) issues one
// cublasGemmEx per expert, spread over 4 internal streams forked from and joined back into the
// caller's stream; "grouped" makes one cublasGemmGroupedBatchedEx call per chunk of experts
// (cuBLAS >= 12.5; "streams" when the entry point is absent or answers NOT_SUPPORTED for bf16 x
// bf16 -> fp32). All work runs on the device that was current at construction.
//
// No cuBLAS on the machine: the constructor throws FT_ERR_UNSUPPORTED (there is no fallback
// GEMM; the decode kernels of cuda/experts serve such machines).
// The constructor's tuning (an engine fills it from its knobs, prefill_tuning()).
struct PrefillTuning {
    bool grouped = false;  // FT_PREFILL_GEMM=grouped: one grouped GEMM call per chunk
    // FT_PREFILL_DEQUANT_MIB: the two bf16 dequantisation buffers together, i.e. experts per
    // chunk (at least 1, at most 512); chunk c + 1 is dequantised on an internal stream while the
    // GEMMs of chunk c run.
    int dequant_mib = 512;
    // FT_PREFILL_CHUNK_ROWS: routed rows per chunk, the size of the per-chunk activation and
    // GEMM-output scratch (0: max(max_tokens, min(max_tokens * top_k, 8192))).
    int chunk_rows = 0;
};
PrefillTuning prefill_tuning(const Tuning &t);

class ExpertPrefill {
public:
    // Scratch for max_tokens tokens x top_k routes: gathered activations, intermediate, fp32
    // route_out [max_tokens*K, H], GEMM output per chunk, and the two bf16 dequantisation buffers
    // (quantised formats), all cudaMalloc'd here on the current device. H and I must suit the
    // format (ft::format_geometry_error) and be multiples of 8. Throws ft::Error:
    // FT_ERR_INVALID_ARGUMENT, FT_ERR_OUT_OF_MEMORY, FT_ERR_DEVICE, FT_ERR_DEVICE_LOST, FT_ERR_UNSUPPORTED
    // (no cuBLAS). A prefill made for a GGUF block format also runs experts whose gate_up and
    // down are in other block formats (models mixing them): only the dequantisation differs.
    ExpertPrefill(Format format, int32_t hidden, int32_t inter, int32_t top_k, int32_t max_tokens,
                  DeviceActivation act, PrefillTuning tuning = {});
    ~ExpertPrefill();
    ExpertPrefill(const ExpertPrefill &) = delete;
    ExpertPrefill &operator=(const ExpertPrefill &) = delete;

    // y[t] = sum_k w[t,k] * expert(slots[t,k])(x[t]) (+ addend[t]), bf16 [tokens, H], exactly the
    // semantics of launch_combine_routes; routes with slot < 0 are skipped (never read).
    // Experts with bias tables (bf16 only) hold expert e at slot e: every slot < bias_experts.
    // slots_host is the host copy of slots_dev (int32 [tokens, K]): the grouping of tokens per
    // slot is planned on the host, so this call is NOT capturable in a CUDA graph, and it may
    // block the host until the previous run's plan upload has been consumed. x, w, addend, y and
    // slots_dev are device pointers; addend may be null. Everything is enqueued on `stream`.
    // Returns FT_OK, FT_ERR_INVALID_ARGUMENT (tokens > max_tokens, null pointers, experts of
    // another format or geometry), FT_ERR_DEVICE (a CUDA or cuBLAS failure) or
    // FT_ERR_DEVICE_LOST (a sticky fault: the context is unusable, ft/cuda_check.hpp);
    // last_error() has the message.
    ft_status run(const DeviceExperts &experts, const uint16_t *x, const int32_t *slots_dev, const int32_t *slots_host,
                  const float *w, const uint16_t *addend, uint16_t *y, int32_t tokens, cudaStream_t stream);

    const char *last_error() const;
    // Device bytes this object holds (scratch, workspaces, plan).
    size_t scratch_bytes() const;
    // "streams" or "grouped": the GEMM path chosen at construction.
    const char *gemm_path() const;

private:
    struct Impl;
    std::unique_ptr<Impl> p_;
};

}  // namespace ft::cuda
