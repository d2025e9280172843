// C shims of freetoken_ep.h over ft::ep::cuda (EpRank + NcclTransport). Each checks its
// arguments, runs the C++ core inside a catch-all and stores the message on the group (or in the
// caller's buffer before a group exists). Without the GPU side (FT_EP_HAVE_CUDA, set by the
// ft_ep_cuda target) every entry point reports FT_ERR_UNSUPPORTED.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "freetoken.h"
#include "freetoken_ep.h"
#include "ft/common.hpp"
#include "shim.hpp"

#if defined(FT_EP_HAVE_CUDA)
#include <cuda_runtime.h>

#include "freetoken_cuda.h"
#include "ft/cuda_device.hpp"
#include "ft/ep.hpp"
#include "ft/ep_cuda.hpp"
#include "ft/ep_probe.hpp"
#include "ft/ep_session.hpp"
#include "handles.hpp"
#include "ft/backend_registry.hpp"
#endif

namespace {

using ft::api::guarded;
using ft::api::write_error;

#if defined(FT_EP_HAVE_CUDA)
ft_ep_params read_params(const ft_ep_params *in) {
    ft_ep_params p;
    ft_ep_params_init(&p);
    if (!in) ft::fail(FT_ERR_INVALID_ARGUMENT, "EP: params is NULL");
    if (in->struct_size < sizeof(uint32_t)) ft::fail(FT_ERR_INVALID_ARGUMENT, "EP: params.struct_size is ", in->struct_size);
    std::memcpy(&p, in, std::min<size_t>(in->struct_size, sizeof p));
    p.struct_size = sizeof p;
    return p;
}
#endif

}  // namespace

#if defined(FT_EP_HAVE_CUDA)

struct ft_ep_group {
    std::unique_ptr<ft::ep::cuda::NcclTransport> net;
    std::unique_ptr<ft::ep::cuda::EpRank> rank;
    std::unique_ptr<ft::ep::cuda::SessionExperts> session_experts;  // made by the first session call
    int32_t device = 0;
    ft::ep::cuda::RankTopology topology;  // probed at creation
    double link_bytes_per_s = 0;          // what the chunk plan uses
    std::string last_error;
};

