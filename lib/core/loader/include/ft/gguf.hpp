// Reading GGUF files (version 3, as llama.cpp writes them).
//
// Layout (all integers little-endian): "GGUF" magic, u32 version, u64 tensor count, u64 metadata
// count; then the metadata key/value pairs (key: u64 length + UTF-8 bytes; u32 value type; value);
// then one info per tensor (name string, u32 n_dims <= 4, u64 dims[n_dims] with dims[0] the
// innermost, contiguous one; u32 ggml type; u64 offset into the data section); then padding up
// to `general.alignment` (default 32), then the data section. Each tensor's offset is a multiple
// of the alignment.
//
// GgufFile maps the file read-only and validates every count, length, offset and size against
// the file before anything else uses it: a truncated or hostile file ends in FT_ERR_FORMAT naming
// the file and the field or tensor, never in an out-of-bounds read or an allocation sized by an
// unchecked count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ft/model.hpp"

namespace ft {

// GGUF metadata value types (fixed by the format).
enum class GgufType : uint32_t {
    u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
    u64 = 10, i64 = 11, f64 = 12,
};

// ggml tensor types FreeToken knows the block geometry of (every type llama.cpp has shipped
// files with; ids of removed types are unknown and rejected).
namespace ggml_type {
constexpr uint32_t F32 = 0, F16 = 1, Q4_0 = 2, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14,
                   IQ4_XS = 23, BF16 = 30, MXFP4 = 39;
}
// Name of a ggml type ("Q4_0"), or nullptr for an id no ggml release defines.
const char *ggml_type_name(uint32_t type);
// Elements per block and bytes per block; false for unknown ids.
bool ggml_type_geometry(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);

struct GgufValue {
    GgufType type = GgufType::u8;
    // Scalars: integers in i / u (both filled when representable), floats in f, bools in u.
    int64_t i = 0;
    uint64_t u = 0;
    double f = 0.0;
    std::string s;                    // type string
    GgufType elem_type = GgufType::u8;  // type array: element type (never array: nested arrays are rejected)
    uint64_t count = 0;               // type array: element count
    uint64_t data_offset = 0;         // type array: file offset of the first element (not materialised)

    bool is_integer() const;
};

class GgufFile;

struct GgufTensorInfo {
    std::string name;
    std::vector<uint64_t> dims;  // dims[0] innermost (ggml ne[0])
    uint32_t type = 0;
    uint64_t offset = 0;         // relative to the data section, as stored
    uint64_t file_offset = 0;    // absolute
    uint64_t numel = 0;
    uint64_t nbytes = 0;
    const GgufFile *part = nullptr;  // the file (split part) holding the bytes
};

class GgufFile {
public:
    // Opens and validates `path`. FT_ERR_IO if it cannot be opened or mapped, FT_ERR_FORMAT for
    // anything malformed (the message names the file and the field or tensor).
    explicit GgufFile(std::string path);
    ~GgufFile();
    GgufFile(const GgufFile &) = delete;
    GgufFile &operator=(const GgufFile &) = delete;

    const std::string &path() const { return path_; }
    int fd() const { return fd_; }
    const uint8_t *mapping() const { return map_; }
    uint64_t file_size() const { return size_; }
    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_start_; }

    // Every tensor, across the split parts attached to this (the first) file.
    const std::vector<GgufTensorInfo> &tensors() const { return tensors_; }
    const GgufTensorInfo *find_tensor(const std::string &name) const;
    const GgufValue *find(const std::string &key) const;
    const std::vector<std::string> &keys() const { return keys_; }

    // Typed metadata access; FT_ERR_FORMAT naming the key when present with the wrong type,
    // out of range, or (req_*) missing.
    uint64_t req_uint(const std::string &key) const;
    uint64_t opt_uint(const std::string &key, uint64_t def) const;
    double opt_float(const std::string &key, double def) const;
    bool opt_bool(const std::string &key, bool def) const;
    std::string req_string(const std::string &key) const;

    // Split sets: the further parts whose tensors this file lists (empty for a single file).
    const std::vector<std::unique_ptr<GgufFile>> &parts() const { return parts_; }
    // Adds the tensors of `part` (FT_ERR_FORMAT if a name is already present) and keeps it open.
    void attach_part(std::unique_ptr<GgufFile> part);

private:
    void parse();

    std::string path_;
    int fd_ = -1;
    uint8_t *map_ = nullptr;
    uint64_t size_ = 0;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t data_start_ = 0;
    std::vector<std::string> keys_;
    std::unordered_map<std::string, GgufValue> kv_;
    std::vector<GgufTensorInfo> tensors_;
    std::unordered_map<std::string, size_t> tensor_index_;
    std::vector<std::unique_ptr<GgufFile>> parts_;
};

// Opens a GGUF model given as one file or as the first part of a split set
// (NAME-00001-of-0000N.gguf, llama.cpp's gguf-split naming and its metadata split.no (0-based),
// split.count, split.tensors.count). Every part is parsed with the same checks and attached to
// the first, so its tensors() and find_tensor() see the whole model; metadata is the first
// part's. FT_ERR_FORMAT / FT_ERR_IO naming the part for a missing part, counts that disagree or a
// tensor in two parts.
std::unique_ptr<GgufFile> open_gguf_model(const std::string &path);

// The model file of a directory holding the .gguf files `names` (file names, no directory): the
// one file, or the first part of the one split set they form. FT_ERR_UNSUPPORTED when they are
// several unrelated files or several split sets.
std::string gguf_directory_model(const std::string &dir, std::vector<std::string> names);

// Model geometry and routing from a GGUF file's metadata. general.architecture picks the family
// (supported_gguf_architectures(); docs/architectures.md has the table): its routing rule,
// activation and shared-expert gate, with spec.architecture set to the matching config.json
// model_type where one exists. Under the architecture's prefix: block_count, embedding_length,
// expert_count, expert_used_count, expert_feed_forward_length (else the ffn_down_exps rows),
// optional leading_dense_block_count, nextn_predict_layers (trailing MTP layers, not decoder
// layers), expert_gating_func (1 softmax, 2 sigmoid; only where the family reads it),
// expert_weights_norm, expert_weights_scale, expert_group_count, expert_group_used_count,
// expert_shared_feed_forward_length / expert_shared_count (the shared expert's width).
// MoE layers are the layers holding blk.{l}.ffn_gate_exps.weight or ffn_gate_up_exps.weight;
// the formats come from those tensors, per matrix and layer when they differ
// (gguf_expert_formats; docs/gguf.md). FT_ERR_UNSUPPORTED for a model without experts, an
// unknown architecture (the message lists the supported ones), routing metadata the family's
// rule cannot serve (named) or an expert type that is not read (naming the tensor); FT_ERR_FORMAT
// names a missing or bad key.
ModelSpec read_gguf_config(const GgufFile &file);

// The general.architecture values read_gguf_config accepts, in the order its error message lists them.
std::vector<std::string> supported_gguf_architectures();

}  // namespace ft
