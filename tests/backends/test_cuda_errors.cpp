// The CUDA error policy (ft/cuda_check.hpp) and the device-lost state of the GPU backends.
//   CudaErrorPolicy / FaultInjection: the mapping and the test hook themselves (no GPU needed).
//   DeviceLostPath: a sticky fault injected through the hook into one CUDA call of each path
//   (decode kernels, admission, gather, prefill, the hybrid CPU handoff, EP placement) must leave
//   the session in FT_ERR_DEVICE_LOST, refusing later work while host counters stay readable.
// Links the static modules (not libfreetoken.so, whose copy of the hook is hidden), so arming
// the hook here reaches the code under test. The injected fault leaves the real context intact;
// test_device_lost provokes a real one in its own process.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "freetoken.h"
#include "ft/common.hpp"
#include "ft/cuda_check.hpp"
#include "ft/ep.hpp"
#include "ft/ep_cuda.hpp"
#include "ft/session.hpp"
#include "ft/synth.hpp"
#include "scratch_dir.hpp"

namespace {

using ft::cuda::FaultInjection;
using ft::test::ScratchDir;

// Disarms the hook whatever way a test ends.
struct Disarm {
    ~Disarm() { FaultInjection::disarm(); }
};

ft_status status_of_call(const std::function<void()> &f) {
    try {
        f();
        return FT_OK;
    } catch (const ft::Error &e) {
        return e.status();
    }
}

// ---- the policy itself (host only) -----------------------------------------------------------

TEST(CudaErrorPolicy, MapsEveryErrorClass) {
    for (cudaError_t e : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorHardwareStackError,
                          cudaErrorIllegalInstruction, cudaErrorMisalignedAddress, cudaErrorInvalidAddressSpace,
                          cudaErrorInvalidPc, cudaErrorAssert, cudaErrorECCUncorrectable, cudaErrorLaunchTimeout}) {
        EXPECT_TRUE(ft::cuda::sticky_error(e)) << cudaGetErrorName(e);
        EXPECT_EQ(ft::cuda::status_of(e), FT_ERR_DEVICE_LOST) << cudaGetErrorName(e);
    }
    EXPECT_EQ(ft::cuda::status_of(cudaSuccess), FT_OK);
    EXPECT_EQ(ft::cuda::status_of(cudaErrorMemoryAllocation), FT_ERR_OUT_OF_MEMORY);
    EXPECT_FALSE(ft::cuda::sticky_error(cudaErrorMemoryAllocation));
    for (cudaError_t e : {cudaErrorInvalidValue, cudaErrorNotReady, cudaErrorInvalidDevice, cudaErrorNoDevice}) {
        EXPECT_FALSE(ft::cuda::sticky_error(e)) << cudaGetErrorName(e);
        EXPECT_EQ(ft::cuda::status_of(e), FT_ERR_DEVICE) << cudaGetErrorName(e);
    }
}

TEST(CudaErrorPolicy, CheckThrowsTheMappedStatusNamingTheCall) {
    EXPECT_NO_THROW(ft::cuda::check(cudaSuccess, "nothing"));
    try {
        ft::cuda::check(cudaErrorIllegalAddress, "layer ", 3, " kernels");
        FAIL() << "check did not throw";
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_DEVICE_LOST);
        const std::string m = e.what();
        EXPECT_NE(m.find("layer 3 kernels"), std::string::npos) << m;
        EXPECT_NE(m.find("cudaErrorIllegalAddress"), std::string::npos) << m;
    }
    EXPECT_EQ(status_of_call([] { ft::cuda::check(cudaErrorMemoryAllocation, "alloc"); }), FT_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(status_of_call([] { ft::cuda::check(cudaErrorInvalidValue, "args"); }), FT_ERR_DEVICE);
}

