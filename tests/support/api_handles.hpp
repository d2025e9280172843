// Helpers of the tests that go through the public C API: RAII handles, engines and sessions
// made the way the tests want them, random bf16 data (scratch directories: scratch_dir.hpp).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "freetoken.h"
#include "moe_reference.hpp"
#include "scratch_dir.hpp"

namespace ft::test {

struct EngineDeleter { void operator()(ft_engine *e) const { ft_engine_free(e); } };
struct ModelDeleter { void operator()(ft_model *m) const { ft_model_free(m); } };
struct SessionDeleter { void operator()(ft_session *s) const { ft_session_free(s); } };
using EnginePtr = std::unique_ptr<ft_engine, EngineDeleter>;
using ModelPtr = std::unique_ptr<ft_model, ModelDeleter>;
using SessionPtr = std::unique_ptr<ft_session, SessionDeleter>;

inline EnginePtr make_engine(int threads = 2) {
    ft_engine_params p;
    ft_engine_params_init(&p);
    p.cpu_threads = threads;
    p.pin_threads = false;  // tests share the machine with other tests
    ft_engine *e = nullptr;
    char err[256];
    EXPECT_EQ(ft_engine_create(&p, &e, err, sizeof err), FT_OK) << err;
    return EnginePtr(e);
}

// The API tests check the CPU backend's semantics and counters; on a machine with a GPU `auto`
// would pick a GPU backend, so they ask for the CPU unless told otherwise.
inline SessionPtr make_session(ft_model *m, int max_tokens = 64, bool shared = false, int32_t backend = FT_BACKEND_CPU) {
    ft_session_params p;
    ft_session_params_init(&p);
    p.backend = backend;
    p.max_tokens = max_tokens;
    p.shared_experts = shared;
    ft_session *s = nullptr;
    char err[256];
    EXPECT_EQ(ft_session_create(m, &p, &s, err, sizeof err), FT_OK) << err;
    return SessionPtr(s);
}

inline std::vector<uint16_t> random_bf16(std::mt19937 &rng, size_t n, float scale) {
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<uint16_t> v(n);
    for (auto &x : v) x = f32_to_bf16_rne(u(rng));
    return v;
}


}  // namespace ft::test
