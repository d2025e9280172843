#include "ft/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "ft/common.hpp"

namespace ft {

namespace {

// Strings longer than this are corrupt: the longest real ones (chat templates) are ~100 KB. The
// cap keeps a lying length from allocating up to the file size.
constexpr uint64_t kMaxString = 16ull << 20;
// ggml's own tensor names are at most 63 bytes; allow more, but not a megabyte.
constexpr uint64_t kMaxTensorName = 4096;
constexpr uint64_t kMaxAlignment = 1ull << 30;

struct GgmlTypeEntry {
    uint32_t id;
    const char *name;
    uint32_t block_elems, block_bytes;
};

// Block geometry of every ggml type id that files in the wild use (ids 4, 5, 31-33 and 36-38
// belonged to types that were removed; they are unknown here).
constexpr GgmlTypeEntry kGgmlTypes[] = {
    {0, "F32", 1, 4},          {1, "F16", 1, 2},          {2, "Q4_0", 32, 18},       {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},       {7, "Q5_1", 32, 24},       {8, "Q8_0", 32, 34},       {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},     {11, "Q3_K", 256, 110},    {12, "Q4_K", 256, 144},    {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},    {15, "Q8_K", 256, 292},    {16, "IQ2_XXS", 256, 66},  {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98},  {19, "IQ1_S", 256, 50},    {20, "IQ4_NL", 32, 18},    {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},    {23, "IQ4_XS", 256, 136},  {24, "I8", 1, 1},          {25, "I16", 1, 2},
    {26, "I32", 1, 4},         {27, "I64", 1, 8},         {28, "F64", 1, 8},         {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},        {34, "TQ1_0", 256, 54},    {35, "TQ2_0", 256, 66},    {39, "MXFP4", 32, 17},
};

const GgmlTypeEntry *ggml_entry(uint32_t id) {
    for (const GgmlTypeEntry &e : kGgmlTypes)
        if (e.id == id) return &e;
    return nullptr;
}

const char *value_type_name(GgufType t) {
    switch (t) {
        case GgufType::u8: return "uint8";
        case GgufType::i8: return "int8";
        case GgufType::u16: return "uint16";
        case GgufType::i16: return "int16";
        case GgufType::u32: return "uint32";
        case GgufType::i32: return "int32";
        case GgufType::f32: return "float32";
        case GgufType::boolean: return "bool";
        case GgufType::string: return "string";
        case GgufType::array: return "array";
        case GgufType::u64: return "uint64";
        case GgufType::i64: return "int64";
        case GgufType::f64: return "float64";
    }
    return "?";
}

// Bytes of a fixed-size value type; 0 for string and array.
uint64_t fixed_size(GgufType t) {
    switch (t) {
        case GgufType::u8: case GgufType::i8: case GgufType::boolean: return 1;
        case GgufType::u16: case GgufType::i16: return 2;
        case GgufType::u32: case GgufType::i32: case GgufType::f32: return 4;
        case GgufType::u64: case GgufType::i64: case GgufType::f64: return 8;
        default: return 0;
    }
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::f64); }

// A bounds-checked little-endian reader over the mapping. `what` names the field being read for
// the error message.
class Cursor {
public:
    Cursor(const std::string &path, const uint8_t *data, uint64_t size) : path_(path), data_(data), size_(size) {}

    uint64_t pos() const { return pos_; }
    uint64_t left() const { return size_ - pos_; }

    void need(uint64_t n, const std::string &what) const {
        if (n > left())
            fail(FT_ERR_FORMAT, path_, ": ", what, " at offset ", pos_, " needs ", n, " bytes but only ", left(),
                 " remain (file truncated?)");
    }
    template <typename T>
    T read(const std::string &what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, data_ + pos_, sizeof v);  // the mapping is little-endian data on a little-endian host
        pos_ += sizeof v;
        return v;
    }
    void skip(uint64_t n, const std::string &what) {
        need(n, what);
        pos_ += n;
    }
    std::string string(const std::string &what, uint64_t max_len) {
        const uint64_t len = read<uint64_t>(what + " length");
        if (len > max_len) fail(FT_ERR_FORMAT, path_, ": ", what, " length ", len, " exceeds the limit of ", max_len);
        need(len, what);
        std::string s(reinterpret_cast<const char *>(data_ + pos_), len);
        pos_ += len;
        return s;
    }
    // Validates a string's length and skips it without copying.
    void skip_string(const std::string &what) {
        const uint64_t len = read<uint64_t>(what + " length");
        skip(len, what);
    }

private:
    const std::string &path_;
    const uint8_t *data_;
    uint64_t size_;
    uint64_t pos_ = 0;
};

}  // namespace

