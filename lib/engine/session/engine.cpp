#include <algorithm>
#include <cstring>

#include "ft/common.hpp"
#include "ft/session.hpp"

namespace ft {

Engine::Engine(const ft_engine_params &p) : tuning_(read_tuning()), isa_(cpu::capped_isa(tuning_.cpu_isa)) {
    if (p.cpu_threads < 0 || p.cpu_threads > 4096)
        fail(FT_ERR_INVALID_ARGUMENT, "cpu_threads must be in [0, 4096], got ", p.cpu_threads);
    if (p.device < FT_DEVICE_AUTO) fail(FT_ERR_INVALID_ARGUMENT, "device must be >= -2, got ", p.device);

    const int count = cuda::device_count();
    if (p.device == FT_DEVICE_AUTO) {
        device_ = count > 0 ? 0 : FT_DEVICE_NONE;
    } else if (p.device >= 0) {
        if (!cuda::built_with_cuda()) fail(FT_ERR_NO_DEVICE, "device ", p.device, " asked for, but this build has no CUDA support");
        if (p.device >= count) fail(FT_ERR_NO_DEVICE, "device ", p.device, " asked for, but ", count, " CUDA device(s) are usable");
        device_ = p.device;
    }
    if (device_ >= 0) device_name_ = cuda::device_name(device_);

    physical_cores_ = static_cast<int32_t>(cpu::physical_core_cpus().size());
    // More workers than logical CPUs only makes the pass barriers wait on descheduled threads:
    // an explicit count is clamped to the CPUs this process may run on.
    int workers = p.cpu_threads > 0 ? p.cpu_threads : cpu::default_worker_count(device_ >= 0);
    const int cpus = cpu::logical_cpu_count();
    if (workers > cpus) {
        log(FT_LOG_WARN, "engine: cpu_threads ", workers, " exceeds the ", cpus,
            " logical CPUs this process may run on; using ", cpus);
        workers = cpus;
    }
    pool_ = std::make_unique<cpu::ThreadPool>(workers, p.pin_threads, tuning_.cpu_spin_us);
    // Process-wide settings the kernels read: the engine created last sets them.
    cpu::set_prefetch_bytes(tuning_.cpu_prefetch);
    cuda::set_pdl_allowed(tuning_.cuda_pdl);
    log(FT_LOG_INFO, "engine: ", pool_->size(), " CPU workers (", cpu::isa_name(isa_), "), ",
        device_ >= 0 ? cat("GPU ", device_, " ", device_name_) : std::string("no GPU"));
}

MachineCaps Engine::caps() const {
    MachineCaps c;
    c.gpu = device_ >= 0;
    c.gpu_kernels = cuda::built_with_cuda();
    if (c.gpu) c.gpu_free_bytes = cuda::memory_info(device_).free_bytes;
    c.cpu_threads = pool_->size();
    return c;
}

LoadedModel::LoadedModel(Engine &engine, std::unique_ptr<Model> model) : engine_(engine), model_(std::move(model)) {}

std::unique_ptr<LoadedModel> LoadedModel::load(Engine &engine, const std::string &path, const ft_model_load_params &p) {
    if (p.io_threads < 0 || p.io_threads > 1024) fail(FT_ERR_INVALID_ARGUMENT, "io_threads must be in [0, 1024]");
    // The loaded model's pins land on the wrapper created first, so layers are page-locked as
    // soon as they are filled, overlapping the rest of the read.
    auto holder = std::make_unique<LoadedModel>(engine, nullptr);
    LoadOptions opts;
    opts.io_threads = p.io_threads > 0 ? p.io_threads : engine.pool().size();
    if (p.progress) {
        opts.progress = [&p](uint64_t done, uint64_t total) { return p.progress(p.progress_user_data, "load", done, total); };
    }
    // Pinning needs the banks, which exist once load_checkpoint has built the model; it calls
    // on_layer_filled only after that point.
    Model *loading = nullptr;
    opts.on_model_allocated = [&loading](Model &m) { loading = &m; };
    if (engine.device() >= 0) {
        opts.on_layer_filled = [&holder, &loading](int layer) { holder->pin_banks(*loading, layer); };
    }
    holder->model_ = load_checkpoint(path, opts);
    holder->finalized_ = true;
    const ModelSpec &s = holder->model_->spec();
    log(FT_LOG_INFO, "model: ", s.architecture, ", ", s.num_layers, " MoE layers x ", s.num_experts, " experts (top-", s.top_k,
        "), H=", s.hidden, " I=", s.intermediate, ", ", holder->model_->banks().total_bytes() / 1e9, " GB of ",
        format_name(s.format), " experts", holder->pins_.empty() ? "" : ", page-locked");
    return holder;
}

void LoadedModel::pin_banks(Model &model, int32_t layer) {
    ExpertBanks &banks = model.banks();
    std::lock_guard<std::mutex> lock(pin_mutex_);
    for (int b = 0; b < banks.num_banks(); ++b) {
        try {
            const size_t bytes = banks.layer_row_bytes(b, layer) * banks.num_experts();
            pins_.emplace_back(engine_.device(), banks.layer_base(b, layer), bytes);
            pinned_bytes_ += bytes;
        } catch (const Error &e) {
            // The CPU reads pageable memory just as well; only GPU zero-copy reads need the lock.
            if (!pin_warned_) log(FT_LOG_WARN, "expert banks stay pageable: ", e.what());
            pin_warned_ = true;
        }
    }
}

uint64_t LoadedModel::pinned_bytes() const {
    std::lock_guard<std::mutex> lock(pin_mutex_);
    return pinned_bytes_;
}

void LoadedModel::set_expert(int32_t layer, int32_t expert, int32_t proj, const void *data, size_t nbytes) {
    if (finalized_) fail(FT_ERR_STATE, "the model is finalized; experts can no longer be set");
    const ModelSpec &s = model_->spec();
    if (layer < 0 || layer >= s.num_layers) fail(FT_ERR_INVALID_ARGUMENT, "layer ", layer, " out of range [0, ", s.num_layers, ")");
    if (expert < 0 || expert >= s.num_experts)
        fail(FT_ERR_INVALID_ARGUMENT, "expert ", expert, " out of range [0, ", s.num_experts, ")");
    if (proj != FT_PROJ_GATE && proj != FT_PROJ_UP && proj != FT_PROJ_DOWN)
        fail(FT_ERR_INVALID_ARGUMENT, "unknown projection ", proj, " (FT_PROJ_GATE, FT_PROJ_UP or FT_PROJ_DOWN)");
    if (!data) fail(FT_ERR_INVALID_ARGUMENT, "data is NULL");
    const size_t expected = static_cast<size_t>(s.hidden) * s.intermediate * sizeof(uint16_t);
    if (nbytes != expected)
        fail(FT_ERR_INVALID_ARGUMENT, "projection ", proj, " of a bf16 expert is ", expected, " bytes (", proj == FT_PROJ_DOWN ? "[H, I]" : "[I, H]",
             "), got ", nbytes);
    uint16_t *dst = const_cast<uint16_t *>(proj == FT_PROJ_GATE ? model_->gate(layer, expert)
                                           : proj == FT_PROJ_UP ? model_->up(layer, expert)
                                                                : model_->down(layer, expert));
    std::memcpy(dst, data, nbytes);
    if (written_.empty()) written_.assign(static_cast<size_t>(s.num_layers) * s.num_experts * 3, 0);
    written_[(static_cast<size_t>(layer) * s.num_experts + expert) * 3 + (proj - 1)] = 1;
}

void LoadedModel::set_router_bias(int32_t layer, const float *bias, int32_t n) {
    if (finalized_) fail(FT_ERR_STATE, "the model is finalized; the router bias can no longer be set");
    const ModelSpec &s = model_->spec();
    if (layer < 0 || layer >= s.num_layers) fail(FT_ERR_INVALID_ARGUMENT, "layer ", layer, " out of range [0, ", s.num_layers, ")");
    if (!bias) fail(FT_ERR_INVALID_ARGUMENT, "bias is NULL");
    if (n != s.num_experts) fail(FT_ERR_INVALID_ARGUMENT, "router bias has ", n, " entries, the model has ", s.num_experts, " experts");
    for (int32_t e = 0; e < n; ++e) {
        if (!std::isfinite(bias[e])) fail(FT_ERR_NON_FINITE, "router bias of expert ", e, " is not finite");
    }
    Tensor &t = model_->extras(layer).router_bias;
    t.dtype = FT_DTYPE_F32;
    t.shape = {n};
    t.bytes.resize(sizeof(float) * n);
    std::memcpy(t.bytes.data(), bias, t.bytes.size());
}

void LoadedModel::finalize() {
    if (finalized_) fail(FT_ERR_STATE, "the model is already finalized");
    const ModelSpec &s = model_->spec();
    static const char *names[] = {"gate", "up", "down"};
    for (int32_t l = 0; l < s.num_layers; ++l) {
        for (int32_t e = 0; e < s.num_experts; ++e) {
            for (int p = 0; p < 3; ++p) {
                const size_t i = (static_cast<size_t>(l) * s.num_experts + e) * 3 + p;
                if (written_.empty() || !written_[i])
                    fail(FT_ERR_STATE, "layer ", l, " expert ", e, ": the ", names[p], " projection was never set");
            }
        }
    }
    if (engine_.device() >= 0) {
        for (int32_t l = 0; l < s.num_layers; ++l) pin_banks(*model_, l);
    }
    written_.clear();
    written_.shrink_to_fit();
    finalized_ = true;
}

}  // namespace ft
