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
    // qwen3_moe, qwen3_5_moe, mixtral, deepseek_v3, kimi_k2, glm4_moe, gpt_oss (mxfp4 only),
    // deepseek_v4 (ds_fp4 only; hash-routed layers and an FP8 shared expert below).
    std::string architecture = "qwen3_moe";
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

    // Expert format (ft::parse_format names), written in the real layout of its releases:
    //   bf16       the tensors above in expert_dtype;
    //   fp8_block  experts.{e}.{gate,up,down}_proj.{weight F8_E4M3, weight_scale_inv [N/128, K/128]}
    //              (and the shared expert likewise), quantization_config quant_method fp8 [128, 128];
    //   nvfp4      ModelOpt: .{weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16], weight_scale_2 F32 [],
    //              input_scale F32 []}, quantization_config modelopt NVFP4 (or hf_quant_config.json);
    //   mxfp4      gpt_oss: experts.{gate_up_proj,down_proj}_{blocks [E, N, K/32, 16], scales [E, N, K/32],
    //              bias [E, N] BF16}, mlp.router.{weight,bias};
    //   ds_fp4     deepseek_v4: layers.{l}.ffn.experts.{e}.{w1,w3,w2}.{weight I8 [N, K/2], scale [N, K/32]};
    //   q4_0       GGUF only (write_gguf).
    // Scales are drawn from ranges real quantisers produce (no e4m3 NaN, no e8m0 255).
    std::string format = "bf16";
    std::string fp8_scale_dtype = "F32";   // weight_scale_inv: F32 (DeepSeek-V3) or BF16 (Qwen3.5-FP8)
    std::string e8m0_dtype = "F8_E8M0";    // ds_fp4 scales: F8_E8M0 or U8
    // deepseek_v4: decoder layers [0, hash_layers) route by token id and carry
    // ffn.gate.tid2eid [vocab_size, top_k] (random ids < num_experts, in tid2eid_dtype: I32 or
    // I64) instead of gate.bias. A shared expert (shared_intermediate > 0, a multiple of
    // intermediate; hidden and shared_intermediate multiples of 128) is written as
    // ffn.shared_experts.{w1,w3,w2}.{weight F8_E4M3, scale [N/128, K/128] in ds_shared_scale_dtype:
    // F8_E8M0, F32 or BF16}.
    int hash_layers = 0;
    int vocab_size = 16;
    std::string tid2eid_dtype = "I32";
    std::string ds_shared_scale_dtype = "F8_E8M0";
    bool declare_quantization = true;      // write quantization_config (false: only the tensors tell)
    bool hf_quant_config_file = false;     // nvfp4: declare in hf_quant_config.json instead
    bool drop_weight_scale_2 = false;      // nvfp4: omit weight_scale_2 (a malformed export, for tests)

    // GGUF (write_gguf): gguf must be true so the accessors agree on the layer numbering
    // (first_dense = leading_dense_block_count). Experts are of the ggml type of `format`: q4_0,
    // q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs (blocks along K, so H and I multiples of the
    // block), mxfp4 (ggml MXFP4 blocks of 32 with F32 biases, gpt-oss style) or bf16 (expert_dtype:
    // BF16, F16 or F32 tensors).
    bool gguf = false;
    std::string gguf_arch = "qwen3moe";    // general.architecture
    bool gguf_fused_gate_up = false;       // blk.{l}.ffn_gate_up_exps.weight instead of gate + up
    // Per MoE layer (cycled when shorter) "GATEUP/DOWN" block format names, e.g. "q4_k/q6_k";
    // empty: `format` for every matrix.
    std::vector<std::string> gguf_mix;
    int gguf_splits = 1;                   // > 1: NAME-0000k-of-0000N.gguf parts (gguf_part_path)
    // Shared experts (shared_intermediate > 0): blk.{l}.ffn_{gate,up,down}_shexp.weight in this
    // format's type ("" = the layer's gate/up format when it is a block format, else expert_dtype),
    // plus ffn_gate_inp_shexp.weight [H] (F32) when gguf_shared_gate.
    std::string gguf_shared_format;
    bool gguf_shared_gate = false;
    uint32_t gguf_alignment = 32;          // written as general.alignment when not 32
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
// Shared expert projection as bf16 after rounding ([Is, H] gate/up, [H, Is] down); GGUF block
// and MXFP4 types dequantised by the reference, then rounded.
std::vector<uint16_t> shared_weight(const Spec &s, int moe_layer, int proj);
// Qwen3.5's shared_expert_gate [1, H] (bf16 bits).
std::vector<uint16_t> shared_gate_weight(const Spec &s, int moe_layer);
// deepseek_v4: the tid2eid table [vocab_size, top_k] of MoE layer `moe_layer` (a hash-routed
// layer), as written.
std::vector<int32_t> tid2eid(const Spec &s, int moe_layer);

