// Internal to ft_loader: typed access to config.json fields and the per-architecture readers
// that read_model_config (config.cpp) dispatches to (config_archs.cpp).
#pragma once

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ft/common.hpp"
#include "ft/json_limits.hpp"
#include "ft/model.hpp"

namespace ft::config {

using nlohmann::json;

// Typed access to the fields of one JSON object, failing with messages that name the field.
// A field that is present but null counts as absent (transformers writes null for unset values).
class Fields {
public:
    Fields(const json &obj, std::string where) : obj_(obj), where_(std::move(where)) {}

    const std::string &where() const { return where_; }
    const json &object() const { return obj_; }

    bool has(const char *name) const {
        auto it = obj_.find(name);
        return it != obj_.end() && !it->is_null();
    }

    int32_t req_int(const char *name) const {
        if (!has(name)) fail(FT_ERR_FORMAT, where_, ": required field '", name, "' is missing");
        return to_int(name);
    }
    int32_t opt_int(const char *name, int32_t def) const { return has(name) ? to_int(name) : def; }

    // The first of `names` present: transformers' own aliases (num_local_experts / num_experts)
    // and the inference configs of some releases (dim / n_layers). nullptr when none is.
    const char *first_of(std::initializer_list<const char *> names) const {
        for (const char *n : names)
            if (has(n)) return n;
        return nullptr;
    }
    int32_t req_int_any(std::initializer_list<const char *> names) const {
        if (const char *n = first_of(names)) return to_int(n);
        std::string aliases;
        for (auto it = names.begin() + 1; it != names.end(); ++it) aliases += std::string(" or '") + *it + "'";
        fail(FT_ERR_FORMAT, where_, ": required field '", *names.begin(), "'", aliases, " is missing");
    }
    int32_t opt_int_any(std::initializer_list<const char *> names, int32_t def) const {
        const char *n = first_of(names);
        return n ? to_int(n) : def;
    }

    // An integer that some releases write per layer (a list): every entry must be equal.
    int32_t req_uniform_int(const char *name) const {
        if (!has(name)) fail(FT_ERR_FORMAT, where_, ": required field '", name, "' is missing");
        const json &v = obj_.at(name);
        if (!v.is_array()) return to_int(name);
        const std::vector<int32_t> all = opt_int_list(name);
        if (all.empty()) fail(FT_ERR_FORMAT, where_, ": field '", name, "' is an empty list");
        for (int32_t x : all)
            if (x != all[0])
                fail(FT_ERR_UNSUPPORTED, where_, ": field '", name, "' differs between layers (", json_brief(v),
                     "); per-layer expert geometry is not supported");
        return all[0];
    }

    double opt_number(const char *name, double def) const {
        if (!has(name)) return def;
        const json &v = obj_.at(name);
        if (!v.is_number()) type_error(name, "a number");
        return v.get<double>();
    }

    bool opt_bool(const char *name, bool def) const {
        if (!has(name)) return def;
        const json &v = obj_.at(name);
        if (!v.is_boolean()) type_error(name, "true or false");
        return v.get<bool>();
    }

    std::string opt_string(const char *name, const std::string &def) const {
        if (!has(name)) return def;
        const json &v = obj_.at(name);
        if (!v.is_string()) type_error(name, "a string");
        return v.get<std::string>();
    }

    std::vector<int32_t> opt_int_list(const char *name) const {
        std::vector<int32_t> out;
        if (!has(name)) return out;
        const json &v = obj_.at(name);
        if (!v.is_array()) type_error(name, "an array of integers");
        for (const json &e : v) {
            if (!e.is_number_integer() || e.get<int64_t>() < INT32_MIN || e.get<int64_t>() > INT32_MAX)
                type_error(name, "an array of integers");
            out.push_back(static_cast<int32_t>(e.get<int64_t>()));
        }
        return out;
    }

    [[noreturn]] void type_error(const char *name, const char *what) const {
        fail(FT_ERR_FORMAT, where_, ": field '", name, "' must be ", what, ", got ", json_brief(obj_.at(name)));
    }

private:
    int32_t to_int(const char *name) const {
        const json &v = obj_.at(name);
        if (!v.is_number_integer()) type_error(name, "an integer");
        if (v.is_number_unsigned() ? v.get<uint64_t>() > INT32_MAX
                                   : (v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX))
            fail(FT_ERR_FORMAT, where_, ": field '", name, "' = ", json_brief(v), " is out of range");
        return static_cast<int32_t>(v.get<int64_t>());
    }

    const json &obj_;
    std::string where_;
};

// What a reader works on: the language model's fields (`f`, the text tower of a multimodal
// config) and the spec, whose hidden size, decoder layer count, top-k and activation are already
// read from the common fields.
struct ReadContext {
    const Fields &f;
    const std::string &model_type;
    ModelSpec &spec;
    const std::string &where() const { return f.where(); }
};

using Reader = void (*)(ReadContext &);

// One supported model_type: the architecture it loads as and the reader of its fields.
struct ArchEntry {
    const char *model_type;
    const char *architecture;  // ModelSpec::architecture (names the tensor layout, see loader)
    Reader read;
};

// Every supported model_type, in the order the error message lists them.
const std::vector<ArchEntry> &arch_table();

// "qwen3_moe, qwen2_moe, ..." (each architecture once).
std::string supported_list();

int32_t parse_activation(const std::string &act, const std::string &where);

// Positive shared-expert width `unit * count` (0 when count is 0), bounded by the dimension limit.
int32_t shared_width(int64_t unit, int64_t count, const std::string &where, const char *what);

}  // namespace ft::config
