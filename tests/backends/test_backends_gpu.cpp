// The GPU session backends through the public C API: `gpu` and `offload` against `cpu` and the
// fp64 reference on every expert format, through many evictions, on the decode and the prefill
// paths, from host and from device pointers, eager and replayed from a CUDA graph.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fresh_seed.hpp"
#include "ft/dequant.hpp"
#include "ft/synth.hpp"
#include "gpu_sessions.hpp"
#include "synth_reference.hpp"

namespace {

using namespace ft::test;

struct FormatCase {
    const char *name;
    ft::synth::Spec spec;
    double bound;  // relative error vs the fp64 reference, and gpu vs cpu
};

std::vector<FormatCase> cases() {
    auto base = [](const char *arch, const char *format, int hidden, int inter) {
        ft::synth::Spec s;
        s.architecture = arch;
        s.format = format;
        s.num_layers = 3;
        s.num_experts = 16;
        s.top_k = 4;
        s.hidden = hidden;
        s.intermediate = inter;
        return s;
    };
    std::vector<FormatCase> c;
    c.push_back({"bf16", base("qwen3_moe", "bf16", 256, 96), 1e-2});
    c.push_back({"fp8_block", base("deepseek_v3", "fp8_block", 256, 128), 1e-2});
    c.push_back({"nvfp4", base("qwen3_moe", "nvfp4", 160, 96), 1e-2});
    c.push_back({"mxfp4", base("gpt_oss", "mxfp4", 128, 64), 1e-2});
    c.push_back({"ds_fp4", base("deepseek_v4", "ds_fp4", 256, 128), 1.5e-2});
    // GGUF block formats (W*A8: the integer-dot decode kernel on the GPU, the CPU's kernels).
    ft::synth::Spec q = base("qwen3_moe", "q4_0", 128, 64);
    q.gguf = true;
    c.push_back({"q4_0", q, 3e-2});
    // The K-quants and iq4_xs quantise activations per 256 (Q8_K, as ggml does) on the CPU and in
    // the GPU's integer-dot kernel: their error against the unquantised fp64 reference reaches
    // ~3.6e-2 on these layers, against ~2e-2 for Q8_0's per 32.
    for (const char *f : {"q8_0", "q4_k", "q6_k", "iq4_xs"}) {
        ft::synth::Spec g = base("qwen3_moe", f, 256, 256);
        g.gguf = true;
        c.push_back({f, g, std::string(f) == "q8_0" ? 3e-2 : 5e-2});
    }
    return c;
}

void PrintTo(const FormatCase &c, std::ostream *os) { *os << c.name; }

// Shared experts on every GPU backend (with and without Qwen's sigmoid gate, widths that are not
// a multiple of the kernels' tiles): ft_decode equals the cpu backend on the decode and prefill
// paths and from a device pointer that is only 2-byte aligned. Llama-4 (shared expert and top-1
// input-scaled routes) is checked on every backend by the golden tests.
TEST(SharedExpertsGpu, EveryBackendMatchesCpu) {
    auto engine = make_engine();
    if (!gpu_engine(engine.get())) GTEST_SKIP() << "no usable GPU";
    struct Case {
        const char *arch;
        int shared, top_k;
    };
    for (const Case k : {Case{"qwen3_5_moe", 72, 2}, Case{"deepseek_v3", 128, 2}}) {
        SCOPED_TRACE(k.arch);
        ft::synth::Spec s;
        s.architecture = k.arch;
        s.num_layers = 2;
        s.num_experts = 8;
        s.top_k = k.top_k;
        s.hidden = 128;
        s.intermediate = 64;
        s.shared_intermediate = k.shared;
        ScratchDir dir;
        const std::string path = write_synth_model(dir.path(), s);
        ft_model *raw = nullptr;
        char err[512];
        ASSERT_EQ(ft_model_load(engine.get(), path.c_str(), nullptr, &raw, err, sizeof err), FT_OK) << err;
        ModelPtr model(raw);
        ft_model_info info;
        info.struct_size = sizeof info;
        ASSERT_EQ(ft_model_get_info(raw, &info), FT_OK);
        ASSERT_EQ(info.shared_intermediate_size, k.shared);
        const int kMaxTokens = 96;
        // The session defaults for the hybrid fraction (0: profile or 0.5) and adaptation (on).
        std::vector<SessionPtr> sessions;
        for (int32_t b : {FT_BACKEND_CPU, FT_BACKEND_GPU, FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID}) {
            sessions.push_back(open_session(raw, b, kMaxTokens,
                                            b == FT_BACKEND_OFFLOAD || b == FT_BACKEND_HYBRID ? s.num_experts : 0, 0.0f,
                                            true, 10.0, true));
            ASSERT_TRUE(sessions.back());
        }
        SessionPtr no_shared = open_session(raw, FT_BACKEND_CPU, kMaxTokens);
        ASSERT_TRUE(no_shared);

        std::mt19937 rng(fresh_seed("SharedExpertsGpu.EveryBackendMatchesCpu"));
        std::normal_distribution<float> n(0.f, 1.5f);
        const int E = info.num_experts, K = info.top_k, H = info.hidden_size;
        for (int T : {1, 3, 8, 13, 80}) {
            for (int l = 0; l < info.num_layers; ++l) {
                std::vector<float> logits(size_t(T) * E);
                for (float &v : logits) v = n(rng);
                std::vector<int32_t> ids(size_t(T) * K);
                std::vector<float> w(size_t(T) * K);
                ASSERT_EQ(ft_route(sessions[0].get(), l, T, logits.data(), ids.data(), w.data()), FT_OK);
                const auto x = random_bf16(rng, size_t(T) * H, 1.0f);
                std::vector<uint16_t> y_cpu(size_t(T) * H), y_routed(size_t(T) * H);
                ASSERT_EQ(ft_decode(sessions[0].get(), l, T, x.data(), ids.data(), w.data(), y_cpu.data()), FT_OK);
                ASSERT_EQ(ft_decode(no_shared.get(), l, T, x.data(), ids.data(), w.data(), y_routed.data()), FT_OK);
                const std::vector<double> cpu_ref = as_f64(y_cpu);
                // The shared expert is a visible part of the output (the comparison below could fail).
                EXPECT_GT(ft::test::relative_error_bf16(y_routed, cpu_ref), 0.05) << "T " << T;
                for (size_t b = 1; b < sessions.size(); ++b) {
                    std::vector<uint16_t> y(size_t(T) * H, 0x7fc0);
                    ASSERT_EQ(ft_decode(sessions[b].get(), l, T, x.data(), ids.data(), w.data(), y.data()), FT_OK)
                        << ft_session_last_error(sessions[b].get());
                    EXPECT_LT(ft::test::relative_error_bf16(y, cpu_ref), 1e-2) << "backend " << b << " T " << T;
                }
                // Device pointers, the hidden states one bf16 off a 4-byte boundary.
                if (T < 64) {
                    DeviceCall dc(T, H, K, true);
                    dc.upload(x, ids, w);
                    EXPECT_EQ(dc.run(sessions[1].get(), l, T), FT_OK) << ft_session_last_error(sessions[1].get());
                    EXPECT_LT(ft::test::relative_error_bf16(dc.output(), cpu_ref), 1e-2) << "device pointers, T " << T;
                }
            }
        }
    }
}

class Backends : public ::testing::TestWithParam<FormatCase> {};

// cpu, gpu and offload (one layer of slots: every layer change evicts) decode the same calls;
// offload must equal gpu bit for bit (same kernels, same weights), both must match the CPU and
// the fp64 reference within the format's bound, and the slot cache figures must add up.
TEST_P(Backends, GpuAndOffloadMatchCpuAndReference) {
    const FormatCase &c = GetParam();
    auto engine = make_engine();
    if (!gpu_engine(engine.get())) GTEST_SKIP() << "no usable GPU";
    const ft::synth::Spec &s = c.spec;
    ScratchDir dir;
    const std::string path = write_synth_model(dir.path(), s);
    ft_model *raw = nullptr;
    char err[512];
    ASSERT_EQ(ft_model_load(engine.get(), path.c_str(), nullptr, &raw, err, sizeof err), FT_OK) << err;
    ModelPtr model(raw);
    ft_model_info info;
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_model_get_info(raw, &info), FT_OK);
    ASSERT_EQ(info.pinned_bytes, info.bank_bytes);

