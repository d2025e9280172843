// Expert parallelism on every visible GPU of one process through the NCCL transport (issue 8):
// correctness across ranks, then dispatch + combine speed against NCCL baselines.
//
//   bench_ep_multi_gpu [--check-only | --bench-only] [--quick | --prefill-only] [--max-ctas N]
//
// Correctness: tokens that encode (source, index) arrive exactly once where the layout says;
// every local expert receives exactly its routes; each rank's output equals the host reference
// bit for bit (which the one-GPU tests tie to a single-device MoE within the FP8 tolerance) in
// throughput mode with 1, 2 and 4 chunks, latency mode eager and as a replayed CUDA graph, and
// over repeated runs. The NCCL transport used (P2P / SHM / NET) is read from NCCL's INFO log and
// printed; with NCCL_P2P_DISABLE=1 a P2P channel is an error.
// Speed (equal tokens per rank, a Zipf-skewed routing trace with co-activated pairs): EP
// dispatch + combine (FP8 dispatch, bf16 combine, dedup per GPU) against (a) bf16 all-gather +
// reduce-scatter and (b) a plain bf16 all-to-all of every remote route, for H=7168 top-8 of 256
// and H=2048 top-8 of 128 at decode (1..64 tokens per GPU) and prefill (4K..32K) sizes, with the
// bytes each GPU sent against the layout's prediction and the dedup factor.
//
// Exits 0 with a note when fewer than two GPUs or no libnccl.so.2 are usable, so it runs
// anywhere; NCCL_NVLS_ENABLE is forced to 0.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <glob.h>
#include <map>
#include <numeric>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ep_sim_reference.cuh"
#include "ft/cuda_device.hpp"
#include "ft/ep.hpp"
#include "ft/ep_cuda.hpp"

