// Helpers shared by the GGUF metadata reader (gguf_config.cpp) and the GGUF loader (gguf_loader.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "ft/gguf.hpp"
#include "ft/model.hpp"

namespace ft {

// "blk.{layer}.{what}".
std::string gguf_layer_tensor(int32_t layer, const char *what);
// The layer l of a tensor named blk.{l}.ffn_gate_exps.weight or blk.{l}.ffn_gate_up_exps.weight
// (l in decimal without leading zeros, below 10^9); -1 for any other name.
int32_t gguf_expert_tensor_layer(const std::string &name);
// spec.format (and spec.layer_formats when matrices or layers differ) from the expert tensors of
// spec.moe_layers. FT_ERR_UNSUPPORTED naming the tensor: a type FreeToken does not read (the
// message lists the supported ones), gate and up of different types, float or MXFP4 experts mixed
// with any other kind (block types mix freely).
void gguf_expert_formats(const GgufFile &g, ModelSpec &spec);

}  // namespace ft