    const int kMaxTokens = 96;  // > the default prefill threshold of 64
    BackendSessions b(raw, kMaxTokens, s.num_experts, 0.4f);  // offload and hybrid: one layer of slots
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(ft_session_backend(b.hybrid.get()), FT_BACKEND_HYBRID);
    EXPECT_EQ(ft_session_backend(b.gpu.get()), FT_BACKEND_GPU);
    EXPECT_EQ(ft_session_backend(b.offload.get()), FT_BACKEND_OFFLOAD);

    ft::test::ActivationRef act{info.activation, info.swiglu_alpha, info.swiglu_limit};
    ft::test::FormatNumerics fmt;
    if (info.format == FT_FORMAT_DS_FP4) {
        fmt.ds_fp4 = true;
        fmt.ds_limit = info.activation == FT_ACT_SILU && std::isfinite(info.swiglu_limit) ? info.swiglu_limit : 0.0;
        fmt.fp8_round_trip = [](const float *x, int64_t K, float *y) { ft::fp8_round_trip_per128(x, K, y); };
    }
    const int L = info.num_layers, E = info.num_experts, K = info.top_k, H = info.hidden_size, I = info.intermediate_size;
    std::vector<SynthLayerRef> layer_ref;
    for (int l = 0; l < L; ++l) layer_ref.emplace_back(s, l, E);

