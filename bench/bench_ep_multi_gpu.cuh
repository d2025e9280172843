// The pieces of bench_ep_multi_gpu (the main file bench_ep_multi_gpu.cu says what it runs): one
// host thread per rank, each rank's device data and timing (bench_ep_multi_gpu_ranks.cu), the
// correctness cases (bench_ep_multi_gpu_check.cu), the dispatch + combine speed table
// (bench_ep_multi_gpu_speed.cu) and the placement comparison (bench_ep_multi_gpu_placement.cu).
#pragma once

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

// Counts a failed check into g_failures and prints where and why; the run goes on.
#define CHECK(cond, ...)                                    \
    do {                                                    \
        if (!(cond)) {                                      \
            ++g_failures;                                   \
            std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            std::printf(__VA_ARGS__);                       \
            std::printf("\n");                              \
        }                                                   \
    } while (0)

namespace ep_multi_bench {

using namespace ft::ep;
using namespace ft::test;
namespace epc = ft::ep::cuda;

extern int g_failures;
extern std::string g_log_pattern;           // NCCL's INFO log files (NCCL_DEBUG_FILE), set by main
extern std::vector<std::string> g_graph_rows;  // the decode sizes replayed from CUDA graphs

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
std::string on_ranks(int R, const std::function<void(int)> &fn);

// Prints the NCCL transports (P2P / SHM / NET) read from NCCL's INFO log; with NCCL_P2P_DISABLE=1 a
// P2P channel is a failure.
void report_transports();

// ---- per-rank device state ----------------------------------------------------------------

struct RankData {
    DeviceArray<int32_t> ids, phy2log;
    DeviceArray<float> weights, a, b;
    DeviceArray<uint16_t> x, out;
};

// Rank r's inputs, placement slice and toy experts on its device.
RankData upload(const RankInput &ri, const Placement &p, int r, const Experts &ex);

struct Shape {
    int64_t H;
    int32_t E;
};

// One correctness case on every rank (see the main file): layouts, received tokens and rows, and
// each rank's output against the host reference in every mode.
void check_case(std::vector<std::unique_ptr<epc::NcclTransport>> &nets, const Shape &shape, int64_t T, WireDtype dtype,
                bool replicas, bool encode, uint64_t seed);

// Median over iterations of the slowest rank's time.
double time_ranks(int R, int iters, const std::function<void(int, cudaStream_t)> &op);

// Each rank's `op` captured once into a CUDA graph (a decode loop replays its step that way: no
// host launch cost per kernel), then the replays timed like time_ranks.
double time_graphs(int R, int iters, const std::function<void(int, cudaStream_t)> &op);

// Rank r's slice of a [R*T, K] routing trace on its device: ids, weights 1/K, constant rows.
RankData trace_rank(const std::vector<int32_t> &trace, int r, int64_t T, int32_t K, int64_t H);

// The EpConfig of the speed runs (top-k, hidden, tokens, expert rows, a 20 GB/s link hint).
epc::EpConfig bench_config(int32_t K, int64_t H, int64_t T, int64_t max_rows);

// What one exchange of `bytes` per peer costs inside a replayed graph (10 back to back), as NCCL
// grouped send/recv (what EP uses) and as an NCCL all-gather: the transport's floor under a
// decode step, which needs two exchanges.
void bench_transport(std::vector<std::unique_ptr<epc::NcclTransport>> &nets, size_t bytes);

// One row of the dispatch + combine table: EP against AG+RS and a plain all-to-all at T tokens per GPU.
void bench_shape(std::vector<std::unique_ptr<epc::NcclTransport>> &nets, const Shape &shape, int64_t T);

// Step time (FP8 dispatch and combine, throughput mode) on a Zipf-skewed trace with co-activated
// pairs, experts costing a modelled H x I x 3 bf16 GEMV per row, under round-robin placement and
// the planner's (loads and co-activation of the trace; with and without R replicas).
void bench_placement(std::vector<std::unique_ptr<epc::NcclTransport>> &nets, const Shape &shape, int64_t T,
                     double ns_per_row);

}  // namespace ep_multi_bench
