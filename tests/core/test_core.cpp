#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <unistd.h>

#include "ft/bank.hpp"
#include "ft/common.hpp"
#include "ft/hybrid.hpp"
#include "ft/model.hpp"
#include "ft/selector.hpp"
#include "ft/slotcache.hpp"

namespace {

TEST(HybridSplit, IntegerSplitIsTheBruteForceOptimum) {
    for (double f : {0.1, 0.415, 0.454, 0.7, 1.0}) {
        const int32_t q = ft::fraction_to_q16(f);
        for (int64_t M = 0; M <= 64; ++M) {
            const int64_t F = ft::hybrid_fetch_count(M, q);
            ASSERT_GE(F, 0);
            ASSERT_LE(F, M);
            EXPECT_LE(std::abs(static_cast<double>(F) - f * M), 1.0) << "f=" << f << " M=" << M;
            // No other integer split makes the slower side faster; ties go to the lower F.
            auto cost = [&](int64_t g) { return std::max(g * (65536 - q), (M - g) * static_cast<int64_t>(q)); };
            int64_t best = 0;
            for (int64_t g = 0; g <= M; ++g)
                if (cost(g) < cost(best)) best = g;
            EXPECT_EQ(F, best) << "f=" << f << " M=" << M;
        }
    }
    EXPECT_EQ(ft::hybrid_fetch_count(3, ft::fraction_to_q16(0.415)), 1);
    EXPECT_EQ(ft::hybrid_fetch_count(4, ft::fraction_to_q16(0.415)), 2);
    EXPECT_EQ(ft::hybrid_fetch_count(9, ft::fraction_to_q16(1.0)), 9);
    EXPECT_EQ(ft::hybrid_fetch_count(9, 0), 0);
}

TEST(HybridSplit, FractionForFetchLandsOnThatFetch) {
    for (int64_t M = 1; M <= 512; ++M)
        for (int64_t F = 0; F <= M; ++F)
            ASSERT_EQ(ft::hybrid_fetch_count(M, ft::fraction_to_q16(ft::fraction_for_fetch(F, M))), F)
                << "M=" << M << " F=" << F;
    EXPECT_EQ(ft::fraction_for_fetch(3, 0), 0.0);
    EXPECT_EQ(ft::fraction_for_fetch(-1, 4), ft::fraction_for_fetch(0, 4));
    EXPECT_EQ(ft::fraction_for_fetch(9, 4), ft::fraction_for_fetch(4, 4));
}

TEST(HybridSplit, FractionConversionClamps) {
    EXPECT_EQ(ft::fraction_to_q16(-1.0), 0);
    EXPECT_EQ(ft::fraction_to_q16(NAN), 0);
    EXPECT_EQ(ft::fraction_to_q16(2.0), 65536);
    EXPECT_EQ(ft::fraction_to_q16(0.5), 32768);
}

TEST(SlotCache, SizingRules) {
    ft::SlotRequest r;
    r.count = 100;
    EXPECT_EQ(ft::plan_slot_count(r, 4, 32, 1000), 100);
    r.count = 1000;
    EXPECT_EQ(ft::plan_slot_count(r, 4, 32, 1000), 128);  // capped at L*E
    r.count = 10;
    EXPECT_THROW(ft::plan_slot_count(r, 4, 32, 1000), ft::Error);  // below one layer
    r = {};
    r.fraction = 0.3;
    EXPECT_EQ(ft::plan_slot_count(r, 10, 8, 1000), 24);  // ceil(80 * 0.3)
    r = {};
    r.free_bytes = 50'000;
    r.reserve_bytes = 10'000;
    EXPECT_EQ(ft::plan_slot_count(r, 4, 32, 1000), 40);
    r.free_bytes = 20'000;
    try {
        ft::plan_slot_count(r, 4, 32, 1000);
        FAIL();
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_OUT_OF_MEMORY);
    }
}