    std::mt19937 rng(1234 + info.format);
    RouteTally tally;
    const int kSteps = 12;
    for (int step = 0; step < kSteps; ++step) {
        for (int l = 0; l < L; ++l) {
            // Mostly decode sizes; every fourth step one prefill-sized call.
            const int T = step % 4 == 3 ? 80 : std::vector<int>{1, 3, 8, 17}[(step + l) % 4];
            SCOPED_TRACE(::testing::Message() << c.name << " step " << step << " layer " << l << " T " << T);
            DecodeCall call;
            ASSERT_NO_FATAL_FAILURE(routed_call(b.cpu.get(), l, T, info, rng, &call));
            const auto ref = ft::test::moe_reference_f32([&](int32_t e) { return layer_ref[l].expert(e); }, E, act, fmt, H, I, T,
                                                         K, call.x.data(), call.ids.data(), call.w.data());
            BackendOutputs y;
            ASSERT_NO_FATAL_FAILURE(decode_on_every_backend(b, call, H, ref, c.bound, &y));
            tally.add(call);
        }
    }
    ft_session_stats st;
    st.struct_size = sizeof st;
    ASSERT_EQ(ft_session_get_stats(b.offload.get(), &st), FT_OK);
    EXPECT_EQ(st.cache_hits + st.cache_misses, tally.decode_distinct);
    EXPECT_EQ(st.fetched_experts, st.cache_misses);  // offload fetches every miss
    EXPECT_EQ(st.fetched_bytes, st.fetched_experts * info.expert_bytes);
    EXPECT_GT(st.cache_misses, uint64_t(E));  // one layer of slots: layers keep evicting each other
    EXPECT_EQ(st.prefill_calls, uint64_t(kSteps / 4 * L));
    ASSERT_EQ(ft_session_get_stats(b.gpu.get(), &st), FT_OK);
    EXPECT_EQ(st.cache_hits, tally.decode_distinct);
    EXPECT_EQ(st.cache_misses, 0u);
    uint64_t calls = 0;
    for (int l = 0; l < L; ++l) {
        ft_layer_stats ls;
        ls.struct_size = sizeof ls;
        ASSERT_EQ(ft_session_get_layer_stats(b.offload.get(), l, &ls), FT_OK);
        calls += ls.calls;
    }
    EXPECT_EQ(calls, tally.decode_calls);
    ft_layer_stats ls;
    ls.struct_size = sizeof ls;
    EXPECT_EQ(ft_session_get_layer_stats(b.offload.get(), L, &ls), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_session_status(b.offload.get()), FT_OK);

