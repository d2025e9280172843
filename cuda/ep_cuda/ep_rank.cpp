// One rank's EP step: buffers allocated once, then per call the layout,
// pack, exchanges through the Transport, expert rows for the caller's experts, local reduction,
// return exchange and the rank-ordered combine.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ft/common.hpp"
#include "ft/ep_cuda.hpp"

namespace ft::ep::cuda {

namespace {

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

template <typename T>
T *take(uint8_t *&p, size_t bytes) {
    T *out = reinterpret_cast<T *>(p);
    p += align256(bytes);
    return out;
}

}  // namespace

EpRank::EpRank(Transport &transport, const Placement &placement, const EpConfig &config)
    : net_(transport), placement_(placement), config_(config) {
    R_ = placement.num_ranks;
    S_ = placement.slots_per_rank;
    me_ = transport.rank();
    const EpConfig &c = config_;
    if (transport.size() != R_)
        fail(FT_ERR_INVALID_ARGUMENT, "EP: placement for ", R_, " ranks on a group of ", transport.size());
    if (R_ < 1 || R_ > kMaxRanks) fail(FT_ERR_UNSUPPORTED, "EP on the GPU supports 1..", kMaxRanks, " ranks, not ", R_);
    if (c.top_k < 1 || c.top_k > kMaxTopK || c.max_tokens < 1 || c.max_tokens > INT32_MAX / kMaxRanks ||
        c.hidden <= 0 || c.hidden % kWireBlock != 0 || c.chunks < 0 || c.max_expert_rows < 0)
        fail(FT_ERR_INVALID_ARGUMENT, "EP config: top-k ", c.top_k, ", hidden ", c.hidden, ", max tokens ",
             c.max_tokens, ", chunks ", c.chunks);
    if (S_ > INT16_MAX) fail(FT_ERR_UNSUPPORTED, "EP: ", S_, " slots per rank do not fit the record's int16 slot");
    const bool fp8_combine = c.combine_dtype != WireDtype::Bf16;
    if (c.combine_dtype != WireDtype::Bf16 && c.combine_dtype != WireDtype::Fp8Fp32 &&
        c.combine_dtype != WireDtype::Fp8Ue8m0)
        fail(FT_ERR_INVALID_ARGUMENT, "EP config: combine wire ", static_cast<int>(c.combine_dtype));
    if (fp8_combine && c.mode == Mode::Latency)
        fail(FT_ERR_INVALID_ARGUMENT,
             "EP config: an FP8 combine wire needs throughput mode (latency mode never synchronises the host, so the "
             "ranks could not agree to fall back to bf16 when the accuracy gate trips); use a bf16 combine wire");
    if (!(c.combine_max_rel_error > 0.0f) || !std::isfinite(c.combine_max_rel_error))
        fail(FT_ERR_INVALID_ARGUMENT, "EP config: combine_max_rel_error ", c.combine_max_rel_error,
             " (must be > 0 and finite)");
    rec_ = record_layout(c.hidden, c.top_k, c.dispatch_dtype);
    dplace_ = std::make_unique<PlacementBuffer>(placement);

    const size_t T = static_cast<size_t>(c.max_tokens), R = static_cast<size_t>(R_), H = static_cast<size_t>(c.hidden);
    const size_t positions = R * T;
    const int64_t rows = c.max_expert_rows ? c.max_expert_rows : static_cast<int64_t>(positions) * c.top_k;
    peer_bytes_ = latency_peer_bytes(c.hidden, c.top_k, c.dispatch_dtype, c.max_tokens);
    const size_t wire = c.mode == Mode::Latency ? R * peer_bytes_ : positions * rec_.bytes;
    const size_t lb = layout_bytes(R_, S_, c.top_k, c.max_tokens);
    const size_t rb = receive_bytes(R_, S_, c.top_k, c.max_tokens, rows);
    const size_t row_bytes = static_cast<size_t>(rows) * H * 2, part_bytes = positions * H * 2;
    // An FP8 combine wire adds the gate word to each rank's counts, and a buffer for the encoded
    // partials (they land in back_, which is larger: H + H/32 < 2H bytes a row).
    count_stride_ = R_ + (fp8_combine ? 1 : 0);
    const size_t W = static_cast<size_t>(count_stride_);
    combine_row_bytes_ = combine_row_bytes(c.hidden, c.combine_dtype);
    const size_t cwire_bytes = fp8_combine ? positions * combine_row_bytes_ : 0;
    const size_t total = align256(lb) + align256(rb) + 2 * align256(wire) + 2 * align256(row_bytes) +
                         2 * align256(part_bytes) + align256(R * W * 8) + align256(W * 8) + align256(4) +
                         align256(cwire_bytes);
    mem_ = ft::cuda::DeviceBuffer(total, "EP: EP buffers");
    uint8_t *p = mem_.get();
    layout_ = carve_layout(take<uint8_t>(p, lb), R_, S_, c.top_k, c.max_tokens);
    recv_ = carve_receive(take<uint8_t>(p, rb), R_, S_, c.top_k, c.max_tokens, rows);
    send_ = take<uint8_t>(p, wire);
    recvbuf_ = take<uint8_t>(p, wire);
    x_rows_ = take<uint16_t>(p, row_bytes);
    y_rows_ = take<uint16_t>(p, row_bytes);
    partial_ = take<uint16_t>(p, part_bytes);
    back_ = take<uint16_t>(p, part_bytes);
    count_matrix_ = take<int64_t>(p, R * W * 8);
    count_send_ = take<int64_t>(p, W * 8);
    gate_max_ = take<uint32_t>(p, 4);
    if (fp8_combine) cwire_ = take<uint8_t>(p, cwire_bytes);
    // Padding rows of latency-mode regions travel on the wire: defined bytes keep tools quiet.
    check_cuda(cudaMemset(mem_.get(), 0, total), "EP buffer clear");
    pinned_counts_ = ft::cuda::PinnedBuffer(R * W * 8, "EP: EP pinned counts", cudaHostAllocDefault);
    count_pinned_ = pinned_counts_.get<int64_t>();
    count_host_.assign(R * R, 0);
    int lo = 0, hi = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&lo, &hi), "stream priorities");
    check_cuda(cudaStreamCreateWithPriority(&comm_, cudaStreamNonBlocking, hi), "EP comm stream");
    events_.resize(2 * static_cast<size_t>(std::max(c.policy.max_chunks, std::max(c.chunks, 1))) + 2);
    for (cudaEvent_t &e : events_) check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "EP events");
    check_cuda(cudaEventCreateWithFlags(&gate_event_, cudaEventDisableTiming), "EP gate event");
}

