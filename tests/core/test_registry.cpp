// The backend registry: one row per FT_BACKEND_* id with a unique name, the names and device paths
// the rest of the library reads from it, and the selector's slot prediction computed by the slot
// cache's own sizing rule.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "freetoken.h"
#include "ft/backend_registry.hpp"
#include "ft/common.hpp"
#include "ft/selector.hpp"
#include "ft/slotcache.hpp"

namespace {

TEST(BackendRegistry, OneRowPerBackendWithUniqueNames) {
    const int32_t ids[] = {FT_BACKEND_CPU, FT_BACKEND_GPU, FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID};
    EXPECT_EQ(ft::backend_registry().size(), sizeof ids / sizeof ids[0]);
    std::set<std::string> names;
    for (int32_t id : ids) {
        const ft::BackendInfo *b = ft::find_backend(id);
        ASSERT_NE(b, nullptr) << id;
        EXPECT_EQ(b->id, id);
        EXPECT_TRUE(names.insert(b->name).second) << b->name;
        EXPECT_STREQ(ft::backend_name(id), b->name);
        EXPECT_EQ(ft::find_backend(std::string(b->name)), b);
        ASSERT_NE(b->unavailable, nullptr) << b->name;
    }
    EXPECT_EQ(ft::find_backend(FT_BACKEND_AUTO), nullptr);  // a request, not a backend
    EXPECT_EQ(ft::find_backend(int32_t{99}), nullptr);
    EXPECT_EQ(ft::find_backend(std::string("auto")), nullptr);
    EXPECT_STREQ(ft::backend_name(FT_BACKEND_AUTO), "auto");
    EXPECT_STREQ(ft::backend_name(99), "unknown");
}

TEST(BackendRegistry, DevicePathsAndFactories) {
    EXPECT_FALSE(ft::find_backend(FT_BACKEND_CPU)->device_path);
    EXPECT_NE(ft::find_backend(FT_BACKEND_CPU)->make, nullptr);  // every build has the CPU backend
    for (int32_t id : {FT_BACKEND_GPU, FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID}) EXPECT_TRUE(ft::find_backend(id)->device_path);
}

TEST(BackendRegistry, ProbesRefuseTheGpuBackendsWithoutKernels) {
    ft::ModelSpec m;
    m.num_layers = 2;
    m.num_experts = 8;
    m.top_k = 2;
    m.hidden = 64;
    m.intermediate = 32;
    ft::MachineCaps caps;  // no GPU, no CUDA kernels
    EXPECT_EQ(ft::find_backend(FT_BACKEND_CPU)->unavailable(caps, m), "");
    for (int32_t id : {FT_BACKEND_GPU, FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID}) {
        EXPECT_EQ(ft::find_backend(id)->unavailable(caps, m), "this build has no CUDA support");
        try {
            ft::select_backend(id, caps, m);
            ADD_FAILURE() << "backend " << id << " selected without a GPU";
        } catch (const ft::Error &e) {
            EXPECT_EQ(e.status(), FT_ERR_UNSUPPORTED);
        }
    }
    EXPECT_EQ(ft::select_backend(FT_BACKEND_CPU, caps, m).backend, FT_BACKEND_CPU);
}

// bf16 gpt-oss (expert biases) runs on the GPU backends; their memory probes count the bias
// tables the backends keep resident (f32, every layer): a GPU that holds the experts but not the
// tables is refused by gpu, and by offload when one layer plus the tables do not fit.
TEST(BackendRegistry, GpuBackendsTakeExpertBiasesAndCountTheirTables) {
    ft::ModelSpec m;
    m.num_layers = 3;
    m.num_experts = 8;
    m.top_k = 2;
    m.hidden = 64;
    m.intermediate = 32;
    m.activation = FT_ACT_SWIGLU_CLAMP;
    m.expert_biases = true;
    const uint64_t tables = uint64_t(3) * 8 * (2 * 32 + 64) * sizeof(float);
    EXPECT_EQ(ft::gpu_bias_bytes(m), tables);
    ft::ModelSpec plain = m;
    plain.expert_biases = false;
    EXPECT_EQ(ft::gpu_bias_bytes(plain), 0u);

    ft::MachineCaps caps;
    caps.gpu = caps.gpu_kernels = true;
    caps.gpu_free_bytes = m.routed_bytes() + tables;  // exactly enough
    for (int32_t id : {FT_BACKEND_GPU, FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID})
        EXPECT_EQ(ft::find_backend(id)->unavailable(caps, m), "") << ft::backend_name(id);
    caps.gpu_free_bytes -= 1;
    EXPECT_NE(ft::find_backend(FT_BACKEND_GPU)->unavailable(caps, m), "");
    EXPECT_EQ(ft::find_backend(FT_BACKEND_GPU)->unavailable(caps, plain), "");
    const uint64_t layer = m.max_expert_bytes() * uint64_t(m.num_experts);
    caps.gpu_free_bytes = layer + tables - 1;
    const std::string why = ft::find_backend(FT_BACKEND_OFFLOAD)->unavailable(caps, m);
    EXPECT_NE(why.find("biases"), std::string::npos) << why;
    EXPECT_EQ(ft::find_backend(FT_BACKEND_OFFLOAD)->unavailable(caps, plain), "");
}

// The selector predicts the slots with plan_slots itself: over a sweep of requests and memory,
// its fraction times L * E is what plan_slots gives once the two prefill buffers are taken, and 0
// exactly where plan_slots refuses.
TEST(BackendRegistry, SlotPredictionIsTheSlotCacheRule) {
    ft::ModelSpec m;
    m.num_layers = 6;
    m.num_experts = 16;
    m.top_k = 4;
    m.hidden = 256;
    m.intermediate = 128;
    const uint64_t eb = ft::expert_bytes(m.format, m.hidden, m.intermediate);
    const uint64_t prefill = 2 * eb * uint64_t(m.num_experts);
    const double all = double(m.num_layers) * m.num_experts;
    int refused = 0, planned = 0;
    for (int64_t count : {0, 8, 16, 40, 200}) {
        for (double fraction : {0.0, 0.1, 0.2, 0.5, 2.0}) {
            for (uint64_t free_experts : {0, 20, 40, 60, 200}) {
                for (uint64_t reserve_experts : {0, 10}) {
                    ft::MachineCaps caps;
                    caps.gpu = caps.gpu_kernels = true;
                    caps.gpu_free_bytes = free_experts * eb;
                    caps.vram_reserve_bytes = reserve_experts * eb;
                    ft::SelectionInputs in;
                    in.cache_slots = count;
                    in.cache_fraction = fraction;
                    ft::SlotRequest r;
                    r.count = count;
                    r.fraction = fraction;
                    r.free_bytes = caps.gpu_free_bytes > prefill ? caps.gpu_free_bytes - prefill : 0;
                    r.reserve_bytes = caps.vram_reserve_bytes;
                    const ft::SlotPlan p = ft::plan_slots(r, m.num_layers, m.num_experts, eb);
                    const double predicted = ft::expected_slot_fraction(caps, m, in);
                    if (p.status == FT_OK) {
                        ++planned;
                        EXPECT_DOUBLE_EQ(predicted * all, double(p.slots)) << count << " " << fraction << " " << free_experts;
                    } else {
                        ++refused;
                        EXPECT_EQ(predicted, 0.0) << p.why;
                    }
                }
            }
        }
    }
    EXPECT_GT(planned, 0);
    EXPECT_GT(refused, 0);
}

TEST(BackendRegistry, PlanSlotCountThrowsWhatPlanSlotsRefuses) {
    ft::SlotRequest r;
    r.count = 3;
    const ft::SlotPlan p = ft::plan_slots(r, 4, 32, 1000);
    EXPECT_EQ(p.status, FT_ERR_INVALID_ARGUMENT);
    try {
        ft::plan_slot_count(r, 4, 32, 1000);
        ADD_FAILURE() << "plan_slot_count accepted " << r.count << " slots";
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), p.status);
        EXPECT_EQ(std::string(e.what()), p.why);
    }
}

}  // namespace
