// GPU slot cache sizing (spec 4.2). A slot holds one expert of one layer across all its banks;
// the cache holds at least one whole layer (E slots) and never more than every expert (L * E).
#pragma once

#include <cstdint>

namespace ft {

struct SlotRequest {
    int64_t count = 0;            // explicit slot count (0: not given)
    double fraction = 0.0;        // fraction of all L * E experts (0: not given)
    uint64_t free_bytes = 0;      // free device memory, for the automatic size
    uint64_t reserve_bytes = 0;   // memory the caller keeps for itself
};

// Explicit count first, then fraction, else as many slots as free_bytes - reserve_bytes holds.
// Throws FT_ERR_INVALID_ARGUMENT for an explicit count or fraction below one layer, and
// FT_ERR_OUT_OF_MEMORY when the memory left cannot hold one layer.
int64_t plan_slot_count(const SlotRequest &request, int64_t layers, int64_t experts, uint64_t expert_bytes);

}  // namespace ft
