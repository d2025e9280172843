// The C ABI: thin noexcept shims. Each checks its arguments, calls the C++ core inside a
// catch-all, and turns exceptions into an ft_status plus a message stored on the handle (or in
// the caller's buffer before a handle exists). No logic lives here.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include <oneapi/dnnl/dnnl.h>

#include "freetoken.h"
#ifdef FT_HAVE_CUDA
#include "freetoken_cuda.h"
#else
// Without the CUDA headers the device entry points still exist (and say FT_ERR_UNSUPPORTED);
// the stream is an opaque pointer either way.
typedef struct CUstream_st *cudaStream_t;
extern "C" {
FT_API ft_status ft_decode_cuda(ft_session *session, int32_t layer, int32_t num_tokens, const uint16_t *hidden,
                                const int32_t *expert_ids, const float *expert_weights, uint16_t *out, cudaStream_t stream);
FT_API int32_t ft_session_device(const ft_session *session);
}
#endif
#include "ft/common.hpp"
#include "handles.hpp"
#include "shim.hpp"
#include "ft/cpu.hpp"
#include "ft/cuda_device.hpp"
#include "ft/profile.hpp"
#include "ft/profiler.hpp"
#include "ft/session.hpp"

// Immutable once made, so it carries no error text: its accessors only return statuses.
struct ft_profile {
    ft::Profile impl;
};

namespace {

using ft::api::guarded;
using ft::api::write_error;

template <typename Fn>
ft_status on_handle(std::string &last_error, Fn &&fn) noexcept {
    const ft_status s = guarded([&](const std::string &m) noexcept {
        try {
            last_error = m;
        } catch (...) {
        }
    }, fn);
    if (s != FT_OK) ft::log(FT_LOG_DEBUG, ft_status_string(s), ": ", last_error);
    return s;
}

template <typename Fn>
ft_status on_buffer(char *err, size_t err_size, Fn &&fn) noexcept {
    if (err && err_size) err[0] = '\0';
    return guarded([&](const std::string &m) { write_error(err, err_size, m); }, fn);
}

// Copies a caller's params struct over the defaults: min(struct_size, sizeof) bytes.
template <typename T>
void read_params(T &out, const T *in) {
    if (!in) return;
    if (in->struct_size < sizeof(uint32_t))
        ft::fail(FT_ERR_INVALID_ARGUMENT, "struct_size of the params is ", in->struct_size, "; fill the struct with its *_init function");
    const size_t n = std::min<size_t>(in->struct_size, sizeof(T));
    std::memcpy(&out, in, n);
    out.struct_size = sizeof(T);
}

// Writes min(struct_size, sizeof) bytes of `value` into the caller's output struct.
template <typename T>
ft_status write_out(T *out, T value) {
    if (!out || out->struct_size < 2 * sizeof(uint32_t)) return FT_ERR_INVALID_ARGUMENT;
    const uint32_t size = out->struct_size;
    value.struct_size = size < sizeof(T) ? size : static_cast<uint32_t>(sizeof(T));
    std::memcpy(out, &value, std::min<size_t>(size, sizeof(T)));
    return FT_OK;
}

const char *kNullHandle = "handle is NULL";

}  // namespace

