// The shared expert(s) of a model on the GPU backends: each MoE layer's bf16 gate/up/down (and the
// sigmoid gate of Qwen2-MoE-style models) kept resident in device memory and added to the routed
// output in the same call, on the call's stream, with no host synchronisation (capturable):
//   y[t] = bf16(y[t] + s_t * down(act(gate(x_t)) * up(x_t))),  s_t = sigmoid(gate_proj . x_t) or 1,
// the intermediate rounded to bf16 as the cpu backend rounds it; a DeepSeek-V4 model's gate/up
// take its routed experts' bf16 rounding and swiglu_limit clamp. Private to ft_cuda_backends.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "ft/cuda_activation.hpp"
#include "ft/cuda_memory.hpp"
#include "ft/model.hpp"

namespace ft::gpu_backend {

class SharedExperts {
public:
    // Copies every MoE layer's shared expert to the current device; FT_ERR_INVALID_ARGUMENT when the
    // model has none or a layer lacks its weights, FT_ERR_OUT_OF_MEMORY when they do not fit.
    SharedExperts(const Model &model, int32_t max_tokens, cuda::DeviceActivation act);

    // Adds layer `layer`'s shared expert of x [tokens, H] to y [tokens, H] (bf16, device) on `stream`.
    cudaError_t add(int32_t layer, const uint16_t *x, uint16_t *y, int32_t tokens, cudaStream_t stream) const;

    // Device bytes the weights take (every layer).
    size_t weight_bytes() const { return weight_bytes_; }

private:
    struct Layer {
        cuda::DeviceBuffer gate, up, down, gate_proj;  // [Is,H], [Is,H], [H,Is], [H] or empty
    };
    int32_t hidden_, inter_, max_tokens_;
    cuda::DeviceActivation act_;
    bool ds_ = false;        // DeepSeek-V4: gate/up rounded to bf16 before the activation
    bool ds_clamp_ = false;  //   and clamped at swiglu_limit (as its routed experts)
    std::vector<Layer> layers_;
    cuda::DeviceBuffer h_;      // [max_tokens, Is] bf16 intermediate
    cuda::DeviceBuffer scale_;  // [max_tokens] f32 gate per token
    size_t weight_bytes_ = 0;
};

}  // namespace ft::gpu_backend