namespace {

// A device that is not a usable GPU is FT_ERR_NO_DEVICE, found before NCCL is loaded or called.
void require_device(int32_t device) {
    const int n = ft::cuda::device_count();
    if (device < 0 || device >= n)
        ft::fail(FT_ERR_NO_DEVICE, "EP: device ", device, " is not a usable CUDA device (", n, " usable)");
}

template <typename Fn>
ft_status on_group(ft_ep_group *g, Fn &&fn) noexcept {
    if (!g) return FT_ERR_INVALID_ARGUMENT;
    g->last_error.clear();
    return guarded(
        [&](const std::string &m) noexcept {
            try {
                g->last_error = m;
            } catch (...) {
            }
        },
        [&] {
            ft::ep::cuda::check_cuda(cudaSetDevice(g->device), "cudaSetDevice");
            fn();
        });
}

template <typename Fn>
ft_status before_group(char *err, size_t err_size, Fn &&fn) noexcept {
    write_error(err, err_size, "");
    return guarded([&](const std::string &m) noexcept { write_error(err, err_size, m); }, fn);
}

// An FT_EP_WIRE_* value as the wire dtype; `what` names the parameter in the error.
ft::ep::WireDtype wire_dtype_of(int32_t wire, const char *what) {
    switch (wire) {
        case FT_EP_WIRE_BF16: return ft::ep::WireDtype::Bf16;
        case FT_EP_WIRE_FP8: return ft::ep::WireDtype::Fp8Fp32;
        case FT_EP_WIRE_FP8_UE8M0: return ft::ep::WireDtype::Fp8Ue8m0;
        default: ft::fail(FT_ERR_INVALID_ARGUMENT, "EP: ", what, " ", wire);
    }
}

ft::ep::cuda::EpConfig config_of(const ft_ep_params &p) {
    using ft::ep::WireDtype;
    ft::ep::cuda::EpConfig c;
    c.top_k = p.top_k;
    c.hidden = p.hidden;
    c.max_tokens = p.max_tokens;
    if (p.mode != FT_EP_MODE_THROUGHPUT && p.mode != FT_EP_MODE_LATENCY)
        ft::fail(FT_ERR_INVALID_ARGUMENT, "EP: mode ", p.mode);
    c.mode = p.mode == FT_EP_MODE_LATENCY ? ft::ep::cuda::Mode::Latency : ft::ep::cuda::Mode::Throughput;
    c.dispatch_dtype = wire_dtype_of(p.wire, "wire format");
    if (p.chunks < 0 || p.chunks > c.policy.max_chunks)
        ft::fail(FT_ERR_INVALID_ARGUMENT, "EP: chunks ", p.chunks, " (0..", c.policy.max_chunks, ")");
    c.chunks = p.chunks;
    if (p.link_bytes_per_s < 0) ft::fail(FT_ERR_INVALID_ARGUMENT, "EP: link bandwidth ", p.link_bytes_per_s);
    if (p.link_bytes_per_s > 0) c.link_bytes_per_s = p.link_bytes_per_s;
    c.max_expert_rows = p.max_expert_rows;
    c.combine_dtype = wire_dtype_of(p.combine_wire, "combine wire format");
    if (c.combine_dtype != WireDtype::Bf16 && c.mode == ft::ep::cuda::Mode::Latency)
        ft::fail(FT_ERR_INVALID_ARGUMENT,
                 "EP: an FP8 combine_wire needs FT_EP_MODE_THROUGHPUT (latency mode never synchronises the host, so "
                 "the ranks could not agree to fall back to bf16 when the accuracy gate trips)");
    if (!(p.combine_max_rel_error > 0.0f) || !std::isfinite(p.combine_max_rel_error))
        ft::fail(FT_ERR_INVALID_ARGUMENT, "EP: combine_max_rel_error ", p.combine_max_rel_error,
                 " (must be > 0 and finite)");
    c.combine_max_rel_error = p.combine_max_rel_error;
    return c;
}

ft::ep::Placement initial_placement(const ft_ep_params &p, int32_t ranks) {
    if (p.num_experts < 1) ft::fail(FT_ERR_INVALID_ARGUMENT, "EP: ", p.num_experts, " experts");
    int32_t S = p.slots_per_rank;
    if (S == 0) {
        if (p.num_experts % ranks != 0)
            ft::fail(FT_ERR_INVALID_ARGUMENT, "EP: ", p.num_experts, " experts do not split evenly over ", ranks,
                     " ranks; set slots_per_rank");
        S = p.num_experts / ranks;
    }
    if (S < 1 || static_cast<int64_t>(S) * ranks < p.num_experts || S > p.num_experts)
        ft::fail(FT_ERR_INVALID_ARGUMENT, "EP: ", S, " slots per rank for ", p.num_experts, " experts on ", ranks,
                 " ranks");
    std::vector<int32_t> phy2log(static_cast<size_t>(S) * ranks);
    for (size_t i = 0; i < phy2log.size(); ++i) phy2log[i] = static_cast<int32_t>(i % p.num_experts);
    return ft::ep::make_placement(p.num_experts, ranks, std::move(phy2log));
}

// Bytes each rank sends in the creation-time calibration exchange (split over its peers): enough
// to reach the link's plateau, short enough (a few ms on PCIe) to run at every creation.
constexpr size_t kCalibrationBytes = size_t(64) << 20;

// Collective over the group's ranks (the bus-id all-gather and the calibration exchange).
ft::ep::cuda::RankTopology probe(ft::ep::cuda::NcclTransport &net, int32_t device, const ft_ep_params &p) {
    config_of(p);  // bad params fail on every rank before the collective, not in it
    ft::ep::cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice");
    // The caller's bandwidth wins; only measure when the chunk plan needs it.
    const size_t bytes = p.link_bytes_per_s > 0 || p.chunks > 0 ? 0 : kCalibrationBytes;
    return ft::ep::cuda::probe_topology(net, device, bytes);
}

std::unique_ptr<ft_ep_group> make_group(std::unique_ptr<ft::ep::cuda::NcclTransport> net, int32_t device,
                                        const ft_ep_params &p, ft::ep::cuda::RankTopology topology) {
    auto g = std::make_unique<ft_ep_group>();
    g->device = device;
    ft::ep::cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice");
    ft::ep::cuda::EpConfig cfg = config_of(p);
    if (p.link_bytes_per_s <= 0 && topology.calibrated_bytes_per_s > 0)
        cfg.link_bytes_per_s = topology.calibrated_bytes_per_s;
    g->link_bytes_per_s = cfg.link_bytes_per_s;
    ft::log(FT_LOG_INFO, ft::ep::cuda::describe(topology, net->rank()), "; chunk plan at ", cfg.link_bytes_per_s / 1e9,
            " GB/s per peer");
    g->rank = std::make_unique<ft::ep::cuda::EpRank>(*net, initial_placement(p, net->size()), cfg);
    g->topology = std::move(topology);
    g->net = std::move(net);
    return g;
}

void to_c(const ft::ep::cuda::ExpertBatch &b, ft_ep_expert_batch *out) {
    ft_ep_expert_batch c{};
    c.struct_size = sizeof c;
    c.slots = b.slots;
    c.hidden = b.hidden;
    c.max_rows = b.max_rows;
    c.offset = b.offset;
    c.x = b.x;
    c.y = b.y;
    c.row_source = b.row_source;
    c.row_token = b.row_token;
    c.row_weight = b.row_weight;
    const uint32_t n = std::min<uint32_t>(out->struct_size, sizeof c);
    c.struct_size = n;
    std::memcpy(out, &c, n);
}

}  // namespace

