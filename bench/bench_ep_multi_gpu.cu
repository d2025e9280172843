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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_ep_multi_gpu.cuh"

namespace ep_multi_bench {
int g_failures = 0;
std::string g_log_pattern;
std::vector<std::string> g_graph_rows;
}  // namespace ep_multi_bench

using namespace ep_multi_bench;

namespace {

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
