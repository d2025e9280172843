// Reading safetensors files and Hugging Face checkpoint directories.
//
// A safetensors file is: u64 little-endian header length N, N bytes of JSON describing each
// tensor (dtype, shape, [begin, end) offsets into the data section), then the data section.
// SafetensorsFile maps the file read-only and checks every claim the header makes before anything
// is read, so that a corrupt or hostile file ends in FT_ERR_FORMAT naming the file and tensor,
// never in an out-of-bounds read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace ft {

// F8_E8M0 is the pure-exponent scale type of MX formats (DeepSeek-V4 scales).
enum class StDtype : int32_t { BF16, F16, F32, F64, I8, U8, I16, I32, I64, F8_E4M3, F8_E5M2, BOOL, F8_E8M0 };

const char *st_dtype_name(StDtype d);
size_t st_dtype_size(StDtype d);
// False for names safetensors does not define (the caller reports the tensor).
bool st_dtype_parse(const std::string &name, StDtype *out);

struct TensorInfo {
    std::string name;
    StDtype dtype = StDtype::U8;
    std::vector<int64_t> shape;
    uint64_t numel = 0;
    uint64_t begin = 0;        // offsets into the data section, as in the header
    uint64_t end = 0;
    uint64_t file_offset = 0;  // absolute offset of the first byte in the file

    uint64_t nbytes() const { return end - begin; }
};

class SafetensorsFile {
public:
    // Opens and validates `path`. FT_ERR_IO if it cannot be opened or mapped, FT_ERR_FORMAT for
    // anything wrong in the header (the message names the file and, where there is one, the tensor).
    explicit SafetensorsFile(std::string path);
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile &) = delete;
    SafetensorsFile &operator=(const SafetensorsFile &) = delete;

    const std::string &path() const { return path_; }
    uint64_t file_size() const { return size_; }
    int fd() const { return fd_; }

    // Tensor names in data order (increasing begin offset).
    const std::vector<std::string> &names() const { return names_; }
    // nullptr when the file has no such tensor.
    const TensorInfo *find(const std::string &name) const;
    // The tensor's bytes inside the read-only mapping (valid while this object lives).
    const uint8_t *data(const TensorInfo &t) const { return map_ + t.file_offset; }
    // The whole file, mapped read-only (file_size() bytes).
    const uint8_t *mapping() const { return map_; }
    // __metadata__ entries whose values are strings.
    const std::unordered_map<std::string, std::string> &metadata() const { return metadata_; }

private:
    void parse_header(uint64_t header_len);

    std::string path_;
    int fd_ = -1;
    uint8_t *map_ = nullptr;
    uint64_t size_ = 0;
    std::vector<TensorInfo> tensors_;  // sorted by begin
    std::vector<std::string> names_;
    std::unordered_map<std::string, size_t> index_;
    std::unordered_map<std::string, std::string> metadata_;
};

// A checkpoint directory: model.safetensors.index.json with its shards, a single
// model.safetensors, or (without either) every *.safetensors file in the directory.
class SafetensorsCheckpoint {
public:
    struct Entry {
        const SafetensorsFile *file = nullptr;
        const TensorInfo *info = nullptr;
    };

    // FT_ERR_IO for a missing directory or shard (named), FT_ERR_FORMAT for a malformed index,
    // a shard name that leaves the directory, or a listed tensor its shard lacks.
    explicit SafetensorsCheckpoint(const std::string &dir);

    const std::string &dir() const { return dir_; }
    // nullptr when no file holds `name`.
    const Entry *find(const std::string &name) const;
    bool contains(const std::string &name) const { return find(name) != nullptr; }
    // Every tensor name, sorted.
    const std::vector<std::string> &names() const { return names_; }
    size_t num_files() const { return files_.size(); }
    const SafetensorsFile &file(size_t i) const { return *files_[i]; }

private:
    const SafetensorsFile &open_shard(const std::string &file_name);

    std::string dir_;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::unordered_map<std::string, size_t> file_index_;  // shard file name -> files_ index
    std::unordered_map<std::string, Entry> entries_;
    std::vector<std::string> names_;
};

}  // namespace ft