TEST(Banks, PageAlignedRowsAddressedPerLayer) {
    ft::ExpertBanks banks(ft::bank_schema(ft::Format::bf16, 64, 32), 3, 5);
    ASSERT_EQ(banks.num_banks(), 2);
    EXPECT_EQ(banks.row_bytes(0), 2u * 32 * 64 * 2);
    EXPECT_EQ(banks.row_bytes(1), 64u * 32 * 2);
    EXPECT_EQ(banks.expert_bytes(), 3u * 64 * 32 * 2);
    EXPECT_EQ(banks.total_bytes(), banks.expert_bytes() * 15);
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    for (int b = 0; b < 2; ++b)
        for (int l = 0; l < 3; ++l) {
            EXPECT_EQ(reinterpret_cast<uintptr_t>(banks.layer_base(b, l)) % page, 0u);
            EXPECT_EQ(banks.row(b, l, 4), banks.layer_base(b, l) + 4 * banks.row_bytes(b));
            std::fill(banks.row(b, l, 0), banks.row(b, l, 0) + banks.row_bytes(b) * 5, static_cast<uint8_t>(b * 3 + l));
        }
    for (int b = 0; b < 2; ++b)
        for (int l = 0; l < 3; ++l) EXPECT_EQ(banks.row(b, l, 4)[banks.row_bytes(b) - 1], b * 3 + l);
    int allocations = 0;
    banks.for_each_allocation([&](uint8_t *, size_t bytes) {
        ++allocations;
        EXPECT_EQ(bytes % page, 0u);
    });
    EXPECT_EQ(allocations, 6);
}

ft::ModelSpec small_spec() {
    ft::ModelSpec s;
    s.num_layers = 2;
    s.num_experts = 8;
    s.top_k = 2;
    s.hidden = 64;
    s.intermediate = 32;
    s.routing.num_experts = 8;
    s.routing.top_k = 2;
    return s;
}

TEST(ModelSpec, ValidationNamesTheField) {
    ft::ModelSpec s = small_spec();
    EXPECT_NO_THROW(s.validate(false));
    s.top_k = 9;
    s.routing.top_k = 9;
    try {
        s.validate(true);
        FAIL();
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_FORMAT);
        EXPECT_NE(std::string(e.what()).find("top_k"), std::string::npos);
    }
    s = small_spec();
    s.routing.rule = FT_ROUTING_SIGMOID_GROUP_TOPK;
    s.routing.num_groups = 3;  // does not divide 8
    EXPECT_THROW(s.validate(false), ft::Error);
    s = small_spec();
    s.activation = 42;
    EXPECT_THROW(s.validate(false), ft::Error);
}

TEST(ModelSpec, ModelMapsCheckpointLayers) {
    ft::ModelSpec s = small_spec();
    s.moe_layers = {3, 4};
    s.total_layers = 5;
    ft::Model m(s);
    EXPECT_EQ(m.moe_layer_of(3), 0);
    EXPECT_EQ(m.moe_layer_of(4), 1);
    EXPECT_EQ(m.moe_layer_of(0), -1);
    EXPECT_EQ(m.moe_layer_of(99), -1);
    EXPECT_EQ(m.up(1, 7), m.gate(1, 7) + 32 * 64);
}

TEST(Selector, AutoPicksCpuAndRejectsUnknown) {
    ft::MachineCaps caps;
    const ft::ModelSpec s = small_spec();
    EXPECT_EQ(ft::select_backend(FT_BACKEND_AUTO, caps, s).backend, FT_BACKEND_CPU);
    EXPECT_EQ(ft::select_backend(FT_BACKEND_CPU, caps, s).backend, FT_BACKEND_CPU);
    try {
        ft::select_backend(77, caps, s);
        FAIL();
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_INVALID_ARGUMENT);
    }
    EXPECT_STREQ(ft::backend_name(FT_BACKEND_CPU), "cpu");
}

}  // namespace
