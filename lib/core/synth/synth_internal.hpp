// What the synthetic-checkpoint writers share: the seeded values, the quantised byte classes, the
// tensor list of a spec, the config.json text, and the file helpers. Private to lib/core/synth.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "ft/formats.hpp"
#include "ft/synth.hpp"

namespace ft::synth::detail {

using nlohmann::ordered_json;

// ---- values (values.cpp) ---------------------------------------------------------------------

inline uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// What a tensor holds; with the checkpoint layer and expert it seeds the values.
enum Kind : uint64_t {
    kGate = 1, kUp, kDown, kRouter, kBias, kSharedGate, kSharedUp, kSharedDown, kSharedGateProj,
    kDenseGate, kDenseUp, kDenseDown, kOther,
    // Quantised formats: block scales and per-tensor globals of gate / up / down (and of the shared
    // expert), gpt-oss's fused blocks / scales / biases.
    kGateScale, kUpScale, kDownScale, kGateGlobal, kUpGlobal, kDownGlobal,
    kGateUpBlocks, kGateUpScales, kGateUpBias, kDownBlocks, kDownScales, kDownBias,
    kSharedGateScale, kSharedUpScale, kSharedDownScale,
    kTid2eid,  // deepseek_v4 hash-routed layers
};

inline uint64_t tensor_key(const Spec &s, int layer, Kind kind, int expert) {
    const uint64_t id = (static_cast<uint64_t>(static_cast<uint32_t>(layer)) << 40) ^ (static_cast<uint64_t>(kind) << 32) ^
                        static_cast<uint32_t>(expert);
    return splitmix64(s.seed ^ splitmix64(id));
}

// Element `index` of the tensor with `key`: uniform in (-scale, scale), never exactly zero.
inline float value(uint64_t key, uint64_t index, float scale) {
    const uint64_t z = splitmix64(key + index * 0x9e3779b97f4a7c15ull);
    const float u = (static_cast<float>(z >> 40) + 0.5f) * (2.0f / 16777216.0f) - 1.0f;
    return u * scale;
}

enum class Dtype { bf16, f16, f32 };

Dtype parse_dtype(const std::string &d);
const char *dtype_name(Dtype d);
size_t dtype_size(Dtype d);
// The bf16 a loader gets from a value stored as `d`.
uint16_t stored_as_bf16(float v, Dtype d);
void store(float v, Dtype d, uint8_t *out);

// Raw bytes of quantised tensors, element i of the tensor with `key`. Every class avoids codes a
// real quantiser never writes (e4m3 NaN, e8m0 255) and keeps scales in a range where the
// dequantised weights are of the usual magnitude; nothing is zero by construction.
inline uint64_t rnd(uint64_t key, uint64_t index) { return splitmix64(key + index * 0x9e3779b97f4a7c15ull); }
uint8_t any_byte(uint64_t key, uint64_t i);
uint8_t fp8_weight_byte(uint64_t key, uint64_t i);   // any finite e4m3 code
uint8_t e4m3_scale_byte(uint64_t key, uint64_t i);   // positive e4m3, 2^-3 .. 2^3
uint8_t e8m0_byte(uint64_t key, uint64_t i);         // 2^-8 .. 2^1
float fp8_scale_inv(uint64_t key, uint64_t i);       // (1 + m/8) * 2^-(8..11)
uint8_t ds_shared_scale_byte(uint64_t key, uint64_t i);  // e8m0 2^-7 .. 2^-4
int32_t tid2eid_value(const Spec &s, int layer, uint64_t i);  // element i of the table, < num_experts
float nvfp4_global(uint64_t key);                    // normal fp16 in [2^-10, 2^-6)
uint8_t q4_0_byte(uint64_t key, uint64_t i);         // runs of 18-byte q4_0 blocks

using ByteFn = uint8_t (*)(uint64_t, uint64_t);
// Runs of blocks of a GGUF block format (ft::format_is_block): random bytes with finite, normal
// fp16 scales of a usual magnitude. Throws for other formats.
ByteFn block_byte_fn(Format f);
uint8_t ggml_mxfp4_byte(uint64_t key, uint64_t i);   // runs of 17-byte ggml MXFP4 blocks
// The formats of MoE layer `moe_layer` of a GGUF spec (Spec::gguf_mix, else format for both).
struct MatrixFormats {
    Format gate_up, down;
};
MatrixFormats gguf_layer_formats(const Spec &s, int moe_layer);
// The format of the GGUF shared-expert tensors of MoE layer `moe_layer` (Spec::gguf_shared_format).
Format gguf_shared_format(const Spec &s, int moe_layer);
void fill_bytes(ByteFn fn, uint64_t key, uint64_t first, uint64_t count, uint8_t *out);
std::vector<uint8_t> bytes_of(ByteFn fn, uint64_t key, uint64_t first, uint64_t count);
void append(std::vector<uint8_t> &dst, const std::vector<uint8_t> &src);
void append_u16(std::vector<uint8_t> &dst, uint16_t v);

// ---- tensors (names.cpp) ---------------------------------------------------------------------

// How stored element g maps to a logical matrix element. `plain`: element g of one matrix.
// The fused layouts hold every expert: [E, 2I, H] (gate rows then up rows), [E, H, 2I],
// [E, H, I] and [E, I, H].
enum class Mode { plain, gate_up, gate_up_t, down, down_t };

struct TensorDesc {
    std::string name;
    Dtype dtype = Dtype::bf16;
    std::vector<int64_t> shape;
    Mode mode = Mode::plain;
    int layer = 0;        // checkpoint layer (seeding)
    Kind kind = kOther;   // plain only
    int expert = 0;       // plain only
    float scale = 1.0f;   // plain only
    // Raw tensors (quantised formats): `raw_dtype` goes in the header, `raw` fills elements
    // [first, first + count) as bytes (raw_es bytes per element).
    std::string raw_dtype;
    size_t raw_es = 1;
    std::function<void(uint64_t first, uint64_t count, uint8_t *out)> raw;
    size_t elem_size() const { return raw ? raw_es : dtype_size(dtype); }
    const char *elem_dtype() const { return raw ? raw_dtype.c_str() : dtype_name(dtype); }
    uint64_t numel() const {
        uint64_t n = 1;
        for (int64_t d : shape) n *= static_cast<uint64_t>(d);
        return n;
    }
    uint64_t bytes() const { return numel() * elem_size(); }
};

// Fills out[0, count) with the values of elements [first, first + count) of t (values.cpp).
void generate(const Spec &s, const TensorDesc &t, uint64_t first, uint64_t count, float *out);

// Throws FT_ERR_INVALID_ARGUMENT for an unknown architecture or an inconsistent spec.
void check_spec(const Spec &s);
// Every tensor of the checkpoint, in file order, with the real release's names.
std::vector<TensorDesc> all_tensors(const Spec &s);

// ---- config.json (config_writer.cpp) ---------------------------------------------------------

ordered_json config_json(const Spec &s);
// nvfp4 declared in hf_quant_config.json instead of config.json: that file's text, else empty.
std::string hf_quant_config_text(const Spec &s);

// ---- files (safetensors_writer.cpp) ----------------------------------------------------------

class File {
public:
    explicit File(const std::string &path);
    ~File();
    File(const File &) = delete;
    File &operator=(const File &) = delete;
    void write_at(const void *data, size_t bytes, uint64_t offset) const;
    void close();

private:
    std::string path_;
    int fd_ = -1;
};

// Header text padded with spaces to a multiple of 8 so the data section is aligned.
std::string padded(std::string header);
void write_text(const std::string &path, const std::string &text);
void make_dir(const std::string &dir);

// The shards of a checkpoint: their file names and the tensors each holds, in order.
struct ShardPlan {
    std::vector<std::string> names;
    std::vector<std::vector<const TensorDesc *>> tensors;
    uint64_t total = 0;  // bytes of tensor data over all shards
};
ShardPlan plan_shards(const std::vector<TensorDesc> &tensors, int shards);

// Where one tensor's data starts: shard index and absolute file offset.
struct Placed {
    const TensorDesc *t;
    size_t shard;
    uint64_t offset;
};
// Creates each shard file in `dir` and writes its length prefix and header; returns the open
// files, the data offset of every tensor, and (through weight_map) the shard of each tensor name.
std::vector<std::unique_ptr<File>> write_shard_headers(const std::string &dir, const ShardPlan &plan,
                                                       std::vector<Placed> &placed, ordered_json &weight_map);

}  // namespace ft::synth::detail
