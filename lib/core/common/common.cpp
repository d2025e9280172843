#include "ft/common.hpp"

#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace ft {
namespace {

int parse_level(const std::string &s) {
    if (s.empty()) return FT_LOG_WARN;
    if (s == "off") return FT_LOG_OFF;
    if (s == "error") return FT_LOG_ERROR;
    if (s == "warn" || s == "warning") return FT_LOG_WARN;
    if (s == "info") return FT_LOG_INFO;
    if (s == "debug") return FT_LOG_DEBUG;
    char *end = nullptr;
    long v = std::strtol(s.c_str(), &end, 10);
    if (end && *end == '\0' && v >= FT_LOG_OFF && v <= FT_LOG_DEBUG) return static_cast<int>(v);
    return FT_LOG_WARN;
}

struct LogState {
    std::mutex mutex;
    ft_log_fn fn = nullptr;
    void *user_data = nullptr;
    // FT_LOG is in the knob registry (knobs.hpp) but read here, once: logging precedes engines.
    std::atomic<int> level{parse_level(env_string("FT_LOG"))};
};

LogState &log_state() {
    static LogState state;
    return state;
}

const char *level_name(int level) {
    switch (level) {
        case FT_LOG_ERROR: return "error";
        case FT_LOG_WARN: return "warn";
        case FT_LOG_INFO: return "info";
        default: return "debug";
    }
}

}  // namespace

std::string env_string(const char *name) {
    const char *v = std::getenv(name);
    return v ? std::string(v) : std::string();
}

std::string cache_dir() {
    std::string base = env_string("XDG_CACHE_HOME");
    if (base.empty()) {
        const std::string home = env_string("HOME");
        base = (home.empty() ? std::string("/tmp") : home) + "/.cache";
    }
    return base + "/freetoken";
}

bool make_dirs(const std::string &path) {
    for (size_t i = 1; i <= path.size(); ++i) {
        if (i == path.size() || path[i] == '/') {
            const std::string p = path.substr(0, i);
            if (::mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) return false;
        }
    }
    return true;
}

bool log_enabled(int level) { return level <= log_state().level.load(std::memory_order_relaxed); }

void log_message(int level, const std::string &message) {
    LogState &s = log_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.fn) {
        s.fn(s.user_data, level, message.c_str());
    } else {
        std::fprintf(stderr, "freetoken %s: %s\n", level_name(level), message.c_str());
    }
}

void set_log_callback(ft_log_fn fn, void *user_data, int level) {
    LogState &s = log_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.fn = fn;
    s.user_data = user_data;
    if (level < FT_LOG_OFF) level = FT_LOG_OFF;
    if (level > FT_LOG_DEBUG) level = FT_LOG_DEBUG;
    s.level.store(level, std::memory_order_relaxed);
}

uint64_t checked_mul(uint64_t a, uint64_t b, const std::string &what, ft_status status) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) fail(status, what, " overflows (", a, " x ", b, ")");
    return r;
}

uint64_t checked_add(uint64_t a, uint64_t b, const std::string &what, ft_status status) {
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) fail(status, what, " overflows (", a, " + ", b, ")");
    return r;
}

int64_t checked_mul(int64_t a, int64_t b, const std::string &what, ft_status status) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) fail(status, what, " overflows (", a, " x ", b, ")");
    return r;
}

void check_file_size(const std::string &path, uint64_t max_bytes) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes)
        fail(FT_ERR_FORMAT, path, ": file size ", st.st_size, " bytes exceeds the limit of ", max_bytes);
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = (h >> 15) & 1u;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    float v;
    if (exp == 0) {
        v = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal
    } else if (exp == 31) {
        v = man ? NAN : INFINITY;
    } else {
        v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
    }
    return sign ? -v : v;
}

}  // namespace ft
