// The `offload` backend (backend_offload.cpp): a slot cache of hot experts in device memory, each
// call's misses fetched from the page-locked host banks by a zero-copy gather; prefill streams
// whole layers through two buffers of its own. The hybrid backend builds on it. Private to
// ft_cuda_backends.
#pragma once

#include <vector>

#include "backend_base.hpp"
#include "ft/slotcache.hpp"

namespace ft::gpu_backend {

class OffloadBackend : public CudaBackend {
    struct PrefillBuffer {
        std::vector<DeviceBuffer> arrays;  // per bank: [E] experts of `layer`
        int32_t layer = -1;
        Event ready, free;  // copy finished; computes before the copy finished with the buffer
    };

public:
    explicit OffloadBackend(const BackendContext &ctx);

    int32_t slots() const { return shape_.slots; }

protected:
    void run_decode(int32_t layer, const uint16_t *x, const int32_t *ids, const float *w, uint16_t *y, int32_t tokens,
                    cudaStream_t stream) override;
    // Copies the plan the last admission left on the device into the slots (zero-copy kernel).
    void gather(int32_t layer, cudaStream_t stream);
    // The layer's experts copied whole into one of two buffers by the copy engine; the next
    // layer is fetched into the other buffer while this one computes.
    cuda::DeviceExperts prefill_experts(int32_t layer, cudaStream_t stream, ft_session_stats &stats) override;
    std::vector<int64_t> read_layer_stats() const override;
    void clear_cache_stats() override;

private:
    void map_host_banks();  // the device address of every page-locked layer bank
    void allocate_slots();  // the slot cache state and slot arrays, sized per the session params
    void load_layer(PrefillBuffer &buf, int32_t layer, cudaStream_t stream, ft_session_stats &stats);

    SlotCacheShape shape_;
    DeviceBuffer state_buf_;

protected:
    SlotCacheState state_;
    std::vector<DeviceBuffer> slot_arrays_;
    std::vector<const uint8_t *> host_banks_;  // [layer][bank] device addresses of pinned banks

private:
    PrefillBuffer prefill_buf_[2];
    int next_buf_ = 0;
    Stream copy_;
};

}  // namespace ft::gpu_backend
