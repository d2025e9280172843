// Hugging Face checkpoint directory -> Model: config.json gives the geometry and routing rule,
// the safetensors shards give the routed experts (copied into the host banks) and the per-layer
// tensors beside them (router, correction bias, shared expert).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ft/model.hpp"

namespace ft {

// Reads <dir>/config.json. Supported model_type values: supported_model_types() (each with its
// transformers field names and aliases; the language model's fields may be nested under
// text_config or thinker_config.text_config; docs/ARCHITECTURE.md has each routing rule).
// spec.format is what quantization_config (or ModelOpt's hf_quant_config.json) declares: fp8
// with weight_block_size [128, 128] -> fp8_block, modelopt NVFP4 -> nvfp4, mxfp4 -> mxfp4,
// nothing -> bf16; other methods are FT_ERR_UNSUPPORTED. load_checkpoint checks it against the
// tensors.
// FT_ERR_IO if the file cannot be read, FT_ERR_FORMAT for malformed JSON or a missing or wrongly
// typed field (named), FT_ERR_UNSUPPORTED for an unknown model_type or activation (named).
// Optional fields take the defaults of the matching transformers config class.
ModelSpec read_model_config(const std::string &dir);

// Every model_type read_model_config accepts, in the order its error message lists them.
std::vector<std::string> supported_model_types();

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

// Loads every MoE layer's routed experts and extras of the checkpoint at `path`: a Hugging Face
// directory, a .gguf file, or a directory without config.json holding exactly one .gguf file.
// bf16 experts are accepted per expert (experts.{e}.gate_proj.weight ..., Mixtral's w1/w3/w2)
// or pre-fused (experts.gate_up_proj [E, 2I, H] / experts.down_proj [E, H, I], or their
// transposes [E, H, 2I] / [E, I, H]), in BF16 (copied verbatim) or F16/F32 (rounded to bf16).
// Quantised experts (spec.format is set from the tensors found): block-FP8 per expert
// (weight F8_E4M3 + weight_scale_inv BF16/F32 [N/128, K/128]; a quantised shared expert is
// dequantised to bf16), ModelOpt NVFP4 per expert (weight U8 [N, K/2], weight_scale F8_E4M3
// [N, K/16], weight_scale_2 scalar broadcast per output row as fp16), gpt-oss MXFP4
// (experts.{gate_up_proj,down_proj}_{blocks,scales,bias}, transposed into the banks), DeepSeek-V4
// (layers.{l}.ffn.experts.{e}.{w1,w2,w3}.{weight,scale}). GGUF: see read_gguf_config.
// H and I must be whole blocks of the format (no partial blocks); e8m0 scale bytes of 255 are
// rejected. Errors: see ft_model_load in freetoken.h; messages name the file and tensor.
std::unique_ptr<Model> load_checkpoint(const std::string &path, const LoadOptions &opts = {});

}  // namespace ft
