// The interface between a session and the backend that computes its routed experts. Below the
// backends (cpu/, cuda/backends) that implement it and the engine (lib/engine/session) that uses it.
#pragma once

#include <cstdint>

#include "freetoken.h"
#include "ft/knobs.hpp"

namespace ft {

namespace cpu {
class ThreadPool;
}
class Model;

// One ft_decode / ft_decode_cuda call, validated by the session (host path: ids in range and
// values finite; device path: pointers non-null only).
// Which part of a MoE layer a call computes when the session adds shared experts. `skip`: the
// routed experts only; `only`: out = bf16(out + shared(hidden)), ids and weights unused (device
// path; the EP group adds the shared expert(s) once per token to its combined output).
enum class SharedPart : uint8_t { with_routed, skip, only };

struct DecodeCall {
    int32_t layer = 0;
    int32_t num_tokens = 0;
    const uint16_t *hidden = nullptr;
    const int32_t *ids = nullptr;
    const float *weights = nullptr;
    uint16_t *out = nullptr;
    bool on_device = false;   // pointers are device memory; enqueue on `stream`, do not wait
    void *stream = nullptr;   // cudaStream_t of a device call
    SharedPart shared = SharedPart::with_routed;
};

// What a backend may use of its engine and session.
struct BackendContext {
    int32_t device = FT_DEVICE_NONE;
    cpu::ThreadPool *pool = nullptr;
    int cpu_isa = 0;  // cpu::Isa
    const Model *model = nullptr;
    ft_session_params params{};
    Tuning tuning;  // the engine's knobs
};

// A backend computes the routed experts of decode calls. One per session, used by one thread at
// a time. Errors are thrown as ft::Error.
class Backend {
public:
    virtual ~Backend() = default;
    virtual void decode(const DecodeCall &call, ft_session_stats &stats) = 0;
    // Whether decode() takes device pointers (DecodeCall::on_device).
    virtual bool device_path() const { return false; }
    // Adds figures kept on the device to `stats` (may wait for the backend's GPU work).
    virtual void add_device_stats(ft_session_stats &stats) const { (void)stats; }
    virtual void layer_stats(int32_t layer, ft_layer_stats &out) const { (void)layer, (void)out; }
    virtual void reset_stats() {}
    // FT_OK or a sticky state (FT_ERR_DEVICE_LOST, FT_ERR_TIMEOUT).
    virtual ft_status status() const { return FT_OK; }
};

}  // namespace ft
