#include "ft/safetensors.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "ft/common.hpp"
#include "ft/json_limits.hpp"

namespace ft {

namespace {

// Headers of real checkpoints are a few MB at most (DeepSeek-V3 shards: ~100 KB); anything
// larger is corrupt and would only make us allocate and parse garbage.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DtypeEntry {
    const char *name;
    StDtype dtype;
    size_t size;
};

constexpr DtypeEntry kDtypes[] = {
    {"BF16", StDtype::BF16, 2},       {"F16", StDtype::F16, 2},         {"F32", StDtype::F32, 4},
    {"F64", StDtype::F64, 8},         {"I8", StDtype::I8, 1},           {"U8", StDtype::U8, 1},
    {"I16", StDtype::I16, 2},         {"I32", StDtype::I32, 4},         {"I64", StDtype::I64, 8},
    {"F8_E4M3", StDtype::F8_E4M3, 1}, {"F8_E5M2", StDtype::F8_E5M2, 1}, {"BOOL", StDtype::BOOL, 1},
    {"F8_E8M0", StDtype::F8_E8M0, 1},
};

std::string errno_text() { return std::strerror(errno); }

bool is_regular_file(const std::string &path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Reads a small text file (JSON) whole. FT_ERR_IO if it cannot be read.
std::string read_text_file(const std::string &path) {
    check_file_size(path, limits::kMaxJsonFileBytes);
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(FT_ERR_IO, path, ": cannot open: ", errno_text());
    std::ostringstream os;
    os << in.rdbuf();
    if (in.bad()) fail(FT_ERR_IO, path, ": read error");
    return os.str();
}

}  // namespace

const char *st_dtype_name(StDtype d) {
    for (const DtypeEntry &e : kDtypes)
        if (e.dtype == d) return e.name;
    return "?";
}

size_t st_dtype_size(StDtype d) {
    for (const DtypeEntry &e : kDtypes)
        if (e.dtype == d) return e.size;
    return 0;
}

bool st_dtype_parse(const std::string &name, StDtype *out) {
    for (const DtypeEntry &e : kDtypes) {
        if (name == e.name) {
            *out = e.dtype;
            return true;
        }
    }
    return false;
}

// ---- SafetensorsFile ------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(FT_ERR_IO, path_, ": cannot open: ", errno_text());
    try {
        struct stat st;
        if (::fstat(fd_, &st) != 0) fail(FT_ERR_IO, path_, ": cannot stat: ", errno_text());
        if (!S_ISREG(st.st_mode)) fail(FT_ERR_IO, path_, ": not a regular file");
        size_ = static_cast<uint64_t>(st.st_size);
        if (size_ < 8) fail(FT_ERR_FORMAT, path_, ": file is ", size_, " bytes, too short for a safetensors header");
        void *p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
        if (p == MAP_FAILED) fail(FT_ERR_IO, path_, ": cannot map: ", errno_text());
        map_ = static_cast<uint8_t *>(p);

        uint64_t header_len = 0;
        for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | map_[i];
        if (header_len > kMaxHeaderBytes)
            fail(FT_ERR_FORMAT, path_, ": header length ", header_len, " is larger than the ",
                 kMaxHeaderBytes, "-byte limit");
        if (header_len > size_ - 8)
            fail(FT_ERR_FORMAT, path_, ": header length ", header_len, " runs past the end of the ",
                 size_, "-byte file");
        parse_header(header_len);
    } catch (...) {
        if (map_) ::munmap(map_, size_);
        ::close(fd_);
        throw;
    }
}

SafetensorsFile::~SafetensorsFile() {
    if (map_) ::munmap(map_, size_);
    if (fd_ >= 0) ::close(fd_);
}

