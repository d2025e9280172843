// Hostile values through the public API: NaN block scales in Q4_0 weights, NaN/Inf hidden
// states with check_finite off (garbage in, garbage out, never UB: the sanitizer build checks
// the conversions), worker counts beyond the machine, and a shared model decoded from four
// threads at once (the TSan build's stress test).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "api_handles.hpp"
#include "ft/synth.hpp"

namespace {

using namespace ft::test;

bool bf16_is_nan(uint16_t v) { return (v & 0x7f80) == 0x7f80 && (v & 0x7f) != 0; }
bool bf16_finite(uint16_t v) { return (v & 0x7f80) != 0x7f80; }

// A one-layer Q4_0 GGUF model (H = I = 64, 4 experts, top 2); with nan_scale every block of
// expert 0's gate rows has scale NaN (fp16 0x7e00).
std::string write_q4_0_gguf(const std::string &dir, bool nan_scale) {
    const uint64_t H = 64, I = 64, E = 4;
    ft::synth::GgufWriter w;
    w.kv_string("general.architecture", "qwen3moe");
    w.kv_u32("qwen3moe.block_count", 1);
    w.kv_u32("qwen3moe.embedding_length", H);
    w.kv_u32("qwen3moe.expert_count", E);
    w.kv_u32("qwen3moe.expert_used_count", 2);
    w.kv_u32("qwen3moe.expert_feed_forward_length", I);
    std::mt19937 rng(3);
    auto q4 = [&](uint64_t rows, uint64_t K, bool nan_rows_of_expert0) {
        std::vector<uint8_t> b;
        for (uint64_t r = 0; r < rows; ++r)
            for (uint64_t k = 0; k < K / 32; ++k) {
                const uint16_t d = nan_rows_of_expert0 && r < I ? 0x7e00 : 0x2400;  // NaN or 1/64
                b.push_back(uint8_t(d & 0xff));
                b.push_back(uint8_t(d >> 8));
                for (int i = 0; i < 16; ++i) b.push_back(uint8_t(rng() & 0xff));
            }
        return b;
    };
    w.tensor("blk.0.ffn_gate_exps.weight", {H, I, E}, 2, q4(I * E, H, nan_scale));
    w.tensor("blk.0.ffn_up_exps.weight", {H, I, E}, 2, q4(I * E, H, false));
    w.tensor("blk.0.ffn_down_exps.weight", {I, H, E}, 2, q4(H * E, I, false));
    std::vector<uint8_t> router(H * E * 2);
    for (size_t i = 0; i < router.size(); i += 2) router[i + 1] = 0x3c;  // bf16 0.0078
    w.tensor("blk.0.ffn_gate_inp.weight", {H, E}, 30, router);
    const std::string path = dir + "/m.gguf";
    w.write(path);
    return path;
}

ModelPtr load(ft_engine *e, const std::string &path) {
    ft_model *m = nullptr;
    char err[512];
    EXPECT_EQ(ft_model_load(e, path.c_str(), nullptr, &m, err, sizeof err), FT_OK) << err;
    return ModelPtr(m);
}

SessionPtr session(ft_model *m, bool check_finite) {
    ft_session_params p;
    ft_session_params_init(&p);
    p.backend = FT_BACKEND_CPU;
    p.max_tokens = 4;
    p.check_finite = check_finite;
    ft_session *s = nullptr;
    char err[256];
    EXPECT_EQ(ft_session_create(m, &p, &s, err, sizeof err), FT_OK) << err;
    return SessionPtr(s);
}

// Policy: weights are not scanned at load; a NaN block scale makes the outputs of the tokens
// routed to that expert NaN, whatever check_finite says (it checks the inputs).
TEST(HostileInputs, NanQ4_0ScaleLoadsAndPoisonsItsExpertOnly) {
    ScratchDir dir;
    auto engine = make_engine();
    auto model = load(engine.get(), write_q4_0_gguf(dir.path(), true));
    ASSERT_TRUE(model);
    for (bool check : {true, false}) {
        auto s = session(model.get(), check);
        std::vector<uint16_t> x(2 * 64, 0x3f00), out(2 * 64, 0);  // 0.5
        const int32_t ids[4] = {0, 1, 2, 3};                      // token 0 uses expert 0, token 1 does not
        const float w[4] = {0.5f, 0.5f, 0.5f, 0.5f};
        ASSERT_EQ(ft_decode(s.get(), 0, 2, x.data(), ids, w, out.data()), FT_OK) << ft_session_last_error(s.get());
        for (int h = 0; h < 64; ++h) {
            EXPECT_TRUE(bf16_is_nan(out[h])) << "token 0 channel " << h;
            EXPECT_TRUE(bf16_finite(out[64 + h])) << "token 1 channel " << h;
        }
    }
}

// A valid Q4_0 model, NaN and +-Inf hidden states: check_finite rejects them; off, the token's
// outputs are non-finite and the other token's are not.
TEST(HostileInputs, NonFiniteHiddenStatesWithCheckFiniteOff) {
    ScratchDir dir;
    auto engine = make_engine();
    auto model = load(engine.get(), write_q4_0_gguf(dir.path(), false));
    ASSERT_TRUE(model);
    for (uint16_t bad : {uint16_t(0x7fc0), uint16_t(0x7f80), uint16_t(0xff80)}) {
        std::vector<uint16_t> x(2 * 64, 0x3f00), out(2 * 64, 0);
        x[5] = bad;
        const int32_t ids[4] = {1, 2, 1, 2};
        const float w[4] = {0.5f, 0.5f, 0.5f, 0.5f};
        auto checked = session(model.get(), true);
        EXPECT_EQ(ft_decode(checked.get(), 0, 2, x.data(), ids, w, out.data()), FT_ERR_NON_FINITE);
        auto s = session(model.get(), false);
        ASSERT_EQ(ft_decode(s.get(), 0, 2, x.data(), ids, w, out.data()), FT_OK) << ft_session_last_error(s.get());
        for (int h = 0; h < 64; ++h) {
            EXPECT_FALSE(bf16_finite(out[h])) << "bad " << bad << " channel " << h;
            EXPECT_TRUE(bf16_finite(out[64 + h])) << "bad " << bad << " channel " << h;
        }
    }
}

// Worker counts: beyond 4096 is an argument error; beyond the CPUs of the affinity set is
// clamped to them.
TEST(HostileInputs, WorkerCountBoundedByTheMachine) {
    ft_engine_params p;
    ft_engine_params_init(&p);
    p.device = FT_DEVICE_NONE;
    p.pin_threads = false;
    p.cpu_threads = 4097;
    ft_engine *e = nullptr;
    char err[256];
    EXPECT_EQ(ft_engine_create(&p, &e, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(e, nullptr);
    p.cpu_threads = 4096;
    ASSERT_EQ(ft_engine_create(&p, &e, err, sizeof err), FT_OK) << err;
    EnginePtr engine(e);
    ft_engine_info info;
    info.struct_size = sizeof info;
    ASSERT_EQ(ft_engine_get_info(e, &info), FT_OK);
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    EXPECT_GE(info.cpu_threads, 1);
    EXPECT_LE(info.cpu_threads, static_cast<int32_t>(hw));
}

// Four threads, one session each, one shared quantised model and engine: every result equals
// the one computed serially first (bit for bit).
TEST(HostileInputs, SharedModelFromFourThreads) {
    ScratchDir dir;
    auto engine = make_engine(2);
    auto model = load(engine.get(), write_q4_0_gguf(dir.path(), false));
    ASSERT_TRUE(model);
    constexpr int kThreads = 4, kSteps = 12;
    std::vector<std::vector<uint16_t>> xs(kThreads * kSteps), want(kThreads * kSteps);
    std::mt19937 rng(17);
    for (auto &x : xs) x = random_bf16(rng, 4 * 64, 1.0f);
    auto run = [&](ft_session *s, int i, std::vector<uint16_t> &out) {
        std::vector<float> logits(4 * 4);
        for (int t = 0; t < 4; ++t)
            for (int e = 0; e < 4; ++e) logits[t * 4 + e] = float((i + t * 3 + e * 5) % 7);
        int32_t ids[8];
        float w[8];
        out.assign(4 * 64, 0x7fc0);
        return ft_route(s, 0, 4, logits.data(), ids, w) == FT_OK &&
               ft_decode(s, 0, 4, xs[i].data(), ids, w, out.data()) == FT_OK;
    };
    {
        auto s = session(model.get(), true);
        for (int i = 0; i < kThreads * kSteps; ++i) ASSERT_TRUE(run(s.get(), i, want[i]));
    }
    std::vector<int> mismatches(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
            auto s = session(model.get(), true);
            std::vector<uint16_t> out;
            for (int k = 0; k < kSteps; ++k) {
                const int i = t * kSteps + k;
                if (!run(s.get(), i, out) || out != want[i]) ++mismatches[t];
            }
        });
    for (auto &th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

}  // namespace
