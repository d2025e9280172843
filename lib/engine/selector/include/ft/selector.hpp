// Backend selection over the backend registry (backend_registry.hpp: each backend's id, name,
// probe and factory). A requested backend runs when its probe says it can run the model on this
// machine, else the request is refused with the probe's reason. `auto` takes the resident GPU
// backend when every expert fits the VRAM budget; otherwise, with a profile of this machine, the
// available backend with the lowest predicted step time (model below), and without one a fixed
// fallback (select_backend's comment).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ft/model.hpp"
#include "ft/profile.hpp"

namespace ft {

struct MachineCaps {
    bool gpu = false;             // a usable CUDA device is attached to the engine
    bool gpu_kernels = false;     // this build has the GPU backends (built with CUDA)
    uint64_t gpu_free_bytes = 0;
    uint64_t vram_reserve_bytes = 0;  // what the session leaves free (ft_session_params)
    int32_t cpu_threads = 0;
    bool shared_experts = false;  // the session wants the shared expert(s) computed
};

// What `auto` weighs beyond the machine and the model.
struct SelectionInputs {
    const Profile *profile = nullptr;  // this machine's usable profile (GPU name checked), or null
    int64_t cache_slots = 0;           // the session's slot cache request (ft_session_params)
    double cache_fraction = 0.0;
    double hbm_gbs = 0.0;              // GPU memory read rate for cache hits; 0: kDefaultHbmGbs
};

// An H200 reads ~4.8 TB/s, consumer cards 0.5-1.8; hits are a small part of a step either way.
inline constexpr double kDefaultHbmGbs = 3000.0;

// Predicted time of one MoE layer's decode step at one token (K experts of B bytes each), per
// backend, in seconds; 0 where a backend has no prediction:
//   cpu:     K B / cpu
//   offload: (1 - h) K B / gather + h K B / hbm
//   hybrid:  max(f M / gather_ov, (1 - f) M / cpu_ov) + h K B / hbm,  M = (1 - h) K B
//   gpu:     K B / hbm (every expert resident)
// with f the profile's fetch fraction and h the expected hit rate of the slot cache. Hit model:
// routing uniform over a layer's experts, so a cache holding a fraction s of all experts hits
// with probability h = s. Real routers are skewed, which only raises the hit rate of an LRU cache,
// so h = s is a floor: the prediction errs towards the CPU when offload and cpu are close.
// The rates are the profile's for the format, measured at its canonical geometry
// (docs/formulas.md, "Bandwidth profile").
struct StepPrediction {
    bool usable = false;       // cpu and gather figures present: offload and cpu are predicted
    std::string formats;       // the format keys weighed, e.g. "bf16" or "q4_k 71% + q6_k 29%"
    std::string source;        // the profile entries the figures came from, e.g. "dtype_kernels.bf16"
    std::string missing;       // the format keys without cpu and gather figures ("" when usable)
    double cpu_gbs = 0, gather_gbs = 0, cpu_ov_gbs = 0, gather_ov_gbs = 0, hbm_gbs = 0;
    double slot_fraction = 0, hit_rate = 0, fetch_fraction = 0;
    double cpu_s = 0, offload_s = 0, hybrid_s = 0, gpu_s = 0;
};

// The figures of the model's format in `profile` (the first entry with both cpu and gather
// figures, in the reader's order: dtype_kernels, then each workload) and the predicted step times
// of `model` for a slot cache holding `slot_fraction` of all experts. A model that mixes formats
// (per matrix or per layer) is predicted from its formats' figures weighted by their bytes: each
// rate is 1 / sum(s_f / rate_f), with s_f format f's share of the routed bytes (every layer's
// gate/up bank in its format, its down bank in its own), the rate at which the model's bytes
// move when each format's part moves at its own rate; every format must have figures.
StepPrediction predict_step(const Profile &profile, const ModelSpec &model, double slot_fraction, double hbm_gbs = 0.0);

// The hybrid fetch fraction for `model`: for one format the reader rules (hybrid_fetch_fraction);
// for a model mixing formats the same rule (entry_fetch_fraction) over the byte-weighted figures
// above. Nothing when the profile has no figures for some format of the model.
std::optional<double> model_fetch_fraction(const Profile &profile, const ModelSpec &model);

// The slots an offload/hybrid session would get (plan_slots of the slot cache, the rule the GPU
// backends size with: explicit count, else fraction, else what the free memory beyond the reserve
// holds after the two prefill layer buffers), as a fraction of all L E experts; 0 if not even one
// layer fits.
double expected_slot_fraction(const MachineCaps &caps, const ModelSpec &model, const SelectionInputs &in);

struct BackendChoice {
    int32_t backend = FT_BACKEND_CPU;
    std::string reason;           // why this backend, with the numbers, for logs and tools
    StepPrediction prediction;    // `auto` beyond the resident GPU: what was compared
};

const char *backend_name(int32_t backend);  // "cpu", "gpu", "offload", "hybrid", "auto", or "unknown"

// Resolves `requested` (FT_BACKEND_*) for this model and machine. Throws FT_ERR_INVALID_ARGUMENT
// for unknown values and FT_ERR_UNSUPPORTED when the requested backend cannot run here.
// `auto`: gpu when every expert fits the GPU memory beyond the reserve; else the available
// backend of lowest predicted step time when the profile has the format's cpu and gather figures
// (hybrid only with its overlapped figures); else the fallback: cpu without a GPU (or when one
// layer does not fit), offload with one. Without measurements the CPU/bus ratio is unknown;
// offload runs wherever a GPU does, gains from every cache hit, and was the original engine's
// choice without a profile, while the CPU only wins on machines whose memory clearly outruns the
// bus at low hit rates, which only a profile can show (`ft profile`).
BackendChoice select_backend(int32_t requested, const MachineCaps &caps, const ModelSpec &model,
                             const SelectionInputs &inputs);
// The same without a profile or cache request.
BackendChoice select_backend(int32_t requested, const MachineCaps &caps, const ModelSpec &model);

}  // namespace ft