EpRank::~EpRank() {
    for (cudaEvent_t e : events_)
        if (e) cudaEventDestroy(e);
    if (gate_event_) cudaEventDestroy(gate_event_);
    if (comm_) cudaStreamDestroy(comm_);
}

void EpRank::set_placement(const Placement &placement) {
    if (placement.num_ranks != R_ || placement.slots_per_rank != S_)
        fail(FT_ERR_INVALID_ARGUMENT, "EP placement: ", placement.num_ranks, " ranks x ", placement.slots_per_rank,
             " slots, the group has ", R_, " x ", S_);
    auto fresh = std::make_unique<PlacementBuffer>(placement);
    dplace_ = std::move(fresh);  // cudaFree in the old buffer's destructor waits for its readers
    placement_ = placement;
}

RecvRegion EpRank::recv_region() const {
    if (config_.mode == Mode::Latency) return {recvbuf_, peer_bytes_, config_.max_tokens};
    return {recvbuf_, 0, config_.max_tokens};
}

ExpertBatch EpRank::batch() const {
    ExpertBatch b;
    b.slots = S_;
    b.hidden = config_.hidden;
    b.max_rows = recv_.max_rows;
    b.offset = recv_.expert_offset;
    b.x = x_rows_;
    b.y = y_rows_;
    b.row_source = recv_.row_source;
    b.row_token = recv_.row_token;
    b.row_weight = recv_.row_weight;
    return b;
}

float EpRank::combine_last_rel_error() const {
    if (!combine_encoded_) return 0.0f;
    check_cuda(cudaEventSynchronize(gate_event_), "EP gate event");
    uint32_t bits = 0;
    check_cuda(cudaMemcpy(&bits, gate_max_, sizeof bits, cudaMemcpyDeviceToHost), "EP gate word");
    float e;
    std::memcpy(&e, &bits, sizeof e);
    return e;
}

bool EpRank::overflowed(cudaStream_t stream) const {
    int32_t flag = 0;
    check_cuda(cudaMemcpyAsync(&flag, recv_.overflow, sizeof flag, cudaMemcpyDeviceToHost, stream), "EP overflow flag");
    check_cuda(cudaStreamSynchronize(stream), "EP overflow flag");
    return flag != 0;
}