namespace {

using namespace ft::ep;
using namespace ft::test;
namespace epc = ft::ep::cuda;

int g_failures = 0;

#define CHECK(cond, ...)                                    \
    do {                                                    \
        if (!(cond)) {                                      \
            ++g_failures;                                   \
            std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            std::printf(__VA_ARGS__);                       \
            std::printf("\n");                              \
        }                                                   \
    } while (0)

class Barrier {
public:
    explicit Barrier(int n) : n_(n) {}
    void wait() {
        std::unique_lock<std::mutex> lock(m_);
        const int64_t gen = gen_;
        if (++count_ == n_) {
            count_ = 0;
            ++gen_;
            cv_.notify_all();
        } else {
            cv_.wait(lock, [&] { return gen_ != gen; });
        }
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    int n_, count_ = 0;
    int64_t gen_ = 0;
};

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

// ---- which NCCL transport ran ----------------------------------------------------------------

std::string g_log_pattern;
std::vector<std::string> g_graph_rows;  // the decode sizes replayed from CUDA graphs

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

void report_transports() {
    const std::set<std::string> seen = nccl_transports();
    std::string all;
    for (const std::string &s : seen) all += (all.empty() ? "" : ", ") + s;
    std::printf("NCCL transport(s) used: %s\n", all.empty() ? "(not logged; set NCCL_DEBUG=INFO yourself?)" : all.c_str());
    const char *p2p_off = std::getenv("NCCL_P2P_DISABLE");
    if (p2p_off && std::string(p2p_off) == "1")
        for (const std::string &s : seen) CHECK(s.rfind("P2P", 0) != 0, "NCCL_P2P_DISABLE=1 but a channel ran via %s", s.c_str());
}

// ---- per-rank device state ----------------------------------------------------------------

struct RankData {
    DeviceArray<int32_t> ids, phy2log;
    DeviceArray<float> weights, a, b;
    DeviceArray<uint16_t> x, out;
};

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

// ---- correctness ---------------------------------------------------------------------------

struct Shape {
    int64_t H;
    int32_t E;
};

Placement shape_placement(int32_t E, int32_t R, bool replicas, Rng &rng) {
    if (!replicas) return contiguous_placement(E, R);
    PlannerInput in;
    in.num_experts = E;
    in.num_ranks = R;
    in.replicas = R;
    for (int32_t e = 0; e < E; ++e) in.load.push_back(1.0 + 100.0 * std::pow(rng.uniform(), 4.0));
    return plan_placement(in).placement;
}

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

// ---- speed ---------------------------------------------------------------------------------

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

// ---- placement (issue 8 item 3) ------------------------------------------------------------

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

bool has(int argc, char **argv, const char *flag) {
    for (int i = 1; i < argc; ++i)
        if (std::strcmp(argv[i], flag) == 0) return true;
    return false;
}

int value(int argc, char **argv, const char *flag, int fallback) {
    for (int i = 1; i + 1 < argc; ++i)
        if (std::strcmp(argv[i], flag) == 0) return std::atoi(argv[i + 1]);
    return fallback;
}

}  // namespace

int main(int argc, char **argv) {
    const bool quick = has(argc, argv, "--quick");
    const bool check = !has(argc, argv, "--bench-only"), bench = !has(argc, argv, "--check-only");
    const int n = ft::cuda::device_count();
    if (n < 2) {
        std::printf("bench_ep_multi_gpu: %d usable GPU(s); the multi-GPU runs need 2 or more, nothing to do\n", n);
        return 0;
    }
    setenv("NCCL_NVLS_ENABLE", "0", 1);  // this workplace's rule for its multi-GPU machines
    if (!std::getenv("NCCL_DEBUG")) {
        setenv("NCCL_DEBUG", "INFO", 1);
        setenv("NCCL_DEBUG_SUBSYS", "INIT,P2P,SHM,NET", 1);
        const std::string base = ft::cat("/tmp/ft_ep_nccl.", getpid());
        setenv("NCCL_DEBUG_FILE", (base + ".%h.%p.log").c_str(), 1);
        g_log_pattern = base + ".*.log";
    }
    // After the environment: NCCL reads NCCL_DEBUG* once, possibly at the first call.
    std::string why;
    if (!epc::NcclTransport::available(&why)) {
        std::printf("bench_ep_multi_gpu: NCCL unavailable (%s); nothing to do\n", why.c_str());
        return 0;
    }
    std::vector<int32_t> devices(n);
    for (int i = 0; i < n; ++i) devices[i] = i;
    std::printf("bench_ep_multi_gpu: %d GPUs (%s), NCCL_P2P_DISABLE=%s\n", n, ft::cuda::device_name(0).c_str(),
                std::getenv("NCCL_P2P_DISABLE") ? std::getenv("NCCL_P2P_DISABLE") : "unset");
    std::vector<std::unique_ptr<epc::NcclTransport>> nets;
    try {
        nets = epc::NcclTransport::init_all(devices, value(argc, argv, "--max-ctas", 0));
    } catch (const std::exception &e) {
        std::printf("bench_ep_multi_gpu: NCCL init failed: %s\n", e.what());
        return 1;
    }
    std::printf("%s, NCCL SM budget %s\n", nets[0]->describe().c_str(),
                value(argc, argv, "--max-ctas", 0) ? ft::cat(value(argc, argv, "--max-ctas", 0), " CTAs").c_str() : "default");

    const Shape big{7168, 256}, small{2048, 128};
    if (check) {
        uint64_t seed = 1000;
        for (const Shape &s : {small, big})
            for (int64_t T : {1, 7, 64}) check_case(nets, s, T, WireDtype::Fp8Fp32, false, false, seed++);
        check_case(nets, small, quick ? 300 : 2000, WireDtype::Fp8Fp32, true, false, seed++);
        check_case(nets, small, 300, WireDtype::Fp8Ue8m0, true, false, seed++);
        check_case(nets, small, 300, WireDtype::Bf16, true, true, seed++);
        check_case(nets, big, 64, WireDtype::Bf16, false, true, seed++);
        report_transports();
    }
    if (bench) {
        // --prefill-only: the H=7168 prefill rows alone (for A/B runs of NCCL settings).
        const bool prefill_only = has(argc, argv, "--prefill-only");
        if (!prefill_only)
            for (size_t bytes : {size_t{16} << 10, size_t{512} << 10}) bench_transport(nets, bytes);
        std::printf("\nH     E    tokens/GPU C | EP ms     EP-f8c ms EP-lat ms | AG+RS ms  a2a ms    | vs(a) f8c/a vs(b) | "
                    "B/GPU sent  f8c sent   predicted  AG+RS B     a2a B      | dedup P\n");
        std::vector<int64_t> sizes = quick ? std::vector<int64_t>{8, 4096}
                                           : std::vector<int64_t>{1, 8, 64, 4096, 8192, 16384, 32768};
        if (prefill_only) sizes = {4096, 32768};
        for (const Shape &s : {big, small})
            if (!prefill_only || s.H == big.H)
                for (int64_t T : sizes) bench_shape(nets, s, T);
        if (!prefill_only) {
            // Modelled expert compute: 3 * H * I bf16 MACs a row at ~600 TFLOP/s (I = 2048 / 1536).
            std::printf("\nPlacement: Zipf(1.0) trace with co-activated pairs, FP8 dispatch + combine, modelled expert "
                        "compute per row\nH     E    tokens/GPU | placement             | step       | balance | per GPU\n");
            bench_placement(nets, big, quick ? 4096 : 8192, 2.0 * 3 * 7168 * 2048 / 600e12 * 1e9);
            bench_placement(nets, small, quick ? 4096 : 8192, 2.0 * 3 * 2048 * 1536 / 600e12 * 1e9);
            std::printf("\nDecode sizes, each rank's step captured in a CUDA graph and replayed (slowest rank, median):\n"
                        "H E tokens/GPU | AG+RS | EP latency mode | AG+RS / EP\n");
            for (const std::string &row : g_graph_rows) std::printf("%s\n", row.c_str());
        }
        if (!check) report_transports();
    }
    std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "OK", g_failures);
    return g_failures ? 1 : 0;
}
