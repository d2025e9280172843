// DeepSeek-V4 on the backends with a GPU (skips without one): a synthetic checkpoint whose first
// MoE layer routes by token id and whose shared expert is FP8. ft_route_tokens gives the same
// routes on gpu, offload and hybrid sessions as on cpu, and ft_decode with shared_experts (the
// bf16-dequantised shared expert with DeepSeek-V4's clamp, resident on the GPU) gives the cpu
// backend's output within relative L2 1e-2.
#include <gtest/gtest.h>

#include <cmath>

#include "api_handles.hpp"
#include "ft/synth.hpp"
#include "synth_reference.hpp"

namespace {

using namespace ft::test;

bool have_gpu(ft_engine *engine) {
    ft_engine_info info;
    info.struct_size = sizeof info;
    return ft_engine_get_info(engine, &info) == FT_OK && info.device >= 0;
}

double relative_l2(const std::vector<uint16_t> &a, const std::vector<uint16_t> &ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double r = bf16_to_f64(ref[i]), d = bf16_to_f64(a[i]) - r;
        num += d * d;
        den += r * r;
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

TEST(Dsv4Gpu, HashRoutesAndFp8SharedExpertMatchCpu) {
    auto engine = make_engine();
    if (!have_gpu(engine.get())) GTEST_SKIP() << "no usable GPU";
    const ft::synth::Spec s = dsv4_hashed_spec(64, 99);
    ScratchDir dir;
    ft::synth::write_checkpoint(dir.path(), s);
    ft_model *raw = nullptr;
    char err[512];
    ASSERT_EQ(ft_model_load(engine.get(), dir.path().c_str(), nullptr, &raw, err, sizeof err), FT_OK) << err;
    ModelPtr model(raw);

    const int E = s.num_experts, K = s.top_k, H = s.hidden, T = 12;
    auto cpu = make_session(raw, T, true, FT_BACKEND_CPU);
    ASSERT_TRUE(cpu);
    std::mt19937 rng(5);
    std::normal_distribution<float> n(0.f, 1.5f);
    for (int32_t backend : {FT_BACKEND_GPU, FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID}) {
        auto gpu = make_session(raw, T, true, backend);
        ASSERT_TRUE(gpu) << "backend " << backend;
        for (int l = 0; l < 2; ++l) {
            std::vector<float> logits(size_t(T) * E);
            for (float &x : logits) x = n(rng);
            std::vector<int32_t> tokens(T);
            for (int t = 0; t < T; ++t) tokens[t] = int32_t(rng() % uint32_t(s.vocab_size));
            std::vector<int32_t> ids(size_t(T) * K), ids_gpu(size_t(T) * K);
            std::vector<float> w(size_t(T) * K), w_gpu(size_t(T) * K);
            ASSERT_EQ(ft_route_tokens(cpu.get(), l, T, logits.data(), tokens.data(), ids.data(), w.data()), FT_OK)
                << ft_session_last_error(cpu.get());
            ASSERT_EQ(ft_route_tokens(gpu.get(), l, T, logits.data(), tokens.data(), ids_gpu.data(), w_gpu.data()),
                      FT_OK)
                << ft_session_last_error(gpu.get());
            EXPECT_EQ(ids, ids_gpu);
            EXPECT_EQ(w, w_gpu);
            EXPECT_EQ(ft_route(gpu.get(), 0, T, logits.data(), ids_gpu.data(), w_gpu.data()), FT_ERR_INVALID_ARGUMENT);
            const auto x = random_bf16(rng, size_t(T) * H, 1.0f);
            std::vector<uint16_t> want(size_t(T) * H), got(size_t(T) * H, 0x7fc0);
            ASSERT_EQ(ft_decode(cpu.get(), l, T, x.data(), ids.data(), w.data(), want.data()), FT_OK)
                << ft_session_last_error(cpu.get());
            ASSERT_EQ(ft_decode(gpu.get(), l, T, x.data(), ids.data(), w.data(), got.data()), FT_OK)
                << ft_session_last_error(gpu.get());
            EXPECT_LE(relative_l2(got, want), 1e-2) << "backend " << backend << " layer " << l;
        }
    }
}

}  // namespace
