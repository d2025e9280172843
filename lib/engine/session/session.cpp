#include <cmath>
#include <cstring>

#include "ft/backend_registry.hpp"
#include "ft/common.hpp"
#include "ft/profile.hpp"
#include "ft/selector.hpp"
#include "ft/session.hpp"

namespace ft {

namespace {

// The hybrid fetch fraction the saved profile of this machine gives the model's format, or its
// formats weighted by bytes (docs/formulas.md, "Bandwidth profile": reader rules), or 0.5
// without a usable profile.
double profiled_fetch_fraction(Engine &engine, const ModelSpec &spec) {
    try {
        const auto profile = load_usable_profile(default_profile_path(), engine.device_name());
        if (profile) {
            if (const auto f = model_fetch_fraction(*profile, spec)) {
                log(FT_LOG_INFO, "hybrid: fetch fraction ", *f, " from the profile");
                return *f;
            }
        }
    } catch (const Error &e) {
        log(FT_LOG_WARN, "hybrid: profile not used: ", e.what());
    }
    return 0.5;
}

// This machine's saved profile for `auto` (docs/formulas.md, "Bandwidth profile"), or nothing.
std::optional<Profile> machine_profile(Engine &engine) {
    try {
        return load_usable_profile(default_profile_path(), engine.device_name());
    } catch (const Error &e) {
        log(FT_LOG_WARN, "auto: profile not used: ", e.what());
        return std::nullopt;
    }
}

bool bf16_finite(uint16_t v) { return (v & 0x7f80u) != 0x7f80u; }

bool overlaps(const void *a, size_t an, const void *b, size_t bn) {
    const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
    return pa < pb + bn && pb < pa + an;
}

}  // namespace

Session::Session(LoadedModel &model, const ft_session_params &params) : model_(model), params_(params) {
    if (!model.finalized()) fail(FT_ERR_STATE, "the model is not finalized (call ft_model_finalize first)");
    if (params_.max_tokens < 1 || params_.max_tokens > 65536)
        fail(FT_ERR_INVALID_ARGUMENT, "max_tokens must be in [1, 65536], got ", params_.max_tokens);
    if (params_.cache_slots < 0) fail(FT_ERR_INVALID_ARGUMENT, "cache_slots must not be negative, got ", params_.cache_slots);
    if (!(params_.cache_fraction >= 0.0 && params_.cache_fraction <= 1.0))
        fail(FT_ERR_INVALID_ARGUMENT, "cache_fraction must be in [0, 1], got ", params_.cache_fraction);
    if (params_.prefill_min_tokens < 0)
        fail(FT_ERR_INVALID_ARGUMENT, "prefill_min_tokens must not be negative, got ", params_.prefill_min_tokens);
    if (params_.cache_policy != FT_CACHE_LRU && params_.cache_policy != FT_CACHE_FREQUENCY &&
        params_.cache_policy != FT_CACHE_AUTO)
        fail(FT_ERR_INVALID_ARGUMENT, "cache_policy must be FT_CACHE_LRU, FT_CACHE_FREQUENCY or FT_CACHE_AUTO, got ",
             params_.cache_policy);
    if (params_.cache_half_life < 0 || params_.cache_half_life > (1 << 20))
        fail(FT_ERR_INVALID_ARGUMENT, "cache_half_life must be in [0, 2^20] decode steps, got ", params_.cache_half_life);
    MachineCaps caps = model.engine().caps();
    caps.vram_reserve_bytes = params_.vram_reserve_bytes;
    caps.shared_experts = params_.shared_experts;
    // `auto` weighs the machine's profile when a GPU could run the slot-cache backends.
    const std::optional<Profile> profile =
        params_.backend == FT_BACKEND_AUTO && caps.gpu ? machine_profile(model.engine()) : std::nullopt;
    SelectionInputs inputs;
    inputs.profile = profile ? &*profile : nullptr;
    inputs.cache_slots = params_.cache_slots;
    inputs.cache_fraction = params_.cache_fraction;
    const BackendChoice choice = select_backend(params_.backend, caps, model.model().spec(), inputs);
    backend_ = choice.backend;
    backend_reason_ = choice.reason;
    log(FT_LOG_INFO, "session: backend ", backend_name(backend_), " (", choice.reason, ")");
    const BackendInfo *info = find_backend(backend_);
    if (!info || !info->make) fail(FT_ERR_INTERNAL, "selected backend ", backend_, " has no implementation");
    BackendContext ctx;
    ctx.device = model.engine().device();
    ctx.pool = &model.engine().pool();
    ctx.cpu_isa = static_cast<int>(model.engine().isa());
    ctx.model = &model.model();
    ctx.params = params_;
    ctx.tuning = model.engine().tuning();
    if (backend_ == FT_BACKEND_HYBRID && params_.hybrid_fraction == 0.0f)
        ctx.params.hybrid_fraction = static_cast<float>(profiled_fetch_fraction(model.engine(), model.model().spec()));
    // AUTO: the policy that was faster for the backend on bench/run_trace.sh's decode traces
    // (docs/formulas.md, "Slot cache policies").
    if (params_.cache_policy == FT_CACHE_AUTO)
        ctx.params.cache_policy = backend_ == FT_BACKEND_HYBRID ? FT_CACHE_LRU : FT_CACHE_FREQUENCY;
    if (backend_ == FT_BACKEND_OFFLOAD || backend_ == FT_BACKEND_HYBRID) cache_policy_ = ctx.params.cache_policy;
    impl_ = info->make(ctx);
    reset_stats();
    if (const std::string &path = model.engine().tuning().trace_routes; !path.empty()) {
        const ModelSpec &s = model.model().spec();
        recorder_ = std::make_unique<RouteRecorder>(path, s.num_layers, s.num_experts, s.top_k);
    }
}

ft_session_stats Session::stats() const {
    ft_session_stats s = stats_;
    impl_->add_device_stats(s);
    return s;
}

void Session::layer_stats(int32_t layer, ft_layer_stats &out) const {
    const ModelSpec &s = model_.model().spec();
    if (layer < 0 || layer >= s.num_layers) fail(FT_ERR_INVALID_ARGUMENT, "layer ", layer, " out of range [0, ", s.num_layers, ")");
    std::memset(&out, 0, sizeof out);
    out.struct_size = sizeof out;
    impl_->layer_stats(layer, out);
}

int32_t Session::device() const { return model_.engine().device(); }

void Session::reset_stats() {
    std::memset(&stats_, 0, sizeof stats_);
    stats_.struct_size = sizeof stats_;
    impl_->reset_stats();
}

void Session::route(int32_t layer, int32_t num_tokens, const float *logits, int32_t *ids, float *weights) {
    route_tokens(layer, num_tokens, logits, nullptr, ids, weights, false);
}

void Session::route_tokens(int32_t layer, int32_t num_tokens, const float *logits, const int32_t *token_ids,
                           int32_t *ids, float *weights, bool tokens_call) {
    const Model &m = model_.model();
    const ModelSpec &s = m.spec();
    if (layer < 0 || layer >= s.num_layers) fail(FT_ERR_INVALID_ARGUMENT, "layer ", layer, " out of range [0, ", s.num_layers, ")");
    if (num_tokens < 0) fail(FT_ERR_INVALID_ARGUMENT, "num_tokens must not be negative");
    const bool hashed = layer < s.hash_layers;
    if (hashed && !tokens_call)
        fail(FT_ERR_INVALID_ARGUMENT, "MoE layer ", layer, " routes by token id (one of the model's ", s.hash_layers,
             " hash-routed layers): use ft_route_tokens with the tokens' ids");
    if (num_tokens == 0) return;
    if (!logits || !ids || !weights) fail(FT_ERR_INVALID_ARGUMENT, "logits, expert_ids and expert_weights must not be NULL");
    if (hashed) {
        if (!token_ids)
            fail(FT_ERR_INVALID_ARGUMENT, "MoE layer ", layer, " routes by token id: token_ids must not be NULL");
        const std::vector<int32_t> &table = m.extras(layer).tid2eid;
        if (table.size() != static_cast<size_t>(s.vocab_size) * static_cast<size_t>(s.top_k))
            fail(FT_ERR_INTERNAL, "MoE layer ", layer, " has no tid2eid table");
        ft::route_hash(s.routing, table.data(), s.vocab_size, num_tokens, logits, token_ids, ids, weights);
        return;
    }
    const Tensor &bias = m.extras(layer).router_bias;
    const float *b = nullptr;
    const bool biased_selection = s.routing.rule == FT_ROUTING_SIGMOID_GROUP_TOPK ||
                                  s.routing.rule == FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK ||
                                  s.routing.rule == FT_ROUTING_SOFTMAX_BIASED_TOPK;
    if (biased_selection && !bias.empty()) b = reinterpret_cast<const float *>(bias.bytes.data());
    ft::route(s.routing, b, num_tokens, logits, ids, weights);
}

void Session::decode(const DecodeCall &c) {
    const ModelSpec &s = model_.model().spec();
    if (const ft_status st = impl_->status(); st != FT_OK) fail(st, "the session cannot continue (see ft_session_status)");
    if (c.layer < 0 || c.layer >= s.num_layers)
        fail(FT_ERR_INVALID_ARGUMENT, "layer ", c.layer, " out of range [0, ", s.num_layers, ")");
    if (c.num_tokens < 1 || c.num_tokens > params_.max_tokens)
        fail(FT_ERR_INVALID_ARGUMENT, "num_tokens ", c.num_tokens, " out of range [1, ", params_.max_tokens,
             "] (max_tokens of the session)");
    if (c.shared == SharedPart::only) {
        if (!c.on_device || !impl_->device_path() || !c.hidden || !c.out)
            fail(FT_ERR_INVALID_ARGUMENT, "a shared-expert-only call takes device hidden and out on a GPU backend");
        if (params_.shared_experts) impl_->decode(c, stats_);
        return;
    }
    if (!c.hidden || !c.ids || !c.weights || !c.out)
        fail(FT_ERR_INVALID_ARGUMENT, "hidden, expert_ids, expert_weights and out must not be NULL");
    const size_t act_bytes = static_cast<size_t>(c.num_tokens) * s.hidden * sizeof(uint16_t);
    if (overlaps(c.hidden, act_bytes, c.out, act_bytes)) fail(FT_ERR_INVALID_ARGUMENT, "out overlaps hidden");
    if (c.on_device) {
        // Device memory cannot be read here without a synchronisation: the backend skips ids
        // outside [0, E) on the device and check_finite does not apply (freetoken_cuda.h).
        if (!impl_->device_path())
            fail(FT_ERR_UNSUPPORTED, "ft_decode_cuda needs a GPU backend; this session runs ", backend_name(backend_));
        impl_->decode(c, stats_);
        stats_.decode_calls += 1;
        stats_.tokens += static_cast<uint64_t>(c.num_tokens);
        return;
    }

    const int32_t K = s.top_k;
    for (int32_t t = 0; t < c.num_tokens; ++t) {
        for (int32_t k = 0; k < K; ++k) {
            const int32_t id = c.ids[static_cast<size_t>(t) * K + k];
            if (id >= s.num_experts)
                fail(FT_ERR_INVALID_ARGUMENT, "expert id ", id, " at token ", t, " route ", k, " is out of range [0, ", s.num_experts,
                     ") (negative ids mean: computed elsewhere)");
            if (id >= 0 && params_.check_finite && !std::isfinite(c.weights[static_cast<size_t>(t) * K + k]))
                fail(FT_ERR_NON_FINITE, "routing weight at token ", t, " route ", k, " is ", c.weights[static_cast<size_t>(t) * K + k]);
        }
    }
    if (params_.check_finite) {
        const size_t n = static_cast<size_t>(c.num_tokens) * s.hidden;
        for (size_t i = 0; i < n; ++i) {
            if (!bf16_finite(c.hidden[i]))
                fail(FT_ERR_NON_FINITE, "hidden state of token ", i / s.hidden, " channel ", i % s.hidden, " is not finite");
        }
    }
    if (recorder_) recorder_->record(c.layer, c.num_tokens, c.ids);
    impl_->decode(c, stats_);
    stats_.decode_calls += 1;
    stats_.tokens += static_cast<uint64_t>(c.num_tokens);
}

}  // namespace ft
