// With a GPU: the engine takes it by default and a loaded model reports its expert banks
// page-locked for it (ft_model_info.pinned_bytes), decodes from them, and pins nothing off the GPU.
#include <gtest/gtest.h>

#include "api_handles.hpp"
#include "ft/synth.hpp"

namespace {

using namespace ft::test;

bool have_gpu(ft_engine *engine) {
    ft_engine_info info;
    info.struct_size = sizeof info;
    return ft_engine_get_info(engine, &info) == FT_OK && info.device >= 0;
}

TEST(Gpu, EngineTakesTheFirstDeviceByDefault) {
    ft_build_info b;
    b.struct_size = sizeof b;
    ASSERT_EQ(ft_build_info_get(&b), FT_OK);
    if (!b.cuda) GTEST_SKIP() << "built without CUDA";
    auto engine = make_engine();
    if (!have_gpu(engine.get())) GTEST_SKIP() << "no usable GPU";
    ft_engine_info info;
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_engine_get_info(engine.get(), &info), FT_OK);
    EXPECT_EQ(info.device, 0);
    EXPECT_GT(std::strlen(info.device_name), 0u);
}

// What the C API reports; test_pinned_banks.cpp checks the registrations with the CUDA runtime.
TEST(Gpu, LoadedModelReportsEveryBankBytePinned) {
    auto engine = make_engine();
    if (!have_gpu(engine.get())) GTEST_SKIP() << "no usable GPU";
    ScratchDir dir;
    ft::synth::Spec s;
    s.num_layers = 3;
    s.num_experts = 8;
    s.hidden = 256;
    s.intermediate = 128;
    ft::synth::write_checkpoint(dir.path(), s);
    ft_model *raw = nullptr;
    char err[256];
    ASSERT_EQ(ft_model_load(engine.get(), dir.path().c_str(), nullptr, &raw, err, sizeof err), FT_OK) << err;
    ModelPtr model(raw);
    ft_model_info info;
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_model_get_info(raw, &info), FT_OK);
    EXPECT_EQ(info.pinned_bytes, info.bank_bytes);

    // The CPU backend reads page-locked banks like any others.
    auto session = make_session(raw, 2);
    std::mt19937 rng(1);
    const auto x = random_bf16(rng, 2 * 256, 1.0f);
    const std::vector<int32_t> ids = {0, 5, 7, 7};
    const std::vector<float> w = {0.5f, 0.5f, 0.3f, 0.7f};
    std::vector<uint16_t> out(2 * 256, 0x7fc0);
    ASSERT_EQ(ft_decode(session.get(), 1, 2, x.data(), ids.data(), w.data(), out.data()), FT_OK);
    for (uint16_t v : out) ASSERT_NE(v & 0x7f80, 0x7f80);

    // An engine told to stay off the GPU pins nothing.
    ft_engine_params p;
    ft_engine_params_init(&p);
    p.device = FT_DEVICE_NONE;
    ft_engine *cpu_only = nullptr;
    ASSERT_EQ(ft_engine_create(&p, &cpu_only, err, sizeof err), FT_OK);
    EnginePtr cpu_engine(cpu_only);
    ASSERT_EQ(ft_model_load(cpu_only, dir.path().c_str(), nullptr, &raw, err, sizeof err), FT_OK) << err;
    ModelPtr model2(raw);
    ASSERT_EQ(ft_model_get_info(raw, &info), FT_OK);
    EXPECT_EQ(info.pinned_bytes, 0u);
}

}  // namespace