// ---- any format ------------------------------------------------------------------------------
// The exact bytes the loader must place in bank `bank` (a name of ft::bank_schema(format)) for
// `expert` of MoE layer `moe_layer`: computed from what was written, re-laid-out by docs/formats.md's
// rules (fusion by rows, mxfp4 transposition, nvfp4 global broadcast), independently of the loader.
std::vector<uint8_t> bank_row(const Spec &s, int moe_layer, int expert, const std::string &bank);
// The dequantised weights of one projection ([I, H] gate/up, [H, I] down), by the scalar
// reference (ft::dequant_projection) over bank_row.
std::vector<float> expert_dequant(const Spec &s, int moe_layer, int expert, int proj);
// mxfp4 biases of one projection ([I] gate/up, [H] down); empty for formats without biases.
std::vector<float> expert_bias(const Spec &s, int moe_layer, int expert, int proj);

// ---- GGUF files -------------------------------------------------------------------------------

// Builds GGUF v3 files byte by byte, with every field reachable so tests can write valid files
// and then break exactly one thing. Values are little-endian.
class GgufWriter {
public:
    // Metadata. `type` is the GGUF value type id; the value bytes are written as given.
    void kv_raw(const std::string &key, uint32_t type, const std::vector<uint8_t> &value);
    void kv_u32(const std::string &key, uint32_t v);
    void kv_i32(const std::string &key, int32_t v);
    void kv_u64(const std::string &key, uint64_t v);
    void kv_f32(const std::string &key, float v);
    void kv_f64(const std::string &key, double v);
    void kv_bool(const std::string &key, bool v);
    void kv_string(const std::string &key, const std::string &v);
    void kv_strings(const std::string &key, const std::vector<std::string> &v);  // array of strings
    void kv_f32s(const std::string &key, const std::vector<float> &v);           // array of float32
    // A tensor; dims innermost first (ggml order), data placed at the next aligned offset.
    void tensor(const std::string &name, const std::vector<uint64_t> &dims, uint32_t ggml_type,
                std::vector<uint8_t> data);
    void set_alignment(uint32_t a) { alignment_ = a; }  // layout only; add general.alignment yourself

    // File offsets of fields in the built file, for tests that corrupt one of them.
    struct Layout {
        std::vector<uint64_t> key_pos;       // per kv: its key length field
        std::vector<uint64_t> info_pos;      // per tensor: its name length field
        std::vector<uint64_t> n_dims_pos, dims_pos, type_pos, offset_pos;  // per tensor
        uint64_t data_start = 0;
    };
    std::vector<uint8_t> build(Layout *layout = nullptr) const;
    void write(const std::string &path, Layout *layout = nullptr) const;

private:
    struct Kv {
        std::string key;
        uint32_t type;
        std::vector<uint8_t> value;
    };
    struct Tensor {
        std::string name;
        std::vector<uint64_t> dims;
        uint32_t type;
        std::vector<uint8_t> data;
    };
    std::vector<Kv> kvs_;
    std::vector<Tensor> tensors_;
    uint32_t alignment_ = 32;
};

// Writes a GGUF MoE model for `s` (s.gguf must be true): general.architecture = s.gguf_arch and
// its block_count, embedding_length, expert_count, expert_used_count, expert_feed_forward_length,
// leading_dense_block_count, expert_weights_norm keys; routed experts per MoE layer
// (blk.{l}.ffn_{gate,up,down}_exps.weight or ffn_gate_up_exps) in Q4_0 or bf16/f16/f32,
// routers blk.{l}.ffn_gate_inp.weight (BF16), plus a few unrelated tensors and metadata arrays as
// real files carry. Throws ft::Error.
// With s.gguf_splits > 1 the model goes into gguf_part_path(path, k, n) for k = 1..n (llama.cpp's
// gguf-split layout: all metadata in part 1, split.no / split.count / split.tensors.count in every
// part, the tensors spread in order).
void write_gguf(const std::string &path, const Spec &s);
// "dir/model.gguf", part 2 of 3 -> "dir/model-00002-of-00003.gguf".
std::string gguf_part_path(const std::string &path, int part, int parts);

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
