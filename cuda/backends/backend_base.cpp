// CudaBackend (backend_base.hpp): what the gpu, offload and hybrid backends share.
#include "backend_base.hpp"

#include <algorithm>
#include <cstring>

#include "ft/device_util.hpp"

namespace ft::gpu_backend {

namespace {
int32_t prefill_threshold(const ft_session_params &p) { return p.prefill_min_tokens > 0 ? p.prefill_min_tokens : 64; }
}  // namespace

cuda::DeviceActivation activation_of(const ModelSpec &s) {
    cuda::DeviceActivation a;
    a.kind = s.activation;
    a.alpha = s.swiglu_alpha;
    a.limit = s.swiglu_limit;
    return a;
}

CudaBackend::CudaBackend(const BackendContext &ctx)
    : ctx_(ctx), spec_(ctx.model->spec()), device_(ctx.device), threshold_(prefill_threshold(ctx.params)) {
    if (device_ < 0) fail(FT_ERR_NO_DEVICE, "the engine has no GPU (create it with a device)");
    // A model mixing GGUF block formats: the decoder and the prefill are made for spec_.format
    // (layer 0's gate_up, a block format) and run every layer in its own formats.
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
    if (spec_.route_weight == FT_ROUTE_WEIGHT_INPUT) {
        if (spec_.top_k != 1)
            fail(FT_ERR_UNSUPPORTED, "the GPU backends scale the expert input (FT_ROUTE_WEIGHT_INPUT) of top-1 models only; top_k is ",
                 spec_.top_k, " (use the cpu backend)");
        scaled_x_ = DeviceBuffer(act, "allocating GPU staging");
        ones_ = DeviceBuffer(size_t(max_tokens) * sizeof(float), "allocating GPU staging");
    }
    if (ctx.params.shared_experts)
        shared_ = std::make_unique<SharedExperts>(*ctx.model, max_tokens, activation_of(spec_));
    layer_stats_ = DeviceBuffer(size_t(spec_.num_layers) * kLayerColumns * sizeof(int64_t), "allocating GPU statistics");
    check(cudaMemset(layer_stats_.get(), 0, layer_stats_.bytes()), "clearing GPU statistics");
    for (int b = 0; b < ctx.model->banks().num_banks(); ++b) expert_bytes_ += ctx.model->banks().row_bytes(b);
    if (spec_.expert_biases) upload_biases();
}

void CudaBackend::upload_biases() {
    if (spec_.format != Format::bf16)
        fail(FT_ERR_INTERNAL, "expert biases beside the banks are for bf16 experts, the model is ", format_name(spec_.format));
    const size_t E = size_t(spec_.num_experts), gu = E * 2 * size_t(spec_.intermediate), dn = E * size_t(spec_.hidden);
    biases_ = DeviceBuffer(size_t(spec_.num_layers) * (gu + dn) * sizeof(float), "allocating the expert biases");
    for (int32_t l = 0; l < spec_.num_layers; ++l) {
        const LayerExtras &x = ctx_.model->extras(l);
        if (x.expert_gate_up_bias.bytes.size() != gu * sizeof(float) || x.expert_down_bias.bytes.size() != dn * sizeof(float))
            fail(FT_ERR_INTERNAL, "layer ", l, ": expert biases of ", x.expert_gate_up_bias.bytes.size(), " and ",
                 x.expert_down_bias.bytes.size(), " bytes, expected ", gu * sizeof(float), " and ", dn * sizeof(float));
        float *dst = biases_.get<float>() + size_t(l) * (gu + dn);
        check(cudaMemcpy(dst, x.expert_gate_up_bias.bytes.data(), gu * sizeof(float), cudaMemcpyHostToDevice),
              "copying the expert biases to the GPU");
        check(cudaMemcpy(dst + gu, x.expert_down_bias.bytes.data(), dn * sizeof(float), cudaMemcpyHostToDevice),
              "copying the expert biases to the GPU");
    }
}

bool CudaBackend::note_lost(const Error &e) const {
    if (e.status() != FT_ERR_DEVICE_LOST) return false;
    if (!lost_) lost_message_ = e.what();
    lost_ = true;
    return true;
}

void CudaBackend::decode(const DecodeCall &c, ft_session_stats &stats) {
    if (lost_) fail(FT_ERR_DEVICE_LOST, "the session's GPU is lost: ", lost_message_);
    try {
        DeviceScope scope(device_);
        run(c, stats);
    } catch (const Error &e) {
        note_lost(e);
        throw;
    }
}

void CudaBackend::add_device_stats(ft_session_stats &stats) const {
    if (lost_) return;
    const std::vector<int64_t> rows = guarded_rows();
    if (rows.empty()) return;
    for (int32_t l = 0; l < spec_.num_layers; ++l) {
        const ft_layer_stats s = to_layer_stats(rows.data() + size_t(l) * kLayerColumns, l);
        stats.cache_hits += s.active_experts - s.misses;
        stats.cache_misses += s.misses;
        stats.fetched_experts += s.fetched_experts;
        stats.fetched_bytes += s.fetched_bytes;
    }
}

void CudaBackend::layer_stats(int32_t layer, ft_layer_stats &out) const {
    if (lost_) fail(FT_ERR_DEVICE_LOST, "the session's GPU is lost: ", lost_message_);
    const std::vector<int64_t> rows = guarded_rows();
    if (rows.empty()) fail(FT_ERR_DEVICE_LOST, "the session's GPU is lost: ", lost_message_);
    out = to_layer_stats(rows.data() + size_t(layer) * kLayerColumns, layer);
}

void CudaBackend::reset_stats() {
    if (lost_) return;
    try {
        DeviceScope scope(device_);
        check(cudaDeviceSynchronize(), "waiting for the GPU");
        check(cudaMemset(layer_stats_.get(), 0, layer_stats_.bytes()), "clearing GPU statistics");
        clear_cache_stats();
    } catch (const Error &e) {
        if (!note_lost(e)) throw;
    }
}

std::vector<int64_t> CudaBackend::read_layer_stats() const {
    std::vector<int64_t> rows(size_t(spec_.num_layers) * kLayerColumns);
    DeviceScope scope(device_);
    check(cudaDeviceSynchronize(), "waiting for the GPU");
    check(cudaMemcpy(rows.data(), layer_stats_.get(), layer_stats_.bytes(), cudaMemcpyDeviceToHost), "reading GPU statistics");
    return rows;
}

std::vector<int64_t> CudaBackend::guarded_rows() const {
    try {
        return read_layer_stats();
    } catch (const Error &e) {
        if (!note_lost(e)) throw;
        return {};
    }
}

ft_layer_stats CudaBackend::to_layer_stats(const int64_t *row, int32_t layer) const {
    ft_layer_stats s{};
    s.struct_size = sizeof s;
    s.calls = uint64_t(row[kStatCalls]);
    s.active_experts = uint64_t(row[kStatActive]);
    s.misses = uint64_t(row[kStatMissing]);
    s.fetched_experts = uint64_t(row[kStatFetched]);
    s.fetched_bytes = s.fetched_experts * (layer >= 0 ? ctx_.model->banks().expert_bytes(layer) : expert_bytes_);
    return s;
}

cuda::DeviceExperts CudaBackend::device_experts(const std::vector<DeviceBuffer> &arrays, size_t slot_offset,
                                                int32_t layer) const {
    cuda::DeviceExperts d;
    const LayerFormats lf = spec_.formats_of(layer);
    d.format = lf.gate_up;
    d.down_format = lf.down != lf.gate_up ? int32_t(lf.down) : -1;
    d.hidden = spec_.hidden;
    d.inter = spec_.intermediate;
    const ExpertBanks &banks = ctx_.model->banks();
    d.num_banks = banks.num_banks();
    for (int b = 0; b < d.num_banks; ++b) {
        d.base[b] = arrays[b].get() + slot_offset * banks.row_bytes(b);
        d.row_bytes[b] = banks.row_bytes(b);
    }
    if (biases_.get()) {
        const size_t E = size_t(spec_.num_experts), gu = E * 2 * size_t(spec_.intermediate), dn = E * size_t(spec_.hidden);
        const float *base = biases_.get<float>() + size_t(layer) * (gu + dn);
        d.gate_up_bias = base;
        d.down_bias = base + gu;
        d.bias_experts = spec_.num_experts;
    }
    return d;
}

// Host pointers: one pinned staging copy in (hidden, ids, weights), enqueued on `stream`.
void CudaBackend::stage_host_call(const DecodeCall &c, cudaStream_t stream) {
    const size_t act = size_t(c.num_tokens) * spec_.hidden * sizeof(uint16_t);
    const size_t routes = size_t(c.num_tokens) * spec_.top_k;
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
}

void CudaBackend::run(const DecodeCall &c, ft_session_stats &stats) {
    const size_t H = size_t(spec_.hidden), K = size_t(spec_.top_k), T = size_t(c.num_tokens);
    const size_t act = T * H * sizeof(uint16_t), routes = T * K;
    cudaStream_t stream = c.on_device ? static_cast<cudaStream_t>(c.stream) : own_.get();
    const uint16_t *x = c.hidden;
    const int32_t *ids = c.ids;
    const float *w = c.weights;
    uint16_t *y = c.out;
    if (c.on_device) {
        require_device_memory(c.hidden, "hidden");
        if (c.shared == SharedPart::only) {  // out += the shared expert(s); the routes were summed elsewhere
            require_device_memory(c.out, "out");
            if (shared_) check(shared_->add(c.layer, x, y, c.num_tokens, stream), "launching the shared expert");
            return;
        }
        require_device_memory(c.ids, "expert_ids");
        require_device_memory(c.weights, "expert_weights");
        require_device_memory(c.out, "out");
    } else {
        // Host pointers: one pinned staging copy in, one out; the call waits for the result.
        stage_host_call(c, stream);
        x = in_x_.get<uint16_t>();
        ids = in_ids_.get<int32_t>();
        w = in_w_.get<float>();
        y = out_y_.get<uint16_t>();
    }
    // Input-scaled routes (top-1): the experts run on bf16(w x) with weight 1; the shared expert on x.
    const uint16_t *xe = x;
    if (scaled_x_.get()) {
        check(cuda::launch_scale_input(x, w, c.num_tokens, spec_.hidden, scaled_x_.get<uint16_t>(), ones_.get<float>(), stream),
              "launching the input scaling");
        xe = scaled_x_.get<uint16_t>();
        w = ones_.get<float>();
    }
    if (c.num_tokens >= threshold_) {
        run_prefill(c, xe, ids, w, y, stream, stats);
    } else {
        run_decode(c.layer, xe, ids, w, y, c.num_tokens, stream);
        check(cudaGetLastError(), "launching the decode kernels");
    }
    if (shared_ && c.shared == SharedPart::with_routed)
        check(shared_->add(c.layer, x, y, c.num_tokens, stream), "launching the shared expert");
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

void CudaBackend::require_device_memory(const void *p, const char *name) {
    cudaPointerAttributes a{};
    check(cudaPointerGetAttributes(&a, p), "cudaPointerGetAttributes");
    if (a.type == cudaMemoryTypeUnregistered)
        fail(FT_ERR_INVALID_ARGUMENT, "ft_decode_cuda: ", name, " is pageable host memory, not device memory (use ft_decode)");
}

void CudaBackend::run_prefill(const DecodeCall &c, const uint16_t *x, const int32_t *ids, const float *w, uint16_t *y,
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

}  // namespace ft::gpu_backend
