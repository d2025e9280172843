// Engine (machine context), loaded-model wrapper and decode session: the C++ objects behind the
// ft_engine, ft_model and ft_session handles.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "freetoken.h"
#include "ft/trace.hpp"
#include "ft/backend.hpp"
#include "ft/cpu.hpp"
#include "ft/cuda_device.hpp"
#include "ft/knobs.hpp"
#include "ft/loader.hpp"
#include "ft/model.hpp"
#include "ft/selector.hpp"

namespace ft {

class Engine {
public:
    explicit Engine(const ft_engine_params &params);

    int32_t device() const { return device_; }  // FT_DEVICE_NONE without a GPU
    const std::string &device_name() const { return device_name_; }
    cpu::Isa isa() const { return isa_; }
    int32_t physical_cores() const { return physical_cores_; }
    cpu::ThreadPool &pool() { return *pool_; }
    // The knobs as the environment had them when this engine was created (docs/knobs.md).
    const Tuning &tuning() const { return tuning_; }
    MachineCaps caps() const;

private:
    Tuning tuning_;
    int32_t device_ = FT_DEVICE_NONE;
    std::string device_name_;
    cpu::Isa isa_;
    int32_t physical_cores_ = 0;
    std::unique_ptr<cpu::ThreadPool> pool_;
};

// A model plus the page-locking of its banks for the engine's GPU. The registrations are
// released before the banks they cover are unmapped (member order).
class LoadedModel {
public:
    LoadedModel(Engine &engine, std::unique_ptr<Model> model);
    static std::unique_ptr<LoadedModel> load(Engine &engine, const std::string &path, const ft_model_load_params &p);

    Engine &engine() { return engine_; }
    Model &model() { return *model_; }
    const Model &model() const { return *model_; }
    bool finalized() const { return finalized_; }
    uint64_t pinned_bytes() const;

    // Expert-by-expert building (ft_model_create path).
    void set_expert(int32_t layer, int32_t expert, int32_t proj, const void *data, size_t nbytes);
    void set_router_bias(int32_t layer, const float *bias, int32_t n);
    void finalize();  // checks completeness, pins, freezes

private:
    // Page-locks every bank of `layer` for the engine's GPU; a failure only warns (the CPU
    // reads pageable memory as well).
    void pin_banks(Model &model, int32_t layer);


    Engine &engine_;
    std::unique_ptr<Model> model_;
    std::vector<uint8_t> written_;  // [layer][expert][proj] for the building path
    bool finalized_ = false;
    mutable std::mutex pin_mutex_;
    bool pin_warned_ = false;
    std::vector<cuda::HostRegistration> pins_;  // destroyed before model_
    uint64_t pinned_bytes_ = 0;
};

class Session {
public:
    Session(LoadedModel &model, const ft_session_params &params);

    int32_t backend() const { return backend_; }
    // FT_CACHE_LRU / FT_CACHE_FREQUENCY for the slot-cache backends (AUTO resolved), else -1.
    int32_t cache_policy() const { return cache_policy_; }
    int32_t max_tokens() const { return params_.max_tokens; }
    bool shared_experts() const { return params_.shared_experts; }
    const std::string &backend_reason() const { return backend_reason_; }  // the selector's reason
    void route(int32_t layer, int32_t num_tokens, const float *logits, int32_t *ids, float *weights);
    // ft_route_tokens (tokens_call) and ft_route: token_ids (may be null) select the experts of
    // the hash-routed layers; ft_route refuses those layers.
    void route_tokens(int32_t layer, int32_t num_tokens, const float *logits, const int32_t *token_ids, int32_t *ids,
                      float *weights, bool tokens_call = true);
    void decode(const DecodeCall &call);
    // Host counters plus the backend's device figures (may wait for the backend's GPU work).
    ft_session_stats stats() const;
    void layer_stats(int32_t layer, ft_layer_stats &out) const;
    void reset_stats();
    ft_status status() const { return impl_->status(); }
    int32_t device() const;

private:
    LoadedModel &model_;
    ft_session_params params_;
    int32_t backend_ = FT_BACKEND_CPU;
    int32_t cache_policy_ = -1;
    std::string backend_reason_;
    std::unique_ptr<Backend> impl_;
    ft_session_stats stats_{};
    std::unique_ptr<RouteRecorder> recorder_;  // FT_TRACE_ROUTES: every host ft_decode's routes
};

}  // namespace ft
