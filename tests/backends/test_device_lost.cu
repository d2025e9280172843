// A sticky CUDA fault (here: a kernel of the caller's that writes to an invalid address) puts a
// GPU session into the device-lost state: calls return FT_ERR_DEVICE_LOST instead of crashing or
// hanging. Its own executable, since the fault poisons the whole process's CUDA context; ctest
// runs each test in its own process, and a test that finds the context already lost skips. Not
// run under compute-sanitizer (the fault is the point). test_cuda_errors injects the fault into
// each CUDA call site instead.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "api_handles.hpp"
#include "freetoken_cuda.h"
#include "ft/synth.hpp"

namespace {

using namespace ft::test;

__global__ void fault(int *p) { *p = 1; }
__global__ void trap() { __trap(); }

// False once an earlier test of this process has lost the context.
bool context_healthy() { return cudaFree(nullptr) == cudaSuccess; }

TEST(DeviceLost, StickyFaultIsReportedNotFatal) {
    auto engine = make_engine();
    ft_engine_info ei;
    ei.struct_size = sizeof ei;
    if (!engine || ft_engine_get_info(engine.get(), &ei) != FT_OK || ei.device < 0) GTEST_SKIP() << "no usable GPU";
    if (!context_healthy()) GTEST_SKIP() << "the context is already lost: run one test per process (ctest does)";
    ScratchDir dir;
    ft::synth::Spec s;
    s.num_layers = 2;
    s.num_experts = 8;
    s.hidden = 128;
    s.intermediate = 64;
    ft::synth::write_checkpoint(dir.path(), s);
    ft_model *raw = nullptr;
    char err[512];
    ASSERT_EQ(ft_model_load(engine.get(), dir.path().c_str(), nullptr, &raw, err, sizeof err), FT_OK) << err;
    ModelPtr model(raw);
    ft_session_params p;
    ft_session_params_init(&p);
    p.backend = FT_BACKEND_OFFLOAD;
    p.max_tokens = 4;
    p.vram_reserve_bytes = 0;
    ft_session *sraw = nullptr;
    ASSERT_EQ(ft_session_create(raw, &p, &sraw, err, sizeof err), FT_OK) << err;
    SessionPtr session(sraw);

    std::vector<uint16_t> x(128, 0x3f80), y(128);
    std::vector<int32_t> ids = {1, 2};
    std::vector<float> w = {0.5f, 0.5f};
    ASSERT_EQ(ft_decode(sraw, 0, 1, x.data(), ids.data(), w.data(), y.data()), FT_OK);
    EXPECT_EQ(ft_session_status(sraw), FT_OK);

    fault<<<1, 1>>>(reinterpret_cast<int *>(0x10));
    cudaDeviceSynchronize();  // the fault is now sticky for the process

    EXPECT_EQ(ft_decode(sraw, 0, 1, x.data(), ids.data(), w.data(), y.data()), FT_ERR_DEVICE_LOST);
    EXPECT_EQ(ft_session_status(sraw), FT_ERR_DEVICE_LOST);
    EXPECT_EQ(ft_decode(sraw, 1, 1, x.data(), ids.data(), w.data(), y.data()), FT_ERR_DEVICE_LOST);
    ft_session_stats st;
    st.struct_size = sizeof st;
    EXPECT_EQ(ft_session_get_stats(sraw, &st), FT_OK);  // host counters are still readable
}

// A kernel that traps (cudaErrorLaunchFailure) before a call of each backend, on the decode path
// (1 token) and on the prefill path (8 tokens, prefill_min_tokens 4).
struct TrapCase {
    const char *name;
    int32_t backend;
    int32_t tokens;
};

class TrapFault : public ::testing::TestWithParam<TrapCase> {};

TEST_P(TrapFault, SessionReportsDeviceLostAndRefusesWork) {
    const TrapCase &tc = GetParam();
    auto engine = make_engine();
    ft_engine_info ei;
    ei.struct_size = sizeof ei;
    if (!engine || ft_engine_get_info(engine.get(), &ei) != FT_OK || ei.device < 0) GTEST_SKIP() << "no usable GPU";
    if (!context_healthy()) GTEST_SKIP() << "the context is already lost: run one test per process (ctest does)";
    ScratchDir dir;
    ft::synth::Spec s;
    s.num_layers = 2;
    s.num_experts = 8;
    s.hidden = 128;
    s.intermediate = 64;
    ft::synth::write_checkpoint(dir.path(), s);
    ft_model *raw = nullptr;
    char err[512];
    ASSERT_EQ(ft_model_load(engine.get(), dir.path().c_str(), nullptr, &raw, err, sizeof err), FT_OK) << err;
    ModelPtr model(raw);
    ft_session_params p;
    ft_session_params_init(&p);
    p.backend = tc.backend;
    p.max_tokens = 8;
    p.prefill_min_tokens = 4;
    p.vram_reserve_bytes = 0;
    p.hybrid_fraction = 0.5f;
    p.hybrid_adaptive = false;
    ft_session *sraw = nullptr;
    ASSERT_EQ(ft_session_create(raw, &p, &sraw, err, sizeof err), FT_OK) << err;
    SessionPtr session(sraw);

    const size_t T = size_t(tc.tokens);
    std::vector<uint16_t> x(T * 128, 0x3f80), y(T * 128);
    std::vector<int32_t> ids(T * 2);
    std::vector<float> w(ids.size(), 0.5f);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((3 * i + 1) % 8);
    ASSERT_EQ(ft_decode(sraw, 0, tc.tokens, x.data(), ids.data(), w.data(), y.data()), FT_OK)
        << ft_session_last_error(sraw);
    ASSERT_EQ(ft_session_status(sraw), FT_OK);

    trap<<<1, 1>>>();
    EXPECT_NE(cudaDeviceSynchronize(), cudaSuccess);  // the trap is now sticky for the process

    EXPECT_EQ(ft_decode(sraw, 1, tc.tokens, x.data(), ids.data(), w.data(), y.data()), FT_ERR_DEVICE_LOST)
        << ft_session_last_error(sraw);
    EXPECT_EQ(ft_session_status(sraw), FT_ERR_DEVICE_LOST);
    EXPECT_EQ(ft_decode(sraw, 0, tc.tokens, x.data(), ids.data(), w.data(), y.data()), FT_ERR_DEVICE_LOST);
    ft_session_stats st;
    st.struct_size = sizeof st;
    EXPECT_EQ(ft_session_get_stats(sraw, &st), FT_OK);
}

INSTANTIATE_TEST_SUITE_P(Backends, TrapFault,
                         ::testing::Values(TrapCase{"gpu_decode", FT_BACKEND_GPU, 1},
                                           TrapCase{"gpu_prefill", FT_BACKEND_GPU, 8},
                                           TrapCase{"offload_decode", FT_BACKEND_OFFLOAD, 1},
                                           TrapCase{"offload_prefill", FT_BACKEND_OFFLOAD, 8},
                                           TrapCase{"hybrid_decode", FT_BACKEND_HYBRID, 1},
                                           TrapCase{"hybrid_prefill", FT_BACKEND_HYBRID, 8}),
                         [](const ::testing::TestParamInfo<TrapCase> &i) { return std::string(i.param.name); });

}  // namespace
