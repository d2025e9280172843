// The model: geometry and routing rule (ModelSpec), routed experts in host banks, and the
// per-layer tensors a checkpoint carries beside them (router, correction bias, shared expert).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ft/bank.hpp"
#include "ft/formats.hpp"

namespace ft {

struct RoutingSpec {
    int32_t rule = FT_ROUTING_SOFTMAX_TOPK_RENORM;  // FT_ROUTING_*
    int32_t num_experts = 0;
    int32_t top_k = 0;
    int32_t num_groups = 1;    // FT_ROUTING_SIGMOID_GROUP_TOPK
    int32_t topk_groups = 1;
    float routed_scaling_factor = 1.0f;
    bool renormalize = true;   // the biased and grouped rules (FT_ROUTING_*_GROUP_TOPK, _BIASED_TOPK)
    float jitter_eps = 0.01f;  // FT_ROUTING_SPARSEMIXER
};

// The formats of one MoE layer's two expert matrices.
struct LayerFormats {
    Format gate_up = Format::bf16;
    Format down = Format::bf16;
};

struct ModelSpec {
    std::string architecture = "custom";  // the canonical name of a supported_architectures() entry
    int32_t num_layers = 0;               // MoE layers, L
    std::vector<int32_t> moe_layers;      // checkpoint layer of each MoE layer (size L)
    int32_t total_layers = 0;             // decoder layers of the checkpoint (0: built in memory)
    int32_t num_experts = 0;              // E
    int32_t top_k = 0;                    // K
    int32_t hidden = 0;                   // H
    int32_t intermediate = 0;             // I
    Format format = Format::bf16;
    // Per MoE layer (size L) when a GGUF file mixes block formats between matrices or layers;
    // empty when every layer uses `format` for both. Only block formats mix (format_is_block);
    // `format` is then layer 0's gate_up format. The banks then hold each layer's rows at that
    // layer's sizes (ExpertBanks::layer_row_bytes).
    std::vector<LayerFormats> layer_formats;
    int32_t activation = FT_ACT_SILU;
    float swiglu_alpha = 1.702f;
    float swiglu_limit = 7.0f;
    RoutingSpec routing;
    int32_t shared_intermediate = 0;      // total width of the shared expert(s); 0 = none
    bool shared_expert_gate = false;      // out += sigmoid(gate_proj . x) * shared(x)  (Qwen2/3.5/3-Next)
    int32_t route_weight = FT_ROUTE_WEIGHT_OUTPUT;  // FT_ROUTE_WEIGHT_INPUT: expert(w x) (Llama-4)
    bool expert_biases = false;           // LayerExtras carries expert_gate_up_bias / expert_down_bias
    // DeepSeek-V4: MoE layers [0, hash_layers) select their experts by token id
    // (LayerExtras::tid2eid, [vocab_size, K]); route_hash computes their weights.
    int32_t hash_layers = 0;
    int32_t vocab_size = 0;               // rows of tid2eid (hash_layers > 0 only)

    // Throws FT_ERR_INVALID_ARGUMENT (or FT_ERR_FORMAT when from_checkpoint) naming the field.
    void validate(bool from_checkpoint) const;

    // The {gate_up, down} formats of MoE layer `layer` (both `format` unless layer_formats).
    LayerFormats formats_of(int32_t layer) const;
    // True when some layer's gate_up or down format differs from `format`.
    bool mixed_formats() const;
    // Bytes of one routed expert of MoE layer `layer` in its own formats.
    uint64_t layer_expert_bytes(int32_t layer) const;
    // One expert with each bank's largest row over the layers (ExpertBanks::expert_bytes()):
    // what one GPU slot must hold; layer_expert_bytes(l) <= this for every layer.
    uint64_t max_expert_bytes() const;
    // Every routed expert of every layer, each in its layer's formats.
    uint64_t routed_bytes() const;
};

// A dense tensor a model keeps outside the banks, in its checkpoint dtype (FT_DTYPE_*).
struct Tensor {
    int32_t dtype = 0;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;

    bool empty() const { return bytes.empty(); }
    int64_t numel() const;
};

struct LayerExtras {
    Tensor router_weight;      // [E, H]
    Tensor router_bias;        // [E] f32 (e_score_correction_bias)
    Tensor shared_gate;        // [Is, H] bf16
    Tensor shared_up;          // [Is, H] bf16
    Tensor shared_down;        // [H, Is] bf16
    Tensor shared_gate_proj;   // [1, H] bf16 (sigmoid gate of the shared expert)
    Tensor expert_gate_up_bias;  // [E, 2I] f32: gate biases then up biases of each routed expert
    Tensor expert_down_bias;     // [E, H] f32
    std::vector<int32_t> tid2eid;  // hash-routed layers: [vocab_size, K] expert ids, each < E
};

class Model {
public:
    explicit Model(ModelSpec spec);  // validates the spec and allocates the banks

    const ModelSpec &spec() const { return spec_; }
    ExpertBanks &banks() { return banks_; }
    const ExpertBanks &banks() const { return banks_; }
    LayerExtras &extras(int layer) { return extras_.at(layer); }
    const LayerExtras &extras(int layer) const { return extras_.at(layer); }

    // bf16 views of expert e of MoE layer l (format bf16): gate [I,H], up [I,H], down [H,I].
    const uint16_t *gate(int layer, int expert) const;
    const uint16_t *up(int layer, int expert) const;
    const uint16_t *down(int layer, int expert) const;

    // The {gate_up, down} formats of MoE layer `layer` (ModelSpec::formats_of).
    LayerFormats layer_formats(int32_t layer) const { return spec_.formats_of(layer); }
    bool mixed_formats() const { return spec_.mixed_formats(); }

    // MoE layer of a checkpoint layer, -1 if none.
    int32_t moe_layer_of(int32_t model_layer) const;

private:
    ModelSpec spec_;
    ExpertBanks banks_;
    std::vector<LayerExtras> extras_;
};

// Routing (docs/formulas.md, "Routing"). logits [T, E] f32 -> ids [T, K], weights [T, K], selection order by
// decreasing score, ties towards the lower id. `bias` ([E]) is the correction bias of
// FT_ROUTING_SIGMOID_GROUP_TOPK (may be null). Throws FT_ERR_NON_FINITE on NaN logits.
void route(const RoutingSpec &rule, const float *bias, int32_t num_tokens, const float *logits,
           int32_t *ids, float *weights);

// DeepSeek-V4 hash routing: token t takes the experts of row token_ids[t] of `table` ([vocab, K],
// ids < E, in table order); their weights are the unbiased scores of the rule (softmax for
// FT_ROUTING_SOFTMAX_TOPK and FT_ROUTING_SOFTMAX_BIASED_TOPK, sigmoid for FT_ROUTING_SIGMOID_GROUP_TOPK, sqrt(softplus) for
// FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK), renormalised to sum 1 unless softmax, times the routed
// scaling factor. Throws FT_ERR_NON_FINITE on NaN logits, FT_ERR_INVALID_ARGUMENT for a token id
// outside [0, vocab) (naming the token) or another rule.
void route_hash(const RoutingSpec &rule, const int32_t *table, int32_t vocab, int32_t num_tokens, const float *logits,
                const int32_t *token_ids, int32_t *ids, float *weights);

}  // namespace ft