void SafetensorsFile::parse_header(uint64_t header_len) {
    using nlohmann::json;
    const char *text = reinterpret_cast<const char *>(map_ + 8);
    json header;
    try {
        header = json::parse(text, text + header_len, json_depth_guard<json>(path_ + ": header"));
    } catch (const json::exception &e) {
        fail(FT_ERR_FORMAT, path_, ": header is not valid JSON: ", e.what());
    }
    if (!header.is_object()) fail(FT_ERR_FORMAT, path_, ": header is not a JSON object");

    const uint64_t data_start = 8 + header_len;
    const uint64_t data_size = size_ - data_start;
    tensors_.reserve(header.size());
    for (auto it = header.begin(); it != header.end(); ++it) {
        const std::string &name = it.key();
        const json &v = it.value();
        if (name == "__metadata__") {
            if (!v.is_object()) fail(FT_ERR_FORMAT, path_, ": __metadata__ is not a JSON object");
            for (auto m = v.begin(); m != v.end(); ++m)
                if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
            continue;
        }
        auto bad = [&](auto &&...what) {
            fail(FT_ERR_FORMAT, path_, ": tensor '", name, "': ", std::forward<decltype(what)>(what)...);
        };
        if (!v.is_object()) bad("entry is not a JSON object");

        TensorInfo t;
        t.name = name;
        auto dt = v.find("dtype");
        if (dt == v.end() || !dt->is_string()) bad("missing or non-string 'dtype'");
        if (!st_dtype_parse(dt->get<std::string>(), &t.dtype)) bad("unknown dtype '", dt->get<std::string>(), "'");

        auto sh = v.find("shape");
        if (sh == v.end() || !sh->is_array()) bad("missing or non-array 'shape'");
        uint64_t numel = 1;
        for (const json &d : *sh) {
            if (!d.is_number_integer()) bad("shape entry ", json_brief(d), " is not an integer");
            if (d.is_number_unsigned() ? false : d.get<int64_t>() < 0) bad("negative dimension ", json_brief(d), " in shape");
            const uint64_t dim = d.get<uint64_t>();
            if (dim > static_cast<uint64_t>(INT64_MAX) || !mul_fits(numel, dim, &numel))
                bad("shape ", json_brief(*sh), " overflows the element count");
            t.shape.push_back(static_cast<int64_t>(dim));
        }
        t.numel = numel;
        uint64_t expect_bytes = 0;
        if (!mul_fits(numel, st_dtype_size(t.dtype), &expect_bytes))
            bad("shape ", json_brief(*sh), " overflows the byte count");

        auto off = v.find("data_offsets");
        if (off == v.end() || !off->is_array() || off->size() != 2) bad("missing 'data_offsets' [begin, end]");
        for (const json &o : *off)
            if (!o.is_number_unsigned()) bad("data_offsets ", json_brief(*off), " are not non-negative integers");
        t.begin = (*off)[0].get<uint64_t>();
        t.end = (*off)[1].get<uint64_t>();
        if (t.end < t.begin) bad("data_offsets end ", t.end, " is before begin ", t.begin);
        if (t.end > data_size)
            bad("data_offsets [", t.begin, ", ", t.end, "] run past the ", data_size,
                "-byte data section (file truncated?)");
        if (t.end - t.begin != expect_bytes)
            bad("data_offsets span ", t.end - t.begin, " bytes but ", st_dtype_name(t.dtype), " ",
                json_brief(*sh), " needs ", expect_bytes);
        t.file_offset = data_start + t.begin;
        tensors_.push_back(std::move(t));
    }

    std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo &a, const TensorInfo &b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    // Sorted by begin, two non-empty ranges overlap exactly when one starts before the furthest
    // end seen so far; empty tensors occupy no bytes and may sit anywhere.
    const TensorInfo *furthest = nullptr;
    for (const TensorInfo &t : tensors_) {
        if (t.begin == t.end) continue;
        if (furthest && t.begin < furthest->end)
            fail(FT_ERR_FORMAT, path_, ": tensor '", t.name, "': bytes [", t.begin, ", ", t.end,
                 ") overlap tensor '", furthest->name, "' [", furthest->begin, ", ", furthest->end, ")");
        if (!furthest || t.end > furthest->end) furthest = &t;
    }

    names_.reserve(tensors_.size());
    for (size_t i = 0; i < tensors_.size(); ++i) {
        names_.push_back(tensors_[i].name);
        index_.emplace(tensors_[i].name, i);
    }
}