const char *ggml_type_name(uint32_t type) {
    const GgmlTypeEntry *e = ggml_entry(type);
    return e ? e->name : nullptr;
}

bool ggml_type_geometry(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes) {
    const GgmlTypeEntry *e = ggml_entry(type);
    if (!e) return false;
    *block_elems = e->block_elems;
    *block_bytes = e->block_bytes;
    return true;
}

bool GgufValue::is_integer() const {
    switch (type) {
        case GgufType::u8: case GgufType::i8: case GgufType::u16: case GgufType::i16: case GgufType::u32:
        case GgufType::i32: case GgufType::u64: case GgufType::i64: return true;
        default: return false;
    }
}

GgufFile::GgufFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(FT_ERR_IO, path_, ": cannot open: ", std::strerror(errno));
    try {
        struct stat st;
        if (::fstat(fd_, &st) != 0) fail(FT_ERR_IO, path_, ": cannot stat: ", std::strerror(errno));
        if (!S_ISREG(st.st_mode)) fail(FT_ERR_IO, path_, ": not a regular file");
        size_ = static_cast<uint64_t>(st.st_size);
        if (size_ < 24) fail(FT_ERR_FORMAT, path_, ": file is ", size_, " bytes, too short for a GGUF header");
        void *p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
        if (p == MAP_FAILED) fail(FT_ERR_IO, path_, ": cannot map: ", std::strerror(errno));
        map_ = static_cast<uint8_t *>(p);
        parse();
    } catch (...) {
        if (map_) ::munmap(map_, size_);
        ::close(fd_);
        throw;
    }
}

GgufFile::~GgufFile() {
    if (map_) ::munmap(map_, size_);
    if (fd_ >= 0) ::close(fd_);
}