    // Hybrid: every route computed exactly once, by one side or the other; the CPU took some.
    ASSERT_EQ(ft_session_get_stats(b.hybrid.get(), &st), FT_OK);
    EXPECT_EQ(st.routes_gpu + st.routes_cpu, tally.valid_routes);
    EXPECT_GT(st.routes_cpu, 0u);
    EXPECT_GT(st.fetched_experts, 0u);
    EXPECT_LT(st.fetched_experts, st.cache_misses);  // f = 0.4: the CPU computed the rest
    EXPECT_FLOAT_EQ(st.hybrid_fraction, 0.4);
    // Per-side times: the CPU's for every task, the GPU's for the eager steps read back (a fixed
    // f is timed too); a step's GPU side is far below a second on these small models.
    EXPECT_GT(st.cpu_seconds, 0.0);
    EXPECT_GT(st.hybrid_timed_steps, 0u);
    EXPECT_LE(st.hybrid_timed_steps, st.decode_calls);
    EXPECT_GT(st.hybrid_gpu_seconds, 0.0);
    EXPECT_LT(st.hybrid_gpu_seconds / double(std::max<uint64_t>(st.hybrid_timed_steps, 1)), 1.0);
    EXPECT_EQ(ft_session_status(b.hybrid.get()), FT_OK);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, Backends, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<FormatCase> &i) { return std::string(i.param.name); });

struct Fixture {
    EnginePtr engine;
    ScratchDir dir;
    ModelPtr model;
    ft_model_info info{};
    bool ok = false;
    explicit Fixture(int layers = 4, int experts = 32, int hidden = 256, int inter = 128, int top_k = 4) {
        engine = make_engine();
        if (!gpu_engine(engine.get())) return;
        ft::synth::Spec s;
        s.num_layers = layers;
        s.num_experts = experts;
        s.top_k = top_k;
        s.hidden = hidden;
        s.intermediate = inter;
        ft::synth::write_checkpoint(dir.path(), s);
        ft_model *raw = nullptr;
        char err[512];
        EXPECT_EQ(ft_model_load(engine.get(), dir.path().c_str(), nullptr, &raw, err, sizeof err), FT_OK) << err;
        model.reset(raw);
        info.struct_size = sizeof info;
        ft_model_get_info(raw, &info);
        ok = raw != nullptr;
    }
};

// One CUDA graph holding ft_decode_cuda for every layer, replayed with new inputs each step,
// against an identical offload session driven eagerly from host pointers: the slot cache
// evolves the same way, so the outputs are identical bytes.
class GraphReplay : public ::testing::TestWithParam<int32_t> {};

TEST_P(GraphReplay, EqualsEagerThroughEvictions) {
    Fixture f;
    if (!f.ok) GTEST_SKIP() << "no usable GPU";
    const int E = f.info.num_experts, H = f.info.hidden_size, T = 4;
    auto graphed = open_session(f.model.get(), GetParam(), 16, E + 8, 0.5f);
    auto eager = open_session(f.model.get(), GetParam(), 16, E + 8, 0.5f);
    ASSERT_TRUE(graphed && eager);
    ASSERT_NO_FATAL_FAILURE(replay_layers_graph(
        graphed.get(), f.info, T, 30, 7, false, [&](int step, int l, const DecodeCall &in, const std::vector<uint16_t> &from_graph) {
            std::vector<uint16_t> from_eager(size_t(T) * H);
            ASSERT_EQ(ft_decode(eager.get(), l, T, in.x.data(), in.ids.data(), in.w.data(), from_eager.data()), FT_OK);
            ASSERT_EQ(0, std::memcmp(from_graph.data(), from_eager.data(), from_graph.size() * 2)) << "step " << step << " layer " << l;
        }));
    ft_session_stats a, b;
    a.struct_size = b.struct_size = sizeof a;
    ASSERT_EQ(ft_session_get_stats(graphed.get(), &a), FT_OK);
    ASSERT_EQ(ft_session_get_stats(eager.get(), &b), FT_OK);
    EXPECT_EQ(a.cache_misses, b.cache_misses);
    EXPECT_EQ(a.cache_hits, b.cache_hits);
    EXPECT_GT(a.cache_misses, uint64_t(E));
}

