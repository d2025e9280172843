// JSON read from files under the limits of docs/limits.md. Header-only: include it only from
// modules that link nlohmann_json (loader, profile).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "ft/common.hpp"

namespace ft {

// A parser callback for J::parse that fails with FT_ERR_FORMAT "<where>: JSON nested deeper than
// N levels" past limits::kMaxJsonDepth, so no later recursive walk (dump, comparison) of a
// hostile document can exhaust the stack.
template <typename J>
typename J::parser_callback_t json_depth_guard(std::string where) {
    return [where = std::move(where)](int depth, typename J::parse_event_t, J &) {
        if (depth > limits::kMaxJsonDepth)
            fail(FT_ERR_FORMAT, where, ": JSON nested deeper than ", limits::kMaxJsonDepth, " levels");
        return true;
    };
}

// A value for an error message: scalars and arrays of at most 16 numbers as JSON, other arrays
// and objects by their size only (a hostile value can be megabytes long).
template <typename J>
std::string json_brief(const J &v) {
    if (v.is_array()) {
        bool small = v.size() <= 16;
        for (const J &e : v) small = small && e.is_number();
        if (!small) return cat("an array of ", v.size(), " elements");
    }
    if (v.is_object()) return cat("an object of ", v.size(), " members");
    std::string s = v.dump();
    if (s.size() > 80) s = s.substr(0, 77) + "...";
    return s;
}

}  // namespace ft
