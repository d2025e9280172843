// The placement comparison of bench_ep_multi_gpu: round-robin against the planner's placement.
#include "bench_ep_multi_gpu.cuh"

namespace ep_multi_bench {

namespace {

// Stands in for the experts' compute: each expert row costs `ns_per_row` of device time (a
// block per row slice spins on the global timer), so a rank's compute time follows the rows it
// received and a placement's load balance shows in the step time.
__global__ void busy_rows_kernel(const int64_t *offset, int32_t S, int64_t max_rows, uint64_t ns_per_row) {
    const int64_t rows = min(offset[S], max_rows);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        if (threadIdx.x != 0) continue;
        uint64_t t0, t;
        asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t0));
        do asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
        while (t - t0 < ns_per_row * gridDim.x);
    }
}

Placement round_robin_placement(int32_t E, int32_t R) {
    std::vector<int32_t> phy2log(E);
    const int32_t S = E / R;
    for (int32_t e = 0; e < E; ++e) phy2log[(e % R) * S + e / R] = e;
    return make_placement(E, R, phy2log);
}

}  // namespace

// Step time (FP8 dispatch and combine, throughput mode) on a Zipf-skewed trace with co-activated
// pairs, experts costing a modelled H x I x 3 bf16 GEMV per row, under round-robin placement and
// the planner's (loads and co-activation of the trace; with and without R replicas).
void bench_placement(std::vector<std::unique_ptr<epc::NcclTransport>> &nets, const Shape &shape, int64_t T,
                     double ns_per_row) {
    const int R = static_cast<int>(nets.size());
    const int32_t K = kTopK, E = shape.E;
    const int64_t H = shape.H;
    TraceSpec spec;
    spec.experts = E;
    spec.top_k = K;
    spec.tokens = T * R;
    spec.seed = 11;
    spec.zipf_exponent = 1.0;
    spec.pair_probability = 0.5;
    const std::vector<int32_t> trace = routing_trace(spec);
    PlannerInput in;
    in.num_experts = E;
    in.num_ranks = R;
    routing_stats(trace, E, K, in.load, in.coactivation);
    struct Candidate {
        const char *name;
        Placement p;
    };
    std::vector<Candidate> cands;
    cands.push_back({"round-robin", round_robin_placement(E, R)});
    cands.push_back({"planner", plan_placement(in).placement});
    in.replicas = R;
    cands.push_back({"planner + R replicas", plan_placement(in).placement});
    for (const Candidate &c : cands) {
        const Placement &p = c.p;
        // Rows each rank's experts receive, bytes in and out per rank (the layout's prediction).
        std::vector<DispatchLayout> L;
        for (int r = 0; r < R; ++r) L.push_back(dispatch_layout(p, trace.data() + r * T * K, nullptr, T, K, r));
        const size_t rb = record_bytes(H, K, WireDtype::Fp8Fp32), cb = combine_row_bytes(H, WireDtype::Fp8Fp32);
        std::vector<int64_t> rows(R, 0);
        std::vector<double> out_b(R, 0), in_b(R, 0);
        for (int s = 0; s < R; ++s)
            for (int d = 0; d < R; ++d) {
                rows[d] += std::accumulate(L[s].expert_count.begin() + d * p.slots_per_rank,
                                           L[s].expert_count.begin() + (d + 1) * p.slots_per_rank, int64_t(0));
                if (d == s) continue;
                out_b[s] += L[s].count[d] * double(rb) + L[d].count[s] * double(cb);  // records out, partials back
                in_b[d] += L[s].count[d] * double(rb);
                in_b[s] += L[d].count[s] * double(cb);
            }
        const int64_t max_rows = *std::max_element(rows.begin(), rows.end());
        std::vector<RankData> dev(R);
        std::vector<std::unique_ptr<epc::EpRank>> ep(R);
        std::string err = on_ranks(R, [&](int r) {
            dev[r] = trace_rank(trace, r, T, K, H);
            epc::EpConfig cfg = bench_config(K, H, T, max_rows);
            cfg.combine_dtype = WireDtype::Fp8Fp32;
            ep[r] = std::make_unique<epc::EpRank>(*nets[r], p, cfg);
        });
        CHECK(err.empty(), "placement setup: %s", err.c_str());
        if (!err.empty()) return;
        const uint64_t ns = static_cast<uint64_t>(ns_per_row + 0.5);
        const epc::ExpertFn busy = [ns](const epc::ExpertBatch &b, cudaStream_t st) {
            busy_rows_kernel<<<1024, 32, 0, st>>>(b.offset, b.slots, b.max_rows, ns);
        };
        const double t = time_ranks(R, 5, [&](int r, cudaStream_t st) {
            ep[r]->forward(dev[r].ids.ptr, dev[r].weights.ptr, dev[r].x.ptr, T, busy, dev[r].out.ptr, st);
        });
        on_ranks(R, [&](int r) {
            ep[r].reset();
            dev[r] = RankData();
        });
        std::string per;
        for (int r = 0; r < R; ++r)
            per += ft::cat(r ? "; " : "", "GPU", r, " rows ", rows[r], " out ", out_b[r] / 1e6, " MB in ", in_b[r] / 1e6, " MB");
        std::printf("%5lld %4d %6lld | %-21s | %8.3f ms | max/mean rows %.3f | %s\n", static_cast<long long>(H), E,
                    static_cast<long long>(T), c.name, t, max_rows * double(R) / std::accumulate(rows.begin(), rows.end(), 0.0),
                    per.c_str());
        std::fflush(stdout);
    }
}

}  // namespace ep_multi_bench