INSTANTIATE_TEST_SUITE_P(Backends, GraphReplay, ::testing::Values(FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID),
                         [](const ::testing::TestParamInfo<int32_t> &i) {
                             return std::string(i.param == FT_BACKEND_HYBRID ? "hybrid" : "offload");
                         });

// Eager device calls equal host calls; a prefill-sized device call during capture is refused
// with FT_ERR_STATE; pageable host pointers are refused; ids out of range are skipped.
TEST(BackendsDevice, DevicePathRules) {
    Fixture f;
    if (!f.ok) GTEST_SKIP() << "no usable GPU";
    const int E = f.info.num_experts, K = f.info.top_k, H = f.info.hidden_size;
    auto gpu = open_session(f.model.get(), FT_BACKEND_GPU, 128);
    ASSERT_TRUE(gpu);
    std::mt19937 rng(3);
    const int T = 5;
    DeviceCall dc(T, H, K);
    auto x = random_bf16(rng, size_t(T) * H, 1.0f);
    auto ids = distinct_ids(rng, T, K, E);
    std::vector<float> w(size_t(T) * K, 0.25f);
    dc.upload(x, ids, w);
    ASSERT_EQ(ft_decode_cuda(gpu.get(), 1, T, dc.x, dc.ids, dc.w, dc.y, nullptr), FT_OK) << ft_session_last_error(gpu.get());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> dev(size_t(T) * H), host(size_t(T) * H);
    ASSERT_EQ(cudaMemcpy(dev.data(), dc.y, dev.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(ft_decode(gpu.get(), 1, T, x.data(), ids.data(), w.data(), host.data()), FT_OK);
    EXPECT_EQ(0, std::memcmp(dev.data(), host.data(), dev.size() * 2));

    // Pageable host memory is not device memory.
    EXPECT_EQ(ft_decode_cuda(gpu.get(), 1, T, x.data(), dc.ids, dc.w, dc.y, nullptr), FT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(ft_session_last_error(gpu.get())).find("device"), std::string::npos);

    // Ids >= E on the device path are skipped: same result as those routes set to -1 on the host.
    auto bad = ids;
    bad[2] = E + 5;
    auto skipped = ids;
    skipped[2] = -1;
    dc.upload(x, bad, w);
    ASSERT_EQ(ft_decode_cuda(gpu.get(), 1, T, dc.x, dc.ids, dc.w, dc.y, nullptr), FT_OK);
    ASSERT_EQ(cudaMemcpy(dev.data(), dc.y, dev.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(ft_decode(gpu.get(), 1, T, x.data(), skipped.data(), w.data(), host.data()), FT_OK);
    EXPECT_EQ(0, std::memcmp(dev.data(), host.data(), dev.size() * 2));

    // Prefill-sized calls cannot be captured.
    const int P = 100;
    DeviceCall big(P, H, K);
    big.upload(random_bf16(rng, size_t(P) * H, 1.0f), distinct_ids(rng, P, K, E), std::vector<float>(size_t(P) * K, 0.1f));
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    EXPECT_EQ(ft_decode_cuda(gpu.get(), 0, P, big.x, big.ids, big.w, big.y, stream), FT_ERR_STATE);
    cudaGraph_t graph;
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    // ...but run eagerly.
    EXPECT_EQ(ft_decode_cuda(gpu.get(), 0, P, big.x, big.ids, big.w, big.y, stream), FT_OK) << ft_session_last_error(gpu.get());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaStreamDestroy(stream);

    // A CPU session has no device path.
    auto cpu = open_session(f.model.get(), FT_BACKEND_CPU, 16);
    EXPECT_EQ(ft_decode_cuda(cpu.get(), 1, T, dc.x, dc.ids, dc.w, dc.y, nullptr), FT_ERR_UNSUPPORTED);
}

// Prefill streams whole layers through its own buffers: the decode working set stays resident.
TEST(BackendsDevice, PrefillDoesNotEvictTheDecodeWorkingSet) {
    Fixture f;
    if (!f.ok) GTEST_SKIP() << "no usable GPU";
    const int E = f.info.num_experts, K = f.info.top_k, H = f.info.hidden_size;
    auto off = open_session(f.model.get(), FT_BACKEND_OFFLOAD, 128, E);  // one layer of slots
    ASSERT_TRUE(off);
    std::mt19937 rng(11);
    const int T = 2;
    auto x = random_bf16(rng, size_t(T) * H, 1.0f);
    std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};
    std::vector<float> w(size_t(T) * K, 0.25f);
    std::vector<uint16_t> y(size_t(T) * H);
    ASSERT_EQ(ft_decode(off.get(), 0, T, x.data(), ids.data(), w.data(), y.data()), FT_OK);
    for (int l : {1, 2, 3, 1}) {  // prefill of other layers, whole layers each
        const int P = 100;
        auto px = random_bf16(rng, size_t(P) * H, 1.0f);
        auto pids = distinct_ids(rng, P, K, E);
        std::vector<float> pw(size_t(P) * K, 0.1f);
        std::vector<uint16_t> py(size_t(P) * H);
        ASSERT_EQ(ft_decode(off.get(), l, P, px.data(), pids.data(), pw.data(), py.data()), FT_OK) << ft_session_last_error(off.get());
        for (uint16_t v : py) ASSERT_NE(v & 0x7f80, 0x7f80);
    }
    ASSERT_EQ(ft_decode(off.get(), 0, T, x.data(), ids.data(), w.data(), y.data()), FT_OK);
    ft_layer_stats ls;
    ls.struct_size = sizeof ls;
    ASSERT_EQ(ft_session_get_layer_stats(off.get(), 0, &ls), FT_OK);
    EXPECT_EQ(ls.calls, 2u);
    EXPECT_EQ(ls.active_experts, 16u);
    EXPECT_EQ(ls.misses, 8u);  // the second call found all 8 experts still resident
    ft_session_stats st;
    st.struct_size = sizeof st;
    ASSERT_EQ(ft_session_get_stats(off.get(), &st), FT_OK);
    EXPECT_EQ(st.prefill_calls, 4u);
    EXPECT_GE(st.prefill_bytes, 3 * uint64_t(E) * f.info.expert_bytes);
}

// Slot counts: explicit, fraction, automatic; below one layer refused.
TEST(BackendsDevice, SlotCountParameters) {
    Fixture f(4, 32);
    if (!f.ok) GTEST_SKIP() << "no usable GPU";
    ft_session_params p;
    ft_session_params_init(&p);
    p.backend = FT_BACKEND_OFFLOAD;
    p.max_tokens = 8;
    p.cache_slots = 31;  // < E
    ft_session *s = nullptr;
    char err[512];
    EXPECT_EQ(ft_session_create(f.model.get(), &p, &s, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s, nullptr);
    p.cache_slots = 0;
    p.cache_fraction = 1.5;
    EXPECT_EQ(ft_session_create(f.model.get(), &p, &s, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    p.cache_fraction = 0.5;  // 64 of 128
    ASSERT_EQ(ft_session_create(f.model.get(), &p, &s, err, sizeof err), FT_OK) << err;
    ft_session_free(s);
    p.cache_fraction = 0;  // automatic: everything fits on a GPU of this size
    ASSERT_EQ(ft_session_create(f.model.get(), &p, &s, err, sizeof err), FT_OK) << err;
    ft_session_free(s);
}

// A CPU side that cannot finish in time: the watchdog releases the stream and the session
// reports FT_ERR_TIMEOUT instead of hanging.
TEST(Hybrid, HandoffTimeoutFailsTheSessionInsteadOfHanging) {
    Fixture f(2, 16, 2048, 1024, 8);
    if (!f.ok) GTEST_SKIP() << "no usable GPU";
    const int E = f.info.num_experts, K = f.info.top_k, H = f.info.hidden_size, T = 8;
    // f = 0: every miss goes to the CPU (about 100 MB of experts); 1 ms is far too short.
    auto hyb = open_session(f.model.get(), FT_BACKEND_HYBRID, 8, E, 0.0f, false, 1e-3);
    ASSERT_TRUE(hyb);
    std::mt19937 rng(5);
    const auto x = random_bf16(rng, size_t(T) * H, 1.0f);
    const auto ids = distinct_ids(rng, T, K, E);
    std::vector<float> w(size_t(T) * K, 0.1f);
    std::vector<uint16_t> y(size_t(T) * H);
    ft_status st = FT_OK;
    for (int i = 0; i < 20 && st == FT_OK; ++i) st = ft_decode(hyb.get(), i % 2, T, x.data(), ids.data(), w.data(), y.data());
    EXPECT_EQ(st, FT_ERR_TIMEOUT) << ft_session_last_error(hyb.get());
    EXPECT_EQ(ft_session_status(hyb.get()), FT_ERR_TIMEOUT);
    EXPECT_EQ(ft_decode(hyb.get(), 0, T, x.data(), ids.data(), w.data(), y.data()), FT_ERR_TIMEOUT);
}

// Adaptive f: from a bad start (almost everything on the CPU, or almost everything fetched) the
// session's own measurements move f to within the sweep's step of the best fixed f (or to a step
// time within 10 % of its). Timing-based: ctest label `timing` (tests/backends/CMakeLists.txt).
TEST(Hybrid, AdaptiveFractionConverges) {
    Fixture f(4, 32, 2048, 768, 8);
    if (!f.ok) GTEST_SKIP() << "no usable GPU";
    const int L = f.info.num_layers, E = f.info.num_experts, K = f.info.top_k, H = f.info.hidden_size, T = 1;
    std::mt19937 rng(9);
    const auto x = random_bf16(rng, size_t(T) * H, 1.0f);
    std::vector<std::vector<int32_t>> trace;
    for (int i = 0; i < 64; ++i) trace.push_back(distinct_ids(rng, T, K, E));
    std::vector<float> w(size_t(T) * K, 0.1f);
    std::vector<uint16_t> y(size_t(T) * H);
    // One layer of slots over four layers: (nearly) every route misses every step.
    auto step_time = [&](ft_session *s, int steps) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < steps; ++i)
            for (int l = 0; l < L; ++l)
                EXPECT_EQ(ft_decode(s, l, T, x.data(), trace[(i * L + l) % trace.size()].data(), w.data(), y.data()), FT_OK);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
    };
    double best_t = 1e30, best_f = 0;
    for (float fr : {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f}) {
        auto s = open_session(f.model.get(), FT_BACKEND_HYBRID, 1, E, fr, false);
        step_time(s.get(), 5);
        const double t = step_time(s.get(), 20);
        std::printf("fixed f %.1f: %.3f ms per step\n", fr, t * 1e3);
        if (t < best_t) best_t = t, best_f = fr;
    }
    for (float start : {0.05f, 0.95f}) {
        auto s = open_session(f.model.get(), FT_BACKEND_HYBRID, 1, E, start, true);
        step_time(s.get(), 100);  // 400 layer-steps to converge
        const double t = step_time(s.get(), 20);
        ft_session_stats st;
        st.struct_size = sizeof st;
        ASSERT_EQ(ft_session_get_stats(s.get(), &st), FT_OK);
        std::printf("adaptive from %.2f: f %.3f, %.3f ms per step (best fixed f %.1f: %.3f ms)\n", start, st.hybrid_fraction, t * 1e3,
                    best_f, best_t * 1e3);
        // Converged: f within the sweep's own step (0.1) of the best fixed f, or a step time
        // within 10 % of the best (timings on a shared machine move by several %).
        EXPECT_TRUE(std::fabs(st.hybrid_fraction - best_f) <= 0.1 + 1e-6 || t < best_t * 1.10)
            << "adaptive f " << st.hybrid_fraction << " (" << t * 1e3 << " ms) vs best fixed " << best_f << " (" << best_t * 1e3
            << " ms)";
    }
}

}  // namespace
