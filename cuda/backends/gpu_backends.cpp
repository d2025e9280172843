// The GPU session backends: `gpu` keeps every expert in device memory, `offload` keeps a slot
// cache of hot experts and fetches each call's misses from the page-locked host banks, `hybrid`
// is offload with a bandwidth-matched share of the misses computed by the CPU (docs/formulas.md,
// "Hybrid split"). All three run few-token calls through the decode kernels (capturable, no host
// sync) and calls of prefill_min_tokens or more through the prefill path (GEMMs on the routing
// read on the host).
#include "ft/cuda_backends.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ft/common.hpp"
#include "ft/cuda_device.hpp"
#include "ft/cuda_experts.hpp"
#include "ft/cuda_gather.hpp"
#include "ft/cuda_handoff.hpp"
#include "ft/cpu.hpp"
#include "ft/hybrid.hpp"
#include "ft/cuda_prefill.hpp"
#include "ft/device_util.hpp"
#include "ft/formats.hpp"
#include "ft/model.hpp"
#include "ft/slotcache.hpp"
#include "ft/slotcache_cuda.hpp"

namespace ft {

namespace {

// Errors after which the CUDA context is unusable: every later call fails the same way.
bool sticky(cudaError_t e) {
    switch (e) {
        case cudaErrorIllegalAddress:
        case cudaErrorLaunchFailure:
        case cudaErrorHardwareStackError:
        case cudaErrorIllegalInstruction:
        case cudaErrorMisalignedAddress:
        case cudaErrorInvalidAddressSpace:
        case cudaErrorInvalidPc:
        case cudaErrorAssert:
        case cudaErrorECCUncorrectable:
        case cudaErrorLaunchTimeout:
        case cudaErrorContextIsDestroyed:
        case cudaErrorDevicesUnavailable:
            return true;
        default:
            return false;
    }
}

[[noreturn]] void throw_cuda(cudaError_t e, const char *what) {
    const ft_status s = sticky(e) ? FT_ERR_DEVICE_LOST : e == cudaErrorMemoryAllocation ? FT_ERR_OUT_OF_MEMORY : FT_ERR_DEVICE;
    fail(s, what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) throw_cuda(e, what);
}

// Owning device allocation.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes, const char *what) : bytes_(bytes) {
        if (bytes) check(cudaMalloc(&p_, bytes), what);
    }
    ~DeviceBuffer() {
        if (p_) cudaFree(p_);
    }
    DeviceBuffer(DeviceBuffer &&o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }
    DeviceBuffer &operator=(DeviceBuffer &&o) noexcept {
        std::swap(p_, o.p_);
        std::swap(bytes_, o.bytes_);
        return *this;
    }
    template <typename T = uint8_t>
    T *get() const { return static_cast<T *>(p_); }
    size_t bytes() const { return bytes_; }

private:
    void *p_ = nullptr;
    size_t bytes_ = 0;
};

// Owning page-locked host allocation (staging of host-pointer calls).
class PinnedBuffer {
public:
    PinnedBuffer() = default;
    // Page-locked, portable and mapped: device() is the address kernels use for the same bytes.
    explicit PinnedBuffer(size_t bytes, const char *what) {
        if (!bytes) return;
        check(cudaHostAlloc(&p_, bytes, cudaHostAllocPortable | cudaHostAllocMapped), what);
        const cudaError_t e = cudaHostGetDevicePointer(&d_, p_, 0);
        if (e != cudaSuccess) {
            cudaFreeHost(p_);
            p_ = nullptr;
            check(e, what);
        }
    }
    ~PinnedBuffer() {
        if (p_) cudaFreeHost(p_);
    }
    PinnedBuffer(PinnedBuffer &&o) noexcept : p_(o.p_), d_(o.d_) { o.p_ = o.d_ = nullptr; }
    PinnedBuffer &operator=(PinnedBuffer &&o) noexcept {
        std::swap(p_, o.p_);
        std::swap(d_, o.d_);
        return *this;
    }
    template <typename T = uint8_t>
    T *get() const { return static_cast<T *>(p_); }
    template <typename T = uint8_t>
    T *device() const { return static_cast<T *>(d_); }

private:
    void *p_ = nullptr;
    void *d_ = nullptr;
};

class Stream {
public:
    Stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "creating a CUDA stream"); }
    ~Stream() {
        if (s_) cudaStreamDestroy(s_);
    }
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
    cudaStream_t get() const { return s_; }

private:
    cudaStream_t s_ = nullptr;
};

class Event {
public:
    explicit Event(bool timing = false) {
        check(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming), "creating a CUDA event");
    }
    ~Event() {
        if (e_) cudaEventDestroy(e_);
    }
    Event(const Event &) = delete;
    Event &operator=(const Event &) = delete;
    cudaEvent_t get() const { return e_; }

private:
    cudaEvent_t e_ = nullptr;
};

// Makes `device` current for the scope of one call (the caller's thread may have another).
class DeviceScope {
public:
    explicit DeviceScope(int device) {
        check(cudaGetDevice(&previous_), "cudaGetDevice");
        if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
        device_ = device;
    }
    ~DeviceScope() {
        if (previous_ != device_) cudaSetDevice(previous_);
    }

private:
    int previous_ = 0, device_ = 0;
};

cuda::DeviceActivation activation_of(const ModelSpec &s) {
    cuda::DeviceActivation a;
    a.kind = s.activation;
    a.alpha = s.swiglu_alpha;
    a.limit = s.swiglu_limit;
    return a;
}