// ---- throughput mode -------------------------------------------------------------------------

void EpRank::count_exchange(cudaStream_t stream) {
    const size_t R = static_cast<size_t>(R_), W = static_cast<size_t>(count_stride_);
    const int64_t *send = layout_.count;
    if (W > R) {  // FP8 combine: this rank's gate word (the previous call's error) after its counts
        check_cuda(cudaMemcpyAsync(count_send_, layout_.count, R * 8, cudaMemcpyDeviceToDevice, stream), "EP counts");
        launch_gate_word(gate_max_, config_.combine_max_rel_error, count_send_ + R, stream);
        send = count_send_;
    }
    net_.all_gather(send, count_matrix_, W * sizeof(int64_t), stream);
    check_cuda(cudaMemcpyAsync(count_pinned_, count_matrix_, R * W * 8, cudaMemcpyDeviceToHost, stream), "EP counts");
    // The one host synchronisation of a throughput-mode layer: NCCL's sizes are host arguments.
    check_cuda(cudaStreamSynchronize(stream), "EP count exchange");
    for (size_t s = 0; s < R; ++s) std::memcpy(&count_host_[s * R], count_pinned_ + s * W, R * 8);
    if (W == R) return;
    // Every rank sees every gate word at this same point, so all switch in the same call.
    std::string over;
    for (size_t s = 0; s < R; ++s) {
        const uint64_t word = static_cast<uint64_t>(count_pinned_[s * W + R]);
        if (!(word & 1)) continue;
        const uint32_t bits = static_cast<uint32_t>(word >> 32);
        float e;
        std::memcpy(&e, &bits, sizeof e);
        over += ft::cat(over.empty() ? "" : ", ", "rank ", s, ": ", e);
    }
    if (!over.empty() && !combine_tripped_) {
        combine_tripped_ = true;
        ft::log(FT_LOG_WARN, "EP rank ", me_, ": the FP8 combine accuracy gate tripped (largest row error of the last",
                " call ", over, "; limit ", config_.combine_max_rel_error,
                "); combining in bf16 from this call on, for good");
    }
    // The error word measures one call: cleared before this call's encodings (stream order keeps
    // the gate word above reading the old value).
    if (combine_dtype() != WireDtype::Bf16) check_cuda(cudaMemsetAsync(gate_max_, 0, sizeof(uint32_t), stream), "EP gate clear");
}

// Chunk c of C of every pair, the boundaries of ChunkPlan::begin (sender and receiver agree).
void EpRank::exchange_chunk(bool combine, int32_t c, int32_t C, cudaStream_t stream) {
    const int32_t R = R_;
    auto n = [&](int32_t s, int32_t d) { return count_host_[static_cast<size_t>(s) * R + d]; };
    auto begin = [&](int32_t s, int32_t d, int32_t k) { return n(s, d) * k / C; };
    std::vector<int64_t> send_at(R + 1, 0), recv_at(R + 1, 0);  // my rows per destination / source
    for (int32_t p = 0; p < R; ++p) {
        send_at[p + 1] = send_at[p] + n(me_, p);
        recv_at[p + 1] = recv_at[p] + n(p, me_);
    }
    std::vector<PeerRange> ranges(R);
    // Combine rows: bf16 partials, or their FP8 encoding (the own rows then stay where they are).
    const bool fp8 = combine && combine_dtype() != WireDtype::Bf16;
    const size_t rb = rec_.bytes, pb = fp8 ? combine_row_bytes_ : static_cast<size_t>(config_.hidden) * 2;
    for (int32_t p = 0; p < R; ++p) {
        const int64_t out0 = begin(me_, p, c), out1 = begin(me_, p, c + 1);  // my rows for p
        const int64_t in0 = begin(p, me_, c), in1 = begin(p, me_, c + 1);    // p's rows for me
        PeerRange &r = ranges[p];
        if (!combine) {
            r.send_offset = (send_at[p] + out0) * rb;
            r.send_bytes = (out1 - out0) * rb;
            r.recv_offset = (recv_at[p] + in0) * rb;
            r.recv_bytes = (in1 - in0) * rb;
        } else {  // partials go back the way the records came
            r.send_offset = (recv_at[p] + in0) * pb;
            r.send_bytes = (in1 - in0) * pb;
            r.recv_offset = (send_at[p] + out0) * pb;
            r.recv_bytes = (out1 - out0) * pb;
            if (fp8 && p == me_) r = PeerRange{};  // read in place by the combine kernel
        }
        if (p != me_) last_bytes_sent_ += r.send_bytes;
    }
    if (!combine)
        net_.exchange(send_, recvbuf_, ranges.data(), stream);
    else if (fp8)
        net_.exchange(cwire_, back_, ranges.data(), stream);
    else
        net_.exchange(partial_, back_, ranges.data(), stream);
}

