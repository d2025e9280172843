// Route trace file (docs/formats.md, "Route trace") and the Zipf trace generator.
#include "ft/trace.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>

#include "ft/common.hpp"

namespace ft {

namespace {

constexpr char kMagic[8] = {'F', 'T', 'R', 'O', 'U', 'T', 'E', 'S'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 24;
// A record's tokens bound: keeps tokens * top_k * 4 far from overflow and a damaged count from
// asking for gigabytes.
constexpr int32_t kMaxRecordTokens = 1 << 20;

struct Header {
    int32_t layers, experts, top_k;
};

void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char *p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

void check_header(const Header &h, const char *what) {
    if (h.layers <= 0 || h.experts <= 0 || h.top_k <= 0 || h.top_k > h.experts)
        fail(FT_ERR_INVALID_ARGUMENT, what, ": layers, experts and top_k must be positive with top_k <= experts (got ",
             h.layers, ", ", h.experts, ", ", h.top_k, ")");
}

std::vector<unsigned char> header_bytes(const Header &h) {
    std::vector<unsigned char> b(kHeaderBytes);
    std::memcpy(b.data(), kMagic, 8);
    put_u32(b.data() + 8, kVersion);
    put_u32(b.data() + 12, static_cast<uint32_t>(h.layers));
    put_u32(b.data() + 16, static_cast<uint32_t>(h.experts));
    put_u32(b.data() + 20, static_cast<uint32_t>(h.top_k));
    return b;
}

std::vector<unsigned char> record_bytes(int32_t layer, int32_t tokens, const int32_t *ids, int32_t top_k) {
    const size_t n = static_cast<size_t>(tokens) * static_cast<size_t>(top_k);
    std::vector<unsigned char> b(8 + 4 * n);
    put_u32(b.data(), static_cast<uint32_t>(layer));
    put_u32(b.data() + 4, static_cast<uint32_t>(tokens));
    for (size_t i = 0; i < n; ++i) put_u32(b.data() + 8 + 4 * i, static_cast<uint32_t>(ids[i]));
    return b;
}

struct FileCloser {
    void operator()(std::FILE *f) const {
        if (f) std::fclose(f);
    }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

void write_all(std::FILE *f, const std::vector<unsigned char> &b, const std::string &path) {
    if (std::fwrite(b.data(), 1, b.size(), f) != b.size() || std::fflush(f) != 0)
        fail(FT_ERR_IO, "route trace ", path, ": write failed: ", std::strerror(errno));
}

// Deterministic uniform in [0, 1) from a 64-bit generator (splitmix64), the same on every platform.
struct Rng {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
    int32_t below(int32_t n) { return static_cast<int32_t>(uniform() * n); }
};

}  // namespace

RouteTrace read_route_trace(const std::string &path) {
    File f(std::fopen(path.c_str(), "rb"));
    if (!f) fail(FT_ERR_IO, "route trace ", path, ": cannot open: ", std::strerror(errno));
    unsigned char head[kHeaderBytes];
    if (std::fread(head, 1, kHeaderBytes, f.get()) != kHeaderBytes)
        fail(FT_ERR_FORMAT, "route trace ", path, ": shorter than its ", kHeaderBytes, "-byte header");
    if (std::memcmp(head, kMagic, 8) != 0) fail(FT_ERR_FORMAT, "route trace ", path, ": bad magic (not FTROUTES)");
    if (get_u32(head + 8) != kVersion)
        fail(FT_ERR_FORMAT, "route trace ", path, ": version ", get_u32(head + 8), ", this reader knows ", kVersion);
    RouteTrace t;
    t.layers = static_cast<int32_t>(get_u32(head + 12));
    t.experts = static_cast<int32_t>(get_u32(head + 16));
    t.top_k = static_cast<int32_t>(get_u32(head + 20));
    if (t.layers <= 0 || t.experts <= 0 || t.top_k <= 0 || t.top_k > t.experts)
        fail(FT_ERR_FORMAT, "route trace ", path, ": bad header (layers ", t.layers, ", experts ", t.experts,
             ", top_k ", t.top_k, ")");
    uint64_t offset = kHeaderBytes;
    for (;;) {
        unsigned char rec[8];
        const size_t got = std::fread(rec, 1, 8, f.get());
        if (got == 0) break;
        if (got != 8) fail(FT_ERR_FORMAT, "route trace ", path, ": truncated record at byte ", offset);
        TraceCall c;
        c.layer = static_cast<int32_t>(get_u32(rec));
        c.tokens = static_cast<int32_t>(get_u32(rec + 4));
        if (c.layer < 0 || c.layer >= t.layers)
            fail(FT_ERR_FORMAT, "route trace ", path, ": record at byte ", offset, " has layer ", c.layer, " of ",
                 t.layers);
        if (c.tokens <= 0 || c.tokens > kMaxRecordTokens)
            fail(FT_ERR_FORMAT, "route trace ", path, ": record at byte ", offset, " has ", c.tokens, " tokens");
        const size_t n = static_cast<size_t>(c.tokens) * static_cast<size_t>(t.top_k);
        std::vector<unsigned char> body(4 * n);
        if (std::fread(body.data(), 1, body.size(), f.get()) != body.size())
            fail(FT_ERR_FORMAT, "route trace ", path, ": truncated record at byte ", offset);
        c.ids.resize(n);
        for (size_t i = 0; i < n; ++i) {
            c.ids[i] = static_cast<int32_t>(get_u32(body.data() + 4 * i));
            if (c.ids[i] >= t.experts)
                fail(FT_ERR_FORMAT, "route trace ", path, ": record at byte ", offset, " routes to expert ", c.ids[i],
                     " of ", t.experts);
        }
        offset += 8 + body.size();
        t.calls.push_back(std::move(c));
    }
    return t;
}

void write_route_trace(const std::string &path, const RouteTrace &trace) {
    const Header h{trace.layers, trace.experts, trace.top_k};
    check_header(h, "route trace");
    File f(std::fopen(path.c_str(), "wb"));
    if (!f) fail(FT_ERR_IO, "route trace ", path, ": cannot create: ", std::strerror(errno));
    write_all(f.get(), header_bytes(h), path);
    for (const TraceCall &c : trace.calls) {
        if (c.layer < 0 || c.layer >= trace.layers || c.tokens <= 0 ||
            c.ids.size() != static_cast<size_t>(c.tokens) * static_cast<size_t>(trace.top_k))
            fail(FT_ERR_INVALID_ARGUMENT, "route trace ", path, ": a call does not fit the header");
        write_all(f.get(), record_bytes(c.layer, c.tokens, c.ids.data(), trace.top_k), path);
    }
}

RouteRecorder::RouteRecorder(const std::string &path, int32_t layers, int32_t experts, int32_t top_k)
    : path_(path), top_k_(top_k) {
    const Header h{layers, experts, top_k};
    check_header(h, "FT_TRACE_ROUTES");
    const std::vector<unsigned char> want = header_bytes(h);
    File f(std::fopen(path.c_str(), "ab+"));
    if (!f) fail(FT_ERR_IO, "FT_TRACE_ROUTES=", path, ": cannot open: ", std::strerror(errno));
    std::fseek(f.get(), 0, SEEK_END);
    const long size = std::ftell(f.get());
    if (size == 0) {
        write_all(f.get(), want, path);
    } else {
        std::vector<unsigned char> have(kHeaderBytes);
        std::rewind(f.get());
        if (std::fread(have.data(), 1, kHeaderBytes, f.get()) != kHeaderBytes || have != want)
            fail(FT_ERR_INVALID_ARGUMENT, "FT_TRACE_ROUTES=", path,
                 ": the file exists with another header (not a trace of this model: layers ", layers, ", experts ",
                 experts, ", top_k ", top_k, ")");
        std::fseek(f.get(), 0, SEEK_END);  // append mode writes at the end regardless
    }
    file_ = f.release();
}

RouteRecorder::~RouteRecorder() {
    if (file_) std::fclose(file_);
}

void RouteRecorder::record(int32_t layer, int32_t tokens, const int32_t *ids) {
    const std::vector<unsigned char> b = record_bytes(layer, tokens, ids, top_k_);
    std::lock_guard<std::mutex> lock(mutex_);
    write_all(file_, b, path_);
}

RouteTrace make_zipf_trace(const ZipfTraceSpec &p) {
    if (p.layers <= 0 || p.experts <= 0 || p.top_k <= 0 || p.top_k > p.experts || p.steps <= 0 || p.batch <= 0)
        fail(FT_ERR_INVALID_ARGUMENT, "zipf trace: layers, experts, top_k (<= experts), steps and batch must be positive");
    if (!(p.s >= 0.0) || !(p.repeat >= 0.0 && p.repeat <= 1.0))
        fail(FT_ERR_INVALID_ARGUMENT, "zipf trace: s must be >= 0 and repeat in [0, 1] (got ", p.s, ", ", p.repeat, ")");
    Rng rng{p.seed};
    const int32_t E = p.experts, K = p.top_k;
    // Cumulative weights of the ranks.
    std::vector<double> cdf(E);
    double sum = 0.0;
    for (int32_t r = 0; r < E; ++r) cdf[r] = sum += 1.0 / std::pow(r + 1.0, p.s);
    for (double &c : cdf) c /= sum;
    // Per layer: rank -> expert, a Fisher-Yates permutation.
    std::vector<std::vector<int32_t>> perm(p.layers, std::vector<int32_t>(E));
    for (auto &pl : perm) {
        for (int32_t e = 0; e < E; ++e) pl[e] = e;
        for (int32_t e = E - 1; e > 0; --e) std::swap(pl[e], pl[rng.below(e + 1)]);
    }
    RouteTrace t;
    t.layers = p.layers;
    t.experts = E;
    t.top_k = K;
    t.calls.reserve(static_cast<size_t>(p.steps) * p.layers);
    // Previous token's picks, per layer and batch row.
    std::vector<std::vector<int32_t>> prev(static_cast<size_t>(p.layers) * p.batch);
    std::vector<int32_t> row, fresh;
    for (int64_t step = 0; step < p.steps; ++step)
        for (int32_t l = 0; l < p.layers; ++l) {
            TraceCall c;
            c.layer = l;
            c.tokens = p.batch;
            c.ids.reserve(static_cast<size_t>(p.batch) * K);
            for (int32_t b = 0; b < p.batch; ++b) {
                std::vector<int32_t> &last = prev[static_cast<size_t>(l) * p.batch + b];
                row.clear();
                auto picked = [&](int32_t e) { return std::find(row.begin(), row.end(), e) != row.end(); };
                while (static_cast<int32_t>(row.size()) < K) {
                    if (p.repeat > 0.0 && !last.empty() && rng.uniform() < p.repeat) {
                        fresh.clear();
                        for (int32_t e : last)
                            if (!picked(e)) fresh.push_back(e);
                        if (!fresh.empty()) {
                            row.push_back(fresh[rng.below(static_cast<int32_t>(fresh.size()))]);
                            continue;
                        }
                    }
                    const double u = rng.uniform();
                    const int32_t r = static_cast<int32_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
                    const int32_t e = perm[l][std::min(r, E - 1)];
                    if (!picked(e)) row.push_back(e);
                }
                last = row;
                c.ids.insert(c.ids.end(), row.begin(), row.end());
            }
            t.calls.push_back(std::move(c));
        }
    return t;
}

}  // namespace ft
