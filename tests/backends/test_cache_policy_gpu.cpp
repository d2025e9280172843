// The slot cache policy chosen through ft_session_params reaches the device: an offload session's
// hit and miss counts over a Zipf trace equal the host simulation of that policy (slot for slot
// the same admission), for LRU and for the frequency policy, whose counts differ on this trace,
// and for FT_CACHE_AUTO, which offload resolves to the frequency policy (hybrid to LRU,
// ft_session_cache_policy). Skips without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "api_handles.hpp"
#include "scratch_dir.hpp"
#include "synth_reference.hpp"
#include "freetoken.h"
#include "ft/slot_sim.hpp"
#include "ft/synth.hpp"
#include "ft/trace.hpp"

namespace {

using namespace ft::test;

TEST(CachePolicyGpu, OffloadHitsEqualTheSimulationOfEachPolicy) {
    auto engine = make_engine();
    ft_engine_info einfo;
    einfo.struct_size = sizeof einfo;
    if (!engine || ft_engine_get_info(engine.get(), &einfo) != FT_OK || einfo.device < 0) GTEST_SKIP() << "no usable GPU";
    ft::synth::Spec s;
    s.num_layers = 4;
    s.num_experts = 16;
    s.top_k = 4;
    s.hidden = 64;
    s.intermediate = 32;
    ScratchDir dir;
    const std::string path = write_synth_model(dir.path(), s);
    ft_model *raw = nullptr;
    char err[512];
    ASSERT_EQ(ft_model_load(engine.get(), path.c_str(), nullptr, &raw, err, sizeof err), FT_OK) << err;
    ModelPtr model(raw);

    ft::ZipfTraceSpec z;
    z.layers = 4;
    z.experts = 16;
    z.top_k = 4;
    z.steps = 150;
    z.s = 1.0;
    z.repeat = 0.2;
    z.seed = 3;
    const ft::RouteTrace trace = ft::make_zipf_trace(z);
    constexpr int32_t kSlots = 24;
    constexpr int32_t kHalfLifeSteps = 3;
    const ft::CacheSim lru = ft::simulate_slot_cache(trace, kSlots, {});
    const ft::CacheSim freq =
        ft::simulate_slot_cache(trace, kSlots, {ft::SlotPolicyKind::Frequency, int64_t(kHalfLifeSteps) * z.layers});
    ASSERT_NE(lru.hits, freq.hits) << "the trace does not tell the policies apart";

    // A one-token session of `backend` with kSlots slots and `policy`.
    auto open = [&](int32_t backend, int32_t policy) {
        ft_session_params p;
        ft_session_params_init(&p);
        p.backend = backend;
        p.max_tokens = 1;
        p.cache_slots = kSlots;
        p.vram_reserve_bytes = 0;
        p.cache_policy = policy;
        p.cache_half_life = kHalfLifeSteps;
        ft_session *sraw = nullptr;
        EXPECT_EQ(ft_session_create(model.get(), &p, &sraw, err, sizeof err), FT_OK) << err;
        return SessionPtr(sraw);
    };
    const std::vector<uint16_t> x(64, 0x3f80);
    std::vector<uint16_t> y(64);
    const std::vector<float> w(4, 0.25f);
    for (const int32_t policy : {FT_CACHE_LRU, FT_CACHE_FREQUENCY, FT_CACHE_AUTO}) {
        SessionPtr session = open(FT_BACKEND_OFFLOAD, policy);
        ft_session *sraw = session.get();
        ASSERT_NE(sraw, nullptr);
        const int32_t resolved = policy == FT_CACHE_AUTO ? FT_CACHE_FREQUENCY : policy;
        EXPECT_EQ(ft_session_cache_policy(sraw), resolved) << "policy " << policy;
        for (const auto &c : trace.calls)
            ASSERT_EQ(ft_decode(sraw, c.layer, 1, x.data(), c.ids.data(), w.data(), y.data()), FT_OK)
                << ft_session_last_error(sraw);
        ft_session_stats st;
        st.struct_size = sizeof st;
        ASSERT_EQ(ft_session_get_stats(sraw, &st), FT_OK);
        const ft::CacheSim &want = resolved == FT_CACHE_LRU ? lru : freq;
        EXPECT_EQ(int64_t(st.cache_hits), want.hits) << "policy " << policy;
        EXPECT_EQ(int64_t(st.cache_hits + st.cache_misses), want.requests) << "policy " << policy;
    }

    // Hybrid resolves AUTO to LRU and keeps an explicit choice; the resident backend has no cache.
    for (const int32_t backend : {FT_BACKEND_HYBRID, FT_BACKEND_GPU})
        for (const int32_t policy : {FT_CACHE_AUTO, FT_CACHE_FREQUENCY}) {
            SessionPtr session = open(backend, policy);
            ASSERT_NE(session.get(), nullptr);
            const int32_t want = backend == FT_BACKEND_GPU ? -1 : policy == FT_CACHE_AUTO ? FT_CACHE_LRU : policy;
            EXPECT_EQ(ft_session_cache_policy(session.get()), want) << "backend " << backend << " policy " << policy;
        }
}

}  // namespace