TEST(FaultInjection, InertUntilArmedThenOnlyAtItsSite) {
    Disarm disarm;
    EXPECT_FALSE(FaultInjection::armed());
    EXPECT_NO_THROW(ft::cuda::check(cudaSuccess, "launching the gather"));
    FaultInjection::arm(cudaErrorInvalidValue, "the gather");
    EXPECT_TRUE(FaultInjection::armed());
    EXPECT_NO_THROW(ft::cuda::check(cudaSuccess, "launching admission"));  // another site
    EXPECT_FALSE(FaultInjection::fired());
    EXPECT_EQ(status_of_call([] { ft::cuda::check(cudaSuccess, "launching ", "the gather"); }), FT_ERR_DEVICE);
    EXPECT_TRUE(FaultInjection::fired());
    // A non-sticky error fires once.
    EXPECT_FALSE(FaultInjection::armed());
    EXPECT_NO_THROW(ft::cuda::check(cudaSuccess, "launching the gather"));
}

TEST(FaultInjection, StickyErrorKeepsFailingEveryCheckUntilDisarmed) {
    Disarm disarm;
    FaultInjection::arm(cudaErrorIllegalAddress, "expert kernels");
    EXPECT_NO_THROW(ft::cuda::check(cudaSuccess, "copying hidden states"));
    EXPECT_EQ(status_of_call([] { ft::cuda::check(cudaSuccess, "launching the expert kernels"); }),
              FT_ERR_DEVICE_LOST);
    // As on a lost context: every later call fails, whatever its site.
    EXPECT_EQ(status_of_call([] { ft::cuda::check(cudaSuccess, "copying hidden states"); }), FT_ERR_DEVICE_LOST);
    FaultInjection::disarm();
    EXPECT_FALSE(FaultInjection::armed());
    EXPECT_NO_THROW(ft::cuda::check(cudaSuccess, "copying hidden states"));
}

// ---- every path of the GPU backends ----------------------------------------------------------

struct PathCase {
    const char *name;
    int32_t backend;
    int32_t tokens;    // >= kPrefillMin: the prefill path
    const char *site;  // a substring of the message of the check() that sees the fault
};

constexpr int32_t kPrefillMin = 4;

void PrintTo(const PathCase &c, std::ostream *os) { *os << c.name; }

class DeviceLostPath : public ::testing::TestWithParam<PathCase> {};

TEST_P(DeviceLostPath, StickyFaultMarksTheSessionLost) {
    const PathCase &pc = GetParam();
    Disarm disarm;
    ft_engine_params ep{};
    ep.struct_size = sizeof ep;
    ep.device = FT_DEVICE_AUTO;
    ep.pin_threads = false;
    std::unique_ptr<ft::Engine> engine;
    try {
        engine = std::make_unique<ft::Engine>(ep);
    } catch (const ft::Error &e) {
        GTEST_SKIP() << "no engine: " << e.what();
    }
    if (engine->device() < 0) GTEST_SKIP() << "no usable GPU";

    ScratchDir dir;
    ASSERT_FALSE(dir.path().empty());
    ft::synth::Spec s;
    s.num_layers = 3;  // the offload prefill prefetches one layer ahead: layer 2 is fetched by the second call
    s.num_experts = 8;
    s.top_k = 2;
    s.hidden = 128;
    s.intermediate = 64;
    ft::synth::write_checkpoint(dir.path(), s);
    ft_model_load_params lp{};
    lp.struct_size = sizeof lp;
    std::unique_ptr<ft::LoadedModel> model = ft::LoadedModel::load(*engine, dir.path(), lp);

    ft_session_params p{};
    p.struct_size = sizeof p;
    p.backend = pc.backend;
    p.max_tokens = 8;
    p.check_finite = true;
    p.vram_reserve_bytes = 0;
    p.prefill_min_tokens = kPrefillMin;
    p.hybrid_fraction = 0.5f;
    p.hybrid_adaptive = false;
    p.handoff_timeout_seconds = 10.0;
    ft::Session session(*model, p);
    ASSERT_EQ(session.backend(), pc.backend);

    const int32_t T = pc.tokens, K = s.top_k;
    std::vector<uint16_t> x(size_t(T) * s.hidden, 0x3f80), y(x.size());
    std::vector<int32_t> ids(size_t(T) * K);
    std::vector<float> w(ids.size(), 0.5f);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 3 + 1) % s.num_experts);
    ft::DecodeCall call;
    call.num_tokens = T;
    call.hidden = x.data();
    call.ids = ids.data();
    call.weights = w.data();
    call.out = y.data();

    // A healthy call first: the path works, and its buffers exist.
    call.layer = 0;
    ASSERT_NO_THROW(session.decode(call));
    ASSERT_EQ(session.status(), FT_OK);
    if (T >= kPrefillMin && session.stats().prefill_calls == 0) GTEST_SKIP() << "no GPU prefill path (no cuBLAS)";

    FaultInjection::arm(cudaErrorIllegalAddress, pc.site);
    call.layer = 1;  // a layer not yet seen: the offload paths fetch
    EXPECT_EQ(status_of_call([&] { session.decode(call); }), FT_ERR_DEVICE_LOST);
    EXPECT_TRUE(FaultInjection::fired()) << "no check() saw the site \"" << pc.site << "\"";
    EXPECT_EQ(session.status(), FT_ERR_DEVICE_LOST);

    // The session refuses further work by itself, even once CUDA calls would succeed again.
    FaultInjection::disarm();
    call.layer = 0;
    EXPECT_EQ(status_of_call([&] { session.decode(call); }), FT_ERR_DEVICE_LOST);
    EXPECT_EQ(session.status(), FT_ERR_DEVICE_LOST);
    ft_layer_stats ls{};
    EXPECT_EQ(status_of_call([&] { session.layer_stats(0, ls); }), FT_ERR_DEVICE_LOST);
    const ft_session_stats st = session.stats();  // host counters stay readable
    EXPECT_GE(st.decode_calls, 1u);
    EXPECT_NO_THROW(session.reset_stats());
}

