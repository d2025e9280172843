// EP composed with sessions (issue 7 item 5): each simulated rank computes its local experts
// through a FreeToken session (gpu or offload backend) over a model that holds exactly its
// physical slots, built with ft_model_create from one global random bf16 model; the EP output
// must equal one session over the full model. The rank sessions see the dequantised wire rows,
// so the reference runs on the same FP8-rounded inputs: what remains is the bf16 rounding of each
// route's output, the rank-ordered sum and the decode-vs-prefill kernels of the sessions. A
// wrong slot mapping would be off by the size of a whole expert output. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ep_traces.hpp"
#include "device_array.hpp"
#include "freetoken.h"
#include "freetoken_cuda.h"
#include "freetoken_ep.h"
#include "ft/common.hpp"
#include "ft/cuda_device.hpp"
#include "ft/ep.hpp"
#include "ft/ep_cuda.hpp"
#include "ft/ep_probe.hpp"
#include "ft/ep_session.hpp"
#include "moe_reference.hpp"
#include "scratch_dir.hpp"
#include "sim_transport.hpp"
#include "synth_reference.hpp"

namespace {

using namespace ft::ep;
using ft::bf16_to_f32;
using ft::f32_to_bf16;
using ft::test::Rng;
namespace epc = ft::ep::cuda;

using ft::test::cuda_ok;
using ft::test::DeviceArray;

constexpr int32_t kL = 2, kK = 4, kH = 256, kI = 128;

#define REQUIRE_GPU()                                                \
    do {                                                             \
        if (ft::cuda::device_count() == 0) GTEST_SKIP() << "no GPU"; \
    } while (0)

// The global model's weights, [layer][expert] -> gate, up [I, H], down [H, I] bf16.
struct Weights {
    int32_t E = 0;
    std::vector<std::vector<uint16_t>> gate, up, down;  // index layer * E + expert
    Weights(int32_t experts, Rng &rng) : E(experts) {
        auto fill = [&](size_t n, double scale) {
            std::vector<uint16_t> v(n);
            for (uint16_t &x : v) x = f32_to_bf16(static_cast<float>((rng.uniform() * 2 - 1) * scale));
            return v;
        };
        for (int32_t i = 0; i < kL * E; ++i) {
            gate.push_back(fill(size_t(kI) * kH, 2.0 / std::sqrt(double(kH))));
            up.push_back(fill(size_t(kI) * kH, 2.0 / std::sqrt(double(kH))));
            down.push_back(fill(size_t(kH) * kI, 2.0 / std::sqrt(double(kI))));
        }
    }
};

struct Handles {
    ft_model *model = nullptr;
    ft_session *session = nullptr;
    ~Handles() {
        ft_session_free(session);
        ft_model_free(model);
    }
};

// A model whose expert j is the global expert experts[j] (the rank's slots in order).
void build(ft_engine *engine, const Weights &w, const std::vector<int32_t> &experts, int32_t top_k, int32_t backend,
           int32_t max_tokens, Handles &h) {
    ft_model_desc d;
    ft_model_desc_init(&d);
    d.num_layers = kL;
    d.num_experts = static_cast<int32_t>(experts.size());
    d.top_k = top_k;
    d.hidden_size = kH;
    d.intermediate_size = kI;
    char err[512];
    ASSERT_EQ(ft_model_create(engine, &d, &h.model, err, sizeof err), FT_OK) << err;
    for (int32_t l = 0; l < kL; ++l)
        for (size_t j = 0; j < experts.size(); ++j) {
            const size_t g = size_t(l) * w.E + experts[j];
            ASSERT_EQ(ft_model_set_expert(h.model, l, int32_t(j), FT_PROJ_GATE, w.gate[g].data(), w.gate[g].size() * 2), FT_OK);
            ASSERT_EQ(ft_model_set_expert(h.model, l, int32_t(j), FT_PROJ_UP, w.up[g].data(), w.up[g].size() * 2), FT_OK);
            ASSERT_EQ(ft_model_set_expert(h.model, l, int32_t(j), FT_PROJ_DOWN, w.down[g].data(), w.down[g].size() * 2), FT_OK);
        }
    ASSERT_EQ(ft_model_finalize(h.model), FT_OK) << ft_model_last_error(h.model);
    ft_session_params p;
    ft_session_params_init(&p);
    p.backend = backend;
    p.max_tokens = max_tokens;
    p.check_finite = false;
    // Offload: one layer's worth of slots plus one, so the second layer evicts.
    if (backend == FT_BACKEND_OFFLOAD) p.cache_slots = static_cast<int64_t>(experts.size()) + 1;
    ASSERT_EQ(ft_session_create(h.model, &p, &h.session, err, sizeof err), FT_OK) << err;
}

struct Engine {
    ft_engine *e = nullptr;
    Engine() {
        ft_engine_params p;
        ft_engine_params_init(&p);
        p.device = 0;
        p.cpu_threads = 2;
        p.pin_threads = false;
        char err[256];
        if (ft_engine_create(&p, &e, err, sizeof err) != FT_OK) ADD_FAILURE() << err;
    }
    ~Engine() { ft_engine_free(e); }
};

// Placement with one replica per rank: rank r holds E/R contiguous experts plus a copy of the
// first expert of rank r+1, so S = E/R + 1 and every rank's model differs from a plain slice.
Placement replica_placement(int32_t E, int32_t R) {
    const int32_t per = E / R;
    std::vector<int32_t> phy2log;
    for (int32_t r = 0; r < R; ++r) {
        for (int32_t j = 0; j < per; ++j) phy2log.push_back(r * per + j);
        phy2log.push_back(((r + 1) % R) * per);
    }
    return make_placement(E, R, std::move(phy2log));
}

// x as the rank sessions see it after the wire: bf16(dequantised e4m3) for FP8 dtypes.
std::vector<uint16_t> wire_rounded(const std::vector<uint16_t> &x, int64_t tokens, WireDtype dtype) {
    if (dtype == WireDtype::Bf16) return x;
    const ScaleFormat fmt = dtype == WireDtype::Fp8Ue8m0 ? ScaleFormat::Ue8m0 : ScaleFormat::Fp32;
    std::vector<uint16_t> out(x.size());
    std::vector<uint8_t> q(kH), scales(fp8_scale_bytes(kH, fmt));
    std::vector<float> f(kH);
    for (int64_t t = 0; t < tokens; ++t) {
        quantize_fp8_row(x.data() + t * kH, kH, fmt, q.data(), scales.data());
        dequantize_fp8_row(q.data(), scales.data(), kH, fmt, f.data());
        for (int64_t h = 0; h < kH; ++h) out[t * kH + h] = f32_to_bf16(f[h]);
    }
    return out;
}

struct RankData {
    int64_t tokens = 0;
    std::vector<int32_t> ids;
    std::vector<float> weights;
    std::vector<uint16_t> x;
};

// Reference: the full model's session on the wire-rounded inputs, plus each route's bare output
// (for the tolerance). Counts elements outside tolerance.
int64_t check_rank(ft_session *full, int32_t layer, const RankData &d, WireDtype dtype, const std::vector<uint16_t> &got,
                   double *worst) {
    if (d.tokens == 0) return 0;
    const std::vector<uint16_t> xr = wire_rounded(d.x, d.tokens, dtype);
    std::vector<uint16_t> ref(d.x.size());
    EXPECT_EQ(ft_decode(full, layer, int32_t(d.tokens), xr.data(), d.ids.data(), d.weights.data(), ref.data()), FT_OK)
        << ft_session_last_error(full);
    // Route outputs: token t route j as row t*K+j with a single route of weight 1.
    const int64_t rows = d.tokens * kK;
    std::vector<uint16_t> xs(size_t(rows) * kH), ys(size_t(rows) * kH);
    std::vector<int32_t> ids(size_t(rows) * kK, -1);
    std::vector<float> ws(size_t(rows) * kK, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(xr.data() + (r / kK) * kH, kH, xs.data() + r * kH);
        ids[r * kK] = d.ids[r];
        ws[r * kK] = 1.0f;
    }
    EXPECT_EQ(ft_decode(full, layer, int32_t(rows), xs.data(), ids.data(), ws.data(), ys.data()), FT_OK)
        << ft_session_last_error(full);
    int64_t bad = 0;
    for (int64_t t = 0; t < d.tokens; ++t) {
        double scale = 0;  // sum over routes of |w| * rms(route output)
        for (int32_t j = 0; j < kK; ++j) {
            if (d.ids[t * kK + j] < 0) continue;
            double ss = 0;
            for (int64_t h = 0; h < kH; ++h) {
                const double v = bf16_to_f32(ys[(t * kK + j) * kH + h]);
                ss += v * v;
            }
            scale += std::fabs(d.weights[t * kK + j]) * std::sqrt(ss / kH);
        }
        for (int64_t h = 0; h < kH; ++h) {
            const double r = bf16_to_f32(ref[t * kH + h]), g = bf16_to_f32(got[t * kH + h]);
            const double tol = 0x1p-5 * scale + 0x1p-7 * std::fabs(r) + 1e-30;
            *worst = std::max(*worst, std::fabs(g - r) / tol);
            if (!(std::fabs(g - r) <= tol)) ++bad;
        }
    }
    return bad;
}

enum class Drive { Throughput, Latency, LatencyGraph };

struct SessionCase {
    int32_t R;
    WireDtype dtype;
    Drive drive;
    int64_t T;
    int32_t rows_per_call;
    uint64_t seed;
};

void run_case(const SessionCase &c) {
    SCOPED_TRACE(ft::cat("R=", c.R, " dtype=", int(c.dtype), " drive=", int(c.drive), " T=", c.T));
    Rng rng(c.seed);
    const int32_t E = 4 * c.R;
    const Weights w(E, rng);
    const Placement p = replica_placement(E, c.R);
    const int32_t S = p.slots_per_rank;
    Engine engine;
    ASSERT_NE(engine.e, nullptr);

    Handles full;
    build(engine.e, w, [&] {
        std::vector<int32_t> all(E);
        for (int32_t e = 0; e < E; ++e) all[e] = e;
        return all;
    }(), kK, FT_BACKEND_GPU, 512, full);
    std::vector<std::unique_ptr<Handles>> local(c.R);
    for (int32_t r = 0; r < c.R; ++r) {
        local[r] = std::make_unique<Handles>();
        const std::vector<int32_t> mine(p.phy2log.begin() + r * S, p.phy2log.begin() + (r + 1) * S);
        // Rank models of top_k 1 and of the global K both work; alternate. Even ranks resident,
        // odd ranks through the offload slot cache.
        build(engine.e, w, mine, r % 2 ? kK : 1, r % 2 ? FT_BACKEND_OFFLOAD : FT_BACKEND_GPU, c.rows_per_call, *local[r]);
        if (::testing::Test::HasFatalFailure()) return;
    }

    std::vector<RankData> data(c.R);
    for (int32_t r = 0; r < c.R; ++r) {
        RankData &d = data[r];
        d.tokens = r == 1 ? std::max<int64_t>(c.T / 3, 1) : c.T;
        d.ids = ft::test::random_routing(rng, d.tokens, kK, E);
        d.weights.resize(d.ids.size());
        for (float &x : d.weights) x = static_cast<float>(rng.uniform());
        d.x.resize(size_t(d.tokens) * kH);
        for (uint16_t &x : d.x) x = f32_to_bf16(static_cast<float>(rng.uniform() * 2 - 1));
    }

    const bool threaded = c.drive == Drive::Throughput;
    ft::test::SimHub hub(c.R, threaded);
    std::vector<std::unique_ptr<ft::test::SimTransport>> net;
    std::vector<std::unique_ptr<epc::EpRank>> ranks;
    std::vector<std::unique_ptr<epc::SessionExperts>> adapters;
    epc::EpConfig cfg;
    cfg.top_k = kK;
    cfg.hidden = kH;
    cfg.max_tokens = c.T;
    cfg.dispatch_dtype = c.dtype;
    cfg.mode = threaded ? epc::Mode::Throughput : epc::Mode::Latency;
    cfg.chunks = threaded ? 3 : 0;  // several chunks: one expert call each
    std::vector<DeviceArray<int32_t>> ids;
    std::vector<DeviceArray<float>> wts;
    std::vector<DeviceArray<uint16_t>> xs, outs;
    for (int32_t r = 0; r < c.R; ++r) {
        net.push_back(std::make_unique<ft::test::SimTransport>(hub, r));
        ranks.push_back(std::make_unique<epc::EpRank>(*net[r], p, cfg));
        ft_model_info mi;
        mi.struct_size = sizeof mi;
        ASSERT_EQ(ft_model_get_info(local[r]->model, &mi), FT_OK);
        adapters.push_back(std::make_unique<epc::SessionExperts>(mi.top_k, c.rows_per_call));
        ids.emplace_back(data[r].ids);
        wts.emplace_back(data[r].weights);
        xs.emplace_back(data[r].x);
        outs.emplace_back(std::max<size_t>(data[r].x.size(), 1));
    }
    const int32_t layer = 1;
    auto expert = [&](int32_t r) -> epc::ExpertFn {
        ft_session *s = local[r]->session;
        epc::SessionExperts *a = adapters[r].get();
        return [s, a, threaded](const epc::ExpertBatch &b, cudaStream_t st) {
            a->run(b, threaded,
                   [s](int32_t rows, const uint16_t *x, const int32_t *id, const float *wt, uint16_t *y, cudaStream_t st2) {
                       const ft_status e = ft_decode_cuda(s, layer, rows, x, id, wt, y, st2);
                       if (e != FT_OK) ft::fail(e, "ft_decode_cuda: ", ft_session_last_error(s));
                   },
                   st);
        };
    };

    if (threaded) {
        std::vector<std::string> errors(c.R);
        std::vector<std::thread> threads;
        for (int32_t r = 0; r < c.R; ++r)
            threads.emplace_back([&, r] {
                try {
                    cudaStream_t st;
                    cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
                    ranks[r]->forward(ids[r].ptr, wts[r].ptr, xs[r].ptr, data[r].tokens, expert(r), outs[r].ptr, st);
                    cuda_ok(cudaStreamSynchronize(st), "sync");
                    cudaStreamDestroy(st);
                } catch (const std::exception &e) {
                    errors[r] = e.what();
                    hub.abort(ft::cat("rank ", r, " failed: ", e.what()));
                }
            });
        for (std::thread &t : threads) t.join();
        for (int32_t r = 0; r < c.R; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
    } else {
        cudaStream_t st;
        cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
        auto step = [&] {
            for (int32_t r = 0; r < c.R; ++r)
                ranks[r]->dispatch_send(ids[r].ptr, wts[r].ptr, xs[r].ptr, data[r].tokens, st);
            for (int32_t r = 0; r < c.R; ++r) {
                ranks[r]->dispatch_recv(st);
                expert(r)(ranks[r]->batch(), st);
                ranks[r]->combine_send(st);
            }
            for (int32_t r = 0; r < c.R; ++r) ranks[r]->combine_recv(outs[r].ptr, st);
        };
        if (c.drive == Drive::LatencyGraph) {
            // Capture on zero inputs, replay on the real ones: the graph must read the buffers.
            for (int32_t r = 0; r < c.R; ++r) cudaMemset(xs[r].ptr, 0, data[r].x.size() * 2);
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            cuda_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
            step();
            cuda_ok(cudaStreamEndCapture(st, &graph), "end capture");
            cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
            for (int32_t r = 0; r < c.R; ++r) xs[r].upload(data[r].x);
            cuda_ok(cudaGraphLaunch(exec, st), "replay");
            cuda_ok(cudaStreamSynchronize(st), "sync");
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        } else {
            step();
            cuda_ok(cudaStreamSynchronize(st), "sync");
        }
        cudaStreamDestroy(st);
    }
    cuda_ok(cudaDeviceSynchronize(), "EP step");
    int64_t bad = 0;
    double worst = 0;
    for (int32_t r = 0; r < c.R; ++r) {
        EXPECT_FALSE(ranks[r]->overflowed(nullptr)) << "rank " << r;
        EXPECT_EQ(ft_session_status(local[r]->session), FT_OK) << "rank " << r;
        const std::vector<uint16_t> got = outs[r].download(data[r].x.size());
        bad += check_rank(full.session, layer, data[r], c.dtype, got, &worst);
    }
    EXPECT_EQ(bad, 0) << "worst error / tolerance " << worst;
    EXPECT_LT(worst, 1.0);
}

TEST(EpCudaSession, ThroughputWithGpuAndOffloadSessionsEqualsFullModel) {
    REQUIRE_GPU();
    // rows_per_call 96 >= the sessions' prefill_min_tokens (64): large chunks take the sessions'
    // prefill path, the remainders the decode kernels.
    run_case({2, WireDtype::Fp8Fp32, Drive::Throughput, 48, 96, 701});
    run_case({3, WireDtype::Fp8Ue8m0, Drive::Throughput, 40, 96, 702});
    run_case({4, WireDtype::Bf16, Drive::Throughput, 33, 96, 703});
}

TEST(EpCudaSession, LatencyWithGpuAndOffloadSessionsEqualsFullModel) {
    REQUIRE_GPU();
    // rows_per_call 48 < 64: decode path only, no host sync; every max_expert_rows row covered.
    run_case({2, WireDtype::Fp8Ue8m0, Drive::Latency, 8, 48, 711});
    run_case({4, WireDtype::Fp8Fp32, Drive::Latency, 5, 48, 712});
}

TEST(EpCudaSession, LatencyGraphReplayWithSessionsEqualsFullModel) {
    REQUIRE_GPU();
    run_case({3, WireDtype::Fp8Fp32, Drive::LatencyGraph, 4, 40, 721});
}

// A one-rank NCCL group on device 0 (latency mode: latency_rows expert rows; bf16_wire: rows
// travel as bf16, else the default wire), or null with a test failure.
ft_ep_group *one_rank_group(int32_t experts, int32_t mode, int32_t max_tokens, int64_t latency_rows, bool bf16_wire) {
    ft_ep_params prm;
    ft_ep_params_init(&prm);
    prm.num_experts = experts;
    prm.top_k = kK;
    prm.hidden = kH;
    prm.max_tokens = max_tokens;
    prm.mode = mode;
    if (bf16_wire) prm.wire = FT_EP_WIRE_BF16;
    prm.max_expert_rows = mode == FT_EP_MODE_LATENCY ? latency_rows : 0;
    ft_ep_group *g = nullptr;
    char err[256];
    const int32_t dev = 0;
    EXPECT_EQ(ft_ep_group_bootstrap_local(1, &dev, &prm, &g, err, sizeof err), FT_OK) << err;
    return g;
}

// The C entry point on a one-rank NCCL group: validation, then the same result as above.
TEST(EpCudaSession, CApiForwardSessionOneRank) {
    REQUIRE_GPU();
    std::string why;
    if (!epc::NcclTransport::available(&why)) GTEST_SKIP() << why;
    Rng rng(731);
    const int32_t E = 8;
    const Weights w(E, rng);
    Engine engine;
    ASSERT_NE(engine.e, nullptr);
    std::vector<int32_t> all(E);
    for (int32_t e = 0; e < E; ++e) all[e] = e;
    Handles full, rank, wrong;
    build(engine.e, w, all, kK, FT_BACKEND_GPU, 512, full);
    build(engine.e, w, all, 1, FT_BACKEND_OFFLOAD, 32, rank);
    build(engine.e, w, std::vector<int32_t>(all.begin(), all.begin() + 4), 1, FT_BACKEND_GPU, 32, wrong);
    if (::testing::Test::HasFatalFailure()) return;
    RankData d;
    d.tokens = 20;
    d.ids = ft::test::random_routing(rng, d.tokens, kK, E);
    d.weights.resize(d.ids.size());
    for (float &x : d.weights) x = static_cast<float>(rng.uniform());
    d.x.resize(size_t(d.tokens) * kH);
    for (uint16_t &x : d.x) x = f32_to_bf16(static_cast<float>(rng.uniform() * 2 - 1));
    DeviceArray<int32_t> ids(d.ids);
    DeviceArray<float> wts(d.weights);
    DeviceArray<uint16_t> x(d.x), out(d.x.size());
    for (int32_t mode : {FT_EP_MODE_THROUGHPUT, FT_EP_MODE_LATENCY}) {
        ft_ep_group *g = one_rank_group(E, mode, 32, 96, false);
        ASSERT_NE(g, nullptr);
        ft_ep_group_info info;
        info.struct_size = sizeof info;
        ASSERT_EQ(ft_ep_group_info_get(g, &info), FT_OK);
        EXPECT_NE(std::string(info.pci_bus_id), "");
        EXPECT_EQ(info.p2p_known, 1u);
        EXPECT_EQ(info.calibrated_bytes_per_s, 0.0);  // one rank: nothing to measure
        EXPECT_EQ(info.link_bytes_per_s, 25e9);
        EXPECT_EQ(ft_ep_forward_session(g, wrong.session, wrong.model, 32, 0, ids.ptr, wts.ptr, x.ptr, d.tokens,
                                        out.ptr, nullptr),
                  FT_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(ft_ep_group_last_error(g)).find("slots per rank"), std::string::npos)
            << ft_ep_group_last_error(g);
        EXPECT_EQ(ft_ep_forward_session(g, rank.session, rank.model, 32, kL, ids.ptr, wts.ptr, x.ptr, d.tokens,
                                        out.ptr, nullptr),
                  FT_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(ft_ep_forward_session(g, rank.session, rank.model, 0, 0, ids.ptr, wts.ptr, x.ptr, d.tokens,
                                        out.ptr, nullptr),
                  FT_ERR_INVALID_ARGUMENT);
        cudaMemset(out.ptr, 0xff, d.x.size() * 2);
        ASSERT_EQ(ft_ep_forward_session(g, rank.session, rank.model, 32, 1, ids.ptr, wts.ptr, x.ptr, d.tokens,
                                        out.ptr, nullptr),
                  FT_OK)
            << ft_ep_group_last_error(g);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        double worst = 0;
        EXPECT_EQ(check_rank(full.session, 1, d, WireDtype::Fp8Fp32, out.download(d.x.size()), &worst), 0)
            << "mode " << mode << ", worst error / tolerance " << worst;
        ft_ep_group_free(g);
    }
}

// A session on `model` without finite checks (offload: one layer's `experts` slots), or null
// with a test failure.
ft_session *open_synth_session(ft_model *model, int32_t backend, int32_t max_tokens, bool shared, int32_t experts) {
    ft_session_params p;
    ft_session_params_init(&p);
    p.backend = backend;
    p.max_tokens = max_tokens;
    p.shared_experts = shared;
    p.check_finite = false;
    if (backend == FT_BACKEND_OFFLOAD) p.cache_slots = experts;
    ft_session *out = nullptr;
    char err[512];
    EXPECT_EQ(ft_session_create(model, &p, &out, err, sizeof err), FT_OK) << err;
    return out;
}

// The synthetic checkpoint of `s` written under `dir` and loaded, or null with a test failure.
ft_model *load_synth(ft_engine *engine, const ft::synth::Spec &s, const std::string &dir) {
    const std::string path = ft::test::write_synth_model(dir, s);
    ft_model *model = nullptr;
    char err[512];
    EXPECT_EQ(ft_model_load(engine, path.c_str(), nullptr, &model, err, sizeof err), FT_OK) << err;
    return model;
}

// A session with shared experts on a one-rank NCCL group: the expert rows are computed without
// the shared expert and the group adds it once per token after the combine (in chunks of the
// rank session's max_tokens), so the output is the whole-model session's. A shared expert added
// per expert row would come back weighted by the routes and fail the comparison.
TEST(EpCudaSession, CApiForwardSessionAddsTheSharedExpertOncePerToken) {
    REQUIRE_GPU();
    std::string why;
    if (!epc::NcclTransport::available(&why)) GTEST_SKIP() << why;
    ft::synth::Spec s;
    s.architecture = "qwen3_5_moe";  // sigmoid-gated shared expert
    s.num_layers = 2;
    s.num_experts = 8;
    s.top_k = kK;
    s.hidden = kH;
    s.intermediate = kI;
    s.shared_intermediate = 96;
    ft::test::ScratchDir dir;
    Engine engine;
    ASSERT_NE(engine.e, nullptr);
    ft_model *model = load_synth(engine.e, s, dir.path());
    ASSERT_NE(model, nullptr);
    Handles full, rank, routed;  // the model is freed by `full`
    full.model = model;
    auto open = [&](int32_t backend, int32_t max_tokens, bool shared, ft_session **out) {
        *out = open_synth_session(model, backend, max_tokens, shared, s.num_experts);
        ASSERT_NE(*out, nullptr);
    };
    open(FT_BACKEND_GPU, 64, true, &full.session);
    open(FT_BACKEND_OFFLOAD, 16, true, &rank.session);
    open(FT_BACKEND_GPU, 64, false, &routed.session);
    if (::testing::Test::HasFatalFailure()) return;

    Rng rng(741);
    const int64_t T = 40;  // more than the rank session's 16: the shared pass runs in chunks
    const int32_t layer = 1;
    const std::vector<int32_t> h_ids = ft::test::random_routing(rng, T, kK, s.num_experts);
    std::vector<float> h_w(h_ids.size());
    for (float &x : h_w) x = static_cast<float>(rng.uniform());
    std::vector<uint16_t> h_x(size_t(T) * kH);
    for (uint16_t &x : h_x) x = f32_to_bf16(static_cast<float>(rng.uniform() * 2 - 1));
    std::vector<uint16_t> want(h_x.size()), bare(h_x.size());
    ASSERT_EQ(ft_decode(full.session, layer, int32_t(T), h_x.data(), h_ids.data(), h_w.data(), want.data()), FT_OK)
        << ft_session_last_error(full.session);
    ASSERT_EQ(ft_decode(routed.session, layer, int32_t(T), h_x.data(), h_ids.data(), h_w.data(), bare.data()), FT_OK)
        << ft_session_last_error(routed.session);
    std::vector<double> ref(want.size());
    for (size_t i = 0; i < want.size(); ++i) ref[i] = bf16_to_f32(want[i]);
    EXPECT_GT(ft::test::relative_error_bf16(bare, ref), 0.05) << "the shared expert must be a visible part of the output";

    DeviceArray<int32_t> ids(h_ids);
    DeviceArray<float> wts(h_w);
    DeviceArray<uint16_t> x(h_x), out(h_x.size());
    for (int32_t mode : {FT_EP_MODE_THROUGHPUT, FT_EP_MODE_LATENCY}) {
        SCOPED_TRACE(ft::cat("mode ", mode));
        ft_ep_group *g = one_rank_group(s.num_experts, mode, 64, T * kK, true);
        ASSERT_NE(g, nullptr);
        cudaMemset(out.ptr, 0xff, h_x.size() * 2);
        EXPECT_EQ(ft_ep_forward_session(g, rank.session, model, 16, layer, ids.ptr, wts.ptr, x.ptr, T, out.ptr, nullptr),
                  FT_OK)
            << ft_ep_group_last_error(g);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_LT(ft::test::relative_error_bf16(out.download(h_x.size()), ref), 1e-2);
        ft_ep_group_free(g);
    }
}

// A GGUF model whose layers mix block formats (Q4_K_M's q4_k gate/up with q6_k down, then q8_0
// with q4_k) on a one-rank NCCL group: the rank's offload session (one layer of slots, so every
// layer switch refills them in the other layer's formats) computes both layers' expert rows, and
// each layer's EP output is the whole-model gpu session's ft_decode.
TEST(EpCudaSession, CApiForwardSessionMixedGgufFormats) {
    REQUIRE_GPU();
    std::string why;
    if (!epc::NcclTransport::available(&why)) GTEST_SKIP() << why;
    ft::synth::Spec s;
    s.architecture = "qwen3_moe";
    s.gguf = true;
    s.format = "q4_k";
    s.gguf_mix = {"q4_k/q6_k", "q8_0/q4_k"};
    s.num_layers = 2;
    s.num_experts = 8;
    s.top_k = kK;
    s.hidden = kH;
    s.intermediate = kH;
    ft::test::ScratchDir dir;
    Engine engine;
    ASSERT_NE(engine.e, nullptr);
    ft_model *model = load_synth(engine.e, s, dir.path());
    ASSERT_NE(model, nullptr);
    Handles full, rank;  // the model is freed by `full`
    full.model = model;
    ft_model_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_model_get_info(model, &info), FT_OK);
    ASSERT_EQ(info.mixed_formats, 1);
    auto open = [&](int32_t backend, int32_t max_tokens, ft_session **out) {
        *out = open_synth_session(model, backend, max_tokens, false, s.num_experts);
        ASSERT_NE(*out, nullptr);
    };
    open(FT_BACKEND_GPU, 64, &full.session);
    open(FT_BACKEND_OFFLOAD, 16, &rank.session);
    if (::testing::Test::HasFatalFailure()) return;

    Rng rng(751);
    const int64_t T = 24;
    const std::vector<int32_t> h_ids = ft::test::random_routing(rng, T, kK, s.num_experts);
    std::vector<float> h_w(h_ids.size());
    for (float &x : h_w) x = static_cast<float>(rng.uniform());
    std::vector<uint16_t> h_x(size_t(T) * kH);
    for (uint16_t &x : h_x) x = f32_to_bf16(static_cast<float>(rng.uniform() * 2 - 1));
    DeviceArray<int32_t> ids(h_ids);
    DeviceArray<float> wts(h_w);
    DeviceArray<uint16_t> x(h_x), out(h_x.size());
    for (int32_t mode : {FT_EP_MODE_THROUGHPUT, FT_EP_MODE_LATENCY}) {
        ft_ep_group *g = one_rank_group(s.num_experts, mode, 64, T * kK, true);
        ASSERT_NE(g, nullptr);
        for (int32_t layer = 0; layer < s.num_layers; ++layer) {
            SCOPED_TRACE(ft::cat("mode ", mode, ", layer ", layer));
            int32_t gu = 0, dn = 0;
            ASSERT_EQ(ft_model_layer_formats(model, layer, &gu, &dn), FT_OK);
            EXPECT_NE(gu, dn);  // the two matrices of each layer differ in format
            std::vector<uint16_t> want(h_x.size());
            ASSERT_EQ(ft_decode(full.session, layer, int32_t(T), h_x.data(), h_ids.data(), h_w.data(), want.data()),
                      FT_OK)
                << ft_session_last_error(full.session);
            std::vector<double> ref(want.size());
            for (size_t i = 0; i < want.size(); ++i) ref[i] = bf16_to_f32(want[i]);
            cudaMemset(out.ptr, 0xff, h_x.size() * 2);
            EXPECT_EQ(ft_ep_forward_session(g, rank.session, model, 16, layer, ids.ptr, wts.ptr, x.ptr, T, out.ptr,
                                            nullptr),
                      FT_OK)
                << ft_ep_group_last_error(g);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            EXPECT_LT(ft::test::relative_error_bf16(out.download(h_x.size()), ref), 1e-2);
        }
        ft_ep_group_free(g);
    }
}

// The topology probe over ranks simulated on one GPU: every rank sees every bus id (all the
// same device here), knows the P2P status of all, and all agree on one calibrated rate.
TEST(EpCudaSession, ProbeTopologyOverSimulatedRanks) {
    REQUIRE_GPU();
    for (int32_t R : {2, 4}) {
        ft::test::SimHub hub(R, true);
        std::vector<std::unique_ptr<ft::test::SimTransport>> net;
        for (int32_t r = 0; r < R; ++r) net.push_back(std::make_unique<ft::test::SimTransport>(hub, r));
        std::vector<epc::RankTopology> topo(R);
        std::vector<std::string> errors(R);
        std::vector<std::thread> threads;
        for (int32_t r = 0; r < R; ++r)
            threads.emplace_back([&, r] {
                try {
                    cuda_ok(cudaSetDevice(0), "cudaSetDevice");
                    topo[r] = epc::probe_topology(*net[r], 0, size_t(16) << 20);
                } catch (const std::exception &e) {
                    errors[r] = e.what();
                    hub.abort(e.what());
                }
            });
        for (std::thread &t : threads) t.join();
        for (int32_t r = 0; r < R; ++r) {
            ASSERT_EQ(errors[r], "") << "rank " << r;
            const epc::RankTopology &t = topo[r];
            EXPECT_NE(t.bus_id, "");
            EXPECT_EQ(t.bus_id, ft::ep::normalize_pci_bus_id(t.bus_id));
            ASSERT_EQ(t.peer_bus.size(), size_t(R));
            for (const std::string &b : t.peer_bus) EXPECT_EQ(b, t.bus_id);
            EXPECT_EQ(t.p2p_known, (uint64_t(1) << R) - 1);
            EXPECT_TRUE(t.p2p_mask & (uint64_t(1) << r));
            EXPECT_GT(t.calibrated_bytes_per_s, 1e8);
            EXPECT_EQ(t.calibrated_bytes_per_s, topo[0].calibrated_bytes_per_s);  // the same minimum everywhere
            EXPECT_GT(t.calibration_seconds, 0.0);
            std::printf("%s\n", epc::describe(t, r).c_str());
        }
    }
}

}  // namespace
