// The backends a session can run, in one table (backend_registry.cpp): the id (FT_BACKEND_*),
// the name, whether it takes device pointers, the probe that says whether it can run a model on
// this machine (and why not), and the factory that creates it. A new backend is its id in
// freetoken.h, its implementation (below the engine: cpu/ or cuda/) and one row of this table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ft/backend.hpp"
#include "ft/model.hpp"

namespace ft {

struct MachineCaps;

struct BackendInfo {
    int32_t id = 0;
    const char *name = "";
    bool device_path = false;  // takes device pointers (ft_decode_cuda) and runs on the engine's GPU
    // Empty string: the backend can run `model` on this machine. Otherwise the reason it cannot.
    std::string (*unavailable)(const MachineCaps &caps, const ModelSpec &model) = nullptr;
    // Creates the backend (throws ft::Error); null where this build lacks it (the probe then
    // says why).
    std::unique_ptr<Backend> (*make)(const BackendContext &ctx) = nullptr;
};

// Every backend, in the order `auto` prefers them when it only asks "available?" (gpu first).
const std::vector<BackendInfo> &backend_registry();

// The row of `id`, or null for an unknown id (FT_BACKEND_AUTO is a request, not a backend).
const BackendInfo *find_backend(int32_t id);
// The row named `name` ("cpu", "gpu", "offload", "hybrid"), or null.
const BackendInfo *find_backend(const std::string &name);

// Device bytes a GPU backend keeps for the model's expert biases (bf16 gpt-oss: every layer's
// gate/up and down biases in f32, resident for the session); 0 for models without them.
uint64_t gpu_bias_bytes(const ModelSpec &model);

}  // namespace ft
