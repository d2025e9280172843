// Synthetic checkpoints in the real Hugging Face layouts (config.json field names, tensor names,
// shards and index), filled with deterministic pseudo-random values that tests can recompute.
// Also small writers of arbitrary, even deliberately broken, safetensors files.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ft::synth {

struct Spec {
    std::string architecture = "qwen3_moe";  // qwen3_moe, qwen3_5_moe, mixtral, deepseek_v3, kimi_k2, glm4_moe
    // per_expert: experts.{e}.gate_proj.weight ... (Mixtral: block_sparse_moe.experts.{e}.w1 ...);
    // fused: experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I];
    // fused_transposed: experts.gate_up_proj [E, H, 2I] and experts.down_proj [E, I, H].
    enum class Layout { per_expert, fused, fused_transposed } layout = Layout::per_expert;
    int num_layers = 2;        // decoder layers (num_hidden_layers)
    int first_dense = 0;       // first_k_dense_replace (deepseek_v3, kimi_k2, glm4_moe)
    std::vector<int> mlp_only_layers;  // dense layers of qwen3_moe / qwen3_5_moe
    int num_experts = 8;
    int top_k = 2;
    int hidden = 64;
    int intermediate = 24;     // fused layouts need hidden != 2 * intermediate (else ambiguous)
    int shared_intermediate = 0;  // deepseek/kimi/glm: a multiple of intermediate; qwen3_5_moe: any
    int n_group = 1, topk_group = 1;
    float routed_scaling_factor = 1.0f;
    bool norm_topk_prob = true;
    std::string hidden_act = "silu";
    bool language_model_prefix = false;  // model.language_model.layers.* (Qwen3.5/3.6 releases)
    int shards = 1;                      // 1: model.safetensors; more: model-0000i-of-0000n + index
    uint64_t seed = 1;
    std::string expert_dtype = "BF16";   // dtype of routed and shared expert tensors: BF16, F16, F32
    bool mtp_layer = false;              // a full MoE layer at index num_layers, as DeepSeek-V3/GLM ship
};

// Checkpoint layer index of each MoE layer, as the config written for `s` says.
std::vector<int> moe_layers(const Spec &s);

// Writes config.json, the shards and (for shards > 1) model.safetensors.index.json into `dir`
// (created if missing). `progress(done, total)` in bytes; returning false stops early.
// Throws ft::Error (FT_ERR_IO, FT_ERR_INVALID_ARGUMENT for an inconsistent spec).
void write_checkpoint(const std::string &dir, const Spec &s,
                      const std::function<bool(uint64_t, uint64_t)> &progress = {});

// The exact values written, after rounding to bf16 (what the loader must put in the banks).
// proj is FT_PROJ_GATE / FT_PROJ_UP ([I, H]) or FT_PROJ_DOWN ([H, I]); row-major.
std::vector<uint16_t> expert_weight(const Spec &s, int moe_layer, int expert, int proj);
// Router [E, H], written as bf16; these are the rounded values.
std::vector<float> router_weight(const Spec &s, int moe_layer);
// e_score_correction_bias [E], written as f32 (deepseek_v3, kimi_k2, glm4_moe).
std::vector<float> router_bias(const Spec &s, int moe_layer);
// Shared expert projection as bf16 after rounding ([Is, H] gate/up, [H, Is] down).
std::vector<uint16_t> shared_weight(const Spec &s, int moe_layer, int proj);
// Qwen3.5's shared_expert_gate [1, H] (bf16 bits).
std::vector<uint16_t> shared_gate_weight(const Spec &s, int moe_layer);

// ---- raw safetensors files ------------------------------------------------------------------

struct RawTensor {
    std::string name;
    std::string dtype;  // written as given, so unknown dtypes can be tested
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

// A well-formed file: tensors laid out back to back in the given order.
void write_safetensors(const std::string &path, const std::vector<RawTensor> &tensors);

// A file with the given header text and data section. The length prefix is header.size()
// unless `declared_length` is given (to claim more or less than is there).
void write_raw_header(const std::string &path, const std::string &header, const std::vector<uint8_t> &data = {},
                      int64_t declared_length = -1);

}  // namespace ft::synth
