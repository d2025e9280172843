// Running the ranks of bench_ep_multi_gpu: a thread per rank, the NCCL transport report, each
// rank's device data, and the timing of the slowest rank.
#include "bench_ep_multi_gpu.cuh"

namespace ep_multi_bench {

namespace {

std::set<std::string> nccl_transports() {
    std::set<std::string> seen;
    if (g_log_pattern.empty()) return seen;
    glob_t g{};
    if (glob(g_log_pattern.c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i) {
            std::ifstream f(g.gl_pathv[i]);
            std::string line;
            while (std::getline(f, line)) {
                const size_t at = line.find(" via ");
                if (at == std::string::npos) continue;
                std::string what = line.substr(at + 5);
                what = what.substr(0, what.find_first_of(" \t\r\n"));
                if (!what.empty()) seen.insert(what);
            }
        }
    }
    globfree(&g);
    return seen;
}

}  // namespace

// One host thread per rank (NCCL collectives of one process's communicators block until every
// rank has joined). The first exception of any rank is returned.
std::string on_ranks(int R, const std::function<void(int)> &fn) {
    std::vector<std::string> err(R);
    std::vector<std::thread> th;
    for (int r = 0; r < R; ++r)
        th.emplace_back([&, r] {
            try {
                cuda_ok(cudaSetDevice(r), "cudaSetDevice");
                fn(r);
            } catch (const std::exception &e) {
                err[r] = ft::cat("rank ", r, ": ", e.what());
            }
        });
    for (std::thread &t : th) t.join();
    for (const std::string &e : err)
        if (!e.empty()) return e;
    return "";
}

void report_transports() {
    const std::set<std::string> seen = nccl_transports();
    std::string all;
    for (const std::string &s : seen) all += (all.empty() ? "" : ", ") + s;
    std::printf("NCCL transport(s) used: %s\n", all.empty() ? "(not logged; set NCCL_DEBUG=INFO yourself?)" : all.c_str());
    const char *p2p_off = std::getenv("NCCL_P2P_DISABLE");
    if (p2p_off && std::string(p2p_off) == "1")
        for (const std::string &s : seen) CHECK(s.rfind("P2P", 0) != 0, "NCCL_P2P_DISABLE=1 but a channel ran via %s", s.c_str());
}

RankData upload(const RankInput &ri, const Placement &p, int r, const Experts &ex) {
    RankData d;
    const int32_t S = p.slots_per_rank;
    d.ids = DeviceArray<int32_t>(ri.ids);
    d.weights = DeviceArray<float>(ri.weights);
    d.x = DeviceArray<uint16_t>(ri.x);
    d.out = DeviceArray<uint16_t>(std::max<size_t>(ri.x.size(), 1));
    d.phy2log = DeviceArray<int32_t>(std::vector<int32_t>(p.phy2log.begin() + r * S, p.phy2log.begin() + (r + 1) * S));
    d.a = DeviceArray<float>(ex.a);
    d.b = DeviceArray<float>(ex.b);
    return d;
}

// Median over iterations of the slowest rank's time.
double time_ranks(int R, int iters, const std::function<void(int, cudaStream_t)> &op) {
    Barrier bar(R);
    std::vector<std::vector<double>> t(R, std::vector<double>(iters));
    const std::string err = on_ranks(R, [&](int r) {
        cudaStream_t st;
        cudaEvent_t a, b;
        cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
        cuda_ok(cudaEventCreate(&a), "event");
        cuda_ok(cudaEventCreate(&b), "event");
        for (int w = 0; w < 2; ++w) op(r, st);
        cuda_ok(cudaStreamSynchronize(st), "warmup");
        for (int i = 0; i < iters; ++i) {
            bar.wait();
            cuda_ok(cudaEventRecord(a, st), "record");
            op(r, st);
            cuda_ok(cudaEventRecord(b, st), "record");
            cuda_ok(cudaEventSynchronize(b), "sync");
            float ms = 0;
            cuda_ok(cudaEventElapsedTime(&ms, a, b), "elapsed");
            t[r][i] = ms;
        }
        cudaEventDestroy(a);
        cudaEventDestroy(b);
        cudaStreamDestroy(st);
    });
    if (!err.empty()) {
        CHECK(false, "timing: %s", err.c_str());
        return -1;
    }
    std::vector<double> worst(iters, 0);
    for (int i = 0; i < iters; ++i)
        for (int r = 0; r < R; ++r) worst[i] = std::max(worst[i], t[r][i]);
    std::sort(worst.begin(), worst.end());
    return worst[iters / 2];
}

// Each rank's `op` captured once into a CUDA graph (a decode loop replays its step that way: no
// host launch cost per kernel), then the replays timed like time_ranks.
double time_graphs(int R, int iters, const std::function<void(int, cudaStream_t)> &op) {
    std::vector<cudaGraphExec_t> exec(R, nullptr);
    const std::string err = on_ranks(R, [&](int r) {
        cudaStream_t st;
        cudaGraph_t g;
        cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
        cuda_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
        op(r, st);
        cuda_ok(cudaStreamEndCapture(st, &g), "end capture");
        cuda_ok(cudaGraphInstantiate(&exec[r], g, 0), "instantiate");
        cudaGraphDestroy(g);
        cudaStreamDestroy(st);
    });
    if (!err.empty()) {
        CHECK(false, "graph capture: %s", err.c_str());
        return -1;
    }
    const double t = time_ranks(R, iters, [&](int r, cudaStream_t st) { cuda_ok(cudaGraphLaunch(exec[r], st), "replay"); });
    on_ranks(R, [&](int r) { cudaGraphExecDestroy(exec[r]); });
    return t;
}

// Rank r's slice of a [R*T, K] routing trace on its device: ids, weights 1/K, constant rows.
RankData trace_rank(const std::vector<int32_t> &trace, int r, int64_t T, int32_t K, int64_t H) {
    RankData d;
    d.ids = DeviceArray<int32_t>(std::vector<int32_t>(trace.begin() + r * T * K, trace.begin() + (r + 1) * T * K));
    d.weights = DeviceArray<float>(std::vector<float>(T * K, 1.0f / K));
    d.x = DeviceArray<uint16_t>(T * H);
    cuda_ok(cudaMemset(d.x.ptr, 0x3f, T * H * 2), "fill");
    d.out = DeviceArray<uint16_t>(T * H);
    return d;
}

epc::EpConfig bench_config(int32_t K, int64_t H, int64_t T, int64_t max_rows) {
    epc::EpConfig cfg;
    cfg.top_k = K;
    cfg.hidden = H;
    cfg.max_tokens = T;
    cfg.max_expert_rows = max_rows;
    cfg.link_bytes_per_s = 20e9;
    return cfg;
}

}  // namespace ep_multi_bench
