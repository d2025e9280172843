// Hugging Face checkpoint directory -> Model: config.json gives the geometry and routing rule,
// the safetensors shards give the routed experts (copied into the host banks) and the per-layer
// tensors beside them (router, correction bias, shared expert). Spec sections 3.3 and 7.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ft/model.hpp"

namespace ft {

// Reads <dir>/config.json. Supported model_type values: qwen3_moe, qwen3_5_moe (and the
// Qwen3.5/3.6 variants qwen3_5_moe_text, qwen3_6_moe, qwen3_6_moe_text; fields may be nested
// under text_config), mixtral, deepseek_v3, kimi_k2, glm4_moe.
// FT_ERR_IO if the file cannot be read, FT_ERR_FORMAT for malformed JSON or a missing or wrongly
// typed field (named), FT_ERR_UNSUPPORTED for an unknown model_type or activation (named).
// Optional fields take the defaults of the matching transformers config class.
ModelSpec read_model_config(const std::string &dir);

struct LoadOptions {
    int io_threads = 0;  // parallel readers; 0 = std::thread::hardware_concurrency()
    // Bytes read so far and in all; called from the loading thread only, with `done`
    // non-decreasing, ending with done == total. Return false to cancel (FT_ERR_CANCELLED).
    std::function<bool(uint64_t done, uint64_t total)> progress;
    // Called exactly once per MoE layer, as soon as every byte of that layer's banks is written.
    // May run on a worker thread, concurrently for different layers.
    std::function<void(int moe_layer)> on_layer_filled;
    // Called once, on the loading thread, after the model and its (still empty) banks are
    // allocated and before any byte is read: lets on_layer_filled reach the banks it is told about.
    std::function<void(Model &model)> on_model_allocated;
};

// Loads every MoE layer's routed experts and extras of the checkpoint in `dir`.
// Expert tensors are accepted per expert (experts.{e}.gate_proj.weight ..., Mixtral's w1/w3/w2)
// or pre-fused (experts.gate_up_proj [E, 2I, H] / experts.down_proj [E, H, I], or their
// transposes [E, H, 2I] / [E, I, H]), in BF16 (copied verbatim) or F16/F32 (rounded to bf16).
// Errors: see ft_model_load in freetoken.h; messages name the file and tensor.
std::unique_ptr<Model> load_checkpoint(const std::string &dir, const LoadOptions &opts = {});

}  // namespace ft