void EpRank::reduce_chunk(int32_t c, int32_t C, cudaStream_t stream) {
    launch_reduce(recv_, recv_region(), config_.hidden, config_.dispatch_dtype, c, C, y_rows_, partial_, stream);
    if (combine_dtype() != WireDtype::Bf16)
        launch_encode_combine(recv_, config_.hidden, config_.combine_dtype, me_, c, C, partial_, cwire_, gate_max_,
                              stream);
}

void EpRank::combine_at_source(uint16_t *out, cudaStream_t stream) {
    if (combine_dtype() == WireDtype::Bf16) {
        launch_combine(layout_, tokens_, back_, 0, config_.hidden, out, stream);
        return;
    }
    launch_combine_wire(layout_, tokens_, reinterpret_cast<const uint8_t *>(back_), config_.combine_dtype, me_,
                        partial_, recv_.prefix + me_, config_.hidden, out, stream);
    check_cuda(cudaEventRecord(gate_event_, stream), "EP gate event");
    combine_encoded_ = true;
}

void EpRank::receive_chunk(int32_t c, int32_t C, cudaStream_t stream) {
    const RecvRegion src = recv_region();
    launch_group(recv_, src, config_.hidden, config_.dispatch_dtype, c, C, stream);
    launch_unpack(recv_, src, config_.hidden, config_.dispatch_dtype, x_rows_, nullptr, stream);
}

// Both modes' start of a dispatch: the token count checked, the call's figures reset, the layout
// and the send records packed (peer_bytes: each peer's fixed region in latency mode, 0 = packed
// back to back for throughput mode's exact sizes).
void EpRank::layout_and_pack(const int32_t *ids, const float *weights, const uint16_t *x, int64_t tokens,
                             size_t peer_bytes, cudaStream_t stream) {
    if (tokens < 0 || tokens > config_.max_tokens)
        fail(FT_ERR_INVALID_ARGUMENT, "EP dispatch: ", tokens, " tokens, the group holds ", config_.max_tokens);
    tokens_ = tokens;
    last_bytes_sent_ = 0;
    last_chunks_ = 1;
    check_cuda(cudaMemsetAsync(recv_.overflow, 0, sizeof(int32_t), stream), "EP overflow clear");
    launch_layout(dplace_->view(), ids, weights, tokens, config_.top_k, me_, nullptr, layout_, stream);
    launch_pack(layout_, static_cast<int64_t>(R_) * config_.max_tokens, x, config_.hidden, config_.dispatch_dtype, me_,
                {send_, peer_bytes}, stream);
}

void EpRank::dispatch(const int32_t *ids, const float *weights, const uint16_t *x, int64_t tokens,
                      cudaStream_t stream) {
    if (config_.mode == Mode::Latency) {
        dispatch_send(ids, weights, x, tokens, stream);
        dispatch_recv(stream);
        return;
    }
    layout_and_pack(ids, weights, x, tokens, 0, stream);
    count_exchange(stream);
    launch_receive_counts(recv_, recv_region(), count_matrix_, me_, stream, count_stride_);
    exchange_chunk(false, 0, 1, stream);
    receive_chunk(0, 1, stream);
}

void EpRank::combine(uint16_t *out, cudaStream_t stream) {
    if (config_.mode == Mode::Latency) {
        combine_send(stream);
        combine_recv(out, stream);
        return;
    }
    reduce_chunk(0, 1, stream);
    exchange_chunk(true, 0, 1, stream);
    combine_at_source(out, stream);
}

