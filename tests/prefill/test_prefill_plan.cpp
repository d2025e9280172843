// The host plan of the GPU prefill (cuda/prefill/plan.hpp): every valid route becomes exactly
// one row, rows are grouped by slot in route order, pieces and chunks respect their limits and
// each piece points at its slot among its chunk's dequantised experts. Runs without a GPU.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "plan.hpp"

namespace {

using ft::cuda::prefill::Plan;

void check_plan(const Plan &p, const std::vector<int32_t> &slots, int32_t K, int32_t chunk_rows,
                int32_t chunk_experts) {
    // Rows: every valid route once, sorted by (slot, route).
    std::vector<int> seen(slots.size(), 0);
    for (int64_t j = 0; j < p.rows(); ++j) {
        const int32_t r = p.row_route[j];
        ASSERT_GE(r, 0);
        ASSERT_LT(size_t(r), slots.size());
        EXPECT_EQ(p.row_slot[j], slots[r]);
        EXPECT_EQ(p.row_token[j], r / K);
        seen[r]++;
        if (j > 0) {
            EXPECT_TRUE(p.row_slot[j - 1] < p.row_slot[j] ||
                        (p.row_slot[j - 1] == p.row_slot[j] && p.row_route[j - 1] < p.row_route[j]));
        }
    }
    for (size_t r = 0; r < slots.size(); ++r) EXPECT_EQ(seen[r], slots[r] >= 0 ? 1 : 0) << r;
    // Pieces tile the rows in order, one slot each, at most chunk_rows.
    int64_t next = 0;
    for (const auto &pc : p.pieces) {
        EXPECT_EQ(pc.row0, next);
        EXPECT_GE(pc.rows, 1);
        EXPECT_LE(pc.rows, chunk_rows);
        for (int32_t j = pc.row0; j < pc.row0 + pc.rows; ++j) EXPECT_EQ(p.row_slot[j], pc.slot);
        next += pc.rows;
    }
    EXPECT_EQ(next, p.rows());
    // Chunks tile the pieces; limits; dq indexes the chunk's slot list.
    int32_t piece = 0, row = 0, cslot = 0;
    for (const auto &c : p.chunks) {
        EXPECT_EQ(c.piece0, piece);
        EXPECT_EQ(c.row0, row);
        EXPECT_EQ(c.slot0, cslot);
        EXPECT_LE(c.rows, chunk_rows);
        EXPECT_GE(c.nslots, 1);
        EXPECT_LE(c.nslots, chunk_experts);
        int32_t rows = 0;
        std::set<int32_t> distinct;
        for (int32_t q = c.piece0; q < c.piece0 + c.pieces; ++q) {
            const auto &pc = p.pieces[q];
            EXPECT_EQ(pc.row0, c.row0 + rows);
            rows += pc.rows;
            ASSERT_GE(pc.dq, 0);
            ASSERT_LT(pc.dq, c.nslots);
            EXPECT_EQ(p.chunk_slots[c.slot0 + pc.dq], pc.slot);
            distinct.insert(pc.slot);
        }
        EXPECT_EQ(rows, c.rows);
        EXPECT_EQ(int32_t(distinct.size()), c.nslots);
        piece += c.pieces, row += c.rows, cslot += c.nslots;
    }
    EXPECT_EQ(size_t(piece), p.pieces.size());
    EXPECT_EQ(row, p.rows());
    EXPECT_EQ(size_t(cslot), p.chunk_slots.size());
}

TEST(PrefillPlan, RandomRoutingRespectsLimits) {
    std::mt19937 rng(3);
    Plan p;
    for (int iter = 0; iter < 200; ++iter) {
        const int32_t T = 1 + int32_t(rng() % 300), K = 1 + int32_t(rng() % 8), E = 1 + int32_t(rng() % 40);
        const int32_t chunk_rows = 1 + int32_t(rng() % 100), chunk_experts = 1 + int32_t(rng() % 6);
        std::vector<int32_t> slots(size_t(T) * K);
        for (auto &s : slots) s = rng() % 10 == 0 ? -1 : int32_t(rng() % E);  // duplicates allowed
        p.build(slots.data(), int64_t(slots.size()), K, chunk_rows, chunk_experts);
        check_plan(p, slots, K, chunk_rows, chunk_experts);
        if (HasFailure()) return;
    }
}

TEST(PrefillPlan, EmptyAndSingleSlot) {
    Plan p;
    std::vector<int32_t> none(64, -1);
    p.build(none.data(), 64, 8, 16, 2);
    EXPECT_EQ(p.rows(), 0);
    EXPECT_TRUE(p.pieces.empty());
    EXPECT_TRUE(p.chunks.empty());
    std::vector<int32_t> one(100, 7);  // one slot with more rows than a chunk: split, dequantised per chunk
    p.build(one.data(), 100, 4, 30, 1);
    check_plan(p, one, 4, 30, 1);
    EXPECT_EQ(p.pieces.size(), 4u);
    EXPECT_EQ(p.chunks.size(), 4u);
}

}  // namespace
