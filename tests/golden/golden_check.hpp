// The golden check: a directory written by tools/golden/make_golden.py (a tiny checkpoint saved
// by transformers plus its MoE blocks' outputs and routes) loaded through the C API, routed with
// ft_route and decoded with ft_decode on one backend, compared with what transformers computed.
#pragma once

#include <string>
#include <vector>

#include "freetoken.h"

namespace ft::golden {

constexpr double kMaxWeightError = 1e-4;  // |ours - transformers| per routing weight
constexpr double kMaxRelativeL2 = 1e-2;   // ||ours - transformers|| / ||transformers|| per layer

struct LayerResult {
    int32_t layer = -1;          // checkpoint layer
    bool routes_equal = false;   // every token's expert set identical
    double max_weight_error = 0; // over the tokens whose sets are equal
    double relative_l2 = 0;      // of ft_decode's output (with transformers' routes)
    std::string detail;          // the first mismatch, if any
};

struct Result {
    std::string error;           // non-empty: the directory could not be checked (message)
    std::string skipped;         // non-empty: the backend refused the model (its message)
    std::string architecture;
    std::string transformers_version;
    std::vector<LayerResult> layers;

    bool passed() const;
};

// The subdirectories of `root` holding a golden.json, sorted by name.
std::vector<std::string> golden_dirs(const std::string &root);

// Loads `dir` on an engine with or without a GPU (as `backend` needs) and checks every layer of
// its manifest on `backend`.
Result check_dir(const std::string &dir, int32_t backend);

}  // namespace ft::golden
