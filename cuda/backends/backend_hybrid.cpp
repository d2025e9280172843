// The `hybrid` backend: offload plus the CPU computing a bandwidth-matched share of each step's
// misses (docs/formulas.md, "Hybrid split"); ft/hybrid_controller.hpp moves the share.
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <vector>

#include "backend_offload.hpp"
#include "ft/cpu.hpp"
#include "ft/cpu_backend.hpp"
#include "ft/cuda_handoff.hpp"
#include "ft/device_util.hpp"
#include "ft/hybrid.hpp"
#include "ft/hybrid_controller.hpp"
#include "ft/slotcache_cuda.hpp"

namespace ft::gpu_backend {
namespace {

// The block formats other than spec.format that the layers of a model mixing them use (the CPU
// share's executor needs kernels for each).
std::vector<Format> other_block_formats(const ModelSpec &spec) {
    std::vector<Format> out;
    for (const LayerFormats &lf : spec.layer_formats)
        for (const Format f : {lf.gate_up, lf.down})
            if (f != spec.format && std::find(out.begin(), out.end(), f) == out.end()) out.push_back(f);
    return out;
}

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
               cpu::moe_tuning(ctx.tuning), other_block_formats(spec_)) {
        const double f = ctx.params.hybrid_fraction;
        if (!(f >= 0.0 && f <= 1.0)) fail(FT_ERR_INVALID_ARGUMENT, "hybrid_fraction must be in [0, 1], got ", f);
        if (!(ctx.params.handoff_timeout_seconds > 0.0))
            fail(FT_ERR_INVALID_ARGUMENT, "handoff_timeout_seconds must be > 0, got ", ctx.params.handoff_timeout_seconds);
        control_ = HybridController(f > 0.0 ? f : 0.5, ctx.params.hybrid_adaptive);
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
        log(FT_LOG_INFO, "hybrid: fetch fraction ", control_.sent(), control_.adaptive() ? " (adaptive)" : " (fixed)", ", handoff by ",
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
        stats.hybrid_fraction = control_.sent();
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
        // The GPU signals the CPU's share once it reaches this call's stage: have the coordinator
        // and the workers polling by then rather than asleep (graph replays make no host call;
        // there the go wakes them).
        if (eager && control_.sent() < 1.0) {
            ctx_.pool->warm(kWarmPeriod);
            handoff_->warm(std::chrono::duration<double>(kWarmPeriod).count());
        }

        HybridFetch fetch;
        fetch.order = FetchOrder::Recency;
        if (control_.sent() <= 0.0) fetch.max_fetch = 0;  // everything missing goes to the CPU
        else fetch.fraction_q16 = fraction_to_q16(control_.sent());
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
        // The GPU share reads the device bias tables; the CPU share gets the model's biases
        // through cpu::expert_source (cpu_task).
        check(decoder_->compute(device_experts(slot_arrays_, 0, layer), x, slots, tokens, stream, ids),
              "launching the expert kernels");
        if (eager) {
            check(cudaEventRecord(gpu_stop_.get(), stream), "recording a timing event");
            pending_site_ = site;
        }
        check(handoff_->wait(site, stream), "waiting for the CPU task");
        if (eager) check(cudaEventRecord(cpu_done_.get(), stream), "recording a timing event");
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
        const cpu::ExpertSource src = cpu::expert_source(*ctx_.model, layer);
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

    // Feeds the last eager step's measured times to the split controller: the GPU share and the
    // span from the signal to the end of the wait for the CPU (CUDA events), and the CPU task
    // (the coordinator's clock).
    void adapt() {
        if (pending_site_ < 0) return;
        if (cudaEventQuery(cpu_done_.get()) != cudaSuccess) {
            cudaGetLastError();  // not finished yet (cudaErrorNotReady): measure a later step
            return;
        }
        const int site = pending_site_;
        pending_site_ = -1;
        float ms = 0.0f, ms_span = 0.0f;
        if (cudaEventElapsedTime(&ms, gpu_start_.get(), gpu_stop_.get()) != cudaSuccess ||
            cudaEventElapsedTime(&ms_span, gpu_start_.get(), cpu_done_.get()) != cudaSuccess) {
            cudaGetLastError();
            return;
        }
        const double t_gpu = ms * 1e-3, t_span = ms_span * 1e-3, t_task = handoff_->timing(site).task_seconds;
        uint64_t cpu_experts;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            cpu_experts = last_cpu_experts_;
            gpu_seconds_ += t_gpu;
            ++timed_steps_;
        }
        // A host-function wait node costs tens of microseconds even when the result is there:
        // its span would read as CPU latency, so that mechanism balances on the task alone.
        const bool span_is_latency = handoff_->mechanism() == cuda::HandoffMechanism::stream_memops;
        control_.observe(t_gpu, span_is_latency ? t_span : -1.0, t_task, cpu_experts, *pin_missing_.get<int64_t>());
    }

    static constexpr size_t kMappedAddendBytes = size_t(64) << 10;  // read in place up to this size
    // How long the workers poll after a call is enqueued: longer than the enqueue runs ahead of
    // the GPU in a host-bound decode (a layer's launches), short enough to idle between tokens.
    static constexpr std::chrono::microseconds kWarmPeriod{2000};

    cpu::MoeExecutor cpu_;
    std::unique_ptr<cuda::Handoff> handoff_;
    std::map<int64_t, int> sites_;
    PinnedBuffer pin_x_, pin_ids_, pin_w_, pin_y_, pin_missing_;
    DeviceBuffer addend_;  // the CPU's partial sum on the device, for sums above kMappedAddendBytes
    Event gpu_start_{true}, gpu_stop_{true}, cpu_done_{true};  // signal, GPU share done, CPU result waited for
    int pending_site_ = -1;
    HybridController control_{0.5, true};
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

std::unique_ptr<Backend> make_hybrid_backend(const BackendContext &ctx) { return std::make_unique<HybridBackend>(ctx); }

}  // namespace ft::gpu_backend