extern "C" {

FT_API ft_status ft_ep_group_create_from_comm(void *nccl_comm, int32_t device, const ft_ep_params *params,
                                              ft_ep_group **out, char *err, size_t err_size) {
    if (!out) return FT_ERR_INVALID_ARGUMENT;
    *out = nullptr;
    return before_group(err, err_size, [&] {
        const ft_ep_params p = read_params(params);
        require_device(device);
        ft::ep::cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice");
        auto net = std::make_unique<ft::ep::cuda::NcclTransport>(nccl_comm, false);
        ft::ep::cuda::RankTopology topo = probe(*net, device, p);
        *out = make_group(std::move(net), device, p, std::move(topo)).release();
    });
}

FT_API ft_status ft_ep_group_bootstrap(int32_t nranks, int32_t rank, int32_t device, ft_ep_broadcast_fn broadcast,
                                       void *user_data, const ft_ep_params *params, ft_ep_group **out, char *err,
                                       size_t err_size) {
    if (!out) return FT_ERR_INVALID_ARGUMENT;
    *out = nullptr;
    return before_group(err, err_size, [&] {
        const ft_ep_params p = read_params(params);
        require_device(device);
        std::string why;
        if (!ft::ep::cuda::NcclTransport::available(&why)) ft::fail(FT_ERR_UNSUPPORTED, "EP bootstrap: ", why);
        ft::ep::cuda::NcclTransport::UniqueId id{};
        if (broadcast) {
            if (rank == 0) id = ft::ep::cuda::NcclTransport::unique_id();
            if (broadcast(id.data(), id.size(), user_data) != 0)
                ft::fail(FT_ERR_INVALID_ARGUMENT, "EP bootstrap: the broadcast callback failed");
        } else {
            if (ft::env_string("NCCL_COMM_ID").empty())
                ft::fail(FT_ERR_INVALID_ARGUMENT, "EP bootstrap: no broadcast callback and NCCL_COMM_ID is not set");
            id = ft::ep::cuda::NcclTransport::unique_id();
        }
        auto net = ft::ep::cuda::NcclTransport::init_rank(nranks, id, rank, device, p.nccl_max_ctas);
        ft::ep::cuda::RankTopology topo = probe(*net, device, p);
        *out = make_group(std::move(net), device, p, std::move(topo)).release();
    });
}

FT_API ft_status ft_ep_group_bootstrap_local(int32_t ndevices, const int32_t *devices, const ft_ep_params *params,
                                             ft_ep_group **groups, char *err, size_t err_size) {
    if (!groups || !devices || ndevices < 1) return FT_ERR_INVALID_ARGUMENT;
    for (int32_t i = 0; i < ndevices; ++i) groups[i] = nullptr;
    return before_group(err, err_size, [&] {
        const ft_ep_params p = read_params(params);
        for (int32_t i = 0; i < ndevices; ++i) require_device(devices[i]);
        auto nets =
            ft::ep::cuda::NcclTransport::init_all(std::vector<int32_t>(devices, devices + ndevices), p.nccl_max_ctas);
        // The probe is collective: one host thread per rank, as for any call on these groups.
        std::vector<ft::ep::cuda::RankTopology> topo(ndevices);
        std::vector<std::string> errors(ndevices);
        std::vector<ft_status> codes(ndevices, FT_OK);
        std::vector<std::thread> threads;
        for (int32_t i = 0; i < ndevices; ++i)
            threads.emplace_back([&, i] {
                codes[i] = guarded([&](const std::string &m) { errors[i] = m; },
                                   [&] { topo[i] = probe(*nets[i], devices[i], p); });
            });
        for (std::thread &t : threads) t.join();
        for (int32_t i = 0; i < ndevices; ++i)
            if (codes[i] != FT_OK) ft::fail(codes[i], "EP topology probe of device ", devices[i], ": ", errors[i]);
        std::vector<std::unique_ptr<ft_ep_group>> made;
        for (int32_t i = 0; i < ndevices; ++i)
            made.push_back(make_group(std::move(nets[i]), devices[i], p, std::move(topo[i])));
        for (int32_t i = 0; i < ndevices; ++i) groups[i] = made[i].release();
    });
}

FT_API ft_status ft_ep_group_info_get(const ft_ep_group *group, ft_ep_group_info *info) {
    if (!group || !info || info->struct_size < sizeof(uint32_t)) return FT_ERR_INVALID_ARGUMENT;
    ft_ep_group_info c{};
    c.struct_size = sizeof c;
    c.rank = group->net->rank();
    c.ranks = group->net->size();
    c.slots_per_rank = group->rank->placement().slots_per_rank;
    c.device = group->device;
    c.nccl_version = ft::ep::cuda::NcclTransport::library_version();
    c.last_chunks = group->rank->last_chunks();
    c.last_bytes_sent = group->rank->last_bytes_sent();
    const ft::ep::cuda::RankTopology &t = group->topology;
    std::strncpy(c.pci_bus_id, t.bus_id.c_str(), sizeof c.pci_bus_id - 1);
    c.numa_node = t.link.numa_node;
    c.pcie_link_width = t.link.width;
    c.pcie_link_gts = t.link.speed_gts;
    c.link_bytes_per_s = group->link_bytes_per_s;
    c.calibrated_bytes_per_s = t.calibrated_bytes_per_s;
    c.p2p_known = t.p2p_known;
    c.p2p_mask = t.p2p_mask;
    switch (group->rank->combine_dtype()) {
        case ft::ep::WireDtype::Bf16: c.combine_wire = FT_EP_WIRE_BF16; break;
        case ft::ep::WireDtype::Fp8Fp32: c.combine_wire = FT_EP_WIRE_FP8; break;
        case ft::ep::WireDtype::Fp8Ue8m0: c.combine_wire = FT_EP_WIRE_FP8_UE8M0; break;
    }
    // Reading the device word can fail only with a broken context; report 0 then, as documented
    // for "none yet", rather than failing a query that has no error channel for it.
    if (info->struct_size > offsetof(ft_ep_group_info, combine_last_rel_error)) {
        try {
            ft::ep::cuda::check_cuda(cudaSetDevice(group->device), "cudaSetDevice");
            c.combine_last_rel_error = group->rank->combine_last_rel_error();
        } catch (...) {
            c.combine_last_rel_error = 0.0f;
        }
    }
    const uint32_t n = std::min<uint32_t>(info->struct_size, sizeof c);
    c.struct_size = n;
    std::memcpy(info, &c, n);
    return FT_OK;
}

FT_API ft_status ft_ep_group_set_placement(ft_ep_group *group, const int32_t *phy2log, size_t count) {
    return on_group(group, [&] {
        const ft::ep::Placement &cur = group->rank->placement();
        const size_t want = static_cast<size_t>(cur.num_ranks) * cur.slots_per_rank;
        if (!phy2log || count != want)
            ft::fail(FT_ERR_INVALID_ARGUMENT, "EP placement: ", count, " entries, the group has ", want, " slots");
        group->rank->set_placement(
            ft::ep::make_placement(cur.num_experts, cur.num_ranks, std::vector<int32_t>(phy2log, phy2log + count)));
    });
}

FT_API ft_status ft_ep_group_get_placement(const ft_ep_group *group, int32_t *phy2log, size_t capacity, size_t *count) {
    if (!group || (capacity && !phy2log)) return FT_ERR_INVALID_ARGUMENT;
    const std::vector<int32_t> &m = group->rank->placement().phy2log;
    std::copy_n(m.begin(), std::min(capacity, m.size()), phy2log);
    if (count) *count = m.size();
    return FT_OK;
}

FT_API ft_status ft_ep_dispatch(ft_ep_group *group, const int32_t *topk_ids, const float *topk_weights,
                                const uint16_t *x, int64_t tokens, void *stream, ft_ep_expert_batch *batch) {
    return on_group(group, [&] {
        if (tokens > 0 && (!topk_ids || !x)) ft::fail(FT_ERR_INVALID_ARGUMENT, "EP dispatch: NULL ids or x");
        if (batch && batch->struct_size < sizeof(uint32_t)) ft::fail(FT_ERR_INVALID_ARGUMENT, "EP dispatch: batch.struct_size");
        group->rank->dispatch(topk_ids, topk_weights, x, tokens, static_cast<cudaStream_t>(stream));
        if (batch) to_c(group->rank->batch(), batch);
    });
}

FT_API ft_status ft_ep_combine(ft_ep_group *group, uint16_t *out, void *stream) {
    return on_group(group, [&] {
        if (!out) ft::fail(FT_ERR_INVALID_ARGUMENT, "EP combine: NULL out");
        group->rank->combine(out, static_cast<cudaStream_t>(stream));
    });
}

FT_API ft_status ft_ep_forward(ft_ep_group *group, const int32_t *topk_ids, const float *topk_weights,
                               const uint16_t *x, int64_t tokens, ft_ep_expert_fn expert, void *user_data,
                               uint16_t *out, void *stream) {
    return on_group(group, [&] {
        if (!expert || !out || (tokens > 0 && (!topk_ids || !x)))
            ft::fail(FT_ERR_INVALID_ARGUMENT, "EP forward: NULL ids, x, expert or out");
        group->rank->forward(
            topk_ids, topk_weights, x, tokens,
            [&](const ft::ep::cuda::ExpertBatch &b, cudaStream_t st) {
                ft_ep_expert_batch c{};
                c.struct_size = sizeof c;
                to_c(b, &c);
                expert(&c, st, user_data);
            },
            out, static_cast<cudaStream_t>(stream));
    });
}

FT_API ft_status ft_ep_forward_session(ft_ep_group *group, ft_session *session, const ft_model *model,
                                       int32_t session_max_tokens, int32_t layer, const int32_t *topk_ids,
                                       const float *topk_weights, const uint16_t *x, int64_t tokens,
                                       uint16_t *out, void *stream) {
    return on_group(group, [&] {
        if (!session || !model || !out || (tokens > 0 && (!topk_ids || !x)))
            ft::fail(FT_ERR_INVALID_ARGUMENT, "EP forward (session): NULL session, model, ids, x or out");
        // Everything the session could refuse is checked here, before the collective starts:
        // a failure inside the step would leave the peers waiting. The session is used through
        // its C++ object (the handles of handles.hpp), as the other shims do.
        ft::Session &sess = *session->impl;
        const ft::ModelSpec &spec = model->impl->model().spec();
        const ft::ep::cuda::EpConfig &cfg = group->rank->config();
        const int32_t S = group->rank->placement().slots_per_rank;
        if (spec.num_experts != S)
            ft::fail(FT_ERR_INVALID_ARGUMENT, "EP forward (session): the session's model has ", spec.num_experts,
                     " experts per layer, the group has ", S, " slots per rank (expert j = local slot j)");
        if (spec.hidden != cfg.hidden)
            ft::fail(FT_ERR_INVALID_ARGUMENT, "EP forward (session): model hidden size ", spec.hidden,
                     ", group hidden ", cfg.hidden);
        if (layer < 0 || layer >= spec.num_layers)
            ft::fail(FT_ERR_INVALID_ARGUMENT, "EP forward (session): layer ", layer, " of ", spec.num_layers);
        if (session_max_tokens < 1)
            ft::fail(FT_ERR_INVALID_ARGUMENT, "EP forward (session): session_max_tokens ", session_max_tokens,
                     " (pass the session's max_tokens)");
        const int32_t backend = sess.backend();
        const ft::BackendInfo *info = ft::find_backend(backend);
        if (!info || !info->device_path)
            ft::fail(FT_ERR_UNSUPPORTED, "EP forward (session): the session's backend ", backend,
                     " has no device path (GPU, OFFLOAD or HYBRID)");
        if (sess.device() != group->device)
            ft::fail(FT_ERR_INVALID_ARGUMENT, "EP forward (session): the session runs on device ", sess.device(),
                     ", the group on ", group->device);
        if (const ft_status st = sess.status(); st != FT_OK)
            ft::fail(st, "EP forward (session): the session cannot run: ", session->last_error);
        auto &se = group->session_experts;
        if (!se || se->model_top_k() != spec.top_k || se->rows_per_call() != session_max_tokens)
            se = std::make_unique<ft::ep::cuda::SessionExperts>(spec.top_k, session_max_tokens);
        const bool exact = cfg.mode == ft::ep::cuda::Mode::Throughput;
        // What ft_decode_cuda does, without going back out through the C API; a refusal is also
        // left on the session, as ft_decode_cuda would leave it.
        const ft::ep::cuda::SessionDecodeFn decode = [&](int32_t rows, const uint16_t *xr, const int32_t *ids,
                                                         const float *w, uint16_t *yr, cudaStream_t st) {
            ft::DecodeCall c;
            c.layer = layer;
            c.num_tokens = rows;
            c.hidden = xr;
            c.ids = ids;
            c.weights = w;
            c.out = yr;
            c.on_device = true;
            c.stream = st;
            c.shared = ft::SharedPart::skip;  // added once per token below, not per expert row
            std::string why;
            const ft_status s = guarded([&why](const std::string &m) { why = m; }, [&] { sess.decode(c); });
            if (s != FT_OK) {
                session->last_error = why;
                ft::fail(s, "EP forward (session): ft_decode_cuda of ", rows, " rows: ", why);
            }
        };
        group->rank->forward(
            topk_ids, topk_weights, x, tokens,
            [&](const ft::ep::cuda::ExpertBatch &b, cudaStream_t st) { se->run(b, exact, decode, st); }, out,
            static_cast<cudaStream_t>(stream));
        // The shared expert(s) of this rank's own tokens, on the combined output, as a session
        // without EP adds them: out = bf16(out + shared(x)), at most the session's max_tokens a call.
        if (sess.shared_experts()) {
            const int64_t H = spec.hidden, step = sess.max_tokens();
            for (int64_t t0 = 0; t0 < tokens; t0 += step) {
                ft::DecodeCall c;
                c.layer = layer;
                c.num_tokens = static_cast<int32_t>(std::min(step, tokens - t0));
                c.hidden = x + t0 * H;
                c.out = out + t0 * H;
                c.on_device = true;
                c.stream = stream;
                c.shared = ft::SharedPart::only;
                std::string why;
                const ft_status s = guarded([&why](const std::string &m) { why = m; }, [&] { sess.decode(c); });
                if (s != FT_OK) {
                    session->last_error = why;
                    ft::fail(s, "EP forward (session): the shared expert of ", c.num_tokens, " tokens: ", why);
                }
            }
        }
    });
}

FT_API const char *ft_ep_group_last_error(const ft_ep_group *group) {
    return group ? group->last_error.c_str() : "";
}

FT_API void ft_ep_group_free(ft_ep_group *group) {
    if (!group) return;
    cudaSetDevice(group->device);
    delete group;
}

}  // extern "C"