void GgufFile::parse() {
    Cursor c(path_, map_, size_);
    if (std::memcmp(map_, "GGUF", 4) != 0) fail(FT_ERR_FORMAT, path_, ": bad magic (not a GGUF file)");
    c.skip(4, "magic");
    version_ = c.read<uint32_t>("version");
    if (version_ != 3)
        fail(FT_ERR_FORMAT, path_, ": GGUF version ", version_,
             " is not supported (only version 3, little-endian, is read)");
    const uint64_t n_tensors = c.read<uint64_t>("tensor count");
    const uint64_t n_kv = c.read<uint64_t>("metadata key/value count");
    // Lower bounds on the bytes each entry takes: a lying count fails here, before any reserve.
    constexpr uint64_t kMinKv = 8 + 1 + 4 + 1;                // key len + 1 byte key + type + 1-byte value
    constexpr uint64_t kMinTensorInfo = 8 + 1 + 4 + 8 + 4 + 8;  // name len + 1 byte + n_dims + 1 dim + type + offset
    if (n_kv > c.left() / kMinKv)
        fail(FT_ERR_FORMAT, path_, ": metadata key/value count ", n_kv, " cannot fit in the ", c.left(),
             " bytes after the header");
    if (n_tensors > c.left() / kMinTensorInfo)
        fail(FT_ERR_FORMAT, path_, ": tensor count ", n_tensors, " cannot fit in the ", c.left(),
             " bytes after the header");

    keys_.reserve(n_kv);
    for (uint64_t i = 0; i < n_kv; ++i) {
        const std::string where = cat("metadata entry ", i);
        std::string key = c.string(where + " key", kMaxString);
        const std::string kw = cat("metadata '", key, "'");
        const uint32_t t = c.read<uint32_t>(kw + " value type");
        if (!valid_value_type(t)) fail(FT_ERR_FORMAT, path_, ": ", kw, ": unknown value type ", t);
        GgufValue v;
        v.type = static_cast<GgufType>(t);
        switch (v.type) {
            case GgufType::u8: v.u = c.read<uint8_t>(kw); v.i = static_cast<int64_t>(v.u); break;
            case GgufType::u16: v.u = c.read<uint16_t>(kw); v.i = static_cast<int64_t>(v.u); break;
            case GgufType::u32: v.u = c.read<uint32_t>(kw); v.i = static_cast<int64_t>(v.u); break;
            case GgufType::u64: v.u = c.read<uint64_t>(kw); v.i = static_cast<int64_t>(v.u); break;
            case GgufType::i8: v.i = c.read<int8_t>(kw); v.u = static_cast<uint64_t>(v.i); break;
            case GgufType::i16: v.i = c.read<int16_t>(kw); v.u = static_cast<uint64_t>(v.i); break;
            case GgufType::i32: v.i = c.read<int32_t>(kw); v.u = static_cast<uint64_t>(v.i); break;
            case GgufType::i64: v.i = c.read<int64_t>(kw); v.u = static_cast<uint64_t>(v.i); break;
            case GgufType::f32: v.f = c.read<float>(kw); break;
            case GgufType::f64: v.f = c.read<double>(kw); break;
            case GgufType::boolean: v.u = c.read<uint8_t>(kw) != 0; break;
            case GgufType::string: v.s = c.string(kw, kMaxString); break;
            case GgufType::array: {
                const uint32_t et = c.read<uint32_t>(kw + " element type");
                if (!valid_value_type(et)) fail(FT_ERR_FORMAT, path_, ": ", kw, ": unknown array element type ", et);
                v.elem_type = static_cast<GgufType>(et);
                if (v.elem_type == GgufType::array)
                    fail(FT_ERR_FORMAT, path_, ": ", kw, ": nested arrays are not supported");
                v.count = c.read<uint64_t>(kw + " element count");
                v.data_offset = c.pos();
                if (v.elem_type == GgufType::string) {
                    // Each string is at least its 8-byte length; check the count first, then walk.
                    if (v.count > c.left() / 8)
                        fail(FT_ERR_FORMAT, path_, ": ", kw, ": array of ", v.count, " strings cannot fit in the ",
                             c.left(), " bytes left");
                    for (uint64_t e = 0; e < v.count; ++e) c.skip_string(kw + cat(" element ", e));
                } else {
                    const uint64_t es = fixed_size(v.elem_type);
                    if (v.count > c.left() / es)
                        fail(FT_ERR_FORMAT, path_, ": ", kw, ": array of ", v.count, " ", value_type_name(v.elem_type),
                             " runs past the end of the file");
                    c.skip(v.count * es, kw);
                }
                break;
            }
        }
        if (kv_.count(key)) fail(FT_ERR_FORMAT, path_, ": metadata key '", key, "' appears twice");
        keys_.push_back(key);
        kv_.emplace(std::move(key), std::move(v));
    }

    if (const GgufValue *a = find("general.alignment")) {
        if (!a->is_integer() || a->i <= 0 || static_cast<uint64_t>(a->i) > kMaxAlignment ||
            (a->u & (a->u - 1)) != 0)
            fail(FT_ERR_FORMAT, path_, ": general.alignment must be a positive power of two (at most ",
                 kMaxAlignment, "), got ", a->is_integer() ? std::to_string(a->i) : value_type_name(a->type));
        alignment_ = a->u;
    }

    tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
        GgufTensorInfo t;
        t.name = c.string(cat("tensor info ", i, " name"), kMaxTensorName);
        const std::string tw = cat("tensor '", t.name, "'");
        auto bad = [&](auto &&...what) { fail(FT_ERR_FORMAT, path_, ": ", tw, ": ", what...); };
        if (t.name.empty()) bad("empty name");
        const uint32_t n_dims = c.read<uint32_t>(tw + " n_dims");
        if (n_dims == 0 || n_dims > 4) bad("n_dims ", n_dims, " is not in [1, 4]");
        t.numel = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const uint64_t dim = c.read<uint64_t>(tw + " dims");
            if (dim > static_cast<uint64_t>(INT64_MAX) || !mul_fits(t.numel, dim, &t.numel))
                bad("dimensions overflow the element count");
            t.dims.push_back(dim);
        }
        t.type = c.read<uint32_t>(tw + " type");
        uint32_t be = 0, bb = 0;
        if (!ggml_type_geometry(t.type, &be, &bb)) bad("unknown ggml type ", t.type);
        if (t.dims[0] % be != 0)
            bad("innermost dimension ", t.dims[0], " is not a multiple of the ", ggml_type_name(t.type), " block of ",
                be);
        if (!mul_fits(t.numel / be, static_cast<uint64_t>(bb), &t.nbytes))
            bad("dimensions overflow the byte count");
        t.offset = c.read<uint64_t>(tw + " offset");
        if (t.offset % alignment_ != 0) bad("offset ", t.offset, " is not a multiple of the alignment ", alignment_);
        if (tensor_index_.count(t.name)) bad("name appears twice");
        tensor_index_.emplace(t.name, tensors_.size());
        tensors_.push_back(std::move(t));
    }

    // The data section starts at the next multiple of the alignment.
    const uint64_t pos = c.pos();
    data_start_ = pos + (alignment_ - pos % alignment_) % alignment_;
    const uint64_t data_size = data_start_ <= size_ ? size_ - data_start_ : 0;
    for (GgufTensorInfo &t : tensors_) {
        if (t.offset > data_size || t.nbytes > data_size - t.offset)
            fail(FT_ERR_FORMAT, path_, ": tensor '", t.name, "': bytes [", t.offset, ", +", t.nbytes,
                 ") run past the ", data_size, "-byte data section (file truncated?)");
        t.file_offset = data_start_ + t.offset;
        t.part = this;
    }
    // No two tensors may share bytes: sorted by offset, each must start after the previous ends.
    std::vector<const GgufTensorInfo *> by_offset;
    by_offset.reserve(tensors_.size());
    for (const GgufTensorInfo &t : tensors_)
        if (t.nbytes > 0) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const GgufTensorInfo *a, const GgufTensorInfo *b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        const GgufTensorInfo *p = by_offset[i - 1], *t = by_offset[i];
        if (t->offset < p->offset + p->nbytes)
            fail(FT_ERR_FORMAT, path_, ": tensor '", t->name, "' at data offset ", t->offset, " overlaps tensor '",
                 p->name, "' [", p->offset, ", ", p->offset + p->nbytes, ")");
    }
}

