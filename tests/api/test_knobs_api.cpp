// Knobs reach an engine when it is created: a setenv between two ft_engine_create calls changes
// the second engine only (docs/knobs.md), and a knob set to a value it cannot take is reported.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <unistd.h>

#include <cstdio>
#include <vector>

#include "freetoken.h"
#include "ft/trace.hpp"

namespace {

std::string engine_isa() {
    ft_engine_params p;
    ft_engine_params_init(&p);
    p.device = FT_DEVICE_NONE;
    p.cpu_threads = 1;
    ft_engine *e = nullptr;
    char err[256];
    if (ft_engine_create(&p, &e, err, sizeof err) != FT_OK) return std::string("error: ") + err;
    ft_engine_info info;
    info.struct_size = sizeof info;
    const ft_status s = ft_engine_get_info(e, &info);
    std::string isa = s == FT_OK ? info.cpu_isa : "error";
    ft_engine_free(e);
    return isa;
}

TEST(KnobsApi, EachEngineReadsTheEnvironmentAtCreation) {
    const char *old = std::getenv("FT_CPU_ISA");
    const std::string saved = old ? old : "";
    unsetenv("FT_CPU_ISA");
    const std::string best = engine_isa();
    setenv("FT_CPU_ISA", "scalar", 1);
    EXPECT_EQ(engine_isa(), "scalar");
    unsetenv("FT_CPU_ISA");
    EXPECT_EQ(engine_isa(), best);
    if (old) setenv("FT_CPU_ISA", saved.c_str(), 1);
}

// FT_TRACE_ROUTES: an engine created with it records every host ft_decode call (failed calls
// not), a second session appends to the same file, and the reader gets the calls back.
TEST(KnobsApi, TraceRoutesRecordsDecodeCallsThatReadBack) {
    const std::string path = std::string(::testing::TempDir()) + "/routes_" + std::to_string(::getpid()) + ".ftroutes";
    std::remove(path.c_str());
    setenv("FT_TRACE_ROUTES", path.c_str(), 1);
    ft_engine_params ep;
    ft_engine_params_init(&ep);
    ep.device = FT_DEVICE_NONE;
    ep.cpu_threads = 1;
    ft_engine *e = nullptr;
    char err[256];
    const ft_status created = ft_engine_create(&ep, &e, err, sizeof err);
    unsetenv("FT_TRACE_ROUTES");
    ASSERT_EQ(created, FT_OK) << err;
    ft_model_desc d;
    ft_model_desc_init(&d);
    d.num_layers = 3;
    d.num_experts = 6;
    d.top_k = 2;
    d.hidden_size = 32;
    d.intermediate_size = 16;
    ft_model *m = nullptr;
    ASSERT_EQ(ft_model_create(e, &d, &m, err, sizeof err), FT_OK) << err;
    const std::vector<uint16_t> w(32 * 16, 0x3c00);  // bf16 0.0078125
    for (int l = 0; l < 3; ++l)
        for (int x = 0; x < 6; ++x)
            for (int p = FT_PROJ_GATE; p <= FT_PROJ_DOWN; ++p)
                ASSERT_EQ(ft_model_set_expert(m, l, x, p, w.data(), w.size() * 2), FT_OK);
    ASSERT_EQ(ft_model_finalize(m), FT_OK);
    const std::vector<uint16_t> h(2 * 32, 0x3f80);
    std::vector<uint16_t> out(2 * 32);
    const std::vector<float> rw(4, 0.5f);
    ft::RouteTrace want;
    want.layers = 3;
    want.experts = 6;
    want.top_k = 2;
    for (int session = 0; session < 2; ++session) {
        ft_session_params sp;
        ft_session_params_init(&sp);
        sp.backend = FT_BACKEND_CPU;
        ft_session *s = nullptr;
        ASSERT_EQ(ft_session_create(m, &sp, &s, err, sizeof err), FT_OK) << err;
        for (int call = 0; call < 4; ++call) {
            ft::TraceCall c;
            c.layer = (call + session) % 3;
            c.tokens = 1 + call % 2;
            for (int i = 0; i < c.tokens * 2; ++i) c.ids.push_back((call * 5 + i * 3 + session) % 6 - (i == 1 ? 7 : 0));
            ASSERT_EQ(ft_decode(s, c.layer, c.tokens, h.data(), c.ids.data(), rw.data(), out.data()), FT_OK);
            want.calls.push_back(c);
        }
        const int32_t bad[2] = {0, 6};  // refused: not recorded
        EXPECT_EQ(ft_decode(s, 0, 1, h.data(), bad, rw.data(), out.data()), FT_ERR_INVALID_ARGUMENT);
        ft_session_free(s);
    }
    ft_model_free(m);
    ft_engine_free(e);
    const ft::RouteTrace got = ft::read_route_trace(path);
    EXPECT_EQ(got.layers, 3);
    EXPECT_EQ(got.experts, 6);
    EXPECT_EQ(got.top_k, 2);
    ASSERT_EQ(got.calls.size(), want.calls.size());
    for (size_t i = 0; i < want.calls.size(); ++i) {
        EXPECT_EQ(got.calls[i].layer, want.calls[i].layer) << i;
        EXPECT_EQ(got.calls[i].tokens, want.calls[i].tokens) << i;
        EXPECT_EQ(got.calls[i].ids, want.calls[i].ids) << i;
    }
    std::remove(path.c_str());
}

}  // namespace
