// A sticky CUDA fault (here: a kernel of the caller's that writes to an invalid address) puts a
// GPU session into the device-lost state: calls return FT_ERR_DEVICE_LOST instead of crashing or
// hanging. Its own executable, since the fault poisons the whole process's CUDA context; not run
// under compute-sanitizer (the fault is the point).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "api_handles.hpp"
#include "freetoken_cuda.h"
#include "ft/synth.hpp"

namespace {

using namespace ft::test;

__global__ void fault(int *p) { *p = 1; }

TEST(DeviceLost, StickyFaultIsReportedNotFatal) {
    auto engine = make_engine();
    ft_engine_info ei;
    ei.struct_size = sizeof ei;
    if (!engine || ft_engine_get_info(engine.get(), &ei) != FT_OK || ei.device < 0) GTEST_SKIP() << "no usable GPU";
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

}  // namespace