INSTANTIATE_TEST_SUITE_P(
    Paths, DeviceLostPath,
    ::testing::Values(PathCase{"gpu_decode", FT_BACKEND_GPU, 1, "launching the expert kernels"},
                      PathCase{"gpu_slot_rewrite", FT_BACKEND_GPU, 2, "launching the slot rewrite"},
                      PathCase{"gpu_prefill", FT_BACKEND_GPU, 8, "GPU prefill"},
                      PathCase{"gpu_host_staging", FT_BACKEND_GPU, 1, "copying hidden states to the GPU"},
                      PathCase{"offload_admission", FT_BACKEND_OFFLOAD, 1, "launching admission"},
                      PathCase{"offload_gather", FT_BACKEND_OFFLOAD, 1, "launching the gather"},
                      PathCase{"offload_prefill_stream", FT_BACKEND_OFFLOAD, 8, "streaming a layer for prefill"},
                      PathCase{"offload_prefill", FT_BACKEND_OFFLOAD, 8, "GPU prefill"},
                      PathCase{"hybrid_admission", FT_BACKEND_HYBRID, 1, "launching hybrid admission"},
                      PathCase{"hybrid_stage", FT_BACKEND_HYBRID, 1, "staging the CPU's share"},
                      PathCase{"hybrid_combine", FT_BACKEND_HYBRID, 1, "launching the combine"},
                      PathCase{"hybrid_prefill", FT_BACKEND_HYBRID, 8, "GPU prefill"}),
    [](const ::testing::TestParamInfo<PathCase> &i) { return std::string(i.param.name); });

// EP: the placement upload of a group (the first CUDA work of every EP step's setup).
TEST(DeviceLostEp, PlacementUploadReportsDeviceLost) {
    Disarm disarm;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        GTEST_SKIP() << "no usable GPU";
    }
    const ft::ep::Placement pl = ft::ep::contiguous_placement(8, 2);
    EXPECT_NO_THROW(ft::ep::cuda::PlacementBuffer ok(pl));
    FaultInjection::arm(cudaErrorLaunchFailure, "EP: placement upload");
    EXPECT_EQ(status_of_call([&] { ft::ep::cuda::PlacementBuffer lost(pl); }), FT_ERR_DEVICE_LOST);
    EXPECT_TRUE(FaultInjection::fired());
}

}  // namespace
