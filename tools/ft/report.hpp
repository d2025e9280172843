// How ft names and prints what the library reports: status checks, the names of backends,
// activations, formats and routing rules, the model and engine summaries (text and JSON).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "freetoken.h"
#include "profile_cmd.hpp"

namespace ft::tool {

// 0 for FT_OK; otherwise prints "ft: WHAT failed: STATUS: DETAIL" on stderr and returns 1.
int check(ft_status s, const char *what, const char *detail);

// ft_model_load_params.progress over a ProgressBar (user).
bool progress_cb(void *user, const char *, uint64_t done, uint64_t total);

const char *backend_name(int32_t b);  // for text: "offload (GPU slot cache)"
const char *backend_key(int32_t b);   // for JSON: "offload"
bool gpu_backend(int32_t b);
const char *act_name(int32_t a);
const char *format_name(int32_t f);   // values of ft_model_info.format
const char *routing_name(int32_t r);

// Runs of consecutive MoE layers with the same {gate_up, down} formats (one run unless
// m.mixed_formats; then read from `model` with ft_model_layer_formats).
struct FormatRun {
    int32_t first, last, gate_up, down;
};
std::vector<FormatRun> format_runs(const ft_model *model, const ft_model_info &m);
// "0-3 q4_k/q6_k, 4 q4_k": layers, gate_up format, "/down format" where it differs.
std::string format_mix(const std::vector<FormatRun> &runs);

// Each format's share of the routed-expert bytes: every MoE layer's gate/up matrices in their
// format and its down matrix in its own (the weighting the backend selector uses); largest first.
// One entry of share 1 unless m.mixed_formats (then read from `model`).
std::vector<FormatShare> format_shares(const ft_model *model, const ft_model_info &m);
// The bytes of one expert of each MoE layer, in that layer's formats (all m.expert_bytes unless
// m.mixed_formats).
std::vector<uint64_t> layer_expert_bytes(const ft_model *model, const ft_model_info &m);
// "q4_k 77% + q6_k 23%".
std::string shares_text(const std::vector<FormatShare> &shares);

// `model` (may be null) supplies the per-layer formats of a model that mixes them.
void print_model(const ft_model_info &m, const ft_model *model = nullptr);
void print_engine(ft_engine *engine);
nlohmann::json model_json(const ft_model_info &m, const std::string &path, bool synthetic,
                          const ft_model *model = nullptr);
nlohmann::json profile_json(const ProfileStatus &p);

}  // namespace ft::tool