int32_t prefill_threshold(const ft_session_params &p) { return p.prefill_min_tokens > 0 ? p.prefill_min_tokens : 64; }

// Shared by the three backends: staging of host-pointer calls, the decode kernels, the prefill
// path, sticky-error bookkeeping and per-layer statistics rows kept on the device.
class CudaBackend : public Backend {
public:
    explicit CudaBackend(const BackendContext &ctx)
        : ctx_(ctx), spec_(ctx.model->spec()), device_(ctx.device), threshold_(prefill_threshold(ctx.params)) {
        if (device_ < 0) fail(FT_ERR_NO_DEVICE, "the engine has no GPU (create it with a device)");
        const int32_t max_tokens = ctx.params.max_tokens;
        if (max_tokens >= threshold_) {
            try {
                prefill_ = std::make_unique<cuda::ExpertPrefill>(spec_.format, spec_.hidden, spec_.intermediate, spec_.top_k,
                                                                 max_tokens, activation_of(spec_),
                                                                 cuda::prefill_tuning(ctx.tuning));
            } catch (const Error &e) {
                if (e.status() != FT_ERR_UNSUPPORTED) throw;
                // Without cuBLAS every call takes the decode kernels (slower for long prompts).
                log(FT_LOG_WARN, "GPU prefill path unavailable (", e.what(), "); all calls use the decode kernels");
                threshold_ = max_tokens + 1;
            }
        }
        decode_max_ = std::min(max_tokens, threshold_ - 1);
        const size_t act = size_t(max_tokens) * spec_.hidden * sizeof(uint16_t);
        const size_t routes = size_t(max_tokens) * spec_.top_k;
        in_x_ = DeviceBuffer(act, "allocating GPU staging");
        in_ids_ = DeviceBuffer(routes * sizeof(int32_t), "allocating GPU staging");
        in_w_ = DeviceBuffer(routes * sizeof(float), "allocating GPU staging");
        out_y_ = DeviceBuffer(act, "allocating GPU staging");
        slots_ = DeviceBuffer(routes * sizeof(int32_t), "allocating GPU slot ids");
        host_in_ = PinnedBuffer(act + routes * (sizeof(int32_t) + sizeof(float)), "allocating pinned staging");
        host_out_ = PinnedBuffer(act, "allocating pinned staging");
        host_ids_ = PinnedBuffer(routes * sizeof(int32_t), "allocating pinned staging");
        if (decode_max_ > 0)
            decoder_ = std::make_unique<cuda::ExpertDecoder>(spec_.format, spec_.hidden, spec_.intermediate, spec_.top_k,
                                                             decode_max_, activation_of(spec_));
        layer_stats_ = DeviceBuffer(size_t(spec_.num_layers) * kLayerColumns * sizeof(int64_t), "allocating GPU statistics");
        check(cudaMemset(layer_stats_.get(), 0, layer_stats_.bytes()), "clearing GPU statistics");
        for (int b = 0; b < ctx.model->banks().num_banks(); ++b) expert_bytes_ += ctx.model->banks().row_bytes(b);
    }

    bool device_path() const override { return true; }
    bool has_prefill() const { return prefill_ != nullptr; }
    ft_status status() const override { return lost_ ? FT_ERR_DEVICE_LOST : FT_OK; }

    void decode(const DecodeCall &c, ft_session_stats &stats) override {
        if (lost_) fail(FT_ERR_DEVICE_LOST, "the session's GPU is lost: ", lost_message_);
        try {
            DeviceScope scope(device_);
            run(c, stats);
        } catch (const Error &e) {
            if (e.status() == FT_ERR_DEVICE_LOST) {
                lost_ = true;
                lost_message_ = e.what();
            }
            throw;
        }
    }

    void add_device_stats(ft_session_stats &stats) const override {
        if (lost_) return;
        const std::vector<int64_t> rows = guarded_rows();
        if (rows.empty()) return;
        for (int32_t l = 0; l < spec_.num_layers; ++l) {
            const ft_layer_stats s = to_layer_stats(rows.data() + size_t(l) * kLayerColumns);
            stats.cache_hits += s.active_experts - s.misses;
            stats.cache_misses += s.misses;
            stats.fetched_experts += s.fetched_experts;
            stats.fetched_bytes += s.fetched_bytes;
        }
    }

    void layer_stats(int32_t layer, ft_layer_stats &out) const override {
        if (lost_) fail(FT_ERR_DEVICE_LOST, "the session's GPU is lost: ", lost_message_);
        const std::vector<int64_t> rows = guarded_rows();
        if (rows.empty()) fail(FT_ERR_DEVICE_LOST, "the session's GPU is lost: ", lost_message_);
        out = to_layer_stats(rows.data() + size_t(layer) * kLayerColumns);
    }

    void reset_stats() override {
        if (lost_) return;
        try {
            DeviceScope scope(device_);
            check(cudaDeviceSynchronize(), "waiting for the GPU");
            check(cudaMemset(layer_stats_.get(), 0, layer_stats_.bytes()), "clearing GPU statistics");
            clear_cache_stats();
        } catch (const Error &e) {
            if (e.status() != FT_ERR_DEVICE_LOST) throw;
            lost_ = true;
            lost_message_ = e.what();
        }
    }

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
    virtual std::vector<int64_t> read_layer_stats() const {
        std::vector<int64_t> rows(size_t(spec_.num_layers) * kLayerColumns);
        DeviceScope scope(device_);
        check(cudaDeviceSynchronize(), "waiting for the GPU");
        check(cudaMemcpy(rows.data(), layer_stats_.get(), layer_stats_.bytes(), cudaMemcpyDeviceToHost), "reading GPU statistics");
        return rows;
    }
    virtual void clear_cache_stats() {}

