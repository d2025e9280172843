// Decode route traces (docs/formats.md, "Route trace"): the file FT_TRACE_ROUTES records at every
// ft_decode call, its reader, and a seeded Zipf generator with temporal locality for benchmarks.
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

namespace ft {

// One ft_decode call: `tokens` rows of `top_k` expert ids of one layer (ids < 0 pass through).
struct TraceCall {
    int32_t layer = 0;
    int32_t tokens = 0;
    std::vector<int32_t> ids;  // tokens * top_k
};

struct RouteTrace {
    int32_t layers = 0;
    int32_t experts = 0;  // E, experts per layer
    int32_t top_k = 0;
    std::vector<TraceCall> calls;
};

// Reads a trace file. Throws FT_ERR_IO for a file that cannot be opened and FT_ERR_FORMAT (naming
// the byte offset) for a bad magic, version or header, a record that does not fit the header
// (layer or id out of range, zero tokens) or a truncated record.
RouteTrace read_route_trace(const std::string &path);

// Writes a whole trace (header and records), replacing the file. Throws as the recorder does.
void write_route_trace(const std::string &path, const RouteTrace &trace);

// Appends records to a trace file as ft_decode calls arrive. The file is created with the header
// when absent or empty; an existing file must carry the same header (FT_ERR_INVALID_ARGUMENT
// otherwise), and its records are kept. Each record is written whole and flushed, so a reader
// sees only complete records of a process that stopped between calls. Thread-safe.
class RouteRecorder {
public:
    RouteRecorder(const std::string &path, int32_t layers, int32_t experts, int32_t top_k);
    ~RouteRecorder();
    RouteRecorder(const RouteRecorder &) = delete;
    RouteRecorder &operator=(const RouteRecorder &) = delete;
    void record(int32_t layer, int32_t tokens, const int32_t *ids);
    const std::string &path() const { return path_; }

private:
    std::string path_;
    int32_t top_k_ = 0;
    std::FILE *file_ = nullptr;
    std::mutex mutex_;
};

// Zipf decode trace: per layer its own random permutation of expert popularity, rank r (0-based)
// drawn with weight 1 / (r + 1)^s; every token picks top_k distinct experts per layer. With
// `repeat` > 0 each pick is, with that probability, an expert of the previous token's picks in
// the same layer (uniformly among those not yet picked), which gives temporal locality. One call
// per layer per token, layers in order; batch = tokens per call.
struct ZipfTraceSpec {
    int32_t layers = 0, experts = 0, top_k = 0;
    int64_t steps = 0;     // decode steps (calls per layer)
    int32_t batch = 1;     // tokens per call
    double s = 1.0;        // Zipf exponent (0: uniform)
    double repeat = 0.0;   // temporal locality, in [0, 1]
    uint64_t seed = 1;
};

// Throws FT_ERR_INVALID_ARGUMENT for sizes <= 0, top_k > experts, s < 0 or repeat outside [0, 1].
RouteTrace make_zipf_trace(const ZipfTraceSpec &spec);

}  // namespace ft