#else  // no GPU side in this build

struct ft_ep_group {
    int unused = 0;
};

namespace {
constexpr const char *kNoCuda = "expert parallelism needs a CUDA build of FreeToken";
}

extern "C" {

FT_API ft_status ft_ep_group_create_from_comm(void *, int32_t, const ft_ep_params *, ft_ep_group **out, char *err,
                                              size_t err_size) {
    if (out) *out = nullptr;
    write_error(err, err_size, kNoCuda);
    return FT_ERR_UNSUPPORTED;
}
FT_API ft_status ft_ep_group_bootstrap(int32_t, int32_t, int32_t, ft_ep_broadcast_fn, void *, const ft_ep_params *,
                                       ft_ep_group **out, char *err, size_t err_size) {
    if (out) *out = nullptr;
    write_error(err, err_size, kNoCuda);
    return FT_ERR_UNSUPPORTED;
}
FT_API ft_status ft_ep_group_bootstrap_local(int32_t ndevices, const int32_t *, const ft_ep_params *,
                                             ft_ep_group **groups, char *err, size_t err_size) {
    for (int32_t i = 0; groups && i < ndevices; ++i) groups[i] = nullptr;
    write_error(err, err_size, kNoCuda);
    return FT_ERR_UNSUPPORTED;
}
FT_API ft_status ft_ep_group_info_get(const ft_ep_group *, ft_ep_group_info *) { return FT_ERR_UNSUPPORTED; }
FT_API ft_status ft_ep_group_set_placement(ft_ep_group *, const int32_t *, size_t) { return FT_ERR_UNSUPPORTED; }
FT_API ft_status ft_ep_group_get_placement(const ft_ep_group *, int32_t *, size_t, size_t *) { return FT_ERR_UNSUPPORTED; }
FT_API ft_status ft_ep_dispatch(ft_ep_group *, const int32_t *, const float *, const uint16_t *, int64_t, void *,
                                ft_ep_expert_batch *) {
    return FT_ERR_UNSUPPORTED;
}
FT_API ft_status ft_ep_combine(ft_ep_group *, uint16_t *, void *) { return FT_ERR_UNSUPPORTED; }
FT_API ft_status ft_ep_forward(ft_ep_group *, const int32_t *, const float *, const uint16_t *, int64_t,
                               ft_ep_expert_fn, void *, uint16_t *, void *) {
    return FT_ERR_UNSUPPORTED;
}
FT_API ft_status ft_ep_forward_session(ft_ep_group *, ft_session *, const ft_model *, int32_t, int32_t,
                                       const int32_t *, const float *, const uint16_t *, int64_t, uint16_t *,
                                       void *) {
    return FT_ERR_UNSUPPORTED;
}
FT_API const char *ft_ep_group_last_error(const ft_ep_group *) { return kNoCuda; }
FT_API void ft_ep_group_free(ft_ep_group *) {}

}  // extern "C"

#endif

extern "C" FT_API void ft_ep_params_init(ft_ep_params *params) {
    if (!params) return;
    std::memset(params, 0, sizeof *params);
    params->struct_size = sizeof *params;
    params->top_k = 8;
    params->mode = FT_EP_MODE_THROUGHPUT;
    params->wire = FT_EP_WIRE_FP8;
    params->combine_wire = FT_EP_WIRE_BF16;
    params->combine_max_rel_error = 0.05f;  // ft::ep::kCombineDefaultMaxRelError (above e4m3 round-off)
}