    // The statistic rows, or empty once the device is lost (which this records).
    std::vector<int64_t> guarded_rows() const {
        try {
            return read_layer_stats();
        } catch (const Error &e) {
            if (e.status() != FT_ERR_DEVICE_LOST) throw;
            lost_ = true;
            lost_message_ = e.what();
            return {};
        }
    }

    ft_layer_stats to_layer_stats(const int64_t *row) const {
        ft_layer_stats s{};
        s.struct_size = sizeof s;
        s.calls = uint64_t(row[kStatCalls]);
        s.active_experts = uint64_t(row[kStatActive]);
        s.misses = uint64_t(row[kStatMissing]);
        s.fetched_experts = uint64_t(row[kStatFetched]);
        s.fetched_bytes = s.fetched_experts * expert_bytes_;
        return s;
    }

    cuda::DeviceExperts device_experts(const std::vector<DeviceBuffer> &arrays, size_t slot_offset) const {
        cuda::DeviceExperts d;
        d.format = spec_.format;
        d.hidden = spec_.hidden;
        d.inter = spec_.intermediate;
        const ExpertBanks &banks = ctx_.model->banks();
        d.num_banks = banks.num_banks();
        for (int b = 0; b < d.num_banks; ++b) {
            d.base[b] = arrays[b].get() + slot_offset * banks.row_bytes(b);
            d.row_bytes[b] = banks.row_bytes(b);
        }
        return d;
    }

