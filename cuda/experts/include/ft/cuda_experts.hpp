// GPU expert kernels for decode (docs/formats.md): the routed experts of one MoE layer computed
// from weights already resident in device-readable memory (slot arrays or mapped host banks), in
// every expert format, with the numerics of the CPU executor (cpu/README.md "Executor math and
// order"). Launchers take device pointers and a stream, never synchronise and never allocate, so a
// whole decode step can be captured in a CUDA graph.
//
// Numerics (the same function as ft::cpu::MoeExecutor, up to fp32 summation order):
//   fp32 accumulation; gate/up outputs -> act -> intermediate rounded to bf16; down -> f32 per
//   route; y = sum_k w * route (k order) + addend, rounded once to bf16.
//   bf16 W16A16; fp8_block W8A16 (e4m3 x bf16 scale_inv per 128x128); nvfp4 W4A16 (e2m1 x e4m3
//   per 16 x fp16 global per row); mxfp4 W4A16 (transposed, biases before the clamped SwiGLU and
//   per route after down); ds_fp4 W4A16 on FP8-round-tripped activations (input and
//   intermediate, per 128), gate/up rounded to bf16 then clamped (silu with finite limit > 0),
//   each weighted route rounded to bf16 before the sum; the GGUF block formats (q4_0, q8_0, the
//   K-quants, iq4_xs) W*A8 where the integer-dot kernel runs (rows 2-byte aligned, K <= 8928):
//   input and intermediate quantised as the CPU does: Q8_0 per 32 for q4_0 and q8_0
//   (ft::quantize_q8_0), Q8_K per 256 for the others (ft::quantize_q8_k); W*A16
//   with bf16 activations on the float kernel otherwise.
//   bf16 gpt-oss: f32 biases per expert (DeviceExperts bias tables) added as mxfp4 adds its own.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ft/cuda_activation.hpp"
#include "ft/cuda_memory.hpp"
#include "ft/formats.hpp"

namespace ft::cuda {

// One layer's experts in device-readable memory: bank b (bank_schema order) of the expert in
// slot s starts at base[b] + s * row_bytes[b]. A layer of a model that mixes GGUF block formats
// (ModelSpec::layer_formats) has `format` for gate_up and down_format for down; row_bytes[b] may
// then exceed the layer's own rows (slots sized for the largest layer).
struct DeviceExperts {
    Format format = Format::bf16;
    int32_t hidden = 0, inter = 0;
    int num_banks = 0;
    const uint8_t *base[8] = {};
    size_t row_bytes[8] = {};
    int32_t down_format = -1;  // a Format when down's differs from `format`; -1: down is `format`
    Format down() const { return down_format < 0 ? format : Format(down_format); }
    // bf16 only (bf16 gpt-oss): the layer's per-expert biases in f32, indexed by expert id (not
    // slot): gate_up_bias [bias_experts, 2I] (gate then up), down_bias [bias_experts, H]; both or
    // neither (nullptr: none). Decode finds each route's expert in the expert ids given to
    // compute/decode; the prefill takes slot = expert id.
    const float *gate_up_bias = nullptr;
    const float *down_bias = nullptr;
    int32_t bias_experts = 0;
};

// y[t] = sum over k in order of w[t,k] * route_out[t*K+k] over routes with slots[t*K+k] >= 0
// (ds_fp4: each weighted route term rounded to bf16 before the sum), + addend[t] (bf16 [T,H],
// may be nullptr), rounded once to bf16. A token with no routes and no addend gets zeros.
// route_out: f32 [T*K, H]. Capturable; never syncs. Used also by the prefill path.
cudaError_t launch_combine_routes(const float *route_out, const int32_t *slots, const float *w,
                                  const uint16_t *addend, uint16_t *y, int32_t tokens, int32_t top_k,
                                  int32_t hidden, bool ds_fp4_rounding, cudaStream_t stream);

// The decode path of one layer geometry: owns the device scratch for max_tokens tokens of top_k
// routes (route grouping, activations, intermediate, per-route outputs). One decoder is used by
// one stream at a time (its scratch is reused by every call).
class ExpertDecoder {
public:
    // Allocates all scratch (cudaMalloc on the current device) for max_tokens tokens of top_k
    // routes. Throws ft::Error: FT_ERR_INVALID_ARGUMENT (geometry per format_geometry_error,
    // top_k/max_tokens <= 0), FT_ERR_OUT_OF_MEMORY, FT_ERR_DEVICE, FT_ERR_DEVICE_LOST.
    // A decoder made for a GGUF block format (format_is_block) also runs experts whose gate_up
    // and down are in other block formats (models mixing them): each projection takes its own
    // format's kernel; nothing else depends on it.
    ExpertDecoder(Format format, int32_t hidden, int32_t inter, int32_t top_k, int32_t max_tokens,
                  DeviceActivation act);
    ~ExpertDecoder() = default;  // frees; non-copyable
    ExpertDecoder(const ExpertDecoder &) = delete;
    ExpertDecoder &operator=(const ExpertDecoder &) = delete;