const GgufTensorInfo *GgufFile::find_tensor(const std::string &name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue *GgufFile::find(const std::string &key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
}

uint64_t GgufFile::req_uint(const std::string &key) const {
    const GgufValue *v = find(key);
    if (!v) fail(FT_ERR_FORMAT, path_, ": required metadata '", key, "' is missing");
    return opt_uint(key, 0);
}

uint64_t GgufFile::opt_uint(const std::string &key, uint64_t def) const {
    const GgufValue *v = find(key);
    if (!v) return def;
    if (!v->is_integer() || v->i < 0)
        fail(FT_ERR_FORMAT, path_, ": metadata '", key, "' must be a non-negative integer, got ",
             v->is_integer() ? std::to_string(v->i) : value_type_name(v->type));
    return v->u;
}

double GgufFile::opt_float(const std::string &key, double def) const {
    const GgufValue *v = find(key);
    if (!v) return def;
    if (v->type == GgufType::f32 || v->type == GgufType::f64) return v->f;
    if (v->is_integer()) return static_cast<double>(v->i);
    fail(FT_ERR_FORMAT, path_, ": metadata '", key, "' must be a number, got ", value_type_name(v->type));
}

bool GgufFile::opt_bool(const std::string &key, bool def) const {
    const GgufValue *v = find(key);
    if (!v) return def;
    if (v->type != GgufType::boolean)
        fail(FT_ERR_FORMAT, path_, ": metadata '", key, "' must be a bool, got ", value_type_name(v->type));
    return v->u != 0;
}

std::string GgufFile::req_string(const std::string &key) const {
    const GgufValue *v = find(key);
    if (!v) fail(FT_ERR_FORMAT, path_, ": required metadata '", key, "' is missing");
    if (v->type != GgufType::string)
        fail(FT_ERR_FORMAT, path_, ": metadata '", key, "' must be a string, got ", value_type_name(v->type));
    return v->s;
}

void GgufFile::attach_part(std::unique_ptr<GgufFile> part) {
    for (const GgufTensorInfo &t : part->tensors_) {
        if (const GgufTensorInfo *had = find_tensor(t.name))
            fail(FT_ERR_FORMAT, part->path_, ": tensor '", t.name, "' is also in ", had->part->path_);
        tensor_index_.emplace(t.name, tensors_.size());
        tensors_.push_back(t);
    }
    parts_.push_back(std::move(part));
}

namespace {

struct SplitName {
    std::string prefix;  // everything before "-00001-of-00003.gguf"
    uint32_t no = 0, count = 0;  // 1-based part number, part count
};

// Parses NAME-%05d-of-%05d.gguf (exactly five digits each, as gguf-split writes them).
bool parse_split_name(const std::string &file, SplitName *out) {
    static const size_t kTail = std::string("-00001-of-00003.gguf").size();
    if (file.size() <= kTail) return false;
    const std::string tail = file.substr(file.size() - kTail);
    uint32_t no = 0, count = 0;
    if (tail[0] != '-' || tail.compare(6, 4, "-of-") != 0 || tail.compare(15, 5, ".gguf") != 0) return false;
    for (size_t i = 0; i < 5; ++i) {
        const char a = tail[1 + i], b = tail[10 + i];
        if (a < '0' || a > '9' || b < '0' || b > '9') return false;
        no = no * 10 + static_cast<uint32_t>(a - '0');
        count = count * 10 + static_cast<uint32_t>(b - '0');
    }
    if (no == 0 || count == 0 || no > count) return false;
    out->prefix = file.substr(0, file.size() - kTail);
    out->no = no;
    out->count = count;
    return true;
}

std::string split_part_name(const std::string &prefix, uint32_t no, uint32_t count) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "-%05u-of-%05u.gguf", no, count);
    return prefix + buf;
}

