// What the three GPU session backends share (gpu_backends.cpp lists the files): CudaBackend
// (staging of host-pointer calls, the decode kernels, the prefill path, the lost-device state and
// per-layer statistics rows on the device) and the factories of the backends. Private to
// ft_cuda_backends.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "ft/backend.hpp"
#include "ft/common.hpp"
#include "ft/cuda_check.hpp"
#include "ft/cuda_experts.hpp"
#include "ft/cuda_memory.hpp"
#include "ft/cuda_prefill.hpp"
#include "ft/model.hpp"
#include "ft/slotcache.hpp"
#include "shared_expert.hpp"

namespace ft::gpu_backend {

using cuda::check;
using cuda::DeviceBuffer;
using cuda::DeviceScope;
using cuda::Event;
using cuda::PinnedBuffer;
using cuda::Stream;

cuda::DeviceActivation activation_of(const ModelSpec &s);

class CudaBackend : public Backend {
public:
    explicit CudaBackend(const BackendContext &ctx);

    bool device_path() const override { return true; }
    bool has_prefill() const { return prefill_ != nullptr; }
    ft_status status() const override { return lost_ ? FT_ERR_DEVICE_LOST : FT_OK; }

    // Refuses work once lost; a FT_ERR_DEVICE_LOST from any path of the call marks the backend lost.
    void decode(const DecodeCall &c, ft_session_stats &stats) override;
    void add_device_stats(ft_session_stats &stats) const override;
    void layer_stats(int32_t layer, ft_layer_stats &out) const override;
    void reset_stats() override;

protected:
    // Per-layer statistic columns (same meaning as the slot cache's SlotCacheStat columns).
    static constexpr int kLayerColumns = kStatColumns;

    // Few-token path: rewrite ids into slots of this backend's device experts and run the decode
    // kernels, all on `stream`, without any host synchronisation.
    virtual void run_decode(int32_t layer, const uint16_t *x, const int32_t *ids, const float *w, uint16_t *y,
                            int32_t tokens, cudaStream_t stream) = 0;
    // Many-token path: device experts of `layer` that hold every expert at slot = expert id
    // (resident arrays, or a streamed copy of the layer), ready on `stream`.
    virtual cuda::DeviceExperts prefill_experts(int32_t layer, cudaStream_t stream, ft_session_stats &stats) = 0;
    // Statistic rows [layer][kStatColumns] of the slot cache, or of the resident layer counters.
    virtual std::vector<int64_t> read_layer_stats() const;
    virtual void clear_cache_stats() {}

    // Records a FT_ERR_DEVICE_LOST error as the backend's sticky state; false for other errors.
    bool note_lost(const Error &e) const;
    // The statistic rows, or empty once the device is lost (which this records).
    std::vector<int64_t> guarded_rows() const;
    // layer >= 0: fetched_bytes counts that layer's own expert bytes (models mixing formats).
    ft_layer_stats to_layer_stats(const int64_t *row, int32_t layer = -1) const;
    // MoE layer `layer`'s experts in `arrays` from slot `slot_offset` on, at the banks' row sizes:
    // the layer's formats (gate_up's and down's differ only in models mixing GGUF block formats)
    // and, when the experts carry biases (bf16 gpt-oss), the layer's bias tables, indexed by
    // expert id (so the decode also needs the call's expert ids).
    cuda::DeviceExperts device_experts(const std::vector<DeviceBuffer> &arrays, size_t slot_offset, int32_t layer) const;

    BackendContext ctx_;
    const ModelSpec &spec_;
    int device_;
    int32_t threshold_, decode_max_ = 0;
    size_t expert_bytes_ = 0;
    DeviceBuffer slots_, layer_stats_;
    // bf16 gpt-oss: every layer's expert biases (f32, as the cpu backend adds them), resident for
    // the session: per layer [E, 2I] gate/up then [E, H] down. Empty for other models.
    DeviceBuffer biases_;
    std::unique_ptr<cuda::ExpertDecoder> decoder_;

private:
    // One call: stage host pointers, run the decode or the prefill path, copy a host call's output back.
    void run(const DecodeCall &c, ft_session_stats &stats);
    void stage_host_call(const DecodeCall &c, cudaStream_t stream);
    void run_prefill(const DecodeCall &c, const uint16_t *x, const int32_t *ids, const float *w, uint16_t *y,
                     cudaStream_t stream, ft_session_stats &stats);
    static void require_device_memory(const void *p, const char *name);
    void upload_biases();

    Stream own_;
    DeviceBuffer in_x_, in_ids_, in_w_, out_y_;
    DeviceBuffer scaled_x_, ones_;  // FT_ROUTE_WEIGHT_INPUT: w x per token and unit weights
    PinnedBuffer host_in_, host_out_, host_ids_;
    std::unique_ptr<cuda::ExpertPrefill> prefill_;
    std::unique_ptr<SharedExperts> shared_;  // when the session asked for shared experts
    mutable bool lost_ = false;
    mutable std::string lost_message_;
};

std::unique_ptr<Backend> make_resident_backend(const BackendContext &ctx);
std::unique_ptr<Backend> make_offload_backend(const BackendContext &ctx);
std::unique_ptr<Backend> make_hybrid_backend(const BackendContext &ctx);

}  // namespace ft::gpu_backend