    // Phase 1: route_out[t*K+k] = expert(slots[t*K+k])(x[t]) (down output incl. mxfp4 down bias,
    // before the route weight) for every route with slot >= 0; routes with slot < 0 are skipped
    // (never read slot 0 times zero: a NaN-poisoned slot must never reach an output). Each distinct
    // slot's weights are read once per call for all tokens routed to it (dedup on the device).
    // x bf16 [T,H] device; slots int32 [T,K] device. tokens in [0, max_tokens] (0: no-op).
    // Capturable in a CUDA graph: no sync, no allocation, no host reads of device data.
    // cudaErrorInvalidValue for a format/geometry other than the decoder's (block formats: a
    // projection's format not a block format, H or I not a multiple of its block, or bank rows
    // shorter than its rows), tokens outside
    // [0, max_tokens], NULL pointers or bank pointers not aligned as the kernels need (data banks:
    // base[b] and row_bytes[b] multiples of 16, 8 for nvfp4, 4 for mxfp4, 2 for unaligned bf16
    // shapes, 1 for the GGUF block formats; the other banks 2, mxfp4's scales 4).
    // Experts with bias tables: expert_ids int32 [T,K] device (the routing's ids) names the expert
    // of every route with slot >= 0; the gate/up biases are added in f32 before the activation and
    // the down bias to the route's output (cudaErrorInvalidValue without expert_ids, for a format
    // other than bf16, or with only one table).
    cudaError_t compute(const DeviceExperts &experts, const uint16_t *x, const int32_t *slots,
                        int32_t tokens, cudaStream_t stream, const int32_t *expert_ids = nullptr);
    // Phase 2: launch_combine_routes over this decoder's route_out.
    cudaError_t combine(const int32_t *slots, const float *w, const uint16_t *addend, uint16_t *y,
                        int32_t tokens, cudaStream_t stream);
    // compute + combine.
    cudaError_t decode(const DeviceExperts &experts, const uint16_t *x, const int32_t *slots,
                       const float *w, const uint16_t *addend, uint16_t *y, int32_t tokens,
                       cudaStream_t stream, const int32_t *expert_ids = nullptr);

    const float *route_out() const { return route_out_; }  // f32 [max_tokens*K, H]
    size_t scratch_bytes() const { return scratch_bytes_; }
    const char *kernel_name() const;  // e.g. "bf16-mma", "bf16-gemv-scalar" (the constructor's format)

private:
    // compute's first kernel: groups the routes by slot and stages x; *xact = what gate_up reads.
    cudaError_t launch_prep_step(const uint16_t *x, const int32_t *slots, int32_t tokens, const uint16_t **xact,
                                 cudaStream_t stream);

    Format format_;
    int32_t hidden_, inter_, top_k_, max_tokens_;
    DeviceActivation act_;
    bool vec_ = true;  // bf16 only: rows are whole 16-byte vectors (H and I multiples of 8)
    int32_t sms_ = 132;  // multiprocessors of the device (sizes the grids)
    bool mma_ = false;  // tensor-core kernels: not the GGUF block formats, nor bf16 rows not a multiple of 8
    size_t scratch_bytes_ = 0;
    DeviceBuffer scratch_;  // one allocation, carved below
    int32_t *num_groups_ = nullptr;    // [1]
    int32_t *group_slot_ = nullptr;    // [R]  distinct slots
    int32_t *group_start_ = nullptr;   // [R]  first entry of the group in group_routes_
    int32_t *group_count_ = nullptr;   // [R]
    int32_t *group_routes_ = nullptr;  // [R]  route indices t*K+k, grouped (then the hash table)
    uint16_t *xin_ = nullptr;          // [max_tokens, H] bf16: aligned or FP8-round-tripped input
    uint16_t *inter_buf_ = nullptr;    // [R, I] bf16 intermediate
    float *route_out_ = nullptr;       // [R, H] f32
};

}  // namespace ft::cuda
