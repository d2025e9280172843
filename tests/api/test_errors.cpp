// Bad input through the C API: every case gets its status and a message, never a crash.
#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>

#include "api_handles.hpp"
#include "ft/synth.hpp"

namespace {

using namespace ft::test;

ModelPtr tiny_model(ft_engine *engine, bool finalize = true) {
    ft_model_desc d;
    ft_model_desc_init(&d);
    d.num_layers = 2;
    d.num_experts = 4;
    d.top_k = 2;
    d.hidden_size = 32;
    d.intermediate_size = 16;
    ft_model *m = nullptr;
    char err[256];
    EXPECT_EQ(ft_model_create(engine, &d, &m, err, sizeof err), FT_OK) << err;
    std::mt19937 rng(1);
    const auto w = random_bf16(rng, 32 * 16, 0.2f);
    if (finalize) {
        for (int l = 0; l < 2; ++l)
            for (int e = 0; e < 4; ++e)
                for (int p = FT_PROJ_GATE; p <= FT_PROJ_DOWN; ++p) EXPECT_EQ(ft_model_set_expert(m, l, e, p, w.data(), w.size() * 2), FT_OK);
        EXPECT_EQ(ft_model_finalize(m), FT_OK);
    }
    return ModelPtr(m);
}

bool contains(const char *text, const char *what) { return text && std::string(text).find(what) != std::string::npos; }

TEST(Errors, NullArguments) {
    char err[128];
    EXPECT_EQ(ft_engine_create(nullptr, nullptr, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(err, "NULL"));
    auto engine = make_engine();
    ft_model *m = reinterpret_cast<ft_model *>(0x1);
    EXPECT_EQ(ft_model_load(engine.get(), nullptr, nullptr, &m, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(m, nullptr);
    EXPECT_EQ(ft_model_load(nullptr, "/tmp", nullptr, &m, nullptr, 0), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_model_create(engine.get(), nullptr, &m, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_session_create(nullptr, nullptr, nullptr, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_model_set_expert(nullptr, 0, 0, FT_PROJ_GATE, nullptr, 0), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_model_finalize(nullptr), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_route(nullptr, 0, 1, nullptr, nullptr, nullptr), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_session_get_stats(nullptr, nullptr), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_engine_get_info(engine.get(), nullptr), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_model_moe_layer(nullptr, 0), -1);
    EXPECT_EQ(ft_session_backend(nullptr), -1);
    EXPECT_EQ(ft_session_cache_policy(nullptr), -1);
    EXPECT_STREQ(ft_session_last_error(nullptr), "handle is NULL");

    auto model = tiny_model(engine.get());
    auto session = make_session(model.get(), 4);
    uint16_t x[32] = {}, y[32];
    int32_t ids[2] = {0, 1};
    float w[2] = {0.5f, 0.5f};
    EXPECT_EQ(ft_decode(session.get(), 0, 1, nullptr, ids, w, y), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_decode(session.get(), 0, 1, x, nullptr, w, y), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_decode(session.get(), 0, 1, x, ids, nullptr, y), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_decode(session.get(), 0, 1, x, ids, w, nullptr), FT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(ft_session_last_error(session.get()), "NULL"));
}

TEST(Errors, BadEngineParams) {
    ft_engine_params p;
    ft_engine_params_init(&p);
    p.cpu_threads = -1;
    ft_engine *e = nullptr;
    char err[256];
    EXPECT_EQ(ft_engine_create(&p, &e, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(err, "cpu_threads"));
    ft_engine_params_init(&p);
    p.device = 64;  // no machine has this GPU
    EXPECT_EQ(ft_engine_create(&p, &e, err, sizeof err), FT_ERR_NO_DEVICE);
    EXPECT_EQ(e, nullptr);
    // A tiny error buffer gets a truncated, terminated message.
    char small[8];
    EXPECT_EQ(ft_engine_create(&p, &e, small, sizeof small), FT_ERR_NO_DEVICE);
    EXPECT_EQ(std::strlen(small), 7u);
}

TEST(Errors, DecodeArgumentsOutOfRange) {
    auto engine = make_engine();
    auto model = tiny_model(engine.get());
    auto session = make_session(model.get(), 4);
    std::mt19937 rng(2);
    auto x = random_bf16(rng, 4 * 32, 1.0f);
    std::vector<uint16_t> y(4 * 32);
    std::vector<int32_t> ids = {0, 1, 2, 3, 1, 0, 3, 2};
    std::vector<float> w(8, 0.5f);
    ft_session *s = session.get();
    EXPECT_EQ(ft_decode(s, 2, 1, x.data(), ids.data(), w.data(), y.data()), FT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(ft_session_last_error(s), "layer 2"));
    EXPECT_EQ(ft_decode(s, -1, 1, x.data(), ids.data(), w.data(), y.data()), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_decode(s, 0, 0, x.data(), ids.data(), w.data(), y.data()), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_decode(s, 0, 5, x.data(), ids.data(), w.data(), y.data()), FT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(ft_session_last_error(s), "max_tokens"));

    ids[5] = 4;  // token 2, route 1: E = 4
    EXPECT_EQ(ft_decode(s, 0, 4, x.data(), ids.data(), w.data(), y.data()), FT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(ft_session_last_error(s), "token 2 route 1")) << ft_session_last_error(s);
    ids[5] = 0;

    w[3] = NAN;
    EXPECT_EQ(ft_decode(s, 0, 4, x.data(), ids.data(), w.data(), y.data()), FT_ERR_NON_FINITE);
    w[3] = INFINITY;
    EXPECT_EQ(ft_decode(s, 0, 4, x.data(), ids.data(), w.data(), y.data()), FT_ERR_NON_FINITE);
    ids[3] = -1;  // a weight of a route computed elsewhere is not looked at
    EXPECT_EQ(ft_decode(s, 0, 4, x.data(), ids.data(), w.data(), y.data()), FT_OK) << ft_session_last_error(s);
    w[3] = 0.5f;

    x[2 * 32 + 7] = 0x7f80;  // +Inf
    EXPECT_EQ(ft_decode(s, 0, 4, x.data(), ids.data(), w.data(), y.data()), FT_ERR_NON_FINITE);
    EXPECT_TRUE(contains(ft_session_last_error(s), "token 2 channel 7")) << ft_session_last_error(s);
    x[2 * 32 + 7] = 0;

    // out may not alias hidden.
    EXPECT_EQ(ft_decode(s, 0, 4, x.data(), ids.data(), w.data(), x.data() + 16), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_decode(s, 0, 4, x.data(), ids.data(), w.data(), y.data()), FT_OK);

    std::vector<float> logits(4 * 4, 0.1f);
    logits[6] = NAN;
    EXPECT_EQ(ft_route(s, 0, 4, logits.data(), ids.data(), w.data()), FT_ERR_NON_FINITE);
    EXPECT_EQ(ft_route(s, 7, 4, logits.data(), ids.data(), w.data()), FT_ERR_INVALID_ARGUMENT);
}

// The 0.2 session surface without a GPU: GPU backends are refused with a reason, bad slot cache /
// hybrid parameters are argument errors, and the GPU statistics of a CPU session are zeros.
TEST(Errors, GpuSessionParametersWithoutAGpu) {
    ft_engine_params ep;
    ft_engine_params_init(&ep);
    ep.device = FT_DEVICE_NONE;
    ep.cpu_threads = 2;
    ep.pin_threads = false;
    ft_engine *eraw = nullptr;
    char err[512];
    ASSERT_EQ(ft_engine_create(&ep, &eraw, err, sizeof err), FT_OK) << err;
    EnginePtr engine(eraw);
    auto model = tiny_model(engine.get());
    ft_session_params p;
    ft_session_params_init(&p);
    EXPECT_EQ(p.cache_slots, 0);
    EXPECT_EQ(p.vram_reserve_bytes, uint64_t(2) << 30);
    EXPECT_TRUE(p.hybrid_adaptive);
    EXPECT_EQ(p.handoff_timeout_seconds, 10.0);
    EXPECT_EQ(p.cache_policy, FT_CACHE_AUTO);
    EXPECT_EQ(p.cache_half_life, 0);
    ft_session *s = nullptr;
    for (int32_t b : {FT_BACKEND_GPU, FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID}) {
        p.backend = b;
        EXPECT_EQ(ft_session_create(model.get(), &p, &s, err, sizeof err), FT_ERR_UNSUPPORTED) << b;
        EXPECT_EQ(s, nullptr);
        EXPECT_TRUE(contains(err, "GPU") || contains(err, "CUDA")) << err;
    }
    p.backend = 99;
    EXPECT_EQ(ft_session_create(model.get(), &p, &s, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    p.backend = FT_BACKEND_AUTO;
    p.cache_fraction = 1.5;
    EXPECT_EQ(ft_session_create(model.get(), &p, &s, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(err, "cache_fraction")) << err;
    p.cache_fraction = 0.0;
    p.cache_slots = -3;
    EXPECT_EQ(ft_session_create(model.get(), &p, &s, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    p.cache_slots = 0;
    p.prefill_min_tokens = -1;
    EXPECT_EQ(ft_session_create(model.get(), &p, &s, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    p.prefill_min_tokens = 0;
    for (const int32_t bad : {3, -1}) {
        p.cache_policy = bad;
        EXPECT_EQ(ft_session_create(model.get(), &p, &s, err, sizeof err), FT_ERR_INVALID_ARGUMENT) << bad;
        EXPECT_TRUE(contains(err, "cache_policy")) << err;
    }
    p.cache_policy = FT_CACHE_FREQUENCY;
    p.cache_half_life = -1;
    EXPECT_EQ(ft_session_create(model.get(), &p, &s, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(err, "cache_half_life")) << err;
    p.cache_half_life = 16;  // valid; the CPU backend has no slot cache and ignores it

    // auto without a GPU is the CPU, and says so.
    ASSERT_EQ(ft_session_create(model.get(), &p, &s, err, sizeof err), FT_OK) << err;
    SessionPtr session(s);
    EXPECT_EQ(ft_session_backend(s), FT_BACKEND_CPU);
    EXPECT_EQ(ft_session_cache_policy(s), -1);  // no slot cache
    EXPECT_GT(std::strlen(ft_session_backend_reason(s)), 0u);
    EXPECT_EQ(ft_session_status(s), FT_OK);
    EXPECT_EQ(ft_session_status(nullptr), FT_ERR_INVALID_ARGUMENT);
    std::mt19937 rng(3);
    const auto x = random_bf16(rng, 32, 1.0f);
    std::vector<uint16_t> y(32);
    const std::vector<int32_t> ids = {1, 3};
    const std::vector<float> w = {0.5f, 0.5f};
    ASSERT_EQ(ft_decode(s, 1, 1, x.data(), ids.data(), w.data(), y.data()), FT_OK);
    ft_session_stats st;
    st.struct_size = sizeof st;
    ASSERT_EQ(ft_session_get_stats(s, &st), FT_OK);
    EXPECT_EQ(st.routes_cpu, 2u);
    EXPECT_EQ(st.routes_gpu, 0u);
    EXPECT_EQ(st.cache_hits + st.cache_misses + st.fetched_bytes + st.prefill_calls, 0u);
    ft_layer_stats ls;
    std::memset(&ls, 0xab, sizeof ls);
    ls.struct_size = sizeof ls;
    ASSERT_EQ(ft_session_get_layer_stats(s, 1, &ls), FT_OK);
    EXPECT_EQ(ls.calls + ls.active_experts + ls.misses + ls.fetched_experts + ls.fetched_bytes, 0u);
    EXPECT_EQ(ft_session_get_layer_stats(s, 2, &ls), FT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(ft_session_last_error(s), "layer 2")) << ft_session_last_error(s);
    EXPECT_EQ(ft_session_get_layer_stats(nullptr, 0, &ls), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_session_get_layer_stats(s, 0, nullptr), FT_ERR_INVALID_ARGUMENT);
}

TEST(Errors, ModelBuildingRules) {
    auto engine = make_engine();
    auto model = tiny_model(engine.get(), false);
    ft_model *m = model.get();
    std::mt19937 rng(3);
    const auto w = random_bf16(rng, 32 * 16, 0.2f);
    EXPECT_EQ(ft_model_set_expert(m, 0, 0, FT_PROJ_GATE, w.data(), w.size() * 2 - 2), FT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(ft_model_last_error(m), "bytes"));
    EXPECT_EQ(ft_model_set_expert(m, 0, 4, FT_PROJ_GATE, w.data(), w.size() * 2), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_model_set_expert(m, 2, 0, FT_PROJ_GATE, w.data(), w.size() * 2), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_model_set_expert(m, 0, 0, 9, w.data(), w.size() * 2), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_model_set_expert(m, 0, 0, FT_PROJ_GATE, nullptr, w.size() * 2), FT_ERR_INVALID_ARGUMENT);
    const float bias[4] = {0, 0, NAN, 0};
    EXPECT_EQ(ft_model_set_router_bias(m, 0, bias, 4), FT_ERR_NON_FINITE);
    EXPECT_EQ(ft_model_set_router_bias(m, 0, bias, 3), FT_ERR_INVALID_ARGUMENT);

    // A session needs a finalized model; finalize names the first missing projection.
    ft_session *s = nullptr;
    char err[256];
    EXPECT_EQ(ft_session_create(m, nullptr, &s, err, sizeof err), FT_ERR_STATE);
    for (int l = 0; l < 2; ++l)
        for (int e = 0; e < 4; ++e)
            for (int p = FT_PROJ_GATE; p <= FT_PROJ_DOWN; ++p)
                if (!(l == 1 && e == 3 && p == FT_PROJ_UP)) {
                    ASSERT_EQ(ft_model_set_expert(m, l, e, p, w.data(), w.size() * 2), FT_OK);
                }
    EXPECT_EQ(ft_model_finalize(m), FT_ERR_STATE);
    EXPECT_TRUE(contains(ft_model_last_error(m), "layer 1 expert 3: the up projection")) << ft_model_last_error(m);
    ASSERT_EQ(ft_model_set_expert(m, 1, 3, FT_PROJ_UP, w.data(), w.size() * 2), FT_OK);
    EXPECT_EQ(ft_model_finalize(m), FT_OK);
    EXPECT_EQ(ft_model_finalize(m), FT_ERR_STATE);
    EXPECT_EQ(ft_model_set_expert(m, 0, 0, FT_PROJ_GATE, w.data(), w.size() * 2), FT_ERR_STATE);

    // Shared experts cannot be asked of a model without them.
    ft_session_params sp;
    ft_session_params_init(&sp);
    sp.shared_experts = true;
    EXPECT_EQ(ft_session_create(m, &sp, &s, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(err, "shared"));
    sp.shared_experts = false;
    sp.max_tokens = 0;
    EXPECT_EQ(ft_session_create(m, &sp, &s, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    sp.max_tokens = 4;
    sp.backend = 99;
    EXPECT_EQ(ft_session_create(m, &sp, &s, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s, nullptr);

    ft_tensor_view v;
    v.struct_size = sizeof v;
    EXPECT_EQ(ft_model_tensor(m, 0, FT_TENSOR_ROUTER_WEIGHT, &v), FT_ERR_UNSUPPORTED);  // built from memory
    EXPECT_EQ(ft_model_tensor(m, 5, FT_TENSOR_ROUTER_WEIGHT, &v), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ft_model_tensor(m, 0, 42, &v), FT_ERR_INVALID_ARGUMENT);
}

TEST(Errors, BadDescriptions) {
    auto engine = make_engine();
    ft_model_desc d;
    ft_model_desc_init(&d);
    ft_model *m = nullptr;
    char err[256];
    EXPECT_EQ(ft_model_create(engine.get(), &d, &m, err, sizeof err), FT_ERR_INVALID_ARGUMENT);  // all zero
    d.num_layers = 1;
    d.num_experts = 4;
    d.top_k = 5;
    d.hidden_size = 32;
    d.intermediate_size = 16;
    EXPECT_EQ(ft_model_create(engine.get(), &d, &m, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(err, "top_k"));
    d.top_k = 2;
    d.format = 77;
    EXPECT_EQ(ft_model_create(engine.get(), &d, &m, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    d.format = FT_FORMAT_NVFP4;
    EXPECT_EQ(ft_model_create(engine.get(), &d, &m, err, sizeof err), FT_ERR_UNSUPPORTED);
    EXPECT_TRUE(contains(err, "checkpoint")) << err;
    d.format = FT_FORMAT_BF16;
    d.activation = 12;
    EXPECT_EQ(ft_model_create(engine.get(), &d, &m, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    d.activation = FT_ACT_SILU;
    d.routing = FT_ROUTING_SIGMOID_GROUP_TOPK;
    d.num_groups = 3;
    EXPECT_EQ(ft_model_create(engine.get(), &d, &m, err, sizeof err), FT_ERR_INVALID_ARGUMENT);
    d.num_groups = 2;
    EXPECT_EQ(ft_model_create(engine.get(), &d, &m, err, sizeof err), FT_OK) << err;
    ft_model_free(m);
}

TEST(Errors, BadCheckpoints) {
    auto engine = make_engine();
    ft_model *m = nullptr;
    char err[512];
    EXPECT_EQ(ft_model_load(engine.get(), "/nonexistent/freetoken/model", nullptr, &m, err, sizeof err), FT_ERR_IO);
    EXPECT_TRUE(contains(err, "/nonexistent/freetoken/model")) << err;
    EXPECT_TRUE(contains(err, std::strerror(ENOENT))) << err;  // the OS's reason, named

    ScratchDir dir;
    // A directory without config.json (nor a .gguf file): the missing file and the OS's reason.
    EXPECT_EQ(ft_model_load(engine.get(), dir.path().c_str(), nullptr, &m, err, sizeof err), FT_ERR_IO);
    EXPECT_TRUE(contains(err, "config.json")) << err;
    EXPECT_TRUE(contains(err, std::strerror(ENOENT))) << err;

    ft::synth::Spec s;
    s.num_experts = 4;
    s.hidden = 32;
    s.intermediate = 16;
    ft::synth::write_checkpoint(dir.path(), s);
    ASSERT_EQ(ft_model_load(engine.get(), dir.path().c_str(), nullptr, &m, err, sizeof err), FT_OK) << err;
    ft_model_free(m);

    // Truncated shard.
    const std::string shard = dir.path() + "/model.safetensors";
    std::ifstream in(shard, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    std::ofstream(shard, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
    m = reinterpret_cast<ft_model *>(0x1);
    EXPECT_EQ(ft_model_load(engine.get(), dir.path().c_str(), nullptr, &m, err, sizeof err), FT_ERR_FORMAT);
    EXPECT_EQ(m, nullptr);
    EXPECT_TRUE(contains(err, "model.safetensors")) << err;

    // Malformed config.json.
    std::ofstream(dir.path() + "/config.json", std::ios::trunc) << "{\"model_type\": \"qwen3_moe\", ";
    EXPECT_EQ(ft_model_load(engine.get(), dir.path().c_str(), nullptr, &m, err, sizeof err), FT_ERR_FORMAT);
    EXPECT_TRUE(contains(err, "config.json")) << err;
    std::ofstream(dir.path() + "/config.json", std::ios::trunc) << "{\"model_type\": \"llama\"}";
    EXPECT_EQ(ft_model_load(engine.get(), dir.path().c_str(), nullptr, &m, err, sizeof err), FT_ERR_UNSUPPORTED);
    EXPECT_TRUE(contains(err, "llama")) << err;
}

TEST(Errors, LoadCanBeCancelled) {
    auto engine = make_engine();
    ScratchDir dir;
    ft::synth::Spec s;
    s.num_experts = 8;
    s.hidden = 256;
    s.intermediate = 128;
    ft::synth::write_checkpoint(dir.path(), s);
    ft_model_load_params p;
    ft_model_load_params_init(&p);
    int calls = 0;
    p.progress = [](void *u, const char *phase, uint64_t, uint64_t) {
        ++*static_cast<int *>(u);
        return std::string(phase) != "load";
    };
    p.progress_user_data = &calls;
    ft_model *m = nullptr;
    char err[256];
    EXPECT_EQ(ft_model_load(engine.get(), dir.path().c_str(), &p, &m, err, sizeof err), FT_ERR_CANCELLED);
    EXPECT_EQ(m, nullptr);
    EXPECT_GE(calls, 1);
}

TEST(Logging, CallbackReceivesMessagesAtItsLevel) {
    static std::mutex mu;
    static std::vector<std::pair<int, std::string>> seen;
    ft_log_set_callback(
        [](void *, int32_t level, const char *msg) {
            std::lock_guard<std::mutex> lock(mu);
            seen.emplace_back(level, msg);
        },
        nullptr, FT_LOG_INFO);
    {
        auto engine = make_engine();
    }
    ft_log_set_callback(nullptr, nullptr, FT_LOG_WARN);
    std::lock_guard<std::mutex> lock(mu);
    bool engine_line = false;
    for (auto &m : seen) {
        EXPECT_LE(m.first, FT_LOG_INFO);
        engine_line |= m.second.find("engine:") != std::string::npos;
    }
    EXPECT_TRUE(engine_line);
}

}  // namespace
