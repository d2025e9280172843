// The `offload` backend (backend_offload.hpp).
#include "backend_offload.hpp"

#include <algorithm>
#include <climits>

#include "ft/cuda_device.hpp"
#include "ft/cuda_gather.hpp"
#include "ft/slotcache_cuda.hpp"

namespace ft::gpu_backend {

OffloadBackend::OffloadBackend(const BackendContext &ctx) : CudaBackend(ctx) {
    DeviceScope scope(device_);
    const ExpertBanks &banks = ctx.model->banks();
    const int nb = banks.num_banks();
    if (nb > 8) fail(FT_ERR_INTERNAL, "offload: ", nb, " banks, at most 8 supported");
    map_host_banks();
    // Prefill streams whole layers through two buffers of its own (never the decode slots), each
    // sized for the largest layer.
    if (has_prefill()) {
        for (auto &buf : prefill_buf_) {
            for (int b = 0; b < nb; ++b)
                buf.arrays.emplace_back(banks.row_bytes(b) * size_t(spec_.num_experts), "allocating the prefill layer buffers");
        }
    }
    allocate_slots();
}

void OffloadBackend::map_host_banks() {
    const ExpertBanks &banks = ctx_.model->banks();
    const int nb = banks.num_banks();
    // Zero-copy reads need the device address of every page-locked layer bank.
    for (int32_t l = 0; l < spec_.num_layers; ++l) {
        for (int b = 0; b < nb; ++b) {
            void *dev = nullptr;
            const cudaError_t e = cudaHostGetDevicePointer(&dev, const_cast<uint8_t *>(banks.layer_base(b, l)), 0);
            if (e != cudaSuccess) {
                if (cuda::sticky_error(e)) cuda::throw_cuda(e, "offload: cudaHostGetDevicePointer");
                cudaGetLastError();
                fail(FT_ERR_UNSUPPORTED, "offload needs the expert banks page-locked for GPU ", device_, " (layer ", l,
                     " bank ", b, ": ", cudaGetErrorString(e), "); load the model with an engine on this device");
            }
            host_banks_.push_back(static_cast<const uint8_t *>(dev));
        }
    }
}

void OffloadBackend::allocate_slots() {
    const ExpertBanks &banks = ctx_.model->banks();
    const int nb = banks.num_banks();
    const cuda::MemoryInfo mem = cuda::memory_info(device_);
    SlotRequest req;
    req.count = ctx_.params.cache_slots;
    req.fraction = ctx_.params.cache_fraction;
    req.free_bytes = mem.free_bytes;
    req.reserve_bytes = ctx_.params.vram_reserve_bytes;
    const int64_t S = plan_slot_count(req, spec_.num_layers, spec_.num_experts, expert_bytes_);
    shape_.layers = spec_.num_layers;
    shape_.experts = spec_.num_experts;
    shape_.slots = int32_t(std::min<int64_t>(S, INT32_MAX));
    shape_.plan_capacity = plan_capacity_for(int64_t(std::max(decode_max_, 1)) * spec_.top_k, shape_.slots);
    shape_.policy = slot_policy_for(ctx_.params.cache_policy, ctx_.params.cache_half_life, spec_.num_layers);
    state_buf_ = DeviceBuffer(slot_cache_bytes(shape_), "allocating the slot cache state");
    state_ = slot_cache_bind(shape_, state_buf_.get());
    check(cuda::launch_slot_cache_reset(state_, nullptr), "resetting the slot cache");
    check(cuda::launch_slot_cache_clear_stats(state_, nullptr), "resetting the slot cache");
    for (int b = 0; b < nb; ++b) {
        slot_arrays_.emplace_back(banks.row_bytes(b) * size_t(shape_.slots), "allocating GPU expert slots");
        // A slot holds the bank's largest row over the layers (row_bytes); a layer of a model
        // mixing block formats fills the first layer_row_bytes of it.
        // Free slots hold NaN in every format (0xFF bytes: bf16/fp16 NaN, e4m3 and e8m0 NaN
        // codes), so a kernel that ever reads an unfilled slot shows up in its output.
        check(cudaMemset(slot_arrays_.back().get(), 0xff, slot_arrays_.back().bytes()), "poisoning free slots");
    }
    check(cudaDeviceSynchronize(), "initialising the slot cache");
    log(FT_LOG_INFO, "offload: ", shape_.slots, " slots of ", expert_bytes_ / 1e6, " MB (", 100.0 * shape_.slots /
        (double(spec_.num_layers) * spec_.num_experts), "% of all experts), ", mem.free_bytes / 1e9, " GB were free");
}

void OffloadBackend::run_decode(int32_t layer, const uint16_t *x, const int32_t *ids, const float *w, uint16_t *y,
                                int32_t tokens, cudaStream_t stream) {
    int32_t *slots = slots_.get<int32_t>();
    check(cuda::launch_admit_lru(state_, layer, ids, slots, int64_t(tokens) * spec_.top_k, stream), "launching admission");
    gather(layer, stream);
    check(decoder_->decode(device_experts(slot_arrays_, 0, layer), x, slots, w, nullptr, y, tokens, stream, ids),
          "launching the expert kernels");
}

void OffloadBackend::gather(int32_t layer, cudaStream_t stream) {
    cuda::GatherBank gb[8];
    const int nb = ctx_.model->banks().num_banks();
    for (int b = 0; b < nb; ++b) {
        gb[b].host_layer = host_banks_[size_t(layer) * nb + b];
        gb[b].slots = slot_arrays_[b].get();
        gb[b].row_bytes = ctx_.model->banks().layer_row_bytes(b, layer);
        gb[b].slot_bytes = ctx_.model->banks().row_bytes(b);
    }
    cuda::GatherPlan plan;
    plan.evict_slots = state_.evict_slots;
    plan.src_indices = state_.src_indices;
    plan.num_indices = state_.num_indices;
    plan.capacity = shape_.plan_capacity;
    check(cuda::launch_gather_zero_copy(gb, nb, plan, stream), "launching the gather");
}

cuda::DeviceExperts OffloadBackend::prefill_experts(int32_t layer, cudaStream_t stream, ft_session_stats &stats) {
    PrefillBuffer *use = nullptr;
    for (auto &b : prefill_buf_)
        if (b.layer == layer) use = &b;
    if (!use) {
        use = &prefill_buf_[next_buf_];
        load_layer(*use, layer, stream, stats);
    }
    check(cudaStreamWaitEvent(stream, use->ready.get(), 0), "waiting for the prefill layer copy");
    // Prefetch the next layer into the other buffer once this call's compute no longer
    // needs it (the compute enqueued after this returns uses `use`).
    PrefillBuffer &other = prefill_buf_[use == &prefill_buf_[0] ? 1 : 0];
    next_buf_ = use == &prefill_buf_[0] ? 1 : 0;
    const int32_t next = (layer + 1) % spec_.num_layers;
    if (other.layer != next && spec_.num_layers > 1) load_layer(other, next, stream, stats);
    // The layer is copied compactly: its own rows, in its own formats.
    cuda::DeviceExperts d = device_experts(use->arrays, 0, layer);
    for (int b = 0; b < d.num_banks; ++b) d.row_bytes[b] = ctx_.model->banks().layer_row_bytes(b, layer);
    return d;
}

void OffloadBackend::load_layer(PrefillBuffer &buf, int32_t layer, cudaStream_t stream, ft_session_stats &stats) {
    const ExpertBanks &banks = ctx_.model->banks();
    // The copy stream must not overwrite the buffer while a compute still reads it.
    check(cudaEventRecord(buf.free.get(), stream), "recording a prefill event");
    check(cudaStreamWaitEvent(copy_.get(), buf.free.get(), 0), "ordering the prefill copy");
    for (int b = 0; b < banks.num_banks(); ++b) {
        const size_t bytes = banks.layer_row_bytes(b, layer) * size_t(spec_.num_experts);
        check(cudaMemcpyAsync(buf.arrays[b].get(), banks.layer_base(b, layer), bytes, cudaMemcpyHostToDevice, copy_.get()),
              "streaming a layer for prefill");
        stats.prefill_bytes += bytes;
    }
    check(cudaEventRecord(buf.ready.get(), copy_.get()), "recording a prefill event");
    buf.layer = layer;
}

std::vector<int64_t> OffloadBackend::read_layer_stats() const {
    std::vector<int64_t> rows(size_t(spec_.num_layers) * kStatColumns);
    DeviceScope scope(device_);
    check(cudaDeviceSynchronize(), "waiting for the GPU");
    check(cudaMemcpy(rows.data(), state_.stats, rows.size() * sizeof(int64_t), cudaMemcpyDeviceToHost), "reading GPU statistics");
    return rows;
}

void OffloadBackend::clear_cache_stats() {
    check(cuda::launch_slot_cache_clear_stats(state_, nullptr), "clearing slot cache statistics");
    check(cudaDeviceSynchronize(), "clearing slot cache statistics");
}

std::unique_ptr<Backend> make_offload_backend(const BackendContext &ctx) { return std::make_unique<OffloadBackend>(ctx); }

}  // namespace ft::gpu_backend
