// Shared internals of every FreeToken module: the error type that carries an ft_status up to
// the C shims, message formatting, logging and bf16 conversions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <utility>

#include "freetoken.h"

namespace ft {

// Internal code throws Error; the C shims in lib/engine/api turn it into a status and a message.
class Error : public std::exception {
public:
    Error(ft_status status, std::string message) : status_(status), message_(std::move(message)) {}
    ft_status status() const noexcept { return status_; }
    const char *what() const noexcept override { return message_.c_str(); }

private:
    ft_status status_;
    std::string message_;
};

// Concatenates any streamable values into a string: cat("layer ", l, " of ", n).
template <typename... Args>
std::string cat(Args &&...args) {
    std::ostringstream os;
    (os << ... << std::forward<Args>(args));
    return os.str();
}

template <typename... Args>
[[noreturn]] void fail(ft_status status, Args &&...args) {
    throw Error(status, cat(std::forward<Args>(args)...));
}

// ---- sizes a file or caller declares -------------------------------------------------------
// Every parser bounds what a file declares with these limits before using it, and computes
// products and sums of declared sizes with checked_mul / checked_add (docs/limits.md lists them).
namespace limits {
constexpr int64_t kMaxLayers = 4096;             // decoder layers of a model (config, GGUF block_count)
constexpr int64_t kMaxExperts = 1 << 16;         // routed experts per layer
constexpr int64_t kMaxDim = 1 << 20;             // hidden / intermediate / shared-expert widths
constexpr uint64_t kMaxJsonFileBytes = 64ull << 20;  // config.json, index.json, profile JSON
constexpr uint64_t kMaxShards = 1 << 16;         // distinct shard files an index may name
constexpr int kMaxJsonDepth = 64;                // nesting of any JSON value FreeToken reads
}  // namespace limits

// a * b and a + b of non-negative declared sizes; FT_ERR_FORMAT "<what> overflows" (or `status`)
// when the result does not fit in uint64_t / int64_t.
uint64_t checked_mul(uint64_t a, uint64_t b, const std::string &what, ft_status status = FT_ERR_FORMAT);
uint64_t checked_add(uint64_t a, uint64_t b, const std::string &what, ft_status status = FT_ERR_FORMAT);
int64_t checked_mul(int64_t a, int64_t b, const std::string &what, ft_status status = FT_ERR_FORMAT);
// The same returning false on overflow (no message), for callers that report in their own words.
inline bool mul_fits(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }
inline bool add_fits(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }

// FT_ERR_FORMAT naming the file when `path` is a regular file larger than `max_bytes`; does
// nothing when it cannot be examined (opening it then reports why).
void check_file_size(const std::string &path, uint64_t max_bytes);

// Logging. Level and sink are process-wide (ft_log_set_callback, FT_LOG).
void log_message(int level, const std::string &message);
bool log_enabled(int level);
void set_log_callback(ft_log_fn fn, void *user_data, int level);

template <typename... Args>
void log(int level, Args &&...args) {
    if (log_enabled(level)) log_message(level, cat(std::forward<Args>(args)...));
}

// bf16 <-> f32. The conversion down rounds to nearest even and keeps NaN a NaN.
inline float bf16_to_f32(uint16_t v) {
    uint32_t bits = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}

// IEEE half -> f32, subnormals included.
float f16_to_f32(uint16_t h);

// Reads an environment variable; empty string when unset. FreeToken's own FT_* variables are
// read through the knob registry (ft/knobs.hpp), not with this.
std::string env_string(const char *name);

// FreeToken's cache folder: $XDG_CACHE_HOME/freetoken, else ~/.cache/freetoken (profiles,
// synthetic checkpoints).
std::string cache_dir();

// Creates `path` and its missing parents (mode 0755); false with errno set on failure.
bool make_dirs(const std::string &path);

}  // namespace ft