extern "C" {

uint32_t ft_version_number(void) { return FT_VERSION_NUMBER; }

const char *ft_version_string(void) {
#define FT_STR2(x) #x
#define FT_STR(x) FT_STR2(x)
    return FT_STR(FT_VERSION_MAJOR) "." FT_STR(FT_VERSION_MINOR) "." FT_STR(FT_VERSION_PATCH);
}

const char *ft_status_string(ft_status status) {
    switch (status) {
        case FT_OK: return "FT_OK";
        case FT_ERR_INVALID_ARGUMENT: return "FT_ERR_INVALID_ARGUMENT";
        case FT_ERR_OUT_OF_MEMORY: return "FT_ERR_OUT_OF_MEMORY";
        case FT_ERR_IO: return "FT_ERR_IO";
        case FT_ERR_FORMAT: return "FT_ERR_FORMAT";
        case FT_ERR_UNSUPPORTED: return "FT_ERR_UNSUPPORTED";
        case FT_ERR_NO_DEVICE: return "FT_ERR_NO_DEVICE";
        case FT_ERR_DEVICE: return "FT_ERR_DEVICE";
        case FT_ERR_DEVICE_LOST: return "FT_ERR_DEVICE_LOST";
        case FT_ERR_TIMEOUT: return "FT_ERR_TIMEOUT";
        case FT_ERR_CANCELLED: return "FT_ERR_CANCELLED";
        case FT_ERR_NON_FINITE: return "FT_ERR_NON_FINITE";
        case FT_ERR_STATE: return "FT_ERR_STATE";
        case FT_ERR_INTERNAL: return "FT_ERR_INTERNAL";
        default: return "FT_ERR_UNKNOWN";
    }
}

ft_status ft_build_info_get(ft_build_info *info) {
    if (!info) return FT_ERR_INVALID_ARGUMENT;
    ft_build_info b{};
    b.version_number = FT_VERSION_NUMBER;
    b.cuda = ft::cuda::built_with_cuda();
    b.nccl = false;
    b.cuda_runtime_version = ft::cuda::runtime_version();
    b.cuda_archs = ft::cuda::architectures();
    static char onednn[32];
    static const bool onednn_done = [] {
        const dnnl_version_t *v = dnnl_version();
        std::snprintf(onednn, sizeof onednn, "%d.%d.%d", v->major, v->minor, v->patch);
        return true;
    }();
    (void)onednn_done;
    b.onednn_version = onednn;
    b.cpu_isa = ft::cpu::isa_name(ft::cpu::default_isa());
    b.compiler = FT_COMPILER;
    b.onednn_bf16 = ft::cpu::onednn_bf16_available();
    return write_out(info, b);
}

void ft_log_set_callback(ft_log_fn fn, void *user_data, int32_t level) { ft::set_log_callback(fn, user_data, level); }

/* ---- engine ---- */

void ft_engine_params_init(ft_engine_params *p) {
    if (!p) return;
    std::memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->device = FT_DEVICE_AUTO;
    p->cpu_threads = 0;
    p->pin_threads = true;
}

ft_status ft_engine_create(const ft_engine_params *params, ft_engine **out, char *err, size_t err_size) {
    if (out) *out = nullptr;
    return on_buffer(err, err_size, [&] {
        if (!out) ft::fail(FT_ERR_INVALID_ARGUMENT, "out is NULL");
        ft_engine_params p;
        ft_engine_params_init(&p);
        read_params(p, params);
        auto e = std::make_unique<ft_engine>();
        e->impl = std::make_unique<ft::Engine>(p);
        *out = e.release();
    });
}

void ft_engine_free(ft_engine *engine) { delete engine; }

const char *ft_engine_last_error(const ft_engine *engine) { return engine ? engine->last_error.c_str() : kNullHandle; }

ft_status ft_engine_get_info(const ft_engine *engine, ft_engine_info *info) {
    if (!engine) return FT_ERR_INVALID_ARGUMENT;
    ft_engine_info i{};
    i.device = engine->impl->device();
    i.cpu_threads = engine->impl->pool().size();
    i.physical_cores = engine->impl->physical_cores();
    i.cpu_isa = ft::cpu::isa_name(engine->impl->isa());
    i.device_name = engine->impl->device_name().c_str();
    return write_out(info, i);
}

/* ---- model ---- */

void ft_model_load_params_init(ft_model_load_params *p) {
    if (!p) return;
    std::memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
}

ft_status ft_model_load(ft_engine *engine, const char *path, const ft_model_load_params *params, ft_model **out, char *err,
                        size_t err_size) {
    if (out) *out = nullptr;
    return on_buffer(err, err_size, [&] {
        if (!engine || !path || !out) ft::fail(FT_ERR_INVALID_ARGUMENT, "engine, path and out must not be NULL");
        ft_model_load_params p;
        ft_model_load_params_init(&p);
        read_params(p, params);
        auto m = std::make_unique<ft_model>();
        m->engine = engine;
        m->impl = ft::LoadedModel::load(*engine->impl, path, p);
        m->architecture = m->impl->model().spec().architecture;
        *out = m.release();
    });
}

void ft_model_desc_init(ft_model_desc *d) {
    if (!d) return;
    std::memset(d, 0, sizeof *d);
    d->struct_size = sizeof *d;
    d->format = FT_FORMAT_BF16;
    d->activation = FT_ACT_SILU;
    d->swiglu_alpha = 1.702f;
    d->swiglu_limit = 7.0f;
    d->routing = FT_ROUTING_SOFTMAX_TOPK_RENORM;
    d->num_groups = 1;
    d->topk_groups = 1;
    d->routed_scaling_factor = 1.0f;
    d->renormalize = true;
    d->route_weight = FT_ROUTE_WEIGHT_OUTPUT;
    d->router_jitter_eps = 0.01f;
}

ft_status ft_model_create(ft_engine *engine, const ft_model_desc *desc, ft_model **out, char *err, size_t err_size) {
    if (out) *out = nullptr;
    return on_buffer(err, err_size, [&] {
        if (!engine || !desc || !out) ft::fail(FT_ERR_INVALID_ARGUMENT, "engine, desc and out must not be NULL");
        ft_model_desc d;
        ft_model_desc_init(&d);
        read_params(d, desc);
        if (ft::format_known(d.format) && !ft::format_valid(d.format))
            ft::fail(FT_ERR_UNSUPPORTED, "models built from memory are bf16; load ",
                     ft::format_name(static_cast<ft::Format>(d.format)), " models from their checkpoints");
        if (!ft::format_valid(d.format)) ft::fail(FT_ERR_INVALID_ARGUMENT, "unknown format ", d.format);
        ft::ModelSpec s;
        s.num_layers = d.num_layers;
        s.num_experts = d.num_experts;
        s.top_k = d.top_k;
        s.hidden = d.hidden_size;
        s.intermediate = d.intermediate_size;
        s.format = static_cast<ft::Format>(d.format);
        s.activation = d.activation;
        s.swiglu_alpha = d.swiglu_alpha;
        s.swiglu_limit = d.swiglu_limit;
        s.routing.rule = d.routing;
        s.routing.num_experts = d.num_experts;
        s.routing.top_k = d.top_k;
        s.routing.num_groups = d.num_groups;
        s.routing.topk_groups = d.topk_groups;
        s.routing.routed_scaling_factor = d.routed_scaling_factor;
        s.routing.renormalize = d.renormalize;
        s.routing.jitter_eps = d.router_jitter_eps;
        s.route_weight = d.route_weight;
        auto m = std::make_unique<ft_model>();
        m->engine = engine;
        m->impl = std::make_unique<ft::LoadedModel>(*engine->impl, std::make_unique<ft::Model>(s));
        m->architecture = m->impl->model().spec().architecture;
        *out = m.release();
    });
}

ft_status ft_model_set_expert(ft_model *model, int32_t layer, int32_t expert, int32_t proj, const void *data, size_t nbytes) {
    if (!model) return FT_ERR_INVALID_ARGUMENT;
    return on_handle(model->last_error, [&] { model->impl->set_expert(layer, expert, proj, data, nbytes); });
}

ft_status ft_model_set_router_bias(ft_model *model, int32_t layer, const float *bias, int32_t num_experts) {
    if (!model) return FT_ERR_INVALID_ARGUMENT;
    return on_handle(model->last_error, [&] { model->impl->set_router_bias(layer, bias, num_experts); });
}

ft_status ft_model_finalize(ft_model *model) {
    if (!model) return FT_ERR_INVALID_ARGUMENT;
    return on_handle(model->last_error, [&] { model->impl->finalize(); });
}

void ft_model_free(ft_model *model) { delete model; }

const char *ft_model_last_error(const ft_model *model) { return model ? model->last_error.c_str() : kNullHandle; }

ft_status ft_model_get_info(const ft_model *model, ft_model_info *info) {
    if (!model) return FT_ERR_INVALID_ARGUMENT;
    const ft::Model &m = model->impl->model();
    const ft::ModelSpec &s = m.spec();
    ft_model_info i{};
    i.num_layers = s.num_layers;
    i.num_experts = s.num_experts;
    i.top_k = s.top_k;
    i.hidden_size = s.hidden;
    i.intermediate_size = s.intermediate;
    i.format = static_cast<int32_t>(s.format);
    i.activation = s.activation;
    i.routing = s.routing.rule;
    i.num_groups = s.routing.num_groups;
    i.topk_groups = s.routing.topk_groups;
    i.routed_scaling_factor = s.routing.routed_scaling_factor;
    i.swiglu_alpha = s.swiglu_alpha;
    i.swiglu_limit = s.swiglu_limit;
    i.first_moe_layer = s.moe_layers.empty() ? 0 : s.moe_layers.front();
    i.total_layers = s.total_layers;
    i.shared_intermediate_size = s.shared_intermediate;
    i.expert_bytes = m.banks().expert_bytes();
    i.bank_bytes = m.banks().total_bytes();
    i.architecture = model->architecture.c_str();
    i.pinned_bytes = model->impl->pinned_bytes();
    i.route_weight = s.route_weight;
    i.router_jitter_eps = s.routing.jitter_eps;
    i.expert_biases = s.expert_biases ? 1 : 0;
    i.shared_expert_gate = s.shared_expert_gate ? 1 : 0;
    for (int32_t l = 0; l < s.num_layers; ++l) {
        const ft::LayerFormats lf = s.formats_of(l);
        i.formats_used |= (1u << static_cast<uint32_t>(lf.gate_up)) | (1u << static_cast<uint32_t>(lf.down));
    }
    i.mixed_formats = s.mixed_formats() ? 1 : 0;
    i.hash_layers = s.hash_layers;
    i.vocab_size = s.hash_layers > 0 ? s.vocab_size : 0;
    return write_out(info, i);
}

ft_status ft_model_layer_formats(const ft_model *model, int32_t layer, int32_t *gate_up_format, int32_t *down_format) {
    if (!model || !gate_up_format || !down_format) return FT_ERR_INVALID_ARGUMENT;
    const ft::ModelSpec &s = model->impl->model().spec();
    if (layer < 0 || layer >= s.num_layers) return FT_ERR_INVALID_ARGUMENT;
    const ft::LayerFormats lf = s.formats_of(layer);
    *gate_up_format = static_cast<int32_t>(lf.gate_up);
    *down_format = static_cast<int32_t>(lf.down);
    return FT_OK;
}

int32_t ft_model_moe_layer(const ft_model *model, int32_t model_layer) {
    if (!model) return -1;
    return model->impl->model().moe_layer_of(model_layer);
}

ft_status ft_model_tensor(const ft_model *model, int32_t layer, int32_t which, ft_tensor_view *view) {
    if (!model || !view || view->struct_size < 2 * sizeof(uint32_t)) return FT_ERR_INVALID_ARGUMENT;
    const ft::Model &m = model->impl->model();
    if (layer < 0 || layer >= m.spec().num_layers) return FT_ERR_INVALID_ARGUMENT;
    const ft::LayerExtras &x = m.extras(layer);
    const ft::Tensor *t = nullptr;
    switch (which) {
        case FT_TENSOR_ROUTER_WEIGHT: t = &x.router_weight; break;
        case FT_TENSOR_ROUTER_BIAS: t = &x.router_bias; break;
        case FT_TENSOR_SHARED_GATE: t = &x.shared_gate; break;
        case FT_TENSOR_SHARED_UP: t = &x.shared_up; break;
        case FT_TENSOR_SHARED_DOWN: t = &x.shared_down; break;
        case FT_TENSOR_SHARED_GATE_PROJ: t = &x.shared_gate_proj; break;
        case FT_TENSOR_EXPERT_GATE_UP_BIAS: t = &x.expert_gate_up_bias; break;
        case FT_TENSOR_EXPERT_DOWN_BIAS: t = &x.expert_down_bias; break;
        default: return FT_ERR_INVALID_ARGUMENT;
    }
    if (t->empty() || t->shape.size() > 4) return FT_ERR_UNSUPPORTED;
    ft_tensor_view v{};
    v.dtype = t->dtype;
    v.ndim = static_cast<int32_t>(t->shape.size());
    for (size_t d = 0; d < t->shape.size(); ++d) v.shape[d] = t->shape[d];
    v.data = t->bytes.data();
    v.nbytes = t->bytes.size();
    return write_out(view, v);
}

/* ---- session ---- */

void ft_session_params_init(ft_session_params *p) {
    if (!p) return;
    std::memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->backend = FT_BACKEND_AUTO;
    p->max_tokens = 256;
    p->shared_experts = false;
    p->check_finite = true;
    p->cache_slots = 0;
    p->cache_fraction = 0.0;
    p->vram_reserve_bytes = uint64_t(2) << 30;
    p->prefill_min_tokens = 0;
    p->hybrid_fraction = 0.0f;
    p->hybrid_adaptive = true;
    p->handoff_timeout_seconds = 10.0;
    p->cache_policy = FT_CACHE_AUTO;
    p->cache_half_life = 0;
}

ft_status ft_session_create(ft_model *model, const ft_session_params *params, ft_session **out, char *err, size_t err_size) {
    if (out) *out = nullptr;
    return on_buffer(err, err_size, [&] {
        if (!model || !out) ft::fail(FT_ERR_INVALID_ARGUMENT, "model and out must not be NULL");
        ft_session_params p;
        ft_session_params_init(&p);
        read_params(p, params);
        auto s = std::make_unique<ft_session>();
        s->model = model;
        s->impl = std::make_unique<ft::Session>(*model->impl, p);
        *out = s.release();
    });
}

void ft_session_free(ft_session *session) { delete session; }

const char *ft_session_last_error(const ft_session *session) { return session ? session->last_error.c_str() : kNullHandle; }

int32_t ft_session_backend(const ft_session *session) { return session ? session->impl->backend() : -1; }

int32_t ft_session_cache_policy(const ft_session *session) { return session ? session->impl->cache_policy() : -1; }

ft_status ft_route(ft_session *session, int32_t layer, int32_t num_tokens, const float *logits, int32_t *expert_ids,
                   float *expert_weights) {
    if (!session) return FT_ERR_INVALID_ARGUMENT;
    return on_handle(session->last_error, [&] { session->impl->route(layer, num_tokens, logits, expert_ids, expert_weights); });
}

ft_status ft_route_tokens(ft_session *session, int32_t layer, int32_t num_tokens, const float *logits,
                          const int32_t *token_ids, int32_t *expert_ids, float *expert_weights) {
    if (!session) return FT_ERR_INVALID_ARGUMENT;
    return on_handle(session->last_error, [&] {
        session->impl->route_tokens(layer, num_tokens, logits, token_ids, expert_ids, expert_weights);
    });
}

namespace {

// ft_decode and ft_decode_cuda: the same call, from host or device pointers.
ft_status decode(ft_session *session, int32_t layer, int32_t num_tokens, const uint16_t *hidden, const int32_t *expert_ids,
                 const float *expert_weights, uint16_t *out, bool on_device, void *stream) {
    if (!session) return FT_ERR_INVALID_ARGUMENT;
    return on_handle(session->last_error, [&] {
        ft::DecodeCall c;
        c.layer = layer;
        c.num_tokens = num_tokens;
        c.hidden = hidden;
        c.ids = expert_ids;
        c.weights = expert_weights;
        c.out = out;
        c.on_device = on_device;
        c.stream = stream;
        session->impl->decode(c);
    });
}

}  // namespace

ft_status ft_decode(ft_session *session, int32_t layer, int32_t num_tokens, const uint16_t *hidden, const int32_t *expert_ids,
                    const float *expert_weights, uint16_t *out) {
    return decode(session, layer, num_tokens, hidden, expert_ids, expert_weights, out, false, nullptr);
}

ft_status ft_decode_cuda(ft_session *session, int32_t layer, int32_t num_tokens, const uint16_t *hidden,
                         const int32_t *expert_ids, const float *expert_weights, uint16_t *out, cudaStream_t stream) {
    return decode(session, layer, num_tokens, hidden, expert_ids, expert_weights, out, true, stream);
}

int32_t ft_session_device(const ft_session *session) { return session ? session->impl->device() : FT_DEVICE_NONE; }

ft_status ft_session_status(const ft_session *session) {
    if (!session) return FT_ERR_INVALID_ARGUMENT;
    return session->impl->status();
}

const char *ft_session_backend_reason(const ft_session *session) {
    return session ? session->impl->backend_reason().c_str() : "";
}

ft_status ft_session_get_stats(const ft_session *session, ft_session_stats *stats) {
    if (!session) return FT_ERR_INVALID_ARGUMENT;
    ft_session_stats s{};
    const ft_status st = on_handle(session->last_error, [&] { s = session->impl->stats(); });
    if (st != FT_OK) return st;
    return write_out(stats, s);
}

ft_status ft_session_get_layer_stats(const ft_session *session, int32_t layer, ft_layer_stats *stats) {
    if (!session) return FT_ERR_INVALID_ARGUMENT;
    ft_layer_stats s{};
    const ft_status st = on_handle(session->last_error, [&] { session->impl->layer_stats(layer, s); });
    if (st != FT_OK) return st;
    return write_out(stats, s);
}

void ft_session_reset_stats(ft_session *session) {
    if (session) session->impl->reset_stats();
}

/* ---- bandwidth profile ---- */

void ft_profile_params_init(ft_profile_params *p) {
    if (!p) return;
    std::memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->device = FT_DEVICE_AUTO;
    p->cpu_threads = 0;
    p->formats = 0;
    p->max_seconds = 30.0;
}

ft_status ft_profile_bandwidth(const ft_profile_params *params, ft_profile **out, char *err, size_t err_size) {
    if (out) *out = nullptr;
    return on_buffer(err, err_size, [&] {
        if (!out) ft::fail(FT_ERR_INVALID_ARGUMENT, "out is NULL");
        ft_profile_params p;
        ft_profile_params_init(&p);
        read_params(p, params);
        auto h = std::make_unique<ft_profile>();
        h->impl = ft::measure_profile(p);
        *out = h.release();
    });
}

ft_status ft_profile_load(const char *path, ft_profile **out, char *err, size_t err_size) {
    if (out) *out = nullptr;
    return on_buffer(err, err_size, [&] {
        if (!out) ft::fail(FT_ERR_INVALID_ARGUMENT, "out is NULL");
        auto h = std::make_unique<ft_profile>();
        h->impl = ft::load_profile(path ? std::string(path) : ft::default_profile_path());
        *out = h.release();
    });
}

ft_status ft_profile_save(const ft_profile *profile, const char *path, char *err, size_t err_size) {
    return on_buffer(err, err_size, [&] {
        if (!profile) ft::fail(FT_ERR_INVALID_ARGUMENT, "profile is NULL");
        ft::save_profile(profile->impl, path ? std::string(path) : ft::default_profile_path());
    });
}

void ft_profile_free(ft_profile *profile) { delete profile; }

ft_status ft_profile_get_machine(const ft_profile *profile, ft_profile_machine *machine) {
    if (!profile) return FT_ERR_INVALID_ARGUMENT;
    const ft::Profile &p = profile->impl;
    ft_profile_machine m{};
    m.physical_cores = static_cast<int32_t>(p.physical_cores);
    m.threads_used = static_cast<int32_t>(p.threads_used);
    m.cpu_read_gbs = p.cpu_stream_read_gbs.value_or(0.0);
    m.h2d_gbs = p.pcie_linear_h2d_gbs.value_or(0.0);
    m.d2h_gbs = p.pcie_linear_d2h_gbs.value_or(0.0);
    m.gpu_name = p.gpu_name.c_str();
    m.cpu_model = p.cpu_model.c_str();
    return write_out(machine, m);
}

ft_status ft_profile_get_format(const ft_profile *profile, int32_t format, ft_profile_format *out) {
    if (!profile || !out || out->struct_size < 2 * sizeof(uint32_t) || !ft::format_known(format)) return FT_ERR_INVALID_ARGUMENT;
    const ft::Profile &p = profile->impl;
    const std::string key = ft::profile_format_key(static_cast<ft::Format>(format));
    // The per-format entry, else the first per-model entry (file order), as the reader rules.
    const ft::KernelEntry *e = nullptr;
    if (auto it = p.dtype_kernels.find(key); it != p.dtype_kernels.end()) e = &it->second;
    for (size_t w = 0; !e && w < p.workloads.size(); ++w) {
        if (auto it = p.workloads[w].kernels.find(key); it != p.workloads[w].kernels.end()) e = &it->second;
    }
    if (!e) return FT_ERR_UNSUPPORTED;
    ft_profile_format f{};
    f.format = format;
    f.expert_bytes = e->expert_bytes;
    f.cpu_gbs = e->cpu_moe_gbs.value_or(0.0);
    f.gather_gbs = e->pcie_gather_gbs.value_or(0.0);
    f.cpu_overlap_gbs = e->cpu_moe_overlap_gbs.value_or(0.0);
    f.gather_overlap_gbs = e->pcie_gather_overlap_gbs.value_or(0.0);
    f.fetch_fraction = ft::hybrid_fetch_fraction(p, key).value_or(-1.0);
    f.cpu_kernel = e->cpu_moe_isa.c_str();
    return write_out(out, f);
}

}  // extern "C"
