// How ft names and prints what the library reports: status checks, the names of backends,
// activations, formats and routing rules, the model and engine summaries (text and JSON).
#pragma once

#include <cstdint>
#include <string>

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

void print_model(const ft_model_info &m);
void print_engine(ft_engine *engine);
nlohmann::json model_json(const ft_model_info &m, const std::string &path, bool synthetic);
nlohmann::json profile_json(const ProfileStatus &p);

}  // namespace ft::tool
