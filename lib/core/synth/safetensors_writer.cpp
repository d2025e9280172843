// safetensors files: the file helper, the shards of a checkpoint (split by bytes, each with its
// length-prefixed JSON header), and the raw writers tests use to build valid or broken files.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "synth_internal.hpp"

namespace ft::synth {

namespace detail {

File::File(const std::string &path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(FT_ERR_IO, path, ": cannot create: ", std::strerror(errno));
}

File::~File() {
    if (fd_ >= 0) ::close(fd_);
}

void File::write_at(const void *data, size_t bytes, uint64_t offset) const {
    const uint8_t *p = static_cast<const uint8_t *>(data);
    while (bytes > 0) {
        const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail(FT_ERR_IO, path_, ": write failed: ", std::strerror(errno));
        p += n;
        bytes -= static_cast<size_t>(n);
        offset += static_cast<uint64_t>(n);
    }
}

void File::close() {
    if (::close(fd_) != 0) fail(FT_ERR_IO, path_, ": close failed: ", std::strerror(errno));
    fd_ = -1;
}

// Header text padded with spaces to a multiple of 8 so the data section is aligned, as the
// reference writer does.
std::string padded(std::string header) {
    while (header.size() % 8) header += ' ';
    return header;
}

void write_text(const std::string &path, const std::string &text) {
    File f(path);
    f.write_at(text.data(), text.size(), 0);
    f.close();
}

void make_dir(const std::string &dir) {
    std::string partial;
    size_t pos = 0;
    while (pos != std::string::npos) {
        pos = dir.find('/', pos + 1);
        partial = dir.substr(0, pos);
        if (partial.empty()) continue;
        if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
            fail(FT_ERR_IO, partial, ": cannot create directory: ", std::strerror(errno));
    }
}

namespace {

// The 8-byte little-endian header length that starts every safetensors file.
void write_length_prefix(const File &f, uint64_t len) {
    uint8_t prefix[8];
    for (int b = 0; b < 8; ++b) prefix[b] = static_cast<uint8_t>(len >> (8 * b));
    f.write_at(prefix, 8, 0);
}

}  // namespace

// Contiguous runs of tensors per shard, cut by bytes.
ShardPlan plan_shards(const std::vector<TensorDesc> &tensors, int shards) {
    ShardPlan plan;
    for (const TensorDesc &t : tensors) plan.total += t.bytes();
    const size_t n_shards = static_cast<size_t>(shards);
    plan.tensors.resize(n_shards);
    uint64_t acc = 0;
    for (const TensorDesc &t : tensors) {
        const size_t shard = std::min(n_shards - 1, static_cast<size_t>(acc * n_shards / std::max<uint64_t>(plan.total, 1)));
        plan.tensors[shard].push_back(&t);
        acc += t.bytes();
    }
    for (size_t i = 0; i < n_shards; ++i) {
        if (n_shards == 1) {
            plan.names.push_back("model.safetensors");
        } else {
            char buf[64];
            std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n_shards);
            plan.names.push_back(buf);
        }
    }
    return plan;
}

std::vector<std::unique_ptr<File>> write_shard_headers(const std::string &dir, const ShardPlan &plan,
                                                       std::vector<Placed> &placed, ordered_json &weight_map) {
    std::vector<std::unique_ptr<File>> files;
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
        ordered_json header;
        header["__metadata__"] = {{"format", "pt"}};
        uint64_t off = 0;
        for (const TensorDesc *t : plan.tensors[i]) {
            const uint64_t bytes = t->bytes();
            header[t->name] = {{"dtype", t->elem_dtype()}, {"shape", t->shape}, {"data_offsets", {off, off + bytes}}};
            off += bytes;
            weight_map[t->name] = plan.names[i];
        }
        const std::string text = padded(header.dump());
        files.push_back(std::make_unique<File>(dir + "/" + plan.names[i]));
        write_length_prefix(*files.back(), text.size());
        files.back()->write_at(text.data(), text.size(), 8);
        uint64_t data_off = 8 + text.size();
        for (const TensorDesc *t : plan.tensors[i]) {
            placed.push_back({t, i, data_off});
            data_off += t->bytes();
        }
    }
    return files;
}

}  // namespace detail

using namespace detail;

void write_safetensors(const std::string &path, const std::vector<RawTensor> &tensors) {
    ordered_json header = ordered_json::object();
    uint64_t off = 0;
    for (const RawTensor &t : tensors) {
        header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
        off += t.bytes.size();
    }
    std::vector<uint8_t> data;
    data.reserve(off);
    for (const RawTensor &t : tensors) data.insert(data.end(), t.bytes.begin(), t.bytes.end());
    write_raw_header(path, padded(header.dump()), data);
}

void write_raw_header(const std::string &path, const std::string &header, const std::vector<uint8_t> &data,
                      int64_t declared_length) {
    const uint64_t len = declared_length >= 0 ? static_cast<uint64_t>(declared_length) : header.size();
    File f(path);
    write_length_prefix(f, len);
    f.write_at(header.data(), header.size(), 8);
    if (!data.empty()) f.write_at(data.data(), data.size(), 8 + header.size());
    f.close();
}

}  // namespace ft::synth