const TensorInfo *SafetensorsFile::find(const std::string &name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---- SafetensorsCheckpoint ------------------------------------------------------------------

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string &dir) : dir_(dir) {
    using nlohmann::json;
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) fail(FT_ERR_IO, dir, ": cannot access checkpoint directory: ", errno_text());
    if (!S_ISDIR(st.st_mode)) fail(FT_ERR_IO, dir, ": not a directory");

    const std::string index_path = dir + "/model.safetensors.index.json";
    if (is_regular_file(index_path)) {
        json index;
        try {
            // Distinct shard names are counted while parsing: each one opened stays mapped, and a
            // hostile index is rejected as soon as it passes the limit, before the rest is parsed.
            const auto depth_ok = json_depth_guard<json>(index_path);
            std::string top_key;
            std::unordered_set<std::string> shard_names;
            index = json::parse(read_text_file(index_path), [&](int depth, json::parse_event_t ev, json &v) {
                if (ev == json::parse_event_t::key && depth == 1) top_key = v.is_string() ? v.get<std::string>() : "";
                if (ev == json::parse_event_t::value && depth == 2 && top_key == "weight_map" && v.is_string() &&
                    shard_names.insert(v.get<std::string>()).second && shard_names.size() > limits::kMaxShards)
                    fail(FT_ERR_FORMAT, index_path, ": weight_map names more than ", limits::kMaxShards,
                         " shard files (the limit)");
                return depth_ok(depth, ev, v);
            });
        } catch (const json::exception &e) {
            fail(FT_ERR_FORMAT, index_path, ": not valid JSON: ", e.what());
        }
        if (!index.is_object()) fail(FT_ERR_FORMAT, index_path, ": not a JSON object");
        auto wm = index.find("weight_map");
        if (wm == index.end() || !wm->is_object())
            fail(FT_ERR_FORMAT, index_path, ": missing or non-object 'weight_map'");
        for (auto it = wm->begin(); it != wm->end(); ++it) {
            const std::string &name = it.key();
            if (!it.value().is_string())
                fail(FT_ERR_FORMAT, index_path, ": weight_map entry '", name, "' is not a file name string");
            const std::string shard = it.value().get<std::string>();
            // Shards must be files of this directory: an index must not make us open files
            // elsewhere (../, absolute paths).
            if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
                shard.find('\\') != std::string::npos || shard.find('\0') != std::string::npos)
                fail(FT_ERR_FORMAT, index_path, ": tensor '", name, "': shard '", shard,
                     "' is not a plain file name inside the checkpoint directory");
            const SafetensorsFile &file = open_shard(shard);
            const TensorInfo *info = file.find(name);
            if (!info)
                fail(FT_ERR_FORMAT, index_path, ": tensor '", name, "' is listed in shard '", shard,
                     "' but that shard does not contain it");
            entries_[name] = Entry{&file, info};
        }
    } else if (is_regular_file(dir + "/model.safetensors")) {
        const SafetensorsFile &file = open_shard("model.safetensors");
        for (const std::string &name : file.names()) entries_[name] = Entry{&file, file.find(name)};
    } else {
        // No index: every *.safetensors file of the directory, in name order.
        std::vector<std::string> shards;
        DIR *d = ::opendir(dir.c_str());
        if (!d) fail(FT_ERR_IO, dir, ": cannot list directory: ", errno_text());
        while (const dirent *e = ::readdir(d)) {
            const std::string n = e->d_name;
            const std::string ext = ".safetensors";
            if (n.size() > ext.size() && n.compare(n.size() - ext.size(), ext.size(), ext) == 0) shards.push_back(n);
        }
        ::closedir(d);
        if (shards.empty())
            fail(FT_ERR_IO, dir, ": no model.safetensors.index.json, model.safetensors or *.safetensors files");
        std::sort(shards.begin(), shards.end());
        for (const std::string &s : shards) {
            const SafetensorsFile &file = open_shard(s);
            for (const std::string &name : file.names()) {
                auto [it, inserted] = entries_.emplace(name, Entry{&file, file.find(name)});
                if (!inserted)
                    fail(FT_ERR_FORMAT, dir, ": tensor '", name, "' is in both ", it->second.file->path(),
                         " and ", file.path(), " and there is no index to choose");
            }
        }
    }

    names_.reserve(entries_.size());
    for (const auto &kv : entries_) names_.push_back(kv.first);
    std::sort(names_.begin(), names_.end());
}

const SafetensorsFile &SafetensorsCheckpoint::open_shard(const std::string &file_name) {
    auto it = file_index_.find(file_name);
    if (it != file_index_.end()) return *files_[it->second];
    const std::string path = dir_ + "/" + file_name;
    if (!is_regular_file(path)) fail(FT_ERR_IO, path, ": shard file is missing");
    files_.push_back(std::make_unique<SafetensorsFile>(path));
    file_index_.emplace(file_name, files_.size() - 1);
    return *files_.back();
}

const SafetensorsCheckpoint::Entry *SafetensorsCheckpoint::find(const std::string &name) const {
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : &it->second;
}

}  // namespace ft
