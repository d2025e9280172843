// The correctness cases of bench_ep_multi_gpu: every rank against the host reference.
#include "bench_ep_multi_gpu.cuh"

namespace ep_multi_bench {

namespace {

Placement shape_placement(int32_t E, int32_t R, bool replicas, Rng &rng) {
    if (!replicas) return contiguous_placement(E, R);
    PlannerInput in;
    in.num_experts = E;
    in.num_ranks = R;
    in.replicas = R;
    for (int32_t e = 0; e < E; ++e) in.load.push_back(1.0 + 100.0 * std::pow(rng.uniform(), 4.0));
    return plan_placement(in).placement;
}

}  // namespace

void check_case(std::vector<std::unique_ptr<epc::NcclTransport>> &nets, const Shape &shape, int64_t T, WireDtype dtype,
                bool replicas, bool encode, uint64_t seed) {
    const int R = static_cast<int>(nets.size());
    Rng rng(seed);
    const Placement p = shape_placement(shape.E, R, replicas, rng);
    Case c{R, shape.H, T, dtype, replicas, seed};
    std::vector<RankInput> in = make_inputs(c, p, rng, encode);
    const Experts ex = make_experts(rng, p.num_experts);
    const std::vector<HostRank> h = host_pipeline(p, in, shape.H, dtype, ex);
    const std::string label = ft::cat("H=", shape.H, " E=", shape.E, " R=", R, " T=", T, " dtype=", static_cast<int>(dtype),
                                      replicas ? " replicas" : "", encode ? " encoded" : "");
    int64_t Tmax = 1;
    for (const RankInput &ri : in) Tmax = std::max(Tmax, ri.tokens);
    const int64_t rows = max_expert_rows(h);
    const size_t rb = record_bytes(shape.H, kTopK, dtype);

    struct Variant {
        const char *name;
        epc::Mode mode;
        int32_t chunks;
        bool graph;
    };
    const Variant variants[] = {{"throughput C=1", epc::Mode::Throughput, 1, false},
                                {"throughput C=2", epc::Mode::Throughput, 2, false},
                                {"throughput C=4", epc::Mode::Throughput, 4, false},
                                {"throughput C=1 again", epc::Mode::Throughput, 1, false},
                                {"latency eager", epc::Mode::Latency, 0, false},
                                {"latency graph replay", epc::Mode::Latency, 0, true}};
    for (const Variant &v : variants) {
        std::vector<std::vector<uint16_t>> out(R);
        std::vector<std::vector<uint8_t>> received(R);
        std::vector<std::vector<int64_t>> offsets(R);
        std::vector<std::vector<uint16_t>> xrows(R);
        std::vector<std::vector<int32_t>> rsrc(R), rtok(R);
        const std::string err = on_ranks(R, [&](int r) {
            RankData d = upload(in[r], p, r, ex);
            epc::EpConfig cfg;
            cfg.top_k = kTopK;
            cfg.hidden = shape.H;
            cfg.max_tokens = Tmax;
            cfg.dispatch_dtype = dtype;
            cfg.mode = v.mode;
            cfg.chunks = v.chunks;
            cfg.max_expert_rows = rows;
            epc::EpRank ep(*nets[r], p, cfg);
            cudaStream_t st;
            cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
            const epc::ExpertFn expert = toy_expert(d.phy2log.ptr, d.a.ptr, d.b.ptr);
            if (v.graph) {
                cudaGraph_t g;
                cudaGraphExec_t exec;
                cuda_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
                ep.forward(d.ids.ptr, d.weights.ptr, d.x.ptr, in[r].tokens, expert, d.out.ptr, st);
                cuda_ok(cudaStreamEndCapture(st, &g), "end capture");
                cuda_ok(cudaGraphInstantiate(&exec, g, 0), "instantiate");
                cuda_ok(cudaGraphLaunch(exec, st), "replay");
                cuda_ok(cudaGraphLaunch(exec, st), "replay again");
                cuda_ok(cudaStreamSynchronize(st), "sync");
                cudaGraphExecDestroy(exec);
                cudaGraphDestroy(g);
            } else {
                ep.forward(d.ids.ptr, d.weights.ptr, d.x.ptr, in[r].tokens, expert, d.out.ptr, st);
                cuda_ok(cudaStreamSynchronize(st), "sync");
            }
            out[r] = d.out.download(in[r].x.size());
            if (v.mode == epc::Mode::Throughput && v.chunks == 1) {
                const epc::ReceiveBuffers &B = ep.receive();
                const std::vector<int64_t> counts = fetch(B.count, R);
                int64_t n = 0;
                for (int64_t k : counts) n += k;
                received[r] = fetch(ep.recv_region().base, n * rb);
                offsets[r] = fetch(B.expert_offset, p.slots_per_rank + 1);
                const int64_t nr = offsets[r].back();
                xrows[r] = fetch(ep.batch().x, nr * shape.H);
                rsrc[r] = fetch(B.row_source, nr);
                rtok[r] = fetch(B.row_token, nr);
            }
            CHECK(!ep.overflowed(st), "%s %s rank %d: expert rows overflowed", label.c_str(), v.name, r);
            cudaStreamDestroy(st);
        });
        CHECK(err.empty(), "%s %s: %s", label.c_str(), v.name, err.c_str());
        if (!err.empty()) continue;
        for (int r = 0; r < R; ++r) {
            CHECK(out[r] == h[r].out, "%s %s rank %d: output differs from the host reference", label.c_str(), v.name, r);
            if (&v != &variants[0]) continue;  // bit-identical to the first variant anyway
            const MoeCheck m = check_against_moe(in[r], ex, shape.H, dtype, out[r]);
            CHECK(m.bad == 0, "%s %s rank %d: %lld outputs off the single-device MoE beyond the FP8 tolerance (worst %.2fx)",
                  label.c_str(), v.name, r, static_cast<long long>(m.bad), m.worst);
        }
        if (v.mode == epc::Mode::Throughput && v.chunks == 1) {
            for (int r = 0; r < R; ++r) {
                CHECK(received[r] == h[r].received, "%s rank %d: received records differ", label.c_str(), r);
                CHECK(offsets[r] == h[r].rows.offset, "%s rank %d: expert row counts differ", label.c_str(), r);
                CHECK(xrows[r] == h[r].x_rows, "%s rank %d: unpacked rows differ", label.c_str(), r);
                if (!encode) continue;
                // Each (source, token) once per destination, and each local expert exactly its routes.
                std::multiset<std::pair<int, int>> want, got;
                std::map<int, std::multiset<std::pair<int, int>>> want_rows, got_rows;
                for (int s = 0; s < R; ++s)
                    for (int64_t t = 0; t < in[s].tokens; ++t) {
                        if (h[s].layout.sends(r, t)) want.insert({s, static_cast<int>(t)});
                        for (int j = 0; j < kTopK; ++j) {
                            const int32_t phy = h[s].layout.route_phy[t * kTopK + j];
                            if (phy >= 0 && p.rank_of(phy) == r) want_rows[p.slot_of(phy)].insert({s, static_cast<int>(t)});
                        }
                    }
                const RecordLayout RL = record_layout(shape.H, kTopK, dtype);
                for (size_t i = 0; i < received[r].size() / RL.bytes; ++i) {
                    uint16_t v3[3];
                    std::memcpy(v3, received[r].data() + i * RL.bytes, sizeof v3);
                    got.insert({static_cast<int>(bf16_to_f32(v3[0])),
                                static_cast<int>(bf16_to_f32(v3[1])) + 256 * static_cast<int>(bf16_to_f32(v3[2]))});
                }
                for (int32_t slot = 0; slot < p.slots_per_rank; ++slot)
                    for (int64_t k = offsets[r][slot]; k < offsets[r][slot + 1]; ++k) {
                        const uint16_t *xr = xrows[r].data() + k * shape.H;
                        const int src = static_cast<int>(bf16_to_f32(xr[0]));
                        const int tok = static_cast<int>(bf16_to_f32(xr[1])) + 256 * static_cast<int>(bf16_to_f32(xr[2]));
                        CHECK(src == rsrc[r][k] && tok == rtok[r][k], "%s rank %d row %lld: metadata (%d, %d) vs payload (%d, %d)",
                              label.c_str(), r, static_cast<long long>(k), rsrc[r][k], rtok[r][k], src, tok);
                        got_rows[slot].insert({src, tok});
                    }
                CHECK(got == want, "%s rank %d: the (source, token) set received differs from the layout's", label.c_str(), r);
                const std::set<std::pair<int, int>> distinct(got.begin(), got.end());
                CHECK(distinct.size() == got.size(), "%s rank %d: a token arrived twice", label.c_str(), r);
                CHECK(got_rows == want_rows, "%s rank %d: an expert did not receive exactly its routes", label.c_str(), r);
            }
        }
    }
    std::printf("checked %s\n", label.c_str());
}

}  // namespace ep_multi_bench
