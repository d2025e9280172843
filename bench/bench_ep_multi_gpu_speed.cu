// The speed tables of bench_ep_multi_gpu: the transport floor and EP dispatch + combine against
// NCCL baselines.
#include "bench_ep_multi_gpu.cuh"

namespace ep_multi_bench {

// What one exchange of `bytes` per peer costs inside a replayed graph (10 back to back), as NCCL
// grouped send/recv (what EP uses) and as an NCCL all-gather: the transport's floor under a
// decode step, which needs two exchanges.
void bench_transport(std::vector<std::unique_ptr<epc::NcclTransport>> &nets, size_t bytes) {
    const int R = static_cast<int>(nets.size());
    constexpr int kRepeats = 10;
    std::vector<DeviceArray<uint8_t>> send(R), recv(R);
    on_ranks(R, [&](int r) {
        send[r] = DeviceArray<uint8_t>(bytes * R);
        recv[r] = DeviceArray<uint8_t>(bytes * R);
    });
    std::vector<epc::PeerRange> ranges(R);
    for (int q = 0; q < R; ++q) ranges[q] = {q * bytes, bytes, q * bytes, bytes};
    const double sendrecv = time_graphs(R, 20, [&](int r, cudaStream_t st) {
        for (int i = 0; i < kRepeats; ++i) nets[r]->exchange(send[r].ptr, recv[r].ptr, ranges.data(), st);
    });
    const double gather = time_graphs(R, 20, [&](int r, cudaStream_t st) {
        for (int i = 0; i < kRepeats; ++i) nets[r]->all_gather(send[r].ptr, recv[r].ptr, bytes, st);
    });
    std::printf("one exchange of %zu bytes per peer in a graph: NCCL send/recv %.1f us, NCCL all-gather %.1f us\n", bytes,
                sendrecv * 1e3 / kRepeats, gather * 1e3 / kRepeats);
    on_ranks(R, [&](int r) {
        send[r] = DeviceArray<uint8_t>();
        recv[r] = DeviceArray<uint8_t>();
    });
}

void bench_shape(std::vector<std::unique_ptr<epc::NcclTransport>> &nets, const Shape &shape, int64_t T) {
    const int R = static_cast<int>(nets.size());
    const int32_t K = kTopK, E = shape.E;
    const int64_t H = shape.H;
    const Placement p = contiguous_placement(E, R);
    TraceSpec spec;
    spec.experts = E;
    spec.top_k = K;
    spec.tokens = T * R;
    spec.seed = 7;
    const std::vector<int32_t> trace = routing_trace(spec);

    // The layout's prediction, per rank.
    std::vector<DispatchLayout> L;
    for (int r = 0; r < R; ++r) L.push_back(dispatch_layout(p, trace.data() + r * T * K, nullptr, T, K, r));
    const size_t rb = record_bytes(H, K, WireDtype::Fp8Fp32);
    std::vector<std::vector<int64_t>> routes(R, std::vector<int64_t>(R, 0));  // routes s -> d
    int64_t max_rows = 1;
    for (int d = 0; d < R; ++d) {
        int64_t rows = 0;
        for (int s = 0; s < R; ++s) rows += std::accumulate(L[s].expert_count.begin() + d * p.slots_per_rank,
                                                            L[s].expert_count.begin() + (d + 1) * p.slots_per_rank, int64_t(0));
        max_rows = std::max(max_rows, rows);
    }
    for (int s = 0; s < R; ++s)
        for (int64_t i = 0; i < T * K; ++i) {
            const int32_t phy = L[s].route_phy[i];
            if (phy >= 0) ++routes[s][p.rank_of(phy)];
        }
    double pred_bytes = 0, remote_rows = 0, remote_routes = 0;
    for (int s = 0; s < R; ++s)
        for (int d = 0; d < R; ++d)
            if (d != s) {
                pred_bytes += L[s].count[d] * rb + L[d].count[s] * H * 2.0;
                remote_rows += L[s].count[d];
                remote_routes += routes[s][d];
            }
    pred_bytes /= R;

    std::vector<std::vector<float>> weights(R);
    std::vector<RankData> dev(R);
    std::vector<std::unique_ptr<epc::EpRank>> ep_tp(R), ep_lat(R), ep_f8(R);
    std::vector<DeviceArray<uint16_t>> ag_out(R), rs_in(R), a2a_send(R), a2a_recv(R);
    std::vector<int32_t> chunks(R);
    std::vector<size_t> sent(R), sent_f8(R);
    std::vector<std::vector<int64_t>> measured_counts(R);
    const bool decode = T <= 64;
    std::string err = on_ranks(R, [&](int r) {
        dev[r] = trace_rank(trace, r, T, K, H);
        epc::EpConfig cfg = bench_config(K, H, T, max_rows);
        ep_tp[r] = std::make_unique<epc::EpRank>(*nets[r], p, cfg);
        cfg.combine_dtype = WireDtype::Fp8Fp32;  // the rows are constant: far inside the accuracy gate
        ep_f8[r] = std::make_unique<epc::EpRank>(*nets[r], p, cfg);
        cfg.combine_dtype = WireDtype::Bf16;
        if (decode) {
            cfg.mode = epc::Mode::Latency;
            ep_lat[r] = std::make_unique<epc::EpRank>(*nets[r], p, cfg);
        }
        ag_out[r] = DeviceArray<uint16_t>(R * T * H);
        rs_in[r] = DeviceArray<uint16_t>(R * T * H);
        int64_t out_rows = 0, in_rows = 0;
        for (int q = 0; q < R; ++q) {
            out_rows += routes[r][q];
            in_rows += routes[q][r];
        }
        a2a_send[r] = DeviceArray<uint16_t>(std::max<int64_t>(out_rows, 1) * H);
        a2a_recv[r] = DeviceArray<uint16_t>(std::max<int64_t>(in_rows, 1) * H);
    });
    CHECK(err.empty(), "bench setup: %s", err.c_str());
    if (!err.empty()) return;
    const epc::ExpertFn no_expert = [](const epc::ExpertBatch &, cudaStream_t) {};
    const int iters = decode ? 50 : 10;

    const double t_ep = time_ranks(R, iters, [&](int r, cudaStream_t st) {
        ep_tp[r]->forward(dev[r].ids.ptr, dev[r].weights.ptr, dev[r].x.ptr, T, no_expert, dev[r].out.ptr, st);
        chunks[r] = ep_tp[r]->last_chunks();
        sent[r] = ep_tp[r]->last_bytes_sent();
        measured_counts[r] = ep_tp[r]->last_count_matrix();
    });
    const double t_f8 = time_ranks(R, iters, [&](int r, cudaStream_t st) {
        ep_f8[r]->forward(dev[r].ids.ptr, dev[r].weights.ptr, dev[r].x.ptr, T, no_expert, dev[r].out.ptr, st);
        sent_f8[r] = ep_f8[r]->last_bytes_sent();
        CHECK(!ep_f8[r]->combine_gate_tripped(), "FP8 combine gate tripped on constant rows");
    });
    double t_lat = -1;
    if (decode)
        t_lat = time_ranks(R, iters, [&](int r, cudaStream_t st) {
            ep_lat[r]->forward(dev[r].ids.ptr, dev[r].weights.ptr, dev[r].x.ptr, T, no_expert, dev[r].out.ptr, st);
        });
    const double t_agrs = time_ranks(R, iters, [&](int r, cudaStream_t st) {
        nets[r]->all_gather(dev[r].x.ptr, ag_out[r].ptr, T * H * 2, st);
        nets[r]->reduce_scatter_bf16(rs_in[r].ptr, dev[r].out.ptr, T * H, st);
    });
    // Decode sizes as a decode loop runs them: each rank's step replayed from a CUDA graph.
    if (decode) {
        const double g_agrs = time_graphs(R, iters, [&](int r, cudaStream_t st) {
            nets[r]->all_gather(dev[r].x.ptr, ag_out[r].ptr, T * H * 2, st);
            nets[r]->reduce_scatter_bf16(rs_in[r].ptr, dev[r].out.ptr, T * H, st);
        });
        const double g_lat = time_graphs(R, iters, [&](int r, cudaStream_t st) {
            ep_lat[r]->forward(dev[r].ids.ptr, dev[r].weights.ptr, dev[r].x.ptr, T, no_expert, dev[r].out.ptr, st);
        });
        g_graph_rows.push_back(ft::cat(H, " ", E, " ", T, " | AG+RS ", g_agrs * 1e3, " us | EP latency mode ", g_lat * 1e3,
                                       " us | ", g_agrs / g_lat, "x"));
    }
    const double t_a2a = time_ranks(R, iters, [&](int r, cudaStream_t st) {
        std::vector<epc::PeerRange> there(R), back(R);
        size_t so = 0, ro = 0;
        for (int q = 0; q < R; ++q) {
            const size_t out = routes[r][q] * H * 2, in = routes[q][r] * H * 2;
            there[q] = {so, out, ro, in};
            back[q] = {ro, in, so, out};
            so += out;
            ro += in;
        }
        nets[r]->exchange(a2a_send[r].ptr, a2a_recv[r].ptr, there.data(), st);
        nets[r]->exchange(a2a_recv[r].ptr, a2a_send[r].ptr, back.data(), st);
    });

    double meas_bytes = 0, meas_rows = 0, f8_bytes = 0;
    for (int r = 0; r < R; ++r) {
        meas_bytes += sent[r];
        f8_bytes += sent_f8[r];
        for (int d = 0; d < R; ++d)
            if (d != r) meas_rows += measured_counts[0][r * R + d];
    }
    meas_bytes /= R;
    f8_bytes /= R;
    CHECK(std::fabs(meas_bytes - pred_bytes) < 0.5, "bytes sent %.0f vs layout %.0f", meas_bytes, pred_bytes);
    CHECK(meas_rows == remote_rows, "remote rows %.0f vs layout %.0f", meas_rows, remote_rows);
    // Free each rank's buffers, streams and events on its own device.
    err = on_ranks(R, [&](int r) {
        ep_tp[r].reset();
        ep_lat[r].reset();
        ep_f8[r].reset();
        dev[r] = RankData();
        ag_out[r] = DeviceArray<uint16_t>();
        rs_in[r] = DeviceArray<uint16_t>();
        a2a_send[r] = DeviceArray<uint16_t>();
        a2a_recv[r] = DeviceArray<uint16_t>();
    });
    CHECK(err.empty(), "bench teardown: %s", err.c_str());
    const double agrs_bytes = 2.0 * (R - 1) * T * H * 2;  // per GPU, ring model
    const double a2a_bytes = 2.0 * remote_routes * H * 2 / R;
    char lat[32] = "-";
    if (t_lat >= 0) std::snprintf(lat, sizeof lat, "%.3f", t_lat);
    std::printf("%5lld %4d %6lld %3d | %9.3f %9.3f %9s | %9.3f %9.3f | %5.2fx %5.2fx %5.2fx | %10.3e %10.3e %10.3e %10.3e %10.3e | %5.2f %5.2f\n",
                static_cast<long long>(H), E, static_cast<long long>(T), chunks[0], t_ep, t_f8, lat, t_agrs, t_a2a, t_agrs / t_ep,
                t_agrs / t_f8, t_a2a / t_ep, meas_bytes, f8_bytes, pred_bytes, agrs_bytes, a2a_bytes, remote_rows > 0 ? remote_routes / remote_rows : 0.0,
                remote_rows / (static_cast<double>(T) * R * std::max(R - 1, 1)));
    std::fflush(stdout);
}

}  // namespace ep_multi_bench
