// The simulated EP step of ep_cuda_sim_step.cuh.
#include "ep_cuda_sim_step.cuh"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>

namespace ep_cuda_test {

struct DeviceRank {
    DeviceArray<int32_t> ids;
    DeviceArray<float> weights;
    DeviceArray<uint16_t> x, out;
    DeviceArray<int32_t> phy2log;
    DeviceArray<float> a, b;
};

DeviceResult run_device(const Placement &p, const std::vector<RankInput> &in, int64_t H, WireDtype dtype,
                        const Experts &ex, Run run, int32_t chunks, int64_t max_rows,
                        const std::vector<RankInput> *graph_capture_inputs) {
    const int32_t R = p.num_ranks, S = p.slots_per_rank;
    int64_t T = 1;
    for (const RankInput &ri : in) T = std::max(T, ri.tokens);
    const bool threaded = run == Run::Throughput || run == Run::LatencyThreaded;
    ft::test::SimHub hub(R, threaded);
    std::vector<std::unique_ptr<ft::test::SimTransport>> net;
    std::vector<std::unique_ptr<epc::EpRank>> ranks;
    std::vector<DeviceRank> dev(R);
    epc::EpConfig cfg;
    cfg.top_k = kTopK;
    cfg.hidden = H;
    cfg.max_tokens = T;
    cfg.dispatch_dtype = dtype;
    cfg.mode = run == Run::Throughput ? epc::Mode::Throughput : epc::Mode::Latency;
    cfg.chunks = chunks;
    cfg.max_expert_rows = max_rows;
    for (int32_t r = 0; r < R; ++r) {
        net.push_back(std::make_unique<ft::test::SimTransport>(hub, r));
        ranks.push_back(std::make_unique<epc::EpRank>(*net[r], p, cfg));
        const std::vector<RankInput> &src = graph_capture_inputs ? *graph_capture_inputs : in;
        dev[r].ids = DeviceArray<int32_t>(src[r].ids);
        dev[r].weights = DeviceArray<float>(src[r].weights);
        dev[r].x = DeviceArray<uint16_t>(src[r].x);
        dev[r].out = DeviceArray<uint16_t>(std::max<size_t>(in[r].x.size(), 1));
        dev[r].phy2log = DeviceArray<int32_t>(std::vector<int32_t>(p.phy2log.begin() + r * S, p.phy2log.begin() + (r + 1) * S));
        dev[r].a = DeviceArray<float>(ex.a);
        dev[r].b = DeviceArray<float>(ex.b);
    }
    auto expert = [&](int32_t r) { return ft::test::toy_expert(dev[r].phy2log.ptr, dev[r].a.ptr, dev[r].b.ptr); };
    auto tokens = [&](int32_t r) { return (graph_capture_inputs ? *graph_capture_inputs : in)[r].tokens; };

    if (threaded) {
        std::vector<std::string> errors(R);
        std::vector<std::thread> threads;
        for (int32_t r = 0; r < R; ++r)
            threads.emplace_back([&, r] {
                try {
                    cudaStream_t st;
                    ft::test::cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
                    ranks[r]->forward(dev[r].ids.ptr, dev[r].weights.ptr, dev[r].x.ptr, tokens(r), expert(r),
                                      dev[r].out.ptr, st);
                    ft::test::cuda_ok(cudaStreamSynchronize(st), "sync");
                    cudaStreamDestroy(st);
                } catch (const std::exception &e) {
                    errors[r] = e.what();
                    hub.abort(ft::cat("rank ", r, " failed: ", e.what()));
                }
            });
        for (std::thread &t : threads) t.join();
        for (int32_t r = 0; r < R; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
    } else {
        cudaStream_t st;
        ft::test::cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
        auto step = [&] {
            for (int32_t r = 0; r < R; ++r)
                ranks[r]->dispatch_send(dev[r].ids.ptr, dev[r].weights.ptr, dev[r].x.ptr, tokens(r), st);
            for (int32_t r = 0; r < R; ++r) {
                ranks[r]->dispatch_recv(st);
                expert(r)(ranks[r]->batch(), st);
                ranks[r]->combine_send(st);
            }
            for (int32_t r = 0; r < R; ++r) ranks[r]->combine_recv(dev[r].out.ptr, st);
        };
        if (run == Run::LatencyGraph) {
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            ft::test::cuda_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
            step();
            ft::test::cuda_ok(cudaStreamEndCapture(st, &graph), "end capture");
            ft::test::cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
            // Captured on other inputs: the replay must read the buffers' current contents.
            for (int32_t r = 0; r < R; ++r) {
                dev[r].ids.upload(in[r].ids);
                dev[r].weights.upload(in[r].weights);
                dev[r].x.upload(in[r].x);
            }
            ft::test::cuda_ok(cudaGraphLaunch(exec, st), "replay");
            ft::test::cuda_ok(cudaStreamSynchronize(st), "sync");
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        } else {
            step();
            ft::test::cuda_ok(cudaStreamSynchronize(st), "sync");
        }
        cudaStreamDestroy(st);
    }
    ft::test::cuda_ok(cudaDeviceSynchronize(), "EP step");

    DeviceResult res;
    res.sim_remote_bytes = hub.remote_bytes();
    for (int32_t r = 0; r < R; ++r) {
        res.out.push_back(dev[r].out.download(in[r].x.size()));
        res.chunks.push_back(ranks[r]->last_chunks());
        res.bytes_sent.push_back(ranks[r]->last_bytes_sent());
        EXPECT_FALSE(ranks[r]->overflowed(nullptr)) << "rank " << r;
        if (run != Run::Throughput) continue;
        res.count_matrix.push_back(ranks[r]->last_count_matrix());
        const epc::ReceiveBuffers &B = ranks[r]->receive();
        const std::vector<int64_t> counts = fetch(B.count, R);
        int64_t n = 0;
        for (int64_t c : counts) n += c;
        const size_t rb = record_bytes(H, kTopK, dtype);
        res.received.push_back(fetch(ranks[r]->recv_region().base, n * rb));
        res.expert_offset.push_back(fetch(B.expert_offset, S + 1));
        const int64_t rows = res.expert_offset.back()[S];
        res.row_position.push_back(fetch(B.row_position, rows));
        res.row_route.push_back(fetch(B.row_route, rows));
        res.row_source.push_back(fetch(B.row_source, rows));
        res.row_token.push_back(fetch(B.row_token, rows));
        res.x_rows.push_back(fetch(ranks[r]->batch().x, rows * H));
        res.partials.push_back(fetch(ranks[r]->partials(), n * H));
    }
    return res;
}

std::vector<Case> cases() {
    std::vector<Case> c;
    uint64_t seed = 100;
    // Every R of 2..8, both hidden sizes, tokens 1, 7, 64 and 4096 (the largest only at the smaller
    // shape: the scalar host reference is the slow part), every wire dtype, with and without replicas.
    const WireDtype dt[3] = {WireDtype::Fp8Fp32, WireDtype::Fp8Ue8m0, WireDtype::Bf16};
    int i = 0;
    for (int32_t R = 2; R <= 8; ++R)
        for (int64_t T : {1, 7, 64}) {
            c.push_back({R, 2048, T, dt[i % 3], (i % 2) == 1, seed++});
            ++i;
        }
    for (int32_t R : {2, 5, 8}) c.push_back({R, 7168, 7, dt[i++ % 3], R == 5, seed++});
    c.push_back({4, 7168, 64, WireDtype::Fp8Fp32, true, seed++});
    c.push_back({2, 2048, 4096, WireDtype::Fp8Fp32, false, seed++});
    c.push_back({4, 2048, 4096, WireDtype::Fp8Ue8m0, true, seed++});
    // The one-block decode kernels' bounds (kernels_layout.cu, kernels_group.cu): rank 0 has
    // 512 * 8 = 4096 routes (the layout bound, still one block) or 513 * 8 (the chain), and
    // R * T * 8 = 8192 positions * top-k
    // (the group bound) or 8208.
    c.push_back({2, 2048, 512, WireDtype::Fp8Ue8m0, true, seed++});
    c.push_back({2, 2048, 513, WireDtype::Fp8Fp32, true, seed++});
    return c;
}

}  // namespace ep_cuda_test
