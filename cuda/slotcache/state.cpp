// Slot cache state: one buffer, its layout, and reset (docs/formulas.md, "Slot cache").
#include <algorithm>
#include <cstring>

#include "ft/common.hpp"
#include "ft/slotcache.hpp"

namespace ft {

namespace {

// Each array starts on its own 256-byte boundary, so device loads of any of them are aligned
// and no two arrays share a cache line.
constexpr size_t kArrayAlign = 256;

size_t align_up(size_t n) { return (n + kArrayAlign - 1) / kArrayAlign * kArrayAlign; }

struct Layout {
    size_t slot_for_id, id_of_slot, usage, priority, expert_priority, step, evict_slots, src_indices, num_indices, num_missing_full,
        expert_recency, stats, total;
};

Layout layout_of(const SlotCacheShape &s) {
    const size_t ids = static_cast<size_t>(s.layers) * static_cast<size_t>(s.experts);
    const size_t slots = static_cast<size_t>(s.slots), plan = static_cast<size_t>(s.plan_capacity);
    Layout l{};
    size_t at = 0;
    auto place = [&](size_t bytes) {
        const size_t here = at;
        at += align_up(bytes);
        return here;
    };
    l.step = place(sizeof(int64_t));
    l.num_indices = place(sizeof(int64_t));
    l.num_missing_full = place(sizeof(int64_t));
    l.usage = place(slots * sizeof(int64_t));
    l.priority = place(slots * sizeof(int64_t));
    l.expert_priority = place(ids * sizeof(int64_t));
    l.expert_recency = place(ids * sizeof(int64_t));
    l.stats = place(static_cast<size_t>(s.layers) * kStatColumns * sizeof(int64_t));
    l.slot_for_id = place(ids * sizeof(int32_t));
    l.id_of_slot = place(slots * sizeof(int32_t));
    l.evict_slots = place(plan * sizeof(int32_t));
    l.src_indices = place(plan * sizeof(int32_t));
    l.total = at;
    return l;
}

void check_shape(const SlotCacheShape &s) {
    if (s.layers <= 0 || s.experts <= 0 || s.slots <= 0 || s.plan_capacity <= 0)
        fail(FT_ERR_INVALID_ARGUMENT, "slot cache: layers, experts, slots and plan capacity must be positive (got ",
             s.layers, ", ", s.experts, ", ", s.slots, ", ", s.plan_capacity, ")");
    if (s.slots < s.experts)
        fail(FT_ERR_INVALID_ARGUMENT, "slot cache: ", s.slots, " slots cannot hold one layer of ", s.experts,
             " experts");
    if (s.experts > kMaxAdmissionExperts)
        fail(FT_ERR_INVALID_ARGUMENT, "slot cache: ", s.experts, " experts per layer; admission serves at most ",
             kMaxAdmissionExperts);
    if (s.policy.kind != SlotPolicyKind::Lru && s.policy.kind != SlotPolicyKind::Frequency)
        fail(FT_ERR_INVALID_ARGUMENT, "slot cache: unknown policy ", static_cast<int32_t>(s.policy.kind));
    if (s.policy.kind == SlotPolicyKind::Frequency && (s.policy.half_life < 1 || s.policy.half_life > (int64_t{1} << 40)))
        fail(FT_ERR_INVALID_ARGUMENT, "slot cache: frequency half-life must be in [1, 2^40] admission calls, got ",
             s.policy.half_life);
    if (static_cast<int64_t>(s.layers) * s.experts > INT32_MAX)
        fail(FT_ERR_INVALID_ARGUMENT, "slot cache: ", s.layers, " x ", s.experts, " experts overflow int32 ids");
}

}  // namespace

int32_t plan_capacity_for(int64_t max_ids_per_call, int32_t slots) {
    if (max_ids_per_call <= 0 || slots <= 0)
        fail(FT_ERR_INVALID_ARGUMENT, "slot cache: plan for ", max_ids_per_call, " ids and ", slots, " slots");
    return static_cast<int32_t>(std::min<int64_t>(max_ids_per_call, slots));
}

size_t slot_cache_bytes(const SlotCacheShape &shape) {
    check_shape(shape);
    return layout_of(shape).total;
}

SlotCacheState slot_cache_bind(const SlotCacheShape &shape, void *buffer) {
    check_shape(shape);
    if (!buffer) fail(FT_ERR_INVALID_ARGUMENT, "slot cache: null buffer");
    if (reinterpret_cast<uintptr_t>(buffer) % kArrayAlign != 0)
        fail(FT_ERR_INVALID_ARGUMENT, "slot cache: buffer is not ", kArrayAlign, "-byte aligned");
    const Layout l = layout_of(shape);
    auto *base = static_cast<unsigned char *>(buffer);
    SlotCacheState st;
    st.shape = shape;
    st.slot_for_id = reinterpret_cast<int32_t *>(base + l.slot_for_id);
    st.id_of_slot = reinterpret_cast<int32_t *>(base + l.id_of_slot);
    st.usage = reinterpret_cast<int64_t *>(base + l.usage);
    st.priority = reinterpret_cast<int64_t *>(base + l.priority);
    st.expert_priority = reinterpret_cast<int64_t *>(base + l.expert_priority);
    st.step = reinterpret_cast<int64_t *>(base + l.step);
    st.evict_slots = reinterpret_cast<int32_t *>(base + l.evict_slots);
    st.src_indices = reinterpret_cast<int32_t *>(base + l.src_indices);
    st.num_indices = reinterpret_cast<int64_t *>(base + l.num_indices);
    st.num_missing_full = reinterpret_cast<int64_t *>(base + l.num_missing_full);
    st.expert_recency = reinterpret_cast<int64_t *>(base + l.expert_recency);
    st.stats = reinterpret_cast<int64_t *>(base + l.stats);
    return st;
}

void slot_cache_reset(const SlotCacheState &st) {
    const SlotCacheShape &s = st.shape;
    const size_t ids = static_cast<size_t>(s.layers) * s.experts;
    std::fill_n(st.slot_for_id, ids, -1);
    std::fill_n(st.id_of_slot, s.slots, -1);
    std::fill_n(st.usage, s.slots, int64_t{0});
    std::fill_n(st.priority, s.slots, int64_t{0});
    std::fill_n(st.evict_slots, s.plan_capacity, -1);
    std::fill_n(st.src_indices, s.plan_capacity, -1);
    std::fill_n(st.expert_recency, ids, int64_t{-1});
    std::fill_n(st.expert_priority, ids, int64_t{0});
    *st.step = 0;
    *st.num_indices = 0;
    *st.num_missing_full = 0;
}

void slot_cache_clear_stats(const SlotCacheState &st) {
    std::fill_n(st.stats, static_cast<size_t>(st.shape.layers) * kStatColumns, int64_t{0});
}

HostSlotCache::HostSlotCache(const SlotCacheShape &shape) {
    bytes_ = slot_cache_bytes(shape);
    // One extra alignment unit lets the arrays start on a 256-byte boundary inside the vector;
    // the padding bytes stay zero, as in a cudaMemset device buffer.
    storage_.assign((bytes_ + kArrayAlign) / sizeof(uint64_t) + 1, 0);
    auto p = reinterpret_cast<uintptr_t>(storage_.data());
    offset_ = static_cast<size_t>((kArrayAlign - p % kArrayAlign) % kArrayAlign);
    state_ = slot_cache_bind(shape, reinterpret_cast<unsigned char *>(storage_.data()) + offset_);
    slot_cache_reset(state_);
    slot_cache_clear_stats(state_);
}

const char *admission_argument_error(const SlotCacheShape &s, int32_t layer, const int32_t *ids,
                                     const int32_t *slots_out, int64_t count) {
    if (layer < 0 || layer >= s.layers) return "layer out of range";
    if (count < 0) return "negative id count";
    if (count > 0 && (!ids || !slots_out)) return "null id array";
    if (s.plan_capacity < std::min<int64_t>(count, s.experts))
        return "copy plan capacity below min(id count, experts per layer)";
    return nullptr;
}

}  // namespace ft