void EpRank::forward(const int32_t *ids, const float *weights, const uint16_t *x, int64_t tokens,
                     const ExpertFn &expert, uint16_t *out, cudaStream_t stream) {
    if (config_.mode == Mode::Latency) {
        dispatch(ids, weights, x, tokens, stream);
        expert(batch(), stream);
        combine(out, stream);
        return;
    }
    layout_and_pack(ids, weights, x, tokens, 0, stream);
    count_exchange(stream);
    launch_receive_counts(recv_, recv_region(), count_matrix_, me_, stream, count_stride_);

    int32_t C = config_.chunks;
    if (C == 0) C = plan_chunks(count_host_, R_, rec_.bytes, config_.link_bytes_per_s, config_.policy).chunks;
    C = std::clamp(C, 1, static_cast<int32_t>(events_.size() / 2 - 1));
    last_chunks_ = C;
    cudaEvent_t *dispatched = events_.data(), *reduced = events_.data() + C, start = events_[2 * C],
                end = events_[2 * C + 1];

    // The comm stream runs d0 d1 c0 d2 c1 ... : dispatch of chunk i+1 overlaps the experts of
    // chunk i, and each combine chunk leaves as soon as its partials exist.
    const ExpertBatch b = batch();
    auto compute = [&](int32_t i) {
        check_cuda(cudaStreamWaitEvent(stream, dispatched[i], 0), "EP chunk wait");
        receive_chunk(i, C, stream);
        expert(b, stream);
        reduce_chunk(i, C, stream);
        check_cuda(cudaEventRecord(reduced[i], stream), "EP chunk event");
    };
    auto send_back = [&](int32_t i) {
        check_cuda(cudaStreamWaitEvent(comm_, reduced[i], 0), "EP chunk wait");
        exchange_chunk(true, i, C, comm_);
    };
    check_cuda(cudaEventRecord(start, stream), "EP start event");
    check_cuda(cudaStreamWaitEvent(comm_, start, 0), "EP start wait");
    exchange_chunk(false, 0, C, comm_);
    check_cuda(cudaEventRecord(dispatched[0], comm_), "EP chunk event");
    compute(0);
    for (int32_t i = 1; i < C; ++i) {
        exchange_chunk(false, i, C, comm_);
        check_cuda(cudaEventRecord(dispatched[i], comm_), "EP chunk event");
        send_back(i - 1);
        compute(i);
    }
    send_back(C - 1);
    check_cuda(cudaEventRecord(end, comm_), "EP end event");
    check_cuda(cudaStreamWaitEvent(stream, end, 0), "EP end wait");
    combine_at_source(out, stream);
}

// ---- latency mode ----------------------------------------------------------------------------

void EpRank::dispatch_send(const int32_t *ids, const float *weights, const uint16_t *x, int64_t tokens,
                           cudaStream_t stream) {
    if (config_.mode != Mode::Latency) fail(FT_ERR_STATE, "EP: dispatch_send is a latency-mode phase");
    layout_and_pack(ids, weights, x, tokens, peer_bytes_, stream);
    // Fixed sizes: every peer gets its whole region, the header says how many rows are real.
    std::vector<PeerRange> ranges(R_);
    for (int32_t p = 0; p < R_; ++p) {
        ranges[p] = {p * peer_bytes_, peer_bytes_, p * peer_bytes_, peer_bytes_};
        if (p != me_) last_bytes_sent_ += peer_bytes_;
    }
    net_.exchange(send_, recvbuf_, ranges.data(), stream);
}

void EpRank::dispatch_recv(cudaStream_t stream) {
    if (config_.mode != Mode::Latency) fail(FT_ERR_STATE, "EP: dispatch_recv is a latency-mode phase");
    launch_receive_counts(recv_, recv_region(), nullptr, me_, stream);
    receive_chunk(0, 1, stream);
}

void EpRank::combine_send(cudaStream_t stream) {
    if (config_.mode != Mode::Latency) fail(FT_ERR_STATE, "EP: combine_send is a latency-mode phase");
    launch_reduce(recv_, recv_region(), config_.hidden, config_.dispatch_dtype, 0, 1, y_rows_, partial_, stream);
    const size_t region = static_cast<size_t>(config_.max_tokens) * config_.hidden * 2;
    std::vector<PeerRange> ranges(R_);
    for (int32_t p = 0; p < R_; ++p) {
        ranges[p] = {p * region, region, p * region, region};
        if (p != me_) last_bytes_sent_ += region;
    }
    net_.exchange(partial_, back_, ranges.data(), stream);
}

void EpRank::combine_recv(uint16_t *out, cudaStream_t stream) {
    if (config_.mode != Mode::Latency) fail(FT_ERR_STATE, "EP: combine_recv is a latency-mode phase");
    launch_combine(layout_, tokens_, back_, config_.max_tokens, config_.hidden, out, stream);
}

}  // namespace ft::ep::cuda
