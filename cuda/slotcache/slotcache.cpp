#include "ft/slotcache.hpp"

#include <algorithm>
#include <cmath>

#include "ft/common.hpp"

namespace ft {

SlotPlan plan_slots(const SlotRequest &r, int64_t layers, int64_t experts, uint64_t expert_bytes) {
    SlotPlan p;
    const auto refuse = [&p](ft_status status, auto &&...parts) {
        p.status = status;
        p.why = cat("slot cache: ", parts...);
        return p;
    };
    if (layers <= 0 || experts <= 0 || expert_bytes == 0) return refuse(FT_ERR_INVALID_ARGUMENT, "empty model geometry");
    const int64_t all = layers * experts;
    if (r.count < 0 || r.fraction < 0.0 || std::isnan(r.fraction))
        return refuse(FT_ERR_INVALID_ARGUMENT, "negative slot count or fraction");
    if (r.count > 0) {
        if (r.count < experts)
            return refuse(FT_ERR_INVALID_ARGUMENT, r.count, " slots cannot hold one layer of ", experts, " experts");
        p.slots = std::min(r.count, all);
        return p;
    }
    if (r.fraction > 0.0) {
        const int64_t n = static_cast<int64_t>(std::ceil(static_cast<double>(all) * std::min(r.fraction, 1.0)));
        if (n < experts)
            return refuse(FT_ERR_INVALID_ARGUMENT, "fraction ", r.fraction, " gives ", n, " slots, fewer than one layer of ",
                          experts, " experts");
        p.slots = n;
        return p;
    }
    const uint64_t usable = r.free_bytes > r.reserve_bytes ? r.free_bytes - r.reserve_bytes : 0;
    const int64_t fits = static_cast<int64_t>(std::min<uint64_t>(usable / expert_bytes, static_cast<uint64_t>(all)));
    if (fits < experts)
        return refuse(FT_ERR_OUT_OF_MEMORY, usable, " bytes of device memory hold ", fits, " experts of ", expert_bytes,
                      " bytes; one layer needs ", experts);
    p.slots = fits;
    return p;
}

int64_t plan_slot_count(const SlotRequest &r, int64_t layers, int64_t experts, uint64_t expert_bytes) {
    const SlotPlan p = plan_slots(r, layers, experts, expert_bytes);
    if (p.status != FT_OK) fail(p.status, p.why);
    return p.slots;
}

SlotPolicy slot_policy_for(int32_t cache_policy, int32_t half_life_steps, int32_t layers) {
    if (cache_policy != 0 && cache_policy != 1)
        fail(FT_ERR_INVALID_ARGUMENT, "slot cache: unknown cache policy ", cache_policy);
    if (half_life_steps < 0 || layers <= 0)
        fail(FT_ERR_INVALID_ARGUMENT, "slot cache: half-life ", half_life_steps, " steps over ", layers, " layers");
    SlotPolicy p;
    p.kind = cache_policy == 1 ? SlotPolicyKind::Frequency : SlotPolicyKind::Lru;
    p.half_life = int64_t(half_life_steps > 0 ? half_life_steps : kDefaultHalfLifeSteps) * layers;
    return p;
}

}  // namespace ft