std::string base_name(const std::string &path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::unique_ptr<GgufFile> open_gguf_model(const std::string &path) {
    auto first = std::make_unique<GgufFile>(path);
    const GgufValue *count_kv = first->find("split.count");
    const uint64_t count = first->opt_uint("split.count", 1);
    SplitName sn;
    const bool named = parse_split_name(path, &sn);
    if (!count_kv) {
        if (named && sn.count > 1)
            fail(FT_ERR_FORMAT, path, ": named as part ", sn.no, " of ", sn.count,
                 " of a split set but carries no split.count metadata");
        return first;
    }
    const uint64_t no = first->opt_uint("split.no", 0);
    if (count == 0 || count > 99999)
        fail(FT_ERR_FORMAT, path, ": metadata 'split.count' = ", count, " is not in [1, 99999]");
    if (no != 0)
        fail(FT_ERR_FORMAT, path, ": is part ", no + 1, " of ", count,
             " of a split set (split.no = ", no, "); give the first part (-00001-of-",
             split_part_name("", 1, static_cast<uint32_t>(count)).substr(10), ") or its directory");
    if (count == 1) return first;
    if (!named || sn.count != count)
        fail(FT_ERR_FORMAT, path, ": split.count = ", count, " but the file name is not NAME-00001-of-",
             split_part_name("", 1, static_cast<uint32_t>(count)).substr(10),
             " (the other parts are found by that name)");
    const uint64_t total = first->opt_uint("split.tensors.count", 0);
    const std::string dir = path.substr(0, path.size() - base_name(path).size());
    for (uint32_t i = 2; i <= count; ++i) {
        const std::string pp = split_part_name(sn.prefix, i, static_cast<uint32_t>(count));
        std::unique_ptr<GgufFile> part;
        try {
            part = std::make_unique<GgufFile>(pp);
        } catch (const Error &e) {
            if (e.status() == FT_ERR_IO)
                fail(FT_ERR_IO, path, ": part ", i, " of ", count, " of the split set is missing or unreadable: ",
                     e.what());
            throw;
        }
        const uint64_t pc = part->opt_uint("split.count", 0), pn = part->opt_uint("split.no", UINT64_MAX);
        if (pc != count || pn != i - 1)
            fail(FT_ERR_FORMAT, pp, ": split.no = ", pn == UINT64_MAX ? std::string("(missing)") : std::to_string(pn),
                 ", split.count = ", pc, " where part ", i, " of ", count, " (split.no ", i - 1, ") is expected");
        first->attach_part(std::move(part));
    }
    if (first->find("split.tensors.count") && total != first->tensors().size())
        fail(FT_ERR_FORMAT, path, ": split.tensors.count = ", total, " but the ", count, " parts hold ",
             first->tensors().size(), " tensors");
    return first;
}

std::string gguf_directory_model(const std::string &dir, std::vector<std::string> names) {
    std::sort(names.begin(), names.end());
    SplitName only;
    if (names.size() == 1 && (!parse_split_name(names[0], &only) || only.count == 1)) return dir + "/" + names[0];
    // Split parts, or several files: they must be the parts of one split set.
    SplitName first;
    bool all_split = true, one_set = true;
    for (size_t i = 0; i < names.size(); ++i) {
        SplitName sn;
        if (!parse_split_name(names[i], &sn)) {
            all_split = false;
            break;
        }
        if (i == 0) first = sn;
        else if (sn.prefix != first.prefix || sn.count != first.count) one_set = false;
    }
    if (!all_split)
        fail(FT_ERR_UNSUPPORTED, dir, ": holds ", names.size(), " .gguf files ('", names[0], "', '", names[1],
             "', ...) that are not the parts of one split set (NAME-00001-of-0000N.gguf): pass one file");
    if (!one_set)
        fail(FT_ERR_UNSUPPORTED, dir, ": holds the parts of several split sets ('", names[0], "', '", names.back(),
             "'): pass the first part of one");
    const std::string want = split_part_name(first.prefix, 1, first.count);
    if (names[0] != want)
        fail(FT_ERR_IO, dir, ": split set '", first.prefix, "' has no first part '", want, "'");
    return dir + "/" + names[0];
}

}  // namespace ft
