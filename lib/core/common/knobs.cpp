#include "ft/knobs.hpp"

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "ft/common.hpp"

namespace ft {
namespace {

constexpr KnobType kind(const knob_types::Int *) { return KnobType::integer; }
constexpr KnobType kind(const knob_types::Bool *) { return KnobType::boolean; }
constexpr KnobType kind(const knob_types::Text *) { return KnobType::text; }

std::string default_text(int v) { return std::to_string(v); }
std::string default_text(bool v) { return v ? "1" : "0"; }
std::string default_text(const std::string &v) { return v.empty() ? "unset" : v; }

const KnobInfo kKnobs[] = {
#define FT_KNOB_INFO(field, var, type, def, doc) \
    {var, kind(static_cast<const knob_types::type *>(nullptr)), nullptr, doc},
    FT_KNOBS(FT_KNOB_INFO)
#undef FT_KNOB_INFO
};

// The default texts, built once from the default Tuning (so they cannot drift from it).
const std::string *default_texts() {
    static const std::string *texts = [] {
        static std::string t[std::size(kKnobs)];
        const Tuning d;
        size_t i = 0;
#define FT_KNOB_DEFAULT(field, var, type, def, doc) t[i++] = default_text(d.field);
        FT_KNOBS(FT_KNOB_DEFAULT)
#undef FT_KNOB_DEFAULT
        return t;
    }();
    return texts;
}

bool parse(const std::string &s, int *out) {
    char *end = nullptr;
    errno = 0;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno != 0 || v < INT_MIN || v > INT_MAX) return false;
    *out = int(v);
    return true;
}

bool parse(const std::string &s, bool *out) {
    if (s != "0" && s != "1") return false;
    *out = s == "1";
    return true;
}

bool parse(const std::string &s, std::string *out) {
    *out = s;
    return true;
}

const char *type_name(KnobType t) {
    switch (t) {
        case KnobType::integer: return "integer";
        case KnobType::boolean: return "0 or 1";
        default: return "text";
    }
}

template <typename T>
void read_one(const char *name, KnobType type, bool log_set, T *field) {
    const char *raw = std::getenv(name);
    if (!raw || !*raw) return;
    T value;
    if (!parse(raw, &value)) {
        if (log_set)
            log(FT_LOG_WARN, "knob ", name, "=", raw, " is not ", type == KnobType::integer ? "an " : "", type_name(type),
                "; the default stays");
        return;
    }
    *field = value;
    if (log_set) log(FT_LOG_INFO, "knob ", name, "=", raw);
}

}  // namespace

const KnobInfo *knobs(size_t *count) {
    static const KnobInfo *table = [] {
        static KnobInfo t[std::size(kKnobs)];
        const std::string *d = default_texts();
        for (size_t i = 0; i < std::size(kKnobs); ++i) {
            t[i] = kKnobs[i];
            t[i].default_text = d[i].c_str();
        }
        return t;
    }();
    *count = std::size(kKnobs);
    return table;
}

Tuning read_tuning(bool log_set) {
    Tuning t;
#define FT_KNOB_READ(field, var, type, def, doc) read_one(var, kind(&t.field), log_set, &t.field);
    FT_KNOBS(FT_KNOB_READ)
#undef FT_KNOB_READ
    return t;
}

std::string knobs_markdown() {
    size_t n = 0;
    const KnobInfo *k = knobs(&n);
    std::string s = "| variable | type | default | effect |\n|---|---|---|---|\n";
    for (size_t i = 0; i < n; ++i)
        s += cat("| `", k[i].name, "` | ", type_name(k[i].type), " | ", k[i].default_text, " | ", k[i].doc, " |\n");
    return s;
}

}  // namespace ft