    BackendContext ctx_;
    const ModelSpec &spec_;
    int device_;
    int32_t threshold_, decode_max_ = 0;
    size_t expert_bytes_ = 0;
    DeviceBuffer slots_, layer_stats_;
    std::unique_ptr<cuda::ExpertDecoder> decoder_;

private:
    void run(const DecodeCall &c, ft_session_stats &stats) {
        const size_t H = size_t(spec_.hidden), K = size_t(spec_.top_k), T = size_t(c.num_tokens);
        const size_t act = T * H * sizeof(uint16_t), routes = T * K;
        cudaStream_t stream = c.on_device ? static_cast<cudaStream_t>(c.stream) : own_.get();
        const uint16_t *x = c.hidden;
        const int32_t *ids = c.ids;
        const float *w = c.weights;
        uint16_t *y = c.out;
        if (c.on_device) {
            require_device_memory(c.hidden, "hidden");
            require_device_memory(c.ids, "expert_ids");
            require_device_memory(c.weights, "expert_weights");
            require_device_memory(c.out, "out");
        } else {
            // Host pointers: one pinned staging copy in, one out; the call waits for the result.
            uint8_t *h = host_in_.get();
            std::memcpy(h, c.hidden, act);
            std::memcpy(h + act, c.ids, routes * sizeof(int32_t));
            std::memcpy(h + act + routes * sizeof(int32_t), c.weights, routes * sizeof(float));
            check(cudaMemcpyAsync(in_x_.get(), h, act, cudaMemcpyHostToDevice, stream), "copying hidden states to the GPU");
            check(cudaMemcpyAsync(in_ids_.get(), h + act, routes * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
                  "copying expert ids to the GPU");
            check(cudaMemcpyAsync(in_w_.get(), h + act + routes * sizeof(int32_t), routes * sizeof(float),
                                  cudaMemcpyHostToDevice, stream),
                  "copying routing weights to the GPU");
            x = in_x_.get<uint16_t>();
            ids = in_ids_.get<int32_t>();
            w = in_w_.get<float>();
            y = out_y_.get<uint16_t>();
        }
        if (c.num_tokens >= threshold_) {
            run_prefill(c, x, ids, w, y, stream, stats);
        } else {
            run_decode(c.layer, x, ids, w, y, c.num_tokens, stream);
            check(cudaGetLastError(), "launching the decode kernels");
        }
        if (!c.on_device) {
            check(cudaMemcpyAsync(host_out_.get(), y, act, cudaMemcpyDeviceToHost, stream), "copying the output to the host");
            check(cudaStreamSynchronize(stream), "running the MoE layer on the GPU");
            if (const ft_status st = status(); st != FT_OK) fail(st, "the MoE layer did not complete (see ft_session_status)");
            std::memcpy(c.out, host_out_.get(), act);
            for (size_t i = 0; i < routes; ++i) stats.routes_gpu += c.ids[i] >= 0 ? 1 : 0;
        } else {
            stats.routes_gpu += routes;
        }
    }

    static void require_device_memory(const void *p, const char *name) {
        cudaPointerAttributes a{};
        const cudaError_t e = cudaPointerGetAttributes(&a, p);
        if (e != cudaSuccess) throw_cuda(e, "cudaPointerGetAttributes");
        if (a.type == cudaMemoryTypeUnregistered)
            fail(FT_ERR_INVALID_ARGUMENT, "ft_decode_cuda: ", name, " is pageable host memory, not device memory (use ft_decode)");
    }

    void run_prefill(const DecodeCall &c, const uint16_t *x, const int32_t *ids, const float *w, uint16_t *y,
                     cudaStream_t stream, ft_session_stats &stats) {
        if (!prefill_) fail(FT_ERR_INTERNAL, "prefill path without its buffers");
        const size_t routes = size_t(c.num_tokens) * spec_.top_k;
        int32_t *host_ids = host_ids_.get<int32_t>();
        if (c.on_device) {
            cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
            check(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing");
            if (capturing != cudaStreamCaptureStatusNone)
                fail(FT_ERR_STATE, "a call of ", c.num_tokens, " tokens takes the prefill path (prefill_min_tokens ", threshold_,
                     "), which reads the routing on the host and cannot be captured in a CUDA graph");
            check(cudaMemcpyAsync(host_ids, ids, routes * sizeof(int32_t), cudaMemcpyDeviceToHost, stream), "reading the routing");
            check(cudaStreamSynchronize(stream), "reading the routing");
        } else {
            std::memcpy(host_ids, c.ids, routes * sizeof(int32_t));
        }
        // Ids the host can see are sanitised the same way the device path is: out of range -> -1.
        for (size_t i = 0; i < routes; ++i)
            if (host_ids[i] >= spec_.num_experts) host_ids[i] = -1;
        check(cudaMemcpyAsync(slots_.get(), host_ids, routes * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
              "copying the prefill routing");
        const cuda::DeviceExperts experts = prefill_experts(c.layer, stream, stats);
        const ft_status s = prefill_->run(experts, x, slots_.get<int32_t>(), host_ids, w, nullptr, y, c.num_tokens, stream);
        if (s != FT_OK) fail(s, "prefill path: ", prefill_->last_error());
        stats.prefill_calls += 1;
    }

    Stream own_;
    DeviceBuffer in_x_, in_ids_, in_w_, out_y_;
    PinnedBuffer host_in_, host_out_, host_ids_;
    std::unique_ptr<cuda::ExpertPrefill> prefill_;
    mutable bool lost_ = false;
    mutable std::string lost_message_;
};

// ---- gpu: every expert resident -----------------------------------------------------------------

class ResidentBackend final : public CudaBackend {
public:
    explicit ResidentBackend(const BackendContext &ctx) : CudaBackend(ctx) {
        DeviceScope scope(device_);
        const ExpertBanks &banks = ctx.model->banks();
        const size_t L = size_t(spec_.num_layers), E = size_t(spec_.num_experts);
        for (int b = 0; b < banks.num_banks(); ++b) {
            arrays_.emplace_back(L * E * banks.row_bytes(b), "allocating resident expert memory (the model does not fit: use the offload backend)");
            for (size_t l = 0; l < L; ++l)
                check(cudaMemcpy(arrays_.back().get() + l * E * banks.row_bytes(b), banks.layer_base(b, int(l)),
                                 E * banks.row_bytes(b), cudaMemcpyHostToDevice),
                      "copying experts to the GPU");
        }
    }

private:
    void run_decode(int32_t layer, const uint16_t *x, const int32_t *ids, const float *w, uint16_t *y, int32_t tokens,
                    cudaStream_t stream) override {
        int64_t *row = layer_stats_.get<int64_t>() + size_t(layer) * kLayerColumns;
        check(cuda::launch_resident_slots(ids, slots_.get<int32_t>(), int64_t(tokens) * spec_.top_k, spec_.num_experts, row, stream),
              "launching the slot rewrite");
        const cuda::DeviceExperts experts = device_experts(arrays_, size_t(layer) * spec_.num_experts);
        check(decoder_->decode(experts, x, slots_.get<int32_t>(), w, nullptr, y, tokens, stream), "launching the expert kernels");
    }

    cuda::DeviceExperts prefill_experts(int32_t layer, cudaStream_t, ft_session_stats &) override {
        return device_experts(arrays_, size_t(layer) * spec_.num_experts);
    }

    std::vector<DeviceBuffer> arrays_;  // per bank: [L][E] experts
};

// ---- offload: slot cache ------------------------------------------------------------------------

class OffloadBackend : public CudaBackend {
    struct PrefillBuffer {
        std::vector<DeviceBuffer> arrays;  // per bank: [E] experts of `layer`
        int32_t layer = -1;
        Event ready, free;  // copy finished; computes before the copy finished with the buffer
    };

public:
    explicit OffloadBackend(const BackendContext &ctx) : CudaBackend(ctx) {
        DeviceScope scope(device_);
        const ExpertBanks &banks = ctx.model->banks();
        const int nb = banks.num_banks();
        if (nb > 8) fail(FT_ERR_INTERNAL, "offload: ", nb, " banks, at most 8 supported");
        // Zero-copy reads need the device address of every page-locked layer bank.
        for (int32_t l = 0; l < spec_.num_layers; ++l) {
            for (int b = 0; b < nb; ++b) {
                void *dev = nullptr;
                const cudaError_t e = cudaHostGetDevicePointer(&dev, const_cast<uint8_t *>(banks.layer_base(b, l)), 0);
                if (e != cudaSuccess) {
                    cudaGetLastError();
                    fail(FT_ERR_UNSUPPORTED, "offload needs the expert banks page-locked for GPU ", device_,
                         " (layer ", l, " bank ", b, ": ", cudaGetErrorString(e),
                         "); load the model with an engine on this device");
                }
                host_banks_.push_back(static_cast<const uint8_t *>(dev));
            }
        }
        // Prefill streams whole layers through two buffers of its own (never the decode slots).
        size_t layer_bytes = 0;
        for (int b = 0; b < nb; ++b) layer_bytes += banks.row_bytes(b) * size_t(spec_.num_experts);
        if (has_prefill()) {
            for (auto &buf : prefill_buf_) {
                for (int b = 0; b < nb; ++b)
                    buf.arrays.emplace_back(banks.row_bytes(b) * size_t(spec_.num_experts), "allocating the prefill layer buffers");
            }
        }
        const cuda::MemoryInfo mem = cuda::memory_info(device_);
        SlotRequest req;
        req.count = ctx.params.cache_slots;
        req.fraction = ctx.params.cache_fraction;
        req.free_bytes = mem.free_bytes;
        req.reserve_bytes = ctx.params.vram_reserve_bytes;
        const int64_t S = plan_slot_count(req, spec_.num_layers, spec_.num_experts, expert_bytes_);
        shape_.layers = spec_.num_layers;
        shape_.experts = spec_.num_experts;
        shape_.slots = int32_t(std::min<int64_t>(S, INT32_MAX));
        shape_.plan_capacity = plan_capacity_for(int64_t(std::max(decode_max_, 1)) * spec_.top_k, shape_.slots);
        state_buf_ = DeviceBuffer(slot_cache_bytes(shape_), "allocating the slot cache state");
        state_ = slot_cache_bind(shape_, state_buf_.get());
        check(cuda::launch_slot_cache_reset(state_, nullptr), "resetting the slot cache");
        check(cuda::launch_slot_cache_clear_stats(state_, nullptr), "resetting the slot cache");
        for (int b = 0; b < nb; ++b) {
            slot_arrays_.emplace_back(banks.row_bytes(b) * size_t(shape_.slots), "allocating GPU expert slots");
            // Free slots hold NaN in every format (0xFF bytes: bf16/fp16 NaN, e4m3 and e8m0 NaN
            // codes), so a kernel that ever reads an unfilled slot shows up in its output.
            check(cudaMemset(slot_arrays_.back().get(), 0xff, slot_arrays_.back().bytes()), "poisoning free slots");
        }
        check(cudaDeviceSynchronize(), "initialising the slot cache");
        log(FT_LOG_INFO, "offload: ", shape_.slots, " slots of ", expert_bytes_ / 1e6, " MB (", 100.0 * shape_.slots /
            (double(spec_.num_layers) * spec_.num_experts), "% of all experts), ", mem.free_bytes / 1e9, " GB were free");
    }

    int32_t slots() const { return shape_.slots; }

protected:
    void run_decode(int32_t layer, const uint16_t *x, const int32_t *ids, const float *w, uint16_t *y, int32_t tokens,
                    cudaStream_t stream) override {
        int32_t *slots = slots_.get<int32_t>();
        check(cuda::launch_admit_lru(state_, layer, ids, slots, int64_t(tokens) * spec_.top_k, stream), "launching admission");
        gather(layer, stream);
        check(decoder_->decode(device_experts(slot_arrays_, 0), x, slots, w, nullptr, y, tokens, stream),
              "launching the expert kernels");
    }

    // Copies the plan the last admission left on the device into the slots (zero-copy kernel).
    void gather(int32_t layer, cudaStream_t stream) {
        cuda::GatherBank gb[8];
        const int nb = ctx_.model->banks().num_banks();
        for (int b = 0; b < nb; ++b) {
            gb[b].host_layer = host_banks_[size_t(layer) * nb + b];
            gb[b].slots = slot_arrays_[b].get();
            gb[b].row_bytes = ctx_.model->banks().row_bytes(b);
        }
        cuda::GatherPlan plan;
        plan.evict_slots = state_.evict_slots;
        plan.src_indices = state_.src_indices;
        plan.num_indices = state_.num_indices;
        plan.capacity = shape_.plan_capacity;
        check(cuda::launch_gather_zero_copy(gb, nb, plan, stream), "launching the gather");
    }

    // The layer's experts copied whole into one of two buffers by the copy engine; the next
    // layer is fetched into the other buffer while this one computes.
    cuda::DeviceExperts prefill_experts(int32_t layer, cudaStream_t stream, ft_session_stats &stats) override {
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
        return device_experts(use->arrays, 0);
    }


    void load_layer(PrefillBuffer &buf, int32_t layer, cudaStream_t stream, ft_session_stats &stats) {
        const ExpertBanks &banks = ctx_.model->banks();
        // The copy stream must not overwrite the buffer while a compute still reads it.
        check(cudaEventRecord(buf.free.get(), stream), "recording a prefill event");
        check(cudaStreamWaitEvent(copy_.get(), buf.free.get(), 0), "ordering the prefill copy");
        for (int b = 0; b < banks.num_banks(); ++b) {
            const size_t bytes = banks.row_bytes(b) * size_t(spec_.num_experts);
            check(cudaMemcpyAsync(buf.arrays[b].get(), banks.layer_base(b, layer), bytes, cudaMemcpyHostToDevice, copy_.get()),
                  "streaming a layer for prefill");
            stats.prefill_bytes += bytes;
        }
        check(cudaEventRecord(buf.ready.get(), copy_.get()), "recording a prefill event");
        buf.layer = layer;
    }

    std::vector<int64_t> read_layer_stats() const override {
        std::vector<int64_t> rows(size_t(spec_.num_layers) * kStatColumns);
        DeviceScope scope(device_);
        check(cudaDeviceSynchronize(), "waiting for the GPU");
        check(cudaMemcpy(rows.data(), state_.stats, rows.size() * sizeof(int64_t), cudaMemcpyDeviceToHost), "reading GPU statistics");
        return rows;
    }

    void clear_cache_stats() override {
        check(cuda::launch_slot_cache_clear_stats(state_, nullptr), "clearing slot cache statistics");
        check(cudaDeviceSynchronize(), "clearing slot cache statistics");
    }

private:
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


// ---- hybrid: slot cache + CPU ------------------------------------------------------------------
//
// Per call, on the stream: hybrid admission (hits and a bandwidth-matched share F of the misses
// get slots; the other misses are routed to -1), the CPU's routes and the hidden states copied to
// pinned memory, the CPU task signalled, the gather of the F fetched experts and the GPU expert
// kernels enqueued (they overlap the CPU task), then the stream waits for the CPU's partial sum,
// copies it up and adds it in the combine. The calling thread never waits (device path).
class HybridBackend final : public OffloadBackend {
public:
    explicit HybridBackend(const BackendContext &ctx)
        : OffloadBackend(ctx),
          cpu_(*ctx.pool, spec_.format, spec_.hidden, spec_.intermediate, spec_.top_k, std::max(decode_max_, 1),
               cpu::ActivationSpec{spec_.activation, spec_.swiglu_alpha, spec_.swiglu_limit}, 0, cpu::Isa(ctx.cpu_isa),
               cpu::moe_tuning(ctx.tuning)) {
        const double f = ctx.params.hybrid_fraction;
        if (!(f >= 0.0 && f <= 1.0)) fail(FT_ERR_INVALID_ARGUMENT, "hybrid_fraction must be in [0, 1], got ", f);
        if (!(ctx.params.handoff_timeout_seconds > 0.0))
            fail(FT_ERR_INVALID_ARGUMENT, "handoff_timeout_seconds must be > 0, got ", ctx.params.handoff_timeout_seconds);
        fraction_ = f > 0.0 ? f : 0.5;
        sent_ = fraction_;
        adaptive_ = ctx.params.hybrid_adaptive;
        cuda::HandoffOptions o;
        o.device = device_;
        o.mechanism = cuda::handoff_mechanism_from_knob(ctx.tuning.handoff);
        o.timeout_seconds = ctx.params.handoff_timeout_seconds;
        o.max_sites = 65536;
        handoff_ = std::make_unique<cuda::Handoff>(o);
        const size_t T = size_t(std::max(decode_max_, 1)), H = size_t(spec_.hidden), K = size_t(spec_.top_k);
        pin_x_ = PinnedBuffer(T * H * sizeof(uint16_t), "allocating hybrid staging");
        pin_ids_ = PinnedBuffer(T * K * sizeof(int32_t), "allocating hybrid staging");
        pin_w_ = PinnedBuffer(T * K * sizeof(float), "allocating hybrid staging");
        pin_y_ = PinnedBuffer(T * H * sizeof(uint16_t), "allocating hybrid staging");
        pin_missing_ = PinnedBuffer(sizeof(int64_t), "allocating hybrid staging");
        if (T * H * sizeof(uint16_t) > kMappedAddendBytes)
            addend_ = DeviceBuffer(T * H * sizeof(uint16_t), "allocating the hybrid partial sum");
        *pin_missing_.get<int64_t>() = 0;
        log(FT_LOG_INFO, "hybrid: fetch fraction ", fraction_, adaptive_ ? " (adaptive)" : " (fixed)", ", handoff by ",
            cuda::handoff_mechanism_name(handoff_->mechanism()));
    }

    // The CPU task may still run after a timeout released the stream: wait for it (it always
    // ends), and let no later one start, before its buffers and executor go away.
    ~HybridBackend() override {
        {
            std::lock_guard<std::mutex> lock(task_mutex_);
            closing_ = true;
        }
        handoff_.reset();
    }

    ft_status status() const override {
        const ft_status s = OffloadBackend::status();
        return s != FT_OK ? s : handoff_->status();
    }

    void add_device_stats(ft_session_stats &stats) const override {
        OffloadBackend::add_device_stats(stats);
        std::lock_guard<std::mutex> lock(mutex_);
        // The session counted every route it handed over as a GPU route; the CPU took these.
        stats.routes_gpu -= std::min<uint64_t>(stats.routes_gpu, cpu_stats_.routes_computed);
        stats.routes_cpu += cpu_stats_.routes_computed;
        stats.experts_cpu += cpu_stats_.experts_read;
        stats.cpu_bytes += cpu_stats_.bytes_read;
        stats.cpu_seconds += cpu_seconds_;
        stats.hybrid_fraction = sent_;
        stats.hybrid_gpu_seconds += gpu_seconds_;
        stats.hybrid_timed_steps += timed_steps_;
    }

    void reset_stats() override {
        OffloadBackend::reset_stats();
        std::lock_guard<std::mutex> lock(mutex_);
        cpu_stats_ = {};
        cpu_seconds_ = 0.0;
        gpu_seconds_ = 0.0;
        timed_steps_ = 0;
    }

private:
    void run_decode(int32_t layer, const uint16_t *x, const int32_t *ids, const float *w, uint16_t *y, int32_t tokens,
                    cudaStream_t stream) override {
        if (const ft_status st = handoff_->status(); st != FT_OK)
            fail(st, "hybrid CPU handoff failed: ", handoff_->status_message());
        const int64_t routes = int64_t(tokens) * spec_.top_k;
        int32_t *slots = slots_.get<int32_t>();
        cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
        check(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing");
        const bool eager = capturing == cudaStreamCaptureStatusNone;
        if (eager) adapt();

        HybridFetch fetch;
        fetch.order = FetchOrder::Recency;
        if (sent_ <= 0.0) fetch.max_fetch = 0;  // everything missing goes to the CPU
        else fetch.fraction_q16 = fraction_to_q16(sent_);
        check(cuda::launch_admit_hybrid(state_, layer, ids, slots, routes, fetch, stream), "launching hybrid admission");
        cuda::HybridStage stage;
        stage.ids = ids;
        stage.slots = slots;
        stage.weights = w;
        stage.x = x;
        stage.missing = eager ? state_.num_missing_full : nullptr;  // for adapt() once the step is done
        stage.routes = routes;
        stage.x_elems = int64_t(tokens) * spec_.hidden;
        stage.experts = spec_.num_experts;
        stage.host_ids = pin_ids_.device<int32_t>();
        stage.host_weights = pin_w_.device<float>();
        stage.host_x = pin_x_.device<uint16_t>();
        stage.host_missing = pin_missing_.device<int64_t>();
        check(cuda::launch_hybrid_stage(stage, stream), "staging the CPU's share");
        const int site = site_for(layer, tokens);
        check(handoff_->signal(site, stream), "signalling the CPU task");
        if (eager) check(cudaEventRecord(gpu_start_.get(), stream), "recording a timing event");
        gather(layer, stream);
        check(decoder_->compute(device_experts(slot_arrays_, 0), x, slots, tokens, stream), "launching the expert kernels");
        if (eager) {
            check(cudaEventRecord(gpu_stop_.get(), stream), "recording a timing event");
            pending_site_ = site;
        }
        check(handoff_->wait(site, stream), "waiting for the CPU task");
        // The combine reads a few tokens' CPU partial sum where the task left it (mapped host
        // memory; the done flag the wait saw was written after it): no copy on the critical path.
        // Larger sums come up by the copy engine, which reads PCIe faster than a kernel's loads.
        const size_t act = size_t(tokens) * spec_.hidden * sizeof(uint16_t);
        const uint16_t *addend = pin_y_.device<uint16_t>();
        if (act > kMappedAddendBytes) {
            check(cudaMemcpyAsync(addend_.get(), pin_y_.get(), act, cudaMemcpyHostToDevice, stream),
                  "copying the CPU's partial sum");
            addend = addend_.get<uint16_t>();
        }
        check(decoder_->combine(slots, w, addend, y, tokens, stream), "launching the combine");
    }

    // One handoff site per (layer, tokens): the task knows its shape, so captured graphs replay it.
    int site_for(int32_t layer, int32_t tokens) {
        const int64_t key = int64_t(layer) << 32 | uint32_t(tokens);
        auto it = sites_.find(key);
        if (it != sites_.end()) return it->second;
        const int site = handoff_->add_site([this, layer, tokens] { cpu_task(layer, tokens); });
        sites_.emplace(key, site);
        return site;
    }

    // Runs on the coordinator thread while the GPU works on its share.
    void cpu_task(int32_t layer, int32_t tokens) {
        std::lock_guard<std::mutex> running(task_mutex_);
        if (closing_) return;
        const ExpertBanks &banks = ctx_.model->banks();
        cpu::ExpertSource src;
        src.format = spec_.format;
        src.num_experts = spec_.num_experts;
        src.num_banks = banks.num_banks();
        for (int b = 0; b < src.num_banks; ++b) {
            src.base[b] = banks.layer_base(b, layer);
            src.row_bytes[b] = banks.row_bytes(b);
        }
        const auto t0 = std::chrono::steady_clock::now();
        const cpu::MoeStats st = cpu_.run(src, nullptr, tokens, pin_x_.get<uint16_t>(), pin_ids_.get<int32_t>(),
                                          pin_w_.get<float>(), pin_y_.get<uint16_t>());
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::lock_guard<std::mutex> lock(mutex_);
        cpu_stats_.routes_computed += st.routes_computed;
        cpu_stats_.experts_read += st.experts_read;
        cpu_stats_.bytes_read += st.bytes_read;
        cpu_seconds_ += secs;
        last_cpu_experts_ = st.experts_read;
    }

    // Moves f towards the split where both sides finish together, from the last eager step's
    // measured times: of the step's M distinct misses the GPU fetched and computed F in t_gpu
    // (gather + kernels, CUDA events) and the CPU computed M - F in t_cpu (the coordinator's
    // clock), so per unit of misses the rates are (F / M) / t_gpu and ((M - F) / M) / t_cpu and
    // the balanced share is their ratio f* = r_gpu / (r_gpu + r_cpu). The shares are the realised
    // ones, not f itself: F is an integer, and near a step of F(f) the two differ by up to 1 / M
    // (at M = 4 a configured 0.4 fetches 1 or 2 experts, a realised 0.25 or 0.5), which made the
    // estimate settle on the wrong side of the step. Smoothed and bounded so one noisy step cannot
    // swing it; a side that had nothing to do is probed instead of measured.
    void adapt() {
        if (pending_site_ < 0) return;
        if (cudaEventQuery(gpu_stop_.get()) != cudaSuccess) {
            cudaGetLastError();  // not finished yet (cudaErrorNotReady): measure a later step
            return;
        }
        const int site = pending_site_;
        pending_site_ = -1;
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, gpu_start_.get(), gpu_stop_.get()) != cudaSuccess) {
            cudaGetLastError();
            return;
        }
        const double t_gpu = ms * 1e-3, t_cpu = handoff_->timing(site).task_seconds;
        uint64_t cpu_experts;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            cpu_experts = last_cpu_experts_;
            gpu_seconds_ += t_gpu;
            ++timed_steps_;
        }
        if (!adaptive_) return;
        const int64_t missing = *pin_missing_.get<int64_t>();
        if (missing <= 0) return;  // no misses: nothing to split
        if (cpu_experts == 0) {
            // f fetched every miss: the CPU's rate is unknown. Step f down so the CPU gets work
            // again and is measured; a step without misses costs nothing.
            fraction_ = std::max(kMinFraction, fraction_ - kProbeStep);
            sent_ = fraction_;
            return;
        }
        const double cpu_share = std::min(1.0, double(cpu_experts) / double(missing));
        if (cpu_share >= 1.0) {
            // Nothing fetched (F = 0): the GPU's rate is unknown; probe upwards the same way.
            fraction_ = std::min(kMaxFraction, fraction_ + kProbeStep);
            sent_ = fraction_;
            return;
        }
        if (!(t_gpu > 0.0) || !(t_cpu > 0.0)) return;
        const double gpu_rate = (1.0 - cpu_share) / t_gpu, cpu_rate = cpu_share / t_cpu;
        const double target = gpu_rate / (gpu_rate + cpu_rate);
        fraction_ = std::clamp(fraction_ + kAdaptGain * (target - fraction_), kMinFraction, kMaxFraction);
        // Per-expert times of each side, smoothed the same way, for choosing the integer split.
        const int64_t fetched = missing - int64_t(cpu_experts);
        const double g = t_gpu / double(fetched), c = t_cpu / double(cpu_experts);
        gpu_expert_s_ = gpu_expert_s_ > 0.0 ? gpu_expert_s_ + kAdaptGain * (g - gpu_expert_s_) : g;
        cpu_expert_s_ = cpu_expert_s_ > 0.0 ? cpu_expert_s_ + kAdaptGain * (c - cpu_expert_s_) : c;
        sent_ = snap(fraction_, missing);
    }

    // The fraction sent to the device. The admission turns f into F = the integer neighbour of
    // f * M (docs/formulas.md, "Hybrid split"), so near a step of F(f) the continuous estimate flips between two splits
    // that the linear model rates almost equal -- and the one with fewer fetches is then usually
    // faster in fact: the CPU reads DRAM without the gather's competition for part of the step,
    // and evicts nothing. So between the two neighbours of fraction * M (each side keeping at
    // least one expert, so both stay measured) the larger F is taken only when its predicted
    // time, max(F * gpu, (M - F) * cpu) per expert, is kSnapMargin better; then f is sent as the
    // middle of that F's interval at this M (fraction_for_fetch). Other M map near the estimate.
    double snap(double f, int64_t M) const {
        if (M < 2 || !(gpu_expert_s_ > 0.0) || !(cpu_expert_s_ > 0.0)) return f;
        const int64_t lo = std::clamp<int64_t>(int64_t(std::floor(f * double(M))), 1, M - 1);
        const int64_t hi = std::min<int64_t>(lo + 1, M - 1);
        auto time = [&](int64_t F) { return std::max(double(F) * gpu_expert_s_, double(M - F) * cpu_expert_s_); };
        const int64_t F = hi != lo && time(hi) < (1.0 - kSnapMargin) * time(lo) ? hi : lo;
        return fraction_for_fetch(F, M);
    }

    static constexpr double kAdaptGain = 0.1, kProbeStep = 0.02, kMinFraction = 0.02, kMaxFraction = 0.98;
    static constexpr double kSnapMargin = 0.05;
    static constexpr size_t kMappedAddendBytes = size_t(64) << 10;  // read in place up to this size

    cpu::MoeExecutor cpu_;
    std::unique_ptr<cuda::Handoff> handoff_;
    std::map<int64_t, int> sites_;
    PinnedBuffer pin_x_, pin_ids_, pin_w_, pin_y_, pin_missing_;
    DeviceBuffer addend_;  // the CPU's partial sum on the device, for sums above kMappedAddendBytes
    Event gpu_start_{true}, gpu_stop_{true};
    int pending_site_ = -1;
    double fraction_ = 0.5;      // the continuous estimate of the balanced fetch share
    double sent_ = 0.5;          // the fraction the admission uses (fraction_ snapped, see snap())
    double gpu_expert_s_ = 0.0;  // smoothed seconds per fetched expert (gather + kernels)
    double cpu_expert_s_ = 0.0;  // smoothed seconds per CPU-computed expert
    bool adaptive_ = true;
    std::mutex task_mutex_;     // held while a CPU task runs
    bool closing_ = false;      // set by the destructor: no task starts any more
    mutable std::mutex mutex_;  // the counters below are written by the coordinator thread
    cpu::MoeStats cpu_stats_;
    double cpu_seconds_ = 0.0;
    double gpu_seconds_ = 0.0;  // GPU side of the timed steps (adapt())
    uint64_t timed_steps_ = 0;
    uint64_t last_cpu_experts_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int32_t backend, const BackendContext &ctx) {
    if (ctx.device < 0) fail(FT_ERR_NO_DEVICE, "the engine has no GPU");
    DeviceScope scope(ctx.device);
    switch (backend) {
        case FT_BACKEND_GPU: return std::make_unique<ResidentBackend>(ctx);
        case FT_BACKEND_OFFLOAD: return std::make_unique<OffloadBackend>(ctx);
        case FT_BACKEND_HYBRID: return std::make_unique<HybridBackend>(ctx);
        default: fail(FT_ERR_INTERNAL, "make_cuda_backend: backend ", backend, " is not a GPU backend");
    }
}

}  // namespace ft
